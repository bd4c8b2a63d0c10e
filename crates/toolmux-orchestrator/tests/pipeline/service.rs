//! The `tower` feature: the orchestrator and a filtered view as a `tower::Service`, alone
//! and under tower's own middleware (timeout, concurrency limit).

use crate::start;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{CallContext, ToolCall, ToolError, ToolSpec};
use toolmux_orchestrator::{
    FilteredView, OrchestratorConfig, QueueConfig, ToolEvent, ToolRequest, ToolSettings,
};
use toolmux_test_support::mock::{Behavior, MockProvider};
use tower::{Service, ServiceBuilder, ServiceExt};

fn provider() -> MockProvider {
    let needs_text = ToolSpec::new(
        "echo",
        "echo",
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
    );
    MockProvider::new("m")
        .with_spec(needs_text, Behavior::Echo)
        .with_tool("run", Behavior::RunId)
        .with_tool("hang", Behavior::Hang)
        .with_tool("work", Behavior::Sleep(Duration::from_millis(100)))
}

#[tokio::test(start_paused = true)]
async fn a_request_goes_through_the_whole_pipeline() {
    let o = start(OrchestratorConfig::default(), vec![Arc::new(provider())]).await;

    let output = o.clone().oneshot(ToolRequest::new("m__echo", json!({"text": "hi"}))).await;
    assert_eq!(output.expect("echoed").to_text(), r#"{"text":"hi"}"#);

    // The pipeline's stages answer as service errors: validation, lookup with suggestions.
    let invalid = o.clone().oneshot(ToolRequest::new("m__echo", json!({}))).await.unwrap_err();
    assert!(matches!(invalid, ToolError::InvalidArguments { .. }), "{invalid:?}");
    let unknown = o.clone().oneshot(ToolRequest::new("m__ecko", json!({}))).await.unwrap_err();
    assert_eq!(unknown.to_string(), "unknown tool `m__ecko`; did you mean `m__echo`?");

    // The request's context reaches the tool, and the caller's call id the events.
    let mut events = o.subscribe();
    let call = ToolCall { id: Some("toolu_1".into()), ..ToolCall::new("m__run", json!({})) };
    let request = ToolRequest::from(call).with_context(CallContext::new().with_run_id("run-7"));
    let output = o.clone().oneshot(request).await.expect("the run id");
    assert_eq!(output.to_text(), "run-7");
    let started = std::iter::from_fn(|| events.try_recv().ok())
        .find_map(|e| match e {
            ToolEvent::ToolStarted { call_id, run_id, .. } => Some((call_id, run_id)),
            _ => None,
        })
        .expect("a started event");
    assert_eq!(started, (Some("toolu_1".to_owned()), "run-7".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn a_tower_timeout_cancels_the_call_and_frees_its_queue_slot() {
    let config = OrchestratorConfig::default()
        .with_queue("q", QueueConfig::new(1).with_wait_timeout(Duration::from_millis(10)))
        .with_provider_settings("m", ToolSettings::default().with_queue("q"));
    let p = Arc::new(provider());
    let o = start(config, vec![p.clone()]).await;

    let mut service = ServiceBuilder::new().timeout(Duration::from_secs(1)).service(o.clone());
    let elapsed = service.ready().await.unwrap().call(ToolRequest::new("m__hang", json!({})));
    let error = elapsed.await.expect_err("the hanging tool never answers");
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");

    // Dropping the call's future cancelled it: nothing runs, the only slot is free again
    // (a held slot would fail the next call with `queue_busy` after 10 ms).
    assert_eq!((p.in_flight(), o.calls_in_flight()), (0, 0));
    let next = service.ready().await.unwrap().call(ToolRequest::new("m__work", json!({})));
    assert_eq!(next.await.expect("the slot was released").to_text(), "slept");
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_limit_holds_callers_back_before_the_pipeline() {
    let p = Arc::new(provider());
    let o = start(OrchestratorConfig::default(), vec![p.clone()]).await;
    let run = |service: tower::util::BoxCloneSyncService<_, _, _>| async move {
        let calls = (0..6).map(|_| service.clone().oneshot(ToolRequest::new("m__work", json!({}))));
        let outputs = futures::future::join_all(calls).await;
        assert!(
            outputs.iter().all(|o| o
                .as_ref()
                .is_ok_and(|o: &toolmux_core::ToolOutput| o.to_text() == "slept"))
        );
    };

    // With no queue configured the orchestrator runs all six at once.
    run(tower::util::BoxCloneSyncService::new(o.clone())).await;
    assert_eq!(p.max_in_flight(), 6);

    let p = Arc::new(provider());
    let o = start(OrchestratorConfig::default(), vec![p.clone()]).await;
    let started = tokio::time::Instant::now();
    let limited = ServiceBuilder::new().concurrency_limit(2).service(o.clone());
    run(tower::util::BoxCloneSyncService::new(limited)).await;
    assert_eq!(p.max_in_flight(), 2, "the limit is the service's, before any queue");
    assert_eq!(started.elapsed(), Duration::from_millis(300), "three rounds of two");
}

#[tokio::test(start_paused = true)]
async fn a_filtered_view_serves_only_its_tools() {
    let o = start(OrchestratorConfig::default(), vec![Arc::new(provider())]).await;
    let view = FilteredView::new(o, vec!["m__echo".into()]);

    let output = view.clone().oneshot(ToolRequest::new("m__echo", json!({"text": "in"}))).await;
    assert_eq!(output.expect("in view").to_text(), r#"{"text":"in"}"#);
    // Outside the view a tool is unknown, and no name from outside is suggested.
    let outside = view.oneshot(ToolRequest::new("m__run", json!({}))).await.unwrap_err();
    assert_eq!(outside.to_string(), "unknown tool `m__run`");
}
