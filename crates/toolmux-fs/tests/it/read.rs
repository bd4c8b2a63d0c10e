//! `read`: pages, markers, errors.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;
use toolmux_core::ContentPart;
use toolmux_fs::FsLimits;

#[tokio::test]
async fn numbered_lines_and_total() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\nthree\n");
    let out = fx.call("read", json!({"path": "a.txt"})).await.unwrap();
    assert_eq!(out.to_text(), "     1\tone\n     2\ttwo\n     3\tthree\n");
    assert_eq!(out.extras["totalLines"], 3);
    assert_eq!(out.extras["truncated"], false);
}

#[tokio::test]
async fn offset_and_limit_page_with_continuation() {
    let fx = Fixture::new();
    let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    fx.put("a.txt", &text);
    let out = fx.call("read", json!({"path": "a.txt", "offset": 4, "limit": 2})).await.unwrap();
    assert_eq!(
        out.to_text(),
        "     4\tline 4\n     5\tline 5\n\n[showing lines 4-5 of 10; use offset=6 to read more]"
    );
    assert_eq!(out.extras["totalLines"], 10);
    assert_eq!(out.extras["truncated"], true);
    let last = fx.ok("read", json!({"path": "a.txt", "offset": 10})).await;
    assert_eq!(last, "    10\tline 10\n");
}

#[tokio::test]
async fn default_limit_is_2000_lines() {
    let fx = Fixture::new();
    let text: String = (1..=2500).map(|i| format!("{i}\n")).collect();
    fx.put("a.txt", &text);
    let out = fx.call("read", json!({"path": "a.txt"})).await.unwrap();
    assert_eq!(out.extras["endLine"], 2000);
    assert!(
        out.to_text().ends_with("[showing lines 1-2000 of 2500; use offset=2001 to read more]")
    );
}

#[tokio::test]
async fn long_lines_are_cut_with_a_marker() {
    let fx = Fixture::new();
    fx.put("a.txt", &format!("{}\nshort\n", "x".repeat(2500)));
    let out = fx.call("read", json!({"path": "a.txt"})).await.unwrap();
    let text = out.to_text();
    let marker = "[... 500 more characters: read on with offset=1, limit=1, start_char=2000]";
    assert!(text.starts_with(&format!("     1\t{}{marker}\n", "x".repeat(2000))));
    assert_eq!(out.extras["linesCut"], 1);
}

/// The rest of a long line is read with the `start_char` its cut marker gives, piece by
/// piece, in characters (not bytes); nothing past character 2000 could be read.
#[tokio::test]
async fn a_long_line_is_read_on_with_start_char() {
    let fx = Fixture::new();
    let line = format!("{}{}{}", "a".repeat(2000), "é".repeat(2000), "z".repeat(500));
    fx.put("long.txt", &format!("first\n{line}\nlast\n"));
    let first = fx.ok("read", json!({"path": "long.txt", "offset": 2, "limit": 1})).await;
    let marker = "[... 2500 more characters: read on with offset=2, limit=1, start_char=2000]";
    assert!(first.starts_with(&format!("     2\t{}{marker}\n", "a".repeat(2000))), "{first}");
    let args = json!({"path": "long.txt", "offset": 2, "limit": 1, "start_char": 2000});
    let second = fx.ok("read", args).await;
    let marker = "[... 500 more characters: read on with offset=2, limit=1, start_char=4000]";
    assert!(second.starts_with(&format!("     2\t{}{marker}\n", "é".repeat(2000))), "{second}");
    assert!(second.contains("[characters 2001-4000 of line 2's 4500]"), "{second}");
    let third = fx.ok("read", json!({"path": "long.txt", "offset": 2, "start_char": 4000})).await;
    assert!(third.starts_with(&format!("     2\t{}\n", "z".repeat(500))), "{third}");
    assert!(third.contains("[characters 4001-4500 of line 2's 4500]"), "{third}");
    assert!(third.contains("use offset=3 to read more"), "{third}");
    // Past the line's end, and with more than one line, it is refused saying why.
    let args = json!({"path": "long.txt", "offset": 2, "start_char": 4500});
    expect!["invalid arguments for `fs__read`: at /: start_char 4500 is past the end of line 2 of `long.txt`, which has 4500 characters"]
        .assert_eq(&fx.err("read", args).await);
    let args = json!({"path": "long.txt", "offset": 2, "limit": 5, "start_char": 10});
    expect!["invalid arguments for `fs__read`: at /: `start_char` reads on in one line, line `offset`: give `limit` 1 or leave it out"]
        .assert_eq(&fx.err("read", args).await);
}

/// A character cut by the end of a read chunk is skipped whole by `start_char`.
#[tokio::test]
async fn start_char_counts_characters_across_chunks() {
    let fx = Fixture::new();
    // 256 KiB chunks: the first chunk ends in the middle of an `é`.
    let line = format!("{}{}tail", "a".repeat(256 * 1024 - 1), "é".repeat(3));
    fx.put("cut.txt", &line);
    let args = json!({"path": "cut.txt", "start_char": 256 * 1024});
    let out = fx.ok("read", args).await;
    assert!(out.starts_with("     1\téétail\n"), "{out}");
}

/// `start_char` counts the characters `read` shows: invalid UTF-8 as the U+FFFD each
/// invalid sequence is shown as, so a long line read in two parts joins back whole.
#[tokio::test]
async fn start_char_counts_invalid_bytes_as_shown() {
    let fx = Fixture::new();
    let mut line = "a".repeat(1500).into_bytes();
    line.extend(b"\x80".repeat(50));
    line.extend(b"\xF0\x80\x80".repeat(20));
    line.extend("b".repeat(1000).into_bytes());
    line.extend(b"\xE2\x82");
    let shown = String::from_utf8_lossy(&line).into_owned();
    assert_eq!(shown.chars().count(), 2611);
    std::fs::write(fx.root().join("bad.txt"), [&line[..], b"\nnext\n"].concat()).unwrap();
    let first = fx.ok("read", json!({"path": "bad.txt", "offset": 1, "limit": 1})).await;
    let marker = "[... 611 more characters: read on with offset=1, limit=1, start_char=2000]";
    assert!(first.contains(marker), "{first}");
    let args = json!({"path": "bad.txt", "offset": 1, "start_char": 2000});
    let second = fx.ok("read", args).await;
    assert!(second.contains("[characters 2001-2611 of line 1's 2611]"), "{second}");
    let part = |out: &str| {
        let line = out.lines().next().unwrap().strip_prefix("     1\t").unwrap().to_owned();
        line.split("[... ").next().unwrap().to_owned()
    };
    assert_eq!(part(&first) + &part(&second), shown);
    assert!(second.contains("[the file is not valid UTF-8"), "{second}");
}

#[tokio::test]
async fn a_page_over_the_byte_cap_ends_early_and_says_how_to_continue() {
    let fx =
        Fixture::with(|c| c.with_limits(FsLimits { read_page_bytes: 100, ..FsLimits::default() }));
    let text: String = (1..=50).map(|i| format!("line number {i}\n")).collect();
    fx.put("a.txt", &text);
    let out = fx.call("read", json!({"path": "a.txt"})).await.unwrap();
    let text = out.to_text();
    assert!(
        text.ends_with(
            "[page capped at 100 bytes; showing lines 1-4 of 50; use offset=5 to read more]"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn directories_suggest_ls() {
    let fx = Fixture::new();
    fx.put("d/x", "");
    expect!["invalid arguments for `fs__read`: at /: `d` is a directory, not a file: use `fs__ls` to list it"]
        .assert_eq(&fx.err("read", json!({"path": "d"})).await);
}

#[tokio::test]
async fn binary_is_detected_by_content_not_extension() {
    let fx = Fixture::new();
    fx.put("data.txt", "abc\0def");
    fx.put("notes.dat", "plain text\n");
    expect!["`data.txt` is a binary file (it contains NUL bytes); it cannot be shown as text, inspect it with `fs__bash` tools such as `file` or `xxd` if allowed"]
        .assert_eq(&fx.err("read", json!({"path": "data.txt"})).await);
    assert_eq!(fx.ok("read", json!({"path": "notes.dat"})).await, "     1\tplain text\n");
}

#[tokio::test]
async fn invalid_utf8_is_replaced_and_flagged() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("a.txt"), b"ok\n\xff\xfe bad\n").unwrap();
    let out = fx.call("read", json!({"path": "a.txt"})).await.unwrap();
    assert_eq!(
        out.to_text(),
        "     1\tok\n     2\t\u{fffd}\u{fffd} bad\n\n[the file is not valid UTF-8: invalid bytes are shown as U+FFFD]"
    );
    assert_eq!(out.extras["invalidUtf8"], true);
}

#[tokio::test]
async fn offset_past_the_end_names_the_line_count() {
    let fx = Fixture::new();
    fx.put("a.txt", "1\n2\n");
    expect!["invalid arguments for `fs__read`: at /: offset 7 is past the end of `a.txt`, which has 2 lines"]
        .assert_eq(&fx.err("read", json!({"path": "a.txt", "offset": 7})).await);
}

#[tokio::test]
async fn empty_file_and_missing_file() {
    let fx = Fixture::new();
    fx.put("empty", "");
    assert_eq!(fx.ok("read", json!({"path": "empty"})).await, "[`empty` is empty]");
    expect!["invalid arguments for `fs__read`: at /: no file or directory at `nope.txt`: check the path with `fs__ls` or `fs__glob`"]
        .assert_eq(&fx.err("read", json!({"path": "nope.txt"})).await);
}

#[tokio::test]
async fn crlf_bom_and_missing_final_newline() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("a.txt"), "\u{feff}a\r\nb").unwrap();
    assert_eq!(fx.ok("read", json!({"path": "a.txt"})).await, "     1\ta\n     2\tb\n");
}

/// A file whose lines end in a bare CR (classic Mac OS) is read as lines, and so is the
/// block around one of them; a bare CR in a file of LF lines stays text.
#[tokio::test]
async fn cr_only_files_read_as_lines() {
    let fx = Fixture::new();
    fx.put("cr.txt", "a\rb\rc\r");
    let out = fx.call("read", json!({"path": "cr.txt"})).await.unwrap();
    expect![[r#"
             1	a
             2	b
             3	c

        [the file's lines end in a bare CR; `edit` and `write` keep them so]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["totalLines"], 3);
    let page = fx.ok("read", json!({"path": "cr.txt", "offset": 2, "limit": 1})).await;
    assert!(page.starts_with("     2\tb\n\n[showing lines 2-2 of 3; use offset=3"), "{page}");
    fx.put("code.txt", "fn f() {\r    x\r}\r");
    let block = fx.ok("read", json!({"path": "code.txt", "anchor_line": 2})).await;
    assert!(block.starts_with("[lines 1-3: the block around line 2]"), "{block}");
    fx.put("mixed.txt", "a\rb\nc\n");
    assert_eq!(fx.ok("read", json!({"path": "mixed.txt"})).await, "     1\ta\rb\n     2\tc\n");
}

/// The line ending is told from the whole file, not its first chunk: CRs first seen past
/// it, or an LF past a chunk of CR lines, are read as the whole file has them.
#[tokio::test]
async fn line_endings_past_the_first_chunk_count() {
    let fx = Fixture::new();
    let long = "x".repeat(300 * 1024);
    fx.put("late_cr.txt", &format!("{long}\ry\r"));
    let out = fx.call("read", json!({"path": "late_cr.txt"})).await.unwrap();
    assert_eq!(out.extras["totalLines"], 2);
    let cr_lines = "a\r".repeat(100 * 1024);
    fx.put("late_lf.txt", &format!("{cr_lines}b\n"));
    let out = fx.call("read", json!({"path": "late_lf.txt"})).await.unwrap();
    assert_eq!(out.extras["totalLines"], 1);
}

#[tokio::test]
async fn absolute_paths_inside_the_root_work() {
    let fx = Fixture::new();
    let abs = fx.put("sub/a.txt", "x\n");
    assert_eq!(fx.ok("read", json!({"path": abs.to_str().unwrap()})).await, "     1\tx\n");
}

#[tokio::test]
async fn fifos_are_refused_without_blocking() {
    let fx = Fixture::new();
    let status = std::process::Command::new("mkfifo")
        .arg(fx.root().join("pipe"))
        .current_dir(fx.root())
        .status()
        .unwrap();
    assert!(status.success());
    expect!["`pipe` is not a regular file (a FIFO, socket or device); refusing to open it"]
        .assert_eq(&fx.err("read", json!({"path": "pipe"})).await);
}

#[tokio::test]
async fn unknown_arguments_are_refused() {
    let fx = Fixture::new();
    fx.put("a", "x");
    let err = fx.err("read", json!({"filename": "a"})).await;
    assert!(
        err.starts_with("invalid arguments for `fs__read`: at /: unknown field `filename`"),
        "{err}"
    );
}

fn utf16(text: &str, big_endian: bool) -> Vec<u8> {
    let mut bytes = if big_endian { vec![0xFE, 0xFF] } else { vec![0xFF, 0xFE] };
    for unit in text.encode_utf16() {
        bytes.extend(if big_endian { unit.to_be_bytes() } else { unit.to_le_bytes() });
    }
    bytes
}

#[tokio::test]
async fn utf16_files_are_decoded() {
    let fx = Fixture::new();
    for (name, big_endian) in [("le.txt", false), ("be.txt", true)] {
        std::fs::write(
            fx.root().join(name),
            utf16("caf\u{e9}\r\nsmile \u{1F600}\nend", big_endian),
        )
        .unwrap();
        let out = fx.call("read", json!({"path": name})).await.unwrap();
        let which = if big_endian { "BE" } else { "LE" };
        assert_eq!(
            out.to_text(),
            format!(
                "     1\tcaf\u{e9}\n     2\tsmile \u{1F600}\n     3\tend\n\n[the file is UTF-16 \
                 {which}; `edit` and `write` keep it so]"
            )
        );
        assert_eq!(out.extras["totalLines"], 3);
        assert_eq!(out.extras["encoding"], format!("UTF-16 {which}"));
    }
    // Paging works on the decoded lines.
    let out = fx.call("read", json!({"path": "le.txt", "offset": 2, "limit": 1})).await.unwrap();
    assert!(
        out.to_text().starts_with("     2\tsmile \u{1F600}\n\n[showing lines 2-2 of 3"),
        "{}",
        out.to_text()
    );
}

#[tokio::test]
async fn a_large_utf16_file_is_decoded_across_reads() {
    let fx = Fixture::new();
    // Over the 256 KiB read buffer, with a surrogate pair on every line, so that some pair
    // and some code unit are cut between two reads.
    let text: String = (1..=40_000).map(|i| format!("{i} \u{1F600}\n")).collect();
    std::fs::write(fx.root().join("big.txt"), utf16(&text, false)).unwrap();
    let out = fx.call("read", json!({"path": "big.txt", "offset": 39_999})).await.unwrap();
    assert_eq!(out.extras["totalLines"], 40_000);
    assert!(
        out.to_text().starts_with(" 39999\t39999 \u{1F600}\n 40000\t40000 \u{1F600}\n"),
        "{}",
        out.to_text()
    );
}

#[tokio::test]
async fn invalid_utf16_is_refused() {
    let fx = Fixture::new();
    // An unpaired high surrogate followed by `a`.
    std::fs::write(fx.root().join("bad.txt"), [0xFF, 0xFE, b'x', 0, 0x3D, 0xD8, b'a', 0]).unwrap();
    expect!["`bad.txt` is not valid UTF-16: an unpaired surrogate at byte 6: it cannot be shown as text; inspect it with `fs__bash` tools such as `file` or `xxd` if allowed"]
        .assert_eq(&fx.err("read", json!({"path": "bad.txt"})).await);
    std::fs::write(fx.root().join("odd.txt"), [0xFE, 0xFF, 0, b'x', 0]).unwrap();
    expect!["`odd.txt` is not valid UTF-16: it ends in the middle of a code unit (an odd number of bytes): it cannot be shown as text; inspect it with `fs__bash` tools such as `file` or `xxd` if allowed"]
        .assert_eq(&fx.err("read", json!({"path": "odd.txt"})).await);
}

const UNCHANGED: &str = "[File unchanged since last read";

#[tokio::test]
async fn an_unchanged_page_read_again_is_answered_with_a_short_note_once() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\nthree\n");
    let args = json!({"path": "a.txt"});
    let first = fx.call_in("r1", "read", args.clone()).await.unwrap();
    assert_eq!(first.to_text(), "     1\tone\n     2\ttwo\n     3\tthree\n");
    let again = fx.call_in("r1", "read", args.clone()).await.unwrap();
    expect!["[File unchanged since last read: lines 1-3 of `a.txt` (3 lines in all) are exactly as the earlier `read` of this range in this run showed them, so they are not repeated. If that result is no longer available to you, make this same call again to get the lines.]"]
        .assert_eq(&again.to_text());
    assert_eq!(again.extras["unchanged"], true);
    assert_eq!(again.extras["totalLines"], 3);
    // Asked once more, the lines come back; then the note again.
    assert_eq!(fx.call_in("r1", "read", args.clone()).await.unwrap().to_text(), first.to_text());
    assert!(fx.call_in("r1", "read", args.clone()).await.unwrap().to_text().starts_with(UNCHANGED));
    // The same range spelled out counts as the same range; another run has its own record.
    let explicit = json!({"path": "a.txt", "offset": 1, "limit": 2000});
    assert_eq!(fx.call_in("r1", "read", explicit).await.unwrap().to_text(), first.to_text());
    assert_eq!(fx.call_in("r2", "read", args).await.unwrap().to_text(), first.to_text());
}

#[tokio::test]
async fn a_changed_file_or_another_range_is_shown_again() {
    let fx = Fixture::new();
    let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    fx.put("a.txt", &text);
    let page = json!({"path": "a.txt", "offset": 3, "limit": 2});
    let lines =
        "     3\tline 3\n     4\tline 4\n\n[showing lines 3-4 of 10; use offset=5 to read more]";
    assert_eq!(fx.call_in("r", "read", page.clone()).await.unwrap().to_text(), lines);
    expect![[r#"
        [File unchanged since last read: lines 3-4 of `a.txt` (10 lines in all) are exactly as the earlier `read` of this range in this run showed them, so they are not repeated. If that result is no longer available to you, make this same call again to get the lines.]
        [more lines follow: use offset=5 to read them]"#]]
    .assert_eq(&fx.call_in("r", "read", page.clone()).await.unwrap().to_text());
    // Another range in between: the last read is no longer this range.
    fx.call_in("r", "read", json!({"path": "a.txt", "offset": 5, "limit": 2})).await.unwrap();
    assert_eq!(fx.call_in("r", "read", page.clone()).await.unwrap().to_text(), lines);
    // Changed by an edit of this run, or behind its back: shown in full.
    let edit = json!({"path": "a.txt", "old_string": "line 4\n", "new_string": "line four\n"});
    fx.call_in("r", "edit", edit).await.unwrap();
    let edited = fx.call_in("r", "read", page.clone()).await.unwrap().to_text();
    assert!(edited.starts_with("     3\tline 3\n     4\tline four\n"), "{edited}");
    fx.put("a.txt", &text.replace("line 3", "line three"));
    let changed = fx.call_in("r", "read", page).await.unwrap().to_text();
    assert!(changed.starts_with("     3\tline three\n"), "{changed}");
}

#[tokio::test]
async fn a_page_cut_short_by_the_byte_cap_is_never_answered_unchanged() {
    let fx =
        Fixture::with(|c| c.with_limits(FsLimits { read_page_bytes: 100, ..FsLimits::default() }));
    let text: String = (1..=50).map(|i| format!("line number {i}\n")).collect();
    fx.put("a.txt", &text);
    let first = fx.call_in("r", "read", json!({"path": "a.txt"})).await.unwrap().to_text();
    let second = fx.call_in("r", "read", json!({"path": "a.txt"})).await.unwrap().to_text();
    assert!(first.contains("[page capped at 100 bytes"), "{first}");
    assert_eq!(first, second);
}

#[tokio::test]
async fn a_person_always_gets_the_lines() {
    let fx = Fixture::new();
    fx.put("a.txt", "x\n");
    let ctx = toolmux_core::CallContext::new().with_run_id("r").from_person();
    for _ in 0..2 {
        let out = toolmux_core::ToolProvider::call(&fx.fs, "read", json!({"path": "a.txt"}), &ctx)
            .await
            .unwrap();
        assert_eq!(out.to_text(), "     1\tx\n");
    }
}

#[tokio::test]
async fn the_description_tells_the_model_about_unchanged_answers() {
    let fx = Fixture::new();
    let tools = toolmux_core::ToolProvider::list_tools(&fx.fs).await.unwrap();
    let read = tools.iter().find(|t| t.name == "read").unwrap();
    assert!(
        read.description.contains("`[File unchanged since last read ...]`"),
        "{}",
        read.description
    );
    assert!(read.description.contains("make the same call once more"), "{}", read.description);
}

/// An image (by its signature, whatever its name) is returned as an image with a line
/// saying what it is, and counts as read; one over 5 MiB is refused; other binary files
/// still are.
#[tokio::test]
async fn images_are_returned_as_images() {
    use base64::Engine as _;
    let fx = Fixture::new();
    let png: Vec<u8> =
        [&[0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a][..], &[0, 1, 2, 3, 0, 255]].concat();
    std::fs::write(fx.root().join("shot.png"), &png).unwrap();
    let out = fx.call("read", json!({"path": "shot.png"})).await.unwrap();
    assert_eq!(out.content.len(), 2, "{:?}", out.content);
    assert_eq!(
        out.content[0],
        ContentPart::Text { text: "`shot.png`: image/png, 14 bytes".into() }
    );
    let data = base64::engine::general_purpose::STANDARD.encode(&png);
    assert_eq!(out.content[1], ContentPart::Image { data, mime_type: "image/png".into() });
    // Read in this run: writing it needs no other read.
    let written = fx.call("write", json!({"path": "shot.png", "content": "now text"})).await;
    assert!(written.is_ok(), "{written:?}");

    let jpeg = [&[0xff, 0xd8, 0xff, 0xe0][..], &vec![0u8; 5 * 1024 * 1024 + 1]].concat();
    std::fs::write(fx.root().join("huge.jpg"), &jpeg).unwrap();
    let err = fx.err("read", json!({"path": "huge.jpg"})).await;
    assert!(err.contains("over the 5242880-byte limit"), "{err}");
    std::fs::write(fx.root().join("blob.bin"), [1u8, 0, 2, 0]).unwrap();
    let err = fx.err("read", json!({"path": "blob.bin"})).await;
    assert!(err.contains("binary"), "{err}");
}

/// `anchor_line` on a file over `fs.limits.editMaxBytes` says why it cannot look there and
/// that `edit` cannot either, and what to do instead: it showed nothing, so the file is
/// not recorded as read, while the read by `offset` it points to is, and lets `write`
/// replace the file.
#[tokio::test]
async fn anchor_line_over_the_edit_limit_says_what_to_do() {
    let fx =
        Fixture::with(|c| c.with_limits(FsLimits { edit_max_bytes: 10, ..FsLimits::default() }));
    fx.put("big.py", "def f():\n    return 1\n");
    let err = fx.call("read", json!({"path": "big.py", "anchor_line": 2})).await.unwrap_err();
    assert_eq!(err.code(), "invalid_arguments");
    expect![[r#"invalid arguments for `fs__read`: at /: `big.py` is 22 bytes, over `fs.limits.editMaxBytes` (10): `anchor_line` finds blocks only in files it holds whole, as `edit` does, so neither works on it; read it by `offset` and `limit` instead (a read of any part lets `write` replace it whole)"#]]
    .assert_eq(&err.report());
    let edit = json!({"path": "big.py", "old_string": "1", "new_string": "2"});
    assert!(fx.err("edit", edit).await.contains("over the 10-byte limit of `edit`"));
    let unread = fx.err("write", json!({"path": "big.py", "content": "x\n"})).await;
    assert!(unread.contains("read"), "{unread}");
    fx.ok("read", json!({"path": "big.py", "offset": 2, "limit": 1})).await;
    fx.ok("write", json!({"path": "big.py", "content": "x\n"})).await;
    assert_eq!(fx.get("big.py"), "x\n");
}

/// `anchor_line`: the block of code around a line, by indentation, numbered as `read`
/// numbers lines; `levels` goes outward.
#[tokio::test]
async fn anchor_line_reads_the_block_around_a_line() {
    let fx = Fixture::new();
    fx.put(
        "app.py",
        "import os\n\n# A greeter.\nclass Greeter:\n    def greet(self):\n        return 'hi'\n\n    def bye(self):\n        return 'bye'\n\nprint(1)\n",
    );
    let out = fx.call("read", json!({"path": "app.py", "anchor_line": 9})).await.unwrap();
    assert_eq!(
        out.to_text(),
        "[lines 8-9: the block around line 9]\n     8\t    def bye(self):\n     9\t        return 'bye'\n\n\
         [showing lines 8-9 of 11; use offset=10 to read more]"
    );
    assert_eq!(out.extras["blockStart"], 8);
    let class = fx.ok("read", json!({"path": "app.py", "anchor_line": 9, "levels": 2})).await;
    assert!(
        class.starts_with("[lines 3-9: the block around line 9]\n     3\t# A greeter."),
        "{class}"
    );
    let past = fx.err("read", json!({"path": "app.py", "anchor_line": 40})).await;
    assert!(
        past.contains("anchor_line 40 is past the end of `app.py`, which has 11 lines"),
        "{past}"
    );
    let both = fx.err("read", json!({"path": "app.py", "anchor_line": 2, "offset": 1})).await;
    assert!(both.contains("give `offset` or `anchor_line`, not both"), "{both}");
}

/// A `limit` as large as the number can be reads to the end (`offset + limit` overflowed:
/// a panic in a debug build, an empty page in a release one).
#[tokio::test]
async fn the_largest_limit_reads_to_the_end() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\nthree\n");
    let out = fx.ok("read", json!({"path": "a.txt", "offset": 2, "limit": u64::MAX})).await;
    assert_eq!(out, "     2\ttwo\n     3\tthree\n");
}

/// Waits until this process holds `count` open descriptors of `path`, for at most 10 s.
fn wait_for_opens(path: &std::path::Path, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let open = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
            .count();
        if open >= count {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    panic!("`{}` was not opened {count} times within 10 s", path.display());
}

/// A file that grows while `read` reads it (a log a running command writes) is read to the
/// length it had when opened: a writer faster than the reader kept it reading for as long
/// as the writer wrote. The file grows by holes, which cost no disk and outrun any reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_growing_while_read_is_read_to_its_length_when_opened() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fx = Fixture::new();
    // More than the first read takes, so that the holes are never sniffed as binary.
    let text: String = (1..=30_000).map(|i| format!("line {i}\n")).collect();
    let path = std::fs::canonicalize(fx.put("grow.log", &text)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (path, stop) = (path.clone(), stop.clone());
        move || {
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            // Grown once `read` has it open (the writer's own descriptor and the reader's).
            wait_for_opens(&path, 2);
            let original = file.metadata().unwrap().len();
            let mut len = original;
            while !stop.load(Ordering::Relaxed) && len < 1 << 40 {
                len += 64 << 20;
                file.set_len(len).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            // A reader still at it ends at its next read (the runtime waits for it).
            file.set_len(original).unwrap();
        }
    });
    let read = fx.call("read", json!({"path": "grow.log", "limit": 1}));
    let out = tokio::time::timeout(std::time::Duration::from_secs(20), read).await;
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    std::fs::remove_file(&path).unwrap();
    let out = out.expect("`read` was still reading the growing file after 20 s").unwrap();
    assert_eq!(out.extras["totalLines"], 30_000);
    assert!(out.to_text().starts_with("     1\tline 1\n"), "{}", out.to_text());
}

/// A file of `text` then a hole (sparse: no disk), `len` bytes in all.
fn sparse(fx: &Fixture, rel: &str, text: &str, len: u64) -> std::path::PathBuf {
    let path = fx.put(rel, text);
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len).unwrap();
    std::fs::canonicalize(path).unwrap()
}

/// A page of a file over 64 MiB is read without counting all its lines: they are counted
/// to the page or the first 64 MiB, and the footer says the count is partial, where the
/// count read all 2 GB of the file for its footer.
#[tokio::test]
async fn the_lines_of_a_huge_file_are_counted_in_part_and_said_so() {
    let fx = Fixture::new();
    let text: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
    sparse(&fx, "huge.log", &text, 2 << 30);
    let out = fx.call("read", json!({"path": "huge.log", "offset": 1990, "limit": 3})).await;
    let out = out.unwrap();
    expect![[r#"
          1990	line 1990
          1991	line 1991
          1992	line 1992

        [showing lines 1990-1992 of at least 3001 (counted in the first 64 MiB of the file's 2048 MiB, where the read stopped); use offset=1993 to read more]"#]]
    .assert_eq(&out.to_text());
    assert_eq!(out.extras["totalLinesPartial"], true);
    assert_eq!(out.extras["truncated"], true);
    // Not read whole, it was not hashed but fingerprinted: `write` may replace it.
    let write = json!({"path": "huge.log", "content": "short\n"});
    assert!(fx.ok("write", write).await.starts_with("overwrote `huge.log`"));
    // A small file's count is whole.
    fx.put("small.txt", &text);
    let out = fx.call("read", json!({"path": "small.txt", "offset": 1990, "limit": 3})).await;
    assert_eq!(out.unwrap().extras["totalLinesPartial"], false);
}

/// A page beyond what can be scanned before the call's time limit is refused before it,
/// saying how far the scan came, where the call was cut off by its timeout with nothing.
#[tokio::test]
async fn a_page_not_reached_before_the_call_deadline_is_refused_saying_how_far_it_came() {
    use toolmux_core::{CallContext, ToolProvider as _};
    let fx = Fixture::new();
    let text: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
    // A tebibyte of hole: no build scans it in the second the call has.
    sparse(&fx, "huge.log", &text, 1 << 40);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(1500);
    let ctx = CallContext::new().with_deadline(deadline);
    let args = json!({"path": "huge.log", "offset": 1_000_000});
    let err = fx.fs.call("read", args, &ctx).await.unwrap_err().report();
    assert!(
        err.starts_with(
            "invalid arguments for `fs__read`: at /: line 1000000 of `huge.log` was not \
             reached before the call's time limit: its first "
        ),
        "{err}"
    );
    assert!(err.contains(" MiB (of 1048576 MiB) hold 3000 lines; read an earlier"), "{err}");
}

/// Waits until this process holds no open descriptor of `path`, for at most 10 s.
fn wait_for_close(path: &std::path::Path) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let open = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(Result::ok)
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path));
        if !open {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

/// A read whose call is dropped (the pipeline's timeout drops it, no cancellation) stops
/// reading: it went on scanning the file on a blocking thread after the answer had gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_call_is_dropped_stops_reading() {
    let fx = Fixture::new();
    let text: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
    let path = sparse(&fx, "huge.log", &text, 1 << 40);
    let read = fx.call("read", json!({"path": "huge.log", "offset": 1_000_000}));
    let opened = tokio::task::spawn_blocking({
        let path = path.clone();
        move || wait_for_opens(&path, 1)
    });
    tokio::select! {
        out = read => panic!("the read of a tebibyte ended: {:?}", out.map(|o| o.to_text())),
        opened = opened => opened.unwrap(),
    }
    // The call's future is dropped here, with the read under way.
    let closed = tokio::task::spawn_blocking({
        let path = path.clone();
        move || wait_for_close(&path)
    })
    .await
    .unwrap();
    // A reader still at it ends at its next read once the file is short (the runtime
    // waits for it at the end of the test).
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
    assert!(closed, "the read still had the file open 10 s after its call was dropped");
}

/// Set in the child copy of the next test to the folder it works in.
const ONE_LINE_VAR: &str = "TOOLMUX_FS_TEST_ONE_LINE_DIR";

/// The peak resident memory of this process so far (`VmHWM`), in KiB.
pub(crate) fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A page whose first line is 300 MiB long (16 KiB of `x`, then a hole) shows the line's
/// first `lineChars` characters and its full length, and the line is never held whole:
/// the read raises the process's peak memory by less than 64 MiB. Measured in a child copy
/// of the test, so that the other tests' memory does not count.
#[test]
fn a_page_with_a_300_mib_line_holds_only_what_it_shows() {
    if let Some(dir) = std::env::var_os(ONE_LINE_VAR) {
        let dir = std::path::PathBuf::from(dir);
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
        let fx = Fixture::new();
        let path = sparse(&fx, "one.txt", &"x".repeat(16 * 1024), 300 << 20);
        {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
            file.write_all(b" end\nsecond line\n").unwrap();
        }
        let before = peak_kib();
        let out = runtime.block_on(fx.call("read", json!({"path": "one.txt"}))).unwrap();
        let grown = peak_kib().saturating_sub(before);
        std::fs::write(dir.join("grown"), grown.to_string()).unwrap();
        std::fs::write(dir.join("answer"), out.to_text()).unwrap();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "read::a_page_with_a_300_mib_line_holds_only_what_it_shows"])
        .env(ONE_LINE_VAR, dir.path())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "the child copy failed: {status}");
    let grown: u64 = std::fs::read_to_string(dir.path().join("grown")).unwrap().parse().unwrap();
    assert!(grown < 64 * 1024, "reading the page raised peak memory by {grown} KiB");
    let answer = std::fs::read_to_string(dir.path().join("answer")).unwrap();
    let line = format!(
        "     1\t{}[... {} more characters: read on with offset=1, limit=1, start_char=2000]\n",
        "x".repeat(2000),
        (300u64 << 20) + 4 - 2000
    );
    assert!(answer.starts_with(&line), "{}", &answer[..answer.len().min(3000)]);
    assert!(answer.contains("\n     2\tsecond line\n"), "{}", &answer[2000..]);
}
