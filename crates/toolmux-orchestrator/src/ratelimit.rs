//! Rate limits: at most `calls` calls per period, on one tool or on every tool of a
//! provider together, as a generic cell rate (GCRA): calls are spread over the period, and
//! up to `calls` may come at once after a quiet spell.
//!
//! A call that stops before it reaches its provider (cancelled, past its deadline, dropped,
//! or refused by its queue), whether or not its [`Turn`] has come, gives the turn back
//! ([`Limiter::release`]): it never ran, so it takes none of the limit, and the calls after
//! it are not delayed by it. Giving a turn back never brings two turns closer than the
//! limit spaces them: the turns reserved after it keep their times, and the time given
//! back goes to the next call that fits in it ([`RateLimiter`]).
//!
//! A limit's state lives in a [`RateLimitBackend`]: this process ([`LocalRateLimits`], the
//! default), or a store every replica shares (toolmux-redis), so that a limit holds for
//! all of them together.

use crate::config::RateLimit;
use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet};
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
    /// be made (cancelled, past its deadline, or refused by its queue, while it waited for
    /// its turn or, after it, for a queue slot), so that it takes none of the limit's
    /// capacity. A turn that has come is given back too, as far as it still weighs on the
    /// calls to come (never more). The turns reserved after it keep their times, so what
    /// is given back never lets two calls come closer than the limit spaces them. Never
    /// waits: a limiter whose state is elsewhere gives it back in a task.
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
    /// The number a [`RateLimiter`] gave the reservation (zero: none).
    seq: u64,
}

impl Turn {
    /// A turn `wait` from now, with no mark.
    pub fn new(wait: Duration) -> Turn {
        Turn { wait, mark: 0, seq: 0 }
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
        self.reserve_turn_at(Instant::now())
    }

    fn release(&self, turn: Turn) {
        self.release_at(Instant::now(), turn);
    }
}

/// One limit's state in this process: when the next call would be due were the calls
/// evenly spread, the turns not yet known to be used, and the turns given back in the
/// middle of those reserved.
///
/// Each turn holds one interval of the limit's theoretical time, `[base, base + interval)`
/// (GCRA's), and comes at `base + interval - per` (at once if that is past): the intervals
/// of the turns handed out never overlap, and each turn comes at most `per - interval`
/// before its interval and never after its start. So any `n` turns are at least
/// `(n - calls)` intervals apart from the first to the last: with one call per period,
/// one period between any two. A turn given back keeps that: the turns after it keep
/// their times (their calls are waiting for them), so its interval is a hole that the next
/// call made before the hole's start takes, rather than the next due time moving back
/// under the turns already reserved (which handed the given-back time to a new call at the
/// instant of the latest one).
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    /// `per / calls`: the spacing of evenly spread calls.
    interval: Duration,
    state: Mutex<State>,
}

/// The most turns a limiter remembers for giving back, and the most holes it keeps: past
/// it the oldest is forgotten (and gives nothing back), so that a limit under a flood of
/// calls keeps a bounded state.
const MAX_OPEN_TURNS: usize = 4096;

#[derive(Debug, Default)]
struct State {
    /// The theoretical arrival time of the next call; `None` before the first.
    // Invariant: the end of the latest interval held by an open turn or a hole, or later.
    next_due: Option<Instant>,
    /// The number of the latest turn reserved ([`Turn`]'s `seq`, from 1).
    reserved: u64,
    /// The turns that may still give something back, by number: the start of each one's
    /// interval (it may have been used: the limiter is not told).
    open: BTreeMap<u64, Instant>,
    /// The starts of the intervals given back before the latest one reserved, whose ends
    /// are not yet past.
    // Invariant: each ends at or before `next_due`.
    holes: BTreeSet<Instant>,
}

impl RateLimiter {
    /// A limiter for `limit` with no calls made yet.
    pub fn new(limit: RateLimit) -> Self {
        // Held to about thirty years (`Duration::MAX`: one call for ever), so that due
        // times stay within what the clock can hold: the next call is never due more than
        // `per + wait` ahead.
        let limit = RateLimit {
            per: limit.per.min(crate::FOREVER),
            wait: limit.wait.min(crate::FOREVER),
            ..limit
        };
        let interval = limit.per / limit.calls.max(1);
        RateLimiter { limit, interval, state: Mutex::new(State::default()) }
    }

    /// Reserves a call made at `now`: how long to wait before making it (zero: at once),
    /// or, when that wait is longer than the limit allows waiting, `Err` with it (and
    /// nothing reserved).
    pub fn reserve_at(&self, now: Instant) -> Result<Duration, Duration> {
        self.reserve_turn_at(now).map(|turn| turn.wait())
    }

    /// [`RateLimiter::reserve_at`], as the turn to give back ([`RateLimiter::release_at`]).
    ///
    /// The call takes the earliest hole left by a turn given back whose interval has not
    /// started yet, else the interval at the next due time (or now, if that is past).
    pub fn reserve_turn_at(&self, now: Instant) -> Result<Turn, Duration> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // A hole that has started cannot be taken: the call's turn would come after the
        // start of its interval, as close to the next turn as it likes.
        let hole = state.holes.range(now..).next().copied();
        let base = hole.unwrap_or_else(|| state.next_due.map_or(now, |due| due.max(now)));
        let after = base + self.interval;
        // Up to `calls` calls fit in one period: a call is allowed once `after - per` is
        // past.
        let wait = after
            .checked_sub(self.limit.per)
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        if wait > self.limit.wait {
            // The next due time is later than any hole: refused either way.
            return Err(wait);
        }
        match hole {
            Some(start) => {
                state.holes.remove(&start);
            }
            None => state.next_due = Some(after),
        }
        // A turn or a hole whose interval is past gives nothing back ever again (see
        // `release_at`): forgotten.
        let interval = self.interval;
        while let Some(&start) = state.holes.first()
            && start + interval <= now
        {
            state.holes.pop_first();
        }
        let mut full = state.open.len() >= MAX_OPEN_TURNS;
        while let Some(oldest) = state.open.first_entry()
            && (full || *oldest.get() + interval <= now)
        {
            oldest.remove();
            full = false;
        }
        state.reserved += 1;
        let seq = state.reserved;
        state.open.insert(seq, base);
        Ok(Turn { wait, mark: 0, seq })
    }

    /// Gives back `turn`, reserved by [`RateLimiter::reserve_turn_at`] for a call that was
    /// not made, at `now`.
    ///
    /// The turns reserved after it keep their times, so only what is free of them comes
    /// back. The latest turn's interval ends at the next due time: that moves back to its
    /// start, and on over the holes it then reaches (the turns given back before it), so
    /// that a limit whose waiting calls all stopped is whole again. A turn in the middle
    /// leaves a hole, which the next call made before the hole's start takes
    /// ([`RateLimiter::reserve_turn_at`]). A turn that has come, whose call then waited for
    /// a queue slot and never ran, is given back the same way: as a hole it is already
    /// past taking, but it still lets the next due time move back past it.
    pub fn release_at(&self, now: Instant, turn: Turn) {
        if turn.seq == 0 {
            // Not reserved by this limiter.
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(base) = state.open.remove(&turn.seq) else { return };
        let end = base + self.interval;
        if end <= now {
            // Its interval is past: it weighs on no call to come.
            return;
        }
        if state.next_due != Some(end) {
            if state.holes.len() >= MAX_OPEN_TURNS {
                state.holes.pop_first();
            }
            state.holes.insert(base);
            return;
        }
        let mut due = base;
        while let Some(&start) = state.holes.last()
            && start + self.interval >= due
        {
            state.holes.pop_last();
            due = due.min(start);
        }
        state.next_due = Some(due);
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
    async fn turns_are_given_back_whether_or_not_they_came() {
        let l = limiter(2, 1000, 10_000);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let reserve = |at| l.reserve_turn_at(at).map(|turn| (turn.wait(), turn));
        let (_, first) = reserve(t0).unwrap();
        let (_, second) = reserve(t0).unwrap();
        let (wait, third) = reserve(t0).unwrap();
        assert_eq!(wait, ms(500));
        let (wait, fourth) = reserve(t0).unwrap();
        assert_eq!(wait, ms(1000));
        // Both waiting calls stop at 100 ms: the next call takes the first of their turns.
        let at = t0 + ms(100);
        l.release_at(at, fourth);
        l.release_at(at, third);
        assert_eq!(l.reserve_at(at), Ok(ms(400)));
        // The second call's turn came at once, but it never ran (it waited for a queue slot
        // and was cancelled): its turn is given back all the same, and the next call takes
        // the turn it would have had without it, at once beside the first call's.
        l.release_at(at, second);
        assert_eq!(l.reserve_at(at), Ok(Duration::ZERO));
        // A turn is given back once.
        l.release_at(at, second);
        assert_eq!(l.reserve_at(at), Ok(ms(900)));
        // A turn not reserved by this limiter gives nothing back.
        l.release_at(at, Turn::new(ms(900)));
        assert_eq!(l.reserve_at(at), Ok(ms(1400)));
        // Calls after a quiet spell were not delayed by the first call: its turn, given
        // back then, gives nothing.
        let later = t0 + ms(5000);
        assert_eq!(l.reserve_at(later), Ok(Duration::ZERO));
        l.release_at(later, first);
        assert_eq!(l.reserve_at(later), Ok(Duration::ZERO));
        assert_eq!(l.reserve_at(later), Ok(ms(500)), "two calls at once, no more");
    }

    /// A turn that came, given back after the calls slowed down, lets no call come closer
    /// to the turns reserved after it than the limit spaces them.
    #[tokio::test(start_paused = true)]
    async fn a_turn_given_back_late_brings_no_call_closer_to_the_next() {
        let l = limiter(1, 1000, 10_000);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let first = l.reserve_turn_at(t0).unwrap();
        // At 600 ms the next call waits 400 ms for its turn (the first call's interval).
        assert_eq!(l.reserve_at(t0 + ms(600)), Ok(ms(400)));
        // The first call never ran, but the call at 600 ms keeps its turn at 1 s: a call at
        // 700 ms comes a second after it, at 2 s (it came at 1.6 s, 0.6 s after it).
        l.release_at(t0 + ms(700), first);
        assert_eq!(l.reserve_at(t0 + ms(700)), Ok(ms(1300)));
    }

    /// A turn given back between turns still reserved goes to the next call, in its own
    /// place: one call per second stays one call per second, where the next call took a
    /// turn at the same instant as the latest one reserved.
    #[tokio::test(start_paused = true)]
    async fn a_turn_given_back_between_others_goes_to_the_next_call_in_its_place() {
        let l = limiter(1, 1000, 10_000);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let reserve = |at| l.reserve_turn_at(at).unwrap();
        assert_eq!(reserve(t0).wait(), Duration::ZERO);
        let second = reserve(t0);
        let third = reserve(t0);
        assert_eq!((second.wait(), third.wait()), (ms(1000), ms(2000)));
        let at = t0 + ms(100);
        l.release_at(at, second);
        // The next call takes the second's turn at 1 s, not one at 2 s beside the third.
        let fourth = reserve(at);
        assert_eq!(fourth.wait(), ms(900));
        assert_eq!(reserve(at).wait(), ms(2900));
        // The third call stops too: the next call takes its turn, at 2 s.
        l.release_at(at, third);
        assert_eq!(l.reserve_at(at), Ok(ms(1900)));
        assert_eq!(l.reserve_at(at), Ok(ms(3900)));
        // A hole whose interval has started is no call's any more: the turn at 1 s given
        // back at 1.5 s leaves the next call its own turn at 5 s.
        l.release_at(t0 + ms(1500), fourth);
        assert_eq!(l.reserve_at(t0 + ms(1500)), Ok(ms(3500)));
    }

    /// When the latest turn is given back, the next due time moves back over the holes
    /// left before it: a limit whose waiting calls all stopped is whole again.
    #[tokio::test(start_paused = true)]
    async fn a_limit_whose_waiting_calls_all_stop_is_whole_again() {
        let l = limiter(1, 1000, 10_000);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(l.reserve_at(t0), Ok(Duration::ZERO));
        let waiting: Vec<Turn> = (0..3).map(|_| l.reserve_turn_at(t0).unwrap()).collect();
        let at = t0 + ms(100);
        // In the middle first, then the latest.
        l.release_at(at, waiting[0]);
        l.release_at(at, waiting[1]);
        assert_eq!(l.reserve_at(at), Ok(ms(900)));
        l.release_at(at, waiting[2]);
        assert_eq!(l.reserve_at(at), Ok(ms(1900)));
        assert_eq!(l.reserve_at(at), Ok(ms(2900)));
    }
}
