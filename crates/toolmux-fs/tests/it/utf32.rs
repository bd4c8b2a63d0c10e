//! Files with a UTF-32 byte order mark (`FF FE 00 00`, `00 00 FE FF`) through every file
//! tool: read and searched decoded, edited and overwritten in their own encoding, never
//! taken for UTF-16 (whose little-endian mark starts the same) or for binary.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;
use toolmux_core::ToolProvider as _;

/// `text` as UTF-32 with its byte order mark.
fn utf32(text: &str, big_endian: bool) -> Vec<u8> {
    let mut bytes = if big_endian { vec![0, 0, 0xFE, 0xFF] } else { vec![0xFF, 0xFE, 0, 0] };
    for c in text.chars() {
        let code = u32::from(c);
        bytes.extend(if big_endian { code.to_be_bytes() } else { code.to_le_bytes() });
    }
    bytes
}

fn both() -> [(&'static str, bool); 2] {
    [("LE", false), ("BE", true)]
}

#[tokio::test]
async fn read_decodes_utf32() {
    let fx = Fixture::new();
    for (which, big_endian) in both() {
        let name = format!("{which}.txt");
        std::fs::write(
            fx.root().join(&name),
            utf32("caf\u{e9}\r\nsmile \u{1F600}\nend", big_endian),
        )
        .unwrap();
        let out = fx.call("read", json!({"path": name})).await.unwrap();
        assert_eq!(
            out.to_text(),
            format!(
                "     1\tcaf\u{e9}\n     2\tsmile \u{1F600}\n     3\tend\n\n[the file is UTF-32 \
                 {which}; `edit` and `write` keep it so]"
            )
        );
        assert_eq!(out.extras["encoding"], format!("UTF-32 {which}"));
        // The block around a line, too.
        std::fs::write(fx.root().join("code.txt"), utf32("fn a() {\n    x\n}\n", big_endian))
            .unwrap();
        let block = fx.ok("read", json!({"path": "code.txt", "anchor_line": 2})).await;
        assert!(
            block.starts_with("[lines 1-3: the block around line 2]\n     1\tfn a() {\n"),
            "{block}"
        );
    }
}

#[tokio::test]
async fn a_large_utf32_file_is_decoded_across_reads() {
    let fx = Fixture::new();
    // Over the 256 KiB read buffer with lines of odd lengths, so that some code unit is cut
    // between two reads.
    let text: String = (1..=20_000).map(|i| format!("{i} \u{1F600}\n")).collect();
    std::fs::write(fx.root().join("big.txt"), utf32(&text, false)).unwrap();
    let out = fx.call("read", json!({"path": "big.txt", "offset": 19_999})).await.unwrap();
    assert_eq!(out.extras["totalLines"], 20_000);
    assert!(
        out.to_text().starts_with(" 19999\t19999 \u{1F600}\n 20000\t20000 \u{1F600}\n"),
        "{}",
        out.to_text()
    );
}

#[tokio::test]
async fn invalid_utf32_is_refused() {
    let fx = Fixture::new();
    // A surrogate is no character; nor is anything past U+10FFFF.
    let mut bytes = utf32("ab", false);
    bytes.extend(0xD800u32.to_le_bytes());
    std::fs::write(fx.root().join("bad.txt"), &bytes).unwrap();
    expect!["`bad.txt` is not valid UTF-32: code unit 0xD800 at byte 12 is not a character (a surrogate, or past U+10FFFF): it cannot be shown as text; inspect it with `fs__bash` tools such as `file` or `xxd` if allowed"]
        .assert_eq(&fx.err("read", json!({"path": "bad.txt"})).await);
    let mut bytes = utf32("a", true);
    bytes.extend([0, 0]);
    std::fs::write(fx.root().join("short.txt"), &bytes).unwrap();
    expect!["`short.txt` is not valid UTF-32: it ends in the middle of a code unit (its length is not a multiple of 4 bytes): it cannot be shown as text; inspect it with `fs__bash` tools such as `file` or `xxd` if allowed"]
        .assert_eq(&fx.err("read", json!({"path": "short.txt"})).await);
    // `edit` refuses it too, and writes nothing.
    let before = std::fs::read(fx.root().join("bad.txt")).unwrap();
    expect!["`bad.txt` is not valid UTF-32: code unit 0xD800 at byte 12 is not a character (a surrogate, or past U+10FFFF): editing it as text would corrupt it; nothing was written"]
        .assert_eq(&fx.err("edit", json!({"path": "bad.txt", "old_string": "a", "new_string": "b"})).await);
    assert_eq!(std::fs::read(fx.root().join("bad.txt")).unwrap(), before);
}

#[tokio::test]
async fn grep_searches_utf32_decoded() {
    let fx = Fixture::new();
    for (which, big_endian) in both() {
        std::fs::write(
            fx.root().join(format!("{which}.txt")),
            utf32(&format!("first\r\nneedle {which} \u{e9}\r\nlast\r\n"), big_endian),
        )
        .unwrap();
        // Lines ending in a bare CR are told from the decoded text.
        std::fs::write(
            fx.root().join(format!("mac-{which}.txt")),
            utf32(&format!("first\rneedle mac {which}\rlast\r"), big_endian),
        )
        .unwrap();
    }
    expect![[r#"
        BE.txt:2:needle BE é
        LE.txt:2:needle LE é
        mac-BE.txt:2:needle mac BE
        mac-LE.txt:2:needle mac LE"#]]
    .assert_eq(
        &fx.ok("grep", json!({"pattern": "needle.*", "output_mode": "content", "-o": true})).await,
    );
    // Across lines.
    expect![[r#"
        BE.txt:2:needle BE é
        BE.txt:3:last
        LE.txt:2:needle LE é
        LE.txt:3:last"#]]
    .assert_eq(
        &fx.ok(
            "grep",
            json!({"pattern": "\u{e9}\\s+last", "multiline": true, "output_mode": "content"}),
        )
        .await,
    );
}

#[tokio::test]
async fn edit_keeps_utf32() {
    let fx = Fixture::new();
    for (which, big_endian) in both() {
        let name = format!("{which}.txt");
        std::fs::write(fx.root().join(&name), utf32("caf\u{e9}\r\nzwei\r\n", big_endian)).unwrap();
        fx.ok(
            "edit",
            json!({"path": name, "old_string": "zwei", "new_string": "drei\nvier \u{1F600}"}),
        )
        .await;
        assert_eq!(
            std::fs::read(fx.root().join(&name)).unwrap(),
            utf32("caf\u{e9}\r\ndrei\r\nvier \u{1F600}\r\n", big_endian),
            "{which}"
        );
    }
}

#[tokio::test]
async fn write_keeps_utf32() {
    let fx = Fixture::new();
    for (which, big_endian) in both() {
        let name = format!("{which}.txt");
        let path = fx.root().join(&name);
        std::fs::write(&path, utf32("eins\r\nzwei\r\n", big_endian)).unwrap();
        fx.ok("read", json!({"path": name})).await;
        let out = fx.ok("write", json!({"path": name, "content": "drei\n\u{e9}\n"})).await;
        assert_eq!(
            out,
            format!(
                "overwrote `{name}` (40 bytes, 2 lines; kept the file's CRLF line endings and \
                 UTF-32 {which} encoding; lines 1-2 changed)"
            )
        );
        assert_eq!(std::fs::read(&path).unwrap(), utf32("drei\r\n\u{e9}\r\n", big_endian));
    }
    // A person's overwrite, which needs no `read` first, keeps the encoding too.
    let path = fx.root().join("person.txt");
    std::fs::write(&path, utf32("old\n", false)).unwrap();
    let person = toolmux_core::CallContext::new().from_person();
    let out = fx.fs.call("write", json!({"path": "person.txt", "content": "new\n"}), &person);
    let out = out.await.unwrap().to_text();
    assert!(out.contains("kept the file's UTF-32 LE encoding"), "{out}");
    assert_eq!(std::fs::read(&path).unwrap(), utf32("new\n", false));
}

#[tokio::test]
async fn apply_patch_keeps_utf32() {
    let fx = Fixture::new();
    for (which, big_endian) in both() {
        let name = format!("{which}.txt");
        std::fs::write(fx.root().join(&name), utf32("one\ntwo\n", big_endian)).unwrap();
        let input =
            format!("*** Begin Patch\n*** Update File: {name}\n-two\n+2 \u{e9}\n*** End Patch");
        fx.ok("apply_patch", json!({"input": input})).await;
        assert_eq!(
            std::fs::read(fx.root().join(&name)).unwrap(),
            utf32("one\n2 \u{e9}\n", big_endian),
            "{which}"
        );
    }
    // Undo gives the bytes back.
    fx.ok("undo", json!({})).await;
    assert_eq!(std::fs::read(fx.root().join("BE.txt")).unwrap(), utf32("one\ntwo\n", true));
}
