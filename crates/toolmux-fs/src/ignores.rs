//! The ignore rules beneath the root as git and ripgrep read them, for `grep`, `glob` and
//! `ls`: each folder's `.gitignore` and `.ignore`, and `.git/info/exclude` of the
//! repository a folder is in. A repository nested beneath the root (a clone, or several
//! repositories side by side under it; anything with a `.git` of its own) starts afresh,
//! as git has it: the `.gitignore` files and exclude file of the repository around it do
//! not apply inside it, its own do. `.ignore` files, ripgrep's own, apply across
//! repositories, as in ripgrep.
//!
//! Read through the root's handle (a link among them leading out of the root is not
//! followed) and only for the folders a walk or listing reaches, once per call: what an
//! agent writes to a `.gitignore` counts from its next call on.

use cap_std::fs::Dir;
use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The rules of the folders one call looks at, each folder's read once.
#[derive(Debug)]
pub(crate) struct IgnoreRules {
    dir: Arc<Dir>,
    /// The root, absolute: the rules' paths are matched beneath it.
    root: PathBuf,
    /// By folder, relative to the root.
    folders: Mutex<HashMap<PathBuf, Arc<Folder>>>,
}

/// The rules that apply to the entries of one folder.
#[derive(Debug, Default)]
struct Folder {
    /// `.ignore` files of the folder and those above it, deepest first.
    ignore: Vec<Arc<Gitignore>>,
    /// `.gitignore` files of the folder and those above it up to the top of its
    /// repository, deepest first, then that repository's `info/exclude`.
    git: Vec<Arc<Gitignore>>,
}

impl IgnoreRules {
    /// The rules beneath `root` (absolute), read through `dir`, its handle.
    pub(crate) fn new(dir: Arc<Dir>, root: &Path) -> IgnoreRules {
        IgnoreRules { dir, root: root.to_path_buf(), folders: Mutex::default() }
    }

    /// Whether the rules leave out `relative` (a path beneath the root, a folder when
    /// `is_dir`): the first `.ignore` rule that matches it decides, from its own folder
    /// up, then the first `.gitignore` rule, then the exclude file. Only the path itself is
    /// matched, not its folders: a walk or listing does not enter an ignored folder, and
    /// one started inside an ignored folder was asked for.
    pub(crate) fn ignored(&self, relative: &Path, is_dir: bool) -> bool {
        let Some(parent) = relative.parent() else { return false };
        let folder = self.folder(parent);
        let absolute = self.root.join(relative);
        // Whether the first rule of `rules` that matches ignores it (`None`: none matches).
        let first = |rules: &[Arc<Gitignore>]| {
            rules.iter().map(|r| r.matched(&absolute, is_dir)).find_map(|m| match m {
                Match::None => None,
                Match::Ignore(_) => Some(true),
                Match::Whitelist(_) => Some(false),
            })
        };
        first(&folder.ignore).or_else(|| first(&folder.git)).unwrap_or(false)
    }

    /// The rules of the entries of `relative`, a folder beneath the root, read now if this
    /// call has not read them yet.
    fn folder(&self, relative: &Path) -> Arc<Folder> {
        let relative = clean(relative);
        if let Some(folder) = self.folders.lock().unwrap_or_else(|e| e.into_inner()).get(&relative)
        {
            return folder.clone();
        }
        let above = relative.parent().map(|parent| self.folder(parent));
        let mut folder = Folder::default();
        folder.ignore.extend(self.rules(&relative, &[relative.join(".ignore")]));
        folder.git.extend(self.rules(&relative, &[relative.join(".gitignore")]));
        // The top of a repository (the root counts as one: nothing above it is read).
        let top = above.is_none() || self.dir.symlink_metadata(relative.join(".git")).is_ok();
        if top {
            let exclude = self.git_dir(&relative).map(|git| git.join("info/exclude"));
            folder.git.extend(exclude.and_then(|file| self.rules(&relative, &[file])));
        }
        if let Some(above) = above {
            folder.ignore.extend(above.ignore.iter().cloned());
            if !top {
                folder.git.extend(above.git.iter().cloned());
            }
        }
        let folder = Arc::new(folder);
        self.folders.lock().unwrap_or_else(|e| e.into_inner()).insert(relative, folder.clone());
        folder
    }

    /// The git directory of the repository whose top is `relative`: its `.git` folder, or
    /// where a `.git` file (a submodule's, a worktree's) points, when that is beneath the
    /// root.
    fn git_dir(&self, relative: &Path) -> Option<PathBuf> {
        let dot_git = relative.join(".git");
        let meta = self.dir.symlink_metadata(&dot_git).ok()?;
        if meta.is_dir() {
            return Some(dot_git);
        }
        let text = read_regular(&self.dir, &dot_git)?;
        let target = Path::new(text.lines().next()?.strip_prefix("gitdir:")?.trim());
        match target.strip_prefix(&self.root) {
            Ok(inside) => Some(inside.to_path_buf()),
            Err(_) if target.is_relative() => Some(clean(&relative.join(target))),
            Err(_) => None,
        }
    }

    /// The rules of `files` (relative to the root) for the entries beneath `base`; `None`
    /// when none of them has a rule.
    fn rules(&self, base: &Path, files: &[PathBuf]) -> Option<Arc<Gitignore>> {
        let mut builder = GitignoreBuilder::new(self.root.join(base));
        let mut any = false;
        for file in files {
            let Some(text) = read_regular(&self.dir, file) else { continue };
            for line in text.lines() {
                any |= builder.add_line(Some(self.root.join(file)), line).is_ok();
            }
        }
        let rules = builder.build().ok().filter(|_| any)?;
        (!rules.is_empty()).then(|| Arc::new(rules))
    }
}

/// The text of `relative` through `dir` if it is a regular file of at most 16 MiB, judged
/// by the file opened, without waiting: a FIFO named `.gitignore`, `.ignore` or `.git`
/// (which a command may make) held every later `grep`, `glob` and `ls` for ever.
fn read_regular(dir: &Dir, relative: &Path) -> Option<String> {
    use cap_std::fs::OpenOptionsExt as _;
    use std::io::Read as _;
    const LIMIT: u64 = 16 << 20;
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = dir.open_with(relative, &options).ok()?.into_std();
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > LIMIT {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(LIMIT).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// `path` without `.` components and with each `..` taking away the name before it (a
/// `..` at the start is kept: the handle refuses it).
fn clean(path: &Path) -> PathBuf {
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir if clean.file_name().is_some() => {
                clean.pop();
            }
            other => clean.push(other),
        }
    }
    clean
}
