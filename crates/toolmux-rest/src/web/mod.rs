//! Tools that read the web (`web` in the configuration): `web__fetch` (a page as Markdown
//! or text) and, with `web.search`, `web__search` (Tavily's search API).
//!
//! A fetch reaches only public addresses unless told otherwise: every address a host name
//! resolves to is checked before connecting (and the connection goes to a checked address,
//! so a name cannot resolve one way for the check and another for the request), IP literals
//! are checked as given, and every redirect is checked again. No proxy is used, since a
//! proxy would resolve names where the check cannot see.

mod fetch;
mod html;
mod robots;
mod search;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;
use toolmux_core::{
    CallContext, ToolAnnotations, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec,
};

/// The namespace of the web tools.
pub const WEB_NAMESPACE: &str = "web";

/// The `web` section: tools that read the web.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebConfig {
    /// `web__fetch`: reads a URL as Markdown (web pages) or text. On with the section.
    #[serde(default)]
    pub fetch: FetchConfig,
    /// `web__search`: searches the web through a search API (Tavily). Off without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchConfig>,
}

/// Settings of `web__fetch`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FetchConfig {
    /// Offer `web__fetch` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Reach loopback, private, link-local and other non-public addresses (default false:
    /// a model cannot make toolmux read the local network, cloud metadata or its own
    /// machine's services).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private: bool,
    /// Only these hosts, when given: `example.com`, or `*.example.com` for its subdomains.
    /// A name may be written in Unicode (`bücher.de`) or in its ASCII form
    /// (`xn--bcher-kva.de`): either matches the host however a URL writes it. A refusal
    /// lists the patterns as written here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Never these hosts (same patterns, Unicode names included, or IP addresses such as
    /// `169.254.169.254` and `::1`), redirects included; an address is refused also where a
    /// host name resolves to it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_hosts: Vec<String>,
    /// The most bytes read of one response (default 5 MB); the rest is cut and said so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Characters returned per call when the call gives no `max_length` (default 20000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<usize>,
    /// Time for one fetch, redirects included, in milliseconds (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Redirects followed (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_redirects: Option<usize>,
    /// The `User-Agent` sent (default `toolmux/VERSION (+web fetch for an AI agent)`); its
    /// first word is the product token robots.txt rules are looked up by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// Obey each site's robots.txt (default true): a page its rules disallow for the
    /// user agent's product token (or, without rules for it, for `*`) is not fetched, and
    /// the same group's `Crawl-delay` (up to 30 s) paces fetches from the site.
    /// `false` for sites you may read whatever they say to crawlers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robots_txt: Option<bool>,
}

/// Settings of `web__search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SearchConfig {
    /// The search API (only `tavily` for now).
    #[serde(default)]
    pub provider: SearchProvider,
    /// Its API key, from the environment: `${TAVILY_API_KEY}`.
    pub api_key: String,
    /// Its base URL (default `https://api.tavily.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Results per search when the call gives no `max_results` (default 5, at most 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_results: Option<u32>,
    /// Time for one search, in milliseconds (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// A search API.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SearchProvider {
    /// Tavily's `POST /search`.
    #[default]
    Tavily,
}

/// The web tools as a [`ToolProvider`] (namespace `web`).
pub struct WebProvider {
    fetcher: Option<Arc<fetch::Fetcher>>,
    searcher: Option<Arc<search::Searcher>>,
    specs: Vec<ToolSpec>,
    /// What a fetch's error and a search's answer or error must not show, in every form it
    /// takes on the wire: the search service's key and the values
    /// [`WebProvider::with_secrets`] gave.
    secrets: Arc<[String]>,
}

/// Names the tools, without the secrets the provider keeps.
impl std::fmt::Debug for WebProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebProvider")
            .field("fetcher", &self.fetcher)
            .field("searcher", &self.searcher)
            .field("specs", &self.specs.iter().map(|s| &s.name).collect::<Vec<_>>())
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

impl WebProvider {
    /// The tools `config` turns on; fails on a setting that cannot work (a bad host
    /// pattern, a search URL that is not one).
    pub fn new(config: &WebConfig) -> Result<WebProvider, String> {
        let fetcher = match config.fetch.enabled {
            Some(false) => None,
            _ => Some(Arc::new(fetch::Fetcher::new(&config.fetch)?)),
        };
        let searcher = match &config.search {
            Some(search) => Some(Arc::new(search::Searcher::new(search)?)),
            None => None,
        };
        let mut specs = Vec::new();
        if let Some(fetcher) = &fetcher {
            specs.push(fetch_spec(fetcher.default_length()));
        }
        if searcher.is_some() {
            specs.push(search_spec());
        }
        let secrets = match &config.search {
            Some(search) => crate::secrets::forms_of([search.api_key.trim()]),
            None => Vec::new(),
        };
        Ok(WebProvider { fetcher, searcher, specs, secrets: secrets.into() })
    }

    /// Values to keep out of what the tools show, such as those the loader took from the
    /// environment: an error page echoing one has it redacted, before it is cut to its
    /// excerpt, as [`crate::RestProvider::with_secrets`] does for REST tools.
    pub fn with_secrets<I, S>(mut self, values: I) -> WebProvider
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut known = self.secrets.to_vec();
        known.extend(crate::secrets::forms_of(values));
        known.sort();
        known.dedup();
        self.secrets = known.into();
        self
    }
}

fn read_only_open_world() -> ToolAnnotations {
    ToolAnnotations {
        read_only: true,
        destructive: false,
        idempotent: true,
        open_world: true,
        ..ToolAnnotations::default()
    }
}

fn fetch_spec(default_length: usize) -> ToolSpec {
    let description = format!(
        "Fetch a URL from the internet and read it: a web page comes back as Markdown (its \
         main content, links kept), other text as it is. Long content comes in pages of \
         `max_length` characters (default {default_length}); call again with the \
         `start_index` the footer gives to read on. `raw: true` returns a page's HTML as it \
         is. Only http and https; local and private network addresses are refused."
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "url": {"type": "string", "format": "uri", "description": "The URL to fetch (http or https)."},
            "max_length": {"type": "integer", "minimum": 1, "maximum": 1_000_000,
                "description": format!("Characters to return at most (default {default_length}).")},
            "start_index": {"type": "integer", "minimum": 0,
                "description": "Start at this character, to read on after a cut (default 0)."},
            "raw": {"type": "boolean",
                "description": "Return a web page's HTML instead of Markdown (default false)."}
        },
        "required": ["url"],
        "additionalProperties": false
    });
    ToolSpec::new("fetch", description, schema).with_annotations(read_only_open_world())
}

fn search_spec() -> ToolSpec {
    let schema = json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "description": "What to search for."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 20,
                "description": "Results to return (default 5)."},
            "topic": {"type": "string", "enum": ["general", "news", "finance"],
                "description": "The kind of search (default general)."},
            "time_range": {"type": "string", "enum": ["day", "week", "month", "year"],
                "description": "Only results from this recent period."},
            "include_domains": {"type": "array", "items": {"type": "string"},
                "description": "Only results from these domains."},
            "exclude_domains": {"type": "array", "items": {"type": "string"},
                "description": "No results from these domains."}
        },
        "required": ["query"],
        "additionalProperties": false
    });
    ToolSpec::new(
        "search",
        "Search the web. Returns the most relevant results, each with its title, URL and an \
         excerpt, and a short answer when the search service gives one. Read a result in full \
         with `web__fetch`.",
        schema,
    )
    .with_annotations(read_only_open_world())
}

#[async_trait]
impl ToolProvider for WebProvider {
    fn kind(&self) -> ToolKind {
        ToolKind::Builtin
    }

    fn namespace(&self) -> &str {
        WEB_NAMESPACE
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(self.specs.clone())
    }

    async fn has_tool(&self, name: &str) -> bool {
        self.specs.iter().any(|spec| spec.name == name)
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let full = format!("{WEB_NAMESPACE}__{name}");
        let work = async {
            match (name, &self.fetcher, &self.searcher) {
                ("fetch", Some(fetcher), _) => {
                    fetcher.call(&full, &arguments, &self.secrets, ctx).await
                }
                ("search", _, Some(searcher)) => {
                    searcher.call(&full, &arguments, &self.secrets, ctx).await
                }
                _ => Err(ToolError::UnknownTool {
                    name: name.to_owned(),
                    suggestions: self.specs.iter().map(|s| s.name.clone()).collect(),
                }),
            }
        };
        tokio::select! {
            () = ctx.cancel_token().cancelled() => Err(ToolError::Cancelled { tool: full }),
            result = work => result,
        }
    }
}

/// A string argument, or why not.
fn text_argument<'a>(tool: &str, arguments: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    arguments.get(key).and_then(Value::as_str).ok_or_else(|| {
        ToolError::invalid_arguments(tool, format!("`{key}` is missing or not a string"))
    })
}

/// An error's message followed by those of its causes, since reqwest's own says only
/// "error sending request" and leaves why (connection refused, a TLS failure) to its chain.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// Whether `host` matches a pattern: `example.com` exactly, `*.example.com` its
/// subdomains; letter case ignored.
fn host_matches(host: &str, pattern: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let pattern = pattern.trim_end_matches('.').to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(domain) => host.len() > domain.len() + 1 && host.ends_with(&format!(".{domain}")),
        None => host == pattern,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        assert!(host_matches("Example.COM", "example.com"));
        assert!(!host_matches("www.example.com", "example.com"));
        assert!(host_matches("www.example.com", "*.example.com"));
        assert!(host_matches("a.b.example.com.", "*.example.com"));
        assert!(!host_matches("example.com", "*.example.com"));
        assert!(!host_matches("badexample.com", "*.example.com"));
    }
}
