//! Repositories inside the workspace that are not submodules (a `git clone` beneath the
//! root, or several repositories side by side under it): their own ignore files apply
//! inside them and the outer repository's do not, as git has it, whichever folder a
//! search starts in; their `.git` stays out of what `grep`, `glob` and `ls` show.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;
use std::path::Path;

/// Runs `git` in `dir`, failing the test when it fails.
fn git(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A root repository ignoring `*.log` (its `.gitignore`) and `local.txt` (its
/// `.git/info/exclude`), with a repository cloned into `vendor/lib` that ignores `gen/` and
/// `excluded.txt` its own ways and keeps a `.log` file; every file holds `needle`.
fn workspace() -> Fixture {
    let fx = Fixture::new();
    let root = fx.root();
    git(&root, &["init", "-q"]);
    fx.put(".gitignore", "*.log\n");
    std::fs::write(root.join(".git/info/exclude"), "local.txt\n").unwrap();
    for file in ["src/a.txt", "src/local.txt", "src/b.log"] {
        fx.put(file, "needle\n");
    }
    let lib = root.join("vendor/lib");
    std::fs::create_dir_all(&lib).unwrap();
    git(&lib, &["init", "-q"]);
    fx.put("vendor/lib/.gitignore", "gen/\n");
    std::fs::write(lib.join(".git/info/exclude"), "excluded.txt\n").unwrap();
    for file in ["app.log", "excluded.txt", "gen/x.txt", "src/main.txt", "src/excluded.txt"] {
        fx.put(&format!("vendor/lib/{file}"), "needle\n");
    }
    std::fs::write(lib.join(".git/needle.txt"), "needle\n").unwrap();
    fx
}

/// What git itself says is there, not ignored, beneath `dir` of the repository `repo`.
fn git_sees(repo: &Path, dir: &str) -> Vec<String> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "--others", "--exclude-standard", "--", dir])
        .current_dir(repo)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

#[tokio::test]
async fn grep_honours_each_repositorys_own_ignore_files() {
    let fx = workspace();
    let grep = |path: &str| {
        fx.ok(
            "grep",
            json!({"pattern": "needle", "path": path, "output_mode": "files_with_matches"}),
        )
    };
    let sorted = |text: String| {
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        lines.sort();
        lines.join("\n")
    };
    expect![[r#"
        src/a.txt
        vendor/lib/app.log
        vendor/lib/src/main.txt"#]]
    .assert_eq(&sorted(grep(".").await));
    // Started inside the nested repository, or in a folder of either: the same files.
    expect![[r#"
        vendor/lib/app.log
        vendor/lib/src/main.txt"#]]
    .assert_eq(&sorted(grep("vendor/lib").await));
    assert_eq!(grep("vendor/lib/src").await, "vendor/lib/src/main.txt");
    assert_eq!(grep("src").await, "src/a.txt");
    // As git sees them.
    let lib = fx.root().join("vendor/lib");
    assert_eq!(git_sees(&lib, "src"), ["src/main.txt"]);
    assert_eq!(git_sees(&lib, "."), [".gitignore", "app.log", "src/main.txt"]);
    // Hidden files and no ignore files: still nothing of a `.git`.
    let all = fx
        .ok(
            "grep",
            json!({"pattern": "needle", "output_mode": "files_with_matches", "hidden": true, "no_ignore": true}),
        )
        .await;
    assert!(!all.contains(".git/"), "{all}");
}

#[tokio::test]
async fn glob_honours_each_repositorys_own_ignore_files() {
    let fx = workspace();
    let glob = |pattern: &str, path: &str| {
        fx.ok("glob", json!({"pattern": pattern, "path": path, "sort": "path"}))
    };
    expect![[r#"
        src/a.txt
        vendor/lib/app.log
        vendor/lib/src/main.txt"#]]
    .assert_eq(&glob("**/*.{txt,log}", ".").await);
    assert_eq!(glob("**/*.txt", "vendor/lib/src").await, "vendor/lib/src/main.txt");
    assert_eq!(glob("*", "src").await, "src/a.txt");
    // A pattern naming hidden files walks hidden folders, but not into a `.git`.
    expect!["No files match `vendor/lib/.git/*` in `.`"]
        .assert_eq(&glob("vendor/lib/.git/*", ".").await);
    assert!(!glob("**/.*/*", ".").await.contains(".git/"));
}

#[tokio::test]
async fn ls_honours_each_repositorys_own_ignore_files() {
    let fx = workspace();
    expect![[r#"
        vendor/lib/
          .git/
          .gitignore (5 bytes)
          app.log (7 bytes)
          src/
            main.txt (7 bytes)
        [3 entries left out by .gitignore or .ignore; respect_gitignore: false lists them]"#]]
    .assert_eq(&fx.ok("ls", json!({"path": "vendor/lib", "depth": 2})).await);
    expect![[r#"
        vendor/lib/src/
          main.txt (7 bytes)
        [1 entry left out by .gitignore or .ignore; respect_gitignore: false lists them]"#]]
    .assert_eq(&fx.ok("ls", json!({"path": "vendor/lib/src"})).await);
    // From the root, down into the nested repository.
    let text = fx.ok("ls", json!({"depth": 4})).await;
    for shown in ["app.log", "main.txt", "a.txt"] {
        assert!(text.contains(shown), "{shown}: {text}");
    }
    for left_out in ["excluded.txt", "gen/", "local.txt", "b.log"] {
        assert!(!text.contains(left_out), "{left_out}: {text}");
    }
}
