//! From toolmux's vocabulary to MCP's wire types: specs to tools, outputs and errors to
//! `tools/call` results.

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};
use std::sync::Arc;
use toolmux_core::{ContentPart, ToolError, ToolOutput, ToolSpec};

/// The MCP tool for `spec`, served as `name`.
pub(crate) fn tool(spec: &ToolSpec, name: &str) -> Tool {
    let mut tool = Tool::new_with_raw(
        name.to_owned(),
        (!spec.description.is_empty()).then(|| spec.description.clone().into()),
        Arc::new(object_schema(&spec.input_schema)),
    );
    tool.title = spec.title.clone();
    tool.output_schema = spec.output_schema.as_deref().map(|s| Arc::new(object_schema(s)));
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

/// The `tools/call` result for a tool's output.
pub(crate) fn output(output: ToolOutput) -> CallToolResult {
    let mut content: Vec<ContentBlock> = output.content.iter().map(content_block).collect();
    // Structured content is also given as text for clients that read only `content`.
    if let (true, Some(structured)) = (content.is_empty(), &output.structured) {
        content.push(ContentBlock::text(structured.to_string()));
    }
    let mut result = if output.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = output.structured;
    result
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
        let value = serde_json::to_value(tool(&spec, "fs__read")).unwrap();
        expect![[r#"{"annotations":{"destructiveHint":false,"idempotentHint":true,"openWorldHint":false,"readOnlyHint":true,"title":"Read"},"description":"Reads a file","inputSchema":{"properties":{},"type":"object"},"name":"fs__read","title":"Read"}"#]]
            .assert_eq(&value.to_string());
    }
}
