//! Tools whose results come from outside toolmux: a person in a user interface, a job
//! runner, another service. toolmux records the call as pending, and another program
//! fetches it and submits the result.
//!
//! Each tool of [`ExternalProvider`] (namespace `external`) is configured by name with an
//! [`ExternalToolConfig`]:
//!
//! - `executionType: internal` needs no execution: the call returns
//!   `{"success": true, "args": …}` at once (a chart the frontend draws from the arguments).
//! - `executionType: external` (or `space`, answered in a user interface) without
//!   `isAsync`: the call waits for the submitted result up to `timeout` milliseconds
//!   (default 30000) and fails when none came. The agent never waits forever; a result
//!   submitted after that goes to the run's inbox.
//! - With `isAsync: true` the call returns `{"status": "pending", "callId": …}` (and the
//!   same id as the seeds' `pendingToolCallId`) at once, and
//!   the result goes to the inbox of the run that made the call when it is submitted.
//! - `executionType: gateway` (and any tool but an internal one with `execution.url`) is an
//!   HTTP request made inline, its response the result: this crate makes no request
//!   itself but hands such calls, by the same name, to the provider given with
//!   [`ExternalProvider::with_http`] (the facade's inline REST tools, built from
//!   [`Execution`]). `isAsync: true` beside a URL is ignored, as the seeds' decision flow
//!   looks at the URL first ([`ExternalToolConfig::warning`] says so).
//!
//! Three tools of the provider serve the other side and the inbox:
//!
//! - `external__pending` (hidden from models): the calls waiting for a result, oldest
//!   first, optionally waiting up to `waitMs` for one to arrive (a long poll); `exclude`
//!   leaves out calls seen already, so that a poll waits for a new one.
//! - `external__submit` (hidden from models): `{callId, result, isError?, runId?}` answers
//!   one call (of run `runId`, when given).
//! - `external__inbox`: what arrived for this run since it last looked, taken out.
//!
//! A program that serves results is an MCP client of `toolmux serve`, as the agent is; the
//! hidden tools are not listed but can be called by name. Pending calls and inboxes live
//! in a [`PendingStore`]; [`MemoryPendingStore`] keeps them in this process, bounded, and
//! [`DirPendingStore`] in a folder that every process using it shares. Each store bounds
//! the pending calls ([`DEFAULT_MAX_PENDING`]), each inbox ([`DEFAULT_MAX_INBOX`], the
//! oldest results dropped) and the runs with unread results ([`DEFAULT_MAX_INBOXES`]: a
//! result for yet another run's inbox is refused, its call left pending); [`Spaces`] bound
//! the spaces and the agents and runs they keep state for (see [`spaces`]).
//!
//! `visible` in the configuration is the seeds' user-interface visibility (whether the call
//! and its result are shown in the active space): it travels with the pending call and the
//! result's extras for the program that renders it, and a tool with `visible: false` is
//! not `shown` (its calls' events carry neither arguments nor result). Every configured
//! tool is shown to models.

#![deny(missing_docs)]

mod folder;
mod gateway;
mod journal;
mod shown;
pub mod spaces;
mod store;
mod store_dir;

pub use gateway::{DEFAULT_HISTORY, GATEWAY_NAMESPACE, GatewayProvider, MAX_PAGE};
pub use shown::ShownCall;
pub use spaces::Spaces;
pub use store::{
    CallStatus, DEFAULT_MAX_INBOX, DEFAULT_MAX_INBOXES, DEFAULT_MAX_PENDING, DEFAULT_PENDING_TTL,
    DEFAULT_RESULT_TTL, Delivery, ExternalResult, InboxEntry, MemoryPendingStore, NotPending,
    PendingCall, PendingStore, inboxes_full,
};
pub use store_dir::DirPendingStore;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{
    CallContext, ToolAnnotations, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec, naming,
};

/// The namespace of the external tools.
pub const NAMESPACE: &str = "external";

/// How long a synchronous external tool waits for its result unless configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest long poll of `external__pending`.
pub const MAX_POLL: Duration = Duration::from_secs(60);

/// How an external tool is answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionType {
    /// By another program, through `external__submit`.
    #[default]
    External,
    /// In a user interface (a person answers), through `external__submit`.
    Space,
    /// Not at all: the arguments are the result.
    Internal,
    /// By an HTTP request to `execution.url`, inline.
    Gateway,
}

/// The HTTP request of a tool made inline (`execution`): `url`, `method` and `headers` may
/// hold `${parameters.x}` placeholders, filled from the call's arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Execution {
    /// The URL (`http://` or `https://`); required for `executionType: gateway`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP method (default `GET`, which sends the arguments as query parameters; `POST`,
    /// `PUT` and `PATCH` send them as a JSON body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// One external tool, under `externalTools` by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExternalToolConfig {
    /// The tool's name, as the seeds' tool objects repeat it; when given it must be the
    /// key the tool is configured under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the tool does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (default: any object).
    #[serde(default, alias = "parametersSchema", skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// `external` (default), `space`, `internal` or `gateway`.
    #[serde(default)]
    pub execution_type: ExecutionType,
    /// The HTTP request that answers the call inline (required for `gateway`; any tool but
    /// an internal one with a `url` is made so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<Execution>,
    /// Return `{"status": "pending"}` at once; the result goes to the run's inbox. Ignored
    /// beside `execution.url` (a warning says so): the request answers the call inline.
    #[serde(default)]
    pub is_async: bool,
    /// How long a synchronous call waits for its result, in milliseconds (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// How long a call of this tool stays pending unanswered, in milliseconds, before it
    /// expires (the seeds' `expiresAt`; a synchronous call's time counts from the end of
    /// its caller's wait); default `defaults.externalCallTtl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_ttl: Option<u64>,
    /// Whether a user interface shows the call and its result (default true, false for
    /// `internal`); passed on with the pending call and the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible: Option<bool>,
}

impl ExternalToolConfig {
    fn shown_in_ui(&self) -> bool {
        self.visible.unwrap_or(self.execution_type != ExecutionType::Internal)
    }

    /// `execution.url` of a tool made as an HTTP request (any tool but an internal one).
    pub fn url(&self) -> Option<&str> {
        let url = self.execution.as_ref().and_then(|e| e.url.as_deref());
        url.filter(|_| self.execution_type != ExecutionType::Internal)
    }

    /// What tool `name`'s configuration says that is not done, for the configuration's
    /// warnings: `isAsync: true` beside `execution.url`, which the seeds' decision flow
    /// looks at after the URL, so the call is the HTTP request, answered inline (as the
    /// seeds' own first example, `confirmAction`, has it).
    pub fn warning(&self, name: &str) -> Option<String> {
        (self.url().is_some() && self.is_async).then(|| {
            format!(
                "externalTools.{name}: `isAsync: true` is ignored: a tool with `execution.url` \
                 is answered inline by its HTTP request; remove `isAsync`, or `execution` for \
                 a result submitted later"
            )
        })
    }

    /// What is wrong with the `execution` of tool `name`, if anything.
    fn check_execution(&self, name: &str) -> Result<(), String> {
        if self.execution_type == ExecutionType::Internal && self.execution.is_some() {
            return Err(format!(
                "`{name}`: an `internal` tool executes nothing; remove `execution` or choose \
                 `executionType: gateway`"
            ));
        }
        if self.execution_type == ExecutionType::Gateway && self.url().is_none() {
            return Err(format!(
                "`{name}`: `executionType: gateway` makes an HTTP request; add `execution.url`"
            ));
        }
        if self.execution.is_some() && self.url().is_none() {
            return Err(format!("`{name}`: `execution` needs a `url`"));
        }
        Ok(())
    }
}

/// The external tools of a configuration, with their pending calls in a [`PendingStore`].
#[derive(Debug, Clone)]
pub struct ExternalProvider {
    tools: Arc<BTreeMap<String, ExternalToolConfig>>,
    store: Arc<dyn PendingStore>,
    spaces: Option<Spaces>,
    /// Makes the calls of the tools with `execution.url`, by the same local name.
    http: Option<Arc<dyn ToolProvider>>,
    /// Set once the task that cancels the space messages of expired calls started; it
    /// runs while a clone of the provider lives (it holds this weakly).
    expiry_watch: Arc<std::sync::OnceLock<()>>,
    /// The withdrawals of dropped calls still being made, which [`ToolProvider::shutdown`]
    /// waits for: a process ending right after an interrupted call (`tools call`, Ctrl-C)
    /// left its call listed in a shared folder.
    cleanups: Cleanups,
}

/// Tasks that finish what a dropped call began.
type Cleanups = Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>;

/// The longest [`ToolProvider::shutdown`] waits for the withdrawals of dropped calls.
const CLEANUP_GRACE: Duration = Duration::from_secs(2);

impl ExternalProvider {
    /// The tools of `tools` (by name), pending calls in `store`. A name that is not a
    /// valid tool name, or one of the provider's own (`pending`, `submit`, `inbox`), or an
    /// input schema that is not an object, or an `execution` that does not fit the
    /// `executionType` (see [`ExternalProvider::with_http`]) is an error naming the tool.
    pub fn new(
        tools: &BTreeMap<String, ExternalToolConfig>,
        store: Arc<dyn PendingStore>,
    ) -> Result<ExternalProvider, String> {
        let mut named = BTreeMap::new();
        for (name, tool) in tools {
            let local = naming::sanitize(name).into_owned();
            if local.is_empty() {
                return Err(format!("`{name}` is not a tool name"));
            }
            if OWN_TOOLS.contains(&local.as_str()) {
                return Err(format!(
                    "`{name}` is the name of a tool of the provider itself ({}); choose another",
                    OWN_TOOLS.join(", ")
                ));
            }
            if let Some(schema) = &tool.input_schema
                && !schema.is_object()
            {
                return Err(format!("`{name}`: `inputSchema` must be a JSON Schema object"));
            }
            if tool.timeout == Some(0) {
                return Err(format!("`{name}`: `timeout` must be at least 1 millisecond"));
            }
            if tool.call_ttl == Some(0) {
                return Err(format!(
                    "`{name}`: `callTtl`: 0 would expire every call at once; give milliseconds \
                     (by default `defaults.externalCallTtl`, an hour)"
                ));
            }
            if let Some(named) = tool.name.as_deref()
                && named != name
            {
                return Err(format!(
                    "`{name}`: `name` says `{named}`; a tool is named by its key under \
                     `externalTools`, so remove `name` or make it `{name}`"
                ));
            }
            tool.check_execution(name)?;
            // The URL comes first (`ExternalToolConfig::warning`): the call is the request.
            let tool = ExternalToolConfig {
                is_async: tool.is_async && tool.url().is_none(),
                ..tool.clone()
            };
            if named.insert(local.clone(), tool).is_some() {
                return Err(format!("two external tools are both named `{local}`"));
            }
        }
        Ok(ExternalProvider {
            tools: Arc::new(named),
            store,
            spaces: None,
            http: None,
            expiry_watch: Arc::default(),
            cleanups: Arc::default(),
        })
    }

    /// Shows the calls of visible tools in the caller's active space, and refuses them to a
    /// caller in no space (the seeds' "visible tools require a space").
    #[must_use]
    pub fn with_spaces(mut self, spaces: Spaces) -> ExternalProvider {
        self.spaces = Some(spaces);
        self
    }

    /// Hands the calls of the tools with `execution.url` to `http`, which offers each of
    /// them under the same local name (the sanitized configured name) and makes the
    /// request: the facade's inline REST tools. Without it, such calls fail.
    #[must_use]
    pub fn with_http(mut self, http: Arc<dyn ToolProvider>) -> ExternalProvider {
        self.http = Some(http);
        self
    }

    /// The store of pending calls.
    pub fn store(&self) -> &Arc<dyn PendingStore> {
        &self.store
    }

    /// Starts, once, the task that marks `cancelled` the space messages of visible calls
    /// that expired unanswered (every [`EXPIRY_EVERY`], while the provider lives), so that
    /// none waits for an answer that can no longer come. A call made in another process
    /// sharing the spaces is looked at too.
    fn watch_expiry(&self) {
        let Some(spaces) = &self.spaces else { return };
        self.expiry_watch.get_or_init(|| {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
            let (alive, store, spaces) =
                (Arc::downgrade(&self.expiry_watch), self.store.clone(), spaces.clone());
            runtime.spawn(async move {
                loop {
                    tokio::time::sleep(EXPIRY_EVERY).await;
                    if alive.strong_count() == 0 {
                        return;
                    }
                    if let Err(e) = cancel_expired(store.as_ref(), &spaces).await {
                        tracing::debug!(target: "toolmux::external", "expired calls' messages not looked at: {e}");
                    }
                }
            });
        });
    }

    async fn run_tool(
        &self,
        name: &str,
        tool: &ExternalToolConfig,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let visible = tool.shown_in_ui();
        let full = format!("{NAMESPACE}__{name}");
        let space = match &self.spaces {
            Some(spaces) if visible => {
                let who = spaces::Who::of(ctx);
                if spaces.active(&who).await?.is_none() {
                    return Ok(not_in_space(&full));
                }
                Some((spaces, who))
            }
            _ => None,
        };
        if tool.execution_type == ExecutionType::Internal {
            let result = json!({"success": true, "args": arguments});
            if let Some((spaces, who)) = &space {
                let message = spaces::ToolMessage {
                    name: full.clone(),
                    tool_name: name.to_owned(),
                    arguments,
                    status: spaces::ToolStatus::Complete,
                    result: Some(result.clone()),
                    call_id: None,
                };
                if spaces.post_tool(who, message).await?.is_err() {
                    return Ok(not_in_space(&full));
                }
            }
            return Ok(ToolOutput::json(result).with_extra("visible", json!(visible)));
        }
        let shown_arguments = space.as_ref().map(|_| arguments.clone());
        if tool.url().is_some() {
            let Some(http) = &self.http else {
                return Err(ToolError::Unavailable {
                    provider: NAMESPACE.to_owned(),
                    message: format!(
                        "`{NAMESPACE}__{name}` makes an HTTP request, and no HTTP provider was \
                         given (`ExternalProvider::with_http`)"
                    ),
                });
            };
            // Shown as it starts, as the seeds show a visible call in real time: posted
            // `requires_action` (under an id of its own, which no pending call has) before
            // the request and finished when it returns, or `cancelled` when the caller gives
            // up, so that a space's clients get `tool.started` when it is made.
            let mut shown = None;
            if let (Some((spaces, who)), Some(arguments)) = (&space, shown_arguments) {
                let id = inline_call_id();
                let message = awaited_message(&full, name, arguments, &id);
                if spaces.post_tool(who, message).await?.is_err() {
                    return Ok(not_in_space(&full));
                }
                shown = Some(FinishOnDrop {
                    spaces: Spaces::clone(spaces),
                    call_id: Some(id),
                    cleanups: self.cleanups.clone(),
                });
            }
            let called = http.call(name, arguments, ctx).await;
            if let Some(mut shown) = shown {
                let (status, result) = match &called {
                    Ok(output) => {
                        let text = output.to_text();
                        let result = serde_json::from_str(&text).unwrap_or(Value::String(text));
                        let failed = output.is_error;
                        (
                            if failed {
                                spaces::ToolStatus::Error
                            } else {
                                spaces::ToolStatus::Complete
                            },
                            result,
                        )
                    }
                    Err(e) => (spaces::ToolStatus::Error, Value::String(e.to_string())),
                };
                // The request is made: a caller whose space cannot be written gets the
                // response all the same (told it failed, it could make a request that
                // changes something twice).
                if let Some(id) = shown.call_id.take()
                    && let Err(e) = shown.spaces.finish_tool(&id, status, Some(result)).await
                {
                    tracing::warn!(target: "toolmux::external", "the call of {full} not shown in its space: {e}");
                }
            }
            return Ok(called?.with_extra("visible", json!(visible)));
        }
        let call = PendingCall {
            call_id: String::new(),
            tool: format!("{NAMESPACE}__{name}"),
            arguments,
            run_id: ctx.run_id().to_owned(),
            owner: agent_of(ctx),
            execution_type: tool.execution_type,
            is_async: tool.is_async,
            visible,
            created_ms: 0,
            status: CallStatus::default(),
            expires_ms: 0,
            ttl_ms: tool.call_ttl,
        };
        // Made within the caller's deadline (a calls folder another process keeps locked
        // fails in time, saying so) and given up when the caller cancels, as when the
        // pipeline drops the call: a calls folder withdraws a call made meanwhile.
        let opening = async {
            match time_left(ctx) {
                Some(left) => self.store.open_within(call, left).await,
                None => self.store.open(call).await,
            }
        };
        let call_id = tokio::select! {
            opened = opening => opened?,
            () = ctx.cancel_token().cancelled() => {
                return Err(ToolError::Cancelled { tool: full });
            }
        };
        // Armed from here: a call dropped at any point from now on (its caller stopped
        // waiting while the message was being posted, or while it waited for the result)
        // is withdrawn and its message, posted or about to be, cancelled or never posted.
        let mut unwaited = WithdrawOnDrop {
            store: self.store.clone(),
            spaces: space.as_ref().map(|(spaces, _)| Spaces::clone(spaces)),
            call_id: Some(call_id.clone()),
            cleanups: self.cleanups.clone(),
            withdrawn: Arc::default(),
        };
        if let (Some((spaces, who)), Some(arguments)) = (&space, shown_arguments) {
            let message = awaited_message(&full, name, arguments, &call_id);
            // The change may run on after this call is dropped (in a task of its own): the
            // guard's flag, looked at under the lock, keeps it from posting then.
            let withdrawn = unwaited.withdrawn.clone();
            match spaces.post_tool_unless(who, message, withdrawn).await {
                Ok(Ok(_)) => {}
                // Left the space in between: the call is not shown, so it is not made.
                Ok(Err(spaces::NotInSpace)) => {
                    self.store.withdraw(&call_id).await;
                    unwaited.call_id = None;
                    return Ok(not_in_space(&full));
                }
                // Not shown either: its caller is told it failed, so nobody may answer it.
                Err(e) => {
                    self.store.withdraw(&call_id).await;
                    unwaited.call_id = None;
                    return Err(e);
                }
            }
            // An answer submitted between the opening and the message found no message to
            // finish. A synchronous call finishes it below when it takes the answer; an
            // asynchronous one that is no longer pending was answered (its result is in
            // the inbox), so its message must not wait for an answer that came already.
            if tool.is_async {
                match self.store.pending(std::slice::from_ref(&full), Duration::ZERO).await {
                    Ok(still) if !still.iter().any(|c| c.call_id == call_id) => {
                        // The result is in the inbox: the call is made, whatever the space.
                        let done = spaces::ToolStatus::Complete;
                        if let Err(e) = spaces.finish_tool(&call_id, done, None).await {
                            tracing::warn!(target: "toolmux::external", "the message of answered call {call_id} not completed: {e}");
                        }
                    }
                    Ok(_) => {}
                    // The call is made: its message waits for the answer, which finishes it.
                    Err(e) => tracing::warn!(
                        target: "toolmux::external",
                        "cannot tell whether call {call_id} was answered already: {e}"
                    ),
                }
            }
        }
        if tool.is_async {
            // Made: from here the call is its caller's, who knows its id.
            unwaited.call_id = None;
            // `pendingToolCallId` is the seeds' name of the same id. The `pendingHandle` extra
            // tells the orchestrator this is the handle, which it passes past a spent context
            // budget; a submitted result, which cannot set extras, is never taken for one.
            let pending =
                json!({"status": "pending", "callId": call_id, "pendingToolCallId": call_id});
            return Ok(ToolOutput::json(pending)
                .with_extra("visible", json!(visible))
                .with_extra("pendingHandle", json!(true)));
        }
        let mut timeout = tool.timeout.map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        // Fail by our own timeout, with its message, before the caller's deadline cuts.
        if let Some(left) = time_left(ctx) {
            timeout = timeout.min(left);
        }
        // Cancelled, or dropped while it waits (the pipeline drops the call when its token
        // fires, so nothing awaited here after that would run), the call is withdrawn and
        // its message cancelled from the drop of `unwaited`.
        let waited = tokio::select! {
            result = self.store.wait(&call_id, timeout) => result,
            () = ctx.cancel_token().cancelled() => return Err(ToolError::Cancelled { tool: full }),
        };
        unwaited.call_id = None;
        match waited {
            Some(result) => {
                if let Some((spaces, _)) = &space {
                    // Finished already by the submission, unless it came before the message
                    // was posted: then here.
                    let status = if result.is_error {
                        spaces::ToolStatus::Error
                    } else {
                        spaces::ToolStatus::Complete
                    };
                    // The result is taken from the store: it is the caller's now, whatever
                    // the space (an error here would lose it).
                    let shown = Some(result.result.clone());
                    if let Err(e) = spaces.finish_tool(&call_id, status, shown).await {
                        tracing::warn!(target: "toolmux::external", "the message of call {call_id} not finished: {e}");
                    }
                }
                Ok(result.into_output().with_extra("visible", json!(visible)))
            }
            // The call stays pending: a result submitted later goes to the run's inbox,
            // which the extras say (an agent's session then reads it for the model).
            None => Ok(ToolOutput::error(format!(
                "no result for `{NAMESPACE}__{name}` (call `{call_id}`) within {} ms; a result \
                 submitted later goes to `{NAMESPACE}__inbox`",
                timeout.as_millis()
            ))
            .with_extra("callId", json!(call_id))
            .with_extra("resultTo", json!("inbox"))),
        }
    }

    /// The calls waiting for a result that the caller may see: with an API key, only its
    /// own holder's (see [`holder`]).
    async fn pending(&self, arguments: &Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let wait = arguments
            .get("waitMs")
            .and_then(Value::as_u64)
            .map_or(Duration::ZERO, Duration::from_millis)
            .min(MAX_POLL);
        let strings = |key: &str| -> Vec<String> {
            arguments
                .get(key)
                .and_then(Value::as_array)
                .map(|items| items.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default()
        };
        let tools = self.tool_names("tools", strings("tools"))?;
        let exclude = strings("exclude");
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let calls = self.store.pending_except(&tools, &exclude, remaining).await?;
            let others = calls.len();
            let calls: Vec<PendingCall> =
                calls.into_iter().filter(|c| may_see(ctx.run_id(), &c.run_id)).collect();
            if !calls.is_empty() || remaining.is_zero() {
                return Ok(ToolOutput::json(json!({ "calls": calls })));
            }
            if others > 0 {
                // Only other holders' calls wait, and the store answers at once while they
                // do: ask again a little later, until the caller's wait is over.
                tokio::select! {
                    () = tokio::time::sleep(OTHERS_POLL.min(remaining)) => {}
                    () = ctx.cancel_token().cancelled() => {
                        return Ok(ToolOutput::json(json!({ "calls": [] })));
                    }
                }
            }
        }
    }

    /// `names` (of `key`, a list of tools) as full tool names: a tool's own name (`confirm`) is read as
    /// `external__confirm`; a name of no external tool is refused, with the closest (it
    /// matched nothing, and the listing came back empty or waited to its end).
    fn tool_names(&self, key: &str, names: Vec<String>) -> Result<Vec<String>, ToolError> {
        let known: Vec<String> = self.tools.keys().map(|n| format!("{NAMESPACE}__{n}")).collect();
        names
            .into_iter()
            .map(|name| {
                if known.contains(&name) {
                    return Ok(name);
                }
                let full = format!("{NAMESPACE}__{name}");
                if known.contains(&full) {
                    return Ok(full);
                }
                let local: Vec<&str> = self.tools.keys().map(String::as_str).collect();
                let bare = name.strip_prefix(&format!("{NAMESPACE}__")).unwrap_or(&name);
                let hint = match toolmux_core::suggest::closest(bare, &local) {
                    Some(near) => format!("; did you mean `{NAMESPACE}__{near}`?"),
                    None => format!("; the external tools: {}", known.join(", ")),
                };
                Err(ToolError::invalid_arguments(
                    "external__pending",
                    format!("`{key}` names `{name}`, which is no external tool{hint}"),
                ))
            })
            .collect()
    }

    async fn submit(&self, arguments: Value, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let invalid = |message: &str| ToolError::invalid_arguments("external__submit", message);
        let Some(call_id) = arguments.get("callId").and_then(Value::as_str) else {
            return Err(invalid("`callId` (a string) is required"));
        };
        let Some(result) = arguments.get("result").cloned() else {
            return Err(invalid("`result` is required (a string, or any JSON value)"));
        };
        let is_error = arguments.get("isError").and_then(Value::as_bool).unwrap_or(false);
        let of_run = arguments.get("runId").and_then(Value::as_str);
        let by = ctx.run_id();
        if holder(by).is_some() || of_run.is_some() {
            // A key holder answers only its own runs' calls; another's call is unknown to it,
            // as is a call of another run than the one named.
            let calls = self.store.pending(&[], Duration::ZERO).await?;
            let call = calls.iter().find(|c| c.call_id == call_id);
            let Some(listed) = call else {
                // Not pending: the store says why (expired, or unknown), as resolving would.
                return Err(self.refuse(call_id).await);
            };
            if !may_see(by, &listed.run_id) {
                return Err(store::unknown_call(call_id));
            }
            if let (Some(call), Some(run)) = (call, of_run)
                && call.run_id != run
            {
                return Err(invalid(&format!(
                    "no pending call `{call_id}` in run `{run}`: it was made in another run \
                     (`external__pending` gives each call's `runId`)"
                )));
            }
        }
        let shown = self.spaces.as_ref().map(|_| (result.clone(), is_error));
        let answer = ExternalResult { result, is_error };
        let delivery = match self.store.resolve(call_id, answer).await {
            Ok(delivery) => delivery,
            Err(e @ (ToolError::InvalidArguments { .. } | ToolError::Gone { .. })) => {
                // Refused: when the call expired, its message no longer waits.
                let _ = self.refuse(call_id).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if let (Some(spaces), Some((result, is_error))) = (&self.spaces, shown) {
            let status =
                if is_error { spaces::ToolStatus::Error } else { spaces::ToolStatus::Complete };
            // The result is delivered: its submitter is told so (told it failed, it would
            // submit again and be refused), and the message stays as it was.
            if let Err(e) = spaces.finish_tool(call_id, status, Some(result)).await {
                tracing::warn!(target: "toolmux::external", "the message of call {call_id} not finished: {e}");
            }
        }
        match delivery {
            Delivery::Waiting => {
                let told = ToolOutput::text(format!("`{call_id}`: handed to the waiting call"));
                Ok(told.with_extra("delivered", json!("call")))
            }
            Delivery::Inbox { run_id } => {
                tracing::debug!(target: "toolmux::external", by, "result of {call_id} to the inbox of run {run_id}");
                let told = ToolOutput::text(format!("`{call_id}`: put in the inbox of its run"));
                Ok(told.with_extra("delivered", json!("inbox")))
            }
        }
    }

    /// The refusal of a result for call `call_id`, which is not pending; the space message
    /// of a call that expired is marked `cancelled` (it no longer waits for an answer).
    async fn refuse(&self, call_id: &str) -> ToolError {
        let why = match self.store.not_pending(call_id).await {
            Ok(why) => why,
            Err(e) => return e,
        };
        if let (NotPending::Expired { .. }, Some(spaces)) = (why, &self.spaces)
            && let Err(e) = spaces.finish_tool(call_id, spaces::ToolStatus::Cancelled, None).await
        {
            tracing::warn!(target: "toolmux::external", "the message of expired call {call_id} not cancelled: {e}");
        }
        why.into_error(call_id)
    }

    /// The results in the caller's inbox: an agent's own (a sub-agent shares its caller's
    /// run, not its results), anyone else's the run's.
    async fn inbox(&self, ctx: &CallContext) -> Result<ToolOutput, ToolError> {
        let owner = agent_of(ctx);
        // Counted first: a store that fails then has taken nothing out. A call answered in
        // between is counted and its result taken, which costs the reader one more look.
        let waiting = self.store.count_pending(ctx.run_id(), owner.as_deref()).await?;
        let results = self.store.take_inbox(ctx.run_id(), owner.as_deref()).await?;
        Ok(ToolOutput::json(json!({ "results": results, "stillPending": waiting })))
    }
}

/// Withdraws a call whose caller was cancelled or dropped after it was opened (while its
/// message was being posted, or while it waited): at once where the store can (an
/// interrupted process may end right after), else in a task of its own, which also marks
/// the call's space message `cancelled`.
struct WithdrawOnDrop {
    store: Arc<dyn PendingStore>,
    /// The spaces the call's message is posted to.
    spaces: Option<Spaces>,
    /// `None` once the call is its caller's (returned, or its wait ended).
    call_id: Option<String>,
    /// Where the task that finishes the withdrawal is kept.
    cleanups: Cleanups,
    /// Set when the call is withdrawn: a posting of its message still under way (in a task
    /// of its own) looks at it under the spaces' lock and posts nothing. Set before the
    /// task that cancels a message posted already starts, so that one of the two always
    /// sees the other's work.
    withdrawn: Arc<std::sync::atomic::AtomicBool>,
}

/// The message of a visible inline (HTTP) call, posted before its request: marked
/// `cancelled` when the call is dropped before it was finished (its caller gave up).
struct FinishOnDrop {
    spaces: Spaces,
    /// `None` once finished.
    call_id: Option<String>,
    /// Where the task that cancels the message is kept.
    cleanups: Cleanups,
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        let Some(call_id) = self.call_id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let spaces = self.spaces.clone();
        let task = runtime.spawn(async move {
            if let Err(e) = spaces.finish_tool(&call_id, spaces::ToolStatus::Cancelled, None).await
            {
                tracing::warn!(target: "toolmux::external", "the message of cancelled call {call_id} not cancelled: {e}");
            }
        });
        let mut cleanups = self.cleanups.lock().unwrap_or_else(|e| e.into_inner());
        cleanups.retain(|task| !task.is_finished());
        cleanups.push(task);
    }
}

/// The message showing a call of the tool `name` (`full` as its caller names it) in a
/// space while its answer is awaited, under `call_id`.
fn awaited_message(full: &str, name: &str, arguments: Value, call_id: &str) -> spaces::ToolMessage {
    spaces::ToolMessage {
        name: full.to_owned(),
        tool_name: name.to_owned(),
        arguments,
        status: spaces::ToolStatus::RequiresAction,
        result: None,
        call_id: Some(call_id.to_owned()),
    }
}

/// An id for the space message of an inline call, unique among the processes sharing the
/// spaces (the process, the time, a count) and unlike every pending call's.
fn inline_call_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let nanos = since.map_or(0, |d| d.as_nanos());
    format!("http:{}:{nanos}:{n}", std::process::id())
}

impl Drop for WithdrawOnDrop {
    fn drop(&mut self) {
        let Some(call_id) = self.call_id.take() else { return };
        self.withdrawn.store(true, std::sync::atomic::Ordering::Release);
        let withdrawn = self.store.withdraw_now(&call_id);
        if withdrawn && self.spaces.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (store, spaces) = (self.store.clone(), self.spaces.take());
        let task = runtime.spawn(async move {
            if !withdrawn {
                store.withdraw(&call_id).await;
            }
            if let Some(spaces) = spaces
                && let Err(e) =
                    spaces.finish_tool(&call_id, spaces::ToolStatus::Cancelled, None).await
            {
                tracing::warn!(target: "toolmux::external", "the message of cancelled call {call_id} not cancelled: {e}");
            }
        });
        let mut cleanups = self.cleanups.lock().unwrap_or_else(|e| e.into_inner());
        cleanups.retain(|task| !task.is_finished());
        cleanups.push(task);
    }
}

/// How often the space messages of visible calls are looked at for calls that expired.
const EXPIRY_EVERY: Duration = Duration::from_secs(10);

/// Marks `cancelled` the messages in `spaces` that wait for an answer to a call `store`
/// says expired.
async fn cancel_expired(store: &dyn PendingStore, spaces: &Spaces) -> Result<(), ToolError> {
    let waiting = spaces.waiting_tool_calls().await?;
    if waiting.is_empty() {
        return Ok(());
    }
    let pending = store.pending(&[], Duration::ZERO).await?;
    for id in waiting.iter().filter(|id| !pending.iter().any(|c| &c.call_id == *id)) {
        // A call answered just now is not pending either: only one the store says
        // expired is cancelled; the answer finishes the other.
        if let NotPending::Expired { .. } = store.not_pending(id).await? {
            spaces.finish_tool(id, spaces::ToolStatus::Cancelled, None).await?;
        }
    }
    Ok(())
}

/// The agent a call descends from (`agent:NAME`), as spaces name it; `None` for any other
/// caller.
fn agent_of(ctx: &CallContext) -> Option<String> {
    Some(spaces::Who::of(ctx).entity).filter(|entity| entity.starts_with("agent:"))
}

/// The seeds' answer to a visible tool called outside a space.
fn not_in_space(tool: &str) -> ToolOutput {
    ToolOutput::error(format!(
        "Tool \"{tool}\" is visible but you are not in a space. Call {GATEWAY_NAMESPACE}__enter_space \
         first."
    ))
}

/// How often `external__pending` looks again while only other holders' calls wait.
const OTHERS_POLL: Duration = Duration::from_millis(100);

/// The API key holder a run belongs to: `toolmux serve --http` names the runs of a key's
/// holder `key:NAME/…` ([`toolmux_core::holder_run_id`]). `None` for runs without a key
/// (stdio, no keys configured).
fn holder(run_id: &str) -> Option<std::borrow::Cow<'_, str>> {
    toolmux_core::run_holder(run_id)
}

/// Whether a caller in run `caller` may see and answer a call made in run `call`: a key
/// holder only its own holder's calls, so that two tenants of one gateway never see each
/// other's pending calls; a caller without a key (one tenant) every call.
fn may_see(caller: &str, call: &str) -> bool {
    match holder(caller) {
        Some(name) => holder(call).is_some_and(|theirs| theirs == name),
        None => true,
    }
}

/// The names of the provider's own tools.
const OWN_TOOLS: [&str; 3] = ["pending", "submit", "inbox"];

/// How much longer than its own wait a call may take: time to withdraw it and answer.
pub(crate) const ANSWER_MARGIN: Duration = Duration::from_secs(1);

/// How long a call may wait in its store before its caller's deadline, keeping time to
/// give up by itself, with its own message, before the deadline cuts it: a fifth of what
/// is left, at most half of [`ANSWER_MARGIN`] (the time a folder store takes at most to
/// give up a wait). `None` without a deadline.
fn time_left(ctx: &CallContext) -> Option<Duration> {
    let left = ctx.deadline()?.saturating_duration_since(tokio::time::Instant::now());
    Some(left - (left / 5).min(ANSWER_MARGIN / 2))
}

fn own_tools() -> Vec<ToolSpec> {
    let hidden =
        ToolAnnotations { visible: false, open_world: false, ..ToolAnnotations::default() };
    vec![
        ToolSpec::new(
            "pending",
            "The calls of external tools waiting for a result, oldest first: `callId`, `tool`, \
             `arguments`, `runId`, `async`, `visible`, `status`, `expiresMs` (when it expires \
             unanswered, ms since the Unix epoch). For the program that answers them.",
            json!({
                "type": "object",
                "properties": {
                    "waitMs": {"type": "integer", "minimum": 0, "maximum": MAX_POLL.as_millis(),
                               "description": "Wait up to this long for a call when none is pending."},
                    "tools": {"type": "array", "items": {"type": "string"},
                              "description": "Only calls of these tools (full names, or their own names)."},
                    "exclude": {"type": "array", "items": {"type": "string"}, "maxItems": 10000,
                                "description": "Leave out these calls (by `callId`: those seen already); with `waitMs`, wait for another."}
                },
                "additionalProperties": false
            }),
        )
        .with_annotations(hidden.clone())
        .with_time_limit(MAX_POLL + ANSWER_MARGIN),
        ToolSpec::new(
            "submit",
            "Answers a pending external call: the waiting call returns `result`, or it goes to \
             the inbox of the call's run.",
            json!({
                "type": "object",
                "properties": {
                    "callId": {"type": "string"},
                    "result": {"description": "A text, or any JSON value."},
                    "isError": {"type": "boolean", "description": "The result is a failure."},
                    "runId": {"type": "string", "description": "The run the call must belong to (refused otherwise)."}
                },
                "required": ["callId", "result"],
                "additionalProperties": false
            }),
        )
        .with_annotations(hidden),
        ToolSpec::new(
            "inbox",
            "Results of external calls that arrived after their call returned (asynchronous \
             tools, or results later than their timeout), each once, and how many calls of \
             this run are still pending.",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
        )
        .with_annotations(ToolAnnotations { open_world: false, ..ToolAnnotations::default() }),
    ]
}

#[async_trait]
impl ToolProvider for ExternalProvider {
    /// Calls waiting, results and spaces are the calling run's (or key holder's).
    fn state_per_run(&self) -> bool {
        true
    }

    fn kind(&self) -> ToolKind {
        ToolKind::External
    }

    fn namespace(&self) -> &str {
        NAMESPACE
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        let mut tools: Vec<ToolSpec> = self
            .tools
            .iter()
            .map(|(name, tool)| {
                let schema = tool.input_schema.clone().unwrap_or_else(|| json!({"type": "object"}));
                let annotations = ToolAnnotations {
                    read_only: tool.execution_type == ExecutionType::Internal,
                    idempotent: tool.execution_type == ExecutionType::Internal,
                    // `visible: false` here: the call runs silently, its result for the
                    // agent alone, so events do not carry them.
                    shown: tool.shown_in_ui(),
                    ..ToolAnnotations::default()
                };
                let spec =
                    ToolSpec::new(name, &tool.description, schema).with_annotations(annotations);
                // A synchronous call waits for its result up to its own `timeout` and then
                // answers saying the result goes to the inbox: the pipeline waits as long.
                match tool.is_async || tool.execution_type == ExecutionType::Internal {
                    true => spec,
                    false => {
                        let wait = tool.timeout.map_or(DEFAULT_TIMEOUT, Duration::from_millis);
                        spec.with_time_limit(wait + ANSWER_MARGIN)
                    }
                }
            })
            .collect();
        tools.extend(own_tools());
        Ok(tools)
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.watch_expiry();
        match name {
            "pending" => self.pending(&arguments, ctx).await,
            "submit" => self.submit(arguments, ctx).await,
            "inbox" => self.inbox(ctx).await,
            _ => match self.tools.get(name) {
                Some(tool) => self.run_tool(name, tool, arguments, ctx).await,
                None => {
                    Err(ToolError::UnknownTool { name: name.to_owned(), suggestions: Vec::new() })
                }
            },
        }
    }

    fn instructions(&self) -> Option<String> {
        let asynchronous: Vec<String> = self
            .tools
            .iter()
            .filter(|(_, t)| t.is_async && t.execution_type != ExecutionType::Internal)
            .map(|(n, _)| format!("`{NAMESPACE}__{n}`"))
            .collect();
        (!asynchronous.is_empty()).then(|| {
            format!(
                "{} return `{{\"status\": \"pending\"}}` at once; their results arrive later: \
                 call `{NAMESPACE}__inbox` to collect them.",
                asynchronous.join(", ")
            )
        })
    }

    /// Waits (at most [`CLEANUP_GRACE`]) for the withdrawals of dropped calls to be made.
    async fn shutdown(&self) -> Result<(), ToolError> {
        let tasks = std::mem::take(&mut *self.cleanups.lock().unwrap_or_else(|e| e.into_inner()));
        let all = async {
            for task in tasks {
                let _ = task.await;
            }
        };
        let _ = tokio::time::timeout(CLEANUP_GRACE, all).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::may_see;
    use toolmux_core::holder_run_id;

    #[test]
    fn holders_whose_names_share_a_prefix_up_to_a_slash_are_apart() {
        let ci = holder_run_id("team/ci", "s1");
        let web = holder_run_id("team/web", "s2");
        let team = holder_run_id("team", "s3");
        assert!(!may_see(&ci, &web), "{ci} sees {web}");
        assert!(!may_see(&web, &ci), "{web} sees {ci}");
        assert!(!may_see(&team, &ci), "{team} sees {ci}");
        assert!(may_see(&ci, &holder_run_id("team/ci", "s4")));
        assert!(may_see("stdio-run", &ci));
    }
}
