//! The model clients against the scripted model server of `toolmux-test-support`, for both
//! APIs: what goes on the wire, what comes back, and every way a request can fail.

// Tests may unwrap: a failure is a test failure with the value shown.
#![allow(clippy::unwrap_used)]

mod anthropic;
mod extras;
mod failures;
mod ids;
mod openai;
mod pause;
mod stops;
mod streaming;

use serde_json::{Value, json};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use toolmux_llm::{
    ApiKind, ImagePart, Message, Model, ModelConfig, ModelError, ModelRequest, ModelResponse,
    ModelToolCall, ToolDefinition, ToolResultMessage,
};
use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};

/// The API key every test configures; no error or `Debug` output may show it.
const KEY: &str = "sk-test-9f3c-SECRET-key-71ab";

const DIALECTS: [Dialect; 2] = [Dialect::OpenAi, Dialect::Anthropic];

/// A loopback server of raw HTTP that reads each request to the end of its head (the
/// answer is the same whatever it asks) and then hands the connection to `answer`; every
/// connection accepted is counted in the returned counter. Returns its address.
async fn raw_server<F, Fut>(
    answer: F,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 8192];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut chunk).await {
                        Ok(n) if n > 0 => head.extend_from_slice(&chunk[..n]),
                        _ => return,
                    }
                }
                answer(socket).await;
            });
        }
    });
    (addr, requests)
}

/// The configuration of a model served by `server`.
fn config(dialect: Dialect, base_url: String) -> ModelConfig {
    ModelConfig {
        api: match dialect {
            Dialect::OpenAi => ApiKind::Openai,
            Dialect::Anthropic => ApiKind::Anthropic,
        },
        model: "test-model".into(),
        base_url: Some(base_url),
        api_key: Some(KEY.into()),
        ..ModelConfig::default()
    }
}

/// A scripted server and a client of it.
fn serve(dialect: Dialect, script: Vec<ScriptStep>) -> (ScriptedLlmServer, Arc<dyn Model>) {
    serve_with(dialect, script, |_| {})
}

/// A scripted server and a client of it, configured further by `adjust`.
fn serve_with(
    dialect: Dialect,
    script: Vec<ScriptStep>,
    adjust: impl FnOnce(&mut ModelConfig),
) -> (ScriptedLlmServer, Arc<dyn Model>) {
    let server = ScriptedLlmServer::start(dialect, script);
    let mut config = config(dialect, server.base_url());
    adjust(&mut config);
    let model = toolmux_llm::connect("scripted", &config).unwrap();
    assert_no_key(&format!("{model:?}"));
    (server, model)
}

async fn complete(model: &Arc<dyn Model>, request: &ModelRequest) -> ModelResponse {
    model.complete(request, &CancellationToken::new()).await.unwrap()
}

/// The error of a request that must fail, checked to keep the key to itself.
async fn fail(model: &Arc<dyn Model>, request: &ModelRequest) -> ModelError {
    let error = model.complete(request, &CancellationToken::new()).await.unwrap_err();
    assert_key_absent(&error);
    error
}

fn assert_key_absent(error: &ModelError) {
    assert_no_key(&error.to_string());
    assert_no_key(&format!("{error:?}"));
}

fn assert_no_key(text: &str) {
    assert!(!text.contains(KEY), "the API key shows in: {text}");
    assert!(!text.contains("SECRET"), "part of the API key shows in: {text}");
}

fn hello() -> ModelRequest {
    ModelRequest::new(vec![Message::user("Hello")])
}

/// A conversation of two rounds of tool calls, one failed, and the user's next words.
fn conversation() -> ModelRequest {
    ModelRequest::new(vec![
        Message::user("Read the README"),
        Message::Assistant {
            content: "Reading it.".into(),
            tool_calls: vec![
                ModelToolCall::new("call_a", "fs__read", json!({"path": "README.md"})),
                ModelToolCall::new("call_b", "fs__stat", json!({"path": "x"})),
            ],
            reasoning: None,
            blocks: None,
        },
        Message::Tool {
            results: vec![
                result("call_a", "# toolmux", false),
                result("call_b", "no such file: x", true),
            ],
        },
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ModelToolCall::new("call_c", "fs__list", json!({}))],
            reasoning: None,
            blocks: None,
        },
        Message::Tool { results: vec![result("call_c", "README.md", false)] },
        Message::user("Now summarize it"),
    ])
    .with_system("Be brief.")
}

fn result(call_id: &str, content: &str, is_error: bool) -> ToolResultMessage {
    ToolResultMessage::new(call_id, content, is_error)
}

/// A PNG's 8-byte signature in base64.
const PNG: &str = "iVBORw0KGgo=";
/// `<svg/>` in base64: an image type neither API reads.
const SVG: &str = "PHN2Zy8+";

/// A round of two calls, the first returning a screenshot (a PNG and an SVG), the second
/// text, two JPEGs and nothing else; then the user's next words.
fn screenshots() -> ModelRequest {
    ModelRequest::new(vec![
        Message::user("Open the page"),
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![
                ModelToolCall::new("call_a", "browser__screenshot", json!({})),
                ModelToolCall::new("call_b", "fs__read", json!({"path": "notes"})),
                ModelToolCall::new("call_c", "camera__snap", json!({})),
            ],
            reasoning: None,
            blocks: None,
        },
        Message::Tool {
            results: vec![
                result("call_a", "Screenshot of the page", false).with_images(vec![
                    ImagePart::new("image/png", PNG),
                    ImagePart::new("image/svg+xml", SVG),
                ]),
                result("call_b", "no notes", false),
                result("call_c", "", false).with_images(vec![
                    ImagePart::new("image/jpg", PNG),
                    ImagePart::new("image/jpeg", PNG),
                ]),
            ],
        },
        Message::user("What do you see?"),
    ])
}

/// A tool whose input schema is a top-level union, which neither API takes as is.
fn union_tool() -> ToolDefinition {
    ToolDefinition::new(
        "users__find",
        "Finds a user",
        json!({"anyOf": [
            {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
            {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}
        ]}),
    )
}

/// The one request `server` received.
fn only_request(server: &ScriptedLlmServer) -> Value {
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    requests.into_iter().next().unwrap()
}

/// A turn of calls of tools the model made up (a name with a dot, one with a space, an
/// empty one, one too long) beside one offered, and their results.
fn made_up_calls() -> ModelRequest {
    let names = ["multi_tool_use.parallel", "fs read", "", &"x".repeat(70), "router__handoff-to"];
    let calls: Vec<ModelToolCall> = names
        .iter()
        .enumerate()
        .map(|(i, name)| ModelToolCall::new(format!("c{i}"), *name, json!({})))
        .collect();
    let results =
        calls.iter().map(|c| result(&c.id, "(tool failed: unknown tool)", true)).collect();
    ModelRequest::new(vec![
        Message::user("go"),
        Message::Assistant {
            content: String::new(),
            tool_calls: calls,
            reasoning: None,
            blocks: None,
        },
        Message::Tool { results },
    ])
}

/// The names of [`made_up_calls`] as both APIs take them (`^[a-zA-Z0-9_-]{1,64}$`).
fn made_up_names_on_the_wire() -> Vec<Value> {
    vec![
        json!("multi_tool_use_parallel"),
        json!("fs_read"),
        json!("_"),
        json!("x".repeat(64)),
        json!("router__handoff-to"),
    ]
}

/// A loopback server that answers every request with `events` as a stream of server-sent
/// events. Returns its base URL.
async fn sse_server(events: Vec<Value>) -> String {
    sse_script_server(vec![events]).await.0
}

/// A loopback server that answers its `n`th request with `streams[n]` (the last of them
/// once they run out) as a stream of server-sent events. Returns its base URL and the
/// bodies of the requests it read, in order.
async fn sse_script_server(
    streams: Vec<Vec<Value>>,
) -> (String, Arc<std::sync::Mutex<Vec<Value>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = bodies.clone();
    tokio::spawn(async move {
        let mut served = 0;
        while let Ok((mut socket, _)) = listener.accept().await {
            let events = streams[served.min(streams.len() - 1)].clone();
            served += 1;
            let seen = seen.clone();
            tokio::spawn(async move {
                // The request's head and body, read up to its length, then the stream.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    let n = socket.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the client closed before its request was whole");
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                    if buf.len() >= end + 4 + length {
                        let request = &buf[end + 4..end + 4 + length];
                        seen.lock().unwrap().push(serde_json::from_slice(request).unwrap());
                        break;
                    }
                }
                let mut body = String::new();
                for event in &events {
                    if let Some(name) = event.get("type").and_then(Value::as_str) {
                        body.push_str(&format!("event: {name}\n"));
                    }
                    body.push_str(&format!("data: {event}\n\n"));
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                socket.write_all(reply.as_bytes()).await.unwrap();
            });
        }
    });
    (base, bodies)
}
