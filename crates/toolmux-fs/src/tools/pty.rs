//! Pseudo-terminals for background tasks started with `tty: true`: the task's stdin,
//! stdout and stderr are the terminal's slave side, and it is the leader of a session of
//! its own whose controlling terminal that is, as in a terminal window; toolmux keeps the
//! master side, reads what the task prints from it and writes its input to it.
//!
//! Programs behave as they do for a person: a REPL prints its prompts, `read -p` shows its
//! question, tools that test `isatty` color and format for a terminal (the colors are
//! stripped when the output is read). What is written is echoed, as a terminal does.

// `pre_exec` and registering a descriptor with tokio are unsafe by nature; each block says
// why it holds.
#![allow(unsafe_code)]

use rustix::pty::OpenptFlags;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::pin::Pin;
use std::process::Stdio;
use std::task::{Context, Poll};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The size the terminal says it has: wide enough that lines are rarely wrapped.
const ROWS: u16 = 40;
const COLUMNS: u16 = 120;

/// A terminal's two sides.
pub(crate) struct Pty {
    /// Toolmux's side: reading gets what the task prints, writing is its input.
    pub(crate) master: File,
    /// The task's side.
    slave: File,
}

impl Pty {
    /// A new terminal of [`ROWS`] × [`COLUMNS`].
    pub(crate) fn open() -> std::io::Result<Pty> {
        let master =
            rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        rustix::pty::grantpt(&master)?;
        rustix::pty::unlockpt(&master)?;
        let name = rustix::pty::ptsname(&master, Vec::new())?;
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(std::ffi::OsStr::from_bytes(name.as_bytes()))?;
        let size =
            rustix::termios::Winsize { ws_row: ROWS, ws_col: COLUMNS, ws_xpixel: 0, ws_ypixel: 0 };
        rustix::termios::tcsetwinsize(&master, size)?;
        Ok(Pty { master: File::from(master), slave })
    }

    /// Makes `command` run on this terminal: its standard streams are the slave side, and
    /// it starts a session of its own with this terminal as its controlling one (so
    /// `/dev/tty` is this terminal, and the task's processes form one session, whose
    /// group is the session leader's: killing the group kills the task).
    ///
    /// The command must not be given a process group of its own (`process_group`):
    /// `setsid` refuses a process that leads a group.
    pub(crate) fn attach(&self, command: &mut tokio::process::Command) -> std::io::Result<()> {
        command
            .stdin(Stdio::from(self.slave.try_clone()?))
            .stdout(Stdio::from(self.slave.try_clone()?))
            .stderr(Stdio::from(self.slave.try_clone()?));
        // SAFETY: between fork and exec only async-signal-safe calls are made (`setsid`,
        // `ioctl`), on the child's own descriptor 0, which std has made the slave side.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }
}

/// Makes `command` the leader of a session of its own with no controlling terminal, and so
/// of a process group of its own (whose id is its pid), for a command that runs on pipes.
///
/// A group of its own alone left it in toolmux's session: under a toolmux started from a
/// terminal (the CLI, an agent's TUI), `/dev/tty` was that terminal, a prompt reading it
/// (`sudo`, `ssh`'s host key question, git's credentials) stopped the command with
/// `SIGTTIN` until its timeout, since its group is not the terminal's foreground one, and
/// what it wrote there landed on the user's screen. Without a terminal, opening
/// `/dev/tty` fails at once (`ENXIO`) and the program says it needs one.
///
/// As with [`Pty::attach`], the command must not also be given a `process_group`.
pub(crate) fn detach(command: &mut tokio::process::Command) {
    // SAFETY: between fork and exec only `setsid`, which is async-signal-safe, is called.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The master side of a terminal on tokio's event loop (non-blocking: no thread waits in
/// `read`, and dropping it stops it). Reading ends (`Ok(0)`) when every process has
/// closed the slave side, which Linux reports as `EIO`.
#[derive(Debug)]
pub(crate) struct Master(AsyncFd<File>);

impl Master {
    pub(crate) fn new(file: File) -> std::io::Result<Master> {
        rustix::io::ioctl_fionbio(&file, true)?;
        // SAFETY: the `File` owns its descriptor, which stays open as long as the
        // `AsyncFd` holds it, and `as_raw_fd` always returns that same descriptor.
        let registered = unsafe { AsyncFd::register(file) };
        Ok(Master(registered?))
    }
}

impl AsyncRead for Master {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut ready = std::task::ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match ready.try_io(|fd| fd.get_ref().read(unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            let mut ready = std::task::ready!(self.0.poll_write_ready(cx))?;
            match ready.try_io(|fd| fd.get_ref().write(bytes)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => {}
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
