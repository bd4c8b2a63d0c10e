//! A filtered view of an orchestrator: the tools a sub-agent may use, as a provider.

use crate::glob::glob_match;
use crate::orchestrator::Orchestrator;
use async_trait::async_trait;
use serde_json::Value;
use toolmux_core::{
    CallContext, ToolError, ToolKind, ToolListChanges, ToolOutput, ToolProvider, ToolSpec,
};

/// The tools of an orchestrator whose full names match at least one glob, each call going
/// through the orchestrator's whole pipeline.
#[derive(Debug, Clone)]
pub struct FilteredView {
    orchestrator: Orchestrator,
    globs: Vec<String>,
}

impl FilteredView {
    /// A view of `orchestrator` showing tools that match any of `globs`.
    pub fn new(orchestrator: Orchestrator, globs: Vec<String>) -> Self {
        FilteredView { orchestrator, globs }
    }

    fn allows(&self, name: &str) -> bool {
        self.globs.iter().any(|g| glob_match(g, name))
    }
}

#[async_trait]
impl ToolProvider for FilteredView {
    fn kind(&self) -> ToolKind {
        ToolKind::Composite
    }

    fn namespace(&self) -> &str {
        self.orchestrator.namespace()
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(self.orchestrator.tools().into_iter().filter(|t| self.allows(&t.name)).collect())
    }

    async fn has_tool(&self, name: &str) -> bool {
        self.allows(name) && self.orchestrator.has_tool(name).await
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        if !self.allows(name) {
            // Suggesting names from outside the view would leak them; say nothing more.
            return Err(ToolError::UnknownTool { name: name.to_owned(), suggestions: Vec::new() });
        }
        self.orchestrator.call_tool(name, arguments, ctx).await
    }

    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        self.orchestrator.tool_list_changes()
    }
}
