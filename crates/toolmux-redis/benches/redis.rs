//! Per-operation cost of toolmux-redis's backends against a real `redis-server`, beside the
//! orchestrator's in-process backends doing the same thing and beside the floor: a bare
//! `PING` (and `GET`) round trip over the crate's own client, and `redis-benchmark` run
//! against the same server in the same run.
//!
//! Operations: a queue slot taken and dropped (`Queue::acquire`, its release), a rate-limit
//! turn (`Limiter::reserve_turn` under a limit never reached), a response cache miss and
//! hits and puts of a small and a 64 KiB output (`ResponseCache::get`/`put`), an output
//! stored and its first page read (`OutputStore::store`/`read`, 64 KiB), and a pending
//! external call opened, waited for and answered through a second replica
//! (`PendingStore::open`/`wait`/`resolve`). Each is timed one at a time (sequential, one
//! task) and then with 16 tasks in flight on the 2-worker runtime, each operation timed in
//! its task; ops/s is operations over wall time. A queue's release and a cache lead's
//! give-back run in tasks after the caller has its answer: the wall time of a phase waits
//! for the queue's releases to reach Redis.
//!
//! Run with `cargo bench -p toolmux-redis --bench redis` (needs `redis-server` on PATH;
//! `.ci/install-peers` installs it, and `redis-benchmark` beside it; without
//! `redis-benchmark` its rows say so). Options: `--quick` (1,000 operations per phase),
//! `--ops N` (10,000 by default; the output store takes a fifth of it). The table it prints
//! is what the "Redis backend" section of BENCHMARKS.md records.

use serde_json::json;
use std::future::Future;
use std::io::Write as _;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolmux_core::ToolOutput;
use toolmux_external::{
    ExecutionType, ExternalResult, MemoryPendingStore, PendingCall, PendingStore,
};
use toolmux_orchestrator::cache::{MemoryCache, ResponseCache};
use toolmux_orchestrator::queue::{LocalQueues, QueueBackend};
use toolmux_orchestrator::ratelimit::{LocalRateLimits, RateLimitBackend};
use toolmux_orchestrator::store::{DirectoryStore, OutputStore};
use toolmux_orchestrator::{QueueConfig, RateLimit};
use toolmux_redis::{RedisBackend, RedisConfig};
use toolmux_test_support::redis::RedisServer;

/// Tasks in flight in the concurrent phase.
const IN_FLIGHT: usize = 16;

/// A pending store's caller and answerer, under a backend's name.
type PendingPair = (&'static str, Arc<dyn PendingStore>, Arc<dyn PendingStore>);

/// One operation, given its number.
type Op = Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |i| Box::pin(f(i)))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs bench binaries without `--bench`; only measure when asked.
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let ops = match args.iter().position(|a| a == "--ops") {
        Some(at) => args.get(at + 1).and_then(|n| n.parse().ok()).expect("--ops takes a number"),
        None if quick => 1_000,
        None => 10_000,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let server = RedisServer::start();
    let before = load_average();
    let rows = runtime.block_on(run(&server, ops));
    let benchmark = redis_benchmark(server.port(), ops);
    let after = load_average();
    report(&rows, &benchmark, ops, &before, &after);
}

/// What one operation measured.
struct Row {
    operation: &'static str,
    backend: &'static str,
    sequential: Phase,
    in_flight: Phase,
}

/// One phase's latencies, sorted, and its wall time.
struct Phase {
    latencies: Vec<Duration>,
    wall: Duration,
}

impl Phase {
    fn quantile(&self, q: f64) -> Duration {
        let n = self.latencies.len();
        self.latencies[((n as f64 * q) as usize).min(n - 1)]
    }

    fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }
}

async fn run(server: &RedisServer, ops: usize) -> Vec<Row> {
    let backend =
        RedisBackend::connect(&RedisConfig::new(server.url())).await.expect("redis answers");
    let other =
        RedisBackend::connect(&RedisConfig::new(server.url())).await.expect("redis answers");
    let mut rows = Vec::new();

    // The floor: the crate's own client, one command per operation.
    let client = backend.client().clone();
    let ping = op(move |_| {
        let client = client.clone();
        async move { client.ping().await.expect("PING") }
    });
    rows.push(measure("raw PING (the floor)", "redis client", ping, None, ops).await);
    let small = "x".repeat(100);
    let large = "x".repeat(64 * 1024);
    for (operation, key, value) in [
        ("raw GET, 100 B value", "bench:raw:small", &small),
        ("raw GET, 64 KiB value", "bench:raw:large", &large),
    ] {
        let set = backend.client().command(&["SET", key, value.as_str()]).await;
        set.expect("SET");
        let client = backend.client().clone();
        let get = op(move |_| {
            let client = client.clone();
            async move {
                let reply = client.command(&["GET", key]).await.expect("GET");
                assert!(reply.as_str().is_some_and(|v| !v.is_empty()), "GET {key} found nothing");
            }
        });
        rows.push(measure(operation, "redis client", get, None, ops).await);
    }

    // Queue slots: a queue with room for every caller, so that no acquire waits.
    let config = QueueConfig::new(1024);
    let wait = Duration::from_secs(5);
    for (backend_name, queue, settle) in [
        ("in-process", LocalQueues.queue("bench", &config), None),
        (
            "redis",
            backend.queues().queue("bench", &config),
            Some(drained(&backend, "toolmux:q:bench")),
        ),
    ] {
        let slot = op(move |_| {
            let queue = queue.clone();
            async move {
                let slot = queue.acquire(wait).await.expect("a free slot");
                drop(slot);
            }
        });
        rows.push(measure("queue slot acquire + release", backend_name, slot, settle, ops).await);
    }

    // A rate-limit turn under a limit never reached (one call per microsecond).
    let limit = RateLimit { calls: 1_000_000, per: Duration::from_secs(1), wait: Duration::ZERO };
    for (backend_name, limiter) in [
        ("in-process", LocalRateLimits.limiter("tool:bench", limit)),
        ("redis", backend.rate_limits().limiter("tool:bench", limit)),
    ] {
        let turn = op(move |_| {
            let limiter = limiter.clone();
            async move {
                let turn = limiter.reserve_turn().await.expect("a turn");
                assert!(turn.wait().is_zero(), "the limit was reached: {turn:?}");
            }
        });
        rows.push(measure("rate-limit turn", backend_name, turn, None, ops).await);
    }

    // The response cache: a miss, then puts and hits of a small and a 64 KiB output.
    let ttl = Duration::from_secs(600);
    let caches: [(&'static str, Arc<dyn ResponseCache>); 2] =
        [("in-process", Arc::new(MemoryCache::default())), ("redis", Arc::new(backend.cache()))];
    for (backend_name, cache) in &caches {
        let cache = cache.clone();
        let miss = op(move |_| {
            let cache = cache.clone();
            async move { assert!(cache.get("bench\0{\"missing\":true}").await.is_none()) }
        });
        rows.push(measure("cache miss", backend_name, miss, None, ops).await);
    }
    for (size, text) in [("100 B", &small), ("64 KiB", &large)] {
        let output = ToolOutput::text(text.as_str());
        let key: &'static str = if size == "100 B" {
            "bench\0{\"size\":\"small\"}"
        } else {
            "bench\0{\"size\":\"large\"}"
        };
        for (backend_name, cache) in &caches {
            let (cache, output) = (cache.clone(), output.clone());
            let put = op(move |_| {
                let (cache, output) = (cache.clone(), output.clone());
                async move { cache.put(key, &output, ttl).await }
            });
            let operation = if size == "100 B" {
                "cache put, 100 B output"
            } else {
                "cache put, 64 KiB output"
            };
            rows.push(measure(operation, backend_name, put, None, ops).await);
        }
        for (backend_name, cache) in &caches {
            let cache = cache.clone();
            let bytes = text.len();
            let hit = op(move |_| {
                let cache = cache.clone();
                async move {
                    let output = cache.get(key).await.expect("a hit");
                    assert_eq!(output.to_text().len(), bytes);
                }
            });
            let operation = if size == "100 B" {
                "cache hit, 100 B output"
            } else {
                "cache hit, 64 KiB output"
            };
            rows.push(measure(operation, backend_name, hit, None, ops).await);
        }
    }

    // Outputs over the size cap: 64 KiB of 1,024 lines stored, its first 100 lines read.
    let spilled: String = (0..1024).map(|i| format!("{i:>6} {}\n", "y".repeat(56))).collect();
    let spilled: Arc<str> = Arc::from(spilled);
    let folder = scratch_folder();
    let stores: [(&'static str, Arc<dyn OutputStore>); 2] = [
        ("in-process (files)", Arc::new(DirectoryStore::new(&folder))),
        // Kept briefly: the run stores hundreds of megabytes in all.
        ("redis", Arc::new(backend.output_store().with_retention(Duration::from_secs(2)))),
    ];
    for (backend_name, store) in stores {
        let spilled = spilled.clone();
        let put_get = op(move |_| {
            let (store, spilled) = (store.clone(), spilled.clone());
            async move {
                let stored =
                    store.store("bench run", "bench__tool", &spilled).await.expect("stored");
                let page = store.read(&stored.handle, 0, 100).await.expect("read back");
                assert_eq!((page.total_lines, page.text.lines().count()), (1024, 100));
            }
        });
        rows.push(
            measure("output store put + get, 64 KiB", backend_name, put_get, None, ops / 5).await,
        );
    }
    let _ = std::fs::remove_dir_all(&folder);

    // A pending external call: opened, waited for by its caller, answered by another
    // replica (in process: the same store).
    let memory = Arc::new(MemoryPendingStore::default());
    let pairs: [PendingPair; 2] = [
        ("in-process", memory.clone(), memory),
        ("redis (2 replicas)", Arc::new(backend.pending_store()), Arc::new(other.pending_store())),
    ];
    for (backend_name, caller, answerer) in pairs {
        let round_trip = op(move |i| {
            let (caller, answerer) = (caller.clone(), answerer.clone());
            async move {
                let id = caller.open(pending_call(i)).await.expect("opened");
                let waiter = {
                    let (caller, id) = (caller.clone(), id.clone());
                    tokio::spawn(async move { caller.wait(&id, Duration::from_secs(5)).await })
                };
                let answer = ExternalResult { result: json!("yes"), is_error: false };
                answerer.resolve(&id, answer.clone()).await.expect("answered");
                assert_eq!(waiter.await.expect("the waiter"), Some(answer));
            }
        });
        rows.push(
            measure("pending call open + wait + answer", backend_name, round_trip, None, ops).await,
        );
    }
    rows
}

fn pending_call(i: usize) -> PendingCall {
    PendingCall {
        call_id: String::new(),
        tool: "external__confirm".into(),
        arguments: json!({"question": "ok?", "n": i}),
        run_id: "bench".into(),
        owner: None,
        execution_type: ExecutionType::Space,
        is_async: false,
        visible: true,
        created_ms: 0,
        status: Default::default(),
        expires_ms: 0,
        ttl_ms: None,
    }
}

/// Waits until the sorted set `key` is empty: the queue's releases, sent from tasks after
/// the callers had their answers, all reached Redis.
fn drained(backend: &RedisBackend, key: &'static str) -> Op {
    let client = backend.client().clone();
    op(move |_| {
        let client = client.clone();
        async move {
            let started = Instant::now();
            loop {
                let reply = client.command(&["ZCARD", key]).await.expect("ZCARD");
                if reply.as_i64() == Some(0) {
                    return;
                }
                assert!(started.elapsed() < Duration::from_secs(30), "slots not released in 30 s");
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
    })
}

/// Times `ops` operations one at a time, then `ops` more from [`IN_FLIGHT`] tasks; each
/// phase after a warmup of a tenth of it, its wall time ending once `settle` returns.
async fn measure(
    operation: &'static str,
    backend: &'static str,
    op: Op,
    settle: Option<Op>,
    ops: usize,
) -> Row {
    let settle = || async {
        if let Some(settle) = &settle {
            settle(0).await;
        }
    };
    for i in 0..ops / 10 {
        op(i).await;
    }
    settle().await;
    let mut latencies = Vec::with_capacity(ops);
    let started = Instant::now();
    for i in 0..ops {
        let one = Instant::now();
        op(i).await;
        latencies.push(one.elapsed());
    }
    settle().await;
    let wall = started.elapsed();
    latencies.sort_unstable();
    let sequential = Phase { latencies, wall };

    let per_task = ops.div_ceil(IN_FLIGHT);
    let started = Instant::now();
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let one = Instant::now();
                    op(ops + task * per_task + i).await;
                    latencies.push(one.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(per_task * IN_FLIGHT);
    for task in tasks {
        latencies.extend(task.await.expect("a measuring task"));
    }
    settle().await;
    let wall = started.elapsed();
    latencies.sort_unstable();
    let mut progress = std::io::stderr().lock();
    writeln!(progress, "measured {operation} ({backend})").expect("stderr");
    Row { operation, backend, sequential, in_flight: Phase { latencies, wall } }
}

/// A folder of its own under the system's temporary folder, for the directory store.
fn scratch_folder() -> PathBuf {
    let folder = std::env::temp_dir().join(format!("toolmux-redis-bench-{}", std::process::id()));
    std::fs::create_dir_all(&folder).expect("a scratch folder");
    folder
}

/// `redis-benchmark -q --csv -n N -c C -t ping,get,set` against the server, with one
/// client and with [`IN_FLIGHT`]: its rows, or why there are none.
fn redis_benchmark(port: u16, ops: usize) -> Result<Vec<(usize, Vec<String>)>, String> {
    let mut rows = Vec::new();
    for clients in [1, IN_FLIGHT] {
        let output = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "--csv"])
            .args(["-n", &ops.to_string(), "-c", &clients.to_string(), "-t", "ping,get,set"])
            .current_dir(std::env::temp_dir())
            .output();
        let output = match output {
            Ok(output) if output.status.success() => output,
            Ok(output) => {
                return Err(format!(
                    "redis-benchmark failed ({}): {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err("redis-benchmark is not on PATH (it comes with redis-server: apt-get install redis-tools)".into());
            }
            Err(e) => return Err(format!("cannot run redis-benchmark: {e}")),
        };
        for line in String::from_utf8_lossy(&output.stdout).lines().skip(1) {
            let fields = line.split(',').map(|f| f.trim_matches('"').to_owned()).collect();
            rows.push((clients, fields));
        }
    }
    Ok(rows)
}

fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn report(
    rows: &[Row],
    benchmark: &Result<Vec<(usize, Vec<String>)>, String>,
    ops: usize,
    before: &str,
    after: &str,
) {
    let mut out = std::io::stdout().lock();
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
        info.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
    });
    let version = Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    writeln!(out, "\n{ops} operations per phase ({} for the output store); {cores} cores, {}; {}; commit {}; load average {before} before, {after} after\n",
        ops / 5, cpu.unwrap_or_default(), version.unwrap_or_default(), commit.unwrap_or_default()).expect("stdout");
    let floor = rows
        .iter()
        .find(|r| r.operation.starts_with("raw PING"))
        .map(|r| r.sequential.quantile(0.5));
    writeln!(out, "| operation | backend | p50 µs | p90 µs | p99 µs | ops/s | p50 over PING µs | 16 in flight: p50 µs | p90 µs | p99 µs | ops/s |").expect("stdout");
    writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|").expect("stdout");
    for row in rows {
        let (s, c) = (&row.sequential, &row.in_flight);
        let over = match floor {
            Some(floor)
                if row.backend.starts_with("redis") && !row.operation.starts_with("raw PING") =>
            {
                format!("{:.1}", (s.quantile(0.5).as_secs_f64() - floor.as_secs_f64()) * 1e6)
            }
            _ => "–".into(),
        };
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {over} | {} | {} | {} | {} |",
            row.operation,
            row.backend,
            micros(s.quantile(0.5)),
            micros(s.quantile(0.9)),
            micros(s.quantile(0.99)),
            thousands(s.per_second()),
            micros(c.quantile(0.5)),
            micros(c.quantile(0.9)),
            micros(c.quantile(0.99)),
            thousands(c.per_second()),
        )
        .expect("stdout");
    }
    writeln!(out).expect("stdout");
    match benchmark {
        Err(why) => writeln!(out, "redis-benchmark: {why}").expect("stdout"),
        Ok(lines) => {
            writeln!(
                out,
                "| redis-benchmark -n {ops} | clients | p50 µs | p95 µs | p99 µs | ops/s |"
            )
            .expect("stdout");
            writeln!(out, "|---|--:|--:|--:|--:|--:|").expect("stdout");
            for (clients, fields) in lines {
                // test, rps, avg, min, p50, p95, p99, max (milliseconds)
                let ms = |i: usize| {
                    fields
                        .get(i)
                        .and_then(|f| f.parse::<f64>().ok())
                        .map_or("?".into(), |v| format!("{:.1}", v * 1000.0))
                };
                let rps =
                    fields.get(1).and_then(|f| f.parse::<f64>().ok()).map_or("?".into(), thousands);
                let test = fields.first().map_or("?", String::as_str);
                writeln!(out, "| {test} | {clients} | {} | {} | {} | {rps} |", ms(4), ms(5), ms(6))
                    .expect("stdout");
            }
        }
    }
}
