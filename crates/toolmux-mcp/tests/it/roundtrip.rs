//! The two halves fitted together: an [`McpProvider`] in front of this crate's own server
//! (`toolmux-mcp-serve-fixture stdio`) serving the fixture provider. Whatever the fixture
//! offers or asks reaches the provider's caller unchanged, on the handshake revision
//! (server-to-client requests, `logging/setLevel`, `resources/subscribe`) and on
//! 2026-07-28 (`input_required` rounds, per-request log levels, `subscriptions/listen`).

use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{
    CallContext, ContentPart, LogLevel, ResourceBody, Role, ToolError, ToolProvider,
};
use toolmux_mcp::{McpProvider, McpServerConfig, ProtocolMode};

use crate::passthrough::{Answers, SlowPerson, line_text, log_lines};
use crate::support;

const MODES: [(ProtocolMode, &str); 2] =
    [(ProtocolMode::Legacy, "2025-11-25"), (ProtocolMode::Auto, "2026-07-28")];

/// The gateway, not started yet.
fn cold_gateway(mode: ProtocolMode) -> McpProvider {
    let config = McpServerConfig::stdio(env!("CARGO_BIN_EXE_toolmux-mcp-serve-fixture"), ["stdio"])
        .with_base_dir(support::run_dir())
        .with_protocol(mode);
    McpProvider::new("fixture", config).unwrap()
}

async fn gateway(mode: ProtocolMode, version: &str) -> McpProvider {
    let provider = cold_gateway(mode);
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some(version));
    provider
}

#[tokio::test]
async fn prompts_pass_through_both_halves() {
    for (mode, version) in MODES {
        let provider = gateway(mode, version).await;
        let names: Vec<String> =
            provider.list_prompts().await.unwrap().into_iter().map(|p| p.name).collect();
        assert!(names.contains(&"test_prompt_with_arguments".to_owned()), "{names:?}");
        let mut args = toolmux_core::JsonObject::new();
        args.insert("arg1".into(), json!("a"));
        args.insert("arg2".into(), json!("b"));
        let ctx = CallContext::new();
        let prompt = provider.get_prompt("test_prompt_with_arguments", args, &ctx).await.unwrap();
        assert_eq!(
            prompt.messages[0].content,
            ContentPart::Text { text: "Prompt with arguments: arg1='a', arg2='b'".into() }
        );
        let image = provider
            .get_prompt("test_prompt_with_image", toolmux_core::JsonObject::new(), &ctx)
            .await
            .unwrap();
        assert!(matches!(image.messages[0].content, ContentPart::Image { .. }), "{image:?}");
        assert_eq!(image.messages[1].role, Role::User);
        // A prompt that asks the caller's user while it renders.
        let ctx = CallContext::new().with_handler(Arc::new(Answers::default()));
        let asked = provider
            .get_prompt("test_input_required_result_prompt", toolmux_core::JsonObject::new(), &ctx)
            .await
            .unwrap();
        assert_eq!(asked.messages.len(), 1, "{version}: {asked:?}");
        let unknown = provider
            .get_prompt("test_simple_promt", toolmux_core::JsonObject::new(), &CallContext::new())
            .await
            .unwrap_err();
        let ToolError::UnknownPrompt { suggestions, .. } = &unknown else {
            panic!("{version}: {unknown:?}")
        };
        assert!(suggestions.contains(&"test_simple_prompt".to_owned()), "{unknown:?}");
        provider.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn resources_templates_and_updates_pass_through_both_halves() {
    for (mode, version) in MODES {
        let provider = gateway(mode, version).await;
        let ctx = CallContext::new();
        let uris: Vec<String> =
            provider.list_resources().await.unwrap().into_iter().map(|r| r.uri).collect();
        assert!(uris.contains(&"test://static-text".to_owned()), "{uris:?}");
        let text = provider.read_resource("test://static-text", &ctx).await.unwrap();
        assert_eq!(
            text[0].body,
            ResourceBody::Text("This is the content of the static text resource.".into())
        );
        let binary = provider.read_resource("test://static-binary", &ctx).await.unwrap();
        assert!(matches!(binary[0].body, ResourceBody::Blob(_)), "{binary:?}");
        let templates = provider.list_resource_templates().await.unwrap();
        assert_eq!(templates[0].uri_template, "test://template/{id}/data");
        let data = provider.read_resource("test://template/42/data", &ctx).await.unwrap();
        let ResourceBody::Text(data) = &data[0].body else { panic!("{data:?}") };
        assert!(data.contains("Data for ID: 42"), "{data}");
        let missing = provider.read_resource("test://missing", &ctx).await.unwrap_err();
        assert!(matches!(missing, ToolError::UnknownResource { .. }), "{version}: {missing:?}");

        let mut updates = provider.resource_updates().unwrap();
        provider.subscribe_resource("test://watched-resource").await.unwrap();
        provider
            .call("touch_resource", json!({"uri": "test://watched-resource"}), &ctx)
            .await
            .unwrap();
        let updated = tokio::time::timeout(Duration::from_secs(5), updates.next()).await;
        let updated = updated.unwrap_or_else(|_| panic!("{version}: no update within 5 s"));
        assert_eq!(updated.as_deref(), Some("test://watched-resource"), "{version}");
        provider.unsubscribe_resource("test://watched-resource").await.unwrap();
        provider.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn prompt_and_resource_list_changes_pass_through_both_halves() {
    for (mode, version) in MODES {
        let provider = gateway(mode, version).await;
        let mut prompts = provider.prompt_list_changes().expect("prompt list changes");
        let mut resources = provider.resource_list_changes().expect("resource list changes");
        // On 2026-07-28 the subscription stream opens in the background; ask until a change
        // arrives, so the test does not depend on when it is ready.
        let changed = async {
            loop {
                provider
                    .call("test_trigger_prompt_change", json!({}), &CallContext::new())
                    .await
                    .unwrap();
                let both = async { prompts.changed().await && resources.changed().await };
                if let Ok(true) = tokio::time::timeout(Duration::from_millis(200), both).await {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), changed)
            .await
            .unwrap_or_else(|_| panic!("{version}: no list change arrived"));
        provider.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn sampling_elicitation_and_roots_reach_the_callers_handler() {
    for (mode, version) in MODES {
        let provider = gateway(mode, version).await;
        let answers = Arc::new(Answers::default());
        let ctx = CallContext::new().with_handler(answers.clone());
        let sampled =
            provider.call("test_sampling", json!({"prompt": "Say hi"}), &ctx).await.unwrap();
        assert_eq!(sampled.to_text(), "LLM response: a haiku about Say hi", "{version}");
        let elicited =
            provider.call("test_input_required_result_elicitation", json!({}), &ctx).await.unwrap();
        assert_eq!(elicited.to_text(), "Hello, Ada Lovelace!", "{version}");
        let rooted =
            provider.call("test_input_required_result_list_roots", json!({}), &ctx).await.unwrap();
        assert!(rooted.to_text().contains("file:///work/project"), "{version}: {rooted:?}");
        // A URL to open: a server-to-client request, or an `input_required` round.
        let opens = crate::url_elicitation::Opens::new(toolmux_core::ElicitationAction::Accept);
        let ctx_url = CallContext::new().with_handler(opens.clone());
        let opened = provider.call("open_url", json!({}), &ctx_url).await.unwrap();
        assert_eq!(opened.to_text(), "url: accept", "{version}");
        let shown = opens.shown.lock().unwrap().clone();
        assert_eq!(shown.len(), 1, "{version}: {shown:?}");
        assert_eq!(shown[0].url, "https://example.com/sign-in", "{version}");
        assert_eq!(shown[0].message, "Sign in to continue", "{version}");
        // Nobody to show it to: declined, as an unattended client does.
        let unattended = provider.call("open_url", json!({}), &CallContext::new()).await.unwrap();
        assert_eq!(unattended.to_text(), "url: decline", "{version}");
        // Without a handler nobody can sample: on the handshake revision the server's
        // request fails and the tool reports it; on 2026-07-28 the call itself fails,
        // since the provider must answer the `input_required` round and cannot.
        let refused =
            provider.call("test_sampling", json!({"prompt": "Say hi"}), &CallContext::new()).await;
        match refused {
            Ok(out) => assert!(out.is_error && out.to_text().contains("sampling"), "{out:?}"),
            Err(e) => assert!(matches!(e, ToolError::Unsupported { .. }), "{version}: {e:?}"),
        }
        provider.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn log_lines_reach_the_callers_sink() {
    for (mode, version) in MODES {
        // The first call starts the server: its lines come through all the same (the
        // server half sends none before a level is set, so it is set while connecting).
        let provider = cold_gateway(mode);
        let (sink, lines) = log_lines();
        let ctx = CallContext::new().with_log(sink);
        let out = provider.call("test_tool_with_logging", json!({}), &ctx).await.unwrap();
        assert_eq!(out.to_text(), "Logging tool completed");
        assert_eq!(provider.protocol_version().as_deref(), Some(version));
        support::wait_for("three log lines", Duration::from_secs(5), || {
            lines.lock().unwrap().len() >= 3
        })
        .await;
        let seen: Vec<(LogLevel, String)> =
            lines.lock().unwrap().iter().map(|l| (l.level, line_text(l))).collect();
        assert_eq!(
            seen,
            [
                (LogLevel::Info, "Tool execution started".to_owned()),
                (LogLevel::Info, "Tool processing data".to_owned()),
                (LogLevel::Info, "Tool execution completed".to_owned()),
            ],
            "{version}"
        );
        // `debug` is asked for, so debug lines come through too.
        let (sink, lines) = log_lines();
        let ctx = CallContext::new().with_log(sink);
        provider.call("test_logging_tool", json!({}), &ctx).await.unwrap();
        support::wait_for("two log lines", Duration::from_secs(5), || {
            lines.lock().unwrap().len() >= 2
        })
        .await;
        assert_eq!(lines.lock().unwrap()[0].level, LogLevel::Debug, "{version}");
        provider.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_prompt_waiting_for_the_callers_answer_does_not_time_out() {
    for (mode, version) in MODES {
        let config =
            McpServerConfig::stdio(env!("CARGO_BIN_EXE_toolmux-mcp-serve-fixture"), ["stdio"])
                .with_base_dir(support::run_dir())
                .with_protocol(mode)
                .with_request_timeout(Duration::from_millis(300));
        let provider = McpProvider::new("fixture", config).unwrap();
        let ctx = CallContext::new().with_handler(Arc::new(SlowPerson));
        let prompt = provider
            .get_prompt("test_input_required_result_prompt", toolmux_core::JsonObject::new(), &ctx)
            .await;
        assert_eq!(prompt.unwrap().messages.len(), 1, "{version}");
        provider.shutdown().await.unwrap();
    }
}
