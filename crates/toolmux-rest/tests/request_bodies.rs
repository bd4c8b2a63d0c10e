//! Request bodies of imported operations as a loopback server receives them: their
//! content type, and form and multipart fields as the media type's `encoding` says.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Reply, SeenRequest, serve};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use toolmux_core::{CallContext, ToolProvider};
use toolmux_rest::{OpenApiConfig, RestProvider};

/// A server answering `{}` that keeps every request it sees.
async fn keeping_server() -> (String, Arc<Mutex<Vec<SeenRequest>>>) {
    let seen: Arc<Mutex<Vec<SeenRequest>>> = Arc::default();
    let log = seen.clone();
    let base = serve(move |request| {
        log.lock().unwrap().push(request);
        Reply::json(200, json!({}))
    })
    .await;
    (base, seen)
}

/// One `POST /op` operation (`op`) whose request body is `media` with `content`.
fn import(base: &str, media: &str, content: Value) -> RestProvider {
    let doc = json!({"openapi": "3.0.3", "info": {"title": "b", "version": "1"},
        "servers": [{"url": base}],
        "paths": {"/op": {"post": {"operationId": "op",
            "requestBody": {"required": true, "content": {media: content}}}}}});
    RestProvider::openapi_from_value("b", doc, "b.json", &OpenApiConfig::default()).unwrap()
}

/// The request `op` sends with `args`.
async fn sent(provider: &RestProvider, seen: &Mutex<Vec<SeenRequest>>, args: Value) -> SeenRequest {
    let out = provider.call("op", args, &CallContext::new()).await.unwrap();
    assert!(!out.is_error, "{}", out.to_text());
    seen.lock().unwrap().last().cloned().unwrap()
}

/// A text body is sent with its media type once: two `Content-Type` headers (which the
/// raw body's type and the operation's both added) are refused by strict servers and
/// read as `text/plain, text/plain` by others.
#[tokio::test]
async fn a_text_body_carries_one_content_type() {
    let (base, seen) = keeping_server().await;
    let provider = import(&base, "text/plain", json!({"schema": {"type": "string"}}));
    let request = sent(&provider, &seen, json!({"body": "hello"})).await;
    let types: Vec<&str> = request
        .head
        .lines()
        .filter(|line| line.to_ascii_lowercase().starts_with("content-type:"))
        .collect();
    assert_eq!(types, ["content-type: text/plain"], "{}", request.head);
    assert_eq!(request.body, b"hello");
}
