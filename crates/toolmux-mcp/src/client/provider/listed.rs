//! A `tools/list` page read tool by tool, so that one malformed tool costs that tool only.
//!
//! rmcp parses a page whole: one tool without `inputSchema`, or with `inputSchema: true`,
//! made the page no `ListToolsResult` and the provider failed to start with `Unexpected
//! response type`, its good tools lost with the bad one. Here a page rmcp could not read is
//! read again from its JSON, each tool on its own; a tool that is no tool is left out with
//! a warning naming it and saying why.

use rmcp::RoleClient;
use rmcp::model::{ClientRequest, ListToolsRequest, PaginatedRequestParams, ServerResult, Tool};
use rmcp::service::{Peer, ServiceError};
use serde_json::Value;

/// One page of a server's tools and its next cursor, the tools that are none left out with
/// a warning naming `server`.
pub(super) async fn tools_page(
    server: &str,
    peer: &Peer<RoleClient>,
    params: Option<PaginatedRequestParams>,
) -> Result<(Vec<Tool>, Option<String>), ServiceError> {
    let request = ClientRequest::ListToolsRequest(ListToolsRequest {
        method: Default::default(),
        params,
        extensions: Default::default(),
    });
    match peer.send_request(request).await? {
        ServerResult::ListToolsResult(page) => Ok((page.tools, page.next_cursor)),
        // What matched no result rmcp knows is kept as it came.
        ServerResult::CustomResult(raw) => raw_page(server, raw.0),
        _ => Err(ServiceError::UnexpectedResponse),
    }
}

/// A page rmcp could not read, read tool by tool.
fn raw_page(server: &str, mut raw: Value) -> Result<(Vec<Tool>, Option<String>), ServiceError> {
    let Some(Value::Array(listed)) = raw.get_mut("tools").map(Value::take) else {
        return Err(ServiceError::UnexpectedResponse);
    };
    let next = match raw.get("nextCursor") {
        Some(Value::String(cursor)) => Some(cursor.clone()),
        _ => None,
    };
    let mut tools = Vec::with_capacity(listed.len());
    for (index, raw_tool) in listed.into_iter().enumerate() {
        match tool(raw_tool) {
            Ok(tool) => tools.push(tool),
            Err((name, why)) => {
                let which = match name {
                    Some(name) => format!("tool `{}`", shown(&name)),
                    None => format!("tool {index} of the page"),
                };
                tracing::warn!(server, "tools/list: {which} is left out: {why}");
            }
        }
    }
    Ok((tools, next))
}

/// One listed tool, or its name (when it has one) and why it is none.
fn tool(raw: Value) -> Result<Tool, (Option<String>, String)> {
    let name = raw.get("name").and_then(Value::as_str).map(str::to_owned);
    let Some(name) = name else {
        return Err((None, "it has no `name` string".to_owned()));
    };
    let why = match raw.get("inputSchema") {
        None => Some(
            "it has no `inputSchema` (MCP requires one; a tool without arguments gives \
             {\"type\": \"object\"})"
                .to_owned(),
        ),
        Some(Value::Object(_)) => None,
        Some(other) => {
            Some(format!("its `inputSchema` is {}, not a JSON Schema object", kind_of(other)))
        }
    };
    if let Some(why) = why {
        return Err((Some(name), why));
    }
    let support = raw.pointer("/execution/taskSupport").and_then(Value::as_str).map(str::to_owned);
    let mut tool: Tool =
        serde_json::from_value(raw).map_err(|e| (Some(name.clone()), e.to_string()))?;
    // As the transports that read their own lines do for a page rmcp read.
    if let Some(support @ ("optional" | "required")) = support.as_deref() {
        let meta = tool.meta.get_or_insert_with(Default::default);
        meta.0.insert(crate::transport::TASK_SUPPORT_META_KEY.to_owned(), Value::from(support));
    }
    Ok(tool)
}

/// What kind of JSON value `value` is, with the value when it is short.
fn kind_of(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("`{b}`"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string \"{}\"", shown(s)),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// `text` cut to 60 characters for a message.
fn shown(text: &str) -> &str {
    &text[..text.floor_char_boundary(60)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(listed: Value, expect: expect_test::Expect) {
        let (tools, next) = raw_page("s", json!({"tools": listed, "nextCursor": "n"})).unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        expect.assert_debug_eq(&(names, next));
    }

    #[test]
    fn malformed_tools_are_left_out_and_the_rest_kept() {
        check(
            json!([
                {"name": "noschema"},
                {"name": "trueschema", "inputSchema": true},
                {"name": "stringschema", "inputSchema": "hello"},
                {"inputSchema": {}},
                {"name": "badannotations", "inputSchema": {}, "annotations": 3},
                {"name": "ok", "inputSchema": {"type": "object"}},
            ]),
            expect_test::expect![[r#"
                (
                    [
                        "ok",
                    ],
                    Some(
                        "n",
                    ),
                )
            "#]],
        );
    }

    #[test]
    fn reasons_name_what_is_wrong() {
        let why = |raw: Value| tool(raw).unwrap_err();
        expect_test::expect![[r#"
            [
                (
                    Some(
                        "a",
                    ),
                    "it has no `inputSchema` (MCP requires one; a tool without arguments gives {\"type\": \"object\"})",
                ),
                (
                    Some(
                        "b",
                    ),
                    "its `inputSchema` is `true`, not a JSON Schema object",
                ),
                (
                    Some(
                        "c",
                    ),
                    "its `inputSchema` is the string \"hello\", not a JSON Schema object",
                ),
                (
                    None,
                    "it has no `name` string",
                ),
            ]
        "#]]
        .assert_debug_eq(&[
            why(json!({"name": "a"})),
            why(json!({"name": "b", "inputSchema": true})),
            why(json!({"name": "c", "inputSchema": "hello"})),
            why(json!({"inputSchema": {}})),
        ]);
    }

    #[test]
    fn task_support_is_kept() {
        let listed =
            json!({"name": "t", "inputSchema": {}, "execution": {"taskSupport": "required"}});
        let tool = tool(listed).unwrap();
        let meta = tool.meta.unwrap();
        assert_eq!(meta.0.get(crate::transport::TASK_SUPPORT_META_KEY), Some(&json!("required")));
    }
}
