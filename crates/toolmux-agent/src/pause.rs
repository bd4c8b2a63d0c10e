//! Pausing a run for approvals, and resuming it with the caller's decisions.
//!
//! A run started with [`RunOptions::pause`](crate::RunOptions::pause) does not ask anybody
//! when one of its agent's calls needs approval (an `ask` rule, a hook that asks): the
//! turn's other calls finish, and the run ends with status
//! [`Paused`](crate::AgentStatus::Paused), the waiting calls in
//! [`AgentReport::pending`](crate::AgentReport::pending) and the conversation in the report,
//! (a question the agent asks with `agent__ask_user` and nobody can answer waits the same
//! way, for an answer),
//! which is all a later [`Agents::resume`](crate::Agents::resume) needs (the report
//! serializes, so the pause may outlive the process). Resuming takes a [`Decision`] per
//! waiting call: approve (optionally with other arguments, optionally for the rest of the
//! run), deny with a message the model reads, or answer the call with a result instead of
//! running it. Calls left undecided keep the run paused. An approved call is still checked
//! by the orchestrator when it runs: a rule that denies it denies it, whoever approved.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// A call that waits for a decision in a paused run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingCall {
    /// The model's id of the call: what a [`Decision`] is given for.
    pub call_id: String,
    /// The tool it calls.
    pub tool: String,
    /// The arguments it calls it with.
    pub arguments: Value,
    /// Why it needs approval (the rule or hook that asks).
    pub reason: String,
    /// What approving it "always" covers when narrower than the tool: the rule on calls
    /// that asks (`fs__bash(git push *)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The agent's question (`agent__ask_user` with nobody to ask): the call waits for an
    /// answer, given as [`Decision::Respond`] (or [`Decision::Deny`]: no answer), not for
    /// an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    /// A resumption approved and started the call, then stopped before the run's next
    /// report was kept (interrupted, killed): whether the call took effect is unknown, so
    /// it is never run again ([`AgentReport::mark_started`]). Resuming without a decision
    /// for it tells the model so; [`Decision::Respond`] says what happened instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started: bool,
}

impl PendingCall {
    /// What a standing approval of this call covers: its rule's scope, or its tool.
    pub(crate) fn standing_key(&self) -> &str {
        self.scope.as_deref().unwrap_or(&self.tool)
    }
}

/// The caller's decision for a [`PendingCall`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Run the call.
    Approve {
        /// Run it with these arguments instead of the model's (the conversation shows the
        /// call as it ran).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<Value>,
        /// Approve the rest of the run's calls that ask for the same reason (the same rule
        /// on calls, or the same tool) without pausing.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        always: bool,
    },
    /// Do not run it: the model reads that it was not approved, and why.
    Deny {
        /// Why, in words the model can act on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Do not run it: answer it with this result instead.
    Respond {
        /// The result the model reads.
        content: String,
        /// Whether the result is an error.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

impl Decision {
    /// Approve the call as the model made it, this once.
    pub fn approve() -> Self {
        Decision::Approve { arguments: None, always: false }
    }

    /// Deny the call, with `message` for the model.
    pub fn deny(message: impl Into<String>) -> Self {
        Decision::Deny { message: Some(message.into()) }
    }
}

/// What a resumed session starts from: the waiting calls and the decisions for them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Resume {
    pub(crate) pending: Vec<PendingCall>,
    pub(crate) decisions: BTreeMap<String, Decision>,
    /// The run's figures at the pause, which the resumed run goes on counting from (its
    /// turn limit and token budget hold across the pause).
    pub(crate) turns: u32,
    pub(crate) tool_calls: u32,
    pub(crate) refused_calls: u32,
    pub(crate) usage: toolmux_llm::Usage,
    /// Results the run took from its inbox before the pause that had not reached its
    /// model ([`AgentReport::unread_results`](crate::AgentReport::unread_results)): given
    /// to it first.
    pub(crate) unread: Vec<Value>,
    /// The run's asynchronous external calls whose results had not come at the pause
    /// ([`AgentReport::pending_async_calls`](crate::AgentReport::pending_async_calls)):
    /// the resumed session reads the inbox for them.
    pub(crate) pending_async: usize,
    /// The agents that handed the task on before the paused one, first to last: the run
    /// goes on as theirs (the first one's identity, its hand-off count, the models its
    /// agents inherit).
    pub(crate) handed: Vec<String>,
}

/// What the model reads for a call denied on resume.
pub(crate) fn denied_text(tool: &str, message: Option<&str>) -> String {
    let why = message.map(str::trim).filter(|m| !m.is_empty()).unwrap_or("the user said no");
    format!("(tool failed: call to `{tool}` denied: not approved: {why})")
}

/// The result of a call an interrupted resumption started ([`PendingCall::started`]).
pub(crate) fn started_text(tool: &str) -> String {
    format!(
        "(tool failed: the call to `{tool}` was approved and started, but the run was \
         interrupted before its result was kept: whether it took effect is unknown; check \
         before calling it again)"
    )
}

/// The result a waiting call keeps when the run ends before anybody decided (a report or a
/// hand-off in the same turn ended it).
pub(crate) const NOT_DECIDED: &str =
    "(tool failed: not run: it waited for approval and the run ended first)";

/// Why a call that asks inside `batch` or a sub-agent of a paused run is refused: only the
/// agent's own calls can wait for a decision.
pub(crate) fn not_pausable(tool: &str, reason: &str) -> String {
    format!(
        "{reason} requires approval; in this run approvals are given by pausing, which only \
         the agent's own calls can do, not calls inside a batch or a sub-agent: call `{tool}` \
         on its own"
    )
}
