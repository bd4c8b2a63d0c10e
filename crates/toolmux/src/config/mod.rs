//! The configuration file: its Rust model, how it is found and loaded, and its JSON Schema.
//!
//! The model is the file's shape, camelCase keys, unknown keys refused. [`load`] reads a
//! file, [`Loaded::without_file`] is the configuration used when there is none, and
//! [`schema`] is the JSON Schema editors validate the file with.

mod env;
pub(crate) mod file;
mod jsonc;
mod layers;
mod load;
mod toml;

#[cfg(feature = "mcp")]
pub(crate) use env::{is_secret_by_name, is_secret_setting};
pub use layers::{
    Layer, LayerKind, Layers, MANAGED_DIR, MANAGED_FILE_NAMES, USER_FILE_NAMES, load_layered,
};
pub use load::{FILE_NAMES, FileFormat, Loaded, discover, duplicate_json_key, load, load_str};
#[cfg(feature = "fs")]
pub use toolmux_fs::{CommandLine, CommandToolConfig};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The whole configuration file.
///
/// A Claude Desktop or Cursor file (`mcpServers` only) and a VS Code `mcp.json` (`servers`,
/// `inputs`) are configuration files too, and so are Gemini CLI's and Zed's `settings.json`
/// (read for their MCP servers, then converted to `mcpServers`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(title = "toolmux configuration")]
pub struct Config {
    /// The JSON Schema the file follows, for editors; ignored by toolmux.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Settings applied to every tool unless overridden.
    #[serde(default, deserialize_with = "empty::or_default")]
    pub defaults: Defaults,
    /// The builtin file and shell tools (`fs__*`). Without this key, a configuration file
    /// offers no file tools; without a configuration file, the read-only ones are offered
    /// on the current directory.
    #[cfg(feature = "fs")]
    #[serde(default, deserialize_with = "empty::section", skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsSection>,
    /// MCP servers by name; the name becomes the namespace of their tools
    /// (`{name}__{tool}`). VS Code's `servers` is accepted as another spelling.
    #[cfg(feature = "mcp")]
    #[serde(
        default,
        alias = "servers",
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub mcp_servers: BTreeMap<String, McpServerEntry>,
    /// VS Code's prompted inputs (`${input:id}`); toolmux cannot prompt, so they are
    /// ignored with a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Vec<serde_json::Value>>")]
    pub inputs: Option<serde_json::Value>,
    /// Named queues bounding how many calls run at once.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub queues: BTreeMap<String, QueueEntry>,
    /// Which tools may run, never run, or run after approval (globs on full names).
    #[serde(default, deserialize_with = "empty::or_default")]
    pub permissions: PermissionsEntry,
    /// Extra names for tools: alias to a tool's full name (`rd: fs__read`), or to another
    /// alias, which is followed to its tool (`rd2: rd`); a cycle of aliases is refused at
    /// load, naming it. An alias is 1 to 64 ASCII letters, digits, `_` and `-`, as model
    /// APIs take tool names; any other name is refused at load.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub aliases: BTreeMap<String, String>,
    /// Tools that are not listed but found by searching (`tools__search`), for providers of
    /// so many tools that their schemas would fill every request's context.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "ToolSearchEntry::is_empty"
    )]
    pub tool_search: ToolSearchEntry,
    /// Settings of single tools, by full name (`github__search_code`).
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub tools: BTreeMap<String, ToolEntry>,
    /// Command hooks in Claude Code's shape (`PreToolUse`, `PostToolUse`): programs run
    /// before or after each call of the tools their `matcher` names, which may refuse the
    /// call (exit code 2, or a JSON answer), rewrite its arguments or its output, or add
    /// context; Claude Code's hook scripts work unchanged.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "HooksSection::is_empty"
    )]
    pub hooks: HooksSection,
    /// Tools that run a program of yours, by name, offered as `cmd__{name}`: the call's
    /// arguments go to its stdin as JSON, what it prints is the result. They run in the
    /// project's folder, in the sandbox of `fs.bash.sandbox`.
    #[cfg(feature = "fs")]
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub command_tools: BTreeMap<String, CommandToolConfig>,
    /// Inline REST tools by name, offered as `rest__{name}`.
    #[cfg(feature = "rest")]
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub rest_tools: BTreeMap<String, toolmux_rest::RestToolConfig>,
    /// OpenAPI documents to import, by name (the namespace of their tools).
    #[cfg(feature = "rest")]
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub openapi: BTreeMap<String, toolmux_rest::OpenApiConfig>,
    /// Tools that read the web: `web__fetch` (a URL as Markdown or text, public addresses
    /// only unless `fetch.allowPrivate`) and, with `search`, `web__search` (Tavily's API).
    /// `web: {}` turns on the fetch.
    #[cfg(feature = "rest")]
    #[serde(default, deserialize_with = "empty::section", skip_serializing_if = "Option::is_none")]
    pub web: Option<toolmux_rest::WebConfig>,
    /// Settings of `toolmux serve`.
    #[cfg(feature = "mcp")]
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "ServeSection::is_empty"
    )]
    pub serve: ServeSection,
    /// Tools answered from outside by name, offered as `external__{name}`: another program
    /// (an MCP client of `toolmux serve`) takes the calls from `external__pending` and
    /// answers them with `external__submit`; `internal` tools return their arguments. A
    /// map by name, or a list of the seeds' tool objects, each with its `name`.
    #[cfg(feature = "external")]
    #[serde(
        default,
        deserialize_with = "external_list::deserialize",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[schemars(with = "external_list::ExternalTools")]
    pub external_tools: BTreeMap<String, toolmux_external::ExternalToolConfig>,
    /// Spaces where agents and people meet (the seeds' gateway built-ins): with this
    /// section, `gateway__enter_space`, `send_message`, `read_messages`, `skip` and each
    /// agent's goals, memories and plans are offered to every agent and MCP client, and a
    /// visible external tool may only be called in a space, where its call is shown.
    #[cfg(feature = "external")]
    #[serde(default, deserialize_with = "empty::section", skip_serializing_if = "Option::is_none")]
    pub spaces: Option<SpacesSection>,
    /// Models agents think with, by name: an OpenAI-compatible or Anthropic API, the
    /// model's name there, its key (`${OPENAI_API_KEY}`).
    #[cfg(feature = "agent")]
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub models: BTreeMap<String, toolmux_llm::ModelConfig>,
    /// Agents by name: a model, instructions, the tools it may call, the agents it may
    /// delegate to. `toolmux agent run NAME TASK` runs one; each is also a tool
    /// `agent__{name}` for other agents and for MCP clients of `toolmux serve`.
    #[cfg(feature = "agent")]
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub agents: BTreeMap<String, toolmux_agent::AgentConfig>,
    /// Hand-offs between agents: `destinations` are offered to every agent as
    /// `router__handoff-to`.
    #[cfg(feature = "agent")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<toolmux_agent::RouterConfig>,
    /// Where state shared by several `toolmux serve` replicas lives (feature `redis`):
    /// queue slots, the response cache and pending external calls. Without it, each
    /// process keeps its own.
    #[cfg(feature = "redis")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendSection>,
    /// Where to send what the calls did (feature `otel`): `otlp` exports a span per call
    /// and the `mcp.tool.calls`, `mcp.tool.errors` and `mcp.tool.duration` metrics to an
    /// OpenTelemetry collector over OTLP/HTTP.
    #[cfg(feature = "otel")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetrySection>,
}

/// Telemetry, under `telemetry`.
#[cfg(feature = "otel")]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TelemetrySection {
    /// An OpenTelemetry collector's OTLP/HTTP endpoint and how to reach it (`{}`: the
    /// standard `OTEL_EXPORTER_OTLP_*` variables, else `http://localhost:4318`). Arguments
    /// and results are never sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp: Option<toolmux_otel::OtlpConfig>,
}

/// Shared state for many replicas, under `backend`.
#[cfg(feature = "redis")]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendSection {
    /// A Redis server every replica uses: `url`
    /// (`redis://[:password@|user:password@]host[:port][/db]`, password %-encoded),
    /// `prefix` of keys and channels (default `toolmux`), `leaseMs` after which a crashed
    /// replica's queue slots come back (default 30000), `timeoutMs` of one command
    /// (default 2000). Queues, the cache, external calls, rate limits and stored outputs
    /// are then shared; statistics stay per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<toolmux_redis::RedisConfig>,
}

/// Settings of `toolmux serve`.
#[cfg(feature = "mcp")]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServeSection {
    /// Keys that clients must present over HTTP, by who holds them (`ci: ${CI_KEY}`): as
    /// `Authorization: Bearer KEY` or `X-API-Key: KEY`. Without keys, `serve --http` takes
    /// every client and only listens on loopback addresses.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub api_keys: BTreeMap<String, String>,
    /// Tools (glob patterns of full names, `fs__bash`, `everything__*`) whose calls run as
    /// MCP tasks for clients that take them (the `io.modelcontextprotocol/tasks`
    /// extension): the client polls the task instead of holding its request open. Agents
    /// always may; other tools only when listed here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub task_tools: Vec<String>,
    /// Over HTTP, take access tokens (JWTs) an OAuth authorization server issued, as the
    /// MCP authorization specification's protected resource: `issuer` (its tokens' `iss`),
    /// `resource` (this server's URL: the tokens' `aud`, such as
    /// `https://tools.example.com/mcp`), `jwksUri` (default: from the issuer's metadata),
    /// `scopes` every token must carry. Besides `apiKeys`; each token's subject is a
    /// holder (`oauth:SUB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<toolmux_mcp::server::ResourceServerConfig>,
    /// What a key holder may see and call over HTTP, when not every tool: glob patterns of
    /// full tool names (`docs__*`, `fs__read`) by holder (a name under `apiKeys`, or
    /// `oauth:SUBJECT`). Its listing, calls (`tools__call` and `tools__search` too),
    /// prompts, resources and the HTTP APIs keep to them; holders not named see every
    /// tool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holder_tools: BTreeMap<String, Vec<String>>,
    /// The client served, as `--client` gives it (`claude`, `codex`, `openai`, `cursor`,
    /// `gemini`, `generic`): tool names fitted to what it puts before them and its length
    /// limit, schemas to what its model accepts. `--client` overrides it; without either,
    /// `--stdio` takes the profile of the client that connects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The prefix the client puts before every tool name (`mcp__tools__` when Claude Code
    /// knows this server as `tools`), as `--name-prefix` gives it (which overrides it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_prefix: Option<String>,
    /// More accepted `Host`s for HTTP (DNS-rebinding protection), besides 127.0.0.1,
    /// localhost, ::1, the bound address and `--allowed-host`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// Over HTTP, the most MCP sessions held at once (default 2048): past it a new session
    /// ends the one unused the longest, or, when every session has a call or stream open,
    /// is refused with 503 and `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<std::num::NonZeroUsize>,
}

#[cfg(feature = "mcp")]
impl ServeSection {
    fn is_empty(&self) -> bool {
        self.api_keys.is_empty()
            && self.task_tools.is_empty()
            && self.oauth.is_none()
            && self.holder_tools.is_empty()
            && self.client.is_none()
            && self.name_prefix.is_none()
            && self.allowed_hosts.is_empty()
            && self.max_sessions.is_none()
    }

    /// The client profile `client` names, if any; an unknown name is an error listing the
    /// profiles.
    pub fn client_profile(&self) -> Result<Option<toolmux_mcp::server::ClientProfile>, String> {
        use toolmux_mcp::server::ClientProfile;
        let Some(name) = &self.client else { return Ok(None) };
        ClientProfile::from_name(name).map(Some).ok_or_else(|| {
            let names: Vec<&str> = ClientProfile::ALL.iter().map(|(name, _)| *name).collect();
            // The name is the file's: a control character in it is shown escaped.
            let message =
                format!("no client profile `{name}`; the profiles are: {}", names.join(", "));
            load::words::printable(&message).into_owned()
        })
    }
}

/// Settings applied to every tool unless a provider or tool overrides them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Defaults {
    /// Timeout of one tool call in milliseconds (default 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_timeout: Option<u64>,
    /// Outputs larger than this many bytes are spilled to the output directory and the
    /// model gets a handle instead (default 100000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_response_max_bytes: Option<usize>,
    /// What happens to an output over `toolResponseMaxBytes` (default `spill`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversize: Option<Oversize>,
    /// Structured content (MCP `structuredContent`) larger than this many bytes, or than
    /// the tool's own cap when that is larger, is not passed on (default 1048576): dropped
    /// when the tool declares no output schema, else stored whole behind an error result
    /// saying the call succeeded. Apart from `toolResponseMaxBytes` because an output
    /// schema's content must arrive whole or not at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_response_max_bytes: Option<usize>,
    /// Bytes of base64 of the images, audio and embedded resources' blobs one result
    /// passes on (default 10485760, 10 MiB); `toolResponseMaxBytes` counts text only. Past it the parts that do not fit
    /// are each replaced by a note naming their type and size, in the order they come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_response_max_bytes: Option<usize>,
    /// Calls one provider (an MCP server, the REST tools of one API, the file tools) may
    /// have in flight at once (default 64; `0`: no bound). Past it calls wait in order for
    /// one to end, up to their deadline or timeout; past sixteen times as many waiting,
    /// a call fails at once with `queue_busy`. Agents are not bounded (their calls make
    /// calls of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls_in_flight: Option<usize>,
    /// Providers (MCP servers) started at once (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_init_concurrency: Option<usize>,
    /// Time one provider may take to start, in milliseconds (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout: Option<u64>,
    /// Tokens of tool output one run may receive; past it a call fails with
    /// `(tool failed: context window budget exceeded)`. Unlimited when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_token_budget: Option<u64>,
    /// A model (a key of `models`) that answers the sampling requests of MCP servers' tools
    /// when their caller cannot sample (`toolmux tools call`, an MCP client without
    /// sampling). Agents answer their own tools' requests with their own model.
    #[cfg(feature = "agent")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_model: Option<String>,
    /// How deep agents may call agents (default 3: an agent, its sub-agent, and one more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_max_depth: Option<usize>,
    /// How long one call of an agent as a tool (`agent__{name}`) may take, in milliseconds
    /// (default 600000); its own tool calls keep `toolTimeout`, within it. The agent ends
    /// its run a twentieth of the time (at most 2 s) before it, its last turn only to report
    /// when about one more answer fits, so that its caller gets its report and its token
    /// usage rather than a timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_timeout: Option<u64>,
    /// Tool calls one run may make. Unlimited when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls_per_run: Option<u64>,
    /// Total time one run may spend in tools, in milliseconds. Unlimited when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_time_ms: Option<u64>,
    /// Retries of idempotent tools on transient errors (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// Where spilled outputs are kept (default: a folder per project under the system
    /// temporary directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dir: Option<PathBuf>,
    /// A JSON-lines audit log, one line per call. Off when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<PathBuf>,
    /// Where per-tool statistics persist across runs (default `stats.json` in the output
    /// directory); `false` keeps none. Processes sharing the file add their counts to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats_file: Option<StatsFile>,
    /// How long spilled outputs are kept, in milliseconds (default 86400000, a day); older
    /// ones are removed when toolmux starts and, at most once an hour, when it stores
    /// another. `0` keeps them forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_retention: Option<u64>,
    /// How long a call of an external tool (`externalTools`) waits for its result before
    /// it expires, in milliseconds (default 3600000, an hour); a result submitted later is
    /// refused.
    #[cfg(feature = "external")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_call_ttl: Option<u64>,
    /// How long a result waits in its run's inbox (`external__inbox`) to be read, in
    /// milliseconds (default 86400000, a day).
    #[cfg(feature = "external")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_result_ttl: Option<u64>,
    /// How many runs may hold unread results at once, over every process sharing the
    /// pending calls (default 10000); past it a result for another run is refused, saying
    /// so, and its call stays pending until runs read their inboxes or results expire.
    #[cfg(feature = "external")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_max_inboxes: Option<usize>,
    /// The folder where the external tools' pending calls and inboxes are kept, shared by
    /// every process using it, so that one answers or reads the calls another made
    /// (default: `external` in `spaces.dir`, else in the output directory); `false` keeps
    /// them in this process, as does `spaces.inMemory`. With `backend.redis` they are kept
    /// in Redis.
    #[cfg(feature = "external")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_calls_dir: Option<ExternalCallsDir>,
    /// Logs the MCP traffic at debug level.
    #[serde(default, rename = "traceMCP", alias = "traceMcp")]
    pub trace_mcp: bool,
    /// Which of toolmux's own environment stdio MCP servers inherit, unless a server says
    /// (`safe` when unset; see `mcpServers.*.envInherit`): `safe`, everything but variables
    /// whose names name a credential by their words (`GITHUB_TOKEN`, `apiKey`, `DB_PASS`;
    /// not `TOKENIZER_PATH` or `MONKEY`) and `SSH_AUTH_SOCK`, `DBUS_SESSION_BUS_ADDRESS`,
    /// `XAUTHORITY` and `GNOME_KEYRING_CONTROL`; `minimal`, only `HOME`, `LOGNAME`, `PATH`,
    /// `SHELL`, `TERM`, `USER`, `LANG` and `TMPDIR`, as the official MCP SDKs; `all`,
    /// everything. Whichever it is, the inherited values of credential-named variables are
    /// registered as secrets and redacted wherever text leaves toolmux.
    #[cfg(feature = "mcp")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_inherit: Option<toolmux_mcp::EnvInherit>,
    /// How often running MCP servers are pinged, in milliseconds, unless a server says
    /// (off when unset; see `mcpServers.*.healthCheckMs`).
    #[cfg(feature = "mcp")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_ms: Option<u64>,
    /// Stop MCP servers after this many milliseconds without calls, unless a server says
    /// (never when unset; see `mcpServers.*.idleShutdownMs`).
    #[cfg(feature = "mcp")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_shutdown_ms: Option<u64>,
    /// Look up the packages of stdio servers started through a package runner (`npx`,
    /// `uvx`, ...) in OSV and refuse those with a malicious-package advisory, unless a
    /// server says (default true; when OSV cannot be reached, servers start unchecked,
    /// with a warning).
    #[cfg(feature = "mcp")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub malware_check: Option<bool>,
    /// The OSV API that check asks (default `https://api.osv.dev`; a mirror or a proxy).
    #[cfg(feature = "mcp")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osv_url: Option<String>,
}

/// `defaults.statsFile`: a path, or `false` (no statistics kept) or `true` (the default
/// place).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged, expecting = "expected a file path, or false to keep no statistics")]
pub enum StatsFile {
    /// `true`: the default place; `false`: none.
    Enabled(bool),
    /// This file, relative to the configuration file's folder.
    Path(PathBuf),
}

/// `defaults.externalCallsDir`: a folder, or `false` (this process only) or `true` (the
/// default place).
#[cfg(feature = "external")]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(
    untagged,
    expecting = "expected a folder path, or false to keep external calls in this process"
)]
pub enum ExternalCallsDir {
    /// `true`: the default place; `false`: in this process.
    Enabled(bool),
    /// This folder, relative to the configuration file's folder.
    Path(PathBuf),
}

/// What happens to an output over the size cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Oversize {
    /// Kept whole in the output directory; the model gets a handle to read it by pages.
    Spill,
    /// Cut to its head and tail with a marker in between.
    Truncate,
}

/// The builtin file and shell tools.
#[cfg(feature = "fs")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FsSection {
    /// Whether the tools are offered (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The workspace root every tool is confined beneath; relative to the configuration
    /// file's folder (default: that folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// Permission classes switched on: `read`, `write`, `execute` (default `[read]`).
    #[serde(default = "read_only")]
    pub permissions: std::collections::BTreeSet<toolmux_fs::Permission>,
    /// Settings of `bash` and `exec`: the allow-list of command prefixes, environment
    /// variables passed through, timeouts, the OS sandbox (`sandbox`).
    #[serde(default)]
    pub bash: toolmux_fs::BashConfig,
    /// Output limits.
    #[serde(default)]
    pub limits: toolmux_fs::FsLimits,
    /// Paths beneath the root that `fs__write`, `fs__edit`, `fs__multi_edit` and
    /// `fs__apply_patch` refuse to change: `.gitignore`-style lines relative to the root, such as `**/.env` or
    /// `secrets/`. Every `.git`, the configuration file, an MCP server's `envFile`, the
    /// audit log, the statistics file and the output directory are protected whatever this
    /// says (the last two and the audit log are not read either); the sandbox keeps those
    /// beneath the root read-only to `bash` and `exec` too (`bash.sandbox.protectPaths`),
    /// but not the paths these lines name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protect: Vec<String>,
    /// Whether other programs' files that run commands when those programs next start in
    /// the project (`.claude/settings.json`, `.claude/settings.local.json`, `.mcp.json`,
    /// `.cursor/mcp.json`, `.cursor/hooks.json`, `.vscode/mcp.json`, `.vscode/tasks.json`,
    /// `.codex/config.toml`, `.gemini/settings.json`, `.zed/settings.json`) are kept as
    /// toolmux's own are: read but not changed by the file tools, read-only to commands,
    /// moved aside when a command creates one (default true).
    #[serde(default = "yes")]
    pub protect_agent_files: bool,
    /// Paths beneath the root no file tool reads, lists or changes (`read` refuses them,
    /// `grep`, `glob` and `ls` pass over them as if they were not there): `.gitignore`-style
    /// lines such as `**/.env` or `secrets/`. A `permissions.deny` rule on reading a path
    /// (`fs__read(secrets/**)`, `fs__*(**/*.pem)`) adds its path here, so that no search or
    /// listing shows what reading is denied. Like `protect`, it does not reach `bash`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hide: Vec<String>,
}

#[cfg(feature = "fs")]
impl Default for FsSection {
    fn default() -> Self {
        FsSection {
            enabled: true,
            root: None,
            permissions: read_only(),
            bash: toolmux_fs::BashConfig::default(),
            limits: toolmux_fs::FsLimits::default(),
            protect: Vec::new(),
            protect_agent_files: true,
            hide: Vec::new(),
        }
    }
}

#[cfg(feature = "fs")]
fn yes() -> bool {
    true
}

#[cfg(feature = "fs")]
fn read_only() -> std::collections::BTreeSet<toolmux_fs::Permission> {
    std::collections::BTreeSet::from([toolmux_fs::Permission::Read])
}

/// One MCP server, in the shape Claude Desktop, Cursor and VS Code files use, plus
/// toolmux's own keys.
#[cfg(feature = "mcp")]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpServerEntry {
    /// The transport: `stdio`, `http` (streamable HTTP), `sse` or `websocket`; inferred
    /// from `command` or `url` when absent.
    #[serde(
        rename = "type",
        alias = "transport",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub transport: Option<toolmux_mcp::TransportKind>,
    /// The program to run (stdio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments (numbers and booleans are taken as their text).
    #[serde(default, deserialize_with = "scalar::list", skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Option<Vec<String>>")]
    pub args: Vec<String>,
    /// Environment variables added to its environment (numbers and booleans are taken as
    /// their text); values from `${VAR}`, and values written here under a name that sounds
    /// secret (`API_KEY`, `GH_PAT`), are treated as secrets.
    #[serde(default, deserialize_with = "scalar::map", skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(with = "Option<BTreeMap<String, String>>")]
    pub env: BTreeMap<String, String>,
    /// A file of `KEY=value` lines added to its environment (VS Code); relative to the
    /// configuration file's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_file: Option<PathBuf>,
    /// Which of toolmux's own environment the server inherits (stdio; default
    /// `defaults.envInherit`, else `safe`); `env` and `envPassthrough` are always added.
    /// - `safe`: every variable but those whose names name a credential, judged by their
    ///   words (split at `_`, `-`, digits and case): a word such as `TOKEN`, `KEY`, `SECRET`,
    ///   `PASSWORD`, `PASS`, `PWD`, `AUTH`, `SESSION`, `COOKIE`, `CREDENTIALS` or `PAT`, one
    ///   ending in `TOKEN`, `SECRET`, `PASSWORD`, `PASSWD`, `AUTH` or `APIKEY`, or in `KEY`
    ///   but for ordinary words (`MONKEY`, `HOTKEY`), or one holding `KEYRING`. So
    ///   `GITHUB_TOKEN`, `GITHUBTOKEN`, `apiKey`, `SSHKEY` and `DB_PASS` are withheld, and
    ///   so are `SSH_AUTH_SOCK`, `DBUS_SESSION_BUS_ADDRESS`, `XAUTHORITY` and
    ///   `GNOME_KEYRING_CONTROL`, ways to the user's ssh keys, keyring and display (a server
    ///   that pushes over ssh needs `envPassthrough: [SSH_AUTH_SOCK]`); `MONKEY`,
    ///   `TOKENIZER_PATH`, `KEYBOARD_LAYOUT`, `XDG_SESSION_*`, `PWD` and `OLDPWD` are
    ///   passed on.
    /// - `minimal`: only `HOME`, `LOGNAME`, `PATH`, `SHELL`, `TERM`, `USER`, `LANG` and
    ///   `TMPDIR`, what the official MCP SDKs pass on.
    /// - `all`: everything, credentials included.
    ///
    /// Whichever it is, the inherited value of a variable whose name names a credential
    /// (`GITHUB_TOKEN` under `all`) is registered as a secret, as `env`'s values are, and
    /// redacted wherever text leaves toolmux (outputs, errors, logs); a count
    /// (`MAX_TOKENS=4096`), a variable describing the machine (`HOME`, `XDG_*`, `LC_*`) and
    /// an empty value are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_inherit: Option<toolmux_mcp::EnvInherit>,
    /// Variables it inherits whatever `envInherit` says; the values of those whose names
    /// sound secret (`GITHUB_TOKEN`) are treated as secrets.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<String>>")]
    pub env_passthrough: Vec<String>,
    /// Its working directory, relative to the configuration file's folder (default: that
    /// folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The endpoint (streamable HTTP, SSE, WebSocket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP headers sent with every request, such as `Authorization: Bearer ${TOKEN}`.
    #[serde(default, deserialize_with = "scalar::map", skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(with = "Option<BTreeMap<String, String>>")]
    pub headers: BTreeMap<String, String>,
    /// Headers of an MCP client's request to `toolmux serve --http` passed on with each of
    /// its tool calls to this server (streamable HTTP only): `[X-Tenant-Id, X-User]`. The
    /// header that authenticated the client to toolmux (a bearer key or token,
    /// `X-API-Key`) is never passed on.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<String>>")]
    pub passthrough_headers: Vec<String>,
    /// OAuth 2.1 to the server (streamable HTTP or SSE). Without it toolmux still authorizes a
    /// server that asks, by dynamic registration and `toolmux mcp login NAME`; with it a
    /// client is pre-registered, a grant or scopes chosen, or OAuth turned off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<toolmux_mcp::OAuthConfig>,
    /// Cursor's pre-registered OAuth client (`CLIENT_ID`, `CLIENT_SECRET`, `scopes`); read
    /// as `oauth` when that is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<CursorAuth>,
    /// Globs over the server's own tool names; when set, only matching tools are offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_allowed: Option<Vec<String>>,
    /// Globs over the server's own tool names never offered; deny wins over allow.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<String>>")]
    pub tools_denied: Vec<String>,
    /// The queue (under `queues`) its calls wait in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// How long responses of its read-only tools are cached, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<u64>,
    /// The longest wait for one request in milliseconds, reset by progress (default
    /// `defaults.toolTimeout`, else 60000); a tool call that reports progress may go on up
    /// to `maxTotalTimeMs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// Whether the server's progress reports restart the wait of a call (default true);
    /// `false` makes `requestTimeoutMs` the limit of the whole call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_timeout_on_progress: Option<bool>,
    /// The limit of one call, progress or not, in milliseconds (default ten times the wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_time_ms: Option<u64>,
    /// The longest wait for the server to start, the package's malware check
    /// (`malwareCheck`) before a stdio server starts included (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout_ms: Option<u64>,
    /// Whether the server is used at all (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Whether its tools and prompts are named `{server}__{tool}` (default true); `false`
    /// offers them under the server's own names, for a gateway in front of one server
    /// whose clients know those names. A name another provider also offers is left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaced: Option<bool>,
    /// Whether the server's tool annotations are believed for permissions (default
    /// false). MCP's hints are the server's own claims: without this a tool that says it
    /// only reads (`readOnlyHint`) is still taken as possibly writing, so `@write` rules
    /// match it and `@read` and `@readOnly` do not. Set it for a server you trust, or mark
    /// single tools with `tools.NAME.annotations.readOnly`.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "std::ops::Not::not"
    )]
    #[schemars(with = "Option<bool>")]
    pub trust_annotations: bool,
    /// Start the server on first use rather than at startup; needs `tools`.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "std::ops::Not::not"
    )]
    #[schemars(with = "Option<bool>")]
    pub lazy: bool,
    /// One connection (for stdio, one process) per run: each MCP client session of
    /// `toolmux serve`, each named run, each agent run gets its own, for servers that keep
    /// state per client (a browser, a shell). Listing, prompts and resources use one
    /// shared connection.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "std::ops::Not::not"
    )]
    #[schemars(with = "Option<bool>")]
    pub per_session: bool,
    /// With `perSession`, runs with a connection open at once (default 16); the least
    /// recently used idle one is closed to make room, and when all are busy a new run's
    /// call fails at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// With `perSession`, how long a run's connection stays open without calls, in ms
    /// (default 300000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_idle_ms: Option<u64>,
    /// Tools declared here, listed before the server starts.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(with = "Option<Vec<toolmux_mcp::DeclaredTool>>")]
    pub tools: Vec<toolmux_mcp::DeclaredTool>,
    /// Protocol revision: `auto` (default), `legacy` (handshake) or `modern` (2026-07-28).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<toolmux_mcp::ProtocolMode>,
    /// When the caller of the call in flight cannot answer the server's form elicitations
    /// (no client attached, or one without elicitation), answer them with the defaults
    /// their schema gives, as an unattended client; otherwise (the default) decline them.
    /// Questions the caller can answer always go to the caller.
    #[serde(
        default,
        deserialize_with = "empty::or_default",
        skip_serializing_if = "std::ops::Not::not"
    )]
    #[schemars(with = "Option<bool>")]
    pub accept_elicitation_defaults: bool,
    /// At most so many calls per period, for all of its tools together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitEntry>,
    /// Restarts in a row after failures before giving up (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// Before starting it through a package runner (`npx`, `bunx`, `pnpm dlx`,
    /// `yarn dlx`, `uvx`, `uv tool run`, `pipx run`), ask OSV whether the package is known
    /// to be malicious, and refuse to start it if so (default `defaults.malwareCheck`,
    /// else true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub malware_check: Option<bool>,
    /// How often the running server is sent an MCP `ping`, in milliseconds (default
    /// `defaults.healthCheckMs`, else off; `0` turns it off). A ping unanswered within the
    /// interval (at least 1 s, at most 10 s) fails; after 3 failures in a row the server
    /// is closed, a warning names it, and the next call restarts it. A server not started
    /// (lazy, or not yet called) is never pinged. A server that does not announce changes
    /// to its tools (no `listChanged`) has its tool list read again after each answered
    /// ping, and clients are told when it changed. 60000 is a good value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check_ms: Option<u64>,
    /// Stop the server after this many milliseconds without calls (none under way, no
    /// resource subscribed), to free what it holds; the next call starts it again, as a
    /// lazy server's first call does. Default `defaults.idleShutdownMs`, else never; `0`:
    /// never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_shutdown_ms: Option<u64>,
    /// A description of the server, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Cline's, Roo Code's and Windsurf's `disabled`: the opposite of `enabled`, read as
    /// it when `enabled` is not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Written by VS Code for a server installed from its gallery: read, not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gallery: Option<serde_json::Value>,
    /// Written by VS Code for a server installed from its gallery: read, not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<serde_json::Value>,
    /// VS Code's development mode (`watch`, `debug`): read, not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<serde_json::Value>,
    /// Cline's and Roo Code's tools run without asking: not used (a warning says so);
    /// toolmux's `permissions` decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_approve: Option<Vec<String>>,
    /// Roo Code's and older Cline's name of `autoApprove`: not used (a warning says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub always_allow: Option<Vec<String>>,
}

#[cfg(feature = "mcp")]
impl McpServerEntry {
    /// Reads other apps' keys of an entry at `at` as toolmux's (`disabled`), and warns of
    /// those it does not use.
    pub(crate) fn read_apps_keys(&mut self, at: &str, warnings: &mut Vec<String>) {
        if let Some(disabled) = self.disabled.take() {
            self.enabled.get_or_insert(!disabled);
        }
        let approved: Vec<&str> = [&self.auto_approve, &self.always_allow]
            .into_iter()
            .flatten()
            .flatten()
            .map(String::as_str)
            .collect();
        if !approved.is_empty() {
            let warning = format!(
                "{at}: autoApprove/alwaysAllow ({}) is not used: toolmux's `permissions` decide \
                 which calls run without approval (`permissions.allow`)",
                approved.join(", ")
            );
            // The names are the file's: a control character in them is shown escaped.
            warnings.push(load::words::printable(&warning).into_owned());
        }
    }
}

/// Cursor's `auth` object of a remote server: a pre-registered OAuth client.
#[cfg(feature = "mcp")]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CursorAuth {
    /// The client ID.
    #[serde(rename = "CLIENT_ID")]
    pub client_id: String,
    /// The client secret, if the client has one.
    #[serde(rename = "CLIENT_SECRET", default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// The scopes to ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
}

#[cfg(feature = "mcp")]
impl CursorAuth {
    /// As toolmux's `oauth` settings.
    pub fn oauth(&self) -> toolmux_mcp::OAuthConfig {
        toolmux_mcp::OAuthConfig {
            client_id: Some(self.client_id.clone()),
            client_secret: self.client_secret.clone(),
            scopes: self.scopes.clone(),
            ..toolmux_mcp::OAuthConfig::default()
        }
    }
}

/// A section written with nothing under it (`fs:` with its keys commented out, a YAML
/// null) is the section with its defaults, not no section: `fs:` turned the file tools off.
/// So is a list, a map or a switch of a server's entry (`toolsDenied:`, `lazy: null`): not
/// set.
mod empty {
    use serde::{Deserialize, Deserializer};

    #[cfg(any(feature = "fs", feature = "rest", feature = "external"))]
    pub(super) fn section<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Default,
    {
        Ok(Some(Option::<T>::deserialize(d)?.unwrap_or_default()))
    }

    pub(super) fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Default,
    {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
    }
}

/// Strings that YAML writers often leave unquoted (`PORT: 8080`, `args: [--port, 8080]`):
/// numbers and booleans are accepted as their text. A list or a map written as `null`
/// (`args:` with nothing under it) is empty, as a section is.
#[cfg(feature = "mcp")]
mod scalar {
    use serde::{Deserialize, Deserializer};
    use std::collections::BTreeMap;

    #[derive(Deserialize)]
    #[serde(untagged, expecting = "expected a string, number or boolean")]
    enum Scalar {
        Text(String),
        Number(serde_json::Number),
        Bool(bool),
    }

    impl Scalar {
        fn into_text(self) -> String {
            match self {
                Scalar::Text(text) => text,
                Scalar::Number(n) => n.to_string(),
                Scalar::Bool(b) => b.to_string(),
            }
        }
    }

    pub(super) fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        let items = Option::<Vec<Scalar>>::deserialize(d)?.unwrap_or_default();
        Ok(items.into_iter().map(Scalar::into_text).collect())
    }

    pub(super) fn map<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, String>, D::Error> {
        let entries = Option::<BTreeMap<String, Scalar>>::deserialize(d)?.unwrap_or_default();
        Ok(entries.into_iter().map(|(k, v)| (k, v.into_text())).collect())
    }
}

/// `externalTools` as a map by name or as a list of tool objects that name themselves (the
/// seeds' form).
#[cfg(feature = "external")]
mod external_list {
    use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::collections::BTreeMap;
    use toolmux_external::ExternalToolConfig;

    /// The two forms, for the schema.
    #[allow(dead_code, reason = "only its schema is used")]
    #[derive(schemars::JsonSchema)]
    #[serde(untagged)]
    pub(super) enum ExternalTools {
        /// By name.
        Map(BTreeMap<String, ExternalToolConfig>),
        /// Tool objects, each with its `name`.
        List(Vec<ExternalToolConfig>),
    }

    type Tools = BTreeMap<String, ExternalToolConfig>;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Tools, D::Error> {
        d.deserialize_any(Forms)
    }

    struct Forms;

    impl<'de> Visitor<'de> for Forms {
        type Value = Tools;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map of tools by name, or a list of tools each with its `name`")
        }

        // `externalTools:` with nothing under it: none.
        fn visit_none<E: de::Error>(self) -> Result<Tools, E> {
            Ok(Tools::new())
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tools, A::Error> {
            let mut tools = Tools::new();
            while let Some((name, tool)) = map.next_entry::<String, ExternalToolConfig>()? {
                if tools.insert(name.clone(), tool).is_some() {
                    return Err(de::Error::custom(format!("`{name}` is configured twice")));
                }
            }
            Ok(tools)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tools, A::Error> {
            let mut tools = Tools::new();
            let mut i = 0;
            while let Some(tool) = seq.next_element::<ExternalToolConfig>()? {
                let Some(name) = tool.name.clone() else {
                    return Err(de::Error::custom(format!(
                        "the tool at [{i}] has no `name`; in a list each tool names itself \
                         (`- name: confirmAction`)"
                    )));
                };
                if tools.insert(name.clone(), tool).is_some() {
                    return Err(de::Error::custom(format!(
                        "two tools of the list are named `{name}`; names must differ"
                    )));
                }
                i += 1;
            }
            Ok(tools)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Tools, E> {
            Ok(Tools::new())
        }
    }
}

/// A named queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueEntry {
    /// Calls running at once (at least 1).
    pub concurrent: usize,
    /// How long a call waits for a slot before failing as busy, in milliseconds
    /// (default 300000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_timeout_ms: Option<u64>,
}

/// `spaces`: where agents and people meet, and what agents carry from run to run.
#[cfg(feature = "external")]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpacesSection {
    /// The folder spaces and agents' state are kept in, shared by every process using it
    /// (default: `spaces` in the output folder). Relative to the configuration's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Keeps them in this process only, lost when it ends.
    #[serde(default)]
    pub in_memory: bool,
    /// How many messages entering a space (and an agent's start) gives (default 20, at
    /// most 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<usize>,
    /// How many messages a space keeps; older ones are dropped (default 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_messages: Option<usize>,
    /// How many spaces there may be (default 1000); past it a new space is refused, saying
    /// so, until one is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_spaces: Option<usize>,
    /// How many agents' and runs' records (goals, plans, active space) are kept (default
    /// 10000); past it the run idle longest, for an hour at least, is forgotten to make
    /// room (an agent never is), and with none idle a new one is refused, saying so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_agents: Option<usize>,
}

/// `toolSearch`: tools found by searching instead of listed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolSearchEntry {
    /// Glob patterns of full tool names (`stripe__*`) that are not listed, to agents or to
    /// MCP clients: `tools__search` finds them by words (with their input schemas),
    /// `tools__call` calls them for MCP clients, and an agent calls a found tool directly
    /// from its next turn on. They run through the same pipeline as every tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub defer: Vec<String>,
}

impl ToolSearchEntry {
    /// Whether nothing is deferred.
    pub fn is_empty(&self) -> bool {
        self.defer.is_empty()
    }
}

/// Permission rules: globs on full tool names (`fs__*`, `github__create_*`), selectors of
/// what tools are (`@write`), or rules on calls naming what a call runs or touches in
/// parentheses (`fs__bash(git *)`, `fs__write(src/**)`, `api__*(owner=acme)`). Deny wins
/// over ask, ask over allow; with allow rules, a tool matching none is denied, and a shell
/// line runs only when every command in it is allowed. The same rules judge prompts, by
/// their qualified names (`everything__simple-prompt`), and resources and resource
/// templates, as `{server}__{uri}` (`everything__demo://resource/*`), all three as read-only
/// things of no permission class: a server denied (`github__*`) has no prompts or
/// resources either, and what is denied is not listed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PermissionsEntry {
    /// Tools that may run (all when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Tools that never run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// Tools that run only after approval; without an approver (the CLI, the MCP
    /// gateway) they are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask: Vec<String>,
}

/// `hooks`: command hooks by event, as in Claude Code's settings, so that a `hooks` block
/// can be pasted from one to the other: `PreToolUse` and `PostToolUse` for every tool call,
/// `SessionStart`, `UserPromptSubmit`, `Stop` and `SubagentStop` for toolmux's agents.
/// Claude Code's other events (`Notification`, `PreCompact`, `SessionEnd`) have no
/// counterpart and are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HooksSection {
    /// Run before a call, after permission rules and argument validation: exit code 2
    /// refuses the call (stderr is the reason); a JSON answer may refuse it
    /// (`hookSpecificOutput.permissionDecision: deny`), ask for approval (`ask`), rewrite
    /// its arguments (`updatedInput`, validated again) or add context (`additionalContext`,
    /// appended to the output).
    #[serde(rename = "PreToolUse", default, skip_serializing_if = "Vec::is_empty")]
    pub pre_tool_use: Vec<HookMatcherEntry>,
    /// Run after a successful call, before the size cap: exit code 2 (or `decision:
    /// block`) turns the result into an error result; a JSON answer may replace the output
    /// (`updatedMCPToolOutput`) or add context (`additionalContext`).
    #[serde(rename = "PostToolUse", default, skip_serializing_if = "Vec::is_empty")]
    pub post_tool_use: Vec<HookMatcherEntry>,
    /// Run when one of toolmux's agents starts a run (`matcher`: the source, `startup` or
    /// `resume` for a conversation that goes on, a chat's next message or a listening
    /// agent's next cycle): stdout of exit 0 (or `additionalContext`) is given to the model
    /// before the task.
    #[serde(rename = "SessionStart", default, skip_serializing_if = "Vec::is_empty")]
    pub session_start: Vec<HookMatcherEntry>,
    /// Run before an agent's task reaches its model (`prompt` in the input): exit code 2,
    /// `decision: block` or `continue: false` refuses the task; stdout of exit 0 (or
    /// `additionalContext`) is context.
    #[serde(rename = "UserPromptSubmit", default, skip_serializing_if = "Vec::is_empty")]
    pub user_prompt_submit: Vec<HookMatcherEntry>,
    /// Run when an agent's run is about to end with its answer or report: exit code 2
    /// (stderr the reason) or `decision: block` with a `reason` makes it go on, told why
    /// (`stop_hook_active` is then true); its turn limit still holds.
    #[serde(rename = "Stop", default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<HookMatcherEntry>,
    /// `Stop` for agents called by another agent.
    #[serde(rename = "SubagentStop", default, skip_serializing_if = "Vec::is_empty")]
    pub subagent_stop: Vec<HookMatcherEntry>,
}

impl HooksSection {
    /// Whether no hook is configured.
    pub fn is_empty(&self) -> bool {
        self.pre_tool_use.is_empty() && self.post_tool_use.is_empty() && !self.has_agent_hooks()
    }

    /// Whether hooks of the agents' loop are configured.
    pub fn has_agent_hooks(&self) -> bool {
        !(self.session_start.is_empty()
            && self.user_prompt_submit.is_empty()
            && self.stop.is_empty()
            && self.subagent_stop.is_empty())
    }

    /// Warnings for matchers that name Claude Code's tools (`Bash`, `Write|Edit`): pasted
    /// from its settings they would silently match nothing here, where tools have full
    /// toolmux names.
    pub fn warnings(&self) -> Vec<String> {
        const CLAUDE: &[(&str, Option<&str>)] = &[
            ("Bash", Some("fs__bash")),
            ("Read", Some("fs__read")),
            ("Write", Some("fs__write")),
            ("Edit", Some("fs__edit")),
            ("MultiEdit", Some("fs__multi_edit")),
            ("Grep", Some("fs__grep")),
            ("Glob", Some("fs__glob")),
            ("LS", Some("fs__ls")),
            ("WebFetch", None),
            ("WebSearch", None),
            ("Task", None),
            ("NotebookEdit", None),
            ("TodoWrite", None),
        ];
        let events = [("PreToolUse", &self.pre_tool_use), ("PostToolUse", &self.post_tool_use)];
        let mut warnings = Vec::new();
        for (event, entries) in events {
            for (i, entry) in entries.iter().enumerate() {
                let Some(matcher) = entry.matcher.as_deref() else { continue };
                for name in matcher.split('|').map(str::trim) {
                    let Some((_, ours)) = CLAUDE.iter().find(|(claude, _)| *claude == name) else {
                        continue;
                    };
                    let instead = match ours {
                        Some(ours) => format!(
                            "toolmux's is `{ours}` (its arguments may be named differently: \
                             `fs__write` takes `path` where Claude's `Write` takes `file_path`)"
                        ),
                        None => "toolmux has no such tool".to_owned(),
                    };
                    let warning = format!(
                        "hooks.{event}[{i}].matcher: `{name}` is Claude Code's name for one of \
                         its own tools and matches no toolmux tool; {instead}"
                    );
                    warnings.push(load::words::printable(&warning).into_owned());
                }
            }
        }
        warnings
    }
}

/// Hooks for the tools one `matcher` names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HookMatcherEntry {
    /// Which tools (full names): empty, absent or `*` for all; only letters, digits, `_`
    /// and `|` for exact names (`fs__write|fs__edit`); otherwise a regular expression
    /// found anywhere in the name (`^github__`, `__delete_.*`), as Claude Code reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    /// The hooks, run in order; the first that blocks stops the others.
    pub hooks: Vec<HookCommandEntry>,
}

/// One command hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HookCommandEntry {
    /// The kind of hook: `command` (the only one toolmux runs).
    #[serde(rename = "type")]
    pub kind: HookKind,
    /// A shell command line (`sh -c`), run in the configuration file's folder with
    /// `TOOLMUX_PROJECT_DIR` and `CLAUDE_PROJECT_DIR` set to it; the call's JSON on stdin.
    pub command: String,
    /// Seconds it may run (default 60); then it is killed and the call goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

/// The kind of a hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HookKind {
    /// A shell command.
    Command,
}

/// Settings of one tool; they win over its provider's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolEntry {
    /// Timeout of one call in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// The queue (under `queues`) its calls wait in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Its calls' priority in their queue (default 0), added to the caller's (an agent's
    /// `priority`): when a slot frees, the waiting call of the highest takes it, calls of
    /// one priority in the order they came. Queues in Redis ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Cache its responses for this many milliseconds, even if it is not marked
    /// read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<u64>,
    /// Retries on transient errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// Restart the timeout whenever the tool reports progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_timeout_on_progress: Option<bool>,
    /// Upper bound of one call's time, progress or not, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_time_ms: Option<u64>,
    /// Its outputs over this many bytes are stored or cut, instead of at
    /// `defaults.toolResponseMaxBytes` or the size the tool itself announces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_max_bytes: Option<usize>,
    /// Its images, audio and resource blobs over this many bytes of base64 are left out, instead of at
    /// `defaults.mediaResponseMaxBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_response_max_bytes: Option<usize>,
    /// At most so many calls per period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitEntry>,
    /// Its title for people, instead of its provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its description for models, instead of its provider's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its annotations, instead of its provider's (each one given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<AnnotationsEntry>,
    /// Show its calls in the caller's active space, as a visible external tool's are (the
    /// seeds' tool visibility, for a tool of any provider): each call is posted as it
    /// starts (`requires_action`, with its arguments) and finished with the result its
    /// caller gets, its error, or `cancelled`; a caller in no space runs it unshown. Needs
    /// `spaces`; an external tool says it with `externalTools.NAME.visible` instead. Not
    /// `annotations.visible`, which lists the tool to models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub show_in_space: Option<bool>,
    /// Metadata for the programs that show or route it, merged over its provider's (an
    /// MCP tool's `_meta`) member by member, `null` removing one; served as the tool's
    /// `_meta` and listed by `toolmux tools list --json`, never shown to models. The
    /// seeds' `category`, `speed` and `safety` are kept here as `toolmux/category`,
    /// `toolmux/speed` and `toolmux/safety`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What a tool is, as configuration says instead of its provider (`tools.NAME.annotations`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnnotationsEntry {
    /// It changes nothing: its results may be cached and it counts as reading.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "readOnlyHint")]
    pub read_only: Option<bool>,
    /// It may destroy data.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "destructiveHint")]
    pub destructive: Option<bool>,
    /// Calling it twice with the same arguments is calling it once (may be retried).
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "idempotentHint")]
    pub idempotent: Option<bool>,
    /// It reaches beyond the machine.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "openWorldHint")]
    pub open_world: Option<bool>,
    /// Calling it ends an agent's turn: the agent stops and reports after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_turn: Option<bool>,
    /// Shown to models (`false`: hidden from listings, still called by name). Not the
    /// seeds' visibility of a call to people in a space, which is `tools.NAME.showInSpace`
    /// (`externalTools.NAME.visible` for an external tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible: Option<bool>,
    /// Shown to people (`false`: events say it ran but carry neither its arguments nor its
    /// result).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown: Option<bool>,
}

/// At most `calls` calls per `perMs` milliseconds; a call that would wait longer than
/// `waitMs` (default 0) for its turn fails at once, saying when to call again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimitEntry {
    /// Calls per period (1 or more).
    pub calls: u32,
    /// The period in milliseconds (1 or more).
    pub per_ms: u64,
    /// How long a call may wait for its turn, in milliseconds.
    #[serde(default)]
    pub wait_ms: u64,
}

/// The JSON Schema of the configuration file (draft 2020-12), generated from [`Config`].
pub fn schema() -> serde_json::Value {
    let mut schema = schemars::schema_for!(Config).to_value();
    if let Some(object) = schema.as_object_mut() {
        object.insert(
            "$id".into(),
            "https://github.com/toolmux/toolmux/schemas/toolmux.schema.json".into(),
        );
    }
    accept_what_the_loader_accepts(&mut schema);
    schema
}

/// Whether a property's schema admits `null`: `type` naming it, or a branch of `anyOf` or
/// `oneOf` that does.
pub(crate) fn admits_null(schema: &serde_json::Value) -> bool {
    use serde_json::Value;
    match schema.get("type") {
        Some(Value::String(kind)) if kind == "null" => return true,
        Some(Value::Array(kinds)) if kinds.iter().any(|k| k == "null") => return true,
        _ => {}
    }
    ["anyOf", "oneOf"].iter().any(|key| {
        schema.get(*key).and_then(Value::as_array).is_some_and(|all| all.iter().any(admits_null))
    })
}

/// What serde's attributes let the loader read beyond the types, which the derived schema
/// does not say, so that an editor does not flag a file toolmux loads: top-level `x-*`
/// keys, VS Code's `servers`,
/// `transport` for `type` and its other spellings (`streamable-http`, `ws`), and numbers and
/// booleans where text is read (`args: [--port, 8080]`).
fn accept_what_the_loader_accepts(schema: &mut serde_json::Value) {
    use serde_json::{Value, json};
    let scalar = json!({"type": ["string", "number", "boolean"]});
    // Top-level `x-*` keys are ignored (anchor holders, as in Docker Compose).
    schema["patternProperties"] = json!({"^x-.": {
        "description": "Ignored by toolmux: a place for YAML anchors (`x-common: &common`) that settings merge or name, as Docker Compose's extension fields."
    }});
    if let Some(servers) = schema.pointer("/properties/mcpServers").cloned() {
        let mut servers = servers;
        servers["description"] = "VS Code's spelling of `mcpServers`.".into();
        schema["properties"]["servers"] = servers;
    }
    // A section with nothing under it (`fs:`, `mcpServers:` with their entries commented
    // out) is the section with its defaults to the loader.
    if let Some(Value::Object(sections)) = schema.get_mut("properties") {
        for section in sections.values_mut() {
            if admits_null(section) {
                continue;
            }
            let Value::Object(mut inner) = section.take() else { continue };
            let mut outer = serde_json::Map::new();
            for key in ["description", "default"] {
                if let Some(value) = inner.remove(key) {
                    outer.insert(key.to_owned(), value);
                }
            }
            outer.insert("anyOf".to_owned(), json!([inner, {"type": "null"}]));
            *section = Value::Object(outer);
        }
    }
    if let Some(entry) = schema.pointer_mut("/$defs/McpServerEntry/properties") {
        if let Some(kind) = entry.get("type").cloned() {
            entry["transport"] = kind;
        }
        entry["args"]["items"] = scalar.clone();
        for key in ["env", "headers"] {
            entry[key]["additionalProperties"] = scalar.clone();
        }
    }
    if let Some(Value::Array(kinds)) = schema.pointer_mut("/$defs/TransportKind/oneOf") {
        for (spelling, of) in [
            ("streamable-http", "http"),
            ("streamableHttp", "http"),
            ("streamable_http", "http"),
            ("ws", "websocket"),
        ] {
            let description = format!("`{of}`, spelled as other clients do.");
            kinds.push(json!({"const": spelling, "type": "string", "description": description}));
        }
    }
}
