//! Helpers of the server tests: an rmcp client that records notifications, connections over
//! an in-process stdio pair and over HTTP, polling with a timeout, and the test peers.

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ProgressNotificationParam, ProtocolVersion,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient};
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use toolmux_core::ToolProvider;
use toolmux_mcp::McpError;
use toolmux_mcp::server::{ServeOptions, bind_http, serve_fds, serve_io};

/// Installs ring as rustls's crypto provider, which reqwest (built without one) needs.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Every wait in these tests ends after this long.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// An rmcp client handler that records progress, list-changed and resource-updated
/// notifications.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    pub list_changed: Arc<AtomicUsize>,
    /// The URIs of `notifications/resources/updated`, in order.
    pub updated: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.fetch_add(1, Ordering::SeqCst);
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.updated.lock().unwrap().push(params.uri);
    }
}

pub type Client = RunningService<RoleClient, Recorder>;

/// Which protocol generation a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// The `initialize` handshake.
    Initialize,
    /// The stateless 2026-07-28 revision (`server/discover`, per-request metadata).
    Discover,
}

fn lifecycle_mode(lifecycle: Lifecycle) -> ClientLifecycleMode {
    match lifecycle {
        Lifecycle::Initialize => ClientLifecycleMode::Initialize,
        Lifecycle::Discover => ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    }
}

/// A client connected to `provider` served over an in-process stdio pair, and the
/// server's task, which ends when the client closes its side. The server runs as
/// `toolmux serve --stdio` does: [`serve_fds`], a reader thread on one end of a Unix
/// socket pair.
pub async fn connect_io(
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
    lifecycle: Lifecycle,
) -> (Client, Recorder, JoinHandle<Result<(), McpError>>) {
    let (client_io, server) = socket_pair(provider, options);
    let recorder = Recorder::default();
    let client =
        within(recorder.clone().serve_with_lifecycle(client_io, lifecycle_mode(lifecycle)))
            .await
            .expect("client connects");
    (client, recorder, server)
}

/// `provider` served with [`serve_fds`] on one end of a Unix socket pair (the same socket
/// as input and output); the other end, and the server's task.
pub fn socket_pair(
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
) -> (tokio::net::UnixStream, JoinHandle<Result<(), McpError>>) {
    let (client_end, server_end) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    let input = std::os::fd::OwnedFd::from(server_end.try_clone().expect("a duplicate"));
    let server = tokio::spawn(serve_fds(provider, options, input, server_end.into()));
    client_end.set_nonblocking(true).expect("non-blocking");
    (tokio::net::UnixStream::from_std(client_end).expect("a tokio socket"), server)
}

/// As [`connect_io`], served with [`serve_io`] on async streams (every read and write on
/// the runtime).
pub async fn connect_streams(
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
    lifecycle: Lifecycle,
) -> (Client, Recorder, JoinHandle<Result<(), McpError>>) {
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let (reader, writer) = tokio::io::split(server_io);
    let server = tokio::spawn(serve_io(provider, options, reader, writer));
    let recorder = Recorder::default();
    let client =
        within(recorder.clone().serve_with_lifecycle(client_io, lifecycle_mode(lifecycle)))
            .await
            .expect("client connects");
    (client, recorder, server)
}

/// An HTTP server for `provider` on 127.0.0.1 and a way to stop it.
pub struct HttpServer {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), McpError>>,
}

impl HttpServer {
    pub async fn start(provider: Arc<dyn ToolProvider>, options: ServeOptions) -> HttpServer {
        let shutdown = CancellationToken::new();
        let (addr, task) =
            bind_http(provider, "127.0.0.1:0".parse().unwrap(), options, shutdown.clone())
                .await
                .expect("binds");
        HttpServer { addr, shutdown, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    pub async fn connect(&self, lifecycle: Lifecycle) -> (Client, Recorder) {
        install_crypto();
        let recorder = Recorder::default();
        let transport = StreamableHttpClientTransport::from_uri(self.url());
        let client =
            within(recorder.clone().serve_with_lifecycle(transport, lifecycle_mode(lifecycle)))
                .await
                .expect("client connects");
        (client, recorder)
    }

    /// Stops the server and checks that it ended cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        within(self.task).await.expect("server task joins").expect("server ends cleanly");
    }
}

/// Awaits `future`, failing the test after [`TIMEOUT`].
pub async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, future).await.expect("timed out")
}

pub use toolmux_test_support::eventually;

/// Calls `name` with `arguments`.
pub async fn call(client: &Client, name: &str, arguments: Value) -> CallToolResult {
    let Value::Object(arguments) = arguments else { panic!("arguments must be an object") };
    within(client.call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments)))
        .await
        .unwrap_or_else(|e| panic!("call of {name} failed: {e}"))
}

/// A raw stateless (2026-07-28) `tools/call` request of `tool` with `arguments`: its
/// `_meta` stands in for the handshake, naming the revision, a raw client and
/// `capabilities`.
pub fn stateless_request(tool: &str, arguments: Value, capabilities: Value) -> Value {
    serde_json::json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
                "io.modelcontextprotocol/clientCapabilities": capabilities
            }
        }
    })
}

/// POSTs `request`, a stateless `tools/call` of `tool`, to `url` with the headers such a
/// request carries and `headers` added; returns the status and the body (a JSON answer,
/// or an event stream).
pub async fn post_stateless_call(
    url: &str,
    tool: &str,
    request: &Value,
    headers: &[(&str, &str)],
) -> (u16, String) {
    install_crypto();
    let mut post = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool);
    for (name, value) in headers {
        post = post.header(*name, *value);
    }
    let response = within(post.body(request.to_string()).send()).await.expect("response");
    let status = response.status().as_u16();
    (status, within(response.text()).await.expect("body"))
}

/// The text of a result's first content block.
pub fn first_text(result: &CallToolResult) -> String {
    result.content.first().and_then(|c| c.as_text()).map(|t| t.text.clone()).unwrap_or_default()
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file of an installed test peer; fails the test when the peer is missing.
pub fn peer(relative: &str, name: &str) -> PathBuf {
    let path = repo_root().join(".peers").join(relative);
    assert!(path.exists(), "missing test peer {name}: run .ci/install-peers");
    path
}

/// The serve fixture serving HTTP at `address` (port 0: a free one) with `args` after it,
/// as a process of its own: its `http://ADDR/mcp`, and the process, killed when dropped.
pub async fn http_fixture(address: &str, args: &[&str]) -> FixtureProcess {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolmux-mcp-serve-fixture"))
        .args(["http", address])
        .args(args)
        .current_dir(repo_root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("fixture starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = within(lines.next_line()).await.expect("reads").expect("a listening line");
    let url = line.strip_prefix("listening ").expect("listening line").to_owned();
    FixtureProcess { url, child: ChildGuard(Some(child)) }
}

/// The serve fixture over HTTP (see [`http_fixture`]).
pub struct FixtureProcess {
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    pub child: ChildGuard,
}

/// A child process killed and reaped when dropped.
pub struct ChildGuard(pub Option<tokio::process::Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.start_kill();
            // Reap it so that no zombie outlives the test: `try_wait` asks the kernel
            // directly, where a wait on another runtime missed the exit and sat out its
            // whole timeout.
            let deadline = std::time::Instant::now() + TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}
