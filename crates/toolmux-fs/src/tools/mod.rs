//! The tools, one module each; each exposes its argument type, its description and a
//! function doing the work. `text` (encodings and line endings) and `spill` (private files
//! for full command output) are shared by several.

pub(crate) mod block;
pub(crate) mod canonical;
pub(crate) mod control;
pub(crate) mod edit;
pub(crate) mod glob;
pub(crate) mod grep;
pub(crate) mod ls;
pub(crate) mod notebook;
pub(crate) mod patch;
pub(crate) mod pty;
pub(crate) mod read;
pub(crate) mod shell;
pub(crate) mod spill;
pub(crate) mod tasks;
pub(crate) mod text;
pub(crate) mod undo;
pub(crate) mod write;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use toolmux_core::{ContentPart, ToolOutput};

/// The wall-clock time a walk (`grep`, `glob`) may take: past it the walk stops and
/// answers with what it found, saying so, rather than be cut off by the call's timeout
/// with nothing to show.
#[derive(Debug)]
pub(crate) struct Budget {
    started: Instant,
    deadline: Instant,
    over: AtomicBool,
}

impl Budget {
    /// `allowed` from now, but ending before `call_deadline` (the pipeline's limit of the
    /// call) by a tenth of the time left to it, at most a second, to answer in.
    pub(crate) fn new(allowed: Duration, call_deadline: Option<Instant>) -> Budget {
        let started = Instant::now();
        let mut deadline = started + allowed;
        if let Some(call) = call_deadline {
            let left = call.saturating_duration_since(started);
            let answer = (left / 10).min(Duration::from_secs(1));
            deadline = deadline.min(started + left - answer);
        }
        Budget { started, deadline, over: AtomicBool::new(false) }
    }

    /// Whether the time is up (checked against the clock until it is, then remembered).
    pub(crate) fn spent(&self) -> bool {
        if self.over.load(Ordering::Relaxed) {
            return true;
        }
        let over = Instant::now() >= self.deadline;
        if over {
            self.over.store(true, Ordering::Relaxed);
        }
        over
    }

    /// `output` with a last line saying the walk was stopped, when it was, and
    /// `timedOut` and `truncated` extras.
    pub(crate) fn mark(&self, output: ToolOutput, what: &str) -> ToolOutput {
        if !self.over.load(Ordering::Relaxed) {
            return output;
        }
        let took = self.deadline.saturating_duration_since(self.started);
        let footer = format!(
            "[the {what} stopped after {:.1}s (`fs.limits.searchTimeMs` or the call's time \
             limit): the results above are partial; narrow `path`, `glob` or the pattern]",
            took.as_secs_f64()
        );
        let mut output = output;
        match output.content.last_mut() {
            Some(ContentPart::Text { text }) => {
                text.push('\n');
                text.push_str(&footer);
            }
            _ => output.content.push(ContentPart::Text { text: footer }),
        }
        output
            .with_extra("timedOut", serde_json::json!(true))
            .with_extra("truncated", serde_json::json!(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_ends_before_the_call_does() {
        let now = Instant::now();
        let budget = Budget::new(Duration::from_secs(30), Some(now + Duration::from_secs(5)));
        let ends = budget.deadline.duration_since(now);
        assert!(
            ends > Duration::from_millis(4400) && ends < Duration::from_millis(4510),
            "{ends:?}"
        );
        let budget = Budget::new(Duration::from_secs(30), Some(now + Duration::from_secs(60)));
        assert!(budget.deadline.duration_since(now) < Duration::from_millis(30_010));
        // A call past its deadline leaves no time at all, and the walk stops at once.
        let budget = Budget::new(Duration::from_secs(30), Some(now));
        assert!(budget.spent());
        assert!(!Budget::new(Duration::from_secs(30), None).spent());
    }
}
