//! Processes a test must see gone: the live members of a process group, and a child copy
//! of the running test binary, killed with `SIGKILL` as a crashed toolmux would be.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Process ids whose process group is `pgid` and that are alive: not zombies, as an
/// orphan's new parent in a container (PID 1) may never reap it.
pub fn live_in_group(pgid: i32) -> Vec<i32> {
    let mut live = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return live };
    let pgid = pgid.to_string();
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Fields after the command name (which is in parentheses): state ppid pgrp ...
        let Some((_, rest)) = stat.rsplit_once(") ") else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2) == Some(&pgid.as_str()) && !matches!(fields[0], "Z" | "X") {
            live.push(pid);
        }
    }
    live
}

/// The number the file at `path` holds, waiting up to `limit` for it to be written whole
/// (a number and a newline; writers write another file and rename it).
pub fn wait_for_number(path: &Path, limit: Duration) -> i32 {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(n) = text.strip_suffix('\n').and_then(|t| t.parse().ok()) {
            return n;
        }
        assert!(Instant::now() < deadline, "{} was not written within {limit:?}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A copy of the running test binary running one test (`test`, its full path) with `var`
/// set to `value`, in which the test plays toolmux; killed and reaped however the test
/// ends, a failed wait included.
#[derive(Debug)]
pub struct ChildCopy(Child);

impl ChildCopy {
    /// Starts the copy.
    pub fn spawn(test: &str, var: &str, value: impl AsRef<OsStr>) -> ChildCopy {
        let exe = std::env::current_exe().expect("the test binary's path");
        let child = Command::new(exe)
            .args(["--exact", test, "--nocapture"])
            .env(var, value)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start a copy of the test binary for {test}: {e}"));
        ChildCopy(child)
    }

    /// The copy's process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Kills the copy with `SIGKILL` and reaps it.
    pub fn kill(&mut self) {
        self.0.kill().expect("the child copy can be killed");
        self.0.wait().expect("the child copy can be reaped");
    }
}

impl Drop for ChildCopy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `limit` for every process of `groups` to be gone; kills what is left and
/// fails the test, saying what `after` (`toolmux was killed`) left, if some are not.
pub fn assert_groups_die(groups: &[i32], limit: Duration, after: &str) {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<Vec<i32>> = groups.iter().map(|&g| live_in_group(g)).collect();
        if left.iter().all(Vec::is_empty) {
            return;
        }
        if Instant::now() >= deadline {
            for pid in left.iter().flatten().filter_map(|&p| rustix::process::Pid::from_raw(p)) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            panic!("{limit:?} after {after}, the process groups {groups:?} still had {left:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
