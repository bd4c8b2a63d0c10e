//! [`RedisQueues`]: queues whose slots are leases in Redis, shared by every replica that
//! uses the same server and prefix.
//!
//! A queue is a sorted set `{prefix}:q:{name}` of leases: the member is a slot's id, the
//! score the time its lease ends (milliseconds of the server's clock, so that replicas'
//! clocks need not agree). Taking a slot is one script: drop the ended leases, add one if
//! fewer than the capacity remain. A held slot renews its lease every third of the lease
//! from a task of its own, so a replica that crashes or is cut off gives its slots back
//! when their leases end. Releasing removes the lease and publishes on
//! `{prefix}:q:{name}:free`, which wakes the waiters of every replica; waiters also poll,
//! so a lost message costs them one poll interval.
//!
//! Fairness: while a queue has room, a replica's callers take their slots side by side,
//! one script each, and the script alone decides who gets the last ones, so callers never
//! wait behind each other for a free slot. Once one of them has found the queue full, it
//! and every caller after it line up on a local fair lock, and only the first in line asks
//! Redis (at each release and poll): within one replica, waiters are served first come,
//! first served, a caller that comes while one waits does not take the slot it waits for
//! (only takes already on their way may, as callers that came at the same time), and a
//! release wakes one question per replica rather than one per waiter. Between replicas it
//! is best effort: when a slot frees, the first replica whose waiter asks gets it.

use crate::backend::BackendShared;
use crate::client::Script;
use crate::pubsub::Subscription;
use crate::resp::Reply;
use async_trait::async_trait;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use toolmux_orchestrator::QueueConfig;
use toolmux_orchestrator::queue::{Queue, QueueBackend, QueueSlot};

/// How often a waiter asks Redis even when no release was announced.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(250);

/// How stale the count behind [`Queue::in_use`] may get before it is refreshed.
const REFRESH_AFTER: Duration = Duration::from_secs(1);

/// `refreshed_ms` of a queue whose count was never read.
const NEVER: u64 = u64::MAX;

/// An attempt to take a slot gets at least this long, even when the caller's wait is
/// shorter or over: asking is not waiting for a slot, and a zero wait still asks once.
const MIN_ATTEMPT: Duration = Duration::from_millis(50);

/// Queues in Redis, for [`toolmux_orchestrator::Orchestrator`]'s builder
/// (`.queue_backend(Arc::new(backend.queues()))`).
#[derive(Debug, Clone)]
pub struct RedisQueues {
    backend: Arc<BackendShared>,
}

impl RedisQueues {
    pub(crate) fn new(backend: Arc<BackendShared>) -> RedisQueues {
        RedisQueues { backend }
    }
}

impl QueueBackend for RedisQueues {
    fn queue(&self, name: &str, config: &QueueConfig) -> Arc<dyn Queue> {
        let prefix = &self.backend.settings.prefix;
        let key = format!("{prefix}:q:{name}");
        Arc::new(RedisQueue {
            inner: Arc::new(QueueInner {
                name: Arc::from(name),
                channel: format!("{key}:free"),
                key,
                capacity: config.concurrent,
                backend: self.backend.clone(),
                next_slot: AtomicU64::new(1),
                count: AtomicUsize::new(0),
                born: Instant::now(),
                refreshed_ms: AtomicU64::new(NEVER),
                refreshing: AtomicBool::new(false),
                lined: AtomicUsize::new(0),
                turn: tokio::sync::Mutex::new(()),
                free: tokio::sync::OnceCell::new(),
            }),
        })
    }
}

struct RedisQueue {
    inner: Arc<QueueInner>,
}

struct QueueInner {
    name: Arc<str>,
    key: String,
    channel: String,
    capacity: usize,
    backend: Arc<BackendShared>,
    next_slot: AtomicU64,
    /// Leases in the sorted set at the last look (every take, renewal, release, refresh).
    count: AtomicUsize,
    born: Instant,
    /// When `count` was last read from Redis, in milliseconds since `born`; [`NEVER`]
    /// before the first time.
    refreshed_ms: AtomicU64,
    refreshing: AtomicBool,
    /// Callers of this replica in line (they found the queue full, or came after one that
    /// did and still waits); while any is, a newcomer lines up behind them instead of
    /// asking for a slot of its own.
    lined: AtomicUsize,
    /// Callers in line take turns here, first come, first served, so only the first asks
    /// Redis.
    turn: tokio::sync::Mutex<()>,
    /// The subscription to the free channel, made at the first wait and kept.
    free: tokio::sync::OnceCell<Subscription>,
}

impl fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisQueue")
            .field("key", &self.inner.key)
            .field("capacity", &self.inner.capacity)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Queue for RedisQueue {
    fn name(&self) -> &Arc<str> {
        &self.inner.name
    }

    async fn acquire(&self, wait: Duration) -> Option<QueueSlot> {
        let inner = &self.inner;
        let deadline = crate::config::deadline_after(wait);
        // The common case, a free slot and nobody of this replica waiting, costs one round
        // trip and no subscription, and runs beside the other callers' takes: the script
        // decides atomically, so the line below is only for a queue found full.
        if inner.lined.load(Ordering::Acquire) == 0 {
            if let Some(slot) = inner.take(deadline).await {
                return Some(slot);
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
        let _place = Place::join(inner);
        let _turn = tokio::time::timeout_at(deadline, inner.turn.lock()).await.ok()?;
        let left = deadline.saturating_duration_since(Instant::now());
        let confirm_within = inner.backend.client.timeout().min(left);
        let free = inner
            .free
            .get_or_init(|| inner.backend.pubsub.subscribe(&inner.channel, confirm_within))
            .await;
        let mut wake = free.waker();
        loop {
            // Marked before asking: a release announced after the question wakes us.
            wake.borrow_and_update();
            if let Some(slot) = inner.take(deadline).await {
                return Some(slot);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            crate::pubsub::wake_or_poll(&mut wake, POLL_EVERY, deadline).await;
        }
    }

    // No `try_acquire`: a slot is a lease that only a round trip to Redis makes, and
    // `try_acquire` may not wait for one; holding leases in reserve for it would take
    // slots that other replicas' callers wait for. The default (`None`) sends every call
    // to `acquire`, whose first step is that one round trip.

    fn is_full(&self) -> bool {
        self.in_use() >= self.inner.capacity
    }

    fn in_use(&self) -> usize {
        self.inner.refresh_if_stale();
        self.inner.count.load(Ordering::Relaxed)
    }

    fn capacity(&self) -> usize {
        self.inner.capacity
    }
}

impl QueueInner {
    fn note_count(&self, count: i64) {
        self.count.store(usize::try_from(count).unwrap_or(0), Ordering::Relaxed);
        self.refreshed_ms.store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Asks Redis for a slot once, within the time left (at least [`MIN_ATTEMPT`]); `None`
    /// when the queue is full or Redis did not answer.
    async fn take(self: &Arc<Self>, deadline: Instant) -> Option<QueueSlot> {
        let backend = &self.backend;
        let member =
            format!("{}:{}", backend.replica, self.next_slot.fetch_add(1, Ordering::Relaxed));
        let timeout = deadline
            .saturating_duration_since(Instant::now())
            .max(MIN_ATTEMPT)
            .min(backend.client.timeout());
        let capacity = self.capacity.to_string();
        let lease = backend.settings.lease.as_millis().to_string();
        let args = [member.as_bytes(), capacity.as_bytes(), lease.as_bytes()];
        // Until the answer is read, the lease may exist without anyone knowing: if this
        // future is dropped (its caller gave up) or the answer is lost, it is removed.
        let unanswered = Unanswered { queue: self.clone(), member: Some(member.clone()) };
        let reply = backend.client.eval(&ACQUIRE, &[&self.key], &args, timeout).await;
        match reply.as_ref().map(pair) {
            Ok(Some((1, count))) => {
                unanswered.answered();
                self.note_count(count);
                let renewal = tokio::spawn(renew(self.clone(), member.clone()));
                let lease = Lease { queue: self.clone(), member, renewal };
                Some(QueueSlot::from_guard(Box::new(lease)))
            }
            Ok(Some((_, count))) => {
                unanswered.answered();
                self.note_count(count);
                None
            }
            Ok(None) => {
                tracing::warn!(target: "toolmux::redis", queue = %self.name, "unexpected reply to the take script: {reply:?}");
                None
            }
            Err(e) => {
                // A timeout, or a connection that broke after the script was sent, may
                // have cut the answer of a script that ran: `unanswered` removes the
                // lease. Only a connection never made, or a refusal, says it did not run.
                if !e.may_have_run() {
                    unanswered.answered();
                }
                if !e.is_unreachable() {
                    tracing::warn!(target: "toolmux::redis", queue = %self.name, "cannot take a slot: {}", toolmux_core::error_report(e));
                }
                None
            }
        }
    }

    /// Removes the lease `member` and tells every replica's waiters.
    async fn release(&self, member: &str) {
        let backend = &self.backend;
        let args = [member.as_bytes(), self.channel.as_bytes()];
        let timeout = backend.client.timeout();
        match backend.client.eval(&RELEASE, &[&self.key], &args, timeout).await {
            Ok(reply) => {
                if let Some((_, count)) = pair(&reply) {
                    self.note_count(count);
                }
            }
            Err(e) => tracing::debug!(
                target: "toolmux::redis",
                queue = %self.name,
                "slot {member} not released ({}); it frees itself when its lease ends",
                toolmux_core::error_report(&e)
            ),
        }
    }

    /// Reads the count again in the background when it is older than [`REFRESH_AFTER`]
    /// and a runtime is at hand (the callers are synchronous).
    fn refresh_if_stale(self: &Arc<Self>) {
        let now = self.born.elapsed().as_millis() as u64;
        let refreshed = self.refreshed_ms.load(Ordering::Relaxed);
        if refreshed != NEVER && now.saturating_sub(refreshed) < REFRESH_AFTER.as_millis() as u64 {
            return;
        }
        let Ok(runtime) = Handle::try_current() else { return };
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let queue = self.clone();
        runtime.spawn(async move {
            let timeout = queue.backend.client.timeout();
            if let Ok(reply) = queue.backend.client.eval(&COUNT, &[&queue.key], &[], timeout).await
                && let Some(count) = reply.as_i64()
            {
                queue.note_count(count);
            }
            queue.refreshing.store(false, Ordering::Release);
        });
    }
}

/// A caller's place in its replica's line for a queue, counted in `lined` until dropped.
struct Place<'a> {
    queue: &'a QueueInner,
}

impl<'a> Place<'a> {
    fn join(queue: &'a QueueInner) -> Place<'a> {
        queue.lined.fetch_add(1, Ordering::AcqRel);
        Place { queue }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.queue.lined.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A held slot: renewed by its task until dropped, then released.
struct Lease {
    queue: Arc<QueueInner>,
    member: String,
    renewal: JoinHandle<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewal.abort();
        // A slot already counted as ours is free for the next taker of this replica at
        // once; Redis follows with the release below.
        let _ = self
            .queue
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        let Ok(runtime) = Handle::try_current() else {
            tracing::debug!(target: "toolmux::redis", queue = %self.queue.name, "slot dropped outside a runtime: it frees itself when its lease ends");
            return;
        };
        let queue = self.queue.clone();
        let member = std::mem::take(&mut self.member);
        runtime.spawn(async move { queue.release(&member).await });
    }
}

/// A take sent and not yet answered; dropped unanswered, it removes the lease it may have
/// made.
struct Unanswered {
    queue: Arc<QueueInner>,
    member: Option<String>,
}

impl Unanswered {
    fn answered(mut self) {
        self.member = None;
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let (Some(member), Ok(runtime)) = (self.member.take(), Handle::try_current()) else {
            return;
        };
        let queue = self.queue.clone();
        runtime.spawn(async move { queue.release(&member).await });
    }
}

/// Renews the lease `member` every third of the lease until aborted.
async fn renew(queue: Arc<QueueInner>, member: String) {
    let backend = &queue.backend;
    let every = backend.settings.lease / 3;
    let capacity = queue.capacity.to_string();
    let lease = backend.settings.lease.as_millis().to_string();
    let mut lost = false;
    loop {
        tokio::time::sleep(every).await;
        let args = [member.as_bytes(), capacity.as_bytes(), lease.as_bytes()];
        // A renewal may take up to a third of the lease (half of it waiting for a pooled
        // connection, half at the server): later, the next one is due.
        let timeout = backend.client.timeout().min(every / 2);
        let Ok(reply) = backend.client.eval(&RENEW, &[&queue.key], &args, timeout).await else {
            continue;
        };
        match pair(&reply) {
            Some((0, count)) => {
                queue.note_count(count);
                if !lost {
                    // The lease ended while Redis was out of reach and the slot went to
                    // someone else: the call runs on, one over the capacity, until done.
                    tracing::warn!(target: "toolmux::redis", queue = %queue.name, "slot {member} lost its lease and the queue is full; the call goes on over the capacity");
                    lost = true;
                }
            }
            Some((_, count)) => {
                queue.note_count(count);
                lost = false;
            }
            None => {}
        }
    }
}

/// `[flag, count]`, the answer of the queue scripts.
fn pair(reply: &Reply) -> Option<(i64, i64)> {
    match reply.as_array()? {
        [flag, count] => Some((flag.as_i64()?, count.as_i64()?)),
        _ => None,
    }
}

/// The server's clock in milliseconds, as `now`; shared by the scripts that need it.
/// `replicate_commands` lets a script write after reading the clock on Redis before 5
/// (later versions always replicate effects; it is a no-op there).
macro_rules! now_ms {
    () => {
        "if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"
    };
}

/// Makes the queue's key expire with its last lease (a replica of another `leaseMs` may
/// hold one longer than this one's), so that an abandoned queue leaves nothing behind.
/// Scores and `PEXPIREAT` are both milliseconds of the server's clock.
macro_rules! expire_with_last_lease {
    () => {
        "local function expire_with_last_lease()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]))) end
end
"
    };
}

/// KEYS: leases. ARGV: member, capacity, lease ms. Answers `[1, count]` when taken,
/// `[0, count]` when full.
static ACQUIRE: Script = Script {
    name: "queue_acquire",
    source: concat!(
        now_ms!(),
        expire_with_last_lease!(),
        "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[2]) then return {0, n} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
expire_with_last_lease()
return {1, n + 1}"
    ),
};

/// KEYS: leases. ARGV: member, capacity, lease ms. Extends the lease, or takes it again
/// when it ended and there is room: `[1, count]` renewed, `[2, count]` taken again,
/// `[0, count]` lost.
static RENEW: Script = Script {
    name: "queue_renew",
    source: concat!(
        now_ms!(),
        expire_with_last_lease!(),
        "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held and n >= tonumber(ARGV[2]) then return {0, n} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
expire_with_last_lease()
if held then return {1, n} end
return {2, n + 1}"
    ),
};

/// KEYS: leases. ARGV: member, free channel. Answers `[removed, count]`.
static RELEASE: Script = Script {
    name: "queue_release",
    source: "local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], '')
return {removed, redis.call('ZCARD', KEYS[1])}",
};

/// KEYS: leases. Answers the number of leases not yet ended.
static COUNT: Script = Script {
    name: "queue_count",
    source: concat!(now_ms!(), "return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')"),
};
