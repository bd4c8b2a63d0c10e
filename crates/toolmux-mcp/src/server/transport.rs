//! The server's newline-delimited JSON-RPC transport (stdio, or any byte stream pair):
//! rmcp's own, with a fast path for `tools/call` requests in front of it.
//!
//! rmcp parses a message by buffering it and trying each message kind, then each request
//! kind in turn, building an error for every miss; for a call that is about a tenth of the
//! gateway's CPU time. Lines that are plain `tools/call` requests are parsed here straight
//! into rmcp's `CallToolRequest`; every other line is handed, unchanged and in order, to
//! rmcp's `AsyncRwTransport`, which keeps all its behaviour for them (the line length cap,
//! a byte order mark, ignored foreign notifications, an "Invalid Request" answer to JSON
//! that is no message). Sending is rmcp's, unchanged.

use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequest, CallToolRequestMethod, ClientRequest, JsonRpcVersion2_0, RequestId,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use serde::Deserialize;
use serde::de::IgnoredAny;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::sync::mpsc;

/// Lines up to this long are looked at for the fast path; longer ones stream to rmcp as
/// they arrive (rmcp caps them), so nothing here buffers an unbounded line.
const FAST_LINE_MAX: usize = 64 * 1024;

/// rmcp's transport over `reader` and `writer`, with `tools/call` requests parsed first.
pub(super) struct LineTransport<R, W: AsyncWrite> {
    lines: Lines<R>,
    inner: AsyncRwTransport<RoleServer, Feed, W>,
}

/// The client's stream, read a line at a time.
struct Lines<R> {
    reader: BufReader<R>,
    /// The line being read; a read interrupted by rmcp's `select!` resumes into it.
    line: Vec<u8>,
    /// The rest of the current line goes to rmcp as it arrives (it was too long).
    streaming: bool,
    /// Lines for rmcp's transport; `None` once `reader` ended.
    feed: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Bytes handed to rmcp that it has not read yet: while any are left, a call request
    /// goes to rmcp too, behind them, so that messages keep their order.
    unread: Arc<AtomicUsize>,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub(super) fn new(reader: R, writer: W) -> Self {
        let (feed, lines) = mpsc::unbounded_channel();
        let unread = Arc::new(AtomicUsize::new(0));
        let fed = Feed { lines, chunk: Vec::new(), at: 0, unread: unread.clone() };
        LineTransport {
            lines: Lines {
                reader: BufReader::new(reader),
                line: Vec::new(),
                streaming: false,
                feed: Some(feed),
                unread,
            },
            inner: AsyncRwTransport::new_server(fed, writer),
        }
    }
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

    fn send_to_rmcp(&self, bytes: Vec<u8>) {
        if let Some(feed) = &self.feed {
            self.unread.fetch_add(bytes.len(), Ordering::Relaxed);
            // rmcp's transport lives as long as `self`: the receiver cannot be gone.
            let _ = feed.send(bytes);
        }
    }
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let lines = &mut self.lines;
            tokio::select! {
                // Lines already handed to rmcp come out first, so messages keep their order.
                biased;
                message = self.inner.receive() => return message,
                more = lines.read_line(), if lines.feed.is_some() => {
                    if !more {
                        // A partial last line is dropped, as rmcp does; closing the feed
                        // lets rmcp finish what it has and then see the end.
                        lines.line.clear();
                        lines.feed = None;
                        continue;
                    }
                    // rmcp reads what it was handed before `read_line` is polled, so all
                    // of it has been read unless rmcp's task ran out of its budget.
                    let rmcp_done = lines.unread.load(Ordering::Relaxed) == 0;
                    if let Some(message) = call_tool_request(&lines.line).filter(|_| rmcp_done) {
                        lines.line.clear();
                        return Some(message);
                    }
                    let line = std::mem::take(&mut lines.line);
                    lines.send_to_rmcp(line);
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.lines.feed = None;
        self.inner.close().await
    }
}

/// A `tools/call` request parsed straight into rmcp's types; `None` for anything else.
/// The request is what rmcp's own parse would give (the tests check that).
fn call_tool_request(line: &[u8]) -> Option<RxJsonRpcMessage<RoleServer>> {
    /// The fields of a call request, checked before parsing it for real.
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Shape {
        #[serde(rename = "jsonrpc")]
        _jsonrpc: JsonRpcVersion2_0,
        id: RequestId,
        #[serde(rename = "method")]
        _method: CallToolRequestMethod,
        #[serde(rename = "params")]
        _params: IgnoredAny,
    }
    let shape: Shape = serde_json::from_slice(line).ok()?;
    // `Request`'s own parse reads `method` and `params` and ignores the rest.
    let request: CallToolRequest = serde_json::from_slice(line).ok()?;
    Some(RxJsonRpcMessage::<RoleServer>::request(ClientRequest::CallToolRequest(request), shape.id))
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
    use tokio::io::AsyncWriteExt;

    /// The fast path gives exactly what rmcp's own parse gives, and declines the rest.
    #[test]
    fn call_requests_parse_as_rmcp_parses_them() {
        let same = [
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hello"}}}"#,
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"e","arguments":{},"_meta":{"progressToken":5}}}"#,
            r#"{"method":"tools/call","params":{"name":"e"},"id":4,"jsonrpc":"2.0"}"#,
        ];
        for line in same {
            let fast = call_tool_request(line.as_bytes()).expect("takes the fast path");
            let rmcp: RxJsonRpcMessage<RoleServer> = serde_json::from_str(line).unwrap();
            assert_eq!(format!("{fast:?}"), format!("{rmcp:?}"), "{line}");
        }
        let other = [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"e"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e"},"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{}}}"#,
        ];
        for line in other {
            assert!(call_tool_request(line.as_bytes()).is_none(), "{line}");
        }
    }

    /// Every message arrives, in order, whichever path it takes, and lines over the fast
    /// path's limit still reach rmcp whole; garbage is skipped as rmcp skips it.
    #[tokio::test]
    async fn messages_keep_their_order_across_both_paths() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let (reader, writer) = tokio::io::split(server);
        let mut transport = LineTransport::new(reader, writer);
        let long = "x".repeat(FAST_LINE_MAX * 2);
        let input = format!(
            concat!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"ping"}}"#,
                "\n",
                r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"a"}}}}"#,
                "\n",
                "not json\n",
                r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"b","arguments":{{"s":"{}"}}}}}}"#,
                "\r\n",
                r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"c"}}}}"#,
                "\n",
                r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#,
                "\n",
                r#"{{"jsonrpc":"2.0","id":5,"method":"tools/call""#,
            ),
            long
        );
        client.write_all(input.as_bytes()).await.unwrap();
        client.shutdown().await.unwrap();
        let mut seen = Vec::new();
        while let Some(message) = transport.receive().await {
            let text = serde_json::to_string(&message).unwrap();
            let id = serde_json::from_str::<serde_json::Value>(&text).unwrap()["id"].clone();
            seen.push(id.to_string());
        }
        assert_eq!(seen, ["1", "2", "3", "4", "null"]);
    }
}
