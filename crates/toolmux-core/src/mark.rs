//! A mark that follows a child process into everything it starts, so that what it leaves
//! running can be found and killed after it, in its process group or out of it.
//!
//! Killing a command's process group misses the processes that left the group: `setsid`,
//! a daemon's double fork, `setpgid`. They keep the environment they were started with, so
//! a command is started with one more variable, [`PROCESS_MARK_VAR`], whose value no other
//! command has; [`ProcessMark::sweep`] reads `/proc/PID/environ` of every process this
//! user may read and kills those that carry the mark. A process started with an
//! environment of its own (`env -i`) does not carry it and is not found.
//!
//! A command run by a toolmux that was itself started under a mark carries both marks
//! (`outer:inner`), so that the outer sweep finds it too.
//!
//! The sweep is Linux only (elsewhere it finds nothing); killing a group, Unix only.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that carries a [`ProcessMark`].
pub const PROCESS_MARK_VAR: &str = "TOOLMUX_PROCESS_MARK";

/// How many times a sweep looks again after killing something: a process may start
/// another between the listing and its death.
const SWEEP_ROUNDS: usize = 16;

/// The mark of one command: given to it in its environment ([`ProcessMark::env`]), it is
/// inherited by whatever the command starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMark {
    /// This command's own part: `PID.NANOS.N`, this process's id, the time it made its
    /// first mark and a counter.
    own: String,
    /// The variable's value: the marks this process was started under, then `own`.
    value: String,
    /// The last process id handed out when the mark was made, and when: every process
    /// carrying the mark got a later one (see [`ProcessMark::sweep`]).
    born: Option<(u32, std::time::Instant)>,
}

impl Default for ProcessMark {
    fn default() -> Self {
        ProcessMark::new()
    }
}

impl ProcessMark {
    /// A mark no other command of this or any other process has.
    pub fn new() -> ProcessMark {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        static STEM: OnceLock<(String, Option<String>)> = OnceLock::new();
        let (stem, outer) = STEM.get_or_init(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let outer = std::env::var(PROCESS_MARK_VAR).ok().filter(|v| !v.is_empty());
            (format!("{}.{nanos}", std::process::id()), outer)
        });
        let own = format!("{stem}.{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let value = match outer {
            Some(outer) => format!("{outer}:{own}"),
            None => own.clone(),
        };
        #[cfg(target_os = "linux")]
        let born = linux::last_pid().map(|last| (last, std::time::Instant::now()));
        #[cfg(not(target_os = "linux"))]
        let born = None;
        ProcessMark { own, value, born }
    }

    /// The variable and value to start the command with.
    pub fn env(&self) -> (&'static str, &str) {
        (PROCESS_MARK_VAR, &self.value)
    }

    /// Whether an environment block (`/proc/PID/environ`: `NAME=value` entries, each
    /// ended by a NUL) carries this mark.
    pub fn is_in(&self, environ: &[u8]) -> bool {
        let prefix = PROCESS_MARK_VAR.as_bytes();
        environ.split(|&b| b == 0).any(|entry| {
            entry.strip_prefix(prefix).and_then(|rest| rest.strip_prefix(b"=")).is_some_and(
                |value| value.split(|&b| b == b':').any(|mark| mark == self.own.as_bytes()),
            )
        })
    }

    /// Kills (`SIGKILL`) every process that carries the mark, but this one; returns their
    /// ids.
    ///
    /// Within a second of the mark's making, only the process ids handed out since are
    /// read (ids are handed out in turn, so every process carrying the mark has one of
    /// them), unless the ids wrapped around meanwhile. Otherwise it blocks for the time it
    /// takes to read the environment of every process this user may read (about 3 ms for
    /// 570 processes).
    pub fn sweep(&self) -> Vec<u32> {
        self.sweep_outside(None)
    }

    /// [`ProcessMark::sweep`], passing over the members of process group `group` (killed
    /// already, and perhaps not gone yet).
    fn sweep_outside(&self, group: Option<i32>) -> Vec<u32> {
        let mut killed = Vec::new();
        #[cfg(target_os = "linux")]
        for _ in 0..SWEEP_ROUNDS {
            let before = killed.len();
            linux::sweep_once(self, group, &mut killed);
            if killed.len() == before {
                break;
            }
        }
        killed
    }

    /// [`ProcessMark::sweep_and_log`] on the blocking pool, for async callers.
    pub async fn sweep_on_pool(&self, what: &str) -> Vec<u32> {
        self.sweep_on_pool_outside(None, what).await
    }

    async fn sweep_on_pool_outside(&self, group: Option<i32>, what: &str) -> Vec<u32> {
        let (mark, label) = (self.clone(), what.to_owned());
        let swept = tokio::task::spawn_blocking(move || mark.log_sweep(group, &label));
        swept.await.unwrap_or_default()
    }

    /// [`ProcessMark::sweep_and_log`] on a thread of its own, for a drop, which must not
    /// block: the processes found are killed shortly after.
    fn sweep_soon_outside(&self, group: Option<i32>, what: &str) {
        let (mark, label) = (self.clone(), what.to_owned());
        let spawned = std::thread::Builder::new()
            .name("toolmux-sweep".into())
            .spawn(move || mark.log_sweep(group, &label));
        if spawned.is_err() {
            // No thread to be had: sweep here rather than leave processes running.
            self.log_sweep(group, what);
        }
    }

    /// [`ProcessMark::sweep`], and a log line when it killed something.
    pub fn sweep_and_log(&self, what: &str) -> Vec<u32> {
        self.log_sweep(None, what)
    }

    fn log_sweep(&self, group: Option<i32>, what: &str) -> Vec<u32> {
        let killed = self.sweep_outside(group);
        if !killed.is_empty() {
            tracing::info!(
                target: "toolmux::process",
                "killed {} process(es) that `{what}` left running outside its process group: {killed:?}",
                killed.len()
            );
        }
        killed
    }
}

/// A child's process group, with the mark its processes carry: killing it kills the
/// group and then what left the group. Dropped before it was disarmed (its call was
/// dropped halfway), it kills both, the second on a thread of its own.
#[derive(Debug)]
pub struct MarkedGroup {
    /// The group's id (its leader's pid).
    group: Option<i32>,
    /// The mark and what to call the command in the log, until the sweep.
    mark: Option<(ProcessMark, String)>,
}

impl MarkedGroup {
    /// The group led by `leader` (a child started with a process group or a session of
    /// its own), whose processes carry `mark`; `label` names the command in the log.
    pub fn new(leader: Option<u32>, mark: ProcessMark, label: impl Into<String>) -> MarkedGroup {
        MarkedGroup {
            group: leader.and_then(|id| i32::try_from(id).ok()).filter(|&id| id > 0),
            mark: Some((mark, label.into())),
        }
    }

    /// Asks the group to stop (`SIGTERM`), so that its programs can clean up (remove a
    /// lock file, flush a log) before [`MarkedGroup::kill_all`].
    pub fn terminate_group(&self) {
        #[cfg(unix)]
        if let Some(pid) = self.group.and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::TERM);
        }
    }

    /// Kills (`SIGKILL`) the group now.
    pub fn kill_group(&self) {
        #[cfg(unix)]
        if let Some(pid) = self.group.and_then(rustix::process::Pid::from_raw) {
            // ESRCH (the group is already gone) is the expected outcome often enough.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }

    /// Kills the group, then (once) every process that carries the mark, on the blocking
    /// pool; returns the ids of those. Best called before the child's pipes are drained:
    /// a process that left the group may hold them.
    pub async fn kill_all(&mut self) -> Vec<u32> {
        self.kill_group();
        let Some((mark, label)) = self.mark.take() else { return Vec::new() };
        mark.sweep_on_pool_outside(self.group, &label).await
    }

    /// Leaves the group alone when dropped (it was killed and the leader reaped: its id
    /// may be given to another group).
    pub fn disarm(&mut self) {
        self.group = None;
    }
}

impl Drop for MarkedGroup {
    fn drop(&mut self) {
        self.kill_group();
        if let Some((mark, label)) = self.mark.take() {
            mark.sweep_soon_outside(self.group, &label);
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use super::ProcessMark;
    use std::io::Read as _;

    /// An environment is read this far at most.
    const CAP: u64 = 1 << 20;
    /// How long after a mark was made the ids handed out since are trusted to hold every
    /// process carrying it: a full turn of the ids (`pid_max`, 32,768 on some systems)
    /// takes far longer.
    const RECENT: std::time::Duration = std::time::Duration::from_secs(1);
    /// More new ids than this, and the whole of `/proc` is read instead.
    const RECENT_IDS: u32 = 4096;

    /// The last process id handed out in this process's namespace.
    pub(super) fn last_pid() -> Option<u32> {
        std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").ok()?.trim().parse().ok()
    }

    /// The ids to look at: those handed out since `mark` was made, when that is recent and
    /// the ids have not wrapped around; `None` for all of `/proc`.
    fn recent_ids(mark: &ProcessMark) -> Option<std::ops::RangeInclusive<u32>> {
        let (then, made) = mark.born?;
        let now = last_pid()?;
        // `/proc` must be this namespace's for its ids to be the ones counted.
        let own = std::fs::read_link("/proc/self").ok()?;
        if own.to_str()?.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
        (made.elapsed() < RECENT && now >= then && now - then <= RECENT_IDS)
            .then(|| then.saturating_add(1)..=now)
    }

    /// Reads `/proc/PID/environ`, up to `cap` bytes, into `buffer`.
    fn environ(pid: u32, buffer: &mut Vec<u8>, cap: u64) -> bool {
        buffer.clear();
        let Ok(file) = std::fs::File::open(format!("/proc/{pid}/environ")) else { return false };
        file.take(cap).read_to_end(buffer).is_ok()
    }

    /// Whether `pid` may be a process between `fork` and the end of its `exec`, whose
    /// environment reads empty for that moment: not a zombie, not a kernel thread (both
    /// read empty for good), and started within the last two seconds (one started with an
    /// empty environment long ago is not waited for).
    fn may_be_starting(pid: u32) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
        // Fields after the command name (in parentheses): state ppid ..., the start time
        // (in clock ticks since boot, 100 a second) 20th of them.
        let Some((_, rest)) = stat.rsplit_once(") ") else { return false };
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        let (state, parent) = (fields.first().copied(), fields.get(1).copied());
        let alive = !matches!(state, None | Some("Z" | "X"));
        let user_space = !matches!(parent, None | Some("0" | "2"));
        let started = fields.get(19).and_then(|t| t.parse::<f64>().ok()).map(|t| t / 100.0);
        let uptime = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|u| u.split_ascii_whitespace().next()?.parse::<f64>().ok());
        let recent = match (started, uptime) {
            (Some(started), Some(uptime)) => uptime - started < 2.0,
            _ => true,
        };
        alive && user_space && recent
    }

    /// One pass over `/proc`: every process that carries `mark` and is not in `killed`
    /// yet is killed and added to it. Processes whose environment read empty while they
    /// may have been starting are read again a moment later.
    pub(super) fn sweep_once(mark: &ProcessMark, group: Option<i32>, killed: &mut Vec<u32>) {
        /// How long a starting process is given to finish its `exec`, at first: doubled
        /// while one still reads empty, up to 6 times (about 130 ms in all; on a loaded
        /// machine an `exec` took longer than the 2 ms once given, and the process escaped).
        const EXEC_GRACE: std::time::Duration = std::time::Duration::from_millis(2);
        let me = std::process::id();
        let ids: Box<dyn Iterator<Item = u32>> = match recent_ids(mark) {
            Some(ids) => Box::new(ids),
            None => {
                let Ok(entries) = std::fs::read_dir("/proc") else { return };
                Box::new(entries.flatten().filter_map(|entry| {
                    entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok())
                }))
            }
        };
        let mut buffer = Vec::with_capacity(8 * 1024);
        let mut starting = Vec::new();
        for pid in ids {
            if pid == me || killed.contains(&pid) || !environ(pid, &mut buffer, CAP) {
                continue;
            }
            if buffer.is_empty() && may_be_starting(pid) {
                starting.push(pid);
            } else if mark.is_in(&buffer) {
                kill(mark, pid, group, &mut buffer, killed);
            }
        }
        let mut grace = EXEC_GRACE;
        for _ in 0..6 {
            if starting.is_empty() {
                return;
            }
            std::thread::sleep(grace);
            grace *= 2;
            starting.retain(|&pid| {
                if !environ(pid, &mut buffer, CAP) {
                    return false;
                }
                if mark.is_in(&buffer) {
                    kill(mark, pid, group, &mut buffer, killed);
                    return false;
                }
                // Still empty: still starting, or a process that reads empty for good.
                buffer.is_empty() && may_be_starting(pid)
            });
        }
    }

    /// Kills `pid`, found to carry `mark`, unless it is a member of `group` (killed
    /// already) or is no longer the process that was read.
    fn kill(
        mark: &ProcessMark,
        pid: u32,
        group: Option<i32>,
        buffer: &mut Vec<u8>,
        killed: &mut Vec<u32>,
    ) {
        let Some(id) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else {
            return;
        };
        if group.is_some()
            && rustix::process::getpgid(Some(id)).ok().map(|g| g.as_raw_nonzero().get()) == group
        {
            return;
        }
        // Held by a pidfd from here, the process cannot be confused with a later one given
        // the same id: its environment is read again through the id, and a signal to a
        // process that has ended fails.
        match rustix::process::pidfd_open(id, rustix::process::PidfdFlags::empty()) {
            Ok(pidfd) => {
                if environ(pid, buffer, CAP)
                    && mark.is_in(buffer)
                    && rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL)
                        .is_ok()
                {
                    killed.push(pid);
                }
            }
            // A kernel before 5.3: no pidfd, the id is all there is.
            Err(rustix::io::Errno::NOSYS) => {
                if rustix::process::kill_process(id, rustix::process::Signal::KILL).is_ok() {
                    killed.push(pid);
                }
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_differ_and_are_found_among_others() {
        let a = ProcessMark::new();
        let b = ProcessMark::new();
        assert_ne!(a, b);
        let (name, value) = a.env();
        assert_eq!(name, PROCESS_MARK_VAR);
        let environ = format!("PATH=/bin\0{name}={value}\0HOME=/root\0");
        assert!(a.is_in(environ.as_bytes()));
        assert!(!b.is_in(environ.as_bytes()));
        // An outer mark before it, and a mark that only starts like it.
        let nested = format!("{name}=1.2.3:{value}\0");
        assert!(a.is_in(nested.as_bytes()));
        let longer = format!("{name}={value}0\0");
        assert!(!a.is_in(longer.as_bytes()));
        // The value under another name is not the mark.
        let other = format!("X{name}={value}\0");
        assert!(!a.is_in(other.as_bytes()));
    }
}
