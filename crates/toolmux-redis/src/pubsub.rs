//! One connection in `SUBSCRIBE` mode per backend, which wakes the tasks of this process
//! waiting for something another replica does: a queue slot freed, an external result
//! submitted, a call opened.
//!
//! A wake-up is only a hint to look again: every waiter also polls, so a message lost
//! while the connection was down (or a subscription not yet confirmed) delays it by at
//! most one poll interval, never forever.

use crate::client::{Connection, Health};
use crate::config::Endpoint;
use crate::resp::Reply;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How often the subscriber pings the server, to find a connection that died silently.
const PING_EVERY: Duration = Duration::from_secs(10);

/// The longest pause between two attempts to reconnect.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The subscriber of one backend. Its task starts with the first subscription and ends
/// when the last handle is dropped.
#[derive(Clone)]
pub(crate) struct PubSub {
    shared: Arc<Shared>,
}

struct Shared {
    endpoint: Endpoint,
    timeout: Duration,
    health: Arc<Health>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    /// Commands to the task; `None` until it first runs, closed when its runtime ended.
    commands: Option<mpsc::UnboundedSender<Command>>,
}

struct Channel {
    /// Counts the messages received, so a waiter that looked at the count before checking
    /// sees any message that came after.
    wake: watch::Sender<u64>,
    /// Whether the server confirmed the subscription on the current connection.
    confirmed: watch::Sender<bool>,
    // Invariant: the number of live `Subscription`s of this channel; at zero the channel
    // is removed and unsubscribed.
    refs: usize,
}

enum Command {
    Subscribe(String),
    Unsubscribe(String),
}

/// A subscription to one channel; unsubscribed when the last one of the channel drops.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    name: String,
    wake: watch::Receiver<u64>,
}

impl fmt::Debug for PubSub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSub").field("endpoint", &self.shared.endpoint).finish_non_exhaustive()
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").field("channel", &self.name).finish()
    }
}

impl PubSub {
    pub(crate) fn new(endpoint: Endpoint, timeout: Duration, health: Arc<Health>) -> PubSub {
        PubSub { shared: Arc::new(Shared { endpoint, timeout, health, state: Mutex::default() }) }
    }

    /// Subscribes to `channel` and waits, at most `confirm_within`, until the server
    /// confirms; past that the subscription still counts (polling covers the gap).
    pub(crate) async fn subscribe(&self, channel: &str, confirm_within: Duration) -> Subscription {
        let (wake, mut confirmed) = {
            let mut state = self.shared.lock();
            let fresh = !state.channels.contains_key(channel);
            let entry = state.channels.entry(channel.to_owned()).or_insert_with(|| Channel {
                wake: watch::channel(0).0,
                confirmed: watch::channel(false).0,
                refs: 0,
            });
            entry.refs += 1;
            let receivers = (entry.wake.subscribe(), entry.confirmed.subscribe());
            let commands = self.shared.ensure_task(&mut state);
            if fresh {
                // A task started just now subscribes to every channel anyway; a duplicate
                // SUBSCRIBE only brings a second confirmation.
                let _ = commands.send(Command::Subscribe(channel.to_owned()));
            }
            receivers
        };
        let _ = tokio::time::timeout(confirm_within, confirmed.wait_for(|c| *c)).await;
        Subscription { shared: self.shared.clone(), name: channel.to_owned(), wake }
    }
}

impl Subscription {
    /// A receiver that changes with every message on the channel (and at every reconnect).
    pub(crate) fn waker(&self) -> watch::Receiver<u64> {
        self.wake.clone()
    }
}

/// Waits until `wake` is woken by a message, `poll_every` has passed (a message may be lost
/// while the subscriber reconnects), or `deadline`, whichever comes first.
pub(crate) async fn wake_or_poll(
    wake: &mut watch::Receiver<u64>,
    poll_every: Duration,
    deadline: Instant,
) {
    let poll = (Instant::now() + poll_every).min(deadline);
    tokio::select! {
        changed = wake.changed() => {
            if changed.is_err() {
                // The channel went away (cannot happen while the subscription lives); poll.
                tokio::time::sleep_until(poll).await;
            }
        }
        () = tokio::time::sleep_until(poll) => {}
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let Some(channel) = state.channels.get_mut(&self.name) else { return };
        channel.refs -= 1;
        if channel.refs == 0 {
            state.channels.remove(&self.name);
            if let Some(commands) = &state.commands {
                let _ = commands.send(Command::Unsubscribe(std::mem::take(&mut self.name)));
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task's command sender, starting the task on the current runtime when it is not
    /// running (first use, or its runtime ended).
    fn ensure_task(self: &Arc<Self>, state: &mut State) -> mpsc::UnboundedSender<Command> {
        if let Some(commands) = state.commands.as_ref().filter(|c| !c.is_closed()) {
            return commands.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(Arc::downgrade(self), rx));
        state.commands = Some(tx.clone());
        tx
    }

    fn dispatch(&self, frame: Reply) {
        let Some([kind, channel, ..]) = frame.as_array() else { return };
        let (Some(kind), Some(channel)) = (kind.as_str(), channel.as_str()) else { return };
        let state = self.lock();
        let Some(entry) = state.channels.get(channel) else { return };
        match kind {
            "message" => entry.wake.send_modify(|n| *n = n.wrapping_add(1)),
            "subscribe" => {
                entry.confirmed.send_replace(true);
            }
            _ => {}
        }
    }

    /// The connection is gone: nothing is confirmed, and every waiter looks again (a
    /// message may have been lost).
    fn disconnected(&self) {
        let state = self.lock();
        for entry in state.channels.values() {
            entry.confirmed.send_replace(false);
            entry.wake.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// The subscriber task: connects, subscribes to every channel wanted, relays messages,
/// reconnects with backoff; returns when every handle is gone.
async fn run(shared: Weak<Shared>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(s) = shared.upgrade() else { return };
        let (endpoint, timeout, health) = (s.endpoint.clone(), s.timeout, s.health.clone());
        drop(s);
        let opened = match tokio::time::timeout(timeout, Connection::open(&endpoint)).await {
            Ok(opened) => opened,
            Err(_) => Err(crate::RedisError::Timeout {
                addr: endpoint.addr(),
                command: "SUBSCRIBE".into(),
                timeout_ms: timeout.as_millis() as u64,
            }),
        };
        health.observe(&opened);
        let mut conn = match opened {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(target: "toolmux::redis", "subscriber: {}", toolmux_core::error_report(&e));
                // Wait before trying again, but end at once when the last handle goes.
                let pause = tokio::time::sleep(backoff);
                tokio::pin!(pause);
                loop {
                    tokio::select! {
                        () = &mut pause => break,
                        command = commands.recv() => if command.is_none() { return },
                    }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        if serve(&shared, &mut conn, &mut commands, timeout).await.is_none() {
            return;
        }
        let Some(s) = shared.upgrade() else { return };
        s.disconnected();
    }
}

/// Serves one connection until it fails (`Some`) or the last handle is gone (`None`).
async fn serve(
    shared: &Weak<Shared>,
    conn: &mut Connection,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    timeout: Duration,
) -> Option<()> {
    let wanted: Vec<String> = {
        let s = shared.upgrade()?;
        s.lock().channels.keys().cloned().collect()
    };
    if !wanted.is_empty() {
        let mut subscribe = vec!["SUBSCRIBE".to_owned()];
        subscribe.extend(wanted);
        if write(conn, &subscribe, timeout).await.is_err() {
            return Some(());
        }
    }
    let mut ping = tokio::time::interval_at(Instant::now() + PING_EVERY, PING_EVERY);
    let mut last_frame = Instant::now();
    loop {
        tokio::select! {
            command = commands.recv() => {
                let args = match command? {
                    Command::Subscribe(channel) => ["SUBSCRIBE".to_owned(), channel],
                    Command::Unsubscribe(channel) => ["UNSUBSCRIBE".to_owned(), channel],
                };
                if write(conn, &args, timeout).await.is_err() {
                    return Some(());
                }
            }
            frame = conn.read_reply() => {
                let Ok(frame) = frame else { return Some(()) };
                last_frame = Instant::now();
                if let Reply::Error(message) = &frame {
                    tracing::warn!(target: "toolmux::redis", "subscriber: redis refused: {message}");
                    return Some(());
                }
                shared.upgrade()?.dispatch(frame);
            }
            _ = ping.tick() => {
                // Two pings unanswered: the connection is dead without having said so.
                if last_frame.elapsed() > PING_EVERY * 2 {
                    return Some(());
                }
                if write(conn, &["PING"], timeout).await.is_err() {
                    return Some(());
                }
            }
        }
    }
}

async fn write<A: AsRef<[u8]>>(
    conn: &mut Connection,
    args: &[A],
    timeout: Duration,
) -> Result<(), ()> {
    match tokio::time::timeout(timeout, conn.send(args)).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}
