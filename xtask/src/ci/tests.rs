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
