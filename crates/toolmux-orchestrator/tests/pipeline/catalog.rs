//! Prompts and resources through the orchestrator: qualified prompt names, routing,
//! unknown names, missing arguments, resource routing by listing, template and probing,
//! duplicate URIs, bounds, size cap, subscriptions and merged updates; and what a tool asks
//! its caller (log lines, elicitation, sampling, roots) reaching it through the pipeline.

use crate::start;
use async_trait::async_trait;
use expect_test::expect;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, Completion, CompletionRef, CompletionRequest,
    ContentPart, ElicitationAction, ElicitationRequest, ElicitationResponse, InteractionHandler,
    JsonObject, LogLevel, LogMessage, LogSink, Message, Prompt, PromptArgument, PromptSpec,
    ResourceBody, ResourceContents, ResourceSpec, ResourceTemplate, ResourceUpdateNotifier,
    ResourceUpdates, Role, Root, RootsRequest, SamplingRequest, SamplingResponse, ToolAnnotations,
    ToolCall, ToolError, ToolKind, ToolListChanges, ToolListNotifier, ToolOutput, ToolProvider,
    ToolSet, ToolSpec,
};
use toolmux_orchestrator::{
    FilteredView, Orchestrator, OrchestratorConfig, PermissionRules, QueueConfig, RetryPolicy,
    Severity, ToolSettings,
};
use toolmux_test_support::mock::{Behavior, MockProvider};

/// A provider of prompts and resources (and no tools).
#[derive(Debug, Default)]
struct Library {
    namespace: String,
    prompts: Vec<PromptSpec>,
    resources: Vec<(ResourceSpec, String)>,
    templates: Vec<ResourceTemplate>,
    /// URIs read but not listed (reached only by probing).
    hidden: Vec<(String, String)>,
    failing_prompts: bool,
    hanging_reads: bool,
    /// Offers one tool, `status`.
    with_status_tool: bool,
    updates: Option<ResourceUpdateNotifier>,
    changes: Option<ToolListNotifier>,
    subscribed: Mutex<Vec<String>>,
    reads: Mutex<Vec<String>>,
}

impl Library {
    fn new(namespace: &str) -> Self {
        Library { namespace: namespace.into(), ..Library::default() }
    }

    fn prompt(mut self, spec: PromptSpec) -> Self {
        self.prompts.push(spec);
        self
    }

    fn resource(mut self, uri: &str, name: &str, text: &str) -> Self {
        self.resources.push((ResourceSpec::new(uri, name, "d"), text.into()));
        self
    }

    fn template(mut self, template: &str) -> Self {
        self.templates.push(ResourceTemplate::new(template, "t", "d"));
        self
    }

    fn hidden(mut self, uri: &str, text: &str) -> Self {
        self.hidden.push((uri.into(), text.into()));
        self
    }

    fn with_updates(mut self) -> Self {
        self.updates = Some(ResourceUpdateNotifier::new());
        self
    }

    fn with_changes(mut self, changes: &ToolListNotifier) -> Self {
        self.changes = Some(changes.clone());
        self
    }

    fn notify(&self, uri: &str) {
        self.updates.as_ref().expect("made with_updates").notify(uri);
    }

    fn reads(&self) -> Vec<String> {
        self.reads.lock().expect("not poisoned").clone()
    }

    fn subscribed(&self) -> Vec<String> {
        self.subscribed.lock().expect("not poisoned").clone()
    }
}

#[async_trait]
impl ToolProvider for Library {
    fn kind(&self) -> ToolKind {
        ToolKind::Builtin
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        let status = ToolSpec::new("status", "Says how it is", json!({"type": "object"}));
        Ok(if self.with_status_tool { vec![status] } else { Vec::new() })
    }

    /// `status` links to each of the provider's resources, and to one it does not list.
    async fn call(&self, name: &str, _: Value, _: &CallContext) -> Result<ToolOutput, ToolError> {
        if name != "status" || !self.with_status_tool {
            return Err(ToolError::UnknownTool { name: name.into(), suggestions: Vec::new() });
        }
        let link = |uri: &str| ContentPart::ResourceLink {
            uri: uri.to_owned(),
            name: uri.to_owned(),
            description: None,
            mime_type: None,
        };
        let mut content: Vec<ContentPart> =
            self.resources.iter().map(|(r, _)| link(&r.uri)).collect();
        content.extend(self.hidden.iter().map(|(uri, _)| link(uri)));
        Ok(ToolOutput { content, ..ToolOutput::default() })
    }

    async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        if self.failing_prompts {
            return Err(ToolError::Transport {
                provider: self.namespace.clone(),
                message: "connection refused".into(),
                source: None,
            });
        }
        Ok(self.prompts.clone())
    }

    async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        _: &CallContext,
    ) -> Result<Prompt, ToolError> {
        if !self.prompts.iter().any(|p| p.name == name) {
            return Err(ToolError::UnknownPrompt { name: name.into(), suggestions: Vec::new() });
        }
        // The arguments in each place a prompt carries text: its description, a text
        // message and an embedded resource.
        let arguments = Value::Object(arguments).to_string();
        let embedded = ContentPart::Resource {
            uri: format!("{}://prompts/{name}", self.namespace),
            mime_type: Some("application/json".into()),
            text: Some(arguments.clone()),
            blob: None,
        };
        Ok(Prompt {
            description: Some(format!("{name} with {arguments}")),
            messages: vec![
                Message::user_text(format!("{}/{name} {arguments}", self.namespace)),
                Message::user(embedded),
            ],
        })
    }

    /// Says who was asked what; `many` gets 150 values.
    async fn complete(
        &self,
        request: CompletionRequest,
        _: &CallContext,
    ) -> Result<Completion, ToolError> {
        if request.argument == "many" {
            let values = (0..150).map(|i| format!("v{i}")).collect();
            return Ok(Completion { values, total: Some(150), has_more: false });
        }
        let reference = match &request.reference {
            CompletionRef::Prompt(name) => format!("prompt {name}"),
            CompletionRef::ResourceTemplate(uri) => format!("template {uri}"),
        };
        let context: Vec<String> =
            request.context.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let said = format!(
            "{}: {reference} {}={} [{}]",
            self.namespace,
            request.argument,
            request.value,
            context.join(",")
        );
        Ok(Completion { values: vec![said], total: None, has_more: false })
    }

    async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        Ok(self.resources.iter().map(|(spec, _)| spec.clone()).collect())
    }

    async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        Ok(self.templates.clone())
    }

    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        self.reads.lock().expect("not poisoned").push(uri.to_owned());
        if self.hanging_reads {
            ctx.cancel_token().cancelled().await;
            return Err(ToolError::Cancelled { tool: uri.into() });
        }
        let listed = self.resources.iter().map(|(s, t)| (&s.uri, t));
        if let Some((_, text)) =
            listed.chain(self.hidden.iter().map(|(u, t)| (u, t))).find(|(u, _)| *u == uri)
        {
            return Ok(vec![ResourceContents::text(
                uri,
                "text/plain",
                format!("{}: {text}", self.namespace),
            )]);
        }
        if let Some(vars) = self.templates.iter().find_map(|t| t.match_uri(uri)) {
            return Ok(vec![ResourceContents::text(
                uri,
                "text/plain",
                format!("{}: {vars:?}", self.namespace),
            )]);
        }
        Err(ToolError::UnknownResource { uri: uri.into() })
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.subscribed.lock().expect("not poisoned").push(uri.to_owned());
        Ok(())
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        self.subscribed.lock().expect("not poisoned").retain(|u| u != uri);
        Ok(())
    }

    fn resource_updates(&self) -> Option<ResourceUpdates> {
        self.updates.as_ref().map(ResourceUpdateNotifier::subscribe)
    }

    fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        self.changes.as_ref().map(ToolListNotifier::subscribe)
    }

    fn resource_list_changes(&self) -> Option<ToolListChanges> {
        self.changes.as_ref().map(ToolListNotifier::subscribe)
    }
}

fn git() -> Library {
    Library::new("git")
        .prompt(
            PromptSpec::new("review", "Review a change")
                .with_argument(PromptArgument::required("change", "the change"))
                .with_argument(PromptArgument::optional("focus", "what to look at"))
                .with_argument(PromptArgument::required("tone", "how to say it")),
        )
        .prompt(PromptSpec::new("commit message", "Write a commit message"))
        .resource("repo://main/README", "readme", "hello")
        .resource("shared://config", "config", "from git")
        .template("repo://{branch}/log")
}

fn docs() -> Library {
    Library::new("docs")
        .prompt(PromptSpec::new("summarize", "Summarize a page"))
        .resource("shared://config", "config", "from docs")
        .resource("docs://index", "index", "pages")
        .template("repo://{branch}/{+path}")
        .hidden("other://secret-page", "found by asking")
}

async fn library(providers: Vec<Arc<dyn ToolProvider>>) -> Orchestrator {
    start(OrchestratorConfig::default(), providers).await
}

fn text(contents: &[ResourceContents]) -> String {
    contents
        .iter()
        .map(|c| match &c.body {
            ResourceBody::Text(t) => t.clone(),
            ResourceBody::Blob(b) => format!("<blob {} bytes>", b.len()),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn message_text(prompt: &Prompt) -> String {
    match &prompt.messages[0].content {
        ContentPart::Text { text } => text.clone(),
        other => format!("{other:?}"),
    }
}

fn args(value: Value) -> JsonObject {
    value.as_object().cloned().expect("an object")
}

#[tokio::test(start_paused = true)]
async fn prompts_are_listed_under_qualified_names() {
    let o = library(vec![Arc::new(git()), Arc::new(docs())]).await;
    let names: Vec<String> = o.list_prompts().await.unwrap().into_iter().map(|p| p.name).collect();
    expect![[r#"["git__review", "git__commit_message", "docs__summarize"]"#]]
        .assert_eq(&format!("{names:?}"));
}

#[tokio::test(start_paused = true)]
async fn prompts_route_to_their_provider_by_local_name() {
    let o = library(vec![Arc::new(git()), Arc::new(docs())]).await;
    let ctx = CallContext::new();
    let p = o.get_prompt("git__commit_message", JsonObject::new(), &ctx).await.unwrap();
    assert_eq!(message_text(&p), "git/commit message {}");
    let given = args(json!({"change": "abc", "tone": "kind"}));
    let p = o.get_prompt("git__review", given, &ctx).await.unwrap();
    assert_eq!(message_text(&p), r#"git/review {"change":"abc","tone":"kind"}"#);
    assert_eq!(p.messages[0].role, Role::User);
    // Through the trait object, as the MCP server sees the orchestrator.
    let provider: Arc<dyn ToolProvider> = Arc::new(o.clone());
    let p = provider.get_prompt("docs__summarize", JsonObject::new(), &ctx).await.unwrap();
    assert_eq!(message_text(&p), "docs/summarize {}");
}

#[tokio::test(start_paused = true)]
async fn unknown_prompts_name_the_closest() {
    let o = library(vec![Arc::new(git()), Arc::new(docs())]).await;
    let ctx = CallContext::new();
    let check = |e: ToolError, expect: expect_test::Expect| expect.assert_eq(&e.report());
    check(
        o.get_prompt("git__reveiw", JsonObject::new(), &ctx).await.unwrap_err(),
        expect!["unknown prompt `git__reveiw`; did you mean `git__review`?"],
    );
    check(
        o.get_prompt("summarize", JsonObject::new(), &ctx).await.unwrap_err(),
        expect!["unknown prompt `summarize`; did you mean `docs__summarize`?"],
    );
    let e = o.get_prompt("zzz", JsonObject::new(), &ctx).await.unwrap_err();
    assert_eq!(e.code(), "unknown_prompt");
    assert_eq!(e.report(), "unknown prompt `zzz`");
}

#[tokio::test(start_paused = true)]
async fn missing_required_arguments_are_named_before_the_provider_is_asked() {
    let o = library(vec![Arc::new(git())]).await;
    let ctx = CallContext::new();
    let e = o.get_prompt("git__review", args(json!({"focus": "tests"})), &ctx).await.unwrap_err();
    expect![
        "invalid arguments for `git__review`: at /: missing required arguments `change`, `tone`"
    ]
    .assert_eq(&e.report());
    assert_eq!(e.party(), toolmux_core::Party::Caller);
    let e = o.get_prompt("git__review", args(json!({"change": "x"})), &ctx).await.unwrap_err();
    expect!["invalid arguments for `git__review`: at /: missing required argument `tone`"]
        .assert_eq(&e.report());
}

#[tokio::test(start_paused = true)]
async fn a_failing_prompt_listing_hides_only_its_own_prompts() {
    let broken = Library { failing_prompts: true, ..git() };
    let o = library(vec![Arc::new(broken), Arc::new(docs())]).await;
    let names: Vec<String> = o.list_prompts().await.unwrap().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["docs__summarize"]);
    let e = o.get_prompt("git__review", JsonObject::new(), &CallContext::new()).await.unwrap_err();
    assert_eq!(e.code(), "unknown_prompt");
}

#[tokio::test(start_paused = true)]
async fn prompt_names_keep_the_budget_and_duplicates_are_left_out() {
    let long = "p".repeat(80);
    let lib = Library::new("lib")
        .prompt(PromptSpec::new(&long, "long"))
        .prompt(PromptSpec::new("twice", "first"))
        .prompt(PromptSpec::new("twice", "second"));
    let o = Orchestrator::builder(OrchestratorConfig::default())
        .provider(Arc::new(lib))
        .build()
        .unwrap();
    let report = o.warmup().await;
    let warnings: Vec<&str> = report
        .problems
        .iter()
        .filter(|p| p.severity == Severity::Warning)
        .map(|p| p.message.as_str())
        .collect();
    assert_eq!(warnings, ["provider `lib` lists prompt `twice` twice; the second is left out"]);
    let prompts = o.list_prompts().await.unwrap();
    assert_eq!(prompts.len(), 2);
    assert_eq!(prompts[1].description.as_deref(), Some("first"));
    let name = &prompts[0].name;
    assert_eq!(name.len(), 64);
    let p = o.get_prompt(name, JsonObject::new(), &CallContext::new()).await.unwrap();
    assert_eq!(message_text(&p), format!("lib/{long} {{}}"));
}

#[tokio::test(start_paused = true)]
async fn resources_and_templates_of_every_provider_are_listed_first_uri_wins_later_aliased() {
    let o = library(vec![Arc::new(git()), Arc::new(docs())]).await;
    let resources: Vec<String> = o
        .list_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| format!("{} {}", r.uri, r.name))
        .collect();
    expect![[r#"["repo://main/README readme", "shared://config config", "toolmux://docs/shared://config config", "docs://index index"]"#]]
        .assert_eq(&format!("{resources:?}"));
    let templates: Vec<String> =
        o.list_resource_templates().await.unwrap().into_iter().map(|t| t.uri_template).collect();
    assert_eq!(templates, ["repo://{branch}/log", "repo://{branch}/{+path}"]);
    let read = o.read_resource("shared://config", &CallContext::new()).await.unwrap();
    assert_eq!(text(&read), "git: from git");
}

/// A URI two providers list (two instances of one server) is the first's under its own
/// name and the second's under `toolmux://{namespace}/{uri}`: read, subscribed to and
/// updated by that name, the second provider asked by its own.
#[tokio::test(start_paused = true)]
async fn a_shadowed_resource_is_reached_by_its_alias() {
    let (git, docs) = (Arc::new(git().with_updates()), Arc::new(docs().with_updates()));
    let o = library(vec![git.clone(), docs.clone()]).await;
    let mut updates = o.resource_updates().expect("providers send updates");
    o.list_resources().await.unwrap();
    let ctx = CallContext::new();
    let alias = "toolmux://docs/shared://config";
    let read = o.read_resource(alias, &ctx).await.unwrap();
    assert_eq!(text(&read), "docs: from docs");
    assert_eq!(read[0].uri, alias, "named as the client asked");
    assert_eq!(docs.reads(), ["shared://config"]);
    let read = o.read_resource("shared://config", &ctx).await.unwrap();
    assert_eq!(text(&read), "git: from git");
    o.subscribe_resource(alias).await.unwrap();
    assert_eq!(docs.subscribed(), ["shared://config"]);
    assert!(git.subscribed().is_empty());
    docs.notify("shared://config");
    let uri = tokio::time::timeout(Duration::from_secs(1), updates.next()).await.unwrap();
    assert_eq!(uri.as_deref(), Some(alias));
    git.notify("shared://config");
    let uri = tokio::time::timeout(Duration::from_secs(1), updates.next()).await.unwrap();
    assert_eq!(uri.as_deref(), Some("shared://config"));
    o.unsubscribe_resource(alias).await.unwrap();
    assert!(docs.subscribed().is_empty());
    // An alias of no provider is an unknown resource like any other URI.
    let e = o.read_resource("toolmux://nobody/shared://config", &ctx).await.unwrap_err();
    assert_eq!(e.code(), "unknown_resource");
}

/// A tool's resource links name the gateway's resources: a URI another provider lists
/// first is linked by this provider's alias, and reading the link reaches the provider
/// that gave it (it reached the other one); a link to a URI nobody lists is read from the
/// provider that gave it without asking the others.
#[tokio::test(start_paused = true)]
async fn resource_links_in_results_reach_the_provider_that_gave_them() {
    let docs = Library { with_status_tool: true, ..docs() };
    let docs = Arc::new(Library {
        hidden: vec![("other://secret-page".into(), "found by asking".into())],
        ..docs
    });
    let git = Arc::new(git());
    let o = library(vec![git.clone(), docs.clone()]).await;
    o.list_resources().await.unwrap();
    let ctx = CallContext::new();
    let out = ToolProvider::call(&o, "docs__status", json!({}), &ctx).await.unwrap();
    let uris: Vec<&str> = out
        .content
        .iter()
        .filter_map(|p| match p {
            ContentPart::ResourceLink { uri, .. } => Some(uri.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(uris, ["toolmux://docs/shared://config", "docs://index", "other://secret-page"]);
    let read = o.read_resource(uris[0], &ctx).await.unwrap();
    assert_eq!(text(&read), "docs: from docs");
    assert_eq!(
        text(&o.read_resource("other://secret-page", &ctx).await.unwrap()),
        "docs: found by asking"
    );
    assert!(git.reads().is_empty(), "the other provider was not asked: {:?}", git.reads());
}

/// A template two providers list (two instances of one server) is the first's under its
/// own name and the second's under its alias, read through by the second alone (it was
/// listed twice, alike, and every read went to the first).
#[tokio::test(start_paused = true)]
async fn a_template_two_providers_list_is_aliased_for_the_second() {
    let one = Arc::new(Library::new("one").template("mem://item/{id}"));
    let two = Arc::new(Library::new("two").template("mem://item/{id}"));
    let o = library(vec![one.clone(), two.clone()]).await;
    let templates: Vec<String> =
        o.list_resource_templates().await.unwrap().into_iter().map(|t| t.uri_template).collect();
    assert_eq!(templates, ["mem://item/{id}", "toolmux://two/mem://item/{id}"]);
    let ctx = CallContext::new();
    let read = o.read_resource("toolmux://two/mem://item/7", &ctx).await.unwrap();
    assert_eq!(text(&read), r#"two: [("id", "7")]"#);
    assert!(one.reads().is_empty(), "{:?}", one.reads());
    let read = o.read_resource("mem://item/8", &ctx).await.unwrap();
    assert_eq!(text(&read), r#"one: [("id", "8")]"#);
}

#[tokio::test(start_paused = true)]
async fn reads_route_by_listing_then_template_then_asking_in_turn() {
    let (git, docs) = (Arc::new(git()), Arc::new(docs()));
    let o = library(vec![git.clone(), docs.clone()]).await;
    let ctx = CallContext::new();
    let read = |uri: &'static str| {
        let (o, ctx) = (o.clone(), ctx.clone());
        async move { o.read_resource(uri, &ctx).await.map(|c| text(&c)) }
    };
    assert_eq!(read("docs://index").await.unwrap(), "docs: pages");
    assert_eq!(read("repo://dev/log").await.unwrap(), r#"git: [("branch", "dev")]"#);
    assert_eq!(
        read("repo://dev/src/lib.rs").await.unwrap(),
        r#"docs: [("branch", "dev"), ("path", "src/lib.rs")]"#
    );
    assert_eq!(
        git.reads(),
        ["repo://dev/log"],
        "listed and templated URIs go straight to their owner"
    );
    assert_eq!(read("other://secret-page").await.unwrap(), "docs: found by asking");
    assert_eq!(git.reads().last().map(String::as_str), Some("other://secret-page"));
    // The provider found by asking is remembered.
    read("other://secret-page").await.unwrap();
    assert_eq!(git.reads().iter().filter(|u| *u == "other://secret-page").count(), 1);
    let e = read("nowhere://x").await.unwrap_err();
    assert_eq!(e.report(), "unknown resource `nowhere://x`");
    assert_eq!(e.code(), "unknown_resource");
}

#[tokio::test(start_paused = true)]
async fn reads_are_bounded_by_the_timeout_and_the_callers_cancellation() {
    let hanging =
        Library { hanging_reads: true, ..Library::new("slow").resource("slow://x", "x", "") };
    let hanging = Arc::new(hanging);
    let config = OrchestratorConfig::default().with_tool_timeout(Duration::from_secs(2));
    let o = start(config, vec![hanging.clone(), Arc::new(docs())]).await;
    let started = tokio::time::Instant::now();
    let e = o.read_resource("slow://x", &CallContext::new()).await.unwrap_err();
    assert_eq!(e.report(), "timeout: `slow://x` did not finish within 2s");
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    // Asking in turn goes on past a provider that hangs.
    let read = o.read_resource("other://secret-page", &CallContext::new()).await.unwrap();
    assert_eq!(text(&read), "docs: found by asking");

    let ctx = CallContext::new();
    let cancel = ctx.cancel_token().clone();
    let read = tokio::spawn({
        let o = o.clone();
        async move { o.read_resource("slow://x", &ctx).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    let e = tokio::time::timeout(Duration::from_secs(1), read).await.unwrap().unwrap().unwrap_err();
    assert_eq!(e.code(), "cancelled");
}

#[tokio::test(start_paused = true)]
async fn resource_text_over_the_cap_is_cut_and_kept_whole() {
    let big = "line\n".repeat(1000);
    let lib = Library::new("big").resource("big://file", "file", &big);
    let config = OrchestratorConfig::default().with_response_max_bytes(1000);
    let o = start(config, vec![Arc::new(lib)]).await;
    let contents = o.read_resource("big://file", &CallContext::new()).await.unwrap();
    let ResourceBody::Text(cut) = &contents[0].body else { panic!("text expected") };
    assert!(cut.len() < 1200, "{}", cut.len());
    assert!(cut.starts_with("big: line\n"));
    let marker = cut.lines().find(|l| l.starts_with("[...")).unwrap();
    assert!(
        marker.contains("bytes omitted: resource over 1000 bytes; whole text in output `"),
        "{marker}"
    );
    let handle = marker.split('`').nth(1).unwrap();
    let page = o.read_output(handle, 0, 5000).await.unwrap();
    assert_eq!(page.text.len() + 1, big.len() + "big: ".len());
}

#[tokio::test(start_paused = true)]
async fn subscriptions_route_to_the_owner_and_updates_are_merged() {
    let (git, docs) = (Arc::new(git().with_updates()), Arc::new(docs().with_updates()));
    let o = library(vec![git.clone(), docs.clone()]).await;
    let mut updates = o.resource_updates().expect("providers send updates");
    o.subscribe_resource("docs://index").await.unwrap();
    o.subscribe_resource("repo://dev/log").await.unwrap();
    assert_eq!(docs.subscribed(), ["docs://index"]);
    assert_eq!(git.subscribed(), ["repo://dev/log"]);
    // Nobody claims it: every provider that sends updates is asked.
    o.subscribe_resource("free://x").await.unwrap();
    assert_eq!(docs.subscribed(), ["docs://index", "free://x"]);
    o.unsubscribe_resource("docs://index").await.unwrap();
    assert_eq!(docs.subscribed(), ["free://x"]);

    git.notify("repo://dev/log");
    docs.notify("docs://index");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let uri = tokio::time::timeout(Duration::from_secs(1), updates.next()).await.unwrap();
        seen.push(uri.unwrap().to_string());
    }
    seen.sort();
    assert_eq!(seen, ["docs://index", "repo://dev/log"]);

    o.cleanup().await;
    git.notify("repo://dev/log");
    let after = tokio::time::timeout(Duration::from_secs(1), updates.next()).await;
    assert!(after.is_err(), "forwarders stop on cleanup: {after:?}");
}

/// The next update of `updates` (within a second): its URI and its source.
async fn next_update(updates: &mut ResourceUpdates) -> (String, Option<String>) {
    let next = tokio::time::timeout(Duration::from_secs(1), updates.next_update());
    let update = next.await.expect("an update in time").expect("the stream goes on");
    (update.uri.to_string(), update.source.as_deref().map(str::to_owned))
}

/// Two providers may serve one URI (two instances of a server behind different key
/// holders' views): a view passes on the updates of the providers in view only, and the
/// merged stream tells which provider sent each. A view passed on every provider's.
#[tokio::test(start_paused = true)]
async fn a_view_passes_on_the_updates_of_its_own_providers_only() {
    let serving = |namespace| Library { with_status_tool: true, ..Library::new(namespace) };
    let (a, b) = (Arc::new(serving("a").with_updates()), Arc::new(serving("b").with_updates()));
    let o = library(vec![a.clone(), b.clone()]).await;
    let (of_a, of_b) = (
        FilteredView::new(o.clone(), vec!["a__*".into()]),
        FilteredView::new(o.clone(), vec!["b__*".into()]),
    );
    let mut merged = o.resource_updates().expect("providers send updates");
    let mut heard_by_a = of_a.resource_updates().expect("providers in view send updates");
    of_a.subscribe_resource("free://x").await.unwrap();
    assert_eq!((a.subscribed(), b.subscribed()), (vec!["free://x".to_owned()], vec![]));
    assert!(of_a.passes_updates_from("a") && !of_a.passes_updates_from("b"));
    assert!(of_b.passes_updates_from("b") && !of_b.passes_updates_from("a"));

    let of = |uri: &str, source: &str| (uri.to_owned(), Some(source.to_owned()));
    // One forwarding task per provider: b's update is merged before a's is sent.
    b.notify("free://x");
    assert_eq!(next_update(&mut merged).await, of("free://x", "b"));
    a.notify("free://x");
    assert_eq!(next_update(&mut merged).await, of("free://x", "a"));
    assert_eq!(next_update(&mut heard_by_a).await, of("free://x", "a"), "b's update is not a's");
    o.cleanup().await;
}

#[tokio::test(start_paused = true)]
async fn without_sources_there_are_no_updates_and_nothing_to_subscribe() {
    let o = library(vec![Arc::new(docs())]).await;
    assert!(o.resource_updates().is_none());
    let e = o.subscribe_resource("nowhere://x").await.unwrap_err();
    assert_eq!(e.code(), "unknown_resource");
    assert!(o.subscribe_resource("docs://index").await.is_ok());
}

/// Answers for the caller: approval, elicitation, sampling and roots.
#[derive(Debug)]
struct Caller;

#[async_trait]
impl InteractionHandler for Caller {
    async fn approve(&self, _: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Allow
    }

    async fn elicit(&self, request: ElicitationRequest) -> Result<ElicitationResponse, ToolError> {
        Ok(ElicitationResponse {
            action: ElicitationAction::Accept,
            content: Some(args(json!({"answer": format!("yes to {}", request.message)}))),
        })
    }

    async fn sample(&self, _: SamplingRequest) -> Result<SamplingResponse, ToolError> {
        Ok(SamplingResponse {
            role: Role::Assistant,
            content: ContentPart::Text { text: "sampled".into() },
            model: "caller-model".into(),
            stop_reason: None,
        })
    }

    async fn roots(&self, _: RootsRequest) -> Result<Vec<Root>, ToolError> {
        Ok(vec![Root { uri: "file:///work".into(), name: None }])
    }
}

fn asking_tool() -> ToolSet {
    let spec = ToolSpec::new("ask", "Logs, asks the caller", json!({"type": "object"}))
        .with_annotations(ToolAnnotations::read_only());
    ToolSet::new("asker", ToolKind::Builtin).with_tool(spec, |_, ctx: CallContext| async move {
        ctx.log_text(LogLevel::Info, "first line");
        ctx.log(LogMessage::text(LogLevel::Warning, "second line"));
        let answer =
            ctx.elicit(ElicitationRequest::new("proceed?", json!({"type": "object"}))).await?;
        let sampled = ctx.sample(SamplingRequest::text("hi", 10)).await?;
        let roots = ctx.roots(RootsRequest::default()).await?;
        Ok(ToolOutput::json(json!({
            "elicited": answer.content,
            "sampled": sampled.model,
            "roots": roots.len(),
        })))
    })
}

#[tokio::test(start_paused = true)]
async fn log_lines_and_caller_questions_cross_every_pipeline_stage() {
    // Queue, cache, retries, progress reset and an `ask` rule all wrap the call.
    let settings = ToolSettings::default()
        .with_queue("q")
        .with_cache(Duration::from_secs(60))
        .with_retry(RetryPolicy::retries(2))
        .with_progress_reset(Duration::from_secs(60));
    let config = OrchestratorConfig::default()
        .with_queue("q", QueueConfig::new(1))
        .with_provider_settings("asker", settings)
        .with_permissions(PermissionRules::default().ask("asker__*"));
    let o = start(config, vec![Arc::new(asking_tool())]).await;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let lines = lines.clone();
        LogSink::new(move |m: LogMessage| {
            lines.lock().expect("not poisoned").push(format!("{} {}", m.level.as_str(), m.data));
        })
    };
    let ctx = CallContext::new().with_log(sink).with_handler(Arc::new(Caller));
    let r = o.execute(ToolCall::new("asker__ask", json!({})), &ctx).await;
    assert!(r.ok, "{r:?}");
    expect![[r#"{"elicited":{"answer":"yes to proceed?"},"roots":1,"sampled":"caller-model"}"#]]
        .assert_eq(r.result.as_deref().unwrap());
    assert_eq!(
        *lines.lock().expect("not poisoned"),
        [r#"info "first line""#, r#"warning "second line""#]
    );

    // Without a handler the tool learns that nobody can answer (and `ask` denies).
    let o = start(OrchestratorConfig::default(), vec![Arc::new(asking_tool())]).await;
    let e = o.call_tool("asker__ask", json!({}), &CallContext::new()).await.unwrap_err();
    expect!["elicitation unavailable: nobody is attached to answer this call's requests"]
        .assert_eq(&e.report());
}

#[tokio::test(start_paused = true)]
async fn tool_providers_without_catalogs_contribute_nothing() {
    let o = library(vec![Arc::new(MockProvider::new("m").with_tool("t", Behavior::Echo))]).await;
    assert!(o.list_prompts().await.unwrap().is_empty());
    assert!(o.list_resources().await.unwrap().is_empty());
    assert!(o.list_resource_templates().await.unwrap().is_empty());
    let e = o.read_resource("any://x", &CallContext::new()).await.unwrap_err();
    assert_eq!(e.code(), "unknown_resource");
    assert!(o.resource_updates().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_call_the_caller_could_not_answer_is_not_cached() {
    let cached = ToolSettings::default().with_cache(Duration::from_secs(60));
    let config = OrchestratorConfig::default().with_provider_settings("asker", cached);
    let o = start(config, vec![Arc::new(asking_tool())]).await;
    let e = o.call_tool("asker__ask", json!({}), &CallContext::new()).await.unwrap_err();
    assert_eq!(e.code(), "unsupported");
    // Asked again with someone to answer, the tool runs again and gets the answers.
    let ctx = CallContext::new().with_handler(Arc::new(Caller));
    let out = o.call_tool("asker__ask", json!({}), &ctx).await.unwrap();
    assert!(out.to_text().contains("yes to proceed?"), "{}", out.to_text());
}

#[tokio::test(start_paused = true)]
async fn an_output_built_from_the_callers_answers_is_never_cached() {
    let cached = ToolSettings::default().with_cache(Duration::from_secs(60));
    let config = OrchestratorConfig::default().with_provider_settings("asker", cached);
    let o = start(config, vec![Arc::new(asking_tool())]).await;
    let ctx = CallContext::new().with_handler(Arc::new(Caller));
    o.call_tool("asker__ask", json!({}), &ctx).await.unwrap();
    // A second caller with nobody to answer is asked itself, not served the first
    // caller's answers from the cache.
    let e = o.call_tool("asker__ask", json!({}), &CallContext::new()).await.unwrap_err();
    assert_eq!(e.code(), "unsupported");
}

#[tokio::test(start_paused = true)]
async fn secrets_are_redacted_from_prompts_and_resources() {
    let lib = Library::new("lib").prompt(PromptSpec::new("leaky", "d")).resource(
        "lib://key",
        "key",
        "token=s3cret-value",
    );
    let o = Orchestrator::builder(OrchestratorConfig::default())
        .provider(Arc::new(lib))
        .secrets(["s3cret-value".to_owned()])
        .build()
        .unwrap();
    o.warmup().await;
    let read = o.read_resource("lib://key", &CallContext::new()).await.unwrap();
    assert_eq!(text(&read), "lib: token=[redacted]");
    let args = args(json!({"x": "s3cret-value"}));
    let p = o.get_prompt("lib__leaky", args, &CallContext::new()).await.unwrap();
    assert_eq!(message_text(&p), r#"lib/leaky {"x":"[redacted]"}"#);
    // Not only its text messages: its description and embedded resources too.
    assert_eq!(p.description.as_deref(), Some(r#"leaky with {"x":"[redacted]"}"#));
    let ContentPart::Resource { text, .. } = &p.messages[1].content else { panic!("{p:?}") };
    assert_eq!(text.as_deref(), Some(r#"{"x":"[redacted]"}"#));
}

#[tokio::test]
async fn prompt_and_resource_list_changes_of_every_provider_are_merged() {
    let quiet = Library::new("quiet");
    let o = start(OrchestratorConfig::default(), vec![Arc::new(quiet)]).await;
    assert!(o.prompt_list_changes().is_none() && o.resource_list_changes().is_none());

    let changes = ToolListNotifier::new();
    let lib = Library::new("lib").with_changes(&changes);
    let o = start(OrchestratorConfig::default(), vec![Arc::new(Library::new("a")), Arc::new(lib)])
        .await;
    let mut prompts = o.prompt_list_changes().expect("a provider signals prompt changes");
    let mut resources = o.resource_list_changes().expect("a provider signals resource changes");
    changes.notify();
    let both = async { prompts.changed().await && resources.changed().await };
    assert!(tokio::time::timeout(Duration::from_secs(5), both).await.unwrap());
    o.cleanup().await;
}

/// A filtered view (what `toolmux serve --tools` serves) offers the prompts, resources and
/// templates of the providers with a tool in view, and prompts matched by name; the rest
/// can be neither listed nor reached.
#[tokio::test(start_paused = true)]
async fn a_filtered_view_offers_what_its_providers_offer() {
    let git = Library { with_status_tool: true, ..git() };
    let o = library(vec![Arc::new(git), Arc::new(docs())]).await;
    let names = |list: Vec<PromptSpec>| list.into_iter().map(|p| p.name).collect::<Vec<_>>();
    let view = FilteredView::new(o.clone(), vec!["git__*".into()]);
    assert_eq!(names(view.list_prompts().await.unwrap()), ["git__review", "git__commit_message"]);
    let uris: Vec<String> =
        view.list_resources().await.unwrap().into_iter().map(|r| r.uri).collect();
    assert_eq!(uris, ["repo://main/README", "shared://config"]);
    let templates = view.list_resource_templates().await.unwrap();
    assert_eq!(templates.len(), 1, "{templates:?}");
    let ctx = CallContext::new();
    // `shared://config` is listed by both: the view reads it from the provider in view.
    assert_eq!(text(&view.read_resource("shared://config", &ctx).await.unwrap()), "git: from git");
    let p = view.get_prompt("git__commit_message", JsonObject::new(), &ctx).await.unwrap();
    assert_eq!(message_text(&p), "git/commit message {}");

    // Out of view: unknown, without suggestions that would name what is hidden.
    let hidden = view.get_prompt("docs__summarize", JsonObject::new(), &ctx).await.unwrap_err();
    assert!(
        matches!(&hidden, ToolError::UnknownPrompt { suggestions, .. } if suggestions.is_empty()),
        "{hidden:?}"
    );
    for uri in ["docs://index", "other://secret-page"] {
        let refused = view.read_resource(uri, &ctx).await.unwrap_err();
        assert!(matches!(refused, ToolError::UnknownResource { .. }), "{uri}: {refused:?}");
    }
    let template = CompletionRef::ResourceTemplate("repo://{branch}/{+path}".into());
    let asked = CompletionRequest::new(template, "branch", "m");
    assert_eq!(view.complete(asked, &ctx).await.unwrap(), Completion::default());
    let asked = CompletionRequest::new(CompletionRef::Prompt("docs__summarize".into()), "a", "");
    assert!(view.complete(asked, &ctx).await.is_err());

    // A prompt matched by name is offered although its provider has no tool in view.
    let by_name = FilteredView::new(o.clone(), vec!["docs__summarize".into()]);
    assert_eq!(names(by_name.list_prompts().await.unwrap()), ["docs__summarize"]);
    assert!(by_name.list_resources().await.unwrap().is_empty());
    let asked = CompletionRequest::new(CompletionRef::Prompt("docs__summarize".into()), "a", "x");
    assert_eq!(
        by_name.complete(asked, &ctx).await.unwrap().values,
        ["docs: prompt summarize a=x []"]
    );
}

/// A view passes on what the providers in view say about their tools, and nothing of the
/// others.
#[tokio::test]
async fn a_filtered_view_gives_the_instructions_of_its_providers() {
    let docs = MockProvider::new("docs")
        .with_tool("find", Behavior::Echo)
        .with_instructions("Search before you read.\n");
    let vault = MockProvider::new("vault")
        .with_tool("open", Behavior::Echo)
        .with_instructions("The vault's layout is secret.");
    let silent = MockProvider::new("plain").with_tool("x", Behavior::Echo);
    let o = start(
        OrchestratorConfig::default(),
        vec![Arc::new(docs), Arc::new(vault), Arc::new(silent)],
    )
    .await;
    assert_eq!(
        o.instructions().as_deref(),
        Some("## docs\nSearch before you read.\n\n## vault\nThe vault's layout is secret.")
    );
    let view = FilteredView::new(o.clone(), vec!["docs__*".into(), "plain__x".into()]);
    assert_eq!(view.instructions().as_deref(), Some("## docs\nSearch before you read."));
    let none = FilteredView::new(o.clone(), vec!["plain__*".into()]);
    assert_eq!(none.instructions(), None);
    o.cleanup().await;
}

#[tokio::test(start_paused = true)]
async fn completions_go_to_the_prompt_or_template_owner() {
    let o = library(vec![Arc::new(git()), Arc::new(docs())]).await;
    let ctx = CallContext::new();
    let ask = |reference: CompletionRef, argument: &str| {
        let mut request = CompletionRequest::new(reference, argument, "ma");
        request.context.insert("tone".into(), "kind".into());
        o.complete(request, &ctx)
    };
    let prompt = ask(CompletionRef::Prompt("git__commit_message".into()), "change").await.unwrap();
    assert_eq!(prompt.values, ["git: prompt commit message change=ma [tone=kind]"]);
    let template = CompletionRef::ResourceTemplate("repo://{branch}/{+path}".into());
    let by_template = ask(template, "branch").await.unwrap();
    assert_eq!(
        by_template.values,
        ["docs: template repo://{branch}/{+path} branch=ma [tone=kind]"]
    );
    let nobody = ask(CompletionRef::ResourceTemplate("x://{y}".into()), "y").await.unwrap();
    assert_eq!(nobody, Completion::default());
    let unknown = ask(CompletionRef::Prompt("git__reviews".into()), "change").await.unwrap_err();
    assert!(
        matches!(&unknown, ToolError::UnknownPrompt { suggestions, .. } if suggestions.contains(&"git__review".to_owned())),
        "{unknown:?}"
    );
    let many = ask(CompletionRef::Prompt("docs__summarize".into()), "many").await.unwrap();
    assert_eq!(many.values.len(), Completion::MAX_VALUES);
    assert!(many.has_more);
    assert_eq!(many.total, Some(150));
}

fn vault() -> Library {
    Library::new("vault")
        .prompt(PromptSpec::new("unseal", "Unseal the vault"))
        .resource("vault://keys", "keys", "k-123")
        .template("vault://{name}")
        .with_updates()
}

async fn with_rules(rules: PermissionRules, providers: Vec<Arc<dyn ToolProvider>>) -> Orchestrator {
    start(OrchestratorConfig::default().with_permissions(rules), providers).await
}

fn prompt_names(prompts: Vec<PromptSpec>) -> Vec<String> {
    prompts.into_iter().map(|p| p.name).collect()
}

#[tokio::test(start_paused = true)]
async fn a_denied_namespace_closes_its_prompts_and_resources_with_its_tools() {
    let vault = Arc::new(vault());
    let rules = PermissionRules::default().deny("vault__*");
    let o = with_rules(rules, vec![vault.clone(), Arc::new(docs())]).await;
    let ctx = CallContext::new();
    assert_eq!(prompt_names(o.list_prompts().await.unwrap()), ["docs__summarize"]);
    let uris: Vec<String> = o.list_resources().await.unwrap().into_iter().map(|r| r.uri).collect();
    assert_eq!(uris, ["shared://config", "docs://index"]);
    let templates: Vec<String> =
        o.list_resource_templates().await.unwrap().into_iter().map(|t| t.uri_template).collect();
    assert_eq!(templates, ["repo://{branch}/{+path}"]);

    let e = o.get_prompt("vault__unseal", JsonObject::new(), &ctx).await.unwrap_err();
    expect![[
        "call to `vault__unseal` denied: denied by rule `permissions.deny: vault__*`; remove the rule to allow it"
    ]]
    .assert_eq(&e.report());
    // Listed, templated or never heard of: a denied provider is not asked.
    for uri in ["vault://keys", "vault://root-token"] {
        let e = o.read_resource(uri, &ctx).await.unwrap_err();
        assert_eq!(e.code(), "denied", "{uri}: {}", e.report());
    }
    expect![[
        "call to `vault__vault://keys` denied: denied by rule `permissions.deny: vault__*`; remove the rule to allow it (a resource is judged as `{namespace}__{uri}`, here `vault__vault://keys`)"
    ]]
    .assert_eq(&o.read_resource("vault://keys", &ctx).await.unwrap_err().report());
    assert_eq!(
        o.read_resource("docs://index", &ctx).await.map(|c| text(&c)).unwrap(),
        "docs: pages"
    );
    assert!(vault.reads().is_empty(), "asked: {:?}", vault.reads());
    let e = o.subscribe_resource("vault://keys").await.unwrap_err();
    assert_eq!(e.code(), "denied");
    assert!(vault.subscribed().is_empty());
    let completion = |reference: CompletionRef| CompletionRequest {
        reference,
        argument: "name".into(),
        value: "r".into(),
        context: Default::default(),
    };
    let e = o.complete(completion(CompletionRef::Prompt("vault__unseal".into())), &ctx).await;
    assert_eq!(e.unwrap_err().code(), "denied");
    let done =
        o.complete(completion(CompletionRef::ResourceTemplate("vault://{name}".into())), &ctx);
    assert!(done.await.unwrap().values.is_empty());
}

#[tokio::test(start_paused = true)]
async fn allow_lists_and_rules_on_calls_reach_prompts_and_resources() {
    // Only what the allow list names: docs' prompt and one of its resources.
    let rules = PermissionRules::default().allow("docs__summarize").allow("docs__docs://*");
    let o = with_rules(rules, vec![Arc::new(git()), Arc::new(docs())]).await;
    let ctx = CallContext::new();
    assert_eq!(prompt_names(o.list_prompts().await.unwrap()), ["docs__summarize"]);
    let uris: Vec<String> = o.list_resources().await.unwrap().into_iter().map(|r| r.uri).collect();
    assert_eq!(uris, ["docs://index"]);
    let e = o.read_resource("shared://config", &ctx).await.unwrap_err();
    expect![[
        "call to `git__shared://config` denied: not matched by any `permissions.allow` rule; add one to allow it (a resource is judged as `{namespace}__{uri}`, here `git__shared://config`)"
    ]]
    .assert_eq(&e.report());

    // A rule on calls reads a prompt's arguments and a resource's `uri`.
    let rules =
        PermissionRules::default().deny("git__review(tone=harsh*)").deny("docs__*(uri=other://*)");
    let o = with_rules(rules, vec![Arc::new(git()), Arc::new(docs())]).await;
    let harsh = args(json!({"change": "abc", "tone": "harsh!"}));
    let e = o.get_prompt("git__review", harsh, &ctx).await.unwrap_err();
    expect![[
        "call to `git__review` denied: denied by rule `permissions.deny: git__review(tone=harsh*)` (argument `tone` is `harsh!`); remove the rule to allow it"
    ]]
    .assert_eq(&e.report());
    let kind = args(json!({"change": "abc", "tone": "kind"}));
    assert!(o.get_prompt("git__review", kind, &ctx).await.is_ok());
    assert_eq!(
        prompt_names(o.list_prompts().await.unwrap()),
        ["git__review", "git__commit_message", "docs__summarize"],
        "a prompt some calls may render stays listed"
    );
    let e = o.read_resource("other://secret-page", &ctx).await.unwrap_err();
    assert_eq!(e.code(), "denied", "{}", e.report());
    assert!(o.read_resource("docs://index", &ctx).await.is_ok());
}

/// Approves or refuses, and keeps what it was asked.
#[derive(Debug, Default)]
struct Approver {
    allow: bool,
    asked: Mutex<Vec<(String, Value, String)>>,
}

#[async_trait]
impl InteractionHandler for Approver {
    async fn approve(&self, request: ApprovalRequest) -> ApprovalDecision {
        let asked = (request.tool, request.arguments, request.reason);
        self.asked.lock().expect("not poisoned").push(asked);
        if self.allow {
            ApprovalDecision::Allow
        } else {
            ApprovalDecision::Deny { reason: "not now".into() }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn asked_prompts_and_resources_wait_for_approval() {
    let rules = PermissionRules::default().ask("docs__*");
    let docs = Arc::new(docs());
    let o = with_rules(rules, vec![docs.clone()]).await;
    assert_eq!(prompt_names(o.list_prompts().await.unwrap()), ["docs__summarize"]);
    let e = o.read_resource("docs://index", &CallContext::new()).await.unwrap_err();
    expect![[
        "call to `docs__docs://index` denied: rule `permissions.ask: docs__*` (reading `docs://index`) requires approval and no approval handler is attached; remove the rule or move it to `permissions.allow` to run without approval"
    ]]
    .assert_eq(&e.report());
    let yes = Arc::new(Approver { allow: true, ..Approver::default() });
    let ctx = CallContext::new().with_handler(yes.clone());
    assert_eq!(
        o.read_resource("docs://index", &ctx).await.map(|c| text(&c)).unwrap(),
        "docs: pages"
    );
    assert!(o.get_prompt("docs__summarize", JsonObject::new(), &ctx).await.is_ok());
    let asked = yes.asked.lock().expect("not poisoned").clone();
    expect![[r#"
        [
            (
                "docs__docs://index",
                Object {
                    "uri": String("docs://index"),
                },
                "rule `permissions.ask: docs__*` (reading `docs://index`)",
            ),
            (
                "docs__summarize",
                Object {},
                "rule `permissions.ask: docs__*`",
            ),
        ]
    "#]]
    .assert_debug_eq(&asked);
    let no = Arc::new(Approver::default());
    let ctx = CallContext::new().with_handler(no);
    let e = o.get_prompt("docs__summarize", JsonObject::new(), &ctx).await.unwrap_err();
    assert_eq!(e.report(), "call to `docs__summarize` denied: not approved: not now");
    assert_eq!(docs.reads(), ["docs://index"], "a refused read never reaches the provider");
}

/// An untrusted provider's hints do not decide permissions: a tool claiming it destroys
/// nothing and reaches nothing beyond the machine is still caught by `@destructive` and
/// `@openWorld`, unless configuration says so of it; a trusted provider's claims stand.
#[tokio::test(start_paused = true)]
async fn an_untrusted_providers_hints_do_not_slip_past_permission_selectors() {
    let claims = ToolAnnotations { destructive: false, open_world: false, ..Default::default() };
    let provider = |namespace: &str| -> Arc<dyn ToolProvider> {
        let spec = |name: &str| {
            ToolSpec::new(name, "claims to be harmless", json!({"type": "object"}))
                .with_annotations(claims.clone())
        };
        Arc::new(
            MockProvider::new(namespace)
                .with_spec(spec("wipe"), Behavior::Echo)
                .with_spec(spec("fetch"), Behavior::Echo),
        )
    };
    let mut config = OrchestratorConfig::default()
        .with_permissions(PermissionRules::default().deny("@destructive").deny("@openWorld"));
    config.untrusted_annotations.insert("shady".into());
    config.overrides.insert(
        "shady__fetch".into(),
        toolmux_orchestrator::ToolOverride {
            destructive: Some(false),
            open_world: Some(false),
            ..Default::default()
        },
    );
    let o = start(config, vec![provider("shady"), provider("known")]).await;
    let ctx = CallContext::new();
    let e = o.call_tool("shady__wipe", json!({}), &ctx).await.unwrap_err();
    expect!["call to `shady__wipe` denied: denied by rule `permissions.deny: @destructive`; remove the rule to allow it"]
        .assert_eq(&e.report());
    // What configuration says of a tool is believed.
    assert!(o.call_tool("shady__fetch", json!({}), &ctx).await.is_ok());
    // A trusted provider's claims stand.
    assert!(o.call_tool("known__wipe", json!({}), &ctx).await.is_ok());
    // The listing keeps the server's claims (the agent's concurrency gate reads them).
    let listed = o.list_tools().await.expect("listed");
    let wipe = listed.iter().find(|t| t.name == "shady__fetch").expect("shady__fetch listed");
    assert!(!wipe.annotations.destructive && !wipe.annotations.open_world, "{wipe:?}");
    let wipe = listed.iter().find(|t| t.name == "known__wipe").expect("known__wipe listed");
    assert!(!wipe.annotations.destructive, "{wipe:?}");
}

/// [`OrchestratorConfig::judged_annotations`] is what the permission rules decide by: for
/// every selector of what tools are, a rule denies exactly the tools whose judged
/// annotations it matches, untrusted or trusted, vouched for or not, judged from the
/// registry's spec or from the provider's own (which an agent's selectors rely on).
#[tokio::test(start_paused = true)]
async fn judged_annotations_are_what_the_permission_rules_decide_by() {
    let claims = ToolAnnotations {
        read_only: true,
        destructive: false,
        open_world: false,
        ..Default::default()
    };
    let writes = ToolAnnotations { read_only: false, ..claims.clone() };
    let specs = [("lookup", &claims), ("wipe", &writes), ("vouched", &writes)].map(|(n, a)| {
        ToolSpec::new(n, "claims to be harmless", json!({"type": "object"}))
            .with_annotations(a.clone())
    });
    let provider = |namespace: &str| -> Arc<dyn ToolProvider> {
        let mut provider = MockProvider::new(namespace);
        for spec in &specs {
            provider = provider.with_spec(spec.clone(), Behavior::Echo);
        }
        Arc::new(provider)
    };
    let mut config = OrchestratorConfig::default();
    config.untrusted_annotations.insert("shady".into());
    config.overrides.insert(
        "shady__vouched".into(),
        toolmux_orchestrator::ToolOverride {
            read_only: Some(true),
            open_world: Some(false),
            ..Default::default()
        },
    );
    let mut denied = Vec::new();
    for selector in ["@readOnly", "@read", "@write", "@destructive", "@openWorld", "@network"] {
        let config = config.clone().with_permissions(PermissionRules::default().deny(selector));
        let o = start(config.clone(), vec![provider("shady"), provider("known")]).await;
        let registry = o.registry();
        let mut names: Vec<&str> = Vec::new();
        for entry in registry.entries() {
            let namespace = entry.provider.namespace();
            let judged = config.judged_annotations(namespace, &entry.name, &entry.spec);
            let own = specs.iter().find(|s| s.name == entry.original).expect("the provider's spec");
            assert_eq!(
                judged,
                config.judged_annotations(namespace, &entry.name, own),
                "{}",
                entry.name
            );
            let matched = toolmux_orchestrator::rule_matches(selector, &entry.name, &judged);
            assert_eq!(entry.denied(), matched, "{selector} {}: {judged:?}", entry.name);
            if matched {
                names.push(&entry.name);
            }
        }
        names.sort();
        denied.push(format!("{selector}: {}", names.join(" ")));
        o.cleanup().await;
    }
    expect![[r#"
        @readOnly: known__lookup shady__vouched
        @read: known__lookup shady__vouched
        @write: known__vouched known__wipe shady__lookup shady__wipe
        @destructive: shady__lookup shady__wipe
        @openWorld: shady__lookup shady__wipe
        @network: shady__lookup shady__wipe"#]]
    .assert_eq(&denied.join("\n"));
}
