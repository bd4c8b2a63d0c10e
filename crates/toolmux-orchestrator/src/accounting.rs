//! The accounting stage: a record per call, per-tool statistics (counts and latency
//! percentiles) that can be saved and loaded, and the JSON-lines audit log.
//!
//! Several processes may share one statistics file (parallel `toolmux tools call`, a
//! `toolmux serve` beside them): [`Stats::save`] merges. Under an exclusive lock on a
//! sibling file (`stats.json.lock`) it reads the file, adds what this process counted since
//! its last save (never its totals, which would count twice), and replaces the file through
//! a temporary file of its own. Every stored aggregate is a sum, so merging is adding:
//! counts, the sums of latencies (all calls and successful calls), and the latency
//! histogram bucket by bucket; the percentiles and the average are computed again from the
//! merged sums and histogram.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::time::{Duration, Instant};
use toolmux_core::ToolKind;

/// What one call did, as recorded when it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The full tool name (after alias resolution).
    pub tool: String,
    /// The provider namespace; empty for an unknown tool.
    pub namespace: String,
    /// The provider kind.
    pub kind: ToolKind,
    /// The run.
    pub run_id: String,
    /// The caller's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// The operation id.
    pub op_id: u64,
    /// The enclosing operation, for calls made inside calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_op_id: Option<u64>,
    /// Wall time, queue wait included.
    pub latency_ms: u64,
    /// Time spent waiting for a queue slot.
    pub queued_ms: u64,
    /// Characters of the arguments (compact JSON).
    pub chars_in: u64,
    /// Characters of the output given to the caller.
    pub chars_out: u64,
    /// `ok` or `failed`.
    pub status: CallStatus,
    /// The error code when failed (`timeout`, `invalid_arguments`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// Served from the response cache or by an identical call in flight.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
    /// The full output went to the output store.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spilled: bool,
    /// Attempts made (more than 1 when retried).
    pub attempts: u32,
    /// The caller's distributed trace (`traceparent`), when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<String>,
}

/// Outcome of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// Succeeded.
    Ok,
    /// Failed.
    Failed,
}

// Latency histogram: microseconds, 4 buckets per power of two (under 19% error), up to 2^41 µs.
const SUB_BUCKETS: u32 = 4;
const BUCKETS: usize = 4 * 41;

fn bucket_of(micros: u64) -> usize {
    if micros < 4 {
        return micros as usize;
    }
    let exp = 63 - micros.leading_zeros();
    let sub = (micros >> (exp - 2)) & 3;
    ((SUB_BUCKETS * (exp - 1)) as usize + sub as usize).min(BUCKETS - 1)
}

fn bucket_midpoint(index: usize) -> u64 {
    if index < 4 {
        return index as u64;
    }
    let exp = index as u32 / SUB_BUCKETS + 1;
    let sub = index as u64 % u64::from(SUB_BUCKETS);
    let low = (4 + sub) << (exp - 2);
    let high = (5 + sub) << (exp - 2);
    (low + high) / 2
}

/// Statistics of one tool, updated without locks.
#[derive(Debug)]
pub struct ToolStats {
    count: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    total_micros: AtomicU64,
    /// Latency of successful calls only, for their average.
    ok_micros: AtomicU64,
    histogram: Box<[AtomicU64]>,
}

impl Default for ToolStats {
    fn default() -> Self {
        ToolStats {
            count: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            total_micros: AtomicU64::new(0),
            ok_micros: AtomicU64::new(0),
            histogram: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ToolStats {
    /// Records one call.
    pub fn record(&self, ok: bool, micros: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if ok {
            self.ok.fetch_add(1, Ordering::Relaxed);
            self.ok_micros.fetch_add(micros, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.total_micros.fetch_add(micros, Ordering::Relaxed);
        self.histogram[bucket_of(micros)].fetch_add(1, Ordering::Relaxed);
    }

    /// A serializable copy.
    pub fn snapshot(&self) -> ToolStatsSnapshot {
        self.counters().to_snapshot()
    }

    fn counters(&self) -> Counters {
        Counters {
            count: self.count.load(Ordering::Relaxed),
            ok: self.ok.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            total_micros: self.total_micros.load(Ordering::Relaxed),
            ok_micros: self.ok_micros.load(Ordering::Relaxed),
            histogram: self.histogram.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        }
    }

    fn add(&self, counters: &Counters) {
        self.count.fetch_add(counters.count, Ordering::Relaxed);
        self.ok.fetch_add(counters.ok, Ordering::Relaxed);
        self.failed.fetch_add(counters.failed, Ordering::Relaxed);
        self.total_micros.fetch_add(counters.total_micros, Ordering::Relaxed);
        self.ok_micros.fetch_add(counters.ok_micros, Ordering::Relaxed);
        for (bucket, count) in self.histogram.iter().zip(&counters.histogram) {
            bucket.fetch_add(*count, Ordering::Relaxed);
        }
    }
}

/// The sums one tool's statistics consist of, as integers: what saving adds and subtracts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Counters {
    count: u64,
    ok: u64,
    failed: u64,
    total_micros: u64,
    ok_micros: u64,
    // Invariant: `BUCKETS` long.
    histogram: Vec<u64>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            count: 0,
            ok: 0,
            failed: 0,
            total_micros: 0,
            ok_micros: 0,
            histogram: vec![0; BUCKETS],
        }
    }
}

impl Counters {
    fn from_snapshot(saved: &ToolStatsSnapshot) -> Counters {
        let micros = |ms: f64| (ms * 1000.0).round().max(0.0) as u64;
        let mut histogram = vec![0; BUCKETS];
        for (index, count) in &saved.histogram {
            if let Some(bucket) = index.parse::<usize>().ok().and_then(|i| histogram.get_mut(i)) {
                *bucket += *count;
            }
        }
        let total_micros = micros(saved.total_latency_ms);
        // Files from before successful calls' time was kept separately: when none failed,
        // all the time was theirs.
        let ok_micros = match saved.ok_latency_ms {
            Some(ms) => micros(ms),
            None if saved.failed == 0 => total_micros,
            None => 0,
        };
        Counters {
            count: saved.count,
            ok: saved.ok,
            failed: saved.failed,
            total_micros,
            ok_micros,
            histogram,
        }
    }

    fn to_snapshot(&self) -> ToolStatsSnapshot {
        let micros_to_ms = |m: u64| m as f64 / 1000.0;
        ToolStatsSnapshot {
            count: self.count,
            ok: self.ok,
            failed: self.failed,
            total_latency_ms: micros_to_ms(self.total_micros),
            ok_latency_ms: Some(micros_to_ms(self.ok_micros)),
            avg_ok_ms: micros_to_ms(self.ok_micros.checked_div(self.ok).unwrap_or(0)),
            p50_ms: micros_to_ms(self.percentile_micros(0.50)),
            p95_ms: micros_to_ms(self.percentile_micros(0.95)),
            histogram: self
                .histogram
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, c)| (i.to_string(), *c))
                .collect(),
        }
    }

    fn percentile_micros(&self, p: f64) -> u64 {
        let total: u64 = self.histogram.iter().sum();
        if total == 0 {
            return 0;
        }
        // All the calls in one bucket (one call, or calls alike): their mean is exact
        // where the bucket's middle is up to 12% off (one 3002 ms call read 2883.6).
        let filled = self.histogram.iter().filter(|c| **c > 0).count();
        if filled == 1 && total == self.count {
            return self.total_micros / total;
        }
        let rank = ((total as f64) * p).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.histogram.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_midpoint(i);
            }
        }
        0
    }

    fn add(&mut self, other: &Counters) {
        self.count += other.count;
        self.ok += other.ok;
        self.failed += other.failed;
        self.total_micros += other.total_micros;
        self.ok_micros += other.ok_micros;
        for (mine, theirs) in self.histogram.iter_mut().zip(&other.histogram) {
            *mine += theirs;
        }
    }

    /// What `self` has beyond `earlier`, each sum at least 0 (a file someone emptied).
    fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            count: self.count.saturating_sub(earlier.count),
            ok: self.ok.saturating_sub(earlier.ok),
            failed: self.failed.saturating_sub(earlier.failed),
            total_micros: self.total_micros.saturating_sub(earlier.total_micros),
            ok_micros: self.ok_micros.saturating_sub(earlier.ok_micros),
            histogram: self
                .histogram
                .iter()
                .zip(&earlier.histogram)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
        }
    }

    fn is_zero(&self) -> bool {
        self.count == 0 && self.total_micros == 0 && self.histogram.iter().all(|c| *c == 0)
    }
}

/// Saved statistics of one tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolStatsSnapshot {
    /// Calls.
    pub count: u64,
    /// Successful calls.
    pub ok: u64,
    /// Failed calls.
    pub failed: u64,
    /// Sum of latencies.
    pub total_latency_ms: f64,
    /// Sum of the latencies of successful calls (absent in files from before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok_latency_ms: Option<f64>,
    /// Average latency of successful calls: failures and timeouts are left out, so that a
    /// tool that times out now and then does not look slow when it answers.
    #[serde(default)]
    pub avg_ok_ms: f64,
    /// Median latency.
    pub p50_ms: f64,
    /// 95th percentile latency.
    pub p95_ms: f64,
    /// Latency histogram (bucket index to count), kept so that loading and saving again
    /// preserves the percentiles.
    pub histogram: BTreeMap<String, u64>,
}

/// Saved statistics of every tool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// Format version.
    pub version: u32,
    /// Per tool, by full name.
    pub tools: BTreeMap<String, ToolStatsSnapshot>,
}

impl StatsSnapshot {
    /// The statistics in Prometheus' text format: `toolmux_tool_calls_total` by tool and
    /// outcome, and `toolmux_tool_latency_seconds` (p50, p95, sum, count) by tool.
    pub fn prometheus(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(256 + self.tools.len() * 320);
        out.push_str(
            "# HELP toolmux_tool_calls_total Tool calls, by tool and outcome.\n\
             # TYPE toolmux_tool_calls_total counter\n",
        );
        for (tool, stats) in &self.tools {
            let tool = label_value(tool);
            let _ = writeln!(
                out,
                "toolmux_tool_calls_total{{tool=\"{tool}\",outcome=\"ok\"}} {}",
                stats.ok
            );
            let _ = writeln!(
                out,
                "toolmux_tool_calls_total{{tool=\"{tool}\",outcome=\"failed\"}} {}",
                stats.failed
            );
        }
        out.push_str(
            "# HELP toolmux_tool_latency_seconds Tool call latency, by tool.\n\
             # TYPE toolmux_tool_latency_seconds summary\n",
        );
        for (tool, stats) in &self.tools {
            let tool = label_value(tool);
            let seconds = |ms: f64| ms / 1000.0;
            for (quantile, ms) in [("0.5", stats.p50_ms), ("0.95", stats.p95_ms)] {
                let _ = writeln!(
                    out,
                    "toolmux_tool_latency_seconds{{tool=\"{tool}\",quantile=\"{quantile}\"}} {}",
                    seconds(ms)
                );
            }
            let sum = seconds(stats.total_latency_ms);
            let _ = writeln!(out, "toolmux_tool_latency_seconds_sum{{tool=\"{tool}\"}} {sum}");
            let _ = writeln!(
                out,
                "toolmux_tool_latency_seconds_count{{tool=\"{tool}\"}} {}",
                stats.count
            );
        }
        out
    }
}

/// `text` as a Prometheus label value: backslash, double quote and newline escaped.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Why statistics could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatsError {
    /// Reading or writing the file failed.
    #[error("statistics file {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A folder on the way to the file is a file (an `outputDir` that is a file, say).
    #[error(
        "statistics file {path} cannot be kept: {} is a file, not a folder; no statistics are \
         kept while it is there (move it away, or set defaults.statsFile to a path in a folder \
         or to false)",
        folder.display()
    )]
    FolderIsAFile {
        /// The statistics file.
        path: PathBuf,
        /// The file standing where a folder of `path` would be.
        folder: PathBuf,
    },
    /// The file is not a statistics file.
    #[error("statistics file {path} is not valid: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The path is a FIFO, a device, a folder or a socket, which a statistics file cannot
    /// be: reading a FIFO would wait for a writer for ever.
    #[error(
        "statistics file {path} is {kind}, not a regular file; no statistics are kept while it \
         is there (remove it, or set defaults.statsFile to a regular file's path or false)"
    )]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The file is of a later format than this toolmux knows: a newer toolmux wrote it.
    /// It is neither read nor written.
    #[error(
        "statistics file {path} is of version {version}, written by a newer toolmux than this \
         one (which knows version {known}); it is left as it is and nothing is counted in it: use \
         the newer toolmux, or set defaults.statsFile to another path",
        known = STATS_VERSION
    )]
    Newer {
        /// The file.
        path: PathBuf,
        /// The version it says it is of.
        version: String,
    },
    /// The file says it is of a version no toolmux writes (`0`, `-1`, `null`, `true`):
    /// neither this one's nor a later one's, whose versions are higher. It is neither read
    /// nor written.
    #[error(
        "statistics file {path} is of version {version}, which no toolmux writes (this one \
         writes version {known}, later ones higher); it is left as it is and nothing is counted \
         in it: remove it to count anew, or set defaults.statsFile to another path",
        known = STATS_VERSION
    )]
    UnknownVersion {
        /// The file.
        path: PathBuf,
        /// The version it says it is of, as written.
        version: String,
    },
    /// Another process held the file's lock for too long.
    #[error(
        "statistics file {path}: another toolmux process held its lock {lock} for {waited:?}; \
         if none is running, remove the lock file"
    )]
    Locked {
        /// The file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// How long this process waited.
        waited: Duration,
    },
}

/// The audit log could not be opened.
#[derive(Debug, thiserror::Error)]
#[error(
    "audit log {path} cannot be opened to append to (make it a writable regular file in a \
     folder that can be made, or set defaults.auditLog to another path)"
)]
pub struct AuditError {
    /// The audit log's path.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

/// How long [`Stats::save`] waits for another process to finish saving.
const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Statistics of all tools.
#[derive(Debug, Default)]
pub struct Stats {
    tools: RwLock<HashMap<Arc<str>, Arc<ToolStats>>>,
    /// Calls (ok, failed) by key holder (`key:HOLDER/…` runs), for `/metrics`; in this
    /// process only, not in the statistics file.
    holders: Mutex<HashMap<String, [u64; 2]>>,
    /// Per tool, the part of the counts that the statistics file already holds (loaded from
    /// it, or saved to it): a save adds only what is beyond. Locked for the whole of a save,
    /// so that two saves of one process do not add the same counts twice.
    saved: Mutex<HashMap<String, Counters>>,
}

/// Key holders counted at most; calls of others count under [`OTHER_HOLDERS`].
pub const HOLDERS_MAX: usize = 1000;

/// Where calls of holders past [`HOLDERS_MAX`] are counted.
pub const OTHER_HOLDERS: &str = "(other holders)";

/// The key holder a run belongs to: `alice` of `key:alice/…`, `team/ci` of
/// `key:team%2Fci/…` (see [`toolmux_core::holder_run_id`]), none for other runs.
pub fn holder_of(run: &str) -> Option<std::borrow::Cow<'_, str>> {
    toolmux_core::run_holder(run)
}

/// How many entries beyond one per tool calls to names that are not tools may add: calls
/// to invented names are worth seeing, but a model inventing names without end must not
/// grow the statistics (and their file, which keeps them across runs) without end. Beyond
/// this, such calls count under [`OTHER_UNKNOWN`].
pub const UNKNOWN_NAMES_MAX: usize = 100;

/// The entry that counts calls to unknown names once [`UNKNOWN_NAMES_MAX`] is reached, and
/// calls to unknown names longer than [`UNKNOWN_NAME_MAX_LEN`].
pub const OTHER_UNKNOWN: &str = "(other unknown tools)";

/// The longest unknown name given an entry of its own: no tool name is longer than 64
/// characters, and a client sending a megabyte of name must not have it kept.
pub const UNKNOWN_NAME_MAX_LEN: usize = 128;

impl Stats {
    /// The statistics of `name`, which is not one of the `tools` there are: an entry of its
    /// own while the statistics hold fewer than `tools` + [`UNKNOWN_NAMES_MAX`] entries and
    /// it is at most [`UNKNOWN_NAME_MAX_LEN`] bytes long, else [`OTHER_UNKNOWN`].
    pub fn of_unknown(&self, name: &str, tools: usize) -> Arc<ToolStats> {
        if name.len() > UNKNOWN_NAME_MAX_LEN {
            return self.of(OTHER_UNKNOWN);
        }
        let room = {
            let entries = self.tools.read().unwrap_or_else(|e| e.into_inner());
            if let Some(stats) = entries.get(name) {
                return stats.clone();
            }
            entries.len() < tools.saturating_add(UNKNOWN_NAMES_MAX)
        };
        self.of(if room { name } else { OTHER_UNKNOWN })
    }

    /// The statistics of `tool`, created on first use.
    pub fn of(&self, tool: &str) -> Arc<ToolStats> {
        if let Some(stats) = self.tools.read().unwrap_or_else(|e| e.into_inner()).get(tool) {
            return stats.clone();
        }
        let mut tools = self.tools.write().unwrap_or_else(|e| e.into_inner());
        tools.entry(Arc::from(tool)).or_default().clone()
    }

    /// A copy of everything.
    pub fn snapshot(&self) -> StatsSnapshot {
        let tools = self.tools.read().unwrap_or_else(|e| e.into_inner());
        StatsSnapshot {
            version: STATS_VERSION,
            tools: tools.iter().map(|(name, s)| (name.to_string(), s.snapshot())).collect(),
        }
    }

    /// Counts a call of key holder `holder`.
    pub fn record_holder(&self, holder: &str, ok: bool) {
        let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        let key = if holders.len() >= HOLDERS_MAX && !holders.contains_key(holder) {
            OTHER_HOLDERS
        } else {
            holder
        };
        let counts = match holders.get_mut(key) {
            Some(counts) => counts,
            None => holders.entry(key.to_owned()).or_default(),
        };
        counts[usize::from(!ok)] += 1;
    }

    /// Calls (ok, failed) by key holder, sorted by holder.
    pub fn holders(&self) -> Vec<(String, u64, u64)> {
        let holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<(String, u64, u64)> =
            holders.iter().map(|(h, [ok, failed])| (h.clone(), *ok, *failed)).collect();
        list.sort();
        list
    }

    /// [`StatsSnapshot::prometheus`] of this process's statistics, with the calls by key
    /// holder (`toolmux_holder_calls_total`) after them.
    pub fn prometheus(&self) -> String {
        use std::fmt::Write as _;
        let mut out = self.snapshot().prometheus();
        let holders = self.holders();
        if holders.is_empty() {
            return out;
        }
        out.push_str(
            "# HELP toolmux_holder_calls_total Tool calls, by key holder and outcome.\n\
             # TYPE toolmux_holder_calls_total counter\n",
        );
        for (holder, ok, failed) in holders {
            let holder = label_value(&holder);
            let _ = writeln!(
                out,
                "toolmux_holder_calls_total{{holder=\"{holder}\",outcome=\"ok\"}} {ok}"
            );
            let _ = writeln!(
                out,
                "toolmux_holder_calls_total{{holder=\"{holder}\",outcome=\"failed\"}} {failed}"
            );
        }
        out
    }

    /// Adds saved statistics to the current ones (as if this process had made those calls:
    /// [`Stats::save`] adds them to the file).
    pub fn merge(&self, snapshot: &StatsSnapshot) {
        for (tool, saved) in &snapshot.tools {
            self.of(tool).add(&Counters::from_snapshot(saved));
        }
    }

    fn counters(&self) -> HashMap<String, Counters> {
        let tools = self.tools.read().unwrap_or_else(|e| e.into_inner());
        tools.iter().map(|(name, s)| (name.to_string(), s.counters())).collect()
    }

    /// Adds what this process counted since its last save (or load) to the statistics in
    /// `path`, which other processes may write too: under an exclusive lock on
    /// `path` + `.lock`, waiting at most 10 seconds for it, the file is read, the counts
    /// added, and the result written to a temporary file of this process and renamed over
    /// it. The counts other processes added meanwhile join this process's own. A file that
    /// is not a statistics file is moved aside to `path` + `.bad`, not overwritten.
    pub fn save(&self, path: &Path) -> Result<(), StatsError> {
        let io = |source| StatsError::Io { path: path.to_owned(), source };
        let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| folder_is_a_file(path).unwrap_or(io(e)))?;
        }
        let _lock = FileLock::acquire(path)?;
        let (on_disk, moved_aside) = match read_snapshot(path) {
            Ok(snapshot) => (snapshot.unwrap_or_default(), false),
            Err(StatsError::Format { message, .. }) => {
                let bad = sibling(path, ".bad");
                std::fs::rename(path, &bad).map_err(io)?;
                tracing::warn!(
                    "statistics file {} is not valid ({message}): moved to {}, starting anew",
                    path.display(),
                    bad.display()
                );
                (StatsSnapshot::default(), true)
            }
            Err(e) => return Err(e),
        };
        let on_disk: HashMap<String, Counters> = on_disk
            .tools
            .iter()
            .map(|(name, s)| (name.clone(), Counters::from_snapshot(s)))
            .collect();
        let none = Counters::default();
        let now = self.counters();
        let mut merged = on_disk.clone();
        let mut changed = moved_aside;
        for (tool, current) in &now {
            let delta = current.since(saved.get(tool).unwrap_or(&none));
            if !delta.is_zero() {
                merged.entry(tool.clone()).or_default().add(&delta);
                changed = true;
            }
        }
        if changed {
            let snapshot = StatsSnapshot {
                version: STATS_VERSION,
                tools: merged.iter().map(|(name, c)| (name.clone(), c.to_snapshot())).collect(),
            };
            let json = serde_json::to_vec_pretty(&snapshot).map_err(|e| StatsError::Format {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
            toolmux_core::replace_file(path, &json, toolmux_core::Replace::default())
                .map_err(io)?;
        }
        // What other processes saved since this one last looked joins its counts; the file
        // now holds all of them.
        let mut now = now;
        for (tool, disk) in &on_disk {
            let others = disk.since(saved.get(tool).unwrap_or(&none));
            if !others.is_zero() {
                self.of(tool).add(&others);
                now.entry(tool.clone()).or_default().add(&others);
            }
        }
        *saved = now;
        Ok(())
    }

    /// Reads the statistics in `path` and merges them in; they count as saved already. A
    /// missing file is not an error.
    pub fn load(&self, path: &Path) -> Result<(), StatsError> {
        let Some(snapshot) = read_snapshot(path)? else {
            return Ok(());
        };
        let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        for (tool, stats) in &snapshot.tools {
            let counters = Counters::from_snapshot(stats);
            self.of(tool).add(&counters);
            saved.entry(tool.clone()).or_default().add(&counters);
        }
        Ok(())
    }
}

/// The largest statistics file read: one of thousands of tools is a few megabytes, so a
/// bigger one is not a statistics file (and is moved aside as any invalid one).
const STATS_MAX_BYTES: u64 = 128 << 20;

/// The statistics in `path`; `None` when there is no such file.
fn read_snapshot(path: &Path) -> Result<Option<StatsSnapshot>, StatsError> {
    // A link is refused, not followed: the file is replaced by renaming over it, so one
    // followed to read would be the file read but not the one written.
    let bytes = match crate::files::read_regular(path, STATS_MAX_BYTES) {
        Ok(bytes) => bytes,
        Err(Opened::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(Opened::NotRegular(kind)) => {
            let kind = kind.unwrap_or("of a type no word names");
            return Err(StatsError::NotRegular { path: path.to_owned(), kind });
        }
        Err(Opened::TooBig { .. }) => {
            return Err(StatsError::Format {
                path: path.to_owned(),
                message: format!(
                    "over {} MiB, too big for a statistics file",
                    STATS_MAX_BYTES >> 20
                ),
            });
        }
        Err(e) => {
            let e = e.into_io();
            return Err(folder_is_a_file(path)
                .unwrap_or(StatsError::Io { path: path.to_owned(), source: e }));
        }
    };
    let format =
        |e: serde_json::Error| StatsError::Format { path: path.to_owned(), message: e.to_string() };
    // The version first: a later format may keep its counts in another shape, which must
    // be neither read as none nor moved aside as damaged. Any version but exactly the
    // integer this toolmux writes ("2", 2.0, a number beyond u64) is another's format, or,
    // below 1 or no number or string (0, -1, null, true), no toolmux's.
    #[derive(Deserialize)]
    struct Version {
        /// `None` when there is no `version`, `Some(Null)` for `"version": null`.
        #[serde(default, deserialize_with = "present")]
        version: Option<serde_json::Value>,
    }
    fn present<'de, D: serde::Deserializer<'de>>(
        value: D,
    ) -> Result<Option<serde_json::Value>, D::Error> {
        serde_json::Value::deserialize(value).map(Some)
    }
    match serde_json::from_slice::<Version>(&bytes) {
        Ok(Version { version: Some(version) })
            if version.as_u64() == Some(u64::from(STATS_VERSION)) => {}
        Ok(Version { version: Some(version) })
            if version.as_f64().is_some_and(|v| v > 1.0) || version.is_string() =>
        {
            return Err(StatsError::Newer { path: path.to_owned(), version: version.to_string() });
        }
        Ok(Version { version: Some(version) }) => {
            let version = version.to_string();
            return Err(StatsError::UnknownVersion { path: path.to_owned(), version });
        }
        // Every statistics file toolmux wrote has had a version, since the first; one
        // without was made or edited by hand. Its counts are read when they are of the
        // shape this toolmux writes (the next save adds the version), else it is damaged.
        Ok(Version { version: None }) => {
            let mut value: serde_json::Value = serde_json::from_slice(&bytes).map_err(format)?;
            if let Some(object) = value.as_object_mut() {
                object.insert("version".into(), STATS_VERSION.into());
            }
            return serde_json::from_value(value).map(Some).map_err(|e| StatsError::Format {
                path: path.to_owned(),
                message: format!(
                    "it has no `version`, which every statistics file toolmux writes has, and \
                     is not of version {STATS_VERSION}'s shape either: {e}"
                ),
            });
        }
        // Not JSON, or no object: said as the whole file's reading says it.
        Err(_) => {}
    }
    serde_json::from_slice(&bytes).map(Some).map_err(format)
}

/// The version of the statistics files this toolmux writes and reads.
const STATS_VERSION: u32 = 1;

/// Why [`open_regular`] gave no file: opening failed, or the path is no regular file
/// (a FIFO, a device, ...), which `into_io` words as `it is a FIFO (named pipe), not a
/// regular file`.
pub(crate) type Opened = toolmux_core::regular::RegularError;

/// Opens `path` as `options` say, refusing anything but a regular file, without waiting
/// (`O_NONBLOCK`): opening a FIFO waits for its other end, for ever if none comes. A
/// symbolic link is refused too: the lock file and the audit log are never written
/// through one (a link to nothing would even be followed to create what it names).
pub(crate) use crate::files::open_regular;

/// `path` with `suffix` added to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// [`StatsError::FolderIsAFile`] when a folder `path` would lie in is a file (or anything
/// else but a folder), the nearest such one named.
fn folder_is_a_file(path: &Path) -> Option<StatsError> {
    let folders = path.ancestors().skip(1).filter(|f| !f.as_os_str().is_empty());
    let blocking = folders.filter_map(|f| std::fs::metadata(f).ok().map(|m| (f, m))).next()?;
    (!blocking.1.is_dir())
        .then(|| StatsError::FolderIsAFile { path: path.to_owned(), folder: blocking.0.to_owned() })
}

/// An exclusive advisory lock on the file beside a statistics file, released when dropped.
/// The lock file stays: removing it would let a process lock a file another has just
/// unlinked.
#[derive(Debug)]
struct FileLock {
    file: std::fs::File,
}

impl FileLock {
    fn acquire(path: &Path) -> Result<FileLock, StatsError> {
        let lock = sibling(path, ".lock");
        let mut options = std::fs::OpenOptions::new();
        options.create(true).truncate(false).write(true);
        let file = open_regular(&lock, &mut options)
            .map_err(|e| StatsError::Io { path: lock.clone(), source: e.into_io() })?;
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(FileLock { file }),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(StatsError::Io { path: lock, source });
                }
            }
            let waited = started.elapsed();
            if waited >= LOCK_TIMEOUT {
                return Err(StatsError::Locked { path: path.to_owned(), lock, waited });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// The audit log's writer writes what it holds once it holds this many bytes.
const AUDIT_BATCH_BYTES: usize = 64 << 10;

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When the call ended, milliseconds since the Unix epoch.
    pub ts_ms: u64,
    /// The run.
    pub run: String,
    /// The tool.
    pub tool: String,
    /// The caller's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// SHA-256 of the canonical arguments, hex.
    pub arguments_sha256: String,
    /// SHA-256 of the output text (or of the error message), hex.
    pub result_sha256: String,
    /// `ok` or `failed:<code>`.
    pub outcome: String,
    /// Wall time.
    pub latency_ms: u64,
}

/// SHA-256 of `data`, as lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0'));
    }
    out
}

/// The audit log: records go over a channel to a writer thread, so the calling task never
/// waits on the disk. Lines are flushed whenever the channel runs empty.
#[derive(Debug)]
pub struct AuditLog {
    sender: Mutex<Option<mpsc::Sender<AuditRecord>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl AuditLog {
    /// Opens (appends to) `path`, creating its directory. Anything but a regular file (a
    /// FIFO, whose opening would wait for a reader, a device) is refused.
    pub fn open(path: &Path) -> Result<AuditLog, AuditError> {
        let io = |source| AuditError { path: path.to_owned(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| match std::fs::metadata(dir) {
                // Said for what it is, where the OS says only "File exists".
                Ok(meta) if !meta.is_dir() => io(std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    format!("{} is not a folder", dir.display()),
                )),
                _ => io(e),
            })?;
        }
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true);
        let file = open_regular(path, &mut options).map_err(|e| io(e.into_io()))?;
        AuditLog::to(file).map_err(io)
    }

    /// The audit log writing to `sink` (an appending file).
    fn to(sink: impl std::io::Write + Send + 'static) -> std::io::Result<AuditLog> {
        let (sender, receiver) = mpsc::channel::<AuditRecord>();
        let writer = std::thread::Builder::new().name("toolmux-audit".into()).spawn(move || {
            // Whole lines only, each batch in one write: the file is opened to append,
            // so a write lands whole at its end, and another writer's lines (another
            // process, or another orchestrator of this one) never land inside one. A
            // `BufWriter` wrote where its buffer filled, a line's newline apart from it.
            let mut sink = sink;
            let mut batch = Vec::new();
            while let Ok(record) = receiver.recv() {
                let mut next = Some(record);
                while let Some(record) = next {
                    let mark = batch.len();
                    if serde_json::to_writer(&mut batch, &record).is_ok() {
                        batch.push(b'\n');
                    } else {
                        batch.truncate(mark);
                    }
                    // Past a bound, what is held goes out before more is read.
                    next = if batch.len() < AUDIT_BATCH_BYTES {
                        receiver.try_recv().ok()
                    } else {
                        None
                    };
                }
                if sink.write_all(&batch).and_then(|()| sink.flush()).is_err() {
                    tracing::warn!("audit log: write failed");
                }
                batch.clear();
                batch.shrink_to(AUDIT_BATCH_BYTES);
            }
        })?;
        Ok(AuditLog { sender: Mutex::new(Some(sender)), writer: Mutex::new(Some(writer)) })
    }

    /// Queues one record.
    pub fn write(&self, record: AuditRecord) {
        if let Some(sender) = self.sender.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            let _ = sender.send(record);
        }
    }

    /// Writes everything queued and stops the writer.
    pub fn close(&self) {
        self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(writer) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = writer.join();
        }
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmux_test_support::blocking::{fifo, within_10s};

    #[test]
    fn buckets_are_monotonic_and_close() {
        let mut last = 0;
        for v in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 1_000_000, 60_000_000] {
            let b = bucket_of(v);
            assert!(b >= last);
            last = b;
            let mid = bucket_midpoint(b) as f64;
            assert!((mid - v as f64).abs() <= (v as f64) * 0.2 + 1.0, "{v} -> {mid}");
        }
    }

    #[test]
    fn calls_are_counted_by_key_holder_within_a_bound() {
        assert_eq!(holder_of("key:alice/run-1").as_deref(), Some("alice"));
        assert_eq!(holder_of("key:oauth:sub-9/client:x").as_deref(), Some("oauth:sub-9"));
        assert_eq!(holder_of("key:bob").as_deref(), Some("bob"));
        assert_eq!(holder_of("key:team%2Fci/run-1").as_deref(), Some("team/ci"));
        assert_eq!(holder_of("run-1"), None);
        let stats = Stats::default();
        stats.record_holder("alice", true);
        stats.record_holder("alice", false);
        stats.record_holder("bob", true);
        assert_eq!(stats.holders(), [("alice".to_owned(), 1, 1), ("bob".to_owned(), 1, 0)]);
        for i in 0..HOLDERS_MAX {
            stats.record_holder(&format!("h{i}"), true);
        }
        assert_eq!(stats.holders().len(), HOLDERS_MAX + 1, "the rest under one entry");
        assert!(stats.holders().iter().any(|(h, ok, _)| h == OTHER_HOLDERS && *ok == 2));
        let text = stats.prometheus();
        assert!(
            text.contains("toolmux_holder_calls_total{holder=\"alice\",outcome=\"failed\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn prometheus_text_counts_each_outcome_and_escapes_labels() {
        let stats = Stats::default();
        stats.of("fs__read").record(true, 2_000);
        stats.of("fs__read").record(false, 4_000);
        stats.of("odd \"name\"\\x").record(true, 1_000);
        let text = stats.snapshot().prometheus();
        assert!(text.contains("# TYPE toolmux_tool_calls_total counter\n"), "{text}");
        assert!(text.contains("toolmux_tool_calls_total{tool=\"fs__read\",outcome=\"ok\"} 1\n"));
        assert!(
            text.contains("toolmux_tool_calls_total{tool=\"fs__read\",outcome=\"failed\"} 1\n")
        );
        assert!(text.contains("toolmux_tool_latency_seconds_count{tool=\"fs__read\"} 2\n"));
        assert!(text.contains("toolmux_tool_latency_seconds_sum{tool=\"fs__read\"} 0.006\n"));
        assert!(text.contains(r#"tool="odd \"name\"\\x""#), "{text}");
        // Every sample line is `name{labels} value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').expect("a value");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }

    /// Calls that all fall in one bucket read as their mean, not the bucket's middle.
    #[test]
    fn one_call_reads_as_itself() {
        let stats = Stats::default();
        stats.of("a__slow").record(false, 3_002_000);
        let snap = stats.snapshot();
        let s = &snap.tools["a__slow"];
        assert_eq!((s.p50_ms, s.p95_ms), (3002.0, 3002.0));
    }

    #[test]
    fn percentiles_save_and_load() {
        let stats = Stats::default();
        let t = stats.of("a__b");
        for ms in 1..=100u64 {
            t.record(ms != 100, ms * 1000);
        }
        let snap = stats.snapshot();
        let s = &snap.tools["a__b"];
        assert_eq!((s.count, s.ok, s.failed), (100, 99, 1));
        assert!((s.p50_ms - 50.0).abs() < 8.0, "{}", s.p50_ms);
        assert!((s.p95_ms - 95.0).abs() < 15.0, "{}", s.p95_ms);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        stats.save(&path).unwrap();
        let loaded = Stats::default();
        loaded.load(&path).unwrap();
        assert_eq!(loaded.snapshot(), snap);
        loaded.load(&dir.path().join("missing.json")).unwrap();
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(loaded.load(&path), Err(StatsError::Format { .. })));
    }

    fn saved(path: &Path) -> StatsSnapshot {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn saves_of_two_processes_add_up_and_count_each_call_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        let (one, two) = (Stats::default(), Stats::default());
        for _ in 0..3 {
            one.of("a__b").record(true, 1_000);
        }
        two.of("a__b").record(false, 3_000);
        two.of("c__d").record(true, 5_000);
        one.save(&path).unwrap();
        two.save(&path).unwrap();
        let file = saved(&path);
        assert_eq!(file.tools["a__b"].count, 4);
        assert_eq!((file.tools["a__b"].ok, file.tools["a__b"].failed), (3, 1));
        assert_eq!(file.tools["a__b"].total_latency_ms, 6.0);
        assert_eq!(file.tools["c__d"].count, 1);
        // Saving again adds only what is new, and brings in what the other one saved.
        one.of("a__b").record(true, 1_000);
        one.save(&path).unwrap();
        one.save(&path).unwrap();
        assert_eq!(saved(&path).tools["a__b"].count, 5);
        assert_eq!(one.snapshot().tools["c__d"].count, 1);
        assert_eq!(one.snapshot(), saved(&path));
        two.save(&path).unwrap();
        assert_eq!(saved(&path).tools["a__b"].count, 5);
        assert_eq!(two.snapshot(), saved(&path));
    }

    #[test]
    fn loaded_counts_are_not_saved_twice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/stats.json");
        let first = Stats::default();
        first.of("a__b").record(true, 1_000);
        first.of("a__b").record(true, 1_000);
        first.save(&path).unwrap();
        let second = Stats::default();
        second.load(&path).unwrap();
        second.of("a__b").record(true, 1_000);
        second.save(&path).unwrap();
        assert_eq!(saved(&path).tools["a__b"].count, 3);
        assert_eq!(second.snapshot().tools["a__b"].count, 3);
    }

    #[test]
    fn merged_histograms_give_the_percentiles_of_all_calls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        let (fast, slow, all) = (Stats::default(), Stats::default(), Stats::default());
        for ms in 1..=100u64 {
            let stats = if ms <= 50 { &fast } else { &slow };
            stats.of("a__b").record(true, ms * 1000);
            all.of("a__b").record(true, ms * 1000);
        }
        fast.save(&path).unwrap();
        slow.save(&path).unwrap();
        let merged = &saved(&path).tools["a__b"];
        let expected = &all.snapshot().tools["a__b"];
        assert_eq!(merged, expected);
        assert!((merged.p95_ms - 95.0).abs() < 15.0, "{}", merged.p95_ms);
    }

    #[test]
    fn the_average_of_successful_calls_leaves_failures_out() {
        let stats = Stats::default();
        stats.of("a__b").record(true, 10_000);
        stats.of("a__b").record(true, 20_000);
        stats.of("a__b").record(false, 60_000_000);
        let s = &stats.snapshot().tools["a__b"];
        assert_eq!(s.avg_ok_ms, 15.0);
        assert_eq!(s.ok_latency_ms, Some(30.0));
        assert_eq!(s.total_latency_ms, 60_030.0);
    }

    #[test]
    fn a_file_from_before_success_times_were_kept_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        let old = r#"{"version":1,"tools":{"a__b":{"count":2,"ok":2,"failed":0,
            "totalLatencyMs":30.0,"p50Ms":10.0,"p95Ms":20.0,"histogram":{"53":1,"57":1}}}}"#;
        std::fs::write(&path, old).unwrap();
        let stats = Stats::default();
        stats.load(&path).unwrap();
        assert_eq!(stats.snapshot().tools["a__b"].avg_ok_ms, 15.0);
    }

    #[test]
    fn a_fifo_as_statistics_file_is_refused_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = fifo(dir.path(), "stats.json");
        let (loaded, saved) = within_10s("loading and saving", {
            let path = path.clone();
            move || {
                let stats = Stats::default();
                let loaded = stats.load(&path);
                stats.of("a__b").record(true, 1_000);
                (loaded, stats.save(&path))
            }
        });
        for result in [loaded, saved] {
            let Err(e @ StatsError::NotRegular { .. }) = result else {
                panic!("a FIFO is not a statistics file: {result:?}")
            };
            let message = e.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains("a FIFO (named pipe), not a regular file"), "{message}");
        }
        use std::os::unix::fs::FileTypeExt as _;
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_fifo(), "left as it is");
        assert!(!dir.path().join("stats.json.bad").exists(), "not moved aside");
    }

    /// A statistics file whose folder is a file (an `outputDir` that is one) is named as
    /// such, where the system's words were "Not a directory" to read and "File exists" to
    /// save, which said nothing of the folder.
    #[test]
    fn a_file_in_place_of_the_statistics_folder_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        std::fs::write(&out, "x").unwrap();
        for path in [out.join("stats.json"), out.join("deeper/stats.json")] {
            let stats = Stats::default();
            let loaded = stats.load(&path);
            stats.of("a__b").record(true, 1_000);
            for result in [loaded, stats.save(&path)] {
                let Err(e @ StatsError::FolderIsAFile { .. }) = result else {
                    panic!("the folder is a file: {result:?}")
                };
                let message = e.to_string();
                assert!(
                    message.contains(&format!("{} is a file, not a folder", out.display())),
                    "{message}"
                );
                assert!(message.contains("defaults.statsFile"), "{message}");
            }
        }
        assert_eq!(std::fs::read(&out).unwrap(), b"x", "left as it is");
    }

    #[test]
    fn a_fifo_as_the_lock_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        fifo(dir.path(), "stats.json.lock");
        let saved = within_10s("saving", {
            let path = path.clone();
            move || {
                let stats = Stats::default();
                stats.of("a__b").record(true, 1_000);
                stats.save(&path)
            }
        });
        let Err(StatsError::Io { path: lock, source }) = saved else {
            panic!("the lock cannot be taken: {saved:?}")
        };
        assert_eq!(lock, dir.path().join("stats.json.lock"));
        assert_eq!(source.to_string(), "it is a FIFO (named pipe), not a regular file");
        assert!(!path.exists());
    }

    /// A file elsewhere, with statistics of its own, and a link to it planted in place of
    /// the statistics file: neither read through nor written through, and left a link.
    #[test]
    fn a_link_as_statistics_file_is_refused_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere.json");
        let theirs = r#"{"version":1,"tools":{"x__y":{"count":1,"ok":1,"failed":0,
            "totalLatencyMs":1.0,"p50Ms":1.0,"p95Ms":1.0,"histogram":{"40":1}}}}"#;
        std::fs::write(&elsewhere, theirs).unwrap();
        let path = dir.path().join("stats.json");
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let stats = Stats::default();
        let loaded = stats.load(&path);
        stats.of("a__b").record(true, 1_000);
        let saved = stats.save(&path);
        for result in [loaded, saved] {
            let message = result.map_err(|e| e.to_string()).expect_err("a link is refused");
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains("is a symbolic link, not a regular file"), "{message}");
        }
        assert!(!stats.snapshot().tools.contains_key("x__y"), "not read through");
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), theirs, "not written through");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_symlink(), "left as it is");
        assert!(!dir.path().join("stats.json.bad").exists(), "not moved aside");
    }

    /// A link to nothing in place of the lock file is not followed to create what it
    /// names.
    #[test]
    fn a_link_as_the_lock_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        let made = dir.path().join("made");
        std::os::unix::fs::symlink(&made, dir.path().join("stats.json.lock")).unwrap();
        let stats = Stats::default();
        stats.of("a__b").record(true, 1_000);
        let saved = stats.save(&path);
        let message = saved
            .map_err(|e| format!("{e}: {}", std::error::Error::source(&e).unwrap()))
            .unwrap_err();
        assert!(message.contains("stats.json.lock"), "{message}");
        assert!(message.ends_with("it is a symbolic link, not a regular file"), "{message}");
        assert!(!made.exists(), "the link's target was made");
        assert!(!path.exists());
    }

    /// A file a later toolmux wrote (another format, `version` 9) is an error that says
    /// so, loading and saving, and is left byte for byte as it was: not read as no
    /// statistics, not replaced, not moved aside as damaged.
    #[test]
    fn a_statistics_file_of_a_newer_version_is_refused_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        let newer = r#"{"version": 9, "tools": {}, "calls": {"a__b": [[1, 2, 3]]}}"#;
        std::fs::write(&path, newer).unwrap();
        let stats = Stats::default();
        let loaded = stats.load(&path);
        stats.of("a__b").record(true, 1_000);
        let saved = stats.save(&path);
        for result in [loaded, saved] {
            let message = result.map_err(|e| e.to_string()).expect_err("a newer file is refused");
            expect_test::expect![[r#"
                statistics file DIR/stats.json is of version 9, written by a newer toolmux than this one (which knows version 1); it is left as it is and nothing is counted in it: use the newer toolmux, or set defaults.statsFile to another path"#]]
            .assert_eq(&message.replace(&dir.path().display().to_string(), "DIR"));
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), newer);
        assert!(!dir.path().join("stats.json.bad").exists(), "not moved aside");
    }

    /// Loads, counts and saves with a statistics file of `version`: both the load and the
    /// save are refused, and the file is left as written, not moved aside. The errors, and
    /// the file's folder (kept while they are looked at).
    fn refused_both_ways(version: &str) -> ([StatsError; 2], tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        let written = format!(r#"{{"version": {version}, "tools": {{}}}}"#);
        std::fs::write(&path, &written).unwrap();
        let stats = Stats::default();
        let loaded = stats.load(&path);
        stats.of("a__b").record(true, 1_000);
        let saved = stats.save(&path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), written, "version {version}");
        assert!(!dir.path().join("stats.json.bad").exists(), "version {version} moved aside");
        let refused = |result: Result<(), StatsError>| match result {
            Err(e) => e,
            Ok(()) => panic!("version {version} is refused"),
        };
        ([refused(loaded), refused(saved)], dir)
    }

    /// A version written as a string, a float or a number beyond u64 is a newer toolmux's
    /// file too: refused, left as it was, never moved aside as damaged.
    #[test]
    fn a_statistics_file_of_an_unusual_version_is_refused_and_left_as_it_is() {
        for version in [r#""2""#, "2.0", "18446744073709551616"] {
            let (errors, _dir) = refused_both_ways(version);
            for e in errors {
                // A number beyond u64 is shown as serde_json reads it, 1.8446744073709552e19.
                assert!(matches!(&e, StatsError::Newer { .. }), "version {version}: {e}");
            }
        }
    }

    /// A version below 1, or no number or string (`0`, `-1`, `null`, `true`), is no toolmux's:
    /// refused saying so, not said to be a newer toolmux's, and left as it was.
    #[test]
    fn a_statistics_file_of_a_version_no_toolmux_writes_is_refused_and_left_as_it_is() {
        for version in ["0", "-1", "0.5", "null", "true"] {
            let (errors, dir) = refused_both_ways(version);
            for e in errors {
                assert!(matches!(&e, StatsError::UnknownVersion { .. }), "version {version}: {e}");
                if version == "0" {
                    expect_test::expect![[r#"
                        statistics file DIR/stats.json is of version 0, which no toolmux writes (this one writes version 1, later ones higher); it is left as it is and nothing is counted in it: remove it to count anew, or set defaults.statsFile to another path"#]]
                    .assert_eq(&e.to_string().replace(&dir.path().display().to_string(), "DIR"));
                }
            }
        }
    }

    /// No toolmux wrote a statistics file without a version: one of the current shape
    /// without it (made or edited by hand) has its counts read, and the next save adds the
    /// version; one of another shape is damaged, and the message says the version is missing.
    #[test]
    fn a_statistics_file_without_a_version_is_read_when_of_the_current_shape() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        let mine = r#"{"tools":{"a__b":{"count":2,"ok":2,"failed":0,
            "totalLatencyMs":30.0,"p50Ms":10.0,"p95Ms":20.0,"histogram":{"53":1,"57":1}}}}"#;
        std::fs::write(&path, mine).unwrap();
        let stats = Stats::default();
        stats.load(&path).unwrap();
        assert_eq!(stats.snapshot().tools["a__b"].count, 2);
        stats.of("a__b").record(true, 1_000);
        stats.save(&path).unwrap();
        let saved: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!((&saved["version"], &saved["tools"]["a__b"]["count"]), (&1.into(), &3.into()));
        assert!(!dir.path().join("stats.json.bad").exists());
        // Another shape without a version is damaged, moved aside when saving.
        std::fs::write(&path, r#"{"calls": {"a__b": [[1, 2, 3]]}}"#).unwrap();
        let Err(e) = Stats::default().load(&path) else { panic!("another shape is refused") };
        expect_test::expect![[r#"
            statistics file DIR/stats.json is not valid: it has no `version`, which every statistics file toolmux writes has, and is not of version 1's shape either: missing field `tools`"#]]
        .assert_eq(&e.to_string().replace(&dir.path().display().to_string(), "DIR"));
        Stats::default().save(&path).unwrap();
        assert!(dir.path().join("stats.json.bad").exists());
    }

    #[test]
    fn a_link_as_audit_log_is_refused_not_appended_through() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("profile");
        std::fs::write(&elsewhere, "PATH=/usr/bin\n").unwrap();
        let path = dir.path().join("audit.jsonl");
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let opened = AuditLog::open(&path).map(|log| {
            log.write(record(1, "a__b"));
            log.close();
        });
        let Err(e) = opened else { panic!("a link is no audit log") };
        assert_eq!(e.path, path);
        assert_eq!(e.source.to_string(), "it is a symbolic link, not a regular file");
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "PATH=/usr/bin\n");
        // Nor is a link to nothing followed to make the file it names.
        let dangling = dir.path().join("dangling.jsonl");
        std::os::unix::fs::symlink(dir.path().join("made"), &dangling).unwrap();
        assert!(AuditLog::open(&dangling).is_err());
        assert!(!dir.path().join("made").exists());
    }

    #[test]
    fn a_statistics_file_over_the_cap_is_not_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        // Sparse: no disk is spent on it.
        std::fs::File::create(&path).unwrap().set_len(STATS_MAX_BYTES + 1).unwrap();
        let Err(StatsError::Format { message, .. }) = Stats::default().load(&path) else {
            panic!("too big a file is not a statistics file")
        };
        assert_eq!(message, "over 128 MiB, too big for a statistics file");
    }

    #[test]
    fn an_audit_log_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = fifo(dir.path(), "audit.jsonl");
        let opened = within_10s("opening the audit log", move || AuditLog::open(&pipe).map(drop));
        let Err(e) = opened else { panic!("a FIFO is no audit log") };
        assert_eq!(e.path, dir.path().join("audit.jsonl"));
        assert!(e.to_string().contains(&e.path.display().to_string()), "{e}");
        assert_eq!(e.source.to_string(), "it is a FIFO (named pipe), not a regular file");
        let Err(e) = AuditLog::open(Path::new("/dev/null")) else {
            panic!("a device is no audit log")
        };
        assert_eq!(e.source.to_string(), "it is a character device, not a regular file");
    }

    #[test]
    fn an_audit_log_that_cannot_be_made_says_why() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file"), "").unwrap();
        let path = dir.path().join("file").join("audit.jsonl");
        let Err(e) = AuditLog::open(&path) else { panic!("its folder is a file") };
        assert_eq!(e.path, path);
        assert_eq!(
            e.source.to_string(),
            format!("{} is not a folder", path.parent().unwrap().display())
        );
        expect_test::expect![[r#"
            audit log DIR/file/audit.jsonl cannot be opened to append to (make it a writable regular file in a folder that can be made, or set defaults.auditLog to another path)"#]]
        .assert_eq(&e.to_string().replace(&dir.path().display().to_string(), "DIR"));
    }

    #[test]
    fn an_invalid_file_is_moved_aside_when_saving() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        std::fs::write(&path, "{\"version\": 1, \"tools\": {").unwrap();
        let stats = Stats::default();
        let Err(StatsError::Format { message, .. }) = stats.load(&path) else {
            panic!("an invalid file is a format error")
        };
        assert!(message.contains("EOF"), "{message}");
        stats.of("a__b").record(true, 1_000);
        stats.save(&path).unwrap();
        assert_eq!(saved(&path).tools["a__b"].count, 1);
        let bad = std::fs::read_to_string(dir.path().join("stats.json.bad")).unwrap();
        assert_eq!(bad, "{\"version\": 1, \"tools\": {");
    }

    #[test]
    fn concurrent_saves_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats.json");
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    let stats = Stats::default();
                    for _ in 0..5 {
                        stats.of("a__b").record(true, 1_000);
                        stats.save(&path).unwrap();
                    }
                });
            }
        });
        assert_eq!(saved(&path).tools["a__b"].count, 40);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// A successful call of `tool` at `ts_ms`, as the audit log keeps it.
    fn record(ts_ms: u64, tool: &str) -> AuditRecord {
        AuditRecord {
            ts_ms,
            run: "r".into(),
            tool: tool.into(),
            call_id: None,
            arguments_sha256: sha256_hex(b"{}"),
            result_sha256: sha256_hex(b"x"),
            outcome: "ok".into(),
            latency_ms: 1,
        }
    }

    #[test]
    fn audit_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        for i in 0..3 {
            log.write(record(i, "a__b"));
        }
        log.close();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"));
    }

    /// Writes as they reach the file.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl std::io::Write for Writes {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push(buf.to_vec());
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Every write holds whole lines: another process (or another orchestrator of this
    /// one, as `serve --watch` makes) appending to the same file between two writes never
    /// lands inside a line. A line longer than a buffer (a long run id or invented tool
    /// name) went out without its newline, which followed in a later write.
    #[test]
    fn audit_lines_are_written_whole() {
        let writes = Writes::default();
        let log = AuditLog::to(writes.clone()).unwrap();
        for (i, tool) in
            ["a__b".to_owned(), "x".repeat(20_000), "y".repeat(2_700)].iter().enumerate()
        {
            for _ in 0..5 {
                log.write(record(i as u64, tool));
            }
        }
        log.close();
        let writes = writes.0.lock().unwrap();
        let mut lines = 0;
        for write in writes.iter() {
            assert_eq!(write.last(), Some(&b'\n'), "a write ends inside a line");
            for line in write.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                serde_json::from_slice::<AuditRecord>(line).unwrap();
                lines += 1;
            }
        }
        assert_eq!(lines, 15);
    }
}
