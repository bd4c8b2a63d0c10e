//! URL-mode elicitation (2025-11-25) from server-everything's `trigger-url-elicitation`:
//! asked of the caller (`InteractionHandler::elicit_url`) as a server-to-client request,
//! and as a `-32042` answer that the call is sent again after.

use async_trait::async_trait;
use serde_json::json;
use std::sync::{Arc, Mutex};
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, ElicitationAction, InteractionHandler,
    ToolError, ToolProvider, UrlElicitationRequest,
};
use toolmux_mcp::McpProvider;

use crate::support;

const TOOL: &str = "trigger-url-elicitation";

/// Says `action` to every URL, recording what it was shown.
#[derive(Debug)]
pub struct Opens {
    pub action: ElicitationAction,
    pub shown: Mutex<Vec<UrlElicitationRequest>>,
}

impl Opens {
    pub fn new(action: ElicitationAction) -> Arc<Opens> {
        Arc::new(Opens { action, shown: Mutex::default() })
    }
}

#[async_trait]
impl InteractionHandler for Opens {
    async fn approve(&self, _request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Allow
    }

    async fn elicit_url(
        &self,
        request: UrlElicitationRequest,
    ) -> Result<ElicitationAction, ToolError> {
        self.shown.lock().unwrap().push(request);
        Ok(self.action)
    }
}

fn everything() -> McpProvider {
    McpProvider::new("everything", support::everything_stdio()).unwrap()
}

#[tokio::test]
async fn a_url_to_open_reaches_the_caller_and_its_answer_the_server() {
    let provider = everything();
    // Offered only to clients that take URL elicitations, as toolmux does.
    let names: Vec<String> =
        provider.list_tools().await.unwrap().into_iter().map(|t| t.name).collect();
    assert!(names.iter().any(|n| n == TOOL), "{names:?}");

    let opens = Opens::new(ElicitationAction::Accept);
    let ctx = CallContext::new().with_handler(opens.clone());
    let args =
        json!({"url": "https://example.com/sign-in", "message": "Sign in", "elicitationId": "e1"});
    let out = provider.call(TOOL, args, &ctx).await.unwrap();
    assert!(out.to_text().contains("User completed the URL elicitation flow"), "{out:?}");
    let shown = opens.shown.lock().unwrap().clone();
    assert_eq!(
        shown,
        vec![
            UrlElicitationRequest::new("Sign in", "https://example.com/sign-in")
                .with_elicitation_id("e1")
        ]
    );

    // Declined by the user, and unattended (nobody to show it to): declined.
    let declines = Opens::new(ElicitationAction::Decline);
    let ctx = CallContext::new().with_handler(declines);
    let args = json!({"url": "https://example.com/a", "elicitationId": "e2"});
    let out = provider.call(TOOL, args.clone(), &ctx).await.unwrap();
    assert!(out.to_text().contains("User declined to open the URL"), "{out:?}");
    let out = provider.call(TOOL, args, &CallContext::new()).await.unwrap();
    assert!(out.to_text().contains("User declined to open the URL"), "{out:?}");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_call_refused_until_a_url_is_opened_is_sent_again_once_it_was() {
    let provider = everything();
    let opens = Opens::new(ElicitationAction::Accept);
    let ctx = CallContext::new().with_handler(opens.clone());
    let args = json!({"url": "https://example.com/pay", "message": "Pay", "errorPath": true});
    let out = provider.call(TOOL, args, &ctx).await.unwrap();
    assert!(out.to_text().contains("User completed the URL elicitation flow"), "{out:?}");
    let urls: Vec<String> = opens.shown.lock().unwrap().iter().map(|r| r.url.clone()).collect();
    // The `-32042`'s prerequisite, then the call's own request once it ran.
    assert_eq!(urls, ["https://modelcontextprotocol.io", "https://example.com/pay"]);

    // Nobody to show it to: the error names the URL, for a model to pass on.
    let args = json!({"url": "https://example.com/other", "errorPath": true});
    let err = provider.call(TOOL, args, &CallContext::new()).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("https://modelcontextprotocol.io"), "{text}");
    assert!(text.contains("nobody here can show a URL"), "{text}");
    provider.shutdown().await.unwrap();
}
