//! Every progress report a server sends reaches the caller's sink, in order, the first
//! ones too: a server that reports at once, before the client could have done anything
//! after sending the call, loses none of them, on the direct stdio lane and on rmcp's
//! session.

use serde_json::json;
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, ProgressSink, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig};

use crate::support;

/// A context whose sink keeps the progress values reported to it.
fn recording() -> (CallContext, Arc<Mutex<Vec<f64>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let seen = seen.clone();
        ProgressSink::new(move |p| seen.lock().unwrap().push(p.progress))
    };
    (CallContext::new().with_progress(sink), seen)
}

/// Checks that `seen` is 1 to `count`, naming the first reports missing or out of order.
fn check_whole(seen: &[f64], count: u64, round: usize) {
    let wanted: Vec<f64> = (1..=count).map(|i| i as f64).collect();
    let missing: Vec<f64> = wanted.iter().copied().filter(|w| !seen.contains(w)).collect();
    assert!(
        missing.is_empty(),
        "round {round}: {} reports of {count}, missing {:?}",
        seen.len(),
        &missing[..missing.len().min(20)]
    );
    if let Some(at) = seen.iter().zip(&wanted).position(|(s, w)| s != w) {
        let shown = &seen[at.saturating_sub(2)..(at + 8).min(seen.len())];
        panic!("round {round}: report {} is out of order: {shown:?}", at + 1);
    }
}

/// Calls the flood tool of the Python fixture five times, each for 2000 reports, and
/// checks that each call's sink got them all, in order.
async fn flood_rounds(provider: &McpProvider) {
    let tools = provider.list_tools().await.unwrap();
    let name = tools.iter().find(|t| t.name.ends_with("flood")).unwrap().name.clone();
    for round in 0..5 {
        let (ctx, seen) = recording();
        let out = provider.call(&name, json!({"count": 2000}), &ctx).await.unwrap();
        assert_eq!(out.to_text(), "flooded 2000");
        check_whole(&seen.lock().unwrap(), 2000, round);
    }
}

/// On the direct lane of a stdio connection (the fixture speaks 2025-11-25), each call
/// gets the 500 reports the fixture writes as soon as it reads the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_early_report_reaches_a_call_on_the_lane() {
    let provider = McpProvider::new("fixture", support::fixture_stdio("ok")).unwrap();
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some("2025-11-25"));
    for round in 0..20 {
        let (ctx, seen) = recording();
        let out = provider.call("echo", json!({"progress": 500}), &ctx).await.unwrap();
        assert_eq!(out.to_text(), "echo: ");
        check_whole(&seen.lock().unwrap(), 500, round);
    }
    provider.shutdown().await.unwrap();
}

/// On a 2026-07-28 stdio connection (the Python SDK's), which has no lane, calls go
/// through rmcp's session, which chooses the progress token as it queues the request: the
/// reports read before the call could route them still reach it. Under load (both cores
/// busy) 15 of 30 runs lost reports 1 to k (up to 20) before the change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_report_of_a_flood_reaches_a_call_on_the_session() {
    let config = McpServerConfig::stdio(
        support::python().display().to_string(),
        [support::fixture("progress_flood_server.py").display().to_string()],
    )
    .with_base_dir(support::run_dir());
    let provider = McpProvider::new("py", config).unwrap();
    flood_rounds(&provider).await;
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    provider.shutdown().await.unwrap();
}

/// Over streamable HTTP (the Python SDK's, 2026-07-28), a call's reports come on the
/// response's event stream, and rmcp hands each to the client's handler in a task of its
/// own: they still reach the call whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_report_of_a_flood_reaches_a_call_over_http() {
    let port = support::free_port();
    let script = support::fixture("progress_flood_server.py").display().to_string();
    let server = support::ServerProcess::start(
        &support::python().display().to_string(),
        &[script, "http".into(), port.to_string()],
        port,
    );
    let config =
        McpServerConfig::remote(toolmux_mcp::TransportKind::Http, format!("{}/mcp", server.base));
    let provider = McpProvider::new("py", config).unwrap();
    flood_rounds(&provider).await;
    provider.shutdown().await.unwrap();
}
