//! The stdio transport: the server runs as a child process in a session of its own (so
//! in its own process group, with no controlling terminal: a prompt on `/dev/tty` fails at
//! once, see `detach`), speaks newline-delimited JSON-RPC on stdin/stdout, and its stderr
//! goes to the logs.
//!
//! The whole group is killed and the child reaped on shutdown, on drop, when the
//! connection fails and when the server's stdout ends while it keeps running (stopped
//! after a short grace), so servers started through wrappers (`npx`, shells) leave nothing
//! behind. A line on stdout that is not a message is logged and skipped, as the official
//! SDKs' clients do; a hundred in a row end the connection with a protocol error naming
//! the last, so a server that stopped speaking MCP does not leave its calls waiting.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use toolmux_core::group_guard::GroupGuard;

use super::lane::Lane;
use super::{Fault, FaultKind, encode_message, parse_message};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::future::Future;
use std::sync::Arc;

/// How long a closed stdout waits for the exit status, so the error can carry it.
const EXIT_STATUS_GRACE: Duration = Duration::from_millis(200);
/// How long a server whose stdout ended may take to exit on its own (a server's output
/// usually ends with its exit) before the group is asked to stop (SIGTERM), then killed
/// after [`TERM_GRACE`]: one that keeps running without its output can answer nothing, and
/// lived until the next call noticed.
const OUTPUT_END_GRACE: Duration = Duration::from_millis(200);
/// The connection's end when the server closed its stdout; an exit status, when the server
/// exited (as most do), says more and replaces it.
const OUTPUT_CLOSED: &str =
    "the server closed its stdout; it is being stopped, and the next call starts it again";
/// How long a graceful shutdown waits after closing stdin before asking the group to stop.
const GRACEFUL_EXIT: Duration = Duration::from_millis(500);
/// How long it then waits after SIGTERM before killing the group.
const TERM_GRACE: Duration = Duration::from_secs(1);
/// How long reaping may take after SIGKILL before it is left to the background task.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);
/// Non-JSON lines logged before the first message (startup banners), at most.
const NOISE_LINES_LOGGED: usize = 8;
/// Lines that are not messages, after the first message, logged each; after them one in
/// [`BAD_LINES_LOG_EVERY`] is, so that a chatty server does not flood the log.
const BAD_LINES_LOGGED: usize = 10;
/// See [`BAD_LINES_LOGGED`].
const BAD_LINES_LOG_EVERY: usize = 1_000;
/// Lines in a row that are not messages that end the connection: the server no longer
/// speaks MCP on its stdout.
const BAD_LINES_IN_A_ROW: usize = 100;
/// Stdout reads, at most.
const READ_BUFFER: usize = 64 * 1024;
/// Capacity the stdout line buffer keeps between messages.
const LINE_BUFFER_KEEP: usize = 1 << 20;
/// Longest stderr line logged, in bytes; the rest is cut.
const STDERR_LINE_MAX: usize = 4096;

/// How long the exit of a server waits for the rest of its stderr, whose last lines the
/// error then carries.
const STDERR_DRAIN: Duration = Duration::from_millis(200);
/// How long stdout may stay open once the server exited before its connection is ended
/// anyway: something it started and left running (out of its process group, and without
/// the mark a sweep finds, as a daemon that cleared its environment is) holds the pipe,
/// and nothing more of the server will come. Until then its last lines are still read.
const STDOUT_DRAIN: Duration = Duration::from_millis(200);
/// Longest message a server may write: a line without its end past this is a protocol
/// fault (a server printing without end must not take the gateway's memory with it).
pub(crate) const MESSAGE_MAX: usize = 128 << 20;

/// How a capped line read ended.
#[derive(Debug, PartialEq, Eq)]
enum LineRead {
    /// The stream ended with nothing read.
    End,
    /// A line (its newline included, or the stream's last bytes) is in the buffer.
    Line,
    /// The line passed the cap before its end; what was read of it is dropped, and the
    /// rest is left unread.
    TooLong,
}

/// Reads one line into `line` (appended), as `BufRead::read_until` does, but never more
/// than `max` bytes of it: past them reading stops.
fn read_line_capped(
    reader: &mut impl std::io::BufRead,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead> {
    loop {
        let buffer = match reader.fill_buf() {
            Ok(buffer) => buffer,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buffer.is_empty() {
            return Ok(if line.is_empty() { LineRead::End } else { LineRead::Line });
        }
        let (used, ended) = match buffer.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buffer.len(), false),
        };
        if used > max.saturating_sub(line.len()) {
            line.clear();
            return Ok(LineRead::TooLong);
        }
        line.extend_from_slice(&buffer[..used]);
        reader.consume(used);
        if ended {
            return Ok(LineRead::Line);
        }
    }
}

/// What to run.
#[derive(Debug)]
pub(crate) struct StdioCommand<'a> {
    pub(crate) server: &'a str,
    pub(crate) program: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a BTreeMap<String, String>,
    /// Which of this process's environment the server inherits.
    pub(crate) inherit: crate::EnvInherit,
    /// Variables inherited whatever `inherit` says.
    pub(crate) passthrough: &'a [String],
    pub(crate) cwd: PathBuf,
    /// The longest wait for a message of rmcp's session to be written to the server's
    /// stdin (the server's request timeout); the lane's calls are bounded by their own
    /// waits.
    pub(crate) write_timeout: Duration,
}

/// A running server process: its process group, and the task that reaps it.
#[derive(Debug)]
pub(crate) struct ChildGroup {
    server: String,
    /// The process group id, equal to the child's pid (the child leads its own session,
    /// and so its own group).
    pgid: Option<Pid>,
    kill: CancellationToken,
    exited: watch::Receiver<Option<ExitStatus>>,
    /// The direct lane for calls, beside rmcp's session on the same pipes.
    lane: Arc<Lane>,
}

impl ChildGroup {
    /// The direct lane for calls on this server's pipes.
    pub(crate) fn lane(&self) -> Arc<Lane> {
        self.lane.clone()
    }

    /// The child's pid, which is also its process group id.
    pub(crate) fn pid(&self) -> Option<i32> {
        self.pgid.map(Pid::as_raw_nonzero).map(i32::from)
    }

    /// Closes nothing itself: the caller drops the transport (closing stdin) first, then
    /// this waits briefly for a voluntary exit, sends the group SIGTERM and waits a moment
    /// more (MCP's stdio shutdown: a server may still be saving or flushing), then kills
    /// the whole group and reaps the child.
    pub(crate) async fn shutdown(&mut self) {
        let mut exited = self.exited.clone();
        let gone =
            tokio::time::timeout(GRACEFUL_EXIT, exited.wait_for(Option::is_some)).await.is_ok();
        if !gone
            && let Some(pgid) = self.pgid
            && kill_process_group(pgid, Signal::TERM).is_ok()
        {
            let _ = tokio::time::timeout(TERM_GRACE, exited.wait_for(Option::is_some)).await;
        }
        self.kill_now().await;
    }

    /// Kills the whole group with SIGKILL and waits for the child to be reaped.
    pub(crate) async fn kill_now(&mut self) {
        self.signal_group();
        self.kill.cancel();
        let mut exited = self.exited.clone();
        if tokio::time::timeout(REAP_TIMEOUT, exited.wait_for(Option::is_some)).await.is_err() {
            tracing::warn!(server = %self.server, "mcp server process not reaped within 5s");
        }
    }

    /// Whether the child has been reaped and what it left running killed.
    pub(crate) fn is_reaped(&self) -> bool {
        self.exited.borrow().is_some()
    }

    fn signal_group(&self) {
        // Once the reaper has told the exit, the group was killed and the leader reaped:
        // its id may now be another group's.
        if self.exited.borrow().is_some() {
            return;
        }
        if let Some(pgid) = self.pgid {
            // ESRCH (the group is already gone) is the expected outcome of a clean exit.
            let _ = kill_process_group(pgid, Signal::KILL);
        }
    }
}

impl Drop for ChildGroup {
    fn drop(&mut self) {
        // Synchronous: SIGKILL the group now; the reaper task collects the child.
        self.signal_group();
        self.kill.cancel();
    }
}

/// Why the server's program could not be started, in words the configuration's author can
/// act on: the OS says only "No such file or directory", which is also what a missing
/// working directory or a script's missing interpreter gives.
fn spawn_error(command: &StdioCommand<'_>, error: std::io::Error) -> std::io::Error {
    let program = command.program;
    let message = match error.kind() {
        std::io::ErrorKind::NotFound if !command.cwd.is_dir() => format!(
            "cannot start `{program}`: its working directory {} does not exist (check `cwd`)",
            command.cwd.display()
        ),
        std::io::ErrorKind::NotFound if program.contains('/') => {
            // A relative program is found from the server's working directory.
            if command.cwd.join(program).exists() {
                format!("cannot start `{program}`: the interpreter on its `#!` line was not found")
            } else {
                format!("cannot start `{program}`: no such file (check `command`)")
            }
        }
        std::io::ErrorKind::NotFound => format!(
            "cannot start `{program}`: no such program in PATH (install it, or give its full \
             path in `command`)"
        ),
        std::io::ErrorKind::PermissionDenied => {
            format!("cannot start `{program}`: permission denied (is it an executable file?)")
        }
        _ => format!("cannot start `{program}`: {error}"),
    };
    std::io::Error::new(error.kind(), message)
}

/// Spawns the server; returns its transport and its process group.
pub(crate) fn spawn(
    command: &StdioCommand<'_>,
    fault: &Fault,
) -> std::io::Result<(StdioTransport, ChildGroup)> {
    fault.hide(command.env.values());
    let mut cmd = Command::new(command.program);
    if command.inherit != crate::EnvInherit::All {
        cmd.env_clear();
        let mut withheld = 0usize;
        for (name, value) in std::env::vars_os() {
            let Some(text) = name.to_str() else { continue };
            if command.inherit.passes(text) || command.passthrough.iter().any(|p| p == text) {
                cmd.env(&name, value);
            } else {
                withheld += 1;
            }
        }
        tracing::debug!(
            server = %command.server,
            withheld,
            "environment variables not passed on (`envInherit`, `envPassthrough`)"
        );
    }
    // Last, over `env`: what the server leaves running outside its group is found by it.
    let mark = toolmux_core::ProcessMark::new();
    let (mark_name, mark_value) = mark.env();
    cmd.args(command.args)
        .envs(command.env)
        .env(mark_name, mark_value)
        .current_dir(&command.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    detach(&mut cmd);
    let mut child = cmd.spawn().map_err(|e| spawn_error(command, e))?;
    let pgid = child.id().and_then(|id| i32::try_from(id).ok()).and_then(Pid::from_raw);
    // Listed with the process's one watchman (the shell tools' too) right away: the server
    // leads its own group from its first instruction (`setsid` ran before `exec`), so a
    // toolmux killed with SIGKILL while the server is busy in a call, when no code of ours
    // runs, leaves no server running, reparented to PID 1, until it next reads its stdin.
    // `reap` releases it only after its status is read and the group killed (see there).
    let watched = GroupGuard::watch(child.id(), &format!("mcp server {}", command.server));
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("child pipes missing"));
    };
    // Read in blocking mode, off the event loop (see `StdoutReader`). Its inode is the
    // pipe's, which whatever holds the other end shows in `/proc/PID/fd`.
    let stdout = std::fs::File::from(stdout.into_owned_fd()?);
    let pipe = std::os::unix::fs::MetadataExt::ino(&stdout.metadata()?);
    let server = command.server.to_owned();
    tracing::debug!(server = %server, program = %command.program, pid = ?pgid.map(Pid::as_raw_nonzero), "mcp server started");

    let (exited_tx, exited_rx) = watch::channel(None);
    let kill = CancellationToken::new();

    let lane = Arc::new(Lane::new(stdin, fault.clone()));
    let (received, messages) = mpsc::unbounded_channel();
    let stdout_ended = CancellationToken::new();
    let reaping = Reaping {
        server: server.clone(),
        child,
        pgid,
        watched,
        mark,
        kill: kill.clone(),
        stdout: StdoutEnd {
            ended: stdout_ended.clone(),
            lane: lane.clone(),
            received: received.downgrade(),
            pipe,
        },
    };
    let reader = StdoutReader {
        server: server.clone(),
        spoken: false,
        noise: 0,
        bad: 0,
        bad_in_a_row: 0,
        fault: fault.clone(),
        lane: lane.clone(),
        received,
    };
    let (stderr_ended, stderr_read) = tokio::sync::oneshot::channel();
    tokio::spawn(reap(reaping, exited_tx, fault.clone(), stderr_read));
    tokio::spawn(log_stderr(server.clone(), stderr, fault.clone(), stderr_ended));
    let transport = StdioTransport {
        messages,
        ended: false,
        exited: exited_rx.clone(),
        lane: lane.clone(),
        write_timeout: command.write_timeout,
    };
    // Made first: should the reader fail to start (no thread to be had), its drop kills
    // the group and the reaper reaps it; nothing else would, and the server, its stdin
    // held open by the reaper's lane, would run for ever.
    let group = ChildGroup { server, pgid, kill, exited: exited_rx, lane };
    reader.start(stdout, stdout_ended)?;
    Ok((transport, group))
}

/// Makes `cmd` the leader of a session of its own with no controlling terminal, and so of a
/// process group of its own whose id is its pid (which every `kill_process_group` here
/// signals).
///
/// A group of its own alone left the server in toolmux's session: under a toolmux started
/// from a terminal (the CLI, an agent's TUI), a server or its wrapper reading `/dev/tty`
/// (`npx`'s "Ok to proceed?", a credential prompt) was stopped by `SIGTTIN` until the
/// startup timeout, its group not being the terminal's foreground one, and what it wrote
/// there landed on the user's screen. Without a terminal, opening `/dev/tty` fails at once
/// (`ENXIO`).
#[allow(unsafe_code, reason = "`pre_exec` is unsafe; the closure only calls `setsid`")]
fn detach(cmd: &mut Command) {
    // SAFETY: between fork and exec the closure only calls `setsid`, a system call that is
    // async-signal-safe; it takes no lock and allocates nothing (the error is a number).
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            Ok(())
        });
    }
}

/// What the stdout reader passes on to rmcp.
#[derive(Debug)]
enum Received {
    /// Not the lane's: boxed, as these are the rare ones (the handshake, listings).
    Message(Box<RxJsonRpcMessage<RoleClient>>),
    /// The server broke the protocol: the connection is over now.
    Broken,
}

/// Reads the server's stdout on a thread of its own, blocked in `read`: responses to the
/// lane's calls, with progress and log lines, are handed to their calls right there, and
/// the calls run on this thread if they were started on a reader thread (see
/// [`crate::inline`]); everything else goes to rmcp's session by channel.
///
/// Once the server has spoken JSON-RPC, a line that is not a message is logged and
/// skipped; [`BAD_LINES_IN_A_ROW`] of them in a row end the connection with a protocol
/// error naming the last. A line holding a JSON-RPC batch (an array) is its messages.
struct StdoutReader {
    server: String,
    /// Whether the server has sent a message (lines before that may be banners).
    spoken: bool,
    /// Non-message lines seen before the first message.
    noise: usize,
    /// Non-message lines seen since the first message.
    bad: usize,
    /// Non-message lines since the last message.
    bad_in_a_row: usize,
    fault: Fault,
    lane: Arc<Lane>,
    received: mpsc::UnboundedSender<Received>,
}

impl StdoutReader {
    /// Starts reading on a thread of its own; `ended` is cancelled when it stops.
    fn start(self, stdout: std::fs::File, ended: CancellationToken) -> std::io::Result<()> {
        let runtime = tokio::runtime::Handle::current();
        std::thread::Builder::new().name(format!("toolmux-mcp-{}", self.server)).spawn(
            move || {
                let _ended = ended.drop_guard();
                let _context = runtime.enter();
                crate::inline::adopt_thread();
                self.run(stdout);
                crate::inline::run_ready();
            },
        )?;
        Ok(())
    }

    fn run(mut self, stdout: std::fs::File) {
        let mut stdout = std::io::BufReader::with_capacity(READ_BUFFER, stdout);
        let mut line = Vec::new();
        loop {
            match read_line_capped(&mut stdout, &mut line, MESSAGE_MAX) {
                Ok(LineRead::End) => {
                    self.fault.set(FaultKind::Closed(OUTPUT_CLOSED.into()));
                    return;
                }
                Ok(LineRead::Line) => {}
                Ok(LineRead::TooLong) => {
                    let why = format!(
                        "a line of over {} MiB without its end, more than any message may be",
                        MESSAGE_MAX >> 20
                    );
                    tracing::warn!(server = %self.server, "mcp server wrote {why}");
                    self.fault.set(FaultKind::Protocol(format!("stdout carried {why}")));
                    self.lane.close();
                    let _ = self.received.send(Received::Broken);
                    return;
                }
                Err(e) => {
                    let why = format!("cannot read the server's stdout: {e}");
                    self.fault.set(FaultKind::Closed(why));
                    return;
                }
            }
            let trimmed = line.trim_ascii();
            let going_on = if trimmed.is_empty() {
                true
            } else if self.lane.take_raw(trimmed) {
                self.spoken = true;
                self.bad_in_a_row = 0;
                true
            } else if trimmed.starts_with(b"[") {
                self.batch(trimmed)
            } else {
                let parsed = parse_message(trimmed).map_err(|why| (trimmed, why));
                self.message(parsed)
            };
            line.clear();
            // A huge result is held once, as the parsed message; the line buffer does not
            // keep its capacity for the rest of the connection.
            if line.capacity() > LINE_BUFFER_KEEP {
                line = Vec::new();
            }
            if !going_on {
                return;
            }
            crate::inline::run_ready();
        }
    }

    /// A JSON-RPC batch, one array on one line: its messages one by one. A line that is
    /// no array of JSON values is one bad line.
    fn batch(&mut self, line: &[u8]) -> bool {
        let Ok(items) = serde_json::from_slice::<Vec<&serde_json::value::RawValue>>(line) else {
            let parsed = parse_message(line).map_err(|why| (line, why));
            return self.message(parsed);
        };
        items.iter().all(|item| {
            let bytes = item.get().as_bytes();
            let parsed = parse_message(bytes).map_err(|why| (bytes, why));
            self.message(parsed)
        })
    }

    /// Passes a message on, or notes a line that is none (given with why it is none);
    /// `false` once the connection is over.
    ///
    /// A line that answers a request but is no response (an error whose code is a string,
    /// a result that is no object) is the error that request gets: it fails now, saying
    /// what the server wrote, rather than at its timeout.
    fn message(&mut self, parsed: Result<RxJsonRpcMessage<RoleClient>, (&[u8], String)>) -> bool {
        let parsed = parsed.or_else(|(line, why)| match super::unreadable_answer(line, &why) {
            Some(answer) => {
                tracing::warn!(server = %self.server, "mcp server answered a request with a line that is {why}");
                Ok(answer)
            }
            None => Err(why),
        });
        match parsed {
            Ok(message) => {
                self.spoken = true;
                self.bad_in_a_row = 0;
                // `false`: the connection was dropped.
                self.lane.take(message).is_none_or(|message| {
                    self.received.send(Received::Message(Box::new(message))).is_ok()
                })
            }
            Err(why) if self.spoken => {
                // A stray print of the server (a library's debug line) is logged and
                // skipped, as the official SDKs' clients do; only a server that writes
                // nothing else ends its connection.
                self.bad_in_a_row += 1;
                self.bad += 1;
                if self.bad <= BAD_LINES_LOGGED || self.bad.is_multiple_of(BAD_LINES_LOG_EVERY) {
                    tracing::warn!(
                        server = %self.server,
                        "mcp server wrote a line that is {why} ({} such lines so far); skipped",
                        self.bad
                    );
                }
                if self.bad_in_a_row < BAD_LINES_IN_A_ROW {
                    return true;
                }
                let message = format!(
                    "{BAD_LINES_IN_A_ROW} stdout lines in a row are not messages, the last is {why}"
                );
                tracing::warn!(server = %self.server, "{message}; ending the connection");
                self.fault.set(FaultKind::Protocol(message));
                // Ending the connection now fails the in-flight calls now.
                self.lane.close();
                let _ = self.received.send(Received::Broken);
                false
            }
            Err(why) => {
                // Before the first message some servers print banners; they are noise
                // unless the handshake then fails, and the startup error mentions them.
                self.noise += 1;
                if self.noise <= NOISE_LINES_LOGGED {
                    tracing::warn!(server = %self.server, "mcp server wrote a line that is {why}");
                }
                self.fault.note_noise(why);
                true
            }
        }
    }
}

/// The rmcp side of a stdio server: messages are written to its stdin by the lane's writer
/// (in the task rmcp spawns for each send), and read from the channel of its stdout reader.
#[derive(Debug)]
pub(crate) struct StdioTransport {
    messages: mpsc::UnboundedReceiver<Received>,
    /// Stdout has ended or broke the protocol: the connection is over.
    ended: bool,
    exited: watch::Receiver<Option<ExitStatus>>,
    /// Takes the responses to its own calls, and progress and log lines, as they are read.
    lane: Arc<Lane>,
    /// See [`StdioCommand::write_timeout`].
    write_timeout: Duration,
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        self.lane.close();
    }
}

/// The server's stdin is closed.
#[derive(Debug, thiserror::Error)]
#[error("the server's stdin is closed")]
pub(crate) struct StdinClosed;

impl StdioTransport {
    /// The next message on stdout; `None` when the connection is over. Cancel-safe, as
    /// rmcp polls it in a `select!`.
    async fn next_message(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        if self.ended {
            return None;
        }
        match self.messages.recv().await {
            Some(Received::Message(message)) => return Some(*message),
            Some(Received::Broken) => {
                self.ended = true;
                return None;
            }
            None => {}
        }
        self.ended = true;
        // Stdout ended: let the exit status arrive so the error can name it.
        let _ =
            tokio::time::timeout(EXIT_STATUS_GRACE, self.exited.wait_for(Option::is_some)).await;
        self.lane.close();
        None
    }
}

impl Transport<RoleClient> for StdioTransport {
    type Error = StdinClosed;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let lane = self.lane.clone();
        let mut exited = self.exited.clone();
        let write_timeout = self.write_timeout;
        // Encoded now, in rmcp's loop; the write happens in the task rmcp spawns for it,
        // through the lane's writer, which keeps whole lines from both apart.
        let bytes = encode_message(&item).map(|mut bytes| {
            bytes.push(b'\n');
            bytes
        });
        async move {
            let bytes = match bytes {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!("{e}");
                    return Ok(());
                }
            };
            let mut write = std::pin::pin!(lane.write(&bytes));
            // Most writes finish at once: a timer is set only for one the pipe holds up. A
            // server that stopped reading (its event loop blocked) held every later message
            // for ever, and its connection with them: rmcp's sends run in tasks of their own,
            // which no call's timeout ends.
            let written = match futures::poll!(write.as_mut()) {
                std::task::Poll::Ready(written) => written,
                std::task::Poll::Pending => {
                    match tokio::time::timeout(write_timeout, write).await {
                        Ok(written) => written,
                        Err(_) => {
                            lane.stalled(write_timeout);
                            return Err(StdinClosed);
                        }
                    }
                }
            };
            if written.is_err() {
                // A broken pipe usually means the server exited: let its exit status
                // arrive, so the error the caller gets can name it.
                let _ =
                    tokio::time::timeout(EXIT_STATUS_GRACE, exited.wait_for(Option::is_some)).await;
                return Err(StdinClosed);
            }
            Ok(())
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.next_message()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // EOF on stdin asks the server to exit.
        self.lane.close_stdin().await;
        self.ended = true;
        Ok(())
    }
}

/// A server process for [`reap`] to wait for.
struct Reaping {
    server: String,
    child: Child,
    pgid: Option<Pid>,
    /// The group listed with the watchman; released by [`reap`] after the group is killed
    /// and the leader reaped.
    watched: Option<GroupGuard>,
    /// The mark in its environment, to find what it left outside its group.
    mark: toolmux_core::ProcessMark,
    kill: CancellationToken,
    stdout: StdoutEnd,
}

/// How [`reap`] ends the connection of a server that exited while its stdout stays open.
struct StdoutEnd {
    /// Cancelled when the stdout reader stopped.
    ended: CancellationToken,
    lane: Arc<Lane>,
    /// Weak: the channel still ends when the reader stops, whatever the reaper does.
    received: mpsc::WeakUnboundedSender<Received>,
    /// The inode of the stdout pipe, to find what holds it.
    pipe: u64,
}

impl StdoutEnd {
    /// Waits a moment for stdout to end after the server's exit; if it does not, ends
    /// the connection (its calls fail now, and the next call starts the server again),
    /// says so, and kills what holds the pipe.
    ///
    /// Something the server started holds it: the pipe was made for the server, and only
    /// what it started inherits it. The sweep of its mark has run by now, so this is what
    /// the sweep cannot find (a daemon started with an environment of its own). Killing
    /// it is what the gateway does with everything else a server leaves running, and the
    /// only way to free the reader thread, blocked in `read` until the pipe's last writer
    /// is gone: nothing interrupts a blocking read of a pipe (closing our end from another
    /// thread does not), and a reader polling a second descriptor to be woken would still
    /// leave the daemon running, holding a pipe nobody reads.
    async fn after_exit(&self, server: &str, fault: &Fault, status: &str) {
        if tokio::time::timeout(STDOUT_DRAIN, self.ended.cancelled()).await.is_ok() {
            return;
        }
        tracing::warn!(
            server = %server,
            "mcp server exited but something it started holds its stdout; ending its connection"
        );
        fault.refine(FaultKind::Closed(format!(
            "{status}; something it started still holds its stdout"
        )));
        self.lane.close();
        if let Some(received) = self.received.upgrade() {
            let _ = received.send(Received::Broken);
        }
        let pipe = self.pipe;
        let killed = tokio::task::spawn_blocking(move || kill_pipe_holders(pipe));
        let killed = killed.await.unwrap_or_default();
        if killed.is_empty() {
            return;
        }
        tracing::info!(
            server = %server,
            "killed {} process(es) that the mcp server left holding its stdout: {killed:?}",
            killed.len()
        );
        if tokio::time::timeout(STDOUT_DRAIN, self.ended.cancelled()).await.is_err() {
            tracing::warn!(server = %server, "the mcp server's stdout is still held open");
        }
    }
}

/// How many times [`kill_pipe_holders`] looks again after killing something: a holder may
/// have started another between the listing and its death.
const PIPE_SWEEP_ROUNDS: usize = 8;

/// Kills (`SIGKILL`) every process but this one that holds pipe `inode` open; returns
/// their ids. Each is signalled through a pidfd taken before its descriptors are looked at
/// again, so that a process id reused meanwhile is never signalled. Linux only (elsewhere
/// nothing is found).
fn kill_pipe_holders(inode: u64) -> Vec<i32> {
    let mut killed = Vec::new();
    #[cfg(target_os = "linux")]
    for _ in 0..PIPE_SWEEP_ROUNDS {
        let before = killed.len();
        for pid in pipe_holders(inode) {
            let Some(id) = Pid::from_raw(pid) else { continue };
            let Ok(pidfd) = rustix::process::pidfd_open(id, rustix::process::PidfdFlags::empty())
            else {
                continue;
            };
            if holds_pipe(pid, inode)
                && rustix::process::pidfd_send_signal(&pidfd, Signal::KILL).is_ok()
            {
                killed.push(pid);
            }
        }
        if killed.len() == before {
            break;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (inode, PIPE_SWEEP_ROUNDS);
    killed
}

/// The processes but this one whose descriptors include pipe `inode`.
#[cfg(target_os = "linux")]
fn pipe_holders(inode: u64) -> Vec<i32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| i32::try_from(pid).ok())
        .filter(|&pid| holds_pipe(pid, inode))
        .collect()
}

/// Whether process `pid` has pipe `inode` open (its `/proc/PID/fd` links to `pipe:[INODE]`).
#[cfg(target_os = "linux")]
fn holds_pipe(pid: i32, inode: u64) -> bool {
    let target = format!("pipe:[{inode}]");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == target.as_str())
    })
}

/// Waits for the server's exit (or kills it when `kill` is cancelled, or when its stdout
/// ended and it did not exit within [`OUTPUT_END_GRACE`]), then kills what it left
/// running, in its group and out of it, before the exit is told: once a shutdown returns,
/// nothing of the server runs.
async fn reap(
    reaping: Reaping,
    exited: watch::Sender<Option<ExitStatus>>,
    fault: Fault,
    stderr_read: tokio::sync::oneshot::Receiver<()>,
) {
    let Reaping { server, mut child, pgid, watched, mark, kill, stdout } = reaping;
    // Stopped here because its stdout ended: the connection's error says so already, and
    // the status of the signal that stopped it would only hide why.
    let mut stopped = false;
    let status = tokio::select! {
        status = child.wait() => status,
        () = kill.cancelled() => {
            if let Some(pgid) = pgid {
                let _ = kill_process_group(pgid, Signal::KILL);
            }
            let _ = child.start_kill();
            child.wait().await
        }
        () = stdout.ended.cancelled() => {
            match tokio::time::timeout(OUTPUT_END_GRACE, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    stopped = true;
                    stop_without_output(&server, &mut child, pgid, &kill).await
                }
            }
        }
    };
    // The leader is gone; anything it left in its group goes too, then what left it.
    if let Some(pgid) = pgid {
        let _ = kill_process_group(pgid, Signal::KILL);
    }
    // Released from the watchman only now, the status read as it always was (`child.wait`,
    // which reaps): waiting for the leader without reaping it and killing the group first
    // lost a server's exit status to a daemon holding its stdout, and made a startup error
    // late under load. Between the reap above and this line the group's id is free once its
    // last member is gone; were toolmux killed with SIGKILL in that moment and the id taken
    // by a new group meanwhile, the watchman would kill that group. The kill just above
    // already signals the id after the reap in the same way; it takes the kernel handing out
    // every other pid in between, and the window is the few steps from the reap to here.
    drop(watched);
    mark.sweep_on_pool(&format!("mcp server {server}")).await;
    match status {
        Ok(status) => {
            tracing::debug!(server = %server, %status, "mcp server exited");
            // Its last words on stderr say why; they are read to the end unless something
            // it left running still holds the pipe.
            let _ = tokio::time::timeout(STDERR_DRAIN, stderr_read).await;
            let said = fault.stderr_tail().map(|t| format!("; its stderr ended: {t}"));
            let said = said.unwrap_or_default();
            if !stopped {
                let exit = format!("server process {status}{said}");
                fault.refine(FaultKind::Closed(exit.clone()));
                stdout.after_exit(&server, &fault, &exit).await;
            }
            exited.send_replace(Some(status));
        }
        Err(e) => {
            tracing::warn!(server = %server, error = %e, "cannot wait for mcp server process");
            exited.send_replace(Some(ExitStatus::default()));
        }
    }
}

/// Stops a server that closed its stdout but keeps running: SIGTERM to its group, then
/// SIGKILL after [`TERM_GRACE`] (or at once when `kill` is cancelled meanwhile).
async fn stop_without_output(
    server: &str,
    child: &mut Child,
    pgid: Option<Pid>,
    kill: &CancellationToken,
) -> std::io::Result<ExitStatus> {
    tracing::warn!(server = %server, "mcp server closed its stdout but kept running; stopping it");
    if let Some(pgid) = pgid {
        let _ = kill_process_group(pgid, Signal::TERM);
    }
    tokio::select! {
        status = tokio::time::timeout(TERM_GRACE, child.wait()) => {
            if let Ok(status) = status {
                return status;
            }
        }
        () = kill.cancelled() => {}
    }
    if let Some(pgid) = pgid {
        let _ = kill_process_group(pgid, Signal::KILL);
    }
    let _ = child.start_kill();
    child.wait().await
}

/// Logs the server's stderr line by line, each cut at [`STDERR_LINE_MAX`] bytes (a line
/// without end is read through, never held), keeping the last few for the error that says
/// it exited; `closed` is sent when the pipe closes.
async fn log_stderr(
    server: String,
    stderr: ChildStderr,
    fault: Fault,
    closed: tokio::sync::oneshot::Sender<()>,
) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    while let Ok(buffer) = reader.fill_buf().await {
        if buffer.is_empty() {
            if !line.is_empty() {
                log_stderr_line(&server, &line, &fault);
            }
            break;
        }
        let (used, ended) = match buffer.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buffer.len(), false),
        };
        let room = STDERR_LINE_MAX.saturating_sub(line.len());
        line.extend_from_slice(&buffer[..used.min(room)]);
        reader.consume(used);
        if ended {
            log_stderr_line(&server, &line, &fault);
            line.clear();
        }
    }
    let _ = closed.send(());
}

fn log_stderr_line(server: &str, line: &[u8], fault: &Fault) {
    let text = String::from_utf8_lossy(line);
    tracing::debug!(server = %server, "stderr: {}", text.trim_end());
    fault.note_stderr(&text);
}

/// A lane onto `cat`, which reads what is written and answers nothing (for the lane's
/// tests; processes are spawned here).
#[cfg(test)]
pub(crate) fn lane_onto_cat() -> (Lane, Child) {
    let mut child = Command::new("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("cat runs");
    let stdin = child.stdin.take().expect("a pipe");
    (Lane::new(stdin, Fault::default()), child)
}

#[cfg(test)]
mod tests {
    use super::{LineRead, read_line_capped};
    use std::io::BufReader;

    /// A real server process started with `envInherit: safe` gets the variables of
    /// toolmux's environment whose names have no credential's word, judged by words:
    /// `MONKEY`, `TOKENIZER_PATH` and `KEYBOARD_LAYOUT` reach it (they were withheld for
    /// holding `KEY` and `TOKEN`), `GITHUBTOKEN`, `APIKEY`, `SSH_AUTH_SOCK` and
    /// `DBUS_SESSION_BUS_ADDRESS` do not. The test runs itself again as a child with those
    /// variables set, as a test cannot change its own environment while other tests' threads
    /// read it; the child starts the server, a shell writing its environment to a file.
    #[test]
    fn a_server_started_with_safe_inheritance_gets_what_it_may() {
        const CHILD: &str = "TOOLMUX_TEST_ENV_OUT";
        const NAME: &str =
            "transport::stdio::tests::a_server_started_with_safe_inheritance_gets_what_it_may";
        let set = [
            ("MONKEY", "banana"),
            ("TOKENIZER_PATH", "/models/tokenizer.json"),
            ("KEYBOARD_LAYOUT", "us"),
            ("XDG_SESSION_TYPE", "tty"),
            ("GITHUBTOKEN", "ghp-secret"),
            ("APIKEY", "sk-secret"),
            ("SSH_AUTH_SOCK", "/run/agent.sock"),
            ("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/bus"),
        ];
        if let Ok(out) = std::env::var(CHILD) {
            return start_a_server_writing_its_environment(&out);
        }
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = dir.path().join("environment");
        let status = std::process::Command::new(std::env::current_exe().expect("this test"))
            .args(["--exact", NAME, "--test-threads=1", "--quiet"])
            .env(CHILD, &out)
            .envs(set)
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .status()
            .expect("the test runs itself");
        assert!(status.success(), "the child run failed: {status}");
        let environment = std::fs::read_to_string(&out).expect("the server wrote its environment");
        let names: Vec<_> =
            environment.lines().filter_map(|line| line.split_once('=')).map(|(n, _)| n).collect();
        let got: Vec<_> =
            set.iter().map(|(name, _)| format!("{name}: {}", names.contains(name))).collect();
        assert_eq!(
            got,
            [
                "MONKEY: true",
                "TOKENIZER_PATH: true",
                "KEYBOARD_LAYOUT: true",
                "XDG_SESSION_TYPE: true",
                "GITHUBTOKEN: false",
                "APIKEY: false",
                "SSH_AUTH_SOCK: false",
                "DBUS_SESSION_BUS_ADDRESS: false",
            ]
        );
    }

    /// The child's part: starts `sh` as a stdio server with `envInherit: safe`, writing its
    /// environment to `out`, and waits (10 s at most) for the file.
    fn start_a_server_writing_its_environment(out: &str) {
        let runtime =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async {
            let args = [
                "-c".to_owned(),
                r#"env > "$0.part" && mv "$0.part" "$0""#.to_owned(),
                out.to_owned(),
            ];
            let command = super::StdioCommand {
                server: "env",
                program: "/bin/sh",
                args: &args,
                env: &std::collections::BTreeMap::new(),
                inherit: crate::EnvInherit::Safe,
                passthrough: &[],
                cwd: std::env::temp_dir(),
                write_timeout: std::time::Duration::from_secs(5),
            };
            let (_transport, _group) =
                super::spawn(&command, &super::Fault::default()).expect("sh starts");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !std::path::Path::new(out).exists() {
                assert!(std::time::Instant::now() < deadline, "the server wrote nothing");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        });
    }

    /// Lines are read whole up to the cap and not past it, whatever the read buffer's
    /// size; the stream's last bytes without a newline are a line.
    #[test]
    fn lines_are_capped() {
        for capacity in [1, 3, 64] {
            let read_all = |input: &[u8]| {
                let mut reader = BufReader::with_capacity(capacity, input);
                let mut lines = Vec::new();
                loop {
                    let mut line = Vec::new();
                    let read = read_line_capped(&mut reader, &mut line, 10).unwrap();
                    let done = read != LineRead::Line;
                    lines.push((read, String::from_utf8(line).unwrap()));
                    if done {
                        return lines;
                    }
                }
            };
            assert_eq!(
                read_all(b"short\nexactly10\nlast"),
                [
                    (LineRead::Line, "short\n".into()),
                    (LineRead::Line, "exactly10\n".into()),
                    (LineRead::Line, "last".into()),
                    (LineRead::End, String::new()),
                ]
            );
            assert_eq!(
                read_all(b"ok\nthis line is too long\n"),
                [(LineRead::Line, "ok\n".into()), (LineRead::TooLong, String::new())]
            );
        }
    }
}
