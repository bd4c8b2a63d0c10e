//! Finish and stop reasons that end no turn: the model failed while writing, the context
//! window cut the answer, a turn paused, a content filter stepped in. None may read as a
//! finished answer, whole or streamed.

use super::*;
use toolmux_llm::{StopReason, Usage};

/// A chat completion of half an answer that ended for `finish`.
fn chat(finish: &str) -> String {
    json!({"model": "m", "choices": [{"message": {"role": "assistant", "content": "half an"},
           "finish_reason": finish}], "usage": {"prompt_tokens": 30, "completion_tokens": 4}})
    .to_string()
}

/// An Anthropic message of half an answer that ended for `stop`.
fn message(stop: &str) -> String {
    json!({"model": "claude-x", "content": [{"type": "text", "text": "half an"}],
           "stop_reason": stop, "usage": {"input_tokens": 190, "cache_read_input_tokens": 6,
           "output_tokens": 4}})
    .to_string()
}

fn assert_stopped(error: &ModelError, expected: &str) {
    match error {
        ModelError::Stopped { reason, .. } => assert_eq!(reason, expected),
        other => panic!("expected the answer refused for `{expected}`, got {other:?}"),
    }
    assert!(error.to_string().contains(expected), "{error}");
    assert!(!error.is_transient(), "{error:?}");
}

/// Mistral's and the compatible servers' `error`, and Gemini's reasons for a failed
/// answer, are failures naming the reason; Gemini's filters and its output limit are read
/// as OpenAI's.
#[tokio::test]
async fn chat_completions_reasons_that_end_no_turn() {
    let failed = ["error", "MALFORMED_FUNCTION_CALL", "OTHER"];
    let filtered = ["SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII"];
    let script = failed
        .iter()
        .chain(&filtered)
        .chain(&["MAX_TOKENS", "STOP"])
        .map(|reason| ScriptStep::Raw(chat(reason)))
        .collect();
    let (_server, model) = serve(Dialect::OpenAi, script);
    for reason in failed {
        let error = fail(&model, &hello()).await;
        assert_stopped(&error, reason);
        assert_eq!(error.context_overflow(), None);
        // Billed all the same: the figures go with the error, for budgets to count.
        assert_eq!(error.usage(), Some(Usage::new(30, 4)), "{reason}");
    }
    for reason in filtered {
        assert_eq!(complete(&model, &hello()).await.stop, StopReason::ContentFilter, "{reason}");
    }
    assert_eq!(complete(&model, &hello()).await.stop, StopReason::MaxTokens);
    assert_eq!(complete(&model, &hello()).await.stop, StopReason::EndTurn);
}

/// Mistral's `model_length` and Anthropic's `model_context_window_exceeded`: the answer
/// filled the window, which the agent meets as a request over it, with the API's figures.
#[tokio::test]
async fn an_answer_cut_at_the_context_window_reads_as_an_overflow() {
    let (_server, model) = serve(Dialect::OpenAi, vec![ScriptStep::Raw(chat("model_length"))]);
    let error = fail(&model, &hello()).await;
    // The API bills the cut answer: its figures go with the error, for budgets to count.
    assert_eq!(error.usage(), Some(Usage::new(30, 4)), "{error:?}");
    let window = error.context_overflow().unwrap();
    assert_eq!((window.limit, window.tokens, window.written), (Some(34), Some(30), Some(4)));
    assert!(error.to_string().contains("context window"), "{error}");

    let stop = "model_context_window_exceeded";
    let (_server, model) = serve(Dialect::Anthropic, vec![ScriptStep::Raw(message(stop))]);
    let error = fail(&model, &hello()).await;
    let usage = Usage { cache_read_tokens: 6, ..Usage::new(196, 4) };
    assert_eq!(error.usage(), Some(usage), "{error:?}");
    let window = error.context_overflow().unwrap();
    let figures = (window.limit, window.tokens, window.written);
    assert_eq!(figures, (Some(200), Some(196), Some(4)), "{error:?}");
}

/// A server that reports no usage for an answer cut at the window is billed all the same:
/// the request's tokens are estimated, as for an answer, and read as no figure of the
/// window's.
#[tokio::test]
async fn an_answer_cut_at_the_context_window_without_usage_is_estimated() {
    let cut = json!({"model": "m", "choices": [{"message": {"role": "assistant",
                     "content": "half an"}, "finish_reason": "model_length"}]});
    let (_server, model) = serve(Dialect::OpenAi, vec![ScriptStep::Raw(cut.to_string())]);
    let error = fail(&model, &hello()).await;
    let usage = error.usage().unwrap();
    assert!(usage.estimated && usage.input_tokens > 0, "{error:?}");
    assert_eq!(error.context_overflow(), Some(Default::default()));
}

async fn fail_streaming(model: &Arc<dyn Model>) -> ModelError {
    let error =
        model.complete_streaming(&hello(), &CancellationToken::new(), &|_| {}).await.unwrap_err();
    assert_key_absent(&error);
    error
}

fn streamed_model(dialect: Dialect, base: String) -> Arc<dyn Model> {
    let base = match dialect {
        Dialect::OpenAi => format!("{base}/v1"),
        Dialect::Anthropic => base,
    };
    toolmux_llm::connect("scripted", &config(dialect, base)).unwrap()
}

#[tokio::test]
async fn streamed_answers_that_end_no_turn_fail_as_whole_ones_do() {
    let chunk = |delta: Value, finish: Value| json!({"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    for (finish, overflow) in [("error", false), ("model_length", true)] {
        let base = sse_server(vec![
            chunk(json!({"role": "assistant", "content": "half"}), Value::Null),
            chunk(json!({}), json!(finish)),
            json!({"choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 4}}),
        ])
        .await;
        let error = fail_streaming(&streamed_model(Dialect::OpenAi, base)).await;
        assert_eq!(error.context_overflow().is_some(), overflow, "{finish}: {error:?}");
        if !overflow {
            assert_stopped(&error, finish);
        }
    }
    for (stop, overflow) in [("pause_turn", false), ("model_context_window_exceeded", true)] {
        let base = sse_server(vec![
            json!({"type": "message_start", "message": {"model": "claude-x", "content": [],
                   "usage": {"input_tokens": 190, "output_tokens": 0}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "half"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 10}}),
            json!({"type": "message_stop"}),
        ])
        .await;
        let error = fail_streaming(&streamed_model(Dialect::Anthropic, base)).await;
        assert_eq!(error.context_overflow().is_some(), overflow, "{stop}: {error:?}");
        if !overflow {
            assert_stopped(&error, stop);
        }
    }
}
