//! Tests of the command lines `cargo xtask ci` runs and of its check of the benchmarks'
//! lock files against real cargo.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Network, Outcome, bench_locks, bench_workspaces, feature_commands, lock_check};
use crate::{cmd, project_root};

/// The features step checks the facade with no feature and each alone, then runs its unit
/// tests with the providers but not `external`, each run without the default features.
#[test]
fn the_features_step_runs_each_feature_alone_then_the_unit_tests() {
    let lines: Vec<String> = feature_commands(Path::new(".")).iter().map(cmd::display).collect();
    let check = "cargo check --locked -p toolmux --no-default-features";
    assert_eq!(
        lines,
        [
            check.to_owned(),
            format!("{check} --features fs"),
            format!("{check} --features mcp"),
            format!("{check} --features rest"),
            format!("{check} --features external"),
            format!("{check} --features agent"),
            format!("{check} --features redis"),
            format!("{check} --features otel"),
            format!("{check} --features tower"),
            "cargo test --lib --locked -p toolmux --no-default-features --features fs,mcp,rest,agent"
                .to_owned(),
        ]
    );
}

/// A scratch copy of the project's benchmark workspaces (manifests, lock files, sources)
/// beneath a fresh directory, their path dependencies pointing at the project's crates.
fn scratch_benchmarks(name: &str) -> PathBuf {
    let project = project_root();
    let root = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&root);
    let crates = project.join("crates");
    for manifest in bench_workspaces(&project).unwrap() {
        let from = project.join(&manifest);
        copy_sources(from.parent().unwrap(), root.join(&manifest).parent().unwrap());
        let text = fs::read_to_string(&from).unwrap();
        let text = text.replace("../../crates", crates.to_str().unwrap());
        fs::write(root.join(&manifest), text).unwrap();
    }
    root
}

/// Copies the files beneath `from` to `to`, leaving out build output.
fn copy_sources(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (path, name) = (entry.path(), entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if name != "target" {
                copy_sources(&path, &to.join(name));
            }
        } else {
            fs::copy(&path, to.join(name)).unwrap();
        }
    }
}

/// The benchmarks' lock files as committed pass; one that misses a dependency a workspace
/// crate has gained (toolmux-test-support's tracing) fails the step offline and online,
/// naming the lock file and the command that updates it.
#[test]
fn a_stale_benchmark_lock_file_fails_the_bench_locks_step() {
    let root = scratch_benchmarks("bench-locks");
    let manifest = PathBuf::from("benchmarks/pipeline/Cargo.toml");
    assert!(matches!(bench_locks(&root), Ok(Outcome::Passed)), "the committed lock files pass");
    // The step has fetched what was missing, so the offline check alone now passes.
    assert!(cmd::succeeds(&mut lock_check(&root, &manifest, Network::Offline)));

    let lock = root.join("benchmarks/pipeline/Cargo.lock");
    let text = fs::read_to_string(&lock).unwrap();
    let entry = text.find("name = \"toolmux-test-support\"").expect("its entry");
    let tracing = " \"tracing\",\n";
    let line = entry + text[entry..].find(tracing).expect("its tracing line");
    let stale = format!("{}{}", &text[..line], &text[line + tracing.len()..]);
    fs::write(&lock, &stale).unwrap();

    assert!(!cmd::succeeds(&mut lock_check(&root, &manifest, Network::Offline)));
    let error = format!("{:#}", bench_locks(&root).err().expect("a stale lock file fails"));
    assert!(error.contains("benchmarks/pipeline/Cargo.lock does not hold what"), "{error}");
    assert!(
        error.contains("cargo update --workspace --manifest-path benchmarks/pipeline/Cargo.toml"),
        "{error}"
    );
    assert_eq!(fs::read_to_string(&lock).unwrap(), stale, "the lock file is left as it was");
    let _ = fs::remove_dir_all(&root);
}

/// The background install's failure ends with its log; dropped unfinished, it leaves no
/// process of its group behind (cargo's compilers included).
#[test]
fn a_background_install_reports_its_log_and_is_killed_whole_when_dropped() {
    use super::DenyInstall;
    use std::process::Command;

    let folder = std::env::temp_dir().join(format!("xtask-install-{}", std::process::id()));
    fs::create_dir_all(&folder).unwrap();

    let mut failing = Command::new("sh");
    failing.args(["-c", "echo compiling; echo 'error: no space left' >&2; exit 3"]);
    let error = DenyInstall::spawn(failing, folder.join("a.log")).unwrap().wait().unwrap_err();
    assert_eq!(
        format!("{error:#}"),
        "installing cargo-deny failed (exit status: 3):\ncompiling\nerror: no space left"
    );

    // A child that starts one of its own, as cargo starts rustc; each writes its pid.
    let pids = folder.join("pids");
    let mut long = Command::new("sh");
    long.arg("-c").arg(format!("sleep 300 & echo $! >> {0}; echo $$ >> {0}; wait", pids.display()));
    let install = DenyInstall::spawn(long, folder.join("b.log")).unwrap();
    let started = std::time::Instant::now();
    let written = loop {
        let text = fs::read_to_string(&pids).unwrap_or_default();
        if text.lines().count() == 2 {
            break text;
        }
        assert!(started.elapsed().as_secs() < 10, "the child wrote no pids");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(install);
    for pid in written.lines() {
        // Killed and reaped by the drop (the shell), or killed and reparented (the sleep):
        // either way no longer running.
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        let gone = started.elapsed().as_secs() < 10
            && (0..200).any(|_| {
                let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let running = stat
                    .rsplit_once(") ")
                    .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'));
                if running {
                    std::thread::sleep(std::time::Duration::from_millis(25));
                }
                !running
            });
        assert!(gone, "process {pid} still runs ({state:?})");
    }
    let _ = fs::remove_dir_all(&folder);
}
