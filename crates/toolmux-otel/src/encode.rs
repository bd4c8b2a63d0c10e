//! The OTLP/HTTP JSON encoding of spans and metrics (`ExportTraceServiceRequest`,
//! `ExportMetricsServiceRequest`): ids in hex, 64-bit integers as strings, enums as
//! numbers, as the OTLP specification's JSON mapping has them.

use super::Series;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::SystemTime;
use toolmux_core::TraceParent;
use toolmux_core::trace;
use toolmux_orchestrator::accounting::{CallRecord, CallStatus};

/// The bucket bounds of `mcp.tool.duration`, in milliseconds: OpenTelemetry's default
/// explicit bounds.
pub(crate) const DURATION_BOUNDS: [f64; 14] = [
    5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0, 7500.0,
    10000.0,
];

/// `SPAN_KIND_INTERNAL`: a tool runs within toolmux's own work.
const KIND_INTERNAL: u8 = 1;
/// `STATUS_CODE_ERROR`.
const STATUS_ERROR: u8 = 2;
/// `AGGREGATION_TEMPORALITY_CUMULATIVE`.
const CUMULATIVE: u8 = 2;

/// One call's span, ready to encode.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Span {
    trace_id: String,
    span_id: String,
    parent_span_id: Option<String>,
    name: String,
    start_ns: u128,
    end_ns: u128,
    attributes: Vec<(&'static str, Value)>,
    error: Option<String>,
}

impl Span {
    /// The span of the call `record` that ended at `end`; its ids are the ones
    /// [`toolmux_core::trace`] derives, which providers name as parent upstream.
    /// its own.
    pub(crate) fn of(record: &CallRecord, end: SystemTime) -> Span {
        let end_ns = unix_nanos(end);
        let start_ns = end_ns.saturating_sub(u128::from(record.latency_ms) * 1_000_000);
        let mut attributes: Vec<(&'static str, Value)> = vec![
            ("gen_ai.operation.name", json!("execute_tool")),
            ("gen_ai.tool.name", json!(record.tool)),
            ("mcp.server.name", json!(record.namespace)),
            ("mcp.tool.name", json!(record.tool)),
            ("toolmux.provider.kind", json!(record.kind.to_string())),
            ("toolmux.run.id", json!(record.run_id)),
            ("toolmux.queued_ms", json!(record.queued_ms)),
            ("toolmux.chars_in", json!(record.chars_in)),
            ("toolmux.chars_out", json!(record.chars_out)),
            ("toolmux.attempts", json!(record.attempts)),
        ];
        if let Some(id) = &record.call_id {
            attributes.push(("gen_ai.tool.call.id", json!(id)));
        }
        if record.cached {
            attributes.push(("toolmux.cached", json!(true)));
        }
        if record.spilled {
            attributes.push(("toolmux.spilled", json!(true)));
        }
        let error = (record.status == CallStatus::Failed)
            .then(|| record.error_code.clone().unwrap_or_else(|| "failed".to_owned()));
        if let Some(code) = &error {
            attributes.push(("error.type", json!(code)));
        }
        // A caller's trace: its trace id for every span of the call, its span as the parent
        // of the outermost.
        let remote = record.trace_parent.as_deref().and_then(TraceParent::parse);
        Span {
            trace_id: match remote {
                Some(remote) => super::hex(&remote.trace_id),
                None => super::hex(&trace::run_trace_id(&record.run_id)),
            },
            span_id: super::hex(&trace::span_id(&record.run_id, record.op_id)),
            parent_span_id: record
                .parent_op_id
                .map(|op| super::hex(&trace::span_id(&record.run_id, op)))
                .or_else(|| remote.map(|remote| super::hex(&remote.span_id))),
            name: format!("execute_tool {}", record.tool),
            start_ns,
            end_ns,
            attributes,
            error,
        }
    }

    fn to_json(&self) -> Value {
        let mut span = json!({
            "traceId": self.trace_id,
            "spanId": self.span_id,
            "name": self.name,
            "kind": KIND_INTERNAL,
            "startTimeUnixNano": self.start_ns.to_string(),
            "endTimeUnixNano": self.end_ns.to_string(),
            "attributes": self.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
        });
        if let Some(parent) = &self.parent_span_id {
            span["parentSpanId"] = json!(parent);
        }
        if let Some(code) = &self.error {
            span["status"] = json!({"code": STATUS_ERROR, "message": code});
        }
        span
    }
}

/// An `ExportTraceServiceRequest` of `spans`.
pub(crate) fn traces(resource: &[(String, String)], spans: &[Span]) -> Vec<u8> {
    let body = json!({"resourceSpans": [{
        "resource": {"attributes": resource_attributes(resource)},
        "scopeSpans": [{
            "scope": scope(),
            "spans": spans.iter().map(Span::to_json).collect::<Vec<_>>(),
        }],
    }]});
    serde_json::to_vec(&body).unwrap_or_default()
}

/// An `ExportMetricsServiceRequest` of the totals `series` since `start`, as of `now`.
pub(crate) fn metrics(
    resource: &[(String, String)],
    start: SystemTime,
    now: SystemTime,
    series: &HashMap<(String, String), Series>,
) -> Vec<u8> {
    let (start, now) = (unix_nanos(start).to_string(), unix_nanos(now).to_string());
    let mut keys: Vec<&(String, String)> = series.keys().collect();
    keys.sort();
    let labels = |(server, tool): &(String, String)| {
        vec![attribute("mcp.server.name", &json!(server)), attribute("mcp.tool.name", &json!(tool))]
    };
    let mut calls = Vec::new();
    let mut errors = Vec::new();
    let mut durations = Vec::new();
    for key in keys {
        let s = &series[key];
        calls.push(json!({
            "attributes": labels(key),
            "startTimeUnixNano": start,
            "timeUnixNano": now,
            "asInt": s.calls.to_string(),
        }));
        for (code, count) in &s.errors {
            let mut attributes = labels(key);
            attributes.push(attribute("error.type", &json!(code)));
            errors.push(json!({
                "attributes": attributes,
                "startTimeUnixNano": start,
                "timeUnixNano": now,
                "asInt": count.to_string(),
            }));
        }
        durations.push(json!({
            "attributes": labels(key),
            "startTimeUnixNano": start,
            "timeUnixNano": now,
            "count": s.calls.to_string(),
            "sum": s.sum_ms,
            "min": s.min_ms,
            "max": s.max_ms,
            "bucketCounts": s.buckets.iter().map(u64::to_string).collect::<Vec<_>>(),
            "explicitBounds": DURATION_BOUNDS,
        }));
    }
    let sum = |name: &str, description: &str, points: Vec<Value>| {
        json!({
            "name": name,
            "description": description,
            "unit": "{call}",
            "sum": {"aggregationTemporality": CUMULATIVE, "isMonotonic": true, "dataPoints": points},
        })
    };
    let mut list = vec![sum("mcp.tool.calls", "Tool calls made", calls)];
    if !errors.is_empty() {
        list.push(sum("mcp.tool.errors", "Tool calls that failed", errors));
    }
    list.push(json!({
        "name": "mcp.tool.duration",
        "description": "How long tool calls took, queue wait included",
        "unit": "ms",
        "histogram": {"aggregationTemporality": CUMULATIVE, "dataPoints": durations},
    }));
    let body = json!({"resourceMetrics": [{
        "resource": {"attributes": resource_attributes(resource)},
        "scopeMetrics": [{"scope": scope(), "metrics": list}],
    }]});
    serde_json::to_vec(&body).unwrap_or_default()
}

fn scope() -> Value {
    json!({"name": "toolmux", "version": env!("CARGO_PKG_VERSION")})
}

fn resource_attributes(resource: &[(String, String)]) -> Vec<Value> {
    resource.iter().map(|(k, v)| attribute(k, &json!(v))).collect()
}

/// An OTLP `KeyValue`.
fn attribute(key: &str, value: &Value) -> Value {
    let value = match value {
        Value::Bool(b) => json!({"boolValue": b}),
        Value::Number(n) if n.is_u64() || n.is_i64() => json!({"intValue": n.to_string()}),
        Value::Number(n) => json!({"doubleValue": n}),
        Value::String(s) => json!({"stringValue": s}),
        other => json!({"stringValue": other.to_string()}),
    };
    json!({"key": key, "value": value})
}

fn unix_nanos(time: SystemTime) -> u128 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}
