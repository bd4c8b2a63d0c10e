//! This process's stdin and stdout as non-blocking streams on the runtime's event loop,
//! when they are pipes or sockets (as an MCP client that spawns toolmux makes them).
//!
//! `tokio::io::stdin()` and `stdout()` run every read and write on a blocking thread, so
//! each message would cost two thread wakeups on top of the pipe itself; a gateway call
//! crosses stdio twice.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

/// A boxed reading half.
pub(super) type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// A boxed writing half.
pub(super) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// Stdin and stdout, registered with the event loop; they are set back to blocking mode
/// (which they share with whoever else holds them) when this is dropped.
pub(super) struct Pipes {
    reader: Option<Reader>,
    writer: Option<Writer>,
    /// Duplicates of stdin and stdout, to set them back to blocking mode.
    restore: Vec<OwnedFd>,
}

impl Pipes {
    /// Stdin and stdout, when both are pipes or sockets; `None` otherwise (a terminal, a
    /// file, or an error), and nothing was changed then.
    pub(super) fn take() -> Option<Pipes> {
        let stdin = Kind::of(io::stdin().as_fd())?;
        let stdout = Kind::of(io::stdout().as_fd())?;
        let restore = vec![
            io::stdin().as_fd().try_clone_to_owned().ok()?,
            io::stdout().as_fd().try_clone_to_owned().ok()?,
        ];
        let reader = stdin.reader(io::stdin().as_fd().try_clone_to_owned().ok()?);
        let writer = stdout.writer(io::stdout().as_fd().try_clone_to_owned().ok()?);
        match (reader, writer) {
            (Ok(reader), Ok(writer)) => {
                Some(Pipes { reader: Some(reader), writer: Some(writer), restore })
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "stdio served through blocking threads");
                // Whatever was set non-blocking goes back (drop restores).
                drop(Pipes { reader: None, writer: None, restore });
                None
            }
        }
    }

    /// The two halves; keep `self` alive while they are in use.
    pub(super) fn split(&mut self) -> Option<(Reader, Writer)> {
        Some((self.reader.take()?, self.writer.take()?))
    }
}

impl std::fmt::Debug for Pipes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipes").field("restore", &self.restore).finish_non_exhaustive()
    }
}

impl Drop for Pipes {
    fn drop(&mut self) {
        for fd in &self.restore {
            let _ = rustix::io::ioctl_fionbio(fd, false);
        }
    }
}

/// What a standard stream is connected to.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Pipe,
    Socket,
}

impl Kind {
    fn of(fd: std::os::fd::BorrowedFd<'_>) -> Option<Kind> {
        let file = File::from(fd.try_clone_to_owned().ok()?);
        let kind = file.metadata().ok()?.file_type();
        if kind.is_fifo() {
            Some(Kind::Pipe)
        } else if kind.is_socket() {
            Some(Kind::Socket)
        } else {
            None
        }
    }

    fn reader(self, fd: OwnedFd) -> io::Result<Reader> {
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(match self {
            Kind::Pipe => Box::new(pipe::Receiver::from_owned_fd_unchecked(fd)?),
            Kind::Socket => Box::new(socket(fd)?),
        })
    }

    fn writer(self, fd: OwnedFd) -> io::Result<Writer> {
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(match self {
            Kind::Pipe => Box::new(pipe::Sender::from_owned_fd_unchecked(fd)?),
            Kind::Socket => Box::new(socket(fd)?),
        })
    }
}

fn socket(fd: OwnedFd) -> io::Result<tokio::net::UnixStream> {
    tokio::net::UnixStream::from_std(std::os::unix::net::UnixStream::from(fd))
}
