//! The run's inbox of asynchronous external calls' results, as sessions and listening
//! agents read it: through the pipeline, with an answer the size cap stored read back
//! whole, and what arrived handed to the model in portions within that cap.

use serde_json::{Value, json};
use std::collections::VecDeque;
use toolmux_core::{CallContext, ToolCall};
use toolmux_orchestrator::Orchestrator;

/// The external tools' inbox (`toolmux-external`), where the results of asynchronous calls
/// arrive, taken out once read.
pub(crate) const EXTERNAL_INBOX: &str = "external__inbox";

/// What one read of the inbox took out.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    /// The results, oldest first.
    pub(crate) results: Vec<Value>,
    /// How many calls still wait for their result.
    pub(crate) still_pending: u64,
}

/// Takes what arrived in the run's inbox, through the pipeline as the caller's
/// bookkeeping (outside the run's budget). The inbox gives each result once, so an answer
/// over the size cap, which the pipeline stores and answers with a handle, is read back
/// from the output store whole: taken out, its results would otherwise be lost. Fails with
/// what went wrong when the inbox cannot be read (nothing was taken out then, or what was
/// cannot be read back).
pub(crate) async fn take(orchestrator: &Orchestrator, ctx: &CallContext) -> Result<Taken, String> {
    let ctx = ctx.child().outside_budget();
    let read = orchestrator.execute(ToolCall::new(EXTERNAL_INBOX, json!({})), &ctx).await;
    if !read.ok {
        return Err(read.conversation_text());
    }
    let spilled = read.extras.get("spilled").and_then(|s| s.get("handle")).and_then(Value::as_str);
    let text = match spilled {
        Some(handle) => match orchestrator.read_output(handle, 0, u64::MAX).await {
            Ok(page) => page.text,
            Err(e) => {
                return Err(format!(
                    "the inbox's answer was stored for its size, as `{handle}`, and could not \
                     be read back: {e}"
                ));
            }
        },
        None => read.conversation_text(),
    };
    let answer: Value = serde_json::from_str(&text).map_err(|e| {
        format!("`{EXTERNAL_INBOX}` answered with what is not its JSON ({e}): is its output cut?")
    })?;
    Ok(Taken {
        results: answer.get("results").and_then(Value::as_array).cloned().unwrap_or_default(),
        still_pending: answer.get("stillPending").and_then(Value::as_u64).unwrap_or(0),
    })
}

/// The results at the front of `arrived` whose JSON together stays within `max_bytes`
/// (always the first, however large), taken out: one message to the model holds no more
/// than a tool's output may, and the rest follow in later ones.
pub(crate) fn portion(arrived: &mut VecDeque<Value>, max_bytes: usize) -> Vec<Value> {
    let mut taken = Vec::new();
    // The brackets of the array and a comma between results.
    let mut bytes = 2;
    while let Some(next) = arrived.front() {
        let size = toolmux_core::json_len(next) + usize::from(!taken.is_empty());
        if !taken.is_empty() && bytes + size > max_bytes {
            break;
        }
        bytes += size;
        taken.extend(arrived.pop_front());
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_portion_stays_within_the_cap_and_always_takes_one() {
        let mut arrived: VecDeque<Value> =
            ["aaaa", "bbbb", "cccccccccccccccccccc", "d"].into_iter().map(Value::from).collect();
        // `["aaaa","bbbb"]` is 15 bytes.
        assert_eq!(portion(&mut arrived, 15), vec![json!("aaaa"), json!("bbbb")]);
        // Larger than the cap alone: taken all the same.
        assert_eq!(portion(&mut arrived, 15), vec![json!("cccccccccccccccccccc")]);
        assert_eq!(portion(&mut arrived, 15), vec![json!("d")]);
        assert!(portion(&mut arrived, 15).is_empty());
    }
}
