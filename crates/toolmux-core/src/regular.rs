//! Opening and reading a file that must be a regular one (a configuration, a statistics
//! file, a paused run), never a FIFO, a device or a folder, without blocking.
//!
//! `open()` of a FIFO blocks until a writer comes, in a call no signal reaches, and
//! `/dev/zero` is read until memory runs out. The file is opened without blocking
//! (`O_NONBLOCK`, which a regular file ignores) and its type checked on the opened file,
//! so a FIFO put in its place is refused rather than waited on. Each caller words the
//! errors as its users know the file ([`RegularError`]).
//!
//! ```
//! use toolmux_core::regular::{RegularError, read_regular};
//!
//! let folder = std::env::temp_dir();
//! let Err(RegularError::NotRegular(what)) = read_regular(&folder, 1024) else {
//!     panic!("a folder is no regular file");
//! };
//! assert_eq!(what, Some("a folder"));
//! ```

use std::fmt;
use std::fs::{File, FileType, Metadata, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::Path;

/// Why [`open_regular`] or [`read_regular`] gave no file.
#[derive(Debug)]
#[non_exhaustive]
pub enum RegularError {
    /// Opening, reading or asking the file's type failed (`NotFound` for no file).
    Io(io::Error),
    /// The path is no regular file: what it is in words ([`kind_in_words`]), `None` for
    /// a type no word names.
    NotRegular(Option<&'static str>),
    /// The file is over `limit` bytes: `len`, its size, when known before it was read;
    /// `None` when it grew past the limit while read.
    TooBig {
        /// Its size, when known before reading.
        len: Option<u64>,
        /// The largest size read.
        limit: u64,
    },
}

impl RegularError {
    /// The reason as an I/O error (of kind `InvalidInput` where the file is the wrong
    /// kind or size), for callers that report one.
    pub fn into_io(self) -> io::Error {
        match self {
            RegularError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidInput, other.to_string()),
        }
    }
}

impl fmt::Display for RegularError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegularError::Io(_) => f.write_str("the file could not be opened or read"),
            RegularError::NotRegular(Some(what)) => write!(f, "it is {what}, not a regular file"),
            RegularError::NotRegular(None) => f.write_str("it is not a regular file"),
            RegularError::TooBig { len: Some(len), limit } => {
                write!(f, "it is {len} bytes, over the limit of {limit}")
            }
            RegularError::TooBig { len: None, limit } => {
                write!(f, "it grew while read, past the limit of {limit} bytes")
            }
        }
    }
}

impl std::error::Error for RegularError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RegularError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Opens `path` as `options` say (symbolic links followed), refusing anything but a
/// regular file. The open does not wait (`O_NONBLOCK`, and `O_NOCTTY` so a terminal never
/// becomes the process's own): opening a FIFO waits for its other end, for ever if none
/// comes, and no signal interrupts it; a regular file ignores the flags.
pub fn open_regular(path: &Path, options: &mut OpenOptions) -> Result<File, RegularError> {
    open_checked(path, options).map(|(file, _)| file)
}

/// The bytes of the regular file at `path` (symbolic links followed), at most `limit`.
///
/// The type and size are checked before opening, so that a device is never opened, and
/// again on the file [`open_regular`] opened: a FIFO put in the file's place between the
/// two is refused rather than waited on. A file that grows while read is read up to one
/// byte past the limit, which tells.
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, RegularError> {
    let meta = std::fs::metadata(path).map_err(RegularError::Io)?;
    check(&meta, limit)?;
    let (file, meta) = open_checked(path, OpenOptions::new().read(true))?;
    check(&meta, limit)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(RegularError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(RegularError::TooBig { len: None, limit });
    }
    Ok(bytes)
}

/// What a file that is no regular file is, in words (`a folder`, `a FIFO (named pipe)`);
/// `None` for a regular file or a type no word names.
pub fn kind_in_words(kind: FileType) -> Option<&'static str> {
    Some(if kind.is_dir() {
        "a folder"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        return None;
    })
}

/// [`open_regular`], with the opened file's metadata.
fn open_checked(path: &Path, options: &mut OpenOptions) -> Result<(File, Metadata), RegularError> {
    let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    let file = match options.custom_flags(flags.bits() as i32).open(path) {
        Ok(file) => file,
        // A FIFO without a reader refuses a writer (ENXIO): say what it is, not that.
        Err(e) => {
            return Err(match std::fs::metadata(path) {
                Ok(meta) if !meta.is_file() => {
                    RegularError::NotRegular(kind_in_words(meta.file_type()))
                }
                _ => RegularError::Io(e),
            });
        }
    };
    let meta = file.metadata().map_err(RegularError::Io)?;
    if !meta.is_file() {
        return Err(RegularError::NotRegular(kind_in_words(meta.file_type())));
    }
    Ok((file, meta))
}

fn check(meta: &Metadata, limit: u64) -> Result<(), RegularError> {
    if !meta.is_file() {
        return Err(RegularError::NotRegular(kind_in_words(meta.file_type())));
    }
    if meta.len() > limit {
        return Err(RegularError::TooBig { len: Some(meta.len()), limit });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A new empty folder of this test's own.
    fn scratch() -> std::path::PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("toolmux-core-regular-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch folder");
        dir
    }

    fn said(result: Result<impl fmt::Debug, RegularError>) -> String {
        result.map_err(|e| e.to_string()).expect_err("refused")
    }

    #[test]
    fn folders_devices_and_sockets_are_refused_with_their_kind() {
        let dir = scratch();
        assert_eq!(said(read_regular(&dir, 1024)), "it is a folder, not a regular file");
        assert_eq!(
            said(read_regular(Path::new("/dev/zero"), 1024)),
            "it is a character device, not a regular file"
        );
        let socket = dir.join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("a socket");
        assert_eq!(said(read_regular(&socket, 1024)), "it is a socket, not a regular file");
        // Opening a socket fails (ENXIO); what it is is said instead.
        assert_eq!(
            said(open_regular(&socket, OpenOptions::new().append(true))),
            "it is a socket, not a regular file"
        );
        assert_eq!(
            said(open_regular(Path::new("/dev/null"), OpenOptions::new().append(true))),
            "it is a character device, not a regular file"
        );
        let error = open_regular(&dir, OpenOptions::new().read(true)).expect_err("a folder");
        assert_eq!(error.into_io().kind(), io::ErrorKind::InvalidInput);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_missing_file_is_not_found() {
        let dir = scratch();
        let missing = dir.join("missing");
        let Err(RegularError::Io(e)) = read_regular(&missing, 1024) else { panic!("no such file") };
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_file_over_the_limit_is_refused_before_it_is_read() {
        let dir = scratch();
        let path = dir.join("big");
        let file = File::create(&path).expect("created");
        // Sparse: no disk is used for it.
        file.set_len(100 << 20).expect("grown");
        let Err(RegularError::TooBig { len, limit }) = read_regular(&path, 16 << 20) else {
            panic!("too big")
        };
        assert_eq!((len, limit), (Some(100 << 20), 16 << 20));
        file.set_len(16 << 20).expect("shrunk");
        assert_eq!(read_regular(&path, 16 << 20).expect("at the limit").len(), 16 << 20);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn no_limit_reads_the_whole_file() {
        let dir = scratch();
        std::fs::write(dir.join("some"), "text").expect("written");
        assert_eq!(read_regular(&dir.join("some"), u64::MAX).expect("read"), b"text");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_symbolic_link_to_a_file_is_followed() {
        let dir = scratch();
        std::fs::write(dir.join("real"), "text").expect("written");
        std::os::unix::fs::symlink("real", dir.join("link")).expect("linked");
        assert_eq!(read_regular(&dir.join("link"), 4).expect("read"), b"text");
        let mut written = open_regular(&dir.join("link"), OpenOptions::new().append(true))
            .expect("a regular file opens");
        io::Write::write_all(&mut written, b"!").expect("appended");
        assert_eq!(std::fs::read(dir.join("real")).expect("read"), b"text!");
        std::fs::remove_dir_all(&dir).ok();
    }
}
