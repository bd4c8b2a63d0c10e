//! Timeouts: default, per tool, per provider, reset by progress up to the hard cap; the
//! provider's work is cancelled.

use crate::{call, start};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::ToolSpec;
use toolmux_orchestrator::{OrchestratorConfig, ToolSettings};
use toolmux_test_support::mock::{Behavior, MockProvider};

fn provider() -> Arc<MockProvider> {
    Arc::new(
        MockProvider::new("m")
            .with_tool("hang", Behavior::Hang)
            .with_tool("nap", Behavior::Sleep(Duration::from_secs(5)))
            .with_tool("steps", Behavior::Progress { steps: 10, interval: Duration::from_secs(2) }),
    )
}

#[tokio::test(start_paused = true)]
async fn timeouts_resolve_tool_then_provider_then_default() {
    let config = OrchestratorConfig::default()
        .with_tool_timeout(Duration::from_secs(3))
        .with_provider_settings("m", ToolSettings::default().with_timeout(Duration::from_secs(7)))
        .with_tool_settings(
            "m__hang",
            ToolSettings::default().with_timeout(Duration::from_secs(1)),
        );
    let p = provider();
    let o = start(config, vec![p.clone()]).await;
    let r = call(&o, "m__hang", json!({})).await;
    assert_eq!(r.conversation_text(), "(tool failed: timeout)");
    assert_eq!(r.latency_ms, 1000);
    assert!(r.error.unwrap().contains("did not finish within 1s"));
    assert!(call(&o, "m__nap", json!({})).await.ok, "provider timeout of 7s beats the default 3s");
    assert_eq!(p.in_flight(), 0, "the timed-out call was cancelled");
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_ends_its_own_calls_is_waited_for_unless_its_settings_say() {
    // A shell tool's command may run 20 s and is then ended with its output so far; the
    // default timeout of 3 s must not cut it off first.
    let spec = |name: &str| {
        ToolSpec::new(name, "runs", json!({"type": "object"}))
            .with_time_limit(Duration::from_secs(20))
    };
    let p = Arc::new(
        MockProvider::new("m")
            .with_spec(spec("long"), Behavior::Sleep(Duration::from_secs(10)))
            .with_spec(spec("capped"), Behavior::Sleep(Duration::from_secs(10)))
            .with_spec(spec("over"), Behavior::Hang),
    );
    let config = OrchestratorConfig::default()
        .with_tool_timeout(Duration::from_secs(3))
        .with_provider_settings("m", ToolSettings::default().with_timeout(Duration::from_secs(4)))
        .with_tool_settings(
            "m__capped",
            ToolSettings::default().with_timeout(Duration::from_secs(2)),
        );
    let o = start(config, vec![p.clone()]).await;
    let r = call(&o, "m__long", json!({})).await;
    assert!(r.ok, "declared 20s beats the provider's 4s: {r:?}");
    assert_eq!(r.latency_ms, 10_000);
    let r = call(&o, "m__capped", json!({})).await;
    assert_eq!(r.conversation_text(), "(tool failed: timeout)", "the tool's own setting wins");
    assert_eq!(r.latency_ms, 2000);
    let r = call(&o, "m__over", json!({})).await;
    assert_eq!(r.conversation_text(), "(tool failed: timeout)", "a tool past its own limit");
    assert_eq!(r.latency_ms, 20_000);
    assert_eq!(p.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn progress_resets_the_timeout_up_to_the_hard_cap() {
    let reset = ToolSettings::default()
        .with_timeout(Duration::from_secs(3))
        .with_progress_reset(Duration::from_secs(60));
    let o =
        start(OrchestratorConfig::default().with_provider_settings("m", reset), vec![provider()])
            .await;
    let r = call(&o, "m__steps", json!({})).await;
    assert!(r.ok, "20s of work, progress every 2s, timeout 3s: {r:?}");
    assert_eq!(r.latency_ms, 20_000);

    let capped = ToolSettings::default()
        .with_timeout(Duration::from_secs(3))
        .with_progress_reset(Duration::from_secs(9));
    let o =
        start(OrchestratorConfig::default().with_provider_settings("m", capped), vec![provider()])
            .await;
    let r = call(&o, "m__steps", json!({})).await;
    assert_eq!(r.conversation_text(), "(tool failed: timeout)");
    assert_eq!(r.latency_ms, 9000);

    let no_reset = ToolSettings::default().with_timeout(Duration::from_secs(3));
    let o = start(
        OrchestratorConfig::default().with_provider_settings("m", no_reset),
        vec![provider()],
    )
    .await;
    let r = call(&o, "m__steps", json!({})).await;
    assert_eq!(r.latency_ms, 3000);
}

/// A call whose limit progress restarts, and that then goes quiet, is told how long it ran
/// and how long it went without progress (the limit that was reached), not the one
/// figure that reads as either.
#[tokio::test(start_paused = true)]
async fn a_stalled_call_says_how_long_it_went_without_progress() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("stall", Behavior::Stall { steps: 3, interval: Duration::from_secs(2) }),
    );
    let reset = ToolSettings::default()
        .with_timeout(Duration::from_secs(3))
        .with_progress_reset(Duration::from_secs(60));
    let o = start(OrchestratorConfig::default().with_provider_settings("m", reset), vec![p]).await;
    let error = o.call_tool("m__stall", json!({}), &toolmux_core::CallContext::new()).await;
    expect_test::expect![
        "timeout: `m__stall` did not finish within 9s (it went 3s without progress or an answer)"
    ]
    .assert_eq(&error.unwrap_err().to_string());
}

#[tokio::test(start_paused = true)]
async fn the_callers_deadline_bounds_the_call() {
    let o = start(OrchestratorConfig::default(), vec![provider()]).await;
    let ctx = toolmux_core::CallContext::new()
        .with_deadline(tokio::time::Instant::now() + Duration::from_millis(1500));
    let r = o.execute(toolmux_core::ToolCall::new("m__hang", json!({})), &ctx).await;
    assert_eq!(r.conversation_text(), "(tool failed: timeout)");
    assert_eq!(r.latency_ms, 1500);
}

/// A timeout, hard cap, run tool time, cache lifetime or rate-limit period of
/// `Duration::MAX` (no limit, as Rust APIs often spell it) is a limit never reached: calls
/// run, rather than panicking on a deadline past what the clock can hold.
#[tokio::test(start_paused = true)]
async fn limits_of_duration_max_never_end_a_call() {
    use toolmux_core::{CallContext, ToolCall};
    use toolmux_orchestrator::{QueueConfig, RateLimit, RunBudgetConfig};
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("nap", Behavior::Sleep(Duration::from_secs(5)))
            .with_tool("steps", Behavior::Progress { steps: 3, interval: Duration::from_secs(2) }),
    );
    let limit = RateLimit { calls: 1, per: Duration::MAX, wait: Duration::ZERO };
    let config = OrchestratorConfig::default()
        .with_tool_timeout(Duration::MAX)
        .with_run_budget(RunBudgetConfig { max_calls: None, max_tool_time: Some(Duration::MAX) })
        .with_queue("q", QueueConfig::new(1).with_wait_timeout(Duration::MAX))
        .with_provider_settings("m", ToolSettings::default().with_queue("q"))
        .with_tool_settings(
            "m__nap",
            ToolSettings {
                cache_ttl: Some(Duration::MAX),
                cache_force: true,
                ..ToolSettings::default()
            },
        )
        .with_tool_settings(
            "m__steps",
            ToolSettings {
                reset_timeout_on_progress: Some(true),
                max_total_time: Some(Duration::MAX),
                rate_limit: Some(limit),
                ..ToolSettings::default()
            },
        );
    let o = start(config, vec![p.clone()]).await;
    let run = CallContext::new().with_run_id("r");
    for _ in 0..2 {
        let r = o.execute(ToolCall::new("m__nap", json!({})), &run).await;
        assert!(r.ok, "{r:?}");
    }
    assert_eq!(p.calls_of("nap"), 1, "the second call is answered from the cache");
    let r = o.execute(ToolCall::new("m__steps", json!({})), &run).await;
    assert!(r.ok, "{r:?}");
    // One call per period that never ends: the next is refused, saying so.
    let r = call(&o, "m__steps", json!({})).await;
    assert_eq!(r.extras.get("code"), Some(&serde_json::json!("rate_limited")), "{r:?}");
}
