//! Read-only views of protected paths for a confined command (and hidden ones of what the
//! file tools may not even read): Landlock grants writes to
//! whole hierarchies, so a command allowed to write the root could rewrite `.git` (its
//! hooks run commands outside any sandbox at the user's next commit) or toolmux's own
//! configuration (which the next start runs). The child, before Landlock, enters a user
//! and mount namespace of its own, where each such path is bind-mounted onto itself read
//! only; Landlock then forbids it to change mounts, so it cannot undo them.
//!
//! A mount point cannot be renamed or removed, but a directory above one can, and the
//! mount moves with it: a command could move the directory holding a protected file away
//! and put a file of its own in its place. So every directory above a protected path that
//! the command could rename (its parent is writable) is made a mount point too, by a bind
//! mount onto itself that changes nothing else. The command's working directory is entered
//! again afterwards, so that relative paths lead through the new mounts.
//!
//! With `network: false`, the pathname Unix sockets bound when the command starts (read
//! from `/proc/net/unix`) are covered by `/dev/null` too: connecting to one is no write
//! and no network right, so neither Landlock nor the seccomp filter sees it, and a Docker
//! daemon's socket is root on the host. A socket the command binds itself is not covered.
//!
//! Everything the child does is a raw system call on memory prepared by the parent, as
//! `pre_exec` requires. Kernels or policies that refuse unprivileged user namespaces
//! (Ubuntu's AppArmor restriction, `user.max_user_namespaces = 0`) are found by a probe,
//! once per process, in a forked child; the sandbox then goes without the views, says so
//! in a warning, and its description does not promise them.

// `unshare`, `mount`, `fork` and the writes of the id maps have no safe wrapper; every
// `unsafe` block says why it holds.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_ulong};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The read-only views one command gets, prepared in the parent.
#[derive(Debug)]
pub(super) struct ReadOnlyViews {
    /// `"<uid> <uid> 1\n"` and the same for the gid: the command keeps its own ids.
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// Directories above the views made mount points (outermost first), so that none can
    /// be renamed.
    pins: Vec<CString>,
    views: Vec<View>,
    /// The command's working directory, entered again once the mounts are made.
    cwd: Option<CString>,
}

#[derive(Debug)]
struct View {
    path: CString,
    kind: ViewKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ViewKind {
    /// Bound onto itself read-only, keeping the flags of the mount the path is on that a
    /// remount in a user namespace must repeat (the kernel locks them: `EPERM` otherwise).
    ReadOnly { kept: c_ulong },
    /// A directory covered by an empty read-only tmpfs.
    HiddenDirectory,
    /// A file covered by `/dev/null`.
    HiddenFile,
    /// A Unix socket covered by `/dev/null` (connecting then fails with `ECONNREFUSED`);
    /// one gone, or in a directory the command may not search, is passed over.
    HiddenSocket,
}

impl ReadOnlyViews {
    /// Views of those of `read_only` and `hidden` that exist (absolute paths; symlinks are
    /// not followed, a protected path that is one is left as it is), pinned below the
    /// `writable` roots, and of the `sockets` (see [`bound_sockets`]), for a command that
    /// starts in `cwd`.
    pub(super) fn prepare(
        read_only: &[PathBuf],
        hidden: &[PathBuf],
        sockets: &[PathBuf],
        writable: &[PathBuf],
        cwd: Option<&Path>,
    ) -> ReadOnlyViews {
        let exists = |path: &&PathBuf| {
            path.is_absolute()
                && std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_symlink())
        };
        let mut existing: Vec<(&PathBuf, bool)> = read_only
            .iter()
            .filter(exists)
            .map(|p| (p, false))
            .chain(hidden.iter().filter(exists).map(|p| (p, true)))
            .collect();
        // Outer paths first: a view inside a read-only one is mounted after it; one inside
        // a hidden directory is not there to mount (and is hidden with it).
        existing.sort();
        // Looked up by ancestor, not compared with each: a long-lived machine's `/tmp` holds
        // hundreds of other runs' output directories, and comparing each with the others
        // before it cost milliseconds per command.
        let mut covered: std::collections::HashSet<&Path> = std::collections::HashSet::new();
        existing.retain(|(path, hide)| {
            if path.ancestors().skip(1).any(|dir| covered.contains(dir)) {
                return false;
            }
            if *hide && path.is_dir() {
                covered.insert(path);
            }
            true
        });
        let renamable =
            |dir: &Path| dir.parent().is_some_and(|p| writable.iter().any(|r| p.starts_with(r)));
        // Sorted by components, so a directory comes before those beneath it.
        let pins: std::collections::BTreeSet<&Path> = existing
            .iter()
            .flat_map(|(path, _)| path.ancestors().skip(1))
            .filter(|dir| renamable(dir))
            .collect();
        let c_path = |path: &Path| CString::new(path.as_os_str().as_bytes()).ok();
        let mut views: Vec<View> = existing
            .iter()
            .filter_map(|&(path, hide)| {
                let kind = match (hide, path.is_dir()) {
                    (false, _) => ViewKind::ReadOnly { kept: kept_flags(path).ok()? },
                    (true, true) => ViewKind::HiddenDirectory,
                    (true, false) => ViewKind::HiddenFile,
                };
                Some(View { path: c_path(path)?, kind })
            })
            .collect();
        // No pins for sockets: a socket's directory moved away takes its cover along.
        let sockets = sockets.iter().filter_map(|path| c_path(path));
        views.extend(sockets.map(|path| View { path, kind: ViewKind::HiddenSocket }));
        // SAFETY: getuid and getgid cannot fail and take no pointers.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let pins = if views.iter().all(|v| v.kind == ViewKind::HiddenSocket) {
            Vec::new()
        } else {
            pins.into_iter().filter_map(c_path).collect()
        };
        ReadOnlyViews {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            pins,
            views,
            cwd: cwd.and_then(c_path),
        }
    }

    /// Whether there is nothing to make read-only.
    pub(super) fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    /// Enters a new user and mount namespace and makes every view read-only there. Runs in
    /// the child between fork and exec: system calls only, no allocation.
    pub(super) fn enter(&self) -> io::Result<()> {
        // SAFETY: unshare takes no pointers.
        check(unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) })?;
        write_file(c"/proc/self/setgroups", b"deny")?;
        write_file(c"/proc/self/uid_map", &self.uid_map)?;
        write_file(c"/proc/self/gid_map", &self.gid_map)?;
        // Nothing done here propagates back to the parent's namespace.
        mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE)?;
        for pin in &self.pins {
            mount(Some(pin), pin, None, libc::MS_BIND | libc::MS_REC)?;
        }
        // The first hidden directory's empty tmpfs, bound onto the others: cheaper than a
        // tmpfs each where hundreds of other runs' output directories are hidden.
        let mut empty: Option<&CStr> = None;
        for view in &self.views {
            let path = &view.path;
            match view.kind {
                ViewKind::ReadOnly { kept } => {
                    mount(Some(path), path, None, libc::MS_BIND | libc::MS_REC)?;
                    let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | kept;
                    mount(None, path, None, flags)?;
                }
                // One removed since it was found (another run's output directory in `/tmp`,
                // gone with its run) has nothing left to hide.
                ViewKind::HiddenDirectory => {
                    let made = match empty {
                        Some(empty) => mount(Some(empty), path, None, libc::MS_BIND),
                        None => {
                            let flags = libc::MS_RDONLY
                                | libc::MS_NOSUID
                                | libc::MS_NODEV
                                | libc::MS_NOEXEC;
                            mount(Some(c"tmpfs"), path, Some(c"tmpfs"), flags)
                        }
                    };
                    match made {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                        Err(e) => return Err(e),
                        Ok(()) => empty = empty.or(Some(path.as_c_str())),
                    }
                }
                // Writes go nowhere; reads find nothing.
                ViewKind::HiddenFile => {
                    match mount(Some(c"/dev/null"), path, None, libc::MS_BIND) {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                        done => done?,
                    }
                }
                ViewKind::HiddenSocket => {
                    match mount(Some(c"/dev/null"), path, None, libc::MS_BIND) {
                        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EACCES)) => {
                        }
                        done => done?,
                    }
                }
            }
        }
        if let Some(cwd) = &self.cwd {
            // SAFETY: `cwd` is a valid C string.
            check(unsafe { libc::chdir(cwd.as_ptr()) })?;
        }
        Ok(())
    }
}

/// The pathname Unix sockets bound in this network namespace now, by `/proc/net/unix`,
/// that this process may connect to: those whose path is absolute and is a socket here (a path another mount namespace bound,
/// a container's, is passed over unless a socket is there too). Nothing when the file
/// cannot be read.
pub(super) fn bound_sockets() -> Vec<PathBuf> {
    let table = std::fs::read("/proc/net/unix").unwrap_or_default();
    let mut sockets: Vec<PathBuf> = table
        .split(|&b| b == b'\n')
        .skip(1)
        .filter_map(socket_path)
        .filter(|path| {
            use std::os::unix::fs::FileTypeExt as _;
            std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
                && may_connect(path)
        })
        .collect();
    sockets.sort();
    sockets.dedup();
    sockets
}

/// Whether this process may connect to the socket at `path`: connecting needs write
/// permission on it (and search on the directories above), so one it may not write needs
/// no cover (most of a desktop's are root's, of mode 0600 or 0755).
fn may_connect(path: &Path) -> bool {
    let Ok(path) = CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: `path` is a valid C string; `access` reads it and nothing else.
    unsafe { libc::access(path.as_ptr(), libc::W_OK) == 0 }
}

/// The path of one line of `/proc/net/unix` (`Num RefCount Protocol Flags Type St Inode
/// Path`): the rest of the line after the seventh field, when it is absolute (unnamed and
/// abstract sockets have none, or one starting with `@`; a socket bound by a relative path
/// shows it as given, which leads nowhere from here).
fn socket_path(line: &[u8]) -> Option<PathBuf> {
    let mut rest = line;
    for _ in 0..7 {
        let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
        let field = &rest[start..];
        let end = field.iter().position(u8::is_ascii_whitespace)?;
        rest = &field[end..];
    }
    let path = &rest[rest.iter().position(|b| !b.is_ascii_whitespace())?..];
    path.starts_with(b"/").then(|| PathBuf::from(std::ffi::OsStr::from_bytes(path)))
}

/// Whether this kernel lets this process make read-only views: probed once, by a forked
/// child that makes one of the temporary directory; the error says why not.
pub(super) fn available() -> Result<(), String> {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    AVAILABLE.get_or_init(|| probe(&std::env::temp_dir())).clone()
}

fn probe(probe_dir: &Path) -> Result<(), String> {
    let views = ReadOnlyViews::prepare(&[probe_dir.to_path_buf()], &[], &[], &[], None);
    if views.is_empty() {
        return Err(format!("cannot probe with `{}`", probe_dir.display()));
    }
    // SAFETY: the child makes system calls only (no allocation, no lock: `enter` is
    // written for a forked child) and leaves by `_exit`; the parent reaps it below.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = match views.enter() {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(255).clamp(1, 255),
        };
        // SAFETY: `_exit` ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    if pid < 0 {
        return Err(format!("cannot fork to probe: {}", io::Error::last_os_error()));
    }
    let mut status = 0;
    loop {
        // SAFETY: `status` lives across the call; `pid` is the child forked above.
        let reaped = unsafe { libc::waitpid(pid, &raw mut status, 0) };
        if reaped == pid {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(format!("cannot wait for the probe: {err}"));
        }
    }
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, errno) => Err(format!(
            "this kernel refuses a user and mount namespace to this user ({})",
            io::Error::from_raw_os_error(errno)
        )),
        _ => Err("the probe of user namespaces was killed".to_owned()),
    }
}

/// The flags of the mount `path` is on that a remount in a user namespace must repeat.
fn kept_flags(path: &Path) -> io::Result<c_ulong> {
    let stat = rustix::fs::statvfs(path)?;
    let mount = stat.f_flag;
    let pairs = [
        (rustix::fs::StatVfsMountFlags::NOSUID, libc::MS_NOSUID),
        (rustix::fs::StatVfsMountFlags::NODEV, libc::MS_NODEV),
        (rustix::fs::StatVfsMountFlags::NOEXEC, libc::MS_NOEXEC),
        (rustix::fs::StatVfsMountFlags::NOATIME, libc::MS_NOATIME),
        (rustix::fs::StatVfsMountFlags::NODIRATIME, libc::MS_NODIRATIME),
        (rustix::fs::StatVfsMountFlags::RELATIME, libc::MS_RELATIME),
    ];
    Ok(pairs.iter().filter(|(flag, _)| mount.contains(*flag)).fold(0, |all, (_, ms)| all | ms))
}

fn check(done: libc::c_int) -> io::Result<()> {
    if done != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Writes `bytes` to the file at `path` (a `/proc` file of the calling process).
fn write_file(path: &CStr, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is a valid C string; the flags take no pointers.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `bytes` is valid for its length; `fd` was just opened.
    let written = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    if written != bytes.len() as isize {
        return Err(err);
    }
    Ok(())
}

/// `mount(source, target, fstype, flags, NULL)`.
fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: c_ulong,
) -> io::Result<()> {
    let source = source.map_or(std::ptr::null(), CStr::as_ptr);
    let fstype = fstype.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: `source` and `fstype` are null or valid C strings, `target` is one; no data
    // is given.
    check(unsafe { libc::mount(source, target.as_ptr(), fstype, flags, std::ptr::null()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_are_read_from_proc_net_unix_lines() {
        let path = |line: &str| socket_path(line.as_bytes());
        let header = "Num       RefCount Protocol Flags    Type St Inode Path";
        assert_eq!(path(header), None);
        assert_eq!(path("000000000d6ee0cf: 00000003 00000000 00000000 0001 03  1063"), None);
        let abstract_name =
            "0000000011: 00000002 00000000 00010000 0001 01 20385 @/tmp/.X11-unix/X0";
        assert_eq!(path(abstract_name), None);
        let relative = "0000000012: 00000002 00000000 00010000 0001 01 20386 run/x.sock";
        assert_eq!(path(relative), None);
        let docker = "0000000013: 00000002 00000000 00010000 0001 01 20387 /run/docker.sock";
        assert_eq!(path(docker), Some(PathBuf::from("/run/docker.sock")));
        let spaced = "0000000014: 00000002 00000000 00000000 0002 01     9 /tmp/a dir/log sock";
        assert_eq!(path(spaced), Some(PathBuf::from("/tmp/a dir/log sock")));
    }

    #[test]
    fn bound_sockets_are_those_that_are_sockets_here() {
        let dir = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(dir.path()).unwrap();
        let listening = dir.join("listening.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&listening).unwrap();
        let gone = dir.join("gone.sock");
        drop(std::os::unix::net::UnixListener::bind(&gone).unwrap());
        std::fs::remove_file(&gone).unwrap();
        std::fs::write(&gone, "a file now").unwrap();
        let found = bound_sockets();
        assert!(found.contains(&listening), "{found:?}");
        assert!(!found.contains(&gone), "{found:?}");
    }
}
