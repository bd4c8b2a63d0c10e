//! Running a test again under a controlling terminal, as a toolmux started from a person's
//! shell runs: what toolmux starts (commands, hooks, stdio servers) must not reach that
//! terminal, and without one (as under CI) a test of it would hold trivially.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

/// How long one run under the terminal may take before `timeout` kills it.
const LIMIT: &str = "90";

/// Runs `command` (`sh -c`) in a new session whose controlling terminal is a fresh
/// pseudo-terminal (util-linux `script`, under coreutils' `timeout`); returns what reached
/// the terminal. Its stdin is closed, so that no keystroke of the person running the tests
/// goes in.
///
/// # Panics
///
/// When `script` cannot start or the run does not end within 90 s.
pub fn run_in_a_terminal(command: &str) -> String {
    let output = Command::new("timeout")
        .args(["--kill-after=5", LIMIT, "script", "--quiet", "--return", "--command", command])
        .arg("/dev/null")
        .env("SHELL", "/bin/sh")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("coreutils' `timeout` and util-linux's `script` start");
    // `timeout` ends with 124 (or 137 once it had to kill).
    assert!(
        !matches!(output.status.code(), Some(124 | 137)),
        "`{command}` did not end within {LIMIT} s in a terminal"
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs test `test` (its full path, `module::name`) of the running test binary again, in
/// a session whose controlling terminal is a fresh pseudo-terminal, after checking that
/// the terminal is real (a plain program's write reaches it). Returns the test's own
/// output (which names `1 passed` when it passed) and what reached the terminal.
///
/// # Panics
///
/// When the terminal cannot be had, or the run does not end within 90 s.
pub fn rerun_in_a_terminal(test: &str) -> (String, String) {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let screen = run_in_a_terminal("echo harness-check > /dev/tty");
    assert!(screen.contains("harness-check"), "no terminal for the test: {screen:?}");
    let exe = std::env::current_exe().expect("the test binary's path");
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("toolmux-tty-{}-{run}.out", std::process::id()));
    let quoted = |path: &Path| {
        let path = path.to_str().expect("a UTF-8 path");
        assert!(!path.contains('\''), "{path}");
        format!("'{path}'")
    };
    // The test's output goes to a file: only what the test's processes write to
    // `/dev/tty` reaches the terminal.
    let command =
        format!("exec {} --exact {test} --nocapture > {} 2>&1", quoted(&exe), quoted(&out));
    let screen = run_in_a_terminal(&command);
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    (stdout, screen)
}
