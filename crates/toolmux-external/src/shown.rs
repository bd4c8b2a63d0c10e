//! The call of any tool shown in its caller's active space as it runs
//! ([`Spaces::show_call`]): the facade's `tools.NAME.showInSpace`, shown as a visible
//! external tool's inline (HTTP) call is, so that a user interface renders both alike.

use crate::Spaces;
use crate::spaces::{NotInSpace, ToolMessage, ToolStatus, Who};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use toolmux_core::{ToolError, ToolOutput};

impl Spaces {
    /// Posts the call of `tool` (its full name, also its `toolName`) with `arguments` to
    /// `who`'s active space as it starts, `requires_action` under an id of its own that no
    /// pending call has: the space's clients get `tool.started`. `None` when `who` is in no
    /// space. Dropped before it is posted (its caller gave up), nothing stays posted.
    pub async fn show_call(
        &self,
        who: &Who,
        tool: &str,
        arguments: Value,
    ) -> Result<Option<ShownCall>, ToolError> {
        let id = shown_call_id();
        // Armed before the posting: a caller that stops waiting while it is under way (in
        // a task of its own in a folder or a shared storage) drops the guard, whose flag
        // keeps the posting from happening after, or whose task cancels the message.
        let mut shown = ShownCall {
            spaces: self.clone(),
            call_id: Some(id.clone()),
            withdrawn: Arc::default(),
        };
        let message = ToolMessage {
            name: tool.to_owned(),
            tool_name: tool.to_owned(),
            arguments,
            status: ToolStatus::RequiresAction,
            result: None,
            call_id: Some(id),
        };
        let posted = self.post_tool_unless(who, message, shown.withdrawn.clone()).await;
        match posted {
            Ok(Ok(_)) => Ok(Some(shown)),
            Ok(Err(NotInSpace)) => {
                shown.call_id = None;
                Ok(None)
            }
            Err(e) => {
                shown.call_id = None;
                Err(e)
            }
        }
    }
}

/// A call posted to a space by [`Spaces::show_call`], waiting for its end. Dropped
/// unfinished (its caller stopped waiting), it marks the message `cancelled`, in a task of
/// its own.
#[derive(Debug)]
#[must_use = "dropped, the call is shown cancelled"]
pub struct ShownCall {
    spaces: Spaces,
    /// `None` once finished.
    call_id: Option<String>,
    /// Set when dropped: a posting still under way posts nothing then.
    withdrawn: Arc<AtomicBool>,
}

impl ShownCall {
    /// The tool answered `output`: `complete` with its result (its text, as JSON when it
    /// is JSON), or `error` for an output marked as an error, as a visible inline call's
    /// response is shown.
    pub async fn answered(self, output: &ToolOutput) -> Result<(), ToolError> {
        let text = output.to_text();
        let result = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let status = if output.is_error { ToolStatus::Error } else { ToolStatus::Complete };
        self.finish(status, Some(result)).await
    }

    /// The call failed with `report`: `error`, the report as its result.
    pub async fn failed(self, report: &str) -> Result<(), ToolError> {
        self.finish(ToolStatus::Error, Some(Value::String(report.to_owned()))).await
    }

    /// The call was cancelled: `cancelled`, without a result.
    pub async fn cancelled(self) -> Result<(), ToolError> {
        self.finish(ToolStatus::Cancelled, None).await
    }

    async fn finish(mut self, status: ToolStatus, result: Option<Value>) -> Result<(), ToolError> {
        let Some(id) = self.call_id.clone() else { return Ok(()) };
        // The id is kept until the message is finished: dropped halfway, the guard still
        // cancels it.
        let finished = self.spaces.finish_tool(&id, status, result).await;
        self.call_id = None;
        finished.map(|_| ())
    }
}

impl Drop for ShownCall {
    fn drop(&mut self) {
        self.withdrawn.store(true, Ordering::Release);
        let Some(call_id) = self.call_id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let spaces = self.spaces.clone();
        runtime.spawn(async move {
            if let Err(e) = spaces.finish_tool(&call_id, ToolStatus::Cancelled, None).await {
                tracing::warn!(target: "toolmux::external", "the message of cancelled call {call_id} not cancelled: {e}");
            }
        });
    }
}

/// An id for the space message of a shown call, unique among the processes sharing the
/// spaces (the process, the time, a count) and unlike every pending call's.
fn shown_call_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let nanos = since.map_or(0, |d| d.as_nanos());
    format!("shown:{}:{nanos}:{n}", std::process::id())
}
