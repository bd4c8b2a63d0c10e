//! A change of several files of a folder made whole or not at all, through a journal: every
//! new file is written to `.staged/N`, then the journal `.commit` lists the renames (and
//! removals) that make the change, then they are made and the journal removed, all under
//! the folder's lock. Whoever takes the lock next, in any process, first completes a
//! journal that a process killed meanwhile left, or discards one not fully written (its
//! trailer names its length), so that no change is ever seen half made.
//!
//! Why a journal and not one file: the spaces keep one file per space so that a change
//! reads and writes only the spaces it touches, and the pending calls one file per call so
//! that a listing reads only the calls that changed.

use crate::folder::{self, Lock};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};
use toolmux_core::ToolError;

/// The journal of a change being made, in the folder.
const JOURNAL: &str = ".commit";

/// The journal while it is being written (renamed to [`JOURNAL`] once whole).
const JOURNAL_TEMPORARY: &str = ".commit.tmp";

/// The folder of the new files of a change being made, in the folder.
const STAGED: &str = ".staged";

/// A change of files of one folder (paths relative to it), made by [`Change::commit`].
#[derive(Debug, Default)]
pub(crate) struct Change {
    writes: Vec<(PathBuf, Vec<u8>)>,
    removals: Vec<PathBuf>,
}

/// One step of a journal, in the order made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Step {
    /// Renames `.staged/{staged}` to `to`, unless it was renamed already.
    Rename { staged: usize, to: String },
    /// Removes `at`, if there.
    Remove { at: String },
}

/// What `.commit` holds: its steps as JSON, then the trailer `\nend LENGTH\n`, LENGTH being
/// the JSON's length in bytes. A journal without its whole trailer was not fully written.
#[derive(Debug, Serialize, Deserialize)]
struct Journal {
    steps: Vec<Step>,
}

impl Change {
    /// Writes `value` as JSON to file `at` (relative to the folder).
    pub(crate) fn write_json<T: Serialize>(
        &mut self,
        at: impl Into<PathBuf>,
        value: &T,
        provider: &str,
    ) -> Result<(), ToolError> {
        let at = at.into();
        let json = serde_json::to_vec(value).map_err(|e| ToolError::Other {
            provider: provider.into(),
            message: format!("cannot encode `{}`: {e}", at.display()),
            source: None,
        })?;
        self.writes.push((at, json));
        Ok(())
    }

    /// Removes file `at` (relative to the folder), if there.
    pub(crate) fn remove(&mut self, at: impl Into<PathBuf>) {
        self.removals.push(at.into());
    }

    /// Makes the change in folder `dir`, whose lock `_lock` is held: whole, or (killed
    /// midway) completed by whoever takes the lock next. With `durable` every file and
    /// folder is flushed to the disk before the next step, so that a power loss too leaves
    /// the change whole or not made. A change of one file is that file replaced, which is
    /// whole by itself.
    pub(crate) fn commit(
        self,
        dir: &Path,
        _lock: &Lock,
        durable: bool,
        provider: &str,
    ) -> Result<(), ToolError> {
        let fail = |at: &Path, e: std::io::Error| folder::failure(provider, at, &e);
        match (self.writes.as_slice(), self.removals.as_slice()) {
            ([], []) => return Ok(()),
            ([(at, bytes)], []) => {
                let at = dir.join(at);
                let how = toolmux_core::Replace { private: false, durable };
                return toolmux_core::replace_file(&at, bytes, how).map_err(|e| fail(&at, e));
            }
            ([], [at]) => return remove(&dir.join(at)).map_err(|e| fail(&dir.join(at), e)),
            _ => {}
        }
        let staged = dir.join(STAGED);
        folder::make_dir(&staged, "staged changes").map_err(|message| ToolError::Other {
            provider: provider.into(),
            message,
            source: None,
        })?;
        clear(&staged);
        let mut steps = Vec::with_capacity(self.writes.len() + self.removals.len());
        for (n, (at, bytes)) in self.writes.iter().enumerate() {
            let file = staged.join(n.to_string());
            write_file(&file, bytes, durable).map_err(|e| fail(&file, e))?;
            steps.push(Step::Rename { staged: n, to: relative(at, provider)? });
        }
        for at in &self.removals {
            steps.push(Step::Remove { at: relative(at, provider)? });
        }
        if durable {
            // The staged files' names last before the journal that names them does.
            sync_dir(&staged).map_err(|e| fail(&staged, e))?;
        }
        stop_point(0);
        let journal = serde_json::to_vec(&Journal { steps: steps.clone() })
            .map_err(|e| ToolError::other(provider, e))?;
        let mut bytes = journal.clone();
        bytes.extend_from_slice(format!("\nend {}\n", journal.len()).as_bytes());
        let written = dir.join(JOURNAL_TEMPORARY);
        write_file(&written, &bytes, durable).map_err(|e| fail(&written, e))?;
        let at = dir.join(JOURNAL);
        std::fs::rename(&written, &at).map_err(|e| fail(&at, e))?;
        if durable {
            sync_dir(dir).map_err(|e| fail(dir, e))?;
        }
        stop_point(1);
        apply(dir, &steps, durable, 2).map_err(|(file, e)| ToolError::Other {
            provider: provider.into(),
            message: format!(
                "`{}`: {e}; the change is recorded in `{}` and is completed by the folder's \
                 next change once that is fixed",
                file.display(),
                at.display()
            ),
            source: None,
        })?;
        remove(&at).map_err(|e| fail(&at, e))?;
        if durable {
            // Gone for good before the next change stages its files: a journal that came
            // back after a power loss would rename them to this change's files.
            sync_dir(dir).map_err(|e| fail(dir, e))?;
        }
        Ok(())
    }
}

/// Completes the change whose journal a process killed midway left in folder `dir`, or
/// discards one not fully written (its files were not touched yet). Called by whoever
/// takes the folder's lock, before anything else.
pub(crate) fn recover(dir: &Path, provider: &str) -> Result<(), ToolError> {
    let at = dir.join(JOURNAL);
    let bytes = match std::fs::read(&at) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(folder::failure(provider, &at, &e)),
    };
    match parse(&bytes) {
        Some(steps) => {
            apply(dir, &steps, true, usize::MAX).map_err(|(file, e)| ToolError::Other {
                provider: provider.into(),
                message: format!(
                    "cannot complete the change a process left half made in `{}` \
                     (`{}`: {e}): fix that file's permissions, or move `{}` away to leave the \
                     change half made",
                    dir.display(),
                    file.display(),
                    at.display()
                ),
                source: None,
            })?;
            tracing::info!(
                target: "toolmux::external",
                "completed the change a process left half made in `{}`",
                dir.display()
            );
        }
        None => tracing::warn!(
            target: "toolmux::external",
            "discarded the change a process left unrecorded in `{}` (its journal was cut short)",
            dir.display()
        ),
    }
    remove(&at).map_err(|e| folder::failure(provider, &at, &e))?;
    let _ = remove(&dir.join(JOURNAL_TEMPORARY));
    sync_dir(dir).map_err(|e| folder::failure(provider, dir, &e))?;
    clear(&dir.join(STAGED));
    Ok(())
}

/// Whether folder `dir` holds a journal: a change under way, or one a process killed
/// midway left, which a reader without the lock would see half made.
pub(crate) fn pending(dir: &Path) -> bool {
    dir.join(JOURNAL).exists()
}

/// The steps of journal `bytes`: `None` when it is not whole, or names a path outside the
/// folder.
fn parse(bytes: &[u8]) -> Option<Vec<Step>> {
    let text = std::str::from_utf8(bytes).ok()?.strip_suffix('\n')?;
    let (json, length) = text.rsplit_once("\nend ")?;
    if length.parse::<usize>().ok()? != json.len() {
        return None;
    }
    let journal: Journal = serde_json::from_str(json).ok()?;
    let inside = |at: &str| Path::new(at).components().all(|c| matches!(c, Component::Normal(_)));
    let fits = journal.steps.iter().all(|step| match step {
        Step::Rename { to, .. } => inside(to),
        Step::Remove { at } => inside(at),
    });
    fits.then_some(journal.steps)
}

/// Makes `steps` in folder `dir`, each again harmless when it was made already; stops at
/// step `first + i` after step `i` (tests only). Flushes the folders changed when
/// `durable`.
fn apply(
    dir: &Path,
    steps: &[Step],
    durable: bool,
    first: usize,
) -> Result<(), (PathBuf, std::io::Error)> {
    let staged = dir.join(STAGED);
    let mut changed: Vec<PathBuf> = vec![staged.clone()];
    for (i, step) in steps.iter().enumerate() {
        let target = match step {
            Step::Rename { staged: n, to } => {
                let (from, to) = (staged.join(n.to_string()), dir.join(to));
                match std::fs::rename(&from, &to) {
                    // Renamed already, before the process making the change stopped.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && !from.exists() => {}
                    Err(e) => return Err((to, e)),
                    Ok(()) => {}
                }
                to
            }
            Step::Remove { at } => {
                let at = dir.join(at);
                remove(&at).map_err(|e| (at.clone(), e))?;
                at
            }
        };
        if let Some(parent) = target.parent()
            && !changed.iter().any(|p| p == parent)
        {
            changed.push(parent.to_owned());
        }
        stop_point(first.saturating_add(i));
    }
    if durable {
        for folder in &changed {
            sync_dir(folder).map_err(|e| (folder.clone(), e))?;
        }
    }
    Ok(())
}

/// Path `at` as a journal names it.
fn relative(at: &Path, provider: &str) -> Result<String, ToolError> {
    at.to_str().map(str::to_owned).ok_or_else(|| ToolError::Other {
        provider: provider.into(),
        message: format!("`{}` is no UTF-8 path", at.display()),
        source: None,
    })
}

/// Writes file `at` anew with `bytes`, flushed when `durable`.
fn write_file(at: &Path, bytes: &[u8], durable: bool) -> std::io::Result<()> {
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(at)?;
    file.write_all(bytes)?;
    if durable {
        file.sync_all()?;
    }
    Ok(())
}

/// Removes file `at`; one already gone is fine.
fn remove(at: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(at) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes the files in folder `dir` (a change's staged files, which no journal names).
fn clear(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().filter_map(Result::ok) {
        let _ = std::fs::remove_file(entry.path());
    }
}

/// Flushes folder `dir`'s entries (new names, renames) to the disk; a folder gone (a
/// cleaner of temporary files removed it) has none to flush.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match File::open(dir) {
        Ok(folder) => folder.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The variable that makes a test's child process stop at a step of its change.
#[cfg(test)]
pub(crate) const STOP_AT: &str = "TOOLMUX_TEST_COMMIT_STOP_AT";

/// What a child process stopped by [`STOP_AT`] prints, then the step.
#[cfg(test)]
pub(crate) const STOPPED: &str = "toolmux-test: commit stopped at step";

/// In tests, stops the process at `step` of a change when [`STOP_AT`] says so: it says so
/// on stdout and waits to be killed (aborting after a minute, never hanging).
#[cfg(test)]
fn stop_point(step: usize) {
    if std::env::var(STOP_AT).ok().and_then(|v| v.parse::<usize>().ok()) == Some(step) {
        println!("{STOPPED} {step}");
        let _ = std::io::stdout().flush();
        std::thread::sleep(std::time::Duration::from_secs(60));
        std::process::abort();
    }
}

#[cfg(not(test))]
fn stop_point(_step: usize) {}

#[cfg(test)]
pub(crate) mod tests;
