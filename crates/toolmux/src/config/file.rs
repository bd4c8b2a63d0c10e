//! Reading a file the user named at load (a configuration layer, an MCP server's
//! `envFile`): a regular file of bounded size, never a FIFO, a device or a folder.
//!
//! `open()` of a FIFO blocks until a writer comes, in a call no signal handler of ours
//! interrupts, so `toolmux --config fifo.yaml` waited for ever and only `kill -9` ended it;
//! `/dev/zero` would have been read until memory ran out. And a configuration is parsed
//! whole into a tree about fifty times its size, so a 100 MB file took 5.4 GB.

use std::io;
use std::path::Path;
use toolmux_core::regular::{self, RegularError};

/// The largest configuration file read: 16 MiB. Hand-written configurations are a few
/// kilobytes; one this big is a wrong path or generated data, and parsing it would take
/// about fifty times as much memory.
pub(crate) const CONFIG_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// The largest `envFile` read: 1 MiB. Linux refuses to start a program whose arguments
/// and environment together pass 2 MiB (`ARG_MAX` with the default stack), so a bigger
/// env file could never reach a server anyway.
#[cfg(feature = "mcp")]
pub(crate) const ENV_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// What a file is read as: its size limit and its name in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileRole {
    /// A configuration file (any layer).
    Config,
    /// An MCP server's `envFile`.
    #[cfg(feature = "mcp")]
    EnvFile,
}

impl FileRole {
    fn limit(self) -> u64 {
        match self {
            FileRole::Config => CONFIG_MAX_BYTES,
            #[cfg(feature = "mcp")]
            FileRole::EnvFile => ENV_FILE_MAX_BYTES,
        }
    }

    fn name(self) -> &'static str {
        match self {
            FileRole::Config => "a configuration file",
            #[cfg(feature = "mcp")]
            FileRole::EnvFile => "an env file",
        }
    }
}

/// The text of the regular file at `path` (symbolic links followed), read as `role`;
/// an error of kind `InvalidInput` saying what the file is when it is no regular file or
/// is over the role's size limit.
///
/// The type is checked before opening, so that a device is never opened, and again on
/// the opened file, which is opened without blocking: a FIFO put in the file's place
/// between the two is refused rather than waited on ([`regular::read_regular`]).
pub(crate) fn read_regular(path: &Path, role: FileRole) -> io::Result<String> {
    let bytes = regular::read_regular(path, role.limit()).map_err(|e| match e {
        // `it is a FIFO (named pipe), not a regular file`.
        e @ RegularError::NotRegular(_) => io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{e}: give the path of {}", role.name()),
        ),
        RegularError::TooBig { len, .. } => too_big(len, role),
        e => e.into_io(),
    })?;
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The error for a file over `role`'s limit: `len` is its size, `None` when it was within
/// the limit when looked at and grew past it while it was read.
fn too_big(len: Option<u64>, role: FileRole) -> io::Error {
    let (limit, name) = (mebibytes(role.limit()), role.name());
    let size = match len {
        Some(len) => format!("it is {}, over the limit of {limit} for {name}", mebibytes(len)),
        None => format!("it grew while it was read to more than {limit}, the limit for {name}"),
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{size}: one that big is likely a mistake (a wrong path, or generated data)"),
    )
}

fn mebibytes(bytes: u64) -> String {
    let mib = bytes as f64 / (1024.0 * 1024.0);
    if bytes.is_multiple_of(1024 * 1024) {
        format!("{mib:.0} MiB")
    } else {
        format!("{mib:.1} MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{fifo, within_10s};
    use std::fs::File;

    /// Reads `path` as a configuration file, failing the test should the read block.
    fn read_within(path: &Path) -> io::Result<String> {
        let path = path.to_path_buf();
        within_10s("the read", move || read_regular(&path, FileRole::Config))
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let fifo = fifo(dir.path(), "toolmux.yaml");
        let e = read_within(&fifo).expect_err("a FIFO is no configuration");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            e.to_string(),
            "it is a FIFO (named pipe), not a regular file: give the path of a configuration file"
        );
    }

    #[test]
    fn devices_and_folders_are_refused() {
        let e = read_within(Path::new("/dev/zero")).expect_err("a device");
        assert!(e.to_string().starts_with("it is a character device, not a regular file"), "{e}");
        let e = read_within(Path::new("/dev/null")).expect_err("a device");
        assert!(e.to_string().starts_with("it is a character device"), "{e}");
        let dir = tempfile::tempdir().expect("temporary folder");
        let e = read_within(dir.path()).expect_err("a folder");
        assert!(e.to_string().starts_with("it is a folder, not a regular file"), "{e}");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().expect("temporary folder");
        let big = dir.path().join("toolmux.yaml");
        let file = File::create(&big).expect("created");
        // Sparse: no disk is used for it.
        file.set_len(100 * 1024 * 1024).expect("grown");
        let e = read_within(&big).expect_err("too big");
        assert_eq!(
            e.to_string(),
            "it is 100 MiB, over the limit of 16 MiB for a configuration file: one that big \
             is likely a mistake (a wrong path, or generated data)"
        );
        file.set_len(CONFIG_MAX_BYTES).expect("shrunk");
        let text = read_within(&big).expect("a file at the limit is read");
        assert_eq!(text.len() as u64, CONFIG_MAX_BYTES);
    }

    /// A file within the limit when looked at that grew past it while it was read (which
    /// `toolmux_core::regular` tells by reading a byte more than the limit; no file here
    /// can be made to grow at that moment every time) says so, with the limit.
    #[test]
    fn a_file_that_grew_past_the_limit_while_it_was_read_says_so() {
        let e = too_big(None, FileRole::Config);
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            e.to_string(),
            "it grew while it was read to more than 16 MiB, the limit for a configuration \
             file: one that big is likely a mistake (a wrong path, or generated data)"
        );
    }

    #[test]
    fn a_symbolic_link_to_a_file_is_read() {
        let dir = tempfile::tempdir().expect("temporary folder");
        std::fs::write(dir.path().join("real.yaml"), "fs: {}\n").expect("written");
        let link = dir.path().join("toolmux.yaml");
        std::os::unix::fs::symlink("real.yaml", &link).expect("linked");
        assert_eq!(read_within(&link).expect("read"), "fs: {}\n");
    }
}
