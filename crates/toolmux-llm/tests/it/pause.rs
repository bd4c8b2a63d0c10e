//! A turn Anthropic's server tools paused (`stop_reason: pause_turn`) is continued as the
//! API documents: the paused content goes back unchanged, and the answer is the whole turn,
//! its blocks kept for that API alone.

use super::streaming::{Recorder, Seen, calls};
use super::*;
use toolmux_llm::{MAX_CONTINUATIONS, StopReason, Usage};

/// The blocks of a turn the API paused in a web search: the search, its results (opaque,
/// encrypted) and the text before it.
fn paused_blocks() -> Value {
    json!([
        {"type": "text", "text": "Let me search."},
        {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search",
         "input": {"query": "toolmux release"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [
            {"type": "web_search_result", "url": "https://example.com/r", "title": "Release",
             "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1hZjhlLTQ", "page_age": null}]},
    ])
}

/// The text that ends the turn, citing the search.
fn final_blocks() -> Value {
    json!([{"type": "text", "text": "It was released in May.", "citations": [
        {"type": "web_search_result_location", "url": "https://example.com/r",
         "title": "Release", "encrypted_index": "Eo8BCioIAhgBIiQ", "cited_text": "May"}]}])
}

fn answer(content: &Value, stop: &str, input: u64, output: u64) -> ScriptStep {
    ScriptStep::Raw(
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
               "content": content, "stop_reason": stop,
               "usage": {"input_tokens": input, "cache_read_input_tokens": 6,
                         "output_tokens": output}})
        .to_string(),
    )
}

#[tokio::test]
async fn a_paused_turn_is_continued_with_its_blocks_sent_back_unchanged() {
    let script = vec![
        answer(&paused_blocks(), "pause_turn", 100, 20),
        answer(&final_blocks(), "end_turn", 300, 30),
    ];
    let (server, model) = serve(Dialect::Anthropic, script);
    let answer = complete(&model, &hello()).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "one continuation");
    // The continuation is the same request with the paused turn after it, as it came.
    let mut expected = requests[0]["messages"].as_array().unwrap().clone();
    expected.push(json!({"role": "assistant", "content": paused_blocks()}));
    assert_eq!(requests[1]["messages"], Value::Array(expected));
    assert_eq!(requests[1]["tools"], requests[0]["tools"]);
    // The answer is the whole turn: both parts' text, every request's tokens.
    assert_eq!(answer.content, "Let me search.\nIt was released in May.");
    assert_eq!(answer.stop, StopReason::EndTurn);
    assert_eq!(
        answer.usage,
        Usage {
            input_tokens: 100 + 300 + 2 * 6,
            output_tokens: 50,
            cache_read_tokens: 12,
            ..Usage::default()
        }
    );
    let kept = answer.blocks.clone().expect("a continued turn keeps its blocks");
    let mut all = paused_blocks().as_array().unwrap().clone();
    all.extend(final_blocks().as_array().unwrap().iter().cloned());
    assert_eq!(kept.blocks, all);

    // The next turn sends the whole turn back to the same API, blocks unchanged.
    let mut next = hello();
    next.messages.push(answer.to_message());
    next.messages.push(Message::user("And the one before?"));
    server.push_steps([ScriptStep::text("In March.")]);
    complete(&model, &next).await;
    let sent = server.requests().pop().unwrap();
    assert_eq!(sent["messages"][1], json!({"role": "assistant", "content": all}));

    // Any other API gets the turn's text: the blocks are the first API's data.
    let (openai, chat) = serve(Dialect::OpenAi, vec![ScriptStep::text("In March.")]);
    complete(&chat, &next).await;
    let sent = openai.requests().pop().unwrap();
    assert_eq!(
        sent["messages"][1],
        json!({"role": "assistant", "content": "Let me search.\nIt was released in May."})
    );
    let (other, claude) = serve(Dialect::Anthropic, vec![ScriptStep::text("In March.")]);
    complete(&claude, &next).await;
    let sent = other.requests().pop().unwrap();
    assert_eq!(sent["messages"][1]["content"], "Let me search.\nIt was released in May.");
    assert!(!sent.to_string().contains("srvtoolu_01"), "{sent}");
}

/// A turn that keeps pausing is continued [`MAX_CONTINUATIONS`] times, each request
/// carrying every paused part so far, then fails saying so with every request's tokens.
#[tokio::test]
async fn a_turn_paused_past_the_limit_fails_with_the_tokens_of_every_request() {
    let paused = json!([{"type": "server_tool_use", "id": "srvtoolu_02", "name": "web_search",
                         "input": {"query": "more"}}]);
    let asked = MAX_CONTINUATIONS as usize + 1;
    let script = (0..asked).map(|_| answer(&paused, "pause_turn", 100, 20)).collect();
    let (server, model) = serve(Dialect::Anthropic, script);
    let error = fail(&model, &hello()).await;
    let ModelError::Stopped { reason, .. } = &error else { panic!("{error:?}") };
    assert_eq!(reason, "pause_turn");
    assert!(error.to_string().contains("continued 8 times"), "{error}");
    let usage = error.usage().unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (106 * asked as u64, 20 * asked as u64));
    let requests = server.requests();
    assert_eq!(requests.len(), asked);
    let last = requests.last().unwrap()["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"].as_array().unwrap().len(), MAX_CONTINUATIONS as usize);
}

/// A streamed message's first event, with `input` tokens.
fn start(input: u64) -> Value {
    json!({"type": "message_start", "message": {"model": "claude-x", "content": [],
           "usage": {"input_tokens": input, "output_tokens": 0}}})
}

/// A streamed message's last events: it stops for `reason` after `output` tokens.
fn stop(reason: &str, output: u64) -> [Value; 2] {
    [
        json!({"type": "message_delta", "delta": {"stop_reason": reason},
               "usage": {"output_tokens": output}}),
        json!({"type": "message_stop"}),
    ]
}

/// The events of text block `index` saying `text`.
fn text_block(index: u64, text: &str) -> [Value; 3] {
    [
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": index}),
    ]
}

/// The events of block `index` calling tool `name` as `id` with `input`, in two pieces.
fn call_block(index: u64, id: &str, name: &str, input: &Value) -> [Value; 4] {
    let input = input.to_string();
    let (head, tail) = input.split_at(input.len() / 2);
    let piece = |json: &str| {
        json!({"type": "content_block_delta", "index": index,
               "delta": {"type": "input_json_delta", "partial_json": json}})
    };
    [
        json!({"type": "content_block_start", "index": index, "content_block":
               {"type": "tool_use", "id": id, "name": name, "input": {}}}),
        piece(head),
        piece(tail),
        json!({"type": "content_block_stop", "index": index}),
    ]
}

/// An error inside a stream that the client tries again.
fn overloaded() -> Value {
    json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
}

/// Streamed, the paused turn's blocks are put together from their events (a server tool's
/// input in pieces, a result whole, text with its citations) and go back as the API would
/// have sent them whole; the deltas carry both parts' text.
#[tokio::test]
async fn a_streamed_paused_turn_is_continued_with_its_blocks_whole() {
    let blocks = paused_blocks();
    let mut paused = vec![start(100)];
    paused.extend(text_block(0, "Let me search."));
    paused.extend([
        json!({"type": "content_block_start", "index": 1, "content_block":
               {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"query\": \"tool"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "mux release\"}"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": blocks[2]}),
        json!({"type": "content_block_stop", "index": 2}),
    ]);
    paused.extend(stop("pause_turn", 20));
    let cited = &final_blocks()[0];
    let mut done = vec![
        start(300),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "citations_delta", "citation": cited["citations"][0]}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": cited["text"]}}),
        json!({"type": "content_block_stop", "index": 0}),
    ];
    done.extend(stop("end_turn", 30));
    let (base, bodies) = sse_script_server(vec![paused, done]).await;
    let model = toolmux_llm::connect("scripted", &config(Dialect::Anthropic, base)).unwrap();
    let texts = std::sync::Mutex::new(String::new());
    let on_delta = |delta: toolmux_llm::ModelDelta<'_>| {
        if let toolmux_llm::ModelDelta::Text(text) = delta {
            texts.lock().unwrap().push_str(text);
        }
    };
    let answer =
        model.complete_streaming(&hello(), &CancellationToken::new(), &on_delta).await.unwrap();
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 2);
    let sent = bodies[1]["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(sent, json!({"role": "assistant", "content": blocks}));
    assert_eq!(answer.content, "Let me search.\nIt was released in May.");
    assert_eq!(*texts.lock().unwrap(), "Let me search.It was released in May.");
    assert_eq!((answer.usage.input_tokens, answer.usage.output_tokens), (400, 50));
    assert_eq!(answer.blocks.unwrap().blocks.last(), Some(cited));
}

/// A continuation's request tried again (its stream reported an error after some text)
/// voids only what that continuation streamed: after the restart the deltas give the
/// earlier part's text again, so that what they add up to is the whole turn's text, where
/// before the first part's text was lost to whoever followed the stream.
#[tokio::test]
async fn a_restart_in_a_continuation_keeps_what_the_earlier_part_streamed() {
    let mut paused = vec![start(100)];
    paused.extend(text_block(0, "Let me search."));
    paused.extend(stop("pause_turn", 20));
    let mut broken = vec![start(300)];
    broken.extend(text_block(0, "It was").into_iter().take(2));
    broken.push(overloaded());
    let mut done = vec![start(300)];
    done.extend(text_block(0, "It was released in May."));
    done.extend(stop("end_turn", 30));
    let (answer, requests, recorder) = streamed_turn(vec![paused, broken, done]).await;
    assert_eq!(requests, 3, "one continuation, tried twice");
    assert_eq!(answer.content, "Let me search.\nIt was released in May.");
    let seen = recorder.seen();
    assert_eq!(seen.iter().filter(|s| **s == Seen::Restart).count(), 1, "{seen:?}");
    assert_eq!(recorder.text(), "Let me search.It was released in May.", "{seen:?}");
}

/// The calls of a continued turn are numbered in the deltas as in the answer: the second
/// part's first call is call 1, after the first part's, where it was call 0 again; after a
/// restart in the second part, the first part's call is given again with its arguments.
#[tokio::test]
async fn the_calls_of_a_continued_turn_are_numbered_after_the_earlier_parts() {
    let (read, stat) = (json!({"path": "README.md"}), json!({"path": "src"}));
    let mut paused = vec![start(100)];
    paused.extend(call_block(0, "toolu_a", "fs__read", &read));
    paused.extend(stop("pause_turn", 20));
    let mut broken = vec![start(300)];
    broken.extend(call_block(0, "toolu_b", "fs__stat", &stat).into_iter().take(2));
    broken.push(overloaded());
    let mut done = vec![start(300)];
    done.extend(call_block(0, "toolu_b", "fs__stat", &stat));
    done.extend(stop("tool_use", 30));
    let (answer, requests, recorder) = streamed_turn(vec![paused, broken, done]).await;
    assert_eq!(requests, 3, "one continuation, tried twice");
    let ids: Vec<&str> = answer.tool_calls.iter().map(|call| call.id.as_str()).collect();
    assert_eq!(ids, ["toolu_a", "toolu_b"]);
    assert_eq!(answer.stop, StopReason::ToolUse);
    let seen = recorder.seen();
    // Tried or not, the second part's call is call 1.
    for (index, id, _) in calls(&seen) {
        assert_eq!(index, usize::from(id == "toolu_b"), "{seen:?}");
    }
    let restart = seen.iter().rposition(|s| *s == Seen::Restart).expect("a restart");
    assert_eq!(
        calls(&seen[restart..]),
        [(0, "toolu_a", "fs__read"), (1, "toolu_b", "fs__stat")],
        "{seen:?}"
    );
    // Each call's arguments as the deltas since the restart add them up.
    let arguments = |index: usize| -> String {
        seen[restart..]
            .iter()
            .filter_map(|s| match s {
                Seen::Arguments(i, fragment) if *i == index => Some(fragment.as_str()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(serde_json::from_str::<Value>(&arguments(0)).unwrap(), read, "{seen:?}");
    assert_eq!(serde_json::from_str::<Value>(&arguments(1)).unwrap(), stat, "{seen:?}");
}

/// Two parts of a continued turn that give their calls the same id: the deltas name the
/// second call as the answer does (renamed, so that its result names it alone), where they
/// gave both calls one id and disagreed with the answer.
#[tokio::test]
async fn a_call_renamed_in_a_continued_turn_is_streamed_renamed() {
    let (read, stat) = (json!({"path": "README.md"}), json!({"path": "src"}));
    let mut paused = vec![start(100)];
    paused.extend(call_block(0, "toolu_same", "fs__read", &read));
    paused.extend(stop("pause_turn", 20));
    let mut done = vec![start(300)];
    done.extend(call_block(0, "toolu_same", "fs__stat", &stat));
    done.extend(stop("tool_use", 30));
    let (answer, _, recorder) = streamed_turn(vec![paused, done]).await;
    let ids: Vec<&str> = answer.tool_calls.iter().map(|call| call.id.as_str()).collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], "toolu_same");
    assert_ne!(ids[1], "toolu_same");
    let seen = recorder.seen();
    let streamed: Vec<(usize, &str)> =
        calls(&seen).into_iter().map(|(index, id, _)| (index, id)).collect();
    assert_eq!(streamed, [(0, ids[0]), (1, ids[1])], "{seen:?}");
}

/// Streams one Anthropic turn whose requests are answered by `streams` in order, recording
/// its deltas: the answer, how many requests were made, and the recorder.
async fn streamed_turn(streams: Vec<Vec<Value>>) -> (ModelResponse, usize, Recorder) {
    let (base, bodies) = sse_script_server(streams).await;
    let model = toolmux_llm::connect("scripted", &config(Dialect::Anthropic, base)).unwrap();
    let recorder = Recorder::default();
    let answer = model
        .complete_streaming(&hello(), &CancellationToken::new(), &|d| recorder.take(d))
        .await
        .unwrap();
    let requests = bodies.lock().unwrap().len();
    (answer, requests, recorder)
}
