//! What the two folder-backed stores share (the spaces' and the pending calls'): a lock
//! file that every change is made under, files replaced whole through a renamed temporary
//! file (never seen half-written), changes of several files made whole through a journal
//! ([`crate::journal`]), and names made safe for the file system.

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::time::Duration;
use toolmux_core::ToolError;

/// How long a change waits for another process's (in this crate's unit tests, a moment).
#[cfg(not(test))]
pub(crate) const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
#[cfg(test)]
pub(crate) const LOCK_TIMEOUT: Duration = Duration::from_millis(300);

/// Held while a change is made; the lock is released when it is dropped.
#[derive(Debug)]
pub(crate) struct Lock {
    file: File,
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// Opens lock file `at`, for [`try_lock`], making it if missing, and its folder too (mode
/// 0700, as [`make_dir`]): a cleaner of temporary files may have removed the folder under
/// a process that keeps using it.
pub(crate) fn lock_file(at: &Path, provider: &str) -> Result<File, ToolError> {
    let open = || OpenOptions::new().create(true).truncate(false).write(true).open(at);
    let opened = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = at.parent() {
                make_dir(dir, "locked").map_err(|message| ToolError::Other {
                    provider: provider.into(),
                    message,
                    source: None,
                })?;
            }
            open()
        }
        opened => opened,
    };
    opened.map_err(|e| failure(provider, at, &e))
}

/// Takes the lock of `file` if no other holder has it: `Ok(None)` when another has.
pub(crate) fn try_lock(file: &File, at: &Path, provider: &str) -> Result<Option<()>, ToolError> {
    #[cfg(test)]
    tests::TRIES.set(tests::TRIES.get() + 1);
    match file.try_lock() {
        Ok(()) => Ok(Some(())),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(failure(provider, at, &e)),
    }
}

/// Takes the lock of folder `dir` (its file `.lock`), waiting up to [`LOCK_TIMEOUT`] for
/// another process to release it: on a blocking thread. The folder and its `subfolders`
/// are made again (mode 0700) when they went missing since they were made, and a change of
/// several files left half made by a process killed midway is completed first
/// ([`crate::journal`]).
pub(crate) fn lock_blocking(
    dir: &Path,
    what: &str,
    provider: &str,
    subfolders: &[&str],
) -> Result<Lock, ToolError> {
    lock_within(dir, what, provider, subfolders, LOCK_TIMEOUT)
}

/// [`lock_blocking`], waiting up to `within` (at most [`LOCK_TIMEOUT`]) for another
/// process to release the lock: for a change its caller needs done by a time of its own.
/// The lock is tried once however short `within` is.
pub(crate) fn lock_within(
    dir: &Path,
    what: &str,
    provider: &str,
    subfolders: &[&str],
    within: Duration,
) -> Result<Lock, ToolError> {
    let within = within.min(LOCK_TIMEOUT);
    let at = dir.join(".lock");
    let file = lock_file(&at, provider)?;
    let taken = try_lock(&file, &at, provider)?.is_some()
        || !within.is_zero() && wait_for_lock(&file, &at, provider, within)?;
    if !taken {
        return Err(locked(dir, what, provider, within));
    }
    let lock = Lock { file };
    for sub in subfolders {
        let sub = dir.join(sub);
        if !sub.is_dir() {
            make_dir(&sub, what).map_err(|message| ToolError::Other {
                provider: provider.into(),
                message,
                source: None,
            })?;
        }
    }
    // A change a process killed midway left is completed (or discarded) before anything
    // is read or changed.
    crate::journal::recover(dir, provider)?;
    Ok(lock)
}

/// The first pause between tries of a lock another holder has, doubled after each try up
/// to [`LOCK_PAUSE_MOST`]: a lock held a moment is taken within about a millisecond of its
/// release, and a long wait tries it ten times a second.
const LOCK_PAUSE_LEAST: Duration = Duration::from_millis(1);

/// The longest pause between tries of a lock.
const LOCK_PAUSE_MOST: Duration = Duration::from_millis(100);

/// Waits up to `within` for the lock of `file`, which another holder has: whether it was
/// taken. The lock is tried without blocking after pauses growing from
/// [`LOCK_PAUSE_LEAST`] to [`LOCK_PAUSE_MOST`], the last try at the end of the wait, on the
/// caller's thread: a wait that gives up leaves nothing behind (a thread blocked in taking
/// the lock would stay as long as the holder keeps it, one per wait given up, and a hung
/// holder would gather them without end).
fn wait_for_lock(
    file: &File,
    at: &Path,
    provider: &str,
    within: Duration,
) -> Result<bool, ToolError> {
    let deadline = std::time::Instant::now() + within;
    let mut pause = LOCK_PAUSE_LEAST;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        std::thread::sleep(pause.min(left));
        if try_lock(file, at, provider)?.is_some() {
            return Ok(true);
        }
        pause = (pause * 2).min(LOCK_PAUSE_MOST);
    }
}

fn locked(dir: &Path, what: &str, provider: &str, waited: Duration) -> ToolError {
    let waited = match waited.subsec_millis() {
        0 if !waited.is_zero() => format!("{} s", waited.as_secs()),
        _ => format!("{} ms", waited.as_millis()),
    };
    ToolError::Unavailable {
        provider: provider.into(),
        message: format!(
            "the {what} folder `{}` stayed locked by another process (holding `{}`) for \
             {waited}; try again",
            dir.display(),
            dir.join(".lock").display()
        ),
    }
}

/// Makes folder `dir` and the folders above it that are missing, each new one mode 0700,
/// so that no other user reads what they keep (messages, a call's arguments). A folder that
/// exists is left as it is: one the user configured may be shared on purpose; the default
/// place, in the system's temporary folder, is checked by the facade to be this user's.
pub(crate) fn make_dir(dir: &Path, what: &str) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot make the {what} folder `{}`: {e}", dir.display()))
}

/// Reads JSON file `at`: `None` when there is none.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(
    at: &Path,
    provider: &str,
    what: &str,
) -> Result<Option<T>, ToolError> {
    let bytes = match std::fs::read(at) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failure(provider, at, &e)),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| ToolError::Other {
        provider: provider.into(),
        message: format!(
            "`{}` is not {what} toolmux can read ({e}); move it away to start it anew",
            at.display()
        ),
        source: None,
    })
}

/// Writes `value` as JSON to file `at` with [`replace`].
pub(crate) fn write_json<T: serde::Serialize>(
    at: &Path,
    value: &T,
    durable: bool,
    provider: &str,
) -> Result<(), ToolError> {
    let json = serde_json::to_vec(value).map_err(|e| ToolError::Other {
        provider: provider.into(),
        message: format!("cannot encode `{}`: {e}", at.display()),
        source: None,
    })?;
    let how = toolmux_core::Replace { private: false, durable };
    toolmux_core::replace_file(at, &json, how).map_err(|e| failure(provider, at, &e))
}

/// An error of file or folder `at`.
pub(crate) fn failure(provider: &str, at: &Path, e: &std::io::Error) -> ToolError {
    ToolError::Other {
        provider: provider.into(),
        message: format!("`{}`: {e}", at.display()),
        source: None,
    }
}

/// A name as a file name: bytes other than letters, digits, `.`, `_` and `-` as `%XX`,
/// and a leading `.` too (so that no name is hidden, `.` or `..`).
pub(crate) fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-') || (b == b'.' && !out.is_empty()) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The name [`encode`] made `file` from.
pub(crate) fn decode(file: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(file.len());
    let mut rest = file.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    thread_local! {
        /// How many times [`try_lock`] was called on this thread.
        pub(super) static TRIES: Cell<usize> = const { Cell::new(0) };
    }

    /// The folder's lock file opened and locked apart from [`lock_blocking`], as another
    /// process holds it.
    fn hold(dir: &Path) -> File {
        let file = lock_file(&dir.join(".lock"), "t").unwrap();
        file.lock().unwrap();
        file
    }

    /// Changes waiting for the lock try it with pauses that grow (a dozen tries or so while
    /// it is held 150 ms, where a try every 5 ms made 30), and take it one at a time once
    /// it is released.
    #[test]
    fn waiting_changes_take_the_lock_in_turn_when_it_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let holder = hold(dir.path());
        let held = Arc::new(AtomicBool::new(false));
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (dir, held) = (dir.path().to_owned(), held.clone());
                std::thread::spawn(move || {
                    let lock = lock_blocking(&dir, "test", "t", &[]).unwrap();
                    assert!(!held.swap(true, Ordering::SeqCst), "the lock is held once");
                    std::thread::sleep(Duration::from_millis(5));
                    held.store(false, Ordering::SeqCst);
                    drop(lock);
                    TRIES.get()
                })
            })
            .collect();
        std::thread::sleep(LOCK_TIMEOUT / 2);
        drop(holder);
        for waiter in waiters {
            let tries = waiter.join().unwrap();
            assert!((2..=16).contains(&tries), "each waiter tried the lock {tries} times");
        }
    }

    /// Waits that give up on a holder that never lets go leave no thread behind: the
    /// process has as many threads after eight of them as before (nextest runs each test
    /// in a process of its own).
    #[test]
    fn waits_given_up_leave_no_thread_behind() {
        let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
        let dir = tempfile::tempdir().unwrap();
        let _holder = hold(dir.path());
        let before = threads();
        for _ in 0..8 {
            let e = lock_within(dir.path(), "test", "t", &[], Duration::from_millis(20));
            assert!(e.unwrap_err().to_string().contains("stayed locked"));
        }
        assert_eq!(threads(), before, "threads left by the waits given up");
    }

    /// A change that gave up waiting names the lock file, and leaves the lock free for the
    /// next change once its holder releases it.
    #[test]
    fn a_change_that_stops_waiting_leaves_the_lock_free() {
        let dir = tempfile::tempdir().unwrap();
        let holder = hold(dir.path());
        let e = lock_within(dir.path(), "test", "t", &[], Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        let at = dir.path().join(".lock");
        assert!(e.contains("stayed locked") && e.contains(&at.display().to_string()), "{e}");
        assert!(e.contains("for 50 ms"), "{e}");
        drop(holder);
        // Taken again and again: nothing of the wait given up holds it.
        for _ in 0..2 {
            drop(lock_blocking(dir.path(), "test", "t", &[]).unwrap());
        }
    }

    #[test]
    fn names_survive_the_file_system() {
        for name in ["lobby", "a.b_c-d", "acme corp/lobby", ".hidden", "..", "ünï/x"] {
            let file = encode(name);
            assert!(!file.contains('/') && !file.starts_with('.'), "{file}");
            assert_eq!(decode(&file).as_deref(), Some(name));
        }
    }

    #[test]
    fn new_folders_are_this_user_s_alone() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("a/b");
        make_dir(&made, "test").unwrap();
        for at in [dir.path().join("a"), made.clone()] {
            let mode = std::fs::metadata(&at).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", at.display());
        }
        make_dir(&made, "test").unwrap();
    }

    #[test]
    fn a_replaced_file_is_whole_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("a.json");
        write_json(&at, &serde_json::json!({"n": 1}), false, "t").unwrap();
        write_json(&at, &serde_json::json!({"n": 2}), true, "t").unwrap();
        let read: Option<serde_json::Value> = read_json(&at, "t", "test").unwrap();
        assert_eq!(read, Some(serde_json::json!({"n": 2})));
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["a.json"]);
        let missing: Option<serde_json::Value> =
            read_json(&dir.path().join("b"), "t", "x").unwrap();
        assert_eq!(missing, None);
    }
}
