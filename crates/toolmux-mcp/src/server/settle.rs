//! List changes settled before they are announced: a burst of changes of a provider's
//! tools, prompts or resources (an upstream reconnecting, a reload adding tools one by
//! one) becomes one `list_changed` notification to a session, not one per change, each of
//! which made the client list again.

use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::ToolListChanges;

/// How long a list must stay unchanged before its change is announced: short enough that
/// a lone change reaches the client at once, long enough to take in a burst.
pub(crate) const QUIET: Duration = Duration::from_millis(75);

/// The longest a change waits for the list to stay quiet, so that a list changing all the
/// time is still announced at least this often.
pub(crate) const LONGEST: Duration = Duration::from_secs(1);

/// One session's view of a provider's changes of one list, settled.
#[derive(Debug)]
pub(crate) struct SettledChanges {
    changes: ToolListChanges,
    /// When the first and the latest change not yet announced came.
    pending: Option<(Instant, Instant)>,
    /// The provider is gone: no change will come after `pending`.
    gone: bool,
}

impl SettledChanges {
    pub(crate) fn new(changes: ToolListChanges) -> Self {
        SettledChanges { changes, pending: None, gone: false }
    }

    /// Waits until the list changed and then stayed unchanged for [`QUIET`] (or the first
    /// change is [`LONGEST`] old): `true` when that change is to be announced, `false` once
    /// the provider is gone and every change it made was announced.
    ///
    /// Cancel safe: what has come is kept here, not in the future, so a `select!` that
    /// drops this future for another branch loses no change.
    pub(crate) async fn next(&mut self) -> bool {
        loop {
            let Some((first, latest)) = self.pending else {
                if self.gone || !self.changes.changed().await {
                    self.gone = true;
                    return false;
                }
                let now = Instant::now();
                self.pending = Some((now, now));
                continue;
            };
            let due = (latest + QUIET).min(first + LONGEST);
            if self.gone {
                self.pending = None;
                return true;
            }
            tokio::select! {
                () = tokio::time::sleep_until(due) => {
                    self.pending = None;
                    return true;
                }
                changed = self.changes.changed() => {
                    if changed {
                        self.pending = Some((first, Instant::now()));
                    } else {
                        self.gone = true;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmux_core::ToolListNotifier;

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_one_change_and_a_stream_one_a_second() {
        let notifier = ToolListNotifier::new();
        let mut settled = SettledChanges::new(notifier.subscribe());
        let changing = |times: usize, every: u64| {
            let notifier = notifier.clone();
            tokio::spawn(async move {
                for _ in 0..times {
                    notifier.notify();
                    tokio::time::sleep(Duration::from_millis(every)).await;
                }
            })
        };
        let started = Instant::now();
        let burst = changing(10, 10);
        assert!(settled.next().await);
        // The last change came at 90 ms, and the list stayed quiet from then on.
        assert_eq!(started.elapsed(), Duration::from_millis(90) + QUIET);
        burst.await.expect("the burst ends");
        let started = Instant::now();
        let stream = changing(150, 20);
        assert!(settled.next().await);
        assert_eq!(started.elapsed(), LONGEST);
        stream.await.expect("the stream ends");
        drop(notifier);
        // The provider went with changes unannounced: they are announced, then the end.
        assert!(settled.next().await);
        assert!(!settled.next().await);
        assert!(!settled.next().await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_waiting_survives_a_dropped_wait() {
        let notifier = ToolListNotifier::new();
        let mut settled = SettledChanges::new(notifier.subscribe());
        notifier.notify();
        let cut = tokio::time::timeout(Duration::from_millis(10), settled.next()).await;
        assert!(cut.is_err(), "announced before the list was quiet");
        assert!(settled.next().await);
    }
}
