//! Command hooks: a program run for each matching call that speaks Claude Code's hook
//! contract, so that hook scripts written for Claude Code work unchanged.
//!
//! The program gets one JSON object on its stdin (`session_id`, `cwd`, `hook_event_name`,
//! `tool_name`, `tool_input`, `tool_use_id`, and for `PostToolUse` `tool_response`) and
//! answers by its exit code and stdout:
//!
//! - exit 0: success; stdout, when it is a JSON object, may decide (`continue: false`,
//!   `decision: "block"`, `hookSpecificOutput.permissionDecision`), rewrite the arguments
//!   (`updatedInput`) or the output (`updatedMCPToolOutput`) and add context
//!   (`additionalContext`); other stdout is ignored;
//! - exit 2: blocks; stderr is the reason (`PreToolUse`: the call is refused;
//!   `PostToolUse`: the result becomes an error result, the tool having run);
//! - any other exit code, a program that cannot start, or one that runs past its timeout:
//!   a non-blocking error, as in Claude Code: a warning names the hook and the call goes on.
//!   A hook meant as a guard must therefore exit 2 (or answer `deny`) to refuse, never just
//!   fail.

use super::{AfterHook, BeforeHook};
use crate::orchestrator::OrchestratorBuilder;
use crate::redact::Redactor;
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, ContentPart, ToolError, ToolOutput,
};

/// Bytes of a hook's stdout read; the rest is drained and dropped.
const STDOUT_MAX: usize = 1024 * 1024;
/// Bytes of a hook's stderr kept.
const STDERR_MAX: usize = 64 * 1024;
/// Bytes of a reason (stderr, `reason`, `stopReason`) passed on to the model.
const REASON_MAX: usize = 4 * 1024;
/// How long a killed hook is given to be reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);
/// Calls remembered between the two halves of a hook (see [`CommandHook::attach`]).
const PENDING_MAX: usize = 256;
/// The key of [`ToolOutput::extras`] that marks a result a `PostToolUse` hook blocked:
/// later hooks leave it alone.
const BLOCKED: &str = "blockedByHook";

/// The tool events a command hook runs on, named as in Claude Code's settings.
///
/// Claude Code's events of the conversation loop (`SessionStart`, `UserPromptSubmit`,
/// `Stop`, `SubagentStop`) are not the pipeline's: toolmux's agents run them
/// (`toolmux_agent::AgentHooks`), with [`run_program`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HookEvent {
    /// Before the call, after permission rules and argument validation: may refuse the
    /// call, ask for approval or rewrite the arguments.
    PreToolUse,
    /// After a successful provider call, before the size cap: may block the result, replace
    /// it or add context.
    PostToolUse,
}

impl HookEvent {
    /// Every event, in the order hooks of each run.
    pub const ALL: [HookEvent; 2] = [HookEvent::PreToolUse, HookEvent::PostToolUse];

    /// Its name in configuration files and in the hook's input (`hook_event_name`).
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
        }
    }
}

impl fmt::Display for HookEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which tools a hook runs for, read as Claude Code reads a hook's `matcher`: empty or `*`
/// matches every tool; a pattern of only letters, digits, `_` and `|` is a list of exact
/// names (`fs__write|fs__edit`); anything else is a regular expression found anywhere in
/// the full tool name (as JavaScript's `RegExp.test`), so `^fs__` and `read$` anchor it.
#[derive(Debug, Clone)]
pub struct ToolMatcher(Matcher);

#[derive(Debug, Clone)]
enum Matcher {
    All,
    Names(Vec<String>),
    Regex(regex::Regex),
}

/// A hook matcher that is not a valid regular expression.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid regular expression `{pattern}`: {message}")]
pub struct InvalidMatcher {
    /// The matcher as written.
    pub pattern: String,
    /// What is wrong with it.
    pub message: String,
}

impl ToolMatcher {
    /// Matches every tool.
    pub fn all() -> ToolMatcher {
        ToolMatcher(Matcher::All)
    }

    /// Reads `pattern` as described on [`ToolMatcher`].
    pub fn new(pattern: &str) -> Result<ToolMatcher, InvalidMatcher> {
        let pattern = pattern.trim();
        if pattern.is_empty() || pattern == "*" {
            return Ok(ToolMatcher::all());
        }
        if pattern.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|') {
            let names = pattern.split('|').filter(|n| !n.is_empty()).map(str::to_owned);
            return Ok(ToolMatcher(Matcher::Names(names.collect())));
        }
        let regex = regex::Regex::new(pattern).map_err(|e| InvalidMatcher {
            pattern: pattern.to_owned(),
            // The regex crate's message repeats the pattern over several lines; its last
            // line says what is wrong.
            message: e
                .to_string()
                .lines()
                .last()
                .unwrap_or("")
                .trim_start_matches("error: ")
                .to_owned(),
        })?;
        Ok(ToolMatcher(Matcher::Regex(regex)))
    }

    /// Whether the hook runs for `tool` (a full name).
    pub fn matches(&self, tool: &str) -> bool {
        match &self.0 {
            Matcher::All => true,
            Matcher::Names(names) => names.iter().any(|n| n == tool),
            Matcher::Regex(regex) => regex.is_match(tool),
        }
    }
}

impl Default for ToolMatcher {
    fn default() -> Self {
        ToolMatcher::all()
    }
}

/// A configured program run for each matching call (see the module documentation for the
/// contract).
///
/// It runs through `sh -c` in a session of its own (so in its own process group, with no
/// controlling terminal: a prompt on `/dev/tty` fails at once), in its folder (the
/// configuration file's), with `TOOLMUX_PROJECT_DIR` and `CLAUDE_PROJECT_DIR` set to that
/// folder, for at most its timeout (default 60 s): then its process group is killed and
/// reaped, and the call goes on. Processes it leaves behind are ended when it exits. Its
/// stdout is read up to 1 MiB, its stderr up to 64 KiB; reasons passed on to the model are
/// cut at 4 KiB and have the secrets given to [`CommandHook::with_secrets`] redacted.
///
/// A hook has two halves, attached together by [`CommandHook::attach`]: a `PreToolUse`
/// hook runs its program as a before-hook and, as an after-hook, appends the
/// `additionalContext` its program gave to the call's output (Claude Code adds it to the
/// model's context; here the output is what reaches the model). A `PostToolUse` hook
/// remembers the call's final arguments as a before-hook (for `tool_input`) and runs its
/// program as an after-hook. A call served from the response cache runs both halves too.
pub struct CommandHook {
    event: HookEvent,
    command: String,
    dir: PathBuf,
    matcher: ToolMatcher,
    timeout: Duration,
    redactor: Redactor,
    /// What the before half left for the after half, oldest first.
    // Invariant: at most `PENDING_MAX` entries; a call that fails between the halves leaves
    // its entry behind until pushed out.
    pending: Mutex<VecDeque<Pending>>,
}

impl fmt::Debug for CommandHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandHook")
            .field("event", &self.event)
            .field("command", &self.label())
            .field("dir", &self.dir)
            .field("matcher", &self.matcher)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What one call's before half left: the `PreToolUse` context to append, or the
/// `PostToolUse` arguments.
#[derive(Debug)]
struct Pending {
    key: CallKey,
    value: Value,
}

/// One call, as both halves of a hook see it: the orchestrator hands hooks the call's own
/// operation, whose id is unique in the process; run, call id and tool besides, for hooks
/// called without one.
#[derive(Debug, PartialEq, Eq)]
struct CallKey {
    op: Option<u64>,
    run: String,
    call: Option<String>,
    tool: String,
}

impl CallKey {
    fn of(tool: &str, ctx: &CallContext) -> CallKey {
        CallKey {
            op: ctx.op().map(|op| op.id()),
            run: ctx.run_id().to_owned(),
            call: ctx.call_id().map(str::to_owned),
            tool: tool.to_owned(),
        }
    }
}

/// How a hook's program ended.
#[derive(Debug)]
pub struct HookExit {
    /// Its exit code (`None`: ended by a signal).
    pub code: Option<i32>,
    /// Its stdout, the first MiB.
    pub stdout: String,
    /// Its stderr, the first 64 KiB.
    pub stderr: String,
}

/// Why a hook's program gave no answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum HookFailure {
    /// `sh` could not start.
    Spawn(std::io::Error),
    /// Waiting for it failed.
    Wait(std::io::Error),
    /// It ran past its timeout and was killed.
    Timeout(Duration),
    /// The caller gave up.
    Cancelled,
}

impl fmt::Display for HookFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookFailure::Spawn(e) => write!(f, "cannot start `sh`: {e}"),
            HookFailure::Wait(e) => write!(f, "waiting for it failed: {e}"),
            HookFailure::Timeout(after) => {
                write!(f, "it ran past its timeout of {} s and was killed", after.as_secs_f64())
            }
            HookFailure::Cancelled => f.write_str("the call was cancelled"),
        }
    }
}

/// A hook's JSON answer on stdout (Claude Code's common and hook-specific fields).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    #[serde(rename = "continue")]
    go_on: Option<bool>,
    stop_reason: Option<String>,
    decision: Option<String>,
    reason: Option<String>,
    system_message: Option<String>,
    hook_specific_output: Option<Specific>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Specific {
    permission_decision: Option<String>,
    permission_decision_reason: Option<String>,
    updated_input: Option<Value>,
    additional_context: Option<String>,
    #[serde(rename = "updatedMCPToolOutput")]
    updated_mcp_tool_output: Option<Value>,
}

impl CommandHook {
    /// How long a hook runs when its configuration does not say.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    /// A hook for `event` running `command` (a shell command line) in `dir` (absolute: the
    /// configuration file's folder), for every tool, with the default timeout.
    pub fn new(event: HookEvent, command: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        CommandHook {
            event,
            command: command.into(),
            dir: dir.into(),
            matcher: ToolMatcher::all(),
            timeout: CommandHook::DEFAULT_TIMEOUT,
            redactor: Redactor::default(),
            pending: Mutex::new(VecDeque::new()),
        }
    }

    /// Runs only for the tools `matcher` matches.
    pub fn with_matcher(mut self, matcher: ToolMatcher) -> Self {
        self.matcher = matcher;
        self
    }

    /// Kills the program after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Values never repeated in reasons, context and warnings (expanded `${ENV}` secrets).
    pub fn with_secrets(mut self, secrets: impl IntoIterator<Item = String>) -> Self {
        self.redactor = Redactor::new(secrets);
        self
    }

    /// Its event.
    pub fn event(&self) -> HookEvent {
        self.event
    }

    /// Attaches `hooks` to `builder` so that both halves of each run in the right order:
    /// `PreToolUse` hooks (in the order given) run before the arguments are remembered for
    /// `PostToolUse` hooks, and `PostToolUse` hooks see the tool's output before the
    /// `PreToolUse` context is appended to it.
    pub fn attach(
        builder: OrchestratorBuilder,
        hooks: impl IntoIterator<Item = Arc<CommandHook>>,
    ) -> OrchestratorBuilder {
        let (pre, post): (Vec<_>, Vec<_>) =
            hooks.into_iter().partition(|h| h.event == HookEvent::PreToolUse);
        let before = pre.iter().chain(&post);
        let builder = before.fold(builder, |b, h| b.before_hook("*", h.clone()));
        post.into_iter().chain(pre).fold(builder, |b, h| b.after_hook("*", h))
    }

    /// The command as shown in warnings and messages: redacted, at most 80 characters.
    fn label(&self) -> String {
        let command = self.redactor.redact(&self.command);
        let mut label: String = command.chars().take(80).collect();
        if label.len() < command.len() {
            label.push('…');
        }
        label
    }

    fn remember(&self, key: CallKey, value: Value) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if pending.len() >= PENDING_MAX {
            pending.pop_front();
        }
        pending.push_back(Pending { key, value });
    }

    fn recall(&self, key: &CallKey) -> Option<Value> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let at = pending.iter().position(|p| p.key == *key)?;
        pending.remove(at).map(|p| p.value)
    }

    /// `text` redacted and cut to [`REASON_MAX`] bytes.
    fn reason(&self, text: &str) -> String {
        let text = self.redactor.redact(text.trim());
        if text.len() <= REASON_MAX {
            return text.into_owned();
        }
        let mut cut = REASON_MAX;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}… (cut at {REASON_MAX} bytes)", &text[..cut])
    }

    /// The hook's input for a call of `tool`.
    fn input(&self, tool: &str, arguments: &Value, ctx: &CallContext) -> Value {
        json!({
            "session_id": ctx.run_id(),
            "cwd": self.dir.to_string_lossy(),
            "hook_event_name": self.event.as_str(),
            "tool_name": tool,
            "tool_input": claude_code_input(arguments),
            "tool_use_id": ctx.call_id(),
        })
    }

    /// Runs the program on `input`; `Ok(None)` when it gave no answer to act on (a
    /// non-blocking error, warned of).
    async fn run(
        &self,
        input: &Value,
        tool: &str,
        ctx: &CallContext,
    ) -> Result<Option<HookExit>, ToolError> {
        match self.spawn(input, ctx).await {
            Ok(exit) => Ok(Some(exit)),
            Err(HookFailure::Cancelled) => Err(ToolError::Cancelled { tool: tool.to_owned() }),
            Err(failure) => {
                tracing::warn!(
                    target: "toolmux::hooks",
                    "{} hook `{}` for `{tool}` failed, the call goes on: {failure}",
                    self.event,
                    self.label()
                );
                Ok(None)
            }
        }
    }

    async fn spawn(&self, input: &Value, ctx: &CallContext) -> Result<HookExit, HookFailure> {
        run_program(&self.command, &self.dir, self.timeout, input, ctx.cancel_token()).await
    }

    /// The JSON answer in a successful hook's stdout, if it gave one.
    fn answer(&self, exit: &HookExit, tool: &str) -> Answer {
        let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(exit.stdout.trim()) else {
            return Answer::default();
        };
        match serde_json::from_value::<Answer>(value) {
            Ok(answer) => {
                if let Some(message) = &answer.system_message {
                    tracing::warn!(target: "toolmux::hooks", "{} hook `{}` for `{tool}`: {}", self.event, self.label(), self.reason(message));
                }
                answer
            }
            Err(e) => {
                tracing::warn!(
                    target: "toolmux::hooks",
                    "{} hook `{}` for `{tool}` answered JSON toolmux cannot read, the call goes on: {e}",
                    self.event,
                    self.label()
                );
                Answer::default()
            }
        }
    }

    /// Warns of a hook that exited with neither 0 nor 2.
    fn warn_exit(&self, exit: &HookExit, tool: &str) {
        let code = exit.code.map_or_else(|| "a signal".to_owned(), |c| format!("exit code {c}"));
        tracing::warn!(
            target: "toolmux::hooks",
            "{} hook `{}` for `{tool}` failed ({code}), the call goes on: {}",
            self.event,
            self.label(),
            self.reason(&exit.stderr)
        );
    }

    /// The reason of a block: what the hook said, else which hook blocked.
    fn block_reason(&self, said: Option<&str>) -> String {
        match said.map(str::trim).filter(|s| !s.is_empty()) {
            Some(reason) => self.reason(reason),
            None => format!("the {} hook `{}` blocked it", self.event, self.label()),
        }
    }

    async fn pre_tool_use(
        &self,
        tool: &str,
        arguments: &mut Value,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        let denied = |reason: String| ToolError::Denied { tool: tool.to_owned(), reason };
        let Some(exit) = self.run(&self.input(tool, arguments, ctx), tool, ctx).await? else {
            return Ok(());
        };
        match exit.code {
            Some(0) => {}
            Some(2) => return Err(denied(self.block_reason(Some(&exit.stderr)))),
            _ => {
                self.warn_exit(&exit, tool);
                return Ok(());
            }
        }
        let answer = self.answer(&exit, tool);
        if answer.go_on == Some(false) {
            return Err(denied(self.block_reason(answer.stop_reason.as_deref())));
        }
        if answer.decision.as_deref() == Some("block") {
            return Err(denied(self.block_reason(answer.reason.as_deref())));
        }
        let specific = answer.hook_specific_output.unwrap_or_default();
        let reason = specific.permission_decision_reason.as_deref();
        if specific.permission_decision.as_deref() == Some("deny") {
            return Err(denied(self.block_reason(reason)));
        }
        if let Some(updated) = specific.updated_input {
            *arguments = from_claude_code_input(arguments, updated);
        }
        match specific.permission_decision.as_deref() {
            None | Some("allow") => {}
            Some("ask") => self.ask(tool, arguments, reason, ctx).await?,
            Some(other) => tracing::warn!(
                target: "toolmux::hooks",
                "PreToolUse hook `{}` for `{tool}` answered permissionDecision `{}`; toolmux knows allow, deny and ask, and goes on",
                self.label(),
                self.reason(other)
            ),
        }
        if let Some(context) = specific.additional_context.filter(|c| !c.trim().is_empty()) {
            self.remember(CallKey::of(tool, ctx), Value::String(self.reason(&context)));
        }
        Ok(())
    }

    /// Asks the caller's approval handler, as the permission stage does for `ask` rules.
    async fn ask(
        &self,
        tool: &str,
        arguments: &Value,
        reason: Option<&str>,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        let why = match reason.map(str::trim).filter(|r| !r.is_empty()) {
            Some(reason) => self.reason(reason),
            None => format!("the PreToolUse hook `{}` asks for approval", self.label()),
        };
        let Some(handler) = ctx.handler() else {
            return Err(ToolError::Denied {
                tool: tool.to_owned(),
                reason: format!(
                    "{why}: the PreToolUse hook `{}` asks for approval and no approval handler \
                     is attached; run it where calls can be approved (an agent with an \
                     approver), or make the hook answer `allow` or `deny`",
                    self.label()
                ),
            });
        };
        let request = ApprovalRequest {
            tool: tool.to_owned(),
            arguments: arguments.clone(),
            reason: why,
            scope: None,
            call_id: ctx.call_id().map(str::to_owned),
        };
        match handler.approve(request).await {
            ApprovalDecision::Allow => Ok(()),
            ApprovalDecision::Deny { reason } => Err(ToolError::Denied {
                tool: tool.to_owned(),
                reason: format!("not approved: {reason}"),
            }),
        }
    }

    async fn post_tool_use(
        &self,
        tool: &str,
        output: &mut ToolOutput,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        let arguments = self.recall(&CallKey::of(tool, ctx)).unwrap_or(Value::Null);
        let mut input = self.input(tool, &arguments, ctx);
        input["tool_response"] = tool_response(output);
        let Some(exit) = self.run(&input, tool, ctx).await? else {
            return Ok(());
        };
        match exit.code {
            Some(0) => {}
            Some(2) => {
                self.block(output, self.block_reason(Some(&exit.stderr)));
                return Ok(());
            }
            _ => {
                self.warn_exit(&exit, tool);
                return Ok(());
            }
        }
        let answer = self.answer(&exit, tool);
        if answer.go_on == Some(false) {
            self.block(output, self.block_reason(answer.stop_reason.as_deref()));
            return Ok(());
        }
        if answer.decision.as_deref() == Some("block") {
            self.block(output, self.block_reason(answer.reason.as_deref()));
            return Ok(());
        }
        let specific = answer.hook_specific_output.unwrap_or_default();
        if let Some(updated) = specific.updated_mcp_tool_output {
            match replacement(updated) {
                Some(replaced) => {
                    output.content = replaced.content;
                    output.structured = replaced.structured;
                    output.is_error = replaced.is_error;
                }
                None => tracing::warn!(
                    target: "toolmux::hooks",
                    "PostToolUse hook `{}` for `{tool}`: updatedMCPToolOutput is neither content blocks, a `{{\"content\": [...]}}` result nor text; the output is kept",
                    self.label()
                ),
            }
        }
        if let Some(context) = specific.additional_context.filter(|c| !c.trim().is_empty()) {
            output.content.push(ContentPart::Text { text: self.reason(&context) });
        }
        Ok(())
    }

    /// Turns `output` into an error result carrying `reason`.
    fn block(&self, output: &mut ToolOutput, reason: String) {
        *output = ToolOutput::error(format!(
            "the tool ran, but a PostToolUse hook blocked its result: {reason}"
        ))
        .with_extra(BLOCKED, Value::String(self.label()));
    }
}

#[async_trait]
impl BeforeHook for CommandHook {
    async fn before(
        &self,
        tool: &str,
        arguments: &mut Value,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        if !self.matcher.matches(tool) {
            return Ok(());
        }
        match self.event {
            HookEvent::PreToolUse => self.pre_tool_use(tool, arguments, ctx).await,
            HookEvent::PostToolUse => {
                self.remember(CallKey::of(tool, ctx), arguments.clone());
                Ok(())
            }
        }
    }
}

#[async_trait]
impl AfterHook for CommandHook {
    async fn after(
        &self,
        tool: &str,
        output: &mut ToolOutput,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        if !self.matcher.matches(tool) {
            return Ok(());
        }
        if output.extras.contains_key(BLOCKED) {
            // A block stops the chain.
            let _ = self.recall(&CallKey::of(tool, ctx));
            return Ok(());
        }
        match self.event {
            HookEvent::PreToolUse => {
                if let Some(Value::String(context)) = self.recall(&CallKey::of(tool, ctx)) {
                    output.content.push(ContentPart::Text { text: context });
                }
                Ok(())
            }
            HookEvent::PostToolUse => self.post_tool_use(tool, output, ctx).await,
        }
    }
}

/// `arguments` as a Claude Code hook reads them: a string `path` is also given as
/// `file_path`, the name Claude Code's file tools (`Read`, `Write`, `Edit`, `MultiEdit`)
/// give theirs, so that a guard pasted from Claude Code reading `tool_input.file_path`
/// sees the path instead of nothing, and lets nothing through for want of it.
fn claude_code_input(arguments: &Value) -> Cow<'_, Value> {
    match arguments.as_object() {
        Some(map)
            if map.get("path").is_some_and(Value::is_string) && !map.contains_key("file_path") =>
        {
            let mut map = map.clone();
            map.insert(FILE_PATH.to_owned(), map["path"].clone());
            Cow::Owned(Value::Object(map))
        }
        _ => Cow::Borrowed(arguments),
    }
}

/// A hook's `updatedInput` for a call whose arguments were `before`, without the
/// `file_path` [`claude_code_input`] added: dropped when the hook left it as it was; when
/// the hook changed it and left `path` as it was, or answered without `path`, its value is
/// the call's `path` (a script from Claude Code rewrites `file_path`). A hook that changed
/// both leaves both, for the provider to refuse when they differ.
fn from_claude_code_input(before: &Value, mut updated: Value) -> Value {
    let shown = claude_code_input(before);
    let (Some(shown), Some(map)) = (shown.get(FILE_PATH), updated.as_object_mut()) else {
        return updated;
    };
    if before.get(FILE_PATH).is_some() {
        return updated;
    }
    match map.remove(FILE_PATH) {
        Some(given) if !map.contains_key("path") => {
            map.insert("path".to_owned(), given);
        }
        Some(given) if given == *shown => {}
        Some(given) if map.get("path") == before.get("path") => {
            map.insert("path".to_owned(), given);
        }
        Some(given) => {
            map.insert(FILE_PATH.to_owned(), given);
        }
        None => {}
    }
    updated
}

/// Claude Code's name of its file tools' path argument.
const FILE_PATH: &str = "file_path";

/// Runs hook program `command` (`sh -c`) in `dir`, in a session of its own (see `detach`),
/// with `input` on its stdin, for at most `timeout`: how it ended, or why it gave no answer
/// (then its process group is killed and it is reaped). `TOOLMUX_PROJECT_DIR` and
/// `CLAUDE_PROJECT_DIR` are `dir`; what it leaves running is ended when it exits. For hooks
/// of other loops than the tool pipeline (an agent's `Stop`, `SessionStart`), with the
/// contract of [`CommandHook`].
pub async fn run_program(
    command: &str,
    dir: &std::path::Path,
    timeout: Duration,
    input: &Value,
    cancel: &tokio_util::sync::CancellationToken,
) -> Result<HookExit, HookFailure> {
    let mark = toolmux_core::ProcessMark::new();
    let (mark_name, mark_value) = mark.env();
    let mut program = tokio::process::Command::new("sh");
    program
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .env("TOOLMUX_PROJECT_DIR", dir)
        .env("CLAUDE_PROJECT_DIR", dir)
        .env(mark_name, mark_value)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    detach(&mut program);
    let mut child = program.spawn().map_err(HookFailure::Spawn)?;
    // A hook whose call is dropped halfway leaves nothing behind.
    let mut group = toolmux_core::MarkedGroup::new(child.id(), mark, format!("hook `{command}`"));
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let payload = input.to_string();
    let work = async {
        let write = async {
            if let Some(mut stdin) = stdin {
                // A hook that does not read its input closes the pipe: not an error.
                let _ = stdin.write_all(payload.as_bytes()).await;
                let _ = stdin.shutdown().await;
            }
        };
        let wait = async {
            let status = child.wait().await;
            // What the hook left running would hold its pipes open: it ends with it, in
            // its group or out of it.
            group.kill_all().await;
            status
        };
        let ((), out, err, status) = tokio::join!(
            write,
            read_capped(stdout, STDOUT_MAX),
            read_capped(stderr, STDERR_MAX),
            wait
        );
        (out, err, status)
    };
    let ended = tokio::select! {
        ended = tokio::time::timeout(timeout, work) => ended.map_err(|_| HookFailure::Timeout(timeout)),
        () = cancel.cancelled() => Err(HookFailure::Cancelled),
    };
    match ended {
        Ok((stdout, stderr, status)) => {
            let status = status.map_err(HookFailure::Wait)?;
            // Reaped and its group killed: the group's id may now be another's.
            group.disarm();
            Ok(HookExit {
                code: status.code(),
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
                stderr: String::from_utf8_lossy(&stderr).into_owned(),
            })
        }
        Err(failure) => {
            group.kill_all().await;
            // SIGKILL makes this quick; `kill_on_drop` covers a hook that will not die.
            if let Ok(Ok(_)) = tokio::time::timeout(REAP_TIMEOUT, child.wait()).await {
                group.disarm();
            }
            Err(failure)
        }
    }
}

/// Makes `program` the leader of a session of its own with no controlling terminal, and so
/// of a process group of its own whose id is its pid (which [`toolmux_core::MarkedGroup`]
/// kills).
///
/// A group of its own alone left the hook in toolmux's session: under a toolmux started
/// from a terminal (the CLI, an agent's TUI), a hook reading `/dev/tty` (`sudo`, `ssh`'s
/// host key question, git's credential prompt, `npx`'s "Ok to proceed?") was stopped by
/// `SIGTTIN` until its timeout, its group not being the terminal's foreground one, and what
/// it wrote there landed on the user's screen. Without a terminal, opening `/dev/tty` fails
/// at once (`ENXIO`).
#[allow(unsafe_code, reason = "`pre_exec` is unsafe; the closure only calls `setsid`")]
fn detach(program: &mut tokio::process::Command) {
    // SAFETY: between fork and exec the closure only calls `setsid`, a system call that is
    // async-signal-safe; it takes no lock and allocates nothing (the error is a number).
    unsafe {
        program.pre_exec(|| {
            rustix::process::setsid()?;
            Ok(())
        });
    }
}

/// Reads `pipe` to its end, keeping the first `max` bytes.
async fn read_capped(pipe: Option<impl AsyncRead + Unpin>, max: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut pipe) = pipe else { return kept };
    let mut buffer = [0u8; 8192];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..n.min(room)]);
            }
        }
    }
}

/// `output` as an MCP tool result: `content` blocks, `structuredContent`, `isError`.
fn tool_response(output: &ToolOutput) -> Value {
    let content: Vec<Value> = output.content.iter().map(to_mcp).collect();
    let mut response = json!({ "content": content, "isError": output.is_error });
    if let Some(structured) = &output.structured {
        response["structuredContent"] = structured.clone();
    }
    response
}

/// One content part as an MCP content block (JSON becomes text, as MCP has no JSON block).
fn to_mcp(part: &ContentPart) -> Value {
    match part {
        ContentPart::Text { text } => json!({"type": "text", "text": text}),
        ContentPart::Json { value } => json!({"type": "text", "text": value.to_string()}),
        ContentPart::Image { data, mime_type } => {
            json!({"type": "image", "data": data, "mimeType": mime_type})
        }
        ContentPart::Audio { data, mime_type } => {
            json!({"type": "audio", "data": data, "mimeType": mime_type})
        }
        ContentPart::Resource { uri, mime_type, text, blob } => {
            let mut resource = json!({"uri": uri});
            for (key, value) in [("mimeType", mime_type), ("text", text), ("blob", blob)] {
                if let Some(value) = value {
                    resource[key] = Value::String(value.clone());
                }
            }
            json!({"type": "resource", "resource": resource})
        }
        ContentPart::ResourceLink { uri, name, description, mime_type } => {
            let mut link = json!({"type": "resource_link", "uri": uri, "name": name});
            for (key, value) in [("description", description), ("mimeType", mime_type)] {
                if let Some(value) = value {
                    link[key] = Value::String(value.clone());
                }
            }
            link
        }
        other => serde_json::to_value(other).unwrap_or(Value::Null),
    }
}

/// An MCP content block as a content part; a block of a kind toolmux does not know is
/// kept as JSON.
fn from_mcp(block: Value) -> ContentPart {
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    let part = match kind {
        "text" => text(&block, "text").map(|text| ContentPart::Text { text }),
        "image" | "audio" => match (text(&block, "data"), text(&block, "mimeType")) {
            (Some(data), Some(mime_type)) if kind == "image" => {
                Some(ContentPart::Image { data, mime_type })
            }
            (Some(data), Some(mime_type)) => Some(ContentPart::Audio { data, mime_type }),
            _ => None,
        },
        "resource" => block.get("resource").and_then(|r| {
            Some(ContentPart::Resource {
                uri: text(r, "uri")?,
                mime_type: text(r, "mimeType"),
                text: text(r, "text"),
                blob: text(r, "blob"),
            })
        }),
        "resource_link" => match (text(&block, "uri"), text(&block, "name")) {
            (Some(uri), Some(name)) => Some(ContentPart::ResourceLink {
                uri,
                name,
                description: text(&block, "description"),
                mime_type: text(&block, "mimeType"),
            }),
            _ => None,
        },
        _ => None,
    };
    part.unwrap_or(ContentPart::Json { value: block })
}

/// What `updatedMCPToolOutput` replaces the output with: content blocks, a whole result
/// (`content`, `structuredContent`, `isError`) or text; `None` for anything else.
fn replacement(updated: Value) -> Option<ToolOutput> {
    match updated {
        Value::String(text) => Some(ToolOutput::text(text)),
        Value::Array(blocks) => Some(ToolOutput {
            content: blocks.into_iter().map(from_mcp).collect(),
            ..ToolOutput::default()
        }),
        Value::Object(mut result) => {
            let Some(Value::Array(blocks)) = result.remove("content") else { return None };
            Some(ToolOutput {
                content: blocks.into_iter().map(from_mcp).collect(),
                structured: result.remove("structuredContent"),
                is_error: result.get("isError").and_then(Value::as_bool).unwrap_or(false),
                ..ToolOutput::default()
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hook sees the path also as `file_path`, and what it answers comes back without it:
    /// a `file_path` left alone is dropped, a changed one is the new `path`.
    #[test]
    fn hooks_see_claude_code_s_file_path() {
        let call = json!({"path": "a.txt", "content": "x"});
        assert_eq!(
            *claude_code_input(&call),
            json!({"path": "a.txt", "file_path": "a.txt", "content": "x"})
        );
        let cases = [
            (
                json!({"path": "a.txt", "file_path": "a.txt", "content": "y"}),
                json!({"path": "a.txt", "content": "y"}),
            ),
            (
                json!({"path": "a.txt", "file_path": "b.txt", "content": "x"}),
                json!({"path": "b.txt", "content": "x"}),
            ),
            (
                json!({"file_path": "a.txt", "content": "y"}),
                json!({"path": "a.txt", "content": "y"}),
            ),
            (
                json!({"path": "c.txt", "file_path": "b.txt"}),
                json!({"path": "c.txt", "file_path": "b.txt"}),
            ),
            (json!({"path": "c.txt"}), json!({"path": "c.txt"})),
        ];
        for (updated, expected) in cases {
            assert_eq!(from_claude_code_input(&call, updated.clone()), expected, "{updated}");
        }
        // A call that gave `file_path` itself, or no string `path`, is shown as it is.
        let own = json!({"path": "a.txt", "file_path": "b.txt"});
        assert_eq!(*claude_code_input(&own), own);
        assert_eq!(
            from_claude_code_input(&own, json!({"path": "a.txt"})),
            json!({"path": "a.txt"})
        );
        assert_eq!(*claude_code_input(&json!({"path": 3})), json!({"path": 3}));
    }

    #[test]
    fn matchers_read_as_claude_code_reads_them() {
        let cases = [
            ("", "fs__read", true),
            ("*", "github__search", true),
            ("fs__write|fs__edit", "fs__edit", true),
            ("fs__write|fs__edit", "fs__edit_many", false),
            ("fs__read", "xfs__read", false),
            ("^fs__", "fs__grep", true),
            ("^fs__", "github__fs__x", false),
            ("fs__.*", "github__fs__x", true),
            ("read$", "fs__read", true),
            ("router__handoff-to", "router__handoff-to", true),
        ];
        for (pattern, tool, want) in cases {
            let matcher = ToolMatcher::new(pattern).unwrap();
            assert_eq!(matcher.matches(tool), want, "{pattern:?} on {tool}");
        }
        let bad = ToolMatcher::new("fs__(read").unwrap_err();
        assert_eq!(bad.to_string(), "invalid regular expression `fs__(read`: unclosed group");
    }

    #[test]
    fn content_round_trips_through_mcp_blocks() {
        let output = ToolOutput {
            content: vec![
                ContentPart::Text { text: "hi".into() },
                ContentPart::Image { data: "aGk=".into(), mime_type: "image/png".into() },
                ContentPart::Resource {
                    uri: "file:///a".into(),
                    mime_type: None,
                    text: Some("a".into()),
                    blob: None,
                },
            ],
            structured: Some(json!({"n": 1})),
            ..ToolOutput::default()
        };
        let response = tool_response(&output);
        assert_eq!(
            response,
            json!({
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image", "data": "aGk=", "mimeType": "image/png"},
                    {"type": "resource", "resource": {"uri": "file:///a", "text": "a"}}
                ],
                "structuredContent": {"n": 1},
                "isError": false
            })
        );
        let back = replacement(response).unwrap();
        assert_eq!(back.content, output.content);
        assert_eq!(back.structured, output.structured);
        assert_eq!(
            replacement(json!("plain")).unwrap().content,
            [ContentPart::Text { text: "plain".into() }]
        );
        assert!(replacement(json!(5)).is_none());
    }

    /// A hook that starts a process out of its group (`setsid`), holding its stdout: the
    /// hook's answer comes when it exits, and the process is killed (found by its mark).
    #[tokio::test]
    async fn what_a_hook_started_outside_its_group_ends_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        let exit = run_program(
            "setsid sleep 1000 & echo $! > escaped; echo done",
            dir.path(),
            Duration::from_secs(30),
            &json!({}),
            &tokio_util::sync::CancellationToken::new(),
        )
        .await
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "waited for the sleeper");
        assert_eq!((exit.code, exit.stdout.as_str()), (Some(0), "done\n"));
        let pid = std::fs::read_to_string(dir.path().join("escaped")).unwrap();
        // Killed as the hook ends; on a loaded machine it may take a moment to be gone.
        let stat =
            || std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
        let runs = |stat: &str| {
            stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
        };
        let killed_by = std::time::Instant::now() + Duration::from_secs(5);
        while runs(&stat()) && std::time::Instant::now() < killed_by {
            std::thread::sleep(Duration::from_millis(20));
        }
        let stat = stat();
        assert!(!runs(&stat), "the sleeper runs on: {stat}");
    }
}
