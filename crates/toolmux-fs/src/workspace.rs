//! The one path resolver every file tool uses, the protected paths, the per-run record of
//! what was read, the per-file lock of read-modify-write tools, and the atomic writer.
//!
//! Every file operation goes through a [`cap_std::fs::Dir`] opened on the root: cap-std
//! resolves each path component by component (with `openat2(RESOLVE_BENEATH)` where the
//! kernel has it) and refuses `..`, absolute symlink targets and symlinks that lead out of
//! the root, so no string check stands between a path and the disk. The walkers of `grep`
//! and `glob` start from a directory resolved the same way and never follow symlinks.

use crate::error::FsError;
use crate::ignores::IgnoreRules;
use crate::protect::{Access, Protection, append_lexically};
use cap_std::fs::Dir;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How many runs keep their read records; the oldest is forgotten first.
const RUNS_KEPT: usize = 256;

/// How long a read-modify-write waits for another call changing the same file. Such calls
/// hold a file for one load and one atomic write, so only a stuck disk comes near it.
const FILE_LOCK_WAIT: Duration = Duration::from_secs(60);

/// A content hash.
pub(crate) type Hash = [u8; 32];

/// The workspace root and the state the file tools share.
#[derive(Debug)]
pub(crate) struct Workspace {
    /// The canonical absolute root.
    root: PathBuf,
    /// The root as configured, accepted as a prefix of absolute paths too.
    configured_root: PathBuf,
    dir: std::sync::Arc<Dir>,
    reads: Mutex<ReadRecords>,
    protection: Protection,
    /// The files a read-modify-write tool is changing right now, by the path relative to
    /// the root with symlinks resolved. Invariant: a path is in the set exactly while a
    /// [`FileLock`] for it lives, so the set holds no more than the calls under way.
    changing: Mutex<HashSet<PathBuf>>,
    /// Signalled whenever a path leaves `changing`.
    released: Condvar,
    /// What the runs changed, for `undo`.
    changes: crate::tools::undo::Changes,
}

/// The right to change one file, from [`Workspace::lock_file`] until dropped.
#[derive(Debug)]
pub(crate) struct FileLock<'a> {
    ws: &'a Workspace,
    path: PathBuf,
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        let mut changing = self.ws.changing.lock().unwrap_or_else(|e| e.into_inner());
        changing.remove(&self.path);
        drop(changing);
        self.ws.released.notify_all();
    }
}

/// Content hashes of the files read, per run id, keyed by the path relative to the root
/// with symlinks resolved.
#[derive(Debug, Default)]
struct ReadRecords {
    runs: HashMap<String, RunReads>,
    order: VecDeque<String>,
}

/// What one run read.
#[derive(Debug, Default)]
struct RunReads {
    /// The hash each file had when last read or written, for the freshness checks.
    hashes: HashMap<PathBuf, Hash>,
    /// The page `read` last showed of each file in full.
    pages: HashMap<PathBuf, ShownPage>,
}

/// A page `read` showed in full: the range asked for and the file's hash then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShownPage {
    /// The first line asked for (the first cell, for a notebook shown as cells).
    pub first: u64,
    /// The lines asked for (cells, for a notebook shown as cells).
    pub limit: u64,
    /// Whether the page showed a notebook's cells rather than lines of its text: the same
    /// range of the other view was not shown.
    pub cells: bool,
    /// The character of the line the page started at (`read`'s `start_char`).
    pub start_char: u64,
    /// The whole file's content hash.
    pub hash: Hash,
}

/// What [`Workspace::show_page`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageRepeat {
    /// Show the page.
    Show,
    /// The run was shown this very page of this very content last time: say so instead.
    Unchanged,
}

impl ReadRecords {
    /// The records of `run`, made (forgetting the oldest run past [`RUNS_KEPT`]) if new.
    fn run(&mut self, run: &str) -> &mut RunReads {
        if !self.runs.contains_key(run) {
            if self.order.len() >= RUNS_KEPT
                && let Some(oldest) = self.order.pop_front()
            {
                self.runs.remove(&oldest);
            }
            self.order.push_back(run.to_owned());
        }
        self.runs.entry(run.to_owned()).or_default()
    }
}

/// A path resolved beneath the root.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The path as the caller gave it, for messages.
    pub given: String,
    /// The path relative to the root, not yet resolved through symlinks (`.` for the root).
    pub relative: PathBuf,
}

impl Workspace {
    /// Opens the root, which must be an absolute path to a directory.
    pub fn open(root: &Path) -> Result<Workspace, FsError> {
        if !root.is_absolute() {
            return Err(FsError::Config {
                message: format!("root `{}` is not an absolute path", root.display()),
            });
        }
        let canonical = std::fs::canonicalize(root).map_err(|e| FsError::Config {
            message: format!("root `{}` cannot be opened: {e}", root.display()),
        })?;
        let dir = Dir::open_ambient_dir(&canonical, cap_std::ambient_authority()).map_err(|e| {
            FsError::Config {
                message: format!("root `{}` is not a directory: {e}", root.display()),
            }
        })?;
        Ok(Workspace {
            root: canonical,
            configured_root: root.to_path_buf(),
            dir: std::sync::Arc::new(dir),
            reads: Mutex::new(ReadRecords::default()),
            protection: Protection::default(),
            changing: Mutex::new(HashSet::new()),
            released: Condvar::new(),
            changes: crate::tools::undo::Changes::default(),
        })
    }

    /// What the runs changed, for `undo`.
    pub(crate) fn changes(&self) -> &crate::tools::undo::Changes {
        &self.changes
    }

    /// Replaces the protected set (built against [`Workspace::root`]).
    pub fn with_protection(mut self, protection: Protection) -> Workspace {
        self.protection = protection;
        self
    }

    /// The canonical absolute root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root directory handle; every file operation goes through it.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Turns a caller's path (relative to the root, or absolute inside it) into a path
    /// relative to the root. Nothing is checked on disk yet: cap-std does that on use.
    pub fn resolve(&self, given: &str) -> Result<Resolved, FsError> {
        let outside = || FsError::OutsideRoot { path: given.to_owned() };
        if given.contains('\0') {
            return Err(FsError::InvalidArguments {
                tool: "path",
                message: format!("path `{}` contains a NUL byte", given.escape_debug()),
            });
        }
        // A name `ls`, `glob` or `grep` showed quoted and escaped ([`shown_path`]: not
        // UTF-8, or with control characters) is read back, unless a file is named so.
        let unescaped =
            shown_unescaped(given).filter(|_| self.dir.symlink_metadata(given).is_err());
        let path = unescaped.as_deref().unwrap_or(Path::new(given));
        let relative = if path.is_absolute() {
            let stripped = path
                .strip_prefix(&self.root)
                .or_else(|_| path.strip_prefix(&self.configured_root))
                .map_err(|_| outside())?;
            stripped.to_path_buf()
        } else {
            path.to_path_buf()
        };
        // cap-std refuses `..` that leaves the root on its own; refusing every
        // root-relative path starting with `..` early gives the clearer message without
        // touching the disk.
        if matches!(relative.components().next(), Some(Component::ParentDir)) {
            return Err(outside());
        }
        let relative = if relative.as_os_str().is_empty() { PathBuf::from(".") } else { relative };
        Ok(Resolved { given: given.to_owned(), relative })
    }

    /// [`Workspace::resolve`] for a tool that needs a file: an empty path, which would name
    /// the root (and be answered "is a directory"), is refused saying so.
    pub fn resolve_file(&self, tool: &'static str, given: &str) -> Result<Resolved, FsError> {
        if given.is_empty() {
            return Err(FsError::InvalidArguments {
                tool,
                message: "`path` is empty: give the path of a file, relative to the workspace \
                          root or absolute inside it"
                    .into(),
            });
        }
        self.resolve(given)
    }

    /// Refuses a path that goes through a file as if it were a folder (`notes.txt/a`),
    /// naming the file: the system only says that nothing is there.
    pub fn check_folders(&self, path: &Resolved) -> Result<(), FsError> {
        let parts: Vec<Component<'_>> = path.relative.components().collect();
        for keep in 1..parts.len() {
            let prefix: PathBuf = parts[..keep].iter().collect();
            match self.dir.metadata(&prefix) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    // The same folder as the caller spelled it: the given path without
                    // the components that follow.
                    let mut file = Path::new(&path.given);
                    for _ in keep..parts.len() {
                        file = file.parent().unwrap_or(file);
                    }
                    return Err(FsError::FileInPath {
                        path: path.given.clone(),
                        file: file.display().to_string(),
                    });
                }
                Err(_) => return Ok(()),
            }
        }
        // `a.txt/` has the components of `a.txt`, and the system says only that nothing is
        // there.
        let slashed = path.given.ends_with('/') || path.given.ends_with("/.");
        if slashed
            && let Ok(meta) = self.dir.metadata(parts.iter().collect::<PathBuf>())
            && !meta.is_dir()
        {
            let file = path.given.trim_end_matches('.').trim_end_matches('/');
            return Err(FsError::FileWithSlash { path: path.given.clone(), file: file.to_owned() });
        }
        Ok(())
    }

    /// The path relative to the root with every symlink resolved, beneath the root.
    pub fn canonical(&self, path: &Resolved) -> Result<PathBuf, FsError> {
        self.canonicalize(&path.relative).map_err(|e| FsError::from_io(&path.given, e))
    }

    /// `relative` with symlinks and `..` resolved, relative to the root.
    ///
    /// Only directories are canonicalized by the system; the last component is followed
    /// by hand, link by link. The system's way reads the name back from an open handle,
    /// and a file that another call replaces (every write here renames over its file)
    /// reads back as `NAME (deleted)`: a parallel edit then took another file's lock and
    /// lost an update, and a freshness check missed its record.
    fn canonicalize(&self, relative: &Path) -> io::Result<PathBuf> {
        let mut current = relative.to_path_buf();
        for _ in 0..MAX_LINKS {
            let Some((parent, name)) = split_parent(&current) else {
                // The root, or a path ending in `.` or `..`: a directory.
                return self.dir.canonicalize(&current).map(|p| without_dots(&p));
            };
            let parent = if parent.as_os_str().is_empty() { PathBuf::from(".") } else { parent };
            let base = without_dots(&self.dir.canonicalize(&parent)?);
            let candidate = base.join(&name);
            if !self.dir.symlink_metadata(&candidate)?.file_type().is_symlink() {
                return Ok(candidate);
            }
            current = base.join(self.dir.read_link(&candidate)?);
        }
        Err(io::Error::other(format!(
            "more than {MAX_LINKS} symbolic links in a row (a loop of links?)"
        )))
    }

    /// Where `path` leads, relative to the root: symlinks and `..` resolved as far as the
    /// path exists, and the rest (which a write would create, so free of symlinks) resolved
    /// by hand. Where it would escape the root the result is meaningless, and using the
    /// path fails anyway.
    pub fn resolve_target(&self, path: &Resolved) -> PathBuf {
        let parts: Vec<Component<'_>> = path.relative.components().collect();
        for keep in (0..=parts.len()).rev() {
            let prefix: PathBuf = parts[..keep].iter().collect();
            let prefix = if keep == 0 { PathBuf::from(".") } else { prefix };
            if let Ok(base) = self.canonicalize(&prefix) {
                return append_lexically(without_dots(&base), &parts[keep..]);
            }
        }
        append_lexically(PathBuf::new(), &parts)
    }

    /// Refuses writing `path` when where it leads is protected; returns where it leads.
    pub fn check_write(&self, path: &Resolved) -> Result<PathBuf, FsError> {
        self.check_folders(path)?;
        let target = self.resolve_target(path);
        self.check_access(path, &target, Access::Write)?;
        Ok(target)
    }

    /// Refuses reading `path`, which leads to `canonical`, when that is protected.
    pub fn check_read(&self, path: &Resolved, canonical: &Path) -> Result<(), FsError> {
        self.check_access(path, canonical, Access::Read)
    }

    /// Whether no tool may read `relative` (resolved, relative to the root): walkers skip
    /// such files.
    pub fn unreadable(&self, relative: &Path) -> bool {
        self.protection.unreadable(relative)
    }

    /// `err` with a close path when it says nothing is at the path the caller gave
    /// ([`Workspace::close_path`]); any other error as it is.
    pub(crate) fn with_close_path(&self, err: FsError) -> FsError {
        match err {
            FsError::NotFound { path, suggestion: None } => {
                let suggestion = self.close_path(&path);
                FsError::NotFound { path, suggestion }
            }
            other => other,
        }
    }

    /// An existing path close to `given`, where nothing is: each name missing from its folder
    /// is replaced by the folder's closest one (a typo's distance, case ignored), so that
    /// `src/mian.rs` gives `src/main.rs` and `scr/main.rs` gives `src/main.rs`. None when a
    /// name has no close one, when a folder holds more than [`MAX_SUGGESTION_ENTRIES`] names
    /// (an error should not cost a walk of a huge folder), or when the path found is one
    /// no tool may read (its name is not to be shown). Spelled relative to the root, or
    /// absolute when `given` is.
    pub fn close_path(&self, given: &str) -> Option<String> {
        let resolved = self.resolve(given).ok()?;
        let mut found = PathBuf::new();
        let mut changed = false;
        for component in resolved.relative.components() {
            let Component::Normal(name) = component else {
                found.push(component);
                continue;
            };
            let exact = found.join(name);
            if self.dir.symlink_metadata(&exact).is_ok() {
                found = exact;
                continue;
            }
            let name = name.to_str()?;
            let folder = if found.as_os_str().is_empty() { Path::new(".") } else { &found };
            let mut names = Vec::new();
            for entry in self.dir.read_dir(folder).ok()? {
                let Ok(entry) = entry else { continue };
                if names.len() == MAX_SUGGESTION_ENTRIES {
                    return None;
                }
                if let Ok(entry_name) = entry.file_name().into_string() {
                    names.push(entry_name);
                }
            }
            // Sorted, so that of equally close names the same one is always given.
            names.sort_unstable();
            let candidates: Vec<&str> = names.iter().map(String::as_str).collect();
            let closest = toolmux_core::suggest::closest(name, &candidates)?;
            found.push(closest);
            changed = true;
        }
        if !changed || !self.canonicalize(&found).is_ok_and(|c| !self.unreadable(&without_dots(&c)))
        {
            return None;
        }
        let spelled = if Path::new(given).is_absolute() { self.root.join(&found) } else { found };
        Some(spelled.display().to_string())
    }

    fn check_access(
        &self,
        path: &Resolved,
        resolved: &Path,
        access: Access,
    ) -> Result<(), FsError> {
        let resolved = without_dots(resolved);
        let Some(reason) = self.protection.check(&resolved, access) else { return Ok(()) };
        let differs = without_dots(&path.relative) != resolved;
        Err(FsError::Protected {
            path: path.given.clone(),
            resolved: differs.then(|| resolved.to_string_lossy().into_owned()),
            reason: reason.explain(access),
        })
    }

    /// Waits until no other call is changing `target` (a result of
    /// [`Workspace::check_write`]), then holds it until the lock is dropped: a tool that
    /// loads, checks and writes a file holds it throughout, so parallel calls on one file
    /// take turns and none loses another's change.
    pub fn lock_file(&self, path: &Resolved, target: &Path) -> Result<FileLock<'_>, FsError> {
        let deadline = Instant::now() + FILE_LOCK_WAIT;
        let mut changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        while changing.contains(target) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FsError::Busy {
                    path: path.given.clone(),
                    seconds: FILE_LOCK_WAIT.as_secs(),
                });
            }
            changing = match self.released.wait_timeout(changing, left) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        changing.insert(target.to_path_buf());
        Ok(FileLock { ws: self, path: target.to_path_buf() })
    }

    /// The absolute path of a directory beneath the root, symlinks resolved, for walkers;
    /// refused when it is kept from agents (`hide`).
    pub fn walk_start(&self, path: &Resolved) -> Result<PathBuf, FsError> {
        let canonical = self.canonical(path)?;
        self.refuse_hidden(path, &canonical)?;
        Ok(self.root.join(canonical))
    }

    /// Whether `relative` (resolved, relative to the root) is kept from agents (`hide`):
    /// walkers and listings pass over it as if it were not there.
    pub fn hidden(&self, relative: &Path) -> bool {
        self.protection.hidden(relative)
    }

    /// Refuses `path`, which leads to `canonical`, when it is kept from agents.
    pub fn refuse_hidden(&self, path: &Resolved, canonical: &Path) -> Result<(), FsError> {
        if self.hidden(canonical) {
            return self.check_access(path, canonical, Access::Read);
        }
        Ok(())
    }

    /// A walker from `start` (a result of [`Workspace::walk_start`]) that reads nothing
    /// outside the root: it follows no symlinks and reads no global git excludes and no
    /// ignore files of the root's parents. It never enters a `.git` (a repository's
    /// database: its objects are compressed, its refs and logs repeat what git says) nor
    /// what the `hide` lines name. With `respect_ignore` it is gitignore-aware as git is
    /// ([`IgnoreRules`]: a repository nested beneath the root by its own files alone,
    /// wherever the walk starts); without, it reads no ignore file at all.
    pub fn walker(&self, start: &Path, respect_ignore: bool) -> ignore::WalkBuilder {
        let mut walk = ignore::WalkBuilder::new(start);
        // The ignore files are read by `IgnoreRules`, not by the walker: it has no notion
        // of a nested repository without `require_git`, which would drop the rules of a
        // root that is no repository.
        walk.follow_links(false)
            .require_git(false)
            .parents(false)
            .git_global(false)
            .git_ignore(false)
            .git_exclude(false)
            .ignore(false);
        let hidden = self.protection.hidden_globs().clone();
        let rules = respect_ignore.then(|| IgnoreRules::new(self.dir.clone(), &self.root));
        let root = self.root.clone();
        walk.filter_entry(move |entry| {
            if entry.depth() == 0 {
                return true;
            }
            if entry.file_name() == ".git" {
                return false;
            }
            let Ok(relative) = entry.path().strip_prefix(&root) else { return true };
            let dir = entry.file_type().is_some_and(|t| t.is_dir());
            let kept_from_agents = !hidden.is_empty()
                && matches!(
                    hidden.matched_path_or_any_parents(relative, dir),
                    ignore::Match::Ignore(_)
                );
            !kept_from_agents && !rules.as_ref().is_some_and(|rules| rules.ignored(relative, dir))
        });
        walk
    }

    /// The ignore rules beneath the root, read as a call reaches each folder.
    pub(crate) fn ignore_rules(&self) -> IgnoreRules {
        IgnoreRules::new(self.dir.clone(), &self.root)
    }

    /// How an absolute path found by a walker is shown: relative to the root.
    pub fn display(&self, absolute: &Path) -> String {
        match absolute.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => shown_path(rel.as_os_str()),
            Err(_) => shown_path(absolute.as_os_str()),
        }
    }

    /// Records that `canonical` had content `hash` when read (or written) in `run`.
    pub fn record_read(&self, run: &str, canonical: PathBuf, hash: Hash) {
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.run(run).hashes.insert(canonical, hash);
    }

    /// The hash `canonical` had when last read in `run`.
    pub fn last_read(&self, run: &str, canonical: &Path) -> Option<Hash> {
        let reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.runs.get(run)?.hashes.get(canonical).copied()
    }

    /// Decides whether `read` shows `page` of `canonical` in `run`, or says it is unchanged:
    /// only when the run's last full page of the file was this range of this content, and
    /// that was shown, not itself answered "unchanged" (so asking twice always gets the
    /// lines). `complete` says the page will show its whole range; only such a page is
    /// remembered.
    pub fn show_page(
        &self,
        run: &str,
        canonical: PathBuf,
        page: ShownPage,
        complete: bool,
    ) -> PageRepeat {
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        let pages = &mut reads.run(run).pages;
        if pages.get(&canonical) == Some(&page) {
            pages.remove(&canonical);
            return PageRepeat::Unchanged;
        }
        if complete {
            pages.insert(canonical, page);
        } else {
            pages.remove(&canonical);
        }
        PageRepeat::Show
    }

    /// Checks that an existing file may be overwritten in `run`: it was read, and its
    /// content has not changed since. `require_read` false lets never-read files pass.
    pub fn check_fresh(
        &self,
        run: &str,
        path: &Resolved,
        canonical: &Path,
        current: &Hash,
        require_read: bool,
    ) -> Result<(), FsError> {
        match self.last_read(run, canonical) {
            None if require_read => Err(FsError::NotRead { path: path.given.clone() }),
            Some(hash) if &hash != current => Err(FsError::Stale { path: path.given.clone() }),
            _ => Ok(()),
        }
    }

    /// Reads a whole regular file (at most `limit` bytes) through the resolver.
    pub fn read_small(
        &self,
        tool: &'static str,
        path: &Resolved,
        limit: u64,
    ) -> Result<Vec<u8>, FsError> {
        let (file, meta) = self.open_regular(path)?;
        read_whole(tool, path, file, &meta, limit)
    }

    /// [`Workspace::read_small`] of the file at `canonical`, where `path` led when it was
    /// checked, opened with no symlink followed ([`Workspace::open_regular_at`]).
    pub fn read_small_at(
        &self,
        tool: &'static str,
        path: &Resolved,
        canonical: &Path,
        limit: u64,
    ) -> Result<Vec<u8>, FsError> {
        let (file, meta) = self.open_regular_at(path, canonical)?;
        read_whole(tool, path, file, &meta, limit)
    }

    /// Opens `path` for reading if it is a regular file, judged by the open file itself:
    /// the open does not block (a FIFO put in the file's place after a check would
    /// otherwise hang it until a writer came), and what was opened is what is checked.
    pub fn open_regular(
        &self,
        path: &Resolved,
    ) -> Result<(std::fs::File, std::fs::Metadata), FsError> {
        let file = self.open_file(&path.relative).map_err(|e| FsError::from_io(&path.given, e))?;
        regular(path, file)
    }

    /// [`Workspace::open_regular`] of the file at `canonical` (where `path` led when it was
    /// checked, a result of [`Workspace::canonical`]), opened with no symlink followed
    /// ([`Workspace::open_beneath`]): what is read is what was checked. A path that meets a
    /// symlink, or nothing, where the check found a file changed since, and is refused so.
    pub fn open_regular_at(
        &self,
        path: &Resolved,
        canonical: &Path,
    ) -> Result<(std::fs::File, std::fs::Metadata), FsError> {
        let file = self.open_beneath(canonical).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT | libc::EXDEV) => {
                FsError::ChangedWhileRead { path: path.given.clone() }
            }
            _ => FsError::from_io(&path.given, e),
        })?;
        regular(path, file)
    }

    /// Opens `relative` (relative to the root, symlinks resolved: a result of
    /// [`Workspace::canonical`] or a walker's entry) for reading without blocking, following
    /// no symlink on the way or at its end: it fails (`ELOOP`) when one is there now. A
    /// check of where a path leads and an open that follows links again could meet two
    /// different files (a name swapped for a symlink to a `hide` file in between); a path
    /// with no links in it leads to one file only.
    pub fn open_beneath(&self, relative: &Path) -> io::Result<std::fs::File> {
        use rustix::fs::{Mode, OFlags, ResolveFlags};
        let read = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
        let relative = without_dots(relative);
        let relative = if relative.as_os_str().is_empty() { Path::new(".") } else { &relative };
        let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH;
        match rustix::fs::openat2(&*self.dir, relative, read, Mode::empty(), resolve) {
            Ok(fd) => return Ok(fd.into()),
            // Kernels before 5.6, and sandboxes that filter the call: folder by folder.
            Err(e) if e == rustix::io::Errno::NOSYS || e == rustix::io::Errno::PERM => {}
            Err(e) => return Err(e.into()),
        }
        self.open_by_names(relative, read)
    }

    /// [`Workspace::open_beneath`] one name at a time, each opened without following a
    /// symlink, where the system cannot resolve a path so itself.
    fn open_by_names(
        &self,
        relative: &Path,
        read: rustix::fs::OFlags,
    ) -> io::Result<std::fs::File> {
        use rustix::fs::{Mode, OFlags};
        let mut folder: Option<rustix::fd::OwnedFd> = None;
        let mut parts = relative.components().filter(|part| *part != Component::CurDir).peekable();
        while let Some(part) = parts.next() {
            let Component::Normal(name) = part else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a path opened without following links has only names in it",
                ));
            };
            let flags = match parts.peek() {
                Some(_) => OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                None => read | OFlags::NOFOLLOW,
            };
            let fd = match &folder {
                Some(folder) => rustix::fs::openat(folder, name, flags, Mode::empty()),
                None => rustix::fs::openat(&*self.dir, name, flags, Mode::empty()),
            }?;
            folder = Some(fd);
        }
        let fd = match folder {
            Some(fd) => fd,
            // The root itself.
            None => rustix::fs::openat(&*self.dir, ".", read, Mode::empty())?,
        };
        Ok(fd.into())
    }

    /// Opens `relative` for reading without blocking on a FIFO or a device; reads of a
    /// regular file are not affected by that.
    pub fn open_file(&self, relative: &Path) -> io::Result<std::fs::File> {
        use cap_std::fs::OpenOptionsExt as _;
        let mut options = cap_std::fs::OpenOptions::new();
        options.read(true).custom_flags(libc::O_NONBLOCK);
        Ok(self.dir.open_with(relative, &options)?.into_std())
    }

    /// What `read` recorded for `path` as it is now: its content hash, or its
    /// [`fingerprint`] when it is over `whole_max` bytes.
    pub fn hash_or_fingerprint(&self, path: &Resolved, whole_max: u64) -> Result<Hash, FsError> {
        let err = |e| FsError::from_io(&path.given, e);
        let (mut file, meta) = self.open_regular(path)?;
        if meta.len() > whole_max {
            return fingerprint(&file, &meta).map_err(err);
        }
        let mut hasher = Sha256::new();
        io::copy(&mut file, &mut hasher).map_err(err)?;
        Ok(hasher.finalize().into())
    }

    /// [`Workspace::hash_or_fingerprint`] of the file at `canonical`, where `path` led when
    /// it was checked, opened with no symlink followed ([`Workspace::open_regular_at`]):
    /// what is compared is what was checked.
    pub fn hash_or_fingerprint_at(
        &self,
        path: &Resolved,
        canonical: &Path,
        whole_max: u64,
    ) -> Result<Hash, FsError> {
        let err = |e| FsError::from_io(&path.given, e);
        let (mut file, meta) = self.open_regular_at(path, canonical)?;
        if meta.len() > whole_max {
            return fingerprint(&file, &meta).map_err(err);
        }
        let mut hasher = Sha256::new();
        io::copy(&mut file, &mut hasher).map_err(err)?;
        Ok(hasher.finalize().into())
    }

    /// The SHA-256 of a file's content, streamed: the file where `path` leads, resolved
    /// once and opened with no symlink followed ([`Workspace::open_regular_at`]), so that
    /// the file hashed is the one the path was resolved to.
    pub fn hash_file(&self, path: &Resolved) -> Result<Hash, FsError> {
        let err = |e| FsError::from_io(&path.given, e);
        let canonical = self.canonical(path)?;
        let (mut file, _) = self.open_regular_at(path, &canonical)?;
        let mut hasher = Sha256::new();
        io::copy(&mut file, &mut hasher).map_err(err)?;
        Ok(hasher.finalize().into())
    }

    /// Writes `content` to `path` atomically: a temporary file in the same directory, then a
    /// rename over the target. Parent directories are created (beneath the root); an
    /// existing file keeps its permissions; a symlink at the target is written through
    /// (its target must be beneath the root). Returns the canonical path written and
    /// whether the file was created.
    pub fn write_atomic(&self, path: &Resolved, content: &[u8]) -> Result<Written, FsError> {
        self.write_atomic_like(path, content, None)
    }

    /// [`Workspace::write_atomic`]; a file it creates gets the permissions of `like` (a
    /// file moved keeps its mode), when that is a file.
    pub fn write_atomic_like(
        &self,
        path: &Resolved,
        content: &[u8],
        like: Option<&Resolved>,
    ) -> Result<Written, FsError> {
        // A folder of the path that exists but is no folder any more (a symlink to outside
        // in its place now) fails creating the folders or the file with "File exists":
        // the path changed after it was checked, which a retry settles either way.
        let err = |e: io::Error| match e.kind() {
            io::ErrorKind::AlreadyExists => FsError::PathChanged { path: path.given.clone() },
            _ => FsError::from_io(&path.given, e),
        };
        // The components drop a trailing `/`: the file would take the folder's name.
        if path.given.ends_with('/') && self.dir.symlink_metadata(&path.relative).is_err() {
            return Err(FsError::InvalidArguments {
                tool: "write",
                message: format!(
                    "`{}` names a folder (it ends with `/`): give the path of a file",
                    path.given
                ),
            });
        }
        let like = like
            .and_then(|source| self.dir.symlink_metadata(&source.relative).ok())
            .filter(|meta| meta.is_file())
            .map(|meta| {
                use cap_std::fs::MetadataExt as _;
                meta.mode()
            });
        self.check_write(path)?;
        let target = self.write_target(path)?;
        let (parent, name) = split_parent(&target).ok_or_else(|| FsError::InvalidArguments {
            tool: "write",
            message: format!("`{}` does not name a file", path.given),
        })?;
        let exists = parent.as_os_str().is_empty() || self.dir.metadata(&parent).is_ok();
        // Where the file lands is known exactly: checked again, on the folder opened, in
        // case the path changed since the tool checked it.
        let (parent_dir, landing) = match exists {
            true => self.open_folder(path, &parent, err)?,
            false => self.make_folders(path, &parent, &name, err)?,
        };
        self.check_access(path, &landing.join(&name), Access::Write)?;
        let existing = match parent_dir.symlink_metadata(&name) {
            Ok(meta) if meta.is_dir() => {
                return Err(FsError::IsDirectory { path: path.given.clone() });
            }
            Ok(meta) if !meta.is_file() => {
                return Err(FsError::NotRegularFile { path: path.given.clone() });
            }
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(err(e)),
        };
        // A file whose owner may not write it (`chmod 444`) says it is not to be changed,
        // whoever runs toolmux: the rename below would replace it all the same, and root's
        // permission check passes it.
        if let Some(meta) = &existing {
            read_only(path, meta)?;
        }
        // A rename replaces any file its folder lets us replace: a file that is read-only
        // to us (another user's) is refused as writing into it would be.
        if existing.is_some() {
            let writable = rustix::fs::accessat(
                &parent_dir,
                name.as_os_str(),
                rustix::fs::Access::WRITE_OK,
                rustix::fs::AtFlags::EACCESS,
            );
            if writable.is_err() {
                return Err(err(io::Error::from(io::ErrorKind::PermissionDenied)));
            }
        }
        // Whose it is, to keep: a file replaced by root's rename would become root's.
        let owner = existing.as_ref().map(|meta| {
            use cap_std::fs::MetadataExt as _;
            (meta.uid(), meta.gid())
        });
        let created = existing.is_none();
        let previous_mode = existing.map(|meta| {
            use cap_std::fs::MetadataExt as _;
            meta.mode() & 0o7777
        });
        let mode = previous_mode.or(like);
        // New content is no longer what was made set-user-id or set-group-id: the bits go,
        // as the kernel drops them when an unprivileged process writes such a file (the
        // set-group-id bit only with group execute; without, it marks locking).
        let set_id = mode.map_or(0, |mode| {
            let group = if mode & 0o010 != 0 { 0o2000 } else { 0 };
            mode & (0o4000 | group)
        });
        let existing = mode.map(|mode| std::fs::Permissions::from_mode(mode & !set_id));
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        // The name is cut short so that the temporary name stays within the system's limit
        // of 255 bytes a name (`NAME_MAX`) however long the file's own name is.
        let temp = format!(
            ".{}.toolmux-{}-{}.tmp",
            name_prefix(&name.to_string_lossy(), TEMP_NAME_KEPT_BYTES),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let result = (|| {
            let mut options = cap_std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            let file = parent_dir.open_with(&temp, &options)?;
            let mut file = file.into_std();
            file.write_all(content)?;
            if let Some(perms) = &existing {
                file.set_permissions(perms.clone())?;
            }
            if let Some((uid, gid)) = owner
                && (uid != rustix::process::geteuid().as_raw()
                    || gid != rustix::process::getegid().as_raw())
            {
                // Only root may give a file away; anyone else keeps the file theirs (a
                // group they are not in cannot be given either), as `cp` would.
                let (uid, gid) = (rustix::fs::Uid::from_raw(uid), rustix::fs::Gid::from_raw(gid));
                let _ = rustix::fs::fchown(&file, Some(uid), Some(gid));
                // A change of owner clears set-id bits: set the mode again.
                if let Some(perms) = &existing {
                    let _ = file.set_permissions(perms.clone());
                }
            }
            file.sync_all()?;
            parent_dir.rename(&temp, &parent_dir, &name)?;
            // The rename is durable once the folder is: without this a crash can bring
            // back the old file (or none) after the write was reported done. A file
            // system that cannot sync folders says so; the write itself stands.
            let _ = rustix::fs::fsync(&parent_dir);
            Ok(())
        })();
        if let Err(e) = result {
            let _ = parent_dir.remove_file(&temp);
            return Err(err(e));
        }
        let set_id_cleared = (set_id != 0).then(|| mode.unwrap_or(0));
        Ok(Written {
            canonical: self.canonical(path).unwrap_or(target),
            created,
            previous_mode,
            set_id_cleared,
        })
    }

    /// Removes the regular file at `path` (a symlink there is refused, not followed),
    /// checked as a write: a read-only file is refused as a write to it is.
    pub fn remove_file(&self, path: &Resolved) -> Result<(), FsError> {
        let err = |e: io::Error| FsError::from_io(&path.given, e);
        self.check_write(path)?;
        // `.`, `..` and the root are folders.
        let Some((parent, name)) = split_parent(&path.relative) else {
            return Err(FsError::IsDirectory { path: path.given.clone() });
        };
        // Checked again on the folder the file is removed from: the path may have changed
        // since it was checked.
        let (parent_dir, landing) = self.open_folder(path, &parent, err)?;
        self.check_access(path, &landing.join(&name), Access::Write)?;
        let meta = parent_dir.symlink_metadata(&name).map_err(err)?;
        if meta.is_dir() {
            return Err(FsError::IsDirectory { path: path.given.clone() });
        }
        if !meta.is_file() {
            return Err(FsError::NotRegularFile { path: path.given.clone() });
        }
        read_only(path, &meta)?;
        parent_dir.remove_file(&name).map_err(err)
    }

    /// Opens the existing folder `parent` of `path` (relative to the root, empty for the
    /// root) and says where it is, relative to the root with symlinks resolved, judged by
    /// the folder opened: a file made or removed through the handle is checked against
    /// where it really lands. Resolving the path a second time could meet another folder
    /// (a symlink on the way turned from `ok` to `.git` between the two), and a check of
    /// that one would let a file into the other. A folder that is not where the path now
    /// leads is refused as a path that changed while it was used.
    fn open_folder(
        &self,
        path: &Resolved,
        parent: &Path,
        err: impl Fn(io::Error) -> FsError,
    ) -> Result<(Dir, PathBuf), FsError> {
        use cap_std::fs::MetadataExt as _;
        let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
        let folder = self.dir.open_dir(parent).map_err(&err)?;
        let landing = without_dots(&self.dir.canonicalize(parent).map_err(&err)?);
        // The path found has no symlink in it, and its last component is not followed: a
        // symlink put there since cannot lead the comparison to the folder opened.
        let spelled = if landing.as_os_str().is_empty() { Path::new(".") } else { &landing };
        let found = self.dir.symlink_metadata(spelled).map_err(&err)?;
        let opened = folder.dir_metadata().map_err(&err)?;
        if (found.dev(), found.ino()) != (opened.dev(), opened.ino()) {
            return Err(FsError::PathChanged { path: path.given.clone() });
        }
        Ok((folder, landing))
    }

    /// Makes the missing folders of `parent` (relative to the root, missing) for the file
    /// `name` of `path`, and opens the last, as [`Workspace::open_folder`] opens an
    /// existing one. The folders that exist are resolved first (symlinks followed), and
    /// where the file would land is checked before any folder is made; the folders are
    /// then opened and made one name at a time from the last that exists, following no
    /// symlink. Made by path, they followed any symlink a command had swapped in since the
    /// check (a folder turned into a link to `.git`), and the file refused there left the
    /// folders behind. A symlink met on the way is refused as a path that changed.
    fn make_folders(
        &self,
        path: &Resolved,
        parent: &Path,
        name: &Path,
        err: impl Fn(io::Error) -> FsError,
    ) -> Result<(Dir, PathBuf), FsError> {
        use rustix::fs::{Mode, OFlags};
        let parts: Vec<Component<'_>> = parent.components().collect();
        // The longest part of `parent` that is there, resolved (`.` at worst, the root).
        let (base, missing) = (0..parts.len())
            .rev()
            .find_map(|keep| {
                let prefix: PathBuf = parts[..keep].iter().collect();
                let prefix = if keep == 0 { PathBuf::from(".") } else { prefix };
                let base = self.canonicalize(&prefix).ok()?;
                Some((without_dots(&base), &parts[keep..]))
            })
            .unwrap_or_default();
        let names: Vec<&std::ffi::OsStr> = missing
            .iter()
            .filter(|part| **part != Component::CurDir)
            .map(|part| match part {
                Component::Normal(name) => Ok(*name),
                _ => Err(FsError::InvalidArguments {
                    tool: "write",
                    message: format!(
                        "`{}` goes up (`..`) from a folder that does not exist yet: give the \
                         path without `..`",
                        path.given
                    ),
                }),
            })
            .collect::<Result<_, _>>()?;
        let landing = names.iter().fold(base.clone(), |folder, name| folder.join(name));
        self.check_access(path, &landing.join(name), Access::Write)?;
        let changed = |e: io::Error| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV) => {
                FsError::PathChanged { path: path.given.clone() }
            }
            _ => err(e),
        };
        let mut folder = self.open_beneath(&base).map_err(changed)?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        for name in names {
            match rustix::fs::mkdirat(&folder, name, Mode::from_raw_mode(0o777)) {
                // Made by another call meanwhile: a folder is opened, anything else refused.
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(changed(e.into())),
            }
            let next = rustix::fs::openat(&folder, name, flags, Mode::empty());
            folder = next.map_err(|e| changed(e.into()))?.into();
        }
        Ok((Dir::from_std_file(folder), landing))
    }

    /// Where a write to `path` lands: the path itself, or the target of a symlink at it.
    fn write_target(&self, path: &Resolved) -> Result<PathBuf, FsError> {
        match self.dir.symlink_metadata(&path.relative) {
            Ok(meta) if meta.is_symlink() => self.canonical(path),
            // A missing file, or a missing parent: cap-std refuses parents that escape when
            // the directories are created.
            Ok(_) | Err(_) => Ok(path.relative.clone()),
        }
    }
}

/// Reads the whole of `file` (opened for `path`, with `meta`), refused when over `limit`
/// bytes.
fn read_whole(
    tool: &'static str,
    path: &Resolved,
    file: std::fs::File,
    meta: &std::fs::Metadata,
    limit: u64,
) -> Result<Vec<u8>, FsError> {
    if meta.len() > limit {
        return Err(FsError::TooLarge { tool, path: path.given.clone(), size: meta.len(), limit });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| FsError::from_io(&path.given, e))?;
    Ok(bytes)
}

/// Refuses a file whose owner may not write it (`chmod 444`): it says it is not to be
/// changed, whoever runs toolmux, and root's permission checks pass a rename over it or its
/// removal all the same (`rm` asks first).
pub(crate) fn read_only(path: &Resolved, meta: &cap_std::fs::Metadata) -> Result<(), FsError> {
    use cap_std::fs::MetadataExt as _;
    match meta.mode() & 0o200 {
        0 => Err(FsError::ReadOnly { path: path.given.clone(), mode: meta.mode() & 0o7777 }),
        _ => Ok(()),
    }
}

/// What [`Workspace::write_atomic`] did.
#[derive(Debug)]
pub(crate) struct Written {
    /// The path written, relative to the root, symlinks resolved.
    pub canonical: PathBuf,
    /// Whether the file did not exist before.
    pub created: bool,
    /// The permission bits (set-id bits included) of the file it replaced, for `undo`.
    pub previous_mode: Option<u32>,
    /// The mode the file had, when its set-user-id or set-group-id bit was cleared.
    pub set_id_cleared: Option<u32>,
}

impl Written {
    /// What the result says of cleared set-id bits, starting with `; `; empty when none were.
    pub fn set_id_note(&self) -> String {
        let Some(mode) = self.set_id_cleared else { return String::new() };
        let bits = match (mode & 0o4000 != 0, mode & 0o2000 != 0 && mode & 0o010 != 0) {
            (true, true) => "set-user-id and set-group-id bits were",
            (true, false) => "set-user-id bit was",
            _ => "set-group-id bit was",
        };
        let kept = mode & !(0o4000 | if mode & 0o010 != 0 { 0o2000 } else { 0 });
        format!(
            "; its {bits} cleared (mode {mode:04o} is now {kept:04o}), as the system \
             clears them when a file is written: set them again with `chmod` if the new \
             content is to run so"
        )
    }
}

/// The most bytes of a file's name its temporary file's name repeats: the rest of that
/// name (a dot, the process id, a counter and the suffix) takes at most 45 more bytes.
const TEMP_NAME_KEPT_BYTES: usize = 128;

/// The longest start of `name` of at most `max` bytes that ends on a character boundary.
fn name_prefix(name: &str, max: usize) -> &str {
    let mut end = name.len().min(max);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Symbolic links followed in a row before a path is given up as a loop (Linux's limit).
const MAX_LINKS: usize = 40;

/// The most names of a folder read for a path's close names ([`Workspace::close_path`]).
const MAX_SUGGESTION_ENTRIES: usize = 1000;

/// `path` without its `.` components (cap-std canonicalizes the root to `.`).
fn without_dots(path: &Path) -> PathBuf {
    path.components().filter(|c| !matches!(c, Component::CurDir)).collect()
}

fn split_parent(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let name = match path.components().next_back()? {
        Component::Normal(name) => PathBuf::from(name),
        _ => return None,
    };
    let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
    Some((parent, name))
}

/// The SHA-256 of `bytes`.
pub(crate) fn hash(bytes: &[u8]) -> Hash {
    Sha256::digest(bytes).into()
}

/// Bytes at each end of a file that [`fingerprint`] hashes.
const FINGERPRINT_END_BYTES: u64 = 1024 * 1024;

/// What stands for the content hash of a file too large to hash whole on every `read` and
/// `write` ([`crate::tools::read::COUNT_MAX_BYTES`], or `editMaxBytes` when larger): a
/// SHA-256 over a tag, the file's device and inode, its size, its modification and
/// change times to the nanosecond, and its first and last MiB. A change anywhere moves
/// the times (and the change time cannot be set back); a file replaced moves the inode.
/// The tag keeps it from ever equalling a content hash, so a file that crossed the size
/// between `read` and `write` reads as changed. `meta` is the file's metadata when it was
/// opened, so that a change while it was read also reads as one. What it cannot see: a
/// change of the same size, away from both ends, made within one tick of the kernel's
/// coarse clock of the file's previous change and after the read.
pub(crate) fn fingerprint(file: &std::fs::File, meta: &std::fs::Metadata) -> io::Result<Hash> {
    use std::os::unix::fs::{FileExt as _, MetadataExt as _};
    let mut hasher = Sha256::new();
    hasher.update(b"toolmux-fs large file fingerprint v1\0");
    for field in [meta.dev(), meta.ino(), meta.len()] {
        hasher.update(field.to_le_bytes());
    }
    for field in [meta.mtime(), meta.mtime_nsec(), meta.ctime(), meta.ctime_nsec()] {
        hasher.update(field.to_le_bytes());
    }
    let size = meta.len();
    let head = size.min(FINGERPRINT_END_BYTES);
    let tail_start = size.saturating_sub(FINGERPRINT_END_BYTES).max(head);
    let mut buf = vec![0u8; FINGERPRINT_END_BYTES as usize];
    for (start, end) in [(0, head), (tail_start, size)] {
        let part = &mut buf[..(end - start) as usize];
        file.read_exact_at(part, start)?;
        hasher.update(&*part);
    }
    Ok(hasher.finalize().into())
}

/// A file name or path as listings show it: as it is, unless it holds a control character
/// (a line break would make one entry read as two, an escape sequence would act on a
/// terminal) or is not UTF-8 (shown lossily, its size looked up under another name): then
/// quoted, with those bytes escaped (`"bad\xffname"`, `"a\nfake.txt"`). Every tool reads a path
/// given in this form back to the name it shows.
pub fn shown_path(path: &std::ffi::OsStr) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let bytes = path.as_bytes();
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
        _ => format!("\"{}\"", bytes.escape_ascii()),
    }
}

/// The path [`shown_path`] showed as `given`: `None` when `given` is not such a quoted,
/// escaped form.
fn shown_unescaped(given: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt as _;
    let inner = given.strip_prefix('"')?.strip_suffix('"')?;
    let mut bytes = Vec::with_capacity(inner.len());
    let mut rest = inner.as_bytes();
    while let Some((&b, after)) = rest.split_first() {
        rest = after;
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        let (&code, after) = rest.split_first()?;
        rest = after;
        bytes.push(match code {
            b'n' => b'\n',
            b't' => b'\t',
            b'r' => b'\r',
            b'\\' | b'\'' | b'"' => code,
            b'x' => {
                let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
                rest = &rest[2..];
                u8::from_str_radix(hex, 16).ok()?
            }
            _ => return None,
        });
    }
    (!bytes.contains(&0)).then(|| PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// `file`, opened for `path`, with its metadata, when it is a regular file (judged by the
/// open file itself); a folder or anything else is refused, naming `path`.
fn regular(
    path: &Resolved,
    file: std::fs::File,
) -> Result<(std::fs::File, std::fs::Metadata), FsError> {
    let meta = file.metadata().map_err(|e| FsError::from_io(&path.given, e))?;
    if meta.is_dir() {
        return Err(FsError::IsDirectory { path: path.given.clone() });
    }
    if !meta.is_file() {
        return Err(FsError::NotRegularFile { path: path.given.clone() });
    }
    Ok((file, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shown_name_reads_back() {
        use std::os::unix::ffi::OsStrExt as _;
        for name in [&b"a\xffb"[..], b"tab\there", b"new\nline\\ \"q\" 'x'", b"plain"] {
            let os = std::ffi::OsStr::from_bytes(name);
            let shown = shown_path(os);
            if shown.starts_with('"') {
                assert_eq!(shown_unescaped(&shown).unwrap().as_os_str(), os, "{shown}");
            }
        }
        assert_eq!(shown_unescaped("\"a\\qb\""), None);
        assert_eq!(shown_unescaped("\"a\\x0\""), None);
        assert_eq!(shown_unescaped("\"\\x00\""), None);
        assert_eq!(shown_unescaped("plain"), None);
    }

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let temp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        (temp, ws)
    }

    /// Opening a FIFO does not wait for a writer: a FIFO put where a checked file was is
    /// refused at once, not hung on.
    #[test]
    fn a_fifo_is_opened_without_blocking_and_refused() {
        let (temp, ws) = workspace();
        let mode = rustix::fs::Mode::from_raw_mode(0o600);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            temp.path().join("pipe"),
            rustix::fs::FileType::Fifo,
            mode,
            0,
        )
        .expect("a FIFO");
        let path = ws.resolve("pipe").unwrap();
        assert!(ws.open_file(&path.relative).is_ok(), "the open returns at once");
        let err = ws.open_regular(&path).unwrap_err();
        assert!(matches!(err, FsError::NotRegularFile { .. }), "{err}");
        let err = ws.read_small("read", &path, 1024).unwrap_err();
        assert!(matches!(err, FsError::NotRegularFile { .. }), "{err}");
    }

    /// A folder `d` swapped between a symlink to `ok` and one to `.git` while files are
    /// written to and removed from `d/config`, a bounded number of times: `.git/config`
    /// keeps its bytes, whichever folder each check and each use meets. The folder a write
    /// checked was looked up apart from the one it wrote into, so a swap between the two
    /// let `.git/config` be replaced (a `core.fsmonitor` line there runs at the next
    /// `git status`). A race: a run without the fix may miss it.
    #[test]
    fn a_folder_swapped_for_git_during_a_write_keeps_git_unchanged() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let (temp, ws) = workspace();
        let root = temp.path().to_path_buf();
        std::fs::create_dir(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
        std::fs::create_dir(root.join("ok")).unwrap();
        std::os::unix::fs::symlink("ok", root.join("d")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = std::thread::spawn({
            let (stop, root) = (stop.clone(), root.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    for target in [".git", "ok"] {
                        let _ = std::fs::remove_file(root.join("next"));
                        std::os::unix::fs::symlink(target, root.join("next")).unwrap();
                        std::fs::rename(root.join("next"), root.join("d")).unwrap();
                    }
                }
            }
        });
        let path = ws.resolve("d/config").unwrap();
        let mut written = 0;
        for _ in 0..5000 {
            written += usize::from(ws.write_atomic(&path, b"[core]\nfsmonitor = evil\n").is_ok());
            let _ = ws.remove_file(&path);
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert_eq!(std::fs::read_to_string(root.join(".git/config")).unwrap(), "[core]\n");
        let names: Vec<_> = std::fs::read_dir(root.join(".git")).unwrap().collect();
        assert_eq!(names.len(), 1, "nothing else in .git: {names:?}");
        assert!(written > 0, "no write went through at all");
    }

    /// The open that follows no symlink, also the one used where the system has no
    /// `openat2`: a file opens, a symlink at the end or on the way is refused.
    #[test]
    fn opening_beneath_follows_no_symlink() {
        let (temp, ws) = workspace();
        std::fs::create_dir(temp.path().join("d")).unwrap();
        std::fs::write(temp.path().join("d/f"), "x").unwrap();
        std::os::unix::fs::symlink("d", temp.path().join("to_d")).unwrap();
        std::os::unix::fs::symlink("f", temp.path().join("d/to_f")).unwrap();
        let read = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
        for (path, opens) in [("d/f", true), ("./d/f", true), ("to_d/f", false), ("d/to_f", false)]
        {
            let relative = Path::new(path);
            assert_eq!(ws.open_beneath(relative).is_ok(), opens, "{path}");
            assert_eq!(ws.open_by_names(&without_dots(relative), read).is_ok(), opens, "{path}");
        }
        let err = ws.open_by_names(Path::new("d/../d/f"), read).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn relative_and_absolute_paths() {
        let (temp, ws) = workspace();
        assert_eq!(ws.resolve("a/b").unwrap().relative, Path::new("a/b"));
        assert_eq!(ws.resolve("").unwrap().relative, Path::new("."));
        let abs = temp.path().join("x/y");
        assert_eq!(ws.resolve(abs.to_str().unwrap()).unwrap().relative, Path::new("x/y"));
        assert_eq!(ws.resolve(temp.path().to_str().unwrap()).unwrap().relative, Path::new("."));
    }

    #[test]
    fn escapes_are_refused() {
        let (_temp, ws) = workspace();
        for path in ["../x", "/etc/passwd", "..", "/"] {
            let err = ws.resolve(path).unwrap_err();
            assert!(matches!(err, FsError::OutsideRoot { .. }), "{path}: {err}");
        }
        let inner = ws.resolve("a/../../x").unwrap();
        let err = ws.canonical(&inner).unwrap_err();
        assert!(matches!(err, FsError::OutsideRoot { .. } | FsError::NotFound { .. }), "{err}");
    }

    #[test]
    fn nul_is_refused() {
        let (_temp, ws) = workspace();
        assert!(ws.resolve("a\0b").is_err());
    }

    #[test]
    fn relative_root_is_a_config_error() {
        let err = Workspace::open(Path::new("relative/root")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid fs configuration: root `relative/root` is not an absolute path"
        );
    }

    #[test]
    fn read_records_are_per_run() {
        let (_temp, ws) = workspace();
        ws.record_read("r1", PathBuf::from("a"), [1; 32]);
        assert_eq!(ws.last_read("r1", Path::new("a")), Some([1; 32]));
        assert_eq!(ws.last_read("r2", Path::new("a")), None);
    }
}
