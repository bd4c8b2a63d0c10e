//! OAuth over the legacy HTTP+SSE transport (the 2025-03-26 era's servers): a loopback
//! SSE MCP server that refuses requests without a bearer token, publishes protected
//! resource and authorization server metadata, and issues tokens by the client credentials
//! grant. The event stream and every posted message carry the token.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig, OAuthConfig, OAuthGrant, TransportKind};

type Hook = Box<dyn FnOnce() + Send>;

#[derive(Clone, Default)]
struct Server {
    base: Arc<Mutex<String>>,
    /// Runs at the first refusal: another process renewing the kept tokens meanwhile.
    on_refuse: Arc<Mutex<Option<Hook>>>,
    stream: Arc<Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>>,
    token_requests: Arc<AtomicUsize>,
    unauthorized: Arc<AtomicUsize>,
}

impl Server {
    fn base(&self) -> String {
        self.base.lock().unwrap().clone()
    }

    /// `None` when the request carries the token; else the 401 naming the metadata.
    fn refuse(&self, headers: &HeaderMap) -> Option<Response> {
        let authorized =
            headers.get("authorization").is_some_and(|v| v.as_bytes() == b"Bearer cc-1");
        if authorized {
            return None;
        }
        self.unauthorized.fetch_add(1, Ordering::SeqCst);
        if let Some(hook) = self.on_refuse.lock().unwrap().take() {
            hook();
        }
        let challenge = format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/sse\"",
            self.base()
        );
        Some(
            (StatusCode::UNAUTHORIZED, [("www-authenticate", challenge)], "no token")
                .into_response(),
        )
    }
}

fn json_reply(status: StatusCode, value: Value) -> Response {
    (status, [("content-type", "application/json")], value.to_string()).into_response()
}

async fn resource_metadata(State(server): State<Server>) -> Response {
    let base = server.base();
    json_reply(
        StatusCode::OK,
        json!({"resource": format!("{base}/sse"), "authorization_servers": [base]}),
    )
}

async fn server_metadata(State(server): State<Server>) -> Response {
    let base = server.base();
    json_reply(
        StatusCode::OK,
        json!({
            "issuer": base,
            "token_endpoint": format!("{base}/token"),
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic"],
            "response_types_supported": ["code"],
        }),
    )
}

async fn token(State(server): State<Server>, headers: HeaderMap, body: String) -> Response {
    server.token_requests.fetch_add(1, Ordering::SeqCst);
    // base64("toolmux:s3cret")
    let basic =
        headers.get("authorization").is_some_and(|v| v.as_bytes() == b"Basic dG9vbG11eDpzM2NyZXQ=");
    let form: Vec<(String, String)> = body
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let has = |k: &str, v: &str| form.iter().any(|(a, b)| a == k && b == v);
    let resource = form.iter().any(|(k, _)| k == "resource");
    if !basic {
        return json_reply(
            StatusCode::UNAUTHORIZED,
            json!({"error": "invalid_client", "error_description": "bad client credentials"}),
        );
    }
    if !has("grant_type", "client_credentials") || !resource {
        return json_reply(StatusCode::BAD_REQUEST, json!({"error": "invalid_request"}));
    }
    json_reply(
        StatusCode::OK,
        json!({"access_token": "cc-1", "token_type": "Bearer", "expires_in": 3600}),
    )
}

async fn events(State(server): State<Server>, headers: HeaderMap) -> Response {
    if let Some(refused) = server.refuse(&headers) {
        return refused;
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tx.send("event: endpoint\ndata: /message\n\n".into()).unwrap();
    *server.stream.lock().unwrap() = Some(tx);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|event| (Ok::<_, std::convert::Infallible>(event), rx))
    });
    ([("content-type", "text/event-stream")], axum::body::Body::from_stream(stream)).into_response()
}

async fn message(State(server): State<Server>, headers: HeaderMap, body: String) -> Response {
    if let Some(refused) = server.refuse(&headers) {
        return refused;
    }
    let request: Value = serde_json::from_str(&body).unwrap();
    let Some(id) = request.get("id").cloned() else { return StatusCode::ACCEPTED.into_response() };
    let reply = match request["method"].as_str().unwrap_or_default() {
        "initialize" => json!({"result": {
            "protocolVersion": "2024-11-05",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "sse-oauth", "version": "1"},
        }}),
        "tools/list" => {
            json!({"result": {"tools": [{"name": "whoami", "inputSchema": {"type": "object"}}]}})
        }
        "tools/call" => {
            // With a tenant passed on: what the message's `_meta` holds, to show that the
            // passed headers travel beside the message, not in it.
            let text = match headers.get("x-tenant-id").and_then(|v| v.to_str().ok()) {
                Some(tenant) => {
                    format!("token ok; tenant={tenant}; meta={}", request["params"]["_meta"])
                }
                None => "token ok".to_owned(),
            };
            json!({"result": {"content": [{"type": "text", "text": text}]}})
        }
        "ping" => json!({"result": {}}),
        _ => json!({"error": {"code": -32601, "message": "method not found"}}),
    };
    let mut reply = reply;
    reply["jsonrpc"] = json!("2.0");
    reply["id"] = id;
    if let Some(stream) = server.stream.lock().unwrap().as_ref() {
        let _ = stream.send(format!("event: message\ndata: {reply}\n\n"));
    }
    StatusCode::ACCEPTED.into_response()
}

async fn start() -> (Server, String, tokio::task::JoinHandle<()>) {
    let server = Server::default();
    let router = axum::Router::new()
        .route("/.well-known/oauth-protected-resource/sse", axum::routing::get(resource_metadata))
        .route("/.well-known/oauth-authorization-server", axum::routing::get(server_metadata))
        .route("/token", axum::routing::post(token))
        .route("/sse", axum::routing::get(events))
        .route("/message", axum::routing::post(message))
        .with_state(server.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    *server.base.lock().unwrap() = base.clone();
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (server, base, task)
}

fn config(base: &str, secret: &str, store: &std::path::Path) -> McpServerConfig {
    let mut config = McpServerConfig::remote(TransportKind::Sse, format!("{base}/sse"))
        .with_protocol(toolmux_mcp::ProtocolMode::Legacy)
        .with_max_restarts(0);
    config.oauth = Some(OAuthConfig {
        grant: Some(OAuthGrant::ClientCredentials),
        client_id: Some("toolmux".into()),
        client_secret: Some(secret.into()),
        token_store: Some(store.to_path_buf()),
        ..OAuthConfig::default()
    });
    config
}

#[tokio::test]
async fn the_event_stream_and_every_message_carry_the_token() {
    let (server, base, task) = start().await;
    let store = tempfile::tempdir().unwrap();
    let provider = McpProvider::new("legacy", config(&base, "s3cret", store.path())).unwrap();
    provider.warmup().await.unwrap();
    let tools = provider.list_tools().await.unwrap();
    assert_eq!(tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["whoami"]);
    let out = provider.call("whoami", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "token ok");
    // One 401 (the first GET), one token; client credentials tokens are not kept on disk.
    assert_eq!(server.unauthorized.load(Ordering::SeqCst), 1);
    assert_eq!(server.token_requests.load(Ordering::SeqCst), 1);
    assert_eq!(std::fs::read_dir(store.path()).map(|d| d.count()).unwrap_or(0), 0);
    provider.shutdown().await.unwrap();
    task.abort();
}

#[tokio::test]
async fn a_refused_grant_says_why_and_never_shows_the_secret() {
    let (server, base, task) = start().await;
    let store = tempfile::tempdir().unwrap();
    let provider = McpProvider::new("legacy", config(&base, "wr0ng-secret", store.path())).unwrap();
    let error = provider.warmup().await.unwrap_err().report();
    expect_test::expect!["legacy unavailable: not authorized: the token endpoint refused (401 Unauthorized): invalid_client: bad client credentials"]
        .assert_eq(&error);
    assert!(!error.contains("wr0ng-secret"));
    assert_eq!(server.token_requests.load(Ordering::SeqCst), 1, "no retry loop");
    provider.shutdown().await.unwrap();
    task.abort();
}

#[tokio::test]
async fn tokens_another_process_renewed_are_taken_from_the_store() {
    let (server, base, task) = start().await;
    let store = tempfile::tempdir().unwrap();
    let mut config = McpServerConfig::remote(TransportKind::Sse, format!("{base}/sse"))
        .with_protocol(toolmux_mcp::ProtocolMode::Legacy)
        .with_max_restarts(0);
    config.oauth = Some(OAuthConfig {
        token_store: Some(store.path().to_path_buf()),
        ..OAuthConfig::default()
    });
    let provider = McpProvider::new("legacy", config).unwrap();
    let path = provider.oauth_token_path().expect("a token file");
    let kept = |token: &str| {
        json!({
            "serverUrl": format!("{base}/sse"),
            "resource": format!("{base}/sse"),
            "issuer": base,
            "tokenEndpoint": format!("{base}/token"),
            "client": {"clientId": "c", "authMethod": "none"},
            "accessToken": token,
            "scopes": [],
        })
        .to_string()
    };
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, kept("stale")).unwrap();
    // While this process holds the stale token, another one authorizes anew.
    let renewed = kept("cc-1");
    let target = path.clone();
    *server.on_refuse.lock().unwrap() =
        Some(Box::new(move || std::fs::write(&target, renewed).unwrap()));
    provider.warmup().await.unwrap();
    let out = provider.call("whoami", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "token ok");
    assert_eq!(server.token_requests.load(Ordering::SeqCst), 0, "no grant was needed");
    provider.shutdown().await.unwrap();
    task.abort();
}

#[tokio::test]
async fn a_pinned_issuer_keeps_the_secret_from_other_authorization_servers() {
    let (server, base, task) = start().await;
    let store = tempfile::tempdir().unwrap();
    let mut config = config(&base, "s3cret", store.path());
    if let Some(oauth) = config.oauth.as_mut() {
        oauth.issuer = Some("https://login.example.com".into());
    }
    let provider = McpProvider::new("legacy", config).unwrap();
    let error = provider.warmup().await.unwrap_err().report();
    assert!(error.contains("not to `https://login.example.com` (`oauth.issuer`)"), "{error}");
    assert_eq!(server.token_requests.load(Ordering::SeqCst), 0, "the secret was sent");
    provider.shutdown().await.unwrap();
    task.abort();
}

/// `passthroughHeaders` on a legacy SSE server: the client's header goes with the posted
/// `tools/call`, and the message's `_meta` carries nothing of it.
#[tokio::test]
async fn passed_headers_go_with_each_posted_call() {
    let (_server, base, task) = start().await;
    let store = tempfile::tempdir().unwrap();
    let mut config = config(&base, "s3cret", store.path());
    config.passthrough_headers = vec!["X-Tenant-Id".into()];
    let provider = McpProvider::new("legacy", config).unwrap();
    let ctx = CallContext::new().with_caller_headers(vec![("x-tenant-id".into(), "acme".into())]);
    let out = provider.call("whoami", json!({}), &ctx).await.unwrap();
    let text = out.to_text();
    assert!(text.starts_with("token ok; tenant=acme; meta="), "{text}");
    assert!(!text.contains("io.toolmux") && !text.contains("acme\""), "{text}");
    let out = provider.call("whoami", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), "token ok", "a header the client did not send is not sent");
    provider.shutdown().await.unwrap();
    task.abort();
}
