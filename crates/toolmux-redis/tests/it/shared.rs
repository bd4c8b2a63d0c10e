//! What else the replicas share: a rate limit holds for all of them together (and per
//! replica while Redis is down), and an output stored by one reads back through another.

use crate::{replica, within};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{CallContext, ToolCall, ToolProvider};
use toolmux_orchestrator::ratelimit::RateLimitBackend;
use toolmux_orchestrator::store::{OutputStore, StoreError};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, RateLimit, ToolSettings};
use toolmux_test_support::eventually;
use toolmux_test_support::mock::{Behavior, MockProvider};
use toolmux_test_support::redis::RedisServer;

fn limit(calls: u32, per: Duration, wait: Duration) -> RateLimit {
    RateLimit { calls, per, wait }
}

#[tokio::test]
async fn a_rate_limit_holds_for_all_replicas_together() {
    let server = RedisServer::start();
    let per = Duration::from_secs(10);
    let a = replica(&server).rate_limits().limiter("tool:t", limit(3, per, Duration::ZERO));
    let b = replica(&server).rate_limits().limiter("tool:t", limit(3, per, Duration::ZERO));
    assert_eq!(a.reserve().await, Ok(Duration::ZERO));
    assert_eq!(b.reserve().await, Ok(Duration::ZERO));
    assert_eq!(a.reserve().await, Ok(Duration::ZERO));
    // The burst of 3 is spent, whichever replica asks; the next turn is a third of the
    // period away.
    let refused = b.reserve().await.expect_err("over the shared limit");
    assert!(
        refused > Duration::from_secs(3) && refused <= Duration::from_millis(3334),
        "{refused:?}"
    );
    assert!(a.reserve().await.is_err());
    // Another limit is another key.
    let other = replica(&server).rate_limits().limiter("tool:u", limit(3, per, Duration::ZERO));
    assert_eq!(other.reserve().await, Ok(Duration::ZERO));
}

#[tokio::test]
async fn calls_may_wait_their_shared_turn() {
    let server = RedisServer::start();
    let per = Duration::from_secs(1);
    let wait = Duration::from_secs(1);
    let a = replica(&server).rate_limits().limiter("provider:p", limit(2, per, wait));
    let b = replica(&server).rate_limits().limiter("provider:p", limit(2, per, wait));
    assert_eq!(a.reserve().await, Ok(Duration::ZERO));
    assert_eq!(b.reserve().await, Ok(Duration::ZERO));
    let third = a.reserve().await.expect("may wait");
    assert!(third > Duration::from_millis(400) && third <= Duration::from_millis(500), "{third:?}");
    let fourth = b.reserve().await.expect("may wait");
    assert!(fourth > Duration::from_millis(900) && fourth <= wait, "{fourth:?}");
    assert!(a.reserve().await.is_err(), "a wait longer than allowed is refused");
}

#[tokio::test]
async fn while_redis_is_down_each_replica_keeps_the_limit_alone() {
    let mut server = RedisServer::start();
    let a = replica(&server)
        .rate_limits()
        .limiter("tool:t", limit(2, Duration::from_secs(60), Duration::ZERO));
    assert_eq!(a.reserve().await, Ok(Duration::ZERO));
    server.stop();
    // No hang and no refusal for Redis's sake: this replica's own burst of 2.
    let first = within(Duration::from_secs(10), "a reservation without Redis", a.reserve()).await;
    assert_eq!(first, Ok(Duration::ZERO));
    assert_eq!(a.reserve().await, Ok(Duration::ZERO));
    assert!(a.reserve().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_orchestrators_share_a_tools_rate_limit() {
    let server = RedisServer::start();
    let provider = Arc::new(MockProvider::new("m").with_tool("t", Behavior::Echo));
    let mut orchestrators = Vec::new();
    for _ in 0..2 {
        let settings = ToolSettings {
            rate_limit: Some(limit(1, Duration::from_secs(60), Duration::ZERO)),
            ..ToolSettings::default()
        };
        let config = OrchestratorConfig::default().with_provider_settings("m", settings);
        let orchestrator = Orchestrator::builder(config)
            .rate_limit_backend(Arc::new(replica(&server).rate_limits()))
            .provider(provider.clone() as Arc<dyn ToolProvider>)
            .build()
            .unwrap();
        assert!(orchestrator.warmup().await.is_ok());
        orchestrators.push(orchestrator);
    }
    let call = || ToolCall::new("m__t", json!({"x": 1}));
    let first = orchestrators[0].execute(call(), &CallContext::new()).await;
    assert!(first.ok, "{first:?}");
    let second = orchestrators[1].execute(call(), &CallContext::new()).await;
    assert!(!second.ok);
    let error = second.error.unwrap_or_default();
    assert!(error.contains("1 call per 1m"), "{error}");
    assert_eq!(provider.total_calls(), 1);
}

#[tokio::test]
async fn an_output_stored_by_one_replica_reads_back_through_another() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).output_store(), replica(&server).output_store());
    let stored = a.store("run 1", "t", "l1\nl2\nl3").await.unwrap();
    assert_eq!((stored.bytes, stored.lines), (8, 3));
    assert!(stored.handle.starts_with("run-run_1-"), "{}", stored.handle);
    let page = b.read(&stored.handle, 1, 1).await.unwrap();
    assert_eq!((page.text.as_str(), page.total_lines), ("l2", 3));
    assert!(b.is_of_run(&stored.handle, "run 1") && !b.is_of_run(&stored.handle, "run 2"));
    let again = a.store("run 1", "t", "other").await.unwrap();
    assert_ne!(again.handle, stored.handle);
    for bad in ["run-x/out-nothing", "../x", "a/../../b", "nohandle"] {
        let error = b.read(bad, 0, 1).await.unwrap_err();
        assert!(matches!(error, StoreError::UnknownHandle { .. }), "{bad}: {error}");
    }
}

#[tokio::test]
async fn stored_outputs_expire_and_huge_ones_are_refused() {
    let server = RedisServer::start();
    let store = replica(&server).output_store().with_retention(Duration::from_secs(1));
    let stored = store.store("r", "t", "soon gone").await.unwrap();
    assert!(store.read(&stored.handle, 0, 10).await.is_ok());
    eventually("the output expired", || async {
        matches!(store.read(&stored.handle, 0, 10).await, Err(StoreError::UnknownHandle { .. }))
    })
    .await;
    let huge = "x".repeat(toolmux_redis::MAX_OUTPUT_BYTES + 1);
    let error = store.store("r", "t", &huge).await.unwrap_err();
    assert!(error.to_string().contains("over the"), "{error}");
}

/// The arrival time a shared limit's key holds (microseconds of the server's clock).
async fn arrival(backend: &toolmux_redis::RedisBackend, key: &str) -> Option<u64> {
    let key = format!("toolmux:rl:{key}");
    let reply = backend.client().command(&["GET", key.as_str()]).await.expect("get");
    reply.as_str().and_then(|a| a.parse().ok())
}

/// A limiter of a replica that reaches Redis through `proxy`, with `RESERVE` loaded on
/// its connection (so that the next reply is the reservation's).
async fn limiter_through(
    proxy: &crate::CuttingProxy,
    limit: RateLimit,
) -> Arc<dyn toolmux_orchestrator::ratelimit::Limiter> {
    let config = toolmux_redis::RedisConfig::new(proxy.url());
    let backend = toolmux_redis::RedisBackend::new(&config).expect("valid url");
    let warm = backend.rate_limits().limiter("tool:warm", limit);
    assert_eq!(warm.reserve().await, Ok(Duration::ZERO));
    backend.rate_limits().limiter("tool:t", limit)
}

/// A reservation that ran on the server but whose answer was lost with its connection
/// (the caller falls back to its replica's own limiter, with no turn to give back) is
/// given back by its id: it kept every replica's calls a whole interval later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_answer_was_lost_is_given_back() {
    let server = RedisServer::start();
    let proxy = crate::CuttingProxy::start(&server).await;
    let admin = replica(&server);
    let every = limit(1, Duration::from_secs(10), Duration::from_secs(60));
    let direct = replica(&server).rate_limits().limiter("tool:t", every);
    let cut = limiter_through(&proxy, every).await;
    assert_eq!(direct.reserve().await, Ok(Duration::ZERO));
    let before = arrival(&admin, "tool:t").await.expect("the burst's turn");
    proxy.cut_next_reply();
    // The call goes on under this replica's own limiter.
    let lost = within(Duration::from_secs(5), "the reservation", cut.reserve_turn()).await;
    assert_eq!(lost.expect("a turn of the local limiter").wait(), Duration::ZERO);
    within(Duration::from_secs(5), "the lost reservation given back", async {
        while arrival(&admin, "tool:t").await != Some(before) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // The next shared turn is one interval away, not two.
    let next = direct.reserve().await.expect("may wait");
    assert!(next <= Duration::from_secs(10) && next > Duration::from_secs(9), "{next:?}");
}

/// A reservation whose caller stopped waiting for its answer (cancelled, or cut by a
/// deadline) is given back by its id once it has run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_caller_left_is_given_back() {
    let server = RedisServer::start();
    let proxy = crate::CuttingProxy::start(&server).await;
    let admin = replica(&server);
    let every = limit(1, Duration::from_secs(10), Duration::from_secs(60));
    let direct = replica(&server).rate_limits().limiter("tool:t", every);
    let held = limiter_through(&proxy, every).await;
    assert_eq!(direct.reserve().await, Ok(Duration::ZERO));
    let before = arrival(&admin, "tool:t").await.expect("the burst's turn");
    proxy.hold_next_reply();
    let left = tokio::time::timeout(Duration::from_millis(300), held.reserve_turn()).await;
    assert!(left.is_err(), "the reservation's answer was held back: {left:?}");
    within(Duration::from_secs(5), "the reservation given back", async {
        while arrival(&admin, "tool:t").await != Some(before) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A reservation whose answer was lost is given back by its id though its turn came at once
/// (its caller went on under its replica's own limiter, and never ran under this turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_answer_was_lost_is_given_back_though_its_turn_came() {
    let server = RedisServer::start();
    let proxy = crate::CuttingProxy::start(&server).await;
    let admin = replica(&server);
    let every = limit(1, Duration::from_secs(60), Duration::ZERO);
    let direct = replica(&server).rate_limits().limiter("tool:t", every);
    let cut = limiter_through(&proxy, every).await;
    assert_eq!(arrival(&admin, "tool:t").await, None, "a full burst");
    proxy.cut_next_reply();
    let lost = within(Duration::from_secs(5), "the reservation", cut.reserve_turn()).await;
    assert_eq!(lost.expect("a turn of the local limiter").mark(), 0, "a local turn");
    within(Duration::from_secs(5), "the lost reservation given back", async {
        while arrival(&admin, "tool:t").await.is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(direct.reserve().await, Ok(Duration::ZERO), "the burst is whole");
}

/// A limit of `Duration::MAX` (one call for ever, and waits as long as it takes) holds for
/// all replicas as any other: the script's times and expiries stay within what Lua and
/// Redis hold (the limit is held to about thirty years), and nothing overflows.
#[tokio::test]
async fn a_limit_of_duration_max_is_shared_and_given_back() {
    let server = RedisServer::start();
    let admin = replica(&server);
    let thirty_years = Duration::from_secs(60 * 60 * 24 * 365 * 30);
    let a =
        replica(&server).rate_limits().limiter("tool:t", limit(1, Duration::MAX, Duration::ZERO));
    let b =
        replica(&server).rate_limits().limiter("tool:t", limit(1, Duration::MAX, Duration::ZERO));
    assert_eq!(a.reserve().await, Ok(Duration::ZERO));
    let refused = b.reserve().await.expect_err("one call for ever, over all replicas");
    assert!(refused > thirty_years - Duration::from_secs(60), "{refused:?}");
    let key = "toolmux:rl:tool:t";
    let ttl = admin.client().command(&["PTTL", key]).await.expect("PTTL");
    let ttl = ttl.as_i64().expect("a time to live");
    assert!(ttl > 0 && ttl <= i64::try_from(thirty_years.as_millis()).expect("small") + 1, "{ttl}");

    // Waiting as long as it takes: the second call's turn is thirty years away, shared,
    // and given back whole.
    let waits = limit(1, Duration::MAX, Duration::MAX);
    let c = replica(&server).rate_limits().limiter("tool:u", waits);
    let d = replica(&server).rate_limits().limiter("tool:u", waits);
    let first = c.reserve_turn().await.expect("at once");
    assert_eq!(first.wait(), Duration::ZERO);
    let before = arrival(&admin, "tool:u").await.expect("the first turn");
    let second = d.reserve_turn().await.expect("may wait");
    assert_ne!(second.mark(), 0, "a shared turn");
    assert!(second.wait() > thirty_years - Duration::from_secs(60), "{second:?}");
    d.release(second);
    within(Duration::from_secs(5), "the far turn given back", async {
        while arrival(&admin, "tool:u").await != Some(before) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A turn given back between turns still reserved goes to the next call, in its own place,
/// whichever replica reserved or gave back what: under one call per second two replicas'
/// calls never start closer than a second apart. The shared due time moved back one
/// interval under the turns already reserved, so the next call got the instant of the
/// latest one waiting.
#[tokio::test]
async fn a_turn_given_back_between_others_goes_to_the_next_call_in_its_place() {
    let server = RedisServer::start();
    let admin = replica(&server);
    let every = limit(1, Duration::from_secs(1), Duration::from_secs(10));
    let a = replica(&server).rate_limits().limiter("tool:t", every);
    let b = replica(&server).rate_limits().limiter("tool:t", every);
    let second_of = Duration::from_secs(1);
    assert_eq!(a.reserve().await, Ok(Duration::ZERO));
    let second = b.reserve_turn().await.expect("may wait");
    let third = a.reserve_turn().await.expect("may wait");
    let latest = arrival(&admin, "tool:t").await.expect("the turns reserved");
    b.release(second);
    // The next call, on either replica, takes the second's turn: its wait is shorter
    // than the third's by a second at least (both on the server's clock), and the
    // limit's due time stays where the third call's turn put it.
    given_back(&admin, latest).await;
    let fourth = a.reserve_turn().await.expect("may wait");
    assert!(fourth.wait() + second_of <= third.wait(), "{third:?} {fourth:?}");
    assert_eq!(arrival(&admin, "tool:t").await, Some(latest), "{fourth:?} took a new turn");
    // The one after it comes a second after the third call.
    let fifth = b.reserve_turn().await.expect("may wait");
    assert_eq!(arrival(&admin, "tool:t").await, Some(latest + 1_000_000));
    // The third call stops too: it leaves a hole, kept under the limit's prefix and
    // expiring with it, that the next call takes.
    a.release(third);
    given_back(&admin, latest + 1_000_000).await;
    let holes = "toolmux:rlh:tool:t";
    let ttl = admin.client().command(&["PTTL", holes]).await.expect("PTTL");
    let ttl = ttl.as_i64().expect("a time to live");
    assert!(ttl > 0 && ttl <= 4_100, "{ttl}");
    let sixth = a.reserve_turn().await.expect("may wait");
    assert!(sixth.wait() + second_of <= fifth.wait(), "{fifth:?} {sixth:?}");
    assert_eq!(
        arrival(&admin, "tool:t").await,
        Some(latest + 1_000_000),
        "{sixth:?} took a new turn"
    );
}

/// Waits until a turn of `tool:t`, whose due time is `latest`, was given back: the due time
/// moved, or the turn left a hole.
async fn given_back(admin: &toolmux_redis::RedisBackend, latest: u64) {
    within(Duration::from_secs(5), "the turn given back", async {
        loop {
            let hole = admin.client().command(&["EXISTS", "toolmux:rlh:tool:t"]).await;
            if hole.expect("EXISTS").as_i64() == Some(1)
                || arrival(admin, "tool:t").await != Some(latest)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}
