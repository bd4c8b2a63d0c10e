//! Why a call failed, sorted by who must act on it.

use serde::{Deserialize, Serialize};
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

/// Who must act on a [`ToolError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Party {
    /// The caller: fix the name or the arguments and call again.
    Caller,
    /// Policy said no (denied, timeout, budget, busy), or a stage of the gateway's own
    /// failed (a before- or after-hook that panicked): change configuration or wait.
    Policy,
    /// The provider failed (transport, protocol, remote error).
    Provider,
}

/// One schema violation in a call's arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// JSON pointer to the offending value (`""` for the whole object).
    pub pointer: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = if self.pointer.is_empty() { "/" } else { &self.pointer };
        write!(f, "at {at}: {}", self.message)
    }
}

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a call failed. Every message names the tool, queue or provider concerned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// No tool has this name.
    #[error("unknown tool `{name}`{}", did_you_mean(.suggestions))]
    UnknownTool {
        /// The name asked for.
        name: String,
        /// The closest existing names, best first.
        suggestions: Vec<String>,
    },
    /// No prompt has this name.
    #[error("unknown prompt `{name}`{}", did_you_mean(.suggestions))]
    UnknownPrompt {
        /// The name asked for.
        name: String,
        /// The closest existing names, best first.
        suggestions: Vec<String>,
    },
    /// No resource has this URI (and no template matches it).
    #[error("unknown resource `{uri}`")]
    UnknownResource {
        /// The URI asked for.
        uri: String,
    },
    /// The call needs something its caller does not offer (sampling, elicitation, roots).
    #[error("{what} unavailable: {reason}")]
    Unsupported {
        /// What was needed.
        what: String,
        /// Why it is not available.
        reason: String,
    },
    /// The arguments do not match the tool's input schema.
    #[error("invalid arguments for `{tool}`: {}", join_violations(.violations))]
    InvalidArguments {
        /// The tool.
        tool: String,
        /// Every violation found.
        violations: Vec<Violation>,
    },
    /// What the arguments name does not exist (a space nobody made, or one removed): the
    /// caller may make it, or name another. HTTP's 404.
    #[error("`{tool}`: {message}")]
    NotFound {
        /// The tool.
        tool: String,
        /// What is missing, and how to make it or what to name instead.
        message: String,
    },
    /// What the arguments name existed and is gone for good (an external call that expired
    /// before its result came): asking again cannot succeed. HTTP's 410.
    #[error("`{tool}`: {message}")]
    Gone {
        /// The tool.
        tool: String,
        /// What is gone, since when, and what to do instead.
        message: String,
    },
    /// A permission rule, a hook or a person refused the call.
    #[error("call to `{tool}` denied: {reason}")]
    Denied {
        /// The tool.
        tool: String,
        /// Why, and how to allow it.
        reason: String,
    },
    /// The call ran past its time limit and was cancelled.
    #[error(
        "timeout: `{tool}` did not finish within {}{}",
        human_duration(*.after),
        idle_note(*.idle)
    )]
    Timeout {
        /// The tool.
        tool: String,
        /// How long it ran: the limit that was reached, or, for a call whose limit each
        /// progress report restarted, its whole time.
        after: Duration,
        /// For a call whose limit each progress report restarted: the limit, which passed
        /// with no progress and no answer.
        idle: Option<Duration>,
    },
    /// The caller cancelled the call.
    #[error("call to `{tool}` cancelled")]
    Cancelled {
        /// The tool.
        tool: String,
    },
    /// No queue slot became free within the wait timeout, or (`waited` zero) the queue
    /// took no more calls.
    #[error("queue `{queue}` busy: {}", busy_note(.tool, *.waited))]
    QueueBusy {
        /// The tool.
        tool: String,
        /// The queue.
        queue: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// Every waiting place of a queue was taken: the call was refused at once, without
    /// waiting. Its code is `queue_busy`, as [`ToolError::QueueBusy`]'s is.
    #[error(
        "`{tool}` did not run: all {waiting} places to wait for {queue} are taken; \
         call again later, or raise {setting}"
    )]
    QueueFull {
        /// The tool.
        tool: String,
        /// What calls wait for, in words (`one of the 2 calls \`srv\` may have in flight`).
        queue: String,
        /// How many calls may wait.
        waiting: usize,
        /// The setting that gives the waiting places, with how (`defaults.maxCallsInFlight`,
        /// sixteen times which may wait).
        setting: String,
    },
    /// The call's time ran out at a limit other than its own timeout alone: its timeout
    /// less the time it waited for a queue slot, the run's remaining tool time
    /// (`maxToolTimeMs`), or its caller's deadline. Its code is `timeout`, as
    /// [`ToolError::Timeout`]'s is.
    #[error("timeout: `{tool}` did not finish within {}: {limit}", human_duration(*.after))]
    DeadlineExceeded {
        /// The tool.
        tool: String,
        /// How long it had, waits included.
        after: Duration,
        /// Which limit applied and how it was reached, with the setting that gives it.
        limit: String,
    },
    /// The tool's (or its provider's) rate limit allows no call now.
    #[error("`{tool}` is rate limited ({limit}): call it again in {}", human_duration(*.retry_after))]
    RateLimited {
        /// The tool.
        tool: String,
        /// The limit, in words (`10 calls per 1m`).
        limit: String,
        /// When a call would be allowed.
        retry_after: Duration,
    },
    /// Waiting for the queue would deadlock: an enclosing call holds a slot of it and it is full.
    #[error(
        "queue `{queue}` is full and its slot is held by the enclosing call `{ancestor}`: \
         `{tool}` would wait forever; raise `queues.{queue}.concurrent` or give `{tool}` another queue"
    )]
    QueueDeadlock {
        /// The tool.
        tool: String,
        /// The queue.
        queue: String,
        /// The enclosing call holding a slot.
        ancestor: String,
    },
    /// The run's budget of calls or tool time is spent.
    #[error("run budget exhausted before `{tool}`: {what}")]
    BudgetExhausted {
        /// The tool.
        tool: String,
        /// Which limit, with its value.
        what: String,
    },
    /// The output would overflow the model's context budget.
    #[error(
        "context window budget exceeded: `{tool}` returned about {tokens} tokens and the run has {remaining} left (`defaults.contextTokenBudget`)"
    )]
    ContextBudgetExceeded {
        /// The tool.
        tool: String,
        /// Estimated tokens of the output.
        tokens: u64,
        /// Tokens that were left.
        remaining: u64,
    },
    /// The connection to the provider failed; a retry may succeed.
    #[error("{provider}: {message}")]
    Transport {
        /// The provider (namespace or server name).
        provider: String,
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The provider broke its protocol (malformed message, unexpected reply).
    #[error("{provider}: protocol error: {message}")]
    Protocol {
        /// The provider.
        provider: String,
        /// What was malformed.
        message: String,
    },
    /// The provider ran the call and reported a failure.
    #[error("{message}")]
    Remote {
        /// The tool.
        tool: String,
        /// The provider's message.
        message: String,
    },
    /// The provider is not running (failed to start, shut down).
    #[error("{provider} unavailable: {message}")]
    Unavailable {
        /// The provider.
        provider: String,
        /// Why.
        message: String,
    },
    /// The provider panicked while running the call.
    #[error("`{tool}` panicked: {message}")]
    Panicked {
        /// The tool.
        tool: String,
        /// The panic message.
        message: String,
    },
    /// A hook of the gateway (a before- or after-hook around the tool) panicked: the
    /// gateway's fault ([`Party::Policy`]), not the provider's. Its code is `panicked`, as
    /// a provider's panic's is.
    #[error("`{tool}` panicked: {message}")]
    HookPanicked {
        /// The tool whose call the hook was for.
        tool: String,
        /// Which hook panicked, and the panic message.
        message: String,
    },
    /// A provider failure of another kind.
    #[error("{provider}: {message}")]
    Other {
        /// The provider.
        provider: String,
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

/// The message of a panic's `payload` (what `catch_unwind` caught): its text when it is
/// text, else a phrase saying it is not.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

impl ToolError {
    /// Who must act.
    pub fn party(&self) -> Party {
        match self {
            ToolError::UnknownTool { .. }
            | ToolError::UnknownPrompt { .. }
            | ToolError::UnknownResource { .. }
            | ToolError::Unsupported { .. }
            | ToolError::InvalidArguments { .. }
            | ToolError::NotFound { .. }
            | ToolError::Gone { .. } => Party::Caller,
            ToolError::Denied { .. }
            | ToolError::Timeout { .. }
            | ToolError::Cancelled { .. }
            | ToolError::QueueBusy { .. }
            | ToolError::QueueFull { .. }
            | ToolError::DeadlineExceeded { .. }
            | ToolError::RateLimited { .. }
            | ToolError::QueueDeadlock { .. }
            | ToolError::BudgetExhausted { .. }
            | ToolError::ContextBudgetExceeded { .. }
            | ToolError::HookPanicked { .. } => Party::Policy,
            ToolError::Transport { .. }
            | ToolError::Protocol { .. }
            | ToolError::Remote { .. }
            | ToolError::Unavailable { .. }
            | ToolError::Panicked { .. }
            | ToolError::Other { .. } => Party::Provider,
        }
    }

    /// Whether the same call may succeed if retried (connection trouble, provider restarting).
    pub fn is_transient(&self) -> bool {
        matches!(self, ToolError::Transport { .. } | ToolError::Unavailable { .. })
    }

    /// A short machine-readable code (`unknown_tool`, `timeout`, ...).
    pub fn code(&self) -> &'static str {
        match self {
            ToolError::UnknownTool { .. } => "unknown_tool",
            ToolError::UnknownPrompt { .. } => "unknown_prompt",
            ToolError::UnknownResource { .. } => "unknown_resource",
            ToolError::Unsupported { .. } => "unsupported",
            ToolError::InvalidArguments { .. } => "invalid_arguments",
            ToolError::NotFound { .. } => "not_found",
            ToolError::Gone { .. } => "gone",
            ToolError::Denied { .. } => "denied",
            ToolError::Timeout { .. } | ToolError::DeadlineExceeded { .. } => "timeout",
            ToolError::Cancelled { .. } => "cancelled",
            ToolError::QueueBusy { .. } | ToolError::QueueFull { .. } => "queue_busy",
            ToolError::RateLimited { .. } => "rate_limited",
            ToolError::QueueDeadlock { .. } => "queue_deadlock",
            ToolError::BudgetExhausted { .. } => "budget_exhausted",
            ToolError::ContextBudgetExceeded { .. } => "context_budget_exceeded",
            ToolError::Transport { .. } => "transport",
            ToolError::Protocol { .. } => "protocol",
            ToolError::Remote { .. } => "remote",
            ToolError::Unavailable { .. } => "unavailable",
            ToolError::Panicked { .. } | ToolError::HookPanicked { .. } => "panicked",
            ToolError::Other { .. } => "other",
        }
    }

    /// A transport failure with its cause.
    pub fn transport(
        provider: impl Into<String>,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        ToolError::Transport {
            provider: provider.into(),
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A provider failure of another kind, with its cause.
    pub fn other(provider: impl Into<String>, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        ToolError::Other { provider: provider.into(), message: source.to_string(), source: None }
    }

    /// Something the caller does not offer; `reason` says what to change.
    pub fn unsupported(what: impl Into<String>, reason: impl Into<String>) -> Self {
        ToolError::Unsupported { what: what.into(), reason: reason.into() }
    }

    /// A failure the provider reported for `tool`.
    pub fn remote(tool: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError::Remote { tool: tool.into(), message: message.into() }
    }

    /// Arguments that do not fit; one violation at the root.
    pub fn invalid_arguments(tool: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError::InvalidArguments {
            tool: tool.into(),
            violations: vec![Violation { pointer: String::new(), message: message.into() }],
        }
    }

    /// The whole chain of messages, outermost first, joined by `: `.
    ///
    /// This is what a model sees after `(tool failed: ...)`: a message and its causes,
    /// each said once.
    pub fn report(&self) -> String {
        error_report(self)
    }
}

/// An error and its chain of causes as one line, outermost first, joined by `: `, each
/// message said once (a cause whose text the outer message already contains is skipped).
///
/// Every toolmux error enum renders its model-facing text with this.
pub fn error_report(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(err) = source {
        let message = err.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = err.source();
    }
    text
}

fn did_you_mean(suggestions: &[String]) -> String {
    match suggestions {
        [] => String::new(),
        [one] => format!("; did you mean `{one}`?"),
        many => {
            let names: Vec<String> = many.iter().map(|s| format!("`{s}`")).collect();
            format!("; did you mean one of {}?", names.join(", "))
        }
    }
}

fn join_violations(violations: &[Violation]) -> String {
    let parts: Vec<String> = violations.iter().map(Violation::to_string).collect();
    parts.join("; ")
}

/// What a busy queue's message says: the wait that ended, or, for a call refused without
/// waiting, that it was full.
fn busy_note(tool: &str, waited: Duration) -> String {
    if waited.is_zero() {
        format!("it is full and takes no more calls, so `{tool}` did not run; retry later")
    } else {
        format!("no slot for `{tool}` within {}, retry later", human_duration(waited))
    }
}

/// Formats a duration for people: `250ms`, `30s`, `1.5s`, `2m`.
/// What a timeout's message adds when the limit was one without progress.
fn idle_note(idle: Option<Duration>) -> String {
    idle.map_or_else(String::new, |idle| {
        format!(" (it went {} without progress or an answer)", human_duration(idle))
    })
}

pub(crate) fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    fn check(err: ToolError, expect: Expect) {
        expect.assert_eq(&format!("{} [{:?} {}]", err.report(), err.party(), err.code()));
    }

    #[test]
    fn messages() {
        check(
            ToolError::UnknownTool {
                name: "fs__reed".into(),
                suggestions: vec!["fs__read".into()],
            },
            expect!["unknown tool `fs__reed`; did you mean `fs__read`? [Caller unknown_tool]"],
        );
        check(
            ToolError::Gone {
                tool: "external__submit".into(),
                message: "call `c1` expired after 60 s".into(),
            },
            expect!["`external__submit`: call `c1` expired after 60 s [Caller gone]"],
        );
        check(
            ToolError::UnknownTool {
                name: "x".into(),
                suggestions: vec!["a__x".into(), "b__x".into()],
            },
            expect!["unknown tool `x`; did you mean one of `a__x`, `b__x`? [Caller unknown_tool]"],
        );
        check(
            ToolError::InvalidArguments {
                tool: "fs__read".into(),
                violations: vec![
                    Violation {
                        pointer: "".into(),
                        message: "\"path\" is a required property".into(),
                    },
                    Violation {
                        pointer: "/limit".into(),
                        message: "-1 is less than the minimum of 1".into(),
                    },
                ],
            },
            expect![[
                r#"invalid arguments for `fs__read`: at /: "path" is a required property; at /limit: -1 is less than the minimum of 1 [Caller invalid_arguments]"#
            ]],
        );
        check(
            ToolError::UnknownPrompt {
                name: "review".into(),
                suggestions: vec!["git__review".into()],
            },
            expect!["unknown prompt `review`; did you mean `git__review`? [Caller unknown_prompt]"],
        );
        check(
            ToolError::UnknownResource { uri: "test://nope".into() },
            expect!["unknown resource `test://nope` [Caller unknown_resource]"],
        );
        check(
            ToolError::unsupported("sampling", "the caller does not offer sampling"),
            expect![
                "sampling unavailable: the caller does not offer sampling [Caller unsupported]"
            ],
        );
        check(
            ToolError::Timeout {
                tool: "a__b".into(),
                after: Duration::from_millis(1500),
                idle: None,
            },
            expect!["timeout: `a__b` did not finish within 1.5s [Policy timeout]"],
        );
        check(
            ToolError::QueueBusy {
                tool: "a__b".into(),
                queue: "q".into(),
                waited: Duration::from_secs(30),
            },
            expect![
                "queue `q` busy: no slot for `a__b` within 30s, retry later [Policy queue_busy]"
            ],
        );
        check(
            ToolError::QueueBusy {
                tool: "external__job".into(),
                queue: "external results".into(),
                waited: Duration::ZERO,
            },
            expect![
                "queue `external results` busy: it is full and takes no more calls, so `external__job` did not run; retry later [Policy queue_busy]"
            ],
        );
        check(
            ToolError::QueueFull {
                tool: "a__b".into(),
                queue: "one of the 2 calls `a` may have in flight".into(),
                waiting: 32,
                setting: "`defaults.maxCallsInFlight` (sixteen times as many calls may wait)"
                    .into(),
            },
            expect![
                "`a__b` did not run: all 32 places to wait for one of the 2 calls `a` may have in flight are taken; call again later, or raise `defaults.maxCallsInFlight` (sixteen times as many calls may wait) [Policy queue_busy]"
            ],
        );
        check(
            ToolError::DeadlineExceeded {
                tool: "a__b".into(),
                after: Duration::from_millis(496),
                limit: "the run's remaining tool time (`defaults.maxToolTimeMs`)".into(),
            },
            expect![
                "timeout: `a__b` did not finish within 496ms: the run's remaining tool time (`defaults.maxToolTimeMs`) [Policy timeout]"
            ],
        );
        check(
            ToolError::transport(
                "github",
                "connection closed",
                std::io::Error::other("broken pipe"),
            ),
            expect!["github: connection closed: broken pipe [Provider transport]"],
        );
        // A provider's panic is its own fault; a hook's, the gateway's: one code for both.
        check(
            ToolError::Panicked { tool: "m__t".into(), message: "index out of bounds".into() },
            expect!["`m__t` panicked: index out of bounds [Provider panicked]"],
        );
        check(
            ToolError::HookPanicked {
                tool: "m__t".into(),
                message: "its before-hook (#1, for `*`) panicked, the tool did not run: bug".into(),
            },
            expect![
                "`m__t` panicked: its before-hook (#1, for `*`) panicked, the tool did not run: bug [Policy panicked]"
            ],
        );
    }

    #[test]
    fn durations() {
        assert_eq!(human_duration(Duration::from_millis(20)), "20ms");
        assert_eq!(human_duration(Duration::from_secs(120)), "2m");
        assert_eq!(human_duration(Duration::from_secs(45)), "45s");
    }
}
