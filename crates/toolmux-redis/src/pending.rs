//! [`RedisPendingStore`]: pending external calls and the inboxes of runs in Redis, so that
//! a call opened through one replica can be answered through another.
//!
//! Under `{prefix}:x`:
//!
//! - `call:{id}`, a hash: the call (`call`, JSON), its `tool`, `run` and `created` time,
//!   and its own time to live in milliseconds (`ttl`, [`PendingCall::ttl_ms`]) when its
//!   tool gives it one, which then stands for the store's wherever a call's time counts;
//! - `calls`, a sorted set of every pending call by the time it expires unless waited for
//!   (its opening plus the calls' time to live, pushed on while its caller waits), and
//!   `tool:{tool}`, the calls per tool by creation time, for `pending(tools, ..)`;
//!   `run:{run}`, a set of the run's pending calls, for `count_pending`;
//! - `waiter:{id}`: `open` from the opening of a synchronous call until someone waits for
//!   it, then `waiting:TOKEN` (the wait's) until the wait ends; a result submitted while it exists is the
//!   waiter's: kept in `result:{id}` (the call's hash with it, and its id in `held`) until
//!   the waiter takes it, a message on the channel `{prefix}:x:{id}` waking it. Only the
//!   wait whose token the mark holds takes it; taken, the mark becomes `taken:TOKEN` and the
//!   result stays a short while, so that the same wait asking again (its answer lost with a
//!   connection or a timeout) gets it again instead of nothing;
//! - `inbox:{run}`, a list capped at [`toolmux_external::DEFAULT_MAX_INBOX`] results, the
//!   oldest dropped; `inboxes`, the runs with one, by when it expires: at
//!   [`toolmux_external::DEFAULT_MAX_INBOXES`] of them (all replicas together,
//!   [`RedisPendingStore::with_max_inboxes`]) a result for yet another run's inbox is
//!   refused ([`ToolError::Denied`], naming the bound and what frees a place) and its call
//!   stays pending, as in a folder. A result held for a caller that went away is moved to
//!   its inbox regardless: its submitter was told it was delivered, and there are no more
//!   of those than calls pending;
//! - `dropped:{id}`, for a few minutes, the mark of a call whose opening was dropped before
//!   its id was handed over (its caller cancelled or cut by a deadline) or whose answer was
//!   lost: the call is withdrawn from a task, and an opening that reaches Redis only after
//!   that makes nothing, so that no call is left pending that nobody knows the id of;
//! - `expired`, the ids of calls that expired, by when they are forgotten (as long as
//!   their results would have been kept), so that a late result is refused saying why,
//!   and `expired_ttl:{id}` as long, the time to live of such a call that had its own;
//! - the channel `{prefix}:x:new` announces every call opened, for long polls.
//!
//! Every step that reads and writes is one Lua script, so two replicas answering the same
//! call, or an answer racing the end of a wait, have exactly one outcome. Opening,
//! answering, counting and reading an inbox first sweep (up to a hundred of each): calls
//! past their time are forgotten, and a result held for a caller whose waiter mark expired
//! (its replica died, or crashed between opening the call and waiting for it) goes to the
//! run's inbox. The semantics are [`toolmux_external::MemoryPendingStore`]'s, with three
//! differences a shared store needs: the bound on pending calls is for all replicas
//! together; an inbox is kept for the results' time to live after it was last added to or
//! read (the whole inbox, not each result); and a synchronous call must start waiting
//! within [`OPEN_WAITER_TTL`] of its opening, after which its result goes to the inbox (so
//! that a replica that crashed between the two does not swallow it).
//!
//! The keys a script touches are named after what it reads, not declared, so this store
//! needs a single Redis server, not a Redis Cluster.

use crate::backend::BackendShared;
use crate::client::Script;
use crate::config::FOREVER;
use crate::pubsub::Subscription;
use crate::resp::Reply;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::time::Instant;
use toolmux_core::ToolError;
use toolmux_external::{
    CallStatus, DEFAULT_MAX_INBOX, DEFAULT_MAX_INBOXES, DEFAULT_MAX_PENDING, Delivery,
    ExecutionType, ExternalResult, InboxEntry, NotPending, PendingCall, PendingStore, inboxes_full,
};

/// How long a pending call, an unread inbox or an unclaimed result is kept.
pub const RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a synchronous call may take between its opening and the start of its wait.
pub const OPEN_WAITER_TTL: Duration = Duration::from_secs(5 * 60);

/// How often a long poll or a wait asks Redis even when nothing was announced.
const POLL_EVERY: Duration = crate::queue::POLL_EVERY;

/// How long the withdrawal of a call whose opening was dropped keeps the call from being
/// made: longer than an opening sent already can take to reach Redis.
const DROPPED_OPENING_KEPT: Duration = Duration::from_secs(5 * 60);

/// An attempt within a deadline gets at least this long (see the queue's).
const MIN_ATTEMPT: Duration = Duration::from_millis(50);

/// The provider the errors of this store name.
const PROVIDER: &str = "external";

/// Pending external calls and inboxes in Redis, for
/// [`toolmux_external::ExternalProvider::new`] (`Arc::new(backend.pending_store())`).
#[derive(Debug, Clone)]
pub struct RedisPendingStore {
    inner: Arc<StoreInner>,
}

#[derive(Debug)]
struct StoreInner {
    backend: Arc<BackendShared>,
    /// `{prefix}:x`.
    base: String,
    next: AtomicU64,
    max_pending: usize,
    max_inbox: usize,
    /// Runs with unread results at most (inboxes), over all replicas.
    max_inboxes: usize,
    /// How long a call stays pending, and a result unread (in an inbox, or for a waiter
    /// that went away).
    pending_ttl: Duration,
    result_ttl: Duration,
    /// The subscription to `{prefix}:x:new`, made at the first long poll and kept.
    opened: tokio::sync::OnceCell<Subscription>,
}

/// A pending call as stored: [`PendingCall`] without its id and times, which are the
/// sorted sets' member and scores.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredCall {
    tool: String,
    arguments: Value,
    run_id: String,
    /// [`PendingCall::owner`]; absent in calls stored before owners were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    execution_type: ExecutionType,
    #[serde(rename = "async")]
    is_async: bool,
    visible: bool,
    /// [`PendingCall::ttl_ms`], for the listing (the scripts read the hash's `ttl`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredResult {
    result: Value,
    is_error: bool,
}

/// An inbox entry as the scripts write it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredInboxEntry {
    call_id: String,
    call: StoredCall,
    result: StoredResult,
}

impl RedisPendingStore {
    pub(crate) fn new(backend: Arc<BackendShared>) -> RedisPendingStore {
        let base = format!("{}:x", backend.settings.prefix);
        RedisPendingStore {
            inner: Arc::new(StoreInner {
                backend,
                base,
                next: AtomicU64::new(1),
                max_pending: DEFAULT_MAX_PENDING,
                max_inbox: DEFAULT_MAX_INBOX,
                max_inboxes: DEFAULT_MAX_INBOXES,
                pending_ttl: RETENTION,
                result_ttl: RETENTION,
                opened: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// At most `max_pending` calls pending (over all replicas) and `max_inbox` results
    /// per inbox, instead of the defaults of [`toolmux_external::MemoryPendingStore`].
    pub fn with_limits(self, max_pending: usize, max_inbox: usize) -> Self {
        self.remade(|inner| {
            inner.max_pending = max_pending.max(1);
            inner.max_inbox = max_inbox.max(1);
        })
    }

    /// Keeps unread results for at most `max` runs at once, over all replicas (at least 1;
    /// default [`DEFAULT_MAX_INBOXES`], as a folder's): a result bound for the inbox of
    /// yet another run is refused and its call stays pending.
    pub fn with_max_inboxes(self, max: usize) -> Self {
        self.remade(|inner| inner.max_inboxes = max.max(1))
    }

    /// Calls pending longer than `pending` expire (a synchronous call's time counted from
    /// the end of its caller's wait), and results unread for `result` are dropped (an inbox
    /// is kept `result` after its last result came), instead of [`RETENTION`] for both:
    /// the settings of [`toolmux_external::MemoryPendingStore::with_ttl`].
    pub fn with_ttl(self, pending: Duration, result: Duration) -> Self {
        let at_least = Duration::from_millis(1);
        self.remade(|inner| {
            inner.pending_ttl = pending.clamp(at_least, FOREVER);
            inner.result_ttl = result.clamp(at_least, FOREVER);
        })
    }

    /// A store with this one's settings as `change` leaves them (its subscription made anew).
    fn remade(&self, change: impl FnOnce(&mut StoreInner)) -> Self {
        let inner = &self.inner;
        let mut remade = StoreInner {
            backend: inner.backend.clone(),
            base: inner.base.clone(),
            next: AtomicU64::new(inner.next.load(Ordering::Relaxed)),
            max_pending: inner.max_pending,
            max_inbox: inner.max_inbox,
            max_inboxes: inner.max_inboxes,
            pending_ttl: inner.pending_ttl,
            result_ttl: inner.result_ttl,
            opened: tokio::sync::OnceCell::new(),
        };
        change(&mut remade);
        RedisPendingStore { inner: Arc::new(remade) }
    }
}

impl StoreInner {
    fn timeout(&self) -> Duration {
        self.backend.client.timeout()
    }

    /// The time an attempt may take to end by `deadline`.
    fn within(&self, deadline: Instant) -> Duration {
        deadline.saturating_duration_since(Instant::now()).max(MIN_ATTEMPT).min(self.timeout())
    }

    /// Runs `script` with the arguments of its prelude (see `prelude!`) and then `args`, after
    /// `keys`.
    async fn run(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        timeout: Duration,
    ) -> Result<Reply, crate::RedisError> {
        let settings = [
            self.pending_ttl.as_millis().to_string(),
            self.result_ttl.as_millis().to_string(),
            self.max_inbox.to_string(),
            self.max_pending.to_string(),
        ];
        let mut all: Vec<&[u8]> = vec![self.base.as_bytes()];
        all.extend(settings.iter().map(String::as_bytes));
        all.extend_from_slice(args);
        self.backend.client.eval(script, keys, &all, timeout).await
    }

    /// The pending calls of `tools` (all when empty), oldest first.
    async fn snapshot(
        &self,
        tools: &[String],
        timeout: Duration,
    ) -> Result<Vec<PendingCall>, crate::RedisError> {
        let keys: Vec<String> = if tools.is_empty() {
            vec![format!("{}:calls", self.base)]
        } else {
            let mut tools: Vec<&String> = tools.iter().collect();
            tools.sort();
            tools.dedup();
            tools.into_iter().map(|t| format!("{}:tool:{t}", self.base)).collect()
        };
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply = self.run(&SNAPSHOT, &keys, &[], timeout).await?;
        let mut calls: Vec<PendingCall> = reply
            .as_array()
            .unwrap_or_default()
            .chunks_exact(5)
            .filter_map(|item| {
                let id = item[0].as_str()?;
                let created_ms = u64::try_from(item[1].as_i64()?).ok()?;
                let call: StoredCall = serde_json::from_slice(item[2].as_bytes()?).ok()?;
                let mut call = pending_call(id.to_owned(), created_ms, call);
                // A synchronous call's waiter mark: its caller has yet to wait, or waits.
                if item[3].as_i64() == Some(1) {
                    call.status = CallStatus::Waiting;
                }
                // A call kept for good expires at the end of time, as in memory.
                call.expires_ms = if call.ttl(self.pending_ttl, FOREVER) >= FOREVER {
                    u64::MAX
                } else {
                    u64::try_from(item[4].as_i64()?).ok()?
                };
                Some(call)
            })
            .collect();
        calls.sort_by(|a, b| (a.created_ms, &a.call_id).cmp(&(b.created_ms, &b.call_id)));
        Ok(calls)
    }

    /// Takes the result of `call_id` for the wait `token` if it is there (`Ok(None)` if
    /// not yet).
    async fn take_result(
        &self,
        script: &Script,
        call_id: &str,
        token: &str,
        timeout: Duration,
    ) -> Result<Option<ExternalResult>, crate::RedisError> {
        let kept = self.taken_ttl().as_millis().to_string();
        let args = [call_id.as_bytes(), token.as_bytes(), kept.as_bytes()];
        let reply = self.run(script, &[], &args, timeout).await?;
        Ok(reply.as_bytes().and_then(parse_result))
    }

    /// How long a result taken stays for its wait to take it again (the answer of the take
    /// lost): until the wait's next look, or its giving up, is over.
    fn taken_ttl(&self) -> Duration {
        self.timeout() * 4 + POLL_EVERY + Duration::from_secs(1)
    }
}
/// A wait under way; dropped before it ended, it ends the wait in Redis (in a task of
/// its own), so that a result submitted later goes to the inbox.
struct Waiting {
    inner: Arc<StoreInner>,
    /// The wait's token, in its mark.
    token: String,
    /// `None` once the wait ended in Redis.
    call_id: Option<String>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let (Some(call_id), Ok(runtime)) = (self.call_id.take(), Handle::try_current()) else {
            return;
        };
        let (inner, token) = (self.inner.clone(), std::mem::take(&mut self.token));
        runtime.spawn(async move {
            // A result that came just before is lost with its caller, as in memory.
            let _ = inner.take_result(&GIVE_UP, &call_id, &token, inner.timeout()).await;
        });
    }
}

/// The opening of a call under way; dropped before the call's id was handed over (or with
/// the opening's answer lost), it withdraws the call in a task of its own, and leaves a
/// mark that keeps an opening still on its way to Redis from making it.
struct Opening {
    inner: Arc<StoreInner>,
    /// `None` once the caller knows whether the call was made.
    call_id: Option<String>,
}

impl Drop for Opening {
    fn drop(&mut self) {
        let (Some(call_id), Ok(runtime)) = (self.call_id.take(), Handle::try_current()) else {
            return;
        };
        let inner = self.inner.clone();
        runtime.spawn(async move {
            let kept = DROPPED_OPENING_KEPT.as_millis().to_string();
            let args = [call_id.as_bytes(), kept.as_bytes()];
            let mut tries = 3;
            loop {
                let Err(e) = inner.run(&DROP_OPENING, &[], &args, inner.timeout()).await else {
                    return;
                };
                tries -= 1;
                if tries == 0 {
                    let e = toolmux_core::error_report(&e);
                    tracing::warn!(target: "toolmux::redis", "call {call_id}, whose opening was dropped, not withdrawn (it expires with the calls' time to live): {e}");
                    return;
                }
                tokio::time::sleep(POLL_EVERY).await;
            }
        });
    }
}

/// Ends the wait for `call_id`, unless a result came at the last moment: the submitter was
/// told it reached the waiting call, so it must. When Redis does not answer, `waiting` is
/// left to try again from its drop.
async fn give_up(
    inner: &StoreInner,
    waiting: &mut Waiting,
    call_id: &str,
) -> Option<ExternalResult> {
    let token = waiting.token.clone();
    let mut result = inner.take_result(&GIVE_UP, call_id, &token, inner.timeout()).await;
    if result.as_ref().is_err_and(crate::RedisError::may_have_run) {
        // It may have taken a result whose answer was lost: asked again, it gives it again.
        result = inner.take_result(&GIVE_UP, call_id, &token, inner.timeout()).await;
    }
    if result.is_ok() {
        waiting.call_id = None;
    }
    result.ok().flatten()
}

fn pending_call(call_id: String, created_ms: u64, call: StoredCall) -> PendingCall {
    PendingCall {
        call_id,
        tool: call.tool,
        arguments: call.arguments,
        run_id: call.run_id,
        owner: call.owner,
        execution_type: call.execution_type,
        is_async: call.is_async,
        visible: call.visible,
        created_ms,
        status: CallStatus::Pending,
        expires_ms: 0,
        ttl_ms: call.ttl_ms,
    }
}

/// The time to live of an expired call, `ms` as a script answers it, else `default`.
fn expired_ttl(ms: Option<i64>, default: Duration) -> Duration {
    let ms = ms.and_then(|ms| u64::try_from(ms).ok()).filter(|ms| *ms > 0);
    ms.map_or(default, Duration::from_millis)
}

fn parse_result(bytes: &[u8]) -> Option<ExternalResult> {
    match serde_json::from_slice::<StoredResult>(bytes) {
        Ok(r) => Some(ExternalResult { result: r.result, is_error: r.is_error }),
        Err(e) => {
            tracing::warn!(target: "toolmux::redis", "unreadable external result: {e}");
            None
        }
    }
}

fn unreachable(e: crate::RedisError) -> ToolError {
    ToolError::transport(PROVIDER, "the shared store of pending calls did not answer", e)
}

#[async_trait]
impl PendingStore for RedisPendingStore {
    async fn open(&self, call: PendingCall) -> Result<String, ToolError> {
        let inner = &self.inner;
        let n = inner.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("ext-{}-{n}", inner.backend.replica);
        // Its own time to live, within what the store keeps (empty: the store's).
        let own_ttl = match call.ttl_ms {
            Some(_) => call.ttl(inner.pending_ttl, FOREVER).as_millis().to_string(),
            None => String::new(),
        };
        let stored = StoredCall {
            tool: call.tool,
            arguments: call.arguments,
            run_id: call.run_id,
            owner: call.owner,
            execution_type: call.execution_type,
            is_async: call.is_async,
            visible: call.visible,
            ttl_ms: call.ttl_ms,
        };
        let json = serde_json::to_vec(&stored).map_err(|e| ToolError::other(PROVIDER, e))?;
        let max = inner.max_pending.to_string();
        let open_ttl = OPEN_WAITER_TTL.as_millis().to_string();
        let channel = format!("{}:new", inner.base);
        let sync = if stored.is_async { "0" } else { "1" };
        let args: [&[u8]; 9] = [
            id.as_bytes(),
            &json,
            stored.tool.as_bytes(),
            stored.run_id.as_bytes(),
            max.as_bytes(),
            sync.as_bytes(),
            open_ttl.as_bytes(),
            channel.as_bytes(),
            own_ttl.as_bytes(),
        ];
        // Armed from before the script is sent: dropped before its answer came (its caller
        // cancelled or cut by a deadline), or with the answer lost, the call the script may
        // have made is withdrawn, never left pending with an id nobody knows.
        let mut opening = Opening { inner: inner.clone(), call_id: Some(id.clone()) };
        let reply = match inner.run(&OPEN, &[], &args, inner.timeout()).await {
            Ok(reply) => reply,
            Err(e) => {
                if !e.may_have_run() {
                    opening.call_id = None;
                }
                return Err(unreachable(e));
            }
        };
        opening.call_id = None;
        match reply.as_array().and_then(|r| r.first()).and_then(Reply::as_i64) {
            Some(1) => Ok(id),
            // Withdrawn before it was made: only by this opening's drop, so never seen.
            Some(2) => Err(ToolError::Cancelled { tool: stored.tool }),
            _ => Err(ToolError::QueueBusy {
                tool: stored.tool,
                queue: "external results".to_owned(),
                waited: Duration::ZERO,
            }),
        }
    }

    async fn wait(&self, call_id: &str, timeout: Duration) -> Option<ExternalResult> {
        let inner = &self.inner;
        let deadline = crate::config::deadline_after(timeout);
        // Claim the wait: a result already there is taken, and a second wait (or one for
        // an asynchronous or unknown call) gets nothing, as in memory.
        // The mark outlasts the wait by its last look and its giving up, each of which may
        // wait for a pooled connection and then for the server for a command's timeout.
        let ttl = timeout.saturating_add(inner.timeout() * 4 + Duration::from_secs(1)).min(FOREVER);
        let ttl = ttl.as_millis().to_string();
        // If this future is dropped (its caller was cancelled or cut by a deadline) before
        // the wait ends, the call stops being waited for, so that a result submitted later
        // goes to the inbox, as in memory.
        // The claim is this wait's (its token): one that took effect but whose answer was
        // lost is made again, not refused as a second wait, and a result it took is given
        // again.
        let token = toolmux_core::unique_token();
        let mut waiting = Waiting {
            inner: inner.clone(),
            token: token.clone(),
            call_id: Some(call_id.to_owned()),
        };
        let kept = inner.taken_ttl().as_millis().to_string();
        let claim = [call_id.as_bytes(), ttl.as_bytes(), token.as_bytes(), kept.as_bytes()];
        let reply = loop {
            match inner.run(&CLAIM, &[], &claim, inner.within(deadline)).await {
                Ok(reply) => break reply,
                // Redis did not answer in time: asked again until the wait is over, so that
                // one slow answer does not end it at once.
                Err(e) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        tracing::debug!(target: "toolmux::redis", "call {call_id} not claimed for its wait: {}", toolmux_core::error_report(&e));
                        return give_up(inner, &mut waiting, call_id).await;
                    }
                    tokio::time::sleep(POLL_EVERY.min(left)).await;
                }
            }
        };
        match reply.as_array() {
            Some([flag, value]) if flag.as_i64() == Some(1) => {
                waiting.call_id = None;
                return parse_result(value.as_bytes()?);
            }
            Some([flag]) if flag.as_i64() == Some(0) => {}
            _ => {
                waiting.call_id = None;
                return None;
            }
        }
        let channel = format!("{}:{call_id}", inner.base);
        let confirm_within =
            inner.timeout().min(deadline.saturating_duration_since(Instant::now()));
        let subscription = inner.backend.pubsub.subscribe(&channel, confirm_within).await;
        let mut wake = subscription.waker();
        loop {
            wake.borrow_and_update();
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // The result is in its key before the message is sent: looking after
            // subscribing finds one that came before.
            if let Ok(Some(result)) =
                inner.take_result(&TAKE, call_id, &token, inner.within(deadline)).await
            {
                waiting.call_id = None;
                return Some(result);
            }
            crate::pubsub::wake_or_poll(&mut wake, POLL_EVERY, deadline).await;
        }
        give_up(inner, &mut waiting, call_id).await
    }

    async fn withdraw(&self, call_id: &str) {
        let inner = &self.inner;
        if let Err(e) = inner.run(&WITHDRAW, &[], &[call_id.as_bytes()], inner.timeout()).await {
            tracing::debug!(target: "toolmux::redis", "call {call_id} not withdrawn: {}", toolmux_core::error_report(&e));
        }
    }

    async fn pending_except(
        &self,
        tools: &[String],
        exclude: &[String],
        wait: Duration,
    ) -> Result<Vec<PendingCall>, ToolError> {
        let inner = &self.inner;
        let except = |mut calls: Vec<PendingCall>| {
            calls.retain(|c| !exclude.contains(&c.call_id));
            calls
        };
        if wait.is_zero() {
            return inner.snapshot(tools, inner.timeout()).await.map(except).map_err(unreachable);
        }
        let deadline = crate::config::deadline_after(wait);
        let channel = format!("{}:new", inner.base);
        let confirm_within = inner.timeout().min(wait);
        let opened = inner
            .opened
            .get_or_init(|| inner.backend.pubsub.subscribe(&channel, confirm_within))
            .await;
        let mut wake = opened.waker();
        loop {
            // Marked before looking: a call opened in between wakes us.
            wake.borrow_and_update();
            let calls = inner.snapshot(tools, inner.within(deadline)).await;
            let calls = except(calls.map_err(unreachable)?);
            let now = Instant::now();
            if !calls.is_empty() || now >= deadline {
                return Ok(calls);
            }
            crate::pubsub::wake_or_poll(&mut wake, POLL_EVERY, deadline).await;
        }
    }

    async fn resolve(&self, call_id: &str, result: ExternalResult) -> Result<Delivery, ToolError> {
        let inner = &self.inner;
        let stored = StoredResult { result: result.result, is_error: result.is_error };
        let json = serde_json::to_vec(&stored).map_err(|e| ToolError::other(PROVIDER, e))?;
        let channel = format!("{}:{call_id}", inner.base);
        let max_inboxes = inner.max_inboxes.to_string();
        let args: [&[u8]; 4] =
            [call_id.as_bytes(), &json, channel.as_bytes(), max_inboxes.as_bytes()];
        let reply = inner.run(&RESOLVE, &[], &args, inner.timeout()).await.map_err(unreachable)?;
        let reply = reply.as_array().unwrap_or_default();
        match reply.first().and_then(Reply::as_i64) {
            Some(1) => Ok(Delivery::Waiting),
            Some(2) => {
                let run_id = reply.get(1).and_then(Reply::as_str).unwrap_or_default().to_owned();
                for dropped in reply.get(2).and_then(Reply::as_array).unwrap_or_default() {
                    let id = dropped
                        .as_bytes()
                        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                        .and_then(|v| v.get("callId").and_then(Value::as_str).map(str::to_owned))
                        .unwrap_or_default();
                    tracing::warn!(
                        run = %run_id,
                        "inbox full ({} results): dropped the result of {id}",
                        inner.max_inbox
                    );
                }
                Ok(Delivery::Inbox { run_id })
            }
            Some(3) => {
                let ttl = expired_ttl(reply.get(1).and_then(Reply::as_i64), inner.pending_ttl);
                Err(NotPending::Expired { ttl }.into_error(call_id))
            }
            Some(4) => {
                let run_id = reply.get(1).and_then(Reply::as_str).unwrap_or_default();
                Err(inboxes_full(call_id, run_id, inner.max_inboxes))
            }
            _ => Err(NotPending::Unknown.into_error(call_id)),
        }
    }

    async fn not_pending(&self, call_id: &str) -> Result<NotPending, ToolError> {
        let inner = &self.inner;
        let args = [call_id.as_bytes()];
        let reply = inner.run(&NOT_PENDING, &[], &args, inner.timeout()).await;
        Ok(match reply.map_err(unreachable)?.as_i64() {
            Some(ms) if ms > 0 => {
                NotPending::Expired { ttl: expired_ttl(Some(ms), inner.pending_ttl) }
            }
            _ => NotPending::Unknown,
        })
    }

    async fn take_inbox(
        &self,
        run_id: &str,
        owner: Option<&str>,
    ) -> Result<Vec<InboxEntry>, ToolError> {
        let inner = &self.inner;
        let (owner, only) = (owner.unwrap_or_default(), if owner.is_some() { "1" } else { "0" });
        let args: [&[u8]; 3] = [run_id.as_bytes(), owner.as_bytes(), only.as_bytes()];
        let reply =
            inner.run(&TAKE_INBOX, &[], &args, inner.timeout()).await.map_err(unreachable)?;
        // Newest first in the list (LPUSH): reversed, oldest first.
        Ok(reply
            .as_array()
            .unwrap_or_default()
            .iter()
            .rev()
            .filter_map(|item| serde_json::from_slice::<StoredInboxEntry>(item.as_bytes()?).ok())
            .map(|e| InboxEntry {
                call_id: e.call_id,
                tool: e.call.tool,
                arguments: e.call.arguments,
                result: ExternalResult { result: e.result.result, is_error: e.result.is_error },
            })
            .collect())
    }

    async fn count_pending(&self, run_id: &str, owner: Option<&str>) -> Result<usize, ToolError> {
        let inner = &self.inner;
        let (owner, only) = (owner.unwrap_or_default(), if owner.is_some() { "1" } else { "0" });
        let args: [&[u8]; 3] = [run_id.as_bytes(), owner.as_bytes(), only.as_bytes()];
        let reply = inner.run(&COUNT, &[], &args, inner.timeout()).await.map_err(unreachable)?;
        Ok(reply.as_i64().and_then(|n| usize::try_from(n).ok()).unwrap_or(0))
    }
}

/// What every script starts with: the server's time, the settings and the steps they share.
/// ARGV: base, pending TTL, result TTL, inbox cap, expired ids remembered at most; each
/// script's own arguments from `ARGV[6]`. No key is declared (all are named after `base`).
///
/// A call's score in `calls` is when it expires unless waited for: its opening plus the
/// TTL, pushed on while its caller waits. A call stored without `created` (by an earlier
/// version) is scored by its creation.
macro_rules! prelude {
    () => {
        "if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local base, ttl, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local cap, remember = tonumber(ARGV[4]), tonumber(ARGV[5])
local calls, held, expired = base .. ':calls', base .. ':held', base .. ':expired'
local inboxes = base .. ':inboxes'
local function key(kind, id) return base .. ':' .. kind .. ':' .. id end
local function waited(id) return redis.call('EXISTS', key('waiter', id)) == 1 end
local function ttl_of(id)
  local own = redis.call('HGET', key('call', id), 'ttl')
  if own then return tonumber(own) end
  return ttl
end
local function times(id, score)
  local created = redis.call('HGET', key('call', id), 'created')
  if created then return tonumber(score), tonumber(created) end
  return tonumber(score) + ttl, tonumber(score)
end
local function forget(id, as_expired)
  local f = redis.call('HMGET', key('call', id), 'tool', 'run', 'ttl')
  if f[1] then redis.call('ZREM', key('tool', f[1]), id) end
  if f[2] then redis.call('SREM', key('run', f[2]), id) end
  redis.call('ZREM', calls, id)
  redis.call('ZREM', held, id)
  redis.call('DEL', key('call', id), key('waiter', id), key('result', id))
  if as_expired then
    redis.call('ZADD', expired, now + keep, id)
    if f[3] then redis.call('SET', key('expired_ttl', id), f[3], 'PX', keep) end
  end
end
local function expired_ttl(id)
  local own = redis.call('GET', key('expired_ttl', id))
  if own then return tonumber(own) end
  return ttl
end
local function hand_over(id, token, kept)
  redis.call('SET', key('waiter', id), 'taken:' .. token, 'PX', kept)
  redis.call('PEXPIRE', key('result', id), kept)
  redis.call('DEL', key('call', id))
  redis.call('ZREM', held, id)
end
local function push(run, id, call, result)
  local inbox = key('inbox', run)
  redis.call('LPUSH', inbox, '{\"callId\":' .. cjson.encode(id) .. ',\"call\":' .. call .. ',\"result\":' .. result .. '}')
  local dropped = redis.call('LRANGE', inbox, cap, -1)
  redis.call('LTRIM', inbox, 0, cap - 1)
  redis.call('PEXPIRE', inbox, keep)
  redis.call('ZADD', inboxes, now + keep, run)
  return dropped
end
local function sweep()
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', calls, '-inf', now, 'LIMIT', 0, 100)) do
    local expires, created = times(id, redis.call('ZSCORE', calls, id))
    if redis.call('EXISTS', key('call', id)) == 0 then
      forget(id, false)
    elseif expires > now then
      redis.call('HSET', key('call', id), 'created', created)
      redis.call('ZADD', calls, expires, id)
    elseif waited(id) then
      local left = math.max(redis.call('PTTL', key('waiter', id)), 0)
      redis.call('ZADD', calls, now + left + ttl_of(id), id)
    else
      forget(id, true)
    end
  end
  for _, id in ipairs(redis.call('ZRANGE', held, 0, 99)) do
    if not waited(id) then
      local r = redis.call('GET', key('result', id))
      local f = redis.call('HMGET', key('call', id), 'call', 'run')
      if r and f[1] and f[2] then push(f[2], id, f[1], r) end
      redis.call('DEL', key('call', id), key('result', id))
      redis.call('ZREM', held, id)
    end
  end
  redis.call('ZREMRANGEBYSCORE', expired, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', inboxes, '-inf', now)
  local over = redis.call('ZCARD', expired) - remember
  if over > 0 then redis.call('ZREMRANGEBYRANK', expired, 0, over - 1) end
end
"
    };
}

/// ARGV (after the prelude's): id, call JSON, tool, run, max pending, synchronous (`1`),
/// open-waiter TTL, new-call channel, the call's own TTL (empty for the store's). Answers `[1, now]` when opened, `[0, now]` when full,
/// `[2, now]` when its opening was dropped and the call withdrawn already.
static OPEN: Script = Script {
    name: "pending_open",
    source: concat!(
        prelude!(),
        "sweep()
local id = ARGV[6]
if redis.call('EXISTS', key('dropped', id)) == 1 then return {2, now} end
if redis.call('ZCARD', calls) >= tonumber(ARGV[10]) then return {0, now} end
redis.call('HSET', key('call', id), 'call', ARGV[7], 'tool', ARGV[8], 'run', ARGV[9], 'created', now)
if ARGV[14] ~= '' then redis.call('HSET', key('call', id), 'ttl', ARGV[14]) end
redis.call('ZADD', calls, now + ttl_of(id), id)
redis.call('ZADD', key('tool', ARGV[8]), now, id)
redis.call('SADD', key('run', ARGV[9]), id)
if ARGV[11] == '1' then redis.call('SET', key('waiter', id), 'open', 'PX', ARGV[12]) end
redis.call('PUBLISH', ARGV[13], ARGV[8])
return {1, now}"
    ),
};

/// ARGV: id, waiting TTL, the wait's token, how long a result taken stays. Answers `[1,
/// result]` (there already, or taken by this wait before), `[0]` (claimed, or claimed again
/// by the same wait: wait for it) or `[-1]` (nothing to wait for: another wait's, or an
/// asynchronous, unknown or unwaited call). While the caller waits the call does not
/// expire, and it expires no sooner than the TTL after the wait's end.
static CLAIM: Script = Script {
    name: "pending_claim",
    source: concat!(
        prelude!(),
        "local id, token = ARGV[6], ARGV[8]
local mark, mine = redis.call('GET', key('waiter', id)), 'waiting:' .. token
local r = redis.call('GET', key('result', id))
if mark == 'taken:' .. token then return {1, r} end
if mark ~= 'open' and mark ~= mine then return {-1} end
if r then
  hand_over(id, token, ARGV[9])
  return {1, r}
end
redis.call('SET', key('waiter', id), mine, 'PX', ARGV[7])
redis.call('ZADD', calls, 'XX', now + tonumber(ARGV[7]) + ttl_of(id), id)
return {0}"
    ),
};

/// ARGV: id, the wait's token, how long a result taken stays. Answers the result, taken
/// (the call is done), or nil: none yet, or the call is not this wait's.
static TAKE: Script = Script {
    name: "pending_take",
    source: concat!(
        prelude!(),
        "local id, token = ARGV[6], ARGV[7]
local mark = redis.call('GET', key('waiter', id))
local r = redis.call('GET', key('result', id))
if mark == 'taken:' .. token then return r end
if r and mark == 'waiting:' .. token then
  hand_over(id, token, ARGV[8])
  return r
end
return false"
    ),
};

/// ARGV: id, the wait's token, how long a result taken stays. Answers the result, taken,
/// or nil after ending the wait: later results go to the inbox, and the call expires the
/// TTL from now. A call whose mark is not this wait's (nor still `open`: a wait dropped
/// before its claim) is left alone.
static GIVE_UP: Script = Script {
    name: "pending_give_up",
    source: concat!(
        prelude!(),
        "local id, token = ARGV[6], ARGV[7]
local mark = redis.call('GET', key('waiter', id))
local r = redis.call('GET', key('result', id))
if mark == 'taken:' .. token then return r end
if mark ~= 'open' and mark ~= 'waiting:' .. token then return false end
if r then
  hand_over(id, token, ARGV[8])
  return r
end
redis.call('DEL', key('waiter', id))
redis.call('ZADD', calls, 'XX', now + ttl_of(id), id)
return false"
    ),
};

/// ARGV: id.
static WITHDRAW: Script = Script {
    name: "pending_withdraw",
    source: concat!(prelude!(), "forget(ARGV[6], false)\nreturn 1"),
};

/// ARGV: id, how long the call is kept from being made. Withdraws a call whose opening was
/// dropped, made or not yet.
static DROP_OPENING: Script = Script {
    name: "pending_drop_opening",
    source: concat!(
        prelude!(),
        "forget(ARGV[6], false)
redis.call('SET', key('dropped', ARGV[6]), '1', 'PX', ARGV[7])
return 1"
    ),
};

/// ARGV: id, result JSON, result channel, runs with unread results at most. Answers `[1]`
/// (to the waiting call, which takes it; held until then, and moved to the inbox by a
/// sweep if its caller went away), `[2, run, dropped entries]` (to the inbox), `[3, TTL]` (the
/// call expired, after TTL ms), `[4, run]` (bound for a new inbox while as many runs as allowed have one:
/// nothing changed, the call stays pending) or `[0]` (no such call).
static RESOLVE: Script = Script {
    name: "pending_resolve",
    source: concat!(
        prelude!(),
        "sweep()
local id = ARGV[6]
local score = redis.call('ZSCORE', calls, id)
if not score then
  if redis.call('ZSCORE', expired, id) then return {3, expired_ttl(id)} end
  return {0}
end
local f = redis.call('HMGET', key('call', id), 'call', 'tool', 'run')
if not f[1] then
  forget(id, false)
  return {0}
end
local waiting = waited(id)
if times(id, score) <= now and not waiting then
  local lived = ttl_of(id)
  forget(id, true)
  return {3, lived}
end
if not waiting and redis.call('EXISTS', key('inbox', f[3])) == 0
    and redis.call('ZCARD', inboxes) >= tonumber(ARGV[9]) then
  -- At the bound: runs counted whose inbox is gone otherwise (deleted by hand) are
  -- taken out of the count before refusing.
  for _, run in ipairs(redis.call('ZRANGE', inboxes, 0, -1)) do
    if redis.call('EXISTS', key('inbox', run)) == 0 then redis.call('ZREM', inboxes, run) end
  end
  if redis.call('ZCARD', inboxes) >= tonumber(ARGV[9]) then return {4, f[3]} end
end
redis.call('ZREM', calls, id)
redis.call('ZREM', key('tool', f[2]), id)
redis.call('SREM', key('run', f[3]), id)
if waiting then
  redis.call('SET', key('result', id), ARGV[7], 'PX', keep)
  redis.call('PEXPIRE', key('call', id), keep)
  redis.call('ZADD', held, now, id)
  redis.call('PUBLISH', ARGV[8], '')
  return {1}
end
redis.call('DEL', key('call', id))
return {2, f[3], push(f[3], id, f[1], ARGV[7])}"
    ),
};

/// ARGV: id. Answers the call's time to live in milliseconds when it expired (remembered
/// as such, or past its time and not yet swept), else 0. Reads only.
static NOT_PENDING: Script = Script {
    name: "pending_not_pending",
    source: concat!(
        prelude!(),
        "local id = ARGV[6]
local forget = redis.call('ZSCORE', expired, id)
if forget and tonumber(forget) > now then return math.max(expired_ttl(id), 1) end
local score = redis.call('ZSCORE', calls, id)
if score and times(id, score) <= now and not waited(id) then return math.max(ttl_of(id), 1) end
return 0"
    ),
};

/// KEYS: sorted sets of calls (`calls`, or `tool:{tool}`). Answers `[id, created, call
/// JSON, waited for (1 or 0), expires, ...]` of the calls not expired.
static SNAPSHOT: Script = Script {
    name: "pending_snapshot",
    source: concat!(
        prelude!(),
        "local out = {}
for _, set in ipairs(KEYS) do
  for _, id in ipairs(redis.call('ZRANGE', set, 0, -1)) do
    local score = redis.call('ZSCORE', calls, id)
    local call = score and redis.call('HGET', key('call', id), 'call')
    if call then
      local expires, created = times(id, score)
      local waiting = waited(id)
      if expires > now or waiting then
        out[#out + 1] = id
        out[#out + 1] = created
        out[#out + 1] = call
        out[#out + 1] = waiting and 1 or 0
        out[#out + 1] = expires
      end
    end
  end
end
return out"
    ),
};

/// ARGV: run, owner, `1` when only the owner's (and no agent's) are counted. How many of
/// the run's calls are pending.
static COUNT: Script = Script {
    name: "pending_count",
    source: concat!(
        prelude!(),
        "sweep()
local run, n = key('run', ARGV[6]), 0
for _, id in ipairs(redis.call('SMEMBERS', run)) do
  local score = redis.call('ZSCORE', calls, id)
  local call = score and redis.call('HGET', key('call', id), 'call')
  if not call then
    redis.call('SREM', run, id)
  elseif times(id, score) > now or waited(id) then
    if ARGV[8] ~= '1' then
      n = n + 1
    else
      local ok, decoded = pcall(cjson.decode, call)
      if ok and type(decoded) == 'table' and (decoded.owner == nil or decoded.owner == ARGV[7]) then
        n = n + 1
      end
    end
  end
end
return n"
    ),
};

/// ARGV: run, owner, `1` when only the owner's (and no agent's) are taken. Answers the
/// results taken, newest first as stored; the others stay in order, with the list's time
/// to live.
static TAKE_INBOX: Script = Script {
    name: "pending_take_inbox",
    source: concat!(
        prelude!(),
        "sweep()
local inbox = key('inbox', ARGV[6])
local entries = redis.call('LRANGE', inbox, 0, -1)
if ARGV[8] ~= '1' then
  redis.call('DEL', inbox)
  redis.call('ZREM', inboxes, ARGV[6])
  return entries
end
local taken, kept = {}, {}
for _, entry in ipairs(entries) do
  local ok, decoded = pcall(cjson.decode, entry)
  if ok and type(decoded) == 'table' and type(decoded.call) == 'table'
      and (decoded.call.owner == nil or decoded.call.owner == ARGV[7]) then
    table.insert(taken, entry)
  else
    table.insert(kept, entry)
  end
end
if #taken > 0 then
  local left = redis.call('PTTL', inbox)
  redis.call('DEL', inbox)
  for _, entry in ipairs(kept) do redis.call('RPUSH', inbox, entry) end
  if #kept > 0 and left > 0 then redis.call('PEXPIRE', inbox, left) end
  if #kept == 0 then redis.call('ZREM', inboxes, ARGV[6]) end
end
return taken"
    ),
};
