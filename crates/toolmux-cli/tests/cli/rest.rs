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
