//! The lead of a cached call among the replicas sharing one Redis
//! ([`ResponseCache::lead`](toolmux_orchestrator::cache::ResponseCache::lead)), so that
//! identical concurrent calls of several replicas run once.
//!
//! The lead of cache key `key` is the string key `{prefix}:lead:{hash}` (the cache's
//! 128-bit hash of `key`), holding the leader's random token with a lease:
//!
//! - taking it is `SET NX PX lease`; the leader's task renews the lease every third of it
//!   while the call runs (taking the lead again if it ended and nobody took it), so a
//!   replica that dies stops renewing and its lead ends with the lease;
//! - giving it up (the guard dropped, after the output is stored) is a script, run from a
//!   task, that deletes the key only while this token holds it and then publishes on the
//!   channel `{prefix}:lead:{hash}:released`;
//! - a follower subscribes to that channel before it looks at the key, so a release after
//!   the look wakes it; it also looks again when the key's lease would end, and every
//!   [`FOLLOW_POLL`] in case a message was lost, and is done once the key is gone.
//!
//! Redis is never waited for at a call's expense: a Redis that does not answer (down, too
//! slow, its pool busy) gives [`Lead::Alone`], each replica coalescing its own calls as
//! without Redis, and a follower that cannot look any more stops following.

use crate::backend::BackendShared;
use crate::client::Script;
use crate::resp::Reply;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use toolmux_orchestrator::cache::Lead;

/// How long a replica's lead of a call lasts after it stops renewing it, by default
/// ([`RedisCache::with_lead_lease`](crate::RedisCache::with_lead_lease)).
pub const DEFAULT_LEAD_LEASE: Duration = Duration::from_secs(10);

/// The shortest lead lease (renewed every third of it).
pub(crate) const MIN_LEAD_LEASE: Duration = Duration::from_millis(100);

/// How often a follower looks at the lead when no release was announced: only a message
/// lost with a subscription not yet confirmed needs it (a reconnecting subscriber wakes
/// every follower), so it is slow.
const FOLLOW_POLL: Duration = Duration::from_secs(2);

/// Takes the lead of `key` for `lease`, or says who has it.
pub(super) async fn lead(backend: &Arc<BackendShared>, key: &str, lease: Duration) -> Lead {
    if backend.client.skip_optional() {
        return Lead::Alone;
    }
    let lease_ms = lease.as_millis().to_string();
    // Until the answer is read, the lead may be ours without our knowing: dropped
    // unanswered (the caller gave up) or with its answer lost, the guard gives it back.
    let mut guard = LeadGuard {
        backend: backend.clone(),
        key: format!("{}:lead:{}", backend.settings.prefix, super::hashed(key)),
        token: toolmux_core::unique_token(),
        renewal: None,
        maybe_held: true,
    };
    let args = ["SET", guard.key.as_str(), guard.token.as_str(), "NX", "PX", lease_ms.as_str()];
    match backend.client.command(&args).await {
        Ok(Reply::Simple(ok)) if ok == "OK" => {
            let renewal =
                tokio::spawn(renew(backend.clone(), guard.key.clone(), guard.token.clone(), lease));
            guard.renewal = Some(renewal);
            Lead::Leading(Box::new(guard))
        }
        Ok(Reply::Nil) => {
            guard.maybe_held = false;
            Lead::Follow(Box::pin(follow(backend.clone(), std::mem::take(&mut guard.key), lease)))
        }
        Ok(other) => {
            tracing::debug!(target: "toolmux::redis", "unexpected reply to the lead's SET: {other:?}; the call runs here");
            Lead::Alone
        }
        Err(e) => {
            // A connection never made, a busy pool or a refusal: nothing was set.
            guard.maybe_held = e.may_have_run();
            if !e.is_unreachable() {
                tracing::debug!(target: "toolmux::redis", "no lead of {} across replicas: {}", guard.key, toolmux_core::error_report(&e));
            }
            Lead::Alone
        }
    }
}

/// The lead of one key taken by this replica: renewed by its task until dropped, then
/// given up from a task.
struct LeadGuard {
    backend: Arc<BackendShared>,
    key: String,
    token: String,
    renewal: Option<JoinHandle<()>>,
    // Invariant: false only when the key is known not to hold `token` (the SET did not
    // set it); a drop while true gives the lead up.
    maybe_held: bool,
}

impl Drop for LeadGuard {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if !self.maybe_held {
            return;
        }
        let Ok(runtime) = Handle::try_current() else {
            tracing::debug!(target: "toolmux::redis", "the lead of {} dropped outside a runtime: it ends with its lease", self.key);
            return;
        };
        let backend = self.backend.clone();
        let (key, token) = (std::mem::take(&mut self.key), std::mem::take(&mut self.token));
        runtime.spawn(async move { release(&backend, &key, &token).await });
    }
}

/// The channel on which the lead `key` is announced given up.
fn released_channel(key: &str) -> String {
    format!("{key}:released")
}

/// Gives the lead `key` up if `token` still holds it, and tells the followers.
async fn release(backend: &BackendShared, key: &str, token: &str) {
    let channel = released_channel(key);
    let args = [token.as_bytes(), channel.as_bytes()];
    let timeout = backend.client.timeout();
    if let Err(e) = backend.client.eval(&RELEASE, &[key], &args, timeout).await {
        tracing::debug!(target: "toolmux::redis", "the lead of {key} was not given up ({}); it ends with its lease", toolmux_core::error_report(&e));
    }
}

/// Renews the lead `key` of `token` every third of `lease` until aborted.
async fn renew(backend: Arc<BackendShared>, key: String, token: String, lease: Duration) {
    let every = lease / 3;
    let lease_ms = lease.as_millis().to_string();
    loop {
        tokio::time::sleep(every).await;
        // Later than half the period, the next renewal is due.
        let timeout = backend.client.timeout().min(every / 2);
        let args = [token.as_bytes(), lease_ms.as_bytes()];
        // Renewed (1), taken again (2), or not answered (the next one may be): go on.
        let reply = backend.client.eval(&RENEW, &[&key], &args, timeout).await;
        if let Ok(Reply::Integer(0)) = reply {
            // Redis was out of reach longer than the lease and another replica took the
            // lead: both run the call, the later output replacing the first.
            tracing::debug!(target: "toolmux::redis", "the lead of {key} went to another replica while its call ran");
            return;
        }
    }
}

/// Follows the lead `key` until it is given up or its lease ends, or Redis stops
/// answering.
async fn follow(backend: Arc<BackendShared>, key: String, lease: Duration) {
    let subscription =
        backend.pubsub.subscribe(&released_channel(&key), backend.client.timeout()).await;
    let mut wake = subscription.waker();
    let lease_ms = lease.as_millis().to_string();
    loop {
        // Marked before looking: a release announced after the look wakes us.
        wake.borrow_and_update();
        let timeout = backend.client.timeout();
        let reply = backend.client.eval(&LEFT, &[&key], &[lease_ms.as_bytes()], timeout).await;
        let left = match reply {
            Ok(Reply::Integer(ms)) if ms >= 0 => ms.unsigned_abs(),
            // Given up or ended (-2); or Redis does not answer, and the orchestrator, which
            // reads the cache and asks for the lead again, runs the call itself.
            _ => return,
        };
        // A millisecond past the lease, the key is gone unless it was renewed.
        let lease_end = crate::config::deadline_after(Duration::from_millis(left + 1));
        crate::pubsub::wake_or_poll(&mut wake, FOLLOW_POLL, lease_end).await;
    }
}

/// Deletes the lead if the token holds it, and announces it. KEYS: the lead. ARGV: the
/// token, the channel. Answers 1 when given up, 0 when another holds it (or none).
static RELEASE: Script = Script {
    name: "cache_lead_release",
    source: "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return 1",
};

/// Extends the lead's lease if the token holds it, or takes it again when it ended and
/// nobody took it. KEYS: the lead. ARGV: the token, the lease in milliseconds. Answers 1
/// renewed, 2 taken again, 0 held by another.
static RENEW: Script = Script {
    name: "cache_lead_renew",
    source: "local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2",
};

/// The milliseconds left of the lead's lease, -2 when there is no lead. A lead without an
/// expiry (not made by toolmux) is given the lease, so no follower waits for it for ever.
/// KEYS: the lead. ARGV: the lease in milliseconds.
static LEFT: Script = Script {
    name: "cache_lead_left",
    source: "local left = redis.call('PTTL', KEYS[1])
if left == -1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return tonumber(ARGV[1])
end
return left",
};
