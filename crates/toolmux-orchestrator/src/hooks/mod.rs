//! Before- and after-hooks: code that sees every matching call, may rewrite its arguments
//! or refuse it (before), and may rewrite its output (after); [`CommandHook`] runs a
//! configured program as both, following Claude Code's hook contract. A [`CallDisplay`]
//! shows people the calls of the tools configured so, as they run.

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

/// Shows people the calls of the tools whose settings ask for it
/// ([`crate::ToolSettings::show_in_space`]): told as each such call starts, and, through
/// what it gives back, how the call ended. The facade posts them to the caller's space.
/// Its methods return boxed futures, so that it is implemented without `async-trait`.
pub trait CallDisplay: Send + Sync + fmt::Debug {
    /// The call of `tool` (its full name) with `arguments` (the caller's, the
    /// configuration's secrets redacted) starts: what ends its display, or `None` when it
    /// is not shown (its caller is where nobody sees it, or the display failed, which must
    /// not fail the call). Awaited before the call runs.
    fn start<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a Value,
        ctx: &'a CallContext,
    ) -> DisplayFuture<'a, Option<Box<dyn DisplayedCall>>>;
}

/// The future of a [`CallDisplay`]'s or a [`DisplayedCall`]'s method.
pub type DisplayFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A call being shown ([`CallDisplay::start`]). Dropped without [`DisplayedCall::end`]
/// (its caller stopped waiting for the call), it shows the call cancelled.
pub trait DisplayedCall: Send + fmt::Debug {
    /// Shows how the call ended; awaited before its caller gets the result.
    fn end<'a>(self: Box<Self>, end: CallEnd<'a>) -> DisplayFuture<'a, ()>;
}

/// How a shown call ended.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum CallEnd<'a> {
    /// The tool answered (with an output marked as an error too): the output as its
    /// caller gets it, within the size caps, the configuration's secrets redacted.
    Answered(&'a ToolOutput),
    /// The call failed: the error's report, the configuration's secrets redacted.
    Failed(&'a str),
    /// The call was cancelled before it ended.
    Cancelled,
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
