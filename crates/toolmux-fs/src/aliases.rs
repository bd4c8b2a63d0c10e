//! Other programs' names for the tools' arguments, renamed to the names of the tools'
//! schemas: the seed engine's `filePath`, `oldString`, `newString`, `replaceAll`, `context`,
//! `headLimit` and `outputMode`, and Claude Code's `file_path`. Callers and hooks written
//! against those names work unchanged, while the schemas shown to models stay small.

use serde_json::{Map, Value};

/// `(alias, name)` pairs of the arguments of `tool` (its provider-local name).
fn aliases(tool: &str) -> &'static [(&'static str, &'static str)] {
    match tool {
        "read" | "write" | "multi_edit" => &[("filePath", "path"), ("file_path", "path")],
        "edit" => &[
            ("filePath", "path"),
            ("file_path", "path"),
            ("oldString", "old_string"),
            ("newString", "new_string"),
            ("replaceAll", "replace_all"),
        ],
        "apply_patch" => &[("patch", "input")],
        "grep" => &[("context", "-C"), ("headLimit", "head_limit"), ("outputMode", "output_mode")],
        _ => &[],
    }
}

/// The aliases of the names of one of `multi_edit`'s `edits`.
const EDIT_ALIASES: &[(&str, &str)] =
    &[("oldString", "old_string"), ("newString", "new_string"), ("replaceAll", "replace_all")];

/// Renames the aliases in `arguments` of `tool` to the schema's names. An alias given
/// beside its name with the same value is dropped; with another value it is an error
/// naming both. Arguments that are not an object are left for validation to refuse.
pub(crate) fn normalize(tool: &str, arguments: &mut Value) -> Result<(), String> {
    let Value::Object(map) = arguments else { return Ok(()) };
    rename(map, aliases(tool), "")?;
    if tool == "multi_edit"
        && let Some(Value::Array(edits)) = map.get_mut("edits")
    {
        for (at, edit) in edits.iter_mut().enumerate() {
            if let Value::Object(edit) = edit {
                rename(edit, EDIT_ALIASES, &format!("in `edits[{at}]`: "))?;
            }
        }
    }
    Ok(())
}

fn rename(
    map: &mut Map<String, Value>,
    aliases: &[(&str, &str)],
    within: &str,
) -> Result<(), String> {
    for &(alias, name) in aliases {
        let Some(value) = map.remove(alias) else { continue };
        match map.get(name) {
            Some(given) if *given != value => {
                return Err(format!(
                    "{within}`{alias}` is another name for `{name}`, and the two were given \
                     different values: give only `{name}`"
                ));
            }
            Some(_) => {}
            None => {
                map.insert(name.to_owned(), value);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};
    use serde_json::json;

    fn check(tool: &str, mut arguments: Value, expect: Expect) {
        let shown = match normalize(tool, &mut arguments) {
            Ok(()) => arguments.to_string(),
            Err(e) => format!("error: {e}"),
        };
        expect.assert_eq(&shown);
    }

    #[test]
    fn aliases_become_the_schema_s_names() {
        check(
            "edit",
            json!({"filePath": "a", "oldString": "x", "newString": "y", "replaceAll": true}),
            expect![[r#"{"new_string":"y","old_string":"x","path":"a","replace_all":true}"#]],
        );
        check(
            "write",
            json!({"file_path": "a", "content": ""}),
            expect![[r#"{"content":"","path":"a"}"#]],
        );
        check(
            "grep",
            json!({"pattern": "p", "context": 2, "headLimit": 5, "offset": 1}),
            expect![[r#"{"-C":2,"head_limit":5,"offset":1,"pattern":"p"}"#]],
        );
        check(
            "multi_edit",
            json!({"file_path": "a", "edits": [{"oldString": "x", "newString": "y"}]}),
            expect![[r#"{"edits":[{"new_string":"y","old_string":"x"}],"path":"a"}"#]],
        );
        // Names of other tools are theirs: `context` means nothing to `read`.
        check("read", json!({"path": "a", "context": 2}), expect![[r#"{"context":2,"path":"a"}"#]]);
        check("read", json!("a"), expect![[r#""a""#]]);
    }

    #[test]
    fn an_alias_beside_its_name_must_agree_with_it() {
        check("write", json!({"path": "a", "file_path": "a"}), expect![[r#"{"path":"a"}"#]]);
        check(
            "write",
            json!({"path": "a", "filePath": "b"}),
            expect![
                "error: `filePath` is another name for `path`, and the two were given different values: give only `path`"
            ],
        );
        check(
            "multi_edit",
            json!({"path": "a", "edits": [{"old_string": "x", "oldString": "y"}]}),
            expect![
                "error: in `edits[0]`: `oldString` is another name for `old_string`, and the two were given different values: give only `old_string`"
            ],
        );
    }
}
