//! What a provider offers besides tools: prompts (message templates a person picks) and
//! resources (documents a client reads by URI), in the shapes MCP gives them.

use crate::ContentPart;
use serde::{Deserialize, Serialize};

/// One argument of a prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptArgument {
    /// The argument's name.
    pub name: String,
    /// What to fill in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether the prompt cannot be rendered without it.
    #[serde(default)]
    pub required: bool,
}

impl PromptArgument {
    /// A required argument.
    pub fn required(name: impl Into<String>, description: impl Into<String>) -> Self {
        PromptArgument { name: name.into(), description: Some(description.into()), required: true }
    }

    /// An optional argument.
    pub fn optional(name: impl Into<String>, description: impl Into<String>) -> Self {
        PromptArgument { name: name.into(), description: Some(description.into()), required: false }
    }
}

/// A prompt as listed: a name, what it is for, and the arguments it takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptSpec {
    /// Provider-local name; the orchestrator qualifies it like a tool name.
    pub name: String,
    /// A display title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the prompt is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its arguments, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arguments: Vec<PromptArgument>,
}

impl PromptSpec {
    /// A prompt with no arguments.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        PromptSpec {
            name: name.into(),
            title: None,
            description: Some(description.into()),
            arguments: Vec::new(),
        }
    }

    /// Adds an argument.
    pub fn with_argument(mut self, argument: PromptArgument) -> Self {
        self.arguments.push(argument);
        self
    }

    /// The required arguments missing from `given`, in declaration order.
    pub fn missing_arguments<'a>(
        &'a self,
        given: &'a serde_json::Map<String, serde_json::Value>,
    ) -> impl Iterator<Item = &'a str> + 'a {
        self.arguments
            .iter()
            .filter(|a| a.required && !given.contains_key(&a.name))
            .map(|a| a.name.as_str())
    }
}

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The person (or the agent acting for them).
    User,
    /// The model.
    Assistant,
}

/// One message of a rendered prompt or of a sampling request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said: text, an image, audio or an embedded resource.
    pub content: ContentPart,
}

impl Message {
    /// A user message of plain text.
    pub fn user_text(text: impl Into<String>) -> Self {
        Message { role: Role::User, content: ContentPart::Text { text: text.into() } }
    }

    /// A user message with any content.
    pub fn user(content: ContentPart) -> Self {
        Message { role: Role::User, content }
    }
}

/// A prompt rendered with its arguments: the messages to put in front of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    /// A description of this rendering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The messages, in order.
    pub messages: Vec<Message>,
}

/// A resource as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceSpec {
    /// Its URI, unique across providers (the orchestrator routes reads by it).
    pub uri: String,
    /// A short name.
    pub name: String,
    /// A display title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// MIME type, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Size in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

impl ResourceSpec {
    /// A resource with a URI, a name and a description.
    pub fn new(
        uri: impl Into<String>,
        name: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        ResourceSpec {
            uri: uri.into(),
            name: name.into(),
            title: None,
            description: Some(description.into()),
            mime_type: None,
            size: None,
        }
    }

    /// Sets the MIME type.
    pub fn with_mime_type(mut self, mime_type: impl Into<String>) -> Self {
        self.mime_type = Some(mime_type.into());
        self
    }
}

/// A family of resources whose URIs follow an RFC 6570 template (`file:///{path}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceTemplate {
    /// The URI template.
    pub uri_template: String,
    /// A short name.
    pub name: String,
    /// A display title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What its resources hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// MIME type of its resources, when they share one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
}

impl ResourceTemplate {
    /// A template with a name and a description.
    pub fn new(
        uri_template: impl Into<String>,
        name: impl Into<String>,
        description: impl Into<String>,
    ) -> Self {
        ResourceTemplate {
            uri_template: uri_template.into(),
            name: name.into(),
            title: None,
            description: Some(description.into()),
            mime_type: None,
        }
    }

    /// Sets the MIME type.
    pub fn with_mime_type(mut self, mime_type: impl Into<String>) -> Self {
        self.mime_type = Some(mime_type.into());
        self
    }

    /// The variables of this template that `uri` binds, in template order, or `None` when
    /// `uri` does not match it. Understands simple `{var}` expressions (RFC 6570 level 1),
    /// which match one or more characters other than `/`, and `{+var}` / `{/var}`
    /// expressions, which may span `/`.
    pub fn match_uri(&self, uri: &str) -> Option<Vec<(String, String)>> {
        match_template(&self.uri_template, uri)
    }
}

/// The contents of a resource, as read: text or base64 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceContents {
    /// The URI these contents are of.
    pub uri: String,
    /// MIME type, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// The contents.
    #[serde(flatten)]
    pub body: ResourceBody,
}

/// The body of [`ResourceContents`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceBody {
    /// Text.
    Text(String),
    /// Base64-encoded bytes.
    Blob(String),
}

impl ResourceContents {
    /// Text contents.
    pub fn text(uri: impl Into<String>, mime_type: &str, text: impl Into<String>) -> Self {
        ResourceContents {
            uri: uri.into(),
            mime_type: Some(mime_type.to_owned()),
            body: ResourceBody::Text(text.into()),
        }
    }

    /// Binary contents, already base64-encoded.
    pub fn blob(uri: impl Into<String>, mime_type: &str, base64: impl Into<String>) -> Self {
        ResourceContents {
            uri: uri.into(),
            mime_type: Some(mime_type.to_owned()),
            body: ResourceBody::Blob(base64.into()),
        }
    }

    /// These contents as one embedded-resource content part.
    pub fn into_content(self) -> ContentPart {
        let (text, blob) = match self.body {
            ResourceBody::Text(text) => (Some(text), None),
            ResourceBody::Blob(blob) => (None, Some(blob)),
        };
        ContentPart::Resource { uri: self.uri, mime_type: self.mime_type, text, blob }
    }
}

fn match_template(template: &str, uri: &str) -> Option<Vec<(String, String)>> {
    let mut vars = Vec::new();
    let mut rest_t = template;
    let mut rest_u = uri;
    loop {
        let Some(open) = rest_t.find('{') else {
            return (rest_t == rest_u).then_some(vars);
        };
        let literal = &rest_t[..open];
        rest_u = rest_u.strip_prefix(literal)?;
        let close = open + rest_t[open..].find('}')?;
        let expr = &rest_t[open + 1..close];
        let (spans_slash, prefix, name) = match expr.as_bytes().first() {
            Some(b'+') | Some(b'#') => (true, "", &expr[1..]),
            Some(b'/') => (true, "/", &expr[1..]),
            _ => (false, "", expr),
        };
        rest_u = rest_u.strip_prefix(prefix)?;
        rest_t = &rest_t[close + 1..];
        // The value runs up to the next literal of the template (or to the end).
        let next_literal = rest_t.split('{').next().unwrap_or_default();
        let end = if next_literal.is_empty() {
            if rest_t.is_empty() { rest_u.len() } else { return None }
        } else {
            rest_u.find(next_literal)?
        };
        let value = &rest_u[..end];
        if value.is_empty() || (!spans_slash && value.contains('/')) {
            return None;
        }
        vars.push((name.to_owned(), value.to_owned()));
        rest_u = &rest_u[end..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(template: &str, uri: &str) -> Option<Vec<String>> {
        ResourceTemplate::new(template, "t", "t")
            .match_uri(uri)
            .map(|v| v.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
    }

    #[test]
    fn templates_match_simple_variables() {
        assert_eq!(
            vars("test://template/{id}/data", "test://template/123/data").unwrap(),
            ["id=123"]
        );
        assert_eq!(vars("test://template/{id}/data", "test://template/1/2/data"), None);
        assert_eq!(vars("test://template/{id}/data", "test://template//data"), None);
        assert_eq!(vars("test://template/{id}/data", "test://other/1/data"), None);
        assert_eq!(vars("repo://{owner}/{name}", "repo://a/b").unwrap(), ["owner=a", "name=b"]);
        assert_eq!(vars("file:///{+path}", "file:///a/b/c.txt").unwrap(), ["path=a/b/c.txt"]);
        assert_eq!(vars("plain://x", "plain://x").unwrap(), Vec::<String>::new());
        assert_eq!(vars("plain://x", "plain://y"), None);
        assert_eq!(vars("broken://{x", "broken://1"), None);
    }

    #[test]
    fn contents_become_embedded_resources() {
        let part = ResourceContents::text("a://b", "text/plain", "hi").into_content();
        assert_eq!(
            part,
            ContentPart::Resource {
                uri: "a://b".into(),
                mime_type: Some("text/plain".into()),
                text: Some("hi".into()),
                blob: None,
            }
        );
    }

    #[test]
    fn missing_required_arguments_are_named() {
        let spec = PromptSpec::new("p", "d")
            .with_argument(PromptArgument::required("a", "first"))
            .with_argument(PromptArgument::optional("b", "second"))
            .with_argument(PromptArgument::required("c", "third"));
        let given = serde_json::json!({"a": "1"});
        let missing: Vec<&str> = spec.missing_arguments(given.as_object().unwrap()).collect();
        assert_eq!(missing, ["c"]);
    }
}

/// What a completion is asked for: an argument of a prompt, or a variable of a resource
/// template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionRef {
    /// The prompt of this name (provider-local at a provider, qualified at the orchestrator).
    Prompt(String),
    /// The resource template of this URI template.
    ResourceTemplate(String),
}

/// A request for values of one argument that start like what the user typed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionRequest {
    /// The prompt or resource template the argument belongs to.
    pub reference: CompletionRef,
    /// The argument's name.
    pub argument: String,
    /// What was typed so far.
    pub value: String,
    /// The other arguments already given, for completions that depend on them.
    pub context: std::collections::BTreeMap<String, String>,
}

impl CompletionRequest {
    /// A request for `argument` of `reference`, `value` typed so far.
    pub fn new(
        reference: CompletionRef,
        argument: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        CompletionRequest {
            reference,
            argument: argument.into(),
            value: value.into(),
            context: Default::default(),
        }
    }
}

/// Suggested values for an argument; empty when there are none (or completion is not
/// offered).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Completion {
    /// At most [`Completion::MAX_VALUES`] suggestions, best first.
    pub values: Vec<String>,
    /// How many values there are in all, when known.
    pub total: Option<u32>,
    /// Whether there are more values than those given.
    pub has_more: bool,
}

impl Completion {
    /// The most values one completion carries (MCP's limit).
    pub const MAX_VALUES: usize = 100;
}
