//! [`McpProvider`]: one MCP server as a [`ToolProvider`], with reconnection, timeouts,
//! cancellation, progress and list-change refreshes.

use async_trait::async_trait;
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, NumberOrString, ProgressToken,
    ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestHandle, ServiceError};
use serde_json::Value;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    CallContext, Completion, CompletionRequest, JsonObject, Prompt, PromptSpec, Relayed,
    ResourceContents, ResourceSpec, ResourceTemplate, ResourceUpdates, TaskSupport, ToolError,
    ToolKind, ToolListChanges, ToolListNotifier, ToolOutput, ToolProvider, ToolSpec,
    UrlElicitationRequest,
};

use super::config::{McpServerConfig, TransportKind};
use super::connection::{self, Connection};
use super::content::{declared_spec, tool_output, tool_spec};
use super::filter::ToolFilter;
use super::handler::{Events, ProgressRoute};
use super::oauth::{OAuth, Opener};
use super::passthrough;
use crate::McpError;
use crate::transport::lane::{self, Lane, RawReply};

mod catalog;
mod health;
mod idle;
mod listed;
mod pages;
mod parts;
mod tasks;
mod urls;

/// First delay before reconnecting after a failure; doubled per further failure.
const BACKOFF_BASE: Duration = Duration::from_millis(200);
/// Longest delay between reconnection attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// `input_required` rounds one call may take.
const MAX_INPUT_ROUNDS: usize = 8;
/// Failed restarts in a row allowed before giving up for a while, by default.
const DEFAULT_MAX_RESTARTS: u32 = 5;
/// Once given up on, how long calls fail at once before the server is started again;
/// doubled after each further failed start, up to [`GIVE_UP_PAUSE_MAX`]. A server that
/// failed for a while (its host was down, a dependency was missing) comes back without
/// restarting toolmux.
const GIVE_UP_PAUSE: Duration = Duration::from_secs(10);
/// Longest pause between starts of a server given up on.
const GIVE_UP_PAUSE_MAX: Duration = Duration::from_secs(300);
/// Quiet time after a `tools/list_changed` before the list is fetched again: servers send
/// them in bursts (server-everything sends four as it starts), and one fetch serves a burst.
const REFRESH_QUIET: Duration = Duration::from_millis(40);
/// Longest a refresh waits for a burst of `tools/list_changed` to end.
const REFRESH_MAX_DELAY: Duration = Duration::from_millis(400);
/// How long a shutdown waits for a start under way to stop what it started (a stdio
/// server is killed and reaped within 5 s, a stored connection closed within 3.5 s).
const SHUTDOWN_CONNECT_WAIT: Duration = Duration::from_secs(10);

/// One MCP server as a tool provider: namespace = server name, tools under the server's own
/// names (the orchestrator prefixes `{server}__`).
///
/// Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct McpProvider {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    config: McpServerConfig,
    transport: TransportKind,
    filter: ToolFilter,
    http: Option<connection::Http>,
    events: Arc<Events>,
    notifier: ToolListNotifier,
    /// Serializes connecting; holds the restart bookkeeping.
    restarts: tokio::sync::Mutex<Restarts>,
    current: Mutex<Option<Arc<Connection>>>,
    /// The server's tools after filtering; `None` until first listed (or after a change).
    tools: RwLock<Option<Arc<Vec<ToolSpec>>>>,
    /// Tools the server runs only as tasks, and how it takes them (see `tasks`).
    task_required: RwLock<foldhash::HashMap<String, tasks::Flavor>>,
    instructions: RwLock<Option<String>>,
    /// What [`ToolProvider::health`] tells beyond the connection's own state.
    status: Mutex<health::Status>,
    shutdown: CancellationToken,
    /// Servers of failed starts being killed and reaped, which the shutdown waits for.
    stopping: connection::Stopping,
    /// With `idleShutdownMs`: when the server was last used, to stop it once unused.
    idle: Option<idle::Idle>,
}

#[derive(Debug, Default)]
struct Restarts {
    /// Failures in a row: failed starts, and connections lost since the last start or
    /// successful request.
    failures: u32,
    /// Not before this instant may the next start be tried.
    not_before: Option<Instant>,
}

impl McpProvider {
    /// A provider for the server named `name` (which becomes the namespace). Nothing is
    /// started until [`ToolProvider::warmup`] or the first call.
    pub fn new(name: impl Into<String>, config: McpServerConfig) -> Result<McpProvider, McpError> {
        let name = name.into();
        toolmux_core::naming::validate_namespace(&name)
            .map_err(|e| McpError::Config { server: name.clone(), message: e.to_string() })?;
        let transport = config.transport_kind(&name)?;
        if let Some(url) = config.url.as_deref().filter(|_| transport != TransportKind::Stdio) {
            check_url(&name, transport, url)?;
        }
        let filter = ToolFilter::new(&name, config.tools_allowed.as_deref(), &config.tools_denied)?;
        if !config.passthrough_headers.is_empty()
            && !matches!(transport, TransportKind::Http | TransportKind::Sse)
        {
            return Err(McpError::Config {
                server: name,
                message: format!(
                    "`passthroughHeaders` needs an HTTP server (streamable HTTP or SSE); this \
                     one is {}",
                    transport.as_str()
                ),
            });
        }
        if let Some(never) = config.passthrough_headers.iter().find(|n| !passthrough::passable(n)) {
            return Err(McpError::Config {
                server: name,
                message: format!(
                    "`passthroughHeaders` names `{never}`, which belongs to the connection \
                     itself and is never passed on"
                ),
            });
        }
        let http = match transport {
            TransportKind::Http | TransportKind::Sse => {
                let oauth = config.url.as_deref().and_then(|url| {
                    OAuth::new(
                        &name,
                        url,
                        config.oauth.as_ref(),
                        config.base_dir.as_deref(),
                        &config.headers,
                    )
                });
                Some(connection::Http {
                    client: http_client(&name, &config)?,
                    oauth: oauth.map(Arc::new),
                })
            }
            TransportKind::Stdio | TransportKind::Websocket => None,
        };
        let idle = config.idle_shutdown().map(idle::Idle::new);
        Ok(McpProvider {
            inner: Arc::new(Inner {
                name,
                config,
                transport,
                filter,
                http,
                events: Arc::default(),
                notifier: ToolListNotifier::new(),
                restarts: tokio::sync::Mutex::default(),
                current: Mutex::new(None),
                tools: RwLock::new(None),
                task_required: RwLock::default(),
                instructions: RwLock::new(None),
                status: Mutex::default(),
                shutdown: CancellationToken::new(),
                stopping: connection::Stopping::default(),
                idle,
            }),
        })
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &McpServerConfig {
        &self.inner.config
    }

    /// The protocol revision negotiated with the running server.
    pub fn protocol_version(&self) -> Option<String> {
        self.inner.live().and_then(|c| c.info.as_ref().map(|i| i.protocol_version.to_string()))
    }

    /// Lets this server's OAuth authorization code grant run when the server asks for
    /// authorization: `opener` shows the person the authorization URL. Without an opener
    /// (the default) a server without a valid kept token fails with the advice to run
    /// `toolmux mcp login`. No effect on servers toolmux does not authorize (stdio,
    /// WebSocket, `oauth.enabled: false`, an `Authorization` header).
    pub fn set_oauth_opener(&self, opener: Option<Arc<dyn Opener>>) {
        if let Some(oauth) = self.oauth() {
            oauth.set_opener(opener);
        }
    }

    /// Where this server's OAuth tokens are kept, when toolmux authorizes it.
    pub fn oauth_token_path(&self) -> Option<std::path::PathBuf> {
        self.oauth().and_then(|o| o.store_path().map(std::path::Path::to_path_buf))
    }

    /// What is kept for this server's OAuth, when toolmux authorizes it (read from the
    /// token store; no request is made).
    pub fn oauth_status(&self) -> Option<super::oauth::OAuthStatus> {
        self.oauth().map(|o| o.status())
    }

    /// Whether toolmux authorizes this server with OAuth when it asks.
    pub fn uses_oauth(&self) -> bool {
        self.oauth().is_some()
    }

    /// Forgets this server's OAuth tokens, kept and current; whether any were kept.
    pub async fn oauth_logout(&self) -> Result<bool, McpError> {
        let Some(oauth) = self.oauth() else { return Ok(false) };
        oauth.forget().await.map_err(|e| McpError::Auth {
            server: self.inner.name.clone(),
            message: format!("cannot remove the kept tokens: {e}"),
        })
    }

    fn oauth(&self) -> Option<&Arc<OAuth>> {
        self.inner.http.as_ref().and_then(|h| h.oauth.as_ref())
    }

    /// The process id of a running stdio server (which also leads its process group).
    pub fn server_pid(&self) -> Option<i32> {
        self.inner.live().and_then(|c| c.pid())
    }
}

/// A remote server's `url` is an absolute URL of its transport's schemes. The URL is not
/// repeated in the message: it may carry a secret from the environment.
fn check_url(server: &str, transport: TransportKind, url: &str) -> Result<(), McpError> {
    let invalid = |message: String| McpError::Config { server: server.to_owned(), message };
    let schemes: &[&str] = match transport {
        TransportKind::Websocket => &["ws", "wss"],
        TransportKind::Http | TransportKind::Sse | TransportKind::Stdio => &["http", "https"],
    };
    let wanted = schemes.iter().map(|s| format!("{s}://")).collect::<Vec<_>>().join(" or ");
    if !url.contains("://") {
        // `localhost:8080/mcp` parses, with the scheme `localhost`.
        return Err(invalid(format!("`url` must start with {wanted}")));
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        invalid(format!(
            "`url` is not a valid URL ({e}); give an absolute URL such as http://127.0.0.1:8080/mcp"
        ))
    })?;
    if !schemes.contains(&parsed.scheme()) {
        return Err(invalid(format!(
            "`url` has the scheme `{}`; the {} transport takes {wanted}",
            parsed.scheme(),
            transport.as_str(),
        )));
    }
    Ok(())
}

fn http_client(server: &str, config: &McpServerConfig) -> Result<reqwest::Client, McpError> {
    super::ensure_crypto_provider();
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in &config.headers {
        let invalid = |what: &str| McpError::Config {
            server: server.to_owned(),
            // Never the value: headers carry tokens.
            message: format!("invalid {what} for header `{name}`"),
        };
        let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid("name"))?;
        let mut value =
            reqwest::header::HeaderValue::from_str(value).map_err(|_| invalid("value"))?;
        value.set_sensitive(true);
        headers.insert(header, value);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .redirect(same_origin_redirects())
        .connect_timeout(config.startup_timeout())
        .build()
        .map_err(|e| McpError::Config {
            server: server.to_owned(),
            message: format!("cannot build an HTTP client: {e}"),
        })
}

/// Redirects followed: at most 10, all within the server URL's origin (scheme, host and
/// port). A redirect to another origin is not followed and fails the request naming that
/// origin: reqwest's own policy strips only `Authorization` and `Cookie` across hosts,
/// while the configured `headers` (tokens, API keys) would go along, even from https to
/// http.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    const MAX_REDIRECTS: usize = 10;
    reqwest::redirect::Policy::custom(|attempt| {
        let leaves_origin = attempt.previous().first().is_some_and(|first| {
            first.scheme() != attempt.url().scheme()
                || first.host_str() != attempt.url().host_str()
                || first.port_or_known_default() != attempt.url().port_or_known_default()
        });
        // `previous` starts with the first request's URL, which is no redirect.
        if leaves_origin {
            // The origin only: the path and query may hold a key.
            let origin = attempt.url().origin().ascii_serialization();
            attempt.error(OtherOrigin(origin))
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    })
}

/// Why a redirect was not followed.
#[derive(Debug)]
struct OtherOrigin(String);

impl std::fmt::Display for OtherOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server redirected to another origin, {}, which is not followed: the \
             configured headers and credentials would go there; if the server moved, set \
             `url` to its new address",
            self.0
        )
    }
}

impl std::error::Error for OtherOrigin {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Ends the refresher, which drops the last connection handle: the session closes
        // and the server's process group is killed (see `ChildGroup`'s drop).
        self.shutdown.cancel();
    }
}

impl Inner {
    fn live(&self) -> Option<Arc<Connection>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).clone().filter(|c| c.is_alive())
    }

    /// The live connection, starting or restarting the server if needed.
    async fn connection(self: &Arc<Self>) -> Result<Arc<Connection>, McpError> {
        if self.shutdown.is_cancelled() {
            return Err(McpError::ShutDown { server: self.name.clone() });
        }
        if let Some(idle) = &self.idle {
            idle.touch();
        }
        if let Some(connection) = self.live() {
            return Ok(connection);
        }
        // Connecting is a large future (spawn, handshake, every transport's state: about
        // 14 KB); every call's future holds this one, so it is boxed and only a call that
        // connects pays for it. Inline, each call moved the 14 KB into its box.
        Box::pin(self.connect()).await
    }

    /// [`Inner::connection`] when there is no live connection: connects, or waits for the
    /// call that is connecting.
    async fn connect(self: &Arc<Self>) -> Result<Arc<Connection>, McpError> {
        let mut restarts = self.restarts.lock().await;
        if let Some(connection) = self.live() {
            return Ok(connection);
        }
        if self.shutdown.is_cancelled() {
            return Err(McpError::ShutDown { server: self.name.clone() });
        }
        let max = self.max_restarts();
        let now = Instant::now();
        if restarts.failures > max
            && let Some(at) = restarts.not_before.filter(|at| *at > now)
        {
            // Given up for now: calls fail at once until the pause is over, and then one
            // more start is tried.
            let restarts = restarts.failures - 1;
            let left = at - now;
            let retry_in = Duration::from_secs(left.as_secs() + u64::from(left.subsec_nanos() > 0));
            self.set_problem(format!(
                "gave up after {restarts} failed restarts; tries again in {} s",
                retry_in.as_secs()
            ));
            return Err(McpError::GaveUp { server: self.name.clone(), restarts, retry_in });
        }
        let dead = self.current.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(dead) = dead {
            dead.close().await;
        }
        if let Some(at) = restarts.not_before {
            tokio::select! {
                () = tokio::time::sleep_until(at) => {}
                () = self.shutdown.cancelled() => return Err(McpError::ShutDown { server: self.name.clone() }),
            }
        }
        let result = connection::connect(
            &self.name,
            &self.config,
            self.transport,
            self.http.as_ref(),
            &self.events,
            &self.shutdown,
            &self.stopping,
        )
        .await;
        match result {
            Ok(connection) => {
                let connection = Arc::new(connection);
                // Stored only while the provider runs, decided under the lock that
                // `shutdown` takes the connection under after cancelling: a start that
                // finished as the shutdown began was stored after the shutdown's sweep,
                // and its server lived on until the provider was dropped.
                let stored = {
                    let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
                    let running = !self.shutdown.is_cancelled();
                    if running {
                        *current = Some(connection.clone());
                    }
                    running
                };
                if !stored {
                    connection.close().await;
                    return Err(McpError::ShutDown { server: self.name.clone() });
                }
                let instructions = connection.info.as_ref().and_then(|i| i.instructions.clone());
                *self.instructions.write().unwrap_or_else(|e| e.into_inner()) = instructions;
                tracing::debug!(
                    server = %self.name,
                    protocol = ?connection.info.as_ref().map(|i| i.protocol_version.to_string()),
                    "mcp server connected"
                );
                *self.status.lock().unwrap_or_else(|e| e.into_inner()) = health::Status::default();
                spawn_refresher(Arc::downgrade(self), connection.clone());
                if let Some(every) = self.config.health_check_interval() {
                    health::spawn_check(Arc::downgrade(self), connection.clone(), every);
                }
                if self.idle.is_some() {
                    idle::spawn_watch(Arc::downgrade(self), connection.clone());
                }
                self.after_connect(&connection).await;
                // A list held from an earlier connection may not be this server's: it
                // restarted (a crash, an idle stop, a new version behind the same URL).
                if self.cached_tools().is_some() {
                    self.reread_tools(&connection).await;
                }
                // The server started and answered its handshake: whatever crashed it
                // before, it works, and the failures in a row start again from none.
                *restarts = Restarts::default();
                if self.config.lazy {
                    // A lazy server lists no prompts or resources until it runs: now it
                    // does, and clients that listed them are told to list again.
                    self.announce_catalog(&connection);
                }
                Ok(connection)
            }
            // Not the server's failure: nothing to count, nothing to warn of.
            Err(e @ McpError::ShutDown { .. }) => Err(e),
            Err(e) => {
                Self::count_failure(&mut restarts, max);
                self.set_problem("failed to start".to_owned());
                tracing::warn!(server = %self.name, error = %e, "mcp server failed to start");
                Err(e)
            }
        }
    }

    fn max_restarts(&self) -> u32 {
        self.config.max_restarts.unwrap_or(DEFAULT_MAX_RESTARTS)
    }

    /// Counts a failure in a row and says when the next start may be tried: after a
    /// backoff, or once more than `max` restarts failed, after a pause that doubles with
    /// each further failed start.
    fn count_failure(restarts: &mut Restarts, max: u32) {
        restarts.failures = restarts.failures.saturating_add(1);
        // `u32::MAX` restarts is as good as no end to them.
        let delay = match restarts.failures.checked_sub(max.saturating_add(1)) {
            Some(beyond) => {
                GIVE_UP_PAUSE.saturating_mul(1u32 << beyond.min(16)).min(GIVE_UP_PAUSE_MAX)
            }
            None => {
                let factor = 1u32 << (restarts.failures - 1).min(16);
                BACKOFF_BASE.saturating_mul(factor).min(BACKOFF_MAX)
            }
        };
        restarts.not_before = Some(Instant::now() + delay);
    }

    /// Records that a connection died under a request.
    async fn connection_lost(&self) {
        let mut restarts = self.restarts.lock().await;
        Self::count_failure(&mut restarts, self.max_restarts());
        // The first restart after a crash is immediate; backoff applies from the second.
        if restarts.failures == 1 {
            restarts.not_before = None;
        }
    }

    /// Records a successful request: the server works again.
    fn succeeded(&self) {
        if let Ok(mut restarts) = self.restarts.try_lock() {
            restarts.failures = 0;
            restarts.not_before = None;
        }
    }

    /// Lists the server's tools (every page) and stores them filtered.
    async fn fetch_tools(&self, connection: &Connection) -> Result<Arc<Vec<ToolSpec>>, McpError> {
        let timeout = self.config.request_timeout();
        let listing = pages::all_pages(&self.name, "tools/list", async |params| {
            listed::tools_page(&self.name, &connection.peer, params).await
        });
        let listed = match tokio::time::timeout(timeout, listing).await {
            Ok(Ok(tools)) => {
                connection.answered();
                tools
            }
            Ok(Err(e)) => return Err(self.service_error(connection, "tools/list", e)),
            Err(_) => {
                connection.timed_out();
                return Err(McpError::Protocol {
                    server: self.name.clone(),
                    message: format!("no answer to tools/list within {}ms", timeout.as_millis()),
                });
            }
        };
        let mut tools: Vec<ToolSpec> =
            listed.into_iter().filter(|t| self.filter.allows(&t.name)).map(tool_spec).collect();
        for tool in &mut tools {
            listed::fit(&self.name, tool);
        }
        // A tool the server runs only as a task is called as one here, so to the caller it
        // takes tasks or plain calls alike.
        let flavor = tasks::Flavor::listed(connection);
        let mut required = self.task_required.write().unwrap_or_else(|e| e.into_inner());
        // What the list says from now on: a tool that no longer requires tasks is called
        // plainly again (one learnt from a refusal is learnt again by the next refusal).
        required.clear();
        for tool in tools.iter_mut().filter(|t| t.annotations.task_support == TaskSupport::Required)
        {
            required.insert(tool.name.clone(), flavor);
            tool.annotations.task_support = TaskSupport::Optional;
        }
        drop(required);
        let tools = Arc::new(tools);
        *self.tools.write().unwrap_or_else(|e| e.into_inner()) = Some(tools.clone());
        Ok(tools)
    }

    /// Lists the tools again and tells listeners when the list differs from the one
    /// held; a failed listing keeps the list held.
    async fn reread_tools(&self, connection: &Connection) {
        let Some(held) = self.cached_tools() else { return };
        match self.fetch_tools(connection).await {
            Ok(now) if *now != *held => {
                tracing::info!(server = %self.name, "the tool list changed; telling listeners");
                self.notifier.notify();
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(server = %self.name, error = %e, "cannot re-read the tool list");
            }
        }
    }

    fn service_error(
        &self,
        connection: &Connection,
        method: &'static str,
        error: ServiceError,
    ) -> McpError {
        match error {
            // The server wrote something for an answer that is none.
            ServiceError::McpError(data) if crate::transport::is_unreadable_answer(&data) => {
                McpError::Protocol {
                    server: self.name.clone(),
                    message: format!("the answer to {method} is {}", data.message),
                }
            }
            // Its POST was sent and got no answer in time; the connection goes on (legacy
            // SSE).
            ServiceError::McpError(data) if crate::transport::is_outcome_unknown(&data) => {
                McpError::OutcomeUnknown {
                    server: self.name.clone(),
                    method,
                    message: data.message.into_owned(),
                }
            }
            // Sent over streamable HTTP, its answer lost with the session or its stream;
            // the connection goes on.
            ServiceError::McpError(data) if crate::transport::is_answer_lost(&data) => {
                McpError::OutcomeUnknown {
                    server: self.name.clone(),
                    method,
                    message: data.message.into_owned(),
                }
            }
            ServiceError::TransportSend(_) if connection::is_unanswered_across_renewal(&error) => {
                McpError::OutcomeUnknown {
                    server: self.name.clone(),
                    method,
                    message: format!(
                        "the server forgot the session and sent no answer within {} s of \
                         that, and a new session was started",
                        connection::SESSION_RECOVERY_TIMEOUT.as_secs()
                    ),
                }
            }
            // Its POST failed; the connection goes on (legacy SSE).
            ServiceError::McpError(data) if crate::transport::is_undelivered(&data) => {
                McpError::Undelivered {
                    server: self.name.clone(),
                    method,
                    message: data.message.into_owned(),
                }
            }
            ServiceError::McpError(data) => McpError::Rpc {
                server: self.name.clone(),
                method,
                code: data.code.0,
                message: data.message.into_owned(),
            },
            ServiceError::TransportClosed => connection.lost(),
            ServiceError::TransportSend(e) => connection.unsent(method, &e),
            other => McpError::Protocol {
                server: self.name.clone(),
                message: format!("{method}: {other}"),
            },
        }
    }

    fn declared(&self) -> Vec<ToolSpec> {
        self.config
            .tools
            .iter()
            .filter(|t| self.filter.allows(&t.name))
            .map(declared_spec)
            .collect()
    }

    fn cached_tools(&self) -> Option<Arc<Vec<ToolSpec>>> {
        self.tools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn call(
        self: &Arc<Self>,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let tool_error = |e: McpError| e.into_tool_error(Some(name));
        if !self.config.is_enabled() {
            return Err(ToolError::Unavailable {
                provider: self.name.clone(),
                message: "disabled in the configuration (`enabled: false`)".into(),
            });
        }
        if !self.filter.allows(name) {
            return Err(ToolError::UnknownTool { name: name.to_owned(), suggestions: Vec::new() });
        }
        let arguments = match arguments {
            Value::Object(map) => Some(map),
            Value::Null => None,
            other => {
                return Err(ToolError::invalid_arguments(
                    name,
                    format!("arguments must be an object, not {other}"),
                ));
            }
        };
        let connection = tokio::select! {
            connection = self.connection() => connection.map_err(tool_error)?,
            () = ctx.cancel_token().cancelled() => return Err(ToolError::Cancelled { tool: name.to_owned() }),
        };
        if let Some(tools) =
            self.cached_tools().filter(|tools| !tools.iter().any(|t| t.name == name))
        {
            let mut suggestions: Vec<String> =
                tools.iter().map(|t| t.name.clone()).filter(|t| similar(t, name)).collect();
            suggestions.truncate(3);
            return Err(ToolError::UnknownTool { name: name.to_owned(), suggestions });
        }
        self.rounds(&connection, name, arguments, ctx, None).await
    }

    /// The rest of [`Inner::call`] on `connection`: the call's requests, from the first to
    /// its answer. `first`: the reply the first request already got (it was relayed).
    async fn rounds(
        &self,
        connection: &Arc<Connection>,
        name: &str,
        arguments: Option<JsonObject>,
        ctx: &CallContext,
        mut first: Option<Box<Reply>>,
    ) -> Result<ToolOutput, ToolError> {
        let tool_error = |e: McpError| e.into_tool_error(Some(name));
        let connection = connection.clone();
        // Boxed, as are the task calls below: rarely run, and a call's future holds them.
        if first.is_none() && self.requires_task(name) == Some(tasks::Flavor::Augmented) {
            let result =
                Box::pin(self.call_as_task(&connection, name, arguments.as_ref(), ctx)).await?;
            self.succeeded();
            return Ok(tool_output(result));
        }
        let mut params = CallToolRequestParams::new(name.to_owned());
        params.arguments = arguments;
        // The trace this call belongs to goes on to the server (SEP-414).
        if let Some(trace) = ctx.outgoing_trace() {
            let meta = &mut params.meta.get_or_insert_default().0;
            meta.set_traceparent(trace.to_string());
            if let Some(state) = ctx.trace_state() {
                meta.set_tracestate(state);
            }
        }
        // The client's headers this server is to get (`passthroughHeaders`), for the
        // connection's HTTP client to send as headers (see `passthrough`).
        if !self.config.passthrough_headers.is_empty() {
            let passed: serde_json::Map<String, Value> = self
                .config
                .passthrough_headers
                .iter()
                .filter(|name| passthrough::passable(name))
                .filter_map(|name| {
                    let value = ctx.caller_header(name)?;
                    Some((name.to_ascii_lowercase(), Value::String(value.to_owned())))
                })
                .collect();
            if !passed.is_empty() {
                let meta = &mut params.meta.get_or_insert_default().0.0;
                meta.insert(passthrough::PASSTHROUGH_META_KEY.into(), Value::Object(passed));
            }
        }
        // 2026-07-28 servers may answer `input_required` (MRTR): the call is sent again
        // with the answers, a bounded number of times.
        let mut opened_urls = false;
        let mut declare_tasks = false;
        for _round in 0..MAX_INPUT_ROUNDS {
            // A tool that runs only as a task of the tasks extension (SEP-2663) is called
            // declaring the extension, and the task it creates is followed to its end.
            let as_task =
                declare_tasks || self.requires_task(name) == Some(tasks::Flavor::Extension);
            let reply = match first.take() {
                Some(reply) => *reply,
                None => self.call_once(&connection, name, &mut params, as_task, ctx).await?,
            };
            let result = match reply {
                Reply::Answer(result) => result,
                // Refused for want of a task (and so not run): sent again as one.
                Reply::NeedsTask(tasks::Flavor::Extension) if !as_task => {
                    declare_tasks = true;
                    continue;
                }
                Reply::NeedsTask(tasks::Flavor::Augmented) => {
                    let arguments = params.arguments.as_ref();
                    let result =
                        Box::pin(self.call_as_task(&connection, name, arguments, ctx)).await?;
                    self.succeeded();
                    return Ok(tool_output(result));
                }
                Reply::NeedsTask(tasks::Flavor::Extension) => {
                    let what = format!(
                        "`{name}` was refused for want of the tasks extension, which the call declared"
                    );
                    return Err(tool_error(self.protocol(&what)));
                }
                // The server needs the user to open URLs first (`-32042`): once they did,
                // the call is sent again, once.
                Reply::OpenUrls(urls) if !opened_urls => {
                    Box::pin(self.open_urls(name, urls, ctx)).await?;
                    opened_urls = true;
                    continue;
                }
                Reply::OpenUrls(urls) => return Err(urls::still_required(name, &urls)),
            };
            match result {
                ServerResult::CallToolResult(result) => {
                    self.succeeded();
                    return Ok(tool_output(result));
                }
                ServerResult::CreateTaskResult(created) => {
                    let result =
                        Box::pin(self.follow_task(&connection, name, created, ctx)).await?;
                    self.succeeded();
                    return Ok(tool_output(result));
                }
                ServerResult::InputRequiredResult(input) => {
                    let (responses, state) = Box::pin(self.answer_inputs(name, input, ctx)).await?;
                    params.input_responses = responses;
                    params.request_state = state;
                }
                other => match parts::call_result(&other) {
                    Ok((result, notes)) => {
                        self.succeeded();
                        for note in notes {
                            tracing::warn!(server = %self.name, tool = name, "tools/call: {note}");
                        }
                        return Ok(tool_output(result));
                    }
                    Err(why) => {
                        let what = format!(
                            "the answer to tools/call of `{name}` is no tool result: {why}"
                        );
                        return Err(tool_error(self.protocol(&what)));
                    }
                },
            }
        }
        Err(tool_error(
            self.protocol(&format!(
                "`{name}` still asked for input after {MAX_INPUT_ROUNDS} rounds"
            )),
        ))
    }

    fn protocol(&self, message: &str) -> McpError {
        McpError::Protocol { server: self.name.clone(), message: message.to_owned() }
    }

    /// One `tools/call` round trip with the call's timeout, cancellation and progress:
    /// on the connection's direct lane when it has one, else through rmcp's session.
    async fn call_once(
        &self,
        connection: &Connection,
        name: &str,
        params: &mut CallToolRequestParams,
        as_task: bool,
        ctx: &CallContext,
    ) -> Result<Reply, ToolError> {
        match &connection.lane {
            // Only connections of the handshake revisions have a lane.
            Some(lane) => self.call_on_lane(connection, lane, name, params, as_task, ctx).await,
            // Boxed: rmcp's request futures are large, and a call's future holds this one.
            None => Box::pin(self.call_on_session(connection, name, params, as_task, ctx)).await,
        }
    }

    /// [`Inner::call_once`] through rmcp's session (every transport but stdio's lane).
    async fn call_on_session(
        &self,
        connection: &Connection,
        name: &str,
        params: &CallToolRequestParams,
        as_task: bool,
        ctx: &CallContext,
    ) -> Result<Reply, ToolError> {
        let tool_error = |e: McpError| e.into_tool_error(Some(name));
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params.clone()));
        let mut options = PeerRequestOptions::no_options();
        options.meta = catalog::request_meta(connection, ctx);
        if as_task {
            options.meta.get_or_insert_default().extend(tasks::tasks_meta());
        }
        // In flight from before the send: the server may ask its questions at once, and
        // those naming the request (its stream, its token) wait for the link below.
        let flight = self.events.flights.begin_sending(ctx);
        // So are its reports: rmcp chooses the progress token as it queues the request,
        // and a server reporting at once can be read before the route below is in.
        let sending = self.events.sending();
        let handle = match connection.peer.send_cancellable_request(request, options).await {
            Ok(handle) => handle,
            Err(e) => {
                drop(sending);
                self.connection_lost().await;
                return Err(tool_error(self.service_error(connection, "tools/call", e)));
            }
        };
        let activity = Arc::new(Notify::new());
        let token = handle.progress_token.clone();
        flight.link_request(token.clone(), handle.id.clone());
        let mut pending = Pending(Some(handle));
        // The guard first: the route is taken out however the call ends.
        let _unroute = Unroute { events: &self.events, token: token.clone() };
        sending.route(
            token,
            ProgressRoute { sink: ctx.progress_sink().cloned(), activity: activity.clone() },
        );
        let response = async {
            match pending.0.as_mut() {
                Some(handle) => {
                    (&mut handle.rx).await.unwrap_or(Err(ServiceError::TransportClosed))
                }
                None => Err(ServiceError::TransportClosed),
            }
        };
        let waited = self.wait(response, &activity, ctx).await;
        let handle = pending.0.take();
        if let (Some(reason), Some(handle)) = (waited.abandons(), handle) {
            let _ =
                tokio::time::timeout(CANCEL_SEND_GRACE, handle.cancel(Some(reason.into()))).await;
        }
        if let Some(refused) = self.refusal(name, &waited) {
            return Ok(refused);
        }
        self.reply(connection, name, waited).await.map(Reply::Answer)
    }

    /// [`Inner::call_once`] on the direct lane: the request is written to the server's
    /// stdin here and its response comes straight from the reader of its stdout.
    async fn call_on_lane(
        &self,
        connection: &Connection,
        lane: &Arc<Lane>,
        name: &str,
        params: &mut CallToolRequestParams,
        as_task: bool,
        ctx: &CallContext,
    ) -> Result<Reply, ToolError> {
        let tool_error = |e: McpError| e.into_tool_error(Some(name));
        if as_task {
            params.meta.get_or_insert_default().extend(tasks::tasks_meta());
        }
        let Some(mut sent) = lane.open() else {
            return Err(tool_error(connection.lost()));
        };
        let token = ProgressToken(NumberOrString::String(sent.id.clone()));
        params.meta.get_or_insert_default().set_progress_token(token.clone());
        let line = match lane::call_line(&sent.id, params) {
            Ok(line) => line,
            Err(e) => {
                lane.forget(sent.number);
                return Err(ToolError::invalid_arguments(name, format!("cannot encode: {e}")));
            }
        };
        let waiting = lane::Waiting::new(lane, sent.number, &sent.id);
        let followed = self.follow(ctx, token);
        // The write is waited for as the response is: a server that stops reading its
        // stdin cannot hold a call past its timeout or its cancellation (a write stopped
        // halfway closes the pipe, see `Lane::write`).
        let response = async {
            lane.write(&line).await.map_err(|_| ServiceError::TransportClosed)?;
            (&mut sent.reply).await.unwrap_or(Err(ServiceError::TransportClosed))
        };
        let waited = self.wait(response, &followed.activity, ctx).await;
        match waited.abandons() {
            Some(reason) => waiting.abandon(reason).await,
            None => waiting.finish(),
        }
        if let Some(refused) = self.refusal(name, &waited) {
            return Ok(refused);
        }
        self.reply(connection, name, waited).await.map(Reply::Answer)
    }

    /// Whether a call of `name` can be relayed now (see [`ToolProvider::relays`]): the
    /// server is reached over stdio (whose connections have a lane), and nothing about
    /// the call needs its arguments decoded (no headers to pass on, no task to run it as).
    /// Cheap, as it is asked before every call: whether the server runs now is for
    /// [`Inner::relay`] to find out, which makes the call the usual way when it does not.
    fn relays(&self, name: &str) -> bool {
        self.transport == TransportKind::Stdio
            && self.config.is_enabled()
            && self.config.passthrough_headers.is_empty()
            && self.filter.allows(name)
            && self.requires_task(name).is_none()
    }

    /// [`ToolProvider::relay`]: the first request goes on the lane with the arguments as
    /// they came, and a plain text result of at most `raw_max` bytes comes back as the
    /// server wrote it. Any other answer continues as in [`Inner::call`], the arguments
    /// decoded then.
    async fn relay(
        self: &Arc<Self>,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<Relayed, ToolError> {
        let decoded = || match toolmux_core::parse_arguments(name, arguments)? {
            Value::Object(map) => Ok(Some(map)),
            other => Err(ToolError::invalid_arguments(
                name,
                format!("arguments must be an object, not {other}"),
            )),
        };
        // `relays` was asked just before; what may have changed since is checked again.
        let usable = !self.shutdown.is_cancelled() && self.requires_task(name).is_none();
        let on_lane = if usable { self.live() } else { None }
            .and_then(|connection| connection.lane.clone().map(|lane| (connection, lane)));
        let Some((connection, lane)) = on_lane else {
            // Not running (the usual call starts it), or changed: the call goes the usual way.
            let arguments = decoded()?.map_or(Value::Null, Value::Object);
            return Box::pin(self.call(name, arguments, ctx)).await.map(Relayed::Output);
        };
        if let Some(idle) = &self.idle {
            idle.touch();
        }
        match self.relay_once(&connection, &lane, name, arguments, ctx, raw_max).await? {
            RelayReply::Raw(json) => {
                self.succeeded();
                Ok(Relayed::Raw { json, is_error: false })
            }
            RelayReply::Reply(reply) => {
                let arguments = decoded()?;
                Box::pin(self.rounds(&connection, name, arguments, ctx, Some(reply)))
                    .await
                    .map(Relayed::Output)
            }
        }
    }

    /// [`Inner::call_on_lane`] for a relayed call: the request line is spliced from the
    /// arguments' text, and the result is read raw.
    async fn relay_once(
        &self,
        connection: &Connection,
        lane: &Arc<Lane>,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<RelayReply, ToolError> {
        let early =
            ctx.early_answer().map(|answer| lane::Early { max: raw_max, answer: answer.clone() });
        let Some(mut sent) = lane.open_raw(early) else {
            return Err(connection.lost().into_tool_error(Some(name)));
        };
        let trace = ctx.outgoing_trace().map(|trace| trace.to_string());
        let state = trace.as_ref().and(ctx.trace_state());
        let line = lane::relay_line(&sent.id, name, arguments, trace.as_deref(), state);
        let waiting = lane::Waiting::new(lane, sent.number, &sent.id);
        let followed = self.follow(ctx, ProgressToken(NumberOrString::String(sent.id.clone())));
        let closed = || RawReply::Other(Box::new(Err(ServiceError::TransportClosed)));
        let response = async {
            if lane.write(&line).await.is_err() {
                return closed();
            }
            (&mut sent.reply).await.unwrap_or_else(|_| closed())
        };
        let waited = self.wait(response, &followed.activity, ctx).await;
        match waited.abandons() {
            Some(reason) => waiting.abandon(reason).await,
            None => waiting.finish(),
        }
        let waited = waited.map(|reply| match reply {
            RawReply::Plain(raw) => Ok(raw),
            RawReply::Result(raw) => {
                if raw.len() <= raw_max && crate::transport::plain_text_result(&raw) {
                    return Ok(raw);
                }
                Err(Box::new(crate::transport::call_result(&raw)))
            }
            RawReply::Other(reply) => Err(reply),
        });
        let waited = match waited {
            Waited::Reply(Ok(json)) => return Ok(RelayReply::Raw(json)),
            Waited::Reply(Err(reply)) => Waited::Reply(*reply),
            Waited::Cancelled => Waited::Cancelled,
            Waited::TimedOut(after, idle) => Waited::TimedOut(after, idle),
            Waited::ShutDown => Waited::ShutDown,
        };
        if let Some(refused) = self.refusal(name, &waited) {
            return Ok(RelayReply::Reply(Box::new(refused)));
        }
        self.reply(connection, name, waited)
            .await
            .map(|result| RelayReply::Reply(Box::new(Reply::Answer(result))))
    }

    /// Follows a lane request of a call until the returned guard drops: the call is in
    /// flight (a server's questions find it) and the request's progress, by `token`,
    /// reaches it and holds off its idle timeout.
    fn follow(&self, ctx: &CallContext, token: ProgressToken) -> Followed<'_> {
        let activity = Arc::new(Notify::new());
        let flight = self.events.flights.begin_linked(ctx, token.clone(), activity.clone());
        self.events.route(
            token.clone(),
            ProgressRoute { sink: ctx.progress_sink().cloned(), activity: activity.clone() },
        );
        Followed { _unroute: Unroute { events: &self.events, token }, _flight: flight, activity }
    }

    /// A `tools/call` refused in a way the call may get past: for want of a task, or
    /// until the user opened URLs. (Not async: a call's future holds the caller's.)
    fn refusal(&self, name: &str, waited: &Waited) -> Option<Reply> {
        if let Some(flavor) = tasks::refused_for_task(waited) {
            self.learn_requires_task(name, flavor);
            return Some(Reply::NeedsTask(flavor));
        }
        urls::required(waited).map(Reply::OpenUrls)
    }

    /// Waits for a request's reply, its idle timeout reset by its progress and by the
    /// server's questions waiting for the caller.
    async fn wait<R>(
        &self,
        response: impl Future<Output = R>,
        activity: &Notify,
        ctx: &CallContext,
    ) -> Waited<R> {
        // The tool's own wait when its settings give one (`tools.NAME.timeout`).
        let timeout = ctx.wait().unwrap_or_else(|| self.config.request_timeout());
        let mut idle = std::pin::pin!(tokio::time::sleep(timeout));
        let mut response = std::pin::pin!(response);
        let started = Instant::now();
        let mut restarted = false;
        loop {
            // In this order: the response's first poll writes the request, before the waits
            // below register themselves; a response that is there wins over the rest.
            tokio::select! {
                biased;
                reply = &mut response => return Waited::Reply(reply),
                () = ctx.cancel_token().cancelled() => return Waited::Cancelled,
                () = self.shutdown.cancelled() => return Waited::ShutDown,
                () = activity.notified() => {
                    restarted = true;
                    idle.as_mut().reset(Instant::now() + timeout);
                }
                () = &mut idle => {
                    return match restarted {
                        true => Waited::TimedOut(started.elapsed(), Some(timeout)),
                        false => Waited::TimedOut(timeout, None),
                    };
                }
            }
        }
    }

    /// What a request that ended gave the call.
    async fn reply(
        &self,
        connection: &Connection,
        name: &str,
        waited: Waited,
    ) -> Result<ServerResult, ToolError> {
        let tool_error = |e: McpError| e.into_tool_error(Some(name));
        match &waited {
            // A request whose POST failed got no answer: three in a row (a server that
            // fails every POST) give the connection up, as three timeouts do.
            Waited::Reply(Err(ServiceError::McpError(e)))
                if crate::transport::is_undelivered(e) =>
            {
                connection.timed_out();
            }
            Waited::Reply(Ok(_) | Err(ServiceError::McpError(_))) => connection.answered(),
            Waited::TimedOut(..) => connection.timed_out(),
            Waited::Reply(Err(_)) | Waited::Cancelled | Waited::ShutDown => {}
        }
        match waited {
            Waited::Reply(Ok(result)) => Ok(result),
            Waited::Reply(Err(e)) => {
                // A request the server's forgetting the session left unanswered: the
                // connection goes on with its new session.
                let lost =
                    matches!(e, ServiceError::TransportClosed | ServiceError::TransportSend(_))
                        && !connection::is_unanswered_across_renewal(&e);
                let error = self.service_error(connection, "tools/call", e);
                if lost {
                    self.connection_lost().await;
                } else {
                    self.succeeded();
                }
                Err(tool_error(error))
            }
            Waited::Cancelled => Err(ToolError::Cancelled { tool: name.to_owned() }),
            Waited::TimedOut(after, idle) => {
                Err(ToolError::Timeout { tool: name.to_owned(), after, idle })
            }
            Waited::ShutDown => Err(tool_error(McpError::ShutDown { server: self.name.clone() })),
        }
    }
}

/// How long telling a server through rmcp's session that a call was abandoned may take
/// (over HTTP a notification is a request of its own); the caller is not held longer.
const CANCEL_SEND_GRACE: Duration = Duration::from_secs(1);

/// A request sent through rmcp's session and not answered yet. Dropped while it still
/// holds the request (whoever awaited the call dropped it without cancelling it), it tells
/// the server, from a task of its own since a drop cannot wait, as the lane's `Waiting`
/// does for direct calls.
struct Pending(Option<RequestHandle<RoleClient>>);

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(handle) = self.0.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let reason = Some("the caller stopped waiting".to_owned());
            let _ = tokio::time::timeout(CANCEL_SEND_GRACE, handle.cancel(reason)).await;
        });
    }
}

/// What a `tools/call` round trip gave the call.
#[expect(
    clippy::large_enum_variant,
    reason = "lives on the stack for one call, as `Waited` does; boxing would allocate on every call"
)]
enum Reply {
    /// The server's answer.
    Answer(ServerResult),
    /// The server's `-32042`: the user must open these URLs before the call can run.
    OpenUrls(Vec<UrlElicitationRequest>),
    /// The server refused the call (so it did not run): the tool runs only as a task.
    NeedsTask(tasks::Flavor),
}

/// What the first request of a relayed call got.
enum RelayReply {
    /// A plain text result, as the server wrote it.
    Raw(Box<str>),
    /// Anything else, for the rest of the call to handle (boxed: rare on this path).
    Reply(Box<Reply>),
}

/// How waiting for a request's reply ended (large for a parsed reply: it lives on the
/// stack for one call, and boxing would allocate on every call).
enum Waited<R = Result<ServerResult, ServiceError>> {
    Reply(R),
    Cancelled,
    /// How long it waited, and the idle limit when progress had restarted it.
    TimedOut(Duration, Option<Duration>),
    ShutDown,
}

impl<R> Waited<R> {
    /// The reply made into another.
    fn map<S>(self, f: impl FnOnce(R) -> S) -> Waited<S> {
        match self {
            Waited::Reply(reply) => Waited::Reply(f(reply)),
            Waited::Cancelled => Waited::Cancelled,
            Waited::TimedOut(after, idle) => Waited::TimedOut(after, idle),
            Waited::ShutDown => Waited::ShutDown,
        }
    }

    /// The reason to tell the server when the call stops waiting for its request.
    fn abandons(&self) -> Option<&'static str> {
        match self {
            Waited::Cancelled => Some("cancelled by the caller"),
            Waited::TimedOut(..) => Some("request timeout"),
            // Told before the connection closes, so the server stops the work at once
            // and knows why (it heard nothing, or a timeout from elsewhere).
            Waited::ShutDown => Some("the client is shutting down"),
            Waited::Reply(_) => None,
        }
    }
}

fn variant_name(result: &ServerResult) -> String {
    serde_json::to_value(result)
        .ok()
        .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>().join(",")))
        .map(|keys| format!("a result with fields {keys}"))
        .unwrap_or_else(|| "an unknown result".into())
}

/// Two names are similar when one contains the other or they share their first 4
/// characters.
fn similar(a: &str, b: &str) -> bool {
    let (a, b) = (a.to_lowercase(), b.to_lowercase());
    let start = |s: &str| s.chars().take(4).collect::<Vec<_>>();
    a.contains(&b) || b.contains(&a) || (start(&a).len() == 4 && start(&a) == start(&b))
}

/// A lane request followed ([`Inner::follow`]); its route goes before its flight record.
struct Followed<'a> {
    _unroute: Unroute<'a>,
    _flight: super::interaction::InFlight<'a>,
    /// Woken by the request's progress and by the server's questions waiting.
    activity: Arc<Notify>,
}

/// Stops routing a call's progress when the call ends, however it ends.
struct Unroute<'a> {
    events: &'a Events,
    token: ProgressToken,
}

impl Drop for Unroute<'_> {
    fn drop(&mut self) {
        self.events.unroute(&self.token);
    }
}

/// While `connection` lives, turns list-changed signals into a refreshed list and a
/// notification to the orchestrator.
fn spawn_refresher(inner: Weak<Inner>, connection: Arc<Connection>) {
    let Some(strong) = inner.upgrade() else { return };
    let events = strong.events.clone();
    let shutdown = strong.shutdown.clone();
    drop(strong);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = events.tools_changed.notified() => {}
                () = shutdown.cancelled() => return,
                () = closed(&connection) => return,
            }
            // Wait for the burst to end, so that one fetch answers it.
            let latest = Instant::now() + REFRESH_MAX_DELAY;
            loop {
                let now = Instant::now();
                if now >= latest {
                    break;
                }
                let quiet = (now + REFRESH_QUIET).min(latest);
                tokio::select! {
                    () = events.tools_changed.notified() => {}
                    () = tokio::time::sleep_until(quiet) => break,
                    () = shutdown.cancelled() => return,
                }
            }
            let Some(inner) = inner.upgrade() else { return };
            if let Err(e) = inner.fetch_tools(&connection).await {
                tracing::warn!(server = %inner.name, error = %e, "cannot refresh the tool list");
                *inner.tools.write().unwrap_or_else(|e| e.into_inner()) = None;
            }
            inner.notifier.notify();
        }
    });
}

/// Resolves when the connection's transport is gone.
async fn closed(connection: &Connection) {
    // rmcp offers no close signal on a peer; poll its cheap closed flag.
    while connection.is_alive() {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[async_trait]
impl ToolProvider for McpProvider {
    fn kind(&self) -> ToolKind {
        ToolKind::Mcp
    }

    /// The server gets some of the caller's headers, so its answers may differ by them.
    fn cache_partition(&self, _tool: &str, ctx: &CallContext) -> Option<String> {
        let names = &self.inner.config.passthrough_headers;
        (!names.is_empty()).then(|| ctx.caller_header_values(names.iter().map(String::as_str)))
    }

    fn namespace(&self) -> &str {
        &self.inner.name
    }

    fn declared_tools(&self) -> Vec<ToolSpec> {
        if self.inner.config.is_enabled() { self.inner.declared() } else { Vec::new() }
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        let inner = &self.inner;
        if !inner.config.is_enabled() {
            return Ok(Vec::new());
        }
        if let Some(tools) = inner.cached_tools() {
            return Ok(tools.as_ref().clone());
        }
        let not_started = inner.live().is_none();
        if not_started && inner.config.lazy && !inner.config.tools.is_empty() {
            return Ok(inner.declared());
        }
        let connection = match inner.connection().await {
            Ok(connection) => connection,
            // A server that cannot start now still has the tools it declares: the model
            // is told of them, and each call tries to start it (and says why it cannot).
            Err(error) if !inner.config.tools.is_empty() => {
                tracing::warn!(
                    server = %inner.name,
                    "cannot list the tools of `{}` ({}); its declared tools are listed instead",
                    inner.name,
                    error
                );
                return Ok(inner.declared());
            }
            Err(error) => return Err(error.into()),
        };
        let tools = inner.fetch_tools(&connection).await?;
        inner.succeeded();
        Ok(tools.as_ref().clone())
    }

    async fn has_tool(&self, name: &str) -> bool {
        if !self.inner.filter.allows(name) {
            return false;
        }
        match self.inner.cached_tools() {
            Some(tools) => tools.iter().any(|t| t.name == name),
            None => self.list_tools().await.is_ok_and(|tools| tools.iter().any(|t| t.name == name)),
        }
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let _busy = self.inner.idle.as_ref().map(idle::Idle::enter);
        self.inner.call(name, arguments, ctx).await
    }

    fn relays(&self, name: &str) -> bool {
        self.inner.relays(name)
    }

    async fn relay(
        &self,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<Relayed, ToolError> {
        let _busy = self.inner.idle.as_ref().map(idle::Idle::enter);
        self.inner.relay(name, arguments, ctx, raw_max).await
    }

    async fn warmup(&self) -> Result<(), ToolError> {
        let inner = &self.inner;
        if !inner.config.is_enabled() || inner.config.lazy {
            return Ok(());
        }
        // Under way, as a call is: the idle stop does not close the connection it makes
        // while it lists the tools.
        let _busy = inner.idle.as_ref().map(idle::Idle::enter);
        // An explicit warmup retries a server that was given up on.
        {
            let mut restarts = inner.restarts.lock().await;
            if restarts.failures > inner.max_restarts() {
                *restarts = Restarts::default();
            }
        }
        let connection = inner.connection().await?;
        if inner.cached_tools().is_none() {
            inner.fetch_tools(&connection).await?;
        }
        Ok(())
    }

    fn instructions(&self) -> Option<String> {
        self.inner.instructions.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn shutdown(&self) -> Result<(), ToolError> {
        let inner = &self.inner;
        inner.shutdown.cancel();
        let current = inner.current.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(connection) = current {
            connection.close().await;
        }
        // A start under way holds the connect lock until it has stored its connection
        // (closed just above, which also ends the requests it makes after storing) or,
        // seeing the shutdown, stopped and reaped what it started: waiting for it here
        // means that nothing of the server runs once the shutdown returns.
        if tokio::time::timeout(SHUTDOWN_CONNECT_WAIT, inner.restarts.lock()).await.is_err() {
            tracing::warn!(
                server = %inner.name,
                "a start under way did not stop within {} s of the shutdown",
                SHUTDOWN_CONNECT_WAIT.as_secs()
            );
        }
        // Nor anything of a start that failed: its server is killed and reaped in the
        // background, its error returned at once.
        if !inner.stopping.wait(SHUTDOWN_CONNECT_WAIT).await {
            tracing::warn!(
                server = %inner.name,
                "a server of a failed start was not reaped within {} s of the shutdown",
                SHUTDOWN_CONNECT_WAIT.as_secs()
            );
        }
        Ok(())
    }

    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        Some(self.inner.notifier.subscribe())
    }

    fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        Some(self.inner.events.prompts_changed.subscribe())
    }

    fn resource_list_changes(&self) -> Option<ToolListChanges> {
        Some(self.inner.events.resources_changed.subscribe())
    }

    async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        self.inner.list_prompts().await
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        // Under way, as a call is: the idle stop waits for it.
        let _busy = self.inner.idle.as_ref().map(idle::Idle::enter);
        self.inner.get_prompt(name, arguments, ctx).await
    }

    async fn complete(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        // Under way, as a call is: the idle stop waits for it.
        let _busy = self.inner.idle.as_ref().map(idle::Idle::enter);
        self.inner.complete(request, ctx).await
    }

    async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        self.inner.list_resources().await
    }

    async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        self.inner.list_resource_templates().await
    }

    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        // Under way, as a call is: the idle stop waits for it.
        let _busy = self.inner.idle.as_ref().map(idle::Idle::enter);
        self.inner.read_resource(uri, ctx).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.inner.subscribe_resource(uri).await
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.inner.unsubscribe_resource(uri).await
    }

    fn resource_updates(&self) -> Option<ResourceUpdates> {
        self.inner.resource_updates()
    }

    fn health(&self) -> toolmux_core::Health {
        self.inner.health()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolmux_core::ProgressSink;

    /// Names beyond ASCII are compared by characters, where cutting at byte 4 panicked
    /// inside a character (`日本語…`, three bytes each).
    #[test]
    fn similar_names_are_compared_by_characters() {
        assert!(similar("日本語検索", "日本語検索ツール"));
        assert!(similar("日本語検索", "日本語検証"));
        assert!(!similar("日本語検索", "日本人"));
        assert!(similar("read_file", "READ_dir"));
        assert!(!similar("abc", "abd"));
    }

    /// `maxRestarts` as large as it goes keeps restarting after the usual backoff, where
    /// counting one past it overflowed (a panic in a debug build, the give-up pause at the
    /// first failure in a release one).
    #[test]
    fn the_largest_max_restarts_backs_off_as_usual() {
        let mut restarts = Restarts::default();
        Inner::count_failure(&mut restarts, u32::MAX);
        let wait = restarts.not_before.expect("a wait") - Instant::now();
        assert!(wait <= BACKOFF_BASE, "{wait:?}");
    }

    /// `f`, given 30 s.
    async fn within<F: Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(30), f).await.expect("done within 30 s")
    }

    /// A bad `url` fails when the configuration loads (so `config check` reports it), and
    /// the message does not repeat the URL, which may carry a secret.
    #[test]
    fn a_remote_url_is_checked_when_the_provider_is_made() {
        let error =
            |config: McpServerConfig| McpProvider::new("r", config).unwrap_err().to_string();
        let url_only = |url: &str| McpServerConfig { url: Some(url.into()), ..Default::default() };
        expect_test::expect![
            "mcp server `r`: invalid configuration: `url` must start with http:// or https://"
        ]
        .assert_eq(&error(url_only("localhost:8080/mcp?key=sekrit")));
        expect_test::expect!["mcp server `r`: invalid configuration: `url` is not a valid URL (invalid IPv6 address); give an absolute URL such as http://127.0.0.1:8080/mcp"]
            .assert_eq(&error(url_only("http://[::1/mcp?key=sekrit")));
        expect_test::expect!["mcp server `r`: invalid configuration: `url` has the scheme `ftp`; the http transport takes http:// or https://"]
            .assert_eq(&error(url_only("ftp://127.0.0.1/mcp")));
        expect_test::expect!["mcp server `r`: invalid configuration: `url` has the scheme `http`; the websocket transport takes ws:// or wss://"]
            .assert_eq(&error(McpServerConfig::remote(TransportKind::Websocket, "http://127.0.0.1/")));
        assert!(!error(url_only("nope?key=sekrit")).contains("sekrit"), "the URL is not repeated");
        for (kind, url) in [
            (TransportKind::Http, "https://127.0.0.1:8080/mcp"),
            (TransportKind::Sse, "http://[::1]:8080/sse"),
            (TransportKind::Websocket, "wss://127.0.0.1/ws"),
        ] {
            McpProvider::new("r", McpServerConfig::remote(kind, url)).expect("a valid URL");
        }
    }

    /// However a call through rmcp's session ends (an error answer, cancelled, its caller
    /// gone), its progress route goes with it and no report is left waiting for one. The
    /// Python SDK server floods reports over a 2026-07-28 connection, which has no lane.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_on_the_session_leaves_no_progress_route_however_it_ends() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = root.join("../../.peers/python/venv/bin/python");
        assert!(python.exists(), "missing test peer mcp (PyPI): run .ci/install-peers");
        let script = root.join("tests/fixtures/progress_flood_server.py");
        let config =
            McpServerConfig::stdio(python.display().to_string(), [script.display().to_string()])
                .with_base_dir(std::env::temp_dir());
        let provider = McpProvider::new("py", config).expect("a valid configuration");
        let tools = within(provider.list_tools()).await.expect("tools");
        let name = tools.iter().find(|t| t.name.ends_with("flood")).expect("flood").name.clone();
        assert!(provider.inner.live().is_some_and(|c| c.lane.is_none()), "a session call");
        let events = provider.inner.events.clone();
        // Reports start flowing, then the call is cancelled (its sink cancels it).
        let cancel = CancellationToken::new();
        let sink = {
            let cancel = cancel.clone();
            ProgressSink::new(move |_| cancel.cancel())
        };
        let ctx = CallContext::new().with_cancel(cancel).with_progress(sink);
        let flood = json!({"count": 1_000_000});
        let err = within(provider.call(&name, flood.clone(), &ctx)).await;
        assert!(matches!(err, Err(ToolError::Cancelled { .. })), "{err:?}");
        assert_eq!(events.routed(), (0, 0, 0), "after a cancelled call");
        // The caller stops waiting in the midst of the flood.
        let reported = Arc::new(Notify::new());
        let sink = {
            let reported = reported.clone();
            ProgressSink::new(move |_| reported.notify_one())
        };
        let ctx = CallContext::new().with_progress(sink);
        let call = provider.call(&name, flood, &ctx);
        tokio::select! {
            ended = call => panic!("the flood ended first: {ended:?}"),
            () = reported.notified() => {}
        }
        assert_eq!(events.routed(), (0, 0, 0), "after a dropped call");
        // An error answer (the count is no integer).
        let ctx = CallContext::new().with_progress(ProgressSink::new(|_| {}));
        let out = within(provider.call(&name, json!({"count": "many"}), &ctx)).await;
        assert!(out.is_ok_and(|out| out.is_error), "an error answer");
        assert_eq!(events.routed(), (0, 0, 0), "after an error answer");
        within(provider.shutdown()).await.expect("shut down");
    }

    /// Every call builds its future on the stack and moves it into a box. The paths a call
    /// rarely takes (connecting, rmcp's session, answering a server's questions) are boxed
    /// on their own so that it stays small: with the connect path inline it was 14 KB, and
    /// copying it was 28% of the gateway's instructions per call.
    #[test]
    fn a_call_future_stays_small() {
        let provider = McpProvider::new("x", McpServerConfig::stdio("true", ["a"]))
            .expect("a valid configuration");
        let ctx = CallContext::new();
        let future = provider.inner.call("echo", Value::Null, &ctx);
        let size = size_of_val(&future);
        assert!(size <= 3 * 1024, "a call's future is {size} bytes; box what a call rarely runs");
    }
}
