//! MCP sampling answered by a model: a tool's `sampling/createMessage` request turned into
//! a [`ModelRequest`], and the model's answer into the tool's [`SamplingResponse`].

use crate::{Message, Model, ModelRequest, ModelResponse, StopReason};
use async_trait::async_trait;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, ContentPart, InteractionHandler, Role, SamplingRequest,
    SamplingResponse, ToolError,
};

/// The model request that answers `request`: its messages as text (an image, audio or a
/// binary resource is named, not sent: the clients here speak text), its system prompt,
/// token limit and temperature. Its stop sequences and model preferences are not
/// passed on.
pub fn sampling_request(request: &SamplingRequest) -> ModelRequest {
    let messages = request
        .messages
        .iter()
        .map(|message| {
            let text = part_text(&message.content);
            match message.role {
                Role::User => Message::user(text),
                Role::Assistant => Message::assistant(text),
            }
        })
        .collect();
    ModelRequest {
        system: request.system_prompt.clone(),
        messages,
        max_tokens: Some(request.max_tokens),
        temperature: request.temperature,
        ..ModelRequest::default()
    }
}

/// The sampling answer of `response`: its text, the model that wrote it, and why it
/// stopped in the protocol's words (`endTurn`, `maxTokens`, ...).
pub fn sampling_response(response: ModelResponse) -> SamplingResponse {
    let stop = match &response.stop {
        StopReason::EndTurn => "endTurn".to_owned(),
        StopReason::MaxTokens => "maxTokens".to_owned(),
        StopReason::ToolUse => "toolUse".to_owned(),
        StopReason::ContentFilter => "contentFilter".to_owned(),
        StopReason::Other(reason) => reason.clone(),
    };
    SamplingResponse {
        role: Role::Assistant,
        content: ContentPart::Text { text: response.content },
        model: response.model,
        stop_reason: Some(stop),
    }
}

/// A model answering sampling requests: what toolmux's orchestrator is given to answer
/// the tools whose caller cannot sample (`defaults.samplingModel`). It answers nothing else.
#[derive(Debug)]
pub struct ModelSampler {
    model: Arc<dyn Model>,
}

impl ModelSampler {
    /// Sampling with `model`.
    pub fn new(model: Arc<dyn Model>) -> Self {
        ModelSampler { model }
    }
}

#[async_trait]
impl InteractionHandler for ModelSampler {
    async fn approve(&self, request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Deny {
            reason: format!("{} requires approval, and a model does not give it", request.reason),
        }
    }

    async fn sample(&self, request: SamplingRequest) -> Result<SamplingResponse, ToolError> {
        // Dropping the call drops this future and with it the request, so a token of its
        // own is enough.
        let cancel = CancellationToken::new();
        let answer = self.model.complete(&sampling_request(&request), &cancel).await;
        answer.map(sampling_response).map_err(|e| ToolError::other("sampling", e))
    }
}

fn part_text(part: &ContentPart) -> String {
    match part {
        ContentPart::Text { text } => text.clone(),
        ContentPart::Json { value } => value.to_string(),
        ContentPart::Image { mime_type, .. } => format!("[an image ({mime_type}) not shown]"),
        ContentPart::Audio { mime_type, .. } => format!("[audio ({mime_type}) not played]"),
        ContentPart::Resource { uri, text: Some(text), .. } => format!("{uri}:\n{text}"),
        ContentPart::Resource { uri, .. } => format!("[resource {uri} not shown]"),
        ContentPart::ResourceLink { uri, name, .. } => format!("[{name}]({uri})"),
        _ => "[content not shown]".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolmux_core::Message as CoreMessage;

    #[test]
    fn a_sampling_request_becomes_a_model_request_and_back() {
        let mut request = SamplingRequest::text("Summarise: the sky is blue", 50);
        request.system_prompt = Some("Be terse.".into());
        request.temperature = Some(0.2);
        request.messages.push(CoreMessage {
            role: Role::Assistant,
            content: ContentPart::Json { value: json!({"draft": 1}) },
        });
        request.messages.push(CoreMessage {
            role: Role::User,
            content: ContentPart::Image { data: "AAAA".into(), mime_type: "image/png".into() },
        });
        let model = sampling_request(&request);
        assert_eq!(model.system.as_deref(), Some("Be terse."));
        assert_eq!((model.max_tokens, model.temperature), (Some(50), Some(0.2)));
        assert_eq!(
            model.messages,
            vec![
                Message::user("Summarise: the sky is blue"),
                Message::assistant("{\"draft\":1}"),
                Message::user("[an image (image/png) not shown]"),
            ]
        );
        assert!(model.tools.is_empty());
        let mut answer = ModelResponse::text("Blue sky.");
        answer.model = "m-1".into();
        answer.stop = StopReason::MaxTokens;
        let back = sampling_response(answer);
        assert_eq!(back.content, ContentPart::Text { text: "Blue sky.".into() });
        assert_eq!((back.model.as_str(), back.stop_reason.as_deref()), ("m-1", Some("maxTokens")));
        assert_eq!(back.role, Role::Assistant);
    }
}
