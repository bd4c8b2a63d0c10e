//! External tools through the real binary: one MCP session over stdio plays both the agent
//! and the program that answers its calls (`external__pending`, `external__submit`), with
//! the orchestrator's validation in front.

use crate::Project;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead as _, Read as _, Write as _};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;
use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};

const CONFIG: &str = "\
externalTools:
  confirm:
    description: Ask the user to confirm
    executionType: space
    timeout: 20000
    inputSchema:
      type: object
      properties: {question: {type: string}}
      required: [question]
  build:
    description: Start a build
    isAsync: true
  chart:
    description: Draw a chart
    executionType: internal
";

/// A `toolmux serve --stdio` session, answers read as they come.
struct Session {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    answers: HashMap<u64, Value>,
    next: u64,
}

impl Session {
    fn start(project: &Project) -> Session {
        let (child, stdin, stdout) = crate::serve::spawn_stdio(project, &["serve", "--stdio"]);
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut session = Session { child, stdin, lines, answers: HashMap::new(), next: 1 };
        let id = session.send(
            "initialize",
            json!({"protocolVersion": "2025-06-18",
            "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        );
        session.answer(id);
        writeln!(
            session.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        )
        .expect("write");
        session
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{request}").expect("write");
        id
    }

    fn call(&mut self, tool: &str, arguments: Value) -> u64 {
        self.send("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    /// The answer to request `id`, waiting up to 30 s for it.
    fn answer(&mut self, id: u64) -> Value {
        while !self.answers.contains_key(&id) {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no answer to request {id}"));
            let message: Value = serde_json::from_str(&line).expect("a JSON line");
            if let Some(answered) = message["id"].as_u64() {
                self.answers.insert(answered, message);
            }
        }
        self.answers.remove(&id).expect("present")
    }

    /// The text, or the JSON, of a tool result.
    fn result(&mut self, id: u64) -> (Value, bool) {
        let answer = self.answer(id);
        let result = &answer["result"];
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        let value = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
        (value, result["isError"] == true)
    }

    /// Closes stdin: the server ends, with success, within 30 s.
    fn end(mut self) {
        drop(self.stdin);
        let mut stderr = self.child.stderr.take().expect("stderr");
        let errors = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let status = crate::exit_within(&mut self.child, Duration::from_secs(30));
        let stderr = errors.join().unwrap_or_default();
        assert!(status.is_some_and(|s| s.success()), "{status:?}: {stderr}");
    }
}

#[test]
fn external_calls_are_answered_by_another_caller() {
    let project = Project::new();
    project.file("toolmux.yaml", CONFIG);
    let mut s = Session::start(&project);

    let listed = s.send("tools/list", json!({}));
    let tools = s.answer(listed)["result"]["tools"].clone();
    let names: Vec<&str> =
        tools.as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    // The answering program's tools are hidden from models (`output__read` reads outputs
    // the size cap stored).
    assert_eq!(
        names,
        [
            "external__build",
            "external__chart",
            "external__confirm",
            "external__inbox",
            "output__read"
        ]
    );

    // An internal tool returns its arguments.
    let chart = s.call("external__chart", json!({"points": [1, 2]}));
    assert_eq!(s.result(chart).0, json!({"success": true, "args": {"points": [1, 2]}}));

    // Arguments are checked before anything is pending.
    let invalid = s.call("external__confirm", json!({}));
    let (text, failed) = s.result(invalid);
    assert!(failed && text.to_string().contains("question"), "{text}");

    // A synchronous call waits for the answer another caller submits.
    let confirm = s.call("external__confirm", json!({"question": "ship?"}));
    let pending = s.call("external__pending", json!({"waitMs": 10000}));
    let (calls, _) = s.result(pending);
    let call = calls["calls"][0].clone();
    assert_eq!(call["tool"], "external__confirm", "{calls}");
    assert_eq!(call["arguments"], json!({"question": "ship?"}));
    let submitted = s.call("external__submit", json!({"callId": call["callId"], "result": "yes"}));
    assert!(!s.result(submitted).1);
    assert_eq!(s.result(confirm), (json!("yes"), false));

    // An asynchronous call returns at once; its result waits in the inbox.
    let build = s.call("external__build", json!({"target": "release"}));
    let (started, _) = s.result(build);
    assert_eq!(started["status"], "pending", "{started}");
    let submitted = s.call(
        "external__submit",
        json!({"callId": started["callId"], "result": {"artifact": "app.tar"}}),
    );
    assert!(!s.result(submitted).1);
    let inbox = s.call("external__inbox", json!({}));
    let (inbox, _) = s.result(inbox);
    assert_eq!(inbox["results"][0]["callId"], started["callId"], "{inbox}");
    assert_eq!(inbox["results"][0]["result"], json!({"artifact": "app.tar"}));
    assert_eq!(inbox["stillPending"], 0);

    // A call id answered twice is refused, saying why.
    let again = s.call("external__submit", json!({"callId": started["callId"], "result": 1}));
    let (text, failed) = s.result(again);
    assert!(failed && text.to_string().contains("no pending call"), "{text}");
    s.end();
}

#[test]
fn a_bad_external_tool_is_a_configuration_error() {
    let project = Project::new();
    project.file("toolmux.yaml", "externalTools:\n  inbox:\n    description: clash\n");
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("externalTools: `inbox` is the name of a tool of the provider itself"),
        "{}",
        run.stderr
    );
    project.file("toolmux.yaml", "externalTools:\n  t:\n    description: x\n    isAsnc: true\n");
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("isAsnc") && run.stderr.contains("isAsync"), "{}", run.stderr);
}

/// A request may name its run in `_meta` (`toolmux/runId`): the inbox is the named run's,
/// not the session's, so an agent finds its results across sessions.
#[test]
fn a_named_run_finds_its_inbox() {
    let project = Project::new();
    project.file("toolmux.yaml", CONFIG);
    let mut s = Session::start(&project);
    let named = json!({"toolmux/runId": "agent-7"});
    let build =
        s.send("tools/call", json!({"name": "external__build", "arguments": {}, "_meta": named}));
    let (started, _) = s.result(build);
    let submitted =
        s.call("external__submit", json!({"callId": started["callId"], "result": "ok"}));
    assert!(!s.result(submitted).1);
    // The session's own run has nothing; the named run has the result.
    let own = s.call("external__inbox", json!({}));
    assert_eq!(s.result(own).0["results"], json!([]));
    let inbox =
        s.send("tools/call", json!({"name": "external__inbox", "arguments": {}, "_meta": named}));
    let (inbox, _) = s.result(inbox);
    assert_eq!(inbox["results"][0]["callId"], started["callId"], "{inbox}");
    // The answering program sees which run asked.
    let pending =
        s.send("tools/call", json!({"name": "external__build", "arguments": {}, "_meta": named}));
    let _ = s.result(pending);
    let listed = s.call("external__pending", json!({}));
    assert_eq!(s.result(listed).0["calls"][0]["runId"], "client:agent-7");
    s.end();
}

/// Two processes on one configuration share its pending calls (the folder
/// `defaults.externalCallsDir`, by default in the output directory): one `toolmux serve`
/// makes the calls, another lists and answers them, a synchronous call's caller gets the
/// answer, and an asynchronous call's result waits in the first process's inbox.
#[test]
fn another_process_answers_the_calls() {
    let project = Project::new();
    project.file("toolmux.yaml", CONFIG);
    let mut asking = Session::start(&project);
    let mut answering = Session::start(&project);

    let confirm = asking.call("external__confirm", json!({"question": "ship?"}));
    let pending = answering.call("external__pending", json!({"waitMs": 10000}));
    let (calls, _) = answering.result(pending);
    let call = calls["calls"][0].clone();
    assert_eq!(call["tool"], "external__confirm", "{calls}");
    assert_eq!(call["status"], "waiting", "{calls}");
    assert!(call["expiresMs"].as_u64() > call["createdMs"].as_u64(), "{calls}");
    let submitted =
        answering.call("external__submit", json!({"callId": call["callId"], "result": "yes"}));
    let (told, failed) = answering.result(submitted);
    assert!(!failed && told.to_string().contains("handed to the waiting call"), "{told}");
    assert_eq!(asking.result(confirm), (json!("yes"), false));

    let build = asking.call("external__build", json!({"target": "release"}));
    let (started, _) = asking.result(build);
    let listed = answering.call("external__pending", json!({}));
    let (calls, _) = answering.result(listed);
    assert_eq!(calls["calls"][0]["callId"], started["callId"], "{calls}");
    assert_eq!(calls["calls"][0]["status"], "pending", "{calls}");
    let submitted = answering.call(
        "external__submit",
        json!({"callId": started["callId"], "result": {"artifact": "app.tar"}}),
    );
    let (told, _) = answering.result(submitted);
    assert!(told.to_string().contains("inbox of its run"), "{told}");
    // Each process's session is its own run: the other one's inbox is not this one's
    // (both were `mcp-1-1` once, and the first to look took the result).
    let theirs = answering.call("external__inbox", json!({}));
    let (theirs, _) = answering.result(theirs);
    assert_eq!(theirs["results"], json!([]), "{theirs}");
    let inbox = asking.call("external__inbox", json!({}));
    let (inbox, _) = asking.result(inbox);
    assert_eq!(inbox["results"][0]["result"], json!({"artifact": "app.tar"}), "{inbox}");
    asking.end();
    answering.end();

    // `externalCallsDir: false` keeps them in each process.
    project.file("toolmux.yaml", &format!("defaults:\n  externalCallsDir: false\n{CONFIG}"));
    let mut asking = Session::start(&project);
    let mut answering = Session::start(&project);
    let build = asking.call("external__build", json!({}));
    let _ = asking.result(build);
    let listed = answering.call("external__pending", json!({}));
    assert_eq!(answering.result(listed).0["calls"], json!([]));
    asking.end();
    answering.end();
}

/// The seeds' flow across processes, without Redis: an agent run by `toolmux agent run`
/// calls a synchronous external tool, and another process (`toolmux tools call`, as a
/// user interface's back end would) finds the call and answers it; the agent's model gets
/// the answer as the tool's result.
#[test]
fn an_agent_run_s_call_is_answered_from_another_process() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("external__confirm", json!({"question": "deploy?"})),
            ScriptStep::callback(|request| {
                let messages = request["messages"].as_array().expect("messages");
                let answer = messages.last().expect("a message")["content"].to_string();
                ScriptStep::tool_call(
                    "agent__final_report",
                    json!({"status": "success", "content": format!("told: {answer}")}),
                )
            }),
        ],
    );
    let project = Project::new().env("LLM_KEY", "sk-test-2");
    project.file(
        "toolmux.yaml",
        &format!(
            "{CONFIG}models:\n  fast:\n    type: openai\n    model: m\n    baseUrl: {}\n    apiKey: ${{LLM_KEY}}\n    maxRetries: 0\n\
             agents:\n  deployer:\n    model: fast\n    description: Deploys\n    tools: ['external__*']\n",
            server.base_url()
        ),
    );
    let agent = project
        .command(&["agent", "run", "deployer", "ship the release", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmux agent run starts");
    let listed =
        project.run(&["tools", "call", "external__pending", r#"{"waitMs": 30000}"#, "--json"]);
    let envelope: Value = serde_json::from_str(listed.ok()).expect("JSON");
    let calls: Value = match &envelope["result"] {
        Value::String(text) => serde_json::from_str(text).expect("calls"),
        other => other.clone(),
    };
    let call = &calls["calls"][0];
    assert_eq!(call["tool"], "external__confirm", "{calls}");
    assert_eq!(call["arguments"], json!({"question": "deploy?"}), "{calls}");
    assert!(call["runId"].as_str().is_some_and(|run| !run.is_empty()), "{calls}");
    let answer = json!({"callId": call["callId"], "result": "approved by husam"}).to_string();
    let submitted = project.run(&["tools", "call", "external__submit", &answer]);
    assert!(submitted.ok().contains("handed to the waiting call"), "{submitted:?}");
    let run = crate::wait(agent, Duration::from_secs(60));
    let report: Value = serde_json::from_str(run.ok().trim()).expect("one JSON report");
    assert!(
        report["content"].as_str().is_some_and(|c| c.contains("approved by husam")),
        "{report}"
    );
}

/// An interrupted `tools call` (Ctrl-C) of a synchronous external tool withdraws its call:
/// kept in the folder processes share, it would otherwise be listed and answered with
/// nobody waiting.
#[test]
fn an_interrupted_call_is_withdrawn() {
    let project = Project::new();
    project.file("toolmux.yaml", CONFIG);
    let asking = project
        .command(&["tools", "call", "external__confirm", r#"{"question": "ship?"}"#])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolmux tools call starts");
    let listed = project.run(&["tools", "call", "external__pending", r#"{"waitMs": 30000}"#]);
    assert!(listed.ok().contains("ship?"), "{listed:?}");
    crate::send_signal(&asking, "INT");
    let run = crate::wait(asking, Duration::from_secs(30));
    assert_eq!(run.code, 130, "{run:?}");
    assert!(run.stderr.contains("interrupted"), "{run:?}");
    let listed = project.run(&["tools", "call", "external__pending", "{}"]);
    assert!(!listed.ok().contains("ship?"), "still listed: {listed:?}");
}

/// A paused run's asynchronous call answered while it is paused: `agent resume` in another
/// process goes on as the same run, so the model is given the result from the run's inbox.
/// (Each process named its run afresh before, and the result was read by nobody.)
#[test]
fn a_resumed_run_reads_the_results_that_came_while_it_was_paused() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::ToolCalls(vec![
                ("external__build".into(), json!({})),
                ("fs__ls".into(), json!({})),
            ]),
            ScriptStep::callback(|request| {
                let said: Vec<String> = request["messages"]
                    .as_array()
                    .expect("messages")
                    .iter()
                    .filter(|m| m["role"] == "user")
                    .map(|m| m["content"].to_string())
                    .collect();
                ScriptStep::tool_call(
                    "agent__final_report",
                    json!({"status": "success", "content": said.join(" | ")}),
                )
            }),
        ],
    );
    let project = Project::new().env("LLM_KEY", "sk-test-3");
    project.file("notes.md", "x\n").file(
        "toolmux.yaml",
        &format!(
            "{CONFIG}fs: {{}}\npermissions: {{ask: ['fs__ls']}}\n\
             models:\n  fast:\n    type: openai\n    model: m\n    baseUrl: {}\n    apiKey: ${{LLM_KEY}}\n    maxRetries: 0\n\
             agents:\n  builder:\n    model: fast\n    description: Builds\n    tools: ['external__*', 'fs__*']\n",
            server.base_url()
        ),
    );
    let run = project.run(&["agent", "run", "builder", "build it", "--pause-to", "run.json"]);
    assert_eq!(run.code, 5, "{run:?}");
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(project.path().join("run.json")).unwrap())
            .unwrap();
    let waiting = saved["pending"][0]["callId"].as_str().expect("a waiting call").to_owned();
    let run_id = saved["runId"].as_str().expect("the run's id is saved").to_owned();
    assert!(run_id.starts_with("agent-builder-"), "{run_id}");

    let listed = project.run(&["tools", "call", "external__pending", "{}", "--json"]);
    let envelope: Value = serde_json::from_str(listed.ok()).expect("JSON");
    let calls: Value = match &envelope["result"] {
        Value::String(text) => serde_json::from_str(text).expect("calls"),
        other => other.clone(),
    };
    let build = &calls["calls"][0];
    assert_eq!((&build["tool"], &build["runId"]), (&json!("external__build"), &json!(run_id)));
    let answer = json!({"callId": build["callId"], "result": "artifact-42 built"}).to_string();
    let submitted = project.run(&["tools", "call", "external__submit", &answer]);
    assert!(submitted.ok().contains("inbox"), "{submitted:?}");

    let done = project.run(&["agent", "resume", "run.json", "--approve", &waiting, "--json"]);
    assert_eq!(done.code, 0, "{done:?}");
    let report: Value = serde_json::from_str(done.ok().trim()).expect("one JSON report");
    assert!(
        report["content"].as_str().is_some_and(|c| c.contains("artifact-42 built")),
        "{report}"
    );
}

/// `defaults.externalMaxInboxes` bounds the runs holding unread results: a result for
/// another run is refused past it, naming the key, and its call stays pending; 0 is a
/// configuration error.
#[test]
fn the_configured_bound_on_inboxes_holds() {
    let project = Project::new();
    project.file("toolmux.yaml", &format!("{CONFIG}defaults:\n  externalMaxInboxes: 1\n"));
    let mut s = Session::start(&project);
    let mut started = Vec::new();
    for run in ["run-a", "run-b"] {
        let meta = json!({"toolmux/runId": run});
        let build = s
            .send("tools/call", json!({"name": "external__build", "arguments": {}, "_meta": meta}));
        started.push(s.result(build).0["callId"].clone());
    }
    let first = s.call("external__submit", json!({"callId": started[0], "result": "ok"}));
    assert!(!s.result(first).1, "the first run's inbox has room");
    let second = s.call("external__submit", json!({"callId": started[1], "result": "ok"}));
    let (told, failed) = s.result(second);
    assert!(failed, "{told}");
    let told = told.to_string();
    assert!(
        told.contains("1 runs already hold unread results")
            && told.contains("defaults.externalMaxInboxes"),
        "{told}"
    );
    let pending = s.call("external__pending", json!({}));
    let (pending, _) = s.result(pending);
    assert_eq!(pending["calls"][0]["callId"], started[1], "the refused call stays: {pending}");

    project.file("toolmux.yaml", &format!("{CONFIG}defaults:\n  externalMaxInboxes: 0\n"));
    let checked = project.run(&["config", "check"]);
    assert_eq!(checked.code, 2, "{checked:?}");
    assert!(checked.stderr.contains("defaults.externalMaxInboxes: 0"), "{checked:?}");
}

/// `spaces.maxAgents` bounds the agents' and runs' records the spaces keep: with none idle
/// for an hour, a new run's is refused, naming the key; a bound of 0 is a configuration
/// error. (Here, beside the sessions whose requests name their runs.)
#[test]
fn the_configured_bound_on_agents_holds() {
    let project = Project::new();
    project.file("toolmux.yaml", "spaces:\n  maxAgents: 1\n");
    let mut s = Session::start(&project);
    let mut enter = |run: &str, space: &str| {
        let meta = json!({"toolmux/runId": run});
        let arguments = json!({ "space": space });
        let params = json!({"name": "gateway__enter_space", "arguments": arguments, "_meta": meta});
        let id = s.send("tools/call", params);
        s.result(id)
    };
    let (entered, failed) = enter("run-a", "first");
    assert!(!failed, "{entered}");
    let (told, failed) = enter("run-b", "second");
    assert!(failed, "{told}");
    let told = told.to_string();
    assert!(told.contains("the most they keep (1") && told.contains("spaces.maxAgents"), "{told}");
    let (again, failed) = enter("run-a", "second");
    assert!(!failed, "a run already kept is not refused: {again}");

    project.file("toolmux.yaml", "spaces:\n  maxAgents: 0\n");
    let checked = project.run(&["config", "check"]);
    assert_eq!(checked.code, 2, "{checked:?}");
    assert!(checked.stderr.contains("spaces.maxAgents must be at least 1"), "{checked:?}");
}

/// Results of asynchronous calls that arrived and that the agent did not read before its
/// run ended are told on stderr after the answer, one line each (tool, call, the start of
/// the result cut at a character), where before a person saw only the answer: the run's
/// second turn has both builds answered from another process (each filling most of the
/// 1000-byte cap, so one reaches the model a turn), and its third, the last, reports.
#[test]
fn results_an_agent_did_not_read_are_told_after_its_answer() {
    let project = Arc::new(Project::new().env("LLM_KEY", "sk-test-5"));
    let answering = project.clone();
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::ToolCalls(vec![
                ("external__build".into(), json!({"target": 1})),
                ("external__build".into(), json!({"target": 2})),
            ]),
            ScriptStep::callback(move |_| {
                let listed = answering.run(&["tools", "call", "external__pending", "{}", "--json"]);
                let envelope: Value = serde_json::from_str(listed.ok()).expect("JSON");
                let calls: Value = match &envelope["result"] {
                    Value::String(text) => serde_json::from_str(text).expect("calls"),
                    other => other.clone(),
                };
                for call in calls["calls"].as_array().expect("calls") {
                    let target = &call["arguments"]["target"];
                    let result = format!("bâtiment {target} prêt ").repeat(40);
                    let answer = json!({"callId": call["callId"], "result": result}).to_string();
                    let submitted = answering.run(&["tools", "call", "external__submit", &answer]);
                    assert!(submitted.ok().contains("inbox"), "{submitted:?}");
                }
                ScriptStep::tool_call("fs__ls", json!({}))
            }),
            ScriptStep::tool_call(
                "agent__final_report",
                json!({"status": "success", "content": "both built"}),
            ),
        ],
    );
    project.file("notes.md", "x\n").file(
        "toolmux.yaml",
        &format!(
            "{CONFIG}fs: {{}}\ndefaults:\n  toolResponseMaxBytes: 1000\n\
             models:\n  fast:\n    type: openai\n    model: m\n    baseUrl: {}\n    apiKey: ${{LLM_KEY}}\n    maxRetries: 0\n\
             agents:\n  builder:\n    model: fast\n    description: Builds\n    maxTurns: 3\n    tools: ['external__*', 'fs__*']\n",
            server.base_url()
        ),
    );
    let run = project.run(&["agent", "run", "builder", "build both"]);
    assert_eq!(run.ok().trim(), "both built");
    let told: Vec<&str> = run.stderr.lines().collect();
    let at = told
        .iter()
        .position(|line| {
            line.starts_with(
                "1 result arrived that agent `builder` did not read before its run ended",
            )
        })
        .unwrap_or_else(|| panic!("not told: {}", run.stderr));
    let line = told[at + 1];
    assert!(line.starts_with("  external__build (call "), "{line}");
    // The result unread is either build's, whichever the inbox gave second.
    let cut =
        |target: u32| format!("{}...", format!("bâtiment {target} prêt ").repeat(5).trim_end());
    let preview = line.split_once("): ").expect("a preview").1;
    assert!(preview == cut(1) || preview == cut(2), "{line}");
    assert!(told[at + 2].starts_with("agent `builder`: success"), "{}", run.stderr);
}
