//! `toolmux serve`: the gateway, driven by the official Python SDK client over stdio and
//! streamable HTTP, with the builtin tools and `@modelcontextprotocol/server-everything`
//! behind it.

use crate::{Project, Run, gateway_project, line_server, peer, toolmux_bin, wait};
use serde_json::{Value, json};
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use toolmux_test_support::blocking::fifo;

fn python() -> PathBuf {
    peer("python/venv/bin/python")
}

fn client_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cli/mcp_client.py")
}

fn run_client(project: &Project, args: &[&str]) -> Value {
    let script = client_script();
    let script = script.to_str().expect("a UTF-8 path");
    run_python(project, &[&[script], args].concat())
}

/// Runs the virtualenv's Python with `args` in `project` and reads the JSON summary it
/// prints last.
fn run_python(project: &Project, args: &[&str]) -> Value {
    let mut command = Command::new(python());
    command
        .args(args)
        .current_dir(project.path())
        .env("TMPDIR", project.path().join("tmp"))
        .env_remove("TOOLMUX_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let run = wait(command.spawn().expect("python starts"), Duration::from_secs(120));
    assert_eq!(run.code, 0, "python client failed:\n{}\n{}", run.stderr, run.stdout);
    serde_json::from_str(run.stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no summary ({e}): {}\n{}", run.stdout, run.stderr))
}

fn check_summary(summary: &Value) {
    let tools: Vec<&str> =
        summary["tools"].as_array().expect("tools").iter().filter_map(Value::as_str).collect();
    for name in ["fs__read", "fs__grep", "fs__glob", "fs__ls", "everything__echo"] {
        assert!(tools.contains(&name), "{name} missing from {tools:?}");
    }
    assert!(tools.iter().filter(|t| t.starts_with("everything__")).count() > 5, "{tools:?}");
    assert_eq!(summary["fs__grep"]["text"], "notes.md", "{summary}");
    assert_eq!(summary["fs__grep"]["is_error"], false);
    // A tool's extras reach the client in the result's `_meta`.
    assert_eq!(summary["fs__grep"]["extras"]["matches"], 1, "{summary}");
    assert_eq!(summary["fs__grep"]["extras"]["truncated"], false, "{summary}");
    assert_eq!(summary["everything__echo"]["text"], "Echo: hi", "{summary}");
    assert_eq!(summary["fs__read"]["is_error"], true, "{summary}");
    let failure = summary["fs__read"]["text"].as_str().unwrap_or_default();
    assert!(failure.contains("outside the workspace root"), "{summary}");
    // The upstream's content annotations pass through the gateway, block by block.
    let annotated = &summary["everything__get-annotated-message"]["annotations"];
    assert_eq!(annotated.as_array().map(Vec::len), Some(2), "{summary}");
    assert!(annotated[0]["priority"].is_number(), "{summary}");
    assert!(annotated[1]["audience"].is_array(), "{summary}");
    // A tool the upstream runs only as a task answers a plain call.
    let research = &summary["everything__simulate-research-query"];
    assert_eq!(research["is_error"], false, "{summary}");
    let report = research["text"].as_str().unwrap_or_default();
    assert!(report.starts_with("# Research Report: gateway"), "{summary}");
}

#[test]
fn python_client_over_stdio() {
    let project = gateway_project();
    let summary = run_client(&project, &["stdio", toolmux_bin(), "serve", "--stdio"]);
    check_summary(&summary);
}

/// `toolmux serve --http 127.0.0.1:0` in `project`, stopped with SIGTERM by [`stop`].
pub(crate) struct HttpGateway {
    child: std::process::Child,
    stderr: BufReader<std::process::ChildStderr>,
    pub(crate) url: String,
}

pub(crate) fn serve_http(project: &Project) -> HttpGateway {
    serve_http_with(project, &[])
}

/// `toolmux serve --http 127.0.0.1:0` with `extra` arguments.
pub(crate) fn serve_http_with(project: &Project, extra: &[&str]) -> HttpGateway {
    serve_http_at(project, "127.0.0.1:0", extra)
}

/// `toolmux serve --http ADDRESS` with `extra` arguments.
fn serve_http_at(project: &Project, address: &str, extra: &[&str]) -> HttpGateway {
    let (child, stderr, url, _) = start_serving_http(project, address, extra, Stdio::piped());
    HttpGateway { child, stderr, url }
}

/// Starts `toolmux serve --http ADDRESS` with `extra` arguments and waits for the line
/// giving its address: the process, the rest of its stderr, its URL and the log until then.
pub(crate) fn start_serving_http(
    project: &Project,
    address: &str,
    extra: &[&str],
    stdout: Stdio,
) -> (std::process::Child, BufReader<std::process::ChildStderr>, String, String) {
    let mut args = vec!["serve", "--http", address];
    args.extend_from_slice(extra);
    let mut child = project
        .command(&args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmux serve starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    // The address line comes once every provider has started; reading ends at EOF if
    // toolmux exits, so this cannot hang past the process.
    let mut seen = String::new();
    let url = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = child.kill();
            let _ = child.wait();
            panic!("toolmux serve ended before serving:\n{seen}");
        }
        seen.push_str(&line);
        if let Some(rest) = line.trim().strip_prefix("toolmux: serving MCP at ") {
            break rest.split_whitespace().next().unwrap_or_default().to_owned();
        }
    };
    (child, stderr, url, seen)
}

/// SIGTERM: toolmux stops serving, saves statistics and reaps its MCP servers.
pub(crate) fn stop(gateway: HttpGateway) -> Run {
    let HttpGateway { mut child, stderr, .. } = gateway;
    crate::send_signal(&child, "TERM");
    child.stderr = Some(stderr.into_inner());
    wait(child, Duration::from_secs(30))
}

/// `serve` stopped by a signal while it still starts its servers ends normally (0), as it
/// does once serving and as --help says, where it exited 143 for SIGTERM and 129 for
/// SIGHUP (`stopping_signals_reap_the_servers` checks that the servers go with it).
#[test]
fn serve_stopped_while_starting_ends_normally() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        "mcpServers:\n  slow:\n    command: sh\n    args: ['-c', 'echo > started; exec sleep 300']\n",
    );
    let started = project.path().join("started");
    for signal in ["TERM", "HUP"] {
        let _ = std::fs::remove_file(&started);
        let command = project.command(&["serve"]);
        let run =
            crate::start_and_signal(command, "the server started", || started.exists(), signal);
        assert_eq!((run.code, run.stdout.as_str()), (0, ""), "SIG{signal}: {run:?}");
    }
}

#[test]
fn python_client_over_http() {
    let project = gateway_project();
    let gateway = serve_http(&project);
    let summary = run_client(&project, &["http", &gateway.url]);
    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    check_summary(&summary);

    let stats = project.run(&["stats", "--json"]);
    let stats: Value = serde_json::from_str(stats.ok()).expect("json");
    assert_eq!(stats["tools"]["everything__echo"]["count"], 1, "{stats}");
}

/// The MCP Inspector's CLI mode (`mcp-inspector --cli`) with `args`, its JSON answer.
fn inspector(project: &Project, args: &[&str]) -> Value {
    let mut command = Command::new(peer("node/node_modules/.bin/node"));
    command
        .arg(peer(
            "node/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js",
        ))
        .arg("--cli")
        .args(args)
        .current_dir(project.path())
        .env("TMPDIR", project.path().join("tmp"))
        .env_remove("TOOLMUX_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let run = wait(command.spawn().expect("inspector starts"), Duration::from_secs(120));
    assert_eq!(run.code, 0, "inspector failed:\n{}\n{}", run.stderr, run.stdout);
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("inspector printed no JSON ({e}): {}", run.stdout))
}

fn inspector_checks(project: &Project, target: &[&str]) {
    let with = |extra: &[&str]| -> Vec<String> {
        target.iter().chain(extra).map(|s| (*s).to_owned()).collect()
    };
    let list = with(&["--method", "tools/list"]);
    let tools = inspector(project, &list.iter().map(String::as_str).collect::<Vec<_>>());
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"fs__grep") && names.contains(&"everything__echo"), "{names:?}");
    let grep =
        with(&["--method", "tools/call", "--tool-name", "fs__grep", "--tool-arg", "pattern=TODO"]);
    let grep = inspector(project, &grep.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(grep["content"][0]["text"], "notes.md", "{grep}");
    let echo = with(&[
        "--method",
        "tools/call",
        "--tool-name",
        "everything__echo",
        "--tool-arg",
        "message=hi",
    ]);
    let echo = inspector(project, &echo.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(echo["content"][0]["text"], "Echo: hi", "{echo}");
}

#[test]
fn inspector_cli_over_stdio() {
    let project = gateway_project();
    inspector_checks(&project, &[toolmux_bin(), "serve", "--stdio"]);
}

#[test]
fn inspector_cli_over_http() {
    let project = gateway_project();
    let gateway = serve_http(&project);
    let url = gateway.url.clone();
    inspector_checks(&project, &[&url, "--transport", "http"]);
    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// Runs `toolmux ARGS` (serving on stdio), sends the handshake and then `requests` (each
/// given its id, 2 onwards), and reads stdout until the answer to the last; then closes
/// stdin and checks that toolmux exits cleanly with nothing on stdout but JSON-RPC.
/// Returns every message read, by line.
pub(crate) fn stdio_exchange(project: &Project, args: &[&str], requests: &[Value]) -> Vec<Value> {
    stdio_exchange_as(project, args, "t", requests)
}

/// [`stdio_exchange`] by a client that names itself `client` in its `initialize`.
pub(crate) fn stdio_exchange_as(
    project: &Project,
    args: &[&str],
    client: &str,
    requests: &[Value],
) -> Vec<Value> {
    let (mut child, mut stdin, mut stdout) = spawn_stdio(project, args);
    let mut lines = vec![
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": client, "version": "1"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ];
    for (id, request) in (2..).zip(requests) {
        let mut request = request.clone();
        request["jsonrpc"] = "2.0".into();
        request["id"] = id.into();
        lines.push(request);
    }
    for line in &lines {
        writeln!(stdin, "{line}").expect("write");
    }
    let last = requests.len() + 1;
    let mut messages = Vec::new();
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let message: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
        assert_eq!(message["jsonrpc"], "2.0", "{line}");
        messages.push(message);
        // Calls run concurrently and may be answered in any order: wait for every answer.
        let answered = (2..=last).all(|id| messages.iter().any(|m| m["id"] == id));
        if answered {
            break;
        }
    }
    drop(stdin);
    child.stdout = Some(stdout.into_inner());
    let run = wait(child, Duration::from_secs(30));
    assert_eq!(run.code, 0, "{}", run.stderr);
    // After the last answer only notifications may come (a list changed meanwhile).
    for line in run.stdout.lines().filter(|l| !l.trim().is_empty()) {
        let message: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
        assert!(message.get("id").is_none() && message["method"].is_string(), "{line}");
    }
    messages
}

/// Starts `toolmux ARGS` serving on stdio: the process, its stdin, and its stdout to read
/// lines from.
pub(crate) fn spawn_stdio(
    project: &Project,
    args: &[&str],
) -> (std::process::Child, std::process::ChildStdin, BufReader<std::process::ChildStdout>) {
    let mut child = project
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmux serve starts");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    (child, stdin, stdout)
}

/// Over stdio, stdout carries nothing but JSON-RPC messages, even with logging turned up.
#[test]
fn stdio_stdout_is_only_protocol() {
    let project = Project::new();
    project.file("a.txt", "TODO\n");
    let call = serde_json::json!({"method": "tools/call",
        "params": {"name": "fs__grep", "arguments": {"pattern": "TODO"}}});
    let messages = stdio_exchange(&project, &["-vvv", "serve", "--stdio"], &[call]);
    let answer = messages.last().expect("an answer");
    assert_eq!(answer["result"]["content"][0]["text"], "a.txt", "{answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");
}

/// `--tools GLOB` serves a subset: the other tools are neither listed nor callable.
#[test]
fn serve_tools_globs_serve_a_subset() {
    let project = Project::new();
    project.file("a.txt", "TODO\n");
    let requests = [
        serde_json::json!({"method": "tools/list"}),
        serde_json::json!({"method": "tools/call",
            "params": {"name": "fs__read", "arguments": {"path": "a.txt"}}}),
        serde_json::json!({"method": "tools/call",
            "params": {"name": "fs__grep", "arguments": {"pattern": "TODO"}}}),
    ];
    let args = ["serve", "--stdio", "--tools", "fs__g*", "--tools", "fs__l?"];
    let messages = stdio_exchange(&project, &args, &requests);
    let by_id = |id: u64| messages.iter().find(|m| m["id"] == id).expect("an answer");
    let listed = by_id(2)["result"]["tools"].as_array().expect("tools").clone();
    let names: Vec<&str> = listed.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["fs__grep", "fs__glob", "fs__ls"], "{listed:?}");
    let refused = by_id(3);
    let text = refused.to_string();
    assert!(text.contains("unknown tool `fs__read`"), "{refused}");
    assert_eq!(by_id(4)["result"]["content"][0]["text"], "a.txt");
}

/// `--client` rewrites what the client's model sees (Claude: no top-level union; Gemini:
/// the OpenAPI subset, `$ref`s inlined) while calls are still checked against the upstream
/// server's own schema, through the real binary and a real upstream MCP server.
#[test]
fn client_profiles_rewrite_schemas_and_calls_keep_the_original() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!(
            "mcpServers:\n  fixture:\n    command: {}\n    args: [stdio]\n\
             tools:\n  fixture__lookup:\n    meta: {{example.com/owner: crm, example.com/internal: null}}\n",
            crate::conformance::fixture_bin().display()
        ),
    );
    let requests = [
        serde_json::json!({"method": "tools/list"}),
        serde_json::json!({"method": "tools/call", "params": {"name": "fixture__lookup",
            "arguments": {"email": "ada@example.com"}}}),
        // Both forms at once: valid for the merged schema, not for the server's `oneOf`.
        serde_json::json!({"method": "tools/call", "params": {"name": "fixture__lookup",
            "arguments": {"id": 7, "email": "ada@example.com"}}}),
    ];
    let lookup = |messages: &[Value]| -> Value {
        let listed = messages.iter().find(|m| m["id"] == 2).expect("the listing");
        let tools = listed["result"]["tools"].as_array().expect("tools");
        tools.iter().find(|t| t["name"] == "fixture__lookup").expect("lookup").clone()
    };

    let generic = stdio_exchange(&project, &["serve", "--stdio"], &requests);
    assert!(lookup(&generic)["inputSchema"]["oneOf"].is_array(), "served as it is");
    // The server's size hint reached the orchestrator's cap and is served on.
    assert_eq!(lookup(&generic)["_meta"]["anthropic/maxResultSizeChars"], 200_000);
    // The server's other metadata and icons are served on (an MCP App's UI resource), with
    // what the configuration says merged over them.
    assert_eq!(lookup(&generic)["_meta"]["ui"]["resourceUri"], "ui://lookup/card.html");
    assert_eq!(lookup(&generic)["_meta"]["example.com/owner"], "crm");
    assert!(lookup(&generic)["_meta"].get("example.com/internal").is_none(), "removed");
    assert_eq!(lookup(&generic)["icons"][0]["mimeType"], "image/svg+xml");

    let claude = stdio_exchange(&project, &["serve", "--stdio", "--client", "claude"], &requests);
    let schema = &lookup(&claude)["inputSchema"];
    assert!(schema.get("oneOf").is_none(), "{schema}");
    assert_eq!(schema["type"], "object", "{schema}");
    let properties: Vec<&String> =
        schema["properties"].as_object().expect("properties").keys().collect();
    assert_eq!(properties, ["email", "id", "note"], "{schema}");
    let description = schema["description"].to_string();
    assert!(description.contains("one of these forms: `id`; or `email`"), "{description}");
    let by_id = |messages: &[Value], id: u64| {
        messages.iter().find(|m| m["id"] == id).expect("an answer").clone()
    };
    assert_eq!(by_id(&claude, 3)["result"]["content"][0]["text"], "user <ada@example.com>");
    let mixed = by_id(&claude, 4);
    assert_eq!(mixed["result"]["isError"], true, "{mixed}");
    assert!(mixed.to_string().contains("invalid arguments"), "{mixed}");

    let gemini = stdio_exchange(&project, &["serve", "--stdio", "--client", "gemini"], &requests);
    let schema = &lookup(&gemini)["inputSchema"];
    let text = schema.to_string();
    for gone in ["$defs", "$ref", "oneOf", "exclusiveMinimum", "\"null\""] {
        assert!(!text.contains(gone), "{gone} in {schema}");
    }
    assert_eq!(schema["properties"]["email"]["type"], "string", "{schema}");
    assert_eq!(schema["properties"]["note"]["nullable"], true, "{schema}");
    assert_eq!(schema["properties"]["id"]["minimum"], 0, "{schema}");
    assert_eq!(by_id(&gemini, 3)["result"]["content"][0]["text"], "user <ada@example.com>");
}

/// Without `--client`, a stdio session takes the profile of the client that connects, by
/// the name it gives: Claude Code gets names that fit after its `mcp__toolmux__` within 64
/// characters and schemas without a top-level union, and its calls by those names reach
/// the server; `--client generic` keeps names and schemas as they are.
#[test]
fn the_client_that_connects_over_stdio_chooses_its_profile() {
    let project = Project::new();
    let namespace = "a-server-whose-name-is-long-enough-to-matter";
    project.file(
        "toolmux.yaml",
        &format!(
            "mcpServers:\n  {namespace}:\n    command: {}\n    args: [stdio]\n",
            crate::conformance::fixture_bin().display()
        ),
    );
    let full = format!("{namespace}__lookup");
    assert!(full.len() + "mcp__toolmux__".len() > 64);
    let lookup_of = |messages: &[Value]| -> Value {
        let listed = messages.iter().find(|m| m["id"] == 2).expect("the listing");
        let tools = listed["result"]["tools"].as_array().expect("tools").clone();
        let lookup = |t: &Value| t["description"] == "Finds a user by id or by email";
        tools.into_iter().find(lookup).expect("lookup")
    };
    let list = [serde_json::json!({"method": "tools/list"})];

    let claude = stdio_exchange_as(&project, &["serve", "--stdio"], "claude-code", &list);
    let tool = lookup_of(&claude);
    let served = tool["name"].as_str().expect("a name").to_owned();
    assert!(served.len() + "mcp__toolmux__".len() <= 64, "{served}");
    assert!(tool["inputSchema"].get("oneOf").is_none(), "{tool}");
    let call = serde_json::json!({"method": "tools/call", "params": {"name": served,
        "arguments": {"email": "ada@example.com"}}});
    let called = stdio_exchange_as(&project, &["serve", "--stdio"], "claude-code", &[call]);
    let answer = called.iter().find(|m| m["id"] == 2).expect("an answer");
    assert_eq!(answer["result"]["content"][0]["text"], "user <ada@example.com>", "{answer}");

    // Another client, or a profile chosen on the command line: names as they are.
    let other = stdio_exchange_as(&project, &["serve", "--stdio"], "some-agent", &list);
    assert_eq!(lookup_of(&other)["name"], full.as_str());
    let generic = stdio_exchange_as(
        &project,
        &["serve", "--stdio", "--client", "generic"],
        "claude-code",
        &list,
    );
    assert_eq!(lookup_of(&generic)["name"], full.as_str());
    assert!(lookup_of(&generic)["inputSchema"]["oneOf"].is_array());

    // The file can say it too (`serve.client`, `serve.namePrefix`); `--client` overrides.
    let fixture = crate::conformance::fixture_bin().display().to_string();
    let with_serve = |serve: &str| {
        format!(
            "serve: {serve}\nmcpServers:\n  {namespace}:\n    command: {fixture}\n    args: [stdio]\n"
        )
    };
    project.file("toolmux.yaml", &with_serve("{client: generic, namePrefix: mcp__toolmux__}"));
    let prefixed = stdio_exchange_as(&project, &["serve", "--stdio"], "some-agent", &list);
    let name = lookup_of(&prefixed)["name"].as_str().expect("a name").to_owned();
    assert!(name.len() + "mcp__toolmux__".len() <= 64, "{name}");
    assert!(lookup_of(&prefixed)["inputSchema"]["oneOf"].is_array(), "generic schemas");
    project.file("toolmux.yaml", &with_serve("{client: claude}"));
    let from_file = stdio_exchange_as(&project, &["serve", "--stdio"], "some-agent", &list);
    assert!(lookup_of(&from_file)["inputSchema"].get("oneOf").is_none());
    let overridden = stdio_exchange_as(
        &project,
        &["serve", "--stdio", "--client", "generic"],
        "some-agent",
        &list,
    );
    assert_eq!(lookup_of(&overridden)["name"], full.as_str());
    project.file("toolmux.yaml", &with_serve("{client: claud}"));
    for args in [&["serve", "--stdio"][..], &["config", "check"]] {
        let run = project.run(args);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        let said = "toolmux.yaml: serve.client: no client profile `claud`; the profiles are: \
                    generic, claude, codex, openai, cursor, gemini";
        assert!(run.stderr.contains(said), "{args:?}: {}", run.stderr);
    }
}

/// `completion/complete` reaches the upstream server that offers the prompt (by its
/// qualified name) or the resource template, with the arguments already given, through the
/// real binary and `@modelcontextprotocol/server-everything`.
#[test]
fn completions_reach_the_server_of_the_prompt_or_template() {
    let project = gateway_project();
    let complete = |reference: Value, argument: Value, context: Option<Value>| {
        let mut params = serde_json::json!({"ref": reference, "argument": argument});
        if let Some(context) = context {
            params["context"] = context;
        }
        serde_json::json!({"method": "completion/complete", "params": params})
    };
    let prompt =
        serde_json::json!({"type": "ref/prompt", "name": "everything__completable-prompt"});
    let requests = [
        complete(prompt.clone(), serde_json::json!({"name": "department", "value": "S"}), None),
        complete(
            prompt,
            serde_json::json!({"name": "name", "value": ""}),
            Some(serde_json::json!({"arguments": {"department": "Engineering"}})),
        ),
        complete(
            serde_json::json!({"type": "ref/resource",
                "uri": "demo://resource/dynamic/text/{resourceId}"}),
            serde_json::json!({"name": "resourceId", "value": "42"}),
            None,
        ),
        complete(
            serde_json::json!({"type": "ref/prompt", "name": "everything__completable-prompts"}),
            serde_json::json!({"name": "department", "value": ""}),
            None,
        ),
        // A template nobody offers: nothing to suggest.
        complete(
            serde_json::json!({"type": "ref/resource", "uri": "nowhere://{x}"}),
            serde_json::json!({"name": "x", "value": ""}),
            None,
        ),
    ];
    let messages = stdio_exchange(&project, &["serve", "--stdio"], &requests);
    let by_id = |id: u64| messages.iter().find(|m| m["id"] == id).expect("an answer").clone();
    assert!(by_id(1)["result"]["capabilities"]["completions"].is_object(), "{}", by_id(1));
    let values = |id: u64| by_id(id)["result"]["completion"]["values"].clone();
    assert_eq!(values(2), serde_json::json!(["Sales", "Support"]), "{}", by_id(2));
    assert_eq!(values(3), serde_json::json!(["Alice", "Bob", "Charlie"]), "{}", by_id(3));
    assert_eq!(values(4), serde_json::json!(["42"]), "{}", by_id(4));
    let unknown = by_id(5);
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    let message = unknown["error"]["message"].to_string();
    assert!(message.contains("everything__completable-prompt"), "a suggestion: {message}");
    assert_eq!(values(6), serde_json::json!([]), "{}", by_id(6));
}

/// With `--tools`, a server's prompts and resources are served only when one of its tools
/// is: `fs__*` hides server-everything's, `everything__echo` brings them.
#[test]
fn serve_tools_globs_also_choose_the_servers_prompts_and_resources() {
    let project = gateway_project();
    let requests = [
        serde_json::json!({"method": "prompts/list"}),
        serde_json::json!({"method": "resources/list"}),
        serde_json::json!({"method": "resources/templates/list"}),
    ];
    let count = |args: &[&str], id: u64, key: &str| {
        let messages = stdio_exchange(&project, args, &requests);
        let answer = messages.iter().find(|m| m["id"] == id).expect("an answer").clone();
        answer["result"][key].as_array().map_or(0, Vec::len)
    };
    let fs_only = ["serve", "--stdio", "--tools", "fs__*"];
    assert_eq!(count(&fs_only, 2, "prompts"), 0);
    assert_eq!(count(&fs_only, 3, "resources"), 0);
    assert_eq!(count(&fs_only, 4, "resourceTemplates"), 0);
    let with_everything = ["serve", "--stdio", "--tools", "everything__echo"];
    assert!(count(&with_everything, 2, "prompts") > 0);
    assert!(count(&with_everything, 4, "resourceTemplates") > 0);
}

/// Permission rules close prompts and resources as they close tools: by the prompt's name,
/// and by `{namespace}__{uri}` for a resource or a template.
#[test]
fn permission_rules_keep_prompts_and_resources_from_clients() {
    let project = gateway_project();
    let config = std::fs::read_to_string(project.path().join("toolmux.yaml")).expect("config");
    project.file(
        "toolmux.yaml",
        &format!(
            "{config}permissions:\n  deny: [everything__args-prompt, \
             'everything__demo://resource/dynamic/*']\n"
        ),
    );
    let requests = [
        serde_json::json!({"method": "prompts/list"}),
        serde_json::json!({"method": "prompts/get", "params": {"name": "everything__args-prompt",
            "arguments": {"city": "Paris"}}}),
        serde_json::json!({"method": "resources/templates/list"}),
        serde_json::json!({"method": "resources/read",
            "params": {"uri": "demo://resource/dynamic/text/1"}}),
        serde_json::json!({"method": "completion/complete", "params": {
            "ref": {"type": "ref/resource", "uri": "demo://resource/dynamic/text/{resourceId}"},
            "argument": {"name": "resourceId", "value": "4"}}}),
        serde_json::json!({"method": "tools/call", "params": {"name": "everything__echo",
            "arguments": {"message": "still here"}}}),
        serde_json::json!({"method": "prompts/get", "params": {"name": "everything__simple-prompt"}}),
    ];
    let messages = stdio_exchange(&project, &["serve", "--stdio"], &requests);
    let by_id = |id: u64| messages.iter().find(|m| m["id"] == id).expect("an answer").clone();
    let prompts: Vec<String> = by_id(2)["result"]["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(prompts.contains(&"everything__simple-prompt".to_owned()), "{prompts:?}");
    assert!(!prompts.contains(&"everything__args-prompt".to_owned()), "{prompts:?}");
    let refused = by_id(3)["error"]["message"].to_string();
    assert!(refused.contains("permissions.deny: everything__args-prompt"), "{}", by_id(3));
    let templates = by_id(4)["result"]["resourceTemplates"].to_string();
    assert!(!templates.contains("demo://resource/dynamic/"), "{templates}");
    let refused = by_id(5)["error"]["message"].to_string();
    assert!(refused.contains("everything__demo://resource/dynamic/text/1"), "{}", by_id(5));
    assert!(refused.contains("denied by rule"), "{}", by_id(5));
    assert_eq!(by_id(6)["result"]["completion"]["values"], serde_json::json!([]), "{}", by_id(6));
    assert_eq!(by_id(7)["result"]["content"][0]["text"], "Echo: still here", "{}", by_id(7));
    assert!(by_id(8)["result"]["messages"].is_array(), "{}", by_id(8));
}

/// A key long enough to be accepted.
const KEY: &str = "k3y-for-tests-only-0123456789";

/// One bare HTTP/1.1 exchange with the server of `url` (`http://HOST:PORT/mcp`): `method`
/// `path` with an optional `Authorization` header and body; the status and the whole
/// response.
fn raw_http(
    url: &str,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> (u16, String) {
    let address = url.trim_start_matches("http://").trim_end_matches("/mcp");
    raw_http_to(url, address, method, path, authorization, body)
}

/// [`raw_http`] with `host` as the `Host` header.
fn raw_http_to(
    url: &str,
    host: &str,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> (u16, String) {
    let auth = authorization.map(|a| vec![("Authorization", a)]).unwrap_or_default();
    raw_request(url, host, method, path, &auth, body)
}

/// One bare HTTP/1.1 exchange with `headers` besides `Host`, the content types and the
/// length.
fn raw_request(
    url: &str,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use std::io::Read as _;
    let address = url.trim_start_matches("http://").trim_end_matches("/mcp");
    let extra: String =
        headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{extra}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, response)
}

/// A bare `POST /mcp` of an `initialize` request.
fn raw_post(url: &str, authorization: Option<&str>) -> (u16, String) {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    raw_http(url, "POST", "/mcp", authorization, &body.to_string())
}

/// A bare `GET` of `path`.
fn raw_get(url: &str, path: &str, authorization: Option<&str>) -> (u16, String) {
    raw_http(url, "GET", path, authorization, "")
}

/// With API keys, a client without one of them is refused with 401 saying what to send,
/// and a real client that sends one (the MCP Inspector, `--header`) works.
#[test]
fn http_api_keys_keep_out_clients_without_one() {
    let project = Project::new().env("CI_KEY", KEY);
    project.file(
        "toolmux.yaml",
        "defaults: {auditLog: audit.jsonl}\nfs: {}\nserve:\n  apiKeys:\n    ci: ${CI_KEY}\n",
    );
    project.file("a.txt", "TODO\n");
    let gateway = serve_http(&project);
    let (status, response) = raw_post(&gateway.url, None);
    assert_eq!(status, 401, "{response}");
    assert!(response.contains("missing or unknown API key"), "{response}");
    assert!(response.to_ascii_lowercase().contains("www-authenticate: bearer"), "{response}");
    let (status, _) = raw_post(&gateway.url, Some("Bearer not-the-key-not-the-key"));
    assert_eq!(status, 401);
    let (status, response) = raw_post(&gateway.url, Some(&format!("Bearer {KEY}")));
    assert_eq!(status, 200, "{response}");

    let header = format!("Authorization: Bearer {KEY}");
    let url = gateway.url.clone();
    let grep = inspector(
        &project,
        &[
            &url,
            "--transport",
            "http",
            "--header",
            &header,
            "--method",
            "tools/call",
            "--tool-name",
            "fs__grep",
            "--tool-arg",
            "pattern=TODO",
        ],
    );
    assert_eq!(grep["content"][0]["text"], "a.txt", "{grep}");

    // Probes need no key; statistics do, and so do the providers' names.
    let (status, health) = raw_get(&gateway.url, "/health", None);
    assert_eq!(status, 200, "{health}");
    assert!(health.contains(r#""status":"ok""#) && health.contains(r#""tools":5"#), "{health}");
    assert!(!health.contains("providers"), "named without a key: {health}");
    let (status, health) = raw_get(&gateway.url, "/health", Some(&format!("Bearer {KEY}")));
    assert_eq!(status, 200, "{health}");
    assert!(health.contains(r#""providers":{"fs":{"ok":true}"#), "{health}");
    let (_, health) = raw_get(&gateway.url, "/health", Some("Bearer not-the-key-at-all"));
    assert!(!health.contains("providers"), "named with a wrong key: {health}");
    assert_eq!(raw_get(&gateway.url, "/metrics", None).0, 401);
    let (status, metrics) = raw_get(&gateway.url, "/metrics", Some(&format!("Bearer {KEY}")));
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("# TYPE toolmux_tool_calls_total counter"), "{metrics}");
    assert!(
        metrics.contains(r#"toolmux_tool_calls_total{tool="fs__grep",outcome="ok"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"toolmux_holder_calls_total{holder="ci",outcome="ok"} 1"#),
        "calls by key holder: {metrics}"
    );
    // Neither names tools or providers to a page that rebinds a name to this server.
    let bearer = format!("Bearer {KEY}");
    for path in ["/metrics", "/health"] {
        let (status, response) =
            raw_http_to(&gateway.url, "evil.example", "GET", path, Some(&bearer), "");
        assert_eq!(status, 403, "{path}: {response}");
    }
    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stderr.contains(KEY), "the key is never logged: {}", run.stderr);
    // The audit log tells which key holder made the call, and never the key.
    let audit = std::fs::read_to_string(project.path().join("audit.jsonl")).expect("an audit log");
    let record: Value =
        serde_json::from_str(audit.lines().next().expect("a record")).expect("json");
    assert_eq!(record["tool"], "fs__grep", "{audit}");
    assert!(record["run"].as_str().is_some_and(|r| r.starts_with("key:ci/")), "{audit}");
    assert!(!audit.contains(KEY), "{audit}");
}

/// On every address with keys (the README's recipe for other machines), a client naming
/// the server as it reaches it (`tools.lan`) is served; the key still decides.
#[test]
fn http_on_every_address_serves_other_machines_names_with_a_key() {
    let project = Project::new().env("CI_KEY", KEY);
    project.file(
        "toolmux.yaml",
        "fs: {}
",
    );
    let gateway = serve_http_at(&project, "0.0.0.0:0", &["--api-key-env", "CI_KEY"]);
    let url = gateway.url.replace("0.0.0.0", "127.0.0.1");
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
    .to_string();
    let bearer = format!("Bearer {KEY}");
    let (status, response) =
        raw_http_to(&url, "tools.lan:8931", "POST", "/mcp", Some(&bearer), &body);
    assert_eq!(status, 200, "{response}");
    let (status, _) = raw_http_to(&url, "tools.lan:8931", "POST", "/mcp", None, &body);
    assert_eq!(status, 401);
    let (status, response) = raw_http_to(&url, "192.0.2.7", "GET", "/metrics", Some(&bearer), "");
    assert_eq!(status, 200, "{response}");
    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// An MCP session belongs to the key holder that made it: another holder who presents its
/// id can neither open its stream of server messages nor end it.
#[test]
fn http_sessions_belong_to_the_key_holder_that_made_them() {
    const BOB: &str = "b0b-key-for-tests-only-98765";
    let project = Project::new().env("ALICE_KEY", KEY).env("BOB_KEY", BOB);
    project.file(
        "toolmux.yaml",
        "fs: {}\nserve:\n  apiKeys: {alice: '${ALICE_KEY}', bob: '${BOB_KEY}'}\n",
    );
    let gateway = serve_http(&project);
    let host = gateway.url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let (alice, bob) = (format!("Bearer {KEY}"), format!("Bearer {BOB}"));
    let (status, response) = raw_post(&gateway.url, Some(&alice));
    assert_eq!(status, 200, "{response}");
    let session = response
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("mcp-session-id:")
                .map(|_| l[15..].trim().to_owned())
        })
        .expect("a session id");
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let as_holder = |key: &str, method: &str, body: &str| {
        let headers = [
            ("Authorization", key),
            ("Mcp-Session-Id", session.as_str()),
            ("Mcp-Protocol-Version", "2025-06-18"),
        ];
        raw_request(&gateway.url, &host, method, "/mcp", &headers, body)
    };
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(as_holder(&alice, "POST", initialized).0, 202);
    for method in ["GET", "DELETE"] {
        let (status, response) = as_holder(&bob, method, "");
        assert_eq!(status, 404, "{method}: {response}");
    }
    let (status, response) = as_holder(&bob, "POST", list);
    assert_eq!(status, 404, "{response}");
    let (status, response) = as_holder(&alice, "POST", list);
    assert_eq!(status, 200, "alice's session still serves her: {response}");
    assert!(response.contains("fs__grep"), "{response}");
    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// A name prefix that leaves a served name less than it needs of a client's 64 characters
/// is refused before anything starts, from the command line or the file.
#[test]
fn a_name_prefix_too_long_for_any_name_is_refused() {
    let project = Project::new();
    let long = "p".repeat(49);
    let run = project.run(&["serve", "--stdio", "--name-prefix", &long]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("--name-prefix is 49 characters long")
            && run.stderr.contains("at most 48 characters"),
        "{}",
        run.stderr
    );
    project.file("toolmux.yaml", &format!("serve:\n  namePrefix: {long}\nfs: {{}}\n"));
    let run = project.run(&["serve", "--stdio"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("toolmux.yaml: serve.namePrefix is 49"), "{}", run.stderr);
}

/// Listening where other machines reach it without a key is refused unless asked for; bad
/// keys are refused before anything starts.
#[test]
fn http_without_keys_stays_on_loopback() {
    let project = Project::new();
    let run = project.run(&["serve", "--http", "0.0.0.0:0"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("without an API key") && run.stderr.contains("--no-auth"),
        "{}",
        run.stderr
    );
    let run =
        project.run(&["serve", "--http", "127.0.0.1:0", "--api-key-env", "TOOLMUX_NO_SUCH_VAR"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("TOOLMUX_NO_SUCH_VAR is not set"), "{}", run.stderr);
    let short = Project::new().env("SHORT_KEY", "abc");
    let run = short.run(&["serve", "--http", "127.0.0.1:0", "--api-key-env", "SHORT_KEY"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("shorter than 16 characters"), "{}", run.stderr);
    assert!(!run.stderr.contains("abc\n"), "{}", run.stderr);
}

/// An output over the size cap is stored and the model reads it on with `output__read`,
/// page by page; another run cannot read it.
#[test]
fn spilled_outputs_are_read_in_pages_by_their_run() {
    let project = Project::new();
    let lines: String = (1..=400).map(|i| format!("line {i} of the long file\n")).collect();
    project.file("long.txt", &lines);
    project.file("toolmux.yaml", "defaults: {toolResponseMaxBytes: 2000}\nfs: {}\n");
    let read = serde_json::json!({"method": "tools/call",
        "params": {"name": "fs__read", "arguments": {"path": "long.txt", "limit": 400}}});
    let first = stdio_exchange(&project, &["serve", "--stdio"], std::slice::from_ref(&read));
    let text = first.last().expect("an answer")["result"]["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    let spilled: Value = serde_json::from_str(&text).expect("a tool_output message");
    let handle = spilled["tool_output"]["handle"].as_str().expect("a handle").to_owned();
    assert_eq!(spilled["tool_output"]["reason"], "size_limit_exceeded");

    // Each `toolmux serve --stdio` is a run of its own: the run is named, as an agent that
    // reconnects names it, to read what it stored before.
    let named = serde_json::json!({"toolmux/runId": "agent-1"});
    let read_named = serde_json::json!({"method": "tools/call", "params": {
        "name": "fs__read", "arguments": {"path": "long.txt", "limit": 400}, "_meta": named}});
    let stored = stdio_exchange(&project, &["serve", "--stdio"], &[read_named]);
    let text = stored.last().expect("an answer")["result"]["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    let handle_named = serde_json::from_str::<Value>(&text).expect("json")["tool_output"]["handle"]
        .as_str()
        .expect("a handle")
        .to_owned();
    let page = |handle: &str, meta: Value| {
        serde_json::json!({"method": "tools/call", "params": {"name": "output__read",
            "arguments": {"handle": handle, "offset": 2, "limit": 3}, "_meta": meta}})
    };
    let answers = stdio_exchange(
        &project,
        &["serve", "--stdio"],
        &[
            page(&handle_named, named.clone()),
            page(&handle_named, serde_json::json!({})),
            page(&handle, named.clone()),
            // More lines than fit under the size cap: the page stops short of it.
            serde_json::json!({"method": "tools/call", "params": {"name": "output__read",
                "arguments": {"handle": handle_named, "limit": 400}, "_meta": named}}),
        ],
    );
    let by_id =
        |id: u64| answers.iter().find(|m| m["id"] == id).expect("an answer")["result"].clone();
    let own = by_id(2);
    let text = own["content"][0]["text"].as_str().expect("text");
    assert!(text.starts_with("     3\tline 3 of the long file\n"), "{text}");
    assert!(text.ends_with("; read on with offset 5]"), "{text}");
    assert!(text.contains("\n[lines 3-5 of "), "{text}");
    assert_eq!(own["isError"], false);
    // Another run (this session's own, and the first session's handle from a named run).
    for id in [3, 4] {
        let refused = by_id(id);
        assert_eq!(refused["isError"], true, "{refused}");
        assert!(refused.to_string().contains("no stored output"), "{refused}");
    }
    let long = by_id(5);
    let text = long["content"][0]["text"].as_str().expect("text");
    assert!(!text.contains("tool_output"), "a page is never stored again: {text}");
    assert!(text.len() <= 2000, "{}", text.len());
    assert!(
        text.starts_with(
            "     1	line 1 of the long file
"
        ),
        "{text}"
    );
    let next = long["_meta"]["toolmux/extras"]["nextOffset"].as_u64().expect("more to read");
    assert!(text.ends_with(&format!("; read on with offset {next}]")), "{text}");
}

/// A configured rate limit: the second call within the period is refused, saying when to
/// call again; a limit that allows nothing is a configuration error.
#[test]
fn rate_limits_refuse_calls_beyond_them() {
    let project = Project::new();
    project.file("a.txt", "x\n");
    project.file(
        "toolmux.yaml",
        "fs: {}\ntools:\n  fs__ls:\n    rateLimit: {calls: 1, perMs: 60000}\n",
    );
    let ls =
        serde_json::json!({"method": "tools/call", "params": {"name": "fs__ls", "arguments": {}}});
    let answers = stdio_exchange(&project, &["serve", "--stdio"], &[ls.clone(), ls]);
    let results: Vec<&Value> =
        answers.iter().filter(|m| m["id"] != 1).map(|m| &m["result"]).collect();
    let refused: Vec<&&Value> = results.iter().filter(|r| r["isError"] == true).collect();
    assert_eq!(refused.len(), 1, "{results:?}");
    let text = refused[0]["content"][0]["text"].as_str().expect("text");
    assert!(text.contains("`fs__ls` is rate limited (1 call per 1m): call it again in"), "{text}");

    project.file(
        "toolmux.yaml",
        "fs: {}\ntools:\n  fs__ls:\n    rateLimit: {calls: 0, perMs: 1000}\n",
    );
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("tools.fs__ls.rateLimit: `calls` and `perMs` must be at least 1"),
        "{}",
        run.stderr
    );
}

/// A call's wait for one of its server's `maxCallsInFlight` slots counts against its
/// `toolTimeout`, one deadline per call, through the real gateway over HTTP: five
/// concurrent calls of a tool that takes 3 s, two at a time, 4 s each. The two that get a
/// slot first succeed at 3 s; the rest end at 4 s, saying they waited for a slot, where
/// each call got a whole timeout once it had a slot and the last succeeded after 9 s.
#[test]
fn calls_waiting_for_a_slot_over_http_end_within_their_timeout() {
    const SLACK: Duration = Duration::from_millis(2500);
    let nap = line_server(&json!({
        "name": "slow", "text": "rested", "sleep": 3,
        "tools": [{"name": "nap", "inputSchema": {"type": "object"}}],
    }));
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!(
            "defaults: {{maxCallsInFlight: 2, toolTimeout: 4000}}\nmcpServers:\n  slow:\n{nap}"
        ),
    );
    let gateway = serve_http(&project);
    let (status, response) = raw_post(&gateway.url, None);
    assert_eq!(status, 200, "{response}");
    let session = response
        .lines()
        .find_map(|l| l.to_ascii_lowercase().starts_with("mcp-session-id:").then(|| l[15..].trim()))
        .expect("a session id")
        .to_owned();
    let host = gateway.url.trim_start_matches("http://").trim_end_matches("/mcp").to_owned();
    let headers = [("Mcp-Session-Id", session.as_str()), ("Mcp-Protocol-Version", "2025-06-18")];
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(raw_request(&gateway.url, &host, "POST", "/mcp", &headers, initialized).0, 202);

    let start = std::sync::Barrier::new(5);
    // Each thread only calls and times its call, so that the gateway is stopped before any
    // assertion can fail; no read waits more than raw_request's 10 s.
    let calls: Vec<(Duration, u16, String)> = std::thread::scope(|scope| {
        let calls: Vec<_> = (1..=5)
            .map(|id| {
                let (start, url, host, headers) = (&start, &gateway.url, &host, &headers);
                scope.spawn(move || {
                    let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                        "params": {"name": "slow__nap", "arguments": {}}});
                    start.wait();
                    let began = Instant::now();
                    let (status, response) =
                        raw_request(url, host, "POST", "/mcp", headers, &call.to_string());
                    (began.elapsed(), status, response)
                })
            })
            .collect();
        calls.into_iter().map(|call| call.join().expect("the call's thread")).collect()
    });
    let run = stop(gateway);
    let answers: Vec<(Duration, Value)> = calls
        .into_iter()
        .map(|(took, status, response)| {
            assert_eq!(status, 200, "{response}");
            // The answer is an SSE event's data.
            let answer = response
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
                .find(|m| m["id"].is_number())
                .unwrap_or_else(|| panic!("no answer: {response}"));
            (took, answer)
        })
        .collect();
    let summary: Vec<String> =
        answers.iter().map(|(took, answer)| format!("{took:?}: {answer}")).collect();
    for (took, _) in &answers {
        assert!(*took < Duration::from_secs(4) + SLACK, "an answer came late: {summary:#?}");
    }
    let mut succeeded = 0;
    for (_, answer) in &answers {
        let text = answer["result"]["content"][0]["text"].as_str().unwrap_or_default();
        if answer["result"]["isError"] == false && text == "rested" {
            succeeded += 1;
            continue;
        }
        assert_eq!(answer["result"]["isError"], true, "{summary:#?}");
        assert!(
            text.starts_with("timeout: `slow__nap` did not finish within 4s: "),
            "{summary:#?}"
        );
        // Sent after its wait (`counts the 3.0s it waited for a slot`), or never sent
        // (`waited all of its timeout … for one of the 2 calls `slow` may have in flight`).
        let waited = text.contains("waited for a slot") || text.contains("waited all of its");
        assert!(waited && text.contains("maxCallsInFlight"), "{summary:#?}");
    }
    assert!(succeeded >= 2, "fewer than two calls succeeded: {summary:#?}");
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// An output over the size cap of a tool with an output schema (server-everything's
/// `get-structured-content`) still reaches the official Python SDK client, which refuses a
/// result without the structured content the schema promises: the text is spilled, the
/// structured content passes on.
#[test]
fn a_capped_output_keeps_its_structured_content_for_the_python_client() {
    let project = gateway_project();
    let config = std::fs::read_to_string(project.path().join("toolmux.yaml")).unwrap();
    project.file("toolmux.yaml", &format!("defaults:\n  toolResponseMaxBytes: 40\n{config}"));
    let script = r#"
import json, sys
import anyio
from mcp import Client, StdioServerParameters

async def main():
    server = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:])
    with anyio.fail_after(60):
        async with Client(server, mode="legacy") as client:
            await client.list_tools()
            result = await client.call_tool("everything__get-structured-content", {"location": "Chicago"})
            text = result.content[0].text if result.content else ""
            print(json.dumps({"is_error": bool(result.is_error), "text": text, "structured": result.structured_content}))

anyio.run(main)
"#;
    let summary = run_python(&project, &["-c", script, toolmux_bin(), "serve", "--stdio"]);
    assert_eq!(summary["is_error"], false, "{summary}");
    assert!(
        summary["text"].as_str().unwrap_or_default().contains("size_limit_exceeded"),
        "{summary}"
    );
    assert!(summary["structured"]["temperature"].is_number(), "{summary}");
}

/// `toolSearch.defer`: an MCP client (the official Python SDK's) is not listed the deferred
/// tools, finds one with `tools__search` and calls it with `tools__call`; `tools call`
/// does the same from the command line.
#[test]
fn deferred_tools_are_found_and_called_by_mcp_clients_and_the_command_line() {
    let project = Project::new();
    project.file("notes.md", "TODO: one\n");
    project.file("toolmux.yaml", "fs: {}\ntoolSearch:\n  defer: ['fs__grep', 'fs__glob']\n");
    let script = r#"
import json, sys
import anyio
from mcp import Client, StdioServerParameters

async def main():
    server = StdioServerParameters(command=sys.argv[1], args=sys.argv[2:])
    with anyio.fail_after(60):
        async with Client(server, mode="legacy") as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            found = await client.call_tool("tools__search", {"query": "search the contents of files"})
            called = await client.call_tool("tools__call", {"name": "fs__grep", "arguments": {"pattern": "TODO"}})
            print(json.dumps({"tools": tools, "found": found.content[0].text,
                              "called": called.content[0].text, "is_error": bool(called.is_error)}))

anyio.run(main)
"#;
    let summary = run_python(&project, &["-c", script, toolmux_bin(), "serve", "--stdio"]);
    let tools: Vec<&str> =
        summary["tools"].as_array().expect("tools").iter().filter_map(Value::as_str).collect();
    assert!(tools.contains(&"tools__search") && tools.contains(&"tools__call"), "{tools:?}");
    assert!(tools.contains(&"fs__read"), "{tools:?}");
    assert!(!tools.contains(&"fs__grep") && !tools.contains(&"fs__glob"), "{tools:?}");
    let found = summary["found"].as_str().unwrap_or_default();
    assert!(found.contains("\"name\": \"fs__grep\""), "{found}");
    assert_eq!(summary["called"], "notes.md", "{summary}");
    assert_eq!(summary["is_error"], false);

    let listed = project.run(&["tools", "list"]);
    let deferred =
        |line: &str| line.starts_with("fs__grep") && line.contains("[deferred: tools__search]");
    assert!(listed.ok().lines().any(deferred), "{}", listed.stdout);
    let found = project.run(&[
        "tools",
        "call",
        "tools__search",
        r#"{"query": "find files by glob pattern"}"#,
    ]);
    assert!(found.ok().contains("fs__glob"), "{}", found.stdout);
    let called = project.run(&[
        "tools",
        "call",
        "tools__call",
        r#"{"name": "fs__grep", "arguments": {"pattern": "TODO"}}"#,
    ]);
    assert_eq!(called.ok().trim(), "notes.md");
}

/// Calls through `toolmux serve --stdio` to a stdio MCP server are relayed (the request
/// spliced from the client's arguments, a plain result passed on as the server wrote it)
/// and keep every stage of the pipeline: error results, the size cap, cancellation and the
/// timeout.
#[test]
fn calls_relayed_to_a_stdio_server_keep_the_pipeline() {
    let fixture = crate::conformance::fixture_bin().with_file_name("toolmux-mcp-fixture");
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!(
            "mcpServers:\n  fx:\n    command: {}\n    args: [ok]\n\
             defaults: {{toolTimeout: 2000, toolResponseMaxBytes: 1000}}\n",
            fixture.display()
        ),
    );
    let mut served = crate::agent::Served::start(&project, json!({}));
    assert_eq!(served.next()["id"], 1);
    let call = |served: &mut crate::agent::Served, id: u64, name: &str, arguments: Value| {
        served.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}}));
    };
    // Calls take the relayed path once the session has finished its handshake, which the
    // answer to `initialize` does not wait for: one call first, answered either way.
    call(&mut served, 100, "fx__echo", json!({"message": "warm"}));
    let answer = served.next();
    assert_eq!(answer["id"], 100, "{answer}");
    call(&mut served, 2, "fx__echo", json!({"message": "hi \u{e9}"}));
    // The fixture's result as it wrote it (a decoded and encoded one has `isError: false`).
    let answer = served.next();
    assert_eq!(answer["id"], 2);
    assert_eq!(answer["result"], json!({"content": [{"type": "text", "text": "echo: hi \u{e9}"}]}));
    call(&mut served, 3, "fx__error", json!({}));
    // Each call is answered once (a relayed one early, by the reader of the server's output).
    let answer = served.next();
    assert_eq!(answer["id"], 3, "{answer}");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], "it broke");
    // Over the size cap: stored, and the client told where.
    call(&mut served, 4, "fx__big", json!({"bytes": 5000}));
    let answer = served.next();
    assert_eq!(answer["id"], 4, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().expect("text").to_owned();
    assert!(text.len() < 1000 && text.contains("size_limit_exceeded"), "{text}");
    // Cancelled by the client: no answer, and the server told.
    call(&mut served, 5, "fx__slow", json!({}));
    std::thread::sleep(Duration::from_millis(200));
    served.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 5, "reason": "changed my mind"}}));
    std::thread::sleep(Duration::from_millis(200));
    call(&mut served, 6, "fx__cancelled_ids", json!({}));
    let answer = served.next();
    assert_eq!(answer["id"], 6, "no answer to the cancelled call: {answer}");
    let cancelled = answer["result"]["content"][0]["text"].as_str().expect("text").to_owned();
    assert!(cancelled.contains("tm-"), "the server heard of the cancellation: {cancelled}");
    // Timed out.
    call(&mut served, 7, "fx__hang", json!({}));
    let answer = served.next();
    assert_eq!(answer["id"], 7, "{answer}");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().expect("text");
    assert!(text.contains("timeout"), "{text}");
    served.end();
}

/// A client of a handshake revision never sees `resultType` (a 2026-07-28 field), also
/// when a call is answered the usual way rather than relayed: after the upstream server
/// crashed and was started again.
#[test]
fn results_carry_no_result_type_for_older_clients_after_a_restart() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!(
            "defaults: {{statsFile: false}}\nmcpServers:\n  fix:\n    command: {}\n    args: [ok]\n",
            crate::conformance::fixture_bin().with_file_name("toolmux-mcp-fixture").display()
        ),
    );
    let mut child = project
        .command(&["serve", "--stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmux serve starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    // Writes `lines` and reads up to the answer of request `id`.
    let mut ask = |lines: &[Value], id: u64| -> Value {
        for line in lines {
            writeln!(stdin, "{line}").expect("write");
        }
        loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap_or(0) > 0, "toolmux ended early");
            let message: Value = serde_json::from_str(&line).expect("JSON");
            if message["id"] == id {
                return message;
            }
        }
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    assert!(ask(&[initialize], 1)["result"]["serverInfo"].is_object());
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let call = |id: u64, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}})
    };
    let answers = [
        ask(&[initialized, call(2, "fix__echo", json!({"message": "a"}))], 2),
        ask(&[call(3, "fix__crash", json!({}))], 3),
        ask(&[call(4, "fix__echo", json!({"message": "b"}))], 4),
        ask(&[call(5, "fix__echo", json!({"message": "c"}))], 5),
    ];
    assert_eq!(answers[1]["result"]["isError"], true, "{}", answers[1]);
    assert_eq!(answers[2]["result"]["content"][0]["text"], "echo: b", "{}", answers[2]);
    for answer in &answers {
        assert!(answer["result"].get("resultType").is_none(), "{answer}");
    }
    drop(stdin);
    child.stdout = Some(stdout.into_inner());
    let run = wait(child, Duration::from_secs(30));
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// Malformed requests get the JSON-RPC error that says what is wrong: a `tools/call`
/// without a name or with arguments that are no object is `-32602` naming the member
/// (not `-32601`, "method not found"), and a line that is not JSON is `-32700` with id
/// `null`; the session goes on serving.
#[test]
fn malformed_requests_get_the_right_json_rpc_errors() {
    let project = Project::new();
    let (mut child, mut stdin, mut stdout) = spawn_stdio(&project, &["serve", "--stdio"]);
    let lines = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"arguments":{}}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"fs__ls","arguments":5}}"#,
        "this is not json",
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"fs__ls","arguments":{}}}"#,
    ];
    for line in lines {
        writeln!(stdin, "{line}").expect("write");
    }
    let mut answers: Vec<Value> = Vec::new();
    while !answers.iter().any(|a| a["id"] == 4) {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        answers.push(serde_json::from_str(&line).expect("JSON"));
    }
    drop(stdin);
    let _ = child.wait();
    let of = |id: Value| answers.iter().find(|a| a["id"] == id).cloned().unwrap_or_default();
    let no_name = of(2.into());
    assert_eq!(no_name["error"]["code"], -32602, "{no_name}");
    assert!(no_name["error"]["message"].as_str().unwrap().contains("`params.name` is missing"));
    let bad_arguments = of(3.into());
    assert_eq!(bad_arguments["error"]["code"], -32602, "{bad_arguments}");
    assert!(bad_arguments["error"]["message"].as_str().unwrap().contains("must be an object"));
    let parse = of(Value::Null);
    assert_eq!(parse["error"]["code"], -32700, "{answers:?}");
    assert!(of(4.into())["result"]["content"].is_array(), "{answers:?}");
}

/// A server slower to start than `serve` waits (a cold `npx` or container start) does not
/// hold up the clients: `initialize` is answered within seconds with the tools that are
/// up, and the slow server's tools follow with `list_changed` once it is. (The gateway
/// answered nothing until every server had started or timed out, 30 s.)
#[test]
fn a_slow_server_joins_after_the_gateway_answers() {
    let node = peer("node/node_modules/.bin/node");
    let everything =
        peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        &format!(
            "fs: {{}}\nmcpServers:\n  everything:\n    command: sh\n    args: ['-c', 'sleep 11; exec \"$0\" \"$1\" stdio', '{}', '{}']\n",
            node.display(),
            everything.display()
        ),
    );
    let began = Instant::now();
    let (mut child, mut stdin, mut stdout) = spawn_stdio(&project, &["serve", "--stdio"]);
    let mut next = || {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("a line");
        serde_json::from_str::<Value>(&line).expect("JSON")
    };
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#).unwrap();
    let init = next();
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    let answered = began.elapsed();
    assert!(answered < Duration::from_secs(11), "initialize answered after {answered:?}");
    writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#).unwrap();
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list"}}"#).unwrap();
    let first = next();
    let names = |list: &Value| -> Vec<String> {
        list["result"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    };
    assert!(names(&first).iter().any(|n| n == "fs__grep"), "{first}");
    assert!(!names(&first).iter().any(|n| n.starts_with("everything__")), "{first}");
    // The slow server comes up: clients are told, and it is listed.
    let changed = loop {
        let message = next();
        if message["method"] == "notifications/tools/list_changed" {
            break message;
        }
    };
    assert!(changed.get("id").is_none());
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":3,"method":"tools/list"}}"#).unwrap();
    let second = loop {
        let message = next();
        if message["id"] == 3 {
            break message;
        }
    };
    assert!(names(&second).iter().any(|n| n == "everything__echo"), "{second}");
    drop(stdin);
    let _ = child.wait();
}

/// `serve --watch` reads the configuration again only as a regular file: a FIFO put in its
/// place is reported (the previous configuration still served) and a file put back is
/// loaded, where the watcher waited in `open()` for a writer for ever and never reloaded
/// again.
#[test]
fn watch_reports_a_fifo_in_place_of_the_configuration_and_goes_on() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\n");
    let mut gateway = Followed::of(serve_http_with(&project, &["--watch"]));
    let config = project.path().join("toolmux.yaml");
    std::fs::remove_file(&config).expect("removed");
    fifo(project.path(), "toolmux.yaml");
    gateway.wait_for(
        "toolmux.yaml: it is a FIFO (named pipe), not a regular file: give the path of a \
         configuration file; still serving the previous configuration",
    );
    std::fs::remove_file(&config).expect("removed");
    project.file("toolmux.yaml", "fs: {permissions: [read, write]}\n");
    gateway.wait_for("toolmux: reloaded");
    let (code, stderr) = gateway.stop();
    assert_eq!(code, 0, "{stderr}");
}

/// `serve --watch` reloads a configuration changed while its servers start: the files are
/// looked at as they are loaded, where the watcher first looked only once serving and took
/// the changed file for the one served, never to reload it.
#[test]
fn watch_reloads_a_change_made_while_the_servers_start() {
    let project = Project::new();
    // A server that says nothing for 2 s, then ends: the start waits for it.
    let slow = "fs: {}\nmcpServers:\n  slow: {command: sh, args: [-c, 'sleep 2']}\n";
    project.file("toolmux.yaml", slow);
    let config = project.path().join("toolmux.yaml");
    let changer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        std::fs::write(&config, "fs: {permissions: [read, write]}\n").expect("written");
    });
    let mut gateway = Followed::of(serve_http_with(&project, &["--watch"]));
    changer.join().expect("changed");
    gateway.wait_for("toolmux: reloaded");
    let (code, stderr) = gateway.stop();
    assert_eq!(code, 0, "{stderr}");
}

/// A gateway whose stderr is read as it comes, for tests that wait for what it says (a
/// reload); killed should the test fail before it is stopped.
struct Followed {
    child: Option<std::process::Child>,
    lines: std::sync::mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// Everything read so far.
    seen: String,
    url: String,
}

impl Followed {
    fn of(gateway: HttpGateway) -> Followed {
        let HttpGateway { child, stderr, url } = gateway;
        let (sender, lines) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut stderr = stderr;
            let mut line = String::new();
            while stderr.read_line(&mut line).unwrap_or(0) > 0 {
                // The test may have stopped listening.
                let _ = sender.send(std::mem::take(&mut line));
            }
        });
        Followed { child: Some(child), lines, reader: Some(reader), seen: String::new(), url }
    }

    /// Waits (30 s at most) until stderr has said `text`; what it said after the previous
    /// wait.
    fn wait_for(&mut self, text: &str) -> String {
        self.wait_for_any(&[text])
    }

    /// Waits (30 s at most) until stderr has said one of `texts`; what it said after the
    /// previous wait.
    fn wait_for_any(&mut self, texts: &[&str]) -> String {
        let from = self.seen.len();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !texts.iter().any(|text| self.seen[from..].contains(text)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push_str(&line),
                Err(_) => panic!("none of {texts:?} within 30 s; stderr:\n{}", self.seen),
            }
        }
        self.seen[from..].to_owned()
    }

    /// SIGTERM, then the exit code and all of stderr.
    fn stop(mut self) -> (i32, String) {
        let mut child = self.child.take().expect("running");
        crate::send_signal(&child, "TERM");
        let Some(status) = crate::exit_within(&mut child, Duration::from_secs(30)) else {
            panic!("toolmux serve did not stop within 30 s; stderr:\n{}", self.seen);
        };
        if let Some(reader) = self.reader.take() {
            reader.join().expect("stderr reader");
        }
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push_str(&line);
        }
        (status.code().unwrap_or(-1), std::mem::take(&mut self.seen))
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `serve --http --watch` refuses a file whose `serve.oauth` is not the one it started
/// with, keeping the previous configuration: the token verifier is made only at the start,
/// so a file going from `serve.apiKeys` to `serve.oauth` was taken, emptied the accepted
/// keys, and let every request in without credentials.
#[test]
fn watch_refuses_a_change_of_serve_oauth() {
    let project = Project::new().env("CI_KEY", KEY);
    project.file("toolmux.yaml", "fs: {}\nserve:\n  apiKeys:\n    ci: ${CI_KEY}\n");
    let mut gateway = Followed::of(serve_http_with(&project, &["--watch"]));
    assert_eq!(raw_post(&gateway.url, None).0, 401);
    project.file(
        "toolmux.yaml",
        "fs: {}\nserve:\n  oauth:\n    issuer: http://127.0.0.1:9/issuer\n    \
         resource: http://127.0.0.1:9/mcp\n",
    );
    let said =
        gateway.wait_for_any(&["still serving the previous configuration", "toolmux: reloaded"]);
    let (status, response) = raw_post(&gateway.url, None);
    assert_eq!(status, 401, "no credentials, still refused: {response}\n{said}");
    assert!(
        said.contains("serve.oauth") && said.contains("restart toolmux serve"),
        "says why and what to do: {said}"
    );
    let (status, response) = raw_post(&gateway.url, Some(&format!("Bearer {KEY}")));
    assert_eq!(status, 200, "the key it started with still works: {response}");
    // A file that leaves serve.oauth as it was is taken.
    project.file("toolmux.yaml", "fs: {}\nserve:\n  apiKeys:\n    ci: ${CI_KEY}\n# again\n");
    gateway.wait_for("toolmux: reloaded");
    let (code, stderr) = gateway.stop();
    assert_eq!(code, 0, "{stderr}");
}

/// A secret that only a reloaded configuration holds is cut from what the gateway prints:
/// here a server added by the reload prints its `env` token on stderr and exits, and both
/// the log's line of its stderr (`-vv`) and the warning quoting it say `[redacted]`. The
/// log's redactor was made once, from the first file, and let the token through.
#[test]
fn watch_redacts_the_secrets_of_a_reloaded_configuration() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\n");
    project
        .file("bad-server.sh", "#!/bin/sh\necho \"bad-server says: token $TOKEN\" >&2\nexit 2\n");
    let script = project.path().join("bad-server.sh");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let mut gateway = Followed::of(serve_http_with(&project, &["--watch", "-vv"]));
    project.file(
        "toolmux.yaml",
        "fs: {}\nmcpServers:\n  bad:\n    command: ./bad-server.sh\n    env:\n      \
         TOKEN: tok-reloaded-5e4d3c2b1a\n",
    );
    gateway.wait_for("provider `bad` failed to start");
    let (code, stderr) = gateway.stop();
    assert_eq!(code, 0, "{stderr}");
    let logged =
        stderr.lines().filter(|l| l.contains("stderr: bad-server says")).collect::<Vec<_>>();
    assert!(!logged.is_empty(), "the log has the server's stderr: {stderr}");
    assert!(!stderr.contains("tok-reloaded-5e4d3c2b1a"), "the env value is a secret: {logged:?}");
    assert!(logged.iter().all(|l| l.contains("token [redacted]")), "{logged:?}");
}
