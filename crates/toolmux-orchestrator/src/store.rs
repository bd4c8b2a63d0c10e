//! The output store: where outputs over the size cap are kept whole, to be read back by
//! handle with an offset and a limit.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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
pub struct OutputPage {
    /// The lines, joined with `\n`.
    pub text: String,
    /// Index of the first line returned (0-based).
    pub offset: u64,
    /// Lines returned.
    pub lines: u64,
    /// Lines in the whole output.
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
}

/// A directory per run under one root, a file per output.
#[derive(Debug)]
pub struct DirectoryStore {
    root: PathBuf,
    counter: AtomicU64,
}

impl DirectoryStore {
    /// A store under `root` (created on first write, mode 0700).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirectoryStore { root: root.into(), counter: AtomicU64::new(0) }
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
        let (run, id) = handle.split_once('/')?;
        let safe = |s: &str| {
            !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        (safe(run) && safe(id)).then(|| self.root.join(run).join(id))
    }
}

/// A run id as a directory name: kept when already safe, else sanitized with a hash suffix.
fn run_slug(run_id: &str) -> String {
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
        let io_path = file.clone();
        let dir_for_io = dir.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            use std::io::Write as _;
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir_for_io)?;
            // Write under a temporary name and rename, so a reader never sees half a file.
            let tmp = dir_for_io.join(format!(
                ".{}.tmp",
                io_path.file_name().and_then(|f| f.to_str()).unwrap_or("out")
            ));
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(content.as_bytes())?;
            f.sync_data()?;
            std::fs::rename(&tmp, &io_path)
        })
        .await
        .map_err(|e| StoreError::Io { path: file.clone(), source: std::io::Error::other(e) })?
        .map_err(|source| StoreError::Io { path: file.clone(), source })?;
        Ok(StoredOutput { handle: format!("{run}/{id}"), bytes, lines })
    }

    async fn read(&self, handle: &str, offset: u64, limit: u64) -> Result<OutputPage, StoreError> {
        let unknown = || StoreError::UnknownHandle { handle: handle.to_owned() };
        let path = self.path_of(handle).ok_or_else(unknown)?;
        let io_path = path.clone();
        // Stream the file: memory stays bounded by the page, however large the output.
        let read = tokio::task::spawn_blocking(move || -> std::io::Result<(Vec<String>, u64)> {
            use std::io::BufRead as _;
            let file = std::io::BufReader::new(std::fs::File::open(&io_path)?);
            let mut page = Vec::new();
            let mut total = 0u64;
            for line in file.lines() {
                let line = line?;
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
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(unknown()),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        Ok(OutputPage { lines: page.len() as u64, text: page.join("\n"), offset, total_lines })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

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
