//! A call's progress reports on their way to the client, coalesced: at most one every
//! [`PROGRESS_INTERVAL`], always the latest, rising, and the last one before the result.
//!
//! An upstream tool may report progress far faster than anyone reads it (100,000 reports in
//! one call took the call from 4 s to 9 s through `toolmux serve`, the client parsing and
//! handling every one). The first report of a call goes out at once; one that comes sooner
//! than [`PROGRESS_INTERVAL`] after the last one sent waits, replaced by any later one,
//! and goes out when the interval has passed, or just before the call's result
//! ([`ProgressGate::finish`]), never after it.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::Progress;

/// The least time between two progress notifications of one call: twenty a second is as
/// smooth as a progress bar needs, and cheap for any client to handle.
pub(crate) const PROGRESS_INTERVAL: Duration = Duration::from_millis(50);

/// Where one call's progress reports go (see the module's docs); clones share the gate.
/// The reports are [`Progress`] values for MCP clients, and whole events for the HTTP
/// API's `tool.progress` ([`super::ServedEvent`]).
pub(crate) struct ProgressGate<T = Progress>(Arc<Gate<T>>);

impl<T> Clone for ProgressGate<T> {
    fn clone(&self) -> Self {
        ProgressGate(self.0.clone())
    }
}

/// A progress report the gate can hold back: its progress, which must rise.
pub(crate) trait Report: Send + 'static {
    /// How far the call has come.
    fn progress(&self) -> f64;
}

impl Report for Progress {
    fn progress(&self) -> f64 {
        self.progress
    }
}

struct Gate<T> {
    state: Mutex<GateState<T>>,
    /// Sends a report to the client without waiting; called under the state's lock, so
    /// that a report sent by the timer cannot pass the last one, sent by `finish`.
    send: Box<dyn Fn(T) + Send + Sync>,
}

struct GateState<T> {
    /// The highest progress taken: MCP requires a request's progress to increase with
    /// every notification, so a report that does not is dropped.
    highest: f64,
    /// When the last report went out.
    sent_at: Option<Instant>,
    /// The latest report not yet sent.
    // Invariant: `Some` only while `timer` is set (a send is due).
    pending: Option<T>,
    /// A task sends `pending` when the interval has passed.
    timer: bool,
    /// The call has ended: nothing more goes out.
    finished: bool,
}

impl<T: Report> ProgressGate<T> {
    /// A gate sending through `send`, which must not wait.
    pub(crate) fn new(send: impl Fn(T) + Send + Sync + 'static) -> Self {
        let state = GateState {
            highest: f64::NEG_INFINITY,
            sent_at: None,
            pending: None,
            timer: false,
            finished: false,
        };
        ProgressGate(Arc::new(Gate { state: Mutex::new(state), send: Box::new(send) }))
    }

    /// Takes a report of the call: sent now when the interval since the last one has
    /// passed, else kept (in place of any kept before) to go out when it has.
    pub(crate) fn offer(&self, progress: T) {
        let gate = &self.0;
        let mut state = gate.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.finished || progress.progress() <= state.highest {
            return;
        }
        state.highest = progress.progress();
        let now = Instant::now();
        let due = state.sent_at.map(|at| at + PROGRESS_INTERVAL).filter(|due| now < *due);
        if state.timer {
            // A timer late on a busy runtime would let a later report replace one that is
            // already due (0, 50 and 100 reported 50 ms apart reaching the client as 0 and
            // 100): the kept one goes out now, and this one waits its turn.
            if due.is_none()
                && let Some(kept) = state.pending.take()
            {
                state.sent_at = Some(now);
                (gate.send)(kept);
            }
            state.pending = Some(progress);
            return;
        }
        let Some(due) = due else {
            state.sent_at = Some(now);
            (gate.send)(progress);
            return;
        };
        state.pending = Some(progress);
        gate.arm(&mut state, due);
    }

    /// The call has ended: the report kept, if any, goes out now, before the result, and
    /// later ones are dropped.
    pub(crate) fn finish(&self) {
        let gate = &self.0;
        let mut state = gate.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.finished {
            return;
        }
        state.finished = true;
        if let Some(progress) = state.pending.take() {
            (gate.send)(progress);
        }
    }
}

impl<T: Report> Gate<T> {
    /// Sends the kept report at `due`; outside a runtime, where no timer can be set, now.
    fn arm(self: &Arc<Self>, state: &mut GateState<T>, due: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            if let Some(progress) = state.pending.take() {
                state.sent_at = Some(Instant::now());
                (self.send)(progress);
            }
            return;
        };
        state.timer = true;
        // A weak reference: a call that ended without `finish` (dropped) sends nothing.
        let weak: Weak<Gate<T>> = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep_until(due).await;
            if let Some(gate) = weak.upgrade() {
                gate.fire();
            }
        });
    }

    /// The interval has passed: the kept report goes out, or, when one went out since the
    /// timer was set (see [`ProgressGate::offer`]), waits for the next turn.
    fn fire(self: &Arc<Self>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.timer = false;
        if state.finished || state.pending.is_none() {
            return;
        }
        let now = Instant::now();
        match state.sent_at.map(|at| at + PROGRESS_INTERVAL).filter(|due| now < *due) {
            Some(due) => self.arm(&mut state, due),
            None => {
                if let Some(progress) = state.pending.take() {
                    state.sent_at = Some(now);
                    (self.send)(progress);
                }
            }
        }
    }
}

impl<T> std::fmt::Debug for ProgressGate<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressGate")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recording() -> (ProgressGate, Arc<Mutex<Vec<f64>>>) {
        let sent: Arc<Mutex<Vec<f64>>> = Arc::default();
        let gate = ProgressGate::new({
            let sent = sent.clone();
            move |p: Progress| sent.lock().unwrap().push(p.progress)
        });
        (gate, sent)
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_sends_its_first_and_then_its_latest_report() {
        let (gate, sent) = recording();
        for i in 1..=1000 {
            gate.offer(Progress::new(f64::from(i), None));
        }
        assert_eq!(*sent.lock().unwrap(), [1.0]);
        tokio::time::sleep(PROGRESS_INTERVAL).await;
        tokio::task::yield_now().await;
        assert_eq!(*sent.lock().unwrap(), [1.0, 1000.0]);
        // Reports that do not rise are dropped; a later one waits out the interval.
        gate.offer(Progress::new(1000.0, None));
        gate.offer(Progress::new(1001.0, None));
        assert_eq!(*sent.lock().unwrap(), [1.0, 1000.0]);
        gate.finish();
        assert_eq!(*sent.lock().unwrap(), [1.0, 1000.0, 1001.0]);
        // Nothing goes out after the result, from the timer or a late report.
        gate.offer(Progress::new(2000.0, None));
        tokio::time::sleep(PROGRESS_INTERVAL * 2).await;
        assert_eq!(*sent.lock().unwrap(), [1.0, 1000.0, 1001.0]);
    }

    /// A timer that fires late (a busy runtime) loses no report that was due: 0, 50 and 100
    /// reported 50 ms apart all go out.
    #[test]
    fn a_late_timer_loses_no_report_that_was_due() {
        // A runtime that is not driven while the reports come: its timers fire late.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _entered = runtime.enter();
        let (gate, sent) = recording();
        gate.offer(Progress::new(0.0, None));
        std::thread::sleep(PROGRESS_INTERVAL / 2);
        gate.offer(Progress::new(50.0, None));
        std::thread::sleep(PROGRESS_INTERVAL * 2);
        gate.offer(Progress::new(100.0, None));
        gate.finish();
        assert_eq!(*sent.lock().unwrap(), [0.0, 50.0, 100.0]);
    }

    #[tokio::test(start_paused = true)]
    async fn progress_that_does_not_rise_is_dropped() {
        let (gate, sent) = recording();
        for progress in [0.0, 1.0, 1.0, 0.5, 2.0, -1.0, 3.5] {
            gate.offer(Progress::new(progress, None));
            tokio::time::sleep(PROGRESS_INTERVAL).await;
        }
        assert_eq!(*sent.lock().unwrap(), [0.0, 1.0, 2.0, 3.5]);
    }

    #[tokio::test(start_paused = true)]
    async fn reports_further_apart_than_the_interval_all_go_out_at_once() {
        let (gate, sent) = recording();
        for i in 1..=3 {
            gate.offer(Progress::new(f64::from(i), None));
            assert_eq!(sent.lock().unwrap().len(), i as usize);
            tokio::time::sleep(PROGRESS_INTERVAL).await;
        }
        gate.finish();
        assert_eq!(*sent.lock().unwrap(), [1.0, 2.0, 3.0]);
    }
}
