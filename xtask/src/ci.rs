//! `cargo xtask ci`, the whole of continuous integration in order, and `cargo xtask bench`.
//!
//! Each step prints a header and its time; the first failure stops the run. Tools that
//! may be missing on a developer's machine (cargo-nextest, cargo-deny) degrade: tests
//! fall back to `cargo test`, and cargo-deny is installed only with `--install-tools` or
//! `CI=true`, or else skipped with the reason said. That install starts with the run, in the
//! background at the lowest CPU priority, so that it builds in what the other steps leave
//! idle (the test run keeps two cores about 80 % busy) rather than for four and a half
//! minutes of its own at the cargo-deny step, which waits for it.
//!
//! Benchmarks are only type-checked here, never run: speed targets live in benchmark tables,
//! not in timed tests. Besides the workspace's own bench targets, every
//! `benchmarks/*/Cargo.toml` is a workspace of its own (so the peers measured against stay
//! out of the product's Cargo.lock) and is built too, last; its lock file is checked early,
//! right after fmt, so that a stale one fails CI in seconds rather than at the end.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use crate::codegen;
use crate::metadata::Metadata;
use crate::{cmd, tidy, walk};

#[derive(Debug)]
pub(crate) struct CiOptions {
    /// `cargo install` cargo-deny when it is missing (also implied by `CI=true`).
    pub(crate) install_tools: bool,
}

enum Outcome {
    Passed,
    Skipped(String),
}

struct Step<'a> {
    name: &'static str,
    /// What the step runs, as a command line.
    what: String,
    action: Box<dyn FnOnce() -> Result<Outcome> + 'a>,
}

pub(crate) fn run(root: &Path, options: &CiOptions) -> Result<()> {
    let install_tools = options.install_tools || is_ci();
    let deny_install =
        if install_tools && !has_cargo_deny() { Some(DenyInstall::start(root)?) } else { None };
    let tests: &[&str] = if has_nextest() {
        &["nextest", "run", "--workspace", "--locked", "--no-fail-fast"]
    } else {
        &["test", "--workspace", "--locked"]
    };
    let steps = vec![
        cargo_step(root, "fmt", &["fmt", "--all", "--", "--check"]),
        Step {
            name: "bench locks",
            what: "cargo tree --locked --offline for each benchmarks/* workspace (online when \
                   its dependencies are not cached yet)"
                .into(),
            action: Box::new(|| bench_locks(root)),
        },
        cargo_step(
            root,
            "clippy",
            &["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"],
        ),
        cargo_step(root, "tests", tests),
        // nextest does not run doctests.
        cargo_step(root, "doctests", &["test", "--workspace", "--doc", "--locked"]),
        Step {
            name: "codegen",
            what: "cargo xtask codegen --check, with the binaries the tests step built".into(),
            action: Box::new(|| {
                let built = Metadata::load(root, true)?.target_directory.join("debug");
                codegen::run(root, codegen::Mode::Check, codegen::Binaries::Built(&built))
                    .map(|()| Outcome::Passed)
            }),
        },
        Step {
            name: "tidy",
            what: "cargo xtask tidy".into(),
            action: Box::new(|| tidy::run(root).map(|()| Outcome::Passed)),
        },
        Step {
            name: "cargo deny",
            what: "cargo deny --locked check bans licenses sources".into(),
            action: Box::new(move || cargo_deny(root, deny_install)),
        },
        Step {
            name: "features",
            what: "cargo check -p toolmux --no-default-features, then with each feature alone; \
                   its unit tests with fs,mcp,rest,agent"
                .into(),
            action: Box::new(|| features(root)),
        },
        Step {
            name: "bench build",
            what: "cargo check --benches --locked for each benchmarks/* workspace".into(),
            action: Box::new(|| bench_build(root)),
        },
    ];

    let total = steps.len();
    let started = Instant::now();
    let mut summary = Vec::new();
    for (index, step) in steps.into_iter().enumerate() {
        let number = index + 1;
        eprintln!("\n==> [{number}/{total}] {}: {}", step.name, step.what);
        let step_started = Instant::now();
        let outcome = (step.action)();
        let elapsed = seconds(step_started.elapsed());
        let status = match outcome {
            Ok(Outcome::Passed) => {
                eprintln!("--> {} passed in {elapsed}", step.name);
                "passed".to_owned()
            }
            Ok(Outcome::Skipped(reason)) => {
                eprintln!("--> skipping {}: {reason}", step.name);
                "skipped".to_owned()
            }
            Err(error) => {
                print_summary(&summary, started.elapsed());
                return Err(error.context(format!(
                    "ci failed at step {number}/{total} ({}) after {elapsed}",
                    step.name
                )));
            }
        };
        summary.push(format!("{:<12} {status:<8} {elapsed}", step.name));
    }
    print_summary(&summary, started.elapsed());
    eprintln!("ci: all steps passed");
    Ok(())
}

/// `cargo bench [args]` in the workspace and in every benchmark workspace, for the
/// benchmark tables kept by hand.
pub(crate) fn bench(root: &Path, args: &[String]) -> Result<()> {
    // The gateway bench (toolmux-mcp's `serve`) drives the real release binary.
    let mut build = cmd::command("cargo");
    build.current_dir(root).args(["build", "--release", "--locked", "-p", "toolmux-cli"]);
    eprintln!("==> {}", cmd::display(&build));
    cmd::run(&mut build)?;
    for mut command in bench_commands(root, &[])? {
        command.args(args);
        eprintln!("==> {}", cmd::display(&command));
        cmd::run(&mut command)?;
    }
    eprintln!(
        "\nbench: criterion keeps its measurements under each workspace's target/criterion/ and \
         compares the next run against them; BENCHMARKS.md is maintained by hand from the \
         output above"
    );
    Ok(())
}

fn cargo_step<'a>(root: &'a Path, name: &'static str, args: &'a [&'a str]) -> Step<'a> {
    let mut command = cmd::command("cargo");
    command.current_dir(root).args(args);
    Step {
        name,
        what: cmd::display(&command),
        action: Box::new(move || cmd::run(&mut command).map(|()| Outcome::Passed)),
    }
}

/// The facade's features as Rust programs pick them: with none, and each alone, it builds
/// (the workspace's own builds enable them all together, which hides code gated by the
/// wrong feature); its unit tests pass with the providers but not `external`.
fn features(root: &Path) -> Result<Outcome> {
    for mut command in feature_commands(root) {
        cmd::run(&mut command)?;
    }
    Ok(Outcome::Passed)
}

/// The runs of [`features`], in order: `cargo check` of the facade without its default
/// features, then with each alone, then its unit tests once with the providers. The facade's
/// unit tests load files with every provider's section; run without `external` (which owns
/// `externalTools`, `spaces` and their defaults), they catch a test that assumes the
/// workspace's all-features build. One build more, not one per feature.
fn feature_commands(root: &Path) -> Vec<Command> {
    const RUNS: [(&[&str], &str); 10] = [
        (&["check"], ""),
        (&["check"], "fs"),
        (&["check"], "mcp"),
        (&["check"], "rest"),
        (&["check"], "external"),
        (&["check"], "agent"),
        (&["check"], "redis"),
        (&["check"], "otel"),
        (&["check"], "tower"),
        (&["test", "--lib"], "fs,mcp,rest,agent"),
    ];
    RUNS.iter()
        .map(|(verb, features)| {
            let mut command = cmd::command("cargo");
            command.current_dir(root).args(*verb).args([
                "--locked",
                "-p",
                "toolmux",
                "--no-default-features",
            ]);
            if !features.is_empty() {
                command.args(["--features", features]);
            }
            command
        })
        .collect()
}

fn has_cargo_deny() -> bool {
    cmd::succeeds(cmd::command("cargo").args(["deny", "--version"]))
}

/// `cargo install --locked cargo-deny` running in the background since the run began,
/// under `nice -n 19` where `nice` exists, in a process group of its own; dropped before it
/// ends (an earlier step failed), the whole group is killed and reaped.
struct DenyInstall {
    child: Option<std::process::Child>,
    log: PathBuf,
    started: Instant,
}

impl DenyInstall {
    /// The longest the cargo-deny step waits for the install (it takes about five minutes
    /// alone on two cores).
    const LIMIT: Duration = Duration::from_secs(40 * 60);

    fn start(root: &Path) -> Result<Self> {
        // A target directory of its own, so that the install never waits for the lock of
        // the workspace's build directory (and the workspace's builds never wait for it).
        let folder = Metadata::load(root, true)?.target_directory.join("xtask-tools");
        fs::create_dir_all(&folder)
            .with_context(|| format!("cannot create {}", folder.display()))?;
        let niced = cmd::succeeds(Command::new("nice").args(["-n", "19", "true"]));
        let mut command = if niced {
            let mut command = Command::new("nice");
            command.args(["-n", "19"]).arg(cmd::cargo());
            command
        } else {
            cmd::command("cargo")
        };
        command
            .args(["install", "--locked", "cargo-deny", "--target-dir"])
            .arg(folder.join("target"));
        let install = Self::spawn(command, folder.join("cargo-deny-install.log"))?;
        eprintln!(
            "cargo-deny is not installed: installing it in the background (log: {})",
            install.log.display()
        );
        Ok(install)
    }

    /// Starts `command` in a process group of its own, its output to the file `log`.
    fn spawn(mut command: Command, log: PathBuf) -> Result<Self> {
        use std::os::unix::process::CommandExt as _;

        let output =
            fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        command.stdin(Stdio::null()).stdout(output.try_clone()?).stderr(output).process_group(0);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start `{}`", cmd::display(&command)))?;
        Ok(Self { child: Some(child), log, started: Instant::now() })
    }

    /// Waits for the install, at most until [`Self::LIMIT`] after it started; the error
    /// ends with the log's last lines.
    fn wait(mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else { return Ok(()) };
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if self.started.elapsed() > Self::LIMIT {
                anyhow::bail!(
                    "installing cargo-deny took longer than {} minutes{}",
                    Self::LIMIT.as_secs() / 60,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        self.child = None;
        eprintln!("cargo-deny installed in the background in {}", seconds(self.started.elapsed()));
        if !status.success() {
            anyhow::bail!("installing cargo-deny failed ({status}){}", self.log_tail());
        }
        Ok(())
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!(":\n{}", lines[lines.len().saturating_sub(20)..].join("\n"))
    }
}

impl Drop for DenyInstall {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        // The group: cargo and the compilers it started.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn cargo_deny(root: &Path, install: Option<DenyInstall>) -> Result<Outcome> {
    if let Some(install) = install {
        if let Err(error) = install.wait() {
            return Ok(Outcome::Skipped(format!("{error:#}")));
        }
    } else if !has_cargo_deny() {
        return Ok(Outcome::Skipped(
            "cargo-deny is not installed (pass --install-tools or set CI=true to install it)"
                .into(),
        ));
    }
    let mut check = cmd::command("cargo");
    check.current_dir(root).args(["deny", "--locked", "check", "bans", "licenses", "sources"]);
    cmd::run(&mut check).map(|()| Outcome::Passed)
}

/// Checks, before the long steps, that every benchmark workspace's Cargo.lock still holds
/// what its manifests ask for: the bench build at the end runs `--locked`, and a dependency
/// added to a workspace crate that a benchmark uses, without its lock file updated, failed
/// CI only there.
fn bench_locks(root: &Path) -> Result<Outcome> {
    let manifests = bench_workspaces(root)?;
    if manifests.is_empty() {
        return Ok(Outcome::Skipped("no benchmark workspace under benchmarks/".into()));
    }
    for manifest in manifests {
        // Offline first: resolving from what cargo has cached takes a second and downloads
        // nothing. It also fails where the cache lacks the benchmark's own dependencies (a
        // fresh machine has only the workspace's), so a failure is asked again online,
        // which tells a stale lock file from a missing download and fetches what the bench
        // build would fetch anyway.
        if cmd::succeeds(&mut lock_check(root, &manifest, Network::Offline)) {
            continue;
        }
        let mut online = lock_check(root, &manifest, Network::Online);
        eprintln!("{}", cmd::display(&online));
        let lock = manifest.with_file_name("Cargo.lock");
        cmd::run(&mut online).with_context(|| {
            format!(
                "{} does not hold what {} asks for, or cargo could not resolve it (its error \
                 above says which); if it is stale, run `cargo update --workspace \
                 --manifest-path {}` and commit the lock file",
                lock.display(),
                manifest.display(),
                manifest.display()
            )
        })?;
    }
    Ok(Outcome::Passed)
}

/// Whether a cargo command may use the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Network {
    Offline,
    Online,
}

/// `cargo tree --locked` of the benchmark workspace `manifest`, its tree discarded: it
/// fails when the lock file would have to change.
fn lock_check(root: &Path, manifest: &Path, network: Network) -> Command {
    let mut command = cmd::command("cargo");
    command.current_dir(root).args(["tree", "--locked"]);
    if network == Network::Offline {
        command.arg("--offline");
    }
    command.arg("--manifest-path").arg(manifest).stdout(Stdio::null());
    command
}

/// Type-checks the benchmark workspaces. The workspace's own bench targets are already
/// compiled by clippy's `--all-targets`; building any of them in release mode would double
/// CI's build time for no extra assurance, since benchmarks are never run in CI.
fn bench_build(root: &Path) -> Result<Outcome> {
    let manifests = bench_workspaces(root)?;
    if manifests.is_empty() {
        return Ok(Outcome::Skipped("no benchmark workspace under benchmarks/".into()));
    }
    for manifest in manifests {
        let mut command = cmd::command("cargo");
        command
            .current_dir(root)
            .args(["check", "--benches", "--locked", "--manifest-path"])
            .arg(manifest);
        eprintln!("{}", cmd::display(&command));
        cmd::run(&mut command)?;
    }
    Ok(Outcome::Passed)
}

/// `cargo bench {args}` for the workspace if any of its crates has a bench target, and
/// for every benchmark workspace: `benchmarks/*/Cargo.toml`, workspaces of their own so
/// that the peers they measure against never enter the product's dependency tree.
fn bench_commands(root: &Path, args: &[&str]) -> Result<Vec<Command>> {
    let mut commands = Vec::new();
    let metadata = Metadata::load(root, true)?;
    let has_benches = metadata
        .workspace_packages()
        .any(|package| package.target_kinds.iter().any(|kind| kind == "bench"));
    if has_benches {
        let mut command = cmd::command("cargo");
        command.current_dir(root).args(["bench", "--workspace"]).args(args);
        commands.push(command);
    }
    for manifest in bench_workspaces(root)? {
        let mut command = cmd::command("cargo");
        command.current_dir(root).arg("bench").arg("--manifest-path").arg(manifest).args(args);
        commands.push(command);
    }
    Ok(commands)
}

/// `benchmarks/*/Cargo.toml`, relative to `root`, sorted.
fn bench_workspaces(root: &Path) -> Result<Vec<PathBuf>> {
    let dir = root.join("benchmarks");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error).context(format!("cannot list {}", dir.display())),
    };
    let mut manifests = Vec::new();
    for entry in entries {
        let manifest = entry?.path().join("Cargo.toml");
        if manifest.is_file() {
            manifests.push(walk::relative(root, &manifest));
        }
    }
    manifests.sort();
    Ok(manifests)
}

fn has_nextest() -> bool {
    cmd::succeeds(cmd::command("cargo").args(["nextest", "--version"]))
}

fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

fn print_summary(summary: &[String], total: Duration) {
    eprintln!("\nci summary:");
    for line in summary {
        eprintln!("  {line}");
    }
    eprintln!("  total        {}", seconds(total));
}

fn seconds(duration: Duration) -> String {
    format!("{:.1}s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests;
