//! The settings files of other agents, read for their MCP servers: Gemini CLI's
//! `settings.json` (`mcpServers`, with keys of its own) and Zed's `settings.json`
//! (`context_servers`). Their other settings are not toolmux's and are ignored; a key
//! inside a server entry that the agent does not know is still an error.

use super::{Located, Source, expand_into, typed};
use crate::ToolmuxError;
use crate::config::{Config, McpServerEntry, scalar};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use toolmux_mcp::TransportKind;

/// Whose settings file a configuration file is, when it is not toolmux's own shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dialect {
    /// Gemini CLI's `settings.json`.
    Gemini,
    /// Zed's `settings.json`.
    Zed,
    /// Codex's `config.toml`.
    Codex,
    /// An app's settings file with its MCP servers in toolmux's shape (`mcpServers` or
    /// `servers`) beside settings of its own: Claude Desktop's `globalShortcut`, say.
    Desktop,
    /// The specification seeds' `tools.yml` (Python internal tools).
    #[cfg(feature = "fs")]
    SeedTools,
}

/// Top-level keys of Gemini CLI's settings (flat ones of its first versions, groups of
/// later ones) that no toolmux file has.
const GEMINI_KEYS: &[&str] = &[
    "theme",
    "customThemes",
    "selectedAuthType",
    "useExternalAuth",
    "sandbox",
    "coreTools",
    "allowedTools",
    "excludeTools",
    "allowMCPServers",
    "excludeMCPServers",
    "mcpServerCommand",
    "toolDiscoveryCommand",
    "toolCallCommand",
    "autoAccept",
    "contextFileName",
    "fileFiltering",
    "checkpointing",
    "preferredEditor",
    "bugCommand",
    "usageStatisticsEnabled",
    "telemetry",
    "hideTips",
    "hideBanner",
    "vimMode",
    "showMemoryUsage",
    "maxSessionTurns",
    "summarizeToolOutput",
    "chatCompression",
    "includeDirectories",
    "loadMemoryFromIncludeDirectories",
    "disableAutoUpdate",
    "dnsResolutionOrder",
    "excludedProjectEnvVars",
    "ideMode",
    "folderTrust",
    "accessibility",
    "general",
    "ui",
    "ide",
    "privacy",
    "context",
    "security",
    "advanced",
    "experimental",
    "extensions",
    "mcp",
    "model",
    "output",
];

impl Dialect {
    /// The dialect of a file at `path` (when read from disk) holding `value`; `None` for
    /// toolmux's own shape (which Claude Desktop, Cursor and VS Code files have too).
    ///
    /// By name: `settings.json` in a `.gemini` folder is Gemini CLI's, in a `zed` or `.zed`
    /// folder Zed's. By content: `context_servers` is Zed's, `mcpServers` beside keys only
    /// Gemini CLI's settings have is Gemini's, unless the file also has keys of toolmux's
    /// own (then it is toolmux's, and the foreign keys are reported as unknown).
    pub(super) fn of(path: Option<&Path>, value: &Value) -> Option<Dialect> {
        if let Some(dialect) = path.and_then(Dialect::by_name) {
            return Some(dialect);
        }
        #[cfg(feature = "fs")]
        if super::seed_tools::is_seed_tools(value) {
            return Some(Dialect::SeedTools);
        }
        let top = value.as_object()?;
        let listed = top.get("mcp").and_then(|m| m.get("servers")).is_some_and(Value::is_array);
        let dialect =
            if (top.contains_key("mcp_servers") || listed) && !top.contains_key("mcpServers") {
                Dialect::Codex
            } else if top.contains_key("context_servers")
                && !top.contains_key("mcpServers")
                && !top.contains_key("servers")
            {
                Dialect::Zed
            } else if top.contains_key("mcpServers")
                && top.keys().any(|k| GEMINI_KEYS.contains(&k.as_str()))
            {
                Dialect::Gemini
            } else if (top.contains_key("mcpServers") || top.contains_key("servers"))
                && Dialect::apps_own(top.keys())
            {
                Dialect::Desktop
            } else {
                return None;
            };
        let own = toolmux_keys();
        let mixed = top.keys().any(|k| {
            !matches!(k.as_str(), "mcpServers" | "$schema" | "model") && own.iter().any(|o| o == k)
        });
        (!mixed).then_some(dialect)
    }

    /// Whether `keys` (a file's top-level keys) hold one that is neither toolmux's nor
    /// like one of toolmux's (a typo is reported as one), and none of toolmux's but those
    /// every MCP client file has.
    fn apps_own<'k>(keys: impl Iterator<Item = &'k String>) -> bool {
        let own = toolmux_keys();
        let own: Vec<&str> = own.iter().map(String::as_str).collect();
        let mut foreign = false;
        for key in keys {
            match key.as_str() {
                "mcpServers" | "servers" | "inputs" | "$schema" => {}
                k if own.contains(&k) || toolmux_core::suggest::closest(k, &own).is_some() => {
                    return false;
                }
                _ => foreign = true,
            }
        }
        foreign
    }

    fn by_name(path: &Path) -> Option<Dialect> {
        let folder = path.parent()?.file_name()?.to_str()?;
        if path.file_name()? == "config.toml" && folder == ".codex" {
            return Some(Dialect::Codex);
        }
        if path.file_name()? != "settings.json" {
            return None;
        }
        match folder {
            ".gemini" => Some(Dialect::Gemini),
            "zed" | ".zed" => Some(Dialect::Zed),
            _ => None,
        }
    }
}

/// The top-level keys of toolmux's configuration (with the features built in).
fn toolmux_keys() -> Vec<String> {
    match crate::config::schema().get("properties") {
        Some(Value::Object(properties)) => properties.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// What reading a foreign file gives: the servers as toolmux's entries, and warnings.
pub(super) struct Converted {
    pub(super) config: Config,
    pub(super) warnings: Vec<String>,
    pub(super) secrets: Vec<String>,
    pub(super) inputs: Vec<String>,
    pub(super) shell: Vec<String>,
}

/// Reads `source` (parsed as `value`) as a `dialect` file: its servers checked against
/// the agent's own keys (with lines), `${VAR}` expanded, converted to `mcpServers`.
pub(super) fn read(
    dialect: Dialect,
    mut value: Value,
    source: &Source<'_>,
) -> Result<Converted, ToolmuxError> {
    let located = |e: Located| source.error(e.position, e.message);
    // Only what toolmux reads is expanded: a `${...}` in an unrelated setting is not ours.
    if let Some(top) = value.as_object_mut() {
        let keep: &[&str] = match dialect {
            Dialect::Gemini => &["mcpServers", "mcp", "allowMCPServers", "excludeMCPServers"],
            Dialect::Zed => &["context_servers"],
            Dialect::Codex => &["mcp_servers", "mcp"],
            Dialect::Desktop => &["mcpServers", "servers"],
            #[cfg(feature = "fs")]
            Dialect::SeedTools => &["tools"],
        };
        top.retain(|k, _| keep.contains(&k.as_str()));
    }
    match dialect {
        Dialect::Gemini => {
            typed::<GeminiFile>(source.text, source.format).map_err(located)?;
            // Gemini CLI expands `$VAR` as well as `${VAR}`.
            if let Some(servers) = value.get_mut("mcpServers") {
                brace_bare_references(servers);
            }
            let (file, found, _) = expand_into::<GeminiFile>(value, source)?;
            let (servers, warnings) = file.convert(source.shown, source.base_dir);
            Ok(converted(servers, warnings, found))
        }
        Dialect::Codex => super::codex::read(value, source),
        Dialect::Desktop => {
            let file = typed::<DesktopFile>(source.text, source.format).map_err(located)?;
            let mut warnings: Vec<String> = file
                .other
                .keys()
                .filter(|key| !matches!(key.as_str(), "$schema" | "inputs"))
                .map(|key| {
                    format!(
                        "{}: `{key}` is not a toolmux setting: this file is read for its MCP \
                         servers only",
                        source.shown
                    )
                })
                .collect();
            let (file, found, _) = expand_into::<DesktopFile>(value, source)?;
            let mut servers: BTreeMap<String, McpServerEntry> =
                file.mcp_servers.into_iter().chain(file.servers).collect();
            for (name, entry) in &mut servers {
                entry
                    .read_apps_keys(&format!("{}: mcpServers.{name}", source.shown), &mut warnings);
            }
            Ok(converted(servers, warnings, found))
        }
        #[cfg(feature = "fs")]
        Dialect::SeedTools => super::seed_tools::read(value, source),
        Dialect::Zed => {
            typed::<ZedFile>(source.text, source.format).map_err(located)?;
            let (file, found, _) = expand_into::<ZedFile>(value, source)?;
            let (servers, warnings) = file.convert(source.shown);
            Ok(converted(servers, warnings, found))
        }
    }
}

pub(super) fn converted(
    servers: BTreeMap<String, McpServerEntry>,
    warnings: Vec<String>,
    found: crate::config::env::Expansion,
) -> Converted {
    Converted {
        config: Config { mcp_servers: servers, ..Config::default() },
        warnings,
        secrets: found.secrets,
        inputs: found.inputs,
        shell: found.shell,
    }
}

/// Rewrites `$NAME` as `${NAME}` in every string of `value`.
fn brace_bare_references(value: &mut Value) {
    match value {
        Value::String(text) => {
            if let Some(braced) = braced(text) {
                *text = braced;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(brace_bare_references),
        Value::Object(map) => map.values_mut().for_each(brace_bare_references),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `text` with `$NAME` written `${NAME}`, if it has any.
pub(super) fn braced(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let is_start = |b: u8| b.is_ascii_alphabetic() || b == b'_';
    let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = String::new();
    let (mut last, mut i) = (0, 0);
    while i + 1 < bytes.len() {
        if bytes[i] == b'$' && is_start(bytes[i + 1]) {
            let end = (i + 1..bytes.len()).find(|&j| !is_name(bytes[j])).unwrap_or(bytes.len());
            // Every index here is at an ASCII byte, so on a character boundary.
            out.push_str(&text[last..i]);
            out.push_str("${");
            out.push_str(&text[i + 1..end]);
            out.push('}');
            (last, i) = (end, end);
        } else {
            i += 1;
        }
    }
    if last == 0 {
        return None;
    }
    out.push_str(&text[last..]);
    Some(out)
}

/// An app's settings file ([`Dialect::Desktop`]): its servers, in toolmux's shape; the rest
/// is the app's.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DesktopFile {
    #[serde(default)]
    mcp_servers: BTreeMap<String, McpServerEntry>,
    #[serde(default)]
    servers: BTreeMap<String, McpServerEntry>,
    #[serde(flatten)]
    other: BTreeMap<String, de::IgnoredAny>,
}

/// Gemini CLI's `settings.json`, the parts about MCP servers.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GeminiFile {
    #[serde(default)]
    mcp_servers: BTreeMap<String, GeminiServer>,
    /// Later versions: `mcp.allowed`, `mcp.excluded` (server names).
    #[serde(default)]
    mcp: GeminiMcp,
    /// First versions' `mcp.allowed`.
    #[serde(default, rename = "allowMCPServers")]
    allow_mcp_servers: Option<Vec<String>>,
    /// First versions' `mcp.excluded`.
    #[serde(default, rename = "excludeMCPServers")]
    exclude_mcp_servers: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
struct GeminiMcp {
    #[serde(default)]
    allowed: Option<Vec<String>>,
    #[serde(default)]
    excluded: Vec<String>,
}

/// One of Gemini CLI's `mcpServers`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GeminiServer {
    command: Option<String>,
    #[serde(default, deserialize_with = "scalar::list")]
    args: Vec<String>,
    #[serde(default, deserialize_with = "scalar::map")]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    /// SSE, or streamable HTTP with `type: http`.
    url: Option<String>,
    /// Streamable HTTP.
    http_url: Option<String>,
    /// WebSocket (`host:port`).
    tcp: Option<String>,
    #[serde(rename = "type")]
    transport: Option<GeminiTransport>,
    #[serde(default, deserialize_with = "scalar::map")]
    headers: BTreeMap<String, String>,
    /// Milliseconds.
    timeout: Option<u64>,
    /// Skip confirmations: toolmux's own permissions decide instead.
    #[serde(default)]
    trust: bool,
    description: Option<String>,
    include_tools: Option<Vec<String>>,
    #[serde(default)]
    exclude_tools: Vec<String>,
    /// Written by Gemini CLI for servers of its extensions.
    #[allow(dead_code)]
    extension_name: Option<String>,
    oauth: Option<GeminiOAuth>,
    auth_provider_type: Option<GeminiAuthProvider>,
    target_audience: Option<String>,
    target_service_account: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum GeminiTransport {
    Sse,
    Http,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum GeminiAuthProvider {
    DynamicDiscovery,
    GoogleCredentials,
    ServiceAccountImpersonation,
}

/// Gemini CLI's `oauth` of a remote server.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GeminiOAuth {
    enabled: Option<bool>,
    client_id: Option<String>,
    client_secret: Option<String>,
    scopes: Option<Vec<String>>,
    // Endpoints and redirects toolmux finds (or chooses) itself.
    authorization_url: Option<String>,
    token_url: Option<String>,
    registration_url: Option<String>,
    redirect_uri: Option<String>,
    audiences: Option<Vec<String>>,
    token_param_name: Option<String>,
}

impl GeminiFile {
    fn convert(
        self,
        shown: &str,
        base_dir: &Path,
    ) -> (BTreeMap<String, McpServerEntry>, Vec<String>) {
        let allowed = self.mcp.allowed.or(self.allow_mcp_servers);
        let excluded: Vec<String> =
            self.mcp.excluded.into_iter().chain(self.exclude_mcp_servers).collect();
        // Gemini CLI starts servers in the folder it runs in: the project, the parent of
        // a project's `.gemini` folder.
        let project = match base_dir.file_name() {
            Some(name) if name == ".gemini" => base_dir.parent(),
            _ => None,
        };
        let mut warnings = Vec::new();
        let servers = self
            .mcp_servers
            .into_iter()
            .map(|(name, server)| {
                let mut entry = server.convert(&name, shown, project, &mut warnings);
                let listed = allowed.as_ref().is_none_or(|a| a.contains(&name));
                if !listed || excluded.contains(&name) {
                    entry.enabled = Some(false);
                }
                (name, entry)
            })
            .collect();
        (servers, warnings)
    }
}

impl GeminiServer {
    fn convert(
        self,
        name: &str,
        shown: &str,
        project: Option<&Path>,
        warnings: &mut Vec<String>,
    ) -> McpServerEntry {
        let at = format!("{shown}: mcpServers.{name}");
        // Gemini CLI's order: `httpUrl`, then `url`, then `tcp`, then `command`.
        let (transport, url) = match (self.http_url, self.url, self.tcp) {
            (Some(url), _, _) => (Some(TransportKind::Http), Some(url)),
            (None, Some(url), _) => match self.transport {
                Some(GeminiTransport::Http) => (Some(TransportKind::Http), Some(url)),
                Some(GeminiTransport::Sse) | None => (Some(TransportKind::Sse), Some(url)),
            },
            (None, None, Some(tcp)) if tcp.contains("://") => {
                (Some(TransportKind::Websocket), Some(tcp))
            }
            (None, None, Some(tcp)) => {
                (Some(TransportKind::Websocket), Some(format!("ws://{tcp}")))
            }
            (None, None, None) => (None, None),
        };
        if self.trust {
            warnings.push(format!(
                "{at}.trust is ignored: toolmux's `permissions` decide which calls run without approval"
            ));
        }
        match self.auth_provider_type {
            Some(GeminiAuthProvider::DynamicDiscovery) | None => {
                if self.target_audience.is_some() || self.target_service_account.is_some() {
                    warnings.push(format!(
                        "{at}: targetAudience and targetServiceAccount are ignored without authProviderType: service_account_impersonation"
                    ));
                }
            }
            Some(provider) => warnings.push(format!(
                "{at}.authProviderType `{}` is not supported: toolmux does not sign in with Google credentials, so the server is used without them",
                match provider {
                    GeminiAuthProvider::GoogleCredentials => "google_credentials",
                    _ => "service_account_impersonation",
                }
            )),
        }
        let oauth = self.oauth.map(|oauth| {
            let ignored: Vec<&str> = [
                ("authorizationUrl", oauth.authorization_url.is_some()),
                ("tokenUrl", oauth.token_url.is_some()),
                ("registrationUrl", oauth.registration_url.is_some()),
                ("redirectUri", oauth.redirect_uri.is_some()),
                ("audiences", oauth.audiences.is_some()),
                ("tokenParamName", oauth.token_param_name.is_some()),
            ]
            .into_iter()
            .filter_map(|(key, set)| set.then_some(key))
            .collect();
            if !ignored.is_empty() {
                warnings.push(format!(
                    "{at}.oauth: {} ignored: toolmux finds the authorization server from the MCP server's metadata",
                    ignored.join(", ")
                ));
            }
            toolmux_mcp::OAuthConfig {
                enabled: oauth.enabled,
                client_id: oauth.client_id,
                client_secret: oauth.client_secret,
                scopes: oauth.scopes,
                ..toolmux_mcp::OAuthConfig::default()
            }
        });
        let cwd = self.cwd.map(|cwd| match project {
            Some(project) if cwd.is_relative() => project.join(cwd),
            _ => cwd,
        });
        McpServerEntry {
            transport,
            command: self.command,
            args: self.args,
            env: self.env,
            cwd,
            url,
            headers: self.headers,
            oauth,
            tools_allowed: self.include_tools,
            tools_denied: self.exclude_tools,
            request_timeout_ms: self.timeout,
            description: self.description,
            ..McpServerEntry::default()
        }
    }
}

/// Zed's `settings.json`, the part about MCP servers.
#[derive(Debug, Deserialize)]
struct ZedFile {
    #[serde(default)]
    context_servers: BTreeMap<String, ZedServer>,
}

/// One of Zed's `context_servers`: a command (`command` a string with `args` and `env`
/// beside it, or in older files an object `{path, args, env}`), a URL, or a server of a
/// Zed extension (`settings` only).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ZedServer {
    source: Option<ZedSource>,
    enabled: Option<bool>,
    /// Run on the remote machine in remote development; toolmux runs it here.
    #[serde(default)]
    #[allow(dead_code)]
    remote: bool,
    command: Option<ZedCommand>,
    #[serde(default, deserialize_with = "scalar::list")]
    args: Vec<String>,
    #[serde(default, deserialize_with = "nullable_map")]
    env: BTreeMap<String, String>,
    /// Seconds, for one tool call.
    timeout: Option<u64>,
    url: Option<String>,
    #[serde(default, deserialize_with = "nullable_map")]
    headers: BTreeMap<String, String>,
    oauth: Option<ZedOAuth>,
    /// The extension's settings.
    #[allow(dead_code)]
    settings: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ZedSource {
    Custom,
    Extension,
}

/// Zed's pre-registered OAuth client.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ZedOAuth {
    client_id: String,
    client_secret: Option<String>,
}

/// `command`: the program, or older files' `{path, args, env}`.
#[derive(Debug)]
enum ZedCommand {
    Program(String),
    Full(ZedCommandObject),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ZedCommandObject {
    path: String,
    #[serde(default, deserialize_with = "scalar::list")]
    args: Vec<String>,
    #[serde(default, deserialize_with = "nullable_map")]
    env: BTreeMap<String, String>,
}

// By hand rather than `untagged`, so that an unknown key in the object form is reported
// by its name, as everywhere else.
impl<'de> Deserialize<'de> for ZedCommand {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CommandVisitor;
        impl<'de> Visitor<'de> for CommandVisitor {
            type Value = ZedCommand;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a program, or {path, args, env}")
            }
            fn visit_str<E: de::Error>(self, program: &str) -> Result<ZedCommand, E> {
                Ok(ZedCommand::Program(program.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ZedCommand, A::Error> {
                let object =
                    ZedCommandObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ZedCommand::Full(object))
            }
        }
        deserializer.deserialize_any(CommandVisitor)
    }
}

/// A map of strings (numbers and booleans as their text) that may be `null`.
fn nullable_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    struct Map(#[serde(deserialize_with = "scalar::map")] BTreeMap<String, String>);
    Ok(Option::<Map>::deserialize(d)?.map(|m| m.0).unwrap_or_default())
}

impl ZedFile {
    fn convert(self, shown: &str) -> (BTreeMap<String, McpServerEntry>, Vec<String>) {
        let mut warnings = Vec::new();
        let mut servers = BTreeMap::new();
        for (name, server) in self.context_servers {
            let runnable = server.command.is_some() || server.url.is_some();
            if server.source == Some(ZedSource::Extension) || !runnable {
                warnings.push(format!(
                    "{shown}: context_servers.{name} is left out: it is run by a Zed extension, which toolmux cannot do; give it a `command` or a `url`"
                ));
                continue;
            }
            servers.insert(name, server.convert());
        }
        (servers, warnings)
    }
}

impl ZedServer {
    fn convert(self) -> McpServerEntry {
        let (command, mut args, mut env) = match self.command {
            Some(ZedCommand::Program(program)) => (Some(program), Vec::new(), BTreeMap::new()),
            Some(ZedCommand::Full(object)) => (Some(object.path), object.args, object.env),
            None => (None, Vec::new(), BTreeMap::new()),
        };
        args.extend(self.args);
        env.extend(self.env);
        McpServerEntry {
            command,
            args,
            env,
            url: self.url,
            headers: self.headers,
            oauth: self.oauth.map(|oauth| toolmux_mcp::OAuthConfig {
                client_id: Some(oauth.client_id),
                client_secret: oauth.client_secret,
                ..toolmux_mcp::OAuthConfig::default()
            }),
            request_timeout_ms: self.timeout.map(|s| s.saturating_mul(1000)),
            enabled: self.enabled.filter(|enabled| !enabled),
            ..McpServerEntry::default()
        }
    }
}
