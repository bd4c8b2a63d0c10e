//! `undo`: takes back the last change a run made with `write`, `edit`, `multi_edit` or
//! `apply_patch` (every file of it), or the last change to one file.
//!
//! Each of those tools records, per run and in memory, what the files it changed held
//! before and a hash of what it left. Undoing checks that every file is still as the
//! change left it (a later edit, a command or a person may have changed it since: then
//! nothing is done, and the model is told to read the file), then puts the old content
//! back atomically (a file the change created is removed, one it deleted comes back).
//! The record is bounded: the last [`CHANGES_KEPT`] changes of a run and at most
//! [`BYTES_KEPT`] bytes of old content; older ones are forgotten.

use crate::error::FsError;
use crate::workspace::{self, Hash, Resolved, Workspace};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use toolmux_core::ToolOutput;

/// Changes kept per run.
pub(crate) const CHANGES_KEPT: usize = 20;

/// Bytes of old content kept per run.
pub(crate) const BYTES_KEPT: usize = 16 << 20;

/// How many runs keep their changes; the oldest is forgotten first.
const RUNS_KEPT: usize = 64;

/// Arguments of `undo`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UndoArgs {
    /// Undo the last change to this file only (default: the last change, every file of
    /// it).
    #[serde(default)]
    pub path: Option<String>,
}

/// The description; `ns` is the namespace the tools are listed in (other tools are named
/// as a model calls them, `fs__ls` in `fs`).
pub(crate) fn description(ns: &str) -> String {
    format!(
        "Undo the last change this run made with `{ns}__write`, `{ns}__edit`, \
`{ns}__multi_edit` or `{ns}__apply_patch`: every file of that change gets its content and mode from before it \
back (a file it created is removed, one it deleted comes back). With `path`, only the last change to \
that file is undone. Refused, changing nothing, when a file changed since (by you, a command or \
anyone): read it and edit it instead. Call it again to undo the change before. The last 20 \
changes of the run are kept, in memory, while toolmux runs."
    )
}

/// One file a change touched.
#[derive(Debug, Clone)]
pub(crate) struct Touched {
    /// The file, as resolved when it was changed.
    pub(crate) path: Resolved,
    /// Where `path` led then (symlinks and `..` resolved, relative to the root): how a
    /// file is known whatever spelling named it, in the change or in `undo`.
    pub(crate) target: PathBuf,
    /// Its bytes before the change; `None` when it did not exist.
    pub(crate) before: Option<Vec<u8>>,
    /// The hash of what the change left; `None` when it removed the file.
    pub(crate) after: Option<Hash>,
    /// Its permission bits before the change (set-id bits included), `None` when it did
    /// not exist: brought back, it gets them again, so a script deleted or moved stays
    /// executable and one whose set-user-id bit a rewrite cleared has it again.
    pub(crate) mode: Option<u32>,
}

/// One call's change.
#[derive(Debug, Clone)]
struct Change {
    /// Which change of its run it is, counted from 1 in the order they were made: a change
    /// put back after a refused undo goes back to its place by it.
    id: u64,
    tool: &'static str,
    files: Vec<Touched>,
}

impl Change {
    fn bytes(&self) -> usize {
        self.files.iter().map(|f| f.before.as_ref().map_or(0, Vec::len)).sum()
    }
}

/// The changes of every run, newest last.
#[derive(Debug, Default)]
pub(crate) struct Changes(Mutex<Runs>);

#[derive(Debug, Default)]
struct Runs {
    runs: HashMap<String, VecDeque<Change>>,
    order: VecDeque<String>,
    /// The last [`Change::id`] given.
    last_id: u64,
}

/// A change [`Changes::take`] took out of the record, with where it was.
#[derive(Debug)]
struct Taken {
    change: Change,
    /// The index its file had among the files of its change when only that file of it was
    /// taken (`undo` with `path`), the rest staying in the record.
    split_at: Option<usize>,
}

impl Changes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `tool` changed `files` in `run`. A change larger than
    /// [`BYTES_KEPT`] is not kept (it could not be undone), nor are the older changes
    /// of the files it touched, which undoing would now skip over.
    pub(crate) fn record(&self, run: &str, tool: &'static str, files: Vec<Touched>) {
        if files.is_empty() {
            return;
        }
        let mut runs = self.lock();
        runs.last_id += 1;
        let change = Change { id: runs.last_id, tool, files };
        if !runs.runs.contains_key(run) {
            if runs.order.len() >= RUNS_KEPT
                && let Some(oldest) = runs.order.pop_front()
            {
                runs.runs.remove(&oldest);
            }
            runs.order.push_back(run.to_owned());
        }
        let kept = runs.runs.entry(run.to_owned()).or_default();
        if change.bytes() > BYTES_KEPT {
            let touched: Vec<&Path> = change.files.iter().map(|f| f.target.as_path()).collect();
            kept.retain(|c| !c.files.iter().any(|f| touched.contains(&f.target.as_path())));
            return;
        }
        kept.push_back(change);
        let mut total: usize = kept.iter().map(Change::bytes).sum();
        while kept.len() > CHANGES_KEPT || total > BYTES_KEPT {
            let Some(oldest) = kept.pop_front() else { break };
            total -= oldest.bytes();
        }
    }

    /// Takes the change to undo out of the record: the run's last, or the last that
    /// touched `file` (where a path leads, as [`Touched::target`]; only that file of it);
    /// `None` when there is none.
    fn take(&self, run: &str, file: Option<&Path>) -> Option<Taken> {
        let mut runs = self.lock();
        let kept = runs.runs.get_mut(run)?;
        let Some(file) = file else {
            return kept.pop_back().map(|change| Taken { change, split_at: None });
        };
        let at = kept.iter().rposition(|c| c.files.iter().any(|f| f.target == file))?;
        let change = &mut kept[at];
        let index = change.files.iter().position(|f| f.target == file)?;
        let touched = change.files.remove(index);
        let (id, tool) = (change.id, change.tool);
        let split_at = match change.files.is_empty() {
            true => {
                kept.remove(at);
                None
            }
            false => Some(index),
        };
        Some(Taken { change: Change { id, tool, files: vec![touched] }, split_at })
    }

    /// Forgets the changes of `run` that touched `file` (a [`Touched::target`]): a change
    /// to it could not be recorded, and undoing an older one would skip over it.
    pub(crate) fn forget(&self, run: &str, file: &Path) {
        if let Some(kept) = self.lock().runs.get_mut(run) {
            kept.retain(|c| !c.files.iter().any(|f| f.target == file));
        }
    }

    /// Puts a change taken out back where it was, when undoing it was refused: a file
    /// taken out of a change goes back into it, and a change goes back among the others
    /// in the order they were made (put last, a plain `undo` would take it again, and be
    /// refused again, rather than undo the change after it).
    fn put_back(&self, run: &str, taken: Taken) {
        let mut runs = self.lock();
        let kept = runs.runs.entry(run.to_owned()).or_default();
        let Taken { change, split_at } = taken;
        if let Some(index) = split_at
            && let Some(whole) = kept.iter_mut().find(|c| c.id == change.id)
        {
            for touched in change.files.into_iter().rev() {
                whole.files.insert(index.min(whole.files.len()), touched);
            }
            return;
        }
        let at = kept.iter().position(|c| c.id > change.id).unwrap_or(kept.len());
        kept.insert(at, change);
    }
}

/// What `path` holds now, for [`Touched::before`]: `Some(None)` when nothing is there,
/// `Some(bytes)`, or `None` when it cannot be kept (over `limit`, unreadable).
pub(crate) fn before(ws: &Workspace, path: &Resolved, limit: u64) -> Option<Option<Vec<u8>>> {
    match ws.dir().metadata(&path.relative) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(None),
        Err(_) => None,
        Ok(_) => ws.read_small("undo", path, limit).ok().map(Some),
    }
}

/// Records in `run` that `tool` wrote `bytes` to `path`, which held `before` with the
/// permission bits `mode` ([`workspace::Written::previous_mode`]).
pub(crate) fn wrote(
    ws: &Workspace,
    run: &str,
    tool: &'static str,
    path: &Resolved,
    before: Option<Option<Vec<u8>>>,
    (bytes, mode): (&[u8], Option<u32>),
) {
    let target = ws.resolve_target(path);
    match before {
        Some(before) => {
            let touched = Touched {
                path: path.clone(),
                target,
                before,
                after: Some(workspace::hash(bytes)),
                mode,
            };
            ws.changes().record(run, tool, vec![touched]);
        }
        None => ws.changes().forget(run, &target),
    }
}

/// Runs `undo`.
pub(crate) fn undo(ws: &Workspace, run: &str, args: UndoArgs) -> Result<ToolOutput, FsError> {
    let file = match &args.path {
        Some(given) => {
            if given.is_empty() {
                return Err(FsError::InvalidArguments {
                    tool: "undo",
                    message: "`path` is empty: give the path of a file, or leave `path` out to \
                              undo the last change"
                        .into(),
                });
            }
            let resolved = ws.resolve(given)?;
            Some((given.clone(), ws.resolve_target(&resolved)))
        }
        None => None,
    };
    let Some(taken) = ws.changes().take(run, file.as_ref().map(|(_, p)| p.as_path())) else {
        let message = match &file {
            Some((given, _)) => format!(
                "no change to `{given}` is kept for this run: only changes made with write, \
                 edit, multi_edit or apply_patch in this run can be undone (the last \
                 {CHANGES_KEPT})"
            ),
            None => format!(
                "no change is kept for this run: only changes made with write, edit, \
                 multi_edit or apply_patch in this run can be undone (the last {CHANGES_KEPT})"
            ),
        };
        return Err(FsError::InvalidArguments { tool: "undo", message });
    };
    let change = &taken.change;
    match put_back(ws, run, change) {
        Ok(done) => Ok(ToolOutput::text(format!(
            "undid the `{}` of {}:\n{}",
            change.tool,
            plural(change.files.len(), "file"),
            done.join("\n")
        ))
        .with_extra(
            "files",
            json!(change.files.iter().map(|f| &f.path.given).collect::<Vec<_>>()),
        )),
        Err(error) => {
            ws.changes().put_back(run, taken);
            Err(error)
        }
    }
}

/// Checks that every file of `change` is as the change left it, then puts its old content
/// back; one line per file. Nothing is written unless every file checks out.
fn put_back(ws: &Workspace, run: &str, change: &Change) -> Result<Vec<String>, FsError> {
    // One lock per file, in one order (as `apply_patch` takes them).
    let mut sorted: Vec<&Touched> = change.files.iter().collect();
    sorted.sort_by(|a, b| a.target.cmp(&b.target));
    let mut locks = Vec::with_capacity(sorted.len());
    for touched in &sorted {
        let target = ws.check_write(&touched.path)?;
        locks.push(ws.lock_file(&touched.path, &target)?);
    }
    let mut moved = Vec::new();
    for touched in &sorted {
        let unchanged = match (ws.dir().metadata(&touched.path.relative), &touched.after) {
            (Err(e), None) if e.kind() == std::io::ErrorKind::NotFound => true,
            (Ok(meta), Some(after)) if meta.is_file() => ws.hash_file(&touched.path)? == *after,
            _ => false,
        };
        if !unchanged {
            moved.push(touched.path.given.clone());
        }
    }
    if !moved.is_empty() {
        return Err(FsError::Edit {
            path: moved[0].clone(),
            message: format!(
                "{} changed since the `{}` being undone (by a later call, a command or \
                 someone else), so nothing was undone: read {} and edit {} instead",
                list(&moved),
                change.tool,
                if moved.len() == 1 { "it" } else { "them" },
                if moved.len() == 1 { "it" } else { "them" },
            ),
        });
    }
    let mut done = Vec::with_capacity(change.files.len());
    for touched in &change.files {
        let given = &touched.path.given;
        match &touched.before {
            Some(bytes) => {
                let written = ws.write_atomic(&touched.path, bytes)?;
                // The mode from before too: the write keeps the present one, less the
                // set-id bits, which the change being undone may have cleared.
                if let Some(mode) = touched.mode {
                    use cap_std::fs::PermissionsExt as _;
                    let permissions = cap_std::fs::Permissions::from_mode(mode);
                    ws.dir()
                        .set_permissions(&touched.path.relative, permissions)
                        .map_err(|e| FsError::from_io(&touched.path.given, e))?;
                }
                ws.record_read(run, written.canonical, workspace::hash(bytes));
                let lines = bytes.iter().filter(|&&b| b == b'\n').count();
                done.push(if touched.after.is_some() {
                    format!(
                        "- `{given}`: its content from before is back ({})",
                        plural(lines, "line")
                    )
                } else {
                    format!("- `{given}`: deleted by it, it is back ({})", plural(lines, "line"))
                });
            }
            None => {
                ws.remove_file(&touched.path)?;
                done.push(format!("- `{given}`: created by it, it is removed"));
            }
        }
    }
    drop(locks);
    Ok(done)
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

fn list(paths: &[String]) -> String {
    let quoted: Vec<String> = paths.iter().map(|p| format!("`{p}`")).collect();
    quoted.join(", ")
}
