//! The response cache stage: successful outputs of cacheable tools kept for a TTL, keyed
//! by tool and the canonical JSON of the arguments, with identical concurrent calls
//! coalesced into one execution (single-flight): within the process always, and across
//! the processes sharing a cache that gives a lead per key ([`ResponseCache::lead`]).

use async_trait::async_trait;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use toolmux_core::{ContentPart, ToolError, ToolOutput};

/// Where cached outputs live; the in-process [`MemoryCache`] by default.
#[async_trait]
pub trait ResponseCache: Send + Sync + fmt::Debug {
    /// The output stored under `key`, if fresh.
    async fn get(&self, key: &str) -> Option<ToolOutput>;

    /// Stores `output` under `key` for `ttl`.
    async fn put(&self, key: &str, output: &ToolOutput, ttl: Duration);

    /// Takes the lead of the call cached under `key` among every process sharing this
    /// cache, asked by a process about to run it (its own identical calls already wait for
    /// it): [`Lead::Leading`] runs it, [`Lead::Follow`] waits for another process's run and
    /// then reads the cache. The default, [`Lead::Alone`], runs it: each process coalesces
    /// only its own callers, as a cache of one process should.
    async fn lead(&self, key: &str) -> Lead {
        let _ = key;
        Lead::Alone
    }
}

/// The answer of [`ResponseCache::lead`].
pub enum Lead {
    /// No lead across processes: this one runs the call.
    Alone,
    /// This process runs the call and holds the lead until the value is dropped, after its
    /// output is stored (or not: an error, a cancelled call). Its drop must not wait
    /// (a shared cache gives the lead up in a task).
    Leading(Box<dyn std::any::Any + Send + Sync>),
    /// Another process runs the call: the future ends when it gives the lead up, and at
    /// the latest when the lead's lease ends (a leader that died), never later.
    Follow(futures::future::BoxFuture<'static, ()>),
}

impl fmt::Debug for Lead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Lead::Alone => "Alone",
            Lead::Leading(_) => "Leading",
            Lead::Follow(_) => "Follow",
        })
    }
}

/// An in-process cache bounded in entries and in bytes; expired entries are dropped on
/// the way.
///
/// Outputs are kept as the tool returned them, the configuration's secrets redacted (the
/// orchestrator hands every cache, shared ones too, nothing else), before the size cap (each caller's copy is
/// capped, and spilled, as its own), so the bytes are bounded here: an output larger than a
/// quarter of the bound is not kept at all, and the entries closest to expiry make room for
/// a new one.
#[derive(Debug)]
pub struct MemoryCache {
    max_entries: usize,
    max_bytes: usize,
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<String, Entry>,
    /// The bytes of every entry's key and output.
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    expires: Instant,
    bytes: usize,
    output: ToolOutput,
}

impl Entries {
    fn remove(&mut self, key: &str) {
        if let Some(entry) = self.map.remove(key) {
            self.bytes -= entry.bytes;
        }
    }
}

/// The default bound of a [`MemoryCache`] in bytes: 64 MiB.
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

impl Default for MemoryCache {
    fn default() -> Self {
        MemoryCache::new(10_000)
    }
}

impl MemoryCache {
    /// A cache of at most `max_entries` outputs and [`DEFAULT_CACHE_BYTES`].
    pub fn new(max_entries: usize) -> Self {
        MemoryCache::bounded(max_entries, DEFAULT_CACHE_BYTES)
    }

    /// A cache of at most `max_entries` outputs taking at most `max_bytes` (as
    /// [`output_bytes`] counts them, keys included).
    pub fn bounded(max_entries: usize, max_bytes: usize) -> Self {
        MemoryCache { max_entries, max_bytes, entries: Mutex::new(Entries::default()) }
    }
}

/// About the bytes `output` holds: its text, data and JSON as compact text.
pub fn output_bytes(output: &ToolOutput) -> usize {
    let content: usize = output.content.iter().map(ContentPart::byte_len).sum();
    let structured = output.structured.as_ref().map_or(0, toolmux_core::json_len);
    let extras =
        output.extras.iter().map(|(k, v)| k.len() + toolmux_core::json_len(v)).sum::<usize>();
    content + structured + extras
}

#[async_trait]
impl ResponseCache for MemoryCache {
    async fn get(&self, key: &str) -> Option<ToolOutput> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.map.get(key) {
            Some(entry) if entry.expires > Instant::now() => Some(entry.output.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    async fn put(&self, key: &str, output: &ToolOutput, ttl: Duration) {
        let bytes = key.len() + output_bytes(output);
        if bytes > self.max_bytes / 4 {
            tracing::debug!(bytes, "an output too large to cache is not kept");
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.remove(key);
        let full = |entries: &Entries| {
            entries.map.len() >= self.max_entries || entries.bytes + bytes > self.max_bytes
        };
        if full(&entries) {
            let Entries { map, bytes: held } = &mut *entries;
            map.retain(|_, entry| {
                let fresh = entry.expires > now;
                if !fresh {
                    *held -= entry.bytes;
                }
                fresh
            });
        }
        if full(&entries) {
            // Still full of fresh entries: drop those closest to expiry until it fits.
            let mut by_expiry: Vec<(Instant, String)> =
                entries.map.iter().map(|(k, entry)| (entry.expires, k.clone())).collect();
            by_expiry.sort_unstable();
            for (_, victim) in by_expiry {
                if !full(&entries) {
                    break;
                }
                entries.remove(&victim);
            }
        }
        entries.bytes += bytes;
        entries.map.insert(
            key.to_owned(),
            Entry { expires: crate::later(now, ttl), bytes, output: output.clone() },
        );
    }
}

/// The cache key of a call: the tool and the canonical JSON of its arguments (object keys
/// sorted at every depth, so key order never splits the cache).
pub fn cache_key(tool: &str, arguments: &Value) -> String {
    let mut key = String::with_capacity(tool.len() + 64);
    key.push_str(tool);
    key.push('\u{0}');
    write_canonical(arguments, &mut key);
    key
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Coalesces identical concurrent calls: the first runs, the others wait for its output.
///
/// If the leader fails or is cancelled, one waiter takes over and runs the call itself:
/// errors are never shared, so a caller's own cancellation never fails another caller. The
/// leader asks the cache for the lead among processes ([`ResponseCache::lead`]) before it
/// runs the call: while another process has it, this process's callers wait for that
/// process's output in the cache, and the same hand-over holds.
#[derive(Debug, Default)]
pub struct SingleFlight {
    pending: Mutex<HashMap<String, watch::Receiver<Option<ToolOutput>>>>,
}

/// How a single-flight call was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// From the cache.
    Cache,
    /// By waiting for an identical call in flight.
    Coalesced,
    /// By running the call.
    Executed,
}

/// How long a caller may wait for an identical call of another caller
/// ([`SingleFlight::run_if`]).
#[derive(Debug, Clone, Copy)]
pub struct WaitLimit<'a> {
    /// The tool, for the error.
    pub tool: &'a str,
    /// When the wait ends.
    pub until: Instant,
    /// The limit the caller had when it started (said in the error).
    pub after: Duration,
}

struct PendingGuard<'a> {
    flight: &'a SingleFlight,
    key: &'a str,
    sender: watch::Sender<Option<ToolOutput>>,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        // Remove before the sender drops, so a waiter that wakes up on the closed channel
        // finds the slot free and can lead.
        self.flight.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(self.key);
    }
}

/// The key of [`ToolOutput::extras`] by which an output says it answers its run alone
/// (`true`): it depends on what the run did before (a file tool's "unchanged since your
/// last read"), so it is neither cached nor handed to a call of another run in flight.
pub const PER_RUN: &str = "per_run";

impl SingleFlight {
    /// Serves `key` from `cache`, from an identical call in flight, or by running `run`;
    /// a successful, non-error output of `run` is stored for `ttl`.
    pub async fn run<F, Fut>(
        &self,
        cache: &dyn ResponseCache,
        key: &str,
        ttl: Duration,
        run: F,
    ) -> (Result<ToolOutput, ToolError>, Served)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<ToolOutput, ToolError>>,
    {
        self.run_if(cache, key, ttl, run, || true, || None).await
    }

    /// As [`SingleFlight::run`], but an output is stored and shared only if `cacheable`
    /// says so once `run` has finished (not when the call asked its caller something), and
    /// only if the output does not say it is for its run alone ([`PER_RUN`]).
    ///
    /// `wait`: the caller's own limit, asked for when it starts waiting for an identical call
    /// of another caller (that call runs within that caller's limits, not this one's): past
    /// `until`, the wait ends with [`ToolError::Timeout`] for `tool`, `after` being the
    /// limit that was reached. A caller that runs the call itself is bounded by `run`, and
    /// by `wait` too when it waited first (for a call that failed): its wait and its own
    /// run are within the one limit.
    pub async fn run_if<'w, F, Fut>(
        &self,
        cache: &dyn ResponseCache,
        key: &str,
        ttl: Duration,
        run: F,
        cacheable: impl Fn() -> bool,
        wait: impl Fn() -> Option<WaitLimit<'w>>,
    ) -> (Result<ToolOutput, ToolError>, Served)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<ToolOutput, ToolError>>,
    {
        let mut waited = false;
        loop {
            if let Some(hit) = cache.get(key).await {
                return (Ok(hit), Served::Cache);
            }
            let waiting = {
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                match pending.get(key) {
                    Some(receiver) => Err(receiver.clone()),
                    None => {
                        let (sender, receiver) = watch::channel(None);
                        pending.insert(key.to_owned(), receiver);
                        Ok(PendingGuard { flight: self, key, sender })
                    }
                }
            };
            match waiting {
                Ok(guard) => {
                    // The lead among the processes sharing the cache, if it is shared; while
                    // another process runs the call, this one's callers wait for it here.
                    let lead = loop {
                        match cache.lead(key).await {
                            Lead::Follow(released) => {
                                waited = true;
                                if let Err(error) = within(wait(), released).await {
                                    return (Err(error), Served::Coalesced);
                                }
                                if let Some(hit) = cache.get(key).await {
                                    guard.sender.send_replace(Some(hit.clone()));
                                    return (Ok(hit), Served::Coalesced);
                                }
                                // Given up without an output to share: lead, or follow
                                // the process that took over.
                            }
                            lead => break lead,
                        }
                    };
                    let result = if waited {
                        within(wait(), run()).await.unwrap_or_else(Err)
                    } else {
                        run().await
                    };
                    if let Ok(output) = &result
                        && !output.is_error
                        && output.extras.get(PER_RUN) != Some(&Value::Bool(true))
                        && cacheable()
                    {
                        cache.put(key, output, ttl).await;
                        guard.sender.send_replace(Some(output.clone()));
                    }
                    // After the output is stored: the processes that followed read it.
                    drop(lead);
                    drop(guard);
                    return (result, Served::Executed);
                }
                Err(mut receiver) => {
                    waited = true;
                    // Either a value arrives or the leader is gone (error, cancellation);
                    // in the second case, loop and lead.
                    let arrived = match within(wait(), receiver.wait_for(Option::is_some)).await {
                        Ok(arrived) => arrived,
                        Err(error) => return (Err(error), Served::Coalesced),
                    };
                    if let Ok(output) = arrived
                        && let Some(output) = output.clone()
                    {
                        return (Ok(output), Served::Coalesced);
                    }
                }
            }
        }
    }
}

/// `wait` for another caller's call, within the caller's `limit` (else
/// [`ToolError::Timeout`]).
async fn within<T>(
    limit: Option<WaitLimit<'_>>,
    wait: impl Future<Output = T>,
) -> Result<T, ToolError> {
    let Some(limit) = limit else { return Ok(wait.await) };
    tokio::time::timeout_at(limit.until, wait).await.map_err(|_| ToolError::Timeout {
        tool: limit.tool.to_owned(),
        after: limit.after,
        idle: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn canonical_keys_ignore_key_order() {
        let a = cache_key("t", &json!({"b": [1, {"y": 1, "x": 2}], "a": "s"}));
        let b = cache_key("t", &json!({"a": "s", "b": [1, {"x": 2, "y": 1}]}));
        assert_eq!(a, b);
        assert_eq!(a, "t\u{0}{\"a\":\"s\",\"b\":[1,{\"x\":2,\"y\":1}]}");
        assert_ne!(a, cache_key("u", &json!({"a": "s", "b": [1, {"x": 2, "y": 1}]})));
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire() {
        let cache = MemoryCache::default();
        cache.put("k", &ToolOutput::text("v"), Duration::from_secs(10)).await;
        assert!(cache.get("k").await.is_some());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(cache.get("k").await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn bounded() {
        let cache = MemoryCache::new(2);
        for k in ["a", "b", "c"] {
            cache.put(k, &ToolOutput::text(k), Duration::from_secs(10)).await;
        }
        assert_eq!(cache.entries.lock().unwrap().map.len(), 2);
        assert!(cache.get("c").await.is_some());
    }

    /// Outputs are kept before the size cap, so the cache is bounded in bytes: the entries
    /// closest to expiry make room, and an output over a quarter of the bound is not kept.
    #[tokio::test(start_paused = true)]
    async fn bounded_in_bytes() {
        let cache = MemoryCache::bounded(100, 4000);
        let ttl = |s| Duration::from_secs(s);
        cache.put("a", &ToolOutput::text("a".repeat(900)), ttl(30)).await;
        cache.put("b", &ToolOutput::text("b".repeat(900)), ttl(10)).await;
        cache.put("c", &ToolOutput::text("c".repeat(900)), ttl(20)).await;
        cache.put("d", &ToolOutput::text("d".repeat(900)), ttl(40)).await;
        assert_eq!(cache.entries.lock().unwrap().bytes, 3604);
        cache.put("e", &ToolOutput::text("e".repeat(900)), ttl(50)).await;
        assert!(cache.get("b").await.is_none(), "the one closest to expiry made room");
        for key in ["a", "c", "d", "e"] {
            assert!(cache.get(key).await.is_some(), "{key}");
        }
        cache.put("huge", &ToolOutput::text("h".repeat(1001)), ttl(60)).await;
        assert!(cache.get("huge").await.is_none(), "over a quarter of the bound");
        // Replacing an entry counts its bytes once.
        cache.put("a", &ToolOutput::text("A".repeat(500)), ttl(30)).await;
        assert_eq!(cache.entries.lock().unwrap().bytes, 3 * 901 + 501);
        let structured = ToolOutput::json(serde_json::json!({"k": "v"}));
        assert_eq!(output_bytes(&structured), 9);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_identical_calls_run_once() {
        let flight = SingleFlight::default();
        let cache = MemoryCache::default();
        let runs = AtomicU32::new(0);
        let run = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(ToolOutput::text("x"))
        };
        let calls = (0..8).map(|_| flight.run(&cache, "k", Duration::from_secs(60), run));
        let results = futures::future::join_all(calls).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(results.iter().filter(|(_, s)| *s == Served::Executed).count(), 1);
        assert_eq!(results.iter().filter(|(_, s)| *s == Served::Coalesced).count(), 7);
        let (_, served) = flight.run(&cache, "k", Duration::from_secs(60), run).await;
        assert_eq!(served, Served::Cache);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_not_cached_nor_shared() {
        let flight = SingleFlight::default();
        let cache = MemoryCache::default();
        let runs = AtomicU32::new(0);
        let run = || async {
            let n = runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            if n == 0 {
                Err(ToolError::remote("t", "first fails"))
            } else {
                Ok(ToolOutput::text("ok"))
            }
        };
        let (a, b) = tokio::join!(
            flight.run(&cache, "k", Duration::from_secs(60), run),
            flight.run(&cache, "k", Duration::from_secs(60), run)
        );
        assert!(a.0.is_err());
        assert_eq!(b.0.unwrap().to_text(), "ok");
        assert_eq!(b.1, Served::Executed);
        let error_output = flight
            .run(&cache, "e", Duration::from_secs(60), || async { Ok(ToolOutput::error("bad")) })
            .await;
        assert!(error_output.0.unwrap().is_error);
        assert!(cache.get("e").await.is_none());
    }
}
