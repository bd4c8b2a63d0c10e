//! toolmux-fs: the builtin tools a coding or operations agent needs — `read`, `write`,
//! `edit`, `multi_edit`, `apply_patch`, `undo`, `grep`, `glob`, `ls`, `bash` and `exec` — as one
//! [`toolmux_core::ToolProvider`] (namespace `fs`), confined beneath a workspace root.
//!
//! It is for programs that give a model file and shell access: the `toolmux` facade wires
//! it from the configuration file; a Rust program can use it directly.
//!
//! - Every path goes through one resolver built on `cap-std`: components are resolved one
//!   by one beneath the root, symlinks included, and `..`, absolute paths outside, and
//!   symlinks (or symlinked parents) leading out are refused with an error naming the path.
//! - Tools come in permission classes: read (`read`, `grep`, `glob`, `ls`), write (`write`,
//!   `edit`, `multi_edit`, `apply_patch`, `undo`) and execute (`bash`, `exec`). Only read is
//!   on by default.
//! - `grep` and `glob` run ripgrep's crates in process, off the async threads, and stop
//!   when the call is cancelled. `bash` and `exec` run in their own process group, which is
//!   killed and reaped on timeout (after `SIGTERM` and 2 s to clean up) or cancellation,
//!   and when the command exits, with what
//!   left the group (found by [`toolmux_core::ProcessMark`]). The file tools' confinement cannot reach
//!   a command, so the kernel's does: on Linux each command restricts itself with Landlock
//!   before it executes ([`SandboxConfig`]; by default it reads anything and writes only
//!   beneath the root and the temporary directories), sees `.git` and the embedding
//!   program's files read-only (a user and mount namespace of its own) and, with
//!   `network: false`, can open no socket but a Unix one (a seccomp filter) and reach no
//!   Unix socket bound before it started (each covered in its mount namespace).
//! - Some paths beneath the root are protected: the file tools never change a `.git`
//!   directory, the embedding program's files ([`ProtectedPath`]: configuration,
//!   statistics, and the audit log and spilled outputs, which are not even read) or what
//!   [`FsConfig::protect`] names, whatever symlink or `..` leads there.
//! - A limit: a hard link is its file under one more name, and no name is the file's own,
//!   so a hard link beneath the root to a file outside it (or to a protected file, under
//!   another name) is read as a file of the root. Where the kernel's `protected_hardlinks`
//!   is on (the default) only someone who owns the file or may read and write it can make
//!   the link; refusing files with more than one name would refuse what package stores
//!   (pnpm, uv) link into projects. The file tools never write through such a link: they
//!   write a new file and rename it over the name, so the file elsewhere is unchanged. A
//!   command, which writes in place, can change it through the link.
//!
//! # Example
//!
//! ```
//! use serde_json::json;
//! use toolmux_core::{CallContext, ToolProvider};
//! use toolmux_fs::{FsConfig, FsProvider, Permission};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let root = tempfile::tempdir().unwrap();
//! let fs = FsProvider::new(
//!     FsConfig::new(root.path()).with_permissions([Permission::Read, Permission::Write]),
//! )
//! .unwrap();
//! let ctx = CallContext::new();
//! fs.call("write", json!({"path": "notes/a.txt", "content": "hello\nworld\n"}), &ctx)
//!     .await
//!     .unwrap();
//! let page = fs.call("read", json!({"path": "notes/a.txt"}), &ctx).await.unwrap();
//! assert_eq!(page.to_text(), "     1\thello\n     2\tworld\n");
//! let escape = fs.call("read", json!({"path": "../etc/passwd"}), &ctx).await.unwrap_err();
//! assert!(escape.to_string().contains("outside the workspace root"));
//! # });
//! ```
#![deny(missing_docs)]

mod aliases;
mod commands;
mod config;
mod error;
mod ignores;
mod protect;
mod provider;
mod sandbox;
mod tools;
mod workspace;

pub use commands::{
    COMMANDS_NAMESPACE, CommandLine, CommandOutput, CommandToolConfig, CommandTools,
};
pub use config::{BashConfig, FsConfig, FsLimits, Permission, SandboxConfig, SandboxMode};
pub use error::FsError;
pub use protect::{AGENT_FILES, ProtectedKind, ProtectedPath};
pub use provider::FsProvider;
pub use tools::edit::{EditArgs, EditOperation, MultiEditArgs};
pub use tools::glob::GlobArgs;
pub use tools::grep::{GrepArgs, OutputMode};
pub use tools::ls::LsArgs;
pub use tools::read::ReadArgs;
pub use tools::shell::{BashArgs, ExecArgs};
pub use tools::write::WriteArgs;
