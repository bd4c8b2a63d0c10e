//! Tools that run a program of the user's (`commandTools`): a script becomes a tool
//! without an MCP server around it.
//!
//! A call runs the program in the project's folder, in its own session and process
//! group, in the same OS sandbox as `bash` (`fs.bash.sandbox`, with the same paths kept
//! read-only or hidden: toolmux's own files, other agents', the `protect` and `hide`
//! lines', and what it makes of those missing or of a repository moved aside when it
//! ends), with only `PATH`, `HOME`, `LANG` and the tool's `env`. The call's arguments
//! are written to its stdin as one JSON object; what it prints on stdout is the result
//! (parsed when `output: json`), and a non-zero exit is an error result carrying the end
//! of its stderr. Timeouts and cancellation kill the whole group, and the process is
//! always reaped.

use crate::config::{BashConfig, FsConfig};
use crate::error::FsError;
use crate::sandbox::Sandbox;
use crate::tools::shell::{self, Program};
use crate::tools::{control, spill};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use toolmux_core::{
    CallContext, MarkedGroup, PermissionClass, ProcessMark, ToolAnnotations, ToolError, ToolKind,
    ToolOutput, ToolProvider, ToolSpec,
};

/// The namespace of command tools.
pub const COMMANDS_NAMESPACE: &str = "cmd";

/// Bytes of stdout read at most; past them the call fails (the orchestrator's size cap
/// handles outputs below it).
const STDOUT_MAX: usize = 16 * 1024 * 1024;
/// Bytes of stderr kept (its end) for an error result.
const STDERR_KEPT: usize = 4000;
/// The default time limit of one call.
const DEFAULT_TIMEOUT_MS: u64 = 60_000;

/// One tool that runs a program (`commandTools.NAME`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandToolConfig {
    /// What the tool does, for the model.
    pub description: String,
    /// The program: a list (`["python3", "scripts/price.py"]`, run without a shell) or a
    /// string (a `bash -c` command line). Relative paths are the project folder's.
    pub command: CommandLine,
    /// The JSON Schema of the arguments (default: any object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_schema: Option<Value>,
    /// `text` (default): stdout is the result as it is; `json`: stdout is parsed, and an
    /// answer that is not JSON is an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<CommandOutput>,
    /// Time limit of one call in milliseconds (default 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Environment variables of the program, besides `PATH`, `HOME` and `LANG`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Whether it only reads (its results may then be cached, and agents run it beside
    /// other calls); default false: it runs programs, permission class `execute`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// How a command tool's program is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandLine {
    /// Run without a shell.
    Argv(Vec<String>),
    /// Run with `bash -c`.
    Shell(String),
}

impl Default for CommandLine {
    fn default() -> Self {
        CommandLine::Argv(Vec::new())
    }
}

/// What a command tool's stdout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CommandOutput {
    /// Text, as printed.
    Text,
    /// One JSON value.
    Json,
}

/// The command tools, under [`COMMANDS_NAMESPACE`].
#[derive(Debug)]
pub struct CommandTools {
    tools: BTreeMap<String, (ToolSpec, CommandToolConfig)>,
    dir: PathBuf,
    shell: BashConfig,
    sandbox: Sandbox,
}

impl CommandTools {
    /// The tools of `tools`, run in `files.root` (absolute: the project's folder) in the
    /// sandbox of `bash`'s commands there: `files.bash.sandbox`, keeping from the programs
    /// what `bash` keeps from its commands (the protected paths, other agents' settings
    /// unless `protectAgentFiles` is off, what the `protect` and `hide` lines match).
    /// Binary output is saved in `files.bash.spillDir` when set. A tool without a
    /// program, a schema that is not an object schema or a timeout of 0 is a configuration
    /// error naming the tool, as is a folder that cannot be opened.
    pub fn new(
        tools: &BTreeMap<String, CommandToolConfig>,
        files: &FsConfig,
    ) -> Result<CommandTools, FsError> {
        let mut built = BTreeMap::new();
        for (name, config) in tools {
            let error = |message: String| FsError::Config {
                message: format!("commandTools.{name}: {message}"),
            };
            let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
            if name.is_empty() || !name.chars().all(plain) {
                return Err(error(
                    "a command tool's name takes letters, digits, `_` and `-` only".into(),
                ));
            }
            let empty = match &config.command {
                CommandLine::Argv(argv) => argv.first().is_none_or(|p| p.trim().is_empty()),
                CommandLine::Shell(line) => line.trim().is_empty(),
            };
            if empty {
                return Err(error("`command` is empty: give the program to run".into()));
            }
            if config.timeout_ms == Some(0) {
                return Err(error("`timeoutMs` is 0: every call would time out".into()));
            }
            let schema =
                config.parameters_schema.clone().unwrap_or_else(|| json!({"type": "object"}));
            if schema.get("type").and_then(Value::as_str) != Some("object") {
                return Err(error(
                    "`parametersSchema` must be an object schema (`type: object`)".into(),
                ));
            }
            let annotations = ToolAnnotations {
                read_only: config.read_only,
                permission: Some(if config.read_only {
                    PermissionClass::Read
                } else {
                    PermissionClass::Execute
                }),
                ..ToolAnnotations::default()
            };
            let limit = Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
            let spec = ToolSpec::new(name.clone(), config.description.clone(), schema)
                .with_annotations(annotations)
                .with_time_limit(limit + shell::ANSWER_MARGIN);
            built.insert(name.clone(), (spec, config.clone()));
        }
        let dir = std::fs::canonicalize(&files.root).map_err(|e| FsError::Config {
            message: format!(
                "the folder of the command tools `{}` cannot be opened: {e}",
                files.root.display()
            ),
        })?;
        let (sandbox, _) = crate::provider::guarded_sandbox(files, &dir)?;
        // The shell and the environment passed through are the defaults; the sandbox and
        // the spill directory are `bash`'s.
        // Resolved once, now: spills follow no symlink on its way later.
        let spill_dir = files.bash.spill_dir.as_deref().map(spill::resolved);
        let shell = BashConfig { spill_dir, ..BashConfig::default() };
        Ok(CommandTools { tools: built, dir, shell, sandbox })
    }

    /// Saves binary output in `dir` (`fs.bash.spillDir`), as `bash` does, instead of this
    /// user's private directory in the system temporary directory, and keeps `dir`
    /// read-only to the programs as `bash` keeps it from its commands (made now where
    /// missing): a program must not rewrite an output saved there before, which the model
    /// reads by its path.
    pub fn with_spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        let dir = spill::resolved(&dir.into());
        self.sandbox = crate::provider::keeping_spill_dir(self.sandbox, Some(&dir));
        self.shell.spill_dir = Some(dir);
        self
    }

    /// The one line shown for `bytes` of binary output of `stream`, saved to a spill file
    /// as `bash` saves its own, and the file when there is one.
    fn binary_notice(&self, bytes: &[u8], stream: spill::Kind) -> (String, Option<PathBuf>) {
        let from = if stream == spill::Kind::Stderr { " from stderr" } else { "" };
        let (saved, path) = match spill::create(self.shell.spill_dir.as_deref(), stream) {
            Ok((path, mut file)) => {
                let cap = usize::try_from(self.shell.spill_max_bytes).unwrap_or(usize::MAX);
                let part = &bytes[..bytes.len().min(cap)];
                let saved = match file.write_all(part) {
                    Ok(()) if part.len() == bytes.len() => control::binary_saved("saved to", &path),
                    Ok(()) => control::binary_saved(
                        &format!("its first {} bytes saved to", part.len()),
                        &path,
                    ),
                    Err(e) => format!("; it could not be saved to {}: {e}", path.display()),
                };
                (saved, Some(path))
            }
            Err(why) => (format!("; it could not be saved: {why}"), None),
        };
        (control::binary_notice(bytes.len() as u64, &format!("{from}{saved}")), path)
    }

    async fn run(
        &self,
        name: &str,
        config: &CommandToolConfig,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let tool = "command tool";
        let program = match &config.command {
            CommandLine::Argv(argv) => Program::Argv(argv.clone()),
            CommandLine::Shell(line) => Program::Shell(line.clone()),
        };
        let label = program.label();
        let failed = |e: FsError| e.into_tool_error(name);
        let mark = ProcessMark::new();
        // What the `protect` and `hide` lines match now, for the views (as for `bash`).
        self.sandbox.find_user_paths(&label).await.map_err(failed)?;
        let mut command =
            shell::command(&self.shell, &self.sandbox, &self.dir, tool, &program, None, &mark)
                .map_err(failed)?;
        command.stdin(Stdio::piped());
        for (key, value) in &config.env {
            command.env(key, value);
        }
        // What of toolmux's own files is missing, and the repositories beneath the folder,
        // to move aside what the program makes of them (as for `bash`).
        let absent = self.sandbox.absent().await;
        let mut child = command
            .spawn()
            .map_err(|source| failed(self.sandbox.spawn_failed(label.clone(), source)))?;
        // Released once the group is dealt with, before the leader is reaped; on an early
        // return or a dropped future, after `group` (which kills the group) and before
        // `child` (the leader, reaped later).
        let watched = shell::guard::GroupGuard::watch(child.id(), &label);
        let mut group = MarkedGroup::new(child.id(), mark, label.clone());
        let leader = shell::guard::LeaderExit::of(&child);
        let mut input = serde_json::to_vec(&arguments).unwrap_or_default();
        input.push(b'\n');
        let stdin = child.stdin.take();
        let feed = async move {
            // A program that does not read its stdin closes it: that is not a failure.
            if let Some(mut stdin) = stdin {
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            }
        };
        let pipes = shell::PipeReaders::new();
        let stdout = child.stdout.take();
        let held = pipes.hold();
        let read_out = async move {
            let _held = held;
            let mut bytes = Vec::new();
            if let Some(stdout) = stdout {
                let mut limited = stdout.take(STDOUT_MAX as u64 + 1);
                let _ = limited.read_to_end(&mut bytes).await;
            }
            bytes
        };
        let stderr = child.stderr.take();
        let held = pipes.hold();
        let read_err = async move {
            let _held = held;
            let mut bytes = Vec::new();
            if let Some(stderr) = stderr {
                let mut limited = stderr.take(STDOUT_MAX as u64);
                let _ = limited.read_to_end(&mut bytes).await;
            }
            bytes
        };
        let limit = Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
        // Its own task, so that the pipes are read while the program runs and the call
        // stops waiting for them once it has ended and everything it started is killed.
        let mut reads = AbortOnDrop(tokio::spawn(async move {
            let ((), out, err) = tokio::join!(feed, read_out, read_err);
            (out, err)
        }));
        let status = tokio::select! {
            exited = leader.exited(&mut child) => Some(exited),
            () = tokio::time::sleep(limit) => None,
            () = ctx.cancel_token().cancelled() => {
                group.kill_all().await;
                // Dead and not reaped: the id is still ours (see `shell::guard`).
                drop(watched);
                if let Ok(Ok(_)) = tokio::time::timeout(shell::DRAIN_TIMEOUT, child.wait()).await {
                    group.disarm();
                }
                // What it made is moved aside as after an exit (logged only: there is no
                // result to name it in).
                if let Some(note) = self.sandbox.command_ended(absent).await {
                    tracing::warn!(tool = name, "{note}");
                }
                return Err(ToolError::Cancelled { tool: name.to_owned() });
            }
        };
        // Whatever the program left running goes with it, in its group or out of it; then
        // nothing holds its pipes. After an exit, what still holds them gets a moment to
        // finish first (a process substitution writing the result: `shell::EXIT_GRACE`).
        if status.is_some() {
            pipes.ended_within(shell::EXIT_GRACE).await;
        }
        let escaped = group.kill_all().await;
        // The group is dead and its leader not reaped, so its id is still ours: release it
        // now, then reap.
        drop(watched);
        let reaped = tokio::time::timeout(shell::DRAIN_TIMEOUT, child.wait()).await;
        // The result is the program's stdout (JSON, perhaps): what was moved aside is
        // logged and named in an extra.
        let moved = self.sandbox.command_ended(absent).await;
        if let Some(note) = &moved {
            tracing::warn!(tool = name, "{note}");
        }
        let Some(status) = status else {
            if let Ok(Ok(_)) = reaped {
                group.disarm();
            }
            return Err(ToolError::Timeout { tool: name.to_owned(), after: limit, idle: None });
        };
        let status = status.and_then(|()| match reaped {
            Ok(reaped) => reaped,
            Err(_) => Err(std::io::Error::other(format!(
                "it exited but could not be reaped within {} s",
                shell::DRAIN_TIMEOUT.as_secs()
            ))),
        });
        // Reaped and its group killed: the group's id may now be another's.
        group.disarm();
        let Ok(Ok((out, err))) = tokio::time::timeout(shell::DRAIN_TIMEOUT, &mut reads.0).await
        else {
            return Ok(ToolOutput::error(format!(
                "`{name}` exited, but a process it started kept its output open past {} s \
                 and outside its reach (it replaced its environment); its output was not kept",
                shell::DRAIN_TIMEOUT.as_secs()
            )));
        };
        let status = status.map_err(|source| failed(FsError::Spawn { command: label, source }))?;
        if out.len() > STDOUT_MAX {
            return Ok(ToolOutput::error(format!(
                "`{name}` printed more than {STDOUT_MAX} bytes; its output was not kept"
            )));
        }
        // Binary output has no place in a text result: the model is told what it was and
        // where it is.
        let mut files = Vec::new();
        let done = |output: ToolOutput, files: Vec<(&str, PathBuf)>| {
            let output = with_files(output, files);
            match &moved {
                Some(note) => output.with_extra("movedAside", json!(note)),
                None => output,
            }
        };
        let stdout = match control::is_binary(&out) {
            true => {
                let (notice, path) = self.binary_notice(&out, spill::Kind::Stdout);
                files.extend(path.map(|p| ("stdoutFile", p)));
                notice
            }
            false => control::to_text(&out),
        };
        // The result is the program's stdout (JSON, perhaps): the note is logged.
        if let Some(note) = shell::escaped_note(&escaped) {
            tracing::info!(tool = name, "{note}");
        }
        if !status.success() {
            let code =
                status.code().map_or_else(|| "a signal".to_owned(), |c| format!("exit code {c}"));
            let err = match control::is_binary(&err) {
                true => {
                    let (notice, path) = self.binary_notice(&err, spill::Kind::Stderr);
                    files.extend(path.map(|p| ("stderrFile", p)));
                    notice
                }
                false => control::to_text(&err),
            };
            let tail = tail(err.trim(), STDERR_KEPT);
            let mut message = format!("`{name}` failed ({code})");
            if !tail.is_empty() {
                message.push_str(": ");
                message.push_str(tail);
            } else if !stdout.trim().is_empty() {
                message.push_str(": ");
                message.push_str(tail_of(&stdout));
            }
            let output = ToolOutput::error(message).with_extra("exitCode", json!(status.code()));
            return Ok(done(output, files));
        }
        match config.output.unwrap_or(CommandOutput::Text) {
            CommandOutput::Text => Ok(done(ToolOutput::text(stdout), files)),
            // JSON is parsed from the bytes as printed (its strings escape their own
            // control characters); what reaches the model of output that is not JSON is
            // the escaped text.
            CommandOutput::Json => {
                match serde_json::from_str::<Value>(String::from_utf8_lossy(&out).trim()) {
                    Ok(value) => Ok(done(ToolOutput::json(value), Vec::new())),
                    Err(e) => Ok(done(
                        ToolOutput::error(format!(
                            "`{name}` is to print JSON (`output: json`) but printed what is \
                             not: {e}: `{}`",
                            tail_of(&stdout)
                        )),
                        files,
                    )),
                }
            }
        }
    }
}

/// `output` with the files that hold its binary output named (`stdoutFile`, `stderrFile`).
fn with_files(output: ToolOutput, files: Vec<(&str, PathBuf)>) -> ToolOutput {
    files
        .into_iter()
        .fold(output, |output, (key, path)| output.with_extra(key, json!(path.to_string_lossy())))
}

fn tail_of(text: &str) -> &str {
    tail(text.trim(), STDERR_KEPT)
}

/// The last `max` bytes of `text`, cut at a character boundary.
fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[async_trait]
impl ToolProvider for CommandTools {
    fn kind(&self) -> ToolKind {
        ToolKind::Builtin
    }

    fn namespace(&self) -> &str {
        COMMANDS_NAMESPACE
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(self.tools.values().map(|(spec, _)| spec.clone()).collect())
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let Some((_, config)) = self.tools.get(name) else {
            let suggestions = toolmux_core::suggest::closest(
                name,
                &self.tools.keys().map(String::as_str).collect::<Vec<_>>(),
            )
            .map(|s| vec![s.to_owned()])
            .unwrap_or_default();
            return Err(ToolError::UnknownTool { name: name.to_owned(), suggestions });
        };
        self.run(name, config, arguments, ctx).await
    }
}

/// A spawned task, aborted when its holder is dropped (the call was).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
