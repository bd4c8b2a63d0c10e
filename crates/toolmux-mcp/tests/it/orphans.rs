//! A stdio server outlives no toolmux killed with `SIGKILL`: the test runs itself as a
//! child process holding the provider, kills it while the server is busy in a call and
//! looks for the server's process group in `/proc`.

use crate::support;
use serde_json::json;
use std::path::Path;
use std::time::Duration;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::McpProvider;
use toolmux_test_support::procs::{ChildCopy, assert_groups_die, live_in_group, wait_for_number};

/// Set in the child copy of the test to the file it writes the server's process id to.
const CHILD_VAR: &str = "TOOLMUX_MCP_TEST_ORPHANS_PID_FILE";

/// The child's part: a provider whose server is busy in `deaf` (which reads nothing for
/// 20 s, so the end of its stdin cannot stop it sooner), until the test kills it.
async fn hold_a_busy_server(pid_file: &Path) {
    let provider = McpProvider::new("fixture", support::fixture_stdio("ok")).unwrap();
    let out = provider.call("echo", json!({"message": "up"}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "echo: up");
    let pid = provider.server_pid().expect("the server runs");
    let call = tokio::spawn(async move {
        provider.call("deaf", json!({}), &CallContext::new()).await.map(|out| out.to_text())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let tmp = pid_file.with_extension("tmp");
    std::fs::write(&tmp, format!("{pid}\n")).unwrap();
    std::fs::rename(&tmp, pid_file).unwrap();
    let out = call.await;
    panic!("the call ended before the test killed its provider: {out:?}");
}

/// A toolmux killed with `SIGKILL` while its stdio server is busy in a call leaves no
/// process of the server's group running: the watchman it shares with the shell tools
/// kills the group, where the server ran on, reparented to PID 1, until it next read its
/// stdin.
#[test]
fn a_busy_server_dies_with_a_killed_toolmux() {
    if let Some(file) = std::env::var_os(CHILD_VAR) {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        runtime.block_on(hold_a_busy_server(Path::new(&file)));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("server.pid");
    let mut child =
        ChildCopy::spawn("orphans::a_busy_server_dies_with_a_killed_toolmux", CHILD_VAR, &pid_file);
    let server = wait_for_number(&pid_file, Duration::from_secs(30));
    assert!(!live_in_group(server).is_empty(), "the server is not running");
    child.kill();
    // Well under the 20 s after which the server would read its stdin's end and exit.
    assert_groups_die(&[server], Duration::from_secs(5), "toolmux was killed");
}
