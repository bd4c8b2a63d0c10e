//! A `tools/call` result rmcp could not read as one, read part by part: a content part of
//! a type MCP does not define, or a text part without text, is replaced by a note saying
//! which part and what was wrong, and the rest of the result is kept.
//!
//! rmcp parses a result whole, so one bad part made the answer no `CallToolResult` and the
//! call failed as `unexpected reply to tools/call: a result with fields content`, naming
//! neither the part nor the fault.

use rmcp::model::{CallToolResult, ContentBlock, ServerResult};
use serde_json::{Map, Value};
use toolmux_core::json_kind;

/// The content part types MCP defines.
const PART_TYPES: [&str; 5] = ["text", "image", "audio", "resource", "resource_link"];

/// A call result from an answer rmcp did not take for one, with each part it could not
/// read replaced by a note and the notes for a warning; or what is wrong with the answer
/// as a whole.
pub(super) fn call_result(answer: &ServerResult) -> Result<(CallToolResult, Vec<String>), String> {
    let raw = match answer {
        ServerResult::CustomResult(raw) => &raw.0,
        ServerResult::EmptyResult(_) => {
            return Err("it is an empty object `{}`, without `content` (a list of parts) or \
                        `isError`; the server does not follow MCP, so check whether the call ran"
                .to_owned());
        }
        other => return Err(format!("it is {}", super::variant_name(other))),
    };
    let Value::Object(object) = raw else {
        return Err(format!("it is {}", json_kind(raw)));
    };
    let content = match object.get("content") {
        Some(Value::Array(parts)) => parts,
        Some(other) => {
            return Err(format!("its `content` is {}, not a list of parts", json_kind(other)));
        }
        None => {
            let fields = object.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
            return Err(format!("it has no `content` (a list of parts), only the fields {fields}"));
        }
    };
    let mut notes = Vec::new();
    let mut kept = Vec::with_capacity(content.len());
    for (index, part) in content.iter().enumerate() {
        match part_of(part) {
            Ok(part) => kept.push(part),
            Err(why) => {
                let note = format!("content[{index}]: {why}");
                kept.push(ContentBlock::text(format!(
                    "[content[{index}] of the tool's result was left out: {why}]"
                )));
                notes.push(note);
            }
        }
    }
    let mut rest: Map<String, Value> = object.clone();
    rest.insert("content".to_owned(), Value::Array(Vec::new()));
    let mut result: CallToolResult =
        serde_json::from_value(Value::Object(rest)).map_err(|e| e.to_string())?;
    result.content = kept;
    Ok((result, notes))
}

/// One content part, or why it is none.
fn part_of(part: &Value) -> Result<ContentBlock, String> {
    let Value::Object(fields) = part else {
        return Err(format!("{}, not a content part", json_kind(part)));
    };
    let kind = match fields.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(other) => return Err(format!("its `type` is {}", json_kind(other))),
        None => return Err("it has no `type`".to_owned()),
    };
    if !PART_TYPES.contains(&kind) {
        return Err(format!("unknown type \"{}\"", shown(kind)));
    }
    if kind == "text" && !fields.get("text").is_some_and(Value::is_string) {
        return Err("a text part without a `text` string".to_owned());
    }
    serde_json::from_value(part.clone()).map_err(|e| format!("a malformed {kind} part: {e}"))
}

/// `text` cut to 40 characters for a message.
fn shown(text: &str) -> &str {
    &text[..text.floor_char_boundary(40)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(answer: Value, expect: expect_test::Expect) {
        let answer: ServerResult = serde_json::from_value(answer).unwrap();
        let shown = match call_result(&answer) {
            Ok((result, notes)) => {
                let texts: Vec<String> = result
                    .content
                    .iter()
                    .map(|c| c.as_text().map_or("(not text)".to_owned(), |t| t.text.clone()))
                    .collect();
                format!("ok {texts:?} error={:?} notes={notes:?}", result.is_error)
            }
            Err(why) => format!("err {why}"),
        };
        expect.assert_eq(&shown);
    }

    #[test]
    fn bad_parts_are_replaced_by_notes() {
        check(
            json!({"content": [{"type": "text", "text": "a"}, {"type": "foo", "foo": 1}]}),
            expect_test::expect![[
                r#"ok ["a", "[content[1] of the tool's result was left out: unknown type \"foo\"]"] error=None notes=["content[1]: unknown type \"foo\""]"#
            ]],
        );
        check(
            json!({"content": [{"type": "text"}, 3, {"text": "x"}], "isError": true}),
            expect_test::expect![[
                r#"ok ["[content[0] of the tool's result was left out: a text part without a `text` string]", "[content[1] of the tool's result was left out: a number, not a content part]", "[content[2] of the tool's result was left out: it has no `type`]"] error=Some(true) notes=["content[0]: a text part without a `text` string", "content[1]: a number, not a content part", "content[2]: it has no `type`"]"#
            ]],
        );
        check(
            json!({"content": [{"type": "image", "data": 5, "mimeType": "image/png"}]}),
            expect_test::expect![[
                r#"ok ["[content[0] of the tool's result was left out: a malformed image part: invalid type: integer `5`, expected a string]"] error=None notes=["content[0]: a malformed image part: invalid type: integer `5`, expected a string"]"#
            ]],
        );
    }

    #[test]
    fn an_answer_that_is_no_result_says_what_it_lacks() {
        check(
            json!({}),
            expect_test::expect![
                "err it is an empty object `{}`, without `content` (a list of parts) or `isError`; the server does not follow MCP, so check whether the call ran"
            ],
        );
        check(
            json!({"contents": []}),
            expect_test::expect!["err it is a result with fields contents"],
        );
        check(
            json!({"content": "hi"}),
            expect_test::expect!["err its `content` is a string, not a list of parts"],
        );
    }
}
