//! Files that keep the full output of `bash`, `exec` and background tasks, made so that
//! other users of the machine can neither read them nor redirect them.
//!
//! Without `bash.spillDir` they go to a directory of this user's own in the system
//! temporary directory, `toolmux-fs-<uid>`: created with mode 0700, refused when it is a
//! symlink or belongs to someone else (anyone can create a name in a shared `/tmp` first),
//! and tightened to 0700 when it is ours but open to others. A configured directory is the
//! user's choice and is used as it is (created 0700 when missing). Each file is created
//! new (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600) under a name with a random part, so a name
//! planted in advance, symlink or not, is never opened. Spill files of foreground commands
//! are not removed by anyone else, so each new one first removes this user's spill files
//! older than [`MAX_AGE`] from the directory (best effort).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::hash::BuildHasher as _;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// Spill files older than this are removed when a new one is made.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Names tried before giving up (each has 64 random bits: a clash is someone planting).
const ATTEMPTS: usize = 16;

/// What a spill file holds, which names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A foreground command's stdout.
    Stdout,
    /// A foreground command's stderr.
    Stderr,
    /// A background task's interleaved output.
    Task,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Stdout | Kind::Stderr => "out",
            Kind::Task => "task",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Kind::Stdout => "stdout",
            Kind::Stderr => "stderr",
            Kind::Task => "log",
        }
    }

    const ALL: [Kind; 3] = [Kind::Stdout, Kind::Stderr, Kind::Task];
}

/// Makes a new, private spill file in `configured` (else this user's directory in the
/// system temporary directory). The error says why, for the tool's output.
pub(crate) fn create(configured: Option<&Path>, kind: Kind) -> Result<(PathBuf, File), String> {
    let dir = match configured {
        Some(dir) => {
            DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| {
                format!("the spill directory `{}` cannot be created: {e}", dir.display())
            })?;
            dir.to_path_buf()
        }
        None => {
            let uid = rustix::process::getuid().as_raw();
            private_dir(&std::env::temp_dir(), uid)?
        }
    };
    sweep(&dir, SystemTime::now());
    let pid = std::process::id();
    create_in(&dir, || format!("{}-{pid}-{:016x}.{}", kind.prefix(), token(), kind.extension()))
}

/// This user's spill directory beneath `base`, `toolmux-fs-<uid>`, made or checked to be
/// private: a directory (not a symlink) owned by `uid`, mode 0700.
fn private_dir(base: &Path, uid: u32) -> Result<PathBuf, String> {
    let dir = base.join(format!("toolmux-fs-{uid}"));
    match DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!("the spill directory `{}` cannot be created: {e}", dir.display()));
        }
    }
    let fix = "remove it, or set `bash.spillDir` to a directory of your own";
    let meta = fs::symlink_metadata(&dir)
        .map_err(|e| format!("the spill directory `{}` cannot be checked: {e}", dir.display()))?;
    if meta.file_type().is_symlink() {
        return Err(format!(
            "the spill directory `{}` is a symbolic link, which someone else may have planted; \
             refusing to write command output through it: {fix}",
            dir.display()
        ));
    }
    if !meta.is_dir() {
        return Err(format!("the spill directory `{}` is not a directory: {fix}", dir.display()));
    }
    if meta.uid() != uid {
        return Err(format!(
            "the spill directory `{}` belongs to user {}, not to this user ({uid}); refusing to \
             write command output there: {fix}",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(|e| {
            format!("the spill directory `{}` cannot be made private: {e}", dir.display())
        })?;
    }
    Ok(dir)
}

/// Creates a file named by `name` in `dir`, new and private, trying another name when one
/// exists already (whatever it is, a symlink included: it is never opened).
fn create_in(dir: &Path, mut name: impl FnMut() -> String) -> Result<(PathBuf, File), String> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let path = dir.join(name());
        match open_new(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(format!("a spill file cannot be created in `{}`: {e}", dir.display()));
            }
        }
    }
    let why = last.map(|e| e.to_string()).unwrap_or_default();
    Err(format!(
        "no new spill file could be created in `{}` after {ATTEMPTS} names were taken: {why}",
        dir.display()
    ))
}

/// Opens `path` for writing only if this call creates it: `O_EXCL` makes an existing name
/// (a symlink too) an error, `O_NOFOLLOW` says so again, mode 0600.
fn open_new(path: &Path) -> io::Result<File> {
    let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
    OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(nofollow).open(path)
}

/// 64 bits no other user can guess: std's hasher keys come from the operating system's
/// random source; the process id, the time and a counter make each token differ.
fn token() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    std::collections::hash_map::RandomState::new().hash_one((
        std::process::id(),
        nanos.as_nanos(),
        count,
    ))
}

/// Whether `name` is one [`create`] makes: `<prefix>-<pid>-<16 hex>.<extension>`.
fn is_spill_name(name: &str) -> bool {
    Kind::ALL.iter().any(|kind| {
        let Some(rest) = name.strip_prefix(kind.prefix()).and_then(|r| r.strip_prefix('-')) else {
            return false;
        };
        let Some(rest) = rest.strip_suffix(kind.extension()).and_then(|r| r.strip_suffix('.'))
        else {
            return false;
        };
        let Some((pid, token)) = rest.split_once('-') else { return false };
        !pid.is_empty()
            && pid.bytes().all(|b| b.is_ascii_digit())
            && token.len() == 16
            && token.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// Removes this user's spill files in `dir` last modified more than [`MAX_AGE`] before
/// `now`; files of other names, other owners, and anything not a plain file stay.
fn sweep(dir: &Path, now: SystemTime) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let uid = rustix::process::getuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_spill_name) {
            continue;
        }
        // `DirEntry::metadata` does not follow symlinks.
        let Ok(meta) = entry.metadata() else { continue };
        let old = meta
            .modified()
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age > MAX_AGE);
        if meta.is_file() && meta.uid() == uid && old {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn the_directory_and_files_are_private() {
        let base = tempfile::tempdir().unwrap();
        let uid = rustix::process::getuid().as_raw();
        let dir = private_dir(base.path(), uid).unwrap();
        assert_eq!(dir, base.path().join(format!("toolmux-fs-{uid}")));
        assert_eq!(mode(&dir), 0o700);
        // Ours but open to others: tightened.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(private_dir(base.path(), uid).unwrap(), dir);
        assert_eq!(mode(&dir), 0o700);
        let (path, _) = create(Some(&dir), Kind::Stdout).unwrap();
        assert_eq!(mode(&path), 0o600);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(is_spill_name(name), "{name}");
        // Two files never share a name.
        let (other, _) = create(Some(&dir), Kind::Stdout).unwrap();
        assert_ne!(path, other);
    }

    #[test]
    fn a_symlinked_or_foreign_directory_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let uid = rustix::process::getuid().as_raw();
        std::os::unix::fs::symlink(elsewhere.path(), base.path().join(format!("toolmux-fs-{uid}")))
            .unwrap();
        let err = private_dir(base.path(), uid).unwrap_err();
        assert!(err.contains("is a symbolic link, which someone else may have planted"), "{err}");
        assert!(err.ends_with("remove it, or set `bash.spillDir` to a directory of your own"));
        // A directory that belongs to another user: seen from a uid that is not its owner.
        let other = uid.wrapping_add(1);
        fs::create_dir(base.path().join(format!("toolmux-fs-{other}"))).unwrap();
        let err = private_dir(base.path(), other).unwrap_err();
        assert!(
            err.contains(&format!("belongs to user {uid}, not to this user ({other})")),
            "{err}"
        );
    }

    #[test]
    fn a_planted_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("taken")).unwrap();
        // Opening the name directly fails...
        let err = open_new(&dir.path().join("taken")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        // ... and creation moves on to the next name.
        let mut names = ["taken", "free"].into_iter();
        let (path, _) = create_in(dir.path(), || names.next().unwrap().to_owned()).unwrap();
        assert_eq!(path, dir.path().join("free"));
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(fs::symlink_metadata(dir.path().join("taken")).unwrap().is_symlink());
        // A dangling symlink is not created through either.
        std::os::unix::fs::symlink(dir.path().join("nothing"), dir.path().join("dangling"))
            .unwrap();
        assert!(open_new(&dir.path().join("dangling")).is_err());
        assert!(!dir.path().join("nothing").exists());
        // Every name taken: a clear error.
        let err = create_in(dir.path(), || "taken".to_owned()).unwrap_err();
        assert!(err.starts_with("no new spill file could be created in"), "{err}");
    }

    #[test]
    fn old_spill_files_are_swept_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let day_ago = SystemTime::now() - MAX_AGE - Duration::from_secs(60);
        let put = |name: &str, old: bool| {
            let path = dir.path().join(name);
            let file = File::create(&path).unwrap();
            if old {
                file.set_modified(day_ago).unwrap();
            }
            path
        };
        let old_out = put("out-12-0123456789abcdef.stdout", true);
        let old_task = put("task-7-fedcba9876543210.log", true);
        let new_out = put("out-12-0123456789abcde0.stderr", false);
        let old_other = put("out-notes.txt", true);
        let old_close = put("out-12-0123456789abcdef.txt", true);
        sweep(dir.path(), SystemTime::now());
        assert!(!old_out.exists() && !old_task.exists());
        assert!(new_out.exists() && old_other.exists() && old_close.exists());
        // Creating a spill file sweeps too.
        let old_again = put("out-3-0000000000000000.stdout", true);
        create(Some(dir.path()), Kind::Task).unwrap();
        assert!(!old_again.exists());
    }
}
