//! Command tools (`commandTools`): a program of the user's as a tool.

use serde_json::json;
use std::collections::BTreeMap;
use toolmux_core::{CallContext, ToolProvider as _};
use toolmux_fs::{CommandLine, CommandToolConfig, CommandTools, FsConfig};

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
    let tools = CommandTools::new(&tools, &FsConfig::new(dir.path())).unwrap();
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
    let tools = CommandTools::new(&tools, &FsConfig::new(dir.path())).unwrap();
    (dir, tools)
}

/// A command tool's output and its error text reach the model with control characters
/// escaped.
#[tokio::test]
async fn a_command_tools_control_characters_are_escaped() {
    let (_dir, tools) = command_tool("printf 'a\\0b\\abell'");
    let out = tools.call("print", json!({}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error);
    assert_eq!(out.to_text(), "a\\x00b\\x07bell");
    let (_dir, tools) = command_tool("printf 'oops\\0\\a' >&2; exit 2");
    let out = tools.call("print", json!({}), &CallContext::new()).await.unwrap();
    assert!(out.is_error);
    assert_eq!(out.to_text(), "`print` failed (exit code 2): oops\\x00\\x07");
}

/// Binary output of a command tool is saved to a private spill file that the notice
/// names, as `bash` saves its own: the model was given only its size, and the bytes were
/// lost.
#[tokio::test]
async fn a_command_tools_binary_output_is_saved_to_a_file_it_names() {
    let (dir, tools) = command_tool("head -c 4096 /dev/urandom | tee out.bin");
    let out = tools.call("print", json!({}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error);
    let file = out.extras["stdoutFile"].as_str().expect("the bytes are saved").to_owned();
    assert_eq!(
        out.to_text(),
        format!(
            "[4096 bytes of binary output left out; saved to {file} (look at it with \
             `file {file}`, `xxd {file} | head`)]"
        )
    );
    let uid = rustix::process::getuid().as_raw();
    let private = std::env::temp_dir().join(format!("toolmux-fs-{uid}"));
    assert_eq!(std::path::Path::new(&file).parent(), Some(private.as_path()));
    assert_eq!(std::fs::read(&file).unwrap(), std::fs::read(dir.path().join("out.bin")).unwrap());
    std::fs::remove_file(&file).unwrap();

    // Stderr's, in the spill directory configured.
    let spill = tempfile::tempdir().unwrap();
    let (_dir, tools) = command_tool("head -c 100 /dev/zero >&2; exit 1");
    let tools = tools.with_spill_dir(spill.path().join("spill"));
    let out = tools.call("print", json!({}), &CallContext::new()).await.unwrap();
    assert!(out.is_error);
    let file = out.extras["stderrFile"].as_str().expect("the bytes are saved").to_owned();
    assert!(file.starts_with(&spill.path().join("spill").to_string_lossy().into_owned()));
    assert_eq!(
        out.to_text(),
        format!(
            "`print` failed (exit code 1): [100 bytes of binary output left out from stderr; \
             saved to {file} (look at it with `file {file}`, `xxd {file} | head`)]"
        )
    );
    assert_eq!(std::fs::read(&file).unwrap(), vec![0u8; 100]);
}
