//! The exporter against a loopback collector: what reaches it, what a failing one costs,
//! how ids nest, and where the settings come from.

use super::*;
use expect_test::expect;
use serde_json::{Value, json};
use toolmux_core::{CallContext, ToolCall, ToolError, ToolKind, ToolOutput, ToolSet, ToolSpec};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig};
use toolmux_test_support::otlp::OtlpCollector;

fn no_env(_: &str) -> Option<String> {
    None
}

fn settings(endpoint: &str, more: impl FnOnce(&mut OtlpConfig)) -> Settings {
    let mut config = OtlpConfig {
        endpoint: Some(endpoint.to_owned()),
        interval_ms: Some(100),
        timeout_ms: Some(2000),
        ..OtlpConfig::default()
    };
    more(&mut config);
    Settings::new(&config, &no_env).expect("valid settings")
}

/// An orchestrator of two tools: `t__ok` answers, `t__bad` fails.
async fn orchestrator() -> Orchestrator {
    let object = json!({"type": "object"});
    let tools = ToolSet::new("t", ToolKind::Builtin)
        .with_tool(ToolSpec::new("ok", "answers", object.clone()), |_, _| async {
            Ok(ToolOutput::text("fine"))
        })
        .with_tool(ToolSpec::new("bad", "fails", object), |_, _| async {
            Err(ToolError::invalid_arguments("t__bad", "always"))
        });
    let o = Orchestrator::builder(OrchestratorConfig::default())
        .provider(Arc::new(tools))
        .build()
        .expect("valid configuration");
    o.warmup().await;
    o
}

fn attributes(span: &Value) -> BTreeMap<String, Value> {
    let list = span["attributes"].as_array().cloned().unwrap_or_default();
    list.into_iter()
        .map(|a| (a["key"].as_str().unwrap_or_default().to_owned(), a["value"].clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reach_the_collector_as_spans_and_metrics() {
    let collector = OtlpCollector::start();
    let o = orchestrator().await;
    let settings = settings(&collector.endpoint(), |c| {
        c.headers.insert("Authorization".into(), "Bearer otel-s3cret".into());
        c.service_name = Some("gateway-7".into());
    });
    let exporter = Exporter::start(settings, o.subscribe());
    let ctx = CallContext::new();
    for _ in 0..3 {
        assert!(o.execute(ToolCall::new("t__ok", json!({})), &ctx).await.ok);
    }
    assert!(!o.execute(ToolCall::new("t__bad", json!({})), &ctx).await.ok);
    // The interval sends them without a shutdown.
    let sent = collector.wait_for(Duration::from_secs(10), |r| {
        r.iter().any(|r| r.path == "/v1/metrics") && r.iter().any(|r| r.path == "/v1/traces")
    });
    assert!(sent, "nothing reached the collector: {:?}", collector.requests());
    exporter.shutdown().await;

    let spans = collector.spans();
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap_or("?")).collect();
    assert_eq!(
        names,
        ["execute_tool t__ok", "execute_tool t__ok", "execute_tool t__ok", "execute_tool t__bad"]
    );
    let first = attributes(&spans[0]);
    assert_eq!(first["gen_ai.operation.name"], json!({"stringValue": "execute_tool"}));
    assert_eq!(first["gen_ai.tool.name"], json!({"stringValue": "t__ok"}));
    assert_eq!(first["mcp.server.name"], json!({"stringValue": "t"}));
    assert_eq!(spans[0]["kind"], 1);
    assert!(spans[0].get("status").is_none(), "{}", spans[0]);
    assert_eq!(spans[3]["status"], json!({"code": 2, "message": "invalid_arguments"}));
    assert_eq!(attributes(&spans[3])["error.type"], json!({"stringValue": "invalid_arguments"}));
    // One context, one run: one trace, a span each.
    let traces: std::collections::HashSet<&str> =
        spans.iter().map(|s| s["traceId"].as_str().unwrap_or("?")).collect();
    assert_eq!(traces.len(), 1);
    let ids: std::collections::HashSet<&str> =
        spans.iter().map(|s| s["spanId"].as_str().unwrap_or("?")).collect();
    assert_eq!(ids.len(), 4);
    for span in &spans {
        assert_eq!(span["traceId"].as_str().map(str::len), Some(32));
        assert_eq!(span["spanId"].as_str().map(str::len), Some(16));
        let start: u128 = span["startTimeUnixNano"].as_str().unwrap_or("x").parse().unwrap();
        let end: u128 = span["endTimeUnixNano"].as_str().unwrap_or("x").parse().unwrap();
        assert!(start <= end && end > 1_700_000_000_000_000_000, "{span}");
    }

    let metrics = collector.last_metrics();
    let points =
        |name: &str| metrics[name]["sum"]["dataPoints"].as_array().cloned().unwrap_or_default();
    let calls = points("mcp.tool.calls");
    let count_of = |tool: &str| {
        calls
            .iter()
            .find(|p| attributes(p)["mcp.tool.name"] == json!({"stringValue": tool}))
            .map(|p| p["asInt"].clone())
    };
    assert_eq!(count_of("t__ok"), Some(json!("3")));
    assert_eq!(count_of("t__bad"), Some(json!("1")));
    let errors = points("mcp.tool.errors");
    assert_eq!(errors.len(), 1);
    assert_eq!(attributes(&errors[0])["error.type"], json!({"stringValue": "invalid_arguments"}));
    assert_eq!(metrics["mcp.tool.calls"]["sum"]["isMonotonic"], true);
    let histogram = &metrics["mcp.tool.duration"]["histogram"];
    assert_eq!(histogram["aggregationTemporality"], 2);
    let ok = histogram["dataPoints"]
        .as_array()
        .and_then(|p| {
            p.iter().find(|p| attributes(p)["mcp.tool.name"] == json!({"stringValue": "t__ok"}))
        })
        .cloned()
        .expect("t__ok's durations");
    assert_eq!(ok["count"], "3");
    let buckets: u64 = ok["bucketCounts"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b.as_str().unwrap_or("0").parse::<u64>().unwrap_or(0))
        .sum();
    assert_eq!(buckets, 3);
    assert_eq!(ok["explicitBounds"].as_array().map(Vec::len), Some(14));
    assert_eq!(ok["bucketCounts"].as_array().map(Vec::len), Some(15));

    for request in collector.requests() {
        assert_eq!(request.headers["authorization"], "Bearer otel-s3cret");
        assert_eq!(request.headers["content-type"], "application/json");
        let resource = &request.body.as_object().and_then(|b| b.values().next()).expect("one list")
            [0]["resource"];
        let resource = attributes(resource);
        assert_eq!(resource["service.name"], json!({"stringValue": "gateway-7"}));
        assert!(resource.contains_key("service.instance.id"));
    }
    let counts = exporter.counts();
    assert_eq!((counts.spans_sent, counts.spans_dropped, counts.failures), (4, 0, 0));
    assert!(counts.metric_exports >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_down_or_refusing_costs_the_calls_nothing() {
    // Nothing listens on this port any more.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    let o = orchestrator().await;
    let exporter = Exporter::start(settings(&endpoint, |_| {}), o.subscribe());
    let started = std::time::Instant::now();
    for _ in 0..20 {
        assert!(o.execute(ToolCall::new("t__ok", json!({})), &CallContext::new()).await.ok);
    }
    assert!(started.elapsed() < Duration::from_secs(2), "the calls waited for the collector");
    exporter.shutdown().await;
    let counts = exporter.counts();
    assert_eq!(counts.spans_sent, 0);
    assert_eq!(counts.spans_dropped, 20);
    assert!(counts.failures >= 1);

    // A collector that refuses once: that batch is dropped, the next ones arrive.
    let collector = OtlpCollector::start();
    collector.refuse_next(1);
    let exporter = Exporter::start(
        settings(&collector.endpoint(), |c| c.metrics = Some(false)),
        o.subscribe(),
    );
    assert!(o.execute(ToolCall::new("t__ok", json!({})), &CallContext::new()).await.ok);
    assert!(collector.wait_for(Duration::from_secs(10), |r| r.len() == 1));
    assert!(o.execute(ToolCall::new("t__ok", json!({})), &CallContext::new()).await.ok);
    exporter.shutdown().await;
    let counts = exporter.counts();
    assert_eq!((counts.spans_sent, counts.spans_dropped, counts.failures), (1, 1, 1));
    assert!(collector.requests().iter().all(|r| r.path == "/v1/traces"), "metrics were off");
}

/// An endpoint with a query (a tenant, a key) has the signal's path appended to its path
/// and keeps its query: the collector receives at `/v1/traces?tenant=a`, where the path
/// went into the query and the request reached `/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_s_query_stays_after_the_signal_s_path() {
    let collector = OtlpCollector::start();
    let o = orchestrator().await;
    let endpoint = format!("{}?tenant=a", collector.endpoint());
    let exporter = Exporter::start(settings(&endpoint, |_| {}), o.subscribe());
    assert!(o.execute(ToolCall::new("t__ok", json!({})), &CallContext::new()).await.ok);
    let received = |requests: &[toolmux_test_support::otlp::OtlpRequest], path: &str| {
        requests.iter().any(|r| r.path == path && r.query.as_deref() == Some("tenant=a"))
    };
    let sent = collector.wait_for(Duration::from_secs(10), |r| {
        received(r, "/v1/traces") && received(r, "/v1/metrics")
    });
    exporter.shutdown().await;
    assert!(sent, "nothing reached the collector's paths: {:?}", collector.requests());
    assert_eq!(collector.spans().len(), 1);
}

/// A caller's `traceparent`: every span of the call takes its trace id, the outermost takes
/// its span as parent, the ones inside stay children of theirs.
#[test]
fn a_callers_trace_is_joined() {
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let record = |op_id: u64, parent_op_id: Option<u64>| CallRecord {
        tool: "agents__helper".into(),
        namespace: "agents".into(),
        kind: ToolKind::Builtin,
        run_id: "run-a".into(),
        call_id: None,
        op_id,
        parent_op_id,
        latency_ms: 1,
        queued_ms: 0,
        chars_in: 1,
        chars_out: 1,
        status: CallStatus::Ok,
        error_code: None,
        cached: false,
        spilled: false,
        attempts: 1,
        trace_parent: Some(caller.into()),
    };
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let outer = encode::Span::of(&record(1, None), end);
    let inner = encode::Span::of(&record(2, Some(1)), end);
    let body: Value = serde_json::from_slice(&encode::traces(&[], &[outer, inner])).unwrap();
    let spans = body["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().cloned().unwrap();
    for span in &spans {
        assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    }
    assert_eq!(spans[0]["parentSpanId"], "00f067aa0ba902b7");
    assert_eq!(spans[1]["parentSpanId"], spans[0]["spanId"]);
    // A malformed one is ignored: the run's own trace.
    let mut bad = record(1, None);
    bad.trace_parent = Some("00-zz".into());
    let body: Value =
        serde_json::from_slice(&encode::traces(&[], &[encode::Span::of(&bad, end)])).unwrap();
    let span = &body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    assert_ne!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert!(span.get("parentSpanId").is_none());
}

#[test]
fn a_calls_span_is_the_child_of_the_call_it_was_made_in() {
    let record = |op_id: u64, parent_op_id: Option<u64>, run: &str| CallRecord {
        tool: "fs__read".into(),
        namespace: "fs".into(),
        kind: ToolKind::Builtin,
        run_id: run.into(),
        call_id: Some("call-1".into()),
        op_id,
        parent_op_id,
        latency_ms: 12,
        queued_ms: 2,
        chars_in: 10,
        chars_out: 200,
        status: CallStatus::Ok,
        error_code: None,
        cached: false,
        spilled: false,
        attempts: 1,
        trace_parent: None,
    };
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let agent = encode::Span::of(&record(1, None, "run-a"), end);
    let tool = encode::Span::of(&record(2, Some(1), "run-a"), end);
    let other = encode::Span::of(&record(1, None, "run-b"), end);
    let body: Value = serde_json::from_slice(&encode::traces(&[], &[agent, tool, other])).unwrap();
    let spans = body["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().cloned().unwrap();
    assert_eq!(spans[1]["parentSpanId"], spans[0]["spanId"]);
    assert_eq!(spans[1]["traceId"], spans[0]["traceId"]);
    assert!(spans[0].get("parentSpanId").is_none());
    assert_ne!(spans[2]["traceId"], spans[0]["traceId"], "another run, another trace");
    let mut span = spans[1].clone();
    span["traceId"] = json!("…");
    span["spanId"] = json!("…");
    span["parentSpanId"] = json!("…");
    expect![[r#"
        {
          "attributes": [
            {
              "key": "gen_ai.operation.name",
              "value": {
                "stringValue": "execute_tool"
              }
            },
            {
              "key": "gen_ai.tool.name",
              "value": {
                "stringValue": "fs__read"
              }
            },
            {
              "key": "mcp.server.name",
              "value": {
                "stringValue": "fs"
              }
            },
            {
              "key": "mcp.tool.name",
              "value": {
                "stringValue": "fs__read"
              }
            },
            {
              "key": "toolmux.provider.kind",
              "value": {
                "stringValue": "builtin"
              }
            },
            {
              "key": "toolmux.run.id",
              "value": {
                "stringValue": "run-a"
              }
            },
            {
              "key": "toolmux.queued_ms",
              "value": {
                "intValue": "2"
              }
            },
            {
              "key": "toolmux.chars_in",
              "value": {
                "intValue": "10"
              }
            },
            {
              "key": "toolmux.chars_out",
              "value": {
                "intValue": "200"
              }
            },
            {
              "key": "toolmux.attempts",
              "value": {
                "intValue": "1"
              }
            },
            {
              "key": "gen_ai.tool.call.id",
              "value": {
                "stringValue": "call-1"
              }
            }
          ],
          "endTimeUnixNano": "1800000000000000000",
          "kind": 1,
          "name": "execute_tool fs__read",
          "parentSpanId": "…",
          "spanId": "…",
          "startTimeUnixNano": "1799999999988000000",
          "traceId": "…"
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&span).unwrap());
}

#[test]
fn settings_come_from_the_configuration_then_the_standard_variables() {
    let env = |name: &str| match name {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("https://otel.example:4318/".to_owned()),
        "OTEL_EXPORTER_OTLP_HEADERS" => Some("x-team=tools,authorization=Basic%20abc".to_owned()),
        "OTEL_SERVICE_NAME" => Some("from-env".to_owned()),
        "OTEL_RESOURCE_ATTRIBUTES" => {
            Some("deployment.environment=ci,service.name=ignored".to_owned())
        }
        _ => None,
    };
    let s = Settings::new(&OtlpConfig::default(), &env).unwrap();
    assert_eq!(s.traces_url.as_deref(), Some("https://otel.example:4318/v1/traces"));
    assert_eq!(s.metrics_url.as_deref(), Some("https://otel.example:4318/v1/metrics"));
    assert_eq!(
        s.headers,
        [
            ("x-team".to_owned(), "tools".to_owned()),
            ("authorization".to_owned(), "Basic abc".to_owned())
        ]
    );
    assert_eq!(s.resource[0], ("service.name".to_owned(), "from-env".to_owned()));
    assert!(s.resource.contains(&("deployment.environment".to_owned(), "ci".to_owned())));
    assert_eq!(s.interval, Duration::from_millis(DEFAULT_INTERVAL_MS));
    let mut config = OtlpConfig {
        endpoint: Some("http://127.0.0.1:4318".into()),
        service_name: Some("mine".into()),
        traces: Some(false),
        ..OtlpConfig::default()
    };
    config.headers.insert("Authorization".into(), "Bearer k".into());
    let s = Settings::new(&config, &env).unwrap();
    assert_eq!(s.traces_url, None);
    assert_eq!(s.metrics_url.as_deref(), Some("http://127.0.0.1:4318/v1/metrics"));
    assert_eq!(
        s.headers,
        [
            ("x-team".to_owned(), "tools".to_owned()),
            ("Authorization".to_owned(), "Bearer k".to_owned())
        ],
        "the configuration's header replaces the variable's of the same name"
    );
    assert_eq!(s.secrets(), ["tools", "Bearer k"]);
    assert_eq!(s.resource[0].1, "mine");
    assert_eq!(
        Settings::new(&OtlpConfig::default(), &no_env).unwrap().traces_url.as_deref(),
        Some("http://localhost:4318/v1/traces")
    );
    // The signal's path goes after the endpoint's path, before its query; a fragment,
    // which no request carries, is left out.
    for (endpoint, traces) in [
        ("http://collector:4318?tenant=a", "http://collector:4318/v1/traces?tenant=a"),
        ("http://collector:4318/?tenant=a", "http://collector:4318/v1/traces?tenant=a"),
        ("http://collector:4318/otlp/?a=1&b=2", "http://collector:4318/otlp/v1/traces?a=1&b=2"),
        ("http://collector:4318/otlp#top", "http://collector:4318/otlp/v1/traces"),
    ] {
        let config = OtlpConfig { endpoint: Some(endpoint.into()), ..OtlpConfig::default() };
        let s = Settings::new(&config, &no_env).unwrap();
        assert_eq!(s.traces_url.as_deref(), Some(traces), "{endpoint}");
    }

    let refused = |config: OtlpConfig, env: &dyn Fn(&str) -> Option<String>| {
        Settings::new(&config, env).expect_err("refused")
    };
    expect!["endpoint `localhost:4318` is not an http:// or https:// address (an OTLP/HTTP collector listens on one, as `http://localhost:4318`)"]
        .assert_eq(&refused(OtlpConfig { endpoint: Some("localhost:4318".into()), ..OtlpConfig::default() }, &no_env));
    // A token in the endpoint is not shown, whether it parses or not.
    for (endpoint, shown) in [
        ("ftp://user:s3cret@collector:2121/x?token=s3cret#s3cret", "ftp://collector:2121/x"),
        ("http://sk-s3cret@[::1:4318/x?token=s3cret", "http://[::1:4318/x"),
        ("http://collector:99999\u{1b}[31m#s3cret", "http://collector:99999\\u{1b}[31m"),
        // A password holding `/` or `#` keeps the text from parsing; no scheme makes
        // `user` one and the rest a path.
        ("https://user:pa/ss3cret@collector:4318", "https://collector:4318"),
        ("https://user:s3cret#1@collector:4318", "https://collector:4318"),
        ("user:s3cret@collector:4318", "collector:4318"),
    ] {
        let config = OtlpConfig { endpoint: Some(endpoint.into()), ..OtlpConfig::default() };
        let message = refused(config, &no_env);
        assert!(message.starts_with(&format!("endpoint `{shown}` is not")), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
    }
    expect!["intervalMs is 0; give the milliseconds between two exports"]
        .assert_eq(&refused(OtlpConfig { interval_ms: Some(0), ..OtlpConfig::default() }, &no_env));
    expect!["`traces` and `metrics` are both false: nothing would be sent; remove `telemetry.otlp` instead"]
        .assert_eq(&refused(OtlpConfig { traces: Some(false), metrics: Some(false), ..OtlpConfig::default() }, &no_env));
    let bad_headers =
        |name: &str| (name == "OTEL_EXPORTER_OTLP_HEADERS").then(|| "token".to_owned());
    expect!["$OTEL_EXPORTER_OTLP_HEADERS has `token` without `=`; write key=value,key=value"]
        .assert_eq(&refused(OtlpConfig::default(), &bad_headers));
    let mut config = OtlpConfig::default();
    config.headers.insert("bad header".into(), "x".into());
    expect!["header name `bad header` is not a valid HTTP header name"]
        .assert_eq(&refused(config, &no_env));
    let broken_value = |name: &str| {
        (name == "OTEL_EXPORTER_OTLP_HEADERS").then(|| "api-key=s3cret%0Aevil: 1".to_owned())
    };
    let refusal = refused(OtlpConfig::default(), &broken_value);
    expect!["the value of header `api-key` is not a valid HTTP header value; write it without line breaks or other control characters"]
        .assert_eq(&refusal);
    assert!(!refusal.contains("s3cret"), "the refusal shows no header value");
    let mut config = OtlpConfig::default();
    config.headers.insert("Authorization".into(), "Bearer s3cret\r\n".into());
    let refusal = refused(config, &no_env);
    expect!["the value of header `Authorization` is not a valid HTTP header value; write it without line breaks or other control characters"]
        .assert_eq(&refusal);
    assert!(!refusal.contains("s3cret"), "the refusal shows no header value");
}

/// The collector's address can carry a key in its user info or query; the warnings show it
/// without them.
#[test]
fn the_collectors_address_is_logged_without_credentials() {
    // As `Exporter::start` does before it builds its client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sender = Sender {
        client: reqwest::Client::new(),
        settings: Arc::new(settings("http://localhost:4318", |_| {})),
        counts: Arc::default(),
    };
    let url = "https://user:s3cret@collector.test:4318/v1/traces?api_key=s3cret";
    let ((), lines) = toolmux_test_support::logs::captured_logs(|| {
        sender.failed(url, "the collector answered 503 Service Unavailable");
        sender.recovered(url);
    });
    expect![[r#"
        [
            "WARN message=OpenTelemetry export to https://collector.test:4318/v1/traces failed (the collector answered 503 Service Unavailable); what cannot be sent is dropped until it works again",
            "WARN message=OpenTelemetry export to https://collector.test:4318/v1/traces works again",
        ]
    "#]]
    .assert_debug_eq(&lines);
    assert_eq!(
        url_for_logs("https://t0ken@collector.test/v1/metrics"),
        "https://collector.test/v1/metrics"
    );
}
