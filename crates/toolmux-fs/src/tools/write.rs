//! `write`: whole-file writes, atomic, refusing to clobber what was not read or has changed.

use crate::config::FsLimits;
use crate::error::FsError;
use crate::workspace::{self, Workspace};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use toolmux_core::ToolOutput;

/// Arguments of `write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The file to write: relative to the workspace root, or absolute inside it.
    pub path: String,
    /// The complete new content of the file.
    pub content: String,
}

pub(crate) const DESCRIPTION: &str = "Write a file in the workspace, replacing its whole content. \
Parent directories are created. The write is atomic (a temporary file renamed over the target) \
and an existing file keeps its permissions. An existing file must have been read with `read` in \
this run, and must not have changed since (checked by content hash): otherwise the write is \
refused and you must read the file (again) first. Prefer `edit` for changes to existing files. \
Paths are relative to the workspace root or absolute inside it; nothing outside the root can be \
written.";

/// Writes `args.content` to `args.path`.
pub(crate) fn write(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    args: WriteArgs,
) -> Result<ToolOutput, FsError> {
    let path = ws.resolve(&args.path)?;
    if args.content.len() as u64 > limits.edit_max_bytes {
        return Err(FsError::TooLarge {
            tool: "write",
            path: path.given,
            size: args.content.len() as u64,
            limit: limits.edit_max_bytes,
        });
    }
    check_existing(ws, run, &path)?;
    let written = ws.write_atomic(&path, args.content.as_bytes())?;
    ws.record_read(run, written.canonical, workspace::hash(args.content.as_bytes()));
    let lines = args.content.lines().count();
    let verb = if written.created { "created" } else { "overwrote" };
    Ok(ToolOutput::text(format!(
        "{verb} `{}` ({} bytes, {lines} lines)",
        path.given,
        args.content.len()
    ))
    .with_extra("created", json!(written.created))
    .with_extra("bytes", json!(args.content.len()))
    .with_extra("lines", json!(lines)))
}

/// Refuses to overwrite an existing file that was not read in `run` or changed since.
fn check_existing(ws: &Workspace, run: &str, path: &workspace::Resolved) -> Result<(), FsError> {
    let canonical = match ws.canonical(path) {
        Ok(canonical) => canonical,
        // Nothing there yet: a new file (escapes are refused when it is created).
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    let meta = ws.dir().metadata(&canonical).map_err(|e| FsError::from_io(&path.given, e))?;
    if meta.is_dir() {
        return Err(FsError::IsDirectory { path: path.given.clone() });
    }
    if ws.last_read(run, &canonical).is_none() {
        return Err(FsError::NotRead { path: path.given.clone() });
    }
    let current = ws.hash_file(path)?;
    ws.check_fresh(run, path, &canonical, &current, true)
}
