//! Relayed calls (`Orchestrator::relay_tool`): the same stages as any call, with the
//! arguments as text and a plain result passed on as the provider gave it.

use crate::{start, start_with_secret};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{CallContext, Relayed, ToolError, ToolOutput, ToolSpec};
use toolmux_orchestrator::{
    BeforeHook, Orchestrator, OrchestratorConfig, OversizeMode, PermissionRules, QueueConfig,
    RetryPolicy, ToolSettings,
};
use toolmux_test_support::mock::{Behavior, MockProvider};

fn provider() -> Arc<MockProvider> {
    let schema = json!({
        "type": "object",
        "properties": {"message": {"type": "string"}},
        "required": ["message"],
    });
    Arc::new(
        MockProvider::new("m")
            .with_spec(ToolSpec::new("say", "says", schema), Behavior::Text("said".into()))
            .with_tool("big", Behavior::Big(10_000))
            .with_tool("hang", Behavior::Hang)
            .with_tool("bad", Behavior::ErrorOutput("it broke".into()))
            .with_relay(),
    )
}

async fn relay(o: &Orchestrator, name: &str, arguments: &str) -> Result<Relayed, ToolError> {
    o.relay_tool(name, arguments, &CallContext::new(), usize::MAX).await
}

#[tokio::test(start_paused = true)]
async fn a_plain_result_comes_back_as_the_provider_wrote_it_and_is_counted() {
    let p = provider();
    let o = start(OrchestratorConfig::default(), vec![p.clone()]).await;
    assert!(o.relays("m__say"));
    assert!(!o.relays("m__missing"));
    let result = relay(&o, "m__say", r#"{"message": "hi"}"#).await.expect("relayed");
    assert_eq!(
        result,
        Relayed::Raw {
            json: r#"{"content":[{"text":"said","type":"text"}]}"#.into(),
            is_error: false
        }
    );
    assert_eq!(p.relayed_calls(), 1);
    // An error output is decoded, and counted as failed.
    let result = relay(&o, "m__bad", "{}").await.expect("an output");
    assert!(matches!(result, Relayed::Output(ToolOutput { is_error: true, .. })), "{result:?}");
    let snap = o.stats().snapshot();
    assert_eq!((snap.tools["m__say"].ok, snap.tools["m__bad"].failed), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn arguments_are_validated_and_permissions_applied_before_the_provider_is_asked() {
    let p = provider();
    let rules = PermissionRules::default().ask("m__big");
    let o = start(OrchestratorConfig::default().with_permissions(rules), vec![p.clone()]).await;
    let error = relay(&o, "m__say", r#"{"message": 7}"#).await.expect_err("invalid");
    assert!(matches!(error, ToolError::InvalidArguments { .. }), "{error:?}");
    let error = relay(&o, "m__say", "[1, 2").await.expect_err("not JSON");
    assert!(error.report().contains("not JSON"), "{}", error.report());
    // Asked, with nobody to ask: refused.
    assert!(o.relays("m__big"));
    let error = relay(&o, "m__big", "{}").await.expect_err("refused");
    assert!(matches!(error, ToolError::Denied { .. }), "{error:?}");
    assert_eq!(p.total_calls(), 0, "the provider never ran");
    let snap = o.stats().snapshot();
    assert_eq!((snap.tools["m__say"].failed, snap.tools["m__big"].failed), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn an_output_over_the_cap_is_decoded_and_capped() {
    let p = provider();
    let config = OrchestratorConfig {
        oversize: OversizeMode::Truncate,
        ..OrchestratorConfig::default().with_response_max_bytes(1000)
    };
    let o = start(config, vec![p.clone()]).await;
    let Relayed::Output(output) = relay(&o, "m__big", "{}").await.expect("an output") else {
        panic!("an output over the cap cannot pass raw");
    };
    assert_eq!(output.extras["capped"]["bytes"], 10_000);
    assert!(output.to_text().len() < 1100);
    assert_eq!(p.relayed_calls(), 1);
}

/// An error a relayed call fails with is capped as any call's is.
#[tokio::test(start_paused = true)]
async fn an_error_over_the_cap_is_capped() {
    let p = Arc::new(
        MockProvider::new("m").with_tool("fail", Behavior::Fail("E".repeat(20_000))).with_relay(),
    );
    let config = OrchestratorConfig {
        oversize: OversizeMode::Truncate,
        ..OrchestratorConfig::default().with_response_max_bytes(1000)
    };
    let o = start(config, vec![p.clone()]).await;
    let error = relay(&o, "m__fail", "{}").await.expect_err("failed");
    let report = error.report();
    assert!(report.len() <= 1000, "{} bytes", report.len());
    assert!(report.contains("bytes omitted: error message over"), "{report}");
    assert_eq!(p.relayed_calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_relayed_call_times_out_and_frees_its_queue_slot() {
    let p = provider();
    let config = OrchestratorConfig::default()
        .with_tool_timeout(Duration::from_secs(2))
        .with_queue("q", QueueConfig::new(1))
        .with_provider_settings("m", ToolSettings::default().with_queue("q"));
    let o = start(config, vec![p.clone()]).await;
    let error = relay(&o, "m__hang", "{}").await.expect_err("timed out");
    assert!(matches!(error, ToolError::Timeout { .. }), "{error:?}");
    assert_eq!(p.in_flight(), 0, "the provider's call was dropped");
    // The one slot is free again.
    assert!(matches!(relay(&o, "m__say", r#"{"message": "x"}"#).await, Ok(Relayed::Raw { .. })));
    // Cancelled by the caller.
    let ctx = CallContext::new();
    let cancel = ctx.cancel_token().clone();
    let call = o.relay_tool("m__hang", "{}", &ctx, usize::MAX);
    tokio::pin!(call);
    assert!(futures::poll!(&mut call).is_pending());
    cancel.cancel();
    assert!(matches!(call.await, Err(ToolError::Cancelled { .. })));
    assert_eq!(p.in_flight(), 0);
}

#[derive(Debug)]
struct Nothing;

#[async_trait]
impl BeforeHook for Nothing {
    async fn before(&self, _: &str, _: &mut Value, _: &CallContext) -> Result<(), ToolError> {
        Ok(())
    }
}

/// A stage that needs the decoded arguments or output (hooks, the cache, retries,
/// redaction, listeners, a denial) keeps a tool from being relayed.
#[tokio::test(start_paused = true)]
async fn tools_are_not_relayed_where_a_stage_needs_more() {
    let p = provider();
    let plain = Arc::new(MockProvider::new("plain").with_tool("t", Behavior::Echo));
    let o = start(OrchestratorConfig::default(), vec![p.clone(), plain]).await;
    assert!(o.relays("m__say"));
    assert!(!o.relays("plain__t"), "its provider does not relay");
    let events = o.subscribe();
    assert!(!o.relays("m__say"), "someone listens to events");
    drop(events);
    assert!(o.relays("m__say"));

    let hooked = Orchestrator::builder(OrchestratorConfig::default())
        .provider(provider())
        .before_hook("m__*", Arc::new(Nothing))
        .build()
        .expect("valid");
    hooked.warmup().await;
    assert!(!hooked.relays("m__say"), "a hook");

    let settings = ToolSettings::default().with_cache(Duration::from_secs(60));
    let cached = OrchestratorConfig::default().with_tool_settings("m__say", settings);
    let cached = start(cached, vec![provider()]).await;
    assert!(!cached.relays("m__say"), "the cache");

    let retried = ToolSettings::default().with_retry(RetryPolicy::retries(2));
    let config = OrchestratorConfig::default().with_provider_settings("r", retried);
    let read_only = MockProvider::new("r").with_read_only_tool("ro", Behavior::Echo).with_relay();
    let retried = start(config, vec![provider(), Arc::new(read_only)]).await;
    assert!(!retried.relays("r__ro"), "retries");
    assert!(retried.relays("m__say"), "no retries there");

    let denied =
        OrchestratorConfig::default().with_permissions(PermissionRules::default().deny("m__say"));
    let denied = start(denied, vec![provider()]).await;
    assert!(!denied.relays("m__say"), "a denial");

    let secret = start_with_secret(provider()).await;
    assert!(!secret.relays("m__say"), "secrets to redact");
}
