//! `write`: creation, read-before-overwrite, staleness, permissions, atomicity.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use toolmux_core::{CallContext, ToolProvider};

#[tokio::test]
async fn creates_parent_directories() {
    let fx = Fixture::new();
    let out = fx.call("write", json!({"path": "a/b/c.txt", "content": "hi\n"})).await.unwrap();
    expect!["created `a/b/c.txt` (3 bytes, 1 line)"].assert_eq(&out.to_text());
    assert_eq!(out.extras["created"], true);
    assert_eq!(fx.get("a/b/c.txt"), "hi\n");
}

#[tokio::test]
async fn overwriting_an_unread_file_is_refused() {
    let fx = Fixture::new();
    fx.put("a.txt", "old");
    expect!["`a.txt` exists and has not been read in this run: read it first before writing to it"]
        .assert_eq(&fx.err("write", json!({"path": "a.txt", "content": "new"})).await);
    assert_eq!(fx.get("a.txt"), "old");
}

/// A person calling `write` directly (`toolmux tools call`) need not have read the file;
/// a call made on their behalf (an agent's, a child context) must, and a file read and
/// then changed by someone else is refused to both.
#[tokio::test]
async fn a_person_overwrites_without_reading_but_not_what_changed_since_a_read() {
    let fx = Fixture::new();
    fx.put("a.txt", "old");
    let person = CallContext::new().from_person();
    let args = json!({"path": "a.txt", "content": "new"});
    let refused = fx.fs.call("write", args.clone(), &person.child()).await.unwrap_err();
    assert!(refused.report().contains("has not been read in this run"), "{}", refused.report());
    fx.fs.call("write", args, &person).await.unwrap();
    assert_eq!(fx.get("a.txt"), "new");
    fx.fs.call("read", json!({"path": "a.txt"}), &person).await.unwrap();
    fx.put("a.txt", "changed by the user");
    let args = json!({"path": "a.txt", "content": "newer"});
    let stale = fx.fs.call("write", args, &person).await.unwrap_err();
    assert!(
        stale.report().contains("has been modified since it was last read"),
        "{}",
        stale.report()
    );
    assert_eq!(fx.get("a.txt"), "changed by the user");
}

#[tokio::test]
async fn overwriting_after_read_works_and_again_after_own_write() {
    let fx = Fixture::new();
    fx.put("a.txt", "old");
    fx.ok("read", json!({"path": "a.txt"})).await;
    let out = fx.ok("write", json!({"path": "a.txt", "content": "new"})).await;
    assert_eq!(out, "overwrote `a.txt` (3 bytes, 1 line; line 1 changed)");
    fx.ok("write", json!({"path": "a.txt", "content": "newer"})).await;
    assert_eq!(fx.get("a.txt"), "newer");
}

#[tokio::test]
async fn a_file_changed_since_read_is_refused() {
    let fx = Fixture::new();
    fx.put("a.txt", "old");
    fx.ok("read", json!({"path": "a.txt"})).await;
    fx.put("a.txt", "changed by someone");
    expect!["`a.txt` has been modified since it was last read (by the user, a formatter or another tool): read it again before writing to it"]
        .assert_eq(&fx.err("write", json!({"path": "a.txt", "content": "new"})).await);
    assert_eq!(fx.get("a.txt"), "changed by someone");
}

/// A file `read` refuses as binary or as text that does not decode may be replaced after
/// that read (it asked to be read first, which could never be done), and still not once
/// it changed since.
#[tokio::test]
async fn a_file_read_refused_as_binary_or_undecodable_may_be_replaced() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("blob.bin"), b"\x7fELF\0\0\x01").unwrap();
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend([0x00, 0xD8, b'a', 0x00]);
    std::fs::write(fx.root().join("broken.txt"), utf16).unwrap();
    for path in ["blob.bin", "broken.txt"] {
        let before = std::fs::read(fx.root().join(path)).unwrap();
        fx.err("read", json!({"path": path})).await;
        fx.ok("write", json!({"path": path, "content": "text now\n"})).await;
        assert_ne!(std::fs::read(fx.root().join(path)).unwrap(), before, "{path}");
    }
    assert_eq!(fx.get("blob.bin"), "text now\n");
    std::fs::write(fx.root().join("blob.bin"), b"\0binary").unwrap();
    fx.err("read", json!({"path": "blob.bin"})).await;
    std::fs::write(fx.root().join("blob.bin"), b"\0changed").unwrap();
    let refused = fx.err("write", json!({"path": "blob.bin", "content": "x"})).await;
    assert!(refused.contains("has been modified since it was last read"), "{refused}");
}

/// So may a file a read with `anchor_line` refuses (blocks of code are found in text only):
/// a binary file, an image, text that does not decode.
#[tokio::test]
async fn a_file_an_anchor_line_read_refuses_may_be_replaced() {
    let fx = Fixture::new();
    std::fs::write(fx.root().join("blob.bin"), b"\x7fELF\0\0\x01").unwrap();
    std::fs::write(fx.root().join("image.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
    std::fs::write(fx.root().join("broken.txt"), [0xFF, 0xFE, 0x00, 0xD8, b'a', 0x00]).unwrap();
    for path in ["blob.bin", "image.png", "broken.txt"] {
        let before = std::fs::read(fx.root().join(path)).unwrap();
        let refused = fx.err("read", json!({"path": path, "anchor_line": 1})).await;
        assert!(refused.contains(path), "{refused}");
        fx.ok("write", json!({"path": path, "content": "text now\n"})).await;
        assert_ne!(std::fs::read(fx.root().join(path)).unwrap(), before, "{path}");
    }
}

#[tokio::test]
async fn reads_count_per_run() {
    let fx = Fixture::new();
    fx.put("a.txt", "old");
    fx.call_in("run-1", "read", json!({"path": "a.txt"})).await.unwrap();
    assert!(fx.call_in("run-2", "write", json!({"path": "a.txt", "content": "x"})).await.is_err());
    fx.call_in("run-1", "write", json!({"path": "a.txt", "content": "x"})).await.unwrap();
}

#[tokio::test]
async fn keeps_permissions_and_leaves_no_temporary_files() {
    let fx = Fixture::new();
    let path = fx.put("run.sh", "#!/bin/sh\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o751)).unwrap();
    fx.ok("read", json!({"path": "run.sh"})).await;
    fx.ok("write", json!({"path": "run.sh", "content": "#!/bin/sh\necho hi\n"})).await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o751);
    let names: Vec<_> =
        std::fs::read_dir(fx.root()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["run.sh"]);
}

#[tokio::test]
async fn writing_a_directory_is_refused() {
    let fx = Fixture::new();
    fx.put("d/x", "");
    expect!["invalid arguments for `fs__write`: at /: `d` is a directory, not a file: use `fs__ls` to list it"]
        .assert_eq(&fx.err("write", json!({"path": "d", "content": "x"})).await);
}

#[tokio::test]
async fn writes_through_a_symlink_inside_the_root_land_on_its_target() {
    let fx = Fixture::new();
    fx.put("real.txt", "old");
    std::os::unix::fs::symlink("real.txt", fx.root().join("link.txt")).unwrap();
    fx.ok("read", json!({"path": "link.txt"})).await;
    fx.ok("write", json!({"path": "link.txt", "content": "new"})).await;
    assert_eq!(fx.get("real.txt"), "new");
    assert!(std::fs::symlink_metadata(fx.root().join("link.txt")).unwrap().is_symlink());
}

#[tokio::test]
async fn write_is_disabled_by_default() {
    let fx = Fixture::with(|c| c.with_permissions([toolmux_fs::Permission::Read]));
    expect![[r#"call to `fs__write` denied: tool `write` is disabled: add "write" to the fs `permissions` configuration key to enable it"#]]
        .assert_eq(&fx.err("write", json!({"path": "a", "content": "x"})).await);
    assert!(!fx.root().join("a").exists());
}

/// Text written over a binary file takes no line ending style from it: the CR LF of a
/// PNG's signature, and the CR bytes of its data, are no line endings.
#[tokio::test]
async fn text_over_a_binary_file_is_written_as_given() {
    let fx = Fixture::new();
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    png.extend([b'\r'; 64]);
    std::fs::write(fx.root().join("image.png"), &png).unwrap();
    std::fs::write(fx.root().join("blob.bin"), b"\0\r\r\r\r\r\r\r\r\r\r\r\r").unwrap();
    for path in ["image.png", "blob.bin"] {
        fx.err("read", json!({"path": path, "anchor_line": 1})).await;
        let out = fx.ok("write", json!({"path": path, "content": "text\nnow\n"})).await;
        assert!(!out.contains("kept the file's"), "{out}");
        assert_eq!(fx.get(path), "text\nnow\n");
    }
}

#[tokio::test]
async fn overwriting_a_cr_file_with_lf_content_keeps_cr() {
    let fx = Fixture::new();
    fx.put("a.txt", "old\rlines\r");
    fx.ok("read", json!({"path": "a.txt"})).await;
    let out = fx.ok("write", json!({"path": "a.txt", "content": "new\nlines\nhere\n"})).await;
    expect!["overwrote `a.txt` (15 bytes, 3 lines; kept the file's CR line endings; lines 1-2 replaced by 3 lines)"]
        .assert_eq(&out);
    assert_eq!(fx.get("a.txt"), "new\rlines\rhere\r");
}

#[tokio::test]
async fn overwriting_a_crlf_file_with_lf_content_keeps_crlf() {
    let fx = Fixture::new();
    fx.put("a.txt", "old\r\nlines\r\n");
    fx.ok("read", json!({"path": "a.txt"})).await;
    let out = fx.ok("write", json!({"path": "a.txt", "content": "new\nlines\nhere\n"})).await;
    expect!["overwrote `a.txt` (18 bytes, 3 lines; kept the file's CRLF line endings; lines 1-2 replaced by 3 lines)"]
        .assert_eq(&out);
    assert_eq!(fx.get("a.txt"), "new\r\nlines\r\nhere\r\n");
    // Content with CRLF of its own is written as given, and so is an LF file.
    fx.ok("write", json!({"path": "a.txt", "content": "x\r\ny\nz"})).await;
    assert_eq!(fx.get("a.txt"), "x\r\ny\nz");
    fx.put("lf.txt", "a\nb\n");
    fx.ok("read", json!({"path": "lf.txt"})).await;
    assert_eq!(
        fx.ok("write", json!({"path": "lf.txt", "content": "c\nd\n"})).await,
        "overwrote `lf.txt` (4 bytes, 2 lines; lines 1-2 changed)"
    );
    assert_eq!(fx.get("lf.txt"), "c\nd\n");
}

#[tokio::test]
async fn overwriting_a_bom_file_keeps_the_bom() {
    let fx = Fixture::new();
    let path = fx.root().join("bom.txt");
    std::fs::write(&path, b"\xEF\xBB\xBFold\n").unwrap();
    fx.ok("read", json!({"path": "bom.txt"})).await;
    let out = fx.ok("write", json!({"path": "bom.txt", "content": "new\n"})).await;
    assert_eq!(
        out,
        "overwrote `bom.txt` (7 bytes, 1 line; kept the file's UTF-8 byte order mark; line 1 changed)"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"\xEF\xBB\xBFnew\n");
    // A mark in the content is not doubled.
    fx.ok("write", json!({"path": "bom.txt", "content": "\u{FEFF}again"})).await;
    assert_eq!(std::fs::read(&path).unwrap(), b"\xEF\xBB\xBFagain");
}

#[tokio::test]
async fn overwriting_a_utf16_crlf_file_keeps_both() {
    let fx = Fixture::new();
    let utf16be = |text: &str| -> Vec<u8> {
        let mut bytes = vec![0xFE, 0xFF];
        text.encode_utf16().for_each(|u| bytes.extend(u.to_be_bytes()));
        bytes
    };
    let path = fx.root().join("w.txt");
    std::fs::write(&path, utf16be("eins\r\nzwei\r\n")).unwrap();
    fx.ok("read", json!({"path": "w.txt"})).await;
    let out = fx.ok("write", json!({"path": "w.txt", "content": "drei\n\u{e9}\n"})).await;
    assert_eq!(
        out,
        "overwrote `w.txt` (20 bytes, 2 lines; kept the file's CRLF line endings and UTF-16 BE encoding; lines 1-2 changed)"
    );
    assert_eq!(std::fs::read(&path).unwrap(), utf16be("drei\r\n\u{e9}\r\n"));
}

#[tokio::test]
async fn new_files_are_written_as_given() {
    let fx = Fixture::new();
    fx.ok("write", json!({"path": "crlf.txt", "content": "a\r\nb\n"})).await;
    assert_eq!(fx.get("crlf.txt"), "a\r\nb\n");
    fx.ok("write", json!({"path": "bom.txt", "content": "\u{FEFF}x"})).await;
    assert_eq!(std::fs::read(fx.root().join("bom.txt")).unwrap(), b"\xEF\xBB\xBFx");
}

/// An overwrite says which lines it changed (from the first that differs to the last), so
/// that a model sees when it rewrote more than it meant to.
#[tokio::test]
async fn an_overwrite_says_which_lines_changed() {
    let fx = Fixture::new();
    let cases = [
        (
            "a\nb\nc\n",
            "a\nB\nc\n",
            "line 2 changed",
            json!({"first_line": 2, "removed": 1, "added": 1}),
        ),
        (
            "a\nb\nc\n",
            "a\nb\nx\ny\nc\n",
            "2 lines added at line 3",
            json!({"first_line": 3, "removed": 0, "added": 2}),
        ),
        (
            "a\nb\nc\nd\n",
            "a\nd\n",
            "lines 2-3 removed",
            json!({"first_line": 2, "removed": 2, "added": 0}),
        ),
        (
            "a\nb\nc\n",
            "a\nX\n",
            "lines 2-3 replaced by 1 line",
            json!({"first_line": 2, "removed": 2, "added": 1}),
        ),
        (
            "same\n",
            "same\n",
            "the content was the same",
            json!({"first_line": 2, "removed": 0, "added": 0}),
        ),
    ];
    for (before, after, said, changed) in cases {
        fx.put("f.txt", before);
        fx.ok("read", json!({"path": "f.txt"})).await;
        let out = fx.call("write", json!({"path": "f.txt", "content": after})).await.unwrap();
        assert!(out.to_text().ends_with(&format!("; {said})")), "{}", out.to_text());
        assert_eq!(out.extras["changed"], changed, "{said}");
        assert_eq!(fx.get("f.txt"), after);
    }
    // A new file has nothing to compare with.
    let out = fx.call("write", json!({"path": "new.txt", "content": "n\n"})).await.unwrap();
    assert!(out.extras.get("changed").is_none(), "{:?}", out.extras);
}

/// A path ending in `/` names a folder: nothing is written (a file `newdir` was made), and
/// the root and `sub/..`, folders too, are said to be ones ("no file or directory at `.`").
#[tokio::test]
async fn a_path_naming_a_folder_is_refused() {
    let fx = Fixture::new();
    fx.put("sub/a.txt", "a\n");
    for tool in [
        json!({"tool": "write", "args": {"path": "newdir/", "content": "x"}}),
        json!({"tool": "edit", "args": {"path": "newdir/", "old_string": "", "new_string": "x"}}),
    ] {
        let name = tool["tool"].as_str().unwrap();
        let err = fx.err(name, tool["args"].clone()).await;
        assert_eq!(
            err,
            format!(
                "invalid arguments for `fs__{name}`: at /: `newdir/` names a folder (it ends \
                 with `/`): give the path of a file"
            ),
        );
        assert!(!fx.root().join("newdir").exists(), "{tool}");
    }
    for path in [".", "sub/..", "sub/"] {
        let err = fx.err("write", json!({"path": path, "content": "x"})).await;
        assert!(err.contains("is a directory, not a file"), "{path}: {err}");
    }
}

/// An empty path is said to be one, by every tool that needs a file (it named the root
/// and was answered "`` is a directory").
#[tokio::test]
async fn an_empty_path_is_said_to_be_empty() {
    let fx = Fixture::new();
    for (tool, args) in [
        ("read", json!({"path": ""})),
        ("read", json!({"path": "", "anchor_line": 1})),
        ("write", json!({"path": "", "content": "x"})),
        ("edit", json!({"path": "", "old_string": "", "new_string": "x"})),
        ("multi_edit", json!({"path": "", "edits": [{"old_string": "a", "new_string": "b"}]})),
    ] {
        let err = fx.err(tool, args).await;
        assert_eq!(
            err,
            format!(
                "invalid arguments for `fs__{tool}`: at /: `path` is empty: give the path of a \
                 file, relative to the workspace root or absolute inside it"
            ),
        );
    }
    let err = fx.err("undo", json!({"path": ""})).await;
    assert!(err.contains("`path` is empty: give the path of a file, or leave `path` out"), "{err}");
}

/// A path through a file as if it were a folder names that file (it said that nothing was
/// at the path), whichever tool is given it.
#[tokio::test]
async fn a_path_through_a_file_names_the_file() {
    let fx = Fixture::new();
    fx.put("nn.txt", "n\n");
    let wanted = "`nn.txt` is a file, not a folder: `nn.txt/b` cannot be inside it";
    for (tool, args) in [
        ("write", json!({"path": "nn.txt/b", "content": "x"})),
        ("edit", json!({"path": "nn.txt/b", "old_string": "", "new_string": "x"})),
        ("read", json!({"path": "nn.txt/b"})),
        (
            "apply_patch",
            json!({"input": "*** Begin Patch\n*** Add File: nn.txt/b\n+x\n*** End Patch"}),
        ),
    ] {
        // The caller's mistake, not a failure of the tool.
        let err = fx.call(tool, args).await.unwrap_err();
        assert_eq!(err.code(), "invalid_arguments", "{tool}");
        let err = err.report();
        assert!(err.ends_with(wanted), "{tool}: {err}");
    }
    let abs = fx.root().join("nn.txt/c/d");
    let err = fx.err("write", json!({"path": abs.to_str().unwrap(), "content": "x"})).await;
    let file = fx.root().join("nn.txt");
    assert!(err.contains(&format!("`{}` is a file, not a folder", file.display())), "{err}");
    assert_eq!(fx.get("nn.txt"), "n\n");
}

/// A sparse file of `text` then a hole, `len` bytes in all, last modified an hour ago
/// (a generated file from an earlier build).
fn sparse_generated(fx: &Fixture, rel: &str, text: &str, len: u64) -> std::path::PathBuf {
    let path = fx.put(rel, text);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len).unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    file.set_modified(hour_ago).unwrap();
    path
}

/// A file over 64 MiB that `read` showed a page of (without hashing it whole) may be
/// overwritten by `write`, as it could before `read` stopped hashing such files: `read`
/// records its fingerprint (size, times, inode, first and last MiB), which `write` checks.
#[tokio::test]
async fn a_huge_file_read_in_part_may_be_overwritten() {
    let fx = Fixture::new();
    let text: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
    sparse_generated(&fx, "huge.gen", &text, 2 << 30);
    let page = fx.ok("read", json!({"path": "huge.gen", "offset": 10, "limit": 2})).await;
    assert!(page.starts_with("    10\tline 10\n    11\tline 11\n"), "{page}");
    let out = fx.ok("write", json!({"path": "huge.gen", "content": "regenerated\n"})).await;
    expect!["overwrote `huge.gen` (12 bytes, 1 line; its old content, over `fs.editMaxBytes` (16777216 bytes), is not kept: `undo` cannot bring it back)"]
        .assert_eq(&out);
    assert_eq!(fx.get("huge.gen"), "regenerated\n");
}

/// The fingerprint of a huge file sees a change far from its ends: one byte written in
/// the middle of the hole after the read makes `write` refuse, as a changed content hash
/// does for a small file.
#[tokio::test]
async fn a_huge_file_changed_in_the_middle_since_read_is_refused() {
    use std::os::unix::fs::FileExt as _;
    let fx = Fixture::new();
    let text: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
    let path = sparse_generated(&fx, "huge.gen", &text, 2 << 30);
    fx.ok("read", json!({"path": "huge.gen", "limit": 1})).await;
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(b"x", 1 << 30).unwrap();
    drop(file);
    expect!["`huge.gen` has been modified since it was last read (by the user, a formatter or another tool): read it again before writing to it"]
        .assert_eq(&fx.err("write", json!({"path": "huge.gen", "content": "new\n"})).await);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 << 30);
    // Read again, it may be overwritten.
    fx.ok("read", json!({"path": "huge.gen", "limit": 1})).await;
    fx.ok("write", json!({"path": "huge.gen", "content": "new\n"})).await;
    assert_eq!(fx.get("huge.gen"), "new\n");
}

/// Writes into a folder swapped between a symlink to a folder inside and one to a folder
/// outside, in a loop: each is written inside, refused as outside, or said to have met a
/// path that changed while it was written, never a bare "File exists". Whether a write
/// meets the moment the folder's creation finds the symlink to outside is up to the race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_racing_a_symlink_swap_says_the_path_changed() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fx = Fixture::new();
    let outside = fx.outside().join("elsewhere");
    std::fs::create_dir(&outside).unwrap();
    std::fs::create_dir(fx.root().join("inside")).unwrap();
    std::os::unix::fs::symlink("inside", fx.root().join("sub")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = std::thread::spawn({
        let (stop, root, outside) = (stop.clone(), fx.root(), outside.clone());
        move || {
            while !stop.load(Ordering::Relaxed) {
                for target in [Path::new("inside"), outside.as_path()] {
                    let _ = std::fs::remove_file(root.join("next"));
                    std::os::unix::fs::symlink(target, root.join("next")).unwrap();
                    std::fs::rename(root.join("next"), root.join("sub")).unwrap();
                }
            }
        }
    });
    let started = std::time::Instant::now();
    let (mut changed, mut others) = (0, Vec::new());
    for i in 0.. {
        if started.elapsed() > std::time::Duration::from_secs(4) || changed > 0 && i > 500 {
            break;
        }
        let args = json!({"path": format!("sub/race{i}.txt"), "content": "x"});
        match fx.call("write", args).await {
            Ok(_) => {}
            Err(e) if e.report().contains("is outside the workspace root") => {}
            Err(e) if e.report().contains("changed while it was being written") => changed += 1,
            Err(e) => others.push(e.report()),
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(others.is_empty(), "{} other errors, such as {}", others.len(), others[0]);
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "written outside");
}

/// Writes into a new folder of a folder swapped between a symlink to a folder inside and one
/// to `.git`, in a loop: whichever a write meets, no folder is made inside `.git`. The
/// folders were made following the symlink after the path was checked, and only the file
/// was refused there, leaving the empty folder. Whether a write meets the swap between its
/// check and the folder's creation is up to the race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_racing_a_symlink_swap_makes_no_folder_where_writing_is_refused() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fx = Fixture::new();
    std::fs::create_dir(fx.root().join(".git")).unwrap();
    std::fs::create_dir(fx.root().join("inside")).unwrap();
    std::os::unix::fs::symlink("inside", fx.root().join("sub")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = std::thread::spawn({
        let (stop, root) = (stop.clone(), fx.root());
        move || {
            while !stop.load(Ordering::Relaxed) {
                for target in ["inside", ".git"] {
                    let _ = std::fs::remove_file(root.join("next"));
                    std::os::unix::fs::symlink(target, root.join("next")).unwrap();
                    std::fs::rename(root.join("next"), root.join("sub")).unwrap();
                }
            }
        }
    });
    let started = std::time::Instant::now();
    let mut others = Vec::new();
    for i in 0.. {
        if started.elapsed() > std::time::Duration::from_secs(3) {
            break;
        }
        let args = json!({"path": format!("sub/new{i}/deeper/x.txt"), "content": "x"});
        match fx.call("write", args).await {
            Ok(_) => {}
            Err(e) if e.report().contains("`.git`") => {}
            Err(e) if e.report().contains("changed while it was being written") => {}
            Err(e) => others.push(e.report()),
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(others.is_empty(), "{} other errors, such as {}", others.len(), others[0]);
    let made: Vec<_> = std::fs::read_dir(fx.root().join(".git")).unwrap().flatten().collect();
    assert!(made.is_empty(), "{} folders made in .git, such as {:?}", made.len(), made[0].path());
}

/// A file without its owner's write bit (0444) is not replaced, by `write` or `edit`, even
/// when toolmux runs as root (whose permission check passes it, as these tests run): the
/// temporary file and rename went round the mode silently.
#[tokio::test]
async fn a_read_only_file_is_not_replaced() {
    let fx = Fixture::new();
    let path = fx.put("locked.txt", "keep\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    fx.ok("read", json!({"path": "locked.txt"})).await;
    let write = fx.call("write", json!({"path": "locked.txt", "content": "new\n"})).await;
    let edit = json!({"path": "locked.txt", "old_string": "keep", "new_string": "gone"});
    let edit = fx.call("edit", edit).await;
    for result in [write, edit] {
        let err = result.unwrap_err();
        // A plain tool error: the arguments are right, the file is read-only.
        assert_eq!(err.code(), "remote", "{}", err.report());
        assert_eq!(
            err.report(),
            "`locked.txt` is read-only (mode 0444); change its mode first (`chmod u+w`) if it \
             is meant to be changed, then try again"
        );
    }
    assert_eq!(fx.get("locked.txt"), "keep\n");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o444);
    // Its owner's write bit back, it is written as before.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    fx.ok("write", json!({"path": "locked.txt", "content": "new\n"})).await;
    assert_eq!(fx.get("locked.txt"), "new\n");
}

/// A rewritten set-user-id or set-group-id file loses those bits, as when an unprivileged
/// process writes it, and the result says so; the rest of the mode stays. Set-group-id
/// without group execute (a locking mark, not a privilege) is kept, as the kernel keeps it.
#[tokio::test]
async fn rewriting_a_set_id_file_clears_the_bits_and_says_so() {
    let fx = Fixture::new();
    let mode =
        |rel: &str| std::fs::metadata(fx.root().join(rel)).unwrap().permissions().mode() & 0o7777;
    for (name, bits) in [("suid.sh", 0o4751), ("sgid.sh", 0o2755), ("lock.txt", 0o2644)] {
        let path = fx.put(name, "echo hi\n");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(bits)).unwrap();
    }
    let edit = json!({"path": "suid.sh", "old_string": "hi", "new_string": "bye"});
    expect!["made 1 replacement in `suid.sh`; its set-user-id bit was cleared (mode 4751 is now 0751), as the system clears them when a file is written: set them again with `chmod` if the new content is to run so"]
        .assert_eq(fx.ok("edit", edit).await.lines().next().unwrap());
    assert_eq!(mode("suid.sh"), 0o751);
    fx.ok("read", json!({"path": "sgid.sh"})).await;
    let out = fx.ok("write", json!({"path": "sgid.sh", "content": "echo bye\n"})).await;
    assert!(out.contains("its set-group-id bit was cleared (mode 2755 is now 0755)"), "{out}");
    assert_eq!(mode("sgid.sh"), 0o755);
    // apply_patch says it too, after the list of files.
    std::fs::set_permissions(fx.root().join("suid.sh"), std::fs::Permissions::from_mode(0o4755))
        .unwrap();
    let patch = "*** Begin Patch\n*** Update File: suid.sh\n-echo bye\n+echo again\n*** End Patch";
    let out = fx.ok("apply_patch", json!({"input": patch})).await;
    assert!(
        out.ends_with("\n[`suid.sh`: its set-user-id bit was cleared (mode 4755 is now 0755), as the system clears them when a file is written: set them again with `chmod` if the new content is to run so]"),
        "{out}"
    );
    assert_eq!(mode("suid.sh"), 0o755);
    fx.ok("read", json!({"path": "lock.txt"})).await;
    let out = fx.ok("write", json!({"path": "lock.txt", "content": "x\n"})).await;
    assert!(!out.contains("cleared"), "{out}");
    assert_eq!(mode("lock.txt"), 0o2644);
}

/// A file whose name is near the system's limit of 255 bytes is written, edited and patched
/// like any other: the temporary file beside it once repeated the whole name, which took it
/// past the limit, and each change failed with "File name too long". A name of multi-byte
/// characters is cut on a character boundary.
#[tokio::test]
async fn a_file_with_a_long_name_is_written_and_edited() {
    let fx = Fixture::new();
    for name in ["n".repeat(250), format!("{}.txt", "é".repeat(125))] {
        fx.put(&name, "one\n");
        fx.ok("read", json!({"path": name})).await;
        fx.ok("write", json!({"path": name, "content": "two\n"})).await;
        let edit = json!({"path": name, "old_string": "two", "new_string": "three"});
        fx.ok("edit", edit).await;
        let patch =
            format!("*** Begin Patch\n*** Update File: {name}\n-three\n+four\n*** End Patch");
        fx.ok("apply_patch", json!({"input": patch})).await;
        assert_eq!(fx.get(&name), "four\n");
    }
    let names: Vec<_> =
        std::fs::read_dir(fx.root()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "no temporary file is left: {names:?}");
}
