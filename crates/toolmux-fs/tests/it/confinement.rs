//! The adversarial confinement test: a tree full of symlinks and thousands of generated
//! paths through every file tool; nothing outside the root is read, listed, created or
//! changed.

use crate::Fixture;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use toolmux_core::{CallContext, ToolProvider};

const SECRET: &str = "SENTINEL-SECRET-CONTENT";
const SECRET_NAME: &str = "sentinel-secret-name-q7";

/// Every file and directory under `dir` (symlinks not followed), with contents.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let what = if meta.is_symlink() {
                format!("link {:?}", std::fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_owned()
            } else {
                format!("file {:?} {:?}", std::fs::read(&path).unwrap(), meta.modified().unwrap())
            };
            out.insert(path, what);
        }
    }
    out
}

/// A fixed, seeded generator (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

fn build_tree(fx: &Fixture) -> PathBuf {
    let root = fx.root();
    let sentinel = fx.outside().join("sentinel");
    std::fs::create_dir_all(sentinel.join("sub")).unwrap();
    std::fs::write(sentinel.join("secret.txt"), format!("{SECRET}\nx\n")).unwrap();
    std::fs::write(sentinel.join("sub").join(SECRET_NAME), SECRET).unwrap();
    std::fs::write(fx.outside().join("beside.txt"), SECRET).unwrap();
    fx.put("ok.txt", "inside x\n");
    fx.put("dir/inner.txt", "inner x\n");
    fx.put("ünïcode/файл.txt", "unicode x\n");
    let links: &[(&str, PathBuf)] = &[
        ("to_root", PathBuf::from("/")),
        ("to_parent", PathBuf::from("..")),
        ("to_sentinel", PathBuf::from("../sentinel")),
        ("abs_sentinel", sentinel.clone()),
        ("abs_root_inside", root.join("dir")),
        ("chain1", PathBuf::from("chain2")),
        ("chain2", PathBuf::from("to_sentinel")),
        ("loop1", PathBuf::from("loop2")),
        ("loop2", PathBuf::from("loop1")),
        ("dangling", PathBuf::from("nowhere")),
        ("dangling_out", PathBuf::from("../sentinel/new-file")),
        ("file_link_out", PathBuf::from("../sentinel/secret.txt")),
        ("inner_link", PathBuf::from("ok.txt")),
        ("dir/up", PathBuf::from("../..")),
        ("dir/self", PathBuf::from(".")),
        ("ünïcode/lïnk", PathBuf::from("../../sentinel/secret.txt")),
        ("ünïcode/out_dir", PathBuf::from("../../sentinel/sub")),
    ];
    for (name, target) in links {
        symlink(target, root.join(name)).unwrap();
    }
    sentinel
}

fn generate(rng: &mut Rng, fx: &Fixture, sentinel: &Path) -> String {
    let parts = [
        "..",
        ".",
        "to_root",
        "to_parent",
        "to_sentinel",
        "abs_sentinel",
        "abs_root_inside",
        "chain1",
        "loop1",
        "dangling",
        "dangling_out",
        "file_link_out",
        "inner_link",
        "dir",
        "up",
        "self",
        "ünïcode",
        "lïnk",
        "out_dir",
        "файл.txt",
        "ok.txt",
        "inner.txt",
        "secret.txt",
        "sub",
        "sentinel",
        "etc",
        "passwd",
        "new.txt",
        "new-file",
        "x",
        "..\u{2044}..",
        "",
        "/",
        "root",
        "%2e%2e",
        "\u{202e}txt",
        "a b",
    ];
    let root = fx.root();
    let root_s = root.to_string_lossy().into_owned();
    let sentinel_s = sentinel.to_string_lossy().into_owned();
    let outside_s = fx.outside().to_string_lossy().into_owned();
    let prefix = match rng.next() % 8 {
        0 => format!("{root_s}/"),
        1 => format!("{sentinel_s}/"),
        2 => "/".to_owned(),
        3 => format!("{root_s}/../"),
        4 => format!("{outside_s}/"),
        _ => String::new(),
    };
    let count = 1 + rng.next() % 5;
    let body: Vec<&str> = (0..count).map(|_| rng.pick(&parts)).collect();
    format!("{prefix}{}", body.join("/"))
}

fn calls(path: &str, i: usize) -> Vec<(&'static str, Value)> {
    vec![
        ("read", json!({"path": path})),
        ("write", json!({"path": path, "content": format!("PWNED {i}\n")})),
        ("edit", json!({"path": path, "old_string": "x", "new_string": "PWNED"})),
        ("edit", json!({"path": path, "old_string": "", "new_string": "PWNED"})),
        (
            "multi_edit",
            json!({"path": path, "edits": [{"old_string": "x", "new_string": "PWNED"}]}),
        ),
        (
            "apply_patch",
            json!({"input": format!("*** Begin Patch\n*** Update File: {path}\n@@\n-x\n+PWNED\n*** End Patch")}),
        ),
        (
            "apply_patch",
            json!({"input": format!("*** Begin Patch\n*** Add File: {path}\n+PWNED {i}\n*** End Patch")}),
        ),
        (
            "apply_patch",
            json!({"input": format!(
                "*** Begin Patch\n*** Add File: moving-{i}.txt\n+x\n*** Update File: moving-{i}.txt\n\
                 *** Move to: {path}\n@@\n-x\n+PWNED {i}\n*** End Patch"
            )}),
        ),
        (
            "grep",
            json!({"pattern": "SENTINEL|secret|PWNED|root:", "path": path, "output_mode": "content", "-i": true}),
        ),
        (
            "grep",
            json!({"pattern": ".", "path": path, "output_mode": "files_with_matches", "head_limit": 0}),
        ),
        ("glob", json!({"pattern": "**/*", "path": path, "limit": 1000})),
        ("ls", json!({"path": path, "depth": 4, "limit": 1000})),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_generated_paths_never_leave_the_root() {
    let fx = Fixture::with(|c| {
        c.with_permissions([toolmux_fs::Permission::Read, toolmux_fs::Permission::Write])
    });
    let sentinel = build_tree(&fx);
    let outside_before = snapshot_outside(&fx);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut checked = 0;
    for i in 0..1500 {
        let path = generate(&mut rng, &fx, &sentinel);
        for (tool, args) in calls(&path, i) {
            // One run per path: a read in it lets the write of that path be tried too.
            let ctx = CallContext::new().with_run_id(format!("run-{i}"));
            let text = match fx.fs.call(tool, args, &ctx).await {
                Ok(out) => out.to_text(),
                Err(e) => e.report(),
            };
            // The caller's own path is echoed in messages; anything else is a leak.
            let text = text.replace(&path, "<path>");
            for leak in [SECRET, SECRET_NAME, "root:x:0:0", "beside.txt"] {
                assert!(!text.contains(leak), "{tool} on `{path}` leaked `{leak}`: {text}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 13_000);
    assert_eq!(snapshot_outside(&fx), outside_before, "something outside the root changed");
}

/// Everything in the temporary directory except the root.
fn snapshot_outside(fx: &Fixture) -> BTreeMap<PathBuf, String> {
    let root = fx.root();
    snapshot(&fx.outside()).into_iter().filter(|(p, _)| !p.starts_with(&root)).collect()
}

#[tokio::test]
async fn each_escape_kind_is_refused_with_the_path_named() {
    let fx = Fixture::with(|c| {
        c.with_permissions([toolmux_fs::Permission::Read, toolmux_fs::Permission::Write])
    });
    let sentinel = build_tree(&fx);
    let abs = sentinel.join("secret.txt");
    for path in [
        "../sentinel/secret.txt",
        abs.to_str().unwrap(),
        "to_sentinel/secret.txt",
        "file_link_out",
        "chain1/secret.txt",
        "ünïcode/lïnk",
        "dir/up/sentinel/secret.txt",
        "to_root/etc/passwd",
    ] {
        let err = fx.call("read", json!({"path": path})).await.unwrap_err().report();
        assert!(
            err.contains(&format!("path `{path}` is outside the workspace root")),
            "{path}: {err}"
        );
    }
    for path in
        ["to_sentinel/new.txt", "dangling_out", "to_parent/new.txt", "ünïcode/out_dir/n.txt"]
    {
        let err =
            fx.call("write", json!({"path": path, "content": "x"})).await.unwrap_err().report();
        assert!(
            err.contains(&format!("path `{path}` is outside the workspace root")),
            "{path}: {err}"
        );
    }
    let err = fx.call("read", json!({"path": "loop1"})).await.unwrap_err().report();
    assert!(err.contains("loop1"), "{err}");
    let err = fx.call("ls", json!({"path": "to_sentinel"})).await.unwrap_err().report();
    assert!(err.contains("outside the workspace root"), "{err}");
    let err =
        fx.call("grep", json!({"pattern": "x", "path": "to_root"})).await.unwrap_err().report();
    assert!(err.contains("outside the workspace root"), "{err}");
    // Inside the root, symlinks work.
    assert_eq!(fx.ok("read", json!({"path": "inner_link"})).await, "     1\tinside x\n");
    // Absolute symlink targets are refused even when they point inside the root: the
    // resolver never interprets absolute paths found on disk.
    let err =
        fx.call("read", json!({"path": "abs_root_inside/inner.txt"})).await.unwrap_err().report();
    assert!(err.contains("outside the workspace root"), "{err}");
    assert!(!sentinel.join("new.txt").exists());
}

/// A hard link beneath the root to a file outside is that file under a name inside, which
/// nothing tells from the root's own files (package stores such as pnpm's and uv's link
/// files into projects), so it is read: a limit the crate docs state. No file tool writes
/// through it: each replaces the name inside, and the file outside keeps its content.
#[tokio::test]
async fn a_hard_link_to_a_file_outside_is_read_but_never_written_through() {
    let fx = Fixture::new();
    let outside = fx.outside().join("linked.txt");
    std::fs::write(&outside, "outside\n").unwrap();
    for name in ["edited.txt", "written.txt", "patched.txt"] {
        std::fs::hard_link(&outside, fx.root().join(name)).unwrap();
    }
    assert_eq!(fx.ok("read", json!({"path": "edited.txt"})).await, "     1\toutside\n");
    let edit = json!({"path": "edited.txt", "old_string": "outside", "new_string": "edited"});
    fx.ok("edit", edit).await;
    fx.ok("read", json!({"path": "written.txt"})).await;
    fx.ok("write", json!({"path": "written.txt", "content": "written\n"})).await;
    let patch = "*** Begin Patch\n*** Update File: patched.txt\n-outside\n+patched\n*** End Patch";
    fx.ok("apply_patch", json!({"input": patch})).await;
    assert_eq!(
        [fx.get("edited.txt"), fx.get("written.txt"), fx.get("patched.txt")],
        ["edited\n", "written\n", "patched\n"]
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "outside\n");
}

/// A folder swapped for a symlink to a folder outside while `glob` walks (`mv -T d d.real &&
/// ln -s OUTSIDE d`, and back, in a loop): no name from outside is ever returned. The walker
/// lists folders by path, so a listing can come from outside; each name found is looked up
/// again through the root's handle before it is shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glob_lists_nothing_outside_while_a_folder_is_swapped_for_a_symlink() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fx = Fixture::new();
    let outside = fx.outside().join("elsewhere");
    std::fs::create_dir(&outside).unwrap();
    for i in 0..300 {
        std::fs::write(outside.join(format!("s-outside-{i}.txt")), "x").unwrap();
    }
    for d in 0..20 {
        for i in 0..100 {
            fx.put(&format!("tree/d{d:03}/s{i}.txt"), "x");
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let swaps: Vec<_> = ["tree/d005", "tree/d010", "tree/d015"]
        .into_iter()
        .map(|dir| {
            let (stop, dir, outside) = (stop.clone(), fx.root().join(dir), outside.clone());
            std::thread::spawn(move || {
                let real = dir.with_extension("real");
                let mut swapped = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    std::fs::rename(&dir, &real).unwrap();
                    symlink(&outside, &dir).unwrap();
                    std::fs::remove_file(&dir).unwrap();
                    std::fs::rename(&real, &dir).unwrap();
                    swapped += 1;
                }
                swapped
            })
        })
        .collect();
    let started = std::time::Instant::now();
    let mut runs = 0;
    let mut listed = 0;
    while started.elapsed() < std::time::Duration::from_secs(4) {
        let args = json!({"pattern": "tree/**/s*.txt", "limit": 100_000, "sort": "path"});
        let text = fx.ok("glob", args).await;
        let leaked: Vec<&str> = text.lines().filter(|l| l.contains("outside")).collect();
        if !leaked.is_empty() {
            stop.store(true, Ordering::Relaxed);
            panic!("run {runs}: {} names from outside, such as {:?}", leaked.len(), &leaked[..1]);
        }
        listed += text.lines().count();
        runs += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let swapped: u64 = swaps.into_iter().map(|s| s.join().unwrap()).sum();
    assert!(swapped > 100 && runs > 3, "{swapped} swaps, {runs} runs");
    // The folders not swapped are always listed whole.
    assert!(listed >= runs * 1700, "{listed} names in {runs} runs");
}
