//! What calls act on, as permission rules on calls see it (`fs__write(src/**)`).

use crate::Fixture;
use serde_json::json;
use toolmux_core::{Subject, SubjectKind, ToolProvider};

fn path(p: &str) -> Vec<Subject> {
    vec![Subject::Path(p.to_owned())]
}

#[test]
fn each_tool_says_what_its_calls_act_on() {
    let f = Fixture::new();
    for (tool, kind) in [
        ("read", Some(SubjectKind::Path)),
        ("write", Some(SubjectKind::Path)),
        ("multi_edit", Some(SubjectKind::Path)),
        ("apply_patch", Some(SubjectKind::Path)),
        ("grep", Some(SubjectKind::Path)),
        ("ls", Some(SubjectKind::Path)),
        ("bash", Some(SubjectKind::Command)),
        ("exec", Some(SubjectKind::Command)),
        ("task_list", None),
        ("no_such_tool", None),
    ] {
        assert_eq!(f.fs.subject_kind(tool), kind, "{tool}");
    }
    let bash = f.fs.subjects("bash", &json!({"command": "git status && ls"})).unwrap();
    assert_eq!(bash, [Subject::Command("git status && ls".into())]);
    let exec = f.fs.subjects("exec", &json!({"argv": ["cargo", "test"]})).unwrap();
    assert_eq!(exec, [Subject::Argv(vec!["cargo".into(), "test".into()])]);
    assert_eq!(f.fs.subjects("task_list", &json!({})).unwrap(), []);
}

/// Paths are where the call leads: through symlinks and `..`, from absolute paths inside
/// the root, to files not yet written; never outside the root.
#[tokio::test]
async fn paths_are_resolved_as_the_call_resolves_them() {
    let f = Fixture::new();
    f.put("secrets/key.pem", "k");
    std::os::unix::fs::symlink("secrets", f.root().join("innocent")).unwrap();
    std::os::unix::fs::symlink(f.root().join("secrets"), f.root().join("absolute")).unwrap();
    std::os::unix::fs::symlink("secrets/key.pem", f.root().join("notes.txt")).unwrap();
    let subjects = |tool: &str, args| f.fs.subjects(tool, &args).unwrap();
    assert_eq!(subjects("read", json!({"path": "innocent/key.pem"})), path("secrets/key.pem"));
    assert_eq!(
        subjects("write", json!({"path": "notes.txt", "content": ""})),
        path("secrets/key.pem")
    );
    assert_eq!(
        subjects("read", json!({"path": "src/../secrets/key.pem"})),
        path("secrets/key.pem")
    );
    let absolute = f.root().join("secrets/key.pem");
    assert_eq!(subjects("read", json!({"path": absolute})), path("secrets/key.pem"));
    assert_eq!(
        subjects("write", json!({"path": "new/dir/file.rs", "content": ""})),
        path("new/dir/file.rs")
    );
    assert_eq!(subjects("grep", json!({"pattern": "x"})), path("."));
    assert_eq!(subjects("ls", json!({"path": "innocent"})), path("secrets"));
    // A link by absolute path is not followed by the tools, so the path it would dodge a
    // rule with leads nowhere: the call fails whatever the rules say.
    let through = f.call("read", json!({"path": "absolute/key.pem"})).await;
    assert!(through.is_err(), "{through:?}");
    let outside = f.fs.subjects("read", &json!({"path": "../x"})).unwrap_err();
    assert!(outside.contains("outside"), "{outside}");
}
