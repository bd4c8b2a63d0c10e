//! Passing a server's questions and log lines on to whoever made the call they belong to.
//!
//! A server asks its client for a completion (`sampling/createMessage`), for input
//! (`elicitation/create`) or for roots (`roots/list`) while it runs a request of that
//! client, and logs (`notifications/message`) while it works. Every call, prompt rendering
//! and resource read in flight on a connection is recorded with its [`CallContext`], and a
//! question is answered by the [`toolmux_core::InteractionHandler`] of the one it belongs
//! to. Which one that is, the protocol says only sometimes ([`Relation`]): over streamable
//! HTTP a question comes on the response stream of the request it belongs to, a task's
//! question names its task, and some servers put the request's progress token in its
//! `_meta`; each is looked for (held, for a moment, while a call is still sending the
//! request that may be it). A question that names none (always over stdio) goes to the
//! only request in flight; with several, whose callers may be different people, it is
//! refused rather than shown to one who may not be its asker, and so it is while another
//! caller's cancelled request may still be at work upstream. 2026-07-28 servers ask
//! inside their result instead (`input_required`); those questions belong to the request
//! they answer and take the same path.

use rmcp::model::{ElicitRequestParams, InputRequest, ProgressToken, RequestId};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use toolmux_core::{
    CallContext, ElicitationRequest, LogSink, RootsRequest, SamplingRequest, ToolError,
    UrlElicitationRequest,
};

use super::handler::answer_with_defaults;
use super::wire;

/// How long after a call ends its log sink still takes lines when no call is in flight.
///
/// rmcp hands each notification to its own task, so a line the server sent just before
/// its response may be looked up after the call saw the response and ended.
const LOG_GRACE: Duration = Duration::from_millis(500);

/// The longest a question naming a request, task or progress token no call has is held
/// while a call is still sending its request (see [`Flights::context_for_linked`]).
const LINK_WAIT: Duration = Duration::from_secs(1);

/// How long the caller of a call abandoned before its answer (cancelled) is still counted
/// among those who may have asked a question that names no call: its server may not have
/// seen the cancellation yet and still be at work on it, asking.
const ABANDONED_GRACE: Duration = Duration::from_secs(10);

/// Abandoned calls remembered at most ([`ABANDONED_GRACE`]).
const ABANDONED_MAX: usize = 1024;

/// Who made a call: its handler, or none.
type Caller = Option<Arc<dyn toolmux_core::InteractionHandler>>;

/// The calls in flight on one provider's connection, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    next: AtomicU64,
    calls: Mutex<Vec<Flight>>,
    /// The callers of calls abandoned within [`ABANDONED_GRACE`], and when.
    abandoned: Mutex<Vec<(Instant, Caller)>>,
    /// The log sink of the call that ended last, and when it ended.
    ended: Mutex<Option<(Instant, LogSink)>>,
    /// Notified when a sending call links its token, or ends.
    linked: Notify,
}

#[derive(Debug)]
struct Flight {
    id: u64,
    ctx: CallContext,
    /// Progress tokens of the requests this call sent (one per `input_required` round).
    tokens: Vec<ProgressToken>,
    /// The JSON-RPC ids of the requests this call sent through rmcp's session.
    requests: Vec<RequestId>,
    /// The task this call follows (a 2025-11-25 task), once the server has made it.
    task: Option<String>,
    /// Cancelled when the call ends, however it ends (a caller may drop it without
    /// cancelling it): questions still waiting for its caller are withdrawn. Made by the
    /// first question (most calls are asked none).
    ended: Option<CancellationToken>,
    /// Woken while a question waits for the caller, to hold off the call's idle timeout.
    activity: Arc<Notify>,
    /// Begun with [`Flights::begin_sending`] and not linked yet: its token is not known.
    sending: bool,
}

/// What a server's question says about the request it belongs to.
#[derive(Debug, Clone, Default)]
pub(crate) struct Relation {
    /// The id of the request on whose response stream it came (streamable HTTP).
    pub(crate) request: Option<RequestId>,
    /// The task it names (`io.modelcontextprotocol/related-task` in its `_meta`).
    pub(crate) task: Option<String>,
    /// The progress token in its `_meta`, which some servers copy from the request.
    pub(crate) token: Option<ProgressToken>,
}

impl Relation {
    fn is_empty(&self) -> bool {
        self.request.is_none() && self.task.is_none() && self.token.is_none()
    }
}

/// Why a server's question has no call to answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unrouted {
    /// No call is in flight.
    Idle,
    /// It names no request in flight, and this many are, with different callers.
    Ambiguous(usize),
}

impl Unrouted {
    /// What to tell the server, which asked with `method`.
    pub(crate) fn message(self, method: &str) -> String {
        match self {
            Unrouted::Idle => format!("no call in flight to answer {method}"),
            Unrouted::Ambiguous(n) => format!(
                "toolmux cannot tell which request this {method} belongs to; {n} requests are \
                 in flight: send it on the response stream of its request (streamable HTTP) \
                 or put that request's progressToken in its _meta"
            ),
        }
    }
}

/// The call a server's question belongs to.
#[derive(Debug)]
pub(crate) struct Asked {
    /// Its context, whose handler answers.
    pub(crate) ctx: CallContext,
    /// Cancelled when the call ends.
    pub(crate) ended: CancellationToken,
    /// The progress tokens of its requests, whose idle timeouts waiting holds off.
    pub(crate) tokens: Vec<ProgressToken>,
    /// Woken while the question waits, to hold off the call's idle timeout.
    pub(crate) activity: Arc<Notify>,
}

impl Flights {
    /// Records a call until the returned guard drops. Begin before sending the request:
    /// a server may ask its question before the send returns.
    pub(crate) fn begin(&self, ctx: &CallContext) -> InFlight<'_> {
        self.record(ctx, Vec::new(), Arc::default())
    }

    /// As [`Flights::begin`], for a call whose request's progress token is known only once
    /// it is sent (rmcp chooses it as it queues the request), and which links it then
    /// ([`InFlight::link`]): questions carrying a token no call has wait for that meanwhile.
    pub(crate) fn begin_sending(&self, ctx: &CallContext) -> InFlight<'_> {
        let flight = self.record(ctx, Vec::new(), Arc::default());
        if let Some(call) = self.lock().iter_mut().find(|c| c.id == flight.id) {
            call.sending = true;
        }
        flight
    }

    /// As [`Flights::begin`], for a call whose request has progress token `token`, and
    /// whose idle timeout `activity` holds off (see [`InFlight::link`] and
    /// [`InFlight::activity`]).
    pub(crate) fn begin_linked(
        &self,
        ctx: &CallContext,
        token: ProgressToken,
        activity: Arc<Notify>,
    ) -> InFlight<'_> {
        self.record(ctx, vec![token], activity)
    }

    fn record(
        &self,
        ctx: &CallContext,
        tokens: Vec<ProgressToken>,
        activity: Arc<Notify>,
    ) -> InFlight<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let flight = Flight {
            id,
            ctx: ctx.clone(),
            tokens,
            requests: Vec::new(),
            task: None,
            ended: None,
            activity,
            sending: false,
        };
        self.lock().push(flight);
        InFlight { flights: self, id }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Flight>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The context a server's request belongs to: the call it names ([`Relation`]: by the
    /// request whose stream it came on, its task, its progress token), else the only call
    /// still running. It is refused ([`Unrouted::Ambiguous`]) when another caller may have
    /// asked it: one with a call running too, or one whose call was cancelled and whose
    /// server may still be at work on it (its call in flight yet, or abandoned within
    /// [`ABANDONED_GRACE`]). Several running calls of one caller: the latest answers as any
    /// would.
    pub(crate) fn context_for(&self, relation: &Relation) -> Result<Asked, Unrouted> {
        let mut calls = self.lock();
        let index = match Self::named(&calls, relation) {
            Some(index) => index,
            None => self.only_caller(&calls)?,
        };
        let c = &mut calls[index];
        Ok(Asked {
            ctx: c.ctx.clone(),
            ended: c.ended.get_or_insert_default().clone(),
            tokens: c.tokens.clone(),
            activity: c.activity.clone(),
        })
    }

    /// The call `relation` names, if one in flight has it.
    fn named(calls: &[Flight], relation: &Relation) -> Option<usize> {
        let by_request = relation
            .request
            .as_ref()
            .and_then(|id| calls.iter().position(|c| c.requests.contains(id)));
        let by_task = || {
            let task = relation.task.as_deref()?;
            calls.iter().position(|c| c.task.as_deref() == Some(task))
        };
        let by_token = || {
            let token = relation.token.as_ref()?;
            calls.iter().position(|c| c.tokens.contains(token))
        };
        by_request.or_else(by_task).or_else(by_token)
    }

    /// The latest running call, when every call that may have asked has the same caller
    /// (the same handler, or none): a question that names none of them is then answered
    /// alike by any. Calls cancelled count as askers, in flight or abandoned lately: a
    /// question their server asks must not reach another caller, who may be another
    /// person (the key holders of a gateway share its upstream connections).
    fn only_caller(&self, calls: &[Flight]) -> Result<usize, Unrouted> {
        let mut running = calls.iter().enumerate().filter(|(_, c)| !c.ctx.is_cancelled());
        let Some((latest, call)) = running.next_back() else { return Err(Unrouted::Idle) };
        let caller = call.ctx.handler();
        let same = |other: Option<&Arc<dyn toolmux_core::InteractionHandler>>| match (caller, other)
        {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        let mut abandoned = self.abandoned.lock().unwrap_or_else(|e| e.into_inner());
        abandoned.retain(|(at, _)| at.elapsed() < ABANDONED_GRACE);
        let others = calls.iter().filter(|c| !same(c.ctx.handler())).count()
            + abandoned.iter().filter(|(_, c)| !same(c.as_ref())).count();
        match others {
            0 => Ok(latest),
            _ => Err(Unrouted::Ambiguous(calls.len() + abandoned.len())),
        }
    }

    /// As [`Flights::context_for`], but a question naming what no call has is held while a
    /// call is still sending its request, up to [`LINK_WAIT`], and looked up again as each
    /// such call links its request or ends: a server answering at once asks before the
    /// call that sent the request has linked it (rmcp gives the request's id and token
    /// only once it has queued it), and without it the question may find no call of its
    /// own, or another caller's.
    pub(crate) async fn context_for_linked(&self, relation: &Relation) -> Result<Asked, Unrouted> {
        if relation.is_empty() {
            return self.context_for(relation);
        }
        let deadline = tokio::time::Instant::now() + LINK_WAIT;
        loop {
            let linked = self.linked.notified();
            tokio::pin!(linked);
            linked.as_mut().enable();
            let unknown = {
                let calls = self.lock();
                Self::named(&calls, relation).is_none() && calls.iter().any(|c| c.sending)
            };
            if !unknown || tokio::time::timeout_at(deadline, linked).await.is_err() {
                return self.context_for(relation);
            }
        }
    }

    /// Where a log line goes: the sink of the most recently started call (none if that
    /// call does not listen), else that of a call that ended within [`LOG_GRACE`].
    pub(crate) fn log_sink(&self) -> Option<LogSink> {
        let calls = self.lock();
        if let Some(latest) = calls.last() {
            return latest.ctx.log_sink().cloned();
        }
        drop(calls);
        let ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        ended.as_ref().filter(|(at, _)| at.elapsed() < LOG_GRACE).map(|(_, sink)| sink.clone())
    }

    /// How many calls are in flight.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A call recorded in [`Flights`]; dropping it ends the record.
#[derive(Debug)]
pub(crate) struct InFlight<'a> {
    flights: &'a Flights,
    id: u64,
}

impl InFlight<'_> {
    /// Woken while one of the server's questions waits for this call's caller.
    pub(crate) fn activity(&self) -> Arc<Notify> {
        let calls = self.flights.lock();
        let flight = calls.iter().find(|c| c.id == self.id);
        flight.map(|c| c.activity.clone()).unwrap_or_default()
    }

    /// Links a request this call sent through rmcp's session, by its progress token and
    /// its JSON-RPC id: questions carrying the one or coming on the other's response
    /// stream find the call.
    pub(crate) fn link_request(&self, token: ProgressToken, id: RequestId) {
        self.update(|flight| {
            flight.tokens.push(token);
            flight.requests.push(id);
        });
    }

    /// Marks the call as sending a request again, which it links once sent: until then
    /// questions naming what no call has wait for it, as after [`Flights::begin_sending`].
    pub(crate) fn sending(&self) {
        let mut calls = self.flights.lock();
        if let Some(flight) = calls.iter_mut().find(|c| c.id == self.id) {
            flight.sending = true;
        }
    }

    /// Links the task this call follows, so that questions naming it find the call.
    pub(crate) fn link_task(&self, task: &str) {
        self.update(|flight| flight.task = Some(task.to_owned()));
    }

    fn update(&self, change: impl FnOnce(&mut Flight)) {
        let mut calls = self.flights.lock();
        if let Some(flight) = calls.iter_mut().find(|c| c.id == self.id) {
            change(flight);
            flight.sending = false;
        }
        drop(calls);
        self.flights.linked.notify_waiters();
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut calls = self.flights.lock();
        let Some(index) = calls.iter().position(|c| c.id == self.id) else { return };
        let flight = calls.remove(index);
        drop(calls);
        if flight.sending {
            self.flights.linked.notify_waiters();
        }
        if let Some(ended) = &flight.ended {
            ended.cancel();
        }
        if flight.ctx.is_cancelled() {
            let mut abandoned = self.flights.abandoned.lock().unwrap_or_else(|e| e.into_inner());
            abandoned.retain(|(at, _)| at.elapsed() < ABANDONED_GRACE);
            // A burst of cancellations keeps the latest ones.
            if abandoned.len() >= ABANDONED_MAX {
                abandoned.remove(0);
            }
            abandoned.push((Instant::now(), flight.ctx.handler().cloned()));
        }
        if let Some(sink) = flight.ctx.log_sink() {
            let ended = Some((Instant::now(), sink.clone()));
            *self.flights.ended.lock().unwrap_or_else(|e| e.into_inner()) = ended;
        }
    }
}

/// A question from the server, in toolmux's vocabulary.
#[derive(Debug)]
pub(crate) enum Question {
    Sampling(SamplingRequest),
    Elicitation(ElicitationRequest),
    /// A URL elicitation: the user is asked to open a URL.
    UrlElicitation(UrlElicitationRequest),
    /// An elicitation of a mode toolmux does not know (declined).
    OtherElicitation,
    Roots(RootsRequest),
}

impl Question {
    /// The method that asks it.
    pub(crate) fn method(&self) -> &'static str {
        match self {
            Question::Sampling(_) => "sampling/createMessage",
            Question::Elicitation(_) | Question::UrlElicitation(_) | Question::OtherElicitation => {
                "elicitation/create"
            }
            Question::Roots(_) => "roots/list",
        }
    }

    /// An elicitation request as a question.
    pub(crate) fn elicitation(params: ElicitRequestParams, key: Option<String>) -> Question {
        match params {
            ElicitRequestParams::FormElicitationParams { message, requested_schema, .. } => {
                Question::Elicitation(wire::elicitation_request(message, &requested_schema, key))
            }
            ElicitRequestParams::UrlElicitationParams { message, url, elicitation_id, .. } => {
                let mut request =
                    UrlElicitationRequest::new(message, url).with_elicitation_id(elicitation_id);
                request.key = key;
                Question::UrlElicitation(request)
            }
            _ => Question::OtherElicitation,
        }
    }
}

/// How a question went unanswered.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// The caller failed it (or cannot answer it); the error says why.
    Failed(ToolError),
    /// The server withdrew it, or the call it belongs to was cancelled.
    Cancelled,
}

impl Unanswered {
    /// What to tell the server.
    pub(crate) fn message(&self, method: &str) -> String {
        match self {
            Unanswered::Failed(error) => format!("{method} failed: {}", error.report()),
            Unanswered::Cancelled => format!("{method} cancelled"),
        }
    }
}

/// Answers `question` through `ctx`'s handler, as the result's wire JSON.
///
/// A caller that cannot answer (no handler, or one that offers no such thing) gets what
/// an unattended client answers: no roots, and form elicitations declined or, with
/// `acceptElicitationDefaults`, answered with the schema's defaults. Sampling has no
/// unattended answer and fails.
pub(crate) async fn answer(
    ctx: &CallContext,
    question: Question,
    elicitation_defaults: bool,
    withdrawn: &CancellationToken,
) -> Result<Value, Unanswered> {
    let asked = async {
        match question {
            Question::Sampling(request) => {
                ctx.sample(request).await.map(|response| wire::sampling_result(&response))
            }
            Question::Elicitation(request) => {
                let schema = request.requested_schema.clone();
                match ctx.elicit(request).await {
                    Ok(response) => Ok(wire::elicitation_result(&response)),
                    Err(ToolError::Unsupported { .. }) => {
                        Ok(unattended_elicitation(&schema, elicitation_defaults))
                    }
                    Err(error) => Err(error),
                }
            }
            // A caller that cannot show a URL declines it, as an unattended client does.
            Question::OtherElicitation => Ok(json!({"action": "decline"})),
            Question::UrlElicitation(request) => match ctx.elicit_url(request).await {
                Ok(action) => Ok(json!({ "action": action })),
                Err(ToolError::Unsupported { .. }) => Ok(json!({"action": "decline"})),
                Err(error) => Err(error),
            },
            Question::Roots(request) => match ctx.roots(request).await {
                Ok(roots) => Ok(wire::roots_result(&roots)),
                Err(ToolError::Unsupported { .. }) => Ok(json!({"roots": []})),
                Err(error) => Err(error),
            },
        }
    };
    tokio::select! {
        answer = asked => answer.map_err(Unanswered::Failed),
        () = withdrawn.cancelled() => Err(Unanswered::Cancelled),
        () = ctx.cancel_token().cancelled() => Err(Unanswered::Cancelled),
    }
}

fn unattended_elicitation(schema: &Value, defaults: bool) -> Value {
    if !defaults {
        return json!({"action": "decline"});
    }
    serde_json::to_value(answer_with_defaults(schema)).unwrap_or(json!({"action": "decline"}))
}

/// Answers one question of a 2026-07-28 `input_required` result, named `key`, through
/// the context of the request it came with; `server` names who asked.
pub(crate) async fn answer_input(
    server: &str,
    ctx: &CallContext,
    key: &str,
    request: InputRequest,
    elicitation_defaults: bool,
) -> Result<Value, ToolError> {
    let key = Some(key.to_owned());
    let question = match request {
        InputRequest::ListRoots(_) => Question::Roots(RootsRequest { key }),
        InputRequest::Elicitation(request) => Question::elicitation(request.params, key),
        InputRequest::CreateMessage(request) => {
            Question::Sampling(wire::sampling_request(&request.params, key))
        }
        other => {
            return Err(ToolError::Protocol {
                provider: server.to_owned(),
                message: format!(
                    "asked the client for a kind of input toolmux does not know: {}",
                    serde_json::to_value(&other).unwrap_or_default()
                ),
            });
        }
    };
    let method = question.method();
    match answer(ctx, question, elicitation_defaults, &CancellationToken::new()).await {
        Ok(value) => Ok(value),
        Err(Unanswered::Failed(error)) => Err(error),
        Err(Unanswered::Cancelled) => Err(ToolError::Cancelled { tool: method.to_owned() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::sync::Arc;
    use toolmux_core::{
        ApprovalDecision, ApprovalRequest, ContentPart, InteractionHandler, Role, Root,
        SamplingResponse,
    };

    #[derive(Debug)]
    struct Answers;

    #[async_trait]
    impl InteractionHandler for Answers {
        async fn approve(&self, _: ApprovalRequest) -> ApprovalDecision {
            ApprovalDecision::Allow
        }
        async fn sample(&self, request: SamplingRequest) -> Result<SamplingResponse, ToolError> {
            let asked = format!("{:?}", request.messages[0].content);
            Ok(SamplingResponse {
                role: Role::Assistant,
                content: ContentPart::Text { text: format!("sampled {asked}") },
                model: "test".into(),
                stop_reason: None,
            })
        }
        async fn roots(&self, _: RootsRequest) -> Result<Vec<Root>, ToolError> {
            Ok(vec![Root { uri: "file:///w".into(), name: None }])
        }
    }

    /// A question naming nothing (none of `request`, `task`, `token`).
    fn unnamed() -> Relation {
        Relation::default()
    }

    fn by_token(token: ProgressToken) -> Relation {
        Relation { token: Some(token), ..Relation::default() }
    }

    #[test]
    fn questions_go_to_the_latest_running_call_or_the_one_with_their_token() {
        let flights = Flights::default();
        assert_eq!(flights.context_for(&unnamed()).unwrap_err(), Unrouted::Idle);
        let first = CallContext::new().with_call_id("first");
        let second = CallContext::new().with_call_id("second");
        let a = flights.begin(&first);
        a.link_request(
            ProgressToken(rmcp::model::NumberOrString::Number(7)),
            rmcp::model::NumberOrString::Number(70),
        );
        {
            // Neither has a handler: any answers as the other would.
            let _b = flights.begin(&second);
            assert_eq!(flights.context_for(&unnamed()).unwrap().ctx.call_id(), Some("second"));
            let token = by_token(ProgressToken(rmcp::model::NumberOrString::Number(7)));
            assert_eq!(flights.context_for(&token).unwrap().ctx.call_id(), Some("first"));
            second.cancel_token().cancel();
            assert_eq!(flights.context_for(&unnamed()).unwrap().ctx.call_id(), Some("first"));
        }
        assert_eq!(flights.len(), 1);
        drop(a);
        assert_eq!(flights.len(), 0);
    }

    /// Two calls sending at once, the server asking the first's question before either
    /// has linked its token: the question waits for the link and goes to the first call,
    /// where the most recent call in flight, the second, answered it.
    #[tokio::test]
    async fn a_question_waits_for_the_sending_call_to_link_its_token() {
        let flights = Arc::new(Flights::default());
        let first = CallContext::new().with_call_id("first");
        let second = CallContext::new().with_call_id("second");
        let token = |n| ProgressToken(rmcp::model::NumberOrString::Number(n));
        let a = flights.begin_sending(&first);
        let b = flights.begin_sending(&second);
        let asking = {
            let flights = flights.clone();
            tokio::spawn(async move { flights.context_for_linked(&by_token(token(1))).await })
        };
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!asking.is_finished(), "the question waits while both calls are sending");
        b.link_request(token(2), rmcp::model::NumberOrString::Number(2));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!asking.is_finished(), "another call's link does not end the wait");
        a.link_request(token(1), rmcp::model::NumberOrString::Number(1));
        let asked = tokio::time::timeout(Duration::from_secs(5), asking).await.unwrap().unwrap();
        assert_eq!(asked.unwrap().ctx.call_id(), Some("first"));
        // No call sending: a token nobody has goes to the latest call at once.
        let stray = flights.context_for_linked(&by_token(token(9))).await.unwrap();
        assert_eq!(stray.ctx.call_id(), Some("second"));
        drop((a, b));
    }

    /// A question whose token no call links is held no longer than [`LINK_WAIT`], nor
    /// once the sending call ends without linking (its send failed).
    #[tokio::test(start_paused = true)]
    async fn a_question_with_a_token_nobody_links_is_held_briefly() {
        let flights = Arc::new(Flights::default());
        let ctx = CallContext::new().with_call_id("only");
        let sending = flights.begin_sending(&ctx);
        let token = ProgressToken(rmcp::model::NumberOrString::Number(3));
        let started = tokio::time::Instant::now();
        let asked = flights.context_for_linked(&by_token(token.clone())).await.unwrap();
        assert_eq!(asked.ctx.call_id(), Some("only"));
        assert_eq!(started.elapsed(), LINK_WAIT);
        let other = CallContext::new().with_call_id("other");
        let _running = flights.begin(&other);
        let asking = {
            let flights = flights.clone();
            tokio::spawn(async move { flights.context_for_linked(&by_token(token)).await })
        };
        tokio::task::yield_now().await;
        let started = tokio::time::Instant::now();
        drop(sending);
        let asked = asking.await.unwrap().unwrap();
        assert_eq!(asked.ctx.call_id(), Some("other"));
        assert!(started.elapsed() < LINK_WAIT, "woken by the end of the sending call");
    }

    /// A call recorded with its token is found by it and shares its activity; its end
    /// withdraws every question it was asked.
    #[test]
    fn a_call_s_end_reaches_the_questions_it_was_asked() {
        let flights = Flights::default();
        let activity = Arc::new(Notify::new());
        let token = ProgressToken(rmcp::model::NumberOrString::String("tm-1".into()));
        let ctx = CallContext::new().with_call_id("c");
        let call = flights.begin_linked(&ctx, token.clone(), activity.clone());
        let first = flights.context_for(&by_token(token.clone())).expect("found by its token");
        let second = flights.context_for(&unnamed()).expect("the latest call");
        assert_eq!(first.ctx.call_id(), Some("c"));
        assert!(Arc::ptr_eq(&first.activity, &activity));
        assert_eq!(first.tokens, [token]);
        assert!(!first.ended.is_cancelled());
        drop(call);
        assert!(first.ended.is_cancelled() && second.ended.is_cancelled());
        assert_eq!(flights.context_for(&unnamed()).unwrap_err(), Unrouted::Idle);
    }

    /// Two callers with handlers of their own: a question naming neither's request is
    /// refused, naming the number in flight; one naming a request, a task or a token goes
    /// to its call; with one caller left, to it.
    #[test]
    fn a_question_naming_no_request_of_two_callers_is_refused() {
        let flights = Flights::default();
        let first = CallContext::new().with_call_id("first").with_handler(Arc::new(Answers));
        let second = CallContext::new().with_call_id("second").with_handler(Arc::new(Answers));
        let a = flights.begin_sending(&first);
        let b = flights.begin(&second);
        assert_eq!(flights.context_for(&unnamed()).unwrap_err(), Unrouted::Ambiguous(2));
        let id = rmcp::model::NumberOrString::Number(4);
        a.link_request(ProgressToken(rmcp::model::NumberOrString::Number(40)), id.clone());
        let request = Relation { request: Some(id), ..Relation::default() };
        assert_eq!(flights.context_for(&request).unwrap().ctx.call_id(), Some("first"));
        b.link_task("task-9");
        let task = Relation { task: Some("task-9".into()), ..Relation::default() };
        assert_eq!(flights.context_for(&task).unwrap().ctx.call_id(), Some("second"));
        // A request nobody sent names nothing: refused as well.
        let stray = Relation {
            request: Some(rmcp::model::NumberOrString::Number(5)),
            ..Relation::default()
        };
        assert_eq!(flights.context_for(&stray).unwrap_err(), Unrouted::Ambiguous(2));
        let message = Unrouted::Ambiguous(2).message("elicitation/create");
        assert!(message.contains("cannot tell which request") && message.contains("2 requests"));
        // The same handler on both: either answers as the other would.
        let shared: Arc<dyn InteractionHandler> = Arc::new(Answers);
        let third = CallContext::new().with_call_id("third").with_handler(shared.clone());
        let fourth = CallContext::new().with_call_id("fourth").with_handler(shared);
        drop((a, b));
        let _c = flights.begin(&third);
        let _d = flights.begin(&fourth);
        assert_eq!(flights.context_for(&unnamed()).unwrap().ctx.call_id(), Some("fourth"));
        // A cancelled caller is not asked, but counted: its server may still ask.
        fourth.cancel_token().cancel();
        let _e = flights.begin(&first);
        assert_eq!(flights.context_for(&unnamed()).unwrap_err(), Unrouted::Ambiguous(3));
    }

    /// A question naming no call, asked while one caller's call runs and another's was
    /// cancelled, is refused, whether the cancelled call is still in flight or has just
    /// ended: its server may be asking for it, and the running call's caller (another key
    /// holder of a gateway, sharing the connection) must not be shown it. It went to the
    /// running call.
    #[test]
    fn a_question_is_not_routed_past_another_caller_s_cancelled_call() {
        let flights = Flights::default();
        let of_alice = CallContext::new().with_call_id("alice").with_handler(Arc::new(Answers));
        let of_bob = CallContext::new().with_call_id("bob").with_handler(Arc::new(Answers));
        let alice = flights.begin(&of_alice);
        let _bob = flights.begin(&of_bob);
        of_alice.cancel_token().cancel();
        assert_eq!(flights.context_for(&unnamed()).unwrap_err(), Unrouted::Ambiguous(2));
        drop(alice);
        assert_eq!(flights.context_for(&unnamed()).unwrap_err(), Unrouted::Ambiguous(2));
        // A call that ended with its answer leaves nobody else who may have asked.
        let fresh = Flights::default();
        let _bob = fresh.begin(&of_bob);
        let answered = CallContext::new().with_call_id("answered").with_handler(Arc::new(Answers));
        drop(fresh.begin(&answered));
        assert_eq!(fresh.context_for(&unnamed()).unwrap().ctx.call_id(), Some("bob"));
    }

    #[test]
    fn log_lines_go_to_the_latest_call_or_one_that_just_ended() {
        let flights = Flights::default();
        assert!(flights.log_sink().is_none());
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let lines = lines.clone();
            LogSink::new(move |m| lines.lock().unwrap().push(m))
        };
        let listening = CallContext::new().with_log(sink);
        let first = flights.begin(&listening);
        flights
            .log_sink()
            .expect("the sink of the latest call")
            .log(toolmux_core::LogMessage::text(toolmux_core::LogLevel::Info, "a"));
        let second = flights.begin(&CallContext::new());
        assert!(flights.log_sink().is_none(), "the latest call does not listen");
        drop(second);
        assert!(flights.log_sink().is_some(), "the first call is the latest again");
        drop(first);
        assert!(flights.log_sink().is_some(), "the call that just ended still listens");
        assert_eq!(lines.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn unattended_callers_get_the_unattended_answers() {
        let ctx = CallContext::new();
        let never = CancellationToken::new();
        let schema = json!({"properties": {"n": {"type": "string", "default": "x"}}});
        let ask = || Question::Elicitation(ElicitationRequest::new("?", schema.clone()));
        let declined = answer(&ctx, ask(), false, &never).await.unwrap();
        assert_eq!(declined, json!({"action": "decline"}));
        let defaults = answer(&ctx, ask(), true, &never).await.unwrap();
        assert_eq!(defaults, json!({"action": "accept", "content": {"n": "x"}}));
        let roots = answer(&ctx, Question::Roots(RootsRequest::default()), false, &never).await;
        assert_eq!(roots.unwrap(), json!({"roots": []}));
        let sampled =
            answer(&ctx, Question::Sampling(SamplingRequest::text("hi", 5)), false, &never).await;
        let Err(Unanswered::Failed(ToolError::Unsupported { .. })) = sampled else {
            panic!("{sampled:?}")
        };
    }

    #[tokio::test]
    async fn handlers_answer_and_elicitations_they_cannot_answer_fall_back() {
        let ctx = CallContext::new().with_handler(Arc::new(Answers));
        let never = CancellationToken::new();
        let sampled =
            answer(&ctx, Question::Sampling(SamplingRequest::text("hi", 5)), false, &never)
                .await
                .unwrap();
        assert_eq!(sampled["content"]["text"], r#"sampled Text { text: "hi" }"#);
        let roots =
            answer(&ctx, Question::Roots(RootsRequest::default()), false, &never).await.unwrap();
        assert_eq!(roots, json!({"roots": [{"uri": "file:///w"}]}));
        let elicited = answer(
            &ctx,
            Question::Elicitation(ElicitationRequest::new("?", json!({}))),
            false,
            &never,
        )
        .await
        .unwrap();
        assert_eq!(elicited, json!({"action": "decline"}));
    }

    #[tokio::test]
    async fn a_withdrawn_question_stops_waiting() {
        #[derive(Debug)]
        struct Never;
        #[async_trait]
        impl InteractionHandler for Never {
            async fn approve(&self, _: ApprovalRequest) -> ApprovalDecision {
                ApprovalDecision::Allow
            }
            async fn roots(&self, _: RootsRequest) -> Result<Vec<Root>, ToolError> {
                std::future::pending().await
            }
        }
        let ctx = CallContext::new().with_handler(Arc::new(Never));
        let withdrawn = CancellationToken::new();
        withdrawn.cancel();
        let answer = answer(&ctx, Question::Roots(RootsRequest::default()), false, &withdrawn);
        assert!(matches!(answer.await, Err(Unanswered::Cancelled)));
    }
}
