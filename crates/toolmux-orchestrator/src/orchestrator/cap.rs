//! The size cap on what a call failed with: an upstream error message (a tool's error
//! result, a JSON-RPC error turned into a [`ToolError`]) is capped as an output is, so
//! that a server answering with 20 MB of error text does not pass them to the client.

use super::{CallMeta, Orchestrator, cut_within, floor_char_boundary};
use crate::config::OversizeMode;
use crate::registry::ToolEntry;
use std::error::Error as _;
use std::sync::atomic::Ordering;
use toolmux_core::{CallContext, ToolError};

impl Orchestrator {
    /// `error` within the tool's size cap: its message (its whole report when it has
    /// causes or no message of its own, as [`ToolError::Remote`]) redacted, then stored
    /// with its head kept (spill mode) or cut ([`Orchestrator::capped_error_text`]).
    pub(super) async fn bounded_error(
        &self,
        entry: &ToolEntry,
        mut error: ToolError,
        ctx: &CallContext,
        meta: &CallMeta,
    ) -> ToolError {
        let max = self.response_max(entry);
        // Cheap first: most errors are short, and their report is what the caller sees.
        let report = error.report();
        if report.len() <= max {
            return error;
        }
        // The message alone is capped when the rest of the report (the variant's wording)
        // is small beside the cap; otherwise the whole report is, as a remote error.
        let rest = error_message(&mut error).map(|m| report.len() - m.len());
        let has_causes = error.source().is_some();
        let (message, room) = match rest {
            Some(rest) if !has_causes && rest < max / 2 => {
                let message = error_message(&mut error).expect("the variant has a message");
                (message, max - rest)
            }
            _ => {
                error = ToolError::Remote { tool: entry.name.to_string(), message: report };
                let message = error_message(&mut error).expect("a remote error has a message");
                (message, max)
            }
        };
        let text = std::mem::take(message);
        // Redacted before it is cut or stored: a cut through a secret would leave its head.
        let text = self.inner.redactor.redact(&text).into_owned();
        *message = self.capped_error_text(&entry.name, text, room, ctx, meta).await;
        error
    }

    /// `text`, an error's message already redacted, within `max` bytes. In spill mode it is
    /// stored whole and its head kept with a note saying how to read the rest (a model must
    /// see why a call failed, so the handle alone will not do); in truncate mode, or when
    /// the store fails, its head and tail are kept around a note saying how much was left
    /// out, on char boundaries.
    pub(super) async fn capped_error_text(
        &self,
        tool: &str,
        text: String,
        max: usize,
        ctx: &CallContext,
        meta: &CallMeta,
    ) -> String {
        let why = format!("error message over {max} bytes");
        if self.inner.config.oversize == OversizeMode::Truncate {
            return cut_within(&text, max, &why).0;
        }
        let stored = match self.inner.store.store(ctx.run_id(), tool, &text).await {
            Ok(stored) => stored,
            Err(e) => {
                tracing::warn!(tool, "output store failed, cutting the error message instead: {e}");
                return cut_within(&text, max, &why).0;
            }
        };
        meta.spilled.store(true, Ordering::Relaxed);
        let note = |omitted: usize| {
            format!(
                "\n[... {omitted} more {} of this error message ({} in all, over the {max}-byte \
                 cap): it is stored whole; read it by pages with `output__read` and handle `{}`]",
                super::bytes_word(omitted),
                text.len(),
                stored.handle
            )
        };
        // The note is at its longest when the whole text is left out.
        let head = floor_char_boundary(&text, max.saturating_sub(note(text.len()).len()));
        let mut capped = text[..head].to_owned();
        capped.push_str(&note(text.len() - head));
        capped
    }
}

/// The message of `error` that a tool or server wrote, for the variants that hold one.
fn error_message(error: &mut ToolError) -> Option<&mut String> {
    match error {
        ToolError::Remote { message, .. }
        | ToolError::NotFound { message, .. }
        | ToolError::Gone { message, .. }
        | ToolError::Protocol { message, .. }
        | ToolError::Unavailable { message, .. }
        | ToolError::Panicked { message, .. }
        | ToolError::Transport { message, .. }
        | ToolError::Other { message, .. } => Some(message),
        ToolError::Denied { reason, .. } | ToolError::Unsupported { reason, .. } => Some(reason),
        ToolError::InvalidArguments { violations, .. } if violations.len() == 1 => {
            Some(&mut violations[0].message)
        }
        _ => None,
    }
}
