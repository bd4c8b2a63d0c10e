//! Spaces kept in a folder: `state.json` (the agents' state and the visible calls still
//! waiting) and `spaces/NAME.json` (one file per space), under the lock file `.lock`, so
//! that processes sharing the folder see each other's changes. A change's files are
//! replaced together through the folder's journal ([`crate::journal`]): a process killed
//! midway leaves a change that the next holder of the lock completes, so that no change is
//! seen half made (a space's message without the cursor that says its author read it).

use super::{Space, State};
use crate::folder::{self, Lock};
use crate::journal::Change;
use std::path::PathBuf;
use toolmux_core::ToolError;

/// The provider errors of this store name.
const PROVIDER: &str = "gateway";

#[derive(Debug, Clone)]
pub(super) struct DirStore {
    path: PathBuf,
}

impl DirStore {
    pub(super) fn open(path: PathBuf) -> Result<DirStore, String> {
        folder::make_dir(&path.join("spaces"), "spaces")?;
        Ok(DirStore { path })
    }

    pub(super) fn lock_blocking(&self) -> Result<Lock, ToolError> {
        folder::lock_blocking(&self.path, "spaces", PROVIDER, &["spaces"])
    }

    pub(super) fn load_state(&self) -> Result<State, ToolError> {
        Ok(folder::read_json(&self.path.join("state.json"), PROVIDER, "a spaces file")?
            .unwrap_or_default())
    }

    pub(super) fn load_space(&self, name: &str) -> Result<Option<Space>, ToolError> {
        folder::read_json(&self.path.join(space_file(name)), PROVIDER, "a spaces file")
    }

    /// Writes `spaces` and, when given, `state`, all at once (flushed to the disk), holding
    /// the folder's lock (`lock`).
    pub(super) fn save(
        &self,
        lock: &Lock,
        state: Option<&State>,
        spaces: &[(&str, &Space)],
    ) -> Result<(), ToolError> {
        let mut change = Change::default();
        for (name, space) in spaces {
            change.write_json(space_file(name), space, PROVIDER)?;
        }
        if let Some(state) = state {
            change.write_json("state.json", state, PROVIDER)?;
        }
        change.commit(&self.path, lock, true, PROVIDER)
    }

    /// The stored names of the spaces in the folder.
    pub(super) fn space_names(&self) -> Result<Vec<String>, ToolError> {
        let at = self.path.join("spaces");
        let entries = std::fs::read_dir(&at).map_err(|e| folder::failure(PROVIDER, &at, &e))?;
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter_map(|file| file.strip_suffix(".json").and_then(folder::decode))
            .collect();
        names.sort();
        Ok(names)
    }
}

/// Space `name`'s file, in the folder.
fn space_file(name: &str) -> PathBuf {
    PathBuf::from("spaces").join(format!("{}.json", folder::encode(name)))
}

#[cfg(test)]
mod tests {
    use super::super::{Message, Spaces, Who};
    use crate::journal::tests::{child_dir, killed_at};

    const TEST: &str =
        "spaces::dir::tests::a_change_killed_at_any_step_is_seen_whole_or_not_at_all";

    const SPACES: [&str; 2] = ["one", "two"];

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
    }

    /// One change of three files: a message in each of spaces `one` and `two` (their files)
    /// and agent `a`'s cursors past both (`state.json`).
    async fn change(spaces: &Spaces) {
        spaces
            .transact_for(
                |_| SPACES.map(str::to_owned).to_vec(),
                |txn| {
                    for name in SPACES {
                        let space = txn.space(name)?.expect("made by the setup");
                        let message = Message {
                            index: 0,
                            author: "agent:a".into(),
                            text: Some(format!("hello {name}")),
                            tool: None,
                            at_ms: 1,
                            rev: 0,
                            posted_rev: 0,
                        };
                        space.push(message, 100);
                        txn.touch(name);
                    }
                    let entity = txn.entity("agent:a", "test")?;
                    for name in SPACES {
                        entity.read.insert(name.to_owned(), 1);
                    }
                    txn.changed();
                    Ok(())
                },
            )
            .await
            .expect("the change is made");
    }

    /// What the folder's spaces say: each space's count of messages and agent `a`'s cursor
    /// in it, read as a new process opening the folder reads them.
    async fn seen(spaces: &Spaces) -> Vec<(u64, u64)> {
        spaces
            .transact_for(
                |_| SPACES.map(str::to_owned).to_vec(),
                |txn| {
                    let mut seen = Vec::new();
                    for name in SPACES {
                        let total = txn.space(name)?.map_or(0, |s| s.total());
                        let read = txn.state.entities["agent:a"].read.get(name).copied();
                        seen.push((total, read.unwrap_or(0)));
                    }
                    Ok(seen)
                },
            )
            .await
            .expect("the spaces are read")
    }

    /// A process changing the state and two spaces at once, killed with SIGKILL after any
    /// step of the change (its new files written, its journal written, each file renamed),
    /// leaves the folder as it was before the change or after it, never between: a space
    /// with a new message whose author's cursor says it was not read, or the reverse.
    /// Before the journal, each file was renamed in turn, and the child killed after the
    /// first left one space changed and the others not.
    #[test]
    fn a_change_killed_at_any_step_is_seen_whole_or_not_at_all() {
        if let Some(dir) = child_dir() {
            let spaces = Spaces::in_dir(dir).expect("the folder opens");
            runtime().block_on(change(&spaces));
            return;
        }
        let (before, after) = (vec![(0, 0), (0, 0)], vec![(1, 1), (1, 1)]);
        let mut seen_after = Vec::new();
        let mut steps = 0;
        loop {
            let dir = tempfile::tempdir().unwrap();
            let who = Who { holder: None, entity: "agent:a".into() };
            let spaces = Spaces::in_dir(dir.path()).unwrap();
            runtime().block_on(async {
                for name in SPACES {
                    spaces.enter(&who, name, 0).await.unwrap();
                }
                assert_eq!(seen(&spaces).await, before);
            });
            let killed = killed_at(TEST, dir.path(), steps);
            let reopened = Spaces::in_dir(dir.path()).unwrap();
            seen_after.push((steps, killed, runtime().block_on(seen(&reopened))));
            assert!(!dir.path().join(".commit").exists(), "the journal is gone");
            if !killed {
                break;
            }
            steps += 1;
        }
        let half: Vec<_> =
            seen_after.iter().filter(|(_, _, now)| *now != before && *now != after).collect();
        assert!(half.is_empty(), "half made (step, killed, what was seen): {half:?}");
        for (step, killed, now) in &seen_after {
            // Killed before its journal was whole, the change is not made; after, it is.
            let expected = if *killed && *step == 0 { &before } else { &after };
            assert_eq!(now, expected, "killed after step {step}");
        }
        assert_eq!(steps, 5, "staged, journal and three renames: every step was tried");
    }
}
