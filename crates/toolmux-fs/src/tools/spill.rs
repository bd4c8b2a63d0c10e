//! Files that keep the full output of `bash`, `exec` and background tasks, made so that
//! other users of the machine can neither read them nor redirect them.
//!
//! Without `bash.spillDir` they go to a directory of this user's own in the system
//! temporary directory, `toolmux-fs-<uid>`: created with mode 0700, refused when it is a
//! symlink or belongs to someone else (anyone can create a name in a shared `/tmp` first),
//! and tightened to 0700 when it is ours but open to others. A configured directory is the
//! user's choice and is used as it is (created 0700 when missing), its path resolved once
//! when the tools are made ([`resolved`]) and never through a symlink after: a command
//! that could write a folder above it could otherwise put a symlink to a folder it may not
//! write in its place before a spill and have the file made there. The directory is opened
//! once and checked, swept and written through that handle (`openat`, `unlinkat`), never
//! by path again: commands may write the temporary directory, so they can rename this one
//! and put a symlink in its place between a check and an open. Each file is created new
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600) under a name with a random part, so a name
//! planted in advance, symlink or not, is never opened. Spill files of foreground commands
//! are not removed by anyone else, so each new one first removes this user's spill files
//! older than [`MAX_AGE`] from the directory (best effort).

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::ffi::OsStr;
use std::fs::{self, DirBuilder, File};
use std::hash::BuildHasher as _;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Component, Path, PathBuf};
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
    create_between(configured, &std::env::temp_dir(), kind, || {})
}

/// [`create`], with this user's directory beneath `base`, calling `checked` once the
/// directory is open and swept, right before the file is made (where a test replaces it).
fn create_between(
    configured: Option<&Path>,
    base: &Path,
    kind: Kind,
    checked: impl FnOnce(),
) -> Result<(PathBuf, File), String> {
    let (path, dir) = open_directory(configured, base)?;
    sweep(&dir, SystemTime::now());
    checked();
    let pid = std::process::id();
    let (name, file) = create_in(&dir, &path, || {
        format!("{}-{pid}-{:016x}.{}", kind.prefix(), token(), kind.extension())
    })?;
    // The file was made in the directory opened, wherever its path leads now; a path
    // that no longer leads there (a command renamed the directory and put a symlink or a
    // directory of its own in its place) would send readers elsewhere.
    let opened = rustix::fs::fstat(&dir);
    let named = fs::metadata(&path);
    let same = matches!((&opened, &named), (Ok(opened), Ok(named))
        if opened.st_dev == named.dev() && opened.st_ino == named.ino());
    if !same {
        let _ = rustix::fs::unlinkat(&dir, name.as_str(), AtFlags::empty());
        return Err(format!(
            "the spill directory `{}` was replaced while a spill file was made in it (a \
             command may have renamed it); the output was not saved",
            path.display()
        ));
    }
    Ok((path.join(name), file))
}

/// The spill directory `configured` names (else this user's own in the system temporary
/// directory), made or checked as [`create`] does: for the sandbox to keep it read-only
/// to commands from their start.
pub(crate) fn directory(configured: Option<&Path>) -> Result<PathBuf, String> {
    let configured = configured.map(resolved);
    open_directory(configured.as_deref(), &std::env::temp_dir()).map(|(path, _)| path)
}

/// The spill directory `configured` names, made 0700 where missing, else this user's
/// own beneath `base` ([`private_dir`]); with a handle on it.
fn open_directory(configured: Option<&Path>, base: &Path) -> Result<(PathBuf, OwnedFd), String> {
    match configured {
        Some(dir) => {
            DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| {
                format!("the spill directory `{}` cannot be created: {e}", dir.display())
            })?;
            // `dir` was resolved when the tools were made ([`resolved`]): a symlink the user
            // chose was followed then. One found on the way now was put there since (by a
            // command that could write a folder above), and following it would write the
            // file wherever it leads.
            let handle = open_dir_following_no_symlink(dir).map_err(|e| {
                if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                    format!(
                        "the spill directory `{}` is reached through a symbolic link put \
                         there since toolmux started (a command may have replaced a folder \
                         on its way); refusing to write command output through it",
                        dir.display()
                    )
                } else {
                    format!("the spill directory `{}` cannot be opened: {e}", dir.display())
                }
            })?;
            Ok((dir.to_path_buf(), handle))
        }
        None => private_dir(base, rustix::process::getuid().as_raw()),
    }
}

/// The configured spill directory `configured` as spills will use it: absolute paths with
/// the symlinks on their way resolved now, once (the user's choice), so that
/// [`create`] can follow none later; a relative path as it is.
pub(crate) fn resolved(configured: &Path) -> PathBuf {
    if configured.is_absolute() {
        crate::protect::resolve_ambient(configured)
    } else {
        configured.to_path_buf()
    }
}

/// Opens the directory `path` for the `*at` calls one component at a time, none of them
/// followed if it is a symlink (`ELOOP` then, whatever the kernel said).
fn open_dir_following_no_symlink(path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let start = if path.has_root() { Path::new("/") } else { Path::new(".") };
    let mut dir = open_dir(start, OFlags::empty())?;
    for part in path.components() {
        let name = match part {
            Component::Normal(name) => name,
            Component::ParentDir => OsStr::new(".."),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
        };
        dir = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
            Ok(next) => next,
            // With `O_DIRECTORY`, a symlink is refused as no directory: said as a link.
            Err(e) => {
                let link = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|m| FileType::from_raw_mode(m.st_mode) == FileType::Symlink);
                return Err(if link { rustix::io::Errno::LOOP } else { e }.into());
            }
        };
    }
    Ok(dir)
}

/// Opens the directory `path` for the `*at` calls, with `extra` flags.
fn open_dir(path: &Path, extra: OFlags) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | extra;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// This user's spill directory beneath `base`, `toolmux-fs-<uid>`, made or checked to be
/// private: a directory (not a symlink) owned by `uid`, mode 0700. It is checked through
/// the handle returned, in which the files are then made: commands may write the
/// temporary directory, so rename this one, and a path checked first and opened later
/// could lead through a symlink put there in between.
fn private_dir(base: &Path, uid: u32) -> Result<(PathBuf, OwnedFd), String> {
    let dir = base.join(format!("toolmux-fs-{uid}"));
    match DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(format!("the spill directory `{}` cannot be created: {e}", dir.display()));
        }
    }
    let fix = "remove it, or set `bash.spillDir` to a directory of your own";
    let handle = match open_dir(&dir, OFlags::NOFOLLOW) {
        Ok(handle) => handle,
        // Looked at again only to say why.
        Err(e) => {
            return Err(match fs::symlink_metadata(&dir) {
                Ok(meta) if meta.file_type().is_symlink() => format!(
                    "the spill directory `{}` is a symbolic link, which someone else may have \
                     planted; refusing to write command output through it: {fix}",
                    dir.display()
                ),
                Ok(meta) if !meta.is_dir() => {
                    format!("the spill directory `{}` is not a directory: {fix}", dir.display())
                }
                _ => format!("the spill directory `{}` cannot be opened: {e}", dir.display()),
            });
        }
    };
    let meta = rustix::fs::fstat(&handle).map_err(|e| {
        let e = io::Error::from(e);
        format!("the spill directory `{}` cannot be checked: {e}", dir.display())
    })?;
    if meta.st_uid != uid {
        return Err(format!(
            "the spill directory `{}` belongs to user {}, not to this user ({uid}); refusing to \
             write command output there: {fix}",
            dir.display(),
            meta.st_uid
        ));
    }
    if meta.st_mode & 0o077 != 0 {
        rustix::fs::fchmod(&handle, Mode::from_raw_mode(0o700)).map_err(|e| {
            let e = io::Error::from(e);
            format!("the spill directory `{}` cannot be made private: {e}", dir.display())
        })?;
    }
    Ok((dir, handle))
}

/// Creates a file named by `name` in the directory `dir` (shown as `shown`), new and
/// private, trying another name when one exists already (whatever it is, a symlink
/// included: it is never opened). Returns the name and the file.
fn create_in(
    dir: &OwnedFd,
    shown: &Path,
    mut name: impl FnMut() -> String,
) -> Result<(String, File), String> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let name = name();
        match open_new(dir, &name) {
            Ok(file) => return Ok((name, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(format!(
                    "a spill file cannot be created in `{}`: {e}",
                    shown.display()
                ));
            }
        }
    }
    let why = last.map(|e| e.to_string()).unwrap_or_default();
    Err(format!(
        "no new spill file could be created in `{}` after {ATTEMPTS} names were taken: {why}",
        shown.display()
    ))
}

/// Opens `name` in `dir` for writing only if this call creates it: `O_EXCL` makes an
/// existing name (a symlink too) an error, `O_NOFOLLOW` says so again, mode 0600.
fn open_new(dir: &OwnedFd, name: &str) -> io::Result<File> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(File::from(rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?))
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

/// Removes this user's spill files in the directory `dir` last modified more than
/// [`MAX_AGE`] before `now`; files of other names, other owners, and anything not a plain
/// file stay. Every call is made relative to `dir`, following no symlink.
fn sweep(dir: &OwnedFd, now: SystemTime) {
    let Ok(entries) = rustix::fs::Dir::read_from(dir) else { return };
    let uid = rustix::process::getuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_ok_and(is_spill_name) {
            continue;
        }
        let Ok(meta) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else { continue };
        let file = FileType::from_raw_mode(meta.st_mode) == FileType::RegularFile;
        // Whole seconds: precise enough against a day.
        let modified = u64::try_from(meta.st_mtime)
            .ok()
            .map(|secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
        let old = modified
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age > MAX_AGE);
        if file && meta.st_uid == uid && old {
            let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    fn open(path: &Path) -> OwnedFd {
        open_dir(path, OFlags::empty()).unwrap()
    }

    #[test]
    fn the_directory_and_files_are_private() {
        let base = tempfile::tempdir().unwrap();
        let uid = rustix::process::getuid().as_raw();
        let (dir, _) = private_dir(base.path(), uid).unwrap();
        assert_eq!(dir, base.path().join(format!("toolmux-fs-{uid}")));
        assert_eq!(mode(&dir), 0o700);
        // Ours but open to others: tightened.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(private_dir(base.path(), uid).unwrap().0, dir);
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
    fn a_directory_swapped_for_a_symlink_after_its_check_is_not_written_through() {
        let base = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let uid = rustix::process::getuid().as_raw();
        let dir = base.path().join(format!("toolmux-fs-{uid}"));
        let moved = base.path().join("moved");
        // A command in the sandbox (which writes /tmp) renames the checked directory and
        // puts a symlink to a folder of the user's in its place, between the check and
        // the file's creation.
        let made = create_between(None, base.path(), Kind::Task, || {
            fs::rename(&dir, &moved).unwrap();
            std::os::unix::fs::symlink(outside.path(), &dir).unwrap();
        });
        let outside_entries: Vec<_> = fs::read_dir(outside.path()).unwrap().collect();
        assert!(outside_entries.is_empty(), "{outside_entries:?}");
        let err = made.unwrap_err();
        assert!(err.contains("was replaced while a spill file was made in it"), "{err}");
        // What was made there is removed again.
        assert_eq!(fs::read_dir(&moved).unwrap().count(), 0);
    }

    /// A configured directory replaced by a symlink after the check before a command (by a
    /// command that could write the folder above it) is not written through; a symlink the
    /// user configured is followed, once, when the tools are made.
    #[test]
    fn a_configured_directory_swapped_for_a_symlink_is_not_written_through() {
        let base = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let dir = resolved(&base.path().join("spill"));
        directory(Some(&dir)).unwrap();
        fs::rename(&dir, base.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), &dir).unwrap();
        let err = create(Some(&dir), Kind::Stdout).unwrap_err();
        assert!(err.contains("is reached through a symbolic link put there since"), "{err}");
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
        // A folder on the way replaced the same way.
        let deeper = resolved(&base.path().join("a/spill"));
        directory(Some(&deeper)).unwrap();
        fs::rename(base.path().join("a"), base.path().join("a-moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), base.path().join("a")).unwrap();
        fs::create_dir(outside.path().join("spill")).unwrap();
        assert!(create(Some(&deeper), Kind::Stdout).is_err());
        assert_eq!(fs::read_dir(outside.path().join("spill")).unwrap().count(), 0);
        // The user's own symlink, resolved when the tools are made.
        let link = base.path().join("link");
        std::os::unix::fs::symlink(base.path().join("moved"), &link).unwrap();
        let chosen = resolved(&link);
        let (path, _) = create(Some(&chosen), Kind::Task).unwrap();
        assert!(path.starts_with(fs::canonicalize(base.path().join("moved")).unwrap()));
    }

    #[test]
    fn a_planted_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("taken")).unwrap();
        let handle = open(dir.path());
        // Opening the name directly fails...
        let err = open_new(&handle, "taken").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        // ... and creation moves on to the next name.
        let mut names = ["taken", "free"].into_iter();
        let (name, _) =
            create_in(&handle, dir.path(), || names.next().unwrap().to_owned()).unwrap();
        assert_eq!(name, "free");
        assert!(dir.path().join("free").is_file());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(fs::symlink_metadata(dir.path().join("taken")).unwrap().is_symlink());
        // A dangling symlink is not created through either.
        std::os::unix::fs::symlink(dir.path().join("nothing"), dir.path().join("dangling"))
            .unwrap();
        assert!(open_new(&handle, "dangling").is_err());
        assert!(!dir.path().join("nothing").exists());
        // Every name taken: a clear error.
        let err = create_in(&handle, dir.path(), || "taken".to_owned()).unwrap_err();
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
        sweep(&open(dir.path()), SystemTime::now());
        assert!(!old_out.exists() && !old_task.exists());
        assert!(new_out.exists() && old_other.exists() && old_close.exists());
        // Creating a spill file sweeps too.
        let old_again = put("out-3-0000000000000000.stdout", true);
        create(Some(dir.path()), Kind::Task).unwrap();
        assert!(!old_again.exists());
    }
}
