//! The finished pipeline as a [`tower_service::Service`] (feature `tower`).
//!
//! The pipeline itself is one ordered function over its stages, not a stack of layers (see
//! ARCHITECTURE.md); this is only the door for programs built on tower: an [`Orchestrator`]
//! or a [`FilteredView`] takes a [`ToolRequest`] and answers with the tool's
//! [`ToolOutput`], or the [`ToolError`] of the stage that refused or failed the call.
//!
//! `poll_ready` is always ready. The orchestrator's own limits (queues, rate limits,
//! budgets) belong to a tool or a provider, so they are known only once the request names
//! the tool, and they are applied inside the call, each with its own wait and error. A
//! program that wants backpressure for the whole service wraps it in tower's
//! `ConcurrencyLimit` or `Buffer`; a `Timeout` layer drops the call's future, which
//! cancels the call as any dropped call is cancelled (its queue slot released, its child
//! process reaped).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::Value;
use toolmux_core::{CallContext, ToolCall, ToolError, ToolOutput, ToolProvider};
use tower_service::Service;

use crate::{FilteredView, Orchestrator};

/// One call for the [`Service`]: the tool's name and arguments, and the context it runs in
/// (run id, deadline, cancellation, progress and log sinks, interaction handler).
///
/// # Example
///
/// The orchestrator under tower's own middleware: a service-wide limit of four calls at a
/// time and a timeout of a minute, whose expiry cancels the call.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use toolmux_core::{ToolKind, ToolOutput, ToolSet, ToolSpec};
/// use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, ToolRequest};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let echo = ToolSet::new("demo", ToolKind::Builtin).with_tool(
///     ToolSpec::new("echo", "Echo the arguments", serde_json::json!({"type": "object"})),
///     |args, _ctx| async move { Ok(ToolOutput::json(args)) },
/// );
/// let orchestrator = Orchestrator::builder(OrchestratorConfig::default())
///     .provider(Arc::new(echo))
///     .build()
///     .unwrap();
/// orchestrator.warmup().await;
///
/// let service = ServiceBuilder::new()
///     .concurrency_limit(4)
///     .timeout(Duration::from_secs(60))
///     .service(orchestrator);
/// let request = ToolRequest::new("demo__echo", serde_json::json!({"text": "hi"}));
/// let output = service.oneshot(request).await.unwrap();
/// assert_eq!(output.to_text(), r#"{"text":"hi"}"#);
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The tool, its arguments, and the caller's id for the call (echoed in events).
    pub call: ToolCall,
    /// The context the call runs in; [`CallContext::new`] when made from a [`ToolCall`].
    pub ctx: CallContext,
}

impl ToolRequest {
    /// A call of `name` with `arguments` in a fresh context.
    pub fn new(name: impl Into<String>, arguments: Value) -> ToolRequest {
        ToolRequest::from(ToolCall::new(name, arguments))
    }

    /// The request, run in `ctx` (a run id and its budget, a deadline, a cancellation
    /// token, sinks for progress and log lines).
    #[must_use]
    pub fn with_context(mut self, ctx: CallContext) -> ToolRequest {
        self.ctx = ctx;
        self
    }

    /// The context to run in: the caller's id of the call reaches it, as for
    /// [`Orchestrator::execute`], unless the context has one already.
    fn into_parts(self) -> (String, Value, CallContext) {
        let ToolRequest { call, ctx } = self;
        let ctx = match call.id {
            Some(id) if ctx.call_id().is_none() => ctx.with_call_id(id),
            _ => ctx,
        };
        (call.name, call.arguments, ctx)
    }
}

impl From<ToolCall> for ToolRequest {
    fn from(call: ToolCall) -> ToolRequest {
        ToolRequest { call, ctx: CallContext::new() }
    }
}

/// What the services' `call` returns: owned, so the future outlives the service it came
/// from (tower's `Buffer` and `oneshot` need that).
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send>>;

/// The `Service` of a provider that is cheap to clone and runs calls through the
/// orchestrator's pipeline: the future owns its clone.
macro_rules! tool_service {
    ($provider:ty) => {
        impl Service<ToolRequest> for $provider {
            type Response = ToolOutput;
            type Error = ToolError;
            type Future = ToolFuture;

            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ToolError>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, request: ToolRequest) -> ToolFuture {
                let provider = self.clone();
                Box::pin(async move {
                    let (name, arguments, ctx) = request.into_parts();
                    ToolProvider::call(&provider, &name, arguments, &ctx).await
                })
            }
        }
    };
}

// The whole pipeline.
tool_service!(Orchestrator);
// The view's tools only, through the orchestrator's pipeline: a tool outside the view is
// unknown, with no names suggested from outside it.
tool_service!(FilteredView);
