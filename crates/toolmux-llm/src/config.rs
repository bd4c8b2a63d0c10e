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

/// One model, under `models` by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// The model's context window in tokens, for the agent's context budget (default:
    /// none, no budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}
