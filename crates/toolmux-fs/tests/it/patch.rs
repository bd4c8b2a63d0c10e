//! `apply_patch`: Codex's patch format on real files, all or nothing.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;
use toolmux_core::{Subject, ToolProvider};

fn patch(body: &str) -> serde_json::Value {
    json!({"input": format!("*** Begin Patch\n{body}\n*** End Patch")})
}

#[tokio::test]
async fn adds_deletes_changes_and_moves_files_in_one_call() {
    let fx = Fixture::new();
    fx.put(
        "src/app.py",
        "class App:\n    def start(self):\n        return 1\n\n    def stop(self):\n        return 1\n",
    );
    fx.put("old.txt", "bye\n");
    fx.put("lib/util.py", "def helper():\n    pass\n");
    let out = fx
        .ok(
            "apply_patch",
            patch(
                "*** Add File: docs/new.md\n+# New\n+\n+text\n\
                 *** Delete File: old.txt\n\
                 *** Update File: src/app.py\n\
                 @@ class App:\n@@     def stop(self):\n-        return 1\n+        return 2\n\
                 *** Update File: lib/util.py\n*** Move to: lib/helpers.py\n def helper():\n-    pass\n+    return 42",
            ),
        )
        .await;
    assert!(out.starts_with("applied the patch to 4 files:"), "{out}");
    assert!(out.contains("A docs/new.md (+3)"), "{out}");
    assert!(out.contains("D old.txt"), "{out}");
    assert!(out.contains("M src/app.py (+1 -1)\n    @@ line 6: +1 -1"), "{out}");
    assert!(out.contains("R lib/util.py -> lib/helpers.py (+1 -1)"), "{out}");
    assert_eq!(fx.get("docs/new.md"), "# New\n\ntext\n");
    assert!(!fx.root().join("old.txt").exists());
    // The anchors picked the second `return 1`, not the first.
    assert_eq!(
        fx.get("src/app.py"),
        "class App:\n    def start(self):\n        return 1\n\n    def stop(self):\n        return 2\n"
    );
    assert!(!fx.root().join("lib/util.py").exists());
    assert_eq!(fx.get("lib/helpers.py"), "def helper():\n    return 42\n");
}

/// A moved file keeps its mode: a script stays executable under its new name.
/// A file deleted is not decoded: a binary file and one that is not valid text are deleted
/// (they were refused as binary or undecodable), and undo brings their bytes back. One
/// changed since it was read is still refused.
#[tokio::test]
async fn binary_and_undecodable_files_are_deleted() {
    let fx = Fixture::new();
    let binary = b"\x7fELF\0\0\x01\xff".to_vec();
    let invalid = b"caf\xe9\n".to_vec();
    std::fs::write(fx.root().join("blob.bin"), &binary).unwrap();
    std::fs::write(fx.root().join("latin1.txt"), &invalid).unwrap();
    let out =
        fx.ok("apply_patch", patch("*** Delete File: blob.bin\n*** Delete File: latin1.txt")).await;
    assert!(out.contains("D blob.bin") && out.contains("D latin1.txt"), "{out}");
    assert!(!fx.root().join("blob.bin").exists() && !fx.root().join("latin1.txt").exists());
    fx.ok("undo", json!({})).await;
    assert_eq!(std::fs::read(fx.root().join("blob.bin")).unwrap(), binary);
    assert_eq!(std::fs::read(fx.root().join("latin1.txt")).unwrap(), invalid);
    fx.err("read", json!({"path": "blob.bin"})).await;
    std::fs::write(fx.root().join("blob.bin"), b"\0changed").unwrap();
    let refused = fx.err("apply_patch", patch("*** Delete File: blob.bin")).await;
    assert!(refused.contains("has been modified since it was last read"), "{refused}");
    assert!(fx.root().join("blob.bin").exists());
}

/// A file over the edit limit is deleted, saying that undo cannot bring it back (its bytes
/// are not held), where it was refused as too large; one changed since it was read is
/// still refused.
#[tokio::test]
async fn a_file_over_the_edit_limit_is_deleted() {
    let fx = Fixture::new();
    let big = fx.put("big.log", &"line\n".repeat(3000));
    std::fs::OpenOptions::new().write(true).open(&big).unwrap().set_len(20 << 20).unwrap();
    fx.ok("read", json!({"path": "big.log", "limit": 1})).await;
    std::fs::OpenOptions::new().append(true).open(&big).unwrap().set_len(21 << 20).unwrap();
    let refused = fx.err("apply_patch", patch("*** Delete File: big.log")).await;
    assert!(refused.contains("has been modified since it was last read"), "{refused}");
    fx.ok("read", json!({"path": "big.log", "limit": 1})).await;
    let out = fx.ok("apply_patch", patch("*** Delete File: big.log")).await;
    expect!["D big.log (over 16 MiB, so its bytes were not kept: undo cannot bring it back)"]
        .assert_eq(out.lines().last().unwrap());
    assert!(!big.exists());
    let none = fx.err("undo", json!({})).await;
    assert!(none.contains("no change is kept for this run"), "{none}");
}

/// Two files over the edit limit deleted by one patch, or one deleted and added again
/// among other changes, are refused before anything is written: their bytes are not held,
/// so the first could not be put back were a later step to fail. Each alone is deleted.
#[tokio::test]
async fn files_over_the_edit_limit_are_deleted_one_per_patch() {
    let fx = Fixture::new();
    let big = |name: &str| {
        let path = fx.put(name, &"line\n".repeat(3000));
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(20 << 20).unwrap();
        path
    };
    let (one, two) = (big("one.log"), big("two.log"));
    fx.put("small.txt", "a\n");
    for path in ["one.log", "two.log", "small.txt"] {
        fx.ok("read", json!({"path": path, "limit": 1})).await;
    }
    let both =
        fx.err("apply_patch", patch("*** Delete File: one.log\n*** Delete File: two.log")).await;
    assert!(both.contains("two.log`: the file is over `fs.limits.editMaxBytes`"), "{both}");
    assert!(both.ends_with("delete it in a patch of its own; nothing was changed"), "{both}");
    let again = "*** Delete File: one.log\n*** Add File: one.log\n+new\n*** Delete File: small.txt";
    let again = fx.err("apply_patch", patch(again)).await;
    assert!(again.contains("one.log`: the file is over"), "{again}");
    assert!(one.exists() && two.exists() && fx.root().join("small.txt").exists());
    // One, with other changes written before it: deleted.
    let out =
        fx.ok("apply_patch", patch("*** Delete File: one.log\n*** Delete File: small.txt")).await;
    assert!(out.contains("D one.log (over 16 MiB"), "{out}");
    fx.ok("apply_patch", patch("*** Delete File: two.log")).await;
    assert!(!one.exists() && !two.exists());
}

#[tokio::test]
async fn a_moved_file_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new();
    fx.put("run.sh", "#!/bin/sh\necho one\n");
    let script = fx.root().join("run.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
    fx.ok(
        "apply_patch",
        patch("*** Update File: run.sh\n*** Move to: bin/run.sh\n #!/bin/sh\n-echo one\n+echo two"),
    )
    .await;
    let moved = std::fs::metadata(fx.root().join("bin/run.sh")).unwrap();
    assert_eq!(moved.permissions().mode() & 0o777, 0o750);
    assert_eq!(fx.get("bin/run.sh"), "#!/bin/sh\necho two\n");
}

#[tokio::test]
async fn a_hunk_that_does_not_apply_changes_nothing() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\n");
    fx.put("b.rs", "fn main() {\n    let total = compute(1, 2);\n}\n");
    let error = fx
        .err(
            "apply_patch",
            patch(
                "*** Add File: c.txt\n+new\n*** Update File: a.txt\n-one\n+ONE\n\
                 *** Delete File: a.txt\n*** Update File: b.rs\n@@\n-    let total = compute(1, 3);\n+    let total = 0;",
            ),
        )
        .await;
    assert!(error.contains("`b.rs`, hunk 1 (patch line 9): these lines were not found"), "{error}");
    assert!(error.contains("the closest line is 2: `let total = compute(1, 2);`"), "{error}");
    assert!(error.contains("nothing was changed"), "{error}");
    assert_eq!(fx.get("a.txt"), "one\ntwo\n");
    assert!(!fx.root().join("c.txt").exists());
}

/// Adding a file where a symbolic link leads nowhere says the link is broken (it said the
/// file already exists).
#[tokio::test]
async fn adding_over_a_broken_link_says_it_is_one() {
    let fx = Fixture::new();
    std::os::unix::fs::symlink("nowhere.txt", fx.root().join("dangling")).unwrap();
    let err = fx.call("apply_patch", patch("*** Add File: dangling\n+x")).await.unwrap_err();
    expect!["invalid arguments for `fs__apply_patch`: at /: `*** Add File: dangling`: `dangling` is a broken symbolic link (what it points to does not exist): delete the link first, or add the file under another name; nothing was changed"]
        .assert_eq(&err.report());
    assert_eq!(err.code(), "invalid_arguments");
    assert!(!fx.root().join("nowhere.txt").exists());
}

#[tokio::test]
async fn bad_patches_and_bad_operations_say_what_is_wrong() {
    let fx = Fixture::new();
    fx.put("a.txt", "a\n");
    let cases = [
        (
            json!({"input": "--- a/a.txt\n+++ b/a.txt\n"}),
            "line 1 of the patch: the patch must start with `*** Begin Patch`",
        ),
        (
            json!({"input": "*** Begin Patch\n*** Update File: a.txt\n-a\n+b\n"}),
            "must end with `*** End Patch`",
        ),
        (
            patch("*** Update File: a.txt\n@@\n a\n!b"),
            "line 5 of the patch: a hunk line starts with",
        ),
        (patch("*** Add File: a.txt\n+x"), "the file already exists"),
        (patch("*** Update File: missing.txt\n-a\n+b"), "there is no such file"),
        (
            patch("*** Delete File: a.txt\n*** Update File: a.txt\n-a\n+b"),
            "the patch removed it earlier",
        ),
        (
            patch("*** Add File: b.txt\n+b\n*** Update File: a.txt\n*** Move to: b.txt\n-a\n+c"),
            "something is already there",
        ),
        (
            patch("*** Update File: a.txt\n@@ fn nowhere()\n-a\n+b"),
            "the `@@ fn nowhere()` line was not found",
        ),
        (patch("*** Update File: ../outside.txt\n-a\n+b"), "outside"),
    ];
    for (args, wanted) in cases {
        let error = fx.err("apply_patch", args.clone()).await;
        assert!(error.contains(wanted), "{args}: wanted `{wanted}` in: {error}");
    }
    assert_eq!(fx.get("a.txt"), "a\n");
    assert!(!fx.root().join("b.txt").exists());
}

/// Context that occurs again further on is applied at its first place after the previous
/// hunk, as Codex does, and the summary says where else it fits (it said nothing).
#[tokio::test]
async fn context_that_fits_in_several_places_is_said() {
    let fx = Fixture::new();
    fx.put("twice.txt", "x\ny\nx\ny\n");
    let out = fx.ok("apply_patch", patch("*** Update File: twice.txt\n x\n-y\n+Y")).await;
    assert!(
        out.contains(
            "@@ line 1: +1 -1; its lines also match at line 3: if the change was meant there"
        ),
        "{out}"
    );
    assert_eq!(fx.get("twice.txt"), "x\nY\nx\ny\n");
    // Once the place is one, nothing is said.
    let out = fx.ok("apply_patch", patch("*** Update File: twice.txt\n x\n-Y\n+Z")).await;
    assert!(!out.contains("also match"), "{out}");
}

#[tokio::test]
async fn a_dry_run_writes_nothing() {
    let fx = Fixture::new();
    fx.put("a.txt", "a\n");
    let mut args = patch("*** Update File: a.txt\n-a\n+b\n*** Add File: n.txt\n+n");
    args["dry_run"] = json!(true);
    let out = fx.ok("apply_patch", args).await;
    assert!(out.starts_with("dry run: the patch applies; it would change 2 files"), "{out}");
    assert_eq!(fx.get("a.txt"), "a\n");
    assert!(!fx.root().join("n.txt").exists());
}

#[tokio::test]
async fn files_keep_their_encoding_and_line_endings() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("win.txt"), "\u{FEFF}one\r\ntwo\r\nthree").unwrap();
    let out = fx.ok("apply_patch", patch("*** Update File: win.txt\n one\n-two\n+2\n+2b")).await;
    assert!(out.contains("M win.txt (+2 -1)"), "{out}");
    let bytes = std::fs::read(fx.root().join("win.txt")).unwrap();
    assert_eq!(bytes, "\u{FEFF}one\r\n2\r\n2b\r\nthree".as_bytes());
}

#[tokio::test]
async fn cr_only_files_are_patched_as_lines_and_keep_cr() {
    let fx = Fixture::new();
    fx.put("mac.txt", "one\rtwo\rthree\r");
    let out = fx.ok("apply_patch", patch("*** Update File: mac.txt\n one\n-two\n+2\n+2b")).await;
    assert!(out.contains("M mac.txt (+2 -1)"), "{out}");
    assert_eq!(fx.get("mac.txt"), "one\r2\r2b\rthree\r");
}

#[tokio::test]
async fn context_found_loosely_is_reported_and_kept() {
    let fx = Fixture::new();
    fx.put("q.py", "print(“hello”)   \nx = 1\n");
    let out = fx
        .ok("apply_patch", patch("*** Update File: q.py\n print(\"hello\")\n-x = 1\n+x = 2"))
        .await;
    assert!(out.contains("matched reading the file's typographic quotes"), "{out}");
    assert_eq!(fx.get("q.py"), "print(“hello”)   \nx = 2\n");
}

/// Lines that replace lines found through typographic characters take the file's quotes
/// and dashes; lines added beside context found so keep the patch's (code beside prose).
#[tokio::test]
async fn lines_replacing_typographic_ones_take_their_style() {
    let fx = Fixture::new();
    fx.put("notes.md", "# Notes\nIt\u{2019}s \u{201C}done\u{201D} \u{2014} ship it.\n");
    let out = fx
        .ok(
            "apply_patch",
            patch("*** Update File: notes.md\n # Notes\n-It's \"done\" - ship it.\n+It's \"ready\" - ship it."),
        )
        .await;
    assert!(out.contains("typographic"), "{out}");
    assert_eq!(
        fx.get("notes.md"),
        "# Notes\nIt\u{2019}s \u{201C}ready\u{201D} \u{2014} ship it.\n"
    );
    fx.put("doc.py", "# \u{201C}quoted\u{201D}\nx = 1\n");
    fx.ok("apply_patch", patch("*** Update File: doc.py\n # \"quoted\"\n-x = 1\n+x = \"a\"")).await;
    assert_eq!(fx.get("doc.py"), "# \u{201C}quoted\u{201D}\nx = \"a\"\n");
}

#[tokio::test]
async fn a_file_changed_since_it_was_read_is_refused() {
    let fx = Fixture::new();
    fx.put("a.txt", "a\n");
    fx.call_in("run-1", "read", json!({"path": "a.txt"})).await.unwrap();
    fx.put("a.txt", "a\nchanged by someone else\n");
    let error = fx
        .call_in("run-1", "apply_patch", patch("*** Update File: a.txt\n-a\n+b"))
        .await
        .unwrap_err()
        .report();
    assert!(error.contains("has been modified since it was last read"), "{error}");
    assert_eq!(fx.get("a.txt"), "a\nchanged by someone else\n");
    // After the patch, the run's record is the new content: an edit right after passes.
    fx.call_in("run-1", "read", json!({"path": "a.txt"})).await.unwrap();
    fx.call_in("run-1", "apply_patch", patch("*** Update File: a.txt\n-a\n+b")).await.unwrap();
    fx.call_in(
        "run-1",
        "edit",
        json!({"path": "a.txt", "old_string": "b\nchanged", "new_string": "c\nchanged"}),
    )
    .await
    .unwrap();
    assert_eq!(fx.get("a.txt"), "c\nchanged by someone else\n");
}

#[tokio::test]
async fn protected_files_and_links_out_are_refused() {
    let fx = Fixture::new();
    fx.put(".git/config", "[core]\n");
    std::fs::write(fx.outside().join("secret.txt"), "x\n").unwrap();
    std::os::unix::fs::symlink("../secret.txt", fx.root().join("link.txt")).unwrap();
    let error = fx.err("apply_patch", patch("*** Update File: .git/config\n-[core]\n+[x]")).await;
    assert!(error.contains(".git"), "{error}");
    let error = fx.err("apply_patch", patch("*** Update File: link.txt\n-x\n+y")).await;
    assert!(error.contains("outside"), "{error}");
    assert_eq!(std::fs::read_to_string(fx.outside().join("secret.txt")).unwrap(), "x\n");
    assert_eq!(fx.get(".git/config"), "[core]\n");
}

/// A write that fails part way (a file added where the patch made a file of its parent)
/// is undone: the file already written is removed again.
#[tokio::test]
async fn a_write_failing_part_way_is_undone() {
    let fx = Fixture::new();
    fx.put("keep.txt", "keep\n");
    let error = fx
        .err(
            "apply_patch",
            patch("*** Add File: d\n+a file\n*** Add File: d/x.txt\n+under it\n*** Update File: keep.txt\n-keep\n+kept"),
        )
        .await;
    assert!(error.contains("were put back, so nothing was changed"), "{error}");
    assert!(!fx.root().join("d").exists(), "the first file written was not removed");
    assert_eq!(fx.get("keep.txt"), "keep\n");
}

#[test]
fn permission_rules_see_every_file_of_a_patch() {
    let fx = Fixture::new();
    std::fs::create_dir(fx.root().join("secrets")).unwrap();
    std::os::unix::fs::symlink("secrets", fx.root().join("innocent")).unwrap();
    let args = patch(
        "*** Add File: a.txt\n+a\n*** Update File: b.txt\n*** Move to: innocent/c.txt\n-b\n+c\n*** Delete File: d.txt",
    );
    let subjects = fx.fs.subjects("apply_patch", &args).unwrap();
    let paths = ["a.txt", "b.txt", "secrets/c.txt", "d.txt"].map(|p| Subject::Path(p.into()));
    assert_eq!(subjects, paths);
    let error = fx.fs.subjects("apply_patch", &json!({"input": "nonsense"})).unwrap_err();
    assert!(error.contains("`*** Begin Patch`"), "{error}");
}

/// A file the patch itself creates twice is said to be (it was "the file already exists",
/// of a file that did not).
#[tokio::test]
async fn a_file_added_twice_by_one_patch_is_said_to_be() {
    let fx = Fixture::new();
    let patch =
        "*** Begin Patch\n*** Add File: new.txt\n+x\n*** Add File: new.txt\n+y\n*** End Patch";
    expect!["`*** Add File: new.txt`: this patch already creates `new.txt` above: give each new file once; nothing was changed"]
        .assert_eq(&fx.err("apply_patch", json!({"input": patch})).await);
    assert!(!fx.root().join("new.txt").exists());
}

/// Files of bare-CR lines (classic Mac OS) and of mixed line endings: context is matched
/// line by line, lines the patch keeps keep their breaks, and added lines get the file's.
mod line_endings {
    use super::patch;
    use crate::Fixture;
    use serde_json::json;

    #[tokio::test]
    async fn a_cr_file_without_a_final_cr_is_patched_at_its_end() {
        let fx = Fixture::new();
        fx.put("mac.txt", "one\rtwo\rthree");
        fx.ok(
            "apply_patch",
            patch("*** Update File: mac.txt\n@@\n two\n-three\n+3\n*** End of File"),
        )
        .await;
        assert_eq!(fx.get("mac.txt"), "one\rtwo\r3");
        fx.ok("apply_patch", patch("*** Update File: mac.txt\n@@\n 3\n+four")).await;
        assert_eq!(fx.get("mac.txt"), "one\rtwo\r3\rfour");
    }

    /// Lines copied with the file's own CRs are its lines, as `edit` takes them.
    #[tokio::test]
    async fn crs_in_the_patch_lines_of_a_cr_file_break_lines() {
        let fx = Fixture::new();
        fx.put("mac.txt", "one\rtwo\rthree\rfour\r");
        let out = fx
            .ok(
                "apply_patch",
                patch("*** Update File: mac.txt\n one\rtwo\n-three\rfour\n+3\r4\r\n"),
            )
            .await;
        assert!(out.contains("M mac.txt (+2 -2)"), "{out}");
        assert_eq!(fx.get("mac.txt"), "one\rtwo\r3\r4\r");
    }

    /// A whole patch whose lines end in bare CRs, as a CR file's text copied whole.
    #[tokio::test]
    async fn a_patch_of_cr_lines_is_read_as_lines() {
        let fx = Fixture::new();
        fx.put("mac.txt", "one\rtwo\r");
        fx.ok(
            "apply_patch",
            json!({"input": "*** Begin Patch\r*** Update File: mac.txt\r one\r-two\r+2\r*** End Patch\r"}),
        )
        .await;
        assert_eq!(fx.get("mac.txt"), "one\r2\r");
    }

    #[tokio::test]
    async fn a_moved_cr_file_keeps_cr() {
        let fx = Fixture::new();
        fx.put("mac.txt", "one\rtwo\r");
        fx.ok("apply_patch", patch("*** Update File: mac.txt\n*** Move to: b.txt\n one\n+1.5"))
            .await;
        assert_eq!(fx.get("b.txt"), "one\r1.5\rtwo\r");
    }

    #[tokio::test]
    async fn a_utf16_cr_file_keeps_cr() {
        let fx = Fixture::new();
        let utf16 = |text: &str| {
            let mut bytes = vec![0xFF, 0xFE];
            text.encode_utf16().for_each(|u| bytes.extend(u.to_le_bytes()));
            bytes
        };
        std::fs::write(fx.root().join("w.txt"), utf16("one\rtwo\r")).unwrap();
        fx.ok("apply_patch", patch("*** Update File: w.txt\n-two\n+2")).await;
        assert_eq!(std::fs::read(fx.root().join("w.txt")).unwrap(), utf16("one\r2\r"));
    }

    /// Mixed CRLF and LF: lines kept keep their own break, added lines get the one most
    /// lines use.
    #[tokio::test]
    async fn mixed_endings_keep_each_kept_line_s_break() {
        let fx = Fixture::new();
        fx.put("m.txt", "a\r\nb\nc\r\nd\n e\r\n");
        fx.ok("apply_patch", patch("*** Update File: m.txt\n a\n b\n-c\n+C\n d")).await;
        assert_eq!(fx.get("m.txt"), "a\r\nb\nC\r\nd\n e\r\n");
        fx.ok("apply_patch", patch("*** Update File: m.txt\n C\n-d\n+D")).await;
        assert_eq!(fx.get("m.txt"), "a\r\nb\nC\r\nD\r\n e\r\n");
    }

    /// Where the file has an LF, a bare CR is text inside a line (the rule `read` and `grep`
    /// use): matched as such, and kept.
    #[tokio::test]
    async fn a_bare_cr_in_an_lf_file_is_text() {
        let fx = Fixture::new();
        fx.put("l.txt", "x\ry\nz\n");
        fx.ok("apply_patch", patch("*** Update File: l.txt\n x\ry\n-z\n+Z")).await;
        assert_eq!(fx.get("l.txt"), "x\ry\nZ\n");
        fx.ok("apply_patch", patch("*** Update File: l.txt\n-x\ry\n+x\rY")).await;
        assert_eq!(fx.get("l.txt"), "x\rY\nZ\n");
    }
}

/// A patch written with composed accents (NFC, as models write `é`) applies to a file
/// written decomposed (NFD, `e` and a combining accent, as macOS writes), and the reverse,
/// as `edit` matches them: context lines keep the file's bytes, added lines are written in
/// the file's form when all of it is in one, and the summary says so. The hunks were
/// refused as not found, the lines looking the same on both sides.
#[tokio::test]
async fn a_patch_matches_text_in_another_unicode_normalization_form() {
    let fx = Fixture::new();
    fx.put("menu.txt", "cafe\u{301} = 1\nnai\u{308}ve = 2\nend\n");
    let body = "*** Update File: menu.txt\n caf\u{e9} = 1\n-na\u{ef}ve = 2\n+na\u{ef}ve = 3\n\
                +cr\u{e8}me = 4\n end";
    let out = fx.ok("apply_patch", patch(body)).await;
    expect![[r#"
        applied the patch to 1 file:
        M menu.txt (+2 -1)
            @@ line 1: +2 -1, matched the file's decomposed accents (Unicode NFD) and wrote them so"#]]
    .assert_eq(&out);
    assert_eq!(fx.get("menu.txt"), "cafe\u{301} = 1\nnai\u{308}ve = 3\ncre\u{300}me = 4\nend\n");

    // NFC file, NFD patch, the place found by an `@@` line in the other form too.
    fx.put("nfc.py", "def caf\u{e9}():\n    return 1\n\ndef th\u{e9}():\n    return 1\n");
    let body =
        "*** Update File: nfc.py\n@@ def the\u{301}():\n-    return 1\n+    return 'the\u{301}'";
    let out = fx.ok("apply_patch", patch(body)).await;
    assert!(out.contains("matched the file's composed accents (Unicode NFC) and wrote them so"));
    assert_eq!(
        fx.get("nfc.py"),
        "def caf\u{e9}():\n    return 1\n\ndef th\u{e9}():\n    return 'th\u{e9}'\n"
    );

    // A file of both forms: the line's bytes go, the added line is written as given.
    fx.put("mixed.txt", "caf\u{e9}\nnai\u{308}ve\n");
    let out =
        fx.ok("apply_patch", patch("*** Update File: mixed.txt\n-na\u{ef}ve\n+na\u{ef}f")).await;
    assert!(
        out.contains("matched the file's accents written in another Unicode normalization form")
    );
    assert_eq!(fx.get("mixed.txt"), "caf\u{e9}\nna\u{ef}f\n");

    // Two places that differ in their bytes (ṩ composed, and decomposed), neither the
    // patch's (its marks in another order): which to change is not guessed.
    fx.put("two.txt", "\u{1e69}\ns\u{323}\u{307}\n");
    let err = fx.err("apply_patch", patch("*** Update File: two.txt\n-s\u{307}\u{323}\n+s")).await;
    assert!(err.contains("hunk 1 (patch line 3): these lines were not found"), "{err}");
    assert_eq!(fx.get("two.txt"), "\u{1e69}\ns\u{323}\u{307}\n");
}

/// A patch line never matches a file line that holds more accents than it (`cafe` is no
/// line `cafe` U+0301, which reads `café`): lines are compared whole, so a match never
/// stops before an accent as an edit's might have. The error names the line that differs
/// only in its accents, where it only offered the closest line.
#[tokio::test]
async fn a_patch_line_without_the_file_s_accents_is_not_found_and_the_error_says_why() {
    let fx = Fixture::new();
    fx.put("menu.txt", "tea = 0\ncafe\u{301} = 1\n");
    let err = fx.err("apply_patch", patch("*** Update File: menu.txt\n-cafe = 1\n+cafe = 2")).await;
    assert_eq!(
        err,
        "`menu.txt`, hunk 1 (patch line 3): these lines were not found:\ncafe = 1\n(line 2 is \
         `cafe\u{301} = 1`, which differs from the patch's `cafe = 1` only in its accents: a \
         line matches with its accents as the file has them, composed or not; copy it from \
         the file)\nnothing was changed"
    );
    assert_eq!(fx.get("menu.txt"), "tea = 0\ncafe\u{301} = 1\n");
}

/// A file without its owner's write bit is neither deleted nor moved by a patch, as it is
/// not rewritten: both went through (root's permission check passes an unlink) while an
/// update was refused. The refusal comes before anything is written.
#[tokio::test]
async fn a_read_only_file_is_not_deleted_or_moved() {
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new();
    for path in ["locked.txt", "fixed.txt"] {
        std::fs::set_permissions(fx.put(path, "keep\n"), std::fs::Permissions::from_mode(0o444))
            .unwrap();
        fx.ok("read", json!({"path": path})).await;
    }
    let delete = patch("*** Add File: first.txt\n+one\n*** Delete File: locked.txt");
    let moved = patch("*** Update File: fixed.txt\n*** Move to: moved.txt\n@@\n-keep\n+kept\n");
    for (input, path) in [(delete, "locked.txt"), (moved, "fixed.txt")] {
        let err = fx.call("apply_patch", input).await.unwrap_err();
        assert_eq!(err.code(), "remote", "{}", err.report());
        assert_eq!(
            err.report(),
            format!(
                "`{path}` is read-only (mode 0444); change its mode first (`chmod u+w`) if it \
                 is meant to be changed, then try again"
            )
        );
        assert_eq!(fx.get(path), "keep\n");
    }
    assert!(!fx.root().join("first.txt").exists());
    assert!(!fx.root().join("moved.txt").exists());
}
