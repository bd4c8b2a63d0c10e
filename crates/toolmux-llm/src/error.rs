//! What can go wrong asking a model.

use crate::Usage;
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
    /// Still rate limited after the retries, or asked to wait longer than a request waits
    /// (see `retry_after`).
    #[error("model `{model}`: rate limited (HTTP 429) after {attempts} attempt{}{}: {message}", if *attempts == 1 { "" } else { "s" }, retry_note(*retry_after, retry_at.as_deref()))]
    RateLimited {
        /// The configured model name.
        model: String,
        /// How many requests were made.
        attempts: u32,
        /// When the API said to try again, if it did.
        retry_after: Option<Duration>,
        /// The HTTP date the API said to try again at, when it gave a date rather than
        /// seconds.
        retry_at: Option<String>,
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
    /// The API reported an error inside the stream of an answer it had begun (its HTTP
    /// status was 200): Anthropic's `error` event, a chat completions chunk of `{"error":
    /// …}`. It is retried as the status its kind stands for would be (`overloaded_error`
    /// as a 529, `rate_limit_error` as a 429, `api_error` as a 500); this is the last
    /// attempt's.
    #[error("model `{model}`: the API reported `{kind}` inside its streamed answer: {message}")]
    StreamFailed {
        /// The configured model name.
        model: String,
        /// The error's kind as the API named it (its `type`, else its `code`), `error`
        /// when it named none.
        kind: String,
        /// The HTTP status the kind stands for, which decides whether it is retried.
        status: u16,
        /// The API's own message.
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
    /// No answer within the configured timeout (`timeoutMs`), or a streamed answer not
    /// whole within the most a stream may take, ten times it ([`TimeoutKind`]).
    #[error("model `{model}`: {}", timeout_note(*kind, *timeout))]
    Timeout {
        /// The configured model name.
        model: String,
        /// The wait that ran out: `timeoutMs`, or ten times it for a whole stream.
        timeout: Duration,
        /// Which wait it was.
        kind: TimeoutKind,
    },
    /// The answer was not what the API documents.
    #[error("model `{model}`: unexpected answer: {message}")]
    Malformed {
        /// The configured model name.
        model: String,
        /// What was wrong with it.
        message: String,
    },
    /// The API ended the answer for a reason that is not a finished turn and that no
    /// other variant stands for: the model failed while writing (Mistral's and the
    /// compatible servers' `error`, Gemini's `MALFORMED_FUNCTION_CALL`), or a turn still
    /// paused after [`MAX_CONTINUATIONS`](crate::MAX_CONTINUATIONS) continuations
    /// (Anthropic's `pause_turn`). What it wrote is not an answer. The API bills it all the
    /// same: its figures are kept here, for budgets to count ([`ModelError::usage`]); those
    /// of a paused turn count every continuation.
    #[error("model `{model}`: the API ended the answer with `{reason}`: {message}")]
    Stopped {
        /// The configured model name.
        model: String,
        /// The finish or stop reason, as the API named it.
        reason: String,
        /// What it means and what to change.
        message: String,
        /// The tokens of the request and of what was written before the stop, as the API
        /// counted them (estimated, and marked so, when it counted none).
        usage: Usage,
    },
    /// The answer was cut off at the model's context window (Anthropic's
    /// `model_context_window_exceeded`): the request and the answer together filled it.
    /// [`ModelError::context_overflow`] reads it as a request over the window, since going
    /// on from the cut would need more room than there is.
    /// The API bills the answer all the same: its figures are kept here, for budgets to
    /// count ([`ModelError::usage`]).
    #[error(
        "model `{model}`: the answer was cut off at the model's context window ({} tokens read, {} written)",
        usage.input_tokens,
        usage.output_tokens
    )]
    ContextWindowReached {
        /// The configured model name.
        model: String,
        /// The tokens of the request and of the answer before the cut, as the API counted
        /// them (estimated, and marked so, when it counted none).
        usage: Usage,
    },
    /// The caller cancelled the request.
    #[error("model `{model}`: cancelled")]
    Cancelled {
        /// The configured model name.
        model: String,
    },
}

/// Which wait of a request ran out ([`ModelError::Timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeoutKind {
    /// The answer (the head of a stream, or all of a whole answer) did not come within
    /// `timeoutMs`.
    Answer,
    /// A streamed answer's stream sent nothing for `timeoutMs`.
    Idle,
    /// A streamed answer was not whole within [`STREAM_TIMEOUT_FACTOR`] times `timeoutMs`,
    /// the most a stream may take however steadily its parts (or a server's keep-alive
    /// pings) come.
    Stream,
}

/// How many times `timeoutMs` a streamed answer may take in all, its parts each coming
/// within `timeoutMs` of the last.
pub const STREAM_TIMEOUT_FACTOR: u32 = 10;

/// A timeout in words naming the setting that governs it, `timeoutMs`, with its value in
/// milliseconds as configured.
fn timeout_note(kind: TimeoutKind, timeout: Duration) -> String {
    let ms = |wait: Duration| wait.as_millis();
    match kind {
        TimeoutKind::Answer => format!(
            "no answer within `timeoutMs` ({} ms): set `timeoutMs` higher on the model to wait \
             longer",
            ms(timeout)
        ),
        TimeoutKind::Idle => format!(
            "the answer's stream sent nothing for `timeoutMs` ({} ms): set `timeoutMs` higher \
             on the model to wait longer",
            ms(timeout)
        ),
        TimeoutKind::Stream => format!(
            "the streamed answer was not whole within {} ms, {STREAM_TIMEOUT_FACTOR} times \
             `timeoutMs` ({} ms), the most a stream may take however steadily its parts or \
             keep-alive pings come: set `timeoutMs` higher on the model to wait longer",
            ms(timeout),
            ms(timeout / STREAM_TIMEOUT_FACTOR)
        ),
    }
}

/// What the API's `Retry-After` asked, for a message: the wait (`at`, the HTTP date it
/// named, when it named one) and, when longer than a request waits, that it was not asked
/// again.
pub(crate) fn retry_note(after: Option<Duration>, at: Option<&str>) -> String {
    let cap = crate::http::MAX_RETRY_AFTER;
    let until = at.map(|at| format!(", until {at}")).unwrap_or_default();
    match after {
        Some(Duration::MAX) => format!(
            "; the API asked to wait more seconds than any clock counts, longer than the {}s a \
             request waits, so it was not asked again: try again later, or use another model",
            cap.as_secs()
        ),
        Some(after) if after > cap => format!(
            "; the API asked to wait {}s ({}{until}), longer than the {}s a request waits, so \
             it was not asked again: try again then, or use another model",
            after.as_secs(),
            in_words(after),
            cap.as_secs()
        ),
        Some(after) => format!("; the API asked to wait {}s", after.as_secs_f64()),
        None => String::new(),
    }
}

/// `wait` as a person reads it: about so many minutes, hours, days or years.
fn in_words(wait: Duration) -> String {
    let seconds = wait.as_secs();
    let (unit, size) = [("year", 31_557_600), ("day", 86_400), ("hour", 3600), ("minute", 60)]
        .into_iter()
        .find(|(_, size)| seconds >= 2 * size)
        .unwrap_or(("second", 1));
    // Rounded to the nearest without adding half a unit first, which overflowed for a wait
    // near the most seconds a clock counts (`Retry-After: 18446744073700000000`).
    let rounded = seconds / size + u64::from(seconds % size >= size - size / 2);
    format!("about {rounded} {unit}s")
}

/// What an API said of a request longer than the model's context window
/// ([`ModelError::context_overflow`]): the figures its message gave, when it gave them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContextOverflow {
    /// The model's context window in tokens.
    pub limit: Option<u64>,
    /// The request's size in tokens, as the API counted it.
    pub tokens: Option<u64>,
    /// For an answer cut at the window ([`ModelError::ContextWindowReached`]), the tokens
    /// it had written by then: the answer needs at least that much room, and more.
    pub written: Option<u64>,
}

/// Words of the APIs' refusals of a request over the context window: OpenAI's, DeepSeek's
/// and vLLM's "maximum context length is …", OpenAI's newer "Input tokens exceed the
/// configured limit of …", Anthropic's "prompt is too long: … tokens > … maximum",
/// Gemini's "The input token count (…) exceeds the maximum number of tokens allowed (…)",
/// llama.cpp's "the request exceeds the available context size".
const OVERFLOW_WORDS: [&str; 6] = [
    "context length",
    "context_length_exceeded",
    "prompt is too long",
    "input tokens exceed",
    "exceeds the maximum number of tokens",
    "exceeds the available context size",
];

impl ModelError {
    /// Whether the API refused the request for being longer than the model's context
    /// window, and what it said of the sizes; `None` for every other error.
    pub fn context_overflow(&self) -> Option<ContextOverflow> {
        // The window is what was read and written together; the request, what was read.
        // Estimated figures are this crate's, not the API's: they say nothing of the window.
        if let ModelError::ContextWindowReached { usage, .. } = self {
            let counted = |tokens: u64| (tokens > 0 && !usage.estimated).then_some(tokens);
            return Some(ContextOverflow {
                limit: counted(usage.total()),
                tokens: counted(usage.input_tokens),
                written: counted(usage.output_tokens),
            });
        }
        let (ModelError::Api { status: 400 | 413, message, .. }
        | ModelError::StreamFailed { status: 400 | 413, message, .. }) = self
        else {
            return None;
        };
        let lower = message.to_ascii_lowercase();
        if !OVERFLOW_WORDS.iter().any(|words| lower.contains(words)) {
            return None;
        }
        let after = |words: &str| number_after(&lower, words);
        Some(ContextOverflow {
            limit: after("maximum context length is")
                .or_else(|| after("configured limit of"))
                .or_else(|| after("tokens >"))
                .or_else(|| after("maximum number of tokens allowed")),
            tokens: after("resulted in")
                .or_else(|| after("you requested"))
                .or_else(|| after("prompt is too long:"))
                .or_else(|| after("input token count")),
            written: None,
        })
    }

    /// The tokens the API billed for a request that failed all the same, to be counted as
    /// an answer's are: an answer cut at the context window
    /// ([`ModelError::ContextWindowReached`]) or ended for a reason that is no finished turn
    /// ([`ModelError::Stopped`]); `None` where it answered nothing billed.
    pub fn usage(&self) -> Option<Usage> {
        match self {
            ModelError::ContextWindowReached { usage, .. } | ModelError::Stopped { usage, .. } => {
                Some(*usage)
            }
            _ => None,
        }
    }

    /// This error of a request made to continue an answer, carrying the tokens the
    /// answer's earlier requests used (`earlier`) as well, where it carries any.
    pub(crate) fn with_earlier_usage(mut self, earlier: Usage) -> ModelError {
        if let ModelError::ContextWindowReached { usage, .. } | ModelError::Stopped { usage, .. } =
            &mut self
        {
            *usage += earlier;
        }
        self
    }

    /// Whether asking again later may succeed (rate limits, server errors, transport).
    pub fn is_transient(&self) -> bool {
        match self {
            ModelError::RateLimited { .. }
            | ModelError::Transport { .. }
            | ModelError::Timeout { .. } => true,
            ModelError::Api { status, .. } => *status >= 500 || *status == 408,
            ModelError::StreamFailed { status, kind, .. } => {
                !crate::http::spent_kind(kind)
                    && (*status >= 500 || *status == 408 || *status == 429)
            }
            _ => false,
        }
    }
}

/// The number that follows `words` in `text`, past spaces and brackets, its digits perhaps
/// grouped with commas.
fn number_after(text: &str, words: &str) -> Option<u64> {
    let rest = &text[text.find(words)? + words.len()..];
    let rest = rest.trim_start_matches([' ', '(', ':']);
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(|c| *c != ',')
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::{ContextOverflow, ModelError};

    /// Rounded to the nearest unit, half up, up to the most seconds a `Duration` counts.
    #[test]
    fn a_wait_is_said_in_the_nearest_whole_units() {
        let words = |seconds| super::in_words(std::time::Duration::from_secs(seconds));
        assert_eq!(words(150), "about 3 minutes");
        assert_eq!(words(149), "about 2 minutes");
        assert_eq!(words(5 * 3600 + 1799), "about 5 hours");
        assert_eq!(words(u64::MAX), "about 584542046091 years");
    }

    fn overflow(status: u16, message: &str) -> Option<ContextOverflow> {
        let error = ModelError::Api { model: "m".into(), status, message: message.into() };
        error.context_overflow()
    }

    fn sizes(limit: u64, tokens: u64) -> Option<ContextOverflow> {
        Some(ContextOverflow { limit: Some(limit), tokens: Some(tokens), written: None })
    }

    #[test]
    fn the_apis_refusals_of_a_request_over_the_window_are_read() {
        let openai = "This model's maximum context length is 128000 tokens. However, your \
                      messages resulted in 130512 tokens. Please reduce the length of the messages.";
        assert_eq!(overflow(400, openai), sizes(128_000, 130_512));
        let vllm = "This model's maximum context length is 4096 tokens. However, you requested \
                    5000 tokens (4000 in the messages, 1000 in the completion).";
        assert_eq!(overflow(400, vllm), sizes(4096, 5000));
        let newer = "Input tokens exceed the configured limit of 272,000 tokens. Your messages \
                     resulted in 301,112 tokens. Please reduce the length of the messages.";
        assert_eq!(overflow(400, newer), sizes(272_000, 301_112));
        let anthropic = "prompt is too long: 208432 tokens > 200000 maximum";
        assert_eq!(overflow(400, anthropic), sizes(200_000, 208_432));
        let gemini = "The input token count (1200000) exceeds the maximum number of tokens \
                      allowed (1048576).";
        assert_eq!(overflow(400, gemini), sizes(1_048_576, 1_200_000));
        let llama = "the request exceeds the available context size, try increasing it";
        assert_eq!(overflow(400, llama), Some(ContextOverflow::default()));
        // Other refusals, and the same words under another status, are not overflows.
        assert_eq!(overflow(400, "messages: tool_use ids must be unique"), None);
        assert_eq!(overflow(500, openai), None);
        let rate = ModelError::RateLimited {
            model: "m".into(),
            attempts: 3,
            retry_after: None,
            retry_at: None,
            message: "context length".into(),
        };
        assert_eq!(rate.context_overflow(), None);
    }
}
