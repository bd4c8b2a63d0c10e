//! Tool input schemas rewritten for consumers that accept less than JSON Schema.
//!
//! Models and their clients reject schemas an MCP server may well publish: the Claude and
//! OpenAI APIs refuse `anyOf`, `oneOf` or `allOf` at the top level of a tool's input schema
//! (and OpenAI an object with no `properties`); Gemini takes a subset of OpenAPI 3.0's
//! schema object (no `$ref`, no `additionalProperties`, no `const`, `nullable` instead of a
//! `null` type, string-only `enum`). [`adapt`] rewrites a schema into what [`SchemaRules`]
//! allow, losing as little as it can: what a dropped keyword said moves into a
//! `description`, and the union's alternatives are named in the merged object's description.
//!
//! The rewritten schema is only what the model is shown. Arguments are still validated
//! against the original, so a model that mixes two alternatives of a union gets the
//! validator's error, not a wrong call.

use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// What a consumer accepts, as the rewrites [`adapt`] makes. The default changes nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchemaRules {
    /// Merge a top-level `anyOf` / `oneOf` / `allOf` of objects into one object (and drop
    /// top-level `not`, `if`/`then`/`else` and `enum`), and give the top level
    /// `"type": "object"`. Claude, OpenAI.
    pub plain_top_level: bool,
    /// Give a top-level object without `properties` an empty `properties`. OpenAI.
    pub top_level_properties: bool,
    /// Replace every local `$ref` (`#/$defs/…`, `#/definitions/…`, any `#/` pointer) by
    /// what it points to; a reference back into itself, or nested too deeply, is cut to its
    /// type with a note.
    pub inline_refs: bool,
    /// Keep only the keywords of OpenAPI 3.0's schema subset that Gemini takes, converting
    /// what can be converted (`const`, `oneOf`, type lists, `null` alternatives,
    /// `examples`, exclusive bounds, non-string `enum`s). Implies `inline_refs`.
    pub openapi_subset: bool,
}

impl SchemaRules {
    /// Whether [`adapt`] would change anything.
    pub fn is_identity(&self) -> bool {
        *self == SchemaRules::default()
    }
}

/// Keywords Gemini's function declarations accept (its `Schema` object).
const OPENAPI_KEYWORDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

/// How many schema nodes inlining may produce before it cuts deeper references, so that
/// definitions referring to each other many times cannot grow the schema without bound.
const INLINE_NODE_BUDGET: usize = 20_000;

/// How many references inlining follows one inside another before it cuts deeper ones as it
/// cuts a cycle: a chain of thousands of distinct definitions would otherwise recurse (here,
/// in the passes over the result and in dropping it) thousands of levels deep and overflow
/// the stack.
const INLINE_REF_DEPTH: usize = 64;

/// How deep in the result inlining still expands a reference, for the same reason: fewer
/// references, each a deep definition, nest as deep as many shallow ones.
const INLINE_NESTING_DEPTH: usize = 128;

/// `schema` rewritten to what `rules` allow.
pub fn adapt(schema: &Value, rules: &SchemaRules) -> Value {
    // Inlining copies only what it keeps: a schema's definitions may be most of it.
    let mut out =
        if rules.inline_refs || rules.openapi_subset { inline_refs(schema) } else { copy(schema) };
    if rules.plain_top_level {
        plain_top_level(&mut out);
    }
    if rules.openapi_subset {
        out = openapi_subset(out);
    }
    if rules.top_level_properties
        && let Value::Object(map) = &mut out
        && map.get("type") == Some(&json!("object"))
    {
        map.entry("properties").or_insert_with(|| json!({}));
    }
    out
}

// ---- `$ref` inlining -------------------------------------------------------------------

/// `schema` with every local `$ref` replaced by its target; `$defs` and `definitions`
/// dropped once nothing refers to them.
///
/// References are resolved in `schema` itself, borrowed: the walk copies only what goes into
/// the result, so the root's definitions are copied only when a reference is left in place,
/// and a definition block met inside an inlined target (a reference to `#`, or to a
/// definition holding its own `$defs`) is not copied at all, every reference resolving
/// against the root.
fn inline_refs(schema: &Value) -> Value {
    let mut inliner =
        Inliner { root: schema, stack: Vec::new(), nodes: 0, depth: 0, unresolved: false };
    let mut out = inliner.walk(schema);
    if inliner.unresolved
        && let (Value::Object(out), Value::Object(root)) = (&mut out, schema)
    {
        for key in ["$defs", "definitions"] {
            if let Some(definitions) = root.get(key) {
                out.insert(key.to_owned(), copy(definitions));
            }
        }
    }
    out
}

struct Inliner<'a> {
    root: &'a Value,
    /// The references being expanded, outermost first.
    stack: Vec<String>,
    nodes: usize,
    /// How deep in the result the value being walked lies.
    depth: usize,
    /// A reference was left in place (not local, not found, or cut by the budget).
    unresolved: bool,
}

impl Inliner<'_> {
    fn walk(&mut self, value: &Value) -> Value {
        self.nodes += 1;
        self.depth += 1;
        let walked = self.walk_children(value);
        self.depth -= 1;
        walked
    }

    fn walk_children(&mut self, value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(reference)) = map.get("$ref") {
                    return self.expand(reference, map);
                }
                let keep_definitions = self.keeps_definitions(map);
                let mut out = Map::with_capacity(map.len());
                for (key, item) in map {
                    // Definitions are inlined where they are used, not walked here.
                    if is_definitions(key) {
                        if keep_definitions {
                            out.insert(key.clone(), copy(item));
                        }
                        continue;
                    }
                    let walked = if is_data_keyword(key) { copy(item) } else { self.walk(item) };
                    out.insert(key.clone(), walked);
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(|i| self.walk(i)).collect()),
            other => copy(other),
        }
    }

    /// Whether the definitions in `map` go into the result. The root's are added back at the
    /// end if a reference was left in place; those inside an inlined target are never
    /// needed, every reference resolving against the root.
    fn keeps_definitions(&self, map: &Map<String, Value>) -> bool {
        self.stack.is_empty() && !self.root.as_object().is_some_and(|root| std::ptr::eq(root, map))
    }

    /// The target of `reference`, walked, with the referring object's other keywords
    /// (a `description` beside the `$ref`, say) laid over it.
    fn expand(&mut self, reference: &str, beside: &Map<String, Value>) -> Value {
        let target = reference.strip_prefix('#').and_then(|pointer| self.root.pointer(pointer));
        let Some(target) = target else {
            self.unresolved = true;
            return copy_map(beside);
        };
        let keep_definitions = self.keeps_definitions(beside);
        let name = reference.rsplit('/').next().unwrap_or(reference).to_owned();
        let recursive = self.stack.iter().any(|r| r == reference);
        let too_deep = self.stack.len() >= INLINE_REF_DEPTH || self.depth >= INLINE_NESTING_DEPTH;
        let mut out = if recursive || too_deep {
            // A reference back into itself, or too deep: the type, and a note of what was
            // there.
            let mut cut = Map::new();
            if let Some(kind) = target.get("type") {
                cut.insert("type".into(), copy(kind));
            }
            let why = if recursive { "recursive" } else { "nested too deeply to show" };
            cut.insert("description".into(), json!(format!("a {name} ({why})")));
            Value::Object(cut)
        } else if self.nodes > INLINE_NODE_BUDGET {
            self.unresolved = true;
            return copy_map(beside);
        } else {
            self.stack.push(reference.to_owned());
            let walked = self.walk(target);
            self.stack.pop();
            walked
        };
        if let Value::Object(out) = &mut out {
            for (key, item) in beside {
                if key == "$ref" || is_definitions(key) && !keep_definitions {
                    continue;
                }
                let walked = if is_data_keyword(key) { copy(item) } else { self.walk(item) };
                out.insert(key.clone(), walked);
            }
        }
        out
    }
}

/// `value` copied; in tests, the schema nodes copied are counted on this thread.
fn copy(value: &Value) -> Value {
    #[cfg(test)]
    tests::count_copied(value);
    value.clone()
}

/// `map` copied as an object, as [`copy`] does.
fn copy_map(map: &Map<String, Value>) -> Value {
    Value::Object(map.iter().map(|(key, item)| (key.clone(), copy(item))).collect())
}

/// Whether `key` holds definitions (`$defs`, or `definitions` before draft 2019-09).
fn is_definitions(key: &str) -> bool {
    matches!(key, "$defs" | "definitions")
}

/// Keywords whose values are data, not schemas: never rewritten.
fn is_data_keyword(key: &str) -> bool {
    matches!(key, "enum" | "const" | "default" | "examples" | "example" | "required")
}

// ---- the top level ----------------------------------------------------------------------

/// Merges a top-level union or intersection of objects into one object schema.
fn plain_top_level(schema: &mut Value) {
    if !schema.is_object() {
        *schema = json!({"type": "object"});
    }
    let Value::Object(root) = schema else { return };
    let mut notes = Vec::new();
    if let Some(Value::Array(all)) = root.remove("allOf") {
        let parts: Vec<Map<String, Value>> =
            all.iter().filter_map(|p| resolve_local(p, root)).cloned().collect();
        for part in &parts {
            merge_all_of(root, part);
        }
    }
    let union = root.remove("anyOf").or_else(|| root.remove("oneOf"));
    if let Some(Value::Array(branches)) = union {
        let branches: Vec<Map<String, Value>> =
            branches.iter().filter_map(|b| resolve_local(b, root)).cloned().collect();
        if !branches.is_empty() {
            notes.push(merge_any_of(root, &branches));
        }
    }
    for keyword in ["not", "if", "then", "else", "enum", "const"] {
        root.remove(keyword);
    }
    root.insert("type".into(), json!("object"));
    let notes: Vec<String> = notes.into_iter().flatten().collect();
    if !notes.is_empty() {
        let before = root.get("description").and_then(Value::as_str).unwrap_or("").trim_end();
        let joined = notes.join(" ");
        let text = if before.is_empty() { joined } else { format!("{before}\n\n{joined}") };
        root.insert("description".into(), Value::String(text));
    }
}

/// A branch as an object schema, following one local `$ref` (when refs were not inlined).
fn resolve_local<'a>(
    branch: &'a Value,
    root: &'a Map<String, Value>,
) -> Option<&'a Map<String, Value>> {
    let map = branch.as_object()?;
    let Some(reference) = map.get("$ref").and_then(Value::as_str) else {
        return Some(map);
    };
    let mut parts = reference.strip_prefix("#/")?.split('/');
    let (section, name) = (parts.next()?, parts.next()?);
    root.get(section)?.get(name)?.as_object()
}

/// Lays `part`'s properties and required names over `root` (every part applies).
fn merge_all_of(root: &mut Map<String, Value>, part: &Map<String, Value>) {
    if let Some(Value::Object(properties)) = part.get("properties") {
        let merged = properties_of(root);
        for (name, schema) in properties {
            match merged.get_mut(name) {
                Some(existing) if existing != schema => {
                    *existing = json!({"allOf": [existing.clone(), schema.clone()]});
                }
                Some(_) => {}
                None => {
                    merged.insert(name.clone(), schema.clone());
                }
            }
        }
    }
    let required = required_of(part);
    if !required.is_empty() {
        let mut all = required_of(root);
        all.extend(required);
        root.insert("required".into(), json!(all));
    }
    if root.get("description").is_none()
        && let Some(description) = part.get("description")
    {
        root.insert("description".into(), description.clone());
    }
}

/// Merges alternatives into `root`: every property of every branch (a property the
/// branches type differently becomes an `anyOf` of their schemas), required only what
/// every branch requires. Returns a sentence naming the alternatives, when they differ.
fn merge_any_of(root: &mut Map<String, Value>, branches: &[Map<String, Value>]) -> Option<String> {
    let own_required = required_of(root);
    let mut common: Option<BTreeSet<String>> = None;
    let merged = properties_of(root);
    for branch in branches {
        if let Some(Value::Object(properties)) = branch.get("properties") {
            for (name, schema) in properties {
                match merged.get_mut(name) {
                    Some(existing) if existing != schema => {
                        let mut options = match existing.get("anyOf") {
                            Some(Value::Array(options))
                                if existing.as_object().is_some_and(|o| o.len() == 1) =>
                            {
                                options.clone()
                            }
                            _ => vec![existing.clone()],
                        };
                        if !options.contains(schema) {
                            options.push(schema.clone());
                        }
                        *existing = json!({"anyOf": options});
                    }
                    Some(_) => {}
                    None => {
                        merged.insert(name.clone(), schema.clone());
                    }
                }
            }
        }
        let required: BTreeSet<String> = required_of(branch).into_iter().collect();
        common = Some(match common {
            None => required,
            Some(common) => common.intersection(&required).cloned().collect(),
        });
    }
    let mut required = own_required;
    for name in common.unwrap_or_default() {
        if !required.contains(&name) {
            required.push(name);
        }
    }
    if required.is_empty() {
        root.remove("required");
    } else {
        root.insert("required".into(), json!(required));
    }
    let forms: Vec<String> = branches.iter().map(describe_branch).collect();
    let distinct: BTreeSet<&String> = forms.iter().collect();
    (distinct.len() > 1)
        .then(|| format!("Give exactly one of these forms: {}.", forms.join("; or ")))
}

/// A branch in words: its required fields, or its fields, or its description.
fn describe_branch(branch: &Map<String, Value>) -> String {
    let required = required_of(branch);
    let fields: Vec<String> = if required.is_empty() {
        branch
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    } else {
        required
    };
    let mut text = match fields.as_slice() {
        [] => "no fields".to_owned(),
        [one] => format!("`{one}`"),
        many => many.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(" and "),
    };
    if let Some(title) =
        branch.get("title").or_else(|| branch.get("description")).and_then(Value::as_str)
    {
        text = format!("{text} ({})", title.trim());
    }
    text
}

fn properties_of(map: &mut Map<String, Value>) -> &mut Map<String, Value> {
    let entry = map.entry("properties").or_insert_with(|| json!({}));
    if !entry.is_object() {
        *entry = json!({});
    }
    match entry {
        Value::Object(properties) => properties,
        _ => unreachable!("set to an object above"),
    }
}

fn required_of(map: &Map<String, Value>) -> Vec<String> {
    map.get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

// ---- the OpenAPI subset -----------------------------------------------------------------

/// `schema` with only the keywords of the OpenAPI subset, recursively.
fn openapi_subset(schema: Value) -> Value {
    let Value::Object(mut map) = schema else {
        // `true` or a non-schema: anything goes, which the subset says by saying nothing.
        return json!({});
    };
    let mut notes: Vec<String> = Vec::new();

    // `allOf` of parts: laid over each other.
    if let Some(Value::Array(parts)) = map.remove("allOf") {
        for part in parts {
            if let Value::Object(part) = part {
                for (key, value) in part {
                    match (key.as_str(), map.get_mut(&key)) {
                        ("properties", Some(Value::Object(mine))) => {
                            if let Value::Object(theirs) = value {
                                mine.extend(theirs);
                            }
                        }
                        ("required", Some(Value::Array(mine))) => {
                            if let Value::Array(theirs) = value {
                                for name in theirs {
                                    if !mine.contains(&name) {
                                        mine.push(name);
                                    }
                                }
                            }
                        }
                        (_, Some(_)) => {}
                        (_, None) => {
                            map.insert(key, value);
                        }
                    }
                }
            }
        }
    }
    if let Some(one_of) = map.remove("oneOf") {
        map.entry("anyOf").or_insert(one_of);
    }
    if let Some(constant) = map.remove("const") {
        map.insert("enum".into(), json!([constant]));
    }
    if let Some(Value::Array(mut examples)) = map.remove("examples")
        && !examples.is_empty()
    {
        map.entry("example").or_insert_with(|| examples.swap_remove(0));
    }
    for (exclusive, inclusive, word) in
        [("exclusiveMinimum", "minimum", "greater"), ("exclusiveMaximum", "maximum", "less")]
    {
        match map.remove(exclusive) {
            Some(bound @ Value::Number(_)) => {
                notes.push(format!("Must be {word} than {bound}."));
                map.entry(inclusive).or_insert(bound);
            }
            // The 2019 boolean form: the bound itself is excluded.
            Some(Value::Bool(true)) => {
                if let Some(bound) = map.get(inclusive) {
                    notes.push(format!("Must be {word} than {bound}."));
                }
            }
            _ => {}
        }
    }

    // Type lists and `null`: `nullable`.
    match map.remove("type") {
        Some(Value::Array(types)) => {
            let listed = types.len();
            let mut kinds: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
            if kinds.len() < listed {
                map.insert("nullable".into(), json!(true));
            }
            match kinds.len() {
                0 => {}
                1 => {
                    map.insert("type".into(), kinds.swap_remove(0));
                }
                _ => {
                    let options: Vec<Value> =
                        kinds.into_iter().map(|t| json!({"type": t})).collect();
                    map.entry("anyOf").or_insert(json!(options));
                }
            }
        }
        Some(Value::String(kind)) if kind == "null" => {
            map.insert("nullable".into(), json!(true));
        }
        Some(kind) => {
            map.insert("type".into(), kind);
        }
        None => {}
    }
    if let Some(Value::Array(options)) = map.remove("anyOf") {
        let before = options.len();
        let options: Vec<Value> =
            options.into_iter().filter(|o| o.get("type") != Some(&json!("null"))).collect();
        if options.len() < before {
            map.insert("nullable".into(), json!(true));
        }
        match options.len() {
            0 => {}
            // One alternative left: it is the schema.
            1 => {
                if let Some(Value::Object(only)) = options.into_iter().next() {
                    for (key, value) in only {
                        map.entry(key).or_insert(value);
                    }
                }
            }
            _ => {
                map.insert(
                    "anyOf".into(),
                    Value::Array(options.into_iter().map(openapi_subset).collect()),
                );
            }
        }
    }
    // A type list above may have been undone: read it again.
    let kind = map.get("type").and_then(Value::as_str).map(str::to_owned);

    // `enum` of strings only.
    if let Some(Value::Array(values)) = map.get("enum")
        && !values.iter().all(Value::is_string)
    {
        let listed: Vec<String> = values.iter().map(Value::to_string).collect();
        notes.push(format!("One of: {}.", listed.join(", ")));
        if kind.is_none()
            && let Some(inferred) = common_type(values)
        {
            map.insert("type".into(), json!(inferred));
        }
        map.remove("enum");
    }
    if map.contains_key("enum") && kind.is_none() {
        map.insert("type".into(), json!("string"));
    }
    if let Some(Value::String(format)) = map.get("format") {
        let kept = match kind.as_deref() {
            Some("string") => matches!(format.as_str(), "date-time" | "enum"),
            Some("integer") => matches!(format.as_str(), "int32" | "int64"),
            Some("number") => matches!(format.as_str(), "float" | "double"),
            _ => false,
        };
        if !kept {
            notes.push(format!("Format: {format}."));
            map.remove("format");
        }
    }

    // Children.
    if let Some(Value::Object(properties)) = map.remove("properties") {
        let properties: Map<String, Value> =
            properties.into_iter().map(|(name, schema)| (name, openapi_subset(schema))).collect();
        if let Some(Value::Array(required)) = map.get_mut("required") {
            required.retain(|name| name.as_str().is_some_and(|n| properties.contains_key(n)));
        }
        map.insert("properties".into(), Value::Object(properties));
    } else {
        map.remove("required");
    }
    if let Some(Value::Array(mut tuple)) = map.remove("prefixItems")
        && !tuple.is_empty()
    {
        map.entry("items").or_insert_with(|| tuple.swap_remove(0));
    }
    match map.remove("items") {
        Some(Value::Array(mut tuple)) if !tuple.is_empty() => {
            map.insert("items".into(), openapi_subset(tuple.swap_remove(0)));
        }
        Some(items @ Value::Object(_)) => {
            map.insert("items".into(), openapi_subset(items));
        }
        _ => {}
    }
    if kind.as_deref() == Some("array") && !map.contains_key("items") {
        map.insert("items".into(), json!({}));
    }

    map.retain(|key, _| OPENAPI_KEYWORDS.contains(&key.as_str()));
    if !notes.is_empty() {
        let before = map.get("description").and_then(Value::as_str).unwrap_or("").trim_end();
        let joined = notes.join(" ");
        let text = if before.is_empty() { joined } else { format!("{before} {joined}") };
        map.insert("description".into(), Value::String(text));
    }
    Value::Object(map)
}

/// The one JSON type every value has, as a schema type name.
fn common_type(values: &[Value]) -> Option<&'static str> {
    let kind = |v: &Value| match v {
        Value::Bool(_) => Some("boolean"),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some("integer"),
        Value::Number(_) => Some("number"),
        Value::String(_) => Some("string"),
        _ => None,
    };
    let first = kind(values.first()?)?;
    let all_integers = values.iter().all(|v| kind(v) == Some("integer"));
    let all_numbers = values.iter().all(|v| matches!(kind(v), Some("integer" | "number")));
    if all_integers {
        Some("integer")
    } else if all_numbers {
        Some("number")
    } else {
        values.iter().all(|v| kind(v) == Some(first)).then_some(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};
    use std::cell::Cell;

    thread_local! {
        /// Schema nodes [`copy`] copied on this thread.
        static COPIED: Cell<usize> = const { Cell::new(0) };
    }

    /// Counts the nodes of `value` as copied.
    pub(super) fn count_copied(value: &Value) {
        fn nodes(value: &Value) -> usize {
            1 + match value {
                Value::Object(map) => map.values().map(nodes).sum(),
                Value::Array(items) => items.iter().map(nodes).sum(),
                _ => 0,
            }
        }
        COPIED.set(COPIED.get() + nodes(value));
    }

    fn check(schema: Value, rules: SchemaRules, expected: Expect) {
        let out = adapt(&schema, &rules);
        expected.assert_eq(&serde_json::to_string_pretty(&out).unwrap());
    }

    const CLAUDE: SchemaRules = SchemaRules {
        plain_top_level: true,
        top_level_properties: false,
        inline_refs: false,
        openapi_subset: false,
    };
    const OPENAI: SchemaRules = SchemaRules { top_level_properties: true, ..CLAUDE };
    const GEMINI: SchemaRules = SchemaRules {
        plain_top_level: true,
        top_level_properties: false,
        inline_refs: true,
        openapi_subset: true,
    };

    #[test]
    fn default_rules_change_nothing() {
        let schema = json!({"anyOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"type": "object"}}});
        assert!(SchemaRules::default().is_identity());
        assert_eq!(adapt(&schema, &SchemaRules::default()), schema);
    }

    #[test]
    fn a_top_level_union_becomes_one_object_naming_its_forms() {
        let schema = json!({
            "description": "Find a user.",
            "properties": {"verbose": {"type": "boolean"}},
            "oneOf": [
                {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
                {"type": "object", "properties": {"email": {"type": "string"}, "id": {"type": "string"}},
                 "required": ["email"]}
            ]
        });
        check(
            schema,
            CLAUDE,
            expect![[r#"
                {
                  "description": "Find a user.\n\nGive exactly one of these forms: `id`; or `email`.",
                  "properties": {
                    "email": {
                      "type": "string"
                    },
                    "id": {
                      "anyOf": [
                        {
                          "type": "integer"
                        },
                        {
                          "type": "string"
                        }
                      ]
                    },
                    "verbose": {
                      "type": "boolean"
                    }
                  },
                  "type": "object"
                }"#]],
        );
    }

    #[test]
    fn required_stays_what_every_branch_requires() {
        let schema = json!({"anyOf": [
            {"properties": {"q": {"type": "string"}, "a": {}}, "required": ["q", "a"]},
            {"properties": {"q": {"type": "string"}, "b": {}}, "required": ["q", "b"]}
        ]});
        let out = adapt(&schema, &CLAUDE);
        assert_eq!(out["required"], json!(["q"]));
        assert_eq!(out["type"], "object");
        assert!(out["description"].as_str().unwrap().contains("`q` and `a`; or `q` and `b`"));
    }

    #[test]
    fn a_top_level_all_of_is_laid_together_through_refs() {
        let schema = json!({
            "allOf": [{"$ref": "#/definitions/base"}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}],
            "definitions": {"base": {"properties": {"a": {"type": "number"}}, "required": ["a"]}}
        });
        let out = adapt(&schema, &OPENAI);
        assert_eq!(out["properties"], json!({"a": {"type": "number"}, "b": {"type": "string"}}));
        assert_eq!(out["required"], json!(["a", "b"]));
        assert!(out.get("allOf").is_none());
    }

    #[test]
    fn openai_gets_properties_on_an_empty_object_and_an_object_for_anything_else() {
        assert_eq!(
            adapt(&json!({"type": "object"}), &OPENAI),
            json!({"type": "object", "properties": {}})
        );
        assert_eq!(adapt(&json!(true), &OPENAI), json!({"type": "object", "properties": {}}));
        assert_eq!(
            adapt(&json!({"not": {"required": ["x"]}}), &OPENAI),
            json!({"type": "object", "properties": {}})
        );
    }

    #[test]
    fn refs_are_inlined_with_their_neighbours_and_cycles_cut() {
        let schema = json!({
            "type": "object",
            "properties": {
                "tree": {"$ref": "#/$defs/node", "description": "The root."},
                "path": {"$ref": "#/properties/name"},
                "name": {"type": "string"},
                "far": {"$ref": "https://example.com/schema.json"}
            },
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }}}
        });
        let rules = SchemaRules { inline_refs: true, ..SchemaRules::default() };
        let out = adapt(&schema, &rules);
        assert_eq!(out["properties"]["tree"]["description"], "The root.");
        assert_eq!(
            out["properties"]["tree"]["properties"]["children"]["items"],
            json!({"type": "object", "description": "a node (recursive)"})
        );
        assert_eq!(out["properties"]["path"], json!({"type": "string"}));
        // A reference that cannot be followed stays, and so do the definitions.
        assert_eq!(out["properties"]["far"], json!({"$ref": "https://example.com/schema.json"}));
        assert!(out.get("$defs").is_some());
        let resolved = adapt(
            &json!({"properties": {"t": {"$ref": "#/$defs/node"}}, "$defs": schema["$defs"]}),
            &rules,
        );
        assert!(resolved.get("$defs").is_none(), "{resolved}");
    }

    #[test]
    fn refs_that_multiply_stop_at_the_budget() {
        // Each level refers to the next twice: 2^40 nodes if expanded in full.
        let mut defs = Map::new();
        for level in 0..40 {
            let next = format!("#/$defs/l{}", level + 1);
            defs.insert(
                format!("l{level}"),
                json!({"type": "object", "properties": {"a": {"$ref": next}, "b": {"$ref": next}}}),
            );
        }
        defs.insert("l40".into(), json!({"type": "string"}));
        let schema =
            json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/l0"}}, "$defs": defs});
        let out = adapt(&schema, &SchemaRules { inline_refs: true, ..SchemaRules::default() });
        assert!(out.to_string().len() < 10_000_000);
    }

    #[test]
    fn definitions_are_read_in_place_not_copied() {
        // 40,000 nodes of definitions, of which the tool uses one of ten nodes.
        let mut defs = Map::new();
        for i in 0..4_000 {
            let def = json!({"type": "object", "properties": {
                "a": {"type": "string"},
                "b": {"type": "array", "items": {"type": "integer"}}
            }});
            defs.insert(format!("d{i}"), def);
        }
        let schema = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/d7"}},
                            "$defs": defs});
        let expected = json!({"type": "object", "properties": {"x": schema["$defs"]["d7"]}});
        for rules in [SchemaRules { inline_refs: true, ..SchemaRules::default() }, GEMINI] {
            COPIED.set(0);
            let out = adapt(&schema, &rules);
            assert_eq!(out, expected);
            assert!(COPIED.get() < 100, "{} nodes copied", COPIED.get());
        }
        // A reference left in place keeps the definitions, copied once; a reference to the
        // root inlines it without its definitions.
        let mut unresolved = schema.clone();
        unresolved["properties"]["y"] = json!({"$ref": "#/$defs/missing"});
        unresolved["properties"]["z"] = json!({"$ref": "#"});
        COPIED.set(0);
        let out = adapt(&unresolved, &SchemaRules { inline_refs: true, ..SchemaRules::default() });
        assert_eq!(out["$defs"], schema["$defs"]);
        assert!(out["properties"]["z"].get("$defs").is_none(), "{}", out["properties"]["z"]);
        assert!(COPIED.get() < 40_100, "{} nodes copied", COPIED.get());
    }

    #[test]
    fn a_long_chain_of_refs_is_cut_before_it_overflows_the_stack() {
        // l0 -> l1 -> ... -> l{length}, each definition distinct (no cycle) and one or
        // twenty levels deep itself, adapted on a thread with a tokio worker's 2 MiB stack.
        for (length, nesting) in [(20_000, 1), (2_000, 20)] {
            let mut defs = Map::new();
            for level in 0..length {
                let mut def = json!({"$ref": format!("#/$defs/l{}", level + 1)});
                for _ in 0..nesting {
                    // Not `json!`, which would copy `def` each time.
                    let properties = Map::from_iter([("n".to_owned(), def)]);
                    let wrapper = [("type", json!("object")), ("properties", properties.into())];
                    def = Value::Object(
                        wrapper.map(|(k, v)| (k.to_owned(), v)).into_iter().collect(),
                    );
                }
                defs.insert(format!("l{level}"), def);
            }
            defs.insert(format!("l{length}"), json!({"type": "string"}));
            let schema = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/l0"}},
                                "$defs": defs});
            let cut = std::thread::Builder::new()
                .stack_size(2 << 20)
                .spawn(move || adapt(&schema, &GEMINI).to_string().contains("too deeply"))
                .expect("a thread starts")
                .join()
                .expect("adapting the chain did not overflow the stack");
            assert!(cut, "{nesting}");
        }
        let out = adapt(
            &json!({"properties": {"x": {"$ref": "#/$defs/l0"}}, "$defs": {
                "l0": {"type": "object", "properties": {"y": {"$ref": "#/$defs/l1"}}},
                "l1": {"type": "string"}
            }}),
            &SchemaRules { inline_refs: true, ..SchemaRules::default() },
        );
        assert_eq!(out["properties"]["x"]["properties"]["y"], json!({"type": "string"}));
    }

    #[test]
    fn gemini_gets_the_openapi_subset() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "mode": {"const": "fast"},
                "limit": {"type": ["integer", "null"], "exclusiveMinimum": 0, "format": "uint32"},
                "level": {"enum": [1, 2, 3], "description": "How deep."},
                "when": {"type": "string", "format": "date-time"},
                "site": {"type": "string", "format": "uri", "examples": ["https://a.example"]},
                "tags": {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "null"}]}},
                "pair": {"type": "array", "prefixItems": [{"type": "string"}]},
                "either": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                "ref": {"$ref": "#/$defs/point"}
            },
            "required": ["mode", "gone"],
            "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}},
                                "patternProperties": {"^y": {}}}}
        });
        check(
            schema,
            GEMINI,
            expect![[r#"
                {
                  "properties": {
                    "either": {
                      "anyOf": [
                        {
                          "type": "string"
                        },
                        {
                          "type": "number"
                        }
                      ]
                    },
                    "level": {
                      "description": "How deep. One of: 1, 2, 3.",
                      "type": "integer"
                    },
                    "limit": {
                      "description": "Must be greater than 0. Format: uint32.",
                      "minimum": 0,
                      "nullable": true,
                      "type": "integer"
                    },
                    "mode": {
                      "enum": [
                        "fast"
                      ],
                      "type": "string"
                    },
                    "pair": {
                      "items": {
                        "type": "string"
                      },
                      "type": "array"
                    },
                    "ref": {
                      "properties": {
                        "x": {
                          "type": "number"
                        }
                      },
                      "type": "object"
                    },
                    "site": {
                      "description": "Format: uri.",
                      "example": "https://a.example",
                      "type": "string"
                    },
                    "tags": {
                      "items": {
                        "nullable": true,
                        "type": "string"
                      },
                      "type": "array"
                    },
                    "when": {
                      "format": "date-time",
                      "type": "string"
                    }
                  },
                  "required": [
                    "mode"
                  ],
                  "type": "object"
                }"#]],
        );
    }
}
