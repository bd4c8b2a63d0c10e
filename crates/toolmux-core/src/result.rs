//! The envelope every orchestrated call returns.

use crate::{JsonObject, ToolError, ToolKind, ToolOutput};
use serde::{Deserialize, Serialize};

/// What a call through the orchestrator returns, success or not.
///
/// `result` is the text the model reads; `error` is set instead when the call failed and
/// reads as `(tool failed: <message>)` in a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// Whether the call succeeded.
    pub ok: bool,
    /// The output text, on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The error message, on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Wall time of the whole call, queue wait included (`latencyMs` in JSON, as every
    /// other name toolmux writes; `latency_ms` is still read).
    #[serde(rename = "latencyMs", alias = "latency_ms")]
    pub latency_ms: u64,
    /// The kind of provider that ran it.
    pub kind: ToolKind,
    /// The provider's namespace (empty when the tool was unknown).
    pub namespace: String,
    /// Extras: error code and party, spill handle, flags.
    #[serde(default, skip_serializing_if = "JsonObject::is_empty")]
    pub extras: JsonObject,
}

impl ToolResult {
    /// A successful result from a tool's output.
    ///
    /// An output flagged `is_error` is a failure whose message is the output's text.
    pub fn from_output(
        output: &ToolOutput,
        kind: ToolKind,
        namespace: &str,
        latency_ms: u64,
    ) -> Self {
        ToolResult::from_text(
            output.to_text(),
            output.is_error,
            output.extras.clone(),
            kind,
            namespace,
            latency_ms,
        )
    }

    /// [`ToolResult::from_output`], taking the output so that a single text part is moved
    /// into `result` instead of copied.
    pub fn from_owned_output(
        mut output: ToolOutput,
        kind: ToolKind,
        namespace: &str,
        latency_ms: u64,
    ) -> Self {
        let text = match output.content.as_mut_slice() {
            [crate::ContentPart::Text { text }] => std::mem::take(text),
            _ => output.to_text(),
        };
        ToolResult::from_text(text, output.is_error, output.extras, kind, namespace, latency_ms)
    }

    fn from_text(
        text: String,
        is_error: bool,
        extras: JsonObject,
        kind: ToolKind,
        namespace: &str,
        latency_ms: u64,
    ) -> Self {
        let (ok, result, error) =
            if is_error { (false, None, Some(text)) } else { (true, Some(text), None) };
        ToolResult { ok, result, error, latency_ms, kind, namespace: namespace.to_owned(), extras }
    }

    /// A failed result from an error.
    pub fn from_error(error: &ToolError, kind: ToolKind, namespace: &str, latency_ms: u64) -> Self {
        let mut extras = JsonObject::new();
        extras.insert("code".into(), error.code().into());
        extras.insert(
            "party".into(),
            serde_json::to_value(error.party()).unwrap_or(serde_json::Value::Null),
        );
        ToolResult {
            ok: false,
            result: None,
            error: Some(error.report()),
            latency_ms,
            kind,
            namespace: namespace.to_owned(),
            extras,
        }
    }

    /// The text a conversation shows: the result, or `(tool failed: <error>)`.
    ///
    /// A timeout reads `(tool failed: timeout)` and an exceeded context budget
    /// `(tool failed: context window budget exceeded)`, as agents expect.
    pub fn conversation_text(&self) -> String {
        if self.ok {
            return self.result.clone().unwrap_or_default();
        }
        let code = self.extras.get("code").and_then(|c| c.as_str());
        match code {
            Some("timeout") => "(tool failed: timeout)".to_owned(),
            Some("context_budget_exceeded") => {
                "(tool failed: context window budget exceeded)".to_owned()
            }
            _ => format!("(tool failed: {})", self.error.as_deref().unwrap_or("unknown error")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn envelope_json() {
        let ok = ToolResult::from_output(&ToolOutput::text("hi"), ToolKind::Builtin, "fs", 3);
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"ok":true,"result":"hi","latencyMs":3,"kind":"builtin","namespace":"fs"}"#
        );
        let err = ToolError::Timeout {
            tool: "fs__grep".into(),
            after: Duration::from_secs(2),
            idle: None,
        };
        let failed = ToolResult::from_error(&err, ToolKind::Builtin, "fs", 2000);
        assert_eq!(failed.conversation_text(), "(tool failed: timeout)");
        assert_eq!(
            serde_json::to_string(&failed).unwrap(),
            r#"{"ok":false,"error":"timeout: `fs__grep` did not finish within 2s","latencyMs":2000,"kind":"builtin","namespace":"fs","extras":{"code":"timeout","party":"policy"}}"#
        );
        let tool_error = ToolResult::from_output(&ToolOutput::error("nope"), ToolKind::Mcp, "x", 1);
        assert_eq!(tool_error.conversation_text(), "(tool failed: nope)");
        // Envelopes written before the name was camelCase are still read.
        let old: ToolResult = serde_json::from_str(
            r#"{"ok":true,"result":"hi","latency_ms":3,"kind":"builtin","namespace":"fs"}"#,
        )
        .unwrap();
        assert_eq!(old, ok);
    }
}
