//! [`RedisRateLimits`]: rate limits every replica shares, one GCRA state per limit in a
//! Redis key (the theoretical arrival time of the next call, in microseconds of the Redis
//! server's clock, so replicas' clocks need not agree).
//!
//! Keys are `{prefix}:rl:{key}` (`tool:github__search`, `provider:github`), expiring once
//! the limit is back to a full burst. A turn reserved for a call that never runs
//! (cancelled, past its deadline, or refused by its queue, before or after its turn came)
//! is given back in a task with the in-process limiter's guarantee, on the server's
//! clock: each turn holds its own interval of the limit's time, apart from every other
//! turn's, so that no two calls of all replicas together come closer than the limit
//! spaces them, and a turn given back keeps that. The turns reserved after it keep their
//! times: the latest turn moves the arrival time back to its start, and on over the holes
//! it then reaches; a turn in the middle leaves a hole, which the next call made before
//! the hole's start takes (moving the arrival time back under the turns already reserved
//! gave the next call the instant of the latest one). For that the limit keeps, beside
//! its arrival time and expiring with it, the turns that may still give something back
//! under `{prefix}:rls:{key}` (a hash: the number of the latest turn, and each open turn's
//! start) and `{prefix}:rlo:{key}` (their numbers, in order), and the holes' starts under
//! `{prefix}:rlh:{key}` (a sorted set), at most [`MAX_OPEN_TURNS`] of each. A
//! reservation whose answer never came (lost with its connection, past its timeout, or its
//! caller gone while it was on its way) is given back the same way by the id this replica
//! chose for it (`{replica}-{n}`, one count for all its limits, so that the reservations of
//! a tool's limit and its provider's on one call never share an id): the reservation keeps its turn's number under `{prefix}:rlt:{id}` while
//! the limit's state lasts, and a give-back that finds none leaves `{prefix}:rlx:{id}` for
//! five minutes, so that a reservation still on its way to Redis reserves nothing. While
//! Redis does not answer, each replica falls back to its own in-process limiter for that
//! limit (whose turns go back to it): the limit then holds per replica instead of for all
//! together, which is logged once; calls are never refused or hung for Redis's sake.
//!
//! A period or a longest wait past about thirty years (`Duration::MAX`: one call for
//! ever) is held to that, as the orchestrator holds it: in microseconds past 2^53 the
//! script's sums lost their last digits in Lua's numbers (the first call of such a limit
//! was refused for a wait of a few milliseconds). Held so, its times stay exact and its
//! expiries (about sixty years at most, in milliseconds) well within what Redis takes.

use crate::backend::BackendShared;
use crate::client::Script;
use crate::error::RedisError;
use crate::resp::Reply;
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use toolmux_orchestrator::RateLimit;
use toolmux_orchestrator::ratelimit::{Limiter, RateLimitBackend, RateLimiter, Turn};

/// The GCRA step, atomic, as `RateLimiter::reserve_turn_at` takes it: the call takes the
/// earliest hole left by a turn given back whose interval has not started (on the
/// server's clock), else the interval at the limit's arrival time (or now, if that is
/// past); it either refuses (`{0, wait}`) or takes it (`{1, wait, n}`, `n` the turn's
/// number, its mark for [`RELEASE`]); times in microseconds. Each turn holds its interval
/// `[start, start + interval)` and comes at `start + interval - per` (at once if past), so
/// no two turns' intervals overlap. The turn is kept open (its start under `s{n}` in the
/// state) for giving back; the oldest open turns whose interval is past or past
/// [`MAX_OPEN_TURNS`], and the holes whose interval is past, are forgotten. The turn's
/// number is kept under its id for [`RELEASE_BY_ID`]; an id given back already reserves
/// nothing (`{-1, 0}`). Turns are numbered from the server's clock on, so that a number
/// outlives the state that gave it. Every key expires with the arrival time, past which
/// every turn's and hole's interval is past.
///
/// Replicas not yet upgraded during a rolling upgrade reserve and give back with the
/// scripts before holes, on the same keys: a turn's arrival time under `a{n}`, and a
/// give-back that moves the arrival time back by up to the turn's interval, under the turns
/// reserved after it. So that such a give-back never lets a call come closer to an upgraded
/// replica's turn than the limit spaces them, the old turns this script forgets (every one
/// ahead of it: they have no `s{n}`, and an old reservation forgets the new turns ahead of
/// it in turn) lose their `a{n}` and `g{n}` too, and stay spent for their period, the safe
/// side. The give-back here never meets an old turn, since a turn is given back by the
/// process that reserved it.
/// KEYS: the limit, its state, its open turns, its holes, the reservation's record, its
/// withdrawal mark. ARGV: the interval, the period, the longest wait, the most open turns.
const RESERVE: Script = Script {
    name: "ratelimit_reserve",
    source: r"
if redis.call('EXISTS', KEYS[6]) == 1 then return {-1, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local per = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local max_open = tonumber(ARGV[4])
local function fmt(x) return string.format('%.0f', x) end
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat and tat <= now then tat = nil end
local hole = nil
if tat then
  hole = redis.call('ZRANGEBYSCORE', KEYS[4], fmt(now), '+inf', 'LIMIT', 0, 1)[1]
end
local base = now
if hole then base = tonumber(hole) elseif tat then base = tat end
local after = base + interval
local wait = after - per - now
if wait < 0 then wait = 0 end
if wait > max_wait then return {0, wait} end
if hole then
  redis.call('ZREM', KEYS[4], hole)
else
  tat = after
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', fmt(now - interval))
local seq = now
local latest = tonumber(redis.call('HGET', KEYS[2], 'seq'))
if latest and latest >= seq then seq = latest + 1 end
local n = fmt(seq)
redis.call('HSET', KEYS[2], 'seq', n, 's' .. n, fmt(base))
redis.call('ZADD', KEYS[3], n, n)
local full = redis.call('ZCARD', KEYS[3]) > max_open
while true do
  local oldest = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not oldest or oldest == n then break end
  local s = tonumber(redis.call('HGET', KEYS[2], 's' .. oldest))
  if not full and s and s + interval > now then break end
  redis.call('ZREM', KEYS[3], oldest)
  redis.call('HDEL', KEYS[2], 's' .. oldest, 'a' .. oldest, 'g' .. oldest)
  full = false
end
local ttl = math.floor((tat - now) / 1000) + 1
redis.call('SET', KEYS[1], fmt(tat), 'PX', ttl)
for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
redis.call('SET', KEYS[5], n, 'PX', ttl)
return {1, wait, seq}
",
};

/// The end of [`RELEASE`] and [`RELEASE_BY_ID`]: with `n` the turn's number, closes the
/// turn and gives back its interval as `RateLimiter::release_at` does, so that no two
/// turns come closer than the limit spaces them. The turns reserved after it keep their
/// times. The latest turn's interval ends at the limit's arrival time: that moves back to
/// its start, and on over the holes it then reaches (turns given back before it), or the
/// key goes once that is past. Any other turn leaves a hole, which the next call made
/// before the hole's start takes ([`RESERVE`]). A turn whose interval is past gives
/// nothing. At most [`MAX_OPEN_TURNS`] holes are kept, the oldest forgotten.
macro_rules! give_back {
    () => {
        r"
local interval = tonumber(ARGV[2])
local max_holes = tonumber(ARGV[3])
local function fmt(x) return string.format('%.0f', x) end
local s = tonumber(redis.call('HGET', KEYS[2], 's' .. n))
if not s then return 0 end
redis.call('ZREM', KEYS[3], n)
redis.call('HDEL', KEYS[2], 's' .. n)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local e = s + interval
if e <= now then return 0 end
local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat or tat <= now then return 0 end
local ttl = math.floor((tat - now) / 1000) + 1
if tat > e then
  redis.call('ZADD', KEYS[4], fmt(s), fmt(s))
  if redis.call('ZCARD', KEYS[4]) > max_holes then
    redis.call('ZREMRANGEBYRANK', KEYS[4], 0, 0)
  end
  redis.call('PEXPIRE', KEYS[4], ttl)
  return 1
end
local due = s
while true do
  local last = redis.call('ZREVRANGE', KEYS[4], 0, 0)[1]
  if not last or tonumber(last) + interval < due then break end
  redis.call('ZREM', KEYS[4], last)
  if tonumber(last) < due then due = tonumber(last) end
end
if due <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('SET', KEYS[1], fmt(due), 'PX', math.floor((due - now) / 1000) + 1)
return 1
"
    };
}

/// Gives a turn back, atomic (see [`give_back!`]); a turn given back already, forgotten,
/// or whose interval is past gives nothing.
/// KEYS: the limit, its state, its open turns, its holes. ARGV: the turn's number, the
/// interval, the most holes kept.
const RELEASE: Script = Script {
    name: "ratelimit_release",
    source: concat!(
        r"
local n = ARGV[1]
",
        give_back!()
    ),
};

/// Gives back the reservation of an id whose answer never came, as [`RELEASE`] does with
/// the turn's number its record kept; with no record (the reservation has not reached
/// Redis, or the limit's state is gone), marks the id so that a reservation arriving later
/// reserves nothing.
/// KEYS: the limit, its state, its open turns, its holes, the reservation's record, its
/// withdrawal mark. ARGV: how long the mark stays (ms), the interval, the most holes kept.
const RELEASE_BY_ID: Script = Script {
    name: "ratelimit_release_by_id",
    source: concat!(
        r"
local n = redis.call('GET', KEYS[5])
if not n then
  redis.call('SET', KEYS[6], '1', 'PX', ARGV[1])
  return 0
end
redis.call('DEL', KEYS[5])
",
        give_back!()
    ),
};

/// The most turns of one limit kept open for giving back, and the most holes it keeps: past
/// it the oldest is forgotten (and gives nothing back), so that a limit under a flood of
/// calls keeps a bounded state (and a give-back a bounded script).
const MAX_OPEN_TURNS: usize = 1024;

/// How long the id of a reservation given back before it reached Redis stays marked.
const WITHDRAWN_KEPT: Duration = Duration::from_secs(300);

/// The longest period or wait a limit is held to: about thirty years, as the orchestrator
/// holds it (`Duration::MAX` is no limit). The script's times then stay below 2^53
/// microseconds, exact in Lua's numbers.
const FOREVER: Duration = Duration::from_secs(60 * 60 * 24 * 365 * 30);

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
        // Held as the orchestrator holds it (see FOREVER): the script's sums of
        // microseconds stay exact.
        let limit =
            RateLimit { per: limit.per.min(FOREVER), wait: limit.wait.min(FOREVER), ..limit };
        let prefix = &self.backend.settings.prefix;
        RedisLimiter {
            backend: self.backend.clone(),
            key: format!("{prefix}:rl:{key}"),
            state: format!("{prefix}:rls:{key}"),
            open: format!("{prefix}:rlo:{key}"),
            holes: format!("{prefix}:rlh:{key}"),
            limit,
            local: RateLimiter::new(limit),
            degraded: AtomicBool::new(false),
        }
    }
}

/// One shared limit, with this replica's own limiter for when Redis does not answer.
#[derive(Debug)]
struct RedisLimiter {
    backend: Arc<BackendShared>,
    /// The limit's arrival time.
    key: String,
    /// The limit's state for giving turns back (the latest turn, open turns' times).
    state: String,
    /// The limit's open turns, by number.
    open: String,
    /// The starts of the turns given back before the latest one reserved.
    holes: String,
    /// Invariant: `per` and `wait` at most [`FOREVER`].
    limit: RateLimit,
    local: RateLimiter,
    /// Whether the last reservation fell back to `local` (logged when it changes).
    degraded: AtomicBool,
}

impl RedisLimiter {
    async fn shared(&self) -> Option<Result<Turn, Duration>> {
        if self.backend.client.skip_optional() {
            return None;
        }
        let id = self.next_id();
        self.reserve_as(id).await
    }

    /// The id of this replica's next reservation, of this limit or any other.
    fn next_id(&self) -> String {
        let n = self.backend.reservations.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.backend.replica)
    }

    /// Reserves a turn of the shared limit under reservation `id`; `None` when Redis gave
    /// no turn or refusal (it did not answer, or `id` was withdrawn before it came).
    async fn reserve_as(&self, id: String) -> Option<Result<Turn, Duration>> {
        let interval = self.limit.per / self.limit.calls.max(1);
        let args = [
            micros(interval),
            micros(self.limit.per),
            micros(self.limit.wait),
            MAX_OPEN_TURNS.to_string(),
        ];
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let timeout = self.backend.settings.timeout;
        let (record, withdrawn) = self.keys_of(&id);
        // Armed before the script goes out: a reservation whose answer never comes (lost,
        // too late, or its caller gone meanwhile) is given back by its id.
        let mut unanswered = Unanswered(Some(self.release_by_id(id)));
        let keys = [
            self.key.as_str(),
            self.state.as_str(),
            self.open.as_str(),
            self.holes.as_str(),
            record.as_str(),
            withdrawn.as_str(),
        ];
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
        // The turn's number, never zero (numbered from the server's clock, past 1970): zero
        // marks a turn of `local`.
        let mark = match items.get(2) {
            Some(Reply::Integer(n)) => u64::try_from(*n).unwrap_or(0),
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
        if turn.mark() == 0 {
            // Reserved while Redis did not answer: `local` holds it (and a turn of no
            // limiter gives nothing back).
            self.local.release(turn);
            return;
        }
        // Given back in a task, whether or not the turn has come: the caller gives it back
        // as it stops (possibly while dropped), with nothing to wait on. A release that
        // never reaches Redis (Redis down) leaves the turn spent.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let release = self.release_of(turn);
        runtime.spawn(async move {
            if let Err(e) = release.run().await {
                tracing::debug!(key = %release.keys[0], error = %e, "rate limit: a turn not taken was not given back");
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
            keys: [
                self.key.clone(),
                self.state.clone(),
                self.open.clone(),
                self.holes.clone(),
                record,
                withdrawn,
            ],
            args: [
                WITHDRAWN_KEPT.as_millis().to_string(),
                micros(interval),
                MAX_OPEN_TURNS.to_string(),
            ],
            // Past its period and longest wait the limit is back to a full burst, and
            // giving the turn back does nothing.
            until: self
                .limit
                .per
                .saturating_add(self.limit.wait)
                .saturating_add(self.backend.settings.timeout),
        }
    }

    fn release_of(&self, turn: Turn) -> Release {
        let interval = self.limit.per / self.limit.calls.max(1);
        Release {
            backend: self.backend.clone(),
            keys: [self.key.clone(), self.state.clone(), self.open.clone(), self.holes.clone()],
            args: [turn.mark().to_string(), micros(interval), MAX_OPEN_TURNS.to_string()],
        }
    }
}

/// A turn to give back ([`RELEASE`]'s keys and arguments).
struct Release {
    backend: Arc<BackendShared>,
    keys: [String; 4],
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
            let now = tokio::time::Instant::now();
            let until = now.checked_add(release.until).unwrap_or(now + FOREVER);
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
    keys: [String; 6],
    args: [String; 3],
    /// How long giving it back is worth trying.
    until: Duration,
}

impl ReleaseById {
    /// Whether a turn gave something back (not: there was none, or it no longer weighs).
    async fn run(&self) -> Result<bool, RedisError> {
        let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        let args: Vec<&[u8]> = self.args.iter().map(|a| a.as_bytes()).collect();
        let timeout = self.backend.settings.timeout;
        let reply = self.backend.client.eval(&RELEASE_BY_ID, &keys, &args, timeout).await?;
        Ok(matches!(reply, Reply::Integer(1)))
    }
}

impl Release {
    /// Whether the turn gave something back (not: given back already, forgotten, or it no
    /// longer weighs on the next call).
    async fn run(&self) -> Result<bool, RedisError> {
        let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        let args: Vec<&[u8]> = self.args.iter().map(|a| a.as_bytes()).collect();
        let timeout = self.backend.settings.timeout;
        let reply = self.backend.client.eval(&RELEASE, &keys, &args, timeout).await?;
        Ok(matches!(reply, Reply::Integer(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RedisBackend, RedisConfig};
    use toolmux_test_support::redis::RedisServer;

    const MS: u64 = 1000;

    /// The limit's arrival time (microseconds of the server's clock); `None` once back to a
    /// full burst.
    async fn arrival_of(limiter: &RedisLimiter) -> Option<u64> {
        let reply = limiter.backend.client.command(&["GET", limiter.key.as_str()]).await;
        match reply.expect("GET") {
            Reply::Bulk(bytes) => Some(String::from_utf8_lossy(&bytes).parse().expect("a number")),
            Reply::Nil => None,
            other => panic!("no arrival time: {other:?}"),
        }
    }

    async fn arrival(limiter: &RedisLimiter) -> u64 {
        arrival_of(limiter).await.expect("an arrival time")
    }

    fn limiter_of(
        backend: &RedisBackend,
        calls: u32,
        per: Duration,
        wait: Duration,
    ) -> RedisLimiter {
        backend.rate_limits().redis_limiter("tool:t", RateLimit { calls, per, wait })
    }

    /// A reservation given back by its id before it reached Redis (its caller gave up while
    /// it waited for a connection, or a slow server ran the give-back first) reserves
    /// nothing when it arrives; an id with a turn reserved is given back once.
    #[tokio::test]
    async fn an_id_given_back_before_its_reservation_reserves_nothing() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limiter = limiter_of(&backend, 1, Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(limiter.reserve().await, Ok(Duration::ZERO));
        let before = arrival(&limiter).await;
        let reserve = |id: &str| {
            let (record, withdrawn) = limiter.keys_of(id);
            let client = limiter.backend.client.clone();
            let keys = [
                limiter.key.clone(),
                limiter.state.clone(),
                limiter.open.clone(),
                limiter.holes.clone(),
            ];
            async move {
                let args = ["10000000", "10000000", "60000000", "1024"];
                let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
                let keys = [&keys[0], &keys[1], &keys[2], &keys[3], &record, &withdrawn];
                let keys: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
                client.eval(&RESERVE, &keys, &args, Duration::from_secs(2)).await.expect("reserve")
            }
        };
        assert!(!limiter.release_by_id("early".into()).run().await.expect("give back"));
        let late = reserve("early").await;
        assert_eq!(late, Reply::Array(vec![Reply::Integer(-1), Reply::Integer(0)]));
        assert_eq!(arrival(&limiter).await, before, "a withdrawn id reserved a turn");

        let Reply::Array(reserved) = reserve("kept").await else { panic!("no answer") };
        assert_eq!(reserved.first(), Some(&Reply::Integer(1)));
        assert_eq!(arrival(&limiter).await, before + 10_000 * MS);
        let release = limiter.release_by_id("kept".into());
        assert!(release.run().await.expect("give back"));
        assert_eq!(arrival(&limiter).await, before);
        assert!(!release.run().await.expect("give back"), "given back twice");
        assert_eq!(arrival(&limiter).await, before);
    }

    /// A call under a tool's limit and its provider's reserves a turn of each, on one
    /// replica: a reservation of one limit withdrawn or given back by its id touches no
    /// reservation of the other (their ids were counted per limit and met on the same
    /// record and withdrawal mark, so the other call fell back to this replica's own
    /// limiter, and a give-back took the other limit's record and gave nothing back).
    #[tokio::test]
    async fn the_ids_of_two_limits_reservations_never_meet() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limit =
            RateLimit { calls: 1, per: Duration::from_secs(60), wait: Duration::from_secs(600) };
        let rate_limits = backend.rate_limits();
        let tool = rate_limits.redis_limiter("tool:t", limit);
        let provider = rate_limits.redis_limiter("provider:p", limit);

        // The tool's reservation is withdrawn before it reaches Redis; the provider's is
        // still shared.
        let (tool_id, provider_id) = (tool.next_id(), provider.next_id());
        assert!(!tool.release_by_id(tool_id).run().await.expect("give back"));
        let turn = provider.reserve_as(provider_id).await.expect("a shared turn");
        let turn = turn.expect("at once");
        assert_ne!(turn.mark(), 0, "the provider's call fell back to the local limiter");
        let first = arrival(&provider).await;

        // Both reserve; the tool's answer is lost and given back by its id: the provider's
        // turn stays, and is given back by its own id in turn.
        let (tool_id, provider_id) = (tool.next_id(), provider.next_id());
        let tool_turn = tool.reserve_as(tool_id.clone()).await.expect("a shared turn");
        assert_eq!(tool_turn.map(|turn| turn.wait()), Ok(Duration::ZERO));
        let waiting = provider.reserve_as(provider_id.clone()).await.expect("a shared turn");
        assert!(waiting.is_ok(), "{waiting:?}");
        assert_eq!(arrival(&provider).await, first + 60_000 * MS);
        assert!(tool.release_by_id(tool_id).run().await.expect("give back"), "the tool's turn");
        assert_eq!(arrival_of(&tool).await, None, "the tool's limit is whole again");
        assert_eq!(arrival(&provider).await, first + 60_000 * MS, "the provider's turn moved");
        assert!(provider.release_by_id(provider_id).run().await.expect("give back"));
        assert_eq!(arrival(&provider).await, first);
    }

    /// As `RateLimiter`'s test of the same name: turns not come and a turn that came at
    /// once (its call then waited for a queue slot and never ran) are given back, each
    /// once: the latest moves the arrival time back one interval, one in the middle leaves
    /// its place to the next call.
    #[tokio::test]
    async fn turns_are_given_back_whether_or_not_they_came() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limiter = limiter_of(&backend, 2, Duration::from_secs(1), Duration::from_secs(10));
        let _first = limiter.reserve_turn().await.expect("at once");
        let second = limiter.reserve_turn().await.expect("at once");
        assert_eq!(second.wait(), Duration::ZERO);
        assert_ne!(second.mark(), 0, "a shared turn is marked");
        let third = limiter.reserve_turn().await.expect("may wait");
        let fourth = limiter.reserve_turn().await.expect("may wait");
        assert!(fourth.wait() > Duration::from_millis(900), "{fourth:?}");
        let before = arrival(&limiter).await;
        // The latest first, then the one before it, now the latest: each takes one
        // interval (500 ms) off.
        assert!(limiter.release_of(fourth).run().await.expect("release"));
        assert_eq!(arrival(&limiter).await, before - 500 * MS);
        assert!(limiter.release_of(third).run().await.expect("release"));
        assert_eq!(arrival(&limiter).await, before - 1000 * MS);
        // The next call takes the first turn given back.
        let next = limiter.reserve_turn().await.expect("may wait");
        let wait = next.wait();
        assert!(
            wait > Duration::from_millis(400) && wait <= Duration::from_millis(500),
            "{next:?}"
        );
        // The second call's turn came at once, but it never ran: it is given back all the
        // same, once, and the next call takes it, at once beside the first call's, the
        // turn after it keeping its time.
        let taken = arrival(&limiter).await;
        assert!(limiter.release_of(second).run().await.expect("release"));
        assert_eq!(arrival(&limiter).await, taken, "the turn after it moved");
        assert!(!limiter.release_of(second).run().await.expect("release"), "given back twice");
        assert_eq!(limiter.reserve().await, Ok(Duration::ZERO));
        assert_eq!(arrival(&limiter).await, taken);
        // A turn through the trait is given back in a task.
        let turn = limiter.reserve_turn().await.expect("may wait");
        assert_eq!(arrival(&limiter).await, taken + 500 * MS);
        limiter.release(turn);
        let started = std::time::Instant::now();
        while arrival(&limiter).await != taken {
            assert!(started.elapsed() < Duration::from_secs(5), "the turn was not given back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A turn that came at once and is given back through the trait lets the next call go
    /// at once.
    #[tokio::test]
    async fn a_turn_that_came_and_is_given_back_lets_the_next_call_go_at_once() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limiter = limiter_of(&backend, 1, Duration::from_secs(60), Duration::ZERO);
        let first = limiter.reserve_turn().await.expect("at once");
        assert_eq!(first.wait(), Duration::ZERO);
        assert!(limiter.reserve().await.is_err(), "one call a minute");
        limiter.release(first);
        let started = std::time::Instant::now();
        while arrival_of(&limiter).await.is_some() {
            assert!(started.elapsed() < Duration::from_secs(5), "the turn was not given back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(limiter.reserve().await, Ok(Duration::ZERO));
        assert!(limiter.reserve().await.is_err(), "one call a minute, no more");
    }

    /// As `RateLimiter`'s test of the same name: a turn that came, given back after the
    /// calls slowed down, lets no call come closer to the turns reserved after it than
    /// the limit spaces them (it gave back what was left of its interval past the latest
    /// reservation, and the next call came 600 ms after the second).
    #[tokio::test]
    async fn a_turn_given_back_late_brings_no_call_closer_to_the_next() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limiter = limiter_of(&backend, 1, Duration::from_secs(1), Duration::from_secs(10));
        let first = limiter.reserve_turn().await.expect("at once");
        let first_arrival = arrival(&limiter).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        // The next call waits for the rest of the first call's interval.
        let second = limiter.reserve().await.expect("may wait");
        assert!(second > Duration::ZERO && second <= Duration::from_millis(400), "{second:?}");
        let before = arrival(&limiter).await;
        assert_eq!(before, first_arrival + 1000 * MS);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Its interval has started: as a hole it is no call's, and the second call keeps its
        // turn, so the next comes a second after it.
        assert!(limiter.release_of(first).run().await.expect("release"));
        assert_eq!(arrival(&limiter).await, before);
        let next = limiter.reserve().await.expect("may wait");
        assert_eq!(arrival(&limiter).await, before + 1000 * MS);
        assert!(next > Duration::from_millis(1000), "{next:?}");
    }

    /// As `RateLimiter`'s test of the same name: when the latest turn is given back, the
    /// arrival time moves back over the holes left before it, and a limit whose waiting
    /// calls all stopped is whole again (its holes gone with them).
    #[tokio::test]
    async fn a_limit_whose_waiting_calls_all_stop_is_whole_again() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limiter = limiter_of(&backend, 1, Duration::from_secs(1), Duration::from_secs(10));
        assert_eq!(limiter.reserve().await, Ok(Duration::ZERO));
        let first_arrival = arrival(&limiter).await;
        let mut waiting = Vec::new();
        for _ in 0..3 {
            waiting.push(limiter.reserve_turn().await.expect("may wait"));
        }
        assert_eq!(arrival(&limiter).await, first_arrival + 3000 * MS);
        // In the middle first, then the latest.
        for turn in &waiting[..2] {
            assert!(limiter.release_of(*turn).run().await.expect("release"));
            assert_eq!(arrival(&limiter).await, first_arrival + 3000 * MS);
        }
        assert!(limiter.release_of(waiting[2]).run().await.expect("release"));
        assert_eq!(arrival(&limiter).await, first_arrival);
        let holes = limiter.holes.as_str();
        let left = limiter.backend.client.command(&["EXISTS", holes]).await.expect("EXISTS");
        assert_eq!(left, Reply::Integer(0), "holes left behind");
        let next = limiter.reserve().await.expect("may wait");
        assert!(next > Duration::from_millis(900), "{next:?}");
        assert_eq!(arrival(&limiter).await, first_arrival + 1000 * MS);
    }

    /// A turn reserved while Redis did not answer is this replica's own limiter's, and goes
    /// back to it, come or not.
    #[tokio::test]
    async fn a_turn_of_the_local_limiter_goes_back_to_it() {
        let mut server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        server.stop();
        let limiter = limiter_of(&backend, 1, Duration::from_secs(60), Duration::ZERO);
        let first = limiter.reserve_turn().await.expect("at once");
        assert_eq!((first.wait(), first.mark()), (Duration::ZERO, 0), "a local turn");
        assert!(limiter.reserve().await.is_err(), "one call a minute");
        limiter.release(first);
        assert_eq!(limiter.reserve().await, Ok(Duration::ZERO));
    }

    /// The reservation and give-back scripts of the release before holes (commit 64694ff),
    /// as replicas not yet upgraded run them during a rolling upgrade: a turn's arrival time
    /// under `a{n}`, what was given back before it under `g{n}`, the latest reservation's
    /// time under `last`.
    const RESERVE_BEFORE_HOLES: Script = Script {
        name: "ratelimit_reserve_before_holes",
        source: r"
if redis.call('EXISTS', KEYS[5]) == 1 then return {-1, 0} end
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
local seq = now
local latest = tonumber(redis.call('HGET', KEYS[2], 'seq'))
if latest and latest >= seq then seq = latest + 1 end
local n = string.format('%.0f', seq)
redis.call('HSET', KEYS[2], 'seq', n, 'last', string.format('%.0f', now),
  'a' .. n, string.format('%.0f', after))
redis.call('ZADD', KEYS[3], n, n)
local full = redis.call('ZCARD', KEYS[3]) > tonumber(ARGV[4])
while true do
  local oldest = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not oldest or oldest == n then break end
  local a = tonumber(redis.call('HGET', KEYS[2], 'a' .. oldest))
  local g = tonumber(redis.call('HGET', KEYS[2], 'g' .. oldest)) or 0
  if not full and a and a - g > now then break end
  redis.call('ZREM', KEYS[3], oldest)
  redis.call('HDEL', KEYS[2], 'a' .. oldest, 'g' .. oldest)
  full = false
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
redis.call('SET', KEYS[4], n, 'PX', ttl)
return {1, wait, seq}
",
    };

    /// See [`RESERVE_BEFORE_HOLES`].
    const RELEASE_BEFORE_HOLES: Script = Script {
        name: "ratelimit_release_before_holes",
        source: r"
local n = ARGV[1]
local a = tonumber(redis.call('HGET', KEYS[2], 'a' .. n))
if not a then return 0 end
local g = tonumber(redis.call('HGET', KEYS[2], 'g' .. n)) or 0
redis.call('ZREM', KEYS[3], n)
redis.call('HDEL', KEYS[2], 'a' .. n, 'g' .. n)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat or tat <= now then return 0 end
local last = tonumber(redis.call('HGET', KEYS[2], 'last')) or now
local give = a - g - last
if give > interval then give = interval end
if give <= 0 then return 0 end
local given = string.format('%.0f', give)
for _, later in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. n, '+inf')) do
  redis.call('HINCRBY', KEYS[2], 'g' .. later, given)
end
local after = tat - give
if after <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
local ttl = math.floor((after - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', after), 'PX', ttl)
return 1
",
    };

    /// A turn reserved with [`RESERVE_BEFORE_HOLES`] by a replica not yet upgraded; its
    /// number.
    async fn reserve_before_holes(limiter: &RedisLimiter, id: &str) -> u64 {
        let (record, withdrawn) = limiter.keys_of(id);
        let keys = [&limiter.key, &limiter.state, &limiter.open, &record, &withdrawn];
        let keys: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let interval = limiter.limit.per / limiter.limit.calls;
        let args = [micros(interval), micros(limiter.limit.per), micros(limiter.limit.wait)];
        let args = [args[0].as_bytes(), args[1].as_bytes(), args[2].as_bytes(), b"1024"];
        let reply = limiter.backend.client.eval(
            &RESERVE_BEFORE_HOLES,
            &keys,
            &args,
            Duration::from_secs(2),
        );
        let reply = reply.await.expect("the old reservation");
        let Some([Reply::Integer(1), _, Reply::Integer(n)]) = reply.as_array() else {
            panic!("no turn: {reply:?}")
        };
        u64::try_from(*n).expect("a turn's number")
    }

    /// During a rolling upgrade the replicas not yet upgraded give their turns back with
    /// the script before holes, which moves the arrival time back by the turn's interval
    /// under the turns reserved after it: after an upgraded replica's reservation, it let
    /// the next call have the instant of that reservation. An upgraded reservation forgets
    /// the old turns' entries, so that such a turn stays spent for its period (the safe
    /// side), and an old turn reserved after every upgraded one still gives back its
    /// interval.
    #[tokio::test]
    async fn a_turn_given_back_by_a_replica_not_yet_upgraded_moves_no_later_turn() {
        let server = RedisServer::start();
        let backend = RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url");
        let limiter = limiter_of(&backend, 1, Duration::from_secs(1), Duration::from_secs(10));
        let _first = reserve_before_holes(&limiter, "old-1").await;
        let waiting = reserve_before_holes(&limiter, "old-2").await;
        let also_waiting = reserve_before_holes(&limiter, "old-3").await;
        let upgraded = limiter.reserve_turn().await.expect("may wait");
        let latest = arrival(&limiter).await;
        let release = limiter.release_of(Turn::new(Duration::ZERO).with_mark(waiting));
        let keys: Vec<&str> = release.keys[..3].iter().map(String::as_str).collect();
        let args = [release.args[0].as_bytes(), release.args[1].as_bytes()];
        let given = limiter.backend.client.eval(
            &RELEASE_BEFORE_HOLES,
            &keys,
            &args,
            Duration::from_secs(2),
        );
        assert_eq!(
            given.await.expect("the old give-back"),
            Reply::Integer(0),
            "an old turn gave back"
        );
        assert_eq!(arrival(&limiter).await, latest, "the arrival time moved under a later turn");
        // The next call comes a second after the upgraded replica's.
        let next = limiter.reserve_turn().await.expect("may wait");
        assert!(
            next.wait() >= upgraded.wait() + Duration::from_millis(990),
            "{upgraded:?} {next:?}"
        );
        // An old turn between two upgraded ones gives nothing back either.
        let between = reserve_before_holes(&limiter, "old-4").await;
        let _after = limiter.reserve_turn().await.expect("may wait");
        let latest = arrival(&limiter).await;
        let release = limiter.release_of(Turn::new(Duration::ZERO).with_mark(between));
        let args = [release.args[0].as_bytes(), release.args[1].as_bytes()];
        let given = limiter.backend.client.eval(
            &RELEASE_BEFORE_HOLES,
            &keys,
            &args,
            Duration::from_secs(2),
        );
        assert_eq!(given.await.expect("the old give-back"), Reply::Integer(0), "a turn between");
        assert_eq!(arrival(&limiter).await, latest);
        // An old turn reserved after the upgraded ones, the latest, gives its interval back;
        // one reserved before them gives nothing though an old reservation came since (the
        // old give-back then measures from that reservation's time).
        let last_old = reserve_before_holes(&limiter, "old-5").await;
        let before = arrival(&limiter).await;
        for (turn, gives) in [(also_waiting, 0), (last_old, 1)] {
            let release = limiter.release_of(Turn::new(Duration::ZERO).with_mark(turn));
            let args = [release.args[0].as_bytes(), release.args[1].as_bytes()];
            let given = limiter.backend.client.eval(
                &RELEASE_BEFORE_HOLES,
                &keys,
                &args,
                Duration::from_secs(2),
            );
            assert_eq!(
                given.await.expect("the old give-back"),
                Reply::Integer(gives),
                "turn {turn}"
            );
        }
        assert_eq!(arrival(&limiter).await, before - 1000 * MS);
    }
}
