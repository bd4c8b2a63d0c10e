//! What the orchestrator is told: defaults, queues, per-provider and per-tool settings,
//! permission rules, aliases, budgets. Plain Rust types; the facade maps the configuration
//! file onto them.

use crate::permission::PermissionRules;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use toolmux_core::{ToolAnnotations, ToolSpec};

/// Everything the pipeline needs to know. Build with [`OrchestratorConfig::default`] and the
/// `with_` methods, or fill the fields.
#[derive(Debug, Clone)]
pub struct OrchestratorConfig {
    /// Timeout of a call when neither the tool nor its provider sets one.
    pub tool_timeout: Duration,
    /// Outputs larger than this many bytes are spilled (or truncated).
    pub response_max_bytes: usize,
    /// What happens to an output over `response_max_bytes`.
    pub oversize: OversizeMode,
    /// Structured content larger than this many bytes (or than the tool's cap, when that
    /// is larger) is not passed on: dropped when the tool declares no output schema, else
    /// stored whole behind an error result. Separate from the text's cap because MCP
    /// clients need the structured content an output schema promises whole, and it is
    /// mostly read by programs, not models; this bound keeps a flood out of their context
    /// all the same.
    pub structured_max_bytes: usize,
    /// Bytes of base64 of the images, audio and embedded resources' blobs one result
    /// passes on (10 MiB by default;
    /// [`ToolSettings::media_max_bytes`] moves it per tool or provider). The text cap does
    /// not count them, as they are not read as text; past this the parts that do not fit
    /// are each replaced by a note naming their type and size, in the order they come.
    pub media_max_bytes: usize,
    /// Calls one provider may have in flight at once (64 by default; 0: no bound), past
    /// which calls wait in order for one to end, up to their deadline, else their
    /// timeout. Named queues bound what the configuration names; this bounds every
    /// provider, so that hundreds of calls at once do not hold hundreds of requests,
    /// processes and results in memory. Only MCP servers, REST tools, the builtin
    /// tools and external tools are bounded: agents, routers, composite providers and the
    /// gateway's own tools may call back into the orchestrator, and could wait for the
    /// slots their callers hold; a call made inside a call of the same provider does not
    /// wait either.
    pub max_calls_in_flight: usize,
    /// Calls that may wait for one of a provider's [`OrchestratorConfig::max_calls_in_flight`]
    /// slots (1,024 by default); a call past them fails at once with `queue_busy`.
    pub max_waiting_calls: usize,
    /// Providers warmed up at once.
    pub init_concurrency: usize,
    /// Time a provider's warmup may take.
    pub startup_timeout: Duration,
    /// Model-facing name length budget.
    pub name_budget: usize,
    /// Named queues.
    pub queues: HashMap<String, QueueConfig>,
    /// Settings per provider namespace.
    pub providers: HashMap<String, ToolSettings>,
    /// Settings per full tool name (win over the provider's).
    pub tools: HashMap<String, ToolSettings>,
    /// What configuration says of tools instead of their providers, by full tool name (or
    /// `{namespace}__{original name}`).
    pub overrides: HashMap<String, ToolOverride>,
    /// Allow / deny / ask rules.
    pub permissions: PermissionRules,
    /// Extra names mapped to canonical full names.
    pub aliases: HashMap<String, String>,
    /// Providers (by namespace) whose tools and prompts keep their own names, without
    /// `{namespace}__`: a gateway in front of one server whose clients know its names.
    /// A name that collides with another provider's is left out with an error.
    pub unprefixed: std::collections::HashSet<String>,
    /// Providers (by namespace) whose tools' annotations are claims of a party the user
    /// has not vouched for, such as an MCP server without `trustAnnotations`: such a tool
    /// is taken as possibly writing whatever its `read_only` says (a server that lies
    /// would skip `ask: ['@write']`), unless configuration's own word on the tool
    /// ([`ToolOverride::read_only`]) says it only reads. The registry's spec of the tool
    /// says so (`read_only` false), so permission rules, selectors anywhere (an agent's
    /// `tools: ['@read']`) and listings agree; the response cache and retries, which a
    /// lie harms only on that server, still follow the claim. Permission rules and an
    /// agent's selectors further judge such a tool destructive and open-world
    /// ([`OrchestratorConfig::judged_annotations`]).
    pub untrusted_annotations: std::collections::HashSet<String>,
    /// Per-run limits on calls and tool time.
    pub run_budget: RunBudgetConfig,
    /// Per-run context-token budget for tool outputs; `None` means unlimited.
    pub context_token_budget: Option<u64>,
    /// Default retry policy for idempotent tools on transient errors (off unless set).
    pub retry: RetryPolicy,
    /// JSON-lines audit log, one line per call.
    pub audit_log: Option<PathBuf>,
    /// Glob patterns of tools that are not listed, to models or to MCP clients, but found
    /// by searching ([`crate::search`]): for providers of so many tools that their schemas
    /// would fill every request's context. They are called as any tool is.
    pub deferred: Vec<String>,
}

impl Default for OrchestratorConfig {
    fn default() -> Self {
        OrchestratorConfig {
            tool_timeout: Duration::from_secs(60),
            response_max_bytes: 100_000,
            structured_max_bytes: 1 << 20,
            media_max_bytes: crate::media::DEFAULT_MEDIA_MAX_BYTES,
            max_calls_in_flight: 64,
            max_waiting_calls: 1024,
            oversize: OversizeMode::Spill,
            init_concurrency: 4,
            startup_timeout: Duration::from_secs(30),
            name_budget: toolmux_core::naming::DEFAULT_BUDGET,
            queues: HashMap::new(),
            providers: HashMap::new(),
            tools: HashMap::new(),
            overrides: HashMap::new(),
            permissions: PermissionRules::default(),
            aliases: HashMap::new(),
            unprefixed: Default::default(),
            untrusted_annotations: Default::default(),
            run_budget: RunBudgetConfig::default(),
            context_token_budget: None,
            retry: RetryPolicy::default(),
            audit_log: None,
            deferred: Vec::new(),
        }
    }
}

impl OrchestratorConfig {
    /// Adds a named queue.
    pub fn with_queue(mut self, name: &str, queue: QueueConfig) -> Self {
        self.queues.insert(name.to_owned(), queue);
        self
    }

    /// Sets the settings of a provider namespace.
    pub fn with_provider_settings(mut self, namespace: &str, settings: ToolSettings) -> Self {
        self.providers.insert(namespace.to_owned(), settings);
        self
    }

    /// Sets the settings of one tool (full name).
    pub fn with_tool_settings(mut self, tool: &str, settings: ToolSettings) -> Self {
        self.tools.insert(tool.to_owned(), settings);
        self
    }

    /// Adds an alias.
    pub fn with_alias(mut self, alias: &str, canonical: &str) -> Self {
        self.aliases.insert(alias.to_owned(), canonical.to_owned());
        self
    }

    /// Sets the default timeout.
    pub fn with_tool_timeout(mut self, timeout: Duration) -> Self {
        self.tool_timeout = timeout;
        self
    }

    /// Sets the size cap.
    pub fn with_response_max_bytes(mut self, bytes: usize) -> Self {
        self.response_max_bytes = bytes;
        self
    }

    /// Sets the permission rules.
    pub fn with_permissions(mut self, rules: PermissionRules) -> Self {
        self.permissions = rules;
        self
    }

    /// Sets the run budget.
    pub fn with_run_budget(mut self, budget: RunBudgetConfig) -> Self {
        self.run_budget = budget;
        self
    }

    /// Sets the context-token budget per run.
    pub fn with_context_token_budget(mut self, tokens: u64) -> Self {
        self.context_token_budget = Some(tokens);
        self
    }

    /// Sets the audit log file.
    pub fn with_audit_log(mut self, path: PathBuf) -> Self {
        self.audit_log = Some(path);
        self
    }

    /// The annotations of `spec`, a tool of the provider `namespace` listed as `name`, as
    /// the permission rules judge them, for every selector of what tools are (`@read`,
    /// `@destructive`, `@openWorld`, `@network`, …) to agree with those rules: the
    /// registry decides permissions by them, and an agent's `tools` selectors pick tools
    /// by them.
    ///
    /// Configuration's word on the tool ([`ToolOverride`], found under `name` or
    /// `{namespace}__{spec.name}`) wins, so `spec` may be the provider's own spec or the
    /// registry's ([`crate::ToolEntry::spec`]); with no such word, a trusted provider's
    /// claims are taken as they are (borrowed). A provider of
    /// [`OrchestratorConfig::untrusted_annotations`] (an MCP server without
    /// `trustAnnotations`) is not believed: its tool is judged as MCP judges a tool that
    /// gives no hints, never read-only, destructive and open-world, whatever it claims,
    /// unless configuration says otherwise of each. (A tool configuration says only reads
    /// is then judged not destructive, as the hints' own default has it.)
    ///
    /// The registry's spec keeps the claims of destruction and reach: the response cache,
    /// retries and an agent's concurrency gate read those, as a lie there harms only the
    /// lying server's own calls.
    ///
    /// ```
    /// use toolmux_core::{ToolAnnotations, ToolSpec};
    /// use toolmux_orchestrator::{OrchestratorConfig, ToolOverride};
    ///
    /// let harmless = ToolAnnotations {
    ///     read_only: true,
    ///     destructive: false,
    ///     open_world: false,
    ///     ..ToolAnnotations::default()
    /// };
    /// let spec = ToolSpec::new("lookup", "claims to be harmless", serde_json::json!({}))
    ///     .with_annotations(harmless.clone());
    /// let mut config = OrchestratorConfig::default();
    /// config.untrusted_annotations.insert("web".to_owned());
    ///
    /// // A trusted provider's claims stand.
    /// assert_eq!(*config.judged_annotations("local", "local__lookup", &spec), harmless);
    /// // An untrusted one's do not.
    /// let judged = config.judged_annotations("web", "web__lookup", &spec);
    /// assert!(!judged.read_only && judged.destructive && judged.open_world);
    /// // Unless the user vouches for the tool.
    /// let vouched = ToolOverride { read_only: Some(true), open_world: Some(false), ..Default::default() };
    /// config.overrides.insert("web__lookup".to_owned(), vouched);
    /// assert_eq!(*config.judged_annotations("web", "web__lookup", &spec), harmless);
    /// ```
    pub fn judged_annotations<'s>(
        &self,
        namespace: &str,
        name: &str,
        spec: &'s ToolSpec,
    ) -> Cow<'s, ToolAnnotations> {
        let said = self.override_for(namespace, name, &spec.name);
        let untrusted = self.untrusted_annotations.contains(namespace);
        if !untrusted && said.is_none() {
            return Cow::Borrowed(&spec.annotations);
        }
        let mut judged = spec.annotations.clone();
        if let Some(said) = said {
            said.apply_to_annotations(&mut judged);
        }
        if untrusted {
            let said = |field: fn(&ToolOverride) -> Option<bool>| said.and_then(field);
            judged.read_only = said(|o| o.read_only).unwrap_or(false);
            judged.destructive = said(|o| o.destructive).unwrap_or(!judged.read_only);
            judged.open_world = said(|o| o.open_world).unwrap_or(true);
        }
        Cow::Owned(judged)
    }

    /// What configuration says of the tool `name` (model-facing) of `namespace`, known to
    /// its provider as `original`: under its full name, else under
    /// `{namespace}__{original}`.
    pub(crate) fn override_for(
        &self,
        namespace: &str,
        name: &str,
        original: &str,
    ) -> Option<&ToolOverride> {
        self.overrides.get(name).or_else(|| self.overrides.get(&format!("{namespace}__{original}")))
    }
}

/// What to do with an output over the size cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OversizeMode {
    /// Store it whole in the output store; the model gets a handle message.
    #[default]
    Spill,
    /// Keep the head and the tail with a marker in between.
    Truncate,
}

/// A named queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Calls running at once.
    pub concurrent: usize,
    /// How long a call waits for a slot before failing as busy.
    pub wait_timeout: Duration,
}

impl QueueConfig {
    /// A queue of `concurrent` slots with a 5-minute wait timeout.
    pub fn new(concurrent: usize) -> Self {
        QueueConfig { concurrent, wait_timeout: Duration::from_secs(300) }
    }

    /// Sets the wait timeout.
    pub fn with_wait_timeout(mut self, wait: Duration) -> Self {
        self.wait_timeout = wait;
        self
    }
}

/// What configuration says of a tool instead of its provider: its title, description and
/// annotations, field by field (what is `None` stays as the provider says). A server's
/// vague description made precise, a tool marked read-only so that its results are cached,
/// or marked to end an agent's turn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolOverride {
    /// The title shown to people.
    pub title: Option<String>,
    /// The description models read.
    pub description: Option<String>,
    /// It changes nothing (its results may be cached).
    pub read_only: Option<bool>,
    /// It may destroy data.
    pub destructive: Option<bool>,
    /// Calling it twice is calling it once.
    pub idempotent: Option<bool>,
    /// It reaches beyond the machine.
    pub open_world: Option<bool>,
    /// Calling it ends an agent's turn.
    pub ends_turn: Option<bool>,
    /// Shown to models (hidden tools can still be called by name).
    pub visible: Option<bool>,
    /// Shown to people: events carry its arguments and results.
    pub shown: Option<bool>,
    /// Metadata merged over the provider's ([`toolmux_core::ToolSpec::meta`]) member by
    /// member; a `null` member removes the provider's.
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ToolOverride {
    /// `spec` as configuration has it.
    pub fn apply(&self, spec: &mut ToolSpec) {
        if let Some(title) = &self.title {
            spec.title = Some(title.clone());
        }
        if let Some(description) = &self.description {
            spec.description = description.clone();
        }
        self.apply_to_annotations(&mut spec.annotations);
        if let Some(said) = &self.meta {
            let meta = std::sync::Arc::make_mut(spec.meta.get_or_insert_with(Default::default));
            for (key, value) in said {
                if value.is_null() {
                    meta.remove(key);
                } else {
                    meta.insert(key.clone(), value.clone());
                }
            }
            if meta.is_empty() {
                spec.meta = None;
            }
        }
    }

    /// `annotations` as configuration has them.
    fn apply_to_annotations(&self, a: &mut ToolAnnotations) {
        let fields = [
            (self.read_only, &mut a.read_only),
            (self.destructive, &mut a.destructive),
            (self.idempotent, &mut a.idempotent),
            (self.open_world, &mut a.open_world),
            (self.ends_turn, &mut a.ends_turn),
            (self.visible, &mut a.visible),
            (self.shown, &mut a.shown),
        ];
        for (set, field) in fields {
            if let Some(value) = set {
                *field = value;
            }
        }
    }
}

/// Settings of a provider or a tool; a tool's win over its provider's, field by field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSettings {
    /// The queue calls wait in.
    pub queue: Option<String>,
    /// Response cache time-to-live.
    pub cache_ttl: Option<Duration>,
    /// Cache even when the tool is not annotated read-only (set on a tool).
    pub cache_force: bool,
    /// Timeout of one call.
    pub timeout: Option<Duration>,
    /// Reset the timeout whenever the tool reports progress.
    pub reset_timeout_on_progress: Option<bool>,
    /// Upper bound of a call's time, progress or not.
    pub max_total_time: Option<Duration>,
    /// Outputs over this many bytes are stored or cut (instead of at
    /// [`OrchestratorConfig::response_max_bytes`]).
    pub response_max_bytes: Option<usize>,
    /// Images and audio over this many bytes of base64 are left out (instead of at
    /// [`OrchestratorConfig::media_max_bytes`]).
    pub media_max_bytes: Option<usize>,
    /// At most so many calls per period: on a tool for that tool, on a provider for all of
    /// its tools together.
    pub rate_limit: Option<RateLimit>,
    /// Retries on transient errors.
    pub retry: Option<RetryPolicy>,
    /// How long a provider that times its own calls waits for an answer to a call that
    /// reports no progress, when no [`ToolSettings::provider_wait`] is passed to it (an MCP
    /// server's `requestTimeoutMs`, `timeout` then being the cap on its whole call). A call
    /// that waited for a queue slot has that much from when it began to wait, the wait
    /// included, unless it reports progress: set it on such a provider so that queued calls
    /// end in time.
    pub answer_wait: Option<Duration>,
    /// How long the provider itself waits for the tool's answer, for a provider that
    /// times its own calls (an MCP server's, restarting the wait at each progress report):
    /// passed in the call's context ([`toolmux_core::CallContext::wait`]).
    pub provider_wait: Option<Duration>,
    /// The tool's calls' priority in its queue, added to the caller's
    /// ([`toolmux_core::CallContext::with_priority`]): a waiting call of a higher one takes
    /// the next free slot first. Default 0.
    pub priority: Option<i32>,
    /// Show its calls to people as they run, through the orchestrator's
    /// [`crate::CallDisplay`] (the facade's `tools.NAME.showInSpace`: in the caller's
    /// space). Default `false`; without a display, nothing is shown.
    pub show_in_space: Option<bool>,
}

/// At most `calls` calls per `per`; a call that would have to wait longer than `wait` for
/// its turn fails at once with [`toolmux_core::ToolError::RateLimited`], saying when to
/// call again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Calls per period (at least 1).
    pub calls: u32,
    /// The period.
    pub per: Duration,
    /// How long a call may wait for its turn (zero: never).
    pub wait: Duration,
}

/// The largest size cap a tool's own hint ([`toolmux_core::ToolSpec::max_result_size`]) may
/// set; a larger hint is held to it, so that a server cannot flood a model's context by
/// saying so. Configured caps are not bounded.
pub const MAX_HINTED_RESPONSE_BYTES: usize = 500_000;

impl ToolSettings {
    /// Puts calls in `queue`.
    pub fn with_queue(mut self, queue: &str) -> Self {
        self.queue = Some(queue.to_owned());
        self
    }

    /// Sets the priority of the tool's calls in its queue.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Caches results for `ttl`.
    pub fn with_cache(mut self, ttl: Duration) -> Self {
        self.cache_ttl = Some(ttl);
        self
    }

    /// Sets the timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Resets the timeout on progress, up to `max_total`.
    pub fn with_progress_reset(mut self, max_total: Duration) -> Self {
        self.reset_timeout_on_progress = Some(true);
        self.max_total_time = Some(max_total);
        self
    }

    /// Sets the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    /// This, with unset fields taken from `fallback`.
    pub fn or(&self, fallback: &ToolSettings) -> ToolSettings {
        ToolSettings {
            queue: self.queue.clone().or_else(|| fallback.queue.clone()),
            cache_ttl: self.cache_ttl.or(fallback.cache_ttl),
            cache_force: self.cache_force,
            timeout: self.timeout.or(fallback.timeout),
            reset_timeout_on_progress: self
                .reset_timeout_on_progress
                .or(fallback.reset_timeout_on_progress),
            max_total_time: self.max_total_time.or(fallback.max_total_time),
            response_max_bytes: self.response_max_bytes.or(fallback.response_max_bytes),
            media_max_bytes: self.media_max_bytes.or(fallback.media_max_bytes),
            rate_limit: self.rate_limit.or(fallback.rate_limit),
            retry: self.retry.clone().or_else(|| fallback.retry.clone()),
            provider_wait: self.provider_wait.or(fallback.provider_wait),
            answer_wait: self.answer_wait.or(fallback.answer_wait),
            priority: self.priority.or(fallback.priority),
            show_in_space: self.show_in_space.or(fallback.show_in_space),
        }
    }
}

/// Limits per run (one agent session, one gateway client).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunBudgetConfig {
    /// Calls that reach a provider.
    pub max_calls: Option<u64>,
    /// Total time spent in providers.
    pub max_tool_time: Option<Duration>,
}

/// Retries with exponential backoff, for idempotent tools on transient errors.
///
/// A call has one deadline, which its retries share: each attempt runs within what its
/// waits, the earlier attempts and the backoff after them left of its timeout, and no
/// retry is made whose backoff would end past that, its caller's deadline or its run's
/// tool time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; 0 disables retrying.
    pub max_retries: u32,
    /// Delay before the first retry; doubled each time.
    pub initial_backoff: Duration,
    /// Cap of the delay.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 0,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// `max_retries` retries with the default backoff.
    pub fn retries(max_retries: u32) -> Self {
        RetryPolicy { max_retries, ..RetryPolicy::default() }
    }

    /// The delay before retry number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial_backoff.saturating_mul(factor).min(self.max_backoff)
    }
}
