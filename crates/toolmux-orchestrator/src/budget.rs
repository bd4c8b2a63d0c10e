//! Per-run state: the run budget (calls, tool time) and the context-token budget.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counters of one run. Lives as long as the orchestrator or until the run is ended.
#[derive(Debug, Default)]
pub struct RunState {
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
}
