//! OpenAPI 3.2 documents: the `query` method, `additionalOperations` and `querystring`
//! parameters, imported and called against a loopback server that echoes what it got.
#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use toolmux_core::{CallContext, ToolProvider};
use toolmux_rest::{OpenApiConfig, RestProvider};

/// An HTTP/1.1 server on loopback answering every request with
/// `{"method", "target", "body"}`; its base URL.
async fn echo_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut data = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let Ok(n @ 1..) = stream.read(&mut chunk).await else { return };
                    data.extend_from_slice(&chunk[..n]);
                    if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while data.len() < head_end + length {
                    let Ok(n @ 1..) = stream.read(&mut chunk).await else { return };
                    data.extend_from_slice(&chunk[..n]);
                }
                let mut words = head.split_whitespace();
                let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let body = String::from_utf8_lossy(&data[head_end..head_end + length]);
                let answer = json!({"method": method, "target": target, "body": body}).to_string();
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    base
}

fn document(base: &str) -> Value {
    let ok = json!({"200": {"description": "ok"}});
    json!({
        "openapi": "3.2.0",
        "$self": "https://example.com/api/openapi",
        "info": {"title": "items", "version": "1"},
        "servers": [{"url": base, "name": "local"}],
        "paths": {"/items": {
            "query": {
                "operationId": "searchItems",
                "parameters": [{"name": "filter", "in": "querystring", "content": {
                    "application/x-www-form-urlencoded": {"schema": {"type": "object",
                        "properties": {"color": {"type": "string"}, "size": {"type": "integer"}}}}}}],
                "requestBody": {"content": {"application/json": {"schema": {"type": "object",
                    "properties": {"where": {"type": "string"}}}}}},
                "responses": ok
            },
            "additionalOperations": {
                "LINK": {"operationId": "linkItems", "responses": ok},
                "get": {"operationId": "notHere", "responses": ok},
                "BAD METHOD": {"operationId": "neither", "responses": ok}
            }
        }}
    })
}

#[tokio::test]
async fn query_method_additional_operations_and_querystring_parameters() {
    let base = echo_server().await;
    let provider = RestProvider::openapi_from_value(
        "items",
        document(&base),
        "items.json",
        &OpenApiConfig::default(),
    )
    .unwrap();
    let specs = provider.specs();
    let names: Vec<&str> = specs.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["search_items", "link_items"]);
    let search = &specs[0];
    // QUERY is safe and idempotent.
    assert!(search.annotations.read_only && search.annotations.idempotent);
    assert!(!specs[1].annotations.read_only);
    assert_eq!(
        search.input_schema["properties"]["filter"]["properties"]["size"],
        json!({"type": "integer"})
    );
    let warnings = provider.warnings().join("\n");
    assert!(warnings.contains("`get` is a fixed field of the path item"), "{warnings}");
    assert!(warnings.contains("`BAD METHOD` is not an HTTP method"), "{warnings}");

    let ctx = CallContext::new();
    let args = json!({"filter": {"color": "dark red", "size": 2}, "where": "in stock"});
    let out = provider.call("search_items", args, &ctx).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    let echo: Value = serde_json::from_str(&out.to_text()).unwrap();
    assert_eq!(echo["method"], "QUERY");
    assert_eq!(echo["target"], "/items?color=dark%20red&size=2");
    assert_eq!(
        serde_json::from_str::<Value>(echo["body"].as_str().unwrap()).unwrap(),
        json!({"where": "in stock"})
    );

    let out = provider.call("link_items", json!({}), &ctx).await.unwrap();
    let echo: Value = serde_json::from_str(&out.to_text()).unwrap();
    assert_eq!((echo["method"].as_str(), echo["target"].as_str()), (Some("LINK"), Some("/items")));
}

#[test]
fn versions_past_3_2_are_refused_by_name() {
    let doc = json!({"openapi": "3.3.0", "info": {"title": "t", "version": "1"}, "paths": {}});
    let err = RestProvider::openapi_from_value("x", doc, "x.json", &OpenApiConfig::default())
        .unwrap_err();
    assert!(err.to_string().contains("supported: 2.0, 3.0.x, 3.1.x, 3.2.x"), "{err}");
}

/// A `querystring` parameter is the whole query string, serialized as its `content` says:
/// JSON content as its JSON text, a string of another media type (JSONPath) as it is, both
/// escaped, and never as a `name=value` pair (OpenAPI 3.2, the Parameter Object's
/// examples). Both were sent as `name=value`.
#[tokio::test]
async fn a_querystring_parameter_is_the_whole_query_string() {
    let base = echo_server().await;
    let ok = json!({"200": {"description": "ok"}});
    let document = json!({
        "openapi": "3.2.0",
        "info": {"title": "items", "version": "1"},
        "servers": [{"url": base}],
        "paths": {
            "/json": {"get": {
                "operationId": "byJson",
                "parameters": [{"name": "json", "in": "querystring", "content": {
                    "application/json": {"schema": {"type": "object",
                        "properties": {"numbers": {"type": "array", "items": {"type": "integer"}}}}}}}],
                "responses": ok
            }},
            "/select": {"get": {
                "operationId": "bySelector",
                "parameters": [{"name": "selector", "in": "querystring", "content": {
                    "application/jsonpath": {"schema": {"type": "string"}}}}],
                "responses": ok
            }}
        }
    });
    let provider = RestProvider::openapi_from_value(
        "items",
        document,
        "items.json",
        &OpenApiConfig::default(),
    )
    .unwrap();
    let ctx = CallContext::new();
    let target = |out: toolmux_core::ToolOutput| {
        assert!(!out.is_error, "{}", out.to_text());
        let echo: Value = serde_json::from_str(&out.to_text()).unwrap();
        echo["target"].as_str().unwrap().to_owned()
    };
    let args = json!({"json": {"numbers": [1, 2]}});
    let out = provider.call("by_json", args, &ctx).await.unwrap();
    assert_eq!(target(out), "/json?%7B%22numbers%22%3A%5B1%2C2%5D%7D");
    let args = json!({"selector": "$.a.b[1:1]"});
    let out = provider.call("by_selector", args, &ctx).await.unwrap();
    assert_eq!(target(out), "/select?%24.a.b%5B1%3A1%5D");
    let out = provider.call("by_selector", json!({"selector": ""}), &ctx).await.unwrap();
    assert_eq!(target(out), "/select");
}
