//! The user's `protect` and `hide` lines for commands: what they match beneath the root,
//! found by a walk before each command starts, is kept read-only to it (`protect`) or
//! hidden from it (`hide`) by the same mount namespace views as `.git` and toolmux's own
//! files.
//!
//! The walk does not enter a directory `.gitignore` ignores (a `target/` or
//! `node_modules/` of hundreds of thousands of entries would cost every command a
//! second), but looks at every entry of the directories it enters, ignored ones included:
//! a `.env` or `secrets/` the repository ignores is found, a `**/*.pem` deep inside an
//! ignored directory is not. It stops at [`MAX_ENTRIES`], saying so once. It does not enter
//! what a line matches (the view covers it whole) nor any `.git`.

use ignore::Match;
use ignore::gitignore::Gitignore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Entries a walk looks at, at most.
pub(crate) const MAX_ENTRIES: usize = 200_000;

/// The user's lines, with the root they are relative to.
#[derive(Debug, Clone)]
pub(crate) struct UserGlobs {
    pub(crate) root: PathBuf,
    pub(crate) protect: Arc<Gitignore>,
    pub(crate) hide: Arc<Gitignore>,
}

/// What the lines match now: absolute paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Matched {
    pub(crate) read_only: Vec<PathBuf>,
    pub(crate) hidden: Vec<PathBuf>,
}

/// Whether a walk was cut short at [`MAX_ENTRIES`] already (said once per process).
static CUT_SAID: AtomicBool = AtomicBool::new(false);

impl UserGlobs {
    /// Whether there is any line at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.protect.is_empty() && self.hide.is_empty()
    }

    /// Which line, if any, covers `relative`: `Some(true)` hides it, `Some(false)` keeps it
    /// read-only (hiding wins, as for the file tools).
    fn covers(&self, relative: &Path, is_dir: bool) -> Option<bool> {
        let hit = |globs: &Gitignore| matches!(globs.matched(relative, is_dir), Match::Ignore(_));
        if hit(&self.hide) {
            Some(true)
        } else if hit(&self.protect) {
            Some(false)
        } else {
            None
        }
    }

    /// Walks the root (blocking; see the module's documentation).
    pub(crate) fn find(&self) -> Matched {
        let mut matched = Matched::default();
        if self.is_empty() {
            return matched;
        }
        let root = self.root.clone();
        let this = self.clone();
        let walker = ignore::WalkBuilder::new(&self.root)
            .hidden(false)
            .parents(false)
            .ignore(false)
            .git_global(false)
            .git_ignore(true)
            .git_exclude(true)
            .require_git(false)
            .follow_links(false)
            .filter_entry(move |entry| {
                let is_dir = entry.file_type().is_some_and(|t| t.is_dir());
                if !is_dir || entry.depth() == 0 {
                    return true;
                }
                if entry.file_name() == ".git" {
                    return false;
                }
                // A covered directory was taken whole by its parent's look.
                let relative = entry.path().strip_prefix(&root).unwrap_or(entry.path());
                this.covers(relative, true).is_none()
            })
            .build();
        let mut looked = 0usize;
        'walk: for entry in walker.filter_map(Result::ok) {
            if !entry.file_type().is_some_and(|t| t.is_dir()) {
                continue;
            }
            let Ok(children) = std::fs::read_dir(entry.path()) else { continue };
            for child in children.filter_map(Result::ok) {
                looked += 1;
                if looked > MAX_ENTRIES {
                    if !CUT_SAID.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            root = %self.root.display(),
                            "the `protect` and `hide` lines reach commands for the first {MAX_ENTRIES} \
                             entries of the workspace only; anchor them (`/secrets/`) or ignore \
                             large folders in `.gitignore`"
                        );
                    }
                    break 'walk;
                }
                if child.file_name() == ".git" {
                    continue;
                }
                let path = child.path();
                let Ok(relative) = path.strip_prefix(&self.root) else { continue };
                let is_dir = child.file_type().is_ok_and(|t| t.is_dir());
                match self.covers(relative, is_dir) {
                    Some(true) => matched.hidden.push(path),
                    Some(false) => matched.read_only.push(path),
                    None => {}
                }
            }
        }
        matched
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ignore::gitignore::GitignoreBuilder;

    fn globs(root: &Path, protect: &[&str], hide: &[&str]) -> UserGlobs {
        let build = |lines: &[&str]| {
            let mut b = GitignoreBuilder::new(root);
            for line in lines {
                b.add_line(None, line).unwrap();
            }
            Arc::new(b.build().unwrap())
        };
        UserGlobs { root: root.to_path_buf(), protect: build(protect), hide: build(hide) }
    }

    #[test]
    fn lines_find_what_they_match_ignored_files_too_but_not_inside_ignored_folders() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (path, text) in [
            (".gitignore", ".env\ntarget/\n"),
            (".env", "KEY=1"),
            ("app/.env", "KEY=2"),
            ("app/main.rs", ""),
            ("secrets/a.key", ""),
            ("target/deep/.env", ""),
            (".git/config", ""),
        ] {
            let at = root.join(path);
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(at, text).unwrap();
        }
        let found = globs(root, &["**/.env", ".git/config"], &["secrets/"]).find();
        let mut read_only = found.read_only.clone();
        read_only.sort();
        assert_eq!(read_only, [root.join(".env"), root.join("app/.env")]);
        assert_eq!(found.hidden, [root.join("secrets")]);
        assert_eq!(globs(root, &[], &[]).find(), Matched::default());
    }
}
