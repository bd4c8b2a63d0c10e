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
use serde_json::value::RawValue;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::oneshot;

use super::{Fault, FaultKind};

/// What a request of the lane got: its result, the server's error, or the connection's end
/// (as rmcp reports them, so callers handle both paths alike).
pub(crate) type Reply = Result<ServerResult, ServiceError>;

/// What a relayed request of the lane ([`Lane::open_raw`]) got: a result as the server
/// wrote it, or anything else as [`Reply`].
#[derive(Debug)]
pub(crate) enum RawReply {
    /// The result's JSON text.
    Result(Box<str>),
    /// A plain text result within the size asked for ([`super::plain_text_result`]),
    /// given to the request's early answer, if it had one, before it was sent here.
    Plain(Box<str>),
    /// Boxed: rare on this path, and a call holds the reply on its stack.
    Other(Box<Reply>),
}

/// Who waits for a request's answer.
enum Waiter {
    Parsed(oneshot::Sender<Reply>),
    Raw(oneshot::Sender<RawReply>, Option<Early>),
}

/// Where a raw request's plain result goes first: its caller's answer, given by the
/// reader of the server's output as soon as it has read the result (see
/// [`toolmux_core::EarlyAnswer`]), when the result is at most `max` bytes long.
pub(crate) struct Early {
    pub(crate) max: usize,
    pub(crate) answer: toolmux_core::EarlyAnswer,
}

/// Handles the notifications it wants (progress, log lines) and returns the others.
pub(crate) type Tap =
    Box<dyn Fn(ServerNotification) -> Option<ServerNotification> + Send + Sync + 'static>;

/// The prefix of the lane's request ids.
const ID_PREFIX: &str = "tm-";

/// The JSON-RPC id of lane request `number`: `tm-` and the number, made without `fmt`
/// and with one allocation, as it is on every call's path.
fn request_id(number: u64) -> Arc<str> {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(number).as_bytes();
    let mut id = [0u8; ID_PREFIX.len() + 20];
    let len = ID_PREFIX.len() + digits.len();
    id[..ID_PREFIX.len()].copy_from_slice(ID_PREFIX.as_bytes());
    id[ID_PREFIX.len()..len].copy_from_slice(digits);
    // ASCII throughout.
    Arc::from(std::str::from_utf8(&id[..len]).unwrap_or(ID_PREFIX))
}

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
    pending: Mutex<Option<foldhash::HashMap<u64, Waiter>>>,
    /// How many of them wait for a raw result: while none does, the reader does not look
    /// at a line before parsing it.
    raw_waiting: AtomicUsize,
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

/// A request sent on the lane for a raw result ([`Lane::open_raw`]).
#[derive(Debug)]
pub(crate) struct SentRaw {
    pub(crate) number: u64,
    pub(crate) id: Arc<str>,
    pub(crate) reply: oneshot::Receiver<RawReply>,
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
            raw_waiting: AtomicUsize::new(0),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<foldhash::HashMap<u64, Waiter>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh id and the receiver its reply will come to; `None` once the connection ended.
    pub(crate) fn open(&self) -> Option<Sent> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, reply) = oneshot::channel();
        self.lock().as_mut()?.insert(number, Waiter::Parsed(tx));
        Some(Sent { number, id: request_id(number), reply })
    }

    /// As [`Lane::open`], for a request whose result is wanted as the server wrote it
    /// ([`RawReply::Result`]), not parsed; a plain one goes to `early` first.
    pub(crate) fn open_raw(&self, early: Option<Early>) -> Option<SentRaw> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, reply) = oneshot::channel();
        {
            let mut pending = self.lock();
            pending.as_mut()?.insert(number, Waiter::Raw(tx, early));
            self.raw_waiting.fetch_add(1, Ordering::Relaxed);
        }
        Some(SentRaw { number, id: request_id(number), reply })
    }

    /// Takes request `number`'s waiter out of `pending`.
    fn remove(&self, pending: &mut foldhash::HashMap<u64, Waiter>, number: u64) -> Option<Waiter> {
        let waiter = pending.remove(&number);
        if let Some(Waiter::Raw(..)) = waiter {
            self.raw_waiting.fetch_sub(1, Ordering::Relaxed);
        }
        waiter
    }

    /// Stops waiting for a reply (the call was cancelled or timed out).
    pub(crate) fn forget(&self, number: u64) {
        if let Some(pending) = self.lock().as_mut() {
            self.remove(pending, number);
        }
    }

    /// Hands a line to the request waiting for it raw, when it is the result of one:
    /// read only by its id and checked as JSON, not parsed into a message. `false` for
    /// any other line, which is then parsed as usual.
    pub(crate) fn take_raw(&self, line: &[u8]) -> bool {
        if self.raw_waiting.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let Ok(text) = std::str::from_utf8(line) else { return false };
        // `plain`: the result is known to be plain text (see `plain_result_line`).
        let (number, result, plain) = match plain_result_line(text) {
            Some((number, result)) => (number, result, true),
            None => {
                let Some((number, result)) = result_line(text) else { return false };
                (number, result, false)
            }
        };
        let waiter = {
            let mut pending = self.lock();
            let Some(pending) = pending.as_mut() else { return false };
            if !matches!(pending.get(&number), Some(Waiter::Raw(..))) {
                return false;
            }
            self.remove(pending, number)
        };
        let Some(Waiter::Raw(tx, early)) = waiter else { return true };
        let reply = match early {
            Some(early)
                if result.len() <= early.max && (plain || super::plain_text_result(result)) =>
            {
                early.answer.answer(result);
                RawReply::Plain(result.into())
            }
            _ => RawReply::Result(result.into()),
        };
        let _ = tx.send(reply);
        true
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

    /// Ends the connection of a server that did not take a message within `waited`: it
    /// stopped reading its stdin, and the next call starts it afresh.
    pub(crate) fn stalled(&self, waited: Duration) {
        let why = format!(
            "the server stopped reading its stdin: a message waited {} ms to be written \
             (`requestTimeoutMs`)",
            waited.as_millis()
        );
        self.fault.set(FaultKind::Closed(why));
        self.close();
    }

    /// Fails every waiting call: the connection ended.
    pub(crate) fn close(&self) {
        self.broken.store(true, Ordering::Relaxed);
        // Dropping the senders wakes the receivers with an error.
        drop(self.lock().take());
        self.raw_waiting.store(0, Ordering::Relaxed);
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
        let waiting = self.lock().as_mut().and_then(|pending| self.remove(pending, number));
        match waiting {
            Some(Waiter::Parsed(tx)) => {
                let _ = tx.send(reply);
            }
            Some(Waiter::Raw(tx, _)) => {
                let _ = tx.send(RawReply::Other(Box::new(reply)));
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
    pub(crate) fn new(lane: &Arc<Lane>, number: u64, id: &Arc<str>) -> Waiting {
        Waiting { lane: lane.clone(), number, id: id.clone(), done: false }
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

/// A `tools/call` request as one line, its arguments spliced in as they came (the JSON
/// text of an object, its whitespace line breaks made spaces: see
/// [`crate::push_one_line`]), with the progress token and trace context [`call_line`]
/// would give.
pub(crate) fn relay_line(
    id: &str,
    name: &str,
    arguments: &str,
    trace: Option<&str>,
    trace_state: Option<&str>,
) -> Vec<u8> {
    let mut line = Vec::with_capacity(crate::LINE_CAPACITY.max(arguments.len() + 160));
    line.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":\"");
    line.extend_from_slice(id.as_bytes());
    line.extend_from_slice(b"\",\"method\":\"tools/call\",\"params\":{\"name\":");
    json_string(&mut line, name);
    line.extend_from_slice(b",\"arguments\":");
    crate::push_one_line(&mut line, arguments);
    line.extend_from_slice(b",\"_meta\":{\"progressToken\":\"");
    line.extend_from_slice(id.as_bytes());
    line.push(b'"');
    if let Some(trace) = trace {
        line.extend_from_slice(b",\"traceparent\":");
        json_string(&mut line, trace);
        if let Some(state) = trace_state {
            line.extend_from_slice(b",\"tracestate\":");
            json_string(&mut line, state);
        }
    }
    line.extend_from_slice(b"}}}\n");
    line
}

/// `text` as a JSON string.
fn json_string(line: &mut Vec<u8>, text: &str) {
    // Writing a string to a vector cannot fail.
    let _ = serde_json::to_writer(&mut *line, text);
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

/// A result line of a lane request, read with serde: the request's number and the
/// result's JSON text, checked as JSON but not parsed into values.
fn result_line(line: &str) -> Option<(u64, &str)> {
    #[derive(serde::Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        jsonrpc: &'a str,
        #[serde(borrow)]
        id: &'a str,
        #[serde(borrow)]
        result: &'a RawValue,
    }
    let peek = serde_json::from_str::<Peek<'_>>(line).ok()?;
    let number = peek.id.strip_prefix(ID_PREFIX)?.parse().ok()?;
    (peek.jsonrpc == "2.0").then_some((number, peek.result.get()))
}

/// The commonest result line of a relayed call, read without serde: `Some` with the
/// request's number and the result's JSON text when `line` is, byte for byte, one of the
/// two compact forms the MCP SDKs write,
/// `{"result":R,"jsonrpc":"2.0","id":"tm-N"}` or `{"jsonrpc":"2.0","id":"tm-N","result":R}`,
/// and `R` is `{"content":[B,…]}` with every `B` exactly `{"type":"text","text":S}`: a
/// plain text result (see [`super::plain_text_result`]), and JSON. `None` for anything
/// else (other spacing or member order, an `isError`, a `\u` escape or a control
/// character in a string), which is then read with serde ([`result_line`]).
///
/// `line` is valid UTF-8 (it is a `&str`), so what is left to check is the JSON: the
/// strings, whose ends this finds by their escapes, and the structure around them.
fn plain_result_line(line: &str) -> Option<(u64, &str)> {
    const RESULT_FIRST: &str = r#"{"result":"#;
    const ID_AFTER: &str = r#","jsonrpc":"2.0","id":"tm-"#;
    const ID_FIRST: &str = r#"{"jsonrpc":"2.0","id":"tm-"#;
    let (digits, result) = match line.strip_prefix(RESULT_FIRST) {
        // Read from the end (no substring search, which costs more than all the rest).
        Some(rest) => {
            let rest = rest.strip_suffix(r#""}"#)?;
            let before = rest.trim_end_matches(|c: char| c.is_ascii_digit());
            (&rest[before.len()..], before.strip_suffix(ID_AFTER)?)
        }
        None => {
            let (digits, rest) = line.strip_prefix(ID_FIRST)?.split_once('"')?;
            (digits, rest.strip_prefix(r#","result":"#)?.strip_suffix('}')?)
        }
    };
    // As the serde path reads the id: `tm-` and a `u64`, here in plain digits only.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number = digits.parse().ok()?;
    let mut rest = result.strip_prefix(r#"{"content":["#)?.as_bytes();
    if rest == b"]}" {
        return Some((number, result));
    }
    loop {
        rest = rest.strip_prefix(br#"{"type":"text","text":""#)?;
        rest = &rest[string_end(rest)? + 1..];
        match rest.strip_prefix(b"},") {
            Some(next) => rest = next,
            None => return (rest == b"}]}").then_some((number, result)),
        }
    }
}

/// Where a JSON string's text (after its opening quote) ends: the index of its closing
/// quote. `None` at a `\u` escape, a control character, an escape JSON does not have, or
/// no closing quote.
fn string_end(text: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        match *text.get(at)? {
            b'"' => return Some(at),
            b'\\' => match text.get(at + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at += 2,
                _ => return None,
            },
            0..=0x1f => return None,
            _ => at += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolRequestParams, ErrorCode, ErrorData, JsonRpcError};

    fn lane() -> (Lane, tokio::process::Child) {
        super::super::stdio::lane_onto_cat()
    }

    /// Request ids are `tm-` and the number, every number read back by `number`.
    #[test]
    fn request_ids_are_the_prefix_and_the_number() {
        for number in [0, 7, 10, 12_345, u64::MAX] {
            let id = request_id(number);
            assert_eq!(&*id, format!("tm-{number}"));
            let id = RequestId::String(id);
            assert_eq!(super::number(&id), Some(number));
        }
    }

    /// A raw waiter gets a result line's `result` as it was written; a parsed waiter's
    /// line, another id and anything that is not a result are left to the parse.
    #[tokio::test]
    async fn results_reach_raw_waiters_as_written() {
        let (lane, _cat) = lane();
        assert!(!lane.take_raw(br#"{"jsonrpc":"2.0","id":"tm-1","result":{}}"#), "none waits");
        let mut raw = lane.open_raw(None).expect("open");
        let parsed = lane.open().expect("open");
        assert_eq!((&*raw.id, &*parsed.id), ("tm-1", "tm-2"));
        let other = [
            r#"{"jsonrpc":"2.0","id":"tm-2","result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":"tm-9","result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":"tm-1","error":{"code":-32602,"message":"no"}}"#,
            r#"{"jsonrpc":"1.0","id":"tm-1","result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
        ];
        for line in other {
            assert!(!lane.take_raw(line.as_bytes()), "{line}");
        }
        let line =
            r#"{"jsonrpc":"2.0","id":"tm-1","result":{"content":[{"type":"text","text":"é"}]}}"#;
        assert!(lane.take_raw(line.as_bytes()));
        let Ok(RawReply::Result(result)) = raw.reply.try_recv() else { panic!("delivered") };
        assert_eq!(&*result, r#"{"content":[{"type":"text","text":"é"}]}"#);
        assert_eq!(lane.raw_waiting.load(Ordering::Relaxed), 0);

        // An error for a raw waiter comes parsed.
        let mut raw = lane.open_raw(None).expect("open");
        let error = JsonRpcError {
            jsonrpc: Default::default(),
            id: Some(NumberOrString::String(raw.id.clone())),
            error: ErrorData::new(ErrorCode(-32602), "no such tool", None),
        };
        assert!(lane.take(JsonRpcMessage::Error(error)).is_none());
        let Ok(RawReply::Other(reply)) = raw.reply.try_recv() else { panic!("delivered") };
        let Err(ServiceError::McpError(error)) = *reply else { panic!("an error: {reply:?}") };
        assert_eq!(error.message, "no such tool");

        // A call that stopped waiting is forgotten.
        let raw = lane.open_raw(None).expect("open");
        lane.forget(raw.number);
        assert_eq!(lane.raw_waiting.load(Ordering::Relaxed), 0);
        let line = format!(r#"{{"jsonrpc":"2.0","id":"{}","result":{{}}}}"#, raw.id);
        assert!(!lane.take_raw(line.as_bytes()));
        drop(parsed);
    }

    /// The fast reading of a plain result line gives what serde's reading gives, or
    /// leaves the line to it.
    #[test]
    fn plain_result_lines_read_as_serde_reads_them() {
        /// The serde path of `take_raw`, and the plain-text check.
        fn by_serde(line: &str) -> Option<(u64, String, bool)> {
            result_line(line).map(|(number, result)| {
                (number, result.to_owned(), super::super::plain_text_result(result))
            })
        }
        let texts = [
            r#""Echo: hello""#,
            r#""""#,
            r#""é ☃ \" \\ \/ \b \f \n \r \t""#,
            r#""\u0041""#,
            "\"tab\tin\"",
            r#""\x""#,
            r#""\"}]},\"jsonrpc\":\"2.0\",\"id\":\"tm-5\"}""#,
            r#""open"#,
            "7",
        ];
        let mut results = vec![r#"{"content":[]}"#.to_owned()];
        for text in texts {
            let block = format!(r#"{{"type":"text","text":{text}}}"#);
            results.push(format!(r#"{{"content":[{block}]}}"#));
            results.push(format!(r#"{{"content":[{block},{block}]}}"#));
            results.push(format!(r#"{{"content":[{block}],"isError":false}}"#));
            results.push(format!(r#"{{"content":[{{"text":{text},"type":"text"}}]}}"#));
            results.push(format!(r#"{{"content": [{block}]}}"#));
        }
        results.push(r#"{"content":[{"type":"text","text":"a"}],"content":[]}"#.to_owned());
        results.push(r#"{"content":[{"type":"image","data":"AA==","mimeType":"x"}]}"#.to_owned());
        results.push(r#"{"content":[{"type":"text","text":"a"},]}"#.to_owned());
        let ids =
            ["\"tm-5\"", "\"tm-05\"", "\"tm-18446744073709551616\"", "\"tm-+5\"", "\"tm-\"", "5"];
        let mut fast = 0;
        for result in &results {
            for id in ids {
                for line in [
                    format!(r#"{{"result":{result},"jsonrpc":"2.0","id":{id}}}"#),
                    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#),
                    format!(r#"{{"id":{id},"jsonrpc":"2.0","result":{result}}}"#),
                    format!(r#"{{"jsonrpc":"1.0","id":{id},"result":{result}}}"#),
                    format!(r#"{{"result":{result},"jsonrpc":"2.0","id":{id}}} "#),
                ] {
                    let Some((number, raw)) = plain_result_line(&line) else { continue };
                    fast += 1;
                    assert_eq!(by_serde(&line), Some((number, raw.to_owned(), true)), "{line}");
                }
            }
        }
        // What the SDKs write for a plain result takes the fast reading, in both orders.
        // Results: no block, and one or two blocks of each of the four texts it takes.
        assert_eq!(fast, 2 * 2 * (1 + 2 * 4), "both orders, ids 5 and 05");
        let node = r#"{"result":{"content":[{"type":"text","text":"Echo: hello"}]},"jsonrpc":"2.0","id":"tm-12"}"#;
        assert_eq!(
            plain_result_line(node),
            Some((12, r#"{"content":[{"type":"text","text":"Echo: hello"}]}"#))
        );
    }

    /// A plain result within the size asked for goes to the early answer before it is
    /// handed over; any other is only handed over.
    #[tokio::test]
    async fn plain_results_are_answered_early() {
        let (lane, _cat) = lane();
        let answered = Arc::new(Mutex::new(Vec::<String>::new()));
        let early = || {
            let answered = answered.clone();
            Some(Early {
                max: 60,
                answer: toolmux_core::EarlyAnswer::new(move |json| {
                    answered.lock().unwrap().push(json.to_owned());
                    true
                }),
            })
        };
        let plain = r#"{"content":[{"type":"text","text":"ok"}]}"#;
        let cases = [
            (plain, true),
            (r#"{"content":[{"type":"text","text":"no"}],"isError":true}"#, false),
            (
                r#"{"content":[{"type":"text","text":"a longer text than sixty bytes, all told"}]}"#,
                false,
            ),
        ];
        for (result, early_too) in cases {
            let mut sent = lane.open_raw(early()).expect("open");
            let line = format!(r#"{{"jsonrpc":"2.0","id":"{}","result":{result}}}"#, sent.id);
            assert!(lane.take_raw(line.as_bytes()));
            let reply = sent.reply.try_recv().expect("delivered");
            match reply {
                RawReply::Plain(raw) => {
                    assert!(early_too, "{result}");
                    assert_eq!(&*raw, result);
                }
                RawReply::Result(raw) => {
                    assert!(!early_too, "{result}");
                    assert_eq!(&*raw, result);
                }
                RawReply::Other(other) => panic!("{other:?}"),
            }
        }
        assert_eq!(*answered.lock().unwrap(), vec![plain.to_owned()]);
    }

    /// Line breaks standing as whitespace in the arguments go as spaces: the request stays
    /// one line for a reader that ends lines at `\r` too.
    #[test]
    fn relayed_arguments_stay_on_one_line() {
        let arguments = "{\"a\":\r{\"b\":\n1}\r\n}";
        let line = relay_line("tm-1", "t", arguments, None, None);
        let (last, before) = line.split_last().expect("a line");
        assert_eq!(*last, b'\n');
        assert!(!before.iter().any(|b| matches!(b, b'\r' | b'\n')), "{line:?}");
        let spliced: serde_json::Value = serde_json::from_slice(&line).expect("JSON");
        assert_eq!(spliced["params"]["arguments"], serde_json::json!({"a": {"b": 1}}));
    }

    /// The spliced request is the request [`call_line`] writes.
    #[test]
    fn relay_lines_are_the_call_lines() {
        let arguments = r#"{"message": "h\"i", "n": [1, 2]}"#;
        let trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        for (trace, state) in [(None, None), (Some(trace), None), (Some(trace), Some("k=v,\"q\""))]
        {
            let mut params = CallToolRequestParams::new("na\"me")
                .with_arguments(serde_json::from_str(arguments).expect("an object"));
            let meta = params.meta.get_or_insert_default();
            meta.set_progress_token(rmcp::model::ProgressToken(NumberOrString::String(
                "tm-4".into(),
            )));
            if let Some(trace) = trace {
                meta.set_traceparent(trace.to_owned());
                if let Some(state) = state {
                    meta.set_tracestate(state);
                }
            }
            let expected: serde_json::Value =
                serde_json::from_slice(&call_line("tm-4", &params).expect("encodes")).unwrap();
            let line = relay_line("tm-4", "na\"me", arguments, trace, state);
            assert_eq!(line.last(), Some(&b'\n'));
            let spliced: serde_json::Value = serde_json::from_slice(&line).expect("JSON");
            assert_eq!(spliced, expected);
        }
    }
}
