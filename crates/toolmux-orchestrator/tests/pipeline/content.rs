//! Content normalized for every provider: image and audio parts a model API refuses,
//! error results without a message, structured content that is not an object.

use crate::start;
use expect_test::expect;
use serde_json::json;
use std::sync::Arc;
use toolmux_core::{CallContext, ContentPart, ToolOutput, ToolSpec};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig};
use toolmux_test_support::mock::{Behavior, MockProvider};

/// A PNG header declaring 2147483647 × 2147483647 pixels, base64.
const HUGE_PNG: &str = "iVBORw0KGgoAAAANSUhEUn////9/////CAIAAAA=";
/// A PNG header declaring 800 × 600 pixels, base64.
const PNG_800X600: &str = "iVBORw0KGgoAAAANSUhEUgAAAyAAAAJYCAIAAAA=";

async fn output_of(o: &Orchestrator, tool: &str) -> ToolOutput {
    o.call_tool(tool, json!({}), &CallContext::new()).await.expect("an output")
}

fn texts(output: &ToolOutput) -> String {
    let parts = output.content.iter().map(|part| match part {
        ContentPart::Text { text } => text.clone(),
        other => format!("{other:?}"),
    });
    parts.collect::<Vec<_>>().join("\n")
}

/// Image and audio parts with data that is not base64, empty data, a MIME type of another
/// kind or a header declaring an absurd size each become a text note saying what was
/// wrong; valid ones pass, and the annotations of the parts left out go.
#[tokio::test(start_paused = true)]
async fn media_parts_a_model_api_refuses_become_notes() {
    let image =
        |data: &str, mime: &str| ContentPart::Image { data: data.into(), mime_type: mime.into() };
    let output = ToolOutput {
        content: vec![
            image("!!!notbase64$$$", "image/png"),
            image("", "text/html"),
            image(HUGE_PNG, "image/png"),
            ContentPart::Audio { data: "zz".into(), mime_type: "audio/wav".into() },
            image(PNG_800X600, "image/png"),
            ContentPart::Text { text: "tail".into() },
        ],
        ..ToolOutput::default()
    }
    .with_extra(
        "annotations",
        json!([{"index": 0, "annotations": {"priority": 1.0}},
               {"index": 4, "annotations": {"priority": 0.5}}]),
    );
    let p = Arc::new(MockProvider::new("m").with_tool("shot", Behavior::Output(output)));
    let o = start(OrchestratorConfig::default(), vec![p]).await;
    let out = output_of(&o, "m__shot").await;
    expect![[r#"
        [image left out: its data is not base64: `!` at byte 0 is no base64 character; model APIs refuse such a part, so `m__shot` should be fixed to send a valid one]
        [image left out: its mimeType `text/html` is not an image type, and its data is empty; model APIs refuse such a part, so `m__shot` should be fixed to send a valid one]
        [image left out: its header declares 2147483647 × 2147483647 pixels, over 100000 a side; model APIs refuse such a part, so `m__shot` should be fixed to send a valid one]
        [audio left out: its data is not base64: 2 characters, not a multiple of 4; model APIs refuse such a part, so `m__shot` should be fixed to send a valid one]
        Image { data: "iVBORw0KGgoAAAANSUhEUgAAAyAAAAJYCAIAAAA=", mime_type: "image/png" }
        tail"#]]
    .assert_eq(&texts(&out));
    assert_eq!(out.extras["annotations"], json!([{"index": 4, "annotations": {"priority": 0.5}}]));
    assert_eq!(out.extras["invalid_media"], json!({"parts": 4}));
}

/// An error result without content gets a message, where a client showed `error: ` alone.
#[tokio::test(start_paused = true)]
async fn an_error_without_content_gets_a_message() {
    let bare = ToolOutput { is_error: true, ..ToolOutput::default() };
    let p = Arc::new(MockProvider::new("m").with_tool("fail", Behavior::Output(bare)));
    let o = start(OrchestratorConfig::default(), vec![p]).await;
    let out = output_of(&o, "m__fail").await;
    assert!(out.is_error);
    expect!["`m__fail` reported an error without a message"].assert_eq(&texts(&out));
}

/// Structured content that is not an object: left out with a note, the result an error,
/// for a tool whose output schema promised one; wrapped as `{"result": ...}` for a tool
/// that promised nothing.
#[tokio::test(start_paused = true)]
async fn structured_content_that_is_no_object_is_wrapped_or_left_out() {
    let array = ToolOutput { structured: Some(json!([1, 2, 3])), ..ToolOutput::text("s") };
    let typed = ToolSpec::new("typed", "typed", json!({"type": "object"}))
        .with_output_schema(json!({"type": "object"}));
    let p = Arc::new(
        MockProvider::new("m")
            .with_spec(typed, Behavior::Output(array.clone()))
            .with_tool("untyped", Behavior::Output(array)),
    );
    let o = start(OrchestratorConfig::default(), vec![p]).await;
    let typed = output_of(&o, "m__typed").await;
    assert!(typed.is_error && typed.structured.is_none(), "{typed:?}");
    expect![[r#"
        s
        `m__typed` returned structured content that is an array, not an object as MCP requires and its output schema promised; it was left out"#]]
    .assert_eq(&texts(&typed));
    let untyped = output_of(&o, "m__untyped").await;
    assert!(!untyped.is_error);
    assert_eq!(untyped.structured, Some(json!({"result": [1, 2, 3]})));
    assert_eq!(texts(&untyped), "s");
}

/// Structured content that is an object but does not match the tool's output schema is
/// left out with a note naming the mismatches and the result made an error, as MCP has it
/// conform and clients check it; matching content passes, and a tool's error result need
/// not match.
#[tokio::test(start_paused = true)]
async fn structured_content_that_does_not_match_the_output_schema_is_left_out() {
    let schema = json!({"type": "object", "required": ["temperature"],
        "properties": {"temperature": {"type": "number"}, "unit": {"enum": ["C", "F"]}}});
    let spec = |name: &str| {
        ToolSpec::new(name, name, json!({"type": "object"})).with_output_schema(schema.clone())
    };
    let structured = |value| ToolOutput { structured: Some(value), ..ToolOutput::text("s") };
    let wrong = structured(json!({"temperature": "warm", "unit": "K"}));
    let failed = ToolOutput { is_error: true, ..wrong.clone() };
    let p = Arc::new(
        MockProvider::new("m")
            .with_spec(spec("wrong"), Behavior::Output(wrong))
            .with_spec(spec("right"), Behavior::Output(structured(json!({"temperature": 21.5}))))
            .with_spec(spec("failed"), Behavior::Output(failed)),
    );
    let o = start(OrchestratorConfig::default(), vec![p]).await;
    let wrong = output_of(&o, "m__wrong").await;
    assert!(wrong.is_error && wrong.structured.is_none(), "{wrong:?}");
    expect![[r#"
        s
        `m__wrong` returned structured content that does not match its output schema (at /temperature: "warm" is not of type "number"; at /unit: "K" is not one of "C" or "F"), which MCP requires of a tool that declares one; it was left out, and `m__wrong` should be fixed"#]]
    .assert_eq(&texts(&wrong));
    assert_eq!(wrong.extras["invalid_structured"], json!({"violations": 2}));
    let right = output_of(&o, "m__right").await;
    assert!(!right.is_error);
    assert_eq!(right.structured, Some(json!({"temperature": 21.5})));
    let failed = output_of(&o, "m__failed").await;
    assert!(failed.is_error && failed.structured.is_some(), "{failed:?}");
}

/// An embedded resource's blob is checked as image data is: one that is not base64, or an
/// image whose header declares an absurd size, becomes a note; a valid blob, an empty one
/// and a text resource pass.
#[tokio::test(start_paused = true)]
async fn embedded_resource_blobs_are_checked_as_image_data_is() {
    let resource = |blob: &str, mime: &str| ContentPart::Resource {
        uri: "file:///x".into(),
        mime_type: Some(mime.into()),
        text: None,
        blob: Some(blob.into()),
    };
    let text = ContentPart::Resource {
        uri: "file:///notes.txt".into(),
        mime_type: Some("text/plain".into()),
        text: Some("notes".into()),
        blob: None,
    };
    let output = ToolOutput {
        content: vec![
            resource("!!!notbase64$$$", "application/pdf"),
            resource(HUGE_PNG, "image/png"),
            resource(PNG_800X600, "image/png"),
            resource("", "application/octet-stream"),
            text.clone(),
        ],
        ..ToolOutput::default()
    };
    let p = Arc::new(MockProvider::new("m").with_tool("files", Behavior::Output(output)));
    let o = start(OrchestratorConfig::default(), vec![p]).await;
    let out = output_of(&o, "m__files").await;
    expect![[r#"
        [resource left out: its blob is not base64: `!` at byte 0 is no base64 character; model APIs refuse such a part, so `m__files` should be fixed to send a valid one]
        [resource left out: its image's header declares 2147483647 × 2147483647 pixels, over 100000 a side; model APIs refuse such a part, so `m__files` should be fixed to send a valid one]
        Resource { uri: "file:///x", mime_type: Some("image/png"), text: None, blob: Some("iVBORw0KGgoAAAANSUhEUgAAAyAAAAJYCAIAAAA=") }
        Resource { uri: "file:///x", mime_type: Some("application/octet-stream"), text: None, blob: Some("") }
        Resource { uri: "file:///notes.txt", mime_type: Some("text/plain"), text: Some("notes"), blob: None }"#]]
    .assert_eq(&texts(&out));
    assert_eq!(out.extras["invalid_media"], json!({"parts": 2}));
}
