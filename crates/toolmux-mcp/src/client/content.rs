//! MCP's tool descriptions and call results mapped whole into toolmux's vocabulary.
//!
//! Strings are moved, not copied, so a large result is held once while it is mapped.

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents, Tool};
use serde_json::{Value, json};
use std::sync::Arc;
use toolmux_core::{ContentPart, TaskSupport, ToolAnnotations, ToolOutput, ToolSpec};

use super::config::DeclaredTool;

/// A server's tool as a [`ToolSpec`] under the server's own name.
pub(crate) fn tool_spec(tool: Tool) -> ToolSpec {
    let mut annotations = mcp_defaults();
    let mut title = tool.title;
    if let Some(hints) = tool.annotations {
        annotations.read_only = hints.read_only_hint.unwrap_or(false);
        // MCP assumes a tool that writes is destructive unless it says otherwise.
        annotations.destructive = !annotations.read_only && hints.destructive_hint.unwrap_or(true);
        annotations.idempotent = hints.idempotent_hint.unwrap_or(false);
        annotations.open_world = hints.open_world_hint.unwrap_or(true);
        title = title.or(hints.title);
    }
    let mut input_schema =
        Arc::try_unwrap(tool.input_schema).unwrap_or_else(|shared| (*shared).clone());
    // Some servers omit `type` on argument-less tools; the vocabulary wants object schemas.
    input_schema.entry("type").or_insert_with(|| json!("object"));
    // Claude Code's size hint (anthropics/claude-code#47631): the server says how large its
    // results get; the orchestrator's cap follows it.
    let max_result_size = tool
        .meta
        .as_ref()
        .and_then(|meta| meta.0.get(MAX_RESULT_SIZE_META_KEY))
        .and_then(Value::as_u64)
        .and_then(|chars| usize::try_from(chars).ok())
        .filter(|&chars| chars > 0);
    annotations.task_support = match tool
        .meta
        .as_ref()
        .and_then(|meta| meta.0.get(crate::transport::TASK_SUPPORT_META_KEY))
        .and_then(Value::as_str)
    {
        Some("required") => TaskSupport::Required,
        Some("optional") => TaskSupport::Optional,
        _ => TaskSupport::Forbidden,
    };
    ToolSpec {
        name: tool.name.into_owned(),
        title,
        description: tool.description.map(|d| d.into_owned()).unwrap_or_default(),
        input_schema: Arc::new(Value::Object(input_schema)),
        output_schema: tool
            .output_schema
            .map(|s| Arc::new(Value::Object(Arc::try_unwrap(s).unwrap_or_else(|s| (*s).clone())))),
        annotations,
        max_result_size,
        time_limit: None,
        // Kept for the programs that show the tool (an MCP App's `ui.resourceUri`); the
        // size hint is served again from the spec's own field, and the task support the
        // transport noted is toolmux's, not the server's.
        meta: tool
            .meta
            .map(|mut meta| {
                meta.0.remove(crate::transport::TASK_SUPPORT_META_KEY);
                meta.0
            })
            .filter(|meta| !meta.is_empty())
            .map(Arc::new),
        icons: tool
            .icons
            .filter(|icons| !icons.is_empty())
            .and_then(|icons| serde_json::to_value(icons).ok())
            .map(Arc::new),
    }
}

/// The tool `_meta` key with which a server says how large its results get, in characters.
pub(crate) const MAX_RESULT_SIZE_META_KEY: &str = "anthropic/maxResultSizeChars";

/// What MCP assumes of a tool that gives no annotations: it writes, may destroy data, is
/// not idempotent and reaches the open world (the specification's defaults of
/// `readOnlyHint`, `destructiveHint`, `idempotentHint` and `openWorldHint`), so that a
/// `@destructive` rule catches a server's tool that does not say otherwise.
fn mcp_defaults() -> ToolAnnotations {
    ToolAnnotations {
        read_only: false,
        destructive: true,
        idempotent: false,
        open_world: true,
        ..ToolAnnotations::default()
    }
}

/// A tool declared in configuration as a [`ToolSpec`], with MCP's default annotations
/// until the server lists it.
pub(crate) fn declared_spec(tool: &DeclaredTool) -> ToolSpec {
    let schema = tool.input_schema.clone().unwrap_or_else(ToolSpec::any_object_schema);
    let mut spec = ToolSpec::new(tool.name.clone(), tool.description.clone(), schema)
        .with_annotations(mcp_defaults());
    spec.title = tool.title.clone();
    spec
}

/// A call result as a [`ToolOutput`]: every content block, structured content, the error
/// flag, and block annotations and `_meta` as extras.
pub(crate) fn tool_output(result: CallToolResult) -> ToolOutput {
    let mut output = ToolOutput {
        is_error: result.is_error.unwrap_or(false),
        structured: result.structured_content,
        ..ToolOutput::default()
    };
    let mut annotated = Vec::new();
    output.content.reserve(result.content.len());
    for (index, block) in result.content.into_iter().enumerate() {
        let (part, annotations) = content_part(block);
        if let Some(annotations) = annotations {
            annotated.push(json!({"index": index, "annotations": annotations}));
        }
        output.content.push(part);
    }
    if !annotated.is_empty() {
        output.extras.insert("annotations".into(), Value::Array(annotated));
    }
    if let Some(meta) = result.meta.and_then(|meta| serde_json::to_value(meta).ok()) {
        output.extras.insert("_meta".into(), meta);
    }
    output
}

fn content_part(block: ContentBlock) -> (ContentPart, Option<Value>) {
    let annotations =
        |a: Option<rmcp::model::Annotations>| a.and_then(|a| serde_json::to_value(a).ok());
    match block {
        ContentBlock::Text(t) => (ContentPart::Text { text: t.text }, annotations(t.annotations)),
        ContentBlock::Image(i) => (
            ContentPart::Image { data: i.data, mime_type: i.mime_type },
            annotations(i.annotations),
        ),
        ContentBlock::Audio(a) => (
            ContentPart::Audio { data: a.data, mime_type: a.mime_type },
            annotations(a.annotations),
        ),
        ContentBlock::Resource(r) => {
            let part = match r.resource {
                ResourceContents::TextResourceContents { uri, mime_type, text, .. } => {
                    ContentPart::Resource { uri, mime_type, text: Some(text), blob: None }
                }
                ResourceContents::BlobResourceContents { uri, mime_type, blob, .. } => {
                    ContentPart::Resource { uri, mime_type, text: None, blob: Some(blob) }
                }
                other => unknown(&other),
            };
            (part, annotations(r.annotations))
        }
        ContentBlock::ResourceLink(link) => (
            ContentPart::ResourceLink {
                uri: link.uri,
                name: link.name,
                description: link.description,
                mime_type: link.mime_type,
            },
            annotations(link.annotations),
        ),
        other => (unknown(&other), None),
    }
}

/// A kind of content newer than this code, passed on as JSON rather than dropped.
fn unknown(value: &impl serde::Serialize) -> ContentPart {
    ContentPart::Json { value: serde_json::to_value(value).unwrap_or(Value::Null) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn output(result: Value) -> String {
        let result: CallToolResult = serde_json::from_value(result).expect("a CallToolResult");
        serde_json::to_string_pretty(&tool_output(result)).expect("serializes")
    }

    /// MCP's defaults for hints a server leaves out: a tool writes destructively unless it
    /// says it only reads or only adds.
    #[test]
    fn missing_hints_take_mcp_s_defaults() {
        let tool = |annotations: Value| -> ToolAnnotations {
            let mut tool = json!({"name": "t", "inputSchema": {"type": "object"}});
            if !annotations.is_null() {
                tool["annotations"] = annotations;
            }
            tool_spec(serde_json::from_value(tool).expect("a tool")).annotations
        };
        let hints = |a: ToolAnnotations| (a.read_only, a.destructive, a.idempotent, a.open_world);
        assert_eq!(hints(tool(Value::Null)), (false, true, false, true), "no annotations");
        assert_eq!(hints(tool(json!({"readOnlyHint": false}))), (false, true, false, true));
        assert_eq!(hints(tool(json!({"destructiveHint": false}))), (false, false, false, true));
        assert_eq!(hints(tool(json!({"readOnlyHint": true}))), (true, false, false, true));
        let declared = DeclaredTool {
            name: "d".into(),
            title: None,
            description: String::new(),
            input_schema: None,
        };
        assert!(declared_spec(&declared).annotations.destructive, "declared until listed");
    }

    #[test]
    fn every_content_kind() {
        expect![[r#"
            {
              "content": [
                {
                  "type": "text",
                  "text": "hi"
                },
                {
                  "type": "image",
                  "data": "aGk=",
                  "mime_type": "image/png"
                },
                {
                  "type": "audio",
                  "data": "aGk=",
                  "mime_type": "audio/wav"
                },
                {
                  "type": "resource",
                  "uri": "demo://a",
                  "mime_type": "text/plain",
                  "text": "body"
                },
                {
                  "type": "resource",
                  "uri": "demo://b",
                  "blob": "AAE="
                },
                {
                  "type": "resource_link",
                  "uri": "demo://c",
                  "name": "c",
                  "description": "a link"
                }
              ],
              "structured": {
                "sum": 3
              },
              "is_error": true,
              "extras": {
                "annotations": [
                  {
                    "annotations": {
                      "audience": [
                        "user"
                      ],
                      "priority": 0.5
                    },
                    "index": 0
                  }
                ]
              }
            }"#]]
        .assert_eq(&output(json!({
            "content": [
                {"type": "text", "text": "hi", "annotations": {"audience": ["user"], "priority": 0.5}},
                {"type": "image", "data": "aGk=", "mimeType": "image/png"},
                {"type": "audio", "data": "aGk=", "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"uri": "demo://a", "mimeType": "text/plain", "text": "body"}},
                {"type": "resource", "resource": {"uri": "demo://b", "blob": "AAE="}},
                {"type": "resource_link", "uri": "demo://c", "name": "c", "description": "a link"}
            ],
            "structuredContent": {"sum": 3},
            "isError": true
        })));
    }

    #[test]
    fn tool_hints() {
        let tool: Tool = serde_json::from_value(json!({
            "name": "get-sum",
            "description": "Adds",
            "inputSchema": {"properties": {}},
            "annotations": {"title": "Sum", "readOnlyHint": true, "openWorldHint": false}
        }))
        .expect("a Tool");
        let spec = tool_spec(tool);
        expect![[r#"
            {
              "name": "get-sum",
              "title": "Sum",
              "description": "Adds",
              "inputSchema": {
                "properties": {},
                "type": "object"
              },
              "annotations": {
                "readOnly": true,
                "destructive": false,
                "idempotent": false,
                "openWorld": false,
                "endsTurn": false,
                "visible": true,
                "shown": true
              }
            }"#]]
        .assert_eq(&serde_json::to_string_pretty(&spec).expect("serializes"));
    }
}
