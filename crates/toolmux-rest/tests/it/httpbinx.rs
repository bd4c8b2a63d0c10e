//! A real REST server from PyPI (httpbinx) on loopback: its own OpenAPI 3.1 document is
//! imported by URL and its operations are called through toolmux.
#![allow(clippy::unwrap_used)]

use crate::common::{Httpbinx, check_tools, count_operations};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use toolmux_core::{CallContext, ToolOutput, ToolProvider};
use toolmux_rest::{OpenApiConfig, RestProvider, RestToolConfig};
use toolmux_test_support::conformance::{Conformance, SampleCall};

fn json_of(out: &ToolOutput) -> Value {
    serde_json::from_str(&out.to_text()).unwrap_or_else(|_| panic!("not JSON: {}", out.to_text()))
}

async fn imported(server: &Httpbinx) -> RestProvider {
    let config = OpenApiConfig::from_url(format!("{}/openapi.json", server.base));
    RestProvider::openapi("httpbin", &config).await.unwrap()
}

#[tokio::test]
async fn imports_its_document_by_url_and_calls_operations() {
    let server = Httpbinx::start().await;
    let provider = imported(&server).await;
    let doc: Value = reqwest_free_get(&format!("{}/openapi.json", server.base)).await;
    let tools = provider.specs();
    assert_eq!(tools.len(), count_operations(&doc, false));
    assert!(check_tools("httpbin", &tools).is_empty(), "{:?}", check_tools("httpbin", &tools));

    let ctx = CallContext::new();
    // A path parameter with characters that must be encoded arrives decoded.
    let out = provider
        .call("decode_base64_base64_value_get", json!({"value": "aGVsbG8gd29ybGQ="}), &ctx)
        .await
        .unwrap();
    assert_eq!(out.to_text(), "hello world");
    // Non-2xx: an error output with the status.
    let out =
        provider.call("status_code_status_codes_get", json!({"codes": "418"}), &ctx).await.unwrap();
    assert!(out.is_error);
    assert!(out.to_text().starts_with("HTTP 418"), "{}", out.to_text());
    assert_eq!(out.extras["status"], 418);
    // Redirects are followed up to the limit.
    let out = provider
        .call("relative_redirect_n_times_relative_redirect_n_get", json!({"n": 2}), &ctx)
        .await
        .unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let err = provider
        .call("relative_redirect_n_times_relative_redirect_n_get", json!({"n": 7}), &ctx)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("too many redirects"), "{err}");
    // Images come back as image parts.
    let out = provider.call("image_png_image_png_get", json!({}), &ctx).await.unwrap();
    match out.content.as_slice() {
        [toolmux_core::ContentPart::Image { mime_type, data }] => {
            assert_eq!(mime_type, "image/png");
            assert!(data.starts_with("iVBORw0KGgo"), "{}", &data[..20]);
        }
        other => panic!("not one image: {other:?}"),
    }
    // A document URL that fails names the URL and the status.
    let url = format!("{}/status/404", server.base);
    let err = RestProvider::openapi("x", &OpenApiConfig::from_url(&url)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("cannot fetch OpenAPI document from `{url}`: HTTP 404 Not Found")
    );
    // Cookies as the server sees them.
    let out = provider.call("cookies_cookies_get", json!({}), &ctx).await.unwrap();
    assert_eq!(json_of(&out), json!({"cookies": {}}));
}

/// Fetches JSON with a plain TCP request, independently of the code under test.
async fn reqwest_free_get(url: &str) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut socket = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    socket.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8(response).unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1;
    serde_json::from_str(body).unwrap()
}

#[tokio::test]
async fn method_path_query_headers_and_body_arrive_as_sent() {
    let server = Httpbinx::start().await;
    // httpbinx declares no parameters for `/anything`; declare some in its own document, as
    // a user describing the echo endpoint would, and import that.
    let mut doc: Value = reqwest_free_get(&format!("{}/openapi.json", server.base)).await;
    doc["paths"]["/anything"]["post"]["parameters"] = json!([
        {"name": "tags", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}},
        {"name": "q", "in": "query", "schema": {"type": "string"}},
        {"name": "csv", "in": "query", "style": "form", "explode": false,
         "schema": {"type": "array", "items": {"type": "integer"}}},
        {"name": "X-Trace-Id", "in": "header", "schema": {"type": "string"}},
        {"name": "name", "in": "header", "schema": {"type": "string"}},
        {"name": "session", "in": "cookie", "schema": {"type": "string"}}
    ]);
    doc["paths"]["/anything"]["post"]["requestBody"] = json!({"required": true, "content": {
        "application/json": {"schema": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "count": {"type": "integer"},
            "nested": {"type": "object"}}}}}});
    doc["paths"]["/anything"]["put"]["requestBody"] = json!({"content": {
        "application/x-www-form-urlencoded": {"schema": {"type": "object", "properties": {
            "a": {"type": "string"}, "b": {"type": "array", "items": {"type": "string"}}}}}}});
    let config = OpenApiConfig::from_url(format!("{}/openapi.json", server.base));
    let provider = RestProvider::openapi_from_value("httpbin", doc, "httpbinx", &config).unwrap();
    let post = provider.specs().into_iter().find(|t| t.name == "anything_anything_post").unwrap();
    let properties: Vec<&String> =
        post.input_schema["properties"].as_object().unwrap().keys().collect();
    assert_eq!(
        properties,
        ["X-Trace-Id", "count", "csv", "name", "name__header", "nested", "q", "session", "tags"]
    );

    let ctx = CallContext::new();
    let args = json!({"tags": ["a b", "c&d"], "q": "ü/?", "csv": [1, 2], "X-Trace-Id": "trace-1",
        "name__header": "header-name", "session": "s 1", "name": "body-name", "count": 3,
        "nested": {"k": [1, null]}});
    let out = provider.call("anything_anything_post", args, &ctx).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let echo = json_of(&out);
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["args"], json!({"tags": ["a b", "c&d"], "q": "ü/?", "csv": "1,2"}));
    assert_eq!(echo["headers"]["x-trace-id"], "trace-1");
    assert_eq!(echo["headers"]["name"], "header-name");
    assert_eq!(echo["headers"]["content-type"], "application/json");
    assert_eq!(echo["headers"]["cookie"], "session=s%201");
    let body: Value = serde_json::from_str(echo["data"].as_str().unwrap()).unwrap();
    assert_eq!(body, json!({"name": "body-name", "count": 3, "nested": {"k": [1, null]}}));

    let out = provider
        .call("anything_anything_put", json!({"a": "x y", "b": ["1", "2"]}), &ctx)
        .await
        .unwrap();
    let echo = json_of(&out);
    assert_eq!(echo["method"], "PUT");
    assert_eq!(echo["data"], "a=x+y&b=1&b=2");
    assert_eq!(echo["headers"]["content-type"], "application/x-www-form-urlencoded");
}

#[tokio::test]
async fn inline_tools_template_url_query_headers_and_body() {
    let server = Httpbinx::start().await;
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({
        "echo": {
            "description": "Echo a request",
            "method": "POST",
            "url": format!("{}/anything?city=${{parameters.city}}&opt=${{parameters.opt}}", server.base),
            "headers": {"X-User": "${parameters.user}", "X-Fixed": "expanded-by-facade"},
            "query": {"page": "${parameters.page}"},
            "body": {"who": "${parameters.user}", "n": "${parameters.n}", "text": "n=${parameters.n}"},
            "parametersSchema": {"type": "object", "properties": {
                "city": {"type": "string"}, "opt": {"type": "string"}, "user": {"type": "string"},
                "page": {"type": "integer"}, "n": {"type": "integer"}}, "required": ["city"]}
        },
        "b64": {
            "description": "Decode base64",
            "url": format!("{}/base64/${{parameters.value}}", server.base)
        },
        "get": {
            "description": "Echo a GET",
            "url": format!("{}/get", server.base)
        },
        "slow": {
            "description": "A slow call",
            "url": format!("{}/delay/${{parameters.seconds}}", server.base),
            "timeoutMs": 20000
        },
        "too_slow": {
            "description": "A call past its timeout",
            "url": format!("{}/delay/${{parameters.seconds}}", server.base),
            "timeoutMs": 300
        },
        "tiny": {
            "description": "A response over its size limit",
            "url": format!("{}/bytes/${{parameters.n}}", server.base),
            "maxResponseBytes": 100
        }
    }))
    .unwrap();
    let provider = RestProvider::inline(&tools).unwrap();
    assert_eq!(provider.namespace(), "rest");
    let ctx = CallContext::new();
    let out = provider
        .call("echo", json!({"city": "São Paulo & co", "user": "ann", "page": 2, "n": 7}), &ctx)
        .await
        .unwrap();
    let echo = json_of(&out);
    assert_eq!(echo["args"], json!({"city": "São Paulo & co", "page": "2"}));
    assert_eq!(echo["headers"]["x-user"], "ann");
    assert_eq!(echo["headers"]["x-fixed"], "expanded-by-facade");
    let body: Value = serde_json::from_str(echo["data"].as_str().unwrap()).unwrap();
    assert_eq!(body, json!({"who": "ann", "n": 7, "text": "n=7"}));

    // With a body template, an argument no template names is refused, not dropped.
    let err = provider.call("echo", json!({"city": "x", "usr": "ann"}), &ctx).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid arguments for `rest__echo`: at /: unknown argument `usr`; did you mean `user`?"
    );

    let out = provider.call("b64", json!({"value": "aGk+Pj4+"}), &ctx).await.unwrap();
    assert_eq!(out.to_text(), "hi>>>>");
    // Arguments no template uses go to the query of a GET.
    let out = provider.call("get", json!({"x": "1", "list": ["a", "b"]}), &ctx).await.unwrap();
    assert_eq!(json_of(&out)["args"], json!({"x": "1", "list": ["a", "b"]}));

    let err = provider.call("too_slow", json!({"seconds": "3"}), &ctx).await.unwrap_err();
    assert!(matches!(err, toolmux_core::ToolError::Timeout { .. }), "{err}");
    let err = provider.call("tiny", json!({"n": "1000"}), &ctx).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "`rest__tiny`: response larger than 100 bytes, reading stopped: raise `maxResponseBytes` (of \
         the tool, or of its OpenAPI import) or ask the API for less, such as a page or a filter"
    );
    let err = provider.call("b64", json!({}), &ctx).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid arguments for `rest__b64`: at /: missing argument `value` for the URL"
    );

    Conformance::new()
        .with_sample(
            SampleCall::new("b64", json!({"value": "aGVsbG8="})).expect_text_contains("hello"),
        )
        .with_sample(SampleCall::new("b64", json!({})).expect_failure())
        .with_cancellable(SampleCall::new("slow", json!({"seconds": "4"})))
        .check(&provider)
        .await;
}

#[tokio::test]
async fn imported_spec_passes_conformance() {
    let server = Httpbinx::start().await;
    let provider = imported(&server).await;
    Conformance::new()
        .with_sample(
            SampleCall::new("decode_base64_base64_value_get", json!({"value": "aGVsbG8="}))
                .expect_text_contains("hello"),
        )
        .with_sample(
            SampleCall::new("status_code_status_codes_get", json!({"codes": "500"}))
                .expect_failure()
                .expect_text_contains("HTTP 500"),
        )
        .with_cancellable(SampleCall::new("delay_response_delay_delay_get", json!({"delay": 4})))
        .check(&provider)
        .await;
}

/// `select` returns only the parts of a JSON response it names: one pointer, or an object
/// of named pointers (a part the response lacks is `null`); a pointer written as a path of
/// dots is refused at load, with the pointer to write instead.
#[tokio::test]
async fn select_returns_the_parts_of_a_json_response_it_names() {
    let server = Httpbinx::start().await;
    let tools: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({
        "args": {
            "description": "Only the query arguments",
            "url": format!("{}/get", server.base),
            "select": "/args"
        },
        "picked": {
            "description": "Some parts",
            "url": format!("{}/get", server.base),
            "select": {"city": "/args/city", "agent": "/headers/user-agent", "none": "/nothing/here"}
        }
    }))
    .unwrap();
    let provider = RestProvider::inline(&tools).unwrap();
    let ctx = CallContext::new();
    let out = provider.call("args", json!({"city": "Oslo"}), &ctx).await.unwrap();
    assert_eq!(json_of(&out), json!({"city": "Oslo"}));
    let out = provider.call("picked", json!({"city": "Lima"}), &ctx).await.unwrap();
    let picked = json_of(&out);
    assert_eq!(picked["city"], "Lima");
    assert!(picked["agent"].as_str().is_some_and(|a| a.starts_with("toolmux/")), "{picked}");
    assert_eq!(picked["none"], Value::Null);
    assert_eq!(picked.as_object().map(serde_json::Map::len), Some(3));

    let bad: BTreeMap<String, RestToolConfig> = serde_json::from_value(json!({
        "bad": {"description": "x", "url": format!("{}/get", server.base), "select": "data.items"}
    }))
    .unwrap();
    let err = RestProvider::inline(&bad).unwrap_err().to_string();
    assert!(err.contains("not a JSON Pointer: write `/data/items`"), "{err}");
}
