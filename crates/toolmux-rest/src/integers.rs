//! Whole numbers written with a fraction (`5.0`, as Python and many models write a float)
//! put back as integers where a tool's input schema says `integer`, so that a JSON body
//! carries `5`: JSON Schema counts `5.0` as an integer, so validation lets it through, but
//! Go's and Java's decoders and strict Pydantic refuse it for an integer field.
//!
//! The value is walked alongside its schema: `properties`, `additionalProperties`,
//! `items` and `prefixItems`, `$ref`s within the schema (the `$defs` an import keeps, or
//! whatever a configured schema points at), every member of an `allOf`, and the one member
//! of an `anyOf`/`oneOf` that can take the value (for a number, the one member that is an
//! integer type). Where that is not clear nothing is changed: a guess could turn a number
//! the API wants as a float into an integer.

use serde_json::{Map, Number, Value};

/// Whole numbers above it are not all exact as floats.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// How many schema steps one call may take: in-place references (`A` is `allOf: [A, A]`)
/// can make a schema walk without end, and a configured schema is not checked for them.
const STEPS: usize = 100_000;

/// How deep the walk goes, in schema steps from the top.
const MAX_DEPTH: usize = 128;

/// Rewrites every whole number within ±2^53 written with a fraction in `args` where `schema`
/// (an object schema, its `$ref`s resolved against itself) says it is an integer. Other
/// values are left as they are: a fraction that is not whole is refused by validation.
pub(crate) fn integers_in_arguments(schema: &Value, args: &mut Map<String, Value>) {
    let mut value = Value::Object(std::mem::take(args));
    let mut walk = Walk { root: schema, steps: STEPS };
    walk.value(schema, &mut value, 0);
    if let Value::Object(map) = value {
        *args = map;
    }
}

/// One walk over a value and its schema.
struct Walk<'a> {
    /// The schema `$ref`s are resolved against.
    root: &'a Value,
    /// Schema steps left.
    steps: usize,
}

impl<'a> Walk<'a> {
    fn value(&mut self, schema: &'a Value, value: &mut Value, depth: usize) {
        if depth > MAX_DEPTH || self.steps == 0 {
            return;
        }
        self.steps -= 1;
        let Some(map) = schema.as_object() else { return };
        if let Some(target) = map.get("$ref").and_then(Value::as_str).and_then(|r| self.resolve(r))
        {
            self.value(target, value, depth + 1);
        }
        if let Some(Value::Array(members)) = map.get("allOf") {
            for member in members {
                self.value(member, value, depth + 1);
            }
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(Value::Array(members)) = map.get(keyword)
                && let Some(member) = self.sole_member(members, value)
            {
                self.value(member, value, depth + 1);
            }
        }
        match value {
            Value::Number(number) => {
                if has_type(map.get("type"), "integer")
                    && let Some(whole) = whole(number)
                {
                    *value = Value::Number(whole);
                }
            }
            Value::Object(object) => {
                let properties = map.get("properties").and_then(Value::as_object);
                let additional = map.get("additionalProperties");
                for (key, member) in object.iter_mut() {
                    if let Some(schema) = properties.and_then(|p| p.get(key)).or(additional) {
                        self.value(schema, member, depth + 1);
                    }
                }
            }
            Value::Array(items) => {
                // `prefixItems` (2020-12) or an array of `items` (earlier drafts) by
                // position, then `items` (or 2019-09's `additionalItems`) for the rest.
                let (prefix, rest) = match (map.get("prefixItems"), map.get("items")) {
                    (Some(Value::Array(prefix)), rest) => (prefix.as_slice(), rest),
                    (_, Some(Value::Array(prefix))) => {
                        (prefix.as_slice(), map.get("additionalItems"))
                    }
                    (_, rest) => (&[][..], rest),
                };
                for (i, item) in items.iter_mut().enumerate() {
                    if let Some(schema) = prefix.get(i).or(rest) {
                        self.value(schema, item, depth + 1);
                    }
                }
            }
            _ => {}
        }
    }

    /// The member of an `anyOf`/`oneOf` the value is walked with: for a number, the only
    /// member that is an integer type; for an object or an array, the only member that
    /// can be one (a member whose type is not known can be anything). `None` when there
    /// is no such single member.
    fn sole_member(&mut self, members: &'a [Value], value: &Value) -> Option<&'a Value> {
        let wanted = match value {
            Value::Number(_) => "integer",
            Value::Object(_) => "object",
            Value::Array(_) => "array",
            _ => return None,
        };
        let mut found = None;
        for member in members {
            let fits = match self.types(member, 0) {
                Some(types) => types.contains(&wanted),
                // A member of unknown type may be an object or an array, not surely an
                // integer.
                None => wanted != "integer",
            };
            if fits {
                if found.is_some() {
                    return None;
                }
                found = Some(member);
            }
        }
        found
    }

    /// The types a schema allows, as far as its `type`, a `$ref` or an `allOf` member says;
    /// `None` when they are not known.
    fn types(&mut self, schema: &'a Value, depth: usize) -> Option<Vec<&'a str>> {
        if depth > 16 || self.steps == 0 {
            return None;
        }
        self.steps -= 1;
        match schema {
            Value::Bool(false) => return Some(Vec::new()),
            Value::Object(_) => {}
            _ => return None,
        }
        match schema.get("type") {
            Some(Value::String(kind)) => return Some(vec![kind.as_str()]),
            Some(Value::Array(kinds)) => {
                return Some(kinds.iter().filter_map(Value::as_str).collect());
            }
            _ => {}
        }
        if let Some(target) =
            schema.get("$ref").and_then(Value::as_str).and_then(|r| self.resolve(r))
            && let Some(types) = self.types(target, depth + 1)
        {
            return Some(types);
        }
        let members = schema.get("allOf").and_then(Value::as_array)?;
        members.iter().find_map(|member| self.types(member, depth + 1))
    }

    /// The schema a local `$ref` (`#/$defs/Item`, `#/definitions/Item`, `#`) points at.
    fn resolve(&self, reference: &str) -> Option<&'a Value> {
        let pointer = reference.strip_prefix('#')?;
        let root: &'a Value = self.root;
        root.pointer(pointer).or_else(|| {
            // Names an import gives definitions are used in references as they are.
            let name = pointer.strip_prefix("/$defs/")?;
            root.get("$defs")?.get(name)
        })
    }
}

/// Whether a `type` keyword allows `kind`.
fn has_type(types: Option<&Value>, kind: &str) -> bool {
    match types {
        Some(Value::String(t)) => t == kind,
        Some(Value::Array(types)) => types.iter().any(|t| t == kind),
        _ => false,
    }
}

/// The integer a number written with a fraction stands for, when it is whole and within
/// ±2^53 (where every whole number is exact as a float).
fn whole(number: &Number) -> Option<Number> {
    let float = number.as_f64().filter(|_| number.is_f64())?;
    if float.fract() != 0.0 || float.abs() > EXACT {
        return None;
    }
    #[allow(clippy::cast_possible_truncation)] // Whole and within ±2^53: exact.
    Some(Number::from(float as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(schema: Value, args: Value) -> String {
        let mut args = args.as_object().cloned().unwrap_or_default();
        integers_in_arguments(&schema, &mut args);
        Value::Object(args).to_string()
    }

    #[test]
    fn only_integer_places_change() {
        let schema = json!({"type": "object", "properties": {
            "count": {"type": "integer"},
            "price": {"type": "number"},
            "maybe": {"type": ["integer", "null"]},
            "huge": {"type": "integer"},
            "half": {"type": "integer"}}});
        let args = json!({"count": 5.0, "price": 5.0, "maybe": -2.0, "huge": 1e300,
            "half": 2.5, "other": 3.0});
        assert_eq!(
            check(schema, args),
            r#"{"count":5,"half":2.5,"huge":1e+300,"maybe":-2,"other":3.0,"price":5.0}"#
        );
    }

    #[test]
    fn ambiguous_choices_are_left_alone() {
        let schema = json!({"type": "object", "properties": {
            "one": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "two": {"oneOf": [{"type": "integer"}, {"type": "integer", "minimum": 9}]},
            "unknown": {"anyOf": [{"$ref": "#/$defs/Missing"}, {"minimum": 1}]}}});
        let args = json!({"one": 1.0, "two": 2.0, "unknown": 3.0});
        assert_eq!(check(schema, args), r#"{"one":1,"two":2.0,"unknown":3.0}"#);
    }

    #[test]
    fn in_place_reference_cycles_end() {
        let schema = json!({"type": "object", "properties": {"n": {"$ref": "#/$defs/A"}},
            "$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/A"}],
                "type": "integer"}}});
        assert_eq!(check(schema, json!({"n": 1.0})), r#"{"n":1}"#);
    }
}
