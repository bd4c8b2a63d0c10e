//! Sampling for callers that cannot sample: a tool's `sampling/createMessage` goes to the
//! caller first and, when the caller has no model to offer, to the orchestrator's sampler
//! (a configured model).

use async_trait::async_trait;
use std::sync::Arc;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, ElicitationAction, ElicitationRequest, ElicitationResponse,
    InteractionHandler, Root, RootsRequest, SamplingRequest, SamplingResponse, ToolError,
    UrlElicitationRequest,
};

/// The caller's handler, with `sampler` answering the sampling requests it cannot.
#[derive(Debug)]
pub(crate) struct SamplingFallback {
    pub(crate) caller: Option<Arc<dyn InteractionHandler>>,
    pub(crate) sampler: Arc<dyn InteractionHandler>,
}

fn nobody(what: &str) -> ToolError {
    ToolError::unsupported(what, "nobody is attached to answer this call's requests")
}

#[async_trait]
impl InteractionHandler for SamplingFallback {
    async fn approve(&self, request: ApprovalRequest) -> ApprovalDecision {
        match &self.caller {
            Some(caller) => caller.approve(request).await,
            // The permission stage asks before this handler exists; a provider asking
            // again without a caller gets the same answer.
            None => ApprovalDecision::Deny {
                reason: format!(
                    "{} requires approval and no approval handler is attached",
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
        if let Some(caller) = &self.caller {
            match caller.sample(request.clone()).await {
                Err(ToolError::Unsupported { .. }) => {}
                answered => return answered,
            }
        }
        self.sampler.sample(request).await
    }

    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        match &self.caller {
            Some(caller) => caller.elicit(request).await,
            None => Err(nobody("elicitation")),
        }
    }

    async fn elicit_url(
        &self,
        request: UrlElicitationRequest,
    ) -> Result<ElicitationAction, ToolError> {
        match &self.caller {
            Some(caller) => caller.elicit_url(request).await,
            None => Err(nobody("url elicitation")),
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
            None => Err(nobody("roots")),
        }
    }
}
