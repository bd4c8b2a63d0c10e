//! Commands outlive no toolmux killed with `SIGKILL`: the test runs itself as a child
//! process holding the provider, kills it mid-command and looks for what it left in
//! `/proc`.

use crate::Fixture;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Set in the child copy of the test to the folder it writes its process group ids to.
const CHILD_VAR: &str = "TOOLMUX_FS_TEST_ORPHANS_DIR";

/// Process ids of group `pgid` that are alive (not zombies: an orphan's parent in a
/// container may never reap it).
fn live_in_group(pgid: i32) -> Vec<i32> {
    let mut live = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // Fields after the command name (which is in parentheses): state ppid pgrp ...
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2) == Some(&pgid.to_string().as_str()) && !["Z", "X"].contains(&fields[0]) {
            live.push(pid);
        }
    }
    live
}

/// Reads the number `dir/name` holds, waiting up to `limit` for it to be written whole.
fn wait_for_number(dir: &Path, name: &str, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        if let Some(n) = text.strip_suffix('\n').and_then(|t| t.parse().ok()) {
            return n;
        }
        assert!(Instant::now() < deadline, "{name} was not written within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The child's part: a provider running a background task and a foreground command, each
/// writing its process group id, until it is killed.
async fn hold_commands(dir: &Path) {
    let fx = Fixture::new();
    let bg = dir.join("background.pgid");
    let fg = dir.join("foreground.pgid");
    let out = fx
        .call(
            "bash",
            json!({"command": format!("echo $$ > {}.tmp; mv {0}.tmp {0}; sleep 308; true", bg.display()),
                   "run_in_background": true}),
        )
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let out = fx
        .call(
            "bash",
            json!({"command": format!("echo $$ > {}.tmp; mv {0}.tmp {0}; sleep 307; true", fg.display()),
                   "timeout": 600000}),
        )
        .await;
    panic!("the foreground command ended before the test killed its provider: {out:?}");
}

/// The child copy of the test, killed however the test ends (a failed wait included).
struct ChildCopy(std::process::Child);

impl Drop for ChildCopy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A toolmux killed with `SIGKILL` leaves neither a foreground command nor a background
/// task running, nor what they started (the `sleep` under `bash`).
#[test]
fn commands_die_with_a_killed_toolmux() {
    if let Some(dir) = std::env::var_os(CHILD_VAR) {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        runtime.block_on(hold_commands(Path::new(&dir)));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "orphans::commands_die_with_a_killed_toolmux", "--nocapture"])
        .env(CHILD_VAR, dir.path())
        .spawn()
        .unwrap();
    let mut child = ChildCopy(child);
    let background = wait_for_number(dir.path(), "background.pgid", Duration::from_secs(30));
    let foreground = wait_for_number(dir.path(), "foreground.pgid", Duration::from_secs(30));
    assert!(!live_in_group(foreground).is_empty(), "the foreground command is not running");
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = [background, foreground].map(live_in_group);
        if left.iter().all(Vec::is_empty) {
            break;
        }
        if Instant::now() >= deadline {
            for pid in left.iter().flatten() {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(*pid).unwrap(),
                    rustix::process::Signal::KILL,
                );
            }
            panic!(
                "10 s after toolmux was killed, the background task's group {background} still \
                 had {:?} and the foreground command's group {foreground} {:?}",
                left[0], left[1]
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
