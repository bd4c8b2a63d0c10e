//! The client side of a connection as rmcp sees it: who toolmux is, and where server
//! notifications go (progress to the call's sink, list changes to the provider).

use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, ProgressNotificationParam, ProgressToken,
    ProtocolVersion,
};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
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
}

impl Handler {
    pub(crate) fn new(server: &str, events: Arc<Events>) -> Handler {
        Handler { server: server.into(), events }
    }
}

/// What toolmux says about itself in the handshake. The `initialize` path offers
/// 2025-11-25, the newest revision with a handshake, since servers and test suites that
/// predate 2026-07-28 reject that version inside `initialize`.
pub(crate) fn client_info() -> ClientConfig {
    let mut info = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("toolmux", env!("CARGO_PKG_VERSION")),
    );
    info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
    info
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        client_info()
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
