//! `edit` and `multi_edit`: exact matching, ambiguity, diffs, atomicity.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;

#[tokio::test]
async fn replaces_once_and_shows_a_diff() {
    let fx = Fixture::new();
    fx.put("a.rs", "fn main() {\n    let x = 1;\n}\n");
    let out = fx
        .call("edit", json!({"path": "a.rs", "old_string": "let x = 1;", "new_string": "let x = 2;\n    let y = 3;"}))
        .await
        .unwrap();
    expect![[r#"
        made 1 replacement in `a.rs`
        @@ line 2 @@
         fn main() {
        -    let x = 1;
        +    let x = 2;
        +    let y = 3;
         }"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["replacements"], 1);
    assert_eq!(fx.get("a.rs"), "fn main() {\n    let x = 2;\n    let y = 3;\n}\n");
}

#[tokio::test]
async fn several_matches_need_replace_all() {
    let fx = Fixture::new();
    fx.put("a.txt", "a\nb\na\nc\na\n");
    expect!["found 3 matches of old_string in `a.txt` (at lines 1, 3, 5) but replace_all is false: set replace_all to true to replace every occurrence, or add surrounding context to old_string to pick one; nothing was written"]
        .assert_eq(&fx.err("edit", json!({"path": "a.txt", "old_string": "a", "new_string": "z"})).await);
    let out = fx
        .call(
            "edit",
            json!({"path": "a.txt", "old_string": "a", "new_string": "z", "replace_all": true}),
        )
        .await
        .unwrap();
    assert_eq!(out.extras["replacements"], 3);
    assert_eq!(fx.get("a.txt"), "z\nb\nz\nc\nz\n");
}

#[tokio::test]
async fn not_found_names_the_closest_line() {
    let fx = Fixture::new();
    fx.put("a.rs", "fn main() {\n    let total = compute(1, 2);\n}\n");
    expect!["old_string was not found in `a.rs`; the closest line is 2: `let total = compute(1, 2);`; read the file again and copy the exact text; nothing was written"]
        .assert_eq(&fx.err("edit", json!({"path": "a.rs", "old_string": "let total = compute(1, 3);", "new_string": "x"})).await);
}

#[tokio::test]
async fn not_found_but_whitespace_differs() {
    let fx = Fixture::new();
    fx.put("a.py", "def f():\n    return 1\n");
    expect!["old_string was not found in `a.py`, but lines 1-2 match it when whitespace is ignored: copy the exact whitespace and indentation from `read` output; nothing was written"]
        .assert_eq(&fx.err("edit", json!({"path": "a.py", "old_string": "def f():\n  return 1", "new_string": "x"})).await);
}

#[tokio::test]
async fn identical_strings_are_refused() {
    let fx = Fixture::new();
    fx.put("a.txt", "a");
    expect![
        "no changes to make: old_string and new_string are exactly the same; nothing was written"
    ]
    .assert_eq(
        &fx.err("edit", json!({"path": "a.txt", "old_string": "a", "new_string": "a"})).await,
    );
}

#[tokio::test]
async fn empty_old_string_creates_a_missing_file_only() {
    let fx = Fixture::new();
    let out = fx
        .ok("edit", json!({"path": "new/f.txt", "old_string": "", "new_string": "hello\n"}))
        .await;
    assert_eq!(out, "created `new/f.txt` (1 line)");
    expect!["old_string is empty but `new/f.txt` exists and is not empty: give the text to replace, `insert_line` to add lines, or use `write` to replace the whole file; nothing was written"]
        .assert_eq(&fx.err("edit", json!({"path": "new/f.txt", "old_string": "", "new_string": "x"})).await);
}

#[tokio::test]
async fn crlf_files_match_lf_edits() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\r\ntwo\r\nthree\r\n");
    let out = fx
        .ok("edit", json!({"path": "a.txt", "old_string": "one\ntwo", "new_string": "1\n2"}))
        .await;
    assert!(out.contains("(matched with CRLF line endings)"), "{out}");
    assert_eq!(fx.get("a.txt"), "1\r\n2\r\nthree\r\n");
}

/// A file whose lines end in a bare CR is edited as the lines `read` shows, and keeps CR.
#[tokio::test]
async fn cr_only_files_are_edited_as_lines() {
    let fx = Fixture::new();
    fx.put("cr.txt", "one\rtwo\rthree\r");
    let out = fx
        .ok("edit", json!({"path": "cr.txt", "old_string": "one\ntwo", "new_string": "1\n2\n2b"}))
        .await;
    assert!(out.contains("(written with the file's CR line endings)"), "{out}");
    assert_eq!(fx.get("cr.txt"), "1\r2\r2b\rthree\r");
    fx.ok("edit", json!({"path": "cr.txt", "insert_line": -1, "new_string": "four\n"})).await;
    assert_eq!(fx.get("cr.txt"), "1\r2\r2b\rthree\rfour\r");
    let err = fx.err("edit", json!({"path": "cr.txt", "insert_line": 7, "new_string": "x"})).await;
    assert!(err.contains("which has 5 lines"), "{err}");
}

/// In a CR file, an `old_string` written with the file's own bare CRs (or with CRLF)
/// matches as one written with LF does, in `edit` and `multi_edit`, and the file keeps CR.
#[tokio::test]
async fn cr_only_files_match_old_strings_with_cr() {
    let fx = Fixture::new();
    fx.put("cr.txt", "one\rtwo\rthree\r");
    let edit = json!({"path": "cr.txt", "old_string": "one\rtwo", "new_string": "1\r2"});
    fx.ok("edit", edit).await;
    assert_eq!(fx.get("cr.txt"), "1\r2\rthree\r");
    let edits = json!({"path": "cr.txt", "edits": [
        {"old_string": "2\r\nthree", "new_string": "two\nthree"},
        {"old_string": "1\r", "new_string": "one\n"},
    ]});
    fx.ok("multi_edit", edits).await;
    assert_eq!(fx.get("cr.txt"), "one\rtwo\rthree\r");
}

#[tokio::test]
async fn a_single_line_replaced_by_several_in_a_crlf_file_gets_crlf() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\r\ntwo\r\nthree\r\n");
    let out = fx
        .ok("edit", json!({"path": "a.txt", "old_string": "two", "new_string": "2a\n2b\n2c"}))
        .await;
    expect![[r#"
        made 1 replacement in `a.txt`
        @@ line 2 (written with the file's CRLF line endings) @@
         one
        -two
        +2a
        +2b
        +2c
         three"#]]
    .assert_eq(&out);
    assert_eq!(fx.get("a.txt"), "one\r\n2a\r\n2b\r\n2c\r\nthree\r\n");
    // replace_all and multi_edit follow the file too.
    fx.ok(
        "multi_edit",
        json!({"path": "a.txt", "edits": [
            {"old_string": "2", "new_string": "x\ny", "replace_all": true},
            {"old_string": "one\n", "new_string": "1\r\n"},
        ]}),
    )
    .await;
    assert_eq!(fx.get("a.txt"), "1\r\nx\r\nya\r\nx\r\nyb\r\nx\r\nyc\r\nthree\r\n");
}

#[tokio::test]
async fn crlf_in_an_edit_of_an_lf_file_becomes_lf() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\n");
    fx.ok("edit", json!({"path": "a.txt", "old_string": "one\r\ntwo", "new_string": "1\r\n2"}))
        .await;
    assert_eq!(fx.get("a.txt"), "1\n2\n");
}

#[tokio::test]
async fn mixed_line_endings_follow_the_dominant_one() {
    let fx = Fixture::new();
    // Three CRLF lines, one LF line: CRLF dominates, even where the edit lands on LF.
    fx.put("a.txt", "a\r\nb\r\nc\nd\r\n");
    fx.ok("edit", json!({"path": "a.txt", "old_string": "c", "new_string": "c1\nc2"})).await;
    assert_eq!(fx.get("a.txt"), "a\r\nb\r\nc1\r\nc2\nd\r\n");
    fx.put("b.txt", "a\nb\nc\r\n");
    fx.ok("edit", json!({"path": "b.txt", "old_string": "a", "new_string": "a1\r\na2"})).await;
    assert_eq!(fx.get("b.txt"), "a1\na2\nb\nc\r\n");
    // A file of one line has no style: the new text goes in as given.
    fx.put("c.txt", "only");
    fx.ok("edit", json!({"path": "c.txt", "old_string": "only", "new_string": "x\r\ny"})).await;
    assert_eq!(fx.get("c.txt"), "x\r\ny");
}

#[tokio::test]
async fn a_byte_order_mark_is_kept_and_not_matched() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("bom.txt"), b"\xEF\xBB\xBFfirst\r\nsecond\r\n").unwrap();
    // The mark is not part of the text: the first line matches from its first character.
    let out = fx
        .ok(
            "edit",
            json!({"path": "bom.txt", "old_string": "first\nsecond", "new_string": "1\n2\n3"}),
        )
        .await;
    assert!(out.starts_with("made 1 replacement in `bom.txt`\n@@ line 1 "), "{out}");
    assert_eq!(std::fs::read(fx.root().join("bom.txt")).unwrap(), b"\xEF\xBB\xBF1\r\n2\r\n3\r\n");
    // The hash recorded is that of the bytes written: the next edit in the run is not
    // taken for a change by someone else.
    fx.ok("read", json!({"path": "bom.txt"})).await;
    fx.ok("edit", json!({"path": "bom.txt", "old_string": "3", "new_string": "three"})).await;
    fx.ok("edit", json!({"path": "bom.txt", "old_string": "three", "new_string": "3"})).await;
    assert_eq!(std::fs::read(fx.root().join("bom.txt")).unwrap(), b"\xEF\xBB\xBF1\r\n2\r\n3\r\n");
}

#[tokio::test]
async fn utf16_files_are_edited_in_their_encoding() {
    let fx = Fixture::new();
    let utf16le = |text: &str| -> Vec<u8> {
        let mut bytes = vec![0xFF, 0xFE];
        text.encode_utf16().for_each(|u| bytes.extend(u.to_le_bytes()));
        bytes
    };
    std::fs::write(fx.root().join("w.txt"), utf16le("caf\u{e9}\r\nzwei\r\n")).unwrap();
    fx.ok(
        "edit",
        json!({"path": "w.txt", "old_string": "zwei", "new_string": "drei\nvier \u{1F600}"}),
    )
    .await;
    assert_eq!(
        std::fs::read(fx.root().join("w.txt")).unwrap(),
        utf16le("caf\u{e9}\r\ndrei\r\nvier \u{1F600}\r\n")
    );
    // An unpaired surrogate: refused, nothing written.
    let broken = [0xFF, 0xFE, b'a', 0, 0x00, 0xDC];
    std::fs::write(fx.root().join("bad.txt"), broken).unwrap();
    expect!["`bad.txt` is not valid UTF-16: an unpaired surrogate at byte 4: editing it as text would corrupt it; nothing was written"]
        .assert_eq(&fx.err("edit", json!({"path": "bad.txt", "old_string": "a", "new_string": "b"})).await);
    assert_eq!(std::fs::read(fx.root().join("bad.txt")).unwrap(), broken);
}

#[tokio::test]
async fn stale_files_are_refused() {
    let fx = Fixture::new();
    fx.put("a.txt", "abc");
    fx.ok("read", json!({"path": "a.txt"})).await;
    fx.put("a.txt", "abcd");
    let err =
        fx.err("edit", json!({"path": "a.txt", "old_string": "abc", "new_string": "x"})).await;
    assert!(err.contains("has been modified since it was last read"), "{err}");
}

#[tokio::test]
async fn multi_edit_is_all_or_nothing() {
    let fx = Fixture::new();
    fx.put("a.txt", "alpha beta gamma\n");
    expect!["edit 2: old_string was not found in `a.txt` and no line resembles it; read the file again and copy the exact text (whitespace and indentation included); nothing was written"]
        .assert_eq(&fx.err("multi_edit", json!({"path": "a.txt", "edits": [
            {"old_string": "alpha", "new_string": "ALPHA"},
            {"old_string": "zzzz", "new_string": "Z"},
        ]})).await);
    assert_eq!(fx.get("a.txt"), "alpha beta gamma\n");
    let out = fx
        .call(
            "multi_edit",
            json!({"path": "a.txt", "edits": [
                {"old_string": "alpha", "new_string": "ALPHA"},
                {"old_string": "ALPHA beta", "new_string": "AB"},
                {"old_string": "a", "new_string": "4", "replace_all": true},
            ]}),
        )
        .await
        .unwrap();
    assert_eq!(out.extras["replacements"], 4);
    assert_eq!(fx.get("a.txt"), "AB g4mm4\n");
}

#[tokio::test]
async fn multi_edit_needs_edits() {
    let fx = Fixture::new();
    fx.put("a.txt", "a");
    expect![
        "invalid arguments for `fs__multi_edit`: at /: `edits` is empty: give at least one edit"
    ]
    .assert_eq(&fx.err("multi_edit", json!({"path": "a.txt", "edits": []})).await);
}

#[tokio::test]
async fn binary_files_are_not_edited() {
    let fx = Fixture::new();
    fx.put("a.bin", "a\0b");
    let err = fx.err("edit", json!({"path": "a.bin", "old_string": "a", "new_string": "b"})).await;
    assert!(err.contains("is a binary file"), "{err}");
}

#[tokio::test]
async fn files_over_the_limit_and_invalid_utf8_are_refused() {
    let fx = Fixture::with(|c| {
        c.with_limits(toolmux_fs::FsLimits { edit_max_bytes: 10, ..Default::default() })
    });
    fx.put("big.txt", "0123456789abc");
    expect!["`big.txt` is 13 bytes, over the 10-byte limit of `edit`"].assert_eq(
        &fx.err("edit", json!({"path": "big.txt", "old_string": "0", "new_string": "x"})).await,
    );
    std::fs::write(fx.root().join("latin1.txt"), b"caf\xe9").unwrap();
    expect![
        "`latin1.txt` is not valid UTF-8: editing it as text would corrupt it; nothing was written"
    ]
    .assert_eq(
        &fx.err("edit", json!({"path": "latin1.txt", "old_string": "caf", "new_string": "x"}))
            .await,
    );
}

#[tokio::test]
async fn edits_through_an_escaping_path_are_refused() {
    let fx = Fixture::new();
    std::fs::write(fx.outside().join("out.txt"), "x").unwrap();
    let err =
        fx.err("edit", json!({"path": "../out.txt", "old_string": "x", "new_string": "y"})).await;
    assert!(err.contains("path `../out.txt` is outside the workspace root"), "{err}");
    assert_eq!(std::fs::read_to_string(fx.outside().join("out.txt")).unwrap(), "x");
}

/// `old_string` copied from `read` with its line numbers matches the file without them;
/// `new_string` written the same way loses them too.
#[tokio::test]
async fn line_numbers_copied_from_read_are_removed() {
    let fx = Fixture::new();
    fx.put("main.rs", "fn main() {\n    let x = 1;\n    println!(\"{x}\");\n}\n");
    let read = fx.ok("read", json!({"path": "main.rs"})).await;
    assert!(read.contains("     2\t    let x = 1;"), "{read}");
    let out = fx
        .ok(
            "edit",
            json!({"path": "main.rs", "old_string": "     2\t    let x = 1;\n     3\t    println!(\"{x}\");",
                "new_string": "     2\t    let x = 2;\n     3\t    println!(\"{x}\");"}),
        )
        .await;
    assert!(out.contains("removed the line numbers"), "{out}");
    assert_eq!(fx.get("main.rs"), "fn main() {\n    let x = 2;\n    println!(\"{x}\");\n}\n");
    // A `new_string` without them is inserted as it is.
    fx.ok(
        "edit",
        json!({"path": "main.rs", "old_string": "     2\t    let x = 2;",
        "new_string": "    let x = 3;"}),
    )
    .await;
    assert_eq!(fx.get("main.rs"), "fn main() {\n    let x = 3;\n    println!(\"{x}\");\n}\n");
}

/// Spaces and tabs at the ends of lines, which a model rarely reproduces, do not stop a
/// match of several lines; places that match but differ are not guessed between, and are
/// named.
#[tokio::test]
async fn trailing_whitespace_does_not_stop_a_match() {
    let fx = Fixture::new();
    fx.put("list.txt", "alpha  \nbeta\t\ngamma\n");
    let out = fx
        .ok(
            "edit",
            json!({"path": "list.txt", "old_string": "alpha\nbeta", "new_string": "ALPHA\nBETA"}),
        )
        .await;
    assert!(out.contains("matched ignoring spaces and tabs at the ends of lines"), "{out}");
    assert_eq!(fx.get("list.txt"), "ALPHA\nBETA\t\ngamma\n");
    fx.put("crlf.txt", "one \r\ntwo\r\n");
    fx.ok("edit", json!({"path": "crlf.txt", "old_string": "one\ntwo", "new_string": "1\n2"}))
        .await;
    assert_eq!(fx.get("crlf.txt"), "1\r\n2\r\n");
    fx.put("two.txt", "a \nb\nx\na\t\nb\n");
    let err =
        fx.err("edit", json!({"path": "two.txt", "old_string": "a\nb", "new_string": "c"})).await;
    assert!(err.contains("not found in `two.txt` as written, but it matches 2 places"), "{err}");
    assert!(err.contains("(at lines 1, 4)"), "{err}");
    assert_eq!(fx.get("two.txt"), "a \nb\nx\na\t\nb\n");
}

/// In a large file, an `old_string` of many lines that matches only when whitespace is
/// ignored is named by its lines, and one that matches nowhere is told so; the search is
/// one pass over the file (a window per line took minutes and held the file's lock).
#[tokio::test]
async fn a_long_old_string_in_a_large_file_is_told_where_it_nearly_is() {
    let fx = Fixture::new();
    let text: String =
        (0..50_000).map(|i| format!("    let value_{i} = compute({i});\n")).collect();
    fx.put("many.rs", &text);
    let near: String =
        (40_000..40_300).map(|i| format!("let  value_{i} = compute( {i});\n")).collect();
    let near = near.replace("compute( ", "compute(");
    let err =
        fx.err("edit", json!({"path": "many.rs", "old_string": near, "new_string": "x"})).await;
    assert!(err.contains("lines 40001-40300 match it when whitespace is ignored"), "{err}");
    let absent: String = (0..2_000).map(|i| format!("let other_{i} = nothing();\n")).collect();
    let err =
        fx.err("edit", json!({"path": "many.rs", "old_string": absent, "new_string": "x"})).await;
    assert!(err.contains("old_string was not found in `many.rs`"), "{err}");
    // The file is free for the next edit.
    fx.ok("edit", json!({"path": "many.rs", "old_string": "value_7 =", "new_string": "seven ="}))
        .await;
}

/// Code added beside prose that matched through its curly quotes keeps its plain quotes,
/// apostrophes and minus signs; only what the edit keeps of the prose is written curly.
/// (Every `"` of the new text became a curly one, and `a - b` became `a — b`.)
#[tokio::test]
async fn code_beside_typographic_prose_keeps_its_plain_quotes() {
    let fx = Fixture::new();
    let doc = "def f(a, b):\n    \"\"\"Return \u{201C}a\u{201D} minus b \u{2014} it\u{2019}s simple.\"\"\"\n    return a + b\n";
    fx.put("doc.py", doc);
    let old = "    \"\"\"Return \"a\" minus b - it's simple.\"\"\"\n    return a + b";
    let new = "    \"\"\"Return \"a\" minus b - it's simple.\"\"\"\n    print(\"debug\", a['k'], \"--\")\n    return a - b";
    fx.ok("edit", json!({"path": "doc.py", "old_string": old, "new_string": new})).await;
    assert_eq!(
        fx.get("doc.py"),
        "def f(a, b):\n    \"\"\"Return \u{201C}a\u{201D} minus b \u{2014} it\u{2019}s simple.\"\"\"\n    print(\"debug\", a['k'], \"--\")\n    return a - b\n"
    );
    // The same through a patch.
    fx.put("doc2.py", doc);
    let patch = "*** Begin Patch\n*** Update File: doc2.py\n def f(a, b):\n-    \"\"\"Return \"a\" minus b - it's simple.\"\"\"\n-    return a + b\n+    \"\"\"Return \"a\" minus b - it's simple.\"\"\"\n+    print(\"debug\", a['k'])\n+    return a - b\n*** End Patch";
    fx.ok("apply_patch", json!({"input": patch})).await;
    assert_eq!(
        fx.get("doc2.py"),
        "def f(a, b):\n    \"\"\"Return \u{201C}a\u{201D} minus b \u{2014} it\u{2019}s simple.\"\"\"\n    print(\"debug\", a['k'])\n    return a - b\n"
    );
}

/// Typographic quotes, dashes and spaces in the file match the plain ones a model writes;
/// when the places that match hold different text, nothing is guessed.
#[tokio::test]
async fn typographic_characters_match_plain_ones() {
    let fx = Fixture::new();
    fx.put("notes.md", "# Notes\nIt\u{2019}s \u{201C}done\u{201D} \u{2014} ship it\u{00A0}now.\n");
    let out = fx
        .call(
            "edit",
            json!({"path": "notes.md", "old_string": "It's \"done\" - ship it now.",
                "new_string": "It's not done yet."}),
        )
        .await
        .unwrap();
    let text = out.to_text();
    assert!(text.contains("matched the file's typographic quotes"), "{text}");
    // The replacement is written in the file's style, not with the model's plain quotes.
    assert_eq!(fx.get("notes.md"), "# Notes\nIt\u{2019}s not done yet.\n");
    fx.put("quote.md", "She said, \u{201C}Hello.\u{201D} \u{2014} then left.\n");
    fx.ok(
        "edit",
        json!({"path": "quote.md", "old_string": "She said, \"Hello.\" - then",
            "new_string": "She said, \"Hi there.\" - and then"}),
    )
    .await;
    assert_eq!(fx.get("quote.md"), "She said, \u{201C}Hi there.\u{201D} \u{2014} and then left.\n");

    // Two places that match, written differently: which one was meant is not guessed.
    fx.put("two.md", "a \u{2018}x\u{2019}\nb\na \u{2019}x\u{2019}\n");
    let err =
        fx.err("edit", json!({"path": "two.md", "old_string": "a 'x'", "new_string": "y"})).await;
    assert!(err.contains("was not found"), "{err}");
    fx.put("three.md", "say \u{201C}hi\u{201D} and \u{201C}hi\u{201D}\n");
    let out = fx
        .call(
            "edit",
            json!({"path": "three.md", "old_string": "\"hi\"", "new_string": "\"bye\"",
                "replace_all": true}),
        )
        .await
        .unwrap();
    assert_eq!(out.extras["replacements"], 2);
    assert_eq!(fx.get("three.md"), "say \u{201C}bye\u{201D} and \u{201C}bye\u{201D}\n");
}

/// Every Unicode space separator reads as a space, not only the non-breaking one: a line
/// with non-breaking spaces and one with figure spaces (both shown as `a = 1`) both match
/// `a = 1`, hold different text, and nothing is guessed. Only the non-breaking one was
/// read as a space, and the edit silently changed that line.
#[tokio::test]
async fn every_unicode_space_reads_as_a_space() {
    let fx = Fixture::new();
    let file = "a\u{00A0}=\u{00A0}1\nb = 2\na\u{2007}=\u{2007}1\n";
    fx.put("spaces.py", file);
    let err = fx
        .err("edit", json!({"path": "spaces.py", "old_string": "a = 1", "new_string": "a = 9"}))
        .await;
    assert!(err.contains("was not found"), "{err}");
    assert!(err.contains("matches 2 places (at lines 1, 3)"), "{err}");
    assert_eq!(fx.get("spaces.py"), file);
    for space in ['\u{1680}', '\u{2000}', '\u{2007}', '\u{200A}', '\u{205F}', '\u{3000}'] {
        let name = format!("u{:04x}.py", space as u32);
        fx.put(&name, &format!("x{space}=\u{202F}1\n"));
        fx.ok("edit", json!({"path": name, "old_string": "x = 1", "new_string": "x = 2"})).await;
        assert_eq!(fx.get(&name), format!("x{space}=\u{202F}2\n"), "{name}");
    }
}

/// The loose readings combine: a CRLF file of curly quotes with spaces ending a line is
/// found by an `old_string` of LF lines and plain quotes, and written back in the file's
/// style and line breaks.
#[tokio::test]
async fn line_ends_and_typographic_characters_match_together() {
    let fx = Fixture::new();
    fx.put("doc.md", "Title\r\nHe said \u{201C}yes\u{201D} \r\nand left.\r\n");
    let out = fx
        .ok(
            "edit",
            json!({"path": "doc.md", "old_string": "He said \"yes\"\nand left.",
                "new_string": "He said \"no\"\nand stayed."}),
        )
        .await;
    assert!(out.contains("matched ignoring the ends of lines and the file's typographic"), "{out}");
    assert_eq!(fx.get("doc.md"), "Title\r\nHe said \u{201C}no\u{201D}\r\nand stayed.\r\n");
    // A line break at the end of `old_string` takes the file's whole break; the spaces
    // after a match that ends within a line stay.
    fx.put("tail.md", "a \u{2014} b  \r\nc\r\nd\r\n");
    fx.ok("edit", json!({"path": "tail.md", "old_string": "a - b\nc\n", "new_string": "x\n"}))
        .await;
    assert_eq!(fx.get("tail.md"), "x\r\nd\r\n");
    fx.put("mid.md", "\u{2018}k\u{2019}  \r\nv\r\n");
    fx.ok("edit", json!({"path": "mid.md", "old_string": "'k'\nv", "new_string": "'z'\nw"})).await;
    assert_eq!(fx.get("mid.md"), "\u{2018}z\u{2019}\r\nw\r\n");
}

#[tokio::test]
async fn expected_count_replaces_exactly_that_many() {
    let fx = Fixture::new();
    fx.put("a.txt", "a\nb\na\nc\na\n");
    expect!["expected 2 occurrences of old_string in `a.txt` but found 3 (at lines 1, 3, 5): check old_string, or give the count found; nothing was written"]
        .assert_eq(&fx.err("edit", json!({"path": "a.txt", "old_string": "a", "new_string": "z", "expected_count": 2})).await);
    let zero = fx
        .err(
            "edit",
            json!({"path": "a.txt", "old_string": "a", "new_string": "z", "expected_count": 0}),
        )
        .await;
    assert!(zero.contains("expected_count"), "{zero}");
    assert_eq!(fx.get("a.txt"), "a\nb\na\nc\na\n");
    let out = fx
        .ok(
            "edit",
            json!({"path": "a.txt", "old_string": "a", "new_string": "z", "expected_count": 3}),
        )
        .await;
    assert!(out.starts_with("made 3 replacements"), "{out}");
    assert_eq!(fx.get("a.txt"), "z\nb\nz\nc\nz\n");
    // In multi_edit, per edit.
    let error = fx
        .err(
            "multi_edit",
            json!({"path": "a.txt", "edits": [
                {"old_string": "b", "new_string": "B"},
                {"old_string": "z", "new_string": "y", "expected_count": 1}
            ]}),
        )
        .await;
    assert!(error.starts_with("edit 2: expected 1 occurrence of old_string"), "{error}");
}

#[tokio::test]
async fn a_dry_run_shows_the_diff_and_writes_nothing() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\n");
    let out = fx
        .call(
            "edit",
            json!({"path": "a.txt", "old_string": "two", "new_string": "2", "dry_run": true}),
        )
        .await
        .unwrap();
    expect![[r#"
        dry run: the edit applies; it would make 1 replacement in `a.txt` (nothing was written)
        @@ line 2 @@
         one
        -two
        +2"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["dry_run"], true);
    let out = fx
        .ok(
            "multi_edit",
            json!({"path": "a.txt", "dry_run": true, "edits": [
                {"old_string": "one", "new_string": "1"},
                {"old_string": "two", "new_string": "2"}
            ]}),
        )
        .await;
    assert!(out.starts_with("dry run: the edit applies; it would make 2 replacements"), "{out}");
    let created = fx
        .ok(
            "edit",
            json!({"path": "new.txt", "old_string": "", "new_string": "x", "dry_run": true}),
        )
        .await;
    assert!(created.contains("it would create the file in `new.txt`"), "{created}");
    assert_eq!(fx.get("a.txt"), "one\ntwo\n");
    assert!(!fx.root().join("new.txt").exists());
}

/// `insert_line` adds whole lines after a line, as Anthropic's text editor and goose do:
/// 0 is the top, -1 after the last line; the diff shows the lines around the place.
#[tokio::test]
async fn insert_line_adds_lines_after_a_line() {
    let fx = Fixture::new();
    fx.put("a.py", "import os\n\ndef f():\n    return 1\n");
    let out = fx
        .call("edit", json!({"path": "a.py", "insert_line": 1, "new_string": "import sys\n"}))
        .await
        .unwrap();
    expect![[r#"
        made 1 insertion in `a.py`
        @@ line 2 (inserted after line 1) @@
         import os
        +import sys
         "#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["insertions"], 1);
    assert_eq!(out.extras["replacements"], 0);
    fx.ok("edit", json!({"path": "a.py", "insert_line": 0, "new_string": "#!/usr/bin/env python"}))
        .await;
    let out =
        fx.ok("edit", json!({"path": "a.py", "insert_line": -1, "new_string": "\nf()\nf()"})).await;
    expect![[r#"
        made 1 insertion in `a.py`
        @@ line 7 (inserted after line 6) @@
             return 1
        +
        +f()
        +f()"#]]
    .assert_eq(&out);
    fx.ok("edit", json!({"path": "a.py", "insert_line": -2, "new_string": "# twice"})).await;
    assert_eq!(
        fx.get("a.py"),
        "#!/usr/bin/env python\nimport os\nimport sys\n\ndef f():\n    return 1\n\nf()\n# twice\nf()\n"
    );
}

/// Inserted lines take the file's CRLF; a file without a last line break keeps ending
/// without one; an empty file gets its first line.
#[tokio::test]
async fn insert_line_keeps_the_files_line_endings() {
    let fx = Fixture::new();
    fx.put("crlf.txt", "one\r\ntwo\r\n");
    fx.ok("edit", json!({"path": "crlf.txt", "insert_line": 1, "new_string": "a\nb\n"})).await;
    assert_eq!(fx.get("crlf.txt"), "one\r\na\r\nb\r\ntwo\r\n");
    fx.put("open.txt", "one\ntwo");
    fx.ok("edit", json!({"path": "open.txt", "insert_line": 2, "new_string": "three\n"})).await;
    assert_eq!(fx.get("open.txt"), "one\ntwo\nthree");
    fx.put("empty.txt", "");
    fx.ok("edit", json!({"path": "empty.txt", "insert_line": 0, "new_string": "first"})).await;
    assert_eq!(fx.get("empty.txt"), "first\n");
}

#[tokio::test]
async fn insert_line_is_checked() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\n");
    let err = |args| async { fx.err("edit", args).await };
    expect!["insert_line 3 is outside the file, which has 2 lines: give 0 to 2 (0 inserts at the top, 2 after the last line), or -1 to -3 counting from the end; nothing was written"]
        .assert_eq(&err(json!({"path": "a.txt", "insert_line": 3, "new_string": "x"})).await);
    expect!["insert_line -4 is outside the file, which has 2 lines: give 0 to 2 (0 inserts at the top, 2 after the last line), or -1 to -3 counting from the end; nothing was written"]
        .assert_eq(&err(json!({"path": "a.txt", "insert_line": -4, "new_string": "x"})).await);
    expect!["insert_line inserts without replacing: leave out old_string, replace_all and expected_count, or leave out insert_line to replace; nothing was written"]
        .assert_eq(&err(json!({"path": "a.txt", "insert_line": 1, "old_string": "one", "new_string": "x"})).await);
    expect!["new_string is empty: give the lines to insert; nothing was written"]
        .assert_eq(&err(json!({"path": "a.txt", "insert_line": 1, "new_string": ""})).await);
    let missing = err(json!({"path": "new.txt", "insert_line": 0, "new_string": "x"})).await;
    assert_eq!(
        missing,
        "invalid arguments for `fs__edit`: at /: no file or directory at `new.txt`: check the \
         path with `fs__ls` or `fs__glob`"
    );
    assert!(!fx.root().join("new.txt").exists());
    assert_eq!(fx.get("a.txt"), "one\ntwo\n");
}

/// In `multi_edit` an insertion counts lines of the text the edits before it left.
#[tokio::test]
async fn multi_edit_mixes_replacements_and_insertions() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\n");
    let edits = json!([
        {"old_string": "one", "new_string": "one\n1.5"},
        {"insert_line": 2, "new_string": "1.75"},
    ]);
    let out = fx.ok("multi_edit", json!({"path": "a.txt", "edits": edits, "dry_run": true})).await;
    assert!(
        out.starts_with("dry run: the edit applies; it would make 1 replacement and 1 insertion"),
        "{out}"
    );
    fx.ok("multi_edit", json!({"path": "a.txt", "edits": edits})).await;
    assert_eq!(fx.get("a.txt"), "one\n1.5\n1.75\ntwo\n");
}

/// The lines shown around an insertion are cut when long (a minified line of megabytes
/// came back whole).
#[tokio::test]
async fn insertion_context_lines_are_cut() {
    let fx = Fixture::new();
    fx.put("min.js", &format!("{}\n", "x".repeat(1000)));
    let out =
        fx.ok("edit", json!({"path": "min.js", "insert_line": 0, "new_string": "// a"})).await;
    let expected = format!(
        "made 1 insertion in `min.js`\n@@ line 1 (inserted after line 0) @@\n+// a\n {}[... 800 more characters]",
        "x".repeat(200)
    );
    assert_eq!(out, expected);
}

/// An existing empty file (made with `touch`) takes its first content from an empty
/// `old_string`, as a missing one does: it had no text to replace, so `edit` could not
/// change it at all.
#[tokio::test]
async fn empty_old_string_fills_an_empty_file() {
    let fx = Fixture::new();
    fx.put("empty.txt", "");
    let out = fx
        .ok("edit", json!({"path": "empty.txt", "old_string": "", "new_string": "first\nsecond\n"}))
        .await;
    expect![[r#"
        made 1 replacement in `empty.txt`
        @@ line 1 @@
        +first
        +second"#]]
    .assert_eq(&out);
    assert_eq!(fx.get("empty.txt"), "first\nsecond\n");
}

/// Claude Code's `replace_all` once skipped matches and ate line breaks while reporting
/// success (#51986): here every occurrence is replaced, side by side ones and those at a
/// line's end or the file's unterminated end included, the count is the number replaced,
/// the CRLF line breaks stay, `$` in `new_string` is text (no regex replacement syntax),
/// and a `new_string` containing `old_string` is not matched again.
#[tokio::test]
async fn replace_all_replaces_every_occurrence_and_only_those() {
    let fx = Fixture::new();
    fx.put("a.txt", "end;\r\nend;\r\nend;end;\r\nmid end; x\r\nend;");
    fx.ok("read", json!({"path": "a.txt"})).await;
    let args = json!({"path": "a.txt", "old_string": "end;", "new_string": "$1 end; $&", "replace_all": true});
    let out = fx.call("edit", args).await.unwrap();
    assert_eq!(out.extras["replacements"], 6);
    expect![[r#"
        made 6 replacements in `a.txt`
        @@ line 1 @@
        -end;
        -end;
        -end;end;
        -mid end; x
        -end;
        +$1 end; $&
        +$1 end; $&
        +$1 end; $&$1 end; $&
        +mid $1 end; $& x
        +$1 end; $&"#]]
    .assert_eq(&out.to_text());
    assert_eq!(
        fx.get("a.txt"),
        "$1 end; $&\r\n$1 end; $&\r\n$1 end; $&$1 end; $&\r\nmid $1 end; $& x\r\n$1 end; $&"
    );
    // A multi-line old_string ending in a line break removes whole lines, CRLF and all, and
    // leaves the last, unterminated pair that does not match.
    fx.put("b.txt", "a\r\nb\r\na\r\nb\r\na\r\nb");
    fx.ok("read", json!({"path": "b.txt"})).await;
    let args =
        json!({"path": "b.txt", "old_string": "a\nb\n", "new_string": "", "replace_all": true});
    assert_eq!(fx.call("edit", args).await.unwrap().extras["replacements"], 2);
    assert_eq!(fx.get("b.txt"), "a\r\nb");
    // Occurrences do not overlap: `x\nx` in three lines of `x` is one.
    fx.put("c.txt", "x\nx\nx\n");
    fx.ok("read", json!({"path": "c.txt"})).await;
    let args =
        json!({"path": "c.txt", "old_string": "x\nx", "new_string": "y", "replace_all": true});
    assert_eq!(fx.call("edit", args).await.unwrap().extras["replacements"], 1);
    assert_eq!(fx.get("c.txt"), "y\nx\n");
}

/// Whether a file changed since it was read is judged by its content, not its time:
/// Claude Code's mtime check refused files only touched (#12805, Windows' coarse times)
/// and cannot see a same-size change whose time was put back (`cp -p`, `git checkout` of
/// an equal-length version within a second, `rsync -t`).
#[tokio::test]
async fn freshness_is_judged_by_content_not_time() {
    let fx = Fixture::new();
    let path = fx.put("a.txt", "version one\n");
    let set_time = |time: std::time::SystemTime| {
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_modified(time).unwrap();
    };
    fx.ok("read", json!({"path": "a.txt"})).await;
    // Touched: a later time, the same content.
    set_time(std::time::SystemTime::now() + std::time::Duration::from_secs(3600));
    fx.ok("edit", json!({"path": "a.txt", "old_string": "one", "new_string": "two"})).await;
    let before = std::fs::metadata(&path).unwrap().modified().unwrap();
    // Changed to content of the same length, and its time put back.
    std::fs::write(&path, "version six\n").unwrap();
    set_time(before);
    let err =
        fx.err("edit", json!({"path": "a.txt", "old_string": "six", "new_string": "ten"})).await;
    assert!(err.contains("has been modified since it was last read"), "{err}");
    let err = fx.err("write", json!({"path": "a.txt", "content": "replaced\n"})).await;
    assert!(err.contains("has been modified since it was last read"), "{err}");
    assert_eq!(fx.get("a.txt"), "version six\n");
}

/// A `replace_all` diff shows the whole lines it changed with the lines around them, as
/// a single replacement's now does, nearby changes in one hunk: it showed each occurrence's
/// text alone (`-sum`, `+total`), three times, whatever the lines were. A long file's
/// diff stays short, and a minified line is not shown whole.
#[tokio::test]
async fn a_replace_all_diff_shows_whole_lines_with_context() {
    let fx = Fixture::new();
    let body = "fn total(items: &[Item]) -> u32 {\n    let mut sum = 0;\n    for item in items {\n        sum += item.price * item.count;\n    }\n    sum\n}\n";
    let filler: String = (1..=20).map(|n| format!("// note {n}\n")).collect();
    fx.put("a.rs", &format!("{body}{filler}fn sum_all() {{}}\n{filler}// sum again\n"));
    fx.ok("read", json!({"path": "a.rs"})).await;
    let args =
        json!({"path": "a.rs", "old_string": "sum", "new_string": "total", "replace_all": true});
    expect![[r#"
        made 5 replacements in `a.rs`
        @@ line 2 @@
         fn total(items: &[Item]) -> u32 {
        -    let mut sum = 0;
        +    let mut total = 0;
             for item in items {
        -        sum += item.price * item.count;
        +        total += item.price * item.count;
             }
        -    sum
        +    total
         }
         // note 1
        @@ line 28 @@
         // note 19
         // note 20
        -fn sum_all() {}
        +fn total_all() {}
         // note 1
         // note 2
        @@ line 49 @@
         // note 19
         // note 20
        -// sum again
        +// total again"#]]
    .assert_eq(&fx.ok("edit", args).await);
    // Many occurrences: three hunks at most, each bounded, and a minified line shown by
    // its replaced text only.
    let many: String = (0..200).map(|n| format!("x{n} = old\n")).collect();
    let minified = format!("{}old{}\n", "a".repeat(1000), "b".repeat(1000));
    fx.put("b.txt", &format!("{minified}{many}"));
    fx.ok("read", json!({"path": "b.txt"})).await;
    let args =
        json!({"path": "b.txt", "old_string": "old", "new_string": "new", "replace_all": true});
    let out = fx.ok("edit", args).await;
    assert!(out.len() < 4000, "{}", out.len());
    expect![[r#"
        made 201 replacements in `b.txt`
        @@ line 1 (a long line: the replaced text only) @@
        -old
        +new
        @@ line 2 @@
         aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa[... 1803 more characters]
        -x0 = old
        -x1 = old
        -x2 = old
        -x3 = old
        -x4 = old
        -x5 = old
        -x6 = old
        -x7 = old
        -x8 = old
        -x9 = old
        -x10 = old
        -x11 = old
        +x0 = new
        +x1 = new
        +x2 = new
        +x3 = new
        +x4 = new
        +x5 = new
        +x6 = new
        +x7 = new
        +x8 = new
        +x9 = new
        +x10 = new
        +x11 = new
         x12 = new
         x13 = new
        @@ line 14 @@
         x10 = new
         x11 = new
        -x12 = old
        -x13 = old
        -x14 = old
        -x15 = old
        -x16 = old
        -x17 = old
        -x18 = old
        -x19 = old
        -x20 = old
        -x21 = old
        -x22 = old
        +x12 = new
        +x13 = new
        +x14 = new
        +x15 = new
        +x16 = new
        +x17 = new
        +x18 = new
        +x19 = new
        +x20 = new
        +x21 = new
        +x22 = new
         x23 = new
         x24 = new
        [diff shows 24 of 201 replacements]"#]].assert_eq(&out);
}

/// An `old_string` written composed (NFC, as models write `é`) matches a file written
/// decomposed (NFD, `e` and a combining accent, as macOS writes names), and the reverse:
/// the file's own bytes of that span are replaced, the rest of the file keeps its form,
/// and `new_string` is written in the file's form when the file has one. The edit was
/// refused as not found, the text looking the same on both sides.
#[tokio::test]
async fn an_edit_matches_text_in_another_unicode_normalization_form() {
    let fx = Fixture::new();
    // NFD throughout, as a file written on macOS: `é` is `e` U+0301.
    let nfd = "caf\u{65}\u{301} = 1\nna\u{69}\u{308}ve = 2\n\u{1100}\u{1161}\u{11a8} = 3\n";
    fx.put("menu.txt", nfd);
    fx.ok("read", json!({"path": "menu.txt"})).await;
    let args = json!({"path": "menu.txt", "old_string": "caf\u{e9} = 1", "new_string": "caf\u{e9} = 10\ncr\u{e8}me = 4"});
    let out = fx.ok("edit", args).await;
    assert!(
        out.starts_with(
            "made 1 replacement in `menu.txt`\n@@ line 1 (matched the file's decomposed accents \
             (Unicode NFD) and wrote them so) @@"
        ),
        "{out}"
    );
    assert_eq!(
        fx.get("menu.txt"),
        "cafe\u{301} = 10\ncre\u{300}me = 4\nnai\u{308}ve = 2\n\u{1100}\u{1161}\u{11a8} = 3\n"
    );
    // A Hangul syllable written as jamo, matched by the syllable.
    let args =
        json!({"path": "menu.txt", "old_string": "\u{ac01} = 3", "new_string": "\u{ac01} = 30"});
    fx.ok("edit", args).await;
    assert!(fx.get("menu.txt").ends_with("\n\u{1100}\u{1161}\u{11a8} = 30\n"));

    // NFC file, NFD old_string: the composed bytes are replaced, new_string composed.
    fx.put("nfc.txt", "r\u{e9}sum\u{e9}: yes\n");
    fx.ok("read", json!({"path": "nfc.txt"})).await;
    let args = json!({"path": "nfc.txt", "old_string": "re\u{301}sume\u{301}: yes", "new_string": "re\u{301}sume\u{301}: no"});
    let out = fx.ok("edit", args).await;
    assert!(out.contains("(matched the file's composed accents (Unicode NFC)"), "{out}");
    assert_eq!(fx.get("nfc.txt"), "r\u{e9}sum\u{e9}: no\n");

    // A file of both forms: the decomposed span is replaced, the composed word elsewhere
    // keeps its bytes, and new_string goes in as given.
    fx.put("mixed.txt", "caf\u{e9}\nnai\u{308}ve\n");
    fx.ok("read", json!({"path": "mixed.txt"})).await;
    let args = json!({"path": "mixed.txt", "old_string": "na\u{ef}ve", "new_string": "na\u{ef}f"});
    fx.ok("edit", args).await;
    assert_eq!(fx.get("mixed.txt"), "caf\u{e9}\nna\u{ef}f\n");

    // Two places: replace_all is asked for, as for any match.
    fx.put("two.txt", "e\u{301}t\u{e9}\ne\u{301}t\u{e9}\n");
    fx.ok("read", json!({"path": "two.txt"})).await;
    let args = json!({"path": "two.txt", "old_string": "\u{e9}t\u{e9}", "new_string": "summer"});
    let err = fx.err("edit", args).await;
    assert!(err.starts_with("found 2 matches of old_string in `two.txt` (at lines 1, 2)"), "{err}");
}

/// An `old_string` that stops where the file's letter has a combining accent after it
/// (`cafe` in `cafe` U+0301, which reads `café`) is no match: the edit replaced `cafe` and
/// left the accent on the new text (`tea` U+0301). Nor is one that starts with an accent
/// away from its letter; `replace_all` replaces only the whole places.
#[tokio::test]
async fn an_edit_never_splits_a_letter_from_its_accents() {
    let fx = Fixture::new();
    fx.put("menu.txt", "cafe\u{301} = 1\n");
    fx.ok("read", json!({"path": "menu.txt"})).await;
    let err = fx
        .err("edit", json!({"path": "menu.txt", "old_string": "cafe", "new_string": "tea"}))
        .await;
    assert_eq!(
        err,
        "old_string was not found in `menu.txt` as a whole: where it occurs (line 1, in \
         `cafe\u{301}`, written with the combining mark U+0301) it stops inside an accented \
         character, before its accent, and replacing it would leave the accent on the new \
         text; give old_string with the whole accented text as the file has it (copy it from \
         `read`); nothing was written"
    );
    let err = fx
        .err("edit", json!({"path": "menu.txt", "old_string": "\u{301} = 1", "new_string": " = 2"}))
        .await;
    let inside = "(line 1, in `e\u{301} = 1`, written with the combining mark U+0301) it starts \
                  inside an accented character, after the letter its accent belongs to";
    assert!(err.contains(inside), "{err}");
    assert_eq!(fx.get("menu.txt"), "cafe\u{301} = 1\n");
    // With its accent, as the file has it or composed, it is found.
    let args = json!({"path": "menu.txt", "old_string": "caf\u{e9}", "new_string": "tea"});
    fx.ok("edit", args).await;
    assert_eq!(fx.get("menu.txt"), "tea = 1\n");

    fx.put("two.txt", "cafe\u{301} cafe\ncafe\n");
    fx.ok("read", json!({"path": "two.txt"})).await;
    let args =
        json!({"path": "two.txt", "old_string": "cafe", "new_string": "tea", "replace_all": true});
    let out = fx.call("edit", args).await.unwrap();
    assert_eq!(out.extras["replacements"], 2);
    assert_eq!(fx.get("two.txt"), "cafe\u{301} tea\ntea\n");
    // A single place left is the one replaced, as when the file holds it once.
    let args = json!({"path": "two.txt", "old_string": "tea\ntea", "new_string": "soda"});
    fx.ok("edit", args).await;
    fx.put("one.txt", "cafe\u{301} or cafe?\n");
    fx.ok("read", json!({"path": "one.txt"})).await;
    fx.ok("edit", json!({"path": "one.txt", "old_string": "cafe", "new_string": "tea"})).await;
    assert_eq!(fx.get("one.txt"), "cafe\u{301} or tea?\n");
    // Nor does reading the file's curly quotes as plain ones find it.
    fx.put("quote.txt", "say \u{201c}cafe\u{301}\u{201d}\n");
    fx.ok("read", json!({"path": "quote.txt"})).await;
    let args = json!({"path": "quote.txt", "old_string": "say \"cafe", "new_string": "say \"tea"});
    let err = fx.err("edit", args).await;
    assert!(err.starts_with("old_string was not found in `quote.txt`; the closest line"), "{err}");
    assert_eq!(fx.get("quote.txt"), "say \u{201c}cafe\u{301}\u{201d}\n");
}

/// An `old_string` that begins with a combining mark is refused saying to start it with
/// the letter before the mark, whatever form the file's accents are in.
#[tokio::test]
async fn an_old_string_beginning_with_an_accent_is_refused_saying_to_give_its_letter() {
    let fx = Fixture::new();
    fx.put("nfd.txt", "cafe\u{301} = 1\n");
    fx.ok("read", json!({"path": "nfd.txt"})).await;
    let args = json!({"path": "nfd.txt", "old_string": "\u{301} = 1", "new_string": "= 2"});
    let err = fx.err("edit", args).await;
    assert!(err.contains("; start old_string with the letter before the accent as"), "{err}");
    fx.put("nfc.txt", "caf\u{e9} = 1\n");
    fx.ok("read", json!({"path": "nfc.txt"})).await;
    let args = json!({"path": "nfc.txt", "old_string": "\u{301} = 1", "new_string": "= 2"});
    expect!["old_string was not found in `nfc.txt`: it begins with the combining mark U+0301, which belongs to the letter before it; start old_string with that letter (copy the text from `read`); nothing was written"]
        .assert_eq(&fx.err("edit", args).await);
    assert_eq!(fx.get("nfd.txt"), "cafe\u{301} = 1\n");
    assert_eq!(fx.get("nfc.txt"), "caf\u{e9} = 1\n");
}

/// Accents in the other Unicode form match together with the typographic and line-end
/// readings, and the replacement is written in the file's form and style, where each
/// reading alone found nothing and the edit was refused pointing at a line that looked
/// the same as `old_string`.
#[tokio::test]
async fn accents_match_together_with_typographic_quotes_and_line_ends() {
    let fx = Fixture::new();
    // NFD with curly quotes; `old_string` NFC with plain ones.
    fx.put("quote.txt", "say \u{201c}cafe\u{301}\u{201d}\n");
    fx.ok("read", json!({"path": "quote.txt"})).await;
    let args = json!({"path": "quote.txt", "old_string": "say \"caf\u{e9}\"",
                      "new_string": "say \"th\u{e9}\""});
    let out = fx.ok("edit", args).await;
    assert!(out.contains("with plain ones and the file's accents in their Unicode form"), "{out}");
    assert_eq!(fx.get("quote.txt"), "say \u{201c}the\u{301}\u{201d}\n");
    // NFC with trailing spaces and CRLF; `old_string` NFD with LF.
    fx.put("lines.txt", "caf\u{e9}  \r\nnext\r\n");
    fx.ok("read", json!({"path": "lines.txt"})).await;
    let args = json!({"path": "lines.txt", "old_string": "cafe\u{301}\nnext",
                      "new_string": "the\u{301}\nlast"});
    let out = fx.ok("edit", args).await;
    assert!(out.contains("ends of lines, with the file's accents in their Unicode form"), "{out}");
    assert_eq!(fx.get("lines.txt"), "th\u{e9}\r\nlast\r\n");
}
