//! Tests of the journal, and what the stores' tests use to kill a process midway through a
//! change: the test binary run again as a child that stops at a step and is sent SIGKILL.

use super::*;
use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The variable that gives a test's child process the folder to change.
pub(crate) const CHILD_DIR: &str = "TOOLMUX_TEST_COMMIT_CHILD_DIR";

/// The folder this process is to change when it runs as a child of a crash test.
pub(crate) fn child_dir() -> Option<PathBuf> {
    std::env::var_os(CHILD_DIR).map(PathBuf::from)
}

/// How long a child may take to reach its step or to end.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs test `test` (its full path) of this binary again as a child changing folder `dir`,
/// stopping at step `step` of its change, where it is killed with SIGKILL: `true` when
/// it was, `false` when its change had fewer steps and it ended (successfully).
pub(crate) fn killed_at(test: &str, dir: &Path, step: usize) -> bool {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut child = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir)
        .env(STOP_AT, step.to_string())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the child runs");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may have begun the line (`test NAME ... `).
            if let Some((_, at)) = line.split_once(STOPPED) {
                let _ = tx.send(at.trim().parse::<usize>().ok());
                return;
            }
        }
    });
    match rx.recv_timeout(CHILD_TIMEOUT) {
        Ok(stopped) => {
            assert_eq!(stopped, Some(step), "the child stopped where told");
            child.kill().expect("SIGKILL sent");
            let status = child.wait().expect("the child is reaped");
            use std::os::unix::process::ExitStatusExt as _;
            assert_eq!(status.signal(), Some(9), "the child was killed by SIGKILL: {status}");
            true
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            let status = child.wait().expect("the child is reaped");
            assert!(status.success(), "the child's change failed: {status}");
            false
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child neither stopped at step {step} nor ended in {CHILD_TIMEOUT:?}");
        }
    }
}

/// A folder with its lock, and files `a`, `b` and `gone`.
fn folder_of_three() -> (tempfile::TempDir, Lock) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [("a", "old a"), ("b", "old b"), ("gone", "here")] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let lock = folder::lock_blocking(dir.path(), "test", "t", &[]).unwrap();
    (dir, lock)
}

fn change_of_three() -> Change {
    let mut change = Change::default();
    change.write_json("a", &"new a", "t").unwrap();
    change.write_json("b", &"new b", "t").unwrap();
    change.remove("gone");
    change
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_change_of_several_files_is_made_whole_and_leaves_no_journal() {
    let (dir, lock) = folder_of_three();
    change_of_three().commit(dir.path(), &lock, true, "t").unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "\"new a\"");
    assert_eq!(std::fs::read_to_string(dir.path().join("b")).unwrap(), "\"new b\"");
    assert_eq!(names(dir.path()), [".lock", ".staged", "a", "b"]);
    assert!(names(&dir.path().join(STAGED)).is_empty());
}

/// A journal fully written whose renames were not all made (the process making the change
/// was killed) is completed by the next lock's holder.
#[test]
fn the_next_holder_of_the_lock_completes_a_journal() {
    let (dir, lock) = folder_of_three();
    let staged = dir.path().join(STAGED);
    std::fs::create_dir(&staged).unwrap();
    // Step 0 (a) was made, step 1 (b) and the removal not.
    std::fs::write(dir.path().join("a"), "\"new a\"").unwrap();
    std::fs::write(staged.join("1"), "\"new b\"").unwrap();
    let steps = vec![
        Step::Rename { staged: 0, to: "a".into() },
        Step::Rename { staged: 1, to: "b".into() },
        Step::Remove { at: "gone".into() },
    ];
    let json = serde_json::to_string(&Journal { steps }).unwrap();
    std::fs::write(dir.path().join(JOURNAL), format!("{json}\nend {}\n", json.len())).unwrap();
    drop(lock);
    let _lock = folder::lock_blocking(dir.path(), "test", "t", &[]).unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "\"new a\"");
    assert_eq!(std::fs::read_to_string(dir.path().join("b")).unwrap(), "\"new b\"");
    assert_eq!(names(dir.path()), [".lock", ".staged", "a", "b"]);
    assert!(names(&staged).is_empty());
}

/// A journal cut short (its trailer missing or naming another length), or naming a path
/// outside the folder, is discarded: nothing it names is touched.
#[test]
fn a_journal_cut_short_is_discarded() {
    let steps =
        vec![Step::Rename { staged: 0, to: "a".into() }, Step::Remove { at: "gone".into() }];
    let json = serde_json::to_string(&Journal { steps }).unwrap();
    let whole = format!("{json}\nend {}\n", json.len());
    let outside = r#"{"steps":[{"op":"remove","at":"../x"}]}"#;
    let bad = [
        whole[..whole.len() - 1].to_owned(),
        whole[..json.len()].to_owned(),
        whole[..json.len() / 2].to_owned(),
        format!("{json}\nend {}\n", json.len() + 1),
        format!("{outside}\nend {}\n", outside.len()),
    ];
    assert!(parse(whole.as_bytes()).is_some());
    for journal in bad {
        let (dir, lock) = folder_of_three();
        let staged = dir.path().join(STAGED);
        std::fs::create_dir(&staged).unwrap();
        std::fs::write(staged.join("0"), "\"new a\"").unwrap();
        std::fs::write(dir.path().join(JOURNAL), &journal).unwrap();
        drop(lock);
        let _lock = folder::lock_blocking(dir.path(), "test", "t", &[]).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("a")).unwrap(), "old a", "{journal}");
        assert_eq!(names(dir.path()), [".lock", ".staged", "a", "b", "gone"], "{journal}");
        assert!(names(&staged).is_empty());
    }
}

/// A journal whose step cannot be made says which file and how to go on, and keeps the
/// lock's holder from reading a half-made change.
#[test]
fn a_journal_that_cannot_be_completed_says_why() {
    let (dir, lock) = folder_of_three();
    let staged = dir.path().join(STAGED);
    std::fs::create_dir(&staged).unwrap();
    std::fs::write(staged.join("0"), "\"new\"").unwrap();
    let steps = vec![Step::Rename { staged: 0, to: "missing/a".into() }];
    let json = serde_json::to_string(&Journal { steps }).unwrap();
    std::fs::write(dir.path().join(JOURNAL), format!("{json}\nend {}\n", json.len())).unwrap();
    drop(lock);
    let e = folder::lock_blocking(dir.path(), "test", "t", &[]).unwrap_err().to_string();
    assert!(e.contains("cannot complete the change a process left half made"), "{e}");
    assert!(e.contains("missing/a") && e.contains(".commit` away"), "{e}");
}
