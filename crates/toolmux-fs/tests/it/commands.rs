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
