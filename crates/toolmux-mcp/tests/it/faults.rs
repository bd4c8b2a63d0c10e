//! Fault injection over stdio with the fixture server: crashes, hangs, garbage, slow and
//! failed starts, list changes, cancellation and process-group reaping.

use serde_json::json;
use std::time::{Duration, Instant};
use toolmux_core::{CallContext, ToolError, ToolProvider};
use toolmux_mcp::{DeclaredTool, McpProvider, McpServerConfig};
use toolmux_test_support::conformance::{Conformance, SampleCall};

use crate::support;

/// `message` with the fixture's path and the folder it runs in written `FIXTURE` and
/// `RUN_DIR`, which differ from machine to machine.
fn shown(message: &str) -> String {
    let run_dir = support::run_dir();
    message
        .replace(env!("CARGO_BIN_EXE_toolmux-mcp-fixture"), "FIXTURE")
        .replace(&run_dir.display().to_string(), "RUN_DIR")
}

fn provider(mode: &str) -> McpProvider {
    McpProvider::new("fixture", support::fixture_stdio(mode)).unwrap()
}

async fn call(provider: &McpProvider, tool: &str) -> Result<String, ToolError> {
    provider.call(tool, json!({}), &CallContext::new()).await.map(|out| out.to_text())
}

#[tokio::test]
async fn fixture_passes_the_conformance_suite_with_pagination() {
    let provider = provider("ok");
    Conformance::new()
        .with_sample(
            SampleCall::new("echo", json!({"message": "hi"})).expect_text_contains("echo: hi"),
        )
        .with_sample(
            SampleCall::new("error", json!({})).expect_failure().expect_text_contains("it broke"),
        )
        .with_cancellable(SampleCall::new("slow", json!({})))
        .check(&provider)
        .await;
    // Twenty-one tools over two pages.
    assert_eq!(provider.list_tools().await.unwrap().len(), 22);
    assert_eq!(provider.instructions().as_deref(), Some("fixture instructions"));
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_crash_mid_call_fails_promptly_and_the_next_call_restarts() {
    let provider = provider("ok");
    provider.warmup().await.unwrap();
    let first_pid = provider.server_pid().unwrap();
    let started = Instant::now();
    let err = call(&provider, "crash").await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    expect_test::expect!["fixture: connection closed (server process exit status: 3; its stderr ended: fixture starting in mode ok | crashing on purpose)"]
        .assert_eq(&err.to_string());
    assert!(err.is_transient());
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    let second_pid = provider.server_pid().unwrap();
    assert_ne!(first_pid, second_pid);
    support::assert_group_gone(first_pid).await;
    provider.shutdown().await.unwrap();
    support::assert_group_gone(second_pid).await;
}

#[tokio::test]
async fn restarts_are_bounded() {
    let config = support::fixture_stdio("exit-at-start").with_max_restarts(2);
    let provider = McpProvider::new("fixture", config).unwrap();
    let mut messages = Vec::new();
    for _ in 0..4 {
        messages.push(shown(&call(&provider, "echo").await.unwrap_err().to_string()));
    }
    expect_test::expect![[r#"
        fixture: connection closed (server process exit status: 7; its stderr ended: fixture starting in mode exit-at-start | boom; to see why, run `FIXTURE exit-at-start` by hand in RUN_DIR)
        fixture: connection closed (server process exit status: 7; its stderr ended: fixture starting in mode exit-at-start | boom; to see why, run `FIXTURE exit-at-start` by hand in RUN_DIR)
        fixture: connection closed (server process exit status: 7; its stderr ended: fixture starting in mode exit-at-start | boom; to see why, run `FIXTURE exit-at-start` by hand in RUN_DIR)
        fixture unavailable: given up after 2 failed restarts; tries again in 10 s"#]]
    .assert_eq(&messages.join("\n"));
}

/// A tool that crashes its server on every call never disables the server: each restart
/// starts it fine, so the count of failures in a row starts again (six crashes in a row
/// disabled it for the life of the process, "given up after 5 failed restarts").
#[tokio::test]
async fn a_tool_crashing_its_server_every_time_never_disables_it() {
    let provider = provider("ok");
    for _ in 0..8 {
        let error = call(&provider, "crash").await.unwrap_err().to_string();
        assert!(
            error.starts_with("fixture: connection closed (server process exit status: 3"),
            "{error}"
        );
    }
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    provider.shutdown().await.unwrap();
}

/// A server restarted after a crash is asked for its tools again: what the last process
/// added is gone (the list of the first process was kept for good).
#[tokio::test]
async fn a_restart_lists_the_tools_again_and_tells_of_the_change() {
    let provider = provider("ok");
    provider.warmup().await.unwrap();
    let mut changes = provider.tool_list_changes().expect("list changes are signalled");
    call(&provider, "add_tool").await.unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert_eq!(changed, Ok(true));
    assert!(provider.has_tool("extra").await);
    call(&provider, "crash").await.unwrap_err();
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert_eq!(changed, Ok(true));
    assert!(!provider.has_tool("extra").await, "the new process has no `extra`");
    provider.shutdown().await.unwrap();
}

/// A listing whose next cursor repeats stops there, with every tool read once; it asked
/// for the same page until the request timeout (82,814 requests in a minute).
#[tokio::test]
async fn a_repeated_cursor_ends_the_listing() {
    let provider = provider("repeat-cursor");
    let started = Instant::now();
    assert_eq!(provider.list_tools().await.unwrap().len(), 22);
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_eq!(call(&provider, "page_count").await.unwrap(), "2");
    provider.shutdown().await.unwrap();
}

/// A listing of fresh cursors without end stops after a thousand pages, keeping what it
/// read.
#[tokio::test]
async fn an_endless_listing_stops_after_a_thousand_pages() {
    let provider = provider("endless-cursor");
    assert_eq!(provider.list_tools().await.unwrap().len(), 22);
    assert_eq!(call(&provider, "page_count").await.unwrap(), "1000");
    provider.shutdown().await.unwrap();
}

/// Kills the process whose pid is in the file on drop.
struct KillOnDrop(std::path::PathBuf);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let pid = std::fs::read_to_string(&self.0).ok().and_then(|p| p.trim().parse().ok());
        if let Some(pid) = pid.and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A server that exits leaving a daemon that holds its stdout (out of its group and its
/// environment cleared, so no sweep finds it) is noticed: the call in flight fails at
/// once and the next call starts the server again (calls waited for their timeouts, and
/// it was never restarted).
#[tokio::test]
async fn an_exit_is_noticed_though_a_daemon_holds_stdout() {
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let _daemon = KillOnDrop(pid_file.path().to_owned());
    let config = support::fixture_stdio("ok").with_request_timeout(Duration::from_secs(20));
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    let first = provider.server_pid().unwrap();
    let started = Instant::now();
    let arguments = json!({"pid_file": pid_file.path()});
    let error = provider.call("exit_leaving_daemon", arguments, &CallContext::new()).await;
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    expect_test::expect!["fixture: connection closed (server process exit status: 0; its stderr ended: fixture starting in mode ok; something it started still holds its stdout)"]
        .assert_eq(&error.unwrap_err().to_string());
    let started = Instant::now();
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    assert_ne!(provider.server_pid(), Some(first));
    provider.shutdown().await.unwrap();
}

/// A shutdown landing while a server is still answering its handshake wins: the start
/// under way stops the server, whose process is gone (reaped) once the shutdown returns,
/// and the caller that was starting it is told the provider shut down. The start's
/// process was only signalled after the shutdown had returned, or (a handshake finished
/// just then) stored and kept until the provider was dropped.
#[tokio::test]
async fn a_shutdown_during_a_start_stops_the_server_being_started() {
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let config = support::fixture_stdio("slow-init")
        .with_env("FIXTURE_PID_FILE", pid_file.path().to_str().unwrap());
    let provider = provider_with(config);
    let starting = tokio::spawn({
        let provider = provider.clone();
        async move { provider.warmup().await }
    });
    let read_pid = || std::fs::read_to_string(pid_file.path()).ok()?.trim().parse::<i32>().ok();
    support::wait_for("the server to start", Duration::from_secs(5), || read_pid().is_some()).await;
    let pid = read_pid().unwrap();
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    assert!(proc_dir.exists(), "the server runs its handshake");
    let started = Instant::now();
    provider.shutdown().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert!(!proc_dir.exists(), "server process {pid} remains after the shutdown returned");
    let error = starting.await.unwrap().unwrap_err();
    expect_test::expect!["fixture unavailable: shut down"].assert_eq(&error.to_string());
    assert_eq!(provider.server_pid(), None);
}

fn provider_with(config: McpServerConfig) -> McpProvider {
    McpProvider::new("fixture", config).unwrap()
}

/// The daemonizing script, with its daemon's environment `daemon_env` (`clear` for none).
fn daemonizing(pid_file: &std::path::Path, daemon_env: &str) -> McpProvider {
    let script = support::fixture("daemonizing_server.sh");
    let config = McpServerConfig::stdio("sh", [script.to_str().unwrap()])
        .with_base_dir(support::run_dir())
        .with_protocol(toolmux_mcp::ProtocolMode::Legacy)
        .with_request_timeout(Duration::from_secs(20))
        .with_env("PID_FILE", pid_file.to_str().unwrap())
        .with_env("DAEMON_ENV", daemon_env);
    McpProvider::new("daemonizing", config).unwrap()
}

/// A server that starts a daemon holding its stdout (`setsid sleep 300 >&1 &`) and exits
/// fails the call in flight at once with its exit status, and the daemon is gone
/// afterwards, whether it carries the process mark or not: the reader thread of stdout was
/// blocked in `read` until the daemon exited.
#[tokio::test]
async fn a_server_exit_ends_the_daemon_holding_its_stdout() {
    for daemon_env in ["inherit", "clear"] {
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let _daemon = KillOnDrop(pid_file.path().to_owned());
        let provider = daemonizing(pid_file.path(), daemon_env);
        provider.warmup().await.unwrap();
        let started = Instant::now();
        let error = call(&provider, "leave").await.unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        assert!(error.contains("server process exit status: 4"), "{daemon_env}: {error}");
        let daemon = std::fs::read_to_string(pid_file.path()).unwrap();
        let daemon: i32 = daemon.trim().parse().expect("the daemon's pid is written");
        let gone = || !support::is_running(daemon);
        let what = format!("the daemon ({daemon_env} environment) to be gone");
        support::wait_for(&what, Duration::from_secs(3), gone).await;
        // The reader of the server's stdout, a thread named after the server, ends too.
        let what = format!("the stdout reader to end ({daemon_env} environment)");
        let readers = || support::threads_named("toolmux-mcp-dae").is_empty();
        support::wait_for(&what, Duration::from_secs(3), readers).await;
        provider.shutdown().await.unwrap();
    }
}

/// A server given up on is started again after a pause: once what kept it from starting
/// is back, it works again without restarting toolmux.
#[tokio::test]
async fn a_server_given_up_on_is_tried_again_after_a_pause() {
    let missing = tempfile::NamedTempFile::new().unwrap();
    let path = missing.path().to_str().unwrap().to_owned();
    let config = McpServerConfig::stdio(
        env!("CARGO_BIN_EXE_toolmux-mcp-fixture"),
        ["exit-while", path.as_str()],
    )
    .with_base_dir(support::run_dir())
    .with_max_restarts(1);
    let provider = McpProvider::new("fixture", config).unwrap();
    for _ in 0..2 {
        let error = call(&provider, "echo").await.unwrap_err().to_string();
        assert!(error.contains("exit status: 7"), "{error}");
    }
    let started = Instant::now();
    let error = call(&provider, "echo").await.unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(500), "fails at once");
    expect_test::expect![
        "fixture unavailable: given up after 1 failed restarts; tries again in 10 s"
    ]
    .assert_eq(&error.to_string());
    drop(missing);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    provider.shutdown().await.unwrap();
}

/// A stray line that is not JSON (a print of a library) is skipped and the call answered,
/// as the official SDKs' clients do (it ended the connection).
#[tokio::test]
async fn a_stray_line_on_stdout_is_skipped() {
    let provider = provider("ok");
    provider.warmup().await.unwrap();
    let pid = provider.server_pid();
    assert_eq!(call(&provider, "garbage").await.unwrap(), "after garbage");
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    assert_eq!(provider.server_pid(), pid, "the same server");
    provider.shutdown().await.unwrap();
}

/// A hundred lines in a row that are not messages end the connection with a protocol
/// error naming the last; the next call gets a fresh server.
#[tokio::test]
async fn a_hundred_lines_that_are_not_messages_end_the_connection() {
    let provider = provider("ok");
    let err = call(&provider, "garbage_flood").await.unwrap_err();
    expect_test::expect![
        "fixture: protocol error: 100 stdout lines in a row are not messages, the last is not JSON: `debug line 99`"
    ]
    .assert_eq(&err.to_string());
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    provider.shutdown().await.unwrap();
}

/// A JSON-RPC batch on one line is its messages.
#[tokio::test]
async fn a_batch_on_stdout_is_its_messages() {
    let provider = provider("ok");
    assert_eq!(call(&provider, "batch").await.unwrap(), "from a batch");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_server_that_never_answers_initialize_fails_warmup_after_the_startup_timeout() {
    let config = support::fixture_stdio("no-init").with_startup_timeout(Duration::from_millis(400));
    let provider = McpProvider::new("fixture", config).unwrap();
    let started = Instant::now();
    let err = provider.warmup().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    expect_test::expect!["fixture: no answer to the handshake within 400ms"]
        .assert_eq(&err.to_string());
}

#[tokio::test]
async fn garbage_instead_of_a_handshake_is_named_in_the_startup_error() {
    let config =
        support::fixture_stdio("garbage-init").with_startup_timeout(Duration::from_millis(400));
    let provider = McpProvider::new("fixture", config).unwrap();
    let err = provider.warmup().await.unwrap_err();
    expect_test::expect!["fixture: protocol error: no answer to the handshake within 400ms; the server wrote a line that is not JSON: `Welcome to the fixture server! This is not JSON.`"]
        .assert_eq(&err.to_string());
}

/// A caller that waits the startup timeout for the whole start, as the orchestrator's
/// warmup does (its timer started first), hears what the server wrote: its own timeout
/// won before, and said only that the server did not start.
///
/// The provider gives up 1% of the startup timeout early, at most 100 ms. 10 s gives the
/// whole 100 ms, as the default 30 s does; 1500 ms gave 15 ms, which a machine with both
/// cores busy overran while the server was killed, reaped and swept before the error was
/// returned (now done after it, see the test below).
#[tokio::test]
async fn garbage_is_named_to_a_caller_waiting_as_long_as_the_startup_timeout() {
    let startup = Duration::from_secs(10);
    let config = support::fixture_stdio("garbage-init").with_startup_timeout(startup);
    let provider = McpProvider::new("fixture", config).unwrap();
    let err = tokio::time::timeout(startup, provider.warmup())
        .await
        .expect("the provider's error before the caller's own timeout")
        .unwrap_err();
    expect_test::expect!["fixture: protocol error: no answer to the handshake within 10000ms; the server wrote a line that is not JSON: `Welcome to the fixture server! This is not JSON.`"]
        .assert_eq(&err.to_string());
}

/// The error of a server given up on is returned as soon as it is known, its kill, reap
/// and sweep going on in the background, which the shutdown waits for: here a daemon
/// outside its group and without the process mark holds its stdout and stderr, and the
/// cleanup (the stderr drain, the holder of stdout found and killed) took the error past a
/// caller waiting as long as the startup timeout, 10.3 s and more after the call.
#[tokio::test]
async fn a_startup_error_does_not_wait_for_the_server_to_be_reaped() {
    let startup = Duration::from_secs(10);
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let daemon_file = tempfile::NamedTempFile::new().unwrap();
    let _daemon = KillOnDrop(daemon_file.path().to_owned());
    let script = support::fixture("garbage_lingering_server.sh");
    let config = McpServerConfig::stdio("sh", [script.to_str().unwrap()])
        .with_base_dir(support::run_dir())
        .with_startup_timeout(startup)
        .with_env("PID_FILE", pid_file.path().to_str().unwrap())
        .with_env("DAEMON_PID_FILE", daemon_file.path().to_str().unwrap());
    let provider = McpProvider::new("lingering", config).unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(startup, provider.warmup())
        .await
        .expect("the provider's error before the caller's own timeout")
        .unwrap_err();
    let took = started.elapsed();
    // Given up on 100 ms before the startup timeout; half of that is left over.
    assert!(took < startup - Duration::from_millis(50), "took {took:?}");
    expect_test::expect!["lingering: protocol error: no answer to the handshake within 10000ms; the server wrote a line that is not JSON: `Hello from the lingering server, not JSON.`"]
        .assert_eq(&err.to_string());
    let pid: i32 = std::fs::read_to_string(pid_file.path()).unwrap().trim().parse().unwrap();
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    provider.shutdown().await.unwrap();
    assert!(!proc_dir.exists(), "server process {pid} not reaped when the shutdown returned");
}

#[tokio::test]
async fn a_slow_initialize_within_the_startup_timeout_works() {
    let config = support::fixture_stdio("slow-init").with_startup_timeout(Duration::from_secs(10));
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    provider.shutdown().await.unwrap();
}

/// A server that reads nothing for 11 s, longer than rmcp waits for the answer to
/// `server/discover` before it sends `initialize`: the late answer to the probe is not
/// taken for the handshake's, so the server starts once and is used (it was killed and
/// started again, and one slower than 15 s never came up).
#[tokio::test]
async fn a_server_slower_to_start_than_the_protocol_probe_is_started_once() {
    let starts = tempfile::NamedTempFile::new().unwrap();
    let path = starts.path().to_str().unwrap().to_owned();
    let config = McpServerConfig::stdio(
        env!("CARGO_BIN_EXE_toolmux-mcp-fixture"),
        ["slow-start", path.as_str()],
    )
    .with_base_dir(support::run_dir())
    .with_startup_timeout(Duration::from_secs(40));
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "started\n", "started once");
    provider.shutdown().await.unwrap();
}

/// A server that answers `server/discover` with `{}` is started again for the `initialize`
/// handshake (`protocol: auto`); one that holds a lock while it runs (a pidfile, a fixed
/// port) and cannot start while another holds it starts the second time, as the first
/// process is killed and reaped before the second starts.
#[tokio::test]
async fn the_retry_with_initialize_starts_once_the_first_server_is_gone() {
    let lock = tempfile::NamedTempFile::new().unwrap();
    for round in 0..10 {
        let config = support::fixture_stdio("discover-empty")
            .with_env("FIXTURE_LOCK_FILE", lock.path().to_str().unwrap())
            .with_startup_timeout(Duration::from_secs(20));
        let provider = provider_with(config);
        let started = provider.warmup().await;
        assert!(started.is_ok(), "round {round}: {started:?}");
        assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ", "round {round}");
        provider.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_server_exiting_at_start_names_its_exit_status() {
    let provider = provider("exit-at-start");
    let err = provider.warmup().await.unwrap_err();
    expect_test::expect!["fixture: connection closed (server process exit status: 7; its stderr ended: fixture starting in mode exit-at-start | boom; to see why, run `FIXTURE exit-at-start` by hand in RUN_DIR)"]
        .assert_eq(&shown(&err.to_string()));
}

#[tokio::test]
async fn a_hung_call_times_out_and_sends_cancelled() {
    let config = support::fixture_stdio("ok").with_request_timeout(Duration::from_millis(300));
    let provider = McpProvider::new("fixture", config).unwrap();
    let err = call(&provider, "hang").await.unwrap_err();
    assert!(matches!(err, ToolError::Timeout { .. }), "{err:?}");
    let ids = call(&provider, "cancelled_ids").await.unwrap();
    assert_ne!(ids, "[]", "the server saw notifications/cancelled");
    provider.shutdown().await.unwrap();
}

/// A call that reported progress and then went quiet times out saying how long it ran and
/// how long it went without progress (the request timeout each report restarted).
#[tokio::test]
async fn a_stalled_call_says_how_long_it_went_without_progress() {
    let config = support::fixture_stdio("ok").with_request_timeout(Duration::from_millis(300));
    let provider = McpProvider::new("fixture", config).unwrap();
    let sink = toolmux_core::ProgressSink::new(|_| {});
    let ctx = CallContext::new().with_progress(sink);
    let err = provider.call("stall", json!({}), &ctx).await.unwrap_err();
    let ToolError::Timeout { after, idle, .. } = &err else { panic!("{err:?}") };
    assert_eq!(*idle, Some(Duration::from_millis(300)), "{err}");
    assert!(*after >= Duration::from_millis(300), "{err}");
    assert!(err.to_string().contains("(it went 300ms without progress or an answer)"), "{err}");
    // Without progress, the limit alone.
    let err = call(&provider, "hang").await.unwrap_err();
    assert_eq!(err.to_string(), "timeout: `hang` did not finish within 300ms");
    provider.shutdown().await.unwrap();
}

/// A call in flight when the provider shuts down tells the server why it stops waiting.
#[tokio::test]
async fn a_shutdown_tells_the_server_why_a_call_is_abandoned() {
    let reasons = tempfile::NamedTempFile::new().unwrap();
    let config = support::fixture_stdio("ok")
        .with_env("FIXTURE_CANCEL_LOG", reasons.path().to_str().unwrap());
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    let hung = {
        let provider = provider.clone();
        tokio::spawn(async move { call(&provider, "hang").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    provider.shutdown().await.unwrap();
    let err = hung.await.unwrap().unwrap_err();
    assert!(matches!(err, ToolError::Unavailable { .. }), "{err:?}");
    assert_eq!(std::fs::read_to_string(reasons.path()).unwrap(), "the client is shutting down\n");
}

#[tokio::test]
async fn cancelling_a_call_sends_cancelled_to_the_server() {
    let provider = provider("ok");
    provider.warmup().await.unwrap();
    let ctx = CallContext::new();
    let token = ctx.cancel_token().clone();
    let slow = {
        let provider = provider.clone();
        tokio::spawn(async move { provider.call("slow", json!({}), &ctx).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    token.cancel();
    let err = slow.await.unwrap().unwrap_err();
    assert!(matches!(err, ToolError::Cancelled { .. }), "{err:?}");
    let ids = call(&provider, "cancelled_ids").await.unwrap();
    // Calls go on the connection's direct lane, whose request ids are `tm-N`.
    assert!(ids.starts_with("[\"tm-"), "{ids}");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn list_changed_refreshes_the_list_and_notifies() {
    let provider = provider("ok");
    provider.warmup().await.unwrap();
    let mut changes = provider.tool_list_changes().expect("list changes are signalled");
    assert!(!provider.has_tool("extra").await);
    call(&provider, "add_tool").await.unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert_eq!(changed, Ok(true));
    assert!(provider.has_tool("extra").await);
    assert_eq!(call(&provider, "extra").await.unwrap(), "extra");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_burst_of_list_changed_is_one_refresh() {
    let provider = provider("ok");
    provider.warmup().await.unwrap();
    let mut changes = provider.tool_list_changes().expect("list changes are signalled");
    let before: usize = call(&provider, "list_count").await.unwrap().parse().unwrap();
    call(&provider, "add_tool_burst").await.unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(5), changes.changed()).await;
    assert_eq!(changed, Ok(true));
    assert!(provider.has_tool("extra").await);
    // Longer than the refresher's quiet time and its longest wait: a second refresh would
    // have started by now.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after: usize = call(&provider, "list_count").await.unwrap().parse().unwrap();
    assert_eq!(after - before, 1, "four list_changed in a burst, one tools/list");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_kills_grandchildren_in_the_group() {
    let provider = provider("ok");
    let grandchild: i32 = call(&provider, "spawn_child").await.unwrap().parse().unwrap();
    let pgid = provider.server_pid().unwrap();
    assert!(support::group_members(pgid).contains(&grandchild));
    provider.shutdown().await.unwrap();
    support::assert_group_gone(pgid).await;
    assert!(support::zombie_children().is_empty());
}

/// A process the server put in a group of its own is found by the mark in its
/// environment and killed before the shutdown returns.
#[tokio::test]
async fn shutdown_kills_what_left_the_group() {
    let provider = provider("ok");
    let spawned = provider
        .call("spawn_child", json!({"leave_group": true}), &CallContext::new())
        .await
        .unwrap()
        .to_text();
    let escapee: i32 = spawned.parse().unwrap();
    let pgid = provider.server_pid().unwrap();
    assert!(!support::group_members(pgid).contains(&escapee));
    assert!(support::group_members(escapee).contains(&escapee), "it runs, in its own group");
    provider.shutdown().await.unwrap();
    // Killed by now; init reaps it, as its parent is gone.
    support::assert_group_gone(escapee).await;
}

#[tokio::test]
async fn dropping_the_provider_kills_the_group() {
    let provider = provider("ok");
    call(&provider, "spawn_child").await.unwrap();
    let pgid = provider.server_pid().unwrap();
    drop(provider);
    support::assert_group_gone(pgid).await;
    support::wait_for("the child to be reaped", Duration::from_secs(5), || {
        support::zombie_children().is_empty()
    })
    .await;
}

#[tokio::test]
async fn declared_tools_are_listed_before_a_lazy_server_starts() {
    let config = support::fixture_stdio("ok").with_lazy(true).with_declared_tool(DeclaredTool {
        name: "echo".into(),
        title: Some("Echo".into()),
        description: "Echo, as declared".into(),
        input_schema: None,
    });
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    assert!(provider.server_pid().is_none(), "lazy: not started by warmup");
    let tools = provider.list_tools().await.unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].description, "Echo, as declared");
    assert_eq!(tools[0].title.as_deref(), Some("Echo"));
    assert!(provider.server_pid().is_none(), "listing declared tools starts nothing");
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    assert!(provider.server_pid().is_some(), "started on first use");
    assert_eq!(provider.list_tools().await.unwrap().len(), 22);
    provider.shutdown().await.unwrap();
}

/// A server that cannot start still offers the tools its configuration declares (as
/// Codex's `mcp.yml` `provides_tools` say), and each call says why it cannot run.
#[tokio::test]
async fn declared_tools_are_listed_when_the_server_cannot_start() {
    let config = support::fixture_stdio("exit-at-start").with_declared_tool(DeclaredTool {
        name: "lookup".into(),
        title: None,
        description: "Looks things up".into(),
        input_schema: None,
    });
    let declared = McpProvider::new("fixture", config).unwrap();
    assert!(declared.warmup().await.is_err());
    // What the orchestrator lists for a provider whose warmup failed, without asking it.
    let names: Vec<String> = declared.declared_tools().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["lookup"]);
    let tools = declared.list_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["lookup"]);
    assert!(tools[0].annotations.destructive, "MCP's defaults until the server says");
    let err = call(&declared, "lookup").await.unwrap_err();
    assert!(err.report().contains("exit status: 7"), "{}", err.report());
    // Without declared tools the failure is the listing's.
    let bare = provider("exit-at-start");
    assert!(bare.declared_tools().is_empty());
    assert!(bare.list_tools().await.is_err());
}

/// A lazy server's prompts and resources are listed once it runs, and whoever follows the
/// lists (the gateway, and through it its clients) is told when they appear.
#[tokio::test]
async fn a_lazy_servers_prompts_and_resources_appear_when_it_starts() {
    let config = support::everything_stdio().with_lazy(true).with_declared_tool(DeclaredTool {
        name: "echo".into(),
        title: None,
        description: "Echoes".into(),
        input_schema: None,
    });
    let provider = McpProvider::new("everything", config).unwrap();
    provider.warmup().await.unwrap();
    assert!(provider.list_prompts().await.unwrap().is_empty());
    assert!(provider.list_resources().await.unwrap().is_empty());
    assert!(provider.server_pid().is_none(), "listing starts nothing");
    let mut prompts = provider.prompt_list_changes().expect("prompt list changes");
    let mut resources = provider.resource_list_changes().expect("resource list changes");
    let out = provider.call("echo", json!({"message": "hi"}), &CallContext::new()).await;
    assert!(out.unwrap().to_text().contains("hi"));
    let both = async { prompts.changed().await && resources.changed().await };
    assert!(tokio::time::timeout(Duration::from_secs(10), both).await.unwrap());
    assert!(!provider.list_prompts().await.unwrap().is_empty());
    assert!(!provider.list_resources().await.unwrap().is_empty());
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_large_result_arrives_whole() {
    let provider = provider("ok");
    let out = provider.call("big", json!({"bytes": 8 << 20}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text().len(), 8 << 20);
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn env_values_never_reach_errors() {
    let config = support::fixture_stdio("exit-at-start").with_env("SECRET_TOKEN", "hunter2-secret");
    let provider = McpProvider::new("fixture", config).unwrap();
    let err = provider.warmup().await.unwrap_err();
    assert!(!err.report().contains("hunter2"), "{}", err.report());
}

#[tokio::test]
async fn a_disabled_server_lists_nothing_and_starts_nothing() {
    let mut config = support::fixture_stdio("ok");
    config.enabled = Some(false);
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    assert!(provider.list_tools().await.unwrap().is_empty());
    let err = call(&provider, "echo").await.unwrap_err();
    expect_test::expect!["fixture unavailable: disabled in the configuration (`enabled: false`)"]
        .assert_eq(&err.to_string());
    assert!(provider.server_pid().is_none());
}

/// A server that stops reading its stdin cannot hold a call past its timeout, even when
/// the call's request is too large for the pipe: the half-written request closes the
/// pipe, and the next call starts the server afresh.
#[tokio::test]
async fn a_server_that_stops_reading_cannot_hold_a_call_past_its_timeout() {
    let config = support::fixture_stdio("ok").with_request_timeout(Duration::from_millis(300));
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    let first_pid = provider.server_pid().unwrap();
    let err = call(&provider, "deaf").await.unwrap_err();
    assert!(matches!(err, ToolError::Timeout { .. }), "{err:?}");
    // Far more than a pipe holds: the write blocks until the call gives up.
    let big = json!({"message": "x".repeat(4 << 20)});
    let started = Instant::now();
    let err = provider.call("echo", big, &CallContext::new()).await.unwrap_err();
    assert!(matches!(err, ToolError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    // The connection is given up; the next call runs on a new server process.
    let started = Instant::now();
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_ne!(provider.server_pid(), Some(first_pid));
    provider.shutdown().await.unwrap();
}

/// An answer to a call that is no JSON-RPC response (an error whose code is a string, an
/// error that is a string) fails that call at once, naming the server and what it
/// wrote, instead of leaving it to wait for its timeout; the connection goes on.
#[tokio::test]
async fn a_malformed_answer_fails_its_call_at_once() {
    let config = support::fixture_stdio("ok").with_request_timeout(Duration::from_secs(30));
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    let pid = provider.server_pid();
    for (malformed, expected) in [
        (
            "error",
            expect_test::expect![[
                r#"error fails: fixture: protocol error: the answer to tools/call is not a JSON-RPC message: `{"error":{"code":"E_BROKEN","message":"it broke"},"id":"tm-1","jsonrpc":"2.0"}`"#
            ]],
        ),
        (
            "string",
            expect_test::expect![[
                r#"error fails: fixture: protocol error: the answer to tools/call is not a JSON-RPC message: `{"error":"it broke","id":"tm-2","jsonrpc":"2.0"}`"#
            ]],
        ),
    ] {
        let started = Instant::now();
        let arguments = json!({"malformed": malformed});
        let error = provider.call("error", arguments, &CallContext::new()).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        expected.assert_eq(&format!("error fails: {}", error.report()));
    }
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    assert_eq!(provider.server_pid(), pid, "the same server answers");
    provider.shutdown().await.unwrap();
}

/// A call whose future is dropped (not cancelled: a caller's own timeout, say) still tells
/// the server, which may stop the work.
#[tokio::test]
async fn dropping_a_call_sends_cancelled_to_the_server() {
    let provider = provider("ok");
    provider.warmup().await.unwrap();
    let dropped = tokio::time::timeout(Duration::from_millis(150), call(&provider, "slow")).await;
    assert!(dropped.is_err(), "the call was still running");
    let started = Instant::now();
    loop {
        let ids = call(&provider, "cancelled_ids").await.unwrap();
        if ids.starts_with("[\"tm-") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "no cancellation seen: {ids}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    provider.shutdown().await.unwrap();
}

/// A server that cannot be started is named with what to fix, not only the OS's "No such
/// file or directory" (which a missing program, a missing working directory and a script's
/// missing interpreter all give).
#[tokio::test]
async fn a_server_that_cannot_start_says_why() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("toolmux-spawn-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = |name: &str, text: &str, mode: u32| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    script("no-interpreter.sh", "#!/nonexistent/interpreter\n", 0o755);
    script("not-executable.sh", "#!/bin/sh\n", 0o644);
    let shown = dir.display().to_string();
    let report = |config: McpServerConfig| {
        let shown = shown.clone();
        async move {
            let provider = McpProvider::new("x", config.with_max_restarts(0)).unwrap();
            let error = provider.warmup().await.unwrap_err().report();
            provider.shutdown().await.unwrap();
            error.replace(&shown, "DIR")
        }
    };
    let stdio =
        |program: &str| McpServerConfig::stdio(program, Vec::<String>::new()).with_base_dir(&dir);
    expect_test::expect!["x: cannot connect over stdio: cannot start `toolmux-no-such-program`: no such program in PATH (install it, or give its full path in `command`)"]
        .assert_eq(&report(stdio("toolmux-no-such-program")).await);
    expect_test::expect![
        "x: cannot connect over stdio: cannot start `./missing.sh`: no such file (check `command`)"
    ]
    .assert_eq(&report(stdio("./missing.sh")).await);
    expect_test::expect!["x: cannot connect over stdio: cannot start `./no-interpreter.sh`: the interpreter on its `#!` line was not found"]
        .assert_eq(&report(stdio("./no-interpreter.sh")).await);
    expect_test::expect!["x: cannot connect over stdio: cannot start `./not-executable.sh`: permission denied (is it an executable file?)"]
        .assert_eq(&report(stdio("./not-executable.sh")).await);
    expect_test::expect!["x: cannot connect over stdio: cannot start `sh`: its working directory DIR/gone does not exist (check `cwd`)"]
        .assert_eq(&report(stdio("sh").with_cwd(dir.join("gone"))).await);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An HTTP server that cannot be reached says so, with the cause and the URL without its
/// query (which may carry a secret), without rmcp's transport type names, and is not
/// retried with the other handshake.
#[tokio::test]
async fn an_unreachable_http_server_says_why() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/mcp?key=sekrit");
    let config = McpServerConfig::remote(toolmux_mcp::TransportKind::Http, url);
    let provider = McpProvider::new("h", config.with_max_restarts(0)).unwrap();
    let error = provider.warmup().await.unwrap_err().report();
    provider.shutdown().await.unwrap();
    let error = error.replace(&port.to_string(), "PORT");
    expect_test::expect!["h: cannot connect over http: cannot reach http://127.0.0.1:PORT/mcp: Connection refused (os error 111); is the server running, and is `url` right?"]
    .assert_eq(&error);
}

/// A legacy SSE server that cannot be reached, or whose event stream is refused with a
/// status, is named without the URL, which may carry a secret, as streamable HTTP's is.
#[tokio::test]
async fn an_sse_server_that_cannot_be_reached_or_refuses_says_why_without_the_url() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = axum::Router::new().route(
        "/broken",
        axum::routing::get(|| async { (axum::http::StatusCode::BAD_GATEWAY, "upstream down") }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let report = |url: String| async move {
        let config = McpServerConfig::remote(toolmux_mcp::TransportKind::Sse, url);
        let provider = McpProvider::new("s", config.with_max_restarts(0)).unwrap();
        let error = provider.warmup().await.unwrap_err().report();
        provider.shutdown().await.unwrap();
        error
    };
    expect_test::expect![
        "s: cannot connect over sse: cannot reach the server: Connection refused (os error 111)"
    ]
    .assert_eq(&report(format!("{closed}/sse?key=sekrit")).await);
    expect_test::expect!["s: cannot connect over sse: the server answered HTTP 502 Bad Gateway"]
        .assert_eq(&report(format!("{base}/broken?key=sekrit")).await);
    expect_test::expect!["s: cannot connect over sse: the server answered HTTP 404 Not Found; is `url` the server's SSE endpoint?"]
        .assert_eq(&report(format!("{base}/elsewhere?key=sekrit")).await);
    server.abort();
}

/// A legacy SSE server whose event never ends (a runaway stream) ends its connection with
/// a protocol error once the event passes the bound any message has, as a stdio server's
/// line does, instead of growing the client's memory until the startup timeout.
#[tokio::test]
async fn an_sse_event_without_end_is_a_protocol_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/sse", listener.local_addr().unwrap());
    let router = axum::Router::new()
        .route(
            "/sse",
            axum::routing::get(|| async {
                let start = bytes::Bytes::from_static(b"event: endpoint\ndata: /message\n\ndata: ");
                let megabyte = bytes::Bytes::from(vec![b'x'; 1 << 20]);
                // Bounded, so that a client without the bound is not fed for ever.
                let chunks = std::iter::once(start).chain(std::iter::repeat_n(megabyte, 300));
                let stream = futures::stream::iter(chunks.map(Ok::<_, std::convert::Infallible>));
                ([("content-type", "text/event-stream")], axum::body::Body::from_stream(stream))
            }),
        )
        .route("/message", axum::routing::post(|| async { axum::http::StatusCode::ACCEPTED }));
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let config = McpServerConfig::remote(toolmux_mcp::TransportKind::Sse, url)
        .with_startup_timeout(Duration::from_secs(60));
    let provider = McpProvider::new("s", config.with_max_restarts(0)).unwrap();
    let error = provider.warmup().await.unwrap_err().report();
    provider.shutdown().await.unwrap();
    expect_test::expect!["s: protocol error: the event stream carried an event of over 128 MiB, more than any message may be"]
        .assert_eq(&error);
    server.abort();
}

/// An HTTP server that refuses the handshake gets a hint at what to fix: credentials for a
/// 401, the endpoint's path for a 404.
#[tokio::test]
async fn an_http_handshake_refused_with_a_status_says_what_to_check() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = axum::Router::new().route(
        "/locked",
        axum::routing::post(|| async {
            (
                axum::http::StatusCode::UNAUTHORIZED,
                [("www-authenticate", "Bearer realm=\"mcp\"")],
                "no",
            )
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let report = |path: &str| {
        let url = format!("{base}{path}");
        async move {
            let config = McpServerConfig::remote(toolmux_mcp::TransportKind::Http, url);
            let provider = McpProvider::new("h", config.with_max_restarts(0)).unwrap();
            let error = provider.warmup().await.unwrap_err().report();
            provider.shutdown().await.unwrap();
            error
        }
    };
    expect_test::expect![[r#"h unavailable: not authorized: the server asks for authorization and publishes no OAuth metadata: give its token in `headers` (for example `Authorization: Bearer ${TOKEN}`), or, if it follows the 2025-03-26 OAuth defaults, run `toolmux mcp login h`"#]]
        .assert_eq(&report("/locked").await);
    expect_test::expect!["h: handshake failed: BASE/elsewhere answered HTTP 404 Not Found; is `url` the server's MCP endpoint?"]
        .assert_eq(&report("/elsewhere").await.replace(&base, "BASE"));
    server.abort();
}

/// MCP's stdio shutdown: stdin closed, then SIGTERM for a server that does not exit, and
/// only then SIGKILL. This server keeps running after its input ends and saves something
/// when asked to stop, as a server flushing its state would.
#[tokio::test]
async fn a_server_that_outlives_its_input_is_asked_to_stop_before_it_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mark = dir.path().join("terminated");
    let script = format!(
        "trap 'echo saved > {mark}; exit 0' TERM; {fixture} ok; sleep 30 & wait",
        mark = mark.display(),
        fixture = env!("CARGO_BIN_EXE_toolmux-mcp-fixture"),
    );
    let config = McpServerConfig::stdio("sh", ["-c".to_owned(), script])
        .with_base_dir(dir.path().to_path_buf());
    let provider = McpProvider::new("stubborn", config).unwrap();
    assert_eq!(call(&provider, "echo").await.unwrap(), "echo: ");
    let pgid = provider.server_pid().unwrap();
    let started = Instant::now();
    provider.shutdown().await.unwrap();
    support::assert_group_gone(pgid).await;
    assert_eq!(std::fs::read_to_string(&mark).unwrap(), "saved\n");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

/// A call cancelled, or dropped, while its server is still starting (it never answers the
/// handshake) leaves no process behind.
#[tokio::test]
async fn a_call_given_up_during_the_handshake_leaves_no_process() {
    for drop_it in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!(
            "echo $$ > {}; exec {} no-init",
            pid_file.display(),
            env!("CARGO_BIN_EXE_toolmux-mcp-fixture")
        );
        let config = McpServerConfig::stdio("sh", ["-c".to_owned(), script])
            .with_base_dir(dir.path().to_path_buf())
            .with_startup_timeout(Duration::from_secs(60));
        let provider = McpProvider::new("starting", config).unwrap();
        let cancel = tokio_util::sync::CancellationToken::new();
        let ctx = CallContext::new().with_cancel(cancel.clone());
        let calling = provider.call("echo", json!({}), &ctx);
        let pid = async {
            support::wait_for("the server's pid", Duration::from_secs(10), || {
                std::fs::read_to_string(&pid_file).is_ok_and(|t| t.ends_with('\n'))
            })
            .await;
            std::fs::read_to_string(&pid_file).unwrap().trim().parse::<i32>().unwrap()
        };
        let pid = if drop_it {
            tokio::select! {
                _ = calling => panic!("the call ended"),
                pid = pid => pid,
            }
        } else {
            let (result, pid) = tokio::join!(calling, async {
                let pid = pid.await;
                cancel.cancel();
                pid
            });
            assert!(matches!(result, Err(ToolError::Cancelled { .. })), "{result:?}");
            pid
        };
        support::assert_group_gone(pid).await;
        provider.shutdown().await.unwrap();
    }
}

/// A server that closes its stdout but keeps running (a library closed fd 1) is stopped at
/// once: the call waiting on it fails promptly saying so, the process is killed and reaped
/// without another call (SIGTERM, then SIGKILL for one that ignores it), and the next call
/// starts the server again. It lived, and held its call, until the next call noticed.
#[tokio::test]
async fn a_server_that_closes_its_stdout_is_stopped_and_reaped_at_once() {
    let script = support::fixture("closing_server.py").display().to_string();
    let config = McpServerConfig::stdio(support::python().display().to_string(), [script])
        .with_base_dir(support::run_dir())
        .with_protocol(toolmux_mcp::ProtocolMode::Legacy)
        .with_request_timeout(Duration::from_secs(20));
    let provider = McpProvider::new("closing", config).unwrap();
    for ignore_term in [false, true] {
        let first = call(&provider, "echo").await.unwrap();
        let pid = provider.server_pid().unwrap();
        assert_eq!(first, format!("echo from {pid}"));
        let started = Instant::now();
        let arguments = json!({"ignore_term": ignore_term});
        let error = provider.call("close_stdout", arguments, &CallContext::new()).await;
        assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
        expect_test::expect!["closing: connection closed (the server closed its stdout; it is being stopped, and the next call starts it again)"]
            .assert_eq(&error.unwrap_err().to_string());
        // Reaped: a zombie would still have its /proc entry.
        let proc = std::path::PathBuf::from(format!("/proc/{pid}"));
        support::wait_for("the server to be reaped", Duration::from_secs(5), || !proc.exists())
            .await;
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
        let next = call(&provider, "echo").await.unwrap();
        assert_ne!(provider.server_pid(), Some(pid), "{next}");
    }
    provider.shutdown().await.unwrap();
}
