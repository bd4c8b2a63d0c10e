//! Spaces and the gateway's built-ins through the real binary: each `tools call` and each
//! `agent run` is a process of its own, so what a space holds and what an agent carries
//! from run to run live in the spaces folder.

use crate::Project;
use serde_json::{Value, json};
use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};

const EXTERNAL: &str = "\
spaces: {}
externalTools:
  displayChart:
    description: Draw a chart in the space
    executionType: internal
    visible: true
";

#[test]
fn visible_tools_need_a_space_and_show_their_calls_there() {
    let project = Project::new();
    project.file("toolmux.yaml", EXTERNAL);

    let refused = project.run(&["tools", "call", "external__displayChart", r#"{"points":[1]}"#]);
    assert_ne!(refused.code, 0, "{refused:?}");
    let told = format!("{}{}", refused.stdout, refused.stderr);
    assert!(
        told.contains(
            "Tool \"external__displayChart\" is visible but you are not in a space. Call \
             gateway__enter_space first."
        ),
        "{told}"
    );

    let entered = project.run(&["tools", "call", "gateway__enter_space", r#"{"space":"demo"}"#]);
    assert!(entered.ok().contains("\"created\":true"), "{entered:?}");
    project.run(&["tools", "call", "external__displayChart", r#"{"points":[1,2]}"#]).ok();
    project.run(&["tools", "call", "gateway__send_message", r#"{"text":"drawn"}"#]).ok();

    let read = project.run(&[
        "tools",
        "call",
        "gateway__read_messages",
        r#"{"space":"demo","offset":0}"#,
        "--json",
    ]);
    let envelope: Value = serde_json::from_str(read.ok()).expect("JSON");
    let page: Value = match &envelope["result"] {
        Value::String(text) => serde_json::from_str(text).expect("a page"),
        other => other.clone(),
    };
    let messages = page["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "{page}");
    assert_eq!(messages[0]["tool"]["name"], "external__displayChart");
    assert_eq!(messages[0]["tool"]["status"], "complete");
    assert_eq!(messages[0]["tool"]["arguments"], json!({"points": [1, 2]}));
    assert_eq!(messages[1]["text"], "drawn");

    // The built-ins are listed; those for runtimes and user interfaces as hidden.
    let listed = project.run(&["tools", "list"]);
    let listed = listed.ok();
    for name in ["gateway__enter_space", "gateway__set_goals", "gateway__skip"] {
        assert!(listed.contains(name), "{name} missing:\n{listed}");
    }
    let context = listed.lines().find(|l| l.contains("gateway__context")).expect("listed");
    assert!(context.contains("[hidden]"), "{context}");
}

#[test]
fn an_agent_carries_its_goals_and_space_into_its_next_run() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            // First run: the gateway's tools are offered though `tools` names only fs.
            ScriptStep::callback(|request| {
                let offered: Vec<&str> = request["tools"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t["function"]["name"].as_str())
                    .collect();
                if offered.contains(&"gateway__set_goals") && !offered.contains(&"gateway__context")
                {
                    ScriptStep::tool_call("gateway__enter_space", json!({"space": "release"}))
                } else {
                    let content = format!("offered: {offered:?}");
                    ScriptStep::tool_call(
                        "agent__final_report",
                        json!({"status": "success", "content": content}),
                    )
                }
            }),
            ScriptStep::tool_call(
                "gateway__set_goals",
                json!({"goals": [{"text": "publish 1.0 by Friday", "status": "active"}]}),
            ),
            ScriptStep::tool_call(
                "agent__final_report",
                json!({"status": "success", "content": "goal set"}),
            ),
            // Second run: what it carries is in its first request.
            ScriptStep::callback(|request| {
                let text = request["messages"].to_string();
                let carried = text.contains("What you carry from earlier runs")
                    && text.contains("publish 1.0 by Friday")
                    && text.contains("You are in space `release`");
                ScriptStep::tool_call(
                    "agent__final_report",
                    json!({"status": "success", "content": format!("carried: {carried}")}),
                )
            }),
        ],
    );
    let project = Project::new().env("LLM_KEY", "sk-test-1");
    project.file(
        "toolmux.yaml",
        &format!(
            "fs: {{}}\nspaces: {{}}\n\
             models:\n  fast:\n    type: openai\n    model: m\n    baseUrl: {}\n    apiKey: ${{LLM_KEY}}\n    maxRetries: 0\n\
             agents:\n  planner:\n    model: fast\n    description: Plans\n    tools: ['fs__*']\n",
            server.base_url()
        ),
    );
    let first = project.run(&["agent", "run", "planner", "Set the release goal", "--json"]);
    let report: Value = serde_json::from_str(first.ok()).expect("report");
    assert_eq!(report["content"], "goal set", "{report}");
    let second = project.run(&["agent", "run", "planner", "What are you working on?", "--json"]);
    let report: Value = serde_json::from_str(second.ok()).expect("report");
    assert_eq!(report["content"], "carried: true", "{report}");
}

/// The file tools leave the spaces folder alone: reading it would pass by the holders'
/// separation, writing it would forge another agent's goals.
#[test]
fn the_file_tools_neither_read_nor_change_the_spaces_folder() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs:\n  permissions: [read, write]\nspaces:\n  dir: rooms\n");
    project.run(&["tools", "call", "gateway__enter_space", r#"{"space":"s"}"#]).ok();
    assert!(project.path().join("rooms/state.json").is_file());

    let read = project.run(&["tools", "call", "fs__read", r#"{"path":"rooms/state.json"}"#]);
    assert_ne!(read.code, 0, "{read:?}");
    let told = format!("{}{}", read.stdout, read.stderr);
    assert!(told.contains("it is in toolmux's spaces folder: agents may not read it"), "{told}");
    let write = project.run(&[
        "tools",
        "call",
        "fs__write",
        r#"{"path":"rooms/state.json","content":"{}"}"#,
    ]);
    assert_ne!(write.code, 0, "{write:?}");
    let told = format!("{}{}", write.stdout, write.stderr);
    assert!(told.contains("agents may not change it"), "{told}");
}

/// `toolmux agent listen`: the agent sleeps until someone speaks in its space (here from
/// another process), answers there in one cycle, and stops after the cycles asked for.
#[test]
fn a_listening_agent_wakes_when_someone_speaks_in_its_space() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::callback(|request| {
                let text = request["messages"].to_string();
                if text.contains("status?") && text.contains("1 new message arrived in space `ops`")
                {
                    ScriptStep::tool_call("gateway__send_message", json!({"text": "all green"}))
                } else {
                    let content = format!("not told: {text}");
                    ScriptStep::tool_call(
                        "agent__final_report",
                        json!({"status": "failure", "content": content}),
                    )
                }
            }),
            ScriptStep::tool_call(
                "agent__final_report",
                json!({"status": "success", "content": "answered"}),
            ),
        ],
    );
    let project = Project::new().env("LLM_KEY", "sk-test-1");
    project.file(
        "toolmux.yaml",
        &format!(
            "spaces:\n  dir: rooms\n\
             models:\n  fast:\n    type: openai\n    model: m\n    baseUrl: {}\n    apiKey: ${{LLM_KEY}}\n    maxRetries: 0\n\
             agents:\n  planner:\n    model: fast\n    description: Plans\n",
            server.base_url()
        ),
    );
    let listener = listen_once(&project);
    // Once the agent is in the space, a person speaks there from another process.
    speak_once_it_entered(&project, "status?");
    let report = one_report(listener);
    assert_eq!(report["content"], "answered", "{report}");

    let read = project.run(&[
        "tools",
        "call",
        "gateway__read_messages",
        r#"{"space":"ops","offset":0}"#,
        "--json",
    ]);
    let envelope: Value = serde_json::from_str(read.ok()).expect("JSON");
    let page: Value =
        serde_json::from_str(envelope["result"].as_str().expect("text")).expect("page");
    assert_eq!(page["messages"][1]["text"], "all green", "{page}");
    assert_eq!(page["messages"][1]["author"], "agent:planner");
}

/// A listener started again reads what came while none listened: the result of an
/// asynchronous external call the first one made, answered from another process in
/// between, wakes the second, whose model is given it.
#[test]
fn a_listener_started_again_reads_results_that_came_while_none_listened() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("external__build", json!({"target": "release"})),
            ScriptStep::tool_call(
                "agent__final_report",
                json!({"status": "success", "content": "build started"}),
            ),
            ScriptStep::callback(|request| {
                let text = request["messages"].to_string();
                let content = if text.contains("artifact.tar") {
                    "got artifact.tar".to_owned()
                } else {
                    format!("not told: {text}")
                };
                ScriptStep::tool_call(
                    "agent__final_report",
                    json!({"status": "success", "content": content}),
                )
            }),
        ],
    );
    let project = Project::new().env("LLM_KEY", "sk-test-3");
    project.file(
        "toolmux.yaml",
        &format!(
            "spaces:\n  dir: rooms\n\
             externalTools:\n  build:\n    description: Build\n    isAsync: true\n\
             models:\n  fast:\n    type: openai\n    model: m\n    baseUrl: {}\n    apiKey: ${{LLM_KEY}}\n    maxRetries: 0\n\
             agents:\n  planner:\n    model: fast\n    description: Plans\n    tools: ['external__*']\n",
            server.base_url()
        ),
    );
    let first = listen_once(&project);
    speak_once_it_entered(&project, "build it");
    let report = one_report(first);
    assert_eq!(report["content"], "build started", "{report}");
    // Nobody listens: the build's result is submitted from another process.
    let listed = project.run(&["tools", "call", "external__pending", "{}", "--json"]);
    let envelope: Value = serde_json::from_str(listed.ok()).expect("JSON");
    let calls: Value = match &envelope["result"] {
        Value::String(text) => serde_json::from_str(text).expect("calls"),
        other => other.clone(),
    };
    let answer =
        json!({"callId": calls["calls"][0]["callId"], "result": {"artifact": "artifact.tar"}});
    let submitted = project.run(&["tools", "call", "external__submit", &answer.to_string()]);
    assert!(submitted.ok().contains("inbox"), "{submitted:?}");
    let report = one_report(listen_once(&project));
    assert_eq!(report["content"], "got artifact.tar", "{report}");
}

/// `toolmux agent listen planner` in space `ops` for one cycle (giving up after 30 s with
/// nothing arriving), its report as JSON.
fn listen_once(project: &Project) -> std::process::Child {
    project
        .command(&[
            "agent", "listen", "planner", "--space", "ops", "--cycles", "1", "--idle", "30",
            "--json",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("toolmux agent listen starts")
}

/// Once the listening agent entered space `ops` (folder `rooms`), a person says `text`
/// there from another process.
fn speak_once_it_entered(project: &Project, text: &str) {
    let entered = std::time::Instant::now();
    while !project.path().join("rooms/spaces/ops.json").is_file() {
        assert!(entered.elapsed() < std::time::Duration::from_secs(60), "the agent never entered");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let said = json!({"space": "ops", "author": "husam", "text": text}).to_string();
    project.run(&["tools", "call", "gateway__post", &said]).ok();
}

/// The one JSON report of a listener that ran one cycle.
fn one_report(listener: std::process::Child) -> Value {
    let run = crate::wait(listener, std::time::Duration::from_secs(60));
    serde_json::from_str(run.ok().trim()).expect("one JSON report")
}

/// `spaces.maxSpaces` bounds how many spaces there may be, across processes sharing the
/// folder; a bound of 0 is a configuration error.
#[test]
fn the_configured_bound_on_spaces_holds() {
    let project = Project::new();
    project.file("toolmux.yaml", "spaces:\n  maxSpaces: 1\n");
    let enter = |space: &str| {
        let args = json!({ "space": space }).to_string();
        project.run(&["tools", "call", "gateway__enter_space", &args])
    };
    assert!(enter("first").ok().contains("\"created\":true"));
    let refused = enter("second");
    assert_ne!(refused.code, 0, "{refused:?}");
    let told = format!("{}{}", refused.stdout, refused.stderr);
    assert!(
        told.contains("there are 1 spaces already") && told.contains("spaces.maxSpaces"),
        "{told}"
    );
    enter("first").ok();

    project.file("toolmux.yaml", "spaces:\n  maxSpaces: 0\n");
    let checked = project.run(&["config", "check"]);
    assert_ne!(checked.code, 0, "{checked:?}");
    assert!(checked.stderr.contains("spaces.maxSpaces must be at least 1"), "{checked:?}");
}
