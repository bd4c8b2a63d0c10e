//! Spaces kept in a folder: `state.json` (the agents' state and the visible calls still
//! waiting) and `spaces/NAME.json` (one file per space), each replaced whole by a
//! temporary file renamed over it, under the lock file `.lock`, so that processes sharing
//! the folder see each other's changes and never a half-written file.

use super::{Space, State};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::ToolError;

/// How long a change waits for another process's.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(super) struct DirStore {
    path: PathBuf,
    temp: AtomicU64,
}

/// Held while a change is made; the lock is released when it is dropped.
#[derive(Debug)]
pub(super) struct Lock {
    file: File,
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

impl DirStore {
    pub(super) fn open(path: PathBuf) -> Result<DirStore, String> {
        let spaces = path.join("spaces");
        std::fs::create_dir_all(&spaces)
            .map_err(|e| format!("cannot make the spaces folder `{}`: {e}", spaces.display()))?;
        Ok(DirStore { path, temp: AtomicU64::new(0) })
    }

    pub(super) async fn lock(&self) -> Result<Lock, ToolError> {
        let at = self.path.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&at)
            .map_err(|e| failure(&at, &e))?;
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Lock { file }),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => return Err(failure(&at, &e)),
            }
            if started.elapsed() >= LOCK_TIMEOUT {
                return Err(ToolError::Unavailable {
                    provider: "gateway".into(),
                    message: format!(
                        "the spaces folder `{}` stayed locked by another process for {} s; \
                         try again",
                        self.path.display(),
                        LOCK_TIMEOUT.as_secs()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub(super) fn load_state(&self) -> Result<State, ToolError> {
        Ok(self.read(&self.path.join("state.json"))?.unwrap_or_default())
    }

    pub(super) fn save_state(&self, state: &State) -> Result<(), ToolError> {
        self.write(&self.path.join("state.json"), state)
    }

    pub(super) fn load_space(&self, name: &str) -> Result<Option<Space>, ToolError> {
        self.read(&self.space_path(name))
    }

    pub(super) fn save_space(&self, name: &str, space: &Space) -> Result<(), ToolError> {
        self.write(&self.space_path(name), space)
    }

    /// The stored names of the spaces in the folder.
    pub(super) fn space_names(&self) -> Result<Vec<String>, ToolError> {
        let at = self.path.join("spaces");
        let entries = std::fs::read_dir(&at).map_err(|e| failure(&at, &e))?;
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter_map(|file| file.strip_suffix(".json").and_then(decode))
            .collect();
        names.sort();
        Ok(names)
    }

    fn space_path(&self, name: &str) -> PathBuf {
        self.path.join("spaces").join(format!("{}.json", encode(name)))
    }

    fn read<T: serde::de::DeserializeOwned>(&self, at: &Path) -> Result<Option<T>, ToolError> {
        let bytes = match std::fs::read(at) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(failure(at, &e)),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| ToolError::Other {
            provider: "gateway".into(),
            message: format!(
                "`{}` is not a spaces file toolmux can read ({e}); move it away to start it anew",
                at.display()
            ),
            source: None,
        })
    }

    fn write<T: serde::Serialize>(&self, at: &Path, value: &T) -> Result<(), ToolError> {
        let json = serde_json::to_vec(value).map_err(|e| ToolError::Other {
            provider: "gateway".into(),
            message: format!("cannot encode `{}`: {e}", at.display()),
            source: None,
        })?;
        let n = self.temp.fetch_add(1, Ordering::Relaxed);
        let file_name = at.file_name().and_then(|n| n.to_str()).unwrap_or("spaces");
        let tmp = at.with_file_name(format!(".{file_name}.{}.{n}.tmp", std::process::id()));
        let written = std::fs::write(&tmp, &json)
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, at));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(failure(at, &e));
        }
        Ok(())
    }
}

fn failure(at: &Path, e: &std::io::Error) -> ToolError {
    ToolError::Other {
        provider: "gateway".into(),
        message: format!("`{}`: {e}", at.display()),
        source: None,
    }
}

/// A stored space name as a file name: bytes other than letters, digits, `.`, `_` and `-`
/// as `%XX` (a key holder's spaces are `HOLDER/NAME`).
fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-') || (b == b'.' && !out.is_empty()) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(file: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(file.len());
    let mut rest = file.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_survive_the_file_system() {
        for name in ["lobby", "a.b_c-d", "acme corp/lobby", ".hidden", "ünï/x"] {
            let file = encode(name);
            assert!(!file.contains('/') && !file.starts_with('.'), "{file}");
            assert_eq!(decode(&file).as_deref(), Some(name));
        }
    }
}
