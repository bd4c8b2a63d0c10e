//! `serve --http` as an OAuth protected resource, met by toolmux's own OAuth client: a
//! loopback authorization server issues ES256 JWTs by the client credentials grant; the
//! gateway verifies them against the server's JWKS (signature, issuer, audience, expiry,
//! scope), publishes its protected resource metadata, and refuses everything else with a
//! challenge that points to it.

use crate::support::free_port;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_mcp::server::{ResourceServerConfig, ServeOptions, TokenVerifier, bind_http};
use toolmux_mcp::{McpProvider, McpServerConfig, OAuthConfig, OAuthGrant, TransportKind};
use toolmux_test_support::mock::{Behavior, MockProvider};

/// The authorization server's signing key.
struct Signer(EcdsaKeyPair);

impl Signer {
    fn new() -> Signer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        Signer(
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
                .unwrap(),
        )
    }

    fn jwks(&self) -> Value {
        let point = self.0.public_key().as_ref();
        json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k1",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])}]})
    }

    fn token(&self, claims: &Value) -> String {
        let header =
            URL_SAFE_NO_PAD.encode(json!({"alg": "ES256", "kid": "k1", "typ": "JWT"}).to_string());
        let input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(claims.to_string()));
        let signature = self.0.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The authorization server: metadata, keys, and tokens for `toolmux:s3cret`.
async fn authorization_server(signer: Arc<Signer>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let metadata = json!({
        "issuer": base,
        "token_endpoint": format!("{base}/token"),
        "jwks_uri": format!("{base}/jwks"),
        "grant_types_supported": ["client_credentials"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic"],
        "response_types_supported": ["code"],
    })
    .to_string();
    let jwks = signer.jwks().to_string();
    let issuer = base.clone();
    let router = axum::Router::new()
        .route("/.well-known/oauth-authorization-server", json_get(metadata))
        .route("/jwks", json_get(jwks))
        .route(
            "/token",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
                let signer = signer.clone();
                let issuer = issuer.clone();
                async move {
                    let basic = headers
                        .get("authorization")
                        .is_some_and(|v| v.as_bytes() == b"Basic dG9vbG11eDpzM2NyZXQ=");
                    let resource = body
                        .split('&')
                        .filter_map(|p| p.split_once('='))
                        .find(|(k, _)| *k == "resource")
                        .map(|(_, v)| percent_decode(v));
                    let (Some(resource), true) = (resource, basic) else {
                        return (
                            axum::http::StatusCode::BAD_REQUEST,
                            [("content-type", "application/json")],
                            r#"{"error":"invalid_request"}"#.to_owned(),
                        );
                    };
                    let token = signer
                        .token(&json!({"iss": issuer, "aud": resource, "sub": "agent-1",
                        "exp": now() + 300, "scope": "tools"}));
                    let reply =
                        json!({"access_token": token, "token_type": "Bearer", "expires_in": 300});
                    (
                        axum::http::StatusCode::OK,
                        [("content-type", "application/json")],
                        reply.to_string(),
                    )
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

/// A gateway serving one echo tool on `port`, taking the tokens `verifier` accepts: its
/// address, what stops it, and its task.
async fn gateway(
    port: u16,
    verifier: TokenVerifier,
) -> (
    std::net::SocketAddr,
    CancellationToken,
    tokio::task::JoinHandle<Result<(), toolmux_mcp::McpError>>,
) {
    let options =
        ServeOptions { token_verifier: Some(Arc::new(verifier)), ..ServeOptions::default() };
    let provider: Arc<dyn ToolProvider> =
        Arc::new(MockProvider::new("demo").with_tool("echo", Behavior::Echo));
    let shutdown = CancellationToken::new();
    let address = format!("127.0.0.1:{port}").parse().expect("an address");
    let (bound, served) =
        bind_http(provider, address, options, shutdown.clone()).await.expect("it listens");
    (bound, shutdown, served)
}

/// A `GET` route answering the JSON document `body`.
fn json_get(body: String) -> axum::routing::MethodRouter {
    axum::routing::get(move || async move { ([("content-type", "application/json")], body) })
}

fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            out.push(u8::from_str_radix(&v[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toolmux_clients_reach_a_gateway_with_tokens_of_its_authorization_server() {
    let signer = Arc::new(Signer::new());
    let issuer = authorization_server(signer.clone()).await;
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let verifier = TokenVerifier::new(ResourceServerConfig {
        issuer: issuer.clone(),
        resource: resource.clone(),
        jwks_uri: None,
        scopes: vec!["tools".into()],
        introspection: None,
    })
    .await
    .unwrap();
    let (bound, shutdown, served) = gateway(port, verifier).await;

    // toolmux's own client: discovery from the challenge, client credentials, the token.
    let store = tempfile::tempdir().unwrap();
    let mut config = McpServerConfig::remote(TransportKind::Http, resource.clone());
    config.oauth = Some(OAuthConfig {
        grant: Some(OAuthGrant::ClientCredentials),
        client_id: Some("toolmux".into()),
        client_secret: Some("s3cret".into()),
        token_store: Some(store.path().to_path_buf()),
        ..OAuthConfig::default()
    });
    let client = McpProvider::new("gw", config).unwrap();
    client.warmup().await.unwrap();
    let tools = client.list_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "echo"), "{tools:?}");
    let out = client.call("echo", json!({"x": 1}), &CallContext::new()).await.unwrap();
    assert_eq!(out.to_text(), r#"{"x":1}"#);
    client.shutdown().await.unwrap();

    // Everyone else is refused, with a challenge pointing to the metadata.
    let http = reqwest::Client::new();
    let post = |token: Option<String>| {
        let mut request = http
            .post(&resource)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let refused = post(None).await.unwrap();
    assert_eq!(refused.status(), 401);
    let challenge = refused.headers()["www-authenticate"].to_str().unwrap().to_owned();
    let metadata_url = format!("http://{bound}/.well-known/oauth-protected-resource/mcp");
    assert!(challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")), "{challenge}");
    let metadata: Value = http.get(&metadata_url).send().await.unwrap().json().await.unwrap();
    assert_eq!(metadata["authorization_servers"], json!([issuer]));
    assert_eq!(metadata["resource"], json!(resource));

    let claims = |aud: &str, exp: u64, scope: &str| json!({"iss": issuer, "aud": aud, "sub": "x", "exp": exp, "scope": scope});
    let cases = [
        (
            signer.token(&claims("http://elsewhere/mcp", now() + 300, "tools")),
            401,
            "another resource",
        ),
        (signer.token(&claims(&resource, now() - 3600, "tools")), 401, "expired"),
        (Signer::new().token(&claims(&resource, now() + 300, "tools")), 401, "signature"),
        ("not.a.jwt".to_owned(), 401, "not a JWT"),
        (signer.token(&claims(&resource, now() + 300, "other")), 403, "insufficient_scope"),
        // A token naming no one would share its holder with every other such token.
        (
            signer.token(
                &json!({"iss": issuer, "aud": resource, "exp": now() + 300, "scope": "tools"}),
            ),
            401,
            "names no subject",
        ),
    ];
    for (token, status, why) in cases {
        let response = post(Some(token)).await.unwrap();
        assert_eq!(response.status(), status, "{why}");
        let challenge = response.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(
            challenge.contains(why) || response.text().await.unwrap().contains(why),
            "{why}: {challenge}"
        );
    }
    // A good token passes to the MCP layer (which wants an `initialize` first).
    let accepted =
        post(Some(signer.token(&claims(&resource, now() + 300, "tools")))).await.unwrap();
    assert!(![401, 403].contains(&accepted.status().as_u16()), "{}", accepted.status());
    assert!(accepted.headers().get("www-authenticate").is_none());

    shutdown.cancel();
    served.await.unwrap().unwrap();
}

/// An authorization server of opaque tokens: its metadata names its introspection
/// endpoint, which answers for `gateway:gw-s3cret` only and counts the questions.
async fn introspecting_server(
    resource: String,
    asked: Arc<std::sync::atomic::AtomicUsize>,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let metadata = json!({
        "issuer": base,
        "token_endpoint": format!("{base}/token"),
        "introspection_endpoint": format!("{base}/introspect"),
        "response_types_supported": ["code"],
    })
    .to_string();
    let issuer = base.clone();
    let router = axum::Router::new()
        .route("/.well-known/oauth-authorization-server", json_get(metadata))
        .route(
            "/introspect",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
                let (issuer, resource, asked) = (issuer.clone(), resource.clone(), asked.clone());
                async move {
                    asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    // `gateway:gw-s3cret`
                    let basic = headers
                        .get("authorization")
                        .is_some_and(|v| v.as_bytes() == b"Basic Z2F0ZXdheTpndy1zM2NyZXQ=");
                    if !basic {
                        return (
                            axum::http::StatusCode::UNAUTHORIZED,
                            r#"{"error":"invalid_client"}"#.to_owned(),
                        );
                    }
                    let token = body
                        .split('&')
                        .filter_map(|p| p.split_once('='))
                        .find(|(k, _)| *k == "token")
                        .map(|(_, v)| percent_decode(v))
                        .unwrap_or_default();
                    let active = |sub: &str, aud: &str, scope: &str| {
                        json!({"active": true, "iss": issuer, "aud": aud, "sub": sub,
                            "exp": now() + 300, "scope": scope, "token_type": "Bearer"})
                    };
                    let answer = match token.as_str() {
                        "opaque good/token+1" => active("alice", &resource, "tools read"),
                        "narrow" => active("bob", &resource, "read"),
                        "elsewhere" => active("carol", "http://elsewhere/mcp", "tools"),
                        "boom" => {
                            return (
                                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                                "{}".to_owned(),
                            );
                        }
                        _ => json!({"active": false}),
                    };
                    (axum::http::StatusCode::OK, answer.to_string())
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}

/// `serve.oauth.introspection`: opaque tokens are asked about at the authorization
/// server's introspection endpoint (found in its metadata), with this server's client
/// credentials; inactive, foreign and narrow tokens are refused as JWTs are, answers are
/// kept (a token asked about once), and an endpoint that fails is a 503 without a
/// challenge, not a refusal of the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_tokens_are_introspected_at_the_authorization_server() {
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let issuer = introspecting_server(resource.clone(), asked.clone()).await;
    let config = |secret: &str| ResourceServerConfig {
        issuer: issuer.clone(),
        resource: resource.clone(),
        jwks_uri: None,
        scopes: vec!["tools".into()],
        introspection: Some(toolmux_mcp::server::IntrospectionConfig {
            url: None,
            client_id: "gateway".into(),
            client_secret: secret.into(),
            cache_ms: None,
        }),
    };
    let verifier = TokenVerifier::new(config("gw-s3cret")).await.unwrap();
    let (_, shutdown, served) = gateway(port, verifier).await;
    let http = reqwest::Client::new();
    let post = |token: &str| {
        http.post(&resource)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(token)
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#)
            .send()
    };
    let accepted = post("opaque good/token+1").await.unwrap();
    assert_eq!(accepted.status(), 200, "{:?}", accepted.text().await);
    let again = post("opaque good/token+1").await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1, "the answer is kept");

    let cases = [
        ("revoked", 401, "not active"),
        ("elsewhere", 401, "another resource"),
        ("narrow", 403, "insufficient_scope"),
    ];
    for (token, status, why) in cases {
        let response = post(token).await.unwrap();
        assert_eq!(response.status(), status, "{token}");
        let challenge = response.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(challenge.contains(why), "{token}: {challenge}");
    }
    let failing = post("boom").await.unwrap();
    assert_eq!(failing.status(), 503);
    assert!(failing.headers().get("www-authenticate").is_none());
    assert!(failing.text().await.unwrap().contains("answered 500"));
    // Not kept: asked again.
    let before = asked.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(post("boom").await.unwrap().status(), 503);
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), before + 1);

    // Wrong client credentials: every token is unanswerable, not refused.
    let wrong = TokenVerifier::new(config("wrong")).await.unwrap();
    assert!(matches!(
        wrong.verify("opaque good/token+1").await,
        Err(toolmux_mcp::server::Refusal::Unavailable(why)) if why.contains("401")
    ));
    shutdown.cancel();
    served.await.unwrap().unwrap();
}
