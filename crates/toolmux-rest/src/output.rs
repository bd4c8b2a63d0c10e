//! Structured results of imported operations with an output schema: the parsed JSON body
//! of a success, checked against the schema before it is passed on, since MCP clients
//! refuse a result whose structured content does not conform (or is missing).

use crate::http::{Response, redacted_excerpt};
use jsonschema::Validator;
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use toolmux_core::{ContentPart, ToolOutput};

/// An operation's output schema with its validator, compiled on the first success.
#[derive(Debug)]
pub(crate) struct OutputCheck {
    schema: Arc<Value>,
    /// The body is the schema's `result` property.
    wrapped: bool,
    compiled: OnceLock<Result<Validator, String>>,
}

impl OutputCheck {
    pub(crate) fn new(schema: Arc<Value>, wrapped: bool) -> Self {
        OutputCheck { schema, wrapped, compiled: OnceLock::new() }
    }

    fn validator(&self) -> &Result<Validator, String> {
        self.compiled.get_or_init(|| {
            jsonschema::draft202012::options().build(&self.schema).map_err(|e| e.to_string())
        })
    }

    /// The output of `response`. A failure (not `2xx`) carries no structured content, as
    /// before. A success carries its JSON body as structured content (as `{"result": …}`
    /// when wrapped) beside the text; one whose body is not JSON, or does not conform to
    /// the schema, is an error result saying so, with the body after the note.
    pub(crate) fn apply(&self, response: Response) -> ToolOutput {
        if !(200..300).contains(&response.status) {
            return response.into_output();
        }
        let head = format!("HTTP {} {}", response.status, response.reason);
        let empty = response.body.is_empty() && response.items.is_none();
        let content_type = response.content_type.clone();
        let secrets = response.secrets.clone();
        let output = response.into_output();
        let body = match output.content.as_slice() {
            _ if empty => Err("its body is empty".to_owned()),
            [ContentPart::Json { value }] => Ok(value.clone()),
            [ContentPart::Text { text }] => serde_json::from_str::<Value>(text).map_err(|_| {
                let what = if content_type.is_empty() { "no content type" } else { &content_type };
                format!("its body is not JSON ({what})")
            }),
            _ => Err(format!("its body is not JSON ({content_type})")),
        };
        let checked = body.and_then(|body| {
            let structured = if self.wrapped { json!({"result": body}) } else { body };
            let validator = self
                .validator()
                .as_ref()
                .map_err(|e| format!("the output schema does not compile ({e})"))?;
            let Some(error) = validator.iter_errors(&structured).next() else {
                return Ok(structured);
            };
            let path = error.instance_path().as_str();
            let path =
                if self.wrapped { path.strip_prefix("/result").unwrap_or(path) } else { path };
            let at = if path.is_empty() { "its top".to_owned() } else { format!("`{path}`") };
            let error = redacted_excerpt(&error.to_string(), 300, &secrets);
            Err(format!("its body does not match the documented schema: at {at}, {error}"))
        });
        match checked {
            Ok(structured) => output.with_structured(structured),
            Err(why) => {
                // The body goes back to the model and the logs: what the API echoes of the
                // request's credentials is redacted, as in any other error result.
                let mut result = mismatch(output, &head, &why);
                crate::secrets::scrub_output(&mut result, &secrets);
                result
            }
        }
    }
}

/// A success reported as an error because it cannot be given as the structured content
/// the output schema promises: the note first, then the body as it was.
fn mismatch(output: ToolOutput, head: &str, why: &str) -> ToolOutput {
    let note = format!(
        "{head}, but {why}; the tool's output schema (from the operation's documented \
         responses) promises structured content that conforms, so this result is reported as \
         an error. The request itself succeeded: do not repeat it for this reason. Setting \
         `outputSchemas: false` on this OpenAPI import takes responses as they come"
    );
    let mut content = vec![ContentPart::Text { text: note }];
    content.extend(output.content);
    ToolOutput { content, is_error: true, extras: output.extras, ..ToolOutput::default() }
}
