//! `ls`: a directory tree to a chosen depth, through the confined directory handle.

use crate::config::FsLimits;
use crate::error::FsError;
use crate::ignores::IgnoreRules;
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

/// Entries counted past the page at most: enough for an exact total in all but huge
/// trees, which are then said to have "more than" so many.
const COUNT_PAST_PAGE: usize = 10_000;

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
    /// Entries to skip first, in the order they are listed, to page through a long
    /// listing (default 0).
    #[serde(default)]
    pub offset: Option<usize>,
    /// List entries whose names start with `.` (default true); false leaves them out and
    /// does not descend into such directories.
    #[serde(default)]
    pub include_hidden: Option<bool>,
    /// Leave out what `.gitignore` and `.ignore` files (and `.git/info/exclude`) exclude,
    /// such as `target/` or `node_modules/` (default true); the footer says how many.
    #[serde(default)]
    pub respect_gitignore: Option<bool>,
}

pub(crate) const DESCRIPTION: &str = "List a directory of the workspace (default: the root) as an \
indented tree, entries sorted by name: directories end with `/`, symlinks with `@` and their \
target (`-> (outside the workspace)` when it leaves the root; symlinks are never descended), \
other special files with `?`, files show their size in bytes. `depth` (default 1) descends into \
subdirectories; `.git` is listed but not descended. `ignore` takes globs of names or relative \
paths to leave out; `include_hidden: false` leaves out names starting with `.` (listed by \
default). What .gitignore and .ignore files exclude is left out and counted in the footer, \
unless `respect_gitignore: false`. At most `limit` (default 200) entries, counted in listing order (a directory's entries \
right after it); a footer says how many there are and which `offset` continues. A page that \
starts inside a directory repeats the lines of the directories above it.";

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
    ws.refuse_hidden(&path, &base)?;
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
    let offset = args.offset.unwrap_or(0);
    let limit = args.limit.unwrap_or(limits.ls_limit).max(1);
    let mut listing = Listing {
        ws,
        ignore,
        depth: args.depth.unwrap_or(1).clamp(1, MAX_DEPTH),
        include_hidden: args.include_hidden.unwrap_or(true),
        offset,
        limit,
        count_until: offset.saturating_add(limit).saturating_add(COUNT_PAST_PAGE),
        text: String::new(),
        shown: 0,
        seen: 0,
        uncounted: false,
        above: Vec::new(),
        cancelled,
        rules: None,
        ignored: 0,
    };
    if args.respect_gitignore.unwrap_or(true) {
        listing.rules = Some(ws.ignore_rules());
    }
    let shown_root = ws.display(&ws.root().join(&base));
    let _ = writeln!(listing.text, "{}/", shown_root.trim_end_matches('/'));
    listing.walk(&dir, &base, Path::new(""), 1)?;
    if cancelled.load(Ordering::Relaxed) {
        return Err(FsError::Cancelled { tool: "ls" });
    }
    let Listing { mut text, shown, seen: total, uncounted, ignored, .. } = listing;
    let end = offset.saturating_add(shown);
    let left_out = total.saturating_sub(end);
    let of = if uncounted { format!("more than {total}") } else { total.to_string() };
    if total == 0 {
        text.push_str("[empty directory]\n");
    } else if shown == 0 {
        let _ = writeln!(text, "[offset {offset} is past the end: there are {of} entries]");
    } else if left_out > 0 || uncounted {
        let _ = writeln!(
            text,
            "[showing entries {}-{end} of {of}; use offset={end} for more, or lower `depth` or \
             list a subdirectory]",
            offset + 1
        );
    } else if offset > 0 {
        let _ = writeln!(text, "[showing entries {}-{end} of {total}]", offset + 1);
    }
    if ignored > 0 {
        let s = if ignored == 1 { "y" } else { "ies" };
        let _ = writeln!(
            text,
            "[{ignored} entr{s} left out by .gitignore or .ignore; respect_gitignore: false lists \
             them]"
        );
    }
    Ok(ToolOutput::text(text.trim_end().to_owned())
        .with_extra("ignored", json!(ignored))
        .with_extra("entries", json!(shown))
        .with_extra("total", json!(total))
        .with_extra("totalExact", json!(!uncounted))
        .with_extra("leftOut", json!(left_out))
        .with_extra("truncated", json!(left_out > 0 || uncounted)))
}

struct Listing<'a> {
    ws: &'a Workspace,
    ignore: GlobSet,
    depth: usize,
    include_hidden: bool,
    /// The page: entries `offset..offset + limit` in listing order.
    offset: usize,
    limit: usize,
    /// Entries are counted up to here, then the walk stops.
    count_until: usize,
    text: String,
    /// Entries on the page.
    shown: usize,
    /// Entries walked so far, on the page or not: the next entry's index.
    seen: usize,
    /// The walk stopped at `count_until` before the end.
    uncounted: bool,
    /// The lines of the directories above the one being walked that are not on the page
    /// and not yet printed; the first entry shown beneath them prints them, so that a page
    /// starting deep in the tree still says where it is.
    above: Vec<Option<String>>,
    cancelled: &'a AtomicBool,
    /// With `respect_gitignore`: the ignore rules, read as the listing reaches each folder.
    rules: Option<IgnoreRules>,
    /// Entries left out by those rules.
    ignored: usize,
}

impl Listing<'_> {
    /// Whether the ignore rules leave out the entry at `path` (relative to the root).
    fn ignored(&self, path: &Path, is_dir: bool) -> bool {
        self.rules.as_ref().is_some_and(|rules| rules.ignored(path, is_dir))
    }

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
        // Each entry by its own name for what is done with it, and as shown (`shown_path`).
        let mut names: Vec<(std::ffi::OsString, String, cap_std::fs::FileType)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let own = e.file_name();
                let shown = crate::workspace::shown_path(&own);
                Some((own, shown, e.file_type().ok()?))
            })
            .collect();
        names.sort_by(|a, b| a.1.cmp(&b.1));
        let indent = "  ".repeat(level);
        for (own, name, kind) in names {
            let child: PathBuf = relative.join(&own);
            if self.ignore.is_match(&name) || self.ignore.is_match(&child) {
                continue;
            }
            if !self.include_hidden && name.starts_with('.') {
                continue;
            }
            // Kept from agents (`hide`): as if it were not there.
            if self.ws.hidden(&base.join(&child)) {
                continue;
            }
            if self.ignored(&base.join(&child), kind.is_dir()) {
                self.ignored += 1;
                continue;
            }
            if self.uncounted || self.seen >= self.count_until {
                self.uncounted = true;
                return Ok(());
            }
            let index = self.seen;
            self.seen += 1;
            let on_page = index >= self.offset && index - self.offset < self.limit;
            if on_page {
                let line = self.line(dir, base, &child, &indent, (&own, &name), kind);
                self.print(&line);
                self.shown += 1;
            }
            if !kind.is_dir() || level >= self.depth || name == ".git" {
                continue;
            }
            match dir.open_dir(&own) {
                Ok(sub) => {
                    self.above.push((!on_page).then(|| format!("{indent}{name}/")));
                    let walked = self.walk(&sub, base, &child, level + 1);
                    self.above.pop();
                    walked?;
                }
                Err(e) if on_page => self.print(&format!("{indent}  [cannot list: {e}]")),
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Prints `line`, after the lines of the directories above it not printed yet.
    fn print(&mut self, line: &str) {
        for above in &mut self.above {
            if let Some(above) = above.take() {
                let _ = writeln!(self.text, "{above}");
            }
        }
        let _ = writeln!(self.text, "{line}");
    }

    /// How an entry is shown.
    fn line(
        &self,
        dir: &Dir,
        base: &Path,
        child: &Path,
        indent: &str,
        (own, name): (&std::ffi::OsStr, &str),
        kind: cap_std::fs::FileType,
    ) -> String {
        if kind.is_dir() {
            format!("{indent}{name}/")
        } else if kind.is_symlink() {
            let target = self.symlink_target(&base.join(child));
            format!("{indent}{name}@ -> {target}")
        } else if kind.is_file() {
            let size = dir.symlink_metadata(own).map(|m| m.len()).unwrap_or(0);
            format!("{indent}{name} ({size} bytes)")
        } else {
            format!("{indent}{name}?")
        }
    }

    /// Where a symlink leads, shown only when it stays beneath the root.
    fn symlink_target(&self, link: &Path) -> String {
        match self.ws.dir().canonicalize(link) {
            // Not even its name is shown of a path kept from agents (`hide`).
            Ok(target) if self.ws.hidden(&target) => "(a path kept from agents)".into(),
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
