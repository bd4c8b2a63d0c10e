//! [`RedisCache`]: the response cache in Redis, one string key per cached output with the
//! TTL as its expiry.
//!
//! Keys are `{prefix}:c:{tool}:{hash}`: the tool keeps them readable (and deletable per
//! tool), the 128-bit hash of the whole cache key keeps them short. The value carries the
//! whole cache key too and a hit is served only when it matches, so a hash collision costs
//! a miss, never another call's output.
//!
//! The cache also gives the lead of a call among the replicas ([`ResponseCache::lead`]:
//! a key `{prefix}:lead:{hash}` with a lease, see `cache/lead.rs`), so that identical
//! concurrent calls of several replicas run once.

use crate::backend::BackendShared;
use crate::resp::Reply;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::ToolOutput;
use toolmux_orchestrator::cache::{Lead, ResponseCache};

mod lead;

pub use lead::DEFAULT_LEAD_LEASE;
pub(crate) use lead::MIN_LEAD_LEASE;

/// Values larger than this (serialized) are not cached: one huge output would otherwise
/// cost every replica that reads it the same megabytes again.
pub const MAX_VALUE_BYTES: usize = 8 * 1024 * 1024;

/// The response cache in Redis, for [`toolmux_orchestrator::Orchestrator`]'s builder
/// (`.cache(Arc::new(backend.cache()))`). A Redis that does not answer is a miss, and a
/// put that fails is dropped: the cache never fails a call. While Redis is down, the cache
/// asks it once a second and misses at once otherwise, so that a hung server does not add
/// its timeout to every cacheable call.
///
/// Identical concurrent calls of all replicas run once: the cache gives the lead of a call
/// ([`ResponseCache::lead`]) to one replica while it runs the call (a lease of
/// `leadLeaseMs`, [`DEFAULT_LEAD_LEASE`] by default, renewed meanwhile), and the other replicas' callers wait, within
/// their own deadlines, for its output; a leader that gives up without one hands over at
/// once, one that died when its lease ends. A Redis that does not answer gives no lead:
/// each replica then runs its own calls.
#[derive(Debug, Clone)]
pub struct RedisCache {
    backend: Arc<BackendShared>,
    max_value_bytes: usize,
    /// How long a replica's lead of a call lasts after it stops renewing it.
    lead_lease: Duration,
}

#[derive(Serialize, Deserialize)]
struct Entry<'a> {
    /// The whole cache key, checked on a hit.
    key: Cow<'a, str>,
    output: Cow<'a, ToolOutput>,
}

impl RedisCache {
    pub(crate) fn new(backend: Arc<BackendShared>) -> RedisCache {
        // `backend.redis.leadLeaseMs`, checked by `Settings`.
        let lead_lease = backend.settings.lead_lease;
        RedisCache { backend, max_value_bytes: MAX_VALUE_BYTES, lead_lease }
    }

    /// Caches values of at most `bytes` (serialized) instead of [`MAX_VALUE_BYTES`].
    pub fn with_max_value_bytes(mut self, bytes: usize) -> Self {
        self.max_value_bytes = bytes;
        self
    }

    /// Sets how long a replica's lead of a call lasts after it stops renewing it (it
    /// crashed, or lost Redis), instead of the configuration's `leadLeaseMs`
    /// ([`DEFAULT_LEAD_LEASE`] when it has none); at least 100 ms. The other replicas'
    /// identical calls wait for it that long at most (within their own deadlines). A lead
    /// is renewed every third of it while its call runs.
    pub fn with_lead_lease(mut self, lease: Duration) -> Self {
        self.lead_lease = lease.clamp(MIN_LEAD_LEASE, crate::config::FOREVER);
        self
    }

    /// How long a replica's lead of a call lasts after it stops renewing it.
    pub fn lead_lease(&self) -> Duration {
        self.lead_lease
    }

    /// The Redis key of cache key `key`.
    fn redis_key(&self, key: &str) -> String {
        // The orchestrator's keys are `{tool}\0{arguments}`; anything else is hashed whole.
        let tool = key.split_once('\u{0}').map_or("", |(tool, _)| tool);
        let tool: String = tool
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
            .collect();
        format!("{}:c:{tool}:{}", self.backend.settings.prefix, hashed(key))
    }
}

/// The 128-bit hash of `key` in hex, which keeps Redis keys short whatever the arguments.
fn hashed(key: &str) -> String {
    format!("{:016x}{:016x}", hash(key, 1), hash(key, 2))
}

/// A hash of `key` that is the same in every process and every build of toolmux: FNV-1a,
/// seeded. (std's `DefaultHasher` may change between Rust releases, and replicas built
/// apart must find each other's entries.)
fn hash(key: &str, seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[async_trait]
impl ResponseCache for RedisCache {
    async fn get(&self, key: &str) -> Option<ToolOutput> {
        if self.backend.client.skip_optional() {
            return None;
        }
        let redis_key = self.redis_key(key);
        let reply = self.backend.client.command(&["GET", &redis_key]).await.ok()?;
        let Reply::Bulk(bytes) = reply else { return None };
        match serde_json::from_slice::<Entry<'_>>(&bytes) {
            Ok(entry) if entry.key == key => Some(entry.output.into_owned()),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(target: "toolmux::redis", "cached value under {redis_key} unreadable: {e}");
                None
            }
        }
    }

    async fn put(&self, key: &str, output: &ToolOutput, ttl: Duration) {
        let ttl_ms = ttl.min(crate::config::FOREVER).as_millis();
        if ttl_ms == 0 || self.backend.client.skip_optional() {
            return;
        }
        let entry = Entry { key: Cow::Borrowed(key), output: Cow::Borrowed(output) };
        let Ok(value) = serde_json::to_vec(&entry) else { return };
        if value.len() > self.max_value_bytes {
            tracing::debug!(target: "toolmux::redis", "output of {} bytes not cached (cap {})", value.len(), self.max_value_bytes);
            return;
        }
        let redis_key = self.redis_key(key);
        let ttl = ttl_ms.to_string();
        let args: [&[u8]; 5] = [b"SET", redis_key.as_bytes(), &value, b"PX", ttl.as_bytes()];
        // A failed put only means a later miss; the client logs an outage once.
        let _ = self.backend.client.command(&args).await;
    }

    async fn lead(&self, key: &str) -> Lead {
        lead::lead(&self.backend, key, self.lead_lease).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_stable_and_seeded() {
        // Pinned: replicas of different builds must agree on them.
        assert_eq!(hashed("t\u{0}{}"), "37345a989c60e6f0358136c88d73f05f");
        assert_ne!(hash("a", 1), hash("b", 1));
    }
}
