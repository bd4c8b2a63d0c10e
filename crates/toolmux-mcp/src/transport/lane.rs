//! The direct lane of a stdio connection: `tools/call` requests written straight to the
//! server's stdin and their responses handed straight from its stdout to the waiting call,
//! beside rmcp's session rather than through it.
//!
//! Through rmcp a call crosses its service loop twice: the request goes by channel to the
//! loop, which spawns a task to write it; the response is routed back through a oneshot
//! from the loop. On a call to a fast server that is a sixth of the gateway's time. The
//! lane keeps everything else with rmcp (the handshake, listings, the server's own
//! requests, notifications it does not tap), and shares the pipe with it: one lock
//! serializes whole lines from both.
//!
//! The lane's request ids are strings (`tm-1`, `tm-2`, …) and rmcp's are numbers, so a
//! response is known to be the lane's by its id alone. Progress reports and log lines are
//! handed to the connection's tap as they are read, so they reach the call before its
//! result (rmcp would handle each in a task of its own).

use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, JsonRpcMessage, NumberOrString, RequestId, ServerNotification,
    ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, ServiceError};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::oneshot;

use super::{Fault, FaultKind};

/// What a request of the lane got: its result, the server's error, or the connection's end
/// (as rmcp reports them, so callers handle both paths alike).
pub(crate) type Reply = Result<ServerResult, ServiceError>;

/// Handles the notifications it wants (progress, log lines) and returns the others.
pub(crate) type Tap =
    Box<dyn Fn(ServerNotification) -> Option<ServerNotification> + Send + Sync + 'static>;

/// The prefix of the lane's request ids.
const ID_PREFIX: &str = "tm-";

/// The direct lane of one stdio connection.
pub(crate) struct Lane {
    /// The server's stdin, written by rmcp's sends and the lane's calls alike (whole lines
    /// under the lock); `None` once closed.
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    /// Why the connection ended, for the error its calls get.
    fault: Fault,
    next: AtomicU64,
    /// Calls waiting for their response, by the number in their id; `None` once the
    /// connection ended (every waiting call then sees it closed).
    pending: Mutex<Option<foldhash::HashMap<u64, oneshot::Sender<Reply>>>>,
    tap: OnceLock<Tap>,
    /// The pipe was closed under a write, or the connection ended.
    broken: Arc<AtomicBool>,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").field("next", &self.next).finish_non_exhaustive()
    }
}

/// A request sent on the lane: its id, and where its reply arrives.
#[derive(Debug)]
pub(crate) struct Sent {
    /// The number in the request's id.
    pub(crate) number: u64,
    /// The request's id, also its progress token.
    pub(crate) id: Arc<str>,
    pub(crate) reply: oneshot::Receiver<Reply>,
}

/// The lane's pipe is closed.
#[derive(Debug, thiserror::Error)]
#[error("the server's stdin is closed")]
pub(crate) struct LaneClosed;

impl Lane {
    pub(crate) fn new(stdin: ChildStdin, fault: Fault) -> Lane {
        Lane {
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            fault,
            next: AtomicU64::new(1),
            pending: Mutex::new(Some(foldhash::HashMap::default())),
            tap: OnceLock::new(),
            broken: Arc::default(),
        }
    }

    /// Whether calls can still be sent: false once the connection ended or a write broke
    /// the pipe, so that the next call starts the server afresh.
    pub(crate) fn is_open(&self) -> bool {
        !self.broken.load(Ordering::Relaxed)
    }

    /// Sets where progress reports and log lines go (once, when the connection is made).
    pub(crate) fn set_tap(&self, tap: Tap) {
        let _ = self.tap.set(tap);
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<foldhash::HashMap<u64, oneshot::Sender<Reply>>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh id and the receiver its reply will come to; `None` once the connection ended.
    pub(crate) fn open(&self) -> Option<Sent> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, reply) = oneshot::channel();
        self.lock().as_mut()?.insert(number, tx);
        Some(Sent { number, id: Arc::from(format!("{ID_PREFIX}{number}")), reply })
    }

    /// Stops waiting for a reply (the call was cancelled or timed out).
    pub(crate) fn forget(&self, number: u64) {
        if let Some(pending) = self.lock().as_mut() {
            pending.remove(&number);
        }
    }

    /// Writes one message (a line) to the server's stdin.
    ///
    /// Dropped before it finished (its call was cancelled or timed out while the pipe was
    /// full), it closes the pipe: part of a line may have been written, and nothing sent
    /// after it could be read as a message.
    pub(crate) async fn write(&self, line: &[u8]) -> Result<(), LaneClosed> {
        let mut unfinished = Unfinished(Some(self.stdin.lock().await), &self.broken);
        let Some(stdin) = unfinished.0.as_mut() else { return Err(LaneClosed) };
        let Some(pipe) = stdin.as_mut() else {
            unfinished.0 = None;
            return Err(LaneClosed);
        };
        if let Err(e) = pipe.write_all(line).await {
            // rmcp's next send fails too; the call sees the connection gone, with this
            // reason unless an earlier one (the exit status) explains more.
            self.fault.set(FaultKind::Closed(format!("cannot write to the server's stdin: {e}")));
            return Err(LaneClosed);
        }
        // Finished: release the lock with the pipe open.
        unfinished.0 = None;
        Ok(())
    }

    /// Closes the server's stdin (EOF asks it to exit).
    pub(crate) async fn close_stdin(&self) {
        if let Some(mut pipe) = self.stdin.lock().await.take() {
            let _ = pipe.shutdown().await;
        }
    }

    /// Fails every waiting call: the connection ended.
    pub(crate) fn close(&self) {
        self.broken.store(true, Ordering::Relaxed);
        // Dropping the senders wakes the receivers with an error.
        drop(self.lock().take());
    }

    /// Takes a received message if it is the lane's (a response to one of its requests, or
    /// a notification the tap handles); otherwise returns it for rmcp.
    pub(crate) fn take(
        &self,
        message: RxJsonRpcMessage<RoleClient>,
    ) -> Option<RxJsonRpcMessage<RoleClient>> {
        match message {
            JsonRpcMessage::Response(response) => match number(&response.id) {
                Some(n) => {
                    self.deliver(n, Ok(response.result));
                    None
                }
                None => Some(JsonRpcMessage::Response(response)),
            },
            JsonRpcMessage::Error(error) => match error.id.as_ref().and_then(number) {
                Some(n) => {
                    self.deliver(n, Err(ServiceError::McpError(error.error)));
                    None
                }
                None => Some(JsonRpcMessage::Error(error)),
            },
            JsonRpcMessage::Notification(mut notification) => {
                if let Some(tap) = self.tap.get() {
                    notification.notification = tap(notification.notification)?;
                }
                Some(JsonRpcMessage::Notification(notification))
            }
            other => Some(other),
        }
    }

    fn deliver(&self, number: u64, reply: Reply) {
        let waiting = self.lock().as_mut().and_then(|pending| pending.remove(&number));
        match waiting {
            Some(tx) => {
                let _ = tx.send(reply);
            }
            // A call that gave up (cancelled, timed out) before its response arrived.
            None => tracing::trace!(id = number, "response to a call no longer waiting"),
        }
    }
}

/// How long telling the server of a cancellation may wait for its stdin; a pipe that cannot
/// take so short a line within it belongs to a server that stopped reading.
pub(crate) const CANCEL_WRITE_GRACE: Duration = Duration::from_millis(100);

/// A call waiting for its reply on the lane. Dropped before [`Waiting::finish`] (whoever
/// awaited the call dropped it without cancelling it), it stops waiting and tells the
/// server, from a task of its own since a drop cannot wait.
pub(crate) struct Waiting {
    lane: Arc<Lane>,
    number: u64,
    id: Arc<str>,
    done: bool,
}

impl Waiting {
    pub(crate) fn new(lane: &Arc<Lane>, sent: &Sent) -> Waiting {
        Waiting { lane: lane.clone(), number: sent.number, id: sent.id.clone(), done: false }
    }

    /// The call is over and the server needs no word of it, or has had it.
    pub(crate) fn finish(mut self) {
        self.done = true;
        self.lane.forget(self.number);
    }

    /// Tells the server the call is abandoned, before returning, so that it hears of it
    /// before any later request.
    pub(crate) async fn abandon(mut self, reason: &str) {
        self.done = true;
        self.lane.forget(self.number);
        let line = cancel_line(&self.id, reason);
        let _ = tokio::time::timeout(CANCEL_WRITE_GRACE, self.lane.write(&line)).await;
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.lane.forget(self.number);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let lane = self.lane.clone();
        let line = cancel_line(&self.id, "the caller stopped waiting");
        runtime.spawn(async move {
            let _ = tokio::time::timeout(CANCEL_WRITE_GRACE, lane.write(&line)).await;
        });
    }
}

/// The stdin lock of a write in progress; dropped while set, it closes the pipe and marks
/// the lane broken.
struct Unfinished<'a>(Option<tokio::sync::MutexGuard<'a, Option<ChildStdin>>>, &'a AtomicBool);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(stdin) = self.0.as_mut() {
            **stdin = None;
            self.1.store(true, Ordering::Relaxed);
        }
    }
}

/// The number in a lane request id; `None` for rmcp's ids.
fn number(id: &RequestId) -> Option<u64> {
    match id {
        NumberOrString::String(id) => id.strip_prefix(ID_PREFIX)?.parse().ok(),
        NumberOrString::Number(_) => None,
    }
}

/// A `tools/call` request as one line.
pub(crate) fn call_line(
    id: &str,
    params: &CallToolRequestParams,
) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(Serialize)]
    struct Call<'a> {
        jsonrpc: &'static str,
        id: &'a str,
        method: &'static str,
        params: &'a CallToolRequestParams,
    }
    let call = Call { jsonrpc: "2.0", id, method: "tools/call", params };
    let mut line = Vec::with_capacity(crate::LINE_CAPACITY);
    serde_json::to_writer(&mut line, &call)?;
    line.push(b'\n');
    Ok(line)
}

/// The `notifications/cancelled` of a lane request, as one line.
pub(crate) fn cancel_line(id: &str, reason: &str) -> Vec<u8> {
    let message = serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": { "requestId": id, "reason": reason },
    });
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}
