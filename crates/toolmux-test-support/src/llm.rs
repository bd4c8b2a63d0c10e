//! A scripted model server: a real HTTP server on a loopback port that answers chat
//! completions (OpenAI's format) or messages (Anthropic's) from a script, and records what
//! it was sent, for testing model clients and agents without a model.
//!
//! ```
//! use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};
//!
//! let server = ScriptedLlmServer::start(
//!     Dialect::OpenAi,
//!     vec![ScriptStep::tool_call("fs__read", serde_json::json!({"path": "README.md"})), ScriptStep::text("done")],
//! );
//! assert!(server.base_url().ends_with("/v1"));
//! assert!(server.requests().is_empty());
//! ```

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Which API the server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI's chat completions at `POST /v1/chat/completions`.
    OpenAi,
    /// Anthropic's messages at `POST /v1/messages`.
    Anthropic,
}

/// A tool call in a script: the tool's name and its arguments.
pub type ScriptedCall = (String, Value);

/// How the server answers one request.
#[derive(Clone)]
pub enum ScriptStep {
    /// A text answer that ends the turn.
    Text(String),
    /// Tool calls, with ids `call_1`, `call_2`… unique across the script.
    ToolCalls(Vec<ScriptedCall>),
    /// Text and tool calls.
    TextAndToolCalls(String, Vec<ScriptedCall>),
    /// One tool call whose arguments are this text as written, valid JSON or not (for
    /// Anthropic, whose `input` is JSON, the text's value, or the text as a JSON string).
    RawToolCall {
        /// The tool's name.
        name: String,
        /// The arguments' text.
        raw_arguments: String,
    },
    /// An error response.
    Status {
        /// The HTTP status.
        status: u16,
        /// The body, sent as JSON when it is JSON.
        body: String,
        /// A `Retry-After` header.
        retry_after: Option<String>,
    },
    /// The step, answered after this long (the request stays open meanwhile).
    Delay(Duration, Box<ScriptStep>),
    /// A 200 with this body, whatever it is.
    Raw(String),
    /// The step this function returns for the request's body.
    Callback(Arc<dyn Fn(&Value) -> ScriptStep + Send + Sync>),
    /// The step answered in one piece even when the request asks for a stream (a server
    /// that cannot stream).
    Whole(Box<ScriptStep>),
    /// The step, streamed: after the first event that carries text or arguments the
    /// stream waits until the `Notify` is notified (so that a test sees the first delta
    /// arrive while the answer is still being written).
    Held(Arc<tokio::sync::Notify>, Box<ScriptStep>),
    /// The step, streamed, but the connection drops after the first event that carries
    /// text or arguments.
    BrokenOff(Box<ScriptStep>),
    /// A streamed answer that starts, then reports an error of this kind (Anthropic's
    /// `overloaded_error`, say) with this message inside the stream.
    StreamError {
        /// The error's `type`.
        kind: String,
        /// Its `message`.
        message: String,
    },
}

impl ScriptStep {
    /// [`ScriptStep::Text`].
    pub fn text(text: impl Into<String>) -> Self {
        ScriptStep::Text(text.into())
    }

    /// [`ScriptStep::ToolCalls`] of one call.
    pub fn tool_call(name: impl Into<String>, arguments: Value) -> Self {
        ScriptStep::ToolCalls(vec![(name.into(), arguments)])
    }

    /// [`ScriptStep::Status`] without `Retry-After`.
    pub fn status(status: u16, body: impl Into<String>) -> Self {
        ScriptStep::Status { status, body: body.into(), retry_after: None }
    }

    /// A 429 asking to wait `retry_after` (seconds or an HTTP date).
    pub fn rate_limited(retry_after: impl Into<String>) -> Self {
        ScriptStep::Status {
            status: 429,
            body: json!({"error": {"message": "rate limited", "type": "rate_limit_error"}})
                .to_string(),
            retry_after: Some(retry_after.into()),
        }
    }

    /// `step`, answered after `delay`.
    pub fn delay(delay: Duration, step: ScriptStep) -> Self {
        ScriptStep::Delay(delay, Box::new(step))
    }

    /// [`ScriptStep::Callback`].
    pub fn callback(answer: impl Fn(&Value) -> ScriptStep + Send + Sync + 'static) -> Self {
        ScriptStep::Callback(Arc::new(answer))
    }
}

impl fmt::Debug for ScriptStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScriptStep::Text(text) => f.debug_tuple("Text").field(text).finish(),
            ScriptStep::ToolCalls(calls) => f.debug_tuple("ToolCalls").field(calls).finish(),
            ScriptStep::TextAndToolCalls(text, calls) => {
                f.debug_tuple("TextAndToolCalls").field(text).field(calls).finish()
            }
            ScriptStep::RawToolCall { name, raw_arguments } => f
                .debug_struct("RawToolCall")
                .field("name", name)
                .field("raw_arguments", raw_arguments)
                .finish(),
            ScriptStep::Status { status, body, retry_after } => f
                .debug_struct("Status")
                .field("status", status)
                .field("body", body)
                .field("retry_after", retry_after)
                .finish(),
            ScriptStep::Delay(delay, step) => {
                f.debug_tuple("Delay").field(delay).field(step).finish()
            }
            ScriptStep::Raw(body) => f.debug_tuple("Raw").field(body).finish(),
            ScriptStep::Callback(_) => f.write_str("Callback(..)"),
            ScriptStep::Whole(step) => f.debug_tuple("Whole").field(step).finish(),
            ScriptStep::Held(_, step) => f.debug_tuple("Held").field(step).finish(),
            ScriptStep::BrokenOff(step) => f.debug_tuple("BrokenOff").field(step).finish(),
            ScriptStep::StreamError { kind, message } => {
                f.debug_struct("StreamError").field("kind", kind).field("message", message).finish()
            }
        }
    }
}

/// The server; it stops when dropped.
///
/// It runs on a thread and runtime of its own, so it serves whatever the test does:
/// a current-thread or multi-thread runtime, tokio's paused clock, or a plain `#[test]`
/// that waits on a child process.
#[derive(Debug)]
pub struct ScriptedLlmServer {
    dialect: Dialect,
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Stops serving when dropped.
    _server: crate::loopback::Loopback,
}

#[derive(Debug)]
struct Shared {
    dialect: Dialect,
    state: Mutex<Recorded>,
}

#[derive(Debug, Default)]
struct Recorded {
    script: VecDeque<ScriptStep>,
    /// Every request body, in order (a body that is not JSON as a JSON string).
    requests: Vec<Value>,
    headers: Vec<BTreeMap<String, String>>,
    /// How many steps were taken from the script.
    answered: usize,
    /// The number of the last tool call id given.
    last_call: u32,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, Recorded> {
        // A panicking callback poisons nothing worth refusing: the records stay whole.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ScriptedLlmServer {
    /// A server on `127.0.0.1` at a free port, answering `script` in order.
    pub fn start(dialect: Dialect, script: Vec<ScriptStep>) -> ScriptedLlmServer {
        let shared = Arc::new(Shared {
            dialect,
            state: Mutex::new(Recorded { script: script.into(), ..Recorded::default() }),
        });
        let path = match dialect {
            Dialect::OpenAi => "/v1/chat/completions",
            Dialect::Anthropic => "/v1/messages",
        };
        let app = Router::new()
            .route(path, post(answer))
            .fallback(|| async {
                error_response(StatusCode::NOT_FOUND, "no such endpoint on the scripted server")
            })
            .with_state(Arc::clone(&shared));
        let server = crate::loopback::Loopback::serve("scripted-llm", app);
        ScriptedLlmServer { dialect, addr: server.addr, shared, _server: server }
    }

    /// The `baseUrl` to configure: `http://127.0.0.1:PORT/v1` for OpenAI,
    /// `http://127.0.0.1:PORT` for Anthropic.
    pub fn base_url(&self) -> String {
        match self.dialect {
            Dialect::OpenAi => format!("http://{}/v1", self.addr),
            Dialect::Anthropic => format!("http://{}", self.addr),
        }
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.state().requests.clone()
    }

    /// The headers of every request received, in order, by lowercase name.
    pub fn request_headers(&self) -> Vec<BTreeMap<String, String>> {
        self.shared.state().headers.clone()
    }

    /// Appends `steps` to what is left of the script.
    pub fn push_steps(&self, steps: impl IntoIterator<Item = ScriptStep>) {
        self.shared.state().script.extend(steps);
    }

    /// How many steps of the script are left.
    pub fn remaining_steps(&self) -> usize {
        self.shared.state().script.len()
    }
}

/// Records the request and answers it with the next step.
async fn answer(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let request = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let step = {
        let mut state = shared.state();
        state.requests.push(request.clone());
        let headers = headers
            .iter()
            .map(|(name, value)| {
                (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned())
            })
            .collect();
        state.headers.push(headers);
        match state.script.pop_front() {
            Some(step) => {
                state.answered += 1;
                step
            }
            None => {
                let message = format!("script exhausted after {} requests", state.answered);
                return error_response(StatusCode::INTERNAL_SERVER_ERROR, &message);
            }
        }
    };
    let mut step = step;
    // A request for a stream gets one, as the real APIs answer it.
    let mut stream = Streamed {
        asked: request.get("stream") == Some(&Value::Bool(true)),
        held: None,
        broken: false,
    };
    let answer = |text, calls, stream: &Streamed| {
        let answer = render(&shared, text, calls, &request, body.len());
        if stream.asked {
            stream.respond(shared.dialect, &answer)
        } else {
            json_response(StatusCode::OK, answer.to_string())
        }
    };
    loop {
        step = match step {
            ScriptStep::Delay(delay, next) => {
                tokio::time::sleep(delay).await;
                *next
            }
            // Called without the lock held: the callback is the test's code.
            ScriptStep::Callback(callback) => callback(&request),
            ScriptStep::Whole(next) => {
                stream.asked = false;
                *next
            }
            ScriptStep::Held(notify, next) => {
                stream.held = Some(notify);
                *next
            }
            ScriptStep::BrokenOff(next) => {
                stream.broken = true;
                *next
            }
            ScriptStep::StreamError { kind, message } => {
                return stream_error(shared.dialect, &kind, &message);
            }
            ScriptStep::Text(text) => return answer(Some(text), Vec::new(), &stream),
            ScriptStep::ToolCalls(calls) => return answer(None, raw_calls(calls), &stream),
            ScriptStep::TextAndToolCalls(text, calls) => {
                return answer(Some(text), raw_calls(calls), &stream);
            }
            ScriptStep::RawToolCall { name, raw_arguments } => {
                return answer(None, vec![(name, raw_arguments)], &stream);
            }
            ScriptStep::Status { status, body, retry_after } => {
                return status_response(status, body, retry_after);
            }
            ScriptStep::Raw(body) => return json_response(StatusCode::OK, body),
        };
    }
}

/// An error response as scripted.
fn status_response(status: u16, body: String, retry_after: Option<String>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut headers = HeaderMap::new();
    let kind = if serde_json::from_str::<Value>(&body).is_ok() {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    if let Some(value) = retry_after.and_then(|v| HeaderValue::from_str(&v).ok()) {
        headers.insert(header::RETRY_AFTER, value);
    }
    (status, headers, body).into_response()
}

/// An answer of `text` and `calls` (name, arguments as text) in the dialect's format.
fn render(
    shared: &Shared,
    text: Option<String>,
    calls: Vec<(String, String)>,
    request: &Value,
    request_len: usize,
) -> Value {
    let ids: Vec<String> = {
        let mut state = shared.state();
        calls
            .iter()
            .map(|_| {
                state.last_call += 1;
                format!("call_{}", state.last_call)
            })
            .collect()
    };
    let model = request.get("model").and_then(Value::as_str).unwrap_or("scripted");
    let input_tokens = request_len / 4;
    match shared.dialect {
        Dialect::OpenAi => {
            let tool_calls: Vec<Value> = calls
                .iter()
                .zip(&ids)
                .map(|((name, arguments), id)| {
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
                })
                .collect();
            let mut message = json!({"role": "assistant", "content": text});
            if !tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(tool_calls);
            }
            let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
            json!({
                "id": format!("chatcmpl-{}", ids.first().map_or("text", String::as_str)),
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
                "usage": {"prompt_tokens": input_tokens, "completion_tokens": 10, "total_tokens": input_tokens + 10},
            })
        }
        Dialect::Anthropic => {
            let mut content = Vec::new();
            if let Some(text) = text {
                content.push(json!({"type": "text", "text": text}));
            }
            for ((name, arguments), id) in calls.iter().zip(&ids) {
                let input = serde_json::from_str::<Value>(arguments)
                    .unwrap_or_else(|_| Value::String(arguments.clone()));
                content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
            }
            let stop = if calls.is_empty() { "end_turn" } else { "tool_use" };
            json!({
                "id": "msg_scripted",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": stop,
                "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": 10},
            })
        }
    }
}

/// How a streamed answer is sent.
struct Streamed {
    /// The request asked for a stream, and the script did not refuse it.
    asked: bool,
    /// Wait for this after the first event with content.
    held: Option<Arc<tokio::sync::Notify>>,
    /// Drop the connection after the first event with content.
    broken: bool,
}

impl Streamed {
    /// `answer` (the API's non-streamed form) as the events the API streams it in: text
    /// a word at a time, arguments a few characters at a time.
    fn respond(&self, dialect: Dialect, answer: &Value) -> Response {
        let events = match dialect {
            Dialect::OpenAi => openai_events(answer),
            Dialect::Anthropic => anthropic_events(answer),
        };
        let first_content = events.iter().position(|(_, content)| *content);
        let held = self.held.clone();
        let broken = self.broken;
        let events: Vec<String> = events.into_iter().map(|(event, _)| event).collect();
        let stream = futures::stream::unfold(0usize, move |at| {
            let held = held.clone();
            let event = events.get(at).cloned();
            async move {
                let event = event?;
                if at > 0 && Some(at - 1) == first_content {
                    if broken {
                        // After the first event has left: the connection drops mid-answer.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let error = std::io::Error::other("the scripted stream broke off");
                        return Some((Err(error), usize::MAX - 1));
                    }
                    if let Some(held) = held {
                        held.notified().await;
                    }
                }
                Some((Ok::<_, std::io::Error>(event), at + 1))
            }
        });
        let headers = [(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"))];
        (StatusCode::OK, headers, axum::body::Body::from_stream(stream)).into_response()
    }
}

/// Pieces of `text` of about `size` characters.
fn pieces(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(size.max(1)).map(|c| c.iter().collect()).collect()
}

/// A chat completion as its stream of chunks, each with whether it carries content.
fn openai_events(answer: &Value) -> Vec<(String, bool)> {
    let base = json!({"id": answer["id"], "object": "chat.completion.chunk", "created": 0, "model": answer["model"]});
    let chunk = |choices: Value| {
        let mut chunk = base.clone();
        chunk["choices"] = choices;
        format!("data: {chunk}\n\n")
    };
    let message = &answer["choices"][0]["message"];
    let mut events = vec![(
        chunk(
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
        ),
        false,
    )];
    if let Some(text) = message["content"].as_str() {
        for word in text.split_inclusive(' ') {
            events.push((
                chunk(json!([{"index": 0, "delta": {"content": word}, "finish_reason": null}])),
                true,
            ));
        }
    }
    for (index, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
        let start = json!([{"index": 0, "delta": {"tool_calls": [{
            "index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }]}, "finish_reason": null}]);
        events.push((chunk(start), false));
        for piece in pieces(call["function"]["arguments"].as_str().unwrap_or_default(), 5) {
            let more = json!([{"index": 0, "delta": {"tool_calls": [{
                "index": index, "function": {"arguments": piece},
            }]}, "finish_reason": null}]);
            events.push((chunk(more), true));
        }
    }
    let finish = &answer["choices"][0]["finish_reason"];
    events.push((chunk(json!([{"index": 0, "delta": {}, "finish_reason": finish}])), false));
    let mut usage = base.clone();
    usage["choices"] = json!([]);
    usage["usage"] = answer["usage"].clone();
    events.push((format!("data: {usage}\n\n"), false));
    events.push(("data: [DONE]\n\n".to_owned(), false));
    events
}

/// A message as its stream of events, each with whether it carries content.
fn anthropic_events(answer: &Value) -> Vec<(String, bool)> {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut start = answer.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    let mut events = vec![
        (event("message_start", json!({"type": "message_start", "message": start})), false),
        ("event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned(), false),
    ];
    for (index, block) in answer["content"].as_array().into_iter().flatten().enumerate() {
        let (opening, deltas) = if block["type"] == "tool_use" {
            let input = match &block["input"] {
                Value::String(raw) => raw.clone(),
                input => input.to_string(),
            };
            let deltas: Vec<Value> = pieces(&input, 5)
                .into_iter()
                .map(|piece| json!({"type": "input_json_delta", "partial_json": piece}))
                .collect();
            (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                deltas,
            )
        } else {
            let text = block["text"].as_str().unwrap_or_default();
            let deltas: Vec<Value> = text
                .split_inclusive(' ')
                .map(|word| json!({"type": "text_delta", "text": word}))
                .collect();
            (json!({"type": "text", "text": ""}), deltas)
        };
        let opening =
            json!({"type": "content_block_start", "index": index, "content_block": opening});
        events.push((event("content_block_start", opening), false));
        for delta in deltas {
            let delta = json!({"type": "content_block_delta", "index": index, "delta": delta});
            events.push((event("content_block_delta", delta), true));
        }
        let stop = json!({"type": "content_block_stop", "index": index});
        events.push((event("content_block_stop", stop), false));
    }
    let delta = json!({
        "type": "message_delta",
        "delta": {"stop_reason": answer["stop_reason"], "stop_sequence": null},
        "usage": {"output_tokens": answer["usage"]["output_tokens"]},
    });
    events.push((event("message_delta", delta), false));
    events.push((event("message_stop", json!({"type": "message_stop"})), false));
    events
}

/// A stream that starts and then reports an error of `kind` in the dialect's form.
fn stream_error(dialect: Dialect, kind: &str, message: &str) -> Response {
    let body = match dialect {
        Dialect::OpenAi => {
            let start = json!({"id": "chatcmpl-error", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Par"}, "finish_reason": null}]});
            let error = json!({"error": {"message": message, "type": kind}});
            format!("data: {start}\n\ndata: {error}\n\n")
        }
        Dialect::Anthropic => {
            let start = json!({"type": "message_start", "message": {"id": "msg_error", "type": "message", "role": "assistant", "model": "scripted", "content": [], "usage": {"input_tokens": 1, "output_tokens": 1}}});
            let error = json!({"type": "error", "error": {"type": kind, "message": message}});
            format!("event: message_start\ndata: {start}\n\nevent: error\ndata: {error}\n\n")
        }
    };
    let headers = [(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"))];
    (StatusCode::OK, headers, body).into_response()
}

/// Calls with their arguments as JSON text.
fn raw_calls(calls: Vec<ScriptedCall>) -> Vec<(String, String)> {
    calls.into_iter().map(|(name, arguments)| (name, arguments.to_string())).collect()
}

fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body)
        .into_response()
}

/// An error in the shape both APIs use.
fn error_response(status: StatusCode, message: &str) -> Response {
    let body = json!({"type": "error", "error": {"type": "api_error", "message": message}});
    json_response(status, body.to_string())
}
