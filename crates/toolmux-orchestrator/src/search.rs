//! Tool search: tools that are not listed (deferred, [`OrchestratorConfig::deferred`]) are
//! found by words and then called, so that a server of hundreds of tools (an OpenAPI
//! import of a large API, say) does not fill every request's context with their schemas.
//!
//! [`ToolSearch`] offers `tools__search` (words in, the best matching deferred tools out,
//! with their input schemas) and `tools__call` (a found tool by name, with its arguments,
//! through the whole pipeline) to any caller, MCP clients of the gateway included. Agents
//! call found tools directly: their session offers each tool a search returned from the
//! next turn on.
//!
//! [`OrchestratorConfig::deferred`]: crate::OrchestratorConfig::deferred

use crate::orchestrator::{Orchestrator, WeakOrchestrator};
use crate::registry::ToolEntry;
use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::RwLock;
use toolmux_core::{
    CallContext, ToolAnnotations, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec,
};

/// The namespace of the search tools.
pub const NAMESPACE: &str = "tools";
/// The search tool's full name.
pub const SEARCH: &str = "tools__search";
/// The call tool's full name.
pub const CALL: &str = "tools__call";
/// Tools one search returns unless asked for fewer or more.
pub const DEFAULT_RESULTS: usize = 5;
/// Tools one search returns at most.
pub const MAX_RESULTS: usize = 20;

/// The input schema of `tools__search`.
pub fn search_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "description": "What the tool should do, in a few words (`create invoice`, `list open pull requests`), or part of its name.",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_RESULTS,
                "description": format!("How many tools to return at most (default {DEFAULT_RESULTS})."),
            },
        },
        "required": ["query"],
        "additionalProperties": false,
    })
}

/// `tools__search`'s description, naming how found tools are called.
fn search_description(how_to_call: &str) -> String {
    format!(
        "Finds tools that are not listed because there are many of them: describe what you \
         need in a few words and get the best matching tools with their input schemas. \
         {how_to_call}"
    )
}

/// The spec of `tools__search` for a session that offers found tools directly (an agent's).
pub fn search_spec_for_sessions() -> ToolSpec {
    ToolSpec::new(
        SEARCH,
        search_description("The tools found can be called directly from your next step on."),
        search_schema(),
    )
    .with_annotations(ToolAnnotations { open_world: false, ..ToolAnnotations::read_only() })
}

/// The query's words: lowercase, letters and digits.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Whether a query word matches a word of the tool: the same; the query's word begins
/// the tool's (`repo`, `repos`), when it is 3 letters or more; or the tool's word is the
/// query's without an ending (`invoice`, `invoices`; `charge`, `charged`): 4 letters or
/// more, at most 3 fewer.
fn matches(term: &str, word: &str) -> bool {
    term == word
        || (term.len() >= 3 && word.starts_with(term))
        || (word.len() >= 4 && term.len() <= word.len() + 3 && term.starts_with(word))
}

/// How well `entry` answers the query `terms`: each word found in the tool's name counts
/// 3, in its parameters' names 2, in its description 1; 0 is no match.
pub(crate) fn score(terms: &[String], entry: &ToolEntry) -> u32 {
    let name = words(&entry.name);
    let description = words(&entry.spec.description);
    let parameters: Vec<String> = entry
        .spec
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().flat_map(|k| words(k)).collect())
        .unwrap_or_default();
    let whole = entry.name.to_lowercase();
    terms
        .iter()
        .map(|term| {
            let in_name = name.iter().any(|w| matches(term, w))
                || (term.len() >= 3 && whole.contains(term.as_str()));
            let in_parameters = parameters.iter().any(|w| matches(term, w));
            let in_description = description.iter().any(|w| matches(term, w));
            3 * u32::from(in_name) + 2 * u32::from(in_parameters) + u32::from(in_description)
        })
        .sum()
}

impl Orchestrator {
    /// The deferred tools that best match `query`, at most `limit`, of those `allowed`
    /// lets through and no rule denies, best first (ties by name), each with its
    /// model-facing name and shown.
    /// A query that is a tool's exact name finds that tool first.
    pub fn search_tools(
        &self,
        query: &str,
        limit: usize,
        allowed: &dyn Fn(&str) -> bool,
    ) -> Vec<ToolSpec> {
        let terms = words(query);
        let exact = query.trim();
        let registry = self.registry();
        let mut found: Vec<(u32, &ToolEntry)> = registry
            .entries()
            // A tool that may never run is not worth finding, nor is one its provider hides.
            .filter(|e| {
                is_deferred(e)
                    && !matches!(e.permission, crate::Permission::Deny(_))
                    && allowed(&e.name)
            })
            .filter_map(|e| {
                let score = if &*e.name == exact { u32::MAX } else { score(&terms, e) };
                (score > 0).then_some((score, &**e))
            })
            .collect();
        found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
        found
            .into_iter()
            .take(limit.clamp(1, MAX_RESULTS))
            .map(|(_, e)| {
                let mut spec = ToolSpec { name: e.name.to_string(), ..e.spec.clone() };
                spec.annotations.visible = true;
                spec
            })
            .collect()
    }

    /// Whether any tool `allowed` lets through is deferred (found only by searching).
    pub fn has_deferred(&self, allowed: &dyn Fn(&str) -> bool) -> bool {
        self.registry().entries().any(|e| is_deferred(e) && allowed(&e.name))
    }
}

/// Whether `entry` is found by searching: deferred, and shown to models by its provider.
fn is_deferred(entry: &ToolEntry) -> bool {
    entry.deferred && entry.spec.annotations.visible
}

/// What a search found, for the model: each tool's name, description and input schema.
pub fn found_text(query: &str, found: &[ToolSpec], how_to_call: &str) -> String {
    if found.is_empty() {
        return format!(
            "No tool matches `{query}`. Try other words: what the tool does (`send email`), \
             the thing it works on (`invoice`), or part of its name."
        );
    }
    let tools: Vec<Value> = found
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "inputSchema": *t.input_schema}))
        .collect();
    let listed = serde_json::to_string_pretty(&tools).unwrap_or_default();
    format!("{} tool(s) found; {how_to_call}\n{listed}", found.len())
}

/// The provider of `tools__search` and `tools__call`; see the module documentation.
#[derive(Debug, Default)]
pub struct ToolSearch {
    orchestrator: RwLock<WeakOrchestrator>,
}

impl ToolSearch {
    /// A provider to register, then [`ToolSearch::attach`] to the orchestrator built.
    pub fn new() -> Self {
        ToolSearch::default()
    }

    /// Searches and calls through `orchestrator` (without keeping it alive).
    pub fn attach(&self, orchestrator: &Orchestrator) {
        *self.orchestrator.write().unwrap_or_else(|e| e.into_inner()) = orchestrator.downgrade();
    }

    fn orchestrator(&self) -> Result<Orchestrator, ToolError> {
        self.orchestrator.read().unwrap_or_else(|e| e.into_inner()).upgrade().ok_or_else(|| {
            ToolError::Unavailable {
                provider: NAMESPACE.into(),
                message: "the orchestrator is gone".into(),
            }
        })
    }
}

const HOW_TO_CALL: &str =
    "call one with `tools__call` and `{\"name\": ..., \"arguments\": {...}}`.";

#[async_trait]
impl ToolProvider for ToolSearch {
    fn kind(&self) -> ToolKind {
        ToolKind::Internal
    }

    fn namespace(&self) -> &str {
        NAMESPACE
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        let search = ToolSpec::new(
            "search",
            search_description(
                "Call a tool found with `tools__call`, giving its `name` and its `arguments`.",
            ),
            search_schema(),
        )
        .with_annotations(ToolAnnotations { open_world: false, ..ToolAnnotations::read_only() });
        let call = ToolSpec::new(
            "call",
            "Calls a tool found with `tools__search`: its `name` as found, and its `arguments` \
             as its input schema says.",
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The tool's name, as `tools__search` gave it."},
                    "arguments": {"type": "object", "description": "The tool's arguments."},
                },
                "required": ["name"],
                "additionalProperties": false,
            }),
        )
        // What the called tool does is not known here.
        .with_annotations(ToolAnnotations { open_world: true, ..ToolAnnotations::default() });
        Ok(vec![search, call])
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let orchestrator = self.orchestrator()?;
        match name {
            "search" => Ok(search_output(&orchestrator, &arguments, &|_| true)),
            "call" => {
                let Some(tool) = arguments.get("name").and_then(Value::as_str) else {
                    return Ok(ToolOutput::error(
                        "give the `name` of a tool found with `tools__search`",
                    ));
                };
                if tool.starts_with(&format!("{NAMESPACE}__")) {
                    return Ok(ToolOutput::error(format!(
                        "`{tool}` is not called through `tools__call`: call it directly"
                    )));
                }
                let inner = arguments.get("arguments").cloned().unwrap_or_else(|| json!({}));
                // The whole pipeline again, for the tool called: its permissions,
                // validation, queue, timeout, cap and accounting.
                ToolProvider::call(&orchestrator, tool, inner, &ctx.child()).await
            }
            other => Err(ToolError::UnknownTool {
                name: crate::suggest::echoed(other),
                suggestions: Vec::new(),
            }),
        }
    }
}

/// What `tools__search` answers to `arguments`: the deferred tools `allow` lets the caller
/// see that match, best first (a view's search finds only what is in view).
pub(crate) fn search_output(
    orchestrator: &Orchestrator,
    arguments: &Value,
    allow: &dyn Fn(&str) -> bool,
) -> ToolOutput {
    let query = arguments.get("query").and_then(Value::as_str).unwrap_or_default();
    let limit = arguments
        .get("limit")
        .and_then(Value::as_u64)
        .map_or(DEFAULT_RESULTS, |l| usize::try_from(l).unwrap_or(MAX_RESULTS));
    let found = orchestrator.search_tools(query, limit, allow);
    let names: Vec<&str> = found.iter().map(|t| t.name.as_str()).collect();
    ToolOutput::text(found_text(query, &found, HOW_TO_CALL)).with_extra("found", json!(names))
}
