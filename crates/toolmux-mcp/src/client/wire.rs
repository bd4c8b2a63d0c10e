//! MCP's prompts, resources, log lines and server-to-client requests mapped to toolmux's
//! vocabulary, and the vocabulary's answers mapped back to MCP results.
//!
//! Values go through their wire JSON: rmcp's model types are non-exhaustive and change
//! shape between revisions (a sampling message's content is one block or, since
//! 2025-11-25, an array), while the JSON field names are the protocol's and stable.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use toolmux_core::{
    ContentPart, ElicitationRequest, ElicitationResponse, LogLevel, LogMessage, Message, Prompt,
    PromptArgument, PromptSpec, ResourceBody, ResourceContents, ResourceSpec, ResourceTemplate,
    Role, Root, SamplingRequest, SamplingResponse, ToolOutput,
};

/// The wire JSON of an rmcp value (`Null` if it cannot be serialized, which rmcp's model
/// types always can).
fn json_of(value: &impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn string(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// A listed prompt.
pub(crate) fn prompt_spec(prompt: &impl Serialize) -> PromptSpec {
    let value = json_of(prompt);
    let arguments = value
        .get("arguments")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| {
            Some(PromptArgument {
                name: string(a, "name")?,
                description: string(a, "description"),
                required: a.get("required").and_then(Value::as_bool).unwrap_or(false),
            })
        })
        .collect();
    PromptSpec {
        name: string(&value, "name").unwrap_or_default(),
        title: string(&value, "title"),
        description: string(&value, "description"),
        arguments,
    }
}

/// A rendered prompt (`prompts/get` result).
pub(crate) fn prompt(result: &impl Serialize) -> Prompt {
    let value = json_of(result);
    let messages = messages(&value);
    Prompt { description: string(&value, "description"), messages }
}

/// The `messages` of a prompt or sampling request; every content block becomes one
/// message, so a multi-block message is kept whole, in order.
fn messages(value: &Value) -> Vec<Message> {
    value
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|m| {
            let role = role(m.get("role"));
            blocks(m.get("content")).into_iter().map(move |content| Message { role, content })
        })
        .collect()
}

fn role(value: Option<&Value>) -> Role {
    match value.and_then(Value::as_str) {
        Some("assistant") => Role::Assistant,
        _ => Role::User,
    }
}

/// The content of a message: one block, or (newer revisions) an array of blocks.
fn blocks(value: Option<&Value>) -> Vec<ContentPart> {
    match value {
        Some(Value::Array(blocks)) => blocks.iter().map(content_part).collect(),
        Some(block @ Value::Object(_)) => vec![content_part(block)],
        _ => Vec::new(),
    }
}

/// One MCP content block; kinds toolmux has no part for are kept as JSON.
pub(crate) fn content_part(block: &Value) -> ContentPart {
    let text = |key: &str| string(block, key);
    match block.get("type").and_then(Value::as_str) {
        Some("text") => ContentPart::Text { text: text("text").unwrap_or_default() },
        Some("image") => ContentPart::Image {
            data: text("data").unwrap_or_default(),
            mime_type: text("mimeType").unwrap_or_default(),
        },
        Some("audio") => ContentPart::Audio {
            data: text("data").unwrap_or_default(),
            mime_type: text("mimeType").unwrap_or_default(),
        },
        Some("resource") => match block.get("resource") {
            Some(resource) => ContentPart::Resource {
                uri: string(resource, "uri").unwrap_or_default(),
                mime_type: string(resource, "mimeType"),
                text: string(resource, "text"),
                blob: string(resource, "blob"),
            },
            None => ContentPart::Json { value: block.clone() },
        },
        Some("resource_link") => ContentPart::ResourceLink {
            uri: text("uri").unwrap_or_default(),
            name: text("name").unwrap_or_default(),
            description: text("description"),
            mime_type: text("mimeType"),
        },
        _ => ContentPart::Json { value: block.clone() },
    }
}

/// A part as an MCP content block: text, image and audio as themselves, anything else as
/// the text a model would read.
pub(crate) fn content_block(part: &ContentPart) -> Value {
    match part {
        ContentPart::Text { text } => json!({"type": "text", "text": text}),
        ContentPart::Image { data, mime_type } => {
            json!({"type": "image", "data": data, "mimeType": mime_type})
        }
        ContentPart::Audio { data, mime_type } => {
            json!({"type": "audio", "data": data, "mimeType": mime_type})
        }
        other => {
            let text =
                ToolOutput { content: vec![other.clone()], ..ToolOutput::default() }.to_text();
            json!({"type": "text", "text": text})
        }
    }
}

/// A listed resource.
pub(crate) fn resource_spec(resource: &impl Serialize) -> ResourceSpec {
    let value = json_of(resource);
    ResourceSpec {
        uri: string(&value, "uri").unwrap_or_default(),
        name: string(&value, "name").unwrap_or_default(),
        title: string(&value, "title"),
        description: string(&value, "description"),
        mime_type: string(&value, "mimeType"),
        size: value.get("size").and_then(Value::as_u64),
    }
}

/// A listed resource template.
pub(crate) fn resource_template(template: &impl Serialize) -> ResourceTemplate {
    let value = json_of(template);
    ResourceTemplate {
        uri_template: string(&value, "uriTemplate").unwrap_or_default(),
        name: string(&value, "name").unwrap_or_default(),
        title: string(&value, "title"),
        description: string(&value, "description"),
        mime_type: string(&value, "mimeType"),
    }
}

/// The contents of a `resources/read` result; an entry with neither text nor blob is
/// empty text.
pub(crate) fn resource_contents(result: &impl Serialize) -> Vec<ResourceContents> {
    let value = json_of(result);
    value
        .get("contents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let body = match (string(c, "text"), string(c, "blob")) {
                (None, Some(blob)) => ResourceBody::Blob(blob),
                (text, _) => ResourceBody::Text(text.unwrap_or_default()),
            };
            ResourceContents {
                uri: string(c, "uri").unwrap_or_default(),
                mime_type: string(c, "mimeType"),
                body,
            }
        })
        .collect()
}

/// A log line from `notifications/message` params; an unknown level counts as info.
pub(crate) fn log_message(params: &impl Serialize) -> LogMessage {
    let value = json_of(params);
    let level = value
        .get("level")
        .and_then(|l| serde_json::from_value(l.clone()).ok())
        .unwrap_or(LogLevel::Info);
    LogMessage {
        level,
        logger: string(&value, "logger"),
        data: value.get("data").cloned().unwrap_or(Value::Null),
    }
}

/// A `sampling/createMessage` request. Every message block becomes one message, so a
/// multi-block message is kept whole, in order.
pub(crate) fn sampling_request(params: &impl Serialize, key: Option<String>) -> SamplingRequest {
    let value = json_of(params);
    let messages = messages(&value);
    let stop_sequences = value
        .get("stopSequences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect();
    SamplingRequest {
        key,
        messages,
        system_prompt: string(&value, "systemPrompt"),
        max_tokens: value
            .get("maxTokens")
            .and_then(Value::as_u64)
            .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        temperature: value.get("temperature").and_then(Value::as_f64),
        stop_sequences,
        model_preferences: value.get("modelPreferences").cloned(),
    }
}

/// The `sampling/createMessage` result for a completion.
pub(crate) fn sampling_result(response: &SamplingResponse) -> Value {
    let role = match response.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    let mut result = json!({
        "role": role,
        "content": content_block(&response.content),
        "model": response.model,
    });
    if let Some(reason) = &response.stop_reason {
        result["stopReason"] = json!(reason);
    }
    result
}

/// A form `elicitation/create` request.
pub(crate) fn elicitation_request(
    message: String,
    schema: &impl Serialize,
    key: Option<String>,
) -> ElicitationRequest {
    ElicitationRequest { key, message, requested_schema: json_of(schema) }
}

/// The `elicitation/create` result for an answer.
pub(crate) fn elicitation_result(response: &ElicitationResponse) -> Value {
    let mut result = json!({"action": response.action.to_string()});
    if let Some(content) = &response.content {
        result["content"] = Value::Object(content.clone());
    }
    result
}

/// The `roots/list` result for roots.
pub(crate) fn roots_result(roots: &[Root]) -> Value {
    let roots: Vec<Value> = roots
        .iter()
        .map(|r| match &r.name {
            Some(name) => json!({"uri": r.uri, "name": name}),
            None => json!({"uri": r.uri}),
        })
        .collect();
    json!({"roots": roots})
}

/// Parses wire JSON into an rmcp type, naming what failed.
pub(crate) fn parse<T: DeserializeOwned>(what: &str, value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| format!("cannot build the {what} result: {e}"))
}

#[cfg(test)]
#[expect(deprecated, reason = "the results of sampling and roots are checked by parsing them")]
mod tests {
    use super::*;
    use expect_test::expect;
    use toolmux_core::ElicitationAction;

    #[test]
    fn prompts_keep_their_arguments_and_every_message_block() {
        let spec = prompt_spec(&json!({
            "name": "args-prompt",
            "description": "A prompt with arguments",
            "arguments": [{"name": "city", "required": true}, {"name": "state"}]
        }));
        assert_eq!(spec.name, "args-prompt");
        assert_eq!(spec.arguments.len(), 2);
        assert!(spec.arguments[0].required && !spec.arguments[1].required);
        let rendered = prompt(&json!({
            "description": "d",
            "messages": [
                {"role": "user", "content": {"type": "text", "text": "hi"}},
                {"role": "assistant", "content": [
                    {"type": "image", "data": "aGk=", "mimeType": "image/png"},
                    {"type": "resource", "resource": {"uri": "a://b", "blob": "AAE="}}
                ]}
            ]
        }));
        expect![[r#"Prompt { description: Some("d"), messages: [Message { role: User, content: Text { text: "hi" } }, Message { role: Assistant, content: Image { data: "aGk=", mime_type: "image/png" } }, Message { role: Assistant, content: Resource { uri: "a://b", mime_type: None, text: None, blob: Some("AAE=") } }] }"#]]
        .assert_eq(&format!("{rendered:?}"));
    }

    #[test]
    fn resources_templates_and_contents() {
        let spec = resource_spec(&json!({
            "uri": "demo://resource/static/document/architecture.md",
            "name": "architecture.md",
            "mimeType": "text/markdown",
            "size": 12
        }));
        assert_eq!(spec.mime_type.as_deref(), Some("text/markdown"));
        assert_eq!(spec.size, Some(12));
        let template = resource_template(&json!({"uriTemplate": "demo://{id}", "name": "t"}));
        assert_eq!(template.uri_template, "demo://{id}");
        let contents = resource_contents(&json!({"contents": [
            {"uri": "a://t", "mimeType": "text/plain", "text": "x"},
            {"uri": "a://b", "blob": "AAE="},
            {"uri": "a://e"}
        ]}));
        assert_eq!(contents[0], ResourceContents::text("a://t", "text/plain", "x"));
        assert_eq!(contents[1].body, ResourceBody::Blob("AAE=".into()));
        assert_eq!(contents[2].body, ResourceBody::Text(String::new()));
    }

    #[test]
    fn sampling_round_trips() {
        let request = sampling_request(
            &json!({
                "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                "systemPrompt": "be brief",
                "maxTokens": 100,
                "temperature": 0.7,
                "stopSequences": ["\n"]
            }),
            None,
        );
        assert_eq!(request.messages, vec![Message::user_text("hi")]);
        assert_eq!(request.system_prompt.as_deref(), Some("be brief"));
        assert_eq!((request.max_tokens, request.temperature), (100, Some(0.7)));
        let result = sampling_result(&SamplingResponse {
            role: Role::Assistant,
            content: ContentPart::Text { text: "hello".into() },
            model: "m".into(),
            stop_reason: Some("endTurn".into()),
        });
        expect![[r#"{"content":{"text":"hello","type":"text"},"model":"m","role":"assistant","stopReason":"endTurn"}"#]]
        .assert_eq(&result.to_string());
        let parsed: rmcp::model::CreateMessageResult = parse("sampling", result).unwrap();
        assert_eq!(parsed.model, "m");
    }

    #[test]
    fn elicitation_roots_and_log_lines() {
        let mut content = toolmux_core::JsonObject::new();
        content.insert("name".into(), json!("Ada"));
        let answer =
            ElicitationResponse { action: ElicitationAction::Accept, content: Some(content) };
        let parsed: rmcp::model::ElicitResult =
            parse("elicitation", elicitation_result(&answer)).unwrap();
        assert_eq!(parsed.content, Some(json!({"name": "Ada"})));
        let roots = roots_result(&[
            Root { uri: "file:///w".into(), name: Some("w".into()) },
            Root { uri: "file:///v".into(), name: None },
        ]);
        let parsed: rmcp::model::ListRootsResult = parse("roots", roots).unwrap();
        assert_eq!(parsed.roots.len(), 2);
        let line = log_message(&json!({"level": "warning", "logger": "srv", "data": {"n": 1}}));
        assert_eq!(line.level, LogLevel::Warning);
        assert_eq!(line.logger.as_deref(), Some("srv"));
        assert_eq!(line.data, json!({"n": 1}));
    }
}
