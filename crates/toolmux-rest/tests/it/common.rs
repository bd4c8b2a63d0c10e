//! Helpers shared by the integration tests: test peers and independent counts.
#![allow(dead_code, clippy::unwrap_used)]

use serde_json::Value;
use std::path::PathBuf;
use toolmux_core::{ToolSpec, naming};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file of an npm test peer; fails when the peer is missing.
pub fn npm_file(package: &str, path: &str) -> PathBuf {
    let file = repo_root().join(".peers/node/node_modules").join(package).join(path);
    assert!(file.exists(), "missing test peer {package}: run .ci/install-peers");
    file
}

/// A binary of the Python test venv; fails when it is missing.
pub fn python_bin(peer: &str, name: &str) -> PathBuf {
    let bin = repo_root().join(".peers/python/venv/bin").join(name);
    assert!(bin.exists(), "missing test peer {peer}: run .ci/install-peers");
    bin
}

/// Operations of a document counted with plain serde_json: every method key of every path
/// item, minus deprecated ones unless `deprecated` is true.
pub fn count_operations(doc: &Value, deprecated: bool) -> usize {
    let Some(paths) = doc.get("paths").and_then(Value::as_object) else { return 0 };
    let mut count = 0;
    for item in paths.values() {
        let item = match item.get("$ref").and_then(Value::as_str) {
            Some(r) => doc.pointer(r.trim_start_matches('#')).unwrap_or(&Value::Null),
            None => item,
        };
        let Some(item) = item.as_object() else { continue };
        for method in ["get", "put", "post", "delete", "options", "head", "patch", "trace"] {
            if let Some(op) = item.get(method)
                && (deprecated || op.get("deprecated") != Some(&Value::Bool(true)))
            {
                count += 1;
            }
        }
    }
    count
}

/// Checks what every import must give: unique names within budget and object schemas
/// that compile as JSON Schema 2020-12. Returns the failures.
pub fn check_tools(namespace: &str, tools: &[ToolSpec]) -> Vec<String> {
    let mut failures = Vec::new();
    let qualified = naming::qualify_all(namespace, tools.iter().map(|t| t.name.as_str()), 64)
        .expect("namespace is valid");
    let mut seen = std::collections::HashSet::new();
    for ((name, _), tool) in qualified.iter().zip(tools) {
        if !naming::is_valid_name(name, 64) {
            failures.push(format!("{name}: invalid or too long"));
        }
        if name != &format!("{namespace}__{}", tool.name) {
            failures.push(format!("{}: changed by qualification to {name}", tool.name));
        }
        if !seen.insert(name.clone()) {
            failures.push(format!("{name}: duplicate"));
        }
        if tool.input_schema.get("type").and_then(Value::as_str) != Some("object") {
            failures.push(format!("{name}: schema is not an object schema"));
        }
        if let Err(e) = jsonschema::draft202012::options().build(&tool.input_schema) {
            failures.push(format!("{name}: schema does not compile: {e}"));
        }
        if let Some(output) = &tool.output_schema {
            if output.get("type").and_then(Value::as_str) != Some("object") {
                failures.push(format!("{name}: output schema is not an object schema"));
            }
            if let Err(e) = jsonschema::meta::validate(output) {
                failures.push(format!("{name}: output schema is not valid JSON Schema: {e}"));
            }
            if let Err(e) = jsonschema::draft202012::options().build(output) {
                failures.push(format!("{name}: output schema does not compile: {e}"));
            }
        }
        for key in tool.input_schema["properties"].as_object().into_iter().flat_map(|p| p.keys()) {
            let ok = !key.is_empty()
                && key.len() <= 64
                && key.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if !ok {
                failures.push(format!("{name}: argument name `{key}` is not model-safe"));
            }
        }
    }
    failures
}

/// A running httpbinx on 127.0.0.1, killed and reaped on drop.
pub struct Httpbinx {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Httpbinx {
    /// Starts httpbinx on a free loopback port and waits until it answers (30 s at most).
    pub async fn start() -> Httpbinx {
        let bin = python_bin("httpbinx", "httpbinx");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new(bin)
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .current_dir(repo_root())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let server = Httpbinx { child, base: format!("http://127.0.0.1:{port}") };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return server;
            }
            assert!(std::time::Instant::now() < deadline, "httpbinx did not start within 30s");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Httpbinx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request as a loopback test server saw it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub head: String,
    pub body: Vec<u8>,
}

impl SeenRequest {
    /// The value of a header (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }

    /// The request line (`GET /path HTTP/1.1`).
    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or_default()
    }
}

/// What a loopback server answers: status, headers, and body chunks each sent after a delay.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub chunks: Vec<(u64, Vec<u8>)>,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            chunks: vec![(0, body.to_string().into_bytes())],
        }
    }
}

/// A loopback server answering `{}` that keeps every request it sees, headers and all: its
/// base URL and the requests.
pub async fn keeping_server() -> (String, std::sync::Arc<std::sync::Mutex<Vec<SeenRequest>>>) {
    let seen: std::sync::Arc<std::sync::Mutex<Vec<SeenRequest>>> = Default::default();
    let log = seen.clone();
    let base = serve(move |request| {
        log.lock().unwrap().push(request);
        Reply::json(200, serde_json::json!({}))
    })
    .await;
    (base, seen)
}

/// A tiny HTTP/1.1 server on 127.0.0.1 answering each request with `handler`; it closes
/// the connection after each response. Returns its base URL.
pub async fn serve<F>(handler: F) -> String
where
    F: Fn(SeenRequest) -> Reply + Send + Sync + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let handler = std::sync::Arc::new(handler);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let handler = handler.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let head_end = loop {
                    let Ok(n) = socket.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let mut seen = SeenRequest { head, body: buf[head_end + 4..].to_vec() };
                let length: usize =
                    seen.header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
                while seen.body.len() < length {
                    let Ok(n) = socket.read(&mut chunk).await else { return };
                    if n == 0 {
                        break;
                    }
                    seen.body.extend_from_slice(&chunk[..n]);
                }
                let reply = handler(seen);
                let mut head = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", reply.status);
                for (k, v) in &reply.headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for (delay, bytes) in reply.chunks {
                    tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                    if socket.write_all(&bytes).await.is_err() || socket.flush().await.is_err() {
                        return;
                    }
                }
                let _ = socket.shutdown().await;
            });
        }
    });
    base
}
