//! [`RedisOutputStore`]: outputs over the size cap kept in Redis, so that a handle given
//! by one replica reads back through any other (`output__read`, `toolmux output show`).
//!
//! One string key per output, `{prefix}:out:{handle}`, expiring after [`OUTPUT_RETENTION`];
//! handles look like the directory store's (`run-…/out-…`), the replica's id in them.

use crate::backend::BackendShared;
use crate::resp::Reply;
use async_trait::async_trait;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use toolmux_orchestrator::store::{
    OutputPage, OutputStore, StoreError, StoredOutput, page_of, run_slug, valid_handle,
};

/// How long a stored output can be read back.
pub const OUTPUT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// The largest output kept; a larger one fails to store (the orchestrator then cuts it).
pub const MAX_OUTPUT_BYTES: usize = 32 * 1024 * 1024;

/// The output store in Redis, for [`toolmux_orchestrator::Orchestrator`]'s builder
/// (`.output_store(Arc::new(backend.output_store()))`).
#[derive(Debug)]
pub struct RedisOutputStore {
    backend: Arc<BackendShared>,
    counter: AtomicU64,
    retention: Duration,
}

impl RedisOutputStore {
    pub(crate) fn new(backend: Arc<BackendShared>) -> RedisOutputStore {
        RedisOutputStore { backend, counter: AtomicU64::new(0), retention: OUTPUT_RETENTION }
    }

    /// Keeps outputs for `retention` instead of [`OUTPUT_RETENTION`].
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    fn key(&self, handle: &str) -> String {
        format!("{}:out:{handle}", self.backend.settings.prefix)
    }

    fn unavailable(&self, message: String) -> StoreError {
        StoreError::Unavailable { store: "redis".into(), message }
    }
}

#[async_trait]
impl OutputStore for RedisOutputStore {
    async fn store(
        &self,
        run_id: &str,
        _tool: &str,
        content: &str,
    ) -> Result<StoredOutput, StoreError> {
        if content.len() > MAX_OUTPUT_BYTES {
            return Err(self.unavailable(format!(
                "an output of {} bytes is over the {MAX_OUTPUT_BYTES}-byte limit of outputs kept in Redis",
                content.len()
            )));
        }
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let handle = format!("{}/out-{}-{n:x}", run_slug(run_id), self.backend.replica);
        let seconds = self.retention.as_secs().max(1).to_string();
        let key = self.key(&handle);
        let command: [&[u8]; 5] =
            [b"SET", key.as_bytes(), content.as_bytes(), b"EX", seconds.as_bytes()];
        self.backend
            .client
            .command(&command)
            .await
            .map_err(|e| self.unavailable(toolmux_core::error_report(&e)))?;
        Ok(StoredOutput {
            handle,
            bytes: content.len() as u64,
            lines: content.lines().count() as u64,
        })
    }

    async fn read(&self, handle: &str, offset: u64, limit: u64) -> Result<OutputPage, StoreError> {
        let unknown = || StoreError::UnknownHandle { handle: handle.to_owned() };
        if !valid_handle(handle) {
            return Err(unknown());
        }
        let reply = self
            .backend
            .client
            .command(&["GET", &self.key(handle)])
            .await
            .map_err(|e| self.unavailable(toolmux_core::error_report(&e)))?;
        match reply {
            Reply::Bulk(bytes) => Ok(page_of(&String::from_utf8_lossy(&bytes), offset, limit)),
            _ => Err(unknown()),
        }
    }

    fn is_of_run(&self, handle: &str, run_id: &str) -> bool {
        handle.split_once('/').is_some_and(|(run, _)| run == run_slug(run_id))
    }
}
