//! Files whose MCP servers sit under `mcp_servers` (snake_case keys): Codex's
//! `config.toml` (`[mcp_servers.NAME]` tables), and the shapes of toolmux's specification
//! seeds: `mcp.yml` (`mcp_servers.NAME` with `url`, `description`, `auth: {type: bearer,
//! token_env_var}` and the declared tools `provides_tools`) and the list
//! `mcp: {servers: [{name, url, transport, allowedTools}]}`. Their other settings (model,
//! approvals, sandbox, profiles) are not toolmux's and are ignored. A key in a server table
//! that toolmux does not know is a warning naming it, not an error: Codex adds keys from
//! release to release, and a server toolmux can start should not be refused for one.

use super::foreign::{Converted, converted};
use super::{Located, Source, expand_into, typed};
use crate::ToolmuxError;
use crate::config::{McpServerEntry, scalar};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use toolmux_core::suggest::closest;
use toolmux_mcp::{EnvInherit, TransportKind};

/// The keys of a Codex server table toolmux reads.
const KNOWN: &[&str] = &[
    "command",
    "args",
    "env",
    "env_vars",
    "cwd",
    "url",
    "bearer_token_env_var",
    "bearer_token",
    "http_headers",
    "env_http_headers",
    "enabled",
    "required",
    "startup_timeout_sec",
    "startup_timeout_ms",
    "tool_timeout_sec",
    "enabled_tools",
    "disabled_tools",
    "scopes",
    "description",
    "auth",
    "provides_tools",
    "transport",
];

/// The parts of Codex's `config.toml` about MCP servers.
#[derive(Debug, Deserialize)]
struct CodexFile {
    #[serde(default)]
    mcp_servers: BTreeMap<String, CodexServer>,
}

/// One `[mcp_servers.NAME]` table.
#[derive(Debug, Deserialize)]
struct CodexServer {
    command: Option<String>,
    #[serde(default, deserialize_with = "scalar::list")]
    args: Vec<String>,
    #[serde(default, deserialize_with = "scalar::map")]
    env: BTreeMap<String, String>,
    /// Variables of Codex's own environment passed on.
    #[serde(default)]
    env_vars: Vec<String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    /// Rewritten into `http_headers` before `${VAR}` expansion.
    #[serde(default, deserialize_with = "scalar::map")]
    http_headers: BTreeMap<String, String>,
    enabled: Option<bool>,
    /// Codex stops when such a server fails to start; toolmux reports every failed
    /// server and goes on with the others.
    #[allow(dead_code)]
    required: Option<bool>,
    startup_timeout_sec: Option<f64>,
    startup_timeout_ms: Option<u64>,
    tool_timeout_sec: Option<f64>,
    enabled_tools: Option<Vec<String>>,
    #[serde(default)]
    disabled_tools: Vec<String>,
    scopes: Option<Vec<String>>,
    /// The seeds' `mcp.yml`.
    description: Option<String>,
    /// The seeds' list shape: `http`, `sse`, `stdio`, `websocket`.
    transport: Option<TransportKind>,
    /// The seeds' declared tools: listed before the server is reached.
    #[serde(default)]
    provides_tools: Vec<SeedTool>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

/// A tool the seeds' `mcp.yml` declares for a server.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeedTool {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default, rename = "inputSchema", alias = "parameters_schema")]
    input_schema: Option<Value>,
    // The seeds' registry fields: the tool's metadata (`tools.SERVER__NAME.meta`).
    speed: Option<String>,
    safety: Option<String>,
    category: Option<String>,
    #[allow(dead_code)]
    source: Option<String>,
    #[allow(dead_code)]
    mcp_server_name: Option<String>,
}

/// The servers of a Codex file parsed as `value`, as toolmux's entries, and warnings.
pub(super) fn read(mut value: Value, source: &Source<'_>) -> Result<Converted, ToolmuxError> {
    let located = |e: Located| source.error(e.position, e.message);
    // Only the servers are toolmux's to expand and check; the seeds' list becomes the map.
    if let Some(top) = value.as_object_mut() {
        let listed = top.get_mut("mcp").and_then(|m| m.get_mut("servers")).map(Value::take);
        top.retain(|k, _| k == "mcp_servers");
        if let Some(listed) = listed {
            let servers = from_list(listed).map_err(|message| source.error(None, message))?;
            top.insert("mcp_servers".into(), Value::Object(servers));
        }
    }
    typed::<CodexFile>(source.text, source.format).map_err(located)?;
    let mut warnings = Vec::new();
    if let Some(Value::Object(servers)) = value.get_mut("mcp_servers") {
        for (name, server) in servers.iter_mut() {
            let at = format!("mcp_servers.{name}");
            let Value::Object(server) = server else { continue };
            if server.contains_key("bearer_token") {
                return Err(source.error(
                    super::super::toml::position(source.text, &format!("{at}.bearer_token")),
                    format!(
                        "{at}.bearer_token: a token is not written in the file (Codex refuses \
                         it too); put it in an environment variable and name that in \
                         `bearer_token_env_var`"
                    ),
                ));
            }
            // Headers from the environment become `${VAR}` references, expanded (and kept
            // secret) with the rest; an unset variable is an error naming it. A name that
            // is none (`MY-TOKEN`) would change the reference (`${MY-TOKEN}` is `MY` with
            // the default `TOKEN`), so it is refused.
            let named = |key: &str, var: String| -> Result<String, ToolmuxError> {
                if crate::config::env::is_name(&var) {
                    return Ok(var);
                }
                Err(source.error(
                    super::super::toml::position(source.text, key),
                    format!(
                        "{key}: `{var}` is not an environment variable's name; a name is \
                         letters, digits and `_`, not starting with a digit"
                    ),
                ))
            };
            let mut headers = match server.remove("http_headers") {
                Some(Value::Object(h)) => h,
                _ => serde_json::Map::new(),
            };
            if let Some(auth) = server.remove("auth") {
                let var =
                    match (auth.get("type").and_then(Value::as_str), auth.get("token_env_var")) {
                        (Some("bearer") | None, Some(Value::String(var))) => var.clone(),
                        (Some(other), _) if other != "bearer" => {
                            return Err(source.error(
                                super::super::toml::position(source.text, &format!("{at}.auth")),
                                format!(
                                    "{at}.auth: type `{other}` is not supported; `bearer` with \
                                 `token_env_var` is, or give `http_headers`"
                                ),
                            ));
                        }
                        _ => {
                            return Err(source.error(
                                None,
                                format!(
                                    "{at}.auth: `token_env_var` (a variable's name) is missing"
                                ),
                            ));
                        }
                    };
                let var = named(&format!("{at}.auth.token_env_var"), var)?;
                headers.insert("Authorization".into(), Value::String(format!("Bearer ${{{var}}}")));
            }
            if let Some(Value::String(var)) = server.remove("bearer_token_env_var") {
                let var = named(&format!("{at}.bearer_token_env_var"), var)?;
                headers.insert("Authorization".into(), Value::String(format!("Bearer ${{{var}}}")));
            }
            if let Some(Value::Object(from_env)) = server.remove("env_http_headers") {
                for (header, var) in from_env {
                    if let Value::String(var) = var {
                        let var = named(&format!("{at}.env_http_headers.{header}"), var)?;
                        headers.insert(header, Value::String(format!("${{{var}}}")));
                    }
                }
            }
            if !headers.is_empty() {
                server.insert("http_headers".into(), Value::Object(headers));
            }
        }
    }
    let (file, found, _) = expand_into::<CodexFile>(value, source)?;
    let mut tools = BTreeMap::new();
    let servers = file
        .mcp_servers
        .into_iter()
        .map(|(name, mut server)| {
            for tool in &mut server.provides_tools {
                let meta = seed_meta(
                    tool.category.take(),
                    tool.speed.take(),
                    tool.safety.take(),
                    "external",
                );
                let entry = crate::config::ToolEntry { meta: Some(meta), ..Default::default() };
                let namespace = crate::wire::namespace_for(&name);
                tools.insert(format!("{namespace}__{}", tool.name), entry);
            }
            let entry = server.convert(&name, source.shown, &mut warnings);
            (name, entry)
        })
        .collect();
    let mut converted = converted(servers, warnings, found);
    converted.config.tools = tools;
    Ok(converted)
}

impl CodexServer {
    fn convert(mut self, name: &str, shown: &str, warnings: &mut Vec<String>) -> McpServerEntry {
        // toolmux's own names of the tool filters (a toolmux file written with `mcp_servers`)
        // still filter: ignored, every tool of the server would be offered.
        let names = |value: Option<Value>| -> Option<Vec<String>> {
            value?.as_array()?.iter().map(|v| v.as_str().map(str::to_owned)).collect()
        };
        for (toolmux_key, codex_key) in
            [("toolsAllowed", "enabled_tools"), ("toolsDenied", "disabled_tools")]
        {
            let Some(list) = names(self.other.remove(toolmux_key)) else { continue };
            warnings.push(format!(
                "{shown}: mcp_servers.{name}.{toolmux_key} is read as `{codex_key}` (this file \
                 is read as Codex's: write `mcpServers` for a toolmux file)"
            ));
            match toolmux_key {
                "toolsAllowed" => self.enabled_tools = Some(list),
                _ => self.disabled_tools.extend(list),
            }
        }
        for key in self.other.keys() {
            let hint = match closest(key, KNOWN) {
                Some(near) => format!("; did you mean `{near}`?"),
                None => String::new(),
            };
            warnings.push(format!(
                "{shown}: mcp_servers.{name}.{key} is not read by toolmux and is ignored{hint}"
            ));
        }
        let ms = |sec: f64| (sec.is_finite() && sec > 0.0).then(|| (sec * 1000.0).round() as u64);
        let transport = match (self.transport, &self.url, &self.command) {
            (Some(transport), _, _) => Some(transport),
            (None, Some(_), _) => Some(TransportKind::Http),
            (None, None, Some(_)) => Some(TransportKind::Stdio),
            (None, None, None) => None,
        };
        let tools = self
            .provides_tools
            .into_iter()
            .map(|t| toolmux_mcp::DeclaredTool {
                name: t.name,
                title: None,
                description: t.description,
                input_schema: t.input_schema,
            })
            .collect();
        McpServerEntry {
            transport,
            command: self.command,
            args: self.args,
            env: self.env,
            // Codex starts servers with a small default environment plus `env_vars`.
            env_inherit: transport
                .filter(|t| *t == TransportKind::Stdio)
                .map(|_| EnvInherit::Minimal),
            env_passthrough: self.env_vars,
            cwd: self.cwd,
            url: self.url,
            headers: self.http_headers,
            oauth: self.scopes.map(|scopes| toolmux_mcp::OAuthConfig {
                scopes: Some(scopes),
                ..toolmux_mcp::OAuthConfig::default()
            }),
            tools_allowed: self.enabled_tools,
            tools_denied: self.disabled_tools,
            request_timeout_ms: self.tool_timeout_sec.and_then(ms),
            startup_timeout_ms: self.startup_timeout_sec.and_then(ms).or(self.startup_timeout_ms),
            enabled: self.enabled,
            description: self.description,
            tools,
            ..McpServerEntry::default()
        }
    }
}

/// The seeds' `mcp.servers` list as the `mcp_servers` map: `name` becomes the key,
/// `allowedTools` `enabled_tools`.
fn from_list(listed: Value) -> Result<serde_json::Map<String, Value>, String> {
    let Value::Array(items) = listed else {
        return Err("mcp.servers: a list of servers was expected".to_owned());
    };
    let mut servers = serde_json::Map::new();
    for (i, item) in items.into_iter().enumerate() {
        let Value::Object(mut server) = item else {
            return Err(format!("mcp.servers[{i}]: a server (an object) was expected"));
        };
        let Some(Value::String(name)) = server.remove("name") else {
            return Err(format!("mcp.servers[{i}]: `name` is missing"));
        };
        if let Some(allowed) = server.remove("allowedTools") {
            server.insert("enabled_tools".into(), allowed);
        }
        if servers.insert(name.clone(), Value::Object(server)).is_some() {
            return Err(format!("mcp.servers[{i}]: a second server named `{name}`"));
        }
    }
    Ok(servers)
}

/// The seeds' registry fields of a tool as its metadata, with the seeds' defaults: `speed`
/// `medium`, `safety` `default_safety` (`native` for internal tools, `external` for an MCP
/// server's).
pub(super) fn seed_meta(
    category: Option<String>,
    speed: Option<String>,
    safety: Option<String>,
    default_safety: &str,
) -> serde_json::Map<String, Value> {
    let mut meta = serde_json::Map::new();
    if let Some(category) = category {
        meta.insert("toolmux/category".into(), Value::String(category));
    }
    meta.insert("toolmux/speed".into(), Value::String(speed.unwrap_or_else(|| "medium".into())));
    meta.insert(
        "toolmux/safety".into(),
        Value::String(safety.unwrap_or_else(|| default_safety.into())),
    );
    meta
}
