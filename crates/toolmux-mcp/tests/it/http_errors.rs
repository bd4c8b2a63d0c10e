//! How a streamable HTTP server's failures read when a call meets them: each names the
//! server and its URL (without the query, which may hold a key), says what was wrong and
//! what to do, against a loopback server failing each way at the handshake or at a call.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, TransportKind};

/// A way to fail, and whether every POST meets it (the handshake too) or only calls.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// 401 with a bearer challenge.
    Unauthorized,
    /// 403 without a challenge.
    Forbidden,
    /// 404 for every request of the session, a new one's too.
    NotFound,
    /// 502 with a proxy's text.
    BadGateway,
    /// 200 with an HTML page (a proxy's login page).
    Html,
    /// 200 `application/json` that is not JSON.
    NotJson,
    /// 200 `application/json` over rmcp's 16 MiB limit of a JSON answer (fixed in rmcp,
    /// where the limit of an SSE event is not).
    TooLarge,
    /// 200 `text/event-stream` whose event is over the 128 MiB a message may be.
    SseTooLarge,
}

impl Failure {
    fn response(self) -> Response {
        match self {
            Failure::Unauthorized => {
                let challenge = [(header::WWW_AUTHENTICATE, r#"Bearer realm="mcp""#)];
                (StatusCode::UNAUTHORIZED, challenge, "unauthorized").into_response()
            }
            Failure::Forbidden => (StatusCode::FORBIDDEN, "forbidden").into_response(),
            Failure::NotFound => (StatusCode::NOT_FOUND, "no such session").into_response(),
            Failure::BadGateway => (StatusCode::BAD_GATEWAY, "upstream is down").into_response(),
            Failure::Html => {
                let html = [(header::CONTENT_TYPE, "text/html")];
                (html, "<html><body>Sign in</body></html>").into_response()
            }
            Failure::NotJson => {
                ([(header::CONTENT_TYPE, "application/json")], "{oops").into_response()
            }
            Failure::TooLarge => {
                let body = format!("\"{}\"", "x".repeat(17 << 20));
                ([(header::CONTENT_TYPE, "application/json")], body).into_response()
            }
            Failure::SseTooLarge => {
                let body = format!("data: {}\n\n", "x".repeat(129 << 20));
                ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
            }
        }
    }
}

/// A loopback server failing as `failure` says: every POST when `at_handshake`, else only
/// `tools/call` (after a handshake with a session). Its URL has a key in its query.
async fn failing_server(failure: Failure, at_handshake: bool) -> String {
    let mcp = move |headers: HeaderMap, body: String| async move {
        if at_handshake {
            return failure.response();
        }
        let message: serde_json::Value = serde_json::from_str(&body).unwrap();
        let Some(id) = message.get("id").cloned() else {
            return StatusCode::ACCEPTED.into_response();
        };
        let json = [(header::CONTENT_TYPE, "application/json")];
        let answer = |result: serde_json::Value| {
            json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
        };
        match message["method"].as_str().unwrap_or("") {
            "initialize" => {
                let result = json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "failing", "version": "1"}});
                ([("mcp-session-id", "s1")], json, answer(result)).into_response()
            }
            "tools/list" if headers.contains_key("mcp-session-id") => {
                let tools = json!({"tools": [{"name": "t", "inputSchema": {"type": "object"}}]});
                (json, answer(tools)).into_response()
            }
            "tools/call" => failure.response(),
            _ => (json, answer(json!({}))).into_response(),
        }
    };
    let router = axum::Router::new()
        .route("/mcp", axum::routing::post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp?key=SECRET", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// What a call of `t` on `url` fails with, the port written `PORT`; the key in the query
/// must appear nowhere.
async fn call_error(url: &str) -> String {
    let config = McpServerConfig::remote(TransportKind::Http, url.to_owned())
        .with_request_timeout(Duration::from_secs(10))
        .with_startup_timeout(Duration::from_secs(10));
    let provider = McpProvider::new("web", config).unwrap();
    let error = provider.call("t", json!({}), &CallContext::new()).await.unwrap_err();
    let report = format!("{} [{}]", error.report(), error.code());
    provider.shutdown().await.unwrap();
    assert!(!report.contains("SECRET"), "{report}");
    let port = url.split(':').nth(2).unwrap().split('/').next().unwrap();
    report.replace(port, "PORT")
}

async fn check_at_handshake(failure: Failure, expect: expect_test::Expect) {
    expect.assert_eq(&call_error(&failing_server(failure, true).await).await);
}

async fn check_at_call(failure: Failure, expect: expect_test::Expect) {
    expect.assert_eq(&call_error(&failing_server(failure, false).await).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn connection_refused() {
    let url = format!("http://127.0.0.1:{}/mcp?key=SECRET", crate::support::free_port());
    expect_test::expect!["web: cannot connect over http: cannot reach http://127.0.0.1:PORT/mcp: Connection refused (os error 111); is the server running, and is `url` right? [transport]"].assert_eq(&call_error(&url).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn unauthorized_at_the_handshake() {
    check_at_handshake(Failure::Unauthorized, expect_test::expect!["web unavailable: not authorized: the server asks for authorization and publishes no OAuth metadata: give its token in `headers` (for example `Authorization: Bearer ${TOKEN}`), or, if it follows the 2025-03-26 OAuth defaults, run `toolmux mcp login web` [unavailable]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unauthorized_at_a_call() {
    check_at_call(Failure::Unauthorized, expect_test::expect!["web unavailable: not authorized: the server asks for authorization and publishes no OAuth metadata: give its token in `headers` (for example `Authorization: Bearer ${TOKEN}`), or, if it follows the 2025-03-26 OAuth defaults, run `toolmux mcp login web` [unavailable]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forbidden_at_the_handshake() {
    check_at_handshake(Failure::Forbidden, expect_test::expect!["web: handshake failed: http://127.0.0.1:PORT/mcp answered HTTP 403 Forbidden (forbidden); the server refuses the credentials sent: give ones it accepts in `headers` (for example `Authorization: Bearer ${TOKEN}`) [transport]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forbidden_at_a_call() {
    check_at_call(Failure::Forbidden, expect_test::expect!["web: tools/call not delivered: http://127.0.0.1:PORT/mcp answered HTTP 403 Forbidden (forbidden); the server refuses the credentials sent: give ones it accepts in `headers` (for example `Authorization: Bearer ${TOKEN}`) [transport]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn not_found_at_the_handshake() {
    check_at_handshake(Failure::NotFound, expect_test::expect!["web: handshake failed: http://127.0.0.1:PORT/mcp answered HTTP 404 Not Found (no such session); is `url` the server's MCP endpoint? [transport]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_not_found_even_when_new() {
    check_at_call(Failure::NotFound, expect_test::expect!["web: tools/call not delivered: http://127.0.0.1:PORT/mcp refused the session, and a new one too; does every request reach the same server (behind a load balancer, sessions need affinity)? [transport]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_gateway_at_the_handshake() {
    check_at_handshake(Failure::BadGateway, expect_test::expect!["web: handshake failed: http://127.0.0.1:PORT/mcp answered HTTP 502 Bad Gateway; the server, or a proxy in front of it, failed: try again later, or see the server's log [transport]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_gateway_at_a_call() {
    check_at_call(Failure::BadGateway, expect_test::expect!["web: tools/call not delivered: http://127.0.0.1:PORT/mcp answered HTTP 502 Bad Gateway; the server, or a proxy in front of it, failed: try again later, or see the server's log [transport]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn html_at_the_handshake() {
    check_at_handshake(Failure::Html, expect_test::expect!["web: handshake failed: http://127.0.0.1:PORT/mcp answered with text/html, neither JSON nor an SSE stream; is `url` the server's MCP endpoint, with no login page or proxy answering for it? [transport]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn html_at_a_call() {
    check_at_call(Failure::Html, expect_test::expect!["web: protocol error: tools/call: http://127.0.0.1:PORT/mcp answered with text/html, neither JSON nor an SSE stream; is `url` the server's MCP endpoint, with no login page or proxy answering for it? [protocol]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn not_json_at_the_handshake() {
    check_at_handshake(Failure::NotJson, expect_test::expect!["web: handshake failed: http://127.0.0.1:PORT/mcp answered a body that is no JSON-RPC message (key must be a string at line 1 column 2): `{oops`; is the server an MCP server, and does its log show an error? [transport]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn not_json_at_a_call() {
    check_at_call(Failure::NotJson, expect_test::expect!["web: protocol error: tools/call: http://127.0.0.1:PORT/mcp answered a body that is no JSON-RPC message (key must be a string at line 1 column 2): `{oops`; is the server an MCP server, and does its log show an error? [protocol]"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn too_large_at_a_call() {
    check_at_call(Failure::TooLarge, expect_test::expect!["web: tools/call sent, outcome unknown: the answer from http://127.0.0.1:PORT/mcp is over 16777216 bytes, more than an answer may have; ask the tool for less; it may have run, so check its effect before calling again [other]"]).await;
}

/// An SSE event over the limit says so, naming the limit; it was told as the server
/// closing the answer's stream.
#[tokio::test(flavor = "multi_thread")]
async fn an_sse_event_too_large_at_a_call() {
    check_at_call(Failure::SseTooLarge, expect_test::expect!["web: tools/call sent, outcome unknown: the server's answer came as an SSE event of over 128 MiB, more than any message may be, and was not read; it may have run, so check its effect before calling again [other]"]).await;
}

/// An answer of 20 MiB, over rmcp's own 16 MiB limit, is read, over SSE as stdio reads it.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_sse_answer_is_read() {
    let url = big_sse_server(20 << 20).await;
    let config = McpServerConfig::remote(TransportKind::Http, url)
        .with_request_timeout(Duration::from_secs(20))
        .with_startup_timeout(Duration::from_secs(10));
    let provider = McpProvider::new("web", config).unwrap();
    let out = provider.call("t", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text().len(), 20 << 20);
    provider.shutdown().await.unwrap();
}

/// A loopback server whose `tools/call` answers with text of `size` bytes in one SSE event.
async fn big_sse_server(size: usize) -> String {
    let mcp = move |body: String| async move {
        let message: serde_json::Value = serde_json::from_str(&body).unwrap();
        let Some(id) = message.get("id").cloned() else {
            return StatusCode::ACCEPTED.into_response();
        };
        let result = match message["method"].as_str().unwrap_or("") {
            "initialize" => json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                "serverInfo": {"name": "big", "version": "1"}}),
            "tools/list" => json!({"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}),
            "tools/call" => json!({"content": [{"type": "text", "text": "x".repeat(size)}]}),
            _ => json!({}),
        };
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
        let body = format!("data: {answer}\n\n");
        ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
    };
    let router = axum::Router::new()
        .route("/mcp", axum::routing::post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// A server that answers `initialize` with a protocol version toolmux does not speak, and
/// holds the `DELETE` of its session until `release` is notified; `deleted` is set when the
/// `DELETE` arrives.
async fn unknown_version_server(release: Arc<Notify>, deleted: Arc<AtomicBool>) -> String {
    let mcp = |body: String| async move {
        let message: serde_json::Value = serde_json::from_str(&body).unwrap();
        let Some(id) = message.get("id").cloned() else {
            return StatusCode::ACCEPTED.into_response();
        };
        let result = json!({"protocolVersion": "1999-01-01", "capabilities": {"tools": {}},
            "serverInfo": {"name": "future", "version": "1"}});
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        let headers = [("mcp-session-id", "s1"), ("content-type", "application/json")];
        (headers, answer).into_response()
    };
    let delete = move || async move {
        deleted.store(true, Ordering::SeqCst);
        release.notified().await;
        StatusCode::OK
    };
    let router = axum::Router::new().route(
        "/mcp",
        axum::routing::post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }).delete(delete),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// A protocol version toolmux does not speak fails the start at once: the session is
/// closed in the background, where a server slow to end it (its `DELETE` held here) made
/// the error wait for the close timeout (2 s), and the shutdown waits for that close.
#[tokio::test]
async fn an_unknown_protocol_version_fails_before_the_session_is_closed() {
    let release = Arc::new(Notify::new());
    let deleted = Arc::new(AtomicBool::new(false));
    let url = unknown_version_server(release.clone(), deleted.clone()).await;
    let config = McpServerConfig::remote(TransportKind::Http, url)
        .with_protocol(toolmux_mcp::ProtocolMode::Legacy)
        .with_startup_timeout(Duration::from_secs(10));
    let provider = McpProvider::new("future", config).unwrap();
    let started = std::time::Instant::now();
    let error = provider.warmup().await.unwrap_err();
    let took = started.elapsed();
    assert!(error.to_string().contains("\"1999-01-01\", which toolmux does not speak"), "{error}");
    // Against the close timeout of 2 s, which the error waited for.
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    release.notify_one();
    provider.shutdown().await.unwrap();
    assert!(deleted.load(Ordering::SeqCst), "the session was closed by the shutdown's end");
}
