//! Command hooks of an agent's loop, with Claude Code's contract, so that its `SessionStart`,
//! `UserPromptSubmit`, `Stop` and `SubagentStop` hook scripts work for toolmux's agents:
//! the program gets one JSON object on stdin (`session_id`, `transcript_path`, `cwd`,
//! `hook_event_name`, `permission_mode`, and per event `source`, `prompt` or
//! `stop_hook_active`; toolmux adds `agent_name`) and answers by exit code and stdout.
//! `transcript_path` is a JSON-lines file of the conversation so far, in Claude Code's
//! transcript shape (`{"type": "user" | "assistant", "message": {"role", "content"}}`, tool
//! calls as `tool_use` blocks and results as `tool_result` blocks), written just before the
//! hook runs, secrets redacted, in the run's folder of the output directory (swept with
//! the run's outputs):
//!
//! - `SessionStart`: stdout of exit 0 (plain text, or `hookSpecificOutput.additionalContext`)
//!   is given to the model before the task.
//! - `UserPromptSubmit`: exit 2, or `decision: "block"`, or `continue: false`, refuses the
//!   task (the run fails with the reason, which the model never sees); stdout of exit 0 is
//!   context, as for `SessionStart`.
//! - `Stop` (a run about to end with its answer or report) and `SubagentStop` (the same for an
//!   agent called by another): exit 2 (stderr the reason) or `decision: "block"` with a
//!   `reason` makes the agent go on, told the reason; `stop_hook_active` is true once a stop
//!   hook has done so in this run. The run's turn limit still holds.
//!
//! Other exit codes, a program that cannot start or one past its timeout are warnings, and
//! the run goes on, as in Claude Code.

use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use toolmux_core::CallContext;
use toolmux_llm::Message;
use toolmux_orchestrator::{HookExit, Redactor, run_program};

/// Bytes of a reason or context passed on.
const TEXT_MAX: usize = 16 * 1024;

/// One hook program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookCommand {
    /// The shell command line (`sh -c`).
    pub command: String,
    /// How long it may run.
    pub timeout: Duration,
    /// For `SessionStart`: the sources it runs for (`startup`, `resume`; `|`-separated,
    /// empty or `*` for all).
    pub matcher: String,
}

/// The hooks of the agents' loop (see the module documentation). Their reasons, context
/// and transcripts are redacted by the redactor of the orchestrator the agent runs on
/// (`Orchestrator::redactor`), as everything else the agent gives out is.
#[derive(Debug, Default)]
pub struct AgentHooks {
    /// Before a run's first turn.
    pub session_start: Vec<HookCommand>,
    /// Before the task reaches the model.
    pub user_prompt_submit: Vec<HookCommand>,
    /// When a run is about to end.
    pub stop: Vec<HookCommand>,
    /// When a run of an agent called by another agent is about to end.
    pub subagent_stop: Vec<HookCommand>,
    /// Where the programs run (the configuration file's folder).
    pub dir: PathBuf,
    /// The output directory, where each run's folder gets its agents' transcripts
    /// (`transcript_path`); none without it.
    pub transcripts: Option<PathBuf>,
}

/// What a prompt hook decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Prompt {
    /// The task goes on, with this context (maybe none).
    Go(Vec<String>),
    /// The task is refused, for this reason.
    Blocked(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    #[serde(rename = "continue")]
    go_on: Option<bool>,
    stop_reason: Option<String>,
    decision: Option<String>,
    reason: Option<String>,
    hook_specific_output: Option<Specific>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Specific {
    additional_context: Option<String>,
}

impl AgentHooks {
    /// Whether no hook is configured.
    pub fn is_empty(&self) -> bool {
        self.session_start.is_empty()
            && self.user_prompt_submit.is_empty()
            && self.stop.is_empty()
            && self.subagent_stop.is_empty()
    }

    /// The input every hook gets, the conversation `messages` written to the transcript.
    async fn input(
        &self,
        redactor: &Redactor,
        event: &str,
        agent: &str,
        ctx: &CallContext,
        messages: &[Message],
    ) -> Value {
        let mut input = json!({
            "session_id": ctx.run_id(),
            "cwd": self.dir.to_string_lossy(),
            "hook_event_name": event,
            "permission_mode": "default",
            "agent_name": agent,
        });
        if let Some(path) = self.transcript(redactor, agent, ctx, messages).await {
            input["transcript_path"] = json!(path.to_string_lossy());
        }
        input
    }

    /// Writes `messages` as the transcript of this agent's session, whole, through a
    /// temporary file; its path, or `None` (warned of) when it cannot be written.
    async fn transcript(
        &self,
        redactor: &Redactor,
        agent: &str,
        ctx: &CallContext,
        messages: &[Message],
    ) -> Option<PathBuf> {
        let root = self.transcripts.as_ref()?;
        let dir = root.join(toolmux_orchestrator::store::run_slug(ctx.run_id()));
        let agent: String = agent
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        let op = ctx.op().map_or(0, |op| op.id());
        let path = dir.join(format!("out-transcript-{agent}-{op}.jsonl"));
        let mut text = String::new();
        for line in transcript_lines(ctx.run_id(), messages) {
            text.push_str(&redactor.redact(&line.to_string()));
            text.push('\n');
        }
        let written = write_whole(&dir, &path, text).await;
        match written {
            Ok(()) => Some(path),
            Err(e) => {
                tracing::warn!(target: "toolmux::hooks", "cannot write the transcript {}: {e}", path.display());
                None
            }
        }
    }

    fn clean(redactor: &Redactor, text: &str) -> String {
        let text = redactor.redact(text.trim());
        let mut end = text.len().min(TEXT_MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text[..end].to_owned()
    }

    /// Runs `hook` on `input`; `None` (warned of) when it gave no answer to act on.
    async fn run(
        &self,
        event: &str,
        hook: &HookCommand,
        input: &Value,
        ctx: &CallContext,
    ) -> Option<HookExit> {
        match run_program(&hook.command, &self.dir, hook.timeout, input, ctx.cancel_token()).await {
            Ok(exit) => Some(exit),
            Err(failure) => {
                tracing::warn!(target: "toolmux::hooks", "{event} hook `{}` failed, the run goes on: {failure}", label(&hook.command));
                None
            }
        }
    }

    /// Context for the start of a run (`source`: `startup`, or `resume` for a conversation
    /// that goes on).
    pub(crate) async fn session_start(
        &self,
        redactor: &Redactor,
        source: &str,
        agent: &str,
        ctx: &CallContext,
        messages: &[Message],
    ) -> Vec<String> {
        let mut input = self.input(redactor, "SessionStart", agent, ctx, messages).await;
        input["source"] = json!(source);
        let mut context = Vec::new();
        for hook in self.session_start.iter().filter(|h| matches_source(&h.matcher, source)) {
            let Some(exit) = self.run("SessionStart", hook, &input, ctx).await else { continue };
            match exit.code {
                Some(0) => context.extend(Self::context_of(redactor, &exit)),
                Some(2) => {
                    let said = Self::clean(redactor, &exit.stderr);
                    tracing::warn!(target: "toolmux::hooks", "SessionStart hook `{}`: {said}", label(&hook.command));
                }
                _ => warn_exit("SessionStart", hook, &exit),
            }
        }
        context
    }

    /// Whether `prompt` (the task) may go to the model, with what context.
    pub(crate) async fn prompt_submit(
        &self,
        redactor: &Redactor,
        prompt: &str,
        agent: &str,
        ctx: &CallContext,
        messages: &[Message],
    ) -> Prompt {
        let mut input = self.input(redactor, "UserPromptSubmit", agent, ctx, messages).await;
        input["prompt"] = json!(prompt);
        let mut context = Vec::new();
        for hook in &self.user_prompt_submit {
            let Some(exit) = self.run("UserPromptSubmit", hook, &input, ctx).await else {
                continue;
            };
            match exit.code {
                Some(0) => {
                    let answer = parse(&exit.stdout);
                    if answer.go_on == Some(false) {
                        let reason = answer.stop_reason.or(answer.reason).unwrap_or_default();
                        return Prompt::Blocked(Self::clean(redactor, &reason));
                    }
                    if answer.decision.as_deref() == Some("block") {
                        return Prompt::Blocked(Self::clean(
                            redactor,
                            answer.reason.as_deref().unwrap_or(""),
                        ));
                    }
                    context.extend(Self::context_of(redactor, &exit));
                }
                Some(2) => return Prompt::Blocked(Self::clean(redactor, &exit.stderr)),
                _ => warn_exit("UserPromptSubmit", hook, &exit),
            }
        }
        Prompt::Go(context)
    }

    /// Why the run must go on instead of ending, if a stop hook says so; `sub` for an
    /// agent called by another agent (`SubagentStop`), `active` once a stop hook has made
    /// this run go on.
    pub(crate) async fn stop(
        &self,
        redactor: &Redactor,
        sub: bool,
        active: bool,
        agent: &str,
        ctx: &CallContext,
        messages: &[Message],
    ) -> Option<String> {
        let (event, hooks) =
            if sub { ("SubagentStop", &self.subagent_stop) } else { ("Stop", &self.stop) };
        let mut input = self.input(redactor, event, agent, ctx, messages).await;
        input["stop_hook_active"] = json!(active);
        for hook in hooks {
            let Some(exit) = self.run(event, hook, &input, ctx).await else { continue };
            match exit.code {
                Some(0) => {
                    let answer = parse(&exit.stdout);
                    if answer.go_on == Some(false) {
                        // Claude Code's `continue: false` stops outright.
                        return None;
                    }
                    if answer.decision.as_deref() == Some("block") {
                        let reason = answer
                            .reason
                            .unwrap_or_else(|| format!("a {event} hook asks you to go on"));
                        return Some(Self::clean(redactor, &reason));
                    }
                }
                Some(2) => return Some(Self::clean(redactor, &exit.stderr)),
                _ => warn_exit(event, hook, &exit),
            }
        }
        None
    }

    /// The context a successful hook gave: `additionalContext` of its JSON answer, or its
    /// plain stdout.
    fn context_of(redactor: &Redactor, exit: &HookExit) -> Option<String> {
        let out = exit.stdout.trim();
        let text = if out.starts_with('{') {
            parse(out).hook_specific_output.and_then(|s| s.additional_context)?
        } else {
            out.to_owned()
        };
        (!text.trim().is_empty()).then(|| Self::clean(redactor, &text))
    }
}

/// The conversation as Claude Code's transcript lines.
fn transcript_lines(session: &str, messages: &[Message]) -> Vec<Value> {
    let line = |kind: &str, message: Value| json!({"type": kind, "sessionId": session, "message": message});
    messages
        .iter()
        .map(|message| match message {
            Message::User { content } => line("user", json!({"role": "user", "content": content})),
            Message::Assistant { content, tool_calls, .. } => {
                let mut blocks = Vec::new();
                if !content.is_empty() {
                    blocks.push(json!({"type": "text", "text": content}));
                }
                for call in tool_calls {
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name,
                        "input": call.arguments}));
                }
                line("assistant", json!({"role": "assistant", "content": blocks}))
            }
            Message::Tool { results } => {
                let blocks: Vec<Value> = results
                    .iter()
                    .map(|r| {
                        json!({"type": "tool_result", "tool_use_id": r.call_id,
                            "content": r.content, "is_error": r.is_error})
                    })
                    .collect();
                line("user", json!({"role": "user", "content": blocks}))
            }
        })
        .collect()
}

/// Writes `text` to `path` (in `dir`, made if missing) through a temporary file, so that a
/// hook never reads half of it.
async fn write_whole(dir: &Path, path: &Path, text: String) -> std::io::Result<()> {
    let (dir, path) = (dir.to_path_buf(), path.to_path_buf());
    let written = tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&dir)?;
        // The conversation may hold what the tools read: its owner's only.
        let how = toolmux_core::Replace { private: true, durable: false };
        toolmux_core::replace_file(&path, text.as_bytes(), how)
    })
    .await;
    written.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
}

fn parse(stdout: &str) -> Answer {
    serde_json::from_str(stdout.trim()).unwrap_or_default()
}

fn matches_source(matcher: &str, source: &str) -> bool {
    let matcher = matcher.trim();
    matcher.is_empty() || matcher == "*" || matcher.split('|').any(|m| m.trim() == source)
}

fn warn_exit(event: &str, hook: &HookCommand, exit: &HookExit) {
    let code = exit.code.map_or_else(|| "a signal".to_owned(), |c| format!("exit code {c}"));
    tracing::warn!(target: "toolmux::hooks", "{event} hook `{}` failed ({code}), the run goes on", label(&hook.command));
}

/// The command line as logs name it: its first 80 characters.
fn label(command: &str) -> String {
    let mut label: String = command.chars().take(80).collect();
    if label.len() < command.len() {
        label.push('…');
    }
    label
}
