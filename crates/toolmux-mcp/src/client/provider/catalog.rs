//! The server's prompts and resources through [`McpProvider`]: listing (every page),
//! rendering and reading with the provider's request timeout and the caller's
//! cancellation, completions of their arguments, resource subscriptions that survive
//! restarts, and the log level asked of the server.
//!
//! Each is used only when the server's capabilities declare it; otherwise lists are
//! empty and names and URIs are unknown, as for a provider that has none.
//!
//! Log level: toolmux asks for `debug`, everything the server has. Callers choose what
//! they see: the gateway filters each request's lines by the level its own client set,
//! and a call without a log sink has its lines traced (see the handler).

// Logging and `resources/subscribe` are deprecated in rmcp (SEP-2577, 2026-07-28) but are
// how every handshake revision logs and subscribes.
#![expect(deprecated, reason = "logging and resources/subscribe of the handshake revisions")]

use rmcp::model::{
    ArgumentInfo, CompleteRequestParams, CompletionContext, GetPromptRequestParams,
    GetPromptResponse, InputRequiredResult, InputResponses, LoggingLevel,
    ReadResourceRequestParams, ReadResourceResponse, Reference, RequestMetaObject,
    SetLevelRequestParams, SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::model::{ClientRequest, GetPromptRequest, ReadResourceRequest, ServerResult};
use rmcp::service::{PeerRequestOptions, ServiceError};
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    CallContext, Completion, CompletionRef, CompletionRequest, JsonObject, Prompt, PromptSpec,
    ResourceContents, ResourceSpec, ResourceTemplate, ResourceUpdates, ToolError,
};

use super::{Inner, MAX_INPUT_ROUNDS, Pending, pages, similar};
use crate::McpError;
use crate::client::connection::Connection;
use crate::client::interaction::{self, InFlight};
use crate::client::wire;

/// Sends `request` through rmcp's session as the call recorded by `flight`, linking the
/// request's id and progress token once rmcp has given them (as it queues the request), so
/// that the server's questions about it find its caller among other calls in flight (those
/// asked before the link wait for it); the server is told when the caller stops waiting,
/// as for a call.
pub(super) async fn linked(
    connection: &Connection,
    flight: &InFlight<'_>,
    request: ClientRequest,
) -> Result<ServerResult, ServiceError> {
    flight.sending();
    let sent = connection.peer.send_cancellable_request(request, PeerRequestOptions::no_options());
    let handle = sent.await?;
    flight.link_request(handle.progress_token.clone(), handle.id.clone());
    let mut pending = Pending(Some(handle));
    let result = match pending.0.as_mut() {
        Some(handle) => (&mut handle.rx).await.unwrap_or(Err(ServiceError::TransportClosed)),
        None => Err(ServiceError::TransportClosed),
    };
    // Answered: nothing to cancel.
    pending.0 = None;
    result
}

/// JSON-RPC's code for invalid parameters (an unknown prompt, a bad argument).
const INVALID_PARAMS: i32 = -32602;
/// MCP's code for a resource that does not exist.
const RESOURCE_NOT_FOUND: i32 = -32002;
/// How long connecting waits for `logging/setLevel`: a server that does not answer it
/// only loses its log lines, which is no reason to hold up its calls.
const SET_LEVEL_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a request failed: the server's JSON-RPC error, kept apart so that callers can
/// tell an unknown name from other failures, or anything else, already converted.
enum Failure {
    Rpc { code: i32, error: McpError },
    Tool(ToolError),
}

impl Failure {
    fn into_tool_error(self, what: &str) -> ToolError {
        match self {
            Failure::Rpc { error, .. } => error.into_tool_error(Some(what)),
            Failure::Tool(error) => error,
        }
    }
}

/// What a server declared, as far as this module cares.
#[derive(Debug, Clone, Copy, Default)]
struct Offers {
    prompts: bool,
    resources: bool,
    subscribe: bool,
    logging: bool,
    completions: bool,
}

fn offers(connection: &Connection) -> Offers {
    let Some(info) = connection.info.as_ref() else { return Offers::default() };
    let capabilities = &info.capabilities;
    let resources = capabilities.resources.as_ref();
    Offers {
        prompts: capabilities.prompts.is_some(),
        resources: resources.is_some(),
        subscribe: resources.and_then(|r| r.subscribe).unwrap_or(false),
        logging: capabilities.logging.is_some(),
        completions: capabilities.completions.is_some(),
    }
}

/// The `_meta` of a request made for `ctx`: on 2026-07-28 connections, where the log
/// level travels with each request, `debug` when the caller listens for log lines; and the
/// trace the request belongs to (SEP-414), as a tool call carries it.
pub(super) fn request_meta(
    connection: &Connection,
    ctx: &CallContext,
) -> Option<RequestMetaObject> {
    let mut meta: Option<RequestMetaObject> = None;
    if connection.is_modern() && offers(connection).logging && ctx.log_sink().is_some() {
        meta.get_or_insert_default().set_log_level(LoggingLevel::Debug);
    }
    if let Some(trace) = ctx.outgoing_trace() {
        let meta = &mut meta.get_or_insert_default().0;
        meta.set_traceparent(trace.to_string());
        if let Some(state) = ctx.trace_state() {
            meta.set_tracestate(state);
        }
    }
    meta
}

impl Inner {
    /// Tells whoever follows the lists that `connection`'s prompts and resources (those it
    /// offers) came or went: a lazy server lists them only while it runs.
    pub(super) fn announce_catalog(&self, connection: &Connection) {
        let offers = offers(connection);
        if offers.prompts {
            self.events.prompts_changed.notify();
        }
        if offers.resources {
            self.events.resources_changed.notify();
        }
    }

    /// The connection for a listing: `None` when the provider is disabled, or lazy and
    /// not started (listing prompts is no reason to start a server).
    async fn listing_connection(self: &Arc<Self>) -> Result<Option<Arc<Connection>>, ToolError> {
        if !self.config.is_enabled() || (self.config.lazy && self.live().is_none()) {
            return Ok(None);
        }
        Ok(Some(self.connection().await?))
    }

    /// The connection for a request made for a caller, started if needed.
    async fn request_connection(
        self: &Arc<Self>,
        what: &str,
        ctx: &CallContext,
    ) -> Result<Arc<Connection>, ToolError> {
        if !self.config.is_enabled() {
            return Err(ToolError::Unavailable {
                provider: self.name.clone(),
                message: "disabled in the configuration (`enabled: false`)".into(),
            });
        }
        tokio::select! {
            connection = self.connection() => connection.map_err(|e| e.into_tool_error(Some(what))),
            () = ctx.cancel_token().cancelled() => Err(ToolError::Cancelled { tool: what.to_owned() }),
        }
    }

    /// Runs one request with the request timeout, the caller's cancellation and the
    /// provider's shutdown, keeping the restart bookkeeping as tool calls do.
    async fn request<T>(
        &self,
        connection: &Connection,
        method: &'static str,
        what: &str,
        caller: Option<(&CancellationToken, &Notify)>,
        request: impl Future<Output = Result<T, ServiceError>>,
    ) -> Result<T, Failure> {
        let timeout = self.config.request_timeout();
        let never = CancellationToken::new();
        let (cancel, activity) = match caller {
            Some((cancel, activity)) => (cancel, Some(activity)),
            None => (&never, None),
        };
        tokio::pin!(request);
        let mut idle = std::pin::pin!(tokio::time::sleep(timeout));
        let result = loop {
            let active = async {
                match activity {
                    Some(activity) => activity.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                result = &mut request => break Ok(result),
                () = &mut idle => break Err(()),
                // A question of the server waits for the caller: not the server's silence.
                () = active => idle.as_mut().reset(tokio::time::Instant::now() + timeout),
                () = cancel.cancelled() => {
                    return Err(Failure::Tool(ToolError::Cancelled { tool: what.to_owned() }));
                }
                () = self.shutdown.cancelled() => {
                    let error = McpError::ShutDown { server: self.name.clone() };
                    return Err(Failure::Tool(error.into_tool_error(Some(what))));
                }
            }
        };
        match &result {
            // See `Inner::reply`: a request whose POST failed got no answer.
            Ok(Err(ServiceError::McpError(e))) if crate::transport::is_undelivered(e) => {
                connection.timed_out();
            }
            Ok(Ok(_) | Err(ServiceError::McpError(_))) => connection.answered(),
            Err(()) => connection.timed_out(),
            Ok(Err(_)) => {}
        }
        match result {
            Ok(Ok(value)) => {
                self.succeeded();
                Ok(value)
            }
            Ok(Err(e)) => {
                let lost =
                    matches!(e, ServiceError::TransportClosed | ServiceError::TransportSend(_));
                let code = match &e {
                    ServiceError::McpError(data) => Some(data.code.0),
                    _ => None,
                };
                let error = self.service_error(connection, method, e);
                if lost {
                    self.connection_lost().await;
                } else {
                    self.succeeded();
                }
                match code {
                    Some(code) => Err(Failure::Rpc { code, error }),
                    None => Err(Failure::Tool(error.into_tool_error(Some(what)))),
                }
            }
            Err(_) => Err(Failure::Tool(ToolError::Timeout {
                tool: what.to_owned(),
                after: timeout,
                idle: None,
            })),
        }
    }

    /// The answers to an `input_required` result of a 2026-07-28 server, through `ctx`.
    pub(super) async fn answer_inputs(
        &self,
        what: &str,
        input: InputRequiredResult,
        ctx: &CallContext,
    ) -> Result<(Option<InputResponses>, Option<String>), ToolError> {
        let requests = input.input_requests.unwrap_or_default();
        if requests.is_empty() && input.request_state.is_none() {
            let message = format!("`{what}`: an empty input_required result");
            return Err(self.protocol(&message).into_tool_error(Some(what)));
        }
        // Asked together, answered together: the caller may itself be a gateway that
        // collects questions asked at once into one round of its own.
        let defaults = self.config.accept_elicitation_defaults;
        let answers = requests.into_iter().map(|(key, request)| async move {
            let answer =
                interaction::answer_input(&self.name, ctx, &key, request, defaults).await?;
            Ok::<_, ToolError>((key, answer))
        });
        let responses: InputResponses =
            futures::future::try_join_all(answers).await?.into_iter().collect();
        Ok(((!responses.is_empty()).then_some(responses), input.request_state))
    }

    pub(super) async fn list_prompts(self: &Arc<Self>) -> Result<Vec<PromptSpec>, ToolError> {
        let Some(connection) = self.listing_connection().await? else { return Ok(Vec::new()) };
        if !offers(&connection).prompts {
            return Ok(Vec::new());
        }
        let listed = pages::all_pages(&self.name, "prompts/list", async |params| {
            let page = connection.peer.list_prompts(params).await?;
            Ok((page.prompts, page.next_cursor))
        });
        let prompts = self
            .request(&connection, "prompts/list", "prompts/list", None, listed)
            .await
            .map_err(|f| f.into_tool_error("prompts/list"))?;
        Ok(prompts.iter().map(wire::prompt_spec).collect())
    }

    pub(super) async fn get_prompt(
        self: &Arc<Self>,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        let connection = self.request_connection(name, ctx).await?;
        let unknown =
            || ToolError::UnknownPrompt { name: name.to_owned(), suggestions: Vec::new() };
        if !offers(&connection).prompts {
            return Err(unknown());
        }
        let mut params = GetPromptRequestParams::new(name);
        params.arguments = (!arguments.is_empty()).then_some(arguments);
        params.meta = request_meta(&connection, ctx);
        for _round in 0..MAX_INPUT_ROUNDS {
            let flight = self.events.flights.begin(ctx);
            let activity = flight.activity();
            let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(params.clone()));
            let sent = async {
                match linked(&connection, &flight, request).await? {
                    ServerResult::GetPromptResult(result) => {
                        Ok(GetPromptResponse::Complete(result))
                    }
                    ServerResult::InputRequiredResult(input) => {
                        Ok(GetPromptResponse::InputRequired(input))
                    }
                    _ => Err(ServiceError::UnexpectedResponse),
                }
            };
            let result = self
                .request(
                    &connection,
                    "prompts/get",
                    name,
                    Some((ctx.cancel_token(), &activity)),
                    sent,
                )
                .await;
            drop(flight);
            match result {
                Ok(GetPromptResponse::Complete(result)) => return Ok(wire::prompt(&result)),
                Ok(GetPromptResponse::InputRequired(input)) => {
                    (params.input_responses, params.request_state) =
                        self.answer_inputs(name, input, ctx).await?;
                }
                Err(Failure::Rpc { code: INVALID_PARAMS, error }) => {
                    return Err(self.prompt_error(name, error).await);
                }
                Err(failure) => return Err(failure.into_tool_error(name)),
                Ok(_) => {
                    let message = "unexpected reply to prompts/get";
                    return Err(self.protocol(message).into_tool_error(Some(name)));
                }
            }
        }
        let message = format!("`{name}` still asked for input after {MAX_INPUT_ROUNDS} rounds");
        Err(self.protocol(&message).into_tool_error(Some(name)))
    }

    /// Invalid parameters for prompt `name`: unknown when the server does not list it,
    /// invalid arguments when it does.
    async fn prompt_error(self: &Arc<Self>, name: &str, error: McpError) -> ToolError {
        let Ok(prompts) = self.list_prompts().await else {
            return error.into_tool_error(Some(name));
        };
        if prompts.iter().any(|p| p.name == name) {
            return error.into_tool_error(Some(name));
        }
        let mut suggestions: Vec<String> =
            prompts.into_iter().map(|p| p.name).filter(|p| similar(p, name)).collect();
        suggestions.truncate(3);
        ToolError::UnknownPrompt { name: name.to_owned(), suggestions }
    }

    /// Values for an argument of one of the server's prompts or resource templates; none
    /// when the server does not declare completions.
    pub(super) async fn complete(
        self: &Arc<Self>,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        let (reference, what) = match request.reference {
            CompletionRef::Prompt(name) => (Reference::for_prompt(name.clone()), name),
            CompletionRef::ResourceTemplate(uri) => (Reference::for_resource(uri.clone()), uri),
        };
        let connection = self.request_connection(&what, ctx).await?;
        if !offers(&connection).completions {
            return Ok(Completion::default());
        }
        let mut params = CompleteRequestParams::new(
            reference,
            ArgumentInfo::new(request.argument, request.value),
        );
        if !request.context.is_empty() {
            params = params.with_context(CompletionContext::with_arguments(
                request.context.into_iter().collect(),
            ));
        }
        params.meta = request_meta(&connection, ctx);
        let flight = self.events.flights.begin(ctx);
        let activity = flight.activity();
        let sent = connection.peer.complete(params);
        let method = "completion/complete";
        let caller = Some((ctx.cancel_token(), &*activity));
        let result = self.request(&connection, method, &what, caller, sent).await;
        drop(flight);
        let completion = result.map_err(|f| f.into_tool_error(&what))?.completion;
        Ok(Completion {
            values: completion.values,
            total: completion.total,
            has_more: completion.has_more.unwrap_or(false),
        })
    }

    pub(super) async fn list_resources(self: &Arc<Self>) -> Result<Vec<ResourceSpec>, ToolError> {
        let Some(connection) = self.listing_connection().await? else { return Ok(Vec::new()) };
        if !offers(&connection).resources {
            return Ok(Vec::new());
        }
        let listed = pages::all_pages(&self.name, "resources/list", async |params| {
            let page = connection.peer.list_resources(params).await?;
            Ok((page.resources, page.next_cursor))
        });
        let resources = self
            .request(&connection, "resources/list", "resources/list", None, listed)
            .await
            .map_err(|f| f.into_tool_error("resources/list"))?;
        Ok(resources.iter().map(wire::resource_spec).collect())
    }

    pub(super) async fn list_resource_templates(
        self: &Arc<Self>,
    ) -> Result<Vec<ResourceTemplate>, ToolError> {
        let Some(connection) = self.listing_connection().await? else { return Ok(Vec::new()) };
        if !offers(&connection).resources {
            return Ok(Vec::new());
        }
        let method = "resources/templates/list";
        let listed = pages::all_pages(&self.name, "resources/templates/list", async |params| {
            let page = connection.peer.list_resource_templates(params).await?;
            Ok((page.resource_templates, page.next_cursor))
        });
        let templates = self
            .request(&connection, method, method, None, listed)
            .await
            .map_err(|f| f.into_tool_error(method))?;
        Ok(templates.iter().map(wire::resource_template).collect())
    }

    pub(super) async fn read_resource(
        self: &Arc<Self>,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        let connection = self.request_connection(uri, ctx).await?;
        let unknown = || ToolError::UnknownResource { uri: uri.to_owned() };
        if !offers(&connection).resources {
            return Err(unknown());
        }
        let mut params = ReadResourceRequestParams::new(uri);
        params.meta = request_meta(&connection, ctx);
        for _round in 0..MAX_INPUT_ROUNDS {
            // On 2026-07-28 through rmcp's read, whose cache keeps a result as long as the
            // server lets it (`ttlMs`); questions come inside results there.
            let modern = connection.is_modern();
            let flight = self.events.flights.begin(ctx);
            let activity = flight.activity();
            let sent = async {
                if modern {
                    return connection.peer.read_resource_once(params.clone()).await;
                }
                let request =
                    ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params.clone()));
                match linked(&connection, &flight, request).await? {
                    ServerResult::ReadResourceResult(result) => {
                        Ok(ReadResourceResponse::Complete(result))
                    }
                    ServerResult::InputRequiredResult(input) => {
                        Ok(ReadResourceResponse::InputRequired(input))
                    }
                    _ => Err(ServiceError::UnexpectedResponse),
                }
            };
            let result = self
                .request(
                    &connection,
                    "resources/read",
                    uri,
                    Some((ctx.cancel_token(), &activity)),
                    sent,
                )
                .await;
            drop(flight);
            match result {
                Ok(ReadResourceResponse::Complete(result)) => {
                    return Ok(wire::resource_contents(&result));
                }
                Ok(ReadResourceResponse::InputRequired(input)) => {
                    (params.input_responses, params.request_state) =
                        self.answer_inputs(uri, input, ctx).await?;
                }
                // Older SDKs answer an unknown URI with invalid params, newer ones with
                // MCP's resource-not-found.
                Err(Failure::Rpc { code: RESOURCE_NOT_FOUND | INVALID_PARAMS, .. }) => {
                    return Err(unknown());
                }
                Err(failure) => return Err(failure.into_tool_error(uri)),
                Ok(_) => {
                    let message = "unexpected reply to resources/read";
                    return Err(self.protocol(message).into_tool_error(Some(uri)));
                }
            }
        }
        let message = format!("`{uri}` still asked for input after {MAX_INPUT_ROUNDS} rounds");
        Err(self.protocol(&message).into_tool_error(Some(uri)))
    }

    /// Updates of subscribed resources: offered unless the provider is disabled or its
    /// running server does not offer subscriptions (before it runs, nobody knows yet).
    pub(super) fn resource_updates(&self) -> Option<ResourceUpdates> {
        let refused = self.live().is_some_and(|c| !offers(&c).subscribe);
        (self.config.is_enabled() && !refused).then(|| self.events.resource_updates.subscribe())
    }

    pub(super) async fn subscribe_resource(self: &Arc<Self>, uri: &str) -> Result<(), ToolError> {
        let ctx = CallContext::new();
        let connection = self.request_connection(uri, &ctx).await?;
        let offered = offers(&connection);
        if !offered.resources {
            return Err(ToolError::UnknownResource { uri: uri.to_owned() });
        }
        if !offered.subscribe {
            return Err(ToolError::unsupported(
                "resource subscriptions",
                format!("mcp server `{}` does not offer them", self.name),
            ));
        }
        // Recorded only once the server took it, and under the lock an unsubscribe
        // takes: one that came meanwhile found nothing to end, and the subscription
        // stayed for good.
        let _changing = self.events.subscribing.lock().await;
        if self.subscriptions().contains_key(uri) {
            return Ok(());
        }
        let listening = subscribe(self, &connection, uri).await.map_err(|f| match f {
            Failure::Rpc { code: RESOURCE_NOT_FOUND | INVALID_PARAMS, .. } => {
                ToolError::UnknownResource { uri: uri.to_owned() }
            }
            failure => failure.into_tool_error(uri),
        })?;
        self.subscriptions().insert(uri.to_owned(), listening);
        Ok(())
    }

    pub(super) async fn unsubscribe_resource(self: &Arc<Self>, uri: &str) -> Result<(), ToolError> {
        let _changing = self.events.subscribing.lock().await;
        let Some(listening) = self.subscriptions().remove(uri) else { return Ok(()) };
        if let Some(listening) = listening {
            // A 2026-07-28 subscription ends with its stream.
            listening.cancel();
            return Ok(());
        }
        let Some(connection) = self.live() else { return Ok(()) };
        let sent = connection.peer.unsubscribe(UnsubscribeRequestParams::new(uri));
        self.request(&connection, "resources/unsubscribe", uri, None, sent)
            .await
            .map_err(|f| f.into_tool_error(uri))
    }

    pub(super) fn subscriptions(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, Option<CancellationToken>>>
    {
        self.events.subscriptions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// On a new connection: asks for every log line, and renews the subscriptions the
    /// last connection had.
    ///
    /// The log level is set before the connection is used, since some servers (toolmux's
    /// own) send no line before a level is set and the first call's lines would be lost.
    /// It runs under the connect lock, so it keeps no restart bookkeeping; renewals run
    /// in the background.
    pub(super) async fn after_connect(self: &Arc<Self>, connection: &Arc<Connection>) {
        let offered = offers(connection);
        if offered.logging && !connection.is_modern() {
            let timeout = self.config.request_timeout().min(SET_LEVEL_TIMEOUT);
            let sent = connection.peer.set_level(SetLevelRequestParams::new(LoggingLevel::Debug));
            match tokio::time::timeout(timeout, sent).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(server = %self.name, error = %e, "logging/setLevel refused");
                }
                Err(_) => {
                    tracing::debug!(server = %self.name, "no answer to logging/setLevel");
                }
            }
        }
        if !offered.subscribe {
            return;
        }
        let renew: Vec<String> = self.subscriptions().keys().cloned().collect();
        if renew.is_empty() {
            return;
        }
        let inner = Arc::downgrade(self);
        let connection = connection.clone();
        tokio::spawn(async move {
            for uri in renew {
                renew_subscription(&inner, &connection, &uri).await;
            }
        });
    }
}

/// Subscribes to `uri` on `connection`: `resources/subscribe` on handshake revisions, a
/// `subscriptions/listen` stream on 2026-07-28 (its token ends it).
async fn subscribe(
    inner: &Arc<Inner>,
    connection: &Arc<Connection>,
    uri: &str,
) -> Result<Option<CancellationToken>, Failure> {
    if !connection.is_modern() {
        let sent = connection.peer.subscribe(SubscribeRequestParams::new(uri));
        inner.request(connection, "resources/subscribe", uri, None, sent).await?;
        return Ok(None);
    }
    let filter = SubscriptionFilter::builder().resource_subscription(uri).build();
    let listen = connection.peer.listen(filter);
    let mut subscription =
        inner.request(connection, "subscriptions/listen", uri, None, listen).await?;
    let acknowledged = subscription.acknowledged().resource_subscriptions.as_ref();
    if !acknowledged.is_some_and(|uris| uris.iter().any(|u| u == uri)) {
        return Err(Failure::Tool(ToolError::unsupported(
            "resource subscriptions",
            format!("mcp server `{}` did not acknowledge a subscription to `{uri}`", inner.name),
        )));
    }
    let stop = CancellationToken::new();
    let updates = Arc::downgrade(&inner.events);
    let server = inner.name.clone();
    let ended = stop.clone();
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = subscription.next() => next,
                () = ended.cancelled() => return,
            };
            match next {
                Ok(Some(rmcp::model::ServerNotification::ResourceUpdatedNotification(n))) => {
                    let Some(events) = updates.upgrade() else { return };
                    events.resource_updates.notify(&n.params.uri);
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    tracing::debug!(server = %server, "resource subscription stream ended");
                    return;
                }
            }
        }
    });
    Ok(Some(stop))
}

/// Subscribes again after a restart, unless the caller unsubscribed meanwhile.
async fn renew_subscription(inner: &Weak<Inner>, connection: &Arc<Connection>, uri: &str) {
    let Some(inner) = inner.upgrade() else { return };
    let _changing = inner.events.subscribing.lock().await;
    if !inner.subscriptions().contains_key(uri) {
        return;
    }
    match subscribe(&inner, connection, uri).await {
        Ok(listening) => {
            let mut subscriptions = inner.subscriptions();
            match subscriptions.get_mut(uri) {
                Some(slot) => {
                    if let Some(old) = std::mem::replace(slot, listening) {
                        old.cancel();
                    }
                }
                None => {
                    if let Some(listening) = listening {
                        listening.cancel();
                    }
                }
            }
        }
        Err(failure) => {
            let error = failure.into_tool_error(uri);
            tracing::warn!(server = %inner.name, uri, error = %error, "cannot renew a resource subscription");
        }
    }
}
