//! Commands outlive no toolmux killed with `SIGKILL`: the test runs itself as a child
//! process holding the provider, kills it mid-command and looks for what it left in
//! `/proc`.

use crate::Fixture;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};
use toolmux_test_support::procs::{ChildCopy, assert_groups_die, live_in_group, wait_for_number};

/// Set in the child copy of the test to the folder it writes its process group ids to.
const CHILD_VAR: &str = "TOOLMUX_FS_TEST_ORPHANS_DIR";

/// The child's part: a provider running a background task and a foreground command, each
/// writing its process group id, until it is killed.
async fn hold_commands(dir: &Path) {
    let fx = Fixture::new();
    let bg = dir.join("background.pgid");
    let fg = dir.join("foreground.pgid");
    let out = fx
        .call(
            "bash",
            json!({"command": format!("echo $$ > {}.tmp; mv {0}.tmp {0}; sleep 308; true", bg.display()),
                   "run_in_background": true}),
        )
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let out = fx
        .call(
            "bash",
            json!({"command": format!("echo $$ > {}.tmp; mv {0}.tmp {0}; sleep 307; true", fg.display()),
                   "timeout": 600000}),
        )
        .await;
    panic!("the foreground command ended before the test killed its provider: {out:?}");
}

/// A toolmux killed with `SIGKILL` leaves neither a foreground command nor a background
/// task running, nor what they started (the `sleep` under `bash`).
#[test]
fn commands_die_with_a_killed_toolmux() {
    if let Some(dir) = std::env::var_os(CHILD_VAR) {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        runtime.block_on(hold_commands(Path::new(&dir)));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child =
        ChildCopy::spawn("orphans::commands_die_with_a_killed_toolmux", CHILD_VAR, dir.path());
    let background = wait_for_number(&dir.path().join("background.pgid"), Duration::from_secs(30));
    let foreground = wait_for_number(&dir.path().join("foreground.pgid"), Duration::from_secs(30));
    assert!(!live_in_group(foreground).is_empty(), "the foreground command is not running");
    child.kill();
    assert_groups_die(&[background, foreground], Duration::from_secs(10), "toolmux was killed");
}

/// The child's part of the next test: three foreground commands at once, each writing its
/// process group id, until it is killed.
async fn hold_three_commands(dir: &Path) {
    let fx = Fixture::new();
    let command = |n: usize| {
        let file = dir.join(format!("command-{n}.pgid"));
        json!({"command": format!("echo $$ > {}.tmp; mv {0}.tmp {0}; sleep 306; true", file.display()),
               "timeout": 600000})
    };
    let (a, b, c) = tokio::join!(
        fx.call("bash", command(0)),
        fx.call("bash", command(1)),
        fx.call("bash", command(2)),
    );
    panic!("a command ended before the test killed its provider: {a:?} {b:?} {c:?}");
}

/// Three commands running at once, watched by the one watchman, all die with a toolmux
/// killed mid-way.
#[test]
fn three_commands_at_once_die_with_a_killed_toolmux() {
    if let Some(dir) = std::env::var_os(CHILD_VAR) {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        runtime.block_on(hold_three_commands(Path::new(&dir)));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = ChildCopy::spawn(
        "orphans::three_commands_at_once_die_with_a_killed_toolmux",
        CHILD_VAR,
        dir.path(),
    );
    let groups: Vec<i32> = (0..3)
        .map(|n| {
            wait_for_number(&dir.path().join(format!("command-{n}.pgid")), Duration::from_secs(30))
        })
        .collect();
    for &group in &groups {
        assert!(!live_in_group(group).is_empty(), "command group {group} is not running");
    }
    assert_eq!(watchmen_of(child.id() as i32).len(), 1, "one watchman for the three commands");
    child.kill();
    assert_groups_die(&groups, Duration::from_secs(10), "toolmux was killed");
}

/// The watchmen (`toolmux-group-guard`) among the children of process `parent`, found in
/// `/proc`.
fn watchmen_of(parent: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(1) != Some(&parent.to_string().as_str()) || ["Z", "X"].contains(&fields[0]) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if cmdline.split(|&b| b == 0).any(|arg| arg == b"toolmux-group-guard") {
            found.push(pid);
        }
    }
    found
}

/// Several commands, at once and one after another, and two background tasks, share one
/// watchman; one killed is replaced at the next command.
#[tokio::test(flavor = "multi_thread")]
async fn one_watchman_serves_every_command() {
    let me = std::process::id() as i32;
    let fx = Fixture::new();
    for _ in 0..3 {
        let out = fx.call("bash", json!({"command": "true"})).await.unwrap();
        assert!(!out.is_error, "{}", out.to_text());
    }
    let (a, b) = tokio::join!(
        fx.call("bash", json!({"command": "sleep 0.2"})),
        fx.call("exec", json!({"argv": ["sleep", "0.2"]})),
    );
    assert!(!a.unwrap().is_error && !b.unwrap().is_error);
    for _ in 0..2 {
        let out = fx
            .call("bash", json!({"command": "sleep 30", "run_in_background": true}))
            .await
            .unwrap();
        assert!(!out.is_error, "{}", out.to_text());
    }
    let watchmen = watchmen_of(me);
    assert_eq!(watchmen.len(), 1, "one watchman after several commands: {watchmen:?}");
    // Killed by someone: the next command starts another.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(watchmen[0]).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    // Dead (a zombie until replaced) before the next command writes to it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !watchmen_of(me).is_empty() {
        assert!(Instant::now() < deadline, "the killed watchman still runs after 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let out = fx.call("bash", json!({"command": "true"})).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let replaced = watchmen_of(me);
    assert_eq!(replaced.len(), 1, "one watchman after a restart: {replaced:?}");
    assert_ne!(replaced, watchmen, "the killed watchman was not replaced");
}
