//! Resources of every provider under their own URIs, reads and subscriptions routed to the
//! provider that serves each, and every provider's resource updates merged into one stream.
//!
//! A read goes to the provider that listed the URI (the first one, when two did), else to
//! the first whose template matches it, else to each provider in turn until one serves it;
//! a provider found that way is remembered for the URI. A URI a later provider lists too
//! is listed, read, subscribed to and updated under an alias,
//! `toolmux://{namespace}/{uri}`, so that neither is out of reach. Resources are listed whenever a
//! client lists them and once at warmup.

use super::{Orchestrator, cut_middle};
use crate::catalog::ResourceCatalog;
use crate::config::OversizeMode;
use crate::permission::Permission;
use std::collections::HashSet;
use std::sync::Arc;
use toolmux_core::{
    CallContext, ContentPart, ResourceBody, ResourceContents, ResourceSpec, ResourceTemplate,
    ResourceUpdates, ToolError, ToolListChanges, ToolOutput, ToolProvider,
};

/// Which providers, by namespace, a request may reach.
pub(crate) type Scope<'a> = &'a (dyn Fn(&str) -> bool + Sync);

/// URIs remembered from probing at most; the memory is cleared when full.
const LEARNED_ROUTES_MAX: usize = 1024;

/// What an alias URI starts with: `toolmux://{namespace}/{the provider's own URI}`.
const ALIAS_PREFIX: &str = "toolmux://";

/// The URI under which the resource `uri` of the provider `namespace` is listed, read and
/// updated when an earlier provider lists the same URI (two instances of one server):
/// `toolmux://{namespace}/{uri}`, a valid URI that names both.
fn alias(namespace: &str, uri: &str) -> String {
    format!("{ALIAS_PREFIX}{namespace}/{uri}")
}

impl Orchestrator {
    /// Every provider's resources, URIs unchanged but where two providers list one URI:
    /// the first's under it, the later one's under `toolmux://{namespace}/{uri}`. A provider whose listing fails
    /// is logged and keeps what it listed last. A resource the permission rules deny is
    /// not listed (see the `reach` module for how the rules read resources).
    pub async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        Ok(self.list_resources_in(&|_| true).await)
    }

    /// Every provider's resource templates, in provider order, but those the permission
    /// rules deny.
    pub async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        Ok(self.list_resource_templates_in(&|_| true).await)
    }

    /// The resources of the providers whose namespace `scope` allows.
    pub(crate) async fn list_resources_in(&self, scope: Scope<'_>) -> Vec<ResourceSpec> {
        let catalog = self.refresh_resources().await;
        let providers = self.providers();
        let alias = |i: usize, uri: &str| {
            providers.get(i).map_or_else(|| uri.to_owned(), |p| alias(p.namespace(), uri))
        };
        catalog.resources_where(&self.listed_in(scope), &alias)
    }

    /// The resource templates of the providers whose namespace `scope` allows.
    pub(crate) async fn list_resource_templates_in(
        &self,
        scope: Scope<'_>,
    ) -> Vec<ResourceTemplate> {
        let catalog = self.refresh_resource_templates().await;
        let providers = self.providers();
        let alias = |i: usize, template: &str| {
            providers.get(i).map_or_else(|| template.to_owned(), |p| alias(p.namespace(), template))
        };
        catalog.templates_where(&self.listed_in(scope), &alias)
    }

    /// Whether a URI (or URI template) listed by the provider of an index is listed to a
    /// caller whose scope is `scope`: the scope allows the provider's namespace and the
    /// permission rules do not deny it.
    fn listed_in(&self, scope: Scope<'_>) -> impl Fn(usize, &str) -> bool + use<'_> {
        let namespaces: Vec<Option<String>> = self
            .providers()
            .iter()
            .map(|p| scope(p.namespace()).then(|| p.namespace().to_owned()))
            .collect();
        move |i, uri| {
            let namespace = namespaces.get(i).and_then(Option::as_deref);
            namespace.is_some_and(|ns| self.resource_listed(ns, uri))
        }
    }

    /// Reads the resource at `uri` from the provider that serves it (see the module
    /// documentation for the routing). Fails with [`ToolError::UnknownResource`] when no
    /// provider serves it; when some provider failed otherwise while asked in turn, with
    /// that failure. Each provider asked is bounded like a tool call (its timeout, the
    /// caller's deadline and cancellation); text over `toolResponseMaxBytes` is cut like a
    /// tool's output, binary contents pass as they are.
    pub async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        self.read_resource_in(uri, ctx, &|_| true).await
    }

    /// [`Orchestrator::read_resource`] asking only the providers whose namespace `scope`
    /// allows.
    pub(crate) async fn read_resource_in(
        &self,
        uri: &str,
        ctx: &CallContext,
        scope: Scope<'_>,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        tracing::debug!(target: "toolmux::resource", "resource read → {uri}");
        let providers = self.providers();
        // A URI of one provider's that another's shadows, by its alias: read from that
        // provider alone, the contents named as the client asked.
        if let Some((index, original)) = self.unalias(uri)
            && let Some(provider) = providers.get(index).filter(|p| scope(p.namespace()))
        {
            let namespace = provider.namespace();
            let permission = match self.resource_permission(namespace, original, false) {
                Permission::Deny(reason) => {
                    let tool = super::reach::resource_name(namespace, original);
                    return Err(ToolError::Denied { tool, reason });
                }
                permission => permission,
            };
            self.permit_resource(namespace, original, &permission, ctx).await?;
            let mut contents = self.read_from(&**provider, original, ctx).await?;
            for item in contents.iter_mut().filter(|c| c.uri == original) {
                item.uri = uri.to_owned();
            }
            return Ok(self.cap_contents(uri, contents, ctx).await);
        }
        // A provider the rules deny this URI is out of scope; the denial is the answer
        // when no provider in scope serves it.
        let mut denied = None;
        let mut in_scope = |provider: &Arc<dyn ToolProvider>| {
            if !scope(provider.namespace()) {
                return None;
            }
            match self.resource_permission(provider.namespace(), uri, false) {
                Permission::Deny(reason) => {
                    let tool = super::reach::resource_name(provider.namespace(), uri);
                    denied.get_or_insert(ToolError::Denied { tool, reason });
                    None
                }
                permission => Some(permission),
            }
        };
        let routed = self.route(uri);
        let routed = routed
            .and_then(|i| Some((i, providers.get(i)?)))
            .and_then(|(i, p)| Some((i, p, in_scope(p)?)));
        if let Some((_, provider, permission)) = &routed {
            self.permit_resource(provider.namespace(), uri, permission, ctx).await?;
            match self.read_from(&***provider, uri, ctx).await {
                Ok(contents) => return Ok(self.cap_contents(uri, contents, ctx).await),
                // A stale listing or a template too wide: someone else may serve it.
                Err(ToolError::UnknownResource { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let routed = routed.map(|(i, ..)| i);
        let mut failure = None;
        for (i, provider) in providers.iter().enumerate().filter(|(i, _)| Some(*i) != routed) {
            let Some(permission) = in_scope(provider) else { continue };
            self.permit_resource(provider.namespace(), uri, &permission, ctx).await?;
            match self.read_from(&**provider, uri, ctx).await {
                Ok(contents) => {
                    self.learn_route(uri, i);
                    return Ok(self.cap_contents(uri, contents, ctx).await);
                }
                Err(ToolError::UnknownResource { .. }) => {}
                Err(e @ ToolError::Cancelled { .. }) => return Err(e),
                Err(e) => {
                    tracing::debug!(
                        provider = provider.namespace(),
                        "reading `{uri}` failed: {}",
                        e.report()
                    );
                    failure.get_or_insert(e);
                }
            }
        }
        Err(failure
            .or(denied)
            .unwrap_or_else(|| ToolError::UnknownResource { uri: crate::suggest::echoed(uri) }))
    }

    /// Subscribes to updates of `uri` at the provider that serves it; when none is known,
    /// at every provider that sends updates (succeeding when one accepts).
    pub async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.start_update_forwarders();
        self.route_subscription(uri, true, &|_| true).await
    }

    /// Ends a subscription made with [`Orchestrator::subscribe_resource`], routed the same way.
    pub async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.route_subscription(uri, false, &|_| true).await
    }

    /// [`Orchestrator::subscribe_resource`] (or unsubscribe) at the providers whose
    /// namespace `scope` allows.
    pub(crate) async fn subscription_in(
        &self,
        uri: &str,
        subscribe: bool,
        scope: Scope<'_>,
    ) -> Result<(), ToolError> {
        if subscribe {
            self.start_update_forwarders();
        }
        self.route_subscription(uri, subscribe, scope).await
    }

    /// Updated URIs of every provider, merged, each with the namespace of the provider that
    /// sent it ([`toolmux_core::ResourceUpdate::source`]); `None` when no provider sends
    /// any.
    pub fn resource_updates(&self) -> Option<ResourceUpdates> {
        self.start_update_forwarders();
        let started = {
            let forwarders = self.inner.forwarders.lock().unwrap_or_else(|e| e.into_inner());
            forwarders.started.then(|| !forwarders.sources.is_empty())
        };
        // Outside a runtime no forwarder could start: say what the providers offer, and the
        // forwarders start with the warmup.
        let offered = started
            .unwrap_or_else(|| self.providers().iter().any(|p| p.resource_updates().is_some()));
        offered.then(|| self.inner.updates.subscribe())
    }

    /// Fires when any provider's prompt list changes; `None` when none ever does.
    pub fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        self.start_update_forwarders();
        let offered = self.providers().iter().any(|p| p.prompt_list_changes().is_some());
        offered.then(|| self.inner.prompts_changed.subscribe())
    }

    /// Fires when any provider's resource list changes; `None` when none ever does.
    pub fn resource_list_changes(&self) -> Option<ToolListChanges> {
        self.start_update_forwarders();
        let offered = self.providers().iter().any(|p| p.resource_list_changes().is_some());
        offered.then(|| self.inner.resources_changed.subscribe())
    }

    /// Starts one task per provider that sends resource updates, copying them into the
    /// merged stream, and one per list-changed signal of prompts and resources; once, and
    /// never after cleanup. Needs a tokio runtime.
    pub(super) fn start_update_forwarders(&self) {
        let mut forwarders = self.inner.forwarders.lock().unwrap_or_else(|e| e.into_inner());
        if forwarders.started || forwarders.closed || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        forwarders.started = true;
        for (i, provider) in self.providers().iter().enumerate() {
            forward(&self.inner, &mut forwarders, i, provider);
        }
    }

    /// Stops the forwarders for good.
    pub(super) fn stop_update_forwarders(&self) {
        let mut forwarders = self.inner.forwarders.lock().unwrap_or_else(|e| e.into_inner());
        forwarders.closed = true;
        for task in forwarders.tasks.drain(..) {
            task.abort();
        }
    }

    /// Lists every provider's resources and swaps in the new catalog.
    pub(super) async fn refresh_resources(&self) -> Arc<ResourceCatalog> {
        self.refresh_resources_skipping(&HashSet::new()).await
    }

    /// [`Orchestrator::refresh_resources`], keeping the previous listing of the providers
    /// in `skip`.
    pub(super) async fn refresh_resources_skipping(
        &self,
        skip: &HashSet<String>,
    ) -> Arc<ResourceCatalog> {
        let providers = self.providers();
        let list = |p: Arc<dyn ToolProvider>| async move { p.list_resources().await };
        let fresh = self.list_all(&providers, skip, "resources", list);
        let fresh = fresh.await;
        let mut catalog = self.inner.resources.write().unwrap_or_else(|e| e.into_inner());
        *catalog = Arc::new(catalog.with_resources(&providers, fresh));
        catalog.clone()
    }

    /// Lists every provider's resource templates and swaps in the new catalog.
    pub(super) async fn refresh_resource_templates(&self) -> Arc<ResourceCatalog> {
        self.refresh_resource_templates_skipping(&HashSet::new()).await
    }

    /// [`Orchestrator::refresh_resource_templates`], keeping the previous listing of the
    /// providers in `skip`.
    pub(super) async fn refresh_resource_templates_skipping(
        &self,
        skip: &HashSet<String>,
    ) -> Arc<ResourceCatalog> {
        let providers = self.providers();
        let list = |p: Arc<dyn ToolProvider>| async move { p.list_resource_templates().await };
        let fresh = self.list_all(&providers, skip, "resource templates", list).await;
        let mut catalog = self.inner.resources.write().unwrap_or_else(|e| e.into_inner());
        *catalog = Arc::new(catalog.with_templates(fresh));
        catalog.clone()
    }

    /// The resource links and embedded resources in `output`, an output of provider
    /// `namespace`, named as this orchestrator lists that provider's resources: a URI
    /// another provider lists first becomes this provider's alias (`toolmux://NS/URI`),
    /// so that reading the link reaches the provider that gave it, not the other (two
    /// instances of one server both hand out `file:///r1`). A link to a URI nobody lists is
    /// remembered as this provider's, so a read does not probe the others for it.
    pub(super) fn name_links_as_listed(&self, namespace: &str, output: &mut ToolOutput) {
        let linked = |part: &ContentPart| {
            matches!(part, ContentPart::ResourceLink { .. } | ContentPart::Resource { .. })
        };
        if !output.content.iter().any(linked) {
            return;
        }
        let Some(index) = self.providers().iter().position(|p| p.namespace() == namespace) else {
            return;
        };
        let catalog = self.inner.resources.read().unwrap_or_else(|e| e.into_inner()).clone();
        for part in &mut output.content {
            let (ContentPart::ResourceLink { uri, .. } | ContentPart::Resource { uri, .. }) = part
            else {
                continue;
            };
            if uri.starts_with(ALIAS_PREFIX) {
                continue;
            }
            match catalog.owner(uri) {
                Some(owner) if owner != index => *uri = alias(namespace, uri),
                Some(_) => {}
                None if catalog.route(uri).is_none() => self.learn_route(uri, index),
                None => {}
            }
        }
    }

    /// The provider (its index) and its own URI that `uri` names, when `uri` is an alias
    /// ([`alias`]) of a provider of this orchestrator.
    pub(super) fn unalias<'u>(&self, uri: &'u str) -> Option<(usize, &'u str)> {
        let (namespace, original) = uri.strip_prefix(ALIAS_PREFIX)?.split_once('/')?;
        let index = self.providers().iter().position(|p| p.namespace() == namespace)?;
        Some((index, original))
    }

    /// The provider (its index) known to serve `uri`: by listing, template or experience.
    fn route(&self, uri: &str) -> Option<usize> {
        let catalog = self.inner.resources.read().unwrap_or_else(|e| e.into_inner()).clone();
        catalog.route(uri).or_else(|| {
            self.inner.learned_routes.lock().unwrap_or_else(|e| e.into_inner()).get(uri).copied()
        })
    }

    fn learn_route(&self, uri: &str, provider: usize) {
        let mut learned = self.inner.learned_routes.lock().unwrap_or_else(|e| e.into_inner());
        if learned.len() >= LEARNED_ROUTES_MAX {
            learned.clear();
        }
        learned.insert(uri.to_owned(), provider);
    }

    async fn read_from(
        &self,
        provider: &dyn ToolProvider,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        let bound = self.bound(provider, ctx);
        let provider_ctx = bound.context(ctx);
        let read = provider.read_resource(uri, &provider_ctx);
        self.bounded(bound, ctx, uri, read).await
    }

    async fn route_subscription(
        &self,
        uri: &str,
        subscribe: bool,
        scope: Scope<'_>,
    ) -> Result<(), ToolError> {
        let providers = self.providers();
        let (uri, targets): (&str, Vec<usize>) = match (self.unalias(uri), self.route(uri)) {
            (Some((index, original)), _) => (original, vec![index]),
            (None, Some(i)) => (uri, vec![i]),
            (None, None) => (uri, self.update_sources()),
        };
        let mut failure = None;
        let mut accepted = false;
        let targets = targets.iter().filter_map(|&i| providers.get(i));
        for provider in targets.filter(|p| scope(p.namespace())) {
            // Updates of a resource the rules deny would tell of it; asking is for reading.
            if subscribe
                && let Permission::Deny(reason) =
                    self.resource_permission(provider.namespace(), uri, false)
            {
                let tool = super::reach::resource_name(provider.namespace(), uri);
                failure.get_or_insert(ToolError::Denied { tool, reason });
                continue;
            }
            // Only to bound the call: the trait's methods take no context.
            let ctx = CallContext::new();
            let bound = self.bound(&**provider, &ctx);
            let call = async {
                if subscribe {
                    provider.subscribe_resource(uri).await
                } else {
                    provider.unsubscribe_resource(uri).await
                }
            };
            match self.bounded(bound, &ctx, uri, call).await {
                Ok(()) => accepted = true,
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        match (accepted, failure) {
            (true, _) => Ok(()),
            (false, Some(e)) => Err(e),
            (false, None) => Err(ToolError::UnknownResource { uri: crate::suggest::echoed(uri) }),
        }
    }

    /// Indices of the providers that send resource updates.
    fn update_sources(&self) -> Vec<usize> {
        let forwarders = self.inner.forwarders.lock().unwrap_or_else(|e| e.into_inner());
        if forwarders.started {
            return forwarders.sources.clone();
        }
        drop(forwarders);
        self.providers()
            .iter()
            .enumerate()
            .filter(|(_, p)| p.resource_updates().is_some())
            .map(|(i, _)| i)
            .collect()
    }

    /// Contents with secrets redacted from their text and, when their text is over
    /// `toolResponseMaxBytes`, each text cut to its share of the cap, the whole text kept
    /// in the output store (unless the oversize mode is truncate) and named in the marker.
    async fn cap_contents(
        &self,
        uri: &str,
        mut contents: Vec<ResourceContents>,
        ctx: &CallContext,
    ) -> Vec<ResourceContents> {
        let redactor = &self.inner.redactor;
        for item in &mut contents {
            if let ResourceBody::Text(text) = &mut item.body
                && let std::borrow::Cow::Owned(clean) = redactor.redact(text)
            {
                *text = clean;
            }
        }
        let max = self.inner.config.response_max_bytes;
        let text_len = |c: &ResourceContents| match &c.body {
            ResourceBody::Text(text) => text.len(),
            ResourceBody::Blob(_) => 0,
        };
        let total: usize = contents.iter().map(text_len).sum();
        if total <= max {
            return contents;
        }
        for item in &mut contents {
            let ResourceBody::Text(text) = &mut item.body else { continue };
            // Each text keeps its share of the cap (at least a line's worth).
            let share = ((max as u128 * text.len() as u128 / total as u128) as usize).max(80);
            if text.len() <= share {
                continue;
            }
            let mut why = format!("resource over {max} bytes");
            if self.inner.config.oversize == OversizeMode::Spill {
                match self.inner.store.store(ctx.run_id(), uri, text).await {
                    Ok(stored) => {
                        why.push_str(&format!("; whole text in output `{}`", stored.handle));
                    }
                    Err(e) => tracing::warn!("output store failed for `{uri}`, truncating: {e}"),
                }
            }
            *text = cut_middle(text, share, &why).0;
        }
        contents
    }
}

/// Forwards `provider`'s (the `i`th) prompt and resource list changes, and its resource
/// updates under the URIs the catalog lists them by, into the orchestrator's own streams.
pub(super) fn forward(
    inner: &Arc<super::Inner>,
    forwarders: &mut super::Forwarders,
    i: usize,
    provider: &Arc<dyn ToolProvider>,
) {
    let signals = [
        (provider.prompt_list_changes(), &inner.prompts_changed),
        (provider.resource_list_changes(), &inner.resources_changed),
    ];
    for (changes, merged) in signals {
        let (Some(mut changes), merged) = (changes, merged.clone()) else { continue };
        forwarders.tasks.push(tokio::spawn(async move {
            while changes.changed().await {
                merged.notify();
            }
        }));
    }
    let Some(mut updates) = provider.resource_updates() else { return };
    forwarders.sources.push(i);
    let inner = inner.clone();
    let namespace = provider.namespace().to_owned();
    forwarders.tasks.push(tokio::spawn(async move {
        while let Some(uri) = updates.next().await {
            // A resource listed under an alias is updated under it.
            let catalog = inner.resources.read().unwrap_or_else(|e| e.into_inner()).clone();
            // Each tagged with its provider, so that a view passes on only its own.
            if catalog.shadowed(i, &uri) {
                inner.updates.notify_from(&namespace, &alias(&namespace, &uri));
            } else {
                inner.updates.notify_from(&namespace, &uri);
            }
        }
    }));
}
