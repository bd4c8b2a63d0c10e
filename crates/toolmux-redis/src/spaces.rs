//! Spaces shared by replicas: [`RedisSpaceStorage`], the blobs of
//! `toolmux_external::Spaces` in Redis. Under `{prefix}:s`:
//!
//! - `state`: the agents' state (goals, memories, plans, active spaces, read markers);
//! - `space:{name}`: one space, and the set `names` of the spaces stored;
//! - `lock`: the lock of every change (`SET NX` with a token and a lease, so that a
//!   replica that dies holding it stalls the others for the lease at most; released by a
//!   script only by its holder).

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

/// Releases the lock only for the token that took it.
static UNLOCK: Script = Script {
    name: "spaces-unlock",
    source: "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) \
             else return 0 end",
};

/// The spaces' blobs in Redis, shared by every replica of one server and prefix.
#[derive(Debug, Clone)]
pub struct RedisSpaceStorage {
    shared: Arc<BackendShared>,
    base: String,
    tokens: Arc<AtomicU64>,
    /// The subscription to `{prefix}:s:changed`, made at the first wait and kept.
    notices: Arc<tokio::sync::OnceCell<Subscription>>,
}

impl RedisSpaceStorage {
    pub(crate) fn new(shared: Arc<BackendShared>) -> RedisSpaceStorage {
        let base = format!("{}:s", shared.settings.prefix);
        RedisSpaceStorage { shared, base, tokens: Arc::default(), notices: Arc::default() }
    }

    fn key(&self, key: &str) -> String {
        format!("{}:{key}", self.base)
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
        let lease = LEASE.as_millis().to_string();
        let started = Instant::now();
        loop {
            let args = ["SET", key.as_str(), token.as_str(), "NX", "PX", lease.as_str()];
            let reply = self.shared.client.command(&args).await.map_err(unreachable)?;
            if !matches!(reply, Reply::Nil) {
                return Ok(token);
            }
            if started.elapsed() >= LOCK_WAIT {
                return Err(ToolError::Unavailable {
                    provider: PROVIDER.into(),
                    message: format!(
                        "the shared spaces stayed locked by another replica for {} s; try again",
                        LOCK_WAIT.as_secs()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn unlock(&self, token: &str) {
        let key = self.key("lock");
        let timeout = self.shared.settings.timeout;
        let released =
            self.shared.client.eval(&UNLOCK, &[&key], &[token.as_bytes()], timeout).await;
        if let Err(e) = released {
            // The lease ends it anyway.
            tracing::warn!(target: "toolmux::redis", "the spaces' lock was not released: {e}");
        }
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, ToolError> {
        let key = self.key(key);
        match self.shared.client.command(&["GET", key.as_str()]).await.map_err(unreachable)? {
            Reply::Bulk(bytes) => Ok(Some(bytes)),
            _ => Ok(None),
        }
    }

    async fn write(&self, key: &str, value: &[u8]) -> Result<(), ToolError> {
        let stored = self.key(key);
        let args: [&[u8]; 3] = [b"SET", stored.as_bytes(), value];
        self.shared.client.command(&args).await.map_err(unreachable)?;
        if let Some(name) = key.strip_prefix("space:") {
            let names = self.key("names");
            let args = ["SADD", names.as_str(), name];
            self.shared.client.command(&args).await.map_err(unreachable)?;
            // Waits of every replica look again now (a lost notice: at their next poll).
            let channel = self.key("changed");
            let args = ["PUBLISH", channel.as_str(), name];
            self.shared.client.command(&args).await.map_err(unreachable)?;
        }
        Ok(())
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
