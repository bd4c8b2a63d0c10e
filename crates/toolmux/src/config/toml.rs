//! TOML configuration files (Codex's `config.toml`, or toolmux's own keys in TOML): the
//! document as a JSON value for the steps every format shares, and the line of a key for
//! messages.

use serde_json::{Map, Number, Value};
use toml_span::value::ValueInner;

/// A syntax error: its message and 1-based line and column.
pub(crate) struct SyntaxError {
    pub message: String,
    pub position: (usize, usize),
}

/// `text` parsed as TOML, as JSON: tables are objects, datetimes their text; a float that
/// JSON cannot hold (`nan`, `inf`) is `null`.
pub(crate) fn to_json(text: &str) -> Result<Value, SyntaxError> {
    let mut value = toml_span::parse(text).map_err(|e| SyntaxError {
        message: e.to_string(),
        position: line_column(text, e.span.start),
    })?;
    Ok(convert(&mut value))
}

fn convert(value: &mut toml_span::Value<'_>) -> Value {
    match value.take() {
        ValueInner::String(s) => Value::String(s.into_owned()),
        ValueInner::Integer(i) => Value::from(i),
        ValueInner::Float(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
        ValueInner::Boolean(b) => Value::Bool(b),
        ValueInner::Array(items) => {
            Value::Array(items.into_iter().map(|mut v| convert(&mut v)).collect())
        }
        ValueInner::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(key, mut v)| (key.name.into_owned(), convert(&mut v)))
                .collect::<Map<String, Value>>(),
        ),
    }
}

/// The line and column of the key at `path` (`mcp_servers.docs.comand`, as
/// serde_path_to_error writes paths; `[i]` for array items), or of the deepest part of it
/// that exists.
pub(crate) fn position(text: &str, path: &str) -> Option<(usize, usize)> {
    let root = toml_span::parse(text).ok()?;
    let mut current = &root;
    let mut found = None;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, indices) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            let Some((k, v)) =
                current.as_table().and_then(|t| t.iter().find(|(k, _)| k.name == key))
            else {
                break;
            };
            found = Some(k.span.start);
            current = v;
        }
        for index in indices.split(['[', ']']).filter(|i| !i.is_empty()) {
            let Some(item) = index.parse::<usize>().ok().and_then(|i| current.as_array()?.get(i))
            else {
                return found.map(|offset| line_column(text, offset));
            };
            found = Some(item.span.start);
            current = item;
        }
    }
    found.map(|offset| line_column(text, offset))
}

/// The 1-based line and column (in characters) of byte `offset` in `text`, for messages
/// about any configuration format.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.chars().rev().take_while(|&c| c != '\n').count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn documents_become_json_and_keys_have_lines() {
        let text = "model = \"o3\"\n\n[mcp_servers.docs]\ncommand = \"docs\"\nargs = [\"-p\", 4]\nratio = 0.5\n\n[mcp_servers.docs.env]\nKEY = \"v\"\n";
        assert_eq!(
            to_json(text).ok(),
            Some(
                json!({"model": "o3", "mcp_servers": {"docs": {"command": "docs", "args": ["-p", 4], "ratio": 0.5, "env": {"KEY": "v"}}}})
            )
        );
        assert_eq!(position(text, "mcp_servers.docs.args[1]"), Some((5, 15)));
        assert_eq!(position(text, "mcp_servers.docs.env.KEY"), Some((9, 1)));
        assert_eq!(position(text, "mcp_servers.docs.nothing"), Some((3, 14)));
        let Err(e) = to_json("a = \n") else { panic!("not TOML") };
        assert_eq!(e.position.0, 1, "{}", e.message);
    }
}
