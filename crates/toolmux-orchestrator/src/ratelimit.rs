//! Rate limits: at most `calls` calls per period, on one tool or on every tool of a
//! provider together, as a generic cell rate (GCRA): calls are spread over the period, and
//! up to `calls` may come at once after a quiet spell.

//!
//! A limit's state lives in a [`RateLimitBackend`]: this process ([`LocalRateLimits`], the
//! default), or a store every replica shares (toolmux-redis), so that a limit holds for
//! all of them together.

use crate::config::RateLimit;
use async_trait::async_trait;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Where rate limits keep their state.
pub trait RateLimitBackend: Send + Sync + fmt::Debug {
    /// The limiter named `key` (`tool:{full name}` or `provider:{namespace}`) for `limit`.
    fn limiter(&self, key: &str, limit: RateLimit) -> Arc<dyn Limiter>;
}

/// One rate limit.
#[async_trait]
pub trait Limiter: Send + Sync + fmt::Debug {
    /// Reserves a call made now: how long to wait before making it (zero: at once), or,
    /// when that wait is longer than the limit lets a call wait, `Err` with it (and nothing
    /// reserved).
    async fn reserve(&self) -> Result<Duration, Duration>;
}

/// Rate limits kept in this process (the default backend).
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalRateLimits;

impl RateLimitBackend for LocalRateLimits {
    fn limiter(&self, _key: &str, limit: RateLimit) -> Arc<dyn Limiter> {
        Arc::new(RateLimiter::new(limit))
    }
}

#[async_trait]
impl Limiter for RateLimiter {
    async fn reserve(&self) -> Result<Duration, Duration> {
        self.reserve_at(Instant::now())
    }
}

/// One limit's state in this process: when the next call would be due were the calls
/// evenly spread.
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    /// `per / calls`: the spacing of evenly spread calls.
    interval: Duration,
    /// The theoretical arrival time of the next call; `None` before the first.
    next_due: Mutex<Option<Instant>>,
}

impl RateLimiter {
    /// A limiter for `limit` with no calls made yet.
    pub fn new(limit: RateLimit) -> Self {
        let interval = limit.per / limit.calls.max(1);
        RateLimiter { limit, interval, next_due: Mutex::new(None) }
    }

    /// Reserves a call made at `now`: how long to wait before making it (zero: at once),
    /// or, when that wait is longer than the limit allows waiting, `Err` with it (and
    /// nothing reserved).
    pub fn reserve_at(&self, now: Instant) -> Result<Duration, Duration> {
        let mut next_due = self.next_due.lock().unwrap_or_else(|e| e.into_inner());
        let base = next_due.map_or(now, |due| due.max(now));
        let after = base + self.interval;
        // Up to `calls` calls fit in one period: a call is allowed once `after - per` is
        // past.
        let wait = after
            .checked_sub(self.limit.per)
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        if wait > self.limit.wait {
            return Err(wait);
        }
        *next_due = Some(after);
        Ok(wait)
    }

    /// The limit in words: `10 calls per 1m`.
    pub fn describe(&self) -> String {
        describe(&self.limit)
    }
}

/// `limit` in words: `10 calls per 1m`.
pub fn describe(limit: &RateLimit) -> String {
    let per = limit.per;
    let per = if per.as_millis().is_multiple_of(60_000) && per >= Duration::from_secs(60) {
        format!("{}m", per.as_secs() / 60)
    } else if per.as_millis().is_multiple_of(1000) {
        format!("{}s", per.as_secs())
    } else {
        format!("{}ms", per.as_millis())
    };
    let s = if limit.calls == 1 { "" } else { "s" };
    format!("{} call{s} per {per}", limit.calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(calls: u32, per_ms: u64, wait_ms: u64) -> RateLimiter {
        RateLimiter::new(RateLimit {
            calls,
            per: Duration::from_millis(per_ms),
            wait: Duration::from_millis(wait_ms),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_calls_then_one_per_interval() {
        let l = limiter(2, 1000, 0);
        let t0 = Instant::now();
        assert_eq!(l.reserve_at(t0), Ok(Duration::ZERO));
        assert_eq!(l.reserve_at(t0), Ok(Duration::ZERO));
        assert_eq!(l.reserve_at(t0), Err(Duration::from_millis(500)));
        // Refused calls reserve nothing.
        assert_eq!(l.reserve_at(t0 + Duration::from_millis(499)), Err(Duration::from_millis(1)));
        assert_eq!(l.reserve_at(t0 + Duration::from_millis(500)), Ok(Duration::ZERO));
        // After a quiet period the whole burst is back, never more.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(l.reserve_at(later), Ok(Duration::ZERO));
        assert_eq!(l.reserve_at(later), Ok(Duration::ZERO));
        assert!(l.reserve_at(later).is_err());
        assert_eq!(l.describe(), "2 calls per 1s");
    }

    #[tokio::test(start_paused = true)]
    async fn calls_may_wait_their_turn() {
        let l = limiter(1, 60_000, 60_000);
        let t0 = Instant::now();
        assert_eq!(l.reserve_at(t0), Ok(Duration::ZERO));
        assert_eq!(l.reserve_at(t0), Ok(Duration::from_secs(60)));
        assert_eq!(l.reserve_at(t0), Err(Duration::from_secs(120)));
        assert_eq!(l.describe(), "1 call per 1m");
    }
}
