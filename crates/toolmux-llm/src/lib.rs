//! Model clients for toolmux agents.
//!
//! An agent asks a [`Model`] for its next step: the conversation so far ([`Message`]s), the
//! tools it may call ([`ToolDefinition`]s) and a system prompt go in a [`ModelRequest`]; the
//! [`ModelResponse`] carries text, tool calls, why the model stopped and the tokens used.
//! The vocabulary is the same for every API; each client fits it to its own wire format.
//!
//! This crate defines the vocabulary and the [`Model`] trait; the HTTP clients for
//! OpenAI-compatible chat completions and Anthropic's messages API are built from a
//! [`ModelConfig`] by [`connect`].
//!
//! ```
//! use toolmux_llm::{Message, ModelRequest, ToolDefinition};
//! use serde_json::json;
//!
//! let request = ModelRequest::new(vec![Message::user("What is in README.md?")])
//!     .with_system("You answer from the files of the workspace.")
//!     .with_tools(vec![ToolDefinition::new(
//!         "fs__read",
//!         "Reads a file",
//!         json!({"type": "object", "properties": {"path": {"type": "string"}}}),
//!     )]);
//! assert_eq!(request.tools.len(), 1);
//! ```

#![deny(missing_docs)]

mod anthropic;
mod config;
mod error;
mod http;
mod message;
mod openai;
mod sampling;
mod text_tools;

pub use config::{ApiKind, ModelConfig, ToolCallFormat};
pub use error::{ContextOverflow, ModelError, STREAM_TIMEOUT_FACTOR, TimeoutKind};
pub use message::{
    DeltaSink, IMAGE_MEDIA_TYPES, ImagePart, Message, ModelDelta, ModelRequest, ModelResponse,
    ModelToolCall, ProviderBlocks, Reasoning, StopReason, ToolChoice, ToolDefinition,
    ToolResultMessage, Usage,
};
pub use sampling::{ModelSampler, sampling_request, sampling_response};
pub use text_tools::TextToolCalls;

use async_trait::async_trait;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// OpenAI's API, the default `baseUrl` of `"type": "openai"`.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
/// Anthropic's API, the default `baseUrl` of `"type": "anthropic"`.
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The most tokens generated per request when the configuration does not say.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// How long one request may take when the configuration does not say, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;
/// How many times a request is tried again when the configuration does not say.
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// How many times an Anthropic answer is continued after the API paused it (`pause_turn`,
/// which its server tools, web search or code execution, give when a turn runs long)
/// before it fails as [`ModelError::Stopped`]. A long turn pauses once or twice; one that
/// kept pausing would cost a request each time without end.
pub const MAX_CONTINUATIONS: u32 = 8;

/// A model an agent can ask for its next step.
///
/// Implementations retry what is worth retrying (rate limits, overloaded servers, dropped
/// connections) within their own limits, honour `cancel` at every wait, and report the rest
/// as a [`ModelError`] that says what went wrong and what to change.
#[async_trait]
pub trait Model: Send + Sync + fmt::Debug {
    /// The configured name of this model (`fast`, `claude`), for messages and accounting.
    fn name(&self) -> &str;

    /// The model's context window in tokens, when known: agents keep their conversation
    /// within it.
    fn context_window(&self) -> Option<u64> {
        None
    }

    /// The most tokens an answer may have when the request does not say
    /// ([`ModelRequest::max_tokens`]), when known: agents leave that much of the window to
    /// the answer when an answer was cut at it.
    fn max_output_tokens(&self) -> Option<u64> {
        None
    }

    /// One completion of `request`.
    async fn complete(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, ModelError>;

    /// One completion of `request`, its text and tool calls handed to `on_delta` as the
    /// model writes them; the answer is the same as [`Model::complete`]'s.
    ///
    /// The HTTP clients ask the API for a streamed answer (unless the model is configured
    /// with `stream: false`); a server that answers in one piece all the same is read as
    /// such. This default completes the request and hands over the whole answer as deltas
    /// (its text, then each call), so that a caller may rely on deltas from any model.
    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let answer = self.complete(request, cancel).await?;
        replay(&answer, on_delta);
        Ok(answer)
    }
}

/// `answer` handed to `on_delta` in one piece: its text, then each call and its arguments.
pub(crate) fn replay(answer: &ModelResponse, on_delta: DeltaSink<'_>) {
    if !answer.content.is_empty() {
        on_delta(ModelDelta::Text(&answer.content));
    }
    for (index, call) in answer.tool_calls.iter().enumerate() {
        on_delta(ModelDelta::ToolCall { index, id: &call.id, name: &call.name });
        let arguments = match &call.raw_arguments {
            Some(raw) => raw.clone(),
            None => call.arguments.to_string(),
        };
        on_delta(ModelDelta::ToolArguments { index, fragment: &arguments });
    }
}

/// Headers the APIs define whose values are no credentials, and are worth reading in an
/// error that names them (`Unexpected value for anthropic-beta: …`).
const PLAIN_HEADERS: [&str; 5] =
    ["anthropic-version", "anthropic-beta", "openai-organization", "openai-project", "accept"];

/// What an error must never show: the API key, and the values of the configured headers
/// (where `${VAR}` puts a key the API takes in a header of its own, as Azure's `api-key`)
/// and the credential after an `Authorization` scheme, longest first so that a value is
/// scrubbed whole before a part of it. Header values shorter than 8 characters are no
/// secret worth hiding and would scrub common words.
fn secrets(api_key: Option<&str>, headers: &BTreeMap<String, String>) -> Vec<String> {
    let mut secrets = Vec::new();
    for (name, value) in headers {
        if PLAIN_HEADERS.iter().any(|plain| name.eq_ignore_ascii_case(plain)) {
            continue;
        }
        let value = value.trim();
        secrets.push(value.to_owned());
        if let Some((_scheme, credential)) = value.split_once(' ') {
            secrets.push(credential.trim().to_owned());
        }
    }
    secrets.retain(|s| s.len() >= 8);
    secrets.extend(api_key.map(str::to_owned));
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

/// The client of the model configured as `name` (`models.<name>`), speaking the API that
/// `config.api` names.
///
/// Nothing is sent yet; a configuration that cannot work (no `model`, a `baseUrl` that is
/// not an http(s) URL, a header that cannot be sent) is a [`ModelError::Config`].
///
/// ```
/// use toolmux_llm::{ApiKind, ModelConfig};
///
/// let config = ModelConfig {
///     api: ApiKind::Anthropic,
///     model: "claude-sonnet-4-5".into(),
///     api_key: Some("sk-ant-example".into()),
///     ..ModelConfig::default()
/// };
/// let model = toolmux_llm::connect("claude", &config).unwrap();
/// assert_eq!(model.name(), "claude");
/// assert!(!format!("{model:?}").contains("sk-ant-example"));
/// ```
pub fn connect(name: &str, config: &ModelConfig) -> Result<Arc<dyn Model>, ModelError> {
    let error = |message: String| ModelError::Config { model: name.to_owned(), message };
    if config.model.trim().is_empty() {
        return Err(error(
            "`model` is empty: give the model's name at the API (`gpt-4.1-mini`, `claude-sonnet-4-5`)"
                .into(),
        ));
    }
    // An empty key is what `${OPENAI_API_KEY}` gives when the variable is unset; a local
    // server needs none, and a remote one answers 401 with its own explanation.
    let api_key = config.api_key.as_deref().filter(|k| !k.is_empty());
    let (base, suffix) = match config.api {
        ApiKind::Openai => (OPENAI_BASE_URL, "/chat/completions"),
        ApiKind::Anthropic => (ANTHROPIC_BASE_URL, "/v1/messages"),
    };
    let base = config.base_url.as_deref().unwrap_or(base);
    let mut url = reqwest::Url::parse(base).map_err(|e| {
        let shown = match api_key {
            Some(key) => base.replace(key, "[redacted]"),
            None => base.to_owned(),
        };
        error(format!("`baseUrl` `{shown}` is not a URL ({e})"))
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(error(format!(
            "`baseUrl` `{}` is not an http or https URL",
            http::url_for_messages(&url)
        )));
    }
    // The base may end with `/` or not; a query (`?api-version=…`) stays after the path.
    // Anthropic's base is the host: a base ending in `/v1` (as OpenAI's are written) would
    // post to `/v1/v1/messages`.
    let trimmed = url.path().trim_end_matches('/');
    let trimmed = match config.api {
        ApiKind::Anthropic => trimmed.strip_suffix("/v1").unwrap_or(trimmed),
        ApiKind::Openai => trimmed,
    };
    let path = format!("{trimmed}{suffix}");
    url.set_path(&path);

    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let key_value = |prefix: &str, key: &str| {
        let mut value = HeaderValue::from_str(&format!("{prefix}{key}")).map_err(|_| {
            error("the API key is not a valid header value (a line break or a control character in it?)".into())
        })?;
        value.set_sensitive(true);
        Ok::<_, ModelError>(value)
    };
    match config.api {
        ApiKind::Openai => {
            if let Some(key) = api_key {
                headers.insert(AUTHORIZATION, key_value("Bearer ", key)?);
            }
        }
        ApiKind::Anthropic => {
            if let Some(key) = api_key {
                headers.insert("x-api-key", key_value("", key)?);
            }
            headers.insert("anthropic-version", HeaderValue::from_static(anthropic::API_VERSION));
        }
    }
    // Extra headers come last, so that they may replace the defaults (a newer
    // `anthropic-version`, say). Their values may be credentials too.
    for (header, value) in &config.headers {
        let header_name = HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| error(format!("`headers`: `{header}` is not a valid header name")))?;
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            error(format!("`headers`: the value of `{header}` is not a valid header value"))
        })?;
        value.set_sensitive(true);
        headers.insert(header_name, value);
    }

    let timeout_ms = config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if timeout_ms == 0 {
        return Err(error("`timeoutMs` is 0: every request would time out".into()));
    }
    // reqwest is built without a default crypto provider; install ring's once per process.
    // Another crate may have installed one first, which is just as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        // A redirected POST becomes a GET (301, 302) and may carry the key elsewhere: an
        // API is called at its own address, and a redirect is reported.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("toolmux/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| error(format!("cannot build the HTTP client: {e}")))?;
    let endpoint = http::Endpoint {
        name: name.to_owned(),
        model: config.model.clone(),
        client,
        url,
        headers,
        secrets: secrets(api_key, &config.headers),
        timeout: Duration::from_millis(timeout_ms),
        max_retries: config.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
        context_window: config.context_window,
        stream: config.stream.unwrap_or(true),
    };
    let max_tokens = config.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let temperature = config.temperature;
    let images = config.images.unwrap_or(true);
    let model: Arc<dyn Model> = match config.api {
        ApiKind::Openai => Arc::new(openai::OpenAiModel {
            completion_tokens: std::sync::atomic::AtomicBool::new(openai::wants_completion_tokens(
                &endpoint.url,
            )),
            endpoint,
            max_tokens,
            temperature,
            images,
            stream_options: std::sync::atomic::AtomicBool::new(true),
        }),
        ApiKind::Anthropic => {
            let prompt_cache = config.prompt_cache.unwrap_or(true);
            Arc::new(anthropic::AnthropicModel {
                endpoint,
                max_tokens,
                temperature,
                prompt_cache,
                images,
            })
        }
    };
    Ok(match config.tool_calls.unwrap_or_default() {
        ToolCallFormat::Native => model,
        ToolCallFormat::Xml => Arc::new(TextToolCalls::new(model)),
    })
}
