//! A flood of progress from a real upstream (a server on the official Python SDK reporting
//! thousands of times in one call) reaches the client coalesced: far fewer notifications,
//! rising, the last one sent before the result, over stdio (both paths) and HTTP, and to the
//! HTTP API's `GET /api/events`.

use crate::http::{sse_messages, stateless_post};
use crate::stdio::RawClient;
use crate::support::{HttpServer, install_crypto, peer, socket_pair, within};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, ProgressSink, ToolProvider};
use toolmux_mcp::server::{EventSource, ServeOptions, ServedEvent};
use toolmux_mcp::{McpProvider, McpServerConfig};

/// How many reports the upstream sends in one call.
const FLOOD: u64 = 10_000;

/// An MCP provider of the Python flood server and its `flood` tool's name, checked to
/// flood a direct call's sink.
async fn flood_provider() -> (Arc<McpProvider>, String) {
    let python = peer("python/venv/bin/python", "mcp (PyPI)");
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/progress_flood_server.py");
    let config =
        McpServerConfig::stdio(python.display().to_string(), [script.display().to_string()])
            .with_base_dir(std::env::temp_dir());
    let provider = Arc::new(McpProvider::new("py", config).unwrap());
    let tools = within(provider.list_tools()).await.unwrap();
    let name =
        tools.iter().find(|t| t.name.ends_with("flood")).expect("the flood tool").name.clone();
    let seen = Arc::new(AtomicUsize::new(0));
    let sink = {
        let seen = seen.clone();
        ProgressSink::new(move |_| {
            seen.fetch_add(1, Ordering::Relaxed);
        })
    };
    let ctx = CallContext::new().with_progress(sink);
    let out = within(provider.call(&name, json!({"count": FLOOD}), &ctx)).await.unwrap();
    assert_eq!(out.to_text(), format!("flooded {FLOOD}"));
    let seen = seen.load(Ordering::Relaxed) as u64;
    assert_eq!(seen, FLOOD, "every report of the upstream's flood reaches the direct call");
    (provider, name)
}

/// Checks the progress notifications of token `token` among `messages` (in the order the
/// client read them, up to and including the call's result, with id `id`).
fn check_coalesced(messages: &[Value], token: &str, id: &Value) {
    let answer = messages.iter().position(|m| &m["id"] == id).expect("the call's result");
    assert_eq!(
        messages[answer]["result"]["content"][0]["text"],
        format!("flooded {FLOOD}"),
        "{}",
        messages[answer]
    );
    let reported: Vec<f64> = messages[..answer]
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .map(|m| {
            assert_eq!(m["params"]["progressToken"], token, "{m}");
            m["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    let after = messages[answer + 1..].iter().filter(|m| m["method"] == "notifications/progress");
    assert_eq!(after.count(), 0, "no progress after the result");
    check_reports(&reported);
}

/// Checks the progress values a client got of one flooded call: a few, rising, the final
/// one among them.
fn check_reports(reported: &[f64]) {
    assert!(!reported.is_empty(), "progress reached the client");
    assert!(
        (reported.len() as u64) < FLOOD / 20,
        "{} of {FLOOD} reports were sent, not coalesced",
        reported.len()
    );
    assert!(reported.windows(2).all(|w| w[0] < w[1]), "progress rises: {reported:?}");
    assert_eq!(reported.last().copied(), Some(FLOOD as f64), "the final report is sent");
}

/// Through `serve --stdio`'s session, on the direct path (a progress token only, relayed)
/// and rmcp's (more in `_meta`), the client reads a few rising reports, the final one
/// before the result. (How long the call takes is a benchmark's business, not a test's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_flood_reaches_a_stdio_client_coalesced() {
    let (provider, name) = flood_provider().await;
    let (stream, server) = socket_pair(provider.clone(), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    let metas =
        [json!({"progressToken": "p0"}), json!({"progressToken": "p1", "toolmux/runId": "r"})];
    for (id, meta) in metas.into_iter().enumerate() {
        client
            .send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": name, "arguments": {"count": FLOOD}, "_meta": meta
            }}))
            .await;
        let mut messages = Vec::new();
        while messages.last().is_none_or(|m: &Value| m["id"] != id) {
            messages.push(client.next().await);
        }
        check_coalesced(&messages, &format!("p{id}"), &json!(id));
    }
    drop(client);
    within(server).await.unwrap().unwrap();
    provider.shutdown().await.unwrap();
}

/// Over streamable HTTP, a stateless call's event stream holds a few rising reports, the
/// final one before the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_flood_reaches_an_http_client_coalesced() {
    let (provider, name) = flood_provider().await;
    let server = HttpServer::start(provider.clone(), ServeOptions::default()).await;
    let arguments = json!({"count": FLOOD});
    let meta = json!({"progressToken": "h"});
    let (status, text) = stateless_post(&server.url(), &name, arguments, meta, &[]).await;
    assert_eq!(status, 200, "{text}");
    let messages = sse_messages(&text);
    check_coalesced(&messages, "h", &json!(7));
    server.shutdown.cancel();
    provider.shutdown().await.unwrap();
}

/// The events of the calls a test makes, as `toolmux serve`'s event source gives them.
#[derive(Debug, Default)]
struct CallEvents(Mutex<Vec<tokio::sync::mpsc::UnboundedSender<ServedEvent>>>);

impl CallEvents {
    fn publish(&self, event: ServedEvent) {
        self.0.lock().unwrap().retain(|tx| tx.send(event.clone()).is_ok());
    }

    fn subscribers(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl EventSource for CallEvents {
    fn subscribe(&self) -> futures::stream::BoxStream<'static, ServedEvent> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.0.lock().unwrap().push(tx);
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|event| (event, rx))
        }))
    }
}

/// `GET /api/events` of `serve --http` carries a flood's `tool.progress` coalesced as MCP
/// clients get it: a few rising reports, the final one before `tool.done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_flood_reaches_the_http_api_s_events_coalesced() {
    let (provider, name) = flood_provider().await;
    let events = Arc::new(CallEvents::default());
    let options = ServeOptions { events: Some(events.clone()), ..ServeOptions::default() };
    let server = HttpServer::start(provider.clone(), options).await;
    install_crypto();
    let mut response =
        within(reqwest::Client::new().get(format!("http://{}/api/events", server.addr)).send())
            .await
            .expect("response");
    assert_eq!(response.status().as_u16(), 200);
    within(async {
        while events.subscribers() == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    events.publish(ServedEvent {
        name: "tool.started",
        op_id: 1,
        run_id: Some("r".into()),
        tool: Some(name.clone()),
        data: json!({"opId": 1}),
    });
    let sink = {
        let (events, name) = (events.clone(), name.clone());
        ProgressSink::new(move |progress| {
            events.publish(ServedEvent {
                name: "tool.progress",
                op_id: 1,
                run_id: None,
                tool: Some(name.clone()),
                data: json!({"opId": 1, "progress": progress.progress, "total": progress.total}),
            });
        })
    };
    let ctx = CallContext::new().with_progress(sink);
    let out = within(provider.call(&name, json!({"count": FLOOD}), &ctx)).await.unwrap();
    assert_eq!(out.to_text(), format!("flooded {FLOOD}"));
    events.publish(ServedEvent {
        name: "tool.done",
        op_id: 1,
        run_id: Some("r".into()),
        tool: Some(name.clone()),
        data: json!({"opId": 1}),
    });
    let mut text = String::new();
    while !text.contains("event: tool.done") {
        let chunk = within(response.chunk()).await.expect("the stream goes on").expect("a chunk");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    let reported: Vec<f64> =
        sse_messages(&text).iter().filter_map(|data| data["progress"].as_f64()).collect();
    assert_eq!(names.first(), Some(&"tool.started"), "{text}");
    assert_eq!(names.last(), Some(&"tool.done"), "the end comes last: {text}");
    check_reports(&reported);
    server.shutdown.cancel();
    provider.shutdown().await.unwrap();
}
