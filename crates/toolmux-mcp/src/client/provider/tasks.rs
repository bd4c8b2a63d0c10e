//! Tools a server runs only as tasks, called through [`McpProvider`](super::McpProvider) as
//! plain calls. Two kinds ([`Flavor`]): the 2025-11-25 revision's (described first) and the
//! tasks extension's (SEP-2663, [`Inner::follow_task`]).
//!
//! 2025-11-25: the tool is listed with `execution.taskSupport: "required"`. The call is
//! sent with a `task` field and answered with a task handle; `tasks/result`
//! then waits for the task's end and gives the call's result, while the server's questions
//! (an elicitation asked while the task is `input_required`) reach the call's caller as any
//! other call's do. Beside it `tasks/get` is polled at the server's `pollInterval`: each
//! new status message is reported as the call's progress, and each answer holds off the
//! idle timeout, so a long task is not cut by `requestTimeoutMs`. A call that stops following
//! its task before the task ended (cancelled, timed out, failed, dropped) sends `tasks/cancel`.
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

use rmcp::model::{
    CallToolResult, CancelTaskParams, CancelTaskRequest, ClientCapabilities, ClientRequest,
    CreateTaskResult, CustomRequest, GetTaskParams, GetTaskRequest, InputResponses,
    RequestMetaObject, ServerResult, TASKS_EXTENSION_ID, TaskPayload, UpdateTaskParams,
    UpdateTaskRequest,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use toolmux_core::{CallContext, JsonObject, Progress, ProgressSink, ToolError};

use super::{Inner, Waited};
use crate::McpError;
use crate::client::connection::Connection;
use crate::client::{handler, interaction};

/// How long the server keeps a finished task's result for us: we fetch it at once.
const TASK_TTL_MS: u64 = 5 * 60 * 1000;
/// Bounds of the `tasks/get` polling interval, whatever the server suggests.
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(5);
/// Polling interval when the server suggests none.
const POLL_DEFAULT: Duration = Duration::from_secs(1);
/// How long `tasks/cancel` may take before the caller is let go.
const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// How a server takes the calls of a tool that runs only as a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flavor {
    /// 2025-11-25: the call carries a `task` field; `tasks/result` gives the result.
    Augmented,
    /// The tasks extension (SEP-2663): the call declares the extension in its `_meta`;
    /// `tasks/get` gives the result.
    Extension,
}

impl Flavor {
    /// What a tool listed as requiring tasks expects on `connection`.
    pub(super) fn listed(connection: &Connection) -> Flavor {
        if connection.is_modern() { Flavor::Extension } else { Flavor::Augmented }
    }
}

impl Inner {
    /// Whether (and how) the server said `name` must be called as a task.
    pub(super) fn requires_task(&self, name: &str) -> Option<Flavor> {
        let required = self.task_required.read().unwrap_or_else(|e| e.into_inner());
        // Most servers have no such tool: no hashing on every call.
        if required.is_empty() {
            return None;
        }
        required.get(name).copied()
    }

    /// Remembers that the server refused a plain call of `name` for want of a task.
    pub(super) fn learn_requires_task(&self, name: &str, flavor: Flavor) {
        tracing::debug!(server = %self.name, tool = name, ?flavor, "the server runs this tool only as a task");
        let mut required = self.task_required.write().unwrap_or_else(|e| e.into_inner());
        required.insert(name.to_owned(), flavor);
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
        // runs, naming the task (`related-task`) before the call knows it, so they wait
        // for the link below.
        let flight = self.events.flights.begin_sending(ctx);
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
        flight.link_task(&id);
        let abandon = Abandon::new(connection, &id, Flavor::Augmented);
        let poll = self.poll_interval(task);
        let activity = Arc::new(Notify::new());
        let result = {
            let request = ClientRequest::CustomRequest(CustomRequest::new(
                "tasks/result",
                Some(json!({ "taskId": id })),
            ));
            // Linked: over streamable HTTP its questions come on this request's stream.
            let result = super::catalog::linked(connection, &flight, request);
            let watch = self.watch_task(connection, &id, poll, task, &activity, ctx);
            let both = async {
                tokio::select! {
                    result = result => result,
                    never = watch => match never {},
                }
            };
            self.wait(both, &activity, ctx).await
        };
        if let Waited::Reply(Ok(_)) = result {
            abandon.finished();
        } else {
            tracing::debug!(server = %self.name, task = %id, "cancelling the task");
            drop(abandon);
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
        let mut progress = Reporter::new(ctx.progress_sink());
        progress.report(status_message(created));
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
            progress.report(status_message(&answer));
        }
    }
}

/// Whether a plain call's outcome is the server refusing it because `name` must be called
/// as a task.
pub(super) fn refused_for_task(waited: &Waited) -> Option<Flavor> {
    let mentions_task = |text: &str| {
        let text = text.to_ascii_lowercase();
        text.contains("task augmentation") || text.contains("tasksupport")
    };
    match waited {
        Waited::Reply(Err(ServiceError::McpError(error))) => {
            // 2025-11-25: method not found; the tasks extension: a missing client
            // capability, the extension.
            let data = error.data.as_ref().map(Value::to_string).unwrap_or_default();
            if error.code.0 == MISSING_CLIENT_CAPABILITY
                && (error.message.contains(TASKS_EXTENSION_ID) || data.contains(TASKS_EXTENSION_ID))
            {
                Some(Flavor::Extension)
            } else {
                (error.code.0 == -32601 && mentions_task(&error.message))
                    .then_some(Flavor::Augmented)
            }
        }
        // The TypeScript SDK answers with a tool error carrying that JSON-RPC error.
        Waited::Reply(Ok(ServerResult::CallToolResult(result))) => {
            let refused = result.is_error == Some(true)
                && result.content.len() == 1
                && result.content[0]
                    .as_text()
                    .is_some_and(|t| t.text.contains("-32601") && mentions_task(&t.text));
            refused.then_some(Flavor::Augmented)
        }
        _ => None,
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

/// JSON-RPC code of a request that needs a client capability it did not declare
/// (2026-07-28).
const MISSING_CLIENT_CAPABILITY: i32 = -32021;

/// `_meta` declaring toolmux's client capabilities and the tasks extension, for one
/// request to a 2026-07-28 server: a tool that runs only as a task, and the task's own
/// requests (`tasks/get`, `tasks/update`, `tasks/cancel` are refused without it).
pub(super) fn tasks_meta() -> RequestMetaObject {
    let mut capabilities: ClientCapabilities = handler::client_info().capabilities;
    capabilities
        .extensions
        .get_or_insert_default()
        .insert(TASKS_EXTENSION_ID.to_owned(), JsonObject::new());
    let mut meta = RequestMetaObject::default();
    meta.set_client_capabilities(capabilities);
    meta
}

impl Inner {
    /// Follows a task a 2026-07-28 server created for a call (SEP-2663) to its end:
    /// `tasks/get` at the server's interval, its questions (`input_required`) asked of
    /// the call's caller and answered with `tasks/update`, its status messages reported as
    /// progress, and `tasks/cancel` when the call is cancelled or times out.
    pub(super) async fn follow_task(
        &self,
        connection: &Connection,
        name: &str,
        created: CreateTaskResult,
        ctx: &CallContext,
    ) -> Result<CallToolResult, ToolError> {
        let id = created.task.task_id.clone();
        let mut poll = self.modern_poll(created.task.poll_interval_ms);
        let _flight = self.events.flights.begin(ctx);
        // However following it ends before the task does: `tasks/cancel`.
        let abandon = Abandon::new(connection, &id, Flavor::Extension);
        let mut progress = Reporter::new(ctx.progress_sink());
        progress.report(created.task.status_message);
        let ended = loop {
            tokio::select! {
                () = tokio::time::sleep(poll) => {}
                () = ctx.cancel_token().cancelled() => break Err(ToolError::Cancelled { tool: name.to_owned() }),
                () = self.shutdown.cancelled() => {
                    break Err(McpError::ShutDown { server: self.name.clone() }.into_tool_error(Some(name)));
                }
            }
            let request =
                ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(&id)));
            let task = match self.modern_task_request(connection, name, request, ctx).await? {
                ServerResult::GetTaskResult(got) => got.task,
                other => {
                    let message =
                        format!("tasks/get of task {id} answered {}", super::variant_name(&other));
                    return Err(self.protocol(&message).into_tool_error(Some(name)));
                }
            };
            if let Some(interval) = task.task.poll_interval_ms {
                poll = self.modern_poll(Some(interval));
            }
            progress.report(task.task.status_message.clone());
            match task.payload {
                TaskPayload::Working => {}
                TaskPayload::InputRequired { input_requests } => {
                    let defaults = self.config.accept_elicitation_defaults;
                    let answers = input_requests.into_iter().map(|(key, request)| async move {
                        let answer =
                            interaction::answer_input(&self.name, ctx, &key, request, defaults)
                                .await?;
                        Ok::<_, ToolError>((key, answer))
                    });
                    let responses: InputResponses =
                        futures::future::try_join_all(answers).await?.into_iter().collect();
                    let params = UpdateTaskParams::new(&id, responses);
                    let request = ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(params));
                    self.modern_task_request(connection, name, request, ctx).await?;
                    // The answers may already let it run on: look again at once.
                    poll = POLL_MIN;
                }
                TaskPayload::Completed { result } => {
                    break serde_json::from_value(Value::Object(result)).map_err(|e| {
                        let message = format!(
                            "the result of task {id} of `{name}` is not a tool result: {e}"
                        );
                        self.protocol(&message).into_tool_error(Some(name))
                    });
                }
                TaskPayload::Failed { error } => {
                    let code = error.get("code").and_then(Value::as_i64).unwrap_or(-32603);
                    let message = error.get("message").and_then(Value::as_str).unwrap_or("failed");
                    let error = McpError::Rpc {
                        server: self.name.clone(),
                        method: "tools/call",
                        code: i32::try_from(code).unwrap_or(-32603),
                        message: format!("task {id}: {message}"),
                    };
                    break Err(error.into_tool_error(Some(name)));
                }
                TaskPayload::Cancelled => {
                    let message = format!("the server cancelled task {id} of `{name}`");
                    break Err(self.protocol(&message).into_tool_error(Some(name)));
                }
                _ => {}
            }
        };
        if !matches!(ended, Err(ToolError::Cancelled { .. } | ToolError::Timeout { .. })) {
            // Completed, failed or cancelled by the server: nothing to cancel.
            abandon.finished();
        }
        ended
    }

    /// One SEP-2663 request declaring the tasks extension, with the request timeout and
    /// the call's cancellation.
    async fn modern_task_request(
        &self,
        connection: &Connection,
        name: &str,
        request: ClientRequest,
        ctx: &CallContext,
    ) -> Result<ServerResult, ToolError> {
        let mut options = PeerRequestOptions::no_options();
        options.meta = Some(tasks_meta());
        let response = async {
            connection.peer.send_cancellable_request(request, options).await?.await_response().await
        };
        let waited = self.wait(response, &Notify::new(), ctx).await;
        self.reply(connection, name, waited).await
    }

    fn modern_poll(&self, suggested: Option<u64>) -> Duration {
        let task = json!({ "pollIntervalMs": suggested });
        self.poll_interval(&task)
    }
}

/// Reports each new status message of a task as the call's progress.
struct Reporter<'a> {
    sink: Option<&'a ProgressSink>,
    last: Option<String>,
    reports: u32,
}

impl<'a> Reporter<'a> {
    fn new(sink: Option<&'a ProgressSink>) -> Self {
        Reporter { sink, last: None, reports: 0 }
    }

    fn report(&mut self, message: Option<String>) {
        let Some(message) = message.filter(|m| self.last.as_ref() != Some(m)) else { return };
        self.last = Some(message.clone());
        if let Some(sink) = self.sink {
            self.reports += 1;
            let mut progress = Progress::new(f64::from(self.reports), None);
            progress.message = Some(message);
            sink.report(progress);
        }
    }
}

/// Sends `tasks/cancel` for a task whose call stops following it before its end, however
/// the call stops (cancelled, timed out, failed, or its future dropped by whoever awaited
/// it), from a task of its own since a drop cannot wait.
struct Abandon {
    peer: Peer<RoleClient>,
    id: String,
    flavor: Flavor,
    armed: bool,
}

impl Abandon {
    fn new(connection: &Connection, id: &str, flavor: Flavor) -> Abandon {
        Abandon { peer: connection.peer.clone(), id: id.to_owned(), flavor, armed: true }
    }

    /// The task ended: nothing to cancel.
    fn finished(mut self) {
        self.armed = false;
    }
}

impl Drop for Abandon {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let peer = self.peer.clone();
        let id = std::mem::take(&mut self.id);
        let flavor = self.flavor;
        runtime.spawn(async move {
            let mut options = PeerRequestOptions::no_options();
            let request = match flavor {
                Flavor::Augmented => ClientRequest::CustomRequest(CustomRequest::new(
                    "tasks/cancel",
                    Some(json!({ "taskId": id })),
                )),
                Flavor::Extension => {
                    options.meta = Some(tasks_meta());
                    ClientRequest::CancelTaskRequest(CancelTaskRequest::new(CancelTaskParams::new(
                        &id,
                    )))
                }
            };
            if let Ok(handle) = peer.send_cancellable_request(request, options).await {
                let _ = tokio::time::timeout(CANCEL_GRACE, handle.await_response()).await;
            }
        });
    }
}
