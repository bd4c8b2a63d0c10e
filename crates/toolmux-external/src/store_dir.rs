//! [`DirPendingStore`]: pending external calls and the inboxes of runs in a folder, so that
//! every process using the folder (`toolmux serve`, `toolmux agent listen`, `toolmux tools
//! call`) sees and answers the others' calls without a Redis server.
//!
//! In the folder:
//!
//! - `calls/ID.json`, one per pending call ([`Stored`]): the call; while its caller waits
//!   for the result (a synchronous call), until when it waits; and a result handed to that
//!   caller, until the caller takes it;
//! - `inbox/run-RUN.json`, a run's inbox, oldest first, capped at `max_inbox` results;
//! - `expired.json`, the ids of calls that expired, kept as long as their results would
//!   have been, with their times to live, so that a late result is refused saying why;
//! - `.lock`: every change is made holding it.
//!
//! Each file is replaced whole through a renamed temporary file, so no reader sees a part of
//! one. A change of several files (a result moved to its run's inbox with its call's file
//! removed, expired calls forgotten) is made whole through the folder's journal
//! ([`crate::journal`]), which a reader without the lock finding it waits for (or
//! completes, when a process killed midway left it). Every other change is of one file. They
//! are not flushed to the disk: a pending call need not outlive a power loss.
//! Every change runs on the blocking pool, never on the event loop.
//!
//! A caller waiting in this process is woken at once by a result submitted through this
//! process, and within [`POLL`] by one submitted through another; a long poll for new calls
//! within [`LIST_POLL`]. A synchronous call's caller writes until when it waits: past that
//! (its process ended without giving up), the call's result goes to the run's inbox, as the
//! result of a call that timed out does, and a result handed to it that it never took is
//! moved there by the next sweep. Sweeps (at most every [`SWEEP_EVERY`] per process, when a
//! call is opened or answered or an inbox read) forget what expired and set aside files
//! nobody can read, so that one bad file stops nothing. Listing reads only the call files
//! that changed since the last look. The semantics are otherwise [`MemoryPendingStore`]'s,
//! the bound on pending calls being for all processes together.
//!
//! [`MemoryPendingStore`]: crate::MemoryPendingStore

use crate::folder;
use crate::journal::Change;
use crate::store::{
    CallStatus, DEFAULT_MAX_INBOX, DEFAULT_MAX_INBOXES, DEFAULT_MAX_PENDING, DEFAULT_PENDING_TTL,
    DEFAULT_RESULT_TTL, Delivery, ExternalResult, InboxEntry, NotPending, OPEN_WAITER, PendingCall,
    PendingStore, except, expired_call, inboxes_full, later, now_ms, unknown_call,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use toolmux_core::ToolError;

/// How often a waiting caller looks at its call's file for a result another process
/// submitted.
pub const POLL: Duration = Duration::from_millis(25);

/// How often a long poll looks at the folder for calls another process made.
pub const LIST_POLL: Duration = Duration::from_millis(100);

/// How old a temporary file left by a process that died mid-write must be to be removed.
const STALE_TEMP: Duration = Duration::from_secs(60 * 60);

/// How much longer than its wait a caller is taken to be waiting: time to give up.
const WAIT_SLACK: Duration = Duration::from_secs(2);

/// How long past its timeout a wait may wait for the folder's lock to take its result or
/// give up: half of the time its caller allows past the wait ([`crate::ANSWER_MARGIN`]),
/// so that another process holding the lock for longer (up to the lock's 10 s) never
/// keeps the wait past its caller's time limit, which would withdraw the call and refuse
/// its result. A wait that could not give up in time leaves it to a task.
const FINISH_WAIT: Duration = Duration::from_millis(500);
const _: () = assert!(FINISH_WAIT.as_millis() * 2 <= crate::ANSWER_MARGIN.as_millis());

/// How often, at most, a process looks through every file for expired ones (unless the
/// store is full); reading skips expired ones whenever it looks.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The provider errors of this store name.
const PROVIDER: &str = "external";

/// What the lock's error calls the folder.
const WHAT: &str = "pending external calls";

/// The folders in the folder: made at the start, and again under the lock when a cleaner
/// of temporary files removed them.
const SUBFOLDERS: [&str; 2] = ["calls", "inbox"];

/// Pending external calls and inboxes in a folder shared by processes (see the module's
/// documentation).
#[derive(Debug, Clone)]
pub struct DirPendingStore {
    inner: Arc<Inner>,
    /// Woken when this process opens or answers a call.
    changed: Arc<Notify>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    /// Distinguishes this process's ids from another's (`ext-TOKEN`, random: a process
    /// id used again, by a later process started at the same time of day, makes others).
    prefix: String,
    max_pending: usize,
    max_inbox: usize,
    /// Inbox files at most (runs with unread results), over all processes.
    max_inboxes: usize,
    pending_ttl: Duration,
    result_ttl: Duration,
    /// When this process last swept the folder.
    swept: Mutex<Option<std::time::Instant>>,
    /// The call files read by the last listing, by id: a file unchanged since (same inode,
    /// modification time and length) is not read again.
    seen: Mutex<HashMap<String, (FileStamp, Stored)>>,
}

/// What tells a replaced file from the one read before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    inode: u64,
    modified: Option<std::time::SystemTime>,
    len: u64,
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt as _;
        FileStamp { inode: meta.ino(), modified: meta.modified().ok(), len: meta.len() }
    }
}

/// A pending call as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    call: PendingCall,
    /// Set for a synchronous call while its caller waits, or is about to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    waiter: Option<Waiter>,
    /// A result handed to the waiting caller, until it takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<ExternalResult>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Waiter {
    /// Whether the caller started to wait (a second wait gets nothing).
    claimed: bool,
    /// Until when, in milliseconds since the Unix epoch.
    until_ms: u64,
}

impl Stored {
    /// Whether a caller waits for the result at `now` (not one that went away).
    fn waited_for(&self, now: u64) -> bool {
        self.waiter.is_some_and(|w| w.until_ms > now)
    }

    /// Whether the call expired unanswered at `now`: never while its caller waits.
    fn expired(&self, now: u64) -> bool {
        self.call.expires_ms <= now && !self.waited_for(now)
    }
}

/// An expired call in `expired.json`: when it is forgotten, in milliseconds since the Unix
/// epoch, and with its time to live (in files written before calls had their own, the
/// number alone, the time to live being the store's).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(untagged)]
enum Remembered {
    Forget(u64),
    #[serde(rename_all = "camelCase")]
    Kept {
        forget_ms: u64,
        ttl_ms: u64,
    },
}

impl Remembered {
    fn forget_ms(self) -> u64 {
        match self {
            Remembered::Forget(ms) | Remembered::Kept { forget_ms: ms, .. } => ms,
        }
    }

    /// The call's time to live, `default` when not written.
    fn ttl(self, default: Duration) -> Duration {
        match self {
            Remembered::Forget(_) => default,
            Remembered::Kept { ttl_ms, .. } => Duration::from_millis(ttl_ms),
        }
    }
}

/// A result in an inbox file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Inboxed {
    /// The run whose inbox it is (two runs may share a file where names are told apart
    /// without case).
    run_id: String,
    entry: InboxEntry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    expires_ms: u64,
}

/// What a caller about to wait finds.
enum Claim {
    /// The result, there already.
    Taken(ExternalResult),
    /// Nothing yet: wait for it.
    Wait,
    /// Nothing to wait for (unknown, asynchronous, or waited for already).
    Nothing,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether `id` can be a call's id here; anything else (a path, say) is no call.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 100
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

impl DirPendingStore {
    /// A store in folder `path` (made if missing) of at most [`DEFAULT_MAX_PENDING`] pending
    /// calls and [`DEFAULT_MAX_INBOX`] results per inbox, kept for [`DEFAULT_PENDING_TTL`]
    /// and [`DEFAULT_RESULT_TTL`].
    pub fn open(path: impl Into<PathBuf>) -> Result<DirPendingStore, String> {
        let path = path.into();
        for sub in SUBFOLDERS {
            folder::make_dir(&path.join(sub), WHAT)?;
        }
        Ok(DirPendingStore {
            inner: Arc::new(Inner {
                path,
                prefix: format!("ext-{}", toolmux_core::unique_token()),
                max_pending: DEFAULT_MAX_PENDING,
                max_inbox: DEFAULT_MAX_INBOX,
                max_inboxes: DEFAULT_MAX_INBOXES,
                pending_ttl: DEFAULT_PENDING_TTL,
                result_ttl: DEFAULT_RESULT_TTL,
                swept: Mutex::new(None),
                seen: Mutex::new(HashMap::new()),
            }),
            changed: Arc::new(Notify::new()),
        })
    }

    /// At most `max_pending` calls pending (over all processes) and `max_inbox` results per
    /// inbox; calls expire `pending` after they were made, results `result` after they
    /// reached their inbox (each at least a millisecond). For a store not yet shared.
    pub fn with_limits(
        self,
        max_pending: usize,
        max_inbox: usize,
        pending: Duration,
        result: Duration,
    ) -> Self {
        let inner = &self.inner;
        let least = Duration::from_millis(1);
        DirPendingStore {
            inner: Arc::new(Inner {
                path: inner.path.clone(),
                prefix: inner.prefix.clone(),
                max_pending: max_pending.max(1),
                max_inbox: max_inbox.max(1),
                max_inboxes: inner.max_inboxes,
                pending_ttl: pending.max(least),
                result_ttl: result.max(least),
                swept: Mutex::new(None),
                seen: Mutex::new(HashMap::new()),
            }),
            changed: self.changed,
        }
    }

    /// Keeps unread results for at most `max` runs at once, over all processes (at least 1;
    /// default [`DEFAULT_MAX_INBOXES`]). For a store not yet shared.
    pub fn with_max_inboxes(self, max: usize) -> Self {
        let inner = Inner {
            path: self.inner.path.clone(),
            prefix: self.inner.prefix.clone(),
            max_inboxes: max.max(1),
            swept: Mutex::new(None),
            seen: Mutex::new(HashMap::new()),
            // The bounds and times to live, as they were.
            ..*self.inner
        };
        DirPendingStore { inner: Arc::new(inner), changed: self.changed }
    }

    /// The same times to live as [`crate::MemoryPendingStore::with_ttl`], the bounds kept.
    pub fn with_ttl(self, pending: Duration, result: Duration) -> Self {
        let (max_pending, max_inbox) = (self.inner.max_pending, self.inner.max_inbox);
        self.with_limits(max_pending, max_inbox, pending, result)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `change` on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        change: impl FnOnce(&Inner) -> Result<T, ToolError> + Send + 'static,
    ) -> Result<T, ToolError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || change(&inner))
            .await
            .unwrap_or_else(|e| Err(ToolError::other(PROVIDER, e)))
    }

    fn snapshot(&self, tools: &[String]) -> Result<Vec<PendingCall>, ToolError> {
        self.inner.snapshot(false, |call| tools.is_empty() || tools.contains(&call.tool))
    }
}

impl Inner {
    fn lock(&self) -> Result<folder::Lock, ToolError> {
        folder::lock_blocking(&self.path, WHAT, PROVIDER, &SUBFOLDERS)
    }

    /// [`Inner::lock`], waiting for another process's release until `until` at most (the
    /// lock is tried once past it).
    fn lock_until(&self, until: std::time::Instant) -> Result<folder::Lock, ToolError> {
        let within = until.saturating_duration_since(std::time::Instant::now());
        folder::lock_within(&self.path, WHAT, PROVIDER, &SUBFOLDERS, within)
    }

    /// The time to live of `call`: its own, else the store's.
    fn ttl_of(&self, call: &PendingCall) -> Duration {
        call.ttl(self.pending_ttl, Duration::MAX)
    }

    fn call_path(&self, id: &str) -> PathBuf {
        self.path.join(call_file(id))
    }

    fn inbox_path(&self, run_id: &str) -> PathBuf {
        self.path.join(inbox_file(run_id))
    }

    /// Completes a change of several files under way or left half made by a killed process
    /// (taking the lock, which does it), for a reader without the lock: one stat when none
    /// is.
    fn settle(&self) -> Result<(), ToolError> {
        if crate::journal::pending(&self.path) {
            drop(self.lock()?);
        }
        Ok(())
    }

    fn load(&self, id: &str) -> Result<Option<Stored>, ToolError> {
        folder::read_json(&self.call_path(id), PROVIDER, "a pending call's file")
    }

    fn save(&self, stored: &Stored) -> Result<(), ToolError> {
        folder::write_json(&self.call_path(&stored.call.call_id), stored, false, PROVIDER)
    }

    fn remove(&self, id: &str) -> Result<(), ToolError> {
        let at = self.call_path(id);
        match std::fs::remove_file(&at) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(folder::failure(PROVIDER, &at, &e))
            }
            _ => Ok(()),
        }
    }

    /// The ids of the calls in the folder.
    fn ids(&self) -> Result<Vec<String>, ToolError> {
        let at = self.path.join("calls");
        let entries = std::fs::read_dir(&at).map_err(|e| folder::failure(PROVIDER, &at, &e))?;
        Ok(entries
            .filter_map(Result::ok)
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter_map(|file| file.strip_suffix(".json").map(str::to_owned))
            .filter(|id| valid_id(id))
            .collect())
    }

    /// The stored calls, read without the lock (each file is replaced whole): a file that
    /// did not change since the last look is not read again; one nobody can read is passed
    /// over (the next sweep sets it aside and says so). Fails when the folder cannot be
    /// listed.
    fn stored(&self) -> Result<Vec<Stored>, ToolError> {
        self.settle()?;
        let at = self.path.join("calls");
        let entries = match std::fs::read_dir(&at) {
            Ok(entries) => entries,
            // Removed (the next change makes it again): no call is pending.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(folder::failure(PROVIDER, &at, &e)),
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut now_seen = HashMap::with_capacity(seen.len());
        for entry in entries.filter_map(Result::ok) {
            let Some(id) = entry
                .file_name()
                .to_str()
                .and_then(|f| f.strip_suffix(".json"))
                .filter(|id| valid_id(id))
                .map(str::to_owned)
            else {
                continue;
            };
            let Ok(meta) = entry.metadata() else { continue };
            let stamp = FileStamp::of(&meta);
            let stored = match seen.remove(&id) {
                Some((was, stored)) if was == stamp => stored,
                _ => match self.load(&id) {
                    Ok(Some(stored)) => stored,
                    _ => continue,
                },
            };
            now_seen.insert(id, (stamp, stored));
        }
        let stored = now_seen.values().map(|(_, s)| s.clone()).collect();
        *seen = now_seen;
        Ok(stored)
    }

    /// The pending calls that `keep` keeps, oldest first, with those whose result was handed
    /// to a caller that went away when `answered_too` (still on their way to the inbox).
    fn snapshot(
        &self,
        answered_too: bool,
        keep: impl Fn(&PendingCall) -> bool,
    ) -> Result<Vec<PendingCall>, ToolError> {
        let now = now_ms();
        let mut calls: Vec<PendingCall> = self
            .stored()?
            .into_iter()
            .filter(|s| {
                let unanswered = s.result.is_none() && !s.expired(now);
                let on_its_way = answered_too && s.result.is_some() && !s.waited_for(now);
                (unanswered || on_its_way) && keep(&s.call)
            })
            .map(|s| {
                let status =
                    if s.waited_for(now) { CallStatus::Waiting } else { CallStatus::Pending };
                PendingCall { status, ..s.call }
            })
            .collect();
        calls.sort_by(|a, b| (a.created_ms, &a.call_id).cmp(&(b.created_ms, &b.call_id)));
        Ok(calls)
    }

    /// Whether this process's last sweep was [`SWEEP_EVERY`] ago, or none was made.
    fn sweep_due(&self) -> bool {
        let swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
        swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY)
    }

    /// Opens `call`, holding the folder's lock (`_lock`).
    fn open(&self, lock: &folder::Lock, mut call: PendingCall) -> Result<String, ToolError> {
        let now = now_ms();
        let mut count = self.ids()?.len();
        if count >= self.max_pending || self.sweep_due() {
            self.sweep(lock, now);
            count = self.ids()?.len();
        }
        if count >= self.max_pending {
            return Err(ToolError::QueueBusy {
                tool: call.tool,
                queue: "external results".to_owned(),
                waited: Duration::ZERO,
            });
        }
        // One count for the process: two stores of one process on one folder (an embedding
        // program's) make different ids too; an id taken by a process long gone whose
        // number and start time this one repeats is passed over.
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = loop {
            let id = format!("{}-{}", self.prefix, NEXT.fetch_add(1, Ordering::Relaxed));
            if !self.call_path(&id).exists() {
                break id;
            }
        };
        call.call_id = id.clone();
        call.created_ms = now;
        call.expires_ms = now.saturating_add(ms(self.ttl_of(&call)));
        call.status = if call.is_async { CallStatus::Pending } else { CallStatus::Waiting };
        let waiter = (!call.is_async)
            .then(|| Waiter { claimed: false, until_ms: now.saturating_add(ms(OPEN_WAITER)) });
        self.save(&Stored { call, waiter, result: None })?;
        Ok(id)
    }

    /// Marks `id` as waited for `timeout` from now, the folder's lock waited for until
    /// `until` at most.
    fn claim(
        &self,
        id: &str,
        timeout: Duration,
        until: std::time::Instant,
    ) -> Result<Claim, ToolError> {
        let _lock = self.lock_until(until)?;
        let now = now_ms();
        let Some(mut stored) = self.load(id)? else { return Ok(Claim::Nothing) };
        if let Some(result) = stored.result.take() {
            self.remove(id)?;
            return Ok(Claim::Taken(result));
        }
        match stored.waiter {
            Some(w) if !w.claimed && w.until_ms > now => {
                let until_ms = now.saturating_add(ms(timeout.saturating_add(WAIT_SLACK)));
                stored.waiter = Some(Waiter { claimed: true, until_ms });
                // Its time to live counts from the end of the wait.
                let after = until_ms.saturating_add(ms(self.ttl_of(&stored.call)));
                stored.call.expires_ms = stored.call.expires_ms.max(after);
                self.save(&stored)?;
                Ok(Claim::Wait)
            }
            _ => Ok(Claim::Nothing),
        }
    }

    /// The result handed to the waiting caller of `id`, taken (the call is done), the
    /// folder's lock waited for until `until` at most.
    fn take(
        &self,
        id: &str,
        until: std::time::Instant,
    ) -> Result<Option<ExternalResult>, ToolError> {
        let _lock = self.lock_until(until)?;
        let Some(result) = self.load(id)?.and_then(|s| s.result) else { return Ok(None) };
        self.remove(id)?;
        Ok(Some(result))
    }

    /// Ends the wait for `id`: a result there already is taken, a later one goes to the inbox.
    fn give_up(&self, id: &str) -> Result<Option<ExternalResult>, ToolError> {
        let _lock = self.lock()?;
        self.give_up_locked(id)
    }

    /// [`Inner::give_up`], holding the folder's lock.
    fn give_up_locked(&self, id: &str) -> Result<Option<ExternalResult>, ToolError> {
        let Some(mut stored) = self.load(id)? else { return Ok(None) };
        if let Some(result) = stored.result.take() {
            self.remove(id)?;
            return Ok(Some(result));
        }
        stored.waiter = None;
        stored.call.status = CallStatus::Pending;
        // A late result goes to the inbox for the call's time to live from now.
        stored.call.expires_ms = now_ms().saturating_add(ms(self.ttl_of(&stored.call)));
        self.save(&stored)?;
        Ok(None)
    }

    /// Ends the wait for `id` after its caller stopped waiting without giving up (the
    /// folder stayed locked past the time it had): a result handed to it meanwhile goes to
    /// the run's inbox, as one submitted later does (or, when the inbox refuses it, stays
    /// for the next sweep to move).
    fn give_up_late(&self, id: &str) -> Result<(), ToolError> {
        let lock = self.lock()?;
        let Some(mut stored) = self.load(id)? else { return Ok(()) };
        let now = now_ms();
        stored.waiter = None;
        stored.call.status = CallStatus::Pending;
        let Some(result) = stored.result.clone() else {
            stored.call.expires_ms = now.saturating_add(ms(self.ttl_of(&stored.call)));
            return self.save(&stored);
        };
        let mut moved = stored.clone();
        moved.result = None;
        match self.to_inbox(&lock, moved, result, now) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.save(&stored)?;
                Err(e)
            }
        }
    }

    fn withdraw(&self, id: &str) -> Result<(), ToolError> {
        let _lock = self.lock()?;
        self.remove(id)
    }

    fn expired(&self) -> Result<BTreeMap<String, Remembered>, ToolError> {
        let at = self.path.join("expired.json");
        Ok(folder::read_json(&at, PROVIDER, "a list of expired calls")?.unwrap_or_default())
    }

    fn resolve(&self, id: &str, result: ExternalResult) -> Result<Delivery, ToolError> {
        let lock = self.lock()?;
        let now = now_ms();
        if self.sweep_due() {
            self.sweep(&lock, now);
        }
        let Some(mut stored) = self.load(id)? else {
            if let Some(expired) = self.expired()?.get(id).filter(|e| e.forget_ms() > now) {
                return Err(expired_call(id, expired.ttl(self.pending_ttl)));
            }
            return Err(unknown_call(id));
        };
        if stored.result.is_some() {
            return Err(unknown_call(id));
        }
        if stored.expired(now) {
            let ttl = self.ttl_of(&stored.call);
            self.forget_expired(&lock, &[(id.to_owned(), ttl)], now)?;
            return Err(expired_call(id, ttl));
        }
        if stored.waited_for(now) {
            stored.result = Some(result);
            self.save(&stored)?;
            return Ok(Delivery::Waiting);
        }
        let run_id = stored.call.run_id.clone();
        self.to_inbox(&lock, stored, result, now)?;
        Ok(Delivery::Inbox { run_id })
    }

    /// Inbox file `at`'s results, of run `run_id`; an unreadable file is set aside (and
    /// named in a warning) and the inbox starts anew.
    fn read_inbox(&self, at: &Path) -> Result<Vec<Inboxed>, ToolError> {
        match folder::read_json(at, PROVIDER, "an inbox file") {
            Ok(inbox) => Ok(inbox.unwrap_or_default()),
            Err(e) => {
                set_aside(at, &e);
                Ok(Vec::new())
            }
        }
    }

    /// Moves `stored`'s `result` to its run's inbox, its call's file removed in the same
    /// change ([`crate::journal`]): a process killed midway leaves the call pending with no
    /// result in the inbox, or the result in the inbox and no call to answer again, never
    /// both.
    fn to_inbox(
        &self,
        lock: &folder::Lock,
        stored: Stored,
        result: ExternalResult,
        now: u64,
    ) -> Result<(), ToolError> {
        let file = inbox_file(&stored.call.run_id);
        let at = self.path.join(&file);
        if !at.exists() {
            // A new inbox: refused when too many runs have one (expired ones are swept
            // first), so that the folder does not grow without end.
            let count = || self.inbox_count();
            if count()? >= self.max_inboxes {
                self.sweep_inboxes(lock, now);
            }
            if count()? >= self.max_inboxes {
                let call = &stored.call;
                return Err(inboxes_full(&call.call_id, &call.run_id, self.max_inboxes));
            }
        }
        let mut inbox = self.read_inbox(&at)?;
        inbox.retain(|r| r.expires_ms > now);
        while inbox.len() >= self.max_inbox {
            let dropped = inbox.remove(0);
            tracing::warn!(
                run = %stored.call.run_id,
                "inbox full ({} results): dropped the result of {}",
                self.max_inbox,
                dropped.entry.call_id
            );
        }
        let call = stored.call;
        let mut change = Change::default();
        change.remove(call_file(&call.call_id));
        inbox.push(Inboxed {
            run_id: call.run_id,
            entry: InboxEntry {
                call_id: call.call_id,
                tool: call.tool,
                arguments: call.arguments,
                result,
            },
            owner: call.owner,
            expires_ms: now.saturating_add(ms(self.result_ttl)),
        });
        change.write_json(file, &inbox, PROVIDER)?;
        change.commit(&self.path, lock, false, PROVIDER)
    }

    fn take_inbox(&self, run_id: &str, owner: Option<&str>) -> Result<Vec<InboxEntry>, ToolError> {
        let at = self.inbox_path(run_id);
        let due = self.sweep_due();
        if !due && !at.exists() {
            return Ok(Vec::new());
        }
        let lock = self.lock()?;
        let now = now_ms();
        if due {
            // Moves the results handed to callers that went away to their inboxes first.
            self.sweep(&lock, now);
        }
        if !at.exists() {
            return Ok(Vec::new());
        }
        let mine = |r: &Inboxed| {
            r.run_id == run_id
                && owner.is_none_or(|o| r.owner.as_deref().is_none_or(|theirs| theirs == o))
        };
        let (taken, kept): (Vec<Inboxed>, Vec<Inboxed>) =
            self.read_inbox(&at)?.into_iter().filter(|r| r.expires_ms > now).partition(mine);
        if kept.is_empty() {
            match std::fs::remove_file(&at) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(folder::failure(PROVIDER, &at, &e));
                }
                _ => {}
            }
        } else if !taken.is_empty() {
            folder::write_json(&at, &kept, false, PROVIDER)?;
        }
        Ok(taken.into_iter().map(|r| r.entry).collect())
    }

    /// Forgets the calls `ids`, which expired (each with its time to live), remembering why
    /// for as long as their results would have been kept (one write of `expired.json` for
    /// them all, in one change with the removal of their files).
    fn forget_expired(
        &self,
        lock: &folder::Lock,
        ids: &[(String, Duration)],
        now: u64,
    ) -> Result<(), ToolError> {
        let at = self.path.join("expired.json");
        let mut expired = match self.expired() {
            Ok(expired) => expired,
            Err(e) => {
                set_aside(&at, &e);
                BTreeMap::new()
            }
        };
        expired.retain(|_, e| e.forget_ms() > now);
        for (id, ttl) in ids {
            if expired.len() >= self.max_pending {
                break;
            }
            let forget_ms = now.saturating_add(ms(self.result_ttl));
            expired.insert(id.clone(), Remembered::Kept { forget_ms, ttl_ms: ms(*ttl) });
        }
        let mut change = Change::default();
        change.write_json("expired.json", &expired, PROVIDER)?;
        for (id, _) in ids {
            change.remove(call_file(id));
        }
        change.commit(&self.path, lock, false, PROVIDER)
    }

    /// Forgets every call and result past its time and the temporary files of writes that
    /// never ended; a result handed to a caller that went away goes to the inbox (even past
    /// its call's time: it was submitted in time); a file nobody can read is set aside
    /// (`NAME.unreadable`) and named in a warning. Nothing it meets stops it.
    fn sweep(&self, lock: &folder::Lock, now: u64) {
        *self.swept.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
        let mut expired = Vec::new();
        for id in self.ids().unwrap_or_default() {
            let mut stored = match self.load(&id) {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                Err(e) => {
                    set_aside(&self.call_path(&id), &e);
                    continue;
                }
            };
            if !stored.waited_for(now)
                && let Some(result) = stored.result.take()
            {
                if let Err(e) = self.to_inbox(lock, stored, result, now) {
                    tracing::warn!(target: "toolmux::external", "the result of {id} not moved to its inbox: {e}");
                }
            } else if stored.expired(now) {
                expired.push((id, self.ttl_of(&stored.call)));
            }
        }
        if !expired.is_empty()
            && let Err(e) = self.forget_expired(lock, &expired, now)
        {
            tracing::warn!(target: "toolmux::external", "expired calls not forgotten: {e}");
        }
        self.sweep_inboxes(lock, now);
        let inboxes = self.path.join("inbox");
        for dir in [self.path.clone(), self.path.join("calls"), inboxes] {
            remove_stale_temporaries(&dir);
        }
    }

    /// How many inbox files there are.
    fn inbox_count(&self) -> Result<usize, ToolError> {
        let at = self.path.join("inbox");
        let entries = std::fs::read_dir(&at).map_err(|e| folder::failure(PROVIDER, &at, &e))?;
        Ok(entries
            .filter_map(Result::ok)
            .filter(|entry| entry.path().extension().is_some_and(|x| x == "json"))
            .count())
    }

    /// Forgets the results past their time in every inbox, and the inboxes left empty.
    fn sweep_inboxes(&self, _lock: &folder::Lock, now: u64) {
        let inboxes = self.path.join("inbox");
        for entry in std::fs::read_dir(&inboxes).into_iter().flatten().filter_map(Result::ok) {
            let file = entry.path();
            if file.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Ok(mut inbox) = self.read_inbox(&file) else { continue };
            let before = inbox.len();
            inbox.retain(|r| r.expires_ms > now);
            let kept = if inbox.is_empty() {
                std::fs::remove_file(&file).map_err(|e| folder::failure(PROVIDER, &file, &e))
            } else if inbox.len() < before {
                folder::write_json(&file, &inbox, false, PROVIDER)
            } else {
                Ok(())
            };
            if let Err(e) = kept {
                tracing::warn!(target: "toolmux::external", "{e}");
            }
        }
    }
}

/// Call `id`'s file, in the folder.
fn call_file(id: &str) -> PathBuf {
    PathBuf::from("calls").join(format!("{id}.json"))
}

/// Run `run_id`'s inbox file, in the folder.
fn inbox_file(run_id: &str) -> PathBuf {
    let mut name = folder::encode(run_id);
    // File names have at most 255 bytes: a long run id keeps its start and a hash.
    if name.len() > 160 {
        let hash = toolmux_core::naming::short_hash("inbox", run_id);
        name = format!("{}~{hash}", &name[..120]);
    }
    PathBuf::from("inbox").join(format!("run-{name}.json"))
}

/// Renames unreadable file `at` to `NAME.unreadable`, saying so.
fn set_aside(at: &Path, e: &ToolError) {
    let aside = at.with_extension("unreadable");
    tracing::warn!(target: "toolmux::external", "{e}; set aside as `{}`", aside.display());
    let _ = std::fs::rename(at, &aside);
}

/// Removes the temporary files (`.NAME.PID.N.tmp`) in `dir` older than [`STALE_TEMP`]:
/// what a process that died mid-write left.
fn remove_stale_temporaries(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with('.') && name.ends_with(".tmp")) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|age| age >= STALE_TEMP);
        if old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A wait under way; dropped before it ended (its caller was cancelled), it ends the wait in
/// the folder, so that a result submitted later goes to the inbox.
struct Waiting {
    store: DirPendingStore,
    /// `None` once the wait ended.
    call_id: Option<String>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(id) = self.call_id.take() else { return };
        let inner = self.store.inner.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || {
                // A result that came just before is lost with its caller, as in memory.
                let _ = inner.give_up(&id);
            });
        }
    }
}

/// The opening of a call under way; dropped before it handed the call's id over (its
/// caller was dropped), it withdraws the call if the id came meanwhile.
struct Opening {
    rx: tokio::sync::oneshot::Receiver<Result<String, ToolError>>,
    store: DirPendingStore,
    /// Set once the id (or the failure) was read.
    done: bool,
}

impl Drop for Opening {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Closed first: a later hand-over fails, and its sender withdraws the call.
        self.rx.close();
        let Ok(Ok(id)) = self.rx.try_recv() else { return };
        if self.store.withdraw_now(&id) {
            return;
        }
        let inner = self.store.inner.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn_blocking(move || {
                if let Err(e) = inner.withdraw(&id) {
                    tracing::debug!(target: "toolmux::external", "call {id} not withdrawn: {e}");
                }
            });
        }
    }
}

#[async_trait]
impl PendingStore for DirPendingStore {
    /// The call is made on the blocking pool, where it goes on when its caller is dropped
    /// meanwhile: its id is handed over under the folder's lock, and a call whose caller
    /// is gone by then (or drops it before reading it) is withdrawn, never left pending
    /// for nobody.
    async fn open(&self, call: PendingCall) -> Result<String, ToolError> {
        self.open_within(call, folder::LOCK_TIMEOUT).await
    }

    /// [`PendingStore::open`], waiting for another process's lock up to `within` (at most
    /// the lock's 10 s); the lock is tried once however short `within` is.
    async fn open_within(&self, call: PendingCall, within: Duration) -> Result<String, ToolError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let inner = self.inner.clone();
        let mut opening = Opening { rx, store: self.clone(), done: false };
        let until = std::time::Instant::now() + within.min(folder::LOCK_TIMEOUT);
        tokio::task::spawn_blocking(move || {
            let lock = match inner.lock_until(until) {
                Ok(lock) => lock,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            if let Err(Ok(id)) = tx.send(inner.open(&lock, call))
                && let Err(e) = inner.remove(&id)
            {
                tracing::warn!(target: "toolmux::external", "call {id}, made for a caller gone since, not withdrawn: {e}");
            }
        });
        let opened = (&mut opening.rx).await;
        opening.done = true;
        let id = opened.unwrap_or_else(|e| Err(ToolError::other(PROVIDER, e)))?;
        self.changed.notify_waiters();
        Ok(id)
    }

    async fn wait(&self, call_id: &str, timeout: Duration) -> Option<ExternalResult> {
        if !valid_id(call_id) {
            return None;
        }
        let deadline = later(Instant::now(), timeout);
        // The folder's lock is waited for no longer than the wait (to mark the call) or
        // than a moment past it (to take the result or give up): another process holding
        // it must not keep the wait past its caller's time limit.
        let finish_by = later(deadline, FINISH_WAIT).into_std();
        let id = call_id.to_owned();
        let until = deadline.into_std();
        match self.blocking(move |inner| inner.claim(&id, timeout, until)).await {
            Ok(Claim::Taken(result)) => return Some(result),
            Ok(Claim::Wait) => {}
            Ok(Claim::Nothing) => return None,
            // The folder stayed locked: the call is still marked as waited for since its
            // opening, so its result is looked for all the same.
            Err(e) => tracing::warn!(
                target: "toolmux::external",
                "cannot mark call {call_id} as waited for ({e}); waiting for its result all the same"
            ),
        }
        let mut waiting = Waiting { store: self.clone(), call_id: Some(call_id.to_owned()) };
        loop {
            // Registered before looking, so that a result submitted in between wakes us.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // A look without the lock: the file is replaced whole.
            match self.inner.load(call_id) {
                Ok(None) => {
                    // Withdrawn, or expired: nothing comes.
                    waiting.call_id = None;
                    return None;
                }
                Ok(Some(stored)) if stored.result.is_some() => {
                    let id = call_id.to_owned();
                    let taken = self.blocking(move |inner| inner.take(&id, finish_by)).await;
                    if let Ok(Some(result)) = taken {
                        waiting.call_id = None;
                        return Some(result);
                    }
                }
                _ => {}
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let _ = tokio::time::timeout_at(deadline.min(now + POLL), changed).await;
        }
        waiting.call_id = None;
        let id = call_id.to_owned();
        // Give up, unless a result came at the last moment: its submitter was told it
        // reached the waiting call, so it must.
        let given_up = self
            .blocking(move |inner| {
                let _lock = inner.lock_until(finish_by)?;
                inner.give_up_locked(&id)
            })
            .await;
        match given_up {
            Ok(result) => result,
            Err(e) => {
                // The folder stayed locked: a task gives up once it is free, sending a
                // result that came meanwhile to the inbox, as one that comes later.
                tracing::debug!(target: "toolmux::external", "call {call_id} given up in a task: {e}");
                let (inner, id) = (self.inner.clone(), call_id.to_owned());
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = inner.give_up_late(&id) {
                        tracing::warn!(target: "toolmux::external", "the wait for call {id} not ended in the folder: {e}");
                    }
                });
                None
            }
        }
    }

    async fn withdraw(&self, call_id: &str) {
        if !valid_id(call_id) {
            return;
        }
        let id = call_id.to_owned();
        if let Err(e) = self.blocking(move |inner| inner.withdraw(&id)).await {
            tracing::debug!(target: "toolmux::external", "call {call_id} not withdrawn: {e}");
        }
    }

    /// Removes the call's file here when the folder's lock is free now (a few
    /// microseconds); when another process holds it, a task does it.
    fn withdraw_now(&self, call_id: &str) -> bool {
        if !valid_id(call_id) {
            return true;
        }
        let at = self.inner.path.join(".lock");
        let Ok(file) = folder::lock_file(&at, PROVIDER) else { return false };
        if !matches!(folder::try_lock(&file, &at, PROVIDER), Ok(Some(()))) {
            return false;
        }
        // A change a process killed midway left is completed first, as under any lock.
        let removed = crate::journal::recover(&self.inner.path, PROVIDER).is_ok()
            && self.inner.remove(call_id).is_ok();
        let _ = file.unlock();
        removed
    }

    async fn pending_except(
        &self,
        tools: &[String],
        exclude: &[String],
        wait: Duration,
    ) -> Result<Vec<PendingCall>, ToolError> {
        let deadline = later(Instant::now(), wait);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let store = self.clone();
            let tools_owned = tools.to_vec();
            let calls = tokio::task::spawn_blocking(move || store.snapshot(&tools_owned))
                .await
                .unwrap_or_else(|e| Err(ToolError::other(PROVIDER, e)))?;
            let calls = except(calls, exclude);
            let now = Instant::now();
            if !calls.is_empty() || now >= deadline {
                return Ok(calls);
            }
            let _ = tokio::time::timeout_at(deadline.min(now + LIST_POLL), changed).await;
        }
    }

    async fn resolve(&self, call_id: &str, result: ExternalResult) -> Result<Delivery, ToolError> {
        if !valid_id(call_id) {
            return Err(unknown_call(call_id));
        }
        let id = call_id.to_owned();
        let delivery = self.blocking(move |inner| inner.resolve(&id, result)).await?;
        self.changed.notify_waiters();
        Ok(delivery)
    }

    async fn not_pending(&self, call_id: &str) -> Result<NotPending, ToolError> {
        if !valid_id(call_id) {
            return Ok(NotPending::Unknown);
        }
        let id = call_id.to_owned();
        // Read without the lock: each file is replaced whole.
        let expired = self
            .blocking(move |inner| {
                inner.settle()?;
                let now = now_ms();
                Ok(match inner.load(&id)? {
                    Some(stored) => (stored.result.is_none() && stored.expired(now))
                        .then(|| inner.ttl_of(&stored.call)),
                    None => inner
                        .expired()?
                        .get(&id)
                        .filter(|e| e.forget_ms() > now)
                        .map(|e| e.ttl(inner.pending_ttl)),
                })
            })
            .await;
        Ok(match expired? {
            Some(ttl) => NotPending::Expired { ttl },
            None => NotPending::Unknown,
        })
    }

    async fn take_inbox(
        &self,
        run_id: &str,
        owner: Option<&str>,
    ) -> Result<Vec<InboxEntry>, ToolError> {
        let (run, owner) = (run_id.to_owned(), owner.map(str::to_owned));
        self.blocking(move |inner| inner.take_inbox(&run, owner.as_deref())).await
    }

    async fn count_pending(&self, run_id: &str, owner: Option<&str>) -> Result<usize, ToolError> {
        let (run, owner) = (run_id.to_owned(), owner.map(str::to_owned));
        self.blocking(move |inner| {
            let mine = |call: &PendingCall| {
                call.run_id == run
                    && owner.as_deref().is_none_or(|o| call.owner.as_deref().is_none_or(|m| m == o))
            };
            // A result on its way to the inbox (handed to a caller that went away) is
            // still to be read: counted, so that a reader looks again.
            Ok(inner.snapshot(true, mine)?.len())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sync_call() -> PendingCall {
        PendingCall {
            call_id: String::new(),
            tool: "external__confirm".into(),
            arguments: json!({}),
            run_id: "r".into(),
            owner: None,
            execution_type: crate::ExecutionType::External,
            is_async: false,
            visible: false,
            created_ms: 0,
            status: CallStatus::default(),
            expires_ms: 0,
            ttl_ms: None,
        }
    }

    /// Makes the waiter of call `id` one whose time ran out, as when its process ended
    /// without giving up.
    fn waiter_gone(store: &DirPendingStore, id: &str) {
        let mut stored = store.inner.load(id).unwrap().unwrap();
        stored.waiter = Some(Waiter { claimed: true, until_ms: 1 });
        store.inner.save(&stored).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_result_for_a_caller_that_went_away_goes_to_the_inbox() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirPendingStore::open(dir.path()).unwrap();
        let id = store.open(sync_call()).await.unwrap();
        waiter_gone(&store, &id);
        let listed = store.pending(&[], Duration::ZERO).await.unwrap();
        assert_eq!(listed[0].status, CallStatus::Pending);
        let answer = ExternalResult { result: json!("late"), is_error: false };
        let delivery = store.resolve(&id, answer.clone()).await.unwrap();
        assert_eq!(delivery, Delivery::Inbox { run_id: "r".into() });
        assert_eq!(store.take_inbox("r", None).await.unwrap()[0].result, answer);
    }

    /// A result handed to a caller that died reaches the inbox when an inbox is read, and is
    /// never dropped as expired: it was submitted in time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_result_outlives_its_call_s_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirPendingStore::open(dir.path()).unwrap();
        let id = store.open(sync_call()).await.unwrap();
        let answer = ExternalResult { result: json!("yes"), is_error: false };
        assert_eq!(store.resolve(&id, answer.clone()).await.unwrap(), Delivery::Waiting);
        waiter_gone(&store, &id);
        assert_eq!(store.count_pending("r", None).await.unwrap(), 1, "still to be read");
        let mut stored = store.inner.load(&id).unwrap().unwrap();
        stored.call.expires_ms = 1;
        store.inner.save(&stored).unwrap();
        *store.inner.swept.lock().unwrap() = None;
        assert_eq!(store.take_inbox("r", None).await.unwrap()[0].result, answer);
        assert!(store.inner.load(&id).unwrap().is_none(), "moved, not copied");
        assert_eq!(store.count_pending("r", None).await.unwrap(), 0);
        assert!(store.inner.expired().unwrap().is_empty(), "not taken for expired");
    }

    /// The folder as a new process sees it: the ids of the calls pending, and of those
    /// whose results run `r`'s inbox holds (taken).
    async fn seen(dir: &Path) -> (Vec<String>, Vec<String>) {
        let store = DirPendingStore::open(dir).unwrap();
        let pending = store.pending_except(&[], &[], Duration::ZERO).await.unwrap();
        let inbox = store.take_inbox("r", None).await.unwrap();
        (
            pending.into_iter().map(|c| c.call_id).collect(),
            inbox.into_iter().map(|e| e.call_id).collect(),
        )
    }

    const MOVED: &str =
        "store_dir::tests::a_result_moved_to_the_inbox_by_a_killed_process_is_there_once";

    /// A process submitting the result of an asynchronous call, killed with SIGKILL after
    /// any step of moving it to the run's inbox (the inbox written, the call's file
    /// removed), leaves the call pending with no result in the inbox or the result there
    /// and the call gone, as a new process sees the folder; never both, which an answering
    /// program would take for a call to answer again and the run would read twice. Before
    /// the journal, the child killed after the inbox's write left both.
    #[test]
    fn a_result_moved_to_the_inbox_by_a_killed_process_is_there_once() {
        use crate::journal::tests::{child_dir, killed_at};
        let runtime =
            || tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        if let Some(dir) = child_dir() {
            let id = std::fs::read_to_string(dir.join("call-id")).unwrap();
            let store = DirPendingStore::open(&dir).unwrap();
            let result = ExternalResult { result: json!("done"), is_error: false };
            let delivery = runtime().block_on(store.resolve(&id, result)).unwrap();
            assert_eq!(delivery, Delivery::Inbox { run_id: "r".into() });
            return;
        }
        let mut seen_after = Vec::new();
        let mut steps = 0;
        loop {
            let dir = tempfile::tempdir().unwrap();
            let store = DirPendingStore::open(dir.path()).unwrap();
            let call = PendingCall { is_async: true, ..sync_call() };
            let id = runtime().block_on(store.open(call)).unwrap();
            std::fs::write(dir.path().join("call-id"), &id).unwrap();
            let killed = killed_at(MOVED, dir.path(), steps);
            let (pending, inbox) = runtime().block_on(seen(dir.path()));
            seen_after.push((steps, killed, pending, inbox, id));
            assert!(!dir.path().join(".commit").exists(), "the journal is gone");
            if !killed {
                break;
            }
            steps += 1;
        }
        let both: Vec<_> =
            seen_after.iter().filter(|s| !s.2.is_empty() && !s.3.is_empty()).collect();
        assert!(
            both.is_empty(),
            "pending and in the inbox (step, killed, pending, inbox): {both:?}"
        );
        for (step, killed, pending, inbox, id) in &seen_after {
            // Killed before its journal was whole, the result is not taken; after, it is.
            let (pending, inbox) = (pending.as_slice(), inbox.as_slice());
            if *killed && *step == 0 {
                assert_eq!((pending, inbox), (std::slice::from_ref(id), &[][..]), "step {step}");
            } else {
                assert_eq!((pending, inbox), (&[][..], std::slice::from_ref(id)), "step {step}");
            }
        }
        assert_eq!(steps, 4, "staged, journal, inbox and call: every step was tried");
    }

    /// Many calls expired at once (a folder left alone for longer than their time) are
    /// forgotten in one sweep that writes the list of expired ids once.
    #[test]
    fn a_sweep_forgets_many_expired_calls_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirPendingStore::open(dir.path()).unwrap();
        for n in 0..500 {
            let call = PendingCall {
                call_id: format!("ext-old-{n}"),
                expires_ms: 1,
                is_async: true,
                ..sync_call()
            };
            store.inner.save(&Stored { call, waiter: None, result: None }).unwrap();
        }
        let stale = dir.path().join("calls").join(".ext-old-1.json.1.1.tmp");
        std::fs::write(&stale, b"{").unwrap();
        let old = std::time::SystemTime::now() - STALE_TEMP - Duration::from_secs(1);
        std::fs::File::options().write(true).open(&stale).unwrap().set_modified(old).unwrap();
        let lock = store.inner.lock().unwrap();
        store.inner.sweep(&lock, now_ms());
        assert!(store.inner.ids().unwrap().is_empty());
        assert_eq!(store.inner.expired().unwrap().len(), 500);
        assert!(!stale.exists(), "a write that never ended is cleaned up");
    }

    /// A folder locked by another process when the wait starts (past the lock's time) does
    /// not end the wait: the result submitted later still reaches the caller.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wait_that_cannot_take_the_lock_still_gets_its_result() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirPendingStore::open(dir.path()).unwrap();
        let id = store.open(sync_call()).await.unwrap();
        let lock = std::fs::File::options().write(true).open(dir.path().join(".lock")).unwrap();
        lock.lock().unwrap();
        let (waiting, waited) = (store.clone(), id.clone());
        let waiter =
            tokio::spawn(async move { waiting.wait(&waited, Duration::from_secs(10)).await });
        tokio::time::sleep(folder::LOCK_TIMEOUT + Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "still waiting");
        lock.unlock().unwrap();
        let answer = ExternalResult { result: json!("yes"), is_error: false };
        assert_eq!(store.resolve(&id, answer.clone()).await.unwrap(), Delivery::Waiting);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert_eq!(got, Some(answer));
    }

    /// Call ids carry a random token, not the process id and the time of day: a process
    /// that gets the id of one long gone never makes that one's call ids again.
    #[test]
    fn call_ids_are_random_per_store() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            DirPendingStore::open(dir.path()).unwrap(),
            DirPendingStore::open(dir.path()).unwrap(),
        );
        assert_ne!(a.inner.prefix, b.inner.prefix);
        let token = a.inner.prefix.strip_prefix("ext-").unwrap();
        assert!(token.len() == 12 && token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
        let id = a.inner.open(&a.inner.lock().unwrap(), sync_call()).unwrap();
        assert!(id.starts_with(&a.inner.prefix) && valid_id(&id), "{id}");
    }

    #[test]
    fn a_long_run_id_still_names_one_inbox_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirPendingStore::open(dir.path()).unwrap();
        let long = "r/".repeat(300);
        let at = store.inner.inbox_path(&long);
        let name = at.file_name().unwrap().to_str().unwrap();
        assert!(name.len() < 200, "{name}");
        assert_ne!(at, store.inner.inbox_path(&format!("{long}x")));
    }
}
