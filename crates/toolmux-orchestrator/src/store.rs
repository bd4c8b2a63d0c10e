//! The output store: where outputs over the size cap are kept whole, to be read back by
//! handle with an offset and a limit.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredOutput {
    /// The handle to read it back with: `{run}/{id}`.
    pub handle: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Number of lines.
    pub lines: u64,
}

/// A page of a stored output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputPage {
    /// The lines, joined with `\n`.
    pub text: String,
    /// Index of the first line returned (0-based).
    pub offset: u64,
    /// Lines returned.
    pub lines: u64,
    /// Lines in the whole output.
    #[serde(alias = "total_lines")]
    pub total_lines: u64,
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The handle is malformed or names nothing stored.
    #[error(
        "no stored output `{handle}`: handles look like `run-id/out-id`, as given in a tool_output message"
    )]
    UnknownHandle {
        /// The handle.
        handle: String,
    },
    /// A store that is not a directory failed (a server that does not answer, an output
    /// too large for it).
    #[error("output store ({store}): {message}")]
    Unavailable {
        /// Which store.
        store: String,
        /// What went wrong.
        message: String,
    },
    /// What the store found where it keeps an output, or a run's folder of outputs, is
    /// not what it makes there: a symbolic link (planted to lead anywhere), a FIFO, a
    /// device, a folder. Nothing is read or written through it.
    #[error(
        "output store at {path}: it is {kind}, where the store keeps {expected}; the store \
         reads and writes through no links, FIFOs or devices, so remove it (nothing toolmux \
         stores is one)"
    )]
    NotRegular {
        /// The entry.
        path: PathBuf,
        /// What it is, in words (`a symbolic link`).
        kind: &'static str,
        /// What the store keeps there (`a regular file`, `a folder`).
        expected: &'static str,
    },
    /// The store's own folder (`defaults.outputDir`) is no folder: a file, a FIFO, a link
    /// to one. Nothing can be stored beneath it.
    #[error(
        "output store at {path}: it is {kind}, not a folder, so no output can be stored there: \
         move it away, or set `defaults.outputDir` to a folder"
    )]
    NotAFolder {
        /// The store's folder.
        path: PathBuf,
        /// What it is, in words (`a regular file`).
        kind: &'static str,
    },
    /// Reading or writing failed.
    #[error("output store at {path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Keeps outputs that are too large for the model.
#[async_trait]
pub trait OutputStore: Send + Sync + fmt::Debug {
    /// Stores `content` for run `run_id`, produced by `tool`.
    async fn store(
        &self,
        run_id: &str,
        tool: &str,
        content: &str,
    ) -> Result<StoredOutput, StoreError>;

    /// Reads `limit` lines from line `offset` of a stored output.
    async fn read(&self, handle: &str, offset: u64, limit: u64) -> Result<OutputPage, StoreError>;

    /// Whether the output of `handle` was stored for run `run_id`. The default cannot tell
    /// and says yes.
    fn is_of_run(&self, handle: &str, run_id: &str) -> bool {
        let _ = (handle, run_id);
        true
    }
}

/// The tool `output__read`: pages of the outputs the size cap stored, for the run that
/// produced them, so that a model given a `tool_output` handle can read on.
#[derive(Debug, Clone)]
pub struct OutputReader {
    store: std::sync::Arc<dyn OutputStore>,
    /// The most bytes of lines one page holds: under the size cap, so that a page is never
    /// stored again in its turn.
    page_bytes: usize,
}

/// Lines one `output__read` call returns unless asked for fewer.
pub const READ_DEFAULT_LINES: u64 = 200;

/// Lines one `output__read` call returns at most.
pub const READ_MAX_LINES: u64 = 2000;

impl OutputReader {
    /// The namespace of the tool.
    pub const NAMESPACE: &'static str = "output";

    /// A reader of `store`, the orchestrator's output store, whose pages stay under
    /// `response_max_bytes` (the orchestrator's size cap).
    pub fn new(store: std::sync::Arc<dyn OutputStore>, response_max_bytes: usize) -> Self {
        // Room for the note that says where to read on.
        let page_bytes = response_max_bytes.saturating_sub(120).max(64);
        OutputReader { store, page_bytes }
    }
}

#[async_trait]
impl toolmux_core::ToolProvider for OutputReader {
    /// Which outputs may be read depends on the run asking.
    fn state_per_run(&self) -> bool {
        true
    }

    fn kind(&self) -> toolmux_core::ToolKind {
        toolmux_core::ToolKind::Internal
    }

    fn namespace(&self) -> &str {
        Self::NAMESPACE
    }

    async fn list_tools(&self) -> Result<Vec<toolmux_core::ToolSpec>, toolmux_core::ToolError> {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "handle": {"type": "string", "description": "The `handle` of a `tool_output` message."},
                "offset": {"type": "integer", "minimum": 0, "description": "The first line to read, from 0 (default 0)."},
                "limit": {"type": "integer", "minimum": 1, "maximum": READ_MAX_LINES,
                          "description": format!("Lines to read (default {READ_DEFAULT_LINES}).")},
                "start_char": {"type": "integer", "minimum": 0,
                          "description": "In a line longer than a page (one-line JSON, say): the character of line `offset` to read from, as the previous page's end says (default 0)."}
            },
            "required": ["handle"],
            "additionalProperties": false
        });
        let spec = toolmux_core::ToolSpec::new(
            "read",
            "Reads an output that was too large for a tool result, in pages of lines: give the \
             `handle` of the `tool_output` message, and `offset`/`limit` to move through it; a \
             line longer than a page is read in pieces with `start_char`.",
            schema,
        )
        .with_annotations(toolmux_core::ToolAnnotations {
            open_world: false,
            ..toolmux_core::ToolAnnotations::read_only()
        });
        Ok(vec![spec])
    }

    async fn call(
        &self,
        name: &str,
        arguments: serde_json::Value,
        ctx: &toolmux_core::CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        use toolmux_core::{ToolError, ToolOutput};
        if name != "read" {
            return Err(ToolError::UnknownTool {
                name: crate::suggest::echoed(name),
                suggestions: Vec::new(),
            });
        }
        let handle = arguments.get("handle").and_then(serde_json::Value::as_str).unwrap_or("");
        let offset = arguments.get("offset").and_then(serde_json::Value::as_u64).unwrap_or(0);
        let limit = arguments
            .get("limit")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(READ_DEFAULT_LINES)
            .clamp(1, READ_MAX_LINES);
        let unknown = || {
            ToolOutput::error(
                StoreError::UnknownHandle { handle: crate::suggest::echoed(handle) }.to_string(),
            )
        };
        // Another run's outputs are not this run's to read; say no more than for a typo.
        if !self.store.is_of_run(handle, ctx.run_id()) {
            return Ok(unknown());
        }
        let page = match self.store.read(handle, offset, limit).await {
            Ok(page) => page,
            Err(StoreError::UnknownHandle { .. }) => return Ok(unknown()),
            Err(e) => {
                return Err(ToolError::Remote {
                    tool: "output__read".into(),
                    message: e.to_string(),
                });
            }
        };
        let start_char = arguments.get("start_char").and_then(serde_json::Value::as_u64);
        let first_line = page.text.find('\n').map_or(page.text.len(), |i| i + 1);
        if page.lines > 0 && (start_char.is_some_and(|c| c > 0) || first_line > self.page_bytes) {
            return Ok(self.piece_of_line(
                page.text[..first_line].trim_end_matches('\n'),
                page.offset,
                page.total_lines,
                usize::try_from(start_char.unwrap_or(0)).unwrap_or(usize::MAX),
            ));
        }
        // Whole lines while they fit the page.
        let mut kept = 0usize;
        let mut lines = 0u64;
        for line in page.text.split_inclusive('\n') {
            if kept + line.len() > self.page_bytes {
                break;
            }
            kept += line.len();
            lines += 1;
        }
        let mut text = page.text;
        text.truncate(kept);
        if text.ends_with('\n') {
            text.pop();
        }
        let end = page.offset + lines;
        if page.lines == 0 {
            text =
                format!("(no lines from line {offset}: the output has {} lines)", page.total_lines);
        } else if end < page.total_lines {
            text.push_str(&format!(
                "\n[lines {}-{} of {}; read on with offset {end}]",
                page.offset + 1,
                end,
                page.total_lines
            ));
        }
        Ok(ToolOutput::text(text)
            .with_extra("totalLines", serde_json::json!(page.total_lines))
            .with_extra("nextOffset", serde_json::json!((end < page.total_lines).then_some(end))))
    }
}

impl OutputReader {
    /// A page of `line` (line `offset`, from 0, of `total_lines`) from character `from`,
    /// saying where the next one starts: one-line JSON of megabytes is read to its end.
    fn piece_of_line(
        &self,
        line: &str,
        offset: u64,
        total_lines: u64,
        from: usize,
    ) -> toolmux_core::ToolOutput {
        let start = line.char_indices().nth(from).map_or(line.len(), |(i, _)| i);
        let mut end = (start + self.page_bytes.max(4)).min(line.len());
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        let piece = &line[start..end];
        let next_char = from.saturating_add(piece.chars().count());
        let more_in_line = end < line.len();
        let mut text = piece.to_owned();
        let (next_offset, next_start) = if more_in_line {
            let total = next_char + line[end..].chars().count();
            text.push_str(&format!(
                "\n[line {}: characters {}-{next_char} of {total}; read on with offset {offset}, \
                 start_char {next_char}]",
                offset + 1,
                from.min(total) + 1,
            ));
            (Some(offset), Some(next_char))
        } else if offset + 1 < total_lines {
            text.push_str(&format!(
                "\n[line {} ends; {total_lines} lines; read on with offset {}]",
                offset + 1,
                offset + 1
            ));
            (Some(offset + 1), None)
        } else {
            (None, None)
        };
        toolmux_core::ToolOutput::text(text)
            .with_extra("totalLines", serde_json::json!(total_lines))
            .with_extra("nextOffset", serde_json::json!(next_offset))
            .with_extra("nextStartChar", serde_json::json!(next_start))
    }
}

/// A directory per run under one root, a file per output. Outputs older than the
/// retention ([`DEFAULT_RETENTION`] unless set) are removed by [`DirectoryStore::sweep`],
/// which [`OutputStore::store`] runs at most once an hour.
#[derive(Debug)]
pub struct DirectoryStore {
    root: PathBuf,
    counter: AtomicU64,
    /// `None`: outputs are kept forever.
    retention: Option<Duration>,
    /// When `store` last swept; `None` before it first did.
    swept: Mutex<Option<Instant>>,
}

/// How long [`DirectoryStore`] keeps outputs by default.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// How often, at most, storing an output sweeps out old ones.
const SWEEP_EVERY: Duration = Duration::from_secs(60 * 60);

impl DirectoryStore {
    /// A store under `root` (created on first write, mode 0700), keeping outputs for
    /// [`DEFAULT_RETENTION`].
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirectoryStore {
            root: root.into(),
            counter: AtomicU64::new(0),
            retention: Some(DEFAULT_RETENTION),
            swept: Mutex::new(None),
        }
    }

    /// Outputs are kept for `retention` after they were written; `None` keeps them forever.
    pub fn with_retention(mut self, retention: Option<Duration>) -> Self {
        self.retention = retention;
        self
    }

    /// Removes the outputs (and their runs' directories, once empty) last written longer
    /// than the retention ago, and returns how many. Only run directories (`run-*`) are
    /// looked into: other files under the root (the statistics file) are left alone. A
    /// folder where an output would be goes with everything in it; a symbolic link in place
    /// of a run's directory or an output is removed as a link, never followed.
    pub fn sweep(&self) -> Result<usize, StoreError> {
        *self.swept.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        match self.retention {
            Some(retention) => sweep_older(&self.root, retention),
            None => Ok(0),
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn unique_id(&self) -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("out-{:x}-{:x}-{n}", std::process::id(), nanos)
    }

    fn path_of(&self, handle: &str) -> Option<PathBuf> {
        valid_handle(handle).then(|| {
            let (run, id) = handle.split_once('/').unwrap_or((handle, ""));
            self.root.join(run).join(id)
        })
    }
}

/// Removes what [`DirectoryStore::sweep`] removes, for outputs older than `retention`.
///
/// Everything beneath the root is reached through descriptors, never through paths: each
/// run's folder is opened relative to the root's (`O_NOFOLLOW`), listed through its own
/// descriptor, and its entries are removed relative to it (`unlinkat`), so that a link put
/// in place of a run's folder or of one of its folders, even between a look and a removal,
/// is never followed to remove what it leads to. Such a link, once as old as an output
/// would be, is removed as the link it is. The paths only name what failed.
fn sweep_older(root: &Path, retention: Duration) -> Result<usize, StoreError> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    use rustix::io::Errno;
    use std::os::fd::AsFd as _;
    let Some(cutoff) = std::time::SystemTime::now().checked_sub(retention) else {
        return Ok(0);
    };
    // Before 1970 nothing was written.
    let Ok(cutoff) = cutoff.duration_since(std::time::UNIX_EPOCH) else {
        return Ok(0);
    };
    let root_fd = match rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(0),
        Err(Errno::NOTDIR) => return Err(root_not_a_folder(root)),
        Err(e) => return Err(io_at(root, e)),
    };
    let mut removed = 0;
    for run in names_in(&root_fd, root)? {
        if !run.to_bytes().starts_with(b"run-") {
            continue;
        }
        let path = root.join(name_of(&run));
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let folder = match rustix::fs::openat(&root_fd, run.as_c_str(), flags, Mode::empty()) {
            Ok(folder) => folder,
            // Removed meanwhile by another process sweeping the same folder.
            Err(Errno::NOENT) => continue,
            // ELOOP for a link, ENOTDIR for a file (a link too with some kernels).
            Err(e @ (Errno::LOOP | Errno::NOTDIR)) => {
                match rustix::fs::statat(&root_fd, run.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat)
                        if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                            == rustix::fs::FileType::Symlink
                            && written_before(&stat, cutoff) =>
                    {
                        match rustix::fs::unlinkat(&root_fd, run.as_c_str(), AtFlags::empty()) {
                            Ok(()) | Err(Errno::NOENT) => {}
                            Err(e) => return Err(io_at(&path, e)),
                        }
                    }
                    // A file named like a run's folder is not the store's to remove.
                    Ok(_) | Err(Errno::NOENT) => {}
                    Err(_) => return Err(io_at(&path, e)),
                }
                continue;
            }
            Err(e) => return Err(io_at(&path, e)),
        };
        for output in names_in(&folder, &path)? {
            let name = output.to_bytes();
            if !(name.starts_with(b"out-") || name.starts_with(b".out-")) {
                continue;
            }
            let at = path.join(name_of(&output));
            let stat =
                match rustix::fs::statat(&folder, output.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) => stat,
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(io_at(&at, e)),
                };
            if written_before(&stat, cutoff) {
                remove_at(folder.as_fd(), &output, &at, 0)?;
                removed += 1;
            }
        }
        // Fails while the folder holds anything, as it should; a link or a file put in its
        // name's place meanwhile is no folder, and stays.
        let _ = rustix::fs::unlinkat(&root_fd, run.as_c_str(), AtFlags::REMOVEDIR);
    }
    Ok(removed)
}

/// How deep the sweep goes into folders in a run's folder (the store makes none there): each
/// level holds a descriptor open, and the process's are not the sweep's to use up.
const SWEEP_MAX_DEPTH: usize = 32;

/// Removes the entry `name` of the folder `parent` (`path`, for messages), a folder with
/// everything in it, through descriptors only: anything but a folder, a link to one
/// included, is removed as the name it is, and a folder is opened without following a
/// link, emptied the same way, then removed. An entry already gone is no error.
fn remove_at(
    parent: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    path: &Path,
    depth: usize,
) -> Result<(), StoreError> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    use rustix::io::Errno;
    use std::os::fd::AsFd as _;
    // Removing first and asking after leaves no moment for the entry to change between.
    let refused = match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        // EISDIR from Linux, EPERM from POSIX, for a folder.
        Err(e @ (Errno::ISDIR | Errno::PERM)) => e,
        Err(e) => return Err(io_at(path, e)),
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let folder = match rustix::fs::openat(parent, name, flags, Mode::empty()) {
        Ok(folder) => folder,
        Err(Errno::NOENT) => return Ok(()),
        // No folder after all: the refusal to remove it was for another reason.
        Err(Errno::LOOP | Errno::NOTDIR) => return Err(io_at(path, refused)),
        Err(e) => return Err(io_at(path, e)),
    };
    if depth >= SWEEP_MAX_DEPTH {
        return Err(StoreError::Io {
            path: path.to_owned(),
            source: std::io::Error::other(format!(
                "folders nested more than {SWEEP_MAX_DEPTH} deep, which the store never makes; \
                 remove the folder by hand"
            )),
        });
    }
    for entry in names_in(&folder, path)? {
        remove_at(folder.as_fd(), &entry, &path.join(name_of(&entry)), depth + 1)?;
    }
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(io_at(path, e)),
    }
}

/// The names in the folder open as `folder` (`path`, for messages), `.` and `..` left out,
/// read whole before any is removed.
fn names_in(
    folder: &std::os::fd::OwnedFd,
    path: &Path,
) -> Result<Vec<std::ffi::CString>, StoreError> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(folder).map_err(|e| io_at(path, e))? {
        let entry = entry.map_err(|e| io_at(path, e))?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// A name read from a folder, as a path's part.
fn name_of(name: &std::ffi::CStr) -> &std::ffi::OsStr {
    use std::os::unix::ffi::OsStrExt as _;
    std::ffi::OsStr::from_bytes(name.to_bytes())
}

/// Whether what `stat` describes was last written before `cutoff`, a time since 1970.
// The fields' types differ between targets: a cast is a conversion on some, not others.
#[allow(clippy::unnecessary_cast)]
fn written_before(stat: &rustix::fs::Stat, cutoff: Duration) -> bool {
    let (seconds, nanos) = (stat.st_mtime as i64, stat.st_mtime_nsec as u64);
    let cutoff_seconds = i64::try_from(cutoff.as_secs()).unwrap_or(i64::MAX);
    (seconds, nanos) < (cutoff_seconds, u64::from(cutoff.subsec_nanos()))
}

/// The store's error for its folder `root`, which is no folder (the open or the making of
/// it failed with `ENOTDIR`): what is there, a link followed, as the folder may be one.
fn root_not_a_folder(root: &Path) -> StoreError {
    let kind = match std::fs::metadata(root) {
        Ok(meta) if meta.is_file() => "a file",
        Ok(meta) => toolmux_core::regular::kind_in_words(meta.file_type()).unwrap_or("no folder"),
        // A file in the path above it.
        Err(_) => "beneath a file",
    };
    StoreError::NotAFolder { path: root.to_owned(), kind }
}

/// The store's error for `error`, met at `path`.
fn io_at(path: &Path, error: rustix::io::Errno) -> StoreError {
    StoreError::Io { path: path.to_owned(), source: error.into() }
}

/// Why an output could not be read or written beneath the store's root, and where.
#[derive(Debug)]
enum Beneath {
    /// The root is no folder (`ENOTDIR` when it was made or opened).
    RootNotFolder,
    /// The root, or the run's folder, could not be opened or made.
    Run(std::io::Error),
    /// The run's folder is a symbolic link or no folder: what it is.
    RunNotFolder(&'static str),
    /// The output's file could not be opened, read or written.
    File(std::io::Error),
    /// The output's file is a symbolic link or no regular file: what it is.
    FileNotRegular(&'static str),
}

impl Beneath {
    /// The store's error, naming `dir`, the run's folder, or `file`, the output's file.
    fn into_store_error(self, dir: &Path, file: &Path) -> StoreError {
        match self {
            Beneath::RootNotFolder => root_not_a_folder(dir.parent().unwrap_or(dir)),
            Beneath::Run(source) => StoreError::Io { path: dir.to_owned(), source },
            Beneath::File(source) => StoreError::Io { path: file.to_owned(), source },
            Beneath::RunNotFolder(kind) => {
                StoreError::NotRegular { path: dir.to_owned(), kind, expected: "a folder" }
            }
            Beneath::FileNotRegular(kind) => {
                StoreError::NotRegular { path: file.to_owned(), kind, expected: "a regular file" }
            }
        }
    }
}

/// Why the store's folder could not be opened: no folder (`ENOTDIR`), or `error`.
fn root_error(error: rustix::io::Errno) -> Beneath {
    match error {
        rustix::io::Errno::NOTDIR => Beneath::RootNotFolder,
        e => Beneath::Run(e.into()),
    }
}

/// The folder of run `run` under `root`, opened without following a link: the root is the
/// configured folder (a link there is the user's choice), what is beneath it is the store's.
fn run_folder(root: &Path, run: &str) -> Result<std::os::fd::OwnedFd, Beneath> {
    use rustix::fs::{Mode, OFlags};
    let root =
        rustix::fs::open(root, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(root_error)?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(&root, run, flags, Mode::empty()).map_err(|e| {
        // ELOOP for a link, ENOTDIR for a file: said as what it is.
        match crate::files::kind_at(&root, run) {
            Some(kind) if kind != "a folder" => Beneath::RunNotFolder(kind),
            None if e != rustix::io::Errno::NOENT => Beneath::RunNotFolder("a regular file"),
            _ => Beneath::Run(e.into()),
        }
    })
}

/// Opens output `id` of run `run` under `root` to read, following no link at the run's
/// folder or the file, and refusing anything but a regular file: a FIFO would hold the
/// reading thread for ever, a device is never opened (its type is asked first).
fn open_beneath(root: &Path, run: &str, id: &str) -> Result<std::fs::File, Beneath> {
    use rustix::fs::{Mode, OFlags};
    let folder = run_folder(root, run)?;
    if let Some(kind) = crate::files::kind_at(&folder, id) {
        return Err(Beneath::FileNotRegular(kind));
    }
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let file = rustix::fs::openat(&folder, id, flags, Mode::empty()).map_err(|e| {
        match crate::files::kind_at(&folder, id) {
            Some(kind) => Beneath::FileNotRegular(kind),
            None => Beneath::File(e.into()),
        }
    })?;
    let file = std::fs::File::from(file);
    // Put in the name's place between the question and the opening.
    let meta = file.metadata().map_err(Beneath::File)?;
    if !meta.is_file() {
        return Err(Beneath::FileNotRegular(crate::files::kind_of(meta.file_type())));
    }
    Ok(file)
}

/// Writes output `id` of run `run` under `root` whole: a temporary file beside it, made new
/// (`O_EXCL | O_NOFOLLOW`, mode 0600) and renamed to its name, in the run's folder opened
/// without following a link; a reader never sees half a file, and a link planted where the
/// run's folder or the file would be is never written through.
fn write_beneath(root: &Path, run: &str, id: &str, content: &[u8]) -> Result<(), Beneath> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Write as _;
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(root).map_err(|e| {
        match e.kind() {
            std::io::ErrorKind::NotADirectory | std::io::ErrorKind::AlreadyExists => {
                Beneath::RootNotFolder
            }
            _ => Beneath::Run(e),
        }
    })?;
    {
        let root = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(root_error)?;
        match rustix::fs::mkdirat(&root, run, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(Beneath::Run(e.into())),
        }
    }
    let folder = run_folder(root, run)?;
    // Starts with `.out-`, as the sweep looks for.
    let temporary = format!(".{id}.tmp");
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let made = rustix::fs::openat(&folder, temporary.as_str(), flags, Mode::from_raw_mode(0o600))
        .map_err(|e| match crate::files::kind_at(&folder, &temporary) {
        Some(kind) => Beneath::FileNotRegular(kind),
        None => Beneath::File(e.into()),
    })?;
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::from(made);
        file.write_all(content)?;
        file.sync_all()?;
        // Renaming over a name replaces the entry, never what a link there leads to.
        rustix::fs::renameat(&folder, temporary.as_str(), &folder, id)?;
        Ok(())
    })();
    if let Err(e) = written {
        let _ = rustix::fs::unlinkat(&folder, temporary.as_str(), rustix::fs::AtFlags::empty());
        return Err(Beneath::File(e));
    }
    // The rename lasts once the folder does; a file system that cannot flush a folder
    // keeps the file all the same.
    let _ = rustix::fs::fsync(&folder);
    Ok(())
}

/// Whether `handle` has the shape every store gives: `{run}/{id}`, both of letters,
/// digits, `-` and `_`.
pub fn valid_handle(handle: &str) -> bool {
    let Some((run, id)) = handle.split_once('/') else { return false };
    let safe = |s: &str| {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    safe(run) && safe(id)
}

/// A page of `content`: `limit` lines from line `offset` (lines as [`str::lines`] splits
/// them), for stores that hold an output in memory.
pub fn page_of(content: &str, offset: u64, limit: u64) -> OutputPage {
    let mut page = Vec::new();
    let mut total = 0u64;
    for line in content.lines() {
        if total >= offset && (page.len() as u64) < limit {
            page.push(line);
        }
        total += 1;
    }
    OutputPage { lines: page.len() as u64, text: page.join("\n"), offset, total_lines: total }
}

/// A run id as the first part of a handle (a directory name in [`DirectoryStore`]): kept
/// when already safe, else sanitized with a hash suffix. Stores elsewhere use it too, so
/// that handles look the same whatever keeps them.
pub fn run_slug(run_id: &str) -> String {
    let clean: String = run_id
        .chars()
        .take(40)
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    if clean == run_id && !clean.is_empty() {
        format!("run-{clean}")
    } else {
        format!("run-{clean}-{}", toolmux_core::naming::short_hash("run", run_id))
    }
}

#[async_trait]
impl OutputStore for DirectoryStore {
    async fn store(
        &self,
        run_id: &str,
        _tool: &str,
        content: &str,
    ) -> Result<StoredOutput, StoreError> {
        let run = run_slug(run_id);
        let id = self.unique_id();
        let dir = self.root.join(&run);
        let file = dir.join(&id);
        let bytes = content.len() as u64;
        let lines = content.lines().count() as u64;
        let content = content.to_owned();
        let sweep = self.retention.filter(|_| {
            let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
            let due = swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY);
            if due {
                *swept = Some(Instant::now());
            }
            due
        });
        let root = self.root.clone();
        let (run_name, id_name) = (run.clone(), id.clone());
        tokio::task::spawn_blocking(move || -> Result<(), Beneath> {
            if let Some(retention) = sweep
                && let Err(e) = sweep_older(&root, retention)
            {
                tracing::warn!("removing old outputs: {e}");
            }
            write_beneath(&root, &run_name, &id_name, content.as_bytes())
        })
        .await
        .map_err(|e| StoreError::Io { path: file.clone(), source: std::io::Error::other(e) })?
        .map_err(|e| e.into_store_error(&dir, &file))?;
        Ok(StoredOutput { handle: format!("{run}/{id}"), bytes, lines })
    }

    fn is_of_run(&self, handle: &str, run_id: &str) -> bool {
        handle.split_once('/').is_some_and(|(run, _)| run == run_slug(run_id))
    }

    async fn read(&self, handle: &str, offset: u64, limit: u64) -> Result<OutputPage, StoreError> {
        let unknown = || StoreError::UnknownHandle { handle: crate::suggest::echoed(handle) };
        let path = self.path_of(handle).ok_or_else(unknown)?;
        let (run, id) = handle.split_once('/').unwrap_or((handle, ""));
        let (root, run, id) = (self.root.clone(), run.to_owned(), id.to_owned());
        // Stream the file: memory stays bounded by the page, however large the output.
        let read = tokio::task::spawn_blocking(move || -> Result<(Vec<String>, u64), Beneath> {
            use std::io::BufRead as _;
            let file = std::io::BufReader::new(open_beneath(&root, &run, &id)?);
            let mut page = Vec::new();
            let mut total = 0u64;
            for line in file.lines() {
                let line = line.map_err(Beneath::File)?;
                if total >= offset && (page.len() as u64) < limit {
                    page.push(line);
                }
                total += 1;
            }
            Ok((page, total))
        })
        .await
        .map_err(|e| StoreError::Io { path: path.clone(), source: std::io::Error::other(e) })?;
        let (page, total_lines) = match read {
            Ok(read) => read,
            Err(Beneath::Run(e) | Beneath::File(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(unknown());
            }
            Err(e) => {
                let dir = path.parent().unwrap_or(&path).to_owned();
                return Err(e.into_store_error(&dir, &path));
            }
        };
        Ok(OutputPage { lines: page.len() as u64, text: page.join("\n"), offset, total_lines })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use toolmux_test_support::blocking::fifo;

    #[tokio::test]
    async fn store_and_read_back_pages() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirectoryStore::new(dir.path());
        let stored = store.store("r/1 x", "t", "a\nb\nc\nd").await.unwrap();
        assert_eq!((stored.bytes, stored.lines), (7, 4));
        assert!(stored.handle.starts_with("run-r_1_x-"), "{}", stored.handle);
        let page = store.read(&stored.handle, 1, 2).await.unwrap();
        assert_eq!(page, OutputPage { text: "b\nc".into(), offset: 1, lines: 2, total_lines: 4 });
        let past = store.read(&stored.handle, 10, 2).await.unwrap();
        assert_eq!(past.lines, 0);
    }

    #[tokio::test]
    async fn a_fifo_in_place_of_an_output_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirectoryStore::new(dir.path());
        let stored = store.store("r", "t", "a").await.unwrap();
        let path = store.path_of(&stored.handle).unwrap();
        std::fs::remove_file(&path).unwrap();
        let (folder, name) = (path.parent().unwrap(), path.file_name().unwrap());
        fifo(folder, name.to_str().unwrap());
        let read = tokio::time::timeout(Duration::from_secs(10), store.read(&stored.handle, 0, 1))
            .await
            .expect("the read of a FIFO did not end within 10 s");
        let message = read.map_err(|e| e.to_string()).expect_err("a FIFO is refused");
        assert!(
            message.contains("it is a FIFO (named pipe), where the store keeps a regular file")
        );
    }

    /// A file where the store's folder (`defaults.outputDir`) should be is named as such,
    /// with how to fix it, when storing, reading and sweeping, where the error named the
    /// path alone and the warning gave no reason.
    #[tokio::test]
    async fn a_file_in_place_of_the_stores_folder_is_said_to_be_one() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("outputs");
        std::fs::write(&root, "notes").unwrap();
        let store = DirectoryStore::new(&root);
        let stored = store.store("r", "t", "a").await.map_err(|e| e.to_string());
        let message = stored.expect_err("refused").replace(&root.display().to_string(), "DIR");
        expect![[r#"
            output store at DIR: it is a file, not a folder, so no output can be stored there: move it away, or set `defaults.outputDir` to a folder"#]]
        .assert_eq(&message);
        assert!(matches!(store.sweep(), Err(StoreError::NotAFolder { kind: "a file", .. })));
        let read = store.read("run-r/out-1", 0, 1).await;
        assert!(matches!(read, Err(StoreError::NotAFolder { kind: "a file", .. })), "{read:?}");
        // Beneath a file, the path is no folder either.
        let store = DirectoryStore::new(root.join("below"));
        let stored = store.store("r", "t", "a").await;
        assert!(matches!(stored, Err(StoreError::NotAFolder { kind: "beneath a file", .. })));
        assert_eq!(std::fs::read_to_string(&root).unwrap(), "notes", "the file is left alone");
    }

    /// What reading `handle` of `store` says, its folder written `DIR`.
    async fn refusal(store: &DirectoryStore, handle: &str) -> String {
        let read = store.read(handle, 0, 10).await;
        let message = read.map_err(|e| e.to_string()).expect_err("refused");
        message.replace(&store.root().display().to_string(), "DIR")
    }

    /// A link planted in place of an output (a cloned repository's output folder) is not
    /// followed: neither `output show` nor `output__read` prints the file it leads to.
    #[tokio::test]
    async fn a_link_in_place_of_an_output_is_refused_not_followed() {
        use toolmux_core::ToolProvider as _;
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "root:x:0:0").unwrap();
        let root = dir.path().join("outputs");
        let store = std::sync::Arc::new(DirectoryStore::new(&root));
        let stored = store.store("r", "t", "a").await.unwrap();
        let path = store.path_of(&stored.handle).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&secret, &path).unwrap();
        let handle = &stored.handle;
        expect![[r#"
            output store at DIR/run-r/OUT: it is a symbolic link, where the store keeps a regular file; the store reads and writes through no links, FIFOs or devices, so remove it (nothing toolmux stores is one)"#]]
        .assert_eq(&refusal(&store, handle).await.replace(&handle[6..], "OUT"));
        let reader = OutputReader::new(store.clone(), 10_000);
        let ctx = toolmux_core::CallContext::new().with_run_id("r");
        let called = reader.call("read", serde_json::json!({"handle": handle}), &ctx).await;
        let said = match called {
            Ok(output) => output.to_text(),
            Err(e) => e.to_string(),
        };
        assert!(!said.contains("root:x"), "{said}");
        assert!(said.contains("it is a symbolic link"), "{said}");
        // A link to a folder, a folder and a socket are refused as what they are.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.path(), &path).unwrap();
        assert!(refusal(&store, handle).await.contains("it is a symbolic link, where"));
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(
            refusal(&store, handle)
                .await
                .contains("it is a folder, where the store keeps a regular file")
        );
        std::fs::remove_dir(&path).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(refusal(&store, handle).await.contains("it is a socket, where"));
    }

    /// A run's folder that is a link (to a folder of the attacker's choosing, holding an
    /// `out-1` link of its own or leading to `/etc` itself) is neither read through nor
    /// written through: storing an output of that run fails, and nothing is made there.
    #[tokio::test]
    async fn a_link_in_place_of_a_run_folder_is_refused_for_reading_and_writing() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("out-1"), "root:x:0:0").unwrap();
        let root = dir.path().join("outputs");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("run-r")).unwrap();
        let store = DirectoryStore::new(&root);
        expect![[r#"
            output store at DIR/run-r: it is a symbolic link, where the store keeps a folder; the store reads and writes through no links, FIFOs or devices, so remove it (nothing toolmux stores is one)"#]]
        .assert_eq(&refusal(&store, "run-r/out-1").await);
        let stored = store.store("r", "t", "written").await;
        let message = stored.map_err(|e| e.to_string()).expect_err("not written through");
        assert!(message.contains("run-r: it is a symbolic link, where the store keeps a folder"));
        let names: Vec<_> =
            std::fs::read_dir(&elsewhere).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["out-1"], "nothing written in the link's folder");
        // A file in the run folder's place is no folder either.
        std::fs::remove_file(root.join("run-r")).unwrap();
        std::fs::write(root.join("run-r"), "").unwrap();
        assert!(
            refusal(&store, "run-r/out-1")
                .await
                .contains("it is a regular file, where the store keeps a folder")
        );
        // The configured folder itself may be a link: that is the user's choice.
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        let through = DirectoryStore::new(&linked);
        let stored = through.store("s", "t", "kept").await.unwrap();
        assert_eq!(through.read(&stored.handle, 0, 1).await.unwrap().text, "kept");
        assert!(elsewhere.join(&stored.handle).is_file());
    }

    /// A file under `dir` written `age` ago.
    fn aged(path: &Path, age: Duration) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let file = std::fs::File::create(path).unwrap();
        file.set_modified(std::time::SystemTime::now() - age).unwrap();
    }

    #[test]
    fn sweeping_removes_old_outputs_only() {
        let dir = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(24 * 60 * 60);
        aged(&dir.path().join("run-a/out-old"), 2 * day);
        aged(&dir.path().join("run-a/.out-old.tmp"), 2 * day);
        aged(&dir.path().join("run-a/out-new"), Duration::from_secs(60));
        aged(&dir.path().join("run-b/out-old"), 2 * day);
        aged(&dir.path().join("stats.json"), 2 * day);
        aged(&dir.path().join("other/out-old"), 2 * day);
        let store = DirectoryStore::new(dir.path());
        assert_eq!(store.sweep().unwrap(), 3);
        assert!(dir.path().join("run-a/out-new").exists());
        assert!(!dir.path().join("run-a/out-old").exists());
        assert!(!dir.path().join("run-b").exists(), "an emptied run directory goes too");
        assert!(dir.path().join("stats.json").exists());
        assert!(dir.path().join("other/out-old").exists());
        let forever = DirectoryStore::new(dir.path()).with_retention(None);
        aged(&dir.path().join("run-a/out-old"), 100 * day);
        assert_eq!(forever.sweep().unwrap(), 0);
        assert_eq!(DirectoryStore::new(dir.path().join("missing")).sweep().unwrap(), 0);
    }

    /// Sets the time `path` (a link itself, not followed) was last written to `age` ago.
    fn aged_link(path: &Path, age: Duration) {
        let then = std::time::SystemTime::now() - age;
        let since = then.duration_since(std::time::UNIX_EPOCH).unwrap();
        let time = rustix::fs::Timespec {
            tv_sec: since.as_secs().try_into().unwrap(),
            tv_nsec: since.subsec_nanos().into(),
        };
        let times = rustix::fs::Timestamps { last_access: time, last_modification: time };
        rustix::fs::utimensat(rustix::fs::CWD, path, &times, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .unwrap();
    }

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A run's folder that is a link to a folder elsewhere is removed as the link it is: the
    /// outputs in the folder it leads to are not swept.
    #[test]
    fn sweeping_removes_a_link_in_place_of_a_run_folder_not_what_it_leads_to() {
        let dir = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(24 * 60 * 60);
        let elsewhere = dir.path().join("elsewhere");
        aged(&elsewhere.join("out-1"), 2 * day);
        aged(&elsewhere.join(".out-2.tmp"), 2 * day);
        let root = dir.path().join("outputs");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("run-r")).unwrap();
        aged_link(&root.join("run-r"), 2 * day);
        // A fresh one stays until it is as old as an output would be.
        std::os::unix::fs::symlink(&elsewhere, root.join("run-new")).unwrap();
        assert_eq!(DirectoryStore::new(&root).sweep().unwrap(), 0);
        assert_eq!(names(&elsewhere), [".out-2.tmp", "out-1"], "nothing removed through the link");
        assert_eq!(names(&root), ["run-new"], "the old link is gone");
    }

    /// An output that is a link to a file or a folder elsewhere is removed as the link it is,
    /// and what it leads to stays whole.
    #[test]
    fn sweeping_removes_a_link_in_place_of_an_output_not_what_it_leads_to() {
        let dir = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(24 * 60 * 60);
        let elsewhere = dir.path().join("elsewhere");
        aged(&elsewhere.join("secret"), 2 * day);
        aged(&elsewhere.join("folder/out-1"), 2 * day);
        let root = dir.path().join("outputs");
        let run = root.join("run-r");
        std::fs::create_dir_all(&run).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("secret"), run.join("out-file")).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("folder"), run.join("out-folder")).unwrap();
        aged_link(&run.join("out-file"), 2 * day);
        aged_link(&run.join("out-folder"), 2 * day);
        assert_eq!(DirectoryStore::new(&root).sweep().unwrap(), 2);
        assert_eq!(names(&elsewhere), ["folder", "secret"]);
        assert_eq!(names(&elsewhere.join("folder")), ["out-1"]);
        assert!(!run.exists(), "the emptied run folder goes too");
    }

    /// A folder where an output would be goes with everything in it, however it nests; it
    /// stopped every sweep before.
    #[test]
    fn sweeping_removes_folders_in_a_run_folder_whole() {
        let dir = tempfile::tempdir().unwrap();
        let day = Duration::from_secs(24 * 60 * 60);
        let run = dir.path().join("run-r");
        aged(&run.join("out-folder/a/b/c/file"), 2 * day);
        aged(&run.join("out-folder/a/other"), 2 * day);
        std::fs::create_dir(run.join("out-folder/a/b/empty")).unwrap();
        std::os::unix::fs::symlink(dir.path(), run.join("out-folder/a/link")).unwrap();
        let folder = std::fs::File::open(run.join("out-folder")).unwrap();
        folder.set_modified(std::time::SystemTime::now() - 2 * day).unwrap();
        aged(&run.join("out-new"), Duration::from_secs(60));
        assert_eq!(DirectoryStore::new(dir.path()).sweep().unwrap(), 1);
        assert_eq!(names(&run), ["out-new"]);
        assert_eq!(names(dir.path()), ["run-r"], "nothing removed through the nested link");
        // Nested deeper than the sweep goes: refused with a message, nothing else harmed.
        let mut deep = run.join("out-deep");
        for _ in 0..=SWEEP_MAX_DEPTH {
            deep.push("d");
        }
        aged(&deep.join("file"), 2 * day);
        let folder = std::fs::File::open(run.join("out-deep")).unwrap();
        folder.set_modified(std::time::SystemTime::now() - 2 * day).unwrap();
        let refused = DirectoryStore::new(dir.path()).sweep().map_err(|e| e.to_string());
        let message = refused.expect_err("too deep");
        assert!(message.starts_with("output store at "), "{message}");
        let source = DirectoryStore::new(dir.path()).sweep().unwrap_err();
        let source = std::error::Error::source(&source).unwrap().to_string();
        expect!["folders nested more than 32 deep, which the store never makes; remove the folder by hand"]
            .assert_eq(&source);
        assert!(run.join("out-new").exists());
    }

    #[tokio::test]
    async fn storing_sweeps_at_most_once_an_hour() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirectoryStore::new(dir.path()).with_retention(Some(Duration::from_secs(60)));
        aged(&dir.path().join("run-a/out-1"), Duration::from_secs(120));
        let first = store.store("r", "t", "x").await.unwrap();
        assert!(!dir.path().join("run-a/out-1").exists());
        aged(&dir.path().join("run-a/out-2"), Duration::from_secs(120));
        store.store("r", "t", "y").await.unwrap();
        assert!(dir.path().join("run-a/out-2").exists(), "the next sweep is an hour away");
        assert_eq!(store.read(&first.handle, 0, 1).await.unwrap().text, "x");
    }

    /// One-line JSON longer than a page (an API's answer) is read to its end in pieces,
    /// then the next line; it could be read only to its first page's end.
    #[tokio::test]
    async fn a_line_longer_than_a_page_is_read_in_pieces() {
        use toolmux_core::ToolProvider as _;
        let dir = tempfile::tempdir().unwrap();
        let store: std::sync::Arc<dyn OutputStore> =
            std::sync::Arc::new(DirectoryStore::new(dir.path()));
        let json =
            format!("[{}]", (0..100).map(|i| format!("\"é{i:03}\"")).collect::<Vec<_>>().join(","));
        let stored = store.store("r", "t", &format!("{json}\nsecond line")).await.unwrap();
        let reader = OutputReader::new(store, 120 + 300);
        let ctx = toolmux_core::CallContext::new().with_run_id("r");
        let mut read = String::new();
        let mut args = serde_json::json!({"handle": stored.handle});
        for _ in 0..10 {
            let page = reader.call("read", args.clone(), &ctx).await.unwrap();
            let text = page.to_text();
            let (piece, note) = text.rsplit_once("\n[").unwrap();
            assert!(piece.len() <= 300, "{}", piece.len());
            read.push_str(piece);
            if page.extras["nextStartChar"].is_null() {
                assert_eq!(note, "line 1 ends; 2 lines; read on with offset 1]");
                break;
            }
            assert!(note.starts_with("line 1: characters "), "{note}");
            args["offset"] = page.extras["nextOffset"].clone();
            args["start_char"] = page.extras["nextStartChar"].clone();
        }
        assert_eq!(read, json, "the whole line, every character once");
        args["offset"] = 1.into();
        args["start_char"] = 0.into();
        let last = reader.call("read", args, &ctx).await.unwrap();
        assert_eq!(last.to_text(), "second line");
    }

    #[test]
    fn pages_of_content_in_memory() {
        assert_eq!(
            page_of("a\nb\nc\nd", 1, 2),
            OutputPage { text: "b\nc".into(), offset: 1, lines: 2, total_lines: 4 }
        );
        assert_eq!(page_of("a\n", 5, 2).lines, 0);
        assert!(valid_handle("run-x/out-1") && !valid_handle("run-x") && !valid_handle("a/../b"));
    }

    #[tokio::test]
    async fn handles_cannot_escape() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirectoryStore::new(dir.path());
        for bad in ["../x", "a/../../etc/passwd", "/etc/passwd", "a", "a/b/c", "run-x/nothing"] {
            let err = store.read(bad, 0, 1).await.unwrap_err();
            assert!(matches!(err, StoreError::UnknownHandle { .. }), "{bad}");
        }
        expect!["no stored output `../x`: handles look like `run-id/out-id`, as given in a tool_output message"]
            .assert_eq(&store.read("../x", 0, 1).await.unwrap_err().to_string());
    }
}
