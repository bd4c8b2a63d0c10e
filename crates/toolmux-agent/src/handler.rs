//! What an agent answers for the tools it calls: their sampling requests, with its own
//! model (the agent is their MCP client), and everything else as its own caller would.

use crate::pause::{PendingCall, not_pausable};
use crate::session::SubFigures;
use async_trait::async_trait;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, ElicitationAction, ElicitationRequest, ElicitationResponse,
    InteractionHandler, Op, Root, RootsRequest, SamplingRequest, SamplingResponse, ToolError,
    UrlElicitationRequest,
};
use toolmux_llm::{Model, Usage, sampling_request, sampling_response};

/// The handler of an agent's tool calls.
#[derive(Debug)]
pub(crate) struct AgentHandler {
    /// The handler of whoever runs the agent (a person at a terminal, an MCP client).
    pub(crate) caller: Option<Arc<dyn InteractionHandler>>,
    pub(crate) model: Arc<dyn Model>,
    /// The run's cancellation, which a sampling request waits on too.
    pub(crate) cancel: CancellationToken,
    /// Tokens the agent's model spent answering sampling requests.
    pub(crate) used: Mutex<Usage>,
    /// Where the session's operation (the second) counts what it spends for the session
    /// that called it, if one did ([`SubFigures::spend`]).
    pub(crate) spent_for: (Arc<SubFigures>, Option<Arc<Op>>),
    /// How the session's calls are approved besides asking the caller.
    pub(crate) approvals: Approvals,
}

/// Approvals the session gives itself: calls decided on resume, standing approvals, and,
/// in a run that pauses, the calls that wait.
#[derive(Debug, Default)]
pub(crate) struct Approvals {
    /// Calls that ask wait for a decision (the run pauses) instead of asking the caller.
    pub(crate) pause: bool,
    state: Mutex<ApprovalState>,
}

#[derive(Debug, Default)]
struct ApprovalState {
    /// The ids of the calls of the turn running now: the calls that may wait.
    turn: HashSet<String>,
    /// The calls of this turn that wait.
    pending: Vec<PendingCall>,
    /// Decisions already made, by call id (a resumed run's approved calls).
    granted: HashMap<String, ApprovalDecision>,
    /// What is approved for the rest of the run: rules on calls (`fs__bash(git push *)`)
    /// and tools.
    standing: Vec<String>,
}

/// The denial a waiting call gets while its turn finishes; the run then pauses, and the
/// call's result is left out of the conversation until it is decided.
const WAITING: &str = "it waits for approval: the run pauses for it";

impl Approvals {
    /// Approvals that pause the run when `pause`, with `standing` approvals carried over.
    pub(crate) fn new(pause: bool, standing: Vec<String>) -> Self {
        let state = ApprovalState { standing, ..ApprovalState::default() };
        Approvals { pause, state: Mutex::new(state) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ApprovalState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calls of the turn about to run (those that may wait).
    pub(crate) fn start_turn(&self, ids: impl IntoIterator<Item = String>) {
        let mut state = self.lock();
        state.turn = ids.into_iter().collect();
        state.pending.clear();
    }

    /// The calls of the turn that wait, in the order they asked.
    pub(crate) fn take_pending(&self) -> Vec<PendingCall> {
        let mut state = self.lock();
        state.turn.clear();
        std::mem::take(&mut state.pending)
    }

    /// Call `id` is approved (when it asks), and with `always`, what `key` covers for the
    /// rest of the run.
    pub(crate) fn grant(&self, id: &str, always: Option<&str>) {
        let mut state = self.lock();
        state.granted.insert(id.to_owned(), ApprovalDecision::Allow);
        if let Some(key) = always
            && !state.standing.iter().any(|k| k == key)
        {
            state.standing.push(key.to_owned());
        }
    }

    /// Forgets approvals granted to calls that did not ask for them.
    pub(crate) fn clear_granted(&self) {
        self.lock().granted.clear();
    }

    /// What is approved for the rest of the run.
    pub(crate) fn standing(&self) -> Vec<String> {
        self.lock().standing.clone()
    }

    /// Records call `id` of the turn, the agent's `question`, as waiting for an answer;
    /// false when the run does not pause or the call is not one of the turn's.
    pub(crate) fn wait_for_answer(&self, id: &str, question: &str, arguments: &Value) -> bool {
        let mut state = self.lock();
        if !self.pause || !state.turn.contains(id) {
            return false;
        }
        state.pending.push(PendingCall {
            call_id: id.to_owned(),
            tool: crate::internal::ASK_USER.to_owned(),
            arguments: arguments.clone(),
            reason: format!("a question for you: {question}"),
            scope: None,
            question: Some(question.to_owned()),
            started: false,
        });
        true
    }

    /// The session's own answer to `request`, if it has one.
    fn decide(&self, request: &ApprovalRequest) -> Option<ApprovalDecision> {
        let mut state = self.lock();
        if let Some(decision) = request.call_id.as_ref().and_then(|id| state.granted.remove(id)) {
            return Some(decision);
        }
        let key = request.scope.as_deref().unwrap_or(&request.tool);
        if state.standing.iter().any(|k| k == key) {
            return Some(ApprovalDecision::Allow);
        }
        if !self.pause {
            return None;
        }
        match &request.call_id {
            Some(id) if state.turn.contains(id) => {
                state.pending.push(PendingCall {
                    call_id: id.clone(),
                    tool: request.tool.clone(),
                    arguments: request.arguments.clone(),
                    reason: request.reason.clone(),
                    scope: request.scope.clone(),
                    question: None,
                    started: false,
                });
                Some(ApprovalDecision::Deny { reason: WAITING.to_owned() })
            }
            _ => Some(ApprovalDecision::Deny {
                reason: not_pausable(&request.tool, &request.reason),
            }),
        }
    }
}

impl AgentHandler {
    /// Tokens spent on sampling so far.
    pub(crate) fn used(&self) -> Usage {
        *self.used.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl InteractionHandler for AgentHandler {
    async fn approve(&self, request: ApprovalRequest) -> ApprovalDecision {
        if let Some(decision) = self.approvals.decide(&request) {
            return decision;
        }
        match &self.caller {
            // The call's id means something only in this agent's conversation: whoever
            // answers for the caller (another agent among them) must not take it for one
            // of its own calls.
            Some(caller) => caller.approve(ApprovalRequest { call_id: None, ..request }).await,
            // As the orchestrator answers a call without a handler.
            None => ApprovalDecision::Deny {
                reason: format!(
                    "{} requires approval and no approval handler is attached; remove the rule \
                     or move it to `permissions.allow` to run without approval",
                    request.reason
                ),
            },
        }
    }

    async fn clarify(&self, question: &str) -> Option<String> {
        match &self.caller {
            Some(caller) => caller.clarify(question).await,
            None => None,
        }
    }

    async fn sample(&self, request: SamplingRequest) -> Result<SamplingResponse, ToolError> {
        let answer = self.model.complete(&sampling_request(&request), &self.cancel).await;
        let answer = answer.map_err(|e| ToolError::other("sampling", e))?;
        *self.used.lock().unwrap_or_else(|e| e.into_inner()) += answer.usage;
        let (sub_figures, op) = &self.spent_for;
        sub_figures.spend(op.as_ref(), (answer.usage, 0, 0));
        Ok(sampling_response(answer))
    }

    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        match &self.caller {
            Some(caller) => caller.elicit(request).await,
            None => Err(ToolError::unsupported(
                "elicitation",
                "nobody is attached to answer the agent's tools",
            )),
        }
    }

    async fn elicit_url(
        &self,
        request: UrlElicitationRequest,
    ) -> Result<ElicitationAction, ToolError> {
        match &self.caller {
            Some(caller) => caller.elicit_url(request).await,
            None => Err(ToolError::unsupported(
                "url elicitation",
                "nobody is attached to answer the agent's tools",
            )),
        }
    }

    async fn url_elicitation_complete(&self, elicitation_id: &str) {
        if let Some(caller) = &self.caller {
            caller.url_elicitation_complete(elicitation_id).await;
        }
    }

    async fn roots(&self, request: RootsRequest) -> Result<Vec<Root>, ToolError> {
        match &self.caller {
            Some(caller) => caller.roots(request).await,
            None => Err(ToolError::unsupported(
                "roots",
                "nobody is attached to answer the agent's tools",
            )),
        }
    }
}
