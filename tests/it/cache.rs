//! The response cache through a loaded configuration: a REST tool that passes a caller's
//! header on to its API is cached per value of that header, so one tenant is never served
//! another's answer.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use toolmux::Toolmux;
use toolmux::config::{FileFormat, load_str};
use toolmux::toolmux_core::{CallContext, ToolCall};

/// An HTTP API on loopback answering `{"tenant": X-Tenant-Id}` and counting requests.
fn tenant_api() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("a second handle"));
            let mut tenant = String::from("none");
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("x-tenant-id")
                {
                    tenant = value.trim().to_owned();
                }
            }
            log.lock().expect("the log").push(tenant.clone());
            let body = format!("{{\"tenant\":\"{tenant}\"}}");
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (base, seen)
}

/// `yaml` loaded, built and started.
async fn started(yaml: &str) -> Toolmux {
    let env = |_: &str| None;
    let loaded = load_str(yaml, FileFormat::Yaml, "toolmux.yaml", Path::new("/proj"), &env)
        .unwrap_or_else(|e| panic!("{e}"));
    let toolmux = Toolmux::build(&loaded).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(toolmux.orchestrator().warmup().await.is_ok());
    toolmux
}

#[tokio::test]
async fn a_tool_passing_caller_headers_on_is_cached_per_caller() {
    let (base, seen) = tenant_api();
    let yaml = format!(
        "restTools:\n  whoami:\n    description: Which tenant the API sees.\n    \
         url: {base}/whoami\n    passthroughHeaders: [X-Tenant-Id]\n    cache: 60000\n"
    );
    let toolmux = started(&yaml).await;
    let tools = toolmux.orchestrator();
    let as_tenant = |tenant: &str| {
        CallContext::new().with_caller_headers(vec![("x-tenant-id".into(), tenant.into())])
    };
    let call = async |ctx: CallContext| {
        let result =
            tools.execute(ToolCall::new("rest__whoami", serde_json::json!({})), &ctx).await;
        assert!(result.ok, "{result:?}");
        result.result.unwrap_or_default()
    };
    assert!(call(as_tenant("acme")).await.contains("acme"));
    assert!(call(as_tenant("globex")).await.contains("globex"), "another tenant's answer");
    assert!(call(as_tenant("acme")).await.contains("acme"));
    assert!(call(CallContext::new()).await.contains("none"));
    // The second call of acme came from the cache; every other went to the API.
    assert_eq!(*seen.lock().expect("the log"), ["acme", "globex", "none"]);
    toolmux.shutdown().await.unwrap();
}

/// A `restTools` entry's `cache` joins the tool's own `tools.NAME` settings instead of
/// replacing them: its size cap still holds (the cache took every `tools.NAME` setting away).
#[tokio::test]
async fn a_cached_rest_tool_keeps_its_tool_settings() {
    let (base, seen) = tenant_api();
    let yaml = format!(
        "restTools:\n  whoami:\n    description: Which tenant the API sees.\n    \
         url: {base}/whoami\n    cache: 60000\ntools:\n  rest__whoami:\n    responseMaxBytes: 8\n"
    );
    let toolmux = started(&yaml).await;
    let tools = toolmux.orchestrator();
    for _ in 0..2 {
        let result = tools
            .execute(ToolCall::new("rest__whoami", serde_json::json!({})), &CallContext::new())
            .await;
        let text = result.result.unwrap_or_default();
        assert!(!text.contains("\"tenant\":\"none\""), "not capped: {text}");
    }
    assert_eq!(seen.lock().expect("the log").len(), 1, "the second call was cached");
    toolmux.shutdown().await.unwrap();
}
