//! The toolmux call pipeline: every tool of every provider behind one [`Orchestrator`] that
//! names, validates, permits, queues, times out, caches, caps, budgets and accounts every
//! call the same way.
//!
//! It is for programs that give tools to models (agents, gateways). It knows no concrete
//! provider: providers arrive as `Arc<dyn ToolProvider>`.
//!
//! # The pipeline
//!
//! Each call goes, in order, through: alias and lookup (unknown names get the closest
//! existing ones) → permission rules (allow / deny / ask) → argument validation against the
//! compiled schema → before-hooks → response cache with single-flight → run budget → queue
//! slot → timeout (optionally reset by progress, never past a hard cap) with retries for
//! idempotent tools → the provider call (a panic becomes an error) → after-hooks → size cap
//! (spill to the output store, or truncate) → context-token budget → accounting (statistics,
//! audit log, events, tracing).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use toolmux_core::{CallContext, ToolCall, ToolKind, ToolOutput, ToolSet, ToolSpec};
//! use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, QueueConfig, ToolSettings};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let echo = ToolSet::new("demo", ToolKind::Builtin).with_tool(
//!     ToolSpec::new("echo", "Echo the arguments", serde_json::json!({
//!         "type": "object",
//!         "properties": {"text": {"type": "string"}},
//!         "required": ["text"]
//!     })),
//!     |args, _ctx| async move { Ok(ToolOutput::json(args)) },
//! );
//! let config = OrchestratorConfig::default()
//!     .with_queue("demo", QueueConfig::new(4))
//!     .with_provider_settings("demo", ToolSettings::default().with_queue("demo"));
//! let orchestrator = Orchestrator::builder(config).provider(Arc::new(echo)).build().unwrap();
//! assert!(orchestrator.warmup().await.is_ok());
//!
//! let ok = orchestrator
//!     .execute(ToolCall::new("demo__echo", serde_json::json!({"text": "hi"})), &CallContext::new())
//!     .await;
//! assert_eq!(ok.result.as_deref(), Some(r#"{"text":"hi"}"#));
//!
//! let bad = orchestrator
//!     .execute(ToolCall::new("demo__echo", serde_json::json!({})), &CallContext::new())
//!     .await;
//! assert_eq!(bad.error.as_deref(), Some(r#"invalid arguments for `demo__echo`: at /: "text" is a required property"#));
//! # });
//! ```
#![deny(missing_docs)]

pub mod accounting;
mod budget;
pub mod cache;
mod catalog;
mod config;
mod events;
mod glob;
mod hooks;
mod orchestrator;
mod permission;
pub mod queue;
mod redact;
mod registry;
pub mod store;
mod suggest;
mod validate;
mod view;

pub use budget::{RunFlags, estimate_tokens};
pub use config::{
    OrchestratorConfig, OversizeMode, QueueConfig, RetryPolicy, RunBudgetConfig, ToolSettings,
};
pub use events::ToolEvent;
pub use glob::glob_match;
pub use hooks::{AfterHook, BeforeHook};
pub use orchestrator::{
    Orchestrator, OrchestratorBuilder, OrchestratorError, ProviderReport, WarmupReport,
};
pub use permission::{Permission, PermissionRules};
pub use redact::Redactor;
pub use registry::{Registry, RegistryProblem, Severity, ToolEntry};
pub use validate::ArgumentValidator;
pub use view::FilteredView;
