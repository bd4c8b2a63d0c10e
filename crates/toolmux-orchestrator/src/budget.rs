//! Per-run state: the run budget (calls, tool time) and the context-token budget.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// A run nobody has called a tool in for this long may be forgotten (its counters start
/// again at zero if it comes back).
pub(crate) const RUN_IDLE_SECS: u64 = 3600;

/// Runs kept before the first sweep for idle ones.
const SWEEP_FROM: usize = 1024;

/// Seconds on a monotonic clock that starts with the process.
pub(crate) fn now_secs() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs()
}

/// The runs an orchestrator keeps counters of. Every MCP session, stateless client and
/// agent run is one, and nothing need say when one ends: once there are many, those idle
/// for [`RUN_IDLE_SECS`] with no call in flight are swept away when a new one starts.
#[derive(Debug)]
pub(crate) struct Runs {
    map: HashMap<Arc<str>, Arc<RunState>>,
    /// How many runs to hold before the next sweep: twice what a sweep left, so that
    /// sweeping costs O(1) per new run.
    sweep_at: usize,
}

impl Default for Runs {
    fn default() -> Self {
        Runs { map: HashMap::new(), sweep_at: SWEEP_FROM }
    }
}

impl Runs {
    pub(crate) fn get(&self, run_id: &str) -> Option<&Arc<RunState>> {
        self.map.get(run_id)
    }

    /// The state of `run_id`, made if new, marked as used at `now` (seconds of
    /// [`now_secs`]).
    pub(crate) fn state(&mut self, run_id: &str, now: u64) -> Arc<RunState> {
        if let Some(state) = self.map.get(run_id) {
            state.last_used.store(now, Ordering::Relaxed);
            return state.clone();
        }
        if self.map.len() >= self.sweep_at {
            // A state held elsewhere belongs to a call in flight: kept whatever its age.
            self.map.retain(|_, state| {
                Arc::strong_count(state) > 1
                    || now.saturating_sub(state.last_used.load(Ordering::Relaxed)) < RUN_IDLE_SECS
            });
            self.sweep_at = (self.map.len() * 2).max(SWEEP_FROM);
        }
        let state = Arc::new(RunState::new());
        state.last_used.store(now, Ordering::Relaxed);
        self.map.insert(Arc::from(run_id), state.clone());
        state
    }

    pub(crate) fn remove(&mut self, run_id: &str) {
        self.map.remove(run_id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Counters of one run. Lives until the run is ended or, idle, swept ([`Runs`]).
#[derive(Debug, Default)]
pub struct RunState {
    /// When a call last used it, in seconds of [`now_secs`].
    last_used: AtomicU64,
    pub(crate) calls: AtomicU64,
    pub(crate) tool_time_ms: AtomicU64,
    pub(crate) context_tokens: AtomicU64,
    /// A budget set for this run, overriding the configured one; `u64::MAX` means unset.
    pub(crate) context_budget_override: AtomicU64,
    pub(crate) context_exceeded: AtomicBool,
}

/// What a caller can read about a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RunFlags {
    /// Calls that reached a provider.
    pub calls: u64,
    /// Milliseconds spent in providers.
    pub tool_time_ms: u64,
    /// Estimated tokens of outputs accepted so far.
    pub context_tokens: u64,
    /// A tool output was refused because the context-token budget was exceeded.
    pub context_budget_exceeded: bool,
}

impl RunState {
    pub(crate) fn new() -> Self {
        RunState { context_budget_override: AtomicU64::new(u64::MAX), ..RunState::default() }
    }

    pub(crate) fn flags(&self) -> RunFlags {
        RunFlags {
            calls: self.calls.load(Ordering::Relaxed),
            tool_time_ms: self.tool_time_ms.load(Ordering::Relaxed),
            context_tokens: self.context_tokens.load(Ordering::Relaxed),
            context_budget_exceeded: self.context_exceeded.load(Ordering::Relaxed),
        }
    }

    /// Accepts `tokens` more under `budget`, or refuses and sets the flag; returns what was
    /// left when refused.
    pub(crate) fn take_context_tokens(
        &self,
        tokens: u64,
        configured: Option<u64>,
    ) -> Result<(), u64> {
        let budget = match self.context_budget_override.load(Ordering::Relaxed) {
            u64::MAX => match configured {
                Some(b) => b,
                None => return Ok(()),
            },
            set => set,
        };
        let before = self.context_tokens.fetch_add(tokens, Ordering::Relaxed);
        if before.saturating_add(tokens) > budget {
            self.context_tokens.fetch_sub(tokens, Ordering::Relaxed);
            self.context_exceeded.store(true, Ordering::Relaxed);
            return Err(budget.saturating_sub(before));
        }
        Ok(())
    }
}

impl RunState {
    /// Spends `tokens` whatever the budget (an output that must reach the caller), setting
    /// the flag: the run's next output is refused.
    pub(crate) fn spend_context_tokens(&self, tokens: u64) {
        self.context_tokens.fetch_add(tokens, Ordering::Relaxed);
        self.context_exceeded.store(true, Ordering::Relaxed);
    }
}

/// Estimated tokens of a text: a byte count divided by four, rounded up, the usual rule of
/// thumb for English and code.
pub fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_budget() {
        let run = RunState::new();
        assert!(run.take_context_tokens(60, Some(100)).is_ok());
        assert_eq!(run.take_context_tokens(50, Some(100)), Err(40));
        assert!(run.flags().context_budget_exceeded);
        assert!(run.take_context_tokens(40, Some(100)).is_ok());
        assert!(run.take_context_tokens(1_000_000, None).is_ok());
        assert_eq!(estimate_tokens(9), 3);
    }

    /// Runs idle for an hour are forgotten once many have gathered, except one with a call
    /// in flight; a run in use keeps its counters.
    #[test]
    fn idle_runs_are_swept() {
        let mut runs = Runs::default();
        let held = runs.state("held", 0);
        runs.state("busy", 0).calls.store(7, Ordering::Relaxed);
        for i in 0..SWEEP_FROM - 2 {
            runs.state(&format!("old-{i}"), 0);
        }
        // An hour later `busy` is used again: it stays, with its counters.
        let later = RUN_IDLE_SECS + 5;
        runs.state("busy", later);
        assert_eq!(runs.len(), SWEEP_FROM);
        runs.state("new", later);
        assert_eq!(runs.len(), 3, "held, busy and new are left");
        assert!(Arc::ptr_eq(&runs.state("held", later), &held));
        assert_eq!(runs.get("busy").map(|r| r.flags().calls), Some(7));
        // Recent runs are never swept.
        let mut runs = Runs::default();
        for i in 0..SWEEP_FROM + 10 {
            runs.state(&format!("r-{i}"), 100);
        }
        assert_eq!(runs.len(), SWEEP_FROM + 10);
    }
}
