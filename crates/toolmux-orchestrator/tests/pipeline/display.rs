//! Shown calls: a [`CallDisplay`] is told of the calls of the tools configured so
//! (`ToolSettings::show_in_space`), as they start and as they end.

use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolmux_core::{CallContext, ToolCall};
use toolmux_orchestrator::{
    CallDisplay, CallEnd, DisplayFuture, DisplayedCall, Orchestrator, OrchestratorConfig,
    ToolSettings,
};
use toolmux_test_support::mock::{Behavior, MockProvider};

/// What the display was told, one line each.
#[derive(Debug, Default)]
struct Recorder {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("not poisoned").clone()
    }
}

impl CallDisplay for Recorder {
    fn start<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a Value,
        _ctx: &'a CallContext,
    ) -> DisplayFuture<'a, Option<Box<dyn DisplayedCall>>> {
        Box::pin(async move {
            self.lines.lock().expect("not poisoned").push(format!("start {tool} {arguments}"));
            let lines = self.lines.clone();
            Some(Box::new(Shown { tool: tool.to_owned(), lines, ended: false })
                as Box<dyn DisplayedCall>)
        })
    }
}

#[derive(Debug)]
struct Shown {
    tool: String,
    lines: Arc<Mutex<Vec<String>>>,
    ended: bool,
}

impl DisplayedCall for Shown {
    fn end<'a>(mut self: Box<Self>, end: CallEnd<'a>) -> DisplayFuture<'a, ()> {
        self.ended = true;
        let line = match end {
            CallEnd::Answered(output) => format!("answered {}", output.to_text()),
            CallEnd::Failed(report) => format!("failed {report}"),
            CallEnd::Cancelled => "cancelled".to_owned(),
            _ => "other".to_owned(),
        };
        self.lines.lock().expect("not poisoned").push(format!("end {} {line}", self.tool));
        Box::pin(async {})
    }
}

impl Drop for Shown {
    fn drop(&mut self) {
        if !self.ended {
            let mut lines = self.lines.lock().expect("not poisoned");
            lines.push(format!("dropped {}", self.tool));
        }
    }
}

fn shown() -> ToolSettings {
    ToolSettings { show_in_space: Some(true), ..ToolSettings::default() }
}

async fn start(recorder: Arc<Recorder>) -> Orchestrator {
    let provider = MockProvider::new("files")
        .with_tool("read", Behavior::Echo)
        .with_tool("write", Behavior::Text("written".into()))
        .with_tool("fail", Behavior::Fail("disk s3cr3t-value gone".into()))
        .with_tool("big", Behavior::Big(5_000))
        .with_tool("hang", Behavior::Hang);
    let config = OrchestratorConfig::default()
        .with_response_max_bytes(1_000)
        .with_tool_settings("files__read", shown())
        .with_tool_settings("files__fail", shown())
        .with_tool_settings("files__big", shown())
        .with_tool_settings("files__hang", shown());
    let dir = tempfile::tempdir().expect("temporary directory").keep();
    let o = Orchestrator::builder(config)
        .provider(Arc::new(provider))
        .output_store(Arc::new(toolmux_orchestrator::store::DirectoryStore::new(dir)))
        .secrets(["s3cr3t-value".to_owned()])
        .display(recorder)
        .build()
        .expect("valid configuration");
    assert!(o.warmup().await.is_ok());
    o
}

/// A shown call is told with its arguments as it starts and with what its caller gets as
/// it ends, secrets redacted; a tool not configured so is not shown.
#[tokio::test(start_paused = true)]
async fn shown_calls_start_and_end_with_what_their_caller_gets() {
    let recorder = Arc::new(Recorder::default());
    let o = start(recorder.clone()).await;
    let ctx = CallContext::new();
    let read = o.execute(ToolCall::new("files__read", json!({"q": "s3cr3t-value"})), &ctx).await;
    assert!(read.ok, "{read:?}");
    assert!(o.execute(ToolCall::new("files__write", json!({})), &ctx).await.ok);
    let failed = o.execute(ToolCall::new("files__fail", json!({})), &ctx).await;
    assert!(!failed.ok);
    assert_eq!(
        recorder.lines(),
        [
            r#"start files__read {"q":"[redacted]"}"#,
            r#"end files__read answered {"q":"[redacted]"}"#,
            "start files__fail {}",
            "end files__fail failed disk [redacted] gone",
        ]
    );
}

/// A shown call's output over the size cap is shown as its caller gets it: cut or
/// stored, not whole.
#[tokio::test(start_paused = true)]
async fn a_shown_output_is_the_capped_one() {
    let recorder = Arc::new(Recorder::default());
    let o = start(recorder.clone()).await;
    let big = o.call_tool("files__big", json!({}), &CallContext::new()).await.expect("answered");
    let lines = recorder.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1], format!("end files__big answered {}", big.to_text()));
    assert!(lines[1].len() < 2_000, "{}", lines[1]);
}

/// A call its caller cancels ends shown cancelled; one whose future is dropped drops
/// its display unended, which shows it cancelled itself.
#[tokio::test(start_paused = true)]
async fn a_cancelled_or_dropped_call_is_not_left_running() {
    let recorder = Arc::new(Recorder::default());
    let o = start(recorder.clone()).await;
    let cancel = CancellationToken::new();
    let ctx = CallContext::new().with_cancel(cancel.clone());
    let call = o.call_tool("files__hang", json!({}), &ctx);
    let stop = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(call, stop);
    assert!(result.is_err());
    let dropped = tokio::time::timeout(
        Duration::from_secs(1),
        o.call_tool("files__hang", json!({"n": 2}), &CallContext::new()),
    )
    .await;
    assert!(dropped.is_err(), "the call hangs until dropped");
    assert_eq!(
        recorder.lines(),
        [
            "start files__hang {}",
            "end files__hang cancelled",
            r#"start files__hang {"n":2}"#,
            "dropped files__hang",
        ]
    );
}
