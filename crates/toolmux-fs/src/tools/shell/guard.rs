//! A watchman for each command's process group, so that no command outlives a toolmux
//! killed with `SIGKILL` (or crashed, or aborted), when none of its own code runs.
//!
//! The watchman is a tiny `sh` started beside the command, in a process group of its own
//! (no terminal signal reaches it), reading a pipe only toolmux holds: toolmux writes a
//! line to release it once it has dealt with the group itself, and end of file without
//! that line means toolmux is gone, so the watchman kills the whole group.
//!
//! `PR_SET_PDEATHSIG` on the command would not do: it fires when the *thread* that
//! spawned the command exits (a tokio blocking-pool thread retires after ten idle
//! seconds, which would kill commands spuriously), and it signals the one process, not
//! its group, so the `sleep` under `bash -c` would live on.

use std::io::Write as _;
use std::process::Stdio;

/// The watchman's script; `$1` is the group. `read` answers non-zero at end of file
/// without a line.
const SCRIPT: &str = "trap '' HUP INT QUIT TERM TSTP; read -r _ || kill -s KILL -- \"-$1\"";

/// The watchman of one process group; dropping it releases the watchman, which then
/// exits without killing anything.
#[derive(Debug)]
pub(crate) struct GroupGuard {
    /// Invariant: only this process holds the pipe's writing end (it is close-on-exec), so
    /// the watchman reads end of file exactly when toolmux is gone or the guard dropped.
    release: Option<std::io::PipeWriter>,
    /// Reaped by tokio once dropped (it is not killed on drop).
    _watchman: tokio::process::Child,
}

impl GroupGuard {
    /// Starts the watchman of the group led by `leader`. Without one (no `/bin/sh`, no
    /// processes left to start) the command runs all the same, unwatched, and the log
    /// says so: toolmux still kills the group on every way out but `SIGKILL`.
    pub(crate) fn watch(leader: Option<u32>, label: &str) -> Option<GroupGuard> {
        let leader = leader.filter(|&pid| pid > 0 && i32::try_from(pid).is_ok())?;
        match Self::start(leader) {
            Ok(guard) => Some(guard),
            Err(e) => {
                tracing::warn!(
                    command = %label,
                    error = %e,
                    "could not start /bin/sh to watch the command's process group: the command \
                     would outlive toolmux if toolmux were killed with SIGKILL"
                );
                None
            }
        }
    }

    fn start(leader: u32) -> std::io::Result<GroupGuard> {
        let (read, release) = std::io::pipe()?;
        let watchman = tokio::process::Command::new("/bin/sh")
            .args(["-c", SCRIPT, "toolmux-group-guard", &leader.to_string()])
            .current_dir("/")
            .env_clear()
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(false)
            .spawn()?;
        Ok(GroupGuard { release: Some(release), _watchman: watchman })
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(mut release) = self.release.take() {
            // One byte into an empty pipe does not block; a watchman already gone (killed
            // by someone) makes this fail, which is nothing to act on.
            let _ = release.write_all(b"\n");
        }
    }
}
