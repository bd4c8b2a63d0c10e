//! Helpers for the integration tests: where the peers are, servers run as process groups,
//! and checks on what processes remain.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process_group};
use toolmux_mcp::McpServerConfig;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A directory servers run in.
pub fn run_dir() -> PathBuf {
    std::env::temp_dir()
}

fn peer(relative: &str, name: &str) -> PathBuf {
    let path = repo_root().join(".peers").join(relative);
    assert!(path.exists(), "missing test peer {name}: run .ci/install-peers");
    path
}

/// server-everything's entry script.
pub fn everything_js() -> PathBuf {
    peer(
        "node/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        "@modelcontextprotocol/server-everything",
    )
}

/// The npm peers' `node_modules`.
pub fn node_modules() -> PathBuf {
    peer("node/node_modules", "the npm peers")
}

/// The virtualenv's Python with the official MCP SDK.
pub fn python() -> PathBuf {
    peer("python/venv/bin/python", "mcp (PyPI)")
}

/// A fixture script of this crate's tests.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// server-everything over stdio.
pub fn everything_stdio() -> McpServerConfig {
    McpServerConfig::stdio("node", [everything_js().display().to_string(), "stdio".into()])
        .with_base_dir(run_dir())
}

/// The scriptable fault-injection server, in `mode`.
pub fn fixture_stdio(mode: &str) -> McpServerConfig {
    McpServerConfig::stdio(env!("CARGO_BIN_EXE_toolmux-mcp-fixture"), [mode])
        .with_base_dir(run_dir())
}

/// A free loopback port.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Polls `check` every 20 ms until it holds; panics after `timeout` naming `what`.
pub async fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pids of the live (not zombie) processes in process group `pgid`, read from /proc.
pub fn group_members(pgid: i32) -> Vec<i32> {
    let mut members = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return members };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Fields after the parenthesized command name: state ppid pgrp ...
        let Some(rest) = stat.rsplit_once(") ").map(|(_, rest)| rest) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() {
            members.push(pid);
        }
    }
    members
}

/// Whether process `pid` runs: it exists and is no zombie (one whose parent exited
/// waits for a PID 1 that may never reap it).
pub fn is_running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// The ids of this process's threads whose name (cut to 15 bytes, as Linux keeps it) is
/// `name`.
pub fn threads_named(name: &str) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    tasks
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .collect()
}

/// Children of this test process that are zombies (exited but not reaped).
pub fn zombie_children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut zombies = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return zombies };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let Some(rest) = stat.rsplit_once(") ").map(|(_, rest)| rest) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 1 && fields[0] == "Z" && fields[1] == me {
            zombies.push(pid);
        }
    }
    zombies
}

/// Waits until no process of group `pgid` is left, or panics listing them.
pub async fn assert_group_gone(pgid: i32) {
    let started = Instant::now();
    loop {
        let members = group_members(pgid);
        if members.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "processes of group {pgid} remain after shutdown: {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server the test started itself (an HTTP server), killed with its group on drop.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub base: String,
}

impl ServerProcess {
    /// Starts `program args` with `PORT` set, and waits until the port accepts.
    pub fn start(program: &str, args: &[String], port: u16) -> ServerProcess {
        let child = Command::new(program)
            .args(args)
            .env("PORT", port.to_string())
            .current_dir(run_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let server = ServerProcess { child, base: format!("http://127.0.0.1:{port}") };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{program} did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        server
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(pgid) = i32::try_from(self.child.id()).ok().and_then(Pid::from_raw) {
            let _ = kill_process_group(pgid, Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
