//! Response cache: TTL, cacheable tools only, single-flight, errors never cached.

use crate::{call, start};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::ToolProvider;
use toolmux_orchestrator::{OrchestratorConfig, ToolSettings};
use toolmux_test_support::mock::{Behavior, MockProvider};

fn provider() -> Arc<MockProvider> {
    Arc::new(
        MockProvider::new("api")
            .with_read_only_tool("get", Behavior::Echo)
            .with_read_only_tool("slow", Behavior::Sleep(Duration::from_secs(1)))
            .with_read_only_tool("broken", Behavior::ErrorOutput("nope".into()))
            .with_read_only_tool(
                "noted",
                Behavior::Output(
                    toolmux_core::ToolOutput::text("unchanged since your last read")
                        .with_extra(toolmux_orchestrator::cache::PER_RUN, json!(true)),
                ),
            )
            .with_tool("post", Behavior::Echo)
            .with_spec(
                toolmux_core::ToolSpec::new("put", "sets the value", json!({"type": "object"}))
                    .with_annotations(toolmux_core::ToolAnnotations {
                        idempotent: true,
                        ..toolmux_core::ToolAnnotations::default()
                    }),
                Behavior::Echo,
            ),
    )
}

fn config() -> OrchestratorConfig {
    OrchestratorConfig::default()
        .with_provider_settings("api", ToolSettings::default().with_cache(Duration::from_secs(60)))
}

#[tokio::test(start_paused = true)]
async fn read_only_results_are_cached_for_the_ttl() {
    let p = provider();
    let o = start(config(), vec![p.clone()]).await;
    for _ in 0..3 {
        assert!(call(&o, "api__get", json!({"a": 1, "b": 2})).await.ok);
    }
    // Key order does not matter: canonical JSON.
    assert!(call(&o, "api__get", json!({"b": 2, "a": 1})).await.ok);
    assert_eq!(p.calls_of("get"), 1);
    assert!(call(&o, "api__get", json!({"a": 2})).await.ok);
    assert_eq!(p.calls_of("get"), 2);
    tokio::time::advance(Duration::from_secs(61)).await;
    assert!(call(&o, "api__get", json!({"a": 1, "b": 2})).await.ok);
    assert_eq!(p.calls_of("get"), 3);
}

#[tokio::test(start_paused = true)]
async fn tools_that_write_are_not_cached_unless_configured_per_tool() {
    let p = provider();
    let o = start(config(), vec![p.clone()]).await;
    call(&o, "api__post", json!({})).await;
    call(&o, "api__post", json!({})).await;
    assert_eq!(p.calls_of("post"), 2);
    // Idempotent is not read-only: `put A`, `put B`, `put A` must leave A, so the third
    // runs too.
    for value in ["A", "B", "A"] {
        assert!(call(&o, "api__put", json!({"value": value})).await.ok);
    }
    assert_eq!(p.calls_of("put"), 3);

    let p = provider();
    let forced = config().with_tool_settings(
        "api__post",
        ToolSettings::default().with_cache(Duration::from_secs(5)),
    );
    let o = start(forced, vec![p.clone()]).await;
    call(&o, "api__post", json!({})).await;
    call(&o, "api__post", json!({})).await;
    assert_eq!(p.calls_of("post"), 1);
}

/// A provider's `cache` over tools none of which says it only reads caches nothing, and
/// the warmup says so instead of leaving it silent.
#[tokio::test(start_paused = true)]
async fn a_provider_cache_that_caches_nothing_is_warned_about() {
    let writer = || {
        Arc::new(MockProvider::new("w").with_tool("post", Behavior::Echo)) as Arc<dyn ToolProvider>
    };
    let cached = ToolSettings::default().with_cache(Duration::from_secs(300));
    let o = start(
        OrchestratorConfig::default().with_provider_settings("w", cached.clone()),
        vec![writer()],
    )
    .await;
    let problems = o.warmup().await.problems;
    let warned = problems.iter().find(|p| p.message.contains("provider `w` has `cache`"));
    let warned = warned.unwrap_or_else(|| panic!("{problems:?}"));
    assert!(warned.message.contains("tools: {w__NAME: {cache: MS}}"), "{}", warned.message);
    // With a read-only tool among them, it caches that one and says nothing.
    let mixed = Arc::new(
        MockProvider::new("w")
            .with_tool("post", Behavior::Echo)
            .with_read_only_tool("get", Behavior::Echo),
    );
    let o =
        start(OrchestratorConfig::default().with_provider_settings("w", cached), vec![mixed]).await;
    assert!(o.warmup().await.problems.is_empty());
}

#[tokio::test(start_paused = true)]
async fn identical_concurrent_calls_run_once() {
    let p = provider();
    let o = start(config(), vec![p.clone()]).await;
    let calls = (0..20).map(|_| call(&o, "api__slow", json!({"q": 1})));
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().all(|r| r.ok));
    assert_eq!(p.calls_of("slow"), 1);
}

/// Counts the results it sees and marks them.
#[derive(Debug, Default)]
struct Seen(std::sync::atomic::AtomicUsize);

#[async_trait::async_trait]
impl toolmux_orchestrator::AfterHook for Seen {
    async fn after(
        &self,
        _tool: &str,
        output: &mut toolmux_core::ToolOutput,
        _ctx: &toolmux_core::CallContext,
    ) -> Result<(), toolmux_core::ToolError> {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        output.content.push(toolmux_core::ContentPart::Text { text: format!("seen {n}") });
        Ok(())
    }
}

/// Every call's result passes the after-hooks, one answered from the cache too; the
/// cache holds the provider's output, not a hook's rewrite of it.
#[tokio::test(start_paused = true)]
async fn after_hooks_see_cached_results_too() {
    let p = provider();
    let seen = Arc::new(Seen::default());
    let o = toolmux_orchestrator::Orchestrator::builder(config())
        .provider(p.clone())
        .after_hook("api__*", seen.clone())
        .build()
        .unwrap();
    o.warmup().await;
    let first = call(&o, "api__get", json!({"a": 1})).await;
    let second = call(&o, "api__get", json!({"a": 1})).await;
    assert_eq!(p.calls_of("get"), 1);
    assert!(first.conversation_text().ends_with("seen 1"), "{}", first.conversation_text());
    assert!(second.conversation_text().ends_with("seen 2"), "{}", second.conversation_text());
    assert!(!second.conversation_text().contains("seen 1"), "{}", second.conversation_text());
}

/// An output that answers its run alone ("unchanged since your last read") is never
/// served to another call from the cache.
#[tokio::test(start_paused = true)]
async fn outputs_for_one_run_are_never_cached() {
    let p = provider();
    let o = start(config(), vec![p.clone()]).await;
    assert!(call(&o, "api__noted", json!({})).await.ok);
    assert!(call(&o, "api__noted", json!({})).await.ok);
    assert_eq!(p.calls_of("noted"), 2);
}

#[tokio::test(start_paused = true)]
async fn error_results_are_never_cached() {
    let p = provider();
    let o = start(config(), vec![p.clone()]).await;
    assert!(!call(&o, "api__broken", json!({})).await.ok);
    assert!(!call(&o, "api__broken", json!({})).await.ok);
    assert_eq!(p.calls_of("broken"), 2);
}

/// A provider whose outputs depend on the calling run (a connection per run, files read in
/// the run) has its outputs cached for that run only: another run calls it again.
#[tokio::test(start_paused = true)]
async fn outputs_of_providers_with_state_per_run_are_cached_per_run() {
    let p = Arc::new(
        MockProvider::new("api").with_state_per_run().with_read_only_tool("get", Behavior::Echo),
    );
    let o = start(config(), vec![p.clone()]).await;
    let in_run = |run: &str| toolmux_core::CallContext::new().with_run_id(run);
    let get = || toolmux_core::ToolCall::new("api__get", json!({"a": 1}));
    assert!(o.execute(get(), &in_run("one")).await.ok);
    assert!(o.execute(get(), &in_run("one")).await.ok);
    assert_eq!(p.calls_of("get"), 1, "shared within its run");
    assert!(o.execute(get(), &in_run("two")).await.ok);
    assert_eq!(p.calls_of("get"), 2, "not across runs");
}

/// A caller waiting for another's identical call (single-flight) stops when it is
/// cancelled, not when that call ends; the other call goes on.
#[tokio::test(start_paused = true)]
async fn a_coalesced_caller_that_is_cancelled_stops_waiting() {
    use toolmux_core::{CallContext, ToolCall};
    let p = provider();
    let o = start(config(), vec![p.clone()]).await;
    let leader = {
        let o = o.clone();
        tokio::spawn(async move {
            o.execute(ToolCall::new("api__slow", json!({})), &CallContext::new()).await
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    let cancel = tokio_util::sync::CancellationToken::new();
    let waiter_ctx = CallContext::new().with_cancel(cancel.clone());
    let waiter = {
        let o = o.clone();
        tokio::spawn(
            async move { o.execute(ToolCall::new("api__slow", json!({})), &waiter_ctx).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    let started = tokio::time::Instant::now();
    let waited = waiter.await.unwrap();
    assert!(!waited.ok && started.elapsed() < Duration::from_millis(500), "{waited:?}");
    assert_eq!(waited.extras["code"], "cancelled", "{waited:?}");
    let led = leader.await.unwrap();
    assert!(led.ok, "{led:?}");
    assert_eq!(p.calls_of("slow"), 1);
}

/// A caller waiting for another's identical call is bounded by its own limits, not the
/// other call's: its context's deadline, and its run's tool time (`maxToolTimeMs`). The
/// other call goes on and is cached.
#[tokio::test(start_paused = true)]
async fn a_coalesced_caller_waits_no_longer_than_its_own_limits() {
    use toolmux_core::{CallContext, ToolCall};
    use toolmux_orchestrator::RunBudgetConfig;
    let p = Arc::new(
        MockProvider::new("api")
            .with_read_only_tool("slow", Behavior::Sleep(Duration::from_secs(10)))
            .with_read_only_tool("nap", Behavior::Sleep(Duration::from_secs(2))),
    );
    let config = config().with_run_budget(RunBudgetConfig {
        max_calls: None,
        max_tool_time: Some(Duration::from_secs(5)),
    });
    let o = start(config, vec![p.clone()]).await;
    // The leader is outside every budget: it runs its 10s.
    let leader = {
        let o = o.clone();
        let ctx = CallContext::new().outside_budget();
        tokio::spawn(async move { o.execute(ToolCall::new("api__slow", json!({})), &ctx).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Its context's deadline.
    let started = tokio::time::Instant::now();
    let ctx = CallContext::new().with_deadline(started + Duration::from_secs(1));
    let waited = o.execute(ToolCall::new("api__slow", json!({})), &ctx).await;
    assert_eq!(waited.extras["code"], "timeout", "{waited:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // Its run's tool time: 2s spent of 5, so 3s of waiting.
    let run = CallContext::new().with_run_id("r");
    assert!(o.execute(ToolCall::new("api__nap", json!({})), &run).await.ok);
    let started = tokio::time::Instant::now();
    let waited = o.execute(ToolCall::new("api__slow", json!({})), &run).await;
    assert_eq!(waited.extras["code"], "timeout", "{waited:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    let led = leader.await.unwrap();
    assert!(led.ok, "{led:?}");
    assert_eq!(p.calls_of("slow"), 1);
    // The output the waiters gave up on is cached; a cached output costs no tool time.
    let cached = o.execute(ToolCall::new("api__slow", json!({})), &run).await;
    assert!(cached.ok, "{cached:?}");
    assert_eq!(p.calls_of("slow"), 1);
}

/// Identical calls to a tool that hangs end within their own timeout, counted from when
/// each came: a caller that waited for another's call, which failed, and then ran it
/// itself does not get a whole timeout more. (Three calls took one timeout each, one
/// after another: the third ended after 3 s.)
#[tokio::test(start_paused = true)]
async fn identical_calls_to_a_hanging_tool_end_within_their_own_timeout() {
    let p = Arc::new(
        MockProvider::new("api")
            .with_read_only_tool("hang", Behavior::Sleep(Duration::from_secs(10))),
    );
    let settings = ToolSettings::default()
        .with_cache(Duration::from_secs(60))
        .with_timeout(Duration::from_secs(1));
    let config = OrchestratorConfig::default().with_provider_settings("api", settings);
    let o = start(config, vec![p.clone()]).await;
    let started = tokio::time::Instant::now();
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let o = o.clone();
            tokio::spawn(async move {
                let r = call(&o, "api__hang", json!({})).await;
                (r, started.elapsed())
            })
        })
        .collect();
    for done in futures::future::join_all(calls).await {
        let (r, took) = done.unwrap();
        assert_eq!(r.extras.get("code"), Some(&json!("timeout")), "{r:?}");
        assert!(took <= Duration::from_secs(1), "{took:?}: {r:?}");
    }
}

/// `Orchestrator::cancel` stops the callers waiting for an identical call as well as the
/// call itself: none of them takes over and runs the tool again.
#[tokio::test(start_paused = true)]
async fn cancel_stops_coalesced_callers_too() {
    let p = provider();
    let o = start(config(), vec![p.clone()]).await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let o = o.clone();
            tokio::spawn(async move { call(&o, "api__slow", json!({})).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(p.calls_of("slow"), 1);
    o.cancel();
    for r in futures::future::join_all(calls).await {
        let r = r.unwrap();
        assert_eq!(r.extras.get("code"), Some(&json!("cancelled")), "{r:?}");
    }
    assert_eq!(p.calls_of("slow"), 1, "no waiter ran the call again");
    assert!(call(&o, "api__slow", json!({})).await.ok, "usable after cancel");
}

/// A cache that keeps what it is given, to look at.
#[derive(Debug, Default)]
struct Kept(std::sync::Mutex<Vec<toolmux_core::ToolOutput>>);

#[async_trait::async_trait]
impl toolmux_orchestrator::cache::ResponseCache for Kept {
    async fn get(&self, _key: &str) -> Option<toolmux_core::ToolOutput> {
        None
    }

    async fn put(&self, _key: &str, output: &toolmux_core::ToolOutput, _ttl: Duration) {
        self.0.lock().expect("not poisoned").push(output.clone());
    }
}

/// What goes into the response cache has the configuration's secrets redacted, as a
/// spilled output has: a shared cache (Redis) is storage that other processes read.
#[tokio::test]
async fn cached_outputs_are_kept_with_secrets_redacted() {
    let kept = Arc::new(Kept::default());
    let o = toolmux_orchestrator::Orchestrator::builder(config())
        .provider(provider())
        .cache(kept.clone())
        .secrets(["s3cr3t-value".to_owned()])
        .build()
        .expect("valid configuration");
    o.warmup().await;
    let result = call(&o, "api__get", json!({"token": "s3cr3t-value"})).await;
    assert!(result.ok, "{result:?}");
    let stored = kept.0.lock().expect("not poisoned").clone();
    assert_eq!(stored.len(), 1, "{stored:?}");
    let text = serde_json::to_string(&stored[0]).expect("JSON");
    assert!(text.contains("[redacted]") && !text.contains("s3cr3t"), "{text}");
}

/// A response cache that several orchestrators (replicas) share, with a lead per key as a
/// shared store's lock gives it.
#[derive(Debug, Default)]
struct SharedCache {
    outputs: toolmux_orchestrator::cache::MemoryCache,
    leaders: Arc<std::sync::Mutex<Leaders>>,
}

type Leaders = std::collections::HashMap<String, tokio::sync::watch::Receiver<()>>;

/// The lead of one key, given up when dropped: its followers wake.
struct Leader {
    leaders: Arc<std::sync::Mutex<Leaders>>,
    key: String,
    _given_up: tokio::sync::watch::Sender<()>,
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.leaders.lock().expect("not poisoned").remove(&self.key);
    }
}

#[async_trait::async_trait]
impl toolmux_orchestrator::cache::ResponseCache for SharedCache {
    async fn get(&self, key: &str) -> Option<toolmux_core::ToolOutput> {
        self.outputs.get(key).await
    }

    async fn put(&self, key: &str, output: &toolmux_core::ToolOutput, ttl: Duration) {
        self.outputs.put(key, output, ttl).await;
    }

    async fn lead(&self, key: &str) -> toolmux_orchestrator::cache::Lead {
        use toolmux_orchestrator::cache::Lead;
        let mut leaders = self.leaders.lock().expect("not poisoned");
        if let Some(given_up) = leaders.get(key) {
            let mut given_up = given_up.clone();
            return Lead::Follow(Box::pin(async move {
                let _ = given_up.changed().await;
            }));
        }
        let (sender, receiver) = tokio::sync::watch::channel(());
        leaders.insert(key.to_owned(), receiver);
        let leaders = self.leaders.clone();
        Lead::Leading(Box::new(Leader { leaders, key: key.to_owned(), _given_up: sender }))
    }
}

/// With a cache that leads across processes (`ResponseCache::lead`), identical concurrent
/// calls of two orchestrators run once; a leader that is cancelled hands over to the
/// other, which runs the call itself.
#[tokio::test(start_paused = true)]
async fn a_shared_cache_coalesces_identical_calls_of_replicas() {
    let cache = Arc::new(SharedCache::default());
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let p = provider();
        let o = toolmux_orchestrator::Orchestrator::builder(config())
            .provider(p.clone())
            .cache(cache.clone())
            .build()
            .expect("valid configuration");
        o.warmup().await;
        replicas.push((o, p));
    }
    let slow_calls = || replicas.iter().map(|(_, p)| p.calls_of("slow")).sum::<u64>();
    let started = tokio::time::Instant::now();
    let spawn = |at: usize, ctx: toolmux_core::CallContext| {
        let o = replicas[at].0.clone();
        tokio::spawn(async move {
            o.execute(toolmux_core::ToolCall::new("api__slow", json!({})), &ctx).await
        })
    };
    let first = spawn(0, toolmux_core::CallContext::new());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = spawn(1, toolmux_core::CallContext::new());
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert!(first.ok && second.ok, "{first:?} {second:?}");
    assert_eq!(first.result, second.result);
    assert_eq!(slow_calls(), 1, "the second replica waited for the first one's call");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    // Served from the shared cache now, by either.
    assert!(call(&replicas[1].0, "api__slow", json!({})).await.ok);
    assert_eq!(slow_calls(), 1);

    // The leader's caller cancels: the follower runs the call, not failing with it.
    let started = tokio::time::Instant::now();
    let leader = toolmux_core::CallContext::new();
    let cancel = leader.cancel_token().clone();
    let spawn = |at: usize, ctx: toolmux_core::CallContext| {
        let o = replicas[at].0.clone();
        tokio::spawn(async move {
            o.execute(toolmux_core::ToolCall::new("api__slow", json!({"n": 2})), &ctx).await
        })
    };
    let first = spawn(0, leader);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = spawn(1, toolmux_core::CallContext::new());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(slow_calls(), 2, "only the leader runs it");
    cancel.cancel();
    let first = first.await.unwrap();
    assert_eq!(first.extras.get("code"), Some(&json!("cancelled")), "{first:?}");
    let second = second.await.unwrap();
    assert!(second.ok, "{second:?}");
    assert_eq!(slow_calls(), 3);
    assert_eq!(started.elapsed(), Duration::from_millis(1200));

    // A follower waits within its own deadline, not the leader's call.
    let started = tokio::time::Instant::now();
    let spawn = |at: usize, ctx: toolmux_core::CallContext| {
        let o = replicas[at].0.clone();
        tokio::spawn(async move {
            o.execute(toolmux_core::ToolCall::new("api__slow", json!({"n": 3})), &ctx).await
        })
    };
    let first = spawn(0, toolmux_core::CallContext::new());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deadline = started + Duration::from_millis(300);
    let second = spawn(1, toolmux_core::CallContext::new().with_deadline(deadline)).await.unwrap();
    assert_eq!(second.extras.get("code"), Some(&json!("timeout")), "{second:?}");
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert!(first.await.unwrap().ok);
    assert_eq!(slow_calls(), 4);
}
