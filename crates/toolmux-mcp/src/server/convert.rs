//! From toolmux's vocabulary to MCP's wire types and back: specs to tools, outputs and
//! errors to `tools/call` results, prompts, resources, log lines, and the client's answers
//! to sampling and roots requests.
//!
//! rmcp's model types are non-exhaustive and lack constructors for many fields, so most
//! are built as their wire JSON and parsed; a value that does not parse is a bug here,
//! reported as an internal error rather than a panic.

use crate::client::wire;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::sync::Arc;
use toolmux_core::schema::{self, SchemaRules};
use toolmux_core::{
    ContentPart, LogLevel, Prompt, PromptSpec, ResourceBody, ResourceContents, ResourceSpec,
    ResourceTemplate, Role, Root, SamplingRequest, SamplingResponse, ToolError, ToolOutput,
    ToolSpec,
};

/// The MCP tool for `spec`, served as `name`, its input schema rewritten by `rules`.
pub(crate) fn tool(spec: &ToolSpec, name: &str, rules: &SchemaRules) -> Tool {
    let input = if rules.is_identity() {
        object_schema(&spec.input_schema)
    } else {
        object_schema(&schema::adapt(&spec.input_schema, rules))
    };
    let mut tool = Tool::new_with_raw(
        name.to_owned(),
        (!spec.description.is_empty()).then(|| spec.description.clone().into()),
        Arc::new(input),
    );
    tool.title = spec.title.clone();
    tool.output_schema = spec.output_schema.as_deref().map(|s| Arc::new(object_schema(s)));
    // The tool's metadata as its provider gave it, with the size cap in force, for
    // clients that size their own limits by it (Claude Code); no stale cap passed on.
    let mut meta = spec.meta.as_deref().cloned().unwrap_or_default();
    let cap_key = crate::client::content::MAX_RESULT_SIZE_META_KEY;
    match spec.max_result_size {
        Some(chars) => meta.insert(cap_key.to_owned(), json!(chars)),
        None => meta.remove(cap_key),
    };
    if !meta.is_empty() {
        tool.meta = Some(rmcp::model::MetaObject(meta));
    }
    // Icons that are not MCP's shape are left out rather than failing the listing.
    tool.icons = spec.icons.as_deref().and_then(|icons| serde_json::from_value(icons.clone()).ok());
    // Every hint is given explicitly: MCP's defaults (destructive) differ from toolmux's.
    let a = &spec.annotations;
    tool.annotations = Some(ToolAnnotations::from_raw(
        spec.title.clone(),
        Some(a.read_only),
        Some(a.destructive),
        Some(a.idempotent),
        Some(a.open_world),
    ));
    tool
}

/// A schema as the object MCP requires; a schema without a `type` is given
/// `"type": "object"`, and a schema that is not an object at all accepts any object.
fn object_schema(schema: &Value) -> JsonObject {
    match schema {
        Value::Object(map) => {
            let mut map = map.clone();
            map.entry("type").or_insert_with(|| json!("object"));
            map
        }
        _ => {
            let mut map = JsonObject::new();
            map.insert("type".into(), json!("object"));
            map
        }
    }
}

/// The `_meta` key under which a result carries the output's other extras: a shell
/// command's exit code, a REST call's status, the handle of an output the orchestrator
/// stored or the size of one it truncated, a file tool's line counts.
pub const EXTRAS_META_KEY: &str = "toolmux/extras";

/// The `tools/call` result for a tool's output. What an upstream MCP server attached to
/// its result and kept in the output's extras (content annotations, the result's `_meta`)
/// goes back on the wire; annotations only while the parts are still the server's own
/// (not replaced by a truncated or stored copy). Every other extra goes in the result's
/// `_meta` under [`EXTRAS_META_KEY`].
pub(crate) fn output(mut output: ToolOutput) -> CallToolResult {
    let mut content: Vec<ContentBlock> = Vec::with_capacity(output.content.len().max(1));
    for part in output.content {
        content.push(match part {
            ContentPart::Text { text } => ContentBlock::text(text),
            other => content_block(&other),
        });
    }
    // Structured content is also given as text for clients that read only `content`.
    if let (true, Some(structured)) = (content.is_empty(), &output.structured) {
        content.push(ContentBlock::text(structured.to_string()));
    }
    let replaced = output.extras.contains_key("capped") || output.extras.contains_key("spilled");
    if let (false, Some(Value::Array(annotated))) = (replaced, output.extras.remove("annotations"))
    {
        for entry in annotated {
            let index = entry.get("index").and_then(Value::as_u64);
            let block = index.and_then(|i| content.get_mut(usize::try_from(i).ok()?));
            if let (Some(block), Some(annotations)) = (block, entry.get("annotations")) {
                annotate(block, annotations);
            }
        }
    }
    let mut result = if output.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = output.structured;
    let mut meta = match output.extras.remove("_meta") {
        Some(Value::Object(meta)) => meta,
        _ => JsonObject::new(),
    };
    output.extras.remove("annotations");
    if !output.extras.is_empty() {
        meta.insert(EXTRAS_META_KEY.to_owned(), Value::Object(output.extras));
    }
    if !meta.is_empty() {
        result.meta = serde_json::from_value(Value::Object(meta)).ok();
    }
    result
}

/// Sets a block's annotations, through its wire JSON (rmcp's blocks are non-exhaustive);
/// annotations that do not parse are left off.
fn annotate(block: &mut ContentBlock, annotations: &Value) {
    let Ok(Value::Object(mut wire)) = serde_json::to_value(&*block) else { return };
    wire.insert("annotations".into(), annotations.clone());
    if let Ok(annotated) = serde_json::from_value(Value::Object(wire)) {
        *block = annotated;
    }
}

/// The `tools/call` result for a call that failed: the tool ran, or tried to, and the
/// caller should read why.
pub(crate) fn error(error: &ToolError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(error.report())])
}

/// One content block. The wire JSON is built and parsed, since rmcp's content types are
/// non-exhaustive and have no constructor for every field.
fn content_block(part: &ContentPart) -> ContentBlock {
    let value = match part {
        ContentPart::Text { text } => return ContentBlock::text(text.clone()),
        ContentPart::Json { value } => return ContentBlock::text(value.to_string()),
        ContentPart::Image { data, mime_type } => {
            return ContentBlock::image(data.clone(), mime_type.clone());
        }
        ContentPart::Audio { data, mime_type } => {
            return ContentBlock::audio(data.clone(), mime_type.clone());
        }
        ContentPart::Resource { uri, mime_type, text, blob } => {
            let mut resource = json!({"uri": uri});
            if let Some(mime) = mime_type {
                resource["mimeType"] = json!(mime);
            }
            match (text, blob) {
                (_, Some(blob)) if text.is_none() => resource["blob"] = json!(blob),
                (text, _) => resource["text"] = json!(text.as_deref().unwrap_or_default()),
            }
            json!({"type": "resource", "resource": resource})
        }
        ContentPart::ResourceLink { uri, name, description, mime_type } => {
            let mut link = json!({"type": "resource_link", "uri": uri, "name": name});
            if let Some(description) = description {
                link["description"] = json!(description);
            }
            if let Some(mime) = mime_type {
                link["mimeType"] = json!(mime);
            }
            link
        }
        other => return ContentBlock::text(as_text(other)),
    };
    serde_json::from_value(value).unwrap_or_else(|_| ContentBlock::text(as_text(part)))
}

/// A part as MCP content JSON (`{"type": "text", ...}`).
fn content_json(part: &ContentPart) -> Value {
    serde_json::to_value(content_block(part))
        .unwrap_or_else(|_| json!({"type": "text", "text": as_text(part)}))
}

fn role_json(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// Parses wire JSON into an rmcp type.
pub(crate) fn parse<T: DeserializeOwned>(value: Value) -> Result<T, rmcp::ErrorData> {
    serde_json::from_value(value).map_err(|e| {
        rmcp::ErrorData::internal_error(format!("cannot build the MCP result: {e}"), None)
    })
}

/// Parses the wire JSON of a whole result, marked complete (`resultType`, which the
/// 2026-07-28 revision requires and rmcp removes for older peers).
pub(crate) fn result<T: DeserializeOwned>(mut value: Value) -> Result<T, rmcp::ErrorData> {
    value["resultType"] = json!("complete");
    parse(value)
}

/// A `prompts/list` entry.
pub(crate) fn prompt(spec: &PromptSpec, name: &str) -> Value {
    let mut prompt = json!({"name": name});
    if let Some(title) = &spec.title {
        prompt["title"] = json!(title);
    }
    if let Some(description) = &spec.description {
        prompt["description"] = json!(description);
    }
    if !spec.arguments.is_empty() {
        prompt["arguments"] = spec
            .arguments
            .iter()
            .map(|a| {
                let mut arg = json!({"name": a.name, "required": a.required});
                if let Some(description) = &a.description {
                    arg["description"] = json!(description);
                }
                arg
            })
            .collect();
    }
    prompt
}

/// A `prompts/get` result.
pub(crate) fn prompt_result(prompt: Prompt) -> Value {
    let messages: Vec<Value> = prompt
        .messages
        .iter()
        .map(|m| json!({"role": role_json(m.role), "content": content_json(&m.content)}))
        .collect();
    let mut result = json!({"messages": messages});
    if let Some(description) = prompt.description {
        result["description"] = json!(description);
    }
    result
}

/// A `resources/list` entry.
pub(crate) fn resource(spec: &ResourceSpec) -> Value {
    let mut resource = json!({"uri": spec.uri, "name": spec.name});
    if let Some(title) = &spec.title {
        resource["title"] = json!(title);
    }
    if let Some(description) = &spec.description {
        resource["description"] = json!(description);
    }
    if let Some(mime) = &spec.mime_type {
        resource["mimeType"] = json!(mime);
    }
    if let Some(size) = spec.size {
        resource["size"] = json!(size);
    }
    resource
}

/// A `resources/templates/list` entry.
pub(crate) fn resource_template(template: &ResourceTemplate) -> Value {
    let mut entry = json!({"uriTemplate": template.uri_template, "name": template.name});
    if let Some(title) = &template.title {
        entry["title"] = json!(title);
    }
    if let Some(description) = &template.description {
        entry["description"] = json!(description);
    }
    if let Some(mime) = &template.mime_type {
        entry["mimeType"] = json!(mime);
    }
    entry
}

/// A `resources/read` result.
pub(crate) fn resource_contents(contents: Vec<ResourceContents>) -> Value {
    let contents: Vec<Value> = contents
        .into_iter()
        .map(|c| {
            let mut entry = json!({"uri": c.uri});
            if let Some(mime) = c.mime_type {
                entry["mimeType"] = json!(mime);
            }
            match c.body {
                ResourceBody::Text(text) => entry["text"] = json!(text),
                ResourceBody::Blob(blob) => entry["blob"] = json!(blob),
            }
            entry
        })
        .collect();
    json!({"contents": contents})
}

/// The `notifications/message` params of a log line.
#[expect(deprecated, reason = "logging is still part of every revision served")]
pub(crate) fn log_param(
    message: toolmux_core::LogMessage,
) -> Option<rmcp::model::LoggingMessageNotificationParam> {
    let mut param = json!({"level": message.level.as_str(), "data": message.data});
    if let Some(logger) = message.logger {
        param["logger"] = json!(logger);
    }
    serde_json::from_value(param).ok()
}

/// A log level from its MCP name (`warning`, ...).
pub(crate) fn log_level(value: &Value) -> Option<LogLevel> {
    serde_json::from_value(value.clone()).ok()
}

/// `sampling/createMessage` params for a request.
pub(crate) fn sampling_params(request: &SamplingRequest) -> Value {
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|m| json!({"role": role_json(m.role), "content": content_json(&m.content)}))
        .collect();
    let mut params = json!({"messages": messages, "maxTokens": request.max_tokens});
    if let Some(system) = &request.system_prompt {
        params["systemPrompt"] = json!(system);
    }
    if let Some(temperature) = request.temperature {
        params["temperature"] = json!(temperature);
    }
    if !request.stop_sequences.is_empty() {
        params["stopSequences"] = json!(request.stop_sequences);
    }
    if let Some(preferences) = &request.model_preferences {
        params["modelPreferences"] = preferences.clone();
    }
    params
}

/// The client's `sampling/createMessage` result.
pub(crate) fn sampling_response(value: Value) -> Result<SamplingResponse, String> {
    let role = match value.get("role").and_then(Value::as_str) {
        Some("user") => Role::User,
        _ => Role::Assistant,
    };
    // The content may be one block or, in newer revisions, an array of blocks.
    let content = match value.get("content").cloned() {
        Some(Value::Array(blocks)) if !blocks.is_empty() => wire::content_part(&blocks[0]),
        Some(block @ Value::Object(_)) => wire::content_part(&block),
        _ => return Err("the sampling result has no content".to_owned()),
    };
    Ok(SamplingResponse {
        role,
        content,
        model: value.get("model").and_then(Value::as_str).unwrap_or_default().to_owned(),
        stop_reason: value.get("stopReason").and_then(Value::as_str).map(str::to_owned),
    })
}

/// The client's `roots/list` result.
pub(crate) fn roots(value: Value) -> Result<Vec<Root>, String> {
    let Some(roots) = value.get("roots").and_then(Value::as_array) else {
        return Err("the roots result has no `roots` array".to_owned());
    };
    roots
        .iter()
        .map(|r| {
            let uri = r.get("uri").and_then(Value::as_str).ok_or("a root has no `uri`")?;
            let name = r.get("name").and_then(Value::as_str).map(str::to_owned);
            Ok(Root { uri: uri.to_owned(), name })
        })
        .collect()
}

/// A part as the text a model would read.
fn as_text(part: &ContentPart) -> String {
    ToolOutput { content: vec![part.clone()], ..ToolOutput::default() }.to_text()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};
    use toolmux_core::ToolAnnotations as Annotations;

    fn check_output(out: ToolOutput, expect: Expect) {
        let value = serde_json::to_value(output(out)).unwrap();
        expect.assert_eq(&serde_json::to_string_pretty(&value).unwrap());
    }

    #[test]
    fn every_content_part() {
        let out = ToolOutput {
            content: vec![
                ContentPart::Text { text: "hi".into() },
                ContentPart::Json { value: json!({"a": 1}) },
                ContentPart::Image { data: "aGk=".into(), mime_type: "image/png".into() },
                ContentPart::Audio { data: "aGk=".into(), mime_type: "audio/wav".into() },
                ContentPart::Resource {
                    uri: "file:///a.txt".into(),
                    mime_type: Some("text/plain".into()),
                    text: Some("alpha".into()),
                    blob: None,
                },
                ContentPart::Resource {
                    uri: "file:///b.bin".into(),
                    mime_type: None,
                    text: None,
                    blob: Some("AAE=".into()),
                },
                ContentPart::ResourceLink {
                    uri: "file:///c".into(),
                    name: "c".into(),
                    description: Some("the c file".into()),
                    mime_type: None,
                },
            ],
            ..ToolOutput::default()
        }
        .with_structured(json!({"n": 1}));
        check_output(
            out,
            expect![[r#"
                {
                  "content": [
                    {
                      "text": "hi",
                      "type": "text"
                    },
                    {
                      "text": "{\"a\":1}",
                      "type": "text"
                    },
                    {
                      "data": "aGk=",
                      "mimeType": "image/png",
                      "type": "image"
                    },
                    {
                      "data": "aGk=",
                      "mimeType": "audio/wav",
                      "type": "audio"
                    },
                    {
                      "resource": {
                        "mimeType": "text/plain",
                        "text": "alpha",
                        "uri": "file:///a.txt"
                      },
                      "type": "resource"
                    },
                    {
                      "resource": {
                        "blob": "AAE=",
                        "uri": "file:///b.bin"
                      },
                      "type": "resource"
                    },
                    {
                      "description": "the c file",
                      "name": "c",
                      "type": "resource_link",
                      "uri": "file:///c"
                    }
                  ],
                  "isError": false,
                  "resultType": "complete",
                  "structuredContent": {
                    "n": 1
                  }
                }"#]],
        );
    }

    #[test]
    fn error_outputs_and_errors_set_is_error() {
        check_output(
            ToolOutput::error("disk full"),
            expect![[r#"
                {
                  "content": [
                    {
                      "text": "disk full",
                      "type": "text"
                    }
                  ],
                  "isError": true,
                  "resultType": "complete"
                }"#]],
        );
        let failed = error(&ToolError::remote("t", "boom"));
        let value = serde_json::to_value(failed).unwrap();
        expect![[
            r#"{"content":[{"text":"boom","type":"text"}],"isError":true,"resultType":"complete"}"#
        ]]
        .assert_eq(&value.to_string());
    }

    #[test]
    fn an_upstream_result_goes_back_with_its_annotations_and_meta() {
        let wire = json!({
            "content": [
                {"type": "text", "text": "plain"},
                {"type": "text", "text": "for you", "annotations": {"audience": ["user"], "priority": 0.5}},
                {"type": "image", "data": "aGk=", "mimeType": "image/png", "annotations": {"priority": 1.0}}
            ],
            "_meta": {"example.com/trace": "abc"}
        });
        let upstream: CallToolResult = serde_json::from_value(wire.clone()).unwrap();
        let served = output(crate::client::content::tool_output(upstream));
        let mut value = serde_json::to_value(served).unwrap();
        assert_eq!(value["isError"], false);
        let object = value.as_object_mut().unwrap();
        object.remove("isError");
        object.remove("resultType");
        assert_eq!(value, wire);
    }

    #[test]
    fn annotations_stay_off_parts_the_gateway_replaced() {
        let upstream: CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "long", "annotations": {"priority": 1.0}}]
        }))
        .unwrap();
        let mut out = crate::client::content::tool_output(upstream);
        out.content = vec![ContentPart::Text { text: "lo[...]".into() }];
        out.extras.insert("capped".into(), json!({"bytes": 4, "omitted": 2}));
        let value = serde_json::to_value(output(out)).unwrap();
        assert_eq!(value["content"], json!([{"type": "text", "text": "lo[...]"}]));
    }

    #[test]
    fn other_extras_go_in_meta_beside_the_upstream_s() {
        let mut out = ToolOutput::text("ran").with_extra("exitCode", json!(2));
        out.extras.insert("_meta".into(), json!({"example.com/trace": "abc"}));
        check_output(
            out,
            expect![[r#"
                {
                  "_meta": {
                    "example.com/trace": "abc",
                    "toolmux/extras": {
                      "exitCode": 2
                    }
                  },
                  "content": [
                    {
                      "text": "ran",
                      "type": "text"
                    }
                  ],
                  "isError": false,
                  "resultType": "complete"
                }"#]],
        );
        // Annotations the gateway could not keep (their part was replaced) are not extras.
        let mut out = ToolOutput::text("lo[...]");
        out.extras.insert("annotations".into(), json!([{"index": 0, "annotations": {}}]));
        out.extras.insert("capped".into(), json!({"bytes": 4, "omitted": 2}));
        let value = serde_json::to_value(output(out)).unwrap();
        assert_eq!(
            value["_meta"],
            json!({"toolmux/extras": {"capped": {"bytes": 4, "omitted": 2}}})
        );
    }

    #[test]
    fn structured_only_outputs_also_carry_text() {
        let value = serde_json::to_value(output(ToolOutput::default().with_structured(json!([1]))))
            .unwrap();
        assert_eq!(value["content"][0]["text"], "[1]");
        assert_eq!(value["structuredContent"], json!([1]));
    }

    #[test]
    fn specs_become_tools_with_every_hint() {
        let spec = ToolSpec::new("read", "Reads a file", json!({"properties": {}}))
            .with_title("Read")
            .with_annotations(Annotations::read_only());
        let value = serde_json::to_value(tool(&spec, "fs__read", &SchemaRules::default())).unwrap();
        expect![[r#"{"annotations":{"destructiveHint":false,"idempotentHint":true,"openWorldHint":false,"readOnlyHint":true,"title":"Read"},"description":"Reads a file","inputSchema":{"properties":{},"type":"object"},"name":"fs__read","title":"Read"}"#]]
            .assert_eq(&value.to_string());
    }
}
