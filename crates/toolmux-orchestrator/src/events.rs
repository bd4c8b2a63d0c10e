//! Events for observers: `tool_started`, `tool_progress`, `tool_finished`, on a broadcast
//! channel. Sending costs nothing when nobody subscribes.

use crate::accounting::CallRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolmux_core::{Progress, ToolKind};

/// Something that happened to a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ToolEvent {
    /// A call entered the pipeline.
    ToolStarted {
        /// The operation id.
        op_id: u64,
        /// The enclosing operation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_op_id: Option<u64>,
        /// The run.
        run_id: String,
        /// The caller's call id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// The full tool name.
        tool: String,
        /// The provider kind, when the tool is known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<ToolKind>,
        /// The arguments, for a tool shown to people (`ToolAnnotations::visible`): a user
        /// interface renders the call from them. Secrets of the configuration are
        /// redacted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<Value>,
    },
    /// A running call reported progress.
    ToolProgress {
        /// The operation id.
        op_id: u64,
        /// The full tool name.
        tool: String,
        /// The report.
        progress: Progress,
    },
    /// A call ended.
    ToolFinished {
        /// What it did.
        record: CallRecord,
        /// The result's text (or the error's), for a tool shown to people, as the caller
        /// got it (size-capped, secrets redacted).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<String>,
    },
}
