//! The validation stage: arguments checked against the tool's input schema, compiled once
//! and cached per tool.

use jsonschema::Validator;
use serde_json::Value;
use std::sync::OnceLock;
use toolmux_core::{ToolError, Violation};

/// A tool's input schema with its validator, compiled on first use.
#[derive(Debug)]
pub struct ArgumentValidator {
    schema: std::sync::Arc<Value>,
    compiled: OnceLock<Result<Validator, String>>,
    /// Which of the tool's schemas it is (`input`, `output`), as its warning says it.
    role: &'static str,
}

impl ArgumentValidator {
    /// A validator for `schema`; nothing is compiled yet.
    pub fn new(schema: std::sync::Arc<Value>) -> Self {
        ArgumentValidator { schema, compiled: OnceLock::new(), role: "input" }
    }

    /// The same for a tool's output schema: its warnings say so, and are given once per
    /// tool and schema, so a broken output schema is told beside a broken input schema.
    pub fn for_output(mut self) -> Self {
        self.role = "output";
        self
    }

    /// Checks the schema against its meta-schema; `Err` says what is wrong with it.
    pub fn check_schema(schema: &Value) -> Result<(), String> {
        if !schema.is_object() {
            return Err(format!("input schema must be a JSON object, not `{schema}`"));
        }
        let checked = jsonschema::meta::validate(schema).map_err(|e| {
            let at = e.instance_path().as_str();
            if at.is_empty() { e.to_string() } else { format!("at {at}: {e}") }
        });
        // A `$schema` toolmux does not know (a server's own meta-schema URI) says nothing of
        // the schema's shape: it is checked as the default draft instead of left out.
        if checked.is_err()
            && without_meta_schema(schema).is_some_and(|p| jsonschema::meta::validate(&p).is_ok())
        {
            return Ok(());
        }
        checked
    }

    fn validator(&self) -> &Result<Validator, String> {
        self.compiled.get_or_init(|| {
            jsonschema::options().build(&self.schema).or_else(|first| {
                // As `check_schema` reads it: an unknown `$schema` as the default draft.
                match without_meta_schema(&self.schema) {
                    Some(plain) => jsonschema::options().build(&plain).map_err(|e| e.to_string()),
                    None => Err(first.to_string()),
                }
            })
        })
    }

    /// Compiles now instead of on the first call.
    pub fn precompile(&self) -> Result<(), String> {
        self.validator().as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// Checks `arguments`; the error lists every violation with its JSON pointer.
    pub fn validate(&self, tool: &str, arguments: &Value) -> Result<(), ToolError> {
        match self.violations(tool, arguments, usize::MAX) {
            None => Ok(()),
            Some(violations) => {
                Err(ToolError::InvalidArguments { tool: tool.to_owned(), violations })
            }
        }
    }

    /// The first `max` ways `value` does not match the schema, with their JSON pointers;
    /// `None` when it matches, or when the schema does not compile (then it is not checked,
    /// and a warning says so once).
    pub fn violations(&self, tool: &str, value: &Value, max: usize) -> Option<Vec<Violation>> {
        let validator = match self.validator() {
            Ok(v) => v,
            Err(e) => {
                // A schema that passes its meta-schema but does not compile here (a `$ref`
                // to a document toolmux does not fetch): the arguments go to the tool as
                // they are, and its provider checks them; failing every call would leave a
                // listed tool that can never run.
                // Once per tool and schema: the input schema's warning does not stand for the
                // output schema's.
                static TOLD: std::sync::Mutex<Vec<(String, &str)>> =
                    std::sync::Mutex::new(Vec::new());
                let mut told = TOLD.lock().unwrap_or_else(|e| e.into_inner());
                if !told.iter().any(|(t, role)| t == tool && *role == self.role) {
                    told.push((tool.to_owned(), self.role));
                    tracing::warn!(
                        tool,
                        "its {} schema does not compile ({e}); what it describes is not checked \
                         here",
                        self.role
                    );
                }
                return None;
            }
        };
        if validator.is_valid(value) {
            return None;
        }
        let violations: Vec<Violation> = validator
            .iter_errors(value)
            .take(max)
            .map(|e| Violation {
                pointer: e.instance_path().as_str().to_owned(),
                message: e.to_string(),
            })
            .collect();
        Some(violations)
    }
}

/// `schema` without its `$schema`, when it has one.
fn without_meta_schema(schema: &Value) -> Option<Value> {
    schema.get("$schema")?;
    let mut plain = schema.clone();
    plain.as_object_mut()?.remove("$schema")?;
    Some(plain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use serde_json::json;
    use std::sync::Arc;
    use toolmux_test_support::logs::captured_logs;

    /// A schema under a meta-schema toolmux does not know is checked as the default draft;
    /// one that refers to a document toolmux does not fetch leaves the arguments to the tool.
    #[test]
    fn unknown_meta_schemas_and_remote_references() {
        let custom = json!({"$schema": "https://example.com/our-schema", "type": "object",
            "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        assert!(ArgumentValidator::check_schema(&custom).is_ok());
        let checked = ArgumentValidator::new(Arc::new(custom));
        assert!(checked.validate("t", &json!({"n": 1})).is_ok());
        assert!(checked.validate("t", &json!({})).is_err());
        let remote = json!({"type": "object", "properties": {
            "x": {"$ref": "https://example.com/defs.json#/x"}}});
        assert!(ArgumentValidator::check_schema(&remote).is_ok());
        let unchecked = ArgumentValidator::new(Arc::new(remote));
        assert!(unchecked.validate("t", &json!({"x": 1})).is_ok());
    }

    fn validator() -> ArgumentValidator {
        ArgumentValidator::new(Arc::new(json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1},
                "mode": {"enum": ["a", "b"]}
            },
            "required": ["path"],
            "additionalProperties": false
        })))
    }

    #[test]
    fn lists_every_violation_with_its_pointer() {
        let err = validator()
            .validate("fs__read", &json!({"limit": 0, "mode": "c", "extra": 1}))
            .unwrap_err();
        expect![[r#"invalid arguments for `fs__read`: at /limit: 0 is less than the minimum of 1; at /mode: "c" is not one of "a" or "b"; at /: Additional properties are not allowed ('extra' was unexpected); at /: "path" is a required property"#]]
        .assert_eq(&err.to_string());
    }

    #[test]
    fn valid_arguments_pass() {
        validator().validate("fs__read", &json!({"path": "x", "limit": 3})).unwrap();
    }

    #[test]
    fn bad_schemas_are_named() {
        expect![[r#"at /type: "strin" is not valid under any of the schemas listed in the 'anyOf' keyword"#]]
            .assert_eq(&ArgumentValidator::check_schema(&json!({"type": "strin"})).unwrap_err());
        expect!["input schema must be a JSON object, not `true`"]
            .assert_eq(&ArgumentValidator::check_schema(&json!(true)).unwrap_err());
    }

    /// A tool whose input and output schemas both fail to compile is warned of for each,
    /// once.
    #[test]
    fn a_broken_output_schema_is_told_beside_a_broken_input_schema() {
        let broken = Arc::new(json!({"$ref": "https://example.invalid/schema.json"}));
        let input = ArgumentValidator::new(broken.clone());
        let output = ArgumentValidator::new(broken).for_output();
        let ((), told) = captured_logs(|| {
            for _ in 0..2 {
                assert_eq!(input.violations("warned__twice", &json!({}), 3), None);
                assert_eq!(output.violations("warned__twice", &json!({}), 3), None);
            }
        });
        assert_eq!(told.len(), 2, "{told:#?}");
        for (line, role) in told.iter().zip(["input", "output"]) {
            assert!(
                line.starts_with(&format!("WARN message=its {role} schema does not compile")),
                "{told:#?}"
            );
            assert!(line.ends_with(r#" tool="warned__twice""#), "{told:#?}");
        }
    }
}
