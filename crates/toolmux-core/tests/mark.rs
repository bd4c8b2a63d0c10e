//! [`ProcessMark`]'s sweep against real processes.
#![cfg(target_os = "linux")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use toolmux_core::ProcessMark;

/// Whether process `pid` runs (exists and is not a zombie).
fn runs(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
}

#[test]
fn a_sweep_kills_the_marked_process_that_left_its_group_and_no_other() {
    let mark = ProcessMark::new();
    let (name, value) = mark.env();
    // `setsid` puts the sleeper in a session (and group) of its own; the shell exits.
    let script = "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!";
    let output = Command::new("sh")
        .arg("-c")
        .arg(script)
        .env(name, value)
        .stdin(Stdio::null())
        .output()
        .expect("sh runs");
    assert!(output.status.success());
    let pid: u32 = String::from_utf8_lossy(&output.stdout).trim().parse().expect("a pid");
    assert!(runs(pid));
    // An unmarked sleeper, and one with another mark, are left alone.
    let mut unmarked = Command::new("sleep").arg("300").spawn().expect("sleep runs");
    let other = ProcessMark::new();
    let (other_name, other_value) = other.env();
    let mut marked_otherwise =
        Command::new("sleep").arg("300").env(other_name, other_value).spawn().expect("sleep runs");
    assert_eq!(mark.sweep(), vec![pid]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while runs(pid) {
        assert!(Instant::now() < deadline, "{pid} still runs");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(unmarked.try_wait().unwrap().is_none(), "the unmarked process runs on");
    assert!(marked_otherwise.try_wait().unwrap().is_none(), "the other mark's runs on");
    assert!(mark.sweep().is_empty());
    assert_eq!(other.sweep(), vec![marked_otherwise.id()]);
    assert!(marked_otherwise.wait().unwrap().code().is_none(), "killed by a signal");
    unmarked.kill().unwrap();
    unmarked.wait().unwrap();
}

/// A command started under a mark, by a process that was itself started under one (a
/// toolmux run by another's `bash`), carries both: either sweep finds it.
#[test]
fn a_nested_mark_is_found_by_the_outer_sweep() {
    let outer = ProcessMark::new();
    let (name, value) = outer.env();
    let nested = format!("{value}:99.1.1");
    let mut child = Command::new("sleep").arg("300").env(name, nested).spawn().expect("sleep runs");
    assert_eq!(outer.sweep(), vec![child.id()]);
    assert!(child.wait().unwrap().code().is_none(), "killed by a signal");
}

/// A second after the mark was made the sweep reads all of `/proc`, not only the ids
/// handed out since: both ways find the process.
#[test]
fn an_old_mark_is_found_by_reading_all_of_proc() {
    let mark = ProcessMark::new();
    let (name, value) = mark.env();
    let mut child = Command::new("sleep").arg("300").env(name, value).spawn().expect("sleep runs");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(mark.sweep(), vec![child.id()]);
    assert!(child.wait().unwrap().code().is_none(), "killed by a signal");
}
