//! FIFOs to refuse, and work that must end in time: for tests of readers that must never
//! wait on what is put in a regular file's place.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long work that should end at once may take before [`within_10s`] fails the test.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A new FIFO (named pipe) `name` in `dir`, which nothing reads or writes: opening it
/// waits for ever unless the opener takes care not to.
pub fn fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    // mknodat rather than running mkfifo: tidy allows no process spawned in unit tests.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap_or_else(|e| panic!("cannot make the FIFO {}: {e}", path.display()));
    path
}

/// What `work` gives, run on a thread of its own, so that work that blocks (an open or a
/// read of a FIFO) fails the test after [`PATIENCE`], saying `what` did not end, instead
/// of hanging it.
pub fn within_10s<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    // The test may have given up waiting.
    std::thread::spawn(move || tx.send(work()).ok());
    rx.recv_timeout(PATIENCE).unwrap_or_else(|_| panic!("{what} did not end within 10 s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_made_and_its_open_refused_without_waiting() {
        let dir = std::env::temp_dir().join(format!("toolmux-test-support-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let path = fifo(&dir, "pipe");
        use std::os::unix::fs::FileTypeExt as _;
        assert!(std::fs::metadata(&path).expect("made").file_type().is_fifo());
        let opened = within_10s("opening the FIFO", move || {
            toolmux_core::regular::open_regular(&path, std::fs::OpenOptions::new().read(true))
                .map(drop)
        });
        assert!(
            matches!(opened, Err(toolmux_core::regular::RegularError::NotRegular(Some(_)))),
            "{opened:?}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn work_that_ends_gives_its_value() {
        assert_eq!(within_10s("the sum", || 2 + 3), 5);
    }
}
