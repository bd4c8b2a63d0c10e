//! How agents are configured (`agents.<name>` and `router` in toolmux's configuration).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Turns an agent may take when its configuration names no limit.
pub const DEFAULT_MAX_TURNS: u32 = 25;

/// How deep agents may call agents when nothing else is configured: a top-level agent
/// (depth 1) may call a sub-agent (2), which may call one more (3).
pub const DEFAULT_MAX_DEPTH: usize = 3;

/// Turns in a row an agent may call one tool with the same arguments when its
/// configuration names no limit (`maxRepeats`).
pub const DEFAULT_MAX_REPEATS: u32 = 5;

/// Tool calls one model turn may make when the agent's configuration names no limit
/// (`maxCallsPerTurn`).
pub const DEFAULT_MAX_CALLS_PER_TURN: u32 = 64;

/// Tokens of its earlier cycles' conversation a listening agent carries into its next cycle
/// when neither its configuration (`listenHistoryTokens`) nor its model's context window
/// says more.
pub(crate) const DEFAULT_LISTEN_HISTORY_TOKENS: u64 = 16_000;

/// Hand-offs one run may make before it is stopped, so that two agents cannot pass a task
/// back and forth for ever.
pub const MAX_HANDOFFS: usize = 8;

/// One agent, under `agents` by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// What the agent is for: the description of its tool `agent__{name}` when another agent
    /// or an MCP client may call it.
    #[serde(default)]
    pub description: String,
    /// The model it thinks with: a name under `models`. Without one, an agent called by
    /// another thinks with its caller's model (the seeds' inherited configuration); one
    /// that nobody calls must name it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Its system prompt.
    #[serde(default, alias = "systemPrompt")]
    pub instructions: String,
    /// The tools it may call, as glob patterns over the orchestrator's tool names
    /// (`fs__*`, `github__search_*`) or selectors of what tools are, as in `permissions`
    /// (`@read`: a reviewer that changes nothing). Default: every tool except other agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Other agents it may delegate to, offered to it as tools `agent__{name}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
    /// The most model turns before it must report (default 25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Tokens (read and written, its sub-agents' and its tools' sampling included) the
    /// agent may use on a task; once they are spent, its next turn is its last and it may
    /// only report. The agents it calls work within what it has left, side by side sharing
    /// it. Default: no budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// Offer `agent__task_status`, with which the model records its progress (reported to
    /// the caller as progress notifications).
    #[serde(default)]
    pub task_status: bool,
    /// Offer `agent__batch`, which runs several tool calls at once in one turn.
    #[serde(default)]
    pub batch: bool,
    /// The priority of the agent's tool calls in the queues they wait in (default: its
    /// caller's, 0 for a run started by a person): an interactive agent's calls may go
    /// ahead of a batch agent's waiting for the same server. Added to each tool's own
    /// (`tools.NAME.priority`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Offer `agent__ask_user`, with which the model asks the person running it a question.
    /// Without a person to ask (a sub-agent, a non-interactive run) the run ends with
    /// status `needs_input` and the question as its content.
    #[serde(default)]
    pub ask_user: bool,
    /// How long `agent__ask_user` waits for an answer, in seconds, before the model goes
    /// on without one (with the `default_answer` it gave, if any). The model may ask for a
    /// shorter wait with `timeout_seconds`. Default: as long as the run lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask_user_timeout: Option<u64>,
    /// How many turns in a row the model may call one tool with the same arguments; the
    /// next such call is not made and the model is told why (a model stuck in a loop
    /// otherwise spends its turns and tokens on it). Default 5; 0: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_repeats: Option<u32>,
    /// The most tool calls one model turn may make (default 64; at least 1). The calls past
    /// it are not made: each is answered with an error telling the model the limit and to
    /// make fewer calls per turn (a model that writes hundreds of calls at once would
    /// otherwise run them all side by side). A call of `agent__batch` counts as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_calls_per_turn: Option<u32>,
    /// The JSON Schema its final report's `content_json` must match; a report that does
    /// not is sent back to the model with the violations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// How much of its earlier cycles' conversation the agent carries into its next cycle
    /// when it listens in cycles (`toolmux agent listen`), in tokens estimated as four bytes
    /// each: the calls it made, their results, and what arrived in its inbox, so that a
    /// cycle knows what the earlier ones asked and read. The oldest turns give way first,
    /// whole: a tool call never goes without its result, nor a result without its call.
    /// 0: every cycle starts afresh, as a run of its own (with what the gateway keeps for
    /// the agent, its goals, memories and plans, when `spaces` are configured). Default:
    /// a quarter of the model's `contextWindow` when that is configured, 16,000 otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_history_tokens: Option<u64>,
    /// Whether MCP clients of `toolmux serve` and other programs see it as a tool
    /// `agent__{name}` (default true). Agents listing it under `agents` can call it either
    /// way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expose: Option<bool>,
}

/// Hand-offs between agents (`router`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouterConfig {
    /// The agents a run may be handed to with `router__handoff-to`; every agent of the run
    /// is offered the tool, naming the destinations other than itself.
    pub destinations: Vec<String>,
}
