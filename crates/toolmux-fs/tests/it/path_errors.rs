//! A path that names nothing usable (missing, a folder where a file is needed, a file where
//! a folder is) is the caller's invalid argument, with a message saying what to do; a path
//! that names a file the tools may not use as it is (one the system refuses, a FIFO) is a
//! plain tool error saying so, not framed as invalid arguments, since the arguments are right.

use crate::Fixture;
use expect_test::{Expect, expect};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use toolmux_fs::FsConfig;

/// Calls `tool`, which must fail with invalid arguments, and checks its report.
async fn check(fx: &Fixture, tool: &str, args: Value, expect: Expect) {
    check_code(fx, tool, args, "invalid_arguments", expect).await;
}

/// Calls `tool`, which must fail with a plain tool error about the file, and checks its
/// report.
async fn check_file(fx: &Fixture, tool: &str, args: Value, expect: Expect) {
    check_code(fx, tool, args, "remote", expect).await;
}

async fn check_code(fx: &Fixture, tool: &str, args: Value, code: &str, expect: Expect) {
    let err = fx.call(tool, args).await.unwrap_err();
    assert_eq!(err.code(), code, "{tool}: {}", err.report());
    expect.assert_eq(&err.report());
}

#[tokio::test]
async fn a_missing_file_gives_the_close_name_in_its_folder() {
    let fx = Fixture::new();
    fx.put("src/main.rs", "fn main() {}\n");
    check(
        &fx,
        "read",
        json!({"path": "src/mian.rs"}),
        expect!["invalid arguments for `fs__read`: at /: no file or directory at `src/mian.rs`: did you mean `src/main.rs`?"],
    )
    .await;
    // Every name that is not there, folders too.
    check(
        &fx,
        "edit",
        json!({"path": "scr/Main.rs", "old_string": "main", "new_string": "start"}),
        expect!["invalid arguments for `fs__edit`: at /: no file or directory at `scr/Main.rs`: did you mean `src/main.rs`?"],
    )
    .await;
    let absolute = fx.root().join("src/man.rs");
    let err = fx.call("read", json!({"path": absolute})).await.unwrap_err();
    assert_eq!(err.code(), "invalid_arguments");
    let wanted = format!("did you mean `{}`?", fx.root().join("src/main.rs").display());
    assert!(err.report().ends_with(&wanted), "{}", err.report());
    assert_eq!(fx.get("src/main.rs"), "fn main() {}\n");
}

#[tokio::test]
async fn a_missing_file_with_no_close_name_points_to_ls() {
    let fx = Fixture::new();
    fx.put("src/main.rs", "");
    check(
        &fx,
        "read",
        json!({"path": "src/completely_different.txt"}),
        expect!["invalid arguments for `fs__read`: at /: no file or directory at `src/completely_different.txt`: check the path with `fs__ls` or `fs__glob`"],
    )
    .await;
    check(
        &fx,
        "ls",
        json!({"path": "nope"}),
        expect!["invalid arguments for `fs__ls`: at /: no file or directory at `nope`: check the path with `fs__ls` or `fs__glob`"],
    )
    .await;
    check(
        &fx,
        "grep",
        json!({"pattern": "x", "path": "scr"}),
        expect!["invalid arguments for `fs__grep`: at /: no file or directory at `scr`: did you mean `src`?"],
    )
    .await;
    check(
        &fx,
        "apply_patch",
        json!({"input": "*** Begin Patch\n*** Update File: src/main.r\n@@\n-a\n+b\n*** End Patch"}),
        expect!["invalid arguments for `fs__apply_patch`: at /: `*** Update File: src/main.r`: there is no such file (did you mean `src/main.rs`?) (or the patch removed it earlier); nothing was changed"],
    )
    .await;
}

/// The close name of a hidden file is not given away.
#[tokio::test]
async fn hidden_names_are_not_suggested() {
    let fx = Fixture::with(|c: FsConfig| c.with_hide(["secret.txt"]));
    fx.put("secret.txt", "key\n");
    check(
        &fx,
        "read",
        json!({"path": "secrt.txt"}),
        expect!["invalid arguments for `fs__read`: at /: no file or directory at `secrt.txt`: check the path with `fs__ls` or `fs__glob`"],
    )
    .await;
}

#[tokio::test]
async fn a_folder_where_a_file_is_needed_points_to_ls() {
    let fx = Fixture::new();
    fx.put("d/x", "");
    for (tool, args) in [
        ("read", json!({"path": "d"})),
        ("write", json!({"path": "d", "content": "x"})),
        ("edit", json!({"path": "d", "old_string": "a", "new_string": "b"})),
    ] {
        let err = fx.call(tool, args).await.unwrap_err();
        assert_eq!(err.code(), "invalid_arguments", "{tool}: {}", err.report());
        assert_eq!(
            err.report(),
            format!(
                "invalid arguments for `fs__{tool}`: at /: `d` is a directory, not a file: use \
                 `fs__ls` to list it"
            )
        );
    }
    check(
        &fx,
        "apply_patch",
        json!({"input": "*** Begin Patch\n*** Delete File: d\n*** End Patch"}),
        expect!["invalid arguments for `fs__apply_patch`: at /: `d` is a directory, not a file: use `fs__ls` to list it"],
    )
    .await;
    assert!(fx.root().join("d/x").exists());
}

#[tokio::test]
async fn a_file_where_a_folder_is_needed_points_to_read() {
    let fx = Fixture::new();
    fx.put("f.txt", "");
    check(
        &fx,
        "ls",
        json!({"path": "f.txt"}),
        expect!["invalid arguments for `fs__ls`: at /: `f.txt` is a file, not a directory: read it with `fs__read`, or give a directory"],
    )
    .await;
    check(
        &fx,
        "glob",
        json!({"pattern": "*", "path": "f.txt"}),
        expect!["invalid arguments for `fs__glob`: at /: `f.txt` is a file, not a directory: read it with `fs__read`, or give a directory"],
    )
    .await;
}

/// `chattr +i` on a path, taken off again when dropped: the tests run as root, whom no
/// mode refuses, but an immutable file refuses even root.
struct Immutable(PathBuf);

impl Immutable {
    fn new(path: &Path) -> Immutable {
        let status = std::process::Command::new("chattr").arg("+i").arg(path).status().unwrap();
        assert!(status.success(), "chattr +i {}", path.display());
        Immutable(path.to_owned())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

#[tokio::test]
async fn permission_denied_names_the_path_and_what_to_do() {
    let fx = Fixture::new();
    let file = fx.put("locked.txt", "old\n");
    fx.put("frozen/a.txt", "a\n");
    let _file = Immutable::new(&file);
    let _folder = Immutable::new(&fx.root().join("frozen"));
    fx.ok("read", json!({"path": "locked.txt"})).await;
    check_file(
        &fx,
        "write",
        json!({"path": "locked.txt", "content": "new\n"}),
        expect!["permission denied on `locked.txt`: its owner, mode or attributes keep the file tools from it; choose another path, or ask the user to change its permissions"],
    )
    .await;
    check_file(
        &fx,
        "write",
        json!({"path": "frozen/b.txt", "content": "b\n"}),
        expect!["permission denied on `frozen/b.txt`: its owner, mode or attributes keep the file tools from it; choose another path, or ask the user to change its permissions"],
    )
    .await;
    assert_eq!(fx.get("locked.txt"), "old\n");
    assert!(!fx.root().join("frozen/b.txt").exists());
}

/// A FIFO is not a regular file to `write` either: it was told to read it first, which
/// `read` refuses.
#[tokio::test]
async fn a_fifo_is_not_written_and_not_sent_to_read() {
    let fx = Fixture::new();
    let made = std::process::Command::new("mkfifo").arg(fx.root().join("pipe")).status();
    assert!(made.expect("mkfifo runs").success());
    check_file(
        &fx,
        "write",
        json!({"path": "pipe", "content": "x"}),
        expect!["`pipe` is not a regular file (a FIFO, socket or device); refusing to open it"],
    )
    .await;
}

/// A file's name with a folder's trailing `/` is said to be a file, not answered as if
/// nothing were there.
#[tokio::test]
async fn a_file_named_with_a_trailing_slash_is_said_to_be_a_file() {
    let fx = Fixture::new();
    fx.put("a.txt", "a\n");
    check(
        &fx,
        "read",
        json!({"path": "a.txt/"}),
        expect!["invalid arguments for `fs__read`: at /: `a.txt` is a file, not a directory, so `a.txt/` (ending in `/`) names nothing: drop the trailing `/` to name the file"],
    )
    .await;
    check(
        &fx,
        "write",
        json!({"path": "a.txt/", "content": "b"}),
        expect!["invalid arguments for `fs__write`: at /: `a.txt` is a file, not a directory, so `a.txt/` (ending in `/`) names nothing: drop the trailing `/` to name the file"],
    )
    .await;
    assert_eq!(fx.get("a.txt"), "a\n");
}
