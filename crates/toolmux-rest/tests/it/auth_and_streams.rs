//! Security schemes against a loopback server (API keys, bearer, basic, OAuth2 client
//! credentials with its token cache and refresh), NDJSON progress and multipart bodies.
#![allow(clippy::unwrap_used)]

use crate::common::{self, Reply, SeenRequest, serve};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, Progress, ProgressSink, ToolProvider};
use toolmux_rest::{Credentials, OpenApiConfig, RestProvider, RestToolConfig, TokenAuthMethod};

/// Echoes what arrived: request line, authorization, api key header and cookie.
fn echo(seen: &SeenRequest) -> Value {
    json!({
        "line": seen.request_line(),
        "authorization": seen.header("authorization"),
        "key": seen.header("x-api-key"),
        "cookie": seen.header("cookie"),
    })
}

fn secured_document(base: &str) -> Value {
    let op = |scheme: &str| json!({"get": {"operationId": scheme, "security": [{scheme: []}]}});
    json!({
        "openapi": "3.1.0", "info": {"title": "s", "version": "1"},
        "servers": [{"url": base}],
        "paths": {
            "/header": op("keyHeader"), "/query": op("keyQuery"), "/cookie": op("keyCookie"),
            "/bearer": op("bearer"), "/basic": op("basic"), "/oauth": op("oauth"),
            "/either": {"get": {"operationId": "either", "security": [{"unset": []}, {"bearer": []}]}},
            "/public": {"get": {"operationId": "public", "security": []}}
        },
        "components": {"securitySchemes": {
            "keyHeader": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            "keyQuery": {"type": "apiKey", "in": "query", "name": "api_key"},
            "keyCookie": {"type": "apiKey", "in": "cookie", "name": "sid"},
            "bearer": {"type": "http", "scheme": "bearer"},
            "basic": {"type": "http", "scheme": "basic"},
            "unset": {"type": "http", "scheme": "bearer"},
            "oauth": {"type": "oauth2", "flows": {"clientCredentials": {
                "tokenUrl": format!("{base}/token"), "scopes": {"read": "read"}}}}
        }}
    })
}

fn credentials() -> BTreeMap<String, Credentials> {
    let c = |f: &dyn Fn(&mut Credentials)| {
        let mut c = Credentials::default();
        f(&mut c);
        c
    };
    BTreeMap::from([
        ("keyHeader".to_owned(), c(&|c| c.api_key = Some("k-header".into()))),
        ("keyQuery".to_owned(), c(&|c| c.api_key = Some("k q&".into()))),
        ("keyCookie".to_owned(), c(&|c| c.api_key = Some("k+y/==".into()))),
        ("bearer".to_owned(), c(&|c| c.token = Some("t-bearer".into()))),
        (
            "basic".to_owned(),
            c(&|c| {
                c.username = Some("ann".into());
                c.password = Some("s3cret".into());
            }),
        ),
        (
            "oauth".to_owned(),
            c(&|c| {
                c.client_id = Some("client".into());
                c.client_secret = Some("client-secret".into());
                c.scopes = vec!["read".into()];
            }),
        ),
    ])
}

/// Token requests as seen: authorization header and form body.
type TokenRequests = Arc<Mutex<Vec<(Option<String>, String)>>>;

struct TokenServer {
    base: String,
    token_requests: Arc<AtomicUsize>,
    token_bodies: TokenRequests,
    /// The `Authorization` header of every API request (not a token request), in order.
    authorizations: Arc<Mutex<Vec<Option<String>>>>,
}

/// Calls `tool`, checks that the token it was sent with is redacted from the echo, and
/// returns the `Authorization` header the server saw.
async fn authorization_sent(provider: &RestProvider, server: &TokenServer, tool: &str) -> String {
    assert_eq!(call(provider, tool).await["authorization"], "Bearer REDACTED");
    server.authorizations.lock().unwrap().last().cloned().flatten().unwrap()
}

/// A server with a token endpoint issuing `tok-N` valid for `lifetime` seconds (its
/// `expires_in`, a number or a string), which rejects `tok-1` on `/oauth` once it has
/// issued `tok-2`... only when `revoke_first`.
async fn token_server(lifetime: impl Into<Value>, revoke_first: bool) -> TokenServer {
    let lifetime: Value = lifetime.into();
    let token_requests = Arc::new(AtomicUsize::new(0));
    let token_bodies: TokenRequests = Arc::default();
    let authorizations: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let (requests, bodies) = (token_requests.clone(), token_bodies.clone());
    let seen_authorizations = authorizations.clone();
    let base = serve(move |seen| {
        if seen.request_line().starts_with("POST /token") {
            let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
            let body = String::from_utf8_lossy(&seen.body).into_owned();
            bodies.lock().unwrap().push((seen.header("authorization"), body));
            return Reply::json(200, json!({"access_token": format!("tok-{n}"), "token_type": "bearer", "expires_in": lifetime}));
        }
        seen_authorizations.lock().unwrap().push(seen.header("authorization"));
        if revoke_first && seen.header("authorization").as_deref() == Some("Bearer tok-1") {
            return Reply::json(401, json!({"error": "revoked"}));
        }
        Reply::json(200, echo(&seen))
    })
    .await;
    TokenServer { base, token_requests, token_bodies, authorizations }
}

async fn provider(base: &str) -> RestProvider {
    let config = OpenApiConfig { auth: credentials(), ..OpenApiConfig::default() };
    RestProvider::openapi_from_value("secured", secured_document(base), "secured.json", &config)
        .unwrap()
}

async fn call(provider: &RestProvider, tool: &str) -> Value {
    let out = provider.call(tool, json!({}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{tool}: {}", out.to_text());
    serde_json::from_str(&out.to_text()).unwrap()
}

#[tokio::test]
async fn api_keys_bearer_and_basic_are_applied() {
    let server = token_server(3600, false).await;
    let provider = provider(&server.base).await;
    assert!(provider.warnings().is_empty(), "{:?}", provider.warnings());
    assert_eq!(call(&provider, "key_header").await["key"], "k-header");
    assert_eq!(call(&provider, "key_query").await["line"], "GET /query?api_key=k%20q%26 HTTP/1.1");
    // RFC 6265 cookie octets as they are: servers do not decode a cookie's value.
    assert_eq!(call(&provider, "key_cookie").await["cookie"], "sid=k+y/==");
    assert_eq!(call(&provider, "bearer").await["authorization"], "Bearer t-bearer");
    // base64("ann:s3cret")
    assert_eq!(call(&provider, "basic").await["authorization"], "Basic YW5uOnMzY3JldA==");
    // The first alternative has no credentials; the second is used.
    assert_eq!(call(&provider, "either").await["authorization"], "Bearer t-bearer");
    assert_eq!(call(&provider, "public").await["authorization"], Value::Null);
}

#[tokio::test]
async fn oauth_client_credentials_token_is_fetched_once_and_cached() {
    let server = token_server(3600, false).await;
    let provider = provider(&server.base).await;
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
    assert_eq!(server.token_requests.load(Ordering::SeqCst), 1);
    let bodies = server.token_bodies.lock().unwrap().clone();
    // base64("client:client-secret")
    assert_eq!(bodies[0].0.as_deref(), Some("Basic Y2xpZW50OmNsaWVudC1zZWNyZXQ="));
    assert_eq!(bodies[0].1, "grant_type=client_credentials&scope=read");
}

/// The client's id and secret are form-urlencoded before they go into HTTP Basic
/// (RFC 6749 §2.3.1), so that a secret holding `:` or letters beyond ASCII reaches a
/// conforming token endpoint as it is: the endpoint decodes both halves.
/// A token endpoint answering without end is read only up to 256 KiB, and the call fails
/// saying so (the whole answer was read into memory, and its token used).
#[tokio::test]
async fn a_token_response_is_read_only_up_to_its_cap() {
    let base = serve(|seen| {
        if !seen.request_line().starts_with("POST /token") {
            return Reply::json(200, echo(&seen));
        }
        let mut chunks = vec![(0, br#"{"access_token": "tok-big", "padding": ""#.to_vec())];
        chunks.extend((0..64).map(|_| (0, vec![b'x'; 64 * 1024])));
        chunks.push((0, br#""}"#.to_vec()));
        let headers = vec![("Content-Type".into(), "application/json".into())];
        Reply { status: 200, headers, chunks }
    })
    .await;
    let provider = provider(&base).await;
    let error = provider.call("oauth", json!({}), &CallContext::new()).await.unwrap_err();
    let report = error.report();
    assert!(
        report.contains("cannot obtain an OAuth2 token for scheme `oauth`")
            && report.contains("the token response is longer than 256 KiB"),
        "{report}"
    );
}

/// A token endpoint that answers its headers and then hangs holds up neither the call that
/// asked it nor one waiting for that token: each ends at its own timeout, and the next call
/// asks again.
#[tokio::test]
async fn a_hanging_token_endpoint_holds_every_waiter_only_to_its_timeout() {
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let base = serve(move |seen| {
        if !seen.request_line().starts_with("POST /token") {
            return Reply::json(200, echo(&seen));
        }
        count.fetch_add(1, Ordering::SeqCst);
        let headers = vec![("Content-Type".into(), "application/json".into())];
        Reply { status: 200, headers, chunks: vec![(60_000, b"{}".to_vec())] }
    })
    .await;
    let config =
        OpenApiConfig { auth: credentials(), timeout_ms: Some(300), ..OpenApiConfig::default() };
    let provider =
        RestProvider::openapi_from_value("secured", secured_document(&base), "s.json", &config)
            .unwrap();
    let ctx = CallContext::new();
    let both = futures::future::join(
        provider.call("oauth", json!({}), &ctx),
        provider.call("oauth", json!({}), &ctx),
    );
    let (first, second) = tokio::time::timeout(std::time::Duration::from_secs(20), both)
        .await
        .expect("both calls ended at their timeout");
    for result in [first, second] {
        let error = result.unwrap_err();
        assert!(matches!(error, toolmux_core::ToolError::Timeout { .. }), "{error:?}");
    }
    let third = provider.call("oauth", json!({}), &ctx).await.unwrap_err();
    assert!(matches!(third, toolmux_core::ToolError::Timeout { .. }), "{third:?}");
    assert!(asked.load(Ordering::SeqCst) >= 2, "the token was not asked for again");
}

#[tokio::test]
async fn oauth_client_credentials_are_form_encoded_for_basic() {
    let server = token_server(3600, false).await;
    let mut auth = credentials();
    let oauth = auth.get_mut("oauth").unwrap();
    oauth.client_id = Some("app id".into());
    oauth.client_secret = Some("p:ss wörd+/~".into());
    let config = OpenApiConfig { auth, ..OpenApiConfig::default() };
    let provider =
        RestProvider::openapi_from_value("s", secured_document(&server.base), "s.json", &config)
            .unwrap();
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
    let bodies = server.token_bodies.lock().unwrap().clone();
    // base64("app+id:p%3Ass+w%C3%B6rd%2B%2F%7E")
    assert_eq!(bodies[0].0.as_deref(), Some("Basic YXBwK2lkOnAlM0Fzcyt3JUMzJUI2cmQlMkIlMkYlN0U="));
    assert_eq!(bodies[0].1, "grant_type=client_credentials&scope=read");
}

/// `tokenAuthMethod: client_secret_post` sends the client's id and secret as fields of
/// the token request's form, for endpoints that read them only there, and no Basic header.
#[tokio::test]
async fn oauth_client_credentials_can_go_in_the_form() {
    let server = token_server(3600, false).await;
    let mut auth = credentials();
    let oauth = auth.get_mut("oauth").unwrap();
    oauth.client_id = Some("app id".into());
    oauth.client_secret = Some("p:ss wörd+/~".into());
    oauth.token_auth_method = TokenAuthMethod::ClientSecretPost;
    let config = OpenApiConfig { auth, ..OpenApiConfig::default() };
    let provider =
        RestProvider::openapi_from_value("s", secured_document(&server.base), "s.json", &config)
            .unwrap();
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
    let bodies = server.token_bodies.lock().unwrap().clone();
    assert_eq!(bodies[0].0, None);
    assert_eq!(
        bodies[0].1,
        "grant_type=client_credentials&scope=read&client_id=app+id\
         &client_secret=p%3Ass+w%C3%B6rd%2B%2F%7E"
    );
    let parsed: Credentials =
        serde_json::from_value(json!({"clientId": "a", "tokenAuthMethod": "client_secret_post"}))
            .unwrap();
    assert_eq!(parsed.token_auth_method, TokenAuthMethod::ClientSecretPost);
}

/// A token endpoint that refuses by echoing the request it got: the error, which is
/// logged and shown, has the client's secret redacted, whether it went in the form or in
/// the Basic header.
#[tokio::test]
async fn a_token_endpoint_echoing_the_request_does_not_put_the_secret_into_the_error() {
    let base = serve(|seen| {
        let echo = format!("{}\n{}", seen.head, String::from_utf8_lossy(&seen.body));
        if seen.request_line().starts_with("POST /token") {
            Reply::json(401, json!({"error": "invalid_client", "request": echo}))
        } else {
            Reply::json(200, json!({}))
        }
    })
    .await;
    for method in [TokenAuthMethod::ClientSecretPost, TokenAuthMethod::ClientSecretBasic] {
        let mut auth = credentials();
        let oauth = auth.get_mut("oauth").unwrap();
        oauth.client_secret = Some("p:ss wörd+/~".into());
        oauth.token_auth_method = method;
        let config = OpenApiConfig { auth, ..OpenApiConfig::default() };
        let provider =
            RestProvider::openapi_from_value("s", secured_document(&base), "s.json", &config)
                .unwrap();
        let err = provider.call("oauth", json!({}), &CallContext::new()).await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains("token endpoint answered HTTP 401"), "{text}");
        assert!(text.contains("REDACTED"), "{text}");
        for leak in ["p:ss", "p%3Ass", "Y2xpZW50OnAlM0Fzcy"] {
            assert!(!text.contains(leak), "{leak} in {text}");
        }
    }
}

#[tokio::test]
async fn oauth_tokens_near_expiry_are_refreshed() {
    let server = token_server(1, false).await;
    let provider = provider(&server.base).await;
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-2");
    assert_eq!(server.token_requests.load(Ordering::SeqCst), 2);
}

/// Endpoints write "never expires" as Java's `Long.MAX_VALUE`: the token is cached (for
/// a day at most) rather than its expiry overflowing, which panicked every call.
#[tokio::test]
async fn oauth_tokens_that_never_expire_are_cached() {
    for lifetime in [json!(9_223_372_036_854_775_807_u64), json!("9223372036854775807")] {
        let server = token_server(lifetime, false).await;
        let provider = provider(&server.base).await;
        assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
        assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
        assert_eq!(server.token_requests.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn oauth_token_rejected_with_401_is_replaced_once() {
    let server = token_server(3600, true).await;
    let provider = provider(&server.base).await;
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-2");
    assert_eq!(server.token_requests.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn secrets_stay_out_of_debug_output_and_errors() {
    let config = OpenApiConfig { auth: credentials(), ..OpenApiConfig::default() };
    let debug = format!("{config:?}");
    for secret in ["k-header", "t-bearer", "s3cret", "client-secret"] {
        assert!(!debug.contains(secret), "{secret} in {debug}");
    }
    // A token endpoint that refuses: the error names the scheme and status, no secret.
    let base = serve(|seen| {
        if seen.request_line().starts_with("POST /token") {
            Reply::json(400, json!({"error": "invalid_client"}))
        } else {
            Reply::json(200, json!({}))
        }
    })
    .await;
    let provider = provider(&base).await;
    let err = provider.call("oauth", json!({}), &CallContext::new()).await.unwrap_err();
    let text = err.to_string();
    assert_eq!(
        text,
        "`secured__oauth`: cannot obtain an OAuth2 token for scheme `oauth`: token endpoint answered HTTP 400: {\"error\":\"invalid_client\"}"
    );
}

#[tokio::test]
async fn connection_errors_keep_query_credentials_out() {
    // Nothing listens on port 1 of loopback.
    let provider = provider("http://127.0.0.1:1").await;
    let err = provider.call("key_query", json!({}), &CallContext::new()).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    let report = err.report();
    assert!(report.contains("http://127.0.0.1:1/query"), "{report}");
    assert!(!report.contains("api_key") && !report.contains("k%20q"), "{report}");
}

fn inline(tools: Value) -> RestProvider {
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(tools).unwrap();
    RestProvider::inline(&tools).unwrap()
}

#[tokio::test]
async fn ndjson_is_read_incrementally_and_reported_as_progress() {
    let base = serve(|_| Reply {
        status: 200,
        headers: vec![("Content-Type".into(), "application/x-ndjson".into())],
        chunks: vec![
            (0, b"{\"n\":1}\n{\"n\"".to_vec()),
            (30, b":2}\n".to_vec()),
            (30, b"{\"n\":3}".to_vec()),
        ],
    })
    .await;
    let provider =
        inline(json!({"events": {"description": "events", "url": format!("{base}/events")}}));
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = {
        let seen = seen.clone();
        ProgressSink::new(move |p| seen.lock().unwrap().push(p))
    };
    let ctx = CallContext::new().with_progress(sink);
    let out = provider.call("events", json!({}), &ctx).await.unwrap();
    assert_eq!(out.to_text(), r#"[{"n":1},{"n":2},{"n":3}]"#);
    let progress = seen.lock().unwrap().clone();
    let counts: Vec<f64> = progress.iter().map(|p| p.progress).collect();
    assert_eq!(counts, [1.0, 2.0, 3.0]);
    assert_eq!(progress[1].message.as_deref(), Some(r#"{"n":2}"#));
}

/// The progress messages of an NDJSON stream, which a client shows as they come, have
/// the provider's secrets redacted before they are cut to 200 characters: an API echoing
/// a key showed it, whole in a short line and its head in a long one cut across it.
#[tokio::test]
async fn ndjson_progress_messages_are_redacted_before_they_are_cut() {
    let secret = "sk-live-0123456789abcdefghijklmnopqrstuv";
    let long = format!("{{\"pad\":\"{}{secret}\"}}", "x".repeat(180));
    let lines = format!("{{\"echo\":\"{secret}\"}}\n{long}\n");
    let base = serve(move |_| Reply {
        status: 200,
        headers: vec![("Content-Type".into(), "application/x-ndjson".into())],
        chunks: vec![(0, lines.clone().into_bytes())],
    })
    .await;
    let provider =
        inline(json!({"events": {"description": "events", "url": format!("{base}/events")}}))
            .with_secrets([secret]);
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = {
        let seen = seen.clone();
        ProgressSink::new(move |p| seen.lock().unwrap().push(p))
    };
    let ctx = CallContext::new().with_progress(sink);
    provider.call("events", json!({}), &ctx).await.unwrap();
    let messages: Vec<String> =
        seen.lock().unwrap().iter().filter_map(|p| p.message.clone()).collect();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0], r#"{"echo":"REDACTED"}"#);
    assert!(messages[1].contains("REDACTED"), "{}", messages[1]);
    for message in &messages {
        assert!(!message.contains(&secret[..8]), "{message}");
    }
}

#[tokio::test]
async fn multipart_bodies_carry_files_and_fields() {
    let last: Arc<Mutex<Option<SeenRequest>>> = Arc::default();
    let base = {
        let last = last.clone();
        serve(move |seen| {
            *last.lock().unwrap() = Some(seen);
            Reply::json(200, json!({"ok": true}))
        })
        .await
    };
    let doc = json!({"openapi": "3.0.3", "info": {"title": "u", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/upload": {"post": {"operationId": "upload", "requestBody": {"content": {
            "multipart/form-data": {"schema": {"type": "object", "properties": {
                "file": {"type": "string", "format": "binary"}, "note": {"type": "string"}}}}}}}}}});
    let provider =
        RestProvider::openapi_from_value("up", doc, "up.json", &OpenApiConfig::default()).unwrap();
    let out = provider
        .call("upload", json!({"file": "file body", "note": "a note"}), &CallContext::new())
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let seen = last.lock().unwrap().clone().unwrap();
    assert!(seen.header("content-type").unwrap().starts_with("multipart/form-data; boundary="));
    let body = String::from_utf8(seen.body).unwrap();
    assert!(
        body.contains("Content-Disposition: form-data; name=\"file\"; filename=\"file\"\r\n"),
        "{body}"
    );
    assert!(body.contains("file body"), "{body}");
    assert!(
        body.contains("Content-Disposition: form-data; name=\"note\"\r\n\r\na note\r\n"),
        "{body}"
    );
}

/// A document that also lists its API key among an operation's parameters: the key is not
/// an argument the model is asked for, and only the configured one is sent, once.
#[tokio::test]
async fn a_parameter_the_credentials_supply_is_no_argument() {
    let base = serve(|seen| Reply::json(200, echo(&seen))).await;
    let key_params = json!([
        {"name": "X-API-KEY", "in": "header", "required": true, "schema": {"type": "string"}},
        {"name": "api_key", "in": "query", "required": true, "schema": {"type": "string"}},
        {"name": "q", "in": "query", "schema": {"type": "string"}}
    ]);
    let document = json!({
        "openapi": "3.0.3", "info": {"title": "k", "version": "1"}, "servers": [{"url": base}],
        "paths": {"/both": {"get": {"operationId": "both", "parameters": key_params,
            "security": [{"keyHeader": [], "keyQuery": []}]}}},
        "components": {"securitySchemes": {
            "keyHeader": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
            "keyQuery": {"type": "apiKey", "in": "query", "name": "api_key"}
        }}
    });
    let config = OpenApiConfig { auth: credentials(), ..OpenApiConfig::default() };
    let provider = RestProvider::openapi_from_value("k", document, "k.json", &config).unwrap();
    let spec = &provider.specs()[0];
    assert_eq!(spec.input_schema["properties"], json!({"q": {"type": "string"}}), "{spec:?}");
    assert!(spec.input_schema.get("required").is_none(), "{spec:?}");
    let out = provider.call("both", json!({"q": "x"}), &CallContext::new()).await.unwrap();
    let seen: Value = serde_json::from_str(&out.to_text()).unwrap();
    assert_eq!(seen["line"], "GET /both?q=x&api_key=k%20q%26 HTTP/1.1");
    assert_eq!(seen["key"], "k-header");
}

/// Operations whose security no configured credentials meet are named at load (they go
/// out without, and each call's 401 would not say why); an empty value (`${VAR:-}` of an
/// unset variable) is no credential, so no `Authorization: Bearer ` is sent.
#[tokio::test]
async fn operations_without_their_credentials_are_named_at_load() {
    let base = serve(|seen| Reply::json(200, echo(&seen))).await;
    let mut auth = BTreeMap::new();
    auth.insert(
        "bearer".to_owned(),
        Credentials { token: Some(String::new()), ..Credentials::default() },
    );
    let config = OpenApiConfig { auth, ..OpenApiConfig::default() };
    let provider =
        RestProvider::openapi_from_value("s", secured_document(&base), "secured.json", &config)
            .unwrap();
    let warnings = provider.warnings().join("\n");
    assert!(
        warnings.contains(
            "secured.json: 1 operation (`either`) needs security scheme `bearer` or `unset`, \
             and `auth` gives no credentials for any: they are sent without; set `auth: \
             {bearer: {...}}` in the import (values from the environment as `${VAR}`)"
        ),
        "{warnings}"
    );
    assert!(
        warnings.contains("1 operation (`bearer`) needs security scheme `bearer`"),
        "{warnings}"
    );
    assert_eq!(warnings.lines().count(), 7, "one line per set of schemes: {warnings}");
    assert!(!warnings.contains("`public`"), "{warnings}");
    assert_eq!(call(&provider, "bearer").await["authorization"], Value::Null);
}

/// An OAuth2 token is asked with the scopes the operation's requirement names, unless the
/// configuration sets its own; tokens of different scopes are cached apart.
#[tokio::test]
async fn oauth_tokens_carry_the_operations_scopes() {
    let server = token_server(3600, false).await;
    let mut document = secured_document(&server.base);
    document["paths"]["/write"] =
        json!({"post": {"operationId": "write", "security": [{"oauth": ["write", "read"]}]}});
    let mut auth = credentials();
    auth.get_mut("oauth").unwrap().scopes.clear();
    let config = OpenApiConfig { auth, ..OpenApiConfig::default() };
    let provider = RestProvider::openapi_from_value("s", document, "s.json", &config).unwrap();
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
    assert_eq!(authorization_sent(&provider, &server, "write").await, "Bearer tok-2");
    assert_eq!(authorization_sent(&provider, &server, "write").await, "Bearer tok-2");
    let bodies: Vec<String> =
        server.token_bodies.lock().unwrap().iter().map(|(_, body)| body.clone()).collect();
    assert_eq!(
        bodies,
        ["grant_type=client_credentials", "grant_type=client_credentials&scope=write+read"]
    );
}

/// The API's own rate limit (429, or 503 with `Retry-After`) is a rate-limited error that
/// says when to call again and what the API said; a 503 without one stays a failed result.
#[tokio::test]
async fn an_apis_rate_limit_says_when_to_call_again() {
    let base = serve(|seen| {
        let mut reply = Reply::json(429, json!({"message": "quota of 60 per hour spent"}));
        if seen.request_line().starts_with("GET /header") {
            reply.headers.push(("Retry-After".into(), "7".into()));
        } else if seen.request_line().starts_with("GET /query") {
            reply.status = 503;
            reply.headers.push(("Retry-After".into(), "120".into()));
        } else if seen.request_line().starts_with("GET /cookie") {
            reply.status = 503;
        }
        reply
    })
    .await;
    let provider = provider(&base).await;
    let ctx = CallContext::new();
    let err = provider.call("key_header", json!({}), &ctx).await.unwrap_err();
    match &err {
        toolmux_core::ToolError::RateLimited { retry_after, limit, .. } => {
            assert_eq!(*retry_after, std::time::Duration::from_secs(7));
            assert!(
                limit.contains("HTTP 429") && limit.contains("quota of 60 per hour"),
                "{limit}"
            );
        }
        other => panic!("not rate limited: {other:?}"),
    }
    assert!(err.to_string().contains("call it again in 7s"), "{err}");
    let err = provider.call("bearer", json!({}), &ctx).await.unwrap_err();
    assert!(
        matches!(err, toolmux_core::ToolError::RateLimited { retry_after, .. } if retry_after.as_secs() == 5),
        "{err:?}"
    );
    let err = provider.call("key_query", json!({}), &ctx).await.unwrap_err();
    assert!(
        matches!(err, toolmux_core::ToolError::RateLimited { retry_after, .. } if retry_after.as_secs() == 120),
        "{err:?}"
    );
    let failed = provider.call("key_cookie", json!({}), &ctx).await.unwrap();
    assert!(failed.is_error && failed.to_text().starts_with("HTTP 503"), "{failed:?}");
}

/// An `Authorization` header parameter is no argument (OpenAPI has clients ignore it; a
/// model would be asked for a credential, as importers taking every header parameter
/// do): an operation declaring one without a security scheme is named in a warning saying
/// to configure the header, and the configured header is what goes.
#[tokio::test]
async fn an_authorization_parameter_is_no_argument_and_says_where_the_header_comes_from() {
    let (base, seen) = common::keeping_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "a", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/me": {"get": {"operationId": "me", "parameters": [
            {"name": "Authorization", "in": "header", "required": true,
             "schema": {"type": "string"}},
            {"name": "verbose", "in": "query", "schema": {"type": "boolean"}}]}}}});
    let bare =
        RestProvider::openapi_from_value("a", doc.clone(), "a.json", &OpenApiConfig::default())
            .unwrap();
    assert_eq!(bare.specs()[0].input_schema["properties"], json!({"verbose": {"type": "boolean"}}));
    assert_eq!(
        bare.warnings(),
        ["a.json: 1 operation (`me`) declares an `Authorization` header parameter and no \
          security scheme; it is no argument (OpenAPI has clients ignore it, and the model \
          would be asked for a credential): set `headers: {Authorization: …}` in the import, \
          or calls go without it"]
    );
    let config = OpenApiConfig {
        headers: BTreeMap::from([("authorization".to_owned(), "Token t-1".to_owned())]),
        ..OpenApiConfig::default()
    };
    let configured = RestProvider::openapi_from_value("a", doc, "a.json", &config).unwrap();
    assert!(configured.warnings().is_empty(), "{:?}", configured.warnings());
    configured.call("me", json!({"verbose": true}), &CallContext::new()).await.unwrap();
    let request = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(request.request_line(), "GET /me?verbose=true HTTP/1.1");
    assert_eq!(request.header("authorization").as_deref(), Some("Token t-1"));
}

/// A token the provider fetched is no configured secret, so only the provider can keep it
/// out of what it returns: an API echoing the `Authorization` header in a success, in a
/// failed result or in a header shows `REDACTED` in its place.
#[tokio::test]
async fn a_fetched_token_is_redacted_from_everything_the_provider_returns() {
    let token = "at_LIVE_9fQ2xK7mWp/Zr+";
    let base = serve(move |seen| {
        if seen.request_line().starts_with("POST /token") {
            return Reply::json(200, json!({"access_token": token, "expires_in": 3600}));
        }
        let authorization = seen.header("authorization").unwrap_or_default();
        let echo = json!({"authorization": authorization, authorization.clone(): "as a key",
            "escaped": authorization.replace('/', "%2F").replace('+', "%2B")});
        if seen.request_line().starts_with("GET /oauth") {
            Reply::json(200, echo)
        } else {
            let mut reply = Reply::json(500, echo);
            reply.headers.push(("X-Echo".into(), authorization));
            reply
        }
    })
    .await;
    let mut document = secured_document(&base);
    document["paths"]["/fails"] =
        json!({"get": {"operationId": "fails", "security": [{"oauth": []}]}});
    let config = OpenApiConfig { auth: credentials(), ..OpenApiConfig::default() };
    let provider = RestProvider::openapi_from_value("s", document, "s.json", &config).unwrap();
    for tool in ["oauth", "fails"] {
        let out = provider.call(tool, json!({}), &CallContext::new()).await.unwrap();
        let shown = serde_json::to_string(&out).unwrap();
        for leak in ["9fQ2xK7mWp", "at_LIVE"] {
            assert!(!shown.contains(leak), "{tool}: {leak} in {shown}");
        }
        assert!(shown.contains("Bearer REDACTED"), "{tool}: {shown}");
    }
}

/// A relative `tokenUrl` resolves against the API's server, not against where the document
/// was read from: a document served by one host (a documentation site) whose `servers`
/// name another has the client's secret sent to the API's host only.
#[tokio::test]
async fn a_relative_token_url_resolves_against_the_server_not_the_documents_host() {
    let server = token_server(3600, false).await;
    let mut document = secured_document(&server.base);
    document["components"]["securitySchemes"]["oauth"]["flows"]["clientCredentials"]["tokenUrl"] =
        json!("/token");
    let docs_host_saw: Arc<Mutex<Vec<String>>> = Arc::default();
    let saw = docs_host_saw.clone();
    let docs_host = serve(move |seen| {
        saw.lock().unwrap().push(seen.request_line().to_owned());
        if seen.request_line().starts_with("GET /spec.json ") {
            Reply::json(200, document.clone())
        } else {
            Reply::json(200, json!({"access_token": "stolen", "expires_in": 3600}))
        }
    })
    .await;
    let config = OpenApiConfig {
        url: Some(format!("{docs_host}/spec.json")),
        auth: credentials(),
        timeout_ms: Some(10_000),
        ..OpenApiConfig::default()
    };
    let provider = RestProvider::openapi("secured", &config).await.unwrap();
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");
    assert_eq!(server.token_requests.load(Ordering::SeqCst), 1);
    assert_eq!(*docs_host_saw.lock().unwrap(), ["GET /spec.json HTTP/1.1"]);
}

/// A document from a file (or given as text) with a relative `tokenUrl` takes it relative
/// to the configured `baseUrl`; without any absolute server the call says to set one.
#[tokio::test]
async fn a_relative_token_url_of_a_file_document_resolves_against_the_base_url() {
    let server = token_server(3600, false).await;
    let mut document = secured_document("/api");
    document["components"]["securitySchemes"]["oauth"]["flows"]["clientCredentials"]["tokenUrl"] =
        json!("/token");
    let config = OpenApiConfig {
        base_url: Some(server.base.clone()),
        auth: credentials(),
        ..OpenApiConfig::default()
    };
    let provider =
        RestProvider::openapi_from_value("s", document.clone(), "s.json", &config).unwrap();
    assert_eq!(authorization_sent(&provider, &server, "oauth").await, "Bearer tok-1");

    let config = OpenApiConfig { auth: credentials(), ..OpenApiConfig::default() };
    let provider = RestProvider::openapi_from_value("s", document, "s.json", &config).unwrap();
    let error = provider.call("oauth", json!({}), &CallContext::new()).await.unwrap_err();
    let shown = error.to_string();
    assert!(shown.contains("set `baseUrl`"), "{shown}");
}

/// A call whose token is cached does not wait behind another scope's token request: the
/// endpoint stalls for the `write` scope, and a `read` call with its token cached finishes
/// while that request is still under way.
#[tokio::test]
async fn a_cached_token_is_not_held_up_by_another_scopes_slow_request() {
    let write_asked = Arc::new(tokio::sync::Notify::new());
    let asked = write_asked.clone();
    let base = serve(move |seen| {
        if !seen.request_line().starts_with("POST /token") {
            return Reply::json(200, echo(&seen));
        }
        let body = String::from_utf8_lossy(&seen.body).into_owned();
        let mut reply = Reply::json(200, json!({"access_token": "tok", "expires_in": 3600}));
        if body.contains("scope=write") {
            asked.notify_one();
            reply.chunks[0].0 = 5_000;
        }
        reply
    })
    .await;
    let mut document = secured_document(&base);
    document["paths"]["/write"] =
        json!({"post": {"operationId": "write", "security": [{"oauth": ["write"]}]}});
    let mut auth = credentials();
    auth.get_mut("oauth").unwrap().scopes.clear();
    let config = OpenApiConfig { auth, timeout_ms: Some(20_000), ..OpenApiConfig::default() };
    let provider = RestProvider::openapi_from_value("s", document, "s.json", &config).unwrap();
    call(&provider, "oauth").await;
    let ctx = CallContext::new();
    let slow = provider.call("write", json!({}), &ctx);
    let cached = async {
        write_asked.notified().await;
        provider.call("oauth", json!({}), &ctx).await
    };
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        tokio::select! {
            out = cached => ("cached", out),
            out = slow => ("slow", out),
        }
    })
    .await
    .expect("a call ended");
    assert_eq!(first.0, "cached", "the cached call waited for the other scope's token");
    assert!(!first.1.unwrap().is_error);
}
