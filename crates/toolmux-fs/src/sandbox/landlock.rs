//! A small Landlock binding: the ABI probe, a ruleset built in the parent, and the system
//! calls the child makes before it executes (with the seccomp filter, when there is one).
//!
//! Hand-written over `libc::syscall` rather than the `landlock` crate: three system
//! calls and two structures are all it takes, and the child side must stay
//! async-signal-safe (no allocation, no lock), which is easiest to see in twenty lines.
//! See `Documentation/userspace-api/landlock.rst` of the kernel for the interface.

// The system calls have no safe wrapper in `libc` or `rustix`, and `pre_exec` is unsafe by
// nature; every `unsafe` block says why it holds.
#![allow(unsafe_code)]

use super::Policy;
use super::mounts::ReadOnlyViews;
use super::seccomp::Filter;
use rustix::fs::{FileType, Mode, OFlags};
use std::ffi::{c_int, c_uint, c_ulong, c_void};
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;

/// `LANDLOCK_CREATE_RULESET_VERSION`: ask for the ABI version instead of a ruleset.
const CREATE_RULESET_VERSION: c_uint = 1 << 0;
/// `LANDLOCK_RULE_PATH_BENEATH`.
const RULE_PATH_BENEATH: c_int = 1;

// Filesystem access rights (`LANDLOCK_ACCESS_FS_*`), with the ABI that brought them.
const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
/// ABI 1 knows the thirteen rights from `EXECUTE` to `MAKE_SYM`.
const FS_ABI1: u64 = (1 << 13) - 1;
/// ABI 2. Moving or linking a file to another directory is denied by every ruleset of a
/// kernel that knows this right unless it is granted, handled or not.
const FS_REFER: u64 = 1 << 13;
/// ABI 3: `truncate(2)`, `ftruncate(2)` and `open(O_TRUNC)`.
const FS_TRUNCATE: u64 = 1 << 14;
/// ABI 5: `ioctl(2)` on device files opened in the sandbox.
const FS_IOCTL_DEV: u64 = 1 << 15;
/// The rights a rule on a file that is not a directory may carry (others: `EINVAL`).
const FS_FILE_RIGHTS: u64 = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV;
/// What every path gets: reading and executing.
const FS_READ: u64 = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR;
/// What the writable devices get.
const FS_DEVICE: u64 = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV;

// Network access rights (`LANDLOCK_ACCESS_NET_*`), ABI 4.
const NET_BIND_TCP: u64 = 1 << 0;
const NET_CONNECT_TCP: u64 = 1 << 1;

// Scopes (`LANDLOCK_SCOPE_*`), ABI 6.
/// Connecting to an abstract Unix socket created outside the sandbox.
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// Sending a signal to a process outside the sandbox.
const SCOPE_SIGNAL: u64 = 1 << 1;
/// What a confined command is kept to where the kernel can (ABI 6).
pub(super) const SCOPES: u64 = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL;

/// `struct landlock_ruleset_attr` up to `scoped` (ABI 6); older kernels are given the
/// shorter prefix they know.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `struct landlock_path_beneath_attr`, packed as in the kernel's header.
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The running kernel's Landlock ABI version, probed once per process; the error says
/// why there is none.
pub(super) fn abi() -> Result<u32, String> {
    static ABI: OnceLock<Result<u32, String>> = OnceLock::new();
    ABI.get_or_init(probe).clone()
}

fn probe() -> Result<u32, String> {
    // SAFETY: with a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION the call
    // only returns the ABI version; no memory is read or written.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<c_void>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if version >= 1 {
        return u32::try_from(version).map_err(|_| format!("Landlock ABI {version} is unknown"));
    }
    let err = io::Error::last_os_error();
    Err(match err.raw_os_error() {
        Some(libc::ENOSYS) => "this kernel has no Landlock (it needs Linux 5.13 or later built \
                               with CONFIG_SECURITY_LANDLOCK)"
            .to_owned(),
        Some(libc::EOPNOTSUPP) => "Landlock is disabled on this kernel (add `landlock` to the \
                                   `lsm=` boot parameter)"
            .to_owned(),
        _ => format!("probing Landlock failed: {err}"),
    })
}

/// The filesystem rights a kernel of ABI `abi` knows.
fn fs_rights(abi: u32) -> u64 {
    let mut rights = FS_ABI1;
    if abi >= 2 {
        rights |= FS_REFER;
    }
    if abi >= 3 {
        rights |= FS_TRUNCATE;
    }
    if abi >= 5 {
        rights |= FS_IOCTL_DEV;
    }
    rights
}

/// A Landlock ruleset, ready for a child to restrict itself with.
#[derive(Debug)]
pub(super) struct Ruleset {
    // Invariant: opened `O_CLOEXEC` by the kernel, so a child executes without it and
    // children spawned concurrently never inherit it.
    fd: OwnedFd,
}

impl Ruleset {
    /// The ruleset of `policy`: read everywhere, write beneath its roots and devices, TCP
    /// denied when it says so. Roots and devices that do not exist are skipped.
    pub(super) fn build(policy: &Policy) -> Result<Ruleset, String> {
        let handled_fs = if policy.writable.is_some() { fs_rights(policy.abi) } else { 0 };
        let handled_net = if policy.deny_tcp { NET_BIND_TCP | NET_CONNECT_TCP } else { 0 };
        let attr = RulesetAttr {
            handled_access_fs: handled_fs,
            handled_access_net: handled_net,
            scoped: policy.scoped,
        };
        let size = match policy.abi {
            6.. => size_of::<RulesetAttr>(),
            // Kernels before ABI 6 know no `scoped`, before ABI 4 only `handled_access_fs`.
            4 | 5 => 2 * size_of::<u64>(),
            _ => size_of::<u64>(),
        };
        // SAFETY: `attr` is a valid `landlock_ruleset_attr` of at least `size` bytes that
        // lives across the call; the kernel only reads it.
        let fd = unsafe {
            libc::syscall(libc::SYS_landlock_create_ruleset, &raw const attr, size, 0 as c_uint)
        };
        if fd < 0 {
            return Err(format!("landlock_create_ruleset: {}", io::Error::last_os_error()));
        }
        let fd =
            RawFd::try_from(fd).map_err(|_| format!("landlock_create_ruleset returned {fd}"))?;
        // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
        let ruleset = Ruleset { fd: unsafe { OwnedFd::from_raw_fd(fd) } };
        let Some(writable) = &policy.writable else { return Ok(ruleset) };
        ruleset.allow(Path::new("/"), FS_READ & handled_fs)?;
        for root in writable {
            ruleset.allow(root, handled_fs)?;
        }
        for device in policy.devices {
            ruleset.allow(Path::new(device), FS_DEVICE & handled_fs)?;
        }
        Ok(ruleset)
    }

    /// Grants `access` beneath `path` (only the file rights when it is not a directory);
    /// a path that does not exist is skipped.
    fn allow(&self, path: &Path, access: u64) -> Result<(), String> {
        let opened = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty());
        let parent = match opened {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => {
                tracing::debug!(path = %path.display(), "sandbox: no such path, not granted");
                return Ok(());
            }
            Err(e) => return Err(format!("`{}`: {}", path.display(), io::Error::from(e))),
        };
        let stat = rustix::fs::fstat(&parent)
            .map_err(|e| format!("`{}`: {}", path.display(), io::Error::from(e)))?;
        let access = if FileType::from_raw_mode(stat.st_mode).is_dir() {
            access
        } else {
            access & FS_FILE_RIGHTS
        };
        if access == 0 {
            return Ok(());
        }
        let attr = PathBeneathAttr { allowed_access: access, parent_fd: parent.as_raw_fd() };
        // SAFETY: `attr` is a valid, packed `landlock_path_beneath_attr` that lives across
        // the call; both descriptors are open.
        let done = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.fd.as_raw_fd(),
                RULE_PATH_BENEATH,
                &raw const attr,
                0 as c_uint,
            )
        };
        if done != 0 {
            return Err(format!(
                "landlock_add_rule on `{}`: {}",
                path.display(),
                io::Error::last_os_error()
            ));
        }
        Ok(())
    }
}

/// Makes the child of `command` restrict itself before it executes: `no_new_privs`, then
/// the read-only `views` (before Landlock, which forbids changing mounts), the Landlock
/// `ruleset` and the seccomp `filter` it is given.
pub(super) fn restrict_on_exec(
    command: &mut tokio::process::Command,
    views: Option<ReadOnlyViews>,
    ruleset: Option<Ruleset>,
    filter: Option<Filter>,
) {
    // Runs in the child between fork and exec, where only async-signal-safe calls are
    // allowed: system calls, no allocation (an `io::Error` from an errno holds the number
    // only), no lock.
    let restrict = move || {
        // SAFETY: `prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)` takes no pointers.
        let done = unsafe {
            libc::prctl(
                libc::PR_SET_NO_NEW_PRIVS,
                1 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
            )
        };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(views) = &views {
            views.enter()?;
        }
        if let Some(ruleset) = &ruleset {
            // SAFETY: `fd` is the open ruleset, owned by this closure; no pointers.
            let done = unsafe {
                libc::syscall(libc::SYS_landlock_restrict_self, ruleset.fd.as_raw_fd(), 0 as c_uint)
            };
            if done != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(filter) = &filter {
            filter.install()?;
        }
        Ok(())
    };
    // SAFETY: `restrict` is async-signal-safe (see above) and touches no state of the
    // parent's but what it owns.
    unsafe {
        command.pre_exec(restrict);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_abi_asks_only_for_the_rights_it_knows() {
        assert_eq!(fs_rights(1), 0x1fff);
        assert_eq!(fs_rights(2), 0x3fff);
        assert_eq!(fs_rights(3), 0x7fff);
        assert_eq!(fs_rights(4), 0x7fff);
        assert_eq!(fs_rights(5), 0xffff);
        assert_eq!(fs_rights(7), 0xffff);
        assert_eq!(size_of::<PathBeneathAttr>(), 12);
        assert_eq!(size_of::<RulesetAttr>(), 24);
        assert_eq!(FS_READ & !FS_FILE_RIGHTS, FS_READ_DIR);
    }
}
