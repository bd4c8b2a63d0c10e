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
