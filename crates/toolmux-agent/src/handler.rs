//! What an agent answers for the tools it calls: their sampling requests, with its own
//! model (the agent is their MCP client), and everything else as its own caller would.

use async_trait::async_trait;
use std::sync::Arc;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, ElicitationAction, ElicitationRequest, ElicitationResponse,
    InteractionHandler, Root, RootsRequest, SamplingRequest, SamplingResponse, ToolError,
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
        match &self.caller {
            Some(caller) => caller.approve(request).await,
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
