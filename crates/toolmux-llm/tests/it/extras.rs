//! What an API attaches to a tool call besides its name and arguments goes back with the
//! call: Gemini's compatible API refuses the request after a turn of calls (HTTP 400)
//! unless each call it signed carries its thought signature back, whole or streamed, and
//! through a conversation saved and read again (a paused run's transcript).

use super::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The thought signatures the mock gives its two calls: the first in the call's first
/// part, the second (streamed) in a part after its arguments.
const FIRST: &str = "CiQBVKhc7gxJ4ZnLmOS8AaB1c2Vk/first==";
const SECOND: &str = "CiQBVKhc7gxJ4ZnLmOS8AaB1c2Vk/second==";

fn signature(text: &str) -> Value {
    json!({"google": {"thought_signature": text}})
}

/// A loopback server that answers as Gemini's OpenAI-compatible API does: the first
/// request gets two signed calls, and a request whose history brings a call back
/// without its signature is refused with Gemini's 400; whole, or as a stream when asked.
struct GeminiLike {
    addr: std::net::SocketAddr,
    requests: Arc<Mutex<Vec<Value>>>,
    stop: Arc<AtomicBool>,
}

impl GeminiLike {
    fn start() -> GeminiLike {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (recorded, stopped) = (requests.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    serve_one(stream, &recorded);
                }
            }
        });
        GeminiLike { addr, requests, stop }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1beta/openai", self.addr)
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for GeminiLike {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Reads one request off `stream` and answers it.
fn serve_one(mut stream: TcpStream, recorded: &Mutex<Vec<Value>>) {
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut bytes = Vec::new();
    let mut buffer = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => bytes.extend_from_slice(&buffer[..n]),
        }
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    while bytes.len() < head_end + length {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => bytes.extend_from_slice(&buffer[..n]),
        }
    }
    let request: Value = serde_json::from_slice(&bytes[head_end..head_end + length]).unwrap();
    recorded.lock().unwrap().push(request.clone());
    let (status, kind, body) = gemini(&request);
    let reason = if status == 200 { "OK" } else { "Bad Request" };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes());
}

/// Gemini's answer to `request`: its status, content type and body.
fn gemini(request: &Value) -> (u16, &'static str, String) {
    let messages = request["messages"].as_array().unwrap();
    let streamed = request["stream"] == json!(true);
    let answered = messages.iter().any(|m| m["role"] == "tool");
    if !answered {
        return if streamed {
            (200, "text/event-stream", signed_calls_streamed())
        } else {
            (200, "application/json", signed_calls_whole().to_string())
        };
    }
    // Every call of the history must carry back what the API gave it.
    let expected = [("call-1", signature(FIRST)), ("call-2", signature(SECOND))];
    for message in messages.iter().filter(|m| m["role"] == "assistant") {
        for (position, call) in message["tool_calls"].as_array().into_iter().flatten().enumerate() {
            let wanted = expected.iter().find(|(id, _)| call["id"] == *id).map(|(_, s)| s);
            if wanted.is_some_and(|wanted| call.get("extra_content") != Some(wanted)) {
                let message = format!(
                    "Function call is missing a thought_signature in functionCall parts. This \
                     is required for tools to work correctly, and missing thought_signature may \
                     lead to degraded model performance. Additional data, function call \
                     `default_api:{}` , position {}.",
                    call["function"]["name"].as_str().unwrap_or_default(),
                    position + 1,
                );
                let error = json!([{"error": {
                    "code": 400, "message": message, "status": "INVALID_ARGUMENT",
                }}]);
                return (400, "application/json", error.to_string());
            }
        }
    }
    if streamed {
        let chunk = json!({"model": "gemini-3-pro-preview", "choices": [{"index": 0,
            "delta": {"role": "assistant", "content": "Both read."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 3}});
        (200, "text/event-stream", format!("data: {chunk}\n\ndata: [DONE]\n\n"))
    } else {
        let answer = json!({"model": "gemini-3-pro-preview", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "Both read."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 3}});
        (200, "application/json", answer.to_string())
    }
}

fn signed_calls_whole() -> Value {
    json!({
        "model": "gemini-3-pro-preview",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant",
            "tool_calls": [
                {"id": "call-1", "type": "function", "extra_content": signature(FIRST),
                 "function": {"name": "fs__read", "arguments": "{\"path\":\"README.md\"}"}},
                {"id": "call-2", "type": "function", "extra_content": signature(SECOND),
                 "function": {"name": "fs__read", "arguments": "{\"path\":\"NOTES.md\"}"}},
            ],
        }}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 12},
    })
}

/// [`signed_calls_whole`] as a stream: the first call whole in one part with its
/// signature (as Gemini streams a call), the second over three parts, its signature in
/// the last, after its arguments.
fn signed_calls_streamed() -> String {
    let part = |call: Value| {
        json!({"model": "gemini-3-pro-preview", "choices": [{"index": 0,
            "delta": {"role": "assistant", "tool_calls": [call]}, "finish_reason": null}]})
    };
    let chunks = [
        part(json!({"index": 0, "id": "call-1", "type": "function",
            "extra_content": signature(FIRST),
            "function": {"name": "fs__read", "arguments": "{\"path\":\"README.md\"}"}})),
        part(json!({"index": 1, "id": "call-2", "type": "function",
            "function": {"name": "fs__read", "arguments": "{\"path\":"}})),
        part(json!({"index": 1, "function": {"arguments": "\"NOTES.md\"}"}})),
        part(json!({"index": 1, "extra_content": signature(SECOND)})),
        json!({"model": "gemini-3-pro-preview",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 12}}),
    ];
    let mut body: String = chunks.iter().map(|chunk| format!("data: {chunk}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

fn gemini_model(server: &GeminiLike) -> Arc<dyn Model> {
    let mut config = config(Dialect::OpenAi, server.base_url());
    config.model = "gemini-3-pro-preview".into();
    toolmux_llm::connect("gemini", &config).unwrap()
}

/// The first request, the model's calls answered, and the conversation saved and read
/// back (as a paused run's transcript is) for the next request.
fn next_request(first: &ModelRequest, answer: &ModelResponse) -> ModelRequest {
    let mut messages = first.messages.clone();
    messages.push(answer.to_message());
    let results = answer.tool_calls.iter().map(|c| result(&c.id, "text", false)).collect();
    messages.push(Message::Tool { results });
    let saved = serde_json::to_string(&messages).unwrap();
    ModelRequest::new(serde_json::from_str(&saved).unwrap())
}

/// Both calls of the answer with their signatures, and the signatures as the next request
/// sent them.
fn check_signatures(answer: &ModelResponse, server: &GeminiLike) {
    let extras: Vec<_> = answer.tool_calls.iter().map(|c| c.extra.clone()).collect();
    assert_eq!(extras, [Some(signature(FIRST)), Some(signature(SECOND))]);
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let calls = &requests[1]["messages"][1]["tool_calls"];
    assert_eq!(calls[0]["extra_content"], signature(FIRST), "{calls}");
    assert_eq!(calls[1]["extra_content"], signature(SECOND), "{calls}");
}

#[tokio::test]
async fn gemini_gets_its_thought_signatures_back_with_its_calls() {
    let server = GeminiLike::start();
    let model = gemini_model(&server);
    let first = ModelRequest::new(vec![Message::user("Read both")]);
    let answer = complete(&model, &first).await;
    assert_eq!(answer.tool_calls.len(), 2);
    let next = model.complete(&next_request(&first, &answer), &CancellationToken::new()).await;
    let next = next.unwrap_or_else(|e| panic!("the signed calls went back unsigned: {e}"));
    assert_eq!(next.content, "Both read.");
    check_signatures(&answer, &server);
}

#[tokio::test]
async fn gemini_gets_its_streamed_thought_signatures_back_with_its_calls() {
    let server = GeminiLike::start();
    let model = gemini_model(&server);
    let first = ModelRequest::new(vec![Message::user("Read both")]);
    let cancel = CancellationToken::new();
    let answer = model.complete_streaming(&first, &cancel, &|_| {}).await.unwrap();
    assert_eq!(answer.tool_calls.len(), 2);
    assert_eq!(answer.tool_calls[1].arguments, json!({"path": "NOTES.md"}));
    let next = next_request(&first, &answer);
    let next = model.complete_streaming(&next, &cancel, &|_| {}).await;
    let next = next.unwrap_or_else(|e| panic!("the signed calls went back unsigned: {e}"));
    assert_eq!(next.content, "Both read.");
    check_signatures(&answer, &server);
}

#[tokio::test]
async fn calls_without_extras_go_as_before() {
    let (server, model) = serve(Dialect::OpenAi, vec![ScriptStep::text("ok")]);
    complete(&model, &conversation()).await;
    let sent = only_request(&server).to_string();
    assert!(!sent.contains("extra"), "{sent}");
}

#[tokio::test]
async fn anthropic_is_never_sent_another_api_s_extras() {
    // A conversation begun with Gemini and carried on with Claude: the messages API
    // refuses members it does not know.
    let mut request = conversation();
    for message in &mut request.messages {
        if let Message::Assistant { tool_calls, .. } = message {
            for call in tool_calls {
                call.extra = Some(signature(FIRST));
            }
        }
    }
    let (server, model) = serve(Dialect::Anthropic, vec![ScriptStep::text("ok")]);
    complete(&model, &request).await;
    let sent = only_request(&server).to_string();
    assert!(!sent.contains("extra") && !sent.contains(FIRST), "{sent}");
    assert!(sent.contains("tool_use"), "{sent}");
}

/// A conversation begun with Gemini's compatible API and carried on with another
/// OpenAI-compatible model (another server): the calls go without Gemini's
/// `extra_content`, which is Gemini's alone; the same conversation back at Gemini still
/// carries it, saved and read back on the way.
#[tokio::test]
async fn another_chat_completions_api_is_never_sent_geminis_extras() {
    let gemini = GeminiLike::start();
    let model = gemini_model(&gemini);
    let first = ModelRequest::new(vec![Message::user("Read both")]);
    let answer = complete(&model, &first).await;
    let origin = answer.tool_calls[0].extra_origin.clone().unwrap();
    assert!(origin.starts_with(&gemini.base_url()), "{origin}");
    let next = next_request(&first, &answer);

    let (other, other_model) = serve(Dialect::OpenAi, vec![ScriptStep::text("ok")]);
    complete(&other_model, &next).await;
    let sent = only_request(&other);
    let calls = &sent["messages"][1]["tool_calls"];
    assert_eq!(calls.as_array().map(Vec::len), Some(2), "{sent}");
    let text = sent.to_string();
    assert!(!text.contains("extra") && !text.contains(FIRST), "{text}");

    // Back at Gemini, the same saved conversation is answered.
    let back = model.complete(&next, &CancellationToken::new()).await;
    assert_eq!(back.unwrap().content, "Both read.");
    check_signatures(&answer, &gemini);
}

/// A call whose `extra` names no origin (set by hand, or saved before calls kept one) is
/// sent without it: no API can be told to be the one that gave it.
#[tokio::test]
async fn extras_of_no_known_origin_are_sent_nowhere() {
    let mut request = conversation();
    for message in &mut request.messages {
        if let Message::Assistant { tool_calls, .. } = message {
            for call in tool_calls {
                call.extra = Some(signature(FIRST));
            }
        }
    }
    let (server, model) = serve(Dialect::OpenAi, vec![ScriptStep::text("ok")]);
    complete(&model, &request).await;
    let sent = only_request(&server).to_string();
    assert!(sent.contains("tool_calls") && !sent.contains(FIRST), "{sent}");
}

/// What DeepSeek's thinking mode reasoned before its call.
const THOUGHT: &str = "The user wants the README; fs__read takes a path.";

/// A loopback server answering as DeepSeek's thinking mode does: a call with the reasoning
/// that led to it, then, once the call is answered, a refusal (DeepSeek's 400) unless the
/// assistant turn of the call comes back with that reasoning.
fn deepseek_like() -> (ScriptedLlmServer, Arc<dyn Model>) {
    let call = ScriptStep::Raw(
        json!({
            "model": "deepseek-reasoner",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "", "reasoning_content": THOUGHT,
                "tool_calls": [{"id": "call_00_a1", "type": "function",
                    "function": {"name": "fs__read", "arguments": "{\"path\":\"README.md\"}"}}],
            }}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 20},
        })
        .to_string(),
    );
    let answer = ScriptStep::callback(|request| {
        let turn = request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .position(|m| m["role"] == "assistant" && m["reasoning_content"] != json!(THOUGHT));
        match turn {
            Some(index) => ScriptStep::status(
                400,
                json!({"error": {"message": format!(
                    "Missing `reasoning_content` field in the assistant message at message \
                     index {index}"
                ), "type": "invalid_request_error", "code": "invalid_request_error"}})
                .to_string(),
            ),
            None => ScriptStep::text("It is toolmux's README."),
        }
    });
    serve_with(Dialect::OpenAi, vec![call, answer], |c| c.model = "deepseek-reasoner".into())
}

/// DeepSeek's and Kimi's thinking modes refuse the request after a turn of calls whose
/// assistant message comes back without its `reasoning_content`; the reasoning is kept
/// with the answer (through a saved conversation too) and goes back to that API, never into
/// the answer's text, and never to another API.
#[tokio::test]
async fn reasoning_goes_back_with_the_calls_it_led_to() {
    let (server, model) = deepseek_like();
    let first = ModelRequest::new(vec![Message::user("Read the README")]);
    let answer = complete(&model, &first).await;
    assert_eq!(answer.content, "");
    assert_eq!(answer.reasoning.as_ref().map(|r| r.text.as_str()), Some(THOUGHT));
    let next = next_request(&first, &answer);
    let back = model.complete(&next, &CancellationToken::new()).await;
    let back = back.unwrap_or_else(|e| panic!("the reasoning did not go back: {e}"));
    assert_eq!(back.content, "It is toolmux's README.");
    assert_eq!(server.requests()[1]["messages"][1]["reasoning_content"], THOUGHT);

    // Carried on with another model, the conversation goes without it.
    for dialect in DIALECTS {
        let (other, other_model) = serve(dialect, vec![ScriptStep::text("ok")]);
        complete(&other_model, &next).await;
        let sent = only_request(&other).to_string();
        assert!(sent.contains("README.md") && !sent.contains(THOUGHT), "{dialect:?}: {sent}");
    }
}
