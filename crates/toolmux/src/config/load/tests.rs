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
        FileFormat::Toml => "toolmux.toml",
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

/// A tab in the indentation is said to be one, at its line and column, with what to
/// write instead, where the parser's words (found character that cannot start any token)
/// named no tab.
#[test]
fn a_tab_in_the_indentation_is_named() {
    let said = "invalid YAML: a tab indents this line, and YAML allows only spaces for \
                indentation: indent with spaces";
    let cases = [
        ("fs:\n\tpermissions: [read]\n", "2:1"),
        ("fs:\n  permissions:\n  \t- read\n", "3:3"),
        ("mcpServers:\n  a:\n    command: x\n\targs: []\n", "4:1"),
    ];
    for (text, at) in cases {
        let e = load_as(FileFormat::Yaml, text).expect_err(text);
        assert_eq!(e.to_string(), format!("toolmux.yaml:{at}: {said}"), "{text:?}");
    }
    // A tab after the indentation is no error of this kind.
    yaml_error(
        "fs: {}\nqueues: [\t\n",
        expect![
            "toolmux.yaml:3:1: invalid YAML: did not find expected node content, while parsing a flow node"
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
    // Other tools' names for toolmux's keys.
    yaml_error(
        "mcpServers:\n  x:\n    command: a\n    allowedTools: [b]\n",
        expect![
            "toolmux.yaml:4:5: unknown key `allowedTools` in mcpServers.x; did you mean `toolsAllowed`?"
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
            r#"toolmux.yaml:2:16: defaults.toolTimeout: expected a number of milliseconds, such as 30000; found the string "30s""#
        ]],
    );
    json_error(
        "{\"queues\": {\"q\": {\"concurrent\": \"many\"}}}",
        expect![[
            r#"toolmux.json:1:38: queues.q.concurrent: expected a whole number, such as 10; found the string "many""#
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

/// A `${` that nothing closes is an error naming the key, its line and the escape, where
/// it was kept as text: `root: ${GITHUB_TOKEN` became a folder of that name.
#[test]
fn an_unterminated_reference_is_an_error() {
    yaml_error(
        "fs:\n  enabled: true\n  root: ${GITHUB_TOKEN\n",
        expect![
            "toolmux.yaml:3:9: `${` without a closing `}` in fs.root: close the reference (`${VAR}`, `${VAR:-default}`), or write a literal `${` as `$${`"
        ],
    );
    json_error(
        "{\"mcpServers\": {\"s\": {\"command\": \"x\",\n  \"args\": [\"${NOPE:-${GITHUB_TOKEN}\"]}}}",
        expect![
            "toolmux.json:2:11: `${` without a closing `}` in mcpServers.s.args[0]: close the reference (`${VAR}`, `${VAR:-default}`), or write a literal `${` as `$${`"
        ],
    );
    // The documented escape still gives a literal `${`.
    let loaded = loads(FileFormat::Yaml, "fs:\n  root: /srv/$${HOME\n");
    assert_eq!(
        loaded.config.fs.as_ref().map(|fs| fs.root.clone()),
        Some(Some(PathBuf::from("/srv/${HOME")))
    );
}

/// `${VAR:?message}` of an unset variable, and references that name nothing (`${}`,
/// `${1BAD}`), are errors naming the key and their line, where they were passed on as
/// text; no value of the environment is shown. What only a shell reads is kept, with a
/// warning.
#[test]
fn required_and_malformed_references_are_errors() {
    yaml_error(
        "mcpServers:\n  s:\n    command: x\n    args: [\"--repo\", \"${NOPE:?set NOPE to the repository}\"]\n",
        expect![
            "toolmux.yaml:4:23: environment variable NOPE, needed in mcpServers.s.args[1], is not set (or is empty), which the file says: set NOPE to the repository"
        ],
    );
    yaml_error(
        "# ${}\nfs:\n  root: /srv/${}\n",
        expect![
            "toolmux.yaml:3:14: `${}` in fs.root is empty: name a variable (`${VAR}`), or a literal `${` is written `$${`"
        ],
    );
    json_error(
        "{\"mcpServers\": {\"s\": {\"command\": \"x\",\n  \"args\": [\"${1BAD}\"]}}}",
        expect![
            "toolmux.json:2:13: `${1BAD}` in mcpServers.s.args[0] is not a variable's name (a name starts with a letter or `_`), or a literal `${` is written `$${`"
        ],
    );
    // What only a shell reads is kept for the shell, with a warning naming it and its key.
    let loaded = loads(
        FileFormat::Yaml,
        "mcpServers:\n  s:\n    command: sh\n    args: ['-c', 'f=${1%.txt}; echo $${1}', a.txt]\n    env: {T: '${GITHUB_TOKEN:=x}'}\n",
    );
    let s = &loaded.config.mcp_servers["s"];
    assert_eq!(s.args, ["-c", "f=${1%.txt}; echo ${1}", "a.txt"]);
    assert_eq!(s.env["T"], "${GITHUB_TOKEN:=x}");
    expect![[r#"
        toolmux.yaml: `${1%.txt}` in mcpServers.s.args[1] is left as it is for a shell to read: toolmux expands `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:+alt}`, `${VAR+alt}` and `${VAR:?message}` only; write `$${` for a `${` meant for a shell, which keeps it without this warning
        toolmux.yaml: `${GITHUB_TOKEN:=x}` in mcpServers.s.env.T is left as it is for a shell to read: toolmux expands `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:+alt}`, `${VAR+alt}` and `${VAR:?message}` only; write `$${` for a `${` meant for a shell, which keeps it without this warning"#]]
    .assert_eq(&loaded.warnings.join("\n"));
    let loaded = loads(
        FileFormat::Yaml,
        "mcpServers:\n  s:\n    command: x\n    args: ['${GITHUB_TOKEN:?}', '${NOPE-d}', '${PORT:+--port=${PORT}}', '${NOPE+x}']\n",
    );
    assert_eq!(loaded.config.mcp_servers["s"].args, ["ghp_secret_value", "d", "--port=8080", ""]);
    assert_eq!(loaded.secrets, ["ghp_secret_value"]);
}

/// A default may hold a reference of its own, as in a shell and Docker Compose; the value
/// finally used is a secret when its own name or a name it stands in for sounds secret.
#[test]
fn defaults_may_hold_references() {
    let loaded = loads(
        FileFormat::Yaml,
        "mcpServers:\n  s:\n    command: x\n    args: ['${NOPE:-${GITHUB_TOKEN}}', '${NOPE:-${NOPE2:-/tmp}}', '${API_KEY:-${PORT}}', '${NOPE:-${PORT}}']\n",
    );
    let s = &loaded.config.mcp_servers["s"];
    assert_eq!(s.args, ["ghp_secret_value", "/tmp", "8080", "8080"]);
    assert_eq!(loaded.secrets, ["ghp_secret_value", "8080"]);
    yaml_error(
        "mcpServers:\n  s:\n    command: x\n    args: ['${NOPE:-${NO_SUCH_TOKEN}}']\n",
        expect![
            "toolmux.yaml:4:21: unset environment variable NO_SUCH_TOKEN in mcpServers.s.args[0] (set it, or give a default: ${NO_SUCH_TOKEN:-value})"
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
    // A port names a place, not a credential.
    assert_eq!(secrets, ["ghp_secret_value"]);
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

/// mcp-remote's documented entry: a `${VAR}` in a server's `args` (and `command`, `cwd`)
/// naming a key of the entry's own `env` takes that value, itself expanded first, as the
/// program the apps start reads it from its environment; it was toolmux's own variable
/// (unset: an error; set: the wrong value). Alike in Claude Desktop's file, VS Code's and
/// toolmux's own, with the variable unset in toolmux's environment and set to another
/// value there; the value is a secret like every expanded one.
#[test]
fn a_servers_args_take_references_to_its_own_env() {
    let entry = r#"{"command": "${TOOL:-npx}",
  "args": ["mcp-remote", "https://example.com/mcp", "--header", "Authorization:${AUTH_HEADER}",
           "$${AUTH_HEADER}", "--token=${HDR_VALUE}", "${GITHUB_TOKEN}"],
  "env": {"AUTH_HEADER": "Bearer ${GITHUB_TOKEN}", "TOOL": "npx", "HDR_VALUE": "k-7f3a9c21"}}"#;
    let files = [
        ("toolmux.json", format!(r#"{{"mcpServers": {{"remote": {entry}}}}}"#)),
        (
            "claude_desktop_config.json",
            format!(r#"{{"globalShortcut": "Ctrl+Space", "mcpServers": {{"remote": {entry}}}}}"#),
        ),
        ("mcp.json", format!(r#"{{"servers": {{"remote": {entry}}}}}"#)),
    ];
    let unset = |name: &str| env(name);
    let other = |name: &str| match name {
        "AUTH_HEADER" => Some("Bearer from-the-process".to_owned()),
        "TOOL" => Some("/bin/false".to_owned()),
        _ => env(name),
    };
    let lookups: [(&str, &env::Lookup<'_>); 2] = [("unset", &unset), ("set otherwise", &other)];
    for (name, text) in &files {
        for (how, lookup) in lookups {
            let loaded = load_str(text, FileFormat::Json, name, Path::new("/proj"), lookup)
                .unwrap_or_else(|e| panic!("{name}, AUTH_HEADER {how}: {e}"));
            let server = &loaded.config.mcp_servers["remote"];
            assert_eq!(server.command.as_deref(), Some("npx"), "{name}, {how}");
            assert_eq!(
                server.args[3..],
                [
                    "Authorization:Bearer ghp_secret_value",
                    "${AUTH_HEADER}",
                    "--token=k-7f3a9c21",
                    "ghp_secret_value"
                ],
                "{name}, AUTH_HEADER {how}"
            );
            assert_eq!(server.env["AUTH_HEADER"], "Bearer ghp_secret_value", "{name}, {how}");
            // The entry's own value put in after `--token=` is a secret (as a literal `env`
            // value under a name that names no credential it was not).
            for secret in ["ghp_secret_value", "k-7f3a9c21"] {
                assert!(loaded.secrets.iter().any(|s| s == secret), "{name}: {:?}", loaded.secrets);
            }
        }
    }
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
fn positions_are_stripped() {
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

/// Loads `text` as the file `name` (relative to a project folder) from disk, as the binary
/// does: the name can tell whose file it is.
fn load_file(name: &str, text: &str) -> (tempfile::TempDir, Result<Loaded, ToolmuxError>) {
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join(name);
    std::fs::create_dir_all(path.parent().expect("a folder")).expect("folders");
    std::fs::write(&path, text).expect("write");
    let loaded = load(&path, name, &env);
    (dir, loaded)
}

/// The servers as toolmux's own file would say them, one JSON line each.
fn servers(loaded: &Loaded) -> String {
    loaded
        .config
        .mcp_servers
        .iter()
        .map(|(name, entry)| {
            format!("{name}: {}", serde_json::to_string(entry).expect("an entry is JSON"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const GEMINI_SETTINGS: &str = r#"{
  "theme": "GitHub",
  "selectedAuthType": "oauth-personal",
  "contextFileName": ["GEMINI.md", "AGENTS.md"],
  "coreTools": ["ReadFileTool", "ShellTool(git status)"],
  "mcp": {"excluded": ["experimental"]},
  "mcpServers": {
    "github": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-github"],
      "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "$GITHUB_TOKEN", "PORT": "${PORT}"},
      "cwd": "./servers",
      "timeout": 30000,
      "trust": true,
      "includeTools": ["search_code", "get_file_contents"],
      "excludeTools": ["delete_repository"],
      "description": "GitHub"
    },
    "events": {"url": "http://127.0.0.1:9000/sse", "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"}},
    "api": {"httpUrl": "http://127.0.0.1:9001/mcp", "oauth": {"enabled": true, "clientId": "cli", "scopes": ["read"]}},
    "experimental": {"command": "exp-server"}
  }
}"#;

#[test]
fn gemini_settings_by_name() {
    let (dir, loaded) = load_file(".gemini/settings.json", GEMINI_SETTINGS);
    let loaded = loaded.unwrap();
    let servers = servers(&loaded).replace(dir.path().to_str().unwrap(), "/proj");
    expect![[r#"
        api: {"type":"http","url":"http://127.0.0.1:9001/mcp","oauth":{"enabled":true,"clientId":"cli","scopes":["read"]}}
        events: {"type":"sse","url":"http://127.0.0.1:9000/sse","headers":{"Authorization":"Bearer ghp_secret_value"}}
        experimental: {"command":"exp-server","enabled":false}
        github: {"command":"npx","args":["-y","@modelcontextprotocol/server-github"],"env":{"GITHUB_PERSONAL_ACCESS_TOKEN":"ghp_secret_value","PORT":"8080"},"cwd":"/proj/./servers","toolsAllowed":["search_code","get_file_contents"],"toolsDenied":["delete_repository"],"requestTimeoutMs":30000,"description":"GitHub"}"#]]
    .assert_eq(&servers);
    expect![
        ".gemini/settings.json: mcpServers.github.trust is ignored: toolmux's `permissions` decide which calls run without approval"
    ]
    .assert_eq(&loaded.warnings.join("\n"));
    let mut secrets = loaded.secrets;
    secrets.sort();
    assert_eq!(secrets, ["ghp_secret_value", "ghp_secret_value"]);
}

#[test]
fn gemini_settings_by_content() {
    // Not in a `.gemini` folder: Gemini's own top-level keys say whose file it is.
    let loaded = loads(FileFormat::Json, GEMINI_SETTINGS);
    assert_eq!(loaded.config.mcp_servers.len(), 4);
    // Relative to the file's folder, as in every file that is not in a `.gemini` folder.
    assert_eq!(loaded.config.mcp_servers["github"].cwd.as_deref(), Some(Path::new("./servers")));
}

#[test]
fn gemini_unknown_server_key_is_an_error() {
    json_error(
        r#"{"theme": "x", "mcpServers": {"a": {"command": "a", "includeTool": ["t"]}}}"#,
        expect![
            "toolmux.json:1:65: unknown key `includeTool` in mcpServers.a; did you mean `includeTools`?"
        ],
    );
}

#[test]
fn gemini_unset_variable_is_an_error_without_the_values() {
    json_error(
        r#"{"theme": "x", "mcpServers": {"a": {"command": "a", "env": {"K": "$NO_SUCH_TOKEN", "T": "${GITHUB_TOKEN}"}}}}"#,
        expect![
            "toolmux.json: unset environment variable NO_SUCH_TOKEN in mcpServers.a.env.K (set it, or give a default: ${NO_SUCH_TOKEN:-value})"
        ],
    );
}

#[test]
fn gemini_keys_beside_toolmux_keys_are_toolmux_errors() {
    // A toolmux file with a stray key stays a toolmux file.
    let text = "theme: dark\nqueues: {q: {concurrent: 1}}\nmcpServers: {a: {command: a}}\n";
    let message = load_as(FileFormat::Yaml, text).unwrap_err().to_string();
    assert!(
        message.starts_with(
            "toolmux.yaml:1:1: unknown key `theme` at the top level; valid keys: $schema, defaults,"
        ),
        "{message}"
    );
}

#[test]
fn bare_references_are_braced() {
    assert_eq!(
        foreign::braced("$A and ${B} $_c9-x $ 5$ $1").as_deref(),
        Some("${A} and ${B} ${_c9}-x $ 5$ $1")
    );
    assert_eq!(foreign::braced("no references, ${B}, $"), None);
    assert_eq!(foreign::braced("é$Aé").as_deref(), Some("é${A}é"));
}

const ZED_SETTINGS: &str = r#"// Zed settings
{
  "theme": {"mode": "system", "light": "One Light", "dark": "One Dark"},
  "ui_font_size": 16,
  "buffer_font_family": "Zed Plex Mono",
  "agent": {"default_model": {"provider": "zed.dev", "model": "claude-sonnet-4"}},
  "context_servers": {
    "filesystem": {
      "source": "custom",
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/src"],
      "env": {"TOKEN": "${GITHUB_TOKEN}"},
      "timeout": 90,
    },
    "older": {
      "command": {"path": "/usr/local/bin/older-server", "args": ["run"], "env": null},
      "settings": {}
    },
    "remote": {"url": "http://127.0.0.1:9002/mcp", "headers": {"X-Port": "${PORT}"}, "oauth": {"client_id": "zed-client"}},
    "off": {"command": "off-server", "enabled": false},
    "postgres-context-server": {"source": "extension", "settings": {"database_url": "postgresql://localhost/db"}}
  },
  "languages": {"Rust": {"tab_size": 4}},
}"#;

#[test]
fn zed_settings_by_content() {
    let loaded = loads(FileFormat::Json, ZED_SETTINGS);
    expect![[r#"
        filesystem: {"command":"npx","args":["-y","@modelcontextprotocol/server-filesystem","/home/me/src"],"env":{"TOKEN":"ghp_secret_value"},"requestTimeoutMs":90000}
        off: {"command":"off-server","enabled":false}
        older: {"command":"/usr/local/bin/older-server","args":["run"]}
        remote: {"url":"http://127.0.0.1:9002/mcp","headers":{"X-Port":"8080"},"oauth":{"clientId":"zed-client"}}"#]]
    .assert_eq(&servers(&loaded));
    expect![
        "toolmux.json: context_servers.postgres-context-server is left out: it is run by a Zed extension, which toolmux cannot do; give it a `command` or a `url`"
    ]
    .assert_eq(&loaded.warnings.join("\n"));
}

#[test]
fn zed_settings_by_name() {
    // No servers yet: still Zed's file, its settings ignored.
    let (_dir, loaded) =
        load_file(".zed/settings.json", r#"{"tab_size": 2, "format_on_save": "on"}"#);
    assert_eq!(loaded.unwrap().config, Config::default());
}

#[test]
fn zed_unknown_server_key_is_an_error() {
    json_error(
        r#"{"context_servers": {"a": {"command": "a", "arg": ["x"]}}}"#,
        expect!["toolmux.json:1:48: unknown key `arg` in context_servers.a; did you mean `args`?"],
    );
    json_error(
        r#"{"context_servers": {"a": {"command": {"path": "a", "argz": []}}}}"#,
        expect![
            "toolmux.json:1:58: unknown key `argz` in context_servers.a.command; did you mean `args`?"
        ],
    );
}

const CODEX_CONFIG: &str = r#"model = "gpt-5"
approval_policy = "on-request"

[mcp_servers.docs]
command = "docs-server"
args = ["--port", 4000]
env_vars = ["HTTP_PROXY"]
startup_timeout_sec = 20
tool_timeout_sec = 12.5
enabled_tools = ["search"]

[mcp_servers.docs.env]
DOCS_TOKEN = "${GITHUB_TOKEN}"

[mcp_servers.figma]
url = "https://127.0.0.1:9443/mcp"
bearer_token_env_var = "GITHUB_TOKEN"
http_headers = { "X-Region" = "us" }
env_http_headers = { "X-Port" = "PORT" }
disabled_tools = ["delete"]
enabled = false
experimental_thing = true
"#;

/// Codex's `config.toml`: its servers become toolmux's, headers from the environment
/// are secrets like every expanded value, Codex's other settings are ignored, and a
/// server key toolmux does not read is a warning with the closest one.
#[test]
fn codex_config_by_name_and_by_content() {
    let (_dir, loaded) = load_file(".codex/config.toml", CODEX_CONFIG);
    let loaded = loaded.unwrap();
    expect![[r#"
        docs: {"type":"stdio","command":"docs-server","args":["--port","4000"],"env":{"DOCS_TOKEN":"ghp_secret_value"},"envInherit":"minimal","envPassthrough":["HTTP_PROXY"],"toolsAllowed":["search"],"requestTimeoutMs":12500,"startupTimeoutMs":20000}
        figma: {"type":"http","url":"https://127.0.0.1:9443/mcp","headers":{"Authorization":"Bearer ghp_secret_value","X-Port":"8080","X-Region":"us"},"toolsDenied":["delete"],"enabled":false}"#]]
    .assert_eq(&servers(&loaded));
    assert!(loaded.secrets.contains(&"ghp_secret_value".to_owned()), "{:?}", loaded.secrets);
    expect![".codex/config.toml: mcp_servers.figma.experimental_thing is not read by toolmux and is ignored"]
        .assert_eq(&loaded.warnings.join("\n"));
    // Anywhere else, `mcp_servers` says whose file it is.
    assert_eq!(loads(FileFormat::Toml, CODEX_CONFIG).config.mcp_servers.len(), 2);
}

#[test]
fn codex_config_errors_have_lines() {
    check_error(
        FileFormat::Toml,
        "[mcp_servers.a]\ncommand = \"a\"\nargs = \"--x\"\n",
        expect![
            "toolmux.toml:3:1: mcp_servers.a.args: expected a list, such as [a, b]; found the string \"--x\""
        ],
    );
    check_error(
        FileFormat::Toml,
        "[mcp_servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\nbearer_token = \"abc\"\n",
        expect![
            "toolmux.toml:3:1: mcp_servers.a.bearer_token: a token is not written in the file (Codex refuses it too); put it in an environment variable and name that in `bearer_token_env_var`"
        ],
    );
    check_error(
        FileFormat::Toml,
        "[mcp_servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\nbearer_token_env_var = \"NO_SUCH_TOKEN\"\n",
        expect![
            "toolmux.toml: unset environment variable NO_SUCH_TOKEN in mcp_servers.a.http_headers.Authorization (set it, or give a default: ${NO_SUCH_TOKEN:-value})"
        ],
    );
    // Names pasted into `${...}` must be names: `MY-TOKEN` would be `MY`, default `TOKEN`.
    check_error(
        FileFormat::Toml,
        "[mcp_servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\nbearer_token_env_var = \"MY-TOKEN\"\n",
        expect![
            "toolmux.toml:3:1: mcp_servers.a.bearer_token_env_var: `MY-TOKEN` is not an environment variable's name; a name is letters, digits and `_`, not starting with a digit"
        ],
    );
    check_error(
        FileFormat::Toml,
        "[mcp_servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\nauth = {token_env_var = \"A}B\"}\n",
        expect![
            "toolmux.toml:3:9: mcp_servers.a.auth.token_env_var: `A}B` is not an environment variable's name; a name is letters, digits and `_`, not starting with a digit"
        ],
    );
    check_error(
        FileFormat::Toml,
        "[mcp_servers.a]\nurl = \"http://127.0.0.1:1/mcp\"\n\n[mcp_servers.a.env_http_headers]\n\
         X-Key = \"1KEY\"\n",
        expect![
            "toolmux.toml:5:1: mcp_servers.a.env_http_headers.X-Key: `1KEY` is not an environment variable's name; a name is letters, digits and `_`, not starting with a digit"
        ],
    );
    check_error(
        FileFormat::Toml,
        "[mcp_servers.a]\ncommand = \"a\n",
        expect!["toolmux.toml:2:13: invalid TOML: invalid character in string: `\\n`"],
    );
}

/// toolmux's own keys in TOML, with the same checks as in YAML and JSON.
#[test]
fn toolmux_configuration_in_toml() {
    let loaded = loads(
        FileFormat::Toml,
        "[defaults]\ntoolTimeout = 5000\n\n[mcpServers.everything]\ncommand = \"npx\"\nargs = [\"-y\", \"x\"]\n",
    );
    assert_eq!(loaded.config.mcp_servers["everything"].args, ["-y", "x"]);
    check_error(
        FileFormat::Toml,
        "[defaults]\ntoolTimeot = 5000\n",
        expect![
            "toolmux.toml:2:1: unknown key `toolTimeot` in defaults; did you mean `toolTimeout`?"
        ],
    );
}

/// A hooks block pasted from Claude Code's settings loads, and a matcher naming Claude's
/// own tools, which would match nothing here, is a warning saying what toolmux calls them.
#[test]
fn hook_matchers_naming_claude_codes_tools_warn() {
    let loaded = loads(
        FileFormat::Yaml,
        "hooks:\n  PreToolUse:\n    - matcher: Write|Edit\n      hooks: [{type: command, command: ./guard.sh}]\n  PostToolUse:\n    - matcher: fs__bash|WebFetch\n      hooks: [{type: command, command: ./log.sh}]\n",
    );
    expect![[r#"
        toolmux.yaml: hooks.PreToolUse[0].matcher: `Write` is Claude Code's name for one of its own tools and matches no toolmux tool; toolmux's is `fs__write` (its arguments may be named differently: `fs__write` takes `path` where Claude's `Write` takes `file_path`)
        toolmux.yaml: hooks.PreToolUse[0].matcher: `Edit` is Claude Code's name for one of its own tools and matches no toolmux tool; toolmux's is `fs__edit` (its arguments may be named differently: `fs__write` takes `path` where Claude's `Write` takes `file_path`)
        toolmux.yaml: hooks.PostToolUse[0].matcher: `WebFetch` is Claude Code's name for one of its own tools and matches no toolmux tool; toolmux has no such tool"#]]
    .assert_eq(&loaded.warnings.join("\n"));
}

/// The specification seeds' `mcp.yml`: servers by URL with a bearer token from a named
/// variable and declared tools; and their list shape `mcp.servers`.
#[test]
fn the_seeds_server_shapes_load() {
    let loaded = loads(
        FileFormat::Yaml,
        r#"mcp_servers:
  code_execution_server:
    description: "Server for executing Python code snippets securely."
    url: "http://127.0.0.1:8001"
    auth:
      type: "bearer"
      token_env_var: "GITHUB_TOKEN"
    provides_tools:
      - name: "execute_python_code"
        description: "Executes a given Python code snippet."
        inputSchema:
          type: "object"
          properties:
            code: {type: "string"}
          required: ["code"]
        speed: "medium"
        safety: "sandboxed"
"#,
    );
    expect![[r#"code_execution_server: {"type":"http","url":"http://127.0.0.1:8001","headers":{"Authorization":"Bearer ghp_secret_value"},"tools":[{"name":"execute_python_code","description":"Executes a given Python code snippet.","inputSchema":{"properties":{"code":{"type":"string"}},"required":["code"],"type":"object"}}],"description":"Server for executing Python code snippets securely."}"#]]
        .assert_eq(&servers(&loaded));
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);

    let listed = loads(
        FileFormat::Json,
        r#"{"mcp": {"servers": [{"name": "github-tools", "url": "http://127.0.0.1:9/mcp", "transport": "sse", "allowedTools": ["list_prs", "create_issue"]}]}}"#,
    );
    expect![[r#"github-tools: {"type":"sse","url":"http://127.0.0.1:9/mcp","toolsAllowed":["list_prs","create_issue"]}"#]]
        .assert_eq(&servers(&listed));
    check_error(
        FileFormat::Yaml,
        "mcp_servers:\n  a:\n    url: http://127.0.0.1:1\n    auth: {type: basic, token_env_var: X}\n",
        expect![
            "toolmux.yaml: mcp_servers.a.auth: type `basic` is not supported; `bearer` with `token_env_var` is, or give `http_headers`"
        ],
    );
}

/// `externalTools` as the seeds write tools: a list of objects that name themselves.
#[cfg(feature = "external")]
#[test]
fn external_tools_may_be_a_list_of_named_tools() {
    let listed = "externalTools:\n  - name: confirmAction\n    description: Ask\n    executionType: space\n    isAsync: true\n  - name: chart\n    description: Draw\n    executionType: internal\n";
    let mapped = "externalTools:\n  confirmAction:\n    name: confirmAction\n    description: Ask\n    executionType: space\n    isAsync: true\n  chart:\n    name: chart\n    description: Draw\n    executionType: internal\n";
    let (listed, mapped) = (loads(FileFormat::Yaml, listed), loads(FileFormat::Yaml, mapped));
    assert_eq!(listed.config.external_tools, mapped.config.external_tools);
    assert_eq!(listed.config.external_tools.len(), 2);
    yaml_error(
        "externalTools:\n  - description: Ask\n",
        expect![
            "toolmux.yaml:2:3: externalTools: the tool at [0] has no `name`; in a list each tool names itself (`- name: confirmAction`)"
        ],
    );
    yaml_error(
        "externalTools:\n  - name: a\n    description: x\n  - name: a\n    description: y\n",
        expect![
            "toolmux.yaml:2:3: externalTools: two tools of the list are named `a`; names must differ"
        ],
    );
    yaml_error(
        "externalTools:\n  - name: a\n    descripton: x\n",
        expect![
            "toolmux.yaml:3:5: unknown key `descripton` in externalTools[0]; did you mean `description`?"
        ],
    );
    json_error(
        "{\"externalTools\": 3}",
        expect![
            "toolmux.json:1:19: externalTools: invalid type: integer `3`, expected a map of tools by name, or a list of tools each with its `name`"
        ],
    );
}

/// Paths relative to the configuration's folder are shown and compared without `.`.
#[test]
fn relative_paths_carry_no_dot() {
    let loaded = loads(FileFormat::Yaml, "defaults:\n  outputDir: ./out\n");
    assert_eq!(loaded.output_dir(), Path::new("/proj/out"));
    assert_eq!(loaded.resolve(Path::new(".")), Path::new("/proj"));
    assert_eq!(loaded.resolve(Path::new("./a/./b")), Path::new("/proj/a/b"));
    assert_eq!(loaded.resolve(Path::new("/abs/./x")), Path::new("/abs/x"));
}

/// A toolmux file written with Codex's `mcp_servers` is read as Codex's, but toolmux's
/// names of the tool filters still filter (ignored, every tool would have been offered).
#[test]
fn tool_filters_hold_in_a_file_read_as_codex_s() {
    let loaded = loads(
        FileFormat::Yaml,
        "mcp_servers:\n  fx:\n    command: srv\n    toolsAllowed: [echo]\n    toolsDenied: [rm]\n",
    );
    let fx = &loaded.config.mcp_servers["fx"];
    assert_eq!(fx.tools_allowed.as_deref(), Some(&["echo".to_owned()][..]));
    assert_eq!(fx.tools_denied, ["rm"]);
    assert!(
        loaded.warnings.iter().any(|w| w.contains("read as `enabled_tools`")),
        "{:?}",
        loaded.warnings
    );
}

/// Where settings belong (a struct), a list or a single value is refused in every format:
/// serde_json, and every untagged enum, read a struct from a list field by field, so
/// `{"defaults": [1000]}` was `toolTimeout: 1000`.
#[test]
fn settings_given_a_list_or_a_single_value() {
    let cases = [
        (FileFormat::Json, r#"{"defaults": [1000]}"#),
        (FileFormat::Json, r#"{"mcpServers": {"a": ["npx", "-y", "server"]}}"#),
        (FileFormat::Json, r#"{"fs": {"bash": "on"}}"#),
        (FileFormat::Json, r#"{"fs": {"limits": [200, 2000]}}"#),
        (FileFormat::Json, r#"{"queues": {"slow": [2]}}"#),
        (FileFormat::Json, r#"{"hooks": {"PreToolUse": [["Bash", "check.sh"]]}}"#),
        (FileFormat::Json, "{\n  \"restTools\": {\n    \"weather\": [\"https://x\"]\n  }\n}"),
        (FileFormat::Yaml, "defaults: [1000]\n"),
        (FileFormat::Yaml, "fs:\n  bash: yes please\n"),
        (FileFormat::Yaml, "mcpServers:\n  a:\n    - npx\n"),
        (FileFormat::Yaml, "queues:\n  slow: 2\n"),
        (FileFormat::Toml, "defaults = [1000]\n"),
        (FileFormat::Toml, "[mcpServers]\na = [\"npx\"]\n"),
    ];
    let shown: Vec<String> = cases
        .iter()
        .map(|(format, text)| match load_as(*format, text) {
            Ok(loaded) => format!("loaded: {:?}", loaded.config.defaults.tool_timeout),
            Err(e) => e.to_string(),
        })
        .collect();
    expect![[r#"
        toolmux.json:1:14: defaults: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.json:1:22: mcpServers.a: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.json:1:17: fs.bash: expected a mapping of its settings (`key: value` entries); found the string "on"
        toolmux.json:1:19: fs.limits: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.json:1:21: queues.slow: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.json:1:26: hooks.PreToolUse[0]: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.json:3:16: restTools.weather: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.yaml:1:11: defaults: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.yaml:2:9: fs.bash: expected a mapping of its settings (`key: value` entries); found the string "yes please"
        toolmux.yaml:3:5: mcpServers.a: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.yaml:2:9: queues.slow: expected a mapping of its settings (`key: value` entries); found 2
        toolmux.toml:1:1: defaults: expected a mapping of its settings (`key: value` entries); found a list
        toolmux.toml:2:1: mcpServers.a: expected a mapping of its settings (`key: value` entries); found a list"#]].assert_eq(&shown.join("\n"));
}

/// The shapes beside settings that the schema allows still load: a sandbox's mode as a
/// string, an empty section.
#[test]
fn settings_places_that_take_other_shapes_too() {
    let loaded =
        loads(FileFormat::Json, r#"{"fs": {"bash": {"sandbox": "off"}}, "defaults": null}"#);
    let fs = loaded.config.fs.as_ref().map(|fs| format!("{:?}", fs.bash.sandbox.mode));
    assert_eq!(fs.as_deref(), Some("Some(Off)"));
}

/// External tools may be a list of tools, each the mapping of its settings.
#[cfg(feature = "external")]
#[test]
fn external_tools_as_a_list_of_settings() {
    let loaded = loads(
        FileFormat::Json,
        r#"{"externalTools": [{"name": "confirm", "description": "Ask"}]}"#,
    );
    assert_eq!(loaded.config.external_tools.keys().collect::<Vec<_>>(), ["confirm"]);
    json_error(
        r#"{"externalTools": [["confirm"]]}"#,
        expect![[
            r#"toolmux.json:1:19: externalTools[0]: expected a mapping of its settings (`key: value` entries); found a list"#
        ]],
    );
    yaml_error(
        "externalTools:\n  - confirm\n",
        expect![[
            r#"toolmux.yaml:2:3: externalTools[0]: expected a mapping of its settings (`key: value` entries); found the string "confirm""#
        ]],
    );
}

/// What reaches a stdio server's environment other than through `${VAR}` is a secret when
/// its variable's name sounds secret: a literal `env` entry and a variable of
/// `envPassthrough`, so a server that prints its environment leaks neither into a log or an
/// error. A setting (`PORT`, `LOG_LEVEL`, a count) is not.
#[test]
fn server_env_values_under_secret_names_are_secrets() {
    let text = "mcpServers:\n  echo:\n    command: sh\n    env:\n      API_KEY: sk-literal-1234\n      \
                LOG_LEVEL: debug\n      MAX_TOKENS: 4096\n      MONKEY: banana-bread\n    \
                envPassthrough: [GITHUB_TOKEN, PORT, NOT_SET_TOKEN]\n";
    let loaded = loads(FileFormat::Yaml, text);
    assert_eq!(loaded.secrets, ["sk-literal-1234", "ghp_secret_value"]);
    let redactor = toolmux_orchestrator::Redactor::new(loaded.secrets.iter().cloned());
    let stderr = "API_KEY=sk-literal-1234\nGITHUB_TOKEN=ghp_secret_value\nPORT=8080\nLOG_LEVEL=debug\nMAX_TOKENS=4096\nMONKEY=banana-bread";
    expect![[r#"
        API_KEY=[redacted]
        GITHUB_TOKEN=[redacted]
        PORT=8080
        LOG_LEVEL=debug
        MAX_TOKENS=4096
        MONKEY=banana-bread"#]]
    .assert_eq(&redactor.redact(stderr));
    let shown = loaded.effective_yaml();
    assert!(shown.contains("API_KEY: '[redacted]'"), "{shown}");
    // The same in JSON, where the value under a secret name is a `${VAR}` already judged.
    let loaded = loads(
        FileFormat::Json,
        r#"{"mcpServers": {"gh": {"command": "gh-mcp", "env": {"GH_PAT": "ghp_literal_987", "T": "${GITHUB_TOKEN}"}}}}"#,
    );
    assert_eq!(loaded.secrets, ["ghp_secret_value", "ghp_literal_987"]);
}

/// Agents and models take settings too, in a JSON file as in YAML.
#[cfg(feature = "agent")]
#[test]
fn an_agent_or_a_model_given_a_list() {
    json_error(
        r#"{"models": {"m": {"type": "openai", "model": "x"}}, "agents": {"a": ["m", "be brief"]}}"#,
        expect![
            "toolmux.json:1:69: agents.a: expected a mapping of its settings (`key: value` entries); found a list"
        ],
    );
    yaml_error(
        "models:\n  m: [openai, gpt]\n",
        expect![
            "toolmux.yaml:2:6: models.m: expected a mapping of its settings (`key: value` entries); found a list"
        ],
    );
}

/// The error and its causes, as the binary prints them.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(e) = cause {
        text.push_str(&format!(": {e}"));
        cause = e.source();
    }
    text
}

/// Loads the file at `path`, failing the test should the load block.
fn load_within(path: &Path) -> Result<Loaded, ToolmuxError> {
    let path = path.to_path_buf();
    crate::test_support::within_10s("the load", move || load(&path, "toolmux.yaml", &env))
}

#[test]
fn a_configuration_that_is_a_fifo_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let fifo = crate::test_support::fifo(dir.path(), "toolmux.yaml");
    let e = load_within(&fifo).expect_err("a FIFO is no configuration");
    assert!(e.is_config());
    expect![[r#"cannot read the configuration file toolmux.yaml: it is a FIFO (named pipe), not a regular file: give the path of a configuration file"#]]
        .assert_eq(&with_causes(&e));
}

#[test]
fn a_configuration_that_is_a_device_is_refused() {
    let e = load_within(Path::new("/dev/zero")).expect_err("a device is no configuration");
    expect![[r#"cannot read the configuration file toolmux.yaml: it is a character device, not a regular file: give the path of a configuration file"#]]
        .assert_eq(&with_causes(&e));
}

#[test]
fn a_configuration_over_16_mib_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join("toolmux.yaml");
    let mut list = String::from("fs:\n  hide:\n");
    while list.len() < 17 * 1024 * 1024 {
        list.push_str("    - some/generated/path/that/goes/on\n");
    }
    std::fs::write(&path, &list).expect("written");
    let e = load_within(&path).expect_err("too big");
    expect![[r#"cannot read the configuration file toolmux.yaml: it is 17.0 MiB, over the limit of 16 MiB for a configuration file: one that big is likely a mistake (a wrong path, or generated data)"#]]
        .assert_eq(&with_causes(&e));
}

/// 20 000 nested `{a: ` took the YAML parser 13 s (debug build) to refuse with `recursion
/// limit exceeded`; the nesting check refuses it before parsing.
#[test]
fn deeply_nested_flow_collections_are_refused_before_parsing() {
    let text = format!("fs: {}1{}\n", "{a: ".repeat(20_000), "}".repeat(20_000));
    yaml_error(
        &text,
        expect![[
            "toolmux.yaml:1:1029: flow collections (`[` and `{`) nested more than 256 deep: no configuration needs that; write fewer levels (is the file generated or damaged?)"
        ]],
    );
    let text = format!("a: 1\nfs:\n  x: {}\n", "[".repeat(20_000));
    yaml_error(
        &text,
        expect![[
            "toolmux.yaml:3:262: flow collections (`[` and `{`) nested more than 256 deep: no configuration needs that; write fewer levels (is the file generated or damaged?)"
        ]],
    );
}

/// A key or value holding terminal escapes (`\e[2J` clears the screen) is quoted escaped,
/// never printed raw: a cloned project's file could clear or colour the terminal.
#[test]
fn control_characters_in_keys_and_values_are_escaped_in_errors() {
    // A section whose keys are the same whatever features are built.
    yaml_error(
        "permissions:\n  \"\\e[2J\\e[31mallow\": []\n",
        expect![[
            r#"toolmux.yaml:2:3: unknown key `\u{1b}[2J\u{1b}[31mallow` in permissions; valid keys: allow, deny, ask"#
        ]],
    );
    yaml_error(
        "mcpServers:\n  \"a\\x9b\\x7f\": {command: x, transport: \"\\e[2Jstdio\"}\n",
        expect![[
            r#"toolmux.yaml:2:40: unknown value `\u{1b}[2Jstdio` for mcpServers.a\u{9b}\u{7f}.transport; expected one of: stdio, http, streamable-http, streamableHttp, streamable_http, sse, websocket, ws"#
        ]],
    );
    yaml_error(
        "fs: {}\n\"\\t\\e]0;x\\a\": 1\n\"\\t\\e]0;x\\a\": 2\n",
        expect![[
            r#"toolmux.yaml:1:1: key `\t\u{1b}]0;x\u{7}` is given twice in one object: keep one (the last would win)"#
        ]],
    );
}

/// `servers` is VS Code's name for `mcpServers`: a file with both was told `duplicate
/// field `mcpServers``, a key its author wrote once.
#[test]
fn servers_and_mcp_servers_together_are_one_section_twice() {
    yaml_error(
        "mcpServers:\n  a: {command: x}\nservers:\n  b: {command: y}\n",
        expect![[
            "toolmux.yaml:3:1: the file has both `servers` (VS Code's form) and `mcpServers`, two names of one section: move the servers of one into the other and keep one of them"
        ]],
    );
    json_error(
        "{\"servers\": {\"b\": {\"command\": \"y\"}},\n \"mcpServers\": {\"a\": {\"command\": \"x\"}}}\n",
        expect![[
            "toolmux.json:2:2: the file has both `servers` (VS Code's form) and `mcpServers`, two names of one section: move the servers of one into the other and keep one of them"
        ]],
    );
}

/// A server's transport against what it is given, a queue without slots and a permission
/// rule that cannot be read are refused at load with the line of the value at fault, where
/// `type: stdio` with only a `url` passed `config check` and failed the run, and the
/// others were told without a line as the providers started.
#[test]
fn settings_that_cannot_work_are_refused_with_their_line() {
    yaml_error(
        "mcpServers:\n  a:\n    type: stdio\n    url: http://127.0.0.1:1/mcp\n",
        expect![
            "toolmux.yaml:3:11: mcpServers.a.type: `type: stdio` needs `command`, the program to start, and this server has only `url`: for a server toolmux connects to write `type: http` (or `sse`, `websocket`), or leave `type` out"
        ],
    );
    json_error(
        "{\"servers\": {\"a\": {\n  \"type\": \"http\", \"command\": \"echo\"}}}",
        expect![
            "toolmux.json:2:11: servers.a.type: `type: http` needs `url`, the server's address, and this server has only `command`: for a program toolmux starts write `type: stdio`, or leave `type` out"
        ],
    );
    yaml_error(
        "mcpServers:\n  a:\n    command: null\n",
        expect![
            "toolmux.yaml:3:14: mcpServers.a.command: neither `command` nor `url` is set: give `command` (a program toolmux starts) or `url` (a server it connects to), or `enabled: false` to keep the entry unused"
        ],
    );
    yaml_error(
        "mcpServers:\n  a:\n    url: ftp://127.0.0.1/x\n",
        expect![
            "toolmux.yaml:3:10: mcpServers.a.url: has the scheme `ftp`; the http transport takes http:// or https://"
        ],
    );
    // What comes before a value's first `://` is shown only when it is a scheme people
    // write: it showed `example.com/mcp?token=ghp_secret_value&cb=http`.
    yaml_error(
        "mcpServers:\n  a:\n    url: 'example.com/mcp?token=${GITHUB_TOKEN}&cb=http://x'\n",
        expect![[
            r#"toolmux.yaml:3:10: mcpServers.a.url: "example.com/mcp?token=${GITHUB_TOKEN}&cb=http://x" as expanded does not start with a scheme the http transport takes: it takes http:// or https://"#
        ]],
    );
    // A scheme in capitals is the same scheme: `WSS://` is a WebSocket server's.
    let loaded = loads(FileFormat::Yaml, "mcpServers:\n  a:\n    url: WSS://127.0.0.1/x\n");
    assert_eq!(loaded.config.mcp_servers["a"].url.as_deref(), Some("WSS://127.0.0.1/x"));
    yaml_error(
        "mcpServers:\n  a:\n    type: websocket\n    url: '${PORT}'\n",
        expect![[
            r#"toolmux.yaml:4:10: mcpServers.a.url: "${PORT}" as expanded must start with ws:// or wss://, as in ws://127.0.0.1:8080/mcp"#
        ]],
    );
    yaml_error(
        "queues:\n  q:\n    concurrent: 0\n",
        expect![
            "toolmux.yaml:3:17: queues.q.concurrent: `concurrent: 0` lets no call run; give at least 1 slot"
        ],
    );
    yaml_error(
        "permissions:\n  allow:\n    - fs__read\n    - \"fs__read((\"\n",
        expect![
            "toolmux.yaml:4:8: permissions.allow: rule `fs__read((` does not end with `)`; a rule on calls is written `TOOL(WHAT)`, as in `fs__bash(git *)`"
        ],
    );
    check_error(
        FileFormat::Toml,
        "[queues.q]\nconcurrent = 0\n",
        expect![
            "toolmux.toml:2:1: queues.q.concurrent: `concurrent: 0` lets no call run; give at least 1 slot"
        ],
    );
    // A disabled entry is not checked; a server given both keeps working as before.
    loads(
        FileFormat::Yaml,
        "mcpServers:\n  a: {type: stdio, url: 'http://h/', enabled: false}\n  b: {command: x, url: 'http://h/'}\n",
    );
}

/// A file's format is told by its extension whatever its case: `TOOLMUX.JSON` with a
/// comment was read as YAML and failed; a file whose extension names no format loads as
/// YAML with a warning saying so.
#[test]
fn the_format_by_extension_whatever_its_case() {
    let json = "{\n  // comment\n  \"mcpServers\": {\"a\": {\"command\": \"x\"},}\n}\n";
    for name in ["TOOLMUX.JSON", "toolmux.Jsonc"] {
        let (_dir, loaded) = load_file(name, json);
        let loaded = loaded.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(loaded.config.mcp_servers["a"].command.as_deref(), Some("x"));
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    }
    assert_eq!(FileFormat::of(Path::new("a.TOML")), FileFormat::Toml);
    assert_eq!(FileFormat::of(Path::new("a.YML")), FileFormat::Yaml);
    let (_dir, loaded) = load_file("toolmux.conf", "mcpServers:\n  a: {command: x}\n");
    let loaded = loaded.unwrap_or_else(|e| panic!("{e}"));
    expect![[r#"
        [
            "toolmux.conf: read as YAML: its extension `.conf` names no format (name it .yaml, .yml, .json, .jsonc or .toml to say which)",
        ]
    "#]]
    .assert_debug_eq(&loaded.warnings);
    let (_dir, loaded) = load_file("toolmux", "fs: {}\n");
    let loaded = loaded.unwrap_or_else(|e| panic!("{e}"));
    expect![[r#"
        [
            "toolmux: read as YAML: it has no extension, which names no format (name it .yaml, .yml, .json, .jsonc or .toml to say which)",
        ]
    "#]]
    .assert_debug_eq(&loaded.warnings);
}

/// Top-level `x-*` keys hold YAML anchors, as in Docker Compose, and are ignored, where
/// they were refused as unknown keys; other unknown keys are still refused with a
/// suggestion, and errors in such a file still have their line.
#[test]
fn top_level_x_keys_are_ignored() {
    let loaded = loads(
        FileFormat::Yaml,
        "x-common: &common\n  command: x\n  env: {A: '1'}\nx-args: &args [--verbose]\nmcpServers:\n  a:\n    <<: *common\n  b:\n    command: y\n    args: *args\n",
    );
    let servers = &loaded.config.mcp_servers;
    assert_eq!((servers["a"].command.as_deref(), servers["a"].env["A"].as_str()), (Some("x"), "1"));
    assert_eq!(servers["b"].args, ["--verbose"]);
    assert!(
        loads(FileFormat::Json, "{\"x-note\": {\"any\": [1]}, \"fs\": {}}").config.fs.is_some()
    );
    yaml_error(
        "x-a: 1\nfs:\n  rooot: /x\n",
        expect!["toolmux.yaml:3:3: unknown key `rooot` in fs; did you mean `root`?"],
    );
    // The valid keys listed depend on the features built.
    let error =
        load_as(FileFormat::Yaml, "x: 1\nx-: 2\nfs: {}\n").map(drop).unwrap_err().to_string();
    assert!(
        error.starts_with(
            "toolmux.yaml:1:1: unknown key `x` at the top level; valid keys: $schema,"
        ),
        "{error}"
    );
}

/// The messages and warnings the model's own code words (an unknown client profile, unused
/// `autoApprove` names, a `${input:…}` left as it is) show a control character of the file
/// escaped, as the parser's errors do, where a terminal received it as it was.
#[test]
fn messages_of_the_model_escape_control_characters() {
    let loaded = loads(
        FileFormat::Json,
        r#"{"serve": {"client": "cl\u001b[2J"}, "mcpServers": {"a": {"command": "x", "autoApprove": ["t\u0007"], "args": ["${input:k\u001b}"]}}}"#,
    );
    let profile = loaded.config.serve.client_profile();
    let Err(message) = profile else { panic!("{profile:?}") };
    assert!(message.starts_with("no client profile `cl\\u{1b}[2J`;"), "{message}");
    let warnings = loaded.warnings.join("\n");
    assert!(!warnings.chars().any(|c| c.is_control() && c != '\n'), "{warnings:?}");
    assert!(warnings.contains("(t\\u{7})") && warnings.contains("${input:k\\u{1b}}"), "{warnings}");
}

/// A key given twice is shown at its second occurrence, where YAML's was shown at the
/// start of its mapping (1:1 for the top level).
#[test]
fn a_key_given_twice_is_shown_where_it_comes_again() {
    yaml_error(
        "# servers\nmcpServers:\n  a:\n    command: x\n\n  b: {command: y}\n  # a again\n  a:\n    command: z\n",
        expect![
            "toolmux.yaml:8:3: mcpServers: key `a` is given twice in one object: keep one (the last would win)"
        ],
    );
    yaml_error(
        "fs: {}\nqueues: {q: {concurrent: 1}}\nfs: {}\n",
        expect![
            "toolmux.yaml:3:1: key `fs` is given twice in one object: keep one (the last would win)"
        ],
    );
    yaml_error(
        "agents:\n  - fs: {}\n    fs: {}\n",
        expect![
            "toolmux.yaml:3:5: agents[0]: key `fs` is given twice in one object: keep one (the last would win)"
        ],
    );
    json_error(
        "{\"fs\": {},\n \"fs\": {}}",
        expect![
            "toolmux.json:2:5: key `fs` is given twice in one object: keep one (the last would win)"
        ],
    );
}

/// Numbers, booleans and enum values may come from the environment: the reference is typed
/// once expanded, where `concurrent: ${SLOTS}` was refused as a string and `type: ${T}` as
/// an unknown value. A value that still does not fit is an error naming the key and its
/// line.
#[test]
fn numbers_booleans_and_enums_are_expanded_before_typing() {
    let loaded = loads(
        FileFormat::Yaml,
        "queues:\n  q: {concurrent: '${PORT}', waitTimeoutMs: '${NOPE:-250}'}\nmcpServers:\n  a: {type: '${NOPE:-http}', url: 'http://127.0.0.1:${PORT}/mcp', lazy: '${NOPE:-true}'}\n",
    );
    let queue = &loaded.config.queues["q"];
    assert_eq!((queue.concurrent, queue.wait_timeout_ms), (8080, Some(250)));
    let server = &loaded.config.mcp_servers["a"];
    assert_eq!(server.transport, Some(toolmux_mcp::TransportKind::Http));
    assert!(server.lazy);
    // An error after a reference the text's reading passed over is still found.
    yaml_error(
        "queues:\n  q:\n    concurrent: ${PORT}\nfs:\n  rooot: x\n",
        expect!["toolmux.yaml:5:3: unknown key `rooot` in fs; did you mean `root`?"],
    );
    // A value from the environment that does not fit is not shown: it may be a credential.
    yaml_error(
        "queues:\n  q:\n    concurrent: ${NOPE:-many}\n",
        expect![[
            r#"toolmux.yaml:3:5: queues.q.concurrent: expected a whole number, such as 10; found the string "${NOPE:-many}" as expanded"#
        ]],
    );
    // Nor once read as a number that then does not fit: it was shown in backticks.
    for value in ["98765432109", "-987654", "1.5"] {
        let text = format!("mcpServers:\n  a: {{command: x, maxRestarts: '${{NOPE:-{value}}}'}}\n");
        let error = load_as(FileFormat::Yaml, &text).map(drop).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "toolmux.yaml:2:19: mcpServers.a.maxRestarts: \"${{NOPE:-{value}}}\" as expanded \
                 does not fit here"
            )
        );
    }
    let error =
        load_as(FileFormat::Yaml, "mcpServers:\n  a: {command: x, lazy: '${GITHUB_TOKEN}'}\n")
            .map(drop)
            .unwrap_err()
            .to_string();
    assert!(!error.contains("ghp_secret_value") && error.contains("${GITHUB_TOKEN}"), "{error}");
}

/// Every top-level section the loader reads as its defaults when nothing is under it
/// (`mcpServers:` with its entries commented out) is one the schema lets be `null`, where
/// the schema refused all but `fs` and editors flagged files toolmux loads.
#[test]
fn the_schema_lets_every_section_be_empty_as_the_loader_does() {
    let schema = crate::config::schema();
    let sections = schema["properties"].as_object().expect("properties");
    assert!(sections.len() > 10, "{sections:?}");
    for (key, section) in sections {
        if key == "servers" {
            continue;
        }
        let text = format!("{key}:\n");
        if let Err(e) = load_as(FileFormat::Yaml, &text) {
            panic!("{key}: {e}");
        }
        assert!(crate::config::admits_null(section), "{key}: {section}");
    }
    let servers = loads(FileFormat::Yaml, "servers:\n");
    assert!(servers.config.mcp_servers.is_empty());
    assert!(crate::config::admits_null(&sections["servers"]));
}

/// The error of a file whose `${MCP_URL}` (or any other variable of `vars`) holds `value`.
fn error_with(text: &str, vars: &[(&str, &str)]) -> String {
    let env = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned());
    match load_str(text, FileFormat::Yaml, "toolmux.yaml", Path::new("/proj"), &env) {
        Ok(loaded) => panic!("loaded: {:?}", loaded.config),
        Err(e) => e.to_string(),
    }
}

/// A server's `url` from the environment that cannot work is told by its reference as
/// written and what is wrong, never by any of its value (which may hold a token), whatever
/// the fault: the host, the port and spaces were not checked at load, and the scheme's
/// error did not say where the URL came from.
#[test]
fn a_url_from_the_environment_is_told_by_its_reference() {
    let text = "mcpServers:\n  a:\n    url: ${MCP_URL}\n";
    let cases = [
        // No scheme.
        (
            "127.0.0.1:8080/mcp?token=SECRET123",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded must start with http:// or https://, as in http://127.0.0.1:8080/mcp"#
            ]],
        ),
        // A scheme people write is named; any other text before `://` is not.
        (
            "ftp://127.0.0.1/mcp?token=SECRET123",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded has the scheme `ftp`; the http transport takes http:// or https://"#
            ]],
        ),
        (
            "SECRET123.example.com/mcp?cb=http://x",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded does not start with a scheme the http transport takes: it takes http:// or https://"#
            ]],
        ),
        // The host.
        (
            "http://?token=SECRET123",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded has no host: name the server after http://, as in http://127.0.0.1:8080/mcp"#
            ]],
        ),
        (
            "http://SECRET123<x>/mcp",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded has a host that no server can have (a character such as `<`, `>`, `%`, `^` or `|` in its name): name the server after http://, as in http://127.0.0.1:8080/mcp"#
            ]],
        ),
        (
            "https://10.0.0.300/mcp?token=SECRET123",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded has a host that reads as an IPv4 address and is none (four numbers from 0 to 255): as in http://127.0.0.1:8080/mcp"#
            ]],
        ),
        (
            "http://[::1/mcp?token=SECRET123",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded has a host that reads as an IPv6 address and is none: write one in brackets, as in http://[::1]:8080/mcp"#
            ]],
        ),
        // The port.
        (
            "http://127.0.0.1:99999/mcp?token=SECRET123",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded has a port that is no number from 0 to 65535: write it after the host's `:`, as in http://127.0.0.1:8080/mcp"#
            ]],
        ),
        (
            "http://127.0.0.1:SECRET123/mcp",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded has a port that is no number from 0 to 65535: write it after the host's `:`, as in http://127.0.0.1:8080/mcp"#
            ]],
        ),
        // Spaces, tabs and line breaks, which the parser would drop or encode.
        (
            "http://127.0.0.1:8080/mcp?token=SECRET123 --verbose",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded holds a space, a tab or a line break, which no URL does: remove it, or write a space in a path or query as %20"#
            ]],
        ),
        (
            "http://127.0.0.1:8080/m\ncp?token=SECRET123",
            expect![[
                r#"toolmux.yaml:3:10: mcpServers.a.url: "${MCP_URL}" as expanded holds a space, a tab or a line break, which no URL does: remove it, or write a space in a path or query as %20"#
            ]],
        ),
    ];
    for (value, expected) in cases {
        let error = error_with(text, &[("MCP_URL", value)]);
        assert!(!error.contains("SECRET123"), "{error}");
        expected.assert_eq(&error);
    }
    // A WebSocket server's, and a reference inside the text: the text as written is shown.
    let error = error_with(
        "mcpServers:\n  a:\n    type: websocket\n    url: 'ws://${HOST}/mcp'\n",
        &[("HOST", "SECRET123:70000")],
    );
    expect![[r#"toolmux.yaml:4:10: mcpServers.a.url: "ws://${HOST}/mcp" as expanded has a port that is no number from 0 to 65535: write it after the host's `:`, as in ws://127.0.0.1:8080/mcp"#]].assert_eq(&error);
    // A good URL loads, spaces at its ends dropped as the MCP client's parser drops them.
    let env =
        |name: &str| (name == "MCP_URL").then(|| " https://[::1]:8443/mcp?token=x\n".to_owned());
    let loaded = load_str(text, FileFormat::Yaml, "toolmux.yaml", Path::new("/proj"), &env)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        loaded.config.mcp_servers["a"].url.as_deref(),
        Some(" https://[::1]:8443/mcp?token=x\n")
    );
}

/// The URL checks a value from the environment gets are those of a URL written in the file,
/// which is shown as it is not secret: the host, the port and spaces were checked only as
/// the server was started, without a line.
#[test]
fn a_written_url_is_checked_for_its_host_port_and_spaces() {
    yaml_error(
        "mcpServers:\n  a:\n    url: http://127.0.0.1:8o80/mcp\n",
        expect![[
            r#"toolmux.yaml:3:10: mcpServers.a.url: has a port that is no number from 0 to 65535: write it after the host's `:`, as in http://127.0.0.1:8080/mcp"#
        ]],
    );
    yaml_error(
        "mcpServers:\n  a:\n    url: 'https://my server/mcp'\n",
        expect![[
            r#"toolmux.yaml:3:10: mcpServers.a.url: holds a space, a tab or a line break, which no URL does: remove it, or write a space in a path or query as %20"#
        ]],
    );
    json_error(
        "{\"mcpServers\": {\"a\": {\"type\": \"sse\",\n  \"url\": \"http://:8080/sse\"}}}",
        expect![[
            r#"toolmux.json:2:10: mcpServers.a.url: has no host: name the server after http://, as in http://127.0.0.1:8080/mcp"#
        ]],
    );
}

/// A boolean, an enum's value or a number of milliseconds from the environment that does
/// not fit is told by its reference, never its value, as numbers are (02b4410).
#[test]
fn a_boolean_or_enum_from_the_environment_is_told_by_its_reference() {
    let error = error_with(
        "mcpServers:\n  a:\n    command: x\n    enabled: ${ON}\n",
        &[("ON", "maybe-SECRET123")],
    );
    expect![[r#"toolmux.yaml:4:5: mcpServers.a.enabled: expected true or false; found the string "${ON}" as expanded"#]].assert_eq(&error);
    let error =
        error_with("mcpServers:\n  a:\n    command: x\n    type: ${T}\n", &[("T", "SECRET123")]);
    expect![[r#"toolmux.yaml:4:5: mcpServers.a.type: "${T}" as expanded is none of the values it takes: stdio, http, streamable-http, streamableHttp, streamable_http, sse, websocket, ws"#]].assert_eq(&error);
    let error = error_with("defaults:\n  toolTimeout: ${T}\n", &[("T", "30s-SECRET123")]);
    expect![[r#"toolmux.yaml:2:3: defaults.toolTimeout: expected a number of milliseconds, such as 30000; found the string "${T}" as expanded"#]].assert_eq(&error);
    let error = error_with("fs:\n  bash:\n    enabled: ${ON}\n", &[("ON", "SECRET123")]);
    expect![[r#"toolmux.yaml:3:5: fs.bash.enabled: "${ON}" as expanded does not fit here"#]]
        .assert_eq(&error);
    // What fits is typed: `yes` is no boolean of YAML 1.2, `true` and `false` are.
    let env = |name: &str| (name == "ON").then(|| "false".to_owned());
    let loaded = load_str(
        "mcpServers:\n  a: {command: x, enabled: '${ON}'}\n",
        FileFormat::Yaml,
        "toolmux.yaml",
        Path::new("/proj"),
        &env,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.config.mcp_servers["a"].enabled, Some(false));
}

/// A setting that names a queue no `queues` entry defines is refused at load with the line
/// of its `queue` and the closest defined queue, where it was told without a line as the
/// tools were assembled (the orchestrator's check).
#[test]
fn an_undefined_queue_is_told_with_its_line_and_the_closest_queue() {
    yaml_error(
        "queues:\n  fast: {concurrent: 2}\n  slow: {concurrent: 1}\nmcpServers:\n  a:\n    command: x\n    queue: fats\n",
        expect![
            "toolmux.yaml:7:12: mcpServers.a.queue: queue `fats` is not defined under `queues`; did you mean `fast`?"
        ],
    );
    json_error(
        "{\"queues\": {\"fast\": {\"concurrent\": 2}},\n \"tools\": {\"fs__grep\": {\n  \"queue\": \"nope\"}}}",
        expect![
            "toolmux.json:3:12: tools.fs__grep.queue: queue `nope` is not defined under `queues`; the queues defined are fast"
        ],
    );
    check_error(
        FileFormat::Toml,
        "[queues.fast]\nconcurrent = 2\n\n[restTools.lookup]\nurl = \"http://127.0.0.1:9/x\"\nqueue = \"fsat\"\n",
        expect![
            "toolmux.toml:6:1: restTools.lookup.queue: queue `fsat` is not defined under `queues`; did you mean `fast`?"
        ],
    );
    yaml_error(
        "openapi:\n  pets: {spec: pets.yaml, queue: slow}\n",
        expect![
            "toolmux.yaml:2:34: openapi.pets.queue: queue `slow` is not defined under `queues`; no queue is defined: add one under `queues`, as in `queues: {slow: {concurrent: 4}}`"
        ],
    );
    // A name from the environment is shown as its reference.
    let error = error_with(
        "queues: {fast: {concurrent: 2}}\nservers:\n  a: {command: x, queue: '${Q}'}\n",
        &[("Q", "SECRET123")],
    );
    expect![[r#"toolmux.yaml:3:26: mcpServers.a.queue: "${Q}" as expanded names no queue defined under `queues`; the queues defined are fast"#]].assert_eq(&error);
    // A server that is not started is not checked, as its settings are never used.
    loads(
        FileFormat::Yaml,
        "mcpServers:\n  a: {command: x, queue: nope, enabled: false}\n  b: {command: x, queue: nope, disabled: true}\n",
    );
}

/// A list, a map or a switch of a server's entry written as `null` (`args:` with nothing
/// under it) is not set, to the loader and to the schema alike, as a section is: `args`,
/// `env`, `headers`, `toolsDenied` and more were refused by both, while `toolsAllowed`
/// passed both.
#[test]
fn every_key_of_a_server_may_be_null_to_the_loader_and_the_schema() {
    let schema = crate::config::schema();
    let keys = schema["$defs"]["McpServerEntry"]["properties"].as_object().expect("properties");
    assert!(keys.len() > 30, "{keys:?}");
    for (key, property) in keys {
        let given = if key == "command" { "url: http://127.0.0.1:1/mcp" } else { "command: x" };
        let text = format!("mcpServers:\n  a:\n    {given}\n    {key}: null\n");
        if let Err(e) = load_as(FileFormat::Yaml, &text) {
            panic!("{key}: {e}");
        }
        // A key of any value (VS Code's `dev`) has a schema of no type.
        let any = ["type", "anyOf", "oneOf", "$ref"].iter().all(|k| property.get(k).is_none());
        assert!(any || crate::config::admits_null(property), "{key}: {property}");
    }
    let loaded = loads(
        FileFormat::Json,
        r#"{"mcpServers": {"a": {"command": "x", "args": null, "env": null, "headers": null, "toolsAllowed": null, "lazy": null}}}"#,
    );
    let server = &loaded.config.mcp_servers["a"];
    assert!(server.args.is_empty() && server.env.is_empty() && server.headers.is_empty());
    assert_eq!((server.tools_allowed.as_ref(), server.lazy), (None, false));
}

/// A quoted key ending in a character of several bytes (`"café"`) is found for the
/// error's line, where the search went on from inside that character and panicked.
#[test]
fn an_error_under_a_key_ending_in_a_multibyte_character_has_its_line() {
    json_error(
        r#"{"mcpServers": {"café": {}}}"#,
        expect![
            "toolmux.json:1:25: mcpServers.café.command: neither `command` nor `url` is set: give `command` (a program toolmux starts) or `url` (a server it connects to), or `enabled: false` to keep the entry unused"
        ],
    );
    json_error(
        "{\"mcpServers\": {\n  \"é\":\n    {\"args\": []}}}",
        expect![
            "toolmux.json:3:5: mcpServers.é.command: neither `command` nor `url` is set: give `command` (a program toolmux starts) or `url` (a server it connects to), or `enabled: false` to keep the entry unused"
        ],
    );
    yaml_error(
        "mcpServers:\n  \"café\": {}\n",
        expect![
            "toolmux.yaml:2:11: mcpServers.café.command: neither `command` nor `url` is set: give `command` (a program toolmux starts) or `url` (a server it connects to), or `enabled: false` to keep the entry unused"
        ],
    );
    yaml_error(
        "mcpServers:\n  'naïveté':\n    comand: x\n",
        expect![
            "toolmux.yaml:3:5: unknown key `comand` in mcpServers.naïveté; did you mean `command`?"
        ],
    );
}
