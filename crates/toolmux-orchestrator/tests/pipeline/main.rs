//! Pipeline tests: every stage through the public API, against mock providers, on tokio's
//! paused clock (no real sleeps).

mod accounting;
mod cache;
mod catalog;
mod command_hooks;
mod content;
mod display;
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
use toolmux_orchestrator::store::{
    DirectoryStore, OutputPage, OutputStore, StoreError, StoredOutput,
};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig};

/// A [`DirectoryStore`] in a fresh temporary directory that goes with it: dropped with the
/// orchestrator holding it, it leaves nothing behind (a directory kept with
/// `TempDir::keep` stayed, empty where nothing was stored, after every test).
#[derive(Debug)]
pub struct TemporaryStore {
    store: DirectoryStore,
    // Declared after `store`, so dropped after it.
    dir: tempfile::TempDir,
}

impl TemporaryStore {
    /// A store in a new temporary directory.
    pub fn new() -> Arc<TemporaryStore> {
        let dir = tempfile::tempdir().expect("temporary directory");
        Arc::new(TemporaryStore { store: DirectoryStore::new(dir.path()), dir })
    }

    /// The directory the outputs go to, removed when the store is dropped.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

#[async_trait::async_trait]
impl OutputStore for TemporaryStore {
    async fn store(
        &self,
        run_id: &str,
        tool: &str,
        content: &str,
    ) -> Result<StoredOutput, StoreError> {
        self.store.store(run_id, tool, content).await
    }

    async fn read(&self, handle: &str, offset: u64, limit: u64) -> Result<OutputPage, StoreError> {
        self.store.read(handle, offset, limit).await
    }

    fn is_of_run(&self, handle: &str, run_id: &str) -> bool {
        self.store.is_of_run(handle, run_id)
    }
}

/// Builds and warms up an orchestrator over `providers`, with outputs stored in a fresh
/// temporary directory.
pub async fn start(
    config: OrchestratorConfig,
    providers: Vec<Arc<dyn ToolProvider>>,
) -> Orchestrator {
    let mut builder = Orchestrator::builder(config).output_store(TemporaryStore::new());
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
