//! Configuration of the builtin tools: the workspace root, the permission classes switched
//! on, the shell's allow-list and environment, and output limits.

use crate::protect::ProtectedPath;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::PathBuf;
use toolmux_core::PermissionClass;

/// A permission class the file tools can be granted.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// `read`, `grep`, `glob`, `ls`.
    Read,
    /// `write`, `edit`, `multi_edit`, `apply_patch`, `undo`.
    Write,
    /// `bash`, `exec`.
    Execute,
}

impl Permission {
    /// The matching class of toolmux-core.
    pub fn as_class(self) -> PermissionClass {
        match self {
            Permission::Read => PermissionClass::Read,
            Permission::Write => PermissionClass::Write,
            Permission::Execute => PermissionClass::Execute,
        }
    }

    /// The name used in configuration.
    pub fn as_str(self) -> &'static str {
        self.as_class().as_str()
    }
}

/// Configuration of the `fs` provider.
///
/// In a configuration file (camelCase keys):
///
/// ```json
/// { "root": "/srv/project", "permissions": ["read", "write"],
///   "bash": { "allowPrefixes": ["cargo test"], "env": ["RUST_LOG"] } }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FsConfig {
    /// The workspace root, an absolute path to an existing directory. Every file tool is
    /// confined beneath it; `bash` and `exec` start in it.
    pub root: PathBuf,
    /// The permission classes switched on; read-only by default.
    #[serde(default = "default_permissions")]
    pub permissions: BTreeSet<Permission>,
    /// The shell tools' settings.
    #[serde(default)]
    pub bash: BashConfig,
    /// Output limits.
    #[serde(default)]
    pub limits: FsLimits,
    /// Paths beneath the root that `write`, `edit`, `multi_edit` and `apply_patch` refuse to
    /// change:
    /// `.gitignore`-style lines relative to the root, such as `**/.env` or `secrets/`.
    /// Every `.git` directory is protected whatever this says. Protection does not reach
    /// `bash` and `exec`: their sandbox ([`BashConfig::sandbox`]) confines writes to whole
    /// directories, so in `workspaceWrite` a command can still change `.git` and these paths.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protect: Vec<String>,
    /// Paths beneath the root no file tool reads, lists or changes: `read` refuses them,
    /// `grep`, `glob` and `ls` pass over them as if they were not there, `write` and the
    /// edits refuse them. `.gitignore`-style lines relative to the root, such as
    /// `**/.env` or `secrets/`. Like `protect`, it does not reach `bash` and `exec`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hide: Vec<String>,
    /// Whether other programs' files that run commands when those programs next start
    /// here ([`crate::AGENT_FILES`]: `.claude/settings.json`, `.mcp.json`,
    /// `.vscode/tasks.json`, …) are kept as toolmux's own are: the file tools read but do not
    /// change them, and commands see them read-only, or have them moved aside when they
    /// create them (default true).
    #[serde(default = "yes")]
    pub protect_agent_files: bool,
    /// Paths of the embedding program the file tools leave alone (its configuration file,
    /// audit log, statistics, output directory); set by the program, not by a
    /// configuration file.
    #[serde(skip)]
    pub protected: Vec<ProtectedPath>,
}

fn yes() -> bool {
    true
}

fn default_permissions() -> BTreeSet<Permission> {
    BTreeSet::from([Permission::Read])
}

impl FsConfig {
    /// Read-only tools confined beneath `root` (an absolute path), default limits.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        FsConfig {
            root: root.into(),
            permissions: default_permissions(),
            bash: BashConfig::default(),
            limits: FsLimits::default(),
            protect: Vec::new(),
            hide: Vec::new(),
            protect_agent_files: true,
            protected: Vec::new(),
        }
    }

    /// Replaces the permission classes switched on.
    pub fn with_permissions(mut self, permissions: impl IntoIterator<Item = Permission>) -> Self {
        self.permissions = permissions.into_iter().collect();
        self
    }

    /// Replaces the shell settings.
    pub fn with_bash(mut self, bash: BashConfig) -> Self {
        self.bash = bash;
        self
    }

    /// Replaces the limits.
    pub fn with_limits(mut self, limits: FsLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Replaces the `.gitignore`-style patterns of paths the file tools may not change.
    pub fn with_protect(mut self, patterns: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.protect = patterns.into_iter().map(Into::into).collect();
        self
    }

    /// Replaces the `.gitignore`-style patterns of paths the file tools neither read, list
    /// nor change.
    pub fn with_hide(mut self, patterns: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.hide = patterns.into_iter().map(Into::into).collect();
        self
    }

    /// Keeps other programs' command-running files ([`crate::AGENT_FILES`]) from agents,
    /// or not.
    pub fn with_agent_files_protected(mut self, protect: bool) -> Self {
        self.protect_agent_files = protect;
        self
    }

    /// Adds a path of the embedding program the file tools leave alone.
    pub fn with_protected(mut self, path: ProtectedPath) -> Self {
        self.protected.push(path);
        self
    }
}

/// Settings of `bash` and `exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct BashConfig {
    /// Command prefixes allowed, matched whole word by whole word from the start
    /// (`cargo test` allows `cargo test -p x`, not `cargo testing` nor `x cargo test`); a
    /// `bash` line is split into words as bash splits it, at spaces and tabs only, and an
    /// `exec` argv is taken as given. Empty: every command is allowed. When set, a `bash`
    /// line holding a shell operator (`;`, `&`, `|`, `$`, backquotes, `<`, `>`, parentheses,
    /// a backslash, a line break), which could chain or hide another command, or any other
    /// space or control character (a no-break space, a vertical tab, a NUL: bash reads
    /// `cat\u00a0notes` as one program name) is refused, saying which. An allowed command
    /// still reads whatever the sandbox lets it read (`cat /etc/passwd`): the list limits
    /// which programs start, not what they touch.
    pub allow_prefixes: Vec<String>,
    /// Names of environment variables passed through to commands, besides `PATH`, `HOME`
    /// and `LANG`, which always are.
    #[serde(rename = "env")]
    pub env_passthrough: Vec<String>,
    /// The timeout when the call gives none, in milliseconds.
    pub default_timeout_ms: u64,
    /// The largest timeout a call may ask for, in milliseconds.
    pub max_timeout_ms: u64,
    /// Characters of stdout and stderr kept for the model together (head and tail).
    pub output_cap_chars: usize,
    /// Where full outputs over the cap are saved (created 0700 if missing); when unset, a
    /// private directory of this user's in the system temporary directory
    /// (`toolmux-fs-UID`, refused if another user owns it or it is a symlink).
    pub spill_dir: Option<PathBuf>,
    /// Bytes of one stream saved to the spill file at most.
    pub spill_max_bytes: u64,
    /// Bytes a command (or background task) may print, stdout and stderr together, before
    /// its process group is killed: a runaway (`yes`, a log in a loop) ends there rather
    /// than at its timeout (default 1 GiB).
    pub max_output_bytes: u64,
    /// The shell `bash` runs commands with (`<shell> -c <command>`).
    pub shell: String,
    /// Background tasks (`run_in_background`) running at once, at most; past it a new
    /// one is refused until one ends or is stopped.
    pub max_background: usize,
    /// A background task's lifetime when the call gives no `timeout`, in milliseconds.
    pub background_timeout_ms: u64,
    /// The longest lifetime a background call may ask for, in milliseconds.
    pub max_background_timeout_ms: u64,
    /// The OS sandbox (Linux Landlock) every command, background tasks included, runs in:
    /// `{"mode": "workspaceWrite", "network": true, "writableRoots": []}`, or only the
    /// mode as a string (`"off"`).
    #[serde(deserialize_with = "sandbox_setting")]
    #[schemars(with = "SandboxSetting")]
    pub sandbox: SandboxConfig,
}

impl Default for BashConfig {
    fn default() -> Self {
        BashConfig {
            allow_prefixes: Vec::new(),
            env_passthrough: Vec::new(),
            default_timeout_ms: 120_000,
            max_timeout_ms: 600_000,
            output_cap_chars: 30_000,
            spill_dir: None,
            spill_max_bytes: 64 * 1024 * 1024,
            max_output_bytes: 1 << 30,
            shell: "bash".into(),
            max_background: 8,
            background_timeout_ms: 30 * 60 * 1000,
            max_background_timeout_ms: 2 * 60 * 60 * 1000,
            sandbox: SandboxConfig::default(),
        }
    }
}

/// What a sandboxed command may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SandboxMode {
    /// Read everything; write only beneath the workspace root, the temporary directories
    /// (`/tmp`, `$TMPDIR`, `/dev/shm`), `writableRoots` and a few devices (`/dev/null`,
    /// `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`).
    WorkspaceWrite,
    /// Read everything; write only `writableRoots` (none by default) and those devices:
    /// not the root, not the temporary directories.
    ReadOnly,
    /// No sandbox: commands can change anything the server's user can.
    Off,
}

impl SandboxMode {
    /// The name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::WorkspaceWrite => "workspaceWrite",
            SandboxMode::ReadOnly => "readOnly",
            SandboxMode::Off => "off",
        }
    }
}

/// The OS sandbox of `bash` and `exec` (Linux Landlock).
///
/// Unset `mode` means `workspaceWrite` where the kernel supports Landlock and no sandbox
/// (with one warning) where it does not. A mode or `network: false` given explicitly is
/// enforced fully or not at all: when the kernel cannot, every command is refused with an
/// error saying why and how to switch the sandbox off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxConfig {
    /// `workspaceWrite`, `readOnly` or `off`; unset: `workspaceWrite` when the kernel
    /// supports Landlock, else off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SandboxMode>,
    /// Whether commands may use the network (default true). `false` leaves them no socket
    /// but a Unix one (a seccomp filter: no TCP, UDP, DNS or ICMP), and denies TCP bind and
    /// connect by Landlock too where the kernel has ABI 4 (Linux 6.7). Without seccomp
    /// (another architecture) it needs that ABI and covers TCP only. The Unix sockets bound
    /// when a command starts (a Docker daemon's) refuse it too, where user namespaces can
    /// be made; those it binds itself work.
    #[serde(default = "allowed")]
    pub network: bool,
    /// Absolute paths of more directories (or files) commands may write beneath, in
    /// either mode, such as `/home/me/.cargo/registry` for `cargo fetch`; missing ones are
    /// skipped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable_roots: Vec<PathBuf>,
    /// Whether `.git` and toolmux's own files (its configuration, statistics, audit log,
    /// outputs) beneath a writable root stay read-only to commands (default true): each
    /// command then runs in a user and mount namespace of its own where they are mounted
    /// read-only. Where the kernel refuses unprivileged user namespaces they stay writable,
    /// with a warning. Inside, files of users other than the command's own show as
    /// `nobody`.
    #[serde(default = "allowed")]
    pub protect_paths: bool,
}

fn allowed() -> bool {
    true
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig { mode: None, network: true, writable_roots: Vec::new(), protect_paths: true }
    }
}

impl SandboxConfig {
    /// A sandbox of mode `mode`, network allowed, no more writable roots.
    pub fn new(mode: SandboxMode) -> Self {
        SandboxConfig { mode: Some(mode), ..SandboxConfig::default() }
    }

    /// Allows or denies TCP.
    pub fn with_network(mut self, network: bool) -> Self {
        self.network = network;
        self
    }

    /// Keeps `.git` and toolmux's own files read-only to commands, or not.
    pub fn with_protect_paths(mut self, protect: bool) -> Self {
        self.protect_paths = protect;
        self
    }

    /// Adds directories (or files) commands may write beneath.
    pub fn with_writable_roots(
        mut self,
        roots: impl IntoIterator<Item = impl Into<PathBuf>>,
    ) -> Self {
        self.writable_roots.extend(roots.into_iter().map(Into::into));
        self
    }
}

/// The sandbox's settings, or only its mode as a string (`"off"`).
// The schema of `bash.sandbox` only, never built: the value is read by `sandbox_setting`,
// which keeps serde's precise messages (an untagged enum would only say that nothing
// matched).
#[derive(JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum SandboxSetting {
    Mode(SandboxMode),
    Settings(SandboxConfig),
}

/// Reads `bash.sandbox`: a mode string or the settings' object.
fn sandbox_setting<'de, D>(deserializer: D) -> Result<SandboxConfig, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Setting;

    impl<'de> serde::de::Visitor<'de> for Setting {
        type Value = SandboxConfig;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(
                "a sandbox mode (\"workspaceWrite\", \"readOnly\" or \"off\") or an object \
                 {mode, network, writableRoots}",
            )
        }

        fn visit_str<E: serde::de::Error>(self, mode: &str) -> Result<SandboxConfig, E> {
            use serde::de::IntoDeserializer as _;
            let mode = SandboxMode::deserialize(mode.into_deserializer())?;
            Ok(SandboxConfig::new(mode))
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            map: A,
        ) -> Result<SandboxConfig, A::Error> {
            SandboxConfig::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }

    deserializer.deserialize_any(Setting)
}

/// Output limits of the file tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct FsLimits {
    /// Lines `read` returns when the call gives no `limit`.
    pub read_lines: usize,
    /// Characters of one line `read` shows before cutting it with a marker.
    pub line_chars: usize,
    /// Bytes of text one `read` page may hold; past it the page ends early and says how
    /// to continue. Keep it below the orchestrator's output cap (`toolResponseMaxBytes`):
    /// a page over the cap is stored behind a handle, the model does not see it, and yet
    /// reading it again is answered "unchanged". The default, 95,904, fits the
    /// orchestrator's default cap of 100,000 with room for the page's header.
    pub read_page_bytes: usize,
    /// Largest file `edit`, `multi_edit`, `apply_patch` and `write` load or write, in bytes.
    pub edit_max_bytes: u64,
    /// `head_limit` of `grep` when the call gives none.
    pub grep_head_limit: usize,
    /// Files `glob` lists when the call gives no `limit`.
    pub glob_limit: usize,
    /// Entries `ls` lists when the call gives no `limit`.
    pub ls_limit: usize,
    /// Milliseconds a `grep` or `glob` walks before it stops and answers with what it
    /// found, saying the results are partial (also ended a little before the call's own
    /// time limit).
    pub search_time_ms: u64,
}

impl Default for FsLimits {
    fn default() -> Self {
        FsLimits {
            read_lines: 2000,
            line_chars: 2000,
            read_page_bytes: 100_000 - 4096,
            edit_max_bytes: 16 * 1024 * 1024,
            grep_head_limit: 250,
            glob_limit: 100,
            ls_limit: 200,
            search_time_ms: 30_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_keys() {
        let config: FsConfig = serde_json::from_value(serde_json::json!({
            "root": "/srv/p",
            "permissions": ["read", "execute"],
            "bash": {"allowPrefixes": ["cargo test"], "env": ["RUST_LOG"], "defaultTimeoutMs": 5000}
        }))
        .unwrap();
        assert_eq!(config.permissions, BTreeSet::from([Permission::Read, Permission::Execute]));
        assert_eq!(config.bash.allow_prefixes, ["cargo test"]);
        assert_eq!(config.bash.env_passthrough, ["RUST_LOG"]);
        assert_eq!(config.bash.default_timeout_ms, 5000);
        assert_eq!(config.bash.max_timeout_ms, 600_000);
    }

    #[test]
    fn defaults_are_read_only() {
        let config: FsConfig = serde_json::from_value(serde_json::json!({"root": "/x"})).unwrap();
        assert_eq!(config, FsConfig::new("/x"));
        assert_eq!(config.permissions, BTreeSet::from([Permission::Read]));
    }

    #[test]
    fn json_schema_has_the_config_keys() {
        let schema = toolmux_core::schema_for::<FsConfig>();
        let text = schema.to_string();
        for key in ["\"root\"", "\"permissions\"", "\"allowPrefixes\"", "\"env\"", "\"execute\""] {
            assert!(text.contains(key), "schema lacks {key}: {text}");
        }
    }

    #[test]
    fn the_sandbox_is_an_object_or_only_its_mode() {
        let bash = |sandbox: serde_json::Value| {
            serde_json::from_value::<BashConfig>(serde_json::json!({"sandbox": sandbox}))
                .map(|b| b.sandbox)
                .map_err(|e| e.to_string())
        };
        assert_eq!(bash(serde_json::json!("off")), Ok(SandboxConfig::new(SandboxMode::Off)));
        assert_eq!(
            bash(
                serde_json::json!({"mode": "readOnly", "network": false, "writableRoots": ["/c"]})
            ),
            Ok(SandboxConfig::new(SandboxMode::ReadOnly)
                .with_network(false)
                .with_writable_roots(["/c"]))
        );
        assert_eq!(bash(serde_json::json!({})), Ok(SandboxConfig::default()));
        assert_eq!(BashConfig::default().sandbox, SandboxConfig::default());
        assert!(SandboxConfig::default().network);
        assert_eq!(
            bash(serde_json::json!("none")),
            Err("unknown variant `none`, expected one of `workspaceWrite`, `readOnly`, `off`"
                .to_owned())
        );
        let err = bash(serde_json::json!({"mode": "off", "net": false})).unwrap_err();
        assert!(err.starts_with("unknown field `net`, expected one of"), "{err}");
        let err = bash(serde_json::json!(true)).unwrap_err();
        assert!(err.contains("expected a sandbox mode"), "{err}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err =
            serde_json::from_value::<FsConfig>(serde_json::json!({"root": "/x", "perms": []}))
                .unwrap_err();
        assert!(err.to_string().contains("unknown field `perms`"), "{err}");
    }
}
