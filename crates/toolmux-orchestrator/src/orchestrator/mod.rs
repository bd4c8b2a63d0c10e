//! The orchestrator: providers in, one call pipeline out; prompts and resources of every
//! provider routed through it too (`prompts`, `resources`).

mod cap;
mod completion;
mod prompts;
mod reach;
mod relay;
mod resources;

use crate::accounting::{AuditLog, AuditRecord, CallRecord, CallStatus, Stats, sha256_hex};
use crate::budget::{RunFlags, RunState, Runs, estimate_tokens, now_secs};
use crate::cache::{MemoryCache, ResponseCache, Served, SingleFlight, WaitLimit, cache_key};
use crate::catalog::{PromptCatalog, ResourceCatalog};
use crate::config::{OrchestratorConfig, OversizeMode, RetryPolicy, ToolSettings};
use crate::events::ToolEvent;
use crate::hooks::{AfterHook, BeforeHook, CallDisplay, CallEnd, DisplayedCall, Scoped};
use crate::permission::Permission;
use crate::queue::{LocalQueues, Queue, QueueBackend, QueueSlot};
use crate::ratelimit::{LocalRateLimits, RateLimitBackend, describe};
use crate::redact::Redactor;
use crate::registry::{ProviderTools, Registry, RegistryProblem, Severity, ToolEntry};
use crate::sampling::SamplingFallback;
use crate::store::{DirectoryStore, OutputPage, OutputStore, StoreError};
use futures::{FutureExt as _, StreamExt as _};
use serde_json::{Value, json};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, Completion, CompletionRequest, ContentPart,
    Health, InteractionHandler, JsonObject, LogMessage, LogSink, Op, ProgressSink, Prompt,
    PromptSpec, ProviderHealth, Relayed, ResourceContents, ResourceSpec, ResourceTemplate,
    ResourceUpdateNotifier, ResourceUpdates, ToolCall, ToolError, ToolKind, ToolListChanges,
    ToolListNotifier, ToolOutput, ToolProvider, ToolResult, ToolSpec, naming, panic_message,
};
use tracing::Instrument as _;

/// Why an orchestrator could not be built, or a provider could not join one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OrchestratorError {
    /// A provider's namespace is invalid.
    #[error("provider namespace: {0}")]
    Namespace(#[from] naming::NamingError),
    /// Two providers share a namespace.
    #[error(
        "two providers use the namespace `{namespace}` ({first} and {second}); give one of them another name"
    )]
    DuplicateNamespace {
        /// The namespace.
        namespace: String,
        /// The first provider's kind.
        first: ToolKind,
        /// The second provider's kind.
        second: ToolKind,
    },
    /// A permission rule is neither a glob nor a known selector.
    #[error("{0}")]
    Permission(String),
    /// A queue has no slots.
    #[error("queue `{queue}` has `concurrent: 0`; it needs at least 1 slot")]
    EmptyQueue {
        /// The queue.
        queue: String,
    },
    /// A setting names a queue that is not configured.
    #[error("{owner} uses queue `{queue}`, which is not defined under `queues`{}", suggest_queue(.known))]
    UnknownQueue {
        /// The provider or tool.
        owner: String,
        /// The queue.
        queue: String,
        /// Defined queues.
        known: Vec<String>,
    },
    /// The audit log could not be opened.
    #[error(transparent)]
    Audit(#[from] crate::accounting::AuditError),
    /// A provider was registered after the orchestrator was cleaned up.
    #[error(
        "the orchestrator was cleaned up; provider `{namespace}` cannot join it (build another)"
    )]
    Closed {
        /// The provider's namespace.
        namespace: String,
    },
}

fn suggest_queue(known: &[String]) -> String {
    if known.is_empty() { String::new() } else { format!(" (defined: {})", known.join(", ")) }
}

/// How one provider's warmup went.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderReport {
    /// The namespace.
    pub namespace: String,
    /// The kind.
    pub kind: ToolKind,
    /// Tools registered after warmup.
    pub tools: usize,
    /// Time the warmup took.
    pub elapsed_ms: u64,
    /// The failure, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Still starting when [`Orchestrator::warmup_within`] stopped waiting: it joins the
    /// listings when it is up (`error` says so).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub starting: bool,
}

/// What [`Orchestrator::warmup`] found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct WarmupReport {
    /// One entry per provider, in registration order.
    pub providers: Vec<ProviderReport>,
    /// Registry problems (left-out tools, collisions).
    pub problems: Vec<RegistryProblem>,
}

impl WarmupReport {
    /// Whether every provider started and no collision was found.
    pub fn is_ok(&self) -> bool {
        self.providers.iter().all(|p| p.error.is_none())
            && self.problems.iter().all(|p| p.severity != Severity::Error)
    }
}

/// Builds an [`Orchestrator`].
#[derive(Debug)]
pub struct OrchestratorBuilder {
    config: OrchestratorConfig,
    providers: Vec<Arc<dyn ToolProvider>>,
    queue_backend: Arc<dyn QueueBackend>,
    rate_limit_backend: Arc<dyn RateLimitBackend>,
    cache: Arc<dyn ResponseCache>,
    store: Option<Arc<dyn OutputStore>>,
    before: Vec<Scoped<dyn BeforeHook>>,
    after: Vec<Scoped<dyn AfterHook>>,
    display: Option<Arc<dyn CallDisplay>>,
    secrets: Vec<String>,
    namespace: String,
    sampler: Option<Arc<dyn InteractionHandler>>,
}

impl OrchestratorBuilder {
    /// Adds a provider; its tools are listed at warmup.
    pub fn provider(mut self, provider: Arc<dyn ToolProvider>) -> Self {
        self.providers.push(provider);
        self
    }

    /// Replaces the in-process queues.
    pub fn queue_backend(mut self, backend: Arc<dyn QueueBackend>) -> Self {
        self.queue_backend = backend;
        self
    }

    /// Replaces the in-process rate limits (a shared store keeps one limit for all
    /// replicas).
    pub fn rate_limit_backend(mut self, backend: Arc<dyn RateLimitBackend>) -> Self {
        self.rate_limit_backend = backend;
        self
    }

    /// Replaces the in-process response cache.
    pub fn cache(mut self, cache: Arc<dyn ResponseCache>) -> Self {
        self.cache = cache;
        self
    }

    /// Sets the output store (default: a directory under the system temporary directory).
    pub fn output_store(mut self, store: Arc<dyn OutputStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Adds a before-hook for tools matching `pattern` (a glob on full names).
    pub fn before_hook(mut self, pattern: &str, hook: Arc<dyn BeforeHook>) -> Self {
        self.before.push(Scoped { pattern: pattern.to_owned(), hook });
        self
    }

    /// Adds an after-hook for tools matching `pattern`.
    pub fn after_hook(mut self, pattern: &str, hook: Arc<dyn AfterHook>) -> Self {
        self.after.push(Scoped { pattern: pattern.to_owned(), hook });
        self
    }

    /// Shows people the calls of the tools whose settings ask for it
    /// ([`ToolSettings::show_in_space`]) as they run.
    pub fn display(mut self, display: Arc<dyn CallDisplay>) -> Self {
        self.display = Some(display);
        self
    }

    /// Values that must never leave the pipeline (expanded `${ENV}` secrets): they are
    /// replaced by `[redacted]` in outputs, errors, logs and stored outputs.
    pub fn secrets(mut self, secrets: impl IntoIterator<Item = String>) -> Self {
        self.secrets.extend(secrets);
        self
    }

    /// Answers the sampling requests of tools whose caller cannot sample (no handler, or
    /// one without a model to offer): a configured model, typically.
    pub fn sampler(mut self, sampler: Arc<dyn InteractionHandler>) -> Self {
        self.sampler = Some(sampler);
        self
    }

    /// The namespace the orchestrator reports as a provider itself (default `toolmux`).
    pub fn namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.namespace);
        self
    }

    /// Checks the configuration and builds.
    pub fn build(self) -> Result<Orchestrator, OrchestratorError> {
        let mut seen: HashMap<&str, ToolKind> = HashMap::new();
        for p in &self.providers {
            naming::validate_namespace(p.namespace())?;
            if let Some(first) = seen.insert(p.namespace(), p.kind()) {
                return Err(OrchestratorError::DuplicateNamespace {
                    namespace: p.namespace().to_owned(),
                    first,
                    second: p.kind(),
                });
            }
        }
        self.config.permissions.check().map_err(OrchestratorError::Permission)?;
        let mut queues = HashMap::new();
        for (name, queue) in &self.config.queues {
            if queue.concurrent == 0 {
                return Err(OrchestratorError::EmptyQueue { queue: name.clone() });
            }
            queues.insert(name.clone(), self.queue_backend.queue(name, queue));
        }
        let mut known: Vec<String> = self.config.queues.keys().cloned().collect();
        known.sort();
        let owners = self.config.providers.iter().map(|(n, s)| (format!("provider `{n}`"), s));
        let tools = self.config.tools.iter().map(|(n, s)| (format!("tool `{n}`"), s));
        for (owner, settings) in owners.chain(tools) {
            if let Some(q) = settings.queue.as_ref().filter(|q| !queues.contains_key(*q)) {
                return Err(OrchestratorError::UnknownQueue { owner, queue: q.clone(), known });
            }
        }
        // One limiter per configured limit: a provider's is shared by all of its tools.
        let backend = &self.rate_limit_backend;
        let limiter = |key: String, s: &ToolSettings| {
            s.rate_limit.map(|limit| RateLimit { limiter: backend.limiter(&key, limit), limit })
        };
        let rate_limits = RateLimits {
            tools: self
                .config
                .tools
                .iter()
                .filter_map(|(n, s)| Some((n.clone(), limiter(format!("tool:{n}"), s)?)))
                .collect(),
            providers: self
                .config
                .providers
                .iter()
                .filter_map(|(n, s)| Some((n.clone(), limiter(format!("provider:{n}"), s)?)))
                .collect(),
        };
        let audit = match &self.config.audit_log {
            Some(path) => Some(AuditLog::open(path)?),
            None => None,
        };
        let store = self.store.unwrap_or_else(|| {
            Arc::new(DirectoryStore::new(std::env::temp_dir().join("toolmux-outputs")))
        });
        let (events, _) = broadcast::channel(1024);
        let providers = self
            .providers
            .into_iter()
            .map(|provider| ProviderTools { provider, tools: Vec::new(), listed: 0 })
            .collect();
        Ok(Orchestrator {
            inner: Arc::new(Inner {
                config: self.config,
                namespace: self.namespace,
                in_flight: std::sync::atomic::AtomicUsize::new(0),
                provider_slots: Default::default(),
                sampler: self.sampler,
                providers: RwLock::new(providers),
                registry: RwLock::new(Arc::new(Registry::default())),
                queues,
                rate_limits,
                cache: self.cache,
                flight: SingleFlight::default(),
                store,
                stats: Stats::default(),
                audit,
                events,
                before: self.before,
                after: self.after,
                display: self.display,
                redactor: Arc::new(Redactor::new(self.secrets)),
                runs: Mutex::new(Runs::default()),
                budget_set: AtomicBool::new(false),
                generation: Mutex::new(Arc::new(CancellationToken::new())),
                notifier: ToolListNotifier::new(),
                watchers: Mutex::new(Vec::new()),
                watching: AtomicBool::new(false),
                closing: AtomicBool::new(false),
                refresh_lock: tokio::sync::Mutex::new(()),
                rebuilding: Mutex::new(()),
                listings: AtomicU64::new(0),
                prompts: RwLock::new(Arc::new(PromptCatalog::default())),
                resources: RwLock::new(Arc::new(ResourceCatalog::default())),
                learned_routes: Mutex::new(HashMap::new()),
                not_started: Mutex::new(HashSet::new()),
                updates: ResourceUpdateNotifier::new(),
                prompts_changed: ToolListNotifier::new(),
                resources_changed: ToolListNotifier::new(),
                forwarders: Mutex::new(Forwarders::default()),
            }),
        })
    }
}

/// Routes every call through one pipeline; see the crate documentation for the stages.
///
/// Cheap to clone: clones share everything.
#[derive(Debug, Clone)]
pub struct Orchestrator {
    inner: Arc<Inner>,
}

/// A handle to an [`Orchestrator`] that does not keep it alive: what a provider registered
/// in the orchestrator holds when it calls back into it (an agent calling tools), so that
/// the two do not keep each other alive.
#[derive(Debug, Clone, Default)]
pub struct WeakOrchestrator(Weak<Inner>);

impl WeakOrchestrator {
    /// The orchestrator, while it lives.
    pub fn upgrade(&self) -> Option<Orchestrator> {
        self.0.upgrade().map(|inner| Orchestrator { inner })
    }
}

/// `error` naming the tool by its full name where the provider named it by its own: a
/// provider's own timeout or cancellation (an MCP server's wait, restarted by progress)
/// says which tool as the caller knows it.
fn by_full_name(entry: &ToolEntry, error: ToolError) -> ToolError {
    match error {
        ToolError::Timeout { tool, after, idle } if *tool == *entry.original => {
            ToolError::Timeout { tool: entry.name.to_string(), after, idle }
        }
        ToolError::Cancelled { tool } if *tool == *entry.original => {
            ToolError::Cancelled { tool: entry.name.to_string() }
        }
        other => other,
    }
}

/// `arguments` with the names the tool's provider accepts besides its schema's renamed to
/// the schema's ([`ToolProvider::normalize_arguments`]).
fn normalize(entry: &ToolEntry, arguments: &mut Value) -> Result<(), ToolError> {
    entry
        .provider
        .normalize_arguments(&entry.original, arguments)
        .map_err(|message| ToolError::invalid_arguments(entry.name.to_string(), message))
}

/// Where a tool's timeout is set, for the errors that name it.
const TIMEOUT_SETTING: &str =
    "`tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`";

/// A call whose timeout passed while it waited for `slot` (`a slot of queue \`q\``), after
/// waiting `turn` for its turn under a rate limit: the waits count against the timeout, so
/// it never ran.
fn timeout_spent_waiting(entry: &ToolEntry, turn: Duration, slot: &str) -> ToolError {
    let timeout = entry.settings.first_wait;
    let turn = match turn.is_zero() {
        true => String::new(),
        false => format!("its turn under its rate limit ({}) and then ", human(turn)),
    };
    ToolError::DeadlineExceeded {
        tool: entry.name.to_string(),
        after: timeout,
        limit: format!(
            "it waited all of its timeout ({}, {TIMEOUT_SETTING}) for {turn}{slot} and did \
             not run, as the wait counts against the timeout; call again later, or raise the \
             timeout or the bound",
            human(timeout)
        ),
    }
}

/// How long a call waited before it ran and for what, in words (`3s waiting for a slot`),
/// `queued` in all, `turn` of it for its turn under a rate limit.
fn waited_for(queued: Duration, turn: Duration) -> String {
    let slot = queued.saturating_sub(turn);
    match (turn.is_zero(), slot.is_zero()) {
        (true, _) => format!("{} waiting for a slot", human(queued)),
        (false, true) => format!("{} waiting for its turn under its rate limit", human(turn)),
        (false, false) => format!(
            "{} waiting for its turn under its rate limit and {} for a slot",
            human(turn),
            human(slot)
        ),
    }
}

/// A call whose caller's deadline passed while it waited `waited` for `slot`.
fn caller_deadline_passed(entry: &ToolEntry, waited: Duration, slot: &str) -> ToolError {
    ToolError::DeadlineExceeded {
        tool: entry.name.to_string(),
        after: waited,
        limit: format!(
            "its caller's deadline passed while it waited for {slot}, so it did not run"
        ),
    }
}

/// Structured content that does not match the tool's output schema is left out and the
/// result made an error naming the mismatch: MCP has a server's structured content conform
/// to its tool's output schema and clients check it (the official Python SDK refuses the
/// whole result), so it would not reach them as it is. A tool's error result need not
/// conform. Content over the size cap is gone by now, so the check is of at most that much.
fn check_structured(entry: &ToolEntry, output: &mut ToolOutput) {
    let (Some(validator), Some(structured)) = (&entry.output_validator, &output.structured) else {
        return;
    };
    if output.is_error {
        return;
    }
    let Some(violations) = validator.violations(&entry.name, structured, 3) else { return };
    let listed: Vec<String> = violations
        .iter()
        .map(|v| {
            // A violation echoes the value: a long one is cut.
            let text = v.to_string();
            match text.len() > 300 {
                true => format!("{}…", &text[..floor_char_boundary(&text, 300)]),
                false => text,
            }
        })
        .collect();
    let text = format!(
        "`{}` returned structured content that does not match its output schema ({}), which \
         MCP requires of a tool that declares one; it was left out, and `{}` should be fixed",
        entry.name,
        listed.join("; "),
        entry.name
    );
    tracing::warn!(tool = %entry.name, "{text}");
    output.structured = None;
    output.content.push(ContentPart::Text { text });
    output.is_error = true;
    output.extras.insert("invalid_structured".into(), json!({"violations": violations.len()}));
}

/// The most bytes a pending call's handle may take: `{"status": "pending", "callId": …}`
/// takes about 150, and nothing larger passes the context budget as one.
const PENDING_HANDLE_MAX_BYTES: usize = 1024;

/// Whether `output` is the handle of an external call made and pending (`{"status":
/// "pending", "callId": …}`), which the caller needs to collect the call's result: an
/// External tool's output that toolmux-external marked as its handle (the `pendingHandle`
/// extra, which no submitted result can set) and that is small. A synchronous call's result
/// shaped like a handle is just a result, under the budget like any other.
fn is_pending_handle(entry: &ToolEntry, output: &ToolOutput) -> bool {
    entry.provider.kind() == ToolKind::External
        && !output.is_error
        && output.extras.get("pendingHandle") == Some(&Value::Bool(true))
        && output.byte_len() <= PENDING_HANDLE_MAX_BYTES
        && output
            .structured
            .as_ref()
            .is_none_or(|s| toolmux_core::json_len(s) <= PENDING_HANDLE_MAX_BYTES)
        && output.content.iter().any(|part| match part {
            ContentPart::Json { value } => {
                value["status"] == "pending" && value["callId"].is_string()
            }
            _ => false,
        })
}

/// What a call waits for under `maxCallsInFlight`, in words.
fn calls_in_flight(max: usize, namespace: &str) -> String {
    match max {
        1 => format!("the one call `{namespace}` may have in flight"),
        _ => format!("one of the {max} calls `{namespace}` may have in flight"),
    }
}

/// A duration as the errors write it: `250ms`, `4s`, `1.5s`.
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// What bounds one provider call besides its settings: the run's tool time and the time
/// the call waited for its slots, which its timeout counts.
#[derive(Debug, Clone, Copy)]
struct CallLimits {
    /// When the run's `maxToolTimeMs` is spent, if it has one.
    run_deadline: Option<Instant>,
    /// How long the call waited before it ran: for its turn under a rate limit, then for
    /// its queue and in-flight slots.
    queued: Duration,
    /// The part of `queued` the call waited for its turn under a rate limit.
    turn: Duration,
    /// Set for a retry: the call has one deadline, which its attempts and the backoff
    /// between them share.
    retry: Option<Retry>,
}

/// A retry of a call, for the limits of its attempt ([`CallLimits::retry`]).
#[derive(Debug, Clone, Copy)]
struct Retry {
    /// The attempt's number (2 for the first retry).
    attempt: u32,
    /// How long the earlier attempts and the backoff after them took.
    earlier: Duration,
}

/// A call whose deadline passed, for [`Orchestrator::limit_reached`].
#[derive(Debug, Clone, Copy)]
struct TimedOut {
    start: Instant,
    queued: Duration,
    turn: Duration,
    deadline: Instant,
    run_deadline: Option<Instant>,
    retry: Option<Retry>,
}

/// The longest a call of `settings` may take from when it began to wait for its slots,
/// all its attempts included, and the settings that give it: its timeout, or, when progress
/// restarts the timeout, the hard cap on the whole call.
fn call_limit(settings: &crate::registry::ResolvedSettings) -> (Duration, &'static str) {
    let timeout = settings.timeout;
    match (settings.reset_on_progress, settings.max_total_time) {
        (true, Some(max)) => (max, "`maxTotalTimeMs`"),
        (true, None) => {
            (timeout.saturating_mul(10), "ten times its timeout, as progress restarts it")
        }
        // Without progress resets the timeout is the whole call's limit; a shorter
        // `maxTotalTimeMs` still holds.
        (false, Some(max)) if max < timeout => (max, "`maxTotalTimeMs`"),
        (false, _) => (timeout, TIMEOUT_SETTING),
    }
}

/// Counts a call in the pipeline until dropped (a call future dropped halfway included).
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicUsize) -> InFlight<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The rate limiters, by full tool name and by provider namespace.
#[derive(Debug, Default)]
struct RateLimits {
    tools: HashMap<String, RateLimit>,
    providers: HashMap<String, RateLimit>,
}

/// One configured limit and where its state lives.
#[derive(Debug)]
struct RateLimit {
    limiter: Arc<dyn crate::ratelimit::Limiter>,
    limit: crate::config::RateLimit,
}

#[derive(Debug)]
struct Inner {
    config: OrchestratorConfig,
    namespace: String,
    /// Calls in the pipeline now.
    in_flight: std::sync::atomic::AtomicUsize,
    /// Each provider's bound on its calls in flight.
    provider_slots: crate::inflight::InFlightLimits,
    /// Answers tools' sampling requests that their caller cannot.
    sampler: Option<Arc<dyn InteractionHandler>>,
    providers: RwLock<Vec<ProviderTools>>,
    registry: RwLock<Arc<Registry>>,
    queues: HashMap<String, Arc<dyn Queue>>,
    rate_limits: RateLimits,
    cache: Arc<dyn ResponseCache>,
    flight: SingleFlight,
    store: Arc<dyn OutputStore>,
    stats: Stats,
    audit: Option<AuditLog>,
    events: broadcast::Sender<ToolEvent>,
    before: Vec<Scoped<dyn BeforeHook>>,
    after: Vec<Scoped<dyn AfterHook>>,
    /// Shows the calls of the tools configured so ([`ToolSettings::show_in_space`]).
    display: Option<Arc<dyn CallDisplay>>,
    /// Shared with the progress and log sinks a call's provider is given.
    redactor: Arc<Redactor>,
    runs: Mutex<Runs>,
    /// A run's context budget was set ([`Orchestrator::set_context_budget`]): runs are
    /// tracked from then on even when the configuration sets no budget.
    budget_set: AtomicBool,
    // Invariant: replaced (after being cancelled) by `cancel()`; each call watches the token
    // current when it started.
    generation: Mutex<Arc<CancellationToken>>,
    notifier: ToolListNotifier,
    watchers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Whether the watchers started (with the warmup): a provider registered later gets
    /// its own then.
    watching: AtomicBool,
    /// Set when a cleanup begins: no provider joins after.
    closing: AtomicBool,
    refresh_lock: tokio::sync::Mutex<()>,
    /// Held from reading the providers' tools to storing the registry built from them, so
    /// that a rebuild from an older snapshot never lands after one from a newer.
    rebuilding: Mutex<()>,
    /// Listings of tools started, to order them ([`ProviderTools::store`]).
    listings: AtomicU64,
    prompts: RwLock<Arc<PromptCatalog>>,
    resources: RwLock<Arc<ResourceCatalog>>,
    /// URIs nobody lists that a provider (its index) answered when asked in turn.
    learned_routes: Mutex<HashMap<String, usize>>,
    /// Providers that failed to start (or are still starting) and are tried again in the
    /// background: `/health` says so, whatever the provider says of itself.
    not_started: Mutex<HashSet<String>>,
    /// Every provider's resource updates, merged by the forwarders.
    updates: ResourceUpdateNotifier,
    /// Every provider's prompt-list changes, merged by the forwarders.
    prompts_changed: ToolListNotifier,
    /// Every provider's resource-list changes, merged by the forwarders.
    resources_changed: ToolListNotifier,
    forwarders: Mutex<Forwarders>,
}

/// The tasks copying each provider's resource updates into [`Inner::updates`].
#[derive(Debug, Default)]
struct Forwarders {
    started: bool,
    // Invariant: once set (by `cleanup()`), no forwarder starts again.
    closed: bool,
    /// Indices of the providers that offer updates.
    sources: Vec<usize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What a call ended with, for the record.
#[derive(Debug, Clone, Copy)]
enum Outcome<'a> {
    Output(&'a ToolOutput),
    /// A relayed result as the server wrote it.
    Raw {
        json: &'a str,
        is_error: bool,
    },
}

/// What the pipeline learned about a call besides its result, for the record.
#[derive(Debug, Default)]
struct CallMeta {
    /// How long the call waited for its queue and in-flight slots.
    queued_ms: AtomicU64,
    /// How long the call waited for its turn under a rate limit, before its slots.
    turn_ms: AtomicU64,
    attempts: AtomicU32,
    served: Mutex<Option<Served>>,
    spilled: AtomicBool,
}

impl CallMeta {
    /// How long the call waited before it ran, and the part of that it waited for its turn
    /// under a rate limit: its timeout counts them all.
    fn waits(&self) -> (Duration, Duration) {
        let turn = Duration::from_millis(self.turn_ms.load(Ordering::Relaxed));
        (turn + Duration::from_millis(self.queued_ms.load(Ordering::Relaxed)), turn)
    }
}

/// The limits of one provider call outside the tool pipeline.
struct Bound {
    token: CancellationToken,
    start: Instant,
    deadline: Instant,
    generation: Arc<CancellationToken>,
}

impl Bound {
    /// The context the provider gets: the caller's log sink, handler, run and operation,
    /// the bound's deadline and a cancellation token of its own.
    fn context(&self, ctx: &CallContext) -> CallContext {
        ctx.clone().with_cancel(self.token.clone()).with_deadline(self.deadline)
    }
}

/// A call not yet accounted for ([`Orchestrator::account`]): dropped so, it is accounted
/// for as cancelled. A caller may drop a call's future halfway (a timeout of its own around
/// it, a session that closed); its `tool_started` still gets its `tool_finished`, and the
/// statistics and the audit log still count it.
struct Unrecorded<'a> {
    orchestrator: &'a Orchestrator,
    tool: &'a Arc<str>,
    entry: Option<&'a ToolEntry>,
    ctx: &'a CallContext,
    op: &'a Arc<Op>,
    meta: &'a CallMeta,
    started: Instant,
    chars_in: u64,
    audit_args: Option<String>,
    recorded: bool,
}

impl Unrecorded<'_> {
    /// Accounts for the call's `result`; returns the call's time.
    fn finish(mut self, result: Result<Outcome<'_>, &ToolError>) -> Duration {
        self.recorded = true;
        self.record(result)
    }

    fn record(&mut self, result: Result<Outcome<'_>, &ToolError>) -> Duration {
        self.orchestrator.account(
            self.tool,
            self.entry,
            self.ctx,
            self.op,
            self.meta,
            result,
            self.started,
            self.chars_in,
            self.audit_args.take(),
        )
    }
}

impl Drop for Unrecorded<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            let cancelled = ToolError::Cancelled { tool: self.tool.to_string() };
            self.record(Err(&cancelled));
        }
    }
}

/// A call counted against its run's `maxCalls` before it reaches its provider: given back
/// when dropped still set (the call was refused, cancelled or dropped on its way there),
/// since the run's calls are those that reached a provider ([`RunFlags::calls`]).
struct ReservedCall<'a>(Option<&'a AtomicU64>);

impl Drop for ReservedCall<'_> {
    fn drop(&mut self) {
        if let Some(calls) = self.0 {
            calls.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A call's rate-limit turn, given back to its limiter when dropped still set: the call
/// stopped before it reached its provider (cancelled, past its deadline, dropped, or
/// refused by its queue), whether it stopped while waiting for the turn or, after it, for
/// a queue slot ([`Orchestrator::take_turn`], [`Orchestrator::downstream`]).
#[must_use = "dropped, the turn is given back at once"]
struct UnusedTurn<'a>(Option<(&'a dyn crate::ratelimit::Limiter, crate::ratelimit::Turn)>);

impl UnusedTurn<'_> {
    /// The call reached its provider: the turn is its own, not to be given back.
    fn used(mut self) {
        self.0 = None;
    }
}

impl Drop for UnusedTurn<'_> {
    fn drop(&mut self) {
        if let Some((limiter, turn)) = self.0.take() {
            limiter.release(turn);
        }
    }
}

/// A call's time in its provider, charged to its run when dropped (the call ended, or its
/// future was dropped halfway).
struct ToolTime<'a>(Option<(&'a RunState, Instant)>);

impl Drop for ToolTime<'_> {
    fn drop(&mut self) {
        if let Some((run, started)) = self.0 {
            run.tool_time_ms.fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }
}

/// A held queue slot, recorded on the operation so that descendants can see it.
struct HeldSlot {
    _slot: QueueSlot,
    op: Arc<Op>,
    queue: Arc<str>,
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.op.release_queue(&self.queue);
    }
}

impl Orchestrator {
    /// A builder with `config`.
    pub fn builder(config: OrchestratorConfig) -> OrchestratorBuilder {
        OrchestratorBuilder {
            config,
            providers: Vec::new(),
            queue_backend: Arc::new(LocalQueues),
            rate_limit_backend: Arc::new(LocalRateLimits),
            cache: Arc::new(MemoryCache::default()),
            store: None,
            before: Vec::new(),
            after: Vec::new(),
            display: None,
            secrets: Vec::new(),
            namespace: "toolmux".to_owned(),
            sampler: None,
        }
    }

    /// A handle that does not keep this orchestrator alive.
    pub fn downgrade(&self) -> WeakOrchestrator {
        WeakOrchestrator(Arc::downgrade(&self.inner))
    }

    /// The configuration.
    pub fn config(&self) -> &OrchestratorConfig {
        &self.inner.config
    }

    /// What redacts the configuration's secrets ([`OrchestratorBuilder::secrets`]) from
    /// outputs, errors and logs, for what leaves through other ways than a call (an
    /// agent's answers and reports), so that they are redacted as the orchestrator's own.
    pub fn redactor(&self) -> &Redactor {
        &self.inner.redactor
    }

    /// The current registry snapshot.
    pub fn registry(&self) -> Arc<Registry> {
        self.inner.registry.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every registered tool, with its model-facing name in `name`. Deferred tools (found
    /// by searching, [`OrchestratorConfig::deferred`]) are not shown (`visible` false).
    /// Tools a permission rule denies outright are left out, as Claude Code leaves them out
    /// of the model's context: a model offered one could only fail calling it, and its
    /// schema costs context. Calling one still says which rule denies it.
    pub fn tools(&self) -> Vec<ToolSpec> {
        self.registry()
            .entries()
            .filter(|e| !e.denied())
            .map(|e| {
                let mut spec = ToolSpec {
                    name: e.name.to_string(),
                    // The cap in force, for clients that size their own limits by it.
                    max_result_size: e.settings.response_max,
                    ..e.spec.clone()
                };
                if e.deferred {
                    spec.annotations.visible = false;
                }
                spec
            })
            .collect()
    }

    /// The registered providers.
    pub fn providers(&self) -> Vec<Arc<dyn ToolProvider>> {
        self.inner
            .providers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|p| p.provider.clone())
            .collect()
    }

    /// Instructions of every provider that has some, headed by its namespace.
    pub fn instructions(&self) -> Option<String> {
        self.instructions_of(&|_| true)
    }

    /// Instructions of the providers with a tool whose full name passes `allow` (a
    /// gateway's view, an agent's `tools`), headed by their namespaces: what is said about
    /// tools out of reach is not passed on.
    pub fn instructions_where(&self, allow: &dyn Fn(&str) -> bool) -> Option<String> {
        let registry = self.registry();
        let reachable: HashSet<&str> =
            registry.entries().filter(|e| allow(&e.name)).map(|e| e.provider.namespace()).collect();
        self.instructions_of(&|namespace| reachable.contains(namespace))
    }

    fn instructions_of(&self, provider: &dyn Fn(&str) -> bool) -> Option<String> {
        let parts: Vec<String> = self
            .providers()
            .iter()
            .filter(|p| provider(p.namespace()))
            .filter_map(|p| p.instructions().map(|i| format!("## {}\n{}", p.namespace(), i.trim())))
            .collect();
        (!parts.is_empty()).then(|| parts.join("\n\n"))
    }

    /// Events of every call from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ToolEvent> {
        self.inner.events.subscribe()
    }

    /// Whether anybody follows the events now: what is sent only for them (an agent's
    /// streamed text) need not be made otherwise.
    pub fn is_observed(&self) -> bool {
        self.inner.events.receiver_count() > 0
    }

    /// Sends [`ToolEvent::ToolStreaming`]: the next `fragment` of the arguments of the call
    /// `call_id` of `tool` that an agent's model (the operation of `ctx`) is writing, or
    /// with `None` the end of them. Secrets are redacted across fragments: what could begin
    /// one waits in `pending` (one per call, kept by the caller) for the next fragment.
    /// Only for tools shown to people (`visible`), and only when somebody follows events.
    pub fn stream_arguments(
        &self,
        ctx: &CallContext,
        call_id: &str,
        tool: &str,
        pending: &mut String,
        fragment: Option<&str>,
    ) {
        let visible =
            || self.registry().get(tool).is_some_and(|e| shown_to_people(&e.spec.annotations));
        if !self.is_observed() || !visible() {
            pending.clear();
            return;
        }
        let delta =
            self.inner.redactor.pass_on(pending, fragment.unwrap_or(""), fragment.is_none());
        if delta.is_empty() {
            return;
        }
        let _ = self.inner.events.send(ToolEvent::ToolStreaming {
            parent_op_id: ctx.op().map(|op| op.id()),
            run_id: ctx.run_id().to_owned(),
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            arguments_delta: delta,
        });
    }

    /// Sends [`ToolEvent::AgentText`]: the next `text` that agent `agent` (the operation
    /// of `ctx`) wrote, or with `None` the end of its turn; secrets are redacted across
    /// pieces as in [`Orchestrator::stream_arguments`]. Only when somebody follows events.
    pub fn agent_text(
        &self,
        ctx: &CallContext,
        agent: &str,
        pending: &mut String,
        text: Option<&str>,
    ) {
        if !self.is_observed() {
            pending.clear();
            return;
        }
        let text = self.inner.redactor.pass_on(pending, text.unwrap_or(""), text.is_none());
        if !text.is_empty() {
            self.send_agent_text(ctx, agent, text, false);
        }
    }

    /// Sends [`ToolEvent::AgentText`] saying that agent `agent`'s answer starts over; what
    /// was held back of it is dropped.
    pub fn agent_restart(&self, ctx: &CallContext, agent: &str, pending: &mut String) {
        pending.clear();
        if self.is_observed() {
            self.send_agent_text(ctx, agent, String::new(), true);
        }
    }

    fn send_agent_text(&self, ctx: &CallContext, agent: &str, text: String, restart: bool) {
        let _ = self.inner.events.send(ToolEvent::AgentText {
            op_id: ctx.op().map_or(0, |op| op.id()),
            parent_op_id: ctx.op().and_then(|op| op.parent()).map(|p| p.id()),
            run_id: ctx.run_id().to_owned(),
            agent: agent.to_owned(),
            text,
            restart,
        });
    }

    /// Per-tool statistics.
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Reads back a spilled output.
    pub async fn read_output(
        &self,
        handle: &str,
        offset: u64,
        limit: u64,
    ) -> Result<OutputPage, StoreError> {
        self.inner.store.read(handle, offset, limit).await
    }

    /// The counters and flags of a run.
    pub fn run_flags(&self, run_id: &str) -> RunFlags {
        let runs = self.inner.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.get(run_id).map_or_else(|| RunState::new().flags(), |r| r.flags())
    }

    /// Sets the context-token budget left for a run (an agent knows its context window).
    pub fn set_context_budget(&self, run_id: &str, tokens: u64) {
        self.run_state(run_id).context_budget_override.store(tokens, Ordering::Relaxed);
        self.inner.budget_set.store(true, Ordering::Relaxed);
    }

    /// Forgets a run's counters.
    pub fn end_run(&self, run_id: &str) {
        self.inner.runs.lock().unwrap_or_else(|e| e.into_inner()).remove(run_id);
        for provider in self.providers() {
            provider.end_run(run_id);
        }
    }

    fn run_state(&self, run_id: &str) -> Arc<RunState> {
        let mut runs = self.inner.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.state(run_id, now_secs())
    }

    fn tracks_runs(&self) -> bool {
        let c = &self.inner.config;
        c.run_budget.max_calls.is_some()
            || c.run_budget.max_tool_time.is_some()
            || c.context_token_budget.is_some()
            || self.inner.budget_set.load(Ordering::Relaxed)
    }

    /// Warms every provider up, at most `init_concurrency` at a time, each within the startup
    /// timeout, then lists their tools and builds the registry. A failing provider is
    /// reported and does not stop the others.
    pub async fn warmup(&self) -> WarmupReport {
        self.warmup_within(None).await
    }

    /// [`Orchestrator::warmup`], waiting at most `wait` for the providers: those still
    /// starting then go on starting in the background, and each joins the listings, with
    /// the subscribers told, once it is up (or is tried again, as a failed one is). Their
    /// reports say they are still starting. For a server that must answer its clients
    /// soon (`toolmux serve`: some clients give a server 10 s) while a provider takes its
    /// time (a cold `npx` or container start).
    pub async fn warmup_within(&self, wait: Option<Duration>) -> WarmupReport {
        let providers = self.providers();
        let timeout = self.inner.config.startup_timeout;
        // Futures built in a loop, not a closure: closures over `&Arc<dyn ToolProvider>` trip
        // the compiler's higher-ranked lifetime inference inside `async_trait` methods.
        let mut warmups = Vec::with_capacity(providers.len());
        for (i, provider) in providers.iter().enumerate() {
            warmups.push(warm_one(i, provider.clone(), timeout));
        }
        let mut stream = futures::stream::iter(warmups)
            .buffer_unordered(self.inner.config.init_concurrency.max(1));
        let deadline = wait.map(|wait| crate::later(Instant::now(), wait));
        let mut results: Vec<(usize, Result<(), String>, u64)> = Vec::new();
        loop {
            let next = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, stream.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
                None => stream.next().await,
            };
            match next {
                Some(result) => results.push(result),
                None => break,
            }
        }
        let starting: Vec<usize> =
            (0..providers.len()).filter(|i| !results.iter().any(|(j, ..)| j == i)).collect();
        if !starting.is_empty() {
            let joining = self.join_when_started(stream);
            self.inner.watchers.lock().unwrap_or_else(|e| e.into_inner()).push(joining);
        }
        let mut results: Vec<(usize, Result<(), String>, u64)> = results
            .into_iter()
            .map(|(i, r, ms)| (i, r.map_err(|e| self.inner.redactor.redact(&e).into_owned()), ms))
            .collect();
        // A provider whose warmup failed is not asked for its listings now: it would only
        // fail again, after waiting out its reconnection backoff (seconds, for a one-shot
        // `tools list`). It is tried again in the background (`retry_start`).
        let failed: HashSet<String> = results
            .iter()
            .filter(|(_, result, _)| result.is_err())
            .filter_map(|(i, _, _)| providers.get(*i).map(|p| p.namespace().to_owned()))
            .collect();
        let skipped: HashSet<String> = failed
            .iter()
            .cloned()
            .chain(
                starting.iter().filter_map(|&i| providers.get(i)).map(|p| p.namespace().to_owned()),
            )
            .collect();
        self.inner
            .not_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(skipped.iter().cloned());
        let waited_ms = wait.map_or(0, |w| w.as_millis() as u64);
        for &i in &starting {
            let note = format!(
                "still starting after {}s; its tools join the listings, and clients are told, \
                 when it is up",
                wait.map_or(0, |w| w.as_secs())
            );
            results.push((i, Err(note), waited_ms));
        }
        let mut list_errors = self.refresh_skipping(&skipped).await;
        self.list_declared(&skipped);
        self.inner
            .not_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(list_errors.keys().cloned());
        self.start_watchers();
        // A provider that could not start (a server down, a cold start slower than the
        // startup timeout) is tried again in the background, and its tools join the
        // listings when it comes up; until now it stayed out until a reload.
        {
            let mut watchers = self.inner.watchers.lock().unwrap_or_else(|e| e.into_inner());
            for namespace in failed.iter().chain(list_errors.keys()) {
                watchers.push(self.retry_start(namespace.clone()));
            }
        }
        self.start_update_forwarders();
        // Prompts and resources are listed again whenever a client lists them; listing them
        // here lets reads and `get_prompt` route before the first listing, and reports
        // naming problems with the tools'.
        let (prompts, ..) = futures::join!(
            self.refresh_prompts_skipping(&skipped),
            self.refresh_resources_skipping(&skipped),
            self.refresh_resource_templates_skipping(&skipped)
        );
        let registry = self.registry();
        let mut problems = registry.problems().to_vec();
        problems.extend_from_slice(prompts.problems());
        let mut report = WarmupReport { providers: Vec::new(), problems };
        let mut by_index: Vec<_> = results;
        by_index.sort_by_key(|(i, _, _)| *i);
        for (i, result, elapsed_ms) in by_index {
            let p = &providers[i];
            let error = result.err().or_else(|| list_errors.remove(p.namespace()));
            let starting = starting.contains(&i);
            if let Some(e) = error.as_ref().filter(|_| !starting) {
                tracing::warn!(provider = p.namespace(), "provider failed to start: {e}");
            }
            report.providers.push(ProviderReport {
                namespace: p.namespace().to_owned(),
                kind: p.kind(),
                tools: tools_of(&registry, p.namespace()),
                elapsed_ms,
                error,
                starting,
            });
        }
        report
    }

    /// Lists the tools of every provider again and rebuilds the registry; returns the
    /// providers whose listing failed (they keep their previous tools).
    pub async fn refresh(&self) -> HashMap<String, String> {
        self.refresh_skipping(&HashSet::new()).await
    }

    /// [`Orchestrator::refresh`], keeping the previous tools of the providers in `skip`.
    async fn refresh_skipping(&self, skip: &HashSet<String>) -> HashMap<String, String> {
        let providers = self.providers();
        let timeout = self.inner.config.startup_timeout;
        let started = self.listing_starts();
        let mut listings = Vec::with_capacity(providers.len());
        for provider in providers.into_iter().filter(|p| !skip.contains(p.namespace())) {
            listings.push(list_one(provider, timeout));
        }
        let listed: Vec<(String, Result<Vec<ToolSpec>, String>)> = futures::stream::iter(listings)
            .buffer_unordered(self.inner.config.init_concurrency.max(1))
            .collect()
            .await;
        let mut errors = HashMap::new();
        let _guard = self.inner.refresh_lock.lock().await;
        {
            let mut providers = self.inner.providers.write().unwrap_or_else(|e| e.into_inner());
            for (namespace, result) in listed {
                match result {
                    Ok(tools) => {
                        if let Some(p) =
                            providers.iter_mut().find(|p| p.provider.namespace() == namespace)
                        {
                            p.store(started, tools);
                        }
                    }
                    Err(e) => {
                        errors.insert(namespace, self.inner.redactor.redact(&e).into_owned());
                    }
                }
            }
        }
        self.rebuild();
        errors
    }

    /// Lists one provider's tools again (after it signalled a change) and rebuilds.
    pub async fn refresh_provider(&self, namespace: &str) {
        let Some(provider) = self.providers().into_iter().find(|p| p.namespace() == namespace)
        else {
            return;
        };
        let started = self.listing_starts();
        let listed =
            tokio::time::timeout(self.inner.config.startup_timeout, provider.list_tools()).await;
        let _guard = self.inner.refresh_lock.lock().await;
        match listed {
            Ok(Ok(tools)) => {
                let mut providers = self.inner.providers.write().unwrap_or_else(|e| e.into_inner());
                if let Some(p) = providers.iter_mut().find(|p| p.provider.namespace() == namespace)
                {
                    p.store(started, tools);
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(provider = namespace, "refreshing tools failed: {}", e.report());
            }
            Err(_) => tracing::warn!(provider = namespace, "refreshing tools timed out"),
        }
        self.rebuild();
        self.inner.notifier.notify();
    }

    /// The tools the providers in `namespaces` declare ([`ToolProvider::declared_tools`]),
    /// in the registry until they start and list their own: a model knows them meanwhile,
    /// and a call of one says why it does not run.
    fn list_declared(&self, namespaces: &HashSet<String>) {
        let mut declared = false;
        {
            let mut providers = self.inner.providers.write().unwrap_or_else(|e| e.into_inner());
            for p in providers.iter_mut().filter(|p| namespaces.contains(p.provider.namespace())) {
                declared |= p.declare(p.provider.declared_tools());
            }
        }
        if declared {
            self.rebuild();
        }
    }

    /// The number of a listing of tools about to start ([`ProviderTools::store`]).
    fn listing_starts(&self) -> u64 {
        self.inner.listings.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn rebuild(&self) {
        let _one_at_a_time = self.inner.rebuilding.lock().unwrap_or_else(|e| e.into_inner());
        let providers = self.inner.providers.read().unwrap_or_else(|e| e.into_inner()).clone();
        let registry = Registry::build(&providers, &self.inner.config, &self.inner.queues);
        *self.inner.registry.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(registry);
    }

    fn start_watchers(&self) {
        let mut watchers = self.inner.watchers.lock().unwrap_or_else(|e| e.into_inner());
        if self.inner.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        for provider in self.providers() {
            watchers.extend(self.watch(&provider));
        }
    }

    /// Goes on with the warmups `starting` holds after [`Orchestrator::warmup_within`]
    /// stopped waiting: each provider that starts is listed and joins the registry, with the
    /// subscribers told; one that fails is tried again ([`Orchestrator::retry_start`]).
    fn join_when_started<S>(&self, mut starting: S) -> tokio::task::JoinHandle<()>
    where
        S: futures::Stream<Item = (usize, Result<(), String>, u64)> + Send + Unpin + 'static,
    {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            while let Some((i, started, _)) = starting.next().await {
                let Some(inner) = weak.upgrade() else { return };
                let orchestrator = Orchestrator { inner };
                let Some(provider) = orchestrator.providers().get(i).cloned() else { continue };
                let namespace = provider.namespace().to_owned();
                let timeout = orchestrator.inner.config.startup_timeout;
                let listing = orchestrator.listing_starts();
                let listed = match started {
                    Ok(()) => list_one(provider, timeout).await.1,
                    Err(e) => Err(e),
                };
                match listed {
                    Ok(tools) => {
                        orchestrator.joined(&namespace, listing, tools).await;
                        tracing::info!(provider = %namespace, "provider started");
                    }
                    Err(e) => {
                        let e = orchestrator.inner.redactor.redact(&e).into_owned();
                        tracing::warn!(provider = %namespace, "provider failed to start: {e}");
                        let retry = orchestrator.retry_start(namespace);
                        orchestrator
                            .inner
                            .watchers
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(retry);
                    }
                }
            }
        })
    }

    /// Why no tool is called `name`: its provider has not started (yet, or at all) when the
    /// name's namespace is one, else the name is unknown, with the closest names.
    fn not_offered(&self, name: &str, registry: &Registry) -> ToolError {
        let not_started = self.inner.not_started.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((namespace, _)) = name.split_once("__")
            && not_started.contains(namespace)
        {
            let name = crate::suggest::echoed(name);
            return ToolError::Unavailable {
                provider: namespace.to_owned(),
                message: format!(
                    "`{name}` is not available: provider `{namespace}` has not started (it is \
                     tried again in the background; its tools join once it is up)"
                ),
            };
        }
        ToolError::UnknownTool {
            name: crate::suggest::echoed(name),
            suggestions: crate::suggest::suggest(registry.names(), name),
        }
    }

    /// Provider `namespace`, started late, with its `tools` (from the listing numbered
    /// `listing`): the registry is rebuilt with them and subscribers are told of its tools,
    /// prompts and resources.
    async fn joined(&self, namespace: &str, listing: u64, tools: Vec<ToolSpec>) {
        self.inner.not_started.lock().unwrap_or_else(|e| e.into_inner()).remove(namespace);
        {
            let _guard = self.inner.refresh_lock.lock().await;
            {
                let mut providers = self.inner.providers.write().unwrap_or_else(|e| e.into_inner());
                if let Some(p) = providers.iter_mut().find(|p| p.provider.namespace() == namespace)
                {
                    p.store(listing, tools);
                }
            }
            self.rebuild();
        }
        self.inner.notifier.notify();
        self.inner.prompts_changed.notify();
        self.inner.resources_changed.notify();
    }

    /// Tries provider `namespace` again, after 2 s and then twice as long each time up to
    /// a minute, until it starts and lists its tools: then the registry is rebuilt and
    /// subscribers are told. Ends with the orchestrator, or once the provider is gone.
    fn retry_start(&self, namespace: String) -> tokio::task::JoinHandle<()> {
        const FIRST: Duration = Duration::from_secs(2);
        const LONGEST: Duration = Duration::from_secs(60);
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut wait = FIRST;
            for attempt in 1u32.. {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(LONGEST);
                let Some(inner) = weak.upgrade() else { return };
                let orchestrator = Orchestrator { inner };
                if orchestrator.inner.closing.load(Ordering::Acquire) {
                    return;
                }
                let Some(provider) =
                    orchestrator.providers().into_iter().find(|p| p.namespace() == namespace)
                else {
                    return;
                };
                let timeout = orchestrator.inner.config.startup_timeout;
                let warmed = warm_one(0, provider.clone(), timeout).await.1;
                let listing = orchestrator.listing_starts();
                let listed = match warmed {
                    Ok(()) => list_one(provider, timeout).await.1,
                    Err(e) => Err(e),
                };
                match listed {
                    Ok(tools) => {
                        orchestrator.joined(&namespace, listing, tools).await;
                        tracing::info!(provider = %namespace, attempt, "provider started after all");
                        return;
                    }
                    Err(e) => tracing::debug!(
                        provider = %namespace,
                        attempt,
                        "provider still does not start, next try in {}s: {}",
                        wait.as_secs(),
                        orchestrator.inner.redactor.redact(&e)
                    ),
                }
            }
        })
    }

    /// Refreshes `provider`'s tools whenever it says its list changed.
    fn watch(&self, provider: &Arc<dyn ToolProvider>) -> Option<tokio::task::JoinHandle<()>> {
        let mut changes = provider.tool_list_changes()?;
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let namespace = provider.namespace().to_owned();
        Some(tokio::spawn(async move {
            while changes.changed().await {
                let Some(inner) = weak.upgrade() else { break };
                Orchestrator { inner }.refresh_provider(&namespace).await;
            }
        }))
    }

    /// Adds `provider` to the running orchestrator: the seeds' `register(provider)`, for a
    /// program that learns of a tool source after it started (a server a user connects). It
    /// is warmed up and its tools listed, each within the startup timeout, then the registry
    /// is rebuilt with it and subscribers are told that the lists changed; its own list
    /// changes and resource updates are followed as the others' are. The settings of the
    /// configuration (`providers.NAMESPACE`, `tools.NAME`, permissions) apply to it as to
    /// any provider. A provider that fails to start is kept, as at the warmup: its tools
    /// are listed again when it signals a change or on [`Orchestrator::refresh`], its
    /// prompts and resources whenever a client lists them. The report has its one provider
    /// and the registry's new problems (its tools left out, names that collide).
    ///
    /// A namespace in use, or an invalid one, is refused, as is a provider registered after
    /// [`Orchestrator::cleanup`] began (one refused after its warmup is shut down). A
    /// configuration reload builds a new orchestrator from the configuration, without the
    /// providers registered here: register them again with the new one.
    pub async fn register(
        &self,
        provider: Arc<dyn ToolProvider>,
    ) -> Result<WarmupReport, OrchestratorError> {
        let namespace = provider.namespace().to_owned();
        naming::validate_namespace(&namespace)?;
        // Checked with the providers' lock held and no other: never after another lock,
        // whose holders may take the providers' next.
        let refused = |providers: &[ProviderTools]| -> Result<(), OrchestratorError> {
            if self.inner.closing.load(Ordering::Acquire) {
                return Err(OrchestratorError::Closed { namespace: namespace.clone() });
            }
            match providers.iter().find(|p| p.provider.namespace() == namespace) {
                Some(first) => Err(OrchestratorError::DuplicateNamespace {
                    namespace: namespace.clone(),
                    first: first.provider.kind(),
                    second: provider.kind(),
                }),
                None => Ok(()),
            }
        };
        refused(&self.inner.providers.read().unwrap_or_else(|e| e.into_inner()))?;
        let timeout = self.inner.config.startup_timeout;
        let (_, warmed, elapsed_ms) = warm_one(0, provider.clone(), timeout).await;
        let listing = self.listing_starts();
        let listed = match &warmed {
            Ok(()) => list_one(provider.clone(), timeout).await.1,
            Err(_) => Ok(Vec::new()),
        };
        let error = warmed
            .err()
            .or_else(|| listed.as_ref().err().cloned())
            .map(|e| self.inner.redactor.redact(&e).into_owned());
        let before: HashSet<String> =
            self.registry().problems().iter().map(|p| p.message.clone()).collect();
        let guard = self.inner.refresh_lock.lock().await;
        let refusal = {
            // The order every path takes: watchers, then forwarders, then providers. Held
            // together, a warmup starting the watchers and forwarders either sees the
            // provider listed or leaves it to this registration, never both.
            let mut watchers = self.inner.watchers.lock().unwrap_or_else(|e| e.into_inner());
            let mut forwarders = self.inner.forwarders.lock().unwrap_or_else(|e| e.into_inner());
            let mut providers = self.inner.providers.write().unwrap_or_else(|e| e.into_inner());
            // Again: another registration, or a cleanup, may have come in between.
            match refused(&providers) {
                Err(e) => Some(e),
                Ok(()) => {
                    let tools = listed.unwrap_or_default();
                    providers.push(ProviderTools {
                        provider: provider.clone(),
                        tools,
                        listed: listing,
                    });
                    let index = providers.len() - 1;
                    drop(providers);
                    if self.inner.watching.load(Ordering::Acquire) {
                        watchers.extend(self.watch(&provider));
                    }
                    if forwarders.started && !forwarders.closed {
                        resources::forward(&self.inner, &mut forwarders, index, &provider);
                    }
                    None
                }
            }
        };
        if let Some(e) = refusal {
            drop(guard);
            shut_down(&provider, timeout).await;
            return Err(e);
        }
        // Under the refresh lock, as every rebuild: a refresh's newer registry is never
        // overwritten with one of the tools it replaced.
        self.rebuild();
        drop(guard);
        if let Some(e) = &error {
            tracing::warn!(provider = %namespace, "registered provider failed to start: {e}");
        }
        self.inner.notifier.notify();
        self.inner.prompts_changed.notify();
        self.inner.resources_changed.notify();
        let registry = self.registry();
        let tools = tools_of(&registry, &namespace);
        let problems =
            registry.problems().iter().filter(|p| !before.contains(&p.message)).cloned().collect();
        let report = ProviderReport {
            namespace,
            kind: provider.kind(),
            tools,
            elapsed_ms,
            error,
            starting: false,
        };
        Ok(WarmupReport { providers: vec![report], problems })
    }

    /// How many calls are in the pipeline now (a replaced orchestrator is shut down once
    /// it has none).
    pub fn calls_in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    /// Aborts every call in flight (their queue slots are released) and lets new calls run.
    pub fn cancel(&self) {
        let old = std::mem::replace(
            &mut *self.inner.generation.lock().unwrap_or_else(|e| e.into_inner()),
            Arc::new(CancellationToken::new()),
        );
        old.cancel();
    }

    /// Cancels everything, shuts every provider down (closing connections, reaping child
    /// processes) and flushes the audit log.
    pub async fn cleanup(&self) {
        self.cleanup_except(&|_| false).await;
    }

    /// [`Orchestrator::cleanup`], leaving running the providers `keep` accepts: those a
    /// new orchestrator took over (a reload keeps unchanged servers).
    pub async fn cleanup_except(&self, keep: &(dyn Fn(&Arc<dyn ToolProvider>) -> bool + Sync)) {
        self.inner.closing.store(true, Ordering::Release);
        self.cancel();
        for watcher in self.inner.watchers.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            watcher.abort();
        }
        self.stop_update_forwarders();
        let timeout = self.inner.config.startup_timeout;
        let ended = self.providers().into_iter().filter(|p| !keep(p));
        futures::future::join_all(ended.map(|p| async move { shut_down(&p, timeout).await })).await;
        if let Some(audit) = &self.inner.audit {
            audit.close();
        }
    }

    /// Runs one call through the whole pipeline and returns the envelope.
    pub async fn execute(&self, call: ToolCall, ctx: &CallContext) -> ToolResult {
        self.execute_keeping(call, ctx, false).await.0
    }

    /// [`Orchestrator::execute`], with the output's images beside the envelope, whose text
    /// only names them: its image parts and the embedded resources whose blob is an image,
    /// in order. For a caller that shows them to a model (an agent).
    pub async fn execute_with_images(
        &self,
        call: ToolCall,
        ctx: &CallContext,
    ) -> (ToolResult, Vec<ContentPart>) {
        self.execute_keeping(call, ctx, true).await
    }

    /// [`Orchestrator::execute`], keeping the output's images when `images`.
    async fn execute_keeping(
        &self,
        call: ToolCall,
        ctx: &CallContext,
        images: bool,
    ) -> (ToolResult, Vec<ContentPart>) {
        let ctx = match (&call.id, ctx.call_id()) {
            (Some(id), None) => Cow::Owned(ctx.clone().with_call_id(id.as_str())),
            _ => Cow::Borrowed(ctx),
        };
        let (result, entry, elapsed) =
            self.run(&call.name, call.arguments, &ctx, Instant::now()).await;
        let latency_ms = elapsed.as_millis() as u64;
        let (kind, namespace) = entry
            .as_ref()
            .map_or((ToolKind::Composite, ""), |e| (e.provider.kind(), e.provider.namespace()));
        let mut kept = Vec::new();
        let mut result = match result {
            Ok(output) => {
                if images {
                    kept = output.content.iter().filter(|p| is_image(p)).cloned().collect();
                }
                ToolResult::from_owned_output(output, kind, namespace, latency_ms)
            }
            Err(error) => ToolResult::from_error(&error, kind, namespace, latency_ms),
        };
        let redactor = &self.inner.redactor;
        if !redactor.is_empty() {
            for text in [&mut result.result, &mut result.error].into_iter().flatten() {
                if let Cow::Owned(clean) = redactor.redact(text) {
                    *text = clean;
                }
            }
            // An MCP server's `_meta`, printed by `toolmux tools call --json`.
            for value in result.extras.values_mut() {
                redactor.redact_json(value);
            }
        }
        (result, kept)
    }

    /// Runs one call through the whole pipeline and returns the output or the error.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let result = self.run(name, arguments, ctx, Instant::now()).await.0;
        self.redact_result(result, name)
    }

    async fn run(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
        started: Instant,
    ) -> (Result<ToolOutput, ToolError>, Option<Arc<ToolEntry>>, Duration) {
        let _in_flight = InFlight::enter(&self.inner.in_flight);
        let registry = self.registry();
        let entry = registry.get(name).cloned();
        let tool: Arc<str> = entry.as_ref().map_or_else(|| Arc::from(name), |e| e.name.clone());
        let op = Op::new(tool.clone(), ctx.op().cloned());
        let chars_in = if self.inner.audit.is_some() || self.inner.events.receiver_count() > 0 {
            arguments.to_string().chars().count() as u64
        } else {
            0
        };
        if self.inner.events.receiver_count() > 0 {
            let visible = entry.as_ref().is_some_and(|e| shown_to_people(&e.spec.annotations));
            let _ = self.inner.events.send(ToolEvent::ToolStarted {
                op_id: op.id(),
                parent_op_id: op.parent().map(|p| p.id()),
                run_id: ctx.run_id().to_owned(),
                call_id: ctx.call_id().map(str::to_owned),
                tool: tool.to_string(),
                kind: entry.as_ref().map(|e| e.provider.kind()),
                arguments: visible.then(|| self.redacted_value(&arguments)),
            });
        }
        // One record, its arguments on a second line as the seeds show it, so that the
        // requests of calls made at once cannot be told apart wrongly; the arguments only
        // when the target's trace is on (`defaults.traceMCP`).
        if tracing::enabled!(target: "toolmux::tool", tracing::Level::TRACE) {
            let arguments = self.redacted_value(&arguments);
            tracing::debug!(target: "toolmux::tool", "tool request → {tool}\n    parameters: {arguments}");
        } else {
            tracing::debug!(target: "toolmux::tool", "tool request → {tool}");
        }
        let meta = CallMeta::default();
        let audit_args =
            self.inner.audit.as_ref().map(|_| sha256_hex(cache_key("", &arguments).as_bytes()));
        let record = Unrecorded {
            orchestrator: self,
            tool: &tool,
            entry: entry.as_deref(),
            ctx,
            op: &op,
            meta: &meta,
            started,
            chars_in,
            audit_args,
            recorded: false,
        };
        let result = match &entry {
            None => Err(self.not_offered(name, &registry)),
            Some(entry) => {
                // Shown as it starts, before its permission is asked or its queue waited
                // for, so that people see what is coming; a refusal ends it failed.
                let shown = match &self.inner.display {
                    Some(display) if entry.settings.show_in_space => {
                        display.start(&tool, &self.redacted_value(&arguments), ctx).await
                    }
                    _ => None,
                };
                let span = tracing::debug_span!("tool_call", tool = %tool, op = op.id());
                let result =
                    match self.managed(entry, arguments, ctx, &op, &meta).instrument(span).await {
                        Err(error) => Err(self.bounded_error(entry, error, ctx, &meta).await),
                        done => done,
                    };
                if let Some(shown) = shown {
                    self.end_shown(shown, &result).await;
                }
                result
            }
        };
        let elapsed = record.finish(result.as_ref().map(Outcome::Output));
        (result, entry, elapsed)
    }

    /// Ends the display of a shown call with its `result`, as its caller gets it (an
    /// output is redacted by [`Orchestrator::bounded_output`] already, an error's report is
    /// here).
    async fn end_shown(
        &self,
        shown: Box<dyn DisplayedCall>,
        result: &Result<ToolOutput, ToolError>,
    ) {
        match result {
            Ok(output) => shown.end(CallEnd::Answered(output)).await,
            Err(ToolError::Cancelled { .. }) => shown.end(CallEnd::Cancelled).await,
            Err(error) => {
                let report = error.report();
                shown.end(CallEnd::Failed(&self.inner.redactor.redact(&report))).await;
            }
        }
    }

    /// `value` with the configuration's secrets redacted from its strings and keys: in the
    /// values, before any is written out as JSON, which would escape a secret's line
    /// breaks or quotes so that its text no longer holds it.
    fn redacted_value(&self, value: &Value) -> Value {
        let mut value = value.clone();
        self.inner.redactor.redact_json(&mut value);
        value
    }

    fn redact_result(
        &self,
        result: Result<ToolOutput, ToolError>,
        tool: &str,
    ) -> Result<ToolOutput, ToolError> {
        let redactor = &self.inner.redactor;
        if redactor.is_empty() {
            return result;
        }
        match result {
            Ok(mut output) => {
                redact_output(redactor, &mut output);
                Ok(output)
            }
            Err(e) => Err(self.redact_error(e, tool)),
        }
    }

    /// An error whose message holds a secret becomes a [`ToolError::Remote`] about `tool`
    /// with the secret redacted: the variant is lost, not the secret kept.
    fn redact_error(&self, error: ToolError, tool: &str) -> ToolError {
        let redactor = &self.inner.redactor;
        if redactor.is_empty() {
            return error;
        }
        match redactor.redact(&error.report()) {
            Cow::Borrowed(_) => error,
            Cow::Owned(clean) => ToolError::Remote { tool: tool.to_owned(), message: clean },
        }
    }

    /// The bounds of a provider call outside the tool pipeline (a prompt, a resource),
    /// enforced by [`Orchestrator::bounded`]: the provider's timeout (else the default tool
    /// timeout), never past the caller's deadline.
    fn bound(&self, provider: &dyn ToolProvider, ctx: &CallContext) -> Bound {
        let timeout = self
            .inner
            .config
            .providers
            .get(provider.namespace())
            .and_then(|s| s.timeout)
            .unwrap_or(self.inner.config.tool_timeout);
        let start = Instant::now();
        let mut deadline = crate::later(start, timeout);
        if let Some(d) = ctx.deadline() {
            deadline = deadline.min(d);
        }
        let generation = self.inner.generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Bound { token: CancellationToken::new(), start, deadline, generation }
    }

    /// Awaits `call` within `bound`: the caller's cancellation and [`Orchestrator::cancel`]
    /// cancel it, the deadline times it out, a panic becomes an error. `what` (a prompt
    /// name, a URI) names the call in errors.
    async fn bounded<T>(
        &self,
        bound: Bound,
        ctx: &CallContext,
        what: &str,
        call: impl Future<Output = Result<T, ToolError>>,
    ) -> Result<T, ToolError> {
        let call = AssertUnwindSafe(call).catch_unwind();
        let result = tokio::select! {
            biased;
            result = call => match result {
                Ok(result) => result,
                Err(panic) => Err(ToolError::Panicked { tool: what.to_owned(), message: panic_message(&*panic) }),
            },
            () = ctx.cancel_token().cancelled() => Err(ToolError::Cancelled { tool: what.to_owned() }),
            () = bound.generation.cancelled() => Err(ToolError::Cancelled { tool: what.to_owned() }),
            () = tokio::time::sleep_until(bound.deadline) => {
                Err(ToolError::Timeout { tool: what.to_owned(), after: bound.start.elapsed(), idle: None })
            }
        };
        if result.is_err() {
            // Stops whatever the provider still runs for a call given up on.
            bound.token.cancel();
        }
        result.map_err(|e| self.redact_error(e, what))
    }

    #[allow(clippy::too_many_arguments)]
    fn account(
        &self,
        tool: &Arc<str>,
        entry: Option<&ToolEntry>,
        ctx: &CallContext,
        op: &Arc<Op>,
        meta: &CallMeta,
        result: Result<Outcome<'_>, &ToolError>,
        started: Instant,
        chars_in: u64,
        audit_args: Option<String>,
    ) -> Duration {
        let elapsed = started.elapsed();
        let latency_ms = elapsed.as_millis() as u64;
        let ok = matches!(result, Ok(o) if !o.is_error());
        let stats = match entry {
            Some(entry) => entry.stats.get_or_init(|| self.inner.stats.of(tool)).clone(),
            None => self.inner.stats.of_unknown(tool, self.registry().len()),
        };
        stats.record(ok, elapsed.as_micros() as u64);
        if let Some(holder) = crate::accounting::holder_of(ctx.run_id()) {
            self.inner.stats.record_holder(&holder, ok);
        }
        let error_code = match result {
            Ok(o) if o.is_error() => Some("tool_error"),
            Ok(_) => None,
            Err(e) => Some(e.code()),
        };
        match result {
            Ok(o) if ok => {
                // The output's size is counted only when the line is logged.
                tracing::debug!(target: "toolmux::tool", "tool response ← {tool} latency: {latency_ms}ms, output: {} chars, status: ok", o.text().chars().count());
            }
            Ok(o) => {
                let text: String = o.text().chars().take(200).collect();
                tracing::warn!(target: "toolmux::tool", "tool response ← {tool} latency: {latency_ms}ms, status: failed, error: {}", one_line(&self.inner.redactor.redact(&text)));
            }
            Err(e) => {
                tracing::warn!(target: "toolmux::tool", "tool response ← {tool} latency: {latency_ms}ms, status: failed, error: {}", one_line(&self.inner.redactor.redact(&e.report())));
            }
        }
        let wants_record = self.inner.events.receiver_count() > 0 || self.inner.audit.is_some();
        if !wants_record {
            return elapsed;
        }
        let text = match result {
            Ok(o) => o.text(),
            Err(e) => e.report(),
        };
        if let (Some(audit), Some(arguments_sha256)) = (&self.inner.audit, audit_args) {
            audit.write(AuditRecord {
                ts_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
                run: ctx.run_id().to_owned(),
                tool: tool.to_string(),
                call_id: ctx.call_id().map(str::to_owned),
                arguments_sha256,
                result_sha256: sha256_hex(text.as_bytes()),
                outcome: error_code.map_or_else(|| "ok".to_owned(), |c| format!("failed:{c}")),
                latency_ms,
            });
        }
        if self.inner.events.receiver_count() > 0 {
            let served = *meta.served.lock().unwrap_or_else(|e| e.into_inner());
            let record = CallRecord {
                tool: tool.to_string(),
                namespace: entry.map(|e| e.provider.namespace().to_owned()).unwrap_or_default(),
                kind: entry.map_or(ToolKind::Composite, |e| e.provider.kind()),
                run_id: ctx.run_id().to_owned(),
                call_id: ctx.call_id().map(str::to_owned),
                op_id: op.id(),
                parent_op_id: op.parent().map(|p| p.id()),
                latency_ms,
                queued_ms: meta.queued_ms.load(Ordering::Relaxed),
                chars_in,
                chars_out: text.chars().count() as u64,
                status: if ok { CallStatus::Ok } else { CallStatus::Failed },
                error_code: error_code.map(str::to_owned),
                cached: matches!(served, Some(Served::Cache | Served::Coalesced)),
                spilled: meta.spilled.load(Ordering::Relaxed),
                attempts: meta.attempts.load(Ordering::Relaxed),
                trace_parent: ctx.trace_parent().map(ToString::to_string),
            };
            let visible = entry.is_some_and(|e| shown_to_people(&e.spec.annotations));
            let result = visible.then(|| self.inner.redactor.redact(&text).into_owned());
            let _ = self.inner.events.send(ToolEvent::ToolFinished { record, result });
        }
        elapsed
    }

    /// Everything after lookup: permission, validation, hooks, cache, then the downstream
    /// stages, then size cap and context budget.
    async fn managed(
        &self,
        entry: &Arc<ToolEntry>,
        arguments: Value,
        ctx: &CallContext,
        op: &Arc<Op>,
        meta: &CallMeta,
    ) -> Result<ToolOutput, ToolError> {
        let mut arguments = arguments;
        normalize(entry, &mut arguments)?;
        self.admit(entry, &arguments, ctx).await?;
        // Stages with nothing to do are skipped without building their futures: every future
        // built is moved (copied whole) into this one's state at least once.
        let arguments = if self.inner.before.is_empty() {
            arguments
        } else {
            self.cancellable(ctx, &entry.name, self.before_hooks(entry, arguments, ctx, op)).await?
        };
        let output = match entry.settings.cache_ttl {
            // Boxed: the single-flight future is the largest state and rarely used.
            Some(ttl) => {
                Box::pin(async {
                    // Shared across runs only when the output is the arguments' alone, and
                    // across callers only when they pass the service the same headers.
                    let partition = entry.provider.cache_partition(&entry.original, ctx);
                    let key = if entry.provider.state_per_run() || partition.is_some() {
                        let mut scope = entry.name.to_string();
                        if entry.provider.state_per_run() {
                            scope.push_str("\u{0}run:");
                            scope.push_str(ctx.run_id());
                        }
                        if let Some(partition) = &partition {
                            scope.push_str("\u{0}as:");
                            scope.push_str(&sha256_hex(partition.as_bytes()));
                        }
                        cache_key(&scope, &arguments)
                    } else {
                        cache_key(&entry.name, &arguments)
                    };
                    // An output that depended on the caller's answers is not shared.
                    let tracked = ctx.clone().track_asking();
                    // Kept with the configuration's secrets redacted, as a spilled output
                    // is: a shared cache (Redis) is storage other processes read.
                    let run = || async {
                        let mut result =
                            self.downstream(entry, arguments.clone(), &tracked, op, meta).await;
                        if let Ok(output) = &mut result
                            && !self.inner.redactor.is_empty()
                        {
                            redact_output(&self.inner.redactor, output);
                        }
                        result
                    };
                    let cacheable = || !tracked.asked_caller();
                    // The call's own limit, counted from now: a caller that waits for
                    // another's call, and runs it itself when that one fails, takes no
                    // longer than it would have alone.
                    let arrived = Instant::now();
                    let wait = || {
                        let own = call_limit(&entry.settings).0;
                        let own = (crate::later(arrived, own), own);
                        let limit = match self.coalesced_wait_limit(entry, ctx) {
                            Some(limit) if limit.0 <= own.0 => limit,
                            _ => own,
                        };
                        Some(WaitLimit { tool: &entry.name, until: limit.0, after: limit.1 })
                    };
                    let flight = self.inner.flight.run_if(
                        &*self.inner.cache,
                        &key,
                        ttl,
                        run,
                        cacheable,
                        wait,
                    );
                    // A caller waiting for another's identical call (coalesced) stops when
                    // it is cancelled, not when that call ends. `Orchestrator::cancel` stops
                    // every one of them, and is looked at first: a waiter woken by the
                    // cancelled leader's leaving would otherwise lead and run the call again
                    // under the generation that came after.
                    let generation =
                        self.inner.generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let (result, served) = tokio::select! {
                        biased;
                        () = generation.cancelled() => {
                            let tool = entry.name.to_string();
                            (Err(ToolError::Cancelled { tool }), Served::Executed)
                        }
                        done = flight => done,
                        () = ctx.cancel_token().cancelled() => {
                            let tool = entry.name.to_string();
                            (Err(ToolError::Cancelled { tool }), Served::Executed)
                        }
                    };
                    *meta.served.lock().unwrap_or_else(|e| e.into_inner()) = Some(served);
                    result
                })
                .await?
            }
            None => self.downstream(entry, arguments, ctx, op, meta).await?,
        };
        // After the cache: every call's result passes its after-hooks, a cached one too
        // (a PostToolUse hook logging calls would miss the cached ones otherwise).
        let output = if self.inner.after.is_empty() {
            output
        } else {
            let hooks = self.after_hooks(entry, output, ctx, op);
            Box::pin(self.cancellable(ctx, &entry.name, hooks)).await?
        };
        self.bounded_output(entry, output, ctx, meta).await
    }

    /// The largest output of `entry` that passes unchanged: over it, text is stored or cut
    /// ([`Orchestrator::bounded_output`]).
    fn response_max(&self, entry: &ToolEntry) -> usize {
        entry.settings.response_max.unwrap_or(self.inner.config.response_max_bytes)
    }

    /// The output normalized (content a model API refuses replaced, `crate::normalize`),
    /// then within the size caps (text, then structured content) and the run's context
    /// budget.
    async fn bounded_output(
        &self,
        entry: &ToolEntry,
        output: ToolOutput,
        ctx: &CallContext,
        meta: &CallMeta,
    ) -> Result<ToolOutput, ToolError> {
        let mut output = output;
        // Redacted in its values first: every stage after this one writes some of it out
        // as text (the size caps, the spill, a schema violation, the events), and JSON
        // written out escapes a secret's line breaks or quotes, which its text then does
        // not hold as the secret is.
        if !self.inner.redactor.is_empty() {
            redact_output(&self.inner.redactor, &mut output);
        }
        self.name_links_as_listed(entry.provider.namespace(), &mut output);
        crate::normalize::normalize(&mut output, &entry.name, entry.spec.output_schema.is_some());
        let max = self.response_max(entry);
        let output = if textual_len(&output) > max {
            self.cap_size(entry, output, ctx, meta).await
        } else {
            output
        };
        let structured_max = max.max(self.inner.config.structured_max_bytes);
        let mut output = match &output.structured {
            Some(structured) if toolmux_core::json_len(structured) > structured_max => {
                Box::pin(self.cap_structured(entry, output, structured_max, ctx, meta)).await
            }
            _ => output,
        };
        check_structured(entry, &mut output);
        // Images, audio and resources' blobs have a cap of their own: the text cap does not
        // count them. What is left out is not stored, as the output store keeps text.
        let media_max = entry.settings.media_max.unwrap_or(self.inner.config.media_max_bytes);
        crate::media::cap_media(&mut output, media_max, &entry.name);
        if let Some(run) = self.tracks_runs().then(|| self.run_state(ctx.run_id())) {
            let tokens =
                estimate_tokens(textual_len(&output)) + crate::media::media_tokens(&output);
            if let Err(remaining) =
                run.take_context_tokens(tokens, self.inner.config.context_token_budget)
            {
                // An external call that was made and is pending: its handle is the only way
                // to its result, so it reaches the caller whatever the budget, which it
                // spends, and says the budget is spent for the run's next output.
                if is_pending_handle(entry, &output) {
                    run.spend_context_tokens(tokens);
                    output.content.push(ContentPart::Text {
                        text: format!(
                            "note: the run's context budget (`defaults.contextTokenBudget`) \
                             is spent (this answer takes about {tokens} tokens, {remaining} \
                             were left): this pending call's handle is passed on so that its \
                             result can be collected by its callId, but the run's next tool \
                             output will be refused"
                        ),
                    });
                    output.extras.insert("context_budget_exceeded".into(), json!(true));
                    return Ok(output);
                }
                // The caller's own bookkeeping (an agent taking the results that arrived
                // in its run's inbox) is not refused by the run's budget, as the budget of
                // calls does not refuse it: what it took out is nowhere else. It spends
                // the tokens, so the run's next output is refused.
                if ctx.is_outside_budget() {
                    run.spend_context_tokens(tokens);
                    return Ok(output);
                }
                return Err(ToolError::ContextBudgetExceeded {
                    tool: entry.name.to_string(),
                    tokens,
                    remaining,
                });
            }
        }
        Ok(output)
    }

    /// The permission for a call of `entry` and the validation of its arguments, in the
    /// order the permission needs.
    async fn admit(
        &self,
        entry: &ToolEntry,
        arguments: &Value,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        match &entry.permission {
            Permission::Allow => entry.validator.validate(&entry.name, arguments),
            // Rules on calls read the call's arguments, so they must be valid first.
            Permission::Check(rules) => {
                entry.validator.validate(&entry.name, arguments)?;
                self.permit_call(entry, rules, arguments, ctx).await
            }
            permission => {
                self.permit(&entry.name, permission, arguments, ctx).await?;
                entry.validator.validate(&entry.name, arguments)
            }
        }
    }

    /// Judges one call of a tool with rules on calls (`fs__bash(git *)`), asking its
    /// provider what the call acts on.
    async fn permit_call(
        &self,
        entry: &ToolEntry,
        rules: &crate::permission::CallRules,
        arguments: &Value,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        let subjects = if rules.needs_subjects() {
            entry.provider.subjects(&entry.original, arguments)
        } else {
            Ok(Vec::new())
        };
        match rules.judge(&entry.name, arguments, subjects) {
            Permission::Allow => Ok(()),
            permission => Box::pin(self.permit(&entry.name, &permission, arguments, ctx)).await,
        }
    }

    /// Carries out `permission` for a call of `tool` (a tool's, a prompt's or a
    /// resource's name as the rules see it): denies it, asks the context's approval
    /// handler, or lets it through.
    pub(super) async fn permit(
        &self,
        tool: &str,
        permission: &Permission,
        arguments: &Value,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        match permission {
            Permission::Allow | Permission::Check(_) => Ok(()),
            Permission::Deny(reason) => {
                Err(ToolError::Denied { tool: tool.to_owned(), reason: reason.clone() })
            }
            Permission::Ask(rule) => {
                let Some(handler) = ctx.handler() else {
                    let fix = if rule.starts_with("rule ") {
                        "remove the rule or move it to `permissions.allow` to run without approval"
                            .to_owned()
                    } else {
                        format!("write the command line without it, or allow `{tool}(*)`")
                    };
                    return Err(ToolError::Denied {
                        tool: tool.to_owned(),
                        reason: format!(
                            "{rule} requires approval and no approval handler is attached; {fix}"
                        ),
                    });
                };
                let request = ApprovalRequest {
                    tool: tool.to_owned(),
                    arguments: arguments.clone(),
                    reason: rule.clone(),
                    scope: crate::permission::asking_rule_on_calls(rule).map(str::to_owned),
                    call_id: ctx.call_id().map(str::to_owned),
                };
                // Nobody may ever answer: the wait ends as a queue wait does, when the
                // caller cancels the call, at `Orchestrator::cancel`, or at the caller's
                // deadline (an answer after it is of no use).
                let generation =
                    self.inner.generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let started = Instant::now();
                let decision = tokio::select! {
                    decision = handler.approve(request) => decision,
                    () = ctx.cancel_token().cancelled() => {
                        return Err(ToolError::Cancelled { tool: tool.to_owned() });
                    }
                    () = generation.cancelled() => {
                        return Err(ToolError::Cancelled { tool: tool.to_owned() });
                    }
                    () = at_deadline(ctx.deadline()) => {
                        let after = started.elapsed();
                        return Err(ToolError::Timeout { tool: tool.to_owned(), after, idle: None });
                    }
                };
                match decision {
                    ApprovalDecision::Allow => Ok(()),
                    ApprovalDecision::Deny { reason } => Err(ToolError::Denied {
                        tool: tool.to_owned(),
                        reason: format!("not approved: {reason}"),
                    }),
                }
            }
        }
    }

    /// `work` (hooks: programs and code of others, which may wait on a person or a
    /// service) until the caller cancels the call, [`Orchestrator::cancel`], or the
    /// caller's deadline.
    async fn cancellable<T>(
        &self,
        ctx: &CallContext,
        tool: &str,
        work: impl Future<Output = Result<T, ToolError>>,
    ) -> Result<T, ToolError> {
        let generation = self.inner.generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let started = Instant::now();
        tokio::select! {
            biased;
            result = work => result,
            () = ctx.cancel_token().cancelled() => Err(ToolError::Cancelled { tool: tool.to_owned() }),
            () = generation.cancelled() => Err(ToolError::Cancelled { tool: tool.to_owned() }),
            () = at_deadline(ctx.deadline()) => {
                Err(ToolError::Timeout { tool: tool.to_owned(), after: started.elapsed(), idle: None })
            }
        }
    }

    async fn before_hooks(
        &self,
        entry: &ToolEntry,
        mut arguments: Value,
        ctx: &CallContext,
        op: &Arc<Op>,
    ) -> Result<Value, ToolError> {
        let mut changed = false;
        // Hooks see the call's own operation, so that the two halves of a hook can tell
        // concurrent calls of one tool apart (its id is unique in the process).
        let hook_ctx = ctx.clone().with_op(op.clone());
        for (at, scoped) in self.inner.before.iter().enumerate() {
            if !scoped.applies_to(&entry.name) {
                continue;
            }
            let before = arguments.clone();
            let hook = scoped.hook.before(&entry.name, &mut arguments, &hook_ctx);
            match AssertUnwindSafe(hook).catch_unwind().await {
                Ok(result) => result?,
                Err(panic) => return Err(hook_panicked(entry, "before", at, scoped, &*panic)),
            }
            changed |= before != arguments;
        }
        if changed {
            // A hook answering with another program's names for the arguments (Claude
            // Code's `file_path`) is read as the provider reads them.
            normalize(entry, &mut arguments)?;
            entry.validator.validate(&entry.name, &arguments)?;
            // The rules on calls judge what will run, not what the model asked for.
            if let Permission::Check(rules) = &entry.permission {
                self.permit_call(entry, rules, &arguments, ctx).await?;
            }
        }
        Ok(arguments)
    }

    async fn after_hooks(
        &self,
        entry: &ToolEntry,
        mut output: ToolOutput,
        ctx: &CallContext,
        op: &Arc<Op>,
    ) -> Result<ToolOutput, ToolError> {
        let hook_ctx = ctx.clone().with_op(op.clone());
        for (at, scoped) in self.inner.after.iter().enumerate() {
            if !scoped.applies_to(&entry.name) {
                continue;
            }
            let hook = scoped.hook.after(&entry.name, &mut output, &hook_ctx);
            match AssertUnwindSafe(hook).catch_unwind().await {
                Ok(result) => result?,
                Err(panic) => return Err(hook_panicked(entry, "after", at, scoped, &*panic)),
            }
        }
        Ok(output)
    }

    /// Run budget, queue slot, timeout and retries around the provider call.
    async fn downstream(
        &self,
        entry: &ToolEntry,
        arguments: Value,
        ctx: &CallContext,
        op: &Arc<Op>,
        meta: &CallMeta,
    ) -> Result<ToolOutput, ToolError> {
        let generation = self.inner.generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // A call passed on (`tools__call`) is counted once, as the tool it calls.
        let run = (self.tracks_runs() && !entry.passes_on && !ctx.is_outside_budget())
            .then(|| self.run_state(ctx.run_id()));
        let mut time_left = None;
        let mut reserved = ReservedCall(None);
        if let Some(run) = &run {
            if let Some(max) = self.inner.config.run_budget.max_calls {
                let calls = run.calls.fetch_add(1, Ordering::Relaxed) + 1;
                reserved.0 = Some(&run.calls);
                if calls > max {
                    return Err(ToolError::BudgetExhausted {
                        tool: entry.name.to_string(),
                        what: format!("the run may make at most {max} tool calls"),
                    });
                }
            }
            time_left = self.tool_time_left(entry, run)?;
        }
        // The turn under the rate limit comes before the queue slot, so that a call waiting
        // for its turn holds no slot that the queue's other calls (of other tools, limited
        // or not) could run in. The turn is then held while the call waits for its slot: a
        // call that never gets one (cancelled, dropped, past its deadline, or refused by
        // its queue) gives it back, come or not, so that a call that never reached its
        // provider takes none of the limit and delays no later call.
        let turn = if self.inner.rate_limits.tools.is_empty()
            && self.inner.rate_limits.providers.is_empty()
        {
            UnusedTurn(None)
        } else {
            self.take_turn(entry, ctx, meta, &generation, None).await?
        };
        let _slot = self.take_slot(entry, ctx, op, meta, &generation).await?;
        let _provider_slot = self.take_provider_slot(entry, ctx, op, meta, &generation).await?;
        // The call reaches its provider: it is one of the run's calls from here on, and its
        // turn is used.
        reserved.0 = None;
        turn.used();
        // Charged when the call ends, or is dropped halfway.
        let spent = ToolTime(run.as_deref().map(|run| (run, Instant::now())));
        // The run's tool time left holds for the whole call, retries and progress included.
        let run_deadline =
            spent.0.zip(time_left).map(|((_, started), left)| crate::later(started, left));
        let result = match &entry.settings.retry {
            Some(policy) => {
                Box::pin(self.attempts(
                    entry,
                    policy,
                    arguments,
                    ctx,
                    op,
                    meta,
                    &generation,
                    run_deadline,
                ))
                .await
            }
            None => {
                meta.attempts.store(1, Ordering::Relaxed);
                let (queued, turn) = meta.waits();
                let limits = CallLimits { run_deadline, queued, turn, retry: None };
                self.timed_call(entry, arguments, ctx, op, &generation, limits).await
            }
        };
        drop(spent);
        result
    }

    /// What is left of the run's `maxToolTimeMs` (`None` without one), or the error that
    /// it is spent.
    fn tool_time_left(
        &self,
        entry: &ToolEntry,
        run: &RunState,
    ) -> Result<Option<Duration>, ToolError> {
        let Some(max) = self.inner.config.run_budget.max_tool_time else { return Ok(None) };
        let used = Duration::from_millis(run.tool_time_ms.load(Ordering::Relaxed));
        if used >= max {
            return Err(ToolError::BudgetExhausted {
                tool: entry.name.to_string(),
                what: format!("the run may spend at most {}s in tools", max.as_secs_f64()),
            });
        }
        Ok(Some(max - used))
    }

    /// How long a call may wait for an identical call of another caller (coalesced by the
    /// cache stage): until its context's deadline or until its run's tool time is spent,
    /// whichever is first; `None` when neither bounds it.
    fn coalesced_wait_limit(
        &self,
        entry: &ToolEntry,
        ctx: &CallContext,
    ) -> Option<(Instant, Duration)> {
        let now = Instant::now();
        let mut limit = ctx.deadline().map(|until| (until, until.saturating_duration_since(now)));
        if self.tracks_runs() && !entry.passes_on && !ctx.is_outside_budget() {
            let run = self.run_state(ctx.run_id());
            // Spent: no wait (a cached output is still served).
            let left = self.tool_time_left(entry, &run).map_or(Some(Duration::ZERO), |left| left);
            if let Some(left) = left
                && limit.is_none_or(|(until, _)| crate::later(now, left) < until)
            {
                limit = Some((crate::later(now, left), left));
            }
        }
        limit
    }

    /// Waits for the call's turn under its rate limit (the tool's, else its provider's),
    /// or fails with [`ToolError::RateLimited`] when the turn is further off than the limit
    /// lets a call wait, and with [`ToolError::DeadlineExceeded`] when it would come at or
    /// past the call's deadline (its timeout, which counts the wait, or its caller's). The
    /// wait ends as a queue wait does: at the caller's cancellation and at
    /// [`Orchestrator::cancel`].
    ///
    /// The turn is returned unused: the caller gives it back by dropping it, or keeps it by
    /// clearing it once the call reaches its provider.
    ///
    /// `retry_deadline`: for a retry's turn, the deadline its call's attempts share, in
    /// place of the timeout counted from now.
    async fn take_turn(
        &self,
        entry: &ToolEntry,
        ctx: &CallContext,
        meta: &CallMeta,
        generation: &CancellationToken,
        retry_deadline: Option<Instant>,
    ) -> Result<UnusedTurn<'_>, ToolError> {
        let limits = &self.inner.rate_limits;
        let namespace = entry.provider.namespace();
        let original = || format!("{namespace}__{}", entry.original);
        let limiter = limits
            .tools
            .get(&*entry.name)
            .or_else(|| limits.tools.get(&original()))
            .or_else(|| limits.providers.get(namespace));
        let Some(limiter) = limiter else { return Ok(UnusedTurn(None)) };
        let turn =
            limiter.limiter.reserve_turn().await.map_err(|retry_after| ToolError::RateLimited {
                tool: entry.name.to_string(),
                limit: describe(&limiter.limit),
                retry_after,
            })?;
        // A call that stops waiting (cancelled, past its deadline, or dropped) gives its
        // turn back: it never runs, so it takes none of the limit.
        let unused = UnusedTurn(Some((&*limiter.limiter, turn)));
        if turn.wait().is_zero() {
            return Ok(unused);
        }
        let started = Instant::now();
        let at = crate::later(started, turn.wait());
        // One deadline per call: the wait for its turn counts against its timeout, as its
        // waits for slots do, and a turn that comes at or past that deadline or its
        // caller's is of no use. The call fails at once, saying so, rather than sleeping
        // until its deadline to time out.
        let (own, timeout) = match retry_deadline {
            Some(deadline) => (deadline, call_limit(&entry.settings).0),
            None => (crate::later(started, entry.settings.first_wait), entry.settings.first_wait),
        };
        // The caller's deadline, when it comes first.
        let caller = ctx.deadline().filter(|deadline| *deadline < own);
        let deadline = caller.unwrap_or(own);
        if at >= deadline {
            let wait = human(turn.wait());
            let (past, or) = match caller {
                Some(_) => (
                    format!(
                        "its caller's deadline, {} away",
                        human(deadline.saturating_duration_since(started))
                    ),
                    "",
                ),
                None => (
                    format!(
                        "its timeout ({}, {TIMEOUT_SETTING}), which the wait counts against",
                        human(timeout)
                    ),
                    ", or raise the timeout",
                ),
            };
            return Err(ToolError::DeadlineExceeded {
                tool: entry.name.to_string(),
                after: deadline.saturating_duration_since(started),
                limit: format!(
                    "its turn under its rate limit ({}) comes in {wait}, at or past {past}, so \
                     it did not wait and did not run; call again in {wait}{or}",
                    describe(&limiter.limit)
                ),
            });
        }
        tokio::select! {
            () = tokio::time::sleep_until(at) => {}
            () = ctx.cancel_token().cancelled() => {
                return Err(ToolError::Cancelled { tool: entry.name.to_string() });
            }
            () = generation.cancelled() => {
                return Err(ToolError::Cancelled { tool: entry.name.to_string() });
            }
        }
        // A retry's wait adds to the first attempt's.
        meta.turn_ms.fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        Ok(unused)
    }

    async fn take_slot(
        &self,
        entry: &ToolEntry,
        ctx: &CallContext,
        op: &Arc<Op>,
        meta: &CallMeta,
        generation: &CancellationToken,
    ) -> Result<Option<HeldSlot>, ToolError> {
        let Some((queue, wait)) = &entry.settings.queue else { return Ok(None) };
        // A free slot is taken without a clock read, a select or a boxed future.
        if let Some(slot) = queue.try_acquire() {
            op.hold_queue(queue.name());
            return Ok(Some(HeldSlot { _slot: slot, op: op.clone(), queue: queue.name().clone() }));
        }
        if queue.is_full()
            && let Some(ancestor) = op.ancestor_holding(queue.name())
        {
            return Err(ToolError::QueueDeadlock {
                tool: entry.name.to_string(),
                queue: queue.name().to_string(),
                ancestor: ancestor.tool().to_owned(),
            });
        }
        let waited = Instant::now();
        // A slot that comes after the caller's deadline is of no use: the wait ends there.
        // Nor one after the call's timeout, which counts the wait, as it counts the wait for
        // its turn under a rate limit before (one deadline per call).
        let turn = Duration::from_millis(meta.turn_ms.load(Ordering::Relaxed));
        let timeout = entry.settings.first_wait.saturating_sub(turn);
        let before_deadline = ctx.deadline().map(|d| d.saturating_duration_since(waited));
        let by_deadline = before_deadline.is_some_and(|left| left < *wait && left <= timeout);
        let by_timeout = !by_deadline && timeout < *wait;
        let limit = before_deadline.map_or(*wait, |left| left.min(*wait)).min(timeout);
        let priority = entry.settings.priority.saturating_add(ctx.priority());
        let slot = tokio::select! {
            slot = queue.acquire_at(limit, priority) => slot,
            () = ctx.cancel_token().cancelled() => return Err(ToolError::Cancelled { tool: entry.name.to_string() }),
            () = generation.cancelled() => return Err(ToolError::Cancelled { tool: entry.name.to_string() }),
        };
        meta.queued_ms.store(waited.elapsed().as_millis() as u64, Ordering::Relaxed);
        let Some(slot) = slot else {
            let slot_of = || format!("a slot of queue `{}`", queue.name());
            if by_deadline {
                return Err(caller_deadline_passed(entry, turn + waited.elapsed(), &slot_of()));
            }
            if by_timeout {
                return Err(timeout_spent_waiting(entry, turn, &slot_of()));
            }
            return Err(ToolError::QueueBusy {
                tool: entry.name.to_string(),
                queue: queue.name().to_string(),
                waited: *wait,
            });
        };
        op.hold_queue(queue.name());
        Ok(Some(HeldSlot { _slot: slot, op: op.clone(), queue: queue.name().clone() }))
    }

    /// A slot among the calls its provider has in flight
    /// ([`OrchestratorConfig::max_calls_in_flight`]), taken after the queue's.
    async fn take_provider_slot(
        &self,
        entry: &ToolEntry,
        ctx: &CallContext,
        op: &Arc<Op>,
        meta: &CallMeta,
        generation: &CancellationToken,
    ) -> Result<Option<crate::inflight::InFlightSlot>, ToolError> {
        let max = self.inner.config.max_calls_in_flight;
        // Only providers that make no calls through an orchestrator: an agent, a router, a
        // view or orchestrator served as a provider, `tools__call` and the gateway's own
        // tools may call back into this one, maybe the same provider (sub-agents), and
        // bounded could wait for the slots their own callers hold.
        let bounded = matches!(
            entry.provider.kind(),
            ToolKind::Mcp | ToolKind::Rest | ToolKind::Builtin | ToolKind::External
        );
        if max == 0 || !bounded || entry.passes_on {
            return Ok(None);
        }
        let max_waiting = self.inner.config.max_waiting_calls;
        let limit = self.inner.provider_slots.of(entry.provider.namespace(), max, max_waiting);
        if let Some(slot) = limit.try_take(op) {
            return Ok(Some(slot));
        }
        // A call made inside a call of the same provider (one that calls back) does not
        // wait: the slot it would wait for may be its caller's.
        if op.ancestor_holding(&limit.name).is_some() {
            return Ok(None);
        }
        let tool = || entry.name.to_string();
        let namespace = entry.provider.namespace();
        let Some(wait) = limit.wait(max_waiting) else {
            return Err(ToolError::QueueFull {
                tool: tool(),
                queue: calls_in_flight(max, namespace),
                waiting: max_waiting,
                setting: "`defaults.maxCallsInFlight` (sixteen times as many calls may wait)"
                    .to_owned(),
            });
        };
        let waited = Instant::now();
        // Up to the caller's deadline, else what is left of the tool's timeout after its
        // wait for a queue slot: the call has one deadline, which its waits count against.
        let turn = Duration::from_millis(meta.turn_ms.load(Ordering::Relaxed));
        let queued = turn + Duration::from_millis(meta.queued_ms.load(Ordering::Relaxed));
        let timeout_left = entry.settings.first_wait.saturating_sub(queued);
        let by_deadline = ctx
            .deadline()
            .map(|d| d.saturating_duration_since(waited))
            .filter(|left| *left < timeout_left);
        let permit = tokio::select! {
            permit = tokio::time::timeout(by_deadline.unwrap_or(timeout_left), wait) => permit.ok(),
            () = ctx.cancel_token().cancelled() => return Err(ToolError::Cancelled { tool: tool() }),
            () = generation.cancelled() => return Err(ToolError::Cancelled { tool: tool() }),
        };
        meta.queued_ms.fetch_add(waited.elapsed().as_millis() as u64, Ordering::Relaxed);
        let slot_of =
            || format!("{} (`defaults.maxCallsInFlight`)", calls_in_flight(max, namespace));
        match permit {
            Some(permit) => Ok(Some(crate::inflight::InFlightSlot::held(permit, op, &limit.name))),
            None if by_deadline.is_some() => {
                Err(caller_deadline_passed(entry, queued + waited.elapsed(), &slot_of()))
            }
            None => Err(timeout_spent_waiting(entry, turn, &slot_of())),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn attempts(
        &self,
        entry: &ToolEntry,
        policy: &RetryPolicy,
        arguments: Value,
        ctx: &CallContext,
        op: &Arc<Op>,
        meta: &CallMeta,
        generation: &CancellationToken,
        run_deadline: Option<Instant>,
    ) -> Result<ToolOutput, ToolError> {
        let mut attempt = 0;
        let mut arguments = Some(arguments);
        // One deadline per call: its attempts and the backoff between them share the
        // timeout, counted from when it began to wait for its turn and slots.
        let (queued, turn) = meta.waits();
        let first_start = Instant::now();
        let arrived = first_start.checked_sub(queued).unwrap_or(first_start);
        let call_deadline = crate::later(arrived, call_limit(&entry.settings).0);
        loop {
            attempt += 1;
            meta.attempts.store(attempt, Ordering::Relaxed);
            let last = attempt > policy.max_retries;
            // Only a call that may be retried keeps a copy of its arguments.
            let args = if last { arguments.take() } else { arguments.clone() }.unwrap_or_default();
            let retry = (attempt > 1).then(|| Retry { attempt, earlier: first_start.elapsed() });
            let limits = CallLimits { run_deadline, queued, turn, retry };
            let result = self.timed_call(entry, args, ctx, op, generation, limits).await;
            match result {
                Err(e) if !last && e.is_transient() => {
                    let delay = policy.backoff(attempt);
                    let retry_at = crate::later(Instant::now(), delay);
                    if let Some(limit) =
                        self.retry_too_late(entry, ctx, retry_at, call_deadline, run_deadline)
                    {
                        let attempts = match attempt {
                            1 => "its one attempt".to_owned(),
                            n => format!("all {n} of its attempts"),
                        };
                        tracing::debug!(tool = %entry.name, attempt, "transient failure, not retried: {limit}");
                        return Err(ToolError::DeadlineExceeded {
                            tool: entry.name.to_string(),
                            after: queued + first_start.elapsed(),
                            limit: format!(
                                "{attempts} failed, the last with `{}`, and a retry after its \
                                 backoff ({}) would start after {limit}, so none was made",
                                e.report(),
                                human(delay)
                            ),
                        });
                    }
                    tracing::debug!(tool = %entry.name, attempt, "transient failure, retrying in {delay:?}: {}", e.report());
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = ctx.cancel_token().cancelled() => return Err(ToolError::Cancelled { tool: entry.name.to_string() }),
                        () = generation.cancelled() => return Err(ToolError::Cancelled { tool: entry.name.to_string() }),
                    }
                    // A retry is a call to the provider like the first: it takes a turn
                    // under the rate limit, so that calls never come closer together than
                    // the limit spaces them. One it cannot have (further off than the limit
                    // lets a call wait, or past the call's deadline) is not made, and the
                    // failure stands.
                    if !self.inner.rate_limits.tools.is_empty()
                        || !self.inner.rate_limits.providers.is_empty()
                    {
                        let turn =
                            self.take_turn(entry, ctx, meta, generation, Some(call_deadline)).await;
                        match turn {
                            Ok(turn) => turn.used(),
                            Err(ToolError::Cancelled { tool }) => {
                                return Err(ToolError::Cancelled { tool });
                            }
                            Err(refused) => {
                                tracing::debug!(tool = %entry.name, attempt, "transient failure, not retried: {}", refused.report());
                                return Err(e);
                            }
                        }
                    }
                }
                other => return other,
            }
        }
    }

    /// The limit a retry starting at `retry_at` would start after, in words (the first to
    /// pass of the call's own deadline, its caller's and its run's tool time), or `None`
    /// when the retry may start.
    fn retry_too_late(
        &self,
        entry: &ToolEntry,
        ctx: &CallContext,
        retry_at: Instant,
        call_deadline: Instant,
        run_deadline: Option<Instant>,
    ) -> Option<String> {
        let (limit, setting) = call_limit(&entry.settings);
        let own = (
            call_deadline,
            format!(
                "its time limit ({}, {setting}), which its attempts and the backoff between \
                 them share, passes",
                human(limit)
            ),
        );
        let caller = ctx.deadline().map(|d| (d, "its caller's deadline passes".to_owned()));
        let run = run_deadline
            .map(|d| (d, "the run's tool time (`defaults.maxToolTimeMs`) runs out".to_owned()));
        [Some(own), caller, run]
            .into_iter()
            .flatten()
            .filter(|(deadline, _)| retry_at >= *deadline)
            .min_by_key(|(deadline, _)| *deadline)
            .map(|(_, words)| words)
    }

    /// The provider call, in its own cancellation scope, bounded by the timeout (reset on
    /// progress when configured, never past the hard cap), less the `queued` time the call
    /// waited for its slots and, for a retry, the time its earlier attempts took; a panic
    /// becomes an error.
    async fn timed_call<'c>(
        &self,
        entry: &ToolEntry,
        arguments: Value,
        ctx: &'c CallContext,
        op: &Arc<Op>,
        generation: &CancellationToken,
        limits: CallLimits,
    ) -> Result<ToolOutput, ToolError> {
        let call = |provider_ctx: Cow<'c, CallContext>| async move {
            // Stages after this one may change the output: the caller is answered by them.
            let provider_ctx = provider_ctx.into_owned().with_early_answer(None);
            entry.provider.call(&entry.original, arguments, &provider_ctx).await
        };
        self.timed(entry, ctx, op, generation, limits, false, call).await
    }

    /// Runs `call` (a provider call, given the provider's context) as
    /// [`Orchestrator::timed_call`] describes. `lean`: the provider gets the caller's
    /// context as it is, for a provider call that needs nothing of its own in it (no
    /// cancellation of its own: it stops when dropped; no progress to watch, no sampling
    /// to fall back on), which saves a copy of the context per call.
    #[allow(clippy::too_many_arguments)]
    async fn timed<'c, T, F, Fut>(
        &self,
        entry: &ToolEntry,
        ctx: &'c CallContext,
        op: &Arc<Op>,
        generation: &CancellationToken,
        limits: CallLimits,
        lean: bool,
        call: F,
    ) -> Result<T, ToolError>
    where
        F: FnOnce(Cow<'c, CallContext>) -> Fut,
        Fut: Future<Output = Result<T, ToolError>>,
    {
        let settings = &entry.settings;
        let CallLimits { run_deadline, queued, turn, retry } = limits;
        // A slot that came as the call's time ran out: nothing is left to run in. (A retry
        // starts only before its call's deadline.)
        if retry.is_none() && !queued.is_zero() && queued >= settings.first_wait {
            return Err(timeout_spent_waiting(
                entry,
                turn,
                "a slot (a queue's or `defaults.maxCallsInFlight`)",
            ));
        }
        let start = Instant::now();
        // One deadline per call: its timeout runs from when it began to wait for its slots.
        // The run's tool time left is counted from `start`, when the call got its slots, so
        // it caps the deadlines below directly rather than shortening `timeout`, which runs
        // from `arrived`.
        // A retry's attempt runs within what its earlier attempts left of the deadline.
        let earlier = retry.map_or(Duration::ZERO, |retry| retry.earlier);
        let arrived = start.checked_sub(queued + earlier).unwrap_or(start);
        let timeout = settings.timeout;
        let hard_deadline = {
            let mut hard = crate::later(arrived, call_limit(settings).0);
            // Progress resets never carry a call past its caller's deadline nor its run's
            // tool time.
            for deadline in [ctx.deadline(), run_deadline].into_iter().flatten() {
                hard = hard.min(deadline);
            }
            hard
        };
        // Microseconds from `start` to the last progress report; read only on timeout.
        let last_progress = settings.reset_on_progress.then(|| Arc::new(AtomicU64::new(0)));
        // A token of its own rather than a child of the caller's: linking a child locks the
        // parent's node on creation and on drop. The caller's cancellation is forwarded below.
        // A call that waited for a slot has its provider's wait for an answer (when shorter
        // than its timeout, the cap on the whole call) from when it began to wait, unless it
        // reports progress: watched here, as the provider's own wait starts when it sends.
        let answer_window =
            (retry.is_none() && !queued.is_zero() && settings.first_wait < settings.timeout)
                .then(|| crate::later(arrived, settings.first_wait).min(hard_deadline));
        let last_progress = last_progress.or_else(|| answer_window.map(|_| Arc::default()));
        let (provider_ctx, call_token) =
            if lean && settings.provider_wait.is_none() && answer_window.is_none() {
                (Cow::Borrowed(ctx), None)
            } else {
                let call_token = CancellationToken::new();
                let mut provider_ctx = ctx
                    .clone()
                    .with_cancel(call_token.clone())
                    .with_op(op.clone())
                    .with_deadline(hard_deadline);
                if let Some(wait) = settings.provider_wait {
                    provider_ctx = provider_ctx.with_wait(wait);
                }
                if let Some(sampler) = &self.inner.sampler {
                    provider_ctx = provider_ctx.with_handler(Arc::new(SamplingFallback {
                        caller: ctx.handler().cloned(),
                        sampler: sampler.clone(),
                    }));
                }
                let listens = self.inner.events.receiver_count() > 0;
                if last_progress.is_some() || listens || ctx.progress_sink().is_some() {
                    provider_ctx = provider_ctx.with_progress(self.progress_sink(
                        entry,
                        ctx,
                        op,
                        start,
                        last_progress.as_ref(),
                        listens,
                    ));
                }
                if let Some(sink) = self.log_sink(ctx) {
                    provider_ctx = provider_ctx.with_log(sink);
                }
                (Cow::Owned(provider_ctx), Some(call_token))
            };
        let stop = || {
            if let Some(token) = &call_token {
                token.cancel();
            }
        };
        // Allocated only on the paths that report an error.
        let tool = || entry.name.to_string();
        let call = AssertUnwindSafe(call(provider_ctx)).catch_unwind();
        tokio::pin!(call);
        // In-process tools often finish on their first poll: try once before arming the timer
        // and the cancellation waits (the select below polls the call first all the same).
        if let std::task::Poll::Ready(result) = futures::poll!(&mut call) {
            return match result {
                Ok(result) => result.map_err(|e| by_full_name(entry, e)),
                Err(panic) => {
                    Err(ToolError::Panicked { tool: tool(), message: panic_message(&*panic) })
                }
            };
        }
        // A retry of a call whose progress restarts its timeout has its whole timeout
        // without progress, within the call's hard cap; any other attempt has what is left.
        let first_deadline = match retry {
            Some(_) if settings.reset_on_progress => crate::later(start, timeout),
            _ => crate::later(arrived, timeout),
        }
        .min(hard_deadline);
        let mut deadline =
            answer_window.map_or(first_deadline, |window| window.min(first_deadline));
        loop {
            tokio::select! {
                biased;
                result = &mut call => {
                    return match result {
                        Ok(result) => result.map_err(|e| by_full_name(entry, e)),
                        Err(panic) => Err(ToolError::Panicked { tool: tool(), message: panic_message(&*panic) }),
                    };
                }
                () = ctx.cancel_token().cancelled() => {
                    stop();
                    return Err(ToolError::Cancelled { tool: tool() });
                }
                () = generation.cancelled() => {
                    stop();
                    return Err(ToolError::Cancelled { tool: tool() });
                }
                () = tokio::time::sleep_until(deadline) => {
                    if answer_window.is_some_and(|window| deadline == window && window < first_deadline) {
                        // Progress came: the provider's own wait, restarted by it, times
                        // the call from here, within its timeout.
                        let progressed = last_progress.as_ref().is_some_and(|p| p.load(Ordering::Relaxed) > 0);
                        if progressed {
                            deadline = first_deadline;
                            continue;
                        }
                        stop();
                        let ended = TimedOut { start, queued, turn, deadline, run_deadline, retry };
                        return Err(self.limit_reached(entry, ctx, ended).unwrap_or_else(|| {
                            ToolError::Timeout { tool: tool(), after: start.elapsed(), idle: None }
                        }));
                    }
                    if let Some(progressed) = &last_progress && settings.reset_on_progress {
                        let progressed = Duration::from_micros(progressed.load(Ordering::Relaxed));
                        let extended = crate::later(start + progressed, timeout).min(hard_deadline);
                        if extended > deadline {
                            deadline = extended;
                            continue;
                        }
                    }
                    stop();
                    // Past the first limit, progress had restarted it: the call went that
                    // long without progress (unless the hard cap came first).
                    let restarted = deadline > first_deadline;
                    let idle = (restarted && deadline < hard_deadline).then_some(timeout);
                    if idle.is_none() {
                        let ended = TimedOut { start, queued, turn, deadline, run_deadline, retry };
                        if let Some(error) = self.limit_reached(entry, ctx, ended) {
                            return Err(error);
                        }
                    }
                    return Err(ToolError::Timeout { tool: tool(), after: start.elapsed(), idle });
                }
            }
        }
    }

    /// The error of a call whose deadline passed, naming the limit that set it when that
    /// was not its own timeout alone (the run's remaining `maxToolTimeMs`, its caller's
    /// deadline, or its timeout less its waits for its turn and slots); `None` when it was.
    fn limit_reached(
        &self,
        entry: &ToolEntry,
        ctx: &CallContext,
        ended: TimedOut,
    ) -> Option<ToolError> {
        let TimedOut { start, queued, turn, deadline, run_deadline, retry } = ended;
        let timeout = entry.settings.timeout;
        let tool = entry.name.to_string();
        let ran = start.elapsed();
        let earlier = retry.map_or(Duration::ZERO, |retry| retry.earlier);
        // Which attempt ran out of time, when it was a retry.
        let attempt = retry.map_or(String::new(), |retry| {
            format!(
                "; it was attempt {}, after {} of earlier attempts and backoff",
                retry.attempt,
                human(retry.earlier)
            )
        });
        if let Some(run) = run_deadline.filter(|run| *run <= deadline) {
            let max = self.inner.config.run_budget.max_tool_time.unwrap_or_default();
            // A call that waited took longer than the tool time it spent: say how much.
            let waits = match queued.is_zero() {
                true => String::new(),
                false => format!(
                    " running, after {} (waits are not tool time)",
                    waited_for(queued, turn)
                ),
            };
            return Some(ToolError::DeadlineExceeded {
                tool,
                after: queued + earlier + ran,
                limit: format!(
                    "the run's tool time ran out: {} of its `defaults.maxToolTimeMs` ({}) was \
                     left when the call started{waits}, less than the tool's timeout ({}); \
                     the run's next call fails with budget_exhausted{attempt}",
                    human(run.saturating_duration_since(start)),
                    human(max),
                    human(timeout)
                ),
            });
        }
        if ctx.deadline().is_some_and(|caller| caller <= deadline) {
            return Some(ToolError::DeadlineExceeded {
                tool,
                after: ran + queued + earlier,
                limit: format!(
                    "its caller's deadline passed (it ran {}, after {}){attempt}",
                    human(ran),
                    waited_for(queued, turn)
                ),
            });
        }
        if let Some(Retry { attempt, earlier }) = retry {
            // A retry that reached its call's own deadline: the earlier attempts spent the
            // rest. One that reached its own timeout, which progress restarts, did not.
            let (limit, setting) = call_limit(&entry.settings);
            let arrived = start.checked_sub(queued + earlier).unwrap_or(start);
            if deadline < crate::later(arrived, limit) {
                return None;
            }
            let slot = match queued.is_zero() {
                true => String::new(),
                false => format!(" and {}", waited_for(queued, turn)),
            };
            return Some(ToolError::DeadlineExceeded {
                tool,
                after: queued + earlier + ran,
                limit: format!(
                    "its time limit ({}, {setting}) holds for all of its attempts and the \
                     backoff between them: attempt {attempt} ran {} after {} of earlier \
                     attempts and backoff{slot}",
                    human(limit),
                    human(ran),
                    human(earlier)
                ),
            });
        }
        let arrived = start.checked_sub(queued).unwrap_or(start);
        let timeout = entry.settings.first_wait;
        if !queued.is_zero() && deadline >= crate::later(arrived, timeout) {
            let waited = match turn.is_zero() {
                true => format!(
                    "the {} it waited for a slot (a queue's or `defaults.maxCallsInFlight`)",
                    human(queued)
                ),
                false => format!(
                    "the {} it waited before it ran ({})",
                    human(queued),
                    waited_for(queued, turn)
                ),
            };
            return Some(ToolError::DeadlineExceeded {
                tool,
                after: timeout,
                limit: format!(
                    "its timeout ({}, {TIMEOUT_SETTING}) counts {waited}, so it ran {}",
                    human(timeout),
                    human(ran)
                ),
            });
        }
        None
    }

    fn progress_sink(
        &self,
        entry: &ToolEntry,
        ctx: &CallContext,
        op: &Arc<Op>,
        start: Instant,
        last_progress: Option<&Arc<AtomicU64>>,
        listens: bool,
    ) -> ProgressSink {
        let upstream = ctx.progress_sink().cloned();
        // A progress message is the server's text, passed on to clients and listeners.
        let redactor = (!self.inner.redactor.is_empty()).then(|| self.inner.redactor.clone());
        // Nothing to add: the caller's own sink, rather than one more closure around it.
        if let (None, false, None, Some(upstream)) = (last_progress, listens, &redactor, &upstream)
        {
            return upstream.clone();
        }
        let last = last_progress.cloned();
        let events = listens.then(|| self.inner.events.clone());
        let tool = entry.name.clone();
        let op_id = op.id();
        ProgressSink::new(move |mut progress| {
            if let (Some(redactor), Some(message)) = (&redactor, &mut progress.message) {
                redactor.redact_in_place(message);
            }
            if let Some(last) = &last {
                // At least 1: 0 is no progress yet.
                last.store((start.elapsed().as_micros() as u64).max(1), Ordering::Relaxed);
            }
            if let Some(events) = &events {
                let _ = events.send(ToolEvent::ToolProgress {
                    op_id,
                    tool: tool.to_string(),
                    progress: progress.clone(),
                });
            }
            if let Some(sink) = &upstream {
                sink.report(progress);
            }
        })
    }

    /// The caller's log sink with the configuration's secrets redacted from each line (a
    /// server's text, passed on to clients), when there are secrets and a sink.
    fn log_sink(&self, ctx: &CallContext) -> Option<LogSink> {
        if self.inner.redactor.is_empty() {
            return None;
        }
        let upstream = ctx.log_sink()?.clone();
        let redactor = self.inner.redactor.clone();
        Some(LogSink::new(move |mut message: LogMessage| {
            redactor.redact_json(&mut message.data);
            if let Some(logger) = &mut message.logger {
                redactor.redact_in_place(logger);
            }
            upstream.log(message);
        }))
    }

    /// Structured content over the size cap. A tool that declares no output schema loses
    /// it (its text, capped already, stays). One that does promised content conforming to
    /// its schema, which cannot be cut and keep the promise, and clients refuse a success
    /// without it: the result says the call succeeded and is an error result (which needs
    /// no structured content), the content stored whole for reading by pages (spill mode)
    /// or named by size (truncate mode, or the store failed).
    async fn cap_structured(
        &self,
        entry: &ToolEntry,
        mut output: ToolOutput,
        max: usize,
        ctx: &CallContext,
        meta: &CallMeta,
    ) -> ToolOutput {
        let Some(structured) = output.structured.take() else { return output };
        let bytes = toolmux_core::json_len(&structured);
        output.extras.insert("capped_structured".into(), json!({"bytes": bytes}));
        if entry.spec.output_schema.is_none() {
            return output;
        }
        let mut note = format!(
            "`{}` succeeded, but its structured content is {bytes} bytes, over the \
             {max}-byte cap for structured content, and content promised by an output \
             schema cannot be cut",
            entry.name
        );
        let stored = match self.inner.config.oversize {
            OversizeMode::Spill => {
                let text = self.inner.redactor.redact(&structured.to_string()).into_owned();
                self.inner.store.store(ctx.run_id(), &entry.name, &text).await.ok()
            }
            OversizeMode::Truncate => None,
        };
        match stored {
            Some(stored) => {
                meta.spilled.store(true, Ordering::Relaxed);
                note.push_str(&format!(
                    "; it is stored whole: read it by pages with `output__read` and handle `{}`",
                    stored.handle
                ));
            }
            None => note.push_str(&format!(
                "; raise `defaults.structuredResponseMaxBytes` (or `tools.{}.responseMaxBytes`) \
                 above {bytes} to receive it",
                entry.name
            )),
        }
        output.content.push(ContentPart::Text { text: note });
        output.is_error = true;
        output
    }

    /// Spills or truncates an output over `toolResponseMaxBytes`. An error output is
    /// stored with its head kept ([`Orchestrator::capped_error_text`]): the model must see
    /// why the call failed. `output` has its secrets redacted already
    /// ([`Orchestrator::bounded_output`]): a cut through a secret would leave pieces of it
    /// on either side shorter than the redactor recognises.
    async fn cap_size(
        &self,
        entry: &ToolEntry,
        output: ToolOutput,
        ctx: &CallContext,
        meta: &CallMeta,
    ) -> ToolOutput {
        let max = entry.settings.response_max.unwrap_or(self.inner.config.response_max_bytes);
        let size = textual_len(&output);
        if size <= max {
            return output;
        }
        // A tool that declares an output schema promises structured content conforming to
        // it, and clients check (the official SDKs refuse a result without it): the text a
        // model reads is capped, the structured content passes on unchanged.
        let structured = entry.spec.output_schema.as_ref().and(output.structured.clone());
        // Images, audio and resources' blobs do not count towards the cap (it is on text):
        // they stay, after the capped text, with their annotations.
        let media: Vec<(usize, ContentPart)> = output
            .content
            .iter()
            .enumerate()
            .filter(|(_, p)| crate::media::is_media(p))
            .map(|(i, p)| (i, p.clone()))
            .collect();
        let keep = |mut capped: ToolOutput| {
            if structured.is_some() {
                capped.structured = structured.clone();
            }
            keep_media(&mut capped, &media);
            capped
        };
        // The caller's own bookkeeping (an agent taking the results that arrived in its
        // run's inbox, each given once) is stored whole in either mode, for the caller to
        // read back: cut, what it took out would be lost.
        if self.inner.config.oversize == OversizeMode::Truncate && !ctx.is_outside_budget() {
            return keep(truncate_output(output, max));
        }
        if output.is_error {
            // The head of an error stays in the result: a model must see why the call
            // failed, and a handle alone would not say.
            let text = self.inner.redactor.redact(&output.to_text()).into_owned();
            let bytes = text.len();
            let text = self.capped_error_text(&entry.name, text, max, ctx, meta).await;
            let mut capped = ToolOutput { extras: output.extras, ..ToolOutput::error(text) };
            capped.extras.insert("capped".into(), json!({"bytes": bytes}));
            return keep(capped);
        }
        let text = output.to_text();
        let text = self.inner.redactor.redact(&text);
        match self.inner.store.store(ctx.run_id(), &entry.name, &text).await {
            Ok(stored) => {
                meta.spilled.store(true, Ordering::Relaxed);
                let message = json!({
                    "tool_output": {
                        "handle": stored.handle,
                        "reason": "size_limit_exceeded",
                        "bytes": stored.bytes,
                        "lines": stored.lines,
                        "tokens": estimate_tokens(text.len()),
                    }
                });
                let mut capped = ToolOutput::text(message.to_string());
                capped.extras = output.extras;
                capped.extras.insert("spilled".into(), message["tool_output"].clone());
                keep(capped)
            }
            Err(e) => {
                // With its causes: why a file could not be written is one.
                let e = toolmux_core::error_report(&e);
                tracing::warn!(tool = %entry.name, "output store failed, truncating instead: {e}");
                keep(truncate_output(output, max))
            }
        }
    }
}

/// Whether events carry a tool's arguments and results: not for tools hidden from models
/// (the other side's own tools, such as `external__submit`) nor for tools that work
/// silently (`shown: false`).
/// Resolves at `deadline`; never without one.
async fn at_deadline(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn shown_to_people(annotations: &toolmux_core::ToolAnnotations) -> bool {
    annotations.visible && annotations.shown
}

/// How many tools of the provider of `namespace` the registry holds (named with the
/// namespace or, for a provider served unprefixed, without).
fn tools_of(registry: &Registry, namespace: &str) -> usize {
    registry.entries().filter(|e| e.provider.namespace() == namespace).count()
}

/// Shuts `provider` down within `timeout`, saying what went wrong.
async fn shut_down(provider: &Arc<dyn ToolProvider>, timeout: Duration) {
    match tokio::time::timeout(timeout, provider.shutdown()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(provider = provider.namespace(), "shutdown failed: {}", e.report());
        }
        Err(_) => tracing::warn!(provider = provider.namespace(), "shutdown timed out"),
    }
}

async fn warm_one(
    index: usize,
    provider: Arc<dyn ToolProvider>,
    timeout: Duration,
) -> (usize, Result<(), String>, u64) {
    let started = Instant::now();
    let result = match tokio::time::timeout(timeout, provider.warmup()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.report()),
        Err(_) => {
            Err(format!("did not start within {}s (`startupTimeout`)", timeout.as_secs_f64()))
        }
    };
    (index, result, started.elapsed().as_millis() as u64)
}

async fn list_one(
    provider: Arc<dyn ToolProvider>,
    timeout: Duration,
) -> (String, Result<Vec<ToolSpec>, String>) {
    let result = match tokio::time::timeout(timeout, provider.list_tools()).await {
        Ok(Ok(tools)) => Ok(tools),
        Ok(Err(e)) => Err(format!("listing tools failed: {}", e.report())),
        Err(_) => Err("listing tools timed out".to_owned()),
    };
    (provider.namespace().to_owned(), result)
}

/// Whether `part` is an image: an image part, or an embedded resource whose blob is one.
fn is_image(part: &ContentPart) -> bool {
    match part {
        ContentPart::Image { .. } => true,
        ContentPart::Resource { mime_type: Some(mime), blob: Some(_), .. } => {
            mime.starts_with("image/")
        }
        _ => false,
    }
}

/// Bytes of the parts a model reads as text (media, [`crate::media::is_media`], go to the
/// model as they are).
fn textual_len(output: &ToolOutput) -> usize {
    if output.content.is_empty() {
        return output.byte_len();
    }
    output.content.iter().filter(|p| !crate::media::is_media(p)).map(ContentPart::byte_len).sum()
}

/// Appends `media` (parts of the output before it was capped, by their index there) to
/// `capped`, whose one text part replaced the output's content, and points the parts'
/// `annotations` extras at where they are now; those of parts not kept go.
fn keep_media(capped: &mut ToolOutput, media: &[(usize, ContentPart)]) {
    let before = capped.content.len();
    capped.content.extend(media.iter().map(|(_, part)| part.clone()));
    if let Some(Value::Array(annotated)) = capped.extras.get_mut("annotations") {
        annotated.retain_mut(|entry| {
            let index = entry.get("index").and_then(Value::as_u64);
            let now = index.and_then(|i| media.iter().position(|(was, _)| *was as u64 == i));
            match now {
                Some(position) => {
                    entry["index"] = json!(before + position);
                    true
                }
                None => false,
            }
        });
        if annotated.is_empty() {
            capped.extras.remove("annotations");
        }
    }
}

/// `text` on one line, its line breaks written `\n`, for a log line that a search by
/// line finds whole.
fn one_line(text: &str) -> String {
    text.replace('\r', "\\r").replace('\n', "\\n")
}

/// `output` as one text part within `max` bytes ([`cut_within`]).
fn truncate_output(output: ToolOutput, max: usize) -> ToolOutput {
    let text = output.to_text();
    let (out, omitted) = cut_within(&text, max, &format!("output over {max} bytes"));
    let mut capped =
        ToolOutput { is_error: output.is_error, extras: output.extras, ..ToolOutput::text(out) };
    // `capped`, not `truncated`: tools use `truncated` for their own limits (a file tool's
    // line or match limit), which a cap on top must not overwrite.
    capped.extras.insert("capped".into(), json!({"bytes": text.len(), "omitted": omitted}));
    capped
}

/// `text`, over `max` bytes, cut to `max` bytes with the marker: its head and tail around
/// a marker saying how much was left out and why ([`cut_middle`]). A cap too small for the
/// marker (under about 60 bytes) keeps the text's first `max` bytes and says nothing more:
/// the caller's `capped` extra tells. Returns the text and the bytes omitted.
fn cut_within(text: &str, max: usize, why: &str) -> (String, usize) {
    // The marker is at its longest when the whole text is left out.
    let longest = omitted_marker(text.len(), why).len();
    match max.checked_sub(longest) {
        Some(room) => cut_middle(text, room, why),
        None => {
            let head = floor_char_boundary(text, max);
            (text[..head].to_owned(), text.len() - head)
        }
    }
}

/// The head and the tail of `text`, `max` bytes of them, with a marker saying how much
/// was left out and why; returns the text and the bytes omitted.
fn cut_middle(text: &str, max: usize, why: &str) -> (String, usize) {
    let head_len = floor_char_boundary(text, max / 2);
    let tail_start = ceil_char_boundary(text, text.len() - (max - head_len).min(text.len()));
    let omitted = tail_start.saturating_sub(head_len);
    let mut out = String::with_capacity(max + 64);
    out.push_str(&text[..head_len]);
    out.push_str(&omitted_marker(omitted, why));
    out.push_str(&text[tail_start.max(head_len)..]);
    (out, omitted)
}

fn omitted_marker(omitted: usize, why: &str) -> String {
    format!("\n[... {omitted} {} omitted: {why} ...]\n", bytes_word(omitted))
}

/// `byte` or `bytes`, as `count` needs.
fn bytes_word(count: usize) -> &'static str {
    if count == 1 { "byte" } else { "bytes" }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    while i < s.len() && !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// The error of a call whose `stage` (`before`, `after`) hook `scoped`, the `at`-th of
/// that stage as added, panicked: the hook is named by its place, its tools and its type,
/// so that the message does not blame the tool.
fn hook_panicked<H: ?Sized + fmt::Debug>(
    entry: &ToolEntry,
    stage: &str,
    at: usize,
    scoped: &Scoped<H>,
    panic: &(dyn std::any::Any + Send),
) -> ToolError {
    let kind = debug_type_name(&scoped.hook).map(|name| format!(" {name}")).unwrap_or_default();
    let ran = if stage == "before" { "the tool did not run" } else { "after the tool ran" };
    let message = format!(
        "its {stage}-hook{kind} (#{}, for `{}`) panicked, {ran}: {}; fix the hook or remove it",
        at + 1,
        scoped.pattern,
        panic_message(panic)
    );
    // The hook is the gateway's own stage: its panic is not the provider's fault.
    ToolError::HookPanicked { tool: entry.name.to_string(), message }
}

/// The type name that `value`'s `Debug` starts with (`CommandHook` of `CommandHook { .. }`),
/// read from its first 64 bytes: never its fields, which may hold secrets.
fn debug_type_name(value: &dyn fmt::Debug) -> Option<String> {
    struct Head(String);
    impl fmt::Write for Head {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let room = 64 - self.0.len();
            let end = s.floor_char_boundary(room);
            self.0.push_str(&s[..end]);
            if end < s.len() { Err(fmt::Error) } else { Ok(()) }
        }
    }
    let mut head = Head(String::new());
    // A `Debug` that panics too (the hook is broken already) names nothing.
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        let _ = fmt::write(&mut head, format_args!("{value:?}"));
    }))
    .ok()?;
    let name: String =
        head.0.chars().take_while(|c| c.is_alphanumeric() || matches!(c, '_' | ':')).collect();
    (!name.is_empty()).then_some(name)
}

#[async_trait::async_trait]
impl ToolProvider for Orchestrator {
    fn kind(&self) -> ToolKind {
        ToolKind::Composite
    }

    fn end_run(&self, run_id: &str) {
        Orchestrator::end_run(self, run_id);
    }

    fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(self.tools())
    }

    async fn has_tool(&self, name: &str) -> bool {
        self.registry().get(name).is_some()
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.call_tool(name, arguments, ctx).await
    }

    fn relays(&self, name: &str) -> bool {
        Orchestrator::relays(self, name)
    }

    async fn relay(
        &self,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<Relayed, ToolError> {
        self.relay_tool(name, arguments, ctx, raw_max).await
    }

    async fn warmup(&self) -> Result<(), ToolError> {
        let report = Orchestrator::warmup(self).await;
        match report.problems.iter().find(|p| p.severity == Severity::Error) {
            Some(problem) => Err(ToolError::Unavailable {
                provider: self.inner.namespace.clone(),
                message: problem.message.clone(),
            }),
            None => Ok(()),
        }
    }

    fn instructions(&self) -> Option<String> {
        Orchestrator::instructions(self)
    }

    /// Healthy when every provider is, else naming those that are not.
    fn health(&self) -> Health {
        Health::of_parts(&self.health_by_provider())
    }

    /// Each provider's, in registration order (a composite's parts in its place).
    /// Each provider's own word, but for one that did not start and is being tried again
    /// (or is still starting): not healthy, in words of ours (its error may carry a URL).
    fn health_by_provider(&self) -> Vec<ProviderHealth> {
        let not_started = self.inner.not_started.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.providers()
            .iter()
            .flat_map(|p| {
                if not_started.contains(p.namespace()) {
                    vec![ProviderHealth {
                        namespace: p.namespace().to_owned(),
                        health: Health::unhealthy(
                            "not started yet: tried again in the background; its tools join \
                             when it is up",
                        ),
                    }]
                } else {
                    p.health_by_provider()
                }
            })
            .collect()
    }

    async fn shutdown(&self) -> Result<(), ToolError> {
        self.cleanup().await;
        Ok(())
    }

    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        Some(self.inner.notifier.subscribe())
    }

    async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        Orchestrator::list_prompts(self).await
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        Orchestrator::get_prompt(self, name, arguments, ctx).await
    }

    async fn complete(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        Orchestrator::complete(self, request, ctx).await
    }

    async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        Orchestrator::list_resources(self).await
    }

    async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        Orchestrator::list_resource_templates(self).await
    }

    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        Orchestrator::read_resource(self, uri, ctx).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        Orchestrator::subscribe_resource(self, uri).await
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        Orchestrator::unsubscribe_resource(self, uri).await
    }

    fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        Orchestrator::prompt_list_changes(self)
    }

    fn resource_list_changes(&self) -> Option<ToolListChanges> {
        Orchestrator::resource_list_changes(self)
    }

    fn resource_updates(&self) -> Option<ResourceUpdates> {
        Orchestrator::resource_updates(self)
    }
}

/// `output` with the configuration's secrets redacted wherever it carries text: its text
/// and JSON parts, embedded resources and links, structured content and extras (an API's
/// JSON answer that echoes a key, a `next` link that carries one).
fn redact_output(redactor: &Redactor, output: &mut ToolOutput) {
    for part in &mut output.content {
        redact_part(redactor, part);
    }
    if let Some(structured) = &mut output.structured {
        redactor.redact_json(structured);
    }
    for value in output.extras.values_mut() {
        redactor.redact_json(value);
    }
}

/// `part` with the configuration's secrets redacted from whatever text it carries: a text
/// or JSON part, an embedded resource's URI and text, a link's URI, name and description.
fn redact_part(redactor: &Redactor, part: &mut ContentPart) {
    match part {
        ContentPart::Text { text } => redactor.redact_in_place(text),
        ContentPart::Json { value } => redactor.redact_json(value),
        ContentPart::Resource { uri, text, .. } => {
            redactor.redact_in_place(uri);
            if let Some(text) = text {
                redactor.redact_in_place(text);
            }
        }
        ContentPart::ResourceLink { uri, name, description, .. } => {
            redactor.redact_in_place(uri);
            redactor.redact_in_place(name);
            if let Some(description) = description {
                redactor.redact_in_place(description);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_head_and_tail_on_char_boundaries() {
        let text = format!("{}{}", "é".repeat(100), "z".repeat(100));
        let out = truncate_output(ToolOutput::text(text), 150);
        let t = out.to_text();
        assert!(t.starts_with("éé"));
        assert!(t.ends_with("zz"));
        assert!(t.contains("bytes omitted: output over 150 bytes"));
        assert!(t.len() <= 150, "{t}");
    }

    /// One byte left out is said so, not as "1 bytes".
    #[test]
    fn one_byte_omitted_is_said_in_the_singular() {
        let text = "y".repeat(100);
        let (out, omitted) = (1..200)
            .map(|max| cut_within(&text, max, "why"))
            .find(|(_, omitted)| *omitted == 1)
            .expect("a cap that leaves one byte out");
        assert_eq!(omitted, 1);
        assert!(out.contains("[... 1 byte omitted: why ...]"), "{out}");
    }
}
