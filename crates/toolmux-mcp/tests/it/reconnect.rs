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
    // The request either finds nothing listening, or goes out on the pooled connection the
    // server's exit closed, which hyper may see only once it wrote on it.
    let error = error.replace(&port.to_string(), "PORT");
    let refused = "web: tools/call not delivered: cannot reach http://127.0.0.1:PORT/mcp: \
                   Connection refused (os error 111); is the server running, and is `url` right?";
    let broke = "web: tools/call sent, outcome unknown: the request to http://127.0.0.1:PORT/mcp \
                 broke: client error (SendRequest): connection closed before message completed; \
                 it may have run, so check its effect before calling again";
    assert!(error == refused || error == broke, "{error}");
    let error = echo(&provider, "still down").await.unwrap_err().to_string();
    let error = error.replace(&port.to_string(), "PORT");
    expect_test::expect!["web: cannot connect over http: cannot reach http://127.0.0.1:PORT/mcp: Connection refused (os error 111); is the server running, and is `url` right?"].assert_eq(&error);
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
/// answered HTTP 503, and it lists a tool `in_sN` of the session. `slow` answers after a
/// second, `slow_sse` the same on an SSE stream; `dropped` and `dropped_for_good` open an
/// SSE stream with one event id and close it without the answer: a GET with that id as
/// `Last-Event-ID` gets the answer of `dropped` (resumability) and 404 for the other.
async fn sessions_http_server() -> String {
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// One SSE event carrying `message`, with `id` when given.
    fn event(id: Option<&str>, message: &str) -> String {
        let id = id.map(|id| format!("id: {id}\n")).unwrap_or_default();
        format!("{id}data: {message}\n\n")
    }
    /// An SSE response of `events`, each after its delay.
    fn sse(events: Vec<(Duration, String)>) -> axum::response::Response {
        let stream = futures::stream::iter(events).then(|(delay, text)| async move {
            tokio::time::sleep(delay).await;
            Ok::<_, std::convert::Infallible>(text)
        });
        let body = axum::body::Body::from_stream(stream);
        ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
    }
    use futures::StreamExt;

    let made = Arc::new(AtomicUsize::new(0));
    let known = Arc::new(Mutex::new(HashSet::<String>::new()));
    // The answers a GET with `Last-Event-ID` resumes, by event id.
    let resumable = Arc::new(Mutex::new(HashMap::<String, String>::new()));
    let resumed = resumable.clone();
    let mcp = move |headers: HeaderMap, body: String| {
        let (made, known, resumable) = (made.clone(), known.clone(), resumable.clone());
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
                    let names = [
                        "hang",
                        "session",
                        "forget",
                        "unavailable",
                        "slow",
                        "slow_sse",
                        "dropped",
                        "dropped_for_good",
                        &in_session,
                    ];
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
                    Some("slow") => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        (json, text("slow answer")).into_response()
                    }
                    Some("slow_sse") => sse(vec![(Duration::from_secs(1), text("slow answer"))]),
                    Some(name @ ("dropped" | "dropped_for_good")) => {
                        let event_id = format!("{name}-{id}");
                        resumable.lock().unwrap().insert(event_id.clone(), text("resumed answer"));
                        sse(vec![(Duration::ZERO, event(Some(&event_id), ""))])
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
            .get(move |headers: HeaderMap| {
                let resumed = resumed.clone();
                async move {
                    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok());
                    let Some(last) = last else {
                        return StatusCode::METHOD_NOT_ALLOWED.into_response();
                    };
                    let answer = match last.starts_with("dropped-") {
                        true => resumed.lock().unwrap().remove(last),
                        false => None,
                    };
                    match answer {
                        Some(answer) => sse(vec![(Duration::ZERO, event(None, &answer))]),
                        None => StatusCode::NOT_FOUND.into_response(),
                    }
                }
            })
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

/// An HTTP error answering a call is named in the call's error, with the server's URL and
/// what to do (it said a bare "connection closed"), and the next call connects afresh.
#[tokio::test(flavor = "multi_thread")]
async fn an_http_status_is_named_and_the_next_call_reconnects() {
    let url = sessions_http_server().await;
    let provider =
        McpProvider::new("web", McpServerConfig::remote(TransportKind::Http, url.clone())).unwrap();
    assert_eq!(call(&provider, "session").await.unwrap(), "s1");
    let error = call(&provider, "unavailable").await.unwrap_err().to_string();
    expect_test::expect!["web: tools/call not delivered: URL answered HTTP 503 Service Unavailable; the server, or a proxy in front of it, failed: try again later, or see the server's log"].assert_eq(&error.replace(&url, "URL"));
    assert_eq!(call(&provider, "session").await.unwrap(), "s2");
    provider.shutdown().await.unwrap();
}

/// Calls `tool` while the server forgets the session: `forget`, then a call that meets the
/// 404 and has rmcp start a new session. What the call of `tool` got, and how long it took.
async fn call_across_a_renewal(
    provider: &McpProvider,
    tool: &str,
) -> (Result<String, ToolError>, Duration) {
    let started = Instant::now();
    let (during, ()) = tokio::join!(call(provider, tool), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(call(provider, "forget").await.unwrap(), "forgotten");
        assert_eq!(call(provider, "session").await.unwrap(), "s2");
    });
    (during, started.elapsed())
}

fn renewing_provider(url: String) -> McpProvider {
    let config = McpServerConfig::remote(TransportKind::Http, url)
        .with_request_timeout(Duration::from_secs(30));
    McpProvider::new("web", config).unwrap()
}

/// Two calls that time out after an orphaned call leave the session alone: the orphaned
/// call was not counted as a third.
async fn two_timeouts_keep_the_session(provider: &McpProvider) {
    let hang = CallContext::new().with_wait(Duration::from_millis(300));
    for _ in 0..2 {
        let timed_out = provider.call("hang", json!({}), &hang).await;
        assert!(matches!(timed_out, Err(ToolError::Timeout { .. })), "{timed_out:?}");
    }
    assert_eq!(call(provider, "session").await.unwrap(), "s2", "the same connection");
}

/// A call whose answer comes in the POST's own response while the session is renewed gets
/// it: rmcp waits for the old session's POSTs before starting the new one.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_answered_in_its_post_during_a_renewal_gets_its_answer() {
    let provider = renewing_provider(sessions_http_server().await);
    assert_eq!(call(&provider, "session").await.unwrap(), "s1");
    let (during, took) = call_across_a_renewal(&provider, "slow").await;
    assert_eq!(during.unwrap(), "slow answer");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    two_timeouts_keep_the_session(&provider).await;
    provider.shutdown().await.unwrap();
}

/// A call whose answer was to come on an SSE stream of the forgotten session fails at once
/// when the session is renewed, saying so and that it may have run, and is no timeout
/// toward the reconnect rule (rmcp answered it with an internal error that read as the
/// server's own, "tools/call failed: … (code -32603)").
#[tokio::test(flavor = "multi_thread")]
async fn a_call_orphaned_by_a_renewal_fails_at_once_as_outcome_unknown() {
    let provider = renewing_provider(sessions_http_server().await);
    assert_eq!(call(&provider, "session").await.unwrap(), "s1");
    let (during, took) = call_across_a_renewal(&provider, "slow_sse").await;
    let error = during.unwrap_err();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    expect_test::expect!["web: tools/call sent, outcome unknown: the server forgot the session before answering it, and a new session was started; it may have run, so check its effect before calling again [other]"].assert_eq(&format!("{} [{}]", error.report(), error.code()));
    assert!(!error.is_transient(), "a retry could run it twice");
    two_timeouts_keep_the_session(&provider).await;
    provider.shutdown().await.unwrap();
}

/// A call whose POST gets no answer while the session is renewed fails when rmcp stops
/// waiting for the old session (five seconds, well under the request timeout), saying the
/// session was lost and that it may have run; the new session is kept (the connection was
/// given up, and the error read "connection closed").
#[tokio::test(flavor = "multi_thread")]
async fn a_call_unanswered_across_a_renewal_fails_as_outcome_unknown() {
    let provider = renewing_provider(sessions_http_server().await);
    assert_eq!(call(&provider, "session").await.unwrap(), "s1");
    let (during, took) = call_across_a_renewal(&provider, "hang").await;
    let error = during.unwrap_err();
    assert!(took < Duration::from_secs(10), "took {took:?}");
    expect_test::expect!["web: tools/call sent, outcome unknown: the server forgot the session and sent no answer within 5 s of that, and a new session was started; it may have run, so check its effect before calling again [other]"].assert_eq(&format!("{} [{}]", error.report(), error.code()));
    assert!(!error.is_transient(), "a retry could run it twice");
    two_timeouts_keep_the_session(&provider).await;
    provider.shutdown().await.unwrap();
}

/// A call's SSE stream that the server closes before the answer is resumed with a GET
/// carrying the last event id, and the call gets its answer there.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_answer_stream_is_resumed() {
    let provider = renewing_provider(sessions_http_server().await);
    let started = Instant::now();
    assert_eq!(call(&provider, "dropped").await.unwrap(), "resumed answer");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_eq!(call(&provider, "session").await.unwrap(), "s1", "the same connection");
    provider.shutdown().await.unwrap();
}

/// A call's SSE stream closed before the answer, that the server cannot resume, fails at
/// once saying so and that the call may have run; the connection goes on (it said a bare
/// "connection closed", as if the server had gone, and counted toward its restarts).
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_answer_stream_not_resumed_fails_as_outcome_unknown() {
    let provider = renewing_provider(sessions_http_server().await);
    let started = Instant::now();
    let error = call(&provider, "dropped_for_good").await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    expect_test::expect!["web: tools/call sent, outcome unknown: the server closed the answer's SSE stream before the answer, and it could not be resumed (that takes event ids and a GET with Last-Event-ID); it may have run, so check its effect before calling again [other]"].assert_eq(&format!("{} [{}]", error.report(), error.code()));
    assert!(!error.is_transient(), "a retry could run it twice");
    assert_eq!(call(&provider, "session").await.unwrap(), "s1", "the same connection");
    provider.shutdown().await.unwrap();
}
