//! [`RedisPendingStore`]: pending external calls and the inboxes of runs in Redis, so that
//! a call opened through one replica can be answered through another.
//!
//! Under `{prefix}:x`:
//!
//! - `call:{id}`, a hash: the call (`call`, JSON), its `tool` and `run`;
//! - `calls`, a sorted set of every pending call by creation time (the server's clock),
//!   and `tool:{tool}`, the same per tool, for `pending(tools, ..)`; `run:{run}`, a set of
//!   the run's pending calls, for `count_pending`;
//! - `waiter:{id}`: `open` from the opening of a synchronous call until someone waits for
//!   it, then `waiting` until the wait ends; a result submitted while it exists is the
//!   waiter's (`result:{id}`, then a message on the channel `{prefix}:x:{id}` wakes it),
//!   otherwise it goes to the run's inbox;
//! - `inbox:{run}`, a list capped at [`toolmux_external::DEFAULT_MAX_INBOX`] results, the
//!   oldest dropped;
//! - the channel `{prefix}:x:new` announces every call opened, for long polls.
//!
//! Every step that reads and writes is one Lua script, so two replicas answering the same
//! call, or an answer racing the end of a wait, have exactly one outcome. The semantics
//! are [`toolmux_external::MemoryPendingStore`]'s, with three differences a shared store
//! needs: the bound on pending calls is for all replicas together; a call still pending
//! its time to live (a day, [`RETENTION`], unless [`RedisPendingStore::with_ttl`] says
//! otherwise) after it was opened is forgotten (its opener is long gone), as is an inbox
//! nobody added to or read for the results' time to live (the whole inbox, not each
//! result); and a synchronous call must start waiting within
//! [`OPEN_WAITER_TTL`] of its opening, after which its result goes to the inbox (so that a
//! replica that crashed between the two does not swallow it).
//!
//! The keys a script touches are not all declared (some are named after what it reads),
//! so this store needs a single Redis server, not a Redis Cluster.

use crate::backend::BackendShared;
use crate::client::Script;
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
    CallStatus, DEFAULT_MAX_INBOX, DEFAULT_MAX_PENDING, Delivery, ExecutionType, ExternalResult,
    InboxEntry, PendingCall, PendingStore,
};

/// How long a pending call, an unread inbox or an unclaimed result is kept.
pub const RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a synchronous call may take between its opening and the start of its wait.
pub const OPEN_WAITER_TTL: Duration = Duration::from_secs(5 * 60);

/// How often a long poll or a wait asks Redis even when nothing was announced.
const POLL_EVERY: Duration = crate::queue::POLL_EVERY;

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
    /// How long a call stays pending, and a result unread (in an inbox, or for a waiter
    /// that went away).
    pending_ttl: Duration,
    result_ttl: Duration,
    /// The subscription to `{prefix}:x:new`, made at the first long poll and kept.
    opened: tokio::sync::OnceCell<Subscription>,
}

/// A pending call as stored: [`PendingCall`] without its id and time, which are the
/// sorted set's member and score.
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
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredResult {
    result: Value,
    is_error: bool,
}

/// An inbox entry as the resolve script writes it.
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
                pending_ttl: RETENTION,
                result_ttl: RETENTION,
                opened: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// At most `max_pending` calls pending (over all replicas) and `max_inbox` results
    /// per inbox, instead of the defaults of [`toolmux_external::MemoryPendingStore`].
    pub fn with_limits(self, max_pending: usize, max_inbox: usize) -> Self {
        let inner = &self.inner;
        RedisPendingStore {
            inner: Arc::new(StoreInner {
                backend: inner.backend.clone(),
                base: inner.base.clone(),
                next: AtomicU64::new(inner.next.load(Ordering::Relaxed)),
                max_pending: max_pending.max(1),
                max_inbox: max_inbox.max(1),
                pending_ttl: inner.pending_ttl,
                result_ttl: inner.result_ttl,
                opened: tokio::sync::OnceCell::new(),
            }),
        }
    }

    /// Calls pending longer than `pending` are forgotten, and results unread for `result`
    /// (an inbox is kept `result` after its last result came), instead of [`RETENTION`]
    /// for both: the settings of [`toolmux_external::MemoryPendingStore::with_ttl`].
    pub fn with_ttl(self, pending: Duration, result: Duration) -> Self {
        let inner = &self.inner;
        let at_least = Duration::from_millis(1);
        RedisPendingStore {
            inner: Arc::new(StoreInner {
                backend: inner.backend.clone(),
                base: inner.base.clone(),
                next: AtomicU64::new(inner.next.load(Ordering::Relaxed)),
                max_pending: inner.max_pending,
                max_inbox: inner.max_inbox,
                pending_ttl: pending.max(at_least),
                result_ttl: result.max(at_least),
                opened: tokio::sync::OnceCell::new(),
            }),
        }
    }
}

impl StoreInner {
    fn key(&self, kind: &str, id: &str) -> String {
        format!("{}:{kind}:{id}", self.base)
    }

    /// The keys the scripts that end a call touch: the call, the set of calls, its waiter
    /// mark and its result.
    fn call_keys(&self, call_id: &str) -> [String; 4] {
        [
            self.key("call", call_id),
            format!("{}:calls", self.base),
            self.key("waiter", call_id),
            self.key("result", call_id),
        ]
    }

    fn timeout(&self) -> Duration {
        self.backend.client.timeout()
    }

    /// The time an attempt may take to end by `deadline`.
    fn within(&self, deadline: Instant) -> Duration {
        deadline.saturating_duration_since(Instant::now()).max(MIN_ATTEMPT).min(self.timeout())
    }

    async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        timeout: Duration,
    ) -> Result<Reply, crate::RedisError> {
        self.backend.client.eval(script, keys, args, timeout).await
    }

    /// The pending calls of `tools` (all when empty), oldest first.
    async fn snapshot(&self, tools: &[String], timeout: Duration) -> Vec<PendingCall> {
        let keys: Vec<String> = if tools.is_empty() {
            vec![format!("{}:calls", self.base)]
        } else {
            let mut tools: Vec<&String> = tools.iter().collect();
            tools.sort();
            tools.dedup();
            tools.into_iter().map(|t| self.key("tool", t)).collect()
        };
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let ttl = self.pending_ttl.as_millis().to_string();
        let args: [&[u8]; 2] = [self.base.as_bytes(), ttl.as_bytes()];
        let reply = match self.eval(&SNAPSHOT, &keys, &args, timeout).await {
            Ok(reply) => reply,
            Err(e) => {
                if !e.is_unreachable() {
                    tracing::warn!(target: "toolmux::redis", "cannot list pending calls: {}", toolmux_core::error_report(&e));
                }
                return Vec::new();
            }
        };
        let mut calls: Vec<PendingCall> = reply
            .as_array()
            .unwrap_or_default()
            .chunks_exact(4)
            .filter_map(|item| {
                let id = item[0].as_str()?;
                let created_ms = item[1].as_str()?.parse::<f64>().ok()? as u64;
                let call: StoredCall = serde_json::from_slice(item[2].as_bytes()?).ok()?;
                let mut call = pending_call(id.to_owned(), created_ms, call);
                // A synchronous call's waiter mark: its caller has yet to wait, or waits.
                if item[3].as_i64() == Some(1) {
                    call.status = CallStatus::Waiting;
                }
                call.expires_ms = created_ms + self.pending_ttl.as_millis() as u64;
                Some(call)
            })
            .collect();
        calls.sort_by(|a, b| (a.created_ms, &a.call_id).cmp(&(b.created_ms, &b.call_id)));
        calls
    }

    /// Takes the result of `call_id` if it is there (`Ok(None)` if not yet).
    async fn take_result(
        &self,
        script: &Script,
        call_id: &str,
        timeout: Duration,
    ) -> Result<Option<ExternalResult>, crate::RedisError> {
        let (waiter, result) = (self.key("waiter", call_id), self.key("result", call_id));
        let reply = self.eval(script, &[&waiter, &result], &[], timeout).await?;
        Ok(reply.as_bytes().and_then(parse_result))
    }
}

/// A wait under way; dropped before it ended, it ends the wait in Redis (in a task of
/// its own), so that a result submitted later goes to the inbox.
struct Waiting {
    inner: Arc<StoreInner>,
    /// `None` once the wait ended in Redis.
    call_id: Option<String>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let (Some(call_id), Ok(runtime)) = (self.call_id.take(), Handle::try_current()) else {
            return;
        };
        let inner = self.inner.clone();
        runtime.spawn(async move {
            // A result that came just before is lost with its caller, as in memory.
            let _ = inner.take_result(&GIVE_UP, &call_id, inner.timeout()).await;
        });
    }
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
    }
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
        let stored = StoredCall {
            tool: call.tool,
            arguments: call.arguments,
            run_id: call.run_id,
            owner: call.owner,
            execution_type: call.execution_type,
            is_async: call.is_async,
            visible: call.visible,
        };
        let json = serde_json::to_vec(&stored).map_err(|e| ToolError::other(PROVIDER, e))?;
        let keys = [
            format!("{}:calls", inner.base),
            inner.key("call", &id),
            inner.key("tool", &stored.tool),
            inner.key("run", &stored.run_id),
            inner.key("waiter", &id),
        ];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let max = inner.max_pending.to_string();
        let open_ttl = OPEN_WAITER_TTL.as_millis().to_string();
        let retention = inner.pending_ttl.as_millis().to_string();
        let channel = format!("{}:new", inner.base);
        let sync = if stored.is_async { "0" } else { "1" };
        let args: [&[u8]; 10] = [
            id.as_bytes(),
            &json,
            stored.tool.as_bytes(),
            stored.run_id.as_bytes(),
            max.as_bytes(),
            sync.as_bytes(),
            open_ttl.as_bytes(),
            channel.as_bytes(),
            retention.as_bytes(),
            inner.base.as_bytes(),
        ];
        let reply = inner.eval(&OPEN, &keys, &args, inner.timeout()).await.map_err(unreachable)?;
        match reply.as_array().and_then(|r| r.first()).and_then(Reply::as_i64) {
            Some(1) => Ok(id),
            _ => Err(ToolError::QueueBusy {
                tool: stored.tool,
                queue: "external results".to_owned(),
                waited: Duration::ZERO,
            }),
        }
    }

    async fn wait(&self, call_id: &str, timeout: Duration) -> Option<ExternalResult> {
        let inner = &self.inner;
        let deadline = Instant::now() + timeout;
        // Claim the wait: a result already there is taken, and a second wait (or one for
        // an asynchronous or unknown call) gets nothing, as in memory.
        let (waiter, result) = (inner.key("waiter", call_id), inner.key("result", call_id));
        let ttl = (timeout + inner.timeout() * 2 + Duration::from_secs(1)).as_millis().to_string();
        // If this future is dropped (its caller was cancelled or cut by a deadline) before
        // the wait ends, the call stops being waited for, so that a result submitted later
        // goes to the inbox, as in memory.
        let mut waiting = Waiting { inner: inner.clone(), call_id: Some(call_id.to_owned()) };
        let reply = inner
            .eval(&CLAIM, &[&waiter, &result], &[ttl.as_bytes()], inner.within(deadline))
            .await
            .ok()?;
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
                inner.take_result(&TAKE, call_id, inner.within(deadline)).await
            {
                waiting.call_id = None;
                return Some(result);
            }
            crate::pubsub::wake_or_poll(&mut wake, POLL_EVERY, deadline).await;
        }
        // Give up, unless a result came at the last moment: the submitter was told it
        // reached the waiting call, so it must.
        let result = inner.take_result(&GIVE_UP, call_id, inner.timeout()).await;
        if result.is_ok() {
            waiting.call_id = None;
        }
        result.ok().flatten()
    }

    async fn withdraw(&self, call_id: &str) {
        let inner = &self.inner;
        let keys = inner.call_keys(call_id);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args = [call_id.as_bytes(), inner.base.as_bytes()];
        if let Err(e) = inner.eval(&WITHDRAW, &keys, &args, inner.timeout()).await {
            tracing::debug!(target: "toolmux::redis", "call {call_id} not withdrawn: {}", toolmux_core::error_report(&e));
        }
    }

    async fn pending_except(
        &self,
        tools: &[String],
        exclude: &[String],
        wait: Duration,
    ) -> Vec<PendingCall> {
        let inner = &self.inner;
        let except = |mut calls: Vec<PendingCall>| {
            calls.retain(|c| !exclude.contains(&c.call_id));
            calls
        };
        if wait.is_zero() {
            return except(inner.snapshot(tools, inner.timeout()).await);
        }
        let deadline = Instant::now() + wait;
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
            let calls = except(inner.snapshot(tools, inner.within(deadline)).await);
            let now = Instant::now();
            if !calls.is_empty() || now >= deadline {
                return calls;
            }
            crate::pubsub::wake_or_poll(&mut wake, POLL_EVERY, deadline).await;
        }
    }

    async fn resolve(&self, call_id: &str, result: ExternalResult) -> Result<Delivery, ToolError> {
        let inner = &self.inner;
        let stored = StoredResult { result: result.result, is_error: result.is_error };
        let json = serde_json::to_vec(&stored).map_err(|e| ToolError::other(PROVIDER, e))?;
        let id_json = serde_json::to_string(call_id).map_err(|e| ToolError::other(PROVIDER, e))?;
        let keys = inner.call_keys(call_id);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let max_inbox = inner.max_inbox.to_string();
        let kept = inner.result_ttl.as_millis().to_string();
        let channel = format!("{}:{call_id}", inner.base);
        let args: [&[u8]; 8] = [
            call_id.as_bytes(),
            &json,
            kept.as_bytes(),
            max_inbox.as_bytes(),
            channel.as_bytes(),
            inner.base.as_bytes(),
            kept.as_bytes(),
            id_json.as_bytes(),
        ];
        let reply =
            inner.eval(&RESOLVE, &keys, &args, inner.timeout()).await.map_err(unreachable)?;
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
            _ => Err(ToolError::invalid_arguments(
                "external__submit",
                format!(
                    "no pending call `{call_id}` (never made, answered already, or its caller \
                     gave up); `external__pending` lists the calls waiting"
                ),
            )),
        }
    }

    async fn take_inbox(&self, run_id: &str, owner: Option<&str>) -> Vec<InboxEntry> {
        let inner = &self.inner;
        let inbox = inner.key("inbox", run_id);
        let taken = match owner {
            None => inner.eval(&TAKE_INBOX, &[&inbox], &[], inner.timeout()).await,
            Some(owner) => {
                inner.eval(&TAKE_OWNED, &[&inbox], &[owner.as_bytes()], inner.timeout()).await
            }
        };
        let reply = match taken {
            Ok(reply) => reply,
            Err(e) => {
                tracing::warn!(target: "toolmux::redis", run = %run_id, "inbox not read: {}", toolmux_core::error_report(&e));
                return Vec::new();
            }
        };
        // Newest first in the list (LPUSH): reversed, oldest first.
        reply
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
            .collect()
    }

    async fn count_pending(&self, run_id: &str, owner: Option<&str>) -> usize {
        let inner = &self.inner;
        let key = inner.key("run", run_id);
        let counted = match owner {
            None => inner.backend.client.command(&["SCARD", &key]).await,
            Some(owner) => {
                let base = inner.base.as_bytes();
                inner.eval(&COUNT_OWNED, &[&key], &[owner.as_bytes(), base], inner.timeout()).await
            }
        };
        match counted {
            Ok(reply) => reply.as_i64().and_then(|n| usize::try_from(n).ok()).unwrap_or(0),
            Err(_) => 0,
        }
    }
}

/// KEYS: calls, call, tool, run, waiter. ARGV: id, call JSON, tool, run, max pending,
/// synchronous (`1`), open-waiter TTL, new-call channel, retention, base. Answers
/// `[1, now]` when opened, `[0, now]` when full.
static OPEN: Script = Script {
    name: "pending_open",
    source: "if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local base = ARGV[10]
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[9]), 'LIMIT', 0, 100)
for _, id in ipairs(old) do
  local call = base .. ':call:' .. id
  local f = redis.call('HMGET', call, 'tool', 'run')
  if f[1] then redis.call('ZREM', base .. ':tool:' .. f[1], id) end
  if f[2] then redis.call('SREM', base .. ':run:' .. f[2], id) end
  redis.call('DEL', call, base .. ':waiter:' .. id, base .. ':result:' .. id)
  redis.call('ZREM', KEYS[1], id)
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[5]) then return {0, now} end
redis.call('HSET', KEYS[2], 'call', ARGV[2], 'tool', ARGV[3], 'run', ARGV[4])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
if ARGV[6] == '1' then redis.call('SET', KEYS[5], 'open', 'PX', ARGV[7]) end
redis.call('PUBLISH', ARGV[8], ARGV[3])
return {1, now}",
};

/// KEYS: waiter, result. ARGV: waiting TTL. Answers `[1, result]` (there already),
/// `[0]` (claimed: wait for it) or `[-1]` (nothing to wait for).
static CLAIM: Script = Script {
    name: "pending_claim",
    source: "local r = redis.call('GET', KEYS[2])
if r then
  redis.call('DEL', KEYS[1], KEYS[2])
  return {1, r}
end
if redis.call('GET', KEYS[1]) == 'open' then
  redis.call('SET', KEYS[1], 'waiting', 'PX', ARGV[1])
  return {0}
end
return {-1}",
};

/// KEYS: waiter, result. Answers the result, taken, or nil.
static TAKE: Script = Script {
    name: "pending_take",
    source: "local r = redis.call('GET', KEYS[2])
if r then redis.call('DEL', KEYS[1], KEYS[2]) end
return r",
};

/// KEYS: waiter, result. Answers the result, taken, or nil after ending the wait (later
/// results go to the inbox).
static GIVE_UP: Script = Script {
    name: "pending_give_up",
    source: "local r = redis.call('GET', KEYS[2])
redis.call('DEL', KEYS[1], KEYS[2])
return r",
};

/// KEYS: call, calls, waiter, result. ARGV: id, base.
static WITHDRAW: Script = Script {
    name: "pending_withdraw",
    source: "local base = ARGV[2]
local f = redis.call('HMGET', KEYS[1], 'tool', 'run')
if f[1] then redis.call('ZREM', base .. ':tool:' .. f[1], ARGV[1]) end
if f[2] then redis.call('SREM', base .. ':run:' .. f[2], ARGV[1]) end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4])
return 1",
};

/// KEYS: call, calls, waiter, result. ARGV: id, result JSON, result TTL, inbox cap,
/// result channel, base, retention, id as JSON. Answers `[1]` (to the waiting call),
/// `[2, run, dropped entries]` (to the inbox) or `[0]` (no such call).
static RESOLVE: Script = Script {
    name: "pending_resolve",
    source: "local base = ARGV[6]
local f = redis.call('HMGET', KEYS[1], 'call', 'tool', 'run')
if not f[1] then return {0} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', base .. ':tool:' .. f[2], ARGV[1])
redis.call('SREM', base .. ':run:' .. f[3], ARGV[1])
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('SET', KEYS[4], ARGV[2], 'PX', ARGV[3])
  redis.call('PUBLISH', ARGV[5], '')
  return {1}
end
local inbox = base .. ':inbox:' .. f[3]
local cap = tonumber(ARGV[4])
redis.call('LPUSH', inbox, '{\"callId\":' .. ARGV[8] .. ',\"call\":' .. f[1] .. ',\"result\":' .. ARGV[2] .. '}')
local dropped = redis.call('LRANGE', inbox, cap, -1)
redis.call('LTRIM', inbox, 0, cap - 1)
redis.call('PEXPIRE', inbox, ARGV[7])
return {2, f[3], dropped}",
};

/// KEYS: sorted sets of calls. ARGV: base, pending TTL. Answers `[id, created, call JSON,
/// waiter mark (1 or 0), ...]` of the calls opened within the TTL.
static SNAPSHOT: Script = Script {
    name: "pending_snapshot",
    source: "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, key in ipairs(KEYS) do
  local ids = redis.call('ZRANGEBYSCORE', key, now - tonumber(ARGV[2]), '+inf', 'WITHSCORES')
  for i = 1, #ids, 2 do
    local call = redis.call('HGET', ARGV[1] .. ':call:' .. ids[i], 'call')
    if call then
      out[#out + 1] = ids[i]
      out[#out + 1] = ids[i + 1]
      out[#out + 1] = call
      out[#out + 1] = redis.call('EXISTS', ARGV[1] .. ':waiter:' .. ids[i])
    end
  end
end
return out",
};

/// KEYS: inbox. Answers its entries, newest first, and empties it.
/// KEYS: inbox. ARGV: owner. Takes the results of calls `owner` (or no agent) made,
/// newest first as stored; the others stay in order, with the list's time to live.
static TAKE_OWNED: Script = Script {
    name: "pending_take_owned",
    source: "local entries = redis.call('LRANGE', KEYS[1], 0, -1)
local taken, kept = {}, {}
for _, entry in ipairs(entries) do
  local ok, decoded = pcall(cjson.decode, entry)
  if ok and type(decoded) == 'table' and type(decoded.call) == 'table'
      and (decoded.call.owner == nil or decoded.call.owner == ARGV[1]) then
    table.insert(taken, entry)
  else
    table.insert(kept, entry)
  end
end
if #taken > 0 then
  local ttl = redis.call('PTTL', KEYS[1])
  redis.call('DEL', KEYS[1])
  for _, entry in ipairs(kept) do redis.call('RPUSH', KEYS[1], entry) end
  if #kept > 0 and ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
end
return taken",
};

/// KEYS: the run's set of pending calls. ARGV: owner, base. How many of them `owner` (or
/// no agent) made.
static COUNT_OWNED: Script = Script {
    name: "pending_count_owned",
    source: "local n = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local call = redis.call('HGET', ARGV[2] .. ':call:' .. id, 'call')
  if call then
    local ok, decoded = pcall(cjson.decode, call)
    if ok and type(decoded) == 'table' and (decoded.owner == nil or decoded.owner == ARGV[1]) then
      n = n + 1
    end
  end
end
return n",
};

static TAKE_INBOX: Script = Script {
    name: "pending_take_inbox",
    source: "local entries = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return entries",
};
