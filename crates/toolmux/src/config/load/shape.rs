//! Where the file gives a list or a single value for settings that take a mapping, found
//! by walking the parsed file beside the configuration's JSON Schema.
//!
//! serde reads a struct from a list too, field by field in order (serde_json does, and so
//! does every untagged or internally tagged enum, whatever the format): `defaults: [1000]`
//! loaded as `toolTimeout: 1000`. The schema says, for every place in the file, whether it
//! takes settings (an object with `properties`) and nothing else; it is generated from the
//! same types the loader reads, with what the loader accepts beyond them added
//! ([`super::super::schema`]), so the walk follows the types without code per field.

use serde_json::Value;
use std::sync::OnceLock;

/// A place in the file that takes a mapping of settings and holds something else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Misshapen {
    /// The key's path as serde_path_to_error writes it: `mcpServers.a`, `hooks.X[0]`.
    pub(super) path: String,
    /// What the file gives there, in words ([`super::words::value_in_words`]).
    pub(super) found: String,
}

/// The first place in `value` (the parsed file) where settings belong and a list or a
/// single value stands, in the file's order of keys as parsed.
pub(super) fn check(value: &Value) -> Result<(), Misshapen> {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    let schema = SCHEMA.get_or_init(super::super::schema);
    let mut path = String::new();
    walk(value, &alternatives(schema, schema), schema, &mut path)
}

/// A schema that lets anything through.
const ANY: &Value = &Value::Bool(true);

/// How deep `$ref`s and `anyOf`s are followed from one place: far past the configuration's
/// own nesting, and a guard against a schema that refers to itself.
const MAX_DEPTH: usize = 16;

/// The plain schemas `schema` stands for: its `$ref` followed, its `anyOf` and `oneOf`
/// branches each one alternative.
fn alternatives<'s>(schema: &'s Value, root: &'s Value) -> Vec<&'s Value> {
    let mut out = Vec::new();
    collect(schema, root, 0, &mut out);
    out
}

fn collect<'s>(schema: &'s Value, root: &'s Value, depth: usize, out: &mut Vec<&'s Value>) {
    if depth > MAX_DEPTH {
        out.push(ANY);
        return;
    }
    if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
        match target.strip_prefix('#').and_then(|pointer| root.pointer(pointer)) {
            Some(resolved) => collect(resolved, root, depth + 1, out),
            // A reference outside the document: nothing is known of it.
            None => out.push(ANY),
        }
        return;
    }
    let branches = ["anyOf", "oneOf"]
        .iter()
        .filter_map(|key| schema.get(key).and_then(Value::as_array))
        .flatten()
        .collect::<Vec<_>>();
    if branches.is_empty() {
        out.push(schema);
        return;
    }
    for branch in branches {
        collect(branch, root, depth + 1, out);
    }
}

/// The JSON types `schema` (a plain one) names; `None` when it names none (any).
fn types(schema: &Value) -> Option<Vec<&str>> {
    match schema.get("type")? {
        Value::String(one) => Some(vec![one.as_str()]),
        Value::Array(many) => Some(many.iter().filter_map(Value::as_str).collect()),
        _ => None,
    }
}

fn admits(schema: &Value, kind: &str) -> bool {
    match schema {
        Value::Bool(any) => *any,
        _ => types(schema).is_none_or(|types| types.contains(&kind)),
    }
}

/// Whether `schema` is a struct's: an object of named settings and nothing else.
fn is_settings(schema: &Value) -> bool {
    types(schema).is_some_and(|types| types.iter().all(|t| matches!(*t, "object" | "null")))
        && schema.get("properties").and_then(Value::as_object).is_some_and(|p| !p.is_empty())
}

/// Whether a place with these alternatives takes settings only (or nothing: an empty
/// section is allowed wherever one is).
fn takes_settings_only(alternatives: &[&Value]) -> bool {
    alternatives.iter().any(|s| is_settings(s))
        && alternatives.iter().all(|s| is_settings(s) || types(s).is_some_and(|t| t == ["null"]))
}

fn walk(value: &Value, here: &[&Value], root: &Value, path: &mut String) -> Result<(), Misshapen> {
    match value {
        Value::Null => Ok(()),
        Value::Object(map) => {
            let objects: Vec<&Value> =
                here.iter().copied().filter(|s| admits(s, "object")).collect();
            for (key, item) in map {
                let mut inner = Vec::new();
                for schema in &objects {
                    let property = schema.get("properties").and_then(|p| p.get(key));
                    match property.or_else(|| schema.get("additionalProperties")) {
                        Some(Value::Bool(false)) => {}
                        Some(child) => collect(child, root, 0, &mut inner),
                        None => inner.push(ANY),
                    }
                }
                let before = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                walk(item, &inner, root, path)?;
                path.truncate(before);
            }
            Ok(())
        }
        _ if takes_settings_only(here) => {
            Err(Misshapen { path: path.clone(), found: super::words::value_in_words(value) })
        }
        Value::Array(items) => {
            let mut inner = Vec::new();
            for schema in here.iter().filter(|s| admits(s, "array")) {
                match schema.get("items") {
                    Some(child) => collect(child, root, 0, &mut inner),
                    None => inner.push(ANY),
                }
            }
            for (i, item) in items.iter().enumerate() {
                let before = path.len();
                path.push_str(&format!("[{i}]"));
                walk(item, &inner, root, path)?;
                path.truncate(before);
            }
            Ok(())
        }
        Value::Bool(_) | Value::Number(_) | Value::String(_) => Ok(()),
    }
}
