//! The client side of a connection as rmcp sees it: who toolmux is, and where server
//! notifications go (progress to the call's sink, list changes to the provider).

use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, ProgressNotificationParam, ProgressToken,
    ProtocolVersion,
};
use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ClientHandler, ErrorData, RoleClient};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use toolmux_core::{Progress, ProgressSink};

/// Where a running call's progress goes.
#[derive(Debug, Clone)]
pub(crate) struct ProgressRoute {
    /// The caller's sink, if it listens.
    pub(crate) sink: Option<ProgressSink>,
    /// Woken on every report, to reset the call's idle timeout.
    pub(crate) activity: Arc<Notify>,
}

/// Server events shared between the handler of each connection and the provider.
#[derive(Debug, Default)]
pub(crate) struct Events {
    progress: Mutex<HashMap<ProgressToken, ProgressRoute>>,
    /// Woken when the server says its tool list changed.
    pub(crate) tools_changed: Notify,
}

impl Events {
    /// Routes progress for `token` until [`Events::unroute`].
    pub(crate) fn route(&self, token: ProgressToken, route: ProgressRoute) {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).insert(token, route);
    }

    /// Stops routing progress for `token`.
    pub(crate) fn unroute(&self, token: &ProgressToken) {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).remove(token);
    }

    fn deliver(&self, params: ProgressNotificationParam) {
        let route = self
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&params.progress_token)
            .cloned();
        let Some(route) = route else { return };
        route.activity.notify_one();
        if let Some(sink) = route.sink {
            let mut progress = Progress::new(params.progress, params.total);
            progress.message = params.message;
            sink.report(progress);
        }
    }
}

/// The rmcp client handler of one connection.
#[derive(Debug, Clone)]
pub(crate) struct Handler {
    server: Arc<str>,
    events: Arc<Events>,
    /// Answer form elicitations with the schema's defaults (`acceptElicitationDefaults`).
    elicitation_defaults: bool,
}

impl Handler {
    pub(crate) fn new(server: &str, events: Arc<Events>, elicitation_defaults: bool) -> Handler {
        Handler { server: server.into(), events, elicitation_defaults }
    }
}

/// The answer to a form elicitation for an unattended client: every field that has a
/// default gets it; a required field without one means nobody can answer, so decline.
pub(crate) fn answer_with_defaults(schema: &serde_json::Value) -> ElicitResult {
    let properties = schema.get("properties").and_then(serde_json::Value::as_object);
    let mut content = serde_json::Map::new();
    for (name, property) in properties.into_iter().flatten() {
        if let Some(default) = property.get("default") {
            content.insert(name.clone(), default.clone());
        }
    }
    let required = schema.get("required").and_then(serde_json::Value::as_array);
    let missing = required
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .any(|name| !content.contains_key(name));
    if missing {
        return ElicitResult::new(ElicitationAction::Decline);
    }
    let mut result = ElicitResult::new(ElicitationAction::Accept);
    result.content = Some(serde_json::Value::Object(content));
    result
}

/// What toolmux says about itself in the handshake. The `initialize` path offers
/// 2025-11-25, the newest revision with a handshake, since servers and test suites that
/// predate 2026-07-28 reject that version inside `initialize`.
pub(crate) fn client_info(elicitation: bool) -> ClientConfig {
    let mut capabilities = ClientCapabilities::default();
    if elicitation {
        capabilities.elicitation = Some(ElicitationCapability::default());
    }
    let mut info =
        ClientConfig::new(capabilities, Implementation::new("toolmux", env!("CARGO_PKG_VERSION")));
    info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
    info
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        client_info(self.elicitation_defaults)
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let ElicitRequestParams::FormElicitationParams { requested_schema, .. } = request else {
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        };
        if !self.elicitation_defaults {
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        }
        let schema = serde_json::to_value(requested_schema).unwrap_or_default();
        let answer = answer_with_defaults(&schema);
        tracing::debug!(server = %self.server, action = ?answer.action, "elicitation answered with defaults");
        Ok(answer)
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.events.deliver(params);
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.server, "tools/list_changed");
        self.events.tools_changed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_answer_an_elicitation_when_every_required_field_has_one() {
        let schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string", "default": "John"}, "age": {"type": "integer"}},
            "required": ["name"]
        });
        let answer = answer_with_defaults(&schema);
        assert_eq!(answer.action, ElicitationAction::Accept);
        assert_eq!(answer.content, Some(json!({"name": "John"})));
        let schema = json!({"properties": {"age": {"type": "integer"}}, "required": ["age"]});
        assert_eq!(answer_with_defaults(&schema).action, ElicitationAction::Decline);
    }
}
