//! The sessions of streamable HTTP: rmcp's session manager, with streams that resume
//! after a disconnect and sessions that live while they are used.
//!
//! A client that lost the stream of a request (or its `GET` stream) reconnects with `GET`
//! and `Last-Event-ID`, and gets the events after that one, then the rest as they come, as
//! the streamable HTTP transport lets a server offer. rmcp's own session manager keeps
//! each stream's recent events too, but not past the end of a request: the response of a
//! call whose client was away when it ended was lost (the resume found no stream and
//! answered an empty one), and a resume repeated the event the client named. Here every
//! event of a session's streams is kept by [`EventLog`] (rmcp's hook for a store of
//! events), under ids of its own, for a while after its stream ended; [`Sessions`] serves
//! `Last-Event-ID` from it. Stateless (2026-07-28) requests are left as rmcp serves them:
//! a store that rmcp knows of would also make their calls outlive their connection, which
//! is how such a client cancels one.
//!
//! A session's `GET` streams are served from the log too: its messages go to the latest
//! one opened (a client reopens it after a network blip the server may not have noticed),
//! and earlier ones stay open without them, as MCP sends each message on one stream.
//! rmcp kept sending to the first while it seemed alive, gave later ones nothing, and
//! lost what it sent once the first turned out dead.
//!
//! rmcp ends a session after five minutes without a message in or out, even while a call
//! runs (its answer was lost, and the session's next request answered 500) or the client
//! listens on its `GET` stream. Here a session ends when it has had no request and no
//! open stream for [`ServeOptions::session_idle`](super::ServeOptions::session_idle).
//!
//! A session that ends (deleted, unused, its rmcp worker gone, or the server shutting
//! down) cancels its calls at once, through the [`SessionClosed`] its requests carry: rmcp
//! cancelled them only after waiting up to 5 s for them to answer. One whose worker ended
//! is not found from then on (rmcp kept it in its table until that wait was over, and
//! answered its requests 500), so that its client starts another.
//!
//! A resumption names an event of one of the session's own streams: an event of another
//! session's stream is refused ([`Sessions::check_resume`]), not replayed.

use super::handler::SessionClosed;
use rmcp::RoleServer;
use rmcp::model::GetExtensions as _;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionError,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use rmcp::transport::streamable_http_server::{RestoreOutcome, SessionId, SessionManager};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Events kept a stream, at most: a resume from before the oldest is refused.
const EVENTS_KEPT: usize = 256;
/// How long a request's stream is kept once its response is in it.
const ENDED_KEPT: Duration = Duration::from_secs(60);
/// Ended streams kept at most, the latest: a result may be large, and a busy client ends
/// many calls a minute.
const ENDED_MAX: usize = 128;
/// How long a stream is kept without a new event (a session's `GET` stream whose session
/// ended without a `DELETE`, a request that never answered).
const IDLE_KEPT: Duration = Duration::from_secs(30 * 60);
/// How often old streams are looked for, at most.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// The retry interval told to a client with the first event of a resumable stream.
const RETRY: Duration = Duration::from_secs(3);

/// Every event of the sessions' streams, by stream, for a while (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    streams: HashMap<String, Kept>,
    /// The streams that ended, oldest first (some may be gone already).
    ended: VecDeque<String>,
    swept: Option<Instant>,
}

/// One stream's events.
#[derive(Debug)]
struct Kept {
    /// The last events, oldest first; the last has index `last`.
    events: VecDeque<ServerSseMessage>,
    /// The index of the last event (the first event has index 1; 0: none yet).
    last: u64,
    /// When the stream's response was added (a request's stream ends with it).
    ended: Option<Instant>,
    touched: Instant,
    /// Tells followers of the stream that it has more (or ended); dropped with the stream.
    changed: watch::Sender<()>,
    /// The session of a request's stream, once one of its events went to the client (a
    /// session's `GET` stream is named after its session).
    session: Option<SessionId>,
}

/// An event id as this log gives it: the stream and the event's index in it.
fn event_id(stream: &str, index: u64) -> String {
    format!("{stream}/{index}")
}

/// The stream and index of an event id this log gave.
fn parse_event_id(id: &str) -> Option<(&str, u64)> {
    let (stream, index) = id.rsplit_once('/')?;
    Some((stream, index.parse().ok()?))
}

/// The stream rmcp keeps for a session's `GET` requests.
fn common_stream(session: &str) -> String {
    format!("{session}:common")
}

impl LogState {
    fn sweep(&mut self, now: Instant) {
        if self.swept.is_some_and(|at| now.duration_since(at) < SWEEP_EVERY) {
            return;
        }
        self.swept = Some(now);
        self.streams.retain(|_, kept| {
            kept.ended.is_none_or(|at| now.duration_since(at) < ENDED_KEPT)
                && now.duration_since(kept.touched) < IDLE_KEPT
        });
        let streams = &self.streams;
        self.ended.retain(|stream| streams.contains_key(stream));
    }

    fn stream(&mut self, stream: &str, now: Instant) -> &mut Kept {
        self.streams.entry(stream.to_owned()).or_insert_with(|| Kept {
            events: VecDeque::new(),
            last: 0,
            ended: None,
            touched: now,
            changed: watch::Sender::new(()),
            session: None,
        })
    }
}

impl EventLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The id of the last event of `stream` so far (before any: index 0).
    fn last_id(&self, stream: &str) -> String {
        let now = Instant::now();
        let mut state = self.lock();
        event_id(stream, state.stream(stream, now).last)
    }

    /// The events of `stream` after index `after`, the index of the last of them, and
    /// whether the stream ended; `None` when the stream is not kept, or no longer has the
    /// event after `after`.
    fn after(&self, stream: &str, after: u64) -> Option<(Vec<ServerSseMessage>, u64, bool)> {
        let state = self.lock();
        let kept = state.streams.get(stream)?;
        let first = kept.last + 1 - kept.events.len() as u64;
        if after > kept.last || after + 1 < first {
            return None;
        }
        let skip = usize::try_from(after + 1 - first).ok()?;
        let events = kept.events.iter().skip(skip).cloned().collect();
        Some((events, kept.last, kept.ended.is_some()))
    }

    /// A receiver told of every change of `stream`; `None` when it is not kept.
    fn watch(&self, stream: &str) -> Option<watch::Receiver<()>> {
        Some(self.lock().streams.get(stream)?.changed.subscribe())
    }

    /// Notes that `stream` is a stream of `session`.
    fn own(&self, stream: &str, session: &SessionId) {
        if let Some(kept) = self.lock().streams.get_mut(stream)
            && kept.session.is_none()
        {
            kept.session = Some(session.clone());
        }
    }

    /// The session of `stream`, when it is kept and its session known.
    fn owner(&self, stream: &str) -> Option<SessionId> {
        self.lock().streams.get(stream)?.session.clone()
    }

    /// Forgets `stream`.
    fn forget(&self, stream: &str) {
        self.lock().streams.remove(stream);
    }
}

#[async_trait::async_trait]
impl EventStore for EventLog {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<String, EventStoreError> {
        let now = Instant::now();
        let mut state = self.lock();
        state.sweep(now);
        let kept = state.stream(stream_id, now);
        kept.last += 1;
        kept.touched = now;
        let id = event_id(stream_id, kept.last);
        let mut event = event.clone();
        event.event_id = Some(id.clone());
        // A request's stream ends with its response (rmcp closes it then).
        let ends = matches!(
            event.message.as_deref(),
            Some(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))
        );
        let ended = ends && !stream_id.ends_with(":common") && kept.ended.is_none();
        if ended {
            kept.ended = Some(now);
        }
        kept.events.push_back(event);
        if kept.events.len() > EVENTS_KEPT {
            kept.events.pop_front();
        }
        kept.changed.send_replace(());
        if ended {
            state.ended.push_back(stream_id.to_owned());
            while state.ended.len() > ENDED_MAX {
                if let Some(oldest) = state.ended.pop_front() {
                    state.streams.remove(&oldest);
                }
            }
        }
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        // Not used: `Sessions` answers resumptions itself, and tells rmcp of no store.
        let _ = last_event_id;
        Err("events are replayed by the session manager".into())
    }
}

/// rmcp's session manager, with resumptions served from an [`EventLog`] and sessions
/// ended when unused (see the module's docs).
#[derive(Debug)]
pub(crate) struct Sessions {
    inner: LocalSessionManager,
    log: Arc<EventLog>,
    /// When each session was last used, and its streams open now; a session is here from
    /// its creation until it ends.
    usage: Arc<Mutex<HashMap<SessionId, Usage>>>,
    /// Cancelled when the server shuts down: every session ends then.
    shutdown: CancellationToken,
    /// Where the sessions are recorded as this replica's, when they are shared with others.
    registry: Option<Arc<super::affinity::Registry>>,
    /// The most sessions held at once (see [`Sessions::make_room`]).
    max: usize,
}

/// How a session is used.
#[derive(Debug)]
struct Usage {
    /// The last request, or the end of the last stream.
    last: Instant,
    /// Streams open to the client (responses being sent, `GET` streams).
    open: usize,
    /// Counts the session's `GET` streams: the latest is the one its messages go to.
    listener: u64,
    /// Cancelled when the session ends: its calls are cancelled (see [`SessionClosed`]).
    closed: CancellationToken,
    /// The API key holder whose request made the session, over HTTP with keys: it goes
    /// with the session, so nothing is kept of sessions that ended.
    holder: Option<Arc<str>>,
}

impl Drop for Usage {
    fn drop(&mut self) {
        // Removed from the table: the session ended, one way or another.
        self.closed.cancel();
    }
}

impl Sessions {
    /// Sessions that end after `idle` unused, looked for until `shutdown`, at most `max`
    /// at once. With `registry`, each session is recorded there while it lives.
    pub(crate) fn new(
        idle: Duration,
        max: usize,
        shutdown: CancellationToken,
        registry: Option<Arc<super::affinity::Registry>>,
    ) -> Arc<Sessions> {
        let log = Arc::new(EventLog::default());
        let mut inner = LocalSessionManager::default().with_event_store(log.clone());
        // Ended here, by use rather than by messages (see the module's docs).
        inner.session_config.keep_alive = None;
        let sessions = Arc::new(Sessions {
            inner,
            log,
            usage: Arc::default(),
            shutdown: shutdown.clone(),
            registry: registry.clone(),
            max: max.max(1),
        });
        if let Some(registry) = registry {
            // Records are renewed while their sessions live; those of sessions that ended
            // without `close_session` (their worker gone) are removed here.
            let usage = Arc::downgrade(&sessions.usage);
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(super::affinity::Registry::renew_every()) => {}
                    }
                    let Some(usage) = usage.upgrade() else { break };
                    let live: std::collections::HashSet<String> = {
                        let usage = usage.lock().unwrap_or_else(|e| e.into_inner());
                        usage.keys().map(|id| id.to_string()).collect()
                    };
                    registry.renew(|id| live.contains(id)).await;
                }
            });
        }
        let weak = Arc::downgrade(&sessions);
        let every = (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(every) => {}
                }
                let Some(sessions) = weak.upgrade() else { break };
                sessions.end_unused(idle).await;
            }
        });
        sessions
    }

    /// Ends the sessions unused for `idle`.
    async fn end_unused(&self, idle: Duration) {
        let now = Instant::now();
        let unused: Vec<SessionId> = {
            let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
            usage
                .iter()
                .filter(|(_, u)| u.open == 0 && now.duration_since(u.last) >= idle)
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in unused {
            tracing::debug!(target: "toolmux::serve", session = %id, "session unused for {idle:?}; ended");
            let _ = self.close_session(&id).await;
        }
    }

    /// The most sessions held at once.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Makes room for one more session when [`Sessions::max`] are held: ends the one unused
    /// the longest (no stream open to its client), or, when every one is in use, says so.
    async fn make_room(&self) -> Result<(), ResumeError> {
        let unused = {
            let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
            if usage.len() < self.max {
                return Ok(());
            }
            usage
                .iter()
                .filter(|(_, u)| u.open == 0)
                .min_by_key(|(_, u)| u.last)
                .map(|(id, _)| id.clone())
        };
        let Some(id) = unused else {
            tracing::warn!(target: "toolmux::serve", max = self.max, "every MCP session is in use; a new one was refused");
            return Err(ResumeError::Full(self.max));
        };
        tracing::debug!(target: "toolmux::serve", session = %id, "the session unused the longest was ended to make room for a new one");
        self.close_session(&id).await
    }

    /// The end of session `id`, for its requests' extensions; `None` once it ended.
    fn closed(&self, id: &SessionId) -> Option<SessionClosed> {
        let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        Some(SessionClosed(usage.get(id)?.closed.clone()))
    }

    /// Hands a request of session `id` its session's end (see [`SessionClosed`]).
    fn with_closed(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> ClientJsonRpcMessage {
        if let ClientJsonRpcMessage::Request(request) = &mut message
            && let Some(closed) = self.closed(id)
        {
            request.request.extensions_mut().insert(closed);
        }
        message
    }

    /// Ends session `id` here when rmcp's `result` says its worker is gone (its handle is
    /// still in rmcp's table until rmcp's drain is over): it is not found from then on.
    fn checked<T>(
        &self,
        id: &SessionId,
        result: Result<T, LocalSessionManagerError>,
    ) -> Result<T, ResumeError> {
        if let Err(LocalSessionManagerError::SessionError(SessionError::SessionServiceTerminated)) =
            &result
        {
            tracing::debug!(target: "toolmux::serve", session = %id, "the session's worker ended");
            ended(&self.usage, id);
        }
        Ok(result?)
    }

    /// Why a `GET` of session `id` resuming after `last_event_id` is refused: the event is
    /// of another session's stream. `None` when it is not (an event no longer kept is
    /// answered as rmcp answers it, with an empty stream).
    pub(crate) fn check_resume(&self, id: &SessionId, last_event_id: &str) -> Option<String> {
        let (stream, _) = parse_event_id(last_event_id)?;
        let foreign = if stream.ends_with(":common") {
            stream != common_stream(id)
        } else {
            self.log.owner(stream).is_some_and(|owner| owner != *id)
        };
        foreign.then(|| {
            format!(
                "Bad Request: the `Last-Event-ID` `{last_event_id}` is an event of another \
                 session's stream: resume with an event id this session's streams gave, or \
                 open its stream without `Last-Event-ID`"
            )
        })
    }

    /// Records `holder` as the key holder of session `id`, unless one is recorded already
    /// or the session has ended.
    pub(crate) fn hold(&self, id: &str, holder: Arc<str>) {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(usage) = usage.get_mut(id) {
            usage.holder.get_or_insert(holder);
        }
    }

    /// The key holder recorded for session `id` ([`Sessions::hold`]), while it lives.
    pub(crate) fn holder(&self, id: &str) -> Option<Arc<str>> {
        let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        usage.get(id)?.holder.clone()
    }

    /// How many sessions have a key holder recorded.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        let usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        usage.values().filter(|usage| usage.holder.is_some()).count()
    }

    /// Notes a request of session `id`.
    fn touch(&self, id: &SessionId) {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(usage) = usage.get_mut(id) {
            usage.last = Instant::now();
        }
    }

    /// `stream`, counted as open in session `id` until it is dropped.
    fn tracked(
        &self,
        id: &SessionId,
        stream: impl futures::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
    ) -> Tracked {
        {
            let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(usage) = usage.get_mut(id) {
                usage.open += 1;
                usage.last = Instant::now();
            }
        }
        Tracked {
            stream: Box::pin(stream),
            _open: Open { usage: self.usage.clone(), id: id.clone() },
        }
    }
}

/// Ends session `id` in `usage` (cancelling its calls), if it has not ended yet.
fn ended(usage: &Mutex<HashMap<SessionId, Usage>>, id: &SessionId) {
    let removed = usage.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    drop(removed);
}

/// rmcp's transport of a session (its worker), which ends the session here the moment the
/// worker is gone: rmcp learns it only after its drain, up to 5 s later.
pub(crate) struct SessionTransport {
    inner: <LocalSessionManager as SessionManager>::Transport,
    usage: Arc<Mutex<HashMap<SessionId, Usage>>>,
    id: SessionId,
}

impl rmcp::transport::Transport<RoleServer> for SessionTransport {
    type Error =
        <<LocalSessionManager as SessionManager>::Transport as rmcp::transport::Transport<
            RoleServer,
        >>::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        let message = self.inner.receive().await;
        if message.is_none() {
            // The worker ended (deleted, or gone on its own).
            ended(&self.usage, &self.id);
        }
        message
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

/// A stream to the client, counted as open while it is not dropped.
struct Tracked {
    stream: std::pin::Pin<Box<dyn futures::Stream<Item = ServerSseMessage> + Send + Sync>>,
    _open: Open,
}

impl futures::Stream for Tracked {
    type Item = ServerSseMessage;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<ServerSseMessage>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// Counts a stream of a session as open until dropped.
struct Open {
    usage: Arc<Mutex<HashMap<SessionId, Usage>>>,
    id: SessionId,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(usage) = usage.get_mut(&self.id) {
            usage.open = usage.open.saturating_sub(1);
            usage.last = Instant::now();
        }
    }
}

/// Why a resumption is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResumeError {
    /// rmcp's.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    /// The event named is not kept (any more), or not of the session's streams.
    #[error("no event `{0}` to resume after is kept for this session")]
    Unknown(String),
    /// As many sessions as allowed are held, and every one is in use.
    #[error("{FULL}: all {0} sessions are in use")]
    Full(usize),
}

/// What a refusal of a new session for want of room says, which `http.rs` finds in rmcp's
/// answer to turn it into a `503`.
pub(crate) const FULL: &str = "no room for another session";

/// A stream of events sent by a task, ending when the task does.
fn channel_stream(
    mut events: mpsc::Receiver<ServerSseMessage>,
) -> impl futures::Stream<Item = ServerSseMessage> + Send + Sync + 'static {
    futures::stream::poll_fn(move |cx| events.poll_recv(cx))
}

impl Sessions {
    /// A stream's events after index `after`: what is kept, then what comes, until the
    /// stream ends (a request's, with its response) or, for a session's `GET` stream,
    /// while `current` holds (a newer `GET` stream takes the messages from then on; this
    /// one stays open, as the client may keep both).
    fn follow(
        &self,
        stream: String,
        after: u64,
        current: impl Fn() -> bool + Send + 'static,
    ) -> Option<mpsc::Receiver<ServerSseMessage>> {
        let mut changes = self.log.watch(&stream)?;
        let (first, mut at, mut ended) = self.log.after(&stream, after)?;
        let (tx, rx) = mpsc::channel(first.len().max(16));
        let log = self.log.clone();
        tokio::spawn(async move {
            let mut events = first;
            loop {
                for event in events {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
                if ended {
                    return;
                }
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                }
                if !current() {
                    tx.closed().await;
                    return;
                }
                let Some(more) = log.after(&stream, at) else { return };
                (events, at, ended) = more;
            }
        });
        Some(rx)
    }

    /// The session's `GET` stream after index `after`, as the one its messages go to.
    fn listen(&self, id: &SessionId, after: u64) -> Option<Tracked> {
        let stream = common_stream(id);
        let generation = {
            let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
            let usage = usage.get_mut(id)?;
            usage.listener += 1;
            usage.listener
        };
        let usage = Arc::downgrade(&self.usage);
        let key = id.clone();
        let current = move || {
            let Some(usage) = usage.upgrade() else { return false };
            let usage = usage.lock().unwrap_or_else(|e| e.into_inner());
            usage.get(&key).is_some_and(|u| u.listener == generation)
        };
        let events = self.follow(stream, after, current)?;
        Some(self.tracked(id, channel_stream(events)))
    }
}

#[cfg(test)]
impl Sessions {
    /// rmcp's handle of session `id`, for tests that end its worker alone.
    pub(crate) async fn rmcp_handle(
        &self,
        id: &str,
    ) -> Option<rmcp::transport::streamable_http_server::session::local::LocalSessionHandle> {
        self.inner.sessions.read().await.get(id).cloned()
    }
}

impl SessionManager for Sessions {
    type Error = ResumeError;
    type Transport = SessionTransport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.make_room().await?;
        let (id, inner) = self.inner.create_session().await?;
        let closed = self.shutdown.child_token();
        let usage = Usage { last: Instant::now(), open: 0, listener: 0, closed, holder: None };
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), usage);
        let transport = SessionTransport { inner, usage: self.usage.clone(), id: id.clone() };
        if let Some(registry) = &self.registry {
            registry.claim(&id).await;
        }
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        let message = self.with_closed(id, message);
        let initialized = self.inner.initialize_session(id, message).await;
        self.checked(id, initialized)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        // rmcp keeps a session whose worker ended until its drain is over; it ended here.
        let live = self.usage.lock().unwrap_or_else(|e| e.into_inner()).contains_key(id);
        Ok(live && self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.log.forget(&common_stream(id));
        ended(&self.usage, id);
        if let Some(registry) = &self.registry {
            registry.release(id).await;
        }
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl futures::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>
    {
        use futures::StreamExt as _;
        let message = self.with_closed(id, message);
        let created = self.inner.create_stream(id, message).await;
        let stream = self.checked(id, created)?;
        // The stream is this session's: a resumption after one of its events must come
        // with this session's id (see `check_resume`). Its first event names it.
        let log = self.log.clone();
        let session = id.clone();
        let mut owned = false;
        let stream = stream.inspect(move |event| {
            if !owned && let Some((stream, _)) = event.event_id.as_deref().and_then(parse_event_id)
            {
                log.own(stream, &session);
                owned = true;
            }
        });
        Ok(self.tracked(id, stream))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.touch(id);
        let accepted = self.inner.accept_message(id, message).await;
        self.checked(id, accepted)
    }

    /// The session's messages from now on, from the log rather than from rmcp's channel
    /// (which kept sending to the first stream while it seemed alive, and gave a later one
    /// nothing); first, where in the session's stream it starts, so that the client can
    /// resume from there (rmcp gives every such stream the id `0`).
    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl futures::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>
    {
        use futures::StreamExt as _;
        let start = self.log.last_id(&common_stream(id));
        let after = parse_event_id(&start).map_or(0, |(_, index)| index);
        let live = self.listen(id, after).ok_or_else(|| ResumeError::Unknown(start.clone()))?;
        let start = ServerSseMessage::priming(start, RETRY);
        Ok(futures::stream::once(std::future::ready(start)).chain(live))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl futures::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>
    {
        let unknown = || ResumeError::Unknown(last_event_id.clone());
        let (stream, after) = parse_event_id(&last_event_id).ok_or_else(unknown)?;
        let common = common_stream(id);
        if stream.ends_with(":common") && stream != common {
            return Err(unknown());
        }
        if stream == common {
            return self.listen(id, after).ok_or_else(unknown);
        }
        if self.log.owner(stream).is_none_or(|owner| owner != *id) {
            return Err(unknown());
        }
        let events = self.follow(stream.to_owned(), after, || true).ok_or_else(unknown)?;
        Ok(self.tracked(id, channel_stream(events)))
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        // No store of sessions is configured: rmcp's manager restores none.
        let _ = id;
        Ok(RestoreOutcome::NotSupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{EmptyResult, NumberOrString, ServerResult};

    fn progress() -> ServerSseMessage {
        ServerSseMessage::priming("x", RETRY)
    }

    fn response() -> ServerSseMessage {
        let result = ServerResult::EmptyResult(EmptyResult {});
        ServerSseMessage::from_message(ServerJsonRpcMessage::response(
            result,
            NumberOrString::Number(1),
        ))
    }

    #[tokio::test]
    async fn events_after_an_id_are_kept_until_too_many_streams_ended() {
        let log = EventLog::default();
        let first = log.store_event("s", &progress()).await.unwrap();
        assert_eq!(first, "s/1");
        assert_eq!(parse_event_id(&first), Some(("s", 1)));
        log.store_event("s", &progress()).await.unwrap();
        let last = log.store_event("s", &response()).await.unwrap();
        let (events, at, ended) = log.after("s", 1).unwrap();
        let ids: Vec<_> = events.iter().map(|e| e.event_id.clone().unwrap()).collect();
        assert_eq!((ids, at, ended), (vec!["s/2".to_owned(), last], 3, true));
        assert!(log.after("s", 4).is_none(), "an id the stream never gave");
        assert!(log.after("t", 0).is_none(), "a stream never seen");
        for n in 0..ENDED_MAX {
            log.store_event(&format!("e{n}"), &response()).await.unwrap();
        }
        assert!(log.after("s", 1).is_none(), "the oldest ended stream makes room");
        assert!(log.after(&format!("e{}", ENDED_MAX - 1), 0).is_some());
        // A stream keeps its last events only.
        for _ in 0..EVENTS_KEPT + 5 {
            log.store_event("long", &progress()).await.unwrap();
        }
        assert!(log.after("long", 4).is_none());
        assert_eq!(log.after("long", 5).unwrap().0.len(), EVENTS_KEPT);
    }
}
