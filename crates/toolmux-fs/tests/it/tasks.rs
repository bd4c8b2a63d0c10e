//! Background tasks: `bash`/`exec` with `run_in_background`, `task_output`, `task_kill`,
//! `task_list`; lifetimes, limits, runs and the provider's shutdown.

use crate::{Fixture, runs};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use toolmux_core::ToolProvider as _;
use toolmux_fs::BashConfig;

/// A fixture whose task output files go to a directory of their own beside its root, in
/// its temporary directory, so removed with it (a directory kept apart was left behind,
/// empty, by every test).
fn fixture(adjust: impl FnOnce(BashConfig) -> BashConfig) -> Fixture {
    Fixture::with(|c| {
        let spill = c.root.with_file_name("spill");
        let bash = adjust(BashConfig { spill_dir: Some(spill), ..BashConfig::default() });
        c.with_bash(bash)
    })
}

async fn start(fx: &Fixture, command: &str) -> (String, u32, String) {
    let out = fx
        .call("bash", json!({"command": command, "run_in_background": true}))
        .await
        .expect("started");
    assert!(!out.is_error, "{}", out.to_text());
    let id = out.extras["taskId"].as_str().expect("a task id").to_owned();
    let pid = out.extras["pid"].as_u64().expect("a pid") as u32;
    let file = out.extras["outputFile"].as_str().expect("an output file").to_owned();
    (id, pid, file)
}

async fn output(fx: &Fixture, args: Value) -> toolmux_core::ToolOutput {
    fx.call("task_output", args).await.expect("task_output")
}

/// Whether any process of group `pid` is alive.
fn group_alive(pid: u32) -> bool {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    rustix::process::test_kill_process_group(pid).is_ok()
}

async fn wait_group_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while group_alive(pid) {
        assert!(Instant::now() < deadline, "process group {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_background_command_returns_at_once_and_its_output_is_read_as_it_comes() {
    let fx = fixture(|b| b);
    let began = Instant::now();
    let (id, _, file) = start(&fx, "echo first; sleep 1.5; echo second >&2; exit 4").await;
    assert!(began.elapsed() < Duration::from_millis(1200), "{:?}", began.elapsed());
    let first = output(&fx, json!({"task_id": id, "block_ms": 5000})).await;
    let text = first.to_text();
    assert!(text.contains("running for") && text.ends_with("--- output ---\nfirst"), "{text}");
    assert_eq!(first.extras["running"], true);
    assert!(!first.is_error);
    // What was read is not shown again; reading on reaches what followed, then the end.
    let mut later = String::new();
    let last = loop {
        let next = output(&fx, json!({"task_id": id, "block_ms": 5000})).await;
        later.push_str(&next.to_text());
        if next.extras["running"] == false {
            break next;
        }
    };
    let text = last.to_text();
    assert!(text.contains("exited with code 4"), "{text}");
    assert!(later.contains("second") && !later.contains("first"), "{later}");
    assert_eq!(last.extras["exitCode"], 4);
    assert!(last.is_error);
    let again = output(&fx, json!({"task_id": id})).await.to_text();
    assert!(again.ends_with("[no new output]"), "{again}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "first\nsecond\n");
}

#[tokio::test]
async fn task_kill_stops_the_whole_group_and_says_what_was_left_unread() {
    let fx = fixture(|b| b);
    let (id, pid, _) =
        start(&fx, "(sleep 60 & wait) & for i in 1 2 3; do echo tick $i; done; sleep 60").await;
    let seen = output(&fx, json!({"task_id": id, "block_ms": 5000})).await.to_text();
    assert!(seen.contains("tick 1"), "{seen}");
    assert!(group_alive(pid));
    let killed = fx.call("task_kill", json!({"task_id": id})).await.expect("task_kill");
    let text = killed.to_text();
    assert!(text.contains("stopped by task_kill"), "{text}");
    assert_eq!(killed.extras["killed"], true);
    assert!(!killed.is_error);
    wait_group_gone(pid).await;
    let listed = fx.ok("task_list", json!({})).await;
    assert!(listed.contains(&format!("{id} (pid {pid}) stopped by task_kill")), "{listed}");
}

/// Waits for the process whose id is in the file `name` to start, then returns its id.
async fn escapee(fx: &Fixture, name: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(fx.root().join(name)).unwrap_or_default();
        if let Some(pid) = text.strip_suffix('\n').and_then(|p| p.parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < deadline, "`{name}` was not written");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs(pid) {
        assert!(Instant::now() < deadline, "{pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task's processes that left its group (`setsid`) die with it: when it is killed, when
/// it ends, and when the provider goes.
#[tokio::test]
async fn processes_that_left_a_tasks_group_die_with_it() {
    let fx = fixture(|b| b);
    let escape = |file: &str, then: &str| {
        format!("setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {file}; {then}")
    };
    let (id, _, _) = start(&fx, &escape("killed", "sleep 60")).await;
    let killed = escapee(&fx, "killed").await;
    assert!(runs(killed));
    fx.call("task_kill", json!({"task_id": id})).await.expect("task_kill");
    wait_gone(killed).await;
    start(&fx, &escape("ended", "true")).await;
    wait_gone(escapee(&fx, "ended").await).await;
    start(&fx, &escape("dropped", "sleep 60")).await;
    let dropped = escapee(&fx, "dropped").await;
    assert!(runs(dropped));
    let Fixture { fs, temp: _temp } = fx;
    drop(fs);
    wait_gone(dropped).await;
}

#[tokio::test]
async fn filters_keep_matching_lines_and_waiting_ends_at_block_ms() {
    let fx = fixture(|b| b);
    let (id, _, _) = start(&fx, "printf 'ok 1\\nERROR two\\nok 3\\nERROR four\\n'; sleep 30").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = output(&fx, json!({"task_id": id, "filter": "^ERROR"})).await.to_text();
    assert!(out.ends_with("--- output ---\nERROR two\nERROR four"), "{out}");
    // Nothing new: `block_ms` is waited out, not more.
    let began = Instant::now();
    let out = output(&fx, json!({"task_id": id, "block_ms": 300})).await.to_text();
    assert!(out.ends_with("[no new output]"), "{out}");
    let waited = began.elapsed();
    assert!(waited >= Duration::from_millis(290) && waited < Duration::from_secs(3), "{waited:?}");
    let bad = fx.err("task_output", json!({"task_id": id, "filter": "("})).await;
    assert!(bad.contains("`filter`"), "{bad}");
    fx.call("task_kill", json!({"task_id": id})).await.expect("killed");
}

/// A line written in two pieces is matched whole: its start waits for its end (it was
/// matched piece by piece, and lost).
#[tokio::test]
async fn a_filtered_line_written_in_pieces_is_matched_whole() {
    let fx = fixture(|b| b);
    let (id, _, _) = start(&fx, "printf 'ok\nERR'; sleep 1; printf 'OR: boom\n'; sleep 30").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = output(&fx, json!({"task_id": id, "filter": "ERROR"})).await.to_text();
    assert!(first.ends_with("[no new matching output]"), "{first}");
    let second =
        output(&fx, json!({"task_id": id, "filter": "ERROR", "block_ms": 5000})).await.to_text();
    assert!(second.ends_with("--- output ---\nERROR: boom"), "{second}");
    fx.call("task_kill", json!({"task_id": id})).await.expect("killed");
}

#[tokio::test]
async fn a_task_outliving_its_timeout_is_killed() {
    let fx = fixture(|b| b);
    let out = fx
        .call("exec", json!({"argv": ["sleep", "30"], "run_in_background": true, "timeout": 200}))
        .await
        .expect("started");
    let id = out.extras["taskId"].as_str().expect("an id").to_owned();
    let pid = out.extras["pid"].as_u64().expect("a pid") as u32;
    let mut ended = output(&fx, json!({"task_id": id, "block_ms": 5000})).await;
    while ended.extras["running"] == true {
        ended = output(&fx, json!({"task_id": id, "block_ms": 5000})).await;
    }
    assert!(ended.to_text().contains("timed out after 200 ms"), "{}", ended.to_text());
    assert_eq!(ended.extras["timedOut"], true);
    assert!(ended.is_error);
    wait_group_gone(pid).await;
    let long = fx
        .err("bash", json!({"command": "true", "run_in_background": true, "timeout": 99_999_999}))
        .await;
    assert!(long.contains("`bash.maxBackgroundTimeoutMs`"), "{long}");
}

#[tokio::test]
async fn the_number_of_live_tasks_is_capped() {
    let fx = fixture(|b| BashConfig { max_background: 2, ..b });
    let (a, _, _) = start(&fx, "sleep 30").await;
    let (_b, _, _) = start(&fx, "sleep 30").await;
    let refused = fx.err("bash", json!({"command": "sleep 30", "run_in_background": true})).await;
    assert!(refused.contains("`bash.maxBackground`") && refused.contains("task_kill"), "{refused}");
    fx.call("task_kill", json!({"task_id": a})).await.expect("killed");
    let (_c, _, _) = start(&fx, "sleep 30").await;
    fx.fs.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn tasks_started_at_once_stay_within_the_cap() {
    let fx = fixture(|b| BashConfig { max_background: 2, ..b });
    let begin = || fx.call("bash", json!({"command": "sleep 0.5", "run_in_background": true}));
    // Each start awaits (the sandbox's look at what is missing) between its check of the
    // cap and its task's entry: all six are under way at once.
    let calls = tokio::join!(begin(), begin(), begin(), begin(), begin(), begin());
    let calls = [calls.0, calls.1, calls.2, calls.3, calls.4, calls.5];
    let mut started = Vec::new();
    for call in calls {
        match call {
            Ok(out) => started.push(out.extras["taskId"].as_str().expect("an id").to_owned()),
            Err(e) => assert!(e.report().contains("`bash.maxBackground`"), "{}", e.report()),
        }
    }
    assert_eq!(started.len(), 2, "{started:?}");
    for id in started {
        let mut ended = output(&fx, json!({"task_id": id, "block_ms": 5000})).await;
        while ended.extras["running"] != false {
            ended = output(&fx, json!({"task_id": id, "block_ms": 5000})).await;
        }
    }
    // The refused starts left no slot taken.
    let (_a, _, _) = start(&fx, "sleep 0.1").await;
    let (_b, _, _) = start(&fx, "sleep 0.1").await;
    fx.fs.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_run_sees_and_stops_only_its_own_tasks() {
    let fx = fixture(|b| b);
    let started = fx
        .call_in("run-a", "bash", json!({"command": "sleep 30", "run_in_background": true}))
        .await
        .expect("started");
    let id = started.extras["taskId"].as_str().expect("an id").to_owned();
    let other = fx.call_in("run-b", "task_kill", json!({"task_id": id})).await.unwrap_err();
    assert!(other.report().contains(&format!("no background task `{id}`")), "{}", other.report());
    let listed = fx.call_in("run-b", "task_list", json!({})).await.expect("list");
    assert_eq!(listed.to_text(), "no background tasks in this run");
    let listed = fx.call_in("run-a", "task_list", json!({})).await.expect("list");
    assert!(listed.to_text().contains(&id), "{}", listed.to_text());
    fx.call_in("run-a", "task_kill", json!({"task_id": id})).await.expect("killed");
}

#[tokio::test]
async fn shutting_the_provider_down_kills_every_task_and_removes_the_output_files() {
    let fx = fixture(|b| b);
    let (_, pid_a, file_a) = start(&fx, "sleep 30").await;
    let (_, pid_b, _) = start(&fx, "trap '' TERM; sleep 30").await;
    fx.fs.shutdown().await.expect("shutdown");
    wait_group_gone(pid_a).await;
    wait_group_gone(pid_b).await;
    let Fixture { fs, temp: _temp } = fx;
    drop(fs);
    // The file goes with the task's last holder, its watcher, which has just ended.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&file_a).exists() {
        assert!(Instant::now() < deadline, "{file_a} left behind");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn dropping_the_provider_kills_live_groups_too() {
    let fx = fixture(|b| b);
    let (_, pid, _) = start(&fx, "sleep 30").await;
    let Fixture { fs, temp: _temp } = fx;
    drop(fs);
    wait_group_gone(pid).await;
}

#[tokio::test]
async fn a_task_output_file_is_private_and_freshly_named() {
    use std::os::unix::fs::PermissionsExt as _;
    let fx = fixture(|b| b);
    let (first, _, first_file) = start(&fx, "echo one").await;
    let (second, _, second_file) = start(&fx, "echo two").await;
    assert_ne!(first_file, second_file);
    for (id, file) in [(&first, &first_file), (&second, &second_file)] {
        let mode = std::fs::metadata(file).expect("the output file").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
        fx.call("task_kill", json!({"task_id": id})).await.expect("task_kill");
    }
    let name = std::path::Path::new(&first_file).file_name().expect("a name");
    let name = name.to_str().expect("UTF-8");
    assert!(name.starts_with(&format!("task-{}-", std::process::id())), "{name}");
    assert!(name.ends_with(".log"), "{name}");
}

/// `keep_stdin`: a background task reading its input answers each line sent with
/// `task_write_stdin`, and `close` ends its input (end of file).
#[tokio::test]
async fn a_task_started_with_keep_stdin_takes_input_until_it_is_closed() {
    let fx = fixture(|b| b);
    let script = "echo ready; while read -r line; do echo \"got $line\"; done; echo 'input ended'";
    let out = fx
        .call("bash", json!({"command": script, "run_in_background": true, "keep_stdin": true}))
        .await
        .expect("started");
    assert!(out.to_text().contains("fs__task_write_stdin"), "{}", out.to_text());
    let id = out.extras["taskId"].as_str().expect("a task id").to_owned();
    let pid = out.extras["pid"].as_u64().expect("a pid") as u32;
    let first = output(&fx, json!({"task_id": id, "block_ms": 5000})).await.to_text();
    assert!(first.contains("ready"), "{first}");

    let answer = fx
        .call("task_write_stdin", json!({"task_id": id, "input": "hello\n", "block_ms": 5000}))
        .await
        .expect("written")
        .to_text();
    assert!(answer.contains("got hello"), "{answer}");
    assert!(answer.contains("running"), "{answer}");
    let answer = fx
        .call(
            "task_write_stdin",
            json!({"task_id": id, "input": "two\nthree\n", "close": true, "block_ms": 5000}),
        )
        .await
        .expect("written")
        .to_text();
    // Closing the input ends the loop: everything up to the end comes back.
    let all = if answer.contains("input ended") {
        answer
    } else {
        let rest = output(&fx, json!({"task_id": id, "block_ms": 5000})).await.to_text();
        format!("{answer}{rest}")
    };
    assert!(all.contains("got two") && all.contains("got three"), "{all}");
    assert!(all.contains("input ended"), "{all}");
    wait_group_gone(pid).await;

    let closed = fx
        .call("task_write_stdin", json!({"task_id": id, "input": "more\n"}))
        .await
        .expect_err("no more input")
        .report();
    assert!(closed.contains("has ended") || closed.contains("was closed"), "{closed}");
}

#[tokio::test]
async fn input_goes_only_to_tasks_that_keep_it_open() {
    let fx = fixture(|b| b);
    let (id, _, _) = start(&fx, "sleep 30").await;
    let error = fx
        .call("task_write_stdin", json!({"task_id": id, "input": "x\n"}))
        .await
        .expect_err("refused")
        .report();
    assert!(error.contains("was not started with `keep_stdin: true`"), "{error}");
    fx.call("task_kill", json!({"task_id": id})).await.expect("killed");
    let error = fx
        .call("bash", json!({"command": "cat", "keep_stdin": true}))
        .await
        .expect_err("refused")
        .report();
    assert!(error.contains("`keep_stdin` needs `run_in_background: true`"), "{error}");
    let error = fx
        .call("task_write_stdin", json!({"task_id": "task-999", "input": "x"}))
        .await
        .expect_err("unknown")
        .report();
    assert!(error.contains("no background task `task-999`"), "{error}");
}

/// A task that never reads its input: once the pipe is full, the write gives up after a
/// few seconds instead of hanging the call.
#[tokio::test]
async fn a_task_not_reading_its_input_is_reported_not_waited_for() {
    let fx = fixture(|b| b);
    let out = fx
        .call("bash", json!({"command": "sleep 60", "run_in_background": true, "keep_stdin": true}))
        .await
        .expect("started");
    let id = out.extras["taskId"].as_str().expect("a task id").to_owned();
    let big = "x".repeat(1024 * 1024);
    let started = Instant::now();
    let error = fx
        .call("task_write_stdin", json!({"task_id": id, "input": big}))
        .await
        .expect_err("not read")
        .report();
    assert!(error.contains("has not read its input for 5 s"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(15));
    fx.call("task_kill", json!({"task_id": id})).await.expect("killed");
}

/// `tty`: the task runs on a terminal of its own, so programs that test for one act as
/// for a person: `read -p` shows its question, `stty` reads the terminal's size, `tty`
/// names it; what is written is echoed; `close` sends end of file (^D) and `cat` ends.
#[tokio::test]
async fn a_task_on_a_terminal_shows_its_prompts() {
    let fx = fixture(|b| b);
    let script = "if [ -t 0 ] && [ -t 1 ] && [ -t 2 ]; then echo on-a-terminal; fi; \
                  stty size; echo \"TERM=$TERM\"; read -r -p 'your name? ' name; \
                  echo \"hello $name\"; exec cat";
    let out = fx
        .call(
            "exec",
            json!({"argv": ["bash", "-c", script], "run_in_background": true, "tty": true}),
        )
        .await
        .expect("started");
    assert!(out.to_text().contains("fs__task_write_stdin"), "{}", out.to_text());
    let id = out.extras["taskId"].as_str().expect("a task id").to_owned();
    let pid = out.extras["pid"].as_u64().expect("a pid") as u32;
    let mut first = String::new();
    for _ in 0..50 {
        first.push_str(&output(&fx, json!({"task_id": id, "block_ms": 200})).await.to_text());
        if first.contains("your name? ") {
            break;
        }
    }
    assert!(first.contains("on-a-terminal"), "{first}");
    assert!(first.contains("40 120"), "{first}");
    assert!(first.contains("TERM=dumb"), "{first}");
    assert!(first.contains("your name? "), "the question is shown: {first}");
    assert!(!first.contains('\r'), "lines end as text does: {first:?}");

    let answer = fx
        .call("task_write_stdin", json!({"task_id": id, "input": "Ada\n", "block_ms": 5000}))
        .await
        .expect("written")
        .to_text();
    assert!(answer.contains("hello Ada"), "{answer}");
    let answer = fx
        .call(
            "task_write_stdin",
            json!({"task_id": id, "input": "last line\n", "close": true, "block_ms": 5000}),
        )
        .await
        .expect("written")
        .to_text();
    let all = format!(
        "{answer}{}",
        output(&fx, json!({"task_id": id, "block_ms": 5000})).await.to_text()
    );
    // Echoed by the terminal, then printed by `cat`.
    assert!(all.matches("last line").count() >= 2, "{all}");
    wait_group_gone(pid).await;
    let ended = output(&fx, json!({"task_id": id})).await.to_text();
    assert!(ended.contains("exited with code 0"), "{ended}");

    let error = fx
        .call("bash", json!({"command": "cat", "tty": true}))
        .await
        .expect_err("refused")
        .report();
    assert!(error.contains("`tty` needs `run_in_background: true`"), "{error}");
}

/// Python's REPL prints its `>>>` prompt only on a terminal; on one, it answers each line.
#[tokio::test]
async fn a_python_repl_on_a_terminal_prompts_and_answers() {
    let fx = fixture(|b| b);
    let out = fx
        .call("exec", json!({"argv": ["python3", "-q"], "run_in_background": true, "tty": true}))
        .await
        .expect("started");
    let id = out.extras["taskId"].as_str().expect("a task id").to_owned();
    let mut first = String::new();
    for _ in 0..50 {
        first.push_str(&output(&fx, json!({"task_id": id, "block_ms": 200})).await.to_text());
        if first.contains(">>> ") {
            break;
        }
    }
    assert!(first.contains(">>> "), "{first}");
    let answer = fx
        .call("task_write_stdin", json!({"task_id": id, "input": "6 * 7\n", "block_ms": 5000}))
        .await
        .expect("written")
        .to_text();
    assert!(answer.contains("42"), "{answer}");
    fx.call("task_write_stdin", json!({"task_id": id, "input": "", "close": true}))
        .await
        .expect("end of file sent");
    let mut ended = String::new();
    for _ in 0..50 {
        ended = output(&fx, json!({"task_id": id, "block_ms": 200})).await.to_text();
        if ended.contains("exited") {
            break;
        }
    }
    assert!(ended.contains("exited with code 0"), "^D ends the REPL: {ended}");
}

/// A task on a terminal leads a session of its own, whose group `task_kill` kills whole.
#[tokio::test]
async fn a_task_on_a_terminal_is_killed_with_its_processes() {
    let fx = fixture(|b| b);
    let out = fx
        .call(
            "bash",
            json!({"command": "sleep 300 & sleep 300; wait", "run_in_background": true, "tty": true}),
        )
        .await
        .expect("started");
    let id = out.extras["taskId"].as_str().expect("a task id").to_owned();
    let pid = out.extras["pid"].as_u64().expect("a pid") as u32;
    assert!(group_alive(pid));
    fx.call("task_kill", json!({"task_id": id})).await.expect("killed");
    wait_group_gone(pid).await;
    let ended = output(&fx, json!({"task_id": id, "block_ms": 5000})).await.to_text();
    assert!(ended.contains("stopped by task_kill"), "{ended}");
}

/// As in the foreground: what a background task prints through a process substitution is
/// kept, where killing the group at the shell's exit lost it.
#[tokio::test]
async fn a_tasks_output_through_a_process_substitution_is_kept() {
    let fx = fixture(|b| b);
    for _ in 0..3 {
        let (id, _, file) = start(&fx, "exec > >(tr a-z A-Z); echo hello").await;
        let mut text = String::new();
        loop {
            let next = output(&fx, json!({"task_id": id, "block_ms": 5000})).await;
            text.push_str(&next.to_text());
            if next.extras["running"] == false {
                break;
            }
        }
        assert!(text.contains("HELLO"), "{text}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "HELLO\n");
    }
}

/// A task's output reaches the model with its control characters escaped, and binary
/// output as a notice naming the task's output file.
#[tokio::test]
async fn a_tasks_control_characters_are_escaped_and_binary_output_left_out() {
    let fx = fixture(|b| b);
    let (id, _, _) = start(&fx, "printf 'a\\0b\\abell\\n'").await;
    let out = output(&fx, json!({"task_id": id, "block_ms": 5000})).await.to_text();
    assert!(out.ends_with("--- output ---\na\\x00b\\x07bell"), "{out}");
    // After an ESC that starts no escape sequence too.
    let (id, _, _) = start(&fx, "printf 'a\\033\\0b\\n'").await;
    let out = output(&fx, json!({"task_id": id, "block_ms": 5000})).await.to_text();
    assert!(out.ends_with("--- output ---\na\\x1b\\x00b"), "{out}");
    let (id, _, file) = start(&fx, "head -c 4096 /dev/urandom").await;
    let out = output(&fx, json!({"task_id": id, "block_ms": 5000})).await.to_text();
    let notice = format!(
        "--- output ---\n[4096 bytes of binary output left out; all of it is in {file} (look \
         at it with `file {file}`, `xxd {file} | head`)]"
    );
    assert!(out.ends_with(&notice), "{out}");
}
