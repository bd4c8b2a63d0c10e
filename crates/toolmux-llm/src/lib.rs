//! Model clients for toolmux agents.
//!
//! An agent asks a [`Model`] for its next step: the conversation so far ([`Message`]s), the
//! tools it may call ([`ToolDefinition`]s) and a system prompt go in a [`ModelRequest`]; the
//! [`ModelResponse`] carries text, tool calls, why the model stopped and the tokens used.
//! The vocabulary is the same for every API; each client fits it to its own wire format.
//!
//! This crate defines the vocabulary and the [`Model`] trait; the HTTP clients for
//! OpenAI-compatible chat completions and Anthropic's messages API are built from a
//! [`ModelConfig`] by [`connect`].
//!
//! ```
//! use toolmux_llm::{Message, ModelRequest, ToolDefinition};
//! use serde_json::json;
//!
//! let request = ModelRequest::new(vec![Message::user("What is in README.md?")])
//!     .with_system("You answer from the files of the workspace.")
//!     .with_tools(vec![ToolDefinition::new(
//!         "fs__read",
//!         "Reads a file",
//!         json!({"type": "object", "properties": {"path": {"type": "string"}}}),
//!     )]);
//! assert_eq!(request.tools.len(), 1);
//! ```

#![deny(missing_docs)]

mod config;
mod error;
mod message;

pub use config::{ApiKind, ModelConfig};
pub use error::ModelError;
pub use message::{
    Message, ModelRequest, ModelResponse, ModelToolCall, StopReason, ToolChoice, ToolDefinition,
    ToolResultMessage, Usage,
};

use async_trait::async_trait;
use std::fmt;
use tokio_util::sync::CancellationToken;

/// A model an agent can ask for its next step.
///
/// Implementations retry what is worth retrying (rate limits, overloaded servers, dropped
/// connections) within their own limits, honour `cancel` at every wait, and report the rest
/// as a [`ModelError`] that says what went wrong and what to change.
#[async_trait]
pub trait Model: Send + Sync + fmt::Debug {
    /// The configured name of this model (`fast`, `claude`), for messages and accounting.
    fn name(&self) -> &str;

    /// One completion of `request`.
    async fn complete(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, ModelError>;
}
