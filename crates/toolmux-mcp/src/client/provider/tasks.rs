//! Tools a server runs only as tasks (2025-11-25, `execution.taskSupport: "required"`),
//! called through [`McpProvider`](super::McpProvider) as plain calls.
//!
//! The call is sent with a `task` field and answered with a task handle; `tasks/result`
//! then waits for the task's end and gives the call's result, while the server's questions
//! (an elicitation asked while the task is `input_required`) reach the call's caller as any
//! other call's do. Beside it `tasks/get` is polled at the server's `pollInterval`: each
//! new status message is reported as the call's progress, and each answer holds off the
//! idle timeout, so a long task is not cut by `requestTimeoutMs`. A call cancelled or timed
//! out sends `tasks/cancel`.
//!
//! The caller sees a plain call, so the gateway lists such a tool as taking tasks
//! optionally: its own clients may call it either way.
//!
//! rmcp's model drops a listed tool's `execution`; the transports toolmux parses itself
//! (stdio, legacy SSE, WebSocket) keep it (`transport::TASK_SUPPORT_META_KEY`). Over
//! streamable HTTP, whose messages rmcp parses, a tool is known to require tasks when a
//! plain call is refused for that reason (the error JSON-RPC's -32601 the 2025-11-25
//! revision prescribes, or the TypeScript SDK's tool error carrying it); the call is then
//! sent again as a task, since a refused call did not run.

use rmcp::model::{CallToolResult, ClientRequest, CustomRequest, ServerResult};
use rmcp::service::ServiceError;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use toolmux_core::{CallContext, JsonObject, Progress, ToolError};

use super::{Inner, Waited};
use crate::McpError;
use crate::client::connection::Connection;

/// How long the server keeps a finished task's result for us: we fetch it at once.
const TASK_TTL_MS: u64 = 5 * 60 * 1000;
/// Bounds of the `tasks/get` polling interval, whatever the server suggests.
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(5);
/// Polling interval when the server suggests none.
const POLL_DEFAULT: Duration = Duration::from_secs(1);
/// How long `tasks/cancel` may take before the caller is let go.
const CANCEL_GRACE: Duration = Duration::from_secs(1);

impl Inner {
    /// Whether the server said `name` must be called as a task.
    pub(super) fn requires_task(&self, name: &str) -> bool {
        self.task_required.read().unwrap_or_else(|e| e.into_inner()).contains(name)
    }

    /// Remembers that the server refused a plain call of `name` for want of a task.
    pub(super) fn learn_requires_task(&self, name: &str) {
        tracing::debug!(server = %self.name, tool = name, "the server runs this tool only as a task");
        self.task_required.write().unwrap_or_else(|e| e.into_inner()).insert(name.to_owned());
    }

    /// Calls `name` as a task and waits for its result.
    pub(super) async fn call_as_task(
        &self,
        connection: &Connection,
        name: &str,
        arguments: Option<&JsonObject>,
        ctx: &CallContext,
    ) -> Result<CallToolResult, ToolError> {
        let tool_error = |e: McpError| e.into_tool_error(Some(name));
        let mut params = json!({ "name": name, "task": { "ttl": TASK_TTL_MS } });
        if let Some(arguments) = arguments {
            params["arguments"] = Value::Object(arguments.clone());
        }
        // In flight from the start: the server may ask its questions as soon as the task
        // runs, and they go to the latest call in flight that carries no other token.
        let _flight = self.events.flights.begin(ctx);
        let created = match self.task_request(connection, name, "tools/call", params, ctx).await? {
            // A server may answer at once after all.
            ServerResult::CallToolResult(result) => return Ok(result),
            other => json_of(&other),
        };
        let task = created.get("task").unwrap_or(&Value::Null);
        let Some(id) = task.get("taskId").and_then(Value::as_str).map(str::to_owned) else {
            let message = format!("`{name}` was called as a task but the answer has no task id");
            return Err(tool_error(self.protocol(&message)));
        };
        let poll = self.poll_interval(task);
        let activity = Arc::new(Notify::new());
        let result = {
            let request = ClientRequest::CustomRequest(CustomRequest::new(
                "tasks/result",
                Some(json!({ "taskId": id })),
            ));
            let result = connection.peer.send_request(request);
            let watch = self.watch_task(connection, &id, poll, task, &activity, ctx);
            let both = async {
                tokio::select! {
                    result = result => result,
                    never = watch => match never {},
                }
            };
            self.wait(both, &activity, ctx).await
        };
        if let Some(reason) = result.abandons() {
            tracing::debug!(server = %self.name, task = %id, reason, "cancelling the task");
            let request = ClientRequest::CustomRequest(CustomRequest::new(
                "tasks/cancel",
                Some(json!({ "taskId": id })),
            ));
            let _ = tokio::time::timeout(CANCEL_GRACE, connection.peer.send_request(request)).await;
        }
        match self.reply(connection, name, result).await? {
            ServerResult::CallToolResult(result) => Ok(result),
            other => {
                let value = json_of(&other);
                serde_json::from_value(value).map_err(|_| {
                    let message =
                        format!("the result of task {id} of `{name}` is not a tool result");
                    tool_error(self.protocol(&message))
                })
            }
        }
    }

    /// The server's suggested polling interval within bounds, and at most half the
    /// request timeout, which each answer holds off.
    fn poll_interval(&self, task: &Value) -> Duration {
        poll_interval(task).min(self.config.request_timeout() / 2).max(POLL_MIN)
    }

    /// One request of the task protocol with the request timeout and the call's
    /// cancellation.
    async fn task_request(
        &self,
        connection: &Connection,
        name: &str,
        method: &'static str,
        params: Value,
        ctx: &CallContext,
    ) -> Result<ServerResult, ToolError> {
        let request = ClientRequest::CustomRequest(CustomRequest::new(method, Some(params)));
        let waited = self.wait(connection.peer.send_request(request), &Notify::new(), ctx).await;
        self.reply(connection, name, waited).await
    }

    /// Polls `tasks/get` for ever: a new status message becomes the call's progress, and
    /// every answer is activity. Failures are left to `tasks/result`, which says more.
    async fn watch_task(
        &self,
        connection: &Connection,
        id: &str,
        mut poll: Duration,
        created: &Value,
        activity: &Notify,
        ctx: &CallContext,
    ) -> std::convert::Infallible {
        let mut last = status_message(created);
        let mut reports = 0u32;
        let report = |message: Option<String>, reports: &mut u32| {
            if let (Some(sink), Some(message)) = (ctx.progress_sink(), message) {
                *reports += 1;
                let mut progress = Progress::new(f64::from(*reports), None);
                progress.message = Some(message);
                sink.report(progress);
            }
        };
        report(last.clone(), &mut reports);
        loop {
            tokio::time::sleep(poll).await;
            let request = ClientRequest::CustomRequest(CustomRequest::new(
                "tasks/get",
                Some(json!({ "taskId": id })),
            ));
            let answer = tokio::time::timeout(
                self.config.request_timeout(),
                connection.peer.send_request(request),
            )
            .await;
            let Ok(Ok(answer)) = answer else { continue };
            activity.notify_one();
            let answer = json_of(&answer);
            if ["pollInterval", "pollIntervalMs"]
                .iter()
                .any(|k| answer.get(k).is_some_and(Value::is_u64))
            {
                poll = self.poll_interval(&answer);
            }
            let message = status_message(&answer);
            if message.is_some() && message != last {
                report(message.clone(), &mut reports);
                last = message;
            }
        }
    }
}

/// Whether a plain call's outcome is the server refusing it because `name` must be called
/// as a task.
pub(super) fn refused_for_task(waited: &Waited) -> bool {
    let mentions_task = |text: &str| {
        let text = text.to_ascii_lowercase();
        text.contains("task augmentation") || text.contains("tasksupport")
    };
    match waited {
        Waited::Reply(Err(ServiceError::McpError(error))) => {
            error.code.0 == -32601 && mentions_task(&error.message)
        }
        // The TypeScript SDK answers with a tool error carrying that JSON-RPC error.
        Waited::Reply(Ok(ServerResult::CallToolResult(result))) => {
            result.is_error == Some(true)
                && result.content.len() == 1
                && result.content[0]
                    .as_text()
                    .is_some_and(|t| t.text.contains("-32601") && mentions_task(&t.text))
        }
        _ => false,
    }
}

fn json_of(result: &ServerResult) -> Value {
    serde_json::to_value(result).unwrap_or(Value::Null)
}

fn status_message(task: &Value) -> Option<String> {
    task.get("statusMessage").and_then(Value::as_str).map(str::to_owned)
}

/// The server's suggested polling interval (`pollInterval`, or 2026-07-28's
/// `pollIntervalMs`), within bounds.
fn poll_interval(task: &Value) -> Duration {
    task.get("pollInterval")
        .or_else(|| task.get("pollIntervalMs"))
        .and_then(Value::as_u64)
        .map_or(POLL_DEFAULT, Duration::from_millis)
        .clamp(POLL_MIN, POLL_MAX)
}
