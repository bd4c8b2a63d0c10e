//! Spaces kept in a folder: `state.json` (the agents' state and the visible calls still
//! waiting) and `spaces/NAME.json` (one file per space), each replaced whole by a
//! temporary file renamed over it, under the lock file `.lock`, so that processes sharing
//! the folder see each other's changes and never a half-written file.

use super::{Space, State};
use crate::folder::{self, Lock};
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

    pub(super) fn save_state(&self, state: &State) -> Result<(), ToolError> {
        folder::write_json(&self.path.join("state.json"), state, true, PROVIDER)
    }

    pub(super) fn load_space(&self, name: &str) -> Result<Option<Space>, ToolError> {
        folder::read_json(&self.space_path(name), PROVIDER, "a spaces file")
    }

    pub(super) fn save_space(&self, name: &str, space: &Space) -> Result<(), ToolError> {
        folder::write_json(&self.space_path(name), space, true, PROVIDER)
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

    fn space_path(&self, name: &str) -> PathBuf {
        self.path.join("spaces").join(format!("{}.json", folder::encode(name)))
    }
}
