//! The specification seeds' `tools.yml`: internal tools as Python functions
//! (`tools: [{name, description, module, function, parameters_schema, ...}]`). Each becomes
//! a command tool (`cmd__NAME`) that runs the function in a Python process: the call's
//! arguments are its keyword arguments, an `async` function is awaited, a string it
//! returns is the result as it is, anything else is written as JSON.
//!
//! The module is imported from the project's root: the nearest folder above the file
//! holding `.git`, `pyproject.toml`, `setup.py`, `setup.cfg` or `requirements.txt`
//! (`src/config/tools.yml` names `src.tools.core.calculator_tool`), else the file's folder.
//! `category`, `speed` (default `medium`) and `safety` (default `native`) become the tool's
//! metadata (`tools.cmd__NAME.meta`: `toolmux/category`, `toolmux/speed`,
//! `toolmux/safety`), listed and served as its `_meta` for the programs that show tools;
//! models are not shown them.

use super::foreign::Converted;
use super::{Located, Source, expand_into, typed};
use crate::ToolmuxError;
use crate::config::Config;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The Python program that runs one tool: `python3 -c RUNNER MODULE FUNCTION`, the
/// arguments as JSON on stdin.
pub(super) const RUNNER: &str = "\
import asyncio, importlib, inspect, json, sys
module, function = sys.argv[1], sys.argv[2]
raw = sys.stdin.read()
arguments = json.loads(raw) if raw.strip() else {}
result = getattr(importlib.import_module(module), function)(**arguments)
if inspect.isawaitable(result):
    async def settle(awaitable):
        return await awaitable
    result = asyncio.run(settle(result))
sys.stdout.write(result if isinstance(result, str) else json.dumps(result, default=str))
";

/// Files that mark a project's root.
const ROOT_MARKERS: &[&str] =
    &[".git", "pyproject.toml", "setup.py", "setup.cfg", "requirements.txt"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeedToolsFile {
    tools: Vec<SeedTool>,
}

/// One internal tool of `tools.yml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeedTool {
    name: String,
    description: String,
    module: String,
    function: String,
    #[serde(default, alias = "parametersSchema", alias = "inputSchema")]
    parameters_schema: Option<Value>,
    #[serde(default)]
    category: Option<String>,
    #[serde(default)]
    speed: Option<String>,
    #[serde(default)]
    safety: Option<String>,
    #[serde(default)]
    source: Option<String>,
}

/// Whether `value` has the seeds' `tools.yml` shape: a top-level `tools` list.
pub(super) fn is_seed_tools(value: &Value) -> bool {
    value.get("tools").is_some_and(Value::is_array)
}

/// Reads the seeds' `tools.yml` as command tools.
pub(super) fn read(value: Value, source: &Source<'_>) -> Result<Converted, ToolmuxError> {
    let located = |e: Located| source.error(e.position, e.message);
    typed::<SeedToolsFile>(source.text, source.format).map_err(located)?;
    let (file, found, _) = expand_into::<SeedToolsFile>(value, source)?;
    let root = project_root(source.base_dir);
    let mut tools = BTreeMap::new();
    let mut entries = BTreeMap::new();
    for (i, tool) in file.tools.into_iter().enumerate() {
        let at = format!("tools[{i}] (`{}`)", tool.name);
        if let Some(other) = tool.source.as_deref().filter(|s| *s != "internal") {
            return Err(source.error(
                None,
                format!(
                    "{at}: source `{other}`: a tools.yml holds internal tools; declare the tools \
                     of an MCP server under its `provides_tools` in mcp.yml"
                ),
            ));
        }
        let valid = |s: &str| {
            !s.is_empty()
                && s.split('.').all(|p| p.chars().all(|c| c.is_alphanumeric() || c == '_'))
        };
        if !valid(&tool.module) || !valid(&tool.function) || tool.function.contains('.') {
            return Err(source.error(
                None,
                format!(
                    "{at}: `module` must be a dotted Python module path and `function` a name \
                     (`src.tools.core.calculator_tool`, `calculate`)"
                ),
            ));
        }
        let meta = super::codex::seed_meta(tool.category, tool.speed, tool.safety, "native");
        entries.insert(
            format!("{}__{}", toolmux_fs::COMMANDS_NAMESPACE, tool.name),
            crate::config::ToolEntry { meta: Some(meta), ..crate::config::ToolEntry::default() },
        );
        if tools.contains_key(&tool.name) {
            return Err(source.error(None, format!("{at}: a second tool named `{}`", tool.name)));
        }
        let command = crate::config::CommandLine::Argv(vec![
            "python3".to_owned(),
            "-c".to_owned(),
            RUNNER.to_owned(),
            tool.module,
            tool.function,
        ]);
        let env = BTreeMap::from([("PYTHONPATH".to_owned(), root.to_string_lossy().into_owned())]);
        let config = crate::config::CommandToolConfig {
            description: tool.description,
            command,
            parameters_schema: tool.parameters_schema,
            env,
            ..crate::config::CommandToolConfig::default()
        };
        tools.insert(tool.name, config);
    }
    Ok(Converted {
        config: Config { command_tools: tools, tools: entries, ..Config::default() },
        warnings: Vec::new(),
        secrets: found.secrets,
        inputs: found.inputs,
        shell: found.shell,
    })
}

/// The nearest folder from `dir` up that holds one of [`ROOT_MARKERS`], else `dir`.
fn project_root(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|d| ROOT_MARKERS.iter().any(|m| d.join(m).exists()))
        .unwrap_or(dir)
        .to_path_buf()
}
