//! Per-call latency of serving through toolmux: an rmcp client calling server-everything's
//! `echo` directly over stdio, against the same client calling it through
//! `toolmux_mcp::server` serving an `McpProvider` of server-everything (client → toolmux
//! server → toolmux client → server-everything). The target is a ratio of at most
//! 1.3 in median per-call latency.
//!
//! Run with `cargo bench -p toolmux-mcp --bench serve` after `.ci/install-peers` (it needs
//! `node` on PATH and the server-everything peer). Options: `--quick` (fewer calls),
//! `--calls N`. The table it prints is what BENCHMARKS-serve.md records.
//!
//! The client reaches toolmux over a Unix socket pair in this process, a kernel byte stream
//! like the pipe of `toolmux serve` on stdio, so both paths pay for the same kind of hop to
//! the client; the toolmux path pays one more hop (to server-everything) and the gateway's
//! work. The orchestrator's pipeline is not in the path (this crate cannot depend on it);
//! its own benchmark measures that.

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UnixStream;
use tokio::process::Command;
use toolmux_core::ToolProvider;
use toolmux_mcp::server::{ServeOptions, serve_io};
use toolmux_mcp::{McpProvider, McpServerConfig};

type Client = RunningService<RoleClient, ()>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run(calls));
}

fn everything() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script =
        root.join(".peers/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        script.exists(),
        "missing test peer @modelcontextprotocol/server-everything: run .ci/install-peers"
    );
    script
}

async fn direct_client() -> (Client, tokio::process::Child) {
    let mut child = Command::new("node")
        .arg(everything())
        .arg("stdio")
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("server-everything starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let stdin = child.stdin.take().expect("piped stdin");
    let client = ().serve((stdout, stdin)).await.expect("handshake with server-everything");
    (client, child)
}

async fn gateway_client() -> (Client, Arc<McpProvider>) {
    let config =
        McpServerConfig::stdio("node", [everything().display().to_string(), "stdio".into()])
            .with_base_dir(std::env::temp_dir());
    let provider = Arc::new(McpProvider::new("everything", config).expect("a valid config"));
    provider.warmup().await.expect("server-everything starts under toolmux");
    let (client_end, server_end) = UnixStream::pair().expect("a socket pair");
    let (reader, writer) = server_end.into_split();
    let served: Arc<dyn ToolProvider> = provider.clone();
    tokio::spawn(serve_io(served, ServeOptions::default(), reader, writer));
    let client = ().serve(client_end).await.expect("handshake with toolmux");
    (client, provider)
}

/// The client of a toolmux server serving a local echo tool, with no upstream: what
/// serving alone costs.
async fn local_client() -> Client {
    let tools = toolmux_core::ToolSet::new("local", toolmux_core::ToolKind::Builtin).with_tool(
        toolmux_core::ToolSpec::new("echo", "Echoes", serde_json::json!({"type": "object"})),
        |args, _| async move {
            let message = args["message"].as_str().unwrap_or_default().to_owned();
            Ok(toolmux_core::ToolOutput::text(format!("Echo: {message}")))
        },
    );
    let (client_end, server_end) = UnixStream::pair().expect("a socket pair");
    let (reader, writer) = server_end.into_split();
    tokio::spawn(serve_io(Arc::new(tools), ServeOptions::default(), reader, writer));
    ().serve(client_end).await.expect("handshake with toolmux")
}

/// Median, p90 and p99 of `calls` sequential echo calls, after a warm-up.
async fn measure(client: &Client, calls: usize) -> [Duration; 3] {
    let params = || {
        let arguments = serde_json::json!({"message": "hello"});
        CallToolRequestParams::new("echo")
            .with_arguments(arguments.as_object().cloned().unwrap_or_default())
    };
    for _ in 0..100 {
        client.call_tool(params()).await.expect("echo answers");
    }
    let mut latencies = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        let result = client.call_tool(params()).await.expect("echo answers");
        latencies.push(start.elapsed());
        assert_ne!(result.is_error, Some(true), "echo failed: {result:?}");
    }
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    [at(0.5), at(0.9), at(0.99)]
}

#[expect(clippy::print_stdout, reason = "a benchmark prints its table")]
async fn run(calls: usize) {
    let (direct, mut child) = direct_client().await;
    let (gateway, provider) = gateway_client().await;
    // Alternate the two paths so that drift of the machine affects both alike.
    let local = local_client().await;
    let mut direct_runs = Vec::new();
    let mut gateway_runs = Vec::new();
    let mut local_runs = Vec::new();
    for _ in 0..3 {
        direct_runs.push(measure(&direct, calls).await);
        gateway_runs.push(measure(&gateway, calls).await);
        local_runs.push(measure(&local, calls).await);
    }
    let best = |runs: &[[Duration; 3]]| *runs.iter().min_by_key(|r| r[0]).expect("three runs");
    let (d, g, l) = (best(&direct_runs), best(&gateway_runs), best(&local_runs));
    let us = |d: Duration| d.as_micros();
    println!("| path | calls | median µs | p90 µs | p99 µs |");
    println!("|---|---|---|---|---|");
    println!(
        "| rmcp client → server-everything (stdio) | {calls} | {} | {} | {} |",
        us(d[0]),
        us(d[1]),
        us(d[2])
    );
    println!(
        "| rmcp client → toolmux server → McpProvider → server-everything | {calls} | {} | {} | {} |",
        us(g[0]),
        us(g[1]),
        us(g[2])
    );
    println!(
        "| rmcp client → toolmux server → local echo (no upstream) | {calls} | {} | {} | {} |",
        us(l[0]),
        us(l[1]),
        us(l[2])
    );
    println!(
        "\nratio of medians: {:.2} (target ≤ 1.3); best median of 3 runs each",
        g[0].as_secs_f64() / d[0].as_secs_f64()
    );
    let _ = direct.cancel().await;
    let _ = gateway.cancel().await;
    let _ = local.cancel().await;
    let _ = provider.shutdown().await;
    let _ = child.kill().await;
}
