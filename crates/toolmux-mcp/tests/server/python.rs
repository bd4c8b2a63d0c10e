//! The official Python SDK client (PyPI `mcp`) against the fixture server, over stdio and
//! streamable HTTP, with the handshake and with the stateless 2026-07-28 revision.

use crate::support::{TIMEOUT, http_fixture, peer, repo_root};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Stdio;
use tokio::process::Command;

const FIXTURE: &str = env!("CARGO_BIN_EXE_toolmux-mcp-serve-fixture");

fn python() -> PathBuf {
    peer("python/venv/bin/python", "mcp (PyPI)")
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/server/python_client.py")
}

/// Runs the Python client with `args` and parses its summary.
async fn run_client(args: &[&str]) -> Value {
    peer("python/venv/lib/python3.11/site-packages/mcp", "mcp (PyPI)");
    let child = Command::new(python())
        .arg(script())
        .args(args)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python starts");
    let output = tokio::time::timeout(TIMEOUT * 3, child.wait_with_output())
        .await
        .expect("python client finishes in time")
        .expect("python client runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "python client failed: {stderr}\n{stdout}");
    // The SDK logs a warning to stderr when a session's DELETE gets another status than
    // 200 or 204 (or 405).
    assert!(!stderr.contains("Session termination failed"), "{stderr}");
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no summary ({e}): {stdout}\n{stderr}"))
}

fn check_common(summary: &Value, bulk: u64) {
    assert_eq!(summary["echo"], "echo: hi", "{summary}");
    assert_eq!(summary["fail"]["is_error"], true);
    assert_eq!(summary["fail"]["text"], "the fail tool always fails");
    assert_eq!(summary["error_output"]["is_error"], true);
    assert_eq!(summary["error_output"]["text"], "scripted error output");
    assert_eq!(summary["image"], serde_json::json!(["text", "image"]));
    assert_eq!(summary["structured"], serde_json::json!({"n": 42}));
    assert_eq!(summary["progress_result"], "done");
    // Reports closer together than the gateway's progress interval are coalesced: the
    // first goes out at once, the last before the result, the middle one only when the tool
    // was slow to make it.
    let mut progress = summary["progress"].as_array().cloned().unwrap_or_default();
    progress.retain(|report| report[0] != 2.0);
    assert_eq!(
        Value::Array(progress),
        serde_json::json!([[1.0, 3.0, "step 1"], [3.0, 3.0, "step 3"]]),
        "{summary}"
    );
    assert_eq!(summary["hidden_listed"], false);
    assert!(summary["cancelled"].as_u64().unwrap_or(0) >= 1, "{summary}");
    assert!(summary["tool_count"].as_u64().unwrap_or(0) > bulk);
}

#[tokio::test]
async fn python_client_over_stdio_with_the_handshake() {
    let summary =
        run_client(&["--mode", "legacy", "stdio", FIXTURE, "stdio", "--bulk", "250"]).await;
    check_common(&summary, 250);
    assert_eq!(summary["protocol"], "2025-11-25");
    assert_eq!(summary["pages"], 3);
    assert_eq!(summary["list_changed"], true);
}

#[tokio::test]
async fn python_client_over_stdio_with_2026_07_28() {
    let args = [
        "--mode",
        "auto",
        "stdio",
        FIXTURE,
        "stdio",
        "--bulk",
        "250",
        "--prefix",
        "mcp__toolmux__",
    ];
    let summary = run_client(&args).await;
    check_common(&summary, 250);
    assert_eq!(summary["protocol"], "2026-07-28");
    assert_eq!(summary["pages"], 3);
    assert_eq!(summary["max_name_len"], 64 - "mcp__toolmux__".len());
}

#[tokio::test]
async fn python_client_over_http_with_the_handshake() {
    let fixture = http_fixture("127.0.0.1:0", &[]).await;
    let summary = run_client(&["--mode", "legacy", "http", &fixture.url]).await;
    check_common(&summary, 0);
    assert_eq!(summary["protocol"], "2025-11-25");
    assert_eq!(summary["list_changed"], true);
}

#[tokio::test]
async fn python_client_over_http_with_2026_07_28() {
    let fixture = http_fixture("127.0.0.1:0", &[]).await;
    let summary = run_client(&["--mode", "auto", "http", &fixture.url]).await;
    check_common(&summary, 0);
    assert_eq!(summary["protocol"], "2026-07-28");
}
