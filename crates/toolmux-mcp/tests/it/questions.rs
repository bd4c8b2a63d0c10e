//! A server's questions asked while it renders a prompt for one of two callers at once,
//! each with a handler of its own: the question reaches its own caller's handler where the
//! protocol says which request it belongs to (streamable HTTP, 2026-07-28), and is refused
//! where it does not (stdio on the handshake revision), never shown to the other caller.
//! The server is this crate's own (`toolmux-mcp-serve-fixture`), whose prompt
//! `ask_together` asks only once both renderings are under way.

use async_trait::async_trait;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, ElicitationAction, ElicitationRequest,
    ElicitationResponse, InteractionHandler, JsonObject, Prompt, ToolError, ToolProvider,
};
use toolmux_mcp::{McpProvider, McpServerConfig, ProtocolMode, TransportKind};

use crate::support;

/// A caller who answers every form with "from NAME", recording what it was asked.
#[derive(Debug)]
struct Person {
    name: &'static str,
    asked: Mutex<Vec<String>>,
}

#[async_trait]
impl InteractionHandler for Person {
    async fn approve(&self, _request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Allow
    }

    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        self.asked.lock().unwrap().push(request.message);
        let mut content = JsonObject::new();
        content.insert("answer".into(), json!(format!("from {}", self.name)));
        Ok(ElicitationResponse { action: ElicitationAction::Accept, content: Some(content) })
    }
}

/// Renders `ask_together` for Ann and for Bob at once, each with a handler of their own;
/// returns each one's result and what each was asked.
async fn ask_both(provider: &McpProvider) -> [(Result<Prompt, ToolError>, Vec<String>); 2] {
    let people = ["Ann", "Bob"].map(|name| Arc::new(Person { name, asked: Mutex::default() }));
    let render = |person: &Arc<Person>| {
        let ctx = CallContext::new().with_handler(person.clone());
        let mut arguments = JsonObject::new();
        arguments.insert("who".into(), json!(person.name));
        async move { provider.get_prompt("ask_together", arguments, &ctx).await }
    };
    let both = async { tokio::join!(render(&people[0]), render(&people[1])) };
    let (ann, bob) = tokio::time::timeout(Duration::from_secs(30), both).await.expect("answered");
    let asked = |i: usize| people[i].asked.lock().unwrap().clone();
    [(ann, asked(0)), (bob, asked(1))]
}

fn text(prompt: &Prompt) -> String {
    match &prompt.messages[0].content {
        toolmux_core::ContentPart::Text { text } => text.clone(),
        other => format!("{other:?}"),
    }
}

/// Each caller was asked its own question and its prompt has its own answer.
fn assert_each_answered_its_own(results: [(Result<Prompt, ToolError>, Vec<String>); 2], how: &str) {
    for ((prompt, asked), name) in results.into_iter().zip(["Ann", "Bob"]) {
        let prompt = prompt.unwrap_or_else(|e| panic!("{how}: {name}: {e}"));
        assert_eq!(text(&prompt), format!("{name} was answered: from {name}"), "{how}");
        assert_eq!(asked, [format!("a question for {name}")], "{how}: {name}");
    }
}

fn stdio(mode: ProtocolMode) -> McpProvider {
    let config = McpServerConfig::stdio(env!("CARGO_BIN_EXE_toolmux-mcp-serve-fixture"), ["stdio"])
        .with_base_dir(support::run_dir())
        .with_protocol(mode);
    McpProvider::new("fixture", config).unwrap()
}

/// Over stdio a handshake-revision question names no request: with both in flight it is
/// refused, saying why, and neither caller sees the other's question. (It went to the
/// caller who asked last, who was shown both questions and answered both prompts.)
#[tokio::test]
async fn over_stdio_a_question_of_one_of_two_callers_is_refused() {
    let provider = stdio(ProtocolMode::Legacy);
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some("2025-11-25"));
    for ((prompt, asked), name) in ask_both(&provider).await.into_iter().zip(["Ann", "Bob"]) {
        assert!(asked.is_empty(), "{name} was asked {asked:?}");
        let error = prompt.expect_err(name).report();
        assert!(
            error.contains("cannot tell which request this elicitation/create belongs to")
                && error.contains("2 requests are in flight"),
            "{name}: {error}"
        );
    }
    // One caller alone is asked: `roundtrip`'s prompt test.
    provider.shutdown().await.unwrap();
}

/// On 2026-07-28 the questions come inside each request's result: each its own.
#[tokio::test]
async fn on_2026_07_28_each_caller_answers_its_own_question() {
    let provider = stdio(ProtocolMode::Auto);
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some("2026-07-28"));
    assert_each_answered_its_own(ask_both(&provider).await, "2026-07-28");
    provider.shutdown().await.unwrap();
}

/// The serve fixture over streamable HTTP, stopped (its stdin closed, then killed) when
/// dropped.
struct HttpFixture {
    child: Child,
    url: String,
}

impl HttpFixture {
    fn start() -> HttpFixture {
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolmux-mcp-serve-fixture"))
            .args(["http", "127.0.0.1:0"])
            .current_dir(support::run_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let stdout = child.stdout.take().unwrap();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let url = line.trim().strip_prefix("listening ").unwrap_or_else(|| panic!("{line}"));
        HttpFixture { url: url.to_owned(), child }
    }
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Over streamable HTTP a handshake-revision question comes on the response stream of
/// the request it belongs to: each reaches its own caller. (It went to the caller who
/// asked last.)
#[tokio::test]
async fn over_streamable_http_each_caller_answers_its_own_question() {
    let server = HttpFixture::start();
    let config = McpServerConfig::remote(TransportKind::Http, server.url.clone())
        .with_protocol(ProtocolMode::Legacy);
    let provider = McpProvider::new("fixture", config).unwrap();
    provider.warmup().await.unwrap();
    assert_eq!(provider.protocol_version().as_deref(), Some("2025-11-25"));
    assert_each_answered_its_own(ask_both(&provider).await, "streamable HTTP");
    provider.shutdown().await.unwrap();
}
