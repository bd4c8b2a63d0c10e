//! How one MCP server is reached and filtered: the `mcpServers.<name>` entry of the
//! configuration file, in the shape Claude Desktop, Cursor and VS Code files use.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::McpError;

/// Which of toolmux's own environment a stdio server inherits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EnvInherit {
    /// Everything but variables whose names look secret.
    #[default]
    Safe,
    /// Only what the official MCP SDKs pass on.
    Minimal,
    /// Everything.
    All,
}

impl EnvInherit {
    /// Whether variable `name` is passed on.
    pub fn passes(self, name: &str) -> bool {
        match self {
            EnvInherit::All => true,
            EnvInherit::Minimal => {
                ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "TMPDIR"]
                    .contains(&name)
            }
            EnvInherit::Safe => !looks_secret(name),
        }
    }
}

/// Whether an environment variable's name suggests it holds a secret, or a way to one,
/// judged by its words as [`toolmux_core::credential::is_credential_name`] judges them
/// (the facade's reading of which values to redact): `GITHUB_TOKEN`, `GITHUBTOKEN`,
/// `OPENAI_API_KEY`, `APIKEY`, `apiKey`, `PGPASSWORD` are withheld, while `MONKEY`,
/// `TOKENIZER_PATH` and `KEYBOARD_LAYOUT` hold `KEY` and `TOKEN` without naming one and are
/// passed on. `SSH_AUTH_SOCK` (the ssh agent signs with the user's keys),
/// `DBUS_SESSION_BUS_ADDRESS` (the session bus reaches the keyring) and
/// `GNOME_KEYRING_CONTROL` are withheld too. The login session's own descriptions
/// (`XDG_SESSION_TYPE`, `XDG_SESSION_DESKTOP`, …) and the working directories (`PWD`,
/// `OLDPWD`) are not secrets.
fn looks_secret(name: &str) -> bool {
    use toolmux_core::credential::{is_credential_word, words};
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("XDG_SESSION_") || upper == "PWD" || upper == "OLDPWD" {
        return false;
    }
    words(name).any(|word| is_credential_word(&word) || word.contains("KEYRING"))
}

/// One MCP server: how to reach it, which of its tools to offer and how long to wait.
///
/// `${VAR}` references are expanded by the configuration loader before this is built;
/// values of `env` and `headers` are treated as secrets and never logged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct McpServerConfig {
    /// The transport; inferred from `command` (stdio) or `url` (streamable HTTP) when absent.
    #[serde(rename = "type", alias = "transport", skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportKind>,
    /// The program to run (stdio).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments (stdio).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables added to the program's environment (stdio).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Which of toolmux's own environment the program inherits (stdio):
    /// - `safe` (default): every variable but those whose names have a word that names a
    ///   credential ([`toolmux_core::credential::is_credential_name`]; words split at `_`,
    ///   `-`, digits and case): `TOKEN`, `KEY`, `SECRET`, `PASSWORD`, `PASS`, `PWD`, `AUTH`,
    ///   `SESSION`, `COOKIE`, `CREDENTIALS`, `PAT`, … as whole words, a word ending in
    ///   `TOKEN`, `SECRET`, `PASSWORD`, `PASSWD`, `AUTH`, `APIKEY`, `SESSIONID` or
    ///   `XAUTHORITY`, or in `KEY` but for ordinary words (`MONKEY`, `HOTKEY`), and a word
    ///   holding `KEYRING`. So `GITHUB_TOKEN`, `GITHUBTOKEN`, `apiKey`, `SSHKEY` and
    ///   `XAUTHORITY` are withheld, and so are `SSH_AUTH_SOCK`, `DBUS_SESSION_BUS_ADDRESS`
    ///   and `GNOME_KEYRING_CONTROL`, ways to the user's keys (a server that pushes over
    ///   ssh needs `envPassthrough`); `MONKEY`, `TOKENIZER_PATH`, `KEYBOARD_LAYOUT`,
    ///   `XDG_SESSION_*`, `PWD` and `OLDPWD` are passed on;
    /// - `minimal`: what the official MCP SDKs pass: `HOME`, `LOGNAME`, `PATH`, `SHELL`,
    ///   `TERM`, `USER`, plus `LANG` and `TMPDIR`;
    /// - `all`: everything.
    ///
    /// Whichever it is, the value of an inherited variable (or one of `envPassthrough`)
    /// whose name names a credential is registered as a secret by the configuration loader,
    /// as `env`'s values are, and redacted wherever text leaves toolmux (outputs, errors,
    /// logs): with `all`, a server echoing `GITHUB_TOKEN` shows `[redacted]`. A count
    /// (`MAX_TOKENS=4096`), a variable describing the machine (`HOME`, `XDG_*`) and an
    /// empty value are not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env_inherit: Option<EnvInherit>,
    /// Variables inherited whatever `envInherit` says (`GITHUB_TOKEN`, say).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env_passthrough: Vec<String>,
    /// The program's working directory (stdio); a relative path is resolved against
    /// `baseDir`, and without either the program runs in `baseDir`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The directory relative paths are resolved against: the configuration file's
    /// directory, set by the loader.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_dir: Option<PathBuf>,
    /// The endpoint (streamable HTTP, SSE, WebSocket).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP headers sent with every request, such as `Authorization: Bearer ${TOKEN}`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Headers of the client's own HTTP request to `toolmux serve --http` passed on with
    /// each tool call to this server (streamable HTTP only), such as `X-Tenant-Id`; names,
    /// any letter case. The header that authenticated the client to toolmux is never
    /// passed on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub passthrough_headers: Vec<String>,
    /// OAuth 2.1 to the server (streamable HTTP or SSE): on by default when the server asks for
    /// it and `headers` carries no `Authorization`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oauth: Option<super::OAuthConfig>,
    /// Globs over the server's own tool names; when set, only matching tools are offered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools_allowed: Option<Vec<String>>,
    /// Globs over the server's own tool names never offered; deny wins over allow.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools_denied: Vec<String>,
    /// The longest wait for one request, reset by each progress notification
    /// (default 60000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// The longest wait for the server to start and answer its handshake, the package's
    /// malware check before a stdio server's start (`malwareCheck`) included (default 30000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub startup_timeout_ms: Option<u64>,
    /// Whether the server is used at all (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Start the server on first use rather than at warmup; needs `tools` to list anything
    /// before then.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub lazy: bool,
    /// Tools declared here, listed before the server is started; replaced by the server's
    /// own list once it runs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<DeclaredTool>,
    /// Which revision of the protocol to speak (default `auto`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<ProtocolMode>,
    /// When the caller of the call in flight cannot answer the server's form elicitations
    /// (no client attached, or one without elicitation), answer them with the defaults
    /// their schema gives, as an unattended client; otherwise (the default) decline them.
    /// Questions the caller can answer always go to the caller.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub accept_elicitation_defaults: bool,
    /// How many times in a row the server may be restarted after failures before the
    /// provider gives up until its next successful start (default 5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// Before a stdio server is started through a package runner (`npx`, `bunx`,
    /// `pnpm dlx`, `yarn dlx`, `uvx`, `uv tool run`, `pipx run`), ask OSV whether the
    /// package is known to be malicious (a `MAL-` advisory) and refuse to start it if so
    /// (default true; the check fails open when OSV cannot be reached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub malware_check: Option<bool>,
    /// The OSV API that check asks (default `https://api.osv.dev`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub osv_url: Option<String>,
    /// How often a running server is sent an MCP `ping`, in ms; off when unset or 0.
    /// A ping fails when unanswered within the interval (at least 1 s, at most 10 s);
    /// after 3 failures in a row the connection is closed and the next call restarts
    /// the server. A server not started (lazy, or not yet called) is not pinged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_check_ms: Option<u64>,
    /// Stop the server after this many ms without calls (no call under way, no resource
    /// subscribed); the next call starts it again. Unset or `0`: it runs until toolmux
    /// stops.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_shutdown_ms: Option<u64>,
    /// The queue the orchestrator runs this server's calls in (read by the facade).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// How long responses may be cached, in ms (read by the facade).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<u64>,
    /// A description of the server, for people.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// How the client reaches a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// A child process speaking JSON-RPC lines on stdin and stdout.
    Stdio,
    /// Streamable HTTP (MCP 2025-03-26 and later).
    #[serde(alias = "streamable-http", alias = "streamableHttp", alias = "streamable_http")]
    Http,
    /// The legacy HTTP+SSE transport of MCP 2024-11-05.
    Sse,
    /// JSON-RPC messages as WebSocket text frames.
    #[serde(alias = "ws")]
    Websocket,
}

impl TransportKind {
    /// The name used in configuration and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Stdio => "stdio",
            TransportKind::Http => "http",
            TransportKind::Sse => "sse",
            TransportKind::Websocket => "websocket",
        }
    }
}

/// Which MCP revision the client speaks with a server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ProtocolMode {
    /// Probe with `server/discover` (2026-07-28) and fall back to the `initialize`
    /// handshake when the server does not know it.
    #[default]
    Auto,
    /// Only the `initialize` handshake, offering 2025-11-25.
    Legacy,
    /// Only the stateless 2026-07-28 revision.
    Modern,
}

/// A tool declared in configuration, offered before its server starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeclaredTool {
    /// The server's own name for it.
    pub name: String,
    /// A short title for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of its arguments (default: any object).
    #[serde(
        default,
        alias = "parametersSchema",
        alias = "parameters_schema",
        skip_serializing_if = "Option::is_none"
    )]
    pub input_schema: Option<Value>,
}

impl McpServerConfig {
    /// A stdio server running `command` with `args`.
    pub fn stdio(
        command: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        McpServerConfig {
            transport: Some(TransportKind::Stdio),
            command: Some(command.into()),
            args: args.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }

    /// A server at `url` speaking `transport`.
    pub fn remote(transport: TransportKind, url: impl Into<String>) -> Self {
        McpServerConfig { transport: Some(transport), url: Some(url.into()), ..Default::default() }
    }

    /// Adds one environment variable (stdio).
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Adds one HTTP header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Sets the directory relative paths are resolved against.
    pub fn with_base_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.base_dir = Some(dir.into());
        self
    }

    /// Sets the working directory (stdio).
    pub fn with_cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Sets the per-request timeout.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout_ms = Some(duration_ms(timeout));
        self
    }

    /// Sets the startup timeout.
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout_ms = Some(duration_ms(timeout));
        self
    }

    /// Sets the allow globs.
    pub fn with_tools_allowed(
        mut self,
        globs: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.tools_allowed = Some(globs.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the deny globs.
    pub fn with_tools_denied(mut self, globs: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.tools_denied = globs.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the protocol mode.
    pub fn with_protocol(mut self, mode: ProtocolMode) -> Self {
        self.protocol = Some(mode);
        self
    }

    /// Starts the server on first use.
    pub fn with_lazy(mut self, lazy: bool) -> Self {
        self.lazy = lazy;
        self
    }

    /// Declares a tool listed before the server starts.
    pub fn with_declared_tool(mut self, tool: DeclaredTool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Answers form elicitations with the schema's defaults.
    pub fn with_elicitation_defaults(mut self, accept: bool) -> Self {
        self.accept_elicitation_defaults = accept;
        self
    }

    /// Sets the restart bound.
    pub fn with_max_restarts(mut self, restarts: u32) -> Self {
        self.max_restarts = Some(restarts);
        self
    }

    /// Pings the running server every `interval` (see `healthCheckMs`).
    pub fn with_health_check(mut self, interval: Duration) -> Self {
        self.health_check_ms = Some(duration_ms(interval));
        self
    }

    /// The transport, explicit or inferred.
    pub fn transport_kind(&self, server: &str) -> Result<TransportKind, McpError> {
        match (self.transport, &self.command, &self.url) {
            (Some(kind), _, _) => Ok(kind),
            (None, Some(_), _) => Ok(TransportKind::Stdio),
            // Schemes are case-insensitive: `WSS://` is a WebSocket URL too.
            (None, None, Some(url))
                if ["ws://", "wss://"].iter().any(|prefix| {
                    url.get(..prefix.len()).is_some_and(|s| s.eq_ignore_ascii_case(prefix))
                }) =>
            {
                Ok(TransportKind::Websocket)
            }
            (None, None, Some(_)) => Ok(TransportKind::Http),
            (None, None, None) => Err(McpError::Config {
                server: server.to_owned(),
                message: "neither `command` nor `url` is set".into(),
            }),
        }
    }

    /// Whether the server is used.
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }

    /// The per-request timeout.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms.unwrap_or(60_000))
    }

    /// The startup timeout.
    pub fn startup_timeout(&self) -> Duration {
        Duration::from_millis(self.startup_timeout_ms.unwrap_or(30_000))
    }

    /// How often the running server is pinged; `None` when it is not.
    pub fn health_check_interval(&self) -> Option<Duration> {
        self.health_check_ms.filter(|ms| *ms > 0).map(Duration::from_millis)
    }

    /// How long unused before the server is stopped; `None` when it never is.
    pub fn idle_shutdown(&self) -> Option<Duration> {
        self.idle_shutdown_ms.filter(|ms| *ms > 0).map(Duration::from_millis)
    }

    /// Stops the server after `after` without calls (see `idleShutdownMs`).
    pub fn with_idle_shutdown(mut self, after: Duration) -> Self {
        self.idle_shutdown_ms = Some(duration_ms(after));
        self
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_inheritance_withholds_secrets_and_ways_to_them() {
        let safe = |name| EnvInherit::Safe.passes(name);
        for withheld in
            ["GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS"]
        {
            assert!(!safe(withheld), "{withheld} was passed on");
        }
        for passed in ["PATH", "HOME", "XDG_SESSION_TYPE", "XDG_SESSION_DESKTOP", "LANG"] {
            assert!(safe(passed), "{passed} was withheld");
        }
    }

    /// Names are judged by their words, as the facade judges which values to redact: a
    /// word that only holds `KEY` or `TOKEN` is no credential's name.
    #[test]
    fn safe_inheritance_judges_names_by_their_words() {
        let withheld = [
            "GITHUBTOKEN",
            "APIKEY",
            "OPENWEATHER_APIKEY",
            "apiKey",
            "x-api-key",
            "OPENAI_API_KEY",
            "PGPASSWORD",
            "MYSQL_PWD",
            "TOKEN2",
            "S3_SECRET",
            "GH_PAT",
            "GNOME_KEYRING_CONTROL",
            "npm_config__authToken",
            "GOOGLEAPIKEY",
            "OPENAIAPIKEY",
            "MAPBOXKEY",
            "SSHKEY",
            "STRIPESECRETKEY",
            "GOOGLEAPIKEYS",
            "PHPSESSIONID",
            "XAUTHORITY",
            "ICEAUTHORITY",
            "BASICAUTH",
            "ProxyBasicAuth",
        ];
        let passed = [
            "MONKEY",
            "TURKEY",
            "HOCKEY",
            "JOCKEY",
            "DONKEY",
            "WHISKEY",
            "HOTKEY",
            "AUTHOR_NAME",
            "KEYSPACE",
            "TOKENIZER_PATH",
            "KEYBOARD_LAYOUT",
            "BYPASS_PROXY",
            "PASSAGE_DIR",
            "PWD",
            "OLDPWD",
            "DONKEY_KONG",
            "XDG_SESSION_CLASS",
        ];
        let judged: Vec<_> = withheld
            .iter()
            .chain(&passed)
            .map(|name| {
                format!("{name}: {}", if looks_secret(name) { "withheld" } else { "passed" })
            })
            .collect();
        expect![[r#"
            [
                "GITHUBTOKEN: withheld",
                "APIKEY: withheld",
                "OPENWEATHER_APIKEY: withheld",
                "apiKey: withheld",
                "x-api-key: withheld",
                "OPENAI_API_KEY: withheld",
                "PGPASSWORD: withheld",
                "MYSQL_PWD: withheld",
                "TOKEN2: withheld",
                "S3_SECRET: withheld",
                "GH_PAT: withheld",
                "GNOME_KEYRING_CONTROL: withheld",
                "npm_config__authToken: withheld",
                "GOOGLEAPIKEY: withheld",
                "OPENAIAPIKEY: withheld",
                "MAPBOXKEY: withheld",
                "SSHKEY: withheld",
                "STRIPESECRETKEY: withheld",
                "GOOGLEAPIKEYS: withheld",
                "PHPSESSIONID: withheld",
                "XAUTHORITY: withheld",
                "ICEAUTHORITY: withheld",
                "BASICAUTH: withheld",
                "ProxyBasicAuth: withheld",
                "MONKEY: passed",
                "TURKEY: passed",
                "HOCKEY: passed",
                "JOCKEY: passed",
                "DONKEY: passed",
                "WHISKEY: passed",
                "HOTKEY: passed",
                "AUTHOR_NAME: passed",
                "KEYSPACE: passed",
                "TOKENIZER_PATH: passed",
                "KEYBOARD_LAYOUT: passed",
                "BYPASS_PROXY: passed",
                "PASSAGE_DIR: passed",
                "PWD: passed",
                "OLDPWD: passed",
                "DONKEY_KONG: passed",
                "XDG_SESSION_CLASS: passed",
            ]
        "#]]
        .assert_debug_eq(&judged);
    }
    use expect_test::expect;

    fn kind(json: Value) -> String {
        let config: McpServerConfig = serde_json::from_value(json).expect("parses");
        match config.transport_kind("s") {
            Ok(kind) => kind.as_str().to_owned(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn transport_inference() {
        assert_eq!(kind(serde_json::json!({"command": "x"})), "stdio");
        assert_eq!(kind(serde_json::json!({"url": "http://127.0.0.1/mcp"})), "http");
        assert_eq!(kind(serde_json::json!({"url": "ws://127.0.0.1/"})), "websocket");
        assert_eq!(kind(serde_json::json!({"type": "streamable-http", "url": "u"})), "http");
        assert_eq!(kind(serde_json::json!({"type": "streamableHttp", "url": "u"})), "http");
        assert_eq!(kind(serde_json::json!({"type": "ws", "url": "u"})), "websocket");
        assert_eq!(kind(serde_json::json!({"type": "sse", "url": "u"})), "sse");
        expect!["mcp server `s`: invalid configuration: neither `command` nor `url` is set"]
            .assert_eq(&kind(serde_json::json!({})));
    }

    #[test]
    fn claude_desktop_entry_loads() {
        let config: McpServerConfig = serde_json::from_value(serde_json::json!({
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-everything"],
            "env": {"TOKEN": "x"},
            "toolsAllowed": ["echo", "get-*"],
            "toolsDenied": ["get-env"],
            "requestTimeoutMs": 5000,
            "queue": "q",
            "cache": 1000,
            "tools": [{"name": "echo", "description": "Echo", "inputSchema": {"type": "object"}}]
        }))
        .expect("parses");
        assert_eq!(config.request_timeout(), Duration::from_secs(5));
        assert_eq!(config.tools.len(), 1);
        assert!(config.is_enabled());
    }
}
