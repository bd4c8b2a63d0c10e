//! `grep`: modes, context, filters, paging, gitignore.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;
use std::time::{Duration, SystemTime};

fn touch(path: &std::path::Path, secs_ago: u64) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(secs_ago)).unwrap();
}

fn tree() -> Fixture {
    let fx = Fixture::new();
    touch(&fx.put("src/a.rs", "fn alpha() {}\nlet Needle = 1;\n// needle here\n"), 300);
    touch(&fx.put("src/b.py", "needle = 2\nother\n"), 100);
    touch(&fx.put("docs/c.md", "no match\n"), 50);
    fx
}

#[tokio::test]
async fn files_with_matches_newest_first() {
    let fx = tree();
    let out = fx.call("grep", json!({"pattern": "needle"})).await.unwrap();
    expect![[r#"
        src/b.py
        src/a.rs"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["files"], 2);
}

#[tokio::test]
async fn content_mode_with_line_numbers() {
    let fx = tree();
    expect![[r#"
        src/a.rs:3:// needle here
        src/b.py:1:needle = 2"#]]
    .assert_eq(&fx.ok("grep", json!({"pattern": "needle", "output_mode": "content"})).await);
    expect![[r#"
        src/a.rs:// needle here
        src/b.py:needle = 2"#]]
    .assert_eq(
        &fx.ok("grep", json!({"pattern": "needle", "output_mode": "content", "-n": false})).await,
    );
}

/// Line ends match before a CRLF break, as ripgrep's `--crlf` has them, in the lines
/// shown and in `-o`'s parts alike.
#[tokio::test]
async fn line_ends_match_in_crlf_files() {
    let fx = Fixture::new();
    fx.put("win.txt", "foo bar\r\nbaz\r\n");
    let content = json!({"pattern": "^baz$", "output_mode": "content"});
    assert_eq!(fx.ok("grep", content).await, "win.txt:2:baz");
    let word = json!({"pattern": "\\bbar$", "output_mode": "content", "-o": true});
    assert_eq!(fx.ok("grep", word).await, "win.txt:1:bar");
}

/// A file whose lines end in a bare CR is searched line by line, numbered as `read` does.
#[tokio::test]
async fn cr_only_files_are_searched_as_lines() {
    let fx = Fixture::new();
    fx.put("mac.txt", "foo\rbar baz\rqux\r");
    let content = json!({"pattern": "^bar", "output_mode": "content"});
    assert_eq!(fx.ok("grep", content).await, "mac.txt:2:bar baz");
    let word = json!({"pattern": "baz$", "output_mode": "content", "-o": true});
    assert_eq!(fx.ok("grep", word).await, "mac.txt:2:baz");
    let count = json!({"pattern": "[a-z]+", "output_mode": "count"});
    assert!(fx.ok("grep", count).await.starts_with("mac.txt:3\n"));
    let across = json!({"pattern": "baz\rqux", "output_mode": "content", "multiline": true});
    assert_eq!(fx.ok("grep", across).await, "mac.txt:2:bar baz\nmac.txt:3:qux");
}

/// Whether a file's lines end in a bare CR is told as `read` tells it, from the whole
/// file: one whose first CR comes after 8 KiB greps as the lines `read` shows.
#[tokio::test]
async fn cr_only_files_are_told_from_the_whole_file() {
    let fx = Fixture::new();
    let long = "x".repeat(20 * 1024);
    fx.put("late.txt", &format!("{long}\rneedle here\rtail\r"));
    let content = json!({"pattern": "^needle", "output_mode": "content"});
    assert_eq!(fx.ok("grep", content).await, "late.txt:2:needle here");
    let read = fx.call("read", json!({"path": "late.txt"})).await.unwrap();
    assert_eq!(read.extras["totalLines"], 3);
    // CR lines for 8 KiB and more, then an LF: lines of LF, as `read` has them.
    let cr_lines = "a\r".repeat(8 * 1024);
    fx.put("late_lf.txt", &format!("{cr_lines}needle\n"));
    let content = json!({"pattern": "needle", "output_mode": "count", "path": "late_lf.txt"});
    assert!(fx.ok("grep", content).await.starts_with("late_lf.txt:1\n"));
    let read = fx.call("read", json!({"path": "late_lf.txt"})).await.unwrap();
    assert_eq!(read.extras["totalLines"], 1);
}

/// In a multiline search of a CR file, `^` and `$` match at its line breaks, and lines are
/// numbered as `read` numbers them.
#[tokio::test]
async fn multiline_anchors_match_at_cr_line_breaks() {
    let fx = Fixture::new();
    fx.put("mac.txt", "foo\rbar baz\rqux\r");
    let both = json!({"pattern": "^bar baz$", "output_mode": "content", "multiline": true});
    assert_eq!(fx.ok("grep", both).await, "mac.txt:2:bar baz");
    let across = json!({"pattern": "baz$\\s+^qux", "output_mode": "content", "multiline": true});
    assert_eq!(fx.ok("grep", across).await, "mac.txt:2:bar baz\nmac.txt:3:qux");
    let parts =
        json!({"pattern": "z$\\s^q", "output_mode": "content", "multiline": true, "-o": true});
    assert_eq!(fx.ok("grep", parts).await, "mac.txt:2:z\nmac.txt:3:q");
    let count = json!({"pattern": "^[a-z]", "output_mode": "count", "multiline": true});
    assert!(fx.ok("grep", count).await.starts_with("mac.txt:3\n"));
}

/// A path that is no folder and no file (a FIFO here) is said to be one, not answered
/// "No matches found", and never opened (a FIFO would block the search).
#[tokio::test]
async fn a_path_that_is_no_file_is_said_to_be_one() {
    let fx = Fixture::new();
    let fifo = fx.root().join("pipe");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo runs");
    assert!(made.success());
    let err = fx.err("grep", json!({"pattern": "x", "path": "pipe"})).await;
    assert!(err.contains("`pipe` is not a regular file"), "{err}");
}

/// A binary file named by `path` is said to be binary where its search stopped, not only
/// answered "No matches found" as a walk's binary files are skipped.
#[tokio::test]
async fn a_named_binary_file_is_said_to_be_one() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("bin.o"), b"\x7fELF\0\0needle\0").unwrap();
    let text = fx.ok("grep", json!({"pattern": "needle", "path": "bin.o"})).await;
    expect![[r#"
        No matches found
        [`bin.o` is a binary file (a NUL byte at offset 4): it was searched only before that byte, as binary files are skipped; inspect it with `bash` tools such as `strings` or `xxd` if allowed]"#]]
    .assert_eq(&text);
    // A walk still skips binary files without a word.
    assert_eq!(fx.ok("grep", json!({"pattern": "needle"})).await, "No matches found");
}

#[tokio::test]
async fn case_insensitive() {
    let fx = tree();
    expect![[r#"
        src/a.rs:2:let Needle = 1;
        src/a.rs:3:// needle here
        src/b.py:1:needle = 2"#]]
    .assert_eq(
        &fx.ok("grep", json!({"pattern": "needle", "output_mode": "content", "-i": true})).await,
    );
}

#[tokio::test]
async fn context_lines() {
    let fx = Fixture::new();
    fx.put("a.txt", "1\n2\nhit\n4\n5\n6\n7\nhit\n9\n");
    expect![[r#"
        a.txt-2-2
        a.txt:3:hit
        a.txt-4-4
        --
        a.txt-7-7
        a.txt:8:hit
        a.txt-9-9"#]]
    .assert_eq(&fx.ok("grep", json!({"pattern": "hit", "output_mode": "content", "-C": 1})).await);
    expect![[r#"
        a.txt:3:hit
        a.txt-4-4
        --
        a.txt:8:hit
        a.txt-9-9"#]]
    .assert_eq(&fx.ok("grep", json!({"pattern": "hit", "output_mode": "content", "-A": 1})).await);
    expect![[r#"
        a.txt-2-2
        a.txt:3:hit
        --
        a.txt-7-7
        a.txt:8:hit"#]]
    .assert_eq(&fx.ok("grep", json!({"pattern": "hit", "output_mode": "content", "-B": 1})).await);
    // A side given as 0 beside one that is not still separates the groups (the first value
    // given counted, so `-B 0` hid the `--`).
    for zero in ["-B", "-C"] {
        let args = json!({"pattern": "hit", "output_mode": "content", zero: 0, "-A": 1});
        expect![[r#"
            a.txt:3:hit
            a.txt-4-4
            --
            a.txt:8:hit
            a.txt-9-9"#]]
        .assert_eq(&fx.ok("grep", args).await);
    }
}

#[tokio::test]
async fn count_mode() {
    let fx = tree();
    expect![[r#"
        src/a.rs:2
        src/b.py:1
        [3 matching lines in 2 files]"#]]
    .assert_eq(
        &fx.ok("grep", json!({"pattern": "needle", "output_mode": "count", "-i": true})).await,
    );
}

#[tokio::test]
async fn glob_and_type_filters() {
    let fx = tree();
    assert_eq!(fx.ok("grep", json!({"pattern": "needle", "glob": "*.py"})).await, "src/b.py");
    assert_eq!(fx.ok("grep", json!({"pattern": "needle", "type": "rust"})).await, "src/a.rs");
    let err = fx.err("grep", json!({"pattern": "needle", "type": "nosuchtype"})).await;
    assert!(
        err.starts_with("invalid arguments for `fs__grep`: at /: invalid `type` `nosuchtype`"),
        "{err}"
    );
}

#[tokio::test]
async fn path_narrows_to_a_directory_or_file() {
    let fx = tree();
    assert_eq!(fx.ok("grep", json!({"pattern": "needle", "path": "src/b.py"})).await, "src/b.py");
    assert_eq!(fx.ok("grep", json!({"pattern": "match", "path": "docs"})).await, "docs/c.md");
}

#[tokio::test]
async fn multiline_patterns() {
    let fx = Fixture::new();
    fx.put("a.txt", "start\nmiddle\nend\n");
    assert_eq!(fx.ok("grep", json!({"pattern": "start.middle"})).await, "No matches found");
    expect![[r#"
        a.txt:1:start
        a.txt:2:middle"#]]
    .assert_eq(
        &fx.ok(
            "grep",
            json!({"pattern": "start.middle", "multiline": true, "output_mode": "content"}),
        )
        .await,
    );
}

/// A multiline search holds a whole file in memory, so a file over 64 MiB is skipped and
/// named, where a 2 GB file took 4.6 GB: the file here is sparse (its text, then a hole
/// that reads as NUL bytes past the binary sniff), and a small file beside it is searched.
#[tokio::test]
async fn multiline_skips_files_too_large_to_hold_and_names_them() {
    let fx = Fixture::new();
    fx.put("small.txt", "start\nmiddle\n");
    let big = fx.put("big.log", &"start\nmiddle\n".repeat(1000));
    std::fs::OpenOptions::new().write(true).open(&big).unwrap().set_len(2 << 30).unwrap();
    let args = json!({"pattern": "start.middle", "multiline": true, "output_mode": "content"});
    let out = fx.call("grep", args).await.unwrap();
    expect![[r#"
        small.txt:1:start
        small.txt:2:middle
        [1 file not searched: over 64 MiB, too large for `multiline` (which holds a whole file in memory): big.log (2048 MiB); search without `multiline`, or for a part of the match]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["skippedTooLarge"], 1);
    // Line by line the large file is searched as any other (up to its NUL bytes).
    let args = json!({"pattern": "^middle", "path": "big.log"});
    assert_eq!(fx.ok("grep", args).await, "big.log");
}

#[tokio::test]
async fn head_limit_and_offset_page_through() {
    let fx = Fixture::new();
    let text: String = (1..=10).map(|i| format!("hit {i}\n")).collect();
    fx.put("a.txt", &text);
    let out = fx
        .call("grep", json!({"pattern": "hit", "output_mode": "content", "head_limit": 3}))
        .await
        .unwrap();
    expect![[r#"
        a.txt:1:hit 1
        a.txt:2:hit 2
        a.txt:3:hit 3
        [showing lines 1-3 of 10; use offset=3 for more]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["truncated"], true);
    expect![[r#"
        a.txt:10:hit 10
        [showing lines 10-10 of 10]"#]]
    .assert_eq(
        &fx.ok(
            "grep",
            json!({"pattern": "hit", "output_mode": "content", "head_limit": 3, "offset": 9}),
        )
        .await,
    );
    let all =
        fx.ok("grep", json!({"pattern": "hit", "output_mode": "content", "head_limit": 0})).await;
    assert_eq!(all.lines().count(), 10);
}

#[tokio::test]
async fn default_head_limit_is_250() {
    let fx = Fixture::new();
    let text: String = (1..=300).map(|i| format!("hit {i}\n")).collect();
    fx.put("a.txt", &text);
    let out = fx.call("grep", json!({"pattern": "hit", "output_mode": "content"})).await.unwrap();
    assert!(out.to_text().ends_with("[showing lines 1-250 of 300; use offset=250 for more]"));
}

#[tokio::test]
async fn content_over_many_files_pages_in_path_order() {
    let fx = Fixture::new();
    for i in 0..40 {
        fx.put(&format!("f{i:02}.txt"), "hit\nhit\n");
    }
    let page = fx
        .ok(
            "grep",
            json!({"pattern": "hit", "output_mode": "content", "head_limit": 3, "offset": 5}),
        )
        .await;
    expect![[r#"
        f02.txt:2:hit
        f03.txt:1:hit
        f03.txt:2:hit
        [showing lines 6-8 of 80; use offset=8 for more]"#]]
    .assert_eq(&page);
}

#[tokio::test]
async fn gitignore_hidden_and_binary_files_are_skipped() {
    let fx = Fixture::new();
    fx.put(".gitignore", "ignored/\n");
    fx.put("ignored/a.txt", "needle\n");
    fx.put(".hidden/a.txt", "needle\n");
    fx.put("bin.dat", "needle\0\0");
    fx.put("seen.txt", "needle\n");
    assert_eq!(fx.ok("grep", json!({"pattern": "needle"})).await, "seen.txt");
}

#[tokio::test]
async fn no_match_is_an_empty_result_not_an_error() {
    let fx = tree();
    let out = fx.call("grep", json!({"pattern": "zebra"})).await.unwrap();
    assert!(!out.is_error);
    assert_eq!(out.to_text(), "No matches found");
    assert_eq!(out.extras["matches"], 0);
}

#[tokio::test]
async fn invalid_patterns_are_caller_errors() {
    let fx = tree();
    let err = fx.err("grep", json!({"pattern": "a{"})).await;
    assert!(err.starts_with("invalid arguments for `fs__grep`: at /: invalid regex `a{`"), "{err}");
    expect!["invalid arguments for `fs__grep`: at /: `pattern` is empty"]
        .assert_eq(&fx.err("grep", json!({"pattern": ""})).await);
}

/// A pattern that compiles to more than the size limit (120 KB of `\w{1000}` and the like)
/// is refused as too large, saying the limit and showing the start of the pattern only,
/// where it compiled for seconds up to ripgrep's 100 MiB while the call's time ran and its
/// message repeated all of it.
#[tokio::test]
async fn a_pattern_too_large_is_refused_saying_so() {
    let fx = tree();
    let pattern = "\\w{1000}".repeat(12_000);
    let err = fx.err("grep", json!({"pattern": pattern})).await;
    expect!["invalid arguments for `fs__grep`: at /: `pattern` `\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}\\w{1000}… (96000 bytes in all)` is too large: compiled it needs more than the 10 MiB a pattern may take; search with a shorter pattern (fewer alternatives, smaller counts such as `\\w{1000}`), or in several searches"]
        .assert_eq(&err);
    // With -o too, and case-insensitive.
    let args = json!({"pattern": "\\w{1000}".repeat(200), "-o": true, "-i": true, "output_mode": "content"});
    assert!(fx.err("grep", args).await.contains("is too large"));
    // A long pattern that is invalid is shown by its start too.
    let err = fx.err("grep", json!({"pattern": format!("{}(", "a".repeat(5000))})).await;
    assert!(err.ends_with("… (5001 bytes in all)`: error: unclosed group; to search for the text as it is, set `fixed_strings: true`"), "{err}");
}

#[tokio::test]
async fn cancelled_before_start() {
    let fx = tree();
    let ctx = toolmux_core::CallContext::new();
    ctx.cancel_token().cancel();
    let err = toolmux_core::ToolProvider::call(&fx.fs, "grep", json!({"pattern": "x"}), &ctx)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "cancelled");
}

#[tokio::test]
async fn root_gitignore_applies_to_subdirectory_searches_and_parents_are_not_read() {
    let fx = Fixture::new();
    std::fs::write(fx.outside().join(".gitignore"), "*.txt\n").unwrap();
    fx.put(".gitignore", "*.log\n");
    fx.put("sub/a.log", "needle\n");
    fx.put("sub/a.txt", "needle\n");
    assert_eq!(fx.ok("grep", json!({"pattern": "needle", "path": "sub"})).await, "sub/a.txt");
    assert_eq!(fx.ok("glob", json!({"pattern": "**/a.*", "path": "sub"})).await, "sub/a.txt");
}

#[tokio::test]
async fn context_groups_of_different_files_are_separated() {
    let fx = Fixture::new();
    fx.put("a.txt", "x\nhit\n");
    fx.put("b.txt", "hit\ny\n");
    expect![[r#"
        a.txt-1-x
        a.txt:2:hit
        --
        b.txt:1:hit
        b.txt-2-y"#]]
    .assert_eq(&fx.ok("grep", json!({"pattern": "hit", "output_mode": "content", "-C": 1})).await);
}

/// `n` numbered lines.
fn numbered(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

#[tokio::test]
async fn content_mode_on_a_huge_file_keeps_a_page_and_counts_everything() {
    let fx = Fixture::new();
    fx.put("big.txt", &numbered(200_000));
    let out = fx.call("grep", json!({"pattern": ".", "output_mode": "content"})).await.unwrap();
    let text = out.to_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 251, "{}", &text[..200]);
    assert_eq!(lines[0], "big.txt:1:line 1");
    assert_eq!(lines[249], "big.txt:250:line 250");
    assert_eq!(lines[250], "[showing lines 1-250 of 200000; use offset=250 for more]");
    assert_eq!(out.extras["matches"], 200_000);
    assert_eq!(out.extras["total"], 200_000);
    assert_eq!(out.extras["truncated"], true);
    // The last page is still reachable.
    let out = fx
        .call(
            "grep",
            json!({"pattern": ".", "output_mode": "content", "offset": 199_998, "head_limit": 5}),
        )
        .await
        .unwrap();
    expect![[r#"
        big.txt:199999:line 199999
        big.txt:200000:line 200000
        [showing lines 199999-200000 of 200000]"#]]
    .assert_eq(&out.to_text());
}

#[tokio::test]
async fn totals_count_the_lines_of_files_past_the_page() {
    let fx = Fixture::new();
    fx.put("a.txt", &numbered(200_000));
    fx.put("b.txt", &numbered(3));
    let out = fx
        .call("grep", json!({"pattern": "line", "output_mode": "content", "head_limit": 2}))
        .await
        .unwrap();
    expect![[r#"
        a.txt:1:line 1
        a.txt:2:line 2
        [showing lines 1-2 of 200003; use offset=2 for more]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["matches"], 200_003);
    assert_eq!(out.extras["files"], 2);
    let out = fx
        .call(
            "grep",
            json!({"pattern": "line", "output_mode": "content", "head_limit": 2, "offset": 200_001}),
        )
        .await
        .unwrap();
    expect![[r#"
        b.txt:2:line 2
        b.txt:3:line 3
        [showing lines 200002-200003 of 200003]"#]]
    .assert_eq(&out.to_text());
}

#[tokio::test]
async fn context_totals_match_the_full_listing() {
    let fx = Fixture::new();
    // A match every 10th line: each gives a group of three lines and a separator.
    let text: String = (1..=20_000)
        .map(|i| if i % 10 == 0 { format!("hit {i}\n") } else { format!("{i}\n") })
        .collect();
    fx.put("a.txt", &text);
    fx.put("b.txt", "x\nhit\ny\n");
    let all = fx
        .call("grep", json!({"pattern": "hit", "output_mode": "content", "-C": 1, "head_limit": 0}))
        .await
        .unwrap();
    let listed = all.to_text().lines().count();
    assert_eq!(all.extras["total"], listed);
    let page = fx
        .call("grep", json!({"pattern": "hit", "output_mode": "content", "-C": 1, "head_limit": 4}))
        .await
        .unwrap();
    expect![[r#"
        a.txt-9-9
        a.txt:10:hit 10
        a.txt-11-11
        --
        [showing lines 1-4 of 8002; use offset=4 for more]"#]]
    .assert_eq(&page.to_text());
    assert_eq!(page.extras["total"], listed);
    assert_eq!(page.extras["matches"], 2001);
    // The page that crosses into the second file, its separator included.
    let last = fx
        .call(
            "grep",
            json!({"pattern": "hit", "output_mode": "content", "-C": 1, "head_limit": 5, "offset": listed - 5}),
        )
        .await
        .unwrap();
    expect![[r#"
        a.txt:20000:hit 20000
        --
        b.txt-1-x
        b.txt:2:hit
        b.txt-3-y
        [showing lines 7998-8002 of 8002]"#]]
    .assert_eq(&last.to_text());
}

#[tokio::test]
async fn only_matching_shows_each_match_on_its_own_line() {
    let fx = Fixture::new();
    fx.put("a.rs", "let x = foo(1) + foo(22);\nnone here\nfoo(3)\n");
    let out = fx
        .call("grep", json!({"pattern": r"foo\(\d+\)", "output_mode": "content", "-o": true}))
        .await
        .unwrap();
    expect![[r#"
        a.rs:1:foo(1)
        a.rs:1:foo(22)
        a.rs:3:foo(3)"#]]
    .assert_eq(&out.to_text());
    // `matches` still counts matching lines; `total` counts what is listed.
    assert_eq!((out.extras["matches"].clone(), out.extras["total"].clone()), (json!(2), json!(3)));
    expect![[r#"
        a.rs:foo(1)
        a.rs:foo(22)
        [showing lines 1-2 of 3; use offset=2 for more]"#]]
    .assert_eq(
        &fx.ok(
            "grep",
            json!({"pattern": r"FOO\(\d\)|foo\(22\)", "output_mode": "content", "-o": true, "-n": false, "-i": true, "head_limit": 2}),
        )
        .await,
    );
}

#[tokio::test]
async fn only_matching_splits_multiline_matches_by_line() {
    let fx = Fixture::new();
    fx.put("a.txt", "zero\nstart\nmiddle and more\nend\n");
    expect![[r#"
        a.txt:2:start
        a.txt:3:middle"#]]
    .assert_eq(
        &fx.ok(
            "grep",
            json!({"pattern": r"start\nmiddle", "multiline": true, "output_mode": "content", "-o": true}),
        )
        .await,
    );
}

#[tokio::test]
async fn only_matching_outside_content_mode_or_with_context_is_refused() {
    let fx = tree();
    expect![[r#"invalid arguments for `fs__grep`: at /: `-o` shows the matching parts of lines, which only `output_mode: "content"` shows (this call's mode is `files_with_matches`): set `output_mode` to `content` or drop `-o`"#]]
    .assert_eq(&fx.err("grep", json!({"pattern": "needle", "-o": true})).await);
    expect!["invalid arguments for `fs__grep`: at /: `-o` shows only the matching parts of lines, so it takes no context lines: drop `-A`, `-B` and `-C`, or drop `-o` to see whole lines"]
    .assert_eq(
        &fx.err("grep", json!({"pattern": "needle", "-o": true, "output_mode": "content", "-C": 2}))
            .await,
    );
    // Context on one side is context, whatever the other side says.
    let args = json!({"pattern": "needle", "-o": true, "output_mode": "content", "-B": 0, "-A": 2});
    assert!(fx.err("grep", args).await.contains("so it takes no context lines"));
}

#[tokio::test]
async fn fixed_strings_search_for_the_text_as_it_is() {
    let fx = Fixture::new();
    fx.put("a.txt", "call(a.b)\ncall(axb)\n");
    let regex = fx.ok("grep", json!({"pattern": "a.b", "output_mode": "content"})).await;
    assert_eq!(regex, "a.txt:1:call(a.b)\na.txt:2:call(axb)");
    let literal = json!({"pattern": "(a.b", "fixed_strings": true, "output_mode": "content"});
    assert_eq!(fx.ok("grep", literal).await, "a.txt:1:call(a.b)");
    let only = json!({"pattern": "A.B", "fixed_strings": true, "-i": true, "-o": true, "output_mode": "content"});
    assert_eq!(fx.ok("grep", only).await, "a.txt:1:a.b");
    // An invalid regex says how to search for the text itself.
    expect!["invalid arguments for `fs__grep`: at /: invalid regex `(a.b`: regex parse error:\n    (?:(a.b)\n    ^\nerror: unclosed group; to search for the text as it is, set `fixed_strings: true`"]
    .assert_eq(&fx.err("grep", json!({"pattern": "(a.b"})).await);
}

#[tokio::test]
async fn a_line_break_in_the_pattern_needs_multiline() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\n");
    let args = json!({"pattern": "one\ntwo", "fixed_strings": true});
    expect!["invalid arguments for `fs__grep`: at /: `pattern` contains a line break, which a line-by-line search never matches: set `multiline: true` to match across lines"]
    .assert_eq(&fx.err("grep", args).await);
    let args = json!({"pattern": "one\ntwo", "fixed_strings": true, "multiline": true, "output_mode": "content"});
    assert_eq!(fx.ok("grep", args).await, "a.txt:1:one\na.txt:2:two");
}

#[tokio::test]
async fn max_matches_per_file_cuts_each_file_and_says_so() {
    let fx = Fixture::new();
    fx.put("a.txt", "hit 1\nhit 2\nhit 3\nhit 4\n");
    fx.put("b.txt", "hit 1\n");
    let out = fx
        .call(
            "grep",
            json!({"pattern": "hit", "output_mode": "content", "max_matches_per_file": 2}),
        )
        .await
        .unwrap();
    expect![[r#"
        a.txt:1:hit 1
        a.txt:2:hit 2
        b.txt:1:hit 1
        [1 file has more than max_matches_per_file=2 matching lines; the rest are not shown or counted: raise `max_matches_per_file` to see them]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["cappedFiles"], 1);
    assert_eq!(out.extras["matches"], 3);
    expect![[r#"
        a.txt:2
        b.txt:1
        [3 matching lines in 2 files]
        [1 file has more than max_matches_per_file=2 matching lines; the rest are not shown or counted: raise `max_matches_per_file` to see them]"#]]
    .assert_eq(
        &fx.ok("grep", json!({"pattern": "hit", "output_mode": "count", "max_matches_per_file": 2}))
            .await,
    );
    // A cap no file reaches says nothing.
    let out = json!({"pattern": "hit", "output_mode": "count", "max_matches_per_file": 4});
    assert_eq!(fx.ok("grep", out).await, "a.txt:4\nb.txt:1\n[5 matching lines in 2 files]");
}

#[tokio::test]
async fn max_matches_per_file_keeps_the_last_matchs_after_context_only() {
    let fx = Fixture::new();
    fx.put("a.txt", "hit\nx\nhit\ny\nz\nw\nhit\n");
    expect![[r#"
        a.txt:1:hit
        a.txt-2-x
        a.txt:3:hit
        a.txt-4-y
        [1 file has more than max_matches_per_file=2 matching lines; the rest are not shown or counted: raise `max_matches_per_file` to see them]"#]]
    .assert_eq(
        &fx.ok(
            "grep",
            json!({"pattern": "hit", "output_mode": "content", "-C": 1, "max_matches_per_file": 2}),
        )
        .await,
    );
}

#[tokio::test]
async fn max_matches_per_file_needs_a_mode_that_shows_lines() {
    let fx = tree();
    expect![[r#"invalid arguments for `fs__grep`: at /: `max_matches_per_file` limits the lines shown or counted per file, which `output_mode: "files_with_matches"` does not show: set `output_mode` to `content` or `count`, or drop `max_matches_per_file`"#]]
    .assert_eq(&fx.err("grep", json!({"pattern": "needle", "max_matches_per_file": 1})).await);
    expect!["invalid arguments for `fs__grep`: at /: `max_matches_per_file` must be at least 1 (leave it out for no limit)"]
    .assert_eq(
        &fx.err(
            "grep",
            json!({"pattern": "needle", "output_mode": "count", "max_matches_per_file": 0}),
        )
        .await,
    );
}

#[tokio::test]
async fn hidden_and_no_ignore_search_those_files_too_but_never_git() {
    let fx = Fixture::new();
    fx.put(".gitignore", "ignored/\n*.log\n");
    fx.put("ignored/a.txt", "needle\n");
    fx.put(".hidden/a.txt", "needle\n");
    fx.put(".env", "needle\n");
    fx.put(".git/config", "needle\n");
    fx.put("sub/x.log", "needle\n");
    fx.put("seen.txt", "needle\n");
    let grep = |extra: serde_json::Value| {
        let mut args = json!({"pattern": "needle", "output_mode": "count"});
        args.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        args
    };
    let files = |text: String| {
        text.lines().filter(|l| !l.starts_with('[')).map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(files(fx.ok("grep", grep(json!({}))).await), ["seen.txt:1"]);
    assert_eq!(
        files(fx.ok("grep", grep(json!({"hidden": true}))).await),
        [".env:1", ".hidden/a.txt:1", "seen.txt:1"]
    );
    assert_eq!(
        files(fx.ok("grep", grep(json!({"no_ignore": true}))).await),
        ["ignored/a.txt:1", "seen.txt:1", "sub/x.log:1"]
    );
    assert_eq!(
        files(fx.ok("grep", grep(json!({"hidden": true, "no_ignore": true}))).await),
        [".env:1", ".hidden/a.txt:1", "ignored/a.txt:1", "seen.txt:1", "sub/x.log:1"]
    );
    // The root's ignore files are not applied to a subdirectory's search either.
    assert_eq!(
        fx.ok("grep", json!({"pattern": "needle", "path": "sub"})).await,
        "No matches found"
    );
    assert_eq!(
        fx.ok("grep", json!({"pattern": "needle", "path": "sub", "no_ignore": true})).await,
        "sub/x.log"
    );
    // Asked for by path, a `.git` directory is searched.
    assert_eq!(fx.ok("grep", json!({"pattern": "needle", "path": ".git"})).await, ".git/config");
}

/// `glob` and `type` narrow the files searched; they do not bring back the hidden and
/// ignored files left out (ripgrep's overrides win over ignore rules, so `glob: "*.js"`
/// searched the ignored `app.min.js` and the hidden `.eslintrc.js`).
#[tokio::test]
async fn glob_and_type_do_not_search_hidden_or_ignored_files() {
    let fx = Fixture::new();
    fx.put(".gitignore", "*.min.js\n");
    fx.put("app.js", "needle\n");
    fx.put("app.min.js", "needle\n");
    fx.put(".eslintrc.js", "needle\n");
    fx.put("lib/util.js", "needle\n");
    fx.put("lib/util.py", "needle\n");
    let grep = |extra: serde_json::Value| {
        let mut args = json!({"pattern": "needle", "output_mode": "count"});
        args.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        args
    };
    for filter in [json!({"glob": "*.js"}), json!({"type": "js"})] {
        assert_eq!(
            fx.ok("grep", grep(filter.clone())).await,
            "app.js:1\nlib/util.js:1\n[2 matching lines in 2 files]",
            "{filter}"
        );
        let mut all = filter.clone();
        all.as_object_mut()
            .unwrap()
            .extend([("hidden".to_owned(), json!(true)), ("no_ignore".to_owned(), json!(true))]);
        assert_eq!(
            fx.ok("grep", grep(all)).await,
            ".eslintrc.js:1\napp.js:1\napp.min.js:1\nlib/util.js:1\n[4 matching lines in 4 files]",
            "{filter}"
        );
    }
    // A negated glob leaves files out and keeps the rest.
    assert_eq!(fx.ok("grep", json!({"pattern": "needle", "glob": "!lib/**"})).await, "app.js");
    // One naming a folder leaves out the files beneath it, as ripgrep's does.
    for glob in ["!lib", "!lib/", "!li?"] {
        assert_eq!(fx.ok("grep", json!({"pattern": "needle", "glob": glob})).await, "app.js");
    }
    // A folder named by `path` is searched as a file so named is.
    assert_eq!(
        fx.ok("grep", grep(json!({"path": "lib", "glob": "!lib"}))).await,
        "lib/util.js:1\nlib/util.py:1\n[2 matching lines in 2 files]"
    );
    // A file named by `path` is searched whatever the filters say, as ripgrep does.
    assert_eq!(
        fx.ok("grep", json!({"pattern": "needle", "path": "lib/util.py", "glob": "*.js"})).await,
        "lib/util.py"
    );
}

/// Files with no LF in their first MiB, whose start the search reads again, are searched
/// whole: one line to its end, or lines ending in CR told from the whole file.
#[tokio::test]
async fn files_with_no_lf_in_their_first_mib_are_searched_whole() {
    let fx = Fixture::new();
    let long = "x".repeat(3 << 20);
    fx.put("one.json", &format!("{long} needle"));
    fx.put("mac.txt", &format!("{long}\rneedle\rtail\r"));
    expect![[r#"
        mac.txt:2:needle
        one.json:1:xxxxxxxxx"#]]
    .assert_eq(
        &fx.ok("grep", json!({"pattern": "needle", "output_mode": "content"}))
            .await
            .lines()
            .map(|l| l.chars().take(20).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

/// Set in the child copy of the next test to the folder it works in.
const NO_LF_VAR: &str = "TOOLMUX_FS_TEST_GREP_NO_LF_DIR";

/// A file with no LF is read on to its end to tell whether its lines end in CR, and only
/// its first MiB is kept for the search: the search of a 128 MiB one raises the process's
/// peak memory by less than 32 MiB, where it kept the whole file (each search thread held
/// all it had read of such a file). The file is UTF-16 text then a hole, which decodes to
/// NUL characters the head reads on through and the search stops at. Measured in a child
/// copy of the test, so that the other tests' memory does not count.
#[test]
fn a_file_without_lf_is_not_held_whole() {
    if let Some(dir) = std::env::var_os(NO_LF_VAR) {
        let dir = std::path::PathBuf::from(dir);
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let fx = Fixture::new();
        let mut utf16 = vec![0xFF, 0xFE];
        "a needle, and no line break".encode_utf16().for_each(|u| utf16.extend(u.to_le_bytes()));
        let path = fx.root().join("wide.txt");
        std::fs::write(&path, utf16).unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(128 << 20).unwrap();
        let before = crate::read::peak_kib();
        let args = json!({"pattern": "needle", "output_mode": "count"});
        let out = runtime.block_on(fx.call("grep", args)).unwrap();
        let grown = crate::read::peak_kib().saturating_sub(before);
        std::fs::write(dir.join("grown"), grown.to_string()).unwrap();
        std::fs::write(dir.join("answer"), out.to_text()).unwrap();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "grep::a_file_without_lf_is_not_held_whole"])
        .env(NO_LF_VAR, dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "the child copy failed: {status}");
    let grown: u64 = std::fs::read_to_string(dir.path().join("grown")).unwrap().parse().unwrap();
    let answer = std::fs::read_to_string(dir.path().join("answer")).unwrap();
    assert!(grown < 32 * 1024, "the search raised peak memory by {grown} KiB");
    assert_eq!(answer, "No matches found");
}

/// The count footer counts in words that agree, and a page past the end says so on a
/// line of its own (it was `a.txt:1` then `[1 matching lines in 1 files][offset 5 ...]`).
#[tokio::test]
async fn count_footers_agree_and_stand_on_their_own_lines() {
    let fx = Fixture::new();
    fx.put("a.txt", "needle\n");
    let count =
        |offset: usize| json!({"pattern": "needle", "output_mode": "count", "offset": offset});
    expect![[r#"
        a.txt:1
        [1 matching line in 1 file]"#]]
    .assert_eq(&fx.ok("grep", count(0)).await);
    expect![[r#"
        [1 matching line in 1 file]
        [offset 5 is past the end: there is 1 file]"#]]
    .assert_eq(&fx.ok("grep", count(5)).await);
    expect!["[offset 5 is past the end: there is 1 line]"].assert_eq(
        &fx.ok("grep", json!({"pattern": "needle", "output_mode": "content", "offset": 5})).await,
    );
}

/// Files with no LF in their first 8 KiB (minified JS and JSON, long-lined files) are read
/// on to their first LF to tell whether their lines end in CR: what grep finds in them, in
/// every mode, stays what it was when they were read twice for it.
#[tokio::test]
async fn long_lined_files_are_searched_as_before() {
    let fx = Fixture::new();
    let unit = "function f(a){return a.needle||\"needle\"};var x={k:1};";
    // Minified JS without any LF; minified JSON with its only LF at the end; a file whose
    // first LF comes after 100 KiB, then short lines; one with a NUL after 20 KiB.
    fx.put("a/app.min.js", &unit.repeat(3000));
    let json = format!("[{}]\n", vec!["{\"needle\":1,\"other\":2}"; 8000].join(","));
    fx.put("b/data.min.json", &json);
    fx.put("c/late.txt", &format!("{}\nneedle one\nplain\nneedle two\n", unit.repeat(2000)));
    fx.put("d/nul.txt", &format!("{}\0needle\n", "x".repeat(20 * 1024)));
    let mut utf16 = vec![0xFF, 0xFE];
    unit.repeat(400).encode_utf16().for_each(|u| utf16.extend(u.to_le_bytes()));
    std::fs::create_dir_all(fx.root().join("e")).unwrap();
    std::fs::write(fx.root().join("e/wide.js"), utf16).unwrap();
    // Lines ending in CR, the first 30 KiB long.
    fx.put("f/mac.txt", &format!("{}\rneedle\rlast\r", "y".repeat(30 * 1024)));
    // Long lines shortened: their start, and how long they were.
    let summary = |text: String| {
        text.lines()
            .map(|l| match l.chars().count() {
                n if n > 60 => format!("{}... ({n} chars)", l.chars().take(60).collect::<String>()),
                _ => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let grep = |args: serde_json::Value| async { summary(fx.ok("grep", args).await) };
    expect![[r#"
        a/app.min.js:1
        b/data.min.json:1
        c/late.txt:3
        e/wide.js:1
        f/mac.txt:1
        [7 matching lines in 5 files]"#]]
    .assert_eq(&grep(json!({"pattern": "needle", "output_mode": "count"})).await);
    expect![[r#"a/app.min.js:1:function f(a){return a.needle||"needle"};var ... (2043 chars)"#]]
        .assert_eq(
            &grep(json!({"pattern": "needle", "output_mode": "content", "path": "a"})).await,
        );
    expect![[r#"
        c/late.txt:1:function f(a){return a.needle||"needle"};var x=... (2041 chars)
        c/late.txt:2:needle one
        c/late.txt-3-plain
        c/late.txt:4:needle two"#]]
    .assert_eq(
        &grep(json!({"pattern": "needle", "output_mode": "content", "path": "c", "-C": 1})).await,
    );
    expect![[r#"
        e/wide.js:1:needle
        e/wide.js:1:needle
        e/wide.js:1:needle
        [showing lines 1-3 of 800; use offset=3 for more]"#]].assert_eq(
        &grep(json!({"pattern": "ne+dle", "output_mode": "content", "-o": true, "head_limit": 3, "path": "e"}))
            .await,
    );
    expect![[r#"
        a/app.min.js:1:k:1};f
        a/app.min.js:1:k:1};f
        a/app.min.js:1:k:1};f
        [showing lines 1-3 of 5397; use offset=3 for more]"#]]
    .assert_eq(
        &grep(
            json!({"pattern": "k:1\\};f", "output_mode": "content", "-o": true, "head_limit": 3}),
        )
        .await,
    );
    expect!["b/data.min.json:1:2}]"].assert_eq(
        &grep(
            json!({"pattern": "2\\}\\]$", "output_mode": "content", "-o": true, "multiline": true}),
        )
        .await,
    );
    expect![[r#"
        a/app.min.js:1
        c/late.txt:1
        e/wide.js:1
        [3 matching lines in 3 files]"#]]
    .assert_eq(
        &grep(json!({"pattern": "needle\\|\\|", "output_mode": "count", "multiline": true})).await,
    );
    expect![[r#"
        No matches found
        [`d/nul.txt` is a binary file (a NUL byte at offset 20480): ... (195 chars)"#]]
    .assert_eq(
        &grep(json!({"pattern": "needle", "output_mode": "content", "path": "d/nul.txt"})).await,
    );
    expect![[r#"
        f/mac.txt:2:needle
        f/mac.txt:3:last"#]].assert_eq(
        &grep(json!({"pattern": "^needle$\\s+^l", "output_mode": "content", "multiline": true, "path": "f"}))
            .await,
    );
    expect![[r#"
        f/mac.txt:1:yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy... (2039 chars)
        f/mac.txt:3:last"#]]
    .assert_eq(
        &grep(json!({"pattern": "y$|^l", "output_mode": "content", "-n": true, "path": "f"})).await,
    );
}
