//! Everything a call carries besides its arguments: cancellation, deadline, identity,
//! its place in the operation tree, where progress goes and who answers questions.

use crate::trace::TraceParent;
use crate::{
    ElicitationAction, ElicitationRequest, ElicitationResponse, LogLevel, LogMessage, LogSink,
    Root, RootsRequest, SamplingRequest, SamplingResponse, ToolError, UrlElicitationRequest,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A progress report from a running tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Work done so far, in the tool's own units; increases monotonically.
    pub progress: f64,
    /// The total, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// A human message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Progress {
    /// A report of `progress` out of an optional `total`.
    pub fn new(progress: f64, total: Option<f64>) -> Self {
        Progress { progress, total, message: None }
    }

    /// Adds a message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }
}

/// Where a tool sends its progress reports. Cheap to clone.
#[derive(Clone)]
pub struct ProgressSink(Arc<dyn Fn(Progress) + Send + Sync>);

impl ProgressSink {
    /// A sink calling `f` for every report; `f` must return quickly.
    pub fn new(f: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        ProgressSink(Arc::new(f))
    }

    /// Delivers one report.
    pub fn report(&self, progress: Progress) {
        (self.0)(progress);
    }
}

impl fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// A request for a person (or a policy engine) to allow a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The full tool name.
    pub tool: String,
    /// The validated arguments.
    pub arguments: Value,
    /// Why approval is needed (the matching rule).
    pub reason: String,
    /// What a standing answer ("always") may cover, when narrower than the tool: the rule
    /// on calls that asked (`fs__bash(git push *)`), whose other calls it then allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// The id of the call that asks (a model's tool call id), when it has one: what a
    /// paused run's pending approvals are named by, and decided by on resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// The answer to an [`ApprovalRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// Run the call.
    Allow,
    /// Refuse it; the reason reaches the model.
    Deny {
        /// Why, in words the model can act on.
        reason: String,
    },
}

/// Answers, on behalf of the caller, what a call asks: approval to run, a clarifying
/// question, a completion from the caller's model (sampling), structured input from the
/// caller's user (elicitation) and the caller's roots.
///
/// Every method but `approve` has a default that says the caller cannot answer: sampling,
/// elicitation and roots fail with [`ToolError::Unsupported`], which tools report to the
/// model instead of waiting.
#[async_trait]
pub trait InteractionHandler: Send + Sync + fmt::Debug {
    /// Decides whether a call that a permission rule marks `ask` may run.
    async fn approve(&self, request: ApprovalRequest) -> ApprovalDecision;

    /// Answers a question from a tool; `None` when nobody can answer.
    async fn clarify(&self, question: &str) -> Option<String> {
        let _ = question;
        None
    }

    /// One completion from the caller's model.
    async fn sample(&self, request: SamplingRequest) -> Result<SamplingResponse, ToolError> {
        let _ = request;
        Err(ToolError::unsupported("sampling", "the caller does not offer sampling"))
    }

    /// Structured input from the caller's user.
    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        let _ = request;
        Err(ToolError::unsupported("elicitation", "the caller does not offer elicitation"))
    }

    /// Whether the caller's user agreed to open a URL (MCP's URL-mode elicitation).
    async fn elicit_url(
        &self,
        request: UrlElicitationRequest,
    ) -> Result<ElicitationAction, ToolError> {
        let _ = request;
        Err(ToolError::unsupported("url elicitation", "the caller cannot show its user a URL"))
    }

    /// The server that asked the user to open a URL (an [`UrlElicitationRequest`] with
    /// `elicitation_id`) says the interaction there is complete (MCP's
    /// `notifications/elicitation/complete`), so a client may close its prompt or retry.
    /// Nothing is owed back; the default ignores it.
    async fn url_elicitation_complete(&self, elicitation_id: &str) {
        let _ = elicitation_id;
    }

    /// The caller's workspace roots.
    async fn roots(&self, request: RootsRequest) -> Result<Vec<Root>, ToolError> {
        let _ = request;
        Err(ToolError::unsupported("roots", "the caller does not share its roots"))
    }
}

/// One node of the operation tree: a tool call, with its parent call if it was made from
/// inside another (a sub-agent's call, a batch).
///
/// The orchestrator records here which queues the operation holds a slot of, so that a
/// descendant waiting on the same full queue fails fast instead of deadlocking.
#[derive(Debug)]
pub struct Op {
    id: u64,
    tool: Arc<str>,
    parent: Option<Arc<Op>>,
    held_queues: Mutex<Vec<Arc<str>>>,
}

static NEXT_OP: AtomicU64 = AtomicU64::new(1);

impl Op {
    /// A new operation for `tool` under `parent`.
    pub fn new(tool: impl Into<Arc<str>>, parent: Option<Arc<Op>>) -> Arc<Op> {
        Arc::new(Op {
            id: NEXT_OP.fetch_add(1, Ordering::Relaxed),
            tool: tool.into(),
            parent,
            held_queues: Mutex::new(Vec::new()),
        })
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The tool this operation runs.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// The enclosing operation.
    pub fn parent(&self) -> Option<&Arc<Op>> {
        self.parent.as_ref()
    }

    /// The operations above this one, nearest first.
    pub fn ancestors(&self) -> impl Iterator<Item = &Op> {
        std::iter::successors(self.parent.as_deref(), |op| op.parent.as_deref())
    }

    /// Depth in the tree; a top-level call is 0.
    pub fn depth(&self) -> usize {
        self.ancestors().count()
    }

    /// Records that this operation holds a slot of `queue`.
    pub fn hold_queue(&self, queue: &Arc<str>) {
        self.held_queues.lock().unwrap_or_else(|e| e.into_inner()).push(queue.clone());
    }

    /// Records that this operation released its slot of `queue`.
    pub fn release_queue(&self, queue: &str) {
        let mut held = self.held_queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = held.iter().position(|q| &**q == queue) {
            held.swap_remove(at);
        }
    }

    /// Whether this operation holds a slot of `queue` now.
    pub fn holds_queue(&self, queue: &str) -> bool {
        self.held_queues.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|q| &**q == queue)
    }

    /// The nearest ancestor holding a slot of `queue`.
    pub fn ancestor_holding(&self, queue: &str) -> Option<&Op> {
        self.ancestors().find(|op| op.holds_queue(queue))
    }
}

/// Headers that belong to one HTTP connection or exchange (the transport's own and MCP's),
/// never passed on from a caller's request to another service, whatever a configuration's
/// `passthroughHeaders` names.
pub const CONNECTION_HEADERS: [&str; 14] = [
    "host",
    "content-length",
    "content-type",
    "accept",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "proxy-authorization",
];

/// Whether a header named so (any letter case) may be passed on at all: not one of the
/// [`CONNECTION_HEADERS`].
pub fn passable_header(name: &str) -> bool {
    !CONNECTION_HEADERS.iter().any(|own| own.eq_ignore_ascii_case(name))
}

/// The context of one call. Cloning is cheap (a few reference counts).
///
/// A context made with [`CallContext::new`] has no deadline, no parent, no progress sink
/// and no interaction handler; the orchestrator fills in what the pipeline decides.
#[derive(Debug, Clone)]
pub struct CallContext {
    cancel: CancellationToken,
    deadline: Option<Instant>,
    call_id: Option<Arc<str>>,
    run_id: Arc<str>,
    op: Option<Arc<Op>>,
    progress: Option<ProgressSink>,
    log: Option<LogSink>,
    handler: Option<Arc<dyn InteractionHandler>>,
    /// Set when the call asked its caller something (see [`CallContext::track_asking`]).
    asked: Option<Arc<AtomicBool>>,
    /// A person made the call directly, not a model ([`CallContext::from_person`]).
    from_person: bool,
    /// The caller's own bookkeeping, outside the run's budget ([`CallContext::outside_budget`]).
    outside_budget: bool,
    /// Its place in queues ([`CallContext::with_priority`]).
    priority: i32,
    /// How long the provider waits for the answer ([`CallContext::with_wait`]).
    wait: Option<Duration>,
    /// The caller's trace ([`CallContext::with_trace_parent`]).
    trace: Option<TraceParent>,
    /// The caller's `tracestate`, passed on as it came.
    trace_state: Option<Arc<str>>,
    /// Headers of the caller's HTTP request ([`CallContext::with_caller_headers`]).
    caller_headers: Option<Arc<[(String, String)]>>,
    /// Answers a relayed call's caller at once ([`CallContext::with_early_answer`]).
    early_answer: Option<EarlyAnswer>,
}

/// Answers the caller of a relayed call ([`crate::ToolProvider::relay`]) with a result the
/// provider has as the server wrote it, before the call returns: a gateway's hook, given
/// the JSON text of a [`crate::Relayed::Raw`] result. It answers, and returns `true`, at
/// most once; `false` when it did not (the caller is gone, or was answered already). The
/// call still returns its result as usual, for the rest of its bookkeeping.
#[derive(Clone)]
pub struct EarlyAnswer(Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl EarlyAnswer {
    /// The hook `answer`.
    pub fn new(answer: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        EarlyAnswer(Arc::new(answer))
    }

    /// Answers the caller with `result` (the JSON text of a raw result); whether it did.
    pub fn answer(&self, result: &str) -> bool {
        (self.0)(result)
    }
}

impl fmt::Debug for EarlyAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EarlyAnswer")
    }
}

impl Default for CallContext {
    fn default() -> Self {
        CallContext::cancelled_by(CancellationToken::new(), default_run_id())
    }
}

/// The run id `default`, shared: a context is made for every call.
fn default_run_id() -> Arc<str> {
    static DEFAULT: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(|| Arc::from("default")).clone()
}

impl CallContext {
    /// A fresh top-level context in run `default`.
    pub fn new() -> Self {
        CallContext::default()
    }

    /// A fresh top-level context in run `run_id`, cancelled by `cancel`: as
    /// `CallContext::new().with_cancel(cancel).with_run_id(run_id)`, without making a
    /// token to drop at once (a context is made for every call).
    pub fn cancelled_by(cancel: CancellationToken, run_id: Arc<str>) -> Self {
        CallContext {
            cancel,
            deadline: None,
            call_id: None,
            run_id,
            op: None,
            progress: None,
            log: None,
            handler: None,
            asked: None,
            from_person: false,
            outside_budget: false,
            priority: 0,
            wait: None,
            trace: None,
            trace_state: None,
            caller_headers: None,
            early_answer: None,
        }
    }

    /// Sets the caller's place in a distributed trace: the spans of this call and of the
    /// calls made inside it join that trace.
    pub fn with_trace_parent(mut self, trace: Option<TraceParent>) -> Self {
        self.trace = trace;
        self
    }

    /// The caller's place in a distributed trace, if it gave one.
    pub fn trace_parent(&self) -> Option<&TraceParent> {
        self.trace.as_ref()
    }

    /// The caller's values of the headers `names` (those it did not send are told apart
    /// from empty ones), one per line: what a provider passing them on returns as its
    /// [`ToolProvider::cache_partition`](crate::ToolProvider::cache_partition).
    pub fn caller_header_values<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> String {
        let mut values = String::new();
        for name in names {
            match self.caller_header(name) {
                Some(value) => {
                    values.push('=');
                    values.push_str(value);
                }
                None => values.push('-'),
            }
            values.push('\n');
        }
        values
    }

    /// Sets the headers of the caller's HTTP request (names in lowercase), which providers
    /// configured to pass some on to their servers read ([`CallContext::caller_header`]).
    /// Whoever sets them leaves out the ones that authenticated the caller.
    pub fn with_caller_headers(mut self, headers: Vec<(String, String)>) -> Self {
        self.caller_headers = (!headers.is_empty()).then(|| Arc::from(headers));
        self
    }

    /// The value of the caller's HTTP request header `name` (any letter case), if it
    /// sent one.
    pub fn caller_header(&self, name: &str) -> Option<&str> {
        self.caller_headers
            .as_deref()?
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Sets the hook that answers a relayed call's caller as soon as a provider has a raw
    /// result within the size asked for ([`EarlyAnswer`]). Only a stage that leaves such a
    /// result as it is may pass the hook on: the orchestrator keeps it for relayed calls
    /// and takes it away from every other.
    pub fn with_early_answer(mut self, answer: Option<EarlyAnswer>) -> Self {
        self.early_answer = answer;
        self
    }

    /// The hook that answers this relayed call's caller at once, if there is one.
    pub fn early_answer(&self) -> Option<&EarlyAnswer> {
        self.early_answer.as_ref()
    }

    /// Sets the caller's `tracestate` (vendors' trace data), passed on with the trace.
    pub fn with_trace_state(mut self, state: Option<String>) -> Self {
        self.trace_state = state.filter(|s| !s.is_empty()).map(Arc::from);
        self
    }

    /// The caller's `tracestate`, if it gave one.
    pub fn trace_state(&self) -> Option<&str> {
        self.trace_state.as_deref()
    }

    /// The `traceparent` to send with a request this call makes to another service, so
    /// that its work joins the trace: when spans are exported
    /// ([`crate::trace::spans_exported`]), this call's span (in the caller's trace, or
    /// else the run's) is the parent; when not, the caller's own `traceparent` goes on as
    /// it came. `None` when there is no trace to join.
    pub fn outgoing_trace(&self) -> Option<TraceParent> {
        let op = self.op.as_ref().filter(|_| crate::trace::spans_exported());
        match (self.trace, op) {
            (Some(caller), Some(op)) => Some(TraceParent {
                span_id: crate::trace::span_id(&self.run_id, op.id()),
                ..caller
            }),
            (Some(caller), None) => Some(caller),
            (None, Some(op)) => Some(TraceParent {
                trace_id: crate::trace::run_trace_id(&self.run_id),
                span_id: crate::trace::span_id(&self.run_id, op.id()),
                flags: 1,
            }),
            (None, None) => None,
        }
    }

    /// Sets the cancellation token.
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Sets the deadline.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the caller's call id.
    pub fn with_call_id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.call_id = Some(id.into());
        self
    }

    /// Sets the run id (one agent run, one gateway session).
    pub fn with_run_id(mut self, id: impl Into<Arc<str>>) -> Self {
        self.run_id = id.into();
        self
    }

    /// Marks the call as made by a person directly (`toolmux tools call`), not by a model:
    /// guards against a model's blind changes (overwriting a file it has not read) need
    /// not hold. Calls made on its behalf ([`CallContext::child`], an agent's) are not.
    pub fn from_person(mut self) -> Self {
        self.from_person = true;
        self
    }

    /// Whether a person made the call directly ([`CallContext::from_person`]).
    pub fn is_from_person(&self) -> bool {
        self.from_person
    }

    /// Marks the call as its caller's own bookkeeping, not the run's work (a listening
    /// agent polling its inbox every second): the run's budget (`maxToolCallsPerRun`,
    /// `maxToolTimeMs`) neither counts nor refuses it. Calls made inside it are counted.
    pub fn outside_budget(mut self) -> Self {
        self.outside_budget = true;
        self
    }

    /// Whether the call is outside the run's budget ([`CallContext::outside_budget`]).
    pub fn is_outside_budget(&self) -> bool {
        self.outside_budget
    }

    /// Sets the call's priority in the queues it waits in (default 0): a waiting call of a
    /// higher priority takes the next free slot before those of a lower one, which keep
    /// their order. Added to the tool's own (`tools.NAME.priority`); calls made inside this
    /// one ([`CallContext::child`]) have it too.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The call's priority in queues ([`CallContext::with_priority`]).
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Sets how long a provider that times its own calls (an MCP server's, whose wait
    /// each progress report restarts) waits for this call's answer, instead of its default:
    /// the tool's own setting (`tools.NAME.timeout`).
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The wait set for this call ([`CallContext::with_wait`]), if any.
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// Sets the operation this call runs as.
    pub fn with_op(mut self, op: Arc<Op>) -> Self {
        self.op = Some(op);
        self
    }

    /// Sets the progress sink.
    pub fn with_progress(mut self, sink: ProgressSink) -> Self {
        self.progress = Some(sink);
        self
    }

    /// Removes the progress sink.
    pub fn without_progress(mut self) -> Self {
        self.progress = None;
        self
    }

    /// Sets where the call's log lines go.
    pub fn with_log(mut self, sink: LogSink) -> Self {
        self.log = Some(sink);
        self
    }

    /// Sets the approval and clarification handler.
    pub fn with_handler(mut self, handler: Arc<dyn InteractionHandler>) -> Self {
        self.handler = Some(handler);
        self
    }

    /// The cancellation token; tools stop work soon after it fires.
    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether the call was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The caller's call id.
    pub fn call_id(&self) -> Option<&str> {
        self.call_id.as_deref()
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The operation this call runs as; its ancestors are the calls that led to it.
    pub fn op(&self) -> Option<&Arc<Op>> {
        self.op.as_ref()
    }

    /// The progress sink.
    pub fn progress_sink(&self) -> Option<&ProgressSink> {
        self.progress.as_ref()
    }

    /// Reports progress, if anyone listens.
    pub fn report_progress(&self, progress: Progress) {
        if let Some(sink) = &self.progress {
            sink.report(progress);
        }
    }

    /// Starts recording, for this context and its clones, whether the call asks its caller
    /// anything through [`CallContext::sample`], [`CallContext::elicit`] or
    /// [`CallContext::roots`]. An output that depended on the caller's answers is theirs
    /// alone: the orchestrator does not cache it nor share it with identical calls.
    pub fn track_asking(mut self) -> Self {
        self.asked = Some(Arc::new(AtomicBool::new(false)));
        self
    }

    /// Whether the call asked its caller anything since [`CallContext::track_asking`].
    pub fn asked_caller(&self) -> bool {
        self.asked.as_ref().is_some_and(|a| a.load(Ordering::Acquire))
    }

    fn mark_asked(&self) {
        if let Some(asked) = &self.asked {
            asked.store(true, Ordering::Release);
        }
    }

    /// The log sink.
    pub fn log_sink(&self) -> Option<&LogSink> {
        self.log.as_ref()
    }

    /// Sends a log line to the caller, if anyone listens.
    pub fn log(&self, message: LogMessage) {
        if let Some(sink) = &self.log {
            sink.log(message);
        }
    }

    /// Sends a text log line at `level` to the caller, if anyone listens.
    pub fn log_text(&self, level: LogLevel, text: impl Into<String>) {
        if let Some(sink) = &self.log {
            sink.log(LogMessage::text(level, text));
        }
    }

    /// The approval and clarification handler.
    pub fn handler(&self) -> Option<&Arc<dyn InteractionHandler>> {
        self.handler.as_ref()
    }

    /// Asks the caller's model for a completion; fails with [`ToolError::Unsupported`]
    /// when no handler is attached or the caller does not offer sampling.
    pub async fn sample(&self, request: SamplingRequest) -> Result<SamplingResponse, ToolError> {
        self.mark_asked();
        match &self.handler {
            Some(handler) => handler.sample(request).await,
            None => Err(no_handler("sampling")),
        }
    }

    /// Asks the caller's user for input; fails with [`ToolError::Unsupported`] when no
    /// handler is attached or the caller does not offer elicitation.
    pub async fn elicit(
        &self,
        request: ElicitationRequest,
    ) -> Result<ElicitationResponse, ToolError> {
        self.mark_asked();
        match &self.handler {
            Some(handler) => handler.elicit(request).await,
            None => Err(no_handler("elicitation")),
        }
    }

    /// Asks the caller's user to open a URL; fails with [`ToolError::Unsupported`] when
    /// no handler is attached or the caller cannot show its user a URL.
    pub async fn elicit_url(
        &self,
        request: UrlElicitationRequest,
    ) -> Result<ElicitationAction, ToolError> {
        self.mark_asked();
        match &self.handler {
            Some(handler) => handler.elicit_url(request).await,
            None => Err(no_handler("url elicitation")),
        }
    }

    /// The caller's roots; fails with [`ToolError::Unsupported`] when no handler is
    /// attached or the caller does not share them.
    pub async fn roots(&self, request: RootsRequest) -> Result<Vec<Root>, ToolError> {
        self.mark_asked();
        match &self.handler {
            Some(handler) => handler.roots(request).await,
            None => Err(no_handler("roots")),
        }
    }

    /// A context for a call made from inside this one: same run, handler and log sink, a
    /// child cancellation token, the current operation as parent, no progress sink and no
    /// call id.
    pub fn child(&self) -> CallContext {
        CallContext {
            cancel: self.cancel.child_token(),
            deadline: self.deadline,
            call_id: None,
            run_id: self.run_id.clone(),
            op: self.op.clone(),
            progress: None,
            log: self.log.clone(),
            handler: self.handler.clone(),
            asked: self.asked.clone(),
            from_person: false,
            outside_budget: false,
            priority: self.priority,
            wait: None,
            trace: self.trace,
            trace_state: self.trace_state.clone(),
            caller_headers: self.caller_headers.clone(),
            // A call made inside this one has a caller of its own: this one.
            early_answer: None,
        }
    }
}

fn no_handler(what: &str) -> ToolError {
    ToolError::unsupported(what, "nobody is attached to answer this call's requests")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_and_held_queues() {
        let root = Op::new("a__outer", None);
        let mid = Op::new("b__mid", Some(root.clone()));
        let leaf = Op::new("c__leaf", Some(mid));
        assert_eq!(leaf.depth(), 2);
        let q: Arc<str> = Arc::from("q");
        root.hold_queue(&q);
        assert_eq!(leaf.ancestor_holding("q").map(Op::tool), Some("a__outer"));
        assert!(leaf.ancestor_holding("other").is_none());
        root.release_queue("q");
        assert!(leaf.ancestor_holding("q").is_none());
    }

    #[tokio::test]
    async fn asking_the_caller_is_recorded_when_tracked() {
        let untracked = CallContext::new();
        let _ = untracked.roots(RootsRequest::default()).await;
        assert!(!untracked.asked_caller());
        let tracked = CallContext::new().track_asking();
        assert!(!tracked.asked_caller());
        let clone = tracked.clone();
        let answer = clone.elicit(ElicitationRequest::new("?", Value::Null)).await;
        assert!(matches!(answer, Err(ToolError::Unsupported { .. })));
        assert!(tracked.asked_caller());
    }

    #[test]
    fn child_context_inherits_cancellation() {
        let ctx = CallContext::new().with_call_id("1");
        let child = ctx.child();
        assert!(child.call_id().is_none());
        ctx.cancel_token().cancel();
        assert!(child.is_cancelled());
    }
}
