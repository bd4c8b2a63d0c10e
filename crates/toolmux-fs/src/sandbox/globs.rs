//! The user's `protect` and `hide` lines for commands: what they match beneath the root,
//! found by a walk before a command starts, is kept read-only to it (`protect`) or hidden
//! from it (`hide`) by the same mount namespace views as `.git` and toolmux's own files.
//!
//! The walk looks at every entry of the folders it enters, ignored ones included (a `.env`
//! is usually ignored), but does not enter the folders that the root's `.gitignore` and
//! `.git/info/exclude` ignored when the provider started (a `target/` of hundreds of
//! thousands of entries would cost every command a second): read once, so that what an
//! agent writes to a `.gitignore` later cannot take a folder out of the walk. A hidden
//! folder is not entered either (its view hides it whole), nor any `.git`. A walk that
//! would look at more than [`MAX_ENTRIES`] entries, or lines that match more than
//! [`MAX_VIEWS`] paths (each a mount), refuse the command, saying why: what the lines name
//! is never left uncovered in silence.

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Entries a walk looks at, at most.
pub(crate) const MAX_ENTRIES: usize = 200_000;

/// Paths the lines may match, at most: each is a mount (the kernel's `fs.mount-max` is
/// 100,000 by default, and every mount costs the command's start).
pub(crate) const MAX_VIEWS: usize = 2_000;

/// The user's lines, with the root they are relative to.
#[derive(Debug, Clone)]
pub(crate) struct UserGlobs {
    pub(crate) root: PathBuf,
    pub(crate) protect: Arc<Gitignore>,
    pub(crate) hide: Arc<Gitignore>,
    /// The folders not entered, as the root's ignore files said at the start.
    skip: Arc<Gitignore>,
}

/// What the lines match now: absolute paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Matched {
    pub(crate) read_only: Vec<PathBuf>,
    pub(crate) hidden: Vec<PathBuf>,
}

impl UserGlobs {
    /// The lines beneath `root`, with the folders its ignore files ignore now.
    pub(crate) fn new(root: &Path, protect: Arc<Gitignore>, hide: Arc<Gitignore>) -> UserGlobs {
        let mut skip = GitignoreBuilder::new(root);
        for file in [root.join(".gitignore"), root.join(".git/info/exclude")] {
            if file.is_file()
                && let Some(e) = skip.add(&file)
            {
                tracing::debug!("`{}`: {e}", file.display());
            }
        }
        let skip = skip.build().unwrap_or_else(|_| Gitignore::empty());
        UserGlobs { root: root.to_path_buf(), protect, hide, skip: Arc::new(skip) }
    }

    /// Whether there is any line at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.protect.is_empty() && self.hide.is_empty()
    }

    /// Whether a `hide` line covers `relative`: as the file tools read them, a line names a
    /// file or a folder alike (`secrets/` hides a file named so too).
    fn hidden(&self, relative: &Path) -> bool {
        [false, true]
            .into_iter()
            .any(|dir| matches!(self.hide.matched(relative, dir), Match::Ignore(_)))
    }

    /// Whether a `protect` line covers `relative`, a folder when `is_dir`.
    fn protected(&self, relative: &Path, is_dir: bool) -> bool {
        matches!(self.protect.matched(relative, is_dir), Match::Ignore(_))
    }

    /// Walks the root (blocking; see the module's documentation). The error says why the
    /// lines cannot be kept for commands.
    pub(crate) fn find(&self) -> Result<Matched, String> {
        let mut matched = Matched::default();
        if self.is_empty() {
            return Ok(matched);
        }
        // Each folder is listed once, its entries matched as they come: the folders to
        // enter are told from the same entries (an `ignore` walker listed each folder for
        // its own sake, and the lines' matching listed it again, twice the cost).
        let mut folders = vec![self.root.clone()];
        let mut looked = 0usize;
        while let Some(dir) = folders.pop() {
            let Ok(children) = std::fs::read_dir(&dir) else { continue };
            for child in children.filter_map(Result::ok) {
                looked += 1;
                if looked > MAX_ENTRIES {
                    return Err(format!(
                        "the workspace has more than {MAX_ENTRIES} entries outside the folders \
                         its `.gitignore` ignores, too many to find what the `protect` and \
                         `hide` lines name before each command; ignore large folders in the \
                         root's `.gitignore` (read when toolmux starts), or set \
                         `fs.bash.sandbox.protectPaths: false`"
                    ));
                }
                let path = child.path();
                let Ok(relative) = path.strip_prefix(&self.root) else { continue };
                let Ok(kind) = child.file_type() else { continue };
                let (hide, protect) =
                    (self.hidden(relative), self.protected(relative, kind.is_dir()));
                // A hidden folder is taken whole by its view; a protected one is entered,
                // for what a `hide` line names inside. A symlink is not followed.
                let entered = kind.is_dir()
                    && !hide
                    && child.file_name() != ".git"
                    && !matches!(
                        self.skip.matched_path_or_any_parents(relative, true),
                        Match::Ignore(_)
                    );
                if entered {
                    folders.push(path.clone());
                }
                if !hide && !protect {
                    continue;
                }
                // A link is kept by its target's view (a mount over a link is one over its
                // target), as the file tools judge a link by where it leads.
                let path = if kind.is_symlink() {
                    match std::fs::canonicalize(&path) {
                        Ok(target) => target,
                        Err(_) => continue,
                    }
                } else {
                    path
                };
                if hide {
                    matched.hidden.push(path);
                } else {
                    matched.read_only.push(path);
                }
                if matched.hidden.len() + matched.read_only.len() > MAX_VIEWS {
                    return Err(format!(
                        "the `protect` and `hide` lines name more than {MAX_VIEWS} paths, each \
                         of which a command would have to be kept from by a mount of its own; \
                         name folders rather than the files in them"
                    ));
                }
            }
        }
        Ok(matched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn globs(root: &Path, protect: &[&str], hide: &[&str]) -> UserGlobs {
        let build = |lines: &[&str]| {
            let mut b = GitignoreBuilder::new(root);
            for line in lines {
                b.add_line(None, line).unwrap();
            }
            Arc::new(b.build().unwrap())
        };
        UserGlobs::new(root, build(protect), build(hide))
    }

    fn write(root: &Path, files: &[(&str, &str)]) {
        for (path, text) in files {
            let at = root.join(path);
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(at, text).unwrap();
        }
    }

    fn sorted(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
        paths.sort();
        paths
    }

    #[test]
    fn lines_find_what_they_match_ignored_files_too_but_not_inside_ignored_folders() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            &[
                (".gitignore", ".env\ntarget/\n"),
                (".env", "KEY=1"),
                ("app/.env", "KEY=2"),
                ("app/main.rs", ""),
                ("secrets/a.key", ""),
                ("target/deep/.env", ""),
                ("config/secrets.yaml", ""),
                ("config/app.yaml", ""),
                ("vendor/lib/.git/config", ""),
            ],
        );
        let lines =
            globs(root, &["**/.env", "config/", "**/.git"], &["secrets/", "**/secrets.yaml"]);
        let found = lines.find().unwrap();
        let read_only = [".env", "app/.env", "config", "vendor/lib/.git"].map(|p| root.join(p));
        assert_eq!(sorted(found.read_only), read_only);
        // Inside a protected folder, what a `hide` line names is hidden.
        assert_eq!(sorted(found.hidden), [root.join("config/secrets.yaml"), root.join("secrets")]);
        assert_eq!(globs(root, &[], &[]).find().unwrap(), Matched::default());
    }

    /// What an agent writes to a `.gitignore` after the start takes nothing out of the walk.
    #[test]
    fn ignore_files_written_later_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, &[("sub/deep/.env", "")]);
        let lines = globs(root, &["**/.env"], &[]);
        write(root, &[(".gitignore", "sub/\n"), ("sub/.gitignore", "*\n")]);
        assert_eq!(lines.find().unwrap().read_only, [root.join("sub/deep/.env")]);
    }

    #[test]
    fn a_file_named_like_a_hidden_folder_is_hidden_and_links_are_kept_by_their_target() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, &[("secrets", "a file")]);
        write(outside.path(), &[("real.env", "TOP")]);
        std::os::unix::fs::symlink(outside.path().join("real.env"), root.join(".env")).unwrap();
        let found = globs(root, &[], &["secrets/", ".env"]).find().unwrap();
        let target = std::fs::canonicalize(outside.path().join("real.env")).unwrap();
        assert_eq!(sorted(found.hidden), sorted(vec![root.join("secrets"), target]));
    }

    #[test]
    fn too_many_matches_refuse_rather_than_leave_some_uncovered() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for i in 0..=MAX_VIEWS {
            std::fs::write(root.join(format!("{i}.key")), "").unwrap();
        }
        let refused = globs(root, &["*.key"], &[]).find().unwrap_err();
        assert!(refused.contains("more than 2000 paths"), "{refused}");
    }
}
