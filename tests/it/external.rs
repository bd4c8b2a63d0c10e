//! External tools across a reload: the pending calls stay where the configuration in force
//! keeps them.

use std::path::Path;
use toolmux::Toolmux;
use toolmux::config::{FileFormat, Loaded, load_str};
use toolmux::toolmux_core::{CallContext, ToolCall};

fn load(dir: &Path, calls: &str, ttl: u64) -> Loaded {
    let yaml = format!(
        "defaults:\n  externalCallsDir: {calls}\n  externalCallTtl: {ttl}\n\
         externalTools:\n  build:\n    description: Start a build\n    isAsync: true\n"
    );
    let env = |_: &str| None;
    load_str(&yaml, FileFormat::Yaml, "toolmux.yaml", dir, &env).unwrap_or_else(|e| panic!("{e}"))
}

/// The files of pending calls under `dir`.
fn calls_in(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("calls")).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .count()
    })
}

/// A reload keeps the store of pending calls while its settings hold, and takes the new
/// folder when `externalCallsDir` changed (calls made after it went to the old folder,
/// where the other processes no longer looked).
#[tokio::test]
async fn a_reload_keeps_the_pending_calls_where_the_configuration_says() {
    let project = tempfile::tempdir().unwrap();
    let first = load(project.path(), "one", 600_000);
    let toolmux = Toolmux::build(&first).await.unwrap_or_else(|e| panic!("{e}"));
    let call = ToolCall::new("external__build", serde_json::json!({}));
    let tools = toolmux.orchestrator();
    assert!(tools.warmup().await.is_ok());
    assert!(tools.execute(call.clone(), &CallContext::new()).await.ok);
    assert_eq!(calls_in(&project.path().join("one")), 1);

    let same = Toolmux::rebuild(&load(project.path(), "one", 600_000), &toolmux)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(same.orchestrator().warmup().await.is_ok());
    assert!(same.orchestrator().execute(call.clone(), &CallContext::new()).await.ok);
    assert_eq!(calls_in(&project.path().join("one")), 2);

    let moved = Toolmux::rebuild(&load(project.path(), "two", 5_000), &same)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(moved.orchestrator().warmup().await.is_ok());
    assert!(moved.orchestrator().execute(call, &CallContext::new()).await.ok);
    assert_eq!(calls_in(&project.path().join("one")), 2);
    assert_eq!(calls_in(&project.path().join("two")), 1);
    for built in [toolmux, same, moved] {
        built.shutdown().await.unwrap();
    }
}
