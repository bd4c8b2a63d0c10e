//! One watchman for every child process group toolmux starts (a shell command, a command
//! tool, a stdio MCP server), so that none outlives a toolmux killed with `SIGKILL` (or
//! crashed, or aborted), when none of its own code runs.
//!
//! The watchman is a tiny `sh`, one per toolmux process whatever crates start groups,
//! started at the first group, in a process group of its own (no terminal signal reaches
//! it), reading a pipe only toolmux holds. toolmux writes `+PGID` when a group starts and
//! `-PGID` once it has dealt with the group itself; end of file means toolmux is gone, and
//! the watchman kills every group still listed. One `sh` per group cost a spawn each (and a
//! shell command about 128 ms more, BENCHMARKS-fs.md); a line costs a write.
//!
//! `PR_SET_PDEATHSIG` on the child would not do: it fires when the *thread* that
//! spawned the child exits (a tokio blocking-pool thread retires after ten idle
//! seconds, which would kill children spuriously), and it signals the one process, not
//! its group, so the `sleep` under `bash -c` would live on.
//!
//! A group's id is its leader's process id, and the leader is our child: the id cannot be
//! given to another process until we reap the leader. So a group is released (`-PGID`)
//! after toolmux has killed it and before the leader is reaped ([`LeaderExit`] waits for
//! the leader's exit without reaping it); the watchman therefore never holds the id of a
//! group that could be someone else's.
//!
//! A stdio MCP server (toolmux-mcp) is the one exception: its exit status must be read as
//! it always was (the reaper waits on the leader and reaps it, and a daemon holding its
//! stdout must not delay that), so its group is released just after the reap and the
//! group kill that follows it. Between the reap and the release the id could, in
//! principle, be given to a new process group; the watchman would kill that group only if
//! toolmux died in that same instant. The group kill after the reap had the same window.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard};

/// The watchman's script. Lines are `+PGID` and `-PGID`, ids above 1 (anything else is
/// ignored: `kill -- -1` would signal every process). `read` answers non-zero at end of
/// file.
const SCRIPT: &str = r#"trap '' HUP INT QUIT TERM TSTP PIPE
g=' '
while read -r l; do
  i=${l#?}
  case $i in ''|*[!0-9]*|0|1) continue ;; esac
  case $l in
    +*) g="$g$i " ;;
    -*) case $g in *" $i "*) g="${g%% $i *} ${g#* $i }" ;; esac ;;
  esac
done
set --
for p in $g; do set -- "$@" "-$p"; done
[ $# -eq 0 ] || kill -s KILL -- "$@""#;

/// The name the watchman runs under (its `$0`), which `ps` shows.
pub const WATCHMAN_NAME: &str = "toolmux-group-guard";

/// The one variable in the watchman's environment.
const GUARD_VAR: &str = "TOOLMUX_GROUP_GUARD";

/// The groups being watched and the watchman watching them, for the whole process.
static WATCH: Mutex<Watch> = Mutex::new(Watch { watchman: None, groups: BTreeSet::new() });

/// A process group listed with the watchman; dropping it releases the group (`-PGID`).
/// Drop it once the group is dead and, where the caller can, before its leader is reaped
/// (see the module's note on stdio MCP servers for the one caller that cannot).
#[derive(Debug)]
pub struct GroupGuard {
    /// Invariant: above 1, and listed in [`WATCH`]'s `groups` while this guard lives.
    group: i32,
}

#[derive(Debug)]
struct Watch {
    /// `None` until the first group, and after a watchman was found gone while no group
    /// was left to watch.
    watchman: Option<Watchman>,
    /// Every group whose guard lives: what a new watchman is told.
    groups: BTreeSet<i32>,
}

#[derive(Debug)]
struct Watchman {
    /// Invariant: only this process holds the pipe's writing end (it is close-on-exec, so
    /// no child inherits it), so the watchman reads end of file exactly when toolmux is
    /// gone. Non-blocking: a watchman that stops reading (stopped with `SIGSTOP`) is
    /// replaced rather than blocking every child's start once the pipe is full.
    lines: std::io::PipeWriter,
    process: std::process::Child,
}

impl GroupGuard {
    /// Lists the group led by `leader` (a child started with a process group of its own)
    /// with the watchman, starting one if there is none or the last one is gone; `label`
    /// names the child in the log. Without a watchman (no `/bin/sh`, no processes left to
    /// start) the child runs all the same, unwatched until a later group starts one, and
    /// the log says so: toolmux still kills the group on every way out but `SIGKILL`.
    pub fn watch(leader: Option<u32>, label: &str) -> Option<GroupGuard> {
        let group = leader.and_then(|pid| i32::try_from(pid).ok()).filter(|&pid| pid > 1)?;
        let mut watch = lock();
        watch.groups.insert(group);
        if let Err(e) = watch.send(&format!("+{group}\n")) {
            tracing::warn!(
                child = %label,
                error = %e,
                "could not start /bin/sh to watch the process group: the child would outlive \
                 toolmux if toolmux were killed with SIGKILL"
            );
        }
        Some(GroupGuard { group })
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let mut watch = lock();
        watch.groups.remove(&self.group);
        if let Err(e) = watch.send(&format!("-{}\n", self.group)) {
            tracing::warn!(error = %e, "could not start /bin/sh to watch the process groups");
        }
    }
}

fn lock() -> MutexGuard<'static, Watch> {
    // The state is a set and a handle, each change a single step: still sound after a panic.
    WATCH.lock().unwrap_or_else(|e| e.into_inner())
}

impl Watch {
    /// Writes `line` to the watchman; one found gone (the write fails with `EPIPE`: Rust's
    /// runtime ignores `SIGPIPE`) or not reading is replaced by a new one told every group
    /// still listed, which `line` has already been applied to. With no group left, none
    /// is started.
    fn send(&mut self, line: &str) -> std::io::Result<()> {
        if let Some(watchman) = &mut self.watchman {
            match watchman.lines.write_all(line.as_bytes()) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(error = %e, "the process groups' watchman is gone; starting another");
                    if let Some(old) = self.watchman.take() {
                        old.retire();
                    }
                }
            }
        }
        if self.groups.is_empty() {
            return Ok(());
        }
        let mut watchman = Watchman::start()?;
        let all: String = self.groups.iter().map(|g| format!("+{g}\n")).collect();
        // An empty pipe holds 64 KiB: some 8,000 groups at once.
        if let Err(e) = watchman.lines.write_all(all.as_bytes()) {
            watchman.retire();
            return Err(e);
        }
        self.watchman = Some(watchman);
        Ok(())
    }
}

impl Watchman {
    fn start() -> std::io::Result<Watchman> {
        let (read, lines) = std::io::pipe()?;
        let fd = OwnedFd::from(lines);
        let flags = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        let lines = std::io::PipeWriter::from(fd);
        let process = std::process::Command::new("/bin/sh")
            .args(["-c", SCRIPT, WATCHMAN_NAME])
            .current_dir("/")
            .env_clear()
            // Not empty: a sweep for marked processes (`crate::mark`) takes a young process
            // whose environment reads empty for one between `fork` and `exec` and waits on it
            // (about 130 ms a round), which delayed every reap in the watchman's first 2 s.
            .env(GUARD_VAR, "1")
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(Watchman { lines, process })
    }

    /// Ends a watchman that cannot be written to, without it killing anything (`SIGKILL`
    /// runs no script), and reaps it.
    fn retire(mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Waits for a group's leader to exit without reaping it (through a pidfd), so that its
/// group's id stays ours until [`GroupGuard`] has released it. Without a pidfd (a kernel
/// before 5.3) it falls back to `wait`, which reaps.
#[derive(Debug)]
pub struct LeaderExit {
    pidfd: Option<tokio::io::unix::AsyncFd<OwnedFd>>,
}

impl LeaderExit {
    /// For `child`, not yet reaped.
    // Tokio's registration of a descriptor is `unsafe` (it cannot check that the descriptor
    // stays open); an `OwnedFd` it owns does.
    #[allow(unsafe_code)]
    pub fn of(child: &tokio::process::Child) -> LeaderExit {
        let pidfd = child
            .id()
            .and_then(|pid| rustix::process::Pid::from_raw(i32::try_from(pid).ok()?))
            .and_then(|pid| {
                rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
            })
            .filter(|_| tokio::runtime::Handle::try_current().is_ok())
            .and_then(|fd| {
                // SAFETY: an `OwnedFd` is open and the same descriptor for as long as the
                // `AsyncFd` owns it; a runtime is current, so registering does not panic.
                unsafe {
                    tokio::io::unix::AsyncFd::register_with_interest(
                        fd,
                        tokio::io::Interest::READABLE,
                    )
                }
                .ok()
            });
        LeaderExit { pidfd }
    }

    /// Answers once the leader has exited; cancel-safe.
    pub async fn exited(&self, child: &mut tokio::process::Child) -> std::io::Result<()> {
        match &self.pidfd {
            // Readable from the exit on (the readiness is never cleared).
            Some(pidfd) => pidfd.readable().await.map(drop),
            None => child.wait().await.map(drop),
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A sweep for marked processes waits on a young process whose environment reads
    /// empty; the watchman's must not read empty once it runs.
    #[test]
    fn the_watchman_environment_is_not_empty() {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "read -r _"])
            .stdin(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("spawn sh");
        let guard = GroupGuard::watch(Some(child.id()), "test").expect("a group above 1");
        let watchman = lock().watchman.as_ref().map(|w| w.process.id()).expect("a watchman");
        // `spawn` returns once the child has left our memory, a moment before the kernel
        // has laid out the new program's environment: until then it reads empty. Read
        // until it does not, for 5 s at most (an environment left empty reads so for good).
        let read = || std::fs::read(format!("/proc/{watchman}/environ")).expect("its environ");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut environ = read();
        while environ.is_empty() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
            environ = read();
        }
        drop(child.stdin.take());
        let _ = child.wait();
        drop(guard);
        assert_eq!(environ, format!("{GUARD_VAR}=1\0").into_bytes());
    }
}
