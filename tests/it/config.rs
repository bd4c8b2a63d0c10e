//! The documented configuration, the committed JSON Schema and the loader agree, and a
//! loaded configuration drives real providers through the orchestrator.

use std::path::{Path, PathBuf};
use toolmux::Toolmux;
use toolmux::config::{FileFormat, load_str, schema};
use toolmux::toolmux_core::{CallContext, ToolCall};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The YAML example of docs/configuration.md.
fn documented_example() -> String {
    let doc = std::fs::read_to_string(repo_root().join("docs/configuration.md")).expect("doc");
    let start = doc.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = start + doc[start..].find("```").expect("end of the block");
    doc[start..end].to_owned()
}

fn env(name: &str) -> Option<String> {
    (name == "GITHUB_TOKEN").then(|| "ghp_example".to_owned())
}

#[test]
fn documented_example_loads() {
    let text = documented_example();
    let loaded = load_str(&text, FileFormat::Yaml, "example.yaml", Path::new("/proj"), &env)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.config.mcp_servers.len(), 3);
    assert_eq!(loaded.secrets, ["ghp_example"]);
    assert_eq!(loaded.stats_file().as_deref(), Some(Path::new("/proj/.toolmux/stats.json")));
}

#[test]
fn documented_example_follows_the_schema() {
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("schemas/toolmux.schema.json")).expect("schema"),
    )
    .expect("schema is JSON");
    let validator = jsonschema::validator_for(&committed).expect("a valid schema");
    let example: serde_json::Value =
        serde_yaml_ng::from_str(&documented_example()).expect("example is YAML");
    let errors: Vec<String> = validator.iter_errors(&example).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let wrong = serde_json::json!({"defaults": {"toolTimeout": "30s"}, "mcpServer": {}});
    assert!(!validator.is_valid(&wrong));
    // What the loader reads beyond the types: VS Code's spellings, numbers as text.
    let vscode = serde_json::json!({"servers": {"a": {"transport": "streamable-http",
        "url": "http://127.0.0.1:1/mcp", "gallery": "https://x", "version": "1.0"},
        "b": {"type": "stdio", "command": "srv", "args": ["--port", 8080], "env": {"N": 2}}}});
    let errors: Vec<String> = validator.iter_errors(&vscode).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    // A server's key written as `null` is not set, to the loader and to the schema alike.
    let nulls = "mcpServers:\n  a:\n    command: srv\n    args:\n    env: null\n    headers: null\n    toolsAllowed: null\n    toolsDenied:\n    lazy:\n";
    load_str(nulls, FileFormat::Yaml, "toolmux.yaml", Path::new("/proj"), &env)
        .unwrap_or_else(|e| panic!("{e}"));
    let nulls: serde_json::Value = serde_yaml_ng::from_str(nulls).expect("YAML");
    let errors: Vec<String> = validator.iter_errors(&nulls).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn committed_schema_is_the_generated_one() {
    let mut committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("schemas/toolmux.schema.json")).expect("schema"),
    )
    .expect("schema is JSON");
    if let Some(object) = committed.as_object_mut() {
        object.remove("$comment");
    }
    assert!(committed == schema(), "schemas/toolmux.schema.json is stale: run cargo xtask codegen");
}

#[tokio::test(flavor = "multi_thread")]
async fn configuration_drives_fs_and_rest_through_the_orchestrator() {
    let project = tempfile::tempdir().expect("tempdir");
    std::fs::write(project.path().join("todo.txt"), "TODO: integrate\n").expect("write");
    let text = r#"
defaults:
  outputDir: out
fs:
  root: .
restTools:
  lookup:
    description: Looks an id up
    url: http://127.0.0.1:9/items/${parameters.id}
aliases:
  find: fs__grep
permissions:
  deny: [fs__ls]
"#;
    let loaded = load_str(text, FileFormat::Yaml, "toolmux.yaml", project.path(), &env)
        .unwrap_or_else(|e| panic!("{e}"));
    let toolmux = Toolmux::build(&loaded).await.unwrap_or_else(|e| panic!("{e}"));
    let tools = toolmux.orchestrator();
    let report = tools.warmup().await;
    assert!(report.is_ok(), "{report:?}");
    let names: Vec<String> = tools.tools().into_iter().map(|t| t.name).collect();
    assert!(names.contains(&"rest__lookup".to_owned()), "{names:?}");

    let ctx = CallContext::new();
    let found =
        tools.execute(ToolCall::new("find", serde_json::json!({"pattern": "TODO"})), &ctx).await;
    assert_eq!(found.result.as_deref(), Some("todo.txt"), "{found:?}");
    let denied = tools.execute(ToolCall::new("fs__ls", serde_json::json!({})), &ctx).await;
    assert!(!denied.ok);
    assert_eq!(denied.extras["party"], "policy", "{denied:?}");

    toolmux.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(project.path().join("out/stats.json").is_file());
}
