//! The log lines code gives while it runs, kept as text for a test to check.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

/// Runs `f` under a tracing subscriber of its own on this thread and returns what `f`
/// returned with the events it gave, one line each: the level, then each field as
/// `name=value` (the message first, unquoted; other strings quoted), such as
/// `WARN message=the list is cut server="srv"`.
///
/// Only events on this thread are kept, so `f` should drive any future it makes itself
/// (`futures::executor::block_on`) rather than hand it to a runtime's other threads.
pub fn captured_logs<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    let kept = Kept::default();
    let lines = kept.0.clone();
    let value = tracing::subscriber::with_default(kept, f);
    let lines = std::mem::take(&mut *lines.lock().unwrap_or_else(|e| e.into_inner()));
    (value, lines)
}

/// A subscriber that keeps each event as a line of text and ignores spans.
#[derive(Debug, Default)]
struct Kept(Arc<Mutex<Vec<String>>>);

/// Writes an event's fields onto a line.
struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        // Writing to a String cannot fail.
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for Kept {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Fields(&mut line));
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::captured_logs;

    #[test]
    fn events_on_this_thread_are_kept_in_order() {
        let (value, lines) = captured_logs(|| {
            tracing::warn!(server = "srv", "the list is cut after {} pages", 3);
            tracing::debug!(count = 2, "two");
            7
        });
        assert_eq!(value, 7);
        assert_eq!(
            lines,
            [
                r#"WARN message=the list is cut after 3 pages server="srv""#,
                "DEBUG message=two count=2",
            ]
        );
        let (_, none) = captured_logs(|| ());
        assert!(none.is_empty(), "{none:?}");
    }
}
