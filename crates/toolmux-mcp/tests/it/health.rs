//! The periodic health check (`healthCheckMs`) and [`ToolProvider::health`] against the
//! fixture server over stdio: a server that stops answering is closed after three missed
//! pings and restarted by the next call; one that answers stays up; a lazy one is never
//! started by the check.

use serde_json::json;
use std::time::Duration;
use toolmux_core::{CallContext, Health, ToolProvider};
use toolmux_mcp::{DeclaredTool, McpProvider};

use crate::support;

/// Pings every 100 ms; each waits for its answer up to the check's 1 s minimum.
fn checked(mode: &str) -> McpProvider {
    let config = support::fixture_stdio(mode).with_health_check(Duration::from_millis(100));
    McpProvider::new("fixture", config).unwrap()
}

async fn echo(provider: &McpProvider) -> String {
    let out = provider.call("echo", json!({"message": "hi"}), &CallContext::new()).await;
    out.unwrap().to_text()
}

#[tokio::test]
async fn a_server_that_stops_answering_is_unhealthy_after_three_pings_and_restarted_by_the_next_call()
 {
    let provider = checked("ok");
    provider.warmup().await.unwrap();
    assert_eq!(provider.health(), Health::ok());
    let frozen_pid = provider.server_pid().unwrap();
    let out = provider.call("freeze", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "frozen");
    // Three pings of up to 1 s each, 100 ms apart.
    support::wait_for("the frozen server to be found out", Duration::from_secs(10), || {
        !provider.health().ok
    })
    .await;
    expect_test::expect![[r#"
        Health {
            ok: false,
            detail: Some(
                "no answer to 3 pings in a row; restarts on the next call",
            ),
        }
    "#]]
    .assert_debug_eq(&provider.health());
    // The hung process is gone, not left behind.
    support::assert_group_gone(frozen_pid).await;
    assert_eq!(provider.server_pid(), None, "the check starts nothing itself");
    assert_eq!(echo(&provider).await, "echo: hi");
    let restarted_pid = provider.server_pid().unwrap();
    assert_ne!(restarted_pid, frozen_pid);
    assert_eq!(provider.health(), Health::ok());
    provider.shutdown().await.unwrap();
    support::assert_group_gone(restarted_pid).await;
    assert_eq!(provider.health(), Health::unhealthy("shut down"));
}

#[tokio::test]
async fn a_server_that_answers_stays_healthy() {
    let provider = checked("ok");
    provider.warmup().await.unwrap();
    let pid = provider.server_pid().unwrap();
    // Ten intervals: three missed pings would have restarted it by now.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(provider.health(), Health::ok());
    }
    assert_eq!(provider.server_pid(), Some(pid), "never restarted");
    let out = provider.call("pings", json!({}), &CallContext::new()).await.unwrap();
    let pings: usize = out.to_text().parse().unwrap();
    assert!(pings >= 5, "pinged every 100 ms for a second, answered {pings}");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lazy_server_is_not_started_to_be_pinged() {
    let config = support::fixture_stdio("ok")
        .with_health_check(Duration::from_millis(50))
        .with_lazy(true)
        .with_declared_tool(DeclaredTool {
            name: "echo".into(),
            title: None,
            description: "Echo, as declared".into(),
            input_schema: None,
        });
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(provider.server_pid(), None, "not started by the check");
    assert_eq!(provider.health(), Health::ok().with_detail("not started"));
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_server_that_died_between_calls_is_unhealthy_until_the_next_call() {
    let provider = checked("ok");
    provider.warmup().await.unwrap();
    let pid = provider.server_pid().unwrap();
    rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    support::wait_for("the dead server to be noticed", Duration::from_secs(10), || {
        !provider.health().ok
    })
    .await;
    assert_eq!(
        provider.health(),
        Health::unhealthy("connection closed; restarts on the next call")
    );
    assert_eq!(echo(&provider).await, "echo: hi");
    assert_eq!(provider.health(), Health::ok());
    provider.shutdown().await.unwrap();
}

/// The check holds the connection only while the provider lives: dropping the provider
/// ends it, and with it the server.
#[tokio::test]
async fn dropping_a_checked_provider_ends_its_server() {
    let provider = checked("ok");
    provider.warmup().await.unwrap();
    let pid = provider.server_pid().unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    drop(provider);
    support::assert_group_gone(pid).await;
}

#[test]
fn no_check_unless_asked() {
    let config = support::fixture_stdio("ok");
    assert_eq!(config.health_check_interval(), None);
    let off = config.with_health_check(Duration::ZERO);
    assert_eq!(off.health_check_interval(), None, "0 switches it off");
    let parsed: toolmux_mcp::McpServerConfig =
        serde_json::from_value(json!({"command": "x", "healthCheckMs": 60000})).unwrap();
    assert_eq!(parsed.health_check_interval(), Some(Duration::from_secs(60)));
}

/// A server that does not announce tool list changes has its list re-read on each
/// answered ping, and listeners hear of a change; one that announces them is not asked.
#[tokio::test]
async fn tools_of_a_server_that_does_not_announce_changes_are_re_read() {
    let provider = checked("silent-lists");
    provider.warmup().await.unwrap();
    let before = provider.list_tools().await.unwrap().len();
    let mut changes = provider.tool_list_changes().unwrap();
    let out = provider.call("add_tool", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "added");
    let heard = tokio::time::timeout(Duration::from_secs(10), changes.changed()).await;
    assert_eq!(heard, Ok(true), "listeners hear of the new tool");
    assert_eq!(provider.list_tools().await.unwrap().len(), before + 1);
    provider.shutdown().await.unwrap();

    let announcing = checked("ok");
    announcing.warmup().await.unwrap();
    let lists = |p: &McpProvider| {
        let p = p.clone();
        async move {
            let out = p.call("list_count", json!({}), &CallContext::new()).await.unwrap();
            out.to_text().parse::<usize>().unwrap()
        }
    };
    let first = lists(&announcing).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(lists(&announcing).await, first, "no re-reading when changes are announced");
    announcing.shutdown().await.unwrap();
}

/// `idleShutdownMs`: a server unused for its interval is stopped (its process group gone)
/// and started again by the next call; one in use, or with a call under way however long,
/// keeps running.
#[tokio::test]
async fn an_unused_server_is_stopped_and_the_next_call_starts_it_again() {
    let config = support::fixture_stdio("ok").with_idle_shutdown(Duration::from_millis(300));
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    let first = provider.server_pid().unwrap();
    for _ in 0..6 {
        assert_eq!(echo(&provider).await, "echo: hi");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(provider.server_pid(), Some(first), "used every 100 ms, it runs on");
    support::wait_for("the unused server to stop", Duration::from_secs(10), || {
        provider.server_pid().is_none()
    })
    .await;
    support::assert_group_gone(first).await;
    assert_eq!(
        provider.health(),
        Health::ok().with_detail("stopped after 300 ms without calls; starts on the next call")
    );
    assert_eq!(echo(&provider).await, "echo: hi");
    let second = provider.server_pid().unwrap();
    assert_ne!(second, first);
    assert_eq!(provider.health(), Health::ok());

    // A call under way keeps it running past the interval.
    let cancel = tokio_util::sync::CancellationToken::new();
    let ctx = CallContext::new().with_cancel(cancel.clone());
    let slow = {
        let (provider, ctx) = (provider.clone(), ctx.clone());
        tokio::spawn(async move { provider.call("slow", json!({}), &ctx).await })
    };
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(provider.server_pid(), Some(second), "stopped under a call");
    cancel.cancel();
    let cancelled = slow.await.unwrap();
    assert!(cancelled.is_err());
    support::wait_for("the server to stop once the call ended", Duration::from_secs(10), || {
        provider.server_pid().is_none()
    })
    .await;
    support::assert_group_gone(second).await;
    provider.shutdown().await.unwrap();
}
