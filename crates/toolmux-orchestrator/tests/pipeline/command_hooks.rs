//! Command hooks: real `sh` programs in a temporary folder, run on tokio's real clock (a
//! paused clock would fire a hook's timeout while it runs).
#![allow(clippy::unwrap_used, reason = "test helpers: a panic is the failure report")]

use async_trait::async_trait;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, InteractionHandler, ToolCall, ToolKind,
    ToolOutput, ToolResult, ToolSet, ToolSpec,
};
use toolmux_orchestrator::{CommandHook, HookEvent, Orchestrator, OrchestratorConfig, ToolMatcher};

/// A folder of hook scripts and an orchestrator whose `t__echo` tool returns its arguments
/// as JSON and counts its calls.
struct Bench {
    dir: tempfile::TempDir,
    calls: Arc<AtomicUsize>,
}

impl Bench {
    fn new() -> Bench {
        Bench { dir: tempfile::tempdir().unwrap(), calls: Arc::new(AtomicUsize::new(0)) }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    /// A hook for `event` on tools `matcher` matches, running the script `body` (written
    /// to a file of the folder) with `sh`.
    fn hook(&self, event: HookEvent, matcher: &str, body: &str) -> Arc<CommandHook> {
        let name = format!("hook{}.sh", std::fs::read_dir(self.dir.path()).unwrap().count());
        std::fs::write(self.path(&name), body).unwrap();
        Arc::new(
            CommandHook::new(event, format!("sh {name}"), self.dir.path())
                .with_matcher(ToolMatcher::new(matcher).unwrap())
                .with_secrets(["s3cr3t-value".to_owned()]),
        )
    }

    async fn start(&self, hooks: Vec<Arc<CommandHook>>) -> Orchestrator {
        let calls = self.calls.clone();
        let schema = json!({
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": false
        });
        let tools = ToolSet::new("t", ToolKind::Builtin).with_tool(
            ToolSpec::new("echo", "Echo the arguments", schema),
            move |args, _ctx| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move { Ok(ToolOutput::json(args)) }
            },
        );
        let builder = Orchestrator::builder(OrchestratorConfig::default())
            .provider(Arc::new(tools))
            .output_store(Arc::new(toolmux_orchestrator::store::DirectoryStore::new(
                self.path("outputs"),
            )))
            .secrets(["s3cr3t-value".to_owned()]);
        let o = CommandHook::attach(builder, hooks).build().unwrap();
        assert!(o.warmup().await.is_ok());
        o
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn echo(o: &Orchestrator, path: &str, ctx: &CallContext) -> ToolResult {
    o.execute(ToolCall::new("t__echo", json!({"path": path})), ctx).await
}

/// Says yes or no, and remembers what it was asked.
#[derive(Debug)]
struct Approver {
    yes: bool,
    asked: Mutex<Vec<ApprovalRequest>>,
}

#[async_trait]
impl InteractionHandler for Approver {
    async fn approve(&self, request: ApprovalRequest) -> ApprovalDecision {
        self.asked.lock().unwrap().push(request);
        if self.yes {
            ApprovalDecision::Allow
        } else {
            ApprovalDecision::Deny { reason: "the user said no".into() }
        }
    }
}

fn approver(yes: bool) -> Arc<Approver> {
    Arc::new(Approver { yes, asked: Mutex::new(Vec::new()) })
}

/// A script printing `answer` (JSON) on stdout and exiting 0.
fn answering(answer: Value) -> String {
    format!("cat > /dev/null\ncat <<'EOF'\n{answer}\nEOF\n")
}

#[tokio::test]
async fn exit_2_refuses_the_call_with_the_hooks_stderr() {
    let b = Bench::new();
    let block = b.hook(
        HookEvent::PreToolUse,
        "t__echo",
        "echo 'reading .env is not allowed' >&2\necho ignored\nexit 2\n",
    );
    let o = b.start(vec![block]).await;
    let r = echo(&o, ".env", &CallContext::new()).await;
    assert_eq!(
        r.conversation_text(),
        "(tool failed: call to `t__echo` denied: reading .env is not allowed)"
    );
    assert_eq!(r.extras["code"], "denied");
    assert_eq!(b.calls(), 0, "the tool never ran");
}

#[tokio::test]
async fn a_block_stops_the_chain_and_secrets_are_redacted_from_reasons() {
    let b = Bench::new();
    let marker = b.path("second-ran");
    let first =
        b.hook(HookEvent::PreToolUse, "*", "echo 'token s3cr3t-value leaked' >&2\nexit 2\n");
    let second = b.hook(HookEvent::PreToolUse, "*", &format!("touch {}\n", marker.display()));
    let o = b.start(vec![first, second]).await;
    let r = echo(&o, "a", &CallContext::new()).await;
    assert_eq!(
        r.conversation_text(),
        "(tool failed: call to `t__echo` denied: token [redacted] leaked)"
    );
    assert_eq!(r.extras["code"], "denied", "the refusal keeps its kind");
    assert!(!marker.exists(), "the hook after a block does not run");
}

#[tokio::test]
async fn other_exit_codes_and_unreadable_answers_do_not_block() {
    let b = Bench::new();
    let failing = b.hook(HookEvent::PreToolUse, "*", "echo broken >&2\nexit 1\n");
    let garbage = b.hook(HookEvent::PreToolUse, "*", "echo 'not json {'\n");
    let wrong = b.hook(HookEvent::PreToolUse, "*", &answering(json!({"decision": 5})));
    let missing =
        Arc::new(CommandHook::new(HookEvent::PreToolUse, "exec /nonexistent/hook", b.dir.path()));
    let o = b.start(vec![failing, garbage, wrong, missing]).await;
    let r = echo(&o, "a", &CallContext::new()).await;
    assert_eq!(r.conversation_text(), r#"{"path":"a"}"#);
}

#[tokio::test]
async fn updated_input_replaces_the_arguments_and_is_validated_again() {
    let b = Bench::new();
    let rewrite = b.hook(
        HookEvent::PreToolUse,
        "t__echo",
        &answering(json!({"hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "updatedInput": {"path": "safe.txt"}
        }})),
    );
    let o = b.start(vec![rewrite]).await;
    assert_eq!(
        echo(&o, ".env", &CallContext::new()).await.conversation_text(),
        r#"{"path":"safe.txt"}"#
    );

    let b = Bench::new();
    let invalid = b.hook(
        HookEvent::PreToolUse,
        "t__echo",
        &answering(json!({"hookSpecificOutput": {"updatedInput": {"path": 5}}})),
    );
    let o = b.start(vec![invalid]).await;
    let r = echo(&o, "a", &CallContext::new()).await;
    assert_eq!(
        r.conversation_text(),
        r#"(tool failed: invalid arguments for `t__echo`: at /path: 5 is not of type "string")"#
    );
    assert_eq!(b.calls(), 0);
}

#[tokio::test]
async fn permission_decisions_deny_and_ask() {
    let b = Bench::new();
    let deny = b.hook(
        HookEvent::PreToolUse,
        "t__echo",
        &answering(json!({"hookSpecificOutput": {
            "permissionDecision": "deny",
            "permissionDecisionReason": "outside the project"
        }})),
    );
    let o = b.start(vec![deny]).await;
    let r = echo(&o, "/etc/passwd", &CallContext::new()).await;
    assert_eq!(
        r.conversation_text(),
        "(tool failed: call to `t__echo` denied: outside the project)"
    );

    let b = Bench::new();
    let ask = b.hook(
        HookEvent::PreToolUse,
        "t__echo",
        &answering(json!({"hookSpecificOutput": {
            "permissionDecision": "ask",
            "permissionDecisionReason": "writes outside src/",
            "updatedInput": {"path": "rewritten"}
        }})),
    );
    let o = b.start(vec![ask]).await;
    let yes = approver(true);
    let r = echo(&o, "a", &CallContext::new().with_handler(yes.clone())).await;
    assert_eq!(r.conversation_text(), r#"{"path":"rewritten"}"#);
    let asked = yes.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].tool, "t__echo");
    assert_eq!(asked[0].reason, "writes outside src/");
    assert_eq!(
        asked[0].arguments,
        json!({"path": "rewritten"}),
        "the approver sees the rewritten call"
    );

    let no = approver(false);
    let r = echo(&o, "a", &CallContext::new().with_handler(no.clone())).await;
    assert_eq!(
        r.conversation_text(),
        "(tool failed: call to `t__echo` denied: not approved: the user said no)"
    );
    assert_eq!(no.asked.lock().unwrap().len(), 1);

    let r = echo(&o, "a", &CallContext::new()).await;
    let text = r.conversation_text();
    assert!(
        text.starts_with("(tool failed: call to `t__echo` denied: writes outside src/: the PreToolUse hook `sh hook0.sh` asks for approval and no approval handler is attached"),
        "{text}"
    );
    assert_eq!(b.calls(), 1, "only the approved call ran");
}

#[tokio::test]
async fn allow_does_not_bypass_deny_rules() {
    let b = Bench::new();
    let marker = b.path("ran");
    let allow = b.hook(
        HookEvent::PreToolUse,
        "*",
        &format!(
            "touch {}\n{}",
            marker.display(),
            answering(json!({"hookSpecificOutput": {"permissionDecision": "allow"}}))
        ),
    );
    let mut config = OrchestratorConfig::default();
    config.permissions.deny.push("t__echo".into());
    let tools = ToolSet::new("t", ToolKind::Builtin).with_tool(
        ToolSpec::new("echo", "Echo", json!({"type": "object"})),
        |args, _ctx| async move { Ok(ToolOutput::json(args)) },
    );
    let builder = Orchestrator::builder(config).provider(Arc::new(tools));
    let o = CommandHook::attach(builder, [allow]).build().unwrap();
    o.warmup().await;
    let r = echo(&o, "a", &CallContext::new()).await;
    assert_eq!(r.extras["code"], "denied", "{r:?}");
    assert!(!marker.exists(), "the deny rule refuses the call before any hook runs");
}

#[tokio::test]
async fn post_tool_use_adds_context_blocks_and_replaces() {
    let b = Bench::new();
    let context = b.hook(
        HookEvent::PostToolUse,
        "t__echo",
        &answering(json!({"hookSpecificOutput": {
            "hookEventName": "PostToolUse",
            "additionalContext": "remember to run the tests"
        }})),
    );
    let o = b.start(vec![context]).await;
    assert_eq!(
        echo(&o, "a", &CallContext::new()).await.conversation_text(),
        "{\"path\":\"a\"}\nremember to run the tests"
    );

    let b = Bench::new();
    let block =
        b.hook(HookEvent::PostToolUse, "t__echo", "echo 'output holds a key' >&2\nexit 2\n");
    let marker = b.path("after-block");
    let later = b.hook(HookEvent::PostToolUse, "*", &format!("touch {}\n", marker.display()));
    let o = b.start(vec![block, later]).await;
    let r = echo(&o, "a", &CallContext::new()).await;
    assert!(!r.ok);
    assert_eq!(
        r.conversation_text(),
        "(tool failed: the tool ran, but a PostToolUse hook blocked its result: output holds a key)"
    );
    assert_eq!(b.calls(), 1, "the tool ran");
    assert!(!marker.exists(), "a block stops the chain");

    let b = Bench::new();
    let replace = b.hook(
        HookEvent::PostToolUse,
        "t__echo",
        &answering(json!({"hookSpecificOutput": {
            "updatedMCPToolOutput": [{"type": "text", "text": "replaced"}]
        }})),
    );
    let o = b.start(vec![replace]).await;
    assert_eq!(echo(&o, "a", &CallContext::new()).await.conversation_text(), "replaced");
}

#[tokio::test]
async fn pre_tool_use_context_is_appended_to_the_output() {
    let b = Bench::new();
    let context = b.hook(
        HookEvent::PreToolUse,
        "t__echo",
        &answering(json!({"hookSpecificOutput": {"additionalContext": "the file is generated"}})),
    );
    let o = b.start(vec![context]).await;
    let ctx = CallContext::new().with_run_id("run-1");
    let first = o.execute(ToolCall::new("t__echo", json!({"path": "a"})).with_id("c1"), &ctx);
    let second = o.execute(ToolCall::new("t__echo", json!({"path": "b"})).with_id("c2"), &ctx);
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.conversation_text(), "{\"path\":\"a\"}\nthe file is generated");
    assert_eq!(second.conversation_text(), "{\"path\":\"b\"}\nthe file is generated");
}

/// Two calls of one tool at once, with no call ids (a Rust program's `execute`): each gets
/// the context its own hook run gave, even when the first call is still running when the
/// second one's hook answers.
#[tokio::test]
async fn concurrent_calls_without_ids_keep_their_own_context() {
    let b = Bench::new();
    let context = b.hook(
        HookEvent::PreToolUse,
        "t__slow",
        "input=$(cat)\ncase \"$input\" in *'\"path\":\"a\"'*) p=a;; *) p=b;; esac\nprintf '{\"hookSpecificOutput\":{\"additionalContext\":\"about %s\"}}' \"$p\"\n",
    );
    let schema = json!({"type": "object", "properties": {"path": {"type": "string"}}});
    let tools = ToolSet::new("t", ToolKind::Builtin).with_tool(
        ToolSpec::new("slow", "Echo, slowly for `a`", schema),
        |args: Value, _ctx| async move {
            if args["path"] == "a" {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(ToolOutput::text(args["path"].as_str().unwrap_or_default()))
        },
    );
    let builder = Orchestrator::builder(OrchestratorConfig::default()).provider(Arc::new(tools));
    let o = CommandHook::attach(builder, vec![context]).build().unwrap();
    assert!(o.warmup().await.is_ok());
    let ctx = CallContext::new().with_run_id("run-1");
    let call = |path: &str| o.execute(ToolCall::new("t__slow", json!({"path": path})), &ctx);
    let second = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        call("b").await
    };
    let (first, second) = tokio::join!(call("a"), second);
    assert_eq!(first.conversation_text(), "a\nabout a");
    assert_eq!(second.conversation_text(), "b\nabout b");
}

#[tokio::test]
async fn a_hook_past_its_timeout_is_killed_and_the_call_goes_on() {
    let b = Bench::new();
    let pid_file = b.path("hook.pid");
    std::fs::write(b.path("slow.sh"), format!("echo $$ > {}\nexec sleep 30\n", pid_file.display()))
        .unwrap();
    let slow = Arc::new(
        CommandHook::new(HookEvent::PreToolUse, "exec sh slow.sh", b.dir.path())
            .with_timeout(Duration::from_secs(1)),
    );
    let o = b.start(vec![slow]).await;
    let started = Instant::now();
    let r = echo(&o, "a", &CallContext::new()).await;
    assert_eq!(r.conversation_text(), r#"{"path":"a"}"#);
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let alive = std::process::Command::new("kill").args(["-0", pid.trim()]).status().unwrap();
    assert!(!alive.success(), "the hook's process {pid} is gone");
}

#[tokio::test]
async fn a_hook_whose_matcher_does_not_match_does_not_run() {
    let b = Bench::new();
    let skipped = b.path("skipped");
    let ran = b.path("ran");
    let other =
        b.hook(HookEvent::PreToolUse, "^other__", &format!("touch {}\n", skipped.display()));
    let post = b.hook(
        HookEvent::PostToolUse,
        "t__read|t__write",
        &format!("touch {}\n", skipped.display()),
    );
    let this = b.hook(HookEvent::PreToolUse, "^t__e", &format!("touch {}\n", ran.display()));
    let o = b.start(vec![other, post, this]).await;
    assert!(echo(&o, "a", &CallContext::new()).await.ok);
    assert!(!skipped.exists(), "hooks for other tools did not run");
    assert!(ran.exists(), "the matching hook ran");
}

#[tokio::test]
async fn the_hook_reads_claude_codes_input_on_stdin() {
    let b = Bench::new();
    let pre = b.hook(HookEvent::PreToolUse, "*", "cat > pre.json\n");
    let rewrite = b.hook(
        HookEvent::PreToolUse,
        "*",
        &answering(json!({"hookSpecificOutput": {"updatedInput": {"path": "b"}}})),
    );
    let post = b.hook(HookEvent::PostToolUse, "*", "cat > post.json\nprintf '%s|%s' \"$TOOLMUX_PROJECT_DIR\" \"$CLAUDE_PROJECT_DIR\" > env.txt\n");
    let o = b.start(vec![pre, rewrite, post]).await;
    let ctx = CallContext::new().with_run_id("run-7");
    let r = o.execute(ToolCall::new("t__echo", json!({"path": "a"})).with_id("call-3"), &ctx).await;
    assert!(r.ok, "{r:?}");
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(b.path(name)).unwrap()).unwrap()
    };
    let dir = b.dir.path().to_str().unwrap();
    assert_eq!(
        read("pre.json"),
        json!({
            "session_id": "run-7",
            "cwd": dir,
            "hook_event_name": "PreToolUse",
            "tool_name": "t__echo",
            "tool_input": {"path": "a", "file_path": "a"},
            "tool_use_id": "call-3"
        })
    );
    assert_eq!(
        read("post.json"),
        json!({
            "session_id": "run-7",
            "cwd": dir,
            "hook_event_name": "PostToolUse",
            "tool_name": "t__echo",
            "tool_input": {"path": "b", "file_path": "b"},
            "tool_use_id": "call-3",
            "tool_response": {"content": [{"type": "text", "text": "{\"path\":\"b\"}"}], "isError": false}
        })
    );
    assert_eq!(std::fs::read_to_string(b.path("env.txt")).unwrap(), format!("{dir}|{dir}"));
    assert!(Path::new(dir).join("pre.json").is_file(), "the hook ran in its folder");
}

/// A hook cannot reach the terminal toolmux runs in: `/dev/tty` fails at once, so a hook
/// that asks there (`sudo`, `ssh`'s host key question, git's credentials, `npx`'s "Ok to
/// proceed?") fails saying so instead of waiting for its timeout, and writes nothing over
/// the user's screen. Where the tests have no terminal this holds trivially;
/// `hooks_of_a_toolmux_in_a_terminal_cannot_reach_it` runs it again in a session that has
/// one.
#[tokio::test]
async fn hooks_cannot_open_the_controlling_terminal() {
    let b = Bench::new();
    std::fs::write(
        b.path("tty.sh"),
        "echo scribble > /dev/tty\nread x < /dev/tty\necho \"read $?\" >&2\nexit 2\n",
    )
    .unwrap();
    let asking = Arc::new(
        CommandHook::new(HookEvent::PreToolUse, "sh tty.sh", b.dir.path())
            .with_timeout(Duration::from_secs(20)),
    );
    let o = b.start(vec![asking]).await;
    let started = Instant::now();
    let text = echo(&o, "a", &CallContext::new()).await.conversation_text();
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}: {text}", started.elapsed());
    assert!(text.contains("denied"), "{text}");
    assert!(text.contains("/dev/tty: No such device or address"), "{text}");
    assert!(text.contains("read 2"), "{text}");
    assert_eq!(b.calls(), 0);
}

/// Claude Code hung on interactive hook commands until their timeout; here a hook run by a
/// toolmux that has a controlling terminal (its CLI, an agent's TUI) is in a session of its
/// own: in toolmux's session, `read < /dev/tty` stopped the hook (`SIGTTIN`, its group not
/// the terminal's foreground one) until its timeout, and its writes to `/dev/tty` landed on
/// the user's screen.
#[test]
fn hooks_of_a_toolmux_in_a_terminal_cannot_reach_it() {
    let test = "command_hooks::hooks_cannot_open_the_controlling_terminal";
    let (stdout, screen) = toolmux_test_support::terminal::rerun_in_a_terminal(test);
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(!screen.contains("scribble"), "{screen:?}");
}
