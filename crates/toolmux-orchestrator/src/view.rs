//! A filtered view of an orchestrator: the tools a sub-agent may use, or a gateway serves,
//! as a provider.

use crate::glob::glob_match;
use crate::orchestrator::Orchestrator;
use async_trait::async_trait;
use serde_json::Value;
use toolmux_core::{
    CallContext, Completion, CompletionRequest, JsonObject, Prompt, PromptSpec, ResourceContents,
    ResourceSpec, ResourceTemplate, ResourceUpdates, ToolError, ToolKind, ToolListChanges,
    ToolOutput, ToolProvider, ToolSpec,
};

/// The tools of an orchestrator whose full names match at least one glob, each call going
/// through the orchestrator's whole pipeline. The globs name tools: the orchestrator's
/// prompts, resources and instructions are offered as they are.
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

    fn instructions(&self) -> Option<String> {
        self.orchestrator.instructions()
    }

    fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        self.orchestrator.prompt_list_changes()
    }

    fn resource_list_changes(&self) -> Option<ToolListChanges> {
        self.orchestrator.resource_list_changes()
    }

    async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        self.orchestrator.list_prompts().await
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        self.orchestrator.get_prompt(name, arguments, ctx).await
    }

    async fn complete(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        self.orchestrator.complete(request, ctx).await
    }

    async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        self.orchestrator.list_resources().await
    }

    async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        self.orchestrator.list_resource_templates().await
    }

    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        self.orchestrator.read_resource(uri, ctx).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.orchestrator.subscribe_resource(uri).await
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.orchestrator.unsubscribe_resource(uri).await
    }

    fn resource_updates(&self) -> Option<ResourceUpdates> {
        self.orchestrator.resource_updates()
    }
}
