//! `glob`: files matching a glob pattern, newest first, gitignore-aware.

use super::Budget;
use crate::config::FsLimits;
use crate::error::FsError;
use crate::workspace::Workspace;
use cap_std::fs::Dir;
use ignore::WalkState;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use toolmux_core::ToolOutput;

/// Arguments of `glob`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    /// The glob, matched against paths relative to `path`: `**/*.rs`, `src/**/*.{ts,tsx}`.
    /// `*` does not cross `/`; `**` does. An absolute pattern inside the workspace is
    /// taken relative to `path`.
    pub pattern: String,
    /// The directory to search, relative to the workspace root or absolute inside it
    /// (default: the root).
    #[serde(default)]
    pub path: Option<String>,
    /// Files to return at most (default 100).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<usize>,
    /// Files to skip first, to page through results.
    #[serde(default)]
    pub offset: Option<usize>,
    /// Whether letter case must match (default true: `*.md` does not match `README.MD`).
    #[serde(default)]
    pub case_sensitive: Option<bool>,
    /// Leave out files that `.gitignore` and `.ignore` files exclude (default true).
    #[serde(default)]
    pub respect_gitignore: Option<bool>,
    /// The order of the results: `modified` (newest first, the default) or `path`.
    #[serde(default)]
    pub sort: Option<GlobSort>,
}

/// How `glob` orders what it finds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GlobSort {
    /// Newest first (modification time), then by path.
    #[default]
    Modified,
    /// By path, as bytes compare.
    Path,
}

pub(crate) const DESCRIPTION: &str = "Find files by glob pattern, such as `**/*.rs` or \
`src/**/*.{ts,tsx}`, matched against paths relative to `path` (default: the workspace root); `*` \
does not cross `/`, `**` does; an absolute pattern inside the workspace (`/repo/src/**/*.rs`) \
is taken relative to `path`. Returns paths relative to the workspace root, newest first \
(modification time), or by path with `sort: path`. Case-sensitive unless `case_sensitive: false`. Respects .gitignore and \
.ignore files unless `respect_gitignore: false`, and skips hidden files unless the pattern names \
them (`.github/**`); symlinks are not followed. At most `limit` (default 100) files; a footer \
says how many were left out and which `offset` continues. A walk still running after 30 s \
stops and returns what it found, marked partial.";

/// `pattern` as matched: relative to `start`, the searched folder (absolute, resolved).
/// A pattern that is an absolute path inside the workspace, or starts with `..`, has its
/// literal folders (those before the first part with a glob character) resolved as any
/// path is, and made relative to `start`: models often write `/repo/src/**/*.rs`, which
/// matched nothing. Refused when they lead out of the root or out of `start`.
fn relative_pattern(
    ws: &Workspace,
    pattern: &str,
    start: &Path,
    given: &str,
) -> Result<String, FsError> {
    let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
    let absolute = pattern.starts_with('/');
    if !absolute && pattern != ".." && !pattern.starts_with("../") {
        return Ok(pattern.to_owned());
    }
    let parts: Vec<&str> = pattern.split('/').collect();
    // The last part is always left to the pattern, a literal file name too.
    let literal = parts
        .iter()
        .take(parts.len() - 1)
        .take_while(|part| !part.contains(['*', '?', '[', '{', '\\']))
        .count();
    let (folders, rest) = (parts[..literal].join("/"), parts[literal..].join("/"));
    let start = start.strip_prefix(ws.root()).unwrap_or(Path::new(""));
    let folders = match absolute {
        true if folders.is_empty() => "/".to_owned(),
        true => folders,
        false => start.join(&folders).to_string_lossy().into_owned(),
    };
    let target = ws.resolve_target(&ws.resolve(&folders)?);
    let Ok(inside) = target.strip_prefix(start) else {
        return Err(FsError::InvalidArguments {
            tool: "glob",
            message: format!(
                "pattern `{pattern}` is not beneath the searched folder `{given}`: give a \
                 pattern relative to it, or set `path` to a folder that holds what you look for"
            ),
        });
    };
    let mut relative: Vec<String> =
        inside.iter().map(|part| globset::escape(&part.to_string_lossy())).collect();
    relative.push(rest);
    Ok(relative.join("/"))
}

/// A walker thread's check that a file it found lies beneath the root, with the folder it
/// checked last kept open: a folder's files come one after another.
#[derive(Debug, Default)]
struct Confirm {
    /// The folder (relative to the root) and its handle, `None` when it cannot be opened
    /// beneath the root (a symlink to outside in its place now).
    folder: Option<(PathBuf, Option<Dir>)>,
}

impl Confirm {
    /// The modification time of `found` (absolute, from the walker) when the same name,
    /// looked up through the root's handle with no symlink followed at its end, is a
    /// regular file with the inode the walker listed (`ino`); `None` otherwise.
    fn modified(&mut self, ws: &Workspace, found: &Path, ino: Option<u64>) -> Option<SystemTime> {
        let relative = found.strip_prefix(ws.root()).ok()?;
        let (parent, name) = (relative.parent()?, relative.file_name()?);
        if self.folder.as_ref().is_none_or(|(open, _)| open != parent) {
            let dir = match parent.as_os_str().is_empty() {
                true => ws.dir().try_clone().ok(),
                false => ws.dir().open_dir(parent).ok(),
            };
            self.folder = Some((parent.to_path_buf(), dir));
        }
        let dir = self.folder.as_ref()?.1.as_ref()?;
        let stat = rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let regular =
            rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile;
        if !regular || ino.is_some_and(|ino| ino != stat.st_ino) {
            return None;
        }
        let since_epoch = u64::try_from(stat.st_mtime)
            .ok()
            .map(|seconds| Duration::new(seconds, u32::try_from(stat.st_mtime_nsec).unwrap_or(0)));
        Some(since_epoch.map_or(SystemTime::UNIX_EPOCH, |d| SystemTime::UNIX_EPOCH + d))
    }
}

/// Runs `glob`; blocking.
pub(crate) fn glob(
    ws: &Workspace,
    limits: &FsLimits,
    args: GlobArgs,
    cancelled: &Arc<AtomicBool>,
    budget: &Budget,
) -> Result<ToolOutput, FsError> {
    let invalid = |message: String| FsError::InvalidArguments { tool: "glob", message };
    let given = args.path.clone().unwrap_or_else(|| ".".into());
    let path = ws.resolve(&given)?;
    let start = ws.walk_start(&path)?;
    if !start.is_dir() {
        return Err(FsError::NotDirectory { path: given });
    }
    let pattern = relative_pattern(ws, &args.pattern, &start, &given)?;
    let pattern = pattern.as_str();
    let matcher = globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .case_insensitive(!args.case_sensitive.unwrap_or(true))
        .build()
        .map_err(|e| invalid(format!("invalid glob `{}`: {e}", args.pattern)))?
        .compile_matcher();
    let found = Mutex::new(Vec::new());
    let mut walk = ws.walker(&start, args.respect_gitignore.unwrap_or(true));
    // Hidden files are skipped, unless the pattern names them (`.github/**/*.yml`).
    if pattern.split('/').any(|part| part.starts_with('.') && part != "." && part != "..") {
        walk.hidden(false);
    }
    walk.build_parallel().run(|| {
        let (start, matcher, found, cancelled) = (&start, &matcher, &found, cancelled);
        let mut confirm = Confirm::default();
        Box::new(move |entry| {
            if cancelled.load(Ordering::Relaxed) || budget.spent() {
                return WalkState::Quit;
            }
            let Ok(entry) = entry else { return WalkState::Continue };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                return WalkState::Continue;
            }
            let Ok(relative) = entry.path().strip_prefix(start) else {
                return WalkState::Continue;
            };
            if !matcher.is_match(relative) {
                return WalkState::Continue;
            }
            // The walker lists folders by path: one swapped for a symlink to a folder
            // outside while it walks is listed too. Only a name that is, through the
            // root's handle, the very file the walker listed is shown.
            let Some(modified) = confirm.modified(ws, entry.path(), entry.ino()) else {
                return WalkState::Continue;
            };
            let shown = ws.display(entry.path());
            found.lock().unwrap_or_else(|e| e.into_inner()).push((modified, shown));
            WalkState::Continue
        })
    });
    if cancelled.load(Ordering::Relaxed) {
        return Err(FsError::Cancelled { tool: "glob" });
    }
    let mut found = found.into_inner().unwrap_or_else(|e| e.into_inner());
    let sort = args.sort.unwrap_or_default();
    match sort {
        GlobSort::Modified => found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1))),
        GlobSort::Path => found.sort_by(|a, b| a.1.cmp(&b.1)),
    }
    let total = found.len();
    if total == 0 {
        let none = ToolOutput::text(format!("No files match `{}` in `{given}`", args.pattern))
            .with_extra("total", json!(0))
            .with_extra("truncated", json!(false));
        return Ok(budget.mark(none, "walk"));
    }
    let offset = args.offset.unwrap_or(0);
    let limit = args.limit.unwrap_or(limits.glob_limit).max(1);
    let shown: Vec<String> = found.into_iter().skip(offset).take(limit).map(|(_, p)| p).collect();
    let end = offset + shown.len();
    let left_out = total - end.min(total);
    let mut text = shown.join("\n");
    if shown.is_empty() {
        let _ = write!(text, "[offset {offset} is past the end: {total} files match]");
    } else if left_out > 0 || offset > 0 {
        let order = match sort {
            GlobSort::Modified => "newest first",
            GlobSort::Path => "by path",
        };
        let _ = write!(text, "\n[showing files {}-{end} of {total}, {order}", offset + 1);
        if left_out > 0 {
            let _ =
                write!(text, "; {left_out} more left out: use offset={end} or narrow the pattern");
        }
        text.push(']');
    }
    let output = ToolOutput::text(text)
        .with_extra("total", json!(total))
        .with_extra("leftOut", json!(left_out))
        .with_extra("truncated", json!(left_out > 0));
    Ok(budget.mark(output, "walk"))
}
