//! What can go wrong asking a model.

use std::time::Duration;

/// Why a model gave no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The configuration cannot work (no API key, a bad URL, an unknown API type).
    #[error("model `{model}`: {message}")]
    Config {
        /// The configured model name.
        model: String,
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The API refused the credentials (401 or 403).
    #[error("model `{model}`: the API refused the credentials (HTTP {status}): {message}")]
    Auth {
        /// The configured model name.
        model: String,
        /// The HTTP status.
        status: u16,
        /// The API's own message.
        message: String,
    },
    /// Still rate limited after the retries.
    #[error("model `{model}`: rate limited (HTTP 429) after {attempts} attempts{}: {message}", retry_note(*retry_after))]
    RateLimited {
        /// The configured model name.
        model: String,
        /// How many requests were made.
        attempts: u32,
        /// When the API said to try again, if it did.
        retry_after: Option<Duration>,
        /// What the API said, last time.
        message: String,
    },
    /// The API answered with an error status.
    #[error("model `{model}`: the API answered HTTP {status}: {message}")]
    Api {
        /// The configured model name.
        model: String,
        /// The HTTP status.
        status: u16,
        /// The API's own message, or an excerpt of the body.
        message: String,
    },
    /// The request did not reach the API or its answer did not arrive.
    #[error("model `{model}`: {message}")]
    Transport {
        /// The configured model name.
        model: String,
        /// What failed (connect, read), with the innermost cause.
        message: String,
    },
    /// No answer within the configured timeout.
    #[error("model `{model}`: no answer within {}s (set `timeoutMs` on the model to wait longer)", .timeout.as_secs_f64())]
    Timeout {
        /// The configured model name.
        model: String,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// The answer was not what the API documents.
    #[error("model `{model}`: unexpected answer: {message}")]
    Malformed {
        /// The configured model name.
        model: String,
        /// What was wrong with it.
        message: String,
    },
    /// The caller cancelled the request.
    #[error("model `{model}`: cancelled")]
    Cancelled {
        /// The configured model name.
        model: String,
    },
}

fn retry_note(after: Option<Duration>) -> String {
    match after {
        Some(after) => format!("; the API asked to wait {}s", after.as_secs_f64()),
        None => String::new(),
    }
}

impl ModelError {
    /// Whether asking again later may succeed (rate limits, server errors, transport).
    pub fn is_transient(&self) -> bool {
        match self {
            ModelError::RateLimited { .. }
            | ModelError::Transport { .. }
            | ModelError::Timeout { .. } => true,
            ModelError::Api { status, .. } => *status >= 500 || *status == 408,
            _ => false,
        }
    }
}
