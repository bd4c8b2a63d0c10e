//! The one interface every source of tools implements.

use crate::{CallContext, ToolError, ToolKind, ToolOutput, ToolSpec};
use async_trait::async_trait;
use serde_json::Value;
use std::fmt;
use tokio::sync::watch;

/// A source of tools: an MCP server, an HTTP API, the builtin file tools, another agent,
/// or an orchestrator composing several of them.
///
/// Names here are provider-local (`read`, not `fs__read`); the orchestrator adds the
/// namespace. Implementations must be cheap to call concurrently and must stop work soon
/// after `ctx` is cancelled.
#[async_trait]
pub trait ToolProvider: Send + Sync + fmt::Debug {
    /// The kind of source.
    fn kind(&self) -> ToolKind;

    /// The namespace its tools are listed under, matching `[a-z][a-z0-9-]*`.
    fn namespace(&self) -> &str;

    /// The tools offered now.
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError>;

    /// Whether a tool of this local name is offered now.
    async fn has_tool(&self, name: &str) -> bool {
        self.list_tools().await.is_ok_and(|tools| tools.iter().any(|t| t.name == name))
    }

    /// Runs one tool. `arguments` have been validated against the tool's input schema when
    /// called through the orchestrator.
    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError>;

    /// Connects, spawns or loads whatever the provider needs before the first call.
    async fn warmup(&self) -> Result<(), ToolError> {
        Ok(())
    }

    /// Instructions for the model about these tools (an MCP server's `instructions`).
    fn instructions(&self) -> Option<String> {
        None
    }

    /// Closes connections and reaps child processes. Calls after shutdown fail.
    async fn shutdown(&self) -> Result<(), ToolError> {
        Ok(())
    }

    /// A signal that fires when the tool list changes; `None` when it never does.
    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        None
    }
}

/// The sending side of a tool-list-changed signal. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ToolListNotifier(watch::Sender<u64>);

impl Default for ToolListNotifier {
    fn default() -> Self {
        ToolListNotifier(watch::Sender::new(0))
    }
}

impl ToolListNotifier {
    /// A notifier nobody listens to yet.
    pub fn new() -> Self {
        ToolListNotifier::default()
    }

    /// Tells every listener that the list changed.
    pub fn notify(&self) {
        self.0.send_modify(|version| *version += 1);
    }

    /// A new listener; it sees changes made after this call.
    pub fn subscribe(&self) -> ToolListChanges {
        ToolListChanges(self.0.subscribe())
    }
}

/// The receiving side of a tool-list-changed signal.
#[derive(Debug, Clone)]
pub struct ToolListChanges(watch::Receiver<u64>);

impl ToolListChanges {
    /// Waits for the next change; `false` once the provider is gone and no change can come.
    pub async fn changed(&mut self) -> bool {
        let changed = self.0.changed().await.is_ok();
        self.0.borrow_and_update();
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn notifier_wakes_listeners() {
        let notifier = ToolListNotifier::new();
        let mut changes = notifier.subscribe();
        notifier.notify();
        assert!(changes.changed().await);
        drop(notifier);
        assert!(!changes.changed().await);
    }
}
