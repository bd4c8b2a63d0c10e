//! Rate limits: at most `calls` calls per period, on one tool or on every tool of a
//! provider together, as a generic cell rate (GCRA): calls are spread over the period, and
//! up to `calls` may come at once after a quiet spell.
//!
//! A call that waits for its [`Turn`] and stops before it comes (cancelled, past its
//! deadline, dropped) gives it back ([`Limiter::release`]): it never ran, so it takes none
//! of the limit, and the calls after it are not delayed by it.
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
    /// Reserves a call made now: its [`Turn`] (how long to wait before making it, zero: at
    /// once), or, when that wait is longer than the limit lets a call wait, `Err` with it
    /// (and nothing reserved).
    async fn reserve_turn(&self) -> Result<Turn, Duration>;

    /// Gives back `turn`, reserved by [`Limiter::reserve_turn`] for a call that will not
    /// be made (cancelled, or past its deadline, while it waited for its turn), so that it
    /// takes none of the limit's capacity. A turn that has already come is not given
    /// back. Never waits: a limiter whose state is elsewhere gives it back in a task.
    fn release(&self, turn: Turn);

    /// Reserves a call made now, as [`Limiter::reserve_turn`]: how long to wait before
    /// making it.
    async fn reserve(&self) -> Result<Duration, Duration> {
        self.reserve_turn().await.map(|turn| turn.wait())
    }
}

/// A call's place under a rate limit: how long it waits for it, and what its limiter needs
/// to give it back ([`Limiter::release`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    wait: Duration,
    mark: u64,
}

impl Turn {
    /// A turn `wait` from now, with no mark.
    pub fn new(wait: Duration) -> Turn {
        Turn { wait, mark: 0 }
    }

    /// The turn with the limiter's own note of it (for a shared limiter, where it put the
    /// limit's state); opaque to everyone else.
    pub fn with_mark(self, mark: u64) -> Turn {
        Turn { mark, ..self }
    }

    /// How long the call waits for its turn (zero: none).
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// The limiter's note set by [`Turn::with_mark`] (zero without one).
    pub fn mark(&self) -> u64 {
        self.mark
    }
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
    async fn reserve_turn(&self) -> Result<Turn, Duration> {
        self.reserve_at(Instant::now()).map(Turn::new)
    }

    fn release(&self, turn: Turn) {
        self.release_at(Instant::now(), turn);
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

    /// Gives back `turn`, reserved at most by [`RateLimiter::reserve_at`] and not yet come
    /// at `now`: the next call is due one interval earlier.
    ///
    /// Exact while the turn has not come: until then the next call's due time stays past
    /// `now` (the turn's own due time is `per` after it), so every reservation since has
    /// moved it on by one whole interval and taking one off undoes just this turn's.
    pub fn release_at(&self, now: Instant, turn: Turn) {
        if turn.wait().is_zero() {
            // Its turn was now: it has come.
            return;
        }
        let mut next_due = self.next_due.lock().unwrap_or_else(|e| e.into_inner());
        let Some(due) = *next_due else { return };
        // The latest turn reserved comes at `due - per`; once that is past, every turn has
        // come (this one too) and there is nothing left to give back.
        if due.checked_sub(self.limit.per).is_none_or(|latest| latest <= now) {
            return;
        }
        *next_due = Some(due.checked_sub(self.interval).unwrap_or(now).max(now));
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

    #[tokio::test(start_paused = true)]
    async fn turns_not_come_are_given_back_and_turns_come_are_not() {
        let l = limiter(2, 1000, 10_000);
        let t0 = Instant::now();
        let turn = |wait| Turn::new(Duration::from_millis(wait));
        assert_eq!(l.reserve_at(t0), Ok(Duration::ZERO));
        assert_eq!(l.reserve_at(t0), Ok(Duration::ZERO));
        assert_eq!(l.reserve_at(t0), Ok(Duration::from_millis(500)));
        assert_eq!(l.reserve_at(t0), Ok(Duration::from_millis(1000)));
        // Both waiting calls stop at 100 ms: the next call takes the first of their turns.
        let at = t0 + Duration::from_millis(100);
        l.release_at(at, turn(1000));
        l.release_at(at, turn(500));
        assert_eq!(l.reserve_at(at), Ok(Duration::from_millis(400)));
        // A turn with no wait came at once: giving it back gives nothing.
        l.release_at(at, turn(0));
        assert_eq!(l.reserve_at(at), Ok(Duration::from_millis(900)));
        // Every turn has come by 1.1 s (the last at 1 s): none is given back then.
        let after_turn = t0 + Duration::from_millis(1100);
        l.release_at(after_turn, turn(900));
        assert_eq!(l.reserve_at(after_turn), Ok(Duration::from_millis(400)));
    }
}
