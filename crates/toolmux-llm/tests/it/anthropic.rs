//! Anthropic's messages on the wire: the request's JSON, alternation included, and the
//! answer's reading.

use super::*;
use toolmux_llm::{StopReason, ToolChoice, Usage};

#[tokio::test]
async fn a_text_answer() {
    let (server, model) = serve(Dialect::Anthropic, vec![ScriptStep::text("Hi there")]);
    let answer = complete(&model, &hello().continuing()).await;
    assert_eq!(answer.content, "Hi there");
    assert!(answer.tool_calls.is_empty());
    assert_eq!(answer.stop, StopReason::EndTurn);
    assert_eq!(answer.model, "test-model");
    assert_eq!(answer.usage.output_tokens, 10);
    assert!(answer.usage.input_tokens > 0);
    assert_eq!(
        only_request(&server),
        json!({
            "model": "test-model",
            "max_tokens": 4096,
            // The latest turn carries a prompt cache breakpoint (`promptCache`, default on),
            // so it goes as a block.
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Hello", "cache_control": {"type": "ephemeral"}},
            ]}],
        })
    );
}

/// Serves `script` to an Anthropic client without prompt cache breakpoints, to read the
/// conversation's shape alone.
fn serve_uncached(script: Vec<ScriptStep>) -> (ScriptedLlmServer, Arc<dyn Model>) {
    serve_with(Dialect::Anthropic, script, |c| c.prompt_cache = Some(false))
}

#[tokio::test]
async fn cache_breakpoints_mark_the_tools_the_system_prompt_and_the_latest_turn() {
    let mut request = conversation().continuing();
    request.tools = vec![
        ToolDefinition::new("fs__read", "Reads a file", json!({"type": "object"})),
        ToolDefinition::new("fs__grep", "Searches", json!({"type": "object"})),
    ];
    let (server, model) = serve(Dialect::Anthropic, vec![ScriptStep::text("ok")]);
    complete(&model, &request).await;
    let sent = only_request(&server);
    let mark = json!({"type": "ephemeral"});
    assert_eq!(
        sent["system"],
        json!([{"type": "text", "text": "Be brief.", "cache_control": mark}])
    );
    assert_eq!(sent["tools"][1]["cache_control"], mark);
    assert!(sent["tools"][0].get("cache_control").is_none());
    let messages = sent["messages"].as_array().expect("messages");
    let last = messages.last().expect("a turn")["content"].as_array().expect("blocks").clone();
    assert_eq!(last.last().expect("a block")["cache_control"], mark);
    // The API takes at most four breakpoints: toolmux sends three.
    assert_eq!(sent.to_string().matches("\"cache_control\"").count(), 3, "{sent}");

    let (server, model) = serve_uncached(vec![ScriptStep::text("ok")]);
    complete(&model, &request).await;
    let sent = only_request(&server);
    assert!(!sent.to_string().contains("cache_control"), "{sent}");
    assert_eq!(sent["system"], "Be brief.");

    // A one-off request (sampling) is not marked: nothing would read the cache it writes.
    request.continues = false;
    let (server, model) = serve(Dialect::Anthropic, vec![ScriptStep::text("ok")]);
    complete(&model, &request).await;
    assert!(!only_request(&server).to_string().contains("cache_control"));
}

#[tokio::test]
async fn cached_tokens_count_as_read_and_are_told_apart() {
    let answer = json!({"model": "claude-x", "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 12, "output_tokens": 5,
        "cache_read_input_tokens": 3000, "cache_creation_input_tokens": 400}});
    let (_server, model) = serve(Dialect::Anthropic, vec![ScriptStep::Raw(answer.to_string())]);
    let usage = complete(&model, &hello()).await.usage;
    assert_eq!(
        usage,
        Usage {
            input_tokens: 3412,
            output_tokens: 5,
            cache_read_tokens: 3000,
            cache_write_tokens: 400,
            estimated: false,
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_with_their_arguments_read() {
    let (_server, model) = serve(
        Dialect::Anthropic,
        vec![ScriptStep::TextAndToolCalls(
            "Let me look.".into(),
            vec![
                ("fs__read".into(), json!({"path": "README.md"})),
                ("fs__list".into(), json!({"dir": ".", "depth": 2})),
            ],
        )],
    );
    let answer = complete(&model, &hello()).await;
    assert_eq!(answer.content, "Let me look.");
    assert_eq!(answer.stop, StopReason::ToolUse);
    assert_eq!(
        answer.tool_calls,
        vec![
            ModelToolCall::new("call_1", "fs__read", json!({"path": "README.md"})),
            ModelToolCall::new("call_2", "fs__list", json!({"dir": ".", "depth": 2})),
        ]
    );
}

#[tokio::test]
async fn a_conversation_alternates_with_tool_results_merged_into_user_turns() {
    let (server, model) = serve_uncached(vec![ScriptStep::text("A tool plane.")]);
    complete(&model, &conversation()).await;
    let request = only_request(&server);
    assert_eq!(request["system"], "Be brief.");
    assert_eq!(request["max_tokens"], 4096);
    assert_eq!(
        request["messages"],
        json!([
            {"role": "user", "content": "Read the README"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "call_a", "name": "fs__read", "input": {"path": "README.md"}},
                {"type": "tool_use", "id": "call_b", "name": "fs__stat", "input": {"path": "x"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "# toolmux"},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "no such file: x",
                 "is_error": true},
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_c", "name": "fs__list", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_c", "content": "README.md"},
                {"type": "text", "text": "Now summarize it"},
            ]},
        ])
    );
}

#[tokio::test]
async fn consecutive_turns_of_one_role_merge_and_empty_ones_vanish() {
    let request = ModelRequest::new(vec![
        Message::user("One"),
        Message::user("Two"),
        Message::Assistant {
            content: String::new(),
            tool_calls: Vec::new(),
            reasoning: None,
            blocks: None,
        },
        Message::user("Three"),
        Message::assistant("Four"),
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ModelToolCall {
                raw_arguments: Some("[1,".into()),
                ..ModelToolCall::new("call_x", "t", Value::Null)
            }],
            reasoning: None,
            blocks: None,
        },
    ]);
    let (server, model) = serve_uncached(vec![ScriptStep::text("ok")]);
    complete(&model, &request).await;
    assert_eq!(
        only_request(&server)["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "One"},
                {"type": "text", "text": "Two"},
                {"type": "text", "text": "Three"},
            ]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Four"},
                // Arguments that were not an object go as an empty one.
                {"type": "tool_use", "id": "call_x", "name": "t", "input": {}},
            ]},
        ])
    );
}

/// The API refuses a text block that is empty or only whitespace ("text content blocks
/// must contain non-whitespace text"), which Claude's own answers may hold (`"\n\n"`
/// before its calls): such text is left out, and a blank tool result goes without content.
#[tokio::test]
async fn blank_text_is_left_out() {
    let request = ModelRequest::new(vec![
        Message::user("Look"),
        Message::Assistant {
            content: "\n\n".into(),
            tool_calls: vec![ModelToolCall::new("call_a", "fs__ls", json!({}))],
            reasoning: None,
            blocks: None,
        },
        Message::Tool { results: vec![result("call_a", " \n", false)] },
        Message::user("  "),
        Message::assistant("\n"),
        Message::user("(Your answer was empty.)"),
    ]);
    let (server, model) = serve_uncached(vec![ScriptStep::text("ok")]);
    complete(&model, &request).await;
    assert_eq!(
        only_request(&server)["messages"],
        json!([
            {"role": "user", "content": "Look"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_a", "name": "fs__ls", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a"},
                {"type": "text", "text": "(Your answer was empty.)"},
            ]},
        ])
    );
}

#[tokio::test]
async fn images_of_tool_results_go_as_image_blocks_in_the_tool_result() {
    let (server, model) = serve_uncached(vec![ScriptStep::text("A page.")]);
    complete(&model, &screenshots()).await;
    let png = json!({"type": "image", "source":
        {"type": "base64", "media_type": "image/png", "data": PNG}});
    let jpeg = json!({"type": "image", "source":
        {"type": "base64", "media_type": "image/jpeg", "data": PNG}});
    assert_eq!(
        only_request(&server)["messages"],
        json!([
            {"role": "user", "content": "Open the page"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_a", "name": "browser__screenshot", "input": {}},
                {"type": "tool_use", "id": "call_b", "name": "fs__read", "input": {"path": "notes"}},
                {"type": "tool_use", "id": "call_c", "name": "camera__snap", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": [
                    {"type": "text", "text": "Screenshot of the page\n\
                        [image image/svg+xml, 6 bytes: not shown: models read only jpeg, png, gif and webp images]"},
                    png,
                ]},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "no notes"},
                // No text, no text block: the API refuses an empty one.
                {"type": "tool_result", "tool_use_id": "call_c", "content": [jpeg, jpeg]},
                {"type": "text", "text": "What do you see?"},
            ]},
        ])
    );

    // A text-only model reads placeholders, and the result stays text.
    let (server, model) = serve_with(Dialect::Anthropic, vec![ScriptStep::text("ok")], |c| {
        c.prompt_cache = Some(false);
        c.images = Some(false);
    });
    complete(&model, &screenshots()).await;
    let sent = only_request(&server);
    let off = "not shown: the model is configured with `images: false`";
    assert_eq!(
        sent["messages"][2]["content"][2],
        json!({"type": "tool_result", "tool_use_id": "call_c", "content":
            format!("[image image/jpg, 8 bytes: {off}]\n[image image/jpeg, 8 bytes: {off}]")})
    );
    assert!(!sent.to_string().contains("\"base64\""), "{sent}");
}

#[tokio::test]
async fn tools_and_tool_choice() {
    let tools = vec![
        union_tool(),
        ToolDefinition::new("clock__now", "The time", json!({"type": "object"})),
    ];
    let choices = [
        (ToolChoice::Auto, json!({"type": "auto"})),
        (ToolChoice::Required, json!({"type": "any"})),
        (ToolChoice::None, json!({"type": "none"})),
        (ToolChoice::Tool("clock__now".into()), json!({"type": "tool", "name": "clock__now"})),
    ];
    let (server, model) =
        serve(Dialect::Anthropic, choices.iter().map(|_| ScriptStep::text("ok")).collect());
    for (choice, _) in &choices {
        let request = hello().with_tools(tools.clone()).with_tool_choice(choice.clone());
        complete(&model, &request).await;
    }
    let requests = server.requests();
    for ((_, expected), request) in choices.iter().zip(&requests) {
        assert_eq!(&request["tool_choice"], expected);
    }
    let sent = &requests[0]["tools"];
    assert_eq!(sent[0]["name"], "users__find");
    assert_eq!(sent[0]["description"], "Finds a user");
    let find = &sent[0]["input_schema"];
    assert_eq!(find["type"], "object");
    assert!(find.get("anyOf").is_none(), "{find}");
    assert_eq!(find["properties"]["id"], json!({"type": "integer"}));
    assert_eq!(find["properties"]["email"], json!({"type": "string"}));
    assert!(find["description"].as_str().unwrap().contains("`id`; or `email`"), "{find}");
    // Claude takes an object without `properties` as it is.
    assert_eq!(sent[1]["input_schema"], json!({"type": "object"}));
}

#[tokio::test]
async fn no_tools_no_tool_choice_and_the_limits_as_configured_or_asked() {
    let (server, model) =
        serve_with(Dialect::Anthropic, vec![ScriptStep::text("a"), ScriptStep::text("b")], |c| {
            c.max_tokens = Some(100);
            c.temperature = Some(0.5);
            c.prompt_cache = Some(false);
        });
    complete(&model, &hello().with_tool_choice(ToolChoice::Required)).await;
    let mut request = hello();
    request.max_tokens = Some(7);
    request.temperature = Some(1.0);
    complete(&model, &request).await;
    let requests = server.requests();
    assert_eq!(
        requests[0],
        json!({
            "model": "test-model",
            "max_tokens": 100,
            "temperature": 0.5,
            "messages": [{"role": "user", "content": "Hello"}],
        })
    );
    assert_eq!(requests[1]["max_tokens"], 7);
    assert_eq!(requests[1]["temperature"], 1.0);
}

#[tokio::test]
async fn the_key_goes_in_x_api_key_with_the_version() {
    let server = ScriptedLlmServer::start(Dialect::Anthropic, vec![ScriptStep::text("ok")]);
    let mut config = config(Dialect::Anthropic, format!("{}/", server.base_url()));
    config.headers.insert("anthropic-beta".into(), "tools-2024".into());
    let model = toolmux_llm::connect("scripted", &config).unwrap();
    complete(&model, &hello()).await;
    let headers = &server.request_headers()[0];
    assert_eq!(headers["x-api-key"], KEY);
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["anthropic-beta"], "tools-2024");
    assert!(!headers.contains_key("authorization"));
}

#[tokio::test]
async fn stop_reasons_and_blocks() {
    let answer = |stop: &str| {
        json!({"model": "claude-x", "content": [
            {"type": "thinking", "thinking": "hmm"},
            {"type": "text", "text": "one"},
            {"type": "text", "text": "two"},
        ], "stop_reason": stop, "usage": {"input_tokens": 3, "output_tokens": 4}})
        .to_string()
    };
    let (_server, model) = serve(
        Dialect::Anthropic,
        ["max_tokens", "refusal", "stop_sequence", "some_future_reason"]
            .map(|stop| ScriptStep::Raw(answer(stop)))
            .into(),
    );
    let first = complete(&model, &hello()).await;
    assert_eq!(first.content, "one\ntwo");
    assert_eq!(first.stop, StopReason::MaxTokens);
    assert_eq!(first.usage, Usage::new(3, 4));
    assert_eq!(first.model, "claude-x");
    assert_eq!(complete(&model, &hello()).await.stop, StopReason::ContentFilter);
    assert_eq!(complete(&model, &hello()).await.stop, StopReason::EndTurn);
    assert_eq!(
        complete(&model, &hello()).await.stop,
        StopReason::Other("some_future_reason".into())
    );
}

/// Parallel calls that share an id (Kimi's compatible API gives them one) are read with ids
/// of their own, which the API wants of every `tool_use` of a request.
#[tokio::test]
async fn calls_sharing_an_id_are_given_ids_of_their_own() {
    let call = |id: &str, path: &str| json!({"type": "tool_use", "id": id, "name": "fs__grep", "input": {"pattern": path}});
    let answer = json!({"content": [call("grep:3", "a"), call("grep:3", "b")],
                        "stop_reason": "tool_use"});
    let (_server, model) = serve(Dialect::Anthropic, vec![ScriptStep::Raw(answer.to_string())]);
    let answer = complete(&model, &hello()).await;
    let ids: Vec<&str> = answer.tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["grep:3", "grep:3_2"]);
    assert_eq!(answer.tool_calls[1].arguments, json!({"pattern": "b"}));
}

/// A tool name the model made up that the API would refuse back in the conversation goes
/// mended; names of tools offered go as they are.
#[tokio::test]
async fn made_up_tool_names_go_back_as_the_api_takes_them() {
    let (server, model) = serve(Dialect::Anthropic, vec![ScriptStep::text("ok")]);
    complete(&model, &made_up_calls()).await;
    let names: Vec<Value> = only_request(&server)["messages"][1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(names, made_up_names_on_the_wire());
}

/// An `input` a compatible server sent as the object's JSON text is read as the object.
#[tokio::test]
async fn an_input_encoded_as_text_is_read_as_its_object() {
    let answer = json!({"content": [{"type": "tool_use", "id": "c", "name": "fs__read",
        "input": json!({"path": "a"}).to_string()}], "stop_reason": "tool_use"});
    let (_server, model) = serve(Dialect::Anthropic, vec![ScriptStep::Raw(answer.to_string())]);
    let answer = complete(&model, &hello()).await;
    assert_eq!(answer.tool_calls[0].arguments, json!({"path": "a"}));
    assert_eq!(answer.tool_calls[0].raw_arguments, None);
}
