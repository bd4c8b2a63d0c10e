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
//! compiled schema → before-hooks → response cache with single-flight → run budget → rate
//! limit → queue slot → a slot among the provider's calls in flight → timeout (optionally
//! reset by progress, never past a hard cap) with retries for idempotent tools → the
//! provider call → after-hooks (a cached answer's too) →
//! size caps (text spilled to the output store or truncated; media (images, audio, resource
//! blobs) past their own cap left out with a note) → context-token budget → accounting
//! (statistics, audit log, events, tracing). A panic in the provider or in a hook becomes
//! an error of the call, code `panicked`: the provider's is
//! [`ToolError::Panicked`](toolmux_core::ToolError::Panicked), the provider's fault; a
//! hook's is [`ToolError::HookPanicked`](toolmux_core::ToolError::HookPanicked), naming the
//! hook, the gateway's (`Party::Policy`).
//!
//! The [`CallContext`](toolmux_core::CallContext) reaches the provider with the caller's log
//! sink and interaction handler as they are, through every stage (queue, cache, retries,
//! progress wrapping): a tool's log lines go to the caller, and its sampling, elicitation and
//! roots requests are answered by the caller's handler. Only the cancellation token, the
//! deadline, the operation and the progress sink are the pipeline's own. A cacheable tool's
//! output is cached as any other, so a tool whose output depends on the caller's answers
//! should not be marked read-only.
//!
//! # Prompts and resources
//!
//! The orchestrator also serves every provider's prompts and resources, as a provider
//! itself (so a gateway serving it offers them all):
//!
//! - Prompts are named `{namespace}__{prompt}` exactly like tools (sanitized, within the name
//!   budget, duplicates left out with a warning). [`Orchestrator::get_prompt`] routes to the
//!   owning provider under its own name, after checking required arguments; an unknown name
//!   gets the closest names. Prompts are listed at warmup and whenever a client lists them,
//!   and once more before a name is declared unknown. A provider whose listing fails is
//!   logged and skipped. Permission rules, hooks, cache, queues and accounting apply to tool
//!   calls only, not to prompts (rendering a prompt runs no tool).
//! - Resources keep their URIs. A URI listed by two providers belongs to the first (a
//!   warning names both). [`Orchestrator::read_resource`] asks the provider that listed the
//!   URI, else the first whose template matches it, else every provider in turn (remembering
//!   which one answered). Each provider asked is bounded by its timeout (else the default tool
//!   timeout), the caller's deadline and cancellation and [`Orchestrator::cancel`]; text over
//!   the output-size cap is cut like a tool's output, the whole text kept in the output store.
//!   Subscriptions are routed the same way, and [`Orchestrator::resource_updates`] merges every
//!   provider's updates into one stream (forwarding tasks start at warmup, stop at
//!   [`Orchestrator::cleanup`]).
//!
//! A [`FilteredView`] (a sub-agent's tools, or a gateway's) offers the tools whose names
//! match its globs, and the orchestrator's prompts and resources as they are.
//!
//! # tower
//!
//! With the `tower` feature, an [`Orchestrator`] and a [`FilteredView`] are each a
//! `tower::Service` taking a `ToolRequest` (a [`ToolCall`](toolmux_core::ToolCall) and its
//! [`CallContext`](toolmux_core::CallContext)) and answering with the tool's output or the
//! [`ToolError`](toolmux_core::ToolError) of the stage that stopped it, for programs that
//! compose tower middleware around the finished pipeline. The pipeline itself is not built
//! from layers.
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
mod files;
mod glob;
mod hooks;
mod inflight;
mod media;
mod normalize;
mod orchestrator;
mod permission;
pub mod queue;
pub mod ratelimit;
mod redact;
mod registry;
mod sampling;
pub mod search;
#[cfg(feature = "tower")]
mod service;
mod shellwords;
pub mod store;
mod suggest;
mod validate;
mod view;

pub use budget::{RunFlags, estimate_tokens};
pub use config::{
    MAX_HINTED_RESPONSE_BYTES, OrchestratorConfig, OversizeMode, QueueConfig, RateLimit,
    RetryPolicy, RunBudgetConfig, ToolOverride, ToolSettings,
};
pub use events::ToolEvent;
pub use glob::glob_match;
pub use hooks::{
    AfterHook, BeforeHook, CallDisplay, CallEnd, CommandHook, DisplayFuture, DisplayedCall,
    HookEvent, HookExit, HookFailure, InvalidMatcher, ToolMatcher, run_program,
};
pub use orchestrator::{
    Orchestrator, OrchestratorBuilder, OrchestratorError, ProviderReport, WarmupReport,
    WeakOrchestrator,
};
pub use permission::{
    CallRules, Permission, PermissionRules, SELECTORS, check_selectors, rule_matches, split_rule,
};
pub use redact::Redactor;
pub use registry::{MANY_TOOLS, Registry, RegistryProblem, Severity, ToolEntry};
#[cfg(feature = "tower")]
pub use service::{ToolFuture, ToolRequest};
pub use suggest::suggest;
pub use validate::ArgumentValidator;
pub use view::FilteredView;

/// About thirty years (as tokio's own far future): the longest a limit of the pipeline
/// lasts. A longer one, `Duration::MAX` for none, is never reached either, and a deadline
/// that far stays within what the clock can hold.
pub(crate) const FOREVER: std::time::Duration =
    std::time::Duration::from_secs(60 * 60 * 24 * 365 * 30);

/// `at + by`, with `by` held to [`FOREVER`]: a deadline past what the clock can hold
/// panicked (`Duration::MAX` as a timeout).
pub(crate) fn later(at: tokio::time::Instant, by: std::time::Duration) -> tokio::time::Instant {
    at + by.min(FOREVER)
}
