//! `ls`: a directory tree to a chosen depth, through the confined directory handle.

use crate::config::FsLimits;
use crate::error::FsError;
use crate::workspace::Workspace;
use cap_std::fs::Dir;
use globset::{Glob, GlobSet, GlobSetBuilder};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use toolmux_core::ToolOutput;

/// The deepest `ls` goes.
const MAX_DEPTH: usize = 10;

/// Arguments of `ls`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LsArgs {
    /// The directory to list, relative to the workspace root or absolute inside it
    /// (default: the root).
    #[serde(default)]
    pub path: Option<String>,
    /// Levels to descend: 1 lists the directory itself (default 1, at most 10).
    #[serde(default)]
    #[schemars(range(min = 1, max = 10))]
    pub depth: Option<usize>,
    /// Glob patterns of names or relative paths to leave out, such as `target` or `*.log`.
    #[serde(default)]
    pub ignore: Option<Vec<String>>,
    /// Entries to list at most (default 200).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<usize>,
}

pub(crate) const DESCRIPTION: &str = "List a directory of the workspace (default: the root) as an \
indented tree, entries sorted by name: directories end with `/`, symlinks with `@` and their \
target (`-> (outside the workspace)` when it leaves the root; symlinks are never descended), \
other special files with `?`, files show their size in bytes. `depth` (default 1) descends into \
subdirectories; `.git` is listed but not descended. `ignore` takes globs of names or relative \
paths to leave out. At most `limit` (default 200) entries; a footer says how many were left out.";

/// Runs `ls`; blocking.
pub(crate) fn ls(
    ws: &Workspace,
    limits: &FsLimits,
    args: LsArgs,
    cancelled: &AtomicBool,
) -> Result<ToolOutput, FsError> {
    let given = args.path.clone().unwrap_or_else(|| ".".into());
    let path = ws.resolve(&given)?;
    let meta = ws.dir().metadata(&path.relative).map_err(|e| FsError::from_io(&given, e))?;
    if !meta.is_dir() {
        return Err(FsError::NotDirectory { path: given });
    }
    let dir = ws.dir().open_dir(&path.relative).map_err(|e| FsError::from_io(&given, e))?;
    let base = ws.canonical(&path)?;
    let mut ignore = GlobSetBuilder::new();
    for pattern in args.ignore.iter().flatten() {
        let glob = Glob::new(pattern).map_err(|e| FsError::InvalidArguments {
            tool: "ls",
            message: format!("invalid `ignore` glob `{pattern}`: {e}"),
        })?;
        ignore.add(glob);
    }
    let ignore = ignore.build().map_err(|e| FsError::InvalidArguments {
        tool: "ls",
        message: format!("invalid `ignore` globs: {e}"),
    })?;
    let mut listing = Listing {
        ws,
        ignore,
        depth: args.depth.unwrap_or(1).clamp(1, MAX_DEPTH),
        limit: args.limit.unwrap_or(limits.ls_limit).max(1),
        text: String::new(),
        shown: 0,
        left_out: 0,
        cancelled,
    };
    let shown_root = ws.display(&ws.root().join(&base));
    let _ = writeln!(listing.text, "{}/", shown_root.trim_end_matches('/'));
    listing.walk(&dir, &base, Path::new(""), 1)?;
    if cancelled.load(Ordering::Relaxed) {
        return Err(FsError::Cancelled { tool: "ls" });
    }
    let mut text = listing.text;
    if listing.shown == 0 {
        text.push_str("[empty directory]\n");
    }
    if listing.left_out > 0 {
        let _ = writeln!(
            text,
            "[{} more entries left out: raise `limit`, lower `depth` or list a subdirectory]",
            listing.left_out
        );
    }
    Ok(ToolOutput::text(text.trim_end().to_owned())
        .with_extra("entries", json!(listing.shown))
        .with_extra("leftOut", json!(listing.left_out))
        .with_extra("truncated", json!(listing.left_out > 0)))
}

struct Listing<'a> {
    ws: &'a Workspace,
    ignore: GlobSet,
    depth: usize,
    limit: usize,
    text: String,
    shown: usize,
    left_out: usize,
    cancelled: &'a AtomicBool,
}

impl Listing<'_> {
    /// Lists `dir` (at `base/relative` beneath the root) at `level`.
    fn walk(
        &mut self,
        dir: &Dir,
        base: &Path,
        relative: &Path,
        level: usize,
    ) -> Result<(), FsError> {
        if self.cancelled.load(Ordering::Relaxed) {
            return Ok(());
        }
        let shown_dir = relative.to_string_lossy().into_owned();
        let entries = dir.entries().map_err(|e| FsError::from_io(&shown_dir, e))?;
        let mut names: Vec<(String, cap_std::fs::FileType)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                Some((e.file_name().to_string_lossy().into_owned(), e.file_type().ok()?))
            })
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let indent = "  ".repeat(level);
        for (name, kind) in names {
            let child: PathBuf = relative.join(&name);
            if self.ignore.is_match(&name) || self.ignore.is_match(&child) {
                continue;
            }
            if self.shown >= self.limit {
                self.left_out += 1;
                continue;
            }
            self.shown += 1;
            if kind.is_dir() {
                let _ = writeln!(self.text, "{indent}{name}/");
                if level < self.depth && name != ".git" {
                    match dir.open_dir(&name) {
                        Ok(sub) => self.walk(&sub, base, &child, level + 1)?,
                        Err(e) => {
                            let _ = writeln!(self.text, "{indent}  [cannot list: {e}]");
                        }
                    }
                }
            } else if kind.is_symlink() {
                let target = self.symlink_target(&base.join(&child));
                let _ = writeln!(self.text, "{indent}{name}@ -> {target}");
            } else if kind.is_file() {
                let size = dir.symlink_metadata(&name).map(|m| m.len()).unwrap_or(0);
                let _ = writeln!(self.text, "{indent}{name} ({size} bytes)");
            } else {
                let _ = writeln!(self.text, "{indent}{name}?");
            }
        }
        Ok(())
    }

    /// Where a symlink leads, shown only when it stays beneath the root.
    fn symlink_target(&self, link: &Path) -> String {
        match self.ws.dir().canonicalize(link) {
            Ok(target) => {
                let shown = self.ws.display(&self.ws.root().join(&target));
                if self.ws.dir().is_dir(&target) { format!("{shown}/") } else { shown }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "(dangling)".into(),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                "(symlink loop)".into()
            }
            Err(_) => "(outside the workspace)".into(),
        }
    }
}
