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
}

impl ArgumentValidator {
    /// A validator for `schema`; nothing is compiled yet.
    pub fn new(schema: std::sync::Arc<Value>) -> Self {
        ArgumentValidator { schema, compiled: OnceLock::new() }
    }

    /// Checks the schema against its meta-schema; `Err` says what is wrong with it.
    pub fn check_schema(schema: &Value) -> Result<(), String> {
        if !schema.is_object() {
            return Err(format!("input schema must be a JSON object, not `{schema}`"));
        }
        jsonschema::meta::validate(schema).map_err(|e| {
            let at = e.instance_path().as_str();
            if at.is_empty() { e.to_string() } else { format!("at {at}: {e}") }
        })
    }

    fn validator(&self) -> &Result<Validator, String> {
        self.compiled
            .get_or_init(|| jsonschema::options().build(&self.schema).map_err(|e| e.to_string()))
    }

    /// Compiles now instead of on the first call.
    pub fn precompile(&self) -> Result<(), String> {
        self.validator().as_ref().map(|_| ()).map_err(Clone::clone)
    }

    /// Checks `arguments`; the error lists every violation with its JSON pointer.
    pub fn validate(&self, tool: &str, arguments: &Value) -> Result<(), ToolError> {
        let validator = match self.validator() {
            Ok(v) => v,
            Err(e) => {
                return Err(ToolError::Protocol {
                    provider: tool.to_owned(),
                    message: format!("the tool's input schema does not compile: {e}"),
                });
            }
        };
        if validator.is_valid(arguments) {
            return Ok(());
        }
        let violations: Vec<Violation> = validator
            .iter_errors(arguments)
            .map(|e| Violation {
                pointer: e.instance_path().as_str().to_owned(),
                message: e.to_string(),
            })
            .collect();
        Err(ToolError::InvalidArguments { tool: tool.to_owned(), violations })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;
    use serde_json::json;
    use std::sync::Arc;

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
}
