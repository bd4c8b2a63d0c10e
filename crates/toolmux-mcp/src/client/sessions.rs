//! [`PerSessionProvider`]: one upstream connection (for stdio, one process) per run, for
//! servers that keep state per client (a browser, a shell, a REPL, a login): two clients
//! of the gateway, or two agents' runs, must not share it.
//!
//! A run is what the caller's [`CallContext::run_id`] names: an MCP client's session of
//! `toolmux serve`, a run named with `toolmux/runId`, an agent's run. The tool list,
//! prompts and resources come from one shared connection (the template); only calls go to
//! the run's own. A run's connection is started at its first call, closed after
//! `sessionIdleMs` without calls, and the least recently used idle one is closed when
//! `maxSessions` are open; when all are busy the call fails at once, saying so. A run
//! whose connection was closed that way and calls again gets a new one, and the output of
//! that first call says so (the state it had, a login or open pages, is gone), so that a
//! model does not act on what is no longer there.

use async_trait::async_trait;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    CallContext, Completion, CompletionRequest, ContentPart, JsonObject, Prompt, PromptSpec,
    ResourceContents, ResourceSpec, ResourceTemplate, ResourceUpdates, ToolError, ToolKind,
    ToolListChanges, ToolOutput, ToolProvider, ToolSpec,
};

use super::{McpProvider, McpServerConfig};
use crate::McpError;

/// Runs with a connection of their own at once, by default.
pub const DEFAULT_MAX_SESSIONS: usize = 16;
/// How long a run's connection stays open without calls, by default.
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(300);

/// An MCP server with one connection per run. See the module documentation.
#[derive(Debug)]
pub struct PerSessionProvider {
    inner: Arc<Sessions>,
}

#[derive(Debug)]
struct Sessions {
    name: String,
    config: McpServerConfig,
    template: McpProvider,
    max: usize,
    idle: Duration,
    open: Mutex<HashMap<Arc<str>, Session>>,
    /// Runs whose connection was closed while they may still call (idle, or to make
    /// room), and why; the oldest forgotten past [`REMEMBERED_CLOSED`].
    closed: Mutex<VecDeque<(Arc<str>, Closed)>>,
    shutdown: CancellationToken,
    /// Whether the reaper runs (warmup may come again after a restart).
    reaping: AtomicBool,
}

/// How many closed runs are remembered, to tell them when they call again.
const REMEMBERED_CLOSED: usize = 1024;

/// Why a run's connection was closed.
#[derive(Debug, Clone, Copy)]
enum Closed {
    /// After this long without calls (`sessionIdleMs`).
    Idle(Duration),
    /// To make room for another run's (`maxSessions`).
    Room(usize),
}

impl Closed {
    /// What the first call of the run's new connection says.
    fn note(self, server: &str) -> String {
        let why = match self {
            Closed::Idle(idle) => {
                format!("after {} without calls (`sessionIdleMs`)", human_secs(idle))
            }
            Closed::Room(max) => {
                format!("to make room for another run's, {max} being open (`maxSessions`)")
            }
        };
        format!(
            "(Note: the connection to server `{server}` this run had was closed {why}; this \
             call started a new one, so what the server held for this run before, such as a \
             login, open pages or variables, is gone.)"
        )
    }
}

fn human_secs(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs < 1.0 { format!("{} ms", duration.as_millis()) } else { format!("{secs:.0} s") }
}

#[derive(Debug)]
struct Session {
    provider: Arc<McpProvider>,
    last_used: Instant,
    calls: Arc<Calls>,
}

/// The calls of a session in flight, and whether its run ended meanwhile.
#[derive(Debug, Default)]
struct Calls {
    // Invariant: changed only under the lock of `Sessions::open`, so that a run ending
    // and its last call ending cannot miss each other.
    in_flight: AtomicUsize,
    /// The run ended while a call was in flight: the last call to end closes the session.
    ended: AtomicBool,
}

impl PerSessionProvider {
    /// A provider for the server `name` (its namespace) with a connection per run, at most
    /// `max_sessions` at once, each closed after `idle` without calls.
    pub fn new(
        name: impl Into<String>,
        config: McpServerConfig,
        max_sessions: usize,
        idle: Duration,
    ) -> Result<PerSessionProvider, McpError> {
        let name = name.into();
        let template = McpProvider::new(name.clone(), config.clone())?;
        Ok(PerSessionProvider {
            inner: Arc::new(Sessions {
                name,
                config,
                template,
                max: max_sessions.max(1),
                idle: idle.max(Duration::from_millis(10)),
                open: Mutex::new(HashMap::new()),
                closed: Mutex::new(VecDeque::new()),
                shutdown: CancellationToken::new(),
                reaping: AtomicBool::new(false),
            }),
        })
    }

    /// Starts closing idle sessions, once (at warmup, or the first call without one).
    fn ensure_reaper(&self) {
        if !self.inner.reaping.swap(true, Ordering::AcqRel) {
            spawn_reaper(&self.inner);
        }
    }

    /// The runs with a connection open now.
    pub fn open_sessions(&self) -> Vec<String> {
        let mut runs: Vec<String> = self.inner.lock().keys().map(|k| k.to_string()).collect();
        runs.sort();
        runs
    }

    /// The process id of run `run`'s server (stdio), while its connection is open.
    pub fn session_pid(&self, run: &str) -> Option<i32> {
        self.inner.lock().get(run).and_then(|s| s.provider.server_pid())
    }
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Session>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run's provider, opened if need be, its in-flight count (already counting this
    /// call of `tool`), and why the run's earlier connection was closed when this call
    /// opens a new one; none once the provider is shut down.
    fn session(
        self: &Arc<Self>,
        run: &str,
        tool: &str,
    ) -> Result<(Arc<McpProvider>, InFlight, Option<Closed>), ToolError> {
        let mut open = self.lock();
        // Checked under the lock the shutdown drains the sessions under, after it cancels:
        // a call that passed the caller's check while the shutdown ran would otherwise
        // open a session (and start a server) after the drain, which nothing would close.
        if self.shutdown.is_cancelled() {
            return Err(
                McpError::ShutDown { server: self.name.clone() }.into_tool_error(Some(tool))
            );
        }
        if let Some(session) = open.get_mut(run) {
            session.last_used = Instant::now();
            // The run is back: its session is no longer to close with its last call.
            session.calls.ended.store(false, Ordering::Release);
            let in_flight = InFlight::new(self, run, &session.calls);
            return Ok((session.provider.clone(), in_flight, None));
        }
        if open.len() >= self.max {
            let idlest = open
                .iter()
                .filter(|(_, s)| s.calls.in_flight.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(run, _)| run.clone());
            let Some(idlest) = idlest else {
                return Err(ToolError::Unavailable {
                    provider: self.name.clone(),
                    message: format!(
                        "all {} per-session connections are busy with calls of other runs; \
                         try again when one ends, or raise `maxSessions`",
                        self.max
                    ),
                });
            };
            if let Some(evicted) = open.remove(&idlest) {
                tracing::debug!(server = %self.name, run = %idlest, "closing the least recently used session");
                close(evicted.provider);
                self.remember_closed(idlest, Closed::Room(self.max));
            }
        }
        let provider = McpProvider::new(self.name.clone(), self.config.clone())
            .map_err(|e| e.into_tool_error(None))?;
        let session = Session {
            provider: Arc::new(provider),
            last_used: Instant::now(),
            calls: Arc::default(),
        };
        let earlier = self.forget_closed(run);
        let in_flight = InFlight::new(self, run, &session.calls);
        let handed = (session.provider.clone(), in_flight, earlier);
        tracing::debug!(server = %self.name, run, "opening a session");
        open.insert(Arc::from(run), session);
        Ok(handed)
    }

    fn remember_closed(&self, run: Arc<str>, why: Closed) {
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        closed.retain(|(r, _)| *r != run);
        if closed.len() >= REMEMBERED_CLOSED {
            closed.pop_front();
        }
        closed.push_back((run, why));
    }

    /// Why `run`'s earlier connection was closed, if it was, forgetting it.
    fn forget_closed(&self, run: &str) -> Option<Closed> {
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        let at = closed.iter().position(|(r, _)| &**r == run)?;
        closed.remove(at).map(|(_, why)| why)
    }

    /// Closes the sessions idle for longer than `idle`.
    fn reap(&self) {
        let now = Instant::now();
        let mut open = self.lock();
        let stale: Vec<Arc<str>> = open
            .iter()
            .filter(|(_, s)| {
                s.calls.in_flight.load(Ordering::Acquire) == 0
                    && now.duration_since(s.last_used) >= self.idle
            })
            .map(|(run, _)| run.clone())
            .collect();
        for run in stale {
            if let Some(session) = open.remove(&run) {
                tracing::debug!(server = %self.name, run = %run, "closing an idle session");
                close(session.provider);
                self.remember_closed(run, Closed::Idle(self.idle));
            }
        }
    }
}

/// Shuts a session's provider down in the background: its process group is reaped there.
fn close(provider: Arc<McpProvider>) {
    // Outside a runtime (a session dropped as the process ends) the provider's drop kills
    // the process group instead.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = provider.shutdown().await;
        });
    }
}

/// Counts a call of run `run` in flight until dropped; the last call of a run that ended
/// meanwhile closes its session then.
struct InFlight {
    sessions: Weak<Sessions>,
    run: Arc<str>,
    calls: Arc<Calls>,
}

impl InFlight {
    /// Made under the lock of `Sessions::open` (see [`Calls`]).
    fn new(sessions: &Arc<Sessions>, run: &str, calls: &Arc<Calls>) -> InFlight {
        calls.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight { sessions: Arc::downgrade(sessions), run: Arc::from(run), calls: calls.clone() }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(sessions) = self.sessions.upgrade() else {
            self.calls.in_flight.fetch_sub(1, Ordering::AcqRel);
            return;
        };
        let mut open = sessions.lock();
        let last = self.calls.in_flight.fetch_sub(1, Ordering::AcqRel) == 1;
        if !(last && self.calls.ended.load(Ordering::Acquire)) {
            return;
        }
        // This run's session, not a new one the run got since.
        let ours = open.get(&self.run).is_some_and(|s| Arc::ptr_eq(&s.calls, &self.calls));
        if ours && let Some(session) = open.remove(&self.run) {
            tracing::debug!(server = %sessions.name, run = %self.run, "closing an ended run's session after its last call");
            close(session.provider);
        }
    }
}

/// Closes idle sessions until the provider is shut down or dropped.
fn spawn_reaper(sessions: &Arc<Sessions>) {
    let weak: Weak<Sessions> = Arc::downgrade(sessions);
    let stop = sessions.shutdown.clone();
    let every = (sessions.idle / 4).clamp(Duration::from_millis(5), Duration::from_secs(30));
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let Some(sessions) = weak.upgrade() else { return };
            sessions.reap();
        }
    });
}

#[async_trait]
impl ToolProvider for PerSessionProvider {
    fn kind(&self) -> ToolKind {
        ToolKind::Mcp
    }

    /// Each run talks to a server of its own, whose state (a browser, a shell) answers.
    fn state_per_run(&self) -> bool {
        true
    }

    fn cache_partition(&self, tool: &str, ctx: &CallContext) -> Option<String> {
        self.inner.template.cache_partition(tool, ctx)
    }

    /// The run's server goes with its session, or with the last of its calls still
    /// running.
    fn end_run(&self, run_id: &str) {
        let mut open = self.inner.lock();
        let Some(session) = open.get(run_id) else { return };
        if session.calls.in_flight.load(Ordering::Acquire) > 0 {
            session.calls.ended.store(true, Ordering::Release);
            return;
        }
        if let Some(session) = open.remove(run_id) {
            tracing::debug!(server = %self.inner.name, run = run_id, "closing an ended run's session");
            close(session.provider);
        }
    }

    fn namespace(&self) -> &str {
        self.inner.template.namespace()
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        self.inner.template.list_tools().await
    }

    fn declared_tools(&self) -> Vec<ToolSpec> {
        self.inner.template.declared_tools()
    }

    async fn has_tool(&self, name: &str) -> bool {
        self.inner.template.has_tool(name).await
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(
                McpError::ShutDown { server: self.inner.name.clone() }.into_tool_error(Some(name))
            );
        }
        self.ensure_reaper();
        let (provider, _in_flight, earlier) = self.inner.session(ctx.run_id(), name)?;
        let result = provider.call(name, arguments, ctx).await;
        if let Some(session) = self.inner.lock().get_mut(ctx.run_id()) {
            session.last_used = Instant::now();
        }
        match (result, earlier) {
            (Ok(mut output), Some(why)) => {
                output.content.push(ContentPart::Text { text: why.note(&self.inner.name) });
                Ok(output)
            }
            // Told with the next call that gets through.
            (Err(e), Some(why)) => {
                self.inner.remember_closed(Arc::from(ctx.run_id()), why);
                Err(e)
            }
            (result, None) => result,
        }
    }

    async fn warmup(&self) -> Result<(), ToolError> {
        self.ensure_reaper();
        self.inner.template.warmup().await
    }

    fn instructions(&self) -> Option<String> {
        self.inner.template.instructions()
    }

    async fn shutdown(&self) -> Result<(), ToolError> {
        // Cancelled before the drain: [`Sessions::session`] opens none after it.
        self.inner.shutdown.cancel();
        let sessions: Vec<Session> = self.inner.lock().drain().map(|(_, s)| s).collect();
        let closing = sessions.into_iter().map(|s| async move { s.provider.shutdown().await });
        let results = futures::future::join_all(closing).await;
        let template = self.inner.template.shutdown().await;
        results.into_iter().find(Result::is_err).unwrap_or(template)
    }

    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        self.inner.template.tool_list_changes()
    }

    fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        self.inner.template.prompt_list_changes()
    }

    fn resource_list_changes(&self) -> Option<ToolListChanges> {
        self.inner.template.resource_list_changes()
    }

    async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        self.inner.template.list_prompts().await
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        self.inner.template.get_prompt(name, arguments, ctx).await
    }

    async fn complete(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        self.inner.template.complete(request, ctx).await
    }

    async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        self.inner.template.list_resources().await
    }

    async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        self.inner.template.list_resource_templates().await
    }

    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        self.inner.template.read_resource(uri, ctx).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.inner.template.subscribe_resource(uri).await
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.inner.template.unsubscribe_resource(uri).await
    }

    fn resource_updates(&self) -> Option<ResourceUpdates> {
        self.inner.template.resource_updates()
    }

    /// The shared connection's: the one listing, prompts and resources use.
    fn health(&self) -> toolmux_core::Health {
        self.inner.template.health()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that passed `call`'s shutdown check just before the shutdown began, and
    /// asks for its run's session only after the shutdown drained them, gets none: the
    /// session it would open (and the server it would start) would outlive the shutdown.
    #[tokio::test]
    async fn no_session_opens_once_the_shutdown_drained_them() {
        let config = McpServerConfig::stdio("true", Vec::<String>::new());
        let provider =
            PerSessionProvider::new("late", config, 4, DEFAULT_SESSION_IDLE).expect("valid");
        provider.shutdown().await.expect("shut down");

        let error = provider
            .inner
            .session("run-1", "echo")
            .err()
            .expect("no session is opened after the shutdown");
        assert!(matches!(error, ToolError::Unavailable { .. }), "{}", error.report());
        assert!(provider.open_sessions().is_empty(), "{:?}", provider.open_sessions());
    }
}
