//! Agents through the real binary: `toolmux agent run` against a scripted model server on
//! loopback (OpenAI and Anthropic dialects), the builtin file tools as the agent's tools,
//! agents as tools of `tools call`, and what goes wrong told plainly.

use crate::Project;
use serde_json::{Value, json};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolmux_test_support::blocking::fifo;
use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};

const KEY: &str = "sk-test-4f9d2c7e1b";

fn project(server: &ScriptedLlmServer, api: &str, extra: &str) -> Project {
    let project = Project::new().env("LLM_KEY", KEY);
    project.file("notes.md", "TODO: write the agent docs\n").file(
        "toolmux.yaml",
        &format!(
            "fs: {{}}\n\
             models:\n  fast:\n    type: {api}\n    model: test-model\n    baseUrl: {}\n    apiKey: ${{LLM_KEY}}\n    maxRetries: 0\n\
             agents:\n  reader:\n    model: fast\n    description: Reads the project\n    instructions: You read files to answer.\n    tools: ['fs__*']\n{extra}",
            server.base_url()
        ),
    );
    project
}

/// The text of the last tool result in an OpenAI request.
fn last_tool_result(request: &Value) -> String {
    let messages = request["messages"].as_array().expect("messages");
    let last = messages.last().expect("a message");
    assert_eq!(last["role"], "tool", "{request}");
    last["content"].as_str().expect("text").to_owned()
}

#[test]
fn an_agent_greps_the_project_and_reports() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("fs__grep", json!({"pattern": "TODO", "output_mode": "content"})),
            ScriptStep::callback(|request| {
                let found = last_tool_result(request);
                ScriptStep::tool_call(
                    "agent__final_report",
                    json!({"status": "success", "content": format!("found: {}", found.trim())}),
                )
            }),
        ],
    );
    let project = project(&server, "openai", "");
    let run = project.run(&["agent", "run", "reader", "Where are the TODOs?", "--json"]);
    let out = run.ok();
    let report: Value = serde_json::from_str(out).expect("a JSON report");
    assert_eq!(report["status"], "success", "{report}");
    assert_eq!(report["agent"], "reader");
    let content = report["content"].as_str().unwrap();
    assert!(content.contains("notes.md") && content.contains("write the agent docs"), "{content}");
    assert_eq!((report["turns"].as_u64(), report["toolCalls"].as_u64()), (Some(2), Some(1)));
    assert!(report["usage"]["inputTokens"].as_u64().unwrap() > 0);

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(first["model"], "test-model");
    // The agent's instructions, then what the providers of its tools say about them.
    assert_eq!(first["messages"][0]["role"], "system");
    let system = first["messages"][0]["content"].as_str().expect("a system prompt");
    assert!(
        system.starts_with(
            "You read files to answer.\n\n# What the providers of your tools say about them\n\n\
             ## fs\nFile tools work beneath the workspace root"
        ),
        "{system}"
    );
    assert_eq!(first["messages"][1], json!({"role": "user", "content": "Where are the TODOs?"}));
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(tools.contains(&"fs__grep") && tools.contains(&"fs__read"), "{tools:?}");
    assert!(tools.contains(&"agent__final_report"), "{tools:?}");
    assert!(!tools.iter().any(|t| t.starts_with("agent__reader")), "{tools:?}");
    let headers = server.request_headers();
    assert_eq!(
        headers[0].get("authorization").map(String::as_str),
        Some(&*format!("Bearer {KEY}"))
    );
    for text in [&run.stdout, &run.stderr] {
        assert!(!text.contains(KEY), "the key leaked: {text}");
    }
}

#[test]
fn the_report_is_printed_for_people_with_a_summary() {
    let server =
        ScriptedLlmServer::start(Dialect::Anthropic, vec![ScriptStep::text("Nothing to do.")]);
    let project = project(&server, "anthropic", "");
    let run = project.run(&["agent", "run", "reader", "Anything?"]);
    assert_eq!(run.ok().trim(), "Nothing to do.");
    assert!(
        run.stderr.contains("agent `reader`: success in 1 turn, 0 tool calls"),
        "{}",
        run.stderr
    );
    let request = &server.requests()[0];
    let system = request["system"][0]["text"].as_str().expect("a system prompt");
    assert!(system.starts_with("You read files to answer.\n\n# What the providers"), "{system}");
    assert_eq!(request["system"][0]["cache_control"]["type"], "ephemeral");
    assert_eq!(server.request_headers()[0].get("x-api-key").map(String::as_str), Some(KEY));
}

#[test]
fn the_summary_counts_refused_calls_apart_from_the_calls_made() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("fs__no_such_tool", json!({})),
            ScriptStep::tool_call("fs__ls", json!({})),
            ScriptStep::text("Done."),
        ],
    );
    let project = project(&server, "openai", "");
    let run = project.run(&["agent", "run", "reader", "Look around."]);
    assert_eq!(run.ok().trim(), "Done.");
    assert!(
        run.stderr.contains("agent `reader`: success in 3 turns, 1 tool call (1 refused), "),
        "{}",
        run.stderr
    );
}

#[test]
fn the_task_can_come_from_stdin() {
    use std::io::Write as _;
    use std::process::Stdio;
    let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![ScriptStep::text("ok")]);
    let project = project(&server, "openai", "");
    let mut child = project
        .command(&["agent", "run", "reader"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmux starts");
    child.stdin.take().unwrap().write_all(b"a task from a pipe\n").unwrap();
    let run = crate::wait(child, Duration::from_secs(60));
    assert_eq!(run.ok().trim(), "ok");
    assert_eq!(server.requests()[0]["messages"][1]["content"], "a task from a pipe\n");
}

#[test]
fn agents_are_tools_too() {
    let server = ScriptedLlmServer::start(
        Dialect::Anthropic,
        vec![ScriptStep::tool_call(
            "agent__final_report",
            json!({"status": "success", "content": "the notes have one TODO"}),
        )],
    );
    let project = project(&server, "anthropic", "");
    let listed = project.run(&["tools", "list", "--json"]);
    let tools: Value = serde_json::from_str(listed.ok()).unwrap();
    let agent = tools.as_array().unwrap().iter().find(|t| t["name"] == "agent__reader");
    let agent = agent.unwrap_or_else(|| panic!("agent__reader is listed: {tools}"));
    assert!(agent["description"].as_str().unwrap().starts_with("Reads the project"), "{agent}");

    let run = project.run(&["tools", "call", "agent__reader", r#"{"prompt": "count the TODOs"}"#]);
    assert_eq!(run.ok().trim(), "the notes have one TODO");
    // An agent's turns go on, so its requests carry prompt cache breakpoints.
    let request = &server.requests()[0];
    let task = json!({"type": "text", "text": "count the TODOs",
                      "cache_control": {"type": "ephemeral"}});
    assert_eq!(request["messages"][0], json!({"role": "user", "content": [task]}));
}

#[test]
fn a_model_that_refuses_the_key_fails_the_run_without_showing_it() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![ScriptStep::status(401, r#"{"error": {"message": "Incorrect API key provided"}}"#)],
    );
    let project = project(&server, "openai", "");
    let run = project.run(&["agent", "run", "reader", "hello"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.contains("the API refused the credentials (HTTP 401)"), "{run:?}");
    assert!(run.stdout.contains("Incorrect API key provided"), "{run:?}");
    assert!(run.stderr.contains("agent `reader`: failure in 1 turn"), "{run:?}");
    for text in [&run.stdout, &run.stderr] {
        assert!(!text.contains(KEY), "the key leaked: {text}");
    }
}

#[test]
fn mistakes_are_named() {
    let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![]);
    let project = project(&server, "openai", "");
    let run = project.run(&["agent", "run", "writer", "hello"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("unknown agent `writer`; configured: reader"), "{run:?}");

    let project = project_with_agent(&server, "  other:\n    model: slow\n");
    let run = project.run(&["agent", "run", "reader", "hello"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("agents.other: model `slow` is not configured; models: fast"),
        "{run:?}"
    );

    let project = project_with_agent(&server, "router:\n  destinations: [nobody]\n");
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("destination `nobody` is not an agent"), "{run:?}");
    assert!(server.requests().is_empty(), "nothing was asked of the model");
}

fn project_with_agent(server: &ScriptedLlmServer, extra: &str) -> Project {
    project(server, "openai", extra)
}

#[test]
fn agents_are_listed() {
    let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![]);
    let project = project(&server, "openai", "  helper:\n    model: fast\n    agents: [reader]\n");
    let run = project.run(&["agent", "list"]);
    let out = run.ok();
    assert!(out.contains("reader  fast  tools fs__*  Reads the project"), "{out}");
    assert!(out.contains("helper  fast  tools *  agents reader"), "{out}");
    let json: Value = serde_json::from_str(project.run(&["agent", "list", "--json"]).ok()).unwrap();
    assert_eq!(json[1]["name"], "reader");
}

/// A `toolmux serve --stdio` session of a raw MCP client, initialized with `capabilities`.
pub(crate) struct Served {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Served {
    pub(crate) fn start(project: &Project, capabilities: Value) -> Served {
        use std::io::{BufRead as _, BufReader};
        use std::process::Stdio;
        let mut child = project
            .command(&["serve", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("toolmux serve starts");
        let stdin = child.stdin.take();
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut served = Served { child, stdin, lines };
        served.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": capabilities,
            "clientInfo": {"name": "t", "version": "1"}}}));
        served.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        served
    }

    pub(crate) fn send(&mut self, message: Value) {
        use std::io::Write as _;
        let stdin = self.stdin.as_mut().expect("open until the session ends");
        writeln!(stdin, "{message}").expect("the server reads its input");
    }

    /// The next message from the server, within 60 s.
    pub(crate) fn next(&self) -> Value {
        let line = self.lines.recv_timeout(Duration::from_secs(60)).expect("a message");
        serde_json::from_str(&line).expect("a JSON line")
    }

    /// Closes stdin: end of input ends the server, within 30 s.
    pub(crate) fn end(mut self) {
        drop(self.stdin.take());
        let ended = crate::exit_within(&mut self.child, Duration::from_secs(30));
        assert!(ended.is_some(), "toolmux serve did not exit");
    }
}

#[test]
fn mcp_clients_call_agents_through_the_gateway_with_progress() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("fs__ls", json!({})),
            ScriptStep::tool_call(
                "agent__final_report",
                json!({"status": "success", "content": "one file: notes.md"}),
            ),
        ],
    );
    let project = project(&server, "openai", "");
    let mut served = Served::start(&project, json!({}));
    served.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "agent__reader", "arguments": {"prompt": "list the files"},
        "_meta": {"progressToken": "p1"}}}));
    let mut progress = Vec::new();
    let answer = loop {
        let message = served.next();
        if message["method"] == "notifications/progress" {
            progress.push(message["params"]["message"].as_str().unwrap_or_default().to_owned());
        } else if message["id"] == 2 {
            break message;
        }
    };
    served.end();
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    assert_eq!(answer["result"]["content"][0]["text"], "one file: notes.md", "{answer}");
    assert!(progress.iter().any(|m| m == "reader: turn 1: fs__ls"), "{progress:?}");
    let listing = last_tool_result(&server.requests()[1]);
    assert!(listing.contains("notes.md"), "{listing}");
}

/// A client that takes MCP tasks gets an agent's run as a task: it polls `tasks/get`, sees
/// the run's turns as the status message, and reads the report inlined at the end.
#[test]
fn an_mcp_client_that_takes_tasks_polls_an_agent_run() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("fs__ls", json!({})),
            ScriptStep::delay(
                Duration::from_millis(600),
                ScriptStep::tool_call(
                    "agent__final_report",
                    json!({"status": "success", "content": "one file: notes.md"}),
                ),
            ),
        ],
    );
    let project = project(&server, "openai", "");
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let mut served = Served::start(&project, tasks);
    let answer = |served: &mut Served, id: u64| loop {
        let message = served.next();
        if message["id"] == id {
            break message;
        }
    };
    served.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "agent__reader", "arguments": {"prompt": "list the files"}}}));
    let created = answer(&mut served, 2)["result"].clone();
    assert_eq!(created["resultType"], "task", "{created}");
    let task = created["taskId"].clone();
    let mut statuses = Vec::new();
    let mut id = 10;
    let done = loop {
        served.send(json!({"jsonrpc": "2.0", "id": id, "method": "tasks/get",
                           "params": {"taskId": task}}));
        let got = answer(&mut served, id)["result"].clone();
        id += 1;
        if let Some(status) = got["statusMessage"].as_str() {
            statuses.push(status.to_owned());
        }
        if got["status"] != "working" {
            break got;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    served.end();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["content"][0]["text"], "one file: notes.md", "{done}");
    assert!(statuses.iter().any(|s| s.contains("reader: turn")), "{statuses:?}");
}

#[test]
fn an_agent_answers_server_everythings_sampling_request_with_its_model() {
    let node = crate::peer("node/node_modules/.bin/node");
    let everything =
        crate::peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call(
                "everything__trigger-sampling-request",
                json!({"prompt": "name a colour", "maxTokens": 20}),
            ),
            // server-everything's sampling request, answered by the agent's model.
            ScriptStep::text("teal"),
            ScriptStep::callback(|request| {
                ScriptStep::text(format!("the server got: {}", last_tool_result(request)))
            }),
        ],
    );
    let extra = format!(
        "  sampler:\n    model: fast\n    tools: ['everything__*']\n\
         mcpServers:\n  everything:\n    command: {}\n    args: [{}, stdio]\n",
        node.display(),
        everything.display()
    );
    let project = project(&server, "openai", &extra);
    let run = project.run(&["agent", "run", "sampler", "make the server sample", "--json"]);
    let report: Value = serde_json::from_str(run.ok()).expect("a JSON report");
    assert_eq!(report["status"], "success", "{report}");
    let content = report["content"].as_str().unwrap();
    assert!(content.contains("teal") && content.contains("LLM sampling result"), "{content}");
    let sampling = &server.requests()[1];
    assert_eq!(sampling["messages"][0]["content"], "You are a helpful test server.");
    let asked = sampling["messages"][1]["content"].as_str().unwrap();
    assert!(asked.ends_with("name a colour"), "{asked}");
    assert_eq!(sampling["max_tokens"], 20);
    assert!(sampling.get("tools").is_none(), "{sampling}");
}

#[test]
fn an_agents_question_reaches_the_mcp_client_as_an_elicitation() {
    let server = ScriptedLlmServer::start(
        Dialect::Anthropic,
        vec![
            ScriptStep::tool_call("agent__ask_user", json!({"question": "Which file?"})),
            ScriptStep::callback(|request| {
                let messages = request["messages"].as_array().unwrap();
                let blocks = messages.last().unwrap()["content"].as_array().unwrap();
                let answer = blocks[0]["content"].as_str().unwrap_or_default().to_owned();
                ScriptStep::text(format!("you chose {answer}"))
            }),
        ],
    );
    let project = project(&server, "anthropic", "    askUser: true\n");
    let mut served = Served::start(&project, json!({"elicitation": {}}));
    served.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "agent__reader", "arguments": {"prompt": "open a file"}}}));
    let mut asked = None;
    let answer = loop {
        let message = served.next();
        if message["method"] == "elicitation/create" {
            asked = Some(message["params"]["message"].clone());
            served.send(json!({"jsonrpc": "2.0", "id": message["id"], "result": {
                "action": "accept", "content": {"answer": "notes.md"}}}));
        } else if message["id"] == 2 {
            break message;
        }
    };
    served.end();
    assert_eq!(asked, Some(json!("Which file?")));
    assert_eq!(answer["result"]["content"][0]["text"], "you chose notes.md", "{answer}");
}

#[test]
fn at_a_terminal_the_text_streams_and_each_turn_is_shown_as_it_starts() {
    use std::process::{Command, Stdio};
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::TextAndToolCalls(
                "Let me list them.".into(),
                vec![("fs__ls".into(), json!({}))],
            ),
            ScriptStep::text("There is one file, notes.md, with a TODO."),
        ],
    );
    let project = project(&server, "openai", "");
    // `script` gives the binary a terminal for stdin, stdout and stderr.
    let line = format!("{} agent run reader 'list the files'", crate::toolmux_bin());
    let child = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(project.path())
        .env_remove("TOOLMUX_CONFIG")
        .env_remove("RUST_LOG")
        .env("TMPDIR", project.path().join("tmp"))
        .env("LLM_KEY", KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    let run = crate::wait(child, Duration::from_secs(60));
    let out = run.ok().replace('\r', "");
    // The text as the model wrote it, each turn's calls on a line of their own after it.
    assert!(out.contains("Let me list them.\n· reader: turn 1: fs__ls\n"), "{out}");
    // The answer, read as it streamed, is not printed a second time.
    assert_eq!(out.matches("There is one file, notes.md, with a TODO.").count(), 1, "{out}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|r| r["stream"] == json!(true)), "{requests:#?}");

    // From a pipe nothing streams, and the answer is printed whole.
    let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![ScriptStep::text("done")]);
    let piped = self::project(&server, "openai", "");
    let run = piped.run(&["agent", "run", "reader", "list the files"]);
    assert_eq!(run.ok().trim(), "done");
    assert!(only(&server.requests()).get("stream").is_none());
}

fn only(requests: &[Value]) -> &Value {
    assert_eq!(requests.len(), 1, "{requests:#?}");
    &requests[0]
}

#[test]
fn a_sampling_model_answers_tools_when_the_caller_cannot() {
    let node = crate::peer("node/node_modules/.bin/node");
    let everything =
        crate::peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let server = ScriptedLlmServer::start(Dialect::Anthropic, vec![ScriptStep::text("teal")]);
    let extra = format!(
        "defaults:\n  samplingModel: fast\n\
         mcpServers:\n  everything:\n    command: {}\n    args: [{}, stdio]\n",
        node.display(),
        everything.display()
    );
    let project = project(&server, "anthropic", &extra);
    let run = project.run(&[
        "tools",
        "call",
        "everything__trigger-sampling-request",
        r#"{"prompt": "name a colour", "maxTokens": 20}"#,
    ]);
    let out = run.ok();
    assert!(out.contains("LLM sampling result") && out.contains("teal"), "{out}");
    let request = &server.requests()[0];
    assert_eq!(request["system"], "You are a helpful test server.");
    assert_eq!(request["max_tokens"], 20);

    // Without a sampling model nobody answers, and the tool says so.
    let plain = project_with_agent(
        &server,
        &extra.replace("  samplingModel: fast\n", "  toolTimeout: 20000\n"),
    );
    let run = plain.run(&[
        "tools",
        "call",
        "everything__trigger-sampling-request",
        r#"{"prompt": "name a colour"}"#,
    ]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(server.requests().len(), 1);

    let wrong =
        project_with_agent(&server, &extra.replace("samplingModel: fast", "samplingModel: slow"));
    let run = wrong.run(&["tools", "list"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains(
            "defaults.samplingModel: model `slow` is not configured under `models` (fast)"
        ),
        "{run:?}"
    );
}

/// At a terminal, a question whose call timed out stops waiting, and the next question
/// gets the next answer (a reader left behind by the first would swallow it).
#[test]
fn at_a_terminal_a_timed_out_question_does_not_swallow_the_next_answer() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("fx__confirm_delete", json!({"path": "a.txt"})),
            ScriptStep::tool_call("fs__bash", json!({"command": "echo approved-run"})),
            ScriptStep::text("done"),
        ],
    );
    let project = Project::new().env("LLM_KEY", KEY);
    project.file(
        "toolmux.yaml",
        &format!(
            "defaults: {{toolTimeout: 1500}}\n\
             fs: {{permissions: [read, execute]}}\n\
             permissions: {{ask: [fs__bash]}}\n\
             mcpServers:\n  fx: {{command: '{}', args: [stdio]}}\n\
             models:\n  fast: {{type: openai, model: test-model, baseUrl: '{}', apiKey: '${{LLM_KEY}}', maxRetries: 0}}\n\
             agents:\n  reader: {{model: fast, tools: ['fs__*', 'fx__*']}}\n",
            crate::conformance::fixture_bin().display(),
            server.base_url()
        ),
    );
    // The form's question is left unanswered until its call times out; the approval that
    // follows is answered.
    let rules = json!([["allow fs__bash", "y"]]);
    let run = project
        .run_at_terminal(&rules, &["agent", "run", "reader", "delete a.txt, then run the check"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("a tool asks:"), "{}", run.stdout);
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{}", run.stdout);
    let timed_out = last_tool_result(&requests[1]);
    assert!(timed_out.contains("timed out") || timed_out.contains("timeout"), "{timed_out}");
    assert!(last_tool_result(&requests[2]).contains("approved-run"), "{}", run.stdout);
}

/// `agent chat`: one conversation over several messages (from a pipe, a line each): each
/// run goes on from the last one's transcript, tool calls and the report that ended it
/// included.
#[test]
fn a_chat_goes_on_from_the_last_answer() {
    use std::io::Write as _;
    use std::process::Stdio;
    let server = ScriptedLlmServer::start(
        Dialect::Anthropic,
        vec![
            ScriptStep::tool_call("fs__ls", json!({})),
            ScriptStep::text("There is notes.md."),
            ScriptStep::tool_call(
                "agent__final_report",
                json!({"status": "success", "content": "It holds one TODO."}),
            ),
            ScriptStep::text("You are welcome."),
        ],
    );
    let project = project(&server, "anthropic", "");
    let mut child = project
        .command(&["agent", "chat", "reader", "Which files are there?"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmux starts");
    child.stdin.take().unwrap().write_all(b"What is in it?\n\nThanks!\n").unwrap();
    let run = crate::wait(child, Duration::from_secs(60));
    assert_eq!(
        run.ok().lines().collect::<Vec<_>>(),
        ["There is notes.md.", "It holds one TODO.", "You are welcome."]
    );
    assert!(
        run.stderr.contains("chat with `reader`: 3 messages, 4 turns, 1 tool call"),
        "{}",
        run.stderr
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    // The second message's request holds the first exchange, the listing's call included.
    let second = requests[2]["messages"].as_array().unwrap();
    let text = |m: &Value| m.to_string();
    assert!(text(&second[0]).contains("Which files are there?"), "{second:#?}");
    assert!(second.iter().any(|m| text(m).contains("\"tool_use\"") && text(m).contains("fs__ls")));
    assert!(text(&second[second.len() - 2]).contains("There is notes.md."), "{second:#?}");
    assert!(text(second.last().unwrap()).contains("What is in it?"), "{second:#?}");
    // The report that ended the second run is answered before the third message.
    let third = requests[3]["messages"].as_array().unwrap();
    let last = text(third.last().unwrap());
    assert!(last.contains("\"tool_result\"") && last.contains("Thanks!"), "{third:#?}");
}

/// `agent chat` at a terminal: a prompt for each message, the answer streamed once, an
/// empty line to end.
#[test]
fn a_chat_at_a_terminal_ends_with_an_empty_line() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![ScriptStep::text("Hello there, I read files."), ScriptStep::text("Bye now.")],
    );
    let project = project(&server, "openai", "");
    let rules = json!([["> ", "Who are you?"], ["> ", "Thanks"], ["> ", ""]]);
    let run = project.run_at_terminal(&rules, &["agent", "chat", "reader"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.stdout.matches("Hello there, I read files.").count(), 1, "{}", run.stdout);
    assert_eq!(run.stdout.matches("Bye now.").count(), 1, "{}", run.stdout);
    assert!(run.stdout.contains("chat with `reader`: 2 messages"), "{}", run.stdout);
    assert_eq!(server.requests().len(), 2);
    assert!(server.requests()[1]["messages"].to_string().contains("Who are you?"));
}

/// A model that runs each of `commands` with `fs__bash`, one per message, and a project
/// whose `ask` rules are `asks`, with the shell tools on; the server to read requests from.
fn chatting_with_bash(commands: &[&str], asks: &str) -> (ScriptedLlmServer, Project) {
    let steps = commands
        .iter()
        .flat_map(|c| {
            [ScriptStep::tool_call("fs__bash", json!({"command": c})), ScriptStep::text("Ran it.")]
        })
        .collect();
    let server = ScriptedLlmServer::start(Dialect::OpenAi, steps);
    let extra = format!("permissions: {{ask: {asks}}}\nfs: {{permissions: [read, execute]}}\n");
    let project = project(&server, "openai", &extra);
    let config = std::fs::read_to_string(project.path().join("toolmux.yaml"))
        .expect("the project's configuration");
    project.file("toolmux.yaml", &config.replacen("fs: {}\n", "", 1));
    (server, project)
}

/// Asked by a rule on calls, `a` allows what that rule asks about, not the whole tool: a
/// later `echo` runs without asking, an `ls` another rule asks about is asked.
#[test]
fn always_to_a_rule_on_calls_covers_that_rule_only() {
    let (server, project) = chatting_with_bash(
        &["echo first-run", "echo second-run", "ls"],
        "['fs__bash(echo *)', 'fs__bash(ls *)']",
    );
    let rules = json!([
        ["> ", "run the first"],
        ["always for `fs__bash(echo *)`] ", "a"],
        ["> ", "and again"],
        ["> ", "now list"],
        ["always for `fs__bash(ls *)`] ", "y"],
        ["> ", ""]
    ]);
    let run = project.run_at_terminal(&rules, &["agent", "chat", "reader"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.stdout.matches("always for `fs__bash(echo *)`]").count(), 1, "{}", run.stdout);
    assert_eq!(run.stdout.matches("always for `fs__bash(ls *)`]").count(), 1, "{}", run.stdout);
    let requests = server.requests();
    assert_eq!(requests.len(), 6, "{}", run.stdout);
    assert!(last_tool_result(&requests[3]).contains("second-run"), "{}", run.stdout);
}

/// At a terminal, `a` to an approval allows the tool for the rest of the session: a chat's
/// later messages call it without asking.
#[test]
fn a_tool_allowed_for_good_is_not_asked_for_again() {
    let (server, project) =
        chatting_with_bash(&["echo first-run", "echo second-run"], "[fs__bash]");
    let rules = json!([
        ["> ", "run the first"],
        ["always this tool] ", "a"],
        ["> ", "and again"],
        ["> ", ""]
    ]);
    let run = project.run_at_terminal(&rules, &["agent", "chat", "reader"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.stdout.matches("always this tool]").count(), 1, "{}", run.stdout);
    let requests = server.requests();
    assert_eq!(requests.len(), 4, "{}", run.stdout);
    assert!(last_tool_result(&requests[1]).contains("first-run"));
    assert!(last_tool_result(&requests[3]).contains("second-run"), "{}", run.stdout);
}

/// `p` to an approval allows the tool in the project: saved beside the configuration
/// (`.toolmux/approvals.json`), the next `toolmux` started there does not ask for it.
#[test]
fn a_tool_allowed_in_the_project_is_not_asked_for_in_the_next_process() {
    let (server, project) =
        chatting_with_bash(&["echo first-run", "echo second-run"], "[fs__bash]");
    let rules = json!([
        ["> ", "run the first"],
        ["p: in this project too, a: always this tool] ", "p"],
        ["> ", ""]
    ]);
    let run = project.run_at_terminal(&rules, &["agent", "chat", "reader"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let saved = std::fs::read_to_string(project.path().join(".toolmux/approvals.json"))
        .expect("the approvals file");
    let saved: Value = serde_json::from_str(&saved).expect("JSON");
    assert_eq!(saved, json!({"approved": ["fs__bash"]}));

    // Another process: asked nothing.
    let rules = json!([["> ", "and again"], ["> ", ""]]);
    let run = project.run_at_terminal(&rules, &["agent", "chat", "reader"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(!run.stdout.contains("allow fs__bash"), "{}", run.stdout);
    let requests = server.requests();
    assert_eq!(requests.len(), 4, "{}", run.stdout);
    assert!(last_tool_result(&requests[3]).contains("second-run"), "{}", run.stdout);
}

/// `p` to an approval when the project's approvals file is there but cannot be read (not
/// JSON, over its 1 MiB limit) allows the call for this session only, says so and leaves
/// the file as it is, where it was replaced by the one new approval, losing those it held.
#[test]
fn an_unreadable_approvals_file_is_left_as_it_is() {
    let earlier: Vec<String> = (0..60_000).map(|i| format!("fs__bash(echo {i:06} *)")).collect();
    let over_the_limit = json!({"approved": earlier}).to_string();
    assert!(over_the_limit.len() > 1024 * 1024);
    let cases = [
        ("not JSON", r#"{"approved": ["fs__grep",]}"#.to_owned(), "not a file of approvals"),
        ("over the limit", over_the_limit, "over the limit of 1 MiB"),
    ];
    for (case, contents, why) in cases {
        let (server, project) = chatting_with_bash(&["echo first-run"], "[fs__bash]");
        project.file(".toolmux/approvals.json", &contents);
        let rules = json!([
            ["> ", "run the first"],
            ["p: in this project too, a: always this tool] ", "p"],
            ["> ", ""]
        ]);
        let run = project.run_at_terminal(&rules, &["agent", "chat", "reader"]);
        assert_eq!(run.code, 0, "{case}: {}\n{}", run.stdout, run.stderr);
        let transcript = run.stdout.replace("\r\n", "\n").replace('\n', " ");
        assert!(
            transcript.contains("the approval of fs__bash is kept for this session only"),
            "{case}: {}",
            run.stdout
        );
        assert!(transcript.contains(why), "{case}: {}", run.stdout);
        let kept = std::fs::read_to_string(project.path().join(".toolmux/approvals.json"))
            .expect("the approvals file");
        assert!(
            kept == contents,
            "{case}: the file was rewritten: {}",
            &kept[..kept.len().min(200)]
        );
        assert!(last_tool_result(&server.requests()[1]).contains("first-run"), "{case}");
    }
}

/// `p` to an approval when the project's approvals file is a FIFO allows the call for this
/// session only, and says that the file, named, is not a regular file and is left as it
/// is, where the approval went to a regular file renamed over the FIFO.
#[test]
fn an_approvals_file_that_is_a_fifo_is_left_as_it_is() {
    use std::os::unix::fs::FileTypeExt as _;
    let (server, project) = chatting_with_bash(&["echo first-run"], "[fs__bash]");
    let folder = project.path().join(".toolmux");
    std::fs::create_dir_all(&folder).expect("the project's .toolmux folder");
    fifo(&folder, "approvals.json");
    let rules = json!([
        ["> ", "run the first"],
        ["p: in this project too, a: always this tool] ", "p"],
        ["> ", ""]
    ]);
    let run = project.run_at_terminal(&rules, &["agent", "chat", "reader"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let transcript = run.stdout.replace("\r\n", "\n").replace('\n', " ");
    let path = folder.join("approvals.json");
    let said = format!(
        "warning: the approval of fs__bash is kept for this session only: {} is a FIFO (named \
         pipe), not a regular file, and is left as it is",
        path.display()
    );
    assert!(transcript.contains(&said), "{}", run.stdout);
    let kind = std::fs::symlink_metadata(&path).expect("the approvals file").file_type();
    assert!(kind.is_fifo(), "the FIFO was replaced: {kind:?}");
    assert!(last_tool_result(&server.requests()[1]).contains("first-run"), "{}", run.stdout);
}

/// A model whose API takes no tools (`toolCalls: xml`): the tools are described in its
/// system prompt, it writes its calls as `<tool>` blocks in its text, and reads their
/// results in `<tool_result>` blocks, through the same pipeline as any agent's calls.
#[test]
fn a_model_without_tool_calling_calls_tools_in_its_text() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::callback(|request| {
                let system = request["messages"][0]["content"].as_str().unwrap_or_default();
                if request.get("tools").is_none() && system.contains("### fs__grep") {
                    ScriptStep::text(
                        "I will search.\n<tool>\n{\"server_name\": \"fs\", \"tool_name\": \
                         \"grep\", \"arguments\": {\"pattern\": \"TODO\", \"output_mode\": \
                         \"content\"}}\n</tool>",
                    )
                } else {
                    ScriptStep::text(format!("tools were not described: {request}"))
                }
            }),
            ScriptStep::callback(|request| {
                let messages = request["messages"].as_array().expect("messages");
                let last = messages.last().expect("a message");
                let told = last["content"].as_str().unwrap_or_default();
                let content = if last["role"] == "user"
                    && told.starts_with("<tool_result tool_name=\"fs__grep\" error=\"false\">")
                    && told.contains("write the agent docs")
                {
                    "found the TODO"
                } else {
                    "no result came back"
                };
                ScriptStep::text(format!(
                    "<tool>{{\"tool_name\": \"agent__final_report\", \"arguments\": \
                     {{\"status\": \"success\", \"content\": \"{content}\"}}}}</tool>"
                ))
            }),
        ],
    );
    let project = project(&server, "openai", "");
    let config = std::fs::read_to_string(project.path().join("toolmux.yaml")).expect("config");
    let config = config.replace("    maxRetries: 0\n", "    maxRetries: 0\n    toolCalls: xml\n");
    project.file("toolmux.yaml", &config);
    let run = project.run(&["agent", "run", "reader", "Where are the TODOs?", "--json"]);
    let report: Value = serde_json::from_str(run.ok()).expect("a report");
    assert_eq!(report["content"], "found the TODO", "{report}");
    assert_eq!(report["toolCalls"], 1);
}

/// `agent run --pause-to FILE` pauses at a call that asks instead of asking: the run is
/// saved (owner-only), its waiting call listed with how to decide it, exit code 5; `agent
/// resume FILE --approve ID`, in another process, runs the call and the run ends (the file
/// goes). Bad decisions are refused before anything runs, and the file is kept.
#[test]
fn a_paused_run_is_resumed_with_decisions_in_another_process() {
    use std::os::unix::fs::PermissionsExt as _;
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::ToolCalls(vec![
                ("fs__bash".into(), json!({"command": "echo pushed-it"})),
                ("fs__grep".into(), json!({"pattern": "TODO"})),
            ]),
            ScriptStep::callback(|request| {
                let messages = request["messages"].as_array().expect("messages");
                let results: Vec<String> = messages
                    .iter()
                    .filter(|m| m["role"] == "tool")
                    .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                    .collect();
                ScriptStep::tool_call(
                    "agent__final_report",
                    json!({"status": "success", "content": results.join(" | ")}),
                )
            }),
        ],
    );
    let extra = "permissions: {ask: ['fs__bash(echo *)']}\nfs: {permissions: [read, execute]}\n";
    let project = project(&server, "openai", extra);
    let config = std::fs::read_to_string(project.path().join("toolmux.yaml")).unwrap();
    project.file("toolmux.yaml", &config.replacen("fs: {}\n", "", 1));

    let run = project.run(&["agent", "run", "reader", "push and look", "--pause-to", "run.json"]);
    assert_eq!(run.code, 5, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("agent `reader` paused: 1 call waits for approval"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("fs__bash {\"command\":\"echo pushed-it\"}"), "{}", run.stderr);
    assert!(run.stderr.contains("toolmux agent resume run.json --approve ID"), "{}", run.stderr);
    let file = project.path().join("run.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["status"], "paused");
    let id = saved["pending"][0]["callId"].as_str().unwrap().to_owned();
    assert_eq!(server.requests().len(), 1);

    // The same file again would lose the paused run: refused.
    let again = project.run(&["agent", "run", "reader", "x", "--pause-to", "run.json"]);
    assert_eq!(again.code, 2);
    assert!(again.stderr.contains("run.json exists (a paused run?)"), "{}", again.stderr);
    // A call that does not wait, and one decided twice: refused, nothing runs.
    let wrong = project.run(&["agent", "resume", "run.json", "--approve", "nope"]);
    assert_eq!(wrong.code, 2);
    assert!(
        wrong
            .stderr
            .contains(&format!("no call `nope` waits for approval; the calls that wait: {id}")),
        "{}",
        wrong.stderr
    );
    let twice = project.run(&["agent", "resume", "run.json", "--approve", &id, "--deny", &id]);
    assert!(twice.stderr.contains("is decided twice"), "{}", twice.stderr);
    // No decision: the waiting calls are shown again.
    let shown = project.run(&["agent", "resume", "run.json"]);
    assert_eq!(shown.code, 5);
    assert!(shown.stderr.contains(&format!("  {id}  fs__bash")), "{}", shown.stderr);
    assert_eq!(server.requests().len(), 1);

    let done = project.run(&["agent", "resume", "run.json", "--approve", &id, "--json"]);
    assert_eq!(done.code, 0, "{}\n{}", done.stdout, done.stderr);
    let report: Value = serde_json::from_str(&done.stdout).unwrap();
    assert_eq!(report["status"], "success");
    let content = report["content"].as_str().unwrap();
    assert!(content.contains("pushed-it") && content.contains("notes.md"), "{content}");
    assert_eq!((report["turns"].as_u64(), report["toolCalls"].as_u64()), (Some(2), Some(2)));
    assert!(!file.exists(), "the ended run's file is removed");
    assert!(report.get("transcript").is_none());
}

/// A resumption killed after it ran the approved call leaves a file that never runs the
/// call again: approving it again is refused, and resuming without deciding it tells the
/// agent that it may or may not have run (it ran twice once, appending twice).
#[test]
fn an_interrupted_resume_never_runs_an_approved_call_twice() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("fs__bash", json!({"command": "echo ran >> counter.txt"})),
            ScriptStep::delay(Duration::from_secs(60), ScriptStep::text("too late")),
        ],
    );
    let extra =
        "permissions: {ask: ['fs__bash(echo *)']}\nfs: {permissions: [read, write, execute]}\n";
    let project = project(&server, "openai", extra);
    let config = std::fs::read_to_string(project.path().join("toolmux.yaml")).unwrap();
    project.file("toolmux.yaml", &config.replacen("fs: {}\n", "", 1));
    let run = project.run(&["agent", "run", "reader", "count", "--pause-to", "run.json"]);
    assert_eq!(run.code, 5, "{}", run.stderr);
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(project.path().join("run.json")).unwrap())
            .unwrap();
    let id = saved["pending"][0]["callId"].as_str().unwrap().to_owned();

    // The resumption runs the call, then waits on the model: killed there.
    let mut resume = project.command(&["agent", "resume", "run.json", "--approve", &id]);
    resume.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = resume.spawn().expect("toolmux starts");
    let counter = project.path().join("counter.txt");
    let deadline = Instant::now() + Duration::from_secs(60);
    // Killed once the call ran and the model was asked again (its answer never comes).
    while std::fs::read_to_string(&counter).unwrap_or_default() != "ran\n"
        || server.requests().len() < 2
    {
        assert!(Instant::now() < deadline, "the approved call never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("killed");
    child.wait().expect("reaped");

    let again = project.run(&["agent", "resume", "run.json", "--approve", &id]);
    assert_eq!(again.code, 2, "{}", again.stderr);
    assert!(again.stderr.contains("was approved and started by an earlier"), "{}", again.stderr);
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "ran\n");

    server.push_steps([ScriptStep::callback(|request| {
        let told = request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
            .join(" ");
        ScriptStep::tool_call("agent__final_report", json!({"status": "success", "content": told}))
    })]);
    let done = project.run(&["agent", "resume", "run.json", "--json"]);
    assert_eq!(done.code, 0, "{}", done.stderr);
    let report: Value = serde_json::from_str(&done.stdout).unwrap();
    let content = report["content"].as_str().unwrap();
    assert!(content.contains("whether it took effect is unknown"), "{content}");
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "ran\n");
}

/// The agent's question with nobody to ask pauses a run started with `--pause-to`, and
/// `agent resume --respond ID=TEXT` answers it; `--approve all` leaves questions alone.
#[test]
fn a_paused_question_is_answered_on_resume() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("agent__ask_user", json!({"question": "Which file?"})),
            ScriptStep::callback(|request| {
                let answer = last_tool_result(request);
                ScriptStep::text(format!("reading {answer}"))
            }),
        ],
    );
    let project = project(&server, "openai", "    askUser: true\n");
    let run = project.run(&["agent", "run", "reader", "read it", "--pause-to", "q.json"]);
    assert_eq!(run.code, 5, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("paused: 1 call waits for an answer"), "{}", run.stderr);
    assert!(run.stderr.contains("the agent asks: Which file?"), "{}", run.stderr);
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(project.path().join("q.json")).unwrap())
            .unwrap();
    let id = saved["pending"][0]["callId"].as_str().unwrap().to_owned();
    assert!(run.stderr.contains(&format!("answer with --respond {id}=TEXT")), "{}", run.stderr);

    let all = project.run(&["agent", "resume", "q.json", "--approve", "all"]);
    assert_eq!(all.code, 5, "nothing to approve: still waiting: {}", all.stderr);
    let wrong = project.run(&["agent", "resume", "q.json", "--approve", &id]);
    assert!(
        wrong.stderr.contains("is the agent's question, not a call to approve"),
        "{}",
        wrong.stderr
    );

    let answered = format!("{id}=notes.md");
    let done = project.run(&["agent", "resume", "q.json", "--respond", &answered]);
    assert_eq!(done.code, 0, "{}\n{}", done.stdout, done.stderr);
    assert_eq!(done.stdout.trim(), "reading notes.md");
}

/// An agent that cannot run as configured (no model of its own, and no caller whose model
/// it would use) is a configuration error: exit 2.
#[test]
fn an_agent_without_a_model_is_a_configuration_error() {
    let project = Project::new();
    project.file(
        "toolmux.yaml",
        "models:\n  m: {type: openai, model: x, baseUrl: 'http://127.0.0.1:9/v1'}\nagents:\n  boss: {model: m, agents: [helper]}\n  helper: {description: helps}\n",
    );
    let run = project.run(&["agent", "run", "helper", "hi"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("agents.helper: it names no `model`"), "{}", run.stderr);
}

/// A chat whose last message failed (its model refused) exits 1, saying why: a program
/// piping messages in learns it.
#[test]
fn a_chat_whose_last_reply_failed_exits_1() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![ScriptStep::text("hello"), ScriptStep::status(400, "bad request: no such model")],
    );
    let project = project(&server, "openai", "");
    let mut command = project.command(&["agent", "chat", "reader"]);
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().expect("toolmux starts");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        writeln!(stdin, "hi\nand now?").expect("write");
    }
    let run = crate::wait(child, Duration::from_secs(60));
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("hello"), "{}", run.stdout);
    assert!(run.stdout.contains("no such model"), "{}", run.stdout);
    assert!(run.stderr.contains("agent `reader`: failure"), "{}", run.stderr);
}

/// What a model wrote (read, say, from a file the agent was given) acts on no terminal:
/// escape sequences that would retitle it, clear it or write to the clipboard, and a tool
/// name with a NUL and a colour, are shown as escapes at a terminal; a pipe gets the bytes.
#[test]
fn at_a_terminal_escape_sequences_from_the_model_are_shown_not_acted_on() {
    let hostile = "Title\x1b]0;pwned\x07 clear\x1b[2J clip\x1b]52;c;aGVsbG8=\x07 back\rover";
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::TextAndToolCalls(
                hostile.into(),
                vec![("fs__\u{0}\x1b[31mred".into(), json!({}))],
            ),
            ScriptStep::text(hostile),
        ],
    );
    let project = project(&server, "openai", "");
    let run = project.run_at_terminal(&json!([]), &["agent", "run", "reader", "look"]);
    let out = run.stdout.replace("\r\n", "\n");
    assert!(!out.contains('\x1b') && !out.contains('\x07') && !out.contains('\0'), "{out:?}");
    assert!(out.contains("Title\\x1b]0;pwned\\x07 clear\\x1b[2J clip\\x1b]52;c;aGVsbG8=\\x07"));
    assert!(out.contains("back\\x0dover"), "{out:?}");
    assert!(out.contains("turn 1: fs__\\x00\\x1b[31mred"), "{out:?}");

    // A program reading a pipe gets what the model wrote, as it wrote it.
    let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![ScriptStep::text(hostile)]);
    let piped = self::project(&server, "openai", "");
    let run = piped.run(&["agent", "run", "reader", "look"]);
    assert_eq!(run.ok().trim_end(), hostile);
}

/// Ctrl-C while the answer streams ends its line before saying the run was interrupted.
#[test]
fn ctrl_c_during_a_streamed_answer_ends_its_line_first() {
    let never = Arc::new(tokio::sync::Notify::new());
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![ScriptStep::Held(never, Box::new(ScriptStep::text("Halfway through the answer")))],
    );
    let project = project(&server, "openai", "");
    let run = project
        .run_at_terminal(&json!([["Halfway ", "<SIGINT>"]]), &["agent", "run", "reader", "look"]);
    assert_eq!(run.code, 130, "{}\n{}", run.stdout, run.stderr);
    let out = run.stdout.replace("\r\n", "\n");
    assert!(out.contains("Halfway \ninterrupted\n"), "{out:?}");
}

/// `agent run --json` stopped by a signal still answers its program with one JSON
/// document: the report so far, status `interrupted`, and the exit code it ends with.
#[test]
fn an_interrupted_json_run_prints_its_report_so_far() {
    for (signal, code) in [("INT", 130), ("TERM", 143)] {
        let server = ScriptedLlmServer::start(
            Dialect::OpenAi,
            vec![ScriptStep::delay(Duration::from_secs(60), ScriptStep::text("too late"))],
        );
        let project = project(&server, "openai", "");
        let command = project.command(&["agent", "run", "reader", "look", "--json"]);
        let asked = || !server.requests().is_empty();
        let run = crate::start_and_signal(command, "the model was asked", asked, signal);
        assert_eq!(run.code, code, "{}", run.stderr);
        let report: Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", run.stdout, run.stderr));
        assert_eq!(report["status"], "interrupted", "{report}");
        assert_eq!(report["exitCode"], code, "{report}");
        assert_eq!(report["agent"], "reader", "{report}");
        assert_eq!(report["turns"], 1, "{report}");
    }
}

/// At a terminal a wait the model API asked for (`Retry-After`) is shown as it starts,
/// where nothing was and a long one looked like a hang.
#[test]
fn at_a_terminal_a_rate_limited_wait_is_shown() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::Status {
                status: 429,
                body: r#"{"error": {"message": "slow down"}}"#.into(),
                retry_after: Some("2".into()),
            },
            ScriptStep::text("done after the wait"),
        ],
    );
    let project = project(&server, "openai", "");
    let config = std::fs::read_to_string(project.path().join("toolmux.yaml")).unwrap();
    project.file("toolmux.yaml", &config.replace("maxRetries: 0", "maxRetries: 1"));
    let run = project.run_at_terminal(&json!([]), &["agent", "run", "reader", "look"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let out = run.stdout.replace("\r\n", "\n");
    assert!(out.contains("· waiting 2s for the model API (rate limited)\n"), "{out:?}");
    assert!(out.contains("done after the wait"), "{out:?}");
    assert_eq!(server.requests().len(), 2);
}

/// `agent resume` of a FIFO or a device is refused at once, saying what the path is: a
/// FIFO no one writes to held `toolmux` in `open()` for ever, deaf to Ctrl-C, and
/// `/dev/zero` was read until memory ran out.
#[test]
fn a_paused_run_that_is_no_regular_file_is_refused_at_once() {
    let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![]);
    let project = project(&server, "openai", "");
    fifo(project.path(), "run.json");
    for (file, what) in [("run.json", "a FIFO (named pipe)"), ("/dev/zero", "a character device")] {
        let mut command = project.command(&["agent", "resume", file]);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let run = crate::wait(command.spawn().expect("spawn toolmux"), Duration::from_secs(20));
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert_eq!(
            run.stderr.trim_end(),
            format!(
                "error: cannot read the paused run {file}: it is {what}, not a regular file: \
                 give the path of a paused run (agent run --pause-to)"
            )
        );
    }
    assert!(server.requests().is_empty());
}

/// A task piped to `agent run` is read up to 16 MiB: `/dev/zero` on stdin is refused
/// saying so, where it was read until memory ran out. (Not run against the old code, which
/// would have exhausted the machine's memory.)
#[test]
fn a_task_on_stdin_is_read_up_to_a_limit() {
    let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![]);
    let project = project(&server, "openai", "");
    let mut command = project.command(&["agent", "run", "reader"]);
    let zero = std::fs::File::open("/dev/zero").expect("/dev/zero");
    command.stdin(zero).stdout(Stdio::piped()).stderr(Stdio::piped());
    let run = crate::wait(command.spawn().expect("spawn toolmux"), Duration::from_secs(60));
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(
        run.stderr.trim_end(),
        "error: cannot read the task from stdin: it is over the limit of 16 MiB for a task: one \
         that big is likely a mistake (a wrong path, or generated data)"
    );
    assert!(server.requests().is_empty());
}

/// With `--json`, an agent command's refusals are one JSON object on stdout (`ok: false`,
/// `error`, `exitCode`), as every command's errors are under `--json`: stdout was empty.
#[test]
fn agent_errors_under_json_are_one_json_object() {
    let project = Project::new();
    project.file("paused.json", "{\"not\": \"a report\"}\n");
    let cases: [(&[&str], i32, &str); 4] = [
        (&["run", "nobody", "a task", "--json"], 2, "no agents are configured: add `nobody`"),
        (&["resume", "gone.json", "--json"], 2, "cannot read the paused run gone.json"),
        (&["resume", "paused.json", "--json"], 2, "paused.json is not an agent report"),
        (&["listen", "nobody", "--json"], 2, "no agents are configured"),
    ];
    for (args, code, start) in cases {
        let run = project.run(&[&["agent"], args].concat());
        assert_eq!(run.code, code, "{args:?}: {run:?}");
        let message = run.json_error();
        assert!(message.starts_with(start), "{args:?}: {message}");
    }
}
