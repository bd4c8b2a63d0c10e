//! A stdio server outlives no toolmux killed with `SIGKILL`: the test runs itself as a
//! child process holding the provider, kills it while the server is busy in a call and
//! looks for the server's process group in `/proc`.

use crate::support;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::McpProvider;

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

/// The child copy of the test, killed however the test ends (a failed wait included).
struct ChildCopy(std::process::Child);

impl Drop for ChildCopy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "orphans::a_busy_server_dies_with_a_killed_toolmux", "--nocapture"])
        .env(CHILD_VAR, &pid_file)
        .spawn()
        .unwrap();
    let mut child = ChildCopy(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let server: i32 = loop {
        let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
        if let Some(pid) = text.strip_suffix('\n').and_then(|t| t.parse().ok()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the child copy did not start its server within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let running = || -> Vec<i32> {
        support::group_members(server).into_iter().filter(|&p| support::is_running(p)).collect()
    };
    assert!(!running().is_empty(), "the server is not running");
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    // Well under the 20 s after which the server would read its stdin's end and exit.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = running();
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for pid in left.iter().filter_map(|&p| rustix::process::Pid::from_raw(p)) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            panic!("5 s after toolmux was killed, the server's group {server} still had {left:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
