//! What can go wrong while loading REST tools or calling them.

use std::path::PathBuf;
use toolmux_core::ToolError;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a REST tool could not be loaded or called.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestError {
    /// The OpenAPI document could not be read from its file.
    #[error("cannot read OpenAPI document `{}`: {message}", .path.display())]
    ReadSpec {
        /// The file.
        path: PathBuf,
        /// Why: the OS's reason (`No such file or directory`), or what the file is when it
        /// is no regular file, or its size when it is too large.
        message: String,
    },
    /// The OpenAPI document could not be fetched from its URL.
    #[error("cannot fetch OpenAPI document from `{url}`: {message}")]
    FetchSpec {
        /// The URL without its query and user info (which may hold credentials).
        url: String,
        /// What went wrong (status or connection trouble).
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The document is neither valid JSON nor valid YAML.
    #[error("{source_name}: not valid JSON or YAML at {location}: {message}")]
    Syntax {
        /// Where the document came from (file or URL).
        source_name: String,
        /// Line and column.
        location: String,
        /// The parser's message.
        message: String,
    },
    /// The document parsed but is not a usable OpenAPI or Swagger document.
    #[error("{source_name}: at {pointer}: {message}")]
    Spec {
        /// Where the document came from.
        source_name: String,
        /// JSON pointer to the offending place in the document.
        pointer: String,
        /// What is wrong there.
        message: String,
    },
    /// The configuration of a tool or of an import is invalid.
    #[error("invalid configuration of `{name}`: {message}")]
    Config {
        /// The inline tool or import.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The arguments cannot be turned into a request.
    #[error("cannot build the request for `{tool}`: {message}")]
    Request {
        /// The tool.
        tool: String,
        /// What is wrong.
        message: String,
    },
    /// The HTTP exchange failed before a complete response arrived.
    #[error("`{tool}`: request to {url} failed: {message}")]
    Http {
        /// The tool.
        tool: String,
        /// The URL without its query (which may hold credentials).
        url: String,
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
    /// The request ran past its time limit.
    #[error("`{tool}`: no complete response within {} ms", .after.as_millis())]
    Timeout {
        /// The tool.
        tool: String,
        /// The limit.
        after: std::time::Duration,
    },
    /// The response grew past its size limit while being read.
    #[error(
        "`{tool}`: response larger than {limit} bytes, reading stopped: raise `maxResponseBytes` \
         (of the tool, or of its OpenAPI import) or ask the API for less, such as a page or a \
         filter"
    )]
    ResponseTooLarge {
        /// The tool.
        tool: String,
        /// The limit in bytes.
        limit: usize,
    },
    /// An OAuth2 token could not be obtained.
    #[error("`{tool}`: cannot obtain an OAuth2 token for scheme `{scheme}`: {message}")]
    Token {
        /// The tool.
        tool: String,
        /// The security scheme.
        scheme: String,
        /// What went wrong.
        message: String,
    },
    /// The API refused for its rate limit (HTTP 429, or 503 with `Retry-After`).
    #[error("`{tool}`: {answer}")]
    RateLimited {
        /// The tool.
        tool: String,
        /// The API's answer, in words: its status and what its body said.
        answer: String,
        /// When to try again: the API's `Retry-After`, else a guess.
        retry_after: std::time::Duration,
    },
}

impl RestError {
    /// The error with each of `secrets` in its texts (a URL's path, an API's answer)
    /// replaced by `REDACTED`.
    pub(crate) fn redacted(self, secrets: &[String]) -> RestError {
        let scrub = |text: String| crate::secrets::scrub(&text, secrets);
        match self {
            RestError::Http { tool, url, message, source } => {
                RestError::Http { tool, url: scrub(url), message: scrub(message), source }
            }
            RestError::FetchSpec { url, message, source } => {
                RestError::FetchSpec { url: scrub(url), message: scrub(message), source }
            }
            RestError::Request { tool, message } => {
                RestError::Request { tool, message: scrub(message) }
            }
            RestError::Token { tool, scheme, message } => {
                RestError::Token { tool, scheme, message: scrub(message) }
            }
            RestError::RateLimited { tool, answer, retry_after } => {
                RestError::RateLimited { tool, answer: scrub(answer), retry_after }
            }
            other => other,
        }
    }

    /// Converts into the shared error type, choosing who must act.
    pub fn into_tool_error(self, provider: &str) -> ToolError {
        match self {
            RestError::Request { tool, message } => ToolError::InvalidArguments {
                tool,
                violations: vec![toolmux_core::Violation { pointer: String::new(), message }],
            },
            RestError::Timeout { tool, after } => ToolError::Timeout { tool, after, idle: None },
            RestError::RateLimited { tool, answer, retry_after } => {
                ToolError::RateLimited { tool, limit: answer, retry_after }
            }
            RestError::Http { tool, url, message, source } => ToolError::Transport {
                provider: provider.to_owned(),
                message: format!("`{tool}`: request to {url} failed: {message}"),
                source,
            },
            RestError::ResponseTooLarge { ref tool, .. } | RestError::Token { ref tool, .. } => {
                ToolError::Remote { tool: tool.clone(), message: self.to_string() }
            }
            other => ToolError::Other {
                provider: provider.to_owned(),
                message: other.to_string(),
                source: Some(Box::new(other)),
            },
        }
    }
}
