//! Finding, reading and checking the configuration file.
//!
//! Loading goes: text → syntax (JSON with comments, or YAML) → the typed model, read
//! straight from the text so that unknown keys and bad types carry their line → `${VAR}`
//! expansion on the parsed values → the typed model again from the expanded values.
//! Gemini CLI's and Zed's settings files go the same way with their own model of their
//! servers, which [`foreign`] then converts to `mcpServers` entries.

use super::{Config, StatsFile, env, jsonc};
use crate::ToolmuxError;
pub(super) use checks::{QueuePlace, QueuePlaces, undefined_queue};
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use toolmux_core::suggest::closest;

/// The syntax of a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// JSON; `//` and `/* */` comments and trailing commas are allowed (VS Code files).
    Json,
    /// YAML 1.2.
    Yaml,
    /// TOML 1.0 (Codex's `config.toml`, or toolmux's own keys).
    Toml,
}

impl FileFormat {
    /// The format of `path` by its extension, whatever its case: `.json` and `.jsonc` are
    /// JSON, `.toml` TOML, anything else YAML (a superset of JSON's syntax).
    pub fn of(path: &Path) -> FileFormat {
        FileFormat::by_extension(path).unwrap_or(FileFormat::Yaml)
    }

    /// The format `path`'s extension names, whatever its case (`x.JSON` is JSON); `None`
    /// for an extension that names none, or none.
    fn by_extension(path: &Path) -> Option<FileFormat> {
        let extension = path.extension()?.to_str()?.to_ascii_lowercase();
        match extension.as_str() {
            "json" | "jsonc" => Some(FileFormat::Json),
            "toml" => Some(FileFormat::Toml),
            "yaml" | "yml" => Some(FileFormat::Yaml),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            FileFormat::Json => "JSON",
            FileFormat::Yaml => "YAML",
            FileFormat::Toml => "TOML",
        }
    }
}

/// A checked configuration and what came with it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration, `${VAR}` references expanded.
    pub config: Config,
    /// The file it came from, as shown in messages; `None` when there was no file.
    pub file: Option<String>,
    /// The file's absolute path, when it was read from disk by [`load`].
    pub path: Option<PathBuf>,
    /// The folder relative paths are resolved against: the file's folder, or the folder
    /// the program started in when there is no file. Absolute.
    pub base_dir: PathBuf,
    /// Every value taken from the environment: never shown in logs, errors or outputs.
    pub secrets: Vec<String>,
    /// Things worth telling the user that do not stop loading.
    pub warnings: Vec<String>,
    /// Every file merged into the configuration, lowest layer first (see
    /// [`load_layered`](super::load_layered)); just the file, or nothing, when loaded alone.
    pub layers: Vec<super::Layer>,
    /// The file, as shown, that set an entry of a section (`mcpServers.github`) when it is
    /// not [`Loaded::file`] (a user's, an added or the managed file): see
    /// [`Loaded::file_of`].
    pub origins: std::collections::BTreeMap<String, String>,
}

impl Loaded {
    /// The configuration used when there is no file: the read-only file tools on
    /// `base_dir` (an absolute path), defaults for everything else.
    pub fn without_file(base_dir: impl Into<PathBuf>) -> Loaded {
        Loaded {
            #[cfg(feature = "fs")]
            config: Config { fs: Some(super::FsSection::default()), ..Config::default() },
            #[cfg(not(feature = "fs"))]
            config: Config::default(),
            file: None,
            path: None,
            base_dir: base_dir.into(),
            secrets: Vec::new(),
            warnings: Vec::new(),
            layers: Vec::new(),
            origins: Default::default(),
        }
    }

    /// The namespaces of the providers the configuration enables, as their tools will be
    /// named (`{namespace}__{tool}`).
    // Without provider features, nothing is ever added.
    #[cfg_attr(not(any(feature = "fs", feature = "mcp", feature = "rest")), allow(unused_mut))]
    pub fn namespaces(&self) -> Vec<String> {
        let mut namespaces = Vec::new();
        #[cfg(feature = "fs")]
        if self.config.fs.as_ref().is_some_and(|fs| fs.enabled) {
            namespaces.push("fs".to_owned());
        }
        #[cfg(feature = "fs")]
        if !self.config.command_tools.is_empty() {
            namespaces.push(toolmux_fs::COMMANDS_NAMESPACE.to_owned());
        }
        #[cfg(feature = "mcp")]
        for (name, entry) in &self.config.mcp_servers {
            if entry.enabled != Some(false) {
                namespaces.push(crate::wire::namespace_for(name));
            }
        }
        #[cfg(feature = "rest")]
        {
            if !self.config.rest_tools.is_empty() {
                namespaces.push(toolmux_rest::INLINE_NAMESPACE.to_owned());
            }
            for (name, import) in &self.config.openapi {
                namespaces.push(import.namespace.clone().unwrap_or_else(|| name.clone()));
            }
            if self.config.web.is_some() {
                namespaces.push(toolmux_rest::WEB_NAMESPACE.to_owned());
            }
        }
        namespaces
    }

    /// The configuration in force, as a document in the file's own keys: every layer
    /// merged, `${VAR}` expanded, and every value taken from the environment replaced by
    /// `[redacted]` (so that it can be shown).
    pub fn effective(&self) -> serde_json::Value {
        let redactor = toolmux_orchestrator::Redactor::new(self.secrets.iter().cloned());
        let mut value = serde_json::to_value(&self.config).unwrap_or_default();
        redact_strings(&mut value, &redactor);
        value
    }

    /// [`Loaded::effective`] as YAML.
    pub fn effective_yaml(&self) -> String {
        serde_yaml_ng::to_string(&self.effective()).unwrap_or_default()
    }

    /// The name used for the configuration in messages.
    pub fn source_name(&self) -> &str {
        self.file.as_deref().unwrap_or("(no configuration file)")
    }

    /// The file that set entry `key` of `section` (`"mcpServers"`, `"github"`), as shown in
    /// messages: the layer it came from when several were merged, else
    /// [`Loaded::source_name`].
    pub fn file_of(&self, section: &str, key: &str) -> &str {
        self.origins.get(&format!("{section}.{key}")).map_or(self.source_name(), String::as_str)
    }

    /// `path` resolved against [`Loaded::base_dir`].
    pub fn resolve(&self, path: &Path) -> PathBuf {
        // `./x` is `x`: paths shown in messages and compared with others carry no `.`.
        let path: PathBuf =
            path.components().filter(|c| *c != std::path::Component::CurDir).collect();
        if path.as_os_str().is_empty() { self.base_dir.clone() } else { self.base_dir.join(path) }
    }

    /// Where spilled outputs are kept: `defaults.outputDir`, or a folder per project
    /// (per base folder) under the system temporary directory, so that a later run of the
    /// binary in the same project finds them.
    pub fn output_dir(&self) -> PathBuf {
        match &self.config.defaults.output_dir {
            Some(dir) => self.resolve(dir),
            None => {
                let base = self.base_dir.to_string_lossy();
                let hash = toolmux_core::naming::short_hash("toolmux", &base);
                std::env::temp_dir().join(format!("toolmux-{hash}"))
            }
        }
    }

    /// Where statistics persist: `defaults.statsFile`, or `stats.json` in the output
    /// directory; `None` with `statsFile: false`.
    pub fn stats_file(&self) -> Option<PathBuf> {
        match &self.config.defaults.stats_file {
            Some(StatsFile::Path(file)) => Some(self.resolve(file)),
            Some(StatsFile::Enabled(false)) => None,
            Some(StatsFile::Enabled(true)) | None => Some(self.output_dir().join("stats.json")),
        }
    }

    /// Where the external tools' pending calls are kept: `defaults.externalCallsDir`, else
    /// `external` in `spaces.dir` or the output directory; `None` (in this process) with
    /// `externalCallsDir: false`, or `spaces.inMemory` unless `externalCallsDir` names a
    /// place.
    #[cfg(feature = "external")]
    pub fn external_calls_dir(&self) -> Option<PathBuf> {
        use super::ExternalCallsDir;
        let spaces = self.config.spaces.as_ref();
        let default = || match spaces.and_then(|s| s.dir.as_ref()) {
            Some(dir) => self.resolve(dir).join("external"),
            None => self.output_dir().join("external"),
        };
        match &self.config.defaults.external_calls_dir {
            Some(ExternalCallsDir::Path(dir)) => Some(self.resolve(dir)),
            Some(ExternalCallsDir::Enabled(false)) => None,
            Some(ExternalCallsDir::Enabled(true)) => Some(default()),
            None if spaces.is_some_and(|s| s.in_memory) => None,
            None => Some(default()),
        }
    }
}

/// Every string of `value` (keys too) with the secrets `redactor` knows replaced.
fn redact_strings(value: &mut serde_json::Value, redactor: &toolmux_orchestrator::Redactor) {
    use serde_json::Value;
    match value {
        Value::String(text) => {
            if let std::borrow::Cow::Owned(clean) = redactor.redact(text) {
                *text = clean;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact_strings(v, redactor)),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut item) in entries {
                redact_strings(&mut item, redactor);
                map.insert(redactor.redact(&key).into_owned(), item);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// The names of the configuration files [`discover`] looks for in a folder, in order.
pub const FILE_NAMES: [&str; 4] = ["toolmux.yaml", "toolmux.yml", "toolmux.json", "toolmux.toml"];

/// The configuration file to use: `explicit` (from `--config`), else `from_env` (the
/// value of `TOOLMUX_CONFIG`), else `toolmux.yaml`, `toolmux.yml`, `toolmux.json` or `toolmux.toml` in
/// `dir`; relative paths are resolved against `dir`. `None` when there is none.
pub fn discover(explicit: Option<&Path>, from_env: Option<&Path>, dir: &Path) -> Option<PathBuf> {
    if let Some(path) = explicit.or(from_env.filter(|p| !p.as_os_str().is_empty())) {
        return Some(dir.join(path));
    }
    FILE_NAMES.iter().map(|name| dir.join(name)).find(|path| path.is_file())
}

/// Reads and checks the configuration file at `path` (absolute), shown as `shown` in
/// messages; `env` looks environment variables up.
pub fn load(
    path: &Path,
    shown: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ToolmuxError> {
    let (loaded, _, queues) = read(path, shown, env)?;
    check_queues(&loaded, &queues)?;
    Ok(loaded)
}

/// [`load`], with the file's settings as written (`${VAR}` expanded) for merging with
/// other layers (a foreign file's as toolmux's `mcpServers`) and where they name queues,
/// which are not checked: another layer may define them.
pub(super) fn read(
    path: &Path,
    shown: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Loaded, serde_json::Value, QueuePlaces), ToolmuxError> {
    let text = super::file::read_regular(path, super::file::FileRole::Config)
        .map_err(|source| ToolmuxError::Read { file: shown.to_owned(), source })?;
    let base_dir = path.parent().map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    let format = FileFormat::of(path);
    let (mut loaded, value, queues) = load_text(&text, format, Some(path), shown, &base_dir, env)?;
    // A file that loads as YAML whatever its name says deserves a word: `toolmux.conf`
    // holding JSON with comments would have failed as YAML. (A file that fails says
    // `invalid YAML` already.)
    if FileFormat::by_extension(path).is_none() {
        let named = match path.extension() {
            Some(extension) => format!("its extension `.{}`", extension.to_string_lossy()),
            None => "it has no extension, which".to_owned(),
        };
        loaded.warnings.push(
            words::printable(&format!(
                "{shown}: read as YAML: {named} names no format (name it .yaml, .yml, .json, \
             .jsonc or .toml to say which)"
            ))
            .into_owned(),
        );
    }
    let layer = super::Layer { kind: super::LayerKind::Project, path: path.to_path_buf() };
    Ok((Loaded { path: Some(path.to_path_buf()), layers: vec![layer], ..loaded }, value, queues))
}

/// Every queue the settings of `loaded`, one file's, name is defined; `places`: where the
/// file names them.
pub(super) fn check_queues(loaded: &Loaded, places: &QueuePlaces) -> Result<(), ToolmuxError> {
    undefined_queue(&loaded.config, &|section, name| {
        let place = places.get(&format!("{section}.{name}")).cloned().unwrap_or_default();
        (loaded.source_name().to_owned(), place)
    })
}

/// Checks configuration `text` in `format`, shown as `shown` in messages, with relative
/// paths resolved against `base_dir` (absolute).
pub fn load_str(
    text: &str,
    format: FileFormat,
    shown: &str,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ToolmuxError> {
    let (loaded, _, queues) = load_text(text, format, None, shown, base_dir, env)?;
    check_queues(&loaded, &queues)?;
    Ok(loaded)
}

/// [`load_str`], knowing the file's `path` when it was read from disk: its name tells
/// whose settings file it is; with the settings as written, `${VAR}` expanded, and where
/// they name queues (not checked: another layer may define them).
fn load_text(
    text: &str,
    format: FileFormat,
    path: Option<&Path>,
    shown: &str,
    base_dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Loaded, serde_json::Value, QueuePlaces), ToolmuxError> {
    let error = |position: Option<(usize, usize)>, message: String| ToolmuxError::Config {
        file: shown.to_owned(),
        line: position.map(|p| p.0),
        column: position.map(|p| p.1),
        // Keys and values of the file are quoted in messages.
        message: words::printable(&message).into_owned(),
    };
    // A byte order mark (Notepad writes one) is not part of the text.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let json_text;
    let text = match format {
        FileFormat::Json => {
            json_text = jsonc::to_json(text);
            json_text.as_str()
        }
        FileFormat::Yaml | FileFormat::Toml => text,
    };
    // Before any parse: the YAML parser takes time growing with the square of flow
    // nesting before it stops at its recursion limit.
    if format == FileFormat::Yaml
        && let Some(position) = nesting::too_deep(text)
    {
        return Err(error(
            Some(position),
            format!(
                "flow collections (`[` and `{{`) nested more than {} deep: no configuration \
                 needs that; write fewer levels (is the file generated or damaged?)",
                nesting::MAX_FLOW_DEPTH
            ),
        ));
    }
    let invalid = |e: Located| {
        // The parser's words for a tab in the indentation ("found character that cannot
        // start any token") do not say that a tab is the trouble, nor what to write.
        let tab = e
            .position
            .filter(|_| format == FileFormat::Yaml)
            .and_then(|(line, _)| tab_in_indentation(text, line).map(|column| (line, column)));
        match tab {
            Some(position) => error(
                Some(position),
                "invalid YAML: a tab indents this line, and YAML allows only spaces for \
                 indentation: indent with spaces"
                    .to_owned(),
            ),
            None => error(e.position, format!("invalid {}: {}", format.name(), e.message)),
        }
    };
    // Syntax first, so that a syntax error is reported as one. A JSON file of nothing but
    // comments is empty, as a YAML one is.
    let value: serde_json::Value = match format {
        FileFormat::Json if text.trim().is_empty() => serde_json::Value::Null,
        _ => parse(text, format).map_err(invalid)?,
    };
    if !value.is_null() {
        check_unique_keys(text, format).map_err(|e| error(e.position, e.message))?;
    }
    // serde reads a struct from a list too, field by field in order, so a file holding
    // only a list would load as settings nobody wrote.
    if !value.is_null() && !value.is_object() {
        let found = words::value_in_words(&value);
        return Err(error(first_content(text), words::not_a_mapping(&found)));
    }
    // `servers` (VS Code's name) is read as `mcpServers`: serde would say the one the
    // user wrote once is duplicated.
    if value.get("servers").is_some() && value.get("mcpServers").is_some() {
        let position = [key_position(text, "servers"), key_position(text, "mcpServers")]
            .into_iter()
            .flatten()
            .max();
        return Err(error(
            position,
            "the file has both `servers` (VS Code's form) and `mcpServers`, two names of one \
             section: move the servers of one into the other and keep one of them"
                .to_owned(),
        ));
    }
    // Top-level `x-*` keys are the file's own, as in Docker Compose: holders of YAML anchors
    // (`x-common: &common`) that settings merge or name. They are no settings.
    let mut value = value;
    let extensions = match &mut value {
        serde_json::Value::Object(top) => {
            let before = top.len();
            top.retain(|key, _| !is_extension_key(key));
            before - top.len()
        }
        _ => 0,
    };
    // A file of nothing but comments is an empty configuration.
    if value.is_null() {
        let loaded = Loaded {
            config: Config::default(),
            file: Some(shown.to_owned()),
            path: None,
            base_dir: base_dir.to_path_buf(),
            secrets: Vec::new(),
            warnings: Vec::new(),
            layers: Vec::new(),
            origins: Default::default(),
        };
        let empty = serde_json::Value::Object(serde_json::Map::new());
        return Ok((loaded, empty, QueuePlaces::new()));
    }

    #[cfg(feature = "mcp")]
    if let Some(dialect) = foreign::Dialect::of(path, &value) {
        let source = Source { text, format, shown, base_dir, env };
        let read = foreign::read(dialect, value, &source)?;
        let mut warnings = read.warnings;
        warnings.extend(read.inputs.iter().map(|input| {
            format!(
                "{shown}: {input} is left as it is: toolmux cannot prompt; use ${{env:VAR}} instead"
            )
        }));
        warnings.extend(shell_warnings(shown, &read.shell));
        // Only servers, the seeds' tools and their metadata come from another program's
        // file.
        let servers = serde_json::to_value(&read.config.mcp_servers)
            .map_err(|e| error(None, format!("cannot merge its servers: {e}")))?;
        #[allow(unused_mut)]
        let mut value = serde_json::json!({ "mcpServers": servers });
        if !read.config.tools.is_empty() {
            value["tools"] = serde_json::to_value(&read.config.tools)
                .map_err(|e| error(None, format!("cannot merge its tools' metadata: {e}")))?;
        }
        #[cfg(feature = "fs")]
        if !read.config.command_tools.is_empty() {
            value["commandTools"] = serde_json::to_value(&read.config.command_tools)
                .map_err(|e| error(None, format!("cannot merge its tools: {e}")))?;
        }
        let mut secrets = read.secrets;
        add_server_env_secrets(&read.config, env, &mut secrets);
        let loaded = Loaded {
            config: read.config,
            file: Some(shown.to_owned()),
            path: None,
            base_dir: base_dir.to_path_buf(),
            secrets,
            warnings,
            layers: Vec::new(),
            origins: Default::default(),
        };
        return Ok((loaded, value, QueuePlaces::new()));
    }
    #[cfg(not(feature = "mcp"))]
    let _ = path;

    // A list or a single value where settings belong: serde_json reads a struct from a
    // list, field by field, and so do untagged and tagged enums in every format.
    shape::check(&value).map_err(|misshapen| {
        let position = match format {
            FileFormat::Toml => super::toml::position(text, &misshapen.path),
            FileFormat::Json | FileFormat::Yaml => value_position(text, &misshapen.path),
        };
        error(position, words::not_settings(&misshapen.path, &misshapen.found))
    })?;
    // The typed model straight from the text: unknown keys and wrong types with a line
    // (a YAML file that merges mappings, or one with `x-*` keys the text still holds, is
    // read from its value, its errors placed by their key).
    if extensions == 0 && !(format == FileFormat::Yaml && has_merge_keys(text)) {
        // A value that is a reference (`concurrent: ${SLOTS}`) is typed once expanded.
        if let Err((path, e)) = typed_at::<Config>(text, format)
            && !at_path(&value, &path).and_then(|v| v.as_str()).is_some_and(|v| v.contains("${"))
        {
            return Err(error(e.position, e.message));
        }
    }
    let source = Source { text, format, shown, base_dir, env };
    // The settings as written: a check that finds a value from the environment wrong
    // shows its reference instead.
    let written = value.clone();
    #[allow(unused_mut)]
    let (mut config, found, value) = expand_into::<Config>(value, &source)?;

    let mut warnings: Vec<String> =
        config.hooks.warnings().into_iter().map(|w| format!("{shown}: {w}")).collect();
    #[cfg(feature = "external")]
    for (name, tool) in &config.external_tools {
        let warning = tool.warning(&words::printable(name));
        warnings.extend(warning.map(|w| format!("{shown}: {w}")));
    }
    #[cfg(feature = "mcp")]
    for (name, entry) in &mut config.mcp_servers {
        entry.read_apps_keys(&format!("{shown}: mcpServers.{name}"), &mut warnings);
    }
    checks::check(&config, &written, &source)?;
    let queues = checks::queue_places(&config, &written, &source);
    if config.inputs.is_some() {
        warnings.push(format!(
            "{shown}: `inputs` is ignored: toolmux cannot prompt; use ${{env:VAR}} instead"
        ));
    }
    #[cfg(feature = "agent")]
    let agents = !config.agents.is_empty();
    #[cfg(not(feature = "agent"))]
    let agents = false;
    if config.hooks.has_agent_hooks() && !agents {
        warnings.push(format!(
            "{shown}: hooks: `SessionStart`, `UserPromptSubmit`, `Stop` and `SubagentStop` run for toolmux's agents only, and no `agents` are configured here"
        ));
    }
    for input in &found.inputs {
        warnings.push(
            words::printable(&format!(
                "{shown}: {input} is left as it is: toolmux cannot prompt; use ${{env:VAR}} instead"
            ))
            .into_owned(),
        );
    }
    warnings.extend(shell_warnings(shown, &found.shell));
    #[allow(unused_mut)]
    let mut secrets = found.secrets;
    #[cfg(feature = "mcp")]
    add_server_env_secrets(&config, env, &mut secrets);
    let loaded = Loaded {
        config,
        file: Some(shown.to_owned()),
        path: None,
        base_dir: base_dir.to_path_buf(),
        secrets,
        warnings,
        layers: Vec::new(),
        origins: Default::default(),
    };
    Ok((loaded, value, queues))
}

/// Adds to `secrets` the values an MCP server's environment gets besides the file's
/// `${VAR}`s (which expansion judges) that are credentials by their variable's name
/// ([`env::is_secret_by_name`]): literal `env` entries (`API_KEY: sk-…` written in the
/// file) and the variables of `envPassthrough` as `env` finds them. A server that prints its
/// environment puts them in toolmux's log and errors, which redact the loaded secrets only.
#[cfg(feature = "mcp")]
fn add_server_env_secrets(
    config: &Config,
    env: &dyn Fn(&str) -> Option<String>,
    secrets: &mut Vec<String>,
) {
    for entry in config.mcp_servers.values() {
        let literal = entry.env.iter().map(|(name, value)| (name.as_str(), value.clone()));
        let passed = entry
            .env_passthrough
            .iter()
            .filter_map(|name| env(name).map(|value| (name.as_str(), value)));
        for (name, value) in literal.chain(passed) {
            if env::is_secret_by_name(name, &value) && !secrets.contains(&value) {
                secrets.push(value);
            }
        }
    }
}

/// A configuration file's text, parsed, and what the steps after parsing need.
struct Source<'a> {
    /// The text as parsed (JSON comments blanked out), to point into.
    text: &'a str,
    // Only the foreign files read the text again, with their own model.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    format: FileFormat,
    /// The file's name in messages.
    shown: &'a str,
    base_dir: &'a Path,
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Source<'_> {
    /// A configuration error in this file, at a 1-based line and column when known.
    fn error(&self, position: Option<(usize, usize)>, message: String) -> ToolmuxError {
        ToolmuxError::Config {
            file: self.shown.to_owned(),
            line: position.map(|p| p.0),
            column: position.map(|p| p.1),
            // Keys and values of the file are quoted in messages.
            message: words::printable(&message).into_owned(),
        }
    }
}

/// The warnings of file `shown` for the references in it only a shell reads
/// ([`env::Expansion::shell`]), which are left as they are: a server's `sh -c` argument
/// or a hook's command may mean them, and a file that meant a variable learns it here.
fn shell_warnings<'a>(shown: &'a str, shell: &'a [String]) -> impl Iterator<Item = String> + 'a {
    shell.iter().map(move |reference| {
        words::printable(&format!(
            "{shown}: {reference} is left as it is for a shell to read: toolmux expands \
             `${{VAR}}`, `${{VAR:-default}}`, `${{VAR-default}}`, `${{VAR:+alt}}`, `${{VAR+alt}}` \
             and `${{VAR:?message}}` only; write `$${{` for a `${{` meant for a shell, which \
             keeps it without this warning"
        ))
        .into_owned()
    })
}

/// `value` with its `${VAR}` references expanded, read as `T`, what expansion found, and
/// the expanded value.
fn expand_into<T: DeserializeOwned>(
    mut value: serde_json::Value,
    source: &Source<'_>,
) -> Result<(T, env::Expansion, serde_json::Value), ToolmuxError> {
    let workspace = workspace_folder(source.base_dir);
    let written = value.clone();
    let found = env::expand(&mut value, source.env, &workspace).map_err(|e| match e {
        env::ExpandError::Unterminated { path } => source.error(
            value_position(source.text, &path).or_else(|| key_position(source.text, &path)),
            format!(
                "`${{` without a closing `}}` in {path}: close the reference \
                 (`${{VAR}}`, `${{VAR:-default}}`), or write a literal `${{` as `$${{`"
            ),
        ),
        env::ExpandError::Unset(unset) => unset_error(&unset, source),
        env::ExpandError::Malformed { path, reference, why } => source.error(
            text_position(source.text, &reference),
            format!("`{reference}` in {path} {why}"),
        ),
        env::ExpandError::Required { path, variable, message } => {
            let told = if message.is_empty() {
                String::new()
            } else {
                format!(", which the file says: {message}")
            };
            source.error(
                reference_position(source.text, &variable),
                format!(
                    "environment variable {variable}, needed in {path}, is not set (or is \
                     empty){told}"
                ),
            )
        }
    })?;
    // A number or a boolean from the environment (`concurrent: ${SLOTS}`) is a string once
    // expanded: where the model wants another type, a string that was written as a
    // reference is read as YAML reads a plain scalar, as it would have been written there.
    // Each pass mends one value; a file has far fewer than the bound.
    for _ in 0..10_000 {
        let e = match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(typed) => return Ok((typed, found, value)),
            Err(e) => e,
        };
        let path = e.path().to_string();
        let mended = at_path(&written, &path)
            .and_then(serde_json::Value::as_str)
            .filter(|text| text.contains("${"))
            .and_then(|_| at_path(&value, &path)?.as_str())
            .and_then(|text| serde_yaml_ng::from_str::<serde_json::Value>(text).ok())
            .filter(|v| v.is_number() || v.is_boolean());
        match (mended, at_path_mut(&mut value, &path)) {
            (Some(mended), Some(slot)) => *slot = mended,
            _ => {
                // Read from the parsed value, which knows no lines: the key's line is looked
                // up.
                let position = key_position(source.text, &path);
                let inner = e.into_inner().to_string();
                let mut message = describe(&path, &inner);
                // A value from the environment may be a credential: the reference as
                // written is shown in its place.
                // That holds for a value typed from a reference too (`maxRestarts: ${N}`,
                // read as a number, then out of range): serde shows it in backticks.
                let written = at_path(&written, &path).and_then(serde_json::Value::as_str);
                let expanded = at_path(&value, &path).map(|v| match v {
                    serde_json::Value::String(text) => format!("{text:?}"),
                    other => format!("`{other}`"),
                });
                if let Some(written) = written
                    && written.contains("${")
                {
                    let shown = format!("{written:?} as expanded");
                    message = match (expanded, unknown_variant(&inner)) {
                        // `type: ${T}`: the values it takes, and no guess from the value.
                        (_, Some((_, expected))) => format!(
                            "{path}: {shown} is none of the values it takes: {}",
                            expected.join(", ")
                        ),
                        (Some(quoted), None) if message.contains(&quoted) => {
                            message.replace(&quoted, &shown)
                        }
                        _ => format!("{path}: {shown} does not fit here"),
                    };
                }
                return Err(source.error(position, message));
            }
        }
    }
    Err(source.error(None, "too many values from the environment to type".to_owned()))
}

/// The parts of a serde path (`mcpServers.a.args[0]`): keys and list indices.
fn path_steps(path: &str) -> Vec<Result<&str, usize>> {
    let mut steps = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let mut pieces = part.split('[');
        if let Some(key) = pieces.next().filter(|k| !k.is_empty()) {
            steps.push(Ok(key));
        }
        for index in pieces {
            if let Ok(i) = index.trim_end_matches(']').parse() {
                steps.push(Err(i));
            }
        }
    }
    steps
}

/// The value at a serde path in `value`.
fn at_path<'v>(value: &'v serde_json::Value, path: &str) -> Option<&'v serde_json::Value> {
    path_steps(path).into_iter().try_fold(value, |v, step| match step {
        Ok(key) => v.get(key),
        Err(i) => v.get(i),
    })
}

/// The value at a serde path in `value`, to change.
fn at_path_mut<'v>(
    value: &'v mut serde_json::Value,
    path: &str,
) -> Option<&'v mut serde_json::Value> {
    path_steps(path).into_iter().try_fold(value, |v, step| match step {
        Ok(key) => v.get_mut(key),
        Err(i) => v.get_mut(i),
    })
}

/// The error for variables unset without a default: the first's line, all of their names.
fn unset_error(unset: &[env::Unset], source: &Source<'_>) -> ToolmuxError {
    let first = &unset[0];
    let position = reference_position(source.text, &first.variable);
    let message = match unset {
        [one] => format!(
            "unset environment variable {} in {} (set it, or give a default: ${{{}:-value}})",
            one.variable, one.path, one.variable
        ),
        all => format!(
            "unset environment variables: {} (set them, or give defaults: ${{{}:-value}}; a \
             shell's own `${{x}}` is written `$${{x}}`)",
            all.iter()
                .map(|u| format!("{} in {}", u.variable, u.path))
                .collect::<Vec<_>>()
                .join(", "),
            first.variable
        ),
    };
    source.error(position, message)
}

/// The folder VS Code calls `${workspaceFolder}`: the parent of a `.vscode` folder, else
/// the configuration file's folder.
fn workspace_folder(base_dir: &Path) -> String {
    let dir = match base_dir.file_name() {
        Some(name) if name == ".vscode" => base_dir.parent().unwrap_or(base_dir),
        _ => base_dir,
    };
    dir.to_string_lossy().into_owned()
}

/// The 1-based line and column of the text's first content: not a blank line, a comment
/// or YAML's `---`.
fn first_content(text: &str) -> Option<(usize, usize)> {
    text.lines().enumerate().find_map(|(i, line)| {
        let content = line.trim();
        let skipped = content.is_empty() || content.starts_with('#') || content == "---";
        (!skipped).then(|| (i + 1, line.len() - line.trim_start().len() + 1))
    })
}

/// The 1-based column of the first tab in the indentation of line `line` (1-based) of
/// `text`, the spaces and tabs before its first other character; `None` when there is none.
fn tab_in_indentation(text: &str, line: usize) -> Option<usize> {
    let text_line = text.lines().nth(line.checked_sub(1)?)?;
    let indentation =
        &text_line[..text_line.len() - text_line.trim_start_matches([' ', '\t']).len()];
    indentation.find('\t').map(|at| at + 1)
}

/// A problem found in the text, with its 1-based line and column when known.
struct Located {
    position: Option<(usize, usize)>,
    message: String,
}

fn parse(text: &str, format: FileFormat) -> Result<serde_json::Value, Located> {
    match format {
        FileFormat::Json => serde_json::from_str(text).map_err(|e| json_error(&e)),
        FileFormat::Yaml if has_merge_keys(text) => {
            // `<<: *anchor` merges a mapping into another (YAML 1.1), as docker-compose
            // files use it.
            let mut value: serde_yaml_ng::Value =
                serde_yaml_ng::from_str(text).map_err(|e| yaml_error(&e))?;
            value.apply_merge().map_err(|e| yaml_error(&e))?;
            serde_json::to_value(value)
                .map_err(|e| Located { position: None, message: e.to_string() })
        }
        FileFormat::Yaml => serde_yaml_ng::from_str(text).map_err(|e| yaml_error(&e)),
        FileFormat::Toml => super::toml::to_json(text)
            .map_err(|e| Located { position: Some(e.position), message: e.message }),
    }
}

/// Line and column of the key at `path` (`mcpServers.s.command`; list indices left out)
/// in a YAML or JSON `text`, each key looked for after the one before; `None` when one is
/// not found so (a key written in another quoting, say).
fn key_position(text: &str, path: &str) -> Option<(usize, usize)> {
    key_offset(text, path).map(|(offset, _)| super::toml::line_column(text, offset))
}

/// Line and column of the value of the key at `path` in a YAML or JSON `text`, as
/// [`key_position`] finds the key: the first thing after its `:`.
fn value_position(text: &str, path: &str) -> Option<(usize, usize)> {
    let (offset, form) = key_offset(text, path)?;
    let after = offset + form;
    let value = text[after..].find(|c: char| !c.is_whitespace()).map_or(text.len(), |i| after + i);
    Some(super::toml::line_column(text, value))
}

/// The byte offset of the key at `path` ([`key_position`]) and the length of its form
/// (`"key":`).
fn key_offset(text: &str, path: &str) -> Option<(usize, usize)> {
    let keys = path.split('.').map(|k| k.split('[').next().unwrap_or(k)).filter(|k| !k.is_empty());
    let mut from = 0;
    let mut found = None;
    for key in keys {
        let forms = [format!("{key}:"), format!("\"{key}\":"), format!("'{key}':")];
        let (at, len) = forms
            .iter()
            .filter_map(|form| key_at(&text[from..], form).map(|at| (at, form.len())))
            .min()?;
        found = Some((from + at, len));
        from += at + len;
    }
    found
}

/// Where `form` (`key:`) first stands as a key in `text`: at the start of a line (after
/// its indentation or a list's `- `), or after `{` or `,`.
fn key_at(text: &str, form: &str) -> Option<usize> {
    text.match_indices(form).map(|(at, _)| at).find(|&at| {
        let before = text[..at].trim_end_matches([' ', '\t']);
        before.is_empty() || before.ends_with(['\n', '{', ',', '-'])
    })
}

/// Whether `key`, at the top level, is one of the file's own that toolmux ignores: `x-`
/// and more (`x-common`), as Docker Compose's extension fields.
pub(super) fn is_extension_key(key: &str) -> bool {
    key.len() > 2 && key.starts_with("x-")
}

/// Whether YAML `text` may use merge keys (`<<:`).
fn has_merge_keys(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim_start().trim_start_matches("- ");
        line.starts_with("<<:") || line.contains("{<<:") || line.contains(", <<:")
    })
}

/// Refuses a key given twice in one object (`mcpServers.a` twice): serde keeps the last
/// silently, and the first vanished. TOML's reader refuses them itself.
fn check_unique_keys(text: &str, format: FileFormat) -> Result<(), Located> {
    use serde::Deserialize as _;
    match format {
        FileFormat::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            unique::Unique::deserialize(&mut de).map(drop).map_err(|e| json_error(&e))
        }
        FileFormat::Yaml => {
            serde_yaml_ng::from_str::<unique::Unique>(text).map(drop).map_err(|e| {
                let mut located = yaml_error(&e);
                // The YAML parser places the error at the mapping's start (1:1 for the top
                // level): the key's second occurrence is what to look at.
                if let Some(position) = located.position
                    && let Some(key) = unique::twice(&located.message)
                {
                    located.position = second_key(text, position, key).or(Some(position));
                }
                located
            })
        }
        FileFormat::Toml => Ok(()),
    }
}

/// The first key JSON `text` gives twice in one object, nested ones included, with the
/// line and column where serde stood when it met it again; `None` when every key is given
/// once, or `text` is no JSON (its own reading says why).
pub fn duplicate_json_key(text: &str) -> Option<(String, usize, usize)> {
    let e = serde_json::from_str::<unique::Unique>(text).err()?;
    let key = unique::twice(&e.to_string())?.to_owned();
    Some((key, e.line(), e.column()))
}

/// Line and column of the second occurrence of `key` in the block mapping of YAML `text`
/// whose first key stands at `start`: the lines at its indentation, until one less indented.
/// `None` when not found so (a flow mapping, a key written in quotes of another kind).
fn second_key(text: &str, start: (usize, usize), key: &str) -> Option<(usize, usize)> {
    let (line, column) = start;
    let indent = column - 1;
    let forms = [format!("{key}:"), format!("\"{key}\":"), format!("'{key}':")];
    let mut seen = 0;
    for (i, text_line) in text.lines().enumerate().skip(line - 1) {
        let content = text_line.trim_start_matches([' ', '-']);
        let at = text_line.len() - content.len();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        if i + 1 > line && at < indent {
            return None;
        }
        if at == indent && forms.iter().any(|form| content.starts_with(form.as_str())) {
            seen += 1;
            if seen == 2 {
                return Some((i + 1, column));
            }
        }
    }
    None
}

/// A document read only to find keys given twice in an object ([`check_unique_keys`]).
mod unique {
    use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::collections::HashSet;
    use std::fmt;

    pub(super) struct Unique;

    impl<'de> Deserialize<'de> for Unique {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
            d.deserialize_any(Walk)
        }
    }

    struct Walk;

    impl<'de> Visitor<'de> for Walk {
        type Value = Unique;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any value")
        }

        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_none<E: de::Error>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Unique, D::Error> {
            Unique::deserialize(d)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
            while seq.next_element::<Unique>()?.is_some() {}
            Ok(Unique)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            let mut seen = HashSet::new();
            while let Some(key) = map.next_key::<Key>()? {
                // YAML's merge key may well come twice (`<<: [*a]` is one); it is no setting.
                if key.0 != "<<" && !seen.insert(key.0.clone()) {
                    return Err(de::Error::custom(format!(
                        "key `{}` is given twice in one object: keep one (the last would win)",
                        key.0
                    )));
                }
                map.next_value::<Unique>()?;
            }
            Ok(Unique)
        }
    }

    /// The key the message of a key given twice names.
    pub(super) fn twice(message: &str) -> Option<&str> {
        let rest = &message[message.find("key `")? + "key `".len()..];
        let (key, rest) = rest.split_once('`')?;
        rest.starts_with(" is given twice").then_some(key)
    }

    /// A key's text, whatever scalar it is.
    struct Key(String);

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
            d.deserialize_any(KeyText)
        }
    }

    struct KeyText;

    impl<'de> Visitor<'de> for KeyText {
        type Value = Key;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a key")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
            Ok(Key(v.to_owned()))
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
            Ok(Key(v.to_string()))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
            Ok(Key(v.to_string()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
            Ok(Key(v.to_string()))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
            Ok(Key(v.to_string()))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
            Ok(Key("null".to_owned()))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Key, A::Error> {
            while seq.next_element::<Unique>()?.is_some() {}
            Ok(Key(String::from("[..]")))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Key, A::Error> {
            while map.next_entry::<Unique, Unique>()?.is_some() {}
            Ok(Key(String::from("{..}")))
        }
    }
}

// Only other programs' files (feature `mcp`) are read without the path.
#[cfg(feature = "mcp")]
fn typed<T: DeserializeOwned>(text: &str, format: FileFormat) -> Result<T, Located> {
    typed_at(text, format).map_err(|(_, located)| located)
}

/// [`typed`], with the path of the value at fault (`queues.q.concurrent`).
fn typed_at<T: DeserializeOwned>(text: &str, format: FileFormat) -> Result<T, (String, Located)> {
    let (path, mut located) = match format {
        FileFormat::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            match serde_path_to_error::deserialize(&mut de) {
                Ok(value) => return Ok(value),
                Err(e) => (e.path().to_string(), json_error(e.inner())),
            }
        }
        FileFormat::Yaml => {
            let de = serde_yaml_ng::Deserializer::from_str(text);
            match serde_path_to_error::deserialize(de) {
                Ok(value) => return Ok(value),
                Err(e) => {
                    let path = e.path().to_string();
                    let mut located = yaml_error(e.inner());
                    // serde_yaml_ng puts its own path (the key's, or its parent's for an
                    // unknown key) before the message; ours comes from serde_path_to_error.
                    let parent = path.rsplit_once('.').map_or("", |(p, _)| p);
                    for prefix in [path.as_str(), parent] {
                        if let Some(rest) = located.message.strip_prefix(&format!("{prefix}: ")) {
                            located.message = rest.to_owned();
                            break;
                        }
                    }
                    (path, located)
                }
            }
        }
        FileFormat::Toml => {
            let value = parse(text, format).map_err(|e| (String::new(), e))?;
            match serde_path_to_error::deserialize(value) {
                Ok(value) => return Ok(value),
                Err(e) => {
                    let path = e.path().to_string();
                    let position = super::toml::position(text, &path);
                    (path, Located { position, message: strip_position(&e.inner().to_string()) })
                }
            }
        }
    };
    located.message = describe(&path, &located.message);
    Err((path, located))
}

fn json_error(e: &serde_json::Error) -> Located {
    let position = (e.line() > 0).then(|| (e.line(), e.column()));
    Located { position, message: strip_position(&e.to_string()) }
}

fn yaml_error(e: &serde_yaml_ng::Error) -> Located {
    let position = e.location().map(|l| (l.line(), l.column()));
    Located { position, message: strip_position(&e.to_string()) }
}

/// A serde message without the ` at line L column C` its format adds (at the end, and
/// sometimes inside, as YAML's "while parsing" messages do): the position is shown first.
fn strip_position(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find(" at line ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + " at line ".len()..];
        let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let line_len = digits(after);
        let tail = &after[line_len..];
        match tail.strip_prefix(" column ") {
            Some(col) if line_len > 0 && digits(col) > 0 => rest = &col[digits(col)..],
            _ => {
                out.push_str(" at line ");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A typed-model error at `path` (`mcpServers.github.comand`, `.` for the top), told the
/// way a person fixes it: which key, where, and the closest valid one.
/// toolmux's key for what other tools' files call `unknown` (`api` for a model's `type`,
/// Gemini's `includeTools` for `toolsAllowed`), when it is among `expected`.
fn known_as<'a>(unknown: &str, expected: &[&'a str]) -> Option<&'a str> {
    const OTHER_NAMES: [(&str, &str); 10] = [
        ("api", "type"),
        ("provider", "type"),
        ("transportType", "type"),
        ("allowedTools", "toolsAllowed"),
        ("includeTools", "toolsAllowed"),
        ("enabledTools", "toolsAllowed"),
        ("excludeTools", "toolsDenied"),
        ("disabledTools", "toolsDenied"),
        ("base_url", "baseUrl"),
        ("api_key", "apiKey"),
    ];
    let (_, ours) = OTHER_NAMES.iter().find(|(theirs, _)| *theirs == unknown)?;
    expected.iter().copied().find(|key| key == ours)
}

pub(super) fn describe(path: &str, message: &str) -> String {
    // Keys and values of the file are quoted in messages.
    words::printable(&describe_unescaped(path, message)).into_owned()
}

fn describe_unescaped(path: &str, message: &str) -> String {
    if let Some((unknown, expected)) = unknown_field(message) {
        // serde_path_to_error's path ends with the unknown key itself.
        let parent = path.strip_suffix(unknown).map(|p| p.trim_end_matches('.')).unwrap_or(path);
        if parent == "hooks" {
            return format!(
                "unknown hook event `{unknown}` in hooks; toolmux runs {} hooks (Claude Code's \
                 other events have no counterpart here)",
                expected.join(", ")
            );
        }
        let place = if parent.is_empty() || parent == "." {
            "at the top level".to_owned()
        } else {
            format!("in {parent}")
        };
        let hint = match closest(unknown, &expected).or_else(|| known_as(unknown, &expected)) {
            Some(best) => format!("; did you mean `{best}`?"),
            None if expected.is_empty() => String::new(),
            None => format!("; valid keys: {}", expected.join(", ")),
        };
        return format!("unknown key `{unknown}` {place}{hint}");
    }
    if let Some((unknown, expected)) = unknown_variant(message) {
        let hint = match closest(unknown, &expected) {
            Some(best) => format!("; did you mean `{best}`?"),
            None => format!("; expected one of: {}", expected.join(", ")),
        };
        return format!("unknown value `{unknown}` for {path}{hint}");
    }
    let message = words::in_words(path, message).unwrap_or_else(|| message.to_owned());
    if path.is_empty() || path == "." { message } else { format!("{path}: {message}") }
}

/// The key and the valid keys of serde's "unknown field `x`, expected one of `a`, `b`".
fn unknown_field(message: &str) -> Option<(&str, Vec<&str>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, rest) = rest.split_once('`')?;
    Some((key, backticked(rest)))
}

/// The value and the valid values of serde's "unknown variant `x`, expected `a` or `b`".
fn unknown_variant(message: &str) -> Option<(&str, Vec<&str>)> {
    let rest = message.strip_prefix("unknown variant `")?;
    let (value, rest) = rest.split_once('`')?;
    Some((value, backticked(rest)))
}

fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Line and column of the first `${variable…}` (`${variable}`, or followed by one of the
/// shell's operators) or `${env:variable}` in `text` that is not on a comment line (`#`,
/// `//`).
fn reference_position(text: &str, variable: &str) -> Option<(usize, usize)> {
    let starts = [format!("${{{variable}"), format!("${{env:{variable}}}")];
    let offset = starts
        .iter()
        .flat_map(|f| {
            text.match_indices(f.as_str()).map(|(at, form)| (at, at + form.len())).filter(
                |&(_, end)| {
                    let next = text[end..].chars().next();
                    next.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
                },
            )
        })
        .map(|(at, _)| at)
        .filter(|&at| !commented(text, at))
        .min()?;
    Some(super::toml::line_column(text, offset))
}

/// Line and column of the first `needle` in `text` that is not on a comment line.
fn text_position(text: &str, needle: &str) -> Option<(usize, usize)> {
    let offset = text.match_indices(needle).map(|(at, _)| at).find(|&at| !commented(text, at))?;
    Some(super::toml::line_column(text, offset))
}

/// Whether `offset` in `text` is on a comment line (`#`, `//`).
fn commented(text: &str, offset: usize) -> bool {
    let line = text[..offset].rsplit('\n').next().unwrap_or_default().trim_start();
    line.starts_with('#') || line.starts_with("//")
}

mod checks;
#[cfg(feature = "mcp")]
mod codex;
#[cfg(feature = "mcp")]
mod foreign;
mod nesting;
#[cfg(all(feature = "mcp", feature = "fs"))]
mod seed_tools;
mod shape;
pub(super) mod words;

// The tests load files with every section, so they need every provider's feature.
#[cfg(all(test, feature = "fs", feature = "mcp", feature = "rest"))]
mod tests;
