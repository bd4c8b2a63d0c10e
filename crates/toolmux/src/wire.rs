//! From a loaded configuration to one orchestrator with every configured provider.

use crate::ToolmuxError;
use crate::config::{Loaded, Oversize, RateLimitEntry, ToolEntry};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::ToolProvider;
use toolmux_orchestrator::search;
use toolmux_orchestrator::store::{DirectoryStore, OutputReader, OutputStore};
use toolmux_orchestrator::{
    CommandHook, HookEvent, Orchestrator, OrchestratorConfig, OversizeMode, PermissionRules,
    QueueConfig, RateLimit, RetryPolicy, RunBudgetConfig, ToolMatcher, ToolOverride, ToolSettings,
};

/// Every configured tool behind one orchestrator, plus where its outputs and statistics
/// live.
#[derive(Debug, Clone)]
pub struct Toolmux {
    orchestrator: Orchestrator,
    #[cfg(feature = "agent")]
    agents: Option<toolmux_agent::Agents>,
    output_store: Arc<dyn OutputStore>,
    output_dir: PathBuf,
    stats_file: Option<PathBuf>,
    /// The last failure to read or save the statistics file, told already: the same one
    /// again is not (a `tools call` would say it twice, a server at each save).
    stats_told: Arc<std::sync::Mutex<Option<String>>>,
    warnings: Vec<String>,
    /// The MCP servers built, kept so that a rebuild can take over those left unchanged.
    #[cfg(feature = "mcp")]
    mcp_servers: Vec<BuiltServer>,
    /// The names of the MCP servers taken over from the previous build.
    reused: Vec<String>,
    /// Where the external tools' calls wait, kept by a rebuild that keeps its settings.
    #[cfg(feature = "external")]
    pending: Option<Arc<dyn toolmux_external::PendingStore>>,
    /// What `pending` was made from: a rebuild whose settings differ makes a new one.
    #[cfg(feature = "external")]
    pending_from: Option<PendingFrom>,
    /// The spaces, kept by a rebuild (those in memory would be lost otherwise).
    #[cfg(feature = "external")]
    spaces: Option<toolmux_external::Spaces>,
    /// The OpenTelemetry export of this build's calls (`telemetry.otlp`).
    #[cfg(feature = "otel")]
    otel: Option<Arc<toolmux_otel::Exporter>>,
    /// Where `toolmux serve --http` records its MCP sessions, for the other replicas of
    /// `backend.redis` to forward their requests to it.
    #[cfg(all(feature = "mcp", feature = "redis"))]
    session_affinity: Option<toolmux_mcp::server::SessionAffinity>,
}

/// What a pending-call store is made from: its folder (none: in memory, or Redis), its
/// times to live, whether Redis keeps it.
#[cfg(feature = "external")]
#[derive(Debug, Clone, PartialEq)]
struct PendingFrom {
    dir: Option<PathBuf>,
    ttls: (Duration, Duration),
    max_inboxes: usize,
    redis: Option<String>,
}

#[cfg(feature = "external")]
impl PendingFrom {
    fn of(loaded: &Loaded) -> PendingFrom {
        #[cfg(feature = "redis")]
        let redis =
            loaded.config.backend.as_ref().and_then(|b| b.redis.as_ref()).map(|r| r.url.clone());
        #[cfg(not(feature = "redis"))]
        let redis = None;
        PendingFrom {
            dir: loaded.external_calls_dir(),
            ttls: external_ttls(loaded),
            max_inboxes: external_max_inboxes(loaded),
            redis,
        }
    }
}

/// An MCP server's provider and everything it was built from.
#[cfg(feature = "mcp")]
#[derive(Debug, Clone)]
struct BuiltServer {
    name: String,
    config: toolmux_mcp::McpServerConfig,
    /// `perSession`: at most this many sessions, each closed after this idle time.
    per_session: Option<(usize, Duration)>,
    provider: Arc<dyn ToolProvider>,
}

impl Toolmux {
    /// Builds every provider the configuration names and the orchestrator around them.
    /// Nothing is started yet: call [`Orchestrator::warmup`] on [`Toolmux::orchestrator`].
    ///
    /// Statistics saved by earlier runs are loaded, so that the counts keep growing.
    pub async fn build(loaded: &Loaded) -> Result<Toolmux, ToolmuxError> {
        Toolmux::build_only(loaded, &|_| true).await
    }

    /// The MCP server `name` of `mcpServers` alone, not started: for commands about one
    /// server (`toolmux mcp login`). An unknown name is a configuration error that lists
    /// the configured ones.
    #[cfg(feature = "mcp")]
    pub fn mcp_server(
        loaded: &Loaded,
        name: &str,
    ) -> Result<toolmux_mcp::McpProvider, ToolmuxError> {
        let file = loaded.source_name();
        let Some(entry) = loaded.config.mcp_servers.get(name) else {
            let known: Vec<&str> = loaded.config.mcp_servers.keys().map(String::as_str).collect();
            let known = if known.is_empty() {
                "none is configured".to_owned()
            } else {
                format!("configured: {}", known.join(", "))
            };
            return Err(ToolmuxError::config(file, format!("no mcp server `{name}` ({known})")));
        };
        let mut secrets = loaded.secrets.clone();
        let server = mcp::server_config(loaded, name, entry, &mut secrets)?;
        toolmux_mcp::McpProvider::new(namespace_for(name), server)
            .map_err(|e| ToolmuxError::config(file, e.to_string()))
    }

    /// Like [`Toolmux::build`], with only the providers whose namespace `keep` accepts:
    /// one call need not start every server. Settings of the others are kept, unused.
    pub async fn build_only(
        loaded: &Loaded,
        keep: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Toolmux, ToolmuxError> {
        Toolmux::build_reusing(loaded, keep, None).await
    }

    /// Builds from `loaded` as [`Toolmux::build`] does, but takes over from `previous`
    /// every MCP server whose configuration (after `${VAR}` expansion) did not change,
    /// running as it is: a reload restarts only what changed. Shut `previous` down with
    /// [`Toolmux::cleanup_replaced`], which leaves those servers running.
    pub async fn rebuild(loaded: &Loaded, previous: &Toolmux) -> Result<Toolmux, ToolmuxError> {
        Toolmux::build_reusing(loaded, &|_| true, Some(previous)).await
    }

    /// The MCP servers [`Toolmux::rebuild`] took over from the previous build.
    pub fn reused_servers(&self) -> &[String] {
        &self.reused
    }

    /// Shuts down this (replaced) build, as [`Orchestrator::cleanup`] does, except the
    /// providers `successor` took over.
    pub async fn cleanup_replaced(&self, successor: &Toolmux) {
        #[cfg(feature = "mcp")]
        let taken = |provider: &Arc<dyn ToolProvider>| {
            let ptr = Arc::as_ptr(provider).cast::<()>();
            successor.mcp_servers.iter().any(|s| Arc::as_ptr(&s.provider).cast::<()>() == ptr)
        };
        #[cfg(not(feature = "mcp"))]
        let taken = |_: &Arc<dyn ToolProvider>| {
            let _ = successor;
            false
        };
        self.orchestrator.cleanup_except(&taken).await;
        self.stop_export().await;
    }

    /// Sends what the OpenTelemetry export still holds and stops it.
    async fn stop_export(&self) {
        #[cfg(feature = "otel")]
        if let Some(otel) = &self.otel {
            otel.shutdown().await;
        }
    }

    // Without some provider features, some of the lists below are never added to.
    #[cfg_attr(
        not(all(
            feature = "fs",
            feature = "mcp",
            feature = "rest",
            feature = "external",
            feature = "agent"
        )),
        allow(unused_mut, unused_variables)
    )]
    async fn build_reusing(
        loaded: &Loaded,
        keep: &(dyn Fn(&str) -> bool + Sync),
        previous: Option<&Toolmux>,
    ) -> Result<Toolmux, ToolmuxError> {
        let file = loaded.source_name();
        #[cfg(feature = "mcp")]
        let mut mcp_servers: Vec<BuiltServer> = Vec::new();
        let mut reused: Vec<String> = Vec::new();
        #[cfg(feature = "mcp")]
        toolmux_mcp::server::check_task_tools(&loaded.config.serve.task_tools)
            .map_err(|e| ToolmuxError::config(file, format!("serve.taskTools: {e}")))?;
        #[cfg(feature = "mcp")]
        loaded
            .config
            .serve
            .client_profile()
            .map_err(|e| ToolmuxError::config(file, format!("serve.client: {e}")))?;
        check_own_schemas(loaded).map_err(|e| ToolmuxError::config(file, e))?;
        #[cfg(feature = "external")]
        for (key, ms) in [
            ("externalCallTtl", loaded.config.defaults.external_call_ttl),
            ("externalResultTtl", loaded.config.defaults.external_result_ttl),
        ] {
            if ms == Some(0) {
                return Err(ToolmuxError::config(
                    file,
                    format!(
                        "defaults.{key}: 0 would expire everything at once; give milliseconds \
                         (by default an hour for calls, a day for results)"
                    ),
                ));
            }
        }
        #[cfg(feature = "external")]
        if loaded.config.defaults.external_max_inboxes == Some(0) {
            return Err(ToolmuxError::config(
                file,
                "defaults.externalMaxInboxes: 0 would refuse every result; give at least 1 \
                 (by default 10000)",
            ));
        }
        if loaded.config.defaults.output_dir.is_none() {
            own_private_dir(&loaded.output_dir()).map_err(|e| ToolmuxError::config(file, e))?;
        }
        #[cfg(feature = "mcp")]
        check_holder_tools(loaded)
            .map_err(|e| ToolmuxError::config(file, format!("serve.holderTools: {e}")))?;
        let mut warnings = loaded.warnings.clone();
        let mut secrets = loaded.secrets.clone();
        // What the credentials look like on the wire (a basic-auth header's base64), so
        // that an API echoing its request is redacted too.
        #[cfg(feature = "rest")]
        secrets.extend(loaded.config.openapi.values().flat_map(|o| o.auth.values()).flat_map(
            |c| {
                let expanded = [&c.api_key, &c.token, &c.password, &c.client_secret];
                // Only credentials that hold a secret: a literal in the file is no secret.
                let secret = expanded
                    .into_iter()
                    .flatten()
                    .any(|v| loaded.secrets.iter().any(|s| s.len() >= 4 && v.contains(s.as_str())));
                if secret { c.derived_secrets() } else { Vec::new() }
            },
        ));
        let mut config = orchestrator_config(loaded)?;
        // Aliases of tools whose provider is left out here (`tools call` starts only the
        // one it calls) are not this build's: no warning that nothing offers them.
        config.aliases.retain(|_, target| match target.split_once("__") {
            Some((namespace, _)) => keep(namespace),
            None => true,
        });
        #[cfg(feature = "otel")]
        let otel = telemetry(loaded, &mut secrets)?;
        let mut providers: Vec<Arc<dyn ToolProvider>> = Vec::new();
        #[cfg(feature = "redis")]
        let backend = redis_backend(loaded, &mut warnings).await?;

        #[cfg(feature = "fs")]
        if let Some(fs) = loaded.config.fs.as_ref().filter(|fs| fs.enabled && keep("fs")) {
            // `fs__bash` and `fs__exec` declare how long their commands may run
            // (`ToolSpec::time_limit`); the pipeline waits that long for them.
            providers.push(fs_provider(loaded, fs, config.response_max_bytes)?);
        }
        #[cfg(feature = "fs")]
        if !loaded.config.command_tools.is_empty() && keep(toolmux_fs::COMMANDS_NAMESPACE) {
            // In the project's folder, kept from what `fs__bash`'s commands are kept from,
            // saving binary output where bash saves its own.
            let default = crate::config::FsSection::default();
            let fs = loaded.config.fs.as_ref().unwrap_or(&default);
            let files = guarded_files(loaded, fs, loaded.base_dir.clone());
            let tools = toolmux_fs::CommandTools::new(&loaded.config.command_tools, &files)
                .map_err(|e| ToolmuxError::config(file, e.to_string()))?;
            providers.push(Arc::new(tools));
        }
        #[cfg(feature = "mcp")]
        let mut keys_of_namespaces = std::collections::BTreeMap::<String, &str>::new();
        #[cfg(feature = "mcp")]
        for (name, entry) in &loaded.config.mcp_servers {
            let namespace = namespace_for(name);
            if entry.enabled == Some(false) || !keep(&namespace) {
                // Not started here, but its env file's credentials may still reach what
                // other tools return (a file read, a command's output).
                secrets.extend(mcp::env_file_secrets(loaded, entry));
                continue;
            }
            // What is said of the server names the file it is written in.
            let file = loaded.file_of("mcpServers", name);
            // Two keys the namespace rule makes one (`my_server`, `my-server`) would
            // otherwise meet in the orchestrator, which knows neither key.
            if let Some(other) = keys_of_namespaces.insert(namespace.clone(), name) {
                return Err(mcp::same_namespace(loaded, other, name, &namespace));
            }
            if !entry.trust_annotations {
                config.untrusted_annotations.insert(namespace.clone());
            }
            if entry.namespaced == Some(false) {
                config.unprefixed.insert(namespace.clone());
            } else if namespace != *name {
                warnings.push(format!(
                    "{file}: the tools of mcp server `{name}` are named `{namespace}__*`"
                ));
            }
            let server = mcp::server_config(loaded, name, entry, &mut secrets)?;
            let per_session = if entry.per_session {
                let max =
                    entry.max_sessions.map_or(toolmux_mcp::DEFAULT_MAX_SESSIONS, |n| n as usize);
                let idle = entry
                    .session_idle_ms
                    .map_or(toolmux_mcp::DEFAULT_SESSION_IDLE, Duration::from_millis);
                if max == 0 {
                    return Err(ToolmuxError::config(
                        file,
                        format!("mcpServers.{name}.maxSessions: must be at least 1"),
                    ));
                }
                Some((max, idle))
            } else {
                None
            };
            let unchanged = previous.and_then(|previous| {
                previous.mcp_servers.iter().find(|built| {
                    built.name == *name
                        && built.config == server
                        && built.per_session == per_session
                })
            });
            let provider: Arc<dyn ToolProvider> = match (unchanged, per_session) {
                (Some(built), _) => {
                    reused.push(name.clone());
                    built.provider.clone()
                }
                (None, Some((max, idle))) => Arc::new(
                    toolmux_mcp::PerSessionProvider::new(
                        namespace.clone(),
                        server.clone(),
                        max,
                        idle,
                    )
                    .map_err(|e| ToolmuxError::config(file, e.to_string()))?,
                ),
                (None, None) => Arc::new(
                    toolmux_mcp::McpProvider::new(namespace.clone(), server.clone())
                        .map_err(|e| ToolmuxError::config(file, e.to_string()))?,
                ),
            };
            mcp_servers.push(BuiltServer {
                name: name.clone(),
                config: server,
                per_session,
                provider: provider.clone(),
            });
            mcp::time_tools(loaded, entry, &namespace, &mut config.tools);
            let settings = ToolSettings {
                queue: entry.queue.clone(),
                cache_ttl: entry.cache.map(Duration::from_millis),
                timeout: Some(mcp::call_limit(loaded, entry)),
                // The server's wait for an answer, which its calls' waits for a slot count
                // against: the pipeline's `timeout` above is only the cap on a whole call.
                answer_wait: Some(Duration::from_millis(mcp::wait_ms(loaded, entry))),
                rate_limit: rate_limit(loaded, &format!("mcpServers.{name}"), entry.rate_limit)?,
                ..ToolSettings::default()
            };
            config.providers.insert(namespace, settings);
            providers.push(provider);
        }
        #[cfg(feature = "rest")]
        rest::providers(loaded, keep, &mut config, &mut providers, &mut warnings).await?;
        #[cfg(feature = "external")]
        let mut pending = None;
        #[cfg(feature = "external")]
        let mut pending_from = None;
        #[cfg(all(feature = "external", feature = "redis"))]
        let shared_spaces = backend.as_ref().map(|b| {
            Arc::new(b.space_storage()) as Arc<dyn toolmux_external::spaces::SpaceStorage>
        });
        #[cfg(all(feature = "external", not(feature = "redis")))]
        let shared_spaces: Option<Arc<dyn toolmux_external::spaces::SpaceStorage>> = None;
        #[cfg(feature = "external")]
        let spaces =
            spaces(loaded, previous.and_then(|p| p.spaces.clone()), shared_spaces, &secrets)?;
        #[cfg(feature = "external")]
        let shows_in_space = shown_in_space(loaded, spaces.is_some())?;
        #[cfg(not(feature = "external"))]
        shown_in_space(loaded, false)?;
        #[cfg(feature = "external")]
        if let Some((spaces, history)) = &spaces
            && keep(toolmux_external::GATEWAY_NAMESPACE)
        {
            let gateway = toolmux_external::GatewayProvider::new(spaces.clone());
            // Its long polls declare the longest poll as their time limit.
            providers.push(Arc::new(gateway.with_history(*history)));
        }
        #[cfg(feature = "external")]
        if !loaded.config.external_tools.is_empty() && keep(toolmux_external::NAMESPACE) {
            #[cfg(feature = "redis")]
            let store = backend.as_ref().map(|b| {
                let (calls, results) = external_ttls(loaded);
                let store = b.pending_store().with_ttl(calls, results);
                Arc::new(store.with_max_inboxes(external_max_inboxes(loaded)))
                    as Arc<dyn toolmux_external::PendingStore>
            });
            #[cfg(not(feature = "redis"))]
            let store = None;
            // A reload keeps the calls waiting in this process: results submitted through
            // the new provider reach the calls still running in the old one. Unless where
            // they are kept, or for how long, changed: then the new settings hold.
            let from = PendingFrom::of(loaded);
            let kept = previous.filter(|p| p.pending_from.as_ref() == Some(&from));
            let store = store.or_else(|| kept.and_then(|p| p.pending.clone()));
            pending_from = Some(from);
            let shared = spaces.as_ref().map(|(spaces, _)| spaces.clone());
            let (provider, store) = external_provider(loaded, store, shared)?;
            providers.push(provider);
            pending = Some(store);
        }

        #[cfg(feature = "agent")]
        let models = models(loaded)?;
        #[cfg(feature = "agent")]
        let agents = match agents(loaded, &models, &mut config)? {
            Some(agents) if keep(toolmux_agent::NAMESPACE) => {
                providers.push(agents.provider());
                Some(agents)
            }
            other => other,
        };

        let output_dir = loaded.output_dir();
        let retention = match loaded.config.defaults.output_retention {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => Some(toolmux_orchestrator::store::DEFAULT_RETENTION),
        };
        let directory = DirectoryStore::new(output_dir.clone()).with_retention(retention);
        // Outputs of earlier runs past `outputRetention` go now; storing sweeps hourly.
        if let Err(e) = directory.sweep() {
            tracing::warn!("removing old outputs: {}", toolmux_core::error_report(&e));
        }
        let store: Arc<dyn OutputStore> = Arc::new(directory);
        // With Redis, outputs are read back through any replica.
        #[cfg(feature = "redis")]
        let store: Arc<dyn OutputStore> = match &backend {
            Some(backend) => Arc::new(backend.output_store()),
            None => store,
        };
        // Outputs over the size cap are stored whole: the model reads them on with
        // `output__read` (not needed when they are cut instead).
        if config.oversize != OversizeMode::Truncate && keep(OutputReader::NAMESPACE) {
            providers.push(Arc::new(OutputReader::new(store.clone(), config.response_max_bytes)));
        }
        // Deferred tools are found with `tools__search` and called with `tools__call`.
        let search = (!config.deferred.is_empty() && keep(search::NAMESPACE)).then(|| {
            // `tools__call` only passes the call on: the tool called keeps its own timeout
            // and size cap, so this one sets neither.
            let passing_on = ToolSettings {
                timeout: Some(Duration::from_secs(7 * 24 * 3600)),
                response_max_bytes: Some(usize::MAX),
                ..ToolSettings::default()
            };
            config.tools.entry(search::CALL.to_owned()).or_insert(passing_on);
            let search = Arc::new(search::ToolSearch::new());
            providers.push(search.clone());
            search
        });
        let orchestrator = Orchestrator::builder(config).output_store(store.clone());
        #[cfg(feature = "redis")]
        let orchestrator = match &backend {
            Some(backend) => orchestrator
                .queue_backend(Arc::new(backend.queues()))
                .rate_limit_backend(Arc::new(backend.rate_limits()))
                .cache(Arc::new(backend.cache())),
            None => orchestrator,
        };
        #[cfg(feature = "agent")]
        let orchestrator = match sampler(loaded, &models)? {
            Some(sampler) => orchestrator.sampler(sampler),
            None => orchestrator,
        };
        // The calls of the tools with `showInSpace` are posted to their callers' spaces.
        #[cfg(feature = "external")]
        let orchestrator = match &spaces {
            Some((spaces, _)) if shows_in_space => {
                orchestrator.display(Arc::new(SpaceDisplay(spaces.clone())))
            }
            _ => orchestrator,
        };
        let orchestrator = providers
            .into_iter()
            .fold(orchestrator, |builder, provider| builder.provider(provider));
        // Attached on the orchestrator, hooks see every call: `tools call`, agents' calls and
        // the calls of MCP clients of `toolmux serve` alike.
        let orchestrator = CommandHook::attach(orchestrator, command_hooks(loaded, &secrets)?)
            .secrets(secrets)
            .build()
            .map_err(|e| ToolmuxError::config(file, with_causes(&e)))?;
        let stats_file = loaded.stats_file();
        let stats_told = Arc::new(std::sync::Mutex::new(None));
        // Statistics are worth keeping, not worth refusing to work over: a file that cannot
        // be read is warned of, and the counts start from nothing.
        if let Some(path) = &stats_file
            && let Err(e) = orchestrator.stats().load(path)
        {
            *stats_told.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
            use toolmux_orchestrator::accounting::StatsError;
            // Only a file of another form is moved aside; one that is no regular file, or
            // cannot be read, is left as it is.
            let moved = match &e {
                StatsError::Format { .. } => {
                    format!(" (the file is moved to {}.bad when they are saved)", path.display())
                }
                _ => String::new(),
            };
            warnings.push(format!("{}; statistics start from nothing{moved}", with_causes(&e)));
        }
        #[cfg(feature = "agent")]
        if let Some(agents) = &agents {
            agents.attach(&orchestrator);
        }
        if let Some(search) = search {
            search.attach(&orchestrator);
        }
        // Subscribed before any call is made.
        #[cfg(feature = "otel")]
        let otel =
            otel.map(|s| Arc::new(toolmux_otel::Exporter::start(s, orchestrator.subscribe())));
        #[cfg(all(feature = "mcp", feature = "redis"))]
        let session_affinity = backend.as_ref().map(|backend| {
            let redis = loaded.config.backend.as_ref().and_then(|b| b.redis.as_ref());
            let prefix = redis.and_then(|r| r.prefix.as_deref());
            toolmux_mcp::server::SessionAffinity {
                directory: Arc::new(RedisSessionDirectory::new(backend, prefix)),
                advertise_url: redis.and_then(|r| r.advertise_url.clone()),
            }
        });
        Ok(Toolmux {
            orchestrator,
            #[cfg(feature = "agent")]
            agents,
            output_store: store,
            output_dir,
            stats_file,
            stats_told,
            warnings,
            #[cfg(feature = "mcp")]
            mcp_servers,
            reused,
            #[cfg(feature = "external")]
            pending,
            #[cfg(feature = "external")]
            pending_from,
            #[cfg(feature = "external")]
            spaces: spaces.map(|(spaces, _)| spaces),
            #[cfg(feature = "otel")]
            otel,
            #[cfg(all(feature = "mcp", feature = "redis"))]
            session_affinity,
        })
    }

    /// With `backend.redis`, what `toolmux serve --http` shares with the other replicas
    /// ([`toolmux_mcp::server::ServeOptions::affinity`]): the key it seals the stateless
    /// revision's `requestState` with, and its MCP sessions (recorded in Redis, requests of
    /// another replica's sessions forwarded to it). On a wildcard address without
    /// `backend.redis.advertiseUrl`, where the others reach this replica cannot be told: the
    /// server then shares the key but not its sessions, and warns saying so.
    #[cfg(all(feature = "mcp", feature = "redis"))]
    pub fn session_affinity(&self) -> Option<toolmux_mcp::server::SessionAffinity> {
        self.session_affinity.clone()
    }

    /// The configured agents, attached to the orchestrator; `None` without `agents`.
    #[cfg(feature = "agent")]
    pub fn agents(&self) -> Option<&toolmux_agent::Agents> {
        self.agents.as_ref()
    }

    /// Where outputs over the size cap are kept: the output directory, or Redis with
    /// `backend.redis`.
    pub fn output_store(&self) -> &Arc<dyn OutputStore> {
        &self.output_store
    }

    /// The orchestrator: every tool, one pipeline. It is a [`ToolProvider`] too.
    pub fn orchestrator(&self) -> &Orchestrator {
        &self.orchestrator
    }

    /// Where spilled outputs are kept.
    pub fn output_dir(&self) -> &Path {
        &self.output_dir
    }

    /// Where statistics persist; `None` when they are not kept (`statsFile: false`).
    pub fn stats_file(&self) -> Option<&Path> {
        self.stats_file.as_deref()
    }

    /// Warnings from loading and wiring.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Adds the counts of this process since its last save to the statistics file, which
    /// other processes may share (see [`toolmux_orchestrator::accounting::Stats::save`]).
    ///
    /// The file is read, locked (waiting for other processes) and written on a blocking
    /// thread, never on the event loop that serves calls. A failure told already, the same
    /// one the start warned of or the last save returned, is not returned again.
    pub async fn save_stats(&self) -> Result<(), ToolmuxError> {
        let Some(path) = self.stats_file.clone() else {
            return Ok(());
        };
        let orchestrator = self.orchestrator.clone();
        let file = path.clone();
        let saved = tokio::task::spawn_blocking(move || orchestrator.stats().save(&file)).await;
        let source = match saved {
            Ok(Ok(())) => {
                *self.stats_told.lock().unwrap_or_else(|e| e.into_inner()) = None;
                return Ok(());
            }
            Ok(Err(source)) => source,
            Err(failed) => toolmux_orchestrator::accounting::StatsError::Io {
                path: path.clone(),
                source: std::io::Error::other(format!("the saving thread failed: {failed}")),
            },
        };
        let mut told = self.stats_told.lock().unwrap_or_else(|e| e.into_inner());
        let text = source.to_string();
        if told.as_ref() == Some(&text) {
            return Ok(());
        }
        *told = Some(text);
        Err(ToolmuxError::Stats { path, source })
    }

    /// Saves the statistics and stops every provider (closing connections, reaping child
    /// processes).
    pub async fn shutdown(&self) -> Result<(), ToolmuxError> {
        let saved = self.save_stats().await;
        self.orchestrator.cleanup().await;
        self.stop_export().await;
        saved
    }
}

/// `error`'s message followed by those of its causes that it does not already hold, as
/// `message: cause: cause`: the OS's reason an audit log cannot be opened is a cause.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let text = next.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = next.source();
    }
    message
}

/// The OpenTelemetry export `telemetry.otlp` asks for, checked; its headers' values are
/// added to `secrets`.
#[cfg(feature = "otel")]
fn telemetry(
    loaded: &Loaded,
    secrets: &mut Vec<String>,
) -> Result<Option<toolmux_otel::Settings>, ToolmuxError> {
    let Some(otlp) = loaded.config.telemetry.as_ref().and_then(|t| t.otlp.as_ref()) else {
        return Ok(None);
    };
    let env = |name: &str| std::env::var(name).ok();
    let settings = toolmux_otel::Settings::new(otlp, &env)
        .map_err(|e| ToolmuxError::config(loaded.source_name(), format!("telemetry.otlp: {e}")))?;
    secrets.extend(settings.secrets());
    Ok(Some(settings))
}

/// The `aliases` section, each alias pointing at a tool: an alias of an alias (`rd2: rd`)
/// is followed to the tool, a cycle of them is an error naming it, and so is an alias
/// that no model API would take as a tool name.
fn aliases(loaded: &Loaded) -> Result<std::collections::HashMap<String, String>, ToolmuxError> {
    let aliases = &loaded.config.aliases;
    let mut resolved = std::collections::HashMap::new();
    for (alias, target) in aliases {
        let file = loaded.file_of("aliases", alias);
        let valid = (1..=64).contains(&alias.len())
            && alias.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ToolmuxError::config(
                file,
                format!(
                    "aliases: `{alias}` is no valid tool name: model APIs take 1 to 64 ASCII \
                     letters, digits, `_` and `-` (^[a-zA-Z0-9_-]{{1,64}}$); rename the alias"
                ),
            ));
        }
        let mut chain = vec![alias.as_str()];
        let mut target = target.as_str();
        while let Some(next) = aliases.get(target) {
            if chain.contains(&target) {
                chain.push(target);
                return Err(ToolmuxError::config(
                    file,
                    format!(
                        "aliases: `{}` is a cycle of aliases that reaches no tool; point one of \
                         them at a tool's full name (such as `fs__read`)",
                        chain.join("` -> `")
                    ),
                ));
            }
            chain.push(target);
            target = next;
        }
        resolved.insert(alias.clone(), target.to_owned());
    }
    Ok(resolved)
}

fn orchestrator_config(loaded: &Loaded) -> Result<OrchestratorConfig, ToolmuxError> {
    let c = &loaded.config;
    let d = &c.defaults;
    let defaults = OrchestratorConfig::default();
    let ms = Duration::from_millis;
    let mut config = OrchestratorConfig {
        tool_timeout: d.tool_timeout.map_or(defaults.tool_timeout, ms),
        response_max_bytes: d.tool_response_max_bytes.unwrap_or(defaults.response_max_bytes),
        structured_max_bytes: d
            .structured_response_max_bytes
            .unwrap_or(defaults.structured_max_bytes),
        media_max_bytes: d.media_response_max_bytes.unwrap_or(defaults.media_max_bytes),
        max_calls_in_flight: d.max_calls_in_flight.unwrap_or(defaults.max_calls_in_flight),
        max_waiting_calls: d
            .max_calls_in_flight
            .map_or(defaults.max_waiting_calls, |max| max.saturating_mul(16)),
        oversize: match d.oversize {
            Some(Oversize::Truncate) => OversizeMode::Truncate,
            Some(Oversize::Spill) | None => OversizeMode::Spill,
        },
        init_concurrency: d.mcp_init_concurrency.unwrap_or(defaults.init_concurrency),
        startup_timeout: d.startup_timeout.map_or(defaults.startup_timeout, ms),
        context_token_budget: d.context_token_budget,
        run_budget: RunBudgetConfig {
            max_calls: d.max_tool_calls_per_run,
            max_tool_time: d.max_tool_time_ms.map(ms),
        },
        retry: d.retries.map_or_else(RetryPolicy::default, RetryPolicy::retries),
        audit_log: d.audit_log.as_deref().map(|p| loaded.resolve(p)),
        permissions: PermissionRules {
            allow: c.permissions.allow.clone(),
            deny: c.permissions.deny.clone(),
            ask: c.permissions.ask.clone(),
        },
        aliases: aliases(loaded)?,
        deferred: c.tool_search.defer.clone(),
        ..defaults
    };
    for (name, queue) in &c.queues {
        let mut q = QueueConfig::new(queue.concurrent);
        if let Some(wait) = queue.wait_timeout_ms {
            q = q.with_wait_timeout(ms(wait));
        }
        config.queues.insert(name.clone(), q);
    }
    for (name, tool) in &c.tools {
        let mut settings = tool_settings(tool);
        settings.rate_limit = rate_limit(loaded, &format!("tools.{name}"), tool.rate_limit)?;
        config.tools.insert(name.clone(), settings);
        let a = tool.annotations.unwrap_or_default();
        let said = ToolOverride {
            title: tool.title.clone(),
            description: tool.description.clone(),
            read_only: a.read_only,
            destructive: a.destructive,
            idempotent: a.idempotent,
            open_world: a.open_world,
            ends_turn: a.ends_turn,
            visible: a.visible,
            shown: a.shown,
            meta: tool.meta.clone(),
        };
        if said != ToolOverride::default() {
            config.overrides.insert(name.clone(), said);
        }
    }
    Ok(config)
}

/// The configured command hooks, in configuration order, `PreToolUse` first; matchers and
/// timeouts checked.
fn command_hooks(
    loaded: &Loaded,
    secrets: &[String],
) -> Result<Vec<Arc<CommandHook>>, ToolmuxError> {
    let file = loaded.source_name();
    let section = &loaded.config.hooks;
    let events = [
        (HookEvent::PreToolUse, &section.pre_tool_use),
        (HookEvent::PostToolUse, &section.post_tool_use),
    ];
    let mut hooks = Vec::new();
    for (event, entries) in events {
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("hooks.{event}[{i}]");
            let matcher = ToolMatcher::new(entry.matcher.as_deref().unwrap_or(""))
                .map_err(|e| ToolmuxError::config(file, format!("{at}.matcher: {e}")))?;
            for (j, hook) in entry.hooks.iter().enumerate() {
                let timeout = hook_timeout(file, &format!("{at}.hooks[{j}]"), hook)?;
                let command =
                    CommandHook::new(event, hook.command.clone(), loaded.base_dir.clone())
                        .with_matcher(matcher.clone())
                        .with_timeout(timeout)
                        .with_secrets(secrets.iter().cloned());
                hooks.push(Arc::new(command));
            }
        }
    }
    Ok(hooks)
}

/// A configured rate limit, refused when it allows nothing (`calls` or `perMs` 0).
fn rate_limit(
    loaded: &Loaded,
    key: &str,
    entry: Option<RateLimitEntry>,
) -> Result<Option<RateLimit>, ToolmuxError> {
    let Some(entry) = entry else { return Ok(None) };
    if entry.calls == 0 || entry.per_ms == 0 {
        return Err(ToolmuxError::config(
            loaded.source_name(),
            format!(
                "{key}.rateLimit: `calls` and `perMs` must be at least 1 (as in `{{calls: 10, perMs: 60000}}`)"
            ),
        ));
    }
    Ok(Some(RateLimit {
        calls: entry.calls,
        per: Duration::from_millis(entry.per_ms),
        wait: Duration::from_millis(entry.wait_ms),
    }))
}

fn tool_settings(tool: &ToolEntry) -> ToolSettings {
    let ms = Duration::from_millis;
    ToolSettings {
        queue: tool.queue.clone(),
        cache_ttl: tool.cache.map(ms),
        cache_force: tool.cache.is_some(),
        timeout: tool.timeout.map(ms),
        reset_timeout_on_progress: tool.reset_timeout_on_progress,
        max_total_time: tool.max_total_time_ms.map(ms),
        response_max_bytes: tool.response_max_bytes,
        media_max_bytes: tool.media_response_max_bytes,
        // Checked and set by the caller, which can fail.
        rate_limit: None,
        retry: tool.retries.map(RetryPolicy::retries),
        provider_wait: None,
        answer_wait: None,
        priority: tool.priority,
        show_in_space: tool.show_in_space,
    }
}

/// Bytes a page of `fs__read` leaves under the response cap for its header and footer.
#[cfg(feature = "fs")]
const READ_PAGE_ROOM: usize = 4096;

/// The file tools over `fs`; a `read` page stays within `response_max` (the pipeline's
/// cap), so that the model gets lines and a note saying where to read on, never a page
/// stored away whole.
#[cfg(feature = "fs")]
fn fs_provider(
    loaded: &Loaded,
    fs: &crate::config::FsSection,
    response_max: usize,
) -> Result<Arc<dyn ToolProvider>, ToolmuxError> {
    let root = fs.root.as_deref().map_or_else(|| loaded.base_dir.clone(), |r| loaded.resolve(r));
    let config = guarded_files(loaded, fs, root)
        .with_permissions(fs.permissions.iter().copied())
        .with_limits(toolmux_fs::FsLimits {
            // A cap too small for any useful page leaves pages as they are (stored whole).
            read_page_bytes: if response_max > 2 * READ_PAGE_ROOM {
                fs.limits.read_page_bytes.min(response_max - READ_PAGE_ROOM)
            } else {
                fs.limits.read_page_bytes
            },
            ..fs.limits.clone()
        });
    let provider = toolmux_fs::FsProvider::new(config)
        .map_err(|e| ToolmuxError::config(loaded.source_name(), e.to_string()))?;
    Ok(Arc::new(provider))
}

/// The files at `root` as `fs` configures them for commands: `bash` (its spill directory
/// resolved), the `protect` and `hide` lines (with the paths `permissions.deny` keeps from
/// reading), other agents' settings and toolmux's own files. `fs__bash` and the command
/// tools both keep their programs from these.
#[cfg(feature = "fs")]
fn guarded_files(
    loaded: &Loaded,
    fs: &crate::config::FsSection,
    root: PathBuf,
) -> toolmux_fs::FsConfig {
    let mut bash = fs.bash.clone();
    bash.spill_dir = bash.spill_dir.map(|d| loaded.resolve(&d));
    let config = toolmux_fs::FsConfig::new(root)
        .with_bash(bash)
        .with_protect(fs.protect.iter().cloned())
        .with_agent_files_protected(fs.protect_agent_files)
        .with_hide(fs.hide.iter().cloned().chain(denied_reads(&loaded.config.permissions.deny)));
    own_files(loaded).into_iter().fold(config, |c, p| c.with_protected(p))
}

/// The paths of `permissions.deny` rules on reading files (`fs__read(secrets/**)`,
/// `fs__*(**/*.pem)`, `@read(.env)`): hidden from every file tool, so that `grep`, `glob`
/// and `ls`, which a rule on `fs__read` does not name, show nothing reading is denied.
#[cfg(feature = "fs")]
fn denied_reads(deny: &[String]) -> impl Iterator<Item = String> + '_ {
    let read = toolmux_core::ToolAnnotations {
        permission: Some(toolmux_core::PermissionClass::Read),
        ..toolmux_core::ToolAnnotations::read_only()
    };
    deny.iter().filter_map(move |rule| match toolmux_orchestrator::split_rule(rule) {
        Ok((tools, Some(path))) if toolmux_orchestrator::rule_matches(tools, "fs__read", &read) => {
            Some(path.to_owned())
        }
        _ => None,
    })
}

/// The argument schemas the file itself gives (`restTools`, `commandTools`,
/// `externalTools`) are JSON Schema: a tool with a broken one would be left out with a
/// warning while `config check` said the file was valid. A server's or an OpenAPI
/// document's schemas are not the file's, and stay warnings.
#[cfg_attr(
    not(any(feature = "rest", feature = "fs", feature = "external")),
    allow(unused_mut, unused_variables)
)]
fn check_own_schemas(loaded: &Loaded) -> Result<(), String> {
    let config = &loaded.config;
    let mut given: Vec<(String, &serde_json::Value)> = Vec::new();
    #[cfg(feature = "rest")]
    given.extend(config.rest_tools.iter().filter_map(|(name, tool)| {
        Some((format!("restTools.{name}.parametersSchema"), tool.parameters_schema.as_ref()?))
    }));
    #[cfg(feature = "fs")]
    given.extend(config.command_tools.iter().filter_map(|(name, tool)| {
        Some((format!("commandTools.{name}.parametersSchema"), tool.parameters_schema.as_ref()?))
    }));
    #[cfg(feature = "external")]
    given.extend(config.external_tools.iter().filter_map(|(name, tool)| {
        Some((format!("externalTools.{name}.inputSchema"), tool.input_schema.as_ref()?))
    }));
    for (key, schema) in given {
        toolmux_orchestrator::ArgumentValidator::check_schema(schema)
            .map_err(|e| format!("{key} is not valid JSON Schema: {e}"))?;
    }
    Ok(())
}

/// Each holder of `serve.holderTools` holds a key (or is an OAuth subject) and is given
/// at least one glob.
#[cfg(feature = "mcp")]
fn check_holder_tools(loaded: &Loaded) -> Result<(), String> {
    let serve = &loaded.config.serve;
    for (holder, globs) in &serve.holder_tools {
        if !holder.starts_with("oauth:") && !serve.api_keys.contains_key(holder) {
            let known: Vec<&str> = serve.api_keys.keys().map(String::as_str).collect();
            return Err(format!(
                "`{holder}` holds no key under `serve.apiKeys` ({}); name a key's holder, or \
                 `oauth:SUBJECT` for a token's subject",
                if known.is_empty() { "none are configured".to_owned() } else { known.join(", ") }
            ));
        }
        if globs.is_empty() {
            return Err(format!(
                "`{holder}` is given no tool; give glob patterns of tool names (`docs__*`), or \
                 remove its key"
            ));
        }
    }
    Ok(())
}

/// The timeout of hook `hook` (at `at` in the file), once its command is known not empty.
fn hook_timeout(
    file: &str,
    at: &str,
    hook: &crate::config::HookCommandEntry,
) -> Result<Duration, ToolmuxError> {
    if hook.command.trim().is_empty() {
        return Err(ToolmuxError::config(
            file,
            format!("{at}.command: is empty; give the shell command to run"),
        ));
    }
    match hook.timeout {
        Some(0) => {
            Err(ToolmuxError::config(file, format!("{at}.timeout: must be at least 1 (seconds)")))
        }
        Some(seconds) => Ok(Duration::from_secs(seconds)),
        None => Ok(CommandHook::DEFAULT_TIMEOUT),
    }
}

/// The hooks of the agents' loop (`SessionStart`, `UserPromptSubmit`, `Stop`,
/// `SubagentStop`), which redact with the orchestrator's secrets as the agents do.
#[cfg(feature = "agent")]
fn agent_hooks(loaded: &Loaded) -> Result<toolmux_agent::AgentHooks, ToolmuxError> {
    use toolmux_agent::HookCommand;
    let file = loaded.source_name();
    let section = &loaded.config.hooks;
    let commands = |event: &str, entries: &[crate::config::HookMatcherEntry]| {
        let mut commands = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("hooks.{event}[{i}]");
            let matcher = entry.matcher.clone().unwrap_or_default();
            if event != "SessionStart" && !matches!(matcher.trim(), "" | "*") {
                return Err(ToolmuxError::config(
                    file,
                    format!(
                        "{at}.matcher: {event} hooks take no matcher (they run for every run); remove it"
                    ),
                ));
            }
            for (j, hook) in entry.hooks.iter().enumerate() {
                let timeout = hook_timeout(file, &format!("{at}.hooks[{j}]"), hook)?;
                let command = hook.command.clone();
                commands.push(HookCommand { command, timeout, matcher: matcher.clone() });
            }
        }
        Ok(commands)
    };
    Ok(toolmux_agent::AgentHooks {
        session_start: commands("SessionStart", &section.session_start)?,
        user_prompt_submit: commands("UserPromptSubmit", &section.user_prompt_submit)?,
        stop: commands("Stop", &section.stop)?,
        subagent_stop: commands("SubagentStop", &section.subagent_stop)?,
        dir: loaded.base_dir.clone(),
        transcripts: Some(loaded.output_dir()),
    })
}

/// toolmux's own files, which the file tools leave alone even beneath their root: an
/// agent that could write them could give itself permissions or servers (`serve --watch`
/// loads the configuration live), put variables such as `LD_PRELOAD` in a server's
/// environment, rewrite the record of what it did, or read other runs' outputs.
#[cfg(feature = "fs")]
fn own_files(loaded: &Loaded) -> Vec<toolmux_fs::ProtectedPath> {
    use toolmux_fs::{ProtectedKind, ProtectedPath};
    let config = |path| ProtectedPath::new(path, ProtectedKind::Configuration);
    let mut own: Vec<ProtectedPath> = loaded.path.iter().cloned().map(config).collect();
    // The user's and the managed file, read under and over the project's.
    own.extend(loaded.layers.iter().map(|layer| config(layer.path.clone())));
    // Those `toolmux` would load from this folder next time, were one created.
    own.extend(crate::config::FILE_NAMES.iter().map(|name| config(loaded.base_dir.join(name))));
    #[cfg(feature = "mcp")]
    own.extend(
        loaded
            .config
            .mcp_servers
            .values()
            .filter_map(|e| e.env_file.as_deref())
            .map(|f| config(loaded.resolve(f))),
    );
    let d = &loaded.config.defaults;
    own.extend(
        d.audit_log
            .as_deref()
            .map(|log| ProtectedPath::new(loaded.resolve(log), ProtectedKind::AuditLog)),
    );
    own.extend(loaded.stats_file().map(|file| ProtectedPath::new(file, ProtectedKind::Statistics)));
    own.push(ProtectedPath::new(loaded.output_dir(), ProtectedKind::OutputDir));
    // What a person allowed in the project: an agent that could write it would approve
    // itself.
    own.push(config(loaded.base_dir.join(".toolmux/approvals.json")));
    #[cfg(feature = "external")]
    own.extend(
        loaded
            .config
            .spaces
            .as_ref()
            .and_then(|s| s.dir.as_deref())
            .map(|dir| ProtectedPath::new(loaded.resolve(dir), ProtectedKind::Spaces)),
    );
    own
}

#[cfg(feature = "mcp")]
pub(crate) use mcp::namespace_for;

#[cfg(feature = "mcp")]
mod mcp {
    use super::*;
    use crate::config::file::{FileRole, read_regular};
    use crate::config::{CursorAuth, McpServerEntry};
    use std::collections::BTreeMap;

    /// How long an MCP server's answer to one request is waited for, restarted by each of its
    /// progress reports (`McpProvider` keeps this wait): `requestTimeoutMs`, else
    /// `defaults.toolTimeout`, else the orchestrator's default tool timeout.
    pub(super) fn wait_ms(loaded: &Loaded, entry: &McpServerEntry) -> u64 {
        entry.request_timeout_ms.or(loaded.config.defaults.tool_timeout).unwrap_or_else(|| {
            let default = OrchestratorConfig::default().tool_timeout;
            u64::try_from(default.as_millis()).unwrap_or(u64::MAX)
        })
    }

    /// Moves the timing settings of the server's tools (`tools.NAME.timeout`,
    /// `resetTimeoutOnProgress`, `maxTotalTimeMs`, over the server's own) to where an MCP
    /// tool is timed: the wait, which each progress report restarts, to the provider (in the
    /// call's context); the cap on the whole call to the pipeline, as [`call_limit`] does
    /// for the server. Taken as the pipeline's plain timeout, `tools.NAME.timeout` cut calls
    /// that reported progress, and one longer than `defaults.toolTimeout` never applied.
    pub(super) fn time_tools(
        loaded: &Loaded,
        entry: &McpServerEntry,
        namespace: &str,
        tools: &mut std::collections::HashMap<String, ToolSettings>,
    ) {
        let prefix = format!("{namespace}__");
        for (name, settings) in tools.iter_mut().filter(|(name, _)| name.starts_with(&prefix)) {
            let (wait, reset, max_total) =
                (settings.timeout, settings.reset_timeout_on_progress, settings.max_total_time);
            if wait.is_none() && reset.is_none() && max_total.is_none() {
                continue;
            }
            tracing::debug!(tool = %name, "timed as an MCP tool");
            let wait = wait.unwrap_or(Duration::from_millis(wait_ms(loaded, entry)));
            let reset = reset.or(entry.reset_timeout_on_progress).unwrap_or(true);
            let max_total = max_total.or(entry.max_total_time_ms.map(Duration::from_millis));
            settings.provider_wait = Some(wait);
            settings.timeout = Some(match (reset, max_total) {
                (true, Some(max)) => max,
                (true, None) => wait.saturating_mul(10),
                (false, Some(max)) => wait.min(max),
                (false, None) => wait,
            });
            settings.reset_timeout_on_progress = None;
            settings.max_total_time = None;
        }
    }

    /// The pipeline's limit of one call to an MCP server's tool. The server's own wait is reset
    /// by progress, so this is the cap on the whole call (`maxTotalTimeMs`, else ten times the
    /// wait), unless `resetTimeoutOnProgress: false` makes it the wait itself. Keeping the
    /// reset in the provider leaves the pipeline's relayed path lean: it need not watch the
    /// progress of every call.
    pub(super) fn call_limit(loaded: &Loaded, entry: &McpServerEntry) -> Duration {
        let wait = wait_ms(loaded, entry);
        let limit = if entry.reset_timeout_on_progress.unwrap_or(true) {
            entry.max_total_time_ms.unwrap_or(wait.saturating_mul(10))
        } else {
            wait
        };
        Duration::from_millis(limit)
    }

    /// The error for mcp servers `first` and `second` whose keys give the same namespace:
    /// both keys, where each is written, and what to do.
    pub(super) fn same_namespace(
        loaded: &Loaded,
        first: &str,
        second: &str,
        namespace: &str,
    ) -> ToolmuxError {
        let (first_file, second_file) =
            (loaded.file_of("mcpServers", first), loaded.file_of("mcpServers", second));
        let keys = if first_file == second_file {
            format!("mcpServers `{first}` and `{second}`")
        } else {
            format!("mcpServers `{first}` (in {first_file}) and `{second}` (in {second_file})")
        };
        ToolmuxError::config(
            second_file,
            format!(
                "{keys} would both name their tools `{namespace}__*` (a key is lowercased and \
                 any other character than a letter or digit becomes `-`); rename one of the \
                 two keys"
            ),
        )
    }

    /// A valid namespace for a server name from a Claude Desktop or VS Code file, where
    /// names like `GitHub` or `my_server` are common: lowercase, other characters as `-`.
    pub(crate) fn namespace_for(name: &str) -> String {
        let mut namespace: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .collect();
        while namespace.contains("--") {
            namespace = namespace.replace("--", "-");
        }
        let namespace = namespace.trim_matches('-');
        match namespace.chars().next() {
            Some(c) if c.is_ascii_lowercase() => namespace.to_owned(),
            Some(_) => format!("mcp-{namespace}"),
            None => "mcp".to_owned(),
        }
    }

    #[allow(clippy::needless_update)]
    pub(super) fn server_config(
        loaded: &Loaded,
        name: &str,
        entry: &McpServerEntry,
        secrets: &mut Vec<String>,
    ) -> Result<toolmux_mcp::McpServerConfig, ToolmuxError> {
        let mut env = BTreeMap::new();
        if let Some(file) = &entry.env_file {
            let path = loaded.resolve(file);
            let text = read_regular(&path, FileRole::EnvFile).map_err(|e| {
                ToolmuxError::config(
                    loaded.file_of("mcpServers", name),
                    format!("mcpServers.{name}.envFile: cannot read {}: {e}", path.display()),
                )
            })?;
            let (pairs, bad) = dotenv(&text);
            if let Some(line) = bad {
                return Err(ToolmuxError::config(
                    loaded.file_of("mcpServers", name),
                    format!(
                        "mcpServers.{name}.envFile: {}:{line}: not a KEY=value line: an env \
                         file holds KEY=value lines, # comments and blank lines (dotenv), not \
                         YAML or JSON; write the line as KEY=value or start it with #",
                        path.display()
                    ),
                ));
            }
            for (key, value) in pairs {
                // Judged line by line as a value from the environment by its name and its
                // value (docs/configuration.md): every line a secret read every `8080` in
                // outputs as `[redacted]` for a `PORT=8080`.
                if crate::config::is_secret_setting(&key, &value) {
                    secrets.push(value.clone());
                }
                env.insert(key, value);
            }
        }
        env.extend(entry.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let env_inherit = entry.env_inherit.or(loaded.config.defaults.env_inherit);
        if entry.command.is_some() {
            secrets.extend(inherited_secrets(env_inherit.unwrap_or_default(), &env, secrets));
        }
        Ok(toolmux_mcp::McpServerConfig {
            transport: entry.transport,
            command: entry.command.clone(),
            args: entry.args.clone(),
            env,
            env_inherit,
            env_passthrough: entry.env_passthrough.clone(),
            cwd: entry.cwd.as_deref().map(|c| loaded.resolve(c)),
            base_dir: Some(loaded.base_dir.clone()),
            url: entry.url.clone(),
            headers: entry.headers.clone(),
            passthrough_headers: entry.passthrough_headers.clone(),
            oauth: entry.oauth.clone().or_else(|| entry.auth.as_ref().map(CursorAuth::oauth)),
            tools_allowed: entry.tools_allowed.clone(),
            tools_denied: entry.tools_denied.clone(),
            request_timeout_ms: Some(wait_ms(loaded, entry)),
            startup_timeout_ms: entry.startup_timeout_ms,
            enabled: entry.enabled,
            lazy: entry.lazy,
            tools: entry.tools.clone(),
            protocol: entry.protocol,
            accept_elicitation_defaults: entry.accept_elicitation_defaults,
            max_restarts: entry.max_restarts,
            health_check_ms: entry.health_check_ms.or(loaded.config.defaults.health_check_ms),
            idle_shutdown_ms: entry.idle_shutdown_ms.or(loaded.config.defaults.idle_shutdown_ms),
            malware_check: entry.malware_check.or(loaded.config.defaults.malware_check),
            osv_url: loaded.config.defaults.osv_url.clone(),
            queue: entry.queue.clone(),
            cache: entry.cache,
            description: entry.description.clone(),
            // Settings the client gains later keep their defaults until the configuration
            // exposes them.
            ..toolmux_mcp::McpServerConfig::default()
        })
    }

    /// The values of toolmux's environment a stdio server inherits by `inherit` (those
    /// `env` does not set in its place) that are credentials by their variable's name, as
    /// the loader judges a variable of `envPassthrough` ([`is_secret_by_name`]), and are
    /// not among `known` yet. The loader registers only the variables the file names, so
    /// with `envInherit: all` a server echoing `GITHUB_TOKEN` showed it as it is. `safe`
    /// withholds every name this judges a credential, as both read names by
    /// [`toolmux_core::credential`], so it matters for `all` (and `minimal`'s fixed list).
    ///
    /// [`is_secret_by_name`]: crate::config::is_secret_by_name
    fn inherited_secrets(
        inherit: toolmux_mcp::EnvInherit,
        env: &BTreeMap<String, String>,
        known: &[String],
    ) -> Vec<String> {
        let mut found: Vec<String> = Vec::new();
        for (name, value) in std::env::vars_os() {
            let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else { continue };
            if !inherit.passes(name)
                || env.contains_key(name)
                || !crate::config::is_secret_by_name(name, value)
                || known.iter().chain(&found).any(|s| s == value)
            {
                continue;
            }
            found.push(value.to_owned());
        }
        found
    }

    /// `KEY=value` lines; `#` comments, `export ` prefixes and quotes around values
    /// allowed.
    /// The secrets of the `envFile` of a server this process does not start (disabled, or
    /// left out of a build for one call), judged as those of a started server are; none
    /// when the file cannot be read, which the server's own start reports.
    pub(super) fn env_file_secrets(loaded: &Loaded, entry: &McpServerEntry) -> Vec<String> {
        let Some(file) = &entry.env_file else { return Vec::new() };
        let Ok(text) = read_regular(&loaded.resolve(file), FileRole::EnvFile) else {
            return Vec::new();
        };
        // The pairs of a file with a line that is none are still secrets here: the
        // server's own start reports the line.
        dotenv(&text)
            .0
            .into_iter()
            .filter(|(key, value)| crate::config::is_secret_setting(key, value))
            .map(|(_, value)| value)
            .collect()
    }

    /// The `KEY=value` lines of an env file, and the number of the first line that is
    /// none, nor blank, nor a `#` comment. Such a line was skipped without a word, so a
    /// YAML or JSON file given as `envFile` (`KEY: value`) left the server without the
    /// variables it holds; the line itself is never shown, as it may hold a credential.
    fn dotenv(text: &str) -> (Vec<(String, String)>, Option<usize>) {
        let mut pairs = Vec::new();
        let mut bad = None;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let pair = line.strip_prefix("export ").unwrap_or(line).split_once('=');
            let Some((key, value)) = pair.filter(|(key, _)| is_variable(key.trim())) else {
                bad.get_or_insert(i + 1);
                continue;
            };
            let value = value.trim();
            let unquoted = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
                .unwrap_or(value);
            pairs.push((key.trim().to_owned(), unquoted.to_owned()));
        }
        (pairs, bad)
    }

    /// A variable's name in an env file: a letter or `_`, then letters, digits, `_`, `.`
    /// or `-`.
    fn is_variable(name: &str) -> bool {
        let mut chars = name.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// `healthCheckMs` of a server, else `defaults.healthCheckMs`; `0` turns it off.
        #[test]
        fn health_checks_default_and_per_server() {
            let text = "defaults:\n  healthCheckMs: 60000\nmcpServers:\n  a: {command: x}\n  \
                        b: {command: x, healthCheckMs: 0}\n  c: {command: x, healthCheckMs: 5000}\n";
            let loaded = crate::config::load_str(
                text,
                crate::config::FileFormat::Yaml,
                "toolmux.yaml",
                Path::new("/proj"),
                &|_| None,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let interval = |name: &str| {
                let mut secrets = Vec::new();
                let entry = &loaded.config.mcp_servers[name];
                let config = server_config(&loaded, name, entry, &mut secrets)
                    .unwrap_or_else(|e| panic!("{e}"));
                config.health_check_interval()
            };
            assert_eq!(interval("a"), Some(Duration::from_secs(60)));
            assert_eq!(interval("b"), None);
            assert_eq!(interval("c"), Some(Duration::from_secs(5)));
        }

        #[test]
        fn namespaces_from_desktop_names() {
            assert_eq!(namespace_for("github"), "github");
            assert_eq!(namespace_for("GitHub"), "github");
            assert_eq!(namespace_for("my_server v2"), "my-server-v2");
            assert_eq!(namespace_for("42"), "mcp-42");
            assert_eq!(namespace_for("__"), "mcp");
        }

        #[tokio::test]
        async fn two_keys_of_one_namespace_are_named_with_the_fix() {
            let dir = tempfile::tempdir().expect("a folder");
            let text = "defaults: {outputDir: out}\nmcpServers:\n  my_server: {command: x}\n  \
                        my-server: {command: x}\n  other: {command: x}\n";
            let loaded = crate::config::load_str(
                text,
                crate::config::FileFormat::Yaml,
                "toolmux.yaml",
                dir.path(),
                &|_| None,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            let Err(error) = Toolmux::build(&loaded).await else {
                panic!("two servers named my-server were built");
            };
            assert_eq!(
                error.to_string(),
                "toolmux.yaml: mcpServers `my-server` and `my_server` would both name their \
                 tools `my-server__*` (a key is lowercased and any other character than a \
                 letter or digit becomes `-`); rename one of the two keys"
            );
        }

        /// The configuration of server `s` whose `envFile` is `env_file`, failing the test
        /// should reading the file block.
        fn with_env_file(env_file: &Path) -> Result<toolmux_mcp::McpServerConfig, ToolmuxError> {
            let text =
                format!("mcpServers:\n  s: {{command: x, envFile: {}}}\n", env_file.display());
            let loaded = crate::config::load_str(
                &text,
                crate::config::FileFormat::Yaml,
                "toolmux.yaml",
                Path::new("/proj"),
                &|_| None,
            )
            .unwrap_or_else(|e| panic!("{e}"));
            crate::test_support::within_10s("reading the env file", move || {
                let entry = &loaded.config.mcp_servers["s"];
                server_config(&loaded, "s", entry, &mut Vec::new())
            })
        }

        #[test]
        fn an_env_file_that_is_a_fifo_is_refused_at_once() {
            let dir = tempfile::tempdir().expect("temporary folder");
            let fifo = crate::test_support::fifo(dir.path(), "env.fifo");
            let e = with_env_file(&fifo).expect_err("a FIFO is no env file");
            assert_eq!(
                e.to_string(),
                format!(
                    "toolmux.yaml: mcpServers.s.envFile: cannot read {}: it is a FIFO (named \
                     pipe), not a regular file: give the path of an env file",
                    fifo.display()
                )
            );
        }

        #[test]
        fn an_env_file_over_1_mib_is_refused() {
            let dir = tempfile::tempdir().expect("temporary folder");
            let path = dir.path().join(".env");
            let lines = "SOME_SETTING=some value that repeats\n".repeat(40_000);
            std::fs::write(&path, &lines).expect("written");
            let e = with_env_file(&path).expect_err("too big");
            assert_eq!(
                e.to_string(),
                format!(
                    "toolmux.yaml: mcpServers.s.envFile: cannot read {}: it is 1.4 MiB, over the \
                     limit of 1 MiB for an env file: one that big is likely a mistake (a wrong \
                     path, or generated data)",
                    path.display()
                )
            );
        }

        #[test]
        fn dotenv_lines() {
            let (pairs, bad) = dotenv("# c\nA=1\nexport B = \"two\"\n\nC='x=y'\nbad\nD: x=1\n");
            assert_eq!(
                pairs,
                [("A".into(), "1".into()), ("B".into(), "two".into()), ("C".into(), "x=y".into())]
            );
            assert_eq!(bad, Some(6));
            assert_eq!(dotenv("A=1\n\n# c\n").1, None);
        }

        /// An `envFile` in YAML or JSON is refused naming the file and the line, where its
        /// lines were skipped and the server started without them.
        #[test]
        fn an_env_file_in_yaml_is_refused_naming_the_line() {
            let dir = tempfile::tempdir().expect("temporary folder");
            let path = dir.path().join("env.yaml");
            std::fs::write(&path, "# settings\nLOG_LEVEL=debug\nAPI_TOKEN: sk-live-123\n")
                .expect("written");
            let e = with_env_file(&path).expect_err("not dotenv");
            let message = e.to_string();
            assert_eq!(
                message,
                format!(
                    "toolmux.yaml: mcpServers.s.envFile: {}:3: not a KEY=value line: an env file \
                     holds KEY=value lines, # comments and blank lines (dotenv), not YAML or \
                     JSON; write the line as KEY=value or start it with #",
                    path.display()
                )
            );
            assert!(!message.contains("sk-live"), "the line's value is not shown");
            std::fs::write(&path, "# settings\nLOG_LEVEL=debug\nexport API_TOKEN='sk-live-123'\n")
                .expect("written");
            let config = with_env_file(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(config.env["API_TOKEN"], "sk-live-123");
        }
    }
}

/// Makes or checks the default output folder, in the system's temporary folder under a name
/// anyone can work out: it must be a folder of this user's, not a symbolic link another
/// user planted, and it is made mode 0700, so that no one else reads or changes the outputs,
/// statistics, spaces and pending calls kept beneath it.
fn own_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    let shown = dir.display();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot make the output folder `{shown}`: {e}"))?;
    let fix = "remove it, or set `defaults.outputDir` to a folder of your own";
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot check the output folder `{shown}`: {e}"))?;
    if !meta.is_dir() {
        return Err(format!(
            "the output folder `{shown}` is not a folder (a symbolic link, which another user \
             may have planted, or a file): {fix}"
        ));
    }
    let uid = rustix::process::getuid().as_raw();
    if meta.uid() != uid {
        return Err(format!(
            "the output folder `{shown}` belongs to user {}, not to this user ({uid}): {fix}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make the output folder `{shown}` private: {e}"))?;
    }
    Ok(())
}

/// Where external calls wait.
#[cfg(feature = "external")]
type PendingStoreRef = Arc<dyn toolmux_external::PendingStore>;

/// How long external calls stay pending and their results unread
/// (`defaults.externalCallTtl`, `externalResultTtl`), in whichever store keeps them.
#[cfg(feature = "external")]
fn external_ttls(loaded: &Loaded) -> (Duration, Duration) {
    let d = &loaded.config.defaults;
    let ttl = |ms: Option<u64>, default| ms.map_or(default, Duration::from_millis);
    (
        ttl(d.external_call_ttl, toolmux_external::DEFAULT_PENDING_TTL),
        ttl(d.external_result_ttl, toolmux_external::DEFAULT_RESULT_TTL),
    )
}

/// How many runs may hold unread results at once (`defaults.externalMaxInboxes`).
#[cfg(feature = "external")]
fn external_max_inboxes(loaded: &Loaded) -> usize {
    let max = loaded.config.defaults.external_max_inboxes;
    max.unwrap_or(toolmux_external::DEFAULT_MAX_INBOXES)
}

/// Whether a tool's calls are shown in spaces (`tools.NAME.showInSpace: true`); refused
/// without `spaces` (`has_spaces`), and on an external tool, which says it with
/// `externalTools.NAME.visible`.
fn shown_in_space(loaded: &Loaded, has_spaces: bool) -> Result<bool, ToolmuxError> {
    let mut shown = false;
    for (name, tool) in &loaded.config.tools {
        if tool.show_in_space != Some(true) {
            continue;
        }
        let refused = |message: String| {
            Err(ToolmuxError::config(
                loaded.source_name(),
                format!("tools.{name}.showInSpace: {message}"),
            ))
        };
        if name.starts_with("external__") {
            return refused(
                "an external tool's calls are shown with `externalTools.NAME.visible`; remove \
                 this key"
                    .to_owned(),
            );
        }
        if !has_spaces {
            let fix = if cfg!(feature = "external") {
                "add a `spaces` section (`spaces: {}` keeps them under the output folder)"
            } else {
                "spaces need toolmux built with the `external` feature"
            };
            return refused(format!(
                "its calls are shown in spaces, and none are configured: {fix}, or remove this key"
            ));
        }
        shown = true;
    }
    Ok(shown)
}

/// Posts the calls of the tools with `tools.NAME.showInSpace` to their caller's active
/// space as they start, and finishes them as they end
/// ([`toolmux_external::Spaces::show_call`]). A caller in no space runs them unshown (the
/// seeds: a visible call made outside a space is displayed nowhere); a space that cannot
/// be written is warned of, and the call runs all the same.
#[cfg(feature = "external")]
#[derive(Debug)]
struct SpaceDisplay(toolmux_external::Spaces);

#[cfg(feature = "external")]
impl toolmux_orchestrator::CallDisplay for SpaceDisplay {
    fn start<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a serde_json::Value,
        ctx: &'a toolmux_core::CallContext,
    ) -> toolmux_orchestrator::DisplayFuture<'a, Option<Box<dyn toolmux_orchestrator::DisplayedCall>>>
    {
        Box::pin(async move {
            let who = toolmux_external::spaces::Who::of(ctx);
            match self.0.show_call(&who, tool, arguments.clone()).await {
                Ok(shown) => shown.map(|shown| {
                    Box::new(ShownInSpace(shown)) as Box<dyn toolmux_orchestrator::DisplayedCall>
                }),
                Err(e) => {
                    tracing::warn!(target: "toolmux::spaces", "the call of {tool} not shown in its space: {}", toolmux_core::error_report(&e));
                    None
                }
            }
        })
    }
}

/// A call posted by [`SpaceDisplay`], finished as it ends.
#[cfg(feature = "external")]
#[derive(Debug)]
struct ShownInSpace(toolmux_external::ShownCall);

#[cfg(feature = "external")]
impl toolmux_orchestrator::DisplayedCall for ShownInSpace {
    fn end<'a>(
        self: Box<Self>,
        end: toolmux_orchestrator::CallEnd<'a>,
    ) -> toolmux_orchestrator::DisplayFuture<'a, ()> {
        use toolmux_orchestrator::CallEnd;
        Box::pin(async move {
            let shown = self.0;
            let finished = match end {
                CallEnd::Answered(output) => shown.answered(output).await,
                CallEnd::Failed(report) => shown.failed(report).await,
                _ => shown.cancelled().await,
            };
            if let Err(e) = finished {
                tracing::warn!(target: "toolmux::spaces", "a shown call not finished in its space: {}", toolmux_core::error_report(&e));
            }
        })
    }
}

/// The external tools, their pending calls in `store` (else in this process).
#[cfg(feature = "external")]
fn external_provider(
    loaded: &Loaded,
    store: Option<Arc<dyn toolmux_external::PendingStore>>,
    spaces: Option<toolmux_external::Spaces>,
) -> Result<(Arc<dyn ToolProvider>, PendingStoreRef), ToolmuxError> {
    use toolmux_external::{DirPendingStore, ExternalProvider, MemoryPendingStore};
    let tools = &loaded.config.external_tools;
    // Pending calls live in the shared backend when there is one, else in their folder
    // (shared by the processes using it), else in this process.
    let store = match store {
        Some(store) => store,
        None => {
            let (calls, results) = external_ttls(loaded);
            let max_inboxes = external_max_inboxes(loaded);
            match loaded.external_calls_dir() {
                Some(dir) => {
                    let store = DirPendingStore::open(dir).map_err(|e| {
                        ToolmuxError::config(
                            loaded.source_name(),
                            format!("defaults.externalCallsDir: {e}"),
                        )
                    })?;
                    let store = store.with_ttl(calls, results).with_max_inboxes(max_inboxes);
                    Arc::new(store) as PendingStoreRef
                }
                None => {
                    let store = MemoryPendingStore::default().with_ttl(calls, results);
                    Arc::new(store.with_max_inboxes(max_inboxes))
                }
            }
        }
    };
    let provider = ExternalProvider::new(tools, store.clone())
        .map_err(|e| ToolmuxError::config(loaded.source_name(), format!("externalTools: {e}")))?;
    let provider = match spaces {
        Some(spaces) => provider.with_spaces(spaces),
        None => provider,
    };
    let provider = match external_http(loaded)? {
        Some(http) => provider.with_http(http),
        None => provider,
    };
    // Each synchronous tool (and `pending`, which long-polls) declares how long it waits
    // (`ToolSpec::time_limit`), so the pipeline waits that long whatever `toolTimeout` says,
    // unless `tools.NAME.timeout` does.
    Ok((Arc::new(provider), store))
}

/// The spaces of `spaces`, when configured, and how many messages entering one gives: in
/// memory (the previous build's, on a reload), or in their folder.
#[cfg(feature = "external")]
fn spaces(
    loaded: &Loaded,
    previous: Option<toolmux_external::Spaces>,
    shared: Option<Arc<dyn toolmux_external::spaces::SpaceStorage>>,
    secrets: &[String],
) -> Result<Option<(toolmux_external::Spaces, usize)>, ToolmuxError> {
    use toolmux_external::Spaces;
    let Some(section) = &loaded.config.spaces else {
        return Ok(None);
    };
    let max = section.max_messages.unwrap_or(toolmux_external::spaces::DEFAULT_MAX_MESSAGES);
    if max == 0 {
        return Err(ToolmuxError::config(
            loaded.source_name(),
            "spaces.maxMessages must be at least 1",
        ));
    }
    let max_spaces = section.max_spaces.unwrap_or(toolmux_external::spaces::DEFAULT_MAX_SPACES);
    if max_spaces == 0 {
        return Err(ToolmuxError::config(
            loaded.source_name(),
            "spaces.maxSpaces must be at least 1",
        ));
    }
    let max_agents = section.max_agents.unwrap_or(toolmux_external::spaces::DEFAULT_MAX_ENTITIES);
    if max_agents == 0 {
        return Err(ToolmuxError::config(
            loaded.source_name(),
            "spaces.maxAgents must be at least 1",
        ));
    }
    let history = section.history.unwrap_or(toolmux_external::DEFAULT_HISTORY);
    if history > toolmux_external::MAX_PAGE {
        return Err(ToolmuxError::config(
            loaded.source_name(),
            format!("spaces.history is {history}; at most {}", toolmux_external::MAX_PAGE),
        ));
    }
    let spaces = if section.in_memory {
        if section.dir.is_some() {
            return Err(ToolmuxError::config(
                loaded.source_name(),
                "spaces: `dir` and `inMemory: true` exclude each other; keep one",
            ));
        }
        previous.unwrap_or_else(Spaces::in_memory)
    } else if let (Some(shared), None) = (shared, &section.dir) {
        // With `backend.redis`, replicas share the spaces, as they share pending calls.
        Spaces::in_storage(shared)
    } else {
        let dir = match &section.dir {
            Some(dir) => loaded.resolve(dir),
            None => loaded.output_dir().join("spaces"),
        };
        Spaces::in_dir(&dir)
            .map_err(|e| ToolmuxError::config(loaded.source_name(), format!("spaces.dir: {e}")))?
    };
    let redactor = toolmux_orchestrator::Redactor::new(secrets.iter().cloned());
    let spaces =
        spaces.with_max_messages(max).with_max_spaces(max_spaces).with_max_entities(max_agents);
    let spaces = if redactor.is_empty() {
        spaces
    } else {
        spaces.with_redaction(move |text| redactor.redact(text).into_owned())
    };
    Ok(Some((spaces, history)))
}

/// The HTTP requests of the external tools with `execution.url` (`executionType: gateway`),
/// made by inline REST tools under the external tools' local names, so that they template,
/// time out, cap responses and follow redirects as `restTools` do; `None` without any.
#[cfg(all(feature = "external", feature = "rest"))]
fn external_http(loaded: &Loaded) -> Result<Option<Arc<dyn ToolProvider>>, ToolmuxError> {
    use toolmux_core::naming;
    use toolmux_external::NAMESPACE;
    let error = |message: String| {
        ToolmuxError::config(loaded.source_name(), format!("externalTools: {message}"))
    };
    // A longer local name would be shortened by the REST provider, and the call, handed over
    // by name, would not find its tool.
    let room = naming::DEFAULT_BUDGET - NAMESPACE.len() - naming::SEPARATOR.len();
    let mut requests = std::collections::BTreeMap::new();
    for (name, tool) in &loaded.config.external_tools {
        let Some(url) = tool.url() else { continue };
        let local = naming::sanitize(name).into_owned();
        if local.len() > room {
            return Err(error(format!(
                "`{name}`: the name of a tool making an HTTP request may have at most {room} \
                 characters; choose a shorter one"
            )));
        }
        let execution = tool.execution.clone().unwrap_or_default();
        // Models see the external tool's schema; the REST tool's only has to be an object
        // schema, which the external one need not declare.
        let declares_object = |s: &serde_json::Value| s.get("type").is_some_and(|t| t == "object");
        let schema = tool.input_schema.clone().filter(declares_object);
        let request = toolmux_rest::RestToolConfig {
            description: Some(tool.description.clone()),
            method: execution.method.unwrap_or_else(|| "GET".to_owned()),
            url: url.to_owned(),
            headers: execution.headers,
            query: std::collections::BTreeMap::new(),
            body: None,
            parameters_schema: Some(
                schema.unwrap_or_else(|| serde_json::json!({"type": "object"})),
            ),
            queue: None,
            cache: None,
            // Both default to 30 s (the seeds' default timeout).
            timeout_ms: tool.timeout,
            stream: false,
            max_response_bytes: None,
            max_redirects: None,
            passthrough_headers: Vec::new(),
            select: None,
        };
        requests.insert(local, request);
    }
    if requests.is_empty() {
        return Ok(None);
    }
    let provider = toolmux_rest::RestProvider::inline_in(NAMESPACE, &requests)
        .map_err(|e| error(e.to_string()))?
        .with_secrets(&loaded.secrets);
    Ok(Some(Arc::new(provider)))
}

/// Without the `rest` feature, a tool with `execution.url` cannot be made.
#[cfg(all(feature = "external", not(feature = "rest")))]
fn external_http(loaded: &Loaded) -> Result<Option<Arc<dyn ToolProvider>>, ToolmuxError> {
    match loaded.config.external_tools.iter().find(|(_, tool)| tool.url().is_some()) {
        Some((name, _)) => Err(ToolmuxError::config(
            loaded.source_name(),
            format!(
                "externalTools: `{name}` makes an HTTP request (`execution.url`), which needs \
                 toolmux built with the `rest` feature"
            ),
        )),
        None => Ok(None),
    }
}

/// The holders of MCP sessions, recorded in Redis under the backend's prefix, and the key
/// the replicas seal `requestState` with, under `{prefix}:mcp:seal-key`.
#[cfg(all(feature = "mcp", feature = "redis"))]
#[derive(Debug)]
struct RedisSessionDirectory {
    owners: toolmux_redis::RedisSessionOwners,
    client: toolmux_redis::RedisClient,
    /// `{prefix}:mcp:seal-key`: 64 hex digits, set once by the first replica and never
    /// expiring; deleting it (with every replica stopped) makes the next start key anew.
    seal_key: String,
}

#[cfg(all(feature = "mcp", feature = "redis"))]
impl RedisSessionDirectory {
    fn new(backend: &toolmux_redis::RedisBackend, prefix: Option<&str>) -> Self {
        let prefix = prefix.unwrap_or(toolmux_redis::DEFAULT_PREFIX);
        RedisSessionDirectory {
            owners: backend.session_owners(),
            client: backend.client().clone(),
            seal_key: format!("{prefix}:mcp:seal-key"),
        }
    }
}

/// The key of `hex` (64 hex digits), as [`RedisSessionDirectory`] stores it.
#[cfg(all(feature = "mcp", feature = "redis"))]
fn seal_key_of(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut key = [0u8; 32];
    for (byte, pair) in key.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(key)
}

#[cfg(all(feature = "mcp", feature = "redis"))]
impl toolmux_mcp::server::SessionDirectory for RedisSessionDirectory {
    fn claim(
        &self,
        session: String,
        owner: String,
        ttl: Duration,
    ) -> toolmux_mcp::server::DirectoryFuture<()> {
        let owners = self.owners.clone();
        Box::pin(async move { Ok(owners.claim(&session, &owner, ttl).await?) })
    }

    fn owner(&self, session: String) -> toolmux_mcp::server::DirectoryFuture<Option<String>> {
        let owners = self.owners.clone();
        Box::pin(async move { Ok(owners.owner(&session).await?) })
    }

    fn release(&self, session: String, owner: String) -> toolmux_mcp::server::DirectoryFuture<()> {
        let owners = self.owners.clone();
        Box::pin(async move {
            owners.release(&session, &owner).await?;
            Ok(())
        })
    }

    fn seal_key(
        &self,
        candidate: [u8; 32],
    ) -> toolmux_mcp::server::DirectoryFuture<Option<[u8; 32]>> {
        let client = self.client.clone();
        let name = self.seal_key.clone();
        Box::pin(async move {
            let hex: String = candidate.iter().map(|b| format!("{b:02x}")).collect();
            // The first replica's candidate is kept; every replica then reads the same key.
            client.command(&["SET", &name, &hex, "NX"]).await?;
            let stored = client.command(&["GET", &name]).await?;
            let key = stored.as_str().and_then(seal_key_of).ok_or_else(|| {
                format!(
                    "`{name}` holds no requestState key (64 hex digits); delete it with every \
                     replica stopped, and the next to start makes another"
                )
            })?;
            Ok(Some(key))
        })
    }
}

/// The Redis backend of `backend.redis`, when configured. Startup waits for the server at
/// most one command timeout: a bad URL or refused credentials are configuration errors, a
/// server that does not answer is a warning (the backend connects when it answers).
#[cfg(feature = "redis")]
async fn redis_backend(
    loaded: &Loaded,
    warnings: &mut Vec<String>,
) -> Result<Option<toolmux_redis::RedisBackend>, ToolmuxError> {
    use toolmux_redis::{RedisBackend, RedisError};
    let Some(config) = loaded.config.backend.as_ref().and_then(|b| b.redis.as_ref()) else {
        return Ok(None);
    };
    let file = loaded.source_name();
    // Errors of the redis crate never carry the URL's password.
    let invalid = |key: &str, e: &RedisError| {
        ToolmuxError::config(
            file,
            format!("backend.redis.{key}: {}", toolmux_core::error_report(e)),
        )
    };
    let backend = RedisBackend::new(config).map_err(|e| match &e {
        RedisError::Setting { key, .. } => invalid(key, &e),
        _ => invalid("url", &e),
    })?;
    match backend.ping().await {
        Ok(()) => {}
        Err(e @ RedisError::Auth { .. }) => return Err(invalid("url", &e)),
        Err(e) => warnings.push(format!(
            "{file}: backend.redis: {}; until it answers, queued calls wait, the cache misses, external calls fail, outputs over the size cap cannot be kept and rate limits hold per replica",
            toolmux_core::error_report(&e)
        )),
    }
    Ok(Some(backend))
}

/// The agents and their models, each model's client built (nothing is sent yet), and
/// agents called as tools given `agentTimeout`. `None` without agents.
#[cfg(feature = "agent")]
fn agents(
    loaded: &Loaded,
    models: &Models,
    config: &mut OrchestratorConfig,
) -> Result<Option<toolmux_agent::Agents>, ToolmuxError> {
    use toolmux_agent::{AgentDefinitions, Agents, NAMESPACE};
    let file = loaded.source_name();
    let section = &loaded.config;
    if section.agents.is_empty() {
        if section.router.as_ref().is_some_and(|r| !r.destinations.is_empty()) {
            return Err(ToolmuxError::config(
                file,
                "router: destinations name agents, but no `agents` are configured",
            ));
        }
        return Ok(None);
    }
    let definitions = AgentDefinitions {
        agents: section.agents.clone(),
        router: section.router.clone(),
        max_depth: section.defaults.agent_max_depth,
        hooks: Arc::new(agent_hooks(loaded)?),
    };
    let agents = Agents::new(definitions, models.clone())
        .map_err(|e| ToolmuxError::config(file, e.to_string()))?;
    let timeout =
        section.defaults.agent_timeout.map_or(DEFAULT_AGENT_TIMEOUT, Duration::from_millis);
    let settings = ToolSettings { timeout: Some(timeout), ..ToolSettings::default() };
    config.providers.entry(NAMESPACE.to_owned()).or_insert(settings);
    Ok(Some(agents))
}

/// The configured models by name.
#[cfg(feature = "agent")]
type Models = std::collections::BTreeMap<String, Arc<dyn toolmux_llm::Model>>;

/// Every configured model's client (nothing is sent yet).
#[cfg(feature = "agent")]
fn models(loaded: &Loaded) -> Result<Models, ToolmuxError> {
    let mut models = Models::new();
    for (name, model) in &loaded.config.models {
        let client = toolmux_llm::connect(name, model)
            .map_err(|e| ToolmuxError::config(loaded.source_name(), e.to_string()))?;
        models.insert(name.clone(), client);
    }
    Ok(models)
}

/// `defaults.samplingModel` as the orchestrator's sampler.
#[cfg(feature = "agent")]
fn sampler(
    loaded: &Loaded,
    models: &Models,
) -> Result<Option<Arc<dyn toolmux_core::InteractionHandler>>, ToolmuxError> {
    let Some(name) = &loaded.config.defaults.sampling_model else { return Ok(None) };
    let Some(model) = models.get(name) else {
        let known: Vec<&str> = models.keys().map(String::as_str).collect();
        return Err(ToolmuxError::config(
            loaded.source_name(),
            format!(
                "defaults.samplingModel: model `{name}` is not configured under `models`{}",
                if known.is_empty() { String::new() } else { format!(" ({})", known.join(", ")) }
            ),
        ));
    };
    Ok(Some(Arc::new(toolmux_llm::ModelSampler::new(model.clone()))))
}

/// How long a call of an agent as a tool may take when `defaults.agentTimeout` is unset.
#[cfg(feature = "agent")]
const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(600);

#[cfg(feature = "rest")]
mod rest {
    use super::*;
    use toolmux_rest::RestProvider;

    pub(super) async fn providers(
        loaded: &Loaded,
        keep: &(dyn Fn(&str) -> bool + Sync),
        config: &mut OrchestratorConfig,
        providers: &mut Vec<Arc<dyn ToolProvider>>,
        warnings: &mut Vec<String>,
    ) -> Result<(), ToolmuxError> {
        let file = loaded.source_name();
        let c = &loaded.config;
        if !c.rest_tools.is_empty() && keep(toolmux_rest::INLINE_NAMESPACE) {
            // The environment's values are redacted even where the crate cannot see they
            // are secret (a token in a URL's path).
            // An entry's mistake is named by its place in the file (`restTools.get`).
            let provider = RestProvider::inline(&c.rest_tools)
                .map_err(|e| match e {
                    toolmux_rest::RestError::Config { name, message } => {
                        ToolmuxError::config(file, format!("restTools.{name}: {message}"))
                    }
                    other => ToolmuxError::config(file, format!("restTools: {other}")),
                })?
                .with_secrets(&loaded.secrets);
            let namespace = provider.namespace().to_owned();
            // Keyed by the name the tool is called by: two entries whose names sanitize
            // alike (`a.b`, `a_b`) have names of their own, and so have their settings.
            let locals = RestProvider::inline_names(&namespace, &c.rest_tools);
            for (name, tool) in &c.rest_tools {
                if tool.queue.is_none() && tool.cache.is_none() {
                    continue;
                }
                let Some(local) = locals.get(name) else { continue };
                // Joins what `tools.NAME` set (a timeout, a size cap), which wins.
                let settings = config.tools.entry(format!("{namespace}__{local}")).or_default();
                if settings.queue.is_none() {
                    settings.queue = tool.queue.clone();
                }
                if settings.cache_ttl.is_none() && tool.cache.is_some() {
                    settings.cache_ttl = tool.cache.map(Duration::from_millis);
                    settings.cache_force = true;
                }
            }
            providers.push(Arc::new(provider));
        }
        for (name, import) in &c.openapi {
            if !keep(import.namespace.as_deref().unwrap_or(name)) {
                continue;
            }
            let import = import.clone().with_base_dir(loaded.base_dir.clone());
            // A document that cannot be read now (a server down, a file not yet made) is
            // this provider failing to start, as an MCP server's would be: reported, the
            // other providers served, and tried again in the background.
            let started = toolmux_rest::OpenApiImport::start(name, &import)
                .await
                .map_err(|e| ToolmuxError::config(file, format!("openapi.{name}: {e}")))?;
            let provider: Arc<dyn ToolProvider> = match started {
                Ok(provider) => {
                    warnings.extend(
                        provider.warnings().iter().map(|w| format!("openapi `{name}`: {w}")),
                    );
                    Arc::new(provider.with_secrets(&loaded.secrets))
                }
                Err((later, _)) => Arc::new(later.with_secrets(&loaded.secrets)),
            };
            let settings = ToolSettings {
                queue: import.queue.clone(),
                cache_ttl: import.cache.map(Duration::from_millis),
                ..ToolSettings::default()
            };
            config.providers.insert(provider.namespace().to_owned(), settings);
            providers.push(provider);
        }
        if let Some(web) = &c.web
            && keep(toolmux_rest::WEB_NAMESPACE)
        {
            let provider = toolmux_rest::WebProvider::new(web)
                .map_err(|e| ToolmuxError::config(file, format!("web: {e}")))?
                .with_secrets(&loaded.secrets);
            providers.push(Arc::new(provider));
        }
        Ok(())
    }
}

/// The `backend.redis` section, without a server: a bad setting fails the build, a
/// server that does not answer is a warning, and the queues then really are Redis's (a
/// queued call finds no slot).
#[cfg(all(test, feature = "redis", feature = "fs"))]
mod redis_tests {
    use super::*;
    use crate::config::{FileFormat, load_str};
    use toolmux_core::{CallContext, ToolCall};

    fn load(yaml: &str, dir: &Path) -> Loaded {
        load_str(yaml, FileFormat::Yaml, "toolmux.yaml", dir, &|_| None).expect("loads")
    }

    #[tokio::test]
    async fn bad_redis_settings_are_configuration_errors_without_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                "{url: 'http://:hunter2@localhost'}",
                "toolmux.yaml: backend.redis.url: invalid redis url `http://:***@localhost`: must start with `redis://`",
            ),
            (
                "{url: 'redis://:hunter2@localhost', leaseMs: 5}",
                "toolmux.yaml: backend.redis.leaseMs: invalid redis setting `leaseMs`: must be at least 100 (slots are renewed every third of it)",
            ),
        ];
        for (section, expected) in cases {
            let loaded = load(&format!("backend:\n  redis: {section}\n"), dir.path());
            let error = Toolmux::build(&loaded).await.unwrap_err().to_string();
            assert_eq!(error, expected);
        }
    }

    #[tokio::test]
    async fn an_unreachable_redis_is_a_warning_and_its_queues_are_used() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "a").unwrap();
        let yaml = "
fs: {}
queues: {q: {concurrent: 1, waitTimeoutMs: 300}}
tools: {fs__read: {queue: q}}
defaults: {outputDir: out}
backend: {redis: {url: 'redis://:hunter2@127.0.0.1:1', timeoutMs: 200}}
";
        let loaded = load(yaml, dir.path());
        let toolmux = Toolmux::build(&loaded).await.unwrap();
        let warning = toolmux.warnings().join("\n");
        assert!(
            warning.contains("backend.redis: cannot connect to redis at 127.0.0.1:1"),
            "{warning}"
        );
        assert!(!warning.contains("hunter2"), "{warning}");
        let orchestrator = toolmux.orchestrator();
        assert!(orchestrator.warmup().await.is_ok());
        let call = ToolCall::new("fs__read", serde_json::json!({"path": "a.txt"}));
        let result = orchestrator.execute(call, &CallContext::new()).await;
        assert!(!result.ok);
        assert_eq!(result.extras.get("code"), Some(&serde_json::json!("queue_busy")), "{result:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::own_private_dir;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_default_output_folder_is_private_and_never_a_planted_link() {
        let tmp = tempfile::tempdir().expect("a folder");
        let mode = |at: &std::path::Path| {
            std::fs::metadata(at).expect("metadata").permissions().mode() & 0o777
        };
        let made = tmp.path().join("toolmux-1");
        own_private_dir(&made).expect("made");
        assert_eq!(mode(&made), 0o700);
        // Made open by an older toolmux: closed.
        let open = tmp.path().join("toolmux-2");
        std::fs::create_dir(&open).expect("made");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        own_private_dir(&open).expect("checked");
        assert_eq!(mode(&open), 0o700);
        // A link planted at the name, pointing where its planter reads: refused.
        let planted = tmp.path().join("toolmux-3");
        std::os::unix::fs::symlink(&open, &planted).expect("link");
        let refused = own_private_dir(&planted).expect_err("refused");
        assert!(
            refused.contains("symbolic link") && refused.contains("defaults.outputDir"),
            "{refused}"
        );
        let file = tmp.path().join("toolmux-4");
        std::fs::write(&file, "x").expect("file");
        assert!(own_private_dir(&file).is_err());
    }
}

/// `restTools` through a real build: what a model is shown of an inline REST tool.
#[cfg(all(test, feature = "rest"))]
mod rest_tests {
    use super::*;
    use crate::config::{FileFormat, load_str};

    /// `BOT_TOKEN` is a credential-named variable, so the loader keeps its value secret.
    fn load(yaml: &str, dir: &Path) -> Loaded {
        let env = |name: &str| (name == "BOT_TOKEN").then(|| "bot-secret-123".to_owned());
        load_str(yaml, FileFormat::Yaml, "toolmux.yaml", dir, &env).expect("loads")
    }

    #[tokio::test]
    async fn a_rest_tool_without_a_description_is_described_by_its_method_and_url() {
        let dir = tempfile::tempdir().expect("a folder");
        let yaml = "defaults: {outputDir: out}
restTools:
  get:
    url: \
                    https://api.example.com/items/${parameters.id}?key=k-12345
  send:
    \
                    method: post
    url: https://user:pw-1234@api.example.com/bot${BOT_TOKEN}/send
  \
                    said:
    description: Looks an item up
    url: https://api.example.com/x
";
        let toolmux = Toolmux::build(&load(yaml, dir.path())).await.expect("built");
        let orchestrator = toolmux.orchestrator();
        let report = orchestrator.warmup().await;
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        let described: std::collections::BTreeMap<String, String> =
            orchestrator.tools().into_iter().map(|t| (t.name, t.description)).collect();
        let expected = [
            ("rest__get", "GET https://api.example.com/items/{id}"),
            ("rest__said", "Looks an item up"),
            ("rest__send", "POST https://api.example.com/REDACTED/send"),
        ];
        for (name, description) in expected {
            assert_eq!(described.get(name).map(String::as_str), Some(description), "{described:?}");
        }
        toolmux.shutdown().await.expect("stopped");
    }

    /// A loopback API answering `{}` to every request, counting them.
    fn counting_api() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("an address"));
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = count.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader =
                    std::io::BufReader::new(stream.try_clone().expect("a second handle"));
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                }
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                      Content-Length: 2\r\nConnection: close\r\n\r\n{}",
                );
            }
        });
        (base, count)
    }

    /// A `restTools` entry's `cache` reaches the tool it was written for when its name
    /// is not the tool's name sanitized: `who.ami` beside `who_ami` (both called
    /// `who_ami_HASH`) and a name too long for the budget. Keyed by the sanitized name,
    /// it reached no tool and every call went to the API.
    #[tokio::test]
    async fn the_cache_of_a_rest_tool_is_keyed_by_its_own_tool_name() {
        use toolmux_core::{CallContext, ToolCall};
        let (base, count) = counting_api();
        let long = "l".repeat(70);
        let dir = tempfile::tempdir().expect("a folder");
        let yaml = format!(
            "defaults: {{outputDir: out}}\nrestTools:\n  who.ami:\n    description: cached\n    \
             url: {base}/a\n    cache: 60000\n  who_ami:\n    description: fresh\n    \
             url: {base}/b\n  {long}:\n    description: long\n    url: {base}/c\n    \
             cache: 60000\n"
        );
        let toolmux = Toolmux::build(&load(&yaml, dir.path())).await.expect("built");
        let orchestrator = toolmux.orchestrator();
        let report = orchestrator.warmup().await;
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        let named: std::collections::BTreeMap<String, String> =
            orchestrator.tools().into_iter().map(|t| (t.description, t.name)).collect();
        let ctx = CallContext::new();
        let calls = async |description: &str| {
            let name = named.get(description).cloned().unwrap_or_default();
            assert!(name.starts_with("rest__"), "{named:?}");
            let before = count.load(std::sync::atomic::Ordering::SeqCst);
            for _ in 0..2 {
                let call = ToolCall::new(&name, serde_json::json!({}));
                let result = orchestrator.execute(call, &ctx).await;
                assert!(result.ok, "{result:?}");
            }
            count.load(std::sync::atomic::Ordering::SeqCst) - before
        };
        assert_eq!(calls("cached").await, 1, "the second call of `who.ami` was not cached");
        assert_eq!(calls("long").await, 1, "the second call of the long name was not cached");
        assert_eq!(calls("fresh").await, 2, "`who_ami` has no cache");
        toolmux.shutdown().await.expect("stopped");
    }

    /// Errors of a call name the tool as the model called it, and a load error the entry
    /// by its place in the file, where both said `get`.
    #[tokio::test]
    async fn errors_name_the_tool_as_called_and_the_entry_by_its_key() {
        use toolmux_core::{CallContext, ToolCall};
        let dir = tempfile::tempdir().expect("a folder");
        let yaml = "defaults: {outputDir: out}\nrestTools:\n  get:\n    url: \
                    http://127.0.0.1:9/items/${parameters.id}\n  at:\n    url: \
                    http://${parameters.host}:9/x\n    parametersSchema:\n      type: object\n      \
                    properties: {host: {enum: [127.0.0.1]}}\n";
        let toolmux = Toolmux::build(&load(yaml, dir.path())).await.expect("built");
        let orchestrator = toolmux.orchestrator();
        let report = orchestrator.warmup().await;
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        let ctx = CallContext::new();
        let empty = ToolCall::new("rest__get", serde_json::json!({"id": ""}));
        let result = orchestrator.execute(empty, &ctx).await;
        let error = result.error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("invalid arguments for `rest__get`: ")
                && error.contains("path argument `id` is empty"),
            "{result:?}"
        );
        let closed = ToolCall::new("rest__at", serde_json::json!({"host": "127.0.0.1"}));
        let result = orchestrator.execute(closed, &ctx).await;
        let error = result.error.as_deref().unwrap_or_default();
        assert!(error.contains("`rest__at`: request to http://127.0.0.1:9/x failed"), "{result:?}");
        toolmux.shutdown().await.expect("stopped");

        let yaml = "defaults: {outputDir: out}\nrestTools:\n  get: {url: ''}\n";
        let Err(error) = Toolmux::build(&load(yaml, dir.path())).await else {
            panic!("an empty url was taken");
        };
        assert_eq!(
            error.to_string(),
            "toolmux.yaml: restTools.get: `url` must start with http:// or https://: ``"
        );
    }
}

/// The `aliases` section through a real build: chains followed to the tool, cycles and
/// names no model API takes refused at load.
#[cfg(all(test, feature = "fs"))]
mod alias_tests {
    use super::*;
    use crate::config::{FileFormat, load_str};
    use toolmux_core::{CallContext, ToolCall};

    fn load(yaml: &str, dir: &Path) -> Loaded {
        load_str(yaml, FileFormat::Yaml, "toolmux.yaml", dir, &|_| None).expect("loads")
    }

    #[tokio::test]
    async fn an_alias_of_an_alias_calls_the_tool() {
        let dir = tempfile::tempdir().expect("a folder");
        std::fs::write(dir.path().join("a.txt"), "hello").expect("written");
        let yaml = "fs: {}\ndefaults: {outputDir: out}\naliases: {rd: fs__read, rd2: rd}\n";
        let toolmux = Toolmux::build(&load(yaml, dir.path())).await.expect("built");
        let orchestrator = toolmux.orchestrator();
        let report = orchestrator.warmup().await;
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        let call = ToolCall::new("rd2", serde_json::json!({"path": "a.txt"}));
        let result = orchestrator.execute(call, &CallContext::new()).await;
        assert!(result.ok, "{result:?}");
        assert!(result.result.as_deref().is_some_and(|r| r.contains("hello")), "{result:?}");
    }

    #[tokio::test]
    async fn a_cycle_of_aliases_and_an_alias_no_model_takes_are_refused() {
        let dir = tempfile::tempdir().expect("a folder");
        let cases = [
            (
                "{a: b, b: c, c: a}",
                "toolmux.yaml: aliases: `a` -> `b` -> `c` -> `a` is a cycle of aliases that \
                 reaches no tool; point one of them at a tool's full name (such as `fs__read`)",
            ),
            (
                "{me: me}",
                "toolmux.yaml: aliases: `me` -> `me` is a cycle of aliases that reaches no \
                 tool; point one of them at a tool's full name (such as `fs__read`)",
            ),
            (
                "{'a b': fs__read}",
                "toolmux.yaml: aliases: `a b` is no valid tool name: model APIs take 1 to 64 \
                 ASCII letters, digits, `_` and `-` (^[a-zA-Z0-9_-]{1,64}$); rename the alias",
            ),
            (
                "{'': fs__read}",
                "toolmux.yaml: aliases: `` is no valid tool name: model APIs take 1 to 64 \
                 ASCII letters, digits, `_` and `-` (^[a-zA-Z0-9_-]{1,64}$); rename the alias",
            ),
        ];
        for (aliases, expected) in cases {
            let yaml = format!("fs: {{}}\ndefaults: {{outputDir: out}}\naliases: {aliases}\n");
            let Err(error) = Toolmux::build(&load(&yaml, dir.path())).await else {
                panic!("aliases {aliases} were taken");
            };
            assert_eq!(error.to_string(), expected);
        }
    }
}

/// An audit log that cannot be opened, through a real build: the error names it and the
/// reason.
#[cfg(test)]
mod audit_log_tests {
    use super::*;
    use crate::config::{FileFormat, load_str};

    #[tokio::test]
    async fn an_audit_log_that_cannot_be_opened_is_named_with_the_reason() {
        let dir = tempfile::tempdir().expect("a folder");
        std::fs::write(dir.path().join("file"), "").expect("written");
        let cases = [
            (
                "file/audit.jsonl",
                "DIR/file/audit.jsonl cannot be opened to append to (make it a writable regular \
                 file in a folder that can be made, or set defaults.auditLog to another path): \
                 DIR/file is not a folder",
            ),
            (
                "/dev/null",
                "/dev/null cannot be opened to append to (make it a writable regular file in a \
                 folder that can be made, or set defaults.auditLog to another path): it is a \
                 character device, not a regular file",
            ),
        ];
        for (log, expected) in cases {
            let yaml = format!("defaults: {{outputDir: out, auditLog: {log}}}\n");
            let loaded = load_str(&yaml, FileFormat::Yaml, "toolmux.yaml", dir.path(), &|_| None)
                .expect("loads");
            let Err(error) = Toolmux::build(&loaded).await else {
                panic!("audit log {log} was opened");
            };
            let message = error.to_string().replace(&dir.path().display().to_string(), "DIR");
            assert_eq!(message, format!("toolmux.yaml: audit log {expected}"));
        }
    }

    /// A statistics file that cannot be read is a warning giving the system's reason, and
    /// promises no `.bad` copy unless the file is of another form, which alone is moved.
    #[tokio::test]
    async fn a_statistics_file_that_cannot_be_read_is_warned_of_with_the_reason() {
        let dir = tempfile::tempdir().expect("a folder");
        std::fs::create_dir(dir.path().join("folder.json")).expect("made");
        std::fs::write(dir.path().join("bad.json"), "not statistics").expect("written");
        let warning = |stats: &str| {
            let yaml = format!("defaults: {{outputDir: out, statsFile: {stats}}}\n");
            let loaded = load_str(&yaml, FileFormat::Yaml, "toolmux.yaml", dir.path(), &|_| None)
                .expect("loads");
            async move {
                let built = Toolmux::build(&loaded).await.expect("builds");
                let warnings = built.warnings().join("\n");
                let _ = built.shutdown().await;
                warnings
            }
        };
        let folder = warning("folder.json").await;
        assert!(folder.contains("statistics start from nothing"), "{folder}");
        assert!(folder.contains("directory") || folder.contains("folder,"), "{folder}");
        assert!(!folder.contains(".bad"), "{folder}");
        let bad = warning("bad.json").await;
        assert!(bad.contains("bad.json.bad when they are saved"), "{bad}");
    }
}

/// The key the replicas seal `requestState` with, in a real `redis-server`.
#[cfg(all(test, feature = "mcp", feature = "redis"))]
mod seal_key_tests {
    use super::RedisSessionDirectory;
    use toolmux_mcp::server::SessionDirectory as _;
    use toolmux_redis::{RedisBackend, RedisConfig};
    use toolmux_test_support::redis::RedisServer;

    /// Two replicas' directories on one Redis agree on the key: the first candidate
    /// offered, whatever the second offers; a key that is not one is an error that says
    /// how to make another.
    #[tokio::test]
    async fn replicas_on_one_redis_share_the_first_key_offered() {
        let redis = RedisServer::start();
        let config = RedisConfig::new(redis.url()).with_prefix("p");
        let backend = |config: &RedisConfig| RedisBackend::new(config).expect("a backend");
        let (a, b) = (backend(&config), backend(&config));
        let (a, b) =
            (RedisSessionDirectory::new(&a, Some("p")), RedisSessionDirectory::new(&b, Some("p")));
        let wait = std::time::Duration::from_secs(10);
        let first = tokio::time::timeout(wait, a.seal_key([1; 32])).await.expect("in time");
        assert_eq!(first.expect("a key"), Some([1; 32]));
        let second = tokio::time::timeout(wait, b.seal_key([2; 32])).await.expect("in time");
        assert_eq!(second.expect("a key"), Some([1; 32]));

        let client = toolmux_redis::RedisClient::new(&config).expect("a client");
        client.command(&["SET", "p:mcp:seal-key", "not hex"]).await.expect("set");
        let broken = tokio::time::timeout(wait, b.seal_key([2; 32])).await.expect("in time");
        let error = broken.expect_err("no key").to_string();
        assert!(error.contains("`p:mcp:seal-key` holds no requestState key"), "{error}");
        assert!(error.contains("delete it"), "{error}");
    }
}
