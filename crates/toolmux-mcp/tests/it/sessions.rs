//! One upstream connection per run (`perSession`): two runs of a stateful stdio server
//! get two processes, the same run keeps its own, idle ones and the least recently used
//! are closed (their processes reaped), and shutdown closes them all.

use crate::support::{fixture_stdio, wait_for};
use serde_json::json;
use std::time::Duration;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::PerSessionProvider;

async fn pid(provider: &PerSessionProvider, run: &str) -> i32 {
    let ctx = CallContext::new().with_run_id(run);
    let out = provider.call("pid", json!({}), &ctx).await.unwrap();
    out.to_text().parse().unwrap()
}

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn each_run_gets_its_own_server_process() {
    let provider =
        PerSessionProvider::new("fx", fixture_stdio("ok"), 4, Duration::from_secs(60)).unwrap();
    provider.warmup().await.unwrap();
    assert!(provider.list_tools().await.unwrap().iter().any(|t| t.name == "pid"));
    let a = pid(&provider, "run-a").await;
    let b = pid(&provider, "run-b").await;
    assert_ne!(a, b, "two runs share one server");
    assert_eq!(pid(&provider, "run-a").await, a, "a run keeps its server");
    assert_eq!(provider.open_sessions(), ["run-a", "run-b"]);
    assert_eq!(provider.session_pid("run-a"), Some(a));
    provider.shutdown().await.unwrap();
    wait_for("both processes reaped", Duration::from_secs(10), || !alive(a) && !alive(b)).await;
    let error = provider.call("pid", json!({}), &CallContext::new()).await.unwrap_err();
    assert!(error.report().contains("shut down"), "{}", error.report());
}

/// A run that ended (its client's session closed) has its server closed at once, not when
/// it would have idled out; other runs keep theirs.
#[tokio::test]
async fn an_ended_run_has_its_server_closed_at_once() {
    let provider =
        PerSessionProvider::new("fx", fixture_stdio("ok"), 4, Duration::from_secs(3600)).unwrap();
    provider.warmup().await.unwrap();
    let a = pid(&provider, "run-a").await;
    let b = pid(&provider, "run-b").await;
    provider.end_run("run-a");
    provider.end_run("never-ran");
    assert_eq!(provider.open_sessions(), ["run-b"]);
    wait_for("the ended run's process reaped", Duration::from_secs(10), || !alive(a)).await;
    assert!(alive(b), "another run's server was closed");
    // The run may come back: it gets a server of its own again.
    assert_ne!(pid(&provider, "run-a").await, a);
    provider.shutdown().await.unwrap();
}

/// A run that ends while a call of it is in flight has its server closed when that call
/// ends, not when it would have idled out (an hour here). (It was left to the idle
/// reaper, so a gateway's client that closed its session mid-call kept its server
/// process for `sessionIdleMs`.)
#[tokio::test]
async fn a_run_that_ends_during_a_call_has_its_server_closed_when_the_call_ends() {
    let provider = std::sync::Arc::new(
        PerSessionProvider::new("fx", fixture_stdio("ok"), 4, Duration::from_secs(3600)).unwrap(),
    );
    provider.warmup().await.unwrap();
    let a = pid(&provider, "run-a").await;
    let ctx = CallContext::new().with_run_id("run-a");
    let cancel = ctx.cancel_token().clone();
    let call = tokio::spawn({
        let provider = provider.clone();
        async move { provider.call("hang", json!({}), &ctx).await }
    });
    // The call takes its place in the run's session as soon as it runs.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    provider.end_run("run-a");
    assert_eq!(provider.open_sessions(), ["run-a"], "closed under a call in flight");
    cancel.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(10), call).await;
    assert!(ended.expect("the call ends within 10 s").unwrap().is_err());
    wait_for("the ended run's session closed", Duration::from_secs(10), || {
        provider.open_sessions().is_empty()
    })
    .await;
    wait_for("its process reaped", Duration::from_secs(10), || !alive(a)).await;
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn idle_sessions_close_and_the_least_recently_used_makes_room() {
    let provider =
        PerSessionProvider::new("fx", fixture_stdio("ok"), 2, Duration::from_millis(400)).unwrap();
    provider.warmup().await.unwrap();
    let a = pid(&provider, "a").await;
    let b = pid(&provider, "b").await;
    let _ = pid(&provider, "a").await;
    // A third run closes b, the least recently used.
    let c = pid(&provider, "c").await;
    assert_eq!(provider.open_sessions(), ["a", "c"]);
    wait_for("b's process reaped", Duration::from_secs(10), || !alive(b)).await;
    // Without calls, a and c close too.
    wait_for("idle sessions closed", Duration::from_secs(10), || {
        provider.open_sessions().is_empty()
    })
    .await;
    wait_for("their processes reaped", Duration::from_secs(10), || !alive(a) && !alive(c)).await;
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn when_every_session_is_busy_a_new_run_is_told_so() {
    let provider =
        PerSessionProvider::new("fx", fixture_stdio("ok"), 1, Duration::from_secs(60)).unwrap();
    provider.warmup().await.unwrap();
    let busy = CallContext::new().with_run_id("busy");
    let cancel = busy.cancel_token().clone();
    let slow = {
        let provider = &provider;
        async move { provider.call("slow", json!({}), &busy).await }
    };
    let other = async {
        wait_for("the slow call's session", Duration::from_secs(10), || {
            provider.open_sessions() == ["busy"]
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let error = provider
            .call("pid", json!({}), &CallContext::new().with_run_id("other"))
            .await
            .unwrap_err();
        cancel.cancel();
        error
    };
    let (_, error) = tokio::join!(slow, other);
    expect_test::expect!["fx unavailable: all 1 per-session connections are busy with calls of other runs; try again when one ends, or raise `maxSessions`"]
        .assert_eq(&error.report());
    provider.shutdown().await.unwrap();
}

/// A run whose connection was closed to make room or for idling, and calls again, is told
/// with that call's output that the server's state for it is gone; a run that never lost
/// one, or ended, is told nothing.
#[tokio::test]
async fn a_run_whose_connection_was_closed_is_told_when_it_calls_again() {
    let provider =
        PerSessionProvider::new("fx", fixture_stdio("ok"), 1, Duration::from_millis(300)).unwrap();
    provider.warmup().await.unwrap();
    let call = |run: &str| {
        let ctx = CallContext::new().with_run_id(run);
        let provider = &provider;
        async move { provider.call("pid", json!({}), &ctx).await.unwrap().to_text() }
    };
    let first = call("a").await;
    assert!(first.parse::<i32>().is_ok(), "{first}");
    let _ = call("b").await;
    let again = call("a").await;
    assert!(
        again.contains(
            "the connection to server `fx` this run had was closed to make room for \
                        another run's, 1 being open (`maxSessions`)"
        ) && again.contains("is gone"),
        "{again}"
    );
    let _ = call("a").await.parse::<i32>().expect("told once");
    wait_for("a's session idled out", Duration::from_secs(10), || {
        provider.open_sessions().is_empty()
    })
    .await;
    let idle = call("a").await;
    assert!(idle.contains("was closed after 300 ms without calls (`sessionIdleMs`)"), "{idle}");
    provider.shutdown().await.unwrap();
}

/// Dropped without a shutdown, the provider takes every run's server with it.
#[tokio::test]
async fn dropping_the_provider_ends_every_runs_server() {
    let provider =
        PerSessionProvider::new("fx", fixture_stdio("ok"), 4, Duration::from_secs(3600)).unwrap();
    provider.warmup().await.unwrap();
    let a = pid(&provider, "run-a").await;
    let b = pid(&provider, "run-b").await;
    drop(provider);
    wait_for("both processes reaped", Duration::from_secs(10), || !alive(a) && !alive(b)).await;
}
