//! The external tools' HTTP API beside `/mcp`, for programs that answer external tools'
//! calls without speaking MCP (a job runner, the backend of a user interface):
//!
//! - `GET /api/tool-calls[?waitMs=N][&tool=NAME]…`: `{"calls": [...]}`, the calls waiting
//!   for a result, oldest first; with `waitMs`, waits up to that long (at most 60 s) for one
//!   when none is waiting.
//! - `GET /api/tool-calls/events[?tool=NAME]…`: server-sent events, one `tool_call` event
//!   (`id:` the call id, `data:` the call as JSON) for every call waiting when the stream
//!   opens and then for each new one as it is made; a comment every 15 s keeps proxies
//!   from closing the stream. Calls are announced at least once: a client that reconnects
//!   is told again of the calls still waiting.
//! - `POST /api/runs/{runId}/tool-results` with `{"callId", "result", "isError"?}`: answers
//!   call `callId` of run `runId` (the `runId` its listing gives, percent-encoded). 200 and
//!   `{"callId", "delivered": "call" | "inbox"}`: the waiting call returned the result, or
//!   the call had returned already and the result went to its run's inbox. 400 for a
//!   malformed body, 404 for a call that is not pending in that run (never made, answered
//!   already, withdrawn, or another key holder's).
//!
//! - `GET /api/events[?run=RUN][&tool=NAME]…` (when the server has an
//!   [`EventSource`](super::EventSource)): every call's events as server-sent events,
//!   `tool.started`, `tool.progress`, `tool.done` and `tool.error`, with the call's
//!   operation, run, tool and (at its end) latency and status, and for a tool shown to
//!   people (`visible`) its arguments and result text, secrets redacted, for a user
//!   interface to render the call; `lagged` when the stream fell behind and missed some. A
//!   call's `tool.progress` is coalesced as MCP clients get it (`super::progress`): at
//!   most one every 50 ms, rising, the latest, and the last one before its `tool.done` or
//!   `tool.error`. A key holder sees its own runs' calls only.
//!
//! - `GET /api/spaces` (with `spaces` configured): `{"spaces": [{space, total, members}]}`.
//! - `GET /api/spaces/{space}/messages[?offset=N][&limit=N]`: a page of the space's
//!   messages from `offset` (default 0; at most 200): `{space, messages, next, total,
//!   first}`; each message has its `index`, `author`, `atMs` and `text`, or the `tool`
//!   call of a visible tool with its `status` (`requires_action`, `complete`, `error`,
//!   `cancelled`) and `result`. 404 for a space that does not exist.
//! - `POST /api/spaces/{space}/messages` with `{"author", "text"}`: a person's message
//!   (`person:AUTHOR`), 201 and the message; the space is made when new. Agents read it
//!   with `gateway__read_messages`, and find it unread when their next run starts.
//! - `GET /api/spaces/{space}/events[?since=REV]`: server-sent events, a `message` event
//!   (`id:` its revision, `data:` the message) for each message written to the space and
//!   again when one changes (a visible tool's call answered: same `index`, new `status`);
//!   from now on, or after revision `since` (or `Last-Event-ID`, so that a client that
//!   reconnects misses nothing kept). A comment every 15 s.
//!
//! Each request to the first three is a call of the served provider's `external__pending` or
//! `external__submit`, so it passes through the same pipeline as over MCP (permissions,
//! limits, accounting) and is scoped to the API key's holder the same way: a holder sees
//! and answers only calls made with its own key. The spaces routes are calls of the
//! gateway's `gateway__spaces`, `gateway__read_messages` and `gateway__post` the same
//! way, and a key holder has spaces of its own. Requests are refused like `/mcp`'s: 401
//! without a key when keys are configured, 403 for a `Host` or `Origin` not allowed.

use super::ServedEvent;
use super::handler::Shared;
use super::http::KeyHolder;
use super::progress::{ProgressGate, Report};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HOST, ORIGIN};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::{CancellationToken, DropGuard};
use toolmux_core::{CallContext, ContentPart, ToolError, ToolOutput, ToolProvider};

/// The tool that lists pending calls.
const PENDING: &str = "external__pending";
/// The tool that answers one.
const SUBMIT: &str = "external__submit";
/// The longest wait of one listing (the tool's own limit).
const MAX_WAIT: Duration = Duration::from_secs(60);
/// How long one poll of the event stream waits before looking again (and pruning).
const STREAM_POLL: Duration = Duration::from_secs(25);
/// How often the event stream sends a comment while nothing happens.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The largest request body accepted.
const MAX_BODY: usize = 16 * 1024 * 1024;

#[derive(Clone)]
struct Api {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
}

/// The API's routes, refusing hosts and origins outside `hosts` (none: any).
pub(crate) fn routes(
    shared: Arc<Shared>,
    hosts: Vec<String>,
    shutdown: CancellationToken,
) -> axum::Router {
    let api = Api { shared, shutdown };
    axum::Router::new()
        .route("/api/tool-calls", axum::routing::get(list))
        .route("/api/tool-calls/events", axum::routing::get(events))
        .route("/api/runs/{run_id}/tool-results", axum::routing::post(submit))
        .route("/api/events", axum::routing::get(tool_events))
        .route("/api/spaces", axum::routing::get(spaces))
        .route("/api/spaces/{space}/messages", axum::routing::get(messages).post(post_message))
        .route("/api/spaces/{space}/events", axum::routing::get(space_events))
        .with_state(api)
        .layer(axum::middleware::from_fn_with_state(Arc::<[String]>::from(hosts), check_host))
}

/// The run a request's calls belong to: the key holder's (`key:NAME/api`), else `api`.
fn context(request: &axum::http::request::Parts, cancel: CancellationToken) -> CallContext {
    let run = match request.extensions.get::<KeyHolder>() {
        Some(holder) => toolmux_core::holder_run_id(&holder.0, "api"),
        None => "api".to_owned(),
    };
    CallContext::new().with_run_id(run).with_cancel(cancel)
}

/// The provider a request's key holder is served: its view, or the whole provider.
fn provider(api: &Api, request: &axum::http::request::Parts) -> Arc<dyn ToolProvider> {
    let holder = request.extensions.get::<KeyHolder>().map(|h| h.0.clone());
    api.shared.provider_of(holder.as_deref())
}

async fn list(State(api): State<Api>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let query = match Query::parse(parts.uri.query(), &["waitMs", "tool"]) {
        Ok(query) => query,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    let cancel = CancellationToken::new();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let ctx = context(&parts, cancel);
    let args = json!({"waitMs": query.wait.as_millis() as u64, "tools": query.tools});
    let served = provider(&api, &parts);
    let called = tokio::select! {
        called = served.call(PENDING, args, &ctx) => called,
        () = api.shutdown.cancelled() => {
            return problem(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down");
        }
    };
    match called.and_then(|output| calls_of(&output)) {
        Ok(calls) => json_response(StatusCode::OK, &json!({ "calls": calls })),
        Err(e) => failure(&e),
    }
}

async fn submit(State(api): State<Api>, Path(run_id): Path<String>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        let message = format!("the body is over {} MiB, or was cut off", MAX_BODY >> 20);
        return problem(StatusCode::PAYLOAD_TOO_LARGE, &message);
    };
    let submission = match Submission::parse(&body) {
        Ok(submission) => submission,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    let cancel = CancellationToken::new();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let ctx = context(&parts, cancel);
    let args = json!({
        "callId": submission.call_id,
        "result": submission.result,
        "isError": submission.is_error,
        "runId": run_id,
    });
    match provider(&api, &parts).call(SUBMIT, args, &ctx).await {
        Ok(output) if output.is_error => failure(&ToolError::remote(SUBMIT, text_of(&output))),
        Ok(output) => {
            let delivered = output.extras.get("delivered").cloned().unwrap_or(json!("call"));
            json_response(
                StatusCode::OK,
                &json!({"callId": submission.call_id, "delivered": delivered}),
            )
        }
        // The body was checked: what the tool still finds wrong is the call itself, gone
        // for good when it expired, else not (or no longer) waiting.
        Err(e @ ToolError::Gone { .. }) => problem(StatusCode::GONE, &e.report()),
        Err(e @ ToolError::InvalidArguments { .. }) => problem(StatusCode::NOT_FOUND, &e.report()),
        Err(e) => failure(&e),
    }
}

async fn events(State(api): State<Api>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let query = match Query::parse(parts.uri.query(), &["tool"]) {
        Ok(query) => query,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let ctx = context(&parts, cancel);
    // The first listing answers the request, so that a server without external tools, or
    // a refused caller, gets a status rather than a stream that ends at once.
    let args = json!({"tools": query.tools});
    let served = provider(&api, &parts);
    let first = match served.call(PENDING, args, &ctx).await {
        Ok(output) => match calls_of(&output) {
            Ok(calls) => calls,
            Err(e) => return failure(&e),
        },
        Err(e) => return failure(&e),
    };
    let mut stream = EventStream {
        core: StreamCore::new(api, served, ctx, guard),
        tools: query.tools,
        seen: Vec::new(),
    };
    stream.take(first);
    let body = futures::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), stream))
    });
    sse(Body::from_stream(body))
}

/// The state of one stream of pending calls.
struct EventStream {
    core: StreamCore,
    tools: Vec<String>,
    /// Ids of the calls announced that may still be pending.
    seen: Vec<String>,
}

/// What every event stream of the API holds: who it serves, in what context, the events
/// to send and the poll under way.
struct StreamCore {
    api: Api,
    /// What the stream's key holder is served.
    provider: Arc<dyn ToolProvider>,
    ctx: CallContext,
    /// Cancels a poll in flight when the client goes away.
    _guard: DropGuard,
    /// Events to send.
    ready: VecDeque<Bytes>,
    /// The poll under way, kept across keep-alive comments.
    poll: Option<Poll>,
    /// When a keep-alive comment is due: [`KEEP_ALIVE`] after the last chunk sent. Polls
    /// that answer with nothing to send do not put it off, or a stream whose polls answer
    /// more often than every [`KEEP_ALIVE`] (or at [`STREAM_POLL`], after one comment)
    /// would send nothing for longer than a proxy waits.
    keep_alive: tokio::time::Instant,
    ended: bool,
}

/// What a stream does next.
enum Step {
    /// Sends this chunk.
    Send(Bytes),
    /// Ends.
    End,
    /// Takes this answer of its poll.
    Answer(Result<ToolOutput, ToolError>),
}

impl StreamCore {
    fn new(api: Api, provider: Arc<dyn ToolProvider>, ctx: CallContext, guard: DropGuard) -> Self {
        StreamCore {
            api,
            provider,
            ctx,
            _guard: guard,
            ready: VecDeque::new(),
            poll: None,
            keep_alive: tokio::time::Instant::now() + KEEP_ALIVE,
            ended: false,
        }
    }

    /// A queued event, the end, or the answer of the poll under way (a call of `tool` with
    /// `args`, started when none is), with keep-alive comments while it waits.
    async fn step(&mut self, tool: &'static str, args: impl FnOnce() -> Value) -> Step {
        if let Some(event) = self.ready.pop_front() {
            self.keep_alive = tokio::time::Instant::now() + KEEP_ALIVE;
            return Step::Send(event);
        }
        if self.ended {
            return Step::End;
        }
        let (provider, ctx) = (&self.provider, &self.ctx);
        let make = || -> Poll {
            let (provider, ctx, args) = (provider.clone(), ctx.clone(), args());
            Box::pin(async move { provider.call(tool, args, &ctx).await })
        };
        match wait_poll(&mut self.poll, make, self.keep_alive, &self.api.shutdown).await {
            Waited::Answer(polled) => Step::Answer(polled),
            Waited::KeepAlive => {
                self.keep_alive = tokio::time::Instant::now() + KEEP_ALIVE;
                Step::Send(Bytes::from_static(KEEP_ALIVE_COMMENT))
            }
            Waited::Shutdown => Step::End,
        }
    }

    /// Ends the stream with an `error` event telling `error`.
    fn fail(&mut self, error: &ToolError) {
        self.ready.push_back(error_event(error));
        self.ended = true;
    }
}

/// A listing under way.
type Poll = std::pin::Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send>>;

/// What waiting on an event stream's poll came to.
enum Waited {
    /// The poll answered.
    Answer(Result<ToolOutput, ToolError>),
    /// A keep-alive comment is due; the poll goes on where it was at the next chunk.
    KeepAlive,
    /// The server is shutting down.
    Shutdown,
}

/// The comment that keeps proxies from closing a quiet stream.
const KEEP_ALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

/// Waits for the poll under way in `slot` (started by `make` when none is) until it
/// answers, a keep-alive is due (at `keep_alive`) or the server shuts down; an answered
/// poll leaves the slot.
async fn wait_poll(
    slot: &mut Option<Poll>,
    make: impl FnOnce() -> Poll,
    keep_alive: tokio::time::Instant,
    shutdown: &CancellationToken,
) -> Waited {
    let poll = slot.get_or_insert_with(make);
    let polled = tokio::select! {
        polled = poll => polled,
        () = shutdown.cancelled() => return Waited::Shutdown,
        () = tokio::time::sleep_until(keep_alive) => return Waited::KeepAlive,
    };
    *slot = None;
    Waited::Answer(polled)
}

/// The `error` event that ends a stream.
fn error_event(error: &ToolError) -> Bytes {
    let data = json!({"error": error.report()});
    Bytes::from(format!("event: error\ndata: {data}\n\n"))
}

impl EventStream {
    /// Queues an event for each call not announced yet.
    fn take(&mut self, calls: Vec<Value>) {
        for call in calls {
            let Some(id) = call.get("callId").and_then(Value::as_str) else { continue };
            if self.seen.iter().any(|seen| seen == id) {
                continue;
            }
            self.seen.push(id.to_owned());
            let id = id.replace(['\r', '\n'], "");
            self.core
                .ready
                .push_back(Bytes::from(format!("event: tool_call\nid: {id}\ndata: {call}\n\n")));
        }
    }

    /// The next chunk of the stream; `None` at its end (the server shutting down, or a
    /// failure told in an `error` event).
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            let args = || {
                json!({
                    "waitMs": STREAM_POLL.as_millis() as u64,
                    "tools": self.tools,
                    "exclude": self.seen,
                })
            };
            let polled = match self.core.step(PENDING, args).await {
                Step::Send(chunk) => return Some(chunk),
                Step::End => return None,
                Step::Answer(polled) => polled,
            };
            match polled.and_then(|output| calls_of(&output)) {
                Ok(calls) if calls.is_empty() => self.prune().await,
                Ok(calls) => self.take(calls),
                Err(e) => self.core.fail(&e),
            }
        }
    }

    /// Forgets the announced calls that are no longer pending, so that `seen` stays as
    /// small as the calls waiting.
    async fn prune(&mut self) {
        if self.seen.is_empty() {
            return;
        }
        let args = json!({"tools": self.tools});
        let provider = &self.core.provider;
        let listed = provider.call(PENDING, args, &self.core.ctx).await;
        if let Ok(calls) = listed.and_then(|o| calls_of(&o)) {
            let pending: Vec<&str> =
                calls.iter().filter_map(|c| c.get("callId").and_then(Value::as_str)).collect();
            self.seen.retain(|id| pending.contains(&id.as_str()));
        }
    }
}

async fn tool_events(State(api): State<Api>, request: Request) -> Response {
    let Some(source) = api.shared.options().events.clone() else {
        return problem(StatusCode::NOT_FOUND, "this server streams no events");
    };
    let (parts, _) = request.into_parts();
    let query = match Query::parse(parts.uri.query(), &["run", "tool"]) {
        Ok(query) => query,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    let holder = parts.extensions.get::<KeyHolder>().map(|h| h.0.clone());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let stream = ToolEventStream {
        events: source.subscribe(),
        scope: EventScope::new(holder, query),
        gates: std::collections::HashMap::new(),
        tx,
        rx,
        shutdown: api.shutdown.clone(),
    };
    let body = futures::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), stream))
    });
    sse(Body::from_stream(body))
}

/// One `GET /api/events` stream: the source's events that its scope admits, each call's
/// `tool.progress` coalesced as MCP clients get it (at most one every
/// [`PROGRESS_INTERVAL`](super::progress::PROGRESS_INTERVAL), rising, the last one before
/// the call's `tool.done` or `tool.error`; see [`ProgressGate`]).
struct ToolEventStream {
    events: futures::stream::BoxStream<'static, ServedEvent>,
    scope: EventScope,
    /// The progress gate of each call whose progress passed and whose end has not.
    gates: std::collections::HashMap<u64, ProgressGate<ServedEvent>>,
    /// Where the events to send go, in their order: the gates' timers send from tasks of
    /// their own, so everything goes through this channel.
    tx: tokio::sync::mpsc::UnboundedSender<ServedEvent>,
    rx: tokio::sync::mpsc::UnboundedReceiver<ServedEvent>,
    shutdown: CancellationToken,
}

impl Report for ServedEvent {
    fn progress(&self) -> f64 {
        self.data.get("progress").and_then(Value::as_f64).unwrap_or(f64::NAN)
    }
}

impl ToolEventStream {
    /// The next chunk to send (an event or a keep-alive comment); `None` when the source
    /// or the server ends.
    async fn next(&mut self) -> Option<Bytes> {
        // One deadline for the whole wait: the events this stream does not pass (others'
        // runs, progress a gate holds back) send nothing, so they must not put it off, or
        // a quiet holder's stream sends no byte for as long as others are busy.
        let keep_alive = tokio::time::sleep(KEEP_ALIVE);
        tokio::pin!(keep_alive);
        loop {
            let event = tokio::select! {
                biased;
                Some(event) = self.rx.recv() => {
                    let chunk = format!("event: {}\ndata: {}\n\n", event.name, event.data);
                    return Some(Bytes::from(chunk));
                }
                () = self.shutdown.cancelled() => return None,
                next = futures::StreamExt::next(&mut self.events) => next?,
                () = &mut keep_alive => {
                    return Some(Bytes::from_static(KEEP_ALIVE_COMMENT));
                }
            };
            if self.scope.admits(&event) {
                self.pass(event);
            }
        }
    }

    /// Sends an admitted event: a progress event through its call's gate, a call's end
    /// after the progress its gate held back.
    fn pass(&mut self, event: ServedEvent) {
        if event.name == "tool.progress" && event.progress().is_finite() {
            if self.gates.len() >= MAX_OPEN && !self.gates.contains_key(&event.op_id) {
                // Ends missed when lagging: the gates are finished, as the scope forgets.
                for (_, gate) in self.gates.drain() {
                    gate.finish();
                }
            }
            let tx = &self.tx;
            let gate = self.gates.entry(event.op_id).or_insert_with(|| {
                let tx = tx.clone();
                ProgressGate::new(move |event| {
                    let _ = tx.send(event);
                })
            });
            gate.offer(event);
            return;
        }
        if let Some(gate) = self.gates.remove(&event.op_id) {
            gate.finish();
        }
        let _ = self.tx.send(event);
    }
}

/// Which events one stream passes: a key holder's runs only (all without keys), narrowed
/// to the query's runs and tools; a progress event when its call's start was passed.
struct EventScope {
    /// `key:NAME/`, the prefix of the holder's runs.
    holder: Option<String>,
    query: Query,
    /// The calls passed and not ended, whose progress passes.
    open: std::collections::HashSet<u64>,
}

/// The most calls a stream keeps open; past it (their ends missed when lagging), it
/// forgets them.
const MAX_OPEN: usize = 10_000;

impl EventScope {
    fn new(holder: Option<Arc<str>>, query: Query) -> EventScope {
        let holder = holder.map(|name| toolmux_core::holder_run_prefix(&name));
        EventScope { holder, query, open: std::collections::HashSet::new() }
    }

    fn admits(&mut self, event: &ServedEvent) -> bool {
        let Some(tool) = &event.tool else {
            return true; // `lagged`: no run, no tool, only a count
        };
        let Some(run) = &event.run_id else {
            return self.open.contains(&event.op_id);
        };
        let passes = self.holder.as_ref().is_none_or(|prefix| run.starts_with(prefix.as_str()))
            && (self.query.runs.is_empty() || self.query.runs.contains(run))
            && (self.query.tools.is_empty() || self.query.tools.contains(tool));
        if event.name == "tool.started" {
            if passes {
                if self.open.len() >= MAX_OPEN {
                    self.open.clear();
                }
                self.open.insert(event.op_id);
            }
        } else {
            self.open.remove(&event.op_id);
        }
        passes
    }
}

/// A response streaming `body` as server-sent events.
fn sse(body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies that buffer (nginx) would hold events back.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// What a request's query asks for.
#[derive(Debug, Default, PartialEq)]
struct Query {
    wait: Duration,
    tools: Vec<String>,
    runs: Vec<String>,
    offset: Option<u64>,
    limit: Option<u64>,
    since: Option<u64>,
}

impl Query {
    /// The query, whose parameters must be among `known` (`waitMs`, `tool`, `run`).
    fn parse(query: Option<&str>, known: &[&str]) -> Result<Query, String> {
        let mut parsed = Query::default();
        let list = |value: &str| -> Vec<String> {
            value.split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect()
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(key)?;
            let value = decode(value)?;
            if !known.contains(&key.as_str()) {
                let known: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
                return Err(format!(
                    "unknown query parameter `{key}`: expected {}",
                    known.join(" or ")
                ));
            }
            match key.as_str() {
                "waitMs" => {
                    let ms: u64 = value.parse().map_err(|_| {
                        format!("`waitMs` must be a number of milliseconds, not `{value}`")
                    })?;
                    parsed.wait = Duration::from_millis(ms).min(MAX_WAIT);
                }
                "offset" | "limit" | "since" => {
                    let n: u64 = value
                        .parse()
                        .map_err(|_| format!("`{key}` must be a whole number, not `{value}`"))?;
                    match key.as_str() {
                        "offset" => parsed.offset = Some(n),
                        "limit" => parsed.limit = Some(n),
                        _ => parsed.since = Some(n),
                    }
                }
                "tool" => parsed.tools.extend(list(&value)),
                _ => parsed.runs.extend(list(&value)),
            }
        }
        Ok(parsed)
    }
}

/// The gateway's tools behind the spaces routes.
const SPACES: &str = "gateway__spaces";
const READ_MESSAGES: &str = "gateway__read_messages";
const POST: &str = "gateway__post";
const CHANGES: &str = "gateway__changes";

/// Runs gateway tool `tool` for a spaces route; its JSON answer, or the response telling
/// what went wrong (404 when the server has no spaces, or for a space it does not have).
async fn gateway(
    api: &Api,
    parts: &axum::http::request::Parts,
    tool: &str,
    args: Value,
) -> Result<Value, Response> {
    let cancel = CancellationToken::new();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let ctx = context(parts, cancel);
    let served = provider(api, parts);
    let called = tokio::select! {
        called = served.call(tool, args, &ctx) => called,
        () = api.shutdown.cancelled() => {
            return Err(problem(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"));
        }
    };
    match called {
        Ok(output) if output.is_error => Err(failure(&ToolError::remote(tool, text_of(&output)))),
        Ok(output) => json_of(&output)
            .ok_or_else(|| failure(&ToolError::remote(tool, "the answer is not JSON"))),
        Err(ToolError::UnknownTool { .. }) => Err(problem(
            StatusCode::NOT_FOUND,
            "no spaces are served to this caller: add a `spaces` section to the configuration to \
             use this API (a key holder limited by `serve.holderTools` needs `gateway__*` there)",
        )),
        Err(e @ ToolError::NotFound { .. }) => Err(problem(StatusCode::NOT_FOUND, &e.report())),
        Err(e) => Err(failure(&e)),
    }
}

fn json_of(output: &ToolOutput) -> Option<Value> {
    output.content.iter().find_map(|part| match part {
        ContentPart::Json { value } => Some(value.clone()),
        ContentPart::Text { text } => serde_json::from_str(text).ok(),
        _ => None,
    })
}

async fn spaces(State(api): State<Api>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(message) = Query::parse(parts.uri.query(), &[]) {
        return problem(StatusCode::BAD_REQUEST, &message);
    }
    match gateway(&api, &parts, SPACES, json!({})).await {
        Ok(listing) => json_response(StatusCode::OK, &listing),
        Err(response) => response,
    }
}

async fn messages(State(api): State<Api>, Path(space): Path<String>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let query = match Query::parse(parts.uri.query(), &["offset", "limit"]) {
        Ok(query) => query,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    let mut args = json!({"space": space, "offset": query.offset.unwrap_or(0)});
    if let Some(limit) = query.limit {
        args["limit"] = json!(limit.clamp(1, 200));
    }
    match gateway(&api, &parts, READ_MESSAGES, args).await {
        Ok(page) => json_response(StatusCode::OK, &page),
        Err(response) => response,
    }
}

async fn post_message(
    State(api): State<Api>,
    Path(space): Path<String>,
    request: Request,
) -> Response {
    const SHAPE: &str = "send {\"author\": \"…\", \"text\": \"…\"}";
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        let message = format!("the body is over {} MiB, or was cut off", MAX_BODY >> 20);
        return problem(StatusCode::PAYLOAD_TOO_LARGE, &message);
    };
    let fields = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(fields)) => fields,
        Ok(_) => {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!("the body must be a JSON object: {SHAPE}"),
            );
        }
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!("the body is not JSON ({e}): {SHAPE}"),
            );
        }
    };
    if let Some(unknown) = fields.keys().find(|k| !["author", "text"].contains(&k.as_str())) {
        return problem(StatusCode::BAD_REQUEST, &format!("unknown field `{unknown}`: {SHAPE}"));
    }
    let (Some(Value::String(author)), Some(Value::String(text))) =
        (fields.get("author"), fields.get("text"))
    else {
        return problem(
            StatusCode::BAD_REQUEST,
            &format!("`author` and `text` (strings) are required: {SHAPE}"),
        );
    };
    let args = json!({"space": space, "author": author, "text": text});
    match gateway(&api, &parts, POST, args).await {
        Ok(message) => json_response(StatusCode::CREATED, &message),
        Err(response) => response,
    }
}

async fn space_events(
    State(api): State<Api>,
    Path(space): Path<String>,
    request: Request,
) -> Response {
    let (parts, _) = request.into_parts();
    let query = match Query::parse(parts.uri.query(), &["since"]) {
        Ok(query) => query,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    // A reconnecting client goes on from the last event it got.
    let last = parts.headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let since = query.since.or_else(|| last.and_then(|id| id.trim().parse().ok()));
    // The first answer answers the request: 404 for a space that does not exist, and where
    // the stream starts (from now on, unless told).
    let mut args = json!({"space": space});
    if let Some(since) = since {
        args["since"] = json!(since);
    }
    let first = match gateway(&api, &parts, CHANGES, args).await {
        Ok(first) => first,
        Err(response) => return response,
    };
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let served = provider(&api, &parts);
    let ctx = context(&parts, cancel);
    let mut stream =
        SpaceStream { core: StreamCore::new(api, served, ctx, guard), space, since: 0 };
    stream.take(&first);
    let body = futures::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(chunk), stream))
    });
    sse(Body::from_stream(body))
}

/// One stream of a space's changes: `message` events, each a message written or changed,
/// and the seeds' `tool.started`, `tool.done` and `tool.error` of the visible calls shown in
/// them, the message's revision as the id. No `tool.streaming`: the space a call is shown in
/// is known only when it runs, after its arguments were written (ARCHITECTURE.md says why),
/// so a call's argument fragments go to `GET /api/events` only.
struct SpaceStream {
    core: StreamCore,
    space: String,
    /// The revision the next poll goes on from.
    since: u64,
}

impl SpaceStream {
    /// Queues the events of a `gateway__changes` answer and goes on from its version: each
    /// named as the answer's `events` name it (`message`, `tool.started`, `tool.done`,
    /// `tool.error`), the message it is about as its data; an answer without `events`, one
    /// `message` event per message. A message's revision is the id of the last of its events
    /// only, so a client that reconnects after some of them gets them all again.
    fn take(&mut self, changes: &Value) {
        self.core.ready.extend(space_chunks(changes).into_iter().map(Bytes::from));
        if let Some(version) = changes.get("version").and_then(Value::as_u64) {
            self.since = version;
        }
    }

    async fn next(&mut self) -> Option<Bytes> {
        loop {
            let args = || {
                json!({
                    "space": self.space,
                    "since": self.since,
                    "waitMs": STREAM_POLL.as_millis() as u64,
                })
            };
            let polled = match self.core.step(CHANGES, args).await {
                Step::Send(chunk) => return Some(chunk),
                Step::End => return None,
                Step::Answer(polled) => polled,
            };
            let answer = polled.and_then(|output| {
                if output.is_error {
                    return Err(ToolError::remote(CHANGES, text_of(&output)));
                }
                json_of(&output).ok_or_else(|| ToolError::remote(CHANGES, "the answer is not JSON"))
            });
            match answer {
                Ok(changes) => self.take(&changes),
                Err(e) => self.core.fail(&e),
            }
        }
    }
}

/// The server-sent events of a `gateway__changes` answer ([`SpaceStream::take`]).
fn space_chunks(changes: &Value) -> Vec<String> {
    let messages = changes.get("messages").and_then(Value::as_array);
    let messages = messages.map(Vec::as_slice).unwrap_or_default();
    let named: Vec<(&str, &Value)> = match changes.get("events").and_then(Value::as_array) {
        Some(events) => events
            .iter()
            .filter_map(|event| {
                let name = event.get("event").and_then(Value::as_str)?;
                let is_name = !name.is_empty()
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
                // The message's index in the space, as each message gives its own.
                let index = event.get("index")?.as_u64()?;
                let message =
                    messages.iter().find(|m| m.get("index").and_then(Value::as_u64) == Some(index));
                Some((name, message?)).filter(|_| is_name)
            })
            .collect(),
        None => messages.iter().map(|message| ("message", message)).collect(),
    };
    let rev_of = |message: &Value| message.get("rev").and_then(Value::as_u64).unwrap_or(0);
    let chunks = named.iter().enumerate().map(|(at, (name, message))| {
        let rev = rev_of(message);
        if named.get(at + 1).is_none_or(|(_, next)| rev_of(next) != rev) {
            format!("event: {name}\nid: {rev}\ndata: {message}\n\n")
        } else {
            format!("event: {name}\ndata: {message}\n\n")
        }
    });
    chunks.collect()
}

/// A query value, `+` and percent escapes decoded.
fn decode(value: &str) -> Result<String, String> {
    let spaced = value.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("`{value}` does not decode to UTF-8"))
}

/// A submitted result.
#[derive(Debug, PartialEq)]
struct Submission {
    call_id: String,
    result: Value,
    is_error: bool,
}

impl Submission {
    fn parse(body: &[u8]) -> Result<Submission, String> {
        const SHAPE: &str =
            "send {\"callId\": \"…\", \"result\": <text or any JSON>, \"isError\": false}";
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| format!("the body is not JSON ({e}): {SHAPE}"))?;
        let Value::Object(mut fields) = value else {
            return Err(format!("the body must be a JSON object: {SHAPE}"));
        };
        if let Some(unknown) =
            fields.keys().find(|k| !["callId", "result", "isError"].contains(&k.as_str()))
        {
            return Err(format!("unknown field `{unknown}`: {SHAPE}"));
        }
        let call_id = match fields.remove("callId") {
            Some(Value::String(id)) if !id.is_empty() => id,
            _ => return Err(format!("`callId` (a non-empty string) is required: {SHAPE}")),
        };
        let Some(result) = fields.remove("result") else {
            return Err(format!("`result` is required: {SHAPE}"));
        };
        let is_error = match fields.remove("isError") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(other) => return Err(format!("`isError` must be true or false, not {other}")),
        };
        Ok(Submission { call_id, result, is_error })
    }
}

/// The `calls` of an `external__pending` output.
fn calls_of(output: &ToolOutput) -> Result<Vec<Value>, ToolError> {
    if output.is_error {
        return Err(ToolError::remote(PENDING, text_of(output)));
    }
    let listing = output.content.iter().find_map(|part| match part {
        ContentPart::Json { value } => Some(value.clone()),
        ContentPart::Text { text } => serde_json::from_str(text).ok(),
        _ => None,
    });
    match listing.as_ref().and_then(|l| l.get("calls")).and_then(Value::as_array) {
        Some(calls) => Ok(calls.clone()),
        None => Err(ToolError::remote(PENDING, "the listing has no `calls`")),
    }
}

fn text_of(output: &ToolOutput) -> String {
    output
        .content
        .iter()
        .filter_map(|part| match part {
            ContentPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The status a failed call is told with.
fn failure(error: &ToolError) -> Response {
    let status = match error {
        ToolError::UnknownTool { .. } => {
            return problem(
                StatusCode::NOT_FOUND,
                "no external tools are served to this caller: configure `externalTools` to use this \
                 API (a key holder limited by `serve.holderTools` needs `external__*` there)",
            );
        }
        ToolError::InvalidArguments { .. } => StatusCode::BAD_REQUEST,
        ToolError::NotFound { .. } => StatusCode::NOT_FOUND,
        ToolError::Gone { .. } => StatusCode::GONE,
        ToolError::Denied { .. } => StatusCode::FORBIDDEN,
        ToolError::RateLimited { .. }
        | ToolError::QueueBusy { .. }
        | ToolError::QueueFull { .. }
        | ToolError::BudgetExhausted { .. } => StatusCode::TOO_MANY_REQUESTS,
        ToolError::Timeout { .. } | ToolError::DeadlineExceeded { .. } => {
            StatusCode::GATEWAY_TIMEOUT
        }
        ToolError::Cancelled { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_GATEWAY,
    };
    problem(status, &error.report())
}

fn problem(status: StatusCode, message: &str) -> Response {
    json_response(status, &json!({ "error": message }))
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Refuses requests whose `Host`, or `Origin` when sent, is not on an allowed host (as
/// rmcp does for `/mcp`), against DNS rebinding.
pub(crate) async fn check_host(
    State(hosts): State<Arc<[String]>>,
    request: Request,
    next: Next,
) -> Response {
    match host_refusal(&hosts, request.headers()) {
        Some(why) => problem(StatusCode::FORBIDDEN, why),
        None => next.run(request).await,
    }
}

/// Whether `headers` name an allowed `Host` and, when they have one, `Origin` (`hosts`
/// empty: any).
pub(crate) fn host_allowed(hosts: &[String], headers: &axum::http::HeaderMap) -> bool {
    host_refusal(hosts, headers).is_none()
}

/// Why `headers` are refused by [`check_host`]; `None` when they are not.
fn host_refusal(hosts: &[String], headers: &axum::http::HeaderMap) -> Option<&'static str> {
    if hosts.is_empty() {
        return None;
    }
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    if !host.is_some_and(|h| allowed(hosts, h)) {
        return Some("forbidden: the Host header is not allowed");
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let authority = origin
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")));
        if !authority.is_some_and(|a| allowed_host_only(hosts, a)) {
            return Some("forbidden: the Origin is not allowed");
        }
    }
    None
}

/// Whether `authority` (`host` or `host:port`) is allowed: an entry with a port must match
/// whole, one without matches any port.
fn allowed(hosts: &[String], authority: &str) -> bool {
    let authority = authority.to_ascii_lowercase();
    let bare = host_part(&authority);
    hosts.iter().any(|allowed| {
        let allowed = allowed.to_ascii_lowercase();
        let allowed = allowed.trim_start_matches('[').trim_end_matches(']');
        allowed == authority || allowed == bare
    })
}

/// Whether the host of `authority` is allowed, whatever its port (an origin's port is its
/// page's).
fn allowed_host_only(hosts: &[String], authority: &str) -> bool {
    let authority = authority.to_ascii_lowercase();
    let bare = host_part(&authority);
    hosts.iter().any(|allowed| {
        let allowed = allowed.to_ascii_lowercase();
        host_part(&allowed) == bare
    })
}

/// The host of `host`, `host:port`, `[v6]` or `[v6]:port`, without brackets.
fn host_part(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(host, _)| host);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => authority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_or_say_what_is_wrong() {
        let listing = |q| Query::parse(Some(q), &["waitMs", "tool"]);
        assert_eq!(Query::parse(None, &[]), Ok(Query::default()));
        let q = listing("waitMs=1500&tool=external__a,external__b&tool=x%5Fy").unwrap();
        assert_eq!(q.wait, Duration::from_millis(1500));
        assert_eq!(q.tools, ["external__a", "external__b", "x_y"]);
        assert_eq!(listing("waitMs=999999").unwrap().wait, MAX_WAIT);
        assert!(listing("waitMs=soon").unwrap_err().contains("`waitMs`"));
        let wrong = listing("wait=1").unwrap_err();
        assert!(wrong.contains("unknown query parameter `wait`: expected `waitMs` or `tool`"));
        let q = Query::parse(Some("run=key%3Aci%2Fr1&run=api"), &["run"]).unwrap();
        assert_eq!(q.runs, ["key:ci/r1", "api"]);
    }

    /// A space's events are named as its changes name them; a message's revision is the id
    /// of its last event only; names that could break the stream are left out.
    #[test]
    fn a_space_s_events_are_named_by_its_changes() {
        let messages = json!([{"index": 3, "rev": 4}, {"index": 0, "rev": 5}]);
        let events = json!([
            {"event": "message", "index": 3},
            {"event": "tool.done", "index": 3},
            {"event": "message", "index": 0},
            {"event": "bad\nid: 99", "index": 0},
            {"event": "tool.started", "index": 1},
            {"event": "tool.started", "index": 0},
        ]);
        let chunks = space_chunks(&json!({"messages": messages, "events": events}));
        let (first, second) = (&messages[0], &messages[1]);
        assert_eq!(
            chunks,
            [
                format!("event: message\ndata: {first}\n\n"),
                format!("event: tool.done\nid: 4\ndata: {first}\n\n"),
                format!("event: message\ndata: {second}\n\n"),
                format!("event: tool.started\nid: 5\ndata: {second}\n\n"),
            ]
        );
        // An answer without events: one `message` event per message.
        let chunks = space_chunks(&json!({"messages": messages}));
        assert_eq!(
            chunks,
            [
                format!("event: message\nid: 4\ndata: {first}\n\n"),
                format!("event: message\nid: 5\ndata: {second}\n\n"),
            ]
        );
    }

    fn event(name: &'static str, op_id: u64, run: Option<&str>, tool: &str) -> ServedEvent {
        ServedEvent {
            name,
            op_id,
            run_id: run.map(String::from),
            tool: Some(tool.to_owned()),
            data: json!({"opId": op_id}),
        }
    }

    #[test]
    fn a_key_holder_sees_its_own_runs_events_and_their_progress_only() {
        let mut scope = EventScope::new(Some("alice".into()), Query::default());
        assert!(scope.admits(&event("tool.started", 1, Some("key:alice/r1"), "fs__grep")));
        assert!(!scope.admits(&event("tool.started", 2, Some("key:bob/r1"), "fs__grep")));
        assert!(!scope.admits(&event("tool.started", 3, Some("key:alicex/r1"), "fs__grep")));
        assert!(scope.admits(&event("tool.progress", 1, None, "fs__grep")));
        assert!(!scope.admits(&event("tool.progress", 2, None, "fs__grep")));
        assert!(scope.admits(&event("tool.done", 1, Some("key:alice/r1"), "fs__grep")));
        // The call ended: no progress of it is expected, and its op is forgotten.
        assert!(!scope.admits(&event("tool.progress", 1, None, "fs__grep")));
        let lagged = ServedEvent {
            name: "lagged",
            op_id: 0,
            run_id: None,
            tool: None,
            data: json!({"missed": 3}),
        };
        assert!(scope.admits(&lagged));
    }

    /// A holder whose stream passes nothing gets a keep-alive comment every
    /// [`KEEP_ALIVE`] however busy others are: the events it does not pass do not put the
    /// comment off. (Each of them started the wait over, so a stream of others' events
    /// more often than every 15 s kept the stream silent until a proxy cut it.)
    #[tokio::test(start_paused = true)]
    async fn others_events_do_not_put_off_a_keep_alive() {
        let (events, others) = tokio::sync::mpsc::unbounded_channel();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut stream = ToolEventStream {
            events: Box::pin(futures::stream::unfold(others, |mut others| async move {
                Some((others.recv().await?, others))
            })),
            scope: EventScope::new(Some("alice".into()), Query::default()),
            gates: std::collections::HashMap::new(),
            tx,
            rx,
            shutdown: CancellationToken::new(),
        };
        let busy = tokio::spawn(async move {
            for op in 1.. {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let started = event("tool.started", op, Some("key:bob/r1"), "fs__grep");
                if events.send(started).is_err() {
                    return;
                }
            }
        });
        for _ in 0..3 {
            let chunk = tokio::time::timeout(KEEP_ALIVE + Duration::from_secs(1), stream.next())
                .await
                .expect("a keep-alive comment within its interval");
            assert_eq!(chunk.as_deref(), Some(KEEP_ALIVE_COMMENT));
        }
        busy.abort();
    }

    /// A stream whose polls answer with nothing to send more often than every
    /// [`KEEP_ALIVE`] still sends a keep-alive comment every [`KEEP_ALIVE`]: the answers
    /// do not put it off. (Each poll started the wait over, so such a stream sent nothing
    /// for as long as its polls kept answering, and 25 s between comments when they
    /// answered at [`STREAM_POLL`].)
    #[tokio::test(start_paused = true)]
    async fn polls_answering_nothing_do_not_put_off_a_keep_alive() {
        use toolmux_core::{ToolKind, ToolSet, ToolSpec};
        let tools = ToolSet::new("t", ToolKind::Builtin).with_tool(
            ToolSpec::new("poll", "Answers nothing new after 10 s", json!({"type": "object"})),
            |_, _| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(ToolOutput::text("nothing new"))
            },
        );
        let provider: Arc<dyn ToolProvider> = Arc::new(tools);
        let shared = Shared::new(provider.clone(), super::super::ServeOptions::default());
        let api = Api { shared, shutdown: CancellationToken::new() };
        let guard = CancellationToken::new().drop_guard();
        let mut core = StreamCore::new(api, provider, CallContext::new(), guard);
        for _ in 0..3 {
            let next_chunk = async {
                loop {
                    match core.step("poll", || json!({})).await {
                        Step::Send(chunk) => return chunk,
                        Step::Answer(answer) => assert!(answer.is_ok(), "{answer:?}"),
                        Step::End => panic!("the stream ended"),
                    }
                }
            };
            let chunk = tokio::time::timeout(KEEP_ALIVE + Duration::from_secs(1), next_chunk)
                .await
                .expect("a keep-alive comment within its interval");
            assert_eq!(chunk, KEEP_ALIVE_COMMENT);
        }
    }

    #[test]
    fn runs_and_tools_narrow_the_stream() {
        let query =
            Query { runs: vec!["r1".into()], tools: vec!["fs__grep".into()], ..Query::default() };
        let mut scope = EventScope::new(None, query);
        assert!(scope.admits(&event("tool.started", 1, Some("r1"), "fs__grep")));
        assert!(!scope.admits(&event("tool.started", 2, Some("r2"), "fs__grep")));
        assert!(!scope.admits(&event("tool.started", 3, Some("r1"), "fs__read")));
        assert!(scope.admits(&event("tool.error", 1, Some("r1"), "fs__grep")));
    }

    #[test]
    fn submissions_parse_or_say_what_is_wrong() {
        let ok = Submission::parse(br#"{"callId": "c1", "result": {"a": 1}, "isError": true}"#);
        assert_eq!(
            ok,
            Ok(Submission { call_id: "c1".into(), result: json!({"a": 1}), is_error: true })
        );
        let text = Submission::parse(br#"{"callId": "c1", "result": "done"}"#).unwrap();
        assert!(!text.is_error);
        for (body, expected) in [
            (&b"not json"[..], "not JSON"),
            (b"[1]", "JSON object"),
            (br#"{"result": 1}"#, "`callId`"),
            (br#"{"callId": "", "result": 1}"#, "`callId`"),
            (br#"{"callId": "c"}"#, "`result` is required"),
            (br#"{"callId": "c", "result": 1, "isError": "yes"}"#, "`isError`"),
            (br#"{"callId": "c", "result": 1, "status": "ok"}"#, "unknown field `status`"),
        ] {
            let error = Submission::parse(body).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn hosts_match_with_or_without_ports() {
        let hosts: Vec<String> =
            ["127.0.0.1", "localhost", "::1", "example.com:8080"].map(String::from).into();
        assert!(allowed(&hosts, "127.0.0.1:4000"));
        assert!(allowed(&hosts, "LOCALHOST"));
        assert!(allowed(&hosts, "[::1]:4000"));
        assert!(allowed(&hosts, "example.com:8080"));
        assert!(!allowed(&hosts, "example.com:9090"));
        assert!(!allowed(&hosts, "evil.example:80"));
        assert!(allowed_host_only(&hosts, "example.com:3000"));
        assert!(allowed_host_only(&hosts, "[::1]:3000"));
        assert!(!allowed_host_only(&hosts, "evil.example"));
    }
}
