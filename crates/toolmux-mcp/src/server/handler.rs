//! The MCP server handler: one instance per session (per request for stateless
//! 2026-07-28 HTTP requests), all sharing one provider, listing cache and options.

use super::ServeOptions;
use super::convert;
use super::names::NameMap;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use toolmux_core::{CallContext, Progress, ProgressSink, ToolError, ToolOutput, ToolProvider};

/// What every session of one server shares.
#[derive(Debug)]
pub(crate) struct Shared {
    provider: Arc<dyn ToolProvider>,
    options: ServeOptions,
    info: ServerConfig,
    /// The last listing, refreshed on every first page and on calls of unknown names.
    listing: Mutex<Option<Arc<Listing>>>,
    /// Distinguishes the run ids of this server's sessions.
    sessions: AtomicU64,
    /// Distinguishes servers in one process, so run ids stay unique across them.
    server_id: u64,
}

/// One listing of the provider's tools, as served.
#[derive(Debug)]
struct Listing {
    /// Visible tools in provider order, under their served names.
    tools: Vec<Tool>,
    /// Served names (hidden tools included) and where they route.
    names: NameMap,
}

static NEXT_SERVER: AtomicU64 = AtomicU64::new(1);

impl Shared {
    pub(crate) fn new(provider: Arc<dyn ToolProvider>, options: ServeOptions) -> Arc<Shared> {
        // Prompts and resources are declared, and served as empty lists, so that clients
        // asking for them get an answer the capabilities explain (toolmux serves tools only);
        // `logging/setLevel` is accepted, though no provider logs through MCP yet.
        let mut capabilities = ServerCapabilities::builder()
            .enable_prompts()
            .enable_resources()
            .enable_tools()
            .build();
        capabilities.logging = Some(Default::default());
        if provider.tool_list_changes().is_some()
            && let Some(tools) = capabilities.tools.as_mut()
        {
            tools.list_changed = Some(true);
        }
        let mut info = ServerConfig::new(capabilities).with_server_info(Implementation::new(
            options.server_name.clone(),
            options.server_version.clone(),
        ));
        if let Some(instructions) = options.instructions.clone().or_else(|| provider.instructions())
        {
            info = info.with_instructions(instructions);
        }
        Arc::new(Shared {
            provider,
            options,
            info,
            listing: Mutex::new(None),
            sessions: AtomicU64::new(0),
            server_id: NEXT_SERVER.fetch_add(1, Ordering::Relaxed),
        })
    }

    pub(crate) fn options(&self) -> &ServeOptions {
        &self.options
    }

    fn cached_listing(&self) -> Option<Arc<Listing>> {
        self.listing.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn forget_listing(&self) {
        *self.listing.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    async fn refresh_listing(&self) -> Result<Arc<Listing>, ToolError> {
        let specs = self.provider.list_tools().await?;
        let names = NameMap::new(
            specs.iter().map(|s| s.name.as_str()),
            self.options.name_prefix.as_deref(),
        );
        let tools = specs
            .iter()
            .zip(names.pairs())
            .filter(|(spec, _)| spec.annotations.visible)
            .map(|(spec, (served, _))| convert::tool(spec, served))
            .collect();
        let listing = Arc::new(Listing { tools, names });
        *self.listing.lock().unwrap_or_else(|e| e.into_inner()) = Some(listing.clone());
        Ok(listing)
    }

    /// The local name a served name routes to. Names are passed on unchanged unless a
    /// prefix budget made the server serve them differently.
    async fn local_name(&self, served: &str) -> String {
        if self.options.name_prefix.is_none() {
            return served.to_owned();
        }
        let listing = match self.cached_listing() {
            Some(listing) if listing.names.contains(served) => listing,
            // A name not seen yet: the list may have changed since it was last read.
            _ => match self.refresh_listing().await {
                Ok(listing) => listing,
                Err(_) => return served.to_owned(),
            },
        };
        listing.names.local(served).unwrap_or(served).to_owned()
    }
}

/// The handler of one MCP session.
#[derive(Debug, Clone)]
pub(crate) struct Gateway {
    shared: Arc<Shared>,
    run_id: Arc<str>,
    /// Cancelled when the last clone of this session's handler is dropped, which ends the
    /// session's list-changed forwarder.
    session: CancellationToken,
    _session_guard: Arc<DropGuard>,
}

impl Gateway {
    pub(crate) fn new(shared: Arc<Shared>) -> Gateway {
        let n = shared.sessions.fetch_add(1, Ordering::Relaxed) + 1;
        let run_id: Arc<str> = Arc::from(format!("mcp-{}-{n}", shared.server_id));
        let session = CancellationToken::new();
        let guard = Arc::new(session.clone().drop_guard());
        Gateway { shared, run_id, session, _session_guard: guard }
    }

    async fn run_call(
        &self,
        name: &str,
        arguments: Value,
        ctx: CallContext,
        progress: Option<(ProgressToken, Peer<RoleServer>)>,
    ) -> Result<ToolOutput, ToolError> {
        let provider = &self.shared.provider;
        let Some((token, peer)) = progress else {
            return provider.call(name, arguments, &ctx).await;
        };
        // The sink must return at once, so reports go through a channel; they are sent
        // from here, before the result, so that none arrives after the response.
        let (tx, mut rx) = mpsc::unbounded_channel::<Progress>();
        let ctx = ctx.with_progress(ProgressSink::new(move |p| {
            let _ = tx.send(p);
        }));
        let mut last = f64::NEG_INFINITY;
        let call = provider.call(name, arguments, &ctx);
        tokio::pin!(call);
        let result = loop {
            tokio::select! {
                biased;
                result = &mut call => break result,
                Some(progress) = rx.recv() => {
                    send_progress(&peer, &token, progress, &mut last).await;
                }
            }
        };
        while let Ok(progress) = rx.try_recv() {
            send_progress(&peer, &token, progress, &mut last).await;
        }
        result
    }
}

/// Sends one report; reports that do not increase are dropped, as MCP requires progress
/// to increase with every notification.
async fn send_progress(
    peer: &Peer<RoleServer>,
    token: &ProgressToken,
    progress: Progress,
    last: &mut f64,
) {
    if progress.progress <= *last {
        return;
    }
    *last = progress.progress;
    let mut param = ProgressNotificationParam::new(token.clone(), progress.progress);
    if let Some(total) = progress.total {
        param = param.with_total(total);
    }
    if let Some(message) = progress.message {
        param = param.with_message(message);
    }
    if let Err(error) = peer.notify_progress(param).await {
        tracing::debug!(%error, "progress notification not delivered");
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        self.shared.info.clone()
    }

    #[expect(deprecated, reason = "clients of the handshake revisions still send logging/setLevel")]
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    /// No resource exists: the answer MCP specifies for an unknown URI.
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri;
        Err(ErrorData::resource_not_found(
            format!("resource not found: {uri}"),
            Some(serde_json::json!({ "uri": uri })),
        ))
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let cursor = request.and_then(|r| r.cursor);
        let listing = match (&cursor, self.shared.cached_listing()) {
            // Later pages read the listing the first page made, so pages fit together.
            (Some(_), Some(listing)) => listing,
            _ => self.shared.refresh_listing().await.map_err(|error| {
                ErrorData::internal_error(format!("cannot list tools: {}", error.report()), None)
            })?,
        };
        let start = match &cursor {
            None => 0,
            Some(cursor) => {
                cursor.parse::<usize>().ok().filter(|&at| at <= listing.tools.len()).ok_or_else(
                    || ErrorData::invalid_params(format!("invalid cursor `{cursor}`"), None),
                )?
            }
        };
        let page_size = self.shared.options.page_size.max(1);
        let end = listing.tools.len().min(start.saturating_add(page_size));
        let mut result = ListToolsResult::with_all_items(listing.tools[start..end].to_vec());
        if end < listing.tools.len() {
            result.next_cursor = Some(end.to_string());
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = self.shared.local_name(&request.name).await;
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let ctx = CallContext::new()
            .with_cancel(context.ct.clone())
            .with_run_id(self.run_id.clone())
            .with_call_id(context.id.to_string());
        let token = context
            .meta
            .get_progress_token()
            .or_else(|| request.meta.as_ref().and_then(|m| m.get_progress_token()));
        let progress = token.map(|token| (token, context.peer.clone()));
        match self.run_call(&name, arguments, ctx, progress).await {
            Ok(output) => Ok(convert::output(output).into()),
            // An unknown tool is a protocol error in MCP (`-32602`); every other failure
            // is a result the model reads.
            Err(error @ ToolError::UnknownTool { .. }) => {
                Err(ErrorData::invalid_params(error.report(), None))
            }
            Err(error) => Ok(convert::error(&error).into()),
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let Some(mut changes) = self.shared.provider.tool_list_changes() else {
            return;
        };
        let peer = context.peer;
        let session = self.session.clone();
        let shared = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = session.cancelled() => break,
                    changed = changes.changed() => {
                        if !changed {
                            break;
                        }
                        if let Some(shared) = shared.upgrade() {
                            shared.forget_listing();
                        }
                        if peer.notify_tool_list_changed().await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let wants_tools = context.accepted().tools_list_changed == Some(true);
        let changes = self.shared.provider.tool_list_changes().filter(|_| wants_tools);
        let Some(mut changes) = changes else {
            context.cancelled().await;
            return Ok(());
        };
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    // The provider is gone: end the subscription gracefully.
                    if !changed {
                        return Ok(());
                    }
                    self.shared.forget_listing();
                    if context.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}
