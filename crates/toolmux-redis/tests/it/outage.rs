//! A Redis that stops or hangs mid-way: every call ends by its deadline, none hangs, and
//! the backends work again once the server answers.

use crate::within;
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::{ToolError, ToolOutput};
use toolmux_external::{ExecutionType, ExternalResult, PendingCall, PendingStore};
use toolmux_orchestrator::QueueConfig;
use toolmux_orchestrator::cache::ResponseCache;
use toolmux_orchestrator::queue::QueueBackend;
use toolmux_redis::{RedisBackend, RedisConfig};
use toolmux_test_support::redis::RedisServer;

fn call(is_async: bool) -> PendingCall {
    PendingCall {
        call_id: String::new(),
        tool: "external__confirm".into(),
        arguments: serde_json::json!({}),
        run_id: "run".into(),
        owner: None,
        execution_type: ExecutionType::External,
        is_async,
        visible: true,
        created_ms: 0,
        status: Default::default(),
        expires_ms: 0,
        ttl_ms: None,
    }
}

/// Asserts that `took` is at least `wait` and not much more.
fn ended_by(took: Duration, wait: Duration, what: &str) {
    assert!(
        took < wait + Duration::from_millis(400),
        "{what} took {took:?}, its wait was {wait:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_fails_calls_by_their_deadlines() {
    let mut server = RedisServer::start();
    let config = RedisConfig::new(server.url()).with_timeout(Duration::from_millis(500));
    let backend = RedisBackend::connect(&config).await.unwrap();
    let queue = backend.queues().queue("q", &QueueConfig::new(1));
    let (cache, store) = (backend.cache(), backend.pending_store());
    let held = queue.acquire(Duration::from_secs(1)).await.expect("a slot while redis runs");
    let id = store.open(call(false)).await.unwrap();

    server.stop();
    let limit = Duration::from_secs(5);
    drop(held);
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    assert!(within(limit, "acquire", queue.acquire(wait)).await.is_none());
    ended_by(started.elapsed(), wait, "acquire");
    assert!(within(limit, "cache get", cache.get("k")).await.is_none());
    within(limit, "cache put", cache.put("k", &ToolOutput::text("v"), Duration::from_secs(9)))
        .await;
    let opened = within(limit, "open", store.open(call(false))).await.unwrap_err();
    assert!(matches!(opened, ToolError::Transport { .. }), "{opened:?}");
    assert!(opened.is_transient());
    let started = Instant::now();
    assert_eq!(within(limit, "wait", store.wait(&id, wait)).await, None);
    ended_by(started.elapsed(), wait, "wait");
    // An outage is not "nothing pending": listing, reading the inbox and counting fail.
    let started = Instant::now();
    let listed = within(limit, "long poll", store.pending(&[], wait)).await.unwrap_err();
    assert!(matches!(listed, ToolError::Transport { .. }), "{listed:?}");
    ended_by(started.elapsed(), wait, "long poll");
    let answer = ExternalResult { result: serde_json::json!("x"), is_error: false };
    assert!(within(limit, "resolve", store.resolve(&id, answer)).await.is_err());
    within(limit, "withdraw", store.withdraw(&id)).await;
    let inbox = within(limit, "inbox", store.take_inbox("run", None)).await.unwrap_err();
    assert!(matches!(inbox, ToolError::Transport { .. }), "{inbox:?}");
    let counted = within(limit, "count", store.count_pending("run", None)).await.unwrap_err();
    assert!(matches!(counted, ToolError::Transport { .. }), "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_fails_calls_by_their_deadlines_and_recovers() {
    let server = RedisServer::start();
    let config = RedisConfig::new(server.url()).with_timeout(Duration::from_millis(300));
    let backend = RedisBackend::connect(&config).await.unwrap();
    let queue = backend.queues().queue("q", &QueueConfig::new(1));
    let cache = backend.cache();
    let store = backend.pending_store();
    cache.put("k", &ToolOutput::text("v"), Duration::from_secs(60)).await;
    // Another client makes the server hold every command for 2 s: connections stay open
    // and nothing answers, the worst case for a client without timeouts.
    let admin = RedisBackend::new(&RedisConfig::new(server.url())).unwrap();
    admin.client().command(&["CLIENT", "PAUSE", "2000", "ALL"]).await.unwrap();
    let paused = Instant::now();
    let limit = Duration::from_secs(5);
    let wait = Duration::from_millis(400);
    let started = Instant::now();
    assert!(within(limit, "acquire", queue.acquire(wait)).await.is_none());
    ended_by(started.elapsed(), wait, "acquire");
    let started = Instant::now();
    assert!(within(limit, "cache get", cache.get("k")).await.is_none());
    ended_by(started.elapsed(), Duration::from_millis(300), "cache get");
    // Known to be down: the next reads miss at once instead of waiting for the timeout.
    let started = Instant::now();
    assert!(cache.get("k").await.is_none());
    assert!(started.elapsed() < Duration::from_millis(100), "{:?}", started.elapsed());
    let started = Instant::now();
    assert!(within(limit, "open", store.open(call(true))).await.is_err());
    ended_by(started.elapsed(), Duration::from_millis(300), "open");
    assert!(paused.elapsed() < Duration::from_secs(2), "the checks ran while paused");

    // The pause ends by itself: the same backend serves again.
    let slot =
        within(limit, "acquire after the pause", queue.acquire(Duration::from_secs(4))).await;
    assert!(slot.is_some());
    toolmux_test_support::eventually("the cache hits again", || async {
        cache.get("k").await == Some(ToolOutput::text("v"))
    })
    .await;
    assert!(store.open(call(true)).await.is_ok());
}

/// Through the external tools, a Redis that does not answer is an error of
/// `external__pending` and `external__inbox`, never an empty list a program would take for
/// "nothing pending" or "no result yet".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_external_tools_report_an_outage_as_an_error() {
    use toolmux_core::{CallContext, ToolProvider as _};
    let mut server = RedisServer::start();
    let config = RedisConfig::new(server.url()).with_timeout(Duration::from_millis(300));
    let backend = RedisBackend::connect(&config).await.unwrap();
    let tools = std::collections::BTreeMap::from([(
        "deploy".to_owned(),
        toolmux_external::ExternalToolConfig {
            description: "d".into(),
            is_async: true,
            ..Default::default()
        },
    )]);
    let store = std::sync::Arc::new(backend.pending_store());
    let provider = toolmux_external::ExternalProvider::new(&tools, store).unwrap();
    let ctx = CallContext::new().with_run_id("run");
    provider.call("deploy", serde_json::json!({}), &ctx).await.unwrap();
    let listed = provider.call("pending", serde_json::json!({}), &ctx).await.unwrap();
    assert!(listed.to_text().contains("external__deploy"), "{}", listed.to_text());

    server.stop();
    let limit = Duration::from_secs(5);
    for (tool, arguments) in
        [("pending", serde_json::json!({})), ("pending", serde_json::json!({"waitMs": 200}))]
    {
        let failed = within(limit, tool, provider.call(tool, arguments, &ctx)).await;
        let error = failed.expect_err("an outage is no empty list");
        assert!(matches!(error, ToolError::Transport { .. }), "{error:?}");
    }
    let inbox = within(limit, "inbox", provider.call("inbox", serde_json::json!({}), &ctx)).await;
    assert!(matches!(inbox, Err(ToolError::Transport { .. })), "{inbox:?}");
}

/// A wait whose first claim Redis does not answer in time (a pause shorter than the wait)
/// goes on waiting instead of giving up at once: the result submitted once Redis answers
/// again reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_outlives_a_claim_redis_answers_late() {
    let server = RedisServer::start();
    let config = RedisConfig::new(server.url()).with_timeout(Duration::from_millis(300));
    let waiter = RedisBackend::connect(&config).await.unwrap().pending_store();
    let answerer = RedisBackend::connect(&RedisConfig::new(server.url())).await.unwrap();
    let answerer = answerer.pending_store();
    let id = waiter.open(call(false)).await.unwrap();
    let admin = RedisBackend::new(&RedisConfig::new(server.url())).unwrap();
    admin.client().command(&["CLIENT", "PAUSE", "800", "ALL"]).await.unwrap();
    let started = Instant::now();
    let waiting = {
        let (waiter, id) = (waiter.clone(), id.clone());
        tokio::spawn(async move { waiter.wait(&id, Duration::from_secs(6)).await })
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!waiting.is_finished(), "the wait ended when its claim was not answered");
    let answer = ExternalResult { result: serde_json::json!("yes"), is_error: false };
    let delivery = answerer.resolve(&id, answer.clone()).await.unwrap();
    assert_eq!(delivery, toolmux_external::Delivery::Waiting);
    let got = within(Duration::from_secs(8), "the wait", waiting).await.unwrap();
    assert_eq!(got, Some(answer));
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
}

/// Connections the server closed while they sat in the pool (a restart, the server's idle
/// `timeout`, `CLIENT KILL`) are not handed to the next commands: the first calls after
/// the server is back succeed, where each pooled connection failed one call with "broke".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_closed_are_not_reused() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(&RedisConfig::new(server.url())).await.unwrap();
    let store = backend.pending_store();
    let cache = backend.cache();
    // Fill the pool: several commands at once each take a connection of their own.
    let opened = open_eight_at_once(&store).await;
    assert!(opened.iter().all(Result::is_ok), "{opened:?}");
    let admin = RedisBackend::new(&RedisConfig::new(server.url())).unwrap();
    let killed = admin.client().command(&["CLIENT", "KILL", "TYPE", "normal"]).await.unwrap();
    assert!(killed.as_i64().is_some_and(|n| n >= 1), "{killed:?}");
    // The server closed them; give the closings time to arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..8 {
        let opened = store.open(call(true)).await;
        assert!(opened.is_ok(), "command {i} after the server closed the pool: {opened:?}");
    }
    cache.put("k", &ToolOutput::text("v"), Duration::from_secs(60)).await;
    assert_eq!(cache.get("k").await, Some(ToolOutput::text("v")));
}

/// Opens eight calls at once.
async fn open_eight_at_once(
    store: &toolmux_redis::RedisPendingStore,
) -> Vec<Result<String, ToolError>> {
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move { store.open(call(true)).await }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.expect("open task"));
    }
    results
}
