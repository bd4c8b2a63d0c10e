//! Tests of loading: every kind of mistake, told with its file and line.

use super::*;
use expect_test::{Expect, expect};

fn env(name: &str) -> Option<String> {
    match name {
        "GITHUB_TOKEN" => Some("ghp_secret_value".into()),
        "PORT" => Some("8080".into()),
        _ => None,
    }
}

fn load_as(format: FileFormat, text: &str) -> Result<Loaded, ToolmuxError> {
    let name = match format {
        FileFormat::Json => "toolmux.json",
        FileFormat::Yaml => "toolmux.yaml",
    };
    load_str(text, format, name, Path::new("/proj"), &env)
}

fn check_error(format: FileFormat, text: &str, expected: Expect) {
    match load_as(format, text) {
        Ok(loaded) => panic!("loaded: {:?}", loaded.config),
        Err(e) => expected.assert_eq(&e.to_string()),
    }
}

fn yaml_error(text: &str, expected: Expect) {
    check_error(FileFormat::Yaml, text, expected);
}

fn json_error(text: &str, expected: Expect) {
    check_error(FileFormat::Json, text, expected);
}

fn loads(format: FileFormat, text: &str) -> Loaded {
    match load_as(format, text) {
        Ok(loaded) => loaded,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn bad_yaml_syntax() {
    yaml_error(
        "defaults:\n  toolTimeout: 1\n mcpServers: [\n",
        expect![
            "toolmux.yaml:3:2: invalid YAML: did not find expected key, while parsing a block mapping"
        ],
    );
}

#[test]
fn bad_json_syntax() {
    json_error(
        "{\n  \"defaults\": {\"toolTimeout\": 1}\n  \"queues\": {}\n}",
        expect!["toolmux.json:3:3: invalid JSON: expected `,` or `}`"],
    );
}

#[test]
fn unknown_key_suggests_closest() {
    yaml_error(
        "mcpServers:\n  github:\n    comand: npx\n",
        expect![
            "toolmux.yaml:3:5: unknown key `comand` in mcpServers.github; did you mean `command`?"
        ],
    );
    json_error(
        "{\"defaults\": {\"toolTimeoutMs\": 5}}",
        expect![
            "toolmux.json:1:29: unknown key `toolTimeoutMs` in defaults; did you mean `toolTimeout`?"
        ],
    );
    yaml_error(
        "mcpServer:\n  x: {command: a}\n",
        expect![
            "toolmux.yaml:1:1: unknown key `mcpServer` at the top level; did you mean `mcpServers`?"
        ],
    );
}

#[test]
fn unknown_key_without_close_match_lists_valid_keys() {
    yaml_error(
        "queues:\n  q: {concurrent: 1, zzz: 2}\n",
        expect![
            "toolmux.yaml:2:22: unknown key `zzz` in queues.q; valid keys: concurrent, waitTimeoutMs"
        ],
    );
}

#[test]
fn unknown_key_in_embedded_provider_config() {
    yaml_error(
        "fs:\n  bash:\n    allowPrefix: [ls]\n",
        expect![
            "toolmux.yaml:3:5: unknown key `allowPrefix` in fs.bash; did you mean `allowPrefixes`?"
        ],
    );
}

#[test]
fn unknown_key_in_a_declared_tool() {
    yaml_error(
        "mcpServers:\n  a:\n    command: a\n    tools:\n      - name: t\n        inputSchmea: {}\n",
        expect![
            "toolmux.yaml:6:9: unknown key `inputSchmea` in mcpServers.a.tools[0]; did you mean `inputSchema`?"
        ],
    );
}

#[test]
fn bad_type() {
    yaml_error(
        "defaults:\n  toolTimeout: 30s\n",
        expect![[
            r#"toolmux.yaml:2:16: defaults.toolTimeout: invalid type: string "30s", expected u64"#
        ]],
    );
    json_error(
        "{\"queues\": {\"q\": {\"concurrent\": \"many\"}}}",
        expect![[
            r#"toolmux.json:1:38: queues.q.concurrent: invalid type: string "many", expected usize"#
        ]],
    );
}

#[test]
fn bad_enum_value() {
    yaml_error(
        "mcpServers:\n  a:\n    type: stdi\n    command: x\n",
        expect![
            "toolmux.yaml:3:11: unknown value `stdi` for mcpServers.a.type; did you mean `stdio`?"
        ],
    );
}

#[test]
fn missing_field() {
    yaml_error(
        "queues:\n  q: {waitTimeoutMs: 5}\n",
        expect!["toolmux.yaml:2:6: queues.q: missing field `concurrent`"],
    );
}

#[test]
fn unset_variable_names_it_and_the_key() {
    yaml_error(
        "mcpServers:\n  github:\n    command: gh-mcp\n    env:\n      GITHUB_PAT: ${NO_SUCH_TOKEN}\n",
        expect![
            "toolmux.yaml:5:19: unset environment variable NO_SUCH_TOKEN in mcpServers.github.env.GITHUB_PAT (set it, or give a default: ${NO_SUCH_TOKEN:-value})"
        ],
    );
}

#[test]
fn variables_expand_and_are_secrets() {
    let loaded = loads(
        FileFormat::Yaml,
        "mcpServers:\n  github:\n    url: http://127.0.0.1:${PORT}/mcp\n    headers:\n      Authorization: Bearer ${GITHUB_TOKEN}\n    env: {MODE: '${MODE:-fast}'}\nrestTools:\n  get:\n    description: d\n    url: http://127.0.0.1/x/${parameters.id}\n",
    );
    let github = &loaded.config.mcp_servers["github"];
    assert_eq!(github.url.as_deref(), Some("http://127.0.0.1:8080/mcp"));
    assert_eq!(github.headers["Authorization"], "Bearer ghp_secret_value");
    assert_eq!(github.env["MODE"], "fast");
    assert_eq!(loaded.config.rest_tools["get"].url, "http://127.0.0.1/x/${parameters.id}");
    let mut secrets = loaded.secrets.clone();
    secrets.sort();
    assert_eq!(secrets, ["8080", "ghp_secret_value"]);
}

#[test]
fn claude_desktop_file() {
    let loaded = loads(
        FileFormat::Json,
        r#"{
  "mcpServers": {
    "filesystem": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"]
    },
    "github": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-github"],
      "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GITHUB_TOKEN}"}
    },
    "remote": {"url": "http://127.0.0.1:9000/mcp", "headers": {"X-Key": "k"}}
  }
}"#,
    );
    assert_eq!(loaded.config.mcp_servers.len(), 3);
    assert!(loaded.warnings.is_empty());
}

#[test]
fn vscode_file_with_comments_and_inputs() {
    let loaded = loads(
        FileFormat::Json,
        r#"{
  // Prompted values: not supported by toolmux.
  "inputs": [{"type": "promptString", "id": "api-key", "description": "API key", "password": true}],
  "servers": {
    "everything": {"type": "stdio", "command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"],},
    "api": {"type": "http", "url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ${input:api-key}"}},
    "gh": {"command": "gh-mcp", "env": {"TOKEN": "${env:GITHUB_TOKEN}"}, "envFile": "${workspaceFolder}/.env"},
  },
}"#,
    );
    assert_eq!(loaded.config.mcp_servers.len(), 3);
    assert_eq!(loaded.config.mcp_servers["gh"].env["TOKEN"], "ghp_secret_value");
    assert_eq!(loaded.config.mcp_servers["gh"].env_file.as_deref(), Some(Path::new("/proj/.env")));
    expect![[r#"
        toolmux.json: `inputs` is ignored: toolmux cannot prompt; use ${env:VAR} instead
        toolmux.json: ${input:api-key} is left as it is: toolmux cannot prompt; use ${env:VAR} instead"#]]
    .assert_eq(&loaded.warnings.join("\n"));
}

#[test]
fn full_example_loads() {
    let loaded = loads(
        FileFormat::Yaml,
        r#"
$schema: ./schemas/toolmux.schema.json
defaults:
  toolTimeout: 30000
  toolResponseMaxBytes: 100000
  mcpInitConcurrency: 8
  startupTimeout: 20000
  contextTokenBudget: 200000
  maxToolCallsPerRun: 100
  maxToolTimeMs: 600000
  retries: 2
  oversize: spill
  outputDir: .toolmux/outputs
  auditLog: .toolmux/audit.jsonl
  statsFile: .toolmux/stats.json
  traceMCP: false
fs:
  root: .
  permissions: [read, write, execute]
  bash:
    allowPrefixes: ["cargo test", "git status"]
    env: [RUST_LOG]
mcpServers:
  github:
    type: stdio
    command: npx
    args: ["-y", "@modelcontextprotocol/server-github"]
    env: {GITHUB_PERSONAL_ACCESS_TOKEN: "${GITHUB_TOKEN}"}
    toolsAllowed: [search_code, get_file_contents]
    queue: github
    cache: 60000
    requestTimeoutMs: 20000
queues:
  github: {concurrent: 3, waitTimeoutMs: 10000}
permissions:
  allow: ["*"]
  deny: ["fs__bash"]
  ask: ["github__create_*"]
aliases:
  search: github__search_code
tools:
  fs__grep: {timeout: 5000, retries: 1}
restTools:
  weather:
    description: Current weather for a city
    url: "https://api.example.com/weather?city=${parameters.city}"
openapi:
  petstore:
    spec: specs/petstore.yaml
    include: {tags: [pets]}
"#,
    );
    assert_eq!(loaded.output_dir(), Path::new("/proj/.toolmux/outputs"));
    assert_eq!(loaded.stats_file().as_deref(), Some(Path::new("/proj/.toolmux/stats.json")));
    assert_eq!(loaded.config.defaults.tool_timeout, Some(30000));
}

#[test]
fn empty_file_is_an_empty_configuration() {
    let loaded = loads(FileFormat::Yaml, "# nothing yet\n");
    assert_eq!(loaded.config, Config::default());
    assert_eq!(loaded.stats_file(), Some(loaded.output_dir().join("stats.json")));
}

#[test]
fn stats_file_false_keeps_no_statistics() {
    let off = loads(FileFormat::Yaml, "defaults:\n  statsFile: false\n");
    assert_eq!(off.stats_file(), None);
    let on = loads(FileFormat::Yaml, "defaults:\n  statsFile: true\n");
    assert_eq!(on.stats_file(), Some(on.output_dir().join("stats.json")));
}

#[test]
fn discovery_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert_eq!(discover(None, None, d), None);
    std::fs::write(d.join("toolmux.json"), "{}").unwrap();
    assert_eq!(discover(None, None, d), Some(d.join("toolmux.json")));
    std::fs::write(d.join("toolmux.yaml"), "").unwrap();
    assert_eq!(discover(None, None, d), Some(d.join("toolmux.yaml")));
    assert_eq!(discover(None, Some(Path::new("e.yaml")), d), Some(d.join("e.yaml")));
    assert_eq!(
        discover(Some(Path::new("/abs/c.json")), Some(Path::new("e.yaml")), d),
        Some(PathBuf::from("/abs/c.json"))
    );
}

#[test]
fn edit_distance() {
    assert_eq!(distance("kitten", "sitting"), 3);
    assert_eq!(closest("comand", &["command", "args"]), Some("command"));
    assert_eq!(closest("xyz", &["command", "args"]), None);
    assert_eq!(closest("ENV", &["env", "args"]), Some("env"));
    assert_eq!(closest("raed", &["read", "write"]), Some("read"));
    assert_eq!(strip_position("a at line 3 column 3, while b at line 2 column 1"), "a, while b");
    assert_eq!(strip_position("at line x"), "at line x");
}

#[test]
fn unquoted_yaml_scalars_in_args_and_env() {
    let loaded = loads(
        FileFormat::Yaml,
        "mcpServers:\n  s:\n    command: srv\n    args: [--port, 8080, --debug, true]\n    env: {PORT: 8080, RATIO: 0.5}\n",
    );
    let s = &loaded.config.mcp_servers["s"];
    assert_eq!(s.args, ["--port", "8080", "--debug", "true"]);
    assert_eq!(s.env["PORT"], "8080");
    assert_eq!(s.env["RATIO"], "0.5");
    yaml_error(
        "mcpServers:\n  s:\n    command: srv\n    env: {A: [1]}\n",
        expect!["toolmux.yaml:4:10: mcpServers.s.env.A: expected a string, number or boolean"],
    );
}
