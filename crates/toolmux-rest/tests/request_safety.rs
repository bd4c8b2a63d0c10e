//! What arguments and servers cannot make a REST tool do, against loopback servers: leave
//! the tool's path through `..` path arguments, carry credentials along a redirect to
//! another origin, or have misspelled arguments dropped silently.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Reply, serve};
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

async fn call_error(provider: &RestProvider, tool: &str, args: Value) -> String {
    provider.call(tool, args, &CallContext::new()).await.unwrap_err().to_string()
}

#[tokio::test]
async fn path_arguments_never_leave_the_tools_path() {
    let (base, lines) = recording_server().await;
    let profile = inline(json!({"profile": {"description": "a user's profile",
        "url": format!("{base}/users/${{parameters.id}}/profile")}}));
    let doc = json!({"openapi": "3.0.3", "info": {"title": "u", "version": "1"},
        "servers": [{"url": format!("{base}/v1")}],
        "paths": {"/users/{id}/profile": {"get": {"operationId": "getProfile", "parameters": [
            {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]}}}});
    let imported =
        RestProvider::openapi_from_value("users", doc, "users.json", &OpenApiConfig::default())
            .unwrap();
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
