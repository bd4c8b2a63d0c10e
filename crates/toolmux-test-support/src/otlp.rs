//! An OpenTelemetry collector on loopback that keeps what it is sent: the OTLP/HTTP JSON
//! requests to `/v1/traces` and `/v1/metrics`, with their headers.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the collector received.
#[derive(Debug, Clone)]
pub struct OtlpRequest {
    /// `/v1/traces` or `/v1/metrics`.
    pub path: String,
    /// Its query (`tenant=a`), if it had one.
    pub query: Option<String>,
    /// Its headers, names lowercase.
    pub headers: BTreeMap<String, String>,
    /// Its body, parsed (`Null` when it was not JSON).
    pub body: Value,
}

#[derive(Debug, Default)]
struct Recorded {
    requests: Vec<OtlpRequest>,
    /// Requests still to refuse with 503.
    refuse: usize,
}

/// The collector; it stops when dropped.
#[derive(Debug)]
pub struct OtlpCollector {
    addr: SocketAddr,
    recorded: Arc<Mutex<Recorded>>,
    /// Stops serving when dropped.
    _server: crate::loopback::Loopback,
}

impl OtlpCollector {
    /// A collector on `127.0.0.1` at a free port, answering every request 200.
    pub fn start() -> OtlpCollector {
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .route("/v1/metrics", post(receive))
            .with_state(recorded.clone());
        let server = crate::loopback::Loopback::serve("otlp-collector", app);
        OtlpCollector { addr: server.addr, recorded, _server: server }
    }

    /// The endpoint to configure: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Refuses the next `n` requests with 503 (recording them all the same).
    pub fn refuse_next(&self, n: usize) {
        self.lock().refuse = n;
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<OtlpRequest> {
        self.lock().requests.clone()
    }

    /// Every span received (the `spans` of every request to `/v1/traces`).
    pub fn spans(&self) -> Vec<Value> {
        let requests = self.requests();
        let traces = requests.iter().filter(|r| r.path == "/v1/traces");
        let resources = traces.flat_map(|r| array(&r.body["resourceSpans"]));
        let scopes = resources.flat_map(|r| array(&r["scopeSpans"]));
        scopes.flat_map(|s| array(&s["spans"])).collect()
    }

    /// The metrics of the last request to `/v1/metrics`, by name.
    pub fn last_metrics(&self) -> BTreeMap<String, Value> {
        let requests = self.requests();
        let Some(last) = requests.iter().rev().find(|r| r.path == "/v1/metrics") else {
            return BTreeMap::new();
        };
        let resources = array(&last.body["resourceMetrics"]);
        let scopes = resources.iter().flat_map(|r| array(&r["scopeMetrics"]));
        let metrics = scopes.flat_map(|s| array(&s["metrics"]));
        metrics.map(|m| (m["name"].as_str().unwrap_or_default().to_owned(), m)).collect()
    }

    /// Waits up to `limit` for `done` to hold of the requests received.
    pub fn wait_for(&self, limit: Duration, done: impl Fn(&[OtlpRequest]) -> bool) -> bool {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if done(&self.requests()) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn array(value: &Value) -> Vec<Value> {
    value.as_array().cloned().unwrap_or_default()
}

async fn receive(
    State(recorded): State<Arc<Mutex<Recorded>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let headers = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut recorded = recorded.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (path, query) = (uri.path().to_owned(), uri.query().map(str::to_owned));
    recorded.requests.push(OtlpRequest { path, query, headers, body });
    if recorded.refuse > 0 {
        recorded.refuse -= 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    StatusCode::OK
}
