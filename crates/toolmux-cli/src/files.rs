//! Reading a file toolmux finds or is given outside the configuration's loading (a
//! paused run, the project's approvals, the files `serve --watch` reads again): a regular
//! file of bounded size, never a FIFO, a device or a folder.
//!
//! `open()` of a FIFO blocks until a writer comes, in a call no signal reaches, and
//! `/dev/zero` is read until memory runs out. The facade reads configuration files by the
//! same rule, through the same reader (`toolmux_core::regular`).

use std::io::{self, Read as _};
use std::path::Path;
use toolmux::toolmux_core::regular::{self, RegularError};

/// What a file is read as: its size limit and its name in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileRole {
    /// The largest size read, in bytes.
    pub(crate) limit: u64,
    /// What the file should be, in messages (`a paused run`).
    pub(crate) name: &'static str,
}

/// A configuration file, as the facade reads it (16 MiB at most).
pub(crate) const CONFIG: FileRole =
    FileRole { limit: 16 * 1024 * 1024, name: "a configuration file" };

/// A paused run saved by `agent run --pause-to`: its transcript is in it, which a long
/// run makes large, but never larger than what a model's context held several times over.
pub(crate) const PAUSED_RUN: FileRole =
    FileRole { limit: 256 * 1024 * 1024, name: "a paused run (agent run --pause-to)" };

/// The project's approvals (`.toolmux/approvals.json`): a list of tool names and rules.
pub(crate) const APPROVALS: FileRole = FileRole { limit: 1024 * 1024, name: "an approvals file" };

/// A task piped to `agent run`: a prompt, which no model takes at this size.
pub(crate) const TASK: FileRole = FileRole { limit: 16 * 1024 * 1024, name: "a task" };

/// An MCP server's kept OAuth tokens, compared before and after `mcp login`.
pub(crate) const TOKENS: FileRole = FileRole { limit: 1024 * 1024, name: "an OAuth token file" };

/// The bytes of the regular file at `path` (symbolic links followed), read as `role`; an
/// error of kind `InvalidInput` saying what the file is when it is no regular file or is
/// over the role's size limit.
///
/// The type is checked before opening, so that a device is never opened, and again on the
/// opened file, which is opened without blocking: a FIFO put in the file's place between
/// the two is refused rather than waited on ([`regular::read_regular`]).
pub(crate) fn read_regular(path: &Path, role: FileRole) -> io::Result<Vec<u8>> {
    regular::read_regular(path, role.limit).map_err(|e| match e {
        RegularError::NotRegular(what) => not_regular(what, role),
        RegularError::TooBig { len, .. } => too_big(len, role),
        e => e.into_io(),
    })
}

/// Reads what comes on `input` (a pipe, a file) up to `role`'s limit; over it, an error of
/// kind `InvalidInput` saying so.
pub(crate) fn read_bounded(input: impl io::Read, role: FileRole) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    input.take(role.limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > role.limit {
        return Err(too_big(None, role));
    }
    Ok(bytes)
}

fn too_big(len: Option<u64>, role: FileRole) -> io::Error {
    let size = match len {
        Some(len) => format!("it is {}, over", mebibytes(len)),
        None => "it is over".to_owned(),
    };
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{size} the limit of {} for {}: one that big is likely a mistake \
             (a wrong path, or generated data)",
            mebibytes(role.limit),
            role.name
        ),
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

/// The error for a file that is no regular file: what it is, when its type says.
fn not_regular(what: Option<&str>, role: FileRole) -> io::Error {
    let it = match what {
        Some(what) => format!("it is {what}, not a regular file"),
        None => "it is not a regular file".to_owned(),
    };
    io::Error::new(io::ErrorKind::InvalidInput, format!("{it}: give the path of {}", role.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type no word names is said once to be no regular file, where the message said
    /// "it is not a regular file, not a regular file".
    #[test]
    fn a_file_of_no_named_type_is_said_once_to_be_no_regular_file() {
        let said = |what| not_regular(what, APPROVALS).to_string();
        assert_eq!(said(None), "it is not a regular file: give the path of an approvals file");
        assert_eq!(
            said(Some("a socket")),
            "it is a socket, not a regular file: give the path of an approvals file"
        );
    }

    /// A folder read as a file is said to be one, through the reader.
    #[test]
    fn a_folder_is_said_to_be_one() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let error = read_regular(dir.path(), APPROVALS).expect_err("a folder is refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            error.to_string(),
            "it is a folder, not a regular file: give the path of an approvals file"
        );
    }
}
