//! [`RedisRateLimits`]: rate limits every replica shares, one GCRA state per limit in a
//! Redis key (the theoretical arrival time of the next call, in microseconds of the Redis
//! server's clock, so replicas' clocks need not agree).
//!
//! Keys are `{prefix}:rl:{key}` (`tool:github__search`, `provider:github`), expiring once
//! the limit is back to a full burst. While Redis does not answer, each replica falls back
//! to its own in-process limiter for that limit: the limit then holds per replica instead
//! of for all together, which is logged once; calls are never refused or hung for Redis's
//! sake.

use crate::backend::BackendShared;
use crate::client::Script;
use crate::resp::Reply;
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use toolmux_orchestrator::RateLimit;
use toolmux_orchestrator::ratelimit::{Limiter, RateLimitBackend, RateLimiter};

/// The GCRA step, atomic: reads the key's arrival time, and either refuses (`{0, wait}`)
/// or moves it one interval on (`{1, wait}`); times in microseconds.
const RESERVE: Script = Script {
    name: "ratelimit_reserve",
    source: r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local per = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]))
local base = now
if tat and tat > now then base = tat end
local after = base + interval
local wait = after - per - now
if wait < 0 then wait = 0 end
if wait > max_wait then return {0, wait} end
local ttl = math.floor((after - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', after), 'PX', ttl)
return {1, wait}
",
};

/// Rate limits shared by every replica, for [`toolmux_orchestrator::Orchestrator`]'s
/// builder (`.rate_limit_backend(Arc::new(backend.rate_limits()))`).
#[derive(Debug, Clone)]
pub struct RedisRateLimits {
    backend: Arc<BackendShared>,
}

impl RedisRateLimits {
    pub(crate) fn new(backend: Arc<BackendShared>) -> RedisRateLimits {
        RedisRateLimits { backend }
    }
}

impl RateLimitBackend for RedisRateLimits {
    fn limiter(&self, key: &str, limit: RateLimit) -> Arc<dyn Limiter> {
        Arc::new(RedisLimiter {
            backend: self.backend.clone(),
            key: format!("{}:rl:{key}", self.backend.settings.prefix),
            limit,
            local: RateLimiter::new(limit),
            degraded: AtomicBool::new(false),
        })
    }
}

/// One shared limit, with this replica's own limiter for when Redis does not answer.
#[derive(Debug)]
struct RedisLimiter {
    backend: Arc<BackendShared>,
    key: String,
    limit: RateLimit,
    local: RateLimiter,
    /// Whether the last reservation fell back to `local` (logged when it changes).
    degraded: AtomicBool,
}

impl RedisLimiter {
    async fn shared(&self) -> Option<Result<Duration, Duration>> {
        if self.backend.client.skip_optional() {
            return None;
        }
        let micros = |d: Duration| d.as_micros().min(u128::from(u64::MAX)).to_string();
        let interval = self.limit.per / self.limit.calls.max(1);
        let args = [micros(interval), micros(self.limit.per), micros(self.limit.wait)];
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let timeout = self.backend.settings.timeout;
        let reply = self.backend.client.eval(&RESERVE, &[&self.key], &args, timeout).await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                if !self.degraded.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        key = %self.key, error = %e,
                        "rate limit: Redis does not answer; this replica keeps the limit alone"
                    );
                }
                return None;
            }
        };
        let Reply::Array(items) = reply else { return None };
        let (Some(Reply::Integer(allowed)), Some(Reply::Integer(wait))) =
            (items.first(), items.get(1))
        else {
            return None;
        };
        if self.degraded.swap(false, Ordering::Relaxed) {
            tracing::info!(key = %self.key, "rate limit: shared through Redis again");
        }
        let wait = Duration::from_micros(u64::try_from(*wait).unwrap_or(0));
        Some(if *allowed == 1 { Ok(wait) } else { Err(wait) })
    }
}

#[async_trait]
impl Limiter for RedisLimiter {
    async fn reserve(&self) -> Result<Duration, Duration> {
        match self.shared().await {
            Some(reserved) => reserved,
            None => self.local.reserve_at(tokio::time::Instant::now()),
        }
    }
}
