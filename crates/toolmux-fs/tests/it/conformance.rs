//! The shared provider conformance suite, with samples for every tool.

use crate::Fixture;
use serde_json::json;
use toolmux_core::ToolProvider;
use toolmux_test_support::conformance::{Conformance, SampleCall};

#[tokio::test]
async fn every_tool_passes_the_conformance_suite() {
    let fx = Fixture::new();
    fx.put("a.txt", "hello\nworld\n");
    fx.put("src/lib.rs", "pub fn f() {}\n");
    Conformance::new()
        .with_sample(SampleCall::new("read", json!({"path": "a.txt"})).expect_text_contains("1\thello"))
        .with_sample(SampleCall::new("read", json!({"path": "../x"})).expect_failure().expect_text_contains("outside the workspace root"))
        .with_sample(SampleCall::new("write", json!({"path": "new/b.txt", "content": "b\n"})).expect_text_contains("created `new/b.txt`"))
        .with_sample(SampleCall::new("write", json!({"path": "src/lib.rs", "content": "x"})).expect_failure().expect_text_contains("has not been read"))
        .with_sample(SampleCall::new("edit", json!({"path": "a.txt", "old_string": "world", "new_string": "there"})).expect_text_contains("made 1 replacement"))
        .with_sample(SampleCall::new("multi_edit", json!({"path": "a.txt", "edits": [{"old_string": "hello", "new_string": "hi"}, {"old_string": "hi", "new_string": "hey"}]})).expect_text_contains("made 2 replacements"))
        .with_sample(SampleCall::new("apply_patch", json!({"input": "*** Begin Patch\n*** Add File: a2.txt\n+one\n*** Update File: a2.txt\n one\n+two\n*** End Patch"})).expect_text_contains("M a2.txt (+1 -0)"))
        .with_sample(SampleCall::new("grep", json!({"pattern": "pub fn", "output_mode": "content"})).expect_text_contains("src/lib.rs:1:pub fn f() {}"))
        .with_sample(SampleCall::new("glob", json!({"pattern": "**/*.rs"})).expect_text_contains("src/lib.rs"))
        .with_sample(SampleCall::new("ls", json!({"depth": 2})).expect_text_contains("lib.rs (14 bytes)"))
        .with_sample(SampleCall::new("bash", json!({"command": "echo hi"})).expect_text_contains("hi"))
        .with_sample(SampleCall::new("exec", json!({"argv": ["echo", "hi"]})).expect_text_contains("hi"))
        .with_cancellable(SampleCall::new("bash", json!({"command": "sleep 30"})))
        .check(&fx.fs)
        .await;
}

#[tokio::test]
async fn read_only_provider_passes_and_lists_only_read_tools() {
    let fx = Fixture::with(|c| c.with_permissions([toolmux_fs::Permission::Read]));
    fx.put("a.txt", "x\n");
    let names: Vec<String> =
        fx.fs.list_tools().await.unwrap().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["read", "grep", "glob", "ls"]);
    assert!(!fx.fs.has_tool("write").await);
    Conformance::new()
        .with_sample(SampleCall::new("read", json!({"path": "a.txt"})))
        .with_sample(
            SampleCall::new("bash", json!({"command": "true"}))
                .expect_failure()
                .expect_text_contains("\"execute\""),
        )
        .check(&fx.fs)
        .await;
}

#[tokio::test]
async fn specs_carry_annotations_and_claude_code_parameter_names() {
    let fx = Fixture::new();
    let tools = fx.fs.list_tools().await.unwrap();
    let spec = |name: &str| tools.iter().find(|t| t.name == name).unwrap().clone();
    assert!(spec("read").annotations.read_only);
    assert!(!spec("read").annotations.open_world);
    assert!(spec("write").annotations.destructive);
    assert_eq!(spec("bash").annotations.permission, Some(toolmux_core::PermissionClass::Execute));
    // A command ends at its own timeout (at most `maxTimeoutMs`, 10 min) with its output so
    // far, so the tools tell the pipeline to wait that long, plus time to answer.
    let limit = std::time::Duration::from_secs(615);
    assert_eq!((spec("bash").time_limit, spec("exec").time_limit), (Some(limit), Some(limit)));
    assert_eq!(spec("read").time_limit, None);
    let grep = spec("grep");
    let props = grep.input_schema["properties"].as_object().unwrap();
    for key in [
        "pattern",
        "path",
        "glob",
        "type",
        "output_mode",
        "-A",
        "-B",
        "-C",
        "-n",
        "-i",
        "multiline",
        "head_limit",
        "offset",
    ] {
        assert!(props.contains_key(key), "grep lacks {key}");
    }
    let edit = spec("edit");
    for key in ["path", "old_string", "new_string", "replace_all"] {
        assert!(edit.input_schema["properties"].get(key).is_some(), "edit lacks {key}");
    }
    assert_eq!(fx.fs.kind(), toolmux_core::ToolKind::Builtin);
    assert_eq!(fx.fs.namespace(), "fs");
    let renamed = toolmux_fs::FsProvider::new(toolmux_fs::FsConfig::new(fx.root()))
        .unwrap()
        .with_namespace("files");
    assert_eq!(renamed.namespace(), "files");
}

/// The descriptions name other tools as a model calls them, in the provider's namespace:
/// a bare `ls` names no tool.
#[tokio::test]
async fn descriptions_name_other_tools_in_the_namespace() {
    let fx = Fixture::new();
    use toolmux_fs::Permission::{Execute, Read, Write};
    let every = [Read, Write, Execute];
    let config = toolmux_fs::FsConfig::new(fx.root()).with_permissions(every);
    let renamed = toolmux_fs::FsProvider::new(config).unwrap().with_namespace("files");
    for (provider, ns) in [(&fx.fs, "fs"), (&renamed, "files")] {
        let tools = provider.list_tools().await.unwrap();
        let spec = |name: &str| tools.iter().find(|t| t.name == name).unwrap().clone();
        let read = spec("read").description;
        assert!(read.contains(&format!("(use `{ns}__ls`)")), "{read}");
        let bash = spec("bash").description;
        assert!(bash.contains(&format!("with `{ns}__task_output`")), "{bash}");
        // `glob` is also one of grep's parameters.
        let names: Vec<&str> =
            tools.iter().map(|t| t.name.as_str()).filter(|n| *n != "glob").collect();
        let mut bare = Vec::new();
        for tool in &tools {
            let text = format!("{} {}", tool.description, tool.input_schema);
            for name in &names {
                if text.contains(&format!("`{name}`")) {
                    bare.push(format!("{} names `{name}`", tool.name));
                }
            }
        }
        assert!(bare.is_empty(), "{bare:?}");
    }
}

#[tokio::test]
async fn bad_roots_are_configuration_errors() {
    let err = toolmux_fs::FsProvider::new(toolmux_fs::FsConfig::new("relative")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid fs configuration: root `relative` is not an absolute path"
    );
    let err =
        toolmux_fs::FsProvider::new(toolmux_fs::FsConfig::new("/no/such/root/x")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid fs configuration: root `/no/such/root/x` cannot be opened"),
        "{err}"
    );
}
