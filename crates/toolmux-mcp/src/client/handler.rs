//! The client side of a connection as rmcp sees it: who toolmux is, and where server
//! requests and notifications go (questions and log lines to the call in flight, progress
//! to the call's sink, list changes to the provider, resource updates to listeners).

// rmcp deprecates sampling, roots and logging (SEP-2577, 2026-07-28); servers of every
// handshake revision still use them.
#![expect(deprecated, reason = "sampling, roots and logging of the handshake revisions")]

use rmcp::model::JsonRpcMessage;
use rmcp::model::{
    ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
    CustomNotification, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationCapability, FormElicitationCapability, Implementation, ListRootsResult,
    LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    ResourceUpdatedNotificationParam, RootsCapabilities, SamplingCapability, ServerNotification,
    UrlElicitationCapability,
};
use rmcp::service::{
    InboundStreamOrigin, NotificationContext, RequestContext, RxJsonRpcMessage, TxJsonRpcMessage,
};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ErrorData, RoleClient};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    InteractionHandler, LogLevel, LogMessage, Progress, ProgressSink, ResourceUpdateNotifier,
    ToolListNotifier,
};

use super::interaction::{self, Flights, Question, Relation};
use super::wire;

/// How often a call waiting for its caller's answer has its idle timeout reset.
const KEEP_ALIVE: Duration = Duration::from_millis(100);

/// Where a running call's progress goes.
#[derive(Debug, Clone)]
pub(crate) struct ProgressRoute {
    /// The caller's sink, if it listens.
    pub(crate) sink: Option<ProgressSink>,
    /// Woken on every report, to reset the call's idle timeout.
    pub(crate) activity: Arc<Notify>,
}

/// The progress routes of the running calls, and the reports no route took yet.
#[derive(Debug, Default)]
struct Routes {
    by_token: foldhash::HashMap<ProgressToken, ProgressRoute>,
    /// Calls whose request rmcp may have sent while their route is not in yet: rmcp
    /// chooses a request's progress token as it queues it, so the route can only follow.
    sending: usize,
    /// Reports for no route that came while a call was `sending`, oldest first; the
    /// route that then comes takes its own. At most [`STRAYS_KEPT`]; past that the
    /// latest replaces the one before it, so the first and the last are kept.
    // Invariant: empty while `sending` is 0.
    strays: VecDeque<ProgressNotificationParam>,
}

/// Reports kept for routes still to come (a server floods at most this many in the
/// moment between rmcp queuing a request and its call routing its progress).
const STRAYS_KEPT: usize = 1024;

/// Server events shared between the handler of each connection and the provider.
#[derive(Debug, Default)]
pub(crate) struct Events {
    progress: Mutex<Routes>,
    /// Woken when the server says its tool list changed.
    pub(crate) tools_changed: Notify,
    /// Told when the server says its prompt list changed.
    pub(crate) prompts_changed: ToolListNotifier,
    /// Told when the server says its resource list changed.
    pub(crate) resources_changed: ToolListNotifier,
    /// The calls in flight, whose contexts answer the server's questions and take its
    /// log lines.
    pub(crate) flights: Flights,
    /// Where `notifications/resources/updated` go.
    pub(crate) resource_updates: ResourceUpdateNotifier,
    /// The resources subscribed to, renewed on every new connection; on a 2026-07-28
    /// connection each has the token that ends its `subscriptions/listen` stream.
    pub(crate) subscriptions: Mutex<BTreeMap<String, Option<CancellationToken>>>,
    /// Held across the request of whatever changes a subscription at the server (a
    /// subscribe, an unsubscribe, a renewal): an unsubscribe that came while the
    /// subscribe was under way waits for it, and then ends it.
    pub(crate) subscribing: tokio::sync::Mutex<()>,
    /// The URL elicitations a caller accepted, by the server's `elicitationId`, with the
    /// caller to tell when the server says it is complete; the oldest are forgotten past
    /// [`URL_ELICITATIONS_KEPT`].
    url_elicitations: Mutex<VecDeque<(String, Weak<dyn InteractionHandler>)>>,
}

/// URL elicitations remembered for their completion notice.
const URL_ELICITATIONS_KEPT: usize = 64;

impl Events {
    /// Remembers that `caller` accepted the URL elicitation `id`, to tell it when the
    /// server says it is complete.
    pub(crate) fn url_accepted(&self, id: &str, caller: &Arc<dyn InteractionHandler>) {
        if id.is_empty() {
            return;
        }
        let mut kept = self.url_elicitations.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= URL_ELICITATIONS_KEPT {
            kept.pop_front();
        }
        kept.push_back((id.to_owned(), Arc::downgrade(caller)));
    }

    /// The caller that accepted the URL elicitation `id`, forgotten from now on.
    fn url_completed(&self, id: &str) -> Option<Arc<dyn InteractionHandler>> {
        let mut kept = self.url_elicitations.lock().unwrap_or_else(|e| e.into_inner());
        let at = kept.iter().position(|(kept, _)| kept == id)?;
        kept.remove(at).and_then(|(_, caller)| caller.upgrade())
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Routes progress for `token` until [`Events::unroute`]. For a request whose token
    /// is known before it is written; one rmcp sends goes through [`Events::sending`].
    pub(crate) fn route(&self, token: ProgressToken, route: ProgressRoute) {
        self.routes().by_token.insert(token, route);
    }

    /// Keeps the reports that come for no route from now until the returned guard routes
    /// its request's progress or drops: rmcp gives a request's progress token only once
    /// it has queued the request, and a server that reports at once may be read first.
    pub(crate) fn sending(&self) -> Sending<'_> {
        self.routes().sending += 1;
        Sending { events: self }
    }

    /// Stops routing progress for `token`.
    pub(crate) fn unroute(&self, token: &ProgressToken) {
        self.routes().by_token.remove(token);
    }

    /// How many calls have their progress routed, how many reports wait for a route, and
    /// how many calls are sending.
    #[cfg(test)]
    pub(crate) fn routed(&self) -> (usize, usize, usize) {
        let routes = self.routes();
        (routes.by_token.len(), routes.strays.len(), routes.sending)
    }

    /// Resets the idle timeout of the requests sent with `tokens`, as progress does.
    fn keep_alive(&self, tokens: &[ProgressToken]) {
        let routes = self.routes();
        for route in tokens.iter().filter_map(|t| routes.by_token.get(t)) {
            route.activity.notify_one();
        }
    }

    /// Takes the notifications a stdio connection hands over as it reads them (progress
    /// and log lines, so that they reach their call before its result); returns the rest.
    pub(crate) fn tap(
        &self,
        server: &str,
        notification: ServerNotification,
    ) -> Option<ServerNotification> {
        match notification {
            ServerNotification::ProgressNotification(progress) => {
                self.deliver(progress.params);
                None
            }
            ServerNotification::LoggingMessageNotification(log) => {
                self.log(server, &log.params);
                None
            }
            other => Some(other),
        }
    }

    /// A log line from the server: to the call in flight, else to the trace log.
    fn log(&self, server: &str, params: &LoggingMessageNotificationParam) {
        let message = wire::log_message(params);
        match self.flights.log_sink() {
            Some(sink) => sink.log(message),
            None => trace_log(server, &message),
        }
    }

    fn deliver(&self, params: ProgressNotificationParam) {
        let route = {
            let mut routes = self.routes();
            match routes.by_token.get(&params.progress_token) {
                Some(route) => route.clone(),
                None => {
                    if routes.sending > 0 {
                        if routes.strays.len() >= STRAYS_KEPT {
                            routes.strays.pop_back();
                        }
                        routes.strays.push_back(params);
                    }
                    return;
                }
            }
        };
        route.report(params);
    }
}

impl ProgressRoute {
    /// Hands one report to the call.
    fn report(&self, params: ProgressNotificationParam) {
        self.activity.notify_one();
        if let Some(sink) = &self.sink {
            let mut progress = Progress::new(params.progress, params.total);
            progress.message = params.message;
            sink.report(progress);
        }
    }
}

/// A call whose request rmcp is sending ([`Events::sending`]).
#[derive(Debug)]
pub(crate) struct Sending<'a> {
    events: &'a Events,
}

impl Sending<'_> {
    /// Routes progress for `token`, the token rmcp gave the request, until
    /// [`Events::unroute`]; the reports that came for it before are handed over first.
    pub(crate) fn route(self, token: ProgressToken, route: ProgressRoute) {
        let mut routes = self.events.routes();
        let (early, others) = std::mem::take(&mut routes.strays)
            .into_iter()
            .partition::<VecDeque<_>, _>(|p| p.progress_token == token);
        routes.strays = others;
        // Under the lock, unlike every later report: one the reader takes meanwhile waits
        // for these, so the call gets its reports in the order they came. (A sink returns
        // at once and cannot call back into a provider.)
        for params in early {
            route.report(params);
        }
        routes.by_token.insert(token, route);
        // Released before `self` drops, which takes the lock again.
        drop(routes);
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        let mut routes = self.events.routes();
        routes.sending -= 1;
        if routes.sending == 0 {
            routes.strays.clear();
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

impl Handler {
    /// `transport` with the progress reports and log lines it receives handed to their
    /// calls as they are read, as a stdio connection's reader does: rmcp would handle
    /// each in a task of its own, and those run in any order (a flood over HTTP reached
    /// its call shuffled), some perhaps after the call's result.
    pub(crate) fn tapped<T>(&self, transport: T) -> Tapped<T> {
        Tapped { inner: transport, server: self.server.clone(), events: self.events.clone() }
    }
}

/// A transport whose progress reports and log lines go to their calls ([`Handler::tapped`]).
#[derive(Debug)]
pub(crate) struct Tapped<T> {
    inner: T,
    server: Arc<str>,
    events: Arc<Events>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Tapped<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    /// Cancel-safe as the inner transport is: a message is handled once received.
    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            match self.inner.receive().await? {
                JsonRpcMessage::Notification(mut notification) => {
                    let Some(other) = self.events.tap(&self.server, notification.notification)
                    else {
                        continue;
                    };
                    notification.notification = other;
                    return Some(JsonRpcMessage::Notification(notification));
                }
                other => return Some(other),
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
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
///
/// Sampling, form elicitation and roots are always declared: each question goes to the
/// caller of the call it belongs to, and a caller that cannot answer gets the unattended
/// answer (see [`interaction::answer`]); URL elicitation too, declined for a caller that
/// cannot show its user a URL.
pub(crate) fn client_info() -> ClientConfig {
    let mut capabilities = ClientCapabilities::default();
    capabilities.sampling = Some(SamplingCapability::default());
    capabilities.elicitation = Some(
        ElicitationCapability::new()
            .with_form(FormElicitationCapability::new())
            .with_url(UrlElicitationCapability::new()),
    );
    capabilities.roots = Some(RootsCapabilities::default());
    let mut info =
        ClientConfig::new(capabilities, Implementation::new("toolmux", env!("CARGO_PKG_VERSION")));
    info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
    info
}

impl Handler {
    /// Answers a server's question through the call it belongs to.
    async fn ask(
        &self,
        question: Question,
        context: &RequestContext<RoleClient>,
    ) -> Result<serde_json::Value, ErrorData> {
        let method = question.method();
        let asked = match self.events.flights.context_for_linked(&relation(context)).await {
            Ok(asked) => asked,
            Err(unrouted) => {
                let message = unrouted.message(method);
                tracing::debug!(server = %self.server, method, %message, "server question refused");
                return Err(ErrorData::invalid_request(message, None));
            }
        };
        let defaults = self.elicitation_defaults;
        let url = match &question {
            Question::UrlElicitation(request) => Some(request.elicitation_id.clone()),
            _ => None,
        };
        let answering = interaction::answer(&asked.ctx, question, defaults, &context.ct);
        tokio::pin!(answering);
        let answered = loop {
            // Waiting for the caller (a person, perhaps) is not the server being silent:
            // the call's idle timeout is held off until the answer comes.
            self.events.keep_alive(&asked.tokens);
            asked.activity.notify_one();
            tokio::select! {
                answered = &mut answering => break answered,
                // The call ended without its caller answering (a stateless gateway stops
                // a call to ask its own client): the server must not wait for ever.
                () = asked.ended.cancelled() => break Err(interaction::Unanswered::Cancelled),
                () = tokio::time::sleep(KEEP_ALIVE) => {}
            }
        };
        if let (Some(id), Ok(answer), Some(caller)) = (&url, &answered, asked.ctx.handler())
            && answer["action"] == "accept"
        {
            self.events.url_accepted(id, caller);
        }
        answered.map_err(|unanswered| {
            let message = unanswered.message(method);
            tracing::debug!(server = %self.server, %message, "server question unanswered");
            ErrorData::internal_error(message, None)
        })
    }
}

/// What a server's request says about the request of ours it belongs to: the response
/// stream it came on (streamable HTTP; rmcp records it), the task it names (2025-11-25
/// tasks: `io.modelcontextprotocol/related-task`), its progress token.
fn relation(context: &RequestContext<RoleClient>) -> Relation {
    let request = match context.extensions.get::<InboundStreamOrigin>() {
        Some(InboundStreamOrigin::OutboundRequest(id)) => Some(id.clone()),
        Some(InboundStreamOrigin::Unassociated) | None => None,
    };
    let task = context
        .meta
        .0
        .get(RELATED_TASK)
        .and_then(|related| related.get("taskId"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    Relation { request, task, token: context.meta.get_progress_token() }
}

/// The `_meta` key naming the task a message belongs to (2025-11-25).
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

fn parse<T: serde::de::DeserializeOwned>(
    what: &str,
    value: serde_json::Value,
) -> Result<T, ErrorData> {
    wire::parse(what, value).map_err(|e| ErrorData::internal_error(e, None))
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        client_info()
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let question = Question::Sampling(wire::sampling_request(&params, None));
        parse("sampling", self.ask(question, &context).await?)
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let question = Question::elicitation(request, None);
        parse("elicitation", self.ask(question, &context).await?)
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        let question = Question::Roots(toolmux_core::RootsRequest::default());
        parse("roots", self.ask(question, &context).await?)
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.events.log(&self.server, &params);
    }

    async fn on_resource_updated(
        &self,
        params: ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        tracing::trace!(server = %self.server, uri = %params.uri, "resources/updated");
        self.events.resource_updates.notify(&params.uri);
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

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.server, "prompts/list_changed");
        self.events.prompts_changed.notify();
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.server, "resources/list_changed");
        self.events.resources_changed.notify();
    }

    /// `notifications/elicitation/complete` (2025-11-25): the user finished at a URL the
    /// server asked them to open; the caller who was shown it is told.
    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleClient>,
    ) {
        if notification.method != "notifications/elicitation/complete" {
            tracing::trace!(server = %self.server, method = %notification.method, "notification ignored");
            return;
        }
        let id = notification.params.as_ref().and_then(|p| p.get("elicitationId"));
        let Some(id) = id.and_then(serde_json::Value::as_str) else { return };
        match self.events.url_completed(id) {
            Some(caller) => caller.url_elicitation_complete(id).await,
            None => {
                tracing::debug!(server = %self.server, id, "completion of an unknown URL elicitation");
            }
        }
    }
}

/// A log line no call listens for, traced at its level.
fn trace_log(server: &str, message: &LogMessage) {
    let logger = message.logger.as_deref().unwrap_or_default();
    let data = match &message.data {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    match message.level {
        LogLevel::Debug => tracing::debug!(server, logger, "{data}"),
        LogLevel::Info | LogLevel::Notice => tracing::info!(server, logger, "{data}"),
        LogLevel::Warning => tracing::warn!(server, logger, "{data}"),
        _ => tracing::error!(server, logger, "{data}"),
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

    fn token(n: i64) -> ProgressToken {
        ProgressToken(rmcp::model::NumberOrString::Number(n))
    }

    /// A route whose sink keeps the progress values reported to it.
    fn recording() -> (ProgressRoute, Arc<Mutex<Vec<f64>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let seen = seen.clone();
            ProgressSink::new(move |p| seen.lock().unwrap().push(p.progress))
        };
        (ProgressRoute { sink: Some(sink), activity: Arc::default() }, seen)
    }

    fn report(events: &Events, token: i64, progress: u32) {
        events.deliver(ProgressNotificationParam::new(self::token(token), f64::from(progress)));
    }

    /// Reports read between rmcp queuing a request and its call routing them reach the
    /// call when it does, before the later ones; another call's stay for it, and none is
    /// kept once no call is sending.
    #[test]
    fn reports_before_the_route_reach_the_call_that_sends() {
        let events = Events::default();
        let (first, first_seen) = recording();
        let (second, second_seen) = recording();
        let sending_first = events.sending();
        let sending_second = events.sending();
        report(&events, 1, 1);
        report(&events, 2, 10);
        report(&events, 1, 2);
        sending_first.route(token(1), first);
        report(&events, 1, 3);
        assert_eq!(*first_seen.lock().unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(events.routed(), (1, 1, 1), "the second call's report waits for it");
        sending_second.route(token(2), second);
        assert_eq!(*second_seen.lock().unwrap(), [10.0]);
        assert_eq!(events.routed(), (2, 0, 0));
        events.unroute(&token(1));
        events.unroute(&token(2));
        // A late report of an ended call, with nobody sending, is not kept.
        report(&events, 1, 4);
        assert_eq!(events.routed(), (0, 0, 0));
        // A request that was never sent keeps nothing after it.
        let failed = events.sending();
        report(&events, 3, 1);
        assert_eq!(events.routed(), (0, 1, 1));
        drop(failed);
        assert_eq!(events.routed(), (0, 0, 0));
    }

    /// Past [`STRAYS_KEPT`] reports waiting for their route, the first ones and the latest
    /// are kept.
    #[test]
    fn a_flood_before_the_route_keeps_its_first_and_latest_reports() {
        let events = Events::default();
        let sending = events.sending();
        let flood = u32::try_from(STRAYS_KEPT).unwrap() + 100;
        for progress in 1..=flood {
            report(&events, 1, progress);
        }
        let (route, seen) = recording();
        sending.route(token(1), route);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), STRAYS_KEPT);
        let kept = u32::try_from(STRAYS_KEPT).unwrap() - 1;
        let wanted: Vec<f64> = (1..=kept).chain(std::iter::once(flood)).map(f64::from).collect();
        assert_eq!(seen, wanted);
    }

    /// A reader thread reporting while the call routes: the call gets every report, in the
    /// order they were read, whichever moment the route came in.
    #[test]
    fn reports_read_while_the_route_comes_in_stay_in_order() {
        for _ in 0..200 {
            let events = Arc::new(Events::default());
            let sending = events.sending();
            let reader = {
                let events = events.clone();
                std::thread::spawn(move || {
                    for progress in 1..=200 {
                        report(&events, 1, progress);
                    }
                })
            };
            let (route, seen) = recording();
            std::thread::yield_now();
            sending.route(token(1), route);
            reader.join().unwrap();
            let wanted: Vec<f64> = (1..=200).map(f64::from).collect();
            assert_eq!(*seen.lock().unwrap(), wanted);
        }
    }
}
