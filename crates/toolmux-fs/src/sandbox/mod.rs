//! The OS sandbox of `bash` and `exec` (background tasks included): which policy the
//! configuration asks for, whether this kernel can enforce it, and the Landlock ruleset
//! each spawned command is restricted by before it executes.
//!
//! The file tools are confined in process; a command is not, since it can reach any path
//! in ways no parser sees. So the kernel confines it: the parent builds a Landlock ruleset
//! (read everything, write only the allowed roots, optionally no TCP, and from ABI 6 no
//! signal to, nor abstract Unix socket of, a process outside the sandbox) and the child,
//! between fork and exec, sets `no_new_privs` and restricts itself with it.
//!
//! Landlock is an allow-list over whole hierarchies: a writable root is writable all the
//! way down. So `.git` and the embedding program's protected paths beneath a writable root
//! are bind-mounted read-only in a user and mount namespace of the command's own
//! (`mounts.rs`), where the kernel allows unprivileged user namespaces.
//!
//! Landlock's network rights cover TCP only, so `network: false` adds a seccomp filter
//! (`seccomp.rs`) that lets a command create Unix sockets and no other: no UDP, no DNS, no
//! ICMP. Where Landlock is missing but seccomp is not, that filter alone still denies the
//! network.

mod globs;
#[cfg(target_os = "linux")]
mod landlock;
#[cfg(not(target_os = "linux"))]
#[path = "unsupported.rs"]
mod landlock;
#[cfg(target_os = "linux")]
mod mounts;
#[cfg(not(target_os = "linux"))]
#[path = "no_mounts.rs"]
mod mounts;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_endian = "little"
))]
mod seccomp;
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64"),
    target_endian = "little"
)))]
#[path = "no_seccomp.rs"]
mod seccomp;

use crate::config::{SandboxConfig, SandboxMode};
use crate::error::FsError;
use std::path::{Path, PathBuf};

/// The Landlock ABI (Linux 6.2) from which truncation is confined; an explicit mode needs
/// it, since below it `truncate(2)` could empty any file the user can write.
const ABI_TRUNCATE: u32 = 3;

/// The Landlock ABI (Linux 6.7) from which TCP bind and connect can be denied.
const ABI_NETWORK: u32 = 4;

/// The Landlock ABI (Linux 6.12) from which signals and abstract Unix sockets can be kept
/// to the sandbox's own processes.
const ABI_SCOPES: u32 = 6;

/// Devices every sandboxed command may write (and truncate, `> /dev/null` opens with
/// `O_TRUNC`): the sinks and sources scripts redirect to. `/dev/tty` is left out on
/// purpose: stdin is closed so no prompt could be answered, and a writable terminal of
/// the server's would let a command inject input into it.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// [`DEVICES`] and `/dev/tty`, for a command on a terminal of its own (`tty`): it leads a
/// session whose controlling terminal is toolmux's pseudo-terminal, so `/dev/tty` is that
/// terminal, not the server's, and a program asking for a password there must reach it.
const DEVICES_ON_A_TERMINAL: &[&str] =
    &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"];

/// The temporary directories `workspaceWrite` lets commands write, besides `$TMPDIR`.
/// The spill directory (`bash.spillDir`) is not made writable: toolmux writes the spill
/// files from the pipes, the command never does, and a command able to rewrite them could
/// forge the "full output" the model is pointed to; where it lies beneath a writable root
/// anyway (the default one is in `/tmp`) it is a read-only view ([`Sandbox::with_spill_dir`]).
const TEMPORARY: &[&str] = &["/tmp", "/dev/shm"];

/// The sandbox of one provider's commands.
#[derive(Debug)]
pub(crate) struct Sandbox {
    plan: Plan,
    /// The sentence the tool descriptions carry, so that a model knows why a write
    /// outside fails with "Permission denied".
    description: String,
    /// The user's `protect` and `hide` lines, where views can keep what they match.
    globs: Option<globs::UserGlobs>,
    /// What they matched, and when it was found.
    matched: std::sync::Mutex<(Option<std::time::Instant>, std::sync::Arc<globs::Matched>)>,
    /// Held while the lines' matches are looked for.
    walking: tokio::sync::Mutex<()>,
    /// What the walks for repositories beneath the root learnt, shared by its commands.
    repository_walks: std::sync::Arc<RepositoryWalks>,
    /// The checks of the background tasks that run (those gone are dropped when next
    /// looked at): see [`Sandbox::command_ended`].
    task_checks: TaskChecks,
    /// The spill directory kept read-only to commands (see [`Sandbox::with_spill_dir`]),
    /// with the `bash.spillDir` setting that named it: made again before a command starts
    /// where something removed it (a cleaner of `/tmp`), as a spill would make it, since a
    /// view covers only what exists and a command could otherwise make it first.
    spill_dir: Option<(Option<PathBuf>, PathBuf)>,
}

/// How long what the user's lines matched is used again before the root is walked anew:
/// commands in quick succession (a script of calls) share one walk, while a command after
/// a model's turn of thought, when a walk costs nothing noticeable, gets a fresh one.
const USER_PATHS_FRESH: std::time::Duration = std::time::Duration::from_secs(2);

/// What happens to each command.
#[derive(Debug)]
enum Plan {
    /// Unconfined.
    Off,
    /// The configuration asks for more than this kernel can enforce: every command is
    /// refused with this reason.
    Refused(String),
    /// Restricted by a Landlock ruleset built for each command.
    Enforce(Policy),
}

/// What a confined command may do.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    /// The running kernel's Landlock ABI: only rights it knows are asked for.
    pub(crate) abi: u32,
    /// The roots writable beneath (devices aside); `None` when the filesystem is not
    /// confined at all (mode `off` with `network: false`).
    pub(crate) writable: Option<Vec<PathBuf>>,
    /// The devices writable as files.
    pub(crate) devices: &'static [&'static str],
    /// Whether TCP bind and connect are denied (Landlock).
    pub(crate) deny_tcp: bool,
    /// Whether every socket but a Unix one is refused (seccomp).
    pub(crate) deny_sockets: bool,
    /// Paths beneath the writable roots made read-only (those that exist when a command
    /// starts): `.git` and the protected paths.
    pub(crate) read_only: Vec<PathBuf>,
    /// Paths hidden from commands: those the file tools may not read.
    pub(crate) hidden: Vec<PathBuf>,
    /// Those of them to make where missing before a command starts ([`ServerPath::folder`]).
    pub(crate) folders: Vec<PathBuf>,
    /// The embedding program's files beneath a writable root that a command must not
    /// create where they are missing (no mount can keep a missing path), with the root
    /// they are shown relative to: see [`Sandbox::absent`].
    pub(crate) watched: Vec<PathBuf>,
    pub(crate) root: PathBuf,
    /// The Landlock scopes (ABI 6): signals and abstract Unix sockets kept to the
    /// command's own processes; none when the filesystem is not confined (mode `off`).
    pub(crate) scoped: u64,
    /// Whether the pathname Unix sockets bound when a command starts are covered in its
    /// mount namespace (`network: false`, where views can be made and Landlock keeps the
    /// command from unmounting them): it reaches no server it did not start.
    pub(crate) hide_sockets: bool,
    /// Whether views may be made at all (`protectPaths`, and the filesystem confined).
    pub(crate) protect_paths: bool,
}

/// A path of the embedding program's that commands must leave alone.
#[derive(Debug, Clone)]
pub(crate) struct ServerPath {
    /// Absolute, symlinks resolved.
    pub(crate) path: PathBuf,
    /// Not to be read either (the file tools may not): hidden, not only read-only.
    pub(crate) hidden: bool,
    /// A hidden folder toolmux makes only when it first writes there (the output
    /// directory): made (mode 0700) before a command starts where it is
    /// missing, so that it is covered from the first command on, and no command can put a
    /// folder or a symlink of its own there first for toolmux to write into.
    pub(crate) folder: bool,
}

impl Sandbox {
    fn with(plan: Plan, description: String) -> Sandbox {
        Sandbox {
            plan,
            description,
            globs: None,
            matched: Default::default(),
            walking: tokio::sync::Mutex::new(()),
            repository_walks: Default::default(),
            task_checks: Default::default(),
            spill_dir: None,
        }
    }

    /// Keeps what the user's `protect` lines match read-only to commands and what its
    /// `hide` lines match hidden from them, as the file tools do, where this sandbox makes
    /// views (`protectPaths`, user namespaces): found before each command starts
    /// ([`Sandbox::find_user_paths`]).
    pub(crate) fn with_user_globs(
        mut self,
        root: &Path,
        protect: std::sync::Arc<ignore::gitignore::Gitignore>,
        hide: std::sync::Arc<ignore::gitignore::Gitignore>,
    ) -> Sandbox {
        let Plan::Enforce(policy) = &self.plan else { return self };
        let globs = globs::UserGlobs::new(root, protect, hide);
        if globs.is_empty() || !policy.protect_paths {
            return self;
        }
        // Views may have been made already for toolmux's own paths; if none were wanted,
        // the kernel is asked now.
        let views = !policy.read_only.is_empty() || !policy.hidden.is_empty();
        if !views && let Err(why) = mounts::available() {
            tracing::warn!(
                "commands of `bash` and `exec` are not kept from what the `protect` and `hide` \
                 settings name: {why}; set `fs.bash.sandbox.protectPaths: false` to say that \
                 is intended"
            );
            return self;
        }
        if !globs.protect.is_empty() {
            self.description
                .push_str(" What the `protect` settings name is read-only to it, as `.git` is.");
        }
        if !globs.hide.is_empty() {
            self.description.push_str(" What the `hide` settings name is not there for it.");
        }
        self.globs = Some(globs);
        self
    }

    /// Keeps the spill directory `dir` (absolute, symlinks resolved), where toolmux writes
    /// full outputs and background tasks' logs, read-only to commands where it lies
    /// beneath a writable root (the default one is in `/tmp`) and views can be made: a
    /// command that could write it could rewrite the "full output" the model is pointed
    /// to, or rename the folder and put another in its place. A view covers what exists
    /// when a command starts: the directory is made before ([`crate::tools::spill::directory`]
    /// with `configured`, the `bash.spillDir` setting), and again before each command
    /// where it has gone since. A spill directory kept before is no longer kept.
    pub(crate) fn with_spill_dir(mut self, configured: Option<PathBuf>, dir: PathBuf) -> Sandbox {
        let Plan::Enforce(policy) = &mut self.plan else { return self };
        // Only a spill directory is kept here that was not in the read-only set already,
        // so taking it out leaves the server's own paths as they were.
        if let Some((_, before)) = self.spill_dir.take() {
            policy.read_only.retain(|path| *path != before);
        }
        let roots = policy.writable.as_deref().unwrap_or_default();
        if !policy.protect_paths
            || !roots.iter().any(|r| dir.starts_with(r))
            || policy.read_only.contains(&dir)
        {
            return self;
        }
        // Views may have been made already for toolmux's own paths; if none were wanted,
        // the kernel is asked now.
        let views = !policy.read_only.is_empty() || !policy.hidden.is_empty();
        if !views && let Err(why) = mounts::available() {
            tracing::debug!("the spill directory stays writable to commands: {why}");
            return self;
        }
        policy.read_only.push(dir.clone());
        self.spill_dir = Some((configured, dir));
        self
    }

    /// Finds what the user's `protect` and `hide` lines match now (on the blocking pool),
    /// for the views of the next command, unless it was found less than
    /// [`USER_PATHS_FRESH`] ago: call before [`Sandbox::confine`]. Commands starting at
    /// once share one walk. Refused, saying why, when the lines cannot be kept for
    /// commands (too large a workspace, too many matches).
    pub(crate) async fn find_user_paths(&self, command: &str) -> Result<(), FsError> {
        let Some(globs) = self.globs.clone() else { return Ok(()) };
        let _walking = self.walking.lock().await;
        let found_at = self.matched.lock().unwrap_or_else(|e| e.into_inner()).0;
        if found_at.is_some_and(|at| at.elapsed() < USER_PATHS_FRESH) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let found = tokio::task::spawn_blocking(move || globs.find())
            .await
            .unwrap_or_else(|e| Err(format!("the walk failed: {e}")))
            .map_err(|reason| FsError::Sandbox { command: command.to_owned(), reason })?;
        *self.matched.lock().unwrap_or_else(|e| e.into_inner()) =
            (Some(started), std::sync::Arc::new(found));
        Ok(())
    }

    /// The sandbox `config` asks for around commands run in `root` (canonical), checked
    /// against this kernel; `protected` are kept read-only with `root/.git` where they lie
    /// beneath a writable root, and the hidden ones beneath the root hidden. Logs a warning
    /// when the default sandbox cannot be had; fails only on a bad configuration (a
    /// relative writable root).
    pub(crate) fn new(
        config: &SandboxConfig,
        root: &Path,
        protected: &[ServerPath],
    ) -> Result<Sandbox, FsError> {
        let (abi, filters, views) = (landlock::abi, seccomp::available, mounts::available);
        Sandbox::for_kernel(config, root, protected, abi, filters, views)
    }

    /// [`Sandbox::new`] on a kernel whose Landlock ABI `abi` tells (asked only when a
    /// sandbox is wanted), that can install a seccomp filter when `seccomp` says so (asked
    /// only when the network is denied) and make read-only views when `views` says so
    /// (asked only when something beneath a writable root is to be kept read-only).
    fn for_kernel(
        config: &SandboxConfig,
        root: &Path,
        protected: &[ServerPath],
        abi: impl FnOnce() -> Result<u32, String>,
        seccomp: impl FnOnce() -> Result<(), String>,
        views: impl FnOnce() -> Result<(), String>,
    ) -> Result<Sandbox, FsError> {
        if let Some(relative) = config.writable_roots.iter().find(|p| !p.is_absolute()) {
            return Err(FsError::Config {
                message: format!(
                    "`bash.sandbox.writableRoots` entry `{}` is not an absolute path; give it \
                     absolute",
                    relative.display()
                ),
            });
        }
        let explicit = config.mode.is_some();
        // Whether views can be made: asked at most once, and only when one is wanted.
        let mut views = Some(views);
        let mut probed: Option<Result<(), String>> = None;
        let mut can_mount =
            || probed.get_or_insert_with(|| views.take().map_or(Ok(()), |probe| probe())).clone();
        let mode = config.mode.unwrap_or(SandboxMode::WorkspaceWrite);
        let writable = match mode {
            SandboxMode::Off => None,
            SandboxMode::ReadOnly => Some(config.writable_roots.clone()),
            SandboxMode::WorkspaceWrite => {
                let mut roots = vec![root.to_path_buf()];
                roots.extend(TEMPORARY.iter().map(PathBuf::from));
                roots.push(std::env::temp_dir());
                roots.extend(config.writable_roots.iter().cloned());
                let mut seen = std::collections::HashSet::new();
                roots.retain(|r| seen.insert(r.clone()));
                Some(roots)
            }
        };
        // Sockets other than Unix ones are refused by a seccomp filter where the kernel
        // takes one; without, Landlock denies TCP alone.
        let sockets = !config.network
            && seccomp().map_err(|why| tracing::debug!("no seccomp filter: {why}")).is_ok();
        let description = describe(mode, config, sockets);
        if writable.is_none() && config.network {
            return Ok(Sandbox::with(Plan::Off, description));
        }
        let off = "set `fs.bash.sandbox: off` in the configuration (`BashConfig::sandbox`) to \
                   run commands unconfined";
        let abi = match abi() {
            Ok(abi) => abi,
            Err(why) if !explicit && config.network => {
                tracing::warn!(
                    "commands of `bash` and `exec` run without a sandbox: {why}; set \
                     `fs.bash.sandbox: off` to say that is intended"
                );
                let description = describe(SandboxMode::Off, config, false);
                return Ok(Sandbox::with(Plan::Off, description));
            }
            Err(why) if sockets && (writable.is_none() || !explicit) => {
                // No Landlock, but the network can still be denied.
                if writable.is_some() {
                    tracing::warn!(
                        "commands of `bash` and `exec` are not confined to the workspace: \
                         {why}; only their network is denied (seccomp)"
                    );
                }
                let description = describe(SandboxMode::Off, config, true);
                let policy = Policy {
                    abi: 0,
                    writable: None,
                    devices: DEVICES,
                    deny_tcp: false,
                    deny_sockets: true,
                    scoped: 0,
                    read_only: Vec::new(),
                    hidden: Vec::new(),
                    folders: Vec::new(),
                    watched: Vec::new(),
                    root: root.to_path_buf(),
                    hide_sockets: false,
                    protect_paths: false,
                };
                return Ok(Sandbox::with(Plan::Enforce(policy), description));
            }
            Err(why) => {
                let reason = format!("{} cannot be enforced: {why}; {off}", asked(config));
                return Ok(Sandbox::with(Plan::Refused(reason), description));
            }
        };
        if !config.network && abi < ABI_NETWORK && !sockets {
            let reason = format!(
                "`network: false` needs Landlock ABI {ABI_NETWORK} (Linux 6.7) to deny TCP, and \
                 this kernel has ABI {abi}; allow the network (`fs.bash.sandbox.network: true`) \
                 or {off}"
            );
            return Ok(Sandbox::with(Plan::Refused(reason), description));
        }
        if writable.is_some() && abi < ABI_TRUNCATE {
            if explicit {
                let reason = format!(
                    "sandbox mode `{}` needs Landlock ABI {ABI_TRUNCATE} (Linux 6.2) to confine \
                     truncation as well as writes, and this kernel has ABI {abi}; {off}",
                    mode.as_str()
                );
                return Ok(Sandbox::with(Plan::Refused(reason), description));
            }
            tracing::warn!(
                "the default sandbox of `bash` and `exec` is partial on this kernel (Landlock \
                 ABI {abi}): writes are confined but truncating a file by path is not; set \
                 `fs.bash.sandbox: off` to drop it, or upgrade to Linux 6.2 or later"
            );
        }
        // A command may neither signal nor reach through abstract sockets the processes
        // it did not start (the server itself, the user's session bus), where the kernel
        // can keep it to its own.
        let scoped = if writable.is_some() && abi >= ABI_SCOPES { landlock::SCOPES } else { 0 };
        // What beneath a writable root stays read-only to commands, and what beneath the
        // root they may not read.
        // A repository a command makes where there was none (`git init`, or a `.git` of its
        // own writing) would run its hooks and configuration (`core.fsmonitor` runs on any
        // `git status`, which shell prompts call) outside the sandbox: watched as toolmux's
        // own files are, and moved aside.
        let watched: Vec<PathBuf> = match &writable {
            Some(roots) if config.protect_paths => std::iter::once(root.join(".git"))
                .chain(submodules(root).into_iter().map(|dir| dir.join(".git")))
                .chain(protected.iter().filter(|p| !p.hidden).map(|p| p.path.clone()))
                .filter(|p| roots.iter().any(|r| p.starts_with(r)))
                .collect(),
            _ => Vec::new(),
        };
        let (read_only, hidden) = match &writable {
            Some(roots) if config.protect_paths => {
                let beneath_writable =
                    |p: &Path| p.is_absolute() && roots.iter().any(|r| p.starts_with(r));
                let mut seen = std::collections::HashSet::new();
                let candidates = std::iter::once(root.join(".git"))
                    .chain(submodules(root).into_iter().map(|dir| dir.join(".git")))
                    .chain(nested_repositories(root))
                    .chain(protected.iter().filter(|p| !p.hidden).map(|p| p.path.clone()));
                let read_only: Vec<PathBuf> =
                    candidates.filter(|p| beneath_writable(p) && seen.insert(p.clone())).collect();
                // Wherever they are: the default output directory is in `/tmp`, which
                // commands may write, and a command that could rewrite a stored output
                // would change what `toolmux output show` gives the model.
                let hidden: Vec<PathBuf> = protected
                    .iter()
                    .filter(|p| p.hidden && p.path.is_absolute() && !root.starts_with(&p.path))
                    .map(|p| p.path.clone())
                    .collect();
                let wanted = !read_only.is_empty() || !hidden.is_empty();
                match wanted.then(&mut can_mount) {
                    Some(Ok(())) => (read_only, hidden),
                    Some(Err(why)) => {
                        tracing::warn!(
                            "commands of `bash` and `exec` can write `.git` and toolmux's own \
                             files beneath the workspace root: {why}; set \
                             `fs.bash.sandbox.protectPaths: false` to say that is intended"
                        );
                        (Vec::new(), Vec::new())
                    }
                    None => (Vec::new(), Vec::new()),
                }
            }
            _ => (Vec::new(), Vec::new()),
        };
        // Connecting to a pathname Unix socket is no write and no network right, so neither
        // Landlock nor the filter sees it: with `network: false` the sockets bound when a
        // command starts (a Docker daemon's is root on the host) are covered instead.
        let hide_sockets = !config.network
            && writable.is_some()
            && can_mount()
                .map_err(|why| {
                    tracing::warn!(
                        "commands of `bash` and `exec` with `network: false` can still connect to \
                     the Unix sockets of servers on this machine (a Docker daemon's): {why}"
                    );
                })
                .is_ok();
        let mut description = description;
        if hide_sockets {
            description.push_str(
                " Unix sockets bound before it started (servers it did not start, such as a \
                 Docker daemon) refuse it (\"Connection refused\"); those it binds itself work.",
            );
        }
        if !read_only.is_empty() {
            description.push_str(
                " Beneath the root, `.git` and the server's own files (its configuration, \
                 logs and outputs) are read-only to it (\"Read-only file system\"), so git \
                 commands that write (`git commit`, `git add`) fail; the user commits.",
            );
        }
        if !hidden.is_empty() {
            description.push_str(
                " The server's audit log, stored outputs (other toolmux runs' output folders in \
                 /tmp too) and spaces folder look empty to it.",
            );
        }
        if scoped != 0 {
            description.push_str(
                " It may not signal processes it did not start (\"Operation not permitted\") nor \
                 connect to their abstract Unix sockets.",
            );
        }
        let protect_paths = config.protect_paths && writable.is_some();
        let policy = Policy {
            abi,
            writable,
            devices: DEVICES,
            deny_tcp: !config.network && abi >= ABI_NETWORK,
            deny_sockets: sockets,
            scoped,
            folders: protected
                .iter()
                .filter(|p| p.hidden && p.folder && hidden.contains(&p.path))
                .map(|p| p.path.clone())
                .collect(),
            read_only,
            hidden,
            watched,
            root: root.to_path_buf(),
            hide_sockets,
            protect_paths,
        };
        Ok(Sandbox::with(Plan::Enforce(policy), description))
    }

    /// The error of a command that did not start. Where the sandbox was entered between
    /// fork and exec, a refusal there (a read-only view, Landlock, the filter) comes back
    /// as the same bare error number as an `exec` failure would, so an error number the
    /// sandbox's calls give is reported with what to switch off.
    pub(crate) fn spawn_failed(&self, command: String, source: std::io::Error) -> FsError {
        let Plan::Enforce(policy) = &self.plan else { return FsError::Spawn { command, source } };
        let from_the_sandbox = matches!(
            source.raw_os_error(),
            Some(libc::EPERM | libc::EINVAL | libc::EBUSY | libc::ENOSPC | libc::EUSERS)
        );
        if !from_the_sandbox {
            return FsError::Spawn { command, source };
        }
        let views = !policy.read_only.is_empty() || !policy.hidden.is_empty();
        let switch = if views {
            "set `fs.bash.sandbox.protectPaths: false` to run commands without the read-only \
             views of `.git` and toolmux's files, or `fs.bash.sandbox: off`"
        } else {
            "set `fs.bash.sandbox: off` to run commands unconfined"
        };
        FsError::Sandbox {
            command,
            reason: format!(
                "it did not start ({source}), which is how the kernel refuses the sandbox \
                 being entered; if it persists, {switch}"
            ),
        }
    }

    /// Which of the embedding program's files beneath a writable root are missing now,
    /// before a command starts: a command that creates one (a `toolmux.yaml` the next
    /// start would load) has it moved aside when it ends ([`Sandbox::command_ended`]); so
    /// does one that makes a `.git` anywhere beneath the root, found by walking the tree
    /// before and after it.
    pub(crate) async fn absent(&self) -> Absent {
        let Plan::Enforce(policy) = &self.plan else { return Absent::default() };
        let missing = policy
            .watched
            .iter()
            .filter(|p| std::fs::symlink_metadata(p).is_err())
            .cloned()
            .collect();
        // Only where the root's own `.git` is watched (`protectPaths` and the root
        // writable): the same holds for one made anywhere beneath it.
        let root = policy.root.clone();
        let repositories = if policy.watched.contains(&root.join(".git")) {
            let walked = root.clone();
            let walks = self.repository_walks.clone();
            // A walk of a large tree takes tens of milliseconds: off the runtime's threads.
            tokio::task::spawn_blocking(move || Repositories::before(&walked, walks)).await.ok()
        } else {
            None
        };
        Absent { missing, root, repositories }
    }

    /// The checks of the background tasks that run, for a task's watcher to run when it
    /// ends.
    pub(crate) fn task_checks(&self) -> TaskChecks {
        self.task_checks.clone()
    }

    /// A foreground command ended: what it made, and what the background tasks still
    /// running made, is moved aside after one walk of the tree (see
    /// [`TaskChecks::command_ended`]). The note for the command's result, when there is any.
    pub(crate) async fn command_ended(&self, absent: Absent) -> Option<String> {
        self.task_checks.command_ended(absent).await
    }

    /// Runs the check of every background task still running, as the tasks are listed:
    /// see [`TaskChecks::run_for_read`].
    pub(crate) async fn check_tasks_for_read(&self) {
        self.task_checks.run_for_read().await;
    }

    /// The sentence about the sandbox for the tool descriptions.
    pub(crate) fn description(&self) -> &str {
        &self.description
    }

    /// Makes `command` (which runs `label`) restrict itself before it executes; refused
    /// when the configured sandbox cannot be enforced here.
    pub(crate) fn confine(
        &self,
        command: &mut tokio::process::Command,
        label: &str,
        on_a_terminal: bool,
    ) -> Result<(), FsError> {
        match &self.plan {
            Plan::Off => Ok(()),
            Plan::Refused(reason) => {
                Err(FsError::Sandbox { command: label.to_owned(), reason: reason.clone() })
            }
            Plan::Enforce(policy) => {
                let terminal;
                let policy = if on_a_terminal && policy.devices == DEVICES {
                    terminal = Policy { devices: DEVICES_ON_A_TERMINAL, ..policy.clone() };
                    &terminal
                } else {
                    policy
                };
                let landlock = policy.writable.is_some() || policy.deny_tcp;
                let ruleset = landlock
                    .then(|| landlock::Ruleset::build(policy))
                    .transpose()
                    .map_err(|why| FsError::Sandbox {
                        command: label.to_owned(),
                        reason: format!(
                            "its sandbox could not be built: {why}; set `fs.bash.sandbox: off` \
                             to run commands unconfined"
                        ),
                    })?;
                let filter = policy.deny_sockets.then(seccomp::Filter::network);
                // The user's lines' paths join the server's own (found before the command).
                let user = self.matched.lock().unwrap_or_else(|e| e.into_inner()).1.clone();
                for folder in &policy.folders {
                    if std::fs::symlink_metadata(folder).is_err()
                        && let Err(e) = make_folder(folder)
                    {
                        tracing::warn!(folder = %folder.display(), "a folder of toolmux's to hide from commands could not be made: {e}");
                    }
                }
                if let Some((configured, dir)) = &self.spill_dir {
                    remake_spill_dir(configured.is_some(), dir)
                        .map_err(|reason| FsError::Sandbox { command: label.to_owned(), reason })?;
                }
                let joined = |own: &[PathBuf], theirs: &[PathBuf]| -> Vec<PathBuf> {
                    own.iter().chain(theirs).cloned().collect()
                };
                let views = (!policy.read_only.is_empty()
                    || !policy.hidden.is_empty()
                    || !user.read_only.is_empty()
                    || !user.hidden.is_empty()
                    || policy.hide_sockets)
                    .then(|| {
                        let writable = policy.writable.as_deref().unwrap_or_default();
                        let cwd = command.as_std().get_current_dir();
                        let read_only = joined(&policy.read_only, &user.read_only);
                        let mut hidden = joined(&policy.hidden, &user.hidden);
                        // Views can be made here only where the kernel allowed them when
                        // the sandbox was made (the server's own paths asked for them).
                        if !policy.hidden.is_empty() {
                            hidden.extend(other_runs(&policy.root));
                        }
                        let sockets =
                            if policy.hide_sockets { mounts::bound_sockets() } else { Vec::new() };
                        mounts::ReadOnlyViews::prepare(&read_only, &hidden, &sockets, writable, cwd)
                    })
                    .filter(|views| !views.is_empty());
                landlock::restrict_on_exec(command, views, ruleset, filter);
                Ok(())
            }
        }
    }
}

/// Makes the spill directory `dir` (absolute, symlinks resolved when the sandbox was made;
/// `configured` where `bash.spillDir` named it) again where it has gone since, for the
/// next command to find it read-only. A symlink found in its place was put there since
/// (a command that could write the folder above it, once something else removed the
/// directory): spills would follow it and write wherever it leads, so it is removed and
/// the directory made, with no symlink followed on the way ([`make_folder`]). A directory
/// that cannot be made is reported, and the next spill says why; one that is a symlink
/// even so (put back in between) refuses the command, naming it.
fn remake_spill_dir(configured: bool, dir: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(dir) {
        Ok(found) if found.file_type().is_symlink() => {
            tracing::warn!(folder = %dir.display(), "a symlink in place of the spill directory is removed and the directory made again");
            if let Err(e) = std::fs::remove_file(dir) {
                tracing::warn!(folder = %dir.display(), "the symlink in place of the spill directory could not be removed: {e}");
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        _ => return Ok(()),
    }
    // This user's own directory is made and checked as a spill makes it (no symlink
    // followed, owner and mode checked); a configured one is the user's folder, made
    // without following a symlink on its way.
    let made = if configured {
        make_folder(dir).map_err(|e| e.to_string())
    } else {
        crate::tools::spill::directory(None).map(drop)
    };
    if let Err(why) = made {
        tracing::warn!(folder = %dir.display(), "the spill directory could not be made again for commands to find it read-only: {why}");
    }
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!(
            "the spill directory `{}` is a symbolic link put in place of the directory, \
             which toolmux does not follow; remove the link, and the directory is made \
             again before the next command",
            dir.display()
        ));
    }
    Ok(())
}

/// Makes the folder `path` (absolute, symlinks resolved when the sandbox was made) and
/// those missing above it, mode 0700, each made in its parent opened with no symlink
/// followed: the parent is outside the sandbox, and a command may have put a symlink on
/// the way since (a missing folder beneath a writable root), which `mkdir -p` would follow
/// to make the folder wherever it leads. A symlink or a file on the way is refused.
fn make_folder(path: &Path) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags};
    use std::path::Component;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::open("/", flags, Mode::empty())?;
    let mut reached = PathBuf::from("/");
    for part in path.components() {
        let name = match part {
            Component::RootDir => continue,
            Component::Normal(name) => name,
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the path is not absolute and plain",
                ));
            }
        };
        reached.push(name);
        let opened = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
            Err(rustix::io::Errno::NOENT) => {
                match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                rustix::fs::openat(&dir, name, flags, Mode::empty())
            }
            opened => opened,
        };
        dir = match opened {
            Ok(next) => next,
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                return Err(std::io::Error::other(format!(
                    "`{}` is a symbolic link or not a folder, which no folder is made through",
                    reached.display()
                )));
            }
            Err(e) => return Err(e.into()),
        };
    }
    Ok(())
}

/// The embedding program's files that were missing when a command started, and the
/// repositories beneath the root then.
#[derive(Debug, Default)]
pub(crate) struct Absent {
    missing: Vec<PathBuf>,
    root: PathBuf,
    /// `None` where commands may make repositories (`protectPaths: false`, a root not
    /// writable).
    repositories: Option<Repositories>,
}

/// How long one walk for the `.git` entries beneath the root may take: on a tree of
/// 100,000 files in 10,000 folders one took about 90 ms (a debug build; see
/// [`git_entries`]).
const REPOSITORY_WALK: std::time::Duration = std::time::Duration::from_secs(2);

/// The `.git` entries (folders or files) beneath the root before a command started, to
/// tell those it made when it ends: a repository made in a subfolder (`git init -q sub`,
/// then `git -C sub config core.fsmonitor CMD`) runs its settings and hooks outside the
/// sandbox at the user's next `git status` there, as one at the root would.
#[derive(Debug)]
struct Repositories {
    /// The `.git` entries the walk before saw, and those earlier walks had seen (the
    /// user's, as they were when this command started).
    before: std::collections::HashSet<PathBuf>,
    /// Whether the walk saw the whole tree (else what it did not reach is judged by
    /// change time: see [`Repositories::made`]).
    complete: bool,
    started: std::time::SystemTime,
    /// Which of [`BARE_PIECES`] were at the root, and whether they made it a repository:
    /// the root itself made one (`git init --bare .`) is told by these, not by the walk.
    root_before: (Vec<&'static str>, bool),
    /// Shared with the sandbox and its other commands.
    walks: std::sync::Arc<RepositoryWalks>,
}

/// What the walks for repositories beneath one root learnt, for the commands after them.
#[derive(Debug, Default)]
struct RepositoryWalks {
    /// Set once a walk of the tree is cut at [`REPOSITORY_WALK`]: the tree is too large to
    /// walk before each command as well as after, so later commands are judged by the walk
    /// after them alone (see [`Repositories::made`]).
    cut: std::sync::atomic::AtomicBool,
    /// The `.git` entries any walk saw and left in place: the user's. Git changes a
    /// `.git`'s change time whenever it writes inside (a lock, a fetch, a commit), so one
    /// of these is never judged by its change time, whoever touched it during a command.
    known: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
    /// Where toolmux moved what commands made (`sub/.git.rejected`): a moved `.git`
    /// folder looks like a bare repository, which a later check of a running task, whose
    /// walk before did not see it, would otherwise move again as made by the task.
    aside: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
    /// What the walks listed, so that the next walk lists only the folders changed since.
    listings: std::sync::Mutex<Listings>,
    /// How many walks after commands were made, for tests to count them by.
    #[cfg(test)]
    walked_after: std::sync::atomic::AtomicUsize,
    /// How many folders the walks listed (the others' listings were used again), for tests.
    #[cfg(test)]
    listed: std::sync::atomic::AtomicUsize,
}

/// How long after its last change a folder's listing may be used again by the next walk
/// ([`Listings`]): a change within the same tick of the file system's clock leaves the
/// folder's change time as it was. The kernel's clock for file times ticks every few
/// milliseconds, and file systems that keep whole seconds (ext4's small inodes) or two
/// (FAT) round down, so a folder changed less than two seconds before a walk is listed
/// again by the next one.
const LISTING_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// The folders the last walk of the root listed, each with what it held, for the next
/// walk: one whose device, inode and change time are as they were when it was listed holds
/// the same entries, since adding, removing or renaming an entry sets its folder's change
/// time (POSIX asks it of every file system), and no command can set a change time back (it
/// is the kernel's clock, which only a privileged process can set). So the next walk
/// `lstat`s each folder and lists only those changed (and new ones), where listing every
/// folder of a tree of 5,400 cost each command about 35 ms before and as much after it; the
/// `lstat`s remain (about 2 µs a folder, 11 ms for those 5,400). The change times are the
/// file system's: one whose clock is not this machine's (a network file system whose
/// server's clock lags by more than the settling time) could keep a listing of a folder
/// changed within the same tick as the change before it.
///
/// Not kept, so listed at each walk: a folder changed less than [`LISTING_SETTLE`] before
/// the walk started, one that could not be listed, and one holding entries named `HEAD`,
/// `objects` and `refs` (whether it is a bare repository depends on what `HEAD` says and
/// where `objects` and `refs` lead, which change no time of the folder's).
#[derive(Debug)]
struct Listings {
    /// By folder, as the walk that made them found them: shared, so that walks at once
    /// (a command's end, another's start) each use them without waiting for the other.
    folders: std::sync::Arc<FolderListings>,
    /// [`LISTING_SETTLE`], shorter in tests.
    settle: std::time::Duration,
}

impl Default for Listings {
    fn default() -> Listings {
        Listings { folders: Default::default(), settle: LISTING_SETTLE }
    }
}

/// The listings of a walk, by folder: keyed by the path's bytes, which hash in one piece
/// (a `Path` hashes component by component).
type FolderListings = std::collections::HashMap<std::ffi::OsString, std::sync::Arc<Listing>>;

/// What a walk for repositories found in one folder when it listed it ([`Listings`]).
#[derive(Debug)]
struct Listing {
    /// The folder's device, inode and change time (seconds, nanoseconds) before it was
    /// listed.
    identity: FolderIdentity,
    /// Whether it holds a `.git` entry (always false for the root, whose own is not
    /// counted).
    git: bool,
    /// Its subfolders (not symlinks to one), in the order they were listed.
    subfolders: Vec<PathBuf>,
}

/// A folder's device, inode and change time (seconds, nanoseconds).
type FolderIdentity = (u64, u64, i64, i64);

/// `meta`'s [`FolderIdentity`], when it is a folder's.
fn folder_identity(meta: &std::fs::Metadata) -> Option<FolderIdentity> {
    use std::os::unix::fs::MetadataExt as _;
    meta.is_dir().then(|| (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec()))
}

impl RepositoryWalks {
    /// A walk of `root` for the `.git` entries beneath it within [`REPOSITORY_WALK`], which
    /// lists only the folders changed since the last walk ([`Listings`]) and leaves its own
    /// listings for the next.
    fn walk(&self, root: &Path, probe: &GitProbe) -> GitEntries {
        let (earlier, settle) = {
            let listings = self.listings.lock().unwrap_or_else(|e| e.into_inner());
            (listings.folders.clone(), listings.settle)
        };
        let mut listed = FolderListings::with_capacity(earlier.len());
        let walked = git_entries(root, REPOSITORY_WALK, probe, (&earlier, settle), &mut listed);
        // A cut walk did not reach every folder: those it did not reach keep their listings
        // (each is checked before it is used, so an old one costs only its memory).
        if !walked.complete {
            for (dir, listing) in earlier.iter() {
                listed.entry(dir.clone()).or_insert_with(|| listing.clone());
            }
        }
        let mut listings = self.listings.lock().unwrap_or_else(|e| e.into_inner());
        listings.folders = std::sync::Arc::new(listed);
        #[cfg(test)]
        self.listed.fetch_add(walked.listed, std::sync::atomic::Ordering::Relaxed);
        walked
    }

    /// Records what a walk saw and left: all of it when the walk was `complete` (one gone
    /// is forgotten), else added to what was known.
    fn learn(&self, seen: impl IntoIterator<Item = PathBuf>, complete: bool) {
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if complete {
            known.clear();
        }
        known.extend(seen);
    }
}

impl Repositories {
    /// Once a walk of this tree was cut (`walks.cut`), none is made now: what earlier
    /// walks saw stands for it.
    fn before(root: &Path, walks: std::sync::Arc<RepositoryWalks>) -> Repositories {
        // Change times are kept by the kernel: no command can set one back, so whatever
        // the command makes, moves or copies in has one no earlier than this.
        let started = std::time::SystemTime::now();
        let (found, complete) = if walks.cut.load(std::sync::atomic::Ordering::Relaxed) {
            (Vec::new(), false)
        } else {
            let walked = walks.walk(root, &GitProbe::default());
            (walked.found, walked.complete && walked.unchecked.is_empty())
        };
        walks.learn(found.iter().cloned(), complete);
        // A copy as of now: what another command's walk learns while this one runs (a
        // `.git` this one made, say) must not pass for the user's.
        let mut before =
            walks.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        before.extend(found);
        Repositories { before, complete, started, root_before: root_pieces(root), walks }
    }

    /// The `.git` entries of `now` (a walk of the root after the command, or while it runs)
    /// that the command made: those the walk before or an earlier walk saw are the user's,
    /// and those toolmux moved aside are not made again; where the walk before did not see
    /// the whole tree, one never seen counts as made only when it changed since the command
    /// started.
    fn made_of(&self, now: &GitEntries) -> Vec<PathBuf> {
        let changed = |path: &Path| {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::symlink_metadata(path).is_ok_and(|m| {
                let ctime = std::time::UNIX_EPOCH
                    + std::time::Duration::new(m.ctime().max(0) as u64, m.ctime_nsec() as u32);
                // Coarse file system clocks round down: a second's slack.
                ctime + std::time::Duration::from_secs(1) >= self.started
            })
        };
        let aside = self.walks.aside.lock().unwrap_or_else(|e| e.into_inner()).clone();
        now.found
            .iter()
            .filter(|p| {
                !self.before.contains(*p) && !aside.contains(*p) && (self.complete || changed(p))
            })
            .cloned()
            .collect()
    }

    /// [`Repositories::made_of`] a walk of `root` now, what the walk saw and leaves in place
    /// learnt for later commands; whether it saw the whole tree, and the folders it could
    /// not check.
    #[cfg(test)]
    fn made(&self, root: &Path) -> (Vec<PathBuf>, bool, Vec<PathBuf>) {
        self.made_in(root, &GitProbe::default())
    }

    #[cfg(test)]
    fn made_in(&self, root: &Path, probe: &GitProbe) -> (Vec<PathBuf>, bool, Vec<PathBuf>) {
        let now = self.walks.walk_after(root, probe);
        let made = self.made_of(&now);
        self.walks.learn_after(&now, &made.iter().cloned().collect());
        (made, now.complete, now.unchecked)
    }
}

impl RepositoryWalks {
    /// A walk of `root` for the `.git` entries beneath it after commands (counted in tests).
    fn walk_after(&self, root: &Path, probe: &GitProbe) -> GitEntries {
        #[cfg(test)]
        self.walked_after.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.walk(root, probe)
    }

    /// Records what the walk `now` saw and leaves in place (all but `made`) as the user's;
    /// a folder not checked may hold a `.git` known before, which is not forgotten.
    fn learn_after(&self, now: &GitEntries, made: &std::collections::HashSet<PathBuf>) {
        let kept = now.found.iter().filter(|p| !made.contains(*p)).cloned();
        self.learn(kept, now.complete && now.unchecked.is_empty());
    }
}

impl Repositories {
    /// The pieces of a bare repository a command made of the root itself, to move aside:
    /// those it created, and its `HEAD` when the root would still be a repository without
    /// them (a `HEAD` of the user's that the command rewrote). None when the root is no
    /// repository now, or already was one when the command started.
    fn root_made_bare(&self, root: &Path) -> Vec<PathBuf> {
        let (before, was) = &self.root_before;
        let (now, is) = root_pieces(root);
        if *was || !is {
            return Vec::new();
        }
        let mut made: Vec<&str> = now.iter().copied().filter(|n| !before.contains(n)).collect();
        let left = now.iter().copied().filter(|n| !made.contains(n));
        if is_bare_repository(root, left.map(std::ffi::OsString::from)) {
            made.insert(0, "HEAD");
        }
        made.into_iter().map(|name| root.join(name)).collect()
    }
}

/// The checks of the background tasks of one sandbox that still run (those whose task
/// has ended or is forgotten are dropped when next looked at).
#[derive(Debug, Default, Clone)]
pub(crate) struct TaskChecks(std::sync::Arc<std::sync::Mutex<Vec<std::sync::Weak<TaskCheck>>>>);

impl TaskChecks {
    /// The check of a background task that starts now, from what was missing and the
    /// repositories beneath the root when it started: run when it ends, when its output
    /// is read and when another command ends ([`TaskChecks::command_ended`]), so that a
    /// `.git` it makes is not left for the user's `git status` and the other tools while it
    /// runs.
    pub(crate) fn watch(&self, absent: Absent) -> std::sync::Arc<TaskCheck> {
        let check = std::sync::Arc::new(TaskCheck {
            absent,
            last_walk: Default::default(),
            notes: Default::default(),
            ended: Default::default(),
        });
        let mut checks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        checks.retain(|c| c.upgrade().is_some_and(|c| !c.has_ended()));
        checks.push(std::sync::Arc::downgrade(&check));
        check
    }

    /// A foreground command ended: what it made (`absent`, taken as it started) is moved
    /// aside, and so is what each task still running made since it started, noted for the
    /// task's next read, all after one walk of the tree ([`check_together`]). The note for
    /// the command's result, when there is any.
    pub(crate) async fn command_ended(&self, absent: Absent) -> Option<String> {
        let tasks = self.running_as(None, CheckOccasion::CommandEnd);
        check_together_blocking(Some(absent), tasks).await
    }

    /// A background task ended (its processes are gone): its last check, and the check of
    /// every task still running, as at another command's end, with one walk of the tree.
    pub(crate) async fn task_ended(&self, ended: &std::sync::Arc<TaskCheck>) {
        let tasks = self.running_as(Some(ended), CheckOccasion::CommandEnd);
        check_together_blocking(None, tasks).await;
    }

    /// The tasks are listed: the check of every task still running, as its output is read
    /// ([`TaskCheck::run_for_read`]), with one walk of the tree when any's walk is due.
    pub(crate) async fn run_for_read(&self) {
        let tasks = self.running_as(None, CheckOccasion::Read);
        check_together_blocking(None, tasks).await;
    }

    /// The checks of the tasks still running, in the order they started, each with why it
    /// runs: `ended`'s as its task ended, the others' as `occasion`.
    fn running_as(
        &self,
        ended: Option<&std::sync::Arc<TaskCheck>>,
        occasion: CheckOccasion,
    ) -> Vec<(std::sync::Arc<TaskCheck>, CheckOccasion)> {
        let mut running: Vec<_> = self
            .running()
            .into_iter()
            .map(|check| {
                let ends = ended.is_some_and(|ended| std::sync::Arc::ptr_eq(ended, &check));
                (check, if ends { CheckOccasion::TaskEnd } else { occasion })
            })
            .collect();
        // One no longer listed has had its last check: nothing is done for it again.
        if let Some(ended) =
            ended.filter(|e| !running.iter().any(|(c, _)| std::sync::Arc::ptr_eq(c, e)))
        {
            running.push((ended.clone(), CheckOccasion::TaskEnd));
        }
        running
    }

    fn running(&self) -> Vec<std::sync::Arc<TaskCheck>> {
        let mut checks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        checks.retain(|c| c.upgrade().is_some_and(|c| !c.has_ended()));
        checks.iter().filter_map(std::sync::Weak::upgrade).collect()
    }
}

/// Why a background task's check runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckOccasion {
    /// Its output is read or the tasks are listed: the walk may be passed over
    /// ([`read_walks`]).
    Read,
    /// Another command or task ends: always walks, so that what the task made is moved
    /// aside before the agent's next call, whatever it is.
    CommandEnd,
    /// The task itself ends: always walks, and is its last check.
    TaskEnd,
}

/// The last walk of a background task's check, which tells when a read walks again.
#[derive(Debug, Clone, Copy)]
struct LastWalk {
    ended: std::time::Instant,
    took: std::time::Duration,
    /// Whether that check moved anything aside: a task that makes repositories is walked
    /// again at its next read.
    moved: bool,
}

/// A read of a running task walks the tree again once this many times its last walk's
/// length has passed since that walk ended (see [`read_walks`]).
const READ_WALK_SPACING: u32 = 10;

/// Whether a read of a running background task (its output, the task list) walks the tree
/// for repositories it made, given its check's last walk: always after none or after one
/// that moved something aside, else once [`READ_WALK_SPACING`] times that walk's length has
/// passed since it ended. A walk of a small tree (a millisecond) thus runs at every read of
/// an agent polling every few hundred milliseconds, while one of a large tree (up to the 2 s
/// of [`REPOSITORY_WALK`]) takes at most about a tenth of the reads' time, where each read
/// cost a walk; the end of each command and of the task still walks every time.
fn read_walks(last: Option<&LastWalk>, now: std::time::Instant) -> bool {
    let Some(last) = last else { return true };
    last.moved || now.saturating_duration_since(last.ended) >= last.took * READ_WALK_SPACING
}

/// The check of one running background task ([`TaskChecks::watch`]), shared by its
/// watcher, its reads and the ends of other commands.
#[derive(Debug)]
pub(crate) struct TaskCheck {
    absent: Absent,
    /// Held while a check runs, so that two checks of one task (its read and another
    /// command's end) do not both move what it made; when its last walk was.
    last_walk: std::sync::Mutex<Option<LastWalk>>,
    /// The notes of what was moved aside, oldest first.
    notes: std::sync::Mutex<Vec<String>>,
    /// Set by the task's last check, when it has ended: what is made after is not its.
    ended: std::sync::atomic::AtomicBool,
}

impl TaskCheck {
    /// The check as the task's output is read: what it made since it started is moved
    /// aside ([`check_together`]), but the tree is walked only when [`read_walks`] says so
    /// (toolmux's own missing files are looked at every time), and nothing is done while
    /// another check of the task runs, whose note the next read shows: a read waits neither
    /// for a walk of a large tree at each poll nor for one under way.
    pub(crate) async fn run_for_read(self: &std::sync::Arc<Self>) {
        check_together_blocking(None, vec![(self.clone(), CheckOccasion::Read)]).await;
    }

    fn has_ended(&self) -> bool {
        self.ended.load(std::sync::atomic::Ordering::Acquire)
    }

    /// One check of this task alone, on this thread.
    #[cfg(test)]
    fn run_now(self: &std::sync::Arc<Self>, occasion: CheckOccasion) {
        check_together(None, &[(self.clone(), occasion)]);
    }

    /// The notes from the `from`th on, and how many there are in all.
    pub(crate) fn notes_from(&self, from: usize) -> (Vec<String>, usize) {
        let notes = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        (notes.iter().skip(from).cloned().collect(), notes.len())
    }
}

/// [`check_together`] on the blocking pool: it walks the tree.
async fn check_together_blocking(
    command: Option<Absent>,
    tasks: Vec<(std::sync::Arc<TaskCheck>, CheckOccasion)>,
) -> Option<String> {
    let checked = tokio::task::spawn_blocking(move || check_together(command.as_ref(), &tasks));
    checked.await.unwrap_or_else(|e| {
        tracing::warn!("looking for what a command or background task created failed: {e}");
        None
    })
}

/// One check for what commands made beneath the root, on one occasion: the end of a
/// foreground command (`command`, taken as it started) and the checks of background tasks
/// (`tasks`, in the order they started, each with why it runs). The tree is walked once for
/// them all, when any of them walks (a read only when due: [`read_walks`]), and each
/// repository found is judged against each one's start: it is moved aside when any of them
/// could have made it, with a note to the first that could (the command, the task that
/// ended, then the others in the order they started). Each check walking on its own made a
/// command's end with N tasks running cost N + 1 walks, each up to [`REPOSITORY_WALK`].
///
/// A read does nothing for a task whose check another holds (the next read shows that
/// one's note); the ends wait for it. Returns the command's note, when there is any.
fn check_together(
    command: Option<&Absent>,
    tasks: &[(std::sync::Arc<TaskCheck>, CheckOccasion)],
) -> Option<String> {
    // Invariant: the tasks' checks are taken in the order the tasks started, the same in
    // every check, so that two checks that wait cannot each hold a task the other waits for.
    let mut held = Vec::new();
    for (check, occasion) in tasks {
        let last_walk = match occasion {
            CheckOccasion::Read => match check.last_walk.try_lock() {
                Ok(last_walk) => last_walk,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            },
            CheckOccasion::CommandEnd | CheckOccasion::TaskEnd => {
                check.last_walk.lock().unwrap_or_else(|e| e.into_inner())
            }
        };
        if check.has_ended() {
            continue;
        }
        if *occasion == CheckOccasion::TaskEnd {
            check.ended.store(true, std::sync::atomic::Ordering::Release);
        }
        held.push((check, last_walk, *occasion));
    }
    // The task that ended is judged first, as its own check was run first.
    held.sort_by_key(|(_, _, occasion)| *occasion != CheckOccasion::TaskEnd);
    let now = std::time::Instant::now();
    let walk = command.is_some()
        || held.iter().any(|(_, last_walk, occasion)| {
            *occasion != CheckOccasion::Read || read_walks(last_walk.as_ref(), now)
        });
    let absents: Vec<&Absent> =
        command.into_iter().chain(held.iter().map(|(check, ..)| &check.absent)).collect();
    let started = std::time::Instant::now();
    let mut planted = Absent::move_planted_together(&absents, walk).into_iter();
    let ended = std::time::Instant::now();
    let note = command.and_then(|_| planted.next()).and_then(|planted| planted.note);
    for ((check, mut last_walk, _), planted) in held.into_iter().zip(planted) {
        if walk {
            *last_walk = Some(LastWalk { ended, took: ended - started, moved: planted.moved });
        }
        let Some(note) = planted.note else { continue };
        let mut notes = check.notes.lock().unwrap_or_else(|e| e.into_inner());
        // A folder that cannot be checked is said once, not at every check.
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
    note
}

/// One walk after commands of a root, shared by the checks of one occasion.
struct SharedWalk<'a> {
    root: &'a Path,
    walks: &'a RepositoryWalks,
    entries: GitEntries,
    /// What a check judged made so far: not judged again by the checks after it.
    made: std::collections::HashSet<PathBuf>,
}

impl Absent {
    /// Moves aside what each of `absents` (commands and background tasks of one sandbox,
    /// as they started) created since: each of toolmux's files missing then (to
    /// `NAME.rejected`, or `NAME.rejected.N` when that is taken: toolmux's configuration is
    /// the user's to write, and one planted by a command would run what it says at the
    /// next start), the root's own pieces of a bare repository, and with `walk` each
    /// repository found beneath the root by one walk that it could have made, one found by
    /// several going to the first. What each did, in their order.
    ///
    /// May run more than once for a task: what was moved aside is not there to be found
    /// again, and one moved since by another check is passed over. Without `walk` only
    /// toolmux's missing files and the root's own pieces are looked at (a few `lstat`s).
    fn move_planted_together(absents: &[&Absent], walk: bool) -> Vec<Planted> {
        let moved: Vec<Vec<String>> = absents.iter().map(|absent| absent.move_missing()).collect();
        // Invariant: one sandbox's, so one root; a walk per root all the same.
        let mut walked: Vec<SharedWalk<'_>> = Vec::new();
        let mut made = Vec::new();
        for absent in absents {
            let Some(repositories) = absent.repositories.as_ref().filter(|_| walk) else {
                made.push((Vec::new(), None));
                continue;
            };
            let at = walked.iter().position(|w| w.root == absent.root).unwrap_or_else(|| {
                let walks = &*repositories.walks;
                let entries = walks.walk_after(&absent.root, &GitProbe::default());
                let made = Default::default();
                walked.push(SharedWalk { root: &absent.root, walks, entries, made });
                walked.len() - 1
            });
            let shared = &mut walked[at];
            let mine: Vec<PathBuf> = (repositories.made_of(&shared.entries).into_iter())
                .filter(|path| shared.made.insert(path.clone()))
                .collect();
            made.push((mine, Some(at)));
        }
        for shared in &walked {
            shared.walks.learn_after(&shared.entries, &shared.made);
            let cut_before = !shared.entries.complete
                && shared.walks.cut.swap(true, std::sync::atomic::Ordering::Relaxed);
            if !shared.entries.complete && !cut_before {
                tracing::warn!(
                    root = %shared.root.display(),
                    "the walk for repositories a command made beneath the workspace root \
                     took longer than {} s and was cut: one made past where it reached \
                     stays; later commands walk only when they end",
                    REPOSITORY_WALK.as_secs()
                );
            }
        }
        let no_folders = Vec::new();
        absents
            .iter()
            .zip(moved)
            .zip(made)
            .map(|((absent, moved), (made, at))| {
                let unchecked = at.map_or(&no_folders, |at| &walked[at].entries.unchecked);
                absent.move_made(moved, &made, unchecked)
            })
            .collect()
    }

    /// Moves aside those of toolmux's files missing when the command started that are there
    /// now; the notes of each.
    fn move_missing(&self) -> Vec<String> {
        let there = self.missing.iter().filter(|p| std::fs::symlink_metadata(p).is_ok());
        let mut notes = Vec::new();
        for path in there {
            let Some((note, aside)) = move_aside(path, &self.root) else { continue };
            notes.push(note);
            // The root's `.git` moved aside looks like a bare repository to the walk that
            // follows, which would move it again as made by the command.
            if let Some(repositories) = &self.repositories {
                let mut moved_to =
                    repositories.walks.aside.lock().unwrap_or_else(|e| e.into_inner());
                moved_to.extend(aside);
            }
        }
        notes
    }

    /// After [`Absent::move_missing`] (which did `moved`): moves aside the root's own pieces
    /// of a bare repository the command made and the repositories beneath it that it `made`,
    /// and says what was done, and which `unchecked` folders the walk could not check.
    fn move_made(
        &self,
        mut moved: Vec<String>,
        made: &[PathBuf],
        unchecked: &[PathBuf],
    ) -> Planted {
        // The root's own `.git`, if the command made it, is gone by now.
        let mut root_note = None;
        if let Some(repositories) = &self.repositories {
            let pieces = repositories.root_made_bare(&self.root);
            if !pieces.is_empty() {
                tracing::warn!(root = %self.root.display(), "a command made the workspace root a bare git repository; moving aside what it created");
                let moved: Vec<String> = pieces
                    .iter()
                    .filter_map(|piece| move_aside(piece, &self.root).map(|(note, _)| note))
                    .collect();
                root_note = Some(format!(
                    "[the command made the workspace root itself a bare git repository (as `git \
                     init --bare .` does), whose hooks and settings would run outside the \
                     sandbox at the user's next git command there; moved aside what made it \
                     one: {}]",
                    moved.join(", ")
                ));
            }
            // Another task's check of the same walk may have moved it meanwhile.
            for path in made.iter().filter(|p| std::fs::symlink_metadata(p).is_ok()) {
                let Some((note, aside)) = move_aside(path, &self.root) else { continue };
                moved.push(note);
                let mut moved_to =
                    repositories.walks.aside.lock().unwrap_or_else(|e| e.into_inner());
                moved_to.extend(aside);
            }
        }
        let moved = (!moved.is_empty()).then(|| {
            format!(
                "[the command created {}, which would run what it says outside the sandbox \
                 when next used (toolmux's configuration and approvals, a git repository's \
                 hooks and settings) and is the user's to write]",
                moved.join(", ")
            )
        });
        let unchecked = (!unchecked.is_empty()).then(|| {
            let shown: Vec<String> = unchecked
                .iter()
                .map(|p| format!("`{}`", p.strip_prefix(&self.root).unwrap_or(p).display()))
                .collect();
            tracing::warn!(folders = ?unchecked, "folders beneath the workspace root could not be checked for a repository a command made");
            format!(
                "[toolmux could not check {} for a git repository the command may have made \
                 (neither listed nor its `.git` looked up): look at its permissions and for a \
                 `.git` there before running git in it]",
                shown.join(", ")
            )
        });
        let moved_any = moved.is_some() || root_note.is_some();
        let notes: Vec<String> = [moved, root_note, unchecked].into_iter().flatten().collect();
        Planted { note: (!notes.is_empty()).then(|| notes.join(" ")), moved: moved_any }
    }
}

/// What one check for what a command or task created did ([`Absent::move_made`]).
#[derive(Debug, Default)]
struct Planted {
    /// The note for the command's result, when there was any.
    note: Option<String>,
    /// Whether it moved (or removed) anything, not only named folders it could not check.
    moved: bool,
}

/// Moves `path` (beneath `root`, where it is shown relative to) aside to `NAME.rejected`,
/// or `NAME.rejected.N` when that is taken, else removes it; what was done, for the note,
/// and where it went.
fn move_aside(path: &Path, root: &Path) -> Option<(String, Option<PathBuf>)> {
    // A folder on the way that is a symlink (`.claude` made a link to the user's own
    // `~/.claude`) is what the command made: it is moved aside, never the file it leads
    // to, which toolmux, outside the sandbox, would rename wherever the link points.
    let linked = linked_folder(path, root);
    let path = linked.as_deref().unwrap_or(path);
    let shown = path.strip_prefix(root).unwrap_or(path).display().to_string();
    let name = path.file_name()?;
    let free = (1..100).map(|n| {
        let mut aside = name.to_os_string();
        aside.push(if n == 1 { ".rejected".to_owned() } else { format!(".rejected.{n}") });
        path.with_file_name(aside)
    });
    let Some(aside) = free.into_iter().find(|p| std::fs::symlink_metadata(p).is_err()) else {
        // Every name taken (by the command, likely): what it made goes instead.
        let removed = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
            _ => std::fs::remove_file(path),
        };
        tracing::warn!(path = %path.display(), "a command created a protected file; no name was free to move it aside, so it was removed: {removed:?}");
        return Some(match removed {
            Ok(()) => (format!("`{shown}` (removed: no name was free to move it to)"), None),
            Err(e) => (format!("`{shown}` (neither moved nor removed: {e})"), None),
        });
    };
    Some(match std::fs::rename(path, &aside) {
        Ok(()) => {
            tracing::warn!(path = %path.display(), aside = %aside.display(), "a command created a protected file; moved aside");
            let shown_aside = aside.strip_prefix(root).unwrap_or(&aside).display().to_string();
            (format!("`{shown}` (moved to `{shown_aside}`)"), Some(aside))
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), "a command created a protected file, which could not be moved aside: {e}");
            (format!("`{shown}` (not moved: {e})"), None)
        }
    })
}

/// The first folder between `root` and `path` (beneath it) that is a symlink, if any.
fn linked_folder(path: &Path, root: &Path) -> Option<PathBuf> {
    let relative = path.strip_prefix(root).ok()?;
    let mut folder = root.to_path_buf();
    let mut parts = relative.components().peekable();
    while let Some(part) = parts.next() {
        // The last part is the file itself: only the folders before it count.
        parts.peek()?;
        folder.push(part);
        match std::fs::symlink_metadata(&folder) {
            Ok(meta) if meta.file_type().is_symlink() => return Some(folder),
            Ok(meta) if meta.is_dir() => {}
            _ => return None,
        }
    }
    None
}

/// The `.git` entries (folders, files or symlinks) beneath `root`, its own aside, and
/// whether the walk saw the whole tree within `limit`. Symlinks and `.git` folders are not
/// looked into; ignored folders are (a clone is often ignored by the repository around it).
/// The walk looks at every folder, since a new entry changes only its own folder's times,
/// not those above; but a folder that `earlier` (the last walk's listings, with how long a
/// folder must have been left unchanged for its listing to be kept) listed and that has not
/// changed since is only `lstat`ed, its listing used again ([`Listings`]). The listings of
/// this walk go to `listed`.
///
/// A bare repository a command makes (`git init --bare sub`: `HEAD`, `objects/` and `refs/`
/// in a folder, as git tells one: [`is_bare_repository`]) counts as the folder itself: git
/// uses one it finds as the current folder, hooks and settings included. The root made one
/// is told apart ([`Repositories::root_made_bare`]). A folder that cannot be listed (`chmod 111 sub`, which
/// still lets the user `cd` there) is checked by looking its `.git`, `HEAD`, `objects` and
/// `refs` up by name, which needs only search permission; where even that fails it is
/// reported as unchecked, and the walk as incomplete.
fn git_entries(
    root: &Path,
    limit: std::time::Duration,
    probe: &GitProbe,
    earlier: (&FolderListings, std::time::Duration),
    listed: &mut FolderListings,
) -> GitEntries {
    let (earlier, settle) = earlier;
    // Taken before any folder is looked at: a folder whose change time is older than this
    // by `settle` gets a later one from any change after it is listed.
    let started = std::time::SystemTime::now();
    let settled = |identity: &FolderIdentity| {
        let (_, _, seconds, nanoseconds) = *identity;
        let changed = u64::try_from(seconds)
            .ok()
            .map(|s| std::time::UNIX_EPOCH + std::time::Duration::new(s, nanoseconds as u32));
        changed.is_some_and(|changed| changed + settle < started)
    };
    let deadline = std::time::Instant::now() + limit;
    let mut walked = GitEntries::default();
    let mut folders = vec![root.to_path_buf()];
    let mut looked = 0usize;
    while let Some(dir) = folders.pop() {
        looked += 1;
        if looked.is_multiple_of(1024) && std::time::Instant::now() > deadline {
            return walked;
        }
        // Looked at before it is listed: a change while it is listed makes it differ.
        let identity = (probe.lstat)(&dir).ok().and_then(|meta| folder_identity(&meta));
        if let Some(listing) =
            earlier.get(dir.as_os_str()).filter(|listing| identity == Some(listing.identity))
        {
            if listing.git {
                walked.found.push(dir.join(".git"));
            }
            folders.extend(listing.subfolders.iter().cloned());
            listed.insert(dir.into_os_string(), listing.clone());
            continue;
        }
        let entries = match (probe.list)(&dir) {
            Ok(entries) => entries,
            Err(_) if dir == root => continue,
            Err(_) => {
                // Looked up by name: git opens them so, as the user can in a folder with
                // search permission alone.
                let git = dir.join(".git");
                match (probe.lstat)(&git) {
                    Ok(_) => walked.found.push(git),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        let named = ["HEAD", "objects", "refs"]
                            .map(|name| (probe.lstat)(&dir.join(name)).map(|_| name.into()));
                        if named.iter().any(|n| {
                            n.as_ref().is_err_and(|e| e.kind() != std::io::ErrorKind::NotFound)
                        }) {
                            walked.unchecked.push(dir);
                        } else if is_bare_repository(&dir, named.into_iter().filter_map(Result::ok))
                        {
                            walked.found.push(dir);
                        }
                    }
                    Err(_) => walked.unchecked.push(dir),
                }
                continue;
            }
        };
        #[cfg(test)]
        {
            walked.listed += 1;
        }
        let mut names = Vec::new();
        let mut subfolders = Vec::new();
        let mut git = false;
        for entry in entries.filter_map(Result::ok) {
            looked += 1;
            if looked.is_multiple_of(1024) && std::time::Instant::now() > deadline {
                return walked;
            }
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            let name = entry.file_name();
            if name == ".git" {
                if dir != root {
                    walked.found.push(entry.path());
                    git = true;
                }
            } else if is_dir {
                subfolders.push(entry.path());
            }
            // Only these tell a bare repository.
            if name == "HEAD" || name == "objects" || name == "refs" {
                names.push(name);
            }
        }
        // A bare repository is moved aside whole: its objects are not walked.
        if dir != root && is_bare_repository(&dir, names.iter().cloned()) {
            walked.found.push(dir);
            continue;
        }
        if let Some(identity) = identity.filter(|identity| names.len() < 3 && settled(identity)) {
            let listing = Listing { identity, git, subfolders: subfolders.clone() };
            listed.insert(dir.into_os_string(), std::sync::Arc::new(listing));
        }
        folders.extend(subfolders);
    }
    walked.complete = true;
    walked
}

/// What [`git_entries`] found.
#[derive(Debug, Default)]
struct GitEntries {
    /// The `.git` entries and bare repositories' folders beneath the root.
    found: Vec<PathBuf>,
    /// Whether the walk reached every folder within its time (see `unchecked` too).
    complete: bool,
    /// The folders it could neither list nor look into by name.
    unchecked: Vec<PathBuf>,
    /// How many folders it listed (the others' listings were used again), for tests.
    #[cfg(test)]
    listed: usize,
}

/// How [`git_entries`] reads the tree: the file system, or in tests a tree where some
/// folders fail as they do for a user without read permission (tests run as root).
struct GitProbe {
    list: fn(&Path) -> std::io::Result<std::fs::ReadDir>,
    lstat: fn(&Path) -> std::io::Result<std::fs::Metadata>,
}

impl Default for GitProbe {
    fn default() -> GitProbe {
        GitProbe {
            list: |dir| std::fs::read_dir(dir),
            lstat: |path| std::fs::symlink_metadata(path),
        }
    }
}

/// Whether `dir`, one of whose entries' names are `names`, is a repository as git tells one
/// (its `is_git_directory`): `objects` and `refs` folders (a symlink to one counts, as git
/// follows it) and a `HEAD` that [`is_head`] accepts. A folder that merely has entries of
/// those names (`mkdir -p x/objects x/refs; echo hi > x/HEAD`) is none, and is left alone.
fn is_bare_repository(dir: &Path, names: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    let (mut head, mut objects, mut refs) = (false, false, false);
    for name in names {
        match name.to_str() {
            Some("HEAD") => head = true,
            Some("objects") => objects = true,
            Some("refs") => refs = true,
            _ => {}
        }
    }
    let is_dir = |name: &str| std::fs::metadata(dir.join(name)).is_ok_and(|m| m.is_dir());
    head && objects && refs && is_dir("objects") && is_dir("refs") && is_head(&dir.join("HEAD"))
}

/// Whether `path` is a `HEAD` git accepts (its `validate_headref`): a symlink to `refs/...`,
/// or a file that reads `ref: refs/...` or starts with an object id of 40 or 64 hex
/// digits. One that cannot be read for want of permission counts as one: a `chmod` later
/// (the user's, or a command's) would make it so.
fn is_head(path: &Path) -> bool {
    use std::io::Read as _;
    let Ok(meta) = std::fs::symlink_metadata(path) else { return false };
    if meta.is_symlink() {
        return std::fs::read_link(path)
            .is_ok_and(|target| target.as_os_str().as_encoded_bytes().starts_with(b"refs/"));
    }
    // Opened without waiting: a FIFO named `HEAD` (which git could not read either) held
    // every later command at this check for ever. Only a regular file is read.
    use toolmux_core::regular::{RegularError, open_regular};
    let file = match open_regular(path, std::fs::OpenOptions::new().read(true)) {
        Ok(file) => file,
        Err(RegularError::Io(e)) => return e.kind() == std::io::ErrorKind::PermissionDenied,
        Err(_) => return false,
    };
    let mut start = Vec::with_capacity(255);
    if file.take(255).read_to_end(&mut start).is_err() {
        return false;
    }
    if let Some(name) = start.strip_prefix(b"ref:") {
        let name = name.trim_ascii_start();
        if name.starts_with(b"refs/") {
            return true;
        }
    }
    // Git reads the id's 40 (SHA-1) or 64 (SHA-256) digits and looks no further.
    start.iter().take_while(|b| b.is_ascii_hexdigit()).count() >= 40
}

/// The names `git init --bare` makes in a folder (and those git adds later): what is moved
/// aside when a command makes the workspace root itself a bare repository.
const BARE_PIECES: [&str; 9] = [
    "HEAD",
    "config",
    "description",
    "hooks",
    "info",
    "objects",
    "refs",
    "branches",
    "packed-refs",
];

/// Which of [`BARE_PIECES`] are at `root` now, and whether they make it a repository.
fn root_pieces(root: &Path) -> (Vec<&'static str>, bool) {
    let there: Vec<&'static str> = BARE_PIECES
        .into_iter()
        .filter(|name| std::fs::symlink_metadata(root.join(name)).is_ok())
        .collect();
    let repository = is_bare_repository(root, there.iter().map(std::ffi::OsString::from));
    (there, repository)
}

/// The output directories other toolmux runs keep in the temporary directories by default
/// (`toolmux-` and eight hex digits, the hash of their project's folder), hidden from
/// commands as this run's is: a command could otherwise read or rewrite other projects'
/// stored outputs. Read at each command (one folder listing each), those holding `root`
/// aside. This user's spill directory (`toolmux-fs-UID`) does not match: commands read
/// the full outputs saved there.
fn other_runs(root: &Path) -> Vec<PathBuf> {
    let mut temporary: Vec<PathBuf> = TEMPORARY.iter().map(PathBuf::from).collect();
    temporary.push(std::env::temp_dir());
    // `$TMPDIR` is usually `/tmp` again, not beside it: sorted first, so that each
    // directory found is hidden once, not under two stacked mounts.
    temporary.sort();
    temporary.dedup();
    let is_output_dir = |name: &std::ffi::OsStr| {
        name.to_str().and_then(|n| n.strip_prefix("toolmux-")).is_some_and(|hash| {
            hash.len() == 8
                && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    };
    temporary
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flat_map(|entries| entries.filter_map(Result::ok))
        .filter(|entry| is_output_dir(&entry.file_name()))
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .map(|entry| entry.path())
        .filter(|path| !root.starts_with(path))
        .collect()
}

/// The directories of the submodules `root/.gitmodules` lists (those beneath the root).
/// Their `.git` is a file naming their git directory inside `root/.git`: a command that
/// could rewrite it could point git at hooks of its own.
fn submodules(root: &Path) -> Vec<PathBuf> {
    // A regular file only, opened without waiting: a FIFO in its place held every command
    // here for ever. Git's own limit on the file is far below a mebibyte.
    let read = toolmux_core::regular::read_regular(&root.join(".gitmodules"), 1 << 20);
    let Ok(text) = read.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            if !key.trim().eq_ignore_ascii_case("path") {
                return None;
            }
            let value = value.trim().trim_matches('"');
            let relative = Path::new(value);
            let plain = relative.components().all(|c| matches!(c, std::path::Component::Normal(_)));
            (plain && !value.is_empty()).then(|| root.join(relative))
        })
        .collect()
}

/// Folders below the root that [`nested_repositories`] looks into, at most: the
/// repositories of a root that is none lie side by side at the first level, clones in
/// `vendor/` or `third_party/` at the second, Go's `src/github.com/owner/name` at the fourth.
const REPOSITORY_DEPTH: usize = 4;

/// Entries [`nested_repositories`] looks at, at most (a few milliseconds' worth).
const REPOSITORY_ENTRIES: usize = 20_000;

/// The `.git` of the repositories beneath `root` that are not its own nor submodules (a
/// clone in the workspace, or repositories side by side under a root that is none): their
/// hooks and settings run outside the sandbox at the user's next `git` command there (or
/// an editor's `git status`), as the root's would. Looked for once, when the sandbox is
/// made, level by level down to [`REPOSITORY_DEPTH`] folders below the root and at most
/// [`REPOSITORY_ENTRIES`] entries, so that the shallowest are found first and a large tree
/// costs the start no more than that; ignored folders are looked into too (a clone is often
/// ignored by the repository around it), a `.git` or a symlink is not. A repository a command
/// makes later is moved aside when it ends ([`Sandbox::command_ended`]).
fn nested_repositories(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut level = vec![root.to_path_buf()];
    let mut looked = 0usize;
    for _ in 0..=REPOSITORY_DEPTH {
        let mut next = Vec::new();
        for dir in &level {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries.filter_map(Result::ok) {
                looked += 1;
                if looked > REPOSITORY_ENTRIES {
                    tracing::warn!(
                        "looked for repositories beneath the workspace root in its first \
                         {REPOSITORY_ENTRIES} entries only: commands of `bash` and `exec` can \
                         write the `.git` of one found past them"
                    );
                    return found;
                }
                let Ok(kind) = entry.file_type() else { continue };
                if entry.file_name() == ".git" {
                    if dir != root {
                        found.push(entry.path());
                    }
                } else if kind.is_dir() {
                    next.push(entry.path());
                }
            }
        }
        level = next;
    }
    found
}

/// What the configuration asks for, in words, for error messages.
fn asked(config: &SandboxConfig) -> String {
    match (config.mode, config.network) {
        (Some(mode), true) => format!("the sandbox mode `{}`", mode.as_str()),
        (Some(mode), false) => {
            format!("the sandbox mode `{}` with `network: false`", mode.as_str())
        }
        (None, _) => "the sandbox's `network: false`".to_owned(),
    }
}

/// The sentence of the tool descriptions about the sandbox of `mode`; `sockets`: the
/// network is denied by the seccomp filter, not by Landlock alone.
fn describe(mode: SandboxMode, config: &SandboxConfig, sockets: bool) -> String {
    let extra: Vec<String> =
        config.writable_roots.iter().map(|p| format!("`{}`", p.display())).collect();
    let mut text = match mode {
        SandboxMode::Off => "NOT confined to the workspace: it can change anything the server's \
                             user can, so prefer the file tools for files."
            .to_owned(),
        SandboxMode::WorkspaceWrite => {
            let extra =
                if extra.is_empty() { String::new() } else { format!(", {}", extra.join(", ")) };
            format!(
                "Sandboxed (Linux Landlock): it may read anything but write only beneath the \
                 workspace root, /tmp{extra} and /dev/null; a write elsewhere fails with \
                 \"Permission denied\"."
            )
        }
        SandboxMode::ReadOnly => {
            let extra = if extra.is_empty() {
                String::new()
            } else {
                format!(" except beneath {}", extra.join(", "))
            };
            format!(
                "Sandboxed read-only (Linux Landlock): it may read anything but write no file \
                 (/dev/null aside){extra}, not even in the workspace root: writes fail with \
                 \"Permission denied\"; change files with the file tools."
            )
        }
    };
    if sockets {
        text.push_str(
            " It has no network: creating any socket but a Unix one fails with \"Permission \
             denied\" (TCP, UDP and DNS lookups included).",
        );
    } else if !config.network {
        text.push_str(" It may not open TCP connections or listen on TCP ports.");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `config` comes to on a kernel of Landlock ABI `abi` (0: none) without seccomp
    /// filters.
    fn plan(config: SandboxConfig, abi: u32) -> String {
        plan_with(config, abi, false)
    }

    /// What `config` comes to on a kernel of Landlock ABI `abi` (0: none), with seccomp
    /// filters when `seccomp`.
    fn plan_with(config: SandboxConfig, abi: u32, seccomp: bool) -> String {
        let probe = || if abi == 0 { Err("no Landlock here".to_owned()) } else { Ok(abi) };
        let filters = || if seccomp { Ok(()) } else { Err("no seccomp here".to_owned()) };
        let views = || Err("no user namespaces here".to_owned());
        let sandbox =
            Sandbox::for_kernel(&config, Path::new("/srv"), &[], probe, filters, views).unwrap();
        match sandbox.plan {
            Plan::Off => "off".to_owned(),
            Plan::Refused(reason) => format!("refused: {reason}"),
            Plan::Enforce(policy) => format!(
                "enforce ABI {}, writable {:?}, deny TCP {}{}",
                policy.abi,
                policy.writable.map(|w| w.len()),
                policy.deny_tcp,
                if policy.deny_sockets { ", Unix sockets only" } else { "" }
            ),
        }
    }

    #[test]
    fn git_and_the_protected_paths_beneath_a_writable_root_are_kept_read_only_or_hidden() {
        let landlock = || Ok(6);
        let seccomp = || Ok(());
        let kept =
            |path: &str, hidden| ServerPath { path: PathBuf::from(path), hidden, folder: false };
        let protected = [
            kept("/srv/toolmux.yaml", false),
            kept("/etc/toolmux.yaml", false),
            kept("/srv/out", true),
            kept("/var/audit.jsonl", true),
        ];
        let read_only = |config: SandboxConfig, views: Result<(), String>| {
            let sandbox = Sandbox::for_kernel(
                &config,
                Path::new("/srv"),
                &protected,
                landlock,
                seccomp,
                || views.clone(),
            )
            .unwrap();
            let Plan::Enforce(policy) = sandbox.plan else { panic!("{:?}", sandbox.plan) };
            let said = sandbox.description.contains("`.git` and the server's own files");
            assert_eq!(said, !policy.read_only.is_empty());
            (policy.read_only, policy.hidden)
        };
        // Hidden wherever they are: the default output directory is in `/tmp`.
        let hidden = vec![PathBuf::from("/srv/out"), PathBuf::from("/var/audit.jsonl")];
        let expected = vec![PathBuf::from("/srv/.git"), PathBuf::from("/srv/toolmux.yaml")];
        // What lies outside every writable root needs no read-only view.
        assert_eq!(read_only(SandboxConfig::default(), Ok(())), (expected, hidden.clone()));
        // No user namespaces: nothing, and the description does not promise it.
        let refused = Err("no user namespaces here".to_owned());
        assert_eq!(read_only(SandboxConfig::default(), refused), (vec![], vec![]));
        let off = SandboxConfig::default().with_protect_paths(false);
        assert_eq!(read_only(off, Ok(())), (vec![], vec![]));
        // Read-only mode: the root is not writable, so nothing beneath it needs a
        // read-only view; what is hidden still is.
        let read_only_mode = SandboxConfig::new(SandboxMode::ReadOnly);
        assert_eq!(read_only(read_only_mode, Ok(())), (vec![], hidden));
    }

    #[test]
    fn with_the_network_off_bound_unix_sockets_are_covered_where_views_can_be_made() {
        let asked = std::cell::Cell::new(0);
        let protected =
            [ServerPath { path: PathBuf::from("/srv/toolmux.yaml"), hidden: false, folder: false }];
        let covered = |config: SandboxConfig, views: Result<(), String>| {
            let probe = || {
                asked.set(asked.get() + 1);
                views.clone()
            };
            let sandbox = Sandbox::for_kernel(
                &config,
                Path::new("/srv"),
                &protected,
                || Ok(6),
                || Ok(()),
                probe,
            )
            .unwrap();
            let said = sandbox.description.contains("Unix sockets bound before it started");
            let Plan::Enforce(policy) = sandbox.plan else { panic!("{:?}", sandbox.plan) };
            assert_eq!(said, policy.hide_sockets, "{}", sandbox.description);
            policy.hide_sockets
        };
        let closed = || SandboxConfig::default().with_network(false);
        assert!(covered(closed(), Ok(())));
        assert_eq!(asked.get(), 1, "one probe answers for the views and the sockets");
        assert!(covered(closed().with_protect_paths(false), Ok(())));
        assert!(!covered(closed(), Err("no user namespaces here".to_owned())));
        assert!(!covered(SandboxConfig::default(), Ok(())), "the network allowed");
        // The filesystem unconfined: no Landlock would keep a command from unmounting them.
        assert!(!covered(SandboxConfig::new(SandboxMode::Off).with_network(false), Ok(())));
    }

    #[test]
    fn a_command_refused_on_entering_the_sandbox_is_told_what_to_switch_off() {
        let protected =
            [ServerPath { path: PathBuf::from("/srv/toolmux.yaml"), hidden: false, folder: false }];
        let sandbox = Sandbox::for_kernel(
            &SandboxConfig::default(),
            Path::new("/srv"),
            &protected,
            || Ok(6),
            || Ok(()),
            || Ok(()),
        )
        .unwrap();
        let refused = std::io::Error::from_raw_os_error(libc::EPERM);
        expect_test::expect![[r#"command `bash -c make` cannot run sandboxed: it did not start (Operation not permitted (os error 1)), which is how the kernel refuses the sandbox being entered; if it persists, set `fs.bash.sandbox.protectPaths: false` to run commands without the read-only views of `.git` and toolmux's files, or `fs.bash.sandbox: off`"#]]
            .assert_eq(&sandbox.spawn_failed("bash -c make".into(), refused).to_string());
        let missing = std::io::Error::from_raw_os_error(libc::ENOENT);
        let err = sandbox.spawn_failed("nope".into(), missing);
        assert!(matches!(err, FsError::Spawn { .. }), "{err}");
    }

    #[test]
    fn nested_repositories_are_found_shallowest_first_down_to_a_depth() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for repo in ["", "a", "vendor/lib", "b/c/d/e", "b/c/d/e/f", "too/deep/to/be/found"] {
            std::fs::create_dir_all(root.join(repo).join(".git/hooks")).unwrap();
        }
        // A submodule's or a worktree's `.git` is a file.
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
        let mut found = nested_repositories(root);
        found.sort();
        let expected: Vec<PathBuf> = ["a", "b/c/d/e", "sub", "vendor/lib"]
            .iter()
            .map(|r| root.join(r).join(".git"))
            .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn once_a_walk_was_cut_repositories_are_told_by_change_time() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("old/.git")).unwrap();
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        walks.cut.store(true, std::sync::atomic::Ordering::Relaxed);
        // No walk before the command once one was cut.
        let repositories = Repositories::before(root, walks.clone());
        assert!(repositories.before.is_empty() && !repositories.complete);
        std::fs::create_dir_all(root.join("new/deeper/.git")).unwrap();
        let (mut made, complete, _) = repositories.made(root);
        made.sort();
        assert!(complete);
        // Both changed within the second of slack and neither seen by a walk before: a
        // `.git` changed before the command is the user's.
        assert_eq!(made, [root.join("new/deeper/.git"), root.join("old/.git")]);
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        let after_both = Repositories { started: later, ..Repositories::before(root, walks) };
        assert_eq!(after_both.made(root), (vec![], true, vec![]));
    }

    #[test]
    fn a_known_repository_touched_during_a_command_after_a_cut_stays() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("old/.git")).unwrap();
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        // A first command, walked before and after, then a cut.
        let first = Repositories::before(root, walks.clone());
        assert!(first.complete);
        assert_eq!(first.made(root), (vec![], true, vec![]));
        walks.cut.store(true, std::sync::atomic::Ordering::Relaxed);
        let second = Repositories::before(root, walks);
        // Git writes inside the user's `.git` meanwhile (an index lock, a fetch): its
        // change time is after the command started.
        std::fs::write(root.join("old/.git/index.lock"), "").unwrap();
        std::fs::create_dir_all(root.join("new/.git")).unwrap();
        assert_eq!(second.made(root), (vec![root.join("new/.git")], true, vec![]));
    }

    /// A read of a running task walks the tree again only once ten times its last walk's
    /// length has passed (a walk of no length, at every read), or when that walk moved
    /// something aside.
    #[test]
    fn a_read_walks_again_only_when_the_walk_is_due() {
        let ended = std::time::Instant::now();
        let ms = std::time::Duration::from_millis;
        let last = |took, moved| LastWalk { ended, took, moved };
        let cases = [
            (None, ms(0), true),
            (Some(last(ms(100), false)), ms(0), false),
            (Some(last(ms(100), false)), ms(999), false),
            (Some(last(ms(100), false)), ms(1_000), true),
            (Some(last(ms(2_000), false)), ms(19_999), false),
            (Some(last(ms(2_000), false)), ms(20_000), true),
            (Some(last(ms(0), false)), ms(0), true),
            (Some(last(ms(100), true)), ms(0), true),
        ];
        for (last, after, due) in cases {
            assert_eq!(read_walks(last.as_ref(), ended + after), due, "{last:?} after {after:?}");
        }
    }

    /// A background task's check as its output is read passes over the walk until it is
    /// due, yet still moves aside toolmux's own files the task made; the end of a command
    /// or of the task always walks; and a read while another check of the task runs does
    /// nothing rather than wait.
    #[test]
    fn a_task_read_walks_only_when_due_and_an_end_always() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        let absent = Absent {
            missing: vec![root.join("toolmux.json")],
            root: root.to_owned(),
            repositories: Some(Repositories::before(root, walks)),
        };
        let checks = TaskChecks::default();
        let check = checks.watch(absent);
        let notes = |check: &TaskCheck| check.notes_from(0).0.join("\n");
        // A walk that took a minute, a moment ago, moving nothing.
        let slow = || LastWalk {
            ended: std::time::Instant::now(),
            took: std::time::Duration::from_secs(60),
            moved: false,
        };
        *check.last_walk.lock().unwrap() = Some(slow());
        std::fs::create_dir_all(root.join("sub/.git")).unwrap();
        std::fs::write(root.join("toolmux.json"), "{}").unwrap();
        check.run_now(CheckOccasion::Read);
        assert!(root.join("sub/.git").exists(), "{}", notes(&check));
        assert!(root.join("toolmux.json.rejected").exists(), "{}", notes(&check));
        assert!(!notes(&check).contains("sub/.git"), "{}", notes(&check));
        // Another command's end walks whatever the last walk took.
        check.run_now(CheckOccasion::CommandEnd);
        assert!(!root.join("sub/.git").exists() && root.join("sub/.git.rejected").exists());
        assert!(notes(&check).contains("`sub/.git` (moved to `sub/.git.rejected`)"));
        // That walk moved something: the next read walks.
        assert!(check.last_walk.lock().unwrap().is_some_and(|last| last.moved));
        std::fs::create_dir_all(root.join("next/.git")).unwrap();
        check.run_now(CheckOccasion::Read);
        assert!(!root.join("next/.git").exists(), "{}", notes(&check));
        // A walk of no length: every read walks.
        *check.last_walk.lock().unwrap() =
            Some(LastWalk { took: std::time::Duration::ZERO, ..slow() });
        std::fs::create_dir_all(root.join("cheap/.git")).unwrap();
        check.run_now(CheckOccasion::Read);
        assert!(!root.join("cheap/.git").exists(), "{}", notes(&check));
        // Another check under way: a read neither waits for it nor walks.
        std::fs::create_dir_all(root.join("busy/.git")).unwrap();
        let held = check.last_walk.lock().unwrap();
        check.run_now(CheckOccasion::Read);
        drop(held);
        assert!(root.join("busy/.git").exists(), "{}", notes(&check));
        // The task's end walks, however recent and slow the last walk, and is its last.
        *check.last_walk.lock().unwrap() = Some(slow());
        check.run_now(CheckOccasion::TaskEnd);
        assert!(!root.join("busy/.git").exists(), "{}", notes(&check));
        assert!(checks.running().is_empty());
    }

    /// A command's end with three background tasks running walks the tree once for them
    /// all, as does a task's end, where each task's check walked it on its own: each
    /// repository made is moved aside all the same, noted to the first that could have made
    /// it (the command, or the task that ended, then the others in the order they started),
    /// and the user's stays.
    #[test]
    fn one_walk_serves_every_running_task() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("user/.git")).unwrap();
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        let absent = || Absent {
            missing: Vec::new(),
            root: root.to_owned(),
            repositories: Some(Repositories::before(root, walks.clone())),
        };
        let walked = || walks.walked_after.load(std::sync::atomic::Ordering::Relaxed);
        let notes = |check: &TaskCheck| check.notes_from(0).0.join("\n");
        // Three tasks, each made a repository before the next started; then a command.
        let checks = TaskChecks::default();
        let mut tasks = Vec::new();
        for name in ["first", "second", "third"] {
            tasks.push(checks.watch(absent()));
            std::fs::create_dir_all(root.join(name).join(".git")).unwrap();
        }
        let command = absent();
        std::fs::create_dir_all(root.join("command/.git")).unwrap();
        let before = walked();
        let note =
            check_together(Some(&command), &checks.running_as(None, CheckOccasion::CommandEnd));
        assert_eq!(walked() - before, 1, "walks at the command's end");
        for name in ["first", "second", "third", "command"] {
            let git = root.join(name).join(".git");
            assert!(!git.exists() && root.join(name).join(".git.rejected").exists(), "{name}");
        }
        assert!(root.join("user/.git").exists());
        let note = note.unwrap_or_default();
        assert!(note.contains("`command/.git` (moved to `command/.git.rejected`)"), "{note}");
        assert!(!note.contains("first/") && !note.contains("third/"), "{note}");
        // The first task started before each was made: which task made which is not known.
        let first = notes(&tasks[0]);
        for name in ["first", "second", "third"] {
            let moved = format!("`{name}/.git` (moved to `{name}/.git.rejected`)");
            assert!(first.contains(&moved), "{first}");
        }
        assert!(!first.contains("command/.git"), "{first}");
        assert_eq!((notes(&tasks[1]), notes(&tasks[2])), (String::new(), String::new()));
        // The second task ends: its last check comes first, the others' with it.
        std::fs::create_dir_all(root.join("later/.git")).unwrap();
        let before = walked();
        let ended = checks.running_as(Some(&tasks[1]), CheckOccasion::CommandEnd);
        assert_eq!(check_together(None, &ended), None);
        assert_eq!(walked() - before, 1, "walks at a task's end");
        assert!(!root.join("later/.git").exists());
        assert!(notes(&tasks[1]).contains("`later/.git`"), "{}", notes(&tasks[1]));
        assert!(!notes(&tasks[0]).contains("later"), "{}", notes(&tasks[0]));
        assert_eq!(checks.running().len(), 2);
        // The tasks listed, the third's walk due and the first's not: one walk, which
        // judges both.
        *tasks[2].last_walk.lock().unwrap() = None;
        *tasks[0].last_walk.lock().unwrap() = Some(LastWalk {
            ended: std::time::Instant::now(),
            took: std::time::Duration::from_secs(60),
            moved: false,
        });
        std::fs::create_dir_all(root.join("listed/.git")).unwrap();
        let before = walked();
        check_together(None, &checks.running_as(None, CheckOccasion::Read));
        assert_eq!(walked() - before, 1, "walks as the tasks are listed");
        assert!(!root.join("listed/.git").exists() && root.join("user/.git").exists());
        assert!(notes(&tasks[0]).contains("`listed/.git`"), "{}", notes(&tasks[0]));
    }

    /// A repository a command makes at a root that is none (`git init`) is moved aside
    /// once: its `.git.rejected` looks like a bare repository, which the walk after the
    /// command took for another the command made and moved to `.git.rejected.rejected`.
    #[test]
    fn the_roots_own_git_moved_aside_is_not_moved_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        let absent = Absent {
            missing: vec![root.join(".git")],
            root: root.to_owned(),
            repositories: Some(Repositories::before(root, walks)),
        };
        // What `git init` makes, as far as telling a repository goes.
        std::fs::create_dir_all(root.join(".git/objects")).unwrap();
        std::fs::create_dir_all(root.join(".git/refs/heads")).unwrap();
        std::fs::write(root.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let note = check_together(Some(&absent), &[]).unwrap_or_default();
        assert!(note.contains("`.git` (moved to `.git.rejected`)"), "{note}");
        assert!(!note.contains(".git.rejected.rejected"), "{note}");
        assert!(root.join(".git.rejected/HEAD").is_file() && !root.join(".git").exists());
        // Nor by a later check.
        let later = Absent { missing: Vec::new(), ..absent };
        assert_eq!(check_together(Some(&later), &[]), None);
    }

    /// A folder is a bare repository as git tells one, not by the names of its entries
    /// alone.
    #[test]
    fn a_bare_repository_is_told_as_git_tells_one() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let folder = |name: &str, head: Option<&str>| {
            let dir = root.join(name);
            std::fs::create_dir_all(dir.join("objects")).unwrap();
            std::fs::create_dir_all(dir.join("refs")).unwrap();
            if let Some(head) = head {
                std::fs::write(dir.join("HEAD"), head).unwrap();
            }
            dir
        };
        let bare = |dir: &Path| {
            let names = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name());
            is_bare_repository(dir, names)
        };
        for (head, expected) in [
            ("ref: refs/heads/main\n", true),
            ("ref:refs/heads/main", true),
            ("ref: \t refs/heads/.invalid\n", true),
            (&format!("{}\n", "a".repeat(40)), true),
            (&"0123456789abcdef".repeat(4), true),
            ("hi\n", false),
            ("ref: heads/main\n", false),
            (&"a".repeat(39), false),
            ("", false),
        ] {
            let dir = folder("x", Some(head));
            assert_eq!(bare(&dir), expected, "HEAD {head:?}");
        }
        // No HEAD, a folder as HEAD, `objects` a file: none. A symlink HEAD into `refs/`, or
        // `objects` a symlink to a folder (git follows it): one.
        let dir = folder("none", None);
        assert!(!bare(&dir));
        std::fs::create_dir(dir.join("HEAD")).unwrap();
        assert!(!bare(&dir));
        let dir = folder("file", Some("ref: refs/heads/main\n"));
        std::fs::remove_dir(dir.join("objects")).unwrap();
        std::fs::write(dir.join("objects"), "").unwrap();
        assert!(!bare(&dir));
        let dir = folder("links", None);
        std::os::unix::fs::symlink("refs/heads/main", dir.join("HEAD")).unwrap();
        std::fs::remove_dir(dir.join("objects")).unwrap();
        std::fs::create_dir(root.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), dir.join("objects")).unwrap();
        assert!(bare(&dir));
        std::fs::remove_file(dir.join("HEAD")).unwrap();
        std::os::unix::fs::symlink("heads/main", dir.join("HEAD")).unwrap();
        assert!(!bare(&dir));
        // A FIFO as HEAD is none, told without waiting for a writer (opening it waited for
        // ever, and every later command with it).
        let dir = folder("fifo", None);
        toolmux_test_support::blocking::fifo(&dir, "HEAD");
        let told = toolmux_test_support::blocking::within_10s("a FIFO HEAD", move || bare(&dir));
        assert!(!told);
    }

    /// The root made a bare repository is told by its pieces, the walk aside: those the
    /// command made go, and a `HEAD` of the user's it rewrote; a root that was one stays.
    #[test]
    fn the_root_made_a_bare_repository_is_told() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("refs")).unwrap();
        std::fs::write(root.join("HEAD"), "the user's notes\n").unwrap();
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        let repositories = Repositories::before(root, walks.clone());
        std::fs::create_dir(root.join("objects")).unwrap();
        std::fs::write(root.join("config"), "[core]\n").unwrap();
        assert!(repositories.root_made_bare(root).is_empty(), "HEAD is no HEAD yet");
        std::fs::write(root.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        // Without `objects` it is none again: the user's `HEAD` stays.
        let made = repositories.root_made_bare(root);
        assert_eq!(made, [root.join("config"), root.join("objects")]);
        let already = Repositories::before(root, walks.clone());
        assert!(already.root_made_bare(root).is_empty());
        // Every piece there before, `HEAD` rewritten: it goes.
        std::fs::write(root.join("HEAD"), "the user's notes\n").unwrap();
        let repositories = Repositories::before(root, walks);
        std::fs::write(root.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        assert_eq!(repositories.root_made_bare(root), [root.join("HEAD")]);
    }

    /// Walks of `root` that keep their listings of folders changed before the walk (no
    /// settling time), and how many folders they have listed so far.
    fn listing_walks() -> (std::sync::Arc<RepositoryWalks>, impl Fn() -> usize) {
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        walks.listings.lock().unwrap().settle = std::time::Duration::ZERO;
        let counted = walks.clone();
        (walks, move || counted.listed.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Waits (ten seconds at most) until the file system's clock is past the change time of
    /// every folder beneath `root`, so that any change from now on gives its folder another.
    fn until_the_clock_moved_past(root: &Path) {
        use std::os::unix::fs::MetadataExt as _;
        let changed = |meta: std::fs::Metadata| (meta.ctime(), meta.ctime_nsec());
        let mut latest = changed(std::fs::symlink_metadata(root).unwrap());
        let mut folders = vec![root.to_owned()];
        while let Some(dir) = folders.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    latest = latest.max(changed(entry.metadata().unwrap()));
                    folders.push(entry.path());
                }
            }
        }
        // A file beside the root (same file system), whose change time is the clock's now.
        let clock = tempfile::NamedTempFile::new_in(root.parent().unwrap()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut mode = 0o600;
        loop {
            mode ^= 0o040;
            let permissions = std::os::unix::fs::PermissionsExt::from_mode(mode);
            std::fs::set_permissions(clock.path(), permissions).unwrap();
            if changed(std::fs::symlink_metadata(clock.path()).unwrap()) > latest {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the file system's clock stood still");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// A `.git` a command makes deep in a tree whose other folders did not change is found
    /// by listing that folder alone: the walks after the first use the listings of the
    /// folders unchanged since, and the user's repository stays.
    #[test]
    fn a_git_made_deep_in_an_unchanged_tree_is_found_by_listing_its_folder_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        for folder in ["a/b/c/d", "a/x", "e/f", "user/.git/objects"] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        until_the_clock_moved_past(&root);
        let (walks, listed) = listing_walks();
        // The first walk lists every folder but the user's `.git`: the root, a, a/b,
        // a/b/c, a/b/c/d, a/x, e, e/f and user.
        let first = Repositories::before(&root, walks.clone());
        assert_eq!((listed(), first.before.len()), (9, 1));
        assert_eq!(first.made(&root), (vec![], true, vec![]));
        let second = Repositories::before(&root, walks);
        assert_eq!(listed(), 9, "walks of an unchanged tree list nothing");
        std::fs::create_dir(root.join("a/b/c/d/.git")).unwrap();
        assert_eq!(second.made(&root), (vec![root.join("a/b/c/d/.git")], true, vec![]));
        assert_eq!(listed(), 10, "only a/b/c/d is listed again");
        assert!(root.join("user/.git").exists());
    }

    /// Folders a command makes are listed however unchanged those around them are, and so
    /// are folders it moves in: a repository inside either is found.
    #[test]
    fn a_folder_made_or_moved_in_during_a_command_is_listed_with_its_repository() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        for folder in ["a/b", "e/f", "g", "outside/prepared/.git"] {
            std::fs::create_dir_all(root.join(folder)).unwrap();
        }
        // Made beside the root, to be moved in.
        std::fs::rename(root.join("outside"), dir.path().join("outside")).unwrap();
        until_the_clock_moved_past(&root);
        let (walks, listed) = listing_walks();
        let repositories = Repositories::before(&root, walks);
        assert_eq!(listed(), 6);
        std::fs::create_dir_all(root.join("e/f/new/deeper/.git")).unwrap();
        std::fs::rename(dir.path().join("outside/prepared"), root.join("a/b/moved")).unwrap();
        // A folder swapped for a symlink is not followed.
        std::fs::create_dir_all(dir.path().join("elsewhere/.git")).unwrap();
        std::fs::remove_dir(root.join("g")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("g")).unwrap();
        let (mut made, complete, unchecked) = repositories.made(&root);
        made.sort();
        assert!(complete && unchecked.is_empty());
        assert_eq!(made, [root.join("a/b/moved/.git"), root.join("e/f/new/deeper/.git")]);
        // The root, a/b and e/f changed; a/b/moved, e/f/new and e/f/new/deeper are new.
        assert_eq!(listed(), 6 + 6);
    }

    /// A folder changed less than the settling time before a walk, in the same tick of the
    /// file system's clock as a change after it could be, is listed again by the next walk;
    /// so is one whose `HEAD`, `objects` and `refs` could make it a bare repository without
    /// any change to the folder (`HEAD` rewritten in place).
    #[test]
    fn folders_changed_lately_or_that_may_turn_bare_are_listed_at_every_walk() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("lately")).unwrap();
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        let repositories = Repositories::before(&root, walks.clone());
        let listed = || walks.listed.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(listed(), 2);
        assert_eq!(repositories.made(&root), (vec![], true, vec![]));
        assert_eq!(listed(), 4, "made within the settling time: listed again");
        let (walks, listed) = listing_walks();
        let mirror = root.join("lately/mirror");
        for folder in ["objects", "refs/heads"] {
            std::fs::create_dir_all(mirror.join(folder)).unwrap();
        }
        std::fs::write(mirror.join("HEAD"), "the user's notes\n").unwrap();
        until_the_clock_moved_past(&root);
        let repositories = Repositories::before(&root, walks);
        assert_eq!(listed(), 6, "root, lately, mirror, objects, refs and refs/heads");
        std::fs::write(mirror.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        assert_eq!(repositories.made(&root), (vec![mirror], true, vec![]));
        assert_eq!(listed(), 7, "the mirror alone, which is not walked into once bare");
    }

    #[test]
    fn a_folder_that_cannot_be_listed_is_checked_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let walks = std::sync::Arc::new(RepositoryWalks::default());
        let repositories = Repositories::before(root, walks);
        // What a command does: `git init -q sub; chmod 111 sub` (root lists it anyway, so
        // the probe fails listing it as it does for the user), a bare repository, and a
        // folder whose entries cannot even be looked up.
        std::fs::create_dir_all(root.join("sub/.git/hooks")).unwrap();
        std::fs::create_dir_all(root.join("mirror/objects")).unwrap();
        std::fs::create_dir_all(root.join("mirror/refs/heads")).unwrap();
        std::fs::write(root.join("mirror/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::create_dir_all(root.join("locked/inner")).unwrap();
        let probe = GitProbe {
            list: |dir| {
                if dir.ends_with("sub") || dir.ends_with("locked") {
                    Err(std::io::ErrorKind::PermissionDenied.into())
                } else {
                    std::fs::read_dir(dir)
                }
            },
            lstat: |path| {
                if path.parent().is_some_and(|p| p.ends_with("locked")) {
                    Err(std::io::ErrorKind::PermissionDenied.into())
                } else {
                    std::fs::symlink_metadata(path)
                }
            },
        };
        let (mut made, complete, unchecked) = repositories.made_in(root, &probe);
        made.sort();
        assert_eq!(made, [root.join("mirror"), root.join("sub/.git")]);
        // Not cut for time, but with a folder it could not check.
        assert!(complete);
        assert_eq!(unchecked, [root.join("locked")]);
    }

    #[test]
    fn another_runs_output_directory_is_hidden_once() {
        // `$TMPDIR` is usually `/tmp`, listed in `TEMPORARY` too but not next to it.
        let temporary = std::env::temp_dir();
        let name = format!("toolmux-{:08x}", std::process::id() ^ 0x5a5a_5a5a);
        let dir = temporary.join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let found = other_runs(Path::new("/nowhere/project"));
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(found.iter().filter(|p| **p == dir).count(), 1, "{} listed", dir.display());
    }

    #[test]
    fn submodules_are_read_from_gitmodules() {
        let dir = tempfile::tempdir().unwrap();
        assert!(submodules(dir.path()).is_empty());
        let text = "[submodule \"a\"]\n\tpath = vendor/a\n\turl = ../a\n[submodule \"b\"]\n\
                    Path=\"b\"\n[submodule \"c\"]\n\tpath = ../outside\n";
        std::fs::write(dir.path().join(".gitmodules"), text).unwrap();
        assert_eq!(submodules(dir.path()), [dir.path().join("vendor/a"), dir.path().join("b")]);
        // A FIFO in its place (`mkfifo .gitmodules`) is none, told without waiting.
        std::fs::remove_file(dir.path().join(".gitmodules")).unwrap();
        toolmux_test_support::blocking::fifo(dir.path(), ".gitmodules");
        let root = dir.path().to_path_buf();
        let found = toolmux_test_support::blocking::within_10s("a FIFO .gitmodules", move || {
            submodules(&root)
        });
        assert!(found.is_empty());
    }

    #[test]
    fn a_seccomp_filter_denies_every_socket_but_unix_when_the_network_is_off() {
        let no_network = || SandboxConfig::default().with_network(false);
        let writable = 3 + usize::from(std::env::temp_dir() != Path::new("/tmp"));
        assert_eq!(
            plan_with(no_network(), 6, true),
            format!("enforce ABI 6, writable Some({writable}), deny TCP true, Unix sockets only")
        );
        // Landlock without network rights: the filter alone denies the network.
        assert_eq!(
            plan_with(no_network(), 3, true),
            format!("enforce ABI 3, writable Some({writable}), deny TCP false, Unix sockets only")
        );
        // No Landlock: the network is still denied (with a warning that the filesystem is
        // not confined), unless a filesystem mode was asked for explicitly.
        assert_eq!(
            plan_with(no_network(), 0, true),
            "enforce ABI 0, writable None, deny TCP false, Unix sockets only"
        );
        let network_only = SandboxConfig::new(SandboxMode::Off).with_network(false);
        assert_eq!(
            plan_with(network_only, 0, true),
            "enforce ABI 0, writable None, deny TCP false, Unix sockets only"
        );
        let explicit = SandboxConfig::new(SandboxMode::WorkspaceWrite).with_network(false);
        assert!(plan_with(explicit, 0, true).starts_with("refused: the sandbox mode"));
        // The network allowed: no filter.
        assert_eq!(
            plan_with(SandboxConfig::default(), 6, true),
            format!("enforce ABI 6, writable Some({writable}), deny TCP false")
        );
        let config = SandboxConfig::new(SandboxMode::Off).with_network(false);
        expect_test::expect![[r#"NOT confined to the workspace: it can change anything the server's user can, so prefer the file tools for files. It has no network: creating any socket but a Unix one fails with "Permission denied" (TCP, UDP and DNS lookups included)."#]]
            .assert_eq(&describe(SandboxMode::Off, &config, true));
    }

    #[test]
    fn the_default_sandbox_is_on_where_the_kernel_can_and_off_where_it_cannot() {
        let default = SandboxConfig::default;
        let writable = 3 + usize::from(std::env::temp_dir() != Path::new("/tmp"));
        assert_eq!(
            plan(default(), 7),
            format!("enforce ABI 7, writable Some({writable}), deny TCP false")
        );
        // Partial (no truncation rule) yet better than nothing, with a warning.
        assert_eq!(
            plan(default(), 1),
            format!("enforce ABI 1, writable Some({writable}), deny TCP false")
        );
        assert_eq!(plan(default(), 0), "off");
    }

    #[test]
    fn what_was_asked_explicitly_is_enforced_fully_or_refused() {
        let read_only = || SandboxConfig::new(SandboxMode::ReadOnly);
        assert_eq!(plan(read_only(), 3), "enforce ABI 3, writable Some(0), deny TCP false");
        expect_test::expect![[r#"refused: the sandbox mode `readOnly` cannot be enforced: no Landlock here; set `fs.bash.sandbox: off` in the configuration (`BashConfig::sandbox`) to run commands unconfined"#]]
            .assert_eq(&plan(read_only(), 0));
        expect_test::expect![[r#"refused: sandbox mode `readOnly` needs Landlock ABI 3 (Linux 6.2) to confine truncation as well as writes, and this kernel has ABI 2; set `fs.bash.sandbox: off` in the configuration (`BashConfig::sandbox`) to run commands unconfined"#]]
            .assert_eq(&plan(read_only(), 2));
        let no_network = || SandboxConfig::default().with_network(false);
        assert_eq!(plan(no_network(), 4).split(',').next(), Some("enforce ABI 4"));
        expect_test::expect![[r#"refused: `network: false` needs Landlock ABI 4 (Linux 6.7) to deny TCP, and this kernel has ABI 3; allow the network (`fs.bash.sandbox.network: true`) or set `fs.bash.sandbox: off` in the configuration (`BashConfig::sandbox`) to run commands unconfined"#]]
            .assert_eq(&plan(no_network(), 3));
        expect_test::expect![[r#"refused: the sandbox's `network: false` cannot be enforced: no Landlock here; set `fs.bash.sandbox: off` in the configuration (`BashConfig::sandbox`) to run commands unconfined"#]]
            .assert_eq(&plan(no_network(), 0));
        // Only the network, the filesystem unconfined.
        let network_only = SandboxConfig::new(SandboxMode::Off).with_network(false);
        assert_eq!(plan(network_only, 4), "enforce ABI 4, writable None, deny TCP true");
    }

    #[test]
    fn relative_writable_roots_are_refused() {
        let config = SandboxConfig::default().with_writable_roots(["cache"]);
        let err = Sandbox::new(&config, Path::new("/srv"), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid fs configuration: `bash.sandbox.writableRoots` entry `cache` is not an \
             absolute path; give it absolute"
        );
    }

    #[test]
    fn off_with_the_network_allowed_is_no_sandbox() {
        let sandbox = Sandbox::new(&SandboxConfig::new(SandboxMode::Off), Path::new("/srv"), &[]);
        let sandbox = sandbox.unwrap();
        assert!(matches!(sandbox.plan, Plan::Off));
        assert!(sandbox.description().starts_with("NOT confined"));
    }

    #[test]
    fn descriptions_name_the_writable_places() {
        let config = SandboxConfig::new(SandboxMode::WorkspaceWrite)
            .with_network(false)
            .with_writable_roots(["/opt/cache"]);
        assert_eq!(
            describe(SandboxMode::WorkspaceWrite, &config, false),
            "Sandboxed (Linux Landlock): it may read anything but write only beneath the \
             workspace root, /tmp, `/opt/cache` and /dev/null; a write elsewhere fails with \
             \"Permission denied\". It may not open TCP connections or listen on TCP ports."
        );
        assert_eq!(
            describe(SandboxMode::ReadOnly, &SandboxConfig::new(SandboxMode::ReadOnly), false),
            "Sandboxed read-only (Linux Landlock): it may read anything but write no file \
             (/dev/null aside), not even in the workspace root: writes fail with \"Permission \
             denied\"; change files with the file tools."
        );
    }
}
