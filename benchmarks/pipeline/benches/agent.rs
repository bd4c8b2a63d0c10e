//! toolmux's agent loop against rig's, on the same scripted model server, in one process.
//!
//! One run of an agent is one task on which the model (a `ScriptedLlmServer` from
//! `toolmux-test-support`: a real HTTP server on a loopback port, speaking OpenAI's chat
//! completions on a thread of its own) calls one no-op tool for 9 turns and then answers in
//! plain text: 10 model requests per run. The subjects:
//!
//! - `toolmux`: `toolmux_agent::Agents::run` with an OpenAI-compatible model from
//!   `toolmux_llm::connect`, the tool an in-process no-op `ToolProvider` in an `Orchestrator`
//!   with the default configuration;
//! - `rig`: a rig-agent 0.44 `Agent` with the same no-op tool as a `rig::tool::Tool`, on rig's
//!   Chat Completions wire (`OpenAI::chat`, not its Responses API) through rig's own reqwest
//!   transport, `default_max_turns(20)` (rig counts model requests as turns);
//! - two floors: the 10 requests of a run, each subject's own bodies as recorded from a run of
//!   it (as the server parsed them, written out again), posted by a bare `reqwest::Client`
//!   that reads each answer and parses nothing. A subject minus its floor is what its agent
//!   loop adds to the HTTP exchanges and the server.
//!
//! Every subject runs on a current-thread runtime on the main thread; each gets a fresh server
//! and client per round (so the server's record of requests stays small), warmed up, and the
//! subjects take turns round by round, so that the machine's drift falls on all of them.
//! Reported: wall time per run (p50, p90), per model turn, on-CPU time of the client's thread
//! and of the server's thread per run (from `/proc/thread-self/schedstat` and the server
//! thread's), heap allocations per run on every thread but the server's (a counting global
//! allocator, as `benches/pipeline.rs` counts), and the request bytes a run sends.
//!
//! Arguments (after `cargo bench --bench agent --`): `--rounds N`, `--runs N` (per subject and
//! round), `--alloc-runs N` (0: none), `--quick` (a tenth of the runs), `--only <key,key>`
//! runs those subjects (`toolmux`, `rig`, `floor-toolmux`, `floor-rig`), `--show-requests`
//! prints the first two requests of each subject. The table is printed, not written anywhere.

use rig_agent::AgentBuilder;
use rig_agent::tool::{Tool as RigTool, ToolContext as RigContext};
use rig_core::providers::openai::OpenAIConfig;
use serde::Deserialize;
use serde_json::{Value, json};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;
use toolmux_agent::{AgentConfig, AgentDefinitions, AgentStatus, Agents};
use toolmux_core::{CallContext, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec};
use toolmux_llm::{ApiKind, Model, ModelConfig};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig};
use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};

// ---------------------------------------------------------------------------------------------
// Allocation counting

/// The system allocator, counting allocations while `COUNTING` is set on every thread but the
/// scripted server's (which marks itself in its callback): the server is the same for every
/// subject and is not what is measured.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the scripted server's thread by its first callback.
    static SERVER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// The kernel's id of the thread of the last server that answered, for its CPU time.
static SERVER_TID: AtomicU64 = AtomicU64::new(0);

fn count(bytes: usize) {
    if COUNTING.load(Ordering::Relaxed) && !SERVER_THREAD.get() {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the same arguments; counting touches only
// atomics and a const-initialized thread-local without destructor, and never allocates.
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
// The script and the tool

/// Turns on which the model calls the tool; the turn after them answers in text.
const TOOL_TURNS: usize = 9;
/// Model requests per run.
const REQUESTS_PER_RUN: usize = TOOL_TURNS + 1;
/// The model's final answer.
const ANSWER: &str = "done";
const TASK: &str = "Call the tool until it has answered nine times, then say done.";
/// The model's name at the (scripted) API, and the key both clients send.
const MODEL: &str = "scripted-model";
const API_KEY: &str = "sk-bench";

fn tool_arguments() -> Value {
    json!({"path": "src/lib.rs", "limit": 10, "recursive": true})
}

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

/// The server's answer to any request: a call of the request's first tool (other than
/// toolmux's own `agent__` tools) while fewer than [`TOOL_TURNS`] tool results are in the
/// conversation, then [`ANSWER`]. Deciding from the request lets one server serve any number
/// of runs, and replayed requests alike.
fn model_step() -> ScriptStep {
    ScriptStep::callback(|request| {
        if !SERVER_THREAD.replace(true) {
            // `/proc/thread-self` links to `<pid>/task/<tid>`.
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|link| link.file_name()?.to_str()?.parse().ok())
                .unwrap_or(0);
            SERVER_TID.store(tid, Ordering::Relaxed);
        }
        let messages = request.get("messages").and_then(Value::as_array);
        let results = messages.map_or(0, |m| {
            m.iter().filter(|m| m.get("role").and_then(Value::as_str) == Some("tool")).count()
        });
        if results >= TOOL_TURNS {
            return ScriptStep::text(ANSWER);
        }
        let tool = request
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
            .find(|name| !name.starts_with("agent__"))
            .unwrap_or("noop");
        ScriptStep::tool_call(tool, tool_arguments())
    })
}

/// toolmux's no-op tool `bench__noop`.
#[derive(Debug)]
struct NoOpProvider {
    specs: Vec<ToolSpec>,
}

#[async_trait::async_trait]
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

/// The same tool for rig, `noop`: typed arguments, a text output.
struct RigNoOp;

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
        args_schema()
    }

    async fn call(&self, _ctx: &mut RigContext, args: RigArgs) -> Result<String, Infallible> {
        black_box(args);
        Ok("ok".to_owned())
    }
}

// ---------------------------------------------------------------------------------------------
// Subjects

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Toolmux,
    Rig,
    /// The recorded requests of a run of this subject, by a bare client.
    Floor(FloorOf),
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum FloorOf {
    Toolmux,
    Rig,
}

impl Kind {
    fn key(self) -> &'static str {
        match self {
            Kind::Toolmux => "toolmux",
            Kind::Rig => "rig",
            Kind::Floor(FloorOf::Toolmux) => "floor-toolmux",
            Kind::Floor(FloorOf::Rig) => "floor-rig",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Toolmux => "**toolmux `Agents::run`** (orchestrator, default configuration)",
            Kind::Rig => "**rig-agent 0.44 `Agent::prompt`** (Chat Completions wire)",
            Kind::Floor(FloorOf::Toolmux) => {
                "floor: toolmux's 10 request bodies, bare `reqwest` client"
            }
            Kind::Floor(FloorOf::Rig) => "floor: rig's 10 request bodies, bare `reqwest` client",
        }
    }

    /// Whose recorded requests this subject sends.
    fn recorded(self) -> FloorOf {
        match self {
            Kind::Toolmux | Kind::Floor(FloorOf::Toolmux) => FloorOf::Toolmux,
            Kind::Rig | Kind::Floor(FloorOf::Rig) => FloorOf::Rig,
        }
    }

    fn floor(self) -> Option<Kind> {
        match self {
            Kind::Toolmux => Some(Kind::Floor(FloorOf::Toolmux)),
            Kind::Rig => Some(Kind::Floor(FloorOf::Rig)),
            Kind::Floor(_) => None,
        }
    }
}

/// A subject connected to one server.
enum Client {
    Toolmux {
        agents: Agents,
        // Kept alive: the agents hold it weakly.
        _orchestrator: Orchestrator,
    },
    Rig(Box<rig_agent::Agent>),
    Bare {
        client: reqwest::Client,
        url: String,
        authorization: String,
        bodies: Arc<Vec<Vec<u8>>>,
    },
}

fn toolmux_model(base_url: &str) -> Arc<dyn Model> {
    let config = ModelConfig {
        api: ApiKind::Openai,
        model: MODEL.into(),
        base_url: Some(base_url.to_owned()),
        api_key: Some(API_KEY.into()),
        ..ModelConfig::default()
    };
    toolmux_llm::connect("bench", &config).expect("a valid model configuration")
}

async fn connect(
    kind: Kind,
    base_url: &str,
    bodies: &BTreeMap<FloorOf, Arc<Vec<Vec<u8>>>>,
) -> Client {
    match kind {
        Kind::Toolmux => {
            let mut definitions = AgentDefinitions::default();
            definitions.agents.insert(
                "bench".into(),
                AgentConfig { model: "bench".into(), ..AgentConfig::default() },
            );
            let models = BTreeMap::from([("bench".to_owned(), toolmux_model(base_url))]);
            let agents = Agents::new(definitions, models).expect("valid agents");
            let noop =
                NoOpProvider { specs: vec![ToolSpec::new("noop", "Does nothing", args_schema())] };
            let orchestrator = Orchestrator::builder(OrchestratorConfig::default())
                .provider(Arc::new(noop))
                .provider(agents.provider())
                .build()
                .expect("a valid orchestrator");
            agents.attach(&orchestrator);
            let report = orchestrator.warmup().await;
            assert!(report.is_ok(), "warmup failed: {report:?}");
            Client::Toolmux { agents, _orchestrator: orchestrator }
        }
        Kind::Rig => {
            let model = OpenAIConfig::new(API_KEY).with_base_url(base_url).client().chat(MODEL);
            Client::Rig(Box::new(
                AgentBuilder::new(model).tool(RigNoOp).default_max_turns(20).build(),
            ))
        }
        Kind::Floor(of) => Client::Bare {
            client: reqwest::Client::builder().build().expect("an HTTP client"),
            url: format!("{base_url}/chat/completions"),
            authorization: format!("Bearer {API_KEY}"),
            bodies: bodies.get(&of).expect("bodies recorded before the rounds").clone(),
        },
    }
}

impl Client {
    /// One run; `Err` says what went wrong.
    async fn run(&self) -> Result<(), String> {
        match self {
            Client::Toolmux { agents, .. } => {
                let report = agents
                    .run("bench", TASK, &CallContext::new())
                    .await
                    .map_err(|e| e.to_string())?;
                let done = report.status == AgentStatus::Success
                    && report.content == ANSWER
                    && report.tool_calls as usize == TOOL_TURNS
                    && report.turns as usize == REQUESTS_PER_RUN;
                if done { Ok(()) } else { Err(format!("{report:?}")) }
            }
            Client::Rig(agent) => {
                let response = agent.prompt(TASK).await.map_err(|e| e.to_string())?;
                if response.output() == ANSWER && response.requests() == REQUESTS_PER_RUN {
                    Ok(())
                } else {
                    Err(format!("{response:?}"))
                }
            }
            Client::Bare { client, url, authorization, bodies } => {
                for body in bodies.iter() {
                    let response = client
                        .post(url.as_str())
                        .header("content-type", "application/json")
                        .header("authorization", authorization.as_str())
                        .body(body.clone())
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    if !response.status().is_success() {
                        return Err(format!("status {}", response.status()));
                    }
                    black_box(response.bytes().await.map_err(|e| e.to_string())?);
                }
                Ok(())
            }
        }
    }
}

/// A server with steps for `runs` runs.
fn server(runs: usize) -> ScriptedLlmServer {
    let server = ScriptedLlmServer::start(Dialect::OpenAi, Vec::new());
    server.push_steps(std::iter::repeat_n(model_step(), runs * REQUESTS_PER_RUN));
    server
}

/// The request bodies of one run of `kind`, as the server received them, and the headers of
/// the first request.
async fn record(kind: Kind) -> (Vec<Value>, BTreeMap<String, String>) {
    let server = server(1);
    let client = connect(kind, &server.base_url(), &BTreeMap::new()).await;
    client.run().await.unwrap_or_else(|e| panic!("{kind:?} failed: {e}"));
    (server.requests(), server.request_headers().swap_remove(0))
}

// ---------------------------------------------------------------------------------------------
// Measurement

#[derive(Default)]
struct Row {
    run_ns: Vec<u64>,
    client_cpu_ns: u64,
    server_cpu_ns: u64,
    timed_runs: u64,
    /// The median of each round's runs.
    round_p50_us: Vec<f64>,
    allocs_per_run: f64,
    bytes_per_run: f64,
}

/// The median of `ns` in µs; NaN when there is nothing (`--runs 0`).
fn median_us(ns: &[u64]) -> f64 {
    let mut v = ns.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).map_or(f64::NAN, |&ns| ns as f64 / 1000.0)
}

impl Row {
    /// The `p` quantile of the timed runs in µs; NaN when there are none.
    fn percentile_us(&self, p: f64) -> f64 {
        let mut v = self.run_ns.clone();
        v.sort_unstable();
        let rank = ((v.len() as f64 * p).ceil() as usize).max(1) - 1;
        v.get(rank.min(v.len().saturating_sub(1))).map_or(f64::NAN, |&ns| ns as f64 / 1000.0)
    }
}

/// On-CPU nanoseconds of the calling thread.
fn own_cpu_ns() -> u64 {
    schedstat("/proc/thread-self/schedstat")
}

/// On-CPU nanoseconds of thread `tid` of this process.
fn thread_cpu_ns(tid: u64) -> u64 {
    schedstat(&format!("/proc/self/task/{tid}/schedstat"))
}

fn schedstat(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|f| f.parse().ok()))
        .unwrap_or(0)
}

/// Timed rounds: each subject in turn gets a fresh server and client, `warmup` untimed runs,
/// then `runs` runs timed one by one.
async fn rounds(
    kinds: &[Kind],
    rows: &mut [Row],
    bodies: &BTreeMap<FloorOf, Arc<Vec<Vec<u8>>>>,
    rounds: usize,
    runs: usize,
) {
    for round in 0..rounds {
        for (&kind, row) in kinds.iter().zip(rows.iter_mut()) {
            let warmup = if round == 0 { 50 } else { 10 };
            let server = server(warmup + runs);
            let client = connect(kind, &server.base_url(), bodies).await;
            for _ in 0..warmup {
                client.run().await.unwrap_or_else(|e| panic!("{kind:?} failed: {e}"));
            }
            // The warmup made this server's thread register.
            let server_thread = SERVER_TID.load(Ordering::Relaxed);
            let server_start = thread_cpu_ns(server_thread);
            let cpu_start = own_cpu_ns();
            for _ in 0..runs {
                let start = Instant::now();
                let outcome = client.run().await;
                row.run_ns.push(start.elapsed().as_nanos() as u64);
                outcome.unwrap_or_else(|e| panic!("{kind:?} failed: {e}"));
            }
            row.client_cpu_ns += own_cpu_ns() - cpu_start;
            row.server_cpu_ns += thread_cpu_ns(server_thread) - server_start;
            row.timed_runs += runs as u64;
            // Every step pushed was taken: each run made exactly its 10 requests. (Not
            // `server.requests()`, whose copy of every body would cost this thread as much as
            // a run.)
            assert_eq!(server.remaining_steps(), 0, "{kind:?}");
            row.round_p50_us.push(median_us(&row.run_ns[row.run_ns.len() - runs..]));
        }
    }
}

/// Allocations per run, counted over `runs` runs after a warmup.
async fn allocations(
    kinds: &[Kind],
    rows: &mut [Row],
    bodies: &BTreeMap<FloorOf, Arc<Vec<Vec<u8>>>>,
    runs: usize,
) {
    for (&kind, row) in kinds.iter().zip(rows.iter_mut()) {
        let warmup = 20;
        let server = server(warmup + runs);
        let client = connect(kind, &server.base_url(), bodies).await;
        for _ in 0..warmup {
            client.run().await.unwrap_or_else(|e| panic!("{kind:?} failed: {e}"));
        }
        ALLOCS.store(0, Ordering::Relaxed);
        BYTES.store(0, Ordering::Relaxed);
        COUNTING.store(true, Ordering::Relaxed);
        for _ in 0..runs {
            client.run().await.unwrap_or_else(|e| panic!("{kind:?} failed: {e}"));
        }
        COUNTING.store(false, Ordering::Relaxed);
        row.allocs_per_run = ALLOCS.load(Ordering::Relaxed) as f64 / runs as f64;
        row.bytes_per_run = BYTES.load(Ordering::Relaxed) as f64 / runs as f64;
    }
}

// ---------------------------------------------------------------------------------------------
// Reporting

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// The machine's CPU time so far, in clock ticks: (all, stolen by the hypervisor), from the
/// `cpu` line of `/proc/stat`.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    (fields.iter().sum(), fields.get(7).copied().unwrap_or(0))
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
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

fn table(kinds: &[Kind], rows: &[Row], bodies: &BTreeMap<FloorOf, Arc<Vec<Vec<u8>>>>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| subject | p50 µs/run | p90 µs/run | p50 µs per model turn | p50 over its floor, µs/run | client thread CPU µs/run | server thread CPU µs/run | allocs/run | bytes allocated/run | request bytes/run |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for (&kind, row) in kinds.iter().zip(rows) {
        let p50 = row.percentile_us(0.5);
        let over = kind
            .floor()
            .and_then(|f| kinds.iter().position(|&k| k == f))
            .map_or_else(|| "–".to_owned(), |i| format!("{:.0}", p50 - rows[i].percentile_us(0.5)));
        let per_run = |ns: u64| ns as f64 / 1000.0 / row.timed_runs as f64;
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.1} | {over} | {:.0} | {:.0} | {} | {} | {} |",
            kind.label(),
            p50,
            row.percentile_us(0.9),
            p50 / REQUESTS_PER_RUN as f64,
            per_run(row.client_cpu_ns),
            per_run(row.server_cpu_ns),
            group_thousands(row.allocs_per_run.round() as u64),
            group_thousands(row.bytes_per_run.round() as u64),
            group_thousands(bodies[&kind.recorded()].iter().map(Vec::len).sum::<usize>() as u64),
        );
    }
    out
}

#[allow(clippy::print_stdout)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
    };
    let quick = args.iter().any(|a| a == "--quick");
    let n_rounds = value_of("--rounds").unwrap_or(10);
    let runs = value_of("--runs").unwrap_or(if quick { 15 } else { 150 });
    let alloc_runs = value_of("--alloc-runs").unwrap_or(if quick { 10 } else { 100 });
    let mut kinds =
        vec![Kind::Toolmux, Kind::Rig, Kind::Floor(FloorOf::Toolmux), Kind::Floor(FloorOf::Rig)];
    if let Some(only) = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)) {
        let keys: Vec<&str> = only.split(',').collect();
        kinds.retain(|k| keys.contains(&k.key()));
    }
    if kinds.is_empty() {
        // `cargo xtask bench -- --only …` passes the pipeline benchmark's keys here too.
        println!("agent loop benchmark: no subject selected by --only");
        return;
    }

    // toolmux-llm installs rustls's ring provider, which every reqwest client of this process
    // (rig's, the floor's) then builds with; none of them speaks TLS here.
    drop(toolmux_model("http://127.0.0.1:9/v1"));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let load_before = load_average();
    println!("agent loop benchmark: {} cores; load {load_before}", cores());
    let started = Instant::now();
    let ticks_before = cpu_ticks();
    let mut rows: Vec<Row> = kinds.iter().map(|_| Row::default()).collect();
    let bodies = rt.block_on(async {
        let mut bodies = BTreeMap::new();
        for (kind, of) in [(Kind::Toolmux, FloorOf::Toolmux), (Kind::Rig, FloorOf::Rig)] {
            let (requests, headers) = record(kind).await;
            if args.iter().any(|a| a == "--show-requests") {
                println!("{kind:?} headers: {headers:?}");
                for r in requests.iter().take(2) {
                    println!(
                        "{kind:?} request: {}",
                        serde_json::to_string_pretty(r).unwrap_or_default()
                    );
                }
            }
            let recorded: Vec<Vec<u8>> =
                requests.iter().map(|r| r.to_string().into_bytes()).collect();
            assert_eq!(recorded.len(), REQUESTS_PER_RUN);
            bodies.insert(of, Arc::new(recorded));
        }
        rounds(&kinds, &mut rows, &bodies, n_rounds, runs).await;
        println!(
            "timed rounds done ({:.1}s), load {}",
            started.elapsed().as_secs_f64(),
            load_average()
        );
        if alloc_runs > 0 {
            allocations(&kinds, &mut rows, &bodies, alloc_runs).await;
        }
        bodies
    });
    let load_after = load_average();
    let ticks_after = cpu_ticks();
    let stolen =
        (ticks_after.1 - ticks_before.1) as f64 / (ticks_after.0 - ticks_before.0).max(1) as f64;
    println!(
        "done ({:.1}s); load {load_before} before, {load_after} after; {:.0}% of the machine's \
         CPU time stolen by the hypervisor meanwhile; {n_rounds} rounds × {runs} runs per \
         subject, allocations over {alloc_runs} runs\n",
        started.elapsed().as_secs_f64(),
        stolen * 100.0
    );
    for (kind, row) in kinds.iter().zip(&rows) {
        let rounds: Vec<String> = row.round_p50_us.iter().map(|us| format!("{us:.0}")).collect();
        println!("{:>13}: p50 µs/run by round {}", kind.key(), rounds.join(" / "));
    }
    print!("\n{}", table(&kinds, &rows, &bodies));
}
