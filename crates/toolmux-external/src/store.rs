//! Pending external calls and the inboxes of runs: the [`PendingStore`] trait and its
//! in-process implementation.

use crate::ExecutionType;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use toolmux_core::{ToolError, ToolOutput};

/// A call of an external tool waiting for its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingCall {
    /// Its id, given by the store.
    pub call_id: String,
    /// The tool's full name (`external__confirm`).
    pub tool: String,
    /// The arguments it was called with.
    pub arguments: Value,
    /// The run that made the call; its inbox gets results that arrive too late.
    pub run_id: String,
    /// The agent that made it (`agent:NAME`), when an agent did: its reads of the run's
    /// inbox take its own results only, so that a sub-agent (which shares its caller's
    /// run) never takes its caller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Who answers it.
    pub execution_type: ExecutionType,
    /// Whether the call returned at once (the result goes to the inbox).
    #[serde(rename = "async")]
    pub is_async: bool,
    /// Whether a user interface shows it.
    pub visible: bool,
    /// When it was made, in milliseconds since the Unix epoch (set by the store).
    pub created_ms: u64,
    /// Where its result goes now (set by the store when it lists the call).
    #[serde(default)]
    pub status: CallStatus,
    /// When it expires unanswered, in milliseconds since the Unix epoch (set by the store
    /// when it lists the call; 0 until then): the seeds' `expiresAt`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expires_ms: u64,
    /// How long it waits for its result, in milliseconds, when its tool says
    /// (`externalTools.NAME.callTtl`); `None` for the store's time to live. Counted as the
    /// store's is: from its opening, or from the end of its caller's wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

impl PendingCall {
    /// Its time to live: its own ([`PendingCall::ttl_ms`]), else `default` (the store's);
    /// at least a millisecond, and at most `longest`.
    pub fn ttl(&self, default: Duration, longest: Duration) -> Duration {
        let ttl = self.ttl_ms.map_or(default, Duration::from_millis);
        ttl.clamp(Duration::from_millis(1), longest.max(Duration::from_millis(1)))
    }
}

/// Where a pending call's result goes: the seeds' `PendingToolCall.status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallStatus {
    /// To the run's inbox: an asynchronous call, or a synchronous one whose caller stopped
    /// waiting.
    #[default]
    Pending,
    /// To its caller, which is waiting for it (a synchronous call).
    Waiting,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A submitted result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalResult {
    /// A text, or any JSON value.
    pub result: Value,
    /// The result is a failure.
    pub is_error: bool,
}

impl ExternalResult {
    /// The output of the call this answers: a string as text, anything else as JSON.
    pub fn into_output(self) -> ToolOutput {
        let mut output = match self.result {
            Value::String(text) => ToolOutput::text(text),
            other => ToolOutput::json(other),
        };
        output.is_error = self.is_error;
        output
    }
}

/// Where a submitted result went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// To the call, which was still waiting.
    Waiting,
    /// To the inbox of the run that made the call.
    Inbox {
        /// That run.
        run_id: String,
    },
}

/// Why a call is not pending ([`PendingStore::not_pending`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotPending {
    /// It expired unanswered, `ttl` after it was made or its caller stopped waiting.
    Expired {
        /// The call's time to live (its tool's, or the store's).
        ttl: Duration,
    },
    /// Never made, answered already, withdrawn, or forgotten.
    Unknown,
}

impl NotPending {
    /// The refusal of a result for call `call_id`, which is not pending for this reason.
    pub fn into_error(self, call_id: &str) -> ToolError {
        match self {
            NotPending::Expired { ttl } => expired_call(call_id, ttl),
            NotPending::Unknown => unknown_call(call_id),
        }
    }
}

/// A result in a run's inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxEntry {
    /// The call it answers.
    pub call_id: String,
    /// The tool called.
    pub tool: String,
    /// The arguments it was called with.
    pub arguments: Value,
    /// The result.
    #[serde(flatten)]
    pub result: ExternalResult,
}

/// Pending external calls and the inboxes of runs. [`MemoryPendingStore`] keeps them in
/// this process; a shared implementation lets several `toolmux serve` replicas answer
/// each other's calls.
#[async_trait]
pub trait PendingStore: Send + Sync + fmt::Debug {
    /// Records `call` (its `call_id` and `created_ms` are set here) and returns its id.
    /// Fails with a policy error when the store is full.
    async fn open(&self, call: PendingCall) -> Result<String, ToolError>;

    /// [`PendingStore::open`] for a caller that needs it done within `within`: a store
    /// shared through a folder waits for another process's lock no longer than that, and
    /// then fails saying the folder stayed locked. The default opens as `open` does.
    async fn open_within(&self, call: PendingCall, within: Duration) -> Result<String, ToolError> {
        let _ = within;
        self.open(call).await
    }

    /// The result of call `call_id`, when it arrives within `timeout`; `None` when it does
    /// not, and the call stays pending with its result bound for the run's inbox.
    async fn wait(&self, call_id: &str, timeout: Duration) -> Option<ExternalResult>;

    /// Forgets call `call_id` (its caller gave up); a result submitted later is refused.
    async fn withdraw(&self, call_id: &str);

    /// [`PendingStore::withdraw`] at once, without waiting (from a drop, when the caller's
    /// future is dropped and no task is sure to run after it: an interrupted process ends);
    /// `false` when this store cannot, and the call must be withdrawn in a task. The
    /// default cannot.
    fn withdraw_now(&self, call_id: &str) -> bool {
        let _ = call_id;
        false
    }

    /// The calls waiting for a result, oldest first, of the `tools` named (all when empty);
    /// when there are none, waits up to `wait` for one. Fails when the store cannot be read
    /// (a shared store out of reach), which is not "nothing pending".
    async fn pending(
        &self,
        tools: &[String],
        wait: Duration,
    ) -> Result<Vec<PendingCall>, ToolError> {
        self.pending_except(tools, &[], wait).await
    }

    /// Like [`PendingStore::pending`], leaving out the calls in `exclude` (those the caller
    /// has seen): when none is left, waits up to `wait` for another.
    async fn pending_except(
        &self,
        tools: &[String],
        exclude: &[String],
        wait: Duration,
    ) -> Result<Vec<PendingCall>, ToolError>;

    /// Answers call `call_id`. Unknown (never made, answered already, withdrawn) is an
    /// invalid-arguments error, and so is expired, saying so.
    async fn resolve(&self, call_id: &str, result: ExternalResult) -> Result<Delivery, ToolError>;

    /// Why call `call_id`, known not to be pending (a caller that looked first), is not: it
    /// expired, when the store remembers so, or it is unknown. The default knows of no
    /// expired call. Fails when the store cannot be read.
    async fn not_pending(&self, call_id: &str) -> Result<NotPending, ToolError> {
        let _ = call_id;
        Ok(NotPending::Unknown)
    }

    /// The results in run `run_id`'s inbox, oldest first, taken out: with `owner`, only
    /// those of calls that owner made ([`PendingCall::owner`]) or that no agent made, the
    /// others left. Fails when the store cannot be read (nothing is taken then).
    async fn take_inbox(
        &self,
        run_id: &str,
        owner: Option<&str>,
    ) -> Result<Vec<InboxEntry>, ToolError>;

    /// How many calls of run `run_id` (with `owner`, of that owner or of no agent) wait for
    /// a result. Fails when the store cannot be read.
    async fn count_pending(&self, run_id: &str, owner: Option<&str>) -> Result<usize, ToolError>;
}

/// `calls` without those in `exclude`.
pub(crate) fn except(mut calls: Vec<PendingCall>, exclude: &[String]) -> Vec<PendingCall> {
    if !exclude.is_empty() {
        calls.retain(|c| !exclude.contains(&c.call_id));
    }
    calls
}

/// Calls pending at most, by default: past it, new calls are refused.
pub const DEFAULT_MAX_PENDING: usize = 10_000;

/// Runs whose inboxes hold unread results at once, at most, by default: past it, a result
/// bound for the inbox of another run is refused (the call stays pending; submitted again
/// once inboxes were read or their results expired, it goes through).
pub const DEFAULT_MAX_INBOXES: usize = 10_000;

/// Results one inbox holds at most, by default: past it, the oldest are dropped.
pub const DEFAULT_MAX_INBOX: usize = 1_000;

/// How long a call waits for its result, by default: past it, it expires (its caller has
/// long given up, or never waited: an asynchronous call). A synchronous call's time counts
/// from the end of its caller's wait: it never expires while waited for, and a result
/// submitted after the wait reaches the inbox for that long.
pub const DEFAULT_PENDING_TTL: Duration = Duration::from_secs(60 * 60);

/// How long a result waits in an inbox to be read, by default.
pub const DEFAULT_RESULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a synchronous call may take from its opening to the start of its wait: until
/// then it counts as waited for.
pub(crate) const OPEN_WAITER: Duration = Duration::from_secs(60);

/// How often, at most, opening a call looks through every call and inbox for expired ones
/// (unless the store is full); reading skips expired ones whenever it looks.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The longest time to live [`MemoryPendingStore`] keeps as given: a hundred years, as the
/// Redis store keeps it. A longer one (a configuration's way of saying "never", up to
/// `Duration::MAX`) is cut to it, as the clock cannot add a time past its end
/// (`Instant + Duration::MAX` panics); its calls list as expiring at the end of time
/// (`u64::MAX`), as those of a folder do.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The instant `by` after `at`, or [`FOREVER`] after it when that is past the clock's end:
/// for waits and times to live that may be as long as a `Duration` holds.
pub(crate) fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by).unwrap_or_else(|| at + FOREVER)
}

/// A [`PendingStore`] in this process's memory, bounded in size and in time: a call not
/// answered within its time to live ([`DEFAULT_PENDING_TTL`]) expires, and so does a result
/// nobody took from its inbox ([`DEFAULT_RESULT_TTL`]), so that a gateway that runs for
/// months does not fill up with calls nobody will answer.
#[derive(Debug)]
pub struct MemoryPendingStore {
    state: Mutex<State>,
    /// Woken when a call is opened, for long polls.
    opened: Notify,
    next: AtomicU64,
    /// Distinguishes this store's ids from another's (a restarted process).
    prefix: String,
    max_pending: usize,
    max_inbox: usize,
    max_inboxes: usize,
    pending_ttl: Duration,
    result_ttl: Duration,
}

#[derive(Debug)]
struct State {
    calls: HashMap<String, Entry>,
    /// The receiving ends of synchronous calls' results, until they wait.
    receivers: HashMap<String, oneshot::Receiver<ExternalResult>>,
    inboxes: HashMap<String, VecDeque<Inboxed>>,
    /// Calls that expired, until their results would have expired too: a result submitted
    /// for one is refused with a message that says so.
    /// Each with when it is forgotten and the call's time to live.
    // Invariant: at most `max_pending` entries.
    expired: HashMap<String, (Instant, Duration)>,
    /// When the last sweep was.
    swept: Instant,
}

#[derive(Debug)]
struct Entry {
    call: PendingCall,
    /// Set for a synchronous call until it gives up waiting.
    waiter: Option<oneshot::Sender<ExternalResult>>,
    /// Until when its caller waits, or is about to (from the opening of a synchronous
    /// call); `None` once it gave up. The call does not expire before.
    waited_until: Option<Instant>,
    /// When it expires unless waited for: its time to live after its opening, or after
    /// its caller stopped waiting.
    expires: Instant,
    /// Its time to live: its tool's, or the store's.
    ttl: Duration,
}

impl Entry {
    fn expired(&self, now: Instant) -> bool {
        self.expires <= now && self.waited_until.is_none_or(|until| until <= now)
    }
}

#[derive(Debug)]
struct Inboxed {
    entry: InboxEntry,
    /// [`PendingCall::owner`] of the call it answers.
    owner: Option<String>,
    expires: Instant,
}

impl State {
    fn new() -> State {
        State {
            calls: HashMap::new(),
            receivers: HashMap::new(),
            inboxes: HashMap::new(),
            expired: HashMap::new(),
            swept: Instant::now(),
        }
    }

    /// Forgets every call and result past its time, remembering the calls' ids (to say why a
    /// late result is refused) for as long as their results would have been kept.
    fn sweep(&mut self, now: Instant, remember_for: Duration, max_remembered: usize) {
        self.swept = now;
        let gone: Vec<String> =
            self.calls.iter().filter(|(_, e)| e.expired(now)).map(|(id, _)| id.clone()).collect();
        self.expired.retain(|_, (forget, _)| *forget > now);
        for id in gone {
            let ttl = self.calls.remove(&id).map(|e| e.ttl);
            self.receivers.remove(&id);
            if let Some(ttl) = ttl
                && self.expired.len() < max_remembered
            {
                self.expired.insert(id, (later(now, remember_for), ttl));
            }
        }
        self.inboxes.retain(|_, inbox| {
            inbox.retain(|r| r.expires > now);
            !inbox.is_empty()
        });
    }
}

impl Default for MemoryPendingStore {
    fn default() -> Self {
        MemoryPendingStore::new(DEFAULT_MAX_PENDING, DEFAULT_MAX_INBOX)
    }
}

impl MemoryPendingStore {
    /// A store of at most `max_pending` pending calls and `max_inbox` results per inbox,
    /// kept for [`DEFAULT_PENDING_TTL`] and [`DEFAULT_RESULT_TTL`].
    pub fn new(max_pending: usize, max_inbox: usize) -> Self {
        MemoryPendingStore {
            state: Mutex::new(State::new()),
            opened: Notify::new(),
            next: AtomicU64::new(1),
            prefix: format!("ext-{}", toolmux_core::unique_token()),
            max_pending: max_pending.max(1),
            max_inbox: max_inbox.max(1),
            max_inboxes: DEFAULT_MAX_INBOXES,
            pending_ttl: DEFAULT_PENDING_TTL,
            result_ttl: DEFAULT_RESULT_TTL,
        }
    }

    /// Calls expire `pending` after they were made, results `result` after they reached
    /// their inbox (each at least a millisecond; a hundred years or more is for ever).
    pub fn with_ttl(mut self, pending: Duration, result: Duration) -> Self {
        let least = Duration::from_millis(1);
        self.pending_ttl = pending.clamp(least, FOREVER);
        self.result_ttl = result.clamp(least, FOREVER);
        self
    }

    /// Keeps unread results for at most `max` runs at once (at least 1; default
    /// [`DEFAULT_MAX_INBOXES`]).
    pub fn with_max_inboxes(mut self, max: usize) -> Self {
        self.max_inboxes = max.max(1);
        self
    }

    /// The calls waiting for a result, as [`PendingStore::pending`] lists them: in this
    /// process's memory a listing cannot fail.
    pub async fn pending(&self, tools: &[String], wait: Duration) -> Vec<PendingCall> {
        self.pending_calls(tools, &[], wait).await
    }

    async fn pending_calls(
        &self,
        tools: &[String],
        exclude: &[String],
        wait: Duration,
    ) -> Vec<PendingCall> {
        let deadline = later(Instant::now(), wait);
        loop {
            // Registered before looking, so that a call opened in between wakes us.
            let opened = self.opened.notified();
            let calls = except(self.snapshot(tools), exclude);
            if !calls.is_empty() || Instant::now() >= deadline {
                return calls;
            }
            if tokio::time::timeout_at(deadline, opened).await.is_err() {
                return except(self.snapshot(tools), exclude);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot(&self, tools: &[String]) -> Vec<PendingCall> {
        let state = self.lock();
        let (now, now_ms) = (Instant::now(), now_ms());
        // A call kept for good expires at the end of time, as in a folder.
        let expires_ms = |e: &Entry| match e.ttl >= FOREVER {
            true => u64::MAX,
            false => now_ms.saturating_add(
                u64::try_from(e.expires.saturating_duration_since(now).as_millis())
                    .unwrap_or(u64::MAX),
            ),
        };
        let mut calls: Vec<PendingCall> = state
            .calls
            .values()
            .filter(|e| !e.expired(now))
            .filter(|e| tools.is_empty() || tools.contains(&e.call.tool))
            .map(|e| PendingCall {
                status: if e.waiter.is_some() { CallStatus::Waiting } else { CallStatus::Pending },
                expires_ms: expires_ms(e),
                ..e.call.clone()
            })
            .collect();
        calls.sort_by(|a, b| (a.created_ms, &a.call_id).cmp(&(b.created_ms, &b.call_id)));
        calls
    }
}

/// The refusal of a result for a call that is not pending.
pub(crate) fn unknown_call(call_id: &str) -> ToolError {
    ToolError::invalid_arguments(
        "external__submit",
        format!(
            "no pending call `{call_id}` (never made, answered already, or its caller gave up); \
             `external__pending` lists the calls waiting"
        ),
    )
}

/// The refusal of a result bound for a new inbox when `max` runs' inboxes hold unread
/// results already (every [`PendingStore`] that bounds its inboxes says it so).
pub fn inboxes_full(call_id: &str, run_id: &str, max: usize) -> ToolError {
    ToolError::Denied {
        tool: "external__submit".to_owned(),
        reason: format!(
            "the result of `{call_id}` goes to the inbox of run `{run_id}`, and the inboxes of \
             {max} runs already hold unread results, the most kept at once \
             (`defaults.externalMaxInboxes` in the configuration, `with_max_inboxes` in code); the call stays pending: submit it again once runs have read their \
             results (`external__inbox`) or those expired (the results' time to live)"
        ),
    }
}

/// The refusal of a result for a call that expired after `ttl`.
pub(crate) fn expired_call(call_id: &str, ttl: Duration) -> ToolError {
    ToolError::Gone {
        tool: "external__submit".to_owned(),
        message: format!(
            "call `{call_id}` expired after {} s without a result, so its caller no longer \
             takes one; `external__pending` lists the calls waiting",
            ttl.as_secs_f64()
        ),
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[async_trait]
impl PendingStore for MemoryPendingStore {
    async fn open(&self, mut call: PendingCall) -> Result<String, ToolError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        call.call_id = format!("{}-{n}", self.prefix);
        call.created_ms = now_ms();
        let id = call.call_id.clone();
        {
            let mut state = self.lock();
            let now = Instant::now();
            if state.calls.len() >= self.max_pending || now >= state.swept + SWEEP_EVERY {
                state.sweep(now, self.result_ttl, self.max_pending);
            }
            if state.calls.len() >= self.max_pending {
                return Err(ToolError::QueueBusy {
                    tool: call.tool,
                    queue: "external results".to_owned(),
                    waited: Duration::ZERO,
                });
            }
            // A synchronous call's channel is made here, so that a result submitted before
            // the caller starts to wait is not lost.
            let waiter = (!call.is_async).then(|| {
                let (tx, rx) = oneshot::channel();
                state.receivers.insert(id.clone(), rx);
                tx
            });
            let waited_until = waiter.as_ref().map(|_| now + OPEN_WAITER);
            let ttl = call.ttl(self.pending_ttl, FOREVER);
            let expires = later(now, ttl);
            state.calls.insert(id.clone(), Entry { call, waiter, waited_until, expires, ttl });
        }
        self.opened.notify_waiters();
        Ok(id)
    }

    async fn wait(&self, call_id: &str, timeout: Duration) -> Option<ExternalResult> {
        let rx = {
            let mut state = self.lock();
            let rx = state.receivers.remove(call_id)?;
            // Not expired while its caller waits, nor sooner than its time after the wait.
            if let Some(entry) = state.calls.get_mut(call_id) {
                let until = later(Instant::now(), timeout);
                entry.waited_until = Some(until);
                entry.expires = entry.expires.max(later(until, entry.ttl));
            }
            rx
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => Some(result),
            // Timed out (or the store dropped the sender): the result, when it comes, goes
            // to the inbox, for the call's time to live from now. A result that raced the
            // timeout is already in the inbox.
            _ => {
                if let Some(entry) = self.lock().calls.get_mut(call_id) {
                    entry.waiter = None;
                    entry.waited_until = None;
                    entry.expires = later(Instant::now(), entry.ttl);
                }
                None
            }
        }
    }

    async fn withdraw(&self, call_id: &str) {
        let mut state = self.lock();
        state.calls.remove(call_id);
        state.receivers.remove(call_id);
    }

    fn withdraw_now(&self, call_id: &str) -> bool {
        let mut state = self.lock();
        state.calls.remove(call_id);
        state.receivers.remove(call_id);
        true
    }

    async fn pending_except(
        &self,
        tools: &[String],
        exclude: &[String],
        wait: Duration,
    ) -> Result<Vec<PendingCall>, ToolError> {
        Ok(self.pending_calls(tools, exclude, wait).await)
    }

    async fn resolve(&self, call_id: &str, result: ExternalResult) -> Result<Delivery, ToolError> {
        let mut state = self.lock();
        let now = Instant::now();
        if state.calls.get(call_id).is_some_and(|e| e.expired(now)) {
            state.sweep(now, self.result_ttl, self.max_pending);
        }
        if let Some((_, ttl)) = state.expired.get(call_id) {
            return Err(expired_call(call_id, *ttl));
        }
        let Some(entry) = state.calls.get(call_id) else {
            return Err(unknown_call(call_id));
        };
        // Bound for the inbox (no caller waits for it) of a run that has none: refused when
        // too many runs have one, before anything changed (the call stays pending).
        let run_id = entry.call.run_id.clone();
        let to_inbox = entry.waiter.as_ref().is_none_or(oneshot::Sender::is_closed);
        if to_inbox && !state.inboxes.contains_key(&run_id) {
            if state.inboxes.len() >= self.max_inboxes {
                state.sweep(now, self.result_ttl, self.max_pending);
            }
            if state.inboxes.len() >= self.max_inboxes {
                return Err(inboxes_full(call_id, &run_id, self.max_inboxes));
            }
        }
        let Some(mut entry) = state.calls.remove(call_id) else {
            return Err(unknown_call(call_id));
        };
        let result = match entry.waiter.take() {
            Some(waiter) => match waiter.send(result) {
                Ok(()) => return Ok(Delivery::Waiting),
                // The waiter timed out just now: the inbox gets it.
                Err(result) => result,
            },
            None => result,
        };
        let inbox = state.inboxes.entry(run_id.clone()).or_default();
        if inbox.len() >= self.max_inbox {
            let dropped = inbox.pop_front();
            tracing::warn!(
                run = %run_id,
                "inbox full ({} results): dropped the result of {}",
                self.max_inbox,
                dropped.map_or_else(String::new, |d| d.entry.call_id)
            );
        }
        inbox.push_back(Inboxed {
            entry: InboxEntry {
                call_id: call_id.to_owned(),
                tool: entry.call.tool,
                arguments: entry.call.arguments,
                result,
            },
            owner: entry.call.owner,
            expires: later(now, self.result_ttl),
        });
        Ok(Delivery::Inbox { run_id })
    }

    async fn not_pending(&self, call_id: &str) -> Result<NotPending, ToolError> {
        let state = self.lock();
        let remembered = state.expired.get(call_id).map(|(_, ttl)| *ttl);
        let expired = remembered.or_else(|| {
            let entry = state.calls.get(call_id).filter(|e| e.expired(Instant::now()));
            entry.map(|e| e.ttl)
        });
        Ok(match expired {
            Some(ttl) => NotPending::Expired { ttl },
            None => NotPending::Unknown,
        })
    }

    async fn take_inbox(
        &self,
        run_id: &str,
        owner: Option<&str>,
    ) -> Result<Vec<InboxEntry>, ToolError> {
        let now = Instant::now();
        let mut state = self.lock();
        let Some(inbox) = state.inboxes.get_mut(run_id) else { return Ok(Vec::new()) };
        let (taken, kept): (VecDeque<Inboxed>, VecDeque<Inboxed>) = std::mem::take(inbox)
            .into_iter()
            .filter(|r| r.expires > now)
            .partition(|r| owner.is_none_or(|o| r.owner.as_deref().is_none_or(|mine| mine == o)));
        if kept.is_empty() {
            state.inboxes.remove(run_id);
        } else {
            *inbox = kept;
        }
        Ok(taken.into_iter().map(|r| r.entry).collect())
    }

    async fn count_pending(&self, run_id: &str, owner: Option<&str>) -> Result<usize, ToolError> {
        let now = Instant::now();
        let mine = |call: &PendingCall| {
            call.run_id == run_id
                && owner.is_none_or(|o| call.owner.as_deref().is_none_or(|mine| mine == o))
        };
        Ok(self.lock().calls.values().filter(|e| mine(&e.call) && !e.expired(now)).count())
    }
}
