//! The toolmux call pipeline against a direct call and against rig's registry, on a no-op tool.
//!
//! One process measures every subject the same way:
//! (a) latency of each call on a current-thread runtime (one core), p50/p90/p99;
//! (b) heap allocations and bytes per call, from a counting global allocator;
//! (c) throughput of 16 concurrent tasks on a 2-worker multi-thread runtime.
//!
//! Subjects run interleaved, round by round, so that load from other processes on the
//! machine spreads over all of them instead of hitting one. The table is printed and written
//! into `BENCHMARKS.md` under `## Call pipeline` (other sections are kept).
//!
//! Arguments (after `cargo bench --`): `--only <key,key>` runs those subjects (`empty`, `direct`,
//! `toolmux`, `rig`, `toolmux-text`, `toolmux-events`, `toolmux-audit`, `rig-bare`,
//! `toolmux-bare`), `--phase latency|alloc|throughput` runs one phase, `--quick` runs a tenth of
//! the calls, `--no-write` leaves `BENCHMARKS.md` alone. The last three are for profiling.

use async_trait::async_trait;
use rig_agent::tool::{Tool as RigTool, ToolContext as RigContext, ToolSet as RigToolSet};
use serde::Deserialize;
use serde_json::{Value, json};
use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use toolmux_core::{
    CallContext, ToolCall, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec,
};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, QueueConfig, ToolSettings};

// ---------------------------------------------------------------------------------------------
// Allocation counting

/// The system allocator, counting allocations while `COUNTING` is set. The flag is one relaxed
/// load when off, so the latency and throughput phases pay (almost) nothing for it.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

fn count(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the same arguments; counting touches only
// atomics and never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A growing realloc is counted as an allocation of the new size.
        count(new_size);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

// ---------------------------------------------------------------------------------------------
// The tool, three ways

/// The arguments every subject gets: a small object, as a model would send it.
const ARGS_TEXT: &str = r#"{"path":"src/lib.rs","limit":10,"recursive":true}"#;

fn args_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1},
            "recursive": {"type": "boolean"}
        },
        "required": ["path", "limit"]
    })
}

/// A toolmux provider with one tool that does nothing.
#[derive(Debug)]
struct NoOpProvider {
    specs: Vec<ToolSpec>,
}

impl NoOpProvider {
    fn new(schema: Value) -> Self {
        NoOpProvider { specs: vec![ToolSpec::new("noop", "Does nothing", schema)] }
    }
}

#[async_trait]
impl ToolProvider for NoOpProvider {
    fn kind(&self) -> ToolKind {
        ToolKind::Builtin
    }

    fn namespace(&self) -> &str {
        "bench"
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(self.specs.clone())
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        _ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        if name != "noop" {
            return Err(ToolError::UnknownTool { name: name.to_owned(), suggestions: Vec::new() });
        }
        black_box(arguments);
        Ok(ToolOutput::text("ok"))
    }
}

/// The same tool for rig: typed arguments, a text output. `schema` is what it advertises.
struct RigNoOp {
    schema: Value,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct RigArgs {
    path: String,
    limit: u64,
    #[serde(default)]
    recursive: bool,
}

impl RigTool for RigNoOp {
    const NAME: &'static str = "noop";
    type Args = RigArgs;
    type Output = String;
    type Error = Infallible;

    fn description(&self) -> String {
        "Does nothing".to_owned()
    }

    fn parameters(&self) -> Value {
        self.schema.clone()
    }

    async fn call(&self, _ctx: &mut RigContext, args: RigArgs) -> Result<String, Infallible> {
        black_box(args);
        Ok("ok".to_owned())
    }
}

// ---------------------------------------------------------------------------------------------
// Subjects

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Input {
    /// The arguments arrive as a parsed JSON value (cloned from a template per call).
    Value,
    /// The arguments arrive as JSON text and are parsed per call, as rig's input is.
    Text,
}

enum Target {
    /// Nothing at all: what the harness itself costs (two clock reads, the loop).
    Empty,
    Direct(Arc<dyn ToolProvider>),
    Toolmux(Orchestrator, Input),
    Rig(Arc<RigToolSet>),
}

struct Subject {
    key: &'static str,
    label: &'static str,
    /// Whether the row is one of the three the issue asks for (the others are extras).
    main: bool,
    target: Target,
    /// Events are drained by a task on the runtime of each phase.
    drain_events: bool,
    /// The audit log file, truncated after each phase so that it does not grow without end.
    audit_file: Option<PathBuf>,
}

/// What one calling task carries across its calls.
struct Caller {
    ctx: CallContext,
    rig_ctx: RigContext,
    args: Value,
}

impl Caller {
    fn new() -> Self {
        Caller {
            ctx: CallContext::new(),
            rig_ctx: RigContext::default(),
            args: serde_json::from_str(ARGS_TEXT).expect("valid JSON"),
        }
    }
}

impl Subject {
    /// One call; `true` when it succeeded.
    async fn call(&self, caller: &mut Caller) -> bool {
        match &self.target {
            Target::Empty => black_box(true),
            Target::Direct(provider) => {
                provider.call("noop", caller.args.clone(), &caller.ctx).await.is_ok()
            }
            Target::Toolmux(orchestrator, input) => {
                let args = match input {
                    Input::Value => caller.args.clone(),
                    Input::Text => serde_json::from_str(ARGS_TEXT).unwrap_or_default(),
                };
                orchestrator.execute(ToolCall::new("bench__noop", args), &caller.ctx).await.ok
            }
            Target::Rig(tools) => {
                tools.execute("noop", ARGS_TEXT, &mut caller.rig_ctx).await.is_success()
            }
        }
    }

    fn orchestrator(&self) -> Option<&Orchestrator> {
        match &self.target {
            Target::Toolmux(o, _) => Some(o),
            _ => None,
        }
    }

    /// Starts draining events on the current runtime, if this subject subscribes.
    fn start_drain(&self) -> Option<tokio::task::JoinHandle<()>> {
        let orchestrator = self.orchestrator().filter(|_| self.drain_events)?;
        let mut events = orchestrator.subscribe();
        Some(tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(event) => {
                        black_box(event);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        LAGGED.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        }))
    }

    fn end_phase(&self, drain: Option<tokio::task::JoinHandle<()>>) {
        if let Some(drain) = drain {
            drain.abort();
        }
        if let Some(path) = &self.audit_file {
            // The writer appends, so truncating under it is safe; it only keeps disk use low.
            if let Ok(file) = std::fs::OpenOptions::new().write(true).open(path) {
                let _ = file.set_len(0);
            }
        }
    }
}

/// Events the drain task missed because it fell behind (the channel keeps 1024).
static LAGGED: AtomicU64 = AtomicU64::new(0);

fn toolmux_config() -> OrchestratorConfig {
    OrchestratorConfig::default().with_queue("q", QueueConfig::new(1024)).with_provider_settings(
        "bench",
        ToolSettings::default().with_queue("q").with_timeout(Duration::from_secs(30)),
    )
}

fn orchestrator(config: OrchestratorConfig, schema: Value) -> Orchestrator {
    Orchestrator::builder(config)
        .provider(Arc::new(NoOpProvider::new(schema)))
        .build()
        .expect("the benchmark configuration is valid")
}

fn subjects(audit_file: &Path) -> Vec<Subject> {
    let mut rig = RigToolSet::default();
    rig.add_tool(RigNoOp { schema: args_schema() });
    let mut rig_bare = RigToolSet::default();
    rig_bare.add_tool(RigNoOp { schema: json!({"type": "object"}) });
    let full =
        |key, label, main, config, input, drain_events, audit_file: Option<PathBuf>| Subject {
            key,
            label,
            main,
            target: Target::Toolmux(orchestrator(config, args_schema()), input),
            drain_events,
            audit_file,
        };
    vec![
        Subject {
            key: "empty",
            label: "empty timed region (the harness's own cost, not subtracted)",
            main: false,
            target: Target::Empty,
            drain_events: false,
            audit_file: None,
        },
        Subject {
            key: "direct",
            label: "direct `ToolProvider::call` (no-op tool)",
            main: true,
            target: Target::Direct(Arc::new(NoOpProvider::new(args_schema()))),
            drain_events: false,
            audit_file: None,
        },
        full(
            "toolmux",
            "toolmux `Orchestrator::execute`: validation, queue, timeout, accounting",
            true,
            toolmux_config(),
            Input::Value,
            false,
            None,
        ),
        Subject {
            key: "rig",
            label: "rig-agent 0.44 `ToolSet::execute`",
            main: true,
            target: Target::Rig(Arc::new(rig)),
            drain_events: false,
            audit_file: None,
        },
        full(
            "toolmux-text",
            "toolmux, arguments parsed from JSON text per call (rig's input)",
            false,
            toolmux_config(),
            Input::Text,
            false,
            None,
        ),
        full(
            "toolmux-events",
            "toolmux + an event subscriber draining every event",
            false,
            toolmux_config(),
            Input::Value,
            true,
            None,
        ),
        full(
            "toolmux-audit",
            "toolmux + audit log (JSON lines to a file)",
            false,
            toolmux_config().with_audit_log(audit_file.to_owned()),
            Input::Value,
            false,
            Some(audit_file.to_owned()),
        ),
        Subject {
            key: "rig-bare",
            label: "rig, advertising `{\"type\":\"object\"}` (it clones the schema per call)",
            main: false,
            target: Target::Rig(Arc::new(rig_bare)),
            drain_events: false,
            audit_file: None,
        },
        full(
            "toolmux-bare",
            "toolmux floor: no queue, `{\"type\":\"object\"}` schema, default timeout",
            false,
            OrchestratorConfig::default(),
            Input::Value,
            false,
            None,
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Phases

struct Sizes {
    latency_rounds: usize,
    latency_calls: usize,
    warmup_calls: usize,
    alloc_calls: usize,
    throughput_rounds: usize,
    tasks: usize,
    calls_per_task: usize,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        let div = if quick { 10 } else { 1 };
        Sizes {
            latency_rounds: 5,
            latency_calls: 40_000 / div,
            warmup_calls: 20_000 / div,
            alloc_calls: 100_000 / div,
            throughput_rounds: 5,
            tasks: 16,
            calls_per_task: 25_000 / div,
        }
    }
}

#[derive(Default)]
struct Row {
    latencies_ns: Vec<u32>,
    allocs_per_call: f64,
    bytes_per_call: f64,
    calls_per_sec: Vec<f64>,
    /// Calls per second of on-CPU time of the whole process, times 2: what the two workers
    /// would do if no other process took turns on the cores.
    calls_per_cpu2: Vec<f64>,
    /// Share of the round's thread time spent runnable but waiting for a core.
    runqueue_share: Vec<f64>,
    failures: u64,
}

impl Row {
    fn percentile_ns(&self, p: f64) -> Option<f64> {
        if self.latencies_ns.is_empty() {
            return None;
        }
        let rank = ((self.latencies_ns.len() as f64 * p).ceil() as usize).max(1) - 1;
        Some(f64::from(self.latencies_ns[rank.min(self.latencies_ns.len() - 1)]))
    }

    fn median_throughput(&self) -> Option<f64> {
        let mut v = self.calls_per_sec.clone();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    fn median_of(v: &[f64]) -> Option<f64> {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }

    fn best_throughput(&self) -> Option<f64> {
        self.calls_per_sec.iter().copied().max_by(f64::total_cmp)
    }
}

/// (a) Each call timed on its own, on one thread; subjects interleaved round by round.
fn latency_phase(subjects: &[Subject], rows: &mut [Row], sizes: &Sizes) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        for row in rows.iter_mut() {
            row.latencies_ns.reserve(sizes.latency_rounds * sizes.latency_calls);
        }
        for round in 0..sizes.latency_rounds {
            for (subject, row) in subjects.iter().zip(rows.iter_mut()) {
                let drain = subject.start_drain();
                let mut caller = Caller::new();
                let warmup = if round == 0 { sizes.warmup_calls } else { sizes.warmup_calls / 10 };
                for i in 0..warmup {
                    row.failures += u64::from(!subject.call(&mut caller).await);
                    if drain.is_some() && i % 64 == 63 {
                        tokio::task::yield_now().await;
                    }
                }
                for i in 0..sizes.latency_calls {
                    let start = Instant::now();
                    let ok = subject.call(&mut caller).await;
                    let ns = start.elapsed().as_nanos();
                    row.latencies_ns.push(u32::try_from(ns).unwrap_or(u32::MAX));
                    row.failures += u64::from(!ok);
                    // The drain task runs between batches, outside the timed calls.
                    if drain.is_some() && i % 64 == 63 {
                        tokio::task::yield_now().await;
                    }
                }
                subject.end_phase(drain);
            }
        }
    });
    for row in rows.iter_mut() {
        row.latencies_ns.sort_unstable();
    }
}

/// (b) Allocations and bytes per call, counted over many calls after a warmup.
fn alloc_phase(subjects: &[Subject], rows: &mut [Row], sizes: &Sizes) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        for (subject, row) in subjects.iter().zip(rows.iter_mut()) {
            let drain = subject.start_drain();
            let mut caller = Caller::new();
            for i in 0..sizes.warmup_calls {
                row.failures += u64::from(!subject.call(&mut caller).await);
                if drain.is_some() && i % 64 == 63 {
                    tokio::task::yield_now().await;
                }
            }
            tokio::task::yield_now().await;
            ALLOCS.store(0, Ordering::Relaxed);
            BYTES.store(0, Ordering::Relaxed);
            COUNTING.store(true, Ordering::Relaxed);
            for i in 0..sizes.alloc_calls {
                row.failures += u64::from(!subject.call(&mut caller).await);
                // Draining inside the window: a subscriber's copies are part of the cost.
                if drain.is_some() && i % 64 == 63 {
                    tokio::task::yield_now().await;
                }
            }
            if drain.is_some() {
                tokio::task::yield_now().await;
            }
            if subject.audit_file.is_some() {
                // Let the writer thread catch up, so that its work on these records counts.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            COUNTING.store(false, Ordering::Relaxed);
            let calls = sizes.alloc_calls as f64;
            row.allocs_per_call = ALLOCS.load(Ordering::Relaxed) as f64 / calls;
            row.bytes_per_call = BYTES.load(Ordering::Relaxed) as f64 / calls;
            subject.end_phase(drain);
        }
    });
}

/// (c) `tasks` concurrent callers on a 2-worker runtime, wall time of a fixed number of calls.
fn throughput_phase(subjects: Vec<Subject>, rows: &mut [Row], sizes: &Sizes) -> Vec<Subject> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let subjects: Vec<Arc<Subject>> = subjects.into_iter().map(Arc::new).collect();
    rt.block_on(async {
        for round in 0..=sizes.throughput_rounds {
            for (subject, row) in subjects.iter().zip(rows.iter_mut()) {
                if matches!(subject.target, Target::Empty) {
                    continue;
                }
                let drain = subject.start_drain();
                // Round 0 is a warmup and is not recorded.
                let calls =
                    if round == 0 { sizes.calls_per_task / 5 } else { sizes.calls_per_task };
                let cpu_start = thread_times();
                let start = Instant::now();
                let tasks: Vec<_> = (0..sizes.tasks)
                    .map(|_| {
                        let subject = subject.clone();
                        tokio::spawn(async move {
                            let mut caller = Caller::new();
                            let mut failures = 0u64;
                            for _ in 0..calls {
                                failures += u64::from(!subject.call(&mut caller).await);
                            }
                            failures
                        })
                    })
                    .collect();
                for task in tasks {
                    row.failures += task.await.expect("task");
                }
                let elapsed = start.elapsed();
                let cpu = thread_times().since(cpu_start);
                if round > 0 {
                    let total = (sizes.tasks * calls) as f64;
                    row.calls_per_sec.push(total / elapsed.as_secs_f64());
                    row.calls_per_cpu2.push(2.0 * total / cpu.on_cpu.as_secs_f64());
                    row.runqueue_share.push(
                        cpu.waiting.as_secs_f64()
                            / (cpu.on_cpu + cpu.waiting).as_secs_f64().max(1e-9),
                    );
                }
                subject.end_phase(drain);
            }
        }
    });
    drop(rt);
    subjects
        .into_iter()
        .map(|s| Arc::try_unwrap(s).unwrap_or_else(|_| panic!("tasks are done")))
        .collect()
}

/// Time the threads of this process spent on a CPU and waiting in the run queue, summed
/// from `/proc/self/task/*/schedstat` (nanoseconds, as the scheduler counts them).
#[derive(Clone, Copy, Default)]
struct ThreadTimes {
    on_cpu: Duration,
    waiting: Duration,
}

impl ThreadTimes {
    fn since(self, earlier: ThreadTimes) -> ThreadTimes {
        ThreadTimes {
            on_cpu: self.on_cpu.saturating_sub(earlier.on_cpu),
            waiting: self.waiting.saturating_sub(earlier.waiting),
        }
    }
}

fn thread_times() -> ThreadTimes {
    let mut times = ThreadTimes::default();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return times };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        let mut fields = stat.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
        times.on_cpu += Duration::from_nanos(fields.next().unwrap_or(0));
        times.waiting += Duration::from_nanos(fields.next().unwrap_or(0));
    }
    times
}

// ---------------------------------------------------------------------------------------------
// Reporting

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn micros(ns: Option<f64>) -> String {
    ns.map_or_else(|| "–".to_owned(), |ns| format!("{:.2}", ns / 1000.0))
}

fn table(subjects: &[Subject], rows: &[Row], sizes: &Sizes) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| subject | p50 µs | p90 µs | p99 µs | allocs/call | bytes/call | calls/s, {} tasks on 2 workers | calls/s per 2 CPU-s |",
        sizes.tasks
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|");
    for (subject, row) in subjects.iter().zip(rows) {
        let label =
            if subject.main { format!("**{}**", subject.label) } else { subject.label.to_owned() };
        let throughput = row
            .median_throughput()
            .map_or_else(|| "–".to_owned(), |t| group_thousands(t.round() as u64));
        let per_cpu = Row::median_of(&row.calls_per_cpu2)
            .map_or_else(|| "–".to_owned(), |t| group_thousands(t.round() as u64));
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} | {:.1} | {:.0} | {throughput} | {per_cpu} |",
            micros(row.percentile_ns(0.50)),
            micros(row.percentile_ns(0.90)),
            micros(row.percentile_ns(0.99)),
            row.allocs_per_call,
            row.bytes_per_call,
        );
    }
    out
}

fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn verdict(subjects: &[Subject], rows: &[Row]) -> String {
    let Some(i) = subjects.iter().position(|s| s.key == "toolmux") else {
        return String::new();
    };
    let row = &rows[i];
    let p50 = row.percentile_ns(0.50).map(|ns| ns / 1000.0);
    let tput = row.median_throughput();
    let mark = |ok: bool| if ok { "met" } else { "**missed**" };
    let mut out = String::new();
    if let Some(p50) = p50 {
        let _ = writeln!(out, "- p50 ≤ 2 µs on one core: {} ({p50:.2} µs)", mark(p50 <= 2.0));
    }
    if let Some(t) = tput {
        let _ = writeln!(
            out,
            "- ≥ 1,000,000 calls/s from 16 callers on 2 cores, wall time: {} ({} calls/s)",
            mark(t >= 1_000_000.0),
            group_thousands(t.round() as u64)
        );
    }
    if let Some(t) = Row::median_of(&row.calls_per_cpu2) {
        let _ = writeln!(
            out,
            "- the same per 2 CPU-seconds (what two cores of our own would give): {} ({} calls/s)",
            mark(t >= 1_000_000.0),
            group_thousands(t.round() as u64)
        );
    }
    out
}

const SECTION: &str = "## Call pipeline";

fn write_benchmarks_md(path: &Path, section: &str) -> std::io::Result<()> {
    let existing = std::fs::read_to_string(path).unwrap_or_default();
    let header = format!(
        "# Benchmarks\n\n\
         Speed and memory of toolmux against direct calls and peer projects, measured by the \
         benchmarks of this repository. Each section says what it measures, when, and under \
         what load.\n\n\
         - Machine: {} cores (`nproc`), {}, shared with other builds (so each section gives \
         the load average at measurement time).\n\
         - Reproduce: `cargo xtask bench`, or `cd benchmarks/pipeline && cargo bench` for the \
         call pipeline (a separate Cargo workspace, so that peer crates stay out of the \
         product's dependency tree).\n\n",
        cores(),
        cpu_model()
    );
    let mut doc = if existing.trim().is_empty() { header } else { existing };
    // The heading as a whole line, so that a section whose title merely starts the same way
    // is left alone.
    let heading = format!("\n{SECTION}\n");
    match doc.find(&heading).map(|i| i + 1) {
        Some(start) => {
            let after = start + SECTION.len();
            let end = doc[after..].find("\n## ").map_or(doc.len(), |i| after + i + 1);
            doc.replace_range(start..end, section);
        }
        None => {
            if !doc.ends_with("\n\n") {
                doc.push_str(if doc.ends_with('\n') { "\n" } else { "\n\n" });
            }
            doc.push_str(section);
        }
    }
    std::fs::write(path, doc)
}

// ---------------------------------------------------------------------------------------------
// Micro-timings: the pieces the pipeline is made of, each timed alone (`--micro`)

/// Nanoseconds per iteration of `f`, best of 5 runs of `n` iterations.
fn ns_per<F: FnMut()>(n: u32, mut f: F) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(start.elapsed().as_nanos() as f64 / f64::from(n));
    }
    best
}

#[allow(clippy::print_stdout)]
fn micro(subjects: &[Subject]) {
    use toolmux_core::Op;
    use toolmux_orchestrator::ArgumentValidator;
    let n = 200_000;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let _guard = rt.enter();
    let mut rows: Vec<(&str, f64)> = Vec::new();
    rows.push((
        "tokio::time::Instant::now()",
        ns_per(n, || {
            black_box(tokio::time::Instant::now());
        }),
    ));
    let parent = tokio_util::sync::CancellationToken::new();
    rows.push((
        "std::time::Instant::now()",
        ns_per(n, || {
            black_box(Instant::now());
        }),
    ));
    rows.push((
        "CancellationToken::new() + drop",
        ns_per(n, || {
            black_box(tokio_util::sync::CancellationToken::new());
        }),
    ));
    rows.push((
        "CancellationToken::child_token() + drop",
        ns_per(n, || {
            black_box(parent.child_token());
        }),
    ));
    rows.push((
        "Op::new(tool, None) + drop (Arc, global id counter)",
        ns_per(n, || {
            black_box(Op::new(Arc::<str>::from("bench__noop"), None));
        }),
    ));
    let tool: Arc<str> = Arc::from("bench__noop");
    let q: Arc<str> = Arc::from("q");
    let op = Op::new(tool.clone(), None);
    rows.push((
        "Op::hold_queue + release_queue (mutex, Vec)",
        ns_per(n, || {
            op.hold_queue(&q);
            op.release_queue("q");
        }),
    ));
    rows.push((
        "Arc::new(AtomicU64) + drop",
        ns_per(n, || {
            black_box(Arc::new(AtomicU64::new(0)));
        }),
    ));
    rows.push((
        "Arc<str>::to_string() (tool name)",
        ns_per(n, || {
            black_box(tool.to_string());
        }),
    ));
    let semaphore = Arc::new(tokio::sync::Semaphore::new(1024));
    rows.push((
        "Semaphore::try_acquire_owned + release",
        ns_per(n, || {
            black_box(semaphore.clone().try_acquire_owned().ok());
        }),
    ));
    let validator = ArgumentValidator::new(Arc::new(args_schema()));
    validator.precompile().expect("schema compiles");
    let args: Value = serde_json::from_str(ARGS_TEXT).expect("json");
    rows.push((
        "ArgumentValidator::validate (3 properties, 2 required)",
        ns_per(n, || {
            black_box(validator.validate("bench__noop", &args).is_ok());
        }),
    ));
    rows.push((
        "arguments Value clone + drop",
        ns_per(n, || {
            black_box(args.clone());
        }),
    ));
    rows.push((
        "serde_json::from_str::<Value>(arguments)",
        ns_per(n, || {
            black_box(serde_json::from_str::<Value>(ARGS_TEXT).ok());
        }),
    ));
    rows.push((
        "ToolOutput::text(\"ok\") + drop",
        ns_per(n, || {
            black_box(ToolOutput::text("ok"));
        }),
    ));
    let output = ToolOutput::text("ok");
    rows.push((
        "ToolResult::from_output + drop",
        ns_per(n, || {
            black_box(toolmux_core::ToolResult::from_output(
                &output,
                ToolKind::Builtin,
                "bench",
                0,
            ));
        }),
    ));
    let ctx = CallContext::new();
    rows.push((
        "CancellationToken clone + drop (locks the token's node twice)",
        ns_per(n, || {
            black_box(parent.clone());
        }),
    ));
    rows.push((
        "CallContext clone + drop",
        ns_per(n, || {
            black_box(ctx.clone());
        }),
    ));
    rows.push((
        "CallContext clone + with_cancel(child)/with_op/with_deadline + drop",
        ns_per(n, || {
            let c = ctx
                .clone()
                .with_cancel(ctx.cancel_token().child_token())
                .with_op(op.clone())
                .with_deadline(tokio::time::Instant::now());
            black_box(c);
        }),
    ));
    if let Some(o) =
        subjects.iter().find_map(|s| (s.key == "toolmux").then(|| s.orchestrator()).flatten())
    {
        rows.push((
            "Orchestrator::registry() + Registry::get (RwLock, SipHash)",
            ns_per(n, || {
                let registry = o.registry();
                black_box(registry.get("bench__noop").cloned());
            }),
        ));
        let fut = o.execute(ToolCall::new("bench__noop", args.clone()), &ctx);
        println!(
            "size of the `Orchestrator::execute` future: {} bytes",
            std::mem::size_of_val(&fut)
        );
        drop(fut);
    }
    if let Some(p) = subjects.iter().find_map(|s| match &s.target {
        Target::Direct(p) => Some(p.clone()),
        _ => None,
    }) {
        let fut = p.call("noop", args.clone(), &ctx);
        println!(
            "size of a `ToolProvider::call` future (boxed by async-trait): {} bytes",
            std::mem::size_of_val(&fut)
        );
    }
    println!("\n| piece of the pipeline | ns |\n|---|--:|");
    for (what, ns) in rows {
        println!("| {what} | {ns:.1} |");
    }
}

// ---------------------------------------------------------------------------------------------

#[allow(clippy::print_stdout)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value_of =
        |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let only = value_of("--only");
    let phase = value_of("--phase");
    let quick = args.iter().any(|a| a == "--quick");
    let write =
        !args.iter().any(|a| a == "--no-write") && only.is_none() && phase.is_none() && !quick;
    let sizes = Sizes::new(quick);
    let runs = |p: &str| phase.as_deref().is_none_or(|wanted| wanted == p);

    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = manifest.join("target");
    let _ = std::fs::create_dir_all(&target);
    let audit_file = target.join("bench-audit.jsonl");

    let mut subjects = subjects(&audit_file);
    if let Some(only) = &only {
        let keys: Vec<&str> = only.split(',').collect();
        subjects.retain(|s| keys.contains(&s.key));
    }
    {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            for s in &subjects {
                if let Some(o) = s.orchestrator() {
                    let report = o.warmup().await;
                    assert!(report.is_ok(), "warmup failed: {report:?}");
                }
            }
        });
    }
    if args.iter().any(|a| a == "--micro") {
        micro(&subjects);
        return;
    }
    let mut rows: Vec<Row> = subjects.iter().map(|_| Row::default()).collect();
    let load_before = load_average();
    println!("toolmux pipeline benchmark: {} cores, {}; load {load_before}", cores(), cpu_model());

    let started = Instant::now();
    if runs("latency") {
        latency_phase(&subjects, &mut rows, &sizes);
        println!(
            "latency phase done ({:.1}s), load {}",
            started.elapsed().as_secs_f64(),
            load_average()
        );
    }
    if runs("alloc") {
        alloc_phase(&subjects, &mut rows, &sizes);
        println!(
            "allocation phase done ({:.1}s), load {}",
            started.elapsed().as_secs_f64(),
            load_average()
        );
    }
    let lagged_before_throughput = LAGGED.load(Ordering::Relaxed);
    if runs("throughput") {
        subjects = throughput_phase(subjects, &mut rows, &sizes);
        println!(
            "throughput phase done ({:.1}s), load {}",
            started.elapsed().as_secs_f64(),
            load_average()
        );
    }
    let load_after = load_average();

    let table = table(&subjects, &rows, &sizes);
    println!("\n{table}");
    for (s, row) in subjects.iter().zip(&rows) {
        if let (Some(best), false) = (row.best_throughput(), row.calls_per_sec.is_empty()) {
            let all: Vec<String> =
                row.calls_per_sec.iter().map(|t| group_thousands(t.round() as u64)).collect();
            let per_cpu: Vec<String> =
                row.calls_per_cpu2.iter().map(|t| group_thousands(t.round() as u64)).collect();
            let waits: Vec<String> =
                row.runqueue_share.iter().map(|w| format!("{:.0}%", w * 100.0)).collect();
            println!(
                "{:>15}: throughput rounds {} (best {}); per 2 CPU-s {}; run-queue wait {}",
                s.key,
                all.join(" / "),
                group_thousands(best.round() as u64),
                per_cpu.join(" / "),
                waits.join(" / ")
            );
        }
        if row.failures > 0 {
            println!("{:>15}: {} FAILED CALLS", s.key, row.failures);
        }
    }
    let lagged_single = lagged_before_throughput;
    let lagged_throughput = LAGGED.load(Ordering::Relaxed) - lagged_before_throughput;
    let waits: Vec<f64> = rows.iter().flat_map(|r| r.runqueue_share.iter().copied()).collect();
    let wait_share = Row::median_of(&waits);
    let verdict = verdict(&subjects, &rows);
    println!("\n{verdict}");
    let _ = std::fs::remove_file(&audit_file);

    if !write {
        return;
    }
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown date".to_owned(), |s| s.trim().to_owned());
    let mut section = String::new();
    let _ = write!(
        section,
        "{SECTION}\n\n\
         One call of an in-process no-op tool (arguments `{ARGS_TEXT}`, output `ok`) through \
         each path, measured in one process by `benchmarks/pipeline` \
         (`cd benchmarks/pipeline && cargo bench`, a separate Cargo workspace so that rig \
         never enters the product's dependency tree).\n\n\
         - **Latency**: each call timed alone on a current-thread runtime (one core), \
         {} calls per subject after warmup, subjects interleaved in {} rounds.\n\
         - **Allocations**: a counting global allocator over {} calls (reallocations count as \
         allocations).\n\
         - **Throughput**: {} tasks of {} calls each on a 2-worker multi-thread runtime, wall \
         time; median of {} rounds. The last column divides the calls by the on-CPU time of \
         all the process's threads (from `/proc/self/task/*/schedstat`) and doubles it: the \
         rate two cores would give if no other process took turns on them.\n\
         - The toolmux pipeline has a JSON Schema (3 properties, 2 required) to validate, a \
         1024-slot queue, a 30 s timeout and per-tool statistics; permission rules, hooks, cache \
         and budgets are configured off, as they are by default. rig deserializes its typed \
         arguments from JSON text; toolmux takes a parsed `serde_json::Value` (the \
         \"parsed from JSON text\" row adds the parse). rig 0.44 clones the tool's registration, \
         JSON Schema included, on every call (`ToolSet::execute` calls `self.get(name).cloned()`), \
         so its cost grows with the schema; the one here has 3 properties. With a bare \
         `{{\"type\":\"object\"}}` schema rig matches the figures known for its bare dispatch on \
         a quiet machine of this kind (about 1.1 µs, 21 allocations, 1.6 million calls/s from 16 \
         tasks on 2 workers), which supports reading the last column as the rate of a quiet \
         machine.\n\n\
         Measured {date} on {} cores (`nproc`), {}; load average {load_before} before, \
         {load_after} after.\n\n",
        group_thousands((sizes.latency_rounds * sizes.latency_calls) as u64),
        sizes.latency_rounds,
        group_thousands(sizes.alloc_calls as u64),
        sizes.tasks,
        group_thousands(sizes.calls_per_task as u64),
        sizes.throughput_rounds,
        cores(),
        cpu_model(),
    );
    if let Some(w) = wait_share {
        let _ = writeln!(
            section,
            "During the throughput rounds the benchmark's threads spent a median {:.0}% of \
             their runnable time waiting for a core taken by other processes.\n",
            w * 100.0
        );
    }
    section.push_str(&table);
    let _ = write!(section, "\nTargets for the full pipeline (bold toolmux row):\n\n{verdict}");
    if lagged_single + lagged_throughput > 0 {
        // Two events per call, over the warmup round and the measured rounds.
        let sent = 2 * sizes.tasks * sizes.calls_per_task * sizes.throughput_rounds
            + 2 * sizes.tasks * (sizes.calls_per_task / 5);
        let _ = writeln!(
            section,
            "\nThe event subscriber is one task among the 16 callers: in the throughput rounds \
             it fell behind and missed {} of about {} events (the channel keeps 1024; a missed \
             event is not cloned for the receiver), {} in the single-core phases.",
            group_thousands(lagged_throughput),
            group_thousands(sent as u64),
            group_thousands(lagged_single),
        );
    }
    section.push('\n');
    let md = manifest.join("../../BENCHMARKS.md");
    match write_benchmarks_md(&md, &section) {
        Ok(()) => println!("wrote {}", md.display()),
        Err(e) => println!("could not write {}: {e}", md.display()),
    }
}
