//! Sessions across replicas: several servers behind one load balancer that sends each
//! request to any of them, sharing a [`SessionDirectory`] (Redis, `backend.redis`).
//!
//! A session of the handshake revisions lives in the replica that answered its
//! `initialize` (rmcp's session manager holds its worker, the per-session servers and the
//! read records live there). That replica records `session id → its base URL` in the
//! directory, with a time to live it renews while the session lives and a removal when the
//! session ends (`DELETE`, unused, its worker gone, the server shutting down). A replica
//! given a request (`POST`, `GET` stream, `DELETE`) of a session it does not hold looks the
//! holder up and forwards the request there: the body and the headers the protocol needs
//! (`Authorization` and `X-API-Key` as the client sent them, so that the holder checks
//! them again), the answer streamed back as it comes (an event stream included). A
//! forwarded request carries [`FORWARDED_HEADER`] and is never forwarded again. A holder
//! that cannot be reached (crashed) has its record removed and the client is told the
//! session is not found, so that it starts another, as MCP says. A client that goes
//! away drops the forwarded request with it. A record naming this replica for a session it
//! does not hold (it held it before it restarted at the same URL, or the session has just
//! ended) is dead: it is removed at the first request naming the session here, forwarded
//! or not, rather than left to its time to live.
//!
//! Tasks ([`super::tasks`]) are recorded the same way, `task id → base URL`, for as long
//! as the task is kept ([`super::tasks::TTL`]). A `tasks/get`, `tasks/update` or
//! `tasks/cancel` of a task this replica does not keep, within a session it holds or
//! without one (the stateless revision), goes to the task's replica, as a stateless
//! request (no session, `_meta` declaring the tasks extension) with the client's
//! credentials and the forwarded mark. A task whose replica cannot be reached, or
//! whose record names this replica but which an earlier life of it made, is answered as
//! an unknown task that says its replica is gone, and its record removed. The tasks
//! extension has no `tasks/list`: there is nothing to gather from the replicas.
//!
//! Requests are forwarded only to URLs found in the directory, which only replicas write:
//! whoever can write the directory (the Redis prefix) can send sessions' requests, with
//! their credentials, anywhere, as they can change everything else the backend shares.

use super::handler::Shared;
use super::http::{MCP_PATH, MCP_SESSION_ID, read_body, request_id, session_not_found};
use super::interact::{StateSeal, random_key};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the replicas record which of them holds each session, and keeps each task, and
/// for how long.
///
/// Its futures own what they need (`'static`), so that an implementation clones a handle
/// into them and needs no macro.
pub trait SessionDirectory: Send + Sync + std::fmt::Debug {
    /// Records that the replica at `owner` (a base URL, `http://10.0.0.5:8765`) holds
    /// `session` for `ttl` from now, or renews the record.
    fn claim(&self, session: String, owner: String, ttl: Duration) -> DirectoryFuture<()>;
    /// The base URL of the replica holding `session`, when one is recorded.
    fn owner(&self, session: String) -> DirectoryFuture<Option<String>>;
    /// Removes the record of `session` if it still names `owner`.
    fn release(&self, session: String, owner: String) -> DirectoryFuture<()>;

    /// Records that the replica at `owner` keeps MCP task `task` for `ttl` from now.
    ///
    /// By default a record among the sessions' named `task:` and the id, a name no
    /// session is looked up by (session ids never hold a `:`).
    fn claim_task(&self, task: String, owner: String, ttl: Duration) -> DirectoryFuture<()> {
        self.claim(task_record(&task), owner, ttl)
    }
    /// The base URL of the replica keeping `task`, when one is recorded.
    fn task_owner(&self, task: String) -> DirectoryFuture<Option<String>> {
        self.owner(task_record(&task))
    }
    /// Removes the record of `task` if it still names `owner`.
    fn release_task(&self, task: String, owner: String) -> DirectoryFuture<()> {
        self.release(task_record(&task), owner)
    }

    /// The key every replica seals `requestState` with, so that the next round of a
    /// stateless multi-round request (2026-07-28) opens at whichever replica it reaches:
    /// the key already shared, else `candidate` (fresh random bytes), stored as the shared
    /// one; whichever replica stores its candidate first, all then read the same key.
    ///
    /// By default `None`: each replica keys its own, and a next round reaching another
    /// replica fails verification unless the balancer sends it back.
    fn seal_key(&self, candidate: [u8; 32]) -> DirectoryFuture<Option<[u8; 32]>> {
        let _ = candidate;
        Box::pin(async { Ok(None) })
    }
}

/// The name a task's record takes among the sessions' by default.
fn task_record(task: &str) -> String {
    format!("task:{task}")
}

/// Why a [`SessionDirectory`] could not answer.
pub type DirectoryError = Box<dyn std::error::Error + Send + Sync>;

/// What a [`SessionDirectory`] answers.
pub type DirectoryFuture<T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, DirectoryError>> + Send + 'static>>;

/// Sessions shared with other replicas ([`ServeOptions::affinity`](super::ServeOptions)).
#[derive(Debug, Clone)]
pub struct SessionAffinity {
    /// Where the holders of sessions are recorded.
    pub directory: Arc<dyn SessionDirectory>,
    /// Where the other replicas reach this one (`http://10.0.0.5:8765`, no path); `None`:
    /// `http://` and the bound address, which must then not be a wildcard (the server
    /// then forwards nothing and records nothing, and says so in its log).
    pub advertise_url: Option<String>,
}

/// The header marking a forwarded request: it is served where it arrives, never
/// forwarded again.
pub const FORWARDED_HEADER: &str = "x-toolmux-forwarded";

/// How long a record lives without being renewed: a replica that crashed leaves its
/// sessions' records this long at most.
const RECORD_TTL: Duration = Duration::from_secs(60);
/// How often a replica renews its sessions' records.
const RENEW_EVERY: Duration = Duration::from_secs(20);
/// The longest wait for the directory.
const DIRECTORY_WAIT: Duration = Duration::from_secs(3);
/// The longest wait at start for the key the replicas seal `requestState` with.
const SEAL_KEY_WAIT: Duration = Duration::from_secs(10);
/// The longest wait for a connection to the holder.
const CONNECT_WAIT: Duration = Duration::from_secs(2);
/// The longest wait for the holder's answer to begin (an event stream begins at once).
const ANSWER_WAIT: Duration = Duration::from_secs(30);

/// The request headers a forwarded request carries, as the client sent them.
const FORWARDED_REQUEST_HEADERS: [&str; 8] = [
    "mcp-session-id",
    "mcp-protocol-version",
    "accept",
    "content-type",
    "last-event-id",
    "authorization",
    "x-api-key",
    "origin",
];

/// The request headers a forwarded task request carries, as the client sent them; it
/// goes without the client's session, which the task's replica does not hold.
const FORWARDED_TASK_HEADERS: [&str; 8] = [
    "accept",
    "content-type",
    "authorization",
    "x-api-key",
    "origin",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
];

/// The requests of a task, which name it in `params.taskId`.
const TASK_METHODS: [&str; 3] = ["tasks/get", "tasks/update", "tasks/cancel"];

/// The revision whose requests need no session: a task request made within a session
/// reaches the task's replica in it.
const STATELESS_REVISION: &str = "2026-07-28";

/// The answer's headers that are the connection's, not the answer's.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
];

/// This replica's records in the directory: the sessions it holds.
#[derive(Debug)]
pub(crate) struct Registry {
    directory: Arc<dyn SessionDirectory>,
    /// This replica's base URL, without a trailing `/`.
    url: String,
    /// The sessions recorded as this replica's.
    held: Mutex<HashSet<String>>,
}

impl Registry {
    /// The records of a server bound to `bound`; `None` (logged) when where it is reached
    /// cannot be told.
    pub(crate) fn new(
        affinity: &SessionAffinity,
        bound: std::net::SocketAddr,
    ) -> Option<Arc<Registry>> {
        let url = match &affinity.advertise_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None if bound.ip().is_unspecified() => {
                tracing::warn!(
                    target: "toolmux::serve",
                    "sessions are not shared with other replicas (the key of requestState \
                     still is): this server is bound to every address ({bound}), so where \
                     they reach it cannot be told; set `backend.redis.advertiseUrl` (such as \
                     `http://10.0.0.5:{}`), or route each session to one replica by its \
                     `Mcp-Session-Id`",
                    bound.port()
                );
                return None;
            }
            None => format!("http://{bound}"),
        };
        Some(Arc::new(Registry {
            directory: affinity.directory.clone(),
            url,
            held: Mutex::default(),
        }))
    }

    /// The host (and port) the other replicas name this one by, to be accepted as `Host`.
    pub(crate) fn host(&self) -> Option<String> {
        let rest = self.url.split_once("://")?.1;
        let authority = rest.split('/').next()?;
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if port.parse::<u16>().is_ok() && !host.ends_with(':') => host,
            _ => authority,
        };
        Some(host.trim_start_matches('[').trim_end_matches(']').to_owned())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records session `id` as this replica's.
    pub(crate) async fn claim(&self, id: &str) {
        self.lock().insert(id.to_owned());
        self.write(id).await;
    }

    /// Records task `id`, kept here for `ttl`, as this replica's.
    pub(crate) async fn claim_task(&self, id: &str, ttl: Duration) {
        let claimed = tokio::time::timeout(
            DIRECTORY_WAIT,
            self.directory.claim_task(id.to_owned(), self.url.clone(), ttl),
        )
        .await;
        if !matches!(claimed, Ok(Ok(()))) {
            tracing::warn!(
                target: "toolmux::serve",
                "cannot record an MCP task's replica, so the other replicas answer that they \
                 do not know it: poll it here, within a session of this replica"
            );
        }
    }

    /// Removes the record of task `id` when it names `owner`.
    async fn remove_task(&self, id: &str, owner: &str) {
        let released = tokio::time::timeout(
            DIRECTORY_WAIT,
            self.directory.release_task(id.to_owned(), owner.to_owned()),
        )
        .await;
        if !matches!(released, Ok(Ok(()))) {
            // It ends with its time to live.
            tracing::debug!(target: "toolmux::serve", "cannot remove an MCP task's record");
        }
    }

    async fn write(&self, id: &str) {
        let claimed = tokio::time::timeout(
            DIRECTORY_WAIT,
            self.directory.claim(id.to_owned(), self.url.clone(), RECORD_TTL),
        )
        .await;
        match claimed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                target: "toolmux::serve",
                "cannot record an MCP session's holder, so other replicas cannot forward its \
                 requests here: {}", toolmux_core::error_report(&*e)
            ),
            Err(_) => tracing::warn!(
                target: "toolmux::serve",
                "cannot record an MCP session's holder within {DIRECTORY_WAIT:?}, so other \
                 replicas cannot forward its requests here"
            ),
        }
    }

    /// Removes the record of session `id`, which ended here.
    pub(crate) async fn release(&self, id: &str) {
        if !self.lock().remove(id) {
            return;
        }
        self.remove(id, &self.url).await;
    }

    /// Removes the record of session `id` when it names `owner`.
    async fn remove(&self, id: &str, owner: &str) {
        let released = tokio::time::timeout(
            DIRECTORY_WAIT,
            self.directory.release(id.to_owned(), owner.to_owned()),
        )
        .await;
        if !matches!(released, Ok(Ok(()))) {
            // It ends with its time to live.
            tracing::debug!(target: "toolmux::serve", "cannot remove an MCP session's record");
        }
    }

    /// Renews the records of the sessions `live` says still live, and removes the others'.
    pub(crate) async fn renew(&self, live: impl Fn(&str) -> bool) {
        let held: Vec<String> = self.lock().iter().cloned().collect();
        for id in held {
            if live(&id) {
                self.write(&id).await;
            } else {
                self.release(&id).await;
            }
        }
    }

    /// Removes every record of this replica (the server is shutting down).
    pub(crate) async fn release_all(&self) {
        let held: Vec<String> = self.lock().drain().collect();
        for id in held {
            self.remove(&id, &self.url).await;
        }
    }

    /// How often [`Registry::renew`] is to run.
    pub(crate) fn renew_every() -> Duration {
        RENEW_EVERY
    }
}

/// The seal of `requestState` for a server sharing `affinity`'s directory: keyed with the
/// key the replicas share ([`SessionDirectory::seal_key`]), or this server's own when the
/// directory shares none; why there is none, to refuse to start with, when the directory
/// does not answer (each replica keying its own would fail every next round that reaches
/// another replica).
pub(crate) async fn shared_seal(affinity: &SessionAffinity) -> Result<StateSeal, String> {
    let candidate = random_key()?;
    match tokio::time::timeout(SEAL_KEY_WAIT, affinity.directory.seal_key(candidate)).await {
        Ok(Ok(Some(key))) => Ok(StateSeal::with_key(key)),
        Ok(Ok(None)) => Ok(StateSeal::with_key(candidate)),
        Ok(Err(e)) => Err(format!(
            "cannot read from the session directory the key the replicas share to seal \
             requestState: {}; check that the backend (`backend.redis`) answers and that its \
             user may write under its prefix",
            toolmux_core::error_report(&*e)
        )),
        Err(_) => Err(format!(
            "the session directory gave no key to seal requestState with within \
             {SEAL_KEY_WAIT:?}; check that the backend (`backend.redis`) answers"
        )),
    }
}

/// What forwarding needs: the local sessions and tasks, the records, the hosts accepted
/// and a client.
#[derive(Debug)]
pub(crate) struct Forwarding {
    pub(crate) sessions: Arc<super::sessions::Sessions>,
    /// Its tasks.
    shared: Arc<Shared>,
    pub(crate) registry: Arc<Registry>,
    /// The hosts accepted (empty: any), checked before a request goes elsewhere.
    pub(crate) hosts: Arc<[String]>,
    client: reqwest::Client,
}

impl Forwarding {
    pub(crate) fn new(
        sessions: Arc<super::sessions::Sessions>,
        shared: Arc<Shared>,
        registry: Arc<Registry>,
        hosts: Arc<[String]>,
    ) -> Option<Arc<Forwarding>> {
        crate::client::ensure_crypto_provider();
        // No proxy of the environment's: replicas reach each other directly. No redirect:
        // the request goes where the record says, and nowhere else.
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_WAIT)
            .tcp_keepalive(Duration::from_secs(15))
            .build();
        match client {
            Ok(client) => Some(Arc::new(Forwarding { sessions, shared, registry, hosts, client })),
            Err(e) => {
                tracing::warn!(target: "toolmux::serve", "sessions are not shared with other replicas: cannot build an HTTP client: {e}");
                None
            }
        }
    }
}

/// Forwards a request of a session another replica holds, or of a task another replica
/// keeps, to that replica (see the module's docs); serves every other request here.
pub(crate) async fn forward_foreign(
    State(forwarding): State<Arc<Forwarding>>,
    request: Request,
    next: Next,
) -> Response {
    use rmcp::transport::streamable_http_server::SessionManager as _;
    let method = request.method().clone();
    if !matches!(method, Method::POST | Method::GET | Method::DELETE) {
        return next.run(request).await;
    }
    // Forwarded here by another replica: served here, whatever it names.
    let marked = request.headers().contains_key(FORWARDED_HEADER);
    let session: Option<Arc<str>> =
        request.headers().get(MCP_SESSION_ID).and_then(|v| v.to_str().ok()).map(Arc::from);
    if let Some(session) = session.clone()
        && !forwarding.sessions.has_session(&session).await.unwrap_or(true)
    {
        // rmcp's ids never hold a `:`, which begins the names of other records (tasks').
        if session.contains(':') {
            return next.run(request).await;
        }
        let owner = look_up(forwarding.registry.directory.owner(session.to_string()), "session");
        match owner.await {
            Some(owner) if owner == forwarding.registry.url => {
                // This replica's record, of a session it holds no longer: dead at once.
                forwarding.registry.remove(&session, &owner).await;
            }
            Some(owner)
                if !marked && super::api::host_allowed(&forwarding.hosts, request.headers()) =>
            {
                return forward(&forwarding, Held::Session(&session), &owner, request).await;
            }
            // Not recorded, or refused here (rmcp says why): not found here.
            _ => {}
        }
        return next.run(request).await;
    }
    if method != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(refusal) => return refusal,
    };
    let request = Request::from_parts(parts, axum::body::Body::from(body.clone()));
    let Some((task_method, task)) = task_request(&body) else {
        return next.run(request).await;
    };
    let tasks = forwarding.shared.tasks();
    if tasks.contains(&task) {
        return next.run(request).await;
    }
    let owner = look_up(forwarding.registry.directory.task_owner(task.clone()), "task");
    match owner.await {
        Some(owner) if owner == forwarding.registry.url => {
            // Ended here (or past its time): this replica's record of it is dead.
            forwarding.registry.remove_task(&task, &owner).await;
            if !tasks.made_here(&task) {
                // Made by this replica before it restarted at the same URL.
                return task_gone(&task, request_id(&body));
            }
        }
        Some(owner)
            if !marked && super::api::host_allowed(&forwarding.hosts, request.headers()) =>
        {
            let (parts, _) = request.into_parts();
            let held =
                Held::Task { id: &task, method: &task_method, in_session: session.is_some() };
            return send(&forwarding, held, &owner, parts, body).await;
        }
        _ => {}
    }
    next.run(request).await
}

/// The replica recorded as holding a session or keeping a task (`what`), without a
/// trailing `/`; `None` when none is recorded or the directory does not answer (logged).
async fn look_up(looked_up: DirectoryFuture<Option<String>>, what: &str) -> Option<String> {
    match tokio::time::timeout(DIRECTORY_WAIT, looked_up).await {
        Ok(Ok(owner)) => owner.map(|owner| owner.trim_end_matches('/').to_owned()),
        Ok(Err(e)) => {
            tracing::warn!(target: "toolmux::serve", "cannot look up which replica holds an MCP {what}, so it is not found here: {}", toolmux_core::error_report(&*e));
            None
        }
        Err(_) => {
            tracing::warn!(target: "toolmux::serve", "no answer within {DIRECTORY_WAIT:?} to which replica holds an MCP {what}, so it is not found here");
            None
        }
    }
}

/// The method and task id of a task request (`tasks/get`, `tasks/update`, `tasks/cancel`)
/// in `body`; `None` for any other message.
fn task_request(body: &[u8]) -> Option<(String, String)> {
    #[derive(serde::Deserialize)]
    struct Peek {
        method: String,
        params: Params,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        task_id: String,
    }
    let peek: Peek = serde_json::from_slice(body).ok()?;
    TASK_METHODS.contains(&peek.method.as_str()).then_some((peek.method, peek.params.task_id))
}

/// What a forwarded request is of.
#[derive(Debug, Clone, Copy)]
enum Held<'a> {
    /// A session the other replica holds: the request goes as it came.
    Session(&'a str),
    /// A task the other replica keeps: a request of `method`, which goes without the
    /// client's session (`in_session`: it had one).
    Task { id: &'a str, method: &'a str, in_session: bool },
}

/// Sends `request` of a session to the replica at `owner` and streams its answer back.
async fn forward(
    forwarding: &Forwarding,
    held: Held<'_>,
    owner: &str,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = if parts.method == Method::POST {
        match read_body(body).await {
            Ok(body) => body,
            Err(refusal) => return refusal,
        }
    } else {
        bytes::Bytes::new()
    };
    send(forwarding, held, owner, parts, body).await
}

/// Sends the request of `parts` and `body` to the replica at `owner` and streams its
/// answer back.
async fn send(
    forwarding: &Forwarding,
    held: Held<'_>,
    owner: &str,
    parts: axum::http::request::Parts,
    body: bytes::Bytes,
) -> Response {
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let url = format!("{owner}{MCP_PATH}{query}");
    let (headers, sent): (&[&str], bytes::Bytes) = match held {
        Held::Session(_) => (&FORWARDED_REQUEST_HEADERS, body.clone()),
        Held::Task { in_session: false, .. } => (&FORWARDED_TASK_HEADERS, body.clone()),
        // Only the headers that say who asks: the revision and method are this request's.
        Held::Task { in_session: true, .. } => {
            (&FORWARDED_TASK_HEADERS[..5], stateless(&body).unwrap_or_else(|| body.clone()))
        }
    };
    let mut outgoing = forwarding.client.request(parts.method.clone(), &url).body(sent);
    for name in headers {
        for value in parts.headers.get_all(*name) {
            outgoing = outgoing.header(*name, value);
        }
    }
    if let Held::Task { id, method, in_session: true } = held {
        outgoing = outgoing.header("mcp-protocol-version", STATELESS_REVISION);
        outgoing = outgoing.header("mcp-method", method);
        // The revision names the task in a header too.
        outgoing = outgoing.header("mcp-name", id);
    }
    outgoing = outgoing.header(FORWARDED_HEADER, "1");
    let (what, holding) = match held {
        Held::Session(_) => ("session", "the replica holding this session"),
        Held::Task { .. } => ("task", "the replica running this task"),
    };
    tracing::debug!(target: "toolmux::serve", method = %parts.method, to = %owner, "forwarding a request of an MCP {what} another replica holds");
    let answer = match tokio::time::timeout(ANSWER_WAIT, outgoing.send()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) if e.is_connect() => {
            // Crashed, or gone: its sessions and tasks went with it.
            tracing::warn!(target: "toolmux::serve", to = %owner, "the replica holding an MCP {what} cannot be reached ({}); its record is removed and its client told it is gone", toolmux_core::error_report(&e));
            return match held {
                Held::Session(session) => {
                    forwarding.registry.remove(session, owner).await;
                    session_not_found(request_id(&body))
                }
                Held::Task { id, .. } => {
                    forwarding.registry.remove_task(id, owner).await;
                    task_gone(id, request_id(&body))
                }
            };
        }
        Ok(Err(e)) => {
            tracing::warn!(target: "toolmux::serve", to = %owner, "forwarding a request of an MCP {what} failed: {}", toolmux_core::error_report(&e));
            return holder_failed(
                StatusCode::BAD_GATEWAY,
                holding,
                "failed while it was sent",
                &body,
            );
        }
        Err(_) => {
            tracing::warn!(target: "toolmux::serve", to = %owner, "the replica holding an MCP {what} did not answer within {ANSWER_WAIT:?}");
            let why = format!("did not answer within {} s", ANSWER_WAIT.as_secs());
            return holder_failed(StatusCode::GATEWAY_TIMEOUT, holding, &why, &body);
        }
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    // Streamed as it comes: an event stream's events reach the client one by one, and a
    // client that goes away drops this stream, which drops the forwarded request.
    let mut response = Response::new(axum::body::Body::from_stream(answer.bytes_stream()));
    *response.status_mut() = status;
    for (name, value) in &headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            response.headers_mut().append(name.clone(), value.clone());
        }
    }
    response
}

/// A task request made within a session (`body`), as a stateless request: its `_meta`
/// names the stateless revision, a client and the tasks extension, which the task's
/// replica wants of a task request (the session's `initialize` declared it there).
fn stateless(body: &[u8]) -> Option<bytes::Bytes> {
    let mut message: serde_json::Value = serde_json::from_slice(body).ok()?;
    let meta = message
        .get_mut("params")?
        .as_object_mut()?
        .entry("_meta")
        .or_insert_with(|| serde_json::json!({}))
        .as_object_mut()?;
    meta.insert("io.modelcontextprotocol/protocolVersion".into(), STATELESS_REVISION.into());
    meta.entry("io.modelcontextprotocol/clientInfo").or_insert_with(
        || serde_json::json!({"name": "toolmux-replica", "version": env!("CARGO_PKG_VERSION")}),
    );
    let extensions = serde_json::json!({rmcp::model::TASKS_EXTENSION_ID: {}});
    meta.insert(
        "io.modelcontextprotocol/clientCapabilities".into(),
        serde_json::json!({"extensions": extensions}),
    );
    serde_json::to_vec(&message).ok().map(Into::into)
}

/// The error of an unknown task (`-32602`, as the task's replica answers one), of task
/// `task` whose replica is gone, answering request `id`.
fn task_gone(task: &str, id: serde_json::Value) -> Response {
    let message = format!(
        "unknown task `{task}`: the replica of this server that ran it is gone (stopped, \
         crashed or restarted), and the task with it; call the tool again"
    );
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id,
        "error": {"code": -32602, "message": message}});
    let mut response = Response::new(axum::body::Body::from(body.to_string()));
    response
        .headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A JSON-RPC error saying the replica holding the session or task (`holding`) failed
/// (`why`); the request may have run there.
fn holder_failed(status: StatusCode, holding: &str, why: &str, body: &[u8]) -> Response {
    let message = format!(
        "{holding} {why}; the request may have run there: check its effect before sending it \
         again"
    );
    let body = serde_json::json!({"jsonrpc": "2.0", "id": request_id(body),
        "error": {"code": -32603, "message": message}});
    let mut response = Response::new(axum::body::Body::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt as _;
    use tokio_util::sync::CancellationToken;

    /// A directory naming one holder for every session.
    #[derive(Debug)]
    struct OneHolder(String);

    impl SessionDirectory for OneHolder {
        fn claim(&self, _: String, _: String, _: Duration) -> DirectoryFuture<()> {
            Box::pin(async { Ok(()) })
        }
        fn owner(&self, _: String) -> DirectoryFuture<Option<String>> {
            let owner = self.0.clone();
            Box::pin(async move { Ok(Some(owner)) })
        }
        fn release(&self, _: String, _: String) -> DirectoryFuture<()> {
            Box::pin(async { Ok(()) })
        }
    }

    /// Tells when the holder's answer stream is dropped (its connection closed).
    struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }

    /// A holder on loopback whose `/mcp` answers an event stream with one event and then
    /// nothing, telling the request's headers and when the stream is dropped.
    async fn holder() -> (
        String,
        tokio::sync::mpsc::UnboundedReceiver<axum::http::HeaderMap>,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let (headers_tx, headers) = tokio::sync::mpsc::unbounded_channel();
        let (dropped_tx, dropped) = tokio::sync::oneshot::channel();
        let dropped_tx = Arc::new(Mutex::new(Some(dropped_tx)));
        let route = move |request: Request| {
            let _ = headers_tx.send(request.headers().clone());
            let guard = Dropped(dropped_tx.lock().unwrap_or_else(|e| e.into_inner()).take());
            async move {
                let first = futures::stream::once(async {
                    Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"data: first\n\n"))
                });
                let rest = futures::stream::pending().map(move |x| {
                    let _ = &guard;
                    x
                });
                let mut response = Response::new(axum::body::Body::from_stream(first.chain(rest)));
                response.headers_mut().insert(
                    axum::http::header::CONTENT_TYPE,
                    HeaderValue::from_static("text/event-stream"),
                );
                response
            }
        };
        let app = axum::Router::new().route(MCP_PATH, axum::routing::any(route));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (url, headers, dropped)
    }

    /// A replica forwarding every session to `owner`, serving 418 itself.
    async fn replica(owner: &str) -> String {
        let shutdown = CancellationToken::new();
        let sessions = super::super::sessions::Sessions::new(
            Duration::from_secs(300),
            super::super::DEFAULT_MAX_SERVED_SESSIONS,
            shutdown,
            None,
        );
        let registry = Arc::new(Registry {
            directory: Arc::new(OneHolder(owner.to_owned())),
            url: "http://127.0.0.1:1".to_owned(),
            held: Mutex::default(),
        });
        let provider = Arc::new(toolmux_test_support::mock::MockProvider::new("mock"));
        let shared = Shared::new(provider, super::super::ServeOptions::default());
        let forwarding =
            Forwarding::new(sessions, shared, registry, Arc::from(Vec::new())).unwrap();
        let app = axum::Router::new()
            .fallback(|| async { StatusCode::IM_A_TEAPOT })
            .layer(axum::middleware::from_fn_with_state(forwarding, forward_foreign));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}{MCP_PATH}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// A client that goes away while the holder streams drops the forwarded request: the
    /// holder's stream ends too, rather than running on for nobody.
    #[tokio::test]
    async fn a_client_that_goes_away_ends_the_forwarded_stream() {
        let (owner, mut headers, dropped) = holder().await;
        let url = replica(&owner).await;
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let get = client
            .get(&url)
            .header("mcp-session-id", "s1")
            .header("accept", "text/event-stream")
            .header("authorization", "Bearer k3y")
            .header("x-other", "not forwarded");
        let mut response =
            tokio::time::timeout(Duration::from_secs(10), get.send()).await.unwrap().unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let first = tokio::time::timeout(Duration::from_secs(10), response.chunk()).await;
        assert_eq!(first.unwrap().unwrap().unwrap(), "data: first\n\n");
        let sent = headers.recv().await.unwrap();
        assert_eq!(sent["authorization"], "Bearer k3y");
        assert_eq!(sent["mcp-session-id"], "s1");
        assert_eq!(sent[FORWARDED_HEADER], "1");
        assert!(sent.get("x-other").is_none());
        drop(response);
        drop(client);
        let ended = tokio::time::timeout(Duration::from_secs(10), dropped).await;
        assert!(matches!(ended, Ok(Ok(()))), "the holder's stream outlived its client");

        // A request already forwarded is served where it arrives.
        let marked = reqwest::Client::builder().no_proxy().build().unwrap();
        let served = marked
            .post(&url)
            .header("mcp-session-id", "s1")
            .header(FORWARDED_HEADER, "1")
            .body("{}")
            .send();
        let served = tokio::time::timeout(Duration::from_secs(10), served).await.unwrap().unwrap();
        assert_eq!(served.status(), StatusCode::IM_A_TEAPOT);
    }
}
