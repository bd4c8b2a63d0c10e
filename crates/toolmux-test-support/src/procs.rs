//! Processes a test must see gone: the live members of a process group, and a child copy
//! of the running test binary, killed with `SIGKILL` as a crashed toolmux would be.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
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
/// ends, a failed wait included. Its temporary folder (`TMPDIR`) is a folder of its own,
/// removed with everything in it once the copy is reaped: a copy killed with `SIGKILL`
/// removes nothing it made there (its fixture's folder, its commands' output files).
#[derive(Debug)]
pub struct ChildCopy {
    child: Child,
    /// Invariant: removed only after `child` is reaped, when nothing writes to it any more.
    temporary: PathBuf,
}

impl ChildCopy {
    /// Starts the copy.
    pub fn spawn(test: &str, var: &str, value: impl AsRef<OsStr>) -> ChildCopy {
        static COPIES: AtomicUsize = AtomicUsize::new(0);
        let temporary = std::env::temp_dir().join(format!(
            "toolmux-child-copy-{}-{}",
            std::process::id(),
            COPIES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&temporary).unwrap_or_else(|e| {
            panic!(
                "cannot make the temporary folder `{}` of a child copy: {e}",
                temporary.display()
            )
        });
        let exe = std::env::current_exe().expect("the test binary's path");
        let spawned = Command::new(exe)
            .args(["--exact", test, "--nocapture"])
            .env(var, value)
            .env("TMPDIR", &temporary)
            .spawn();
        match spawned {
            Ok(child) => ChildCopy { child, temporary },
            Err(e) => {
                let _ = std::fs::remove_dir_all(&temporary);
                panic!("cannot start a copy of the test binary for {test}: {e}")
            }
        }
    }

    /// The copy's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The copy's temporary folder (its `TMPDIR`), removed when the copy is dropped.
    pub fn temporary(&self) -> &Path {
        &self.temporary
    }

    /// Kills the copy with `SIGKILL` and reaps it.
    pub fn kill(&mut self) {
        self.child.kill().expect("the child copy can be killed");
        self.child.wait().expect("the child copy can be reaped");
    }
}

impl Drop for ChildCopy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        // Not reaped, the copy may still write: its folder is then left rather than raced.
        if self.child.wait().is_ok() {
            let _ = std::fs::remove_dir_all(&self.temporary);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child copy of the next test.
    const CHILD_VAR: &str = "TOOLMUX_TEST_SUPPORT_CHILD_COPY";

    /// A child copy killed with `SIGKILL` leaves nothing in the temporary folder: what it
    /// made there goes with the folder of its own it was given as `TMPDIR`. The fixture
    /// folder of each killed copy was left behind before.
    #[test]
    fn a_killed_child_copy_leaves_no_temporary_files() {
        if std::env::var_os(CHILD_VAR).is_some() {
            let made = std::env::temp_dir().join("made-by-the-copy");
            std::fs::create_dir(&made).expect("a folder in the copy's temporary folder");
            std::fs::write(made.join("pid.tmp"), format!("{}\n", std::process::id()))
                .expect("a file in it");
            std::fs::rename(made.join("pid.tmp"), made.join("pid")).expect("the file renamed");
            std::thread::sleep(Duration::from_secs(300));
            return;
        }
        let mut child = ChildCopy::spawn(
            "procs::tests::a_killed_child_copy_leaves_no_temporary_files",
            CHILD_VAR,
            "1",
        );
        let temporary = child.temporary().to_owned();
        let pid = wait_for_number(&temporary.join("made-by-the-copy/pid"), Duration::from_secs(30));
        assert_eq!(u32::try_from(pid).ok(), Some(child.id()));
        child.kill();
        drop(child);
        assert!(!temporary.exists(), "{} is left", temporary.display());
    }
}
