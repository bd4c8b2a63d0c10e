//! Stdio servers of a toolmux that runs in a terminal cannot reach it: this test binary
//! runs its own test again in a fresh session on a pseudo-terminal.

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

/// A stdio server started by a toolmux that has a controlling terminal (its CLI, an
/// agent's TUI) is in a session of its own: in toolmux's session, `read < /dev/tty`
/// stopped it (`SIGTTIN`, its group not the terminal's foreground one) until the startup
/// timeout, and its writes to `/dev/tty` landed on the user's screen.
#[test]
fn stdio_servers_of_a_toolmux_in_a_terminal_cannot_reach_it() {
    let test = "terminal::stdio_servers_cannot_open_the_controlling_terminal";
    let (stdout, screen) = toolmux_test_support::terminal::rerun_in_a_terminal(test);
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(!screen.contains("scribble"), "{screen:?}");
}
