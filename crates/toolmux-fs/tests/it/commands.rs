//! Command tools (`commandTools`): a program of the user's as a tool.

use serde_json::json;
use std::collections::BTreeMap;
use toolmux_core::{CallContext, ToolProvider as _};
use toolmux_fs::{CommandLine, CommandToolConfig, CommandTools, SandboxConfig};

/// A script that writes its result through a process substitution (`exec > >(tee -a
/// log)`, to log its answers) answers with it: the group was killed as soon as the script
/// exited, before `tr` wrote, and the result was empty.
#[tokio::test]
async fn a_result_written_through_a_process_substitution_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let script = "exec > >(tr a-z A-Z); cat";
    let config = CommandToolConfig {
        description: "upper-cases its arguments".into(),
        command: CommandLine::Argv(vec!["bash".into(), "-c".into(), script.into()]),
        ..CommandToolConfig::default()
    };
    let tools = BTreeMap::from([("upper".to_owned(), config)]);
    let tools = CommandTools::new(&tools, dir.path(), &SandboxConfig::default()).unwrap();
    // It was lost in about half the runs: ten make the loss all but certain.
    for _ in 0..10 {
        let out = tools.call("upper", json!({"word": "hello"}), &CallContext::new()).await;
        let out = out.unwrap();
        assert!(!out.is_error, "{}", out.to_text());
        assert_eq!(out.to_text().trim_end(), r#"{"WORD":"HELLO"}"#);
    }
}

fn command_tool(script: &str) -> (tempfile::TempDir, CommandTools) {
    let dir = tempfile::tempdir().unwrap();
    let config = CommandToolConfig {
        description: "prints".into(),
        command: CommandLine::Argv(vec!["bash".into(), "-c".into(), script.into()]),
        ..CommandToolConfig::default()
    };
    let tools = BTreeMap::from([("print".to_owned(), config)]);
    let tools = CommandTools::new(&tools, dir.path(), &SandboxConfig::default()).unwrap();
    (dir, tools)
}

/// A command tool's output and its error text reach the model with control characters
/// escaped, and binary output as a notice.
#[tokio::test]
async fn a_command_tools_control_characters_are_escaped_and_binary_output_left_out() {
    let (_dir, tools) = command_tool("printf 'a\\0b\\abell'");
    let out = tools.call("print", json!({}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error);
    assert_eq!(out.to_text(), "a\\x00b\\x07bell");
    let (_dir, tools) = command_tool("printf 'oops\\0\\a' >&2; exit 2");
    let out = tools.call("print", json!({}), &CallContext::new()).await.unwrap();
    assert!(out.is_error);
    assert_eq!(out.to_text(), "`print` failed (exit code 2): oops\\x00\\x07");
    let (_dir, tools) = command_tool("head -c 4096 /dev/urandom");
    let out = tools.call("print", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(
        out.to_text(),
        "[4096 bytes of binary output left out: `print` printed what is not text]"
    );
}
