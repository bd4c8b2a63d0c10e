//! `undo`: the last change of a run (every file of it), or the last change to one file,
//! taken back; refused, changing nothing, when a file changed since.

use crate::Fixture;
use serde_json::json;

#[tokio::test]
async fn edits_and_writes_are_undone_last_first() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\n");
    fx.ok("read", json!({"path": "a.txt"})).await;
    fx.ok("edit", json!({"path": "a.txt", "old_string": "one", "new_string": "ONE"})).await;
    fx.ok("edit", json!({"path": "a.txt", "old_string": "two", "new_string": "TWO"})).await;
    fx.ok("write", json!({"path": "new.txt", "content": "fresh\n"})).await;

    let out = fx.ok("undo", json!({})).await;
    assert!(
        out.contains("undid the `write` of 1 file")
            && out.contains("`new.txt`: created by it, it is removed"),
        "{out}"
    );
    assert!(!fx.root().join("new.txt").exists());
    let out = fx.ok("undo", json!({})).await;
    assert!(
        out.contains("undid the `edit`")
            && out.contains("its content from before is back (2 lines)"),
        "{out}"
    );
    assert_eq!(fx.get("a.txt"), "ONE\ntwo\n");
    fx.ok("undo", json!({})).await;
    assert_eq!(fx.get("a.txt"), "one\ntwo\n");
    let none = fx.err("undo", json!({})).await;
    assert!(none.contains("no change is kept for this run"), "{none}");
    // What undo put back may be edited at once: it counts as read.
    fx.ok("edit", json!({"path": "a.txt", "old_string": "one", "new_string": "uno"})).await;
}

/// A whole patch is undone at once: changed files get their content back, added ones go,
/// deleted and moved ones come back; with `path`, one file of it only.
#[tokio::test]
async fn a_patch_is_undone_whole_or_file_by_file() {
    let fx = Fixture::new();
    fx.put("keep.txt", "a\nb\n");
    fx.put("gone.txt", "bye\n");
    fx.put("old/name.txt", "moving\n");
    for path in ["keep.txt", "gone.txt", "old/name.txt"] {
        fx.ok("read", json!({"path": path})).await;
    }
    let patch = "*** Begin Patch\n*** Update File: keep.txt\n@@\n-a\n+A\n b\n*** Add File: added.txt\n+new\n*** Delete File: gone.txt\n*** Update File: old/name.txt\n*** Move to: new/name.txt\n@@\n-moving\n+moved\n*** End Patch";
    fx.ok("apply_patch", json!({"input": patch})).await;
    assert_eq!(fx.get("keep.txt"), "A\nb\n");

    // One file of it first.
    let out = fx.ok("undo", json!({"path": "keep.txt"})).await;
    assert!(out.contains("undid the `apply_patch` of 1 file"), "{out}");
    assert_eq!(fx.get("keep.txt"), "a\nb\n");
    assert!(fx.root().join("added.txt").exists());
    // Then the rest of it.
    let out = fx.ok("undo", json!({})).await;
    assert!(out.contains("undid the `apply_patch` of 4 files"), "{out}");
    assert!(!fx.root().join("added.txt").exists());
    assert_eq!(fx.get("gone.txt"), "bye\n");
    assert_eq!(fx.get("old/name.txt"), "moving\n");
    assert!(!fx.root().join("new/name.txt").exists());
}

/// Files a patch deleted or moved come back with their permissions (an executable script
/// stays executable; they came back 0644).
#[tokio::test]
async fn undone_deletions_and_moves_keep_the_files_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new();
    let mode =
        |rel: &str| std::fs::metadata(fx.root().join(rel)).unwrap().permissions().mode() & 0o7777;
    for (path, bits) in [("run.sh", 0o750), ("secret.txt", 0o600)] {
        std::fs::set_permissions(fx.put(path, "x\n"), std::fs::Permissions::from_mode(bits))
            .unwrap();
        fx.ok("read", json!({"path": path})).await;
    }
    let patch = "*** Begin Patch\n*** Update File: run.sh\n*** Move to: bin/run.sh\n@@\n-x\n+y\n*** Delete File: secret.txt\n*** End Patch";
    fx.ok("apply_patch", json!({"input": patch})).await;
    assert_eq!(mode("bin/run.sh"), 0o750);
    fx.ok("undo", json!({})).await;
    assert_eq!((mode("run.sh"), mode("secret.txt")), (0o750, 0o600));
}

/// Overwriting a file too large to keep says that `undo` cannot bring it back.
#[tokio::test]
async fn an_overwrite_that_cannot_be_undone_says_so() {
    let fx = Fixture::with(|mut c| {
        c.limits.edit_max_bytes = 10;
        c
    });
    fx.put("big.txt", "more than ten bytes\n");
    fx.ok("read", json!({"path": "big.txt"})).await;
    let out = fx.ok("write", json!({"path": "big.txt", "content": "small\n"})).await;
    assert!(out.contains("is not kept: `undo` cannot bring it back"), "{out}");
    let small = fx.ok("write", json!({"path": "big.txt", "content": "tiny\n"})).await;
    assert!(!small.contains("not kept"), "{small}");
}

/// A file changed since the change (here by hand) is not overwritten: nothing is undone,
/// the model is told to read it, and the change stays undoable once the file is back.
#[tokio::test]
async fn a_file_changed_since_is_left_alone() {
    let fx = Fixture::new();
    fx.put("a.txt", "x\n");
    fx.put("b.txt", "y\n");
    fx.ok("read", json!({"path": "a.txt"})).await;
    fx.ok("read", json!({"path": "b.txt"})).await;
    let patch = "*** Begin Patch\n*** Update File: a.txt\n@@\n-x\n+X\n*** Update File: b.txt\n@@\n-y\n+Y\n*** End Patch";
    fx.ok("apply_patch", json!({"input": patch})).await;
    fx.put("b.txt", "Y, and more by hand\n");
    let refused = fx.err("undo", json!({})).await;
    assert!(
        refused.contains("`b.txt` changed since the `apply_patch` being undone")
            && refused.contains("nothing was undone: read it and edit it instead"),
        "{refused}"
    );
    assert_eq!(fx.get("a.txt"), "X\n", "nothing was undone");
    fx.put("b.txt", "Y\n");
    fx.ok("undo", json!({})).await;
    assert_eq!((fx.get("a.txt"), fx.get("b.txt")), ("x\n".to_owned(), "y\n".to_owned()));
}

/// A refused undo of one file leaves the record as it was: the change stays in its place
/// (it went last, so a plain `undo` took it again and was refused naming it, rather than
/// undo the change after it) and the file goes back into its change.
#[tokio::test]
async fn a_refused_undo_of_one_file_keeps_the_changes_in_order() {
    let fx = Fixture::new();
    fx.put("a.txt", "x\n");
    fx.put("c.txt", "z\n");
    fx.ok("read", json!({"path": "a.txt"})).await;
    fx.ok("read", json!({"path": "c.txt"})).await;
    let patch = "*** Begin Patch\n*** Update File: a.txt\n@@\n-x\n+X\n*** Update File: c.txt\n@@\n-z\n+Z\n*** End Patch";
    fx.ok("apply_patch", json!({"input": patch})).await;
    fx.ok("write", json!({"path": "b.txt", "content": "new\n"})).await;
    fx.ok("write", json!({"path": "d.txt", "content": "new\n"})).await;
    fx.put("a.txt", "X, and more by a command\n");
    fx.put("d.txt", "new, and more by a command\n");
    for path in ["a.txt", "d.txt"] {
        let refused = fx.err("undo", json!({"path": path})).await;
        assert!(refused.contains(&format!("`{path}` changed since")), "{refused}");
    }
    fx.put("d.txt", "new\n");
    let out = fx.ok("undo", json!({})).await;
    assert!(out.contains("undid the `write` of 1 file") && out.contains("`d.txt`"), "{out}");
    let out = fx.ok("undo", json!({})).await;
    assert!(out.contains("undid the `write` of 1 file") && out.contains("`b.txt`"), "{out}");
    assert!(!fx.root().join("b.txt").exists());
    let refused = fx.err("undo", json!({})).await;
    assert!(refused.contains("`a.txt` changed since the `apply_patch`"), "{refused}");
    fx.put("a.txt", "X\n");
    let out = fx.ok("undo", json!({})).await;
    assert!(out.contains("undid the `apply_patch` of 2 files"), "{out}");
    assert_eq!((fx.get("a.txt"), fx.get("c.txt")), ("x\n".to_owned(), "z\n".to_owned()));
}

/// Each run undoes its own changes only.
#[tokio::test]
async fn runs_undo_their_own_changes() {
    let fx = Fixture::new();
    fx.call_in("one", "write", json!({"path": "a.txt", "content": "from one\n"})).await.unwrap();
    let other = fx.call_in("two", "undo", json!({})).await.unwrap_err().report();
    assert!(other.contains("no change is kept for this run"), "{other}");
    fx.call_in("one", "undo", json!({})).await.unwrap();
    assert!(!fx.root().join("a.txt").exists());
    let unknown = fx.err("undo", json!({"path": "never.txt"})).await;
    assert!(unknown.contains("no change to `never.txt` is kept for this run"), "{unknown}");
}

/// `path` names a file however it is spelt: `./a.txt`, `sub/../a.txt`, its absolute path
/// or a link to it all name the file an edit of `a.txt` changed (only the spelling of that
/// edit was found: "no change to `./a.txt` is kept").
#[tokio::test]
async fn a_file_is_undone_whatever_its_path_is_spelt() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\n");
    fx.put("sub/keep", "");
    std::os::unix::fs::symlink("a.txt", fx.root().join("link")).unwrap();
    let absolute = fx.root().join("a.txt").to_string_lossy().into_owned();
    for (number, spelt) in ["./a.txt", "sub/../a.txt", absolute.as_str(), "link"].iter().enumerate()
    {
        let new = format!("{number}\n");
        let old = fx.get("a.txt");
        fx.ok("edit", json!({"path": "a.txt", "old_string": old, "new_string": new})).await;
        let out = fx.ok("undo", json!({"path": spelt})).await;
        assert!(out.contains("its content from before is back"), "{spelt}: {out}");
        assert_eq!(fx.get("a.txt"), old, "{spelt}");
    }
    // And the other way round: an edit through the link, undone by the file's name.
    fx.ok("edit", json!({"path": "link", "old_string": "one", "new_string": "two"})).await;
    fx.ok("undo", json!({"path": "a.txt"})).await;
    assert_eq!(fx.get("a.txt"), "one\n");
}

/// Undo brings back a file's mode from before the change, set-id bits included: an edit,
/// a write and a patch each cleared a set-user-id or set-group-id bit (as the system does
/// for a write), and the undone files kept the cleared mode (0751, 0755).
#[tokio::test]
async fn undo_brings_back_the_set_id_bits_a_rewrite_cleared() {
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new();
    let mode =
        |rel: &str| std::fs::metadata(fx.root().join(rel)).unwrap().permissions().mode() & 0o7777;
    for (path, bits) in [("suid.sh", 0o4751), ("sgid.sh", 0o2755), ("both.sh", 0o6755)] {
        std::fs::set_permissions(fx.put(path, "echo hi\n"), std::fs::Permissions::from_mode(bits))
            .unwrap();
        fx.ok("read", json!({"path": path})).await;
    }
    fx.ok("edit", json!({"path": "suid.sh", "old_string": "hi", "new_string": "bye"})).await;
    fx.ok("write", json!({"path": "sgid.sh", "content": "echo bye\n"})).await;
    let patch = "*** Begin Patch\n*** Update File: both.sh\n-echo hi\n+echo bye\n*** End Patch";
    fx.ok("apply_patch", json!({"input": patch})).await;
    assert_eq!((mode("suid.sh"), mode("sgid.sh"), mode("both.sh")), (0o751, 0o755, 0o755));
    for _ in 0..3 {
        fx.ok("undo", json!({})).await;
    }
    assert_eq!((mode("suid.sh"), mode("sgid.sh"), mode("both.sh")), (0o4751, 0o2755, 0o6755));
    for path in ["suid.sh", "sgid.sh", "both.sh"] {
        assert_eq!(fx.get(path), "echo hi\n");
    }
}

/// A file a change created that has lost its owner's write bit since is not removed by
/// undo, as it is not deleted by `apply_patch` or rewritten: it was removed silently.
#[tokio::test]
async fn undo_does_not_remove_a_file_made_read_only_since() {
    use std::os::unix::fs::PermissionsExt as _;
    let fx = Fixture::new();
    fx.ok("write", json!({"path": "new.txt", "content": "fresh\n"})).await;
    let path = fx.root().join("new.txt");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    let err = fx.err("undo", json!({})).await;
    assert_eq!(
        err,
        "`new.txt` is read-only (mode 0444); change its mode first (`chmod u+w`) if it is \
         meant to be changed, then try again"
    );
    assert_eq!(fx.get("new.txt"), "fresh\n");
    // Its write bit back, the change is still there to undo.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    fx.ok("undo", json!({})).await;
    assert!(!path.exists());
}
