//! Chat completions on the wire: the request's JSON and the answer's reading.

use super::*;
use toolmux_llm::{StopReason, ToolChoice, Usage};

#[tokio::test]
async fn a_text_answer() {
    let (server, model) = serve(Dialect::OpenAi, vec![ScriptStep::text("Hi there")]);
    let answer = complete(&model, &hello()).await;
    assert_eq!(answer.content, "Hi there");
    assert!(answer.tool_calls.is_empty());
    assert_eq!(answer.stop, StopReason::EndTurn);
    assert_eq!(answer.model, "test-model");
    assert_eq!(answer.usage.output_tokens, 10);
    assert!(answer.usage.input_tokens > 0);
    assert_eq!(model.name(), "scripted");
    assert_eq!(
        only_request(&server),
        json!({
            "model": "test-model",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4096,
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_with_their_arguments_read() {
    let (_server, model) = serve(
        Dialect::OpenAi,
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
async fn a_conversation_with_tool_results_on_the_wire() {
    let (server, model) = serve(Dialect::OpenAi, vec![ScriptStep::text("It is a tool plane.")]);
    complete(&model, &conversation()).await;
    let request = only_request(&server);
    assert_eq!(
        request["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Read the README"},
            {"role": "assistant", "content": "Reading it.", "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "fs__read", "arguments": "{\"path\":\"README.md\"}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "fs__stat", "arguments": "{\"path\":\"x\"}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "# toolmux"},
            {"role": "tool", "tool_call_id": "call_b", "content": "no such file: x"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_c", "type": "function",
                 "function": {"name": "fs__list", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_c", "content": "README.md"},
            {"role": "user", "content": "Now summarize it"},
        ])
    );
}

#[tokio::test]
async fn images_of_tool_results_follow_the_turns_tool_messages_in_a_user_message() {
    let (server, model) = serve(Dialect::OpenAi, vec![ScriptStep::text("A page.")]);
    complete(&model, &screenshots()).await;
    let png = format!("data:image/png;base64,{PNG}");
    let jpeg = format!("data:image/jpeg;base64,{PNG}");
    assert_eq!(
        only_request(&server)["messages"],
        json!([
            {"role": "user", "content": "Open the page"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "browser__screenshot", "arguments": "{}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "fs__read", "arguments": "{\"path\":\"notes\"}"}},
                {"id": "call_c", "type": "function",
                 "function": {"name": "camera__snap", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "Screenshot of the page\n\
                [image image/svg+xml, 6 bytes: not shown: models read only jpeg, png, gif and webp images]"},
            {"role": "tool", "tool_call_id": "call_b", "content": "no notes"},
            {"role": "tool", "tool_call_id": "call_c", "content": ""},
            {"role": "user", "content": [
                {"type": "text", "text": "The image returned by tool call `call_a`:"},
                {"type": "image_url", "image_url": {"url": png}},
                {"type": "text", "text": "The images returned by tool call `call_c`:"},
                {"type": "image_url", "image_url": {"url": jpeg}},
                {"type": "image_url", "image_url": {"url": jpeg}},
            ]},
            {"role": "user", "content": "What do you see?"},
        ])
    );
}

#[tokio::test]
async fn a_model_configured_without_images_reads_placeholders() {
    let (server, model) =
        serve_with(Dialect::OpenAi, vec![ScriptStep::text("ok")], |c| c.images = Some(false));
    complete(&model, &screenshots()).await;
    let sent = only_request(&server);
    let messages = sent["messages"].as_array().unwrap();
    let off = "not shown: the model is configured with `images: false`";
    assert_eq!(
        messages[2]["content"],
        format!(
            "Screenshot of the page\n[image image/png, 8 bytes: {off}]\n\
             [image image/svg+xml, 6 bytes: not shown: models read only jpeg, png, gif and webp images]"
        )
    );
    assert_eq!(
        messages[4]["content"],
        format!("[image image/jpg, 8 bytes: {off}]\n[image image/jpeg, 8 bytes: {off}]")
    );
    assert_eq!(messages.len(), 6, "no user message of images: {sent}");
    assert!(!sent.to_string().contains("image_url"), "{sent}");
}

#[tokio::test]
async fn arguments_that_were_not_json_go_back_as_written() {
    let mut request = hello();
    request.messages.push(Message::Assistant {
        content: String::new(),
        tool_calls: vec![ModelToolCall {
            raw_arguments: Some("{\"path\": ".into()),
            ..ModelToolCall::new("call_x", "fs__read", Value::Null)
        }],
        reasoning: None,
        blocks: None,
    });
    request.messages.push(Message::Tool {
        results: vec![result("call_x", "the arguments are not JSON", true)],
    });
    let (server, model) = serve(Dialect::OpenAi, vec![ScriptStep::text("ok")]);
    complete(&model, &request).await;
    let sent = only_request(&server);
    assert_eq!(sent["messages"][1]["tool_calls"][0]["function"]["arguments"], "{\"path\": ");
}

#[tokio::test]
async fn tools_and_tool_choice() {
    let tools = vec![
        union_tool(),
        ToolDefinition::new("clock__now", "The time", json!({"type": "object"})),
    ];
    let choices = [
        (ToolChoice::Auto, json!("auto")),
        (ToolChoice::Required, json!("required")),
        (ToolChoice::None, json!("none")),
        (
            ToolChoice::Tool("clock__now".into()),
            json!({"type": "function", "function": {"name": "clock__now"}}),
        ),
    ];
    let (server, model) =
        serve(Dialect::OpenAi, choices.iter().map(|_| ScriptStep::text("ok")).collect());
    for (choice, _) in &choices {
        let request = hello().with_tools(tools.clone()).with_tool_choice(choice.clone());
        complete(&model, &request).await;
    }
    let requests = server.requests();
    for ((_, expected), request) in choices.iter().zip(&requests) {
        assert_eq!(&request["tool_choice"], expected);
    }
    let sent = &requests[0]["tools"];
    assert_eq!(sent[0]["type"], "function");
    assert_eq!(sent[0]["function"]["name"], "users__find");
    assert_eq!(sent[0]["function"]["description"], "Finds a user");
    let find = &sent[0]["function"]["parameters"];
    assert_eq!(find["type"], "object");
    assert!(find.get("anyOf").is_none(), "{find}");
    assert_eq!(find["properties"]["id"], json!({"type": "integer"}));
    assert_eq!(find["properties"]["email"], json!({"type": "string"}));
    assert!(find["description"].as_str().unwrap().contains("`id`; or `email`"), "{find}");
    // OpenAI wants `properties` on every object.
    assert_eq!(sent[1]["function"]["parameters"], json!({"type": "object", "properties": {}}));
}

#[tokio::test]
async fn no_tools_no_tool_choice_and_the_limits_as_configured_or_asked() {
    let (server, model) =
        serve_with(Dialect::OpenAi, vec![ScriptStep::text("a"), ScriptStep::text("b")], |c| {
            c.max_tokens = Some(100);
            c.temperature = Some(0.5);
        });
    complete(&model, &hello().with_tool_choice(ToolChoice::Required)).await;
    let mut request = hello();
    request.max_tokens = Some(7);
    request.temperature = Some(0.0);
    complete(&model, &request).await;
    let requests = server.requests();
    assert_eq!(
        requests[0],
        json!({
            "model": "test-model",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 100,
            "temperature": 0.5,
        })
    );
    assert_eq!(requests[1]["max_tokens"], 7);
    assert_eq!(requests[1]["temperature"], 0.0);
}

#[tokio::test]
async fn the_key_goes_as_a_bearer_token_with_the_extra_headers() {
    let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![ScriptStep::text("ok")]);
    let mut config = config(Dialect::OpenAi, format!("{}/", server.base_url()));
    config.headers.insert("X-Team".into(), "tools".into());
    let model = toolmux_llm::connect("scripted", &config).unwrap();
    complete(&model, &hello()).await;
    let headers = &server.request_headers()[0];
    assert_eq!(headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["x-team"], "tools");
    assert!(headers["user-agent"].starts_with("toolmux/"));
}

#[tokio::test]
async fn no_key_no_authorization() {
    let (server, model) = serve_with(Dialect::OpenAi, vec![ScriptStep::text("ok")], |c| {
        c.api_key = None;
    });
    complete(&model, &hello()).await;
    assert!(!server.request_headers()[0].contains_key("authorization"));
}

#[tokio::test]
async fn arguments_that_are_not_json_are_kept_raw() {
    let (_server, model) = serve(
        Dialect::OpenAi,
        vec![
            ScriptStep::RawToolCall {
                name: "fs__read".into(),
                raw_arguments: "{\"path\": ".into(),
            },
            ScriptStep::RawToolCall { name: "clock__now".into(), raw_arguments: String::new() },
        ],
    );
    let answer = complete(&model, &hello()).await;
    let call = &answer.tool_calls[0];
    assert_eq!((call.id.as_str(), call.name.as_str()), ("call_1", "fs__read"));
    assert_eq!(call.arguments, Value::Null);
    assert_eq!(call.raw_arguments.as_deref(), Some("{\"path\": "));
    // Empty arguments are no arguments.
    let answer = complete(&model, &hello()).await;
    assert_eq!(answer.tool_calls[0].arguments, json!({}));
    assert_eq!(answer.tool_calls[0].raw_arguments, None);
}

#[tokio::test]
async fn finish_reasons_and_content_forms() {
    let answer = |finish: &str| {
        json!({"model": "m", "choices": [{"message": {"role": "assistant", "content": "x"},
               "finish_reason": finish}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
        .to_string()
    };
    let (_server, model) = serve(
        Dialect::OpenAi,
        vec![
            ScriptStep::Raw(answer("length")),
            ScriptStep::Raw(answer("content_filter")),
            ScriptStep::Raw(answer("function_call")),
            ScriptStep::Raw(answer("weird")),
            // No usage and a null content: still an answer.
            ScriptStep::Raw(
                json!({"choices": [{"message": {"content": null}, "finish_reason": "stop"}]})
                    .to_string(),
            ),
        ],
    );
    let first = complete(&model, &hello()).await;
    assert_eq!(first.stop, StopReason::MaxTokens);
    assert_eq!(first.usage, Usage::new(3, 4));
    assert_eq!(first.model, "m");
    assert_eq!(complete(&model, &hello()).await.stop, StopReason::ContentFilter);
    assert_eq!(complete(&model, &hello()).await.stop, StopReason::ToolUse);
    assert_eq!(complete(&model, &hello()).await.stop, StopReason::Other("weird".into()));
    let last = complete(&model, &hello()).await;
    assert_eq!(last.content, "");
    // No usage reported: estimated from the request's length, never taken for free.
    assert!(last.usage.estimated, "{:?}", last.usage);
    assert!(last.usage.input_tokens > 0, "{:?}", last.usage);
    assert!(!first.usage.estimated, "reported figures are no estimate");
}

#[tokio::test]
async fn cached_prompt_tokens_are_read_from_the_details_and_nothing_is_marked() {
    let answer = json!({"model": "m", "choices": [{"message": {"content": "ok"},
        "finish_reason": "stop"}], "usage": {"prompt_tokens": 2100, "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 2048}}});
    let (server, model) = serve(Dialect::OpenAi, vec![ScriptStep::Raw(answer.to_string())]);
    let usage = complete(&model, &hello()).await.usage;
    assert_eq!(usage, Usage { cache_read_tokens: 2048, ..Usage::new(2100, 7) });
    // OpenAI caches by itself: no breakpoints are sent.
    assert!(!only_request(&server).to_string().contains("cache_control"));
}

/// Parallel calls that share an id (DeepSeek's and GLM's servers give them one) are read
/// with ids of their own, so that each result names its call; an empty id is numbered.
#[tokio::test]
async fn calls_sharing_an_id_are_given_ids_of_their_own() {
    let call = |id: &str, path: &str| {
        json!({"id": id, "type": "function",
               "function": {"name": "fs__read", "arguments": json!({"path": path}).to_string()}})
    };
    let answer = json!({"choices": [{"message": {"content": null, "tool_calls": [
        call("call_0", "a"), call("call_0", "b"), call("", "c"), call("call_0_2", "d"),
    ]}, "finish_reason": "tool_calls"}]});
    let (_server, model) = serve(Dialect::OpenAi, vec![ScriptStep::Raw(answer.to_string())]);
    let answer = complete(&model, &hello()).await;
    let calls: Vec<(&str, &Value)> =
        answer.tool_calls.iter().map(|c| (c.id.as_str(), &c.arguments["path"])).collect();
    // The call without an id gets one of this answer's own (`call_{token}_{index}`).
    let generated = calls[2].0;
    assert!(generated.starts_with("call_") && generated.ends_with("_2"), "{generated}");
    assert_eq!(
        calls,
        [
            ("call_0", &json!("a")),
            ("call_0_2", &json!("b")),
            (generated, &json!("c")),
            ("call_0_2_2", &json!("d")),
        ]
    );
}

/// A tool name the model made up that the API would refuse back in the conversation
/// (`multi_tool_use.parallel`, an empty name) goes mended, so that the request after the
/// agent's "unknown tool" answer is taken; names of tools offered go as they are.
#[tokio::test]
async fn made_up_tool_names_go_back_as_the_api_takes_them() {
    let (server, model) = serve(Dialect::OpenAi, vec![ScriptStep::text("ok")]);
    complete(&model, &made_up_calls()).await;
    let names: Vec<Value> = only_request(&server)["messages"][1]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["function"]["name"].clone())
        .collect();
    assert_eq!(names, made_up_names_on_the_wire());
}

/// Arguments a server encoded twice (a JSON string of the object's text, as some
/// compatible servers send) are read as the object; a string that is no object's text
/// stays what it is.
#[tokio::test]
async fn arguments_encoded_twice_are_read_as_their_object() {
    let call = |arguments: Value| {
        json!({"choices": [{"message": {"tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "fs__read", "arguments": arguments.to_string()}}]},
            "finish_reason": "tool_calls"}]})
        .to_string()
    };
    let (_server, model) = serve(
        Dialect::OpenAi,
        vec![
            ScriptStep::Raw(call(json!(json!({"path": "a"}).to_string()))),
            ScriptStep::Raw(call(json!("a.md"))),
        ],
    );
    let answer = complete(&model, &hello()).await;
    assert_eq!(answer.tool_calls[0].arguments, json!({"path": "a"}));
    let answer = complete(&model, &hello()).await;
    assert_eq!(answer.tool_calls[0].arguments, json!("a.md"));
}

/// An OpenAI reasoning model served elsewhere than OpenAI (an Azure deployment, a proxy):
/// a request with `max_tokens` is refused as OpenAI refuses it, one with
/// `max_completion_tokens` is answered `text`.
fn refusing_max_tokens(text: &'static str) -> ScriptStep {
    const REFUSAL: &str = r#"{"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}"#;
    ScriptStep::callback(move |request| match request.get("max_tokens") {
        Some(_) => ScriptStep::status(400, REFUSAL),
        None => ScriptStep::text(text),
    })
}

/// A server that refuses `max_tokens` asking for `max_completion_tokens` is asked again
/// with that, and the client remembers it for its next requests, streamed or not, where
/// every request to a server other than OpenAI's own failed with the 400.
#[tokio::test]
async fn an_api_that_wants_max_completion_tokens_is_asked_again_with_it_from_then_on() {
    for stream in [false, true] {
        let script = vec![
            refusing_max_tokens("never sent"),
            refusing_max_tokens("first answer"),
            refusing_max_tokens("second answer"),
        ];
        let (server, model) = serve_with(Dialect::OpenAi, script, |c| c.stream = Some(stream));
        let cancel = CancellationToken::new();
        let answer = model.complete_streaming(&hello(), &cancel, &|_| {}).await;
        assert_eq!(answer.unwrap().content, "first answer", "stream {stream}");
        let answer = model.complete(&hello(), &cancel).await;
        assert_eq!(answer.unwrap().content, "second answer", "stream {stream}");
        let limits: Vec<(bool, Value)> = server
            .requests()
            .iter()
            .map(|r| (r.get("max_tokens").is_some(), r["max_completion_tokens"].clone()))
            .collect();
        assert_eq!(limits, [(true, Value::Null), (false, json!(4096)), (false, json!(4096))]);
    }
}
