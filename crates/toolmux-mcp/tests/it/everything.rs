//! Against the reference server `@modelcontextprotocol/server-everything` from npm, in each
//! of its modes: stdio, streamable HTTP and legacy SSE.

use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolmux_core::{CallContext, ContentPart, Progress, ProgressSink, ToolError, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, TransportKind};
use toolmux_test_support::conformance::{Conformance, SampleCall};

use crate::support::{self, ServerProcess};

fn conformance() -> Conformance {
    Conformance::new()
        .with_sample(
            SampleCall::new("echo", json!({"message": "hi"})).expect_text_contains("Echo: hi"),
        )
        .with_sample(
            SampleCall::new("get-sum", json!({"a": 2, "b": 3})).expect_text_contains("is 5"),
        )
        .with_sample(SampleCall::new("get-sum", json!({"a": "two"})).expect_failure())
        .with_cancellable(SampleCall::new(
            "trigger-long-running-operation",
            json!({"duration": 20, "steps": 20}),
        ))
}

fn http_server(mode: &str) -> ServerProcess {
    let port = support::free_port();
    ServerProcess::start(
        "node",
        &[support::everything_js().display().to_string(), mode.into()],
        port,
    )
}

#[tokio::test]
async fn stdio_passes_the_conformance_suite_and_leaves_no_process() {
    let provider = McpProvider::new("everything", support::everything_stdio()).unwrap();
    conformance().check(&provider).await;
    let instructions = provider.instructions().unwrap_or_default();
    assert!(!instructions.is_empty(), "server-everything sends instructions");
    assert_eq!(provider.protocol_version().as_deref(), Some("2025-11-25"));
    let pid = provider.server_pid().expect("a running stdio server");
    provider.shutdown().await.unwrap();
    support::assert_group_gone(pid).await;
    assert!(support::zombie_children().is_empty(), "zombies: {:?}", support::zombie_children());
    let after = provider.call("echo", json!({"message": "x"}), &CallContext::new()).await;
    assert!(matches!(after, Err(ToolError::Unavailable { .. })), "{after:?}");
}

#[tokio::test]
async fn streamable_http_passes_the_conformance_suite() {
    let server = http_server("streamableHttp");
    let config = McpServerConfig::remote(TransportKind::Http, format!("{}/mcp", server.base));
    let provider = McpProvider::new("everything", config).unwrap();
    conformance().check(&provider).await;
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn legacy_sse_passes_the_conformance_suite() {
    let server = http_server("sse");
    let config = McpServerConfig::remote(TransportKind::Sse, format!("{}/sse", server.base));
    let provider = McpProvider::new("everything", config).unwrap();
    conformance().check(&provider).await;
    provider.shutdown().await.unwrap();
}

/// A `url` with no `type` (as Claude, Cursor and VS Code files give it) of a server that
/// speaks only legacy SSE: streamable HTTP is tried first, then SSE, and the server works.
#[tokio::test]
async fn a_url_of_no_type_falls_back_to_legacy_sse() {
    let server = http_server("sse");
    let config =
        McpServerConfig { url: Some(format!("{}/sse", server.base)), ..McpServerConfig::default() };
    let provider = McpProvider::new("everything", config).unwrap();
    let out = provider.call("echo", json!({"message": "over sse"}), &CallContext::new()).await;
    assert_eq!(out.expect("the call over SSE").to_text(), "Echo: over sse");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn progress_reaches_the_sink() {
    let provider = McpProvider::new("everything", support::everything_stdio()).unwrap();
    let reports: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = {
        let reports = reports.clone();
        ProgressSink::new(move |p| reports.lock().unwrap().push(p))
    };
    let ctx = CallContext::new().with_progress(sink);
    let out = provider
        .call("trigger-long-running-operation", json!({"duration": 0.4, "steps": 4}), &ctx)
        .await
        .unwrap();
    assert!(out.to_text().contains("Steps: 4"), "{}", out.to_text());
    let reports = reports.lock().unwrap().clone();
    let seen: Vec<(f64, Option<f64>)> = reports.iter().map(|p| (p.progress, p.total)).collect();
    assert_eq!(seen, vec![(1.0, Some(4.0)), (2.0, Some(4.0)), (3.0, Some(4.0)), (4.0, Some(4.0))]);
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn progress_resets_the_request_timeout() {
    // Each step takes 250 ms, the whole call 2 s: longer than the 1 s timeout, which only
    // holds because every progress report resets it.
    let config = support::everything_stdio().with_request_timeout(Duration::from_secs(1));
    let provider = McpProvider::new("everything", config).unwrap();
    let out = provider
        .call(
            "trigger-long-running-operation",
            json!({"duration": 2, "steps": 8}),
            &CallContext::new(),
        )
        .await
        .unwrap();
    assert!(out.to_text().contains("completed"), "{}", out.to_text());
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_silent_call_times_out_and_the_server_stays_usable() {
    let config = support::everything_stdio().with_request_timeout(Duration::from_millis(300));
    let provider = McpProvider::new("everything", config).unwrap();
    let err = provider
        .call(
            "trigger-long-running-operation",
            json!({"duration": 5, "steps": 1}),
            &CallContext::new(),
        )
        .await
        .unwrap_err();
    expect_test::expect!["timeout: `trigger-long-running-operation` did not finish within 300ms"]
        .assert_eq(&err.to_string());
    let out =
        provider.call("echo", json!({"message": "still here"}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "Echo: still here");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn images_annotations_and_structured_content_are_mapped_whole() {
    let provider = McpProvider::new("everything", support::everything_stdio()).unwrap();
    let ctx = CallContext::new();
    let image = provider.call("get-tiny-image", json!({}), &ctx).await.unwrap();
    assert!(
        image.content.iter().any(|p| matches!(p, ContentPart::Image { mime_type, data } if mime_type == "image/png" && !data.is_empty())),
        "{image:?}"
    );
    let annotated = provider
        .call("get-annotated-message", json!({"messageType": "error", "includeImage": true}), &ctx)
        .await
        .unwrap();
    let annotations = annotated.extras.get("annotations").expect("annotations kept");
    assert!(annotations.to_string().contains("priority"), "{annotations}");
    let structured = provider
        .call("get-structured-content", json!({"location": "Chicago"}), &ctx)
        .await
        .unwrap();
    let value = structured.structured.expect("structured content");
    assert!(value.get("temperature").is_some(), "{value}");
    let links = provider.call("get-resource-links", json!({"count": 2}), &ctx).await.unwrap();
    let count =
        links.content.iter().filter(|p| matches!(p, ContentPart::ResourceLink { .. })).count();
    assert_eq!(count, 2, "{links:?}");
    let embedded = provider
        .call("get-resource-reference", json!({"resourceType": "Text", "resourceId": 1}), &ctx)
        .await
        .unwrap();
    assert!(
        embedded.content.iter().any(|p| matches!(p, ContentPart::Resource { .. })),
        "{embedded:?}"
    );
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn allow_and_deny_globs_filter_tools() {
    let config = support::everything_stdio()
        .with_tools_allowed(["get-*", "echo"])
        .with_tools_denied(["get-env", "get-resource-*"]);
    let provider = McpProvider::new("everything", config).unwrap();
    let mut names: Vec<String> =
        provider.list_tools().await.unwrap().into_iter().map(|t| t.name).collect();
    names.sort();
    expect_test::expect![[r#"["echo", "get-annotated-message", "get-roots-list", "get-structured-content", "get-sum", "get-tiny-image"]"#]]
        .assert_eq(&format!("{names:?}"));
    let denied = provider.call("get-env", json!({}), &CallContext::new()).await.unwrap_err();
    assert!(matches!(denied, ToolError::UnknownTool { .. }), "{denied:?}");
    assert!(!provider.has_tool("get-env").await);
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn many_concurrent_calls_share_one_server() {
    let provider = McpProvider::new("everything", support::everything_stdio()).unwrap();
    provider.warmup().await.unwrap();
    let calls = (0..32).map(|i| {
        let provider = provider.clone();
        async move {
            let out = provider
                .call("get-sum", json!({"a": i, "b": 1}), &CallContext::new())
                .await
                .unwrap();
            assert!(out.to_text().contains(&format!("is {}", i + 1)), "{}", out.to_text());
        }
    });
    futures::future::join_all(calls).await;
    provider.shutdown().await.unwrap();
}
