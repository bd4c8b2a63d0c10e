//! How a model is configured (`models.<name>` in toolmux's configuration).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Which wire format the model's API speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ApiKind {
    /// OpenAI's chat completions (`POST {baseUrl}/chat/completions`), which most
    /// self-hosted and third-party servers speak too (vLLM, llama.cpp, Ollama, LiteLLM).
    #[default]
    Openai,
    /// Anthropic's messages API (`POST {baseUrl}/v1/messages`).
    Anthropic,
}

/// How the model calls tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ToolCallFormat {
    /// The API's own tool calling (`tools` in the request, calls in the answer).
    #[default]
    Native,
    /// Written in the answer's text as `<tool>{"server_name", "tool_name", "arguments"}</tool>`
    /// blocks, the tools described in the system prompt: for APIs that take no tools.
    Xml,
}

/// One model, under `models` by name.
///
/// Its `Debug` shows neither the API key nor the headers' values.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelConfig {
    /// `openai` (default: any OpenAI-compatible chat completions API) or `anthropic`.
    #[serde(default, rename = "type")]
    pub api: ApiKind,
    /// The model's name at the API (`gpt-4.1-mini`, `claude-sonnet-4-5`).
    pub model: String,
    /// The API's base URL. Default: OpenAI's `https://api.openai.com/v1`, Anthropic's
    /// `https://api.anthropic.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The API key, usually `${OPENAI_API_KEY}` or `${ANTHROPIC_API_KEY}`; never logged.
    /// Optional for servers that need none (a local server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Extra HTTP headers sent with every request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The most tokens to generate per request (default 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature (default: the API's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// How long one request may take, in milliseconds (default 120000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// How many times a rate-limited, overloaded or dropped request is tried again
    /// (default 3), waiting as the API asks (`Retry-After`) or backing off exponentially.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    /// The model's context window in tokens. An agent on this model keeps its conversation
    /// within about 80% of it by replacing its oldest tool results with a note (default:
    /// no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// Whether an agent's requests mark their stable prefix for the API's prompt cache
    /// (default true): Anthropic is sent cache breakpoints on the tools, the system prompt
    /// and the latest turn, so the agent's next turn reads its conversation from the cache.
    /// One-off requests (sampling) are not marked. OpenAI and most compatible servers cache
    /// long prompts by themselves; nothing is sent to them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<bool>,
    /// Whether answers are asked for as a stream (default true) when somebody follows the
    /// agent's output: a person at a terminal (`toolmux agent run`), an `/api/events`
    /// client, a program subscribed to the orchestrator's events. Text and tool call
    /// arguments then arrive as the model writes them. `false` for a server that cannot
    /// stream; one that answers in one piece all the same is read as such.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Whether the model reads images (default true): images that tools return (a
    /// browser's screenshot) are sent to it with their results. `false` for a text-only
    /// model, which reads a placeholder naming each image instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<bool>,
    /// `native` (default): the API's tool calling; `xml`: the model writes its calls in its
    /// text as `<tool>` blocks and reads results in `<tool_result>` blocks, the tools being
    /// described in the system prompt, for a server whose API takes no tools (a local
    /// model without a tool parser). Answers are then not streamed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<ToolCallFormat>,
}

// By hand, so that a configuration logged with `{:?}` does not log its credentials.
impl std::fmt::Debug for ModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<&str> = self.headers.keys().map(String::as_str).collect();
        f.debug_struct("ModelConfig")
            .field("api", &self.api)
            .field("model", &self.model)
            .field("base_url", &self.base_url.as_deref().map(shown_url))
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("headers", &headers)
            .field("max_tokens", &self.max_tokens)
            .field("temperature", &self.temperature)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_retries", &self.max_retries)
            .field("context_window", &self.context_window)
            .field("prompt_cache", &self.prompt_cache)
            .field("stream", &self.stream)
            .field("images", &self.images)
            .field("tool_calls", &self.tool_calls)
            .finish()
    }
}

/// `url` without a password or query, which may carry credentials; as written when it is
/// no URL at all.
fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) => crate::http::url_for_messages(&parsed),
        Err(_) => url.to_owned(),
    }
}
