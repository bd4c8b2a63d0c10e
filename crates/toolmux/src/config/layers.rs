//! Configuration in layers: the user's file under every project's, an administrator's
//! managed file over both, and more project files over the first when several are given
//! (`--config tools.yml --config mcp.yml`, the seeds' layout of one file per kind).
//!
//! Each file is read and checked on its own (its errors name it, with their line), then
//! the settings as written are merged, higher layers over lower ones:
//! - the rules of `permissions` (`allow`, `deny`, `ask`) and the groups of each `hooks`
//!   event add up, lowest layer first: a deny rule or a hook of any layer holds;
//! - every other section merges key by key (a server, a model, an agent, a default), the
//!   higher layer's value replacing the lower's whole;
//! - `$schema` and `inputs` are the project file's own.
//!
//! Relative paths in the user's and the managed file are taken from that file's folder
//! (`fs.root`, `outputDir`, a server's `cwd`, `envFile` or `./command`, an OpenAPI `spec`, a
//! hook's `./script`), so that they mean the same in every project; the project's stay
//! relative to the project's folder, as when it is loaded alone.

use super::Loaded;
use super::load::{QueuePlace, QueuePlaces, check_queues, read, undefined_queue};
use crate::ToolmuxError;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Which layer a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LayerKind {
    /// The user's own settings, under every project's (`~/.config/toolmux/config.yaml`).
    User,
    /// The project's file (`--config`, `TOOLMUX_CONFIG`, `./toolmux.yaml`).
    Project,
    /// A project file given after the first (`--config a.yaml --config b.yaml`), over it.
    Added,
    /// An administrator's settings, over everyone's (`/etc/toolmux/managed.yaml`).
    Managed,
}

impl LayerKind {
    /// The layer's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::User => "user",
            LayerKind::Project => "project",
            LayerKind::Added => "added",
            LayerKind::Managed => "managed",
        }
    }
}

/// One file of a layered configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    /// Its layer.
    pub kind: LayerKind,
    /// Its absolute path.
    pub path: PathBuf,
}

/// The files under and over the project's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layers {
    /// The user's file, when there is one.
    pub user: Option<PathBuf>,
    /// The managed file, when there is one.
    pub managed: Option<PathBuf>,
    /// Project files given after the first, merged over it in order.
    pub added: Vec<PathBuf>,
}

/// Where administrators put the managed file.
pub const MANAGED_DIR: &str = "/etc/toolmux";

/// The names the user's file may have in its folder, in order.
pub const USER_FILE_NAMES: [&str; 3] = ["config.yaml", "config.yml", "config.json"];

/// The names the managed file may have in [`MANAGED_DIR`], in order.
pub const MANAGED_FILE_NAMES: [&str; 3] = ["managed.yaml", "managed.yml", "managed.json"];

impl Layers {
    /// No layers but the project's.
    pub fn none() -> Layers {
        Layers::default()
    }

    /// The files that exist, found from the environment `env`:
    /// - the user's: `TOOLMUX_USER_CONFIG` (a file; empty for none), else `config.yaml`,
    ///   `config.yml` or `config.json` in `$XDG_CONFIG_HOME/toolmux` or
    ///   `$HOME/.config/toolmux`;
    /// - the managed one: `managed.yaml`, `managed.yml` or `managed.json` in
    ///   [`MANAGED_DIR`]. Only debug builds (the tests') read `TOOLMUX_MANAGED_CONFIG`
    ///   instead: a released binary's managed file cannot be switched off by whoever
    ///   starts it.
    ///
    /// Two or more of a layer's names in its folder (`config.yaml` beside `config.json`)
    /// are an error naming them: one would be read and the others passed over without a
    /// word, and a person editing one of those would see nothing change.
    pub fn discover(env: &dyn Fn(&str) -> Option<String>) -> Result<Layers, ToolmuxError> {
        let user = match env("TOOLMUX_USER_CONFIG") {
            Some(path) if path.is_empty() => None,
            Some(path) => Some(PathBuf::from(path)),
            None => {
                let config_home = env("XDG_CONFIG_HOME")
                    .filter(|dir| Path::new(dir).is_absolute())
                    .map(PathBuf::from)
                    .or_else(|| env("HOME").map(|home| Path::new(&home).join(".config")));
                match config_home {
                    Some(dir) => {
                        only_file(&dir.join("toolmux"), &USER_FILE_NAMES, LayerKind::User)?
                    }
                    None => None,
                }
            }
        };
        let managed = match cfg!(debug_assertions).then(|| env("TOOLMUX_MANAGED_CONFIG")) {
            Some(Some(path)) if path.is_empty() => None,
            Some(Some(path)) => Some(PathBuf::from(path)),
            _ => only_file(Path::new(MANAGED_DIR), &MANAGED_FILE_NAMES, LayerKind::Managed)?,
        };
        Ok(Layers { user, managed, added: Vec::new() })
    }
}

/// The one file of `names` in `dir` (the files of the layer `kind`), `None` when there is
/// none, and an error naming them all when there are more.
fn only_file(dir: &Path, names: &[&str], kind: LayerKind) -> Result<Option<PathBuf>, ToolmuxError> {
    let found: Vec<&str> = names.iter().copied().filter(|name| dir.join(name).is_file()).collect();
    let [first, ..] = found[..] else {
        return Ok(None);
    };
    if found.len() == 1 {
        return Ok(Some(dir.join(first)));
    }
    let others = found[1..].iter().map(|name| format!("`{name}`")).collect::<Vec<_>>();
    let choose = match kind {
        LayerKind::User => ", or name the one to read with TOOLMUX_USER_CONFIG",
        _ => "",
    };
    Err(ToolmuxError::config(
        &format!("{} ({} configuration)", dir.join(first).display(), kind.name()),
        format!(
            "{} {} in this folder too, and toolmux reads one {} configuration file only: keep \
             one of them (move what the others set into it and remove them){choose}",
            others.join(" and "),
            if others.len() == 1 { "is" } else { "are" },
            kind.name(),
        ),
    ))
}

/// Reads the project's configuration file `project` (absolute; `None` when there is none)
/// and merges it over the user's file and under the managed one of `layers` (see the
/// module documentation). Files are shown in messages relative to `cwd` when under it.
///
/// Without a project file the read-only file tools on `cwd` are the bottom layer, as
/// [`Loaded::without_file`] has them; the user's file may change them.
pub fn load_layered(
    project: Option<&Path>,
    cwd: &Path,
    layers: &Layers,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ToolmuxError> {
    let shown = |path: &Path| path.strip_prefix(cwd).unwrap_or(path).display().to_string();
    let (mut loaded, value, queues) = match project {
        Some(path) => read(path, &shown(path), env)?,
        None => {
            let loaded = Loaded::without_file(cwd);
            let value = serde_json::to_value(&loaded.config).unwrap_or(Value::Null);
            (loaded, value, QueuePlaces::new())
        }
    };
    if layers.user.is_none() && layers.managed.is_none() && layers.added.is_empty() {
        check_queues(&loaded, &queues)?;
        return Ok(loaded);
    }
    // The project's part: without a file, the defaults for no file, under the user's.
    let own = Part {
        layer: loaded.layers.first().cloned(),
        value,
        queues,
        secrets: std::mem::take(&mut loaded.secrets),
        warnings: std::mem::take(&mut loaded.warnings),
    };
    let mut parts = Vec::with_capacity(3);
    if loaded.path.is_none() {
        parts.push(own);
        parts.extend(Part::read(LayerKind::User, layers.user.as_deref(), cwd, env)?);
    } else {
        parts.extend(Part::read(LayerKind::User, layers.user.as_deref(), cwd, env)?);
        parts.push(own);
    }
    for added in &layers.added {
        parts.extend(Part::read(LayerKind::Added, Some(added), cwd, env)?);
    }
    parts.extend(Part::read(LayerKind::Managed, layers.managed.as_deref(), cwd, env)?);

    let mut merged = Map::new();
    // The file, as errors name it, and the place of the `queue` of each entry, from the
    // layer that set the entry.
    let mut queue_places = std::collections::BTreeMap::<String, (String, QueuePlace)>::new();
    for part in parts {
        let own = part.layer.as_ref().is_none_or(|l| l.kind == LayerKind::Project);
        let value = normalized(part.value);
        // Which file set each entry of a section (a server, an import), for the messages
        // about it; the project file's need no note (it is the one named by default).
        let origin = part.layer.as_ref().filter(|_| !own).map(|layer| shown(&layer.path));
        let named = part.layer.as_ref().map_or_else(
            || loaded.source_name().to_owned(),
            |layer| match layer.kind {
                LayerKind::Project => shown(&layer.path),
                kind => format!("{} ({} configuration)", shown(&layer.path), kind.name()),
            },
        );
        for (section, entries) in &value {
            for key in entries.as_object().into_iter().flat_map(Map::keys) {
                let entry = format!("{section}.{key}");
                let place = part.queues.get(&entry).cloned().unwrap_or_default();
                queue_places.insert(entry.clone(), (named.clone(), place));
                match &origin {
                    Some(file) => loaded.origins.insert(entry, file.clone()),
                    None => loaded.origins.remove(&entry),
                };
            }
        }
        merge(&mut merged, value, own);
        loaded.layers.extend(part.layer.filter(|l| l.kind != LayerKind::Project));
        loaded.secrets.extend(part.secrets);
        loaded.warnings.extend(part.warnings);
    }
    loaded.layers.sort_by_key(|l| l.kind);
    loaded.secrets.sort();
    loaded.secrets.dedup();
    loaded.config = serde_path_to_error::deserialize(Value::Object(merged)).map_err(|e| {
        let files: Vec<String> = loaded
            .layers
            .iter()
            .map(|l| format!("{} ({})", shown(&l.path), l.kind.name()))
            .collect();
        ToolmuxError::Config {
            file: files.join(" + "),
            line: None,
            column: None,
            message: format!(
                "the merged settings do not fit together: {}",
                super::load::describe(&e.path().to_string(), &e.inner().to_string())
            ),
        }
    })?;
    undefined_queue(&loaded.config, &|section, name| {
        queue_places
            .get(&format!("{section}.{name}"))
            .cloned()
            .unwrap_or_else(|| (loaded.source_name().to_owned(), QueuePlace::default()))
    })?;
    Ok(loaded)
}

/// One layer's settings as written, and what came with them.
struct Part {
    /// Its file; `None` for the defaults used without a project file.
    layer: Option<Layer>,
    value: Value,
    /// Where its settings name queues.
    queues: QueuePlaces,
    secrets: Vec<String>,
    warnings: Vec<String>,
}

impl Part {
    /// The user's or the managed file at `path` (relative to `cwd`), its relative paths
    /// made absolute; `None` without one.
    fn read(
        kind: LayerKind,
        path: Option<&Path>,
        cwd: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Part>, ToolmuxError> {
        let Some(path) = path else { return Ok(None) };
        let path = cwd.join(path);
        let shown = path.strip_prefix(cwd).unwrap_or(&path).display().to_string();
        let (loaded, mut value, queues) =
            read(&path, &shown, env).map_err(|e| in_layer(e, kind))?;
        let dir = path.parent().map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
        anchor_paths(&mut value, &dir);
        Ok(Some(Part {
            layer: Some(Layer { kind, path }),
            value,
            queues,
            secrets: loaded.secrets,
            warnings: loaded.warnings,
        }))
    }
}

/// A layer's error, saying which layer the file is.
fn in_layer(error: ToolmuxError, kind: LayerKind) -> ToolmuxError {
    match error {
        ToolmuxError::Config { file, line, column, message } => ToolmuxError::Config {
            file: format!("{file} ({} configuration)", kind.name()),
            line,
            column,
            message,
        },
        ToolmuxError::Read { file, source } => {
            ToolmuxError::Read { file: format!("{file} ({} configuration)", kind.name()), source }
        }
        other => other,
    }
}

/// A layer's settings with the keys that have two spellings spelled one way, so that two
/// layers' spellings do not meet as a duplicate key.
fn normalized(value: Value) -> Map<String, Value> {
    let Value::Object(mut map) = value else { return Map::new() };
    if let Some(servers) = map.remove("servers") {
        merge_section(&mut map, "mcpServers", servers);
    }
    if let Some(Value::Object(defaults)) = map.get_mut("defaults")
        && let Some(trace) = defaults.remove("traceMcp")
    {
        defaults.insert("traceMCP".to_owned(), trace);
    }
    map
}

/// Merges the settings `higher` over `merged` (see the module documentation); `own`: the
/// project's (or the defaults for no file), whose `$schema` and `inputs` are kept.
fn merge(merged: &mut Map<String, Value>, higher: Map<String, Value>, own: bool) {
    for (key, value) in higher {
        match key.as_str() {
            "$schema" | "inputs" if !own => {}
            "permissions" | "hooks" => {
                let Value::Object(lists) = value else {
                    merged.insert(key, value);
                    continue;
                };
                let section = merged.entry(key).or_insert_with(|| Value::Object(Map::new()));
                let Value::Object(section) = section else { continue };
                for (list, items) in lists {
                    match (section.get_mut(&list), items) {
                        (Some(Value::Array(lower)), Value::Array(items)) => {
                            for item in items {
                                if !lower.contains(&item) {
                                    lower.push(item);
                                }
                            }
                        }
                        (_, items) => {
                            section.insert(list, items);
                        }
                    }
                }
            }
            _ => merge_section(merged, &key, value),
        }
    }
}

/// `value` over the section `key` of `merged`: key by key when both are objects, else
/// whole.
fn merge_section(merged: &mut Map<String, Value>, key: &str, value: Value) {
    match (merged.get_mut(key), value) {
        (Some(Value::Object(lower)), Value::Object(higher)) => lower.extend(higher),
        (_, value) => {
            merged.insert(key.to_owned(), value);
        }
    }
}

/// The relative paths of a user's or managed file's settings made absolute against the
/// file's folder `dir`.
fn anchor_paths(value: &mut Value, dir: &Path) {
    let anchor = |value: &mut Value| {
        if let Value::String(path) = value
            && Path::new(path.as_str()).is_relative()
        {
            *path = dir.join(path.as_str()).display().to_string();
        }
    };
    let Value::Object(settings) = value else { return };
    if let Some(Value::Object(defaults)) = settings.get_mut("defaults") {
        for key in ["outputDir", "auditLog", "statsFile"] {
            defaults.get_mut(key).map(anchor);
        }
    }
    if let Some(Value::Object(fs)) = settings.get_mut("fs") {
        fs.get_mut("root").map(anchor);
        if let Some(Value::Object(bash)) = fs.get_mut("bash") {
            bash.get_mut("spillDir").map(anchor);
        }
    }
    if let Some(Value::Object(spaces)) = settings.get_mut("spaces") {
        spaces.get_mut("dir").map(anchor);
    }
    for servers in ["mcpServers", "servers"] {
        let Some(Value::Object(servers)) = settings.get_mut(servers) else { continue };
        for server in servers.values_mut() {
            let Value::Object(server) = server else { continue };
            server.get_mut("cwd").map(anchor);
            server.get_mut("envFile").map(anchor);
            if let Some(command) = server.get_mut("command")
                && command.as_str().is_some_and(starts_relative)
            {
                anchor(command);
            }
        }
    }
    if let Some(Value::Object(imports)) = settings.get_mut("openapi") {
        for import in imports.values_mut() {
            if let Value::Object(import) = import {
                import.get_mut("spec").map(anchor);
            }
        }
    }
    if let Some(Value::Object(tools)) = settings.get_mut("commandTools") {
        for tool in tools.values_mut() {
            let Some(command) = tool.get_mut("command") else { continue };
            match command {
                Value::Array(argv) => {
                    let programs = argv.iter_mut().take(2);
                    for word in programs.filter(|w| w.as_str().is_some_and(starts_relative)) {
                        anchor(word);
                    }
                }
                Value::String(line) if starts_relative(line) => {
                    *line = format!("{}/{line}", quoted(dir));
                }
                _ => {}
            }
        }
    }
    if let Some(Value::Object(events)) = settings.get_mut("hooks") {
        let groups = events.values_mut().filter_map(Value::as_array_mut).flatten();
        let hooks = groups.filter_map(|g| g.get_mut("hooks")?.as_array_mut()).flatten();
        for hook in hooks {
            let Some(Value::String(command)) = hook.get_mut("command") else { continue };
            if starts_relative(command) {
                *command = format!("{}/{command}", quoted(dir));
            }
        }
    }
}

/// Whether a command names a program by a path relative to the folder it runs in.
fn starts_relative(command: &str) -> bool {
    command.starts_with("./") || command.starts_with("../")
}

/// `dir` quoted for `sh`.
fn quoted(dir: &Path) -> String {
    format!("'{}'", dir.display().to_string().replace('\'', r"'\''"))
}

// The files use every section, so the tests need every provider's feature.
#[cfg(all(test, feature = "fs", feature = "mcp", feature = "rest"))]
mod tests {
    use super::*;
    use expect_test::expect;

    /// Three folders with a file each: the user's, the project's and the managed one.
    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Files {
            Files { dir: tempfile::tempdir().expect("temporary folder") }
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let path = self.dir.path().join(name);
            std::fs::create_dir_all(path.parent().expect("a folder")).expect("folder");
            std::fs::write(&path, text).expect("written");
            path
        }

        fn path(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }
    }

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "tok-from-the-environment".to_owned())
    }

    #[test]
    fn the_project_merges_over_the_user_and_under_the_managed_file() {
        let files = Files::new();
        let user = files.write(
            "home/.config/toolmux/config.yaml",
            r"
defaults: {toolTimeout: 5000, traceMcp: true, outputDir: out}
mcpServers:
  shared: {command: ./bin/shared, cwd: work}
  mine: {command: node, env: {TOKEN: '${TOKEN}'}}
permissions: {deny: [fs__bash], allow: ['fs__*']}
hooks:
  PreToolUse: [{matcher: fs__write, hooks: [{type: command, command: ./guard.sh}]}]
aliases: {g: fs__grep}
",
        );
        let project = files.write(
            "project/toolmux.yaml",
            r"
$schema: ./toolmux.schema.json
defaults: {toolTimeout: 9000}
servers: {shared: {command: python3}}
permissions: {deny: [fs__write, fs__bash]}
hooks:
  PreToolUse: [{matcher: fs__edit, hooks: [{type: command, command: ./check.sh}]}]
fs: {}
",
        );
        let managed = files.write(
            "etc/managed.yaml",
            "$schema: x\npermissions: {deny: ['evil__*']}\ndefaults: {toolTimeout: 60000}\n",
        );
        let layers = Layers { user: Some(user.clone()), managed: Some(managed), added: Vec::new() };
        let loaded = load_layered(Some(&project), files.dir.path(), &layers, &env).unwrap();
        let c = &loaded.config;
        assert_eq!(c.defaults.tool_timeout, Some(60000), "the managed file wins");
        assert!(c.defaults.trace_mcp, "a default only the user set is kept");
        let user_dir = user.parent().unwrap();
        assert_eq!(c.defaults.output_dir.as_deref(), Some(user_dir.join("out").as_path()));
        assert_eq!(c.mcp_servers["shared"].command.as_deref(), Some("python3"), "whole");
        assert_eq!(c.mcp_servers["shared"].cwd, None, "the project's entry replaces the user's");
        assert_eq!(c.mcp_servers["mine"].command.as_deref(), Some("node"));
        assert_eq!(c.permissions.deny, ["fs__bash", "fs__write", "evil__*"]);
        assert_eq!(c.permissions.allow, ["fs__*"]);
        let hooks: Vec<&str> =
            c.hooks.pre_tool_use.iter().flat_map(|g| &g.hooks).map(|h| &*h.command).collect();
        let guard = format!("'{}'/./guard.sh", user_dir.display());
        assert_eq!(hooks, [guard.as_str(), "./check.sh"], "the project's own stay relative");
        assert_eq!(c.aliases["g"], "fs__grep");
        assert_eq!(c.schema.as_deref(), Some("./toolmux.schema.json"), "the project's own");
        assert!(c.fs.is_some());
        assert_eq!(loaded.base_dir, project.parent().unwrap(), "paths of the project's own");
        assert_eq!(loaded.path.as_deref(), Some(project.as_path()));
        let kinds: Vec<LayerKind> = loaded.layers.iter().map(|l| l.kind).collect();
        assert_eq!(kinds, [LayerKind::User, LayerKind::Project, LayerKind::Managed]);
        assert_eq!(loaded.secrets, ["tok-from-the-environment"], "every layer's secrets");
    }

    #[test]
    fn relative_paths_of_a_users_file_are_its_own_folders() {
        let files = Files::new();
        let mut text = r"
defaults: {auditLog: audit.jsonl, statsFile: stats.json}
fs: {root: src, bash: {spillDir: spill}}
mcpServers:
  s: {command: ../bin/server, envFile: .env, cwd: /abs}
  t: {command: npx, args: [./not-a-path]}
openapi:
  pets: {spec: pets.yaml}
commandTools:
  t: {description: x, command: [./bin/tool, ./not-a-program-arg]}
  u: {description: y, command: ./run.sh --fast}
"
        .to_owned();
        // Without the feature, `spaces` is no section a file may have.
        if cfg!(feature = "external") {
            text.push_str("spaces: {dir: spaces}\n");
        }
        let user = files.write("u/config.yaml", &text);
        let layers = Layers { user: Some(user), managed: None, added: Vec::new() };
        let loaded = load_layered(None, Path::new("/somewhere"), &layers, &env).unwrap();
        let c = &loaded.config;
        let dir = files.path("u");
        assert_eq!(c.defaults.audit_log.as_deref(), Some(dir.join("audit.jsonl").as_path()));
        assert!(
            matches!(&c.defaults.stats_file, Some(super::super::StatsFile::Path(p)) if *p == dir.join("stats.json"))
        );
        let fs = c.fs.as_ref().expect("fs");
        assert_eq!(fs.root.as_deref(), Some(dir.join("src").as_path()));
        assert_eq!(fs.bash.spill_dir.as_deref(), Some(dir.join("spill").as_path()));
        let s = &c.mcp_servers["s"];
        assert_eq!(s.command.as_deref(), Some(dir.join("../bin/server").to_str().unwrap()));
        assert_eq!(s.env_file.as_deref(), Some(dir.join(".env").as_path()));
        assert_eq!(s.cwd.as_deref(), Some(Path::new("/abs")));
        let t = &c.mcp_servers["t"];
        assert_eq!(t.command.as_deref(), Some("npx"));
        assert_eq!(t.args, ["./not-a-path"], "arguments are the program's business");
        assert_eq!(c.openapi["pets"].spec.as_deref(), Some(dir.join("pets.yaml").as_path()));
        #[cfg(feature = "external")]
        assert_eq!(
            c.spaces.as_ref().and_then(|s| s.dir.as_deref()),
            Some(dir.join("spaces").as_path())
        );
        let argv = |name: &str| match &c.command_tools[name].command {
            toolmux_fs::CommandLine::Argv(argv) => argv.join(" "),
            toolmux_fs::CommandLine::Shell(line) => line.clone(),
        };
        let program = dir.join("./bin/tool").display().to_string();
        let arg = dir.join("./not-a-program-arg").display().to_string();
        assert_eq!(argv("t"), format!("{program} {arg}"), "the program and its first argument");
        assert_eq!(argv("u"), format!("'{}'/./run.sh --fast", dir.display()));
        assert_eq!(loaded.base_dir, Path::new("/somewhere"), "no project file: the folder run in");
        assert_eq!(loaded.file, None);
    }

    #[test]
    fn without_a_project_file_the_users_file_sits_over_the_read_only_file_tools() {
        let files = Files::new();
        let user = files.write("u/config.yaml", "mcpServers: {a: {command: node}}\n");
        let layers = Layers { user: Some(user), managed: None, added: Vec::new() };
        let loaded = load_layered(None, files.dir.path(), &layers, &env).unwrap();
        assert!(loaded.config.fs.as_ref().is_some_and(|fs| fs.enabled), "the default file tools");
        assert!(loaded.config.mcp_servers.contains_key("a"));
        let user = files.write("v/config.yaml", "fs: {enabled: false}\n");
        let layers = Layers { user: Some(user), managed: None, added: Vec::new() };
        let loaded = load_layered(None, files.dir.path(), &layers, &env).unwrap();
        assert!(loaded.config.fs.as_ref().is_some_and(|fs| !fs.enabled), "the user's word");
        // And with no layer at all, exactly what no file means.
        let alone = load_layered(None, files.dir.path(), &Layers::none(), &env).unwrap();
        assert_eq!(alone.config, Loaded::without_file(files.dir.path()).config);
        assert!(alone.layers.is_empty());
    }

    #[test]
    fn a_layers_error_names_its_file_line_and_layer() {
        let files = Files::new();
        let project = files.write("p/toolmux.yaml", "fs: {}\n");
        let user = files.write("u/config.yaml", "defaults:\n  toolTimeuot: 5\n");
        let layers = Layers { user: Some(user), managed: None, added: Vec::new() };
        let e = load_layered(Some(&project), files.dir.path(), &layers, &env).unwrap_err();
        expect![[
            "u/config.yaml (user configuration):2:3: unknown key `toolTimeuot` in defaults; did you mean `toolTimeout`?"
        ]]
        .assert_eq(&e.to_string());
        let managed = files.write("m/managed.yaml", "permissions: {deny: '${UNSET}'}\n");
        let layers = Layers { user: None, managed: Some(managed), added: Vec::new() };
        let e = load_layered(Some(&project), files.dir.path(), &layers, &env).unwrap_err();
        assert!(e.to_string().starts_with("m/managed.yaml (managed configuration):"), "{e}");
        let layers =
            Layers { user: Some(files.path("gone.yaml")), managed: None, added: Vec::new() };
        let e = load_layered(Some(&project), files.dir.path(), &layers, &env).unwrap_err();
        assert!(e.to_string().contains("gone.yaml (user configuration)"), "{e}");
    }

    /// A queue a server names may be defined in another layer; one defined in none is
    /// told in the file that set the server, at the line of its `queue`, with the closest
    /// defined queue, where the error had neither file nor line and came only as the tools
    /// were assembled.
    #[test]
    fn an_undefined_queue_is_told_in_the_file_that_named_it() {
        let files = Files::new();
        let user = files.write(
            "u/config.yaml",
            "queues:\n  fast: {concurrent: 2}\nmcpServers:\n  a:\n    command: x\n    queue: fats\n",
        );
        let project =
            files.write("p/toolmux.yaml", "mcpServers:\n  b: {command: y, queue: fast}\n");
        let layers = Layers { user: Some(user), managed: None, added: Vec::new() };
        let e = load_layered(Some(&project), files.dir.path(), &layers, &env).unwrap_err();
        expect![[
            "u/config.yaml (user configuration):6:12: mcpServers.a.queue: queue `fats` is not defined under `queues`; did you mean `fast`?"
        ]]
        .assert_eq(&e.to_string());
        // The project's entry replaces the user's whole: its queue is the one checked.
        let project = files.write(
            "p/toolmux.yaml",
            "mcpServers:\n  a: {command: y}\n  b:\n    command: y\n    queue: slow\n",
        );
        let e = load_layered(Some(&project), files.dir.path(), &layers, &env).unwrap_err();
        expect![[
            "p/toolmux.yaml:5:12: mcpServers.b.queue: queue `slow` is not defined under `queues`; the queues defined are fast"
        ]]
        .assert_eq(&e.to_string());
        // A queue the user's file defines serves the project's server.
        let project =
            files.write("p/toolmux.yaml", "mcpServers:\n  a: {command: y, queue: fast}\n");
        let loaded = load_layered(Some(&project), files.dir.path(), &layers, &env).unwrap();
        assert_eq!(loaded.config.mcp_servers["a"].queue.as_deref(), Some("fast"));
        // The project's file alone, without the layer that defines it.
        let e = load_layered(Some(&project), files.dir.path(), &Layers::none(), &env).unwrap_err();
        expect!["p/toolmux.yaml:2:26: mcpServers.a.queue: queue `fast` is not defined under `queues`; no queue is defined: add one under `queues`, as in `queues: {fast: {concurrent: 4}}`"]
        .assert_eq(&e.to_string());
    }

    #[test]
    fn the_files_are_found_from_the_environment() {
        let files = Files::new();
        let home = files.path("home");
        let in_home = files.write("home/.config/toolmux/config.json", "{}");
        let xdg = files.write("xdg/toolmux/config.yml", "{}");
        let find = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> =
                vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
            Layers::discover(&move |name| {
                vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
            })
            .expect("one file a folder")
            .user
        };
        let home_var = home.to_str().unwrap();
        assert_eq!(find(&[("HOME", home_var)]), Some(in_home.clone()));
        let xdg_var = files.path("xdg");
        let xdg_var = xdg_var.to_str().unwrap();
        assert_eq!(find(&[("HOME", home_var), ("XDG_CONFIG_HOME", xdg_var)]), Some(xdg));
        assert_eq!(
            find(&[("HOME", home_var), ("XDG_CONFIG_HOME", "relative")]),
            Some(in_home),
            "a relative XDG_CONFIG_HOME is ignored, as the specification says"
        );
        assert_eq!(find(&[("HOME", home_var), ("TOOLMUX_USER_CONFIG", "")]), None);
        assert_eq!(find(&[("TOOLMUX_USER_CONFIG", "/x/y.yaml")]), Some(PathBuf::from("/x/y.yaml")));
        assert_eq!(find(&[("HOME", "/nowhere")]), None);
        let managed = |value: &str| {
            let value = value.to_owned();
            Layers::discover(&move |name| (name == "TOOLMUX_MANAGED_CONFIG").then(|| value.clone()))
                .expect("a file named")
                .managed
        };
        assert_eq!(managed("/etc/m.yaml"), Some(PathBuf::from("/etc/m.yaml")), "debug builds");
        assert_eq!(managed(""), None);
    }

    /// Two or more of the user's or the managed file's names in their folder are an error
    /// naming them, where the first was read and the others passed over without a word.
    #[test]
    fn two_files_of_one_layer_are_an_error() {
        let files = Files::new();
        files.write("home/.config/toolmux/config.yaml", "{}");
        files.write("home/.config/toolmux/config.json", "{}");
        let home = files.path("home");
        let home = home.to_str().unwrap().to_owned();
        let e = Layers::discover(&move |name| (name == "HOME").then(|| home.clone())).unwrap_err();
        let dir = files.path("home/.config/toolmux");
        assert_eq!(
            e.to_string(),
            format!(
                "{}/config.yaml (user configuration): `config.json` is in this folder too, and \
                 toolmux reads one user configuration file only: keep one of them (move what the \
                 others set into it and remove them), or name the one to read with \
                 TOOLMUX_USER_CONFIG",
                dir.display()
            )
        );
        files.write("etc/managed.yaml", "{}");
        files.write("etc/managed.yml", "{}");
        files.write("etc/managed.json", "{}");
        let e = only_file(&files.path("etc"), &MANAGED_FILE_NAMES, LayerKind::Managed).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}/managed.yaml (managed configuration): `managed.yml` and `managed.json` are in \
                 this folder too, and toolmux reads one managed configuration file only: keep one \
                 of them (move what the others set into it and remove them)",
                files.path("etc").display()
            )
        );
        std::fs::remove_file(files.path("etc/managed.yml")).unwrap();
        std::fs::remove_file(files.path("etc/managed.json")).unwrap();
        let one = only_file(&files.path("etc"), &MANAGED_FILE_NAMES, LayerKind::Managed).unwrap();
        assert_eq!(one, Some(files.path("etc/managed.yaml")));
    }
}
