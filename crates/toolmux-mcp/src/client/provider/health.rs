//! The health of an MCP server: what [`McpProvider`](super::McpProvider) tells a gateway's
//! `/health`, and the optional periodic `ping` (`healthCheckMs`) that finds a server that
//! hung or died between calls.
//!
//! The check runs beside one connection and ends with it: it pings only a server that is
//! running, never starts one, and once it closed a connection that stopped answering it
//! is done; the next call restarts the server (as after a crash) and starts a new check.

use rmcp::model::{ClientRequest, PingRequest};
use rmcp::service::{PeerRequestOptions, ServiceError};
use std::sync::{Arc, Weak};
use std::time::Duration;
use toolmux_core::Health;

use super::Inner;
use crate::client::connection::Connection;

/// Pings in a row a server may leave unanswered before its connection is closed.
pub(super) const MISSED_PINGS_TO_RESTART: u32 = 3;
/// The shortest wait for a ping's answer, however short the interval.
const PING_TIMEOUT_MIN: Duration = Duration::from_secs(1);
/// The longest wait for a ping's answer, however long the interval.
const PING_TIMEOUT_MAX: Duration = Duration::from_secs(10);
/// Beyond the ping's timeout, how long rmcp may take to tell the server it gave up (a
/// write to a server that stopped reading its stdin may block).
const PING_GRACE: Duration = Duration::from_secs(1);

/// What the provider knows of its server beyond its connection's own state.
#[derive(Debug, Default)]
pub(super) struct Status {
    /// Pings in a row the current connection left unanswered.
    missed_pings: u32,
    /// Why the server cannot be used now, in words of ours (never an error's text, which
    /// may carry a URL or a server's output): `/health` shows it to whoever asks. Cleared
    /// when the server starts again.
    problem: Option<String>,
    /// The server was stopped after being unused this long (`idleShutdownMs`).
    stopped_idle: Option<Duration>,
}

impl Inner {
    /// Records why the server cannot be used now.
    pub(super) fn set_problem(&self, problem: String) {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).problem = Some(problem);
    }

    /// Records that the server was stopped after being unused for `after`.
    pub(super) fn set_stopped_idle(&self, after: Duration) {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).stopped_idle = Some(after);
    }

    /// See [`toolmux_core::ToolProvider::health`].
    pub(super) fn health(&self) -> Health {
        if !self.config.is_enabled() {
            return Health::ok().with_detail("disabled");
        }
        if self.shutdown.is_cancelled() {
            return Health::unhealthy("shut down");
        }
        let (missed, problem, stopped_idle) = {
            let status = self.status.lock().unwrap_or_else(|e| e.into_inner());
            (status.missed_pings, status.problem.clone(), status.stopped_idle)
        };
        if let Some(problem) = problem {
            return Health::unhealthy(problem);
        }
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match current {
            None => match stopped_idle {
                Some(after) => Health::ok().with_detail(format!(
                    "stopped after {} without calls; starts on the next call",
                    super::idle::spoken(after)
                )),
                None => Health::ok().with_detail("not started"),
            },
            Some(connection) if !connection.is_alive() => {
                Health::unhealthy("connection closed; restarts on the next call")
            }
            Some(_) if missed > 0 => Health::ok().with_detail(format!(
                "{missed} of the last pings unanswered ({MISSED_PINGS_TO_RESTART} in a row restart it)"
            )),
            Some(_) => Health::ok(),
        }
    }

    /// `connection`, taken from calls, when it is the one they use now: the next call
    /// starts the server again.
    pub(super) fn take_if_current(&self, connection: &Arc<Connection>) -> Option<Arc<Connection>> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
            current.take()
        } else {
            None
        }
    }

    /// Whether `connection` is the one calls use now.
    pub(super) fn is_current(&self, connection: &Arc<Connection>) -> bool {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection))
    }

    fn set_missed_pings(&self, missed: u32) {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).missed_pings = missed;
    }

    /// Closes `connection`, which stopped answering, when calls still use it: the next
    /// call restarts the server, as after a crash (the failure counts toward
    /// `maxRestarts` until a request succeeds).
    async fn close_unanswering(&self, connection: &Arc<Connection>, missed: u32) {
        let Some(taken) = self.take_if_current(connection) else { return };
        {
            let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
            status.missed_pings = 0;
            status.problem =
                Some(format!("no answer to {missed} pings in a row; restarts on the next call"));
        }
        // Calls waiting on it fail now, as they would after a crash, instead of at their
        // timeouts.
        taken.close().await;
        self.connection_lost().await;
    }
}

/// While `connection` is the provider's and the provider runs, pings the server every
/// `every`; after [`MISSED_PINGS_TO_RESTART`] unanswered pings in a row closes the
/// connection. Holds the provider only between pings, so that dropping it is not held up.
pub(super) fn spawn_check(inner: Weak<Inner>, connection: Arc<Connection>, every: Duration) {
    let Some(strong) = inner.upgrade() else { return };
    let shutdown = strong.shutdown.clone();
    let server = strong.name.clone();
    drop(strong);
    let timeout = every.clamp(PING_TIMEOUT_MIN, PING_TIMEOUT_MAX);
    tokio::spawn(async move {
        let mut missed = 0u32;
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = shutdown.cancelled() => return,
            }
            {
                let Some(inner) = inner.upgrade() else { return };
                // Replaced by a restart, or closed: its successor has a check of its own,
                // and a closed one is reported by `health` and restarted by the next call.
                if !inner.is_current(&connection) || !connection.is_alive() {
                    return;
                }
            }
            let answered = tokio::select! {
                answered = ping(&connection, timeout) => answered,
                () = shutdown.cancelled() => return,
            };
            let Some(inner) = inner.upgrade() else { return };
            match answered {
                Ok(()) => {
                    if missed > 0 {
                        tracing::debug!(server = %server, "mcp server answers ping again");
                    }
                    missed = 0;
                    inner.set_missed_pings(0);
                    if !announces_tool_changes(&connection) {
                        reread_tools(&inner, &connection).await;
                    }
                }
                Err(why) => {
                    missed += 1;
                    inner.set_missed_pings(missed);
                    if missed < MISSED_PINGS_TO_RESTART {
                        tracing::debug!(server = %server, missed, "mcp server did not answer ping: {why}");
                        continue;
                    }
                    tracing::warn!(
                        server = %server,
                        "mcp server did not answer {missed} pings in a row (last: {why}); \
                         closing its connection, the next call restarts it"
                    );
                    inner.close_unanswering(&connection, missed).await;
                    return;
                }
            }
        }
    });
}

/// Whether the server said it sends `notifications/tools/list_changed`.
fn announces_tool_changes(connection: &Connection) -> bool {
    connection
        .info
        .as_ref()
        .and_then(|i| i.capabilities.tools.as_ref())
        .and_then(|t| t.list_changed)
        .unwrap_or(false)
}

/// Lists the tools of a server that does not announce changes to them (see
/// [`Inner::reread_tools`]): without this, a gateway kept offering what such a server had
/// when it connected. Only on an answered ping, so a server that hangs is not asked twice.
async fn reread_tools(inner: &Inner, connection: &Connection) {
    inner.reread_tools(connection).await;
}

/// Sends `ping` and waits for its answer. An error answer is an answer: the server reads
/// its requests and writes responses, which is what the check wants to know.
async fn ping(connection: &Connection, timeout: Duration) -> Result<(), String> {
    let request = ClientRequest::PingRequest(PingRequest {
        method: Default::default(),
        extensions: Default::default(),
    });
    let mut options = PeerRequestOptions::no_options();
    options.timeout = Some(timeout);
    let answer = async {
        connection.peer.send_request_with_option(request, options).await?.await_response().await
    };
    let no_answer = || format!("no answer within {}ms", timeout.as_millis());
    match tokio::time::timeout(timeout + PING_GRACE, answer).await {
        // Made here for a ping whose POST failed: the server never saw it.
        Ok(Err(ServiceError::McpError(e))) if crate::transport::is_undelivered(&e) => {
            Err(e.message.into_owned())
        }
        Ok(Ok(_) | Err(ServiceError::McpError(_))) => Ok(()),
        Ok(Err(ServiceError::Timeout { .. })) | Err(_) => Err(no_answer()),
        Ok(Err(ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
            Err("connection closed".to_owned())
        }
        Ok(Err(other)) => Err(other.to_string()),
    }
}
