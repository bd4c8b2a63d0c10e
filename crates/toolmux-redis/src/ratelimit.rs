//! [`RedisRateLimits`]: rate limits every replica shares, one GCRA state per limit in a
//! Redis key (the theoretical arrival time of the next call, in microseconds of the Redis
//! server's clock, so replicas' clocks need not agree).
//!
//! Keys are `{prefix}:rl:{key}` (`tool:github__search`, `provider:github`), expiring once
//! the limit is back to a full burst. A turn reserved for a call that stops before it
//! comes (cancelled, past its deadline) is given back by moving the arrival time back one
//! interval, in a task, unless the turn has come by then on the server's clock. A
//! reservation whose answer never came (lost with its connection, past its timeout, or
//! its caller gone while it was on its way) is given back the same way by the id this
//! replica chose for it: the reservation keeps its arrival time under
//! `{prefix}:rlt:{id}` until its turn comes, and a give-back that finds none leaves
//! `{prefix}:rlx:{id}` for five minutes, so that a reservation still on its way to Redis
//! reserves nothing. While Redis does not answer, each replica falls back
//! to its own in-process limiter for that limit: the limit then holds per replica instead
//! of for all together, which is logged once; calls are never refused or hung for Redis's
//! sake.

use crate::backend::BackendShared;
use crate::client::Script;
use crate::error::RedisError;
use crate::resp::Reply;
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use toolmux_orchestrator::RateLimit;
use toolmux_orchestrator::ratelimit::{Limiter, RateLimitBackend, RateLimiter, Turn};

/// The GCRA step, atomic: reads the key's arrival time, and either refuses (`{0, wait}`)
/// or moves it one interval on (`{1, wait, after}`, `after` the arrival time it set, the
/// turn's mark for [`RELEASE`]); times in microseconds. A turn to wait for keeps `after`
/// under its id until it comes, for [`RELEASE_BY_ID`]; an id given back already reserves
/// nothing (`{-1, 0}`).
/// KEYS: the limit, the reservation's record, its withdrawal mark. ARGV: the interval, the
/// period, the longest wait.
const RESERVE: Script = Script {
    name: "ratelimit_reserve",
    source: r"
if redis.call('EXISTS', KEYS[3]) == 1 then return {-1, 0} end
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
if wait > 0 then
  redis.call('SET', KEYS[2], string.format('%.0f', after), 'PX', math.floor(wait / 1000) + 1)
end
return {1, wait, after}
",
};

/// The end of [`RELEASE`] and [`RELEASE_BY_ID`]: with `mark` the arrival time the turn's
/// reservation set, moves the limit's one interval back unless the turn has come.
macro_rules! give_back {
    () => {
        r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[2])
local per = tonumber(ARGV[3])
if now >= mark - per then return 0 end
local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat then return 0 end
local after = tat - interval
if after <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
local ttl = math.floor((after - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', after), 'PX', ttl)
return 1
"
    };
}

/// Gives a turn back, atomic: moves the key's arrival time one interval back, unless the
/// turn (`ARGV[1]`, the arrival time its reservation set, less the period) has come.
/// Until then the arrival time stays past the server's clock, so every reservation since
/// moved it on by one whole interval and taking one off undoes just this turn's.
/// KEYS: the limit. ARGV: the turn's mark, the interval, the period.
const RELEASE: Script = Script {
    name: "ratelimit_release",
    source: concat!(
        r"
local mark = tonumber(ARGV[1])
",
        give_back!()
    ),
};

/// Gives back the reservation of an id whose answer never came, as [`RELEASE`] does with
/// the arrival time its record kept; with no record (the turn came, or the reservation has
/// not reached Redis), marks the id so that a reservation arriving later reserves nothing.
/// KEYS: the limit, the reservation's record, its withdrawal mark. ARGV: how long the mark
/// stays (ms), the interval, the period.
const RELEASE_BY_ID: Script = Script {
    name: "ratelimit_release_by_id",
    source: concat!(
        r"
local mark = tonumber(redis.call('GET', KEYS[2]))
if not mark then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
  return 0
end
redis.call('DEL', KEYS[2])
",
        give_back!()
    ),
};

/// How long the id of a reservation given back before it reached Redis stays marked.
const WITHDRAWN_KEPT: Duration = Duration::from_secs(300);

/// Microseconds as a script argument.
fn micros(d: Duration) -> String {
    d.as_micros().min(u128::from(u64::MAX)).to_string()
}

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
        Arc::new(self.redis_limiter(key, limit))
    }
}

impl RedisRateLimits {
    fn redis_limiter(&self, key: &str, limit: RateLimit) -> RedisLimiter {
        RedisLimiter {
            backend: self.backend.clone(),
            key: format!("{}:rl:{key}", self.backend.settings.prefix),
            limit,
            local: RateLimiter::new(limit),
            degraded: AtomicBool::new(false),
            reservations: AtomicU64::new(0),
        }
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
    /// Numbers this replica's reservations of the limit (their ids).
    reservations: AtomicU64,
}

impl RedisLimiter {
    async fn shared(&self) -> Option<Result<Turn, Duration>> {
        if self.backend.client.skip_optional() {
            return None;
        }
        let interval = self.limit.per / self.limit.calls.max(1);
        let args = [micros(interval), micros(self.limit.per), micros(self.limit.wait)];
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let timeout = self.backend.settings.timeout;
        let n = self.reservations.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{n}", self.backend.replica);
        let (record, withdrawn) = self.keys_of(&id);
        // Armed before the script goes out: a reservation whose answer never comes (lost,
        // too late, or its caller gone meanwhile) is given back by its id.
        let mut unanswered = Unanswered(Some(self.release_by_id(id)));
        let keys = [self.key.as_str(), record.as_str(), withdrawn.as_str()];
        let reply = self.backend.client.eval(&RESERVE, &keys, &args, timeout).await;
        if !matches!(&reply, Err(e) if e.may_have_run()) {
            // Answered, or surely not run: nothing to give back.
            unanswered.0 = None;
        }
        drop(unanswered);
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
        if *allowed == -1 {
            // This id was given back before it reached Redis (not so for a new id).
            return None;
        }
        let wait = Duration::from_micros(u64::try_from(*wait).unwrap_or(0));
        if *allowed != 1 {
            return Some(Err(wait));
        }
        // Never zero (the server's clock is past 1970): zero marks a turn of `local`.
        let mark = match items.get(2) {
            Some(Reply::Integer(after)) => u64::try_from(*after).unwrap_or(0),
            _ => 0,
        };
        Some(Ok(Turn::new(wait).with_mark(mark)))
    }
}

#[async_trait]
impl Limiter for RedisLimiter {
    async fn reserve_turn(&self) -> Result<Turn, Duration> {
        match self.shared().await {
            Some(reserved) => reserved,
            None => self.local.reserve_turn().await,
        }
    }

    fn release(&self, turn: Turn) {
        if turn.wait().is_zero() {
            return;
        }
        if turn.mark() == 0 {
            // Reserved while Redis did not answer: `local` holds it.
            self.local.release(turn);
            return;
        }
        // Given back in a task: the caller gives it back as it stops (possibly while
        // dropped), with nothing to wait on. A release that comes after the turn, or
        // never (Redis down), leaves the turn spent, as it was before releases.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let release = self.release_of(turn);
        runtime.spawn(async move {
            if let Err(e) = release.run().await {
                tracing::debug!(key = %release.key, error = %e, "rate limit: a turn not taken was not given back");
            }
        });
    }
}

impl RedisLimiter {
    /// The record of reservation `id` and its withdrawal mark.
    fn keys_of(&self, id: &str) -> (String, String) {
        let prefix = &self.backend.settings.prefix;
        (format!("{prefix}:rlt:{id}"), format!("{prefix}:rlx:{id}"))
    }

    fn release_by_id(&self, id: String) -> ReleaseById {
        let interval = self.limit.per / self.limit.calls.max(1);
        let (record, withdrawn) = self.keys_of(&id);
        ReleaseById {
            backend: self.backend.clone(),
            keys: [self.key.clone(), record, withdrawn],
            args: [
                WITHDRAWN_KEPT.as_millis().to_string(),
                micros(interval),
                micros(self.limit.per),
            ],
            // Past the longest wait the turn has come, and giving it back does nothing.
            until: self.limit.wait + self.backend.settings.timeout,
        }
    }

    fn release_of(&self, turn: Turn) -> Release {
        let interval = self.limit.per / self.limit.calls.max(1);
        Release {
            backend: self.backend.clone(),
            key: self.key.clone(),
            args: [turn.mark().to_string(), micros(interval), micros(self.limit.per)],
        }
    }
}

/// A turn to give back ([`RELEASE`]'s key and arguments).
struct Release {
    backend: Arc<BackendShared>,
    key: String,
    args: [String; 3],
}

/// A reservation whose answer never came, to give back by its id from a task when dropped
/// armed.
struct Unanswered(Option<ReleaseById>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        let (Some(release), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        runtime.spawn(async move {
            // A few tries while the turn may still be given back: a Redis down for longer
            // is an outage, which the limiters ride out alone anyway.
            let until = tokio::time::Instant::now() + release.until;
            for tries_left in (0..3).rev() {
                match release.run().await {
                    Ok(_) => return,
                    Err(e) if tries_left == 0 || tokio::time::Instant::now() >= until => {
                        tracing::debug!(key = %release.keys[0], error = %e, "rate limit: a reservation whose answer was lost was not given back");
                        return;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
    }
}

/// A reservation to give back by its id ([`RELEASE_BY_ID`]'s keys and arguments).
struct ReleaseById {
    backend: Arc<BackendShared>,
    keys: [String; 3],
    args: [String; 3],
    /// How long giving it back is worth trying.
    until: Duration,
}

impl ReleaseById {
    /// Whether a turn was given back (not: there was none, or it had come).
    async fn run(&self) -> Result<bool, RedisError> {
        let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        let args: Vec<&[u8]> = self.args.iter().map(|a| a.as_bytes()).collect();
        let timeout = self.backend.settings.timeout;
        let reply = self.backend.client.eval(&RELEASE_BY_ID, &keys, &args, timeout).await?;
        Ok(matches!(reply, Reply::Integer(1)))
    }
}

impl Release {
    /// Whether the turn was given back (not: it had come).
    async fn run(&self) -> Result<bool, RedisError> {
        let args: Vec<&[u8]> = self.args.iter().map(|a| a.as_bytes()).collect();
        let timeout = self.backend.settings.timeout;
        let reply = self.backend.client.eval(&RELEASE, &[&self.key], &args, timeout).await?;
        Ok(matches!(reply, Reply::Integer(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RedisBackend, RedisConfig};
    use toolmux_test_support::redis::RedisServer;

    async fn arrival(limiter: &RedisLimiter) -> u64 {
        let reply = limiter.backend.client.command(&["GET", limiter.key.as_str()]).await;
        match reply.expect("GET") {
            Reply::Bulk(bytes) => String::from_utf8_lossy(&bytes).parse().expect("a number"),
            other => panic!("no arrival time: {other:?}"),
        }
    }

    /// A reservation given back by its id before it reached Redis (its caller gave up while
    /// it waited for a connection, or a slow server ran the give-back first) reserves
    /// nothing when it arrives; an id with a turn reserved is given back once.
    #[tokio::test]
    async fn an_id_given_back_before_its_reservation_reserves_nothing() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limit =
            RateLimit { calls: 1, per: Duration::from_secs(10), wait: Duration::from_secs(60) };
        let limiter = backend.rate_limits().redis_limiter("tool:t", limit);
        assert_eq!(limiter.reserve().await, Ok(Duration::ZERO));
        let before = arrival(&limiter).await;
        let reserve = |id: &str| {
            let (record, withdrawn) = limiter.keys_of(id);
            let client = limiter.backend.client.clone();
            let key = limiter.key.clone();
            async move {
                let args = ["10000000", "10000000", "60000000"];
                let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
                let keys = [key.as_str(), record.as_str(), withdrawn.as_str()];
                client.eval(&RESERVE, &keys, &args, Duration::from_secs(2)).await.expect("reserve")
            }
        };
        assert!(!limiter.release_by_id("early".into()).run().await.expect("give back"));
        let late = reserve("early").await;
        assert_eq!(late, Reply::Array(vec![Reply::Integer(-1), Reply::Integer(0)]));
        assert_eq!(arrival(&limiter).await, before, "a withdrawn id reserved a turn");

        let Reply::Array(reserved) = reserve("kept").await else { panic!("no answer") };
        assert_eq!(reserved.first(), Some(&Reply::Integer(1)));
        assert_eq!(arrival(&limiter).await, before + 10_000_000);
        let release = limiter.release_by_id("kept".into());
        assert!(release.run().await.expect("give back"));
        assert_eq!(arrival(&limiter).await, before);
        assert!(!release.run().await.expect("give back"), "given back twice");
        assert_eq!(arrival(&limiter).await, before);
    }

    #[tokio::test]
    async fn a_turn_not_come_is_given_back_one_come_is_not() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limit =
            RateLimit { calls: 2, per: Duration::from_secs(1), wait: Duration::from_secs(10) };
        let limiter = backend.rate_limits().redis_limiter("tool:t", limit);
        for _ in 0..2 {
            assert_eq!(limiter.reserve().await, Ok(Duration::ZERO));
        }
        let third = limiter.reserve_turn().await.expect("may wait");
        let fourth = limiter.reserve_turn().await.expect("may wait");
        assert!(fourth.wait() > Duration::from_millis(900), "{fourth:?}");
        assert_ne!(fourth.mark(), 0, "a shared turn is marked");
        let before = arrival(&limiter).await;
        // Given back in any order, each takes one interval (500 ms) off.
        assert!(limiter.release_of(third).run().await.expect("release"));
        assert_eq!(arrival(&limiter).await, before - 500_000);
        assert!(limiter.release_of(fourth).run().await.expect("release"));
        assert_eq!(arrival(&limiter).await, before - 1_000_000);
        // The next call takes the first turn given back.
        let next = limiter.reserve_turn().await.expect("may wait");
        assert!(
            next.wait() > Duration::from_millis(400) && next.wait() <= Duration::from_millis(500),
            "{next:?}"
        );
        // Once its turn has come, a turn is not given back.
        tokio::time::sleep(next.wait() + Duration::from_millis(10)).await;
        let now = arrival(&limiter).await;
        assert!(!limiter.release_of(next).run().await.expect("release"));
        assert_eq!(arrival(&limiter).await, now);
        // A turn through the trait is given back in a task.
        let turn = limiter.reserve_turn().await.expect("may wait");
        let taken = arrival(&limiter).await;
        limiter.release(turn);
        let started = std::time::Instant::now();
        while arrival(&limiter).await != taken - 500_000 {
            assert!(started.elapsed() < Duration::from_secs(5), "the turn was not given back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
