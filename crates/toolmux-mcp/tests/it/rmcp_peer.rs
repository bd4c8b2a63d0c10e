//! Against an rmcp server run inside the test over streamable HTTP and WebSocket: both
//! protocol revisions, list changes on each (a notification, or a 2026-07-28 subscription),
//! hangs, slow starts, a server dying mid-call and malformed replies.

use futures::{SinkExt, StreamExt};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, DiscoverResult,
    Implementation, InitializeRequestParams, InitializeResult, JsonObject, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig, SubscriptionFilter,
    Tool,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use toolmux_core::{CallContext, ToolError, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, ProtocolMode, TransportKind};
use toolmux_test_support::conformance::{Conformance, SampleCall};
use toolmux_test_support::eventually;

/// A server whose behaviour the test scripts.
#[derive(Clone)]
struct FaultServer {
    extra: Arc<AtomicBool>,
    changes: broadcast::Sender<()>,
    slow_start: Option<Duration>,
    /// Cancelled by the `die` tool: the whole HTTP service stops mid-call.
    die: CancellationToken,
    /// Calls of `hang` started, and those the client cancelled.
    hangs: Arc<AtomicUsize>,
    hangs_cancelled: Arc<AtomicUsize>,
    /// `subscriptions/listen` streams opened.
    listens: Arc<AtomicUsize>,
    /// Told by `end_listens`: every open `subscriptions/listen` stream ends.
    end_listens: broadcast::Sender<()>,
}

impl FaultServer {
    fn new(slow_start: Option<Duration>, die: CancellationToken) -> FaultServer {
        FaultServer {
            extra: Arc::default(),
            changes: broadcast::channel(16).0,
            slow_start,
            die,
            hangs: Arc::default(),
            hangs_cancelled: Arc::default(),
            listens: Arc::default(),
            end_listens: broadcast::channel(4).0,
        }
    }
}

fn schema() -> JsonObject {
    serde_json::from_value(json!({"type": "object", "properties": {"message": {"type": "string"}}}))
        .unwrap()
}

impl ServerHandler for FaultServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build(),
        )
        .with_server_info(Implementation::new("rmcp-fault", "1.0.0"))
        .with_instructions("rmcp fault server")
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        if let Some(delay) = self.slow_start {
            tokio::time::sleep(delay).await;
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        if let Some(delay) = self.slow_start {
            tokio::time::sleep(delay).await;
        }
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut names = vec!["echo", "hang", "add_tool", "die", "headers", "end_listens"];
        if self.extra.load(Ordering::SeqCst) {
            names.push("extra");
        }
        let tools = names
            .into_iter()
            .map(|name| Tool::new(name, format!("rmcp fault tool {name}"), schema()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = match request.name.as_ref() {
            "echo" => {
                let args = request.arguments.unwrap_or_default();
                format!("rmcp echo: {}", args.get("message").and_then(|m| m.as_str()).unwrap_or(""))
            }
            "hang" => {
                self.hangs.fetch_add(1, Ordering::SeqCst);
                context.ct.cancelled().await;
                self.hangs_cancelled.fetch_add(1, Ordering::SeqCst);
                return Err(ErrorData::internal_error("cancelled", None));
            }
            "add_tool" => {
                self.extra.store(true, Ordering::SeqCst);
                let modern =
                    context.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
                if modern {
                    let _ = self.changes.send(());
                } else {
                    let _ = context.peer.notify_tool_list_changed().await;
                }
                "added".into()
            }
            // Adds `extra` telling nobody, and ends every subscription stream (as a proxy
            // closing idle streams does): the change is missed unless the client lists
            // again when it subscribes again.
            "end_listens" => {
                self.extra.store(true, Ordering::SeqCst);
                let _ = self.end_listens.send(());
                "ended".into()
            }
            "die" => {
                self.die.cancel();
                std::future::pending::<()>().await;
                unreachable!("pending never resolves")
            }
            "extra" => "extra".into(),
            // A result of `bytes` bytes of text.
            "big" => {
                let args = request.arguments.unwrap_or_default();
                let bytes = args.get("bytes").and_then(serde_json::Value::as_u64).unwrap_or(1);
                "x".repeat(usize::try_from(bytes).unwrap())
            }
            // What arrived with the call: some of its HTTP headers, and its `_meta`.
            "headers" => {
                let parts = context.extensions.get::<axum::http::request::Parts>();
                let header = |name: &str| {
                    parts.and_then(|p| p.headers.get(name)).and_then(|v| v.to_str().ok())
                };
                json!({
                    "x-tenant-id": header("x-tenant-id"),
                    "authorization": header("authorization"),
                    "x-api-key": header("x-api-key"),
                    "meta": request.meta.as_ref().map(|m| serde_json::to_value(m).unwrap()),
                })
                .to_string()
            }
            other => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "unknown tool {other}"
                ))])
                .into());
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let mut changes = self.changes.subscribe();
        let mut end = self.end_listens.subscribe();
        self.listens.fetch_add(1, Ordering::SeqCst);
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                _ = end.recv() => return Ok(()),
                change = changes.recv() => {
                    if change.is_err() {
                        return Ok(());
                    }
                    let _ = context.sink().notify_tool_list_changed().await;
                }
            }
        }
    }
}

/// A running in-process HTTP server; stops on drop.
struct HttpPeer {
    url: String,
    stop: CancellationToken,
    hangs: Arc<AtomicUsize>,
    hangs_cancelled: Arc<AtomicUsize>,
    listens: Arc<AtomicUsize>,
}

impl Drop for HttpPeer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn http_peer(slow_start: Option<Duration>) -> HttpPeer {
    let stop = CancellationToken::new();
    let server = FaultServer::new(slow_start, stop.clone());
    let (hangs, hangs_cancelled) = (server.hangs.clone(), server.hangs_cancelled.clone());
    let listens = server.listens.clone();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let died = stop.clone();
    // Its own runtime on its own thread: when it is dropped, every connection task goes
    // with it and the sockets close, as when a server process crashes.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let service = StreamableHttpService::new(
                move || Ok(server.clone()),
                LocalSessionManager::default().into(),
                StreamableHttpServerConfig::default(),
            );
            let router = axum::Router::new().nest_service("/mcp", service);
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tokio::select! {
                _ = axum::serve(listener, router) => {}
                () = died.cancelled() => {}
            }
        });
    });
    HttpPeer { url, stop, hangs, hangs_cancelled, listens }
}

fn http_provider(peer: &HttpPeer, mode: ProtocolMode) -> McpProvider {
    let config = McpServerConfig::remote(TransportKind::Http, peer.url.clone()).with_protocol(mode);
    McpProvider::new("rmcp", config).unwrap()
}

fn conformance() -> Conformance {
    Conformance::new()
        .with_sample(
            SampleCall::new("echo", json!({"message": "hi"})).expect_text_contains("rmcp echo: hi"),
        )
        .with_cancellable(SampleCall::new("hang", json!({})))
}

/// A 2026-07-28 server with prompts alone, which announces changes of them only: each
/// message on `changes` is told to its `subscriptions/listen` streams.
#[derive(Clone)]
struct PromptsOnly {
    changes: broadcast::Sender<()>,
}

impl ServerHandler for PromptsOnly {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder().enable_prompts().enable_prompts_list_changed().build(),
        )
        .with_server_info(Implementation::new("rmcp-prompts", "1.0.0"))
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().prompts_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let mut changes = self.changes.subscribe();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                change = changes.recv() => {
                    if change.is_err() {
                        return Ok(());
                    }
                    let _ = context.sink().notify_prompt_list_changed().await;
                }
            }
        }
    }
}

/// A 2026-07-28 server announcing changes of its prompts but not of its tools is listened
/// to: the subscription was made only when the server announced tool list changes, so a
/// prompts-only or resources-only server's changes never reached the gateway's clients.
#[tokio::test]
async fn http_2026_07_28_prompt_changes_are_heard_without_tool_changes() {
    let server = PromptsOnly { changes: broadcast::channel(16).0 };
    let changes = server.changes.clone();
    let stop = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let stopped = stop.clone();
    let served = tokio::spawn(async move {
        axum::serve(listener, router).with_graceful_shutdown(stopped.cancelled_owned()).await
    });
    let config =
        McpServerConfig::remote(TransportKind::Http, url).with_protocol(ProtocolMode::Auto);
    let provider = McpProvider::new("prompts", config).unwrap();
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    let mut heard = provider.prompt_list_changes().expect("prompt list changes");
    // The subscription is made in the background: tell changes until one is heard.
    let told = async {
        loop {
            let _ = changes.send(());
            if tokio::time::timeout(Duration::from_millis(200), heard.changed()).await.is_ok() {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), told).await.expect("a prompt change heard");
    provider.shutdown().await.unwrap();
    stop.cancel();
    let _ = served.await;
}

async fn list_changed_is_seen(provider: &McpProvider) {
    provider.warmup().await.unwrap();
    let mut changes = provider.tool_list_changes().unwrap();
    assert!(!provider.has_tool("extra").await);
    provider.call("add_tool", json!({}), &CallContext::new()).await.unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert_eq!(changed, Ok(true));
    assert!(provider.has_tool("extra").await);
}

#[tokio::test]
async fn http_2026_07_28_conformance_and_list_changed_by_subscription() {
    let peer = http_peer(None).await;
    let provider = http_provider(&peer, ProtocolMode::Auto);
    conformance().check(&provider).await;
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    assert_eq!(provider.instructions().as_deref(), Some("rmcp fault server"));
    list_changed_is_seen(&provider).await;
    provider.shutdown().await.unwrap();
}

/// A 2026-07-28 subscription stream that ends is subscribed to again, and the tools are
/// listed again then, so a change made while there was none is seen (list changes
/// stopped for good once the stream ended).
#[tokio::test]
async fn http_2026_07_28_a_subscription_that_ends_is_made_again() {
    let peer = http_peer(None).await;
    let provider = http_provider(&peer, ProtocolMode::Auto);
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    eventually("the subscription", || async { peer.listens.load(Ordering::SeqCst) == 1 }).await;
    let mut changes = provider.tool_list_changes().unwrap();
    assert!(!provider.has_tool("extra").await);
    provider.call("end_listens", json!({}), &CallContext::new()).await.unwrap();
    eventually("a new subscription", || async { peer.listens.load(Ordering::SeqCst) == 2 }).await;
    let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert_eq!(changed, Ok(true));
    assert!(provider.has_tool("extra").await, "listed again once subscribed again");
    provider.shutdown().await.unwrap();
}

/// A 2026-07-28 subscription whose answer stream ends before the server acknowledged it
/// (a proxy cutting it, the server dying mid-answer) is asked for again, as one that ends
/// later is: an answer lost on the way is no refusal. (The client took it for one and
/// stopped listening for good, so no list change of the connection reached it.)
#[tokio::test]
async fn http_2026_07_28_a_subscription_cut_before_its_acknowledgment_is_made_again() {
    use axum::response::IntoResponse;
    let cut = || ([("content-type", "text/event-stream")], "").into_response();
    list_changes_after_a_first_listen_answered_by(cut, None).await;
}

/// A 2026-07-28 subscription the server takes and never acknowledges (its event stream
/// open and silent) is given up after the request timeout and asked for again. (The
/// client waited for the acknowledgment for as long as the connection lived, so no list
/// change of the connection reached it.)
#[tokio::test]
async fn http_2026_07_28_a_subscription_never_acknowledged_is_asked_for_again() {
    use axum::response::IntoResponse;
    let silent = || {
        let never = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
        ([("content-type", "text/event-stream")], axum::body::Body::from_stream(never))
            .into_response()
    };
    list_changes_after_a_first_listen_answered_by(silent, Some(Duration::from_millis(500))).await;
}

/// Serves [`FaultServer`] over streamable HTTP with its first `subscriptions/listen`
/// answered by `first_listen` instead, connects a provider (with `request_timeout` when
/// given) and checks that the subscription is made again and carries a tool list change.
async fn list_changes_after_a_first_listen_answered_by(
    first_listen: fn() -> axum::response::Response,
    request_timeout: Option<Duration>,
) {
    let server = FaultServer::new(None, CancellationToken::new());
    let listens = server.listens.clone();
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let firsts = Arc::new(AtomicUsize::new(1));
    let taking = firsts.clone();
    let answer_first_listen = move |request: axum::extract::Request,
                                    next: axum::middleware::Next| {
        let taking = taking.clone();
        async move {
            let method = request.headers().get("mcp-method");
            let listen = method.is_some_and(|m| m == "subscriptions/listen");
            if listen
                && taking
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                return first_listen();
            }
            next.run(request).await
        }
    };
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(answer_first_listen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, router).await });
    let mut config =
        McpServerConfig::remote(TransportKind::Http, url).with_protocol(ProtocolMode::Auto);
    if let Some(timeout) = request_timeout {
        config = config.with_request_timeout(timeout);
    }
    let provider = McpProvider::new("rmcp", config).unwrap();
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    eventually("the subscription", || async { listens.load(Ordering::SeqCst) == 1 }).await;
    assert_eq!(firsts.load(Ordering::SeqCst), 0, "the first subscription was answered by the test");
    let mut changes = provider.tool_list_changes().unwrap();
    provider.call("add_tool", json!({}), &CallContext::new()).await.unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert_eq!(changed, Ok(true));
    assert!(provider.has_tool("extra").await);
    provider.shutdown().await.unwrap();
    task.abort();
}

#[tokio::test]
async fn http_legacy_conformance_and_list_changed_by_notification() {
    let peer = http_peer(None).await;
    let provider = http_provider(&peer, ProtocolMode::Legacy);
    conformance().check(&provider).await;
    assert_eq!(provider.protocol_version().as_deref(), Some("2025-11-25"));
    list_changed_is_seen(&provider).await;
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn http_hang_times_out() {
    let peer = http_peer(None).await;
    let config = McpServerConfig::remote(TransportKind::Http, peer.url.clone())
        .with_request_timeout(Duration::from_millis(300));
    let provider = McpProvider::new("rmcp", config).unwrap();
    let err = provider.call("hang", json!({}), &CallContext::new()).await.unwrap_err();
    assert!(matches!(err, ToolError::Timeout { .. }), "{err:?}");
    let out = provider.call("echo", json!({"message": "ok"}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "rmcp echo: ok");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn http_a_dropped_call_is_cancelled_on_the_server() {
    let peer = http_peer(None).await;
    for (round, mode) in [ProtocolMode::Legacy, ProtocolMode::Auto].into_iter().enumerate() {
        let provider = Arc::new(http_provider(&peer, mode));
        provider.warmup().await.unwrap();
        let caller = provider.clone();
        // Whoever awaited the call drops it without cancelling its context.
        let call = tokio::spawn(async move {
            let _ = caller.call("hang", json!({}), &CallContext::new()).await;
        });
        eventually("the call to reach the server", || async {
            peer.hangs.load(Ordering::SeqCst) > round
        })
        .await;
        call.abort();
        let _ = call.await;
        eventually(&format!("{mode:?}: the server to hear of it"), || async {
            peer.hangs_cancelled.load(Ordering::SeqCst) > round
        })
        .await;
        provider.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn http_slow_start_beyond_the_startup_timeout_fails_warmup() {
    let peer = http_peer(Some(Duration::from_secs(5))).await;
    let config = McpServerConfig::remote(TransportKind::Http, peer.url.clone())
        .with_startup_timeout(Duration::from_millis(400));
    let provider = McpProvider::new("rmcp", config).unwrap();
    let started = Instant::now();
    let err = provider.warmup().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    expect_test::expect!["rmcp: no answer to the handshake within 400ms"]
        .assert_eq(&err.to_string());
}

#[tokio::test]
async fn http_slow_start_within_the_startup_timeout_works() {
    let peer = http_peer(Some(Duration::from_millis(500))).await;
    let provider = http_provider(&peer, ProtocolMode::Legacy);
    provider.warmup().await.unwrap();
    let out = provider.call("echo", json!({"message": "late"}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "rmcp echo: late");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn http_server_dying_mid_call_fails_the_call_promptly() {
    let peer = http_peer(None).await;
    let provider = http_provider(&peer, ProtocolMode::Legacy);
    provider.warmup().await.unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        provider.call("die", json!({}), &CallContext::new()),
    )
    .await
    .expect("the call ends when the server dies");
    let err = outcome.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}: {err}", started.elapsed());
    assert!(err.to_string().starts_with("rmcp"), "names the server: {err}");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn http_refused_connection_names_the_server() {
    let port = crate::support::free_port();
    let config =
        McpServerConfig::remote(TransportKind::Http, format!("http://127.0.0.1:{port}/mcp"))
            .with_startup_timeout(Duration::from_secs(5));
    let provider = McpProvider::new("gone", config).unwrap();
    let err = provider.warmup().await.unwrap_err();
    assert!(err.to_string().starts_with("gone: "), "{err}");
    assert!(err.is_transient());
}

/// The same rmcp server over a WebSocket: each text frame one JSON-RPC message.
async fn websocket_peer() -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let die = stop.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                () = die.cancelled() => return,
                accepted = listener.accept() => accepted.unwrap(),
            };
            let die = die.clone();
            tokio::spawn(async move {
                let socket = tokio_tungstenite::accept_async(stream).await.unwrap();
                let (sink, stream) = socket.split();
                let stream = Box::pin(stream.filter_map(|frame| async move {
                    match frame {
                        Ok(tokio_tungstenite::tungstenite::Message::Text(text)) => {
                            serde_json::from_str(&text).ok()
                        }
                        _ => None,
                    }
                }));
                let sink = Box::pin(sink.with(
                    |message: rmcp::service::TxJsonRpcMessage<RoleServer>| async move {
                        let text = serde_json::to_string(&message).unwrap();
                        Ok::<_, tokio_tungstenite::tungstenite::Error>(
                            tokio_tungstenite::tungstenite::Message::Text(text.into()),
                        )
                    },
                ));
                let server = FaultServer::new(None, die);
                if let Ok(running) = server.serve((sink, stream)).await {
                    let _ = running.waiting().await;
                }
            });
        }
    });
    (url, stop)
}

#[tokio::test]
async fn websocket_conformance_and_list_changed() {
    let (url, stop) = websocket_peer().await;
    let config =
        McpServerConfig::remote(TransportKind::Websocket, url).with_protocol(ProtocolMode::Legacy);
    let provider = McpProvider::new("ws", config).unwrap();
    conformance().check(&provider).await;
    list_changed_is_seen(&provider).await;
    provider.shutdown().await.unwrap();
    stop.cancel();
}

#[tokio::test]
async fn websocket_auto_mode_negotiates_2026_07_28() {
    let (url, stop) = websocket_peer().await;
    let config = McpServerConfig::remote(TransportKind::Websocket, url);
    let provider = McpProvider::new("ws", config).unwrap();
    let out = provider.call("echo", json!({"message": "w"}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "rmcp echo: w");
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    list_changed_is_seen(&provider).await;
    provider.shutdown().await.unwrap();
    stop.cancel();
}

/// A WebSocket message of 20 MiB (past tungstenite's 16 MiB frame limit) arrives: a
/// WebSocket server may send what a stdio server may write, up to 128 MiB.
#[tokio::test]
async fn websocket_takes_a_message_as_long_as_stdio_does() {
    let (url, stop) = websocket_peer().await;
    let config =
        McpServerConfig::remote(TransportKind::Websocket, url).with_protocol(ProtocolMode::Legacy);
    let provider = McpProvider::new("ws", config).unwrap();
    let size = 20 << 20;
    let out = provider.call("big", json!({"bytes": size}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text().len(), size);
    provider.shutdown().await.unwrap();
    stop.cancel();
}

#[tokio::test]
async fn websocket_garbage_is_a_protocol_error_naming_it() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        // Several connections: the client retries without the `mcp` subprotocol.
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut socket = tokio_tungstenite::accept_async(stream).await.unwrap();
                while let Some(Ok(_)) = socket.next().await {
                    let garbage =
                        tokio_tungstenite::tungstenite::Message::Text("<html>502</html>".into());
                    if socket.send(garbage).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let config = McpServerConfig::remote(TransportKind::Websocket, url)
        .with_protocol(ProtocolMode::Legacy)
        .with_startup_timeout(Duration::from_secs(10));
    let provider = McpProvider::new("ws", config).unwrap();
    let started = Instant::now();
    let err = provider.warmup().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    expect_test::expect!["ws: protocol error: websocket frame is not JSON: `<html>502</html>`"]
        .assert_eq(&err.to_string());
    server.abort();
}

#[tokio::test]
async fn sse_endpoint_on_another_origin_is_refused() {
    // The endpoint event would send our headers (tokens) to another host.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/sse", listener.local_addr().unwrap());
    let router = axum::Router::new().route(
        "/sse",
        axum::routing::get(|| async {
            (
                [("content-type", "text/event-stream")],
                "event: endpoint\ndata: http://127.0.0.2:9/message\n\n",
            )
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let config = McpServerConfig::remote(TransportKind::Sse, url)
        .with_header("Authorization", "Bearer secret-token-value");
    let provider = McpProvider::new("sse", config).unwrap();
    let err = provider.warmup().await.unwrap_err();
    expect_test::expect!["sse: cannot connect over sse: the `endpoint` event points to another origin (http://127.0.0.2:9)"]
        .assert_eq(&err.report());
    assert!(!err.report().contains("secret-token-value"));
    server.abort();
}

#[tokio::test]
async fn http_headers_carry_a_bearer_token_which_no_error_repeats() {
    async fn require_token(
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        let authorized = request
            .headers()
            .get("authorization")
            .is_some_and(|v| v.as_bytes() == b"Bearer s3cret-token");
        if authorized {
            next.run(request).await
        } else {
            axum::response::IntoResponse::into_response(axum::http::StatusCode::UNAUTHORIZED)
        }
    }
    let server = FaultServer::new(None, CancellationToken::new());
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(require_token));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, router).await });

    let with_token = McpServerConfig::remote(TransportKind::Http, url.clone())
        .with_header("Authorization", "Bearer s3cret-token");
    let provider = McpProvider::new("auth", with_token).unwrap();
    let out = provider.call("echo", json!({"message": "in"}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "rmcp echo: in");
    provider.shutdown().await.unwrap();

    let wrong = McpServerConfig::remote(TransportKind::Http, url)
        .with_header("Authorization", "Bearer wrong-s3cret");
    let provider = McpProvider::new("auth", wrong).unwrap();
    let err = provider.warmup().await.unwrap_err();
    assert!(err.report().starts_with("auth: "), "{}", err.report());
    assert!(!err.report().contains("wrong-s3cret"), "{}", err.report());
    task.abort();
}

#[tokio::test]
async fn http_redirects_stay_within_the_origin_and_headers_never_leave_it() {
    // The other origin records the API key of every request it gets.
    let seen_elsewhere: Arc<std::sync::Mutex<Vec<Option<String>>>> = Arc::default();
    let record = seen_elsewhere.clone();
    let elsewhere = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let record = record.clone();
        async move {
            let key = request
                .headers()
                .get("x-api-key")
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
            record.lock().unwrap().push(key);
            axum::http::StatusCode::NOT_FOUND
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let elsewhere_url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let elsewhere_task = tokio::spawn(async move { axum::serve(listener, elsewhere).await });

    // This origin serves MCP at /mcp, redirects /old there and /away to the other origin.
    let server = FaultServer::new(None, CancellationToken::new());
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let to_elsewhere = elsewhere_url.clone();
    let redirect = |to: String| {
        move || {
            let to = to.clone();
            async move { (axum::http::StatusCode::TEMPORARY_REDIRECT, [("location", to)]) }
        }
    };
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .route("/old", axum::routing::any(redirect("/mcp".to_owned())))
        .route("/away", axum::routing::any(redirect(to_elsewhere)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, router).await });

    let config = |path: &str| {
        McpServerConfig::remote(TransportKind::Http, format!("{base}{path}"))
            .with_header("X-Api-Key", "k-s3cret")
            .with_startup_timeout(Duration::from_secs(10))
    };
    let near = McpProvider::new("near", config("/old")).unwrap();
    let out = near.call("echo", json!({"message": "in"}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "rmcp echo: in");
    near.shutdown().await.unwrap();

    let away = McpProvider::new("away", config("/away")).unwrap();
    let err = away.warmup().await.unwrap_err();
    assert!(err.report().starts_with("away: "), "{}", err.report());
    let elsewhere_origin = elsewhere_url.trim_end_matches("/mcp");
    let report = err.report().replace(elsewhere_origin, "ELSEWHERE").replace(&base, "BASE");
    expect_test::expect!["away: handshake failed: BASE/away answered with a redirect: the server redirected to another origin, ELSEWHERE, which is not followed: the configured headers and credentials would go there; if the server moved, set `url` to its new address"].assert_eq(&report);
    assert!(!err.report().contains("k-s3cret"), "{}", err.report());
    assert!(seen_elsewhere.lock().unwrap().is_empty(), "{:?}", seen_elsewhere.lock().unwrap());
    task.abort();
    elsewhere_task.abort();
}

/// `passthroughHeaders`: a gateway passes the headers it is told to from its client's
/// request on to the server with each call, never the key or token the client
/// authenticated with, and never inside the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_passes_on_the_headers_it_is_told_to_and_never_its_own_credential() {
    use toolmux_mcp::server::{ApiKey, ApiKeys, ServeOptions, bind_http};
    let peer = http_peer(None).await;
    let mut config = McpServerConfig::remote(TransportKind::Http, peer.url.clone())
        .with_protocol(ProtocolMode::Legacy);
    config.passthrough_headers =
        vec!["X-Tenant-Id".into(), "Authorization".into(), "X-API-Key".into()];
    let upstream: Arc<dyn ToolProvider> = Arc::new(McpProvider::new("up", config).unwrap());
    let key = "alice-key-0123456789";
    let options = ServeOptions {
        api_keys: ApiKeys::new(vec![ApiKey { name: "alice".into(), key: key.into() }]),
        ..ServeOptions::default()
    };
    let shutdown = CancellationToken::new();
    let (bound, _served) =
        bind_http(upstream, "127.0.0.1:0".parse().unwrap(), options, shutdown.clone())
            .await
            .unwrap();
    let seen = |headers: &[(&str, &str)]| {
        let mut config =
            McpServerConfig::remote(TransportKind::Http, format!("http://{bound}/mcp"))
                .with_protocol(ProtocolMode::Legacy);
        config.headers = headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
        async move {
            let client = McpProvider::new("gateway", config).unwrap();
            let out = client.call("headers", json!({}), &CallContext::new()).await.unwrap();
            client.shutdown().await.unwrap();
            serde_json::from_str::<serde_json::Value>(&out.to_text()).unwrap()
        }
    };
    let bearer = format!("Bearer {key}");
    let by_bearer = seen(&[("Authorization", &bearer), ("X-Tenant-Id", "acme")]).await;
    assert_eq!(by_bearer["x-tenant-id"], "acme", "{by_bearer}");
    assert_eq!(by_bearer["authorization"], serde_json::Value::Null, "{by_bearer}");
    let meta = by_bearer["meta"].to_string();
    assert!(!meta.contains("passthrough") && !meta.contains("acme"), "{meta}");
    // Authenticated by `X-API-Key`: that one stays, an `Authorization` meant for the server
    // goes on.
    let by_key = seen(&[
        ("X-API-Key", key),
        ("Authorization", "Basic dXA6c2VjcmV0"),
        ("X-Tenant-Id", "beta"),
    ])
    .await;
    assert_eq!(by_key["x-tenant-id"], "beta", "{by_key}");
    assert_eq!(by_key["authorization"], "Basic dXA6c2VjcmV0", "{by_key}");
    assert_eq!(by_key["x-api-key"], serde_json::Value::Null, "{by_key}");
    shutdown.cancel();
    peer.stop.cancel();

    let mut stdio = McpServerConfig::stdio("node", ["x"]);
    stdio.passthrough_headers = vec!["X-Tenant-Id".into()];
    let error = McpProvider::new("s", stdio).unwrap_err().to_string();
    assert!(
        error.contains("`passthroughHeaders` needs an HTTP server (streamable HTTP or SSE)"),
        "{error}"
    );
    let mut own = McpServerConfig::remote(TransportKind::Http, peer.url.clone());
    own.passthrough_headers = vec!["Mcp-Session-Id".into()];
    let error = McpProvider::new("s", own).unwrap_err().to_string();
    assert!(error.contains("never passed on"), "{error}");
}

/// A WebSocket server that closes the socket under a call fails the call at once with an
/// error naming the server and the close frame's code and reason; the next call connects
/// again.
#[tokio::test]
async fn a_websocket_closed_under_a_call_fails_it_at_once_naming_the_close() {
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    let tools = json!([{"name": "echo", "inputSchema": {"type": "object"}}]);
    let (url, server) = websocket_server("closer", tools, |call| match call {
        Some(_) => WsAnswer::Close(CloseFrame { code: 1011.into(), reason: "overloaded".into() }),
        None => WsAnswer::Handshake,
    })
    .await;
    let config = McpServerConfig::remote(TransportKind::Websocket, url)
        .with_protocol(ProtocolMode::Legacy)
        .with_request_timeout(Duration::from_secs(30));
    let provider = McpProvider::new("ws", config).unwrap();
    provider.warmup().await.unwrap();
    for _ in 0..2 {
        let started = Instant::now();
        let error = provider.call("echo", json!({}), &CallContext::new()).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        expect_test::expect![
            "ws: connection closed (the server closed the websocket (1011 overloaded))"
        ]
        .assert_eq(&error.report());
    }
    provider.shutdown().await.unwrap();
    server.abort();
}

/// A WebSocket server that stops reading (its socket's buffers fill under a large message)
/// ends its connection after the request timeout, with an error naming the server and what
/// happened; the next call connects again and works. The send waited for ever, and every
/// later message behind it.
#[tokio::test]
async fn a_websocket_server_that_stops_reading_ends_its_connection() {
    // Handshakes answered.
    let connections = Arc::new(AtomicUsize::new(0));
    let accepted = connections.clone();
    let tools = json!([
        {"name": "echo", "inputSchema": {"type": "object"}},
        {"name": "deaf", "inputSchema": {"type": "object"}},
    ]);
    let (url, server) = websocket_server("deaf", tools, move |call| match call {
        None => {
            accepted.fetch_add(1, Ordering::SeqCst);
            WsAnswer::Handshake
        }
        // Holds the socket and reads no more.
        Some("deaf") => WsAnswer::Hang,
        Some(_) => WsAnswer::Text("echo"),
    })
    .await;
    let config = McpServerConfig::remote(TransportKind::Websocket, url)
        .with_protocol(ProtocolMode::Legacy)
        .with_request_timeout(Duration::from_millis(1500));
    let provider = McpProvider::new("ws", config).unwrap();
    provider.warmup().await.unwrap();
    // The calls' own waits are longer: what ends them is the send's timeout.
    let ctx = CallContext::new().with_wait(Duration::from_secs(20));
    let started = Instant::now();
    let deaf = provider.call("deaf", json!({}), &ctx);
    let big = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        // More than loopback's socket buffers hold.
        let arguments = json!({"padding": "x".repeat(32 << 20)});
        provider.call("echo", arguments, &ctx).await
    };
    let (deaf, big) = tokio::join!(deaf, big);
    assert!(started.elapsed() < Duration::from_secs(8), "took {:?}", started.elapsed());
    expect_test::expect!["ws: connection closed (a message sent to the server was not taken within 1500 ms (`requestTimeoutMs`); it stopped reading)"]
        .assert_eq(&big.unwrap_err().report());
    assert!(deaf.is_err(), "{deaf:?}");
    let out = provider.call("echo", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "echo");
    assert_eq!(connections.load(Ordering::SeqCst), 2, "connected again");
    provider.shutdown().await.unwrap();
    server.abort();
}

/// What [`websocket_server`] does with a message: a call of the named tool (`Some`), or the
/// handshake's `initialize` (`None`).
enum WsAnswer {
    /// Answers the handshake.
    Handshake,
    /// Answers the call with this text.
    Text(&'static str),
    /// Closes the socket with this frame instead of answering.
    Close(tokio_tungstenite::tungstenite::protocol::CloseFrame),
    /// Holds the socket and reads no more.
    Hang,
}

/// A hand-written MCP server over WebSocket named `name`, listing `tools` and treating
/// each call (and each `initialize`) as `answer` says; its URL and the task that serves.
async fn websocket_server(
    name: &'static str,
    tools: serde_json::Value,
    answer: impl Fn(Option<&str>) -> WsAnswer + Send + Sync + 'static,
) -> (String, tokio::task::JoinHandle<()>) {
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    let server = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (answer, tools) = (answer.clone(), tools.clone());
            tokio::spawn(async move {
                let mut socket = tokio_tungstenite::accept_async(stream).await.unwrap();
                while let Some(Ok(Message::Text(text))) = socket.next().await {
                    let request: serde_json::Value = serde_json::from_str(&text).unwrap();
                    let result = match request["method"].as_str() {
                        Some("initialize") => {
                            let _ = answer(None);
                            json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                                   "serverInfo": {"name": name, "version": "1"}})
                        }
                        Some("tools/list") => json!({ "tools": tools }),
                        Some("tools/call") => match answer(request["params"]["name"].as_str()) {
                            WsAnswer::Handshake => continue,
                            WsAnswer::Text(text) => {
                                json!({"content": [{"type": "text", "text": text}]})
                            }
                            WsAnswer::Close(frame) => {
                                let _ = socket.send(Message::Close(Some(frame))).await;
                                continue;
                            }
                            WsAnswer::Hang => std::future::pending().await,
                        },
                        _ => continue,
                    };
                    let line = json!({"jsonrpc": "2.0", "id": request["id"], "result": result});
                    if socket.send(Message::Text(line.to_string().into())).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, server)
}
