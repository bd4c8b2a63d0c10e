//! Spaces shared by replicas: [`RedisSpaceStorage`], the blobs of
//! `toolmux_external::Spaces` in Redis. Under `{prefix}:s`:
//!
//! - `state`: the agents' state (goals, memories, plans, active spaces, read markers);
//! - `space:{name}`: one space, and the set `names` of the spaces stored;
//! - `lock`: the lock of every change (`SET NX` with a token and a lease, so that a
//!   replica that dies holding it stalls the others for the lease at most; released by a
//!   script only by its holder, which announces the release on the channel `unlocked`:
//!   waiters of every replica ask again at once, and otherwise ever less often, from
//!   10 ms to 200 ms apart). Every read and the commit of a change are fenced by the
//!   token the change was given: a script checks that the lock is still the change's
//!   before it reads or writes, and renews its lease, so a change that outlived its lease
//!   (a stalled process, a slow server) and whose lock another change took fails saying
//!   so, retryable, instead of overwriting that change's blobs. A change's blobs are all
//!   written by one script, so a change is written whole or not at all.

use crate::backend::BackendShared;
use crate::client::Script;
use crate::pubsub::Subscription;
use crate::resp::Reply;
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::ToolError;
use toolmux_external::spaces::SpaceStorage;

/// The provider named in errors.
const PROVIDER: &str = "gateway";

/// How long a change may hold the lock before another replica may take it.
const LEASE: Duration = Duration::from_secs(10);

/// How long a change waits for the lock.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// The first pause between two attempts to take a held lock; it doubles up to
/// [`MAX_LOCK_POLL`]. A release wakes the waiters at once, so the polls only find a lock
/// whose holder died (its lease ended) or whose release message was lost.
const FIRST_LOCK_POLL: Duration = Duration::from_millis(10);

/// The longest pause between two attempts to take a held lock.
const MAX_LOCK_POLL: Duration = Duration::from_millis(200);

/// Reads a blob if the lock is still the change's, renewing its lease; `false` (0) when
/// it is not, else the blob (nil when there is none) in a one-item array.
/// KEYS: the lock, the blob. ARGV: the token, the lease in milliseconds.
static FENCED_READ: Script = Script {
    name: "spaces-fenced-read",
    source: "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {redis.call('GET', KEYS[2])}",
};

/// Replaces a change's blobs, all of them, if the lock is still the change's (else none:
/// 0), renewing its lease; each space's name is added to the set of names and announced.
/// KEYS: the lock, the set of names, then each blob. ARGV: the token, the lease in
/// milliseconds, the channel of changes, then for each blob its value and its space's
/// name (empty for the state).
static FENCED_COMMIT: Script = Script {
    name: "spaces-fenced-commit",
    source: "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
for i = 3, #KEYS do
  local value, name = ARGV[2 * i - 2], ARGV[2 * i - 1]
  redis.call('SET', KEYS[i], value)
  if name ~= '' then
    redis.call('SADD', KEYS[2], name)
    redis.call('PUBLISH', ARGV[3], name)
  end
end
return 1",
};

/// Releases the lock only for the token that took it, and tells the waiters.
/// KEYS: the lock. ARGV: the token, the channel of releases.
static UNLOCK: Script = Script {
    name: "spaces-unlock",
    source: "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return 1",
};

/// The spaces' blobs in Redis, shared by every replica of one server and prefix.
#[derive(Debug, Clone)]
pub struct RedisSpaceStorage {
    shared: Arc<BackendShared>,
    base: String,
    tokens: Arc<AtomicU64>,
    /// How long the lock lasts after the change's last read or write ([`LEASE`]).
    lease: Duration,
    /// The subscription to `{prefix}:s:changed`, made at the first wait and kept.
    notices: Arc<tokio::sync::OnceCell<Subscription>>,
    /// The subscription to `{prefix}:s:unlocked`, made at the first wait for the lock.
    unlocks: Arc<tokio::sync::OnceCell<Subscription>>,
}

impl RedisSpaceStorage {
    pub(crate) fn new(shared: Arc<BackendShared>) -> RedisSpaceStorage {
        let base = format!("{}:s", shared.settings.prefix);
        RedisSpaceStorage {
            shared,
            base,
            tokens: Arc::default(),
            lease: LEASE,
            notices: Arc::default(),
            unlocks: Arc::default(),
        }
    }

    /// Sets how long the lock lasts after a change's last read or write (10 s by
    /// default): a change that goes longer without one may lose the lock to another,
    /// and then fails instead of writing.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> RedisSpaceStorage {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    fn key(&self, key: &str) -> String {
        format!("{}:{key}", self.base)
    }

    fn lease_ms(&self) -> String {
        self.lease.as_millis().to_string()
    }
}

/// The error of a change whose lock another change took after its lease ended.
fn lock_lost(lease: Duration) -> ToolError {
    ToolError::Unavailable {
        provider: PROVIDER.into(),
        message: format!(
            "this change to the shared spaces went {} ms without reaching redis and lost \
             their lock to another change, so it stopped before overwriting that one's; \
             try again",
            lease.as_millis()
        ),
    }
}

impl RedisSpaceStorage {
    /// Releases the lock if `token` holds it, telling the waiters of every replica.
    async fn release(&self, token: &str) -> Result<(), crate::RedisError> {
        let key = self.key("lock");
        let channel = self.key("unlocked");
        let timeout = self.shared.settings.timeout;
        let args = [token.as_bytes(), channel.as_bytes()];
        self.shared.client.eval(&UNLOCK, &[&key], &args, timeout).await.map(|_| ())
    }

    /// Releases the lock `token` may hold from a task of its own, trying again while Redis
    /// does not answer until the lease would have ended anyway.
    fn unlock_in_background(&self, token: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let storage = self.clone();
        let until = Instant::now() + self.lease;
        runtime.spawn(async move {
            while storage.release(&token).await.is_err() && Instant::now() < until {
                tokio::time::sleep(MAX_LOCK_POLL).await;
            }
        });
    }
}

fn unreachable(e: crate::RedisError) -> ToolError {
    ToolError::transport(PROVIDER, "the shared store of spaces did not answer", e)
}

#[async_trait]
impl SpaceStorage for RedisSpaceStorage {
    async fn lock(&self) -> Result<String, ToolError> {
        let token =
            format!("{}-{}", self.shared.replica, self.tokens.fetch_add(1, Ordering::Relaxed));
        let key = self.key("lock");
        let lease = self.lease_ms();
        let deadline = Instant::now() + LOCK_WAIT;
        let mut wake: Option<tokio::sync::watch::Receiver<u64>> = None;
        let mut pause = FIRST_LOCK_POLL;
        loop {
            // Marked before asking: a release announced after the question wakes us.
            if let Some(wake) = wake.as_mut() {
                wake.borrow_and_update();
            }
            let args = ["SET", key.as_str(), token.as_str(), "NX", "PX", lease.as_str()];
            let reply = match self.shared.client.command(&args).await {
                Ok(reply) => reply,
                Err(e) => {
                    if e.may_have_run() {
                        // The lock may be ours without our knowing: give it back, or every
                        // replica's changes wait for its lease.
                        self.unlock_in_background(token);
                    }
                    return Err(unreachable(e));
                }
            };
            if !matches!(reply, Reply::Nil) {
                return Ok(token);
            }
            if Instant::now() >= deadline {
                return Err(ToolError::Unavailable {
                    provider: PROVIDER.into(),
                    message: format!(
                        "the shared spaces stayed locked by another replica for {} s; try again",
                        LOCK_WAIT.as_secs()
                    ),
                });
            }
            match wake.as_mut() {
                None => {
                    // The first wait subscribes, and then asks again: a release during the
                    // subscription was not heard.
                    let channel = self.key("unlocked");
                    let confirm_within = self.shared.settings.timeout;
                    let unlocks = self
                        .unlocks
                        .get_or_init(|| self.shared.pubsub.subscribe(&channel, confirm_within))
                        .await;
                    wake = Some(unlocks.waker());
                }
                Some(wake) => {
                    crate::pubsub::wake_or_poll(wake, pause, deadline).await;
                    pause = (pause * 2).min(MAX_LOCK_POLL);
                }
            }
        }
    }

    async fn unlock(&self, token: &str) {
        if let Err(e) = self.release(token).await {
            // The lease ends it anyway.
            tracing::warn!(target: "toolmux::redis", "the spaces' lock was not released: {e}");
        }
    }

    async fn read(&self, token: &str, key: &str) -> Result<Option<Vec<u8>>, ToolError> {
        let (lock, stored, lease) = (self.key("lock"), self.key(key), self.lease_ms());
        let timeout = self.shared.settings.timeout;
        let args = [token.as_bytes(), lease.as_bytes()];
        let reply = self
            .shared
            .client
            .eval(&FENCED_READ, &[&lock, &stored], &args, timeout)
            .await
            .map_err(unreachable)?;
        match reply {
            Reply::Array(mut items) => match items.pop() {
                Some(Reply::Bulk(bytes)) => Ok(Some(bytes)),
                _ => Ok(None),
            },
            _ => Err(lock_lost(self.lease)),
        }
    }

    async fn commit(&self, token: &str, writes: &[(String, Vec<u8>)]) -> Result<(), ToolError> {
        let (lock, names, channel) = (self.key("lock"), self.key("names"), self.key("changed"));
        let stored: Vec<String> = writes.iter().map(|(key, _)| self.key(key)).collect();
        let mut keys: Vec<&str> = vec![&lock, &names];
        keys.extend(stored.iter().map(String::as_str));
        let lease = self.lease_ms();
        let mut args: Vec<&[u8]> = vec![token.as_bytes(), lease.as_bytes(), channel.as_bytes()];
        for (key, value) in writes {
            // Waits of every replica look again once a space is written (a lost notice: at
            // their next poll); the state is no space and is not announced.
            let name = key.strip_prefix("space:").unwrap_or_default();
            args.extend([value.as_slice(), name.as_bytes()]);
        }
        let timeout = self.shared.settings.timeout;
        let reply = self
            .shared
            .client
            .eval(&FENCED_COMMIT, &keys, &args, timeout)
            .await
            .map_err(unreachable)?;
        match reply {
            Reply::Integer(1) => Ok(()),
            _ => Err(lock_lost(self.lease)),
        }
    }

    async fn change_notices(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        let channel = self.key("changed");
        let confirm_within = self.shared.settings.timeout;
        let subscription = self
            .notices
            .get_or_init(|| self.shared.pubsub.subscribe(&channel, confirm_within))
            .await;
        Some(subscription.waker())
    }

    async fn space_names(&self) -> Result<Vec<String>, ToolError> {
        let names = self.key("names");
        let reply =
            self.shared.client.command(&["SMEMBERS", names.as_str()]).await.map_err(unreachable)?;
        let mut names: Vec<String> = reply
            .as_array()
            .map(|items| items.iter().filter_map(|r| r.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        names.sort();
        Ok(names)
    }
}
