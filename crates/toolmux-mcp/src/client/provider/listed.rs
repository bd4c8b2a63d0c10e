//! A `tools/list` page read tool by tool, so that one malformed tool costs that tool only.
//!
//! rmcp parses a page whole: one tool without `inputSchema`, or with `inputSchema: true`,
//! made the page no `ListToolsResult` and the provider failed to start with `Unexpected
//! response type`, its good tools lost with the bad one. Here a page rmcp could not read is
//! read again from its JSON, each tool on its own; a tool that is no tool is left out with
//! a warning naming it and saying why.

use rmcp::RoleClient;
use rmcp::model::{ClientRequest, ListToolsRequest, PaginatedRequestParams, ServerResult, Tool};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
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
    // As rmcp's `list_tools` does, a listing dropped before its answer (its timeout) is
    // cancelled at the server.
    let handle = peer.send_request_with_option(request, PeerRequestOptions::no_options()).await?;
    let mut pending = super::Pending(Some(handle));
    let answer = match pending.0.as_mut() {
        Some(handle) => (&mut handle.rx).await.unwrap_or(Err(ServiceError::TransportClosed)),
        None => Err(ServiceError::TransportClosed),
    };
    pending.0 = None;
    match answer? {
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

/// The longest tool description passed on, in bytes. Model APIs take descriptions of a few
/// kilobytes (OpenAI's Assistants cap a function's at 1,024 characters, Anthropic states
/// no limit); every tool's description goes to the model with every turn, so one of a
/// megabyte would cost each turn that much. Client-specific limits are the server
/// profiles' to apply.
pub(super) const DESCRIPTION_MAX: usize = 16 << 10;

/// `spec` of `server` made fit to pass on: a description over [`DESCRIPTION_MAX`] is cut
/// with a note, and a `$ref` of its input schema that points at nothing in the schema is
/// taken out (the property then takes any value, and the server still checks its
/// arguments), each with a warning naming the tool. Model APIs refuse a schema with a
/// dangling `$ref`, and one tool refused fails every request that lists it; taking the
/// `$ref` out keeps the tool, where leaving the tool out would lose it for a fault of
/// its documentation.
pub(super) fn fit(server: &str, spec: &mut toolmux_core::ToolSpec) {
    let length = spec.description.len();
    if length > DESCRIPTION_MAX {
        let cut = spec.description.floor_char_boundary(DESCRIPTION_MAX);
        spec.description.truncate(cut);
        spec.description.push_str(&format!(
            "\n[description cut at {} KiB; the server's was {length} bytes]",
            DESCRIPTION_MAX >> 10
        ));
        tracing::warn!(
            server,
            "tool `{}`: its description of {length} bytes is cut to {} KiB",
            spec.name,
            DESCRIPTION_MAX >> 10
        );
    }
    if !schema_has_ref(&spec.input_schema) {
        return;
    }
    let mut schema = (*spec.input_schema).clone();
    let mut dangling = Vec::new();
    drop_dangling_refs(&spec.input_schema, &mut schema, &mut dangling);
    if dangling.is_empty() {
        return;
    }
    tracing::warn!(
        server,
        "tool `{}`: its input schema's $ref {} point at nothing in the schema; they are \
         taken out, so those values are not described",
        spec.name,
        dangling.iter().map(|r| format!("`{}`", shown(r))).collect::<Vec<_>>().join(", ")
    );
    spec.input_schema = std::sync::Arc::new(schema);
}

/// Whether `schema` holds the text `"$ref"` anywhere (cheap, before walking it).
fn schema_has_ref(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => map.contains_key("$ref") || map.values().any(schema_has_ref),
        Value::Array(items) => items.iter().any(schema_has_ref),
        _ => false,
    }
}

/// Takes out of `node` (a part of `root`) every `$ref` to a JSON pointer in the schema
/// (`#/...`) that resolves to nothing, noting it in `dangling`. Values that are data, not
/// schemas (`enum`, `const`, `default`, `examples`), are not walked; a `$ref` that is no
/// string (a property named `$ref`) is none.
fn drop_dangling_refs(root: &Value, node: &mut Value, dangling: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            if let Some(Value::String(target)) = map.get("$ref")
                && let Some(pointer) = target.strip_prefix('#')
                && !resolves(root, pointer)
            {
                dangling.push(target.clone());
                map.remove("$ref");
            }
            for (key, value) in map.iter_mut() {
                if !matches!(key.as_str(), "enum" | "const" | "default" | "examples") {
                    drop_dangling_refs(root, value, dangling);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                drop_dangling_refs(root, item, dangling);
            }
        }
        _ => {}
    }
}

/// Whether the fragment `pointer` (after `#`) points at a part of `root`: empty is the
/// root, `/a/b` a JSON pointer (percent-decoded); a plain name is an anchor, taken to
/// resolve.
fn resolves(root: &Value, pointer: &str) -> bool {
    if pointer.is_empty() || !pointer.starts_with('/') {
        return true;
    }
    let decoded = percent_encoding::percent_decode_str(pointer).decode_utf8_lossy();
    root.pointer(&decoded).is_some()
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
    fn dangling_refs_are_taken_out_and_others_kept() {
        let schema = json!({
            "type": "object",
            "$defs": {"name": {"type": "string"}, "a b": {}},
            "properties": {
                "a": {"$ref": "#/$defs/missing", "description": "kept"},
                "b": {"$ref": "#/$defs/name"},
                "c": {"$ref": "#/$defs/a%20b"},
                "d": {"enum": [{"$ref": "#/data/not/a/ref"}]},
                "$ref": {"type": "string"},
                "e": {"items": [{"$ref": "#/nowhere"}]},
            },
        });
        let mut spec = toolmux_core::ToolSpec::new("t", "d", schema);
        fit("s", &mut spec);
        expect_test::expect![[r##"{"$defs":{"a b":{},"name":{"type":"string"}},"properties":{"$ref":{"type":"string"},"a":{"description":"kept"},"b":{"$ref":"#/$defs/name"},"c":{"$ref":"#/$defs/a%20b"},"d":{"enum":[{"$ref":"#/data/not/a/ref"}]},"e":{"items":[{}]}},"type":"object"}"##]]
            .assert_eq(&spec.input_schema.to_string());
    }

    #[test]
    fn a_long_description_is_cut_with_a_note() {
        let mut spec = toolmux_core::ToolSpec::new("t", "é".repeat(DESCRIPTION_MAX), json!({}));
        fit("s", &mut spec);
        assert!(spec.description.len() < DESCRIPTION_MAX + 80, "{}", spec.description.len());
        expect_test::expect![[r#"

            [description cut at 16 KiB; the server's was 32768 bytes]"#]]
        .assert_eq(&spec.description[DESCRIPTION_MAX..]);
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
