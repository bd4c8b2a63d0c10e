//! A filtered view of an orchestrator: the tools a sub-agent may use, or a gateway serves,
//! as a provider.

use crate::glob::glob_match;
use crate::orchestrator::Orchestrator;
use crate::search;
use async_trait::async_trait;
use serde_json::Value;
use std::collections::HashSet;
use toolmux_core::{
    CallContext, Completion, CompletionRef, CompletionRequest, Health, JsonObject, Prompt,
    PromptSpec, ProviderHealth, Relayed, ResourceContents, ResourceSpec, ResourceTemplate,
    ResourceUpdates, ToolError, ToolKind, ToolListChanges, ToolOutput, ToolProvider, ToolSpec,
};

/// The tools of an orchestrator whose full names match at least one glob, each call going
/// through the orchestrator's whole pipeline.
///
/// A provider is in view when one of its tools is. Prompts are offered when their
/// qualified name matches a glob or their provider is in view; resources and resource
/// templates (whose URIs carry no namespace) when their provider is in view. What is out
/// of view is neither listed nor reachable: calls, renders, reads, subscriptions and
/// completions of it fail as unknown, without suggestions, and the resource updates of its
/// providers are not passed on (two providers may serve one URI). The instructions are
/// those of the providers in view.
#[derive(Debug, Clone)]
pub struct FilteredView {
    orchestrator: Orchestrator,
    globs: Vec<String>,
    /// When not empty, a tool must match one of these too.
    within: Vec<String>,
}

impl FilteredView {
    /// A view of `orchestrator` showing tools that match any of `globs`.
    pub fn new(orchestrator: Orchestrator, globs: Vec<String>) -> Self {
        FilteredView { orchestrator, globs, within: Vec::new() }
    }

    /// The view narrowed to tools that also match one of `globs` (a key holder's tools
    /// within what a gateway serves); none narrows nothing.
    #[must_use]
    pub fn within(mut self, globs: Vec<String>) -> Self {
        self.within = globs;
        self
    }

    /// Whether `name`, or the tool it is an alias of (`aliases`), is in view.
    fn allows(&self, name: &str) -> bool {
        allows(&self.orchestrator, &self.globs, &self.within, name)
    }

    /// Namespaces of the providers with a tool in view.
    fn providers_in_view(&self) -> HashSet<String> {
        let registry = self.orchestrator.registry();
        let in_view = registry.entries().filter(|e| self.allows(&e.name));
        in_view.map(|e| e.provider.namespace().to_owned()).collect()
    }

    fn allows_prompt(&self, name: &str, namespace: &str, in_view: &HashSet<String>) -> bool {
        self.allows(name) || in_view.contains(namespace)
    }

    async fn check_prompt(&self, name: &str) -> Result<(), ToolError> {
        let namespace = self.orchestrator.prompt_namespace(name).await;
        match namespace {
            Some(ns) if self.allows_prompt(name, &ns, &self.providers_in_view()) => Ok(()),
            _ => Err(ToolError::UnknownPrompt {
                name: crate::suggest::echoed(name),
                suggestions: Vec::new(),
            }),
        }
    }
}

/// Whether `name`, or the tool it is an alias of, matches one of `globs` and (unless it is
/// empty) one of `within`: [`FilteredView::allows`].
fn allows(orchestrator: &Orchestrator, globs: &[String], within: &[String], name: &str) -> bool {
    let matches = |name: &str| {
        globs.iter().any(|g| glob_match(g, name))
            && (within.is_empty() || within.iter().any(|g| glob_match(g, name)))
    };
    matches(name)
        || orchestrator
            .registry()
            .get(name)
            .is_some_and(|entry| &*entry.name != name && matches(&entry.name))
}

/// Whether the provider `namespace` of `orchestrator` has a tool in the view of `globs`
/// within `within`.
fn provider_in_view(
    orchestrator: &Orchestrator,
    globs: &[String],
    within: &[String],
    namespace: &str,
) -> bool {
    let registry = orchestrator.registry();
    let mut entries = registry.entries().filter(|e| e.provider.namespace() == namespace);
    entries.any(|e| allows(orchestrator, globs, within, &e.name))
}

#[async_trait]
impl ToolProvider for FilteredView {
    fn kind(&self) -> ToolKind {
        ToolKind::Composite
    }

    fn end_run(&self, run_id: &str) {
        self.orchestrator.end_run(run_id);
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

    fn relays(&self, name: &str) -> bool {
        // The search and `tools__call` are never relayed (see `Orchestrator::relays`).
        self.allows(name) && self.orchestrator.relays(name)
    }

    async fn relay(
        &self,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<Relayed, ToolError> {
        if !self.relays(name) {
            // The view's own checks (the search and `tools__call` stay in view).
            let arguments = toolmux_core::parse_arguments(name, arguments)?;
            return self.call(name, arguments, ctx).await.map(Relayed::Output);
        }
        self.orchestrator.relay_tool(name, arguments, ctx, raw_max).await
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        if !self.allows(name) {
            // Suggesting names from outside the view would leak them; say nothing more.
            return Err(ToolError::UnknownTool {
                name: crate::suggest::echoed(name),
                suggestions: Vec::new(),
            });
        }
        // The deferred tools' search and call stay in view too: `tools__call` would
        // otherwise reach any tool, and `tools__search` name tools outside.
        if name == search::CALL
            && let Some(inner) = arguments.get("name").and_then(Value::as_str)
            && !self.allows(inner)
        {
            return Err(ToolError::UnknownTool {
                name: crate::suggest::echoed(inner),
                suggestions: Vec::new(),
            });
        }
        if name == search::SEARCH {
            let asked = arguments.clone();
            let output = self.orchestrator.call_tool(name, arguments, ctx).await?;
            if output.is_error {
                return Ok(output);
            }
            let allow = |tool: &str| self.allows(tool);
            return Ok(search::search_output(&self.orchestrator, &asked, &allow));
        }
        self.orchestrator.call_tool(name, arguments, ctx).await
    }

    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        self.orchestrator.tool_list_changes()
    }

    fn instructions(&self) -> Option<String> {
        self.orchestrator.instructions_where(&|name| self.allows(name))
    }

    fn health(&self) -> Health {
        Health::of_parts(&self.health_by_provider())
    }

    /// Of the providers in view: a gateway's `/health` tells of what it serves.
    fn health_by_provider(&self) -> Vec<ProviderHealth> {
        let in_view = self.providers_in_view();
        let mut parts = self.orchestrator.health_by_provider();
        parts.retain(|p| in_view.contains(&p.namespace));
        parts
    }

    fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        self.orchestrator.prompt_list_changes()
    }

    fn resource_list_changes(&self) -> Option<ToolListChanges> {
        self.orchestrator.resource_list_changes()
    }

    async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        let in_view = self.providers_in_view();
        let allow = |name: &str, namespace: &str| self.allows_prompt(name, namespace, &in_view);
        Ok(self.orchestrator.list_prompts_where(&allow).await)
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        self.check_prompt(name).await?;
        self.orchestrator.get_prompt(name, arguments, ctx).await
    }

    async fn complete(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        if let CompletionRef::Prompt(name) = &request.reference {
            // A prompt matched by name is in view even when its provider is not.
            self.check_prompt(name).await?;
            return self.orchestrator.complete(request, ctx).await;
        }
        let in_view = self.providers_in_view();
        self.orchestrator.complete_in(request, ctx, &|ns| in_view.contains(ns)).await
    }

    async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        let in_view = self.providers_in_view();
        Ok(self.orchestrator.list_resources_in(&|ns| in_view.contains(ns)).await)
    }

    async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        let in_view = self.providers_in_view();
        Ok(self.orchestrator.list_resource_templates_in(&|ns| in_view.contains(ns)).await)
    }

    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        let in_view = self.providers_in_view();
        self.orchestrator.read_resource_in(uri, ctx, &|ns| in_view.contains(ns)).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        let in_view = self.providers_in_view();
        self.orchestrator.subscription_in(uri, true, &|ns| in_view.contains(ns)).await
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        let in_view = self.providers_in_view();
        self.orchestrator.subscription_in(uri, false, &|ns| in_view.contains(ns)).await
    }

    fn resource_updates(&self) -> Option<ResourceUpdates> {
        // The stream must not keep the orchestrator alive: it ends when the orchestrator
        // goes.
        let orchestrator = self.orchestrator.downgrade();
        let (globs, within) = (self.globs.clone(), self.within.clone());
        let in_view = move |source: &str| {
            let orchestrator = orchestrator.upgrade();
            orchestrator.is_some_and(|o| provider_in_view(&o, &globs, &within, source))
        };
        Some(self.orchestrator.resource_updates()?.only_from(in_view))
    }

    /// Updates of the providers in view only: another provider may serve a URI of the
    /// same name, and its updates are no business of this view's subscribers.
    fn passes_updates_from(&self, source: &str) -> bool {
        provider_in_view(&self.orchestrator, &self.globs, &self.within, source)
    }
}
