//! The file tools through a loaded configuration and the whole pipeline: a command (of
//! `fs__bash` or a command tool) runs to its own timeout, whatever `defaults.toolTimeout`
//! says, and a large file's `read`
//! comes back as lines within the response cap.

use std::path::Path;
use toolmux::Toolmux;
use toolmux::config::{FileFormat, load_str};
use toolmux::toolmux_core::{CallContext, ToolCall};

async fn build(yaml: &str, root: &Path) -> Toolmux {
    let env = |_: &str| None;
    let loaded = load_str(yaml, FileFormat::Yaml, "toolmux.yaml", root, &env)
        .unwrap_or_else(|e| panic!("{e}"));
    let toolmux = Toolmux::build(&loaded).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(toolmux.orchestrator().warmup().await.is_ok());
    toolmux
}

#[tokio::test]
async fn a_command_runs_to_its_own_timeout_past_the_default_tool_timeout() {
    let root = tempfile::tempdir().expect("a temporary directory");
    let yaml = "defaults: {toolTimeout: 500}\nfs: {permissions: [read, execute]}\n";
    let toolmux = build(yaml, root.path()).await;
    let call = ToolCall::new("fs__bash", serde_json::json!({"command": "sleep 1.5; echo done"}));
    let result = toolmux.orchestrator().execute(call, &CallContext::new()).await;
    assert!(result.ok, "{result:?}");
    assert!(result.result.as_deref().is_some_and(|r| r.contains("done")), "{result:?}");
    // The command's own timeout still ends it, with what it printed.
    let call = ToolCall::new(
        "fs__bash",
        serde_json::json!({"command": "echo started; sleep 30", "timeout": 1000}),
    );
    let result = toolmux.orchestrator().execute(call, &CallContext::new()).await;
    let text = format!("{result:?}");
    assert!(text.contains("started") && text.contains("timed out"), "{text}");
    toolmux.shutdown().await.expect("shut down");
}

#[tokio::test]
async fn a_command_tool_runs_to_its_own_timeout_past_the_default_tool_timeout() {
    let root = tempfile::tempdir().expect("a temporary directory");
    let yaml = "defaults: {toolTimeout: 300}\ncommandTools:\n  \
                slow: {description: Sleeps, command: 'sleep 1; echo done', timeoutMs: 5000}\n";
    let toolmux = build(yaml, root.path()).await;
    let call = ToolCall::new("cmd__slow", serde_json::json!({}));
    let result = toolmux.orchestrator().execute(call, &CallContext::new()).await;
    assert!(result.ok, "{result:?}");
    assert!(result.result.as_deref().is_some_and(|r| r.contains("done")), "{result:?}");
    toolmux.shutdown().await.expect("shut down");
}

#[tokio::test]
async fn reading_a_large_file_gives_lines_within_the_response_cap() {
    let root = tempfile::tempdir().expect("a temporary directory");
    let line = format!("{}\n", "x".repeat(110));
    std::fs::write(root.path().join("big.txt"), line.repeat(2000)).expect("a file");
    let yaml = "fs: {permissions: [read]}\n";
    let toolmux = build(yaml, root.path()).await;
    let call = ToolCall::new("fs__read", serde_json::json!({"path": "big.txt"}));
    let result = toolmux.orchestrator().execute(call, &CallContext::new()).await;
    assert!(result.ok, "{result:?}");
    let text = result.result.unwrap_or_default();
    assert!(!text.contains("size_limit_exceeded"), "stored away instead of read: {text}");
    assert!(
        text.contains("xxxxxxxxxx") && text.contains("offset"),
        "{}",
        &text[text.len() - 300..]
    );
    assert!(text.len() <= 100_000, "{}", text.len());
    toolmux.shutdown().await.expect("shut down");
}

/// The same with the crates put together by hand, as a Rust program would, with their
/// defaults: a `read` page fits the orchestrator's default output cap, so the model gets
/// the lines (a page stored behind a handle would, read again, be answered "unchanged").
#[tokio::test]
async fn by_default_a_read_page_fits_the_orchestrators_output_cap() {
    use std::sync::Arc;
    use toolmux::toolmux_fs::{FsConfig, FsProvider};
    use toolmux::toolmux_orchestrator::{Orchestrator, OrchestratorConfig};
    let root = tempfile::tempdir().expect("a temporary directory");
    let line = format!("{}\n", "x".repeat(110));
    std::fs::write(root.path().join("big.txt"), line.repeat(2000)).expect("a file");
    let fs = FsProvider::new(FsConfig::new(root.path())).expect("a file provider");
    let orchestrator = Orchestrator::builder(OrchestratorConfig::default())
        .provider(Arc::new(fs))
        .build()
        .expect("an orchestrator");
    assert!(orchestrator.warmup().await.is_ok());
    let ctx = CallContext::new().with_run_id("r");
    let call = || ToolCall::new("fs__read", serde_json::json!({"path": "big.txt"}));
    let result = orchestrator.execute(call(), &ctx).await;
    let text = result.result.unwrap_or_default();
    assert!(!text.contains("size_limit_exceeded"), "stored away instead of read");
    assert!(text.contains("xxxxxxxxxx"), "{}", &text[..200.min(text.len())]);
    orchestrator.cleanup().await;
}

/// Callers and hooks written against the seed engine's argument names (`filePath`,
/// `oldString`, `newString`, `replaceAll`, `context`, `headLimit`) or Claude Code's
/// `file_path` pass the orchestrator's validation and reach the tools, though the schemas
/// models see list only toolmux's names.
#[tokio::test]
async fn the_seed_s_argument_names_pass_the_pipeline() {
    let root = tempfile::tempdir().expect("a temporary directory");
    let toolmux = build("fs: {permissions: [read, write]}\n", root.path()).await;
    let orchestrator = toolmux.orchestrator();
    let ctx = CallContext::new();
    let call = |name: &str, arguments: serde_json::Value| ToolCall::new(name, arguments);
    let result = orchestrator
        .execute(
            call("fs__write", serde_json::json!({"filePath": "a.txt", "content": "one\none\n"})),
            &ctx,
        )
        .await;
    assert!(result.ok, "{result:?}");
    let result = orchestrator
        .execute(call("fs__read", serde_json::json!({"file_path": "a.txt"})), &ctx)
        .await;
    assert!(result.ok, "{result:?}");
    let result = orchestrator
        .execute(
            call(
                "fs__edit",
                serde_json::json!({"filePath": "a.txt", "oldString": "one", "newString": "two", "replaceAll": true}),
            ),
            &ctx,
        )
        .await;
    assert!(result.ok, "{result:?}");
    assert_eq!(std::fs::read_to_string(root.path().join("a.txt")).expect("a.txt"), "two\ntwo\n");
    let result = orchestrator
        .execute(
            call(
                "fs__grep",
                serde_json::json!({"pattern": "two", "output_mode": "content", "context": 1, "headLimit": 1}),
            ),
            &ctx,
        )
        .await;
    assert!(result.ok, "{result:?}");
    let text = result.result.unwrap_or_default();
    assert!(text.starts_with("a.txt:1:two") && !text.contains("a.txt:2:two"), "{text}");
    // An alias beside its name with another value is refused, naming both.
    let result = orchestrator
        .execute(
            call(
                "fs__write",
                serde_json::json!({"path": "a.txt", "file_path": "b.txt", "content": ""}),
            ),
            &ctx,
        )
        .await;
    let error = result.error.unwrap_or_default();
    assert!(error.contains("`file_path` is another name for `path`"), "{error}");
    // The schemas shown keep toolmux's names alone.
    let specs = orchestrator.tools();
    let edit = specs.iter().find(|s| s.name == "fs__edit").expect("fs__edit listed");
    let schema = edit.input_schema.to_string();
    assert!(schema.contains("old_string") && !schema.contains("oldString"), "{schema}");
    toolmux.shutdown().await.expect("shut down");
}

/// A guard pasted from Claude Code, reading `tool_input.file_path`, sees the path of a
/// file tool's call (toolmux's argument is `path`) and refuses the write it guards against;
/// before, it read nothing there and let every write through.
#[tokio::test]
async fn a_claude_code_guard_reading_file_path_refuses_a_write() {
    let root = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(
        root.path().join("guard.py"),
        "import json, sys\n\
         data = json.load(sys.stdin)\n\
         path = data.get('tool_input', {}).get('file_path') or ''\n\
         if path.endswith('.env'):\n    \
             print(f'refusing to write {path}', file=sys.stderr)\n    \
             sys.exit(2)\n",
    )
    .expect("the guard");
    let yaml = "fs: {permissions: [read, write]}\n\
                hooks:\n  \
                  PreToolUse:\n    \
                    - matcher: fs__write|fs__edit\n      \
                      hooks: [{type: command, command: python3 guard.py}]\n";
    let toolmux = build(yaml, root.path()).await;
    let ctx = CallContext::new();
    let call =
        ToolCall::new("fs__write", serde_json::json!({"path": "config/.env", "content": "KEY=1"}));
    let result = toolmux.orchestrator().execute(call, &ctx).await;
    let error = result.error.unwrap_or_default();
    assert!(error.contains("refusing to write config/.env"), "{error}");
    assert!(!root.path().join("config/.env").exists());
    let call = ToolCall::new("fs__write", serde_json::json!({"path": "notes.md", "content": "x"}));
    let result = toolmux.orchestrator().execute(call, &ctx).await;
    assert!(result.ok, "{result:?}");
    toolmux.shutdown().await.expect("shut down");
}
