//! One live connection to a server: the transport started, the handshake done, and what
//! is needed to close it and explain why it broke.

use rmcp::model::{ProtocolVersion, ServerNotification, ServerPeerInfo, SubscriptionFilter};
use rmcp::service::{ClientInitializeError, RunningService, ServiceError};
use rmcp::transport::common::client_side_sse::SseRetryPolicy;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{DynamicTransportError, IntoTransport, StreamableHttpClientTransport};
use rmcp::{ClientLifecycleMode, ClientServiceExt, Peer, RoleClient};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::config::{McpServerConfig, ProtocolMode, TransportKind};
use super::failure::{self, Reach};
use super::handler::{Events, Handler};
use super::oauth::{OAuth, OAuthHttp};
use super::passthrough::Passthrough;
use crate::McpError;
use crate::transport::lane::Lane;
use crate::transport::stdio::{ChildGroup, StdioCommand};
use crate::transport::{Fault, FaultKind, sse, stdio, websocket};

/// The HTTP client of a remote server, and its OAuth state when it may ask for OAuth.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    pub(crate) client: reqwest::Client,
    pub(crate) oauth: Option<Arc<OAuth>>,
}

/// How long a graceful close may take before the connection is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests in a row that a remote server leaves unanswered until their timeout before its
/// connection is given up: the next call connects afresh. A server that restarted or lost
/// the session may keep the connection open and never answer on it.
pub(crate) const TIMEOUTS_TO_RECONNECT: u32 = 3;

/// How long rmcp waits, when the server forgot the session, for the requests in flight on
/// it before it starts a new one (and again for the new handshake). A request still
/// unanswered then fails as sent with its outcome unknown; meanwhile new requests wait,
/// so this is short beside the request timeout.
pub(crate) const SESSION_RECOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `error` is that of a request sent on a session the server forgot, and left
/// unanswered for [`SESSION_RECOVERY_TIMEOUT`] after: the server may have run it, and the
/// connection goes on with a new session.
pub(crate) fn is_unanswered_across_renewal(error: &ServiceError) -> bool {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let ServiceError::TransportSend(error) = error else { return false };
    matches!(
        error.error.downcast_ref::<StreamableHttpError<reqwest::Error>>(),
        Some(StreamableHttpError::SessionRecoveryTimeout)
    )
}

/// A connected, initialized server.
#[derive(Debug)]
pub(crate) struct Connection {
    server: String,
    pub(crate) peer: Peer<RoleClient>,
    service: Mutex<Option<RunningService<RoleClient, Handler>>>,
    process: Mutex<Option<ChildGroup>>,
    fault: Fault,
    pub(crate) info: Option<Arc<ServerPeerInfo>>,
    /// The direct lane for calls, on stdio connections of the handshake revisions
    /// (2026-07-28 requests carry per-request `_meta` that rmcp adds).
    pub(crate) lane: Option<Arc<Lane>>,
    /// A stdio server's pipes, whatever its revision: closed when they broke, or when the
    /// server stopped reading (see `Lane::stalled`).
    pipes: Option<Arc<Lane>>,
    /// Over HTTP, SSE or a WebSocket (not a process of ours).
    remote: bool,
    /// Given up on though its transport is still open: a request could not be sent to the
    /// remote server, or it left [`TIMEOUTS_TO_RECONNECT`] requests in a row unanswered.
    /// rmcp's HTTP transport stays open whatever its requests meet, so without this a
    /// server that restarted or went away was never connected to again.
    retired: AtomicBool,
    /// Requests in a row that timed out on a remote connection.
    timeouts: AtomicU32,
    /// The remote server's `url`, for errors (shown without its query).
    url: Option<String>,
}

impl Connection {
    /// Whether the connection still works.
    pub(crate) fn is_alive(&self) -> bool {
        !self.retired.load(Ordering::Relaxed)
            && !self.peer.is_transport_closed()
            && self.pipes.as_ref().is_none_or(|pipes| pipes.is_open())
    }

    /// Gives up on a remote connection whose request could not be sent (the server is
    /// unreachable, refused the session, answered an HTTP error): the next call connects
    /// afresh. A stdio connection ends with its process, which says more.
    pub(crate) fn retire_remote(&self) {
        if self.remote && !self.retired.swap(true, Ordering::Relaxed) {
            tracing::debug!(server = %self.server, "a request could not be sent; reconnecting on the next call");
        }
    }

    /// Notes a request of a remote connection that timed out; after
    /// [`TIMEOUTS_TO_RECONNECT`] in a row, the connection is given up.
    pub(crate) fn timed_out(&self) {
        if !self.remote {
            return;
        }
        let timeouts = self.timeouts.fetch_add(1, Ordering::Relaxed) + 1;
        if timeouts >= TIMEOUTS_TO_RECONNECT && !self.retired.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                server = %self.server,
                "{timeouts} requests in a row got no answer; reconnecting on the next call"
            );
        }
    }

    /// Notes a request answered (with a result or an error).
    pub(crate) fn answered(&self) {
        if self.remote {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// Whether the server speaks the stateless 2026-07-28 revision.
    pub(crate) fn is_modern(&self) -> bool {
        self.info.as_ref().is_some_and(|i| i.protocol_version >= ProtocolVersion::V_2026_07_28)
    }

    /// The process id of a stdio server.
    pub(crate) fn pid(&self) -> Option<i32> {
        self.process.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(ChildGroup::pid)
    }

    /// The error for a call that lost this connection: what the pumps saw, or plain closed.
    pub(crate) fn lost(&self) -> McpError {
        match self.fault.get() {
            Some(FaultKind::Protocol(message)) => {
                McpError::Protocol { server: self.server.clone(), message }
            }
            Some(FaultKind::Closed(detail)) => {
                McpError::Closed { server: self.server.clone(), detail: Some(detail) }
            }
            Some(FaultKind::Auth(message)) => {
                McpError::Auth { server: self.server.clone(), message }
            }
            None => McpError::Closed { server: self.server.clone(), detail: None },
        }
    }

    /// The error for a request of `method` the transport could not send or whose answer
    /// it could not read, and a remote connection given up (see
    /// [`Connection::retire_remote`]): what the pumps saw, else what the streamable HTTP
    /// transport met, said as [`failure::describe`] says it: refused (the server
    /// unreachable, an HTTP error status), an answer that is none, or an answer lost after
    /// sending (the server may have run the request).
    pub(crate) fn unsent(&self, method: &'static str, error: &DynamicTransportError) -> McpError {
        self.retire_remote();
        if self.fault.get().is_some() {
            return self.lost();
        }
        let server = self.server.clone();
        let url = self.url.as_deref().map_or_else(|| "the server".to_owned(), failure::shown_url);
        let Some(failure) = failure::describe(&*error.error, &url) else {
            return McpError::Closed { server, detail: None };
        };
        let message = failure.message;
        match failure.reach {
            Reach::Refused => McpError::Undelivered { server, method, message },
            Reach::Unreadable => {
                McpError::Protocol { server, message: format!("{method}: {message}") }
            }
            Reach::Lost => McpError::OutcomeUnknown { server, method, message },
        }
    }

    /// Closes the session, then kills and reaps the server's process group.
    pub(crate) async fn close(&self) {
        let service = self.service.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut service) = service {
            let _ = service.close_with_timeout(CLOSE_TIMEOUT).await;
        }
        let process = self.process.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut process) = process {
            process.shutdown().await;
        }
    }
}

/// Server processes being stopped after a failed start: the start's error is returned as
/// soon as it is known, and the close of its session and the kill, reap and sweep of what
/// it started go on here, where the provider's shutdown waits for them.
///
/// Dropped without that wait (a provider dropped without `shutdown`), it leaves no
/// process behind, so it has no `Drop` of its own: its tasks go on, detached, while the
/// runtime runs; a task that has not run yet holds its [`ChildGroup`], whose drop (when
/// the runtime ends and drops the task) sends the group SIGKILL at once, and one that ran
/// sent it already. Only the reap and the sweep of what left the group are then not
/// awaited, as for any connection dropped with the runtime; the reaper's own drop kills
/// the child, and the watchman (`toolmux_core::group_guard`) the group should toolmux die.
#[derive(Debug, Default)]
pub(crate) struct Stopping(Mutex<Vec<tokio::task::JoinHandle<()>>>);

impl Stopping {
    /// Kills `process`'s group and reaps it in a task of its own.
    fn stop(&self, mut process: ChildGroup) {
        self.keep(tokio::spawn(async move { process.kill_now().await }));
    }

    /// Closes `service` (within [`CLOSE_TIMEOUT`]), then kills and reaps `process`'s group,
    /// in a task of its own.
    fn close(&self, mut service: RunningService<RoleClient, Handler>, process: Option<ChildGroup>) {
        self.keep(tokio::spawn(async move {
            let _ = service.close_with_timeout(CLOSE_TIMEOUT).await;
            if let Some(mut process) = process {
                process.kill_now().await;
            }
        }));
    }

    fn keep(&self, task: tokio::task::JoinHandle<()>) {
        let mut tasks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// Waits up to `within` for every process being stopped to be reaped; false if one
    /// was not.
    pub(crate) async fn wait(&self, within: Duration) -> bool {
        let tasks = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        let all = async {
            for task in tasks {
                let _ = task.await;
            }
        };
        tokio::time::timeout(within, all).await.is_ok()
    }
}

/// How long the second handshake of `protocol: auto` waits for the first process to be
/// reaped before it starts its own: SIGKILL makes it quick unless the process is stuck in
/// the kernel, whose reap is then left to [`Stopping`].
const RETRY_REAP_WAIT: Duration = Duration::from_secs(2);

/// How much sooner than the startup timeout a server that wrote lines that are not
/// messages is given up on, at most (see [`connect`]).
const NOISE_MARGIN: Duration = Duration::from_millis(100);

/// Checks the package (see [`screen`]), starts the transport and runs the handshake, all
/// within the startup timeout.
pub(crate) async fn connect(
    server: &str,
    config: &McpServerConfig,
    kind: TransportKind,
    http: Option<&Http>,
    events: &Arc<Events>,
    shutdown: &CancellationToken,
    stopping: &Stopping,
) -> Result<Connection, McpError> {
    let shut_down = || McpError::ShutDown { server: server.to_owned() };
    let began = tokio::time::Instant::now();
    // A person approving in a browser has the authorization timeout on top.
    let startup = config.startup_timeout()
        + http.and_then(|h| h.oauth.as_ref()).map_or(Duration::ZERO, |o| o.approval_time());
    // The malware check is part of the start: the startup timeout counts from before it,
    // so that a slow OSV (up to its own timeout) does not stretch the configured budget.
    let deadline = began + startup;
    if kind == TransportKind::Stdio && config.malware_check != Some(false) {
        tokio::select! {
            screened = tokio::time::timeout_at(deadline, screen(server, config)) => match screened {
                Ok(screened) => screened?,
                Err(_) => return Err(McpError::Connect {
                    server: server.to_owned(),
                    transport: kind.as_str(),
                    source: format!(
                        "the package's malware check (OSV) took the whole startup timeout of \
                         {}ms; raise `startupTimeoutMs`, or set `malwareCheck: false` to start \
                         it unchecked",
                        startup.as_millis()
                    )
                    .into(),
                }),
            },
            () = shutdown.cancelled() => return Err(shut_down()),
        }
    }
    let mut fault = Fault::default();
    // Streamable HTTP is tried first, then legacy SSE, as MCP's backwards compatibility
    // asks of clients (and VS Code does for `type: http`): many servers in the Claude,
    // Cursor and VS Code files people import still speak only SSE.
    let http_first = kind == TransportKind::Http;
    let sse_fault = Fault::default();
    let mut over_sse = false;
    // The second handshake of `protocol: auto` has a record of its own: the first
    // process's end, toolmux's own kill, would be told as the reason the second failed.
    let retry_fault = Fault::default();
    let mut retried = false;
    let mut process = None;
    let mode = config.protocol.unwrap_or_default();
    let attempt = async {
        let first = start(server, config, kind, http, events, &fault, &mut process, mode).await;
        let result = match first {
            // A server that answers `server/discover` with something that is neither a
            // discovery result nor an error (some answer every unknown method with `{}`)
            // gets the handshake it understands, on a fresh connection.
            Err(McpError::Handshake { .. }) if mode == ProtocolMode::Auto => {
                tracing::debug!(server, "server/discover failed; retrying with initialize");
                // The first process is killed and reaped before the second starts: a
                // server holding a lock, a pidfile or a fixed port while it runs could not
                // start again while the first still did. Left in `process` while it is
                // reaped, it is stopped with the rest should the startup timeout end the
                // wait; one not reaped in time is left to `stopping`, and the retry goes on.
                if let Some(old) = process.as_mut() {
                    let _ = tokio::time::timeout(RETRY_REAP_WAIT, old.kill_now()).await;
                }
                if let Some(old) = process.take()
                    && !old.is_reaped()
                {
                    stopping.stop(old);
                }
                retried = true;
                start(
                    server,
                    config,
                    kind,
                    http,
                    events,
                    &retry_fault,
                    &mut process,
                    ProtocolMode::Legacy,
                )
                .await
            }
            other => other,
        };
        match result {
            Err(e) if http_first && not_streamable_http(&e) => {
                tracing::debug!(server, "streamable HTTP failed ({e}); trying legacy SSE");
                let sse = TransportKind::Sse;
                let legacy = ProtocolMode::Legacy;
                match start(server, config, sse, http, events, &sse_fault, &mut process, legacy)
                    .await
                {
                    Ok(service) => {
                        tracing::info!(
                            server,
                            "the server speaks legacy SSE, not streamable HTTP; `type: sse` \
                             connects without trying the other first"
                        );
                        over_sse = true;
                        Ok(service)
                    }
                    Err(sse_error) => {
                        tracing::debug!(server, "legacy SSE failed too: {sse_error}");
                        Err(e)
                    }
                }
            }
            other => other,
        }
    };
    // A server that wrote lines that are not messages is given up on a little before the
    // startup timeout, counted from before the malware check: a caller that waits the
    // same time for the whole start (the orchestrator's warmup, `defaults.startupTimeout`,
    // 30 s as the server's is by default) then hears what the server wrote, where its own
    // timeout won the race and said only that the server did not start.
    let noisy = async {
        let margin = (startup / 100).min(NOISE_MARGIN);
        tokio::time::sleep_until(deadline - margin).await;
        if fault.noise().is_none() {
            std::future::pending::<()>().await;
        }
    };
    let outcome = {
        let attempt = std::pin::pin!(attempt);
        tokio::select! {
            service = tokio::time::timeout_at(deadline, attempt) => Some(service.ok()),
            () = noisy => Some(None),
            () = shutdown.cancelled() => None,
        }
    };
    let Some(service) = outcome else {
        // A shutdown wins over a start under way: what it started is stopped and reaped
        // before the caller hears of it, and the shutdown waits for the caller, so that
        // nothing of the server runs once it returns (dropped here, the server was only
        // signalled, and reaped some time later).
        if let Some(mut process) = process {
            process.kill_now().await;
        }
        return Err(shut_down());
    };
    if over_sse {
        fault = sse_fault;
    } else if retried {
        fault = retry_fault;
    }
    let service = match service {
        Some(Ok(service)) => service,
        // The error is known: the caller hears it now, while what was started is killed
        // and reaped in the background (up to 5 s, and the sweep), which ate the margin
        // the early give-up above leaves the caller. Its message is made: the server's
        // exit and stderr, when they explain it, were read before the handshake failed.
        Some(Err(e)) => {
            if let Some(process) = process {
                stopping.stop(process);
            }
            return Err(e);
        }
        None => {
            if let Some(process) = process {
                stopping.stop(process);
            }
            if let Some(noise) = fault.noise() {
                return Err(McpError::Protocol {
                    server: server.to_owned(),
                    message: format!(
                        "no answer to the handshake within {}ms; the server wrote a line that is {noise}",
                        startup.as_millis()
                    ),
                });
            }
            return Err(McpError::StartupTimeout { server: server.to_owned(), after: startup });
        }
    };
    let info = service.peer_info();
    // MCP's version negotiation: a client that does not speak the version the server
    // answered with disconnects. The caller hears why now; the session is closed (a
    // server may take up to the close timeout to end it) and the process stopped in the
    // background, where the provider's shutdown waits for them.
    if let Some(chosen) = info.as_ref().map(|i| &i.protocol_version)
        && !ProtocolVersion::KNOWN_VERSIONS.contains(chosen)
    {
        let source = unknown_version(chosen).into();
        stopping.close(service, process);
        return Err(McpError::Handshake { server: server.to_owned(), source });
    }
    let lane = process.as_ref().map(ChildGroup::lane);
    if let Some(lane) = &lane {
        let events = events.clone();
        let name = server.to_owned();
        lane.set_tap(Box::new(move |notification| events.tap(&name, notification)));
    }
    let modern = info.as_ref().is_some_and(|i| i.protocol_version >= ProtocolVersion::V_2026_07_28);
    let connection = Connection {
        server: server.to_owned(),
        peer: service.peer().clone(),
        service: Mutex::new(Some(service)),
        process: Mutex::new(process),
        fault,
        info,
        pipes: lane.clone(),
        lane: lane.filter(|_| !modern),
        remote: kind != TransportKind::Stdio,
        retired: AtomicBool::new(false),
        timeouts: AtomicU32::new(0),
        url: config.url.clone().filter(|_| kind != TransportKind::Stdio),
    };
    if connection.is_modern() {
        listen_for_list_changes(server, &connection, events, config.request_timeout());
    }
    Ok(connection)
}

/// Whether `error`, from a first try at streamable HTTP, leaves legacy SSE worth a try: the
/// server refused or did not understand the POST. Not when it asked for credentials, the
/// configuration is wrong or the time is up.
fn not_streamable_http(error: &McpError) -> bool {
    matches!(
        error,
        McpError::Connect { .. }
            | McpError::Handshake { .. }
            | McpError::Closed { .. }
            | McpError::Protocol { .. }
            | McpError::Rpc { .. }
    )
}

/// Refuses to start a server whose package runner would fetch a package OSV lists as
/// malicious (see [`super::supply`]); starts it, with a warning, when OSV cannot say.
async fn screen(server: &str, config: &McpServerConfig) -> Result<(), McpError> {
    let Some(command) = config.command.as_deref() else { return Ok(()) };
    let Some(package) = super::supply::package_of(command, &config.args) else { return Ok(()) };
    let url = config.osv_url.as_deref().unwrap_or(super::supply::DEFAULT_OSV_URL);
    match super::supply::check(url, &package).await {
        Ok(verdict) if verdict.malicious.is_empty() => {
            tracing::debug!(server, %package, "OSV lists no malicious-package advisory");
            Ok(())
        }
        Ok(verdict) => Err(McpError::Malicious {
            server: server.to_owned(),
            package: package.to_string(),
            advisories: verdict.malicious,
        }),
        Err(why) => {
            tracing::warn!(
                server,
                %package,
                "cannot check the package against OSV ({why}); starting it unchecked"
            );
            Ok(())
        }
    }
}

#[allow(clippy::too_many_arguments)] // One private call site; a struct would only rename them.
async fn start(
    server: &str,
    config: &McpServerConfig,
    kind: TransportKind,
    http: Option<&Http>,
    events: &Arc<Events>,
    fault: &Fault,
    process: &mut Option<ChildGroup>,
    mode: ProtocolMode,
) -> Result<RunningService<RoleClient, Handler>, McpError> {
    let handler = Handler::new(server, events.clone(), config.accept_elicitation_defaults);
    let connect_error = |source: Box<dyn std::error::Error + Send + Sync>| McpError::Connect {
        server: server.to_owned(),
        transport: kind.as_str(),
        source,
    };
    let url = || {
        config.url.as_deref().ok_or_else(|| McpError::Config {
            server: server.to_owned(),
            message: format!("`url` is required for the {} transport", kind.as_str()),
        })
    };
    let client = || {
        http.map(|h| h.client.clone()).ok_or_else(|| McpError::Config {
            server: server.to_owned(),
            message: "no HTTP client".into(),
        })
    };
    match kind {
        TransportKind::Stdio => {
            let program = config.command.as_deref().ok_or_else(|| McpError::Config {
                server: server.to_owned(),
                message: "`command` is required for the stdio transport".into(),
            })?;
            let command = StdioCommand {
                server,
                program,
                args: &config.args,
                env: &config.env,
                inherit: config.env_inherit.unwrap_or_default(),
                passthrough: &config.env_passthrough,
                cwd: working_dir(server, config)?,
                write_timeout: config.request_timeout(),
            };
            let (transport, group) =
                stdio::spawn(&command, fault).map_err(|e| connect_error(Box::new(e)))?;
            *process = Some(group);
            let started = handshake(server, config.url.as_deref(), handler, transport, mode, fault);
            started.await.map_err(|e| match e {
                // It exited before it spoke: running it by hand shows all it says.
                McpError::Closed { server, detail } => {
                    McpError::Closed { server, detail: Some(exited_at_start(detail, &command)) }
                }
                other => other,
            })
        }
        TransportKind::Http => {
            let mut http_config = StreamableHttpClientTransportConfig::with_uri(url()?);
            http_config.retry_config = Arc::new(BoundedRetry);
            http_config.session_recovery_timeout = SESSION_RECOVERY_TIMEOUT;
            // The most one message may be, as over stdio, SSE and WebSocket (rmcp's own
            // limit is 16 MiB, under what a stdio server's result may be).
            http_config.max_sse_event_size = stdio::MESSAGE_MAX;
            // Every request goes through `Passthrough`, which sends the headers a call
            // carries to pass on (and nothing else changes for calls without), and has the
            // tools listed again when the server renews the session.
            let renewed = Arc::downgrade(events);
            match http.and_then(|h| h.oauth.clone()) {
                Some(oauth) => {
                    let client = OAuthHttp::new(client()?, oauth, fault.clone());
                    let client = Passthrough { client, renewed, server: server.into() };
                    let transport = StreamableHttpClientTransport::with_client(client, http_config);
                    handshake(server, config.url.as_deref(), handler, transport, mode, fault).await
                }
                None => {
                    let client = Passthrough { client: client()?, renewed, server: server.into() };
                    let transport = StreamableHttpClientTransport::with_client(client, http_config);
                    handshake(server, config.url.as_deref(), handler, transport, mode, fault).await
                }
            }
        }
        TransportKind::Sse => {
            let oauth = http.and_then(|h| h.oauth.clone());
            let timeout = config.request_timeout();
            let transport = sse::connect(server, client()?, url()?, oauth, timeout, fault)
                .await
                .map_err(|e| match fault.get() {
                    Some(FaultKind::Auth(message)) => {
                        McpError::Auth { server: server.to_owned(), message }
                    }
                    _ => connect_error(e),
                })?;
            handshake(server, config.url.as_deref(), handler, transport, mode, fault).await
        }
        TransportKind::Websocket => {
            let timeout = config.request_timeout();
            let transport = websocket::connect(server, url()?, &config.headers, timeout, fault)
                .await
                .map_err(connect_error)?;
            handshake(server, config.url.as_deref(), handler, transport, mode, fault).await
        }
    }
}

/// What is known of a stdio server that exited during the handshake (`detail`: its exit
/// status and the last lines of its stderr), and how to see the rest: its command line as
/// configured, quoted for a shell, and where to run it. The names of its `env` are given
/// and never their values, which are secrets.
fn exited_at_start(detail: Option<String>, command: &StdioCommand<'_>) -> String {
    let line = std::iter::once(command.program)
        .chain(command.args.iter().map(String::as_str))
        .map(shell_quoted)
        .collect::<Vec<_>>()
        .join(" ");
    let said = match detail {
        Some(detail) if detail.contains("its stderr ended") => detail,
        Some(detail) => format!("{detail}; it wrote nothing on stderr"),
        None => "it wrote nothing on stderr".to_owned(),
    };
    let env = match command.env.len() {
        0 => String::new(),
        _ => {
            let names = command.env.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
            format!(" (with its `env` set: {names})")
        }
    };
    format!("{said}; to see why, run `{line}` by hand in {}{env}", command.cwd.display())
}

/// `word` as a POSIX shell reads it back: bare when it holds only characters no shell
/// treats specially, else in single quotes.
fn shell_quoted(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// Reconnects a broken SSE stream once: a server that polls by closing streams is back at
/// once, and a dead one fails its calls after one retry interval (the server's `retry:`
/// hint when it sent one, rmcp's servers say 3 s) instead of rmcp's default of retrying
/// forever while the calls wait.
#[derive(Debug)]
struct BoundedRetry;

impl SseRetryPolicy for BoundedRetry {
    fn retry(&self, attempt: usize) -> Option<Duration> {
        (attempt == 0).then_some(Duration::from_millis(250))
    }
}

/// The working directory of a stdio server: `cwd` resolved against `baseDir`.
fn working_dir(server: &str, config: &McpServerConfig) -> Result<PathBuf, McpError> {
    match (&config.cwd, &config.base_dir) {
        (Some(cwd), _) if cwd.is_absolute() => Ok(cwd.clone()),
        (Some(cwd), Some(base)) => Ok(base.join(cwd)),
        (None, Some(base)) => Ok(base.clone()),
        (Some(_), None) | (None, None) => Err(McpError::Config {
            server: server.to_owned(),
            message: "a stdio server needs an absolute `cwd` or a `baseDir` to run in".into(),
        }),
    }
}

async fn handshake<T, E, A>(
    server: &str,
    url: Option<&str>,
    handler: Handler,
    transport: T,
    mode: ProtocolMode,
    fault: &Fault,
) -> Result<RunningService<RoleClient, Handler>, McpError>
where
    T: IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let lifecycle = match mode {
        ProtocolMode::Legacy => ClientLifecycleMode::Initialize,
        ProtocolMode::Modern => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
        ProtocolMode::Auto => ClientLifecycleMode::Auto {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
        },
    };
    let transport = crate::transport::Ordered::new(handler.tapped(transport.into_transport()));
    handler.serve_with_lifecycle(transport, lifecycle).await.map_err(|e| {
        // What the pumps saw (an exit status, garbage) explains more than rmcp's error.
        match fault.get() {
            Some(FaultKind::Protocol(message)) => {
                McpError::Protocol { server: server.to_owned(), message }
            }
            Some(FaultKind::Closed(detail)) => {
                McpError::Closed { server: server.to_owned(), detail: Some(detail) }
            }
            Some(FaultKind::Auth(message)) => McpError::Auth { server: server.to_owned(), message },
            None => handshake_error(server, url, e),
        }
    })
}

/// A failed handshake in words a person can act on. rmcp wraps a transport's failure in
/// its transport's type name (`Transport [toolmux_mcp::transport::Ordered<rmcp::...>]`),
/// and its HTTP client error keeps the cause (a refused connection, a certificate) out of
/// the chain; what is said here is the transport's own error, and for streamable HTTP what
/// [`failure::describe`] makes of it, naming `url` (shown). A server that cannot be reached
/// at all is a connect error, which is not retried with the other handshake.
/// Why a server that answered with protocol version `chosen` is refused.
fn unknown_version(chosen: &ProtocolVersion) -> String {
    let spoken: Vec<String> =
        ProtocolVersion::KNOWN_VERSIONS.iter().map(ToString::to_string).collect();
    format!(
        "the server answered with protocol version {}, which toolmux does not speak (it \
         speaks {}); MCP has a client disconnect then: update the server, or toolmux if the \
         version is newer",
        shown_field(chosen.as_str()),
        spoken.join(", ")
    )
}

/// What a server's answer to `initialize` lacks or has wrong, when it is no
/// `InitializeResult`: MCP requires `protocolVersion` (a string), `capabilities` and
/// `serverInfo` (objects).
fn malformed_initialize(answer: &serde_json::Value) -> String {
    let expected = [
        ("protocolVersion", "a string"),
        ("capabilities", "an object"),
        ("serverInfo", "an object"),
    ];
    let mut wrong = Vec::new();
    for (field, kind) in expected {
        let fits = match answer.get(field) {
            None | Some(serde_json::Value::Null) => {
                wrong.push(format!("has no `{field}`"));
                continue;
            }
            Some(serde_json::Value::String(_)) => kind == "a string",
            Some(serde_json::Value::Object(_)) => kind == "an object",
            Some(_) => false,
        };
        if !fits {
            wrong.push(format!("has a `{field}` that is not {kind}"));
        }
    }
    if wrong.is_empty() {
        // A field inside one of them is wrong; serde says which.
        return match serde_json::from_value::<rmcp::model::InitializeResult>(answer.clone()) {
            Err(e) => format!("the server's answer to initialize is malformed: {e}"),
            Ok(_) => "the server's answer to initialize was not taken for one".to_owned(),
        };
    }
    format!(
        "the server's answer to initialize {} (MCP requires protocolVersion, capabilities and \
         serverInfo); the server does not follow the protocol, so update or fix it",
        wrong.join(" and ")
    )
}

/// `text` cut to 40 characters and quoted, for a message.
fn shown_field(text: &str) -> String {
    format!("\"{}\"", &text[..text.floor_char_boundary(40)])
}

fn handshake_error(server: &str, url: Option<&str>, error: ClientInitializeError) -> McpError {
    // With `protocol: auto`, the answer to `initialize` says more than that of the
    // `server/discover` before it, which most servers do not know.
    let error = match error {
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => *fallback,
        other => other,
    };
    // The server answered, but not with an InitializeResult.
    if let ClientInitializeError::ExpectedInitResult(Some(answer)) = &error
        && let Ok(answer) = serde_json::to_value(answer)
    {
        return McpError::Handshake {
            server: server.to_owned(),
            source: malformed_initialize(&answer).into(),
        };
    }
    // The server refused the handshake with an error of its own.
    if let ClientInitializeError::JsonRpcError(data) = &error
        && !crate::transport::is_undelivered(data)
    {
        let message = &data.message[..data.message.floor_char_boundary(1_000)];
        let source = format!(
            "the server answered the handshake with an error (code {}): {message}",
            data.code.0
        );
        return McpError::Handshake { server: server.to_owned(), source: source.into() };
    }
    // A handshake request whose POST failed (legacy SSE): what happened to it, not rmcp's
    // dump of the error answer made for it.
    if let ClientInitializeError::JsonRpcError(data) = &error
        && crate::transport::is_undelivered(data)
    {
        let source = if crate::transport::is_outcome_unknown(data) {
            format!("the handshake request got no answer: {}", data.message)
        } else {
            format!("the handshake request was not delivered: {}", data.message)
        };
        return McpError::Handshake { server: server.to_owned(), source: source.into() };
    }
    let ClientInitializeError::TransportError { error: transport, .. } = &error else {
        return McpError::Handshake { server: server.to_owned(), source: Box::new(error) };
    };
    let inner = &*transport.error;
    let url = url.map_or_else(|| "the server".to_owned(), failure::shown_url);
    if let Some(failure) = failure::describe(inner, &url) {
        let source = failure.message.into();
        return match failure.unreachable {
            true => McpError::Connect { server: server.to_owned(), transport: "http", source },
            false => McpError::Handshake { server: server.to_owned(), source },
        };
    }
    let mut message = toolmux_core::error_report(inner);
    message.truncate(message.trim_end().trim_end_matches(':').len());
    McpError::Handshake { server: server.to_owned(), source: message.into() }
}

/// A reqwest error in words, without its URL: reqwest's own message names the URL, which
/// may carry a secret (a key in the query); its causes do not.
pub(crate) fn client_failure(http: &reqwest::Error) -> String {
    let what = if http.is_connect() {
        "cannot reach the server"
    } else if http.is_timeout() {
        "the request timed out"
    } else {
        "the request failed"
    };
    // Of a connect failure the innermost cause says it ("Connection refused", "failed
    // to lookup address information: …"); the layers above it name the client's
    // internals (`client error (Connect)`, `tcp connect error`).
    match std::error::Error::source(http) {
        Some(cause) if http.is_connect() => format!("{what}: {}", failure::innermost(cause)),
        Some(cause) => format!("{what}: {}", toolmux_core::error_report(cause)),
        None => what.to_owned(),
    }
}

/// First wait before subscribing again after a `subscriptions/listen` stream ended or was
/// refused; doubled per failure in a row, up to [`RELISTEN_MAX`].
const RELISTEN_BASE: Duration = Duration::from_millis(200);
/// Longest wait between subscriptions.
const RELISTEN_MAX: Duration = Duration::from_secs(30);
/// A stream that lasted this long ended as streams do (a proxy's idle timeout, a server
/// ending streams now and then): the next subscription is made without waiting longer.
const RELISTEN_HEALTHY: Duration = Duration::from_secs(30);

/// On 2026-07-28, list changes arrive only on a `subscriptions/listen` stream: it is
/// subscribed to for as long as the connection lives, again after it ends (with backoff),
/// and every subscription after the first has the lists read again, since changes made
/// meanwhile were told to nobody. The server's acknowledgment of each subscription is
/// waited for `acknowledged_within` (the connection's request timeout); one that does not
/// come in time is given up and asked for again with the same backoff, so a server that
/// takes the request and never answers does not hold the listening for good (the stream
/// itself, once acknowledged, stays open as long as the server keeps it).
fn listen_for_list_changes(
    server: &str,
    connection: &Connection,
    events: &Arc<Events>,
    acknowledged_within: Duration,
) {
    // Each list whose changes the server says it announces; a server announcing only its
    // prompts' (or resources') is listened to as well as one announcing its tools'.
    let capabilities = connection.info.as_ref().map(|i| &i.capabilities);
    let tools = capabilities.and_then(|c| c.tools.as_ref()?.list_changed).unwrap_or(false);
    let prompts = capabilities.and_then(|c| c.prompts.as_ref()?.list_changed).unwrap_or(false);
    let resources = capabilities.and_then(|c| c.resources.as_ref()?.list_changed).unwrap_or(false);
    if !(tools || prompts || resources) {
        return;
    }
    let mut filter = SubscriptionFilter::builder();
    if tools {
        filter = filter.tools_list_changed();
    }
    if prompts {
        filter = filter.prompts_list_changed();
    }
    if resources {
        filter = filter.resources_list_changed();
    }
    let filter = filter.build();
    let peer = connection.peer.clone();
    let events = Arc::downgrade(events);
    let server = server.to_owned();
    tokio::spawn(async move {
        let mut failures = 0u32;
        let mut subscribed_before = false;
        loop {
            if peer.is_transport_closed() || events.strong_count() == 0 {
                return;
            }
            let started = tokio::time::Instant::now();
            let Ok(listened) =
                tokio::time::timeout(acknowledged_within, peer.listen(filter.clone())).await
            else {
                tracing::debug!(
                    server = %server,
                    timeout_ms = acknowledged_within.as_millis() as u64,
                    "subscriptions/listen was not acknowledged within the request timeout; \
                     asking again"
                );
                let delay =
                    RELISTEN_BASE.saturating_mul(1u32 << failures.min(16)).min(RELISTEN_MAX);
                failures += 1;
                tokio::time::sleep(delay).await;
                continue;
            };
            match listened {
                Ok(mut subscription) => {
                    if subscribed_before {
                        let Some(events) = events.upgrade() else { return };
                        tracing::debug!(server = %server, "subscribed again; listing again");
                        events.tools_changed.notify_one();
                        events.prompts_changed.notify();
                        events.resources_changed.notify();
                    }
                    subscribed_before = true;
                    while let Ok(Some(notification)) = subscription.next().await {
                        let Some(events) = events.upgrade() else { return };
                        match notification {
                            ServerNotification::ToolListChangedNotification(_) => {
                                tracing::debug!(server = %server, "tools/list_changed (subscription)");
                                events.tools_changed.notify_one();
                            }
                            ServerNotification::PromptListChangedNotification(_) => {
                                events.prompts_changed.notify();
                            }
                            ServerNotification::ResourceListChangedNotification(_) => {
                                events.resources_changed.notify();
                            }
                            _ => {}
                        }
                    }
                    tracing::debug!(server = %server, "the subscriptions/listen stream ended");
                }
                // Refused for good: the server's own error answer. An answer lost on the
                // way (its stream cut before the acknowledgment) or a request not
                // delivered comes as an error too, made here, and is tried again below.
                Err(ServiceError::McpError(e))
                    if !crate::transport::is_answer_lost(&e)
                        && !crate::transport::is_undelivered(&e) =>
                {
                    tracing::debug!(server = %server, error = %e.message, "subscriptions/listen refused");
                    return;
                }
                Err(e) => {
                    tracing::debug!(server = %server, error = %e, "subscriptions/listen failed");
                }
            }
            if started.elapsed() >= RELISTEN_HEALTHY {
                failures = 0;
            }
            let delay = RELISTEN_BASE.saturating_mul(1u32 << failures.min(16)).min(RELISTEN_MAX);
            failures += 1;
            tokio::time::sleep(delay).await;
        }
    });
}
