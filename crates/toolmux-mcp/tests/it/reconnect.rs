//! Servers that go away and come back: a streamable HTTP server restarted (it no longer
//! knows the session) or unreachable for a while.

use serde_json::json;
use std::time::{Duration, Instant};
use toolmux_core::{CallContext, ToolError, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, TransportKind};

use crate::support::{self, ServerProcess};

/// server-everything over streamable HTTP on `port`: it answers a session it does not know
/// with 400 and a JSON-RPC error carrying the request's id.
fn everything_http(port: u16) -> ServerProcess {
    let args = [support::everything_js().display().to_string(), "streamableHttp".into()];
    ServerProcess::start("node", &args, port)
}

/// The TypeScript SDK's README server on `port`: it answers a session it does not know with
/// 400 and a JSON-RPC error whose id is null.
fn readme_http(port: u16) -> ServerProcess {
    let args = [
        support::fixture("readme_http_server.mjs").display().to_string(),
        support::node_modules().display().to_string(),
    ];
    ServerProcess::start("node", &args, port)
}

fn http_provider(port: u16) -> McpProvider {
    let url = format!("http://127.0.0.1:{port}/mcp");
    let config = McpServerConfig::remote(TransportKind::Http, url)
        .with_request_timeout(Duration::from_secs(20));
    McpProvider::new("web", config).unwrap()
}

async fn echo(provider: &McpProvider, message: &str) -> Result<String, ToolError> {
    let arguments = json!({"message": message});
    provider.call("echo", arguments, &CallContext::new()).await.map(|out| out.to_text())
}

/// A call after the server restarted gets a new session at once and its answer (it waited
/// for its timeout, and so did every later call).
async fn a_restart_is_followed(start: fn(u16) -> ServerProcess) {
    let port = support::free_port();
    let server = start(port);
    let provider = http_provider(port);
    assert_eq!(echo(&provider, "one").await.unwrap(), "Echo: one");
    drop(server);
    let _server = start(port);
    for message in ["two", "three"] {
        let started = Instant::now();
        assert_eq!(echo(&provider, message).await.unwrap(), format!("Echo: {message}"));
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }
    provider.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_server_answering_400_with_the_request_id_is_used_again() {
    a_restart_is_followed(everything_http).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_server_answering_400_with_a_null_id_is_used_again() {
    a_restart_is_followed(readme_http).await;
}

/// While the server is down calls fail at once, saying it cannot be reached; once it is
/// back the next call connects again (the connection was kept, and calls failed with a
/// bare "connection closed" until their timeouts once it was back).
#[tokio::test(flavor = "multi_thread")]
async fn calls_in_an_http_outage_fail_fast_and_the_server_is_used_once_back() {
    let port = support::free_port();
    let server = everything_http(port);
    let provider = http_provider(port);
    assert_eq!(echo(&provider, "one").await.unwrap(), "Echo: one");
    drop(server);
    let started = Instant::now();
    let error = echo(&provider, "down").await.unwrap_err().to_string();
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    expect_test::expect![
        "web: connection closed (cannot reach the server: Connection refused (os error 111))"
    ]
    .assert_eq(&error);
    let error = echo(&provider, "still down").await.unwrap_err().to_string();
    expect_test::expect![
        "web: cannot connect over http: cannot reach the server: Connection refused (os error 111)"
    ]
    .assert_eq(&error);
    let _server = everything_http(port);
    let started = Instant::now();
    assert_eq!(echo(&provider, "back").await.unwrap(), "Echo: back");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    provider.shutdown().await.unwrap();
}

/// A streamable HTTP server on loopback that numbers its sessions (`s1`, `s2`, …) and never
/// answers a call of `hang`, as a server stuck behind a proxy that keeps the connection
/// open does. Its `session` tool says which session it was called in, `forget` makes it
/// forget every session (as a restart does; it then answers them 404), `unavailable` is
/// answered HTTP 503, and it lists a tool `in_sN` of the session.
async fn sessions_http_server() -> String {
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    let made = Arc::new(AtomicUsize::new(0));
    let known = Arc::new(Mutex::new(HashSet::<String>::new()));
    let mcp = move |headers: HeaderMap, body: String| {
        let (made, known) = (made.clone(), known.clone());
        async move {
            let message: serde_json::Value = serde_json::from_str(&body).unwrap();
            let session = headers.get("mcp-session-id").and_then(|v| v.to_str().ok());
            if session.is_some_and(|s| !known.lock().unwrap().contains(s)) {
                return StatusCode::NOT_FOUND.into_response();
            }
            let Some(id) = message.get("id").cloned() else {
                return StatusCode::ACCEPTED.into_response();
            };
            let json = [(header::CONTENT_TYPE, "application/json")];
            let answer = |result: serde_json::Value| {
                json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
            };
            let text = |text: &str| answer(json!({"content": [{"type": "text", "text": text}]}));
            match (message["method"].as_str().unwrap_or(""), session) {
                ("initialize", None) => {
                    let session = format!("s{}", made.fetch_add(1, Ordering::SeqCst) + 1);
                    known.lock().unwrap().insert(session.clone());
                    let result = json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                        "serverInfo": {"name": "sessions", "version": "1"}});
                    let headers = [("mcp-session-id", session)];
                    (headers, json, answer(result)).into_response()
                }
                ("tools/list", Some(session)) => {
                    let schema = json!({"type": "object"});
                    let in_session = format!("in_{session}");
                    let names = ["hang", "session", "forget", "unavailable", &in_session];
                    let tools: Vec<_> =
                        names.iter().map(|n| json!({"name": n, "inputSchema": schema})).collect();
                    (json, answer(json!({"tools": tools}))).into_response()
                }
                ("tools/call", Some(session)) => match message["params"]["name"].as_str() {
                    Some("session") => (json, text(session)).into_response(),
                    Some("unavailable") => {
                        (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response()
                    }
                    Some("forget") => {
                        known.lock().unwrap().clear();
                        (json, text("forgotten")).into_response()
                    }
                    _ => std::future::pending().await,
                },
                _ => (json, answer(json!({}))).into_response(),
            }
        }
    };
    let router = axum::Router::new().route(
        "/mcp",
        axum::routing::post(mcp)
            .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
            .delete(|| async { StatusCode::OK }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

async fn call(provider: &McpProvider, tool: &str) -> Result<String, ToolError> {
    provider.call(tool, json!({}), &CallContext::new()).await.map(|out| out.to_text())
}

/// A remote server that leaves three requests in a row unanswered until their timeouts is
/// connected to afresh on the next call; fewer, or with an answer between, are not enough.
#[tokio::test(flavor = "multi_thread")]
async fn three_timeouts_in_a_row_over_http_reconnect() {
    let url = sessions_http_server().await;
    let config = McpServerConfig::remote(TransportKind::Http, url)
        .with_request_timeout(Duration::from_millis(300));
    let provider = McpProvider::new("stuck", config).unwrap();
    assert_eq!(call(&provider, "session").await.unwrap(), "s1");
    for _ in 0..2 {
        assert!(matches!(call(&provider, "hang").await, Err(ToolError::Timeout { .. })));
    }
    let session = call(&provider, "session").await.unwrap();
    assert_eq!(session, "s1", "an answer in between: still the session");
    for _ in 0..3 {
        assert!(matches!(call(&provider, "hang").await, Err(ToolError::Timeout { .. })));
    }
    assert_eq!(call(&provider, "session").await.unwrap(), "s2", "a new connection");
    provider.shutdown().await.unwrap();
}

/// A server that forgot the session (it restarted) gets a new one from rmcp at once, and
/// the tools are listed again, the change told: they may be another version's.
#[tokio::test(flavor = "multi_thread")]
async fn a_renewed_http_session_lists_the_tools_again() {
    let url = sessions_http_server().await;
    let config = McpServerConfig::remote(TransportKind::Http, url)
        .with_request_timeout(Duration::from_secs(10));
    let provider = McpProvider::new("renewed", config).unwrap();
    provider.warmup().await.unwrap();
    assert!(provider.has_tool("in_s1").await);
    let mut changes = provider.tool_list_changes().unwrap();
    assert_eq!(call(&provider, "forget").await.unwrap(), "forgotten");
    assert_eq!(call(&provider, "session").await.unwrap(), "s2");
    let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert_eq!(changed, Ok(true));
    assert!(provider.has_tool("in_s2").await && !provider.has_tool("in_s1").await);
    provider.shutdown().await.unwrap();
}

/// An HTTP error answering a call is named in the call's error (it said a bare
/// "connection closed"), and the next call connects afresh.
#[tokio::test(flavor = "multi_thread")]
async fn an_http_status_is_named_and_the_next_call_reconnects() {
    let url = sessions_http_server().await;
    let provider =
        McpProvider::new("web", McpServerConfig::remote(TransportKind::Http, url)).unwrap();
    assert_eq!(call(&provider, "session").await.unwrap(), "s1");
    let error = call(&provider, "unavailable").await.unwrap_err();
    expect_test::expect!["web: connection closed (the server answered HTTP 503)"]
        .assert_eq(&error.to_string());
    assert_eq!(call(&provider, "session").await.unwrap(), "s2");
    provider.shutdown().await.unwrap();
}
