//! Posting messages over the legacy HTTP+SSE transport, against a loopback SSE server
//! written here whose message endpoint never answers the POST of a `hang` call, refuses
//! that of a `refused` call (500) and no longer knows the session for a `gone` call (404).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, ProtocolMode, TransportKind};

#[derive(Clone, Default)]
struct Server {
    /// The latest event stream's sender (a reconnect replaces it).
    stream: Arc<Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>>,
    /// Event streams opened.
    streams: Arc<AtomicUsize>,
    /// The POST of `initialize` is refused (500).
    refuse_initialize: Arc<std::sync::atomic::AtomicBool>,
}

async fn events(State(server): State<Server>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // The key in the endpoint's query must show in no error.
    tx.send("event: endpoint\ndata: /message?key=sekrit\n\n".into()).unwrap();
    *server.stream.lock().unwrap() = Some(tx);
    server.streams.fetch_add(1, Ordering::SeqCst);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok::<_, std::convert::Infallible>(event), rx))
    });
    ([("content-type", "text/event-stream")], axum::body::Body::from_stream(stream)).into_response()
}

async fn message(State(server): State<Server>, body: String) -> Response {
    let request: Value = serde_json::from_str(&body).unwrap();
    let Some(id) = request.get("id").cloned() else { return StatusCode::ACCEPTED.into_response() };
    if request["method"] == "initialize" && server.refuse_initialize.load(Ordering::SeqCst) {
        return (StatusCode::INTERNAL_SERVER_ERROR, "not today").into_response();
    }
    let result = match request["method"].as_str().unwrap_or_default() {
        "initialize" => json!({
            "protocolVersion": "2024-11-05",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "sse-posts", "version": "1"},
        }),
        "tools/list" => json!({"tools": [
            {"name": "echo", "inputSchema": {"type": "object"}},
            {"name": "hang", "inputSchema": {"type": "object"}},
            {"name": "slow", "inputSchema": {"type": "object"}},
            {"name": "refused", "inputSchema": {"type": "object"}},
            {"name": "gone", "inputSchema": {"type": "object"}},
        ]}),
        "tools/call" if request["params"]["name"] == "hang" => {
            // The POST is never answered, as by a server stuck on it.
            std::future::pending::<()>().await;
            unreachable!()
        }
        "tools/call" if request["params"]["name"] == "refused" => {
            return (StatusCode::INTERNAL_SERVER_ERROR, "overloaded").into_response();
        }
        "tools/call" if request["params"]["name"] == "gone" => {
            return (StatusCode::NOT_FOUND, "Could not find session").into_response();
        }
        "tools/call" if request["params"]["name"] == "slow" => {
            // Taken at once, answered on the stream later.
            let stream = server.stream.lock().unwrap().clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(800)).await;
                let result = json!({"content": [{"type": "text", "text": "slow"}]});
                let reply = json!({"jsonrpc": "2.0", "id": id, "result": result});
                if let Some(stream) = stream {
                    let _ = stream.send(format!("event: message\ndata: {reply}\n\n"));
                }
            });
            return StatusCode::ACCEPTED.into_response();
        }
        "tools/call" => json!({"content": [{"type": "text", "text": "echo"}]}),
        _ => json!({}),
    };
    let reply = json!({"jsonrpc": "2.0", "id": id, "result": result});
    if let Some(stream) = server.stream.lock().unwrap().as_ref() {
        let _ = stream.send(format!("event: message\ndata: {reply}\n\n"));
    }
    StatusCode::ACCEPTED.into_response()
}

/// The server on a loopback port, and a provider connected to it whose requests time out
/// after `timeout`.
async fn connected(
    timeout: Duration,
) -> (Server, McpProvider, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (server, provider, task) = serving(Server::default(), timeout).await;
    provider.warmup().await.unwrap();
    (server, provider, task)
}

/// A call after the faults is answered, the server having seen `streams` event streams
/// in all (1: the same connection went on; 2: it connected again); then the provider and
/// the server stop.
async fn echo_then_stop(
    server: &Server,
    provider: &McpProvider,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    streams: usize,
) {
    let out = provider.call("echo", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "echo");
    assert_eq!(server.streams.load(Ordering::SeqCst), streams, "event streams opened");
    provider.shutdown().await.unwrap();
    task.abort();
}

/// `server` on a loopback port, and a provider for it, not connected yet.
async fn serving(
    server: Server,
    timeout: Duration,
) -> (Server, McpProvider, tokio::task::JoinHandle<std::io::Result<()>>) {
    let router = axum::Router::new()
        .route("/sse", axum::routing::get(events))
        .route("/message", axum::routing::post(message))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/sse?key=sekrit", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, router).await });
    let config = McpServerConfig::remote(TransportKind::Sse, url)
        .with_protocol(ProtocolMode::Legacy)
        .with_request_timeout(timeout);
    let provider = McpProvider::new("legacy", config).unwrap();
    (server, provider, task)
}

/// A refused POST of the handshake's request fails the handshake, saying what happened to
/// it (not the error answer made for it, as rmcp prints it).
#[tokio::test]
async fn a_refused_handshake_post_says_so() {
    let server = Server::default();
    server.refuse_initialize.store(true, Ordering::SeqCst);
    let (_server, provider, task) = serving(server, Duration::from_secs(20)).await;
    let error = provider.warmup().await.unwrap_err().to_string();
    expect_test::expect!["legacy: handshake failed: the handshake request was not delivered: the server answered its POST with HTTP 500 Internal Server Error"].assert_eq(&error);
    task.abort();
}

/// A POST the server never answers holds no other message (they are posted beside it), and
/// fails its call after the request timeout with an error naming the server and what
/// happened, not the endpoint's URL; the connection goes on. The stuck POST held every
/// later message for ever, and then failed every call on the connection. The server may
/// have run the call it took, so the error says the outcome is unknown, and is not one a
/// retry is made on (it said "not delivered", a transient error, and a retry policy sent
/// the call again).
#[tokio::test]
async fn a_stuck_post_times_out_and_holds_no_other_message() {
    let (server, provider, task) = connected(Duration::from_millis(1500)).await;

    // The call's own wait is longer: what ends it is the POST's timeout.
    let ctx = CallContext::new().with_wait(Duration::from_secs(30));
    let started = Instant::now();
    let hang = provider.call("hang", json!({}), &ctx);
    let echo = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        provider.call("echo", json!({}), &CallContext::new()).await
    };
    let (hang, echo) = tokio::join!(hang, echo);
    assert_eq!(echo.unwrap().to_text(), "echo", "posted beside the stuck POST");
    let hang_error = hang.unwrap_err();
    let error = hang_error.to_string();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    expect_test::expect!["legacy: tools/call sent, outcome unknown: its POST got no answer within 1500 ms (`requestTimeoutMs`); the server is stuck or overloaded; it may have run, so check its effect before calling again"]
        .assert_eq(&error);
    assert!(!error.contains("sekrit"), "{error}");
    assert!(!hang_error.is_transient(), "{hang_error:?}");

    echo_then_stop(&server, &provider, task, 1).await;
}

/// A POST the server refuses (HTTP 500) fails the call it carried at once, naming the
/// status; a call in flight beside it is answered on the event stream, and the connection
/// goes on. The refusal ended the connection, failing the call in flight with it.
#[tokio::test]
async fn a_refused_post_fails_only_its_own_call() {
    let (server, provider, task) = connected(Duration::from_secs(20)).await;
    let ctx = CallContext::new();
    let slow = provider.call("slow", json!({}), &ctx);
    let refused = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        let refused = provider.call("refused", json!({}), &CallContext::new()).await;
        (refused, started.elapsed())
    };
    let (slow, (refused, took)) = tokio::join!(slow, refused);
    let error = refused.unwrap_err();
    expect_test::expect!["legacy: tools/call not delivered: the server answered its POST with HTTP 500 Internal Server Error"]
        .assert_eq(&error.to_string());
    assert!(error.is_transient(), "{error:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert_eq!(slow.unwrap().to_text(), "slow", "the call in flight is answered");
    echo_then_stop(&server, &provider, task, 1).await;
}

/// A POST answered 404 shows the session gone: the connection ends, failing the calls in
/// flight, and the next call connects again.
#[tokio::test]
async fn a_post_to_a_session_gone_ends_the_connection() {
    let (server, provider, task) = connected(Duration::from_secs(20)).await;
    let ctx = CallContext::new();
    let slow = provider.call("slow", json!({}), &ctx);
    let gone = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        provider.call("gone", json!({}), &CallContext::new()).await
    };
    let (slow, gone) = tokio::join!(slow, gone);
    let expected = expect_test::expect![
        "legacy: connection closed (a message was not delivered: the server answered its POST with HTTP 404 Not Found)"
    ];
    expected.assert_eq(&gone.unwrap_err().to_string());
    expected.assert_eq(&slow.unwrap_err().to_string());
    echo_then_stop(&server, &provider, task, 2).await;
}
