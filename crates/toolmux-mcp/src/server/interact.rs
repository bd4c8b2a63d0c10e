//! What a served call may ask of the MCP client: sampling, elicitation and roots.
//!
//! Sessions of the handshake revisions ask the client directly (server-to-client
//! requests). The stateless 2026-07-28 revision forbids those: a call that needs input
//! ends with an `InputRequiredResult` naming what it needs, and the client calls again
//! with the answers. toolmux runs the call again from the start with the answers given
//! (this round's, plus earlier rounds' carried in a sealed `requestState`), so any
//! provider's tool works unchanged as long as it asks the same questions in the same
//! order; a request's `key` names it across runs.

use super::convert;
use super::tasks::TaskEntry;
use async_trait::async_trait;
use rmcp::model::{ClientCapabilities, InputRequest, InputRequests, RequestStateCodec};
use rmcp::{Peer, RoleServer};
use serde_json::{Value, json};
use sha2::Digest as _;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, ElicitationAction, ElicitationRequest, ElicitationResponse,
    InteractionHandler, Root, RootsRequest, SamplingRequest, SamplingResponse, ToolError,
    UrlElicitationRequest,
};

/// The kinds of input a call can need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    Sampling,
    Elicitation,
    /// A URL-mode elicitation: the user opens a URL.
    UrlElicitation,
    Roots,
}

impl Need {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Need::Sampling => "sampling",
            Need::Elicitation => "elicitation",
            Need::UrlElicitation => "url elicitation",
            Need::Roots => "roots",
        }
    }

    pub(crate) fn method(self) -> &'static str {
        match self {
            Need::Sampling => "sampling/createMessage",
            Need::Elicitation | Need::UrlElicitation => "elicitation/create",
            Need::Roots => "roots/list",
        }
    }

    fn declared(self, capabilities: Option<&ClientCapabilities>) -> bool {
        capabilities.is_some_and(|c| match self {
            Need::Sampling => c.sampling.is_some(),
            Need::Elicitation => c.elicitation.is_some(),
            Need::UrlElicitation => c.elicitation.as_ref().is_some_and(|e| e.url.is_some()),
            Need::Roots => c.roots.is_some(),
        })
    }

    /// Whether `answer` has the shape of this need's result.
    pub(crate) fn answers_with(self, answer: &Value) -> bool {
        match self {
            Need::Sampling => answer.get("content").is_some(),
            Need::Elicitation | Need::UrlElicitation => {
                answer.get("action").is_some_and(Value::is_string)
            }
            Need::Roots => answer.get("roots").is_some_and(Value::is_array),
        }
    }

    /// The capabilities object that declares this need, for `-32021` errors.
    pub(crate) fn capabilities(self) -> ClientCapabilities {
        let declared = match self {
            Need::UrlElicitation => json!({"elicitation": {"url": {}}}),
            need => json!({ need.name(): {} }),
        };
        serde_json::from_value(declared).unwrap_or_default()
    }
}

/// Answers a served call's requests on behalf of the MCP client.
#[derive(Debug)]
pub(crate) struct ClientInteraction {
    peer: Peer<RoleServer>,
    capabilities: Option<Arc<ClientCapabilities>>,
    round: Option<Arc<Round>>,
    /// For a call run as a task: questions wait in the task for `tasks/update`.
    task: Option<Arc<TaskEntry>>,
    /// The first need the client did not declare, when a request failed for it.
    missing: Mutex<Option<Need>>,
    /// How many approvals this run asked per tool and arguments, to key identical
    /// repeats apart (see [`approval_key`]).
    approvals: Mutex<BTreeMap<String, usize>>,
}

impl ClientInteraction {
    /// For a session of a handshake revision: requests go to the client.
    pub(crate) fn session(
        peer: Peer<RoleServer>,
        capabilities: Option<Arc<ClientCapabilities>>,
    ) -> Self {
        ClientInteraction {
            peer,
            capabilities,
            round: None,
            task: None,
            missing: Mutex::new(None),
            approvals: Mutex::default(),
        }
    }

    /// For a call run as task `task`: requests wait in the task until `tasks/update`
    /// answers them.
    pub(crate) fn task(
        peer: Peer<RoleServer>,
        capabilities: Option<Arc<ClientCapabilities>>,
        task: Arc<TaskEntry>,
    ) -> Self {
        ClientInteraction {
            peer,
            capabilities,
            round: None,
            task: Some(task),
            missing: Mutex::new(None),
            approvals: Mutex::default(),
        }
    }

    /// For a stateless request: requests are answered from `round` or end the call.
    pub(crate) fn stateless(
        peer: Peer<RoleServer>,
        capabilities: Option<Arc<ClientCapabilities>>,
        round: Arc<Round>,
    ) -> Self {
        ClientInteraction {
            peer,
            capabilities,
            round: Some(round),
            task: None,
            missing: Mutex::new(None),
            approvals: Mutex::default(),
        }
    }

    /// The first need the client did not declare, if a request failed for that reason.
    pub(crate) fn missing(&self) -> Option<Need> {
        *self.missing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key of an approval's question: the tool, a digest of its arguments and, for
    /// the second and later approval of the same call in this run, its ordinal. A
    /// stateless round's answer is found by key on the next run, so the key must name
    /// this one call: an "allow" given for one set of arguments must not allow another,
    /// nor answer a second approval of the same arguments.
    fn approval_key(&self, request: &ApprovalRequest) -> String {
        let digest = sha2::Sha256::digest(request.arguments.to_string().as_bytes());
        let mut key = format!("approve:{}:", request.tool);
        for byte in &digest[..8] {
            key.push_str(&format!("{byte:02x}"));
        }
        if self.round.is_none() && self.task.is_none() {
            // Asked of the client directly: no key finds an answer.
            return key;
        }
        let mut approvals = self.approvals.lock().unwrap_or_else(|e| e.into_inner());
        let asked = approvals.entry(key.clone()).or_default();
        *asked += 1;
        if *asked > 1 {
            key.push_str(&format!("#{asked}"));
        }
        key
    }

    fn check(&self, need: Need) -> Result<(), ToolError> {
        if need.declared(self.capabilities.as_deref()) {
            return Ok(());
        }
        self.missing.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(need);
        Err(ToolError::unsupported(
            need.name(),
            format!("the MCP client did not declare the `{}` capability", need.name()),
        ))
    }

    /// Asks the client: directly in a session, through the round otherwise.
    async fn ask(&self, need: Need, key: Option<&str>, params: Value) -> Result<Value, ToolError> {
        self.check(need)?;
        if let Some(round) = &self.round {
            return round.answer(need, key, params).await;
        }
        if let Some(task) = &self.task {
            return task.inputs.ask(need, key, params, task).await;
        }
        let failed = |e: rmcp::ServiceError| ToolError::Remote {
            tool: need.method().to_owned(),
            message: format!("the MCP client failed `{}`: {e}", need.method()),
        };
        let result = match need {
            Need::Sampling => {
                let params = serde_json::from_value(params).map_err(|e| invalid(need, e))?;
                #[expect(deprecated, reason = "sampling is still the handshake revisions' way")]
                let result = self.peer.create_message(params).await.map_err(failed)?;
                serde_json::to_value(result)
            }
            Need::Elicitation | Need::UrlElicitation => {
                let params = serde_json::from_value(params).map_err(|e| invalid(need, e))?;
                let result = self.peer.create_elicitation(params).await.map_err(failed)?;
                serde_json::to_value(result)
            }
            Need::Roots => {
                #[expect(deprecated, reason = "roots are still the handshake revisions' way")]
                let result = self.peer.list_roots().await.map_err(failed)?;
                serde_json::to_value(result)
            }
        };
        result.map_err(|e| invalid(need, e))
    }
}

fn invalid(need: Need, error: impl std::fmt::Display) -> ToolError {
    ToolError::Protocol {
        provider: "mcp client".to_owned(),
        message: format!("{}: {error}", need.method()),
    }
}

#[async_trait]
impl InteractionHandler for ClientInteraction {
    /// Approval of `ask` rules becomes an elicitation when the client offers it.
    async fn approve(&self, request: ApprovalRequest) -> ApprovalDecision {
        let question = ElicitationRequest::new(
            format!(
                "Allow `{}` with arguments {}? ({})",
                request.tool, request.arguments, request.reason
            ),
            json!({
                "type": "object",
                "properties": {"allow": {"type": "boolean", "title": "Allow this call"}},
                "required": ["allow"],
            }),
        )
        .with_key(self.approval_key(&request));
        match self.elicit(question).await {
            Ok(answer) => {
                let allowed = answer
                    .content
                    .as_ref()
                    .and_then(|c| c.get("allow"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                if allowed && answer.action == ElicitationAction::Accept {
                    ApprovalDecision::Allow
                } else {
                    ApprovalDecision::Deny {
                        reason: format!("the user did not allow it ({})", answer.action),
                    }
                }
            }
            Err(error) => ApprovalDecision::Deny {
                reason: format!("{}; approve it in the configuration instead", error.report()),
            },
        }
    }

    /// A tool's (or an agent's) question becomes an elicitation of one text answer when the
    /// client offers it; a declined or cancelled elicitation, or a client without it, is no
    /// answer.
    async fn clarify(&self, question: &str) -> Option<String> {
        let request = ElicitationRequest::new(
            question,
            json!({
                "type": "object",
                "properties": {"answer": {"type": "string", "title": "Your answer"}},
                "required": ["answer"],
            }),
        );
        let answer = self.elicit(request).await.ok()?;
        if answer.action != ElicitationAction::Accept {
            return None;
        }
        let text = answer.content.as_ref()?.get("answer")?.as_str()?;
        Some(text.to_owned()).filter(|t| !t.trim().is_empty())
    }

    async fn sample(&self, request: SamplingRequest) -> Result<SamplingResponse, ToolError> {
        let params = convert::sampling_params(&request);
        let answer = self.ask(Need::Sampling, request.key.as_deref(), params).await?;
        convert::sampling_response(answer).map_err(|e| invalid(Need::Sampling, e))
    }

    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        let params =
            json!({"message": request.message, "requestedSchema": request.requested_schema});
        let answer = self.ask(Need::Elicitation, request.key.as_deref(), params).await?;
        serde_json::from_value(answer).map_err(|e| invalid(Need::Elicitation, e))
    }

    /// A URL to open becomes a URL-mode elicitation when the client offers it.
    async fn elicit_url(
        &self,
        request: UrlElicitationRequest,
    ) -> Result<ElicitationAction, ToolError> {
        let mut params = json!({"mode": "url", "message": request.message, "url": request.url});
        if !request.elicitation_id.is_empty() {
            params["elicitationId"] = json!(request.elicitation_id);
        }
        let answer = self.ask(Need::UrlElicitation, request.key.as_deref(), params).await?;
        let action = answer.get("action").cloned().unwrap_or(Value::Null);
        serde_json::from_value(action).map_err(|e| invalid(Need::UrlElicitation, e))
    }

    /// Passed on to the client as `notifications/elicitation/complete`, in a session (a
    /// stateless request or a task has no stream to carry it after the fact).
    async fn url_elicitation_complete(&self, elicitation_id: &str) {
        if self.round.is_some() || self.task.is_some() {
            return;
        }
        let notification = rmcp::model::CustomNotification::new(
            "notifications/elicitation/complete",
            Some(json!({"elicitationId": elicitation_id})),
        );
        let sent = self
            .peer
            .send_notification(rmcp::model::ServerNotification::CustomNotification(notification))
            .await;
        if let Err(e) = sent {
            tracing::debug!(error = %e, "cannot pass on an elicitation's completion");
        }
    }

    async fn roots(&self, request: RootsRequest) -> Result<Vec<Root>, ToolError> {
        let answer = self.ask(Need::Roots, request.key.as_deref(), json!({})).await?;
        convert::roots(answer).map_err(|e| invalid(Need::Roots, e))
    }
}

/// One run of a stateless request: the answers known so far and the questions the run
/// asked that have none yet.
#[derive(Debug, Default)]
pub(crate) struct Round {
    answers: BTreeMap<String, Value>,
    asked: Mutex<InputRequests>,
    /// Numbers requests without a key, in the order made.
    counter: AtomicUsize,
    needed: Notify,
}

impl Round {
    /// A round with the answers of earlier rounds (from the opened `requestState`) and of
    /// this one (`inputResponses`).
    pub(crate) fn new(answers: BTreeMap<String, Value>) -> Self {
        Round { answers, ..Round::default() }
    }

    /// Every answer this round knows, to seal into the next `requestState`.
    pub(crate) fn answers(&self) -> &BTreeMap<String, Value> {
        &self.answers
    }

    /// The questions asked without an answer, once the call has been stopped.
    pub(crate) fn take_asked(&self) -> InputRequests {
        std::mem::take(&mut *self.asked.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Resolves once the run asked a question that has no answer.
    pub(crate) async fn input_needed(&self) {
        loop {
            let notified = self.needed.notified();
            if !self.asked.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                return;
            }
            notified.await;
        }
    }

    async fn answer(
        &self,
        need: Need,
        key: Option<&str>,
        params: Value,
    ) -> Result<Value, ToolError> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let key = key.map_or_else(|| format!("{}-{n}", need.name()), str::to_owned);
        // An answer of the wrong shape counts as none: the question is asked again.
        if let Some(answer) = self.answers.get(&key).filter(|a| need.answers_with(a)) {
            return Ok(answer.clone());
        }
        let request = json!({"method": need.method(), "params": params});
        let request: InputRequest =
            serde_json::from_value(request).map_err(|e| invalid(need, e))?;
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).insert(key, request);
        self.needed.notify_one();
        // The gateway stops the call and answers with the questions; this run never
        // gets its answer.
        std::future::pending().await
    }
}

/// Seals and opens `requestState`: the answers of earlier rounds, bound to the request
/// they were given for (and its key holder), signed with a key only this process knows, or
/// only the replicas sharing a session directory ([`super::SessionDirectory::seal_key`]).
#[derive(Debug)]
pub(crate) struct StateSeal {
    codec: RequestStateCodec,
}

impl StateSeal {
    /// A seal with a fresh key from the operating system's random source.
    pub(crate) fn new() -> Result<Self, String> {
        Ok(StateSeal::with_key(random_key()?))
    }

    /// A seal with `key`, which other replicas may share.
    pub(crate) fn with_key(key: [u8; 32]) -> Self {
        StateSeal { codec: RequestStateCodec::new_unchecked(key.to_vec()) }
    }

    /// The state to send with an `InputRequiredResult`.
    pub(crate) fn seal(&self, answers: &BTreeMap<String, Value>, binding: &[u8]) -> String {
        let payload = serde_json::to_vec(answers).unwrap_or_default();
        self.codec.seal_with(&payload, &rmcp::model::SealOptions::new().associated_data(binding))
    }

    /// The answers sealed in `state`, or why it cannot be trusted.
    pub(crate) fn open(
        &self,
        state: &str,
        binding: &[u8],
    ) -> Result<BTreeMap<String, Value>, String> {
        let payload = self
            .codec
            .open_with(state, binding)
            .map_err(|e| format!("requestState failed verification: {e}"))?;
        serde_json::from_slice(&payload).map_err(|e| format!("requestState is malformed: {e}"))
    }
}

/// 32 bytes from the operating system's random source, to key a [`StateSeal`].
pub(crate) fn random_key() -> Result<[u8; 32], String> {
    let mut key = [0u8; 32];
    getrandom::getrandom(&mut key)
        .map_err(|e| format!("no operating-system randomness to key requestState: {e}"))?;
    Ok(key)
}
