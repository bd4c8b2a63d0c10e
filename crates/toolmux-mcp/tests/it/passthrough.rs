//! Everything besides tools, passed through from server-everything over stdio: prompts,
//! resources and templates, subscriptions, and the server's questions (sampling,
//! elicitation, roots) and log lines reaching the caller of the call they belong to.

use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, ContentPart, ElicitationAction,
    ElicitationRequest, ElicitationResponse, InteractionHandler, LogMessage, LogSink, ResourceBody,
    Role, Root, RootsRequest, SamplingRequest, SamplingResponse, ToolError, ToolProvider,
};
use toolmux_mcp::McpProvider;

use crate::support;

/// Answers every question, recording what it was asked.
#[derive(Debug, Default)]
pub struct Answers {
    pub asked: Mutex<Vec<String>>,
}

#[async_trait]
impl InteractionHandler for Answers {
    async fn approve(&self, _request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Allow
    }

    async fn sample(&self, request: SamplingRequest) -> Result<SamplingResponse, ToolError> {
        let prompt = match &request.messages[0].content {
            ContentPart::Text { text } => text.clone(),
            other => format!("{other:?}"),
        };
        self.asked.lock().unwrap().push(format!("sample: {prompt}"));
        Ok(SamplingResponse {
            role: Role::Assistant,
            content: ContentPart::Text { text: format!("a haiku about {prompt}") },
            model: "test-model".into(),
            stop_reason: Some("endTurn".into()),
        })
    }

    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        self.asked.lock().unwrap().push(format!("elicit: {}", request.message));
        let mut content = toolmux_core::JsonObject::new();
        content.insert("name".into(), json!("Ada Lovelace"));
        content.insert("username".into(), json!("ada"));
        content.insert("email".into(), json!("ada@example.com"));
        Ok(ElicitationResponse { action: ElicitationAction::Accept, content: Some(content) })
    }

    async fn roots(&self, _request: RootsRequest) -> Result<Vec<Root>, ToolError> {
        self.asked.lock().unwrap().push("roots".into());
        Ok(vec![Root { uri: "file:///work/project".into(), name: Some("project".into()) }])
    }
}

/// A log sink that keeps every line.
pub fn log_lines() -> (LogSink, Arc<Mutex<Vec<LogMessage>>>) {
    let lines: Arc<Mutex<Vec<LogMessage>>> = Arc::default();
    let sink = {
        let lines = lines.clone();
        LogSink::new(move |m| lines.lock().unwrap().push(m))
    };
    (sink, lines)
}

/// The text of a log line.
pub fn line_text(line: &LogMessage) -> String {
    match &line.data {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn everything() -> McpProvider {
    McpProvider::new("everything", support::everything_stdio()).unwrap()
}

#[tokio::test]
async fn declaring_sampling_elicitation_and_roots_brings_their_tools() {
    let provider = everything();
    let mut names: Vec<String> =
        provider.list_tools().await.unwrap().into_iter().map(|t| t.name).collect();
    names.sort();
    // 12 unconditional tools, the task-based research tool, and one tool each for roots,
    // form elicitation, URL elicitation and sampling. The task-augmented sampling and
    // elicitation tools need capabilities toolmux does not declare (tasks of its own).
    assert_eq!(names.len(), 17, "{names:?}");
    let declared = [
        "get-roots-list",
        "trigger-elicitation-request",
        "trigger-url-elicitation",
        "trigger-sampling-request",
    ];
    for name in declared {
        assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
    }
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn prompts_are_listed_and_rendered_with_arguments() {
    let provider = everything();
    let prompts = provider.list_prompts().await.unwrap();
    let args = prompts.iter().find(|p| p.name == "args-prompt").expect("args-prompt listed");
    let arguments: Vec<(&str, bool)> =
        args.arguments.iter().map(|a| (a.name.as_str(), a.required)).collect();
    assert_eq!(arguments, [("city", true), ("state", false)]);
    let mut given = toolmux_core::JsonObject::new();
    given.insert("city".into(), json!("Paris"));
    given.insert("state".into(), json!("TX"));
    let prompt = provider.get_prompt("args-prompt", given, &CallContext::new()).await.unwrap();
    assert_eq!(prompt.messages.len(), 1);
    assert_eq!(prompt.messages[0].role, Role::User);
    assert_eq!(
        prompt.messages[0].content,
        ContentPart::Text { text: "What's weather in Paris, TX?".into() }
    );
    let unknown = provider
        .get_prompt("args-promt", toolmux_core::JsonObject::new(), &CallContext::new())
        .await
        .unwrap_err();
    let ToolError::UnknownPrompt { suggestions, .. } = &unknown else { panic!("{unknown:?}") };
    assert!(suggestions.iter().any(|s| s == "args-prompt"), "{unknown:?}");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn resources_and_templates_are_listed_and_read() {
    let provider = everything();
    let ctx = CallContext::new();
    let resources = provider.list_resources().await.unwrap();
    let document = resources
        .iter()
        .find(|r| r.uri.starts_with("demo://resource/static/document/"))
        .expect("a static document");
    let contents = provider.read_resource(&document.uri, &ctx).await.unwrap();
    let ResourceBody::Text(text) = &contents[0].body else { panic!("{contents:?}") };
    assert!(!text.is_empty());

    let templates = provider.list_resource_templates().await.unwrap();
    let uris: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert!(uris.contains(&"demo://resource/dynamic/text/{resourceId}"), "{uris:?}");
    let blob = templates
        .iter()
        .find(|t| t.uri_template == "demo://resource/dynamic/blob/{resourceId}")
        .expect("the blob template");
    let uri = blob.uri_template.replace("{resourceId}", "7");
    let contents = provider.read_resource(&uri, &ctx).await.unwrap();
    assert_eq!(contents[0].uri, uri);
    let ResourceBody::Blob(blob) = &contents[0].body else { panic!("{contents:?}") };
    assert!(!blob.is_empty());
    let text = provider.read_resource("demo://resource/dynamic/text/3", &ctx).await.unwrap();
    let ResourceBody::Text(text) = &text[0].body else { panic!("{text:?}") };
    assert!(text.starts_with("Resource 3:"), "{text}");

    let missing = provider.read_resource("demo://nothing/here", &ctx).await.unwrap_err();
    assert!(matches!(missing, ToolError::UnknownResource { .. }), "{missing:?}");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn subscribed_resources_report_their_updates() {
    let provider = everything();
    let mut updates = provider.resource_updates().expect("updates offered");
    let uri = "demo://resource/dynamic/text/1";
    provider.subscribe_resource(uri).await.unwrap();
    // The tool sends one update for every subscribed resource at once, then every 5 s.
    provider.call("toggle-subscriber-updates", json!({}), &CallContext::new()).await.unwrap();
    let updated = tokio::time::timeout(Duration::from_secs(10), updates.next()).await;
    assert_eq!(updated.expect("an update within 10 s").as_deref(), Some(uri));
    provider.unsubscribe_resource(uri).await.unwrap();
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn sampling_requests_are_answered_by_the_callers_handler() {
    let provider = everything();
    let answers = Arc::new(Answers::default());
    let ctx = CallContext::new().with_handler(answers.clone());
    let out = provider
        .call("trigger-sampling-request", json!({"prompt": "rust", "maxTokens": 50}), &ctx)
        .await
        .unwrap();
    let text = out.to_text();
    assert!(
        text.contains("a haiku about Resource trigger-sampling-request context: rust"),
        "{text}"
    );
    assert!(text.contains("test-model"), "{text}");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn elicitations_are_answered_by_the_callers_handler() {
    let provider = everything();
    let answers = Arc::new(Answers::default());
    let ctx = CallContext::new().with_handler(answers.clone());
    let out = provider.call("trigger-elicitation-request", json!({}), &ctx).await.unwrap();
    let text = out.to_text();
    assert!(text.contains("- Name: Ada Lovelace"), "{text}");
    assert_eq!(
        answers.asked.lock().unwrap().as_slice(),
        ["elicit: Please provide inputs for the following fields:"]
    );
    // Without a handler, nobody can answer: the elicitation is declined.
    let out =
        provider.call("trigger-elicitation-request", json!({}), &CallContext::new()).await.unwrap();
    assert!(out.to_text().contains("declined"), "{}", out.to_text());
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn roots_come_from_the_caller_and_log_lines_reach_its_sink() {
    let provider = everything();
    let (sink, lines) = log_lines();
    let ctx = CallContext::new().with_handler(Arc::new(Answers::default())).with_log(sink);
    let out = provider.call("get-roots-list", json!({}), &ctx).await.unwrap();
    let text = out.to_text();
    assert!(text.contains("1. project") && text.contains("file:///work/project"), "{text}");
    support::wait_for("the roots log line", Duration::from_secs(5), || {
        lines.lock().unwrap().iter().any(|l| line_text(l).contains("1 root(s) received"))
    })
    .await;
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn simulated_logging_reaches_the_callers_sink() {
    let provider = everything();
    let (sink, lines) = log_lines();
    let ctx = CallContext::new().with_log(sink);
    provider.call("toggle-simulated-logging", json!({}), &ctx).await.unwrap();
    // One line of a random level is sent at once; `debug` was asked for, so any level.
    support::wait_for("a simulated log line", Duration::from_secs(5), || {
        lines.lock().unwrap().iter().any(|l| line_text(l).contains("message"))
    })
    .await;
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn after_a_crash_resources_work_again_and_subscriptions_are_renewed() {
    let provider = everything();
    let mut updates = provider.resource_updates().unwrap();
    let uri = "demo://resource/dynamic/text/1";
    provider.subscribe_resource(uri).await.unwrap();
    let pid = provider.server_pid().unwrap();
    let group = rustix::process::Pid::from_raw(pid).unwrap();
    rustix::process::kill_process_group(group, rustix::process::Signal::KILL).unwrap();
    support::assert_group_gone(pid).await;
    // The first request may still meet the dead connection; the next one restarts it.
    let ctx = CallContext::new();
    let mut read = provider.read_resource(uri, &ctx).await;
    if let Err(error) = &read {
        assert!(error.is_transient(), "{error:?}");
        read = provider.read_resource(uri, &ctx).await;
    }
    assert_eq!(read.unwrap()[0].uri, uri);
    assert_ne!(provider.server_pid(), Some(pid));
    provider.call("toggle-subscriber-updates", json!({}), &ctx).await.unwrap();
    // Updates come at once for subscriptions renewed in time, else within 5 s.
    let updated = tokio::time::timeout(Duration::from_secs(10), updates.next()).await;
    assert_eq!(updated.expect("an update within 10 s").as_deref(), Some(uri));
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn questions_and_log_lines_pass_through_streamable_http_too() {
    let port = support::free_port();
    let args = [support::everything_js().display().to_string(), "streamableHttp".into()];
    let server = support::ServerProcess::start("node", &args, port);
    let config = toolmux_mcp::McpServerConfig::remote(
        toolmux_mcp::TransportKind::Http,
        format!("{}/mcp", server.base),
    );
    let provider = McpProvider::new("everything", config).unwrap();
    let (sink, lines) = log_lines();
    let ctx = CallContext::new().with_handler(Arc::new(Answers::default())).with_log(sink);
    let out = provider
        .call("trigger-sampling-request", json!({"prompt": "http", "maxTokens": 10}), &ctx)
        .await
        .unwrap();
    assert!(out.to_text().contains("a haiku about Resource trigger-sampling-request"), "{out:?}");
    let out = provider.call("get-roots-list", json!({}), &ctx).await.unwrap();
    assert!(out.to_text().contains("file:///work/project"), "{out:?}");
    support::wait_for("the roots log line", Duration::from_secs(5), || {
        lines.lock().unwrap().iter().any(|l| line_text(l).contains("root(s) received"))
    })
    .await;
    let prompts = provider.list_prompts().await.unwrap();
    assert!(prompts.iter().any(|p| p.name == "simple-prompt"), "{prompts:?}");
    provider.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_server_with_tools_only_has_no_prompts_resources_or_updates() {
    let provider = McpProvider::new("fixture", support::fixture_stdio("ok")).unwrap();
    // Before the server runs nobody knows whether it sends updates.
    assert!(provider.resource_updates().is_some());
    provider.warmup().await.unwrap();
    assert!(provider.resource_updates().is_none());
    assert!(provider.list_prompts().await.unwrap().is_empty());
    assert!(provider.list_resources().await.unwrap().is_empty());
    assert!(provider.list_resource_templates().await.unwrap().is_empty());
    let ctx = CallContext::new();
    let prompt = provider.get_prompt("p", toolmux_core::JsonObject::new(), &ctx).await;
    assert!(matches!(prompt, Err(ToolError::UnknownPrompt { .. })), "{prompt:?}");
    let read = provider.read_resource("file:///x", &ctx).await;
    assert!(matches!(read, Err(ToolError::UnknownResource { .. })), "{read:?}");
    let subscribed = provider.subscribe_resource("file:///x").await;
    assert!(matches!(subscribed, Err(ToolError::UnknownResource { .. })), "{subscribed:?}");
    provider.shutdown().await.unwrap();
}

/// A provider whose prompt and resource take until they are cancelled; `started` counts
/// the ones begun.
#[derive(Debug)]
struct Slow {
    started: tokio::sync::watch::Sender<usize>,
}

#[async_trait]
impl ToolProvider for Slow {
    fn kind(&self) -> toolmux_core::ToolKind {
        toolmux_core::ToolKind::Builtin
    }

    fn namespace(&self) -> &str {
        "slow"
    }

    async fn list_tools(&self) -> Result<Vec<toolmux_core::ToolSpec>, ToolError> {
        Ok(Vec::new())
    }

    async fn call(
        &self,
        name: &str,
        _arguments: Value,
        _ctx: &CallContext,
    ) -> Result<toolmux_core::ToolOutput, ToolError> {
        Err(ToolError::UnknownTool { name: name.to_owned(), suggestions: Vec::new() })
    }

    async fn list_prompts(&self) -> Result<Vec<toolmux_core::PromptSpec>, ToolError> {
        Ok(vec![toolmux_core::PromptSpec::new("slow", "Takes forever")])
    }

    async fn get_prompt(
        &self,
        name: &str,
        _arguments: toolmux_core::JsonObject,
        ctx: &CallContext,
    ) -> Result<toolmux_core::Prompt, ToolError> {
        self.started.send_modify(|n| *n += 1);
        ctx.cancel_token().cancelled().await;
        Err(ToolError::Cancelled { tool: name.to_owned() })
    }

    async fn list_resources(&self) -> Result<Vec<toolmux_core::ResourceSpec>, ToolError> {
        Ok(vec![toolmux_core::ResourceSpec::new("slow://r", "r", "Takes forever")])
    }

    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<toolmux_core::ResourceContents>, ToolError> {
        self.started.send_modify(|n| *n += 1);
        ctx.cancel_token().cancelled().await;
        Err(ToolError::Cancelled { tool: uri.to_owned() })
    }
}

#[tokio::test]
async fn prompts_and_reads_keep_the_request_timeout_and_the_callers_cancellation() {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let slow = Arc::new(Slow { started: tokio::sync::watch::Sender::new(0) });
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let options = toolmux_mcp::server::ServeOptions::default();
    let (bound, server) =
        toolmux_mcp::server::bind_http(slow.clone(), addr, options, shutdown.clone())
            .await
            .unwrap();
    let config = toolmux_mcp::McpServerConfig::remote(
        toolmux_mcp::TransportKind::Http,
        format!("http://{bound}/mcp"),
    )
    .with_request_timeout(Duration::from_millis(300));
    let provider = McpProvider::new("slow", config).unwrap();
    let no_args = toolmux_core::JsonObject::new;

    let timed_out = provider.get_prompt("slow", no_args(), &CallContext::new()).await.unwrap_err();
    expect_test::expect!["timeout: `slow` did not finish within 300ms"]
        .assert_eq(&timed_out.to_string());
    let timed_out = provider.read_resource("slow://r", &CallContext::new()).await.unwrap_err();
    assert!(matches!(timed_out, ToolError::Timeout { .. }), "{timed_out:?}");

    // Cancelled once the server is working on it.
    for (i, read) in [false, true].into_iter().enumerate() {
        // Two began and timed out above.
        let begun = 3 + i;
        let cancel = tokio_util::sync::CancellationToken::new();
        let ctx = CallContext::new().with_cancel(cancel.clone());
        let request = async {
            if read {
                provider.read_resource("slow://r", &ctx).await.map(drop)
            } else {
                provider.get_prompt("slow", no_args(), &ctx).await.map(drop)
            }
        };
        let cancel_once_started = async {
            let mut started = slow.started.subscribe();
            started.wait_for(|n| *n >= begun).await.unwrap();
            cancel.cancel();
        };
        let (cancelled, ()) = tokio::time::timeout(
            Duration::from_secs(5),
            futures::future::join(request, cancel_once_started),
        )
        .await
        .unwrap();
        assert!(matches!(cancelled, Err(ToolError::Cancelled { .. })), "{cancelled:?}");
    }

    // The server still answers afterwards.
    let prompts = provider.list_prompts().await.unwrap();
    assert_eq!(prompts[0].name, "slow");
    provider.shutdown().await.unwrap();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap().unwrap();
}

/// A handler that never answers a sampling request; `waiting` is true while one waits.
#[derive(Debug, Default)]
struct NeverAnswers {
    waiting: Arc<std::sync::atomic::AtomicBool>,
}

/// Clears `waiting` when the question is dropped.
struct Waiting(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait]
impl InteractionHandler for NeverAnswers {
    async fn approve(&self, _request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Allow
    }

    async fn sample(&self, _request: SamplingRequest) -> Result<SamplingResponse, ToolError> {
        self.waiting.store(true, std::sync::atomic::Ordering::SeqCst);
        let _waiting = Waiting(self.waiting.clone());
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_call_dropped_while_its_caller_is_asked_withdraws_the_question() {
    let provider = everything();
    let handler = Arc::new(NeverAnswers::default());
    let waiting = handler.waiting.clone();
    let ctx = CallContext::new().with_handler(handler);
    let call = provider.call("trigger-sampling-request", json!({"prompt": "x"}), &ctx);
    let asked = async {
        let waiting = waiting.clone();
        support::wait_for("the question", Duration::from_secs(10), move || {
            waiting.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await;
    };
    // Whichever ends first, the call future is dropped without cancelling its context,
    // as a stateless gateway does when it must ask its own client first.
    tokio::select! {
        out = call => panic!("the call ended: {out:?}"),
        () = asked => {}
    }
    support::wait_for("the question withdrawn", Duration::from_secs(5), || {
        !waiting.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    let out = provider.call("echo", json!({"message": "after"}), &CallContext::new()).await;
    assert_eq!(out.unwrap().to_text(), "Echo: after");
    provider.shutdown().await.unwrap();
}

/// A person who takes a second to answer.
#[derive(Debug)]
pub struct SlowPerson;

#[async_trait]
impl InteractionHandler for SlowPerson {
    async fn approve(&self, _request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Allow
    }

    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        // Thinking, not waiting for anything: longer than the request timeout below.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Answers::default().elicit(request).await
    }
}

#[tokio::test]
async fn waiting_for_the_callers_answer_does_not_time_the_call_out() {
    let config = support::everything_stdio().with_request_timeout(Duration::from_millis(300));
    let provider = McpProvider::new("everything", config).unwrap();
    let ctx = CallContext::new().with_handler(Arc::new(SlowPerson));
    let out = provider.call("trigger-elicitation-request", json!({}), &ctx).await.unwrap();
    assert!(out.to_text().contains("- Name: Ada Lovelace"), "{}", out.to_text());
    provider.shutdown().await.unwrap();
}
