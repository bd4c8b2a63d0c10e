//! Queues: bounded concurrency, FIFO, wait timeout, release on every exit, no deadlock in
//! nested calls, and the 10,000-call load test.

use crate::{call, start};
use async_trait::async_trait;
use expect_test::expect;
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use toolmux_core::{CallContext, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec};
use toolmux_orchestrator::{OrchestratorConfig, QueueConfig, ToolSettings, WeakOrchestrator};
use toolmux_test_support::mock::{Behavior, MockProvider};

fn queued(concurrent: usize, wait: Duration) -> OrchestratorConfig {
    OrchestratorConfig::default()
        .with_queue("q", QueueConfig::new(concurrent).with_wait_timeout(wait))
        .with_provider_settings("m", ToolSettings::default().with_queue("q"))
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_calls_through_a_queue_of_four() {
    let p = Arc::new(
        MockProvider::new("m").with_tool("work", Behavior::Sleep(Duration::from_millis(1))),
    );
    let o = start(queued(4, Duration::from_secs(3600)), vec![p.clone()]).await;
    let calls = (0..10_000).map(|i| {
        let o = o.clone();
        tokio::spawn(async move { call(&o, "m__work", json!({"i": i})).await })
    });
    let results = futures::future::join_all(calls).await;
    assert_eq!(results.len(), 10_000);
    assert!(results.iter().all(|r| r.as_ref().unwrap().ok));
    assert_eq!(p.max_in_flight(), 4, "never more than the queue allows");
    assert_eq!(p.total_calls(), 10_000);
    assert_eq!(p.in_flight(), 0);
    // Every slot is free again: four calls start at once.
    let again = futures::future::join_all((0..4).map(|_| call(&o, "m__work", json!({})))).await;
    assert!(again.iter().all(|r| r.ok && r.latency_ms <= 1));
}

#[tokio::test(start_paused = true)]
async fn waiting_too_long_is_a_distinct_busy_error() {
    let p = Arc::new(
        MockProvider::new("m").with_tool("slow", Behavior::Sleep(Duration::from_secs(10))),
    );
    let o = start(queued(1, Duration::from_secs(2)), vec![p]).await;
    let (first, second) =
        tokio::join!(call(&o, "m__slow", json!({})), call(&o, "m__slow", json!({})));
    assert!(first.ok);
    expect!["(tool failed: queue `q` busy: no slot for `m__slow` within 2s, retry later)"]
        .assert_eq(&second.conversation_text());
    assert_eq!(second.extras["code"], "queue_busy");
}

#[tokio::test(start_paused = true)]
async fn slots_are_released_on_error_timeout_panic_and_cancel() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("fail", Behavior::Fail("x".into()))
            .with_tool("panic", Behavior::Panic)
            .with_tool("hang", Behavior::Hang)
            .with_tool("ok", Behavior::Echo),
    );
    let config = queued(1, Duration::from_millis(10)).with_tool_timeout(Duration::from_secs(1));
    let o = start(config, vec![p.clone()]).await;
    assert!(!call(&o, "m__fail", json!({})).await.ok);
    let r = call(&o, "m__panic", json!({})).await;
    expect!["(tool failed: `m__panic` panicked: mock tool panic panicked on purpose)"]
        .assert_eq(&r.conversation_text());
    // The provider's own panic is the provider's fault.
    assert_eq!(r.extras.get("code"), Some(&json!("panicked")), "{r:?}");
    assert_eq!(r.extras.get("party"), Some(&json!("provider")), "{r:?}");
    assert_eq!(call(&o, "m__hang", json!({})).await.conversation_text(), "(tool failed: timeout)");
    let ctx = CallContext::new();
    let cancel = ctx.cancel_token().clone();
    let hung = tokio::spawn({
        let o = o.clone();
        async move { o.execute(toolmux_core::ToolCall::new("m__hang", json!({})), &ctx).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    let r = hung.await.unwrap();
    assert_eq!(r.extras["code"], "cancelled");
    // The queue of one is free after all of that.
    assert!(call(&o, "m__ok", json!({})).await.ok);
    assert_eq!(p.in_flight(), 0);
}

/// A call waiting for a queue slot stops at its caller's deadline, with a timeout: it
/// neither waits out the queue's wait timeout nor reaches its tool past the deadline.
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_a_slot_stops_at_its_deadline() {
    let p = Arc::new(
        MockProvider::new("m").with_tool("slow", Behavior::Sleep(Duration::from_secs(10))),
    );
    let o = start(queued(1, Duration::from_secs(60)), vec![p.clone()]).await;
    let holder = {
        let o = o.clone();
        tokio::spawn(async move { call(&o, "m__slow", json!({})).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = tokio::time::Instant::now();
    let ctx = CallContext::new().with_deadline(started + Duration::from_secs(2));
    let r = o.execute(toolmux_core::ToolCall::new("m__slow", json!({})), &ctx).await;
    assert_eq!(r.extras.get("code"), Some(&json!("timeout")), "{r:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert!(holder.await.unwrap().ok);
    assert_eq!(p.calls_of("slow"), 1, "the late call never reached the tool");
}

/// A provider whose `outer` tool calls `m__inner` through the orchestrator, as a sub-agent would.
/// It holds the orchestrator weakly, as an agent does: a strong handle kept the two alive
/// together past the test, and with them the orchestrator's output folder.
#[derive(Debug)]
struct Nested {
    orchestrator: OnceLock<WeakOrchestrator>,
}

#[async_trait]
impl ToolProvider for Nested {
    fn kind(&self) -> ToolKind {
        ToolKind::Agent
    }
    fn namespace(&self) -> &str {
        "agent"
    }
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec::new("outer", "calls m__inner", json!({"type": "object"}))])
    }
    async fn call(
        &self,
        _name: &str,
        _args: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let o = self.orchestrator.get().and_then(WeakOrchestrator::upgrade);
        let o = o.expect("set before calls, and alive while it calls");
        o.call_tool("m__inner", json!({}), &ctx.child()).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_nested_call_on_its_ancestors_full_queue_fails_fast() {
    let nested = Arc::new(Nested { orchestrator: OnceLock::new() });
    let m = Arc::new(MockProvider::new("m").with_tool("inner", Behavior::Text("inner ran".into())));
    let config = OrchestratorConfig::default()
        .with_queue("shared", QueueConfig::new(1))
        .with_provider_settings("agent", ToolSettings::default().with_queue("shared"))
        .with_provider_settings("m", ToolSettings::default().with_queue("shared"));
    let o = start(config, vec![nested.clone(), m.clone()]).await;
    nested.orchestrator.set(o.downgrade()).unwrap();
    let r = call(&o, "agent__outer", json!({})).await;
    expect!["(tool failed: queue `shared` is full and its slot is held by the enclosing call `agent__outer`: `m__inner` would wait forever; raise `queues.shared.concurrent` or give `m__inner` another queue)"]
        .assert_eq(&r.conversation_text());
    assert_eq!(m.total_calls(), 0);

    // With room for both, the nested call runs.
    let nested = Arc::new(Nested { orchestrator: OnceLock::new() });
    let config = OrchestratorConfig::default()
        .with_queue("shared", QueueConfig::new(2))
        .with_provider_settings("agent", ToolSettings::default().with_queue("shared"))
        .with_provider_settings("m", ToolSettings::default().with_queue("shared"));
    let o = start(config, vec![nested.clone(), m]).await;
    nested.orchestrator.set(o.downgrade()).unwrap();
    assert_eq!(call(&o, "agent__outer", json!({})).await.result.unwrap(), "inner ran");
}

/// A tool's rate limit refuses calls beyond it, saying when to call again; a provider's is
/// shared by its tools; a limit with a wait lets the call wait its turn.
#[tokio::test(start_paused = true)]
async fn rate_limits_refuse_or_delay_calls_beyond_them() {
    use toolmux_orchestrator::RateLimit;
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("a", Behavior::Echo)
            .with_tool("b", Behavior::Echo)
            .with_tool("own", Behavior::Echo),
    );
    let limit = |calls, per_ms, wait_ms| RateLimit {
        calls,
        per: Duration::from_millis(per_ms),
        wait: Duration::from_millis(wait_ms),
    };
    let mut config = OrchestratorConfig::default();
    config.providers.insert(
        "m".into(),
        ToolSettings { rate_limit: Some(limit(2, 1000, 0)), ..ToolSettings::default() },
    );
    config.tools.insert(
        "m__own".into(),
        ToolSettings {
            rate_limit: Some(limit(1, 60_000, 60_000)),
            // The wait counts against the timeout.
            timeout: Some(Duration::from_secs(120)),
            ..ToolSettings::default()
        },
    );
    let o = start(config, vec![p]).await;
    assert!(call(&o, "m__a", json!({})).await.ok);
    assert!(call(&o, "m__b", json!({})).await.ok);
    let refused = call(&o, "m__a", json!({})).await;
    assert!(!refused.ok);
    assert_eq!(refused.extras["code"], "rate_limited");
    let error = refused.error.unwrap_or_default();
    assert!(
        error.contains("`m__a` is rate limited (2 calls per 1s): call it again in 500ms"),
        "{error}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(call(&o, "m__b", json!({})).await.ok);

    // A tool's own limit, with a wait: the second call waits a minute for its turn.
    let started = tokio::time::Instant::now();
    assert!(call(&o, "m__own", json!({})).await.ok);
    assert!(call(&o, "m__own", json!({})).await.ok);
    assert_eq!(started.elapsed(), Duration::from_secs(60));
}

/// A retry takes a turn under the rate limit as the first attempt did: it waits for one
/// the limit lets it wait for, and is not made when the turn is further off, the first
/// failure standing. (Retries went to the provider at once, whatever the limit.)
#[tokio::test(start_paused = true)]
async fn retries_take_their_turns_under_the_rate_limit() {
    use toolmux_orchestrator::{RateLimit, RetryPolicy};
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("waits", Behavior::FailTransient { times: 1 })
            .with_tool("refused", Behavior::FailTransient { times: 1 }),
    );
    let settings = |wait_ms| ToolSettings {
        rate_limit: Some(RateLimit {
            calls: 1,
            per: Duration::from_secs(2),
            wait: Duration::from_millis(wait_ms),
        }),
        timeout: Some(Duration::from_secs(10)),
        ..ToolSettings::default().with_retry(RetryPolicy::retries(1))
    };
    let mut config = OrchestratorConfig::default();
    config.tools.insert("m__waits".into(), settings(5_000));
    config.tools.insert("m__refused".into(), settings(0));
    let o = start(config, vec![p.clone()]).await;
    let started = tokio::time::Instant::now();
    let r = call(&o, "m__waits", json!({})).await;
    assert!(r.ok, "{r:?}");
    assert_eq!(p.calls_of("waits"), 2);
    assert_eq!(started.elapsed(), Duration::from_secs(2), "the retry waited for its turn");
    let r = call(&o, "m__refused", json!({})).await;
    assert!(!r.ok, "{r:?}");
    assert_eq!(p.calls_of("refused"), 1, "no turn for a retry: none was made");
    assert_eq!(r.extras["code"], "transport", "the first failure stands: {r:?}");
}

/// A call waiting for its turn under a rate limit is aborted by `Orchestrator::cancel`
/// (as one waiting for a queue slot is) and by its caller's deadline, rather than waiting
/// out its turn and running.
#[tokio::test(start_paused = true)]
async fn a_call_waiting_for_its_rate_limited_turn_is_cancelled() {
    use toolmux_orchestrator::RateLimit;
    let p = Arc::new(MockProvider::new("m").with_tool("own", Behavior::Echo));
    let mut config = OrchestratorConfig::default();
    config.tools.insert(
        "m__own".into(),
        ToolSettings {
            rate_limit: Some(RateLimit {
                calls: 1,
                per: Duration::from_secs(60),
                wait: Duration::from_secs(600),
            }),
            // The wait counts against the timeout.
            timeout: Some(Duration::from_secs(120)),
            ..ToolSettings::default()
        },
    );
    let o = start(config, vec![p.clone()]).await;
    assert!(call(&o, "m__own", json!({})).await.ok);
    let waiting = {
        let o = o.clone();
        tokio::spawn(async move { call(&o, "m__own", json!({})).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    o.cancel();
    let started = tokio::time::Instant::now();
    let r = waiting.await.unwrap();
    assert_eq!(r.extras.get("code"), Some(&json!("cancelled")), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(p.calls_of("own"), 1);
    // A caller whose deadline comes before its turn fails at once, rather than waiting
    // until its deadline to time out.
    let started = tokio::time::Instant::now();
    let ctx = CallContext::new().with_deadline(started + Duration::from_secs(5));
    let r = o.execute(toolmux_core::ToolCall::new("m__own", json!({})), &ctx).await;
    assert_eq!(r.extras.get("code"), Some(&json!("timeout")), "{r:?}");
    assert_eq!(started.elapsed(), Duration::ZERO);
    expect!["timeout: `m__own` did not finish within 5s: its turn under its rate limit (1 call per 1m) comes in 59s, at or past its caller's deadline, 5s away, so it did not wait and did not run; call again in 59s"].assert_eq(&r.error.unwrap_or_default());
    assert_eq!(p.calls_of("own"), 1);
}

/// Calls that stop waiting for their turn under a rate limit (cancelled by their caller,
/// past their deadline, or dropped) give the turn back: the calls after them are not
/// delayed by calls that never ran.
#[tokio::test(start_paused = true)]
async fn calls_that_stop_waiting_for_their_turn_give_it_back() {
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;
    use toolmux_core::ToolCall;
    use toolmux_orchestrator::RateLimit;
    let p = Arc::new(MockProvider::new("m").with_tool("t", Behavior::Echo));
    let limit = RateLimit { calls: 2, per: Duration::from_secs(1), wait: Duration::from_secs(10) };
    let config = OrchestratorConfig::default().with_tool_settings(
        "m__t",
        ToolSettings { rate_limit: Some(limit), ..ToolSettings::default() },
    );
    let o = start(config, vec![p.clone()]).await;
    let t0 = Instant::now();
    // The burst: two calls at once.
    assert!(call(&o, "m__t", json!({})).await.ok);
    assert!(call(&o, "m__t", json!({})).await.ok);
    // Calls wait for turns 0.5 s, 1 s and 1.5 s away; one whose turn (1.5 s away) would
    // come past its deadline fails at once and gives it back.
    let token = CancellationToken::new();
    let spawn = |ctx: CallContext| {
        let o = o.clone();
        tokio::spawn(async move { o.execute(ToolCall::new("m__t", json!({})), &ctx).await })
    };
    let cancelled = [
        spawn(CallContext::new().with_cancel(token.clone())),
        spawn(CallContext::new().with_cancel(token.clone())),
    ];
    tokio::task::yield_now().await;
    let late = CallContext::new().with_deadline(t0 + Duration::from_millis(200));
    let late = o.execute(ToolCall::new("m__t", json!({})), &late).await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
    let dropped = spawn(CallContext::new());
    tokio::time::sleep(Duration::from_millis(100)).await;
    token.cancel();
    dropped.abort();
    for call in cancelled {
        let r = call.await.unwrap();
        assert_eq!(r.extras.get("code"), Some(&json!("cancelled")), "{r:?}");
    }
    assert!(dropped.await.unwrap_err().is_cancelled());
    assert_eq!(late.extras.get("code"), Some(&json!("timeout")), "{late:?}");
    assert_eq!(t0.elapsed(), Duration::from_millis(100));
    // None of the four ran: the next call takes the first of their turns (0.5 s), where
    // it waited behind all four (2.5 s) when they kept them.
    assert!(call(&o, "m__t", json!({})).await.ok);
    assert_eq!(t0.elapsed(), Duration::from_millis(500));
    assert!(call(&o, "m__t", json!({})).await.ok);
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    assert_eq!(p.calls_of("t"), 4);
}

/// A turn given back while later calls wait for theirs goes to the next call in its own
/// place: under one call per second, no two calls run less than a second apart. The next
/// call took the time given back at the end, and ran at the same instant as the latest
/// call waiting.
#[tokio::test(start_paused = true)]
async fn a_turn_given_back_brings_no_two_calls_closer_than_the_limit() {
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;
    use toolmux_core::ToolCall;
    use toolmux_orchestrator::RateLimit;
    let p = Arc::new(MockProvider::new("m").with_tool("t", Behavior::Echo));
    let limit = RateLimit { calls: 1, per: Duration::from_secs(1), wait: Duration::from_secs(10) };
    let config = OrchestratorConfig::default().with_tool_settings(
        "m__t",
        ToolSettings { rate_limit: Some(limit), ..ToolSettings::default() },
    );
    let o = start(config, vec![p.clone()]).await;
    let t0 = Instant::now();
    // Each call says when it ran.
    let spawn = |ctx: CallContext| {
        let o = o.clone();
        tokio::spawn(async move {
            let r = o.execute(ToolCall::new("m__t", json!({})), &ctx).await;
            (r, t0.elapsed())
        })
    };
    assert!(call(&o, "m__t", json!({})).await.ok);
    // Two calls wait for their turns, at 1 s and 2 s; the first stops at 100 ms.
    let token = CancellationToken::new();
    let stopped = spawn(CallContext::new().with_cancel(token.clone()));
    let waiting = spawn(CallContext::new());
    tokio::time::sleep(Duration::from_millis(100)).await;
    token.cancel();
    let (r, _) = stopped.await.unwrap();
    assert_eq!(r.extras.get("code"), Some(&json!("cancelled")), "{r:?}");
    // The next call takes the turn at 1 s; the one waiting keeps its turn at 2 s.
    let next = spawn(CallContext::new());
    let (next, next_ran) = next.await.unwrap();
    let (waiting, waiting_ran) = waiting.await.unwrap();
    assert!(next.ok && waiting.ok, "{next:?} {waiting:?}");
    assert_eq!((next_ran, waiting_ran), (Duration::from_secs(1), Duration::from_secs(2)));
    assert_eq!(p.calls_of("t"), 3);
}

/// A call whose turn under a rate limit came, and that then stops while it waits for a
/// queue slot (cancelled, dropped, or past its deadline), never reached its provider: it
/// gives its turn back, and the calls after it are not delayed by it.
#[tokio::test(start_paused = true)]
async fn calls_stopped_in_the_queue_after_their_turn_give_it_back() {
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;
    use toolmux_core::ToolCall;
    use toolmux_orchestrator::RateLimit;
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("slow", Behavior::Sleep(Duration::from_secs(3)))
            .with_tool("fast", Behavior::Echo),
    );
    let limit = RateLimit { calls: 2, per: Duration::from_secs(1), wait: Duration::from_secs(10) };
    let config = OrchestratorConfig::default()
        .with_queue("q", QueueConfig::new(1).with_wait_timeout(Duration::from_secs(3600)))
        .with_provider_settings(
            "m",
            ToolSettings { rate_limit: Some(limit), ..ToolSettings::default() },
        )
        .with_tool_settings("m__slow", ToolSettings::default().with_queue("q"));
    let o = start(config, vec![p.clone()]).await;
    let t0 = Instant::now();
    let spawn = |ctx: CallContext| {
        let o = o.clone();
        tokio::spawn(async move { o.execute(ToolCall::new("m__slow", json!({})), &ctx).await })
    };
    // The slow call holds the queue's one slot for 3 s; four calls take their turns (at
    // once, at 0.5 s, 1 s and 1.5 s) and wait behind it.
    let holder = spawn(CallContext::new());
    tokio::task::yield_now().await;
    let token = CancellationToken::new();
    let cancelled = [
        spawn(CallContext::new().with_cancel(token.clone())),
        spawn(CallContext::new().with_cancel(token.clone())),
    ];
    let late = spawn(CallContext::new().with_deadline(t0 + Duration::from_millis(1800)));
    let dropped = spawn(CallContext::new());
    tokio::time::sleep(Duration::from_millis(1900)).await;
    let r = late.await.unwrap();
    assert_eq!(r.extras.get("code"), Some(&json!("timeout")), "{r:?}");
    token.cancel();
    dropped.abort();
    for call in cancelled {
        let r = call.await.unwrap();
        assert_eq!(r.extras.get("code"), Some(&json!("cancelled")), "{r:?}");
    }
    assert!(dropped.await.unwrap_err().is_cancelled());
    assert_eq!(t0.elapsed(), Duration::from_millis(1900));
    // Every turn has come, and none of the four ran: the limit is whole again, two calls
    // at once and a third half a second later. Had the four kept their turns, the limit
    // would be taken until 2.5 s: the second call would wait until 2.5 s, the third until 3 s.
    assert!(call(&o, "m__fast", json!({})).await.ok);
    assert!(call(&o, "m__fast", json!({})).await.ok);
    assert_eq!(t0.elapsed(), Duration::from_millis(1900));
    assert!(call(&o, "m__fast", json!({})).await.ok);
    assert_eq!(t0.elapsed(), Duration::from_millis(2400));
    assert!(holder.await.unwrap().ok);
    assert_eq!(p.calls_of("slow"), 1);
}

/// Calls waiting in a queue take free slots by priority, the tool's (`tools.NAME.priority`)
/// plus the caller's (`CallContext::with_priority`), then in the order they came.
#[tokio::test(start_paused = true)]
async fn waiting_calls_take_slots_by_priority() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("slow", Behavior::Sleep(Duration::from_secs(1)))
            .with_tool("vip", Behavior::Sleep(Duration::from_secs(1))),
    );
    let config = queued(1, Duration::from_secs(3600))
        .with_tool_settings("m__vip", ToolSettings::default().with_priority(10));
    let o = start(config, vec![p.clone()]).await;
    let started = tokio::time::Instant::now();
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut calls = Vec::new();
    for (who, tool, priority) in [
        ("holder", "m__slow", 0),
        ("a", "m__slow", 0),
        ("b", "m__slow", 0),
        ("interactive", "m__slow", 5),
        ("batch", "m__slow", -5),
        ("vip", "m__vip", 0),
    ] {
        let (o, finished) = (o.clone(), finished.clone());
        calls.push(tokio::spawn(async move {
            let ctx = CallContext::new().with_priority(priority);
            let r = o.execute(toolmux_core::ToolCall::new(tool, json!({})), &ctx).await;
            assert!(r.ok, "{r:?}");
            finished.lock().unwrap().push((who, started.elapsed().as_secs()));
        }));
        tokio::task::yield_now().await;
    }
    for call in calls {
        call.await.unwrap();
    }
    assert_eq!(
        *finished.lock().unwrap(),
        [("holder", 1), ("vip", 2), ("interactive", 3), ("a", 4), ("b", 5), ("batch", 6)]
    );
}

fn in_flight(max: usize, waiting: usize) -> OrchestratorConfig {
    OrchestratorConfig {
        max_calls_in_flight: max,
        max_waiting_calls: waiting,
        ..Default::default()
    }
}

/// Without any queue configured a provider has at most `maxCallsInFlight` calls running;
/// the next ones wait in order, and past the bound on waiting calls one fails at once
/// with `queue_busy`. Agents, whose calls make calls of their own, are not bounded.
#[tokio::test(start_paused = true)]
async fn a_provider_has_a_bounded_number_of_calls_in_flight() {
    let p = Arc::new(
        MockProvider::new("m").with_tool("slow", Behavior::Sleep(Duration::from_secs(10))),
    );
    let agents = Arc::new(
        MockProvider::new("a")
            .with_kind(ToolKind::Agent)
            .with_tool("slow", Behavior::Sleep(Duration::from_secs(10))),
    );
    let o = start(in_flight(2, 2), vec![p.clone(), agents.clone()]).await;
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let o = o.clone();
            let tool = if i < 4 { "m__slow" } else { "a__slow" };
            tokio::spawn(async move { call(&o, tool, json!({"i": i})).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(p.in_flight(), 2);
    assert_eq!(agents.in_flight(), 4);
    let refused = o.call_tool("m__slow", json!({"i": 4}), &CallContext::new()).await.unwrap_err();
    expect!["`m__slow` did not run: all 2 places to wait for one of the 2 calls `m` may have in flight are taken; call again later, or raise `defaults.maxCallsInFlight` (sixteen times as many calls may wait)"]
        .assert_eq(&refused.to_string());
    assert_eq!(refused.code(), "queue_busy");
    for call in futures::future::join_all(calls).await {
        assert!(call.unwrap().ok);
    }
    assert_eq!(p.max_in_flight(), 2);
    assert_eq!(p.total_calls(), 4);
}

/// A call waiting for one of its provider's slots stops at its deadline.
#[tokio::test(start_paused = true)]
async fn a_waiting_call_stops_at_its_deadline() {
    let p = Arc::new(
        MockProvider::new("m").with_tool("slow", Behavior::Sleep(Duration::from_secs(10))),
    );
    let o = start(in_flight(1, 8), vec![p.clone()]).await;
    let first = {
        let o = o.clone();
        tokio::spawn(async move { call(&o, "m__slow", json!({})).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ctx =
        CallContext::new().with_deadline(tokio::time::Instant::now() + Duration::from_secs(2));
    let e = o.call_tool("m__slow", json!({}), &ctx).await.unwrap_err();
    assert_eq!(e.code(), "timeout", "{e}");
    assert!(first.await.unwrap().ok);
    assert_eq!(p.total_calls(), 1);
}

/// A call has one deadline: the time it waits for one of its provider's slots counts
/// against its timeout. With one slot, a 4 s timeout and 3 s calls, the second call gets
/// what is left after its 3 s wait: a 0.5 s call finishes, a 3 s one times out 4 s after it
/// was made, and a call that waits out its whole timeout never runs, and says why.
#[tokio::test(start_paused = true)]
async fn the_wait_for_a_provider_slot_counts_against_the_timeout() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("slow", Behavior::Sleep(Duration::from_secs(3)))
            .with_tool("quick", Behavior::Sleep(Duration::from_millis(500))),
    );
    let o = start(in_flight(1, 8).with_tool_timeout(Duration::from_secs(4)), vec![p.clone()]).await;
    let t0 = tokio::time::Instant::now();
    let spawn = |tool: &'static str| {
        let o = o.clone();
        tokio::spawn(async move {
            let result = o.call_tool(tool, json!({}), &CallContext::new()).await;
            (result, t0.elapsed())
        })
    };
    let first = spawn("m__slow");
    tokio::task::yield_now().await;
    let quick = spawn("m__quick");
    tokio::task::yield_now().await;
    let (r, at) = first.await.unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(at, Duration::from_secs(3));
    let (r, at) = quick.await.unwrap();
    assert!(r.is_ok(), "waited 3s, ran 0.5s of the 1s left: {r:?}");
    assert_eq!(at, Duration::from_millis(3500));

    let t1 = tokio::time::Instant::now();
    let calls: Vec<_> = (0..3).map(|_| spawn("m__slow")).collect();
    let mut ended = Vec::new();
    for call in calls {
        let (r, at) = call.await.unwrap();
        ended.push((r.map(|_| ()).map_err(|e| e.to_string()), at - (t1 - t0)));
    }
    let (r, at) = &ended[0];
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(*at, Duration::from_secs(3));
    // Made at the same time as the first, it waited 3 s of its 4 s and ran 1 s.
    assert_eq!(ended[1].1, Duration::from_secs(4));
    expect!["timeout: `m__slow` did not finish within 4s: its timeout (4s, `tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`) counts the 3s it waited for a slot (a queue's or `defaults.maxCallsInFlight`), so it ran 1s"]
        .assert_eq(ended[1].0.as_ref().unwrap_err());
    // The third waited its whole timeout and never ran.
    assert_eq!(ended[2].1, Duration::from_secs(4));
    expect!["timeout: `m__slow` did not finish within 4s: it waited all of its timeout (4s, `tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`) for the one call `m` may have in flight (`defaults.maxCallsInFlight`) and did not run, as the wait counts against the timeout; call again later, or raise the timeout or the bound"]
        .assert_eq(ended[2].0.as_ref().unwrap_err());
    assert_eq!(p.calls_of("slow"), 3, "the third call never reached the provider");
}

/// The same holds for a named queue whose wait is longer than the timeout: the wait ends
/// with the timeout, and a call that got a slot late runs for what is left of it.
#[tokio::test(start_paused = true)]
async fn the_wait_for_a_queue_slot_counts_against_the_timeout() {
    let p =
        Arc::new(MockProvider::new("m").with_tool("slow", Behavior::Sleep(Duration::from_secs(3))));
    let config = queued(1, Duration::from_secs(60)).with_tool_timeout(Duration::from_secs(4));
    let o = start(config, vec![p.clone()]).await;
    let t0 = tokio::time::Instant::now();
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let o = o.clone();
            tokio::spawn(async move {
                let result = o.call_tool("m__slow", json!({}), &CallContext::new()).await;
                (result.map(|_| ()).map_err(|e| e.to_string()), t0.elapsed())
            })
        })
        .collect();
    let ended: Vec<_> =
        futures::future::join_all(calls).await.into_iter().map(Result::unwrap).collect();
    assert!(ended[0].0.is_ok(), "{ended:?}");
    assert_eq!(ended[0].1, Duration::from_secs(3));
    assert_eq!(ended[1].1, Duration::from_secs(4), "{ended:?}");
    assert!(ended[1].0.as_ref().unwrap_err().contains("counts the 3s it waited for a slot"));
    assert_eq!(ended[2].1, Duration::from_secs(4), "{ended:?}");
    expect!["timeout: `m__slow` did not finish within 4s: it waited all of its timeout (4s, `tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`) for a slot of queue `q` and did not run, as the wait counts against the timeout; call again later, or raise the timeout or the bound"]
        .assert_eq(ended[2].0.as_ref().unwrap_err());
}

/// A provider that times its own calls (an MCP server, its wait for an answer restarted by
/// progress, under a pipeline cap ten times as long) has its wait for an answer counted
/// from when a call began to wait for a slot: a call that waited 3 s of a 4 s wait and
/// reports no progress ends 4 s after it was made, not at the 40 s cap; one that reports
/// progress goes on, as its provider's wait restarts.
#[tokio::test(start_paused = true)]
async fn a_provider_s_wait_for_an_answer_counts_the_wait_for_a_slot() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("slow", Behavior::Sleep(Duration::from_secs(3)))
            .with_tool("steps", Behavior::Progress { steps: 3, interval: Duration::from_secs(1) }),
    );
    let settings = ToolSettings {
        timeout: Some(Duration::from_secs(40)),
        answer_wait: Some(Duration::from_secs(4)),
        ..ToolSettings::default()
    };
    let o = start(in_flight(1, 8).with_provider_settings("m", settings), vec![p.clone()]).await;
    let t0 = tokio::time::Instant::now();
    let spawn = |tool: &'static str| {
        let o = o.clone();
        tokio::spawn(async move {
            let result = o.call_tool(tool, json!({}), &CallContext::new()).await;
            (result.map(|_| ()).map_err(|e| e.to_string()), t0.elapsed())
        })
    };
    let first = spawn("m__slow");
    tokio::task::yield_now().await;
    let second = spawn("m__slow");
    tokio::task::yield_now().await;
    assert_eq!(first.await.unwrap(), (Ok(()), Duration::from_secs(3)));
    let (r, at) = second.await.unwrap();
    assert_eq!(at, Duration::from_secs(4), "{r:?}");
    expect!["timeout: `m__slow` did not finish within 4s: its timeout (4s, `tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`) counts the 3s it waited for a slot (a queue's or `defaults.maxCallsInFlight`), so it ran 1s"]
        .assert_eq(&r.unwrap_err());

    let t1 = t0.elapsed();
    let first = spawn("m__slow");
    tokio::task::yield_now().await;
    let steps = spawn("m__steps");
    tokio::task::yield_now().await;
    let starved = spawn("m__slow");
    tokio::task::yield_now().await;
    assert_eq!(first.await.unwrap(), (Ok(()), t1 + Duration::from_secs(3)));
    let (r, at) = starved.await.unwrap();
    assert_eq!(at, t1 + Duration::from_secs(4), "{r:?}");
    assert!(r.unwrap_err().contains("it waited all of its timeout (4s"));
    assert_eq!(
        steps.await.unwrap(),
        (Ok(()), t1 + Duration::from_secs(6)),
        "progress kept it going"
    );
}

/// A call that waited for its slot and then had less of its run's tool time
/// (`maxToolTimeMs`) left than of its timeout ends when the run's tool time runs out, counted
/// from when it got its slot, and says so: 5 s in the queue, 10 s of tool time left, a 60 s
/// timeout end it 10 s after it started, not 5 s. The error says how long it waited, which
/// is not tool time: the caller saw 15 s.
#[tokio::test(start_paused = true)]
async fn a_queued_call_runs_until_its_run_s_tool_time_is_spent() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("block", Behavior::Sleep(Duration::from_secs(5)))
            .with_tool("long", Behavior::Sleep(Duration::from_secs(30))),
    );
    let config = queued(1, Duration::from_secs(60))
        .with_tool_timeout(Duration::from_secs(60))
        .with_run_budget(toolmux_orchestrator::RunBudgetConfig {
            max_calls: None,
            max_tool_time: Some(Duration::from_secs(10)),
        });
    let o = start(config, vec![p.clone()]).await;
    let t0 = tokio::time::Instant::now();
    let blocker = {
        let o = o.clone();
        tokio::spawn(async move { o.call_tool("m__block", json!({}), &CallContext::new()).await })
    };
    tokio::task::yield_now().await;
    let run = CallContext::new().with_run_id("r");
    let e = o.call_tool("m__long", json!({}), &run).await.unwrap_err();
    assert_eq!(t0.elapsed(), Duration::from_secs(15), "5s queued, then 10s of tool time");
    expect!["timeout: `m__long` did not finish within 15s: the run's tool time ran out: 10s of its `defaults.maxToolTimeMs` (10s) was left when the call started running, after 5s waiting for a slot (waits are not tool time), less than the tool's timeout (60s); the run's next call fails with budget_exhausted"]
        .assert_eq(&e.to_string());
    assert!(blocker.await.unwrap().is_ok());
}

/// A call's wait for its turn under a rate limit counts against its timeout, as its waits
/// for slots do (one deadline per call): a call that waited 4 s of its 10 s runs 6 s at
/// most, where it ran its whole 8 s, and one whose turn would come past its timeout fails
/// at once, naming the limit and the wait, where it waited a minute and then ran.
#[tokio::test(start_paused = true)]
async fn the_wait_for_a_rate_limited_turn_counts_against_the_timeout() {
    use toolmux_orchestrator::RateLimit;
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("work", Behavior::Sleep(Duration::from_secs(8)))
            .with_tool("rare", Behavior::Echo),
    );
    let limited = |calls, per| ToolSettings {
        rate_limit: Some(RateLimit { calls, per, wait: Duration::from_secs(600) }),
        timeout: Some(Duration::from_secs(10)),
        ..ToolSettings::default()
    };
    let config = OrchestratorConfig::default()
        .with_tool_settings("m__work", limited(1, Duration::from_secs(4)))
        .with_tool_settings("m__rare", limited(1, Duration::from_secs(60)));
    let o = start(config, vec![p.clone()]).await;
    let t0 = tokio::time::Instant::now();
    let spawn = |tool: &'static str| {
        let o = o.clone();
        tokio::spawn(async move {
            let result = o.call_tool(tool, json!({}), &CallContext::new()).await;
            (result.map(|_| ()).map_err(|e| e.to_string()), t0.elapsed())
        })
    };
    let first = spawn("m__work");
    tokio::task::yield_now().await;
    let second = spawn("m__work");
    assert_eq!(first.await.unwrap(), (Ok(()), Duration::from_secs(8)));
    let (r, at) = second.await.unwrap();
    assert_eq!(at, Duration::from_secs(10), "{r:?}");
    expect!["timeout: `m__work` did not finish within 10s: its timeout (10s, `tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`) counts the 4s it waited before it ran (4s waiting for its turn under its rate limit), so it ran 6s"]
        .assert_eq(&r.unwrap_err());

    let t1 = t0.elapsed();
    assert!(o.call_tool("m__rare", json!({}), &CallContext::new()).await.is_ok());
    let e = o.call_tool("m__rare", json!({}), &CallContext::new()).await.unwrap_err();
    assert_eq!(t0.elapsed(), t1, "no wait");
    assert_eq!(e.code(), "timeout");
    expect!["timeout: `m__rare` did not finish within 10s: its turn under its rate limit (1 call per 1m) comes in 60s, at or past its timeout (10s, `tools.NAME.timeout`, else its server's `requestTimeoutMs`, else `defaults.toolTimeout`), which the wait counts against, so it did not wait and did not run; call again in 60s, or raise the timeout"]
        .assert_eq(&e.to_string());
    assert_eq!(p.calls_of("rare"), 1);
}
