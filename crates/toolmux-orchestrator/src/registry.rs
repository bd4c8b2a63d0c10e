//! The registry: every tool of every provider under its model-facing name, with what the
//! pipeline needs precomputed per tool (validator, permission, settings, queue).
//!
//! A registry is an immutable snapshot; a refresh builds a new one and swaps it in, so a
//! call never sees a half-built registry and lookups take no lock beyond one `Arc` clone.

use crate::config::{MAX_HINTED_RESPONSE_BYTES, OrchestratorConfig, ToolSettings};
use crate::permission::{Permission, PermissionRules};
use crate::queue::Queue;
use crate::validate::ArgumentValidator;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use toolmux_core::{ToolProvider, ToolSpec, naming};

/// Tools a provider may show to models before the registry warns that it shows too many
/// (OpenAI's API takes at most 128 tools a request, some clients fewer; models choose
/// worse well before).
pub const MANY_TOOLS: usize = 100;

/// One registered tool.
#[derive(Debug)]
pub struct ToolEntry {
    /// The model-facing name.
    pub name: Arc<str>,
    /// The provider's own name for it.
    pub original: String,
    /// The provider.
    pub provider: Arc<dyn ToolProvider>,
    /// The spec as the provider gave it, with configuration's word on it
    /// ([`crate::ToolOverride`]); a provider of
    /// [`crate::OrchestratorConfig::untrusted_annotations`] that claims the tool only reads
    /// is not believed (`read_only` false) unless configuration says so.
    pub spec: ToolSpec,
    pub(crate) validator: ArgumentValidator,
    /// The tool's output schema, compiled on its first structured result.
    pub(crate) output_validator: Option<ArgumentValidator>,
    pub(crate) permission: Permission,
    pub(crate) settings: ResolvedSettings,
    pub(crate) stats: OnceLock<Arc<crate::accounting::ToolStats>>,
    /// Not listed, found by searching ([`crate::OrchestratorConfig::deferred`]).
    pub deferred: bool,
    /// Only passes a call on to another tool (`tools__call`), which is counted against the
    /// run's budget itself.
    pub(crate) passes_on: bool,
}

impl ToolEntry {
    /// Whether a permission rule denies every call of it (it is then not listed).
    pub fn denied(&self) -> bool {
        matches!(self.permission, Permission::Deny(_))
    }
}

/// Settings of one tool after merging tool, provider and defaults.
#[derive(Debug, Clone)]
pub(crate) struct ResolvedSettings {
    pub queue: Option<(Arc<dyn Queue>, Duration)>,
    /// The tool's priority in its queue ([`ToolSettings::priority`]).
    pub priority: i32,
    /// Set only when the tool may be cached.
    pub cache_ttl: Option<Duration>,
    pub timeout: Duration,
    pub reset_on_progress: bool,
    pub max_total_time: Option<Duration>,
    /// Set only when the tool may be retried: retries configured and the tool idempotent.
    pub retry: Option<crate::config::RetryPolicy>,
    /// The provider's own wait for the answer ([`ToolSettings::provider_wait`]).
    pub provider_wait: Option<Duration>,
    /// How long a call without progress may take, its waits for slots included: the
    /// provider's wait for an answer ([`ToolSettings::provider_wait`], else
    /// [`ToolSettings::answer_wait`]) when shorter than `timeout`, else `timeout`.
    pub first_wait: Duration,
    /// The tool's size cap, when not the configuration's default: set on the tool, hinted by
    /// the tool itself (bounded), or set on its provider, in that order.
    pub response_max: Option<usize>,
    /// The tool's cap on media (images, audio, resource blobs), when not the configuration's default: set on
    /// the tool or on its provider.
    pub media_max: Option<usize>,
    /// Its calls are shown through the orchestrator's display ([`ToolSettings::show_in_space`]).
    pub show_in_space: bool,
}

/// How bad a registry problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The tool or alias was left out; the rest works.
    Warning,
    /// A configuration error: a name collision.
    Error,
}

/// Something wrong found while building the registry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegistryProblem {
    /// How bad.
    pub severity: Severity,
    /// What, naming the tool and its owners.
    pub message: String,
}

/// The tools of one provider as last listed.
#[derive(Debug, Clone)]
pub(crate) struct ProviderTools {
    pub provider: Arc<dyn ToolProvider>,
    pub tools: Vec<ToolSpec>,
    /// When the listing in `tools` started, in the orchestrator's count of listings
    /// (0: none yet): a listing that started earlier never replaces it.
    pub listed: u64,
}

impl ProviderTools {
    /// Keeps `tools`, a listing that started at `started`, unless the tools held come from a
    /// listing that started later (a refresh of every provider that began before a
    /// provider's own `list_changed` refresh ends after it).
    pub fn store(&mut self, started: u64, tools: Vec<ToolSpec>) {
        if started > self.listed {
            self.tools = tools;
            self.listed = started;
        }
    }

    /// Holds `tools`, the tools the provider declares, until any listing of its own comes
    /// (whenever that listing started); whether they were taken (nothing was listed yet).
    pub fn declare(&mut self, tools: Vec<ToolSpec>) -> bool {
        let take = self.listed == 0 && !tools.is_empty();
        if take {
            self.tools = tools;
        }
        take
    }
}

/// An immutable snapshot of all tools.
#[derive(Debug, Default)]
pub struct Registry {
    // foldhash: every call looks its tool up here, and SipHash cost more than the lookup.
    entries: foldhash::HashMap<Arc<str>, Arc<ToolEntry>>,
    order: Vec<Arc<str>>,
    aliases: foldhash::HashMap<String, Arc<str>>,
    problems: Vec<RegistryProblem>,
}

impl Registry {
    /// Builds a registry from the listed tools of each provider, in order.
    pub(crate) fn build(
        providers: &[ProviderTools],
        config: &OrchestratorConfig,
        queues: &HashMap<String, Arc<dyn Queue>>,
    ) -> Registry {
        let mut registry = Registry::default();
        for listed in providers {
            registry.add_provider(listed, config, queues);
        }
        registry.add_aliases(config);
        registry.check_tool_keys(providers, config);
        registry.check_call_rules(config);
        registry
    }

    /// Warns of rules on calls that name tools but can read the calls of none of them (a
    /// command pattern for tools that run no commands): they would silently match nothing.
    fn check_call_rules(&mut self, config: &OrchestratorConfig) {
        let rules: Vec<(&str, String)> =
            config.permissions.call_rules().map(|(list, rule)| (list, rule.to_owned())).collect();
        for (list, rule) in rules {
            let mut named = Vec::new();
            let mut read = false;
            for name in &self.order {
                let Some(entry) = self.entries.get(name) else { continue };
                let kind = entry.provider.subject_kind(&entry.original);
                match PermissionRules::reads_calls_of(&rule, name, &entry.spec.annotations, kind) {
                    Some(true) => read = true,
                    Some(false) => named.push(name.to_string()),
                    None => {}
                }
            }
            if !read && !named.is_empty() {
                named.truncate(3);
                self.warn(format!(
                    "`permissions.{list}: {rule}` matches no call: the tools it names ({}) run no \
                     commands and touch no paths toolmux can check; to match one argument write \
                     `TOOL(argument=glob)`",
                    named.join(", ")
                ));
            }
        }
    }

    /// Warns of `tools` settings that name no tool of a provider that listed its tools: a
    /// misspelled name would otherwise leave a timeout or an override unapplied, silently.
    fn check_tool_keys(&mut self, providers: &[ProviderTools], config: &OrchestratorConfig) {
        let listed: HashMap<&str, &ProviderTools> = providers
            .iter()
            .filter(|p| !p.tools.is_empty())
            .map(|p| (p.provider.namespace(), p))
            .collect();
        let mut keys: Vec<&String> = config.tools.keys().chain(config.overrides.keys()).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            if self.entries.contains_key(key.as_str()) {
                continue;
            }
            let Some((namespace, tool)) = naming::split(key) else { continue };
            let Some(provider) = listed.get(namespace) else { continue };
            if provider.tools.iter().any(|t| t.name == tool) {
                continue;
            }
            let names = self.entries.keys().map(|n| &**n);
            let hint = match crate::suggest::suggest(names, key).first() {
                Some(near) => format!("; did you mean `{near}`?"),
                None => String::new(),
            };
            self.warn(format!(
                "`tools.{key}` names no tool of provider `{namespace}`, so its settings apply to nothing{hint}"
            ));
        }
    }

    fn add_provider(
        &mut self,
        listed: &ProviderTools,
        config: &OrchestratorConfig,
        queues: &HashMap<String, Arc<dyn Queue>>,
    ) {
        let namespace = listed.provider.namespace();
        let mut seen = std::collections::HashSet::new();
        let mut specs = Vec::with_capacity(listed.tools.len());
        for spec in &listed.tools {
            if !seen.insert(spec.name.as_str()) {
                self.warn(format!(
                    "provider `{namespace}` lists tool `{}` twice; the second is left out",
                    spec.name
                ));
                continue;
            }
            if let Err(e) = ArgumentValidator::check_schema(&spec.input_schema) {
                self.warn(format!(
                    "tool `{}` of provider `{namespace}` is left out: its input schema is not valid JSON Schema: {e}",
                    spec.name
                ));
                continue;
            }
            specs.push(spec);
        }
        let local = specs.iter().map(|s| s.name.as_str());
        let names = if config.unprefixed.contains(namespace) {
            naming::fit_all(local, config.name_budget)
        } else {
            match naming::qualify_all(namespace, local, config.name_budget) {
                Ok(names) => names,
                Err(e) => {
                    self.error(format!("provider `{namespace}`: {e}"));
                    return;
                }
            }
        };
        let provider_settings = config.providers.get(namespace).cloned().unwrap_or_default();
        let mut shown = 0usize;
        let mut cached = 0usize;
        let listed_tools = specs.len();
        for ((name, _), spec) in names.into_iter().zip(specs) {
            if let Some(owner) = self.entries.get(name.as_str()) {
                self.error(format!(
                    "tool `{name}` of provider `{namespace}` has the name of a tool of provider `{}` and is left out; list one of them with its namespace",
                    owner.provider.namespace()
                ));
                continue;
            }
            let name: Arc<str> = Arc::from(name);
            let tool_settings = config
                .tools
                .get(&*name)
                .or_else(|| config.tools.get(&format!("{namespace}__{}", spec.name)))
                .cloned()
                .unwrap_or_default();
            let override_ = config.override_for(namespace, &name, &spec.name);
            let overridden = override_.map(|o| {
                let mut spec = spec.clone();
                o.apply(&mut spec);
                spec
            });
            let claimed = overridden.as_ref().unwrap_or(spec);
            // Rules judge an untrusted provider's tool as MCP judges one that gives no hints
            // (it may write, destroy data and reach beyond the machine), but for what
            // configuration says of it: a server that claims `readOnlyHint: true`,
            // `destructiveHint: false` or `openWorldHint: false` does not slip past `@write`,
            // `@destructive`, `@openWorld` or `@network`.
            let judged = config.judged_annotations(namespace, &name, claimed);
            // Of that judgement the spec takes only that the tool may write, so that
            // selectors reading the spec agree on `@read`; the other claims stay:
            // `destructive` is false for a tool that claimed to only read, so the agent's
            // concurrency gate still runs it beside others.
            let distrusted = (judged.read_only != claimed.annotations.read_only).then(|| {
                let mut spec = claimed.clone();
                spec.annotations.read_only = judged.read_only;
                spec
            });
            let spec = distrusted.as_ref().unwrap_or(claimed);
            let explicit = tool_settings.response_max_bytes;
            let explicit_timeout = tool_settings.timeout.is_some();
            // The cache and retries follow the claim: a tool that lies harms only its own
            // server's results by them.
            let mut settings =
                self.resolve(&name, claimed, tool_settings.or(&provider_settings), config, queues);
            // A tool that ends its own calls (a command at its `timeout`, with the output so
            // far) is waited for that long, unless its own settings say otherwise.
            if let Some(limit) = spec.time_limit.filter(|_| !explicit_timeout) {
                settings.timeout = settings.timeout.max(limit);
                settings.max_total_time = settings.max_total_time.map(|total| total.max(limit));
            }
            settings.response_max = explicit
                .or(spec.max_result_size.map(|hint| hint.min(MAX_HINTED_RESPONSE_BYTES)))
                .or(provider_settings.response_max_bytes);
            let passes_on = namespace == crate::search::NAMESPACE
                && spec.name == "call"
                && listed.provider.kind() == toolmux_core::ToolKind::Internal;
            let kind = listed.provider.subject_kind(&spec.name);
            let permission = match config.permissions.decide_for(&name, &judged, kind) {
                // The tool it passes the call on to is asked for itself.
                Permission::Ask(_) if passes_on => Permission::Allow,
                permission => permission,
            };
            let entry = ToolEntry {
                name: name.clone(),
                original: spec.name.clone(),
                provider: listed.provider.clone(),
                spec: spec.clone(),
                validator: ArgumentValidator::new(spec.input_schema.clone()),
                output_validator: spec
                    .output_schema
                    .clone()
                    .map(|schema| ArgumentValidator::new(schema).for_output()),
                permission,
                settings,
                stats: OnceLock::new(),
                deferred: config.deferred.iter().any(|g| crate::glob_match(g, &name)),
                passes_on,
            };
            if !entry.deferred && entry.spec.annotations.visible {
                shown += 1;
            }
            cached += usize::from(entry.settings.cache_ttl.is_some());
            self.order.push(name.clone());
            self.entries.insert(name, Arc::new(entry));
        }
        // A provider's `cache` keeps the results of its read-only tools only: one whose
        // tools do not say they only read would silently cache nothing.
        if provider_settings.cache_ttl.is_some_and(|ttl| !ttl.is_zero())
            && cached == 0
            && listed_tools > 0
        {
            self.warn(format!(
                "provider `{namespace}` has `cache`, but none of its tools says it only reads \
                 (`readOnlyHint`), so none is cached (a tool that changes something must run \
                 each time): set `cache` on the tools whose results may be reused \
                 (`tools: {{{namespace}__NAME: {{cache: MS}}}}`)"
            ));
        }
        // An OpenAPI import warns by itself, at its own `maxTools`.
        if shown > MANY_TOOLS && listed.provider.kind() != toolmux_core::ToolKind::Rest {
            self.warn(format!(
                "provider `{namespace}` shows {shown} tools to models, whose choices get worse and \
                 whose context fills with that many schemas: defer them to be found by searching \
                 (`toolSearch: {{defer: ['{namespace}__*']}}`), or list fewer"
            ));
        }
    }

    fn resolve(
        &mut self,
        name: &str,
        spec: &ToolSpec,
        settings: ToolSettings,
        config: &OrchestratorConfig,
        queues: &HashMap<String, Arc<dyn Queue>>,
    ) -> ResolvedSettings {
        let queue = settings.queue.as_deref().and_then(|q| {
            let found = queues.get(q).map(|queue| {
                let wait = config.queues.get(q).map_or(Duration::from_secs(300), |c| c.wait_timeout);
                (queue.clone(), wait)
            });
            if found.is_none() {
                self.warn(format!(
                    "tool `{name}` names queue `{q}`, which is not configured under `queues`; it runs unqueued"
                ));
            }
            found
        });
        // Read-only tools only: an idempotent one (`PUT`, `fs__write`) repeated changes
        // nothing more, but answered from the cache it does not run at all, so `set A`,
        // `set B`, `set A` would leave B.
        let cacheable = settings.cache_force
            || spec.annotations.read_only
            || config.tools.get(name).is_some_and(|t| t.cache_ttl.is_some());
        let timeout = settings.timeout.unwrap_or(config.tool_timeout);
        ResolvedSettings {
            queue,
            priority: settings.priority.unwrap_or(0),
            cache_ttl: settings.cache_ttl.filter(|ttl| cacheable && !ttl.is_zero()),
            timeout,
            reset_on_progress: settings.reset_timeout_on_progress.unwrap_or(false),
            max_total_time: settings.max_total_time,
            // Only tools that a second run cannot harm are retried, unless the tool's own
            // settings ask (the user says a retry is safe for this one).
            retry: Some(settings.retry.unwrap_or_else(|| config.retry.clone())).filter(|p| {
                p.max_retries > 0
                    && (spec.annotations.idempotent
                        || spec.annotations.read_only
                        || config.tools.get(name).is_some_and(|t| t.retry.is_some()))
            }),
            response_max: None,
            media_max: settings.media_max_bytes,
            show_in_space: settings.show_in_space.unwrap_or(false),
            provider_wait: settings.provider_wait,
            first_wait: settings
                .provider_wait
                .or(settings.answer_wait)
                .map_or(timeout, |wait| wait.min(timeout)),
        }
    }

    fn add_aliases(&mut self, config: &OrchestratorConfig) {
        let mut aliases: Vec<(&String, &String)> = config.aliases.iter().collect();
        aliases.sort();
        for (alias, target) in aliases {
            if let Some(owner) = self.entries.get(alias.as_str()) {
                self.error(format!(
                    "alias `{alias}` (configuration `aliases`) collides with tool `{alias}` of provider `{}`; rename the alias",
                    owner.provider.namespace()
                ));
                continue;
            }
            match self.entries.get_key_value(target.as_str()) {
                Some((name, _)) => {
                    self.aliases.insert(alias.clone(), name.clone());
                }
                None => self.warn(format!(
                    "alias `{alias}` points to `{target}`, which no provider offers; it is left out"
                )),
            }
        }
    }

    fn warn(&mut self, message: String) {
        tracing::warn!("{message}");
        self.problems.push(RegistryProblem { severity: Severity::Warning, message });
    }

    fn error(&mut self, message: String) {
        // Reported with the warmup's problems (the command line prints them once); the
        // log has it at warning level so that it is not printed twice.
        tracing::warn!("{message}");
        self.problems.push(RegistryProblem { severity: Severity::Error, message });
    }

    /// The entry of a full name or alias, or of `{namespace}__{name}` with the tool's own
    /// name as its provider gave it (`names__a.b` for the tool listed as `names__a_b_…`,
    /// whose name had to change), as configuration keys may name it.
    pub fn get(&self, name: &str) -> Option<&Arc<ToolEntry>> {
        if let Some(entry) = self.entries.get(name) {
            return Some(entry);
        }
        if let Some(entry) = self.aliases.get(name).and_then(|target| self.entries.get(target)) {
            return Some(entry);
        }
        let (namespace, original) = name.split_once("__")?;
        self.order
            .iter()
            .filter_map(|n| self.entries.get(n))
            .find(|entry| &*entry.original == original && entry.provider.namespace() == namespace)
    }

    /// Full names, in provider order then listing order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|n| &**n)
    }

    /// Entries, in order.
    pub fn entries(&self) -> impl Iterator<Item = &Arc<ToolEntry>> {
        self.order.iter().filter_map(|n| self.entries.get(n))
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Problems found while building.
    pub fn problems(&self) -> &[RegistryProblem] {
        &self.problems
    }
}
