//! Pseudo-terminals for background tasks started with `tty: true`: the task's stdin,
//! stdout and stderr are the terminal's slave side, and it is the leader of a session of
//! its own whose controlling terminal that is, as in a terminal window; toolmux keeps the
//! master side, reads what the task prints from it and writes its input to it.
//!
//! Programs behave as they do for a person: a REPL prints its prompts, `read -p` shows its
//! question, tools that test `isatty` color and format for a terminal (the colors are
//! stripped when the output is read). What is written is echoed, as a terminal does.

// `pre_exec` is unsafe by nature; the block says why it holds.
#![allow(unsafe_code)]

use rustix::pty::OpenptFlags;
use std::fs::File;
use std::process::Stdio;

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

use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::OpenOptionsExt as _;
