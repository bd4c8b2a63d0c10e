//! OpenAPI schemas to JSON Schema 2020-12: `$ref`s to anywhere in the document become
//! `#/$defs/<name>`, every referenced schema is converted once per document and shared by
//! every operation, and each operation gets only the definitions it can reach.
//!
//! OpenAPI 3.0 and Swagger keywords are normalized: `nullable` (and `x-nullable`) adds
//! `null` to the type, boolean `exclusiveMinimum`/`exclusiveMaximum` become numbers,
//! `example` becomes `examples`, Swagger's `type: file` becomes a binary string, an array of
//! `items` becomes `prefixItems`; `discriminator`, `xml`, `externalDocs`, `$id`, `$schema`
//! and `x-` extensions are dropped (a `oneOf` beside a `discriminator` becomes `anyOf`:
//! without the discriminator, overlapping branches would refuse every valid value). A converter works in one [`Direction`]: in requests
//! `readOnly` properties are left out (with their `required` entries: only the server sets
//! them), in responses `writeOnly` ones (a server never returns them).
//!
//! `$ref: '#'` is the nearest enclosing schema with an `$id` (OpenAPI 3.1), never the
//! OpenAPI document; a JSON pointer (`#/$defs/Leaf`) is within that schema too when it
//! has the place, else in the document; a plain-name fragment (`#node`) is the schema of that `$anchor` or
//! `$dynamicAnchor` in the same resource; `$dynamicRef` and `$recursiveRef` are resolved as
//! such references.
//!
//! Recursion into a part of the value stays a reference; a cycle that never goes into one
//! (`A` is `allOf: [A, …]`) is cut where it closes, with a warning (see
//! `SchemaConverter::break_in_place_cycles`).

use super::document::{Document, escape_token, percent_decode};
use super::external::Externals;
use crate::RestError;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One converted definition.
#[derive(Debug)]
struct Definition {
    schema: Value,
    /// Names of the definitions its schema refers to directly.
    refs: BTreeSet<String>,
}

/// What the schemas of a converter describe, which decides the properties left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Arguments of a request: `readOnly` properties are left out.
    Request,
    /// A response body: `writeOnly` properties are left out.
    Response,
}

/// Converts schemas of one document, caching every definition. The cache holds one
/// direction's conversions, so requests and responses each need their own converter.
#[derive(Debug)]
pub(crate) struct SchemaConverter<'d> {
    doc: &'d Document,
    direction: Direction,
    /// Definition name by document pointer.
    names: HashMap<String, String>,
    /// Pointer by definition name (to keep names unique).
    taken: HashMap<String, String>,
    defs: HashMap<String, Definition>,
    /// Definitions registered and not yet converted, in the order met: each is queued
    /// once, when its name is given, so settling a chain of n references is n steps, where
    /// looking through every name for those not converted made it n² (50 s for 20,000).
    pending: Vec<String>,
    /// Whether each `pattern` seen compiles with the validator's regex engine.
    patterns: HashMap<String, bool>,
    /// Definitions that could not be converted (a dangling or external reference inside),
    /// with the file, the place and the reason; only operations reaching one of them fail.
    broken: HashMap<String, (String, String, String)>,
    /// Warnings about what was read otherwise than written (cycles of references that never
    /// go into a part of the value), not yet taken by [`Self::take_warnings`].
    warnings: Vec<String>,
}

/// Keywords whose value is one schema.
const SCHEMA_KEYWORDS: &[&str] = &[
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
    "contentSchema",
];
/// Keywords whose value is an array of schemas.
const SCHEMA_ARRAY_KEYWORDS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
/// Keywords whose value is a map of schemas.
const SCHEMA_MAP_KEYWORDS: &[&str] =
    &["properties", "patternProperties", "dependentSchemas", "$defs", "definitions"];
/// Keywords dropped: OpenAPI-only or harmful in a standalone schema.
const DROPPED: &[&str] = &[
    "discriminator",
    "xml",
    "externalDocs",
    "$id",
    "$schema",
    "$anchor",
    "$dynamicAnchor",
    "$recursiveAnchor",
    "nullable",
    "x-nullable",
    "example",
    "collectionFormat",
];

impl<'d> SchemaConverter<'d> {
    pub(crate) fn new(doc: &'d Document, direction: Direction) -> Self {
        SchemaConverter {
            doc,
            direction,
            names: HashMap::new(),
            taken: HashMap::new(),
            defs: HashMap::new(),
            pending: Vec::new(),
            patterns: HashMap::new(),
            broken: HashMap::new(),
            warnings: Vec::new(),
        }
    }

    /// The warnings found since the last call.
    pub(crate) fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// Converts `schema`, found at `pointer`; references are registered, not followed.
    pub(crate) fn convert(&mut self, schema: &Value, pointer: &str) -> Result<Value, RestError> {
        match schema {
            Value::Bool(_) => Ok(schema.clone()),
            Value::Object(map) => self.convert_object(map, pointer),
            // A schema of another type is invalid; accept anything rather than fail.
            _ => Ok(json!({})),
        }
    }

    fn convert_object(
        &mut self,
        map: &Map<String, Value>,
        pointer: &str,
    ) -> Result<Value, RestError> {
        let mut out = Map::new();
        let omitted = self.omitted_properties(map);
        // Whether a `patternProperties` entry was dropped for a pattern no validator
        // compiles: the properties it named would then fall to `additionalProperties`.
        let mut pattern_dropped = false;
        for (key, value) in map {
            if DROPPED.contains(&key.as_str()) || key.starts_with("x-") {
                continue;
            }
            let at = || format!("{pointer}/{}", escape_token(key));
            let converted = match key.as_str() {
                "$ref" => match value.as_str() {
                    Some(reference) => Value::String(self.reference(reference, &at())?),
                    None => continue,
                },
                // The recursion of 2020-12 (`$dynamicRef: '#node'` to a `$dynamicAnchor`)
                // and 2019-09 (`$recursiveRef: '#'`) is resolved as a plain reference to
                // the anchor of its own schema resource: what it means unless another
                // resource extends the schema, which no operation does. Left in, the
                // validator resolves it against nothing and the tool's schema stops
                // checking arguments.
                "$dynamicRef" | "$recursiveRef" => {
                    let Some(reference) = value.as_str() else { continue };
                    if map.contains_key("$ref") {
                        return Err(self.doc.error(
                            &at(),
                            format!("`{key}` beside `$ref` in one schema is not supported"),
                        ));
                    }
                    let converted = Value::String(self.reference(reference, &at())?);
                    out.insert("$ref".into(), converted);
                    continue;
                }
                "items" => match value {
                    Value::Array(items) => {
                        let mut converted = Vec::with_capacity(items.len());
                        for (i, item) in items.iter().enumerate() {
                            converted.push(self.convert(item, &format!("{}/{i}", at()))?);
                        }
                        out.insert("prefixItems".into(), Value::Array(converted));
                        continue;
                    }
                    other => self.convert(other, &at())?,
                },
                "required" => match value {
                    Value::Array(names) => {
                        let mut seen = BTreeSet::new();
                        let unique: Vec<Value> = names
                            .iter()
                            .filter(|n| {
                                n.as_str().is_some_and(|n| {
                                    !omitted.contains(n) && seen.insert(n.to_owned())
                                })
                            })
                            .cloned()
                            .collect();
                        Value::Array(unique)
                    }
                    // Swagger-style `required: true` on a property means nothing here.
                    _ => continue,
                },
                "exclusiveMinimum" | "exclusiveMaximum" => match value {
                    Value::Bool(true) => {
                        let bound = if key == "exclusiveMinimum" { "minimum" } else { "maximum" };
                        match map.get(bound) {
                            Some(limit) => limit.clone(),
                            None => continue,
                        }
                    }
                    Value::Bool(false) => continue,
                    other => other.clone(),
                },
                "minimum" | "maximum" => {
                    let exclusive =
                        if key == "minimum" { "exclusiveMinimum" } else { "exclusiveMaximum" };
                    if map.get(exclusive) == Some(&Value::Bool(true)) {
                        continue;
                    }
                    value.clone()
                }
                "type" => match value {
                    Value::String(t) if t == "file" => {
                        out.insert("format".into(), Value::String("binary".into()));
                        Value::String("string".into())
                    }
                    Value::String(t) if is_type_name(t) => value.clone(),
                    Value::Array(types) => {
                        let mut seen = BTreeSet::new();
                        Value::Array(
                            types
                                .iter()
                                .filter(|t| {
                                    t.as_str().is_some_and(|t| is_type_name(t) && seen.insert(t))
                                })
                                .cloned()
                                .collect(),
                        )
                    }
                    // An unknown type name would make the schema invalid; leave it open.
                    _ => continue,
                },
                "enum" | "examples" if !value.is_array() => continue,
                "pattern" => match value {
                    Value::String(pattern) => {
                        let pattern = ecma_braces(pattern);
                        if !self.pattern_compiles(&pattern) {
                            // Validators would refuse the whole schema; the model loses
                            // one constraint instead.
                            continue;
                        }
                        Value::String(pattern)
                    }
                    _ => continue,
                },
                k if SCHEMA_KEYWORDS.contains(&k) => self.convert(value, &at())?,
                k if SCHEMA_ARRAY_KEYWORDS.contains(&k) => match value {
                    Value::Array(items) => {
                        let mut converted = Vec::with_capacity(items.len());
                        for (i, item) in items.iter().enumerate() {
                            converted.push(self.convert(item, &format!("{}/{i}", at()))?);
                        }
                        Value::Array(converted)
                    }
                    _ => continue,
                },
                k if SCHEMA_MAP_KEYWORDS.contains(&k) => match value {
                    Value::Object(entries) => {
                        let base = at();
                        let mut converted = Map::new();
                        for (name, sub) in entries {
                            if k == "properties" && omitted.contains(name.as_str()) {
                                continue;
                            }
                            let sub_at = format!("{base}/{}", escape_token(name));
                            // A `patternProperties` key is a regex as `pattern` is, and is
                            // cleaned up the same way: one validators refuse would make
                            // the whole schema fail to compile.
                            let name = if k == "patternProperties" {
                                let pattern = ecma_braces(name);
                                if !self.pattern_compiles(&pattern) {
                                    pattern_dropped = true;
                                    continue;
                                }
                                pattern
                            } else {
                                name.clone()
                            };
                            converted.insert(name, self.convert(sub, &sub_at)?);
                        }
                        Value::Object(converted)
                    }
                    _ => continue,
                },
                _ => value.clone(),
            };
            // `oneOf` with a `discriminator` means "the branch the discriminator names";
            // without the discriminator, which JSON Schema has not, branches that overlap
            // (a `Cat` and a `Dog` both open to more properties) make every valid value
            // match two of them, and `oneOf` refuses it. `anyOf` keeps what the branches
            // allow.
            if key == "oneOf" && map.contains_key("discriminator") {
                out.insert("anyOf".into(), converted);
                continue;
            }
            out.insert(key.clone(), converted);
        }
        if pattern_dropped {
            // The properties the dropped pattern allowed must not be refused as extra.
            out.remove("additionalProperties");
            out.remove("unevaluatedProperties");
        }
        if let Some(example) = map.get("example")
            && !out.contains_key("examples")
        {
            out.insert("examples".into(), Value::Array(vec![example.clone()]));
        }
        let nullable = map.get("nullable").or_else(|| map.get("x-nullable"));
        if nullable == Some(&Value::Bool(true)) {
            return Ok(make_nullable(out));
        }
        Ok(Value::Object(out))
    }

    /// The properties of an object schema left out in this direction, marked directly or
    /// through a `$ref`: `readOnly` ones in requests (the server sets them, so a request
    /// never sends them), `writeOnly` ones in responses (a server never returns them).
    fn omitted_properties<'m>(&self, map: &'m Map<String, Value>) -> BTreeSet<&'m str> {
        let Some(Value::Object(properties)) = map.get("properties") else {
            return BTreeSet::new();
        };
        let keyword = match self.direction {
            Direction::Request => "readOnly",
            Direction::Response => "writeOnly",
        };
        let marked = |schema: &Value| schema.get(keyword) == Some(&Value::Bool(true));
        properties
            .iter()
            .filter(|(_, sub)| {
                marked(sub)
                    || (sub.get("$ref").is_some()
                        && self.doc.follow(sub, "").is_ok_and(|(target, _)| marked(target)))
            })
            .map(|(name, _)| name.as_str())
            .collect()
    }

    fn pattern_compiles(&mut self, pattern: &str) -> bool {
        if let Some(&ok) = self.patterns.get(pattern) {
            return ok;
        }
        let ok = jsonschema::draft202012::options().build(&json!({"pattern": pattern})).is_ok();
        self.patterns.insert(pattern.to_owned(), ok);
        ok
    }

    /// Registers the target of `reference` (found at `at`) and returns the rewritten
    /// reference.
    fn reference(&mut self, reference: &str, at: &str) -> Result<String, RestError> {
        if !reference.starts_with('#') {
            return Err(self.doc.error(at, self.doc.unfollowed(reference)));
        }
        let fragment = percent_decode(&reference[1..]);
        let pointer = if fragment.is_empty() {
            // `#` is the schema resource the reference stands in (OpenAPI 3.1: the
            // nearest schema with `$id`), never the OpenAPI document, which is no schema.
            self.enclosing_resource(at).ok_or_else(|| {
                self.doc.error(
                    at,
                    format!(
                        "reference `{reference}` is to the root of the OpenAPI document, which \
                         is no schema, as no enclosing schema has an `$id`: point it at a \
                         definition (`#/components/schemas/Name`)"
                    ),
                )
            })?
        } else if !fragment.starts_with('/') {
            // A plain-name fragment: the schema with that `$anchor` or `$dynamicAnchor`
            // in the same schema resource.
            let scope = self.enclosing_resource(at).unwrap_or_default();
            self.anchor(&scope, &fragment).ok_or_else(|| {
                self.doc.error(
                    at,
                    format!(
                        "reference `{reference}` names no `$anchor` or `$dynamicAnchor` of \
                         its schema resource"
                    ),
                )
            })?
        } else {
            // A JSON pointer is within the schema resource the reference stands in, as
            // JSON Schema 2020-12 (OpenAPI 3.1) resolves it: `#/$defs/Leaf` inside a
            // schema with an `$id` is that schema's `$defs`. When the resource has no
            // such place, the pointer is taken in the whole document: most 3.1 documents
            // in the wild give component schemas an `$id` and still write
            // `#/components/schemas/Tag` meaning the document's, which tools and
            // validators bundling the document resolve so.
            self.enclosing_resource(at)
                .map(|resource| format!("{resource}{fragment}"))
                .filter(|inside| self.doc.root.pointer(inside).is_some())
                .unwrap_or(fragment)
        };
        if let Some(name) = self.names.get(&pointer) {
            return Ok(format!("#/$defs/{name}"));
        }
        if self.doc.root.pointer(&pointer).is_none() {
            let shown = self.doc.show_ref(reference);
            return Err(self.doc.error(at, format!("dangling reference `{shown}`")));
        }
        let name = self.name_for(&pointer);
        self.names.insert(pointer.clone(), name.clone());
        self.taken.insert(name.clone(), pointer);
        self.pending.push(name.clone());
        Ok(format!("#/$defs/{name}"))
    }

    /// The pointer of the nearest schema around the keyword at `at` that has an `$id`
    /// (its own schema included), where `#` and anchors resolve.
    fn enclosing_resource(&self, at: &str) -> Option<String> {
        let mut current = at.rsplit_once('/').map_or("", |(parent, _)| parent);
        while !current.is_empty() {
            let has_id = self
                .doc
                .root
                .pointer(current)
                .and_then(|schema| schema.get("$id"))
                .is_some_and(Value::is_string);
            if has_id {
                return Some(current.to_owned());
            }
            current = current.rsplit_once('/').map_or("", |(parent, _)| parent);
        }
        None
    }

    /// The pointer of the schema named `name` by an `$anchor` or `$dynamicAnchor` within the
    /// schema resource at `scope` (the whole document for `""`), not looking into nested
    /// resources (schemas with an `$id` of their own).
    fn anchor(&self, scope: &str, name: &str) -> Option<String> {
        fn find(value: &Value, at: &str, name: &str, top: bool) -> Option<String> {
            match value {
                Value::Object(map) => {
                    if !top && map.get("$id").is_some_and(Value::is_string) {
                        return None;
                    }
                    let named = |key: &str| map.get(key).and_then(Value::as_str) == Some(name);
                    if named("$anchor") || named("$dynamicAnchor") {
                        return Some(at.to_owned());
                    }
                    map.iter().find_map(|(key, sub)| {
                        find(sub, &format!("{at}/{}", escape_token(key)), name, false)
                    })
                }
                Value::Array(items) => items
                    .iter()
                    .enumerate()
                    .find_map(|(i, item)| find(item, &format!("{at}/{i}"), name, false)),
                _ => None,
            }
        }
        find(self.doc.root.pointer(scope)?, scope, name, true)
    }

    fn name_for(&self, pointer: &str) -> String {
        // In an external file, the pointer inside it; a whole file is named after it.
        let (pointer, file) = match Externals::split(pointer) {
            Some((n, inner)) => (inner, self.doc.externals.stem(n)),
            None => (pointer, None),
        };
        let tokens: Vec<String> =
            pointer.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
        let base = match tokens.as_slice() {
            [c, s, name] if c == "components" && s == "schemas" => def_name(name),
            [d, name] if d == "definitions" => def_name(name),
            [] => def_name(file.unwrap_or_default()),
            other => def_name(&other.join("_")),
        };
        if !self.taken.contains_key(&base) {
            return base;
        }
        (2..).map(|n| format!("{base}_{n}")).find(|n| !self.taken.contains_key(n)).unwrap_or(base)
    }

    /// Converts every definition registered so far and those they reach.
    fn settle(&mut self) -> Result<(), RestError> {
        let mut converted = false;
        loop {
            let pending = std::mem::take(&mut self.pending);
            if pending.is_empty() {
                if converted {
                    self.break_in_place_cycles();
                }
                return Ok(());
            }
            converted = true;
            for name in pending {
                let doc = self.doc;
                let pointer = self.taken.get(&name).cloned().unwrap_or_default();
                let target = doc.root.pointer(&pointer).unwrap_or(&Value::Null);
                match self.convert(target, &pointer) {
                    Ok(schema) => {
                        let mut refs = BTreeSet::new();
                        collect_refs(&schema, &mut refs);
                        self.defs.insert(name, Definition { schema, refs });
                    }
                    Err(RestError::Spec { source_name, pointer, message }) => {
                        self.broken.insert(name, (source_name, pointer, message));
                    }
                    Err(other) => return Err(other),
                }
            }
        }
    }

    /// Cuts every cycle of references that never goes into a part of the value (`A` is
    /// `B` and `B` is `A`; `A` is `allOf: [A, …]`; a pointer to itself): checking a value
    /// against such a schema checks the same value against the same schema again, which
    /// JSON Schema leaves undefined and which sends naive validators and clients (FastMCP's
    /// `RecursionError`) into endless recursion. The reference closing a cycle imposes
    /// nothing: it is removed (allowing anything) where it stands alone or in an `allOf`,
    /// and is `false` as a branch of an `anyOf` or `oneOf` (adding nothing to them), which
    /// keeps what the other branches say. Each cut is a warning naming the cycle.
    ///
    /// Definitions converted earlier refer only to definitions converted by then, so a new
    /// cycle lies among new definitions; the whole graph is walked all the same (it is
    /// small), iteratively, so a long chain cannot exhaust the stack.
    fn break_in_place_cycles(&mut self) {
        let graph: BTreeMap<String, Vec<String>> = self
            .defs
            .iter()
            .map(|(name, def)| {
                let mut targets = BTreeSet::new();
                in_place_refs(&def.schema, &mut targets);
                let known = targets.into_iter().filter(|t| self.defs.contains_key(t)).collect();
                (name.clone(), known)
            })
            .collect();
        // 1: on the path being walked; 2: done.
        let mut state: HashMap<&str, u8> = HashMap::new();
        let mut back_edges: Vec<(String, String, Vec<String>)> = Vec::new();
        for start in graph.keys() {
            if state.contains_key(start.as_str()) {
                continue;
            }
            state.insert(start, 1);
            let mut path: Vec<(&str, std::slice::Iter<'_, String>)> =
                vec![(start.as_str(), graph[start].iter())];
            while let Some((node, targets)) = path.last_mut() {
                let node = *node;
                let Some(target) = targets.next() else {
                    state.insert(node, 2);
                    path.pop();
                    continue;
                };
                match state.get(target.as_str()) {
                    Some(1) => {
                        let cycle: Vec<String> = path
                            .iter()
                            .map(|(n, _)| (*n).to_owned())
                            .skip_while(|n| n != target)
                            .collect();
                        back_edges.push((node.to_owned(), target.clone(), cycle));
                    }
                    Some(_) => {}
                    None => {
                        state.insert(target, 1);
                        path.push((target.as_str(), graph[target].iter()));
                    }
                }
            }
        }
        for (from, to, cycle) in back_edges {
            let Some(def) = self.defs.get_mut(&from) else { continue };
            cut_in_place(&mut def.schema, &to);
            let mut refs = BTreeSet::new();
            collect_refs(&def.schema, &mut refs);
            def.refs = refs;
            let place = |name: &String| {
                let pointer = self.taken.get(name).map_or("", String::as_str);
                let pointer = Externals::split(pointer).map_or(pointer, |(_, inner)| inner);
                format!("`#{pointer}`")
            };
            let mut shown: Vec<String> = cycle.iter().map(place).collect();
            shown.push(place(&to));
            let at = self.taken.get(&from).cloned().unwrap_or_default();
            let error = self.doc.error(
                &at,
                format!(
                    "the schema refers back to itself without going into a part of the value \
                     ({}), which JSON Schema leaves undefined: the reference to {} is read as \
                     adding nothing; break the cycle in the document",
                    shown.join(" → "),
                    place(&to)
                ),
            );
            self.warnings.push(error.to_string());
        }
    }

    /// The error of a definition that could not be converted.
    fn broken_error(&self, name: &str) -> Option<RestError> {
        let (source_name, pointer, message) = self.broken.get(name)?;
        Some(RestError::Spec {
            source_name: source_name.clone(),
            pointer: pointer.clone(),
            message: message.clone(),
        })
    }

    /// The converted definition `name` (after [`Self::settle`] ran); an error when it could
    /// not be converted.
    pub(crate) fn definition(&mut self, name: &str) -> Result<Option<&Value>, RestError> {
        self.settle()?;
        if let Some(error) = self.broken_error(name) {
            return Err(error);
        }
        Ok(self.defs.get(name).map(|d| &d.schema))
    }

    /// Adds `$defs` with every definition `schema` reaches; an error when one of them could
    /// not be converted.
    pub(crate) fn attach_defs(&mut self, schema: &mut Value) -> Result<(), RestError> {
        self.settle()?;
        let mut wanted = BTreeSet::new();
        collect_refs(schema, &mut wanted);
        let mut reachable: BTreeSet<String> = BTreeSet::new();
        let mut stack: Vec<String> = wanted.into_iter().collect();
        while let Some(name) = stack.pop() {
            if !reachable.insert(name.clone()) {
                continue;
            }
            if let Some(error) = self.broken_error(&name) {
                return Err(error);
            }
            if let Some(def) = self.defs.get(&name) {
                stack.extend(def.refs.iter().filter(|r| !reachable.contains(*r)).cloned());
            }
        }
        if reachable.is_empty() {
            return Ok(());
        }
        let defs: BTreeMap<String, Value> = reachable
            .into_iter()
            .filter_map(|name| self.defs.get(&name).map(|d| (name, d.schema.clone())))
            .collect();
        if let Value::Object(map) = schema {
            map.insert("$defs".into(), Value::Object(defs.into_iter().collect()));
        }
        Ok(())
    }
}

/// The name of the definition that `$ref` points at, when it is one of ours.
pub(crate) fn ref_name(schema: &Value) -> Option<&str> {
    schema.get("$ref")?.as_str()?.strip_prefix("#/$defs/")
}

fn collect_refs(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if key == "$ref" {
                    if let Some(name) = v.as_str().and_then(|r| r.strip_prefix("#/$defs/")) {
                        out.insert(name.to_owned());
                    }
                } else if key != "enum" && key != "const" && key != "examples" && key != "default" {
                    collect_refs(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// Keywords whose schemas apply to the value itself, not to a part of it.
const IN_PLACE_ARRAY_KEYWORDS: &[&str] = &["allOf", "anyOf", "oneOf"];
const IN_PLACE_KEYWORDS: &[&str] = &["not", "if", "then", "else"];

/// The definitions `schema` refers to without going into a part of the value: its own
/// `$ref` and those of the schemas its in-place keywords apply.
fn in_place_refs(schema: &Value, out: &mut BTreeSet<String>) {
    let Some(map) = schema.as_object() else { return };
    if let Some(name) = ref_name(schema) {
        out.insert(name.to_owned());
    }
    for key in IN_PLACE_ARRAY_KEYWORDS {
        if let Some(Value::Array(members)) = map.get(*key) {
            members.iter().for_each(|m| in_place_refs(m, out));
        }
    }
    for key in IN_PLACE_KEYWORDS {
        if let Some(sub) = map.get(*key) {
            in_place_refs(sub, out);
        }
    }
    if let Some(Value::Object(dependent)) = map.get("dependentSchemas") {
        dependent.values().for_each(|sub| in_place_refs(sub, out));
    }
}

/// Makes the in-place references of `schema` to `target` add nothing: see
/// [`SchemaConverter::break_in_place_cycles`].
fn cut_in_place(schema: &mut Value, target: &str) {
    let Value::Object(map) = schema else { return };
    if map.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/"))
        == Some(target)
    {
        map.remove("$ref");
    }
    for key in IN_PLACE_ARRAY_KEYWORDS {
        let Some(Value::Array(members)) = map.get_mut(*key) else { continue };
        for member in members.iter_mut() {
            let only_the_reference = ref_name(member) == Some(target)
                && member.as_object().is_some_and(|m| {
                    m.keys().all(|k| matches!(k.as_str(), "$ref" | "description" | "title"))
                });
            if only_the_reference && *key != "allOf" {
                *member = Value::Bool(false);
            } else {
                cut_in_place(member, target);
            }
        }
    }
    for key in IN_PLACE_KEYWORDS {
        if let Some(sub) = map.get_mut(*key) {
            cut_in_place(sub, target);
        }
    }
    if let Some(Value::Object(dependent)) = map.get_mut("dependentSchemas") {
        dependent.values_mut().for_each(|sub| cut_in_place(sub, target));
    }
}

fn is_type_name(t: &str) -> bool {
    matches!(t, "string" | "number" | "integer" | "boolean" | "object" | "array" | "null")
}

/// Escapes `{` and `}` that ECMA-262 regexes read as literals but Rust's regex engines
/// (used by JSON Schema validators) reject: braces that do not form a quantifier.
fn ecma_braces(pattern: &str) -> String {
    if !pattern.contains('{') && !pattern.contains('}') {
        return pattern.to_owned();
    }
    let bytes = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() + 4);
    let mut i = 0;
    let mut in_class = false;
    let mut quantifier_end = None;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'\\' {
            // Copy the escape and the escaped character (which may be multi-byte).
            let next = pattern[i + 1..].chars().next().map_or(0, char::len_utf8);
            out.push_str(&pattern[i..i + 1 + next]);
            i += 1 + next;
            continue;
        }
        match c {
            b'[' => in_class = true,
            b']' => in_class = false,
            b'{' if !in_class => {
                let rest = &pattern[i + 1..];
                let close = rest.find('}');
                let is_quantifier = close.is_some_and(|end| {
                    let inner = &rest[..end];
                    let (min, max) = inner.split_once(',').unwrap_or((inner, "0"));
                    !min.is_empty()
                        && min.bytes().all(|b| b.is_ascii_digit())
                        && max.bytes().all(|b| b.is_ascii_digit())
                });
                if is_quantifier {
                    quantifier_end = close.map(|end| i + 1 + end);
                } else {
                    out.push_str("\\{");
                    i += 1;
                    continue;
                }
            }
            b'}' if !in_class && quantifier_end != Some(i) => {
                out.push_str("\\}");
                i += 1;
                continue;
            }
            _ => {}
        }
        let len = pattern[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&pattern[i..i + len]);
        i += len;
    }
    out
}

/// A definition name usable in `#/$defs/<name>` without escaping.
fn def_name(raw: &str) -> String {
    let name: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') { c } else { '_' })
        .collect();
    if name.is_empty() { "_".into() } else { name }
}

/// Lets `null` through a converted schema.
fn make_nullable(mut out: Map<String, Value>) -> Value {
    if let Some(Value::Array(values)) = out.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
    match out.get_mut("type") {
        Some(Value::String(t)) => {
            let t = std::mem::take(t);
            out.insert("type".into(), json!([t, "null"]));
            Value::Object(out)
        }
        Some(Value::Array(types)) => {
            if !types.contains(&json!("null")) {
                types.push(json!("null"));
            }
            Value::Object(out)
        }
        _ => {
            // No type (a `$ref` or a composition): allow null beside whatever it says.
            if out.is_empty() {
                return Value::Object(out);
            }
            json!({"anyOf": [Value::Object(out), {"type": "null"}]})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    fn doc(components: Value) -> Document {
        Document::from_value(
            json!({"openapi": "3.0.3", "paths": {}, "components": {"schemas": components}}),
            "t.json",
            None,
        )
        .unwrap()
    }

    fn check(components: Value, schema: Value, expected: Expect) {
        let doc = doc(components);
        let mut conv = SchemaConverter::new(&doc, Direction::Request);
        let mut out = conv.convert(&schema, "/x").unwrap();
        conv.attach_defs(&mut out).unwrap();
        expected.assert_eq(&serde_json::to_string(&out).unwrap());
    }

    #[test]
    fn nullable_and_exclusive_bounds() {
        check(
            json!({}),
            json!({"type": "integer", "nullable": true, "minimum": 1, "exclusiveMinimum": true,
                   "maximum": 9, "exclusiveMaximum": false, "example": 3, "x-foo": 1}),
            expect![[
                r#"{"examples":[3],"exclusiveMinimum":1,"maximum":9,"type":["integer","null"]}"#
            ]],
        );
        check(
            json!({}),
            json!({"type": "string", "enum": ["a"], "nullable": true}),
            expect![[r#"{"enum":["a",null],"type":["string","null"]}"#]],
        );
    }

    /// Overlapping branches told apart by a discriminator: `oneOf` would refuse a valid
    /// circle (it matches both branches once the discriminator is gone).
    #[test]
    fn a_discriminated_one_of_becomes_any_of() {
        let components = json!({
            "Circle": {"type": "object", "properties": {"kind": {"type": "string"}, "r": {"type": "number"}}},
            "Square": {"type": "object", "properties": {"kind": {"type": "string"}, "side": {"type": "number"}}}
        });
        let shape = json!({"oneOf": [{"$ref": "#/components/schemas/Circle"}, {"$ref": "#/components/schemas/Square"}],
            "discriminator": {"propertyName": "kind"}});
        check(
            components.clone(),
            shape,
            expect![[
                r##"{"$defs":{"Circle":{"properties":{"kind":{"type":"string"},"r":{"type":"number"}},"type":"object"},"Square":{"properties":{"kind":{"type":"string"},"side":{"type":"number"}},"type":"object"}},"anyOf":[{"$ref":"#/$defs/Circle"},{"$ref":"#/$defs/Square"}]}"##
            ]],
        );
        // Without a discriminator, `oneOf` stays.
        let plain = json!({"oneOf": [{"type": "string"}, {"type": "integer"}]});
        check(components, plain, expect![[r#"{"oneOf":[{"type":"string"},{"type":"integer"}]}"#]]);
    }

    #[test]
    fn nullable_reference_becomes_any_of() {
        check(
            json!({"A": {"type": "string"}}),
            json!({"allOf": [{"$ref": "#/components/schemas/A"}], "nullable": true}),
            expect![[
                r##"{"$defs":{"A":{"type":"string"}},"anyOf":[{"allOf":[{"$ref":"#/$defs/A"}]},{"type":"null"}]}"##
            ]],
        );
    }

    #[test]
    fn recursive_definitions_stay_references() {
        check(
            json!({
                "Node": {"type": "object", "properties": {
                    "children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}},
                    "other": {"$ref": "#/components/schemas/Leaf"}}},
                "Leaf": {"type": "string"},
                "Unused": {"type": "number"}
            }),
            json!({"$ref": "#/components/schemas/Node"}),
            expect![[
                r##"{"$defs":{"Leaf":{"type":"string"},"Node":{"properties":{"children":{"items":{"$ref":"#/$defs/Node"},"type":"array"},"other":{"$ref":"#/$defs/Leaf"}},"type":"object"}},"$ref":"#/$defs/Node"}"##
            ]],
        );
    }

    #[test]
    fn property_named_like_keywords_is_kept() {
        check(
            json!({}),
            json!({"type": "object", "properties": {"example": {"type": "string"},
                   "nullable": {"type": "boolean"}, "$ref": {"type": "string"}}}),
            expect![[
                r#"{"properties":{"$ref":{"type":"string"},"example":{"type":"string"},"nullable":{"type":"boolean"}},"type":"object"}"#
            ]],
        );
    }

    #[test]
    fn pointer_references_anywhere() {
        check(
            json!({"A": {"type": "object", "properties": {"b": {"type": "integer"}}}}),
            json!({"$ref": "#/components/schemas/A/properties/b"}),
            expect![[
                r##"{"$defs":{"components_schemas_A_properties_b":{"type":"integer"}},"$ref":"#/$defs/components_schemas_A_properties_b"}"##
            ]],
        );
    }

    #[test]
    fn dangling_and_external_references_name_the_place() {
        let doc = doc(json!({"A": {"properties": {"b": {"$ref": "#/components/schemas/Nope"}}}}));
        let mut conv = SchemaConverter::new(&doc, Direction::Request);
        let mut out = conv.convert(&json!({"$ref": "#/components/schemas/A"}), "/x").unwrap();
        expect![[r#"t.json: at /components/schemas/A/properties/b/$ref: dangling reference `#/components/schemas/Nope`"#]]
            .assert_eq(&conv.attach_defs(&mut out).unwrap_err().to_string());
        let err = conv.convert(&json!({"$ref": "other.yaml#/A"}), "/paths/~1a/get").unwrap_err();
        expect![[r#"t.json: at /paths/~1a/get/$ref: external reference `other.yaml#/A` is not followed: only documents read from a file or a URL follow external references"#]]
            .assert_eq(&err.to_string());
    }

    #[test]
    fn read_only_properties_are_not_sent() {
        check(
            json!({"Id": {"type": "integer", "readOnly": true},
                   "User": {"type": "object", "required": ["id", "name", "password", "ref"],
                            "properties": {"id": {"type": "integer", "readOnly": true},
                                           "ref": {"$ref": "#/components/schemas/Id"},
                                           "name": {"type": "string"},
                                           "password": {"type": "string", "writeOnly": true}}}}),
            json!({"$ref": "#/components/schemas/User"}),
            expect![[
                r##"{"$defs":{"User":{"properties":{"name":{"type":"string"},"password":{"type":"string","writeOnly":true}},"required":["name","password"],"type":"object"}},"$ref":"#/$defs/User"}"##
            ]],
        );
    }

    #[test]
    fn write_only_properties_are_not_returned() {
        let doc = doc(json!({"Secret": {"type": "string", "writeOnly": true},
               "User": {"type": "object", "required": ["id", "name", "password", "pin"],
                        "properties": {"id": {"type": "integer", "readOnly": true},
                                       "pin": {"$ref": "#/components/schemas/Secret"},
                                       "name": {"type": "string"},
                                       "password": {"type": "string", "writeOnly": true}}}}));
        let mut conv = SchemaConverter::new(&doc, Direction::Response);
        let mut out = conv.convert(&json!({"$ref": "#/components/schemas/User"}), "/x").unwrap();
        conv.attach_defs(&mut out).unwrap();
        expect![[
            r##"{"$defs":{"User":{"properties":{"id":{"readOnly":true,"type":"integer"},"name":{"type":"string"}},"required":["id","name"],"type":"object"}},"$ref":"#/$defs/User"}"##
        ]]
        .assert_eq(&out.to_string());
    }

    #[test]
    fn patterns_the_validator_cannot_compile_are_dropped() {
        check(
            json!({}),
            json!({"type": "string", "pattern": "^(?<=a)[", "minLength": 1}),
            expect![[r#"{"minLength":1,"type":"string"}"#]],
        );
    }

    #[test]
    fn ecma_literal_braces_are_escaped() {
        assert_eq!(ecma_braces("^{[0-9]{4}}$"), "^\\{[0-9]{4}\\}$");
        assert_eq!(ecma_braces("a{1,}b{2,3}[{}]\\{"), "a{1,}b{2,3}[{}]\\{");
        assert_eq!(ecma_braces("x{,2}é}"), "x\\{,2\\}é\\}");
    }

    #[test]
    fn swagger_file_and_tuple_items() {
        check(
            json!({}),
            json!({"type": "array", "items": [{"type": "file"}, {"type": "int"}]}),
            expect![[r#"{"prefixItems":[{"format":"binary","type":"string"},{}],"type":"array"}"#]],
        );
    }
}
