//! Against a server on the official Python SDK 2.x (`MCPServer`): a second independent
//! implementation, which negotiates the stateless 2026-07-28 revision.

use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolmux_core::{CallContext, ProgressSink, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, ProtocolMode, TransportKind};
use toolmux_test_support::conformance::{Conformance, SampleCall};

use crate::support::{self, ServerProcess};

fn stdio() -> McpServerConfig {
    let script = support::fixture("python_server.py").display().to_string();
    McpServerConfig::stdio(support::python().display().to_string(), [script, "stdio".into()])
        .with_base_dir(support::run_dir())
}

fn conformance() -> Conformance {
    Conformance::new()
        .with_sample(
            SampleCall::new("echo", json!({"message": "hi"})).expect_text_contains("py echo: hi"),
        )
        .with_sample(SampleCall::new("add", json!({"a": 2, "b": 40})).expect_text_contains("42"))
        .with_sample(
            SampleCall::new("fail", json!({"reason": "on purpose"}))
                .expect_failure()
                .expect_text_contains("on purpose"),
        )
        .with_cancellable(SampleCall::new("sleep", json!({"seconds": 30})))
}

#[tokio::test]
async fn stdio_speaks_2026_07_28_and_passes_the_conformance_suite() {
    let provider = McpProvider::new("py", stdio()).unwrap();
    conformance().check(&provider).await;
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    assert_eq!(provider.instructions().as_deref(), Some("Python fixture: echo, add, count, fail."));
    let out = provider.call("add", json!({"a": 1, "b": 2}), &CallContext::new()).await.unwrap();
    assert_eq!(out.structured, Some(json!({"sum": 3})));
    let pid = provider.server_pid().unwrap();
    provider.shutdown().await.unwrap();
    support::assert_group_gone(pid).await;
}

/// Arguments relayed as the client wrote them carry no request of their own to a server
/// that ends lines at `\r` too, as the Python SDK's text stdin does: JSON lets a bare `\r`
/// stand as whitespace, and the request after one ran as a message apart (here `touch`;
/// in a gateway, a tool `toolsDenied` or a deny rule keeps from its clients), while the
/// relayed call itself went unanswered.
#[tokio::test]
async fn relayed_arguments_carry_no_request_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("touched");
    for mode in [ProtocolMode::Legacy, ProtocolMode::Auto] {
        let config = stdio().with_protocol(mode).with_request_timeout(Duration::from_secs(5));
        let provider = Arc::new(McpProvider::new("py", config).unwrap());
        // Started, so that the call is relayed on its lane.
        provider.list_tools().await.unwrap();
        let smuggled = json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call",
            "params": {"name": "touch", "arguments": {"path": marker}}});
        let arguments = format!("{{\"message\": \"hi\", \"x\":\r{smuggled}\r}}");
        let relayed = provider.relay("echo", &arguments, &CallContext::new(), 1 << 20).await;
        let text = match relayed {
            Ok(toolmux_core::Relayed::Raw { json, .. }) => json.to_string(),
            Ok(toolmux_core::Relayed::Output(output)) => output.to_text(),
            Err(e) => panic!("{mode:?}: {e}"),
        };
        assert!(text.contains("py echo: hi"), "{mode:?}: {text}");
        // A call after it is answered after anything the server read before it.
        let out = provider.call("echo", json!({"message": "after"}), &CallContext::new()).await;
        assert_eq!(out.unwrap().to_text(), "py echo: after");
        assert!(!marker.exists(), "{mode:?}: the request inside the arguments ran");
        provider.shutdown().await.unwrap();
    }
}

/// A prompt or a resource read under way keeps the server running past `idleShutdownMs`,
/// as a call does: the idle stop closed the connection under it, the request failed, and
/// the stop was counted as a failed restart.
#[tokio::test]
async fn idle_shutdown_waits_for_prompts_and_reads_under_way() {
    let config = stdio().with_idle_shutdown(Duration::from_millis(200));
    let provider = McpProvider::new("py", config).unwrap();
    provider.warmup().await.unwrap();
    let pid = provider.server_pid().expect("running");
    let arguments = serde_json::from_value(json!({"seconds": "1"})).unwrap();
    let prompt = provider.get_prompt("slow", arguments, &CallContext::new()).await.unwrap();
    assert!(format!("{prompt:?}").contains("slow prompt"), "{prompt:?}");
    let read = provider.read_resource("slow://wait/1", &CallContext::new()).await.unwrap();
    assert!(format!("{read:?}").contains("slow resource"), "{read:?}");
    assert_eq!(provider.server_pid(), Some(pid), "stopped under a request");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn stdio_legacy_handshake_works_too() {
    let provider = McpProvider::new("py", stdio().with_protocol(ProtocolMode::Legacy)).unwrap();
    let out = provider.call("echo", json!({"message": "old"}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "py echo: old");
    assert_eq!(provider.protocol_version().as_deref(), Some("2025-11-25"));
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn progress_reaches_the_sink_on_2026_07_28() {
    let provider = McpProvider::new("py", stdio()).unwrap();
    let messages: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = {
        let messages = messages.clone();
        ProgressSink::new(move |p| {
            messages.lock().unwrap().push(format!("{}/{:?} {:?}", p.progress, p.total, p.message));
        })
    };
    let out = provider
        .call("count", json!({"steps": 3}), &CallContext::new().with_progress(sink))
        .await
        .unwrap();
    assert_eq!(out.to_text(), "counted to 3");
    expect_test::expect![[r#"["1/Some(3.0) Some(\"step 1\")", "2/Some(3.0) Some(\"step 2\")", "3/Some(3.0) Some(\"step 3\")"]"#]]
        .assert_eq(&format!("{:?}", messages.lock().unwrap()));
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn streamable_http_passes_the_conformance_suite() {
    let port = support::free_port();
    let script = support::fixture("python_server.py").display().to_string();
    let server = ServerProcess::start(
        &support::python().display().to_string(),
        &[script, "http".into(), port.to_string()],
        port,
    );
    let config = McpServerConfig::remote(TransportKind::Http, format!("{}/mcp", server.base));
    let provider = McpProvider::new("py", config).unwrap();
    conformance().check(&provider).await;
    provider.shutdown().await.unwrap();
}

/// A prompt and a resource read carry the caller's trace on to the server (SEP-414), as a
/// tool call does.
#[tokio::test]
async fn prompts_and_resource_reads_carry_the_trace_upstream() {
    let provider = McpProvider::new("py", stdio()).unwrap();
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ctx = CallContext::new()
        .with_trace_parent(toolmux_core::trace::TraceParent::parse(caller))
        .with_trace_state(Some("vendor=abc".into()));
    let expected = format!("traceparent={caller} tracestate=vendor=abc");
    let prompt = provider.get_prompt("traced", toolmux_core::JsonObject::new(), &ctx).await;
    let prompt = prompt.unwrap();
    assert_eq!(
        prompt.messages[0].content,
        toolmux_core::ContentPart::Text { text: expected.clone() }
    );
    let read = provider.read_resource("trace://probe/x", &ctx).await.unwrap();
    assert!(format!("{read:?}").contains(&expected), "{read:?}");
    // Without a trace, none is sent.
    let none = CallContext::new();
    let plain = provider.get_prompt("traced", toolmux_core::JsonObject::new(), &none).await;
    let plain = plain.unwrap();
    assert_eq!(
        plain.messages[0].content,
        toolmux_core::ContentPart::Text { text: "traceparent=None tracestate=None".into() }
    );
    provider.shutdown().await.unwrap();
}

/// A 2026-07-28 stdio server that stops reading its stdin (here stopped by SIGSTOP) cannot
/// hold its connection: a message that waits longer than the request timeout to be written
/// ends it, its call fails saying so, and the next call starts the server afresh. rmcp's
/// sends, which carry every call on this revision, waited for ever, and every call after
/// them timed out on the same stuck server.
#[tokio::test]
async fn a_server_that_stops_reading_is_started_afresh_on_2026_07_28() {
    let config = stdio().with_request_timeout(Duration::from_millis(1000));
    let provider = McpProvider::new("py", config).unwrap();
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    let first = provider.server_pid().unwrap();
    let pid = rustix::process::Pid::from_raw(first).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    // Far more than a pipe holds; the call's own wait is longer than the write's.
    let big = json!({"message": "x".repeat(4 << 20)});
    let ctx = CallContext::new().with_wait(Duration::from_secs(20));
    let started = Instant::now();
    let error = provider.call("echo", big, &ctx).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    expect_test::expect!["py: connection closed (the server stopped reading its stdin: a message waited 1000 ms to be written (`requestTimeoutMs`))"]
        .assert_eq(&error.to_string());
    let out = provider.call("echo", json!({"message": "again"}), &CallContext::new()).await;
    assert_eq!(out.unwrap().to_text(), "py echo: again");
    assert_ne!(provider.server_pid(), Some(first));
    support::assert_group_gone(first).await;
    provider.shutdown().await.unwrap();
}
