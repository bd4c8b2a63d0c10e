//! What a running tool may ask of whoever called it (a completion from their model, an
//! answer from their user, their workspace roots) and the log lines it sends them.
//!
//! These are the shapes of MCP's sampling, elicitation, roots and logging; an
//! [`crate::InteractionHandler`] answers the requests, a [`LogSink`] takes the lines.

use crate::{ContentPart, JsonObject, Message, Role};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::sync::Arc;

/// A request for one completion from the caller's model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingRequest {
    /// A name for this request, the same every time the tool runs (`greeting`). A caller
    /// that answers by re-running the tool (MCP's multi-round-trip requests) matches
    /// answers to requests by it; without one, requests are numbered in the order made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The conversation to complete.
    pub messages: Vec<Message>,
    /// The system prompt, if the tool wants one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// The most tokens to generate.
    pub max_tokens: u32,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Sequences that end the completion.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
    /// Model preferences (hints and priorities), as the protocol gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_preferences: Option<Value>,
}

impl SamplingRequest {
    /// One user message of text, at most `max_tokens` in reply.
    pub fn text(prompt: impl Into<String>, max_tokens: u32) -> Self {
        SamplingRequest {
            key: None,
            messages: vec![Message::user_text(prompt)],
            system_prompt: None,
            max_tokens,
            temperature: None,
            stop_sequences: Vec::new(),
            model_preferences: None,
        }
    }

    /// Names the request (see [`SamplingRequest::key`]).
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// The caller's completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingResponse {
    /// Who speaks (the assistant, normally).
    pub role: Role,
    /// What the model said.
    pub content: ContentPart,
    /// The model that answered.
    pub model: String,
    /// Why generation stopped (`endTurn`, `maxTokens`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
}

/// A question for the caller's user, with the JSON Schema of the answer (a flat object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElicitationRequest {
    /// A name for this request (see [`SamplingRequest::key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What to ask.
    pub message: String,
    /// The schema of the answer: an object of primitive properties.
    pub requested_schema: Value,
}

impl ElicitationRequest {
    /// Asks `message`, expecting an answer of `requested_schema`.
    pub fn new(message: impl Into<String>, requested_schema: Value) -> Self {
        ElicitationRequest { key: None, message: message.into(), requested_schema }
    }

    /// Names the request (see [`SamplingRequest::key`]).
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// A request that the caller's user open a URL and complete something there (sign in,
/// pay, consent) that the tool must not see: MCP's URL-mode elicitation. The answer is only
/// whether the user agreed to go ([`ElicitationAction`]); whatever happens at the URL
/// reaches the tool's server directly, never through the call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UrlElicitationRequest {
    /// A name for this request (see [`SamplingRequest::key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Why the user should go there.
    pub message: String,
    /// Where to go.
    pub url: String,
    /// The server's id for it (MCP's `elicitationId`; empty when the server gave none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub elicitation_id: String,
}

impl UrlElicitationRequest {
    /// Asks the user to open `url`, for the reason `message`.
    pub fn new(message: impl Into<String>, url: impl Into<String>) -> Self {
        UrlElicitationRequest {
            key: None,
            message: message.into(),
            url: url.into(),
            elicitation_id: String::new(),
        }
    }

    /// Sets the server's id for the request.
    pub fn with_elicitation_id(mut self, id: impl Into<String>) -> Self {
        self.elicitation_id = id.into();
        self
    }

    /// Names the request (see [`SamplingRequest::key`]).
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// A request for the caller's roots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootsRequest {
    /// A name for this request (see [`SamplingRequest::key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl RootsRequest {
    /// A request named `key`.
    pub fn with_key(key: impl Into<String>) -> Self {
        RootsRequest { key: Some(key.into()) }
    }
}

/// What the user did with an [`ElicitationRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationAction {
    /// Answered; the content holds the answer.
    Accept,
    /// Explicitly refused to answer.
    Decline,
    /// Dismissed the question.
    Cancel,
}

impl fmt::Display for ElicitationAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ElicitationAction::Accept => "accept",
            ElicitationAction::Decline => "decline",
            ElicitationAction::Cancel => "cancel",
        })
    }
}

/// The user's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElicitationResponse {
    /// What they did.
    pub action: ElicitationAction,
    /// Their answer, when they accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<JsonObject>,
}

/// A root the caller works in (a project directory, a repository).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Root {
    /// Its URI, `file://` for directories.
    pub uri: String,
    /// A display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The severity of a log line, as syslog and MCP order them (least severe first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    /// Detail for debugging.
    Debug,
    /// Normal operation.
    Info,
    /// Normal but significant.
    Notice,
    /// Something may be wrong.
    Warning,
    /// Something failed.
    Error,
    /// A component failed.
    Critical,
    /// Act at once.
    Alert,
    /// The system is unusable.
    Emergency,
}

impl LogLevel {
    /// The protocol's name of the level (`info`, `warning`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Notice => "notice",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
            LogLevel::Critical => "critical",
            LogLevel::Alert => "alert",
            LogLevel::Emergency => "emergency",
        }
    }
}

/// One log line from a running tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogMessage {
    /// Its severity.
    pub level: LogLevel,
    /// The component that logged it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logger: Option<String>,
    /// The line: a string or any JSON value.
    pub data: Value,
}

impl LogMessage {
    /// A text line at `level`.
    pub fn text(level: LogLevel, text: impl Into<String>) -> Self {
        LogMessage { level, logger: None, data: Value::String(text.into()) }
    }
}

/// Where a tool's log lines go. Cheap to clone.
#[derive(Clone)]
pub struct LogSink(Arc<dyn Fn(LogMessage) + Send + Sync>);

impl LogSink {
    /// A sink calling `f` for every line; `f` must return quickly.
    pub fn new(f: impl Fn(LogMessage) + Send + Sync + 'static) -> Self {
        LogSink(Arc::new(f))
    }

    /// Delivers one line.
    pub fn log(&self, message: LogMessage) {
        (self.0)(message);
    }
}

impl fmt::Debug for LogSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LogSink")
    }
}
