//! `web__search`: Tavily's search API (`POST {url}/search`, the key as a bearer token).

use super::{SearchConfig, SearchProvider, text_argument, with_causes};
use crate::secrets::scrub;
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::time::Duration;
use toolmux_core::{CallContext, ToolError, ToolOutput};

const DEFAULT_URL: &str = "https://api.tavily.com";
const DEFAULT_MAX_RESULTS: u32 = 5;
const MOST_RESULTS: u64 = 20;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The most bytes of an answer read.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Characters of one result's excerpt shown at most.
const EXCERPT_CHARS: usize = 1200;

/// `web__search`'s client and settings. The key never appears in its `Debug` output.
pub(crate) struct Searcher {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    api_key: String,
    max_results: u32,
    timeout: Duration,
}

impl std::fmt::Debug for Searcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Searcher")
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

/// Tavily's answer, the parts used.
#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(default)]
    answer: Option<String>,
    #[serde(default)]
    results: Vec<Hit>,
}

#[derive(Debug, Deserialize)]
struct Hit {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    content: String,
    #[serde(default)]
    published_date: Option<String>,
}

impl Searcher {
    pub(crate) fn new(config: &SearchConfig) -> Result<Searcher, String> {
        let SearchProvider::Tavily = config.provider;
        if config.api_key.trim().is_empty() {
            return Err("web.search.apiKey is empty: give the key, as `${TAVILY_API_KEY}`".into());
        }
        let base = config.url.as_deref().unwrap_or(DEFAULT_URL);
        let endpoint = reqwest::Url::parse(&format!("{}/search", base.trim_end_matches('/')))
            .map_err(|e| format!("web.search.url `{base}` is not a URL: {e}"))?;
        if !matches!(endpoint.scheme(), "http" | "https") {
            return Err(format!("web.search.url `{base}` is not an http or https URL"));
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            // The key goes in a header: never follow a redirect with it.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("toolmux/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("web.search: cannot build the HTTP client: {e}"))?;
        Ok(Searcher {
            client,
            endpoint,
            api_key: config.api_key.clone(),
            max_results: config.max_results.unwrap_or(DEFAULT_MAX_RESULTS).clamp(1, 20),
            timeout: config.timeout_ms.map_or(DEFAULT_TIMEOUT, Duration::from_millis),
        })
    }

    /// Searches for what `arguments` ask, within `timeoutMs` and the call's deadline;
    /// `secrets` (the key among them) are kept out of what it returns, an answer or an
    /// error, however the search API echoes them.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: &Value,
        secrets: &[String],
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let query = text_argument(tool, arguments, "query")?.trim();
        if query.is_empty() {
            return Err(ToolError::invalid_arguments(
                tool,
                "`query` is empty: say what to search for",
            ));
        }
        let max_results = arguments
            .get("max_results")
            .and_then(Value::as_u64)
            .map_or(u64::from(self.max_results), |n| n.clamp(1, MOST_RESULTS));
        let mut body = json!({
            "query": query,
            "max_results": max_results,
            "search_depth": "basic",
            "include_answer": true,
        });
        for key in ["topic", "time_range", "include_domains", "exclude_domains"] {
            if let Some(value) = arguments.get(key).filter(|v| !v.is_null()) {
                body[key] = value.clone();
            }
        }
        let mut limit = self.timeout;
        if let Some(deadline) = ctx.deadline() {
            limit = limit.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        }
        let text = tokio::time::timeout(limit, self.post(tool, &body, secrets)).await.map_err(
            |_| ToolError::Timeout { tool: tool.to_owned(), after: limit, idle: None },
        )??;
        let failed = |message: String| ToolError::remote(tool, message);
        let mut answer: Answer = serde_json::from_str(&text).map_err(|e| {
            failed(format!("the search API's answer is not what Tavily sends: {e}"))
        })?;
        answer.scrub(secrets);
        Ok(render(query, &answer))
    }

    /// Sends `body` and reads the answer: its text when it is a success, else the error
    /// saying what the search API answered.
    async fn post(
        &self,
        tool: &str,
        body: &Value,
        secrets: &[String],
    ) -> Result<String, ToolError> {
        let failed = |message: String| ToolError::remote(tool, message);
        let request = self
            .client
            .post(self.endpoint.clone())
            .bearer_auth(&self.api_key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(body).unwrap_or_default())
            .send();
        let response = request.await.map_err(|e| {
            failed(format!(
                "the search API at {} cannot be reached: {}",
                self.endpoint.origin().ascii_serialization(),
                scrub(&with_causes(&e.without_url()), secrets)
            ))
        })?;
        let status = response.status();
        let mut bytes = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                failed(format!(
                    "the search API's answer could not be read: {}",
                    scrub(&with_causes(&e.without_url()), secrets)
                ))
            })?;
            let room = MAX_ANSWER_BYTES - bytes.len();
            if chunk.len() > room {
                if status.is_success() {
                    return Err(failed(format!(
                        "the search API's answer is longer than {} MiB, the most read of one",
                        MAX_ANSWER_BYTES / (1024 * 1024)
                    )));
                }
                // A refusal is shown only as an excerpt: its head is enough.
                bytes.extend_from_slice(&chunk[..room]);
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&bytes);
        if !status.is_success() {
            // Redacted before it is cut: cut first, a secret at the cut would lose its
            // tail and go out unrecognized.
            let detail: String = scrub(&text, secrets).chars().take(400).collect();
            let hint = match status.as_u16() {
                401 | 403 => ": check `web.search.apiKey`",
                429 => ": too many searches for now, or the plan's limit is reached",
                _ => "",
            };
            return Err(failed(format!(
                "the search API answered {status}{hint}{}",
                if detail.trim().is_empty() {
                    String::new()
                } else {
                    format!(" ({})", detail.trim())
                }
            )));
        }
        Ok(text.into_owned())
    }
}

impl Answer {
    /// Replaces `secrets` in every text shown, before any of it is cut to an excerpt.
    fn scrub(&mut self, secrets: &[String]) {
        if let Some(summary) = self.answer.as_mut() {
            *summary = scrub(summary, secrets);
        }
        for hit in &mut self.results {
            for text in [&mut hit.title, &mut hit.url, &mut hit.content] {
                *text = scrub(text, secrets);
            }
            if let Some(date) = hit.published_date.as_mut() {
                *date = scrub(date, secrets);
            }
        }
    }
}

fn render(query: &str, answer: &Answer) -> ToolOutput {
    let mut out = String::new();
    if let Some(summary) = answer.answer.as_deref().filter(|a| !a.trim().is_empty()) {
        let _ = writeln!(out, "Answer: {}\n", summary.trim());
    }
    if answer.results.is_empty() {
        let _ = write!(out, "No results for `{query}`.");
    }
    for (index, hit) in answer.results.iter().enumerate() {
        let excerpt: String = hit.content.split_whitespace().collect::<Vec<_>>().join(" ");
        let mut excerpt: String = excerpt.chars().take(EXCERPT_CHARS).collect();
        if hit.content.chars().count() > EXCERPT_CHARS {
            excerpt.push_str(" …");
        }
        let date = hit.published_date.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        let _ = writeln!(
            out,
            "{}. {}{date}\n   {}\n   {excerpt}\n",
            index + 1,
            hit.title.trim(),
            hit.url
        );
    }
    let listed: Vec<Value> =
        answer.results.iter().map(|hit| json!({"title": hit.title, "url": hit.url})).collect();
    ToolOutput::text(out.trim_end().to_owned()).with_extra("results", json!(listed))
}
