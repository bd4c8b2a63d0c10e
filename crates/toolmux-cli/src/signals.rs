//! The signals that stop toolmux: SIGINT (Ctrl-C), SIGTERM (a supervisor, `kill`) and
//! SIGHUP (a closed terminal). One listener for the whole process, installed before anything
//! starts: a command that cleans up on its own waits for [`received`]; for the rest (a
//! command still starting its servers), `main` drops the work after a grace, which kills
//! every server's process group. Without it, SIGTERM and SIGHUP ended the process at once
//! and left the servers and their children running.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::watch;

static RECEIVED: OnceLock<watch::Sender<Option<i32>>> = OnceLock::new();

/// How many parts of the command are waiting for a signal to end their work themselves.
static HANDLING: AtomicUsize = AtomicUsize::new(0);

/// Whether a part of the command took a signal that came and is ending the command itself
/// ([`take`]): it may have dropped its [`Handling`] and be cleaning up (printing why it
/// stopped, reaping its servers, saving statistics), which `main` must not cut short.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// Held while the command ends its work itself on a signal ([`received`]): `main` then
/// gives it a grace instead of dropping the work at once.
pub(crate) struct Handling(());

impl Handling {
    pub(crate) fn start() -> Handling {
        HANDLING.fetch_add(1, Ordering::SeqCst);
        Handling(())
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        HANDLING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Says that the signal that came is being handled by the command, which ends itself from
/// now on, whether or not it still holds a [`Handling`].
pub(crate) fn take() {
    TAKEN.store(true, Ordering::SeqCst);
}

/// Whether any part of the command ends its work itself on a signal (or is already doing
/// so: [`take`]).
pub(crate) fn handled() -> bool {
    TAKEN.load(Ordering::SeqCst) || HANDLING.load(Ordering::SeqCst) > 0
}

/// Starts listening; call once, on the runtime, before anything else starts.
pub(crate) fn install() {
    let sender = RECEIVED.get_or_init(|| watch::channel(None).0);
    use tokio::signal::unix::{SignalKind, signal};
    for kind in [SignalKind::interrupt(), SignalKind::terminate(), SignalKind::hangup()] {
        let Ok(mut stream) = signal(kind) else { continue };
        let sender = sender.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                sender.send_if_modified(|got| {
                    let first = got.is_none();
                    got.get_or_insert(kind.as_raw_value());
                    first
                });
            }
        });
    }
}

/// Resolves once one of the signals came (at once if one already did); never without
/// [`install`].
pub(crate) async fn received() {
    let Some(sender) = RECEIVED.get() else { return std::future::pending().await };
    let mut receiver = sender.subscribe();
    let _ = receiver.wait_for(Option::is_some).await;
}

/// The exit code for the signal that came: 128 and its number (130 for Ctrl-C).
pub(crate) fn exit_code() -> Option<u8> {
    let signal = (*RECEIVED.get()?.borrow())?;
    u8::try_from(128 + signal).ok()
}
