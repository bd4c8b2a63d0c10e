//! A spinner on stderr while providers start, only when stderr is a terminal.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// A running spinner; [`Spinner::finish`] clears its line.
#[derive(Debug)]
pub(crate) struct Spinner {
    task: Option<JoinHandle<()>>,
    /// Whether a frame was drawn, so that there is a line to clear.
    drawn: Arc<AtomicBool>,
}

/// How long a start may take before the spinner shows: a start that quick needs none, and
/// a frame drawn and cleared at once only leaves control codes in a recorded session.
const SHOWN_AFTER: Duration = Duration::from_millis(300);

impl Spinner {
    /// Starts a spinner saying `message`, or nothing when stderr is not a terminal.
    pub(crate) fn start(message: String) -> Spinner {
        let drawn = Arc::new(AtomicBool::new(false));
        if !std::io::stderr().is_terminal() {
            return Spinner { task: None, drawn };
        }
        let shown = drawn.clone();
        let task = tokio::spawn(async move {
            const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
            let started = Instant::now();
            tokio::time::sleep(SHOWN_AFTER).await;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for frame in FRAMES.iter().cycle() {
                tick.tick().await;
                shown.store(true, Ordering::SeqCst);
                let elapsed = started.elapsed().as_secs_f32();
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{frame} {message} {elapsed:.1}s");
                let _ = err.flush();
            }
        });
        Spinner { task: Some(task), drawn }
    }

    /// Stops the spinner and clears its line.
    pub(crate) fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
            if !self.drawn.load(Ordering::SeqCst) {
                return;
            }
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}
