//! Stdio servers of a toolmux that runs in a terminal cannot reach it: this test binary
//! runs its own test again in a fresh session on a pseudo-terminal.

use std::path::Path;
use std::time::{Duration, Instant};
use toolmux_core::ToolProvider;
use toolmux_mcp::{McpProvider, McpServerConfig};

/// A stdio server cannot reach the terminal toolmux runs in: `/dev/tty` fails at once, so
/// one that asks there first (`npx`'s "Ok to proceed?", a credential prompt) goes on at
/// once instead of being stopped until the startup timeout, and writes nothing over the
/// user's screen. Where the tests have no terminal this holds trivially;
/// `stdio_servers_of_a_toolmux_in_a_terminal_cannot_reach_it` runs it again in a session
/// that has one.
#[tokio::test]
async fn stdio_servers_cannot_open_the_controlling_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "echo scribble > /dev/tty; read x < /dev/tty || echo \"no terminal: $?\" >&2; exec {} ok",
        env!("CARGO_BIN_EXE_toolmux-mcp-fixture")
    );
    let config = McpServerConfig::stdio("sh", ["-c".to_owned(), script])
        .with_base_dir(dir.path().to_path_buf())
        .with_startup_timeout(Duration::from_secs(20));
    let provider = McpProvider::new("asking", config).unwrap();
    let started = Instant::now();
    let ready = provider.warmup().await;
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}: {ready:?}", started.elapsed());
    ready.unwrap();
    assert_eq!(provider.list_tools().await.unwrap().len(), 22);
    provider.shutdown().await.unwrap();
}

/// Runs `command` (`sh -c`) in a new session whose controlling terminal is a fresh
/// pseudo-terminal (util-linux `script`), as a toolmux started from a shell runs; returns
/// what reached the terminal (how `command` ended is for the caller to check). Its stdin
/// is closed, so that no keystroke of the person running the tests goes in.
fn run_in_a_terminal(command: &str) -> String {
    let child = std::process::Command::new("script")
        .args(["--quiet", "--return", "--command", command, "/dev/null"])
        .env("SHELL", "/bin/sh")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("util-linux's `script` starts");
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a pid");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let Ok(output) = rx.recv_timeout(Duration::from_secs(90)) else {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        panic!("`{command}` did not end within 90 s in a terminal");
    };
    String::from_utf8_lossy(&output.unwrap().stdout).into_owned()
}

/// A stdio server started by a toolmux that has a controlling terminal (its CLI, an
/// agent's TUI) is in a session of its own: in toolmux's session, `read < /dev/tty`
/// stopped it (`SIGTTIN`, its group not the terminal's foreground one) until the startup
/// timeout, and its writes to `/dev/tty` landed on the user's screen.
#[test]
fn stdio_servers_of_a_toolmux_in_a_terminal_cannot_reach_it() {
    // The harness gives a controlling terminal: a plain program writes to it.
    let screen = run_in_a_terminal("echo harness-check > /dev/tty");
    assert!(screen.contains("harness-check"), "{screen:?}");
    let exe = std::env::current_exe().unwrap();
    let out = tempfile::NamedTempFile::new().unwrap();
    let quoted = |path: &Path| {
        let path = path.to_str().unwrap();
        assert!(!path.contains('\''), "{path}");
        format!("'{path}'")
    };
    let test = "terminal::stdio_servers_cannot_open_the_controlling_terminal";
    let command =
        format!("exec {} --exact {test} --nocapture > {} 2>&1", quoted(&exe), quoted(out.path()));
    let screen = run_in_a_terminal(&command);
    let stdout = std::fs::read_to_string(out.path()).unwrap();
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(!screen.contains("scribble"), "{screen:?}");
}
