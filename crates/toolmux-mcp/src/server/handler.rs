//! The MCP server handler: one instance per session (per request for stateless
//! 2026-07-28 HTTP requests), all sharing one provider, listing cache and options.

use super::ServeOptions;
use super::convert;
use super::interact::{ClientInteraction, Round, StateSeal};
use super::names::NameMap;
use super::progress::ProgressGate;
use super::settle::SettledChanges;
use super::tasks::TaskStore;
use crate::server::ClientProfile;
use futures::FutureExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CompleteRequestParams, CompleteResult, CompletionInfo, CreateTaskResult,
    GetPromptRequestParams, GetPromptResponse, GetTaskParams, GetTaskResult, Implementation,
    InputRequiredResult, InputResponses, JsonObject, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, Notification,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ReadResourceRequestParams,
    ReadResourceResponse, Reference, RequestId, ResourceUpdatedNotificationParam,
    ServerCapabilities, ServerConfig, ServerNotification, SubscribeRequestParams,
    SubscriptionFilter, TASKS_EXTENSION_ID, Tool, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use toolmux_core::{
    CallContext, CompletionRef, CompletionRequest, EarlyAnswer, LogLevel, LogMessage, LogSink,
    Progress, ProgressSink, Relayed, ResourceUpdates, TaskSupport, ToolError, ToolListChanges,
    ToolOutput, ToolProvider, TraceParent, holder_run_id, panic_message,
};

/// How long a stateless run that asked a question without an answer may go on asking
/// others (questions asked together, as by `join!`, end up in one `InputRequiredResult`).
const INPUT_GRACE: Duration = Duration::from_millis(20);

/// The `_meta` key (and HTTP header) of a caller's W3C trace context, which the spans of
/// its calls join (OpenTelemetry's MCP conventions carry it in `params._meta`).
pub(crate) const TRACEPARENT_META_KEY: &str = "traceparent";

/// The `_meta` key (and HTTP header) of the vendors' part of a caller's trace context.
pub(crate) const TRACESTATE_META_KEY: &str = "tracestate";

/// The `_meta` key with which a request names its run: the calls of one agent (its budget,
/// its external tools' inbox) across sessions, and across the requests of a stateless
/// client. Runs named so are kept apart from the sessions' own (`client:` before the name).
pub const RUN_ID_META_KEY: &str = "toolmux/runId";

/// How long a call of a session that ended may take to return once cancelled, before it
/// is dropped: the session ends without waiting for rmcp's drain (up to 5 s).
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// The end of a streamable HTTP session, handed to its requests in their extensions by the
/// session manager: cancelled when the session is deleted, ended unused, or its rmcp
/// worker ends, so that its calls are cancelled then (rmcp cancels them only after waiting
/// up to 5 s for them to answer).
#[derive(Debug, Clone)]
pub(crate) struct SessionClosed(pub(crate) CancellationToken);

/// A run name a client may give: 1 to 128 of `[A-Za-z0-9._:-]`.
fn valid_run_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// What every session of one server shares.
#[derive(Debug)]
pub(crate) struct Shared {
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
    info: ServerConfig,
    /// The last listing, refreshed on every first page and on calls of unknown names.
    listing: Mutex<Option<Arc<Listing>>>,
    /// A task keeps `listing` current ([`Shared::keep_listing`]); sessions then leave it
    /// alone when the tools change.
    kept: AtomicBool,
    /// Distinguishes the run ids of this server's sessions.
    sessions: AtomicU64,
    /// Distinguishes servers, in this process and others (random), so run ids stay unique
    /// across them.
    server_id: String,
    /// The run of the stateless (2026-07-28) requests that neither name a run nor carry a
    /// key or token.
    stateless_run: Arc<str>,
    /// Seals the answers of multi-round-trip requests into `requestState`.
    seal: Result<StateSeal, String>,
    /// Calls running (or run) as MCP tasks.
    tasks: TaskStore,
    /// Where this server's tasks are recorded for the other replicas, when it shares them
    /// ([`super::affinity`]); set once, when the server is bound.
    registry: OnceLock<Arc<super::affinity::Registry>>,
    /// [`ServeOptions::task_tools`], compiled.
    task_tools: globset::GlobSet,
    /// The client profile and name prefix names are served for: fixed when the options
    /// say, else by the first `initialize` ([`ServeOptions::detect_client`]), else generic.
    naming: OnceLock<Naming>,
    /// Who is subscribed to each resource, by URI (see [`Subscribers`]).
    subscribers: Mutex<HashMap<String, Subscribers>>,
    /// The number of the next `resources/subscribe` that takes a URI for its session
    /// (see [`SessionSubscriptions`]).
    subscription_attempts: AtomicU64,
}

/// The resource URIs one session is subscribed to, each with the number of the
/// `resources/subscribe` that took it ([`Shared::subscription_attempts`]). A subscription
/// whose provider fails lets go of its URI only while the URI is still its own: the
/// session may have unsubscribed meanwhile (its hold is then released already) and
/// subscribed again (the URI is then the later attempt's).
type SessionSubscriptions = Arc<Mutex<HashMap<String, u64>>>;

/// The sessions (and `subscriptions/listen` requests) subscribed to one resource, and the
/// providers they subscribed through: the whole served provider, or key holders' views.
///
/// The count is of the URI, not of each view: views may route a URI to one upstream
/// server (the views of `serve.holderTools` all route through one orchestrator, whose
/// upstream subscription is one for every view), so a holder's leaving must not
/// unsubscribe through its view while another holds the URI. They may also route it to
/// different providers, so when the last one leaves each view subscribed through is told
/// to unsubscribe, not only the last leaver's.
#[derive(Debug, Default)]
struct Subscribers {
    /// How many hold it.
    count: usize,
    /// The providers subscribed through, one per view, each recorded once its
    /// subscription was taken.
    through: Vec<Subscriber>,
}

/// The provider one key holder subscribes through: its view, or the whole served provider
/// (`view` is then `None`).
#[derive(Debug, Clone)]
struct Subscriber {
    view: Option<Arc<str>>,
    provider: Arc<dyn ToolProvider>,
}

/// Tells each of `providers` to unsubscribe from `uri`: the first error, once all were
/// told.
async fn unsubscribe_through(
    providers: Vec<Arc<dyn ToolProvider>>,
    uri: &str,
) -> Result<(), ToolError> {
    let mut failure = None;
    for provider in providers {
        if let Err(error) = provider.unsubscribe_resource(uri).await {
            tracing::debug!(%uri, error = %error.report(), "not unsubscribed");
            failure.get_or_insert(error);
        }
    }
    failure.map_or(Ok(()), Err)
}

/// What served names are fitted to.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    pub(crate) client: ClientProfile,
    /// What the client puts before each name; `None`: names are served unchanged.
    pub(crate) prefix: Option<String>,
}

impl Naming {
    fn of(client: ClientProfile, prefix: Option<String>, server: &str) -> Naming {
        let prefix = prefix.or_else(|| client.name_prefix(server));
        Naming { client, prefix }
    }
}

/// One listing of the provider's tools, as served.
#[derive(Debug)]
struct Listing {
    /// Visible tools in provider order, under their served names.
    tools: Vec<Tool>,
    /// Served names (hidden tools included) and where they route.
    names: NameMap,
    /// The tools (by local name) whose calls may run as tasks.
    tasks: HashMap<String, TaskSupport>,
}

impl Shared {
    /// What the sessions of a server of `provider` share, sealing `requestState` with a
    /// key of its own.
    pub(crate) fn new(provider: Arc<dyn ToolProvider>, options: ServeOptions) -> Arc<Shared> {
        Shared::with_seal(provider, options, StateSeal::new())
    }

    /// [`Shared::new`], sealing `requestState` with `seal` (or failing the requests that
    /// need it with the error).
    pub(crate) fn with_seal(
        provider: Arc<dyn ToolProvider>,
        options: ServeOptions,
        seal: Result<StateSeal, String>,
    ) -> Arc<Shared> {
        // Patterns were checked where they were configured; one that does not compile
        // here matches nothing.
        let mut globs = globset::GlobSetBuilder::new();
        for pattern in &options.task_tools {
            if let Ok(glob) = globset::Glob::new(pattern) {
                globs.add(glob);
            }
        }
        let task_tools = globs.build().unwrap_or_else(|_| globset::GlobSet::empty());
        // Fixed now unless the client's `initialize` may choose it.
        let naming = OnceLock::new();
        let detect = options.detect_client
            && options.client == ClientProfile::Generic
            && options.name_prefix.is_none();
        if !detect {
            let _ = naming.set(Naming::of(
                options.client,
                options.name_prefix.clone(),
                &options.server_name,
            ));
        }
        // Prompts and resources are always declared: a provider without any serves empty
        // lists, which is the answer the capabilities explain. Tools log through MCP
        // logging, and resource updates are offered when the provider has any.
        let mut capabilities = ServerCapabilities::builder()
            .enable_completions()
            .enable_prompts()
            .enable_resources()
            .enable_tools()
            .build();
        capabilities.logging = Some(Default::default());
        if provider.resource_updates().is_some()
            && let Some(resources) = capabilities.resources.as_mut()
        {
            resources.subscribe = Some(true);
        }
        if provider.tool_list_changes().is_some()
            && let Some(tools) = capabilities.tools.as_mut()
        {
            tools.list_changed = Some(true);
        }
        if provider.prompt_list_changes().is_some()
            && let Some(prompts) = capabilities.prompts.as_mut()
        {
            prompts.list_changed = Some(true);
        }
        if provider.resource_list_changes().is_some()
            && let Some(resources) = capabilities.resources.as_mut()
        {
            resources.list_changed = Some(true);
        }
        // Tools that support tasks may appear at any time: the extension is always offered.
        capabilities
            .extensions
            .get_or_insert_with(Default::default)
            .insert(TASKS_EXTENSION_ID.to_owned(), JsonObject::new());
        let mut info = ServerConfig::new(capabilities).with_server_info(Implementation::new(
            options.server_name.clone(),
            options.server_version.clone(),
        ));
        if let Some(instructions) = options.instructions.clone().or_else(|| provider.instructions())
        {
            info = info.with_instructions(instructions);
        }
        // Unique beyond this process: replicas and a restarted server share inboxes and
        // spaces (a folder, a Redis) keyed by run, and a session must not find another's.
        let server_id = toolmux_core::unique_token();
        Arc::new(Shared {
            provider,
            options,
            info,
            listing: Mutex::new(None),
            kept: AtomicBool::new(false),
            sessions: AtomicU64::new(0),
            stateless_run: Arc::from(format!("mcp-{server_id}-stateless")),
            server_id,
            seal,
            tasks: TaskStore::default(),
            registry: OnceLock::new(),
            task_tools,
            naming,
            subscribers: Mutex::default(),
            subscription_attempts: AtomicU64::new(0),
        })
    }

    /// What key holder `holder` subscribes to resources through.
    fn subscriber(&self, holder: Option<Arc<str>>) -> Subscriber {
        match self.view_of(holder.as_deref()) {
            Some(provider) => Subscriber { view: holder, provider },
            None => Subscriber { view: None, provider: self.provider.clone() },
        }
    }

    /// One more subscriber of the resource `uri` (counted before the provider is asked,
    /// so that another's leaving meanwhile does not unsubscribe it).
    fn hold_subscription(&self, uri: &str) {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        subscribers.entry(uri.to_owned()).or_default().count += 1;
    }

    /// `subscriber`, which holds `uri` ([`Shared::hold_subscription`]), was subscribed to
    /// it: its provider is told to unsubscribe when the last subscriber leaves. `false`
    /// when no one holds `uri` any more (the session unsubscribed meanwhile): its provider
    /// is then to be told at once.
    #[must_use]
    fn subscribed_through(&self, uri: &str, subscriber: &Subscriber) -> bool {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(subscribers) = subscribers.get_mut(uri) else { return false };
        if !subscribers.through.iter().any(|s| s.view == subscriber.view) {
            subscribers.through.push(subscriber.clone());
        }
        true
    }

    /// One subscriber of the resource `uri` fewer: when it was the last, the providers
    /// subscribed through, which are to be told to unsubscribe (else none).
    fn release_subscription(&self, uri: &str) -> Vec<Arc<dyn ToolProvider>> {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
        match subscribers.get_mut(uri) {
            Some(held) if held.count > 1 => {
                held.count -= 1;
                Vec::new()
            }
            _ => {
                let through = subscribers.remove(uri).map(|held| held.through);
                through.unwrap_or_default().into_iter().map(|s| s.provider).collect()
            }
        }
    }

    /// [`Shared::release_subscription`] of each of `uris`: the resources no one holds any
    /// more, with the providers to tell.
    fn release_subscriptions(
        &self,
        uris: HashSet<String>,
    ) -> Vec<(String, Vec<Arc<dyn ToolProvider>>)> {
        let released = uris.into_iter().map(|uri| {
            let through = self.release_subscription(&uri);
            (uri, through)
        });
        released.filter(|(_, through)| !through.is_empty()).collect()
    }

    /// [`Shared::release_subscriptions`], the providers told from a task of its own when
    /// there is a runtime to run it (a synchronous end: a session's, a dropped request's).
    fn release_subscriptions_later(&self, uris: HashSet<String>) {
        let last = self.release_subscriptions(uris);
        if last.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for (uri, through) in last {
                    let _ = unsubscribe_through(through, &uri).await;
                }
            });
        }
    }

    /// What served names are fitted to (generic, unless fixed or chosen by a client).
    pub(crate) fn naming(&self) -> &Naming {
        self.naming.get_or_init(|| Naming { client: ClientProfile::Generic, prefix: None })
    }

    /// Takes the profile of the client that named itself `client_name` in its
    /// `initialize`, unless the names are fixed already (by the options, or by a listing).
    fn detect_client(&self, client_name: &str) {
        let Some(client) = ClientProfile::detect(client_name) else { return };
        let naming = Naming::of(client, None, &self.options.server_name);
        if self.naming.set(naming).is_ok() {
            tracing::info!(
                "serving tool names and schemas for {client_name} (profile `{}`; `--client` \
                 chooses another)",
                client.name()
            );
        }
    }

    pub(crate) fn options(&self) -> &ServeOptions {
        &self.options
    }

    /// The calls running (or run) as tasks here.
    pub(crate) fn tasks(&self) -> &TaskStore {
        &self.tasks
    }

    /// Records this server's tasks in `registry` from now on, so that the other replicas
    /// forward their requests here.
    pub(crate) fn share_tasks(&self, registry: Arc<super::affinity::Registry>) {
        let _ = self.registry.set(registry);
    }

    pub(crate) fn provider(&self) -> &Arc<dyn ToolProvider> {
        &self.provider
    }

    /// The provider key holder `holder` is served: its view ([`ServeOptions::views`]), or
    /// the whole served provider.
    pub(crate) fn provider_of(&self, holder: Option<&str>) -> Arc<dyn ToolProvider> {
        self.view_of(holder).unwrap_or_else(|| self.provider.clone())
    }

    /// The view of key holder `holder`, when it has one.
    fn view_of(&self, holder: Option<&str>) -> Option<Arc<dyn ToolProvider>> {
        self.options.views.as_ref()?.view(holder?)
    }

    /// `streams` as key holder `holder` is to hear them: the resource updates of the
    /// providers its view passes on only ([`ToolProvider::passes_updates_from`]), asked of
    /// its view as it is when each update comes. Two providers may serve one URI, and a
    /// holder subscribed to it must not hear of the one out of its view.
    fn streams_for(self: &Arc<Self>, mut streams: Streams, holder: Option<Arc<str>>) -> Streams {
        let Some(holder) = holder.filter(|_| self.options.views.is_some()) else {
            return streams;
        };
        let shared = Arc::downgrade(self);
        let passes = move |source: &str| {
            let view = shared.upgrade().and_then(|shared| shared.view_of(Some(&holder)));
            view.is_none_or(|view| view.passes_updates_from(source))
        };
        streams.updates = streams.updates.map(|updates| updates.only_from(passes));
        streams
    }

    fn cached_listing(&self) -> Option<Arc<Listing>> {
        self.listing.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The tools changed: the listing is dropped, to be read again by whoever needs it
    /// next, unless [`Shared::keep_listing`] is reading it again already.
    fn forget_listing(&self) {
        if !self.kept.load(Ordering::Relaxed) {
            *self.listing.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// Keeps the listing current from a task of its own: read once now and again after
    /// every change of the provider's tools, until `shutdown`. For servers whose
    /// transport asks [`ServerHandler::get_tool`] (streamable HTTP, which checks a
    /// stateless call's `Mcp-Param-*` headers against the tool's schema): that lookup is
    /// synchronous and cannot list, so without this a call made before any `tools/list`,
    /// or after a change, would go unchecked.
    pub(crate) fn keep_listing(self: &Arc<Self>, shutdown: CancellationToken) {
        self.kept.store(true, Ordering::Relaxed);
        let mut changes = self.provider.tool_list_changes();
        let shared = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                {
                    let Some(shared) = shared.upgrade() else { break };
                    let refreshed = tokio::select! {
                        () = shutdown.cancelled() => break,
                        refreshed = shared.refresh_listing() => refreshed,
                    };
                    if let Err(error) = refreshed {
                        tracing::debug!(error = %error.report(), "tool listing not read");
                    }
                }
                let Some(changes) = changes.as_mut() else { break };
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    changed = changes.changed() => if !changed { break },
                }
            }
        });
    }

    async fn refresh_listing(&self) -> Result<Arc<Listing>, ToolError> {
        let specs = self.provider.list_tools().await?;
        let naming = self.naming();
        let names = NameMap::new(
            specs.iter().map(|s| s.name.as_str()),
            naming.prefix.as_deref(),
            naming.client.name_budget(),
        );
        let rules = naming.client.schema_rules();
        let tools = specs
            .iter()
            .zip(names.pairs())
            .filter(|(spec, _)| spec.annotations.visible)
            .map(|(spec, (served, _))| convert::tool(spec, served, &rules))
            .collect();
        let tasks = specs
            .iter()
            .filter_map(|spec| {
                let support = match spec.annotations.task_support {
                    TaskSupport::Forbidden if self.task_tools.is_match(&spec.name) => {
                        TaskSupport::Optional
                    }
                    support => support,
                };
                (support != TaskSupport::Forbidden).then(|| (spec.name.clone(), support))
            })
            .collect();
        let listing = Arc::new(Listing { tools, names, tasks });
        *self.listing.lock().unwrap_or_else(|e| e.into_inner()) = Some(listing.clone());
        Ok(listing)
    }

    /// Whether calls of the tool with local name `local` may run as tasks.
    async fn task_support(&self, local: &str) -> TaskSupport {
        let listing = match self.cached_listing() {
            Some(listing) => listing,
            None => match self.refresh_listing().await {
                Ok(listing) => listing,
                Err(_) => return TaskSupport::Forbidden,
            },
        };
        listing.tasks.get(local).copied().unwrap_or_default()
    }

    /// The local name a served name routes to. Names are passed on unchanged unless a
    /// prefix budget made the server serve them differently.
    async fn local_name(&self, served: &str) -> String {
        if self.naming().prefix.is_none() {
            return served.to_owned();
        }
        let listing = match self.cached_listing() {
            Some(listing) if listing.names.contains(served) => listing,
            // A name not seen yet: the list may have changed since it was last read.
            _ => match self.refresh_listing().await {
                Ok(listing) => listing,
                Err(_) => return served.to_owned(),
            },
        };
        listing.names.local(served).unwrap_or(served).to_owned()
    }
}

/// What ends with a session: its cancellation token, the runs that belong to it alone
/// (its own, and a key holder's within it), which the provider is told have ended
/// ([`ToolProvider::end_run`]: a per-session upstream server goes now, not when it idles
/// out), and its resource subscriptions, each unsubscribed from unless another session
/// holds it too. Runs a client names, and stateless requests' runs, outlive sessions.
#[derive(Debug)]
struct SessionEnd {
    _session: DropGuard,
    shared: Arc<Shared>,
    runs: Mutex<Vec<Arc<str>>>,
    subscriptions: SessionSubscriptions,
}

impl SessionEnd {
    fn keep(&self, run: &Arc<str>) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if !runs.contains(run) {
            runs.push(run.clone());
        }
    }
}

impl Drop for SessionEnd {
    fn drop(&mut self) {
        let runs = std::mem::take(self.runs.get_mut().unwrap_or_else(|e| e.into_inner()));
        for run in runs {
            self.shared.provider.end_run(&run);
        }
        let subscriptions =
            std::mem::take(&mut *self.subscriptions.lock().unwrap_or_else(|e| e.into_inner()));
        // Outside a runtime (the server's is gone) there is no one left to tell.
        self.shared.release_subscriptions_later(subscriptions.into_keys().collect());
    }
}

/// The handler of one MCP session.
#[derive(Debug, Clone)]
pub(crate) struct Gateway {
    shared: Arc<Shared>,
    run_id: Arc<str>,
    /// Cancelled when the last clone of this session's handler is dropped, which ends the
    /// session's list-changed forwarder.
    session: CancellationToken,
    /// Cancels `session` and ends the session's runs when the last clone is dropped.
    ended: Arc<SessionEnd>,
    /// Cancelled when the client is gone (its stream ended, over stdio): the calls in
    /// flight are cancelled at once, on rmcp's path as on the direct one. Over HTTP each
    /// request brings its session's own ([`SessionClosed`]).
    closed: CancellationToken,
    /// Set by the first `initialize`: a second one in the session is refused.
    initialized: Arc<AtomicBool>,
    /// The level set with `logging/setLevel`; no log lines are sent before one is set.
    log_level: Arc<Mutex<Option<LogLevel>>>,
    /// The resource URIs this session subscribed to.
    subscriptions: SessionSubscriptions,
    /// The provider's streams for `subscriptions/listen` requests rmcp is about to
    /// acknowledge, by requested filter (see [`Streams`]).
    prepared: Arc<Mutex<Vec<(SubscriptionFilter, Streams)>>>,
    /// The client's capabilities, once a call on the direct path read them (after the
    /// handshake, which fixes them).
    client_capabilities: Arc<OnceLock<Option<Arc<rmcp::model::ClientCapabilities>>>>,
    /// The provider's streams, taken when `initialize` is answered and forwarded from
    /// `notifications/initialized` on: rmcp runs that notification's handler in a task
    /// of its own, beside the client's first requests, so streams taken there would miss
    /// a change after the client's first listing.
    handshake_streams: Arc<Mutex<Option<Streams>>>,
    /// What a key holder's view showed of each list at `initialize`, for the change
    /// forwarders `notifications/initialized` starts; empty without a view.
    handshake_shown: Arc<Mutex<Vec<Shown>>>,
}

/// What a `subscriptions/listen` request watches: the provider's change and update
/// streams, taken in `accepted_subscription_filter`, before rmcp sends the acknowledgment
/// (it calls `listen` only after), so that nothing the provider announces once the client
/// holds the acknowledgment is missed.
#[derive(Debug, Default)]
struct Streams {
    tools: Option<ToolListChanges>,
    prompts: Option<ToolListChanges>,
    resources: Option<ToolListChanges>,
    updates: Option<ResourceUpdates>,
}

/// Resources one session may be subscribed to at once, through `resources/subscribe` (and
/// the URIs one `subscriptions/listen` request may watch): each is kept in memory and may
/// be an upstream server's subscription, so that a client cannot make them without end.
/// Past it a subscription is refused until the client unsubscribes from one; a closed
/// session's go with it.
pub(crate) const SUBSCRIPTIONS_MAX: usize = 1_000;

/// Prepared streams kept at most per session: a listen request whose acknowledgment
/// failed never takes its own.
const PREPARED_MAX: usize = 16;

impl Streams {
    fn of(provider: &dyn ToolProvider) -> Streams {
        Streams {
            tools: provider.tool_list_changes(),
            prompts: provider.prompt_list_changes(),
            resources: provider.resource_list_changes(),
            updates: provider.resource_updates(),
        }
    }
}

/// The lists a provider may announce changes of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    Tools,
    Prompts,
    Resources,
}

/// A list as a key holder's view shows it, hashed: the provider's change streams are of
/// the whole catalog, and a holder is told of a change only when its own list changed, so
/// it does not learn of tools, prompts or resources outside its view.
struct Shown {
    view: Arc<dyn ToolProvider>,
    list: List,
    /// `None` when the view could not list it (then every change is told).
    last: Option<u64>,
}

impl std::fmt::Debug for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shown").field("list", &self.list).field("last", &self.last).finish()
    }
}

impl Shown {
    /// The three lists of `view`, as they are now.
    async fn all(view: &Arc<dyn ToolProvider>) -> Vec<Shown> {
        let mut shown = Vec::new();
        for list in [List::Tools, List::Prompts, List::Resources] {
            let last = Shown::print(&**view, list).await;
            shown.push(Shown { view: view.clone(), list, last });
        }
        shown
    }

    /// Whether the list differs from when last looked at; remembers it as it is now.
    async fn changed(&mut self) -> bool {
        let now = Shown::print(&*self.view, self.list).await;
        let changed = now.is_none() || now != self.last;
        self.last = now;
        changed
    }

    async fn print(view: &dyn ToolProvider, list: List) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let bytes = match list {
            List::Tools => serde_json::to_vec(&view.list_tools().await.ok()?),
            List::Prompts => serde_json::to_vec(&view.list_prompts().await.ok()?),
            List::Resources => {
                let resources = view.list_resources().await.ok()?;
                let templates = view.list_resource_templates().await.ok()?;
                serde_json::to_vec(&(resources, templates))
            }
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        bytes.ok()?.hash(&mut hasher);
        Some(hasher.finish())
    }
}

/// Whether a change of `list` is to be told to a client: always without a view, else when
/// the view's list changed.
async fn to_tell(shown: &mut [Shown], list: List) -> bool {
    match shown.iter_mut().find(|s| s.list == list) {
        Some(shown) => shown.changed().await,
        None => true,
    }
}

/// How a call ended: with a result, or asking the stateless client for input.
enum Ended<T> {
    Done(Result<T, ToolError>),
    InputRequired(InputRequiredResult),
}

/// What one request brings along: where progress and logs go, and who answers questions.
struct Exchange {
    peer: Peer<RoleServer>,
    progress: Option<ProgressToken>,
    log_level: Option<LogLevel>,
    interaction: Arc<ClientInteraction>,
    /// For stateless requests: the round of multi-round-trip answers and what binds
    /// `requestState` to this request.
    round: Option<(Arc<Round>, Vec<u8>)>,
    /// Cancelled when the request's session ends (see [`Gateway::closing`]).
    closing: CancellationToken,
}

impl Gateway {
    pub(crate) fn new(shared: Arc<Shared>) -> Gateway {
        let n = shared.sessions.fetch_add(1, Ordering::Relaxed) + 1;
        let run_id: Arc<str> = Arc::from(format!("mcp-{}-{n}", shared.server_id));
        let session = CancellationToken::new();
        let subscriptions = SessionSubscriptions::default();
        let ended = Arc::new(SessionEnd {
            _session: session.clone().drop_guard(),
            shared: shared.clone(),
            runs: Mutex::new(vec![run_id.clone()]),
            subscriptions: subscriptions.clone(),
        });
        Gateway {
            shared,
            run_id,
            session,
            ended,
            closed: CancellationToken::new(),
            initialized: Arc::default(),
            log_level: Arc::new(Mutex::new(None)),
            subscriptions,
            prepared: Arc::default(),
            client_capabilities: Arc::default(),
            handshake_streams: Arc::default(),
            handshake_shown: Arc::default(),
        }
    }

    /// How long calls may still run once a stdio client's input ended
    /// ([`ServeOptions::end_of_input_grace`]).
    pub(crate) fn end_of_input_grace(&self) -> Duration {
        self.shared.options().end_of_input_grace
    }

    /// Cancelled when the client is gone (see [`Gateway::closed`]); what the session's
    /// end of the direct path cancels too.
    pub(crate) fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// What ends with the session of a request: its HTTP session's end when it has one,
    /// else this handler's (stdio).
    fn closing(&self, context: &RequestContext<RoleServer>) -> CancellationToken {
        match context.extensions.get::<SessionClosed>() {
            Some(closed) => closed.0.clone(),
            None => self.closed.clone(),
        }
    }

    /// The exchange of a request: its progress token, the log level in force (the
    /// request's own `_meta` level on stateless requests, the session's otherwise), and,
    /// for stateless requests, the round opened from `requestState` and `inputResponses`.
    fn exchange(
        &self,
        context: &RequestContext<RoleServer>,
        progress: Option<ProgressToken>,
        binding: impl FnOnce() -> Vec<u8>,
        request_state: Option<&str>,
        input_responses: Option<InputResponses>,
    ) -> Result<Exchange, ErrorData> {
        let stateless = context.protocol_version().is_some_and(|v| !v.has_initialize());
        let capabilities = context.client_capabilities().map(Arc::new);
        let peer = context.peer.clone();
        let closing = self.closing(context);
        if !stateless {
            let log_level = *self.log_level.lock().unwrap_or_else(|e| e.into_inner());
            let interaction = ClientInteraction::session(peer.clone(), capabilities);
            return Ok(Exchange {
                peer,
                progress,
                log_level,
                interaction: Arc::new(interaction),
                round: None,
                closing,
            });
        }
        let log_level = context
            .meta
            .log_level()
            .and_then(|level| convert::log_level(&serde_json::to_value(level).ok()?));
        let mut binding = binding();
        // A state minted for one key holder does not open for another, who would
        // otherwise reuse the answers (approvals too) the first gave.
        if let Some(holder) = self.holder(context) {
            binding.extend_from_slice(b"\0holder\0");
            binding.extend_from_slice(holder.as_bytes());
        }
        let mut answers = BTreeMap::new();
        if let Some(state) = request_state {
            let seal = self
                .shared
                .seal
                .as_ref()
                .map_err(|e| ErrorData::internal_error(e.clone(), None))?;
            answers = seal.open(state, &binding).map_err(|e| ErrorData::invalid_params(e, None))?;
        }
        answers.extend(input_responses.unwrap_or_default());
        let round = Arc::new(Round::new(answers));
        let interaction = ClientInteraction::stateless(peer.clone(), capabilities, round.clone());
        Ok(Exchange {
            peer,
            progress,
            log_level,
            interaction: Arc::new(interaction),
            round: Some((round, binding)),
            closing,
        })
    }

    /// The call context of a request: its cancellation, its run id (the one the request
    /// names in `_meta` under [`RUN_ID_META_KEY`], else this session's), its id.
    fn context(&self, context: &RequestContext<RoleServer>) -> CallContext {
        self.context_of(context, None)
    }

    /// [`Gateway::context`], also reading the run id from the request's own `_meta`.
    fn context_of(
        &self,
        context: &RequestContext<RoleServer>,
        request_meta: Option<&rmcp::model::RequestMetaObject>,
    ) -> CallContext {
        let named = [Some(&context.meta), request_meta]
            .into_iter()
            .flatten()
            .find_map(|meta| meta.0.0.get(RUN_ID_META_KEY).and_then(Value::as_str))
            .filter(|id| valid_run_id(id));
        let holder = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<super::http::KeyHolder>());
        // A stateless client's requests have no session to share a run: they share the
        // run of whoever holds their key or token, or with neither, of the server's
        // stateless clients, so that what a run keeps (files read before being written,
        // spilled outputs, per-session servers, budgets) outlives one request.
        let stateless = context.protocol_version().is_some_and(|v| !v.has_initialize());
        let run_id = match (holder, named) {
            (None, None) if stateless => self.shared.stateless_run.clone(),
            (None, None) => self.run_id.clone(),
            (None, Some(id)) => Arc::from(format!("client:{id}")),
            // `key:HOLDER/…` as every run of a key holder: what keeps tenants apart (the
            // external tools' pending calls) reads the holder from it, exactly even when
            // the holder's name holds a `/` (see `holder_run_id`).
            (Some(holder), None) if stateless => Arc::from(holder_run_id(&holder.0, "stateless")),
            (Some(holder), None) => {
                let run: Arc<str> = Arc::from(holder_run_id(&holder.0, &self.run_id));
                self.ended.keep(&run);
                run
            }
            (Some(holder), Some(id)) => {
                Arc::from(holder_run_id(&holder.0, &format!("client:{id}")))
            }
        };
        // The caller's trace: `_meta.traceparent` (MCP's way, SEP-414), else an HTTP
        // client's `traceparent` header; `tracestate` from the same place.
        let metas = [Some(&context.meta), request_meta];
        let from_meta = |key: &str| {
            metas.into_iter().flatten().find_map(|meta| meta.0.0.get(key).and_then(Value::as_str))
        };
        let from_header = |key: &str| {
            let parts = context.extensions.get::<axum::http::request::Parts>()?;
            parts.headers.get(key)?.to_str().ok()
        };
        let (trace, trace_state) = match from_meta(TRACEPARENT_META_KEY) {
            Some(parent) => (TraceParent::parse(parent), from_meta(TRACESTATE_META_KEY)),
            None => (
                from_header(TRACEPARENT_META_KEY).and_then(TraceParent::parse),
                from_header(TRACESTATE_META_KEY),
            ),
        };
        let trace_state = trace.and(trace_state).map(str::to_owned);
        // The request's headers, for servers configured to get some (`passthroughHeaders`),
        // without the one that authenticated the client to this server.
        let caller_headers = context
            .extensions
            .get::<axum::http::request::Parts>()
            .map(|parts| caller_headers(&parts.headers, holder.is_some()))
            .unwrap_or_default();
        CallContext::new()
            .with_cancel(context.ct.clone())
            .with_run_id(run_id)
            .with_call_id(context.id.to_string())
            .with_trace_parent(trace)
            .with_trace_state(trace_state)
            .with_caller_headers(caller_headers)
    }

    /// Runs `work` (a tool call, a prompt, a resource read, of `what`) with the exchange's
    /// progress, log and question channels, stopping it when a stateless client must answer
    /// first. A panic in `work` is an error of the call ([`ToolError::Panicked`]), so that
    /// the client is answered instead of waiting for ever for a request whose task died.
    async fn drive<T>(
        &self,
        what: &str,
        ctx: CallContext,
        exchange: &Exchange,
        work: impl AsyncFnOnce(CallContext) -> Result<T, ToolError>,
    ) -> Ended<T> {
        let ctx = ctx.with_handler(exchange.interaction.clone());
        let cancel = ctx.cancel_token().clone();
        let wants_channel = exchange.progress.is_some() || exchange.log_level.is_some();
        if !wants_channel && exchange.round.is_none() {
            let work = caught(what, work(ctx));
            return Ended::Done(until_closed(&exchange.closing, &cancel, work).await);
        }
        // Sinks must return at once, so reports go through a channel; they are sent from
        // here, before the result, so that none arrives after the response.
        let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
        let mut ctx = ctx;
        let gate = exchange.progress.is_some().then(|| {
            let tx = tx.clone();
            ProgressGate::new(move |p| {
                let _ = tx.send(Outgoing::Progress(p));
            })
        });
        if let Some(gate) = &gate {
            let gate = gate.clone();
            ctx = ctx.with_progress(ProgressSink::new(move |p| gate.offer(p)));
        }
        if let Some(min) = exchange.log_level {
            let tx = tx.clone();
            ctx = ctx.with_log(LogSink::new(move |m: LogMessage| {
                if m.level >= min {
                    let _ = tx.send(Outgoing::Log(m));
                }
            }));
        }
        drop(tx);
        let mut out = Sender { exchange };
        let call = until_closed(&exchange.closing, &cancel, caught(what, work(ctx)));
        tokio::pin!(call);
        let needed = async {
            match &exchange.round {
                Some((round, _)) => round.input_needed().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(needed);
        let mut rx_open = true;
        let result = loop {
            tokio::select! {
                biased;
                result = &mut call => break Some(result),
                () = &mut needed => {
                    // Let questions asked together with this one be asked too.
                    match tokio::time::timeout(INPUT_GRACE, &mut call).await {
                        Ok(result) => break Some(result),
                        Err(_) => break None,
                    }
                }
                message = rx.recv(), if rx_open => match message {
                    Some(message) => out.send(message).await,
                    None => rx_open = false,
                },
            }
        };
        // The last report kept goes into the channel behind the others, before the result.
        if let Some(gate) = &gate {
            gate.finish();
        }
        while let Ok(message) = rx.try_recv() {
            out.send(message).await;
        }
        match (result, &exchange.round) {
            (Some(result), _) => Ended::Done(result),
            (None, Some((round, binding))) => {
                let asked = round.take_asked();
                let state =
                    self.shared.seal.as_ref().map(|seal| seal.seal(round.answers(), binding)).ok();
                Ended::InputRequired(InputRequiredResult::new(Some(asked), state))
            }
            (None, None) => unreachable!("input is only needed in a round"),
        }
    }
}

/// The API key holder a message came with (its `extensions`), over HTTP with keys.
fn holder_in(extensions: &rmcp::model::Extensions) -> Option<Arc<str>> {
    extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<super::http::KeyHolder>())
        .map(|holder| holder.0.clone())
}

impl Gateway {
    /// The API key holder a request came with, over HTTP with keys.
    fn holder(&self, context: &RequestContext<RoleServer>) -> Option<Arc<str>> {
        holder_in(&context.extensions)
    }

    /// The provider this request's key holder is served (see [`Shared::provider_of`]).
    fn provider_for(&self, context: &RequestContext<RoleServer>) -> Arc<dyn ToolProvider> {
        self.shared.provider_of(self.holder(context).as_deref())
    }

    /// Starts the call as a task, running apart from its request: its questions wait in
    /// the task, `tasks/cancel` stops it, a panic or an unknown tool fails it, and a tool
    /// error (refused arguments too) completes it with `isError`. `None` when no task can be
    /// made (the store is full of unfinished tasks).
    fn start_task(
        &self,
        context: &RequestContext<RoleServer>,
        name: String,
        arguments: Value,
        ctx: CallContext,
    ) -> Option<CreateTaskResult> {
        let task = self.shared.tasks.create(self.holder(context))?;
        let interaction = ClientInteraction::task(
            context.peer.clone(),
            context.client_capabilities().map(Arc::new),
            task.clone(),
        );
        // The request ends now; the task's own token stops the call, and its progress
        // becomes the task's status message.
        let reporting = task.clone();
        let ctx = ctx
            .with_cancel(task.cancel.clone())
            .with_handler(Arc::new(interaction))
            .with_progress(ProgressSink::new(move |p| reporting.progress(&p)));
        let provider = self.provider_for(context);
        let mut running = tokio::spawn(async move { provider.call(&name, arguments, &ctx).await });
        let finishing = task.clone();
        tokio::spawn(async move {
            let joined = tokio::select! {
                joined = &mut running => joined,
                () = tokio::time::sleep_until(finishing.expires_at()) => {
                    // Nobody can read the result or cancel the call any more: it stops
                    // now rather than hold its upstream, queue slot and budget until the
                    // store next sweeps (a call waiting for `tasks/update` never ends).
                    finishing.cancel();
                    if tokio::time::timeout(CLOSE_GRACE, &mut running).await.is_err() {
                        running.abort();
                    }
                    return;
                }
            };
            let result = match joined {
                Ok(Ok(output)) => Ok(convert::output(output)),
                Ok(Err(ToolError::Cancelled { .. })) if finishing.cancel.is_cancelled() => return,
                // Arguments the tool refuses are a result the model reads and corrects
                // (SEP-1303), as on the other paths; an unknown tool is the protocol's.
                Ok(Err(error @ ToolError::UnknownTool { .. })) => {
                    Err(ErrorData::invalid_params(error.report(), None))
                }
                Ok(Err(
                    error @ (ToolError::Panicked { .. }
                    | ToolError::HookPanicked { .. }
                    | ToolError::Protocol { .. }),
                )) => Err(ErrorData::internal_error(error.report(), None)),
                Ok(Err(error)) => Ok(convert::error(&error)),
                Err(joined) => Err(ErrorData::internal_error(
                    format!("the tool's task ended abnormally: {joined}"),
                    None,
                )),
            };
            finishing.finish(result);
        });
        Some(task.created())
    }
}

/// `work` with a panic in it turned into [`ToolError::Panicked`] naming `what`.
async fn caught<T>(
    what: &str,
    work: impl Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            Err(ToolError::Panicked { tool: what.to_owned(), message: panic_message(&*panic) })
        }
    }
}

/// Runs `work` (a call of the session) until it ends, or until `closing` fires: then
/// `cancel` (the call's token) is fired at once and `work` gets [`CLOSE_GRACE`] to return
/// before it is dropped, so that the session ends without waiting for rmcp's drain.
async fn until_closed<T>(
    closing: &CancellationToken,
    cancel: &CancellationToken,
    work: impl Future<Output = Result<T, ToolError>>,
) -> Result<T, ToolError> {
    tokio::pin!(work);
    tokio::select! {
        biased;
        result = &mut work => return result,
        () = closing.cancelled() => cancel.cancel(),
    }
    match tokio::time::timeout(CLOSE_GRACE, work).await {
        Ok(result) => result,
        Err(_) => Err(ToolError::Cancelled { tool: "(the session ended)".into() }),
    }
}

/// Where the progress reports and log lines of a call on the direct path go.
pub(crate) struct CallSinks {
    /// Where the call's progress goes, when the client asked for progress (see
    /// [`CallSinks::progress_gate`]); finished by the call before its result.
    pub(crate) progress: Option<ProgressGate>,
    /// Sends a notification to the client, ahead of anything sent later.
    pub(crate) notify: Arc<dyn Fn(ServerNotification) + Send + Sync>,
    /// The client's distributed trace (`_meta.traceparent`), when it gave one.
    pub(crate) trace: Option<TraceParent>,
    /// Its `_meta.tracestate`.
    pub(crate) trace_state: Option<String>,
    /// Answers a relayed call at once (see [`toolmux_core::EarlyAnswer`]).
    pub(crate) early: Option<EarlyAnswer>,
}

impl Gateway {
    /// A `tools/call` of a session of a handshake revision, run outside rmcp's service
    /// loop (see `session`): as [`ServerHandler::call_tool`] runs it, with progress and
    /// log lines going to `sinks` as they happen, which keeps them ahead of the result.
    pub(crate) async fn call_direct(
        &self,
        name: &str,
        arguments: JsonObject,
        id: &RequestId,
        cancel: CancellationToken,
        peer: Peer<RoleServer>,
        sinks: CallSinks,
    ) -> Result<CallToolResult, ErrorData> {
        let local = self.shared.local_name(name).await;
        let gate = sinks.progress.clone();
        let ctx = self.direct_context(id, cancel, peer, sinks);
        let call = self.shared.provider.call(&local, Value::Object(arguments), &ctx);
        let result = caught(&local, call).await;
        if let Some(gate) = gate {
            gate.finish();
        }
        call_response(result)
    }

    /// The provider's name for `served`, for [`Gateway::relay_direct`], when it is known
    /// without waiting; `None` when the call goes through [`Gateway::call_direct`], which
    /// reads the tool list again for a name it does not know.
    pub(crate) fn relay_name(&self, served: &str) -> Option<String> {
        let shared = &self.shared;
        if shared.naming().prefix.is_none() {
            return Some(served.to_owned());
        }
        let listing = shared.cached_listing().filter(|l| l.names.contains(served))?;
        Some(listing.names.local(served).unwrap_or(served).to_owned())
    }

    /// A `tools/call` on the direct path, relayed where the provider relays it (see
    /// [`ToolProvider::relay`]): as [`Gateway::call_direct`], the arguments as the client
    /// wrote them and a plain result as the server wrote it.
    pub(crate) async fn relay_direct(
        &self,
        local: &str,
        arguments: &str,
        id: &RequestId,
        cancel: CancellationToken,
        peer: Peer<RoleServer>,
        sinks: CallSinks,
    ) -> Result<Answer, ErrorData> {
        let gate = sinks.progress.clone();
        let ctx = self.direct_context(id, cancel, peer, sinks);
        let relayed =
            caught(local, self.shared.provider.relay(local, arguments, &ctx, usize::MAX)).await;
        if let Some(gate) = gate {
            gate.finish();
        }
        match relayed {
            Ok(Relayed::Raw { json, .. }) => Ok(Answer::Raw(json)),
            Ok(Relayed::Output(output)) => call_response(Ok(output)).map(Answer::Result),
            Err(error) => call_response(Err(error)).map(Answer::Result),
        }
    }

    /// The context of a call on the direct path.
    fn direct_context(
        &self,
        id: &RequestId,
        cancel: CancellationToken,
        peer: Peer<RoleServer>,
        sinks: CallSinks,
    ) -> CallContext {
        // The client's capabilities, fixed by its handshake, copied once per session.
        let capabilities = self
            .client_capabilities
            .get_or_init(|| peer.peer_info().map(|info| Arc::new(info.capabilities.clone())))
            .clone();
        let interaction = Arc::new(ClientInteraction::session(peer, capabilities));
        let mut ctx = CallContext::cancelled_by(cancel, self.run_id.clone())
            .with_call_id(id_text(id))
            .with_handler(interaction)
            .with_trace_parent(sinks.trace)
            .with_trace_state(sinks.trace.and(sinks.trace_state))
            .with_early_answer(sinks.early);
        if let Some(gate) = sinks.progress {
            ctx = ctx.with_progress(ProgressSink::new(move |progress| gate.offer(progress)));
        }
        let log_level = *self.log_level.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(min) = log_level {
            let notify = sinks.notify;
            ctx = ctx.with_log(LogSink::new(move |message: LogMessage| {
                if message.level < min {
                    return;
                }
                if let Some(param) = convert::log_param(message) {
                    let notification =
                        ServerNotification::LoggingMessageNotification(Notification::new(param));
                    notify(notification);
                }
            }));
        }
        ctx
    }
}

impl CallSinks {
    /// The gate of a call whose client gave `token`: its reports go out through `notify`
    /// as `notifications/progress`.
    pub(crate) fn progress_gate(
        token: ProgressToken,
        notify: Arc<dyn Fn(ServerNotification) + Send + Sync>,
    ) -> ProgressGate {
        ProgressGate::new(move |progress| {
            let param = progress_param(&token, progress);
            notify(ServerNotification::ProgressNotification(Notification::new(param)));
        })
    }
}

/// The answer to a call on the direct path.
pub(crate) enum Answer {
    /// A relayed result as the server wrote it: the JSON text of a `CallToolResult`.
    Raw(Box<str>),
    Result(CallToolResult),
}

/// A progress report or a log line on its way to the client.
enum Outgoing {
    Progress(Progress),
    Log(LogMessage),
}

/// Sends a request's progress reports (coalesced and rising: see [`ProgressGate`]) and
/// log lines.
struct Sender<'a> {
    exchange: &'a Exchange,
}

impl Sender<'_> {
    async fn send(&mut self, message: Outgoing) {
        let peer = &self.exchange.peer;
        let sent = match message {
            Outgoing::Progress(progress) => {
                let Some(token) = &self.exchange.progress else { return };
                peer.notify_progress(progress_param(token, progress)).await
            }
            Outgoing::Log(message) => {
                let Some(param) = convert::log_param(message) else { return };
                #[expect(deprecated, reason = "logging is still part of every revision served")]
                let sent = peer.notify_logging_message(param).await;
                sent
            }
        };
        if let Err(error) = sent {
            tracing::debug!(%error, "notification not delivered");
        }
    }
}

/// A request id as a call's id: a string id shared, a number written without `fmt` (on
/// every call's path).
fn id_text(id: &RequestId) -> Arc<str> {
    match id {
        rmcp::model::NumberOrString::String(text) => text.clone(),
        rmcp::model::NumberOrString::Number(n) => Arc::from(itoa::Buffer::new().format(*n)),
    }
}

/// The `notifications/progress` params of a report.
fn progress_param(token: &ProgressToken, progress: Progress) -> ProgressNotificationParam {
    let mut param = ProgressNotificationParam::new(token.clone(), progress.progress);
    if let Some(total) = progress.total {
        param = param.with_total(total);
    }
    if let Some(message) = progress.message {
        param = param.with_message(message);
    }
    param
}

/// The response to a call that ended: its result, a failure as a result the model reads,
/// or, for an unknown tool, the protocol error MCP specifies (`-32602`).
fn call_response(result: Result<ToolOutput, ToolError>) -> Result<CallToolResult, ErrorData> {
    match result {
        Ok(output) => Ok(convert::output(output)),
        Err(error @ ToolError::UnknownTool { .. }) => {
            Err(ErrorData::invalid_params(error.report(), None))
        }
        Err(error) => Ok(convert::error(&error)),
    }
}

/// The response to a prompt or resource request that ended: its result, the questions
/// a stateless client must answer first, or the protocol error for its failure.
fn finish<T, R: From<InputRequiredResult>>(
    exchange: &Exchange,
    ended: Ended<T>,
    complete: impl FnOnce(T) -> Result<R, ErrorData>,
) -> Result<R, ErrorData> {
    match ended {
        Ended::Done(Ok(value)) => complete(value),
        Ended::Done(Err(error)) => {
            Err(missing_capability(exchange, &error).unwrap_or_else(|| resource_error(&error)))
        }
        Ended::InputRequired(result) => Ok(result.into()),
    }
}

/// The protocol error for a failed listing of `what`.
fn listing_error(what: &str, error: &ToolError) -> ErrorData {
    ErrorData::internal_error(format!("cannot list {what}: {}", error.report()), None)
}

/// The protocol error for a failed prompt or resource request: unknown names and URIs
/// as MCP specifies (`-32602`, `-32002` with the URI), the caller's mistakes as invalid
/// params, the rest as internal errors.
fn resource_error(error: &ToolError) -> ErrorData {
    match error {
        ToolError::UnknownResource { uri } => ErrorData::resource_not_found(
            format!("resource not found: {uri}"),
            Some(json!({ "uri": uri })),
        ),
        error if error.party() == toolmux_core::Party::Caller => {
            ErrorData::invalid_params(error.report(), None)
        }
        error => ErrorData::internal_error(error.report(), None),
    }
}

/// A canonical byte form of a request, binding `requestState` to it: the method, the
/// name and the arguments with their keys sorted ([`Gateway::exchange`] adds the key
/// holder).
fn binding(method: &str, name: &str, arguments: &Value) -> Vec<u8> {
    fn canonical(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for key in keys {
                    out.push_str(&Value::String(key.clone()).to_string());
                    out.push(':');
                    canonical(&map[key], out);
                    out.push(',');
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for item in items {
                    canonical(item, out);
                    out.push(',');
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut text = format!("{method}\0{name}\0");
    canonical(arguments, &mut text);
    text.into_bytes()
}

/// The protocol error for a call that failed because the stateless client did not
/// declare a capability it needed, if that is why it failed.
fn missing_capability(exchange: &Exchange, error: &ToolError) -> Option<ErrorData> {
    if exchange.round.is_none() || !matches!(error, ToolError::Unsupported { .. }) {
        return None;
    }
    let need = exchange.interaction.missing()?;
    let mut data = ErrorData::missing_required_client_capability(need.capabilities());
    data.message = error.report().into();
    Some(data)
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        self.shared.info.clone()
    }

    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        // MCP: `initialize` is the first request of a session, and only the first. A
        // second would change what the first fixed (the client's capabilities, its
        // revision) under calls already running.
        if self.initialized.swap(true, Ordering::AcqRel) {
            return Err(ErrorData::invalid_request(
                "the session is already initialized: `initialize` is the first request of a \
                 session only; to start over, open a new session",
                None,
            ));
        }
        self.shared.detect_client(&request.client_info.name);
        context.peer.set_peer_info(request.clone());
        let negotiated = self.negotiate_initialize(&request);
        if negotiated.is_ok() {
            let streams = Streams::of(&*self.shared.provider);
            let streams = self.shared.streams_for(streams, self.holder(&context));
            *self.handshake_streams.lock().unwrap_or_else(|e| e.into_inner()) = Some(streams);
            if let Some(view) = self.shared.view_of(self.holder(&context).as_deref()) {
                let shown = Shown::all(&view).await;
                *self.handshake_shown.lock().unwrap_or_else(|e| e.into_inner()) = shown;
            }
        }
        negotiated
    }

    #[expect(deprecated, reason = "clients of the handshake revisions still send logging/setLevel")]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let level = serde_json::to_value(request.level).ok().and_then(|v| convert::log_level(&v));
        *self.log_level.lock().unwrap_or_else(|e| e.into_inner()) = level;
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let provider = self.provider_for(&context);
        let prompts = provider.list_prompts().await.map_err(|e| listing_error("prompts", &e))?;
        let prompts: Vec<Value> = prompts.iter().map(|p| convert::prompt(p, &p.name)).collect();
        convert::result(json!({ "prompts": prompts }))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let args = Value::Object(arguments.clone());
        let exchange = self.exchange(
            &context,
            context.meta.get_progress_token(),
            || binding("prompts/get", &request.name, &args),
            request.request_state.as_deref(),
            request.input_responses,
        )?;
        let ctx = self.context(&context);
        let provider = &self.provider_for(&context);
        let name = request.name.as_str();
        let ended = self
            .drive(name, ctx, &exchange, async |ctx| {
                provider.get_prompt(name, arguments, &ctx).await
            })
            .await;
        finish(&exchange, ended, |prompt| {
            let result =
                convert::result::<rmcp::model::GetPromptResult>(convert::prompt_result(prompt))?;
            Ok(result.into())
        })
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let reference = match request.r#ref {
            Reference::Prompt(prompt) => CompletionRef::Prompt(prompt.name),
            Reference::Resource(template) => CompletionRef::ResourceTemplate(template.uri),
            other => {
                let kind = other.reference_type();
                return Err(ErrorData::invalid_params(
                    format!(
                        "cannot complete a `{kind}` reference (prompts and resource templates can be)"
                    ),
                    None,
                ));
            }
        };
        let mut asked =
            CompletionRequest::new(reference, request.argument.name, request.argument.value);
        if let Some(given) = request.context.and_then(|c| c.arguments) {
            asked.context = given.into_iter().collect();
        }
        let ctx = self.context(&context);
        let completion = self
            .provider_for(&context)
            .complete(asked, &ctx)
            .await
            .map_err(|e| resource_error(&e))?;
        let mut values = completion.values;
        let has_more = completion.has_more || values.len() > CompletionInfo::MAX_VALUES;
        values.truncate(CompletionInfo::MAX_VALUES);
        let info = CompletionInfo::with_pagination(values, completion.total, has_more)
            .map_err(|e| ErrorData::internal_error(e, None))?;
        Ok(CompleteResult::new(info))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let resources = self
            .provider_for(&context)
            .list_resources()
            .await
            .map_err(|e| listing_error("resources", &e))?;
        let resources: Vec<Value> = resources.iter().map(convert::resource).collect();
        convert::result(json!({ "resources": resources }))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let templates = self
            .provider_for(&context)
            .list_resource_templates()
            .await
            .map_err(|e| listing_error("resource templates", &e))?;
        let templates: Vec<Value> = templates.iter().map(convert::resource_template).collect();
        convert::result(json!({ "resourceTemplates": templates }))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        let exchange = self.exchange(
            &context,
            context.meta.get_progress_token(),
            || binding("resources/read", &uri, &Value::Null),
            request.request_state.as_deref(),
            request.input_responses,
        )?;
        let ctx = self.context(&context);
        let provider = &self.provider_for(&context);
        let ended = self
            .drive(&uri, ctx, &exchange, async |ctx| provider.read_resource(&uri, &ctx).await)
            .await;
        finish(&exchange, ended, |contents| {
            let contents = convert::resource_contents(contents);
            Ok(convert::result::<rmcp::model::ReadResourceResult>(contents)?.into())
        })
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let attempt = {
            let mut subscriptions = self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
            if subscriptions.len() >= SUBSCRIPTIONS_MAX && !subscriptions.contains_key(&request.uri)
            {
                return Err(ErrorData::invalid_request(
                    format!(
                        "this session is subscribed to {SUBSCRIPTIONS_MAX} resources, the most \
                         a session may be; unsubscribe from one (`resources/unsubscribe`) \
                         before subscribing to `{}`",
                        request.uri
                    ),
                    None,
                ));
            }
            if subscriptions.contains_key(&request.uri) {
                return Ok(());
            }
            let attempt = self.shared.subscription_attempts.fetch_add(1, Ordering::Relaxed);
            subscriptions.insert(request.uri.clone(), attempt);
            attempt
        };
        self.shared.hold_subscription(&request.uri);
        let subscriber = self.shared.subscriber(self.holder(&context));
        if let Err(error) = subscriber.provider.subscribe_resource(&request.uri).await {
            let own = {
                let mut subscriptions =
                    self.subscriptions.lock().unwrap_or_else(|e| e.into_inner());
                let own = subscriptions.get(&request.uri) == Some(&attempt);
                if own {
                    subscriptions.remove(&request.uri);
                }
                own
            };
            if own {
                // The others subscribed may have left meanwhile.
                let through = self.shared.release_subscription(&request.uri);
                let _ = unsubscribe_through(through, &request.uri).await;
            }
            return Err(resource_error(&error));
        }
        if !self.shared.subscribed_through(&request.uri, &subscriber) {
            let _ = unsubscribe_through(vec![subscriber.provider], &request.uri).await;
        }
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let removed =
            self.subscriptions.lock().unwrap_or_else(|e| e.into_inner()).remove(&request.uri);
        if removed.is_none() {
            return Ok(());
        }
        // Another session subscribed to it too keeps the providers' subscriptions.
        let through = self.shared.release_subscription(&request.uri);
        unsubscribe_through(through, &request.uri).await.map_err(|e| resource_error(&e))
    }

    /// The served tool of this name, from the last listing; rmcp's HTTP transport checks
    /// `Mcp-Param-*` headers against its `x-mcp-header` arguments. Over HTTP the listing
    /// is read when serving starts and after every change ([`Shared::keep_listing`]); a
    /// tool the listing does not have yet is not checked (this is synchronous, so it
    /// cannot list).
    fn get_tool(&self, name: &str) -> Option<Tool> {
        let listing = self.shared.cached_listing()?;
        listing.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let cursor = request.and_then(|r| r.cursor);
        let listing = match (&cursor, self.shared.cached_listing()) {
            // Later pages read the listing the first page made, so pages fit together.
            (Some(_), Some(listing)) => listing,
            _ => self.shared.refresh_listing().await.map_err(|e| listing_error("tools", &e))?,
        };
        // A key holder with a view is listed the tools in it, named as for everyone.
        let tools: std::borrow::Cow<'_, [Tool]> =
            match self.shared.view_of(self.holder(&context).as_deref()) {
                None => std::borrow::Cow::Borrowed(&listing.tools),
                Some(view) => {
                    let shown = view.list_tools().await.map_err(|e| listing_error("tools", &e))?;
                    let shown: HashSet<String> = shown.into_iter().map(|t| t.name).collect();
                    let local = |t: &&Tool| {
                        let name: &str = &t.name;
                        shown.contains(listing.names.local(name).unwrap_or(name))
                    };
                    std::borrow::Cow::Owned(listing.tools.iter().filter(local).cloned().collect())
                }
            };
        let start = match &cursor {
            None => 0,
            Some(cursor) => page_start(cursor, &tools).ok_or_else(|| {
                ErrorData::invalid_params(format!("invalid cursor `{cursor}`"), None)
            })?,
        };
        let page_size = self.shared.options.page_size.max(1);
        let end = tools.len().min(start.saturating_add(page_size));
        let mut result = ListToolsResult::with_all_items(tools[start..end].to_vec());
        if end < tools.len() {
            result.next_cursor = Some(next_cursor(end, &tools[end - 1].name));
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = self.shared.local_name(&request.name).await;
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let token = context
            .meta
            .get_progress_token()
            .or_else(|| request.meta.as_ref().and_then(|m| m.get_progress_token()));
        let exchange = self.exchange(
            &context,
            token,
            || binding("tools/call", &request.name, &arguments),
            request.request_state.as_deref(),
            request.input_responses,
        )?;
        let ctx = self.context_of(&context, request.meta.as_ref());
        let support = self.shared.task_support(&name).await;
        if support != TaskSupport::Forbidden {
            let declared = context.client_capabilities().is_some_and(|c| c.supports_tasks())
                || request
                    .meta
                    .as_ref()
                    .and_then(|m| m.client_capabilities())
                    .is_some_and(|c| c.supports_tasks());
            if declared {
                if let Some(created) =
                    self.start_task(&context, name.clone(), arguments.clone(), ctx.clone())
                {
                    // Recorded before the client learns the id, so that a `tasks/get` of
                    // it at any replica right after finds it.
                    if let Some(registry) = self.shared.registry.get() {
                        registry.claim_task(&created.task.task_id, super::tasks::TTL).await;
                    }
                    return Ok(CallToolResponse::Task(created));
                }
            } else if support == TaskSupport::Required {
                let mut error = ErrorData::missing_required_client_capability(
                    rmcp::model::ClientCapabilities::builder().enable_tasks().build(),
                );
                error.message = format!(
                    "`{}` runs only as a task: declare the `{TASKS_EXTENSION_ID}` extension",
                    request.name
                )
                .into();
                return Err(error);
            }
        }
        let provider = &self.provider_for(&context);
        let ended = self
            .drive(&name, ctx, &exchange, async |ctx| provider.call(&name, arguments, &ctx).await)
            .await;
        match ended {
            Ended::InputRequired(result) => Ok(result.into()),
            // A capability the stateless client did not declare is a protocol error
            // (`-32021`).
            Ended::Done(Err(error)) => match missing_capability(&exchange, &error) {
                Some(data) => Err(data),
                None => call_response(Err(error)).map(Into::into),
            },
            Ended::Done(result) => call_response(result).map(Into::into),
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let task = self.shared.tasks.get(&request.task_id, self.holder(&context).as_ref())?;
        Ok(task.detailed())
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let task = self.shared.tasks.get(&request.task_id, self.holder(&context).as_ref())?;
        // Keys of no waiting question are ignored, as the extension asks.
        if task.inputs.answer(request.input_responses) {
            task.touch();
        }
        Ok(())
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let task = self.shared.tasks.get(&request.task_id, self.holder(&context).as_ref())?;
        task.cancel();
        Ok(())
    }

    /// rmcp hands over as a custom request every request it could not read: an unknown
    /// method, and one of MCP's whose `params` do not fit it. Only the first is "method
    /// not found"; the second is invalid params, saying what does not fit (rmcp answered
    /// both `-32601` with the method's name as the whole message).
    async fn on_custom_request(
        &self,
        request: rmcp::model::CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CustomResult, ErrorData> {
        let method = request.method.as_str();
        // The methods 2026-07-28 removed are unknown to its requests (SEP-2575), whatever
        // their params.
        const REMOVED: [&str; 4] =
            ["initialize", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"];
        let stateless = context.protocol_version().is_some_and(|v| !v.has_initialize());
        let misfit = if stateless && REMOVED.contains(&method) {
            None
        } else {
            params_misfit(method, request.params.as_ref())
        };
        match misfit {
            Some(why) => Err(ErrorData::invalid_params(
                format!("invalid params for `{method}`: {why}"),
                None,
            )),
            None => Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("method not found: `{method}`"),
                None,
            )),
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let taken = self.handshake_streams.lock().unwrap_or_else(|e| e.into_inner()).take();
        // Without an `initialize` answered (a client that never sent one) there is
        // nothing before this to miss.
        let streams = taken.unwrap_or_else(|| {
            let streams = Streams::of(&*self.shared.provider);
            self.shared.streams_for(streams, holder_in(&context.extensions))
        });
        let mut shown =
            std::mem::take(&mut *self.handshake_shown.lock().unwrap_or_else(|e| e.into_inner()));
        for (changes, list) in [
            (streams.tools, List::Tools),
            (streams.prompts, List::Prompts),
            (streams.resources, List::Resources),
        ] {
            let Some(changes) = changes else { continue };
            // A burst of changes is announced once (`settle`).
            let mut changes = SettledChanges::new(changes);
            let peer = context.peer.clone();
            let session = self.session.clone();
            let shared = Arc::downgrade(&self.shared);
            let mut shown: Vec<Shown> = shown.extract_if(.., |s| s.list == list).collect();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = session.cancelled() => break,
                        changed = changes.next() => {
                            if !changed {
                                break;
                            }
                            if matches!(list, List::Tools)
                                && let Some(shared) = shared.upgrade()
                            {
                                shared.forget_listing();
                            }
                            if !to_tell(&mut shown, list).await {
                                continue;
                            }
                            let sent = match list {
                                List::Tools => peer.notify_tool_list_changed().await,
                                List::Prompts => peer.notify_prompt_list_changed().await,
                                List::Resources => peer.notify_resource_list_changed().await,
                            };
                            if sent.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
        if let Some(mut updates) = streams.updates {
            let peer = context.peer;
            let session = self.session.clone();
            let subscriptions = Arc::downgrade(&self.subscriptions);
            tokio::spawn(async move {
                loop {
                    let uri = tokio::select! {
                        () = session.cancelled() => break,
                        uri = updates.next() => match uri {
                            Some(uri) => uri,
                            None => break,
                        },
                    };
                    let Some(subscriptions) = subscriptions.upgrade() else { break };
                    if !subscriptions.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&*uri)
                    {
                        continue;
                    }
                    let param = ResourceUpdatedNotificationParam::new(uri.to_string());
                    if peer.notify_resource_updated(param).await.is_err() {
                        break;
                    }
                }
            });
        }
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // rmcp narrows this to what was requested and what the capabilities declare.
        let mut accepted = SubscriptionFilter::builder()
            .tools_list_changed()
            .prompts_list_changed()
            .resources_list_changed()
            .build();
        let streams = Streams::of(&*self.shared.provider);
        if let (Some(_), Some(uris)) = (&streams.updates, &requested.resource_subscriptions) {
            // As many as a session may subscribe to, the first ones: the acknowledgment
            // tells the client which.
            let mut kept = HashSet::new();
            let first = uris
                .iter()
                .filter(|uri| kept.len() < SUBSCRIPTIONS_MAX && kept.insert(uri.as_str()));
            accepted.resource_subscriptions = Some(first.cloned().collect());
        }
        let mut prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        if prepared.len() >= PREPARED_MAX {
            prepared.remove(0);
        }
        prepared.push((requested.clone(), streams));
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let accepted = context.accepted().clone();
        // Resources are subscribed to through the key holder's view, as `subscribe` does:
        // what the view refuses is not subscribed to, nor announced.
        let holder = self.holder(context.request_context());
        let subscriber = self.shared.subscriber(holder.clone());
        let streams = {
            let mut prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
            let at = prepared.iter().position(|(filter, _)| filter == context.requested());
            at.map(|at| prepared.remove(at).1)
        };
        let streams = streams.unwrap_or_else(|| Streams::of(&*self.shared.provider));
        let streams = self.shared.streams_for(streams, holder.clone());
        let wants = |flag: Option<bool>| flag == Some(true);
        // A burst of changes is announced once (`settle`); the settled streams keep what
        // came while another branch of the loop below ran.
        let settled = |changes: Option<ToolListChanges>, flag: Option<bool>| {
            changes.filter(|_| wants(flag)).map(SettledChanges::new)
        };
        let mut changes = settled(streams.tools, accepted.tools_list_changed);
        let mut prompt_changes = settled(streams.prompts, accepted.prompts_list_changed);
        let mut resource_changes = settled(streams.resources, accepted.resources_list_changed);
        let uris: HashSet<String> =
            accepted.resource_subscriptions.unwrap_or_default().into_iter().collect();
        let mut updates = streams.updates.filter(|_| !uris.is_empty());
        // rmcp may drop this future mid-way (its client gone): the guard lets go of what it
        // holds then too.
        let mut subscribed =
            HeldSubscriptions { shared: self.shared.clone(), uris: HashSet::new() };
        if updates.is_some() {
            for uri in uris {
                self.shared.hold_subscription(&uri);
                subscribed.uris.insert(uri.clone());
                if let Err(error) = subscriber.provider.subscribe_resource(&uri).await {
                    tracing::debug!(%uri, error = %error.report(), "not subscribed");
                    subscribed.uris.remove(&uri);
                    let through = self.shared.release_subscription(&uri);
                    let _ = unsubscribe_through(through, &uri).await;
                    continue;
                }
                // Held by this request until it ends: it is recorded.
                let _ = self.shared.subscribed_through(&uri, &subscriber);
            }
        }
        // A key holder with a view is told only of changes to its own lists.
        let view = self.shared.view_of(holder.as_deref());
        let mut shown = match view {
            Some(view) => Shown::all(&view).await,
            None => Vec::new(),
        };
        loop {
            tokio::select! {
                () = context.cancelled() => break,
                // The stream ended: rmcp would end this only after its drain.
                () = self.closed.cancelled() => break,
                changed = async { changes.as_mut()?.next().await.then_some(()) },
                    if changes.is_some() => {
                    // The provider is gone: end the subscription gracefully.
                    if changed.is_none() {
                        break;
                    }
                    self.shared.forget_listing();
                    if to_tell(&mut shown, List::Tools).await
                        && context.sink().notify_tool_list_changed().await.is_err()
                    {
                        break;
                    }
                }
                changed = async { prompt_changes.as_mut()?.next().await.then_some(()) },
                    if prompt_changes.is_some() => {
                    if changed.is_none() {
                        break;
                    }
                    if to_tell(&mut shown, List::Prompts).await
                        && context.sink().notify_prompt_list_changed().await.is_err()
                    {
                        break;
                    }
                }
                changed = async { resource_changes.as_mut()?.next().await.then_some(()) },
                    if resource_changes.is_some() => {
                    if changed.is_none() {
                        break;
                    }
                    if to_tell(&mut shown, List::Resources).await
                        && context.sink().notify_resource_list_changed().await.is_err()
                    {
                        break;
                    }
                }
                uri = async { updates.as_mut()?.next().await }, if updates.is_some() => {
                    let Some(uri) = uri else { break };
                    if subscribed.uris.contains(&*uri)
                        && context.sink().notify_resource_updated(uri.to_string()).await.is_err()
                    {
                        break;
                    }
                }
            }
        }
        subscribed.release().await;
        Ok(())
    }
}

/// The resources a `subscriptions/listen` request holds a subscription to (counted in
/// [`Shared::hold_subscription`]), let go of when it ends, or when it is dropped.
struct HeldSubscriptions {
    shared: Arc<Shared>,
    uris: HashSet<String>,
}

impl HeldSubscriptions {
    /// Lets go of every resource, unsubscribing from those no one else holds.
    async fn release(mut self) {
        let uris = std::mem::take(&mut self.uris);
        for (uri, through) in self.shared.release_subscriptions(uris) {
            let _ = unsubscribe_through(through, &uri).await;
        }
    }
}

impl Drop for HeldSubscriptions {
    fn drop(&mut self) {
        // Without a runtime (it is shutting down) the provider's own end unsubscribes.
        self.shared.release_subscriptions_later(std::mem::take(&mut self.uris));
    }
}

/// What is wrong with `params` of a request of `method`, when that is one of MCP's
/// requests (`None` for any other method): the reading error of the params' type, or a
/// plain word when that type reads them (rmcp's reading is stricter somewhere).
fn params_misfit(method: &str, params: Option<&Value>) -> Option<String> {
    fn read<P: serde::de::DeserializeOwned>(params: Option<&Value>) -> Option<String> {
        let Some(params) = params else { return Some("`params` is missing".to_owned()) };
        let error = P::deserialize(params).err()?;
        // serde names no member: the one whose absence reads (or is all that is missing)
        // is the one that does not fit.
        let members = params.as_object().map(|m| m.keys()).into_iter().flatten();
        let culprit = members.into_iter().find(|key| {
            let mut without = params.clone();
            if let Some(object) = without.as_object_mut() {
                object.remove(*key);
            }
            match P::deserialize(&without) {
                Ok(_) => true,
                Err(e) => e.to_string().starts_with(&format!("missing field `{key}`")),
            }
        });
        Some(match culprit {
            Some(key) => format!("`params.{key}`: {error}"),
            None => error.to_string(),
        })
    }
    #[expect(
        deprecated,
        reason = "clients of the handshake revisions still send logging/setLevel"
    )]
    use rmcp::model::SetLevelRequestParams;
    use rmcp::model::{InitializeRequestParams, SubscriptionsListenRequestParams};
    let why = match method {
        "initialize" => read::<InitializeRequestParams>(params),
        "tools/call" => read::<CallToolRequestParams>(params),
        "prompts/get" => read::<GetPromptRequestParams>(params),
        "resources/read" => read::<ReadResourceRequestParams>(params),
        "resources/subscribe" => read::<SubscribeRequestParams>(params),
        "resources/unsubscribe" => read::<UnsubscribeRequestParams>(params),
        "completion/complete" => read::<CompleteRequestParams>(params),
        #[expect(deprecated, reason = "clients of the handshake revisions still send it")]
        "logging/setLevel" => read::<SetLevelRequestParams>(params),
        "subscriptions/listen" => read::<SubscriptionsListenRequestParams>(params),
        "tasks/get" => read::<GetTaskParams>(params),
        "tasks/update" => read::<UpdateTaskParams>(params),
        "tasks/cancel" => read::<CancelTaskParams>(params),
        "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => params
            .and_then(|p| {
                <PaginatedRequestParams as serde::Deserialize>::deserialize(p)
                    .err()
                    .map(|e| e.to_string())
            }),
        "ping" | "server/discover" => None,
        _ => return None,
    };
    Some(why.unwrap_or_else(|| "they do not have the form MCP gives them".to_owned()))
}

/// The headers of a client's HTTP request that may be passed on to servers, names in
/// lowercase: not the credential it authenticated with (with `authenticated`: a bearer
/// `Authorization`, which is what a key or token is read from first, and `X-API-Key`),
/// nor the trace headers, which go on their own way.
fn caller_headers(headers: &axum::http::HeaderMap, authenticated: bool) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, value)| {
            let name = name.as_str();
            let credential = authenticated
                && (name == "x-api-key"
                    || (name == "authorization"
                        && value.to_str().is_ok_and(|v| {
                            v.trim_start()
                                .get(..7)
                                .is_some_and(|s| s.eq_ignore_ascii_case("bearer "))
                        })));
            !credential
                && name != TRACEPARENT_META_KEY
                && name != TRACESTATE_META_KEY
                && toolmux_core::passable_header(name)
        })
        .filter_map(|(name, value)| {
            Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
        })
        .collect()
}

/// The cursor of the `tools/list` page after the one ending at `end` with the tool `last`:
/// the offset and the last tool's name, so that the next page starts after that tool even
/// when tools were added or removed before it meanwhile (the offset serves when the tool
/// itself is gone).
fn next_cursor(end: usize, last: &str) -> String {
    format!("{end}.{last}")
}

/// Where the page a cursor of [`next_cursor`] names starts in `tools`; `None` for a cursor
/// that is not one.
fn page_start(cursor: &str, tools: &[Tool]) -> Option<usize> {
    let (end, last) = cursor.split_once('.').unwrap_or((cursor, ""));
    let end: usize = end.parse().ok()?;
    let after = tools.iter().position(|t| !last.is_empty() && t.name == last);
    Some(after.map_or(end.min(tools.len()), |at| at + 1))
}

#[cfg(test)]
mod tests {
    /// A call's id is the request id as `Display` writes it.
    #[test]
    fn call_ids_are_request_ids_as_text() {
        use rmcp::model::NumberOrString;
        let ids = [
            NumberOrString::Number(0),
            NumberOrString::Number(-42),
            NumberOrString::Number(i64::MAX),
            NumberOrString::Number(i64::MIN),
            NumberOrString::String("req-1".into()),
            NumberOrString::String("".into()),
        ];
        for id in ids {
            assert_eq!(&*super::id_text(&id), id.to_string());
        }
    }
}
