//! The stdio transport: the server runs as a child process in its own process group,
//! speaks newline-delimited JSON-RPC on stdin/stdout, and its stderr goes to the logs.
//!
//! The whole group is killed and the child reaped on shutdown, on drop and when the
//! connection fails, so servers started through wrappers (`npx`, shells) leave nothing
//! behind. Unlike rmcp's own child-process transport, stdout is read strictly: once the
//! server has spoken JSON-RPC, a line that is not a message ends the connection with a
//! protocol error naming it, instead of being skipped while a call waits forever.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{
    ChannelTransport, Fault, FaultKind, PumpEnds, channel_transport, encode_message, parse_message,
};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};

/// How long a closed stdout waits for the exit status, so the error can carry it.
const EXIT_STATUS_GRACE: Duration = Duration::from_millis(200);
/// How long a graceful shutdown waits after closing stdin before killing the group.
const GRACEFUL_EXIT: Duration = Duration::from_millis(500);
/// How long reaping may take after SIGKILL before it is left to the background task.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);
/// Non-JSON lines logged before the first message (startup banners), at most.
const NOISE_LINES_LOGGED: usize = 8;
/// Capacity the stdout line buffer keeps between messages.
const LINE_BUFFER_KEEP: usize = 1 << 20;
/// Longest stderr line logged, in bytes; the rest is cut.
const STDERR_LINE_MAX: usize = 4096;

/// What to run.
#[derive(Debug)]
pub(crate) struct StdioCommand<'a> {
    pub(crate) server: &'a str,
    pub(crate) program: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a BTreeMap<String, String>,
    pub(crate) cwd: PathBuf,
}

/// A running server process: its process group, and the task that reaps it.
#[derive(Debug)]
pub(crate) struct ChildGroup {
    server: String,
    /// The process group id, equal to the child's pid (the child leads its own group).
    pgid: Option<Pid>,
    kill: CancellationToken,
    exited: watch::Receiver<Option<ExitStatus>>,
}

impl ChildGroup {
    /// The child's pid, which is also its process group id.
    pub(crate) fn pid(&self) -> Option<i32> {
        self.pgid.map(Pid::as_raw_nonzero).map(i32::from)
    }

    /// Closes nothing itself: the caller drops the transport (closing stdin) first, then
    /// this waits briefly for a voluntary exit, kills the whole group and reaps the child.
    pub(crate) async fn shutdown(&mut self) {
        let mut exited = self.exited.clone();
        let _ = tokio::time::timeout(GRACEFUL_EXIT, exited.wait_for(Option::is_some)).await;
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

    fn signal_group(&self) {
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

/// Spawns the server and starts its pumps.
pub(crate) fn spawn(
    command: &StdioCommand<'_>,
    fault: &Fault,
) -> std::io::Result<(ChannelTransport, ChildGroup)> {
    let mut cmd = Command::new(command.program);
    cmd.args(command.args)
        .envs(command.env)
        .current_dir(&command.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let pgid = child.id().and_then(|id| i32::try_from(id).ok()).and_then(Pid::from_raw);
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("child pipes missing"));
    };
    let server = command.server.to_owned();
    tracing::debug!(server = %server, program = %command.program, pid = ?pgid.map(Pid::as_raw_nonzero), "mcp server started");

    let (transport, PumpEnds { outbound, inbound }) = channel_transport();
    let (exited_tx, exited_rx) = watch::channel(None);
    let kill = CancellationToken::new();

    tokio::spawn(reap(server.clone(), child, pgid, kill.clone(), exited_tx, fault.clone()));
    tokio::spawn(read_stdout(server.clone(), stdout, inbound, fault.clone(), exited_rx.clone()));
    tokio::spawn(write_stdin(stdin, outbound, fault.clone()));
    tokio::spawn(log_stderr(server.clone(), stderr));

    Ok((transport, ChildGroup { server, pgid, kill, exited: exited_rx }))
}

async fn reap(
    server: String,
    mut child: Child,
    pgid: Option<Pid>,
    kill: CancellationToken,
    exited: watch::Sender<Option<ExitStatus>>,
    fault: Fault,
) {
    let status = tokio::select! {
        status = child.wait() => status,
        () = kill.cancelled() => {
            if let Some(pgid) = pgid {
                let _ = kill_process_group(pgid, Signal::KILL);
            }
            let _ = child.start_kill();
            child.wait().await
        }
    };
    // The leader is gone; anything it left in its group goes too.
    if let Some(pgid) = pgid {
        let _ = kill_process_group(pgid, Signal::KILL);
    }
    match status {
        Ok(status) => {
            tracing::debug!(server = %server, %status, "mcp server exited");
            fault.refine(FaultKind::Closed(format!("server process {status}")));
            exited.send_replace(Some(status));
        }
        Err(e) => {
            tracing::warn!(server = %server, error = %e, "cannot wait for mcp server process");
            exited.send_replace(Some(ExitStatus::default()));
        }
    }
}

async fn read_stdout(
    server: String,
    stdout: ChildStdout,
    inbound: mpsc::Sender<RxJsonRpcMessage<RoleClient>>,
    fault: Fault,
    mut exited: watch::Receiver<Option<ExitStatus>>,
) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    let mut spoken = false;
    let mut noise = 0usize;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) => {
                fault.set(FaultKind::Closed("server closed its stdout".into()));
                break;
            }
            Ok(_) => {}
            Err(e) => {
                fault.set(FaultKind::Closed(format!("cannot read the server's stdout: {e}")));
                break;
            }
        }
        let trimmed = line.trim_ascii();
        if trimmed.is_empty() {
            continue;
        }
        match parse_message(trimmed) {
            Ok(message) => {
                spoken = true;
                // A huge result is held once, as the parsed message; the line buffer does
                // not keep its capacity for the rest of the connection.
                if line.capacity() > LINE_BUFFER_KEEP {
                    line = Vec::new();
                }
                if inbound.send(message).await.is_err() {
                    return;
                }
            }
            Err(why) if spoken => {
                tracing::warn!(server = %server, "mcp server wrote a line that is {why}");
                fault.set(FaultKind::Protocol(format!("stdout line is {why}")));
                // Dropping `inbound` ends the connection; in-flight calls fail now.
                return;
            }
            Err(why) => {
                // Before the first message some servers print banners; they are noise
                // unless the handshake then fails, and the startup error mentions them.
                noise += 1;
                if noise <= NOISE_LINES_LOGGED {
                    tracing::warn!(server = %server, "mcp server wrote a line that is {why}");
                }
                fault.note_noise(why);
            }
        }
    }
    // Let the exit status arrive so the error can name it.
    let _ = tokio::time::timeout(EXIT_STATUS_GRACE, exited.wait_for(Option::is_some)).await;
}

async fn write_stdin(
    mut stdin: ChildStdin,
    mut outbound: mpsc::Receiver<TxJsonRpcMessage<RoleClient>>,
    fault: Fault,
) {
    while let Some(message) = outbound.recv().await {
        let mut bytes = match encode_message(&message) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!("{e}");
                continue;
            }
        };
        bytes.push(b'\n');
        let written = async {
            stdin.write_all(&bytes).await?;
            stdin.flush().await
        };
        if let Err(e) = written.await {
            fault.set(FaultKind::Closed(format!("cannot write to the server's stdin: {e}")));
            return;
        }
    }
    // rmcp closed the connection: EOF on stdin asks the server to exit.
    let _ = stdin.shutdown().await;
}

async fn log_stderr(server: String, stderr: ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    while let Ok(n) = reader.read_until(b'\n', &mut line).await {
        if n == 0 {
            break;
        }
        let end = line.len().min(STDERR_LINE_MAX);
        let text = String::from_utf8_lossy(&line[..end]);
        tracing::debug!(server = %server, "stderr: {}", text.trim_end());
        line.clear();
    }
}
