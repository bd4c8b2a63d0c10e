//! Serving over streamable HTTP on 127.0.0.1, driven by rmcp's client and raw requests.

use crate::provider::Fixture;
use crate::support::{HttpServer, Lifecycle, call, eventually, first_text, within};
use rmcp::model::{CallToolRequestParams, SubscriptionFilter};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use toolmux_core::{ToolProvider, ToolSpec};
use toolmux_mcp::server::{
    ApiKey, ApiKeys, DirectoryFuture, ServeOptions, SessionAffinity, SessionDirectory,
};
use toolmux_test_support::mock::{Behavior, MockProvider};

#[tokio::test]
async fn calls_over_both_protocol_generations() {
    let server = HttpServer::start(Arc::new(Fixture::new(250)), ServeOptions::default()).await;
    for lifecycle in [Lifecycle::Initialize, Lifecycle::Discover] {
        let (client, _) = server.connect(lifecycle).await;
        let tools = within(client.list_all_tools()).await.unwrap();
        assert!(tools.len() > 250, "{lifecycle:?}: every page is read");
        assert_eq!(first_text(&call(&client, "echo", json!({"message": "hi"})).await), "echo: hi");
        let failed = call(&client, "fail", json!({})).await;
        assert_eq!(failed.is_error, Some(true), "{lifecycle:?}");
        within(client.cancel()).await.unwrap();
    }
    server.stop().await;
}

#[tokio::test]
async fn a_panicking_tool_is_answered_over_both_protocol_generations() {
    let mock = MockProvider::new("mock")
        .with_tool("panics", Behavior::Panic)
        .with_tool("a", Behavior::Echo);
    let server = HttpServer::start(Arc::new(mock), ServeOptions::default()).await;
    for lifecycle in [Lifecycle::Initialize, Lifecycle::Discover] {
        let (client, _) = server.connect(lifecycle).await;
        let result = call(&client, "panics", json!({})).await;
        assert_eq!(result.is_error, Some(true), "{lifecycle:?}");
        assert!(first_text(&result).contains("panicked on purpose"), "{}", first_text(&result));
        assert_ne!(call(&client, "a", json!({"x": 1})).await.is_error, Some(true), "{lifecycle:?}");
        within(client.cancel()).await.unwrap();
    }
    server.stop().await;
}

#[tokio::test]
async fn sessions_are_runs_and_see_list_changes() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let (legacy, recorder) = server.connect(Lifecycle::Initialize).await;
    let (modern, _) = server.connect(Lifecycle::Discover).await;
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let mut subscription = within(modern.listen(filter)).await.unwrap();
    // Let the legacy session's notification stream be established before the change.
    within(legacy.list_all_tools()).await.unwrap();
    mock.add_tool("b", Behavior::Echo);
    eventually("list_changed over the session", || async {
        recorder.list_changed.load(Ordering::SeqCst) >= 1
    })
    .await;
    let notification = within(subscription.next()).await.unwrap().expect("a notification");
    let method = serde_json::to_value(&notification).unwrap()["method"].clone();
    assert_eq!(method, "notifications/tools/list_changed");
    within(legacy.cancel()).await.unwrap();
    within(modern.cancel()).await.unwrap();
    server.stop().await;
}

/// When a client closes its session, the provider is told its run ended (so a
/// per-session upstream server goes at once); other sessions' runs go on.
#[tokio::test]
async fn a_closed_session_ends_its_run() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("run", Behavior::RunId));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let (first, _) = server.connect(Lifecycle::Initialize).await;
    let (second, _) = server.connect(Lifecycle::Initialize).await;
    let run = first_text(&call(&first, "run", json!({})).await);
    let other = first_text(&call(&second, "run", json!({})).await);
    assert_ne!(run, other);
    assert!(mock.ended_runs().is_empty(), "{:?}", mock.ended_runs());
    within(first.cancel()).await.unwrap();
    eventually("the closed session's run ended", || async { mock.ended_runs().contains(&run) })
        .await;
    assert!(!mock.ended_runs().contains(&other), "{:?}", mock.ended_runs());
    within(second.cancel()).await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn an_abandoned_call_cancels_the_tool() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    for lifecycle in [Lifecycle::Initialize, Lifecycle::Discover] {
        let (client, _) = server.connect(lifecycle).await;
        let client = Arc::new(client);
        let caller = client.clone();
        let call = tokio::spawn(async move {
            let _ = caller.call_tool(CallToolRequestParams::new("hang")).await;
        });
        eventually("the call to start", || async { mock.in_flight() == 1 }).await;
        // Dropping the call's future abandons it; rmcp then sends `notifications/cancelled`.
        call.abort();
        let _ = call.await;
        eventually("the call to end", || async { mock.in_flight() == 0 }).await;
        let client = Arc::try_unwrap(client).expect("the call's task is gone");
        within(client.cancel()).await.unwrap();
    }
    assert_eq!(mock.calls_of("hang"), 2);
    server.stop().await;
}

/// A tool whose `region` argument a client mirrors into the `Mcp-Param-Region` header.
fn header_tool(name: &str) -> ToolSpec {
    ToolSpec::new(
        name,
        "mirrors region into a header",
        json!({
            "type": "object",
            "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
            "required": ["region"],
        }),
    )
}

/// A raw stateless (2026-07-28) `tools/call` POST of `tool` with `arguments`, `meta`'s
/// entries added to the request's `_meta` and `headers` added to its headers; returns the
/// status and the body (a JSON answer, or an event stream that [`sse_messages`] reads).
pub(crate) async fn stateless_post(
    url: &str,
    tool: &str,
    arguments: Value,
    meta: Value,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut body = crate::support::stateless_request(tool, arguments, json!({}));
    for (key, value) in meta.as_object().expect("_meta entries as an object") {
        body["params"]["_meta"][key] = value.clone();
    }
    crate::support::post_stateless_call(url, tool, &body, headers).await
}

/// The JSON messages of an event stream's `data:` lines, in order (a priming event's empty
/// data is none).
pub(crate) fn sse_messages(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter(|data| !data.trim().is_empty())
        .map(|data| serde_json::from_str(data.trim()).expect("JSON data"))
        .collect()
}

/// The JSON-RPC answer in `text`: a JSON body, or the last message of an event stream.
fn answer_of(text: &str) -> Value {
    sse_messages(text)
        .pop()
        .unwrap_or_else(|| serde_json::from_str(text).expect("a JSON-RPC answer"))
}

/// A raw stateless `tools/call` POST of `tool` with `region` in the body and `header` in
/// `Mcp-Param-Region`; returns the status and the body.
async fn stateless_call(url: &str, tool: &str, region: &str, header: &str) -> (u16, String) {
    let arguments = json!({"region": region});
    stateless_post(url, tool, arguments, json!({}), &[("mcp-param-region", header)]).await
}

/// The text a raw stateless `tools/call` of `tool` (no arguments) returns, with `key` as
/// the bearer token when given.
async fn stateless_text(url: &str, tool: &str, key: Option<&str>) -> String {
    let bearer = key.map(|key| format!("Bearer {key}"));
    let headers: Vec<_> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
    let (_, text) = stateless_post(url, tool, json!({}), json!({}), &headers).await;
    let answer = answer_of(&text);
    answer["result"]["content"][0]["text"].as_str().expect("a text result").to_owned()
}

/// The requests of stateless clients share one run (files read before being written,
/// spilled outputs, per-session servers and budgets outlive a request); every session of
/// the handshake revisions is a run of its own.
#[tokio::test]
async fn stateless_requests_share_a_run_and_sessions_have_their_own() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("run", Behavior::RunId));
    let server = HttpServer::start(mock, ServeOptions::default()).await;
    let url = server.url();
    let first = stateless_text(&url, "run", None).await;
    assert_eq!(stateless_text(&url, "run", None).await, first);
    assert!(first.ends_with("-stateless"), "{first}");
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (client, _) = server.connect(Lifecycle::Initialize).await;
        sessions.push(first_text(&call(&client, "run", json!({})).await));
        within(client.cancel()).await.unwrap();
    }
    assert!(sessions[0] != sessions[1] && !sessions.contains(&first), "{sessions:?} {first}");
    server.stop().await;

    // With keys: each holder's stateless requests share the holder's run, kept apart from
    // other holders' as every run of a holder is (`key:HOLDER/…`).
    let keys = ApiKeys::new(vec![
        ApiKey { name: "alice".into(), key: "alice-key-0123456789".into() },
        ApiKey { name: "bob".into(), key: "bob-key-0123456789ab".into() },
    ]);
    let mock = Arc::new(MockProvider::new("mock").with_tool("run", Behavior::RunId));
    let server =
        HttpServer::start(mock, ServeOptions { api_keys: keys, ..Default::default() }).await;
    let url = server.url();
    let alice = stateless_text(&url, "run", Some("alice-key-0123456789")).await;
    assert_eq!(alice, "key:alice/stateless");
    assert_eq!(stateless_text(&url, "run", Some("alice-key-0123456789")).await, alice);
    assert_eq!(
        stateless_text(&url, "run", Some("bob-key-0123456789ab")).await,
        "key:bob/stateless"
    );
    server.stop().await;
}

#[tokio::test]
async fn param_headers_are_checked_before_any_listing_and_after_a_change() {
    let mock = Arc::new(MockProvider::new("mock").with_spec(header_tool("first"), Behavior::Echo));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let url = server.url();
    // No client has listed the tools: the server read them itself when it started.
    let (status, body) = stateless_call(&url, "first", "us", "eu").await;
    assert_eq!(status, 400, "a header that contradicts the body is refused: {body}");
    assert!(body.contains("Region"), "the refusal names the header: {body}");
    let (status, body) = stateless_call(&url, "first", "eu", "eu").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#"\"region\":\"eu\""#), "the mock echoes the arguments: {body}");
    // A tool added later is checked as soon as the change is known, without a listing.
    mock.add_spec(header_tool("second"), Behavior::Echo);
    eventually("the new tool's header to be checked", || async {
        stateless_call(&url, "second", "us", "eu").await.0 == 400
    })
    .await;
    let (status, body) = stateless_call(&url, "second", "eu", "eu").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(mock.calls_of("first") + mock.calls_of("second"), 2);
    server.stop().await;
}

/// A raw `initialize` POST with the given extra headers; returns the status.
async fn initialize_status(url: &str, headers: &[(&str, &str)]) -> u16 {
    initialize_response(url, headers).await.status().as_u16()
}

/// A refused raw `initialize` POST with the given extra headers: its status and its body's
/// JSON-RPC error message.
async fn initialize_refusal(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let response = initialize_response(url, headers).await;
    let status = response.status().as_u16();
    let kind = response.headers().get("content-type").cloned();
    assert_eq!(kind.as_ref().and_then(|v| v.to_str().ok()), Some("application/json"));
    let body: Value = within(response.json()).await.expect("a JSON body");
    assert_eq!((&body["jsonrpc"], &body["id"]), (&json!("2.0"), &json!(1)), "{body}");
    (status, body["error"]["message"].as_str().expect("a message").to_owned())
}

/// A raw `initialize` POST with the given extra headers.
async fn initialize_response(url: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}
        }
    });
    crate::support::install_crypto();
    let mut request = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    within(request.send()).await.expect("response")
}

#[tokio::test]
async fn foreign_hosts_and_origins_are_refused() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let url = server.url();
    let port = server.addr.port();
    assert_eq!(initialize_status(&url, &[]).await, 200);
    let localhost = format!("localhost:{port}");
    assert_eq!(initialize_status(&url, &[("host", &localhost)]).await, 200);
    assert_eq!(initialize_status(&url, &[("host", "evil.example")]).await, 403);
    let evil_with_port = format!("evil.example:{port}");
    assert_eq!(initialize_status(&url, &[("host", &evil_with_port)]).await, 403);
    assert_eq!(initialize_status(&url, &[("origin", "http://evil.example")]).await, 403);
    let local_origin = "http://localhost:5173";
    assert_eq!(initialize_status(&url, &[("origin", local_origin)]).await, 200);
    // The refusals say what was refused and how to allow it, as JSON-RPC errors.
    let (status, message) = initialize_refusal(&url, &[("host", "evil.example")]).await;
    assert_eq!(status, 403);
    assert!(message.contains("`Host` `evil.example`"), "{message}");
    assert!(message.contains("serve.allowedHosts"), "{message}");
    let (status, message) = initialize_refusal(&url, &[("origin", "http://evil.example")]).await;
    assert_eq!(status, 403);
    assert!(message.contains("a page from `http://evil.example`"), "{message}");
    server.stop().await;
}

/// A method `/mcp` does not serve is refused with the methods it does, as a JSON-RPC error.
#[tokio::test]
async fn an_unserved_method_is_told_the_methods_served() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    crate::support::install_crypto();
    let response =
        within(reqwest::Client::new().put(server.url()).body("{}").send()).await.expect("answer");
    assert_eq!(response.status().as_u16(), 405);
    let allow = response.headers().get("allow").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert!(allow.as_deref().is_some_and(|a| a.contains("POST")), "{allow:?}");
    let body: Value = within(response.json()).await.expect("a JSON body");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.starts_with("Method Not Allowed: `PUT`"), "{message}");
    server.stop().await;
}

#[tokio::test]
async fn configured_hosts_are_accepted() {
    let options =
        ServeOptions { allowed_hosts: vec!["tools.internal".into()], ..ServeOptions::default() };
    let server = HttpServer::start(Arc::new(Fixture::new(0)), options).await;
    let url = server.url();
    assert_eq!(initialize_status(&url, &[("host", "tools.internal")]).await, 200);
    // The bound address is always accepted; other loopback names are not, unless listed.
    assert_eq!(initialize_status(&url, &[]).await, 200);
    assert_eq!(initialize_status(&url, &[("host", "localhost")]).await, 403);
    server.stop().await;
}

#[tokio::test]
async fn binding_a_busy_port_fails_with_the_address() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let error = toolmux_mcp::server::serve_http(
        Arc::new(Fixture::new(0)),
        server.addr,
        ServeOptions::default(),
        shutdown,
    )
    .await
    .unwrap_err();
    let port = server.addr.port();
    assert_eq!(
        error.to_string(),
        format!(
            "cannot listen on 127.0.0.1:{port}: another program is using port {port}; choose \
             another port, or 127.0.0.1:0 for any free one"
        )
    );
    assert!(std::error::Error::source(&error).is_none(), "said once: {error:?}");
    server.stop().await;
}

#[tokio::test]
async fn shutdown_ends_open_sessions_and_running_calls() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let (legacy, _) = server.connect(Lifecycle::Initialize).await;
    let (modern, _) = server.connect(Lifecycle::Discover).await;
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let _subscription = within(modern.listen(filter)).await.unwrap();
    // rmcp's client does not notice the server going away during a call, so the call's
    // task is left to the end of the test.
    let _hanging = tokio::spawn(async move {
        let _ = legacy.call_tool(CallToolRequestParams::new("hang")).await;
    });
    eventually("the call to start", || async { mock.in_flight() == 1 }).await;
    // Returns although a session, a subscription and a call are open.
    server.stop().await;
    eventually("the call to be cancelled", || async { mock.in_flight() == 0 }).await;
}

/// Two real stdio MCP servers behind one gateway, as the orchestrator composes providers
/// (which this crate's tests may not link): tools named `{server}__{tool}`, health told
/// per server.
#[derive(Debug)]
struct Upstreams(Vec<toolmux_mcp::McpProvider>);

#[async_trait::async_trait]
impl ToolProvider for Upstreams {
    fn kind(&self) -> toolmux_core::ToolKind {
        toolmux_core::ToolKind::Composite
    }

    fn namespace(&self) -> &str {
        "upstreams"
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        let mut tools = Vec::new();
        for upstream in &self.0 {
            for mut tool in upstream.list_tools().await? {
                tool.name = format!("{}__{}", upstream.name(), tool.name);
                tools.push(tool);
            }
        }
        Ok(tools)
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &toolmux_core::CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        let unknown =
            || toolmux_core::ToolError::UnknownTool { name: name.into(), suggestions: vec![] };
        let (server, tool) = name.split_once("__").ok_or_else(unknown)?;
        let upstream = self.0.iter().find(|u| u.name() == server).ok_or_else(unknown)?;
        upstream.call(tool, arguments, ctx).await
    }

    fn health_by_provider(&self) -> Vec<toolmux_core::ProviderHealth> {
        self.0.iter().flat_map(ToolProvider::health_by_provider).collect()
    }
}

/// `GET /health`'s status and JSON body.
async fn get_health(server: &HttpServer) -> (u16, Value) {
    crate::support::install_crypto();
    let url = format!("http://{}/health", server.addr);
    let response = within(reqwest::Client::new().get(url).send()).await.expect("response");
    let status = response.status().as_u16();
    (status, within(response.json()).await.expect("a JSON body"))
}

/// An upstream that stops answering is found out by its health check and shown by
/// `/health` as degraded, by name, with no command line or URL; the gateway still answers
/// 200 and still serves the other upstream.
#[tokio::test]
async fn health_shows_a_degraded_upstream_by_name() {
    let fixture = env!("CARGO_BIN_EXE_toolmux-mcp-fixture");
    let upstream = |name: &str| {
        let config = toolmux_mcp::McpServerConfig::stdio(fixture, ["ok"])
            .with_base_dir(std::env::temp_dir())
            .with_health_check(std::time::Duration::from_millis(100));
        toolmux_mcp::McpProvider::new(name, config).unwrap()
    };
    let (up, down) = (upstream("up"), upstream("down"));
    within(up.warmup()).await.unwrap();
    within(down.warmup()).await.unwrap();
    let gateway = Arc::new(Upstreams(vec![up.clone(), down.clone()]));
    let server = HttpServer::start(gateway, ServeOptions::default()).await;
    let (status, body) = get_health(&server).await;
    assert_eq!(status, 200);
    let providers = json!({"up": {"ok": true}, "down": {"ok": true}});
    assert_eq!(
        body,
        json!({"status": "ok", "degraded": false, "tools": 44, "providers": providers})
    );

    let ctx = toolmux_core::CallContext::new();
    within(down.call("freeze", json!({}), &ctx)).await.unwrap();
    eventually("the frozen upstream to be found out", || async { !down.health().ok }).await;
    let (status, body) = get_health(&server).await;
    assert_eq!(status, 200, "one dead upstream does not take the gateway out");
    let frozen =
        json!({"ok": false, "detail": "no answer to 3 pings in a row; restarts on the next call"});
    let providers = json!({"up": {"ok": true}, "down": frozen});
    assert_eq!(
        body,
        json!({"status": "degraded", "degraded": true, "tools": 44, "providers": providers})
    );
    assert!(!body.to_string().contains("fixture"), "no command line: {body}");

    let (client, _) = server.connect(Lifecycle::Initialize).await;
    let echoed = call(&client, "up__echo", json!({"message": "still here"})).await;
    assert_eq!(first_text(&echoed), "echo: still here");
    within(client.cancel()).await.unwrap();
    server.stop().await;
    within(up.shutdown()).await.unwrap();
    within(down.shutdown()).await.unwrap();
}

/// The fixture as a key holder's view shows it: without the resource `hidden`, whose
/// subscriptions fail as unknown (as `serve.holderTools` views refuse what they hide).
#[derive(Debug)]
struct Hiding {
    fixture: Arc<Fixture>,
    hidden: &'static str,
}

#[async_trait::async_trait]
impl ToolProvider for Hiding {
    fn kind(&self) -> toolmux_core::ToolKind {
        self.fixture.kind()
    }

    fn namespace(&self) -> &str {
        self.fixture.namespace()
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        self.fixture.list_tools().await
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &toolmux_core::CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        self.fixture.call(name, arguments, ctx).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), toolmux_core::ToolError> {
        if uri == self.hidden {
            return Err(toolmux_core::ToolError::UnknownResource { uri: uri.to_owned() });
        }
        self.fixture.subscribe_resource(uri).await
    }

    fn resource_updates(&self) -> Option<toolmux_core::ResourceUpdates> {
        self.fixture.resource_updates()
    }
}

/// Key holder `bob` is served `view`; everyone else everything.
#[derive(Debug)]
struct BobsView(Arc<dyn ToolProvider>);

impl toolmux_mcp::server::HolderViews for BobsView {
    fn view(&self, holder: &str) -> Option<Arc<dyn ToolProvider>> {
        (holder == "bob").then(|| self.0.clone())
    }
}

/// A stateless client of the 2026-07-28 revision sending `key`.
async fn stateless_client(server: &HttpServer, key: &str) -> crate::support::Client {
    let mode = rmcp::service::ClientLifecycleMode::Discover {
        preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
    };
    client_with_key(server, key, mode).await.0
}

/// A client of `server` in `mode` sending `key`, and what it heard.
async fn client_with_key(
    server: &HttpServer,
    key: &str,
    mode: rmcp::service::ClientLifecycleMode,
) -> (crate::support::Client, crate::support::Recorder) {
    use rmcp::service::ClientServiceExt;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    crate::support::install_crypto();
    let config = StreamableHttpClientTransportConfig::with_uri(server.url()).auth_header(key);
    let transport = StreamableHttpClientTransport::from_config(config);
    let recorder = crate::support::Recorder::default();
    let client = within(recorder.clone().serve_with_lifecycle(transport, mode))
        .await
        .expect("client connects");
    (client, recorder)
}

/// The URI of the next `notifications/resources/updated` of `subscription`.
async fn next_update(subscription: &mut rmcp::service::Subscription) -> String {
    loop {
        let notification = within(subscription.next()).await.unwrap().expect("a notification");
        let notification = serde_json::to_value(&notification).unwrap();
        if notification["method"] == "notifications/resources/updated" {
            return notification["params"]["uri"].as_str().unwrap().to_owned();
        }
    }
}

/// `subscriptions/listen` of a key holder subscribes through the holder's view, as
/// `resources/subscribe` does, and tells it only of the resources the view let it
/// subscribe to: a holder whose view hides a resource is not told of its updates (it was,
/// and the whole provider was subscribed to it on the holder's behalf); a holder served
/// everything is.
#[tokio::test]
async fn a_listen_of_a_key_holder_hears_only_of_resources_in_its_view() {
    let (hidden, shown) = ("test://hidden", "test://shown");
    let fixture = Arc::new(Fixture::new(0));
    let view = Arc::new(Hiding { fixture: fixture.clone(), hidden });
    let keys = ApiKeys::new(vec![
        ApiKey { name: "alice".into(), key: "alice-key-0123456789".into() },
        ApiKey { name: "bob".into(), key: "bob-key-0123456789ab".into() },
    ]);
    let options = ServeOptions {
        api_keys: keys,
        views: Some(Arc::new(BobsView(view))),
        ..Default::default()
    };
    let server = HttpServer::start(fixture, options).await;
    let alice = stateless_client(&server, "alice-key-0123456789").await;
    let bob = stateless_client(&server, "bob-key-0123456789ab").await;
    let filter = SubscriptionFilter::builder().resource_subscriptions([hidden, shown]).build();
    let mut heard_by_alice = within(alice.listen(filter.clone())).await.unwrap();
    let mut heard_by_bob = within(bob.listen(filter)).await.unwrap();
    for uri in [hidden, shown] {
        let touched = call(&alice, "touch_resource", json!({"uri": uri})).await;
        assert_eq!(first_text(&touched), format!("touched {uri}"));
    }
    assert_eq!(next_update(&mut heard_by_alice).await, hidden);
    assert_eq!(next_update(&mut heard_by_alice).await, shown);
    // In order: the hidden resource's update, had it been sent, would have come first.
    assert_eq!(next_update(&mut heard_by_bob).await, shown);
    within(alice.cancel()).await.unwrap();
    within(bob.cancel()).await.unwrap();
    server.stop().await;
}

/// A resource two sessions are subscribed to stays subscribed when one of them
/// unsubscribes, and is unsubscribed from when the other does too: the first to leave
/// unsubscribed it for both.
#[tokio::test]
async fn a_resource_two_sessions_subscribe_to_stays_until_both_leave() {
    use crate::protocol::RawSession;
    let provider =
        Arc::new(crate::stdio::Subscribed { fixture: Fixture::new(0), uris: Default::default() });
    let server = HttpServer::start(provider.clone(), ServeOptions::default()).await;
    let sessions = [RawSession::open(&server.url()).await, RawSession::open(&server.url()).await];
    let request = |method: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"uri": "test://r"}})
            .to_string()
    };
    for session in &sessions {
        let answered = session.post(&request("resources/subscribe")).await;
        assert_eq!(answered.message()["result"], json!({}), "{}", answered.body);
    }
    assert_eq!(provider.uris(), ["test://r"]);
    let answered = sessions[1].post(&request("resources/unsubscribe")).await;
    assert_eq!(answered.message()["result"], json!({}), "{}", answered.body);
    assert_eq!(provider.uris(), ["test://r"], "the first session still holds it");
    let answered = sessions[0].post(&request("resources/unsubscribe")).await;
    assert_eq!(answered.message()["result"], json!({}), "{}", answered.body);
    assert!(provider.uris().is_empty(), "{:?}", provider.uris());
    server.stop().await;
}

/// [`crate::stdio::Subscribed`] whose first subscription waits until the test lets it go
/// (`released`), then fails; the later ones succeed.
#[derive(Debug)]
struct FirstSubscriptionFails {
    subscribed: crate::stdio::Subscribed,
    subscriptions: std::sync::atomic::AtomicUsize,
    /// Told when the first subscription has begun.
    entered: tokio::sync::Notify,
    released: tokio::sync::Notify,
}

impl FirstSubscriptionFails {
    fn new() -> FirstSubscriptionFails {
        FirstSubscriptionFails {
            subscribed: crate::stdio::Subscribed {
                fixture: Fixture::new(0),
                uris: Default::default(),
            },
            subscriptions: Default::default(),
            entered: Default::default(),
            released: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl ToolProvider for FirstSubscriptionFails {
    fn kind(&self) -> toolmux_core::ToolKind {
        self.subscribed.kind()
    }

    fn namespace(&self) -> &str {
        self.subscribed.namespace()
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        self.subscribed.list_tools().await
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &toolmux_core::CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        self.subscribed.call(name, arguments, ctx).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), toolmux_core::ToolError> {
        if self.subscriptions.fetch_add(1, Ordering::SeqCst) == 0 {
            self.entered.notify_one();
            self.released.notified().await;
            return Err(toolmux_core::ToolError::UnknownResource { uri: uri.to_owned() });
        }
        self.subscribed.subscribe_resource(uri).await
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), toolmux_core::ToolError> {
        self.subscribed.unsubscribe_resource(uri).await
    }

    fn resource_updates(&self) -> Option<toolmux_core::ResourceUpdates> {
        self.subscribed.resource_updates()
    }
}

/// A subscription that fails after its session unsubscribed meanwhile lets go of nothing
/// more: neither another session's hold of the resource (session `b` subscribed while
/// `a`'s first attempt waited) nor the session's own next subscription to it (`a`
/// subscribed again). The failure released the URI a second time, so the provider was
/// told to unsubscribe while `b`, or `a`'s second subscription, still held it.
#[tokio::test]
async fn a_subscription_failing_after_its_session_left_lets_go_of_nothing_more() {
    use crate::protocol::RawSession;
    // Ids told apart: a session's requests are under way together.
    let request = |id: u32, method: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"uri": "test://r"}})
            .to_string()
    };
    for second_by_the_same_session in [false, true] {
        let provider = Arc::new(FirstSubscriptionFails::new());
        let server = HttpServer::start(provider.clone(), ServeOptions::default()).await;
        let a = RawSession::open(&server.url()).await;
        let b = if second_by_the_same_session {
            None
        } else {
            Some(RawSession::open(&server.url()).await)
        };
        let holder = b.as_ref().unwrap_or(&a);
        let subscribe = request(1, "resources/subscribe");
        let (failed, ()) = tokio::join!(a.post(&subscribe), async {
            within(provider.entered.notified()).await;
            let answered = a.post(&request(2, "resources/unsubscribe")).await;
            assert_eq!(answered.message()["result"], json!({}), "{}", answered.body);
            let answered = holder.post(&request(3, "resources/subscribe")).await;
            assert_eq!(answered.message()["result"], json!({}), "{}", answered.body);
            provider.released.notify_one();
        });
        assert!(failed.message()["error"].is_object(), "{}", failed.body);
        let case = if second_by_the_same_session { "a again" } else { "b" };
        assert_eq!(provider.subscribed.uris(), ["test://r"], "still held by {case}");
        let answered = holder.post(&request(4, "resources/unsubscribe")).await;
        assert_eq!(answered.message()["result"], json!({}), "{}", answered.body);
        assert!(provider.subscribed.uris().is_empty(), "{:?}", provider.subscribed.uris());
        server.stop().await;
    }
}

/// Whether the listen ends by its client vanishing or by the server stopping.
#[derive(Clone, Copy, PartialEq)]
enum ListenEnd {
    ClientVanishes,
    ServerStops,
}

/// A `subscriptions/listen` that ends without being cancelled, its client gone (the process
/// killed, the connection dropped) or the server stopping, lets go of its resources: the
/// provider is told to unsubscribe, and the count of their holders is back to none.
#[tokio::test]
async fn a_listen_ended_without_a_cancel_lets_go_of_its_resources() {
    for end in [ListenEnd::ClientVanishes, ListenEnd::ServerStops] {
        let provider = Arc::new(crate::stdio::Subscribed {
            fixture: Fixture::new(0),
            uris: Default::default(),
        });
        let server = HttpServer::start(provider.clone(), ServeOptions::default()).await;
        let client = stateless_client(&server, "unused").await;
        let filter = SubscriptionFilter::builder().resource_subscriptions(["test://r"]).build();
        let heard = within(client.listen(filter)).await.unwrap();
        let subscribed = || async { provider.uris() == ["test://r"] };
        eventually("the provider is subscribed", subscribed).await;
        if end == ListenEnd::ClientVanishes {
            drop(heard);
            drop(client);
            let unsubscribed = || async { provider.uris().is_empty() };
            eventually("the provider is unsubscribed", unsubscribed).await;
            server.stop().await;
        } else {
            server.stop().await;
            let unsubscribed = || async { provider.uris().is_empty() };
            eventually("the provider is unsubscribed", unsubscribed).await;
        }
    }
}

/// Each key holder is served a provider of its own, `alice` one and `bob` the other.
#[derive(Debug)]
struct ViewEach([Arc<crate::stdio::Subscribed>; 2]);

impl toolmux_mcp::server::HolderViews for ViewEach {
    fn view(&self, holder: &str) -> Option<Arc<dyn ToolProvider>> {
        let at = ["alice", "bob"].iter().position(|h| *h == holder)?;
        Some(self.0[at].clone())
    }
}

/// Two key holders whose views serve one URI from two providers each leave their own
/// provider's subscription unsubscribed from, by `resources/unsubscribe` and by their
/// session's end alike, and neither's leaving cuts the other's: the count was of the URI
/// alone and the provider told was the last leaver's (or, at a session's end, the whole
/// served provider), so the first leaver's provider stayed subscribed for good.
#[tokio::test]
#[allow(deprecated, reason = "resources/subscribe of the handshake revisions")]
async fn holders_whose_views_serve_a_uri_from_two_providers_each_unsubscribe_their_own() {
    use rmcp::model::{SubscribeRequestParams, UnsubscribeRequestParams};
    use rmcp::service::ClientLifecycleMode::Initialize;
    let uri = "test://r";
    let subscribed = || {
        Arc::new(crate::stdio::Subscribed { fixture: Fixture::new(0), uris: Default::default() })
    };
    let (of_alice, of_bob) = (subscribed(), subscribed());
    let keys = ApiKeys::new(vec![
        ApiKey { name: "alice".into(), key: "alice-key-0123456789".into() },
        ApiKey { name: "bob".into(), key: "bob-key-0123456789ab".into() },
    ]);
    let options = ServeOptions {
        api_keys: keys,
        views: Some(Arc::new(ViewEach([of_alice.clone(), of_bob.clone()]))),
        ..Default::default()
    };
    let server = HttpServer::start(Arc::new(Fixture::new(0)), options).await;
    let connect = async || {
        let (alice, _) = client_with_key(&server, "alice-key-0123456789", Initialize).await;
        let (bob, _) = client_with_key(&server, "bob-key-0123456789ab", Initialize).await;
        for client in [&alice, &bob] {
            within(client.subscribe(SubscribeRequestParams::new(uri))).await.unwrap();
        }
        assert_eq!((of_alice.uris(), of_bob.uris()), (vec![uri.to_owned()], vec![uri.to_owned()]));
        (alice, bob)
    };
    let (alice, bob) = connect().await;
    within(alice.unsubscribe(UnsubscribeRequestParams::new(uri))).await.unwrap();
    assert_eq!(of_bob.uris(), [uri], "bob still holds it");
    within(bob.unsubscribe(UnsubscribeRequestParams::new(uri))).await.unwrap();
    assert_eq!((of_alice.uris(), of_bob.uris()), (vec![], vec![]));
    for client in [alice, bob] {
        within(client.cancel()).await.unwrap();
    }
    // The same, the sessions ending instead.
    let (alice, bob) = connect().await;
    within(alice.cancel()).await.unwrap();
    within(bob.cancel()).await.unwrap();
    let unsubscribed = || async { of_alice.uris().is_empty() && of_bob.uris().is_empty() };
    eventually("both providers are unsubscribed", unsubscribed).await;
    server.stop().await;
}

/// A served provider made of two, `a` and `b` (as an orchestrator of two upstream servers
/// is), whose resource updates the test sends as either.
#[derive(Debug)]
struct Pair {
    mock: MockProvider,
    updates: toolmux_core::ResourceUpdateNotifier,
}

#[async_trait::async_trait]
impl ToolProvider for Pair {
    fn kind(&self) -> toolmux_core::ToolKind {
        toolmux_core::ToolKind::Composite
    }

    fn namespace(&self) -> &str {
        self.mock.namespace()
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        self.mock.list_tools().await
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &toolmux_core::CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        self.mock.call(name, arguments, ctx).await
    }

    fn resource_updates(&self) -> Option<toolmux_core::ResourceUpdates> {
        Some(self.updates.subscribe())
    }
}

/// A key holder's view of [`Pair`] that has one of its two providers in view: it passes on
/// that one's resource updates only.
#[derive(Debug)]
struct OneOfPair {
    pair: Arc<Pair>,
    in_view: &'static str,
}

#[async_trait::async_trait]
impl ToolProvider for OneOfPair {
    fn kind(&self) -> toolmux_core::ToolKind {
        self.pair.kind()
    }

    fn namespace(&self) -> &str {
        self.pair.namespace()
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        self.pair.list_tools().await
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &toolmux_core::CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        self.pair.call(name, arguments, ctx).await
    }

    fn resource_updates(&self) -> Option<toolmux_core::ResourceUpdates> {
        self.pair.resource_updates()
    }

    fn passes_updates_from(&self, source: &str) -> bool {
        source == self.in_view
    }
}

/// `alice` is served provider `a` of the pair, `bob` provider `b`.
#[derive(Debug)]
struct HalfEach(Arc<Pair>);

impl toolmux_mcp::server::HolderViews for HalfEach {
    fn view(&self, holder: &str) -> Option<Arc<dyn ToolProvider>> {
        let in_view = match holder {
            "alice" => "a",
            "bob" => "b",
            _ => return None,
        };
        Some(Arc::new(OneOfPair { pair: self.0.clone(), in_view }))
    }
}

/// Two key holders whose views hold different providers that both serve `test://r`, each
/// subscribed to it: each hears of its own provider's updates of it only, over a session
/// (`resources/subscribe`) and over `subscriptions/listen` alike. Each heard of both, as
/// updates were matched by URI alone.
#[tokio::test]
#[allow(deprecated, reason = "resources/subscribe of the handshake revisions")]
async fn key_holders_hear_only_of_updates_from_providers_in_their_views() {
    use rmcp::model::SubscribeRequestParams;
    use rmcp::service::ClientLifecycleMode::Initialize;
    let (shared, last) = ("test://r", "test://last");
    let mock = MockProvider::new("pair").with_tool("a", Behavior::Echo);
    let pair = Arc::new(Pair { mock, updates: toolmux_core::ResourceUpdateNotifier::new() });
    let keys = ApiKeys::new(vec![
        ApiKey { name: "alice".into(), key: "alice-key-0123456789".into() },
        ApiKey { name: "bob".into(), key: "bob-key-0123456789ab".into() },
    ]);
    let options = ServeOptions {
        api_keys: keys,
        views: Some(Arc::new(HalfEach(pair.clone()))),
        ..Default::default()
    };
    let server = HttpServer::start(pair.clone(), options).await;
    let (alice, heard_by_alice) =
        client_with_key(&server, "alice-key-0123456789", Initialize).await;
    let (bob, heard_by_bob) = client_with_key(&server, "bob-key-0123456789ab", Initialize).await;
    for client in [&alice, &bob] {
        for uri in [shared, last] {
            within(client.subscribe(SubscribeRequestParams::new(uri))).await.unwrap();
        }
        // The session's notification stream is established before the updates.
        within(client.list_all_tools()).await.unwrap();
    }
    let filter = SubscriptionFilter::builder().resource_subscriptions([shared, last]).build();
    let alice_listens = stateless_client(&server, "alice-key-0123456789").await;
    let bob_listens = stateless_client(&server, "bob-key-0123456789ab").await;
    let mut alice_listened = within(alice_listens.listen(filter.clone())).await.unwrap();
    let mut bob_listened = within(bob_listens.listen(filter)).await.unwrap();

    // Each provider updates the shared URI, then the last one: what comes between the two
    // a holder hears of is what it heard of the shared URI.
    for source in ["b", "a"] {
        pair.updates.notify_from(source, shared);
    }
    for source in ["a", "b"] {
        pair.updates.notify_from(source, last);
    }
    for listened in [&mut alice_listened, &mut bob_listened] {
        assert_eq!(next_update(listened).await, shared);
        assert_eq!(next_update(listened).await, last);
    }
    for (holder, heard) in [("alice", &heard_by_alice), ("bob", &heard_by_bob)] {
        let told_of_last = || async { heard.updated.lock().unwrap().contains(&last.to_owned()) };
        eventually("the last update over the session", told_of_last).await;
        assert_eq!(*heard.updated.lock().unwrap(), [shared, last], "{holder}");
    }
    for client in [alice, bob, alice_listens, bob_listens] {
        within(client.cancel()).await.unwrap();
    }
    server.stop().await;
}

/// The mock as a key holder's view shows it: without its tools named `hidden_*`.
#[derive(Debug)]
struct HidingTools(Arc<MockProvider>);

#[async_trait::async_trait]
impl ToolProvider for HidingTools {
    fn kind(&self) -> toolmux_core::ToolKind {
        self.0.kind()
    }

    fn namespace(&self) -> &str {
        self.0.namespace()
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        let tools = self.0.list_tools().await?;
        Ok(tools.into_iter().filter(|t| !t.name.starts_with("hidden_")).collect())
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &toolmux_core::CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        self.0.call(name, arguments, ctx).await
    }
}

/// A key holder whose view hides tools is told the tool list changed only when its own
/// list did, over a session and over `subscriptions/listen` alike: a tool it cannot see
/// coming or going was announced to it, telling it of tools outside its view.
#[tokio::test]
async fn a_key_holder_hears_only_of_changes_to_its_own_lists() {
    use rmcp::service::ClientLifecycleMode::Initialize;
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let keys = ApiKeys::new(vec![
        ApiKey { name: "alice".into(), key: "alice-key-0123456789".into() },
        ApiKey { name: "bob".into(), key: "bob-key-0123456789ab".into() },
    ]);
    let view = Arc::new(HidingTools(mock.clone()));
    let options = ServeOptions {
        api_keys: keys,
        views: Some(Arc::new(BobsView(view))),
        ..Default::default()
    };
    let server = HttpServer::start(mock.clone(), options).await;
    let (alice, heard_by_alice) =
        client_with_key(&server, "alice-key-0123456789", Initialize).await;
    let (bob, heard_by_bob) = client_with_key(&server, "bob-key-0123456789ab", Initialize).await;
    let listening_bob = stateless_client(&server, "bob-key-0123456789ab").await;
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let mut listen = within(listening_bob.listen(filter)).await.unwrap();
    // The sessions' notification streams are up once they have listed.
    for client in [&alice, &bob] {
        within(client.list_all_tools()).await.unwrap();
    }
    mock.add_tool("hidden_b", Behavior::Echo);
    let alice_heard = |n: usize| {
        let heard = heard_by_alice.list_changed.clone();
        move || {
            let heard = heard.clone();
            async move { heard.load(Ordering::SeqCst) >= n }
        }
    };
    eventually("alice hears of hidden_b", alice_heard(1)).await;
    // Past the time the change takes to settle and be told.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(heard_by_bob.list_changed.load(Ordering::SeqCst), 0, "bob heard of hidden_b");
    mock.add_tool("c", Behavior::Echo);
    eventually("alice hears of c", alice_heard(2)).await;
    eventually("bob hears of c", || async {
        heard_by_bob.list_changed.load(Ordering::SeqCst) >= 1
    })
    .await;
    // Bob's listen's first notification is of `c`, not of `hidden_b`: nothing came before it.
    let first = within(listen.next()).await.unwrap().expect("a notification");
    assert_eq!(serde_json::to_value(&first).unwrap()["method"], "notifications/tools/list_changed");
    let more = tokio::time::timeout(std::time::Duration::from_millis(300), listen.next()).await;
    assert!(more.is_err(), "a second notification: {more:?}");
    assert_eq!(heard_by_bob.list_changed.load(Ordering::SeqCst), 1);
    for client in [alice, bob, listening_bob] {
        within(client.cancel()).await.unwrap();
    }
    server.stop().await;
}

/// A raw stateless `tools/call` of `tool` with `arguments` from a client that offers
/// elicitation, `params`' entries (`requestState`, `inputResponses`) added to the request;
/// returns the JSON-RPC result.
async fn stateless_round(url: &str, tool: &str, arguments: Value, params: Value) -> Value {
    let answer = stateless_round_answer(url, tool, arguments, params, None).await;
    answer.get("result").cloned().unwrap_or_else(|| panic!("a result: {answer}"))
}

/// [`stateless_round`] with `key` as the bearer token when given; returns the JSON-RPC
/// answer (a result or an error).
pub(crate) async fn stateless_round_answer(
    url: &str,
    tool: &str,
    arguments: Value,
    params: Value,
    key: Option<&str>,
) -> Value {
    let mut body = crate::support::stateless_request(tool, arguments, json!({"elicitation": {}}));
    for (name, value) in params.as_object().expect("params entries as an object") {
        body["params"][name] = value.clone();
    }
    let bearer = key.map(|key| format!("Bearer {key}"));
    let headers: Vec<_> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
    let (_, text) = crate::support::post_stateless_call(url, tool, &body, &headers).await;
    answer_of(&text)
}

/// A session directory in memory, shared by the servers given it, which keeps the first
/// `requestState` key offered and gives it to every server; `broken`: it answers nothing.
#[derive(Debug, Default)]
struct MemoryDirectory {
    records: std::sync::Mutex<std::collections::HashMap<String, String>>,
    seal_key: std::sync::Mutex<Option<[u8; 32]>>,
    broken: bool,
}

impl MemoryDirectory {
    fn answer<T: Send + 'static>(&self, value: T) -> DirectoryFuture<T> {
        let broken = self.broken;
        Box::pin(async move {
            if broken {
                return Err("the directory is down".into());
            }
            Ok(value)
        })
    }

    fn records(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, String>> {
        self.records.lock().unwrap()
    }
}

impl SessionDirectory for MemoryDirectory {
    fn claim(&self, session: String, owner: String, _: std::time::Duration) -> DirectoryFuture<()> {
        self.records().insert(session, owner);
        self.answer(())
    }

    fn owner(&self, session: String) -> DirectoryFuture<Option<String>> {
        let owner = self.records().get(&session).cloned();
        self.answer(owner)
    }

    fn release(&self, session: String, owner: String) -> DirectoryFuture<()> {
        self.records().retain(|s, o| *s != session || *o != owner);
        self.answer(())
    }

    fn seal_key(&self, candidate: [u8; 32]) -> DirectoryFuture<Option<[u8; 32]>> {
        let key = *self.seal_key.lock().unwrap().get_or_insert(candidate);
        self.answer(Some(key))
    }
}

/// A stateless request's next round reaches another replica sharing the session
/// directory, as a round-robin balancer sends it, and completes there: the replicas seal
/// `requestState` with the key the directory shares. The state opens for the key holder
/// it was given to only; a server keying its own (no directory) cannot open it; a
/// directory that gives no key fails the start, saying what to check.
#[tokio::test]
async fn a_stateless_next_round_completes_at_another_replica_for_its_holder_only() {
    use toolmux_core::{ElicitationRequest, ToolKind, ToolOutput, ToolSet};
    let tools = ToolSet::new("t", ToolKind::Builtin).with_tool(
        ToolSpec::new("ask", "Asks one question", json!({"type": "object"})),
        |_, ctx: toolmux_core::CallContext| async move {
            let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}}});
            let answer = ctx.elicit(ElicitationRequest::new("a question", schema)).await?;
            let content = answer.content.unwrap_or_default();
            Ok(ToolOutput::text(format!("answered: {}", content["answer"])))
        },
    );
    let tools: Arc<dyn ToolProvider> = Arc::new(tools);
    let (alice, bob) = ("alice-key-0123456789", "bob-key-0123456789ab");
    let keys = ApiKeys::new(vec![
        ApiKey { name: "alice".into(), key: alice.into() },
        ApiKey { name: "bob".into(), key: bob.into() },
    ]);
    let directory = Arc::new(MemoryDirectory::default());
    let shared = ServeOptions {
        api_keys: keys.clone(),
        affinity: Some(SessionAffinity { directory: directory.clone(), advertise_url: None }),
        ..ServeOptions::default()
    };
    let a = HttpServer::start(tools.clone(), shared.clone()).await;
    let b = HttpServer::start(tools.clone(), shared).await;
    let alone = ServeOptions { api_keys: keys, ..ServeOptions::default() };
    let c = HttpServer::start(tools.clone(), alone).await;

    let first = stateless_round_answer(&a.url(), "ask", json!({}), json!({}), Some(alice)).await;
    let result = &first["result"];
    assert_eq!(result["resultType"], "input_required", "{first}");
    let key = result["inputRequests"].as_object().expect("input requests").keys().next();
    let accept = json!({"action": "accept", "content": {"answer": "yes"}});
    let next =
        json!({"requestState": result["requestState"], "inputResponses": {key.unwrap(): accept}});

    let at_b = stateless_round_answer(&b.url(), "ask", json!({}), next.clone(), Some(alice)).await;
    assert_eq!(at_b["result"]["content"][0]["text"], "answered: \"yes\"", "{at_b}");
    for (url, holder, whose) in
        [(b.url(), bob, "another holder's"), (c.url(), alice, "a lone server's")]
    {
        let refused =
            stateless_round_answer(&url, "ask", json!({}), next.clone(), Some(holder)).await;
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("requestState failed verification"), "{whose}: {refused}");
    }
    for server in [a, b, c] {
        server.stop().await;
    }

    let broken = Arc::new(MemoryDirectory { broken: true, ..MemoryDirectory::default() });
    let options = ServeOptions {
        affinity: Some(SessionAffinity { directory: broken, advertise_url: None }),
        ..ServeOptions::default()
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let started =
        toolmux_mcp::server::bind_http(tools, "127.0.0.1:0".parse().unwrap(), options, shutdown)
            .await;
    let error = toolmux_core::error_report(&started.expect_err("no start without the shared key"));
    assert!(error.contains("the directory is down") && error.contains("check that"), "{error}");
}

/// In a stateless round an approval's question names the call it approves: a tool that
/// asks to approve `fs__write` of `/tmp/a`, then of `~/.bashrc` twice, is asked each
/// time in turn, not allowed all three by the first answer (all were asked under
/// `approve:fs__write`, so the next run found the answer to the first).
#[tokio::test]
async fn a_stateless_approval_answers_only_the_call_it_was_asked_for() {
    use toolmux_core::{ApprovalDecision, ApprovalRequest, ToolKind, ToolOutput, ToolSet};
    let paths = ["/tmp/a", "~/.bashrc", "~/.bashrc"];
    let approve = |path: &str| ApprovalRequest {
        tool: "fs__write".into(),
        arguments: json!({"path": path}),
        reason: "ask".into(),
        scope: None,
        call_id: None,
    };
    let tools = ToolSet::new("t", ToolKind::Builtin).with_tool(
        ToolSpec::new("write", "Asks to approve three writes", json!({"type": "object"})),
        move |_, ctx: toolmux_core::CallContext| async move {
            let handler = ctx.handler().expect("an interaction handler").clone();
            let mut allowed = Vec::new();
            for path in paths {
                let decision = handler.approve(approve(path)).await;
                allowed.push(format!("{path}: {}", decision == ApprovalDecision::Allow));
            }
            Ok(ToolOutput::text(allowed.join(", ")))
        },
    );
    let server = HttpServer::start(Arc::new(tools), ServeOptions::default()).await;
    let allow = json!({"action": "accept", "content": {"allow": true}});
    let (mut params, mut keys) = (json!({}), Vec::new());
    for path in paths {
        let result = stateless_round(&server.url(), "write", json!({}), params).await;
        assert_eq!(result["resultType"], "input_required", "{path}: {result}");
        let asked = result["inputRequests"].as_object().expect("input requests");
        assert_eq!(asked.len(), 1, "{result}");
        let (key, question) = asked.iter().next().expect("one question");
        assert!(question.to_string().contains(path), "{path}: {question}");
        assert!(!keys.contains(key), "{key} was answered before: {result}");
        keys.push(key.clone());
        params = json!({"requestState": result["requestState"], "inputResponses": {key: allow}});
    }
    let result = stateless_round(&server.url(), "write", json!({}), params).await;
    let text = "/tmp/a: true, ~/.bashrc: true, ~/.bashrc: true";
    assert_eq!(result["content"][0]["text"], text, "{result}");
    server.stop().await;
}
