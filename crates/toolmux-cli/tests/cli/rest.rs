//! REST tools through the real binary, against a loopback API that echoes each request it
//! receives (its path and headers) as JSON: what leaves toolmux and what comes back.

use crate::Project;
use serde_json::{Value, json};
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpListener;

/// A loopback HTTP/1.1 server answering every request with
/// `{"path": TARGET, "headers": {name: value}}`: status 200, or 401 for a path that
/// starts with `/fail`. Serves until the test process ends.
fn echo_api() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let address = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut headers = serde_json::Map::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = line.trim_end().split_once(": ") {
                    headers.insert(name.to_ascii_lowercase(), value.into());
                }
            }
            let path = request_line.split(' ').nth(1).unwrap_or_default().to_owned();
            let status = if path.starts_with("/fail") { "401 Unauthorized" } else { "200 OK" };
            let body = json!({"path": path, "headers": headers}).to_string();
            let mut stream = reader.into_inner();
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{address}")
}

const SPEC: &str = r#"{
  "openapi": "3.0.3",
  "info": {"title": "echo", "version": "1"},
  "paths": {
    "/echo": {"get": {"operationId": "echo", "security": [{"basic": [], "qkey": []}],
      "responses": {"200": {"description": "ok", "content": {"application/json": {
        "schema": {"type": "object"}}}}}}},
    "/fail": {"get": {"operationId": "fail", "security": [{"qkey": []}],
      "responses": {"401": {"description": "no"}}}}
  },
  "components": {"securitySchemes": {
    "basic": {"type": "http", "scheme": "basic"},
    "qkey": {"type": "apiKey", "in": "query", "name": "api_key"}
  }}
}"#;

/// An API that echoes its request sends the credentials back: served over MCP (text,
/// JSON and structured content), printed by `tools call`, and logged with `-v` when the
/// API answers with an error, every form of them is redacted: the key from `${ENV}`, the
/// basic-auth password and its base64 header.
#[test]
fn credentials_an_api_echoes_are_redacted_everywhere() {
    let base = echo_api();
    let project = Project::new()
        .env("ECHO_PASSWORD", "pa55-w0rd-secret")
        .env("ECHO_KEY", "k3y+with/specials");
    project.file("echo.json", SPEC).file(
        "toolmux.yaml",
        &format!(
            "openapi:\n  api:\n    spec: echo.json\n    baseUrl: {base}\n    auth:\n      \
             basic: {{username: robot, password: '${{ECHO_PASSWORD}}'}}\n      \
             qkey: {{apiKey: '${{ECHO_KEY}}'}}\n"
        ),
    );
    let leaks = |text: &str| {
        ["pa55-w0rd-secret", "k3y+with", "k3y%2Bwith", "cm9ib3Q6cGE1NS13MHJkLXNlY3JldA"]
            .into_iter()
            .filter(|secret| text.contains(secret))
            .collect::<Vec<_>>()
    };

    let messages = crate::serve::stdio_exchange(
        &project,
        &["serve", "--stdio"],
        &[json!({"method": "tools/call", "params": {"name": "api__echo", "arguments": {}}})],
    );
    let answer = messages.iter().find(|m| m["id"] == 2).expect("the call's answer");
    let shown = answer.to_string();
    assert!(leaks(&shown).is_empty(), "{:?} in {shown}", leaks(&shown));
    assert!(shown.contains("[redacted]"), "the API did echo them: {shown}");
    assert_eq!(answer["result"]["isError"], Value::Bool(false), "{shown}");

    let printed = project.run(&["tools", "call", "api__echo", "--json"]);
    assert!(leaks(&printed.stdout).is_empty(), "{}", printed.stdout);

    let failed = project.run(&["-v", "tools", "call", "api__fail"]);
    assert_ne!(failed.code, 0, "{failed:?}");
    assert!(failed.stderr.contains("401"), "{}", failed.stderr);
    let shown = format!("{}{}", failed.stdout, failed.stderr);
    assert!(leaks(&shown).is_empty(), "{:?} in {shown}", leaks(&shown));
}

/// An OpenAPI document that cannot be read when toolmux starts is that provider failing to
/// start, not the whole configuration: `config check` reports it beside the others (exit
/// 3), `tools list` lists the rest, and `serve` reads it in the background once it appears
/// and offers its tools.
#[test]
fn an_unreadable_document_fails_its_provider_only() {
    let base = echo_api();
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!("fs: {{}}\nopenapi:\n  api:\n    spec: ./echo.json\n    baseUrl: {base}\n"),
    );
    let check = project.run(&["config", "check"]);
    assert_eq!(check.code, 3, "{}\n{}", check.stdout, check.stderr);
    let failed = check.stdout.lines().find(|l| l.trim_start().starts_with("api ")).unwrap_or("");
    assert!(failed.contains("FAILED") && failed.contains("echo.json"), "{}", check.stdout);
    assert!(!failed.contains("/./"), "{failed}");
    assert!(check.stdout.lines().any(|l| l.trim_start().starts_with("fs ")), "{}", check.stdout);
    let listed = project.run(&["tools", "list"]);
    assert_eq!(listed.code, 3, "{}", listed.stderr);
    assert!(listed.stdout.contains("fs__read"), "{}", listed.stdout);
    assert!(listed.stderr.contains("provider `api` failed to start"), "{}", listed.stderr);

    let (mut child, mut stdin, mut stdout) =
        crate::serve::spawn_stdio(&project, &["serve", "--stdio"]);
    writeln!(
        stdin,
        "{}\n{}",
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
    )
    .expect("write");
    project.file("echo.json", SPEC);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut id = 0;
    let names = loop {
        assert!(std::time::Instant::now() < deadline, "the API's tools never joined");
        id += 1;
        writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}))
            .expect("write");
        let answer = loop {
            let mut line = String::new();
            assert_ne!(stdout.read_line(&mut line).expect("read"), 0, "serve ended");
            let message: Value = serde_json::from_str(&line).expect("JSON");
            if message["id"] == id {
                break message;
            }
        };
        let names: Vec<String> = answer["result"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect();
        if names.iter().any(|n| n == "api__echo") {
            break names;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert!(names.iter().any(|n| n == "fs__read"), "{names:?}");
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
}
