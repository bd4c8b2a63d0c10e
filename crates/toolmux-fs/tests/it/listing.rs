//! `glob` and `ls`.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;
use std::time::{Duration, SystemTime};

fn touch(path: &std::path::Path, secs_ago: u64) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(secs_ago)).unwrap();
}

#[tokio::test]
async fn glob_newest_first_or_by_path() {
    let fx = Fixture::new();
    touch(&fx.put("src/old.rs", ""), 500);
    touch(&fx.put("src/new.rs", ""), 5);
    touch(&fx.put("src/deep/mid.rs", ""), 50);
    fx.put("README.md", "");
    expect![[r#"
        src/new.rs
        src/deep/mid.rs
        src/old.rs"#]]
    .assert_eq(&fx.ok("glob", json!({"pattern": "**/*.rs"})).await);
    expect![[r#"
        src/deep/mid.rs
        src/new.rs
        src/old.rs"#]]
    .assert_eq(&fx.ok("glob", json!({"pattern": "**/*.rs", "sort": "path"})).await);
    let error = fx.err("glob", json!({"pattern": "*", "sort": "size"})).await;
    assert!(error.contains("unknown variant `size`, expected `modified` or `path`"), "{error}");
    assert_eq!(fx.ok("glob", json!({"pattern": "*.md"})).await, "README.md");
    assert_eq!(
        fx.ok("glob", json!({"pattern": "*.rs", "path": "src/deep"})).await,
        "src/deep/mid.rs"
    );
}

#[tokio::test]
async fn glob_limit_counts_what_was_left_out() {
    let fx = Fixture::new();
    for i in 0..5 {
        touch(&fx.put(&format!("f{i}.txt"), ""), 100 - i);
    }
    let out = fx.call("glob", json!({"pattern": "*.txt", "limit": 2})).await.unwrap();
    expect![[r#"
        f4.txt
        f3.txt
        [showing files 1-2 of 5, newest first; 3 more left out: use offset=2 or narrow the pattern]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["leftOut"], 3);
    expect![[r#"
        f0.txt
        [showing files 5-5 of 5, newest first]"#]]
    .assert_eq(&fx.ok("glob", json!({"pattern": "*.txt", "limit": 2, "offset": 4})).await);
}

#[tokio::test]
async fn glob_respects_gitignore_and_reports_no_match() {
    let fx = Fixture::new();
    fx.put(".gitignore", "target/\n");
    fx.put("target/x.rs", "");
    assert_eq!(
        fx.ok("glob", json!({"pattern": "**/*.rs"})).await,
        "No files match `**/*.rs` in `.`"
    );
    let err = fx.err("glob", json!({"pattern": "a[", "path": "."})).await;
    assert!(err.starts_with("invalid arguments for `fs__glob`: at /: invalid glob `a[`"), "{err}");
}

/// A FIFO named `.gitignore`, `.ignore` or `.git` (which a command may make) is no rules
/// file: `glob`, `grep` and `ls` answer, where reading one waited for a writer for ever.
#[tokio::test]
async fn fifos_named_as_ignore_files_are_not_read() {
    let fx = Fixture::new();
    fx.put("a.rs", "fn main() {}\n");
    fx.put("sub/b.rs", "fn b() {}\n");
    for name in [".gitignore", "sub/.ignore", "sub/.git"] {
        let (dir, file) = name
            .rsplit_once('/')
            .map_or((fx.root().to_path_buf(), name), |(d, f)| (fx.root().join(d), f));
        toolmux_test_support::blocking::fifo(&dir, file);
    }
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        (
            fx.ok("glob", json!({"pattern": "**/*.rs"})).await,
            fx.ok("grep", json!({"pattern": "fn"})).await,
            fx.ok("ls", json!({"path": "sub"})).await,
        )
    })
    .await;
    let (glob, grep, ls) = answered.expect("glob, grep and ls answered within 10 s");
    assert!(glob.contains("a.rs") && glob.contains("sub/b.rs"), "{glob}");
    assert!(grep.contains("sub/b.rs"), "{grep}");
    assert!(ls.contains("b.rs"), "{ls}");
}

#[tokio::test]
async fn ls_marks_directories_symlinks_and_sizes() {
    let fx = Fixture::new();
    fx.put("a.txt", "hello");
    fx.put("dir/inner.txt", "");
    std::os::unix::fs::symlink("a.txt", fx.root().join("link")).unwrap();
    std::os::unix::fs::symlink("/etc", fx.root().join("escape")).unwrap();
    std::os::unix::fs::symlink("missing", fx.root().join("dangling")).unwrap();
    std::os::unix::fs::symlink("loop", fx.root().join("loop")).unwrap();
    expect![[r#"
        ./
          a.txt (5 bytes)
          dangling@ -> (dangling)
          dir/
          escape@ -> (outside the workspace)
          link@ -> a.txt
          loop@ -> (symlink loop)"#]]
    .assert_eq(&fx.ok("ls", json!({})).await);
}

#[tokio::test]
async fn ls_depth_ignore_and_limit() {
    let fx = Fixture::new();
    fx.put("a/b/c/d.txt", "");
    fx.put("a/skip.log", "");
    fx.put(".git/HEAD", "");
    expect![[r#"
        ./
          .git/
          a/
            b/
        [showing entries 1-3 of 4; use offset=3 for more, or lower `depth` or list a subdirectory]"#]]
    .assert_eq(&fx.ok("ls", json!({"depth": 3, "ignore": ["*.log"], "limit": 3})).await);
    expect![[r#"
        a/b/
          c/
            d.txt (0 bytes)"#]]
    .assert_eq(&fx.ok("ls", json!({"path": "a/b", "depth": 2})).await);
}

#[tokio::test]
async fn ls_errors() {
    let fx = Fixture::new();
    fx.put("f", "");
    expect!["invalid arguments for `fs__ls`: at /: `f` is a file, not a directory: read it with `fs__read`, or give a directory"].assert_eq(&fx.err("ls", json!({"path": "f"})).await);
    expect!["invalid arguments for `fs__ls`: at /: no file or directory at `nope`: check the path with `fs__ls` or `fs__glob`"]
        .assert_eq(&fx.err("ls", json!({"path": "nope"})).await);
    assert_eq!(fx.ok("ls", json!({"path": "."})).await, "./\n  f (0 bytes)");
}

#[tokio::test]
async fn glob_finds_hidden_files_only_when_the_pattern_names_them() {
    let fx = Fixture::new();
    fx.put(".github/workflows/ci.yml", "");
    fx.put("app.yml", "");
    assert_eq!(fx.ok("glob", json!({"pattern": "**/*.yml"})).await, "app.yml");
    assert_eq!(
        fx.ok("glob", json!({"pattern": ".github/**/*.yml"})).await,
        ".github/workflows/ci.yml"
    );
}

#[tokio::test]
async fn glob_is_case_sensitive_unless_told_otherwise() {
    let fx = Fixture::new();
    touch(&fx.put("README.md", ""), 100);
    touch(&fx.put("docs/GUIDE.MD", ""), 50);
    assert_eq!(fx.ok("glob", json!({"pattern": "**/*.md"})).await, "README.md");
    assert_eq!(
        fx.ok("glob", json!({"pattern": "**/*.md", "case_sensitive": true})).await,
        "README.md"
    );
    expect![[r#"
        docs/GUIDE.MD
        README.md"#]]
    .assert_eq(&fx.ok("glob", json!({"pattern": "**/*.md", "case_sensitive": false})).await);
    assert_eq!(
        fx.ok("glob", json!({"pattern": "Docs/guide.md", "case_sensitive": false})).await,
        "docs/GUIDE.MD"
    );
}

#[tokio::test]
async fn glob_finds_ignored_files_when_gitignore_is_not_respected() {
    let fx = Fixture::new();
    fx.put(".gitignore", "target/\n");
    fx.put("sub/.ignore", "*.gen.rs\n");
    touch(&fx.put("target/debug/build.rs", ""), 100);
    touch(&fx.put("sub/a.gen.rs", ""), 50);
    touch(&fx.put("src/main.rs", ""), 10);
    assert_eq!(fx.ok("glob", json!({"pattern": "**/*.rs"})).await, "src/main.rs");
    expect![[r#"
        src/main.rs
        sub/a.gen.rs
        target/debug/build.rs"#]]
    .assert_eq(&fx.ok("glob", json!({"pattern": "**/*.rs", "respect_gitignore": false})).await);
    // Beneath a directory too: the root's .gitignore is not applied there either.
    assert_eq!(
        fx.ok("glob", json!({"pattern": "**/*.rs", "path": "target", "respect_gitignore": false}))
            .await,
        "target/debug/build.rs"
    );
    // Hidden files still need a pattern that names them.
    assert_eq!(
        fx.ok("glob", json!({"pattern": "**/.ignore", "respect_gitignore": false})).await,
        "sub/.ignore"
    );
}

#[tokio::test]
async fn ls_offset_pages_through_the_listing_in_order() {
    let fx = Fixture::new();
    fx.put("a/x.txt", "1");
    fx.put("a/y.txt", "22");
    fx.put("b.txt", "333");
    fx.put("c/z.txt", "");
    let page = |offset: usize| json!({"depth": 2, "limit": 2, "offset": offset});
    let first = fx.call("ls", page(0)).await.unwrap();
    expect![[r#"
        ./
          a/
            x.txt (1 bytes)
        [showing entries 1-2 of 6; use offset=2 for more, or lower `depth` or list a subdirectory]"#]]
    .assert_eq(&first.to_text());
    assert_eq!(
        (first.extras["total"].clone(), first.extras["leftOut"].clone()),
        (json!(6), json!(4))
    );
    // A page starting inside `a/` repeats its line, so the tree still reads right.
    expect![[r#"
        ./
          a/
            y.txt (2 bytes)
          b.txt (3 bytes)
        [showing entries 3-4 of 6; use offset=4 for more, or lower `depth` or list a subdirectory]"#]]
    .assert_eq(&fx.ok("ls", page(2)).await);
    let last = fx.call("ls", page(4)).await.unwrap();
    expect![[r#"
        ./
          c/
            z.txt (0 bytes)
        [showing entries 5-6 of 6]"#]]
    .assert_eq(&last.to_text());
    assert_eq!(last.extras["truncated"], false);
    expect![[r#"
        ./
        [offset 6 is past the end: there are 6 entries]"#]]
    .assert_eq(&fx.ok("ls", page(6)).await);
}

#[tokio::test]
async fn ls_counts_entries_inside_directories_past_the_page() {
    let fx = Fixture::new();
    for i in 0..5 {
        fx.put(&format!("d/f{i}"), "");
    }
    fx.put("e", "");
    let out = fx.call("ls", json!({"depth": 2, "limit": 1})).await.unwrap();
    expect![[r#"
        ./
          d/
        [showing entries 1-1 of 7; use offset=1 for more, or lower `depth` or list a subdirectory]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["totalExact"], true);
}

#[tokio::test]
async fn ls_can_leave_hidden_entries_out() {
    let fx = Fixture::new();
    fx.put(".env", "X=1\n");
    fx.put(".github/ci.yml", "");
    fx.put("src/.keep", "");
    fx.put("a.txt", "");
    expect![[r#"
        ./
          .env (4 bytes)
          .github/
            ci.yml (0 bytes)
          a.txt (0 bytes)
          src/
            .keep (0 bytes)"#]]
    .assert_eq(&fx.ok("ls", json!({"depth": 2})).await);
    expect![[r#"
        ./
          a.txt (0 bytes)
          src/"#]]
    .assert_eq(&fx.ok("ls", json!({"depth": 2, "include_hidden": false})).await);
}

#[tokio::test]
async fn ls_of_a_huge_directory_stops_counting_and_says_so() {
    let fx = Fixture::new();
    let dir = fx.root().join("many");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..10_005 {
        std::fs::File::create(dir.join(format!("f{i:05}"))).unwrap();
    }
    let out = fx.call("ls", json!({"path": "many", "limit": 1, "offset": 3})).await.unwrap();
    expect![[r#"
        many/
          f00003 (0 bytes)
        [showing entries 4-4 of more than 10004; use offset=4 for more, or lower `depth` or list a subdirectory]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["totalExact"], false);
    assert_eq!(out.extras["truncated"], true);
}

#[tokio::test]
async fn ls_leaves_out_what_gitignore_excludes_unless_told_otherwise() {
    let fx = Fixture::new();
    fx.put(".gitignore", "target/\n*.log\n!keep.log\n");
    fx.put("target/debug/app", "binary");
    fx.put("build.log", "log");
    fx.put("keep.log", "kept");
    fx.put("src/main.rs", "fn main() {}\n");
    fx.put("src/.ignore", "generated.rs\n");
    fx.put("src/generated.rs", "// generated\n");
    fx.put("src/trace.log", "log");
    fx.put(".git/info/exclude", "local-notes.md\n");
    fx.put("local-notes.md", "mine");
    let out = fx.call("ls", json!({"depth": 2, "include_hidden": false})).await.unwrap();
    expect![[r#"
        ./
          keep.log (4 bytes)
          src/
            main.rs (13 bytes)
        [5 entries left out by .gitignore or .ignore; respect_gitignore: false lists them]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["ignored"], 5);
    // Listing a subdirectory, the root's rules still apply.
    expect![[r#"
        src/
          .ignore (13 bytes)
          main.rs (13 bytes)
        [2 entries left out by .gitignore or .ignore; respect_gitignore: false lists them]"#]]
    .assert_eq(&fx.ok("ls", json!({"path": "src"})).await);
    let all = fx.ok("ls", json!({"depth": 2, "respect_gitignore": false})).await;
    for name in ["target/", "build.log", "generated.rs", "trace.log", "local-notes.md"] {
        assert!(all.contains(name), "{name} missing from {all}");
    }
    assert!(!all.contains("left out by"), "{all}");
}

/// Names with control characters or bytes that are not UTF-8 are shown quoted and escaped,
/// one line each, with their real sizes: a line break in a name made one entry read as two
/// (`a` and a fake `fake.txt (9 bytes)`), and a name that is not UTF-8 showed 0 bytes. A
/// name as shown is read back.
#[tokio::test]
async fn odd_names_are_shown_escaped_and_truthfully() {
    use std::os::unix::ffi::OsStrExt as _;
    let fx = Fixture::new();
    fx.put("a\nfake.txt (9 bytes)", "12345");
    let bad = fx.root().join(std::ffi::OsStr::from_bytes(b"bad\xffname"));
    std::fs::write(&bad, "1234567").unwrap();
    fx.put("plain.txt", "x");
    let listed = fx.ok("ls", json!({})).await;
    assert!(listed.contains(r#""a\nfake.txt (9 bytes)" (5 bytes)"#), "{listed}");
    assert!(listed.contains(r#""bad\xffname" (7 bytes)"#), "{listed}");
    assert!(
        listed.contains("plain.txt (1 bytes)") || listed.contains("plain.txt (1 byte)"),
        "{listed}"
    );
    assert!(!listed.lines().any(|l| l.trim_start().starts_with("fake.txt")), "{listed}");
    let found = fx.ok("grep", json!({"pattern": "1234"})).await;
    assert!(
        found.contains(r#""a\nfake.txt (9 bytes)""#) && found.contains(r#""bad\xffname""#),
        "{found}"
    );
    // The names as shown address the files.
    let read = fx.ok("read", json!({"path": r#""bad\xffname""#})).await;
    assert!(read.contains("1234567"), "{read}");
    fx.ok(
        "edit",
        json!({"path": r#""a\nfake.txt (9 bytes)""#, "old_string": "123", "new_string": "abc"}),
    )
    .await;
    assert_eq!(fx.get("a\nfake.txt (9 bytes)"), "abc45");
}

/// A pattern written as an absolute path inside the workspace (as models often write
/// them) matches as the same pattern relative to `path`; one leading out of `path` is
/// refused saying so (both found nothing: "No files match").
#[tokio::test]
async fn glob_takes_absolute_patterns_inside_the_workspace() {
    let fx = Fixture::new();
    fx.put("src/deep/a.rs", "");
    fx.put("src/b.rs", "");
    fx.put("docs/c.md", "");
    let root = fx.root().to_string_lossy().into_owned();
    let glob = |pattern: String, path: Option<&str>| {
        let mut args = json!({"pattern": pattern, "sort": "path"});
        if let Some(path) = path {
            args["path"] = json!(path);
        }
        args
    };
    assert_eq!(
        fx.ok("glob", glob(format!("{root}/src/**/*.rs"), None)).await,
        "src/b.rs\nsrc/deep/a.rs"
    );
    assert_eq!(
        fx.ok("glob", glob(format!("{root}/src/deep/*.rs"), Some("src"))).await,
        "src/deep/a.rs"
    );
    assert_eq!(fx.ok("glob", glob(format!("{root}/docs/c.md"), None)).await, "docs/c.md");
    let outside = fx.err("glob", glob(format!("{root}/docs/*.md"), Some("src"))).await;
    assert!(outside.contains("is not beneath the searched folder `src`"), "{outside}");
    let outside = fx.err("glob", glob("/etc/*".into(), None)).await;
    assert!(outside.contains("outside the workspace root"), "{outside}");
    let up = fx.err("glob", glob("../*".into(), Some("src"))).await;
    assert!(up.contains("is not beneath the searched folder `src`"), "{up}");
}
