//! Our answers to a server's requests, posted again after a transient failure: a loopback
//! server written here, speaking streamable HTTP and legacy HTTP+SSE, asks the client a
//! `ping` during a call and refuses the first answer's POSTs (503 or 429), as a server
//! behind a load balancer restarting a backend does. The answer was dropped, and the
//! server's request (and the call waiting on it) ran to its timeout.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, ProtocolMode, TransportKind};

/// How long the server waits for the answer to its `ping` before it answers the call
/// without it.
const ANSWER_WAIT: Duration = Duration::from_secs(4);

#[derive(Clone)]
struct Server {
    /// Answer POSTs received.
    answers: Arc<AtomicUsize>,
    /// How many of the first answer POSTs are refused, and how.
    refused: usize,
    refusal: (StatusCode, Option<&'static str>),
    /// Set once an answer was taken.
    answered: watch::Sender<bool>,
    /// The legacy event stream's sender.
    stream: Arc<Mutex<Option<mpsc::UnboundedSender<String>>>>,
}

impl Server {
    fn new(refused: usize, refusal: (StatusCode, Option<&'static str>)) -> Server {
        Server {
            answers: Arc::new(AtomicUsize::new(0)),
            refused,
            refusal,
            answered: watch::channel(false).0,
            stream: Arc::default(),
        }
    }

    /// Takes or refuses an answer's POST.
    fn answer(&self) -> Response {
        let n = self.answers.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.refused {
            let (status, retry_after) = self.refusal;
            let mut response = (status, "try again").into_response();
            if let Some(after) = retry_after {
                response.headers_mut().insert("retry-after", after.parse().unwrap());
            }
            return response;
        }
        self.answered.send_replace(true);
        StatusCode::ACCEPTED.into_response()
    }

    /// The result of a call that asked the client a `ping`: whether its answer came.
    async fn asked(&self) -> Value {
        let mut answered = self.answered.subscribe();
        let came = tokio::time::timeout(ANSWER_WAIT, answered.wait_for(|a| *a)).await;
        let text = if came.is_ok() { "answered" } else { "unanswered" };
        json!({"content": [{"type": "text", "text": text}]})
    }
}

/// The server's request during a call.
fn ping() -> Value {
    json!({"jsonrpc": "2.0", "id": "server-ping-1", "method": "ping"})
}

fn result_of(request: &Value) -> Value {
    match request["method"].as_str().unwrap_or_default() {
        "initialize" => json!({
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "answer-posts", "version": "1"},
        }),
        "tools/list" => json!({"tools": [{"name": "asks", "inputSchema": {"type": "object"}}]}),
        _ => json!({}),
    }
}

fn sse_event(message: &Value) -> String {
    format!("event: message\ndata: {message}\n\n")
}

/// Streamable HTTP: a call is answered on an event stream carrying the `ping` first.
async fn streamable(State(server): State<Server>, body: String) -> Response {
    let message: Value = serde_json::from_str(&body).unwrap();
    let Some(id) = message.get("id").cloned() else { return StatusCode::ACCEPTED.into_response() };
    if message.get("method").is_none() {
        return server.answer();
    }
    if message["method"] == "tools/call" {
        let (tx, rx) = mpsc::unbounded_channel::<String>();
        tx.send(sse_event(&ping())).unwrap();
        tokio::spawn(async move {
            let result = server.asked().await;
            let _ = tx.send(sse_event(&json!({"jsonrpc": "2.0", "id": id, "result": result})));
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|event| (Ok::<_, std::convert::Infallible>(event), rx))
        });
        let body = axum::body::Body::from_stream(stream);
        return ([("content-type", "text/event-stream")], body).into_response();
    }
    let reply = json!({"jsonrpc": "2.0", "id": id, "result": result_of(&message)});
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("mcp-session-id", "answer-posts-session".parse().unwrap());
    (headers, reply.to_string()).into_response()
}

/// Legacy SSE: the event stream.
async fn events(State(server): State<Server>) -> Response {
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    tx.send("event: endpoint\ndata: /message\n\n".into()).unwrap();
    *server.stream.lock().unwrap() = Some(tx);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok::<_, std::convert::Infallible>(event), rx))
    });
    ([("content-type", "text/event-stream")], axum::body::Body::from_stream(stream)).into_response()
}

/// Legacy SSE: the message endpoint; a call's `ping` and result go on the event stream.
async fn legacy_message(State(server): State<Server>, body: String) -> Response {
    let message: Value = serde_json::from_str(&body).unwrap();
    let Some(id) = message.get("id").cloned() else { return StatusCode::ACCEPTED.into_response() };
    if message.get("method").is_none() {
        return server.answer();
    }
    let stream = server.stream.lock().unwrap().clone().expect("an event stream");
    if message["method"] == "tools/call" {
        stream.send(sse_event(&ping())).unwrap();
        tokio::spawn(async move {
            let result = server.asked().await;
            let _ = stream.send(sse_event(&json!({"jsonrpc": "2.0", "id": id, "result": result})));
        });
    } else {
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": result_of(&message)});
        stream.send(sse_event(&reply)).unwrap();
    }
    StatusCode::ACCEPTED.into_response()
}

/// Calls `asks` on `server` over `transport`: the call's text and the answer POSTs the
/// server saw.
async fn call_asks(server: Server, transport: TransportKind) -> (String, usize) {
    let router = axum::Router::new()
        .route(
            "/mcp",
            axum::routing::post(streamable)
                .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                .delete(|| async { StatusCode::ACCEPTED }),
        )
        .route("/sse", axum::routing::get(events))
        .route("/message", axum::routing::post(legacy_message))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, router).await });
    let path = if transport == TransportKind::Sse { "sse" } else { "mcp" };
    let config = McpServerConfig::remote(transport, format!("http://{address}/{path}"))
        .with_protocol(ProtocolMode::Legacy)
        .with_request_timeout(Duration::from_secs(20));
    let provider = McpProvider::new("asking", config).unwrap();
    let out = provider.call("asks", json!({}), &CallContext::new()).await;
    let text = out.unwrap().to_text();
    provider.shutdown().await.unwrap();
    task.abort();
    (text, server.answers.load(Ordering::SeqCst))
}

const UNAVAILABLE: (StatusCode, Option<&str>) = (StatusCode::SERVICE_UNAVAILABLE, None);
const RATE_LIMITED: (StatusCode, Option<&str>) = (StatusCode::TOO_MANY_REQUESTS, Some("1"));

#[tokio::test]
async fn a_refused_answer_is_posted_again_over_streamable_http() {
    let (text, answers) = call_asks(Server::new(1, UNAVAILABLE), TransportKind::Http).await;
    assert_eq!((text.as_str(), answers), ("answered", 2));
    let (text, answers) = call_asks(Server::new(1, RATE_LIMITED), TransportKind::Http).await;
    assert_eq!((text.as_str(), answers), ("answered", 2));
}

#[tokio::test]
async fn a_refused_answer_is_posted_again_over_legacy_sse() {
    let (text, answers) = call_asks(Server::new(1, UNAVAILABLE), TransportKind::Sse).await;
    assert_eq!((text.as_str(), answers), ("answered", 2));
    let (text, answers) = call_asks(Server::new(1, RATE_LIMITED), TransportKind::Sse).await;
    assert_eq!((text.as_str(), answers), ("answered", 2));
}

/// An answer the server keeps refusing is posted three times in all, then dropped (and
/// logged): the server's request runs to its timeout, and the connection goes on.
#[tokio::test]
async fn an_answer_is_posted_three_times_at_most() {
    for transport in [TransportKind::Http, TransportKind::Sse] {
        let (text, answers) = call_asks(Server::new(usize::MAX, UNAVAILABLE), transport).await;
        assert_eq!((text.as_str(), answers), ("unanswered", 3), "{transport:?}");
    }
}
