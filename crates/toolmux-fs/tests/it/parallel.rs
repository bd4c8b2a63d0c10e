//! Parallel calls on one file: each read-modify-write applies to the result of the last,
//! so none is lost, and the freshness check works as it does one call at a time.

use crate::Fixture;
use serde_json::json;
use std::sync::Arc;
use toolmux_core::{CallContext, ToolProvider};

const EDITS: usize = 24;

fn token(i: usize) -> String {
    format!("<item {i:02}>")
}

/// A file with one line per edit, each with a string no other line contains.
fn file() -> String {
    (0..EDITS).map(|i| format!("{} = old\n", token(i))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_edits_of_one_file_all_land() {
    let fx = Arc::new(Fixture::new());
    fx.put("shared.txt", &file());
    fx.call_in("agent", "read", json!({"path": "shared.txt"})).await.unwrap();
    std::os::unix::fs::symlink("shared.txt", fx.root().join("link.txt")).unwrap();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..EDITS {
        let fx = fx.clone();
        calls.spawn(async move {
            let (old, new) = (format!("{} = old", token(i)), format!("{} = new", token(i)));
            let args = json!({"path": "shared.txt", "old_string": old, "new_string": new});
            // Every other call through a symlink: the lock is taken on where it leads.
            let args = if i % 2 == 0 { args } else { with_path(args, "link.txt") };
            fx.fs.call("edit", args, &CallContext::new().with_run_id("agent")).await
        });
    }
    let mut failures = Vec::new();
    while let Some(joined) = calls.join_next().await {
        if let Err(e) = joined.unwrap() {
            failures.push(e.report());
        }
    }
    assert_eq!(failures, Vec::<String>::new());
    let expected: String = (0..EDITS).map(|i| format!("{} = new\n", token(i))).collect();
    assert_eq!(fx.get("shared.txt"), expected);
}

fn with_path(mut args: serde_json::Value, path: &str) -> serde_json::Value {
    args["path"] = json!(path);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_writes_and_edits_take_turns() {
    let fx = Arc::new(Fixture::new());
    fx.put("a.txt", "start\n");
    fx.call_in("agent", "read", json!({"path": "a.txt"})).await.unwrap();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..8 {
        let fx = fx.clone();
        calls.spawn(async move {
            let ctx = CallContext::new().with_run_id("agent");
            if i % 2 == 0 {
                let args = json!({"path": "a.txt", "content": format!("written by {i}\n")});
                fx.fs.call("write", args, &ctx).await.map(|_| ())
            } else {
                // Appends to whatever is there, through the whole-file match of `\n` at
                // its end, which every writer leaves.
                let args = json!({"path": "a.txt", "old_string": "\n", "new_string": format!("\nedit {i}\n"), "replace_all": true});
                fx.fs.call("edit", args, &ctx).await.map(|_| ())
            }
        });
    }
    while let Some(joined) = calls.join_next().await {
        // Every call sees the last one's result as read by this run: none is refused as
        // stale.
        joined.unwrap().unwrap();
    }
    // The last write's content, then one line per edit that came after it.
    let text = fx.get("a.txt");
    let mut lines = text.lines();
    assert!(lines.next().is_some_and(|l| l.starts_with("written by ")), "{text:?}");
    assert!(lines.all(|l| l.starts_with("edit ")), "{text:?}");
}

#[tokio::test]
async fn freshness_is_checked_as_before() {
    let fx = Fixture::new();
    fx.put("a.txt", "one\ntwo\n");
    fx.call_in("run-1", "read", json!({"path": "a.txt"})).await.unwrap();
    fx.call_in("run-2", "read", json!({"path": "a.txt"})).await.unwrap();
    fx.call_in("run-2", "edit", json!({"path": "a.txt", "old_string": "one", "new_string": "1"}))
        .await
        .unwrap();
    // run-1 read the file before run-2 changed it.
    let err = fx
        .call_in("run-1", "edit", json!({"path": "a.txt", "old_string": "two", "new_string": "2"}))
        .await
        .unwrap_err();
    assert!(err.report().contains("has been modified since it was last read"), "{}", err.report());
    // run-2's own edit counts as its read.
    fx.call_in("run-2", "edit", json!({"path": "a.txt", "old_string": "two", "new_string": "2"}))
        .await
        .unwrap();
    assert_eq!(fx.get("a.txt"), "1\n2\n");
}
