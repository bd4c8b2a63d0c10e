//! Tools server-everything runs only as tasks (2025-11-25 tasks, `taskSupport:
//! "required"`): called through `McpProvider` as plain calls, over stdio (where the listing
//! says so) and streamable HTTP (where the server's refusal says so).

use async_trait::async_trait;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, ElicitationAction, ElicitationRequest,
    ElicitationResponse, InteractionHandler, Progress, ProgressSink, TaskSupport, ToolError,
    ToolProvider,
};
use toolmux_mcp::{McpProvider, McpServerConfig, ProtocolMode, TransportKind};

use crate::support;

const RESEARCH: &str = "simulate-research-query";

/// Answers the research tool's clarifying question with one interpretation.
#[derive(Debug, Default)]
struct Clarifies {
    asked: Mutex<Vec<String>>,
}

#[async_trait]
impl InteractionHandler for Clarifies {
    async fn approve(&self, _request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Allow
    }

    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        self.asked.lock().unwrap().push(request.message);
        let mut content = toolmux_core::JsonObject::new();
        content.insert("interpretation".into(), json!("snake"));
        Ok(ElicitationResponse { action: ElicitationAction::Accept, content: Some(content) })
    }
}

fn progress_messages() -> (ProgressSink, Arc<Mutex<Vec<Progress>>>) {
    let reports: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = {
        let reports = reports.clone();
        ProgressSink::new(move |p| reports.lock().unwrap().push(p))
    };
    (sink, reports)
}

#[tokio::test]
async fn a_task_only_tool_is_listed_as_taking_tasks_and_called_as_a_plain_call() {
    let provider = McpProvider::new("everything", support::everything_stdio()).unwrap();
    let tools = provider.list_tools().await.unwrap();
    let support_of = |name: &str| {
        tools.iter().find(|t| t.name == name).map(|t| t.annotations.task_support).unwrap()
    };
    // toolmux runs it as a task upstream either way, so its own callers may choose.
    assert_eq!(support_of(RESEARCH), TaskSupport::Optional);
    assert_eq!(support_of("echo"), TaskSupport::Forbidden);

    let handler = Arc::new(Clarifies::default());
    let (sink, reports) = progress_messages();
    let ctx = CallContext::new().with_handler(handler.clone()).with_progress(sink);
    let out =
        provider.call(RESEARCH, json!({"topic": "python", "ambiguous": true}), &ctx).await.unwrap();
    let text = out.to_text();
    assert!(!out.is_error, "{text}");
    // The question asked while the task was `input_required` reached the caller, and its
    // answer reached the task.
    assert!(text.contains("# Research Report: python (snake)"), "{text}");
    let asked = handler.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert!(asked[0].contains("multiple interpretations"), "{asked:?}");
    // The task's status messages became the call's progress, in order, without repeats.
    let reports = reports.lock().unwrap().clone();
    let messages: Vec<String> = reports.iter().filter_map(|p| p.message.clone()).collect();
    assert_eq!(messages.first().map(String::as_str), Some("Gathering sources..."), "{messages:?}");
    assert!(messages.len() >= 3, "{messages:?}");
    assert!(messages.windows(2).all(|w| w[0] != w[1]), "{messages:?}");
    let steps: Vec<f64> = reports.iter().map(|p| p.progress).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");

    // Other tools are still plain calls on the same connection.
    let echo = provider.call("echo", json!({"message": "after"}), &CallContext::new()).await;
    assert_eq!(echo.unwrap().to_text(), "Echo: after");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_task_longer_than_the_request_timeout_is_held_open_by_polling() {
    // The task takes 4 s; the request timeout is 1 s, so the call lives on `tasks/get`
    // answers (polled at most every half timeout) resetting it.
    let config = support::everything_stdio().with_request_timeout(Duration::from_secs(1));
    let provider = McpProvider::new("everything", config).unwrap();
    provider.list_tools().await.unwrap();
    let out = provider.call(RESEARCH, json!({"topic": "rust"}), &CallContext::new()).await.unwrap();
    assert!(out.to_text().contains("# Research Report: rust"), "{}", out.to_text());
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn cancelling_a_task_call_returns_at_once() {
    let provider = McpProvider::new("everything", support::everything_stdio()).unwrap();
    provider.list_tools().await.unwrap();
    let ctx = CallContext::new();
    let cancel = ctx.cancel_token().clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(600)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let err = provider.call(RESEARCH, json!({"topic": "go"}), &ctx).await.unwrap_err();
    assert!(matches!(err, ToolError::Cancelled { .. }), "{err:?}");
    // Cancelled at 0.6 s, `tasks/cancel` sent within its 1 s grace: well before the 4 s the
    // task would take.
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let echo = provider.call("echo", json!({"message": "still"}), &CallContext::new()).await;
    assert_eq!(echo.unwrap().to_text(), "Echo: still");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn over_streamable_http_the_refusal_says_a_task_is_needed() {
    let port = support::free_port();
    let args = [support::everything_js().display().to_string(), "streamableHttp".into()];
    let server = support::ServerProcess::start("node", &args, port);
    let config = McpServerConfig::remote(TransportKind::Http, format!("{}/mcp", server.base));
    let provider = McpProvider::new("everything", config).unwrap();
    for topic in ["first", "second"] {
        let out = provider.call(RESEARCH, json!({"topic": topic}), &CallContext::new()).await;
        let text = out.unwrap().to_text();
        assert!(text.contains(&format!("# Research Report: {topic}")), "{text}");
    }
    provider.shutdown().await.unwrap();
}

/// This crate's own server (`toolmux-mcp-serve-fixture`), whose task tools follow the
/// tasks extension (SEP-2663): a tool that runs only as a task refuses a call that does not
/// declare the extension (`-32021`), on either revision.
fn fixture(mode: ProtocolMode) -> McpProvider {
    let config = McpServerConfig::stdio(env!("CARGO_BIN_EXE_toolmux-mcp-serve-fixture"), ["stdio"])
        .with_base_dir(support::run_dir())
        .with_protocol(mode);
    McpProvider::new("fixture", config).unwrap()
}

#[tokio::test]
async fn a_tool_of_the_tasks_extension_that_runs_only_as_a_task_answers_a_plain_call() {
    for mode in [ProtocolMode::Legacy, ProtocolMode::Auto] {
        let provider = fixture(mode);
        let handler = Arc::new(crate::passthrough::Answers::default());
        let ctx = CallContext::new().with_handler(handler.clone());
        // Twice: refused once and learnt, then declared from the start.
        for round in 0..2 {
            let out = provider.call("test_tool_with_task", json!({}), &ctx).await;
            let out = out.unwrap_or_else(|e| panic!("{mode:?} round {round}: {e}"));
            assert_eq!(out.to_text(), "Hello, Ada Lovelace!", "{mode:?} round {round}");
        }
        assert_eq!(handler.asked.lock().unwrap().len(), 2, "{mode:?}");
        // A tool error inside the task is the call's tool error, not a failure.
        let failed = provider.call("failing_job", json!({}), &CallContext::new()).await.unwrap();
        assert!(failed.is_error, "{mode:?}: {failed:?}");
        assert!(failed.to_text().contains("the job failed"), "{mode:?}: {failed:?}");
        // Cancelled while the task runs: back at once.
        let ctx = CallContext::new();
        let cancel = ctx.cancel_token().clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            cancel.cancel();
        });
        let started = Instant::now();
        let err = provider.call("failing_job", json!({}), &ctx).await.unwrap_err();
        assert!(matches!(err, ToolError::Cancelled { .. }), "{mode:?}: {err:?}");
        assert!(started.elapsed() < Duration::from_millis(900), "{:?}", started.elapsed());
        // Tools that may run as tasks are still plain calls.
        let greet = provider.call("greet", json!({"name": "x"}), &CallContext::new()).await;
        assert_eq!(greet.unwrap().to_text(), "Hello, x!", "{mode:?}");
        provider.shutdown().await.unwrap();
    }
}

/// A task whose call stops following it is cancelled upstream, whether the call was
/// cancelled or its future dropped (a caller's own timeout).
#[tokio::test]
async fn a_task_no_longer_followed_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("tasks.log");
    let script = support::fixture("task_server.py").display().to_string();
    let config = McpServerConfig::stdio(
        support::python().display().to_string(),
        [script, log.display().to_string()],
    )
    .with_base_dir(support::run_dir());
    let provider = McpProvider::new("tasks", config).unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();

    // Cancelled by its caller.
    let ctx = CallContext::new();
    let cancel = ctx.cancel_token().clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        cancel.cancel();
    });
    let err = provider.call("slow", json!({}), &ctx).await.unwrap_err();
    assert!(matches!(err, ToolError::Cancelled { .. }), "{err:?}");
    support::wait_for("tasks/cancel", Duration::from_secs(5), || read().contains("cancel t1"))
        .await;
    assert!(read().starts_with("create\nresult\n"), "{}", read());

    // Dropped by whoever awaited it.
    std::fs::write(&log, "").unwrap();
    let dropped = tokio::time::timeout(
        Duration::from_millis(400),
        provider.call("slow", json!({}), &CallContext::new()),
    )
    .await;
    assert!(dropped.is_err(), "the task never ends");
    support::wait_for("tasks/cancel", Duration::from_secs(5), || read().contains("cancel t1"))
        .await;
    provider.shutdown().await.unwrap();
}
