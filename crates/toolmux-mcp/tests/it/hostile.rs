//! A hostile stdio server (`tests/fixtures/hostile_server.py`): malformed tools, failed
//! handshakes and malformed results are told for what they are, and cost no more than the
//! part that is wrong.

use serde_json::json;
use std::time::Duration;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, ProtocolMode};

use crate::support;

fn provider(mode: &str) -> McpProvider {
    let script = support::fixture("hostile_server.py").display().to_string();
    let config =
        McpServerConfig::stdio(support::python().display().to_string(), [script, mode.into()])
            .with_base_dir(support::run_dir())
            .with_protocol(ProtocolMode::Legacy)
            .with_startup_timeout(Duration::from_secs(10))
            .with_request_timeout(Duration::from_secs(10));
    McpProvider::new("hostile", config).unwrap()
}

/// A tool without inputSchema, with `inputSchema: true` or a string, or without a name is
/// left out; the good tool beside them is kept. The whole provider failed to start
/// (`tools/list: Unexpected response type`).
#[tokio::test]
async fn malformed_tools_are_left_out_and_the_rest_listed() {
    let provider = provider("badtools");
    let tools = provider.list_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["ok"]);
    let out = provider.call("ok", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "ok");
    provider.shutdown().await.unwrap();
}
