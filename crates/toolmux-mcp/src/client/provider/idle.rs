//! Stopping a server that has not been used for a while (`idleShutdownMs`), as MCPHub's
//! `idleTimeoutMs` does: a gateway fronting many servers need not keep every process
//! running, and the next call starts it again, as a lazy server's first call does.
//!
//! A watcher runs beside one connection and ends with it. A server is stopped only when no
//! call is under way, nothing used its connection for the whole interval, and no resource
//! subscription wants its updates; stopping it is not a failure (it counts toward no
//! `maxRestarts`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::Instant;

use super::Inner;
use crate::client::connection::Connection;

/// When the server was last used, and by how many calls now.
#[derive(Debug)]
pub(super) struct Idle {
    /// How long unused before it is stopped.
    pub(super) after: Duration,
    busy: AtomicUsize,
    last: Mutex<Instant>,
}

/// A call under way; dropping it (the call ended, or was cancelled) marks the server used.
pub(super) struct Busy<'a>(&'a Idle);

impl Idle {
    pub(super) fn new(after: Duration) -> Idle {
        Idle { after, busy: AtomicUsize::new(0), last: Mutex::new(Instant::now()) }
    }

    /// Marks the server used now.
    pub(super) fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// A call starts (its connection, asked for next, marks the server used).
    pub(super) fn enter(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self)
    }

    /// When the server may be stopped if nothing uses it meanwhile; `None` while a call
    /// is under way.
    fn deadline(&self) -> Option<Instant> {
        if self.busy.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(*self.last.lock().unwrap_or_else(|e| e.into_inner()) + self.after)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// While `connection` is the provider's, stops the server once it has been unused for
/// its interval. Holds the provider only between looks.
pub(super) fn spawn_watch(inner: Weak<Inner>, connection: Arc<Connection>) {
    let Some(strong) = inner.upgrade() else { return };
    let Some(after) = strong.idle.as_ref().map(|i| i.after) else { return };
    let shutdown = strong.shutdown.clone();
    drop(strong);
    tokio::spawn(async move {
        loop {
            let wake = {
                let Some(inner) = inner.upgrade() else { return };
                let Some(idle) = inner.idle.as_ref() else { return };
                idle.deadline().unwrap_or_else(|| Instant::now() + after)
            };
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = shutdown.cancelled() => return,
            }
            let Some(inner) = inner.upgrade() else { return };
            if !inner.is_current(&connection) || !connection.is_alive() {
                return;
            }
            let Some(idle) = inner.idle.as_ref() else { return };
            let due = idle.deadline().is_some_and(|at| at <= Instant::now());
            if due && inner.subscriptions().is_empty() {
                inner.close_idle(&connection, after).await;
                return;
            }
        }
    });
}

impl Inner {
    /// Stops the server of `connection`, unused for `after`, when calls still use it.
    async fn close_idle(&self, connection: &Arc<Connection>, after: Duration) {
        let Some(taken) = self.take_if_current(connection) else { return };
        tracing::info!(
            server = %self.name,
            "mcp server unused for {}: stopping it; the next call starts it again",
            spoken(after)
        );
        self.set_stopped_idle(after);
        taken.close().await;
        if self.config.lazy {
            // Its prompts and resources are listed again once it runs again.
            self.announce_catalog(&taken);
        }
    }
}

/// A duration as people say it: `300 ms`, `5 s`, `90 s`.
pub(super) fn spoken(duration: Duration) -> String {
    if duration < Duration::from_secs(1) || duration.subsec_millis() != 0 {
        format!("{} ms", duration.as_millis())
    } else {
        format!("{} s", duration.as_secs())
    }
}
