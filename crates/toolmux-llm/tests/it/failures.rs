//! What goes wrong, for both APIs: retries, refusals, timeouts, cancellation, transport
//! failures, malformed answers, configurations that cannot work, and the key kept out of
//! every message.

use super::*;
use std::time::{Duration, Instant};

fn api_error(message: &str) -> String {
    json!({"type": "error", "error": {"type": "some_error", "message": message}}).to_string()
}

#[tokio::test]
async fn a_rate_limit_is_waited_out() {
    for dialect in DIALECTS {
        let (server, model) =
            serve(dialect, vec![ScriptStep::rate_limited("0"), ScriptStep::text("ok")]);
        assert_eq!(complete(&model, &hello()).await.content, "ok");
        assert_eq!(server.requests().len(), 2, "{dialect:?}");
        // The retry is the same request.
        assert_eq!(server.requests()[0], server.requests()[1]);
    }
}

#[tokio::test]
async fn a_lasting_rate_limit_is_reported_after_the_retries() {
    for dialect in DIALECTS {
        let (server, model) = serve_with(
            dialect,
            vec![ScriptStep::rate_limited("0"), ScriptStep::rate_limited("0")],
            |c| c.max_retries = Some(1),
        );
        let error = fail(&model, &hello()).await;
        assert!(
            matches!(
                error,
                ModelError::RateLimited { attempts: 2, retry_after: Some(d), .. } if d.is_zero()
            ),
            "{error:?}"
        );
        assert!(error.is_transient());
        assert_eq!(server.requests().len(), 2, "{dialect:?}");
        assert_eq!(server.remaining_steps(), 0);
    }
}

/// A 429 asking to wait longer than a request waits (a daily quota: an hour) fails at once
/// with the API's time, for the caller to decide; it was waited out at the cap and asked
/// again three times, some three minutes, to fail the same way.
#[tokio::test]
async fn a_rate_limit_longer_than_a_request_waits_fails_at_once_with_its_time() {
    for dialect in DIALECTS {
        let (server, model) = serve_with(
            dialect,
            vec![ScriptStep::rate_limited("3600"), ScriptStep::text("too late")],
            |c| c.max_retries = Some(3),
        );
        // Far less than the cap's 60 s: a wait at the cap is a failure, not a hang.
        let error = tokio::time::timeout(Duration::from_secs(10), fail(&model, &hello()))
            .await
            .expect("the call fails at once, without waiting out the API's time");
        assert!(
            matches!(
                error,
                ModelError::RateLimited { attempts: 1, retry_after: Some(d), .. }
                    if d == Duration::from_secs(3600)
            ),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("wait 3600s") && message.contains("try again"), "{message}");
        assert_eq!(server.requests().len(), 1, "{dialect:?}");
        assert_eq!(server.remaining_steps(), 1);
    }
}

/// A 429 for a spent quota is said at once, with the API's words (waiting does not lift
/// it); a passing rate limit keeps the API's words too.
#[tokio::test]
async fn a_spent_quota_is_not_retried_and_its_message_is_kept() {
    for dialect in DIALECTS {
        let quota = r#"{"error": {"type": "insufficient_quota", "message": "You exceeded your current quota, please check your plan and billing details."}}"#;
        let (server, model) = serve_with(
            dialect,
            vec![ScriptStep::status(429, quota), ScriptStep::status(429, quota)],
            |c| c.max_retries = Some(3),
        );
        let error = fail(&model, &hello()).await;
        assert!(error.to_string().contains("exceeded your current quota"), "{error}");
        assert_eq!(server.requests().len(), 1, "{dialect:?}");
    }
}

/// A 429's error `type` or `code` decides whether it is final, as it does for an error
/// inside a stream; the message's words count only when the API names no kind. A spent
/// quota named by its code alone (OpenAI has sent `"type": "requests"` with
/// `"code": "insufficient_quota"` and a message without a quota word) was retried, and a
/// rate limit whose message speaks of billing (Anthropic's point to the plan and billing
/// settings) was said at once as final.
#[tokio::test]
async fn a_429_is_judged_by_its_error_kind_before_its_words() {
    let spent = |dialect: Dialect| match dialect {
        Dialect::OpenAi => json!({"error": {"type": "requests", "code": "insufficient_quota",
            "message": "Request limit reached for this key.", "param": null}}),
        Dialect::Anthropic => json!({"type": "error", "error": {"type": "billing_error",
            "message": "Request limit reached for this key."}}),
    };
    let passing = |dialect: Dialect| match dialect {
        Dialect::OpenAi => json!({"error": {"type": "tokens", "code": "rate_limit_exceeded",
            "message": "Rate limit reached; see your plan and billing details."}}),
        Dialect::Anthropic => json!({"type": "error", "error": {"type": "rate_limit_error",
            "message": "This request would exceed your rate limit; see your plan and billing settings."}}),
    };
    for dialect in DIALECTS {
        let body = spent(dialect).to_string();
        let (server, model) = serve_with(
            dialect,
            vec![ScriptStep::status(429, &body), ScriptStep::text("too late")],
            |c| c.max_retries = Some(2),
        );
        let error = fail(&model, &hello()).await;
        assert!(!error.is_transient(), "{dialect:?}: {error:?}");
        assert!(error.to_string().contains("Request limit reached"), "{error}");
        assert_eq!(server.requests().len(), 1, "{dialect:?}: a spent quota is not retried");

        let body = passing(dialect).to_string();
        let (server, model) = serve_with(
            dialect,
            vec![ScriptStep::status(429, &body), ScriptStep::text("ok")],
            |c| c.max_retries = Some(2),
        );
        let answer = tokio::time::timeout(Duration::from_secs(20), complete(&model, &hello()))
            .await
            .expect("the retry comes after a backoff of seconds at most");
        assert_eq!(answer.content, "ok", "{dialect:?}");
        assert_eq!(server.requests().len(), 2, "{dialect:?}: a rate limit is waited out");
    }
}

#[tokio::test]
async fn a_server_error_is_retried_after_a_backoff() {
    for dialect in DIALECTS {
        let (server, model) = serve(
            dialect,
            vec![ScriptStep::status(500, api_error("internal")), ScriptStep::text("ok")],
        );
        assert_eq!(complete(&model, &hello()).await.content, "ok");
        assert_eq!(server.requests().len(), 2, "{dialect:?}");
    }
}

/// A 408 (a proxy or load balancer in front of the API gave up waiting for the request)
/// is tried again, as the APIs' own clients do.
#[tokio::test]
async fn a_request_timeout_is_retried() {
    let (server, model) = serve(
        Dialect::OpenAi,
        vec![ScriptStep::status(408, "request timeout"), ScriptStep::text("ok")],
    );
    assert_eq!(complete(&model, &hello()).await.content, "ok");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn an_overloaded_server_is_reported_after_the_retries() {
    for dialect in DIALECTS {
        let overloaded = ScriptStep::Status {
            status: 529,
            body: api_error("Overloaded"),
            retry_after: Some("0".into()),
        };
        let (server, model) =
            serve_with(dialect, vec![overloaded.clone(), overloaded], |c| c.max_retries = Some(1));
        let error = fail(&model, &hello()).await;
        assert!(
            matches!(&error, ModelError::Api { status: 529, message, .. } if message == "Overloaded"),
            "{error:?}"
        );
        assert_eq!(server.requests().len(), 2);
    }
}

#[tokio::test]
async fn refused_credentials_are_not_retried() {
    for dialect in DIALECTS {
        let (server, model) = serve(
            dialect,
            vec![
                // An API that echoes the key it refused, as some do.
                ScriptStep::status(401, api_error(&format!("invalid x-api-key: {KEY}"))),
                ScriptStep::status(403, "forbidden for this project"),
            ],
        );
        let error = fail(&model, &hello()).await;
        let ModelError::Auth { status: 401, message, .. } = &error else { panic!("{error:?}") };
        assert_eq!(message, "invalid x-api-key: [redacted]");
        assert_eq!(server.requests().len(), 1, "{dialect:?}");
        let error = fail(&model, &hello()).await;
        assert!(
            matches!(&error, ModelError::Auth { status: 403, message, .. } if message == "forbidden for this project"),
            "{error:?}"
        );
        assert!(!error.is_transient());
        assert_eq!(server.requests().len(), 2, "{dialect:?}");
    }
}

#[tokio::test]
async fn a_bad_request_says_the_api_s_message() {
    for dialect in DIALECTS {
        let (server, model) = serve(
            dialect,
            vec![ScriptStep::status(400, r#"{"error":{"message":"bad tool schema"}}"#)],
        );
        let error = fail(&model, &hello()).await;
        assert!(matches!(error, ModelError::Api { status: 400, .. }), "{error:?}");
        assert_eq!(
            error.to_string(),
            "model `scripted`: the API answered HTTP 400: bad tool schema"
        );
        assert_eq!(server.requests().len(), 1);
    }
}

#[tokio::test]
async fn an_error_body_that_is_not_json_is_shown_in_part() {
    let body = format!("<html>{}</html>", "é".repeat(3000));
    let (_server, model) = serve(Dialect::OpenAi, vec![ScriptStep::status(400, body)]);
    let error = fail(&model, &hello()).await;
    let ModelError::Api { status: 400, message, .. } = &error else { panic!("{error:?}") };
    assert!(message.starts_with("<html>éé"));
    assert!(message.len() <= 2000 + '…'.len_utf8(), "{}", message.len());
}

#[tokio::test]
async fn a_malformed_answer_says_what_is_missing() {
    for (dialect, missing) in [(Dialect::OpenAi, "`choices[0]`"), (Dialect::Anthropic, "`content`")]
    {
        let (_server, model) = serve(
            dialect,
            vec![
                ScriptStep::Raw(r#"{"id": "x", "usage": {}}"#.into()),
                ScriptStep::Raw("<html>not json</html>".into()),
            ],
        );
        let error = fail(&model, &hello()).await;
        let ModelError::Malformed { message, .. } = &error else { panic!("{error:?}") };
        assert!(message.contains(missing), "{message}");
        let error = fail(&model, &hello()).await;
        let ModelError::Malformed { message, .. } = &error else { panic!("{error:?}") };
        assert!(message.starts_with("the body is not JSON"), "{message}");
    }
}

#[tokio::test]
async fn a_tool_call_without_a_name_is_malformed() {
    let answer = json!({"choices": [{"message": {"tool_calls": [
        {"id": "c", "type": "function", "function": {"arguments": "{}"}}
    ]}, "finish_reason": "tool_calls"}]});
    let (_server, model) = serve(Dialect::OpenAi, vec![ScriptStep::Raw(answer.to_string())]);
    let error = fail(&model, &hello()).await;
    assert_eq!(
        error.to_string(),
        "model `scripted`: unexpected answer: missing `choices[0].message.tool_calls[0].function.name`"
    );
    let answer = json!({"content": [{"type": "tool_use", "name": "t", "input": {}}]});
    let (_server, model) = serve(Dialect::Anthropic, vec![ScriptStep::Raw(answer.to_string())]);
    let error = fail(&model, &hello()).await;
    assert!(error.to_string().ends_with("missing `content[0].id`"), "{error}");
}

#[tokio::test]
async fn an_answer_too_large_is_refused() {
    let huge = format!("{{\"content\": \"{}\"}}", "x".repeat(33 * 1024 * 1024));
    let (_server, model) = serve(Dialect::Anthropic, vec![ScriptStep::Raw(huge)]);
    let error = fail(&model, &hello()).await;
    let ModelError::Malformed { message, .. } = &error else { panic!("{error:?}") };
    assert_eq!(message, "the answer is larger than 32 MiB");
}

#[tokio::test]
async fn a_slow_answer_times_out() {
    for dialect in DIALECTS {
        let slow = ScriptStep::delay(Duration::from_secs(30), ScriptStep::text("late"));
        let (server, model) = serve_with(dialect, vec![slow], |c| c.timeout_ms = Some(200));
        let error = fail(&model, &hello()).await;
        assert!(
            matches!(error, ModelError::Timeout { timeout, .. } if timeout == Duration::from_millis(200)),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains("no answer within `timeoutMs` (200 ms)"), "{message}");
        // Not tried again: the next try would wait as long.
        assert_eq!(server.requests().len(), 1);
    }
}

#[tokio::test]
async fn cancelling_ends_a_request_waiting_for_its_answer() {
    for dialect in DIALECTS {
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        // The server cancels once the request has arrived, then takes its time.
        let step = ScriptStep::callback(move |_| {
            trigger.cancel();
            ScriptStep::delay(Duration::from_secs(60), ScriptStep::text("late"))
        });
        let (server, model) = serve(dialect, vec![step]);
        let started = Instant::now();
        let error = model.complete(&hello(), &cancel).await.unwrap_err();
        assert!(matches!(error, ModelError::Cancelled { .. }), "{error:?}");
        assert!(started.elapsed() < Duration::from_secs(30), "cancelled only after the answer");
        assert_eq!(server.requests().len(), 1);
    }
}

#[tokio::test]
async fn cancelling_ends_the_wait_before_a_retry() {
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let step = ScriptStep::callback(move |_| {
        trigger.cancel();
        ScriptStep::rate_limited("60")
    });
    let (server, model) = serve(Dialect::OpenAi, vec![step, ScriptStep::text("ok")]);
    let error = model.complete(&hello(), &cancel).await.unwrap_err();
    assert!(matches!(error, ModelError::Cancelled { .. }), "{error:?}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_cancelled_token_sends_nothing() {
    let (server, model) = serve(Dialect::Anthropic, vec![ScriptStep::text("ok")]);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let error = model.complete(&hello(), &cancel).await.unwrap_err();
    assert!(matches!(error, ModelError::Cancelled { .. }), "{error:?}");
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn an_unreachable_api_is_a_transport_error_with_its_cause() {
    // A port that was just free: nothing listens on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for dialect in DIALECTS {
        let mut config = config(dialect, format!("http://127.0.0.1:{port}/v1?key={KEY}"));
        config.max_retries = Some(0);
        let model = toolmux_llm::connect("scripted", &config).unwrap();
        let error = fail(&model, &hello()).await;
        let ModelError::Transport { message, .. } = &error else { panic!("{error:?}") };
        assert!(message.starts_with("cannot reach the API: "), "{message}");
        assert!(message.to_lowercase().contains("refused"), "{message}");
        assert!(!message.contains("127.0.0.1"), "the URL stays out: {message}");
        assert!(error.is_transient());
    }
}

#[tokio::test]
async fn an_exhausted_script_answers_500() {
    let (server, model) = serve_with(Dialect::OpenAi, vec![], |c| c.max_retries = Some(0));
    let error = fail(&model, &hello()).await;
    assert_eq!(
        error.to_string(),
        "model `scripted`: the API answered HTTP 500: script exhausted after 0 requests"
    );
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn configurations_that_cannot_work() {
    let check = |adjust: &dyn Fn(&mut ModelConfig), expected: &str| {
        for dialect in DIALECTS {
            let mut config = config(dialect, "https://api.example.com".into());
            adjust(&mut config);
            let error = toolmux_llm::connect("m", &config).unwrap_err();
            assert!(matches!(error, ModelError::Config { .. }), "{error:?}");
            assert_key_absent(&error);
            assert_eq!(error.to_string(), expected);
        }
    };
    check(
        &|c| c.model = " ".into(),
        "model `m`: `model` is empty: give the model's name at the API (`gpt-4.1-mini`, `claude-sonnet-4-5`)",
    );
    check(
        &|c| c.base_url = Some(format!("not a url {KEY}")),
        "model `m`: `baseUrl` `not a url [redacted]` is not a URL (relative URL without a base)",
    );
    check(
        &|c| c.base_url = Some("ftp://example.com/v1".into()),
        "model `m`: `baseUrl` `ftp://example.com/v1` is not an http or https URL",
    );
    check(
        &|c| {
            c.headers.insert("bad header".into(), "x".into());
        },
        "model `m`: `headers`: `bad header` is not a valid header name",
    );
    check(
        &|c| {
            c.headers.insert("X-Token".into(), format!("{KEY}\n"));
        },
        "model `m`: `headers`: the value of `X-Token` is not a valid header value",
    );
    check(
        &|c| c.api_key = Some(format!("{KEY}\r\n")),
        "model `m`: the API key is not a valid header value (a line break or a control character in it?)",
    );
    check(&|c| c.timeout_ms = Some(0), "model `m`: `timeoutMs` is 0: every request would time out");
}

#[test]
fn debug_output_shows_no_credentials() {
    for dialect in DIALECTS {
        let mut config = config(dialect, "https://user:SECRET-pass@api.example.com/v1".into());
        config.headers.insert("Authorization".into(), format!("Bearer {KEY}"));
        assert_no_key(&format!("{config:?}"));
        let model = toolmux_llm::connect("m", &config).unwrap();
        let debug = format!("{model:?}");
        assert_no_key(&debug);
        assert!(debug.contains("api.example.com"), "{debug}");
        assert!(debug.contains("authorization"), "the header's name is shown: {debug}");
    }
}

#[test]
fn default_base_urls() {
    for (api, url) in [
        (ApiKind::Openai, "https://api.openai.com/v1/chat/completions"),
        (ApiKind::Anthropic, "https://api.anthropic.com/v1/messages"),
    ] {
        let config = ModelConfig { api, model: "m".into(), ..ModelConfig::default() };
        let debug = format!("{:?}", toolmux_llm::connect("m", &config).unwrap());
        assert!(debug.contains(url), "{debug}");
    }
}

/// A `baseUrl` that leads nowhere is named in the 404's error; an Anthropic `baseUrl`
/// written as OpenAI's are (ending in `/v1`) reaches `/v1/messages`, not `/v1/v1/messages`.
#[tokio::test]
async fn a_wrong_base_url_is_named_and_anthropic_s_v1_is_read_as_meant() {
    let (_server, model) = serve_with(Dialect::OpenAi, vec![], |c| {
        c.base_url = c.base_url.as_deref().map(|b| format!("{b}/nowhere?api-version=1"));
    });
    let error = fail(&model, &hello()).await.to_string();
    assert!(error.contains("404") && error.contains("/v1/nowhere/chat/completions"), "{error}");
    assert!(error.contains("check `baseUrl`") && !error.contains("api-version"), "{error}");

    let (server, model) = serve_with(Dialect::Anthropic, vec![ScriptStep::text("hi")], |c| {
        c.base_url = c.base_url.as_deref().map(|b| format!("{b}/v1/"));
    });
    let answer = model.complete(&hello(), &CancellationToken::new()).await.unwrap();
    assert_eq!(answer.content, "hi");
    assert_eq!(server.requests().len(), 1);
}

/// A key given in a header of the configuration (Azure's `api-key`, an `Authorization`
/// written out) is kept out of errors as the API key is, whole or after its scheme.
#[tokio::test]
async fn keys_given_in_headers_are_kept_out_of_errors() {
    for (header, value) in [("api-key", KEY.to_owned()), ("Authorization", format!("Bearer {KEY}"))]
    {
        let (_server, model) = serve_with(
            Dialect::OpenAi,
            vec![ScriptStep::status(
                401,
                api_error(&format!("invalid key {KEY} for this deployment")),
            )],
            |c| {
                c.api_key = None;
                c.headers.insert(header.into(), value);
                c.headers.insert("anthropic-beta".into(), "prompt-caching-2024-07-31".into());
            },
        );
        let error = fail(&model, &hello()).await;
        let ModelError::Auth { message, .. } = &error else { panic!("{error:?}") };
        assert_eq!(message, "invalid key [redacted] for this deployment", "{header}");
    }
    // What is no credential stays readable.
    let (_server, model) = serve_with(
        Dialect::Anthropic,
        vec![ScriptStep::status(
            400,
            api_error("unexpected anthropic-beta prompt-caching-2024-07-31"),
        )],
        |c| {
            c.headers.insert("anthropic-beta".into(), "prompt-caching-2024-07-31".into());
        },
    );
    let error = fail(&model, &hello()).await;
    assert!(
        error.to_string().ends_with("unexpected anthropic-beta prompt-caching-2024-07-31"),
        "{error}"
    );
}

/// Usage figures no model gives (over 2^40 tokens, negative, fractional, a float) are read
/// as none reported and estimated, the same on both APIs, where `u64::MAX` figures
/// panicked in a sum (debug) or wrapped (release) and Anthropic read a negative one as 0.
#[tokio::test]
async fn absurd_usage_figures_are_estimated_not_summed() {
    let huge = json!(u64::MAX);
    let cases = [
        (huge.clone(), huge),
        (json!((1u64 << 40) + 1), json!(5)),
        (json!(-7), json!(5)),
        (json!(12), json!(1e300)),
        (json!(12.5), json!(5)),
    ];
    for (input, output) in cases {
        for dialect in DIALECTS {
            let text = json!([{"type": "text", "text": "ok"}]);
            let answer = match dialect {
                Dialect::OpenAi => json!({"model": "m", "choices": [{"index": 0,
                    "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": input, "completion_tokens": output}}),
                Dialect::Anthropic => json!({"model": "m", "content": text,
                    "stop_reason": "end_turn", "usage": {"input_tokens": input,
                    "output_tokens": output, "cache_read_input_tokens": input}}),
            };
            let (_server, model) = serve(dialect, vec![ScriptStep::Raw(answer.to_string())]);
            let usage = complete(&model, &hello()).await.usage;
            let case = format!("{dialect:?} {input} {output}");
            assert!(usage.estimated, "{case}: {usage:?}");
            assert_eq!(usage.output_tokens, 1, "{case}: {usage:?}");
            assert!((10..1000).contains(&usage.input_tokens), "{case}: {usage:?}");
            assert_eq!(usage.cache_read_tokens, 0, "{case}: {usage:?}");
        }
    }
}

/// A `Retry-After` of more seconds than any duration holds is a wait too long, failing at
/// once after the one attempt (so said, singular), where it was read as no header and the
/// request asked again with backoff.
#[tokio::test]
async fn a_retry_after_beyond_any_duration_fails_at_once() {
    for dialect in DIALECTS {
        let (server, model) = serve_with(
            dialect,
            vec![ScriptStep::rate_limited("99999999999999999999999"), ScriptStep::text("late")],
            |c| c.max_retries = Some(3),
        );
        let error = tokio::time::timeout(Duration::from_secs(10), fail(&model, &hello()))
            .await
            .expect("the call fails at once");
        let message = error.to_string();
        assert!(message.contains("after 1 attempt;"), "{message}");
        assert!(message.contains("not asked again"), "{message}");
        assert_eq!(server.requests().len(), 1, "{dialect:?}");
    }
}

/// An answer without usage has its output estimated the same way on both APIs, from its
/// text and each call's id, name and arguments as written (a call whose arguments are not
/// JSON counts what the model wrote).
#[tokio::test]
async fn output_without_usage_is_estimated_alike_on_both_apis() {
    let raw = r#"{"path": "a", oops"#;
    for dialect in DIALECTS {
        let answer = match dialect {
            Dialect::OpenAi => json!({"model": "m", "choices": [{"index": 0, "message": {
                "role": "assistant", "content": "Reading both.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "fs__read", "arguments": "{\"path\":\"README.md\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "fs__read", "arguments": raw}}]},
                "finish_reason": "tool_calls"}]}),
            Dialect::Anthropic => json!({"model": "m", "stop_reason": "tool_use", "content": [
                {"type": "text", "text": "Reading both."},
                {"type": "tool_use", "id": "call_1", "name": "fs__read",
                 "input": {"path": "README.md"}},
                {"type": "tool_use", "id": "call_2", "name": "fs__read", "input": raw}]}),
        };
        let (_server, model) = serve(dialect, vec![ScriptStep::Raw(answer.to_string())]);
        let answer = complete(&model, &hello()).await;
        assert_eq!(answer.tool_calls[1].raw_arguments.as_deref(), Some(raw), "{dialect:?}");
        let received = "Reading both.".len()
            + "call_1fs__read{\"path\":\"README.md\"}".len()
            + "call_2fs__read".len()
            + raw.len();
        let usage = answer.usage;
        assert!(usage.estimated, "{dialect:?}: {usage:?}");
        assert_eq!(usage.output_tokens, (received as u64).div_ceil(3), "{dialect:?}: {usage:?}");
        assert!(usage.input_tokens > 10, "{dialect:?}: {usage:?}");
    }
}

/// A 429 or 503 with a `Retry-After` of this value, then an answer: the error, or the
/// answer, and how many requests the server got.
async fn retried_after(
    dialect: Dialect,
    status: u16,
    value: &str,
) -> (Result<ModelResponse, ModelError>, usize) {
    let refused = ScriptStep::Status {
        status,
        body: api_error("try later"),
        retry_after: Some(value.into()),
    };
    let (server, model) =
        serve_with(dialect, vec![refused, ScriptStep::text("ok")], |c| c.max_retries = Some(2));
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        model.complete(&hello(), &CancellationToken::new()),
    )
    .await
    .expect("no wait near the date's");
    (answer, server.requests().len())
}

/// A `Retry-After` date already past (a server's clock behind, a date copied from its
/// documentation) is a retry after the usual backoff, never a wait of its own.
#[tokio::test]
async fn a_retry_after_date_in_the_past_is_retried() {
    for dialect in DIALECTS {
        for status in [429, 503] {
            let (answer, requests) =
                retried_after(dialect, status, "Wed, 21 Oct 2015 07:28:00 GMT").await;
            let case = format!("{dialect:?} {status}");
            assert_eq!(answer.unwrap().content, "ok", "{case}");
            assert_eq!(requests, 2, "{case}");
        }
    }
}

/// A `Retry-After` date further than a request waits is refused at once, as a number of
/// seconds that far is, saying when in words a person reads: years, not some billion
/// seconds.
#[tokio::test]
async fn a_retry_after_date_far_off_fails_at_once_saying_how_far() {
    for dialect in DIALECTS {
        for status in [429, 503] {
            let (answer, requests) =
                retried_after(dialect, status, "Fri, 31 Dec 9999 23:59:59 GMT").await;
            let case = format!("{dialect:?} {status}");
            let error = answer.unwrap_err();
            assert_key_absent(&error);
            assert_eq!(requests, 1, "{case}");
            let message = error.to_string();
            assert!(message.contains("until Fri, 31 Dec 9999 23:59:59 GMT"), "{case}: {message}");
            assert!(message.contains("years"), "{case}: {message}");
            assert!(message.contains("not asked again"), "{case}: {message}");
            if status == 429 {
                assert!(
                    matches!(error, ModelError::RateLimited { attempts: 1, retry_after: Some(d), .. }
                        if d > Duration::from_secs(86_400 * 365 * 7000)),
                    "{case}: {error:?}"
                );
            }
        }
    }
}

/// A `Retry-After` that is neither seconds nor an HTTP date (a day past the month's end, a
/// year of more than four digits, which once overflowed the clock, words) is read as no
/// header: the request is asked again after the usual backoff.
#[tokio::test]
async fn a_malformed_retry_after_date_is_read_as_none() {
    let malformed = [
        "Wed, 32 Oct 2015 07:28:00 GMT",
        "Tue, 31 Feb 2026 07:28:00 GMT",
        "Wed, 21 Oct 300000000000 07:28:00 GMT",
        "Wed, 21 Oct 18446744073709551615 07:28:00 GMT",
        "Wed, 21 Oct 2015 07:28 GMT",
        "tomorrow",
    ];
    for value in malformed {
        for dialect in DIALECTS {
            let (answer, requests) = retried_after(dialect, 429, value).await;
            let case = format!("{dialect:?} {value}");
            assert_eq!(answer.unwrap().content, "ok", "{case}");
            assert_eq!(requests, 2, "{case}");
        }
    }
}

/// A loopback server that answers every request with `status`, an API error and the
/// header `name: value`; the base URL to configure for `dialect` and how many requests
/// it has had.
async fn refusing_with(
    dialect: Dialect,
    status: u16,
    name: &'static str,
    value: &'static str,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncWriteExt;
    let (addr, requests) = raw_server(move |mut stream| async move {
        let body = api_error("try later");
        let answer = format!(
            "HTTP/1.1 {status} Refused\r\ncontent-type: application/json\r\n\
             {name}: {value}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
    })
    .await;
    let base = match dialect {
        Dialect::OpenAi => format!("http://{addr}/v1"),
        Dialect::Anthropic => format!("http://{addr}"),
    };
    (base, requests)
}

/// A wait just short of the most seconds a clock counts (`Retry-After:
/// 18446744073700000000`, or as many thousandths in `retry-after-ms`), on a 429 and a
/// 503, fails at once saying it in years, where rounding it to years overflowed and the
/// client panicked writing the message.
#[tokio::test]
async fn a_wait_near_the_end_of_any_clock_is_said_in_years() {
    let headers =
        [("retry-after", "18446744073700000000"), ("retry-after-ms", "18446744073700000000000")];
    for dialect in DIALECTS {
        for status in [429, 503] {
            for (name, value) in headers {
                let case = format!("{dialect:?} {status} {name}");
                let (base, requests) = refusing_with(dialect, status, name, value).await;
                let mut config = config(dialect, base);
                config.max_retries = Some(2);
                let model = toolmux_llm::connect("refusing", &config).unwrap();
                let error = tokio::time::timeout(Duration::from_secs(10), fail(&model, &hello()))
                    .await
                    .expect("the call fails at once");
                let message = error.to_string();
                assert!(message.contains("years"), "{case}: {message}");
                assert!(message.contains("not asked again"), "{case}: {message}");
                assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1, "{case}");
                if status == 429 {
                    assert!(
                        matches!(error, ModelError::RateLimited { attempts: 1, retry_after: Some(d), .. }
                            if d > Duration::from_secs(18_446_744_073_000_000_000)),
                        "{case}: {error:?}"
                    );
                }
            }
        }
    }
}

/// A redirect's target is named in the error as URLs are, without its query or user info,
/// which may carry a token: a relative one resolved against the URL asked, one that is no
/// URL cut at its query, where both went into the message as the API sent them.
#[tokio::test]
async fn a_redirect_s_target_is_named_without_credentials() {
    let cases = [
        ("/v2/messages?token=s3cret-token", "/v2/messages; set `baseUrl`"),
        (
            "https://user:s3cret-token@gateway.test:99999/v1?key=s3cret-token",
            "gateway.test:99999/v1;",
        ),
    ];
    for (location, shown) in cases {
        let (base, requests) = refusing_with(Dialect::Anthropic, 302, "location", location).await;
        let model = toolmux_llm::connect("redirected", &config(Dialect::Anthropic, base)).unwrap();
        let error = fail(&model, &hello()).await.to_string();
        assert!(error.contains("redirected to") && error.contains(shown), "{location}: {error}");
        assert!(!error.contains("s3cret"), "{location}: {error}");
        assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1, "{location}");
    }
}
