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

/// Says `action` to every URL, recording what it was shown and which were completed.
#[derive(Debug)]
pub struct Opens {
    pub action: ElicitationAction,
    pub shown: Mutex<Vec<UrlElicitationRequest>>,
    pub completed: Mutex<Vec<String>>,
}

impl Opens {
    pub fn new(action: ElicitationAction) -> Arc<Opens> {
        Arc::new(Opens { action, shown: Mutex::default(), completed: Mutex::default() })
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

    async fn url_elicitation_complete(&self, elicitation_id: &str) {
        self.completed.lock().unwrap().push(elicitation_id.to_owned());
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

/// The server's `notifications/elicitation/complete` reaches the caller who accepted that
/// URL, and nobody else: not a caller who declined it.
#[tokio::test]
async fn the_servers_completion_notice_reaches_the_caller_who_accepted() {
    let provider = McpProvider::new("fixture", support::fixture_stdio("ok")).unwrap();
    for (action, told) in [(ElicitationAction::Accept, true), (ElicitationAction::Decline, false)] {
        let opens = Opens::new(action);
        let ctx = CallContext::new().with_handler(opens.clone());
        let out = provider.call("url_elicit", json!({}), &ctx).await.unwrap();
        assert_eq!(out.to_text(), format!("url: {action}"));
        assert_eq!(opens.shown.lock().unwrap()[0].elicitation_id, "el-7");
        if told {
            support::wait_for("the completion notice", std::time::Duration::from_secs(5), || {
                opens.completed.lock().unwrap().len() == 1
            })
            .await;
            assert_eq!(*opens.completed.lock().unwrap(), ["el-7"]);
        } else {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            assert!(opens.completed.lock().unwrap().is_empty());
        }
    }
    provider.shutdown().await.unwrap();
}

/// Through the gateway: a client that accepted the URL gets the upstream server's
/// `notifications/elicitation/complete` with its `elicitationId`.
#[tokio::test]
async fn the_gateway_passes_the_completion_notice_on_to_its_client() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let provider = Arc::new(McpProvider::new("fixture", support::fixture_stdio("ok")).unwrap());
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let (reader, writer) = tokio::io::split(server_io);
    let server = tokio::spawn(toolmux_mcp::server::serve_io(
        provider.clone(),
        toolmux_mcp::server::ServeOptions::default(),
        reader,
        writer,
    ));
    let (client_read, mut client_write) = tokio::io::split(client_io);
    let mut lines = tokio::io::BufReader::new(client_read).lines();
    let within = std::time::Duration::from_secs(10);
    let mut send = async |message: serde_json::Value| {
        client_write.write_all(format!("{message}\n").as_bytes()).await.unwrap();
    };
    send(json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {"form": {}, "url": {}}},
        "clientInfo": {"name": "raw", "version": "1"}}}))
    .await;
    let mut next = async || -> serde_json::Value {
        let line = tokio::time::timeout(within, lines.next_line()).await.unwrap().unwrap();
        serde_json::from_str(&line.expect("a line")).unwrap()
    };
    assert_eq!(next().await["id"], "init");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "url_elicit", "arguments": {}}}))
    .await;
    let mut seen = Vec::new();
    let result = loop {
        let message = next().await;
        if message["method"] == "elicitation/create" {
            assert_eq!(message["params"]["elicitationId"], "el-7", "{message}");
            send(json!({"jsonrpc": "2.0", "id": message["id"].clone(),
                "result": {"action": "accept"}}))
            .await;
            continue;
        }
        if message["id"] == 2 {
            break message;
        }
        seen.push(message);
    };
    assert_eq!(result["result"]["content"][0]["text"], "url: accept", "{result}");
    // The notice may follow the result: wait for it a moment.
    if !seen.iter().any(|m| m["method"] == "notifications/elicitation/complete") {
        seen.push(next().await);
    }
    let notice = seen.iter().find(|m| m["method"] == "notifications/elicitation/complete");
    assert_eq!(
        notice.map(|m| m["params"]["elicitationId"].clone()),
        Some(json!("el-7")),
        "{seen:?}"
    );
    // The closures' borrows end here: the client closes its side.
    client_write.shutdown().await.unwrap();
    let served = tokio::time::timeout(within, server).await;
    assert!(matches!(served, Ok(Ok(Ok(())))), "the gateway ends with its client: {served:?}");
    provider.shutdown().await.unwrap();
}
