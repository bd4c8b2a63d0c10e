//! Background tasks: `bash` and `exec` with `run_in_background`, read with `task_output`,
//! fed with `task_write_stdin` (when started with `keep_stdin`), stopped with `task_kill`,
//! listed with `task_list`.
//!
//! A task runs in its own session and process group, like a foreground command, with a
//! lifetime (`timeout`, default 30 minutes) after which the group is killed. What it prints
//! (stdout and stderr interleaved as they arrive) is kept until read, at most
//! [`KEEP_UNREAD`] bytes (older unread bytes are dropped and counted), and all of it is
//! saved to a file (removed when the task is forgotten: the oldest finished tasks past
//! 32, or all when the provider goes). A task belongs to the run that started it: other runs neither see nor
//! stop it. At most `bash.maxBackground` run at once; the provider's shutdown (and its
//! drop) kills every group still alive.

use super::shell::{self, DRAIN_TIMEOUT, Program};
use super::{control, spill};
use crate::config::BashConfig;
use crate::error::FsError;
use crate::sandbox::Sandbox;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolmux_core::{ProcessMark, ToolOutput};

/// Unread output a task keeps, in bytes; older unread output is dropped (and counted).
pub(crate) const KEEP_UNREAD: usize = 1024 * 1024;

/// Finished tasks kept for reading, per provider; the oldest finished go first.
const KEEP_FINISHED: usize = 32;

/// The longest `block_ms` of `task_output`.
const MAX_BLOCK: Duration = Duration::from_secs(30);

/// How long a task's answer must have been quiet for `task_write_stdin` to return it.
const ANSWER_QUIET: Duration = Duration::from_millis(150);

/// How long `task_write_stdin` waits for a task to take its input.
const STDIN_WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of `task_output`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskOutputArgs {
    /// The task, as `bash` or `exec` named it.
    pub task_id: String,
    /// Wait up to this many milliseconds (at most 30000) for new output or the task's end
    /// when there is none yet (default 0: answer at once).
    #[serde(default)]
    pub block_ms: Option<u64>,
    /// Show only the new lines matching this regular expression (the others are read
    /// and skipped).
    #[serde(default)]
    pub filter: Option<String>,
}

/// Arguments of `task_write_stdin`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskWriteStdinArgs {
    /// The task, started with `keep_stdin`.
    pub task_id: String,
    /// The text to send, exactly: end a line with `\n` (a REPL or a prompt waits for it).
    /// May be empty, to only close or only wait.
    #[serde(default)]
    pub input: String,
    /// Close the task's input after sending (end of file: `Ctrl-D`).
    #[serde(default)]
    pub close: bool,
    /// Then wait up to this many milliseconds (at most 30000) for output or the task's end
    /// (default 1000).
    #[serde(default)]
    pub block_ms: Option<u64>,
}

/// Arguments of `task_kill`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskKillArgs {
    /// The task to stop.
    pub task_id: String,
}

/// Arguments of `task_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskListArgs {}

/// The description; `ns` is the namespace the tools are listed in (other tools are named
/// as a model calls them, `fs__ls` in `fs`).
pub(crate) fn output_description(ns: &str) -> String {
    format!(
        "What a background task (`{ns}__bash` or `{ns}__exec` with \
`run_in_background`) printed since the last look, stdout and stderr interleaved, terminal \
escapes removed, and whether it is still running or how it ended. `block_ms` waits (up to 30000) \
for new output or the end; `filter` keeps only matching lines."
    )
}

/// The description; `ns` is the namespace the tools are listed in (other tools are named
/// as a model calls them, `fs__ls` in `fs`).
pub(crate) fn write_stdin_description(ns: &str) -> String {
    format!(
        "Send text to the standard input of a \
background task started with `keep_stdin: true` (a REPL, a program asking questions, a server \
reading commands), then wait up to `block_ms` (default 1000) for what it prints, returned as \
`{ns}__task_output` returns it. `input` is sent exactly: end lines with `\\n`. `close: true` closes \
its input afterwards (end of file). A task that stops reading its input is reported after 5 \
seconds instead of waiting."
    )
}

pub(crate) const KILL_DESCRIPTION: &str = "Stops a background task: its whole process group is \
killed. Returns how it ended and what it printed that was not read yet.";

pub(crate) const LIST_DESCRIPTION: &str = "The background tasks of this run: id, command, process \
id, running or how it ended, and for how long.";

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Exited(i32),
    Signal(i32),
    TimedOut(Duration),
    /// It printed more than this many bytes (`maxOutputBytes`).
    Flooded(u64),
    Killed,
    /// The process could not be waited for.
    Lost(String),
}

/// One background task.
#[derive(Debug)]
struct Task {
    id: String,
    run: String,
    label: String,
    pid: Option<u32>,
    /// The mark its processes carry, to find those that left its group.
    mark: ProcessMark,
    started: Instant,
    state: Mutex<TaskState>,
    /// Woken on new output and at the end.
    changed: Notify,
    /// Asks the watcher to kill the group.
    stop: CancellationToken,
    /// Cancelled by a reader once the task printed more than `max_output`.
    flooded: CancellationToken,
    /// Bytes it may print, both streams together (`maxOutputBytes`).
    max_output: u64,
    /// Cancelled by the watcher once the task has ended and its pipes are drained.
    done: CancellationToken,
    /// Its standard input (the pipe, or its terminal's master side), when started with
    /// `keep_stdin` or `tty` and not closed yet.
    stdin: tokio::sync::Mutex<Option<Input>>,
    /// Whether it was started with `keep_stdin` (or `tty`).
    keeps_stdin: bool,
    /// Whether it runs on a terminal of its own (`tty`).
    tty: bool,
    /// Kills its group should toolmux die without doing so; released by the watcher once
    /// the group is killed, or with the task.
    guard: Mutex<Option<shell::guard::GroupGuard>>,
    /// Moves aside what it creates that it must not (a `.git` beneath the root, toolmux's
    /// configuration): at its end, and while it runs, when another command ends and when
    /// its output is read (walking the tree then only when due: `TaskCheck::run_for_read`).
    check: Arc<crate::sandbox::TaskCheck>,
}

/// Where a task's input is written.
#[derive(Debug)]
enum Input {
    /// A pipe to its stdin.
    Pipe(tokio::process::ChildStdin),
    /// The master side of its terminal.
    Terminal(super::pty::Master),
}

impl tokio::io::AsyncWrite for Input {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Input::Pipe(pipe) => std::pin::Pin::new(pipe).poll_write(cx, bytes),
            Input::Terminal(file) => std::pin::Pin::new(file).poll_write(cx, bytes),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Input::Pipe(pipe) => std::pin::Pin::new(pipe).poll_flush(cx),
            Input::Terminal(file) => std::pin::Pin::new(file).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Input::Pipe(pipe) => std::pin::Pin::new(pipe).poll_shutdown(cx),
            Input::Terminal(file) => std::pin::Pin::new(file).poll_shutdown(cx),
        }
    }
}

#[derive(Debug, Default)]
struct TaskState {
    /// Output not read yet.
    unread: VecDeque<u8>,
    /// Unread bytes dropped to keep within [`KEEP_UNREAD`], since the last read.
    dropped: u64,
    /// Everything printed, in bytes.
    total: u64,
    end: Option<(End, Duration)>,
    /// How many notes of its check (what toolmux moved aside) a read has shown.
    notes_shown: usize,
    /// Where all output goes, with its path.
    file: Option<(PathBuf, std::fs::File)>,
    /// Bytes written to `file`.
    saved: u64,
    /// Whether saving stopped (the cap, or a write failed).
    save_stopped: bool,
}

impl Task {
    fn lock(&self) -> std::sync::MutexGuard<'_, TaskState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_running(&self) -> bool {
        self.lock().end.is_none()
    }

    /// Kills the group now, from any thread (the watcher reaps it).
    fn kill_group(&self) {
        self.signal_group(rustix::process::Signal::KILL);
    }

    fn signal_group(&self, signal: rustix::process::Signal) {
        if let Some(pid) = self.pid.and_then(|id| rustix::process::Pid::from_raw(id as i32)) {
            let _ = rustix::process::kill_process_group(pid, signal);
        }
    }

    /// Its state in words: `running for 3.2 s`, `exited with code 0 after 3.2 s`, ...
    fn status(&self) -> String {
        let state = self.lock();
        match &state.end {
            None => format!("running for {}", seconds(self.started.elapsed())),
            Some((end, after)) => {
                let after = seconds(*after);
                match end {
                    End::Exited(code) => format!("exited with code {code} after {after}"),
                    End::Signal(signal) => format!("killed by signal {signal} after {after}"),
                    End::TimedOut(limit) => format!(
                        "timed out after {} ms: the process group was killed",
                        limit.as_millis()
                    ),
                    End::Flooded(max) => format!(
                        "printed more than {max} bytes (`maxOutputBytes`) after {after}: the \
                         process group was killed"
                    ),
                    End::Killed => format!("stopped by task_kill after {after}"),
                    End::Lost(why) => format!("lost after {after}: {why}"),
                }
            }
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        // The output file lives as long as the task is kept. Removed by path, not through
        // the spill directory's handle: a command can swap the directory on that path only
        // where it may write its parent and no read-only view covers it (no mount
        // namespaces, or the sandbox off), and then what the path leads to is a folder of
        // its choice, where the unlink removes only an entry of the log's own name (with its
        // 64 random bits), which the command can have put only where it could remove it
        // itself; a symlink in the last place is removed, never followed.
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some((path, _)) = state.file.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Where and for whom a background task starts.
pub(crate) struct Start<'a> {
    pub(crate) config: &'a BashConfig,
    /// The sandbox it runs in, as foreground commands do.
    pub(crate) sandbox: &'a Sandbox,
    /// The workspace root, its working directory.
    pub(crate) root: &'a Path,
    /// `bash` or `exec`.
    pub(crate) tool: &'static str,
    /// The provider's namespace, to name its tools in messages.
    pub(crate) namespace: &'a str,
    /// When it is killed unless it ended.
    pub(crate) lifetime: Duration,
    /// The run it belongs to.
    pub(crate) run: &'a str,
    /// Keep its standard input open for `task_write_stdin`.
    pub(crate) keep_stdin: bool,
    /// Run it on a pseudo-terminal of its own (input kept open too).
    pub(crate) tty: bool,
}

/// The background tasks of one provider.
#[derive(Debug)]
pub(crate) struct Tasks {
    tasks: Mutex<BTreeMap<u64, Arc<Task>>>,
    next: AtomicU64,
    /// Starts under way: checked against `bash.maxBackground` but not yet among `tasks`.
    // Invariant: raised only under the `tasks` lock, together with the check of the cap,
    // and lowered under it when the task goes in (`insert`), so that a check sees every
    // task that has passed one either here or there, never in both.
    starting: AtomicUsize,
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks {
            tasks: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(1),
            starting: AtomicUsize::new(0),
        }
    }
}

/// The place of a start under way among the `bash.maxBackground` running tasks, given up
/// when the start fails or is dropped, or passed to its task by [`Tasks::insert`].
#[derive(Debug)]
struct Slot<'a> {
    starting: &'a AtomicUsize,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.starting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        // Nothing outlives the provider: the watchers may never run again (a runtime
        // shutting down), so the groups are killed here.
        for task in self.lock().values() {
            if task.is_running() {
                task.kill_group();
                // Here and now: nothing may be left to run after the provider.
                task.mark.sweep_and_log(&task.label);
            }
        }
    }
}

impl Tasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Task>>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The task `id` of run `run`; another run's task is unknown to it.
    fn get(&self, tool: &'static str, run: &str, id: &str) -> Result<Arc<Task>, FsError> {
        let found = self.lock().values().find(|t| t.id == id && t.run == run).cloned();
        found.ok_or_else(|| {
            let known: Vec<String> =
                self.lock().values().filter(|t| t.run == run).map(|t| t.id.clone()).collect();
            let known = if known.is_empty() {
                "this run has no background tasks".to_owned()
            } else {
                format!("this run's tasks: {}", known.join(", "))
            };
            FsError::InvalidArguments {
                tool,
                message: format!("no background task `{id}` ({known})"),
            }
        })
    }

    /// Starts `program` in the background for the call `start` describes.
    pub(crate) async fn start(
        &self,
        start: Start<'_>,
        program: Program,
    ) -> Result<ToolOutput, FsError> {
        let Start { config, sandbox, root, tool, namespace, lifetime, run, keep_stdin, tty } =
            start;
        let keep_stdin = keep_stdin || tty;
        let label = program.label();
        // The place is taken under the same lock as the check: starts under way at once
        // (each awaits below before its task goes in) count against the cap too.
        let slot = {
            let tasks = self.lock();
            let running = tasks.values().filter(|t| t.is_running()).count()
                + self.starting.load(Ordering::Relaxed);
            if running >= config.max_background {
                return Err(FsError::CommandDenied {
                    command: label,
                    reason: format!(
                        "{running} background tasks are running, the most \
                         `bash.maxBackground` allows; stop one with `{namespace}__task_kill` \
                         or wait for one to end"
                    ),
                });
            }
            self.starting.fetch_add(1, Ordering::Relaxed);
            Slot { starting: &self.starting }
        };
        let spawn_error = |source| FsError::Spawn { command: label.clone(), source };
        let pty = if tty { Some(super::pty::Pty::open().map_err(spawn_error)?) } else { None };
        let mark = ProcessMark::new();
        let mut command =
            shell::command(config, sandbox, root, tool, &program, pty.as_ref(), &mark)?;
        if keep_stdin && pty.is_none() {
            command.stdin(std::process::Stdio::piped());
        }
        let checks = sandbox.task_checks();
        let check = checks.watch(sandbox.absent().await);
        let mut child =
            command.spawn().map_err(|source| sandbox.spawn_failed(label.clone(), source))?;
        // The parent's copies of the terminal's slave side go with the command, so that
        // reading the master ends when the task's processes have all closed theirs.
        drop(command);
        let (input, terminal) = match pty {
            Some(pty) => {
                let writer = pty.master.try_clone().map_err(spawn_error)?;
                let writer = super::pty::Master::new(writer).map_err(spawn_error)?;
                let reader = super::pty::Master::new(pty.master).map_err(spawn_error)?;
                (Some(Input::Terminal(writer)), Some(reader))
            }
            None => (child.stdin.take().map(Input::Pipe), None),
        };
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (file, file_error) = match spill::create(config.spill_dir.as_deref(), spill::Kind::Task)
        {
            Ok(file) => (Some(file), None),
            Err(why) => (None, Some(why)),
        };
        let guard = shell::guard::GroupGuard::watch(child.id(), &label);
        let task = Arc::new(Task {
            id: format!("task-{n}"),
            run: run.to_owned(),
            label,
            pid: child.id(),
            mark,
            started: Instant::now(),
            state: Mutex::new(TaskState { file, ..TaskState::default() }),
            changed: Notify::new(),
            stop: CancellationToken::new(),
            flooded: CancellationToken::new(),
            max_output: config.max_output_bytes,
            done: CancellationToken::new(),
            stdin: tokio::sync::Mutex::new(input),
            keeps_stdin: keep_stdin,
            tty,
            guard: Mutex::new(guard),
            check,
        });
        let pipes = shell::PipeReaders::new();
        let max = config.spill_max_bytes;
        let readers: Vec<_> = [
            child.stdout.take().map(|s| tokio::spawn(pump(s, task.clone(), max, pipes.hold()))),
            child.stderr.take().map(|s| tokio::spawn(pump(s, task.clone(), max, pipes.hold()))),
            terminal.map(|t| tokio::spawn(pump(t, task.clone(), max, pipes.hold()))),
        ]
        .into_iter()
        .flatten()
        .collect();
        tokio::spawn(watch(child, task.clone(), readers, pipes, lifetime, checks));
        self.insert(n, task.clone(), slot);
        let text = format!(
            "started background task `{}` (pid {}), killed after {} unless it ends or is stopped \
             first: `{}`. Read its output with `{namespace}__task_output` \
             ({{\"task_id\": \"{}\", \"block_ms\": 5000}}){}; stop it with `{namespace}__task_kill`.",
            task.id,
            task.pid.map_or_else(|| "unknown".to_owned(), |p| p.to_string()),
            seconds(lifetime),
            task.label,
            task.id,
            if keep_stdin {
                format!("; send it input with `{namespace}__task_write_stdin`")
            } else {
                String::new()
            },
        );
        let mut output = ToolOutput::text(text)
            .with_extra("taskId", json!(task.id))
            .with_extra("pid", json!(task.pid));
        if let Some((path, _)) = &task.lock().file {
            output = output.with_extra("outputFile", json!(path.to_string_lossy()));
        }
        if let Some(why) = file_error {
            // The task runs all the same: its output is kept in memory until read.
            output.content = ToolOutput::text(format!(
                "{}\n[its output is not saved to a file: {why}]",
                output.to_text()
            ))
            .content;
            output = output.with_extra("outputFileError", json!(why));
        }
        Ok(output)
    }

    /// Keeps `task`, which takes over `slot`, forgetting the oldest finished tasks past
    /// [`KEEP_FINISHED`].
    fn insert(&self, n: u64, task: Arc<Task>, slot: Slot<'_>) {
        let mut tasks = self.lock();
        tasks.insert(n, task);
        // Under the lock: a check never counts this task both as running and as starting.
        drop(slot);
        let finished: Vec<u64> =
            tasks.iter().filter(|(_, t)| !t.is_running()).map(|(n, _)| *n).collect();
        for n in finished.iter().take(finished.len().saturating_sub(KEEP_FINISHED)) {
            tasks.remove(n);
        }
    }

    /// `task_output`.
    pub(crate) async fn output(
        &self,
        config: &BashConfig,
        args: TaskOutputArgs,
        run: &str,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, FsError> {
        const TOOL: &str = "task_output";
        let filter = match &args.filter {
            Some(pattern) => Some(regex::Regex::new(pattern).map_err(|e| {
                FsError::InvalidArguments { tool: TOOL, message: format!("`filter`: {e}") }
            })?),
            None => None,
        };
        let task = self.get(TOOL, run, &args.task_id)?;
        let block = Duration::from_millis(args.block_ms.unwrap_or(0)).min(MAX_BLOCK);
        let deadline = tokio::time::Instant::now() + block;
        loop {
            // Registered before looking, so that output arriving in between wakes us.
            let changed = task.changed.notified();
            {
                let state = task.lock();
                // With a filter, only a whole line is something to show (see `render`).
                let news = match &filter {
                    Some(_) => {
                        state.unread.contains(&b'\n') || state.unread.len() > PARTIAL_LINE_MAX
                    }
                    None => !state.unread.is_empty(),
                };
                if news || state.dropped > 0 || state.end.is_some() {
                    break;
                }
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => break,
                () = cancel.cancelled() => return Err(FsError::Cancelled { tool: TOOL }),
            }
        }
        // What it made so far goes now, not only when it ends (see `Task::check`); the tree
        // is walked only when due, so that polling a task in a large tree stays cheap.
        task.check.run_for_read().await;
        Ok(render(&task, config.output_cap_chars, filter.as_ref()))
    }

    /// `task_write_stdin`.
    pub(crate) async fn write_stdin(
        &self,
        config: &BashConfig,
        args: TaskWriteStdinArgs,
        run: &str,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, FsError> {
        const TOOL: &str = "task_write_stdin";
        let task = self.get(TOOL, run, &args.task_id)?;
        let refuse = |message: String| FsError::InvalidArguments { tool: TOOL, message };
        if !task.keeps_stdin {
            return Err(refuse(format!(
                "task `{}` was not started with `keep_stdin: true`: its input is closed; start \
                 it again with `keep_stdin` to send it input",
                task.id
            )));
        }
        let printed_before = task.lock().total;
        {
            let mut stdin = task.stdin.lock().await;
            if !task.is_running() {
                *stdin = None;
                return Err(refuse(format!("task `{}` has ended: {}", task.id, task.status())));
            }
            let Some(pipe) = stdin.as_mut() else {
                return Err(refuse(format!(
                    "task `{}`'s input was closed (`close: true` earlier)",
                    task.id
                )));
            };
            if !args.input.is_empty() {
                use tokio::io::AsyncWriteExt as _;
                let write = async {
                    pipe.write_all(args.input.as_bytes()).await?;
                    pipe.flush().await
                };
                tokio::select! {
                    written = tokio::time::timeout(STDIN_WRITE_TIMEOUT, write) => match written {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            *stdin = None;
                            return Err(refuse(format!(
                                "task `{}` does not take input any more ({e}): {}",
                                task.id,
                                task.status()
                            )));
                        }
                        Err(_) => {
                            return Err(refuse(format!(
                                "task `{}` has not read its input for {} s (what fitted in the \
                                 pipe was sent); read its output with `task_output` to see what \
                                 it waits for",
                                task.id,
                                STDIN_WRITE_TIMEOUT.as_secs()
                            )));
                        }
                    },
                    () = cancel.cancelled() => return Err(FsError::Cancelled { tool: TOOL }),
                }
            }
            if args.close {
                if task.tty {
                    // A terminal is not closed but sent its end-of-file character (^D),
                    // as a person types it; closing it would hang up the task.
                    use tokio::io::AsyncWriteExt as _;
                    let eof = async {
                        pipe.write_all(b"\x04").await?;
                        pipe.flush().await
                    };
                    let _ = tokio::time::timeout(STDIN_WRITE_TIMEOUT, eof).await;
                } else {
                    // Dropping the pipe closes it: the task reads end of file.
                    *stdin = None;
                }
            }
        }
        // What it prints in answer: the first output after the input, and what follows it
        // until it has been quiet for a moment, the task ends or `block_ms` passes.
        let block = Duration::from_millis(args.block_ms.unwrap_or(1000)).min(MAX_BLOCK);
        let deadline = tokio::time::Instant::now() + block;
        let mut answered = false;
        loop {
            let changed = task.changed.notified();
            {
                let state = task.lock();
                if state.end.is_some() {
                    break;
                }
                answered |= state.total > printed_before;
            }
            let quiet = if answered { ANSWER_QUIET } else { MAX_BLOCK };
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep(quiet) => break,
                () = tokio::time::sleep_until(deadline) => break,
                () = cancel.cancelled() => return Err(FsError::Cancelled { tool: TOOL }),
            }
        }
        task.check.run_for_read().await;
        Ok(render(&task, config.output_cap_chars, None))
    }

    /// `task_kill`.
    pub(crate) async fn kill(
        &self,
        config: &BashConfig,
        args: TaskKillArgs,
        run: &str,
    ) -> Result<ToolOutput, FsError> {
        let task = self.get("task_kill", run, &args.task_id)?;
        task.stop.cancel();
        // The watcher kills the group, reaps it and drains its pipes.
        let _ = tokio::time::timeout(DRAIN_TIMEOUT * 2, task.done.cancelled()).await;
        Ok(render(&task, config.output_cap_chars, None))
    }

    /// `task_list`.
    pub(crate) fn list(&self, run: &str) -> ToolOutput {
        let tasks: Vec<Arc<Task>> =
            self.lock().values().filter(|t| t.run == run).cloned().collect();
        if tasks.is_empty() {
            return ToolOutput::text("no background tasks in this run");
        }
        let mut text = String::new();
        let mut listed = Vec::new();
        for task in &tasks {
            let status = task.status();
            let pid = task.pid.map_or_else(|| "?".to_owned(), |p| p.to_string());
            let _ = writeln!(text, "{} (pid {pid}) {status}: {}", task.id, task.label);
            listed.push(json!({
                "taskId": task.id, "pid": task.pid, "command": task.label,
                "running": task.is_running(), "status": status,
            }));
        }
        ToolOutput::text(text.trim_end().to_owned()).with_extra("tasks", json!(listed))
    }

    /// Stops every task and waits (boundedly) until each has ended.
    pub(crate) async fn shutdown(&self) {
        let tasks: Vec<Arc<Task>> = self.lock().values().cloned().collect();
        for task in &tasks {
            task.stop.cancel();
        }
        for task in tasks {
            let _ = tokio::time::timeout(DRAIN_TIMEOUT * 2, task.done.cancelled()).await;
        }
    }
}

/// Copies one pipe of `task` into its state until the pipe closes, holding `_held` (of
/// [`shell::PipeReaders`]) until then.
async fn pump(
    mut pipe: impl AsyncRead + Unpin,
    task: Arc<Task>,
    save_max: u64,
    _held: tokio::sync::mpsc::Sender<()>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let bytes = &buf[..n];
        {
            let mut state = task.lock();
            state.total += n as u64;
            if state.total > task.max_output {
                task.flooded.cancel();
            }
            state.unread.extend(bytes);
            let excess = state.unread.len().saturating_sub(KEEP_UNREAD);
            if excess > 0 {
                state.unread.drain(..excess);
                state.dropped += excess as u64;
            }
            let room = save_max.saturating_sub(state.saved) as usize;
            if !state.save_stopped {
                let part = &bytes[..n.min(room)];
                let written = state.file.as_mut().is_some_and(|(_, f)| f.write_all(part).is_ok());
                state.saved += part.len() as u64;
                if !written || part.len() < n {
                    state.save_stopped = true;
                }
            }
        }
        task.changed.notify_waiters();
    }
}

/// Waits for the task's end (its exit, its lifetime, `task_kill`), kills its group in
/// every case (processes it left behind too), drains its pipes and records the end.
async fn watch(
    mut child: tokio::process::Child,
    task: Arc<Task>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    pipes: shell::PipeReaders,
    lifetime: Duration,
    checks: crate::sandbox::TaskChecks,
) {
    let leader = shell::guard::LeaderExit::of(&child);
    let end = tokio::select! {
        exited = leader.exited(&mut child) => match exited {
            // Its code once reaped, below.
            Ok(()) => End::Exited(0),
            Err(e) => End::Lost(e.to_string()),
        },
        () = tokio::time::sleep(lifetime) => End::TimedOut(lifetime),
        () = task.flooded.cancelled() => End::Flooded(task.max_output),
        () = task.stop.cancelled() => End::Killed,
    };
    if matches!(end, End::TimedOut(_)) {
        // Asked to stop first, as a foreground command that runs out of time is.
        task.signal_group(rustix::process::Signal::TERM);
        let _ = tokio::time::timeout(shell::TERM_GRACE, leader.exited(&mut child)).await;
    }
    if matches!(end, End::Exited(_)) {
        // What a process substitution copies after the shell's exit (`shell::EXIT_GRACE`).
        pipes.ended_within(shell::EXIT_GRACE).await;
    }
    task.kill_group();
    // What left the group goes too, before the pipes are drained (it may hold them).
    task.mark.sweep_on_pool(&task.label).await;
    // The group is dead and its leader not reaped, so its id is still ours: release it
    // now, then reap (SIGKILL makes this quick).
    drop(task.guard.lock().unwrap_or_else(|e| e.into_inner()).take());
    let reaped = tokio::time::timeout(DRAIN_TIMEOUT, child.wait()).await;
    let end = match (end, reaped) {
        (End::Exited(_), Ok(Ok(status))) => {
            use std::os::unix::process::ExitStatusExt as _;
            match (status.code(), status.signal()) {
                (Some(code), _) => End::Exited(code),
                (None, signal) => End::Signal(signal.unwrap_or(0)),
            }
        }
        (End::Exited(_), Ok(Err(e))) => End::Lost(e.to_string()),
        (End::Exited(_), Err(_)) => End::Lost(format!(
            "it exited but could not be reaped within {} s",
            DRAIN_TIMEOUT.as_secs()
        )),
        (end, _) => end,
    };
    for mut reader in readers {
        if tokio::time::timeout(DRAIN_TIMEOUT, &mut reader).await.is_err() {
            reader.abort();
        }
    }
    // Its input closes with it (a write now fails at once, not after a timeout).
    *task.stdin.lock().await = None;
    // Its last check; what the tasks still running made so far goes too, as at another
    // command's end.
    checks.task_ended(&task.check).await;
    let mut state = task.lock();
    state.end = Some((end, task.started.elapsed()));
    drop(state);
    task.changed.notify_waiters();
    task.done.cancel();
}

/// The task's status and the output not read yet (taken out), within `cap` characters.
/// The longest start of a line a filtered read holds back until the line ends.
const PARTIAL_LINE_MAX: usize = 64 * 1024;

fn render(task: &Task, cap: usize, filter: Option<&regex::Regex>) -> ToolOutput {
    let status = task.status();
    let (bytes, dropped, total, end, file, notes) = {
        let mut state = task.lock();
        // A character cut in two by the read waits for its other half, unless the task
        // has ended.
        let mut taken: Vec<u8> = state.unread.drain(..).collect();
        if state.end.is_none() {
            let mut keep_back = incomplete_tail(&taken);
            // A terminal ends lines with CR LF: a CR last may be half of one.
            if task.tty && keep_back == 0 && taken.last() == Some(&b'\r') {
                keep_back = 1;
            }
            // A filter matches whole lines: the start of a line whose end has not come
            // yet waits for it (`ERR` now and `OR: boom` later is one line, `ERROR:
            // boom`), unless it grows past a bound (a progress bar that never ends its
            // line).
            if filter.is_some() {
                let partial = taken.iter().rev().position(|&b| b == b'\n').unwrap_or(taken.len());
                if partial <= PARTIAL_LINE_MAX {
                    keep_back = keep_back.max(partial);
                }
            }
            let tail = taken.split_off(taken.len() - keep_back);
            state.unread.extend(tail);
        }
        let dropped = std::mem::take(&mut state.dropped);
        // The file, and how much of the output it holds when that is not all of it.
        let file = state.file.as_ref().map(|(p, _)| {
            let short = (state.saved < state.total).then_some(state.saved);
            (p.clone(), short)
        });
        // While it runs, a read shows the notes no read has shown; once it has ended, all
        // of them, as its last word.
        let from = if state.end.is_some() { 0 } else { state.notes_shown };
        let (notes, all) = task.check.notes_from(from);
        state.notes_shown = all;
        (taken, dropped, state.total, state.end.clone(), file, notes)
    };
    let text = String::from_utf8_lossy(&bytes);
    let text = if task.tty { std::borrow::Cow::Owned(text.replace("\r\n", "\n")) } else { text };
    let text = shell::strip_ansi(&text);
    let text = control::escape_controls(&text);
    let shown: String = match filter {
        // Binary output is one line in place of it all, filtered or not.
        _ if control::is_binary(&bytes) => {
            let saved = match &file {
                None => "; it could not be saved".to_owned(),
                Some((p, None)) => control::binary_saved("all of it is in", p),
                Some((p, Some(saved))) => {
                    control::binary_saved(&format!("its first {saved} bytes are in"), p)
                }
            };
            control::binary_notice(bytes.len() as u64, &saved)
        }
        Some(filter) => text
            .split_inclusive('\n')
            .filter(|line| filter.is_match(line.trim_end_matches(['\n', '\r'])))
            .collect(),
        None => text.into_owned(),
    };
    let chars = shown.chars().count();
    let mut out = format!("task `{}` {status}", task.id);
    for note in notes {
        out.push('\n');
        out.push_str(&note);
    }
    if dropped > 0 {
        let saved = match &file {
            None => "it could not be saved".to_owned(),
            Some((p, None)) => format!("all output is saved in {}", p.display()),
            Some((p, Some(saved))) => format!(
                "the first {saved} bytes are saved in {} (the file's cap, `spillMaxBytes`)",
                p.display()
            ),
        };
        let _ = write!(out, "\n[{dropped} bytes of output were dropped unread; {saved}]");
    }
    if shown.is_empty() {
        out.push_str(if filter.is_some() {
            "\n[no new matching output]"
        } else {
            "\n[no new output]"
        });
    } else if chars > cap {
        let half = cap / 2;
        let first: String = shown.chars().take(half).collect();
        let last: String = shown.chars().skip(chars - (cap - half)).collect();
        let saved = match &file {
            None => String::new(),
            Some((p, None)) => format!("; all of it is in {}", p.display()),
            Some((p, Some(saved))) => format!("; its first {saved} bytes are in {}", p.display()),
        };
        let _ = write!(
            out,
            "\n--- output ---\n{first}\n[... {} characters omitted{saved} ...]\n{}",
            chars - cap,
            last.trim_end_matches('\n')
        );
    } else {
        let _ = write!(out, "\n--- output ---\n{}", shown.trim_end_matches('\n'));
    }
    let mut output = ToolOutput::text(out)
        .with_extra("taskId", json!(task.id))
        .with_extra("running", json!(end.is_none()))
        .with_extra("outputBytes", json!(total));
    if let Some((end, _)) = &end {
        output = match end {
            End::Exited(code) => output.with_extra("exitCode", json!(code)),
            End::Signal(signal) => output.with_extra("signal", json!(signal)),
            End::TimedOut(_) => output.with_extra("timedOut", json!(true)),
            End::Flooded(_) => output.with_extra("outputLimitExceeded", json!(true)),
            End::Killed => output.with_extra("killed", json!(true)),
            End::Lost(_) => output,
        };
        output.is_error = !matches!(end, End::Exited(0) | End::Killed);
    }
    output
}

/// How many bytes at the end of `bytes` are the start of a UTF-8 character cut short.
fn incomplete_tail(bytes: &[u8]) -> usize {
    let character = match std::str::from_utf8(bytes) {
        Err(e) if e.error_len().is_none() => bytes.len() - e.valid_up_to(),
        _ => 0,
    };
    character.max(incomplete_escape(bytes))
}

/// The bytes at the end of `bytes` that begin a terminal escape sequence not finished yet
/// (`ESC [ 3` of `ESC [ 31m`): held back with the rest of it to come, since escapes are
/// removed from what is shown one read at a time, and half of one would show as `1m`.
/// Only within the last 256 bytes: what is longer is no sequence worth waiting for.
fn incomplete_escape(bytes: &[u8]) -> usize {
    const LONGEST: usize = 256;
    let from = bytes.len().saturating_sub(LONGEST);
    let Some(start) = bytes[from..].iter().rposition(|&b| b == 0x1b).map(|i| from + i) else {
        return 0;
    };
    let rest = &bytes[start + 1..];
    // Finished, or interrupted by a byte that cannot go on (`shell::strip_ansi` then shows
    // it as it is): either way nothing more is worth waiting for.
    let finished = match rest.first() {
        None => false,
        // CSI: parameter and intermediate bytes up to a final byte.
        Some(b'[') => rest[1..].iter().any(|b| !(0x20..=0x3f).contains(b)),
        // OSC: printable text up to BEL or ESC `\` (the ESC of which would be the last one
        // found).
        Some(b']') => rest[1..].iter().any(|&b| b < 0x20 || b == 0x7f),
        // nF: intermediate bytes up to a final byte.
        Some(0x20..=0x2f) => rest[1..].iter().any(|b| !(0x20..=0x2f).contains(b)),
        // A two-byte escape.
        Some(_) => true,
    };
    if finished { 0 } else { bytes.len() - start }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_cut_short_waits_for_its_end() {
        let euro = "€".as_bytes();
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail(&[b'a', euro[0], euro[1]]), 2);
        assert_eq!(incomplete_tail(euro), 0);
        // Invalid bytes are not waited for: they are shown as they are.
        assert_eq!(incomplete_tail(&[b'a', 0xff]), 0);
    }

    #[test]
    fn an_escape_cut_short_waits_for_its_end() {
        assert_eq!(incomplete_tail(b"red \x1b[3"), 3);
        assert_eq!(incomplete_tail(b"red \x1b[31mtext"), 0);
        assert_eq!(incomplete_tail(b"title \x1b]0;name"), 8);
        assert_eq!(incomplete_tail(b"title \x1b]0;name\x07done"), 0);
        assert_eq!(incomplete_tail(b"end \x1b"), 1);
        assert_eq!(incomplete_tail(b"two \x1bMx"), 0);
        assert_eq!(incomplete_tail(b"charset \x1b("), 2);
        // Interrupted: shown as it is, not waited for.
        assert_eq!(incomplete_tail(b"title \x1b]0;na\0me"), 0);
        assert_eq!(incomplete_tail(b"red \x1b[3\0"), 0);
    }
}
