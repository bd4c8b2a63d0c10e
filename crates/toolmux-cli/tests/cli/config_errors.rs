//! Every configuration mistake names the problem, the file and the line, and exits 2.

use crate::Project;
use expect_test::{Expect, expect};

fn check(file: &str, content: &str, expected: Expect) {
    let project = Project::new();
    project.file(file, content);
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    expected.assert_eq(run.stderr.trim_end());
}

#[test]
fn bad_json() {
    check(
        "toolmux.json",
        "{\n  \"defaults\": {\"toolTimeout\": 1000},\n  \"queues\": {\"a\": {\"concurrent\": 1}}}\n}\n",
        expect!["error: toolmux.json:4:1: invalid JSON: trailing characters"],
    );
}

#[test]
fn bad_yaml() {
    check(
        "toolmux.yaml",
        "defaults:\n  toolTimeout: [1\nfs: {}\n",
        expect![
            "error: toolmux.yaml:3:3: invalid YAML: did not find expected ',' or ']', while parsing a flow sequence"
        ],
    );
}

#[test]
fn unknown_key_with_suggestion() {
    check(
        "toolmux.yaml",
        "mcpServers:\n  github:\n    command: npx\n    toolsAllowd: [search_code]\n",
        expect![
            "error: toolmux.yaml:4:5: unknown key `toolsAllowd` in mcpServers.github; did you mean `toolsAllowed`?"
        ],
    );
}

#[test]
fn unset_variable() {
    check(
        "toolmux.yaml",
        "mcpServers:\n  github:\n    command: npx\n    env:\n      GITHUB_TOKEN: ${TOOLMUX_TEST_UNSET_TOKEN}\n",
        expect![
            "error: toolmux.yaml:5:21: unset environment variable TOOLMUX_TEST_UNSET_TOKEN in mcpServers.github.env.GITHUB_TOKEN (set it, or give a default: ${TOOLMUX_TEST_UNSET_TOKEN:-value})"
        ],
    );
}

#[test]
fn bad_type() {
    check(
        "toolmux.yaml",
        "defaults:\n  toolTimeout: 30s\n",
        expect![[
            r#"error: toolmux.yaml:2:16: defaults.toolTimeout: expected a number of milliseconds, such as 30000; found the string "30s""#
        ]],
    );
}

#[test]
fn a_wrong_type_says_what_the_key_takes_in_words() {
    check(
        "toolmux.yaml",
        "defaults: {toolTimeout: soon}\n",
        expect![[
            r#"error: toolmux.yaml:1:25: defaults.toolTimeout: expected a number of milliseconds, such as 30000; found the string "soon""#
        ]],
    );
    check(
        "toolmux.json",
        "{\"defaults\": {\"toolResponseMaxBytes\": \"1MB\"}}\n",
        expect![[
            r#"error: toolmux.json:1:43: defaults.toolResponseMaxBytes: expected a number of bytes, such as 100000; found the string "1MB""#
        ]],
    );
    check(
        "toolmux.yaml",
        "queues:\n  slow: {concurrent: -1}\n",
        expect![
            "error: toolmux.yaml:2:22: queues.slow.concurrent: expected a whole number, such as 10; found -1"
        ],
    );
    check(
        "toolmux.yaml",
        "defaults:\n  traceMCP: yes please\n",
        expect![[
            r#"error: toolmux.yaml:2:13: defaults.traceMCP: expected true or false; found the string "yes please""#
        ]],
    );
    check(
        "toolmux.yaml",
        "mcpServers:\n  a:\n    command: npx\n    args: -y server\n",
        expect![[
            r#"error: toolmux.yaml:4:11: mcpServers.a.args: expected a list, such as [a, b]; found the string "-y server""#
        ]],
    );
    check(
        "toolmux.yaml",
        "fs: 3\n",
        expect![
            "error: toolmux.yaml:1:5: fs: expected a mapping of its settings (`key: value` entries); found 3"
        ],
    );
    // A hook command's timeout is in seconds, as Claude Code's hooks have it.
    check(
        "toolmux.yaml",
        "hooks:\n  PreToolUse:\n    - hooks:\n        - {type: command, command: ./check, timeout: 1m}\n",
        expect![[
            r#"error: toolmux.yaml:4:54: hooks.PreToolUse[0].hooks[0].timeout: expected a number of seconds, such as 60; found the string "1m""#
        ]],
    );
}

#[test]
fn a_file_that_is_no_mapping_says_what_a_file_holds() {
    check(
        "toolmux.yaml",
        "\"hello\"\n",
        expect![[
            r#"error: toolmux.yaml:1:1: the file must be a mapping of sections such as `fs:` and `mcpServers:`; found the string "hello""#
        ]],
    );
    // serde reads a struct from a list, so this one loaded as settings nobody wrote.
    check(
        "toolmux.yaml",
        "# servers\n- github\n- linear\n",
        expect![
            "error: toolmux.yaml:2:1: the file must be a mapping of sections such as `fs:` and `mcpServers:`; found a list"
        ],
    );
    check(
        "toolmux.json",
        "[\"github\"]\n",
        expect![
            "error: toolmux.json:1:1: the file must be a mapping of sections such as `fs:` and `mcpServers:`; found a list"
        ],
    );
}

#[test]
fn unknown_queue() {
    check(
        "toolmux.yaml",
        "fs: {}\ntools:\n  fs__grep: {queue: slow}\nqueues:\n  fast: {concurrent: 2}\n",
        expect![
            "error: toolmux.yaml:3:21: tools.fs__grep.queue: queue `slow` is not defined under `queues`; the queues defined are fast"
        ],
    );
}

#[test]
fn bad_server_url() {
    check(
        "toolmux.yaml",
        "mcpServers:\n  remote:\n    url: localhost:8080/mcp\n",
        expect![
            "error: toolmux.yaml:3:10: mcpServers.remote.url: must start with http:// or https://, as in http://127.0.0.1:8080/mcp"
        ],
    );
}

#[test]
fn missing_fs_root() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs:\n  root: does-not-exist\n");
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 2);
    let root = project.path().join("does-not-exist");
    assert_eq!(
        run.stderr.trim_end(),
        format!(
            "error: toolmux.yaml: invalid fs configuration: root `{}` cannot be opened: \
             No such file or directory (os error 2)",
            root.display()
        )
    );
}

/// A file that cannot be read says where its path came from: `--config`, or a
/// `TOOLMUX_CONFIG` exported long ago, which nothing on the command line shows (it said
/// only that the file could not be read).
#[test]
fn explicit_file_that_does_not_exist() {
    let project = Project::new();
    let run = project.run(&["--config", "nope.yaml", "tools", "list"]);
    assert_eq!(run.code, 2);
    expect!["error: cannot read the configuration file nope.yaml (given with --config): No such file or directory (os error 2)"]
        .assert_eq(run.stderr.trim_end());
    project.file("toolmux.yaml", "fs: {}\n");
    let run = project.run(&["--config", "toolmux.yaml", "--config", "more.yaml", "tools", "list"]);
    assert_eq!(run.code, 2);
    expect!["error: cannot read the configuration file more.yaml (added with --config): No such file or directory (os error 2)"]
        .assert_eq(run.stderr.trim_end());
    let project = project.env("TOOLMUX_CONFIG", "gone/tm.yaml");
    let run = project.run(&["tools", "list"]);
    assert_eq!(run.code, 2);
    expect!["error: cannot read the configuration file gone/tm.yaml (named by TOOLMUX_CONFIG; unset it to look for ./toolmux.yaml): No such file or directory (os error 2)"]
        .assert_eq(run.stderr.trim_end());
    // A folder, which cannot be read as a file either; --config wins over the variable.
    let run = project.run(&["stats"]);
    assert_eq!(run.code, 2);
    let run = project.env("TOOLMUX_CONFIG", "tmp").run(&["--config", "tmp", "stats"]);
    assert_eq!(run.code, 2);
    expect!["error: cannot read the configuration file tmp (given with --config): it is a folder, not a regular file: give the path of a configuration file"]
        .assert_eq(run.stderr.trim_end());
}

#[test]
fn toolmux_config_variable_names_the_file() {
    let project = Project::new().env("TOOLMUX_CONFIG", "conf/tm.json");
    project.file("conf/tm.json", "{\"fs\": {\"permissions\": [\"raed\"]}}");
    let run = project.run(&["tools", "list"]);
    assert_eq!(run.code, 2);
    expect![
        "error: conf/tm.json:1:30: unknown value `raed` for fs.permissions[0]; did you mean `read`?"
    ]
    .assert_eq(run.stderr.trim_end());
}

#[test]
fn oauth_keys_are_checked_too() {
    check(
        "toolmux.yaml",
        "mcpServers:\n  linear:\n    url: https://mcp.linear.app/mcp\n    oauth:\n      clientSecrt: x\n",
        expect![
            "error: toolmux.yaml:5:7: unknown key `clientSecrt` in mcpServers.linear.oauth; did you mean `clientSecret`?"
        ],
    );
    check(
        "toolmux.yaml",
        "mcpServers:\n  linear:\n    url: https://mcp.linear.app/mcp\n    oauth:\n      grant: password\n",
        expect![
            "error: toolmux.yaml:5:14: unknown value `password` for mcpServers.linear.oauth.grant; expected one of: authorizationCode, clientCredentials, enterpriseManaged, jwtBearer"
        ],
    );
}

#[test]
fn login_names_an_unknown_server_and_refuses_a_stdio_one() {
    let project = Project::new();
    project.file("toolmux.yaml", "mcpServers:\n  local:\n    command: npx\n");
    let run = project.run(&["mcp", "login", "linear"]);
    assert_eq!(run.code, 2, "{run:?}");
    expect!["error: toolmux.yaml: no mcp server `linear` (configured: local)"]
        .assert_eq(run.stderr.trim_end());
    let run = project.run(&["mcp", "logout", "local"]);
    assert_eq!(run.code, 2, "{run:?}");
    expect!["error: toolmux.yaml: mcp server `local` is not authorized with OAuth: only remote servers (streamable HTTP or SSE) are, and not with an `Authorization` header or `oauth.enabled: false`"].assert_eq(run.stderr.trim_end());
}

#[test]
fn an_authorization_server_that_cannot_be_reached_stops_serve_at_once() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        "serve:\n  oauth:\n    issuer: http://127.0.0.1:1\n    resource: http://127.0.0.1:8931/mcp\n",
    );
    let run = project.run(&["serve", "--http", "127.0.0.1:0"]);
    assert_eq!(run.code, 2, "{run:?}");
    let stderr = run.stderr.trim_end();
    assert!(
        stderr.starts_with("error: toolmux.yaml: serve.oauth: cannot reach the authorization server: cannot fetch http://127.0.0.1:1/.well-known/"),
        "{stderr}"
    );
}

/// An argument schema the file gives itself must be JSON Schema: otherwise its tool would
/// be left out with only a warning while the file was called valid.
#[test]
fn a_schema_the_file_gives_that_is_no_json_schema() {
    check(
        "toolmux.yaml",
        "restTools:\n  bad:\n    description: d\n    url: http://127.0.0.1:9/x\n    parametersSchema: {type: object, properties: {a: {type: 12}}}\n",
        expect![
            "error: toolmux.yaml: restTools.bad.parametersSchema is not valid JSON Schema: at /properties/a/type: 12 is not valid under any of the schemas listed in the 'anyOf' keyword"
        ],
    );
    check(
        "toolmux.yaml",
        "externalTools:\n  ask:\n    description: d\n    inputSchema: {type: objekt}\n",
        expect![
            "error: toolmux.yaml: externalTools.ask.inputSchema is not valid JSON Schema: at /type: \"objekt\" is not valid under any of the schemas listed in the 'anyOf' keyword"
        ],
    );
}

#[test]
fn a_zero_time_to_live_for_external_calls() {
    check(
        "toolmux.yaml",
        "defaults: {externalCallTtl: 0}\nexternalTools:\n  ask: {description: Ask someone}\n",
        expect![
            "error: toolmux.yaml: defaults.externalCallTtl: 0 would expire everything at once; give milliseconds (by default an hour for calls, a day for results)"
        ],
    );
}

#[test]
fn a_key_given_twice() {
    check(
        "toolmux.yaml",
        "mcpServers:\n  a: {command: one}\n  a: {command: two}\n",
        expect![
            "error: toolmux.yaml:3:3: mcpServers: key `a` is given twice in one object: keep one (the last would win)"
        ],
    );
    check(
        "toolmux.json",
        "{\"aliases\": {\"x\": \"fs__read\", \"x\": \"fs__ls\"}}\n",
        expect![
            "error: toolmux.json:1:33: key `x` is given twice in one object: keep one (the last would win)"
        ],
    );
}

/// What editors and YAML writers leave in files that are otherwise fine: a byte order mark,
/// a JSON file of comments only, a section whose keys are all commented out (`fs:`, the
/// section with its defaults, not none), YAML merge keys.
#[test]
fn files_as_editors_leave_them_load() {
    let project = Project::new();
    project.file("a.txt", "TODO\n");
    project.file("bom.json", "\u{feff}{\"fs\": {}}\n");
    let run = project.run(&[
        "--config",
        "bom.json",
        "tools",
        "call",
        "fs__grep",
        r#"{"pattern":"TODO"}"#,
    ]);
    assert_eq!(run.ok().trim(), "a.txt");
    project.file("empty.json", "// nothing yet\n/* later */\n");
    assert_eq!(project.run(&["--config", "empty.json", "config", "check"]).code, 0);
    project.file("null.yaml", "fs:\n  # root: src\nmcpServers:\n  # none yet\n");
    let listed = project.run(&["--config", "null.yaml", "tools", "list"]);
    assert!(listed.ok().contains("fs__read"), "{}", listed.stdout);
    project.file(
        "merged.yaml",
        "mcpServers:\n  base: &base\n    command: never-started\n    enabled: false\n  other:\n    <<: *base\n    args: [x]\nfs: {}\n",
    );
    let shown = project.run(&["--config", "merged.yaml", "config", "show", "--json"]);
    let config: serde_json::Value = serde_json::from_str(shown.ok()).expect("json");
    let other = &config["mcpServers"]["other"];
    assert_eq!(other["command"], "never-started", "{config}");
    assert_eq!(other["args"], serde_json::json!(["x"]), "{config}");
}

/// `config check --json` answers in JSON when the file does not load, too.
#[test]
fn a_check_for_programs_reports_the_error_in_json() {
    let project = Project::new();
    project.file("toolmux.yaml", "defaults:\n  toolTimeout: soon\n");
    let run = project.run(&["config", "check", "--json"]);
    assert_eq!(run.code, 2, "{run:?}");
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON on stdout");
    assert_eq!(report["ok"], false);
    assert_eq!(report["error"]["file"], "toolmux.yaml");
    assert_eq!(report["error"]["line"], 2, "{report}");
    assert!(report["error"]["message"].as_str().unwrap().contains("toolTimeout"), "{report}");
}

/// A wrong type that YAML's reader lets through as text (`command: 123`) and the check of
/// the parsed value finds is named with its line too.
#[test]
fn a_wrong_type_found_after_parsing_has_its_line() {
    check(
        "toolmux.yaml",
        "mcpServers:\n  s:\n    args: [a]\n    command: 123\n",
        expect!["error: toolmux.yaml:4:5: mcpServers.s.command: expected a string; found 123"],
    );
}
