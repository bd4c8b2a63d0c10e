//! Files written whole or not at all.

use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// How [`replace_file`] writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Replace {
    /// The file is created readable and writable by its owner only (mode 0600), as what
    /// holds tokens, conversations or tool output must be; otherwise the umask decides.
    pub private: bool,
    /// The file and then its folder are flushed to the disk before the call returns, so a
    /// crash or power loss after it keeps the new content (what must survive one).
    pub durable: bool,
}

/// Replaces the file at `path` with `bytes` through a temporary file beside it, renamed
/// over it: a reader sees the old content or the new, never a part, and a failure leaves
/// the old file as it was and no temporary behind. The temporary's name is unique to the
/// process and the call, so concurrent writers of one file never share one.
pub fn replace_file(path: &Path, bytes: &[u8], how: Replace) -> io::Result<()> {
    static TEMPORARY: AtomicU64 = AtomicU64::new(0);
    let n = TEMPORARY.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or("file".into());
    let temporary = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let written = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        if how.private {
            options.mode(0o600);
        }
        let mut file = options.open(&temporary)?;
        file.write_all(bytes)?;
        if how.durable {
            file.sync_all()?;
        }
        std::fs::rename(&temporary, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(e);
    }
    if how.durable {
        // The rename lasts once the folder does. A file system that cannot flush a
        // folder says so; the file is written all the same.
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if let Ok(folder) = File::open(folder) {
            let _ = folder.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn scratch() -> std::path::PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "toolmux-core-replace-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replaces_whole_and_leaves_no_temporary() {
        let dir = scratch();
        let path = dir.join("a.json");
        replace_file(&path, b"one", Replace::default()).unwrap();
        replace_file(&path, b"two", Replace { private: true, durable: true }).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let names: Vec<_> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["a.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = scratch();
        let path = dir.join("kept");
        std::fs::write(&path, "old").unwrap();
        // A folder where the file would be renamed to: the rename fails.
        let blocked = dir.join("blocked");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("inside"), "x").unwrap();
        assert!(replace_file(&blocked, b"new", Replace::default()).is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        let mut names: Vec<_> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["blocked", "kept"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
