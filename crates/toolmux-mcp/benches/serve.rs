//! Per-call latency of serving through toolmux: an rmcp client calling server-everything's
//! `echo` directly over stdio, against the same client calling `everything__echo` through
//! the real `toolmux serve --stdio` binary configured with server-everything as an
//! `mcpServers` stdio entry (client → toolmux process: server, orchestrator pipeline, MCP
//! client → server-everything). The target is a ratio of at most 1.3 in median
//! per-call latency. Two in-process rows split the gateway's cost: the serving hop alone
//! (`toolmux_mcp::server` serving a local echo tool over a Unix socket) and the server with
//! an `McpProvider` of server-everything behind it (no orchestrator, no process boundary).
//! The in-process servers run on their own current-thread runtime and OS thread, as
//! `toolmux serve --stdio` does.
//!
//! Run with `cargo build --release -p toolmux-cli && cargo bench -p toolmux-mcp --bench
//! serve` after `.ci/install-peers` (it needs `node` on PATH, the server-everything peer,
//! and the `toolmux` binary: `target/release/toolmux`, or the path in `TOOLMUX_BIN`).
//! Options: `--quick` (fewer calls), `--calls N`, `--only binary,relay,provider,local` (the
//! direct path is always measured), `--in-flight C` (afterwards, 3 × N calls per path made
//! by C tasks at once: calls per second). `SERVE_BENCH_UPSTREAM=fixture` puts this crate's
//! hand-written Rust stdio server (a fast peer) at the end of every path instead of
//! server-everything. A byte relay process (this binary with `--relay`)
//! shows the floor any process between client and server costs. The paths take turns in
//! 50-call rounds, so that the machine's drift falls on all of them alike; each ratio is
//! printed of the medians of all calls and as the median of same-round ratios. The table it
//! prints is what BENCHMARKS-serve.md records.

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use toolmux_core::ToolProvider;
use toolmux_mcp::server::{ServeOptions, serve_fds};
use toolmux_mcp::{McpProvider, McpServerConfig};

type Client = RunningService<RoleClient, ()>;

/// Calls per path in each round of the interleaved measurement.
const ROUND: usize = 50;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--relay") {
        relay();
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--json-relay") {
        let number = |i: usize| args.get(at + i).and_then(|a| a.parse().ok()).unwrap_or(0);
        json_relay(&args[at + 1], number(2), number(3));
        return;
    }
    // `cargo test --benches` runs bench binaries without `--bench`; only measure when asked.
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let calls = match args.iter().position(|a| a == "--calls") {
        Some(at) => args[at + 1].parse().expect("--calls takes a number"),
        None if quick => 300,
        None => 3000,
    };
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .map(|at| args[at + 1].split(',').map(str::to_owned).collect());
    let in_flight = args
        .iter()
        .position(|a| a == "--in-flight")
        .map_or(0, |at| args[at + 1].parse().expect("--in-flight takes a number"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(calls, only, in_flight));
}

/// `--relay`: copies stdin to a server-everything child and its stdout back, byte for
/// byte, from two threads blocked in `read`: the least any process between a client and
/// the server can cost (two more pipe hops and process wakeups per call).
fn relay() {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    let (program, args) = upstream();
    let mut child = std::process::Command::new(program)
        .args(args)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("server-everything starts");
    let copy = |mut from: Box<dyn Read + Send>, mut to: Box<dyn Write + Send>| {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        })
    };
    let stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned().expect("stdin"));
    let stdout =
        std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().expect("stdout"));
    let to_child = copy(Box::new(stdin), Box::new(child.stdin.take().expect("piped stdin")));
    let _from_child = copy(Box::new(child.stdout.take().expect("piped stdout")), Box::new(stdout));
    let _ = to_child.join();
    let _ = child.kill();
    let _ = child.wait();
}

/// One JSON line parsed and written again, as a JSON-aware relay must at least do.
fn rewrite(line: &[u8]) -> Vec<u8> {
    let value: serde_json::Value = serde_json::from_slice(line).expect("a JSON line");
    let mut out = serde_json::to_vec(&value).expect("JSON again");
    out.push(b'\n');
    out
}

/// `--json-relay MODE`: like `--relay`, but parses every line as JSON and writes it again,
/// as the least a JSON-aware gateway must do. MODE `threads`: two threads blocked in `read`;
/// `tokio`: one current-thread tokio runtime, pipes registered with its event loop.
fn json_relay(mode: &str, pre: u64, post: u64) {
    use std::io::{BufRead, Write};
    use std::os::fd::AsFd;
    let (program, args) = upstream();
    let mut child = std::process::Command::new(program)
        .args(args)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("server-everything starts");
    let stdin = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned().expect("stdin"));
    let stdout =
        std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().expect("stdout"));
    let child_in =
        std::fs::File::from(std::os::fd::OwnedFd::from(child.stdin.take().expect("piped stdin")));
    let child_out =
        std::fs::File::from(std::os::fd::OwnedFd::from(child.stdout.take().expect("piped stdout")));
    if mode == "poll" {
        use std::io::Read;
        let mut sides = [(stdin, child_in, Vec::new()), (child_out, stdout, Vec::new())];
        let mut chunk = vec![0u8; 64 * 1024];
        'outer: loop {
            let ready = {
                let mut fds = [
                    rustix::event::PollFd::new(&sides[0].0, rustix::event::PollFlags::IN),
                    rustix::event::PollFd::new(&sides[1].0, rustix::event::PollFlags::IN),
                ];
                if rustix::event::poll(&mut fds, None).is_err() {
                    continue;
                }
                [!fds[0].revents().is_empty(), !fds[1].revents().is_empty()]
            };
            for (i, side) in sides.iter_mut().enumerate() {
                if !ready[i] {
                    continue;
                }
                let n = match side.0.read(&mut chunk) {
                    Ok(0) | Err(_) => break 'outer,
                    Ok(n) => n,
                };
                side.2.extend_from_slice(&chunk[..n]);
                while let Some(end) = side.2.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = side.2.drain(..=end).collect();
                    let out = rewrite(&line);
                    if side.1.write_all(&out).is_err() {
                        break 'outer;
                    }
                }
            }
        }
    } else if mode == "threads" {
        let copy = |from: std::fs::File, mut to: std::fs::File| {
            std::thread::spawn(move || {
                let mut from = std::io::BufReader::new(from);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match from.read_until(b'\n', &mut line) {
                        Ok(1..) => {}
                        _ => break,
                    }
                    let out = rewrite(&line);
                    spin(pre);
                    if to.write_all(&out).is_err() {
                        break;
                    }
                    spin(post);
                }
            })
        };
        let a = copy(stdin, child_in);
        let _b = copy(child_out, stdout);
        let _ = a.join();
    } else {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        use tokio::net::unix::pipe;
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        rt.block_on(async move {
            let copy = |from: pipe::Receiver, mut to: pipe::Sender| async move {
                let mut from = tokio::io::BufReader::new(from);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match from.read_until(b'\n', &mut line).await {
                        Ok(1..) => {}
                        _ => break,
                    }
                    let out = rewrite(&line);
                    if to.write_all(&out).await.is_err() {
                        break;
                    }
                }
            };
            let a = copy(
                pipe::Receiver::from_file_unchecked(stdin).expect("a pipe"),
                pipe::Sender::from_file_unchecked(child_in).expect("a pipe"),
            );
            let b = tokio::spawn(copy(
                pipe::Receiver::from_file_unchecked(child_out).expect("a pipe"),
                pipe::Sender::from_file_unchecked(stdout).expect("a pipe"),
            ));
            a.await;
            b.abort();
        });
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Keeps the CPU busy for `us` microseconds (a stand-in for work around a write).
fn spin(us: u64) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn everything() -> PathBuf {
    let script = root()
        .join(".peers/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        script.exists(),
        "missing test peer @modelcontextprotocol/server-everything: run .ci/install-peers"
    );
    script
}

/// The server every path ends at, as a program and its arguments: server-everything, or
/// with `SERVE_BENCH_UPSTREAM=fixture` this crate's hand-written stdio fixture server (a
/// fast peer: a few µs per call, so the gateway's own cost is most of what is measured).
/// An environment variable, so the relay processes this bench spawns pick the same one.
fn upstream() -> (String, Vec<String>) {
    match std::env::var("SERVE_BENCH_UPSTREAM").as_deref() {
        Ok("fixture") => {
            (env!("CARGO_BIN_EXE_toolmux-mcp-fixture").to_owned(), vec!["ok".to_owned()])
        }
        Ok("everything") | Err(_) => {
            ("node".to_owned(), vec![everything().display().to_string(), "stdio".to_owned()])
        }
        Ok(other) => panic!("SERVE_BENCH_UPSTREAM={other}: expected `everything` or `fixture`"),
    }
}

/// The `toolmux` binary: `TOOLMUX_BIN`, or the release build of this workspace.
#[expect(clippy::print_stderr, reason = "a benchmark warns about what it measures")]
fn toolmux_binary() -> PathBuf {
    let binary = std::env::var_os("TOOLMUX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/release/toolmux"));
    assert!(
        binary.exists(),
        "missing {}: run `cargo build --release -p toolmux-cli` (or set TOOLMUX_BIN)",
        binary.display()
    );
    // A binary older than the crates' sources may not be the code being measured.
    let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
    let crates = std::fs::read_dir(root().join("crates")).into_iter().flatten().flatten();
    let newer = built.and_then(|built| {
        crates.into_iter().find_map(|krate| newer_source(&krate.path().join("src"), built))
    });
    if let Some(newer) = newer {
        eprintln!(
            "warning: {} is newer than {}; rebuild it (`cargo build --release -p toolmux-cli`) to measure the current code",
            newer.display(),
            binary.display()
        );
    }
    binary
}

/// A `.rs` file under `dir` modified after `than`, if any.
fn newer_source(dir: &Path, than: std::time::SystemTime) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            if let Some(newer) = newer_source(&path, than) {
                return Some(newer);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && meta.modified().is_ok_and(|m| m > than)
        {
            return Some(path);
        }
    }
    None
}

/// A client of a process speaking MCP on stdio.
async fn spawn_client(mut command: Command) -> (Client, Child) {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the server starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let stdin = child.stdin.take().expect("piped stdin");
    let client = ().serve((stdout, stdin)).await.expect("a handshake");
    (client, child)
}

/// The client of server-everything.
async fn direct_client() -> (Client, Child) {
    let (program, args) = upstream();
    let mut command = Command::new(program);
    command.args(args).current_dir(std::env::temp_dir());
    spawn_client(command).await
}

/// The client of this bench binary in `--relay` mode in front of server-everything.
async fn relay_client() -> (Client, Child) {
    let mut command = Command::new(std::env::current_exe().expect("the bench binary"));
    command.arg("--relay").current_dir(std::env::temp_dir());
    spawn_client(command).await
}

/// The client of `toolmux serve --stdio` with server-everything as its one MCP server;
/// the configuration lives in `dir`, which also gets toolmux's outputs and statistics.
async fn binary_client(dir: &Path, binary: PathBuf) -> (Client, Child) {
    let config = serde_json::json!({
        "mcpServers": {
            "everything": {"command": upstream().0, "args": upstream().1}
        }
    });
    let file = dir.join("toolmux.json");
    std::fs::write(&file, config.to_string()).expect("the configuration is written");
    let mut command = Command::new(binary);
    command.arg("--config").arg(&file).arg("serve").arg("--stdio").current_dir(dir);
    spawn_client(command).await
}

/// Serves `provider` on a Unix socket with `serve_fds` from its own OS thread and
/// current-thread runtime, as `toolmux serve --stdio` does, and returns the client end.
fn serve_on_thread(
    provider: impl FnOnce() -> Arc<dyn ToolProvider> + Send + 'static,
) -> UnixStream {
    let (client_end, server_end) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    std::thread::spawn(move || {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let provider = provider();
            let _ = provider.warmup().await;
            let input = std::os::fd::OwnedFd::from(server_end.try_clone().expect("a duplicate"));
            let output = std::os::fd::OwnedFd::from(server_end);
            let _ = serve_fds(provider.clone(), ServeOptions::default(), input, output).await;
            let _ = provider.shutdown().await;
        });
    });
    client_end.set_nonblocking(true).expect("non-blocking");
    UnixStream::from_std(client_end).expect("a tokio socket")
}

/// The client of an in-process toolmux server serving an `McpProvider` of
/// server-everything: the gateway without the orchestrator and the process boundary.
async fn provider_client() -> Client {
    let stream = serve_on_thread(|| {
        let (program, args) = upstream();
        let config = McpServerConfig::stdio(program, args).with_base_dir(std::env::temp_dir());
        Arc::new(McpProvider::new("everything", config).expect("a valid config"))
    });
    ().serve(stream).await.expect("handshake with toolmux")
}

/// The client of an in-process toolmux server serving a local echo tool, with no
/// upstream: what serving alone costs.
async fn local_client() -> Client {
    let stream = serve_on_thread(|| {
        let tools = toolmux_core::ToolSet::new("local", toolmux_core::ToolKind::Builtin).with_tool(
            toolmux_core::ToolSpec::new("echo", "Echoes", serde_json::json!({"type": "object"})),
            |args, _| async move {
                let message = args["message"].as_str().unwrap_or_default().to_owned();
                Ok(toolmux_core::ToolOutput::text(format!("Echo: {message}")))
            },
        );
        Arc::new(tools)
    });
    ().serve(stream).await.expect("handshake with toolmux")
}

/// The arguments of one echo call of `tool`.
fn params(tool: &'static str) -> CallToolRequestParams {
    let arguments = serde_json::json!({"message": "hello"});
    CallToolRequestParams::new(tool)
        .with_arguments(arguments.as_object().cloned().unwrap_or_default())
}

/// Calls `tool` `calls` times in a row; the latency of each call.
async fn measure(client: &Client, tool: &'static str, calls: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        let result = client.call_tool(params(tool)).await.expect("echo answers");
        latencies.push(start.elapsed());
        assert_ne!(result.is_error, Some(true), "echo failed: {result:?}");
    }
    latencies
}

/// `calls` calls of `tool` made by `in_flight` tasks taking turns from one counter, so that
/// up to `in_flight` calls are under way at once: the wall time and each call's latency.
async fn measure_concurrent(
    client: &Client,
    tool: &'static str,
    calls: usize,
    in_flight: usize,
) -> (Duration, Vec<Duration>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let peer = client.peer().clone();
            let next = next.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < calls {
                    let call = Instant::now();
                    let result = peer.call_tool(params(tool)).await.expect("echo answers");
                    latencies.push(call.elapsed());
                    assert_ne!(result.is_error, Some(true), "echo failed: {result:?}");
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(calls);
    for task in tasks {
        latencies.extend(task.await.expect("a measuring task"));
    }
    (start.elapsed(), latencies)
}

/// The value at quantile `q` of sorted `samples`.
fn quantile(samples: &[Duration], q: f64) -> Duration {
    samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]
}

/// The median of `samples`, sorting them.
fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    quantile(samples, 0.5)
}

/// One measured path.
struct Measured {
    /// What `--only` selects it by.
    key: &'static str,
    label: &'static str,
    client: Client,
    tool: &'static str,
    /// Every measured call's latency.
    samples: Vec<Duration>,
    /// The median of each round.
    rounds: Vec<Duration>,
}

impl Measured {
    fn new(key: &'static str, label: &'static str, client: Client, tool: &'static str) -> Self {
        Measured { key, label, client, tool, samples: Vec::new(), rounds: Vec::new() }
    }
}

#[expect(clippy::print_stdout, reason = "a benchmark prints its table")]
async fn run(calls: usize, only: Option<Vec<String>>, in_flight: usize) {
    let dir = std::env::temp_dir().join(format!("toolmux-serve-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let wanted =
        |key: &str| key == "direct" || only.as_ref().is_none_or(|o| o.iter().any(|k| k == key));
    let mut children = Vec::new();
    let mut paths = Vec::new();
    let (direct, child) = direct_client().await;
    children.push(child);
    paths.push(Measured::new("direct", "client → server-everything (stdio)", direct, "echo"));
    // `TOOLMUX_BIN_B`: a second build measured in the same run, for before/after pairs.
    if let Some(other) = std::env::var_os("TOOLMUX_BIN_B") {
        let (binary, child) = binary_client(&dir, PathBuf::from(other)).await;
        children.push(child);
        paths.push(Measured::new(
            "binary-b",
            "the same through the `TOOLMUX_BIN_B` build",
            binary,
            "everything__echo",
        ));
    }
    if wanted("binary") {
        let (binary, child) = binary_client(&dir, toolmux_binary()).await;
        children.push(child);
        paths.push(Measured::new(
            "binary",
            "client → `toolmux serve --stdio` → server-everything",
            binary,
            "everything__echo",
        ));
    }
    if wanted("relay") {
        let (relay, child) = relay_client().await;
        children.push(child);
        paths.push(Measured::new(
            "relay",
            "client → byte relay process (no parsing) → server-everything: the floor",
            relay,
            "echo",
        ));
    }
    for (key, mode, pre, post, label) in [
        (
            "json-threads",
            "threads",
            0,
            0,
            "client → JSON relay, two blocking threads (parse + write every line) → server-everything",
        ),
        ("json-poll", "poll", 0, 0, "the same, one thread waiting in `poll` for both pipes"),
        ("json-pre", "threads", 10, 0, "the same, 10 µs of work before each write"),
        ("json-post", "threads", 0, 10, "the same, 10 µs of work after each write"),
        (
            "json-tokio",
            "tokio",
            0,
            0,
            "client → JSON relay, current-thread tokio (parse + write every line) → server-everything",
        ),
    ] {
        if wanted(key) {
            let mut command = Command::new(std::env::current_exe().expect("the bench binary"));
            command
                .arg("--json-relay")
                .arg(mode)
                .arg(pre.to_string())
                .arg(post.to_string())
                .current_dir(std::env::temp_dir());
            let (client, child) = spawn_client(command).await;
            children.push(child);
            paths.push(Measured::new(key, label, client, "echo"));
        }
    }
    if wanted("provider") {
        paths.push(Measured::new(
            "provider",
            "in-process: client → toolmux server → McpProvider → server-everything",
            provider_client().await,
            "echo",
        ));
    }
    if wanted("local") {
        paths.push(Measured::new(
            "local",
            "in-process: client → toolmux server → local echo (the serving hop)",
            local_client().await,
            "echo",
        ));
    }
    // Interleave the paths in short rounds, so that the machine's drift (on a shared VM the
    // direct path alone moves by ±15% from one second to the next) falls on all alike, and
    // compare each round's medians with the direct path's in the same round.
    for path in &paths {
        measure(&path.client, path.tool, 100).await;
    }
    let rounds = (calls * 3).div_ceil(ROUND).max(1);
    for _ in 0..rounds {
        for path in &mut paths {
            let mut round = measure(&path.client, path.tool, ROUND).await;
            path.samples.extend_from_slice(&round);
            path.rounds.push(median(&mut round));
        }
    }
    let us = |d: Duration| d.as_micros();
    let (program, args) = upstream();
    println!("upstream: {program} {}", args.join(" "));
    println!("| path | calls | median µs | p90 µs | p99 µs |");
    println!("|---|---|--:|--:|--:|");
    let mut medians = Vec::new();
    for path in &mut paths {
        path.samples.sort_unstable();
        let samples = &path.samples;
        medians.push(quantile(samples, 0.5));
        println!(
            "| {} | {} | {} | {} | {} |",
            path.label,
            samples.len(),
            us(quantile(samples, 0.5)),
            us(quantile(samples, 0.9)),
            us(quantile(samples, 0.99))
        );
    }
    println!();
    let direct = paths[0].rounds.clone();
    for (path, median_all) in paths.iter().zip(&medians).skip(1) {
        if matches!(path.key, "binary" | "binary-b" | "relay" | "json-threads" | "json-poll") {
            let mut ratios: Vec<f64> = path
                .rounds
                .iter()
                .zip(&direct)
                .map(|(m, d)| m.as_secs_f64() / d.as_secs_f64())
                .collect();
            ratios.sort_unstable_by(f64::total_cmp);
            println!(
                "ratio {} / direct: {:.2} of the medians of all calls; {:.2} the median of {} same-round ratios (quartiles {:.2}–{:.2})",
                path.key,
                median_all.as_secs_f64() / medians[0].as_secs_f64(),
                ratios[ratios.len() / 2],
                ratios.len(),
                ratios[ratios.len() / 4],
                ratios[ratios.len() * 3 / 4],
            );
        }
    }
    println!(
        "(target for binary ≤ 1.3; {ROUND}-call rounds of each path in turn, {rounds} rounds)"
    );
    if in_flight > 0 {
        // Throughput: each path in turn, three times, `calls` calls with `in_flight` under way.
        let mut totals: Vec<(Duration, Vec<Duration>)> = vec![Default::default(); paths.len()];
        for _ in 0..3 {
            for (path, total) in paths.iter().zip(&mut totals) {
                let (wall, latencies) =
                    measure_concurrent(&path.client, path.tool, calls, in_flight).await;
                total.0 += wall;
                total.1.extend(latencies);
            }
        }
        println!();
        println!("| path | in flight | calls | calls/s | median µs | p99 µs |");
        println!("|---|--:|--:|--:|--:|--:|");
        for (path, (wall, latencies)) in paths.iter().zip(&mut totals) {
            latencies.sort_unstable();
            println!(
                "| {} | {in_flight} | {} | {:.0} | {} | {} |",
                path.label,
                latencies.len(),
                latencies.len() as f64 / wall.as_secs_f64(),
                us(quantile(latencies, 0.5)),
                us(quantile(latencies, 0.99))
            );
        }
    }
    for path in paths {
        let _ = path.client.cancel().await;
    }
    for mut child in children {
        let _ = child.kill().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
