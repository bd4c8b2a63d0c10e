//! Serving any [`ToolProvider`] as one MCP server, over stdio or streamable HTTP: this is
//! what `toolmux serve` runs, with the orchestrator as the provider, so that an MCP client
//! (Claude Code, Cursor, an agent) sees every tool toolmux has as one server.
//!
//! What the client gets:
//! - `tools/list` with pagination (`page_size` tools a page, an opaque cursor); hidden tools
//!   (`visible: false`) are not listed but can be called; annotations are mapped to MCP's
//!   hints (`readOnlyHint`, `destructiveHint`, `idempotentHint`, `openWorldHint`, `title`).
//! - `tools/call`: the client's `progressToken` becomes the call's progress sink and its
//!   reports `notifications/progress`, coalesced to at most one every 50 ms, the latest,
//!   the last before the result; `notifications/cancelled` cancels the call's
//!   [`CallContext`](toolmux_core::CallContext); every failure of the tool, `Err` or an output
//!   flagged `is_error`, is a result with `isError: true` and the message as text (only an
//!   unknown tool is a JSON-RPC error, `-32602`, as MCP specifies). Each MCP session is one
//!   run, unless a request names its run in `_meta` under [`RUN_ID_META_KEY`] (an agent
//!   across reconnections, or a stateless client's requests).
//! - `notifications/tools/list_changed` when the provider's list changes, to every session
//!   that initialized, and over `subscriptions/listen` for stateless 2026-07-28 clients; a
//!   burst of changes is announced once, when the list has stayed unchanged for 75 ms (or a
//!   second after the burst began).
//! - The provider's instructions (or [`ServeOptions::instructions`]) as the server's.
//! - `completion/complete` for arguments of the provider's prompts and resource templates
//!   ([`ToolProvider::complete`]).
//! - Both protocol generations: the `initialize` handshake (2024-11-05 to 2025-11-25) and
//!   the stateless 2026-07-28 revision (`server/discover`, `subscriptions/listen`).
//! - With [`ServeOptions::name_prefix`] set to what the client puts before each name
//!   (`mcp__toolmux__` for Claude Code), names are fitted into what the prefix leaves of 64
//!   characters, shortened ones ending in a hash of the full name, and calls routed back.
//! - With [`ServeOptions::client`] naming the client ([`ClientProfile`]: Claude, Codex,
//!   OpenAI, Cursor, Gemini), names fit that client's prefix and budget and input schemas
//!   are rewritten to what its model's API accepts (no top-level unions, Gemini's OpenAPI
//!   subset); arguments are still validated against the original schemas.
//! - Over HTTP, requests whose `Host` (or `Origin`, when sent) is not one of
//!   [`ServeOptions::allowed_hosts`] are refused with 403, against DNS rebinding (`/mcp`,
//!   the API, `/health` and `/metrics`; on an unspecified address whose requests all need
//!   a key, with no host added, any host is accepted: other machines name it as they
//!   reach it); with
//!   [`ServeOptions::api_keys`], requests without one of the keys are refused with 401.
//! - Over HTTP, `GET /health` (no key needed, for load balancers and probes): 200, the
//!   number of tools and each provider's [`Health`](toolmux_core::Health) by namespace
//!   while the provider lists its tools (`"degraded": true` when one is not healthy), else
//!   503; `GET /metrics` with [`ServeOptions::metrics`].
//! - Over HTTP, the external tools' API for programs that answer their calls without MCP
//!   (`GET /api/tool-calls`, the event stream `GET /api/tool-calls/events`, `POST
//!   /api/runs/{runId}/tool-results`), through the provider's `external__pending` and
//!   `external__submit`; see the `api` module's source for the details. With
//!   [`ServeOptions::events`], `GET /api/events`: the calls' events as server-sent events
//!   (`tool.started`, `tool.progress`, `tool.done`, `tool.error`), a key holder's own runs
//!   only.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use toolmux_core::{ToolKind, ToolOutput, ToolSet};
//! use toolmux_mcp::server::{ServeOptions, serve_http};
//! use tokio_util::sync::CancellationToken;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Echo {
//!     message: String,
//! }
//!
//! # async fn run() -> Result<(), toolmux_mcp::McpError> {
//! let tools = ToolSet::new("demo", ToolKind::Builtin)
//!     .with_typed("echo", "Echoes the message", |input: Echo, _ctx| async move {
//!         Ok(ToolOutput::text(input.message))
//!     });
//! let shutdown = CancellationToken::new();
//! // Serves http://127.0.0.1:8931/mcp until `shutdown` is cancelled.
//! serve_http(Arc::new(tools), "127.0.0.1:8931".parse().unwrap(), ServeOptions::default(), shutdown)
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod affinity;
mod api;
mod convert;
mod handler;
mod http;
mod interact;
mod malformed;
mod names;
mod oauth;
mod profile;
mod progress;
mod session;
mod sessions;
mod settle;
mod stdio;
mod tasks;

pub use affinity::{
    DirectoryError, DirectoryFuture, FORWARDED_HEADER, SessionAffinity, SessionDirectory,
};
pub use convert::EXTRAS_META_KEY;
pub use handler::RUN_ID_META_KEY;
pub use names::LONGEST_NAME_PREFIX;
pub use oauth::{IntrospectionConfig, Refusal, ResourceServerConfig, TokenVerifier};
pub use profile::ClientProfile;

use crate::McpError;
use handler::{Gateway, Shared};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use toolmux_core::ToolProvider;

/// The most streamable HTTP sessions a server holds at once unless told otherwise
/// ([`ServeOptions::max_sessions`]).
pub const DEFAULT_MAX_SERVED_SESSIONS: usize = 2048;

/// How a provider is served.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// What the client puts before every tool name (`mcp__toolmux__`); names are fitted
    /// into what it leaves of the client's budget (64 characters, or the profile's).
    /// `None`: the client profile's prefix for a server named `server_name`, and for the
    /// generic profile names served unchanged.
    pub name_prefix: Option<String>,
    /// The client served, for the tool names and input schemas it accepts.
    pub client: ClientProfile,
    /// Whether a stdio session with the generic profile and no `name_prefix` takes the
    /// profile of the client its `initialize` names (`clientInfo.name`: Claude Code,
    /// Codex, Cursor, Gemini CLI), so that names fit the prefix that client adds. Over HTTP,
    /// where clients of any kind share the served names, it does not (default true).
    pub detect_client: bool,
    /// `Host` values (host or `host:port`) accepted over HTTP; `Origin`s on these hosts are
    /// accepted too. The bound address is added when serving. An empty list accepts every
    /// host and origin, which exposes a local server to DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// Tools per `tools/list` page.
    pub page_size: usize,
    /// The server's name in the handshake.
    pub server_name: String,
    /// The server's version in the handshake.
    pub server_version: String,
    /// Instructions for the client's model; the provider's when `None`.
    pub instructions: Option<String>,
    /// Keys a client must present over HTTP (`Authorization: Bearer KEY`, or `X-API-Key:
    /// KEY`); none accepts every client. Stdio needs none: its client started the server.
    /// Replacing them through a clone ([`ApiKeys::replace`]) takes effect on the next
    /// request.
    pub api_keys: ApiKeys,
    /// What `GET /metrics` serves over HTTP (behind the API keys); no such page when `None`.
    pub metrics: Option<Arc<dyn MetricsSource>>,
    /// The calls' events that `GET /api/events` streams over HTTP (behind the API keys,
    /// each key holder its own runs'); no such stream when `None`.
    pub events: Option<Arc<dyn EventSource>>,
    /// Glob patterns of tool names (as the provider names them) whose calls may run as MCP
    /// tasks, besides those whose provider says so (`ToolAnnotations::task_support`).
    pub task_tools: Vec<String>,
    /// Over HTTP, access tokens of an OAuth authorization server are accepted too (the
    /// MCP authorization specification's protected resource): each valid token's subject
    /// is a holder, as an API key's name is.
    pub token_verifier: Option<Arc<TokenVerifier>>,
    /// Over HTTP, what each key holder is served when not the whole provider: its tools
    /// listed and callable, its prompts and resources (the external tools' and spaces'
    /// HTTP API too). Holders it gives no view see everything.
    pub views: Option<Arc<dyn HolderViews>>,
    /// Over HTTP, how long a session may go unused (no request, no stream open to the
    /// client, such as a call's answer being awaited or a `GET` stream) before it is
    /// ended; its client then starts another (default 5 minutes).
    pub session_idle: std::time::Duration,
    /// Over HTTP, the most sessions held at once (default [`DEFAULT_MAX_SERVED_SESSIONS`];
    /// 0 is taken as 1). An `initialize` past it ends the session unused the longest
    /// (no request and no stream open to its client), whose client then starts another;
    /// when every session is in use it is refused with `503` and `Retry-After`. Each
    /// session holds its handler, rmcp's worker and channels until it ends, so without a
    /// bound anyone who can reach the server could fill its memory with handshakes.
    pub max_sessions: usize,
    /// Over HTTP, sessions shared with other replicas behind one load balancer: each
    /// session is recorded as this server's in a directory the replicas share, and a
    /// request of a session another replica holds is forwarded to it (`None`: sessions are
    /// this server's alone, and another replica's are not found). The replicas seal the
    /// stateless revision's `requestState` with one key the directory keeps
    /// ([`SessionDirectory::seal_key`]), read when the server starts, so that a request's
    /// next round may reach any replica; a directory that does not answer then fails the
    /// start.
    pub affinity: Option<SessionAffinity>,
    /// Over stdio (and [`serve_fds`], [`serve_io`]), how long the calls in flight when the
    /// client's input ends may still run (each within its own timeout) before they are
    /// cancelled: a client that writes its requests and closes its end
    /// (`printf '...' | toolmux serve --stdio`) gets their answers, and serving ends once
    /// they are written (default [`DEFAULT_END_OF_INPUT_GRACE`]). A client that closes its
    /// input to shut the server down and will not wait that long sends a signal, or
    /// `notifications/cancelled` for its calls first.
    pub end_of_input_grace: std::time::Duration,
}

/// How long calls in flight at the end of a stdio client's input may still run, unless
/// told otherwise ([`ServeOptions::end_of_input_grace`]).
pub const DEFAULT_END_OF_INPUT_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// The tools of key holders that are not served everything ([`ServeOptions::views`]).
pub trait HolderViews: Send + Sync + std::fmt::Debug {
    /// The provider key holder `holder` is served (an API key's name, `oauth:SUBJECT`), or
    /// `None` for the whole served provider.
    fn view(&self, holder: &str) -> Option<Arc<dyn ToolProvider>>;
}

/// Checks [`ServeOptions::task_tools`]: `Err` names the first pattern that is not a glob.
pub fn check_task_tools(patterns: &[String]) -> Result<(), String> {
    for pattern in patterns {
        globset::Glob::new(pattern)
            .map_err(|e| format!("`{pattern}` is not a glob pattern: {}", e.kind()))?;
    }
    Ok(())
}

/// Events of the served provider's calls, streamed at `GET /api/events`.
pub trait EventSource: Send + Sync + std::fmt::Debug {
    /// The events from now on, until the source ends.
    fn subscribe(&self) -> futures::stream::BoxStream<'static, ServedEvent>;
}

/// One event of a call, as `GET /api/events` sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedEvent {
    /// The event's name: `tool.started`, `tool.progress`, `tool.done` (the call
    /// succeeded), `tool.error` (it failed), or `lagged` (events were missed; `data` says
    /// how many).
    pub name: &'static str,
    /// The call's operation, which links a progress event to its call.
    pub op_id: u64,
    /// The run that made the call; `None` for progress events (known by `op_id`) and
    /// `lagged`.
    pub run_id: Option<String>,
    /// The full tool name; `None` for `lagged`.
    pub tool: Option<String>,
    /// What is sent as the event's data: a JSON object.
    pub data: serde_json::Value,
}

/// The statistics a server shows at `GET /metrics`, in Prometheus' text format.
pub trait MetricsSource: Send + Sync + std::fmt::Debug {
    /// The current statistics.
    fn render(&self) -> String;
}

/// A key that lets a client use the HTTP server, and a name for logs.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Who holds it (`ci`, `alice`), for logs.
    pub name: String,
    /// The key itself.
    pub key: String,
}

/// The API keys a server accepts, shared: a clone sees and makes the same replacements
/// (a configuration reload), which take effect on the next request.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys(Arc<std::sync::RwLock<Arc<[ApiKey]>>>);

impl ApiKeys {
    /// Accepts `keys`.
    pub fn new(keys: Vec<ApiKey>) -> ApiKeys {
        ApiKeys(Arc::new(std::sync::RwLock::new(Arc::from(keys))))
    }

    /// Accepts `keys` from the next request on, instead of the keys so far.
    pub fn replace(&self, keys: Vec<ApiKey>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::from(keys);
    }

    /// The keys accepted now.
    pub fn current(&self) -> Arc<[ApiKey]> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How many keys are accepted now.
    pub fn len(&self) -> usize {
        self.current().len()
    }

    /// Whether no key is required now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey").field("name", &self.name).field("key", &"<redacted>").finish()
    }
}

/// The hosts a server accepts by default: loopback's names.
pub(crate) const LOOPBACK_HOSTS: [&str; 3] = ["127.0.0.1", "localhost", "::1"];

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            name_prefix: None,
            client: ClientProfile::Generic,
            detect_client: true,
            allowed_hosts: LOOPBACK_HOSTS.map(String::from).into(),
            page_size: 100,
            server_name: "toolmux".to_owned(),
            server_version: env!("CARGO_PKG_VERSION").to_owned(),
            instructions: None,
            api_keys: ApiKeys::default(),
            metrics: None,
            events: None,
            task_tools: Vec::new(),
            token_verifier: None,
            views: None,
            session_idle: std::time::Duration::from_secs(5 * 60),
            max_sessions: DEFAULT_MAX_SERVED_SESSIONS,
            affinity: None,
            end_of_input_grace: DEFAULT_END_OF_INPUT_GRACE,
        }
    }
}

/// Serves `provider` on this process's stdin and stdout until the client closes stdin and
/// the calls then in flight are answered (or cancelled after
/// [`ServeOptions::end_of_input_grace`]).
///
/// Stdin is read by a thread of its own and a call is run on the thread whose read made it
/// ready: started by the stdin reader, finished and answered by the reader of its
/// upstream's response (see [`serve_fds`]); a pipe or socket on stdout is written without
/// blocking, and set back to blocking when serving ends.
pub async fn serve_stdio(
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
) -> Result<(), McpError> {
    let server = options.server_name.clone();
    let (stdio, input, output) = stdio::Stdio::take().map_err(|source| McpError::Serve {
        server,
        transport: "stdio",
        source: source.into(),
    })?;
    let served = serve_threaded(provider, options, input, output).await;
    drop(stdio);
    served
}

/// Serves `provider` over two file descriptors carrying newline-delimited JSON-RPC (a pair
/// of pipes, or one socket twice), as [`serve_stdio`] does on stdin and stdout, until
/// `input` ends.
///
/// `input` is read by a thread blocked in `read`, which starts each call right there; the
/// call is finished, and its response written, by the thread whose read made it ready
/// (the stdout reader of a stdio MCP server it called, or the runtime). `output` is made
/// non-blocking when it is a pipe or a socket, and lines that do not fit are queued for a
/// task. The reader thread ends when `input` does, or, when `input` is a socket, when
/// serving ends first; a pipe that is never closed keeps its reader until the process
/// exits.
pub async fn serve_fds(
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
    input: OwnedFd,
    output: OwnedFd,
) -> Result<(), McpError> {
    let output = match stdio::output(output) {
        Ok(output) => output,
        Err(source) => {
            return Err(McpError::Serve {
                server: options.server_name,
                transport: "stdio",
                source: source.into(),
            });
        }
    };
    serve_threaded(provider, options, input.into(), output).await
}

async fn serve_threaded(
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
    input: std::fs::File,
    output: session::FdOutput,
) -> Result<(), McpError> {
    let shared = Shared::new(provider, options);
    let server = shared.options().server_name.clone();
    session::run_threaded(Gateway::new(shared), input, output)
        .await
        .map_err(|source| McpError::Serve { server, transport: "stdio", source })
}

/// Serves `provider` over a pair of byte streams carrying newline-delimited JSON-RPC, as
/// on stdio, until `reader` ends.
pub async fn serve_io<R, W>(
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
    reader: R,
    writer: W,
) -> Result<(), McpError>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let shared = Shared::new(provider, options);
    let server = shared.options().server_name.clone();
    session::run(Gateway::new(shared), reader, writer).await.map_err(|source| McpError::Serve {
        server,
        transport: "stdio",
        source,
    })
}

/// Serves `provider` over streamable HTTP at `http://{addr}/mcp` until `shutdown` is
/// cancelled; open sessions are closed then.
pub async fn serve_http(
    provider: Arc<dyn ToolProvider>,
    addr: SocketAddr,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<(), McpError> {
    let name = options.server_name.clone();
    let (_, server) = bind_http(provider, addr, options, shutdown).await?;
    server.await.unwrap_or_else(|error| {
        Err(McpError::Serve { server: name, transport: "http", source: error.into() })
    })
}

/// Binds `addr` (port 0 picks a free port) and serves `provider` there in a spawned task,
/// as [`serve_http`] does. Returns the bound address and the task, which ends after
/// `shutdown` is cancelled.
pub async fn bind_http(
    provider: Arc<dyn ToolProvider>,
    addr: SocketAddr,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<Result<(), McpError>>), McpError> {
    let server = options.server_name.clone();
    let listener = http::bind(&server, addr).await?;
    let bound = listener.local_addr().map_err(|source| McpError::Serve {
        server: server.clone(),
        transport: "http",
        source: source.into(),
    })?;
    // Replicas sharing a directory seal `requestState` with one key, so that a stateless
    // request's next round may reach any of them.
    let shared = match &options.affinity {
        Some(affinity) => {
            let seal = affinity::shared_seal(affinity).await.map_err(|why| McpError::Serve {
                server: server.clone(),
                transport: "http",
                source: why.into(),
            })?;
            Shared::with_seal(provider, options, Ok(seal))
        }
        None => Shared::new(provider, options),
    };
    // Clients of every kind share the served names: no one client's profile is taken.
    shared.naming();
    shared.keep_listing(shutdown.child_token());
    let registry =
        shared.options().affinity.as_ref().and_then(|a| affinity::Registry::new(a, bound));
    if let Some(registry) = &registry {
        shared.share_tasks(registry.clone());
    }
    let router = http::router(shared, bound, shutdown.child_token(), registry.clone());
    let task = tokio::spawn(async move {
        let served = http::run(server, listener, router, shutdown).await;
        // The other replicas stop forwarding to this one at once rather than when the
        // records' time to live ends.
        if let Some(registry) = registry {
            registry.release_all().await;
        }
        served
    });
    Ok((bound, task))
}
