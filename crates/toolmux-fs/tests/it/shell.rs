//! `bash` and `exec`: output, exit codes, timeouts, process groups, caps, allow-lists.

use crate::{Fixture, runs};
use expect_test::expect;
use serde_json::json;
use std::time::{Duration, Instant};
use toolmux_fs::BashConfig;
use toolmux_test_support::procs::live_in_group;

#[tokio::test]
async fn stdout_stderr_and_exit_code_separately() {
    let fx = Fixture::new();
    let out = fx
        .call("bash", json!({"command": "echo out; echo err >&2; exit 3", "description": "test"}))
        .await
        .unwrap();
    expect![[r#"
        exit code 3
        --- stdout ---
        out
        --- stderr ---
        err"#]]
    .assert_eq(&out.to_text());
    assert!(out.is_error);
    assert_eq!(out.extras["exitCode"], 3);
}

#[tokio::test]
async fn runs_in_the_root_with_stdin_closed() {
    let fx = Fixture::new();
    let out = fx.ok("bash", json!({"command": "pwd; cat; echo done"})).await;
    let root = std::fs::canonicalize(fx.root()).unwrap();
    assert_eq!(out, format!("exit code 0\n--- stdout ---\n{}\ndone", root.display()));
}

#[tokio::test]
async fn the_environment_holds_only_path_home_lang_and_the_mark() {
    let fx = Fixture::new();
    let out = fx.call("exec", json!({"argv": ["env"]})).await.unwrap();
    let text = out.to_text();
    let names: Vec<&str> = text
        .lines()
        .skip(2)
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .collect();
    let allowed = ["PATH", "HOME", "LANG", toolmux_core::PROCESS_MARK_VAR];
    assert!(names.iter().all(|n| allowed.contains(n)), "{names:?}");
    assert!(names.contains(&toolmux_core::PROCESS_MARK_VAR), "{text}");
    assert!(names.contains(&"PATH"), "{text}");
}

#[tokio::test]
async fn exec_takes_argv_without_a_shell() {
    let fx = Fixture::new();
    let out = fx.ok("exec", json!({"argv": ["echo", "$HOME", "a;b"]})).await;
    assert_eq!(out, "exit code 0\n--- stdout ---\n$HOME a;b");
    expect!["invalid arguments for `fs__exec`: at /: `argv` is empty: give the program and its arguments"]
        .assert_eq(&fx.err("exec", json!({"argv": []})).await);
    let err = fx.err("exec", json!({"argv": ["/no/such/program"]})).await;
    expect![
        "failed to start a command: No such file or directory (os error 2): `/no/such/program`"
    ]
    .assert_eq(&err);
}

/// A command line too long for the kernel (6 MB of `ls x x …`) fails saying why first, with
/// what to do, and shows only the start of the command: the whole of it, echoed, filled
/// the message and a client's cap cut the reason off.
#[tokio::test]
async fn a_command_too_long_to_start_says_why_before_an_excerpt() {
    let fx = Fixture::new();
    let command = format!("ls{}", " x".repeat(3_000_000));
    let err = fx.err("bash", json!({"command": command})).await;
    assert!(err.len() < 1_000, "{} bytes: {}", err.len(), &err[..1_000]);
    expect!["failed to start a command: Argument list too long (os error 7): the command is 6000002 bytes, and the kernel takes at most 128 KiB in one argument (`bash -c` passes the whole line as one) and about 2 MiB in all; write the long part to a file and have the command read it: `ls x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x x… (6000002 bytes in all)`"]
        .assert_eq(&err);
}

#[tokio::test]
async fn timeouts_are_checked() {
    let fx = Fixture::new();
    expect!["invalid arguments for `fs__bash`: at /: timeout 600001 ms is out of range: give 1 to 600000 ms"]
        .assert_eq(&fx.err("bash", json!({"command": "true", "timeout": 600001})).await);
}

/// A command that runs out of time gets `SIGTERM` first and a moment to clean up (its
/// trap runs and what it prints is kept); one that ignores it is killed after the grace.
#[tokio::test]
async fn a_timed_out_command_is_asked_to_stop_before_it_is_killed() {
    let fx = Fixture::new();
    let out = fx
        .call(
            "bash",
            json!({"command": "trap 'echo cleaning up; rm -f lock; exit 3' TERM; touch lock; \
                   echo working; sleep 1000 & wait", "timeout": 500}),
        )
        .await
        .unwrap();
    let text = out.to_text();
    assert_eq!(out.extras["timedOut"], true, "{text}");
    assert!(text.contains("working") && text.contains("cleaning up"), "{text}");
    assert!(!fx.root().join("lock").exists(), "the trap did not run");
    let started = Instant::now();
    let out = fx
        .call("bash", json!({"command": "trap '' TERM; sleep 1000 & wait", "timeout": 300}))
        .await
        .unwrap();
    assert_eq!(out.extras["timedOut"], true, "{}", out.to_text());
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
}

#[tokio::test]
async fn timeout_kills_the_whole_group_and_leaves_nothing_behind() {
    let fx = Fixture::new();
    let started = Instant::now();
    let out = fx
        .call(
            "bash",
            json!({"command": "echo $$ > pgid; sleep 1000 & sleep 1000", "timeout": 2000}),
        )
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(out.is_error);
    assert_eq!(out.extras["timedOut"], true);
    assert!(out.to_text().starts_with("timed out after 2000 ms: the process group was killed"));
    let pgid: i32 = fx.get("pgid").trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !live_in_group(pgid).is_empty() {
        assert!(
            Instant::now() < deadline,
            "processes left in group {pgid}: {:?}",
            live_in_group(pgid)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn background_processes_die_when_the_command_exits() {
    let fx = Fixture::new();
    let started = Instant::now();
    let out = fx.ok("bash", json!({"command": "echo $$ > pgid; sleep 1000 & echo started"})).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out, "exit code 0\n--- stdout ---\nstarted");
    let pgid: i32 = fx.get("pgid").trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !live_in_group(pgid).is_empty() {
        assert!(Instant::now() < deadline, "processes left in group {pgid}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until none of the processes whose ids are in the file `name` runs.
async fn wait_gone(fx: &Fixture, name: &str) {
    let pids: Vec<i32> =
        fx.get(name).split_whitespace().map(|p| p.parse().expect("a process id")).collect();
    assert!(!pids.is_empty());
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| runs(pid)) {
        assert!(Instant::now() < deadline, "still running: {pids:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A command's processes that left its process group (`setsid`, a daemon's double fork)
/// are found by the mark in their environment and die with it.
#[tokio::test]
async fn processes_that_left_the_group_die_when_the_command_exits() {
    let fx = Fixture::new();
    let command = "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > escaped; \
        (setsid sh -c 'sleep 1000 & echo $! >> escaped' </dev/null >/dev/null 2>&1 &); \
        while [ $(wc -l < escaped) -lt 2 ]; do sleep 0.01; done; echo started";
    let out = fx.call("bash", json!({"command": command})).await.unwrap();
    expect![[r#"
        exit code 0
        [2 process(es) the command started outside its process group (setsid, a daemon) were killed: use run_in_background for processes that must keep running]
        --- stdout ---
        started"#]]
    .assert_eq(&out.to_text());
    assert!(!out.is_error);
    assert_eq!(out.extras["escapedKilled"], 2);
    wait_gone(&fx, "escaped").await;
    // The same after a timeout, and from `exec`.
    let out = fx
        .call(
            "bash",
            json!({"command": "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > late; sleep 1000", "timeout": 500}),
        )
        .await
        .unwrap();
    assert_eq!(out.extras["timedOut"], true);
    wait_gone(&fx, "late").await;
    let exec = ["sh", "-c", "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > argv"];
    fx.ok("exec", json!({"argv": exec})).await;
    wait_gone(&fx, "argv").await;
}

#[tokio::test]
async fn cancellation_kills_the_group() {
    let fx = Fixture::new();
    let ctx = toolmux_core::CallContext::new();
    let token = ctx.cancel_token().clone();
    let root = fx.root();
    let call = toolmux_core::ToolProvider::call(
        &fx.fs,
        "bash",
        json!({"command": "echo $$ > pgid; sleep 1000"}),
        &ctx,
    );
    let cancel = async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(root.join("pgid")).map_or(true, |s| !s.ends_with('\n')) {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        token.cancel();
    };
    let (result, ()) = tokio::join!(call, cancel);
    assert_eq!(result.unwrap_err().code(), "cancelled");
    let pgid: i32 = fx.get("pgid").trim().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !live_in_group(pgid).is_empty() {
        assert!(Instant::now() < deadline, "processes left in group {pgid}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn large_output_keeps_head_and_tail_and_spills_the_rest() {
    let spill = tempfile::tempdir().unwrap();
    let spill_dir = spill.path().to_path_buf();
    let fx = Fixture::with(|c| {
        c.with_bash(BashConfig { spill_dir: Some(spill_dir), ..BashConfig::default() })
    });
    let out = fx.call("bash", json!({"command": "seq 1 100000"})).await.unwrap();
    let text = out.to_text();
    assert!(text.starts_with("exit code 0\n--- stdout ---\n1\n2\n3\n"));
    assert!(text.ends_with("99999\n100000"));
    assert!(text.chars().count() < 30_000 + 200, "{}", text.len());
    assert!(text.contains("omitted; full output saved to "), "{text}");
    assert_eq!(out.extras["stdoutTruncated"], true);
    let file = out.extras["stdoutFile"].as_str().unwrap();
    assert!(file.starts_with(&spill.path().to_string_lossy().into_owned()));
    let full = std::fs::read_to_string(file).unwrap();
    assert_eq!(full.lines().count(), 100_000);
}

#[tokio::test]
async fn huge_output_stays_bounded() {
    let spill = tempfile::tempdir().unwrap();
    let spill_dir = spill.path().to_path_buf();
    let fx = Fixture::with(|c| {
        c.with_bash(BashConfig {
            spill_dir: Some(spill_dir),
            spill_max_bytes: 1 << 20,
            ..BashConfig::default()
        })
    });
    let out = fx
        .call(
            "bash",
            json!({"command": "head -c 50000000 /dev/zero | tr '\\0' 'x'; echo; echo END"}),
        )
        .await
        .unwrap();
    let text = out.to_text();
    assert!(text.ends_with("END"), "{}", &text[text.len() - 100..]);
    assert_eq!(out.extras["stdoutBytes"], 50_000_005);
    let file = out.extras["stdoutFile"].as_str().unwrap();
    assert_eq!(std::fs::metadata(file).unwrap().len(), 1 << 20);
    // The model is not told the file holds everything.
    let said = format!("its first 1048576 bytes saved to {file} (the file's cap, `spillMaxBytes`)");
    assert!(text.contains(&said), "{}", &text[..text.len().min(20_000)]);
}

/// A runaway output ends the command at `maxOutputBytes`, not at its timeout; a
/// background task's too.
#[tokio::test]
async fn a_command_that_floods_its_output_is_killed() {
    let fx = Fixture::with(|c| {
        c.with_bash(BashConfig { max_output_bytes: 1 << 20, ..BashConfig::default() })
    });
    let started = Instant::now();
    let out = fx.call("bash", json!({"command": "yes"})).await.unwrap();
    let text = out.to_text();
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert_eq!(out.extras["outputLimitExceeded"], true, "{text}");
    assert!(text.starts_with("printed more than 1048576 bytes (`maxOutputBytes`)"), "{text}");
    assert!(out.is_error);

    let args = json!({"command": "yes", "run_in_background": true});
    let started = fx.call("bash", args).await.unwrap();
    let id = started.extras["taskId"].as_str().unwrap().to_owned();
    let mut last = String::new();
    for _ in 0..100 {
        let out = fx.call("task_output", json!({"task_id": id, "block_ms": 200})).await.unwrap();
        last = out.to_text();
        if out.extras["running"] == false {
            assert_eq!(out.extras["outputLimitExceeded"], true, "{last}");
            return;
        }
    }
    panic!("the flooding task still runs: {last}");
}

#[tokio::test]
async fn allow_list_and_env_passthrough() {
    let fx = Fixture::with(|c| {
        c.with_bash(BashConfig {
            allow_prefixes: vec!["echo".into(), "printenv LANG".into()],
            env_passthrough: vec!["TOOLMUX_FS_TEST_NEVER_SET".into()],
            ..BashConfig::default()
        })
    });
    assert_eq!(
        fx.ok("bash", json!({"command": "echo hi"})).await,
        "exit code 0\n--- stdout ---\nhi"
    );
    expect!["call to `fs__bash` denied: command `echo hi; rm -rf x` is not allowed: it contains the shell operator `;`, which is refused when an allow-list of command prefixes is configured; use `fs__exec` with an argv"]
        .assert_eq(&fx.err("bash", json!({"command": "echo hi; rm -rf x"})).await);
    expect!["call to `fs__exec` denied: command `rm -rf x` is not allowed: it does not start with an allowed prefix (`echo`, `printenv LANG`); change `bash.allowPrefixes` to allow it"]
        .assert_eq(&fx.err("exec", json!({"argv": ["rm", "-rf", "x"]})).await);
}

/// bash splits words at spaces and tabs only: `cat\u{a0}notes` is one program, named
/// `cat notes` with a no-break space, that bash looks for in PATH (where an agent may have
/// put one), not `cat`. The allow-list refuses such a line instead of reading it as `cat`.
#[tokio::test]
async fn the_allow_list_refuses_spaces_bash_does_not_split_at() {
    let fx = Fixture::with(|c| {
        c.with_bash(BashConfig { allow_prefixes: vec!["cat".into()], ..BashConfig::default() })
    });
    fx.put("notes", "plain\n");
    assert_eq!(
        fx.ok("bash", json!({"command": "cat\tnotes"})).await,
        "exit code 0\n--- stdout ---\nplain"
    );
    let err = fx.err("bash", json!({"command": "cat\u{a0}notes"})).await;
    assert!(err.contains("U+00A0, a space, which is refused"), "{err}");
    for odd in ["cat\u{2003}notes", "cat\u{b}notes", "cat notes\u{c}x", "cat\u{2028}notes"] {
        let err = fx.err("bash", json!({"command": odd})).await;
        assert!(err.contains("bash splits words only at spaces and tabs"), "{odd:?}: {err}");
    }
}

#[tokio::test]
async fn execute_is_off_unless_configured() {
    let fx = Fixture::with(|c| c.with_permissions([toolmux_fs::Permission::Read]));
    expect![[r#"call to `fs__bash` denied: tool `bash` is disabled: add "execute" to the fs `permissions` configuration key to enable it"#]]
        .assert_eq(&fx.err("bash", json!({"command": "true"})).await);
}

#[tokio::test]
async fn dropping_the_call_kills_the_group() {
    let fx = Fixture::new();
    let mut call =
        Box::pin(fx.call("bash", json!({"command": "echo $$ > pgid; sleep 1000 & sleep 1000"})));
    let root = fx.root();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Drive the call until the command has started, then drop it as an orchestrator
    // timeout would: the group must still die.
    while std::fs::read_to_string(root.join("pgid")).map_or(true, |s| !s.ends_with('\n')) {
        assert!(Instant::now() < deadline, "the command did not start");
        tokio::select! {
            _ = &mut call => panic!("the command finished"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
    }
    drop(call);
    let pgid: i32 = fx.get("pgid").trim().parse().unwrap();
    while !live_in_group(pgid).is_empty() {
        assert!(Instant::now() < deadline, "processes left in group {pgid}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn colours_are_stripped_for_the_model() {
    let fx = Fixture::new();
    let out = fx.ok("bash", json!({"command": "printf '\\033[31mred\\033[0m\\n'"})).await;
    assert_eq!(out, "exit code 0\n--- stdout ---\nred");
}

#[tokio::test]
async fn exec_timeout_kills_the_program() {
    let fx = Fixture::new();
    let started = Instant::now();
    let out = fx
        .call("exec", json!({"argv": ["sleep", "1000"], "timeout": 200, "description": "sleep"}))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(out.is_error);
    assert_eq!(out.to_text(), "timed out after 200 ms: the process group was killed\n[no output]");
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn spill_files_are_private_in_a_private_directory_of_this_user() {
    let fx = Fixture::new();
    let out = fx.call("bash", json!({"command": "seq 1 100000; seq 1 100000 >&2"})).await.unwrap();
    let uid = rustix::process::getuid().as_raw();
    let dir = std::env::temp_dir().join(format!("toolmux-fs-{uid}"));
    for stream in ["stdoutFile", "stderrFile"] {
        let file = std::path::PathBuf::from(out.extras[stream].as_str().unwrap());
        assert_eq!(file.parent(), Some(dir.as_path()));
        assert_eq!(mode(&file), 0o600, "{}", file.display());
        assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 100_000);
        std::fs::remove_file(file).unwrap();
    }
    assert!(std::fs::symlink_metadata(&dir).unwrap().is_dir());
    assert_eq!(mode(&dir), 0o700);
}

#[tokio::test]
async fn a_configured_spill_directory_is_created_private() {
    let spill = tempfile::tempdir().unwrap();
    let spill_dir = spill.path().join("a/b");
    let dir = spill_dir.clone();
    let fx = Fixture::with(|c| {
        c.with_bash(BashConfig { spill_dir: Some(spill_dir), ..BashConfig::default() })
    });
    let out = fx.call("bash", json!({"command": "seq 1 100000"})).await.unwrap();
    let file = std::path::PathBuf::from(out.extras["stdoutFile"].as_str().unwrap());
    assert_eq!(file.parent(), Some(dir.as_path()));
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&dir), 0o700);
}

#[tokio::test]
async fn a_spill_file_that_cannot_be_made_says_why() {
    let spill = tempfile::tempdir().unwrap();
    let not_a_dir = spill.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let spill_dir = not_a_dir.clone();
    let fx = Fixture::with(|c| {
        c.with_bash(BashConfig { spill_dir: Some(spill_dir), ..BashConfig::default() })
    });
    let out = fx.call("bash", json!({"command": "seq 1 100000"})).await.unwrap();
    let text = crate::scrub(&out.to_text(), spill.path());
    assert!(
        text.contains(
            "omitted; the full output could not be saved: the spill directory `<tmp>/file` cannot \
             be created: File exists (os error 17) ...]"
        ),
        "{text}"
    );
    assert!(out.extras.get("stdoutFile").is_none());
    assert!(text.ends_with("99999\n100000"));
}

/// `workdir` runs a command in a folder beneath the root, found as the file tools find
/// paths (links and `..` resolved): never outside the root, never in a hidden folder, never
/// in a file; a background task too.
#[tokio::test]
async fn workdir_runs_a_command_in_a_folder_beneath_the_root() {
    let fx = Fixture::with(|c| c.with_hide(["secret/"]));
    fx.put("app/src/main.rs", "fn main() {}\n");
    fx.put("secret/key", "k\n");
    let root = std::fs::canonicalize(fx.root()).unwrap();
    let out = fx.ok("bash", json!({"command": "pwd; ls", "workdir": "app"})).await;
    assert_eq!(out, format!("exit code 0\n--- stdout ---\n{}\nsrc", root.join("app").display()));
    let out = fx.ok("exec", json!({"argv": ["pwd"], "workdir": "app/src/../src"})).await;
    assert!(out.ends_with(&root.join("app/src").display().to_string()), "{out}");
    let absolute = root.join("app").display().to_string();
    let out = fx.ok("bash", json!({"command": "pwd", "workdir": absolute})).await;
    assert!(out.ends_with("/app"), "{out}");
    let err = fx.err("bash", json!({"command": "pwd", "workdir": "../"})).await;
    assert!(err.contains("outside"), "{err}");
    let err = fx.err("bash", json!({"command": "pwd", "workdir": "app/src/main.rs"})).await;
    assert!(err.contains("is not a folder"), "{err}");
    let err = fx.err("bash", json!({"command": "pwd", "workdir": "nowhere"})).await;
    assert!(err.contains("nowhere"), "{err}");
    let err = fx.err("bash", json!({"command": "pwd", "workdir": "secret"})).await;
    assert!(!err.contains("exit code"), "a hidden folder is not run in: {err}");
    // A link that leads out of the root is refused too.
    std::os::unix::fs::symlink(fx.outside(), fx.root().join("out")).unwrap();
    let err = fx.err("bash", json!({"command": "pwd", "workdir": "out"})).await;
    assert!(err.contains("outside"), "{err}");
    let started =
        fx.ok("bash", json!({"command": "pwd", "workdir": "app", "run_in_background": true})).await;
    assert!(started.contains("task"), "{started}");
}

/// A process that replaced its environment (so it is not found and killed) and kept the
/// pipes open costs what it prints later, not what the command printed before: that was
/// all thrown away, and the result said `[no output]`.
#[tokio::test]
async fn output_is_kept_when_a_process_out_of_reach_holds_the_pipes() {
    let fx = Fixture::new();
    // It waits until `sleep` runs with its empty environment (before, `env` still has the
    // mark and is killed with the command). By its name: an environment read while `env`
    // is being started can come back empty, and the command ended too soon.
    let command = "echo before; echo warning >&2; env -i setsid sleep 30 & echo $! > held; \
        for i in $(seq 1000); do [ \"$(cat /proc/$!/comm 2>/dev/null)\" = sleep ] && break; \
        sleep 0.01; done; echo after";
    let out = fx.call("bash", json!({"command": command})).await.unwrap();
    let held = fx.get("held");
    let _ = std::process::Command::new("kill").arg(held.trim()).status();
    expect![[r#"
        exit code 0
        [a process outside the group kept the output open: what it printed more than 2 s after the command ended is not shown]
        --- stdout ---
        before
        after
        --- stderr ---
        warning"#]]
    .assert_eq(&out.to_text());
}

/// A command cannot reach the terminal toolmux runs in: `/dev/tty` fails at once, so
/// `sudo`, `ssh` and git's credential prompts fail saying so instead of waiting for the
/// timeout, and nothing is written over the user's screen. Where the tests have no
/// terminal this holds trivially; `commands_of_a_toolmux_in_a_terminal_cannot_reach_it`
/// runs it again in a session that has one.
#[tokio::test]
async fn commands_cannot_open_the_controlling_terminal() {
    let fx = Fixture::new();
    let started = Instant::now();
    let command = "echo scribble > /dev/tty; read line < /dev/tty; echo read $?";
    let out = fx.call("bash", json!({"command": command, "timeout": 20_000})).await.unwrap();
    let text = out.to_text();
    assert!(started.elapsed() < Duration::from_secs(10), "{text}");
    assert_eq!(out.extras.get("timedOut"), None, "{text}");
    assert!(text.contains("/dev/tty: No such device or address"), "{text}");
    assert!(text.contains("read 1"), "{text}");
}

/// Claude Code and goose hung on interactive commands until their timeout; here a command
/// run by a toolmux that has a controlling terminal (its CLI, an agent's TUI) is in a
/// session of its own: in toolmux's session, `read < /dev/tty` stopped the command
/// (`SIGTTIN`, its group not the terminal's foreground one) until the timeout, and with
/// the sandbox off its writes to `/dev/tty` landed on the user's screen.
#[test]
fn commands_of_a_toolmux_in_a_terminal_cannot_reach_it() {
    let test = "shell::commands_cannot_open_the_controlling_terminal";
    let (stdout, screen) = toolmux_test_support::terminal::rerun_in_a_terminal(test);
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(!screen.contains("scribble"), "{screen:?}");
}

/// A process substitution (`exec > >(tee -a log)`, a common way for a script to log
/// what it prints) outlives the shell by the moment it takes to copy the shell's last
/// output: the group was killed as soon as the shell exited, so the output was lost and
/// the result said `[no output]` (Codex's runner hung on the same command instead).
#[tokio::test]
async fn output_through_a_process_substitution_is_kept() {
    let fx = Fixture::new();
    let command = "exec > >(tr a-z A-Z) 2> >(sed 's/^/E: /' >&2); echo hello; echo oops >&2";
    for _ in 0..3 {
        let out = fx.call("bash", json!({"command": command})).await.unwrap();
        expect![[r#"
            exit code 0
            --- stdout ---
            HELLO
            --- stderr ---
            E: oops"#]]
        .assert_eq(&out.to_text());
    }
    let out = fx.call("bash", json!({"command": "exec > >(tee -a log.txt); echo logged"})).await;
    assert_eq!(out.unwrap().to_text(), "exit code 0\n--- stdout ---\nlogged");
    assert_eq!(fx.get("log.txt"), "logged\n");
}

/// A process the command left holding its output is still killed, within a moment.
#[tokio::test]
async fn a_process_left_holding_the_output_is_killed_within_a_second() {
    let fx = Fixture::new();
    let started = Instant::now();
    let out = fx.ok("bash", json!({"command": "sleep 1000 & echo started"})).await;
    assert_eq!(out, "exit code 0\n--- stdout ---\nstarted");
    assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
}

/// A NUL or a bell in a tool result breaks some model APIs' JSON and many clients'
/// displays: stray control characters are shown as escapes, never raw nor dropped.
#[tokio::test]
async fn control_characters_are_shown_as_escapes() {
    let fx = Fixture::new();
    let out = fx.ok("bash", json!({"command": "printf 'a\\0b\\n'; printf 'bell\\a\\n' >&2"})).await;
    assert_eq!(out, "exit code 0\n--- stdout ---\na\\x00b\n--- stderr ---\nbell\\x07");
    let out = fx.ok("exec", json!({"argv": ["printf", "tab\\tx\\bff\\f\\x7f\\n"]})).await;
    assert_eq!(out, "exit code 0\n--- stdout ---\ntab\tx\\x08ff\\x0c\\x7f");
}

/// A control character right after an ESC, or inside a title sequence (`ESC ]`) that
/// never ends, is shown too, with what follows it: the ESC was taken for the start of an
/// escape sequence, so the NUL after it was dropped unseen and an unterminated title took
/// the rest of the output with it (`[no output]`). Well-formed sequences still go, a
/// character set selection (`ESC ( B`, which `tput sgr0` prints) whole.
#[tokio::test]
async fn a_control_character_in_a_broken_escape_sequence_is_shown() {
    let fx = Fixture::new();
    let command = "printf 'a\\033\\0b\\n'; printf '\\033]0;title\\0 and the rest\\nmore\\n' >&2";
    let out = fx.ok("bash", json!({"command": command})).await;
    assert_eq!(
        out,
        "exit code 0\n--- stdout ---\na\\x1b\\x00b\n--- stderr ---\n\\x1b]0;title\\x00 and the \
         rest\nmore"
    );
    let command = "printf '\\033[1mbold\\033(B\\033[m plain'";
    let out = fx.ok("bash", json!({"command": command})).await;
    assert_eq!(out, "exit code 0\n--- stdout ---\nbold plain");
}

/// What a carriage return draws (a progress bar) is kept as it was.
#[tokio::test]
async fn carriage_returns_are_kept() {
    let fx = Fixture::new();
    let out = fx.ok("bash", json!({"command": "printf '10%%\\r50%%\\r100%%\\n'"})).await;
    assert_eq!(out, "exit code 0\n--- stdout ---\n10%\r50%\r100%");
}

/// Binary output (a `cat` of an image) is one line saying how much was left out and where
/// it is, not kilobytes of escapes.
#[tokio::test]
async fn binary_output_is_replaced_by_a_notice() {
    let fx = Fixture::new();
    let out = fx.call("bash", json!({"command": "head -c 4096 /dev/urandom"})).await.unwrap();
    let text = out.to_text();
    let file = out.extras["stdoutFile"].as_str().expect("the bytes are saved");
    let (first, rest) = text.split_once("--- stdout ---\n").unwrap();
    assert_eq!(first, "exit code 0\n");
    assert_eq!(
        rest,
        format!(
            "[4096 bytes of binary output left out; saved to {file} (look at it with \
             `file {file}`, `xxd {file} | head`)]"
        )
    );
    assert_eq!(std::fs::read(file).unwrap().len(), 4096);
    assert_eq!(out.extras["stdoutTruncated"], true);
    std::fs::remove_file(file).unwrap();
}
