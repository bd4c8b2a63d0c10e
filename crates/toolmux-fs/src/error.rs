//! Everything that can go wrong in the builtin tools, and how it reaches the caller.

use std::io;
use toolmux_core::ToolError;

/// Why a builtin tool failed. Every message names the path or command the caller gave.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// The configuration is unusable (root missing, not absolute, not a directory).
    #[error("invalid fs configuration: {message}")]
    Config {
        /// What is wrong.
        message: String,
    },
    /// The arguments make no sense for the tool (past the end, empty pattern, bad glob).
    #[error("{message}")]
    InvalidArguments {
        /// The tool, provider-local.
        tool: &'static str,
        /// What is wrong, naming the argument.
        message: String,
    },
    /// The tool's permission class is not switched on.
    #[error(
        "tool `{tool}` is disabled: add \"{class}\" to the fs `permissions` configuration key \
         to enable it"
    )]
    Disabled {
        /// The tool.
        tool: String,
        /// The class that enables it.
        class: &'static str,
    },
    /// The path leads outside the workspace root.
    #[error(
        "path `{path}` is outside the workspace root (reached through `..`, an absolute path \
         or a symlink); only paths beneath the root are allowed"
    )]
    OutsideRoot {
        /// The path as the caller gave it.
        path: String,
    },
    /// The path is protected: the file tools may not change it (or read it).
    #[error(
        "`{path}`{} is protected: {reason}",
        .resolved.as_ref().map(|r| format!(" (resolved to `{r}`)")).unwrap_or_default()
    )]
    Protected {
        /// The path as the caller gave it.
        path: String,
        /// Where it leads, relative to the root, when that is not what it says.
        resolved: Option<String>,
        /// Why, and what to do instead.
        reason: String,
    },
    /// Another call has been changing the same file for too long.
    #[error(
        "`{path}` is being changed by another call that has not finished after {seconds} \
         seconds; try again when it has"
    )]
    Busy {
        /// The path as the caller gave it.
        path: String,
        /// How long the call waited.
        seconds: u64,
    },
    /// Nothing exists at the path.
    #[error("{}", not_found(.path, .suggestion.as_deref(), NAMESPACE))]
    NotFound {
        /// The path as the caller gave it.
        path: String,
        /// An existing path whose names are close to the ones given, spelled as the caller
        /// would (`Workspace::close_path`).
        suggestion: Option<String>,
    },
    /// A directory where a file is needed.
    #[error("{}", is_directory(.path, NAMESPACE))]
    IsDirectory {
        /// The path as the caller gave it.
        path: String,
    },
    /// A path that goes through a file as if it were a folder.
    #[error("`{file}` is a file, not a folder: `{path}` cannot be inside it")]
    FileInPath {
        /// The path as the caller gave it.
        path: String,
        /// The file the path goes through, as the caller spelled it.
        file: String,
    },
    /// A file its owner may not write (no `u+w` in its mode).
    #[error(
        "`{path}` is read-only (mode {mode:04o}); change its mode first (`chmod u+w`) if it is \
         meant to be changed, then try again"
    )]
    ReadOnly {
        /// The path as the caller gave it.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// A path ending in `/` (a folder's spelling) at a file.
    #[error(
        "`{file}` is a file, not a directory, so `{path}` (ending in `/`) names nothing: drop \
         the trailing `/` to name the file"
    )]
    FileWithSlash {
        /// The path as the caller gave it.
        path: String,
        /// The file, as the caller spelled it without the `/`.
        file: String,
    },
    /// A folder on the way to a file being written was replaced while the write ran (by a
    /// symlink, a file or another folder), so where the file would land was no longer
    /// where it was checked to be.
    #[error(
        "the path `{path}` changed while it was being written (a folder in it was replaced, \
         by a symlink or otherwise): nothing was written; try again"
    )]
    PathChanged {
        /// The path as the caller gave it.
        path: String,
    },
    /// A file being read was found somewhere else than where it was checked: it, or a
    /// folder on the way to it, was replaced by a symlink (or otherwise) after the check.
    #[error(
        "the path `{path}` changed while it was being read (it or a folder in it was \
         replaced, by a symlink or otherwise): try again"
    )]
    ChangedWhileRead {
        /// The path as the caller gave it.
        path: String,
    },
    /// A file where a directory is needed.
    #[error("{}", not_directory(.path, NAMESPACE))]
    NotDirectory {
        /// The path as the caller gave it.
        path: String,
    },
    /// A FIFO, socket or device.
    #[error("`{path}` is not a regular file (a FIFO, socket or device); refusing to open it")]
    NotRegularFile {
        /// The path as the caller gave it.
        path: String,
    },
    /// The system refused the file tools access to the path (its owner, mode or attributes,
    /// such as `chattr +i`).
    #[error(
        "permission denied on `{path}`: its owner, mode or attributes keep the file tools \
         from it; choose another path, or ask the user to change its permissions"
    )]
    PermissionDenied {
        /// The path as the caller gave it.
        path: String,
    },
    /// The file's content is binary.
    #[error("{}", binary(.path, NAMESPACE))]
    Binary {
        /// The path as the caller gave it.
        path: String,
    },
    /// The file's byte order mark names an encoding its content is not valid in.
    #[error("{}", invalid_text(.path, .problem, NAMESPACE))]
    InvalidText {
        /// The path as the caller gave it.
        path: String,
        /// What is wrong, as "is not valid UTF-16: ...".
        problem: String,
    },
    /// Overwriting a file that was not read in this run.
    #[error(
        "`{path}` exists and has not been read in this run: read it first before writing to it"
    )]
    NotRead {
        /// The path as the caller gave it.
        path: String,
    },
    /// Overwriting a file whose content changed since it was read.
    #[error(
        "`{path}` has been modified since it was last read (by the user, a formatter or another \
         tool): read it again before writing to it"
    )]
    Stale {
        /// The path as the caller gave it.
        path: String,
    },
    /// A file too large for a tool that holds it whole in memory.
    #[error("`{path}` is {size} bytes, over the {limit}-byte limit of `{tool}`")]
    TooLarge {
        /// The tool.
        tool: &'static str,
        /// The path as the caller gave it.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// An edit could not be applied; nothing was written.
    #[error("{message}")]
    Edit {
        /// The path as the caller gave it.
        path: String,
        /// What went wrong and how to fix it.
        message: String,
    },
    /// A command is not on the configured allow-list.
    #[error("command `{}` is not allowed: {reason}", excerpt(.command))]
    CommandDenied {
        /// The command.
        command: String,
        /// Why, and what is allowed.
        reason: String,
    },
    /// A command cannot run in the sandbox configured for it.
    #[error("command `{}` cannot run sandboxed: {reason}", excerpt(.command))]
    Sandbox {
        /// The command.
        command: String,
        /// Why, and how to switch the sandbox off.
        reason: String,
    },
    /// A command could not be started. The reason comes first: a command of megabytes
    /// is shown as an excerpt, after it.
    #[error("failed to start a command: {}: `{}`", spawn_reason(.source, .command), excerpt(.command))]
    Spawn {
        /// The command.
        command: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The tool's worker thread panicked.
    #[error("`{tool}` panicked: {message}")]
    Panicked {
        /// The tool.
        tool: &'static str,
        /// The panic message.
        message: String,
    },
    /// The call was cancelled.
    #[error("`{tool}` cancelled")]
    Cancelled {
        /// The tool.
        tool: &'static str,
    },
    /// An I/O failure on a path.
    #[error("i/o error on `{path}`")]
    Io {
        /// The path as the caller gave it.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl FsError {
    /// Maps an I/O error on `path` (as the caller gave it) to the matching variant.
    pub(crate) fn from_io(path: &str, err: io::Error) -> FsError {
        let path = path.to_owned();
        if is_escape(&err) {
            return FsError::OutsideRoot { path };
        }
        match err.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => {
                FsError::NotFound { path, suggestion: None }
            }
            io::ErrorKind::IsADirectory => FsError::IsDirectory { path },
            io::ErrorKind::PermissionDenied => FsError::PermissionDenied { path },
            _ => FsError::Io { path, source: err },
        }
    }

    /// The message with its causes, as the model reads it.
    pub fn report(&self) -> String {
        toolmux_core::error_report(self)
    }

    /// Converts into the error a [`toolmux_core::ToolProvider`] returns; `tool` is the full
    /// tool name.
    pub fn into_tool_error(self, tool: &str) -> ToolError {
        match self {
            FsError::InvalidArguments { message, .. } => {
                ToolError::invalid_arguments(tool, message)
            }
            // A path that names nothing usable, as an empty one or one with a NUL
            // (`InvalidArguments`): the caller's mistake to correct, not the tool failing.
            // A path that names a file the tool may not use as it is (read-only, a FIFO, one
            // the system refuses, binary, changed while written) is not among them: the
            // arguments are right and the file is the problem, so it falls to the plain tool
            // error below, which does not say "invalid arguments ... at /".
            FsError::FileInPath { .. }
            | FsError::FileWithSlash { .. }
            | FsError::NotFound { .. }
            | FsError::IsDirectory { .. }
            | FsError::NotDirectory { .. } => {
                ToolError::invalid_arguments(tool, self.message_in(namespace_of(tool)))
            }
            // Their messages name other tools, as the caller calls them.
            FsError::Binary { .. } | FsError::InvalidText { .. } => {
                ToolError::remote(tool, self.message_in(namespace_of(tool)))
            }
            FsError::Disabled { .. }
            | FsError::OutsideRoot { .. }
            | FsError::Protected { .. }
            | FsError::CommandDenied { .. }
            | FsError::Sandbox { .. } => {
                ToolError::Denied { tool: tool.to_owned(), reason: self.to_string() }
            }
            FsError::Cancelled { .. } => ToolError::Cancelled { tool: tool.to_owned() },
            FsError::Panicked { message, .. } => {
                ToolError::Panicked { tool: tool.to_owned(), message }
            }
            FsError::Config { .. } => ToolError::Unavailable {
                provider: tool.split("__").next().unwrap_or(tool).to_owned(),
                message: self.to_string(),
            },
            other => ToolError::remote(tool, other.report()),
        }
    }
}

impl FsError {
    /// The message, naming the tools it points to in `namespace` (`fs__ls` in `fs`): the
    /// model calls them by those names.
    fn message_in(&self, namespace: &str) -> String {
        match self {
            FsError::NotFound { path, suggestion } => {
                not_found(path, suggestion.as_deref(), namespace)
            }
            FsError::IsDirectory { path } => is_directory(path, namespace),
            FsError::NotDirectory { path } => not_directory(path, namespace),
            FsError::Binary { path } => binary(path, namespace),
            FsError::InvalidText { path, problem } => invalid_text(path, problem, namespace),
            other => other.to_string(),
        }
    }
}

/// The namespace messages name the tools in where the caller's is not known (their
/// `Display`); [`FsError::into_tool_error`] names them in the caller's.
const NAMESPACE: &str = "fs";

/// The namespace of full tool name `tool`.
fn namespace_of(tool: &str) -> &str {
    tool.split("__").next().unwrap_or(tool)
}

fn not_found(path: &str, suggestion: Option<&str>, namespace: &str) -> String {
    match suggestion {
        Some(s) => format!("no file or directory at `{path}`: did you mean `{s}`?"),
        None => format!(
            "no file or directory at `{path}`: check the path with `{namespace}__ls` or \
             `{namespace}__glob`"
        ),
    }
}

fn is_directory(path: &str, namespace: &str) -> String {
    format!("`{path}` is a directory, not a file: use `{namespace}__ls` to list it")
}

fn not_directory(path: &str, namespace: &str) -> String {
    format!(
        "`{path}` is a file, not a directory: read it with `{namespace}__read`, or give a \
         directory"
    )
}

fn binary(path: &str, namespace: &str) -> String {
    format!(
        "`{path}` is a binary file (it contains NUL bytes); it cannot be shown as text, \
         inspect it with `{namespace}__bash` tools such as `file` or `xxd` if allowed"
    )
}

fn invalid_text(path: &str, problem: &str, namespace: &str) -> String {
    format!(
        "`{path}` {problem}: it cannot be shown as text; inspect it with `{namespace}__bash` \
         tools such as `file` or `xxd` if allowed"
    )
}

/// Whether cap-std refused the path because it leads outside the root.
fn is_escape(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::PermissionDenied
        && err.to_string().contains("a path led outside of the filesystem")
}

/// Bytes of a command an error message shows whole; a longer one is cut to an excerpt
/// saying its size (a command of megabytes filled the message, and a client's cap on it
/// cut the reason off).
const COMMAND_SHOWN: usize = 200;

/// `command` (or other text a call gives, such as a grep pattern) as error messages show
/// it: whole when short, else its start and its size.
pub(crate) fn excerpt(command: &str) -> String {
    if command.len() <= COMMAND_SHOWN {
        return command.to_owned();
    }
    let mut cut = COMMAND_SHOWN - 40;
    while !command.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &command[..cut], command.len())
}

/// Why a command did not start, with what to do when its line was too long for the kernel.
fn spawn_reason(source: &io::Error, command: &str) -> String {
    if source.raw_os_error() == Some(libc::E2BIG) {
        format!(
            "{source}: the command is {} bytes, and the kernel takes at most 128 KiB in one \
             argument (`bash -c` passes the whole line as one) and about 2 MiB in all; write the \
             long part to a file and have the command read it",
            command.len()
        )
    } else {
        source.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    fn check(err: FsError, expect: Expect) {
        let tool_error = err.into_tool_error("fs__read");
        expect.assert_eq(&format!("{} [{}]", tool_error.report(), tool_error.code()));
    }

    /// Messages pointing to other tools name them as the caller calls them, in the
    /// provider's namespace.
    #[test]
    fn other_tools_are_named_in_the_caller_s_namespace() {
        let shown = |err: FsError| err.into_tool_error("files__read").to_string();
        expect![[r#"invalid arguments for `files__read`: at /: no file or directory at `a`: check the path with `files__ls` or `files__glob`"#]]
            .assert_eq(&shown(FsError::NotFound { path: "a".into(), suggestion: None }));
        expect![[r#"invalid arguments for `files__read`: at /: `d` is a directory, not a file: use `files__ls` to list it"#]]
            .assert_eq(&shown(FsError::IsDirectory { path: "d".into() }));
        expect![[r#"invalid arguments for `files__read`: at /: `f` is a file, not a directory: read it with `files__read`, or give a directory"#]]
            .assert_eq(&shown(FsError::NotDirectory { path: "f".into() }));
        expect![[r#"`b` is a binary file (it contains NUL bytes); it cannot be shown as text, inspect it with `files__bash` tools such as `file` or `xxd` if allowed"#]]
            .assert_eq(&shown(FsError::Binary { path: "b".into() }));
    }

    #[test]
    fn messages() {
        check(
            FsError::OutsideRoot { path: "../x".into() },
            expect![[
                "call to `fs__read` denied: path `../x` is outside the workspace root (reached through `..`, an absolute path or a symlink); only paths beneath the root are allowed [denied]"
            ]],
        );
        check(
            FsError::Disabled { tool: "write".into(), class: "write" },
            expect![[
                r#"call to `fs__read` denied: tool `write` is disabled: add "write" to the fs `permissions` configuration key to enable it [denied]"#
            ]],
        );
        check(
            FsError::Io { path: "a".into(), source: io::Error::other("disk on fire") },
            expect!["i/o error on `a`: disk on fire [remote]"],
        );
        check(
            FsError::InvalidArguments { tool: "read", message: "offset 9 is past the end".into() },
            expect![
                "invalid arguments for `fs__read`: at /: offset 9 is past the end [invalid_arguments]"
            ],
        );
        check(
            FsError::FileInPath { path: "a.txt/b".into(), file: "a.txt".into() },
            expect![
                "invalid arguments for `fs__read`: at /: `a.txt` is a file, not a folder: `a.txt/b` cannot be inside it [invalid_arguments]"
            ],
        );
        check(
            FsError::NotFound {
                path: "src/mian.rs".into(),
                suggestion: Some("src/main.rs".into()),
            },
            expect![
                "invalid arguments for `fs__read`: at /: no file or directory at `src/mian.rs`: did you mean `src/main.rs`? [invalid_arguments]"
            ],
        );
        check(
            FsError::from_io("a", io::Error::from(io::ErrorKind::PermissionDenied)),
            expect![
                "permission denied on `a`: its owner, mode or attributes keep the file tools from it; choose another path, or ask the user to change its permissions [remote]"
            ],
        );
        check(
            FsError::ReadOnly { path: "x".into(), mode: 0o444 },
            expect![
                "`x` is read-only (mode 0444); change its mode first (`chmod u+w`) if it is meant to be changed, then try again [remote]"
            ],
        );
        check(
            FsError::NotRegularFile { path: "pipe".into() },
            expect![
                "`pipe` is not a regular file (a FIFO, socket or device); refusing to open it [remote]"
            ],
        );
        check(
            FsError::PathChanged { path: "a/b".into() },
            expect![
                "the path `a/b` changed while it was being written (a folder in it was replaced, by a symlink or otherwise): nothing was written; try again [remote]"
            ],
        );
        check(
            FsError::ChangedWhileRead { path: "a/b".into() },
            expect![
                "the path `a/b` changed while it was being read (it or a folder in it was replaced, by a symlink or otherwise): try again [remote]"
            ],
        );
        check(
            FsError::Binary { path: "a.bin".into() },
            expect![
                "`a.bin` is a binary file (it contains NUL bytes); it cannot be shown as text, inspect it with `fs__bash` tools such as `file` or `xxd` if allowed [remote]"
            ],
        );
        check(
            FsError::from_io("a/b", io::Error::from(io::ErrorKind::NotADirectory)),
            expect![
                "invalid arguments for `fs__read`: at /: no file or directory at `a/b`: check the path with `fs__ls` or `fs__glob` [invalid_arguments]"
            ],
        );
        check(
            FsError::Cancelled { tool: "read" },
            expect!["call to `fs__read` cancelled [cancelled]"],
        );
    }
}
