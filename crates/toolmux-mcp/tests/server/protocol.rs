//! The streamable HTTP protocol as a demanding client meets it, with raw requests: the
//! status codes and JSON-RPC errors of messages that are wrong, sessions that are gone,
//! and streams resumed after a disconnect.

use crate::provider::Fixture;
use crate::support::{HttpServer, within};
use serde_json::{Value, json};
use std::sync::Arc;
use toolmux_mcp::server::ServeOptions;

/// A session of the handshake revisions, made with raw requests.
struct RawSession {
    client: reqwest::Client,
    url: String,
    id: String,
}

/// What the server answered: the status and the body.
struct Answered {
    status: u16,
    body: String,
}

impl Answered {
    /// The JSON-RPC message of the body: the body itself, or the last `data:` line of an
    /// event stream.
    fn message(&self) -> Value {
        let json =
            self.body.lines().rev().find_map(|l| l.strip_prefix("data:")).unwrap_or(&self.body);
        serde_json::from_str(json.trim())
            .unwrap_or_else(|e| panic!("no JSON-RPC message ({e}): {}", self.body))
    }
}

impl RawSession {
    async fn open(url: &str) -> RawSession {
        crate::support::install_crypto();
        let client = reqwest::Client::new();
        let initialize = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}
            }
        });
        let response = within(
            client
                .post(url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .body(initialize.to_string())
                .send(),
        )
        .await
        .expect("initialize answered");
        let id = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let _ = within(response.text()).await;
        let session = RawSession { client, url: url.to_owned(), id };
        let initialized = session
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string())
            .await;
        assert_eq!(initialized.status, 202, "{}", initialized.body);
        session
    }

    /// A POST of `body` (sent as it is) in this session.
    async fn post(&self, body: &str) -> Answered {
        let response = within(
            self.client
                .post(&self.url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .header("mcp-session-id", &self.id)
                .header("mcp-protocol-version", "2025-11-25")
                .body(body.to_owned())
                .send(),
        )
        .await
        .expect("a response");
        let status = response.status().as_u16();
        Answered { status, body: within(response.text()).await.expect("a body") }
    }

    /// The error a request with `method` and `params` is answered with.
    async fn error(&self, method: &str, params: Value) -> Value {
        let request = json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params});
        let answered = self.post(&request.to_string()).await;
        assert_eq!(answered.status, 200, "{}", answered.body);
        let message = answered.message();
        assert_eq!(message["id"], 9, "{message}");
        message["error"].clone()
    }
}

/// A request of one of MCP's methods whose `params` do not fit is `-32602` (invalid
/// params) saying what is wrong, not `-32601` (method not found) with the method's name
/// as the whole message; an unknown method says that it is unknown.
#[tokio::test]
async fn params_that_do_not_fit_are_invalid_params() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let cases = [
        ("logging/setLevel", json!({"level": "loud"}), "loud"),
        ("tools/call", json!({}), "name"),
        ("tools/call", json!({"name": "echo", "arguments": 5}), "arguments"),
        ("prompts/get", json!({"arguments": {}}), "name"),
        ("resources/read", json!({"uri": 7}), "uri"),
        ("completion/complete", json!({"argument": {"name": "a", "value": "b"}}), "ref"),
    ];
    for (method, params, named) in cases {
        let error = session.error(method, params.clone()).await;
        assert_eq!(error["code"], -32602, "{method} {params}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(method) && message.contains(named), "{method}: {message}");
    }
    let error = session.error("tools/frobnicate", json!({})).await;
    assert_eq!(error["code"], -32601, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("method not found") && message.contains("tools/frobnicate"),
        "{message}"
    );
    // The session goes on serving.
    let listed = session.post(r#"{"jsonrpc":"2.0","id":10,"method":"tools/list"}"#).await;
    assert!(listed.message()["result"]["tools"].is_array(), "{}", listed.body);
    server.stop().await;
}

/// A body that is not JSON is `400` with a JSON-RPC parse error (`-32700`), and JSON that
/// is no single message (a batch, which MCP dropped in 2025-06-18, or an object of no
/// message's form) is `400` with an invalid request error (`-32600`), both with id
/// `null`: not `415`, which tells a client its media type was wrong. The session goes on.
#[tokio::test]
async fn bodies_that_are_no_message_are_bad_requests() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let cases = [
        (r#"{"jsonrpc":"2.0","id":3,"#, -32700, "Parse error"),
        (
            r#"[{"jsonrpc":"2.0","id":4,"method":"ping"},{"jsonrpc":"2.0","id":5,"method":"ping"}]"#,
            -32600,
            "batch",
        ),
        (r#"{"greeting":"hello"}"#, -32600, "Invalid Request"),
    ];
    for (body, code, says) in cases {
        let answered = session.post(body).await;
        assert_eq!(answered.status, 400, "{body}: {}", answered.body);
        let message = answered.message();
        assert_eq!(message["error"]["code"], code, "{body}: {message}");
        assert_eq!(message["id"], Value::Null, "{message}");
        assert!(message["error"]["message"].as_str().unwrap().contains(says), "{message}");
    }
    let pong = session.post(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#).await;
    assert_eq!(pong.message()["result"], json!({}), "{}", pong.body);
    server.stop().await;
}

/// `DELETE` of a session that is gone (deleted, or never made) is `404`, as every other
/// request naming it is, so that a client can tell its session is no more.
#[tokio::test]
async fn deleting_a_session_that_is_gone_is_not_found() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let delete = |id: String| {
        let client = session.client.clone();
        let url = server.url();
        async move {
            let request = client.delete(url).header("mcp-session-id", id).send();
            within(request).await.expect("a response").status().as_u16()
        }
    };
    let status = delete(session.id.clone()).await;
    assert!((200..300).contains(&status), "{status}");
    assert_eq!(delete(session.id.clone()).await, 404);
    assert_eq!(delete("no-such-session".to_owned()).await, 404);
    let after = session.post(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).await;
    assert_eq!(after.status, 404, "{}", after.body);
    server.stop().await;
}
