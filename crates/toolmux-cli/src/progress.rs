//! A spinner on stderr while providers start, only when stderr is a terminal.

use std::io::{IsTerminal as _, Write as _};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// A running spinner; [`Spinner::finish`] clears its line.
#[derive(Debug)]
pub(crate) struct Spinner {
    task: Option<JoinHandle<()>>,
}

impl Spinner {
    /// Starts a spinner saying `message`, or nothing when stderr is not a terminal.
    pub(crate) fn start(message: String) -> Spinner {
        if !std::io::stderr().is_terminal() {
            return Spinner { task: None };
        }
        let task = tokio::spawn(async move {
            const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
            let started = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            for frame in FRAMES.iter().cycle() {
                tick.tick().await;
                let elapsed = started.elapsed().as_secs_f32();
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{frame} {message} {elapsed:.1}s");
                let _ = err.flush();
            }
        });
        Spinner { task: Some(task) }
    }

    /// Stops the spinner and clears its line.
    pub(crate) fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}
