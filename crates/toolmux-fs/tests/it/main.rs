//! Integration tests of the builtin tools through the `ToolProvider` interface.

// Helpers outside `#[test]` functions panic on purpose too: a panic is the failure report.
#![allow(clippy::unwrap_used)]

mod commands;
mod confinement;
mod conformance;
mod edit;
mod grep;
mod listing;
mod nested_repos;
mod notebook;
mod orphans;
mod parallel;
mod patch;
mod path_errors;
mod protect;
mod read;
mod sandbox;
mod shell;
mod subjects;
mod tasks;
mod undo;
mod utf32;
mod write;

use serde_json::Value;
use std::path::{Path, PathBuf};
use toolmux_core::{CallContext, ToolError, ToolOutput, ToolProvider};
use toolmux_fs::{FsConfig, FsProvider, Permission};

/// A temporary workspace with a provider over it.
#[derive(Debug)]
pub struct Fixture {
    pub temp: tempfile::TempDir,
    pub fs: FsProvider,
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture::with(|c| c)
    }
}

impl Fixture {
    /// Every permission class on.
    pub fn new() -> Fixture {
        Fixture::default()
    }

    /// A fixture whose config is adjusted by `f` (all classes on before).
    pub fn with(f: impl FnOnce(FsConfig) -> FsConfig) -> Fixture {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let config = FsConfig::new(&root).with_permissions([
            Permission::Read,
            Permission::Write,
            Permission::Execute,
        ]);
        let fs = FsProvider::new(f(config)).unwrap();
        Fixture { temp, fs }
    }

    pub fn root(&self) -> PathBuf {
        self.temp.path().join("root")
    }

    /// A directory beside the root, outside it.
    pub fn outside(&self) -> PathBuf {
        self.temp.path().to_path_buf()
    }

    pub fn put(&self, rel: &str, content: &str) -> PathBuf {
        let path = self.root().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        path
    }

    pub fn get(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root().join(rel)).unwrap()
    }

    pub async fn call(&self, tool: &str, args: Value) -> Result<ToolOutput, ToolError> {
        self.fs.call(tool, args, &CallContext::new()).await
    }

    pub async fn call_in(
        &self,
        run: &str,
        tool: &str,
        args: Value,
    ) -> Result<ToolOutput, ToolError> {
        self.fs.call(tool, args, &CallContext::new().with_run_id(run)).await
    }

    /// The text of a successful call.
    pub async fn ok(&self, tool: &str, args: Value) -> String {
        match self.call(tool, args).await {
            Ok(out) => out.to_text(),
            Err(e) => panic!("{tool} failed: {}", e.report()),
        }
    }

    /// The message of a failed call.
    pub async fn err(&self, tool: &str, args: Value) -> String {
        match self.call(tool, args).await {
            Ok(out) => panic!("{tool} succeeded: {}", out.to_text()),
            Err(e) => e.report(),
        }
    }
}

/// Whether process `pid` runs (exists and is not a zombie).
pub fn runs(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
}

/// Replaces the temporary directory in `text` with `<tmp>`.
pub fn scrub(text: &str, dir: &Path) -> String {
    text.replace(&dir.to_string_lossy().into_owned(), "<tmp>")
}
