//! A session over newline-delimited JSON-RPC (stdio, or any byte stream pair): rmcp's
//! session, with `tools/call` taken on a direct path beside it.
//!
//! Through rmcp a call crosses its service loop: the loop parses the message, spawns a
//! task for the handler, and hands the response back through a channel to be written by
//! yet another task; with rmcp's client doing the same towards an upstream, that was a
//! third of the gateway's time per call. Here the client's stream is read by this session
//! itself. Once the handshake is done, a line that is a plain `tools/call` (`name`,
//! `arguments` and at most a `progressToken` and trace context) is read once, its arguments
//! left as text for the provider's relay (`ToolProvider::relay`), run in a task of its own
//! and answered straight onto the output, its progress reports and log lines before it; a
//! plain result the provider relays is answered by the reader of the server's output the
//! moment it is read (`Answering`, `toolmux_core::EarlyAnswer`). Every
//! other line goes, unchanged and in order, to rmcp's `AsyncRwTransport`, which keeps all
//! its behaviour for it (the handshake, every other method, responses to the server's own
//! requests, the line length cap, a byte order mark, ignored foreign notifications, an
//! "Invalid Request" answer to JSON that is no message). Both write whole lines to one
//! outbox, written out by one task.

use super::handler::{Answer, CallSinks, Gateway};
use rmcp::model::{
    CallToolRequestMethod, ErrorData, JsonObject, JsonRpcVersion2_0, ProgressToken, RequestId,
    ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::{QuitReason, ServerInitializeError};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{Peer, RoleServer, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolmux_core::{EarlyAnswer, TraceParent};

/// Lines up to this long are looked at for the direct path; longer ones stream to rmcp as
/// they arrive (rmcp caps them), so nothing here buffers an unbounded line.
const FAST_LINE_MAX: usize = 64 * 1024;
/// How long the output may take to drain once the session ends.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the session failed.
pub(super) type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Serves `gateway` over `reader` and `writer` until `reader` ends; every read and write
/// goes through the runtime.
pub(super) async fn run<R, W>(gateway: Gateway, reader: R, writer: W) -> Result<(), Failure>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (outbox, lines_out) = mpsc::unbounded_channel();
    let writing = tokio::spawn(write_out(writer, lines_out));
    let (mut router, mut rmcp) = Router::start(gateway, Output::Queue(outbox), None);
    let mut lines = Lines { reader: BufReader::new(reader), framer: Framer::default() };
    let ended = router.ended.clone();
    let first = loop {
        tokio::select! {
            served = &mut rmcp => break Some(served),
            more = lines.read_line(&router) => match more {
                Some(line) => router.route(line),
                None => break None,
            }
        }
    };
    let served = match first {
        Some(served) => served,
        None => end_of_input(router, &mut rmcp, None).await,
    };
    // The client is gone or rmcp ended the session: calls still running are cancelled.
    ended.cancel();
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, writing).await;
    served.unwrap_or_else(|e| Err(Box::new(e)))
}

/// Serves `gateway` reading `input` on a thread of its own and writing `output` from the
/// thread that has the line: a call is started on the thread that read its request, and
/// finished, and answered, on the thread that read its upstream's response (see
/// [`crate::inline`]). Serving ends when `input` ends or rmcp ends the session; a reader
/// blocked on an `input` that never ends is left to the process's exit.
pub(super) async fn run_threaded(
    gateway: Gateway,
    input: std::fs::File,
    output: FdOutput,
) -> Result<(), Failure> {
    let out = Arc::new(FdOut::new(output)?);
    let writing = out.clone().writer();
    let runtime = tokio::runtime::Handle::current();
    let (router, mut rmcp) = Router::start(gateway, Output::Fd(out.clone()), Some(runtime.clone()));
    let ended = router.ended.clone();
    let (done, read_all) = tokio::sync::oneshot::channel::<Router>();
    // A second handle on the input, to end the reader's `read` when serving ends first.
    let unblock = input.try_clone().ok();
    std::thread::Builder::new()
        .name("toolmux-stdin".into())
        .spawn(move || read_input(input, router, &runtime, done))?;
    let gone = out.gone.clone();
    let served = tokio::select! {
        served = &mut rmcp => served,
        // The input ended: the calls in flight finish first (see `end_of_input`).
        read = read_all => match read {
            Ok(router) => end_of_input(router, &mut rmcp, Some(&gone)).await,
            // The reader thread is gone without its router, and with it the feed.
            Err(_) => rmcp.await,
        },
        // Nothing can be written to the client any more: it went away, as at end of input.
        () = gone.cancelled() => {
            rmcp.abort();
            Ok(Ok(()))
        }
    };
    ended.cancel();
    // On a socket, the reader thread's `read` returns end of input now; a pipe or a
    // terminal has no such call, and its reader ends when the client closes its end.
    if let Some(input) = unblock {
        let _ = rustix::net::shutdown(&input, rustix::net::Shutdown::Read);
    }
    out.close();
    if let Some(writing) = writing {
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, writing).await;
    }
    served.unwrap_or_else(|e| Err(Box::new(e)))
}

/// The reader thread of [`run_threaded`].
fn read_input(
    input: std::fs::File,
    mut router: Router,
    runtime: &tokio::runtime::Handle,
    done: tokio::sync::oneshot::Sender<Router>,
) {
    use std::io::BufRead;
    let _context = runtime.enter();
    crate::inline::adopt_thread();
    let mut reader = std::io::BufReader::with_capacity(READ_BUFFER, input);
    let mut framer = Framer::default();
    loop {
        let (taken, line) = {
            let available = match reader.fill_buf() {
                Ok(available) if !available.is_empty() => available,
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // One socket for both directions shares the output's non-blocking
                    // mode: wait for input here instead.
                    let mut wait = [rustix::event::PollFd::new(
                        reader.get_ref(),
                        rustix::event::PollFlags::IN,
                    )];
                    let _ = rustix::event::poll(&mut wait, None);
                    continue;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the client's stream");
                    break;
                }
            };
            framer.take(available, &router)
        };
        reader.consume(taken);
        if let Some(line) = line {
            router.route(line);
            crate::inline::run_ready();
        }
    }
    if let Some(line) = framer.finish(&router) {
        router.route(line);
        crate::inline::run_ready();
    }
    crate::inline::run_ready();
    // Serving goes on until the calls in flight are answered: the session ends there.
    let _ = done.send(router);
}

/// At the end of the client's input: lets the requests in flight on either path finish
/// and be answered, for at most the session's grace
/// ([`super::ServeOptions::end_of_input_grace`]) or until the client's output is `gone`,
/// then ends the session (cancelling what still runs) and waits for rmcp to finish.
/// rmcp's feed stays open until then: closed, rmcp gives its calls 5 s and cancels them.
async fn end_of_input(
    mut router: Router,
    rmcp: &mut Rmcp,
    gone: Option<&CancellationToken>,
) -> Result<Result<(), Failure>, tokio::task::JoinError> {
    let grace = router.gateway.end_of_input_grace();
    let busy = router.busy.clone();
    let gone = async {
        match gone {
            Some(gone) => gone.cancelled().await,
            None => std::future::pending().await,
        }
    };
    let settled = tokio::select! {
        served = &mut *rmcp => Some(served),
        finished = tokio::time::timeout(grace, busy.idle()) => {
            if finished.is_err() {
                tracing::debug!(?grace, "calls still running at the end of the input are cancelled");
            }
            None
        }
        () = gone => None,
    };
    router.end();
    drop(router);
    match settled {
        Some(served) => served,
        None => rmcp.await,
    }
}

/// Where the session's whole lines go.
#[derive(Clone)]
enum Output {
    /// To a writer task.
    Queue(mpsc::UnboundedSender<Vec<u8>>),
    /// Written by whoever has the line, queued only when the pipe is full.
    Fd(Arc<FdOut>),
}

impl Output {
    /// Sends one line; `false` once the client's stream is gone.
    fn send(&self, line: Vec<u8>) -> bool {
        match self {
            Output::Queue(outbox) => outbox.send(line).is_ok(),
            Output::Fd(out) => out.send(&line),
        }
    }
}

/// What the session writes to.
pub(super) enum FdOutput {
    /// A non-blocking pipe, watched by the runtime when it is full.
    Pipe(std::os::fd::OwnedFd),
    /// A non-blocking Unix socket, the same.
    Socket(std::os::fd::OwnedFd),
    /// Anything else (a terminal, a file): written with blocking writes.
    Blocking(std::fs::File),
}

/// The client's stream, written by the thread that has a line: straight to the pipe when
/// nothing is queued and it has room, else queued behind what is, for the writer task.
struct FdOut {
    io: FdIo,
    state: Mutex<OutState>,
    /// Wakes the writer task: something was queued, or the session is closing.
    more: tokio::sync::Notify,
    /// Cancelled when the client's stream breaks: lines are dropped from then on, and the
    /// session ends, as nothing more can reach the client.
    gone: CancellationToken,
}

enum FdIo {
    Pipe(tokio::net::unix::pipe::Sender),
    Socket(tokio::net::UnixStream),
    Blocking(std::fs::File),
}

impl FdIo {
    /// One non-blocking write.
    fn try_write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            FdIo::Pipe(pipe) => pipe.try_write(bytes),
            FdIo::Socket(socket) => socket.try_write(bytes),
            FdIo::Blocking(file) => std::io::Write::write(&mut &*file, bytes),
        }
    }

    /// Waits until a write may succeed.
    async fn writable(&self) -> std::io::Result<()> {
        match self {
            FdIo::Pipe(pipe) => pipe.writable().await,
            FdIo::Socket(socket) => socket.writable().await,
            FdIo::Blocking(_) => Ok(()),
        }
    }
}

#[derive(Default)]
struct OutState {
    /// Bytes waiting for the pipe to take them, in order.
    queued: Vec<u8>,
    /// The writer task holds bytes taken from `queued`: new lines queue behind them.
    busy: bool,
    /// The session ended: the writer task drains `queued` and stops.
    closing: bool,
}

impl FdOut {
    fn new(output: FdOutput) -> std::io::Result<FdOut> {
        let io = match output {
            FdOutput::Pipe(fd) => {
                FdIo::Pipe(tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(fd)?)
            }
            FdOutput::Socket(fd) => FdIo::Socket(tokio::net::UnixStream::from_std(fd.into())?),
            FdOutput::Blocking(file) => FdIo::Blocking(file),
        };
        Ok(FdOut {
            io,
            state: Mutex::default(),
            more: tokio::sync::Notify::new(),
            gone: CancellationToken::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OutState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, line: &[u8]) -> bool {
        let mut state = self.lock();
        if self.gone.is_cancelled() {
            return false;
        }
        if state.busy || !state.queued.is_empty() {
            state.queued.extend_from_slice(line);
            drop(state);
            self.more.notify_one();
            return true;
        }
        if let FdIo::Blocking(file) = &self.io {
            if let Err(e) = std::io::Write::write_all(&mut &*file, line) {
                tracing::debug!(error = %e, "cannot write to the client");
                self.gone.cancel();
            }
            return !self.gone.is_cancelled();
        }
        let mut at = 0;
        while at < line.len() {
            match self.io.try_write(&line[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // The pipe is full: the writer task waits for room.
                    state.queued.extend_from_slice(&line[at..]);
                    drop(state);
                    self.more.notify_one();
                    return true;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot write to the client");
                    self.gone.cancel();
                    break;
                }
            }
        }
        !self.gone.is_cancelled()
    }

    /// Lets the writer task drain what is queued, then stop.
    fn close(&self) {
        self.lock().closing = true;
        self.more.notify_one();
    }

    /// The task writing what the pipe could not take at once; `None` for blocking output.
    fn writer(self: Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        (!matches!(self.io, FdIo::Blocking(_))).then(|| tokio::spawn(self.write_queued()))
    }

    async fn write_queued(self: Arc<Self>) {
        loop {
            let chunk = {
                let mut state = self.lock();
                state.busy = false;
                if self.gone.is_cancelled() || (state.queued.is_empty() && state.closing) {
                    return;
                }
                if state.queued.is_empty() {
                    None
                } else {
                    state.busy = true;
                    Some(std::mem::take(&mut state.queued))
                }
            };
            let Some(chunk) = chunk else {
                self.more.notified().await;
                continue;
            };
            let mut at = 0;
            while at < chunk.len() {
                let written = match self.io.writable().await {
                    Ok(()) => self.io.try_write(&chunk[at..]),
                    Err(e) => Err(e),
                };
                match written {
                    Ok(n) => at += n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                        ) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot write to the client");
                        self.gone.cancel();
                        return;
                    }
                }
            }
        }
    }
}

/// Stdin reads of the threaded session, at most.
const READ_BUFFER: usize = 64 * 1024;

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
    // carries its revision, capabilities and log level in its own `_meta`. A client that
    // takes MCP tasks does not either: its calls may become tasks, which the handler makes.
    if running.peer().peer_info().is_some_and(|info| !info.capabilities.supports_tasks()) {
        let _ = peer.set(running.peer().clone());
    }
    match running.waiting().await {
        Ok(QuitReason::JoinError(error)) => Err(error.into()),
        Err(error) => Err(error.into()),
        Ok(_) => Ok(()),
    }
}

/// rmcp's session, spawned.
type Rmcp = tokio::task::JoinHandle<Result<(), Failure>>;

/// Takes the client's lines, from whoever reads them: calls to the direct path, anything
/// else to rmcp.
struct Router {
    /// Shared by the calls (one count to take, rather than one per part of the session).
    gateway: Arc<Gateway>,
    /// Set once the handshake is done: from then on calls take the direct path.
    peer: Arc<OnceLock<Peer<RoleServer>>>,
    out: Output,
    notify: Notify,
    /// Calls running on the direct path, to cancel by the client's request id.
    calls: Calls,
    /// Set once the client opened its lifecycle (an `initialize`, or a request with the
    /// stateless revision's `_meta`); until then other requests are refused here, saying
    /// to send `initialize` first (see [`opening`]).
    opened: bool,
    /// Numbers the calls (see [`Calls`]).
    serial: AtomicU64,
    /// Cancelled when the session ends.
    ended: CancellationToken,
    /// Lines for rmcp's transport; `None` once the client's stream ended.
    feed: Option<mpsc::UnboundedSender<Vec<u8>>>,
    /// Bytes handed to rmcp that it has not read yet.
    unread: Arc<AtomicUsize>,
    /// On a reader thread: calls run there (see [`crate::inline`]), with this runtime.
    inline: Option<tokio::runtime::Handle>,
    /// The requests not answered yet, on either path (see [`end_of_input`]).
    busy: Arc<Busy>,
}

/// The requests of a session not answered yet: the direct path's calls running, and the
/// ids of the requests handed to rmcp that it has not answered (nor the client cancelled).
#[derive(Default)]
struct Busy {
    running: AtomicUsize,
    asked: Mutex<foldhash::HashSet<String>>,
    idle: tokio::sync::Notify,
}

impl Busy {
    /// Counts a call on the direct path until the returned guard is dropped.
    fn enter(self: &Arc<Self>) -> Working {
        self.running.fetch_add(1, Ordering::SeqCst);
        Working(self.clone())
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, foldhash::HashSet<String>> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The request `line` handed to rmcp, to be answered.
    fn ask(&self, line: &[u8]) {
        if let Some(id) = message_id(line, true) {
            self.ask_id(id);
        }
    }

    /// The request with the (JSON) id `id` handed to rmcp, to be answered.
    fn ask_id(&self, id: String) {
        self.asked().insert(id);
    }

    /// The request with the (JSON) id `id` is answered, or no answer is wanted.
    fn answered(&self, id: &str) {
        let mut asked = self.asked();
        if asked.remove(id) && asked.is_empty() {
            drop(asked);
            self.idle.notify_waiters();
        }
    }

    /// Returns once every request is answered.
    async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the counts are read, so a drop to none in between wakes it.
            notified.as_mut().enable();
            if self.running.load(Ordering::SeqCst) == 0 && self.asked().is_empty() {
                return;
            }
            notified.await;
        }
    }
}

/// A call on the direct path running, until dropped.
struct Working(Arc<Busy>);

impl Drop for Working {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// The id of the message `line` as JSON text, when it has a string or integer one and is
/// a request (`request`: it has a `method`) or a response (it has none).
fn message_id(line: &[u8], request: bool) -> Option<String> {
    #[derive(Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        method: Option<serde::de::IgnoredAny>,
    }
    let peek: Peek<'_> = serde_json::from_slice(line).ok()?;
    if peek.method.is_some() != request {
        return None;
    }
    let id: serde_json::Value = serde_json::from_str(peek.id?.get()).ok()?;
    (id.is_string() || id.is_i64() || id.is_u64()).then(|| id.to_string())
}

impl Router {
    /// A router and rmcp's session behind it.
    fn start(
        gateway: Gateway,
        out: Output,
        inline: Option<tokio::runtime::Handle>,
    ) -> (Router, Rmcp) {
        let (feed, lines_in) = mpsc::unbounded_channel();
        let busy = Arc::new(Busy::default());
        let unread = Arc::new(AtomicUsize::new(0));
        let fed = Feed { lines: lines_in, chunk: Vec::new(), at: 0, unread: unread.clone() };
        let transport = AsyncRwTransport::new_server(
            fed,
            OutboxWriter { out: out.clone(), partial: Vec::new(), busy: busy.clone() },
        );
        let peer: Arc<OnceLock<Peer<RoleServer>>> = Arc::default();
        let rmcp = tokio::spawn(serve_rmcp(gateway.clone(), transport, peer.clone()));
        let calls = Calls::default();
        // The handler's: the session's end cancels the calls on rmcp's path too, at once
        // rather than after rmcp's drain.
        let ended = gateway.closed().clone();
        tokio::spawn(cancel_at_end(calls.clone(), ended.clone()));
        let router = Router {
            gateway: Arc::new(gateway),
            peer,
            notify: notifier(&out),
            out,
            calls,
            opened: false,
            serial: AtomicU64::new(0),
            ended,
            feed: Some(feed),
            unread,
            inline,
            busy,
        };
        (router, rmcp)
    }

    /// The session ends: what still runs is cancelled, and closing the feed lets rmcp
    /// finish what it has and then see the end. (At the end of the client's stream, once
    /// the calls in flight are answered: see [`end_of_input`].)
    fn end(&mut self) {
        self.feed = None;
        self.ended.cancel();
    }

    /// Bytes for rmcp, in order.
    fn send_to_rmcp(&self, bytes: Vec<u8>) {
        if let Some(feed) = &self.feed {
            self.unread.fetch_add(bytes.len(), Ordering::Relaxed);
            // rmcp's transport outlives the session's reading: the receiver is there.
            let _ = feed.send(bytes);
        }
    }

    /// Routes one complete line: a call to the direct path, anything else to rmcp.
    fn route(&mut self, mut line: Vec<u8>) {
        // A leading UTF-8 byte order mark (some Windows clients write one) is no part of
        // the message (RFC 8259 lets a parser ignore it, as rmcp does): dropped before
        // anything reads the line, else the line is no JSON and answered `-32700`.
        if line.starts_with(UTF8_BOM) {
            line.drain(..UTF8_BOM.len());
        }
        // rmcp reads what it was handed before the next line is read, so all of it has
        // been read unless rmcp's task is behind; until then a call goes to rmcp too,
        // behind the rest, so that messages keep their order.
        let in_order = self.unread.load(Ordering::Relaxed) == 0;
        if let Some(peer) = self.peer.get().filter(|_| in_order) {
            let call = match RelayLine::parse(&line) {
                Some(relay) => match self.gateway.relay_name(&relay.params.name) {
                    Some(local) => {
                        let RelayLine { id, params, .. } = relay;
                        let arguments = params.arguments.map_or("{}", RawValue::get).to_owned();
                        self.start_relay(peer.clone(), id, local, arguments, params.meta);
                        return;
                    }
                    None => relay.into_call(),
                },
                None => CallLine::parse(&line),
            };
            if let Some(call) = call {
                self.start_call(peer.clone(), call);
                return;
            }
        }
        if let Some(id) = cancelled_request(&line) {
            let call = self.calls.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            if let Some((_, token)) = call {
                token.cancel();
            }
            // MCP: a cancelled request is not answered.
            if let Ok(id) = serde_json::to_string(&id) {
                self.busy.answered(&id);
            }
        }
        // What is wrong with a line's form is said first, before the handshake too: a
        // request without `jsonrpc` is told that, not to initialize.
        if let Some(answer) = malformed(&line) {
            self.out.send(answer);
            return;
        }
        if !self.opened {
            match opening(&line) {
                Opening::Opens => self.opened = true,
                Opening::Refused(answer) => {
                    self.out.send(answer);
                    return;
                }
                Opening::Other => {}
            }
        }
        // Waited for at the end of input only when rmcp can read it: a line it cannot is
        // answered with no id (or not at all), which would hold the end for its grace.
        match serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(&line) {
            Ok(_) => self.busy.ask(&line),
            Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
                // rmcp drops such a line unanswered: say why, as `serve --http` does.
                let id = message_id(&line, true)
                    .and_then(|id| serde_json::from_str(&id).ok())
                    .unwrap_or(serde_json::Value::Null);
                let answer = serde_json::json!({
                    "jsonrpc": "2.0", "id": id, "error": {"code": -32700, "message": too_deep(&e)}
                });
                if let Ok(mut answer) = serde_json::to_vec(&answer) {
                    answer.push(b'\n');
                    self.out.send(answer);
                }
                return;
            }
            Err(_) => {}
        }
        self.send_to_rmcp(line);
    }

    /// Runs a call on the direct path.
    fn start_call(&self, peer: Peer<RoleServer>, call: CallLine) {
        let Some(answering) = self.take_id(&call.id) else { return };
        let gateway = self.gateway.clone();
        let notify = self.notify.clone();
        let job = async move {
            let CallLine { id, params, .. } = call;
            let sinks = sinks(notify, params.meta);
            let arguments = params.arguments.unwrap_or_default();
            let cancel = answering.cancel.clone();
            let call = gateway.call_direct(&params.name, arguments, &id, cancel, peer, sinks);
            let result = call.await;
            answering.give(result.map(Answer::Result));
        };
        self.run(job);
    }

    /// Runs a call on the direct path through the provider's relay (see
    /// [`Gateway::relay_direct`]): a plain result is answered by the reader of the server's
    /// output as soon as it has it (see [`toolmux_core::EarlyAnswer`]), the call's
    /// bookkeeping after that.
    fn start_relay(
        &self,
        peer: Peer<RoleServer>,
        id: RequestId,
        local: String,
        arguments: String,
        meta: Option<CallMeta>,
    ) {
        let Some(answering) = self.take_id(&id) else { return };
        let gateway = self.gateway.clone();
        let notify = self.notify.clone();
        let job = async move {
            let mut sinks = sinks(notify, meta);
            sinks.early = Some({
                let answering = answering.clone();
                // The call's last progress report goes out before its result.
                let gate = sinks.progress.clone();
                EarlyAnswer::new(move |json| {
                    if let Some(gate) = &gate {
                        gate.finish();
                    }
                    answering.give_raw(json)
                })
            });
            let cancel = answering.cancel.clone();
            let call = gateway.relay_direct(&local, &arguments, &id, cancel, peer, sinks);
            let result = call.await;
            answering.give(result);
        };
        self.run(job);
    }

    /// Runs a call's job: on this reader thread until it first waits, or on the runtime;
    /// counted as the session's work until it ends (see [`end_of_input`]).
    fn run(&self, job: impl Future<Output = ()> + Send + 'static) {
        let working = self.busy.enter();
        let job = async move {
            job.await;
            drop(working);
        };
        match &self.inline {
            Some(runtime) => crate::inline::spawn(runtime.clone(), job),
            None => drop(tokio::spawn(job)),
        }
    }

    /// Registers a call under the client's request id, to be cancelled by it: its
    /// cancellation token, or `None` (and the client told) when a call in flight already
    /// has that id.
    fn take_id(&self, id: &RequestId) -> Option<Arc<Answering>> {
        // A token of its own rather than a child of `ended` (linking a child locks the
        // parent on creation and on drop, here and on another thread): the session's end
        // cancels the calls in `calls` (see `cancel_at_end`).
        let cancel = CancellationToken::new();
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let taken = {
            let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            // One lookup: the id is taken unless a call in flight already has it.
            let taken = match calls.entry(id.clone()) {
                std::collections::hash_map::Entry::Occupied(_) => false,
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert((serial, cancel.clone()));
                    true
                }
            };
            // Under the lock that `cancel_at_end` takes once the session has ended.
            if self.ended.is_cancelled() {
                cancel.cancel();
            }
            taken
        };
        if !taken {
            // JSON-RPC: an id names one request; a second call under it could not be told
            // apart in the response, nor cancelled on its own.
            let error = ErrorData::invalid_request(
                format!(
                    "request id {id} is already used by a call in flight; give each request an id of its own"
                ),
                None,
            );
            if let Some(line) = encode(&ErrorResponse { jsonrpc: JsonRpcVersion2_0, id, error }) {
                self.out.send(line);
            }
            return None;
        }
        Some(Arc::new(Answering {
            out: self.out.clone(),
            calls: self.calls.clone(),
            id: id.clone(),
            serial,
            cancel,
            given: AtomicBool::new(false),
        }))
    }
}

/// The calls running on the direct path, by the client's request id: a serial number
/// (ids may be used again once a call is answered) and the call's cancellation.
type Calls = Arc<Mutex<foldhash::HashMap<RequestId, (u64, CancellationToken)>>>;

/// Cancels the calls still running when the session ends.
async fn cancel_at_end(calls: Calls, ended: CancellationToken) {
    ended.cancelled().await;
    for (_, token) in calls.lock().unwrap_or_else(|e| e.into_inner()).values() {
        token.cancel();
    }
}

/// The answer to one call on the direct path, given once: when the call ends, or earlier
/// by the early answer of a relayed call.
struct Answering {
    out: Output,
    calls: Calls,
    id: RequestId,
    serial: u64,
    cancel: CancellationToken,
    given: AtomicBool,
}

impl Answering {
    /// Answers with `result` unless the call was answered already or the client
    /// cancelled it (MCP: the receiver of a cancellation should not answer the request);
    /// whether it did. Either way the id is free for another call from then on.
    fn give(&self, result: Result<Answer, ErrorData>) -> bool {
        self.answer(|id| match result {
            Ok(Answer::Raw(json)) => raw_response(id, &json),
            Ok(Answer::Result(mut result)) => {
                // The direct path serves the handshake revisions only (a 2026-07-28
                // request goes to rmcp), whose results carry no `resultType`: rmcp strips
                // it for such peers, and so must this path.
                result.result_type = None;
                encode(&Response { jsonrpc: JsonRpcVersion2_0, id, result })
            }
            Err(error) => encode(&ErrorResponse { jsonrpc: JsonRpcVersion2_0, id, error }),
        })
    }

    /// As [`Answering::give`] for a result as the server wrote it, borrowed.
    fn give_raw(&self, json: &str) -> bool {
        self.answer(|id| raw_response(id, json))
    }

    /// Sends the line `line` makes for the call's id, as [`Answering::give`] says.
    fn answer(&self, line: impl FnOnce(&RequestId) -> Option<Vec<u8>>) -> bool {
        if self.given.swap(true, Ordering::AcqRel) {
            return false;
        }
        let cancelled = self.cancel.is_cancelled();
        {
            let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            if calls.get(&self.id).is_some_and(|(serial, _)| *serial == self.serial) {
                calls.remove(&self.id);
            }
        }
        if cancelled {
            return false;
        }
        if let Some(line) = line(&self.id) {
            self.out.send(line);
        }
        true
    }
}

/// Sends notifications to the client, ahead of anything sent later.
type Notify = Arc<dyn Fn(ServerNotification) + Send + Sync>;

/// The session's [`Notify`].
fn notifier(out: &Output) -> Notify {
    let out = out.clone();
    Arc::new(move |notification: ServerNotification| {
        let message = ServerJsonRpcMessage::notification(notification);
        if let Some(line) = encode(&message) {
            out.send(line);
        }
    })
}

/// Where a call's progress and log lines go: to the client, through `notify`.
fn sinks(notify: Notify, meta: Option<CallMeta>) -> CallSinks {
    let (progress, trace, trace_state) = match meta {
        Some(meta) => {
            let trace = meta.traceparent.as_deref().and_then(TraceParent::parse);
            (meta.progress_token, trace, meta.tracestate)
        }
        None => (None, None, None),
    };
    let progress = progress.map(|token| CallSinks::progress_gate(token, notify.clone()));
    CallSinks { progress, notify, trace, trace_state, early: None }
}

/// The response line of a relayed result, spliced from its JSON text.
fn raw_response(id: &RequestId, result: &str) -> Option<Vec<u8>> {
    let mut line = Vec::with_capacity(result.len() + 64);
    line.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    if let Err(e) = serde_json::to_writer(&mut line, id) {
        tracing::warn!("cannot encode a message: {e}");
        return None;
    }
    line.extend_from_slice(b",\"result\":");
    crate::push_one_line(&mut line, result);
    line.extend_from_slice(b"}\n");
    Some(line)
}

/// One message as a line.
fn encode(message: &impl Serialize) -> Option<Vec<u8>> {
    let mut line = Vec::with_capacity(crate::LINE_CAPACITY);
    match serde_json::to_writer(&mut line, message) {
        Ok(()) => {
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

/// What a line is to a session whose client has not opened its lifecycle yet.
enum Opening {
    /// It opens it: an `initialize`, or a request with the stateless revision's `_meta`.
    Opens,
    /// A request that cannot be served before the lifecycle is open, and its answer.
    Refused(Vec<u8>),
    /// Anything else: a `ping` or `server/discover`, a notification, a response, a line
    /// that is no message; rmcp (or [`malformed`]) answers it as it is.
    Other,
}

/// Where `line` stands before the handshake. A request other than a `ping` without
/// `io.modelcontextprotocol/protocolVersion` in its `_meta` is refused with its id (rmcp
/// refuses it too, naming only the stateless revision's `_meta` fields, which a client of
/// the handshake revisions has never heard of: the answer says to send `initialize`).
fn opening(line: &[u8]) -> Opening {
    #[derive(Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
        params: Option<PeekParams>,
    }
    #[derive(Deserialize)]
    struct PeekParams {
        #[serde(rename = "_meta")]
        meta: Option<PeekMeta>,
    }
    #[derive(Deserialize)]
    struct PeekMeta {
        #[serde(rename = "io.modelcontextprotocol/protocolVersion")]
        version: Option<serde::de::IgnoredAny>,
    }
    let Ok(peek) = serde_json::from_slice::<Peek<'_>>(line) else { return Opening::Other };
    let Some(method) = peek.method else { return Opening::Other };
    let stateless = peek.params.and_then(|p| p.meta).is_some_and(|m| m.version.is_some());
    if method == "initialize" || stateless {
        return Opening::Opens;
    }
    if method == "ping" || method == "server/discover" {
        return Opening::Other;
    }
    let id = peek.id.and_then(|id| serde_json::from_str::<serde_json::Value>(id.get()).ok());
    let Some(id) = id.filter(|id| id.is_string() || id.is_number()) else {
        return Opening::Other;
    };
    // rmcp's code and words, and what a client of either generation should do.
    let message = format!(
        "request _meta is missing or has malformed required fields: \
         io.modelcontextprotocol/protocolVersion, io.modelcontextprotocol/clientCapabilities; \
         `{method}` came before the session was initialized: send an `initialize` request \
         (then `notifications/initialized`) first, or, as a stateless 2026-07-28 client, \
         give both fields in the `_meta` of every request"
    );
    let answer = serde_json::json!({
        "jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": message}
    });
    match serde_json::to_vec(&answer) {
        Ok(mut line) => {
            line.push(b'\n');
            Opening::Refused(line)
        }
        Err(_) => Opening::Other,
    }
}

/// The UTF-8 byte order mark.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The JSON-RPC error answering `line` when it is no message rmcp could answer rightly, in
/// the words `serve --http` gives a body of the same form (see [`super::malformed`]), with
/// the request's id when it can be read (else `null`): a line that is not JSON (`-32700`),
/// JSON that is no single message (a batch, or a member of the wrong form, named: `-32600`),
/// an `initialize` whose `params` are not an initialize's (`-32602`, naming the field), or a
/// `tools/call` request whose `params` are not an object with a string `name` and, when
/// given, object `arguments` (`-32602`, naming what is wrong; rmcp answered most of these
/// `-32600 "Invalid request"` with no id, or `-32601 "tools/call"`, as if the method were
/// unknown). `None` for anything else, which rmcp answers.
fn malformed(line: &[u8]) -> Option<Vec<u8>> {
    let error = |id: &serde_json::Value, code: i32, message: String| {
        let mut line = serde_json::to_vec(&serde_json::json!({
            "jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}
        }))
        .ok()?;
        line.push(b'\n');
        Some(line)
    };
    // Only the members looked at, left as text: every message rmcp handles passes here,
    // and building it whole would parse it twice over.
    #[derive(Deserialize)]
    struct Peek<'a> {
        #[serde(borrow)]
        jsonrpc: Option<&'a RawValue>,
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        #[serde(borrow)]
        method: Option<&'a RawValue>,
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    // A batch (rmcp answered it `-32600` with no id): MCP has none since 2025-06-18.
    if line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
            Ok(_) => error(
                &serde_json::Value::Null,
                -32600,
                "Invalid Request: a batch (a JSON array) is no MCP message; send one message a \
                 line"
                    .to_owned(),
            ),
            Err(e) => {
                not_json(&e).and_then(|message| error(&serde_json::Value::Null, -32700, message))
            }
        };
    }
    let peek: Peek<'_> = match serde_json::from_slice(line) {
        Ok(peek) => peek,
        Err(e) => {
            return match not_json(&e) {
                Some(message) => error(&serde_json::Value::Null, -32700, message),
                // JSON, but no object (a string, a number).
                None => error(
                    &serde_json::Value::Null,
                    -32600,
                    "Invalid Request: the line is no JSON-RPC message, which is an object \
                     (`{\"jsonrpc\": \"2.0\", ...}`); send one message a line"
                        .to_owned(),
                ),
            };
        }
    };
    // The id, when it is one a client can be answered with (a string or an integer).
    let id = peek
        .id
        .and_then(|id| serde_json::from_str::<serde_json::Value>(id.get()).ok())
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .unwrap_or_default();
    // Read whole only when a member looks wrong: for its words, shared with HTTP.
    let version = peek.jsonrpc.map(RawValue::get);
    let suspect = (version != Some(r#""2.0""#)
        && version.and_then(|v| serde_json::from_str::<String>(v).ok()).as_deref() != Some("2.0"))
        || (peek.id.is_some() && id.is_null())
        || peek.method.is_some_and(|method| !method.get().starts_with('"'))
        || peek.params.is_some_and(|p| !p.get().starts_with('{') && p.get() != "null");
    if suspect && let Some(field) = super::malformed::wrong_field(line) {
        return error(&id, -32600, format!("Invalid Request: {field}"));
    }
    if peek.method.map(RawValue::get) == Some(r#""initialize""#)
        && let Some(why) = super::malformed::initialize_params(line)
    {
        return error(&id, -32602, format!("Invalid params: {why}"));
    }
    peek.method?;
    if id.is_null() {
        return None;
    }
    if peek.method.map(RawValue::get) != Some(r#""tools/call""#) {
        return None;
    }
    let params = match peek.params.map(|p| serde_json::from_str::<serde_json::Value>(p.get())) {
        // Valid JSON that serde will not read whole: it nests too deep.
        Some(Err(e)) => return error(&id, -32700, too_deep(&e)),
        Some(Ok(params)) => Some(params),
        None => None,
    };
    let problem = match params.as_ref() {
        None => "`params` is missing: give `{\"name\": TOOL, \"arguments\": {...}}`".to_owned(),
        Some(serde_json::Value::Object(params)) => match params.get("name") {
            None => "`params.name` is missing: name the tool to call".to_owned(),
            Some(name) if !name.is_string() => {
                format!("`params.name` must be a string, not `{name}`")
            }
            Some(_) => match params.get("arguments") {
                Some(arguments) if !arguments.is_object() && !arguments.is_null() => {
                    format!("`params.arguments` must be an object, not `{arguments}`")
                }
                _ => return None,
            },
        },
        Some(other) => format!("`params` must be an object, not `{other}`"),
    };
    error(&id, -32602, format!("Invalid params: {problem}"))
}

/// The `-32700` message of a line of valid JSON nesting deeper than serde reads.
const TOO_DEEP: &str = "Parse error: the message nests deeper than the 128 levels of arrays \
                        and objects a message may have";

/// [`TOO_DEEP`] with serde's own words.
fn too_deep(e: &serde_json::Error) -> String {
    format!("{TOO_DEEP} ({e})")
}

/// The `-32700` message of a line serde could not read, when it is not JSON at all (as
/// opposed to JSON of another form than the one read).
fn not_json(e: &serde_json::Error) -> Option<String> {
    (e.is_syntax() || e.is_eof()).then(|| format!("Parse error: the line is not JSON ({e})"))
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
    /// W3C trace context, joined by the call's spans.
    #[serde(default)]
    traceparent: Option<String>,
    /// Its vendors' part, passed on with it.
    #[serde(default)]
    tracestate: Option<String>,
}

/// A plain `tools/call` (as [`CallLine`]) whose arguments are left as text: for a tool
/// the gateway relays (see [`Gateway::relay_name`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RelayLine<'a> {
    #[serde(rename = "jsonrpc", deserialize_with = "version")]
    _jsonrpc: (),
    #[serde(deserialize_with = "request_id")]
    id: RequestId,
    #[serde(rename = "method", deserialize_with = "call_method")]
    _method: (),
    #[serde(borrow)]
    params: RelayParams<'a>,
}

// What `RelayLine` reads without allocating (rmcp's types read strings as `String`, an
// id as a `Value`), on every call's path. A line they refuse is parsed as a `CallLine`,
// which says what is wrong.

/// `"2.0"`.
fn version<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    deserializer.deserialize_str(Exactly("2.0"))
}

/// `"tools/call"`.
fn call_method<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    deserializer.deserialize_str(Exactly("tools/call"))
}

/// A string that must be this one.
struct Exactly(&'static str);

impl serde::de::Visitor<'_> for Exactly {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{}\"", self.0)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<(), E> {
        if text == self.0 {
            Ok(())
        } else {
            Err(E::invalid_value(serde::de::Unexpected::Str(text), &self))
        }
    }
}

/// A JSON-RPC id: a string, or an integer that fits an `i64` (an integer written as a
/// float is left to rmcp's reading).
fn request_id<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<RequestId, D::Error> {
    struct Id;
    impl serde::de::Visitor<'_> for Id {
        type Value = RequestId;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string or an integer")
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<RequestId, E> {
            Ok(RequestId::Number(n))
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<RequestId, E> {
            let n = i64::try_from(n)
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))?;
            Ok(RequestId::Number(n))
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<RequestId, E> {
            Ok(RequestId::String(text.into()))
        }
    }
    deserializer.deserialize_any(Id)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RelayParams<'a> {
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(rename = "_meta", default)]
    meta: Option<CallMeta>,
}

impl<'a> RelayLine<'a> {
    /// The call, when its arguments are an object (or absent).
    fn parse(line: &'a [u8]) -> Option<RelayLine<'a>> {
        let call: RelayLine<'a> = serde_json::from_str(std::str::from_utf8(line).ok()?).ok()?;
        match call.params.arguments {
            Some(arguments) if !arguments.get().starts_with('{') => None,
            _ => Some(call),
        }
    }

    /// The call as one for [`Gateway::call_direct`].
    fn into_call(self) -> Option<CallLine> {
        let arguments = match self.params.arguments {
            Some(text) => Some(serde_json::from_str(text.get()).ok()?),
            None => None,
        };
        Some(CallLine {
            _jsonrpc: JsonRpcVersion2_0,
            id: self.id,
            _method: CallToolRequestMethod,
            params: CallParams {
                name: self.params.name.into_owned(),
                arguments,
                meta: self.params.meta,
            },
        })
    }
}

impl CallLine {
    fn parse(line: &[u8]) -> Option<CallLine> {
        // Checked as UTF-8 once, here: `from_slice` checks every string it parses on its own.
        serde_json::from_str(std::str::from_utf8(line).ok()?).ok()
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

/// The writing half of rmcp's transport: whole lines to the session's output.
struct OutboxWriter {
    out: Output,
    /// The part of a line written so far.
    partial: Vec<u8>,
    /// Told of rmcp's answers.
    busy: Arc<Busy>,
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
            // rmcp answers a message it cannot read with an error without `id`, which
            // JSON-RPC wants there, `null` when unknown.
            const NO_ID: &[u8] = br#"{"jsonrpc":"2.0","error":"#;
            if line.starts_with(NO_ID) {
                let at = NO_ID.len() - br#""error":"#.len();
                line.splice(at..at, br#""id":null,"#.iter().copied());
            }
            // Told once the answer is out: the session may end as soon as it is told.
            let answer = if this.busy.asked().is_empty() { None } else { message_id(&line, false) };
            if !this.out.send(line) {
                return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
            }
            if let Some(id) = answer {
                this.busy.answered(&id);
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

/// Splits the client's bytes into lines: short ones whole, for the router; longer ones
/// streamed to rmcp as they arrive (rmcp caps them), so nothing here buffers an unbounded
/// line.
#[derive(Default)]
struct Framer {
    /// The line being read; a read interrupted by the session's `select!` resumes into it.
    line: Vec<u8>,
    /// The rest of the current line goes to rmcp as it arrives (it was too long).
    streaming: bool,
    /// Of a line streamed to rmcp: its length so far, and its id as it is found.
    long: LongLine,
}

/// The longest line rmcp reads; it drops longer ones, unanswered.
const LINE_MAX: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

impl Framer {
    /// Takes bytes from `available`: how many it took, and a whole short line if that
    /// completed one.
    fn take(&mut self, available: &[u8], router: &Router) -> (usize, Option<Vec<u8>>) {
        let newline = available.iter().position(|&b| b == b'\n');
        let take = newline.map_or(available.len(), |at| at + 1);
        if self.streaming || self.line.len() + take > FAST_LINE_MAX {
            let mut chunk = std::mem::take(&mut self.line);
            chunk.extend_from_slice(&available[..take]);
            self.long.read(&chunk);
            self.streaming = newline.is_none();
            if self.streaming {
                router.send_to_rmcp(chunk);
                return (take, None);
            }
            let long = std::mem::take(&mut self.long);
            let too_long = long.length > LINE_MAX + 1;
            // Waited for at the end of input as a short line is (see `Router::route`):
            // counted before rmcp has the line's end, so before it can answer it.
            if !too_long && let Some(id) = long.request_id() {
                router.busy.ask_id(id);
            }
            router.send_to_rmcp(chunk);
            // rmcp drops the line without a word: its client would wait for ever. So it
            // does a request nesting deeper than serde reads (answered as a short line
            // is, by `Router::route`, which keeps such a line from rmcp).
            let refusal = if too_long {
                Some((
                    -32600,
                    format!(
                        "Invalid Request: the message is {} bytes, over the {} MiB a line may \
                         have; it was dropped",
                        long.length - 1,
                        LINE_MAX >> 20
                    ),
                ))
            } else if long.too_deep_request() {
                Some((-32700, TOO_DEEP.to_owned()))
            } else {
                None
            };
            if let Some((code, message)) = refusal {
                let id = long.id();
                let error = serde_json::json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": code, "message": message}});
                if let Ok(mut line) = serde_json::to_vec(&error) {
                    line.push(b'\n');
                    router.out.send(line);
                }
            }
            (take, None)
        } else {
            self.line.extend_from_slice(&available[..take]);
            (take, newline.map(|_| std::mem::take(&mut self.line)))
        }
    }
}

impl Framer {
    /// At the end of the client's stream: the last line, when it did not end with a
    /// newline, as if it had (a short one returned for the router, a long one's end sent
    /// to rmcp). A client that ends its last message with the end of its stream, as
    /// `printf '%s' '{...}' | toolmux serve --stdio` does, is served, not ignored.
    fn finish(&mut self, router: &Router) -> Option<Vec<u8>> {
        if !self.streaming && self.line.iter().all(u8::is_ascii_whitespace) {
            self.line.clear();
            return None;
        }
        self.take(b"\n", router).1
    }
}

/// What is learned of a line streamed to rmcp as its bytes pass: its length, and the
/// value of its top-level `id` (an object's member at depth one, wherever it is).
#[derive(Debug, Default)]
struct LongLine {
    length: usize,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth one, the next string is a member's name.
    expect_key: bool,
    /// The member name being read, up to a few bytes.
    key: Vec<u8>,
    /// The value of `id` being read (`Some` from its first byte to its end).
    value: Option<Vec<u8>>,
    /// The `id`'s value, once read whole.
    id: Option<Vec<u8>>,
    /// The name read last at depth one was `id`, and its value comes next.
    at_id: bool,
    /// A member named `method` was read at depth one: the line is a request (or a
    /// notification, when it has no `id`).
    request: bool,
    /// The deepest nesting of arrays and objects read.
    deepest: u32,
}

impl LongLine {
    /// Reads the next bytes of the line.
    fn read(&mut self, bytes: &[u8]) {
        self.length += bytes.len();
        for &b in bytes {
            if let Some(value) = self.value.as_mut() {
                let ends = self.depth == 1 && !self.in_string && matches!(b, b',' | b'}');
                if !ends {
                    if value.len() < 512 {
                        value.push(b);
                    }
                } else {
                    self.id = self.value.take();
                }
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                } else if self.depth == 1 && self.expect_key && self.key.len() < 8 {
                    self.key.push(b);
                }
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.depth == 1 && self.expect_key {
                        self.key.clear();
                    }
                }
                b'{' | b'[' => {
                    self.depth += 1;
                    self.deepest = self.deepest.max(self.depth);
                    if self.depth == 1 {
                        self.expect_key = b == b'{';
                    }
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                b':' if self.depth == 1 && self.expect_key => {
                    self.expect_key = false;
                    self.at_id = self.key == b"id";
                    self.request |= self.key == b"method";
                }
                b',' if self.depth == 1 => self.expect_key = true,
                _ => {}
            }
            if self.at_id && !b.is_ascii_whitespace() && b != b':' {
                self.at_id = false;
                self.value = Some(vec![b]);
            }
        }
    }

    /// The line's id as JSON text, as rmcp will answer it, when the line is a request
    /// rmcp can read as far as its bytes tell: it has a `method`, a string id or an
    /// integer one within `i64`, and nests no deeper than serde_json reads (128 levels).
    /// (A request whose `params` do not fit its method is answered without an id: it
    /// holds the end of input for its grace, as the line is not kept to be read whole.)
    fn request_id(&self) -> Option<String> {
        if !self.request || self.deepest >= 128 {
            return None;
        }
        let id: serde_json::Value = serde_json::from_slice(self.id.as_deref()?).ok()?;
        (id.is_string() || id.is_i64()).then(|| id.to_string())
    }

    /// Whether the line is a request (it has a `method` and an `id`) nesting deeper than
    /// serde_json reads (128 levels), which rmcp drops unanswered.
    fn too_deep_request(&self) -> bool {
        self.request && self.id.is_some() && self.deepest >= 128
    }

    /// The line's id, when it has a string or number one; else `null`.
    fn id(&self) -> serde_json::Value {
        self.id
            .as_deref()
            .and_then(|raw| serde_json::from_slice::<serde_json::Value>(raw).ok())
            .filter(|id| id.is_string() || id.is_number())
            .unwrap_or_default()
    }
}

/// The client's stream, read a line at a time on the runtime.
struct Lines<R> {
    reader: BufReader<R>,
    framer: Framer,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    /// Reads until a whole short line is read (`Some`) or `reader` ends (`None`); long
    /// lines and their tails go to rmcp on the way. Cancel-safe: no await lies between
    /// taking bytes from the reader and storing them.
    async fn read_line(&mut self, router: &Router) -> Option<Vec<u8>> {
        loop {
            let (taken, line) = {
                let available = match self.reader.fill_buf().await {
                    Ok(available) if !available.is_empty() => available,
                    Ok(_) => return self.framer.finish(router),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot read the client's stream");
                        return None;
                    }
                };
                self.framer.take(available, router)
            };
            self.reader.consume(taken);
            if line.is_some() {
                return line;
            }
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
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"e","_meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","tracestate":"v=1"}}}"#,
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
        let traced = CallLine::parse(direct[3].as_bytes()).unwrap();
        let trace = traced.params.meta.and_then(|m| m.traceparent).unwrap();
        assert!(TraceParent::parse(&trace).is_some(), "{trace}");
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
            assert!(RelayLine::parse(line.as_bytes()).is_none(), "{line}");
        }
        // A line for the relay is the same call with its arguments as text, and one whose
        // arguments are no object takes the usual path (which refuses it through rmcp).
        for line in direct {
            let relay = RelayLine::parse(line.as_bytes()).expect("readable for the relay");
            let text = relay.params.arguments.map(|a| a.get().to_owned());
            let call = relay.into_call().expect("the same call");
            let expected = CallLine::parse(line.as_bytes()).unwrap();
            assert_eq!(format!("{call:?}"), format!("{expected:?}"), "{line}");
            let arguments = text.map(|t| serde_json::from_str::<JsonObject>(&t).unwrap());
            assert_eq!(arguments, expected.params.arguments);
        }
        let escaped = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a\u0062","arguments":{"k":"\n"}}}"#;
        let relay = RelayLine::parse(escaped.as_bytes()).expect("escapes are read");
        assert_eq!(relay.params.name, "ab");
        assert_eq!(relay.params.arguments.map(RawValue::get), Some(r#"{"k":"\n"}"#));
        let array = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"e","arguments":[1]}}"#;
        assert!(RelayLine::parse(array.as_bytes()).is_none());
        // Ids and constants in the forms JSON allows: read as rmcp reads them, or left to
        // the usual path (an integer written as a float).
        // (version, id, method, read for the relay, read by `CallLine`)
        let forms = [
            (r#""2\u002e0""#, "-3", r#""tools\/call""#, true, true),
            (r#""2.0""#, r#""a\"b""#, r#""tools/call""#, true, true),
            (r#""2.0""#, "9223372036854775807", r#""tools/call""#, true, true),
            (r#""2.0""#, "9223372036854775808", r#""tools/call""#, false, false),
            (r#""2.0""#, "1.0", r#""tools/call""#, false, true),
            (r#""2.0""#, "null", r#""tools/call""#, false, false),
            (r#""2.0""#, "1", r#""tools/callx""#, false, false),
        ];
        for (version, id, method, relayed, read) in forms {
            let line = format!(
                r#"{{"jsonrpc":{version},"id":{id},"method":{method},"params":{{"name":"e"}}}}"#
            );
            let expected = CallLine::parse(line.as_bytes());
            assert_eq!(expected.is_some(), read, "{line}");
            let relay = RelayLine::parse(line.as_bytes());
            assert_eq!(relay.is_some(), relayed, "{line}");
            if let Some(relay) = relay {
                assert_eq!(format!("{:?}", relay.into_call()), format!("{expected:?}"), "{line}");
            }
        }
    }

    #[test]
    fn a_long_line_s_id_is_found_wherever_it_is() {
        let id = |line: &str, split: usize| {
            let mut long = LongLine::default();
            long.read(&line.as_bytes()[..split]);
            long.read(&line.as_bytes()[split..]);
            long.id()
        };
        let lines = [
            (r#"{"id":7,"method":"m","params":{"id":"inner"}}"#, serde_json::json!(7)),
            (
                r#"{"params":{"id":"inner","a":[{"id":1}]},"id" : "x\"y"}"#,
                serde_json::json!("x\"y"),
            ),
            (r#"{"params":{"s":"\"id\":3,"},"method":"m"}"#, serde_json::Value::Null),
            (r#"{"id":{"a":1},"method":"m"}"#, serde_json::Value::Null),
        ];
        for (line, expected) in lines {
            for split in [0, 3, line.len() / 2, line.len()] {
                assert_eq!(id(line, split), expected, "{line} split at {split}");
            }
        }
    }

    /// A long line is waited for at the end of input when a short one of the same form
    /// would be: a request rmcp reads, under the id its answer carries.
    #[test]
    fn a_long_line_is_a_request_to_answer_as_a_short_one_is() {
        let deep = format!("{}1{}", "[".repeat(127), "]".repeat(127));
        let deeper = format!("{}1{}", "[".repeat(128), "]".repeat(128));
        let lines = [
            r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"ping","id":"ab"}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#.to_owned(),
            r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#.to_owned(),
            format!(
                r#"{{"jsonrpc":"2.0","id":8,"method":"ping","params":{{"_meta":{{"d":{deep}}}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":8,"method":"ping","params":{{"_meta":{{"d":{deeper}}}}}}}"#
            ),
        ];
        for line in &lines {
            let mut long = LongLine::default();
            long.read(line.as_bytes());
            let readable = serde_json::from_str::<rmcp::model::ClientJsonRpcMessage>(line).is_ok();
            let short = message_id(line.as_bytes(), true).filter(|_| readable);
            assert_eq!(long.request_id(), short, "{line}");
        }
        let mut long = LongLine::default();
        long.read(lines[1].as_bytes());
        assert_eq!(long.request_id().as_deref(), Some(r#""ab""#));
    }

    /// A long line is refused as too deep exactly when serde_json cannot read it for its
    /// depth, and only when it is a request (a notification gets no answer).
    #[test]
    fn a_long_line_is_too_deep_where_serde_stops() {
        for depth in 124..=131 {
            // The message itself and `params` are two levels.
            let inner = depth - 2;
            let nested = format!("{}1{}", "[".repeat(inner), "]".repeat(inner));
            let request =
                format!(r#"{{"jsonrpc":"2.0","id":3,"method":"ping","params":{{"d":{nested}}}}}"#);
            let mut long = LongLine::default();
            long.read(request.as_bytes());
            let unreadable = serde_json::from_str::<serde_json::Value>(&request).is_err();
            assert_eq!(long.too_deep_request(), unreadable, "depth {depth}");
            let notification =
                format!(r#"{{"jsonrpc":"2.0","method":"ping","params":{{"d":{nested}}}}}"#);
            let mut long = LongLine::default();
            long.read(notification.as_bytes());
            assert!(!long.too_deep_request(), "depth {depth}");
        }
    }

    /// A server's result relayed as it wrote it goes to the client on one line: a `\r`
    /// standing as whitespace in it would end the line for a client that ends lines there
    /// too, and what followed would read as a message of the server's making.
    #[test]
    fn relayed_results_stay_on_one_line() {
        let result = "{\"content\":[]\r,\"x\":\r{\"jsonrpc\":\"2.0\",\"id\":1}\r}";
        let line = raw_response(&RequestId::Number(7), result).expect("a line");
        let (last, before) = line.split_last().expect("a line");
        assert_eq!(*last, b'\n');
        assert!(!before.iter().any(|b| matches!(b, b'\r' | b'\n')), "{line:?}");
        let answer: serde_json::Value = serde_json::from_slice(&line).expect("JSON");
        assert_eq!(answer["result"]["x"]["id"], 1);
    }

    #[test]
    fn cancellations_name_their_request() {
        let line = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"x"}}"#;
        assert_eq!(cancelled_request(line), Some(RequestId::Number(7)));
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"notifications/cancelled"}}"#;
        assert_eq!(cancelled_request(line), None);
    }
}
