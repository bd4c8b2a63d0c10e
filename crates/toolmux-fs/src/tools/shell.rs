//! `bash` and `exec`: commands in their own process group, killed as a group on timeout,
//! cancellation or exit, with capped output and the full output spilled to a file.

pub(crate) mod guard;

use super::{control, spill};
use crate::config::BashConfig;
use crate::error::FsError;
use crate::sandbox::Sandbox;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;
use toolmux_core::{MarkedGroup, ProcessMark, ToolOutput};

/// How long the pipes may stay open once the process group is dead (a process that left
/// the group may still hold them).
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long, once a command has exited, the processes it left holding its output have to
/// finish before its group is killed: a process substitution (`exec > >(tee -a log)`)
/// copies the shell's last output after the shell has gone, and killing it at once lost
/// that output. A process that holds the pipes for longer (`sleep 1000 &`) costs no more.
pub(crate) const EXIT_GRACE: Duration = Duration::from_millis(500);

/// How long a command that ran out of time has between `SIGTERM` and `SIGKILL`.
pub(crate) const TERM_GRACE: Duration = Duration::from_secs(2);

/// How much longer than a command's own timeout a call may take: the grace after SIGTERM,
/// killing the group, draining the pipes, spilling and answering
/// ([`toolmux_core::ToolSpec::time_limit`]).
pub(crate) const ANSWER_MARGIN: Duration = Duration::from_secs(15);

/// Characters a `bash` command may contain when an allow-list is set: shell operators that
/// chain, substitute or redirect are refused, since a prefix check could not see past them.
const SHELL_OPERATORS: &[char] = &[';', '&', '|', '$', '`', '<', '>', '(', ')', '\n', '\r', '\\'];

/// Whether `c` would make a word split differently by bash than by a reader who sees
/// spaces: any space but a plain one or a tab (`cat\u{a0}notes` is one program name to
/// bash), and any control character (a vertical tab, a NUL, a carriage return are parts of
/// words to bash).
fn splits_apart(c: char) -> bool {
    c != ' ' && c != '\t' && (c.is_whitespace() || c.is_control())
}

/// Arguments of `bash`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BashArgs {
    /// The command line, run with `bash -c` in the workspace root (or `workdir`).
    pub command: String,
    /// The folder to run it in, relative to the workspace root (default: the root); it
    /// must be a folder beneath the root. Use it instead of `cd DIR &&`.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Timeout in milliseconds (default 120000, at most 600000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout: Option<u64>,
    /// What the command does, in 5 to 10 words, for people watching.
    #[serde(default)]
    pub description: Option<String>,
    /// Start it and return at once with a task id; read its output with `task_output`,
    /// stop it with `task_kill`. `timeout` is then its lifetime (default 30 minutes).
    #[serde(default)]
    pub run_in_background: bool,
    /// With `run_in_background`: keep its standard input open, to send it input with
    /// `task_write_stdin` (a REPL, a program that asks questions). Otherwise it reads end
    /// of file at once.
    #[serde(default)]
    pub keep_stdin: bool,
    /// With `run_in_background`: run it on a terminal of its own (a pseudo-terminal,
    /// 120 × 40, `TERM=dumb`), for programs that act differently without one: a REPL
    /// that prints no prompt, `read -p` that shows no question, a program asking for a
    /// password on `/dev/tty`. Its input stays open as with `keep_stdin` and is echoed;
    /// stdout and stderr are one stream; `close` sends end of file (^D).
    #[serde(default)]
    pub tty: bool,
}

/// Arguments of `exec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The program and its arguments, run without a shell: `["cargo", "test", "-p", "x"]`.
    #[schemars(length(min = 1))]
    pub argv: Vec<String>,
    /// The folder to run it in, relative to the workspace root (default: the root); it
    /// must be a folder beneath the root.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Timeout in milliseconds (default 120000, at most 600000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout: Option<u64>,
    /// What the command does, in 5 to 10 words, for people watching.
    #[serde(default)]
    pub description: Option<String>,
    /// Start it and return at once with a task id, as for `bash`.
    #[serde(default)]
    pub run_in_background: bool,
    /// With `run_in_background`: keep its standard input open, as for `bash`.
    #[serde(default)]
    pub keep_stdin: bool,
    /// With `run_in_background`: run it on a terminal of its own, as for `bash`.
    #[serde(default)]
    pub tty: bool,
}

/// The description of `bash`; `sandbox` is the sentence about the sandbox, `ns` the
/// namespace the tools are listed in (other tools are named as a model calls them).
pub(crate) fn bash_description(sandbox: &str, ns: &str) -> String {
    format!(
        "Run a shell command with `bash -c` in the workspace root (or `workdir`, a folder \
beneath it), in its own session and process group with no terminal (a prompt on /dev/tty \
fails at once), stdin closed. {sandbox} The environment holds only PATH, HOME, LANG, configured variables and \
TOOLMUX_PROCESS_MARK; nothing persists between calls (no cd, no exports). `timeout` in ms \
(default 120000, max 600000): on timeout the whole process group gets SIGTERM, then SIGKILL \
2 s later (a trap may clean up); on cancellation it is killed at once, and so is a command \
that prints more than its output limit (1 GiB unless configured); \
background processes left when the command exits are killed too (those still holding its output \
after 0.5 s, so a process substitution's `tee` finishes), even those that left the group \
(setsid, daemons), unless they also cleared their environment (`env -i`), which carries the mark \
they are found by. Output: `exit code N` (or the signal / timeout), then `--- stdout \
---` and `--- stderr ---` sections, terminal escape sequences removed. Output over 30000 \
characters keeps its head and tail with a marker, and the full output is saved to a file whose \
path is given. With `run_in_background: true` (a server, a watcher, a long build) the call \
returns at once with a `task_id`: read what it printed with `{ns}__task_output`, stop it with \
`{ns}__task_kill`; `timeout` is then its lifetime (default 30 minutes). Add `keep_stdin: true` to a \
background task that reads input (a REPL, a program asking questions) and send it text with \
`{ns}__task_write_stdin`; `tty: true` instead runs it on a terminal of its own, for programs that \
need one (prompts, password questions)."
    )
}

/// The description of `exec`; `sandbox` is the sentence about the sandbox, `ns` the
/// namespace the tools are listed in.
pub(crate) fn exec_description(sandbox: &str, ns: &str) -> String {
    format!(
        "Run a program with an argument list (`argv`), without a shell (no parsing, globbing or \
substitution), in the workspace root (or `workdir` beneath it), in its own process group, stdin \
closed. {sandbox} \
Environment, `timeout`, killing, output and `run_in_background` are as for `{ns}__bash`."
    )
}

/// What to run.
#[derive(Debug)]
pub(crate) enum Program {
    /// A shell command line.
    Shell(String),
    /// An argument vector.
    Argv(Vec<String>),
}

impl Program {
    pub(crate) fn label(&self) -> String {
        match self {
            Program::Shell(command) => command.clone(),
            Program::Argv(argv) => argv.join(" "),
        }
    }
}

/// Checks `program` against the configured allow-list; a refusal names `exec` in namespace
/// `ns`, as the model calls it.
pub(crate) fn check_allowed(
    config: &BashConfig,
    program: &Program,
    ns: &str,
) -> Result<(), FsError> {
    if config.allow_prefixes.is_empty() {
        return Ok(());
    }
    let label = program.label();
    let tokens: Vec<&str> = match program {
        Program::Shell(command) => {
            if let Some(op) = command.chars().find(|c| SHELL_OPERATORS.contains(c)) {
                return Err(FsError::CommandDenied {
                    command: label,
                    reason: format!(
                        "it contains the shell operator `{}`, which is refused when an \
                         allow-list of command prefixes is configured; use `{ns}__exec` with an argv",
                        op.escape_debug()
                    ),
                });
            }
            if let Some(odd) = command.chars().find(|&c| splits_apart(c)) {
                return Err(FsError::CommandDenied {
                    command: label,
                    reason: format!(
                        "it contains the character U+{:04X}, {}, which is refused when an \
                         allow-list of command prefixes is configured: bash splits words only \
                         at spaces and tabs, so what looks like a prefix could be part of a \
                         program's name; use plain spaces, or `{ns}__exec` with an argv",
                        u32::from(odd),
                        if odd.is_whitespace() { "a space" } else { "a control character" },
                    ),
                });
            }
            // As bash splits words: at spaces and tabs only.
            command.split([' ', '\t']).filter(|w| !w.is_empty()).collect()
        }
        Program::Argv(argv) => argv.iter().map(String::as_str).collect(),
    };
    let allowed = config.allow_prefixes.iter().any(|prefix| {
        let want: Vec<&str> = prefix.split_whitespace().collect();
        !want.is_empty() && tokens.len() >= want.len() && tokens[..want.len()] == want[..]
    });
    if allowed {
        Ok(())
    } else {
        Err(FsError::CommandDenied {
            command: label,
            reason: format!(
                "it does not start with an allowed prefix ({}); change `bash.allowPrefixes` to \
                 allow it",
                config
                    .allow_prefixes
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }
}

/// The timeout a call asked for, checked against the configuration.
pub(crate) fn timeout(
    config: &BashConfig,
    tool: &'static str,
    asked: Option<u64>,
) -> Result<Duration, FsError> {
    bounded(tool, asked, config.default_timeout_ms, config.max_timeout_ms, "")
}

/// The lifetime a background call asked for, checked against the configuration.
pub(crate) fn background_timeout(
    config: &BashConfig,
    tool: &'static str,
    asked: Option<u64>,
) -> Result<Duration, FsError> {
    let (default, max) = (config.background_timeout_ms, config.max_background_timeout_ms);
    bounded(tool, asked, default, max, " for a background task (`bash.maxBackgroundTimeoutMs`)")
}

/// `asked` (else `default`) milliseconds, refused when 0 or over `max`; `which` says which
/// limit in the message.
fn bounded(
    tool: &'static str,
    asked: Option<u64>,
    default: u64,
    max: u64,
    which: &str,
) -> Result<Duration, FsError> {
    let ms = asked.unwrap_or(default);
    if ms == 0 || ms > max {
        return Err(FsError::InvalidArguments {
            tool,
            message: format!("timeout {ms} ms is out of range{which}: give 1 to {max} ms"),
        });
    }
    Ok(Duration::from_millis(ms))
}

/// The note a result gets when processes that left the command's group were killed.
pub(crate) fn escaped_note(killed: &[u32]) -> Option<String> {
    (!killed.is_empty()).then(|| {
        format!(
            "[{} process(es) the command started outside its process group (setsid, a daemon) \
             were killed: use run_in_background for processes that must keep running]",
            killed.len()
        )
    })
}

/// How the command ended.
enum End {
    /// Its status once reaped (`None` only if the reaping took longer than
    /// `DRAIN_TIMEOUT`, which an exited process never does).
    Exited(Option<ExitStatus>),
    TimedOut,
    /// It printed more than `maxOutputBytes`.
    Flooded,
    Cancelled,
}

/// What a command printed so far, both streams together, and the signal that it printed
/// more than it may.
#[derive(Debug, Clone)]
struct Printed {
    bytes: Arc<AtomicU64>,
    max: u64,
    over: CancellationToken,
}

impl Printed {
    fn add(&self, n: usize) {
        let total = self.bytes.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        if total > self.max {
            self.over.cancel();
        }
    }
}

/// Tells when every reader of a command's pipes has ended (its pipe closed or its reading
/// stopped) without taking their results: each reader holds a token ([`Self::hold`]) and
/// drops it when it ends, and the waiting ends when every token is gone.
#[derive(Debug)]
pub(crate) struct PipeReaders {
    held: tokio::sync::mpsc::Sender<()>,
    ended: tokio::sync::mpsc::Receiver<()>,
}

impl PipeReaders {
    pub(crate) fn new() -> Self {
        let (held, ended) = tokio::sync::mpsc::channel(1);
        PipeReaders { held, ended }
    }

    /// The token of one reader, to keep until it ends.
    pub(crate) fn hold(&self) -> tokio::sync::mpsc::Sender<()> {
        self.held.clone()
    }

    /// Waits up to `limit` for every reader to end.
    pub(crate) async fn ended_within(self, limit: Duration) {
        let PipeReaders { held, mut ended } = self;
        drop(held);
        // Nothing is ever sent: `recv` answers `None` once every token is dropped.
        let _ = tokio::time::timeout(limit, ended.recv()).await;
    }
}

/// The command that runs `program` in `root`: its own session and process group, with no
/// controlling terminal (`pty::detach`) unless it runs on `pty`, stdin closed,
/// stdout and stderr piped, only the passed-through environment and `mark`, confined by
/// `sandbox`, killed when dropped.
pub(crate) fn command(
    config: &BashConfig,
    sandbox: &Sandbox,
    root: &Path,
    tool: &'static str,
    program: &Program,
    pty: Option<&super::pty::Pty>,
    mark: &ProcessMark,
) -> Result<tokio::process::Command, FsError> {
    let mut command = match program {
        Program::Shell(line) => {
            let mut c = tokio::process::Command::new(&config.shell);
            c.arg("-c").arg(line);
            c
        }
        Program::Argv(argv) => {
            let Some((first, rest)) = argv.split_first() else {
                return Err(FsError::InvalidArguments { tool, message: "`argv` is empty".into() });
            };
            let mut c = tokio::process::Command::new(first);
            c.args(rest);
            c
        }
    };
    command.current_dir(root).env_clear().kill_on_drop(true);
    match pty {
        Some(pty) => {
            pty.attach(&mut command)
                .map_err(|source| FsError::Spawn { command: program.label(), source })?;
            // Programs on a terminal that says it can do nothing print plain text: no
            // colors, no cursor movements, no pager.
            command.env("TERM", "dumb");
        }
        None => {
            command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            super::pty::detach(&mut command);
        }
    }
    for name in ["PATH", "HOME", "LANG"]
        .into_iter()
        .chain(config.env_passthrough.iter().map(String::as_str))
    {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    let (name, value) = mark.env();
    command.env(name, value);
    sandbox.confine(&mut command, &program.label(), pty.is_some())?;
    Ok(command)
}

/// Runs `program` in `root`.
pub(crate) async fn run(
    config: &BashConfig,
    sandbox: &Sandbox,
    root: &Path,
    tool: &'static str,
    program: Program,
    limit: Duration,
    cancel: &CancellationToken,
) -> Result<ToolOutput, FsError> {
    let label = program.label();
    let mark = ProcessMark::new();
    let mut command = command(config, sandbox, root, tool, &program, None, &mark)?;
    let absent = sandbox.absent().await;
    let started = Instant::now();
    let mut child =
        command.spawn().map_err(|source| sandbox.spawn_failed(label.clone(), source))?;
    // Released once the group is dealt with, before the leader is reaped; on an early
    // return or a dropped future, after `group` (which kills the group) and before
    // `child` (the leader, reaped later).
    let watched = guard::GroupGuard::watch(child.id(), &label);
    let mut group = MarkedGroup::new(child.id(), mark, label.clone());
    let leader = guard::LeaderExit::of(&child);
    let keep = config.output_cap_chars.saturating_mul(4).max(64);
    let spill = SpillTarget::new(config);
    let printed = Printed {
        bytes: Arc::default(),
        max: config.max_output_bytes,
        over: CancellationToken::new(),
    };
    // Cancelled when the pipes have been waited for long enough: each capture then stops
    // reading and hands back what it has.
    let stop = CancellationToken::new();
    let readers = PipeReaders::new();
    let (spill_out, printed_out, stop_out) = (spill.clone(), printed.clone(), stop.clone());
    let held = readers.hold();
    let stdout = child.stdout.take().map(|s| {
        tokio::spawn(async move {
            let _held = held;
            capture(s, keep, spill_out, "stdout", printed_out, stop_out).await
        })
    });
    let (printed_err, stop_err) = (printed.clone(), stop.clone());
    let held = readers.hold();
    let stderr = child.stderr.take().map(|s| {
        tokio::spawn(async move {
            let _held = held;
            capture(s, keep, spill, "stderr", printed_err, stop_err).await
        })
    });
    let end = tokio::select! {
        exited = leader.exited(&mut child) => match exited {
            Ok(()) => End::Exited(None),
            Err(source) => return Err(FsError::Spawn { command: label, source }),
        },
        () = tokio::time::sleep(limit) => End::TimedOut,
        () = printed.over.cancelled() => End::Flooded,
        () = cancel.cancelled() => End::Cancelled,
    };
    // A command that ran out of time is asked to stop first, and given a moment to clean
    // up (a killed `git` leaves `.git/index.lock` behind); one the caller cancelled is not
    // waited for.
    if matches!(end, End::TimedOut) {
        group.terminate_group();
        let _ = tokio::time::timeout(TERM_GRACE, leader.exited(&mut child)).await;
    }
    if matches!(end, End::Exited(_)) {
        readers.ended_within(EXIT_GRACE).await;
    }
    // Kill the whole group in every case: after a timeout or cancellation, and after a
    // normal exit too, for background processes the command left behind, in its group or
    // out of it.
    let escaped = group.kill_all().await;
    // The group is dead and its leader not reaped, so its id is still ours: release it
    // now, then reap (SIGKILL makes this quick).
    drop(watched);
    let reaped = tokio::time::timeout(DRAIN_TIMEOUT, child.wait()).await;
    group.disarm();
    let end = match (end, reaped) {
        (End::Exited(_), Ok(Ok(status))) => End::Exited(Some(status)),
        (End::Exited(_), Ok(Err(source))) => return Err(FsError::Spawn { command: label, source }),
        (end, _) => end,
    };
    let elapsed = started.elapsed();
    // One wait for both pipes: a process holding them holds both.
    let drained = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    let (out, out_held) = finish(stdout, drained, &stop).await;
    let (err, err_held) = finish(stderr, drained, &stop).await;
    if matches!(end, End::Cancelled) {
        // The group is dead: what it made of the watched paths is moved aside all the
        // same (a cancelled command may have planted `.git` first), and only logged, as
        // the caller gets no result.
        if let Some(note) = sandbox.command_ended(absent).await {
            tracing::warn!(tool, "{note}");
        }
        return Err(FsError::Cancelled { tool });
    }
    let mut text = String::new();
    let mut output = ToolOutput::default();
    let failed = match &end {
        End::Exited(status) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.and_then(|s| s.code()), status.and_then(|s| s.signal())) {
                (Some(code), _) => {
                    let _ = write!(text, "exit code {code}");
                    output = output.with_extra("exitCode", json!(code));
                    code != 0
                }
                (None, signal) => {
                    let _ = write!(text, "killed by signal {}", signal.unwrap_or(0));
                    output = output.with_extra("signal", json!(signal));
                    true
                }
            }
        }
        End::TimedOut => {
            let _ = write!(
                text,
                "timed out after {} ms: the process group was killed",
                limit.as_millis()
            );
            output = output.with_extra("timedOut", json!(true));
            true
        }
        End::Flooded => {
            let _ = write!(
                text,
                "printed more than {} bytes (`maxOutputBytes`): the process group was killed",
                config.max_output_bytes
            );
            output = output.with_extra("outputLimitExceeded", json!(true));
            true
        }
        End::Cancelled => true,
    };
    if out_held || err_held {
        let _ = write!(
            text,
            "\n[a process outside the group kept the output open: what it printed more than {} \
             s after the command ended is not shown]",
            DRAIN_TIMEOUT.as_secs()
        );
    }
    if let Some(note) = escaped_note(&escaped) {
        text.push('\n');
        text.push_str(&note);
        output = output.with_extra("escapedKilled", json!(escaped.len()));
    }
    // What the background tasks still running made so far goes too, noted for their reads.
    if let Some(note) = sandbox.command_ended(absent).await {
        text.push('\n');
        text.push_str(&note);
    }
    let (out_budget, err_budget) =
        allocate(out.chars_hint(), err.chars_hint(), config.output_cap_chars);
    let stdout_text = out.render(out_budget);
    let stderr_text = err.render(err_budget);
    if stdout_text.text.is_empty() && stderr_text.text.is_empty() {
        text.push_str("\n[no output]");
    }
    for (name, rendered) in [("stdout", &stdout_text), ("stderr", &stderr_text)] {
        if !rendered.text.is_empty() {
            let _ = write!(text, "\n--- {name} ---\n{}", rendered.text.trim_end_matches('\n'));
        }
        if let Some(path) = &rendered.spill {
            output = output.with_extra(format!("{name}File"), json!(path.to_string_lossy()));
        }
        output = output
            .with_extra(format!("{name}Bytes"), json!(rendered.bytes))
            .with_extra(format!("{name}Truncated"), json!(rendered.truncated));
    }
    output.content = ToolOutput::text(text).content;
    output.is_error = failed;
    Ok(output.with_extra("durationMs", json!(elapsed.as_millis() as u64)))
}

/// Waits for a capture task until `deadline`, then makes it stop (with `stop`) and takes
/// what it captured; `true` when it was cut so. What was read is kept either way (it was
/// lost, all of it, when a process outside the command's reach held the pipe open).
async fn finish(
    task: Option<tokio::task::JoinHandle<Captured>>,
    deadline: tokio::time::Instant,
    stop: &CancellationToken,
) -> (Captured, bool) {
    let Some(mut task) = task else { return (Captured::default(), false) };
    match tokio::time::timeout_at(deadline, &mut task).await {
        Ok(captured) => (captured.unwrap_or_default(), false),
        Err(_) => {
            stop.cancel();
            (task.await.unwrap_or_default(), true)
        }
    }
}

/// Splits the character budget between two streams: the smaller keeps what it has up to
/// half, the larger gets the rest.
fn allocate(a: usize, b: usize, cap: usize) -> (usize, usize) {
    if a.saturating_add(b) <= cap {
        return (a, b);
    }
    if a <= b {
        let a_share = a.min(cap / 2);
        (a_share, cap - a_share)
    } else {
        let b_share = b.min(cap / 2);
        (cap - b_share, b_share)
    }
}

/// Where full outputs go: the configured directory, else this user's private one (see
/// [`spill`]).
#[derive(Debug, Clone)]
struct SpillTarget {
    dir: Option<PathBuf>,
    max_bytes: u64,
}

impl SpillTarget {
    fn new(config: &BashConfig) -> Self {
        SpillTarget { dir: config.spill_dir.clone(), max_bytes: config.spill_max_bytes }
    }

    fn create(&self, stream: &str) -> Result<(PathBuf, std::fs::File), String> {
        let kind = if stream == "stderr" { spill::Kind::Stderr } else { spill::Kind::Stdout };
        spill::create(self.dir.as_deref(), kind)
    }
}

/// One stream, captured with bounded memory.
#[derive(Debug, Default)]
struct Captured {
    /// Everything, while it fits in `head + tail`; then the first `keep` bytes.
    head: Vec<u8>,
    /// The last `keep` bytes, once the stream overflowed.
    tail: VecDeque<u8>,
    overflowed: bool,
    total: u64,
    spill: Option<PathBuf>,
    /// Why the spill file could not be made, once that failed (it is not tried again).
    spill_error: Option<String>,
    spill_file: Option<std::fs::File>,
    spill_written: u64,
    spill_target: Option<SpillTarget>,
    stream: &'static str,
}

/// Reads a pipe to the end, or until `stop`, into a [`Captured`].
async fn capture(
    mut pipe: impl AsyncRead + Unpin,
    keep: usize,
    spill: SpillTarget,
    stream: &'static str,
    printed: Printed,
    stop: CancellationToken,
) -> Captured {
    let mut captured = Captured { spill_target: Some(spill), stream, ..Captured::default() };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            read = pipe.read(&mut buf) => read,
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        printed.add(n);
        captured.push(&buf[..n], keep);
    }
    captured
}

impl Captured {
    fn push(&mut self, bytes: &[u8], keep: usize) {
        self.total += bytes.len() as u64;
        if !self.overflowed {
            self.head.extend_from_slice(bytes);
            if self.head.len() <= 2 * keep {
                return;
            }
            // Overflow: everything so far goes to the spill file; memory keeps head and tail.
            self.overflowed = true;
            let all = std::mem::take(&mut self.head);
            self.spill_write(&all);
            self.head = all[..keep].to_vec();
            self.tail = all[all.len() - keep..].iter().copied().collect();
            return;
        }
        self.spill_write(bytes);
        self.tail.extend(bytes.iter().copied());
        let excess = self.tail.len().saturating_sub(keep);
        self.tail.drain(..excess);
    }

    fn spill_write(&mut self, bytes: &[u8]) {
        if self.spill_file.is_none()
            && self.spill.is_none()
            && self.spill_error.is_none()
            && let Some(target) = &self.spill_target
        {
            match target.create(self.stream) {
                Ok((path, file)) => {
                    self.spill = Some(path);
                    self.spill_file = Some(file);
                }
                Err(why) => self.spill_error = Some(why),
            }
        }
        let max = self.spill_target.as_ref().map_or(0, |t| t.max_bytes);
        if let Some(file) = &mut self.spill_file {
            let room = max.saturating_sub(self.spill_written) as usize;
            let part = &bytes[..bytes.len().min(room)];
            if file.write_all(part).is_err() || part.len() < bytes.len() {
                self.spill_file = None;
            }
            self.spill_written += part.len() as u64;
        }
    }

    /// Characters as shown, or a large number once overflowed.
    fn chars_hint(&self) -> usize {
        if self.overflowed {
            usize::MAX / 4
        } else {
            // An escape is four characters for one: the budget counts what is shown.
            control::to_text(&self.head).chars().count()
        }
    }

    /// The text shown within `budget` characters.
    fn render(mut self, budget: usize) -> Rendered {
        let bytes = self.total;
        if control::is_binary(&self.head) {
            return self.render_binary();
        }
        if !self.overflowed {
            let text = control::to_text(&self.head);
            let chars = text.chars().count();
            if chars <= budget {
                return Rendered { text, spill: None, truncated: false, bytes };
            }
            let head = std::mem::take(&mut self.head);
            self.spill_write(&head);
            let half = budget / 2;
            let first: String = text.chars().take(half).collect();
            let last: String = text.chars().skip(chars - (budget - half)).collect();
            let omitted = chars - budget;
            let text = self.marked(first, last, &format!("{omitted} characters"));
            return Rendered { text, spill: self.spill.clone(), truncated: true, bytes };
        }
        let half = budget / 2;
        let head = control::to_text(&self.head);
        let first: String = head.chars().take(half).collect();
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let tail = control::to_text(&tail);
        let tail_chars = tail.chars().count();
        let last: String = tail.chars().skip(tail_chars.saturating_sub(budget - half)).collect();
        let omitted = bytes.saturating_sub((first.len() + last.len()) as u64);
        let text = self.marked(first, last, &format!("about {omitted} bytes"));
        Rendered { text, spill: self.spill.clone(), truncated: true, bytes }
    }

    /// One line in place of binary output, naming the spill file that holds it.
    fn render_binary(mut self) -> Rendered {
        if !self.overflowed {
            let head = std::mem::take(&mut self.head);
            self.spill_write(&head);
        }
        let saved = match (&self.spill, &self.spill_error) {
            (Some(path), _) if self.spill_written < self.total => control::binary_saved(
                &format!("its first {} bytes saved to", self.spill_written),
                path,
            ),
            (Some(path), _) => control::binary_saved("saved to", path),
            (None, Some(why)) => format!("; it could not be saved: {why}"),
            (None, None) => "; it could not be saved".into(),
        };
        let text = control::binary_notice(self.total, &saved);
        Rendered { text, spill: self.spill.clone(), truncated: true, bytes: self.total }
    }

    fn marked(&self, first: String, last: String, omitted: &str) -> String {
        let saved = match (&self.spill, &self.spill_error) {
            (Some(path), _) if self.spill_written < self.total => format!(
                "its first {} bytes saved to {} (the file's cap, `spillMaxBytes`)",
                self.spill_written,
                path.display()
            ),
            // Outside the workspace, so the file tools do not read it: a command does.
            (Some(path), _) => format!(
                "full output saved to {} (read parts with `grep -n`, `sed -n '100,200p'`)",
                path.display()
            ),
            (None, Some(why)) => format!("the full output could not be saved: {why}"),
            (None, None) => "the full output could not be saved".into(),
        };
        format!("{first}\n[... {omitted} omitted; {saved} ...]\n{last}")
    }
}

/// Removes terminal escape sequences (colours, cursor moves, titles) from the text the
/// model sees; the spill file keeps the raw bytes.
///
/// Only well-formed sequences go. An ESC that starts none (followed by a control
/// character, or an OSC that a control character or the end of the text interrupts) is
/// left, for [`super::control::escape_controls`] to show as `\x1b` with what follows it:
/// taking it for the start of a sequence hid the NUL after it, and an unterminated title
/// (`ESC ]`) hid all the rest of the output.
pub(crate) fn strip_ansi(text: &str) -> Cow<'_, str> {
    if !text.contains('\x1b') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\x1b') {
        out.push_str(&rest[..at]);
        let from_escape = &rest[at..];
        match escape_len(from_escape.as_bytes()) {
            Some(len) => rest = &from_escape[len..],
            None => {
                out.push('\x1b');
                rest = &from_escape[1..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The length of the escape sequence at the start of `bytes` (which starts with ESC), or
/// `None` when none is there (ECMA-48's forms, as terminals read them).
///
/// Every length ends after an ASCII byte, so it is a character boundary of the text.
fn escape_len(bytes: &[u8]) -> Option<usize> {
    match *bytes.get(1)? {
        // CSI: parameter and intermediate bytes, then a final byte in `@`..=`~`. One cut
        // by the end of the text (the head of a long output) holds only such bytes.
        b'[' => {
            for (i, &b) in bytes.iter().enumerate().skip(2) {
                match b {
                    0x20..=0x3f => {}
                    0x40..=0x7e => return Some(i + 1),
                    _ => return None,
                }
            }
            Some(bytes.len())
        }
        // OSC: printable text up to BEL or ESC `\`; anything else interrupts it.
        b']' => {
            for (i, &b) in bytes.iter().enumerate().skip(2) {
                match b {
                    0x07 => return Some(i + 1),
                    0x1b => return (bytes.get(i + 1) == Some(&b'\\')).then_some(i + 2),
                    b if b < 0x20 || b == 0x7f => return None,
                    _ => {}
                }
            }
            None
        }
        // nF: intermediate bytes, then a final byte (`ESC ( B` selects a character set).
        0x20..=0x2f => {
            for (i, &b) in bytes.iter().enumerate().skip(2) {
                match b {
                    0x20..=0x2f => {}
                    0x30..=0x7e => return Some(i + 1),
                    _ => return None,
                }
            }
            None
        }
        // A two-character escape (`ESC 7`, `ESC M`, `ESC =`).
        0x30..=0x7e => Some(2),
        _ => None,
    }
}

/// One stream as shown.
#[derive(Debug)]
struct Rendered {
    text: String,
    spill: Option<PathBuf>,
    truncated: bool,
    bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_sequences_are_stripped() {
        assert_eq!(strip_ansi("\x1b[1;31merror\x1b[0m: x"), "error: x");
        assert_eq!(strip_ansi("\x1b]0;title\x07text"), "text");
        assert_eq!(strip_ansi("\x1b]8;;http://x\x1b\\link"), "link");
        assert_eq!(strip_ansi("plain"), "plain");
        assert_eq!(strip_ansi("\x1b(B\x1b[mreset"), "reset");
        assert_eq!(strip_ansi("\x1b7saved\x1b8"), "saved");
        // Cut by the end of the text: a CSI's parameters go, anything else stays.
        assert_eq!(strip_ansi("head\x1b[3"), "head");
        assert_eq!(strip_ansi("end\x1b"), "end\x1b");
        assert_eq!(strip_ansi("\x1b]0;title"), "\x1b]0;title");
        // What is no sequence stays, for the escaping to show.
        assert_eq!(strip_ansi("\x1b\0x"), "\x1b\0x");
        assert_eq!(strip_ansi("\x1b[3\0mx"), "\x1b[3\0mx");
        assert_eq!(strip_ansi("\x1b]0;t\0rest\nmore"), "\x1b]0;t\0rest\nmore");
        assert_eq!(strip_ansi("\x1b]0;t\x1bx"), "\x1b]0;t");
    }

    #[test]
    fn budget_allocation() {
        assert_eq!(allocate(10, 20, 100), (10, 20));
        assert_eq!(allocate(10, 200, 100), (10, 90));
        assert_eq!(allocate(200, 300, 100), (50, 50));
        assert_eq!(allocate(300, 20, 100), (80, 20));
    }

    fn config(prefixes: &[&str]) -> BashConfig {
        BashConfig {
            allow_prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
            ..BashConfig::default()
        }
    }

    #[test]
    fn allow_list_matches_words() {
        let c = config(&["cargo test", "ls"]);
        assert!(check_allowed(&c, &Program::Shell("cargo test -p x".into()), "fs").is_ok());
        assert!(check_allowed(&c, &Program::Shell("ls".into()), "fs").is_ok());
        assert!(check_allowed(&c, &Program::Shell("cargo testing".into()), "fs").is_err());
        assert!(check_allowed(&c, &Program::Shell("ls && rm -rf x".into()), "fs").is_err());
        assert!(check_allowed(&c, &Program::Shell("ls $(rm x)".into()), "fs").is_err());
        assert!(check_allowed(&c, &Program::Argv(vec!["ls".into(), ";rm".into()]), "fs").is_ok());
        assert!(check_allowed(&c, &Program::Argv(vec!["rm".into()]), "fs").is_err());
        assert!(
            check_allowed(&config(&[]), &Program::Shell("anything | at all".into()), "fs").is_ok()
        );
        assert!(check_allowed(&c, &Program::Shell("ls\t-la".into()), "fs").is_ok());
        for odd in [
            "ls\u{a0}x",
            "ls\u{2003}x",
            "ls\u{b}x",
            "ls\u{c}x",
            "ls\u{2028}x",
            "ls\0x",
            "ls\u{85}x",
        ] {
            assert!(check_allowed(&c, &Program::Shell(odd.into()), "fs").is_err(), "{odd:?}");
        }
    }
}
