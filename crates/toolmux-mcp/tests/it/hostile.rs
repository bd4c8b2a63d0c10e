//! A hostile stdio server (`tests/fixtures/hostile_server.py`): malformed tools, failed
//! handshakes and malformed results are told for what they are, and cost no more than the
//! part that is wrong.

use serde_json::json;
use std::time::Duration;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig};

use crate::support;

fn provider(mode: &str) -> McpProvider {
    let script = support::fixture("hostile_server.py").display().to_string();
    let config =
        McpServerConfig::stdio(support::python().display().to_string(), [script, mode.into()])
            .with_base_dir(support::run_dir())
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

/// What a failed handshake is told as: the server's own error, the field its answer lacks,
/// the protocol version it chose that toolmux does not speak. Each was `connection closed
/// (server process signal: 9 (SIGKILL) …)`, the kill toolmux's own cleanup, or (the version)
/// accepted.
#[tokio::test]
async fn a_failed_handshake_says_why() {
    let mut told = Vec::new();
    for mode in ["initerror", "nocaps", "noproto", "badproto"] {
        let provider = provider(mode);
        let error = provider.warmup().await.unwrap_err();
        told.push(format!("{mode}: {error}"));
        provider.shutdown().await.unwrap();
    }
    expect_test::expect![[r#"
        initerror: hostile: handshake failed: the server answered the handshake with an error (code -32603): I refuse
        nocaps: hostile: handshake failed: the server's answer to initialize has no `capabilities` (MCP requires protocolVersion, capabilities and serverInfo); the server does not follow the protocol, so update or fix it
        noproto: hostile: handshake failed: the server's answer to initialize has no `protocolVersion` (MCP requires protocolVersion, capabilities and serverInfo); the server does not follow the protocol, so update or fix it
        badproto: hostile: handshake failed: the server answered with protocol version "1999-01-01", which toolmux does not speak (it speaks 2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25, 2026-07-28); MCP has a client disconnect then: update the server, or toolmux if the version is newer"#]].assert_eq(&told.join("\n"));
}

/// A result with a part of unknown type or a text part without text keeps its other parts,
/// the bad one replaced by a note naming it; one that is no result says what it lacks. They
/// failed as `unexpected reply to tools/call: a result with fields content` (or `fields `).
#[tokio::test]
async fn malformed_results_say_which_part_is_wrong() {
    let provider = provider("ok");
    let mut told = Vec::new();
    for r in ["unknown_part", "text_without_text", "empty", "iserror_empty"] {
        let out = provider.call("ok", json!({"r": r}), &CallContext::new()).await;
        told.push(match out {
            Ok(out) => format!("{r}: ok error={} {:?}", out.is_error, out.to_text()),
            Err(e) => format!("{r}: err {e}"),
        });
    }
    expect_test::expect![[r#"
        unknown_part: ok error=false "one\ntwo\nthree\n[content[3] of the tool's result was left out: unknown type \"foo\"]"
        text_without_text: ok error=false "[content[0] of the tool's result was left out: a text part without a `text` string]\ntail"
        empty: err hostile: protocol error: the answer to tools/call of `ok` is no tool result: it is an empty object `{}`, without `content` (a list of parts) or `isError`; the server does not follow MCP, so check whether the call ran
        iserror_empty: ok error=true """#]].assert_eq(&told.join("\n"));
    provider.shutdown().await.unwrap();
}

/// A `$ref` of an input schema that points at nothing is taken out, the rest of the schema
/// kept; a description of a megabyte is cut to 16 KiB with a note. Both went out whole, to
/// model APIs that refuse the first and pay for the second on every turn.
#[tokio::test]
async fn dangling_refs_are_taken_out_and_long_descriptions_cut() {
    let refs_server = provider("refs");
    let tools = refs_server.list_tools().await.unwrap();
    let refs = tools.iter().find(|t| t.name == "refs").unwrap();
    expect_test::expect![[r##"{"$defs":{"name":{"type":"string"}},"properties":{"a":{"description":"kept"},"b":{"$ref":"#/$defs/name"},"c":{"enum":[{"$ref":"#/not/a/schema"}],"type":"string"}},"type":"object"}"##]]
        .assert_eq(&refs.input_schema.to_string());
    refs_server.shutdown().await.unwrap();

    let provider = provider("bigdesc");
    let tools = provider.list_tools().await.unwrap();
    let big = tools.iter().find(|t| t.name == "bigdesc").unwrap();
    assert!(big.description.len() < 17 << 10, "{}", big.description.len());
    assert!(
        big.description.ends_with("[description cut at 16 KiB; the server's was 1048576 bytes]")
    );
    provider.shutdown().await.unwrap();
}

/// A listing that gets no answer within the request timeout is cancelled at the server, as
/// rmcp's own listing did before the pages were read tool by tool.
#[tokio::test]
async fn a_listing_that_times_out_is_cancelled_at_the_server() {
    let told = tempfile::tempdir().unwrap();
    let file = told.path().join("cancelled");
    let script = support::fixture("hostile_server.py").display().to_string();
    let config = McpServerConfig::stdio(
        support::python().display().to_string(),
        [script, "silentlist".into()],
    )
    .with_base_dir(support::run_dir())
    .with_env("CANCELLED_FILE", file.display().to_string())
    .with_startup_timeout(Duration::from_secs(10))
    .with_request_timeout(Duration::from_millis(500));
    let provider = McpProvider::new("hostile", config).unwrap();
    let error = provider.list_tools().await.unwrap_err();
    assert!(error.to_string().contains("no answer to tools/list"), "{error}");
    support::wait_for("the server to hear of the cancellation", Duration::from_secs(5), || {
        file.exists()
    })
    .await;
    let params: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert!(params.get("requestId").is_some(), "{params}");
    provider.shutdown().await.unwrap();
}
