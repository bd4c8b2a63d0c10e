//! Tests that drive the real `toolmux` binary in a temporary project folder.
//!
//! They live in this crate rather than in the workspace's `tests/it` because only here does
//! cargo build the binary for them and tell its path (`CARGO_BIN_EXE_toolmux`); `tests/it`
//! keeps the tests that combine library crates.

mod affinity;
mod agent;
mod annotations;
mod check_json;
mod config_errors;
mod config_files;
mod conformance;
mod env_file;
mod external;
mod external_api;
mod hooks;
mod logging;
mod oauth;
mod output_and_stats;
mod rest;
mod serve;
mod spaces;
mod start_failures;
mod tools;
mod trace_mcp;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub(crate) fn toolmux_bin() -> &'static str {
    env!("CARGO_BIN_EXE_toolmux")
}

/// The repository root.
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A test peer under `.peers/`, or a failure telling how to install it.
pub(crate) fn peer(relative: &str) -> PathBuf {
    let path = repo_root().join(".peers").join(relative);
    assert!(path.exists(), "missing test peer {relative}: run .ci/install-peers");
    path
}

/// The `mcpServers` entry (its lines under the server's name, indented four spaces) of a
/// stdio MCP server written for a test (`line_server.py`: JSON lines by hand, no SDK),
/// shaped by `spec` (see that file: its tools, its answer, a file each call writes, a
/// notification it sends first).
pub(crate) fn line_server(spec: &serde_json::Value) -> String {
    let python = peer("python/venv/bin/python");
    let script = repo_root().join("crates/toolmux-cli/tests/cli/line_server.py");
    // JSON is YAML; a string of it keeps the argument whole.
    let argument = serde_json::Value::String(spec.to_string());
    format!("    command: {}\n    args: [{}, {argument}]\n", python.display(), script.display())
}

/// A project whose configuration has the builtin tools and server-everything (npm).
pub(crate) fn gateway_project() -> Project {
    let node = peer("node/node_modules/.bin/node");
    let everything =
        peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let project = Project::new();
    project.file("notes.md", "TODO: gateway\n").file(
        "toolmux.yaml",
        &format!(
            "fs: {{}}\nmcpServers:\n  everything:\n    command: {}\n    args: [{}, stdio]\n",
            node.display(),
            everything.display()
        ),
    );
    project
}

/// A temporary project folder to run the binary in.
pub(crate) struct Project {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    /// Variables left unset, over the defaults `command` gives.
    unset: Vec<String>,
}

/// What one run printed and how it ended.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Project {
    pub(crate) fn new() -> Project {
        let dir = tempfile::tempdir().expect("temporary folder");
        std::fs::create_dir(dir.path().join("tmp")).expect("tmp folder");
        Project { dir, env: Vec::new(), unset: Vec::new() }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file (folders created).
    pub(crate) fn file(&self, name: &str, content: &str) -> &Project {
        let path = self.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("folders");
        }
        std::fs::write(path, content).expect("write");
        self
    }

    /// Sets an environment variable for every run.
    pub(crate) fn env(mut self, key: &str, value: &str) -> Project {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Leaves the variable `key` unset in the binary's environment (such as
    /// `TOOLMUX_USER_CONFIG`, so that the user's file is looked for where people keep it).
    pub(crate) fn unset(mut self, key: &str) -> Project {
        self.unset.push(key.to_owned());
        self
    }

    /// A command for the binary in the project folder, with a private temporary folder
    /// (so the default output folder and statistics are the project's own).
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(toolmux_bin());
        command
            .args(args)
            .current_dir(self.path())
            .env_remove("TOOLMUX_CONFIG")
            .env_remove("RUST_LOG")
            // A terminal's width is the test's to give (`Project::env`).
            .env_remove("COLUMNS")
            // No user's or managed file but a test's own (`Project::env`).
            .env("TOOLMUX_USER_CONFIG", "")
            .env("TOOLMUX_MANAGED_CONFIG", "")
            .env("TMPDIR", self.path().join("tmp"))
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        for key in &self.unset {
            command.env_remove(key);
        }
        command
    }

    /// Runs the binary on a pseudo-terminal (stdin, stdout and stderr all the terminal, as
    /// for a person at a shell) through `tests/cli/pty_driver.py`, which answers each prompt
    /// of `rules` (`[["prompt text", "answer"], ...]`) once and fails (99) if one was never
    /// shown; the transcript is the run's stdout.
    pub(crate) fn run_at_terminal(&self, rules: &serde_json::Value, args: &[&str]) -> Run {
        let mut command = Command::new(peer("python/venv/bin/python"));
        command
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cli/pty_driver.py"))
            .arg(rules.to_string())
            .arg(toolmux_bin())
            .args(args)
            .current_dir(self.path())
            .env_remove("TOOLMUX_CONFIG")
            .env_remove("RUST_LOG")
            // A terminal's width is the test's to give (`Project::env`).
            .env_remove("COLUMNS")
            // No user's or managed file but a test's own (`Project::env`).
            .env("TOOLMUX_USER_CONFIG", "")
            .env("TOOLMUX_MANAGED_CONFIG", "")
            .env("TMPDIR", self.path().join("tmp"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        wait(command.spawn().expect("python starts"), Duration::from_secs(90))
    }

    /// Runs the binary to completion (at most 120 seconds).
    pub(crate) fn run(&self, args: &[&str]) -> Run {
        let mut command = self.command(args);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = command.spawn().expect("spawn toolmux");
        wait(child, Duration::from_secs(120))
    }
}

/// Starts `command` with stdin closed and stdout and stderr piped, waits (at most 60
/// seconds) until `started` says the run has got as far as the test wants, sends it
/// `signal` (a name for `kill`, such as `INT` or `TERM`) and waits (at most 30 seconds) for
/// it to end; `what` names the awaited point for the failure when it never comes.
pub(crate) fn start_and_signal(
    mut command: Command,
    what: &str,
    mut started: impl FnMut() -> bool,
    signal: &str,
) -> Run {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("toolmux starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !started() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: not within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    send_signal(&child, signal);
    wait(child, Duration::from_secs(30))
}

/// Sends `signal` (a name for `kill`, such as `INT` or `TERM`) to `child`.
pub(crate) fn send_signal(child: &Child, signal: &str) {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args([&format!("-{signal}"), &pid]).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -{signal} {pid} failed");
}

/// Waits at most `limit` for `child` to exit: its status, or `None` when it had not
/// exited by then (it is killed).
pub(crate) fn exit_within(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit, killing it after `limit`; collects its output (stdout empty
/// when it was not piped).
pub(crate) fn wait(mut child: Child, limit: Duration) -> Run {
    let stdout = child.stdout.take();
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut stdout) = stdout {
            let _ = stdout.read_to_string(&mut s);
        }
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let Some(status) = exit_within(&mut child, limit) else {
        panic!("toolmux did not exit within {limit:?}");
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
    }
}

impl Run {
    /// The one JSON object a command given `--json` prints on stdout for an error, checked
    /// to say it failed, why (the `error: ` line on stderr), and with the exit code it ended
    /// with; its message.
    pub(crate) fn json_error(&self) -> String {
        let value: serde_json::Value = serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is no JSON ({e}): {self:?}"));
        assert_eq!(value["ok"], false, "{self:?}");
        assert_eq!(value["exitCode"], self.code, "{self:?}");
        assert_eq!(value.as_object().map(serde_json::Map::len), Some(3), "{self:?}");
        let message = value["error"].as_str().expect("an error message").to_owned();
        let first = message.lines().next().unwrap_or_default();
        assert!(self.stderr.contains(&format!("error: {first}")), "{self:?}");
        message
    }

    /// Asserts success and returns stdout.
    pub(crate) fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "exit code; stderr:\n{}\nstdout:\n{}", self.stderr, self.stdout);
        &self.stdout
    }
}
