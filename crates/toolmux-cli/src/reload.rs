//! `toolmux serve --watch`: the configuration file is read again when it changes, and the
//! gateway goes on serving with the new one without dropping its clients.
//!
//! A change is taken once the file has stayed the same for a moment (editors write in
//! steps). A file that no longer loads, or whose providers cannot be built, is reported and
//! the previous configuration goes on serving. Otherwise the new orchestrator is built and
//! started beside the old, clients are switched to it at once (and told the lists changed),
//! and the old one is shut down once its calls in flight have ended (at most after
//! [`DRAIN`]). MCP servers whose configuration did not change are taken over running, not
//! restarted, and external calls waiting for results stay answerable. The API keys of
//! `serve.apiKeys` are replaced with the new ones from the next request on; a change of
//! `serve.oauth`, read only at the start, is refused (restart to change it). The new
//! configuration's secrets are cut from what this process prints (its log, what servers
//! print on stderr), beside those of the configurations before. Statistics
//! carry over; the listening address and the serve options of the command line stay as
//! they were started.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolmux::Toolmux;
use toolmux::toolmux_core::{
    CallContext, Completion, CompletionRequest, JsonObject, Prompt, PromptSpec, ResourceContents,
    ResourceSpec, ResourceTemplate, ResourceUpdateNotifier, ResourceUpdates, ToolError, ToolKind,
    ToolListChanges, ToolListNotifier, ToolOutput, ToolProvider, ToolSpec,
};
use toolmux::toolmux_mcp::server::ApiKeys;

/// How often the file is looked at.
const POLL: Duration = Duration::from_millis(500);
/// How long the old orchestrator's calls may go on after a reload.
const DRAIN: Duration = Duration::from_secs(60);

/// The Toolmux serving now; replaced by a reload.
#[derive(Debug, Clone)]
pub(crate) struct Current {
    toolmux: Arc<RwLock<Toolmux>>,
    /// Counts the reloads, for whoever follows the orchestrator serving (event streams).
    reloads: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Current {
    pub(crate) fn new(toolmux: Toolmux) -> Current {
        Current {
            toolmux: Arc::new(RwLock::new(toolmux)),
            reloads: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    pub(crate) fn get(&self) -> Toolmux {
        self.toolmux.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The orchestrator serving now.
    pub(crate) fn orchestrator(&self) -> toolmux::toolmux_orchestrator::Orchestrator {
        self.toolmux.read().unwrap_or_else(|e| e.into_inner()).orchestrator().clone()
    }

    /// Changes at every reload.
    pub(crate) fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    fn replace(&self, toolmux: Toolmux) -> Toolmux {
        let old = std::mem::replace(
            &mut *self.toolmux.write().unwrap_or_else(|e| e.into_inner()),
            toolmux,
        );
        self.reloads.send_modify(|n| *n += 1);
        old
    }
}

/// The provider served: whichever the last reload put in place. Its list changes, and a
/// reload, reach the server as list changes of its own.
#[derive(Debug)]
pub(crate) struct Live {
    current: RwLock<Arc<dyn ToolProvider>>,
    namespace: String,
    tools: ToolListNotifier,
    prompts: ToolListNotifier,
    resources: ToolListNotifier,
    updates: ResourceUpdateNotifier,
    /// Stops forwarding the previous provider's changes.
    forwarding: Mutex<CancellationToken>,
}

impl Live {
    pub(crate) fn new(provider: Arc<dyn ToolProvider>) -> Arc<Live> {
        let live = Arc::new(Live {
            namespace: provider.namespace().to_owned(),
            current: RwLock::new(provider.clone()),
            tools: ToolListNotifier::new(),
            prompts: ToolListNotifier::new(),
            resources: ToolListNotifier::new(),
            updates: ResourceUpdateNotifier::new(),
            forwarding: Mutex::new(CancellationToken::new()),
        });
        live.forward(&provider);
        live
    }

    fn get(&self) -> Arc<dyn ToolProvider> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serves `provider` from now on; every list has changed.
    fn swap(&self, provider: Arc<dyn ToolProvider>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = provider.clone();
        self.forward(&provider);
        self.tools.notify();
        self.prompts.notify();
        self.resources.notify();
    }

    /// Passes `provider`'s changes on until the next swap.
    fn forward(&self, provider: &Arc<dyn ToolProvider>) {
        let stop = CancellationToken::new();
        let previous = std::mem::replace(
            &mut *self.forwarding.lock().unwrap_or_else(|e| e.into_inner()),
            stop.clone(),
        );
        previous.cancel();
        let lists = [
            (provider.tool_list_changes(), self.tools.clone()),
            (provider.prompt_list_changes(), self.prompts.clone()),
            (provider.resource_list_changes(), self.resources.clone()),
        ];
        for (changes, notifier) in lists {
            let Some(mut changes) = changes else { continue };
            let stop = stop.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        changed = changes.changed() => {
                            if !changed { return }
                            notifier.notify();
                        }
                    }
                }
            });
        }
        if let Some(mut updates) = provider.resource_updates() {
            let notifier = self.updates.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        // Passed on with its source, which key holders' views filter by.
                        update = updates.next_update() => match update {
                            Some(update) => notifier.send(update),
                            None => return,
                        },
                    }
                }
            });
        }
    }
}

#[async_trait::async_trait]
impl ToolProvider for Live {
    fn kind(&self) -> ToolKind {
        self.get().kind()
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        self.get().list_tools().await
    }

    async fn has_tool(&self, name: &str) -> bool {
        self.get().has_tool(name).await
    }

    async fn call(
        &self,
        name: &str,
        arguments: serde_json::Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.get().call(name, arguments, ctx).await
    }

    fn relays(&self, name: &str) -> bool {
        self.get().relays(name)
    }

    async fn relay(
        &self,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<toolmux::toolmux_core::Relayed, ToolError> {
        self.get().relay(name, arguments, ctx, raw_max).await
    }

    fn instructions(&self) -> Option<String> {
        self.get().instructions()
    }

    fn health(&self) -> toolmux::toolmux_core::Health {
        self.get().health()
    }

    fn health_by_provider(&self) -> Vec<toolmux::toolmux_core::ProviderHealth> {
        self.get().health_by_provider()
    }

    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        Some(self.tools.subscribe())
    }

    fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        Some(self.prompts.subscribe())
    }

    fn resource_list_changes(&self) -> Option<ToolListChanges> {
        Some(self.resources.subscribe())
    }

    async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        self.get().list_prompts().await
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        self.get().get_prompt(name, arguments, ctx).await
    }

    async fn complete(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        self.get().complete(request, ctx).await
    }

    async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        self.get().list_resources().await
    }

    async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        self.get().list_resource_templates().await
    }

    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        self.get().read_resource(uri, ctx).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.get().subscribe_resource(uri).await
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.get().unsubscribe_resource(uri).await
    }

    fn resource_updates(&self) -> Option<ResourceUpdates> {
        Some(self.updates.subscribe())
    }
}

/// The API keys the server accepts, and how a configuration decides them.
#[derive(Debug)]
pub(crate) struct Keys {
    pub(crate) accepted: ApiKeys,
    pub(crate) rule: crate::commands::KeyRule,
    /// `serve.holderTools`, replaced with the keys.
    pub(crate) holder_tools: crate::commands::HolderToolsMap,
    /// `serve.oauth` as the server started with it: its verifier is not replaced, so a
    /// configuration with another one is refused.
    pub(crate) oauth: Option<toolmux::toolmux_mcp::server::ResourceServerConfig>,
}

/// The files a configuration was read from, and how to read them again.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    /// The project's file, if any.
    pub(crate) project: Option<PathBuf>,
    /// The user's and the managed file, if any.
    pub(crate) layers: toolmux::config::Layers,
    /// The folder the program started in.
    pub(crate) cwd: PathBuf,
}

impl Source {
    /// The configuration `loaded` came from: its project file and its layers' files.
    pub(crate) fn of(loaded: &toolmux::config::Loaded, cwd: PathBuf) -> Source {
        let file = |kind| loaded.layers.iter().find(|l| l.kind == kind).map(|l| l.path.clone());
        let added = loaded.layers.iter().filter(|l| l.kind == toolmux::config::LayerKind::Added);
        let layers = toolmux::config::Layers {
            user: file(toolmux::config::LayerKind::User),
            managed: file(toolmux::config::LayerKind::Managed),
            added: added.map(|l| l.path.clone()).collect(),
        };
        Source { project: loaded.path.clone(), layers, cwd }
    }

    /// The same project file with the user's and managed files looked for again: one
    /// created since is added, one removed is dropped. A layer's folder holding two of its
    /// files (`config.yaml` and `config.json`) keeps the files read so far: which one to
    /// read is the person's to say, and the next start refuses the folder naming both.
    /// With it, why the layers could not be looked for (the source is then this one).
    fn rediscovered(&self) -> (Source, Option<String>) {
        let env = |name: &str| std::env::var(name).ok();
        let found = match toolmux::config::Layers::discover(&env) {
            Ok(found) => found,
            Err(e) => return (self.clone(), Some(toolmux::toolmux_core::error_report(&e))),
        };
        let layers = toolmux::config::Layers {
            user: found.user.filter(|path| self.cwd.join(path).is_file()),
            managed: found.managed.filter(|path| self.cwd.join(path).is_file()),
            added: self.layers.added.clone(),
        };
        (Source { project: self.project.clone(), layers, cwd: self.cwd.clone() }, None)
    }

    /// Every file read, in layer order.
    pub(crate) fn files(&self) -> Vec<PathBuf> {
        let user = self.layers.user.iter();
        let added = self.layers.added.iter();
        user.chain(&self.project).chain(added).chain(&self.layers.managed).cloned().collect()
    }

    fn load(&self) -> Result<toolmux::config::Loaded, toolmux::ToolmuxError> {
        let env = |name: &str| std::env::var(name).ok();
        toolmux::config::load_layered(self.project.as_deref(), &self.cwd, &self.layers, &env)
    }
}

/// What `serve --watch` compares of a file from one look to the next: its bytes, or why it
/// cannot be read (a FIFO or a device in its place, a file too big), which the loader then
/// reports once; `None` while it is missing, as when an editor replaces it.
fn snapshot(file: &Path) -> Option<Result<Vec<u8>, String>> {
    match crate::files::read_regular(file, crate::files::CONFIG) {
        Ok(bytes) => Some(Ok(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(Err(e.to_string())),
    }
}

/// What `serve --watch` saw of each of a source's files at one look, in [`Source::files`]'s
/// order.
pub(crate) type Look = Vec<Option<Result<Vec<u8>, String>>>;

/// The files of `source` as they are now: taken as the configuration is loaded, so that a
/// change made while the servers start (before the watcher first runs) is a change.
pub(crate) fn look(source: &Source) -> Look {
    read_all(&source.files())
}

fn read_all(files: &[PathBuf]) -> Look {
    files.iter().map(|f| snapshot(f)).collect()
}

/// Watches the files of `source` and reloads on change until `stop`, from `first`, what
/// [`look`] saw as the configuration was loaded; `serve_provider` makes the provider served
/// from a Toolmux (the orchestrator, or its `--tools` view).
pub(crate) async fn watch(
    source: Source,
    first: Look,
    current: Current,
    live: Arc<Live>,
    serve_provider: impl Fn(&Toolmux) -> Arc<dyn ToolProvider> + Send + 'static,
    keys: Keys,
    stop: CancellationToken,
) {
    let mut source = source;
    let mut files = source.files();
    let mut seen = first;
    // Why the user's or managed files could not be looked for, said once until it changes.
    let mut problem: Option<String> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(POLL) => {}
        }
        // The user's and managed files are looked for each time: one created after the
        // start is read from then on, one removed is dropped.
        let (candidate, why) = source.rediscovered();
        match why {
            Some(why) if problem.as_ref() != Some(&why) => {
                eprintln!("error: {why}; still serving the previous configuration");
                problem = Some(why);
            }
            Some(_) => {}
            None => problem = None,
        }
        let candidate_files = candidate.files();
        let now = read_all(&candidate_files);
        if now.iter().any(Option::is_none) || (candidate_files == files && now == seen) {
            // Unchanged, or one gone for a moment (an editor replacing it).
            continue;
        }
        // Settled: the same files with the same bytes twice in a row.
        tokio::time::sleep(POLL).await;
        let (again, _) = source.rediscovered();
        if again.files() != candidate_files || read_all(&candidate_files) != now {
            continue;
        }
        source = candidate;
        files = candidate_files;
        seen = now;
        let shown = files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(" + ");
        let loaded = match source.load() {
            Ok(loaded) => loaded,
            Err(e) => {
                // With its causes: why a file cannot be read is one.
                let e = toolmux::toolmux_core::error_report(&e);
                eprintln!(
                    "error: {shown} changed but cannot be used: {e}; still serving the previous configuration"
                );
                continue;
            }
        };
        // The authorization server's verifier is made once, at the start: a changed
        // `serve.oauth` would not be used (and one added in place of the API keys would
        // leave the gateway open to everyone), so it is refused.
        if keys.rule.serves_http() && loaded.config.serve.oauth != keys.oauth {
            eprintln!(
                "error: {shown} changed but cannot be used: serve.oauth differs from the one \
                 toolmux serve started with, and it is read only at the start; restart toolmux \
                 serve to change serve.oauth; still serving the previous configuration"
            );
            continue;
        }
        // Checked before anything starts: a file whose keys cannot be used (a key too short,
        // none left on an address others reach) changes nothing.
        let api_keys = match keys.rule.keys(&loaded) {
            Ok(api_keys) => api_keys,
            Err(e) => {
                eprintln!(
                    "error: {shown} changed but cannot be used: {e}; still serving the previous configuration"
                );
                continue;
            }
        };
        // What the new configuration's servers print is redacted from their start on.
        crate::commands::keep_secrets(&loaded);
        // Counts so far go to the file, so the new orchestrator starts from them.
        let old = current.get();
        if let Err(e) = old.save_stats().await {
            tracing::warn!(
                "cannot save statistics before a reload: {}",
                crate::commands::stop_failure(&e)
            );
        }
        let toolmux = match crate::commands::restart(&loaded, &old).await {
            Ok((toolmux, _report)) => toolmux,
            Err(e) => {
                eprintln!(
                    "error: {shown} changed but cannot be used: {e:#}; still serving the previous configuration"
                );
                continue;
            }
        };
        live.swap(serve_provider(&toolmux));
        keys.accepted.replace(api_keys);
        *keys.holder_tools.write().unwrap_or_else(|e| e.into_inner()) =
            loaded.config.serve.holder_tools.clone();
        let tools = toolmux.orchestrator().tools().len();
        let kept = match toolmux.reused_servers() {
            [] => String::new(),
            names => format!(" (unchanged, still running: {})", names.join(", ")),
        };
        let old = current.replace(toolmux.clone());
        eprintln!("toolmux: reloaded {shown}: serving {tools} tools{kept}");
        tokio::spawn(drain(old, toolmux));
    }
}

/// Shuts the replaced orchestrator down once its calls have ended (its statistics were
/// saved before the new one started, so they are not saved again), leaving running the
/// servers its successor took over.
async fn drain(old: Toolmux, successor: Toolmux) {
    let orchestrator = old.orchestrator().clone();
    let quiet = async {
        while orchestrator.calls_in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let _ = tokio::time::timeout(DRAIN, quiet).await;
    old.cleanup_replaced(&successor).await;
}
