//! Ids given to calls that came without one: no two calls of a conversation share one,
//! whichever turn, model or API gave them, and ids the API gave are kept.

use super::*;
use std::collections::HashSet;

/// The ids of the calls and of the results in a chat completions request.
fn chat_ids(request: &Value) -> (Vec<String>, Vec<String>) {
    let messages = request["messages"].as_array().unwrap();
    let calls = messages
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    let results = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap().to_owned())
        .collect();
    (calls, results)
}

/// The ids of the calls in the assistant turns of `request`, in order.
fn assistant_call_ids(request: &ModelRequest) -> Vec<String> {
    let calls = request.messages.iter().filter_map(|m| match m {
        Message::Assistant { tool_calls, .. } => Some(tool_calls.iter().map(|c| c.id.clone())),
        _ => None,
    });
    calls.flatten().collect()
}

fn assert_distinct(ids: &[String], expected: usize) {
    assert_eq!(ids.len(), expected, "{ids:?}");
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), expected, "ids repeat: {ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("call_") && id.len() <= 24), "{ids:?}");
}

/// `turns` turns of calls of `model`, each answered, then one more request, which the
/// server answers whichever way; the conversation as sent last.
async fn turns_of_calls(model: &Arc<dyn Model>, turns: usize, streamed: bool) -> ModelRequest {
    let mut request = hello();
    for _ in 0..=turns {
        let answer = if streamed {
            model.complete_streaming(&request, &CancellationToken::new(), &|_| {}).await
        } else {
            model.complete(&request, &CancellationToken::new()).await
        };
        let Ok(answer) = answer else { break };
        if answer.tool_calls.is_empty() {
            break;
        }
        request.messages.push(answer.to_message());
        let results = answer.tool_calls.iter().map(|c| result(&c.id, "ok", false)).collect();
        request.messages.push(Message::Tool { results });
    }
    request
}

/// A chat completions server that never gives ids (some compatible servers): the second
/// turn's calls had the first's ids (`call_0`, `call_1`), and the conversation, carried on
/// by Anthropic's API or a strict server, was refused.
#[tokio::test]
async fn calls_without_ids_get_ids_no_other_turn_has() {
    let call = |path: &str| {
        json!({"type": "function", "function": {"name": "fs__read",
               "arguments": json!({"path": path}).to_string()}})
    };
    let answer = json!({"choices": [{"message": {"content": null,
        "tool_calls": [call("a"), call("b")]}, "finish_reason": "tool_calls"}]})
    .to_string();
    let (server, model) = serve(
        Dialect::OpenAi,
        vec![ScriptStep::Raw(answer.clone()), ScriptStep::Raw(answer), ScriptStep::text("done")],
    );
    turns_of_calls(&model, 2, false).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    let (calls, results) = chat_ids(&requests[2]);
    assert_distinct(&calls, 4);
    assert_eq!(calls, results, "each result names its call");
    // The index stays at the end, for whoever reads the ids.
    assert!(calls[0].ends_with("_0") && calls[1].ends_with("_1"), "{calls:?}");
}

/// The same streamed, from a chat completions server and from a messages server whose calls
/// come without ids; a given id is kept as it is.
#[tokio::test]
async fn streamed_calls_without_ids_get_ids_no_other_turn_has() {
    let part = |index: u64, id: Option<&str>| {
        let mut call = json!({"index": index, "type": "function",
                              "function": {"name": "fs__read", "arguments": "{}"}});
        if let Some(id) = id {
            call["id"] = json!(id);
        }
        json!({"model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [call]},
               "finish_reason": null}]})
    };
    let base = sse_server(vec![
        part(0, None),
        part(1, Some("given")),
        json!({"model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ])
    .await;
    let model =
        toolmux_llm::connect("sse", &config(Dialect::OpenAi, format!("{base}/v1"))).unwrap();
    let request = turns_of_calls(&model, 2, true).await;
    let ids = assistant_call_ids(&request);
    // Three turns of a call without an id and one with "given", which is kept as the API
    // gave it.
    let generated: Vec<String> = ids.iter().filter(|id| *id != "given").cloned().collect();
    assert_eq!(ids.iter().filter(|id| *id == "given").count(), 3, "{ids:?}");
    assert_distinct(&generated, 3);

    let base = sse_server(vec![
        json!({"type": "message_start", "message": {"model": "claude-x", "content": [],
               "usage": {"input_tokens": 9, "output_tokens": 0}}}),
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "tool_use", "id": "", "name": "fs__read", "input": {}}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}}),
        json!({"type": "message_stop"}),
    ])
    .await;
    let model = toolmux_llm::connect("sse", &config(Dialect::Anthropic, base)).unwrap();
    let request = turns_of_calls(&model, 2, true).await;
    let ids = assistant_call_ids(&request);
    assert_distinct(&ids, 3);
}

/// Calls a model writes in its text (`toolCalls: xml`) are numbered by their conversation,
/// past the ids it holds: the same conversation gives the same ids on any client, in any
/// process, where a counter of the process gave each client (and each test running beside
/// it) different ones, so that no replay repeated.
#[tokio::test]
async fn calls_read_from_text_are_numbered_by_their_conversation() {
    let block = |path: &str| {
        format!(
            "<tool>\n{}\n</tool>",
            json!({"server_name": "fs", "tool_name": "read", "arguments": {"path": path}})
        )
    };
    let ids_of = |request: &ModelRequest| assistant_call_ids(request);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let script = vec![
            ScriptStep::text(format!("Reading.\n{}\n{}", block("a"), block("b"))),
            ScriptStep::text(block("c")),
            ScriptStep::text("done"),
        ];
        let (_server, model) = serve_with(Dialect::OpenAi, script, |config| {
            config.tool_calls = Some(toolmux_llm::ToolCallFormat::Xml);
        });
        runs.push(ids_of(&turns_of_calls(&model, 2, false).await));
    }
    assert_eq!(runs[0], ["text-1", "text-2", "text-3"]);
    assert_eq!(runs[0], runs[1], "the same conversation, the same ids");

    // A conversation that already holds `text-2` (carried on from another run) gets ids it
    // does not hold.
    let (_server, model) = serve_with(
        Dialect::OpenAi,
        vec![ScriptStep::text(format!("{}\n{}", block("a"), block("b")))],
        |config| config.tool_calls = Some(toolmux_llm::ToolCallFormat::Xml),
    );
    let mut request = hello();
    request.messages.push(Message::Assistant {
        content: String::new(),
        tool_calls: vec![ModelToolCall::new("text-2", "fs__read", json!({"path": "z"}))],
        reasoning: None,
        blocks: None,
    });
    request.messages.push(Message::Tool { results: vec![result("text-2", "z", false)] });
    let answer = complete(&model, &request).await;
    let ids: Vec<&str> = answer.tool_calls.iter().map(|call| call.id.as_str()).collect();
    assert_eq!(ids, ["text-3", "text-4"]);
}
