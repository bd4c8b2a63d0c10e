//! The transports rmcp lacks or that need more care than its own: stdio with process-group
//! hygiene and bounded framing, legacy SSE and WebSocket. Stdio reads and writes the child's
//! pipes right in rmcp's service loop (the hot path of every call); SSE and WebSocket run
//! as background "pump" tasks exchanging JSON-RPC messages with rmcp through
//! [`ChannelTransport`]; streamable HTTP uses rmcp's own client.
//!
//! (Spawning is allowed only under `transport/stdio` by the workspace's tidy check, which is
//! why these live here rather than under `client/`.)

pub(crate) mod lane;
pub(crate) mod retry;
pub(crate) mod sse;
pub(crate) mod stdio;
pub(crate) mod websocket;

use rmcp::RoleClient;
use rmcp::model::JsonRpcMessage;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Outbound messages waiting for a pump.
const OUTBOUND_CAPACITY: usize = 64;
/// Inbound messages waiting for rmcp.
const INBOUND_CAPACITY: usize = 64;

/// Why a connection ended, as far as its pumps know; read when a call fails with a closed
/// transport so the error can say more than "closed".
#[derive(Debug, Default, Clone)]
pub(crate) struct Fault(Arc<Mutex<FaultState>>);

#[derive(Debug, Default)]
struct FaultState {
    kind: Option<FaultKind>,
    /// The last non-message line seen before the first message (a banner, or garbage).
    noise: Option<String>,
    /// The last lines the server wrote on stderr (a stdio server's traceback says why it
    /// exited), at most [`STDERR_TAIL_LINES`] of at most [`STDERR_TAIL_CHARS`] characters.
    stderr: std::collections::VecDeque<String>,
    /// Values the server was given in its `env` (secrets, as its configuration says), cut
    /// out of its stderr before a line is kept: a server that prints its token in a usage
    /// error must not put it in toolmux's errors. Longest first, so one containing another
    /// is cut whole.
    hidden: Vec<String>,
}

/// Lines of a server's stderr kept for the error that says it exited.
const STDERR_TAIL_LINES: usize = 8;
/// The most of one such line kept (the end of a long line is where the error is).
const STDERR_TAIL_CHARS: usize = 300;
/// Shortest `env` value cut out of the stderr kept: shorter ones (`1`, `on`) are no
/// secrets and would mangle ordinary words, as the orchestrator's redaction also judges.
const HIDDEN_MIN_CHARS: usize = 4;

/// One recorded reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// The peer broke the protocol (garbage on stdout, a malformed message).
    Protocol(String),
    /// The connection broke or the process exited.
    Closed(String),
    /// The server refused the client and OAuth could not authorize it.
    Auth(String),
}

impl Fault {
    /// Records `kind` unless an earlier reason is known (the first cause is the real one).
    pub(crate) fn set(&self, kind: FaultKind) {
        let mut state = self.lock();
        state.kind.get_or_insert(kind);
    }

    /// Records `kind` over a plain "closed" reason (an exit status explains more than EOF).
    pub(crate) fn refine(&self, kind: FaultKind) {
        let mut state = self.lock();
        if !matches!(state.kind, Some(FaultKind::Protocol(_))) {
            state.kind = Some(kind);
        }
    }

    /// The recorded reason.
    pub(crate) fn get(&self) -> Option<FaultKind> {
        self.lock().kind.clone()
    }

    /// Remembers a non-message line seen before the handshake.
    pub(crate) fn note_noise(&self, what: String) {
        self.lock().noise = Some(what);
    }

    /// The last non-message line seen before the handshake.
    pub(crate) fn noise(&self) -> Option<String> {
        self.lock().noise.clone()
    }

    /// Cuts `values` (the server's `env` values) out of the stderr lines kept from now on.
    pub(crate) fn hide<'a>(&self, values: impl IntoIterator<Item = &'a String>) {
        let mut state = self.lock();
        state
            .hidden
            .extend(values.into_iter().filter(|v| v.chars().count() >= HIDDEN_MIN_CHARS).cloned());
        state.hidden.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        state.hidden.dedup();
    }

    /// Keeps `line` of the server's stderr among the last few, with the hidden values
    /// replaced by `[redacted]`; blank lines are skipped.
    pub(crate) fn note_stderr(&self, line: &str) {
        let line = line.trim_end();
        if line.trim().is_empty() {
            return;
        }
        let mut state = self.lock();
        let mut clean = std::borrow::Cow::Borrowed(line);
        for value in &state.hidden {
            if clean.contains(value.as_str()) {
                clean = std::borrow::Cow::Owned(clean.replace(value.as_str(), "[redacted]"));
            }
        }
        let line = clean.as_ref();
        let chars = line.chars().count();
        let kept = if chars > STDERR_TAIL_CHARS {
            let tail: String = line.chars().skip(chars - STDERR_TAIL_CHARS).collect();
            format!("…{tail}")
        } else {
            line.to_owned()
        };
        if state.stderr.len() == STDERR_TAIL_LINES {
            state.stderr.pop_front();
        }
        state.stderr.push_back(kept);
    }

    /// The last lines the server wrote on stderr, joined by ` | `; `None` when it wrote
    /// none.
    pub(crate) fn stderr_tail(&self) -> Option<String> {
        let state = self.lock();
        (!state.stderr.is_empty())
            .then(|| state.stderr.iter().cloned().collect::<Vec<_>>().join(" | "))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The rmcp side of a pumped connection: messages go out through one channel and come in
/// through another; rmcp sees the connection end when the inbound channel closes.
#[derive(Debug)]
pub(crate) struct ChannelTransport {
    outbound: mpsc::Sender<TxJsonRpcMessage<RoleClient>>,
    inbound: mpsc::Receiver<RxJsonRpcMessage<RoleClient>>,
}

/// The pump side of a [`ChannelTransport`].
#[derive(Debug)]
pub(crate) struct PumpEnds {
    /// Messages rmcp wants sent.
    pub(crate) outbound: mpsc::Receiver<TxJsonRpcMessage<RoleClient>>,
    /// Where received messages go.
    pub(crate) inbound: mpsc::Sender<RxJsonRpcMessage<RoleClient>>,
}

/// A connected pair.
pub(crate) fn channel_transport() -> (ChannelTransport, PumpEnds) {
    let (out_tx, out_rx) = mpsc::channel(OUTBOUND_CAPACITY);
    let (in_tx, in_rx) = mpsc::channel(INBOUND_CAPACITY);
    (
        ChannelTransport { outbound: out_tx, inbound: in_rx },
        PumpEnds { outbound: out_rx, inbound: in_tx },
    )
}

/// The connection is gone.
#[derive(Debug, thiserror::Error)]
#[error("connection closed")]
pub(crate) struct ChannelClosed;

impl Transport<RoleClient> for ChannelTransport {
    type Error = ChannelClosed;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let outbound = self.outbound.clone();
        async move { outbound.send(item).await.map_err(|_| ChannelClosed) }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inbound.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inbound.close();
        Ok(())
    }
}

/// Any client transport, with a call's result kept behind the notifications before it.
///
/// rmcp handles a notification in a task it spawns, but hands a response to the waiting
/// call at once, so a call's result could overtake the progress reports and log lines the
/// server sent before it (and a gateway then drops them, since nothing may follow a
/// response). A response that follows a notification is therefore returned only after
/// yielding once, which lets the runtime run the tasks already spawned first. A call
/// without notifications costs nothing more.
#[derive(Debug)]
pub(crate) struct Ordered<T> {
    inner: T,
    /// The last message returned was a notification.
    after_notification: bool,
    /// A response held back until the runtime has run the notification tasks.
    held: Option<RxJsonRpcMessage<RoleClient>>,
    /// The `server/discover` probe sent and not yet answered.
    discover: Option<rmcp::model::RequestId>,
    /// A probe rmcp gave up on (it sent `initialize` after its 10 s wait): its answer, when
    /// a slow server sends it after all, is dropped. rmcp would take it for the answer to
    /// `initialize`, fail the handshake, and the server would be killed and started
    /// again, though it works (a cold `npx` or Docker start takes longer than 10 s).
    abandoned: Option<rmcp::model::RequestId>,
}

impl<T> Ordered<T> {
    pub(crate) fn new(inner: T) -> Self {
        Ordered { inner, after_notification: false, held: None, discover: None, abandoned: None }
    }

    /// Notes a probe sent, or given up on when `initialize` follows it unanswered.
    fn sending(&mut self, item: &TxJsonRpcMessage<RoleClient>) {
        if let JsonRpcMessage::Request(request) = item {
            match request.request.method() {
                "server/discover" => self.discover = Some(request.id.clone()),
                "initialize" => self.abandoned = self.discover.take(),
                _ => {}
            }
        }
    }

    /// Whether `message` answers a probe given up on (and is to be dropped); an answer
    /// to the probe still awaited ends the wait for it.
    fn is_late_probe_answer(&mut self, message: &RxJsonRpcMessage<RoleClient>) -> bool {
        if self.discover.is_none() && self.abandoned.is_none() {
            return false;
        }
        let id = match message {
            JsonRpcMessage::Response(response) => Some(&response.id),
            JsonRpcMessage::Error(error) => error.id.as_ref(),
            _ => None,
        };
        let Some(id) = id else { return false };
        if self.discover.as_ref() == Some(id) {
            self.discover = None;
            return false;
        }
        if self.abandoned.as_ref() == Some(id) {
            self.abandoned = None;
            tracing::debug!("a late answer to server/discover is dropped (initialize was sent)");
            return true;
        }
        false
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Ordered<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.sending(&item);
        self.inner.send(item)
    }

    /// Cancel-safe, as rmcp polls it in a `select!`: a held response stays held, and is
    /// returned only after a yield has completed.
    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        if self.held.is_none() {
            let mut message = self.inner.receive().await?;
            while self.is_late_probe_answer(&message) {
                message = self.inner.receive().await?;
            }
            let message = answer_lost_told(message);
            let notification = matches!(message, JsonRpcMessage::Notification(_));
            let follows_notification =
                std::mem::replace(&mut self.after_notification, notification);
            let response =
                matches!(message, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_));
            if !(response && follows_notification) {
                return Some(message);
            }
            self.held = Some(message);
        }
        tokio::task::yield_now().await;
        self.held.take()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// Parses one received JSON-RPC message, or says briefly why it is not one.
pub(crate) fn parse_message(bytes: &[u8]) -> Result<RxJsonRpcMessage<RoleClient>, String> {
    if let Some(message) = text_call_response(bytes).or_else(|| call_tool_response(bytes)) {
        return Ok(message);
    }
    let mut message = serde_json::from_slice(bytes).map_err(|e| {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(120)]);
        let kind = if e.is_syntax() || e.is_eof() { "not JSON" } else { "not a JSON-RPC message" };
        format!("{kind}: `{}`", text.trim_end())
    })?;
    keep_task_support(bytes, &mut message);
    Ok(message)
}

/// The member of an error's `data` that marks an error made here for an answer that is no
/// JSON-RPC response ([`unreadable_answer`]): a protocol error of the server, not its own
/// error answer.
pub(crate) const UNREADABLE_ANSWER_KEY: &str = "io.toolmux/unreadableAnswer";

/// For a line that is not a message (`why` says how) but answers a request (a JSON object
/// with an `id`, a `result` or an `error`, and no `method`): an error answer to that
/// request, saying what the server wrote, so that the request fails now instead of waiting
/// for its timeout. `None` for any other line.
pub(crate) fn unreadable_answer(line: &[u8], why: &str) -> Option<RxJsonRpcMessage<RoleClient>> {
    use rmcp::model::{ErrorCode, ErrorData, JsonRpcError, RequestId};

    let serde_json::Value::Object(object) = serde_json::from_slice(line).ok()? else {
        return None;
    };
    if object.contains_key("method") || !["result", "error"].iter().any(|k| object.contains_key(*k))
    {
        return None;
    }
    let id: RequestId = serde_json::from_value(object.get("id")?.clone()).ok()?;
    let data = serde_json::json!({ UNREADABLE_ANSWER_KEY: true });
    Some(JsonRpcMessage::Error(JsonRpcError {
        jsonrpc: Default::default(),
        id: Some(id),
        error: ErrorData::new(ErrorCode::INTERNAL_ERROR, why.to_owned(), Some(data)),
    }))
}

/// Whether `error` was made by [`unreadable_answer`].
pub(crate) fn is_unreadable_answer(error: &rmcp::model::ErrorData) -> bool {
    error.data.as_ref().and_then(|d| d.get(UNREADABLE_ANSWER_KEY))
        == Some(&serde_json::Value::Bool(true))
}

/// The member of an error's `data` that marks an error made here for a request whose
/// delivery failed ([`undelivered_answer`]) while the connection lives on: not the
/// server's answer, and no answer of the server's at all.
pub(crate) const UNDELIVERED_KEY: &str = "io.toolmux/undelivered";

/// The member of an undelivered request's error `data` that says the request may have
/// reached the server ([`Delivery::Unknown`]).
const OUTCOME_UNKNOWN_KEY: &str = "io.toolmux/outcome-unknown";

/// How far a request whose POST failed got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Not sent, or refused: the server did not run it, and it may be sent again.
    Failed,
    /// Sent, and no answer came in time: the server may have received and run it.
    Unknown,
}

/// The error answer a request `id` gets when delivering it failed (`why` says how) but
/// the connection goes on: that request fails now, the others are left alone.
pub(crate) fn undelivered_answer(
    id: rmcp::model::RequestId,
    why: String,
    delivery: Delivery,
) -> RxJsonRpcMessage<RoleClient> {
    use rmcp::model::{ErrorCode, ErrorData, JsonRpcError};

    let data = serde_json::json!({
        UNDELIVERED_KEY: true,
        OUTCOME_UNKNOWN_KEY: delivery == Delivery::Unknown,
    });
    JsonRpcMessage::Error(JsonRpcError {
        jsonrpc: Default::default(),
        id: Some(id),
        error: ErrorData::new(ErrorCode::INTERNAL_ERROR, why, Some(data)),
    })
}

/// Whether `error` was made by [`undelivered_answer`].
pub(crate) fn is_undelivered(error: &rmcp::model::ErrorData) -> bool {
    error.data.as_ref().and_then(|d| d.get(UNDELIVERED_KEY)) == Some(&serde_json::Value::Bool(true))
}

/// Whether `error` was made by [`undelivered_answer`] for a request that may have reached
/// the server ([`Delivery::Unknown`]).
pub(crate) fn is_outcome_unknown(error: &rmcp::model::ErrorData) -> bool {
    is_undelivered(error)
        && error.data.as_ref().and_then(|d| d.get(OUTCOME_UNKNOWN_KEY))
            == Some(&serde_json::Value::Bool(true))
}

/// The member of an error's `data` that marks an error made here for a request whose
/// answer the streamable HTTP transport lost after sending it ([`answer_lost_told`]): the
/// server may have run it. Not a timeout, and the connection goes on.
pub(crate) const ANSWER_LOST_KEY: &str = "io.toolmux/answerLost";

/// What rmcp's streamable HTTP client answers a request whose answer was to come on a
/// stream of a session it replaced (the server forgot the session).
const RMCP_SESSION_RENEWED: &str =
    "streamable HTTP session was re-initialized before the response arrived";
/// What rmcp answers a request whose SSE stream ended before the answer and could not be
/// resumed, marked as a closed transport (the connection is not closed).
const RMCP_STREAM_CLOSED: &str = "streamable HTTP response stream closed before its final response";
/// rmcp's marker of an error made for a closed transport.
const RMCP_TRANSPORT_CLOSED_KEY: &str = "io.modelcontextprotocol/transportClosed";

/// `message`, with the error answers rmcp's streamable HTTP client makes for a request it
/// sent and lost the answer of made [`ANSWER_LOST_KEY`] errors that say what happened.
/// rmcp's read as the server's own error (`tools/call failed: … (code -32603)`) or as the
/// connection closed, though it goes on: neither says the request may have run.
fn answer_lost_told(message: RxJsonRpcMessage<RoleClient>) -> RxJsonRpcMessage<RoleClient> {
    use rmcp::model::{ErrorCode, ErrorData, JsonRpcError};

    let JsonRpcMessage::Error(JsonRpcError { id: Some(id), error, .. }) = &message else {
        return message;
    };
    let rmcp_marked =
        error.data.as_ref().is_some_and(|d| d.get(RMCP_TRANSPORT_CLOSED_KEY).is_some());
    let why = match error.message.as_ref() {
        RMCP_SESSION_RENEWED if error.code == ErrorCode::INTERNAL_ERROR && error.data.is_none() => {
            "the server forgot the session before answering it, and a new session was started"
        }
        RMCP_STREAM_CLOSED if rmcp_marked => {
            "the server closed the answer's SSE stream before the answer, and it could not be \
             resumed (that takes event ids and a GET with Last-Event-ID)"
        }
        _ => return message,
    };
    let data = serde_json::json!({ ANSWER_LOST_KEY: true });
    JsonRpcMessage::Error(JsonRpcError {
        jsonrpc: Default::default(),
        id: Some(id.clone()),
        error: ErrorData::new(ErrorCode::INTERNAL_ERROR, why, Some(data)),
    })
}

/// Whether `error` was made by [`answer_lost_told`].
pub(crate) fn is_answer_lost(error: &rmcp::model::ErrorData) -> bool {
    error.data.as_ref().and_then(|d| d.get(ANSWER_LOST_KEY)) == Some(&serde_json::Value::Bool(true))
}

/// The tool `_meta` key under which a listed tool's `execution.taskSupport` (2025-11-25) is
/// kept: rmcp's model has no `execution`, and a tool that requires tasks must be called as
/// one (`McpProvider` does, see `client/provider/tasks.rs`).
pub(crate) const TASK_SUPPORT_META_KEY: &str = "io.toolmux/taskSupport";

/// Copies each listed tool's `execution.taskSupport` (`optional` or `required`) from a
/// `tools/list` answer into the tool's `_meta` under [`TASK_SUPPORT_META_KEY`].
fn keep_task_support(bytes: &[u8], message: &mut RxJsonRpcMessage<RoleClient>) {
    use rmcp::model::ServerResult;

    let JsonRpcMessage::Response(response) = message else { return };
    let ServerResult::ListToolsResult(list) = &mut response.result else { return };
    if !bytes.windows(11).any(|w| w == b"\"execution\"") {
        return;
    }
    let Ok(raw) = serde_json::from_slice::<serde_json::Value>(bytes) else { return };
    let Some(raw_tools) = raw.pointer("/result/tools").and_then(serde_json::Value::as_array) else {
        return;
    };
    for raw_tool in raw_tools {
        let support =
            raw_tool.pointer("/execution/taskSupport").and_then(serde_json::Value::as_str);
        let Some(support @ ("optional" | "required")) = support else { continue };
        let name = raw_tool.get("name").and_then(serde_json::Value::as_str);
        let Some(tool) = list.tools.iter_mut().find(|t| Some(t.name.as_ref()) == name) else {
            continue;
        };
        let meta = tool.meta.get_or_insert_with(Default::default);
        meta.0.insert(TASK_SUPPORT_META_KEY.to_owned(), serde_json::Value::from(support));
    }
}

/// The answer to a `tools/call`, the message of every call, parsed straight into a
/// `CallToolResult`; `None` for anything else, which takes rmcp's general path.
///
/// rmcp parses a message by buffering it and trying each message kind, then each of about
/// twenty result kinds in turn (a `CallToolResult` is the sixteenth), building an error for
/// every miss: about a sixth of the gateway's CPU time per call. Only a response whose
/// result has nothing but `CallToolResult`'s fields takes this path, so the result is what
/// rmcp's own parse would give (the tests check that).
fn call_tool_response(bytes: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
    use rmcp::model::{CallToolResult, JsonRpcVersion2_0, RequestId, ServerResult};
    use serde::Deserialize;
    use serde::de::IgnoredAny;

    /// The fields a response to a call may have, checked before parsing it for real.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Shape {
        #[serde(rename = "jsonrpc")]
        _jsonrpc: JsonRpcVersion2_0,
        #[serde(rename = "id")]
        _id: IgnoredAny,
        #[serde(rename = "result")]
        _result: ResultShape,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ResultShape {
        #[serde(rename = "content")]
        _content: Vec<IgnoredAny>,
        #[serde(rename = "structuredContent")]
        _structured: Option<IgnoredAny>,
        #[serde(rename = "isError")]
        _is_error: Option<IgnoredAny>,
        #[serde(rename = "resultType")]
        _result_type: Option<IgnoredAny>,
        #[serde(rename = "_meta")]
        _meta: Option<IgnoredAny>,
    }
    #[derive(Deserialize)]
    struct Response {
        id: RequestId,
        result: CallToolResult,
    }

    serde_json::from_slice::<Shape>(bytes).ok()?;
    let response: Response = serde_json::from_slice(bytes).ok()?;
    Some(RxJsonRpcMessage::<RoleClient>::response(
        ServerResult::CallToolResult(response.result),
        response.id,
    ))
}

/// A `tools/call` result read raw ([`lane::RawReply::Result`]) parsed as a message's
/// result would be: a `CallToolResult` when it is one, else whichever result it is.
pub(crate) fn call_result(
    result: &str,
) -> Result<rmcp::model::ServerResult, rmcp::service::ServiceError> {
    use rmcp::model::{CallToolResult, ServerResult};

    if let Ok(call) = serde_json::from_str::<CallToolResult>(result) {
        return Ok(ServerResult::CallToolResult(call));
    }
    serde_json::from_str::<ServerResult>(result).map_err(|e| {
        let text = &result[..result.floor_char_boundary(120)];
        rmcp::service::ServiceError::McpError(rmcp::model::ErrorData::internal_error(
            format!("the server's answer to tools/call is not a result ({e}): `{text}`"),
            None,
        ))
    })
}

/// Whether a `tools/call` result, as JSON text, is a success of text blocks only and
/// nothing else (no annotations, no `_meta`, no structured content): one that the gateway
/// may pass on as it came, since decoding and encoding it again would give the same
/// result (see [`toolmux_core::Relayed::Raw`]). Read without building anything (this is
/// on every relayed call's path, before its answer is written).
pub(crate) fn plain_text_result(result: &str) -> bool {
    use serde::Deserialize;
    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde_json::value::RawValue;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TextResult {
        content: AllText,
        #[serde(rename = "isError", default)]
        is_error: Option<bool>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TextBlock<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
        #[serde(borrow)]
        text: &'a RawValue,
    }
    /// Whether every block of a list is a text block, read one by one.
    struct AllText(bool);
    impl<'de> Deserialize<'de> for AllText {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<AllText, D::Error> {
            struct Blocks;
            impl<'de> Visitor<'de> for Blocks {
                type Value = AllText;

                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a list of content blocks")
                }

                fn visit_seq<A: SeqAccess<'de>>(self, mut blocks: A) -> Result<AllText, A::Error> {
                    let mut all = true;
                    while let Some(block) = blocks.next_element::<TextBlock<'de>>()? {
                        all &= block.kind == "text" && block.text.get().starts_with('"');
                    }
                    Ok(AllText(all))
                }
            }
            deserializer.deserialize_seq(Blocks)
        }
    }

    serde_json::from_str::<TextResult>(result)
        .is_ok_and(|result| result.is_error != Some(true) && result.content.0)
}

/// The commonest answer to a `tools/call`, text blocks only (no annotations, no `_meta`),
/// parsed in one pass into the `CallToolResult` rmcp's parse gives; `None` for anything
/// else, which takes [`call_tool_response`]. rmcp's content blocks are an internally
/// tagged enum, which serde parses by buffering each block first.
fn text_call_response(bytes: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
    use rmcp::model::{CallToolResult, ContentBlock, JsonRpcVersion2_0, RequestId, ServerResult};
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Response {
        #[serde(rename = "jsonrpc")]
        _jsonrpc: JsonRpcVersion2_0,
        id: RequestId,
        result: TextResult,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TextResult {
        content: Vec<TextBlock>,
        #[serde(rename = "isError", default)]
        is_error: Option<bool>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TextBlock {
        #[serde(rename = "type")]
        _kind: TextKind,
        text: String,
    }
    #[derive(Deserialize)]
    enum TextKind {
        #[serde(rename = "text")]
        Text,
    }

    // Checked as UTF-8 once, here: `from_slice` checks every string it parses on its own.
    let response: Response = serde_json::from_str(std::str::from_utf8(bytes).ok()?).ok()?;
    let content = response.result.content.into_iter().map(|b| ContentBlock::text(b.text));
    let mut result = CallToolResult::success(content.collect());
    result.is_error = response.result.is_error;
    // As sent: no `resultType`.
    result.result_type = None;
    Some(RxJsonRpcMessage::<RoleClient>::response(
        ServerResult::CallToolResult(result),
        response.id,
    ))
}

/// Serializes one outgoing message.
pub(crate) fn encode_message(message: &TxJsonRpcMessage<RoleClient>) -> Result<Vec<u8>, String> {
    serde_json::to_vec(message).map_err(|e| format!("cannot encode a message: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_say_what_was_received() {
        let err = parse_message(b"Server listening on port 3000\n").unwrap_err();
        assert_eq!(err, "not JSON: `Server listening on port 3000`");
        let err = parse_message(br#"{"hello": 1}"#).unwrap_err();
        assert_eq!(err, r#"not a JSON-RPC message: `{"hello": 1}`"#);
    }

    /// Only a success of text blocks and nothing else may pass on raw; a raw result that
    /// may not parses as the same message's result would.
    #[test]
    fn only_plain_text_results_pass_on_raw() {
        let plain = [
            r#"{"content":[{"type":"text","text":"Echo: hello"}]}"#,
            r#"{"content":[{"text":"a\nb","type":"text"},{"type":"text","text":""}],"isError":false}"#,
            r#"{"content":[]}"#,
        ];
        for result in plain {
            assert!(plain_text_result(result), "{result}");
        }
        let other = [
            r#"{"content":[{"type":"text","text":"x"}],"isError":true}"#,
            r#"{"content":[{"type":"text","text":"x","annotations":{"priority":1}}]}"#,
            r#"{"content":[{"type":"text","text":"x"}],"_meta":{"k":"v"}}"#,
            r#"{"content":[],"structuredContent":{"n":1}}"#,
            r#"{"content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}"#,
            r#"{"content":[{"type":"text","text":7}]}"#,
            r#"{"content":[{"type":"text","text":"a"},{"type":"texts","text":"b"}]}"#,
            r#"{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"content":[]}"#,
            r#"{"content":{"type":"text","text":"x"}}"#,
            r#"{"task":{"taskId":"t"}}"#,
        ];
        for result in other {
            assert!(!plain_text_result(result), "{result}");
        }
        let line =
            r#"{"jsonrpc":"2.0","id":3,"result":{"content":[],"structuredContent":{"n":1}}}"#;
        let JsonRpcMessage::Response(message) = parse_message(line.as_bytes()).unwrap() else {
            panic!("a response");
        };
        let raw = call_result(r#"{"content":[],"structuredContent":{"n":1}}"#).unwrap();
        assert_eq!(format!("{raw:?}"), format!("{:?}", message.result));
        // What no result kind reads is rmcp's custom result, as in a parsed message.
        let custom = call_result(r#"{"content": 5}"#).unwrap();
        assert!(matches!(custom, rmcp::model::ServerResult::CustomResult(_)), "{custom:?}");
    }

    /// The fast path gives exactly what rmcp's own parse gives, and declines the rest.
    #[test]
    fn call_results_parse_as_rmcp_parses_them() {
        let same = [
            r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"Echo: hello"}]}}"#,
            r#"{"jsonrpc":"2.0","id":"a","result":{"content":[],"isError":true}}"#,
            r#"{"jsonrpc":"2.0","id":8,"result":{"content":[{"type":"text","text":"x"}],"structuredContent":{"n":1},"_meta":{"k":"v"}}}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{"resultType":"complete","content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}}"#,
            r#"{"jsonrpc":"2.0","id":10,"result":{"content":[{"type":"resource","resource":{"uri":"file:///a","text":"t"}}],"isError":false}}"#,
        ];
        for line in same {
            let fast = call_tool_response(line.as_bytes()).expect("takes the fast path");
            let rmcp: RxJsonRpcMessage<RoleClient> = serde_json::from_str(line).unwrap();
            assert_eq!(format!("{fast:?}"), format!("{rmcp:?}"), "{line}");
            let parsed = parse_message(line.as_bytes()).unwrap();
            assert_eq!(format!("{parsed:?}"), format!("{rmcp:?}"), "{line}");
        }
        let other = [
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"task":{"taskId":"t"}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","content":[]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#,
            r#"{"jsonrpc":"1.0","id":1,"result":{"content":[]}}"#,
        ];
        for line in other {
            assert!(call_tool_response(line.as_bytes()).is_none(), "{line}");
            assert!(text_call_response(line.as_bytes()).is_none(), "{line}");
        }
    }

    /// Text-only results take the one-pass parse and give what rmcp's parse gives; text
    /// blocks with anything more do not take it.
    #[test]
    fn text_results_parse_as_rmcp_parses_them() {
        let text = [
            r#"{"result":{"content":[{"type":"text","text":"Echo: hello"}]},"jsonrpc":"2.0","id":"tm-5"}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":{"content":[{"text":"a\nb","type":"text"},{"type":"text","text":""}],"isError":true}}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{"content":[],"isError":false}}"#,
        ];
        for line in text {
            let fast = text_call_response(line.as_bytes()).expect("takes the text path");
            let rmcp: RxJsonRpcMessage<RoleClient> = serde_json::from_str(line).unwrap();
            assert_eq!(format!("{fast:?}"), format!("{rmcp:?}"), "{line}");
        }
        let other = [
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x","annotations":{"priority":1}}]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x","_meta":{}}]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":{}}}"#,
        ];
        for line in other {
            assert!(text_call_response(line.as_bytes()).is_none(), "{line}");
            let parsed = parse_message(line.as_bytes()).unwrap();
            let rmcp: RxJsonRpcMessage<RoleClient> = serde_json::from_str(line).unwrap();
            assert_eq!(format!("{parsed:?}"), format!("{rmcp:?}"), "{line}");
        }
    }

    /// A transport that hands out a fixed list of messages, then ends.
    struct Script(std::collections::VecDeque<RxJsonRpcMessage<RoleClient>>);

    impl Transport<RoleClient> for Script {
        type Error = ChannelClosed;

        fn send(
            &mut self,
            _item: TxJsonRpcMessage<RoleClient>,
        ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
            std::future::ready(Ok(()))
        }

        async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
            self.0.pop_front()
        }

        async fn close(&mut self) -> Result<(), Self::Error> {
            Ok(())
        }
    }

    /// A response that follows a notification is returned only after the tasks spawned
    /// for the notification (as rmcp spawns them) have run; other messages pass at once.
    #[tokio::test]
    async fn a_response_after_a_notification_waits_for_spawned_handlers() {
        let lines = [
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":{"content":[]}}"#,
        ];
        let script = lines.iter().map(|l| parse_message(l.as_bytes()).unwrap()).collect();
        let mut transport = Ordered::new(Script(script));
        let handled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        assert!(matches!(transport.receive().await, Some(JsonRpcMessage::Response(_))));
        assert!(matches!(transport.receive().await, Some(JsonRpcMessage::Notification(_))));
        // What rmcp does with a notification: handle it in a task of its own.
        let flag = handled.clone();
        tokio::spawn(async move { flag.store(true, std::sync::atomic::Ordering::SeqCst) });
        assert!(matches!(transport.receive().await, Some(JsonRpcMessage::Response(_))));
        assert!(handled.load(std::sync::atomic::Ordering::SeqCst));
        assert!(transport.receive().await.is_none());
    }

    #[test]
    fn the_last_lines_of_stderr_are_kept_short() {
        let fault = Fault::default();
        assert_eq!(fault.stderr_tail(), None);
        for i in 0..20 {
            fault.note_stderr(&format!("line {i}\n"));
        }
        fault.note_stderr("   \n");
        let long = format!("{}ModuleNotFoundError: no module named x", "y".repeat(1000));
        fault.note_stderr(&long);
        let tail = fault.stderr_tail().unwrap();
        let lines: Vec<&str> = tail.split(" | ").collect();
        assert_eq!(lines.len(), STDERR_TAIL_LINES);
        assert_eq!(lines[0], "line 13", "the oldest go first; blank lines are skipped");
        let last = lines[STDERR_TAIL_LINES - 1];
        assert!(last.starts_with('…') && last.ends_with("no module named x"), "{last}");
        assert_eq!(last.chars().count(), STDERR_TAIL_CHARS + 1);
    }

    #[test]
    fn first_fault_wins_but_exit_status_refines_closed() {
        let fault = Fault::default();
        fault.set(FaultKind::Closed("eof".into()));
        fault.refine(FaultKind::Closed("exit status: 3".into()));
        assert_eq!(fault.get(), Some(FaultKind::Closed("exit status: 3".into())));
        let fault = Fault::default();
        fault.set(FaultKind::Protocol("garbage".into()));
        fault.refine(FaultKind::Closed("exit status: 3".into()));
        assert_eq!(fault.get(), Some(FaultKind::Protocol("garbage".into())));
    }
}
