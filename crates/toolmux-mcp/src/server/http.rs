//! Streamable HTTP at `/mcp`, with DNS-rebinding protection on `Host` and `Origin`.

use super::ApiKey;
use super::handler::{Gateway, Shared};
use crate::McpError;
use axum::extract::{Request, State};
use axum::http::header::{
    ACCEPT, ALLOW, AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN, RETRY_AFTER, WWW_AUTHENTICATE,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The path the MCP endpoint is served at.
pub(crate) const MCP_PATH: &str = "/mcp";

/// The axum router serving `shared` at [`MCP_PATH`], for a server bound to `bound`.
///
/// With `registry`, its sessions are recorded there, and requests of sessions other
/// replicas hold are forwarded to them (see [`super::affinity`]).
pub(crate) fn router(
    shared: Arc<Shared>,
    bound: SocketAddr,
    shutdown: CancellationToken,
    registry: Option<Arc<super::affinity::Registry>>,
) -> axum::Router {
    let sessions = super::sessions::Sessions::new(
        shared.options().session_idle,
        shared.options().max_sessions,
        shutdown.child_token(),
        registry.clone(),
    );
    router_of(shared, bound, shutdown, sessions, registry)
}

/// [`router`] with the sessions of `/mcp` given.
fn router_of(
    shared: Arc<Shared>,
    bound: SocketAddr,
    shutdown: CancellationToken,
    sessions: Arc<super::sessions::Sessions>,
    registry: Option<Arc<super::affinity::Registry>>,
) -> axum::Router {
    let keyed = !shared.options().api_keys.is_empty() || shared.options().token_verifier.is_some();
    let mut hosts = allowed_hosts(&shared.options().allowed_hosts, bound, keyed);
    // The host check left off because keys guard the server: a reload that takes every key
    // away must not leave it weaker than one started without keys, which checks the
    // loopback names (see `check_host_while_keyless`).
    let left_to_keys = (hosts.is_empty() && !shared.options().allowed_hosts.is_empty())
        .then(|| Arc::<[String]>::from(shared.options().allowed_hosts.clone()));
    // Other replicas forward requests here by the advertised name.
    if let Some(host) = registry.as_ref().and_then(|r| r.host())
        && !hosts.is_empty()
        && !hosts.contains(&host)
    {
        hosts.push(host);
    }
    let origins = allowed_origins(&hosts);
    // rmcp's checks guard `/mcp`; the API beside it checks the same hosts itself.
    let api = super::api::routes(shared.clone(), hosts.clone(), shutdown.clone());
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown)
        .with_allowed_hosts(hosts.clone());
    // An empty list switches rmcp's checks off; toolmux only does that when asked to by
    // an empty `allowed_hosts`.
    if !hosts.is_empty() {
        config = config.with_allowed_origins(origins).enforce_origin_validation();
    }
    let factory_keys = shared.options().api_keys.clone();
    let verifier = shared.options().token_verifier.clone();
    let metrics = shared.options().metrics.clone();
    let health_shared = shared.clone();
    let factory_shared = shared;
    let service = StreamableHttpService::new(
        move || Ok(Gateway::new(factory_shared.clone())),
        sessions.clone(),
        config,
    );
    let forwarding = registry.and_then(|registry| {
        super::affinity::Forwarding::new(
            sessions.clone(),
            health_shared.clone(),
            registry,
            Arc::from(hosts.clone()),
        )
    });
    let holders = sessions.clone();
    let mut service = axum::Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn_with_state(sessions, explain_refusals));
    // Outside rmcp's checks and the explanations: a request of a session held elsewhere
    // is answered by its holder, as it answers it.
    if let Some(forwarding) = forwarding {
        service = service.layer(axum::middleware::from_fn_with_state(
            forwarding,
            super::affinity::forward_foreign,
        ));
    }
    // Outermost: which session a request names must be clear before it is looked up.
    let service = service.layer(axum::middleware::from_fn(refuse_two_sessions));
    let mut router = axum::Router::new().nest_service(MCP_PATH, service).merge(api);
    // `/metrics` and `/health` name every tool and provider: a page that rebinds a name
    // to this server must not read them either.
    let host_check =
        axum::middleware::from_fn_with_state(Arc::<[String]>::from(hosts), super::api::check_host);
    if let Some(metrics) = metrics {
        router = router.route(
            METRICS_PATH,
            axum::routing::get(move || {
                let text = metrics.render();
                async move {
                    let kind = "text/plain; version=0.0.4; charset=utf-8";
                    ([(CONTENT_TYPE, HeaderValue::from_static(kind))], text)
                }
            })
            .layer(host_check.clone()),
        );
    }
    // Always in place: keys may be given by a reload after the server started without.
    let access = Arc::new(Access { keys: factory_keys, verifier: verifier.clone() });
    let health_access = access.clone();
    let keyless_access = access.clone();
    // Inside the key check (layers run outermost last added): the holder is known.
    router =
        router.layer(axum::middleware::from_fn_with_state(holders, keep_sessions_to_their_holder));
    router = router.layer(axum::middleware::from_fn_with_state(access, check_key));
    // Added after the key check: probes carry no key.
    let mut router = router.route(
        HEALTH_PATH,
        axum::routing::get(move |headers: HeaderMap| {
            health(health_shared.clone(), health_access.clone(), headers)
        })
        .layer(host_check),
    );
    // Where clients learn which authorization server issues tokens (RFC 9728): at the
    // root and at the resource's path.
    if let Some(verifier) = verifier {
        let metadata = verifier.metadata();
        for path in [RESOURCE_METADATA.to_owned(), format!("{RESOURCE_METADATA}{MCP_PATH}")] {
            let metadata = metadata.to_string();
            router = router.route(
                &path,
                axum::routing::get(move || async move {
                    ([(CONTENT_TYPE, HeaderValue::from_static("application/json"))], metadata)
                }),
            );
        }
    }
    match left_to_keys {
        // Outermost: before `/mcp`'s own checks, the API, the probes and the metadata.
        Some(hosts) => router.layer(axum::middleware::from_fn_with_state(
            (keyless_access, hosts),
            check_host_while_keyless,
        )),
        None => router,
    }
}

/// On a server whose host check was left to its keys (every interface, only the loopback
/// names allowed, keys given at the start), checks `Host` and `Origin` against the loopback
/// names while no key and no authorization server guard it: a `--watch` reload may take
/// every key away (with `--no-auth`), and a page that rebinds a name to this server must
/// not then call its tools.
async fn check_host_while_keyless(
    State((access, hosts)): State<(Arc<Access>, Arc<[String]>)>,
    request: Request,
    next: Next,
) -> Response {
    if access.keys.is_empty() && access.verifier.is_none() {
        return super::api::check_host(State(hosts), request, next).await;
    }
    next.run(request).await
}

/// Corrects rmcp's answers at `/mcp`, so that a client can tell what went wrong and what
/// to do:
/// - A body that is no JSON-RPC message (rmcp: `415`, which says the media type was wrong,
///   and a line of text) is `400` with a JSON-RPC error: `-32700` for a body that is not
///   JSON, `-32600` for JSON that is no single message (a batch, which MCP dropped in
///   2025-06-18, or an object of no message's form, naming the field of the wrong form:
///   see [`super::malformed`]).
/// - An `initialize` whose `params` are not an initialize's (rmcp: `400` saying a session
///   id is missing) is `400` with `-32602`, naming the field.
/// - `DELETE` of a session that is gone (rmcp: `202`) is `404`, as every other request
///   naming it is; of a live session it is `200` (rmcp: `202`, which the Python SDK's
///   client logs as a failed termination: it takes `200` or `204` as ended, `405` as
///   termination refused).
/// - A request of a session whose rmcp worker ended (rmcp: `500`) is `404`, so that its
///   client starts another session.
/// - An `initialize` refused for want of room, every session the server may hold being in
///   use (rmcp: `500`), is `503` with `Retry-After`.
/// - A `GET` resuming after an event of another session's stream (rmcp: `200` and an empty
///   stream) is `400`.
/// - rmcp's refusals in plain text (`400`, `403`, `404`, `405`, `406`, `415`) are JSON-RPC
///   errors saying what was wrong and what to send (the `Host` or `Origin` refused and how
///   to allow it, the methods served), with the request's id when it has one.
///
/// And refuses what rmcp took: a body in another charset than UTF-8 (`415`).
///
/// And one of its refusals: an `Accept` of wildcards covering the types a request needs
/// (`*/*`) is taken as naming them (rmcp: `406`).
async fn explain_refusals(
    State(sessions): State<Arc<super::sessions::Sessions>>,
    mut request: Request,
    next: Next,
) -> Response {
    use rmcp::transport::streamable_http_server::SessionManager as _;
    // HTTP's wildcards accept what they cover (`*/*`, `application/*` with `text/*`); rmcp
    // wants the types named, and answered such a client 406.
    let method = request.method().clone();
    let wanted: &[&str] = match method {
        axum::http::Method::POST => &["application/json", "text/event-stream"],
        axum::http::Method::GET => &["text/event-stream"],
        _ => &[],
    };
    if let Some(accept) = request.headers().get(ACCEPT).and_then(|v| v.to_str().ok())
        && !wanted.is_empty()
        && wanted.iter().all(|kind| accepts(accept, kind))
        && let Ok(named) = HeaderValue::from_str(&wanted.join(", "))
    {
        request.headers_mut().insert(ACCEPT, named);
    }
    let session: Option<Arc<str>> =
        request.headers().get(MCP_SESSION_ID).and_then(|v| v.to_str().ok()).map(Arc::from);
    // Looked up before rmcp ends it; answered after rmcp's checks (host, origin) passed.
    let deleting_none = match &session {
        Some(id) if method == axum::http::Method::DELETE => {
            !sessions.has_session(id).await.unwrap_or(true)
        }
        _ => false,
    };
    // Refused in `Sessions::resume` (no event of it is replayed), and answered here.
    let foreign_resume = match (&session, request.headers().get(LAST_EVENT_ID)) {
        (Some(id), Some(last)) if method == axum::http::Method::GET => {
            sessions.check_resume(id, last.to_str().unwrap_or_default())
        }
        _ => None,
    };
    // Named in a refusal of them (rmcp's 403 says only that one was not allowed).
    let (host, origin) = {
        let header = |name| {
            let value = request.headers().get(name).map(|v| String::from_utf8_lossy(v.as_bytes()));
            value.map(|v| v.chars().take(200).collect::<String>())
        };
        (header(HOST), header(ORIGIN))
    };
    let json = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/json"));
    // A POST's body is read here, so that a refusal can name the request's id.
    let mut body = bytes::Bytes::new();
    if method == axum::http::Method::POST {
        let (parts, whole) = request.into_parts();
        body = match read_body(whole).await {
            Ok(body) => body,
            Err(refusal) => return refusal,
        };
        request = Request::from_parts(parts, axum::body::Body::from(body.clone()));
    }
    // rmcp reads every body as UTF-8, whatever charset the client said it sent.
    if let Some(charset) = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .filter(|_| json)
        .and_then(foreign_charset)
    {
        let why = format!(
            "Unsupported Media Type: the body is `charset={charset}`; a JSON-RPC message is \
             UTF-8, sent with `Content-Type: application/json` (or `; charset=utf-8`)"
        );
        return json_rpc_refusal(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            -32600,
            why,
            request_id(&body),
        );
    }
    let response = next.run(request).await;
    let id = || request_id(&body);
    if deleting_none && response.status().is_success() {
        return session_not_found(serde_json::Value::Null);
    }
    let mut response = response;
    if method == axum::http::Method::DELETE && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    if let Some(why) = foreign_resume
        && response.status().is_success()
    {
        return json_rpc_refusal(StatusCode::BAD_REQUEST, -32600, why, serde_json::Value::Null);
    }
    // rmcp's 500 for a session whose worker ended, which `Sessions` then forgot.
    if response.status() == StatusCode::INTERNAL_SERVER_ERROR
        && let Some(session) = &session
        && !sessions.has_session(session).await.unwrap_or(true)
    {
        return session_not_found(id());
    }
    // rmcp's 500 for a session it could not make: every session the server may hold is
    // in use (`Sessions::make_room`).
    if response.status() == StatusCode::INTERNAL_SERVER_ERROR && session.is_none() {
        let (parts, text) = response.into_parts();
        let Ok(text) = axum::body::to_bytes(text, 64 * 1024).await else {
            return Response::from_parts(parts, axum::body::Body::empty());
        };
        if !String::from_utf8_lossy(&text).contains(super::sessions::FULL) {
            return Response::from_parts(parts, axum::body::Body::from(text));
        }
        let why = format!(
            "Service Unavailable: the server holds as many MCP sessions as it may ({}) and \
             every one is in use; try again after {} s, or end sessions no longer needed \
             with DELETE",
            sessions.max(),
            FULL_RETRY_AFTER.as_secs()
        );
        let mut refusal = json_rpc_refusal(StatusCode::SERVICE_UNAVAILABLE, -32000, why, id());
        refusal.headers_mut().insert(RETRY_AFTER, HeaderValue::from(FULL_RETRY_AFTER.as_secs()));
        return refusal;
    }
    let status = response.status();
    let explained = [
        StatusCode::BAD_REQUEST,
        StatusCode::FORBIDDEN,
        StatusCode::NOT_FOUND,
        StatusCode::METHOD_NOT_ALLOWED,
        StatusCode::NOT_ACCEPTABLE,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
    ];
    let plain =
        !response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
            v.starts_with("application/json") || v.starts_with("text/event-stream")
        });
    if !explained.contains(&status) || !plain {
        return response;
    }
    let (parts, text) = response.into_parts();
    let Ok(text) = axum::body::to_bytes(text, 64 * 1024).await else {
        return Response::from_parts(parts, axum::body::Body::empty());
    };
    let text = String::from_utf8_lossy(&text);
    if let Some(why) = text.strip_prefix("fail to deserialize request body ")
        && json
        && status == StatusCode::UNSUPPORTED_MEDIA_TYPE
    {
        // A field of the wrong form is named; rmcp's reason names only the forms it tried.
        if let Some(field) = super::malformed::wrong_field(&body) {
            let message = format!("Invalid Request: {field}");
            return json_rpc_refusal(StatusCode::BAD_REQUEST, -32600, message, id());
        }
        let (code, message) = no_message(why);
        return json_rpc_refusal(StatusCode::BAD_REQUEST, code, message, id());
    }
    // rmcp takes an `initialize` whose params are not an initialize's for another request,
    // and says a session id is missing.
    if status == StatusCode::BAD_REQUEST
        && session.is_none()
        && text.contains("Session ID is required")
        && let Some(why) = super::malformed::initialize_params(&body)
    {
        let message = format!("Invalid params: {why}");
        return json_rpc_refusal(StatusCode::BAD_REQUEST, -32602, message, id());
    }
    if status == StatusCode::NOT_FOUND {
        return session_not_found(id());
    }
    let allow = parts.headers.get(ALLOW).cloned();
    let message = match status {
        StatusCode::FORBIDDEN => forbidden(text.trim(), host.as_deref(), origin.as_deref()),
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = allow.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("POST");
            format!(
                "Method Not Allowed: `{method}` is not served at `/mcp`, which takes {allowed} \
                 (POST sends a message, GET opens the session's event stream, DELETE ends the \
                 session)"
            )
        }
        _ => explain(status, &method, text.trim()),
    };
    let mut refusal = json_rpc_refusal(status, -32600, message, id());
    if let Some(allow) = allow {
        refusal.headers_mut().insert(ALLOW, allow);
    }
    refusal
}

/// Refuses a request with more than one `Mcp-Session-Id` header (`400`): rmcp, the
/// session's holder check and the forwarding to another replica each took the first,
/// which need not be the one the client meant.
async fn refuse_two_sessions(request: Request, next: Next) -> Response {
    let named = request.headers().get_all(MCP_SESSION_ID).iter().count();
    if named > 1 {
        let why = format!(
            "Bad Request: the request has {named} `Mcp-Session-Id` headers; send one, the id \
             the `initialize` response gave"
        );
        return json_rpc_refusal(StatusCode::BAD_REQUEST, -32600, why, serde_json::Value::Null);
    }
    next.run(request).await
}

/// The charset a `Content-Type` value names other than UTF-8 (`latin1` of
/// `application/json; charset=latin1`); `None` when it names none or UTF-8.
fn foreign_charset(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|parameter| {
        let (name, value) = parameter.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("charset") {
            return None;
        }
        let value = value.trim().trim_matches('"');
        let utf8 = value.eq_ignore_ascii_case("utf-8") || value.eq_ignore_ascii_case("utf8");
        (!utf8).then(|| value.chars().take(40).collect())
    })
}

/// What rmcp's `403` (`text`) of a request with `Host` `host` and `Origin` `origin` means,
/// and how to be served.
fn forbidden(text: &str, host: Option<&str>, origin: Option<&str>) -> String {
    let allow = "`--allowed-host` or `serve.allowedHosts`";
    if text.contains("Host") {
        let host = host.unwrap_or_default();
        format!(
            "Forbidden: this server does not answer to the `Host` `{host}` (protection against \
             DNS rebinding); connect by 127.0.0.1, localhost, ::1 or the address it is bound to, \
             or allow the name with {allow}"
        )
    } else if text.contains("Invalid Origin") {
        "Forbidden: the `Origin` header is not an origin (`http://host[:port]`)".to_owned()
    } else if text.contains("Origin") {
        let origin = origin.unwrap_or_default();
        format!(
            "Forbidden: a page from `{origin}` may not call this server (protection against \
             DNS rebinding); allow that host with {allow}"
        )
    } else {
        text.to_owned()
    }
}

/// When a client refused a session for want of room is told to try again.
const FULL_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The header a client resumes a stream with.
const LAST_EVENT_ID: &str = "last-event-id";

/// Bodies over this are refused, as rmcp refuses them.
const BODY_MAX: usize = 4 * 1024 * 1024;

/// A request's body, whole; a refusal when it is too long or cannot be read.
pub(crate) async fn read_body(body: axum::body::Body) -> Result<bytes::Bytes, Response> {
    use futures::StreamExt as _;
    let mut chunks = body.into_data_stream();
    let mut whole = bytes::BytesMut::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            let why = format!("Bad Request: the body could not be read ({e})");
            json_rpc_refusal(StatusCode::BAD_REQUEST, -32600, why, serde_json::Value::Null)
        })?;
        if whole.len() + chunk.len() > BODY_MAX {
            let why = format!(
                "Payload Too Large: the body is over {} MiB, the most a message may have",
                BODY_MAX >> 20
            );
            return Err(json_rpc_refusal(
                StatusCode::PAYLOAD_TOO_LARGE,
                -32600,
                why,
                serde_json::Value::Null,
            ));
        }
        whole.extend_from_slice(&chunk);
    }
    Ok(whole.freeze())
}

/// The id of the JSON-RPC request in `body`, when it has a string or integer one; else
/// `null`.
pub(crate) fn request_id(body: &[u8]) -> serde_json::Value {
    #[derive(serde::Deserialize)]
    struct Peek {
        id: Option<serde_json::Value>,
    }
    serde_json::from_slice::<Peek>(body)
        .ok()
        .and_then(|peek| peek.id)
        .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
        .unwrap_or_default()
}

/// The error of a body that is no JSON-RPC message, from serde's reason `why`.
fn no_message(why: &str) -> (i32, String) {
    // serde's errors of a value of the wrong form, as opposed to text that is not JSON.
    const FORM: [&str; 9] = [
        "invalid type",
        "invalid value",
        "invalid length",
        "missing field",
        "unknown field",
        "unknown variant",
        "duplicate field",
        "unrecognized",
        "data did not match",
    ];
    if FORM.iter().any(|form| why.starts_with(form)) {
        let message = format!(
            "Invalid Request: the body is no JSON-RPC request, notification or response \
             ({why}); send one message a POST (MCP has no batch since 2025-06-18)"
        );
        (-32600, message)
    } else {
        (-32700, format!("Parse error: the body is not JSON ({why})"))
    }
}

/// What a plain refusal of rmcp's (`text`, with `status`, of a request with `method`)
/// means, and what the client should send instead.
fn explain(status: StatusCode, method: &axum::http::Method, text: &str) -> String {
    match status {
        StatusCode::NOT_ACCEPTABLE if *method == axum::http::Method::GET => {
            "Not Acceptable: a GET opens the session's event stream; send `Accept: \
             text/event-stream`"
                .to_owned()
        }
        StatusCode::NOT_ACCEPTABLE => "Not Acceptable: a POST is answered with JSON or an event \
             stream; send `Accept: application/json, text/event-stream`"
            .to_owned(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "Unsupported Media Type: the body is a JSON-RPC \
             message; send it with `Content-Type: application/json`"
            .to_owned(),
        _ if text.contains("Session ID is required") => "Bad Request: no `Mcp-Session-Id` \
             header; send the one the `initialize` response gave with every later request, or \
             start a session with an `initialize` request"
            .to_owned(),
        _ if text.contains("MCP-Protocol-Version") => {
            let known: Vec<&str> =
                rmcp::model::ProtocolVersion::KNOWN_VERSIONS.iter().map(|v| v.as_str()).collect();
            format!(
                "{text}; send the revision `initialize` agreed on in `MCP-Protocol-Version`, one \
                 of {}",
                known.join(", ")
            )
        }
        _ => text.to_owned(),
    }
}

/// `404` with a JSON-RPC error of request `id`: the session named is not (or no longer)
/// served.
pub(crate) fn session_not_found(id: serde_json::Value) -> Response {
    let message = "session not found: the session named in `Mcp-Session-Id` ended or never \
                   was; start a new one with an `initialize` request without `Mcp-Session-Id`";
    json_rpc_refusal(StatusCode::NOT_FOUND, -32600, message.to_owned(), id)
}

/// A refusal with `status` and a JSON-RPC error of request `id` (`null` when unknown).
fn json_rpc_refusal(
    status: StatusCode,
    code: i32,
    message: String,
    id: serde_json::Value,
) -> Response {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Where the protected resource metadata is served.
const RESOURCE_METADATA: &str = "/.well-known/oauth-protected-resource";

/// Who may use the server: API keys, and tokens of an authorization server.
#[derive(Debug)]
struct Access {
    keys: super::ApiKeys,
    verifier: Option<Arc<super::TokenVerifier>>,
}

/// Where liveness is told.
pub(crate) const HEALTH_PATH: &str = "/health";

/// Where statistics are served.
pub(crate) const METRICS_PATH: &str = "/metrics";

/// 200 while the provider lists its tools (within 5 s), else 503. The body gives the
/// number of tools, whether a provider is not healthy (`"degraded": true`, still 200: the
/// gateway serves the other providers' tools, and a load balancer taking it out for one
/// dead upstream would take all of them away) and, to whoever may see them, each
/// provider's state by namespace (names and states only). Probes carry no key, so when the
/// server wants keys or tokens, the providers are named only to a request with one, and
/// only those in its holder's view: their names tell what the gateway reaches.
async fn health(shared: Arc<Shared>, access: Arc<Access>, headers: HeaderMap) -> Response {
    let listed = tokio::time::timeout(Duration::from_secs(5), shared.provider().list_tools()).await;
    let (status, body) = match listed {
        Ok(Ok(tools)) => {
            let parts = shared.provider().health_by_provider();
            let degraded = parts.iter().any(|p| !p.health.ok);
            let mut body = serde_json::json!({
                "status": if degraded { "degraded" } else { "ok" },
                "degraded": degraded,
                "tools": tools.len(),
            });
            if let Some(shown) = access.shown_to(&headers).await {
                let parts = match shown {
                    None => parts,
                    Some(holder) => shared.provider_of(Some(&holder)).health_by_provider(),
                };
                let providers: serde_json::Map<String, serde_json::Value> = parts
                    .into_iter()
                    .map(|p| {
                        let health = serde_json::to_value(&p.health).unwrap_or_default();
                        (p.namespace, health)
                    })
                    .collect();
                body["providers"] = providers.into();
            }
            (StatusCode::OK, body)
        }
        // Probes carry no key: the reason goes to the log, not to whoever asks.
        Ok(Err(e)) => {
            tracing::warn!(target: "toolmux::serve", "health: listing tools failed: {}", e.report());
            (StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({"status": "unavailable"}))
        }
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"status": "unavailable", "error": "listing tools took over 5 s"}),
        ),
    };
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

impl Access {
    /// Whom the providers may be named to, for a request with `headers`: `Some(None)`
    /// to anyone (no keys, no tokens wanted), `Some(Some(holder))` to a request with a
    /// key or a valid token, `None` to the others.
    async fn shown_to(&self, headers: &HeaderMap) -> Option<Option<String>> {
        let keys = self.keys.current();
        if keys.is_empty() && self.verifier.is_none() {
            return Some(None);
        }
        let presented = presented_key(headers)?;
        if let Some(key) = matching(&keys, presented) {
            return Some(Some(key.name.clone()));
        }
        let subject = self.verifier.as_ref()?.verify(presented).await.ok()?;
        Some(Some(format!("oauth:{subject}")))
    }
}

/// Lets through requests that present one of the keys or a valid access token; refuses
/// the others with 401 (403 for a token short of scope).
async fn check_key(
    State(access): State<Arc<Access>>,
    mut request: Request,
    next: Next,
) -> Response {
    let keys = access.keys.current();
    if keys.is_empty() && access.verifier.is_none() {
        return next.run(request).await;
    }
    let presented = presented_key(request.headers());
    match presented.and_then(|given| matching(&keys, given)) {
        Some(key) => {
            tracing::debug!(target: "toolmux::serve", key = %key.name, "request with API key");
            // The handler puts the holder in the request's run id (see `KeyHolder`).
            request.extensions_mut().insert(KeyHolder(Arc::from(key.name.as_str())));
            next.run(request).await
        }
        None if access.verifier.is_some() => {
            let Some(verifier) = access.verifier.as_ref() else { return next.run(request).await };
            let metadata = resource_metadata_url(verifier);
            let scope = verifier.required_scopes().join(" ");
            let scope =
                if scope.is_empty() { String::new() } else { format!(", scope=\"{scope}\"") };
            let token = request
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim().to_owned());
            let Some(token) = token else {
                let challenge = format!("Bearer resource_metadata=\"{metadata}\"{scope}");
                return refuse(StatusCode::UNAUTHORIZED, &challenge, "an access token is required");
            };
            match verifier.verify(&token).await {
                Ok(subject) => {
                    tracing::debug!(target: "toolmux::serve", subject = %subject, "request with an access token");
                    request
                        .extensions_mut()
                        .insert(KeyHolder(Arc::from(format!("oauth:{subject}"))));
                    next.run(request).await
                }
                Err(super::Refusal::Invalid(why)) => {
                    let challenge = format!(
                        "Bearer error=\"invalid_token\", error_description=\"{why}\", resource_metadata=\"{metadata}\"{scope}"
                    );
                    refuse(
                        StatusCode::UNAUTHORIZED,
                        &challenge,
                        &format!("the access token is refused: {why}"),
                    )
                }
                Err(super::Refusal::Unavailable(why)) => {
                    // Not the token's fault: no challenge, so clients keep their token.
                    let body = serde_json::json!({
                        "jsonrpc": "2.0",
                        "id": null,
                        "error": {"code": -32603, "message": format!("{why}; try again later")},
                    });
                    let mut response =
                        (StatusCode::SERVICE_UNAVAILABLE, body.to_string()).into_response();
                    let headers = response.headers_mut();
                    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    headers.insert(RETRY_AFTER, HeaderValue::from_static("5"));
                    response
                }
                Err(super::Refusal::InsufficientScope(missing)) => {
                    let challenge = format!(
                        "Bearer error=\"insufficient_scope\", scope=\"{}\", resource_metadata=\"{metadata}\"",
                        verifier.required_scopes().join(" ")
                    );
                    refuse(
                        StatusCode::FORBIDDEN,
                        &challenge,
                        &format!("the access token lacks the scope {}", missing.join(" ")),
                    )
                }
            }
        }
        None => {
            let body = serde_json::json!({
                "jsonrpc": "2.0",
                "id": null,
                "error": {
                    "code": -32001,
                    "message": "missing or unknown API key: send `Authorization: Bearer KEY` \
                                (or `X-API-Key: KEY`) with a key the server was given",
                },
            });
            let mut response = (StatusCode::UNAUTHORIZED, body.to_string()).into_response();
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"toolmux\""));
            response
        }
    }
}

/// `{origin}/.well-known/oauth-protected-resource{path}` of the configured resource.
fn resource_metadata_url(verifier: &super::TokenVerifier) -> String {
    let resource = verifier.metadata()["resource"].as_str().unwrap_or_default().to_owned();
    match reqwest::Url::parse(&resource) {
        Ok(url) => format!(
            "{}{RESOURCE_METADATA}{}",
            url.origin().ascii_serialization(),
            url.path().trim_end_matches('/')
        ),
        Err(_) => RESOURCE_METADATA.to_owned(),
    }
}

/// A refusal with its challenge and a JSON-RPC error saying why.
fn refuse(status: StatusCode, challenge: &str, why: &str) -> Response {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": why}});
    let mut response = (status, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(value) = HeaderValue::from_str(challenge) {
        headers.insert(WWW_AUTHENTICATE, value);
    }
    response
}

/// A session belongs to the key holder that made it: another holder who presents its
/// `Mcp-Session-Id` (to open its stream of server messages, or to end it with `DELETE`)
/// is told there is no such session, as rmcp tells an unknown one. The holder is recorded
/// with the session ([`Sessions::hold`](super::sessions::Sessions::hold)) and goes when it
/// ends, however it ends. A session another replica holds is not here: that replica checks
/// the forwarded request's key again.
async fn keep_sessions_to_their_holder(
    State(sessions): State<Arc<super::sessions::Sessions>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(holder) = request.extensions().get::<KeyHolder>().map(|h| h.0.clone()) else {
        return next.run(request).await;
    };
    let presented = request.headers().get(MCP_SESSION_ID).and_then(|v| v.to_str().ok());
    if presented.and_then(|id| sessions.holder(id)).is_some_and(|owner| owner != holder) {
        tracing::warn!(target: "toolmux::serve", holder = %holder, "a request named another key holder's MCP session; refused");
        return session_not_found(serde_json::Value::Null);
    }
    let response = next.run(request).await;
    if let Some(made) = response.headers().get(MCP_SESSION_ID).and_then(|v| v.to_str().ok()) {
        sessions.hold(made, holder);
    }
    response
}

/// The header naming a streamable HTTP session.
pub(crate) const MCP_SESSION_ID: &str = "mcp-session-id";

/// Who holds the API key a request presented: runs are kept per holder (`key:NAME/…`), so
/// the audit log tells who made each call and one holder cannot name another's run.
#[derive(Debug, Clone)]
pub(crate) struct KeyHolder(pub(crate) Arc<str>);

/// The key a request presents: `Authorization: Bearer KEY`, else `X-API-Key: KEY`.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| {
        let (scheme, token) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
    });
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim))
}

/// The key equal to `given`, compared in time independent of where they differ.
fn matching<'a>(keys: &'a [ApiKey], given: &str) -> Option<&'a ApiKey> {
    let mut found = None;
    for key in keys {
        if same_bytes(key.key.as_bytes(), given.as_bytes()) && found.is_none() {
            found = Some(key);
        }
    }
    found
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The configured hosts plus the bound address, which a client naming the server by
/// that address sends as `Host`.
///
/// On an unspecified address (`0.0.0.0`, `::`) where every request needs a key or token
/// (`keyed`), and no host was added to the loopback names, any `Host` is accepted: the
/// server is there for other machines, which name it as they reach it (`192.0.2.7`,
/// `tools.lan`), and a page that rebinds a name to it has no key to call it with.
/// While a reload has left it with no key and no token check, `check_host_while_keyless`
/// checks the loopback names again.
fn allowed_hosts(configured: &[String], bound: SocketAddr, keyed: bool) -> Vec<String> {
    let only_loopback = configured.iter().all(|h| super::LOOPBACK_HOSTS.contains(&h.as_str()));
    if configured.is_empty() || (bound.ip().is_unspecified() && keyed && only_loopback) {
        return Vec::new();
    }
    let mut hosts = configured.to_vec();
    let ip = bound.ip();
    if !ip.is_unspecified() {
        let ip = ip.to_string();
        if !hosts.contains(&ip) {
            hosts.push(ip);
        }
    }
    hosts
}

/// Browser origins on the allowed hosts, any port, http or https.
fn allowed_origins(hosts: &[String]) -> Vec<String> {
    let mut origins = Vec::with_capacity(hosts.len() * 2);
    for host in hosts {
        // A configured `host:port` keeps only the host part: an origin's port is that of
        // the page, not of this server.
        let bare = match host.rsplit_once(':') {
            Some((h, port)) if !h.contains(':') && port.parse::<u16>().is_ok() => h,
            _ => host.as_str(),
        };
        let bracketed = if bare.contains(':') && !bare.starts_with('[') {
            format!("[{bare}]")
        } else {
            bare.to_owned()
        };
        origins.push(format!("http://{bracketed}:*"));
        origins.push(format!("https://{bracketed}:*"));
    }
    origins
}

/// Binds `addr`; the error names the address, and for one in use says what to choose.
pub(crate) async fn bind(server: &str, addr: SocketAddr) -> Result<TcpListener, McpError> {
    TcpListener::bind(addr).await.map_err(|source| {
        let reason = match source.kind() {
            std::io::ErrorKind::AddrInUse => {
                let mut any = addr;
                any.set_port(0);
                format!(
                    "another program is using port {}; choose another port, or {any} for any \
                     free one",
                    addr.port()
                )
            }
            _ => source.to_string(),
        };
        McpError::Listen { server: server.to_owned(), addr, reason }
    })
}

/// Serves `router` on `listener` until `shutdown` is cancelled.
pub(crate) async fn run(
    server: String,
    listener: TcpListener,
    router: axum::Router,
    shutdown: CancellationToken,
) -> Result<(), McpError> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
        .map_err(|source| McpError::Serve { server, transport: "http", source: source.into() })
}

/// Whether the `Accept` header `accept` takes `kind` (`type/subtype`), named or by a
/// wildcard that is not refused (`q=0`).
fn accepts(accept: &str, kind: &str) -> bool {
    let (main, _) = kind.split_once('/').unwrap_or((kind, ""));
    accept.split(',').any(|range| {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let refused = parts.any(|p| {
            p.trim().strip_prefix("q=").is_some_and(|q| q.trim().parse::<f32>() == Ok(0.0))
        });
        !refused && (media == kind || media == "*/*" || media == format!("{main}/*"))
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn charsets_other_than_utf8_are_named() {
        assert_eq!(foreign_charset("application/json; charset=latin1").as_deref(), Some("latin1"));
        assert_eq!(
            foreign_charset("application/json;CHARSET=\"ISO-8859-1\"").as_deref(),
            Some("ISO-8859-1")
        );
        assert_eq!(foreign_charset("application/json; charset=UTF-8"), None);
        assert_eq!(foreign_charset("application/json; charset=\"utf8\""), None);
        assert_eq!(foreign_charset("application/json"), None);
    }

    #[test]
    fn accept_wildcards_cover_what_they_name() {
        assert!(accepts("*/*", "application/json"));
        assert!(accepts("application/*, text/*", "text/event-stream"));
        assert!(accepts("text/event-stream;q=0.5", "text/event-stream"));
        assert!(!accepts("application/*", "text/event-stream"));
        assert!(!accepts("*/*;q=0", "application/json"));
        assert!(!accepts("text/html", "application/json"));
    }
    use super::*;

    #[test]
    fn keys_are_taken_from_either_header_and_compared_whole() {
        let keys = [
            ApiKey { name: "ci".into(), key: "k1-secret".into() },
            ApiKey { name: "alice".into(), key: "k2-secret".into() },
        ];
        let mut headers = HeaderMap::new();
        assert_eq!(presented_key(&headers), None);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("bearer  k2-secret "));
        assert_eq!(matching(&keys, presented_key(&headers).unwrap()).unwrap().name, "alice");
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Basic k2-secret"));
        assert_eq!(presented_key(&headers), None);
        headers.insert("x-api-key", HeaderValue::from_static("k1-secret"));
        assert_eq!(matching(&keys, presented_key(&headers).unwrap()).unwrap().name, "ci");
        assert!(matching(&keys, "k1-secre").is_none());
        assert!(matching(&keys, "k1-secreT").is_none());
        assert!(format!("{:?}", keys[0]).contains("<redacted>"));
    }

    #[test]
    fn hosts_and_origins() {
        let configured: Vec<String> =
            ["127.0.0.1", "localhost", "::1", "example.com:8080"].map(String::from).into();
        let hosts = allowed_hosts(&configured, "127.0.0.2:9000".parse().unwrap(), false);
        assert_eq!(hosts.last().map(String::as_str), Some("127.0.0.2"));
        let origins = allowed_origins(&hosts);
        assert!(origins.contains(&"http://[::1]:*".to_owned()));
        assert!(origins.contains(&"https://example.com:*".to_owned()));
        assert!(allowed_hosts(&[], "127.0.0.1:1".parse().unwrap(), false).is_empty());
        let unspecified = "0.0.0.0:1".parse().unwrap();
        assert_eq!(allowed_hosts(&configured, unspecified, true).len(), configured.len());
        // Every address, keys required, no host added: any host (other machines').
        let loopback = super::super::LOOPBACK_HOSTS.map(String::from);
        assert!(allowed_hosts(&loopback, unspecified, true).is_empty());
        // Without keys (`--no-auth`) the loopback names stay the only ones.
        assert_eq!(allowed_hosts(&loopback, unspecified, false).len(), 3);
    }

    /// The sessions of a test's `/mcp`: the default limits, ended with `shutdown`.
    fn test_sessions(shutdown: &CancellationToken) -> Arc<super::super::sessions::Sessions> {
        super::super::sessions::Sessions::new(
            Duration::from_secs(300),
            super::super::DEFAULT_MAX_SERVED_SESSIONS,
            shutdown.child_token(),
            None,
        )
    }

    /// A server on every interface whose host check was left to its keys checks the
    /// loopback names again once a reload has taken every key away: it is never weaker
    /// than one started without keys.
    #[tokio::test]
    async fn a_server_left_without_keys_checks_hosts_again() {
        use toolmux_test_support::mock::MockProvider;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let key = "k".repeat(32);
        let keys = super::super::ApiKeys::new(vec![ApiKey { name: "ci".into(), key: key.clone() }]);
        let options = super::super::ServeOptions { api_keys: keys.clone(), ..Default::default() };
        let shared = Shared::new(Arc::new(MockProvider::new("mock")), options);
        shared.naming();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // Routed as if bound to every interface; requests still come over loopback.
        let every: SocketAddr = ([0, 0, 0, 0], port).into();
        let shutdown = CancellationToken::new();
        let sessions = test_sessions(&shutdown);
        let router = router_of(shared, every, shutdown.clone(), sessions, None);
        let serving = tokio::spawn(run("test".into(), listener, router, shutdown.clone()));
        let client = reqwest::Client::new();
        let initialize = |host: String, key: Option<&str>| {
            let body = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"}}});
            let mut request = client
                .post(format!("http://127.0.0.1:{port}{MCP_PATH}"))
                .header(HOST, host)
                .header(ACCEPT, "application/json, text/event-stream")
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string());
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            async move {
                let response = tokio::time::timeout(Duration::from_secs(20), request.send())
                    .await
                    .expect("an answer within 20 s")
                    .expect("a response");
                response.status().as_u16()
            }
        };
        // Keyed: any name reaches the server, as a remote client's would.
        assert_eq!(initialize("gateway.example".into(), Some(&key)).await, 200);
        keys.replace(Vec::new());
        assert_eq!(initialize("evil.example".into(), None).await, 403);
        assert_eq!(initialize(format!("127.0.0.1:{port}"), None).await, 200);
        // Keys given again: the check is left to them again.
        keys.replace(vec![ApiKey { name: "ci".into(), key: key.clone() }]);
        assert_eq!(initialize("gateway.example".into(), Some(&key)).await, 200);
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(20), serving).await;
    }

    /// A session's key holder is kept with the session and goes with it: a holder making
    /// many sessions, which end (deleted, or ended to make room), leaves only the live
    /// ones' holders (the map beside them kept every one for an hour, and past 1024
    /// entries only dropped those idle that long); another holder is still refused a
    /// live session.
    #[tokio::test]
    async fn a_session_s_holder_goes_with_the_session() {
        use toolmux_test_support::mock::MockProvider;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (alice, bob) = ("a".repeat(32), "b".repeat(32));
        let keys = super::super::ApiKeys::new(vec![
            ApiKey { name: "alice".into(), key: alice.clone() },
            ApiKey { name: "bob".into(), key: bob.clone() },
        ]);
        let options = super::super::ServeOptions { api_keys: keys, ..Default::default() };
        let shared = Shared::new(Arc::new(MockProvider::new("mock")), options);
        shared.naming();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let bound = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let sessions = super::super::sessions::Sessions::new(
            Duration::from_secs(300),
            2,
            shutdown.child_token(),
            None,
        );
        let router = router_of(shared, bound, shutdown.clone(), sessions.clone(), None);
        let serving = tokio::spawn(run("test".into(), listener, router, shutdown.clone()));
        let url = format!("http://{bound}{MCP_PATH}");
        let client = reqwest::Client::new();
        let send =
            |method: reqwest::Method, key: &str, session: Option<&str>, body: serde_json::Value| {
                let mut request = client
                    .request(method, &url)
                    .bearer_auth(key)
                    .header(ACCEPT, "application/json, text/event-stream")
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.to_string());
                if let Some(session) = session {
                    request = request.header(MCP_SESSION_ID, session);
                }
                async move {
                    tokio::time::timeout(Duration::from_secs(20), request.send())
                        .await
                        .expect("an answer within 20 s")
                        .expect("a response")
                }
            };
        let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}});
        let mut last = String::new();
        for n in 0..12 {
            let response = send(reqwest::Method::POST, &alice, None, initialize.clone()).await;
            assert_eq!(response.status(), 200);
            last = response.headers()[MCP_SESSION_ID].to_str().unwrap().to_owned();
            let _ = response.text().await;
            if n % 2 == 0 {
                let deleted =
                    send(reqwest::Method::DELETE, &alice, Some(&last), serde_json::json!({}));
                assert!(deleted.await.status().is_success());
            }
        }
        assert_eq!(sessions.held(), 2, "only the live sessions' holders are kept");
        let ping = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        let refused = send(reqwest::Method::POST, &bob, Some(&last), ping.clone()).await;
        assert_eq!(refused.status(), 404);
        let served = send(reqwest::Method::POST, &alice, Some(&last), ping).await;
        assert_eq!(served.status(), 200);
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(20), serving).await;
    }

    /// A session whose rmcp worker ended (while its handle is still in rmcp's table, as
    /// when rmcp's keep-alive ended it, or during the drain after the worker quit) is not
    /// found, as an unknown session is, so that its client starts another: rmcp answered
    /// its requests 500. Nothing public ends a worker alone, so the test ends it through
    /// rmcp's handle of the session.
    #[tokio::test]
    async fn a_session_whose_worker_ended_is_not_found() {
        use toolmux_test_support::mock::{Behavior, MockProvider};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
        let shared = Shared::new(mock.clone(), super::super::ServeOptions::default());
        shared.naming();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let bound = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let sessions = test_sessions(&shutdown);
        let router = router_of(shared, bound, shutdown.clone(), sessions.clone(), None);
        let serving = tokio::spawn(run("test".into(), listener, router, shutdown.clone()));
        let url = format!("http://{bound}{MCP_PATH}");
        let client = reqwest::Client::new();
        let post = |body: serde_json::Value, session: Option<&str>| {
            let mut request = client
                .post(&url)
                .header(ACCEPT, "application/json, text/event-stream")
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string());
            if let Some(session) = session {
                request = request.header(MCP_SESSION_ID, session);
            }
            tokio::time::timeout(Duration::from_secs(20), request.send())
        };
        let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}}});
        let response = post(initialize, None).await.unwrap().unwrap();
        let id = response.headers()[MCP_SESSION_ID].to_str().unwrap().to_owned();
        let _ = response.text().await;
        let initialized =
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        post(initialized, Some(&id)).await.unwrap().unwrap();
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "hang", "arguments": {}}});
        let _running = post(call, Some(&id)).await.unwrap().unwrap();
        toolmux_test_support::eventually("the call to start", || async { mock.in_flight() == 1 })
            .await;
        let handle = sessions.rmcp_handle(&id).await.expect("rmcp knows the session");
        handle.close().await.unwrap();
        let ping = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
        let response = post(ping, Some(&id)).await.unwrap().unwrap();
        let status = response.status().as_u16();
        let body = response.text().await.unwrap();
        assert_eq!(status, 404, "{body}");
        let message: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(message["id"], 2, "{body}");
        assert!(message["error"]["message"].as_str().unwrap().contains("initialize"), "{body}");
        shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(20), serving).await;
    }
}
