//! What a tool returns: content parts, an error flag and extras.

use crate::JsonObject;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt::Write as _;

/// One piece of a tool's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentPart {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A JSON value, passed on compactly.
    Json {
        /// The value.
        value: Value,
    },
    /// An image, base64-encoded.
    Image {
        /// Base64 data.
        data: String,
        /// MIME type, such as `image/png`.
        mime_type: String,
    },
    /// Audio, base64-encoded.
    Audio {
        /// Base64 data.
        data: String,
        /// MIME type, such as `audio/wav`.
        mime_type: String,
    },
    /// An embedded resource, with its text or base64 blob.
    Resource {
        /// The resource URI.
        uri: String,
        /// MIME type, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
        /// Text contents.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// Base64 contents.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        blob: Option<String>,
    },
    /// A link to a resource the caller may read.
    ResourceLink {
        /// The resource URI.
        uri: String,
        /// Its name.
        name: String,
        /// What it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        /// MIME type, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
    },
}

impl ContentPart {
    /// Bytes this part adds to the text a model sees (base64 blobs counted as they are).
    pub fn byte_len(&self) -> usize {
        match self {
            ContentPart::Text { text } => text.len(),
            ContentPart::Json { value } => json_len(value),
            ContentPart::Image { data, .. } | ContentPart::Audio { data, .. } => data.len(),
            ContentPart::Resource { uri, text, blob, .. } => {
                uri.len()
                    + text.as_ref().map_or(0, String::len)
                    + blob.as_ref().map_or(0, String::len)
            }
            ContentPart::ResourceLink { uri, name, .. } => uri.len() + name.len(),
        }
    }
}

/// What JSON type `value` is, with its article, for a message: `a string`, `null`.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The bytes `value` takes as compact JSON text, counted without building the text.
pub fn json_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Serializing a Value into a counting writer cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// The output of one tool call, before the orchestrator wraps it in a [`crate::ToolResult`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The content, in order.
    pub content: Vec<ContentPart>,
    /// Structured content matching the tool's output schema, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<Value>,
    /// The tool ran and reports failure (an MCP `isError` result, an HTTP 500).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
    /// Anything else worth keeping (HTTP status, exit code, spill handle).
    #[serde(default, skip_serializing_if = "JsonObject::is_empty")]
    pub extras: JsonObject,
}

impl ToolOutput {
    /// One text part.
    pub fn text(text: impl Into<String>) -> Self {
        ToolOutput { content: vec![ContentPart::Text { text: text.into() }], ..Default::default() }
    }

    /// One JSON part.
    pub fn json(value: Value) -> Self {
        ToolOutput { content: vec![ContentPart::Json { value }], ..Default::default() }
    }

    /// A failure reported by the tool itself, as text.
    pub fn error(text: impl Into<String>) -> Self {
        ToolOutput { is_error: true, ..ToolOutput::text(text) }
    }

    /// Adds one extra.
    pub fn with_extra(mut self, key: impl Into<String>, value: Value) -> Self {
        self.extras.insert(key.into(), value);
        self
    }

    /// Sets the structured content.
    pub fn with_structured(mut self, value: Value) -> Self {
        self.structured = Some(value);
        self
    }

    /// The output as the text a model reads.
    ///
    /// Text parts are joined by newlines, JSON is compact, binary parts become a short
    /// placeholder, embedded text resources are included. With no content but structured
    /// content, that is rendered as JSON.
    pub fn to_text(&self) -> String {
        if let [ContentPart::Text { text }] = self.content.as_slice() {
            return text.clone();
        }
        let mut out = String::with_capacity(self.byte_len());
        for (i, part) in self.content.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            match part {
                ContentPart::Text { text } => out.push_str(text),
                ContentPart::Json { value } => out.push_str(&value.to_string()),
                ContentPart::Image { data, mime_type } => {
                    let _ = write!(out, "[image {mime_type}, {} bytes]", base64_decoded_len(data));
                }
                ContentPart::Audio { data, mime_type } => {
                    let _ = write!(out, "[audio {mime_type}, {} bytes]", base64_decoded_len(data));
                }
                ContentPart::Resource { uri, text: Some(text), .. } => {
                    let _ = write!(out, "[resource {uri}]\n{text}");
                }
                ContentPart::Resource { uri, mime_type, blob, .. } => {
                    let mime = mime_type.as_deref().unwrap_or("application/octet-stream");
                    let len = blob.as_deref().map_or(0, base64_decoded_len);
                    let _ = write!(out, "[resource {uri}: {mime}, {len} bytes]");
                }
                ContentPart::ResourceLink { uri, name, description, .. } => {
                    let _ = write!(out, "[resource link {name}: {uri}]");
                    if let Some(d) = description {
                        let _ = write!(out, " {d}");
                    }
                }
            }
        }
        if let (true, Some(value)) = (self.content.is_empty(), &self.structured) {
            out.push_str(&value.to_string());
        }
        out
    }

    /// Bytes of the content, as [`ContentPart::byte_len`] counts them, plus structured content
    /// when there is no other content.
    pub fn byte_len(&self) -> usize {
        let parts: usize = self.content.iter().map(ContentPart::byte_len).sum();
        if self.content.is_empty() {
            self.structured.as_ref().map_or(0, json_len)
        } else {
            parts + self.content.len().saturating_sub(1)
        }
    }

    /// Whether every part is text or JSON (nothing binary).
    pub fn is_textual(&self) -> bool {
        self.content
            .iter()
            .all(|p| matches!(p, ContentPart::Text { .. } | ContentPart::Json { .. }))
    }
}

fn base64_decoded_len(data: &str) -> usize {
    let padding = data.bytes().rev().take_while(|&b| b == b'=').count();
    (data.len() / 4 * 3).saturating_sub(padding)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_rendering() {
        let out = ToolOutput {
            content: vec![
                ContentPart::Text { text: "hello".into() },
                ContentPart::Json { value: json!({"a": 1}) },
                ContentPart::Image { data: "aGVsbG8=".into(), mime_type: "image/png".into() },
            ],
            ..Default::default()
        };
        assert_eq!(out.to_text(), "hello\n{\"a\":1}\n[image image/png, 5 bytes]");
        assert_eq!(out.byte_len(), 5 + 7 + 8 + 2);
        assert!(!out.is_textual());
    }

    #[test]
    fn structured_only() {
        let out = ToolOutput::default().with_structured(json!([1, 2]));
        assert_eq!(out.to_text(), "[1,2]");
        assert_eq!(out.byte_len(), 5);
    }
}
