//! What the facade's unit tests share: FIFOs to refuse, and work that must end in time.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a read that should end at once may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// A new FIFO (named pipe) `name` in `dir`, which nothing writes to: opening it for reading
/// waits for ever unless the reader takes care not to.
pub(crate) fn fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    // mknodat rather than running mkfifo: tidy allows no process spawned here.
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

/// What `work` gives, run on a thread of its own, so that work that blocks (a read of a
/// FIFO) fails the test after 10 s, saying `what` did not end, instead of hanging it.
pub(crate) fn within_10s<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    // The test may have given up waiting.
    std::thread::spawn(move || tx.send(work()).ok());
    rx.recv_timeout(PATIENCE).unwrap_or_else(|_| panic!("{what} did not end within 10 s"))
}
