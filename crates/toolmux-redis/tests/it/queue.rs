//! Queues shared by two replicas: capacity across both, a release in one waking a waiter in
//! the other, timeouts, renewed leases and the leases of a replica that vanished; within
//! one replica, free slots taken side by side and waiters served in the order they came.

use crate::{ConnectionHalves, listeners, proxy_to, replica, within};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use toolmux_orchestrator::QueueConfig;
use toolmux_orchestrator::queue::QueueBackend;
use toolmux_redis::{RedisBackend, RedisConfig};
use toolmux_test_support::eventually;
use toolmux_test_support::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_holds_across_two_replicas() {
    let server = RedisServer::start();
    let queues = [replica(&server).queues(), replica(&server).queues()];
    let queues: Vec<_> = queues.iter().map(|b| b.queue("shared", &QueueConfig::new(3))).collect();
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let queue = queues[i % 2].clone();
        let (holding, most) = (holding.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let slot = queue.acquire(Duration::from_secs(20)).await.expect("a slot in time");
            let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            holding.fetch_sub(1, Ordering::SeqCst);
            drop(slot);
        }));
    }
    for task in tasks {
        within(Duration::from_secs(30), "16 calls through 3 slots", task).await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} slots held at once, capacity 3");
    assert!(most >= 2, "the replicas never ran calls side by side ({most})");
    eventually("every slot released", || async {
        queues[0].in_use() == 0 && queues[1].in_use() == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_one_replica_wakes_a_waiter_in_the_other() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server), replica(&server));
    let qa = a.queues().queue("one", &QueueConfig::new(1));
    let qb = b.queues().queue("one", &QueueConfig::new(1));
    // The waiter asks at once, then every 250 ms unless woken. Released 300 ms after it
    // started, a waiter that only polled would get the slot about 200 ms later; one woken
    // by the release gets it within milliseconds.
    let mut slowest = Duration::ZERO;
    for round in 0..3 {
        let held = qa.acquire(Duration::from_secs(5)).await.expect("free slot");
        let started = Instant::now();
        let waiter = {
            let qb = qb.clone();
            tokio::spawn(async move {
                let slot = qb.acquire(Duration::from_secs(10)).await;
                (slot, Instant::now())
            })
        };
        if round == 0 {
            eventually("the waiter of replica b subscribed", || async {
                listeners(&a, "toolmux:q:one:free").await >= 1
            })
            .await;
        }
        tokio::time::sleep_until(started + Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "the waiter got a slot that was held");
        let released = Instant::now();
        drop(held);
        let (slot, got) =
            within(Duration::from_secs(5), "the waiter's slot", waiter).await.unwrap();
        let slot = slot.expect("the released slot");
        slowest = slowest.max(got - released);
        drop(slot);
        eventually("the slot back", || async {
            let leases = a.client().command(&["ZCARD", "toolmux:q:one"]).await;
            leases.ok().and_then(|n| n.as_i64()) == Some(0)
        })
        .await;
    }
    assert!(
        slowest < Duration::from_millis(100),
        "slowest wake-up {slowest:?}: woken by the poll, not the release"
    );
}

#[tokio::test]
async fn acquire_times_out_when_full() {
    let server = RedisServer::start();
    let qa = replica(&server).queues().queue("full", &QueueConfig::new(2));
    let qb = replica(&server).queues().queue("full", &QueueConfig::new(2));
    let _one = qa.acquire(Duration::from_secs(5)).await.expect("first slot");
    let _two = qb.acquire(Duration::from_secs(5)).await.expect("second slot");
    let started = Instant::now();
    assert!(qa.acquire(Duration::from_millis(400)).await.is_none());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(400), "gave up early: {waited:?}");
    assert!(waited < Duration::from_millis(1000), "gave up late: {waited:?}");
    assert!(qa.acquire(Duration::ZERO).await.is_none(), "a zero wait asks once");
    eventually("both replicas see the queue full", || async { qa.is_full() && qb.is_full() }).await;
    assert_eq!((qa.in_use(), qa.capacity()), (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_slot_outlives_its_lease_by_renewal() {
    let server = RedisServer::start();
    let config = RedisConfig::new(server.url()).with_lease(Duration::from_millis(300));
    let a = RedisBackend::new(&config).unwrap();
    let b = RedisBackend::new(&config).unwrap();
    let qa = a.queues().queue("renewed", &QueueConfig::new(1));
    let qb = b.queues().queue("renewed", &QueueConfig::new(1));
    let held = qa.acquire(Duration::from_secs(5)).await.expect("free slot");
    // Four leases long: the slot stays taken only because it is renewed.
    assert!(qb.acquire(Duration::from_millis(1200)).await.is_none(), "the renewed slot was taken");
    drop(held);
    assert!(qb.acquire(Duration::from_secs(5)).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_of_a_vanished_replica_frees_itself_when_its_lease_ends() {
    let server = RedisServer::start();
    let config = RedisConfig::new(server.url()).with_lease(Duration::from_millis(300));
    // Replica a lives on a runtime of its own: it takes the slot, never releases it, and
    // then its runtime ends with every task on it (the renewal too), as a crash would.
    let crashed = {
        let config = config.clone();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let a = RedisBackend::new(&config).unwrap();
                let queue = a.queues().queue("orphan", &QueueConfig::new(1));
                let slot = queue.acquire(Duration::from_secs(5)).await.expect("free slot");
                std::mem::forget(slot);
                std::mem::forget(a);
            });
            drop(runtime);
        })
    };
    crashed.join().unwrap();
    let b = RedisBackend::new(&config).unwrap();
    let leases = b.client().command(&["ZCARD", "toolmux:q:orphan"]).await.unwrap();
    assert_eq!(leases.as_i64(), Some(1), "the vanished replica's lease is there");
    let qb = b.queues().queue("orphan", &QueueConfig::new(1));
    let started = Instant::now();
    let slot = qb.acquire(Duration::from_secs(5)).await;
    assert!(slot.is_some(), "the lease never ended");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
}

/// A take whose script ran but whose answer was lost with its connection leaves no lease
/// behind: the slot was held, by nobody, until its lease ended (30 s), and this replica's
/// own next attempt found the queue full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_whose_answer_was_lost_leaves_no_lease() {
    let server = RedisServer::start();
    let proxy = crate::CuttingProxy::start(&server).await;
    let backend = RedisBackend::new(&RedisConfig::new(proxy.url())).unwrap();
    let queue = backend.queues().queue("cut", &QueueConfig::new(1));
    // Once, so that the script is loaded and the next take is its EVALSHA alone.
    drop(queue.acquire(Duration::from_secs(5)).await.expect("free slot"));
    let direct = replica(&server);
    eventually("the first slot released", || async {
        let leases = direct.client().command(&["ZCARD", "toolmux:q:cut"]).await;
        leases.ok().and_then(|n| n.as_i64()) == Some(0)
    })
    .await;
    proxy.cut_next_reply();
    let slot =
        within(Duration::from_secs(10), "acquire", queue.acquire(Duration::from_secs(4))).await;
    assert!(slot.is_some(), "the lease whose answer was lost kept the queue full");
    drop(slot);
    let other = direct.queues().queue("cut", &QueueConfig::new(1));
    assert!(other.acquire(Duration::from_secs(4)).await.is_some(), "a lease was left behind");
}

/// Replicas whose leases differ (a changed `leaseMs` rolling out) do not end each other's
/// leases: the queue's key expires with its last lease, where a take with a short lease
/// made it expire, every longer lease in it with it, and the queue ran over its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_does_not_end_the_longer_leases_of_another_replica() {
    let server = RedisServer::start();
    let long = RedisBackend::new(&RedisConfig::new(server.url())).unwrap();
    let short_config = RedisConfig::new(server.url()).with_lease(Duration::from_millis(200));
    let short = RedisBackend::new(&short_config).unwrap();
    let ql = long.queues().queue("mixed", &QueueConfig::new(2));
    let qs = short.queues().queue("mixed", &QueueConfig::new(2));
    let _held = ql.acquire(Duration::from_secs(5)).await.expect("a free slot");
    drop(qs.acquire(Duration::from_secs(5)).await.expect("the other free slot"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    let leases = long.client().command(&["ZCARD", "toolmux:q:mixed"]).await.unwrap();
    assert_eq!(leases.as_i64(), Some(1), "the held slot's lease is gone");
    let ttl = long.client().command(&["PTTL", "toolmux:q:mixed"]).await.unwrap();
    assert!(
        ttl.as_i64().is_some_and(|ms| ms > 20_000),
        "the key expires with its last lease: {ttl:?}"
    );
    let first = qs.acquire(Duration::from_secs(1)).await;
    assert!(first.is_some(), "the free slot");
    assert!(qs.acquire(Duration::from_millis(200)).await.is_none(), "over the capacity");
}

/// Callers of one replica take free slots side by side: 16 callers of a queue of 16 (and a
/// pool of 16 connections) each send their take before any answer comes, and all hold a
/// slot together. The proxy holds every reply back until 16 connections have each sent a
/// command; callers that lined up behind one another, each asking only once the caller
/// before had its answer, never opened it (one take in flight at a time, cut by its
/// timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_of_one_replica_take_free_slots_side_by_side() {
    const CALLERS: usize = 16;
    let server = RedisServer::start();
    // Loads the take and release scripts on the server, so that every take through the
    // proxy is one EVALSHA on a connection of its own.
    let direct = replica(&server);
    let warmup = direct.queues().queue("wide", &QueueConfig::new(CALLERS));
    drop(warmup.acquire(Duration::from_secs(5)).await.expect("a free slot"));
    eventually("the warm-up slot released", || async {
        let leases = direct.client().command(&["ZCARD", "toolmux:q:wide"]).await;
        leases.ok().and_then(|n| n.as_i64()) == Some(0)
    })
    .await;
    let gate = GateProxy::start(&server, CALLERS, Duration::from_secs(5)).await;
    let config = RedisConfig::new(gate.url()).with_pool_size(CALLERS);
    let backend = RedisBackend::new(&config).unwrap();
    let queue = backend.queues().queue("wide", &QueueConfig::new(CALLERS));
    let all_hold = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let mut tasks = Vec::new();
    for _ in 0..CALLERS {
        let (queue, all_hold) = (queue.clone(), all_hold.clone());
        tasks.push(tokio::spawn(async move {
            let slot = queue.acquire(Duration::from_secs(20)).await;
            let slot = slot.expect("a free slot");
            within(Duration::from_secs(10), "every caller holding a slot", all_hold.wait()).await;
            drop(slot);
        }));
    }
    for task in tasks {
        within(Duration::from_secs(30), "16 callers through 16 slots", task).await.unwrap();
    }
    assert!(
        gate.opened_by_callers(),
        "the replies were held {:?} and only {} connections had asked by then: the callers \
         took their slots one after another",
        Duration::from_secs(5),
        gate.asked_at_limit()
    );
    eventually("every slot released", || async {
        let leases = direct.client().command(&["ZCARD", "toolmux:q:wide"]).await;
        leases.ok().and_then(|n| n.as_i64()) == Some(0)
    })
    .await;
}

/// Callers that found the queue full are served in the order they came: a release goes to
/// the first in line, and the callers after it stay in line behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_replica_are_served_in_the_order_they_came() {
    let server = RedisServer::start();
    let holder = replica(&server).queues().queue("ordered", &QueueConfig::new(1));
    let held = holder.acquire(Duration::from_secs(5)).await.expect("a free slot");
    let queue = replica(&server).queues().queue("ordered", &QueueConfig::new(1));
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for caller in 0..4 {
        let (queue, served) = (queue.clone(), served.clone());
        waiters.push(tokio::spawn(async move {
            let slot = queue.acquire(Duration::from_secs(20)).await.expect("a slot in time");
            served.lock().unwrap().push(caller);
            drop(slot);
        }));
        // Each caller has found the queue full and is in line before the next comes.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(held);
    for waiter in waiters {
        within(Duration::from_secs(30), "4 waiters through 1 slot", waiter).await.unwrap();
    }
    assert_eq!(*served.lock().unwrap(), [0, 1, 2, 3], "waiters served out of order");
}

/// A loopback proxy to `server` that holds back every reply until `callers` connections
/// have each sent something, or until `limit` has passed.
struct GateProxy {
    port: u16,
    /// How many connections had asked when the limit passed, if it did.
    at_limit: Arc<AtomicUsize>,
    by_callers: Arc<std::sync::atomic::AtomicBool>,
}

impl GateProxy {
    async fn start(server: &RedisServer, callers: usize, limit: Duration) -> GateProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let asked = Arc::new(AtomicUsize::new(0));
        let by_callers = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (open, opened) = tokio::sync::watch::channel(false);
        let open = Arc::new(open);
        let at_limit = Arc::new(AtomicUsize::new(0));
        {
            let (open, asked, at_limit) = (open.clone(), asked.clone(), at_limit.clone());
            tokio::spawn(async move {
                tokio::time::sleep(limit).await;
                at_limit.store(asked.load(Ordering::SeqCst), Ordering::SeqCst);
                open.send_replace(true);
            });
        }
        let (count, marked) = (asked, by_callers.clone());
        let relay = move |client: ConnectionHalves, upstream: ConnectionHalves| {
            let ((mut client_read, mut client_write), (mut upstream_read, mut upstream_write)) =
                (client, upstream);
            let (open, count, marked) = (open.clone(), count.clone(), marked.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let mut counted = false;
                loop {
                    let n = match client_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if !counted {
                        counted = true;
                        if count.fetch_add(1, Ordering::SeqCst) + 1 >= callers && !*open.borrow() {
                            marked.store(true, Ordering::SeqCst);
                            open.send_replace(true);
                        }
                    }
                    if upstream_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
            let mut opened = opened.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match upstream_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if opened.wait_for(|open| *open).await.is_err()
                        || client_write.write_all(&buf[..n]).await.is_err()
                    {
                        return;
                    }
                }
            });
        };
        let port = proxy_to(server, relay).await;
        GateProxy { port, at_limit, by_callers }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the replies went on because enough connections had asked, not at the limit.
    fn opened_by_callers(&self) -> bool {
        self.by_callers.load(Ordering::SeqCst)
    }

    /// How many connections had asked when the replies went on at the limit.
    fn asked_at_limit(&self) -> usize {
        self.at_limit.load(Ordering::SeqCst)
    }
}
