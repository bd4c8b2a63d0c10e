//! Completions of prompt arguments and resource-template variables, asked of the provider
//! that offers the prompt or the template.

use super::Orchestrator;
use super::resources::Scope;
use crate::permission::Permission;
use std::sync::Arc;
use toolmux_core::{
    CallContext, Completion, CompletionRef, CompletionRequest, ToolError, ToolProvider,
};

impl Orchestrator {
    /// Values for an argument of the prompt of qualified name, or a variable of the resource
    /// template, named in `request`, from the provider that offers it (bounded like a tool
    /// call). An unknown prompt fails with [`ToolError::UnknownPrompt`] and the closest
    /// names; a template no provider lists, or a provider that offers no completions, gives
    /// no values. A prompt the permission rules deny fails with [`ToolError::Denied`]; a
    /// template they deny has no values. At most [`Completion::MAX_VALUES`] values are returned (`has_more` then
    /// says there were more).
    pub async fn complete(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        self.complete_in(request, ctx, &|_| true).await
    }

    /// [`Orchestrator::complete`] for the prompts and templates of the providers whose
    /// namespace `scope` allows; others are unknown (prompts, without suggestions) or have
    /// no values (templates).
    pub(crate) async fn complete_in(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
        scope: Scope<'_>,
    ) -> Result<Completion, ToolError> {
        let (provider, forwarded, what): (_, _, String) = match &request.reference {
            CompletionRef::Prompt(name) => {
                let mut catalog = self.prompt_catalog();
                if catalog.get(name).is_none() {
                    catalog = self.refresh_prompts().await;
                }
                let entry = catalog.get(name).filter(|e| scope(e.provider.namespace())).cloned();
                if entry.is_none() && catalog.get(name).is_some() {
                    let name = crate::suggest::echoed(name);
                    return Err(ToolError::UnknownPrompt { name, suggestions: Vec::new() });
                }
                let Some(entry) = entry else {
                    return Err(ToolError::UnknownPrompt {
                        name: crate::suggest::echoed(name),
                        suggestions: crate::suggest::suggest(catalog.names(), name),
                    });
                };
                if let Permission::Deny(reason) = self.prompt_permission(&entry.name, None) {
                    return Err(ToolError::Denied { tool: entry.name.to_string(), reason });
                }
                let forwarded = CompletionRequest {
                    reference: CompletionRef::Prompt(entry.original.clone()),
                    ..request.clone()
                };
                (entry.provider.clone(), forwarded, entry.name.to_string())
            }
            // A template another provider lists too is listed under its alias: completed
            // by the provider the alias names, asked with its own template.
            CompletionRef::ResourceTemplate(aliased)
                if let Some((index, template)) = self.unalias(aliased) =>
            {
                let provider = self.providers().get(index).cloned();
                let listed = |p: &Arc<dyn ToolProvider>| {
                    scope(p.namespace()) && self.resource_listed(p.namespace(), template)
                };
                let Some(provider) = provider.filter(listed) else {
                    return Ok(Completion::default());
                };
                let forwarded = CompletionRequest {
                    reference: CompletionRef::ResourceTemplate(template.to_owned()),
                    ..request.clone()
                };
                (provider, forwarded, aliased.clone())
            }
            CompletionRef::ResourceTemplate(template) => {
                let mut owner = self.template_owner(template);
                if owner.is_none() {
                    self.refresh_resource_templates().await;
                    owner = self.template_owner(template);
                }
                let provider = owner.and_then(|i| self.providers().get(i).cloned());
                let listed = |p: &Arc<dyn ToolProvider>| {
                    scope(p.namespace()) && self.resource_listed(p.namespace(), template)
                };
                let Some(provider) = provider.filter(listed) else {
                    return Ok(Completion::default());
                };
                (provider, request.clone(), template.clone())
            }
        };
        let argument = &request.argument;
        tracing::debug!(target: "toolmux::completion", "completion of `{argument}` → {what}");
        let bound = self.bound(&*provider, ctx);
        let provider_ctx = bound.context(ctx);
        let call = provider.complete(forwarded, &provider_ctx);
        let mut completion = self.bounded(bound, ctx, &what, call).await?;
        if completion.values.len() > Completion::MAX_VALUES {
            completion.values.truncate(Completion::MAX_VALUES);
            completion.has_more = true;
        }
        Ok(completion)
    }

    /// The provider (its index) that lists the resource template `template`.
    fn template_owner(&self, template: &str) -> Option<usize> {
        let catalog = self.inner.resources.read().unwrap_or_else(|e| e.into_inner()).clone();
        catalog.template_owner(template)
    }
}
