//! Warmup, list changes, cancel, cleanup, and the orchestrator as a provider.

use crate::{call, start};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use toolmux_core::{CallContext, Health, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec};
use toolmux_orchestrator::{
    FilteredView, Orchestrator, OrchestratorConfig, QueueConfig, ToolSettings,
};
use toolmux_test_support::conformance::{Conformance, SampleCall};
use toolmux_test_support::mock::{Behavior, MockProvider};

/// Counts warmups running at once across providers.
#[derive(Debug)]
struct Slow {
    namespace: String,
    running: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

#[async_trait]
impl ToolProvider for Slow {
    fn kind(&self) -> ToolKind {
        ToolKind::Mcp
    }
    fn namespace(&self) -> &str {
        &self.namespace
    }
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec::new("t", "d", json!({"type": "object"}))])
    }
    async fn call(&self, _: &str, _: Value, _: &CallContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text("ok"))
    }
    async fn warmup(&self) -> Result<(), ToolError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn warmup_is_bounded_and_one_failure_stops_nothing() {
    let running = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let config = OrchestratorConfig {
        init_concurrency: 3,
        startup_timeout: Duration::from_secs(5),
        ..OrchestratorConfig::default()
    };
    let mut builder = Orchestrator::builder(config);
    for i in 0..9 {
        builder = builder.provider(Arc::new(Slow {
            namespace: format!("s{i}"),
            running: running.clone(),
            max: max.clone(),
        }));
    }
    let broken = Arc::new(
        MockProvider::new("broken").with_failing_warmup("command not found: nosuchserver"),
    );
    builder = builder.provider(broken.clone()).provider(Arc::new(
        MockProvider::new("stuck").with_warmup_delay(Duration::from_secs(3600)),
    ));
    let o = builder.build().unwrap();
    let started = tokio::time::Instant::now();
    let report = o.warmup().await;
    assert_eq!(max.load(Ordering::SeqCst), 3);
    assert!(started.elapsed() <= Duration::from_secs(9), "{:?}", started.elapsed());
    assert!(!report.is_ok());
    let failures: Vec<(&str, &str)> = report
        .providers
        .iter()
        .filter_map(|p| p.error.as_deref().map(|e| (p.namespace.as_str(), e)))
        .collect();
    assert_eq!(
        failures,
        [
            ("broken", "broken unavailable: command not found: nosuchserver"),
            ("stuck", "did not start within 5s (`startupTimeout`)")
        ]
    );
    assert_eq!(o.tools().len(), 9);
    assert!(call(&o, "s0__t", json!({})).await.ok);
    // A provider that failed to start is not asked for its tools at once (an MCP server
    // would wait out its reconnection backoff to fail again), only at the next listing.
    assert_eq!(broken.listings(), 0);
    o.refresh().await;
    assert_eq!(broken.listings(), 1);
}

/// A server that is down until `up` is set.
#[derive(Debug)]
struct Down {
    up: Arc<std::sync::atomic::AtomicBool>,
    tries: Arc<AtomicUsize>,
    /// Declares its tool (as an MCP server's configured `tools`).
    declares: bool,
}

#[async_trait]
impl ToolProvider for Down {
    fn kind(&self) -> ToolKind {
        ToolKind::Mcp
    }
    fn namespace(&self) -> &str {
        "late"
    }
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec::new("t", "d", json!({"type": "object"}))])
    }
    fn declared_tools(&self) -> Vec<ToolSpec> {
        match self.declares {
            true => vec![ToolSpec::new("t", "declared", json!({"type": "object"}))],
            false => Vec::new(),
        }
    }
    async fn call(&self, _: &str, _: Value, _: &CallContext) -> Result<ToolOutput, ToolError> {
        if !self.up.load(Ordering::SeqCst) {
            return Err(ToolError::Unavailable {
                provider: "late".into(),
                message: "cannot start: connection refused".into(),
            });
        }
        Ok(ToolOutput::text("up at last"))
    }
    async fn warmup(&self) -> Result<(), ToolError> {
        self.tries.fetch_add(1, Ordering::SeqCst);
        if self.up.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(ToolError::Unavailable {
                provider: "late".into(),
                message: "connection refused".into(),
            })
        }
    }
}

/// A provider down when the orchestrator starts is tried again in the background: once it
/// is up its tools are listed and subscribers told, with no reload (they stayed out).
#[tokio::test(start_paused = true)]
async fn a_provider_down_at_the_start_joins_when_it_comes_up() {
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tries = Arc::new(AtomicUsize::new(0));
    let down = Arc::new(Down { up: up.clone(), tries: tries.clone(), declares: false });
    let o = Orchestrator::builder(OrchestratorConfig::default())
        .provider(Arc::new(MockProvider::new("m").with_tool("a", Behavior::Echo)))
        .provider(down)
        .build()
        .unwrap();
    let report = o.warmup().await;
    assert!(!report.is_ok());
    assert!(o.registry().get("late__t").is_none());
    let mut changes = o.tool_list_changes().unwrap();
    // Still down: tried again, after 2 s then 4 s, without a change.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(tries.load(Ordering::SeqCst), 3);
    assert!(o.registry().get("late__t").is_none());
    let health = |o: &Orchestrator| {
        let all = ToolProvider::health_by_provider(o);
        all.into_iter().find(|p| p.namespace == "late").map(|p| p.health).unwrap()
    };
    // Whatever the provider says of itself, `/health` says it has not started.
    let down = health(&o);
    assert!(
        !down.ok && down.detail.as_deref().unwrap_or("").starts_with("not started yet"),
        "{down:?}"
    );
    up.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(30), changes.changed()).await.unwrap();
    assert_eq!(call(&o, "late__t", json!({})).await.result.unwrap(), "up at last");
    assert!(health(&o).ok);
    // Up for good: no more tries.
    let now = tries.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(tries.load(Ordering::SeqCst), now);
    o.cleanup().await;
}

/// A provider down when the orchestrator starts, which declares its tools, has them listed
/// meanwhile: a model knows them and a call says why it does not run; once it is up, its
/// own listing replaces them.
#[tokio::test(start_paused = true)]
async fn a_provider_down_at_the_start_offers_its_declared_tools() {
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tries = Arc::new(AtomicUsize::new(0));
    let down = Arc::new(Down { up: up.clone(), tries, declares: true });
    let o = Orchestrator::builder(OrchestratorConfig::default()).provider(down).build().unwrap();
    assert!(!o.warmup().await.is_ok());
    let listed = o.registry().get("late__t").map(|e| e.spec.description.clone());
    assert_eq!(listed.as_deref(), Some("declared"));
    let r = call(&o, "late__t", json!({})).await;
    assert!(r.conversation_text().contains("cannot start: connection refused"), "{r:?}");
    let mut changes = o.tool_list_changes().unwrap();
    up.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(30), changes.changed()).await.unwrap();
    let listed = o.registry().get("late__t").map(|e| e.spec.description.clone());
    assert_eq!(listed.as_deref(), Some("d"), "its own listing replaces the declared one");
    assert_eq!(call(&o, "late__t", json!({})).await.result.unwrap(), "up at last");
    o.cleanup().await;
}

/// `warmup_within`: the providers up by then are served at once; a slow one goes on
/// starting and joins the listings, with subscribers told, when it is up.
#[tokio::test(start_paused = true)]
async fn a_provider_slower_than_the_wait_joins_when_it_is_up() {
    let slow = MockProvider::new("slow")
        .with_tool("t", Behavior::Text("late".into()))
        .with_warmup_delay(Duration::from_secs(12));
    let o = Orchestrator::builder(OrchestratorConfig::default())
        .provider(Arc::new(MockProvider::new("m").with_tool("a", Behavior::Echo)))
        .provider(Arc::new(slow))
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let report = o.warmup_within(Some(Duration::from_secs(5))).await;
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    let slow_report = report.providers.iter().find(|p| p.namespace == "slow").unwrap();
    assert!(slow_report.starting, "{slow_report:?}");
    assert!(slow_report.error.as_deref().unwrap().starts_with("still starting after 5s"));
    assert!(call(&o, "m__a", json!({})).await.ok);
    assert!(o.registry().get("slow__t").is_none());
    let mut changes = o.tool_list_changes().unwrap();
    tokio::time::timeout(Duration::from_secs(30), changes.changed()).await.unwrap();
    assert_eq!(call(&o, "slow__t", json!({})).await.result.unwrap(), "late");
    o.cleanup().await;
}

#[tokio::test(start_paused = true)]
async fn list_changes_refresh_the_registry_and_signal_upward() {
    let p = Arc::new(MockProvider::new("m").with_tool("a", Behavior::Echo));
    let o = start(OrchestratorConfig::default(), vec![p.clone()]).await;
    let mut changes = o.tool_list_changes().unwrap();
    p.add_tool("b", Behavior::Text("new".into()));
    tokio::time::timeout(Duration::from_secs(5), changes.changed()).await.unwrap();
    assert_eq!(call(&o, "m__b", json!({})).await.result.unwrap(), "new");
}

/// A refresh of every provider that started before a provider's own `list_changed`
/// refresh, and ends after it, does not put the older listing back.
#[tokio::test(start_paused = true)]
async fn an_older_listing_never_replaces_a_newer_one() {
    let p = Arc::new(MockProvider::new("m").with_tool("a", Behavior::Echo));
    let o = start(OrchestratorConfig::default(), vec![p.clone()]).await;
    let mut changes = o.tool_list_changes().unwrap();
    p.set_list_delay(Duration::from_secs(5));
    let slow = {
        let o = o.clone();
        tokio::spawn(async move { o.refresh().await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    p.set_list_delay(Duration::ZERO);
    p.add_tool("b", Behavior::Text("new".into()));
    tokio::time::timeout(Duration::from_secs(2), changes.changed()).await.unwrap();
    assert_eq!(call(&o, "m__b", json!({})).await.result.unwrap(), "new");
    assert!(slow.await.unwrap().is_empty());
    let after = call(&o, "m__b", json!({})).await;
    assert_eq!(after.result.as_deref(), Some("new"), "{after:?}");
}

/// A provider registered while the orchestrator runs (the seeds' `register(provider)`):
/// its tools are listed and called through the same pipeline, subscribers are told, its own
/// list changes are followed, and a namespace in use, an invalid one, or a cleaned-up
/// orchestrator are refused.
#[tokio::test(start_paused = true)]
async fn a_provider_registered_while_running_joins_the_pipeline() {
    let first = Arc::new(MockProvider::new("m").with_tool("a", Behavior::Echo));
    let config = OrchestratorConfig::default().with_provider_settings(
        "late",
        ToolSettings::default().with_timeout(Duration::from_millis(50)),
    );
    let o = start(config, vec![first]).await;
    let mut changes = o.tool_list_changes().unwrap();
    let late = Arc::new(
        MockProvider::new("late")
            .with_tool("b", Behavior::Text("from late".into()))
            .with_tool("hang", Behavior::Hang),
    );
    let report = o.register(late.clone()).await.unwrap();
    let added = &report.providers[0];
    assert_eq!((added.namespace.as_str(), added.tools, &added.error), ("late", 2, &None));
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    tokio::time::timeout(Duration::from_secs(5), changes.changed()).await.unwrap();
    let names: Vec<String> = o.tools().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["m__a", "late__b", "late__hang"]);
    assert_eq!(call(&o, "late__b", json!({})).await.result.unwrap(), "from late");
    // The configuration's settings for its namespace apply to it.
    assert_eq!(call(&o, "late__hang", json!({})).await.extras["code"], "timeout");
    // Its own list changes are followed.
    late.add_tool("c", Behavior::Text("added".into()));
    tokio::time::timeout(Duration::from_secs(5), changes.changed()).await.unwrap();
    assert_eq!(call(&o, "late__c", json!({})).await.result.unwrap(), "added");

    let again = o.register(Arc::new(MockProvider::new("late"))).await.unwrap_err();
    assert!(again.to_string().contains("two providers use the namespace `late`"), "{again}");
    let invalid = o.register(Arc::new(MockProvider::new("no spaces"))).await.unwrap_err();
    assert!(invalid.to_string().starts_with("provider namespace"), "{invalid}");
    // One that fails to start is kept and says why.
    let broken = Arc::new(MockProvider::new("broken").with_failing_warmup("no such server"));
    let report = o.register(broken).await.unwrap();
    assert!(report.providers[0].error.as_ref().is_some_and(|e| e.contains("no such server")));
    // Its tools left out are the report's problems (those before it are not repeated).
    let bad = ToolSpec::new("bad", "d", json!({"type": 5}));
    let odd = Arc::new(MockProvider::new("odd").with_spec(bad, Behavior::Echo));
    let report = o.register(odd).await.unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0].message.contains("`bad` of provider `odd`"),
        "{:?}",
        report.problems
    );
    assert_eq!(o.providers().len(), 4);
    o.cleanup().await;
    assert!(late.is_shut_down(), "cleaned up with the others");
    let closed = o.register(Arc::new(MockProvider::new("later"))).await.unwrap_err();
    assert!(closed.to_string().contains("was cleaned up"), "{closed}");
}

#[tokio::test(start_paused = true)]
async fn cancel_aborts_everything_in_flight_and_frees_slots() {
    let p = Arc::new(
        MockProvider::new("m").with_tool("hang", Behavior::Hang).with_tool("ok", Behavior::Echo),
    );
    let config = OrchestratorConfig::default()
        .with_queue("q", QueueConfig::new(2))
        .with_provider_settings("m", ToolSettings::default().with_queue("q"));
    let o = start(config, vec![p.clone()]).await;
    let pending: Vec<_> = (0..5)
        .map(|_| {
            let o = o.clone();
            tokio::spawn(async move { call(&o, "m__hang", json!({})).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(p.in_flight(), 2);
    o.cancel();
    for r in futures::future::join_all(pending).await {
        assert_eq!(r.unwrap().extras["code"], "cancelled");
    }
    assert_eq!(p.in_flight(), 0);
    assert!(call(&o, "m__ok", json!({})).await.ok, "usable after cancel");
    o.cleanup().await;
    assert!(p.is_shut_down());
}

#[tokio::test]
async fn the_orchestrator_is_a_conforming_provider() {
    let p = Arc::new(
        MockProvider::new("m")
            .with_tool("echo", Behavior::Echo)
            .with_tool("hang", Behavior::Hang)
            .with_instructions("use m wisely"),
    );
    let o = start(OrchestratorConfig::default(), vec![p]).await;
    Conformance::new()
        .with_sample(SampleCall::new("m__echo", json!({"x": 1})).expect_text_contains("\"x\":1"))
        .with_cancellable(SampleCall::new("m__hang", json!({})))
        .check(&o)
        .await;
    assert_eq!(ToolProvider::instructions(&o).unwrap(), "## m\nuse m wisely");
    let view = FilteredView::new(o.clone(), vec!["m__echo".into()]);
    let names: Vec<String> = view.list_tools().await.unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["m__echo"]);
    let err = view.call("m__hang", json!({}), &CallContext::new()).await.unwrap_err();
    assert_eq!(err.code(), "unknown_tool");
}

/// The orchestrator tells each provider's health by namespace, and is healthy only when
/// every one is; a view tells only of the providers in view.
#[tokio::test]
async fn health_is_told_per_provider() {
    let up = Arc::new(MockProvider::new("up").with_tool("echo", Behavior::Echo));
    let down = Arc::new(MockProvider::new("down").with_tool("echo", Behavior::Echo));
    let o = start(OrchestratorConfig::default(), vec![up.clone(), down.clone()]).await;
    let namespaces = |o: &dyn ToolProvider| -> Vec<String> {
        o.health_by_provider().into_iter().map(|p| p.namespace).collect()
    };
    assert!(namespaces(&o).starts_with(&["up".to_owned(), "down".to_owned()]));
    assert_eq!(ToolProvider::health(&o), Health::ok());
    down.set_health(Health::unhealthy("connection closed; restarts on the next call"));
    up.set_health(Health::ok().with_detail("not started"));
    let parts = o.health_by_provider();
    let down_health = parts.iter().find(|p| p.namespace == "down").map(|p| p.health.clone());
    assert_eq!(
        down_health,
        Some(Health::unhealthy("connection closed; restarts on the next call"))
    );
    assert_eq!(ToolProvider::health(&o), Health::unhealthy("unhealthy: down"));
    let view = FilteredView::new(o.clone(), vec!["up__*".into()]);
    assert_eq!(namespaces(&view), ["up"]);
    assert_eq!(view.health(), Health::ok());
    let view = FilteredView::new(o, vec!["down__*".into()]);
    assert_eq!(view.health(), Health::unhealthy("unhealthy: down"));
}

/// An ended run reaches every provider (a per-session server closes), also through a
/// filtered view and through the orchestrator served as a provider.
#[tokio::test]
async fn an_ended_run_reaches_every_provider() {
    let a = Arc::new(MockProvider::new("a").with_tool("t", Behavior::Echo));
    let b = Arc::new(MockProvider::new("b").with_tool("t", Behavior::Echo));
    let o = start(OrchestratorConfig::default(), vec![a.clone(), b.clone()]).await;
    o.end_run("run-1");
    FilteredView::new(o.clone(), vec!["a__*".into()]).end_run("run-2");
    ToolProvider::end_run(&o, "run-3");
    for p in [&a, &b] {
        assert_eq!(p.ended_runs(), ["run-1", "run-2", "run-3"]);
    }
}
