//! Pipeline tests: every stage through the public API, against mock providers, on tokio's
//! paused clock (no real sleeps).

mod accounting;
mod cache;
mod catalog;
mod command_hooks;
mod content;
mod lifecycle;
mod limits;
mod lookup;
mod queue;
mod relay;
mod search;
mod service;
mod timeout;

use std::sync::Arc;
use toolmux_core::{CallContext, ToolCall, ToolProvider, ToolResult};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig};

/// Builds and warms up an orchestrator over `providers`, with outputs stored in a fresh
/// temporary directory.
pub async fn start(
    config: OrchestratorConfig,
    providers: Vec<Arc<dyn ToolProvider>>,
) -> Orchestrator {
    let dir = tempfile::tempdir().expect("temporary directory").keep();
    let mut builder = Orchestrator::builder(config)
        .output_store(Arc::new(toolmux_orchestrator::store::DirectoryStore::new(dir)));
    for p in providers {
        builder = builder.provider(p);
    }
    let orchestrator = builder.build().expect("valid configuration");
    let report = orchestrator.warmup().await;
    assert!(report.is_ok(), "{report:?}");
    orchestrator
}

/// Builds and warms up an orchestrator over `provider` whose configuration holds the
/// secret `s3cr3t-value` (as `${ENV}` expansion would hand it over) to redact.
pub async fn start_with_secret(provider: Arc<dyn ToolProvider>) -> Orchestrator {
    let orchestrator = Orchestrator::builder(OrchestratorConfig::default())
        .provider(provider)
        .secrets(["s3cr3t-value".to_owned()])
        .build()
        .expect("valid configuration");
    orchestrator.warmup().await;
    orchestrator
}

/// One call with a fresh context.
pub async fn call(o: &Orchestrator, name: &str, args: serde_json::Value) -> ToolResult {
    o.execute(ToolCall::new(name, args), &CallContext::new()).await
}
