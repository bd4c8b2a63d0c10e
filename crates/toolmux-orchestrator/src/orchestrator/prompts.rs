//! Prompts of every provider under qualified names, rendered by their provider.
//!
//! Prompts are listed whenever a client lists them (and once at warmup), not only when
//! tools are: no provider signals that its prompts changed, and clients list prompts
//! rarely. `get_prompt` routes with the last listing and lists again once before calling
//! a name unknown, so a prompt added since is found.

use super::Orchestrator;
use crate::catalog::PromptCatalog;
use futures::StreamExt as _;
use std::collections::HashSet;
use std::sync::Arc;
use toolmux_core::{CallContext, JsonObject, Prompt, PromptSpec, ToolError, ToolProvider};

impl Orchestrator {
    /// Every provider's prompts, named `{namespace}__{prompt}` like tools (sanitized,
    /// within the name budget). A provider whose listing fails is logged and keeps the
    /// prompts it listed last; the others' are listed all the same.
    ///
    /// A prompt the permission rules deny is not listed (see the `reach` module for how
    /// the rules read prompts).
    pub async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        Ok(self.list_prompts_where(&|_, _| true).await)
    }

    /// Renders the prompt of qualified name `name` with `arguments` at its provider.
    ///
    /// The permission rules judge it first: a denied prompt fails with
    /// [`ToolError::Denied`], one they ask about goes to the context's approval handler.
    /// An unknown name fails with [`ToolError::UnknownPrompt`] and the closest names; a
    /// missing required argument with [`ToolError::InvalidArguments`] naming every one
    /// missing, before the provider is asked. The call is bounded like a tool call: the
    /// provider's timeout, the caller's deadline and cancellation.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        let mut catalog = self.prompt_catalog();
        if catalog.get(name).is_none() {
            catalog = self.refresh_prompts().await;
        }
        let Some(entry) = catalog.get(name).cloned() else {
            return Err(ToolError::UnknownPrompt {
                name: crate::suggest::echoed(name),
                suggestions: crate::suggest::suggest(catalog.names(), name),
            });
        };
        self.permit_prompt(&entry.name, &arguments, ctx).await?;
        let missing: Vec<String> =
            entry.spec.missing_arguments(&arguments).map(|a| format!("`{a}`")).collect();
        if !missing.is_empty() {
            let s = if missing.len() == 1 { "" } else { "s" };
            return Err(ToolError::invalid_arguments(
                &*entry.name,
                format!("missing required argument{s} {}", missing.join(", ")),
            ));
        }
        tracing::debug!(target: "toolmux::prompt", "prompt request → {}", entry.name);
        let bound = self.bound(&*entry.provider, ctx);
        let provider_ctx = bound.context(ctx);
        let call = entry.provider.get_prompt(&entry.original, arguments, &provider_ctx);
        match self.bounded(bound, ctx, &entry.name, call).await {
            Ok(prompt) => Ok(self.redact_prompt(prompt)),
            // The provider knows the prompt by its own name; the caller by the qualified one.
            Err(ToolError::UnknownPrompt { .. }) => Err(ToolError::UnknownPrompt {
                name: crate::suggest::echoed(name),
                suggestions: Vec::new(),
            }),
            Err(e) => Err(e),
        }
    }

    /// The prompts `allow` (given a prompt's qualified name and its provider's namespace)
    /// and the permission rules let through.
    pub(crate) async fn list_prompts_where(
        &self,
        allow: &(dyn Fn(&str, &str) -> bool + Sync),
    ) -> Vec<PromptSpec> {
        let catalog = self.refresh_prompts().await;
        let allowed = |spec: &PromptSpec| {
            catalog.get(&spec.name).is_some_and(|e| allow(&spec.name, e.provider.namespace()))
                && self.prompt_listed(&spec.name)
        };
        catalog.specs().into_iter().filter(allowed).collect()
    }

    /// The namespace of the provider of the prompt of qualified name `name` (listing the
    /// prompts again when the name is not known yet).
    pub(crate) async fn prompt_namespace(&self, name: &str) -> Option<String> {
        let mut catalog = self.prompt_catalog();
        if catalog.get(name).is_none() {
            catalog = self.refresh_prompts().await;
        }
        catalog.get(name).map(|e| e.provider.namespace().to_owned())
    }

    /// The last prompt listing.
    pub(super) fn prompt_catalog(&self) -> Arc<PromptCatalog> {
        self.inner.prompts.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Lists every provider's prompts (at most `init_concurrency` at a time, each within
    /// the startup timeout) and swaps in the new catalog.
    pub(super) async fn refresh_prompts(&self) -> Arc<PromptCatalog> {
        self.refresh_prompts_skipping(&HashSet::new()).await
    }

    /// [`Orchestrator::refresh_prompts`], keeping the previous listing of the providers in
    /// `skip` (their warmup just failed: asking again would wait out their reconnection).
    pub(super) async fn refresh_prompts_skipping(
        &self,
        skip: &HashSet<String>,
    ) -> Arc<PromptCatalog> {
        let providers = self.providers();
        let list = |p: Arc<dyn ToolProvider>| async move { p.list_prompts().await };
        let fresh = self.list_all(&providers, skip, "prompts", list).await;
        let previous = self.prompt_catalog();
        let catalog = Arc::new(PromptCatalog::build(
            &providers,
            fresh,
            &previous,
            self.inner.config.name_budget,
            &self.inner.config.unprefixed,
        ));
        *self.inner.prompts.write().unwrap_or_else(|e| e.into_inner()) = catalog.clone();
        catalog
    }

    /// The prompt with secrets redacted from its description and from every message's
    /// text, JSON and embedded resources, as a tool's output is.
    fn redact_prompt(&self, mut prompt: Prompt) -> Prompt {
        let redactor = &self.inner.redactor;
        if redactor.is_empty() {
            return prompt;
        }
        if let Some(description) = &mut prompt.description {
            redactor.redact_in_place(description);
        }
        for message in &mut prompt.messages {
            super::redact_part(redactor, &mut message.content);
        }
        prompt
    }

    /// A provider's listing, or `None` after logging why there is none.
    /// One listing from every provider of `providers` (at most `init_concurrency` at a
    /// time, each within the startup timeout); `None` marks a provider whose listing failed
    /// or timed out, which is logged (redacted).
    pub(super) async fn list_all<T, F, Fut>(
        &self,
        providers: &[Arc<dyn ToolProvider>],
        skip: &HashSet<String>,
        what: &str,
        list: F,
    ) -> Vec<Option<Vec<T>>>
    where
        F: Fn(Arc<dyn ToolProvider>) -> Fut,
        Fut: Future<Output = Result<Vec<T>, ToolError>>,
    {
        let timeout = self.inner.config.startup_timeout;
        let mut listings = Vec::with_capacity(providers.len());
        for provider in providers {
            let skipped = skip.contains(provider.namespace());
            let listed = tokio::time::timeout(timeout, list(provider.clone()));
            listings.push(async move {
                if skipped {
                    return None;
                }
                match listed.await {
                    Ok(Ok(items)) => Some(items),
                    Ok(Err(e)) => {
                        tracing::warn!(
                            provider = provider.namespace(),
                            "listing {what} failed: {}",
                            self.inner.redactor.redact(&e.report())
                        );
                        None
                    }
                    Err(_) => {
                        tracing::warn!(provider = provider.namespace(), "listing {what} timed out");
                        None
                    }
                }
            });
        }
        futures::stream::iter(listings)
            .buffered(self.inner.config.init_concurrency.max(1))
            .collect()
            .await
    }
}
