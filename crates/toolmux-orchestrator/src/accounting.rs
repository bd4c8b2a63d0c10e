//! The accounting stage: a record per call, per-tool statistics (counts and latency
//! percentiles) that can be saved and loaded, and the JSON-lines audit log.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
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
    histogram: Box<[AtomicU64]>,
}

impl Default for ToolStats {
    fn default() -> Self {
        ToolStats {
            count: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            total_micros: AtomicU64::new(0),
            histogram: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ToolStats {
    /// Records one call.
    pub fn record(&self, ok: bool, micros: u64) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if ok { &self.ok } else { &self.failed }.fetch_add(1, Ordering::Relaxed);
        self.total_micros.fetch_add(micros, Ordering::Relaxed);
        self.histogram[bucket_of(micros)].fetch_add(1, Ordering::Relaxed);
    }

    fn percentile_micros(&self, counts: &[u64], p: f64) -> u64 {
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * p).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_midpoint(i);
            }
        }
        0
    }

    /// A serializable copy.
    pub fn snapshot(&self) -> ToolStatsSnapshot {
        let counts: Vec<u64> = self.histogram.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let micros_to_ms = |m: u64| m as f64 / 1000.0;
        ToolStatsSnapshot {
            count: self.count.load(Ordering::Relaxed),
            ok: self.ok.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            total_latency_ms: micros_to_ms(self.total_micros.load(Ordering::Relaxed)),
            p50_ms: micros_to_ms(self.percentile_micros(&counts, 0.50)),
            p95_ms: micros_to_ms(self.percentile_micros(&counts, 0.95)),
            histogram: counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, c)| (i.to_string(), *c))
                .collect(),
        }
    }

    fn merge(&self, snapshot: &ToolStatsSnapshot) {
        self.count.fetch_add(snapshot.count, Ordering::Relaxed);
        self.ok.fetch_add(snapshot.ok, Ordering::Relaxed);
        self.failed.fetch_add(snapshot.failed, Ordering::Relaxed);
        self.total_micros.fetch_add((snapshot.total_latency_ms * 1000.0) as u64, Ordering::Relaxed);
        for (index, count) in &snapshot.histogram {
            if let Some(bucket) = index.parse::<usize>().ok().and_then(|i| self.histogram.get(i)) {
                bucket.fetch_add(*count, Ordering::Relaxed);
            }
        }
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
    /// The file is not a statistics file.
    #[error("statistics file {path} is not valid: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Statistics of all tools.
#[derive(Debug, Default)]
pub struct Stats {
    tools: RwLock<HashMap<Arc<str>, Arc<ToolStats>>>,
}

/// How many entries beyond one per tool calls to names that are not tools may add: calls
/// to invented names are worth seeing, but a model inventing names without end must not
/// grow the statistics (and their file, which keeps them across runs) without end. Beyond
/// this, such calls count under [`OTHER_UNKNOWN`].
pub const UNKNOWN_NAMES_MAX: usize = 100;

/// The entry that counts calls to unknown names once [`UNKNOWN_NAMES_MAX`] is reached.
pub const OTHER_UNKNOWN: &str = "(other unknown tools)";

impl Stats {
    /// The statistics of `name`, which is not one of the `tools` there are: an entry of its
    /// own while the statistics hold fewer than `tools` + [`UNKNOWN_NAMES_MAX`] entries,
    /// else [`OTHER_UNKNOWN`].
    pub fn of_unknown(&self, name: &str, tools: usize) -> Arc<ToolStats> {
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
            version: 1,
            tools: tools.iter().map(|(name, s)| (name.to_string(), s.snapshot())).collect(),
        }
    }

    /// Adds saved statistics to the current ones.
    pub fn merge(&self, snapshot: &StatsSnapshot) {
        for (tool, saved) in &snapshot.tools {
            self.of(tool).merge(saved);
        }
    }

    /// Writes a snapshot to `path` atomically (temporary file, then rename).
    pub fn save(&self, path: &Path) -> Result<(), StatsError> {
        let io = |source| StatsError::Io { path: path.to_owned(), source };
        let json = serde_json::to_vec_pretty(&self.snapshot())
            .map_err(|e| StatsError::Format { path: path.to_owned(), message: e.to_string() })?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, json).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads a snapshot from `path` and merges it in. A missing file is not an error.
    pub fn load(&self, path: &Path) -> Result<(), StatsError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(StatsError::Io { path: path.to_owned(), source }),
        };
        let snapshot: StatsSnapshot = serde_json::from_slice(&bytes)
            .map_err(|e| StatsError::Format { path: path.to_owned(), message: e.to_string() })?;
        self.merge(&snapshot);
        Ok(())
    }
}

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
    /// Opens (appends to) `path`, creating its directory.
    pub fn open(path: &Path) -> Result<AuditLog, StatsError> {
        let io = |source| StatsError::Io { path: path.to_owned(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
        let (sender, receiver) = mpsc::channel::<AuditRecord>();
        let writer = std::thread::Builder::new()
            .name("toolmux-audit".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::new(file);
                while let Ok(record) = receiver.recv() {
                    let mut next = Some(record);
                    while let Some(record) = next {
                        if let Ok(line) = serde_json::to_string(&record) {
                            let _ = writeln!(out, "{line}");
                        }
                        next = receiver.try_recv().ok();
                    }
                    if out.flush().is_err() {
                        tracing::warn!("audit log: write failed");
                    }
                }
                let _ = out.flush();
            })
            .map_err(io)?;
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

    #[test]
    fn audit_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        for i in 0..3 {
            log.write(AuditRecord {
                ts_ms: i,
                run: "r".into(),
                tool: "a__b".into(),
                call_id: None,
                arguments_sha256: sha256_hex(b"{}"),
                result_sha256: sha256_hex(b"x"),
                outcome: "ok".into(),
                latency_ms: 1,
            });
        }
        log.close();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"));
    }
}
