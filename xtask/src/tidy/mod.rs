//! `cargo xtask tidy`: the house rules that rustc and clippy do not check.
//!
//! - every `.rs` file starts with a `//!` line;
//! - no skipped tests, no tests that expect a panic, no placeholder or debugging macros;
//! - the layering invariants of DESIGN.md, read from `cargo metadata`;
//! - libraries neither read the process's current directory nor spawn processes, except
//!   in the modules that must spawn.
//!
//! The same checks run as the `tidy` unit test, so `cargo test --workspace` enforces them.

mod layering;
mod sources;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::metadata::Metadata;

/// One broken rule, at a place a human can jump to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// Relative to the workspace root.
    pub(crate) path: PathBuf,
    /// 1-based.
    pub(crate) line: usize,
    pub(crate) message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.message)
    }
}

/// Runs every check; an error listing all violations when there are any.
pub(crate) fn run(root: &Path) -> Result<()> {
    let violations = check(root)?;
    if !violations.is_empty() {
        let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
        bail!("tidy found {} violation(s):\n{}", violations.len(), list.join("\n"));
    }
    eprintln!("tidy: ok");
    Ok(())
}

/// Every violation in the workspace at `root`.
pub(crate) fn check(root: &Path) -> Result<Vec<Violation>> {
    let metadata = Metadata::load(root, false)?;
    let mut violations = Vec::new();
    sources::check(root, &layering::library_source_dirs(&metadata), &mut violations)?;
    layering::check(&metadata, &mut violations)?;
    Ok(violations)
}
