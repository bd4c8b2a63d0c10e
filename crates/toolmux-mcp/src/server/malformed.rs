//! What is wrong with a body rmcp could not take as a JSON-RPC message, or with an
//! `initialize` it did not take as one, named by field, so that a client is told what to
//! correct: rmcp says only that the body is no message it knows, or, for an `initialize`
//! whose `params` are not an initialize's, that a session id is missing.

use serde_json::{Map, Value};

/// Why the JSON object `body` is no JSON-RPC message MCP takes: the first field of the
/// wrong form (`jsonrpc`, `id`, `method`, `params`), or `None` when none is found wrong
/// (or `body` is no JSON object: a batch or text that is not JSON is told elsewhere).
pub(crate) fn wrong_field(body: &[u8]) -> Option<String> {
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    match message.get("jsonrpc") {
        None => {
            return Some(
                "`jsonrpc` is missing; every message has `\"jsonrpc\": \"2.0\"`".to_owned(),
            );
        }
        Some(Value::String(version)) if version == "2.0" => {}
        Some(other) => {
            return Some(format!(
                "`jsonrpc` is {}; every message has `\"jsonrpc\": \"2.0\"`",
                shown(other)
            ));
        }
    }
    if let Some(id) = message.get("id")
        && !(id.is_string() || id.is_i64() || id.is_u64())
    {
        return Some(format!(
            "`id` is {}; an id is a string or an integer (not null, a fraction, a number \
             beyond 64 bits, a boolean, an object or an array)",
            shown(id)
        ));
    }
    if let Some(method) = message.get("method")
        && !method.is_string()
    {
        return Some(format!("`method` is {}; a method is a string", shown(method)));
    }
    if let Some(params) = message.get("params")
        && !params.is_object()
    {
        return Some(format!(
            "`params` is {}; a message's params are an object (leave `params` out when \
             there are none)",
            shown(params)
        ));
    }
    None
}

/// Why the `params` of the `initialize` request `body` are not an initialize's; `None`
/// when `body` is no `initialize` request or nothing is found wrong.
pub(crate) fn initialize_params(body: &[u8]) -> Option<String> {
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    if message.get("method").and_then(Value::as_str) != Some("initialize") {
        return None;
    }
    const FORM: &str = "send `\"params\": {\"protocolVersion\": \"2025-11-25\", \
                        \"capabilities\": {}, \"clientInfo\": {\"name\": …, \"version\": …}}`";
    let Some(params) = message.get("params") else {
        return Some(format!("`initialize` has no `params`; {FORM}"));
    };
    let Some(params) = params.as_object() else {
        return Some(format!("`initialize`'s `params` is {}; {FORM}", shown(params)));
    };
    let field = |name: &str, wanted: &str, fits: fn(&Value) -> bool| -> Option<String> {
        match params.get(name) {
            None => Some(format!("`initialize`'s `params.{name}` is missing; it is {wanted}")),
            Some(value) if !fits(value) => {
                Some(format!("`initialize`'s `params.{name}` is {}; it is {wanted}", shown(value)))
            }
            Some(_) => None,
        }
    };
    field("protocolVersion", "a revision such as \"2025-11-25\"", Value::is_string)
        .or_else(|| field("capabilities", "an object (`{}` for none)", Value::is_object))
        .or_else(|| field("clientInfo", "an object with `name` and `version`", Value::is_object))
        .or_else(|| client_info(params.get("clientInfo")?.as_object()?))
        .or_else(|| {
            // Anything else rmcp refuses (a capability of the wrong form), as serde says.
            let params = Value::Object(params.clone());
            let refused =
                serde_json::from_value::<rmcp::model::InitializeRequestParams>(params).err()?;
            Some(format!("`initialize`'s `params` are not an initialize's ({refused})"))
        })
}

/// Why `clientInfo` is not an implementation's (`name` and `version`, strings).
fn client_info(info: &Map<String, Value>) -> Option<String> {
    ["name", "version"].into_iter().find_map(|name| match info.get(name) {
        Some(Value::String(_)) => None,
        None => {
            Some(format!("`initialize`'s `params.clientInfo.{name}` is missing; it is a string"))
        }
        Some(other) => Some(format!(
            "`initialize`'s `params.clientInfo.{name}` is {}; it is a string",
            shown(other)
        )),
    })
}

/// `value` as JSON, cut to a length a message can quote.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    fn check(body: &str, expect: Expect) {
        let found = wrong_field(body.as_bytes()).or_else(|| initialize_params(body.as_bytes()));
        expect.assert_eq(found.as_deref().unwrap_or("nothing wrong"));
    }

    #[test]
    fn jsonrpc() {
        check(
            r#"{"id":1,"method":"ping"}"#,
            expect![[r#"`jsonrpc` is missing; every message has `"jsonrpc": "2.0"`"#]],
        );
        check(
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            expect![[r#"`jsonrpc` is "1.0"; every message has `"jsonrpc": "2.0"`"#]],
        );
    }

    #[test]
    fn ids_that_are_no_string_or_integer() {
        for id in ["null", "1.5", "true", "{}", "[1]", "1e23", "18446744073709551616"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            let found = wrong_field(body.as_bytes()).unwrap_or_default();
            assert!(
                found.starts_with("`id` is ") && found.contains("string or an integer"),
                "{id}: {found}"
            );
        }
        check(r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#, expect!["nothing wrong"]);
        check(r#"{"jsonrpc":"2.0","id":-3,"method":"ping"}"#, expect!["nothing wrong"]);
    }

    #[test]
    fn method_and_params() {
        check(
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            expect!["`method` is 7; a method is a string"],
        );
        check(
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":"x"}"#,
            expect![[
                r#"`params` is "x"; a message's params are an object (leave `params` out when there are none)"#
            ]],
        );
    }

    #[test]
    fn initialize_params_by_field() {
        check(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#,
            expect![[
                r#"`initialize` has no `params`; send `"params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": …, "version": …}}`"#
            ]],
        );
        check(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":1,"clientInfo":{"name":"a","version":"1"}}}"#,
            expect!["`initialize`'s `params.capabilities` is 1; it is an object (`{}` for none)"],
        );
        check(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{}}}"#,
            expect![
                "`initialize`'s `params.clientInfo` is missing; it is an object with `name` and `version`"
            ],
        );
        check(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"a"}}}"#,
            expect!["`initialize`'s `params.clientInfo.version` is missing; it is a string"],
        );
        check(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}"#,
            expect!["nothing wrong"],
        );
    }
}
