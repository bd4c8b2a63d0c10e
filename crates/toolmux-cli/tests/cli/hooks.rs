//! Command hooks from the configuration file (`hooks`, Claude Code's shape) through the real
//! binary: on `tools call` and on the calls of an MCP client of `toolmux serve`, and the
//! configuration mistakes they can hold.

use crate::Project;
use expect_test::{Expect, expect};
use serde_json::{Value, json};

/// A project with the file tools, `secret.txt` and `notes.md`, a `PreToolUse` hook (a
/// Claude Code style script) refusing reads of `secret.txt`, and a `PostToolUse` hook
/// adding context to every read and saving its input.
fn project() -> Project {
    let project = Project::new();
    project
        .file("secret.txt", "the password\n")
        .file("notes.md", "TODO: hooks\n")
        .file(
            ".claude/hooks/guard.sh",
            "input=$(cat)\n\
             case \"$input\" in\n\
             *secret.txt*) echo \"secret.txt is off limits (asked from $(basename \"$CLAUDE_PROJECT_DIR\"))\" >&2; exit 2 ;;\n\
             esac\n\
             exit 0\n",
        )
        .file(
            "toolmux.yaml",
            "fs: {}\n\
             hooks:\n  \
               PreToolUse:\n    \
                 - matcher: fs__read|fs__grep\n      \
                   hooks:\n        \
                     - type: command\n          \
                       command: sh \"${CLAUDE_PROJECT_DIR}/.claude/hooks/guard.sh\"\n          \
                       timeout: 30\n  \
               PostToolUse:\n    \
                 - matcher: ^fs__read$\n      \
                   hooks:\n        \
                     - type: command\n          \
                       command: >-\n            \
                         cat > post-input.json;\n            \
                         echo '{\"hookSpecificOutput\": {\"hookEventName\": \"PostToolUse\", \"additionalContext\": \"checked by the hook\"}}'\n",
        );
    project
}

#[test]
fn a_pre_tool_use_hook_refuses_a_call_of_tools_call() {
    let project = project();
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"secret.txt"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let folder = project.path().file_name().and_then(|n| n.to_str()).expect("folder name");
    assert!(
        run.stderr.contains(&format!(
            "call to `fs__read` denied: secret.txt is off limits (asked from {folder})"
        )),
        "{}",
        run.stderr
    );
    assert!(!project.path().join("post-input.json").exists(), "the tool never ran");

    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"notes.md"}"#]);
    let text = run.ok();
    assert!(text.contains("TODO: hooks"), "{text}");
    assert!(text.trim_end().ends_with("checked by the hook"), "{text}");
    let input: Value = serde_json::from_str(
        &std::fs::read_to_string(project.path().join("post-input.json")).expect("input saved"),
    )
    .expect("the hook got JSON");
    assert_eq!(input["hook_event_name"], "PostToolUse");
    assert_eq!(input["tool_name"], "fs__read");
    // The path also under Claude Code's name, for guards pasted from it.
    assert_eq!(input["tool_input"], json!({"path": "notes.md", "file_path": "notes.md"}));
    assert!(
        input["tool_response"]["content"][0]["text"].as_str().is_some_and(|t| t.contains("TODO"))
    );
}

/// The gateway's calls go through the same hooks: an MCP client over stdio is refused.
#[test]
fn a_pre_tool_use_hook_refuses_a_call_of_an_mcp_client() {
    let project = project();
    let call = json!({"method": "tools/call",
        "params": {"name": "fs__grep", "arguments": {"pattern": "password", "path": "secret.txt"}}});
    let messages = crate::serve::stdio_exchange(&project, &["serve", "--stdio"], &[call]);
    let answer = messages.iter().find(|m| m["id"] == 2).expect("the call is answered");
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let text = answer["result"]["content"][0]["text"].as_str().expect("text");
    assert!(text.contains("call to `fs__grep` denied: secret.txt is off limits"), "{answer}");
}

fn check(content: &str, expected: Expect) {
    let project = Project::new();
    project.file("toolmux.yaml", content);
    let run = project.run(&["config", "check"]);
    assert_eq!(run.code, 2, "{run:?}");
    expected.assert_eq(run.stderr.trim_end());
}

#[test]
fn a_bad_matcher_is_a_configuration_error() {
    check(
        "hooks:\n  PreToolUse:\n    - matcher: fs__(read\n      hooks: [{type: command, command: 'true'}]\n",
        expect![
            "error: toolmux.yaml: hooks.PreToolUse[0].matcher: invalid regular expression `fs__(read`: unclosed group"
        ],
    );
}

#[test]
fn an_unknown_event_is_a_configuration_error() {
    check(
        "hooks:\n  Notification:\n    - hooks: [{type: command, command: 'true'}]\n",
        expect![
            "error: toolmux.yaml:2:3: unknown hook event `Notification` in hooks; toolmux runs PreToolUse, PostToolUse, SessionStart, UserPromptSubmit, Stop, SubagentStop hooks (Claude Code's other events have no counterpart here)"
        ],
    );
}

#[test]
fn an_unknown_key_or_kind_of_hook_is_a_configuration_error() {
    check(
        "hooks:\n  PostToolUse:\n    - hooks: [{type: command, command: 'true', timout: 5}]\n",
        expect![
            "error: toolmux.yaml:3:48: unknown key `timout` in hooks.PostToolUse[0].hooks[0]; did you mean `timeout`?"
        ],
    );
    check(
        "hooks:\n  PostToolUse:\n    - hooks: [{type: prompt, command: 'true'}]\n",
        expect![
            "error: toolmux.yaml:3:22: unknown value `prompt` for hooks.PostToolUse[0].hooks[0].type; expected one of: command"
        ],
    );
    check(
        "hooks:\n  PreToolUse:\n    - hooks: [{type: command, command: 'true', timeout: 0}]\n",
        expect![
            "error: toolmux.yaml: hooks.PreToolUse[0].hooks[0].timeout: must be at least 1 (seconds)"
        ],
    );
}

/// The hooks of an agent's loop, as Claude Code runs them: `SessionStart` context reaches
/// the model, a `Stop` hook makes the agent go on once (then `stop_hook_active` lets it
/// end), and a `UserPromptSubmit` hook refuses a task before the model sees it.
#[test]
fn an_agents_loop_runs_session_prompt_and_stop_hooks() {
    use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::callback(|request| {
                let text = request["messages"].to_string();
                if text.contains("Project rule: answer briefly") {
                    ScriptStep::text("done")
                } else {
                    ScriptStep::text(format!("no context in {text}"))
                }
            }),
            ScriptStep::callback(|request| {
                let text = request["messages"].to_string();
                if text.contains("run the tests first") {
                    ScriptStep::text("tests pass, done")
                } else {
                    ScriptStep::text(format!("not told to go on: {text}"))
                }
            }),
        ],
    );
    let project = Project::new().env("LLM_KEY", "sk-test-1");
    project
        .file(
            "hooks/stop.sh",
            "input=$(cat)\n\
             echo \"$input\" >> stop-inputs.jsonl\n\
             case \"$input\" in\n\
             *'\"stop_hook_active\":false'*) echo '{\"decision\": \"block\", \"reason\": \"run the tests first\"}' ;;\n\
             esac\n\
             exit 0\n",
        )
        .file(
            "hooks/prompt.sh",
            "if grep -q 'rm -rf'; then echo 'dangerous task' >&2; exit 2; fi\nexit 0\n",
        )
        .file(
            "toolmux.yaml",
            &format!(
                "models:\n  fast:\n    type: openai\n    model: m\n    baseUrl: {}\n    apiKey: ${{LLM_KEY}}\n    maxRetries: 0\n\
                 agents:\n  reader:\n    model: fast\n    description: Reads\n\
                 hooks:\n  \
                   SessionStart:\n    \
                     - matcher: startup\n      \
                       hooks: [{{type: command, command: 'echo \"Project rule: answer briefly\"'}}]\n  \
                   UserPromptSubmit:\n    \
                     - hooks: [{{type: command, command: 'sh hooks/prompt.sh'}}]\n  \
                   Stop:\n    \
                     - hooks: [{{type: command, command: 'sh hooks/stop.sh', timeout: 10}}]\n",
                server.base_url()
            ),
        );
    let run = project.run(&["agent", "run", "reader", "Do the task", "--json"]);
    let report: Value = serde_json::from_str(run.ok()).expect("a report");
    assert_eq!(report["content"], "tests pass, done", "{report}");
    assert_eq!(report["turns"], 2);
    let inputs = std::fs::read_to_string(project.path().join("stop-inputs.jsonl")).expect("inputs");
    let inputs: Vec<Value> =
        inputs.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    assert_eq!(inputs.len(), 2);
    assert_eq!(inputs[0]["hook_event_name"], "Stop");
    assert_eq!(inputs[0]["agent_name"], "reader");
    assert_eq!(
        (inputs[0]["stop_hook_active"].clone(), inputs[1]["stop_hook_active"].clone()),
        (json!(false), json!(true))
    );
    // The transcript as the second stop hook saw it: Claude Code's lines, the whole
    // conversation so far.
    let path = inputs[1]["transcript_path"].as_str().expect("a transcript path");
    assert_eq!(inputs[0]["transcript_path"], path, "one file per session, rewritten");
    let transcript = std::fs::read_to_string(path).expect("the transcript");
    let lines: Vec<Value> =
        transcript.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    let said: Vec<String> = lines
        .iter()
        .map(|l| format!("{} {}", l["type"].as_str().unwrap_or("?"), l["message"]["content"]))
        .collect();
    assert_eq!(said.len(), 5, "{said:#?}");
    assert!(said[1].starts_with("user \"Do the task"), "{said:#?}");
    assert_eq!(said[2], r#"assistant [{"text":"done","type":"text"}]"#);
    assert!(said[3].contains("run the tests first"), "{said:#?}");
    assert_eq!(said[4], r#"assistant [{"text":"tests pass, done","type":"text"}]"#);
    assert!(lines.iter().all(|l| l["sessionId"] == inputs[1]["session_id"]));

    let refused = project.run(&["agent", "run", "reader", "please rm -rf the build", "--json"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    let report: Value = serde_json::from_str(&refused.stdout).expect("a report");
    assert_eq!(report["status"], "failure");
    assert_eq!(report["content"], "a UserPromptSubmit hook refused the task: dangerous task");
    assert_eq!(server.requests().len(), 2, "the model never saw the refused task");
}
