//! Relayed calls ([`ToolProvider::relay`]): the pipeline of [`Orchestrator::call_tool`] for
//! a gateway that has the call's arguments as JSON text and wants the result as the
//! server wrote it.
//!
//! A gateway in front of MCP servers spends most of a call's time decoding and encoding:
//! the client's request into values, the values into the server's request, the server's
//! answer into values and those into the client's answer. A relayed call still has its
//! arguments decoded once, for validation and permission rules, but the request the
//! server gets is spliced from the text the client sent, and a plain result comes back as
//! the server wrote it. Every stage runs as for any call (lookup, permission, validation,
//! rate limit, queue slot, timeout, cancellation, size cap, accounting); a tool is relayed
//! only while no stage needs more: no hooks (they may rewrite arguments or outputs), no
//! cache, no retries, no secrets to redact, no run budgets, no audit log and nobody
//! listening to events. Otherwise [`Orchestrator::relays`] says no and the gateway calls
//! the tool as usual.

use super::{CallMeta, InFlight, Orchestrator, Outcome, Unrecorded};
use crate::permission::Permission;
use crate::registry::ToolEntry;
use std::borrow::Cow;
use std::sync::Arc;
use tokio::time::Instant;
use toolmux_core::{CallContext, Op, Relayed, ToolError};

impl Orchestrator {
    /// Whether calls of `name` may be relayed now (see the module's documentation).
    pub fn relays(&self, name: &str) -> bool {
        self.registry().get(name).is_some_and(|entry| self.relayable(entry))
    }

    /// Whether calls of `entry` may be relayed now.
    fn relayable(&self, entry: &ToolEntry) -> bool {
        let inner = &self.inner;
        inner.before.is_empty()
            && inner.after.is_empty()
            && inner.redactor.is_empty()
            && inner.audit.is_none()
            && !self.tracks_runs()
            && entry.settings.cache_ttl.is_none()
            && entry.settings.retry.is_none()
            && !entry.passes_on
            && !matches!(entry.permission, Permission::Deny(_))
            && inner.events.receiver_count() == 0
            && entry.provider.relays(&entry.original)
    }

    /// Calls `name` with its arguments as JSON text (see the module's documentation); a
    /// raw result is at most `raw_max` bytes, and within the tool's size cap. A tool that
    /// may not be relayed now is called as [`Orchestrator::call_tool`] calls it, the
    /// arguments decoded.
    pub async fn relay_tool(
        &self,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<Relayed, ToolError> {
        let started = Instant::now();
        let _in_flight = InFlight::enter(&self.inner.in_flight);
        let entry = self.registry().get(name).filter(|entry| self.relayable(entry)).cloned();
        let Some(entry) = entry else {
            // The usual path, which also names an unknown tool.
            let arguments = toolmux_core::parse_arguments(name, arguments)?;
            return Box::pin(self.call_tool(name, arguments, ctx)).await.map(Relayed::Output);
        };
        let op = Op::new(entry.name.clone(), ctx.op().cloned());
        let meta = CallMeta::default();
        let record = Unrecorded {
            orchestrator: self,
            tool: &entry.name,
            entry: Some(&entry),
            ctx,
            op: &op,
            meta: &meta,
            started,
            chars_in: 0,
            audit_args: None,
            recorded: false,
        };
        let result = match self.relayed(&entry, arguments, ctx, &op, &meta, raw_max).await {
            Err(error) => Err(self.bounded_error(&entry, error, ctx, &meta).await),
            done => done,
        };
        let outcome = match &result {
            Ok(Relayed::Raw { json, is_error }) => Ok(Outcome::Raw { json, is_error: *is_error }),
            Ok(Relayed::Output(output)) => Ok(Outcome::Output(output)),
            Err(error) => Err(error),
        };
        record.finish(outcome);
        result
    }

    /// The stages of [`Orchestrator::managed`] and [`Orchestrator::downstream`] a relayed
    /// call passes.
    async fn relayed<'c>(
        &self,
        entry: &Arc<ToolEntry>,
        arguments: &str,
        ctx: &'c CallContext,
        op: &Arc<Op>,
        meta: &CallMeta,
        raw_max: usize,
    ) -> Result<Relayed, ToolError> {
        let value = toolmux_core::parse_arguments(&entry.name, arguments)?;
        self.admit(entry, &value, ctx).await?;
        drop(value);
        let generation = self.inner.generation.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // The turn first, then the slot, as `downstream` takes them (and why).
        let turn = if self.inner.rate_limits.tools.is_empty()
            && self.inner.rate_limits.providers.is_empty()
        {
            super::UnusedTurn(None)
        } else {
            self.take_turn(entry, ctx, meta, &generation, None).await?
        };
        let _slot = self.take_slot(entry, ctx, op, meta, &generation).await?;
        let _provider_slot = self.take_provider_slot(entry, ctx, op, meta, &generation).await?;
        turn.used();
        meta.attempts.store(1, std::sync::atomic::Ordering::Relaxed);
        // A raw result is text blocks only, each no longer than the whole: within the
        // cap, its text is too.
        let raw_max = raw_max.min(self.response_max(entry));
        // Its timeout counts its waits for its turn and slots, as a call's does.
        let (queued, turn) = meta.waits();
        let limits = super::CallLimits { run_deadline: None, queued, turn, retry: None };
        let call = |provider_ctx: Cow<'c, CallContext>| async move {
            entry.provider.relay(&entry.original, arguments, &provider_ctx, raw_max).await
        };
        // A relaying provider stops when dropped, so unless progress is watched or sampling
        // falls back to the orchestrator's model, it gets the caller's context as it is.
        let lean = self.inner.sampler.is_none() && !entry.settings.reset_on_progress;
        match self.timed(entry, ctx, op, &generation, limits, lean, call).await? {
            Relayed::Output(output) => {
                Ok(Relayed::Output(self.bounded_output(entry, output, ctx, meta).await?))
            }
            raw => Ok(raw),
        }
    }
}

impl Outcome<'_> {
    pub(super) fn is_error(&self) -> bool {
        match self {
            Outcome::Output(output) => output.is_error,
            Outcome::Raw { is_error, .. } => *is_error,
        }
    }

    /// The result as text, for logs and records.
    pub(super) fn text(&self) -> String {
        match self {
            Outcome::Output(output) => output.to_text(),
            Outcome::Raw { json, .. } => (*json).to_owned(),
        }
    }
}
