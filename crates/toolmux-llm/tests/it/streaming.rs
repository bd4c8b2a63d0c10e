//! Streamed answers, for both APIs: the deltas as they arrive, the answer they add up to
//! (the same as the answer in one piece), and a stream that breaks off, reports an error,
//! is cancelled, or is not a stream at all; a chat completions API that refuses
//! `stream_options`.

use super::*;
use std::sync::Mutex;
use std::time::Duration;
use toolmux_llm::{ModelDelta, StopReason};

/// A delta as received, owned.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Seen {
    Text(String),
    Call(usize, String, String),
    Arguments(usize, String),
    Restart,
}

/// Records every delta of a completion.
#[derive(Default)]
pub(super) struct Recorder {
    seen: Mutex<Vec<Seen>>,
}

/// The calls among recorded deltas, in order: index, id and tool name.
pub(super) fn calls(seen: &[Seen]) -> Vec<(usize, &str, &str)> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Call(index, id, name) => Some((*index, id.as_str(), name.as_str())),
            _ => None,
        })
        .collect()
}

impl Recorder {
    pub(super) fn take(&self, delta: ModelDelta<'_>) {
        let seen = match delta {
            ModelDelta::Text(text) => Seen::Text(text.to_owned()),
            ModelDelta::ToolCall { index, id, name } => {
                Seen::Call(index, id.to_owned(), name.to_owned())
            }
            ModelDelta::ToolArguments { index, fragment } => {
                Seen::Arguments(index, fragment.to_owned())
            }
            ModelDelta::Restart => Seen::Restart,
            other => panic!("a delta this test does not know: {other:?}"),
        };
        self.seen.lock().unwrap().push(seen);
    }

    pub(super) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The text the deltas add up to, after the last restart.
    pub(super) fn text(&self) -> String {
        let seen = self.seen();
        let start = seen.iter().rposition(|s| *s == Seen::Restart).map_or(0, |i| i + 1);
        seen[start..]
            .iter()
            .filter_map(|s| match s {
                Seen::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Call `index`'s arguments as the deltas add them up.
    pub(super) fn arguments(&self, index: usize) -> String {
        self.seen()
            .iter()
            .filter_map(|s| match s {
                Seen::Arguments(i, fragment) if *i == index => Some(fragment.as_str()),
                _ => None,
            })
            .collect()
    }
}

async fn stream(
    model: &Arc<dyn Model>,
    request: &ModelRequest,
    recorder: &Recorder,
) -> Result<ModelResponse, ModelError> {
    model.complete_streaming(request, &CancellationToken::new(), &|d| recorder.take(d)).await
}

fn two_calls() -> ScriptStep {
    ScriptStep::TextAndToolCalls(
        "Let me look at the files first".into(),
        vec![
            ("fs__read".into(), json!({"path": "README.md", "limit": 40})),
            ("fs__grep".into(), json!({"pattern": "TODO|FIXME", "glob": "*.rs"})),
        ],
    )
}

#[tokio::test]
async fn a_streamed_answer_arrives_in_pieces_and_adds_up_to_the_whole_answer() {
    for dialect in DIALECTS {
        let (server, model) = serve(dialect, vec![two_calls()]);
        let recorder = Recorder::default();
        let streamed = stream(&model, &hello(), &recorder).await.unwrap();
        let (_whole_server, whole_model) = serve(dialect, vec![two_calls()]);
        let mut whole = complete(&whole_model, &hello()).await;
        // The scripted server counts a quarter of the request's bytes as its input tokens,
        // and the streamed request says `stream` besides.
        assert!(streamed.usage.input_tokens > whole.usage.input_tokens);
        whole.usage.input_tokens = streamed.usage.input_tokens;
        assert_eq!(streamed, whole, "{dialect:?}");
        assert_eq!(streamed.content, "Let me look at the files first");
        assert_eq!(streamed.stop, StopReason::ToolUse);
        assert_eq!(streamed.usage.output_tokens, 10, "{dialect:?}");
        assert!(streamed.usage.input_tokens > 0, "{dialect:?}");
        assert_eq!(streamed.model, "test-model");

        let sent = only_request(&server);
        assert_eq!(sent["stream"], json!(true), "{dialect:?}");
        if dialect == Dialect::OpenAi {
            assert_eq!(sent["stream_options"], json!({"include_usage": true}));
        }
        let seen = recorder.seen();
        let texts = seen.iter().filter(|s| matches!(s, Seen::Text(_))).count();
        assert!(texts > 3, "the text came in one piece: {seen:?}");
        assert_eq!(recorder.text(), streamed.content);
        assert_eq!(
            calls(&seen),
            [
                (0, streamed.tool_calls[0].id.as_str(), "fs__read"),
                (1, streamed.tool_calls[1].id.as_str(), "fs__grep"),
            ],
            "{dialect:?}"
        );
        for (index, call) in streamed.tool_calls.iter().enumerate() {
            let fragments =
                seen.iter().filter(|s| matches!(s, Seen::Arguments(i, _) if *i == index)).count();
            assert!(fragments > 2, "the arguments came in one piece: {seen:?}");
            let arguments: Value = serde_json::from_str(&recorder.arguments(index)).unwrap();
            assert_eq!(arguments, call.arguments, "{dialect:?}");
        }
        // Each call is announced before its arguments.
        let first_call = seen.iter().position(|s| matches!(s, Seen::Call(0, ..))).unwrap();
        let first_arguments = seen.iter().position(|s| matches!(s, Seen::Arguments(0, _))).unwrap();
        assert!(first_call < first_arguments, "{seen:?}");
    }
}

#[tokio::test]
async fn the_first_delta_arrives_while_the_answer_is_still_being_written() {
    for dialect in DIALECTS {
        // The server sends the first words, then waits until the client has them: a client
        // that handed out nothing before the end would wait forever.
        let held = Arc::new(tokio::sync::Notify::new());
        let script =
            ScriptStep::Held(held.clone(), Box::new(ScriptStep::text("one two three four five")));
        let (_server, model) = serve(dialect, vec![script]);
        let request = hello();
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            model.complete_streaming(&request, &CancellationToken::new(), &|delta| {
                if matches!(delta, ModelDelta::Text(_)) {
                    held.notify_one();
                }
            }),
        )
        .await
        .expect("the first words were handed out before the answer ended")
        .unwrap();
        assert_eq!(answer.content, "one two three four five", "{dialect:?}");
    }
}

#[tokio::test]
async fn a_stream_that_breaks_off_is_tried_again_from_the_start() {
    for dialect in DIALECTS {
        let script = vec![
            ScriptStep::BrokenOff(Box::new(ScriptStep::text("the first try breaks"))),
            ScriptStep::text("the second try is whole"),
        ];
        let (server, model) = serve(dialect, script);
        let recorder = Recorder::default();
        let answer = stream(&model, &hello(), &recorder).await.unwrap();
        assert_eq!(answer.content, "the second try is whole", "{dialect:?}");
        assert_eq!(server.requests().len(), 2);
        let seen = recorder.seen();
        let restart = seen.iter().position(|s| *s == Seen::Restart).expect("a restart");
        assert!(
            seen[..restart].iter().any(|s| matches!(s, Seen::Text(_))),
            "nothing before the restart: {seen:?}"
        );
        assert_eq!(seen.iter().filter(|s| **s == Seen::Restart).count(), 1);
        assert_eq!(recorder.text(), "the second try is whole");
    }
}

#[tokio::test]
async fn an_error_inside_the_stream_is_retried_or_reported_as_the_api_s() {
    let retried = [(Dialect::OpenAi, "server_error"), (Dialect::Anthropic, "overloaded_error")];
    for (dialect, kind) in retried {
        let script = vec![
            ScriptStep::StreamError { kind: kind.into(), message: "Overloaded".into() },
            ScriptStep::text("ok"),
        ];
        let (server, model) = serve(dialect, script);
        let recorder = Recorder::default();
        let answer = stream(&model, &hello(), &recorder).await.unwrap();
        assert_eq!(answer.content, "ok", "{dialect:?}");
        assert_eq!(server.requests().len(), 2);
        assert!(recorder.seen().contains(&Seen::Restart), "{:?}", recorder.seen());
        assert_eq!(recorder.text(), "ok");
    }
    for dialect in DIALECTS {
        let message = format!("prompt is too long (key {KEY})");
        let script = vec![ScriptStep::StreamError {
            kind: "invalid_request_error".into(),
            message: message.clone(),
        }];
        let (server, model) = serve(dialect, script);
        let error = stream(&model, &hello(), &Recorder::default()).await.unwrap_err();
        assert_key_absent(&error);
        match &error {
            ModelError::StreamFailed { kind, status: 400, message, .. } => {
                assert_eq!(kind, "invalid_request_error");
                assert!(message.contains("prompt is too long"), "{message}");
            }
            other => panic!("{dialect:?}: {other:?}"),
        }
        // Read as the refusal of a request over the context window it is.
        assert!(error.context_overflow().is_some(), "{error:?}");
        assert_eq!(server.requests().len(), 1, "a refused request is not tried again");
    }
}

/// An error the API reports inside a streamed answer (its HTTP status was 200: Anthropic's
/// `event: error`, a chat completions `data:` line of `{"error": …}`) is said as such, with
/// the API's kind and message, where it read as "HTTP 500" or "HTTP 529"; it is retried as
/// the status its kind stands for is (overloaded, rate limited, failing servers), and
/// not otherwise.
#[tokio::test]
async fn an_error_inside_the_stream_is_said_to_be_one_after_its_retries() {
    let cases = [
        (Dialect::Anthropic, "overloaded_error", true),
        (Dialect::Anthropic, "rate_limit_error", true),
        (Dialect::Anthropic, "api_error", true),
        (Dialect::Anthropic, "timeout_error", true),
        (Dialect::Anthropic, "billing_error", false),
        (Dialect::Anthropic, "permission_error", false),
        (Dialect::OpenAi, "overloaded_error", true),
        (Dialect::OpenAi, "rate_limit_exceeded", true),
        (Dialect::OpenAi, "server_error", true),
        (Dialect::OpenAi, "invalid_request_error", false),
        // Final by their kind, though the message ("Overloaded") holds no quota word.
        (Dialect::OpenAi, "insufficient_quota", false),
        (Dialect::OpenAi, "billing_hard_limit_reached", false),
        (Dialect::Anthropic, "insufficient_quota", false),
    ];
    for (dialect, kind, retried) in cases {
        let failing = ScriptStep::StreamError { kind: kind.into(), message: "Overloaded".into() };
        let (server, model) =
            serve_with(dialect, vec![failing.clone(), failing], |c| c.max_retries = Some(1));
        let error = stream(&model, &hello(), &Recorder::default()).await.unwrap_err();
        assert_key_absent(&error);
        let case = format!("{dialect:?} {kind}");
        assert_eq!(server.requests().len(), if retried { 2 } else { 1 }, "{case}");
        assert_eq!(error.is_transient(), retried, "{case}: {error:?}");
        let message = error.to_string();
        assert!(
            message.contains(&format!("`{kind}` inside its streamed answer: Overloaded")),
            "{case}: {message}"
        );
        assert!(!message.contains("HTTP"), "{case}: {message}");
    }
}

#[tokio::test]
async fn a_server_that_answers_in_one_piece_is_read_as_such() {
    for dialect in DIALECTS {
        let (server, model) = serve(dialect, vec![ScriptStep::Whole(Box::new(two_calls()))]);
        let recorder = Recorder::default();
        let answer = stream(&model, &hello(), &recorder).await.unwrap();
        assert_eq!(only_request(&server)["stream"], json!(true));
        assert_eq!(answer.tool_calls.len(), 2, "{dialect:?}");
        // The whole answer, handed out as deltas all the same.
        let seen = recorder.seen();
        assert_eq!(seen[0], Seen::Text("Let me look at the files first".into()));
        assert_eq!(seen[1], Seen::Call(0, answer.tool_calls[0].id.clone(), "fs__read".into()));
        let arguments: Value = serde_json::from_str(&recorder.arguments(1)).unwrap();
        assert_eq!(arguments, answer.tool_calls[1].arguments);
    }
}

#[tokio::test]
async fn a_model_configured_not_to_stream_is_asked_for_the_whole_answer() {
    for dialect in DIALECTS {
        let (server, model) = serve_with(dialect, vec![two_calls()], |c| c.stream = Some(false));
        let recorder = Recorder::default();
        let answer = stream(&model, &hello(), &recorder).await.unwrap();
        let sent = only_request(&server);
        assert!(sent.get("stream").is_none(), "{sent}");
        assert!(sent.get("stream_options").is_none(), "{sent}");
        assert_eq!(recorder.text(), answer.content);
        assert_eq!(recorder.seen().len(), 1 + 2 * 2, "{:?}", recorder.seen());
    }
}

#[tokio::test]
async fn cancelling_ends_a_stream_midway() {
    for dialect in DIALECTS {
        // Held forever after the first words: only the cancellation ends the wait.
        let held = Arc::new(tokio::sync::Notify::new());
        let script = ScriptStep::Held(held, Box::new(ScriptStep::text("never finished words")));
        let (_server, model) = serve(dialect, vec![script]);
        let cancel = CancellationToken::new();
        let request = hello();
        let error = tokio::time::timeout(
            Duration::from_secs(20),
            model.complete_streaming(&request, &cancel, &|_| cancel.cancel()),
        )
        .await
        .expect("cancelling ends the stream")
        .unwrap_err();
        assert!(matches!(error, ModelError::Cancelled { .. }), "{dialect:?}: {error:?}");
    }
}

/// A streamed answer is timed by its parts: one still arriving when `timeoutMs` has passed
/// since the request is not cut (it was, and reported as no answer), one that stops coming
/// for `timeoutMs` ends with a timeout.
#[tokio::test]
async fn a_stream_is_timed_by_the_gaps_between_its_parts() {
    for dialect in DIALECTS {
        let held = Arc::new(tokio::sync::Notify::new());
        let script = ScriptStep::delay(
            Duration::from_millis(300),
            ScriptStep::Held(held.clone(), Box::new(ScriptStep::text("slow but steady"))),
        );
        let (_server, model) = serve_with(dialect, vec![script], |c| c.timeout_ms = Some(500));
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(650)).await;
            held.notify_one();
        });
        let cancel = CancellationToken::new();
        let answer = model.complete_streaming(&hello(), &cancel, &|_| {}).await;
        release.await.unwrap();
        assert_eq!(
            answer.map(|a| a.content).ok().as_deref(),
            Some("slow but steady"),
            "{dialect:?}"
        );

        let stopped = Arc::new(tokio::sync::Notify::new());
        let script = ScriptStep::Held(stopped, Box::new(ScriptStep::text("and then nothing")));
        let (_server, model) = serve_with(dialect, vec![script], |c| c.timeout_ms = Some(500));
        let started = std::time::Instant::now();
        let error = model.complete_streaming(&hello(), &cancel, &|_| {}).await.unwrap_err();
        assert!(matches!(error, ModelError::Timeout { .. }), "{dialect:?}: {error:?}");
        let message = error.to_string();
        assert!(message.contains("sent nothing for `timeoutMs` (500 ms)"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    }
}

/// A loopback server that answers every request with the head of a stream of server-sent
/// events and then only keep-alive comments (`: ping`), one every `every`, until the client
/// goes. Returns its base URL.
async fn pinging_server(every: Duration) -> String {
    use tokio::io::AsyncWriteExt;
    let (addr, _) = raw_server(move |mut socket| async move {
        let reply = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                     connection: close\r\n\r\n";
        if socket.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
        // Ends when the client has gone and a write fails.
        while socket.write_all(b": ping\n\n").await.is_ok() {
            tokio::time::sleep(every).await;
        }
    })
    .await;
    format!("http://{addr}")
}

/// A stream kept open by keep-alive pings alone ends at ten times `timeoutMs`, and the
/// error says so in the setting's own unit: with `timeoutMs: 200`, 2000 ms, ten times
/// `timeoutMs` (200 ms), where it said "no answer within 2s" and named no relation to the
/// 200 configured.
#[tokio::test]
async fn a_stream_of_pings_alone_ends_at_ten_times_timeout_ms_saying_so() {
    for dialect in DIALECTS {
        let base = pinging_server(Duration::from_millis(50)).await;
        let base = match dialect {
            Dialect::OpenAi => format!("{base}/v1"),
            Dialect::Anthropic => base,
        };
        let mut config = config(dialect, base);
        config.timeout_ms = Some(200);
        let model = toolmux_llm::connect("pinged", &config).unwrap();
        let started = std::time::Instant::now();
        let error = tokio::time::timeout(
            Duration::from_secs(10),
            stream(&model, &hello(), &Recorder::default()),
        )
        .await
        .expect("the stream's limit ends it")
        .unwrap_err();
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(2000), "{dialect:?}: {elapsed:?}");
        assert!(
            matches!(error, ModelError::Timeout { timeout, kind: toolmux_llm::TimeoutKind::Stream, .. }
                if timeout == Duration::from_millis(2000)),
            "{dialect:?}: {error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("not whole within 2000 ms, 10 times `timeoutMs` (200 ms)"),
            "{dialect:?}: {message}"
        );
    }
}

/// A loopback server that answers every request with the head of a JSON answer (not a
/// stream) and the first byte of its body, then nothing until the client goes. Returns its
/// base URL.
async fn stalling_json_server() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, _) = raw_server(|mut socket| async move {
        let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: 1000\r\nconnection: close\r\n\r\n{";
        if socket.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
        // Holds the connection until the client goes (the rest of the request body, if
        // any, then the end).
        let mut chunk = [0u8; 8192];
        while matches!(socket.read(&mut chunk).await, Ok(n) if n > 0) {}
    })
    .await;
    format!("http://{addr}")
}

/// Asked for a stream, an answer that comes in one piece (a server that ignores
/// `stream`) and stalls is given up after `timeoutMs` with nothing more of it, as a
/// stream's parts are, where it was read with no limit but ten times `timeoutMs` for the
/// whole answer.
#[tokio::test]
async fn an_answer_in_one_piece_that_stalls_is_given_up_after_timeout_ms() {
    for dialect in DIALECTS {
        let base = stalling_json_server().await;
        let base = match dialect {
            Dialect::OpenAi => format!("{base}/v1"),
            Dialect::Anthropic => base,
        };
        let mut config = config(dialect, base);
        config.timeout_ms = Some(200);
        let model = toolmux_llm::connect("stalled", &config).unwrap();
        let error = tokio::time::timeout(
            Duration::from_secs(10),
            stream(&model, &hello(), &Recorder::default()),
        )
        .await
        .expect("a limit ends it")
        .unwrap_err();
        assert!(
            matches!(error, ModelError::Timeout { timeout, kind: toolmux_llm::TimeoutKind::Idle, .. }
                if timeout == Duration::from_millis(200)),
            "{dialect:?}: {error:?}"
        );
    }
}

/// Azure OpenAI as its older `api-version`s answer: a request with `stream_options` is
/// refused with `refusal`, one without is answered `text`.
fn refusing_stream_options(refusal: &'static str, text: &'static str) -> ScriptStep {
    ScriptStep::callback(move |request| match request.get("stream_options") {
        Some(_) => ScriptStep::status(400, refusal),
        None => ScriptStep::text(text),
    })
}

#[tokio::test]
async fn an_api_that_refuses_stream_options_is_asked_again_without_them_from_then_on() {
    let refusals = [
        r#"{"error": {"message": "Unrecognized request argument supplied: stream_options", "type": "invalid_request_error", "param": null, "code": null}}"#,
        r#"{"error": {"message": "Unknown parameter: 'stream_options'.", "type": "invalid_request_error", "param": "stream_options", "code": "unknown_parameter"}}"#,
    ];
    for refusal in refusals {
        let script = vec![
            refusing_stream_options(refusal, "never sent"),
            refusing_stream_options(refusal, "first answer"),
            refusing_stream_options(refusal, "second answer"),
        ];
        let (server, model) = serve(Dialect::OpenAi, script);
        let recorder = Recorder::default();
        let answer = stream(&model, &hello(), &recorder).await;
        assert_eq!(answer.unwrap().content, "first answer", "{refusal}");
        assert_eq!(recorder.text(), "first answer");
        assert!(!recorder.seen().contains(&Seen::Restart), "{:?}", recorder.seen());
        // The client remembers: the next request goes without them at once.
        let answer = stream(&model, &hello(), &Recorder::default()).await;
        assert_eq!(answer.unwrap().content, "second answer");
        let sent: Vec<bool> =
            server.requests().iter().map(|r| r.get("stream_options").is_some()).collect();
        assert_eq!(sent, [true, false, false], "{refusal}");
        assert!(server.requests().iter().all(|r| r["stream"] == json!(true)));
    }
}

#[tokio::test]
async fn another_bad_request_is_not_asked_again_without_stream_options() {
    let refusal = r#"{"error": {"message": "Unrecognized request argument supplied: logit_bias", "type": "invalid_request_error"}}"#;
    let (server, model) = serve(
        Dialect::OpenAi,
        vec![ScriptStep::status(400, refusal), ScriptStep::text("not asked")],
    );
    let error = stream(&model, &hello(), &Recorder::default()).await.unwrap_err();
    assert!(matches!(error, ModelError::Api { status: 400, .. }), "{error:?}");
    assert_eq!(only_request(&server)["stream_options"], json!({"include_usage": true}));
}

/// A chat completions server as Azure OpenAI's older `api-version`s are, on 127.0.0.1: a
/// request with `stream_options` is refused (400), one without is answered `text` as a
/// stream of chunks that carries no usage. Returns its base URL and whether each request
/// asked for `stream_options`.
async fn azure_without_stream_options(text: &'static str) -> (String, Arc<Mutex<Vec<bool>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let asked: Arc<Mutex<Vec<bool>>> = Arc::default();
    let seen = asked.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let (head_end, length) = loop {
                    let n = socket.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the client closed before its request was whole");
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                        break (end + 4, length);
                    }
                };
                while buf.len() < head_end + length {
                    let n = socket.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the client closed before its body was whole");
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body: Value = serde_json::from_slice(&buf[head_end..]).unwrap();
                let asks = body.get("stream_options").is_some();
                seen.lock().unwrap().push(asks);
                let reply = if asks {
                    let refusal = r#"{"error": {"message": "Unrecognized request argument supplied: stream_options", "type": "invalid_request_error"}}"#;
                    format!(
                        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{refusal}",
                        refusal.len()
                    )
                } else {
                    let chunk = |delta: Value, finish: Value| {
                        let chunk = json!({"id": "c", "object": "chat.completion.chunk",
                            "model": "gpt-4o", "choices": [{"index": 0, "delta": delta,
                            "finish_reason": finish}]});
                        format!("data: {chunk}\n\n")
                    };
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                         connection: close\r\n\r\n{}{}{}data: [DONE]\n\n",
                        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                        chunk(json!({"content": text}), Value::Null),
                        chunk(json!({}), json!("stop")),
                    )
                };
                socket.write_all(reply.as_bytes()).await.unwrap();
                let _ = socket.shutdown().await;
            });
        }
    });
    (base, asked)
}

/// Once the API has refused `stream_options`, its streamed answers carry no usage: the
/// usage is estimated from the lengths (on the high side, marked `estimated`), never
/// read as zero, which budgets took for a free call.
#[tokio::test]
async fn answers_streamed_without_usage_have_it_estimated_not_zero() {
    let text = "A streamed answer of some length, with no usage after it.";
    let (base, asked) = azure_without_stream_options(text).await;
    let model = toolmux_llm::connect("azure", &config(Dialect::OpenAi, base)).unwrap();
    let request = ModelRequest::new(vec![Message::user("Tell me something. ".repeat(30))]);
    for _ in 0..2 {
        let recorder = Recorder::default();
        let answer = stream(&model, &request, &recorder).await.unwrap();
        assert_eq!((answer.content.as_str(), recorder.text()), (text, text.to_owned()));
        let usage = answer.usage;
        assert!(usage.estimated, "{usage:?}");
        // The prompt alone is 570 bytes: at a token per three bytes, over 190 tokens.
        assert!(usage.input_tokens > 190, "{usage:?}");
        assert_eq!(usage.output_tokens, (text.len() as u64).div_ceil(3), "{usage:?}");
    }
    assert_eq!(*asked.lock().unwrap(), [true, false, false]);
}

/// The arguments of a call given in the other form than the API documents (Anthropic's
/// `input` as a JSON string of the object, or whole in `content_block_start` with no
/// `input_json_delta`; chat completions `arguments` as an object rather than its text, or
/// its text encoded twice) are read as the object, streamed or not, and a stream hands
/// them out as the call's arguments: a string of an object is its object, an object is
/// taken as it is. A `content_block_start`'s `input` was dropped, the call read as `{}`.
#[tokio::test]
async fn arguments_in_the_other_form_are_read_as_their_object_streamed_or_not() {
    let object = json!({"path": "a"});
    let text = object.to_string();
    let anthropic_whole = |input: Value| {
        json!({"model": "m", "stop_reason": "tool_use", "content": [
            {"type": "tool_use", "id": "t1", "name": "fs__read", "input": input}]})
    };
    let openai_whole = |arguments: Value| {
        json!({"choices": [{"message": {"tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "fs__read", "arguments": arguments}}]},
            "finish_reason": "tool_calls"}]})
    };
    let whole = [
        (Dialect::Anthropic, anthropic_whole(json!(text))),
        (Dialect::Anthropic, anthropic_whole(object.clone())),
        (Dialect::OpenAi, openai_whole(object.clone())),
        (Dialect::OpenAi, openai_whole(json!(json!(text).to_string()))),
    ];
    for (dialect, answer) in whole {
        let (_server, model) = serve(dialect, vec![ScriptStep::Raw(answer.to_string())]);
        let answer = complete(&model, &hello()).await;
        assert_eq!(answer.tool_calls[0].arguments, object, "{dialect:?}");
        assert_eq!(answer.tool_calls[0].raw_arguments, None, "{dialect:?}");
    }

    let anthropic_stream = |input: Value, deltas: &[&str]| {
        let mut events = vec![
            json!({"type": "message_start", "message": {"model": "m", "content": [],
                   "usage": {"input_tokens": 9, "output_tokens": 0}}}),
            json!({"type": "content_block_start", "index": 0, "content_block":
                   {"type": "tool_use", "id": "t1", "name": "fs__read", "input": input}}),
        ];
        for delta in deltas {
            events.push(json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": delta}}));
        }
        events.extend([
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                   "usage": {"output_tokens": 3}}),
            json!({"type": "message_stop"}),
        ]);
        events
    };
    let openai_stream = |arguments: Value| {
        vec![
            json!({"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "id": "c", "function": {"name": "fs__read", "arguments": arguments}}]}}]}),
            json!({"model": "m", "choices": [{"index": 0, "delta": {},
                "finish_reason": "tool_calls"}]}),
        ]
    };
    let twice = json!(text).to_string();
    let streamed = [
        (Dialect::Anthropic, anthropic_stream(json!(text), &[])),
        (Dialect::Anthropic, anthropic_stream(object.clone(), &[])),
        (Dialect::Anthropic, anthropic_stream(json!({}), &[&twice[..5], &twice[5..]])),
        (Dialect::OpenAi, openai_stream(object.clone())),
        (Dialect::OpenAi, openai_stream(json!(twice))),
    ];
    for (index, (dialect, events)) in streamed.into_iter().enumerate() {
        let base = sse_server(events).await;
        let base = match dialect {
            Dialect::OpenAi => format!("{base}/v1"),
            Dialect::Anthropic => base,
        };
        let model = toolmux_llm::connect("sse", &config(dialect, base)).unwrap();
        let recorder = Recorder::default();
        let answer = stream(&model, &hello(), &recorder).await.unwrap();
        let case = format!("{index} {dialect:?}");
        assert_eq!(answer.tool_calls[0].arguments, object, "{case}");
        assert_eq!(answer.tool_calls[0].raw_arguments, None, "{case}");
        // What the stream handed out reads as the same call.
        let handed: Value = serde_json::from_str(&recorder.arguments(0)).unwrap();
        let handed = match handed {
            Value::String(text) => serde_json::from_str(&text).unwrap(),
            handed => handed,
        };
        assert_eq!(handed, object, "{case}: {:?}", recorder.seen());
    }
}
