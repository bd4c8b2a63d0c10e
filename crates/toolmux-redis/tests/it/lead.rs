//! The lead of a cached call among replicas (`ResponseCache::lead`): identical concurrent
//! calls of two replicas run once, a leader that gives up hands over at once, a leader
//! that dies hands over when its lease ends, and a Redis that does not answer never makes
//! a call wait.

use crate::{listeners, replica, within};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::{CallContext, ToolCall, ToolProvider};
use toolmux_orchestrator::cache::{Lead, ResponseCache, cache_key};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, ToolSettings};
use toolmux_redis::{RedisBackend, RedisCache, RedisConfig};
use toolmux_test_support::eventually;
use toolmux_test_support::mock::{Behavior, MockProvider};
use toolmux_test_support::redis::RedisServer;

/// Longer than a follower's wake-up by a release message, shorter than its slow poll
/// (2 s): a hand-over within it came from the message.
const BY_MESSAGE: Duration = Duration::from_millis(1000);

fn key() -> String {
    cache_key("m__slow", &json!({"q": "toolmux"}))
}

/// The one lead key on the server and its release channel, once the lead is taken.
async fn lead_key(backend: &RedisBackend) -> String {
    let keys = backend.client().command(&["KEYS", "toolmux:lead:*"]).await.expect("keys");
    let keys: Vec<&str> =
        keys.as_array().unwrap_or_default().iter().filter_map(|k| k.as_str()).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys[0].to_owned()
}

/// Follows `lead` in a task, once its subscription is made and its first look done.
async fn following(lead: Lead, observer: &RedisBackend) -> tokio::task::JoinHandle<()> {
    let Lead::Follow(released) = lead else { panic!("expected Follow, got {lead:?}") };
    let channel = format!("{}:released", lead_key(observer).await);
    let task = tokio::spawn(released);
    eventually("the follower subscribed", || async { listeners(observer, &channel).await == 1 })
        .await;
    // Its look at the key comes right after the subscription.
    tokio::time::sleep(Duration::from_millis(200)).await;
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_of_two_replicas_run_once() {
    let server = RedisServer::start();
    // One provider behind both orchestrators: its count of runs is the count over both.
    let provider = Arc::new(
        MockProvider::new("m")
            .with_read_only_tool("slow", Behavior::Sleep(Duration::from_millis(600))),
    );
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let config = OrchestratorConfig::default().with_provider_settings(
            "m",
            ToolSettings::default().with_cache(Duration::from_secs(60)),
        );
        let orchestrator = Orchestrator::builder(config)
            .cache(Arc::new(replica(&server).cache()))
            .provider(provider.clone() as Arc<dyn ToolProvider>)
            .build()
            .unwrap();
        assert!(orchestrator.warmup().await.is_ok());
        replicas.push(orchestrator);
    }
    let call = |at: usize| {
        let orchestrator = replicas[at].clone();
        tokio::spawn(async move {
            let call = ToolCall::new("m__slow", json!({"q": "toolmux"}));
            orchestrator.execute(call, &CallContext::new()).await
        })
    };
    let first = call(0);
    eventually("the first replica runs the call", || async { provider.in_flight() == 1 }).await;
    // The second replica's callers come while the first one's call runs: they wait for it.
    let others: Vec<_> = [1, 1, 0].into_iter().map(call).collect();
    let first = first.await.unwrap();
    assert!(first.ok, "{first:?}");
    for other in others {
        let other = within(Duration::from_secs(10), "a follower", other).await.unwrap();
        assert!(other.ok, "{other:?}");
        assert_eq!(other.result, first.result);
    }
    assert_eq!(provider.calls_of("slow"), 1, "the second replica ran the call again");
    // The lead was given up once the output was stored.
    let admin = replica(&server);
    eventually("the lead is given up", || async {
        let keys = admin.client().command(&["KEYS", "toolmux:lead:*"]).await.expect("keys");
        keys.as_array().is_some_and(<[_]>::is_empty)
    })
    .await;
}

/// A leader that gives the lead up without an output (its call failed or was cancelled)
/// wakes the other replica's follower at once, which leads next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_gives_up_hands_over_at_once() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server), replica(&server));
    let (a_cache, b_cache) = (a.cache(), b.cache());
    let Lead::Leading(guard) = a_cache.lead(&key()).await else { panic!("the first leads") };
    let lead = lead_key(&a).await;
    // `{prefix}:lead:` and the cache's 128-bit hash: bounded whatever the arguments.
    assert!(lead.strip_prefix("toolmux:lead:").is_some_and(|h| h.len() == 32), "{lead}");
    let follower = following(b_cache.lead(&key()).await, &a).await;
    assert!(!follower.is_finished(), "the follower stopped while the lead was held");
    assert!(matches!(b_cache.lead(&key()).await, Lead::Follow(_)));

    let dropped = Instant::now();
    drop(guard);
    within(Duration::from_secs(5), "the follower", follower).await.unwrap();
    assert!(dropped.elapsed() < BY_MESSAGE, "woken by its poll: {:?}", dropped.elapsed());
    let Lead::Leading(next) = b_cache.lead(&key()).await else { panic!("the follower leads") };
    assert!(matches!(a_cache.lead(&key()).await, Lead::Follow(_)));
    drop(next);
}

/// A leader renews its lead while its call runs, however long: the other replica keeps
/// following past the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_leader_keeps_the_lead_past_its_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(300);
    let a = replica(&server);
    let b = replica(&server).cache().with_lead_lease(lease);
    let Lead::Leading(guard) = a.cache().with_lead_lease(lease).lead(&key()).await else {
        panic!("the first leads")
    };
    let follower = following(b.lead(&key()).await, &a).await;
    tokio::time::sleep(lease * 4).await;
    assert!(!follower.is_finished(), "the lead ended while its leader ran");
    assert!(matches!(b.lead(&key()).await, Lead::Follow(_)));
    drop(guard);
    within(Duration::from_secs(5), "the follower", follower).await.unwrap();
}

/// A leader that dies (its process, and with it its renewal, gone without giving the lead
/// up) is taken over when its lease ends, not before and not at the follower's next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_leader_is_taken_over_when_its_lease_ends() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let url = server.url();
    // The leader runs on a runtime of its own, which ends as a killed process would: its
    // renewal task stops, and its guard is never dropped.
    let (lead, taken) = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let cache =
            RedisBackend::new(&RedisConfig::new(url)).unwrap().cache().with_lead_lease(lease);
        let taken = Instant::now();
        let lead = runtime.block_on(async { cache.lead(&key()).await });
        drop(runtime);
        (lead, taken)
    })
    .join()
    .unwrap();
    let Lead::Leading(guard) = lead else { panic!("the first leads") };
    std::mem::forget(guard);

    let b = replica(&server);
    let follower = following(b.cache().lead(&key()).await, &b).await;
    within(Duration::from_secs(5), "the follower", follower).await.unwrap();
    let waited = taken.elapsed();
    assert!(waited >= lease - Duration::from_millis(50), "before the lease ended: {waited:?}");
    assert!(waited < lease + Duration::from_millis(900), "at its slow poll: {waited:?}");
    assert!(matches!(b.cache().lead(&key()).await, Lead::Leading(_)), "taken over");
}

/// A Redis that does not answer gives no lead across replicas, at once or within its
/// command timeout, so calls run as without Redis; a follower stops following.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_each_replica_runs_its_calls_alone() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let config = RedisConfig::new(server.url()).with_timeout(timeout).with_pool_size(1);
    let a = RedisBackend::connect(&config).await.unwrap();
    let b = RedisBackend::connect(&config).await.unwrap();
    let (a_cache, b_cache) = (a.cache(), b.cache());
    let limit = Duration::from_secs(5);

    // A pool kept busy by another command.
    let holder = {
        let client = a.client().clone();
        tokio::spawn(async move {
            client.command_within(&["BLPOP", "nothing", "2"], Duration::from_secs(5)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let lead = within(limit, "lead with a busy pool", a_cache.lead(&key())).await;
    assert!(matches!(lead, Lead::Alone), "{lead:?}");
    assert!(started.elapsed() < timeout * 2, "{:?}", started.elapsed());
    holder.await.unwrap().unwrap();

    // A follower whose Redis stops stops following.
    let Lead::Leading(guard) = a_cache.lead(&key()).await else { panic!("the first leads") };
    let follower = following(b_cache.lead(&key()).await, &a).await;
    server.stop();
    within(Duration::from_secs(2), "the follower of a stopped redis", follower).await.unwrap();
    drop(guard);
    let started = Instant::now();
    let lead = within(limit, "lead with redis down", b_cache.lead(&key())).await;
    assert!(matches!(lead, Lead::Alone), "{lead:?}");
    let lead = within(limit, "lead with redis known down", a_cache.lead(&key())).await;
    assert!(matches!(lead, Lead::Alone), "{lead:?}");
    assert!(started.elapsed() < timeout, "{:?}", started.elapsed());
}

/// A lead lease past counting (a configuration's "never") is cut, not refused by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_lease_for_ever_is_cut_to_what_redis_counts() {
    let server = RedisServer::start();
    let backend = replica(&server);
    let cache: RedisCache = backend.cache().with_lead_lease(Duration::MAX);
    let Lead::Leading(guard) = cache.lead(&key()).await else { panic!("leads") };
    let lead = lead_key(&backend).await;
    let left = backend.client().command(&["PTTL", lead.as_str()]).await.unwrap();
    assert!(left.as_i64().is_some_and(|ms| ms > 0), "{left:?}");
    drop(guard);
    eventually("the lead is given up", || async {
        let exists = backend.client().command(&["EXISTS", lead.as_str()]).await.unwrap();
        exists.as_i64() == Some(0)
    })
    .await;
}

/// A leader whose lease ended (Redis out of reach longer than it) and whose lead another
/// replica took gives up nothing when it is done: the other's lead stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_gives_up_only_its_own_lead() {
    let server = RedisServer::start();
    let (a, b, c) = (replica(&server), replica(&server), replica(&server));
    let Lead::Leading(stale) = a.cache().lead(&key()).await else { panic!("the first leads") };
    let lead = lead_key(&a).await;
    // The lease ends as if the leader had lost Redis for longer than it.
    c.client().command(&["DEL", lead.as_str()]).await.unwrap();
    let Lead::Leading(current) = b.cache().lead(&key()).await else { panic!("taken over") };
    let holder = c.client().command(&["GET", lead.as_str()]).await.unwrap();
    drop(stale);
    // Its release runs in a task whose end cannot be seen from here: 300 ms is many
    // loopback round trips (without the script's check, the lead is gone by then).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.client().command(&["GET", lead.as_str()]).await.unwrap(), holder);
    assert!(matches!(c.cache().lead(&key()).await, Lead::Follow(_)), "the lead was deleted");
    drop(current);
}

/// `backend.redis.leadLeaseMs` from the file is the lease of the backend's cache's leads
/// (the default is 10 s), renewed every third of it while the leader runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lead_lease_comes_from_the_configuration() {
    let server = RedisServer::start();
    let file = format!(r#"{{"url": "{}", "leadLeaseMs": 300}}"#, server.url());
    let config: RedisConfig = serde_json::from_str(&file).expect("a valid section");
    let backend = RedisBackend::new(&config).expect("valid settings");
    let Lead::Leading(guard) = backend.cache().lead(&key()).await else {
        panic!("the first leads")
    };
    let lead = lead_key(&backend).await;
    let lease_left = || async {
        let ttl = backend.client().command(&["PTTL", &lead]).await.expect("PTTL");
        ttl.as_i64().expect("a time to live")
    };
    let ttl = lease_left().await;
    assert!(ttl > 0 && ttl <= 300, "the lead's lease is {ttl} ms");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let ttl = lease_left().await;
    assert!(ttl > 0 && ttl <= 300, "the lead was not renewed with its lease: {ttl} ms");
    drop(guard);
}
