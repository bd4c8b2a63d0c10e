//! Configuration files of other tools load as they are (Gemini CLI's and Zed's settings for
//! their MCP servers); variables expand; secrets stay secret; relative paths follow the file.

use crate::{Project, toolmux_bin};
use expect_test::expect;

#[test]
fn claude_desktop_file_loads() {
    // The MCP server is toolmux itself, serving its builtin tools on stdio.
    let project = Project::new();
    project.file("inner/notes.txt", "TODO: inner\n").file(
        "claude_desktop_config.json",
        &format!(
            r#"{{
  "mcpServers": {{
    "Inner Tools": {{
      "command": "{}",
      "args": ["serve", "--stdio"],
      "cwd": "inner",
      "env": {{"RUST_LOG": "off"}}
    }},
    "off": {{"command": "never-started", "disabled": true, "autoApprove": ["x"]}}
  }},
  "globalShortcut": "Ctrl+Space"
}}"#,
            toolmux_bin()
        ),
    );
    let run = project.run(&[
        "--config",
        "claude_desktop_config.json",
        "tools",
        "call",
        "inner-tools__fs__grep",
        r#"{"pattern":"TODO"}"#,
    ]);
    expect!["notes.txt"].assert_eq(run.ok().trim());
    assert!(run.stderr.contains("are named `inner-tools__*`"), "{}", run.stderr);
    // The app's own settings and keys are named, not refused; `disabled` is read.
    assert!(
        run.stderr.contains(
            "`globalShortcut` is not a toolmux setting: this file is read for its MCP servers only"
        ),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("mcpServers.off: autoApprove/alwaysAllow (x) is not used"),
        "{}",
        run.stderr
    );
    let check = project.run(&["--config", "claude_desktop_config.json", "config", "check"]);
    assert!(
        !check.stdout.contains("never-started") && !check.stdout.contains("off "),
        "{}",
        check.stdout
    );
    // A typo of toolmux's own key is still one.
    project.file("typo.json", r#"{"mcpServers": {}, "defualts": {}}"#);
    let typo = project.run(&["--config", "typo.json", "tools", "list"]);
    assert_eq!(typo.code, 2, "{}", typo.stderr);
    assert!(typo.stderr.contains("defaults"), "{}", typo.stderr);
}

#[test]
fn vscode_mcp_json_loads() {
    let project = Project::new();
    project.file("notes.txt", "TODO: top\n").file(
        ".vscode/mcp.json",
        &format!(
            r#"{{
  // VS Code: comments, trailing commas, `servers`, `inputs`, ${{workspaceFolder}}.
  "inputs": [{{"type": "promptString", "id": "key", "description": "Key", "password": true}}],
  "servers": {{
    "mine": {{
      "type": "stdio",
      "command": "{}",
      "args": ["serve", "--stdio"],
      "cwd": "${{workspaceFolder}}",
      "env": {{"HOME_COPY": "${{env:HOME}}"}},
      "gallery": "https://api.mcp.github.com/2025-09-15",
      "version": "1.2.0",
      "dev": {{"watch": "src/**/*.ts"}},
    }},
  }},
}}"#,
            toolmux_bin()
        ),
    );
    let run = project.run(&[
        "--config",
        ".vscode/mcp.json",
        "tools",
        "call",
        "mine__fs__grep",
        r#"{"pattern":"TODO"}"#,
    ]);
    expect!["notes.txt"].assert_eq(run.ok().trim());
    assert!(
        run.stderr.contains("warning: .vscode/mcp.json: `inputs` is ignored"),
        "{}",
        run.stderr
    );
}

/// Codex's `config.toml` as it is: its own settings ignored, `cwd` relative to the file's
/// folder, `disabled_tools` applied, its servers' tools callable.
#[test]
fn codex_config_loads() {
    let project = Project::new();
    project.file("inner/notes.txt", "TODO: inner\n").file(
        ".codex/config.toml",
        &format!(
            r#"model = "gpt-5"
sandbox_mode = "workspace-write"

[mcp_servers.inner]
command = "{}"
args = ["serve", "--stdio"]
cwd = "../inner"
startup_timeout_sec = 20
disabled_tools = ["fs__ls"]

[mcp_servers.inner.env]
RUST_LOG = "off"

[mcp_servers.old]
command = "/nonexistent/server"
enabled = false
"#,
            toolmux_bin()
        ),
    );
    let run = project.run(&["--config", ".codex/config.toml", "config", "check"]);
    let out = run.ok();
    assert!(out.starts_with(".codex/config.toml: configuration is valid\n  inner "), "{out}");
    assert!(out.contains("4 tools"), "{out}");
    let run = project.run(&[
        "--config",
        ".codex/config.toml",
        "tools",
        "call",
        "inner__fs__grep",
        r#"{"pattern":"TODO"}"#,
    ]);
    expect!["notes.txt"].assert_eq(run.ok().trim());
}

/// Gemini CLI's project settings: its own keys ignored, `cwd` relative to the project,
/// `excludeTools` and `mcp.excluded` applied, `trust` not (a warning says so).
#[test]
fn gemini_settings_load() {
    let project = Project::new();
    project.file("inner/notes.txt", "TODO: inner\n").file(
        ".gemini/settings.json",
        &format!(
            r#"{{
  "theme": "GitHub",
  "selectedAuthType": "gemini-api-key",
  "contextFileName": "GEMINI.md",
  "mcp": {{"excluded": ["old"]}},
  "mcpServers": {{
    "inner": {{
      "command": "{}",
      "args": ["serve", "--stdio"],
      "cwd": "inner",
      "env": {{"RUST_LOG": "off", "HOME_COPY": "$HOME"}},
      "timeout": 20000,
      "trust": true,
      "excludeTools": ["fs__ls"]
    }},
    "old": {{"command": "/nonexistent/server"}}
  }}
}}"#,
            toolmux_bin()
        ),
    );
    let run = project.run(&["--config", ".gemini/settings.json", "config", "check"]);
    let out = run.ok();
    assert!(out.starts_with(".gemini/settings.json: configuration is valid\n  inner "), "{out}");
    // The inner toolmux offers fs__read, fs__grep, fs__glob, fs__ls and output__read.
    assert!(out.contains("4 tools"), "{out}");
    assert!(!out.contains("old"), "{out}");
    assert!(
        run.stderr.contains("mcpServers.inner.trust is ignored: toolmux's `permissions` decide"),
        "{}",
        run.stderr
    );
    let run = project.run(&[
        "--config",
        ".gemini/settings.json",
        "tools",
        "call",
        "inner__fs__grep",
        r#"{"pattern":"TODO"}"#,
    ]);
    expect!["notes.txt"].assert_eq(run.ok().trim());
    let run = project.run(&["--config", ".gemini/settings.json", "tools", "list"]);
    assert!(run.ok().contains("inner__fs__glob"), "{}", run.stdout);
    assert!(!run.stdout.contains("inner__fs__ls"), "{}", run.stdout);
}

/// Zed's settings: `context_servers` in both command forms, a disabled one, and an
/// extension's (left out with a warning); its other settings ignored.
#[test]
fn zed_settings_load() {
    let project = Project::new();
    project.file(
        "zed-settings.json",
        &format!(
            r#"// Zed's settings.json
{{
  "theme": {{"mode": "system", "light": "One Light", "dark": "One Dark"}},
  "ui_font_size": 16,
  "context_servers": {{
    "current": {{"source": "custom", "command": "{bin}", "args": ["serve", "--stdio"], "env": {{"RUST_LOG": "off"}}, "timeout": 30}},
    "older": {{"command": {{"path": "{bin}", "args": ["serve", "--stdio"], "env": null}}, "settings": {{}}}},
    "off": {{"command": "/nonexistent/server", "enabled": false}},
    "postgres-context-server": {{"source": "extension", "settings": {{"database_url": "postgresql://localhost/db"}}}},
  }},
}}"#,
            bin = toolmux_bin()
        ),
    );
    let run = project.run(&["--config", "zed-settings.json", "config", "check"]);
    let out = run.ok();
    let listed: Vec<&str> =
        out.lines().skip(1).filter_map(|line| line.split_whitespace().next()).collect();
    assert_eq!(listed, ["current", "older", "output"], "{out}");
    assert_eq!(out.matches("mcp      5 tools").count(), 2, "{out}");
    assert!(
        run.stderr.contains("context_servers.postgres-context-server is left out"),
        "{}",
        run.stderr
    );
}

#[test]
fn default_values_of_variables() {
    let project = Project::new();
    project
        .file("a/one.txt", "TODO a\n")
        .file("b/two.txt", "TODO b\n")
        .file("toolmux.yaml", "fs:\n  root: ${TOOLMUX_TEST_ROOT:-a}\n");
    let run = project.run(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]);
    expect!["one.txt"].assert_eq(run.ok().trim());
    let project = project.env("TOOLMUX_TEST_ROOT", "b");
    let run = project.run(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]);
    expect!["two.txt"].assert_eq(run.ok().trim());
}

#[test]
fn secrets_from_the_environment_are_redacted() {
    let project = Project::new().env("TOOLMUX_TEST_SECRET", "hunter2-very-secret");
    project.file("leak.txt", "token=hunter2-very-secret\n").file(
        "toolmux.yaml",
        "fs: {}\nmcpServers:\n  off:\n    command: unused\n    enabled: false\n    env: {TOKEN: '${TOOLMUX_TEST_SECRET}'}\n",
    );
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"leak.txt"}"#]);
    expect!["1\ttoken=[redacted]"].assert_eq(run.ok().trim());
    let run = project.run(&[
        "tools",
        "call",
        "fs__grep",
        r#"{"pattern":"hunter2-very-secret","output_mode":"content"}"#,
    ]);
    assert!(!run.stdout.contains("hunter2"), "{}", run.stdout);
    assert!(!run.stderr.contains("hunter2"), "{}", run.stderr);

    // Nor in what the log and the last error quote: a server's own stderr, a URL.
    project.file(
        "toolmux.yaml",
        "mcpServers:\n  loud:\n    command: sh\n    args: [-c, 'echo tok=$0 >&2; exit 3', '${TOOLMUX_TEST_SECRET}']\nopenapi:\n  api:\n    url: 'http://127.0.0.1:9/spec.json?key=${TOOLMUX_TEST_SECRET}'\n",
    );
    let run = project.run(&["-v", "config", "check"]);
    assert_ne!(run.code, 0, "{run:?}");
    // The document's URL is named without its query, where the key was.
    assert!(run.stderr.contains("`http://127.0.0.1:9/spec.json`"), "{}", run.stderr);
    assert!(!run.stderr.contains("hunter2"), "{}", run.stderr);
    assert!(!run.stdout.contains("hunter2"), "{}", run.stdout);
}

/// A short value taken from the environment is redacted where it stands for a credential
/// (an `env` entry) or when its variable's name sounds secret, not where it is a port or a
/// word in a server's arguments: a tool output mentioning the port and the mode reads as
/// it is, where both read `[redacted]`.
#[test]
fn short_values_from_the_environment_are_redacted_only_as_credentials() {
    let project = Project::new()
        .env("TOOLMUX_TEST_LISTEN", "8080")
        .env("TOOLMUX_TEST_MODE", "prod")
        .env("TOOLMUX_TEST_SHORT", "k9x2")
        .env("TOOLMUX_TEST_KEY", "zq7w");
    project.file("log.txt", "listening on 8080 in prod mode, token k9x2, key zq7w\n").file(
        "toolmux.yaml",
        "fs: {}\nmcpServers:\n  off:\n    command: unused\n    enabled: false\n    args: ['--listen', '${TOOLMUX_TEST_LISTEN}', '--mode', '${TOOLMUX_TEST_MODE}', '--label', '${TOOLMUX_TEST_KEY}']\n    env: {TOKEN: '${TOOLMUX_TEST_SHORT}'}\n",
    );
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"log.txt"}"#]);
    expect!["1\tlistening on 8080 in prod mode, token [redacted], key [redacted]"]
        .assert_eq(run.ok().trim());
}

#[test]
fn file_is_found_in_the_current_folder() {
    let project = Project::new();
    project.file("toolmux.json", r#"{"fs": {"permissions": ["read", "write"]}}"#);
    let run = project.run(&["tools", "list"]);
    assert!(run.ok().contains("fs__write"), "{}", run.stdout);
}

/// Two of the files looked for in the current folder are an error naming both, where the
/// first (`toolmux.yaml`) was read and the other passed over without a word; `--config`
/// chooses.
#[test]
fn two_files_in_the_current_folder_are_an_error() {
    let project = Project::new();
    project
        .file("toolmux.yaml", "fs: {}\n")
        .file("toolmux.json", r#"{"fs": {"permissions": ["read", "write"]}}"#);
    let run = project.run(&["tools", "list"]);
    assert_eq!((run.code, run.stdout.as_str()), (2, ""), "{run:?}");
    expect![[r#"
        error: toolmux.yaml: `toolmux.json` is in this folder too, and toolmux reads one file only: remove the one you do not mean, or name the one to read with --config (`--config toolmux.json`)"#]]
    .assert_eq(run.stderr.trim());
    let message = project.run(&["tools", "list", "--json"]).json_error();
    assert!(message.contains("`toolmux.json` is in this folder too"), "{message}");
    let run = project.run(&["--config", "toolmux.json", "tools", "list"]);
    assert!(run.ok().contains("fs__write"), "{run:?}");
    project.file("toolmux.yml", "fs: {}\n");
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("`toolmux.yml` and `toolmux.json` are in this folder too"),
        "{run:?}"
    );
}

/// `config check` counts a provider's one tool as `1 tool`, where it said `1 tools`.
#[test]
fn check_counts_one_tool_in_words() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\n");
    let run = project.run(&["config", "check"]);
    let output = run.ok().lines().find(|l| l.trim_start().starts_with("output "));
    assert!(output.is_some_and(|l| l.contains(" 1 tool (")), "{run:?}");
}

/// Two of the user's files in its folder (`config.yaml` and `config.json`) are an error
/// naming both, as for the project's, where the first was read and the other passed over
/// without a word; once one is removed, the other is read.
#[test]
fn two_users_files_are_an_error() {
    let project = Project::new().unset("TOOLMUX_USER_CONFIG");
    let xdg = project.path().join("xdg");
    let project = project.env("XDG_CONFIG_HOME", xdg.to_str().expect("a UTF-8 path"));
    project
        .file("xdg/toolmux/config.yaml", "fs: {}\n")
        .file("xdg/toolmux/config.json", r#"{"fs": {"permissions": ["read", "write"]}}"#);
    let run = project.run(&["tools", "list"]);
    assert_eq!((run.code, run.stdout.as_str()), (2, ""), "{run:?}");
    assert_eq!(
        run.stderr.trim(),
        format!(
            "error: {}/toolmux/config.yaml (user configuration): `config.json` is in this folder \
             too, and toolmux reads one user configuration file only: keep one of them (move what \
             the others set into it and remove them), or name the one to read with \
             TOOLMUX_USER_CONFIG",
            xdg.display()
        )
    );
    let message = project.run(&["tools", "list", "--json"]).json_error();
    assert!(message.contains("`config.json` is in this folder too"), "{message}");
    std::fs::remove_file(xdg.join("toolmux/config.yaml")).expect("remove config.yaml");
    let run = project.run(&["tools", "list"]);
    assert!(run.ok().contains("fs__write"), "{run:?}");
}

/// `tools.NAME` says what a tool is instead of its provider: the listing shows it, and a
/// setting that names no tool is a warning with the closest name.
#[test]
fn tools_settings_override_what_providers_say() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        "fs: {}\ntools:\n  fs__grep:\n    title: Search\n    description: Search this repository.\n    annotations: {endsTurn: true}\n  fs__gerp: {timeout: 5000}\n",
    );
    let run = project.run(&["tools", "list", "--json"]);
    let tools: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let grep = tools.as_array().unwrap().iter().find(|t| t["name"] == "fs__grep").unwrap();
    assert_eq!(grep["description"], "Search this repository.");
    assert_eq!(grep["title"], "Search");
    assert!(
        run.stderr.contains(
            "`tools.fs__gerp` names no tool of provider `fs`, so its settings apply to nothing; did you mean `fs__grep`?"
        ),
        "{}",
        run.stderr
    );
}

/// Permission rules may name what tools are: `@write` denies every tool that changes
/// state; an unknown selector is a configuration error listing the known ones.
#[test]
fn permission_selectors_match_what_tools_are() {
    let project = Project::new();
    project.file("notes.md", "old\n");
    project.file(
        "toolmux.yaml",
        "fs: {permissions: [read, write]}\npermissions: {deny: ['@write']}\n",
    );
    let run = project.run(&["tools", "call", "fs__write", r#"{"path":"new.md","content":"x"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("denied by rule `permissions.deny: @write`"), "{}", run.stderr);
    assert!(!project.path().join("new.md").exists());
    project.run(&["tools", "call", "fs__read", r#"{"path":"notes.md"}"#]).ok();

    project.file("toolmux.yaml", "fs: {}\npermissions: {ask: ['@writes']}\n");
    let run = project.run(&["tools", "list"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("permissions.ask: unknown selector `@writes`"), "{}", run.stderr);
}

/// Rules on calls judge what a call does: each command of a shell line (a denied one
/// also under a wrapper), the path a file tool leads to through a link; a line that
/// cannot be split needs an approver, which `tools call` has not; a rule that cannot read
/// the calls of the tools it names is a warning.
#[test]
fn permission_rules_on_calls_judge_commands_and_paths() {
    let project = Project::new();
    project.file("keep.txt", "kept\n");
    project.file("secrets/key", "s3cret\n");
    project.file("notes/.keep", "");
    std::os::unix::fs::symlink("secrets", project.path().join("link")).unwrap();
    project.file(
        "toolmux.yaml",
        "fs: {permissions: [read, write, execute]}\npermissions:\n  allow: [fs__read, fs__grep, fs__ls, 'fs__bash(echo *)', 'fs__bash(ls)', 'fs__write(notes/**)']\n  deny: ['fs__bash(rm *)', 'fs__read(secrets/**)', 'fs__task_list(x)']\n",
    );
    let call = |tool: &str, args: &str| project.run(&["tools", "call", tool, args]);
    let run = call("fs__bash", r#"{"command":"echo hi && ls"}"#);
    assert!(run.ok().contains("hi"), "{}", run.stdout);
    assert!(
        run.stderr.contains("`permissions.deny: fs__task_list(x)` matches no call"),
        "{}",
        run.stderr
    );
    let denied = |run: crate::Run, says: &str| {
        assert_eq!(run.code, 1, "{run:?}");
        assert!(run.stderr.contains(says), "{}", run.stderr);
    };
    denied(
        call("fs__bash", r#"{"command":"echo a; bash -c 'rm keep.txt'"}"#),
        "denied by rule `permissions.deny: fs__bash(rm *)` (command `bash -c rm keep.txt`, which runs `rm keep.txt`)",
    );
    assert!(project.path().join("keep.txt").exists());
    denied(
        call("fs__bash", r#"{"command":"echo a | touch made.txt"}"#),
        "command `touch made.txt` is not matched by any `permissions.allow` rule; add one such as `fs__bash(touch *)` to allow it",
    );
    assert!(!project.path().join("made.txt").exists());
    denied(
        call("fs__bash", r#"{"command":"echo $(touch sub.txt)"}"#),
        "a command line with a command substitution (which `permissions.allow` rules cannot judge) requires approval and no approval handler is attached",
    );
    assert!(!project.path().join("sub.txt").exists());
    denied(
        call("fs__read", r#"{"path":"link/key"}"#),
        "denied by rule `permissions.deny: fs__read(secrets/**)` (path `secrets/key`)",
    );
    // What reading is denied, no search or listing shows either.
    let found = call("fs__grep", r#"{"pattern":"s3cret|kept","output_mode":"content"}"#);
    assert!(found.ok().contains("kept") && !found.stdout.contains("s3cret"), "{}", found.stdout);
    let listing = call("fs__ls", r#"{"depth":3}"#);
    assert!(!listing.ok().contains("key"), "{}", listing.stdout);
    call("fs__write", r#"{"path":"notes/a.md","content":"x"}"#).ok();
    denied(
        call("fs__write", r#"{"path":"a.md","content":"x"}"#),
        "path `a.md` is not matched by any `permissions.allow` rule; add one such as `fs__write(a.md)` to allow it",
    );
    assert!(!project.path().join("a.md").exists());

    project.file("toolmux.yaml", "fs: {}\npermissions: {deny: ['fs__bash(git status']}\n");
    let run = project.run(&["tools", "list"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("rule `fs__bash(git status` does not end with `)`"),
        "{}",
        run.stderr
    );
}

#[test]
fn config_check_reports_providers() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\n");
    let run = project.run(&["config", "check"]);
    let out = run.ok();
    assert!(out.starts_with("toolmux.yaml: configuration is valid\n  fs "), "{out}");
    assert!(out.contains("4 tools"), "{out}");
}

#[test]
fn failing_provider_exits_3() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        "defaults: {startupTimeout: 20000}\nmcpServers:\n  broken:\n    command: /nonexistent/server\n",
    );
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stdout.contains("broken"), "{}", run.stdout);
    assert!(
        run.stdout.contains("cannot start `/nonexistent/server`: no such file"),
        "{}",
        run.stdout
    );
    // Said once, in the table, not again as a warning.
    assert!(!run.stderr.contains("failed to start"), "{}", run.stderr);
}

/// `config check` with servers that do not start opens by saying the file is valid and how
/// many providers failed, never as if all were well, and each FAILED row gives its error
/// without the provider's name, which the row shows already.
#[test]
fn config_check_with_failures_says_so_first_and_names_each_server_once() {
    // A loopback port nothing listens on: bound for a free number, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port();
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!(
            "defaults: {{startupTimeout: 20000}}\nfs: {{}}\nmcpServers:\n  ghost:\n    \
             url: http://127.0.0.1:{port}/mcp\n  broken:\n    command: /nonexistent/server\n"
        ),
    );
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 3, "{run:?}");
    expect!["toolmux.yaml: the file is valid, but 2 providers of 4 failed to start (see below)"]
        .assert_eq(run.stdout.lines().next().unwrap_or_default());
    for (name, error) in [
        ("ghost", "cannot connect over http"),
        ("broken", "cannot connect over stdio: cannot start"),
    ] {
        let row = run.stdout.lines().find(|line| line.trim_start().starts_with(name));
        let failed = row.and_then(|row| row.split_once("FAILED: ")).map(|(_, e)| e);
        let failed = failed.unwrap_or_else(|| panic!("no FAILED row of {name}:\n{}", run.stdout));
        assert!(failed.starts_with(error), "{name}'s row: {failed}");
    }
}

/// The schema printed is the one committed for editors (`schemas/toolmux.schema.json`,
/// written by `cargo xtask codegen`, which adds only its `$comment` header).
#[test]
fn schema_is_printed_and_the_committed_file_is_fresh() {
    let run = Project::new().run(&["config", "schema"]);
    let schema: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    assert_eq!(schema["title"], "toolmux configuration");
    assert!(schema["properties"]["mcpServers"].is_object());

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schemas/toolmux.schema.json");
    let text = std::fs::read_to_string(path).expect("the committed schema");
    let mut committed: serde_json::Value = serde_json::from_str(&text).expect("json");
    let header = committed.as_object_mut().and_then(|object| object.remove("$comment"));
    assert_eq!(
        header.as_ref().and_then(|h| h.as_str()),
        Some("generated by cargo xtask codegen, do not edit")
    );
    assert!(
        committed == schema,
        "schemas/toolmux.schema.json is stale: run `cargo xtask codegen` to update it"
    );
}

#[test]
fn a_call_starts_only_its_provider() {
    let project = Project::new();
    project.file("a.txt", "TODO\n").file(
        "toolmux.yaml",
        "fs: {}\naliases: {find: fs__grep, poke: broken__poke}\nmcpServers:\n  broken:\n    command: /nonexistent/server\n",
    );
    let run = project.run(&["tools", "call", "find", r#"{"pattern":"TODO"}"#]);
    expect!["a.txt"].assert_eq(run.ok().trim());
    // Nor is an alias of its tools warned about as offered by nobody.
    assert!(!run.stderr.contains("broken") && !run.stderr.contains("poke"), "{}", run.stderr);
    let run = project.run(&["tools", "call", "broken__anything", "{}"]);
    assert_eq!(run.code, 3, "{run:?}");
    // Said as a server that did not start, not as a tool that does not exist.
    assert!(run.stderr.contains("provider `broken` did not start"), "{}", run.stderr);
}

/// A user's file lies under every project's and a managed file over it: the user's server
/// is served in the project, the managed deny rule holds against the project's allow, and
/// `config check` names the three files; with no project file the user's server comes
/// with the default read-only file tools.
#[test]
fn user_and_managed_files_layer_under_and_over_the_project() {
    let fixture = crate::conformance::fixture_bin().with_file_name("toolmux-mcp-fixture");
    let project = Project::new();
    let home = project.path().join("home");
    let user = home.join("config.yaml");
    let managed = project.path().join("etc/managed.yaml");
    project
        .file(
            "home/config.yaml",
            &format!(
                "mcpServers:\n  fx:\n    command: {}\n    args: [ok]\ndefaults: {{toolTimeout: 5000}}\n",
                fixture.display()
            ),
        )
        .file("etc/managed.yaml", "permissions:\n  deny: [fx__pid]\n")
        .file("toolmux.yaml", "fs: {}\npermissions:\n  allow: ['fx__*', 'fs__*']\n")
        .file("notes.md", "TODO: layers\n");
    let project = project
        .env("TOOLMUX_USER_CONFIG", user.to_str().expect("a UTF-8 path"))
        .env("TOOLMUX_MANAGED_CONFIG", managed.to_str().expect("a UTF-8 path"));

    let listed = project.run(&["tools", "list", "--json"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("\"fx__echo\""), "{}", listed.stdout);
    assert!(listed.stdout.contains("\"fs__grep\""), "{}", listed.stdout);
    assert!(!listed.stdout.contains("\"fx__pid\""), "denied, so not listed: {}", listed.stdout);
    let denied = project.run(&["tools", "call", "fx__pid"]);
    assert_ne!(denied.code, 0, "{denied:?}");
    assert!(
        denied.stderr.contains("denied by rule `permissions.deny: fx__pid`")
            || denied.stdout.contains("denied by rule `permissions.deny: fx__pid`"),
        "{denied:?}"
    );
    let grep = project.run(&["tools", "call", "fs__grep", r#"{"pattern": "TODO"}"#]);
    assert_eq!(grep.code, 0, "{grep:?}");
    assert!(grep.stdout.contains("notes.md"), "{}", grep.stdout);

    let check = project.run(&["config", "check", "--json"]);
    assert_eq!(check.code, 0, "{check:?}");
    let report: serde_json::Value = serde_json::from_str(&check.stdout).expect("JSON");
    let layers: Vec<String> = report["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| {
            format!("{} {}", l["layer"].as_str().unwrap_or("?"), l["file"].as_str().unwrap_or("?"))
        })
        .collect();
    let in_project = |name: &str| project.path().join(name).display().to_string();
    assert_eq!(
        layers,
        [
            format!("user {}", user.display()),
            format!("project {}", in_project("toolmux.yaml")),
            format!("managed {}", managed.display()),
        ]
    );
    let check = project.run(&["config", "check"]);
    assert!(check.stdout.contains("merged from"), "{}", check.stdout);

    // A mistake in the user's file is named as the user's.
    project.file("home/config.yaml", "defaults: {toolTimeout: soon}\n");
    let broken = project.run(&["tools", "list"]);
    assert_ne!(broken.code, 0);
    assert!(broken.stderr.contains("(user configuration)"), "{}", broken.stderr);
    assert!(broken.stderr.contains("toolTimeout"), "{}", broken.stderr);

    // No project file: the user's server and the default read-only file tools.
    std::fs::remove_file(project.path().join("toolmux.yaml")).expect("removed");
    project.file(
        "home/config.yaml",
        &format!("mcpServers:\n  fx:\n    command: {}\n    args: [ok]\n", fixture.display()),
    );
    let listed = project.run(&["tools", "list", "--json"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("\"fx__echo\""), "{}", listed.stdout);
    assert!(listed.stdout.contains("\"fs__read\""), "{}", listed.stdout);
    assert!(!listed.stdout.contains("\"fs__write\""), "{}", listed.stdout);
}

/// `config show` prints the configuration in force, every layer merged, with what came from
/// the environment redacted, and names the files.
#[test]
fn config_show_prints_the_merged_settings_with_secrets_redacted() {
    let project = Project::new().env("GH_TOKEN", "ghp-secret-0123456789");
    let user = project.path().join("home/config.yaml");
    project
        .file("home/config.yaml", "defaults: {toolTimeout: 5000}\npermissions: {deny: [x__y]}\n")
        .file(
            "toolmux.yaml",
            "fs: {}\nmcpServers:\n  gh:\n    command: gh-server\n    env: {GITHUB_TOKEN: '${GH_TOKEN}'}\npermissions: {deny: [fs__bash]}\n",
        );
    let project = project.env("TOOLMUX_USER_CONFIG", user.to_str().expect("a UTF-8 path"));
    let shown = project.run(&["config", "show", "--json"]);
    assert_eq!(shown.code, 0, "{shown:?}");
    let config: serde_json::Value = serde_json::from_str(&shown.stdout).expect("JSON");
    assert_eq!(config["defaults"]["toolTimeout"], 5000);
    assert_eq!(config["permissions"]["deny"], serde_json::json!(["x__y", "fs__bash"]));
    assert_eq!(config["mcpServers"]["gh"]["env"]["GITHUB_TOKEN"], "[redacted]");
    let yaml = project.run(&["config", "show"]);
    assert_eq!(yaml.code, 0, "{yaml:?}");
    assert!(yaml.stdout.starts_with(&format!("# {} (user)\n", user.display())), "{}", yaml.stdout);
    assert!(yaml.stdout.contains("toolmux.yaml (project)"), "{}", yaml.stdout);
    assert!(yaml.stdout.contains("GITHUB_TOKEN: '[redacted]'"), "{}", yaml.stdout);
    for output in [&shown.stdout, &yaml.stdout, &shown.stderr, &yaml.stderr] {
        assert!(!output.contains("ghp-secret"), "{output}");
    }
}

/// The seeds' `tools.yml` loads as it is: each internal tool (a Python function, sync or
/// async) is a `cmd__` tool run by `python3` from the project's root, its arguments the
/// function's keyword arguments; a tool of another source is refused with where it goes.
#[test]
fn the_seeds_tools_yml_runs_its_python_functions() {
    let project = Project::new();
    project
        .file("pyproject.toml", "[project]\nname = \"demo\"\n")
        .file(
            "src/tools/core/calculator_tool.py",
            "import asyncio\n\
             def calculate(expression):\n    return {\"result\": eval(expression, {}, {})}\n\
             async def shout(text):\n    await asyncio.sleep(0)\n    return text.upper()\n",
        )
        .file(
            "src/config/tools.yml",
            r#"tools:
  - name: "calculator"
    description: "Perform mathematical calculations"
    module: "src.tools.core.calculator_tool"
    function: "calculate"
    parameters_schema:
      type: "object"
      properties:
        expression: {type: "string", description: "The expression"}
      required: ["expression"]
    category: "core_utils"
    source: "internal"
    speed: "fast"
    safety: "sandboxed"
  - name: "shout"
    description: "Upper-case a text"
    module: "src.tools.core.calculator_tool"
    function: "shout"
    parameters_schema: {type: object, properties: {text: {type: string}}}
"#,
        );
    let config = ["--config", "src/config/tools.yml"];
    let listed = project.run(&[&config[..], &["tools", "list"]].concat());
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("cmd__calculator"), "{}", listed.stdout);
    // The registry's fields are the tools' metadata, the seeds' defaults filled in.
    let json = project.run(&[&config[..], &["tools", "list", "--json"]].concat());
    let tools: Vec<serde_json::Value> = serde_json::from_str(&json.stdout).expect("JSON");
    let meta = |name: &str| tools.iter().find(|t| t["name"] == name).expect(name)["_meta"].clone();
    assert_eq!(
        meta("cmd__calculator"),
        serde_json::json!({"toolmux/category": "core_utils", "toolmux/speed": "fast",
                           "toolmux/safety": "sandboxed"})
    );
    assert_eq!(
        meta("cmd__shout"),
        serde_json::json!({"toolmux/speed": "medium", "toolmux/safety": "native"})
    );
    let sum = project.run(
        &[&config[..], &["tools", "call", "cmd__calculator", r#"{"expression": "2 + 3 * 4"}"#]]
            .concat(),
    );
    assert_eq!(sum.code, 0, "{sum:?}");
    assert_eq!(sum.stdout.trim(), r#"{"result": 14}"#);
    let shouted =
        project.run(&[&config[..], &["tools", "call", "cmd__shout", r#"{"text": "hi"}"#]].concat());
    assert_eq!(shouted.code, 0, "{shouted:?}");
    assert_eq!(shouted.stdout.trim(), "HI");
    let missing = project.run(&[&config[..], &["tools", "call", "cmd__calculator"]].concat());
    assert_ne!(missing.code, 0, "the schema's required argument: {missing:?}");

    project.file(
        "src/config/tools.yml",
        "tools:\n  - {name: x, description: y, module: m, function: f, source: mcp}\n",
    );
    let refused = project.run(&[&config[..], &["config", "check"]].concat());
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("provides_tools"), "{}", refused.stderr);
}

/// The seeds' layout, one file per kind (`tools.yml`, `mcp.yml`), loads as one
/// configuration when `--config` names each: the later merged over the earlier. A server of
/// `mcp.yml` that is not running has the tools it declares listed all the same.
#[test]
fn several_config_files_merge_as_the_seeds_layout_has_them() {
    let project = Project::new();
    project
        .file("src/tools/core/calc.py", "def calculate(expression):\n    return eval(expression)\n")
        .file(
            "src/config/tools.yml",
            "tools:\n  - name: calculator\n    description: Calculates\n    \
             module: src.tools.core.calc\n    function: calculate\n",
        )
        .file(
            "src/config/mcp.yml",
            "mcp_servers:\n  code_execution_server:\n    description: Runs code\n    \
             url: http://127.0.0.1:9/mcp\n    startup_timeout_ms: 2000\n    provides_tools:\n      \
             - name: execute_python_code\n        description: Executes Python code\n        \
             safety: sandboxed\n",
        );
    let both = ["--config", "src/config/tools.yml", "--config", "src/config/mcp.yml"];
    let listed = project.run(&[&both[..], &["tools", "list"]].concat());
    assert!(listed.stdout.contains("cmd__calculator"), "{listed:?}");
    assert!(listed.stdout.contains("code-execution-server__execute_python_code"), "{listed:?}");
    // A declared tool's registry fields are its metadata, under the server's namespace.
    let json = project.run(&[&both[..], &["tools", "list", "--json"]].concat());
    let tools: Vec<serde_json::Value> = serde_json::from_str(&json.stdout).expect("JSON");
    let declared = tools
        .iter()
        .find(|t| t["name"] == "code-execution-server__execute_python_code")
        .expect("the declared tool");
    assert_eq!(
        declared["_meta"],
        serde_json::json!({"toolmux/speed": "medium", "toolmux/safety": "sandboxed"})
    );
    assert!(!json.stderr.contains("applies to nothing"), "{}", json.stderr);
    // What is said of the server names the file that holds it, not the first one.
    assert!(
        json.stderr.contains(
            "src/config/mcp.yml: the tools of mcp server `code_execution_server` are named"
        ),
        "{}",
        json.stderr
    );
    let check = project.run(&[&both[..], &["config", "check"]].concat());
    assert!(
        check.stdout.contains("src/config/mcp.yml (added)"),
        "the files it was merged from: {check:?}"
    );
    // An error in the added file names it.
    project.file("src/config/mcp.yml", "mcp_servers: [oops\n");
    let broken = project.run(&[&both[..], &["tools", "list"]].concat());
    assert_eq!(broken.code, 2, "{broken:?}");
    assert!(broken.stderr.contains("src/config/mcp.yml (added configuration)"), "{broken:?}");
}

/// A name collision is a configuration error for `tools list` as for `config check` (exit
/// 2), told once (it was printed twice, and the listing exited 0).
#[test]
fn a_name_collision_fails_the_listing_once() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\naliases: {fs__read: fs__grep}\n");
    let run = project.run(&["tools", "list"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(run.stderr.matches("collides with tool `fs__read`").count(), 1, "{}", run.stderr);
}
