//! This process's stdin and stdout for a threaded session (see `session::run_threaded`).
//!
//! Stdin is read by a thread blocked in `read`, in whatever mode it is in. Stdout, when it
//! is a pipe or a socket (as an MCP client that spawns toolmux makes it), is set
//! non-blocking so that a full pipe queues lines instead of stopping the thread that has
//! them; it is set back to blocking when serving ends. A terminal or a file is written with
//! blocking writes. (`tokio::io::stdin()` and `stdout()` would hand every read and write to
//! a blocking-pool thread: two thread wakeups per message.)

use super::session::FdOutput;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;

/// Stdin and stdout, duplicated; stdout is set back to blocking mode (which it shares with
/// whoever else holds it) when this is dropped.
pub(super) struct Stdio {
    /// A duplicate of stdout when it was set non-blocking, to set it back.
    restore: Option<OwnedFd>,
}

impl Stdio {
    /// Duplicates of stdin and stdout, and how stdout is written.
    pub(super) fn take() -> io::Result<(Stdio, File, FdOutput)> {
        let input = File::from(io::stdin().as_fd().try_clone_to_owned()?);
        let stdout = io::stdout().as_fd().try_clone_to_owned()?;
        let restore = stdout.try_clone()?;
        let output = output(stdout)?;
        let restore = (!matches!(output, FdOutput::Blocking(_))).then_some(restore);
        Ok((Stdio { restore }, input, output))
    }
}

impl std::fmt::Debug for Stdio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stdio").field("restore", &self.restore).finish()
    }
}

impl Drop for Stdio {
    fn drop(&mut self) {
        if let Some(fd) = &self.restore {
            let _ = rustix::io::ioctl_fionbio(fd, false);
        }
    }
}

/// How `fd` is written: a pipe or a socket is set non-blocking (the runtime can watch it
/// when full), anything else is written with blocking writes.
pub(super) fn output(fd: OwnedFd) -> io::Result<FdOutput> {
    let kind = File::from(fd.try_clone()?).metadata()?.file_type();
    if kind.is_fifo() {
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(FdOutput::Pipe(fd))
    } else if kind.is_socket() {
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(FdOutput::Socket(fd))
    } else {
        Ok(FdOutput::Blocking(File::from(fd)))
    }
}
