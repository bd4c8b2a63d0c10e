//! Finding the workspace's own files: everything beneath the root except build output,
//! hidden directories (`.git`, `.ci/node`, virtual environments) and `node_modules`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

/// Every file beneath `root` whose name ends in `.{extension}`, sorted.
pub(crate) fn files_with_extension(root: &Path, extension: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries =
            fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
            let path = entry.path();
            let file_type = entry.file_type()?;
            if file_type.is_dir() {
                if !is_skipped_dir(root, &path) {
                    dirs.push(path);
                }
            } else if file_type.is_file() && path.extension().is_some_and(|e| e == extension) {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

fn is_skipped_dir(root: &Path, dir: &Path) -> bool {
    let name = dir.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    name.starts_with('.')
        || name == "node_modules"
        || dir == root.join("target")
        // Cargo marks every target directory, wherever CARGO_TARGET_DIR puts it, with this file.
        || dir.join("CACHEDIR.TAG").exists()
}

/// `path` relative to `root` when beneath it, for messages.
pub(crate) fn relative(root: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(root).unwrap_or(path).to_path_buf()
}
