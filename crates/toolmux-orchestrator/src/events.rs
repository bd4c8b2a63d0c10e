//! Events for observers: `tool_started`, `tool_progress`, `tool_finished`, and what agents'
//! models write as they write it (`tool_streaming`, `agent_text`), on a broadcast channel. Sending costs nothing when nobody subscribes.

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
    /// An agent's model is writing a call of a tool shown to people
    /// (`ToolAnnotations::visible`): the next fragment of its arguments, before the call
    /// starts. The call's `ToolStarted` then carries the same `call_id`.
    ToolStreaming {
        /// The agent's operation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_op_id: Option<u64>,
        /// The run.
        run_id: String,
        /// The model's id of the call.
        call_id: String,
        /// The full tool name.
        tool: String,
        /// The next fragment of the arguments' JSON text (secrets of the configuration
        /// redacted where a fragment holds one whole).
        arguments_delta: String,
    },
    /// An agent's model wrote more of its answer's text.
    AgentText {
        /// The agent's operation.
        op_id: u64,
        /// The operation that started the agent (none for a run's first agent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_op_id: Option<u64>,
        /// The run.
        run_id: String,
        /// The agent's name.
        agent: String,
        /// The next fragment of the text.
        text: String,
        /// The model's answer is starting over (its request was tried again): the text of
        /// this turn so far is void.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        restart: bool,
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
