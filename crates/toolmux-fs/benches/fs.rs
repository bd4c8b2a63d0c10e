//! Benchmarks of toolmux-fs against its peers: `fs__grep` against the `rg` binary on the
//! same tree and patterns, the peak memory of `read` of the last page of a 1 GiB file, and
//! a `bash` call (process group, sandbox, sweep for what left the group) against a plain
//! spawn of `bash -c` in a process group of its own.
//!
//! Run with `cargo bench -p toolmux-fs --bench fs` (needs `rg` on PATH: Debian's `ripgrep`
//! package). `cargo xtask bench` installs it. Options: `--quick` (fewer runs, smaller read
//! file), `--tree DIR` (grep an existing tree instead of the generated one), `--bash` (only
//! the `bash` comparison), `--protect` (only `bash` with the user's `protect` and `hide`
//! lines, against without), `--glob` (only `fs__glob` on the tree, beside `rg --files`),
//! `--other-runs` (only `bash` with none and with 500 other runs' output directories in
//! `/tmp`, each hidden from the command; as root, in a mount namespace of its own with an
//! empty `/tmp`), `--task-reads` (only ten `task_output` calls in a row on a running
//! background task in a tree of 200,000 files, each of which may walk the tree for a
//! repository the task made; `--tree DIR` walks an existing tree instead). The tables it
//! prints are what BENCHMARKS-fs.md records.

use serde_json::json;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use toolmux_core::{CallContext, ToolProvider};
use toolmux_fs::{FsConfig, FsProvider};

/// Files of the generated tree.
const FILES: usize = 12_000;
/// Lines per generated file.
const LINES_PER_FILE: usize = 400;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--read-last-page") {
        let file = PathBuf::from(&args[at + 1]);
        let offset: u64 = args[at + 2].parse().expect("offset is a number");
        read_last_page(&file, offset);
        return;
    }
    // `cargo test --benches` runs bench binaries with `--bench` absent; only do the work
    // when asked to benchmark.
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--protect") {
        let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/toolmux-fs-bench/tree");
        generate_tree(&tree);
        bash_with_protect_lines(&tree, quick);
        return;
    }
    if args.iter().any(|a| a == "--other-runs") {
        bash_beside_other_runs(quick);
        return;
    }
    if args.iter().any(|a| a == "--task-reads") {
        let given = args.iter().position(|a| a == "--tree").map(|at| PathBuf::from(&args[at + 1]));
        task_reads(given.as_deref(), quick);
        return;
    }
    if args.iter().any(|a| a == "--glob") {
        let tree = match args.iter().position(|a| a == "--tree") {
            Some(at) => PathBuf::from(&args[at + 1]),
            None => {
                let tree = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../target/toolmux-fs-bench/tree");
                generate_tree(&tree);
                tree
            }
        };
        glob_against_rg_files(&tree, quick);
        return;
    }
    bash_against_a_spawn(quick);
    if args.iter().any(|a| a == "--bash") {
        return;
    }
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/toolmux-fs-bench");
    let tree = match args.iter().position(|a| a == "--tree") {
        Some(at) => PathBuf::from(&args[at + 1]),
        None => {
            let tree = data.join("tree");
            generate_tree(&tree);
            tree
        }
    };
    let mut out = std::io::stdout().lock();
    let rg = Command::new("rg").arg("--version").output();
    let rg_version = match rg {
        Ok(o) if o.status.success() => {
            String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default().to_owned()
        }
        _ => panic!(
            "missing benchmark peer rg: install Debian's ripgrep package (apt-get install -y ripgrep)"
        ),
    };
    let (files, bytes) = tree_size(&tree);
    writeln!(
        out,
        "tree: {} ({files} files, {:.1} MiB); peer: {rg_version}; cores: {}",
        tree.display(),
        bytes as f64 / 1048576.0,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    )
    .expect("write to stdout");
    writeln!(out).expect("write to stdout");
    writeln!(out, "| case | rg min / median | fs__grep min / median | ratio of mins / medians |")
        .expect("write to stdout");
    writeln!(out, "|---|---|---|---|").expect("write to stdout");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let fs = FsProvider::new(FsConfig::new(&tree)).expect("provider");
    let runs = if quick { 3 } else { 15 };
    let cases: [(&str, &[&str], serde_json::Value); 4] = [
        (
            "literal",
            &["-n", "PlantedNeedle"],
            json!({"pattern": "PlantedNeedle", "output_mode": "content", "head_limit": 0}),
        ),
        (
            "regex",
            &["-n", r"\w+_handler\(\d{3}\)"],
            json!({"pattern": r"\w+_handler\(\d{3}\)", "output_mode": "content", "head_limit": 0}),
        ),
        (
            "case-insensitive",
            &["-n", "-i", "plantedneedle"],
            json!({"pattern": "plantedneedle", "-i": true, "output_mode": "content", "head_limit": 0}),
        ),
        (
            "files_with_matches",
            &["-l", "error"],
            json!({"pattern": "error", "output_mode": "files_with_matches", "head_limit": 0}),
        ),
    ];
    for (name, rg_args, fs_args) in cases {
        let mut rg_times = Vec::new();
        let mut fs_times = Vec::new();
        // One warm-up each, then alternate so both see the same cache state.
        let rg_count = run_rg(&tree, rg_args).1;
        let fs_count = runtime.block_on(run_fs(&fs, fs_args.clone())).1;
        for _ in 0..runs {
            rg_times.push(run_rg(&tree, rg_args).0);
            fs_times.push(runtime.block_on(run_fs(&fs, fs_args.clone())).0);
        }
        let (rg_median, fs_median) = (median(&mut rg_times), median(&mut fs_times));
        let (rg_min, fs_min) = (rg_times[0], fs_times[0]);
        writeln!(
            out,
            "| {name} ({rg_count} rg lines / {fs_count} fs lines) | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.2}x / {:.2}x |",
            ms(rg_min),
            ms(rg_median),
            ms(fs_min),
            ms(fs_median),
            ms(fs_min) / ms(rg_min),
            ms(fs_median) / ms(rg_median)
        )
        .expect("write to stdout");
    }
    writeln!(out).expect("write to stdout");
    let size: u64 = if quick { 256 << 20 } else { 1 << 30 };
    let (big, lines) = generate_big_file(&data, size);
    let offset = lines.saturating_sub(1999);
    let started = Instant::now();
    let child = Command::new(std::env::current_exe().expect("bench binary path"))
        .args(["--read-last-page", &big.to_string_lossy(), &offset.to_string()])
        .current_dir(&data)
        .output()
        .expect("run the read measurement");
    let report = String::from_utf8_lossy(&child.stdout);
    writeln!(out, "read of the last page (offset {offset}, 2000 lines) of a {} MiB file, {lines} lines: {} ({:.0} ms wall, child process)",
        size >> 20, report.trim(), ms(started.elapsed())).expect("write to stdout");
}

/// `fs__bash` of `true` against spawning `bash -c true` in a process group of its own and
/// waiting for it (what an agent's shell tool does at least), alternating; then the same
/// with 500 more processes running, since the sweep for processes that left the group reads
/// every process's environment.
fn bash_against_a_spawn(quick: bool) {
    use std::os::unix::process::CommandExt as _;
    let mut out = std::io::stdout().lock();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let root = tempfile::tempdir().expect("a temporary directory");
    let config = FsConfig::new(root.path())
        .with_permissions([toolmux_fs::Permission::Read, toolmux_fs::Permission::Execute]);
    let fs = FsProvider::new(config).expect("provider");
    // The same in a repository: its `.git` is mounted read-only in a namespace per command.
    let repository = tempfile::tempdir().expect("a temporary directory");
    std::fs::create_dir(repository.path().join(".git")).expect("a .git directory");
    let config = FsConfig::new(repository.path())
        .with_permissions([toolmux_fs::Permission::Read, toolmux_fs::Permission::Execute]);
    let in_repository = FsProvider::new(config).expect("provider");
    // The network off, with 200 Unix sockets bound (a desktop session has that many): each
    // is covered in the command's mount namespace.
    let sockets = tempfile::tempdir().expect("a temporary directory");
    let _listeners: Vec<_> = (0..200)
        .map(|i| {
            std::os::unix::net::UnixListener::bind(sockets.path().join(format!("{i}.sock")))
                .expect("a Unix socket")
        })
        .collect();
    let bash = toolmux_fs::BashConfig {
        sandbox: toolmux_fs::SandboxConfig::default().with_network(false),
        ..toolmux_fs::BashConfig::default()
    };
    let config = FsConfig::new(root.path())
        .with_permissions([toolmux_fs::Permission::Read, toolmux_fs::Permission::Execute])
        .with_bash(bash);
    let offline = FsProvider::new(config).expect("provider");
    let runs = if quick { 30 } else { 300 };
    let processes = || {
        std::fs::read_dir("/proc").map_or(0, |d| {
            d.flatten().filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok()).count()
        })
    };
    writeln!(out, "| processes running | `bash -c true` spawned in its own group, median | `fs__bash` `true`, median | difference | the sweep alone, median | `fs__bash` `true` beside a read-only `.git`, median | `fs__bash` `true` with `network: false` and 200 more Unix sockets bound, median |")
        .expect("write to stdout");
    writeln!(out, "|--:|--:|--:|--:|--:|--:|--:|").expect("write to stdout");
    let mut extra = Vec::new();
    for more in [0, 500] {
        while extra.len() < more {
            extra.push(Command::new("sleep").arg("600").spawn().expect("sleep runs"));
        }
        let (mut spawned, mut called, mut swept) = (Vec::new(), Vec::new(), Vec::new());
        let (mut viewed, mut covered) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let started = Instant::now();
            let status = Command::new("bash")
                .args(["-c", "true"])
                .current_dir(root.path())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .output()
                .expect("bash runs");
            assert!(status.status.success());
            spawned.push(started.elapsed());
            called.push(bash_true(&runtime, &fs));
            viewed.push(bash_true(&runtime, &in_repository));
            covered.push(bash_true(&runtime, &offline));
            let mark = toolmux_core::ProcessMark::new();
            let started = Instant::now();
            assert!(mark.sweep().is_empty());
            swept.push(started.elapsed());
        }
        let (spawn, call, sweep) = (median(&mut spawned), median(&mut called), median(&mut swept));
        writeln!(
            out,
            "| {} | {:.2} ms | {:.2} ms | {:+.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            processes(),
            ms(spawn),
            ms(call),
            ms(call) - ms(spawn),
            ms(sweep),
            ms(median(&mut viewed)),
            ms(median(&mut covered))
        )
        .expect("write to stdout");
    }
    for mut child in extra {
        let _ = child.kill();
        let _ = child.wait();
    }
    writeln!(out).expect("write to stdout");
}

/// `fs__bash` of `true` in a tree of [`FILES`] files (about 5,400 folders) with the user's
/// `protect` and `hide` lines, which a walk before each command finds, against the same
/// without them.
fn bash_with_protect_lines(tree: &Path, quick: bool) {
    let mut out = std::io::stdout().lock();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let provider = |lines: bool| {
        let config = FsConfig::new(tree)
            .with_permissions([toolmux_fs::Permission::Read, toolmux_fs::Permission::Execute]);
        let config =
            if lines { config.with_protect(["**/.env"]).with_hide(["secrets/"]) } else { config };
        FsProvider::new(config).expect("provider")
    };
    let (plain, protected) = (provider(false), provider(true));
    let runs = if quick { 10 } else { 60 };
    let call = |fs: &FsProvider| bash_true(&runtime, fs);
    // Each round: a call without the lines, then, with them, a call after more than the
    // two seconds what they matched is used again (a walk) and one right after (none).
    let (mut without, mut walked, mut again) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        without.push(call(&plain));
        std::thread::sleep(Duration::from_millis(2_100));
        walked.push(call(&protected));
        again.push(call(&protected));
    }
    writeln!(out, "| entries in the tree | `fs__bash` `true`, median | with `protect` and `hide` lines, walking the tree, median | the same within 2 s of the last walk, median |")
        .expect("write to stdout");
    writeln!(out, "|--:|--:|--:|--:|").expect("write to stdout");
    let entries = walkdir_count(tree);
    writeln!(
        out,
        "| {entries} | {:.2} ms | {:.2} ms | {:.2} ms |",
        ms(median(&mut without)),
        ms(median(&mut walked)),
        ms(median(&mut again))
    )
    .expect("write to stdout");
}

/// `fs__bash` of `true` where the server hides its output directory from commands, with no
/// other runs' output directories in `/tmp` and then with 500 (`toolmux-` and eight hex
/// digits, as a long-lived machine gathers), each of which every command has hidden by a
/// mount of its own. In a mount namespace of its own with a fresh `/tmp`, so that the
/// machine's own are not counted and none is left behind.
fn bash_beside_other_runs(quick: bool) {
    // Run again inside `unshare -m` with a tmpfs on `/tmp` (lints forbid `unsafe` here).
    if std::env::var_os("TOOLMUX_BENCH_PRIVATE_TMP").is_none() {
        let exe = std::env::current_exe().expect("the bench binary");
        let mut args = vec!["--bench", "--other-runs"];
        if quick {
            args.push("--quick");
        }
        let status = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg("mount -t tmpfs tmpfs /tmp && exec \"$0\" \"$@\"")
            .arg(exe)
            .args(args)
            .env("TOOLMUX_BENCH_PRIVATE_TMP", "1")
            .env("TMPDIR", "/tmp")
            .status()
            .expect("unshare runs");
        assert!(status.success(), "--other-runs needs root (unshare -m and a tmpfs on /tmp)");
        return;
    }
    let mut out = std::io::stdout().lock();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let root = tempfile::tempdir_in("/tmp").expect("a temporary directory");
    let outputs = root.path().join("outputs");
    let config = FsConfig::new(root.path())
        .with_permissions([toolmux_fs::Permission::Read, toolmux_fs::Permission::Execute])
        .with_protected(toolmux_fs::ProtectedPath::new(
            &outputs,
            toolmux_fs::ProtectedKind::OutputDir,
        ));
    let fs = FsProvider::new(config).expect("provider");
    let runs = if quick { 30 } else { 300 };
    let call = || bash_true(&runtime, &fs);
    call();
    let mut none: Vec<Duration> = (0..runs).map(|_| call()).collect();
    for n in 0..500u32 {
        let dir = format!("/tmp/toolmux-{:08x}", n.wrapping_mul(0x9e37_79b9));
        std::fs::create_dir(dir).expect("an output directory");
    }
    call();
    let mut many: Vec<Duration> = (0..runs).map(|_| call()).collect();
    writeln!(out, "| other runs' output directories in `/tmp` | `fs__bash` `true`, median |")
        .expect("write to stdout");
    writeln!(out, "|--:|--:|").expect("write to stdout");
    writeln!(out, "| 0 | {:.2} ms |", ms(median(&mut none))).expect("write to stdout");
    writeln!(out, "| 500 | {:.2} ms |", ms(median(&mut many))).expect("write to stdout");
}

/// Ten `task_output` calls in a row (no `block_ms`) on a background task that sleeps, in a
/// tree of 200,000 empty files in 2,000 folders (made in the temporary directory and
/// removed after) or in `tree`: each read may walk the tree for a repository the task
/// made (`TaskCheck`). Rounds of ten, the first of each round and the ten together.
fn task_reads(tree: Option<&Path>, quick: bool) {
    let mut out = std::io::stdout().lock();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let made;
    let tree = match tree {
        Some(tree) => tree.to_owned(),
        None => {
            made = tempfile::tempdir().expect("a temporary directory");
            for folder in 0..2_000 {
                let dir = made.path().join(format!("d{:02}/e{folder:04}", folder % 50));
                std::fs::create_dir_all(&dir).expect("a folder of the tree");
                for file in 0..100 {
                    std::fs::File::create(dir.join(format!("f{file:03}.txt"))).expect("a file");
                }
            }
            made.path().to_owned()
        }
    };
    let config = FsConfig::new(&tree)
        .with_permissions([toolmux_fs::Permission::Read, toolmux_fs::Permission::Execute]);
    let fs = FsProvider::new(config).expect("provider");
    let call = |tool: &str, args: serde_json::Value| {
        let result = runtime.block_on(fs.call(tool, args, &CallContext::new())).expect("call");
        assert!(!result.is_error, "{}", result.to_text());
        result
    };
    let started = Instant::now();
    let task = call("bash", json!({"command": "exec sleep 3600", "run_in_background": true}));
    let start = started.elapsed();
    let id = task.extras["taskId"].as_str().expect("a task id").to_owned();
    let rounds = if quick { 2 } else { 5 };
    let (mut first, mut ten) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let round = Instant::now();
        for n in 0..10 {
            let read = Instant::now();
            call("task_output", json!({"task_id": id}));
            if n == 0 {
                first.push(read.elapsed());
            }
        }
        ten.push(round.elapsed());
    }
    call("task_kill", json!({"task_id": id}));
    let entries = walkdir_count(&tree);
    writeln!(out, "| entries in the tree | starting the task | first read of ten, median | ten reads, median | ten reads, slowest |")
        .expect("write to stdout");
    writeln!(out, "|--:|--:|--:|--:|--:|").expect("write to stdout");
    let slowest = ten.iter().max().copied().unwrap_or_default();
    writeln!(
        out,
        "| {entries} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
        ms(start),
        ms(median(&mut first)),
        ms(median(&mut ten)),
        ms(slowest)
    )
    .expect("write to stdout");
}

/// `fs__glob` on the tree (walk, match, the re-check of each matched name through the root's
/// handle, sorting newest first, formatting) against `rg --files` with the same glob, which
/// walks and matches only; alternating, one warm-up each.
fn glob_against_rg_files(tree: &Path, quick: bool) {
    let mut out = std::io::stdout().lock();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let fs = FsProvider::new(FsConfig::new(tree)).expect("provider");
    let runs = if quick { 3 } else { 15 };
    let glob = |args: serde_json::Value| {
        let started = Instant::now();
        let result =
            runtime.block_on(fs.call("glob", args, &CallContext::new())).expect("fs__glob runs");
        assert!(!result.is_error, "{}", result.to_text());
        let total = result.extras.get("total").and_then(|t| t.as_u64()).unwrap_or(0);
        (started.elapsed(), total)
    };
    let rg_files = |glob: &str| {
        let started = Instant::now();
        let output = Command::new("rg")
            .args(["--files", "--no-messages", "-g", glob])
            .current_dir(tree)
            .stdin(Stdio::null())
            .output()
            .expect("run rg");
        (started.elapsed(), output.stdout.iter().filter(|&&b| b == b'\n').count())
    };
    writeln!(out, "| case | files matched | `rg --files -g` min / median | `fs__glob` min / median | ratio of medians |")
        .expect("write to stdout");
    writeln!(out, "|---|--:|--:|--:|--:|").expect("write to stdout");
    let cases = [
        ("every file, newest first (limit 100)", "*.rs", json!({"pattern": "**/*.rs"})),
        (
            "every file, by path, all shown",
            "*.rs",
            json!({"pattern": "**/*.rs", "sort": "path", "limit": 100_000}),
        ),
        ("one name in 1,000", "f1??7.rs", json!({"pattern": "**/f1??7.rs"})),
    ];
    for (name, rg_glob, args) in cases {
        let (_, rg_count) = rg_files(rg_glob);
        let (_, fs_count) = glob(args.clone());
        let (mut rg_times, mut fs_times) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            rg_times.push(rg_files(rg_glob).0);
            fs_times.push(glob(args.clone()).0);
        }
        let (rg_median, fs_median) = (median(&mut rg_times), median(&mut fs_times));
        writeln!(
            out,
            "| {name} | {fs_count} ({rg_count} by rg) | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.2}x |",
            ms(rg_times[0]),
            ms(rg_median),
            ms(fs_times[0]),
            ms(fs_median),
            ms(fs_median) / ms(rg_median)
        )
        .expect("write to stdout");
    }
}

/// How long one `fs__bash` call of `true` through `fs` takes, which must succeed.
fn bash_true(runtime: &tokio::runtime::Runtime, fs: &FsProvider) -> Duration {
    let started = Instant::now();
    let result = runtime
        .block_on(fs.call("bash", json!({"command": "true"}), &CallContext::new()))
        .expect("fs__bash runs");
    assert!(!result.is_error, "{}", result.to_text());
    started.elapsed()
}

/// Files and folders beneath `dir`.
fn walkdir_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                1 + if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walkdir_count(&e.path())
                } else {
                    0
                }
            })
            .sum()
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn run_rg(tree: &Path, args: &[&str]) -> (Duration, usize) {
    let started = Instant::now();
    let output = Command::new("rg")
        .args(args)
        .args(["--no-heading", "--color", "never", "--no-messages", "--"])
        .current_dir(tree)
        .stdin(Stdio::null())
        .output()
        .expect("run rg");
    let elapsed = started.elapsed();
    (elapsed, output.stdout.iter().filter(|&&b| b == b'\n').count())
}

async fn run_fs(fs: &FsProvider, args: serde_json::Value) -> (Duration, usize) {
    let started = Instant::now();
    let out = fs.call("grep", args, &CallContext::new()).await.expect("fs grep");
    let elapsed = started.elapsed();
    (elapsed, out.to_text().lines().count())
}

/// Runs in a child process: one `read` of the last page, then the peak resident memory.
fn read_last_page(file: &Path, offset: u64) {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let root = file.parent().expect("file has a parent");
    let fs = FsProvider::new(FsConfig::new(root)).expect("provider");
    let name = file.file_name().expect("file name").to_string_lossy().into_owned();
    let started = Instant::now();
    let out = runtime
        .block_on(fs.call("read", json!({"path": name, "offset": offset}), &CallContext::new()))
        .expect("read");
    let elapsed = started.elapsed();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let peak =
        status.lines().find(|l| l.starts_with("VmHWM:")).unwrap_or("VmHWM: ?").trim().to_owned();
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "peak RSS {} ; read took {:.0} ms; returned {} lines, totalLines {}",
        peak.trim_start_matches("VmHWM:").trim(),
        ms(elapsed),
        out.to_text().lines().filter(|l| l.contains('\t')).count(),
        out.extras["totalLines"]
    )
    .expect("write to stdout");
}

/// A deterministic xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

const WORDS: &[&str] = &[
    "let",
    "fn",
    "struct",
    "impl",
    "return",
    "match",
    "self",
    "value",
    "count",
    "index",
    "buffer",
    "request",
    "response",
    "config",
    "error",
    "result",
    "Option",
    "Vec",
    "String",
    "map",
    "into",
    "iter",
    "collect",
    "unwrap_or",
    "len",
    "push",
    "async",
    "await",
    "pub",
    "mod",
    "use",
    "crate",
];

/// A tree of source-like files, made once and reused.
fn generate_tree(tree: &Path) {
    let marker = tree.join(".complete");
    if marker.exists() {
        return;
    }
    let _ = std::fs::remove_dir_all(tree);
    let mut rng = Rng(0x00c0_ffee_1234_5678);
    for i in 0..FILES {
        let dir = tree.join(format!("d{:03}/s{:02}", i % 300, i % 17));
        std::fs::create_dir_all(&dir).expect("create tree dir");
        let mut file = BufWriter::new(
            std::fs::File::create(dir.join(format!("f{i}.rs"))).expect("create file"),
        );
        for line in 0..LINES_PER_FILE {
            let mut text = String::with_capacity(100);
            text.push_str(&"    ".repeat((rng.next() % 4) as usize));
            for _ in 0..(4 + rng.next() % 10) {
                text.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
                text.push(' ');
            }
            let roll = rng.next() % 1000;
            if roll == 0 {
                text.push_str("PlantedNeedle();");
            } else if roll < 4 {
                text.push_str(&format!("process_handler({})", 100 + rng.next() % 900));
            }
            let _ = line;
            writeln!(file, "{text}").expect("write line");
        }
        file.flush().expect("flush");
    }
    std::fs::write(marker, "").expect("marker");
}

/// A text file of `size` bytes (100-byte lines), made once; returns it and its line count.
fn generate_big_file(data: &Path, size: u64) -> (PathBuf, u64) {
    let dir = data.join(format!("big-{}", size >> 20));
    let path = dir.join("big.txt");
    let lines = size / 100;
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == lines * 100) {
        return (path, lines);
    }
    std::fs::create_dir_all(&dir).expect("create big dir");
    let mut file =
        BufWriter::with_capacity(1 << 20, std::fs::File::create(&path).expect("create big"));
    for i in 0..lines {
        let mut line = format!("line {i:>12} ");
        while line.len() < 99 {
            line.push('x');
        }
        line.push('\n');
        file.write_all(line.as_bytes()).expect("write big");
    }
    file.flush().expect("flush big");
    (path, lines)
}

fn tree_size(tree: &Path) -> (usize, u64) {
    let mut stack = vec![tree.to_path_buf()];
    let (mut files, mut bytes) = (0, 0);
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                files += 1;
                bytes += meta.len();
            }
        }
    }
    (files, bytes)
}
