//! The vocabulary every toolmux crate speaks: what a tool is ([`ToolSpec`]), how it is
//! called ([`ToolCall`], [`CallContext`]), what comes back ([`ToolOutput`], [`ToolResult`]),
//! what can go wrong ([`ToolError`]), where tools come from ([`ToolProvider`]) and how
//! their names are built ([`naming`]). Providers may also offer prompts and resources
//! ([`PromptSpec`], [`ResourceSpec`]), and a running tool may log to its caller or ask it
//! for a completion, an answer from its user or its roots ([`InteractionHandler`]).
//!
//! It is for authors of tool providers and of programs that call tools. It knows no
//! transport, no HTTP client and no MCP SDK: those live in the provider crates.
//!
//! # Example
//!
//! A provider made of one typed tool, called directly:
//!
//! ```
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//! use toolmux_core::{CallContext, ToolKind, ToolOutput, ToolProvider, ToolSet};
//!
//! #[derive(Deserialize, JsonSchema)]
//! struct Add {
//!     /// First addend.
//!     a: i64,
//!     /// Second addend.
//!     b: i64,
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let math = ToolSet::new("math", ToolKind::Builtin)
//!     .with_typed("add", "Add two integers", |input: Add, _ctx| async move {
//!         Ok(ToolOutput::text((input.a + input.b).to_string()))
//!     });
//! let out = math
//!     .call("add", serde_json::json!({"a": 2, "b": 3}), &CallContext::new())
//!     .await
//!     .unwrap();
//! assert_eq!(out.to_text(), "5");
//! # });
//! ```
#![deny(missing_docs)]

mod catalog;
mod context;
pub mod credential;
mod error;
mod file;
#[cfg(unix)]
pub mod group_guard;
mod holder;
mod interaction;
mod kind;
mod mark;
pub mod naming;
mod output;
mod provider;
#[cfg(unix)]
pub mod regular;
mod result;
pub mod schema;
mod spec;
pub mod sse;
pub mod suggest;
mod toolset;
pub mod trace;
mod unique;
mod url_text;

pub use catalog::{
    Completion, CompletionRef, CompletionRequest, Message, Prompt, PromptArgument, PromptSpec,
    ResourceBody, ResourceContents, ResourceSpec, ResourceTemplate, Role,
};
pub use context::{
    ApprovalDecision, ApprovalRequest, CONNECTION_HEADERS, CallContext, EarlyAnswer,
    InteractionHandler, Op, Progress, ProgressSink, passable_header,
};
pub use error::{Party, ToolError, Violation, error_report, panic_message};
pub use file::{Replace, replace_file};
pub use holder::{holder_run_id, holder_run_prefix, run_holder};
pub use interaction::{
    ElicitationAction, ElicitationRequest, ElicitationResponse, LogLevel, LogMessage, LogSink,
    Root, RootsRequest, SamplingRequest, SamplingResponse, UrlElicitationRequest,
};
pub use kind::{PermissionClass, ToolKind};
pub use mark::{MarkedGroup, PROCESS_MARK_VAR, ProcessMark};
pub use output::{ContentPart, ToolOutput, json_kind, json_len};
pub use provider::{
    Health, ProviderHealth, Relayed, ResourceUpdate, ResourceUpdateNotifier, ResourceUpdates,
    Subject, SubjectKind, ToolListChanges, ToolListNotifier, ToolProvider, parse_arguments,
};
pub use result::ToolResult;
pub use spec::{TaskSupport, ToolAnnotations, ToolCall, ToolSpec, schema_for};
pub use toolset::ToolSet;
pub use trace::TraceParent;
pub use unique::unique_token;
pub use url_text::unparsed_url_for_messages;

/// A JSON object: the shape of tool arguments and of `extras`.
pub type JsonObject = serde_json::Map<String, serde_json::Value>;
