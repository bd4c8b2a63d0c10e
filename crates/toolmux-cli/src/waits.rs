//! A line at the terminal while the model client waits to send a request again (a
//! `Retry-After` of 20 s looked like a hang). toolmux-llm says so only in its log, as a
//! debug event (`retrying the model request`, with `wait_ms`) after the failure it retries
//! (`model request failed`, with the HTTP `status`): this layer reads those two events,
//! whatever the log's own level, and hands the line to the screen [`show_with`] set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// Where the lines go: the running agent's screen, set by the command at a terminal.
type Notice = Arc<dyn Fn(&str) + Send + Sync>;

static NOTICE: OnceLock<Notice> = OnceLock::new();

/// Shows each wait of the model client through `notice` from now on (the first call only:
/// one screen per process).
pub(crate) fn show_with(notice: impl Fn(&str) + Send + Sync + 'static) {
    let _ = NOTICE.set(Arc::new(notice));
}

/// The log layer that turns toolmux-llm's retry events into lines ([`show_with`]).
#[derive(Debug, Default)]
pub(crate) struct ModelWaits {
    /// The HTTP status of each model's last failed request, to say why it waits.
    statuses: Mutex<HashMap<String, u64>>,
}

/// The events' messages this layer reads, as toolmux-llm's `http.rs` writes them.
const FAILED: &str = "model request failed";
const RETRYING: &str = "retrying the model request";

/// The fields of one event this layer reads.
#[derive(Debug, Default)]
struct Fields {
    message: String,
    model: String,
    status: Option<u64>,
    wait_ms: Option<u64>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "model" => self.model = format!("{value:?}"),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => value.clone_into(&mut self.message),
            "model" => value.clone_into(&mut self.model),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "status" => self.status = Some(value),
            "wait_ms" => self.wait_ms = Some(value),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ModelWaits {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let Some(notice) = NOTICE.get() else { return };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        if fields.message == FAILED {
            match fields.status {
                Some(status) => statuses.insert(fields.model, status),
                None => statuses.remove(&fields.model),
            };
            return;
        }
        if fields.message != RETRYING {
            return;
        }
        let status = statuses.remove(&fields.model);
        drop(statuses);
        let Some(wait_ms) = fields.wait_ms else { return };
        // A backoff under a second passes unnoticed; a line for it would be noise.
        if wait_ms < 1000 {
            return;
        }
        let why = match status {
            Some(429) => " (rate limited)".to_owned(),
            Some(status) => format!(" (it answered HTTP {status})"),
            None => " (its request failed)".to_owned(),
        };
        notice(&format!("waiting {}s for the model API{why}", wait_ms.div_ceil(1000)));
    }
}
