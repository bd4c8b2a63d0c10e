//! What arguments and servers cannot make a REST tool do, against loopback servers: leave
//! the tool's path through `..` path arguments, carry credentials along a redirect to
//! another origin, or have misspelled arguments dropped silently.
#![allow(clippy::unwrap_used)]

use crate::common::{Reply, keeping_server, serve};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, ToolProvider};
use toolmux_rest::{OpenApiConfig, RestProvider, RestToolConfig};

/// A server answering `{}` that records every request line it sees.
async fn recording_server() -> (String, Arc<Mutex<Vec<String>>>) {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = lines.clone();
    let base = serve(move |request| {
        seen.lock().unwrap().push(request.request_line().to_owned());
        Reply::json(200, json!({}))
    })
    .await;
    (base, lines)
}

fn inline(tools: Value) -> RestProvider {
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(tools).unwrap();
    RestProvider::inline(&tools).unwrap()
}

/// An import of one operation, `GET /users/{id}/profile` (`get_profile`), served at `base`.
fn profile_import(base: &str) -> RestProvider {
    let doc = json!({"openapi": "3.0.3", "info": {"title": "u", "version": "1"},
        "servers": [{"url": format!("{base}/v1")}],
        "paths": {"/users/{id}/profile": {"get": {"operationId": "getProfile", "parameters": [
            {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]}}}});
    RestProvider::openapi_from_value("users", doc, "users.json", &OpenApiConfig::default()).unwrap()
}

async fn call_error(provider: &RestProvider, tool: &str, args: Value) -> String {
    provider.call(tool, args, &CallContext::new()).await.unwrap_err().to_string()
}

#[tokio::test]
async fn path_arguments_never_leave_the_tools_path() {
    let (base, lines) = recording_server().await;
    let profile = inline(json!({"profile": {"description": "a user's profile",
        "url": format!("{base}/users/${{parameters.id}}/profile")}}));
    let imported = profile_import(&base);
    for id in ["..", "."] {
        let err = call_error(&profile, "profile", json!({"id": id})).await;
        assert!(
            err.contains(&format!("path argument `id` would make the URL path segment `{id}`")),
            "{err}"
        );
        let err = call_error(&imported, "get_profile", json!({"id": id})).await;
        assert!(err.contains("path argument `id`"), "{err}");
    }
    assert_eq!(lines.lock().unwrap().len(), 0, "{:?}", lines.lock().unwrap());
    // Separators inside a value are encoded: the request stays under /users/.
    for (provider, tool) in [(&profile, "profile"), (&imported, "get_profile")] {
        let out = provider
            .call(tool, json!({"id": "../../admin?x=1#f"}), &CallContext::new())
            .await
            .unwrap();
        assert!(!out.is_error, "{}", out.to_text());
    }
    assert_eq!(
        *lines.lock().unwrap(),
        [
            "GET /users/..%2F..%2Fadmin%3Fx%3D1%23f/profile HTTP/1.1",
            "GET /v1/users/..%2F..%2Fadmin%3Fx%3D1%23f/profile HTTP/1.1"
        ]
    );
}

#[test]
fn an_argument_in_the_host_needs_the_values_it_may_take() {
    for url in [
        "http://${parameters.host}/x",
        "https://${parameters.region}.api.example.com/v1",
        "http://127.0.0.1:${parameters.port}/x",
    ] {
        let tools: BTreeMap<String, RestToolConfig> =
            serde_json::from_value(json!({"t": {"url": url}})).unwrap();
        let err = RestProvider::inline(&tools).unwrap_err().to_string();
        assert!(
            err.contains("in the host, so the model could send the request to any host"),
            "{err}"
        );
        assert!(
            err.contains("as an `enum` in the tool's parameter schema (`parametersSchema`"),
            "{err}"
        );
    }
    // A listed value that is not text, or an enum-less schema, is no list.
    for schema in [
        json!({"type": "object", "properties": {"host": {"type": "string"}}}),
        json!({"type": "object", "properties": {"host": {"enum": [{"a": 1}]}}}),
        json!({"type": "object", "properties": {"host": {"enum": []}}}),
    ] {
        let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(
            json!({"t": {"url": "http://${parameters.host}/x", "parametersSchema": schema}}),
        )
        .unwrap();
        assert!(RestProvider::inline(&tools).is_err());
    }
}

#[tokio::test]
async fn an_argument_in_the_host_takes_only_the_listed_values() {
    let (base, lines) = recording_server().await;
    let host = base.trim_start_matches("http://").to_owned();
    let provider = inline(json!({"t": {"url": "http://${parameters.host}/items/${parameters.id}",
        "parametersSchema": {"type": "object", "required": ["host", "id"], "properties": {
            "host": {"enum": [host, "127.0.0.2:1"]}, "id": {"type": "string"}}}}}));
    let out =
        provider.call("t", json!({"host": host, "id": "a/b"}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let port = host.rsplit_once(':').unwrap().1;
    for other in [format!("localhost:{port}"), "169.254.169.254".into(), format!("{host}/x")] {
        let err = call_error(&provider, "t", json!({"host": other, "id": "1"})).await;
        assert!(
            err.contains(&format!(
                "argument `host` goes into the URL's host, where only the values its `enum` \
                 lists are taken: `{host}`, `127.0.0.2:1`"
            )),
            "{err}"
        );
    }
    assert_eq!(*lines.lock().unwrap(), ["GET /items/a%2Fb HTTP/1.1"]);
}

/// Headers a server saw, by request line.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>;

/// A server recording each request's line, `X-Api-Key` and `X-Team-Token` headers, and
/// answering with `reply` (given the request line).
async fn header_recorder(reply: impl Fn(&str) -> Reply + Send + Sync + 'static) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let base = serve(move |request| {
        let line = request.request_line().to_owned();
        record.lock().unwrap().push((
            line.clone(),
            request.header("x-api-key"),
            request.header("x-team-token"),
        ));
        reply(&line)
    })
    .await;
    (base, seen)
}

fn redirect(location: &str) -> Reply {
    Reply {
        status: 302,
        headers: vec![
            ("Location".into(), location.to_owned()),
            ("Content-Length".into(), "0".into()),
        ],
        chunks: Vec::new(),
    }
}

#[tokio::test]
async fn credentials_never_follow_a_redirect_to_another_origin() {
    let (elsewhere, elsewhere_seen) = header_recorder(|_| Reply::json(200, json!({}))).await;
    let target = format!("{elsewhere}/landing?sig=abc");
    let (base, seen) = header_recorder(move |line| {
        if line.starts_with("GET /away") {
            redirect(&target)
        } else if line.starts_with("GET /near") {
            redirect("/final")
        } else {
            Reply::json(200, json!({"at": line}))
        }
    })
    .await;
    let doc = json!({"openapi": "3.1.0", "info": {"title": "r", "version": "1"},
        "servers": [{"url": base}],
        "security": [{"key": []}],
        "components": {"securitySchemes": {"key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}}},
        "paths": {"/away": {"get": {"operationId": "away"}}, "/near": {"get": {"operationId": "near"}}}});
    let config = OpenApiConfig {
        auth: BTreeMap::from([(
            "key".to_owned(),
            toolmux_rest::Credentials { api_key: Some("k-secret".into()), ..Default::default() },
        )]),
        headers: BTreeMap::from([("X-Team-Token".to_owned(), "t-secret".to_owned())]),
        ..OpenApiConfig::default()
    };
    let imported = RestProvider::openapi_from_value("r", doc, "r.json", &config).unwrap();
    let inline = inline(json!({"away": {"description": "redirected elsewhere",
        "url": format!("{base}/away"), "headers": {"X-Api-Key": "k-inline"}}}));
    let ctx = CallContext::new();
    for (provider, key) in [(&imported, "k-secret"), (&inline, "k-inline")] {
        let out = provider.call("away", json!({}), &ctx).await.unwrap();
        assert!(out.is_error);
        let origin = elsewhere.clone();
        assert_eq!(
            out.to_text(),
            format!(
                "HTTP 302 Found: redirect to another origin ({origin}) not followed: toolmux \
                 follows redirects only within the same scheme, host and port, so that this \
                 API's credentials never reach another host; the full target is in the \
                 `location` extra"
            )
        );
        assert_eq!(out.extras["status"], 302);
        assert_eq!(out.extras["location"], format!("{elsewhere}/landing?sig=abc"));
        assert_eq!(seen.lock().unwrap().last().unwrap().1.as_deref(), Some(key));
    }
    assert!(elsewhere_seen.lock().unwrap().is_empty(), "{:?}", elsewhere_seen.lock().unwrap());
    // Within the origin, redirects are followed and the credentials go along.
    let out = imported.call("near", json!({}), &ctx).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(
        seen.lock().unwrap().last().unwrap().clone(),
        (
            "GET /final HTTP/1.1".to_owned(),
            Some("k-secret".to_owned()),
            Some("t-secret".to_owned())
        )
    );
}

#[tokio::test]
async fn a_document_url_redirecting_to_another_origin_is_not_followed() {
    let (elsewhere, elsewhere_seen) = header_recorder(|_| Reply::json(200, json!({}))).await;
    let target = format!("{elsewhere}/openapi.json");
    let (base, _) = header_recorder(move |_| redirect(&target)).await;
    let config = OpenApiConfig {
        headers: BTreeMap::from([("X-Team-Token".to_owned(), "t-secret".to_owned())]),
        ..OpenApiConfig::from_url(format!("{base}/openapi.json"))
    };
    let err = RestProvider::openapi("r", &config).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "HTTP 302 Found: redirect to another origin ({elsewhere}) not followed"
        )),
        "{err}"
    );
    assert!(elsewhere_seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn arguments_nothing_takes_are_refused_unless_the_body_is_open() {
    let requests: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let record = requests.clone();
    let base = serve(move |seen| {
        let body = String::from_utf8_lossy(&seen.body).into_owned();
        record.lock().unwrap().push((seen.request_line().to_owned(), body));
        Reply::json(200, json!({}))
    })
    .await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "u", "version": "1"},
        "servers": [{"url": base}],
        "paths": {
            "/search": {"get": {"operationId": "search", "parameters": [
                {"name": "q", "in": "query", "schema": {"type": "string"}}]}},
            "/users": {"post": {"operationId": "createUser", "requestBody": {"required": true,
                "content": {"application/json": {"schema": {"type": "object",
                    "required": ["id", "name"], "properties": {
                        "id": {"type": "integer", "readOnly": true},
                        "name": {"type": "string"},
                        "password": {"type": "string", "writeOnly": true}}}}}}}},
            "/notes": {"post": {"operationId": "addNote", "requestBody": {"content": {
                "application/json": {"schema": {"type": "object", "additionalProperties": true,
                    "properties": {"text": {"type": "string"}}}}}}}}}});
    let provider =
        RestProvider::openapi_from_value("u", doc, "u.json", &OpenApiConfig::default()).unwrap();
    let specs = provider.specs();
    let schema = |name: &str| specs.iter().find(|t| t.name == name).unwrap().input_schema.clone();
    assert_eq!(schema("create_user")["additionalProperties"], false);
    assert_eq!(schema("create_user")["required"], json!(["name"]));
    assert!(schema("create_user")["properties"].get("id").is_none());
    assert!(schema("add_note").get("additionalProperties").is_none());

    let err = call_error(&provider, "search", json!({"qq": "cats"})).await;
    assert!(err.contains("unknown argument `qq`; did you mean `q`?"), "{err}");
    // `id` is readOnly: the server sets it, no caller sends it.
    let err = call_error(&provider, "create_user", json!({"id": 7, "name": "ann"})).await;
    assert!(err.contains("unknown argument `id`; the arguments are `name`, `password`"), "{err}");
    assert!(requests.lock().unwrap().is_empty(), "{:?}", requests.lock().unwrap());

    let ctx = CallContext::new();
    for (tool, args) in [
        ("create_user", json!({"name": "ann", "password": "pw"})),
        ("add_note", json!({"text": "hi", "tag": "todo"})),
    ] {
        let out = provider.call(tool, args, &ctx).await.unwrap();
        assert!(!out.is_error, "{}", out.to_text());
    }
    let seen: Vec<(String, Value)> = requests
        .lock()
        .unwrap()
        .iter()
        .map(|(line, body)| (line.clone(), serde_json::from_str(body).unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            ("POST /users HTTP/1.1".to_owned(), json!({"name": "ann", "password": "pw"})),
            ("POST /notes HTTP/1.1".to_owned(), json!({"text": "hi", "tag": "todo"})),
        ]
    );
}

#[tokio::test]
async fn empty_path_arguments_are_refused_by_name() {
    let (base, lines) = recording_server().await;
    let imported = profile_import(&base);
    let err = call_error(&imported, "get_profile", json!({"id": ""})).await;
    assert!(
        err.contains(
            "path argument `id` is empty; give it a value: an empty one would leave an empty \
             segment in the path (`/users//profile`)"
        ),
        "{err}"
    );
    assert_eq!(lines.lock().unwrap().len(), 0, "{:?}", lines.lock().unwrap());
    let out = imported.call("get_profile", json!({"id": "0"}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(*lines.lock().unwrap(), ["GET /v1/users/0/profile HTTP/1.1"]);
}

/// A call's trace goes on to the API as W3C `traceparent` and `tracestate` headers.
#[tokio::test]
async fn the_calls_trace_goes_on_as_headers() {
    let (base, seen) = keeping_server().await;
    let provider = inline(json!({"ping": {"description": "Ping.", "url": format!("{base}/ping")}}));
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ctx = CallContext::new()
        .with_trace_parent(toolmux_core::TraceParent::parse(caller))
        .with_trace_state(Some("vendor=1".into()));
    provider.call("ping", json!({}), &ctx).await.unwrap();
    provider.call("ping", json!({}), &CallContext::new()).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].header("traceparent").as_deref(), Some(caller));
    assert_eq!(seen[0].header("tracestate").as_deref(), Some("vendor=1"));
    assert_eq!(seen[1].header("traceparent"), None, "no trace, no header");
}

/// `passthroughHeaders`: the caller's request headers named go on with the tool's
/// requests; one the tool sets itself wins, and connection headers are refused at load.
#[tokio::test]
async fn named_caller_headers_go_on_with_the_request() {
    let (base, seen) = keeping_server().await;
    let provider = inline(json!({"ping": {
        "description": "Ping.",
        "url": format!("{base}/ping"),
        "headers": {"X-Fixed": "tool"},
        "passthroughHeaders": ["X-Tenant-Id", "x-fixed", "X-Absent"]
    }}));
    let ctx = CallContext::new().with_caller_headers(vec![
        ("x-tenant-id".into(), "acme".into()),
        ("x-fixed".into(), "caller".into()),
        ("x-other".into(), "not named".into()),
    ]);
    provider.call("ping", json!({}), &ctx).await.unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].header("x-tenant-id").as_deref(), Some("acme"));
    assert_eq!(seen[0].header("x-fixed").as_deref(), Some("tool"));
    assert_eq!(seen[0].header("x-other"), None);
    assert_eq!(seen[0].header("x-absent"), None);
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({"bad": {
        "description": "Bad.", "url": "http://127.0.0.1:9/", "passthroughHeaders": ["Host"]
    }}))
    .unwrap();
    let error = RestProvider::inline(&tools).unwrap_err().to_string();
    assert!(error.contains("`passthroughHeaders` names `Host`"), "{error}");
}

/// A path placeholder the document declares no parameter for is an argument all the same
/// (a required string), filled in and escaped like a declared one; it was sent as
/// `%7Bid%7D`, and the argument refused as unknown.
#[tokio::test]
async fn an_undeclared_path_placeholder_is_still_an_argument() {
    let (base, seen) = recording_server().await;
    let document = json!({
        "openapi": "3.0.3", "info": {"title": "u", "version": "1"}, "servers": [{"url": base}],
        "paths": {"/users/{userId}/items/{id}": {"get": {"operationId": "item",
            "parameters": [{"name": "userId", "in": "path", "required": true, "schema": {"type": "integer"}}]}}}
    });
    let provider =
        RestProvider::openapi_from_value("u", document, "u.json", &OpenApiConfig::default())
            .unwrap();
    let spec = &provider.specs()[0];
    assert_eq!(spec.input_schema["required"], json!(["userId", "id"]), "{spec:?}");
    assert_eq!(spec.input_schema["properties"]["id"]["type"], "string");
    let out = provider
        .call("item", json!({"userId": 7, "id": "a b"}), &CallContext::new())
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(seen.lock().unwrap().last().unwrap(), "GET /users/7/items/a%20b HTTP/1.1");
}

/// A server URL placeholder without a declared variable takes `serverVariables`, or is an
/// error naming it and the fix (it was sent as `%7Btenant%7D`).
#[tokio::test]
async fn an_undeclared_server_variable_is_taken_from_the_configuration_or_named() {
    let (base, seen) = recording_server().await;
    let document = |base: &str| {
        json!({
            "openapi": "3.0.3", "info": {"title": "t", "version": "1"},
            "servers": [{"url": format!("{base}/{{tenant}}/api")}],
            "paths": {"/ping": {"get": {"operationId": "ping"}}}
        })
    };
    let err =
        RestProvider::openapi_from_value("t", document(&base), "t.json", &OpenApiConfig::default())
            .unwrap_err()
            .to_string();
    assert!(
        err.contains(
            "has `{tenant}`, which its `variables` do not declare: set `serverVariables.tenant`"
        ),
        "{err}"
    );
    let config = OpenApiConfig {
        server_variables: [("tenant".to_owned(), "acme".to_owned())].into_iter().collect(),
        ..OpenApiConfig::default()
    };
    let provider =
        RestProvider::openapi_from_value("t", document(&base), "t.json", &config).unwrap();
    provider.call("ping", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(seen.lock().unwrap().last().unwrap(), "GET /acme/api/ping HTTP/1.1");
}

/// Without `parametersSchema`, a placeholder that stands alone as a body value takes any
/// JSON value, sent as it is (it had to be a string, so `{"count": 3}` was refused), and one
/// put in text takes a string, number or boolean.
#[tokio::test]
async fn inline_placeholders_take_the_values_their_places_take() {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let bodies = lines.clone();
    let base = serve(move |request| {
        bodies.lock().unwrap().push(String::from_utf8_lossy(&request.body).into_owned());
        Reply::json(200, json!({}))
    })
    .await;
    let provider = inline(json!({"order": {
        "description": "Order", "method": "POST", "url": format!("{base}/orders/${{parameters.shop}}"),
        "body": {"count": "${parameters.count}", "item": "${parameters.item}", "note": "n=${parameters.n}"}
    }}));
    let spec = &provider.specs()[0];
    let properties = &spec.input_schema["properties"];
    assert!(properties["count"].get("type").is_none(), "{properties}");
    assert_eq!(properties["n"]["type"], json!(["string", "number", "boolean"]));
    assert_eq!(properties["shop"]["type"], json!(["string", "number", "boolean"]));
    assert_eq!(spec.input_schema["required"], json!(["shop"]));
    let args = json!({"shop": 7, "count": 3, "item": {"sku": "a1"}, "n": true});
    let out = provider.call("order", args, &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let body: Value = serde_json::from_str(lines.lock().unwrap().last().unwrap()).unwrap();
    assert_eq!(body, json!({"count": 3, "item": {"sku": "a1"}, "note": "n=true"}));
}

/// A parameter described by JSON `content` is sent as JSON text, escaped where it goes (it
/// was spread into `key=value` pairs); a Swagger 2 body the operation `consumes` only as
/// XML is sent as XML, as given (it was sent as a JSON string).
#[tokio::test]
async fn json_content_parameters_and_xml_bodies_go_as_declared() {
    let seen: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let record = seen.clone();
    let base = serve(move |request| {
        let kind = request.header("content-type").unwrap_or_default();
        let body = String::from_utf8_lossy(&request.body).into_owned();
        record.lock().unwrap().push((request.request_line().to_owned(), kind, body));
        Reply::json(200, json!({}))
    })
    .await;
    let openapi = json!({
        "openapi": "3.0.3", "info": {"title": "j", "version": "1"}, "servers": [{"url": base}],
        "paths": {"/search": {"get": {"operationId": "search", "parameters": [{"name": "filter",
            "in": "query", "content": {"application/json": {"schema": {"type": "object"}}}}]}}}
    });
    let provider =
        RestProvider::openapi_from_value("j", openapi, "j.json", &OpenApiConfig::default())
            .unwrap();
    let args = json!({"filter": {"tag": "a b", "n": 1}});
    provider.call("search", args, &CallContext::new()).await.unwrap();
    let line = seen.lock().unwrap().last().unwrap().0.clone();
    assert_eq!(line, "GET /search?filter=%7B%22n%22%3A1%2C%22tag%22%3A%22a%20b%22%7D HTTP/1.1");

    let host = base.trim_start_matches("http://");
    let swagger = json!({
        "swagger": "2.0", "info": {"title": "x", "version": "1"}, "host": host, "schemes": ["http"],
        "paths": {"/pets": {"post": {"operationId": "addPet", "consumes": ["application/xml"],
            "parameters": [{"name": "pet", "in": "body", "required": true, "schema": {"type": "string"}}]}}}
    });
    let provider =
        RestProvider::openapi_from_value("x", swagger, "x.json", &OpenApiConfig::default())
            .unwrap();
    let spec = &provider.specs()[0];
    let name = spec.input_schema["required"][0].as_str().unwrap().to_owned();
    let args = json!({name: "<pet><name>Rex</name></pet>"});
    let out = provider.call("add_pet", args, &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let (_, kind, body) = seen.lock().unwrap().last().unwrap().clone();
    assert_eq!((kind.as_str(), body.as_str()), ("application/xml", "<pet><name>Rex</name></pet>"));
}

/// Swagger 2 form fields keep their `collectionFormat`: `csv` joins the items, `multi`
/// sends one pair each (every array went as pairs).
#[tokio::test]
async fn swagger_form_arrays_keep_their_collection_format() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let base = serve(move |request| {
        record.lock().unwrap().push(String::from_utf8_lossy(&request.body).into_owned());
        Reply::json(200, json!({}))
    })
    .await;
    let array = |format: &str| json!({"type": "array", "items": {"type": "string"}, "collectionFormat": format});
    let field = |name: &str, format: &str| {
        let mut p = array(format);
        p["name"] = json!(name);
        p["in"] = json!("formData");
        p
    };
    let swagger = json!({
        "swagger": "2.0", "info": {"title": "f", "version": "1"},
        "host": base.trim_start_matches("http://"), "schemes": ["http"],
        "paths": {"/tag": {"post": {"operationId": "tag", "consumes": ["application/x-www-form-urlencoded"],
            "parameters": [field("csv", "csv"), field("multi", "multi"), field("pipes", "pipes")]}}}
    });
    let provider =
        RestProvider::openapi_from_value("f", swagger, "f.json", &OpenApiConfig::default())
            .unwrap();
    let args = json!({"csv": ["a", "b"], "multi": ["x", "y"], "pipes": ["1", "2"]});
    provider.call("tag", args, &CallContext::new()).await.unwrap();
    assert_eq!(seen.lock().unwrap().last().unwrap(), "csv=a%2Cb&multi=x&multi=y&pipes=1%7C2");
}

/// Swagger 2's `x-nullable` on a parameter makes its schema take `null` (it was dropped).
#[test]
fn swagger_x_nullable_parameters_take_null() {
    let swagger = json!({
        "swagger": "2.0", "info": {"title": "n", "version": "1"}, "host": "127.0.0.1", "schemes": ["http"],
        "paths": {"/n": {"get": {"operationId": "n", "parameters": [
            {"name": "note", "in": "query", "type": "string", "x-nullable": true}]}}}
    });
    let provider =
        RestProvider::openapi_from_value("n", swagger, "n.json", &OpenApiConfig::default())
            .unwrap();
    assert_eq!(
        provider.specs()[0].input_schema["properties"]["note"]["type"],
        json!(["string", "null"])
    );
}

/// A parameter really named `id__query` keeps its name; the query's `id`, renamed for a
/// clash with the path's `id`, is numbered instead (it took the name, and the real
/// parameter's value went to the other).
#[tokio::test]
async fn renamed_arguments_yield_to_real_names() {
    let (base, seen) = recording_server().await;
    let param = |name: &str, place: &str| json!({"name": name, "in": place, "required": place == "path", "schema": {"type": "string"}});
    let document = json!({
        "openapi": "3.0.3", "info": {"title": "r", "version": "1"}, "servers": [{"url": base}],
        "paths": {"/a/{id}": {"get": {"operationId": "a", "parameters": [
            param("id", "path"), param("id", "query"), param("id__query", "query")]}}}
    });
    let provider =
        RestProvider::openapi_from_value("r", document, "r.json", &OpenApiConfig::default())
            .unwrap();
    let properties: Vec<String> = provider.specs()[0].input_schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(properties, ["id__path", "id__query", "id__query_2"]);
    let args = json!({"id__path": "p", "id__query": "real", "id__query_2": "q"});
    provider.call("a", args, &CallContext::new()).await.unwrap();
    assert_eq!(seen.lock().unwrap().last().unwrap(), "GET /a/p?id=q&id__query=real HTTP/1.1");
}

/// A header argument beyond ASCII (a name, `Zoë`) goes as its UTF-8 bytes, as HTTP's
/// `obs-text` allows; one holding a line break cannot be a header at all and is refused as
/// an invalid argument naming the header, not reported as a failed connection (which
/// callers retry).
#[tokio::test]
async fn header_arguments_go_as_utf8_and_line_breaks_are_refused() {
    let (base, seen) = keeping_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "h", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/greet": {"get": {"operationId": "greet", "parameters": [
            {"name": "X-Name", "in": "header", "schema": {"type": "string"}}]}}}});
    let provider =
        RestProvider::openapi_from_value("h", doc, "h.json", &OpenApiConfig::default()).unwrap();
    let out = provider.call("greet", json!({"X-Name": "Zoë"}), &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(seen.lock().unwrap()[0].header("x-name").as_deref(), Some("Zoë"));
    let err = provider
        .call("greet", json!({"X-Name": "a\r\nX-Injected: 1"}), &CallContext::new())
        .await
        .unwrap_err();
    assert!(matches!(err, toolmux_core::ToolError::InvalidArguments { .. }), "{err:?}");
    assert!(err.to_string().contains("header `x-name`"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// An API key sent in the query stays out of the result when the API redirects to
/// another origin with the query echoed (an `http` to `https` upgrade does): the
/// `location` extra, which the model and logs see, has the key's value redacted.
#[tokio::test]
async fn a_query_api_key_stays_out_of_an_unfollowed_redirects_location() {
    let base = serve(|request| {
        let target = request.request_line().split(' ').nth(1).unwrap().to_owned();
        redirect(&format!("https://127.0.0.1:1{target}"))
    })
    .await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "k", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/items": {"get": {"operationId": "items", "security": [{"key": []}],
            "parameters": [{"name": "q", "in": "query", "schema": {"type": "string"}}]}}},
        "components": {"securitySchemes": {
            "key": {"type": "apiKey", "in": "query", "name": "api_key"}}}});
    let mut config = OpenApiConfig::default();
    let key = toolmux_rest::Credentials {
        api_key: Some("s3cr3t/k=y".into()),
        ..toolmux_rest::Credentials::default()
    };
    config.auth.insert("key".into(), key);
    let provider = RestProvider::openapi_from_value("k", doc, "k.json", &config).unwrap();
    let out = provider.call("items", json!({"q": "shoes"}), &CallContext::new()).await.unwrap();
    assert!(out.is_error);
    let location = out.extras["location"].as_str().unwrap();
    assert_eq!(location, "https://127.0.0.1:1/items?q=shoes&api_key=REDACTED");
    assert!(!format!("{out:?}").contains("s3cr3t"), "{out:?}");
}

/// An inline tool's key written into its URL by the configuration (`?key=${API_KEY}`,
/// expanded before the tool sees it) or into its `query` stays out of the result when the
/// API redirects to another origin echoing the request: the `location` extra has it
/// redacted in whatever form the URL carried it (`'` and the space encoded, `/` and `=`
/// not), and the origin is left as it was.
#[tokio::test]
async fn an_inline_tools_url_key_stays_out_of_an_unfollowed_redirects_location() {
    let base = serve(|request| {
        let target = request.request_line().split(' ').nth(1).unwrap().to_owned();
        redirect(&format!("https://127.0.0.1:1{target}#{target}"))
    })
    .await;
    let key = "s3cr3t/k=y z'1";
    let token = "t0ken+value";
    let provider = inline(json!({"items": {"description": "items",
        "url": format!("{base}/items?key={key}&q=${{parameters.q}}"),
        "query": {"token": token}}}));
    let out = provider.call("items", json!({"q": "shoes"}), &CallContext::new()).await.unwrap();
    assert!(out.is_error);
    let location = out.extras["location"].as_str().unwrap();
    assert_eq!(
        location,
        "https://127.0.0.1:1/items?key=REDACTED&q=shoes&token=REDACTED\
         #/items?key=REDACTED&q=shoes&token=REDACTED"
    );
    let shown = format!("{out:?}");
    for leak in ["s3cr3t", "t0ken"] {
        assert!(!shown.contains(leak), "{shown}");
    }
}

/// An inline tool's invalid URL is named without its query and user info, which may hold
/// a key from the environment.
#[tokio::test]
async fn an_invalid_inline_url_is_named_without_its_credentials() {
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({"t": {
        "description": "t", "url": "ftp://user:pa55word@h/files?key=s3cr3t"}}))
    .unwrap();
    let err = RestProvider::inline(&tools).unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid configuration of `t`: `url` must start with http:// or https://: `ftp://h/files`"
    );
}

/// A document URL's credentials (a token in its query, a user and password before its
/// host) stay out of the import's errors and warnings, which are logged and shown.
#[tokio::test]
async fn a_document_urls_credentials_stay_out_of_errors_and_warnings() {
    let unreachable = "http://reader:pa55word@127.0.0.1:1/openapi.json?token=t0ken";
    let err = RestProvider::openapi("u", &OpenApiConfig::from_url(unreachable))
        .await
        .unwrap_err()
        .to_string();
    assert!(!err.contains("t0ken") && !err.contains("pa55word"), "{err}");
    assert!(err.contains("http://127.0.0.1:1/openapi.json"), "{err}");

    let base = serve(|_| {
        Reply::json(
            200,
            json!({"openapi": "3.0.3", "info": {"title": "w", "version": "1"},
            "paths": {"/a": {"get": {"operationId": "a"}},
                      "/b": {"get": {"operationId": "b", "parameters": [
                          {"$ref": "#/components/parameters/Missing"}]}}}}),
        )
    })
    .await;
    let url = format!("{base}/openapi.json?token=t0ken");
    let provider = RestProvider::openapi("w", &OpenApiConfig::from_url(url)).await.unwrap();
    let warnings = provider.warnings().join("\n");
    assert!(warnings.contains(&format!("{base}/openapi.json: at")), "{warnings}");
    assert!(!warnings.contains("t0ken"), "{warnings}");
}

/// A path a document writes without its leading `/` (`{tenant}/items`) still starts the
/// URL's path: an argument there cannot extend the server's host name
/// (`api.example.com` + `.evil.example`), which would send the API's credentials to a
/// host the model picked.
#[tokio::test]
async fn a_path_without_its_slash_cannot_extend_the_host() {
    let (base, lines) = recording_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "s", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"{tenant}/items": {"get": {"operationId": "items", "parameters": [
            {"name": "tenant", "in": "path", "required": true, "schema": {"type": "string"}}]}}}});
    let provider =
        RestProvider::openapi_from_value("s", doc, "s.json", &OpenApiConfig::default()).unwrap();
    let out = provider.call("items", json!({"tenant": ".evil.example"}), &CallContext::new()).await;
    assert!(out.as_ref().is_ok_and(|o| !o.is_error), "{out:?}");
    assert_eq!(*lines.lock().unwrap(), ["GET /.evil.example/items HTTP/1.1"]);
}

/// A loopback server that answers by the request's path, echoing the path as error pages
/// and redirects do: `…/missing` a 404, `…/broken` a 500, `…/limited` a 429, `…/moved` a
/// redirect to another origin, anything else `{}`. Records each request line.
async fn echoing_server() -> (String, Arc<Mutex<Vec<String>>>) {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = lines.clone();
    let base = serve(move |request| {
        let line = request.request_line().to_owned();
        seen.lock().unwrap().push(line.clone());
        let target = line.split(' ').nth(1).unwrap().to_owned();
        let echo = |status| Reply::json(status, json!({"error": format!("no route {target}")}));
        match target.rsplit('/').next().unwrap() {
            "missing" => echo(404),
            "broken" => echo(500),
            "limited" => echo(429),
            "moved" => redirect(&format!("https://127.0.0.1:1{target}#{target}")),
            _ => Reply::json(200, json!({})),
        }
    })
    .await;
    (base, lines)
}

/// Everything a call gave back, result or error, as text.
async fn shown(provider: &RestProvider, tool: &str) -> String {
    match provider.call(tool, json!({}), &CallContext::new()).await {
        Ok(output) => format!("{output:?}"),
        Err(error) => format!("{error} / {error:?}"),
    }
}

/// A bot token written into an inline tool's path by the configuration
/// (`https://api.example/bot${TOKEN}/sendMessage`, expanded before the tool sees it) is
/// sent, but stays out of what the tool shows: an error page echoing the path (4xx and
/// 5xx), a rate limit's answer, a redirect's target, a connection error's URL, and the
/// provider's `Debug`.
#[tokio::test]
async fn a_token_in_an_inline_tools_path_stays_out_of_results_and_errors() {
    let (base, lines) = echoing_server().await;
    let token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";
    let tools: Value = ["missing", "broken", "limited", "moved", "ok"]
        .iter()
        .map(|name| {
            (
                name.to_string(),
                json!({"description": name, "url": format!("{base}/bot{token}/{name}")}),
            )
        })
        .chain([(
            "down".to_owned(),
            json!({"description": "down", "url": format!("http://127.0.0.1:1/bot{token}/down")}),
        )])
        .collect::<serde_json::Map<_, _>>()
        .into();
    let provider = inline(tools);
    for tool in ["missing", "broken", "limited", "moved", "down"] {
        let shown = shown(&provider, tool).await;
        assert!(!shown.contains("AAHdq") && !shown.contains("123456789"), "{tool}: {shown}");
        assert!(shown.contains(&format!("REDACTED/{tool}")), "{tool}: {shown}");
    }
    let ok = provider.call("ok", json!({}), &CallContext::new()).await.unwrap();
    assert!(!ok.is_error, "{ok:?}");
    let moved = provider.call("moved", json!({}), &CallContext::new()).await.unwrap();
    assert_eq!(
        moved.extras["location"].as_str().unwrap(),
        "https://127.0.0.1:1/REDACTED/moved#/REDACTED/moved"
    );
    assert_eq!(
        lines.lock().unwrap()[..2],
        [format!("GET /bot{token}/missing HTTP/1.1"), format!("GET /bot{token}/broken HTTP/1.1")],
        "the requests go to the configured path"
    );
    let debug = format!("{provider:?}");
    assert!(!debug.contains("AAHdq"), "{debug}");
}

/// A value the loader took from the environment ([`RestProvider::with_secrets`]) is kept
/// out of what an import shows wherever the configuration put it, even where it does not
/// look like a credential: here a server variable filling the server URL's path
/// (`/tenants/{tenant}`), seen in an error page, a redirect's target and a connection
/// error's URL. The requests still go to its path.
#[tokio::test]
async fn a_value_from_the_environment_in_a_path_stays_out_of_results_and_errors() {
    let (base, lines) = echoing_server().await;
    let tenant = "acme-private-tenant";
    let import = |server: &str| {
        let doc = json!({"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
            "servers": [{"url": format!("{server}/tenants/{{tenant}}"),
                         "variables": {"tenant": {"default": "demo"}}}],
            "paths": {"/missing": {"get": {"operationId": "missing"}},
                      "/broken": {"get": {"operationId": "broken"}},
                      "/moved": {"get": {"operationId": "moved"}}}});
        let mut config = OpenApiConfig::default();
        config.server_variables.insert("tenant".into(), tenant.into());
        RestProvider::openapi_from_value("t", doc, "t.json", &config).unwrap().with_secrets([
            tenant,
            "ab",
            "SOME_OTHER_SECRET",
        ])
    };
    let provider = import(&base);
    for tool in ["missing", "broken", "moved"] {
        let shown = shown(&provider, tool).await;
        assert!(!shown.contains(tenant), "{tool}: {shown}");
        assert!(shown.contains(&format!("tenants/REDACTED/{tool}")), "{tool}: {shown}");
    }
    assert_eq!(
        lines.lock().unwrap()[0],
        format!("GET /tenants/{tenant}/missing HTTP/1.1"),
        "the request goes to the filled-in path"
    );
    let debug = format!("{provider:?}");
    assert!(!debug.contains(tenant), "{debug}");
    let down = shown(&import("http://127.0.0.1:1"), "missing").await;
    assert!(!down.contains(tenant), "{down}");
    assert!(down.contains("http://127.0.0.1:1/tenants/REDACTED/missing"), "{down}");
}

/// A whole number written with a fraction (`5.0`, as Python's `json.dumps` writes a float,
/// and which JSON Schema counts as an integer) goes into a path, a query, a header or a
/// form as `5`: `/items/5.0` names no item, and `limit=10.0` is refused by APIs parsing
/// integers. Other numbers go as JSON writes them.
#[tokio::test]
async fn whole_numbers_go_into_urls_without_a_fraction() {
    let (base, lines) = recording_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "n", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/items/{id}": {"get": {"operationId": "getItem", "parameters": [
            {"name": "id", "in": "path", "required": true, "schema": {"type": "integer"}},
            {"name": "limit", "in": "query", "schema": {"type": "integer"}},
            {"name": "ids", "in": "query", "schema": {"type": "array", "items": {"type": "integer"}}},
            {"name": "price", "in": "query", "schema": {"type": "number"}}]}}}});
    let imported =
        RestProvider::openapi_from_value("n", doc, "n.json", &OpenApiConfig::default()).unwrap();
    let args = json!({"id": 5.0, "limit": 10.0, "ids": [1.0, -2.0], "price": 2.5});
    imported.call("get_item", args, &CallContext::new()).await.unwrap();
    let inline = inline(json!({"item": {"description": "an item",
        "url": format!("{base}/items/${{parameters.id}}?limit=${{parameters.limit}}")}}));
    inline.call("item", json!({"id": 7.0, "limit": 1e300}), &CallContext::new()).await.unwrap();
    assert_eq!(
        *lines.lock().unwrap(),
        [
            "GET /items/5?limit=10&ids=1&ids=-2&price=2.5 HTTP/1.1",
            "GET /items/7?limit=1e%2B300 HTTP/1.1"
        ]
    );
}

/// A response over its size limit is an error saying which setting raises it; a document
/// over the most read from a URL (64 MiB, which no setting raises) says to give it as a
/// file instead. ContextForge cuts a REST response at 5,000 characters without a word,
/// which leaves JSON that no longer parses.
#[tokio::test]
async fn oversized_responses_say_how_to_get_them() {
    let base = serve(|request| {
        if request.request_line().starts_with("GET /huge.json ") {
            let body = vec![b' '; 64 * 1024 * 1024 + 1];
            Reply { status: 200, headers: Vec::new(), chunks: vec![(0, body)] }
        } else {
            Reply::json(200, json!({"items": "x".repeat(100)}))
        }
    })
    .await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "s", "version": "1"},
        "servers": [{"url": base}], "paths": {"/items": {"get": {"operationId": "listItems"}}}});
    let config = OpenApiConfig { max_response_bytes: Some(50), ..OpenApiConfig::default() };
    let provider = RestProvider::openapi_from_value("s", doc, "s.json", &config).unwrap();
    let err = call_error(&provider, "list_items", json!({})).await;
    assert_eq!(
        err,
        "`s__list_items`: response larger than 50 bytes, reading stopped: raise `maxResponseBytes` \
         (of the tool, or of its OpenAPI import) or ask the API for less, such as a page or a \
         filter"
    );
    let err = RestProvider::openapi("s", &OpenApiConfig::from_url(format!("{base}/huge.json")))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with(
            "the document is larger than 64 MiB, the most read from a URL: download it and give \
             it as a file with `spec`"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn header_parameters_of_the_message_itself_are_left_out() {
    let (base, seen) = keeping_server().await;
    let header = |name: &str| json!({"name": name, "in": "header", "schema": {"type": "string"}});
    let doc = json!({"openapi": "3.0.3", "info": {"title": "h", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/notes": {"post": {"operationId": "addNote",
            "parameters": [header("Host"), header("Content-Length"), header("Transfer-Encoding"),
                header("connection"), header("Upgrade"), header("TE"), header("Trailer"),
                header("Keep-Alive"), header("Proxy-Authorization"), header("Expect"),
                header("X-Trace")],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"text": {"type": "string"}}}}}}}}}});
    let provider =
        RestProvider::openapi_from_value("notes", doc, "notes.json", &OpenApiConfig::default())
            .unwrap();
    let tool = &provider.specs()[0];
    let mut arguments: Vec<&String> =
        tool.input_schema["properties"].as_object().unwrap().keys().collect();
    arguments.sort();
    assert_eq!(arguments, ["X-Trace", "text"]);
    let warnings = provider.warnings().join("\n");
    for name in ["Host", "Content-Length", "Transfer-Encoding", "Proxy-Authorization", "Expect"] {
        assert!(
            warnings.contains(&format!(
                "operation `POST /notes` (`addNote`): header parameter `{name}` is left out"
            )),
            "{warnings}"
        );
    }
    let err = call_error(
        &provider,
        "add_note",
        json!({"text": "hello world", "Content-Length": "5", "Host": "evil.example.com"}),
    )
    .await;
    assert!(err.contains("unknown argument"), "{err}");
    let out = provider
        .call("add_note", json!({"text": "hello world", "X-Trace": "t1"}), &CallContext::new())
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "the refused call sent nothing");
    assert_eq!(seen[0].header("host").unwrap(), base.trim_start_matches("http://"));
    assert_eq!(seen[0].header("x-trace").as_deref(), Some("t1"));
    assert_eq!(seen[0].body, br#"{"text":"hello world"}"#);
}

#[test]
fn rest_tools_never_fill_message_headers_from_parameters() {
    for header in ["Host", "content-length", "Transfer-Encoding", "Proxy-Connection", "Expect"] {
        let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({"t": {
            "description": "d", "url": "http://127.0.0.1:9/x",
            "headers": {header: "${parameters.value}"}}}))
        .unwrap();
        let err = RestProvider::inline(&tools).unwrap_err().to_string();
        assert!(
            err.contains(&format!("header `{header}` is filled from parameters")),
            "{header}: {err}"
        );
    }
    // A fixed value is the configuration's own choice.
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({"t": {
        "description": "d", "url": "http://127.0.0.1:9/x",
        "headers": {"Connection": "close", "X-Id": "${parameters.id}"}}}))
    .unwrap();
    RestProvider::inline(&tools).unwrap();
}

/// An API's error body quotes a secret the way its JSON encoder writes strings: .NET as
/// `\u002B` and `\u0026`, PHP with `\/`, Gson with a lower-case `\u003d`. Each is redacted.
#[tokio::test]
async fn secrets_escaped_by_json_encoders_are_redacted_from_error_bodies() {
    let secret = "sk+live/Secret=Value&x";
    let bodies = [
        r#"{"error":"bad key sk\u002Blive/Secret=Value\u0026x"}"#,
        r#"{"error":"bad key sk+live\/Secret=Value&x"}"#,
        r#"{"error":"bad key sk+live/Secret\u003dValue\u0026x"}"#,
        r#"{"error":"bad key sk\u002blive\u002fSecret\u003dValue\u0026x"}"#,
    ];
    let base = serve(move |seen| {
        let n: usize = seen.request_line().split(['=', ' ']).nth(2).unwrap().parse().unwrap();
        Reply {
            status: 500,
            headers: vec![("Content-Type".into(), "application/json".into())],
            chunks: vec![(0, bodies[n].as_bytes().to_vec())],
        }
    })
    .await;
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({"t": {
        "description": "d", "url": format!("{base}/x?n=${{parameters.n}}")}}))
    .unwrap();
    let provider = RestProvider::inline(&tools).unwrap().with_secrets([secret]);
    for n in 0..bodies.len() {
        let out = provider.call("t", json!({"n": n}), &CallContext::new()).await.unwrap();
        let text = out.to_text();
        assert!(out.is_error, "{text}");
        assert!(text.contains("bad key REDACTED"), "{n}: {text}");
        assert!(!text.contains("Secret"), "{n}: {text}");
    }
}

/// An error body is redacted before it is cut to its excerpt: cut first, a secret standing
/// across the cut lost its tail and the rest of it went out unrecognized.
#[tokio::test]
async fn a_secret_at_the_cut_of_an_error_excerpt_is_redacted_whole() {
    let secret = "sk-SECRET-abcdef1234567890";
    let base = serve(move |seen| {
        // The secret starts 20 bytes before the cut of each excerpt (2000 bytes for a
        // failed result, 300 for a rate limit's answer).
        let (status, before) =
            if seen.request_line().contains("/limited") { (429, 280) } else { (500, 1980) };
        Reply {
            status,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            chunks: vec![(0, format!("{}{secret} and more", "P".repeat(before)).into_bytes())],
        }
    })
    .await;
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({
        "failing": {"description": "d", "url": format!("{base}/failing")},
        "limited": {"description": "d", "url": format!("{base}/limited")}}))
    .unwrap();
    let provider = RestProvider::inline(&tools).unwrap().with_secrets([secret]);
    let out = provider.call("failing", json!({}), &CallContext::new()).await.unwrap();
    let text = out.to_text();
    assert!(out.is_error, "{text}");
    assert!(text.contains("PPPREDACTED"), "{}", &text[text.len() - 40..]);
    assert!(!text.contains("sk-SE"), "{}", &text[text.len() - 40..]);
    let err = call_error(&provider, "limited", json!({})).await;
    assert!(err.contains("PPPREDACTED"), "{err}");
    assert!(!err.contains("sk-SE"), "{err}");
}

/// A configured header or credential that no header can carry (a token read from a
/// variable with its trailing newline) is a configuration error naming the setting, not
/// its value, refused when the provider is built: at a call it would read as the model's
/// invalid arguments, which the model tries to fix by changing them.
#[test]
fn configured_values_no_header_can_carry_are_refused_at_load() {
    let secret = "s3cr3t-tok";
    let doc = json!({"openapi": "3.0.3", "info": {"title": "k", "version": "1"},
        "servers": [{"url": "http://127.0.0.1:1"}],
        "paths": {"/items": {"get": {"operationId": "items", "security": [{"bearer": []}]}}},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}});
    let refused = |config: &OpenApiConfig| {
        let error = RestProvider::openapi_from_value("k", doc.clone(), "k.json", config)
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(error, toolmux_rest::RestError::Config { .. }), "{error:?}");
        let shown = error.to_string();
        assert!(!shown.contains(secret), "{shown}");
        shown
    };
    let mut config = OpenApiConfig::default();
    config.headers.insert("X-Api-Key".into(), format!("{secret}\n"));
    assert!(refused(&config).contains("`headers.X-Api-Key` holds a line break"));
    let mut config = OpenApiConfig::default();
    let token = toolmux_rest::Credentials {
        token: Some(format!("{secret}\r\n")),
        ..toolmux_rest::Credentials::default()
    };
    config.auth.insert("bearer".into(), token);
    assert!(refused(&config).contains("`auth.bearer.token` holds a line break"));

    let tool: RestToolConfig = serde_json::from_value(json!({"url": "http://127.0.0.1:1/x",
        "headers": {"Authorization": format!("Bearer {secret}\n")}}))
    .unwrap();
    let error =
        RestProvider::inline(&BTreeMap::from([("t".to_owned(), tool)])).map(|_| ()).unwrap_err();
    let shown = error.to_string();
    assert!(matches!(error, toolmux_rest::RestError::Config { .. }), "{error:?}");
    assert!(shown.contains("`headers.Authorization` holds a line break"), "{shown}");
    assert!(!shown.contains(secret), "{shown}");
}

/// A `baseUrl` with a query (`…/v1?tenant=acme`) keeps it after the operation's path,
/// joined with the operation's own query parameters; without one, the path was appended
/// inside the query.
#[tokio::test]
async fn a_base_url_query_goes_after_the_path() {
    let (base, lines) = recording_server().await;
    let doc = json!({"openapi": "3.0.3", "info": {"title": "q", "version": "1"},
        "paths": {"/items/{id}": {"get": {"operationId": "item", "parameters": [
            {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}},
            {"name": "q", "in": "query", "schema": {"type": "string"}}]}}}});
    let config = OpenApiConfig {
        base_url: Some(format!("{base}/v1/?tenant=acme")),
        ..OpenApiConfig::default()
    };
    let provider = RestProvider::openapi_from_value("q", doc, "q.json", &config).unwrap();
    for (args, line) in [
        (json!({"id": "7", "q": "x y"}), "GET /v1/items/7?tenant=acme&q=x%20y HTTP/1.1"),
        (json!({"id": "8"}), "GET /v1/items/8?tenant=acme HTTP/1.1"),
    ] {
        let out = provider.call("item", args, &CallContext::new()).await.unwrap();
        assert!(!out.is_error, "{}", out.to_text());
        assert_eq!(lines.lock().unwrap().last().unwrap(), line);
    }
}

/// A fragment in an inline tool's URL is never sent, and the query goes where it was: the
/// arguments' query was written after the fragment (`/a#frag?x=1`), so the request lost it
/// with the fragment (`GET /a`). An OpenAPI server URL's fragment is dropped too: the
/// operation's path went after it.
#[tokio::test]
async fn a_urls_fragment_is_never_sent_and_the_query_goes_before_it() {
    let (base, seen) = recording_server().await;
    let provider = inline(json!({
        "plain": {"description": "P", "method": "GET", "url": format!("{base}/a#frag")},
        "templated": {"description": "T", "method": "GET",
            "url": format!("{base}/b?y=${{parameters.y}}#top"), "query": {"z": "3"}}
    }));
    let ctx = CallContext::new();
    let out = provider.call("plain", json!({"x": 1}), &ctx).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(seen.lock().unwrap().last().unwrap(), "GET /a?x=1 HTTP/1.1");
    let out = provider.call("templated", json!({"y": 2, "x": 1}), &ctx).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(seen.lock().unwrap().last().unwrap(), "GET /b?y=2&z=3&x=1 HTTP/1.1");
    let doc = json!({"openapi": "3.0.3", "info": {"title": "u", "version": "1"},
        "servers": [{"url": format!("{base}/v1#docs")}],
        "paths": {"/ping": {"get": {"operationId": "ping", "parameters": [
            {"name": "q", "in": "query", "schema": {"type": "string"}}]}}}});
    let import =
        RestProvider::openapi_from_value("api", doc, "api.json", &OpenApiConfig::default())
            .unwrap();
    let out = import.call("ping", json!({"q": "w"}), &ctx).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    assert_eq!(seen.lock().unwrap().last().unwrap(), "GET /v1/ping?q=w HTTP/1.1");
}
