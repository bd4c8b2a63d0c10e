//! A session over newline-delimited JSON-RPC (stdio, or any byte stream pair): rmcp's
//! session, with `tools/call` taken on a direct path beside it.
//!
//! Through rmcp a call crosses its service loop: the loop parses the message, spawns a
//! task for the handler, and hands the response back through a channel to be written by
//! yet another task; with rmcp's client doing the same towards an upstream, that was a
//! third of the gateway's time per call. Here the client's stream is read by this session
//! itself. Once the handshake is done, a line that is a plain `tools/call` (`name`,
//! `arguments` and at most a `progressToken`) is parsed once, run in a task of its own and
//! answered straight onto the output, its progress reports and log lines before it. Every
//! other line goes, unchanged and in order, to rmcp's `AsyncRwTransport`, which keeps all
//! its behaviour for it (the handshake, every other method, responses to the server's own
//! requests, the line length cap, a byte order mark, ignored foreign notifications, an
//! "Invalid Request" answer to JSON that is no message). Both write whole lines to one
//! outbox, written out by one task.

use super::handler::{CallSinks, Gateway};
use rmcp::model::{
    CallToolRequestMethod, ErrorData, JsonObject, JsonRpcVersion2_0, ProgressToken, RequestId,
    ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::{QuitReason, ServerInitializeError};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{Peer, RoleServer, ServiceExt};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Lines up to this long are looked at for the direct path; longer ones stream to rmcp as
/// they arrive (rmcp caps them), so nothing here buffers an unbounded line.
const FAST_LINE_MAX: usize = 64 * 1024;
/// How long the output may take to drain once the session ends.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Whole lines on their way to the client.
type Outbox = mpsc::UnboundedSender<Vec<u8>>;

/// Why the session failed.
pub(super) type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Serves `gateway` over `reader` and `writer` until `reader` ends.
pub(super) async fn run<R, W>(gateway: Gateway, reader: R, writer: W) -> Result<(), Failure>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (outbox, lines_out) = mpsc::unbounded_channel();
    let writing = tokio::spawn(write_out(writer, lines_out));
    let (feed, lines_in) = mpsc::unbounded_channel();
    let unread = Arc::new(AtomicUsize::new(0));
    let fed = Feed { lines: lines_in, chunk: Vec::new(), at: 0, unread: unread.clone() };
    let transport = AsyncRwTransport::new_server(
        fed,
        OutboxWriter { outbox: outbox.clone(), partial: Vec::new() },
    );
    let peer: Arc<OnceLock<Peer<RoleServer>>> = Arc::default();
    let mut rmcp = tokio::spawn(serve_rmcp(gateway.clone(), transport, peer.clone()));

    let mut session = Session {
        lines: Lines {
            reader: BufReader::new(reader),
            line: Vec::new(),
            streaming: false,
            feed: Some(feed),
            unread,
        },
        gateway,
        peer,
        outbox,
        calls: Arc::default(),
        ended: CancellationToken::new(),
    };
    let served = loop {
        tokio::select! {
            served = &mut rmcp => break served,
            more = session.lines.read_line(), if session.lines.feed.is_some() => {
                if !more {
                    // A partial last line is dropped, as rmcp does; closing the feed
                    // lets rmcp finish what it has and then see the end.
                    session.lines.line.clear();
                    session.lines.feed = None;
                    session.ended.cancel();
                    continue;
                }
                session.take_line();
            }
        }
    };
    // The client is gone or rmcp ended the session: calls still running are cancelled.
    session.ended.cancel();
    drop(session);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, writing).await;
    served.unwrap_or_else(|e| Err(Box::new(e)))
}

/// rmcp's session: the handshake, then every message not taken by the direct path.
async fn serve_rmcp(
    gateway: Gateway,
    transport: AsyncRwTransport<RoleServer, Feed, OutboxWriter>,
    peer: Arc<OnceLock<Peer<RoleServer>>>,
) -> Result<(), Failure> {
    let running = match gateway.serve(transport).await {
        Ok(running) => running,
        // The client left without an `initialize`: a stateless 2026-07-28 client is done,
        // or the client gave up before starting. Either way the stream ended cleanly.
        Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    // Only sessions of the handshake revisions take the direct path: a stateless request
    // carries its revision, capabilities and log level in its own `_meta`.
    if running.peer().peer_info().is_some() {
        let _ = peer.set(running.peer().clone());
    }
    match running.waiting().await {
        Ok(QuitReason::JoinError(error)) => Err(error.into()),
        Err(error) => Err(error.into()),
        Ok(_) => Ok(()),
    }
}

/// The reading side of a session.
struct Session<R> {
    lines: Lines<R>,
    gateway: Gateway,
    /// Set once the handshake is done: from then on calls take the direct path.
    peer: Arc<OnceLock<Peer<RoleServer>>>,
    outbox: Outbox,
    /// Calls running on the direct path, to cancel by the client's request id.
    calls: Arc<Mutex<HashMap<RequestId, CancellationToken>>>,
    /// Cancelled when the session ends.
    ended: CancellationToken,
}

impl<R> Session<R> {
    /// Routes the complete line in `self.lines.line`: a call to the direct path, anything
    /// else to rmcp.
    fn take_line(&mut self) {
        let lines = &mut self.lines;
        // rmcp reads what it was handed before the next line is read, so all of it has
        // been read unless rmcp's task ran out of its budget; until then a call goes to
        // rmcp too, behind the rest, so that messages keep their order.
        let in_order = lines.unread.load(Ordering::Relaxed) == 0;
        if let Some(peer) = self.peer.get().filter(|_| in_order)
            && let Some(call) = CallLine::parse(&lines.line)
        {
            lines.line.clear();
            self.start(peer.clone(), call);
            return;
        }
        if let Some(id) = cancelled_request(&lines.line) {
            let token = self.calls.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            if let Some(token) = token {
                token.cancel();
            }
        }
        let line = std::mem::take(&mut lines.line);
        lines.send_to_rmcp(line);
    }

    /// Runs a call on the direct path.
    fn start(&self, peer: Peer<RoleServer>, call: CallLine) {
        let cancel = self.ended.child_token();
        let calls = self.calls.clone();
        calls.lock().unwrap_or_else(|e| e.into_inner()).insert(call.id.clone(), cancel.clone());
        let gateway = self.gateway.clone();
        let outbox = self.outbox.clone();
        tokio::spawn(async move {
            let CallLine { id, params, .. } = call;
            let notify = {
                let outbox = outbox.clone();
                move |notification: ServerNotification| {
                    let message = ServerJsonRpcMessage::notification(notification);
                    if let Some(line) = encode(&message) {
                        let _ = outbox.send(line);
                    }
                }
            };
            let sinks = CallSinks {
                progress: params.meta.and_then(|m| m.progress_token),
                notify: Arc::new(notify),
            };
            let arguments = params.arguments.unwrap_or_default();
            let call =
                gateway.call_direct(&params.name, arguments, &id, cancel.clone(), peer, sinks);
            let result = call.await;
            let cancelled = cancel.is_cancelled();
            calls.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            // A call the client cancelled gets no response (MCP: the receiver of a
            // cancellation should not answer the request).
            if cancelled {
                return;
            }
            let line = match result {
                Ok(result) => encode(&Response { jsonrpc: JsonRpcVersion2_0, id: &id, result }),
                Err(error) => encode(&ErrorResponse { jsonrpc: JsonRpcVersion2_0, id: &id, error }),
            };
            if let Some(line) = line {
                let _ = outbox.send(line);
            }
        });
    }
}

/// One message as a line.
fn encode(message: &impl Serialize) -> Option<Vec<u8>> {
    match serde_json::to_vec(message) {
        Ok(mut line) => {
            line.push(b'\n');
            Some(line)
        }
        Err(e) => {
            tracing::warn!("cannot encode a message: {e}");
            None
        }
    }
}

#[derive(Serialize)]
struct Response<'a> {
    jsonrpc: JsonRpcVersion2_0,
    id: &'a RequestId,
    result: rmcp::model::CallToolResult,
}

#[derive(Serialize)]
struct ErrorResponse<'a> {
    jsonrpc: JsonRpcVersion2_0,
    id: &'a RequestId,
    error: ErrorData,
}

/// A plain `tools/call` request, parsed in one pass: anything more than a name,
/// arguments and a progress token (a 2026-07-28 request's `_meta`, `requestState`,
/// `inputResponses`, a task) is left to rmcp.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallLine {
    #[serde(rename = "jsonrpc")]
    _jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    #[serde(rename = "method")]
    _method: CallToolRequestMethod,
    params: CallParams,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallParams {
    name: String,
    #[serde(default)]
    arguments: Option<JsonObject>,
    #[serde(rename = "_meta", default)]
    meta: Option<CallMeta>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallMeta {
    #[serde(rename = "progressToken", default)]
    progress_token: Option<ProgressToken>,
}

impl CallLine {
    fn parse(line: &[u8]) -> Option<CallLine> {
        serde_json::from_slice(line).ok()
    }
}

/// The request a `notifications/cancelled` line cancels.
fn cancelled_request(line: &[u8]) -> Option<RequestId> {
    #[derive(Deserialize)]
    struct Cancelled {
        method: String,
        params: CancelledParams,
    }
    #[derive(Deserialize)]
    struct CancelledParams {
        #[serde(rename = "requestId")]
        request_id: RequestId,
    }
    const METHOD: &[u8] = b"notifications/cancelled";
    if !line.windows(METHOD.len()).any(|w| w == METHOD) {
        return None;
    }
    let cancelled: Cancelled = serde_json::from_slice(line).ok()?;
    (cancelled.method == "notifications/cancelled").then_some(cancelled.params.request_id)
}

/// Writes the outbox's lines to the client, several at once when they queue up.
async fn write_out<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut lines: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let mut batch = Vec::new();
    while let Some(mut line) = lines.recv().await {
        if let Ok(next) = lines.try_recv() {
            batch.clear();
            batch.append(&mut line);
            batch.extend_from_slice(&next);
            while let Ok(next) = lines.try_recv() {
                batch.extend_from_slice(&next);
            }
            line = std::mem::take(&mut batch);
        }
        if let Err(e) = writer.write_all(&line).await {
            tracing::debug!(error = %e, "cannot write to the client");
            return;
        }
        if let Err(e) = writer.flush().await {
            tracing::debug!(error = %e, "cannot write to the client");
            return;
        }
        if batch.capacity() == 0 {
            batch = line;
        }
    }
}

/// The writing half of rmcp's transport: whole lines into the outbox.
struct OutboxWriter {
    outbox: Outbox,
    /// The part of a line written so far.
    partial: Vec<u8>,
}

impl AsyncWrite for OutboxWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let mut rest = buf;
        while let Some(at) = rest.iter().position(|&b| b == b'\n') {
            let mut line = std::mem::take(&mut this.partial);
            line.extend_from_slice(&rest[..=at]);
            if this.outbox.send(line).is_err() {
                return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
            }
            rest = &rest[at + 1..];
        }
        this.partial.extend_from_slice(rest);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The client's stream, read a line at a time.
struct Lines<R> {
    reader: BufReader<R>,
    /// The line being read; a read interrupted by the session's `select!` resumes into it.
    line: Vec<u8>,
    /// The rest of the current line goes to rmcp as it arrives (it was too long).
    streaming: bool,
    /// Lines for rmcp's transport; `None` once `reader` ended.
    feed: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Bytes handed to rmcp that it has not read yet.
    unread: Arc<AtomicUsize>,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    /// Reads until a whole short line is in `self.line` (`true`) or `reader` ends
    /// (`false`); long lines and their tails go to rmcp on the way. Cancel-safe: no await
    /// lies between taking bytes from the reader and storing them.
    async fn read_line(&mut self) -> bool {
        loop {
            let (taken, complete) = {
                let available = match self.reader.fill_buf().await {
                    Ok(available) if !available.is_empty() => available,
                    Ok(_) => return false,
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot read the client's stream");
                        return false;
                    }
                };
                let newline = available.iter().position(|&b| b == b'\n');
                let take = newline.map_or(available.len(), |at| at + 1);
                if self.streaming || self.line.len() + take > FAST_LINE_MAX {
                    let mut chunk = std::mem::take(&mut self.line);
                    chunk.extend_from_slice(&available[..take]);
                    self.send_to_rmcp(chunk);
                    self.streaming = newline.is_none();
                    (take, false)
                } else {
                    self.line.extend_from_slice(&available[..take]);
                    (take, newline.is_some())
                }
            };
            self.reader.consume(taken);
            if complete {
                return true;
            }
        }
    }
}

impl<R> Lines<R> {
    fn send_to_rmcp(&self, bytes: Vec<u8>) {
        if let Some(feed) = &self.feed {
            self.unread.fetch_add(bytes.len(), Ordering::Relaxed);
            // rmcp's transport outlives the session's reading: the receiver is there.
            let _ = feed.send(bytes);
        }
    }
}

/// The reading half of rmcp's transport: the lines handed to it, as a byte stream that
/// ends when the feed is closed.
pub(super) struct Feed {
    lines: mpsc::UnboundedReceiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
    unread: Arc<AtomicUsize>,
}

impl AsyncRead for Feed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        while this.at == this.chunk.len() {
            match ready!(this.lines.poll_recv(cx)) {
                Some(chunk) => {
                    this.chunk = chunk;
                    this.at = 0;
                }
                // The feed is closed: end of stream.
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = buf.remaining().min(this.chunk.len() - this.at);
        buf.put_slice(&this.chunk[this.at..this.at + n]);
        this.at += n;
        this.unread.fetch_sub(n, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain calls take the direct path; anything rmcp must see (other methods,
    /// notifications, 2026-07-28 `_meta`, multi-round-trip fields) does not.
    #[test]
    fn only_plain_calls_take_the_direct_path() {
        let direct = [
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hello"}}}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"e","arguments":{},"_meta":{"progressToken":5}}}"#,
            r#"{"method":"tools/call","params":{"name":"e"},"id":4,"jsonrpc":"2.0"}"#,
        ];
        for line in direct {
            let call = CallLine::parse(line.as_bytes()).expect("takes the direct path");
            let rmcp: rmcp::model::ClientJsonRpcMessage = serde_json::from_str(line).unwrap();
            let text = format!("{rmcp:?}");
            assert!(text.contains(&format!("{:?}", call.params.name)), "{line}");
        }
        let call = CallLine::parse(direct[1].as_bytes()).unwrap();
        assert_eq!(call.id, RequestId::String("x".into()));
        let token = call.params.meta.and_then(|m| m.progress_token).unwrap();
        assert_eq!(token, ProgressToken(rmcp::model::NumberOrString::Number(5)));
        let other = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"e"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","requestState":"s"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"e"}}"#,
        ];
        for line in other {
            assert!(CallLine::parse(line.as_bytes()).is_none(), "{line}");
        }
    }

    #[test]
    fn cancellations_name_their_request() {
        let line = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}"#;
        assert_eq!(cancelled_request(line), Some(RequestId::Number(7)));
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"notifications/cancelled"}}"#;
        assert_eq!(cancelled_request(line), None);
    }
}
