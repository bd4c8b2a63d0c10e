//! OpenTelemetry export of toolmux's tool calls, over OTLP/HTTP with the JSON encoding, to
//! any collector (the OpenTelemetry Collector, Jaeger, Tempo, Phoenix, Honeycomb, ...).
//!
//! The [`Exporter`] reads the orchestrator's events (`tool_finished`, with each call's
//! [`CallRecord`]) and sends:
//! - **a span per call**, named `execute_tool {tool}` with the OpenTelemetry GenAI
//!   attributes (`gen_ai.operation.name`, `gen_ai.tool.name`, `gen_ai.tool.call.id`) and
//!   the MCP gateways' `mcp.server.name`; a call made inside another (a sub-agent's tools)
//!   is a child of that call's span, and one run's calls share one trace. A failed call has
//!   status `ERROR` and `error.type` (toolmux's error code). Arguments and results are
//!   never sent;
//! - **three metrics**, named as Docker's MCP gateway names them: `mcp.tool.calls` and
//!   `mcp.tool.errors` (cumulative counters) and `mcp.tool.duration` (a histogram in
//!   milliseconds), by `mcp.server.name` and `mcp.tool.name`.
//!
//! Spans are sent in batches every interval (or sooner, at 512), the metrics' totals every
//! interval, and both once more at [`Exporter::shutdown`]. A collector that is down or slow
//! costs the calls nothing: sending runs beside the event loop, at most
//! [`MAX_IN_FLIGHT`] requests at a time, each within its timeout, and what cannot be sent
//! is dropped and counted (a warning says so once, and again when sending works again).

#![deny(missing_docs)]

mod encode;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use toolmux_orchestrator::ToolEvent;
use toolmux_orchestrator::accounting::{CallRecord, CallStatus};

/// Requests to the collector under way at once; past them a batch is dropped.
pub const MAX_IN_FLIGHT: usize = 4;

/// Spans sent in one request at most, and sent as soon as that many wait.
pub const BATCH: usize = 512;

/// Spans kept waiting at most (the oldest are dropped past it).
/// The longest an exit waits for the last batches to be sent.
const EXIT_FLUSH: Duration = Duration::from_secs(2);

const QUEUE_MAX: usize = 4 * BATCH;

/// The default interval between two exports, in milliseconds.
pub const DEFAULT_INTERVAL_MS: u64 = 5000;

/// The default time one request to the collector may take, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// `telemetry.otlp` of the configuration: where and how to send.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP address (`http://localhost:4318`); traces go to
    /// `{endpoint}/v1/traces` and metrics to `{endpoint}/v1/metrics`, the path appended to
    /// the endpoint's path and a query kept after it. Default:
    /// `$OTEL_EXPORTER_OTLP_ENDPOINT`, else `http://localhost:4318`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Headers of every request (`Authorization: Bearer ${TOKEN}`), over those of
    /// `$OTEL_EXPORTER_OTLP_HEADERS` (`key=value,key=value`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `service.name` of the resource (default `$OTEL_SERVICE_NAME`, else `toolmux`); more
    /// resource attributes come from `$OTEL_RESOURCE_ATTRIBUTES`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Milliseconds between two exports (default 5000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// Milliseconds one request to the collector may take (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Whether spans are sent (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<bool>,
    /// Whether metrics are sent (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<bool>,
}

/// What the exporter was told, checked: [`Settings::new`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// `{endpoint}/v1/traces`, or `None` when spans are not sent.
    traces_url: Option<String>,
    /// `{endpoint}/v1/metrics`, or `None` when metrics are not sent.
    metrics_url: Option<String>,
    headers: Vec<(String, String)>,
    resource: Vec<(String, String)>,
    interval: Duration,
    timeout: Duration,
}

impl Settings {
    /// Checks `config`, reading the standard variables through `env` for what it leaves
    /// out. An error says which setting is wrong and how.
    pub fn new(
        config: &OtlpConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, String> {
        let endpoint = config
            .endpoint
            .clone()
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|e| !e.is_empty()))
            .unwrap_or_else(|| "http://localhost:4318".to_owned());
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
        let base = match reqwest::Url::parse(&endpoint) {
            Ok(base) if scheme_ok => base,
            _ => {
                return Err(format!(
                    "endpoint `{}` is not an http:// or https:// address (an OTLP/HTTP \
                     collector listens on one, as `http://localhost:4318`)",
                    endpoint_for_messages(&endpoint)
                ));
            }
        };
        let mut headers: Vec<(String, String)> = Vec::new();
        if let Some(listed) = env("OTEL_EXPORTER_OTLP_HEADERS") {
            for pair in listed.split(',').filter(|p| !p.trim().is_empty()) {
                let Some((key, value)) = pair.split_once('=') else {
                    return Err(format!(
                        "$OTEL_EXPORTER_OTLP_HEADERS has `{}` without `=`; write key=value,key=value",
                        pair.split('=').next().unwrap_or_default().trim()
                    ));
                };
                headers.push((key.trim().to_owned(), percent_decoded(value.trim())));
            }
        }
        for (key, value) in &config.headers {
            headers.retain(|(k, _)| !k.eq_ignore_ascii_case(key));
            headers.push((key.clone(), value.clone()));
        }
        for (key, value) in &headers {
            if reqwest::header::HeaderName::from_bytes(key.as_bytes()).is_err() {
                return Err(format!("header name `{key}` is not a valid HTTP header name"));
            }
            // The value is a secret more often than not, so the message names only the header.
            if reqwest::header::HeaderValue::from_str(value).is_err() {
                return Err(format!(
                    "the value of header `{key}` is not a valid HTTP header value; write it \
                     without line breaks or other control characters"
                ));
            }
        }
        let mut resource = Vec::new();
        if let Some(listed) = env("OTEL_RESOURCE_ATTRIBUTES") {
            for pair in listed.split(',') {
                if let Some((key, value)) = pair.split_once('=') {
                    resource.push((key.trim().to_owned(), percent_decoded(value.trim())));
                }
            }
        }
        let service = config
            .service_name
            .clone()
            .or_else(|| env("OTEL_SERVICE_NAME").filter(|s| !s.is_empty()))
            .unwrap_or_else(|| "toolmux".to_owned());
        resource.retain(|(k, _)| k != "service.name");
        resource.insert(0, ("service.name".to_owned(), service));
        resource.push(("service.version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()));
        resource.push(("service.instance.id".to_owned(), hex(&random_bytes::<16>())));
        let interval = config.interval_ms.unwrap_or(DEFAULT_INTERVAL_MS);
        if interval == 0 {
            return Err("intervalMs is 0; give the milliseconds between two exports".to_owned());
        }
        let timeout = config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if timeout == 0 {
            return Err("timeoutMs is 0: every request to the collector would time out".to_owned());
        }
        let traces = config.traces.unwrap_or(true);
        let metrics = config.metrics.unwrap_or(true);
        if !traces && !metrics {
            return Err("`traces` and `metrics` are both false: nothing would be sent; \
                        remove `telemetry.otlp` instead"
                .to_owned());
        }
        Ok(Settings {
            traces_url: traces.then(|| signal_url(&base, "v1/traces")),
            metrics_url: metrics.then(|| signal_url(&base, "v1/metrics")),
            headers,
            resource,
            interval: Duration::from_millis(interval),
            timeout: Duration::from_millis(timeout),
        })
    }

    /// The header values, which may hold keys: to be redacted wherever they could show.
    pub fn secrets(&self) -> Vec<String> {
        self.headers.iter().map(|(_, v)| v.clone()).filter(|v| !v.is_empty()).collect()
    }
}

/// Where one signal (`v1/traces`, `v1/metrics`) is sent: `path` appended to the path of the
/// endpoint `base`, as the OTLP exporter specification has it for
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (`http://collector:4318/mycollector` sends traces to
/// `http://collector:4318/mycollector/v1/traces`), its query kept
/// (`http://collector:4318?tenant=a` sends them to `/v1/traces?tenant=a`, not into the query)
/// and its fragment, which no request carries, left out.
fn signal_url(base: &reqwest::Url, path: &str) -> String {
    let mut url = base.clone();
    let joined = format!("{}/{path}", base.path().trim_end_matches('/'));
    url.set_path(&joined);
    url.set_fragment(None);
    url.into()
}

/// What the exporter has done so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExportCounts {
    /// Spans the collector accepted.
    pub spans_sent: u64,
    /// Spans dropped: the collector failed or was too slow, or events were missed.
    pub spans_dropped: u64,
    /// Metric exports the collector accepted.
    pub metric_exports: u64,
    /// Requests that failed.
    pub failures: u64,
}

#[derive(Debug, Default)]
struct Counts {
    spans_sent: AtomicU64,
    spans_dropped: AtomicU64,
    metric_exports: AtomicU64,
    failures: AtomicU64,
    /// Whether the last request failed (a warning is given on each change).
    failing: std::sync::atomic::AtomicBool,
}

/// Sends the calls of one orchestrator to a collector until [`Exporter::shutdown`].
#[derive(Debug)]
pub struct Exporter {
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    counts: Arc<Counts>,
    /// While spans are sent: requests to upstream servers name their call's span.
    _spans: Option<toolmux_core::trace::ExportingSpans>,
}

impl Exporter {
    /// Starts exporting the calls whose events `events` receives (subscribe before the
    /// first call). Needs a tokio runtime.
    pub fn start(settings: Settings, events: broadcast::Receiver<ToolEvent>) -> Exporter {
        // reqwest is built without a default crypto provider; install ring's once per
        // process (another crate may have installed one first, which is just as good).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("toolmux/", env!("CARGO_PKG_VERSION")))
            .timeout(settings.timeout)
            .build()
            .unwrap_or_default();
        let counts = Arc::new(Counts::default());
        let stop = CancellationToken::new();
        let spans = settings.traces_url.is_some().then(toolmux_core::trace::ExportingSpans::start);
        let state = State {
            sender: Sender { client, settings: Arc::new(settings), counts: counts.clone() },
            spans: Vec::new(),
            metrics: Metrics::new(SystemTime::now()),
            sending: JoinSet::new(),
        };
        let task = tokio::spawn(state.run(events, stop.clone()));
        Exporter { stop, task: Mutex::new(Some(task)), counts, _spans: spans }
    }

    /// Sends what is left (the events already received, the spans waiting, the metrics'
    /// totals) and stops, waiting for the requests under way at most their timeout.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// What was sent and dropped so far.
    pub fn counts(&self) -> ExportCounts {
        let c = &self.counts;
        ExportCounts {
            spans_sent: c.spans_sent.load(Ordering::Relaxed),
            spans_dropped: c.spans_dropped.load(Ordering::Relaxed),
            metric_exports: c.metric_exports.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        // Without a shutdown, the task ends at its next wakeup; nothing more is sent.
        self.stop.cancel();
    }
}

/// The exporter's task.
struct State {
    sender: Sender,
    spans: Vec<encode::Span>,
    metrics: Metrics,
    sending: JoinSet<()>,
}

impl State {
    async fn run(mut self, mut events: broadcast::Receiver<ToolEvent>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.sender.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => self.flush(true),
                event = events.recv() => match event {
                    Ok(event) => self.record(&event),
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        self.sender.counts.spans_dropped.fetch_add(missed, Ordering::Relaxed);
                        tracing::warn!(
                            "OpenTelemetry export fell behind the calls: {missed} were not recorded"
                        );
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                Some(_) = self.sending.join_next(), if !self.sending.is_empty() => {}
            }
        }
        // What was received before the stop is still sent.
        while let Ok(event) = events.try_recv() {
            self.record(&event);
        }
        self.flush(true);
        // At exit a collector that accepts and never answers must not hold the process for
        // its whole request timeout (a CLI call would take 10 s longer each time).
        let deadline = self.sender.settings.timeout.min(EXIT_FLUSH);
        let _ = tokio::time::timeout(deadline, async {
            while self.sending.join_next().await.is_some() {}
        })
        .await;
        self.sending.abort_all();
    }

    fn record(&mut self, event: &ToolEvent) {
        let ToolEvent::ToolFinished { record, .. } = event else { return };
        let end = SystemTime::now();
        self.metrics.add(record);
        if self.sender.settings.traces_url.is_some() {
            if self.spans.len() >= QUEUE_MAX {
                self.spans.remove(0);
                self.sender.counts.spans_dropped.fetch_add(1, Ordering::Relaxed);
            }
            self.spans.push(encode::Span::of(record, end));
            if self.spans.len() >= BATCH {
                self.flush(false);
            }
        }
    }

    /// Sends the spans waiting and, with `metrics`, the metrics' totals.
    fn flush(&mut self, metrics: bool) {
        while !self.spans.is_empty() {
            let batch: Vec<encode::Span> =
                self.spans.drain(..self.spans.len().min(BATCH)).collect();
            let Some(url) = self.sender.settings.traces_url.clone() else { break };
            let body = encode::traces(&self.sender.settings.resource, &batch);
            let spans = batch.len() as u64;
            self.send(url, body, Sent::Spans(spans));
        }
        if metrics
            && let Some(url) = self.sender.settings.metrics_url.clone()
            && !self.metrics.is_empty()
        {
            let body = self.metrics.encode(&self.sender.settings.resource, SystemTime::now());
            self.send(url, body, Sent::Metrics);
        }
    }

    fn send(&mut self, url: String, body: Vec<u8>, what: Sent) {
        if self.sending.len() >= MAX_IN_FLIGHT {
            if let Sent::Spans(n) = what {
                self.sender.counts.spans_dropped.fetch_add(n, Ordering::Relaxed);
            }
            self.sender.failed(&url, "too many requests to the collector are still under way");
            return;
        }
        let sender = self.sender.clone();
        self.sending.spawn(async move { sender.post(url, body, what).await });
    }
}

/// What one request carries.
#[derive(Debug, Clone, Copy)]
enum Sent {
    Spans(u64),
    Metrics,
}

#[derive(Clone)]
struct Sender {
    client: reqwest::Client,
    settings: Arc<Settings>,
    counts: Arc<Counts>,
}

impl Sender {
    async fn post(&self, url: String, body: Vec<u8>, what: Sent) {
        let mut request =
            self.client.post(&url).header(reqwest::header::CONTENT_TYPE, "application/json");
        for (key, value) in &self.settings.headers {
            request = request.header(key.as_str(), value.as_str());
        }
        let outcome = match request.body(body).send().await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => Err(format!("the collector answered {}", response.status())),
            // reqwest's message names the address, never a header.
            Err(e) if e.is_timeout() => {
                Err(format!("no answer within {} ms", self.settings.timeout.as_millis()))
            }
            Err(e) => Err(format!("cannot reach it: {}", without_url(&e))),
        };
        match (outcome, what) {
            (Ok(()), Sent::Spans(n)) => {
                self.counts.spans_sent.fetch_add(n, Ordering::Relaxed);
                self.recovered(&url);
            }
            (Ok(()), Sent::Metrics) => {
                self.counts.metric_exports.fetch_add(1, Ordering::Relaxed);
                self.recovered(&url);
            }
            (Err(why), what) => {
                if let Sent::Spans(n) = what {
                    self.counts.spans_dropped.fetch_add(n, Ordering::Relaxed);
                }
                self.failed(&url, &why);
            }
        }
    }

    fn failed(&self, url: &str, why: &str) {
        self.counts.failures.fetch_add(1, Ordering::Relaxed);
        if !self.counts.failing.swap(true, Ordering::Relaxed) {
            let url = url_for_logs(url);
            tracing::warn!(
                "OpenTelemetry export to {url} failed ({why}); what cannot be sent is dropped \
                 until it works again"
            );
        }
    }

    fn recovered(&self, url: &str) {
        if self.counts.failing.swap(false, Ordering::Relaxed) {
            let url = url_for_logs(url);
            tracing::warn!("OpenTelemetry export to {url} works again");
        }
    }
}

/// The collector's `url` without user info or query, either of which may carry a key, for
/// the log.
fn url_for_logs(url: &str) -> String {
    let Ok(mut shown) = reqwest::Url::parse(url) else {
        // Not reached: the address was built from an endpoint checked to parse.
        return "the collector".to_owned();
    };
    // Both fail only for URLs that cannot have user info, which then have none to hide.
    let _ = shown.set_password(None);
    let _ = shown.set_username("");
    shown.set_query(None);
    shown.to_string()
}

/// The longest endpoint an error shows, in bytes, when it is no URL.
const ENDPOINT_EXCERPT_BYTES: usize = 200;

/// An endpoint refused, as its error shows it: without user name, password, query or
/// fragment (any of which may carry a token) when it parses as a URL, else as
/// [`toolmux_core::unparsed_url_for_messages`] shows text.
fn endpoint_for_messages(endpoint: &str) -> String {
    // A URL with no authority (`user:s3cret@collector:4318` is one of scheme `user`) keeps
    // what may be user info in its path: it is shown as text is.
    let parsed = reqwest::Url::parse(endpoint).ok().filter(|url| !url.cannot_be_a_base());
    let Some(mut shown) = parsed else {
        return toolmux_core::unparsed_url_for_messages(endpoint, ENDPOINT_EXCERPT_BYTES);
    };
    // Both fail only for URLs that cannot have user info, which then have none to hide.
    let _ = shown.set_password(None);
    let _ = shown.set_username("");
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// reqwest's error text without its `for url (…)` part, which could carry a query.
fn without_url(e: &reqwest::Error) -> String {
    let text = e.to_string();
    match text.find(" for url (") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// The cumulative metrics since the exporter started.
struct Metrics {
    start: SystemTime,
    series: HashMap<(String, String), Series>,
}

/// One tool's totals.
#[derive(Debug, Clone, Default)]
struct Series {
    calls: u64,
    errors: BTreeMap<String, u64>,
    /// Calls per bucket of [`encode::DURATION_BOUNDS`], and one more past the last.
    buckets: Vec<u64>,
    sum_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

impl Metrics {
    fn new(start: SystemTime) -> Metrics {
        Metrics { start, series: HashMap::new() }
    }

    fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    fn add(&mut self, record: &CallRecord) {
        let key = (record.namespace.clone(), record.tool.clone());
        let series = self.series.entry(key).or_insert_with(|| Series {
            buckets: vec![0; encode::DURATION_BOUNDS.len() + 1],
            min_ms: f64::MAX,
            ..Series::default()
        });
        series.calls += 1;
        if record.status == CallStatus::Failed {
            let code = record.error_code.clone().unwrap_or_else(|| "failed".to_owned());
            *series.errors.entry(code).or_default() += 1;
        }
        #[allow(clippy::cast_precision_loss)]
        let ms = record.latency_ms as f64;
        let bucket = encode::DURATION_BOUNDS.iter().position(|b| ms <= *b);
        let bucket = bucket.unwrap_or(encode::DURATION_BOUNDS.len());
        series.buckets[bucket] += 1;
        series.sum_ms += ms;
        series.min_ms = series.min_ms.min(ms);
        series.max_ms = series.max_ms.max(ms);
    }

    fn encode(&self, resource: &[(String, String)], now: SystemTime) -> Vec<u8> {
        encode::metrics(resource, self.start, now, &self.series)
    }
}

/// `%XX` sequences of a value in the standard variables decoded (W3C baggage style).
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex_at = |j: usize| bytes.get(j).and_then(|b| (*b as char).to_digit(16));
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (hex_at(i + 1), hex_at(i + 2))
        {
            out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    if getrandom::getrandom(&mut bytes).is_err() {
        // No randomness: the time still tells processes apart.
        let nanos =
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        for (b, n) in bytes.iter_mut().zip(nanos.to_le_bytes().iter().cycle()) {
            *b = *n;
        }
    }
    bytes
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
