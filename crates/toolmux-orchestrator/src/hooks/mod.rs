//! Before- and after-hooks: code that sees every matching call, may rewrite its arguments
//! or refuse it (before), and may rewrite its output (after); [`CommandHook`] runs a
//! configured program as both, following Claude Code's hook contract.

mod command;

pub use command::{
    CommandHook, HookEvent, HookExit, HookFailure, InvalidMatcher, ToolMatcher, run_program,
};

use async_trait::async_trait;
use serde_json::Value;
use std::fmt;
use std::sync::Arc;
use toolmux_core::{CallContext, ToolError, ToolOutput};

/// Runs before a call, after validation. Rewritten arguments are validated again. A hook
/// that panics fails the call (not its caller) with [`ToolError::HookPanicked`] naming the
/// hook (the gateway's fault, `Party::Policy`, not the provider's).
#[async_trait]
pub trait BeforeHook: Send + Sync + fmt::Debug {
    /// Inspects or rewrites `arguments`; an `Err` (usually [`ToolError::Denied`]) refuses the call.
    async fn before(
        &self,
        tool: &str,
        arguments: &mut Value,
        ctx: &CallContext,
    ) -> Result<(), ToolError>;
}

/// Runs after every successful call, before the size cap: one answered from the response
/// cache (or by an identical call in flight) too, so the cache holds outputs as the
/// provider gave them. A hook that panics fails the call with [`ToolError::HookPanicked`]
/// naming the hook.
#[async_trait]
pub trait AfterHook: Send + Sync + fmt::Debug {
    /// Inspects or rewrites `output`.
    async fn after(
        &self,
        tool: &str,
        output: &mut ToolOutput,
        ctx: &CallContext,
    ) -> Result<(), ToolError>;
}

/// A hook with the glob of tool names it applies to.
#[derive(Debug, Clone)]
pub(crate) struct Scoped<H: ?Sized> {
    pub pattern: String,
    pub hook: Arc<H>,
}

impl<H: ?Sized> Scoped<H> {
    pub fn applies_to(&self, tool: &str) -> bool {
        crate::glob::glob_match(&self.pattern, tool)
    }
}
