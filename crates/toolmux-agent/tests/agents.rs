//! Agents against a scripted model and a real orchestrator of mock providers: the loop,
//! the session's own tools, sub-agents through the pipeline, hand-offs and limits.

#![allow(clippy::unwrap_used, reason = "tests: a panic is the failure report")]

use async_trait::async_trait;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use toolmux_agent::{
    AgentConfig, AgentDefinitions, AgentError, AgentReport, AgentStatus, Agents, RouterConfig,
    RunOptions, TextDelta, TextSink,
};
use toolmux_core::{
    ApprovalDecision, ApprovalRequest, CallContext, ContentPart, InteractionHandler,
    ToolAnnotations, ToolProvider, ToolSpec,
};
use toolmux_llm::{
    ApiKind, DeltaSink, Message, Model, ModelConfig, ModelDelta, ModelError, ModelRequest,
    ModelResponse, ModelToolCall, ToolChoice, Usage,
};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, ToolEvent};
use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};
use toolmux_test_support::mock::{Behavior, MockProvider};

#[path = "agents/listen_history.rs"]
mod listen_history;

type Step = Box<dyn Fn(&ModelRequest) -> Result<ModelResponse, ModelError> + Send + Sync>;

/// A model answering from a script, one step per request, recording every request.
#[derive(Default)]
struct ScriptedModel {
    name: String,
    steps: Mutex<VecDeque<Step>>,
    requests: Mutex<Vec<ModelRequest>>,
    /// Wait for cancellation instead of answering once the script is done.
    hang_when_done: bool,
    /// The context window it claims.
    window: Option<u64>,
    /// How many requests were made streaming.
    streamed: AtomicUsize,
    /// How long it takes to answer.
    delay: std::time::Duration,
}

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel").field("name", &self.name).finish()
    }
}

impl ScriptedModel {
    fn new(name: &str) -> Self {
        ScriptedModel { name: name.into(), ..ScriptedModel::default() }
    }

    fn then(
        self,
        step: impl Fn(&ModelRequest) -> Result<ModelResponse, ModelError> + Send + Sync + 'static,
    ) -> Self {
        self.steps.lock().unwrap().push_back(Box::new(step));
        self
    }

    fn calls(self, calls: Vec<(&str, Value)>) -> Self {
        let calls: Vec<(String, Value)> =
            calls.into_iter().map(|(n, a)| (n.to_owned(), a)).collect();
        self.then(move |request| {
            let turn = request.messages.len();
            Ok(used(ModelResponse::tool_calls(
                calls
                    .iter()
                    .enumerate()
                    .map(|(i, (n, a))| {
                        ModelToolCall::new(format!("c{turn}_{i}"), n.clone(), a.clone())
                    })
                    .collect(),
            )))
        })
    }

    fn report(self, status: &str, content: &str) -> Self {
        self.calls(vec![("agent__final_report", json!({"status": status, "content": content}))])
    }

    fn requests(&self) -> Vec<ModelRequest> {
        self.requests.lock().unwrap().clone()
    }
}

fn used(mut response: ModelResponse) -> ModelResponse {
    response.usage = Usage::new(100, 10);
    response
}

#[async_trait]
impl Model for ScriptedModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn context_window(&self) -> Option<u64> {
        self.window
    }

    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ModelError> {
        self.streamed.fetch_add(1, Ordering::Relaxed);
        let answer = self.complete(request, cancel).await?;
        // As a streaming API would: the text in words, each call's arguments in pieces.
        for word in answer.content.split_inclusive(' ') {
            on_delta(ModelDelta::Text(word));
        }
        for (index, call) in answer.tool_calls.iter().enumerate() {
            on_delta(ModelDelta::ToolCall { index, id: &call.id, name: &call.name });
            let arguments = call.arguments.to_string();
            let (head, tail) = arguments.split_at(arguments.len() / 2);
            on_delta(ModelDelta::ToolArguments { index, fragment: head });
            on_delta(ModelDelta::ToolArguments { index, fragment: tail });
        }
        Ok(answer)
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, ModelError> {
        self.requests.lock().unwrap().push(request.clone());
        if !self.delay.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(self.delay) => {}
                () = cancel.cancelled() => return Err(ModelError::Cancelled { model: self.name.clone() }),
            }
        }
        let step = self.steps.lock().unwrap().pop_front();
        match step {
            Some(step) => step(request),
            None if self.hang_when_done => {
                cancel.cancelled().await;
                Err(ModelError::Cancelled { model: self.name.clone() })
            }
            None => Err(ModelError::Api {
                model: self.name.clone(),
                status: 500,
                message: "script exhausted".into(),
            }),
        }
    }
}

fn agent(model: &str) -> AgentConfig {
    AgentConfig { model: model.into(), ..AgentConfig::default() }
}

struct Setup {
    agents: Agents,
    orchestrator: Orchestrator,
    mock: Arc<MockProvider>,
}

async fn setup(definitions: AgentDefinitions, models: Vec<Arc<ScriptedModel>>) -> Setup {
    let models: BTreeMap<String, Arc<dyn Model>> =
        models.into_iter().map(|m| (m.name.clone(), m as Arc<dyn Model>)).collect();
    let mock = Arc::new(
        MockProvider::new("mock")
            .with_tool("echo", Behavior::Echo)
            .with_tool("other", Behavior::Text("other".into()))
            .with_tool("broken", Behavior::Fail("the disk is on fire".into()))
            .with_tool("big", Behavior::Big(8000))
            .with_spec(
                ToolSpec::new("done", "Ends the turn", ToolSpec::any_object_schema())
                    .with_annotations(ToolAnnotations {
                        ends_turn: true,
                        ..ToolAnnotations::default()
                    }),
                Behavior::Text("all done".into()),
            ),
    );
    let (agents, orchestrator) = start_agents(definitions, models, vec![mock.clone()]).await;
    Setup { agents, orchestrator, mock }
}

/// `definitions` with `models`, attached to an orchestrator of `providers` and the agents'
/// own, warmed up.
async fn start_agents(
    definitions: AgentDefinitions,
    models: BTreeMap<String, Arc<dyn Model>>,
    providers: Vec<Arc<dyn ToolProvider>>,
) -> (Agents, Orchestrator) {
    start_agents_with(OrchestratorConfig::default(), definitions, models, providers).await
}

/// [`start_agents`] with an orchestrator configured by `config`.
async fn start_agents_with(
    config: OrchestratorConfig,
    definitions: AgentDefinitions,
    models: BTreeMap<String, Arc<dyn Model>>,
    providers: Vec<Arc<dyn ToolProvider>>,
) -> (Agents, Orchestrator) {
    let agents = Agents::new(definitions, models).expect("valid agents");
    let orchestrator = providers
        .into_iter()
        .fold(Orchestrator::builder(config), |b, p| b.provider(p))
        .provider(agents.provider())
        .build()
        .expect("an orchestrator");
    agents.attach(&orchestrator);
    let report = orchestrator.warmup().await;
    assert!(report.is_ok(), "{report:?}");
    (agents, orchestrator)
}

/// Runs agent `a` on `model` once under `config`, with `external` and a mock `echo` tool
/// beside it, and checks that the run succeeded.
async fn run_beside_echo(
    config: OrchestratorConfig,
    model: &Arc<ScriptedModel>,
    external: toolmux_external::ExternalProvider,
) {
    let mock = MockProvider::new("mock").with_tool("echo", Behavior::Echo);
    let providers: Vec<Arc<dyn ToolProvider>> = vec![Arc::new(external), Arc::new(mock)];
    let (agents, orchestrator) =
        start_agents_with(config, one("a", agent("m")), only(model), providers).await;
    let report = agents.run("a", "go", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    orchestrator.cleanup().await;
}

/// The one model `model`, by its name.
fn only(model: &Arc<ScriptedModel>) -> BTreeMap<String, Arc<dyn Model>> {
    by_name(&[model])
}

/// The models `models`, each by its name.
fn by_name(models: &[&Arc<ScriptedModel>]) -> BTreeMap<String, Arc<dyn Model>> {
    models.iter().map(|m| (m.name.clone(), Arc::clone(m) as Arc<dyn Model>)).collect()
}

/// Agents `front` (on model `front_model`) and `billing` (on model `billing`), each able to
/// hand the task to the other.
fn front_and_billing(front_model: &str) -> AgentDefinitions {
    let mut definitions = one("front", agent(front_model));
    definitions.agents.insert("billing".into(), agent("billing"));
    definitions.router =
        Some(RouterConfig { destinations: vec!["front".into(), "billing".into()] });
    definitions
}

fn one(name: &str, config: AgentConfig) -> AgentDefinitions {
    let mut definitions = AgentDefinitions::default();
    definitions.agents.insert(name.into(), config);
    definitions
}

fn tool_names(request: &ModelRequest) -> Vec<String> {
    request.tools.iter().map(|t| t.name.clone()).collect()
}

fn tool_results(request: &ModelRequest) -> Vec<(String, bool)> {
    match request.messages.last() {
        Some(Message::Tool { results }) => {
            results.iter().map(|r| (r.content.clone(), r.is_error)).collect()
        }
        other => panic!("expected tool results last, got {other:?}"),
    }
}

/// The model is told what the providers of the agent's tools say about them (an MCP
/// server's `instructions`), after the agent's own instructions, and nothing of providers
/// whose tools it may not call.
#[tokio::test]
async fn the_system_prompt_carries_the_instructions_of_the_agents_providers() {
    let model = Arc::new(ScriptedModel::new("m").report("success", "ok"));
    let config = AgentConfig {
        instructions: "Be brief.\n".into(),
        tools: Some(vec!["docs__*".into()]),
        ..agent("m")
    };
    let docs = MockProvider::new("docs")
        .with_tool("find", Behavior::Echo)
        .with_instructions("Search before you read.");
    let vault =
        MockProvider::new("vault").with_tool("open", Behavior::Echo).with_instructions("Secret.");
    let providers: Vec<Arc<dyn ToolProvider>> = vec![Arc::new(docs), Arc::new(vault)];
    let (agents, orchestrator) = start_agents(one("a", config), only(&model), providers).await;
    let report = agents.run("a", "look", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    assert_eq!(
        model.requests()[0].system.as_deref(),
        Some(
            "Be brief.\n\n# What the providers of your tools say about them\n\n\
             ## docs\nSearch before you read."
        )
    );
    orchestrator.cleanup().await;
}

#[tokio::test]
async fn calls_tools_then_reports() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__echo", json!({"say": "hi"}))])
            .report("success", "echoed hi"),
    );
    let s = setup(
        one("a", AgentConfig { instructions: "Be brief.".into(), ..agent("m") }),
        vec![model.clone()],
    )
    .await;
    let report = s.agents.run("a", "say hi", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    assert_eq!(report.content, "echoed hi");
    assert_eq!((report.turns, report.tool_calls), (2, 1));
    assert_eq!(report.usage, Usage::new(200, 20));
    assert_eq!(s.mock.calls_of("echo"), 1);
    let requests = model.requests();
    assert_eq!(requests[0].system.as_deref(), Some("Be brief."));
    assert_eq!(requests[0].messages, vec![Message::user("say hi")]);
    let names = tool_names(&requests[0]);
    assert!(
        names.contains(&"mock__echo".to_owned())
            && names.contains(&"agent__final_report".to_owned()),
        "{names:?}"
    );
    assert!(!names.iter().any(|n| n == "agent__a"), "an agent is not offered itself: {names:?}");
    let results = tool_results(&requests[1]);
    assert_eq!(results.len(), 1);
    assert!(results[0].0.contains("\"say\"") && !results[0].1, "{results:?}");
}

#[tokio::test]
async fn a_plain_answer_ends_the_run() {
    let model = Arc::new(ScriptedModel::new("m").then(|_| Ok(ModelResponse::text("It is 4."))));
    let s = setup(one("a", agent("m")), vec![model]).await;
    let report = s.agents.run("a", "2+2?", &CallContext::new()).await.unwrap();
    assert_eq!(
        (report.status, report.content.as_str(), report.turns),
        (AgentStatus::Success, "It is 4.", 1)
    );
}

#[tokio::test]
async fn only_the_configured_tools_are_offered_and_callable() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__other", json!({})), ("mock__echo", json!({"x": 1}))])
            .report("success", "ok"),
    );
    let config = AgentConfig { tools: Some(vec!["mock__ec*".into()]), ..agent("m") };
    let s = setup(one("a", config), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    let requests = model.requests();
    assert_eq!(tool_names(&requests[0]), vec!["mock__echo", "agent__final_report"]);
    let results = tool_results(&requests[1]);
    assert!(results[0].1 && results[0].0.contains("unknown tool `mock__other`"), "{results:?}");
    assert!(!results[1].1);
    assert_eq!(s.mock.calls_of("other"), 0, "a tool not offered is never called");
    // Nor counted as a call: it is counted apart, as refused.
    assert_eq!((report.tool_calls, report.refused_calls), (1, 1));
}

/// An MCP server whose annotations are not trusted (`untrusted_annotations`, a server
/// without `trustAnnotations`) has its tools judged by an agent's `tools` selectors as the
/// permission rules judge them: possibly writing, destroying and reaching beyond the
/// machine, whatever they claim, unless configuration's `tools.NAME.annotations` says
/// otherwise; a trusted provider's claims hold. The selectors read the claims: an agent
/// given `@destructive` or `@openWorld` tools was not given a tool that only claimed to be
/// neither, which `permissions.ask: ['@destructive']` asks about.
#[tokio::test]
async fn selectors_judge_an_untrusted_servers_tools_as_the_rules_do() {
    let claims = ToolAnnotations {
        read_only: true,
        destructive: false,
        open_world: false,
        ..ToolAnnotations::default()
    };
    let tool = |name: &str, annotations: &ToolAnnotations| {
        ToolSpec::new(name, "claims to be harmless", json!({"type": "object"}))
            .with_annotations(annotations.clone())
    };
    let writes = ToolAnnotations { read_only: false, ..claims.clone() };
    let providers = || -> Vec<Arc<dyn ToolProvider>> {
        let server = |namespace: &str| {
            MockProvider::new(namespace)
                .with_spec(tool("lookup", &claims), Behavior::Echo)
                .with_spec(tool("wipe", &writes), Behavior::Echo)
                .with_spec(tool("vouched", &writes), Behavior::Echo)
        };
        vec![Arc::new(server("web")), Arc::new(server("local"))]
    };
    let mut config = OrchestratorConfig::default();
    config.untrusted_annotations.insert("web".to_owned());
    // The user vouches for one tool: it destroys nothing and stays on the machine.
    config.overrides.insert(
        "web__vouched".to_owned(),
        toolmux_orchestrator::ToolOverride {
            destructive: Some(false),
            open_world: Some(false),
            ..Default::default()
        },
    );
    for (selector, offered) in [
        ("@destructive", vec!["web__lookup", "web__wipe"]),
        ("@openWorld", vec!["web__lookup", "web__wipe"]),
        ("@network", vec!["web__lookup", "web__wipe"]),
        ("@readOnly", vec!["local__lookup"]),
        (
            "@write",
            vec!["web__lookup", "web__wipe", "web__vouched", "local__wipe", "local__vouched"],
        ),
    ] {
        let model = Arc::new(ScriptedModel::new("m").report("success", "ok"));
        let agent_config = AgentConfig { tools: Some(vec![selector.into()]), ..agent("m") };
        let (agents, orchestrator) =
            start_agents_with(config.clone(), one("a", agent_config), only(&model), providers())
                .await;
        agents.run("a", "t", &CallContext::new()).await.unwrap();
        let mut names = tool_names(&model.requests()[0]);
        assert_eq!(names.pop().as_deref(), Some("agent__final_report"));
        names.sort();
        let mut offered: Vec<String> = offered.into_iter().map(str::to_owned).collect();
        offered.sort();
        assert_eq!(names, offered, "{selector}");
        // The registry keeps the claims of destruction and reach (the concurrency gate's).
        let registry = orchestrator.registry();
        let lookup = &registry.get("web__lookup").unwrap().spec.annotations;
        assert!(!lookup.destructive && !lookup.open_world && !lookup.read_only, "{lookup:?}");
        orchestrator.cleanup().await;
    }
}

/// `tools` may select what tools are: a reviewer given `@read` is offered only the tools
/// that change nothing, and an unknown selector is a configuration error.
#[tokio::test]
async fn an_agent_may_be_given_tools_by_what_they_are() {
    let model = Arc::new(ScriptedModel::new("m").report("success", "ok"));
    let config = AgentConfig { tools: Some(vec!["@read".into()]), ..agent("m") };
    let mock = MockProvider::new("repo")
        .with_read_only_tool("show", Behavior::Echo)
        .with_tool("push", Behavior::Echo);
    let (agents, orchestrator) =
        start_agents(one("a", config), only(&model), vec![Arc::new(mock)]).await;
    agents.run("a", "review", &CallContext::new()).await.unwrap();
    assert_eq!(tool_names(&model.requests()[0]), ["repo__show", "agent__final_report"]);
    orchestrator.cleanup().await;

    let wrong = AgentConfig { tools: Some(vec!["@reads".into()]), ..agent("m") };
    let refused =
        Agents::new(one("a", wrong), only(&model)).expect_err("an unknown selector is refused");
    assert_eq!(
        refused.to_string(),
        "agents.a: tools: unknown selector `@reads`; the selectors are @readOnly, @destructive, \
         @openWorld, @read, @write, @execute, @network"
    );
    let calls = AgentConfig { tools: Some(vec!["fs__bash(git *)".into()]), ..agent("m") };
    let model: Arc<dyn Model> = Arc::new(ScriptedModel::new("m"));
    let refused = Agents::new(one("a", calls), BTreeMap::from([("m".to_owned(), model)]))
        .expect_err("a rule on calls is no tool");
    assert_eq!(
        refused.to_string(),
        "agents.a: tools: `fs__bash(git *)` names calls, not tools; give the agent the tool \
         (`fs__bash`) and put the rule on its calls in `permissions`"
    );
}

/// Answers, from a thread of its own (a scripted model's step is not async), every pending
/// external call whose arguments `which` picks, with `result`.
fn answer_pending(
    store: &Arc<toolmux_external::MemoryPendingStore>,
    which: impl Fn(&Value) -> bool + Send + 'static,
    result: Value,
) {
    use toolmux_external::{ExternalResult, PendingStore};
    let store = store.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            for call in store.pending(&[], std::time::Duration::ZERO).await {
                if which(&call.arguments) {
                    let answer = ExternalResult { result: result.clone(), is_error: false };
                    store.resolve(&call.call_id, answer).await.unwrap();
                }
            }
        });
    })
    .join()
    .unwrap();
}

/// Runs an agent whose model calls external tool `name` (made by `config`) with
/// `arguments`, then, in its second turn, has the call answered with `answer` (as the other
/// side would, meanwhile) and calls `mock__echo`, then reports; the model's requests.
async fn run_answered_later(
    name: &str,
    config: toolmux_external::ExternalToolConfig,
    arguments: Value,
    answer: &'static str,
) -> Vec<ModelRequest> {
    run_answered_later_with(OrchestratorConfig::default(), name, config, arguments, answer).await
}

/// [`run_answered_later`] with an orchestrator configured by `orchestrator`.
async fn run_answered_later_with(
    orchestrator: OrchestratorConfig,
    name: &str,
    config: toolmux_external::ExternalToolConfig,
    arguments: Value,
    answer: &'static str,
) -> Vec<ModelRequest> {
    use toolmux_external::{ExternalProvider, MemoryPendingStore};
    let store = Arc::new(MemoryPendingStore::default());
    let external =
        ExternalProvider::new(&BTreeMap::from([(name.to_owned(), config)]), store.clone()).unwrap();
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![(format!("external__{name}").as_str(), arguments)])
            .then(move |_| {
                answer_pending(&store, |_| true, json!(answer));
                let echo = ModelToolCall::new("c2", "mock__echo", json!({"x": 1}));
                Ok(used(ModelResponse::tool_calls(vec![echo])))
            })
            .report("success", "done"),
    );
    run_beside_echo(orchestrator, &model, external).await;
    model.requests()
}

/// The results of asynchronous external calls reach the model on their own: before each
/// turn, while its calls are pending, the session reads the run's inbox and gives the
/// model what arrived.
#[tokio::test]
async fn results_of_asynchronous_calls_reach_the_model() {
    let job = toolmux_external::ExternalToolConfig {
        description: "Starts a build".into(),
        is_async: true,
        ..toolmux_external::ExternalToolConfig::default()
    };
    let requests =
        run_answered_later("build", job, json!({"target": "docs"}), "built in 3 s").await;
    assert_eq!(requests.len(), 3);
    // Nothing had arrived before the second turn; before the third the result had.
    assert!(matches!(requests[1].messages.last(), Some(Message::Tool { .. })));
    let Some(Message::User { content }) = requests[2].messages.last() else {
        panic!("expected the inbox's results last: {:?}", requests[2].messages.last())
    };
    assert!(
        content.starts_with("(Results of your earlier asynchronous tool calls arrived:\n")
            && content.contains("built in 3 s"),
        "{content}"
    );
}

/// The session's reads of the inbox are its own bookkeeping, not the run's work: with
/// `maxToolCallsPerRun` 2 the run's two calls are made and the result still reaches the
/// model, where the polls counted, the second call was refused and the result never came.
#[tokio::test]
async fn inbox_reads_are_outside_the_run_budget() {
    let job = toolmux_external::ExternalToolConfig {
        description: "Starts a build".into(),
        is_async: true,
        ..toolmux_external::ExternalToolConfig::default()
    };
    let budget = toolmux_orchestrator::RunBudgetConfig { max_calls: Some(2), ..Default::default() };
    let config = OrchestratorConfig::default().with_run_budget(budget);
    let requests =
        run_answered_later_with(config, "build", job, json!({"target": "docs"}), "built").await;
    assert_eq!(requests.len(), 3);
    // The echo, the run's second call, was made.
    let messages = &requests[2].messages;
    let Some(Message::Tool { results }) = messages.get(messages.len() - 2) else {
        panic!("expected the echo's result before the inbox's: {messages:?}")
    };
    assert!(results.iter().all(|r| !r.is_error), "{results:?}");
    let Some(Message::User { content }) = requests[2].messages.last() else {
        panic!("expected the inbox's results last: {:?}", requests[2].messages.last())
    };
    assert!(content.contains("built"), "{content}");
}

/// Results taken from the inbox all reach the model, however many arrive: over the size
/// cap, the inbox's answer is stored and read back whole (also where outputs over the
/// cap are cut, `oversize: truncate`), and the model is given the results in portions
/// within the cap, one a turn. Before, the stored or cut answer was not the inbox's JSON
/// and every result it held was lost.
#[tokio::test]
async fn results_over_the_size_cap_reach_the_model_over_turns() {
    for oversize in
        [toolmux_orchestrator::OversizeMode::Spill, toolmux_orchestrator::OversizeMode::Truncate]
    {
        results_over_the_size_cap_reach_the_model_over_turns_with(oversize).await;
    }
}

async fn results_over_the_size_cap_reach_the_model_over_turns_with(
    oversize: toolmux_orchestrator::OversizeMode,
) {
    let (store, external) = async_external("build", "Starts a build");
    let builds: Vec<(&str, Value)> =
        (0..3).map(|i| ("external__build", json!({"target": i}))).collect();
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(builds)
            .then(move |_| {
                // Each result alone fills most of the cap: one a turn reaches the model.
                answer_pending(&store, |_| true, json!("built ".repeat(40)));
                let echo = ModelToolCall::new("e", "mock__echo", json!({}));
                Ok(used(ModelResponse::tool_calls(vec![echo])))
            })
            .calls(vec![("mock__echo", json!({"n": 1}))])
            .calls(vec![("mock__echo", json!({"n": 2}))])
            .report("success", "done"),
    );
    let config = OrchestratorConfig { oversize, ..OrchestratorConfig::default() }
        .with_response_max_bytes(500);
    run_beside_echo(config, &model, external).await;
    let requests = model.requests();
    assert_eq!(requests.len(), 5);
    let mut given = Vec::new();
    for request in &requests[2..] {
        let Some(Message::User { content }) = request.messages.last() else {
            panic!("expected results last: {:?}", request.messages.last())
        };
        let (_, results) = content.split_once(":\n").unwrap();
        let results: Vec<Value> = serde_json::from_str(results.trim_end_matches(')')).unwrap();
        assert_eq!(results.len(), 1, "{content}");
        given.push(results[0]["arguments"]["target"].as_u64().unwrap());
    }
    assert_eq!(given, [0, 1, 2], "{oversize:?}");
}

/// A report made while results taken from the inbox still wait to reach the model is
/// answered to read them first: the run ends once the last has come, where the report
/// ended it with the rest lost.
#[tokio::test]
async fn a_report_waits_for_the_results_still_to_come() {
    let (store, external) = async_external("build", "Starts a build");
    let builds: Vec<(&str, Value)> =
        (0..3).map(|i| ("external__build", json!({"target": i}))).collect();
    let mut model = ScriptedModel::new("m").calls(builds).then(move |_| {
        answer_pending(&store, |_| true, json!("built ".repeat(40)));
        let echo = ModelToolCall::new("e", "mock__echo", json!({}));
        Ok(used(ModelResponse::tool_calls(vec![echo])))
    });
    for _ in 0..3 {
        model = model.report("success", "done");
    }
    let model = Arc::new(model);
    let config = OrchestratorConfig::default().with_response_max_bytes(500);
    run_beside_echo(config, &model, external).await;
    let requests = model.requests();
    assert_eq!(requests.len(), 5);
    let said = format!("{:?}", requests[3].messages);
    assert!(said.contains("2 more results of your asynchronous tool calls arrived"), "{said}");
    let said = format!("{:?}", requests[4].messages);
    assert!(said.contains("1 more result of your asynchronous tool calls arrived"), "{said}");
    let given: usize = requests[2..]
        .iter()
        .filter(|r| matches!(r.messages.last(), Some(Message::User { content }) if content.contains("built")))
        .count();
    assert_eq!(given, 3);
}

/// A model that starts three builds and, in its second turn, has them answered (each
/// result alone filling most of a 500-byte cap, so one reaches it a turn) while it calls
/// `mock__echo`, then goes on as `then` says; the providers it needs (`mock__push` too).
fn three_builds(
    then: impl FnOnce(ScriptedModel) -> ScriptedModel,
) -> (Arc<ScriptedModel>, Vec<Arc<dyn ToolProvider>>) {
    let (store, external) = async_external("build", "Starts a build");
    let builds: Vec<(&str, Value)> =
        (0..3).map(|i| ("external__build", json!({"target": i}))).collect();
    let model = ScriptedModel::new("m").calls(builds).then(move |_| {
        answer_pending(&store, |_| true, json!("built ".repeat(40)));
        let echo = ModelToolCall::new("e", "mock__echo", json!({}));
        Ok(used(ModelResponse::tool_calls(vec![echo])))
    });
    let mock = MockProvider::new("mock")
        .with_tool("echo", Behavior::Echo)
        .with_tool("push", Behavior::Echo);
    (Arc::new(then(model)), vec![Arc::new(external), Arc::new(mock)])
}

/// The builds (`target`) of inbox results, in order.
fn targets(results: &[Value]) -> Vec<u64> {
    results.iter().map(|r| r["arguments"]["target"].as_u64().unwrap()).collect()
}

/// A plain answer made while results taken from the inbox still wait to reach the model
/// gets one more turn with the next of them: the run ends with the answer after the last.
/// Before, the answer ended the run and the two results not yet given were lost.
#[tokio::test]
async fn a_plain_answer_waits_for_the_results_still_to_come() {
    let answer = |text: &'static str| move |_: &ModelRequest| Ok(used(ModelResponse::text(text)));
    let (model, providers) =
        three_builds(|m| m.then(answer("first")).then(answer("second")).then(answer("all read")));
    let config = OrchestratorConfig::default().with_response_max_bytes(500);
    let (agents, orchestrator) =
        start_agents_with(config, one("a", agent("m")), only(&model), providers).await;
    let report = agents.run("a", "go", &CallContext::new()).await.unwrap();
    orchestrator.cleanup().await;
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "all read"));
    assert!(report.unread_results.is_empty(), "{report:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 5);
    let given: usize = requests[2..]
        .iter()
        .filter(|r| matches!(r.messages.last(), Some(Message::User { content }) if content.contains("built")))
        .count();
    assert_eq!(given, 3);
}

/// Results taken from the inbox that never reached the model are in the run's report,
/// where its caller reads them: a report on the run's last turn, and a run cancelled
/// while two wait. Before, both runs ended with them lost.
#[tokio::test]
async fn results_a_run_ends_without_reading_are_in_its_report() {
    let config = OrchestratorConfig::default().with_response_max_bytes(500);
    // The third turn is the last: the report is taken with two results not given.
    let (model, providers) = three_builds(|m| m.report("success", "done"));
    let definitions = one("a", AgentConfig { max_turns: Some(3), ..agent("m") });
    let (agents, orchestrator) =
        start_agents_with(config.clone(), definitions, only(&model), providers).await;
    let report = agents.run("a", "go", &CallContext::new()).await.unwrap();
    orchestrator.cleanup().await;
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    assert_eq!(targets(&report.unread_results), [1, 2]);
    assert_eq!(report.unread_results[0]["result"], json!("built ".repeat(40)));
    // A sub-agent's caller reads them in its output.
    let text = report.to_output().to_text();
    assert!(text.contains("did not read before its run ended") && text.contains("built"), "{text}");

    // Cancelled in the third turn, after the first result was given.
    let cancel = CancellationToken::new();
    let cancelling = cancel.clone();
    let (model, providers) = three_builds(|m| {
        m.then(move |_| {
            cancelling.cancel();
            let echo = ModelToolCall::new("e2", "mock__echo", json!({"n": 2}));
            Ok(used(ModelResponse::tool_calls(vec![echo])))
        })
    });
    let (agents, orchestrator) =
        start_agents_with(config, one("a", agent("m")), only(&model), providers).await;
    let report = agents.run("a", "go", &CallContext::new().with_cancel(cancel)).await.unwrap();
    orchestrator.cleanup().await;
    assert_eq!(report.status, AgentStatus::Failure);
    assert!(report.content.contains("cancelled"), "{}", report.content);
    assert_eq!(targets(&report.unread_results), [1, 2]);
    // The report says what it carries when it leaves as JSON.
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(targets(json["unreadResults"].as_array().unwrap()), [1, 2]);
}

/// A run paused with results taken from the inbox and not yet given keeps them in its
/// report, and its model is given them when it resumes, one a turn as before the pause.
#[tokio::test]
async fn results_waiting_at_a_pause_reach_the_model_when_it_resumes() {
    let (model, providers) = three_builds(|m| {
        m.calls(vec![("mock__push", json!({}))]).report("success", "x").report("success", "done")
    });
    let config = OrchestratorConfig::default()
        .with_response_max_bytes(500)
        .with_permissions(asking(&["mock__push"]));
    let (agents, orchestrator) =
        start_agents_with(config, one("a", agent("m")), only(&model), providers).await;
    let report = agents.run_with("a", "go", &CallContext::new(), &pausing()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Paused, "{report:?}");
    assert_eq!(targets(&report.unread_results), [1, 2]);
    let paused = stored(&report);
    let decisions =
        BTreeMap::from([(report.pending[0].call_id.clone(), toolmux_agent::Decision::approve())]);
    let done = agents.resume(&paused, decisions, &CallContext::new(), &pausing()).await.unwrap();
    orchestrator.cleanup().await;
    assert_eq!((done.status, done.content.as_str()), (AgentStatus::Success, "done"), "{done:?}");
    assert!(done.unread_results.is_empty(), "{done:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 5);
    let given: Vec<u64> = requests[3..]
        .iter()
        .map(|request| {
            let Some(Message::User { content }) = request.messages.last() else {
                panic!("expected results last: {:?}", request.messages.last())
            };
            let (_, results) = content.split_once(":\n").unwrap();
            targets(&serde_json::from_str::<Vec<Value>>(results.trim_end_matches(')')).unwrap())[0]
        })
        .collect();
    assert_eq!(given, [1, 2]);
}

/// A spent context budget (`contextTokenBudget`) does not refuse the session's read of
/// the inbox: the results it took out reach the model, and the budget is spent.
#[tokio::test]
async fn results_over_the_context_budget_reach_the_model() {
    let job = toolmux_external::ExternalToolConfig {
        description: "Starts a build".into(),
        is_async: true,
        ..toolmux_external::ExternalToolConfig::default()
    };
    let config = OrchestratorConfig::default().with_context_token_budget(100);
    let long: &'static str = "built in 3 s; ".repeat(60).leak();
    let requests =
        run_answered_later_with(config, "build", job, json!({"target": "docs"}), long).await;
    assert_eq!(requests.len(), 3);
    let Some(Message::User { content }) = requests[2].messages.last() else {
        panic!("expected the inbox's results last: {:?}", requests[2].messages.last())
    };
    assert!(content.contains(long), "{content}");
}

/// The result of a synchronous external call that timed out, submitted later, reaches the
/// model too: the call stays pending and its result comes to the inbox.
#[tokio::test]
async fn the_late_result_of_a_timed_out_call_reaches_the_model() {
    let ask = toolmux_external::ExternalToolConfig {
        description: "Asks a person".into(),
        timeout: Some(50),
        ..toolmux_external::ExternalToolConfig::default()
    };
    let requests = run_answered_later("ask", ask, json!({"q": "ship?"}), "yes, ship").await;
    let timed_out = tool_results(&requests[1]);
    assert!(timed_out[0].1 && timed_out[0].0.contains("within 50 ms"), "{timed_out:?}");
    let Some(Message::User { content }) = requests[2].messages.last() else {
        panic!("expected the inbox's results last: {:?}", requests[2].messages.last())
    };
    assert!(content.contains("yes, ship"), "{content}");
}

/// One asynchronous external tool `name` over a pending store of its own: the store (for
/// the other side's answers) and the provider.
fn async_external(
    name: &str,
    description: &str,
) -> (Arc<toolmux_external::MemoryPendingStore>, toolmux_external::ExternalProvider) {
    use toolmux_external::{ExternalProvider, ExternalToolConfig, MemoryPendingStore};
    let store = Arc::new(MemoryPendingStore::default());
    let config = ExternalToolConfig {
        description: description.into(),
        is_async: true,
        ..ExternalToolConfig::default()
    };
    let tools = BTreeMap::from([(name.to_owned(), config)]);
    (store.clone(), ExternalProvider::new(&tools, store).unwrap())
}

/// An asynchronous call of `tool` with `arguments`, made by run `run` (a listening agent's
/// earlier cycle), for a test to open in a pending store and answer.
fn pending_call(tool: &str, arguments: Value, run: &str) -> toolmux_external::PendingCall {
    toolmux_external::PendingCall {
        call_id: String::new(),
        tool: tool.into(),
        arguments,
        run_id: run.into(),
        owner: None,
        execution_type: toolmux_external::ExecutionType::External,
        is_async: true,
        visible: false,
        created_ms: 0,
        status: Default::default(),
        expires_ms: 0,
        ttl_ms: None,
    }
}

/// A sub-agent shares its caller's run but not its inbox: each gets the results of its
/// own asynchronous calls, not the other's.
#[tokio::test]
async fn a_sub_agent_never_takes_its_caller_s_results() {
    use toolmux_external::MemoryPendingStore;
    let (store, external) = async_external("job", "Starts a job");
    // Answers every pending call of `who` with "done for WHO".
    let answer = |store: &Arc<MemoryPendingStore>, who: &'static str| {
        answer_pending(
            store,
            move |arguments| arguments["who"] == who,
            json!(format!("done for {who}")),
        );
    };
    let (for_lead, for_worker) = (store.clone(), store.clone());
    let lead = Arc::new(
        ScriptedModel::new("big")
            .calls(vec![("external__job", json!({"who": "lead"}))])
            .then(move |_| {
                // The lead's job is done before it hands work to the worker.
                answer(&for_lead, "lead");
                let call = ModelToolCall::new("w", "agent__worker", json!({"prompt": "check"}));
                Ok(used(ModelResponse::tool_calls(vec![call])))
            })
            .report("success", "lead done"),
    );
    let worker = Arc::new(
        ScriptedModel::new("small")
            .calls(vec![("external__job", json!({"who": "worker"}))])
            .then(move |_| {
                answer(&for_worker, "worker");
                let echo = ModelToolCall::new("e", "mock__echo", json!({}));
                Ok(used(ModelResponse::tool_calls(vec![echo])))
            })
            .report("success", "worker done"),
    );
    let mut definitions =
        one("lead", AgentConfig { agents: vec!["worker".into()], ..agent("big") });
    definitions
        .agents
        .insert("worker".into(), AgentConfig { description: "Checks".into(), ..agent("small") });
    let models = by_name(&[&lead, &worker]);
    let mock = MockProvider::new("mock").with_tool("echo", Behavior::Echo);
    let providers: Vec<Arc<dyn ToolProvider>> = vec![Arc::new(external), Arc::new(mock)];
    let (agents, orchestrator) = start_agents(definitions, models, providers).await;
    let report = agents.run("lead", "go", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    let said = |requests: Vec<ModelRequest>| -> String {
        requests.iter().flat_map(|r| r.messages.iter()).map(|m| format!("{m:?}")).collect()
    };
    let (lead_saw, worker_saw) = (said(lead.requests()), said(worker.requests()));
    assert!(worker_saw.contains("done for worker"), "{worker_saw}");
    assert!(!worker_saw.contains("done for lead"), "the worker took the lead's result");
    assert!(lead_saw.contains("done for lead"), "{lead_saw}");
    orchestrator.cleanup().await;
}

/// A misspelled tool is answered with the closest offered name.
#[tokio::test]
async fn a_misspelled_tool_is_answered_with_the_closest_name() {
    let model = Arc::new(
        ScriptedModel::new("m").calls(vec![("mock__ehco", json!({}))]).report("success", "ok"),
    );
    let s = setup(one("a", agent("m")), vec![model.clone()]).await;
    s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(
        tool_results(&model.requests()[1]),
        vec![(
            "(tool failed: unknown tool `mock__ehco`; did you mean `mock__echo`? Call one of the \
             tools you were given)"
                .to_owned(),
            true
        )]
    );
}

/// The same call in too many turns in a row is not made again: the model is told why and
/// goes on; other calls, and the same tool with other arguments, are made.
#[tokio::test]
async fn a_call_repeated_turn_after_turn_is_refused() {
    let mut model = ScriptedModel::new("m");
    for _ in 0..3 {
        model = model.calls(vec![("mock__echo", json!({"a": 1, "b": 2}))]);
    }
    // Key order does not make it another call; the same call twice in one turn is one.
    model = model.calls(vec![
        ("mock__echo", json!({"b": 2, "a": 1})),
        ("mock__echo", json!({"a": 1, "b": 2})),
        ("mock__echo", json!({"a": 2})),
    ]);
    let model = Arc::new(model.report("success", "gave up"));
    let config = AgentConfig { max_repeats: Some(3), ..agent("m") };
    let s = setup(one("a", config), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    assert_eq!(s.mock.calls_of("echo"), 4, "three turns of the same call and one other");
    let results = tool_results(&model.requests()[4]);
    let refused = "(not called: you called `mock__echo` with these same arguments in each of \
                   your last 3 turns, and calling it again will not change what it returns. Use \
                   what it returned, change the arguments or the approach, or call \
                   agent__final_report)";
    assert_eq!(results[0], (refused.to_owned(), true));
    assert_eq!(results[1], (refused.to_owned(), true));
    assert!(!results[2].1, "{results:?}");
}

/// A call whose result changes from turn to turn (a file read after each edit) is never
/// refused as a repeat.
#[tokio::test]
async fn a_call_whose_result_changes_is_not_a_repeat() {
    let mut model = ScriptedModel::new("m");
    for _ in 0..5 {
        model = model.calls(vec![("mock__count", json!({}))]);
    }
    let model = Arc::new(model.report("success", "read them all"));
    let config = AgentConfig { max_repeats: Some(2), ..agent("m") };
    let mock = Arc::new(MockProvider::new("mock").with_tool("count", Behavior::Count));
    let providers: Vec<Arc<dyn ToolProvider>> = vec![mock.clone()];
    let (agents, _orchestrator) = start_agents(one("a", config), only(&model), providers).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    assert_eq!(mock.calls_of("count"), 5, "{:?}", tool_results(&model.requests()[5]));
}

#[tokio::test]
async fn tool_failures_and_bad_arguments_go_back_to_the_model() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .then(|_| {
                let mut bad = ModelToolCall::new("c1", "mock__echo", Value::Null);
                bad.raw_arguments = Some("{\"say\": ".into());
                Ok(ModelResponse::tool_calls(vec![
                    bad,
                    ModelToolCall::new("c2", "mock__broken", json!({})),
                ]))
            })
            .report("failure", "could not"),
    );
    let s = setup(one("a", agent("m")), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Failure);
    let results = tool_results(&model.requests()[1]);
    assert!(results[0].1 && results[0].0.contains("not valid JSON"), "{results:?}");
    assert!(results[1].1 && results[1].0.contains("the disk is on fire"), "{results:?}");
    assert_eq!(s.mock.calls_of("echo"), 0);
}

#[tokio::test]
async fn the_last_turn_may_only_report() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__echo", json!({}))])
            .calls(vec![("mock__echo", json!({}))])
            .report("partial", "half of it"),
    );
    let s = setup(one("a", AgentConfig { max_turns: Some(3), ..agent("m") }), vec![model.clone()])
        .await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.turns), (AgentStatus::Partial, 3));
    let last = model.requests().pop().unwrap();
    assert_eq!(tool_names(&last), vec!["agent__final_report"]);
    assert_last_turn_says(&model, "last turn");
}

#[tokio::test]
async fn no_report_within_the_turn_limit_is_a_failure() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__echo", json!({}))])
            .calls(vec![("mock__echo", json!({}))]),
    );
    let s = setup(one("a", AgentConfig { max_turns: Some(2), ..agent("m") }), vec![model]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Failure);
    assert_eq!(
        report.content,
        "the limit of 2 turns is reached, and the model gave no final report"
    );
}

/// On the last turn only the report is offered; a model whose server ignores `tool_choice`
/// (or that writes its calls as text) and calls other tools anyway has them refused, not
/// run: the budget or the turn limit that made the turn the last holds.
#[tokio::test]
async fn the_last_turn_runs_no_other_tool_than_the_report() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__echo", json!({"turn": 1}))])
            .calls(vec![
                ("mock__echo", json!({"turn": 2})),
                ("agent__final_report", json!({"status": "partial", "content": "half"})),
            ])
            .calls(vec![("mock__echo", json!({"turn": 1}))])
            .calls(vec![("mock__echo", json!({"turn": 2}))]),
    );
    let s = setup(one("a", AgentConfig { max_turns: Some(2), ..agent("m") }), vec![model.clone()])
        .await;
    let options = RunOptions { transcript: true, ..RunOptions::default() };
    let report = s.agents.run_with("a", "t", &CallContext::new(), &options).await.unwrap();
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Partial, "half"));
    assert_eq!(s.mock.calls_of("echo"), 1, "the last turn's echo ran");
    let Some(Message::Tool { results }) = report.transcript.last() else {
        panic!("{:?}", report.transcript.last())
    };
    assert!(results[0].is_error && results[0].content.contains("last turn"), "{results:?}");

    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Failure);
    assert_eq!(
        report.content,
        "the limit of 2 turns is reached, and the model gave no final report"
    );
    assert_eq!(s.mock.calls_of("echo"), 2, "the last turn's echo ran");
}

/// A plain answer on the last turn, where only the report was asked for, is no success.
#[tokio::test]
async fn a_plain_answer_on_the_last_turn_is_partial() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__echo", json!({}))])
            .then(|_| Ok(ModelResponse::text("next I still need to read them"))),
    );
    let s = setup(one("a", AgentConfig { max_turns: Some(2), ..agent("m") }), vec![model]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Partial, "{}", report.content);
    assert!(report.content.starts_with("next I still need to read them"), "{}", report.content);
    assert!(report.content.contains("without its final report"), "{}", report.content);
}

/// An answer cut at the output limit is not a success: a text goes on where it stopped
/// (the report holds both parts), a call whose arguments were cut is told why, and an
/// answer the content filter stopped fails the run.
#[tokio::test]
async fn answers_cut_by_the_output_limit_or_a_filter_are_not_successes() {
    use toolmux_llm::StopReason;
    let cut = |text: &str| {
        let mut answer = ModelResponse::text(text);
        answer.stop = StopReason::MaxTokens;
        answer
    };
    let first = cut("The answer is a long ");
    let model = Arc::new(
        ScriptedModel::new("m")
            .then(move |_| Ok(first.clone()))
            .then(|request| {
                let told = format!("{:?}", request.messages.last());
                assert!(told.contains("Continue exactly where it stopped"), "{told}");
                Ok(ModelResponse::text("story."))
            })
            .then(|_| {
                let mut call = ModelToolCall::new("c1", "mock__echo", Value::Null);
                call.raw_arguments = Some("{\"text\": \"hal".into());
                let mut answer = ModelResponse::tool_calls(vec![call]);
                answer.stop = StopReason::MaxTokens;
                Ok(answer)
            })
            .report("success", "done"),
    );
    let s = setup(one("a", agent("m")), vec![model.clone()]).await;
    let report = s.agents.run("a", "tell", &CallContext::new()).await.unwrap();
    assert_eq!(
        (report.status, report.content.as_str()),
        (AgentStatus::Success, "The answer is a long story.")
    );
    let report = s.agents.run("a", "write", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    let results = tool_results(&model.requests().pop().unwrap());
    assert!(results[0].1 && results[0].0.contains("reached your output limit"), "{results:?}");

    let filtered = Arc::new(ScriptedModel::new("m").then(|_| {
        let mut answer = ModelResponse::text("I cannot");
        answer.stop = StopReason::ContentFilter;
        Ok(answer)
    }));
    let s = setup(one("a", agent("m")), vec![filtered]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Failure);
    assert!(report.content.contains("content filter"), "{}", report.content);
}

#[tokio::test]
async fn a_model_error_fails_the_run_with_its_message() {
    let model = Arc::new(ScriptedModel::new("m"));
    let s = setup(one("a", agent("m")), vec![model]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Failure);
    assert!(report.content.contains("script exhausted"), "{}", report.content);
}

#[tokio::test]
async fn cancelling_the_run_stops_the_model() {
    let model = Arc::new(ScriptedModel { hang_when_done: true, ..ScriptedModel::new("m") });
    let s = setup(one("a", agent("m")), vec![model]).await;
    let cancel = CancellationToken::new();
    let ctx = CallContext::new().with_cancel(cancel.clone());
    let run = tokio::spawn({
        let agents = s.agents.clone();
        async move { agents.run("a", "t", &ctx).await }
    });
    tokio::task::yield_now().await;
    cancel.cancel();
    let report = tokio::time::timeout(std::time::Duration::from_secs(5), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(report.status, AgentStatus::Failure);
    assert!(report.content.contains("cancelled"), "{}", report.content);
}

/// A sub-agent that names no model thinks with its caller's (the seeds' inherited
/// configuration); run by itself, it says it needs one.
#[tokio::test]
async fn a_sub_agent_without_a_model_thinks_with_its_caller_s() {
    // One scripted model answers both: the parent delegates, the child reports, the parent
    // reports what it said.
    let model = Arc::new(
        ScriptedModel::new("big")
            .calls(vec![("agent__child", json!({"prompt": "find x"}))])
            .report("success", "x is 42")
            .report("success", "done"),
    );
    let mut definitions =
        one("parent", AgentConfig { agents: vec!["child".into()], ..agent("big") });
    definitions.agents.insert(
        "child".into(),
        AgentConfig { description: "Finds things".into(), ..AgentConfig::default() },
    );
    let s = setup(definitions, vec![model.clone()]).await;
    let report = s.agents.run("parent", "what is x?", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 3, "the child's turn went to the parent's model");
    assert_eq!(requests[1].messages, vec![Message::user("find x")]);
    let alone = s.agents.run("child", "find x", &CallContext::new()).await.unwrap_err();
    let said = alone.to_string();
    assert!(said.contains("names no `model`"), "{said}");
}

/// A sub-agent spends its caller's tokens: it gets no more than its caller has left
/// (`tokenBudget`), whatever its own turn limit (it ran 30 turns on a budget of 100).
/// A model `small` that echoes (`mock__echo`, 110 tokens an answer) until only the report
/// is offered, then reports `partial` with `content`; at most `turns` answers.
fn echoing_until_the_last_turn(turns: usize, content: &'static str) -> ScriptedModel {
    let mut model = ScriptedModel::new("small");
    for _ in 0..turns {
        model = model.then(move |request| {
            let only_report = tool_names(request) == ["agent__final_report"];
            let (name, arguments) = if only_report {
                ("agent__final_report", json!({"status": "partial", "content": content}))
            } else {
                ("mock__echo", json!({}))
            };
            Ok(used(ModelResponse::tool_calls(vec![ModelToolCall::new("w", name, arguments)])))
        });
    }
    model
}

/// Agent `parent` (model `big`, with `budget`) that may call agent `child` (model `small`,
/// up to 30 turns).
fn parent_and_child(budget: Option<u64>) -> AgentDefinitions {
    let mut definitions = one(
        "parent",
        AgentConfig { agents: vec!["child".into()], token_budget: budget, ..agent("big") },
    );
    definitions.agents.insert(
        "child".into(),
        AgentConfig { description: "Works".into(), max_turns: Some(30), ..agent("small") },
    );
    definitions
}

#[tokio::test]
async fn a_sub_agent_gets_no_more_than_its_caller_s_token_budget() {
    let parent = Arc::new(
        ScriptedModel::new("big")
            .then(|_| {
                Ok(ModelResponse::tool_calls(vec![ModelToolCall::new(
                    "c",
                    "agent__child",
                    json!({"prompt": "work"}),
                )]))
            })
            .report("partial", "done what the budget allowed"),
    );
    let child = Arc::new(echoing_until_the_last_turn(30, "stopped"));
    let definitions = parent_and_child(Some(250));
    let s = setup(definitions, vec![parent, child.clone()]).await;
    let report = s.agents.run("parent", "go", &CallContext::new()).await.unwrap();
    // 0, 110 and 220 tokens spent before its first three turns; the fourth (330 spent of
    // the 250 its caller had) may only report.
    assert_eq!(child.requests().len(), 4, "the child's turns: {report:?}");
    assert_eq!(tool_names(&child.requests()[3]), ["agent__final_report"]);
}

/// Sub-agents running side by side share what their caller has left: each answer of
/// either is taken from it as it comes, instead of each being given all of it.
#[tokio::test]
async fn sub_agents_side_by_side_share_their_caller_s_token_budget() {
    let parent = Arc::new(
        ScriptedModel::new("big")
            .then(|_| {
                Ok(ModelResponse::tool_calls(vec![
                    ModelToolCall::new("a", "agent__child", json!({"prompt": "one"})),
                    ModelToolCall::new("b", "agent__child", json!({"prompt": "two"})),
                ]))
            })
            .report("partial", "done what the budget allowed"),
    );
    let child = Arc::new(echoing_until_the_last_turn(30, "stopped"));
    let definitions = parent_and_child(Some(250));
    let s = setup(definitions, vec![parent, child.clone()]).await;
    let report = s.agents.run("parent", "go", &CallContext::new()).await.unwrap();
    let requests = child.requests();
    let last_turns = requests.iter().filter(|r| tool_names(r) == ["agent__final_report"]).count();
    assert_eq!(last_turns, 2, "each child ends with a report: {report:?}");
    // Alone, each would have had 250 tokens: 4 turns each, 8 in all. Sharing them, the two
    // stop once 250 are spent between them: three answers of 110 (how they interleave
    // decides whose), at most one more turn begun before the last was counted, and the two
    // reports.
    assert!((5..=6).contains(&requests.len()), "{} turns: {report:?}", requests.len());
}

/// An agent's `priority` goes with its tool calls (to the queues they wait in), and with
/// those of the sub-agents it calls unless they have their own.
#[tokio::test]
async fn an_agent_s_priority_goes_with_its_calls() {
    let parent = Arc::new(
        ScriptedModel::new("big")
            .calls(vec![("mock__prio", json!({})), ("agent__child", json!({"prompt": "go"}))])
            .then(|request| {
                let said: Vec<String> = tool_results(request).into_iter().map(|r| r.0).collect();
                Ok(ModelResponse::tool_calls(vec![ModelToolCall::new(
                    "r",
                    "agent__final_report",
                    json!({"status": "success", "content": said.join(" | ")}),
                )]))
            }),
    );
    let child = Arc::new(ScriptedModel::new("small").calls(vec![("mock__prio", json!({}))]).then(
        |request| {
            let said = tool_results(request).remove(0).0;
            Ok(ModelResponse::tool_calls(vec![ModelToolCall::new(
                "r",
                "agent__final_report",
                json!({"status": "success", "content": format!("child {said}")}),
            )]))
        },
    ));
    let mut definitions = one(
        "parent",
        AgentConfig { agents: vec!["child".into()], priority: Some(7), ..agent("big") },
    );
    definitions
        .agents
        .insert("child".into(), AgentConfig { description: "C".into(), ..agent("small") });
    let models = by_name(&[&parent, &child]);
    let mock = Arc::new(MockProvider::new("mock").with_tool("prio", Behavior::Priority));
    let (agents, _o) = start_agents(definitions, models, vec![mock]).await;
    let report = agents.run("parent", "go", &CallContext::new()).await.unwrap();
    assert!(report.content.starts_with("7 | "), "{report:?}");
    assert!(report.content.contains("child 7"), "{report:?}");
}

/// A parent that delegates to `child` once, then reports what the child said.
fn delegating_parent() -> Arc<ScriptedModel> {
    Arc::new(
        ScriptedModel::new("big").calls(vec![("agent__child", json!({"prompt": "work"}))]).then(
            |request| {
                let results = tool_results(request);
                Ok(ModelResponse::tool_calls(vec![ModelToolCall::new(
                    "r",
                    "agent__final_report",
                    json!({"status": "success", "content": results[0].0}),
                )]))
            },
        ),
    )
}

/// A sub-agent called within `agentTimeout` (here 10s) ends its run before it: a model
/// that stops answering mid-run leaves a report of the tokens used so far (the caller's
/// figures add them up, instead of losing them to a timeout); a slow model is given its
/// last turn in time to report.
#[tokio::test(start_paused = true)]
async fn a_sub_agent_ends_within_the_time_it_was_called_for() {
    let definitions = || parent_and_child(None);
    let config = || {
        OrchestratorConfig::default().with_provider_settings(
            "agent",
            toolmux_orchestrator::ToolSettings::default()
                .with_timeout(std::time::Duration::from_secs(10)),
        )
    };
    // Two turns, then no answer.
    let child = Arc::new(ScriptedModel {
        hang_when_done: true,
        ..ScriptedModel::new("small")
            .calls(vec![("mock__echo", json!({}))])
            .calls(vec![("mock__echo", json!({}))])
    });
    let parent = delegating_parent();
    let models = by_name(&[&parent, &child]);
    let mock = Arc::new(MockProvider::new("mock").with_tool("echo", Behavior::Echo));
    let (agents, _o) = start_agents_with(config(), definitions(), models, vec![mock]).await;
    let started = tokio::time::Instant::now();
    let report = agents.run("parent", "go", &CallContext::new()).await.unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(
        report
            .content
            .contains("ran out of the time it was called for (`agentTimeout`) after 3 turns"),
        "{report:?}"
    );
    // The parent's first turn and the child's two.
    assert_eq!(report.usage, Usage::new(300, 30), "{report:?}");

    // A model taking 3s an answer: turns at 0, 3 and 6s, the third only to report.
    let child = echoing_until_the_last_turn(5, "in time");
    let child = Arc::new(ScriptedModel { delay: std::time::Duration::from_secs(3), ..child });
    let parent = delegating_parent();
    let models = by_name(&[&parent, &child]);
    let mock = Arc::new(MockProvider::new("mock").with_tool("echo", Behavior::Echo));
    let (agents, _o) = start_agents_with(config(), definitions(), models, vec![mock]).await;
    let report = agents.run("parent", "go", &CallContext::new()).await.unwrap();
    assert_eq!(report.content, "in time", "{report:?}");
    assert_eq!(child.requests().len(), 3);
    let last = &child.requests()[2];
    assert_eq!(tool_names(last), ["agent__final_report"]);
    assert_eq!(report.usage, Usage::new(400, 40), "{report:?}");
}

/// A parent (model `big`, agent `parent` of [`parent_and_child`]) that calls agent `child`
/// once and then reports `partial`, and the models by name: it and `child`.
fn parent_calling_child(
    child: &Arc<ScriptedModel>,
) -> (Arc<ScriptedModel>, BTreeMap<String, Arc<dyn Model>>) {
    let parent = Arc::new(
        ScriptedModel::new("big")
            .calls(vec![("agent__child", json!({"prompt": "work"}))])
            .report("partial", "the child timed out"),
    );
    let models = by_name(&[&parent, child]);
    (parent, models)
}

/// Settings under which the orchestrator cuts an agent's call 200 ms after its last
/// progress (which each turn makes), within a 10 s cap.
fn agents_cut_after_200ms_idle() -> OrchestratorConfig {
    let settings = toolmux_orchestrator::ToolSettings::default()
        .with_timeout(std::time::Duration::from_millis(200))
        .with_progress_reset(std::time::Duration::from_secs(10));
    OrchestratorConfig::default().with_provider_settings("agent", settings)
}

/// A sub-agent that the orchestrator cuts at its call's timeout (here 200 ms without
/// progress, which each turn restarts, within a 10 s cap the agent ends its run by) leaves
/// its tokens and calls so far in its caller's figures and budget, where they were lost
/// with it.
#[tokio::test(start_paused = true)]
async fn a_sub_agent_cut_at_its_timeout_leaves_its_figures_to_its_caller() {
    let config = agents_cut_after_200ms_idle();
    // Two turns, then no answer: cut 200 ms later.
    let child = Arc::new(ScriptedModel {
        hang_when_done: true,
        ..ScriptedModel::new("small")
            .calls(vec![("mock__echo", json!({"n": 1}))])
            .calls(vec![("mock__echo", json!({"n": 2}))])
    });
    let (parent, models) = parent_calling_child(&child);
    let mock = Arc::new(MockProvider::new("mock").with_tool("echo", Behavior::Echo));
    let definitions = parent_and_child(Some(250));
    let (agents, _o) = start_agents_with(config, definitions, models, vec![mock]).await;
    let report = agents.run("parent", "go", &CallContext::new()).await.unwrap();
    assert_eq!(child.requests().len(), 3);
    assert_last_turn_says(&parent, "the token budget of 250 is spent (330 used)");
    // The parent's two turns and the child's two; the agent's call and the child's two.
    assert_eq!(report.usage, Usage::new(400, 40), "{report:?}");
    assert_eq!(report.tool_calls, 3, "{report:?}");
}

/// A sub-agent the orchestrator cuts at its call's timeout also leaves its caller the
/// tokens its model spent answering its tools' sampling requests and the calls it refused,
/// which counted only with a report before (usage 300/30 and no refused call).
#[tokio::test(start_paused = true)]
async fn a_cut_sub_agent_leaves_its_sampling_tokens_and_refusals_to_its_caller() {
    let config = agents_cut_after_200ms_idle();
    // A turn that samples and calls a tool that does not exist, the sampling's answer,
    // then no answer: cut 200 ms later.
    let child = Arc::new(ScriptedModel {
        hang_when_done: true,
        ..ScriptedModel::new("small")
            .calls(vec![("sampler__ask", json!({})), ("mock__nope", json!({}))])
            .then(|_| Ok(used(ModelResponse::text("teal"))))
    });
    let (parent, models) = parent_calling_child(&child);
    let mock = Arc::new(MockProvider::new("mock").with_tool("echo", Behavior::Echo));
    let providers: Vec<Arc<dyn ToolProvider>> = vec![mock, Arc::new(Sampler)];
    let (agents, _o) = start_agents_with(config, parent_and_child(None), models, providers).await;
    let report = agents.run("parent", "go", &CallContext::new()).await.unwrap();
    assert_eq!(child.requests().len(), 3, "{report:?}");
    let told = format!("{:?}", parent.requests()[1].messages.last());
    assert!(told.contains("timeout"), "{told}");
    // The parent's two turns, the child's one and its sampling answer.
    assert_eq!(report.usage, Usage::new(400, 40), "{report:?}");
    // The agent's call and the child's sampling tool; the child's call of no tool.
    assert_eq!((report.tool_calls, report.refused_calls), (2, 1), "{report:?}");
}

/// A sub-agent's tokens and calls count in its caller's figures also when its report is
/// refused on its way back (here over the run's `contextTokenBudget`), where they went
/// with the report.
#[tokio::test]
async fn a_sub_agent_s_figures_count_when_its_report_is_refused() {
    let child = Arc::new(
        ScriptedModel::new("small")
            .calls(vec![("mock__echo", json!({}))])
            .report("success", &"a long report; ".repeat(100)),
    );
    let parent = Arc::new(
        ScriptedModel::new("big").calls(vec![("agent__child", json!({"prompt": "work"}))]).then(
            |request| {
                // The report refused, this is the last turn (the budget is spent).
                let said = format!("{:?}", request.messages);
                assert!(said.contains("contextTokenBudget"), "{said}");
                let call = ModelToolCall::new(
                    "r",
                    "agent__final_report",
                    json!({"status": "partial", "content": "x"}),
                );
                Ok(ModelResponse::tool_calls(vec![call]))
            },
        ),
    );
    let models = by_name(&[&parent, &child]);
    let mock = Arc::new(MockProvider::new("mock").with_tool("echo", Behavior::Echo));
    let config = OrchestratorConfig::default().with_context_token_budget(100);
    let (agents, _o) = start_agents_with(config, parent_and_child(None), models, vec![mock]).await;
    let report = agents.run("parent", "go", &CallContext::new()).await.unwrap();
    assert_eq!(parent.requests().len(), 2, "{report:?}");
    // The parent's first turn and the child's two; the delegation and the child's echo.
    assert_eq!(report.usage, Usage::new(300, 30), "{report:?}");
    assert_eq!((report.tool_calls, report.refused_calls), (2, 0), "{report:?}");
}

#[tokio::test]
async fn sub_agents_run_through_the_pipeline_and_add_up() {
    let parent = Arc::new(
        ScriptedModel::new("big")
            .calls(vec![("agent__child", json!({"prompt": "find x"}))])
            .then(|request| {
                let results = tool_results(request);
                Ok(ModelResponse::tool_calls(vec![ModelToolCall::new(
                    "r",
                    "agent__final_report",
                    json!({"status": "success", "content": format!("child said: {}", results[0].0)}),
                )]))
            }),
    );
    let child = Arc::new(
        ScriptedModel::new("small")
            .calls(vec![("mock__echo", json!({"q": "x"})), ("mock__nope", json!({}))])
            .report("success", "x is 42"),
    );
    let mut definitions =
        one("parent", AgentConfig { agents: vec!["child".into()], ..agent("big") });
    definitions.agents.insert(
        "child".into(),
        AgentConfig { description: "Finds things".into(), ..agent("small") },
    );
    let s = setup(definitions, vec![parent.clone(), child.clone()]).await;
    let report = s.agents.run("parent", "what is x?", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    assert_eq!(report.content, "child said: x is 42");
    // The parent's first turn (its second step reports no usage) and the child's two turns;
    // the child's echo and the delegation.
    assert_eq!(report.usage, Usage::new(300, 30));
    // The child's call of a tool it does not have is counted apart, in its caller's too.
    assert_eq!((report.tool_calls, report.refused_calls), (2, 1));
    assert_eq!(child.requests()[0].messages, vec![Message::user("find x")]);
    assert!(tool_names(&parent.requests()[0]).contains(&"agent__child".to_owned()));
    // The agents are tools of the orchestrator too (for MCP clients).
    let listed: Vec<String> = s.orchestrator.tools().into_iter().map(|t| t.name).collect();
    assert!(
        listed.contains(&"agent__child".to_owned()) && listed.contains(&"agent__parent".to_owned())
    );
}

#[tokio::test]
async fn agents_calling_agents_stop_at_the_depth_limit() {
    // `deep` delegates to itself; at the limit it is offered no agent (a call of one would
    // be refused), and works alone.
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("agent__deep", json!({"prompt": "go deeper"}))])
            .then(|request| {
                let offered = tool_names(request);
                Ok(ModelResponse::text(format!("level 2 was offered: {}", offered.join(","))))
            })
            .then(|request| {
                let results = tool_results(request);
                Ok(ModelResponse::text(format!("level 1 got: {}", results[0].0)))
            }),
    );
    let mut definitions = one("deep", AgentConfig { agents: vec!["deep".into()], ..agent("m") });
    definitions.max_depth = Some(2);
    let s = setup(definitions, vec![model.clone()]).await;
    let report = s.agents.run("deep", "t", &CallContext::new()).await.unwrap();
    assert!(report.content.starts_with("level 1 got: level 2 was offered: "), "{}", report.content);
    assert!(!report.content.contains("agent__deep"), "{}", report.content);
    assert!(tool_names(&model.requests()[0]).contains(&"agent__deep".to_owned()));

    // A call at the limit all the same (a model naming a tool it was not offered) is refused.
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("agent__deep", json!({"prompt": "go deeper"}))])
            .calls(vec![("agent__deep", json!({"prompt": "deeper still"}))])
            .then(|request| {
                let results = tool_results(request);
                Ok(ModelResponse::text(format!("level 2 got: {}", results[0].0)))
            })
            .then(|request| Ok(ModelResponse::text(tool_results(request)[0].0.clone()))),
    );
    let mut definitions = one("deep", AgentConfig { agents: vec!["deep".into()], ..agent("m") });
    definitions.max_depth = Some(2);
    let s = setup(definitions, vec![model]).await;
    let report = s.agents.run("deep", "t", &CallContext::new()).await.unwrap();
    assert!(report.content.starts_with("level 2 got: (tool failed:"), "{}", report.content);
}

#[tokio::test]
async fn a_hand_off_passes_the_task_on() {
    let front = Arc::new(ScriptedModel::new("front").calls(vec![(
        "router__handoff-to",
        json!({"agent": "billing", "message": "they were charged twice"}),
    )]));
    let billing = Arc::new(ScriptedModel::new("billing").report("success", "refunded"));
    let definitions = front_and_billing("front");
    let s = setup(definitions, vec![front.clone(), billing.clone()]).await;
    let report = s.agents.run("front", "I was charged twice", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "refunded"));
    assert_eq!(report.agent, "billing");
    assert_eq!(report.handoffs, vec!["front", "billing"]);
    assert_eq!(report.turns, 2);
    let handoff_tool =
        front.requests()[0].tools.iter().find(|t| t.name == "router__handoff-to").cloned().unwrap();
    assert_eq!(handoff_tool.input_schema["properties"]["agent"]["enum"], json!(["billing"]));
    match &billing.requests()[0].messages[0] {
        Message::User { content } => {
            assert!(content.starts_with("I was charged twice"), "{content}");
            assert!(content.contains("agent `front`: they were charged twice"), "{content}");
        }
        other => panic!("{other:?}"),
    }
}

/// Results the agent handing the task on took from the inbox and did not read are given
/// to the agent taking it over, whose inbox it is too, one a turn: before, they went
/// straight to the final report, unread by any model.
#[tokio::test]
async fn results_an_agent_did_not_read_go_to_the_agent_it_hands_off_to() {
    let (front, providers) =
        three_builds(|m| m.calls(vec![("router__handoff-to", json!({"agent": "billing"}))]));
    let billing = Arc::new(
        ScriptedModel::new("billing").report("success", "early").report("success", "all read"),
    );
    let definitions = front_and_billing("m");
    let models = by_name(&[&front, &billing]);
    let config = OrchestratorConfig::default().with_response_max_bytes(500);
    let (agents, orchestrator) = start_agents_with(config, definitions, models, providers).await;
    let report = agents.run("front", "build all three", &CallContext::new()).await.unwrap();
    orchestrator.cleanup().await;
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "all read"));
    assert_eq!(report.handoffs, ["front", "billing"]);
    assert!(report.unread_results.is_empty(), "{report:?}");
    let given: Vec<u64> = billing
        .requests()
        .iter()
        .filter_map(|r| match r.messages.last() {
            Some(Message::User { content }) if content.contains("built") => {
                let (_, results) = content.split_once(":\n").unwrap();
                let results: Vec<Value> =
                    serde_json::from_str(results.trim_end_matches(')')).unwrap();
                Some(targets(&results))
            }
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(given, [1, 2]);
}

/// The run's asynchronous calls whose results had not come when an agent handed the task
/// on are the next agent's to wait for: its model is given their results as they arrive,
/// with how many are still to come, and the run leaves nothing in the inbox. Before, the
/// agent taking over counted only its own calls, never read the inbox, and the results
/// stayed there, read by no model and missing from the report.
#[tokio::test]
async fn calls_pending_at_a_hand_off_are_waited_for_by_the_next_agent() {
    use toolmux_external::PendingStore;
    let (store, external) = async_external("build", "Starts a build");
    let builds: Vec<(&str, Value)> =
        (0..2).map(|i| ("external__build", json!({"target": i}))).collect();
    let front = Arc::new(
        ScriptedModel::new("front")
            .calls(builds)
            .calls(vec![("router__handoff-to", json!({"agent": "billing"}))]),
    );
    // Each turn of the agent taking over, one build is done meanwhile.
    let answering = |target: u64| {
        let store = store.clone();
        move |_: &ModelRequest| {
            answer_pending(
                &store,
                move |a| a["target"] == target,
                json!(format!("built {target}")),
            );
            let echo = ModelToolCall::new(format!("e{target}"), "mock__echo", json!({"n": target}));
            Ok(used(ModelResponse::tool_calls(vec![echo])))
        }
    };
    let billing = Arc::new(
        ScriptedModel::new("billing")
            .then(answering(0))
            .then(answering(1))
            .report("success", "both built"),
    );
    let definitions = front_and_billing("front");
    let models = by_name(&[&front, &billing]);
    let mock = MockProvider::new("mock").with_tool("echo", Behavior::Echo);
    let providers: Vec<Arc<dyn ToolProvider>> = vec![Arc::new(external), Arc::new(mock)];
    let (agents, orchestrator) = start_agents(definitions, models, providers).await;
    let report = agents.run("front", "build both", &CallContext::new()).await.unwrap();
    orchestrator.cleanup().await;
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "both built"));
    assert_eq!(report.handoffs, ["front", "billing"]);
    assert!(report.unread_results.is_empty(), "{report:?}");
    let arrived: Vec<String> = billing
        .requests()
        .iter()
        .filter_map(|r| match r.messages.last() {
            Some(Message::User { content }) if content.starts_with("(Results of") => {
                Some(content.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(arrived.len(), 2, "{arrived:?}");
    assert!(
        arrived[0].starts_with(
            "(Results of your earlier asynchronous tool calls arrived (1 still pending):"
        ) && arrived[0].contains("built 0"),
        "{}",
        arrived[0]
    );
    assert!(
        arrived[1].starts_with("(Results of your earlier asynchronous tool calls arrived:")
            && arrived[1].contains("built 1"),
        "{}",
        arrived[1]
    );
    let left = store.take_inbox("default", None).await.unwrap();
    assert!(left.is_empty(), "results left in the inbox: {left:?}");
}

#[tokio::test]
async fn hand_offs_back_and_forth_are_stopped() {
    let mut ping = ScriptedModel::new("ping");
    let mut pong = ScriptedModel::new("pong");
    for _ in 0..10 {
        ping = ping.calls(vec![("router__handoff-to", json!({"agent": "b"}))]);
        pong = pong.calls(vec![("router__handoff-to", json!({"agent": "a"}))]);
    }
    let mut definitions = one("a", agent("ping"));
    definitions.agents.insert("b".into(), agent("pong"));
    definitions.router = Some(RouterConfig { destinations: vec!["a".into(), "b".into()] });
    let s = setup(definitions, vec![Arc::new(ping), Arc::new(pong)]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Failure);
    assert!(report.content.contains("handed off 9 times"), "{}", report.content);
}

/// A model `name` that hands the task to agent `to` whenever it may, and reports
/// `partial` when only the report is offered (the last turn); 110 tokens an answer.
fn handing_to(name: &str, to: &'static str) -> ScriptedModel {
    let mut model = ScriptedModel::new(name);
    for _ in 0..10 {
        model = model.then(move |request| {
            let (tool, arguments) = if tool_names(request) == ["agent__final_report"] {
                ("agent__final_report", json!({"status": "partial", "content": "stopped"}))
            } else {
                ("router__handoff-to", json!({"agent": to}))
            };
            Ok(used(ModelResponse::tool_calls(vec![ModelToolCall::new("h", tool, arguments)])))
        });
    }
    model
}

/// The turn limit and the token budget are the run's: agents handing the task back and
/// forth stop at them, where each hand-off started both afresh and only the limit of
/// hand-offs (9 sessions) ended the run.
#[tokio::test]
async fn hand_offs_back_and_forth_stop_at_the_run_s_limits() {
    for (limits, turns) in [
        (AgentConfig { max_turns: Some(3), ..AgentConfig::default() }, 3),
        // 110 tokens a turn: 330 spent before the fourth, which is the last.
        (AgentConfig { token_budget: Some(250), ..AgentConfig::default() }, 4),
    ] {
        let mut definitions = one("a", AgentConfig { model: "ping".into(), ..limits.clone() });
        definitions.agents.insert("b".into(), AgentConfig { model: "pong".into(), ..limits });
        definitions.router = Some(RouterConfig { destinations: vec!["a".into(), "b".into()] });
        let models = vec![Arc::new(handing_to("ping", "b")), Arc::new(handing_to("pong", "a"))];
        let s = setup(definitions, models).await;
        let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
        assert_eq!(report.status, AgentStatus::Partial, "{report:?}");
        assert_eq!(report.turns, turns, "{report:?}");
        assert_eq!(report.handoffs.len(), turns as usize, "{report:?}");
    }
}

#[tokio::test]
async fn a_report_must_match_the_output_schema() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![(
                "agent__final_report",
                json!({"status": "success", "content_json": {"count": "many"}}),
            )])
            .calls(vec![(
                "agent__final_report",
                json!({"status": "success", "content_json": {"count": 3}}),
            )]),
    );
    let schema = json!({"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]});
    let s = setup(
        one("a", AgentConfig { output_schema: Some(schema), ..agent("m") }),
        vec![model.clone()],
    )
    .await;
    let report = s.agents.run("a", "count", &CallContext::new()).await.unwrap();
    assert_eq!(report.content_json, Some(json!({"count": 3})));
    assert_eq!(report.format, "json");
    assert_eq!(report.text(), "{\n  \"count\": 3\n}");
    let results = tool_results(&model.requests()[1]);
    assert!(results[0].1 && results[0].0.contains("/count"), "{results:?}");
}

#[tokio::test]
async fn a_question_without_anyone_to_ask_ends_the_run() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("agent__ask_user", json!({"question": "Which branch?"}))]),
    );
    let s = setup(one("a", AgentConfig { ask_user: true, ..agent("m") }), vec![model]).await;
    let report = s.agents.run("a", "merge it", &CallContext::new()).await.unwrap();
    assert_eq!(
        (report.status, report.content.as_str()),
        (AgentStatus::NeedsInput, "Which branch?")
    );
    assert_eq!(report.to_output().to_text(), "(agent `a` needs input) Which branch?");
}

#[derive(Debug)]
struct Answers;

#[async_trait]
impl InteractionHandler for Answers {
    async fn approve(&self, _request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Deny { reason: "no".into() }
    }

    async fn clarify(&self, question: &str) -> Option<String> {
        Some(format!("main, to answer `{question}`"))
    }
}

#[tokio::test]
async fn a_question_is_answered_by_the_handler() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("agent__ask_user", json!({"question": "Which branch?"}))])
            .report("success", "merged"),
    );
    let s =
        setup(one("a", AgentConfig { ask_user: true, ..agent("m") }), vec![model.clone()]).await;
    let ctx = CallContext::new().with_handler(Arc::new(Answers));
    let report = s.agents.run("a", "merge it", &ctx).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    assert_eq!(
        tool_results(&model.requests()[1]),
        vec![("main, to answer `Which branch?`".to_owned(), false)]
    );
}

/// Somebody who is asked but never answers.
#[derive(Debug)]
struct Silent;

#[async_trait]
impl InteractionHandler for Silent {
    async fn approve(&self, _request: ApprovalRequest) -> ApprovalDecision {
        ApprovalDecision::Deny { reason: "no".into() }
    }

    async fn clarify(&self, _question: &str) -> Option<String> {
        std::future::pending().await
    }
}

/// A question nobody answers in time: the model goes on with its default answer, or on
/// its own judgement without one; the shorter of its wait and the configured one counts.
#[tokio::test(start_paused = true)]
async fn an_unanswered_question_times_out_to_its_default() {
    let asked = |arguments: Value| {
        Arc::new(
            ScriptedModel::new("m")
                .calls(vec![("agent__ask_user", arguments)])
                .report("success", "merged"),
        )
    };
    let config = AgentConfig { ask_user: true, ask_user_timeout: Some(60), ..agent("m") };
    let cases = [
        (
            json!({"question": "Which branch?", "default_answer": "main", "timeout_seconds": 5}),
            "(no answer within 5 s; go on with your default answer: main)",
        ),
        (
            json!({"question": "Which branch?", "timeout_seconds": 600}),
            "(no answer within 60 s: decide for yourself, and say in your report what you \
             assumed)",
        ),
    ];
    for (arguments, expected) in cases {
        let model = asked(arguments);
        let s = setup(one("a", config.clone()), vec![model.clone()]).await;
        let ctx = CallContext::new().with_handler(Arc::new(Silent));
        let started = tokio::time::Instant::now();
        let report = s.agents.run("a", "merge it", &ctx).await.unwrap();
        assert_eq!(report.status, AgentStatus::Success);
        assert_eq!(tool_results(&model.requests()[1]), vec![(expected.to_owned(), false)]);
        assert!(started.elapsed() <= std::time::Duration::from_secs(61));
    }

    // Nobody to ask at all: the default answer, instead of ending the run.
    let model = asked(json!({"question": "Which branch?", "default_answer": "main"}));
    let s = setup(one("a", config), vec![model.clone()]).await;
    let report = s.agents.run("a", "merge it", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    assert_eq!(
        tool_results(&model.requests()[1]),
        vec![("(nobody can answer now; go on with your default answer: main)".to_owned(), false)]
    );
}

#[tokio::test]
async fn a_batch_runs_calls_together() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![(
                "agent__batch",
                json!({"calls": [
                    {"tool": "mock__echo", "arguments": {"n": 1}},
                    {"tool": "mock__broken"},
                    {"tool": "agent__final_report", "arguments": {}}
                ]}),
            )])
            .report("success", "ok"),
    );
    let s = setup(one("a", AgentConfig { batch: true, ..agent("m") }), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    // The echo and the broken tool ran; the report, which no batch may call, did not.
    assert_eq!(
        (report.status, report.tool_calls, report.refused_calls),
        (AgentStatus::Success, 2, 1)
    );
    let results = tool_results(&model.requests()[1]);
    let batch: Value = serde_json::from_str(&results[0].0).unwrap();
    assert_eq!(batch[0]["ok"], json!(true));
    assert!(batch[0]["result"].as_str().unwrap().contains("\"n\""));
    assert_eq!(batch[1]["ok"], json!(false));
    assert!(batch[2]["error"].as_str().unwrap().contains("cannot be called in a batch"));
}

#[tokio::test]
async fn a_tool_that_ends_the_turn_ends_the_run_with_its_result() {
    let model = Arc::new(ScriptedModel::new("m").calls(vec![("mock__done", json!({}))]));
    let s = setup(one("a", agent("m")), vec![model]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "all done"));
}

#[tokio::test]
async fn an_agent_called_as_a_tool_reports_its_figures() {
    let model = Arc::new(ScriptedModel::new("m").report("success", "done it"));
    let s = setup(one("a", agent("m")), vec![model]).await;
    let result = s
        .orchestrator
        .execute(
            toolmux_core::ToolCall::new("agent__a", json!({"prompt": "do it"})),
            &CallContext::new(),
        )
        .await;
    assert!(result.ok, "{result:?}");
    assert_eq!(result.result.as_deref(), Some("done it"));
    assert_eq!(result.extras["status"], json!("success"));
    assert_eq!(result.extras["usage"], json!({"inputTokens": 100, "outputTokens": 10}));
    let missing = s
        .orchestrator
        .execute(toolmux_core::ToolCall::new("agent__a", json!({})), &CallContext::new())
        .await;
    assert!(!missing.ok);
    assert!(missing.error.unwrap().contains("prompt"));
}

#[tokio::test]
async fn the_transcript_is_kept_when_asked() {
    let model = Arc::new(
        ScriptedModel::new("m").calls(vec![("mock__echo", json!({}))]).report("success", "ok"),
    );
    let s = setup(one("a", agent("m")), vec![model]).await;
    let options = RunOptions { transcript: true, ..RunOptions::default() };
    let report = s.agents.run_with("a", "t", &CallContext::new(), &options).await.unwrap();
    assert_eq!(report.transcript.len(), 5, "{:?}", report.transcript);
    assert!(matches!(report.transcript[2], Message::Tool { .. }));
}

#[tokio::test]
async fn inconsistent_definitions_are_refused_with_what_to_fix() {
    let model: Arc<dyn Model> = Arc::new(ScriptedModel::new("m"));
    let models = || BTreeMap::from([("m".to_owned(), model.clone())]);
    let err =
        |definitions: AgentDefinitions| Agents::new(definitions, models()).unwrap_err().to_string();
    assert_eq!(err(one("a", agent("gpt"))), "agents.a: model `gpt` is not configured; models: m");
    assert_eq!(
        err(one("a", AgentConfig { agents: vec!["b".into()], ..agent("m") })),
        "agents.a: `agents` names `b`, which is not an agent; agents: a"
    );
    assert!(err(one("final_report", agent("m"))).contains("rename the agent"));
    assert!(err(one("a b", agent("m"))).contains("1 to 48 letters"));
    let mut routed = one("a", agent("m"));
    routed.router = Some(RouterConfig { destinations: vec!["z".into()] });
    assert_eq!(err(routed), "agents.router: destination `z` is not an agent; agents: a");
    assert!(
        err(one("a", AgentConfig { output_schema: Some(json!({"type": 5})), ..agent("m") }))
            .contains("outputSchema")
    );
    let agents = Agents::new(one("a", agent("m")), models()).unwrap();
    let unknown = agents.run("b", "t", &CallContext::new()).await.unwrap_err();
    assert!(matches!(unknown, AgentError::UnknownAgent { .. }));
    assert_eq!(unknown.to_string(), "unknown agent `b`; configured: a");
    let detached = agents.run("a", "t", &CallContext::new()).await.unwrap_err();
    assert!(matches!(detached, AgentError::Detached));
}

/// A provider whose one tool asks its caller's model (MCP sampling) and returns the answer.
#[derive(Debug)]
struct Sampler;

#[async_trait]
impl ToolProvider for Sampler {
    fn kind(&self) -> toolmux_core::ToolKind {
        toolmux_core::ToolKind::Mcp
    }

    fn namespace(&self) -> &str {
        "sampler"
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        Ok(vec![ToolSpec::new("ask", "Asks the caller's model", ToolSpec::any_object_schema())])
    }

    async fn call(
        &self,
        _name: &str,
        _arguments: Value,
        ctx: &CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        let mut request = toolmux_core::SamplingRequest::text("Name a colour", 20);
        request.system_prompt = Some("One word.".into());
        let answer = ctx.sample(request).await?;
        Ok(toolmux_core::ToolOutput::text(format!("the model said {:?}", answer.content)))
    }
}

#[tokio::test]
async fn the_agent_answers_its_tools_sampling_with_its_model() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("sampler__ask", json!({}))])
            .then(|request| {
                // The tool's sampling request: its system prompt, no tools.
                assert_eq!(request.system.as_deref(), Some("One word."));
                assert!(request.tools.is_empty());
                assert_eq!(request.messages, vec![Message::user("Name a colour")]);
                Ok(used(ModelResponse::text("teal")))
            })
            .then(|request| {
                let results = tool_results(request);
                Ok(ModelResponse::text(format!("tool: {}", results[0].0)))
            }),
    );
    let models = only(&model);
    let agents = Agents::new(one("a", agent("m")), models).unwrap();
    let orchestrator = Orchestrator::builder(OrchestratorConfig::default())
        .provider(Arc::new(Sampler))
        .build()
        .unwrap();
    agents.attach(&orchestrator);
    assert!(orchestrator.warmup().await.is_ok());
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    assert!(report.content.contains("teal"), "{}", report.content);
    // The first turn and the sampling answer carry usage; the last step none.
    assert_eq!(report.usage, Usage::new(200, 20));
}

#[tokio::test]
async fn old_tool_results_give_way_to_the_context_window() {
    let mut model = ScriptedModel::new("m");
    model.window = Some(6000);
    let model = Arc::new(
        model
            .calls(vec![("mock__big", json!({}))])
            .calls(vec![("mock__big", json!({}))])
            .calls(vec![("mock__big", json!({}))])
            .report("success", "read it all"),
    );
    let s = setup(one("a", agent("m")), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success);
    let requests = model.requests();
    let results = |request: &ModelRequest| -> Vec<usize> {
        request
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::Tool { results } => Some(results[0].content.len()),
                _ => None,
            })
            .collect()
    };
    // Two results of about 2,000 tokens each fit in 80% of 6,000; the third does not, and
    // the oldest gives way, for good; the latest is never cut.
    let third = results(&requests[2]);
    assert!(third.iter().all(|&n| n > 7000), "{third:?}");
    let fourth = results(&requests[3]);
    assert!(fourth[0] < 300 && fourth[1] > 7000 && fourth[2] > 7000, "{fourth:?}");
    match &requests[3].messages[2] {
        Message::Tool { results } => {
            assert!(
                results[0].content.contains("elided to keep the conversation"),
                "{}",
                results[0].content
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_spent_token_budget_makes_the_next_turn_the_last() {
    // Every scripted turn uses 110 tokens: after two, 220 of a budget of 200 are spent.
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__echo", json!({}))])
            .calls(vec![("mock__echo", json!({}))])
            .report("partial", "out of tokens"),
    );
    let config = AgentConfig { token_budget: Some(200), ..agent("m") };
    let s = setup(one("a", config), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.turns), (AgentStatus::Partial, 3));
    assert_last_turn_says(&model, "the token budget of 200 is spent (220 used)");
}

/// Usage figures at `u64::MAX` (whatever a model client lets through) add up saturating,
/// where the sum panicked (debug) or wrapped to a small figure that let the run go on past
/// its token budget (release).
#[tokio::test]
async fn usage_figures_at_the_limit_add_up_saturating() {
    let huge = |mut answer: ModelResponse| {
        answer.usage = Usage::new(u64::MAX, u64::MAX);
        answer
    };
    let model = Arc::new(
        ScriptedModel::new("m")
            .then(move |_| {
                Ok(huge(ModelResponse::tool_calls(vec![ModelToolCall::new(
                    "c1",
                    "mock__echo",
                    json!({}),
                )])))
            })
            .report("partial", "out of tokens"),
    );
    let config = AgentConfig { token_budget: Some(200), ..agent("m") };
    let s = setup(one("a", config), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.turns), (AgentStatus::Partial, 2));
    assert_eq!(report.usage.input_tokens, u64::MAX);
    assert_last_turn_says(&model, "the token budget of 200 is spent");
}

/// The model's last turn could only report, and was told why: `why`.
fn assert_last_turn_says(model: &ScriptedModel, why: &str) {
    let last = model.requests().pop().unwrap();
    assert_eq!(last.tool_choice, ToolChoice::Tool("agent__final_report".into()));
    match last.messages.last() {
        Some(Message::User { content }) => assert!(content.contains(why), "{content}"),
        other => panic!("{other:?}"),
    }
}

/// When the orchestrator refuses a tool's output for the run's context-token budget
/// (`toolBudgetExceeded`), more calls would be refused alike: the next turn is the last.
#[tokio::test]
async fn a_spent_tool_output_budget_makes_the_next_turn_the_last() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__big", json!({}))])
            .report("partial", "out of room"),
    );
    let mock: Arc<dyn ToolProvider> =
        Arc::new(MockProvider::new("mock").with_tool("big", Behavior::Big(8000)));
    let config = OrchestratorConfig::default().with_context_token_budget(1000);
    let (agents, _orchestrator) =
        start_agents_with(config, one("a", agent("m")), only(&model), vec![mock]).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.turns), (AgentStatus::Partial, 2));
    assert_last_turn_says(&model, "budget for tool output");
}

#[tokio::test]
async fn task_status_is_recorded_and_reported_as_progress() {
    let status = json!({"status": "in-progress", "done": "listed", "now": "reading the notes"});
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("agent__task_status", status.clone()), ("mock__echo", json!({}))])
            .report("success", "ok"),
    );
    let s =
        setup(one("a", AgentConfig { task_status: true, ..agent("m") }), vec![model.clone()]).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let seen = seen.clone();
        toolmux_core::ProgressSink::new(move |p| {
            seen.lock().unwrap().push(p.message.unwrap_or_default());
        })
    };
    let ctx = CallContext::new().with_progress(sink);
    let report = s.agents.run("a", "t", &ctx).await.unwrap();
    assert_eq!(report.task_status, Some(status));
    assert_eq!(report.tool_calls, 1, "the session's own tools are not counted");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            "a: turn 1: agent__task_status, mock__echo",
            "a: reading the notes",
            "a: turn 2: agent__final_report"
        ]
    );
    assert!(tool_names(&model.requests()[0]).contains(&"agent__task_status".to_owned()));

    // Not offered, it is not answered either.
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("agent__task_status", json!({"status": "starting"}))])
            .report("success", "ok"),
    );
    let s = setup(one("a", agent("m")), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.task_status, None);
    assert!(!tool_names(&model.requests()[0]).contains(&"agent__task_status".to_owned()));
    let results = tool_results(&model.requests()[1]);
    assert!(results[0].1 && results[0].0.contains("unknown tool"), "{results:?}");
}

/// An answer of `text` and one call of `tool` with `arguments`.
fn text_and_call(text: &str, tool: &str, arguments: Value) -> ModelResponse {
    let mut answer = ModelResponse::tool_calls(vec![ModelToolCall::new("call_7", tool, arguments)]);
    answer.content = text.into();
    used(answer)
}

#[tokio::test]
async fn the_text_and_the_calls_stream_to_whoever_follows_them() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .then(|_| Ok(text_and_call("Let me echo it.", "mock__echo", json!({"say": "hi"}))))
            .then(|_| Ok(used(ModelResponse::text("It said hi."))))
            .calls(vec![("mock__echo", json!({}))])
            .then(|_| Ok(used(ModelResponse::text("Quiet now."))))
            .then(|_| Ok(used(ModelResponse::text("Alone.")))),
    );
    let s = setup(one("a", agent("m")), vec![model.clone()]).await;

    // The run's sink gets the text as it is written, and the orchestrator's observers get
    // the text and the calls' arguments as events.
    let texts = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let texts = texts.clone();
        TextSink::new(move |agent, delta| {
            if let TextDelta::Text(text) = delta {
                texts.lock().unwrap().push(format!("{agent}: {text}"));
            }
        })
    };
    let mut events = s.orchestrator.subscribe();
    let options = RunOptions { on_text: Some(sink), ..RunOptions::default() };
    let ctx = CallContext::new().with_run_id("run-7");
    let report = s.agents.run_with("a", "echo hi", &ctx, &options).await.unwrap();
    assert_eq!(report.content, "It said hi.");
    assert_eq!(
        *texts.lock().unwrap(),
        ["a: Let ", "a: me ", "a: echo ", "a: it.", "a: It ", "a: said ", "a: hi."]
    );
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    let text: String = seen
        .iter()
        .filter_map(|e| match e {
            ToolEvent::AgentText {
                agent,
                run_id,
                text,
                restart: false,
                parent_op_id: None,
                ..
            } => {
                assert_eq!((agent.as_str(), run_id.as_str()), ("a", "run-7"));
                Some(text.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(text, "Let me echo it.It said hi.");
    let fragments: Vec<(usize, &str)> = seen
        .iter()
        .enumerate()
        .filter_map(|(at, e)| match e {
            ToolEvent::ToolStreaming { call_id, tool, arguments_delta, run_id, .. } => {
                assert_eq!((call_id.as_str(), tool.as_str()), ("call_7", "mock__echo"));
                assert_eq!(run_id, "run-7");
                Some((at, arguments_delta.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(fragments.len(), 2, "{seen:#?}");
    let arguments: String = fragments.iter().map(|(_, f)| *f).collect();
    assert_eq!(serde_json::from_str::<Value>(&arguments).unwrap(), json!({"say": "hi"}));
    // The call starts after its arguments were written, under the same id.
    let started = seen
        .iter()
        .position(
            |e| matches!(e, ToolEvent::ToolStarted { call_id: Some(id), .. } if id == "call_7"),
        )
        .expect("the call started");
    assert!(fragments.iter().all(|(at, _)| *at < started), "{seen:#?}");
    assert_eq!(model.streamed.load(Ordering::Relaxed), 2);

    // Followed by an observer alone, answers still stream.
    let report = s.agents.run("a", "echo again", &ctx).await.unwrap();
    assert_eq!(report.content, "Quiet now.");
    assert_eq!(model.streamed.load(Ordering::Relaxed), 4);
    assert!(events.try_recv().is_ok());

    // Followed by nobody, nothing streams.
    drop(events);
    let report = s.agents.run("a", "alone", &CallContext::new()).await.unwrap();
    assert_eq!(report.content, "Alone.");
    assert_eq!(model.streamed.load(Ordering::Relaxed), 4);
    assert_eq!(model.requests().len(), 5);
}

#[tokio::test]
async fn an_agent_searches_deferred_tools_and_calls_what_it_found() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("tools__search", json!({"query": "refund a payment"}))])
            .calls(vec![("billing__refund_charge", json!({"charge": "ch_1"}))])
            .calls(vec![("tools__search", json!({"query": "delete customer"}))])
            .report("success", "refunded ch_1")
            .calls(vec![("billing__refund_charge", json!({"charge": "ch_2"}))])
            .report("success", "refunded ch_2"),
    );
    let models = only(&model);
    // The agent may refund, not delete customers.
    let config = AgentConfig { tools: Some(vec!["billing__refund_*".into()]), ..agent("m") };
    let agents = Agents::new(one("a", config), models).unwrap();
    let schema = |p: &str| json!({"type": "object", "properties": {p: {"type": "string"}}});
    let billing = Arc::new(
        MockProvider::new("billing")
            .with_spec(
                ToolSpec::new("refund_charge", "Refunds a payment", schema("charge")),
                Behavior::Text("refunded".into()),
            )
            .with_spec(
                ToolSpec::new("delete_customer", "Deletes a customer", schema("id")),
                Behavior::Text("deleted".into()),
            ),
    );
    let orchestrator = Orchestrator::builder(OrchestratorConfig {
        deferred: vec!["billing__*".into()],
        ..OrchestratorConfig::default()
    })
    .provider(billing.clone())
    .provider(agents.provider())
    .build()
    .unwrap();
    agents.attach(&orchestrator);
    assert!(orchestrator.warmup().await.is_ok());

    let options = RunOptions { transcript: true, ..RunOptions::default() };
    let report = agents.run_with("a", "refund ch_1", &CallContext::new(), &options).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    assert_eq!(billing.calls_of("refund_charge"), 1);
    let requests = model.requests();
    // Deferred tools are not offered until found; the search is.
    let first = tool_names(&requests[0]);
    assert!(first.contains(&"tools__search".to_owned()), "{first:?}");
    assert!(!first.iter().any(|n| n.starts_with("billing__")), "{first:?}");
    let found = tool_results(&requests[1]);
    assert!(found[0].0.contains("billing__refund_charge") && !found[0].1, "{found:?}");
    assert!(tool_names(&requests[1]).contains(&"billing__refund_charge".to_owned()));
    assert_eq!(tool_results(&requests[2]), vec![("refunded".to_owned(), false)]);
    // A tool the agent may not call is not found for it.
    let none = tool_results(&requests[3]);
    assert!(none[0].0.contains("No tool matches"), "{none:?}");
    assert!(!tool_names(&requests[3]).contains(&"billing__delete_customer".to_owned()));

    // The conversation goes on: a tool found and called before is offered from the start.
    let options = RunOptions { history: report.transcript, ..RunOptions::default() };
    let report = agents.run_with("a", "and ch_2", &CallContext::new(), &options).await.unwrap();
    assert_eq!(report.content, "refunded ch_2");
    assert!(tool_names(&model.requests()[4]).contains(&"billing__refund_charge".to_owned()));
    assert_eq!(billing.calls_of("refund_charge"), 2);
}

/// A PNG's 8-byte signature in base64.
const PNG: &str = "iVBORw0KGgo=";

fn png() -> ContentPart {
    ContentPart::Image { data: PNG.into(), mime_type: "image/png".into() }
}

/// Agents `a` on `model` (with `agent__batch`) and an orchestrator whose tool `shots__take`
/// returns `output`.
async fn with_image_tool(
    model: Arc<dyn Model>,
    output: toolmux_core::ToolOutput,
) -> (Agents, Orchestrator) {
    let name = model.name().to_owned();
    let config = AgentConfig { batch: true, ..agent(&name) };
    let shots = MockProvider::new("shots").with_tool("take", Behavior::Output(output));
    start_agents(one("a", config), BTreeMap::from([(name, model)]), vec![Arc::new(shots)]).await
}

/// A tool's images reach the model over each API, with the tool's text: Anthropic's in the
/// tool result, chat completions' in a user message after the turn's tool messages. At
/// most four images of a result are shown, of the types the APIs read; the text says why
/// the others are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_tools_return_reach_the_model_over_both_apis() {
    let webp = ContentPart::Resource {
        uri: "file:///shot.webp".into(),
        mime_type: Some("image/webp".into()),
        text: None,
        blob: Some(PNG.into()),
    };
    let svg = ContentPart::Image { data: "PHN2Zy8+".into(), mime_type: "image/svg+xml".into() };
    let output = toolmux_core::ToolOutput {
        content: vec![
            ContentPart::Text { text: "Screenshot of the page".into() },
            png(),
            svg,
            webp,
            png(),
            png(),
            png(),
        ],
        ..toolmux_core::ToolOutput::default()
    };
    let text = "Screenshot of the page\n[image image/png, 8 bytes]\n[image image/svg+xml, 6 bytes]\n\
        [resource file:///shot.webp: image/webp, 8 bytes]\n[image image/png, 8 bytes]\n\
        [image image/png, 8 bytes]\n[image image/png, 8 bytes]\n\
        [image image/svg+xml, 6 bytes: not shown: models read only jpeg, png, gif and webp images]\n\
        [image image/png, 8 bytes: not shown: a tool result shows at most 4 images]";
    for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
        let server = ScriptedLlmServer::start(
            dialect,
            vec![ScriptStep::tool_call("shots__take", json!({})), ScriptStep::text("A page.")],
        );
        let model = model_speaking(dialect, &server);
        let (agents, orchestrator) = with_image_tool(model, output.clone()).await;
        let report = agents.run("a", "look at the page", &CallContext::new()).await.unwrap();
        assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "A page."));
        let requests = server.requests();
        assert_eq!(requests.len(), 2, "{requests:#?}");
        let messages = requests[1]["messages"].as_array().unwrap();
        let png = |media: &str| match dialect {
            Dialect::OpenAi => json!({"type": "image_url",
                "image_url": {"url": format!("data:{media};base64,{PNG}")}}),
            Dialect::Anthropic => json!({"type": "image",
                "source": {"type": "base64", "media_type": media, "data": PNG}}),
        };
        let images = [png("image/png"), png("image/webp"), png("image/png"), png("image/png")];
        match dialect {
            Dialect::OpenAi => {
                let [.., tool, user] = messages.as_slice() else { panic!("{messages:#?}") };
                assert_eq!(
                    *tool,
                    json!({"role": "tool", "tool_call_id": "call_1", "content": text})
                );
                let mut parts = vec![
                    json!({"type": "text", "text": "The images returned by tool call `call_1`:"}),
                ];
                parts.extend(images);
                assert_eq!(*user, json!({"role": "user", "content": parts}));
            }
            Dialect::Anthropic => {
                let mut content = vec![json!({"type": "text", "text": text})];
                content.extend(images);
                assert_eq!(
                    messages.last().unwrap(),
                    &json!({"role": "user", "content": [{"type": "tool_result",
                        "tool_use_id": "call_1", "content": content}]})
                );
            }
        }
        orchestrator.cleanup().await;
    }
}

/// An image counts about 1,600 tokens toward the context window, not its base64 length,
/// and an old result elided to fit the window loses its image too.
#[tokio::test]
async fn old_images_give_way_to_the_context_window() {
    let mut model = ScriptedModel::new("m");
    // 80% is 4,000 tokens: two images fit, three do not.
    model.window = Some(5000);
    let model = Arc::new(
        model
            .calls(vec![("shots__take", json!({}))])
            .calls(vec![("shots__take", json!({}))])
            .calls(vec![("shots__take", json!({}))])
            .report("success", "seen"),
    );
    let output = toolmux_core::ToolOutput { content: vec![png()], ..Default::default() };
    let (agents, orchestrator) = with_image_tool(model.clone(), output).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    let images = |request: &ModelRequest| -> Vec<(usize, String)> {
        request
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::Tool { results } => {
                    Some((results[0].images.len(), results[0].content.clone()))
                }
                _ => None,
            })
            .collect()
    };
    let requests = model.requests();
    let shown = "[image image/png, 8 bytes]".to_owned();
    assert_eq!(images(&requests[2]), vec![(1, shown.clone()), (1, shown.clone())]);
    let fourth = images(&requests[3]);
    assert_eq!(fourth[1..], [(1, shown.clone()), (1, shown)]);
    assert_eq!(fourth[0].0, 0);
    assert!(fourth[0].1.starts_with("(this result, 26 characters and an image, was elided"));
    orchestrator.cleanup().await;
}

/// A request carries at most 20 images: the newest; older ones are named in their result.
#[tokio::test]
async fn a_request_carries_only_the_newest_twenty_images() {
    let mut model = ScriptedModel::new("m");
    // Other arguments each time: the same call six turns in a row would not be made.
    for page in 0..6 {
        model = model.calls(vec![("shots__take", json!({"page": page}))]);
    }
    let model = Arc::new(model.report("success", "seen"));
    let output = toolmux_core::ToolOutput {
        content: vec![png(), png(), png(), png()],
        ..Default::default()
    };
    let (agents, orchestrator) = with_image_tool(model.clone(), output).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    let counts = |request: &ModelRequest| -> Vec<usize> {
        request
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::Tool { results } => Some(results[0].images.len()),
                _ => None,
            })
            .collect()
    };
    let requests = model.requests();
    assert_eq!(counts(&requests[5]), [4, 4, 4, 4, 4]);
    assert_eq!(counts(&requests[6]), [0, 4, 4, 4, 4, 4]);
    let Message::Tool { results } = &requests[6].messages[2] else { panic!("{requests:#?}") };
    let dropped = "[image image/png, 8 bytes: dropped from this older result: a request carries \
        only the newest images]";
    assert_eq!(results[0].content.matches(dropped).count(), 4, "{}", results[0].content);
    orchestrator.cleanup().await;
}

/// A batch shows its calls' images, four at most, and says how many more there were.
#[tokio::test]
async fn a_batch_shows_its_calls_images() {
    let calls: Vec<Value> =
        (0..3).map(|page| json!({"tool": "shots__take", "arguments": {"page": page}})).collect();
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("agent__batch", json!({"calls": calls}))])
            .report("success", "seen"),
    );
    let output = toolmux_core::ToolOutput { content: vec![png(), png()], ..Default::default() };
    let (agents, orchestrator) = with_image_tool(model.clone(), output).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Success, "{report:?}");
    let requests = model.requests();
    let Some(Message::Tool { results }) = requests[1].messages.last() else {
        panic!("{requests:#?}")
    };
    assert_eq!(results[0].images.len(), 4);
    assert!(
        results[0].content.ends_with(
            "\n(the images of the first calls are shown, 2 more are not: a tool result shows \
             at most 4 images)"
        ),
        "{}",
        results[0].content
    );
    orchestrator.cleanup().await;
}

/// The run the listening agents of these tests listen as.
const LISTENING: &str = "listening";

/// Agent `a`, thinking with model `m` of `models`, given one asynchronous external tool,
/// `external__build`, on an orchestrator configured by `config`, with `arrived` in the inbox
/// of run [`LISTENING`]: for each pair of arguments and result, a build an earlier cycle
/// called with those arguments, answered since. The agents, their orchestrator, and the
/// pending store (for calls a test answers later).
async fn listening_setup(
    config: OrchestratorConfig,
    models: BTreeMap<String, Arc<dyn Model>>,
    arrived: Vec<(Value, Value)>,
) -> (Agents, Orchestrator, Arc<toolmux_external::MemoryPendingStore>) {
    use toolmux_external::{ExternalResult, PendingStore};
    let (store, external) = async_external("build", "Starts a build");
    let providers: Vec<Arc<dyn ToolProvider>> = vec![Arc::new(external)];
    let (agents, orchestrator) =
        start_agents_with(config, one("a", agent("m")), models, providers).await;
    for (arguments, result) in arrived {
        let id = store.open(pending_call("external__build", arguments, LISTENING)).await.unwrap();
        store.resolve(&id, ExternalResult { result, is_error: false }).await.unwrap();
    }
    (agents, orchestrator, store)
}

/// Agent `a` listening as run [`LISTENING`] for one cycle: how listening ended, and the
/// reports it gave.
async fn listen_once(
    agents: &Agents,
) -> (Result<toolmux_agent::ListenEnd, AgentError>, Vec<AgentReport>) {
    let ctx = CallContext::new().with_run_id(LISTENING);
    let options = toolmux_agent::ListenOptions { max_cycles: Some(1), ..Default::default() };
    let mut reports = Vec::new();
    let ended = agents.listen("a", &ctx, &options, |r| reports.push(r.clone())).await;
    (ended, reports)
}

/// Builds 0, 1 and 2 (`{"target": i}`), each answered with a result that alone fills most of
/// a 500-byte cap.
fn three_big_builds() -> Vec<(Value, Value)> {
    (0..3).map(|target| (json!({"target": target}), json!("built ".repeat(40)))).collect()
}

/// A model failing `times` times, as an overloaded API does.
fn overloaded(times: usize) -> ScriptedModel {
    (0..times).fold(ScriptedModel::new("m"), |model, _| {
        model.then(|_| {
            Err(ModelError::Api { model: "m".into(), status: 503, message: "overloaded".into() })
        })
    })
}

/// A listening agent sleeps until the result of an asynchronous call it made in an earlier
/// cycle arrives, then works on it in a cycle of its own; without anything that could
/// wake it, listening is refused.
#[tokio::test]
async fn a_listening_agent_wakes_for_a_late_asynchronous_result() {
    use toolmux_agent::{ListenEnd, ListenOptions};
    use toolmux_external::{ExternalResult, PendingStore};
    // The cycle's first model call fails: the cycle is tried again on its conversation,
    // so what woke it (taken from the inbox) is not lost.
    let model = Arc::new(overloaded(1).report("success", "deployed the build"));
    let (agents, orchestrator, store) =
        listening_setup(OrchestratorConfig::default(), only(&model), Vec::new()).await;

    // A call made by an earlier cycle of the same run is answered later.
    let call = pending_call("external__build", json!({}), LISTENING);
    let id = store.open(call).await.unwrap();
    let answer = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let result = ExternalResult { result: json!("build 42 is green"), is_error: false };
            store.resolve(&id, result).await.unwrap();
        })
    };
    let ctx = CallContext::new().with_run_id(LISTENING);
    let options = ListenOptions { max_cycles: Some(1), ..ListenOptions::default() };
    let mut reports = Vec::new();
    let ended = agents.listen("a", &ctx, &options, |r| reports.push(r.content.clone())).await;
    answer.await.unwrap();
    assert_eq!(ended.unwrap(), ListenEnd::Cycles);
    assert_eq!(reports, ["deployed the build"]);
    for request in &model.requests()[..2] {
        let task = format!("{:?}", request.messages);
        assert!(
            task.contains("Results of your earlier asynchronous tool calls arrived")
                && task.contains("build 42 is green"),
            "{task}"
        );
    }

    // Idle: nothing arrives, listening ends.
    let options = ListenOptions {
        idle: Some(std::time::Duration::from_millis(200)),
        ..ListenOptions::default()
    };
    let ended = agents.listen("a", &ctx, &options, |_| panic!("no cycle")).await.unwrap();
    assert_eq!(ended, ListenEnd::Idle);
    orchestrator.cleanup().await;

    // Nothing could wake an agent without spaces or external tools.
    let model = Arc::new(ScriptedModel::new("m").report("success", "x"));
    let s = setup(one("b", agent("m")), vec![model]).await;
    let refused =
        s.agents.listen("b", &CallContext::new(), &ListenOptions::default(), |_| {}).await;
    assert!(refused.unwrap_err().to_string().contains("nothing can wake a listening agent"));
}

/// Credentials the model's API refuses stop a listening agent with an error naming them,
/// where the cycle was tried again as after an outage, each time refused alike.
#[tokio::test(start_paused = true)]
async fn a_listening_agent_whose_credentials_are_refused_stops_saying_so() {
    use toolmux_agent::ListenOptions;
    let mut model = ScriptedModel::new("m");
    for _ in 0..4 {
        model = model.then(|_| {
            Err(ModelError::Auth {
                model: "m".into(),
                status: 401,
                message: "Incorrect API key provided".into(),
            })
        });
    }
    let model = Arc::new(model);
    let arrived = vec![(json!({}), json!("build 42 is green"))];
    let (agents, orchestrator, _) =
        listening_setup(OrchestratorConfig::default(), only(&model), arrived).await;
    let ctx = CallContext::new().with_run_id(LISTENING);
    let options = ListenOptions { max_cycles: Some(1), ..ListenOptions::default() };
    let ended = agents.listen("a", &ctx, &options, |r| panic!("no report: {r:?}")).await;
    let error = ended.unwrap_err().to_string();
    assert!(
        error.contains("refused the credentials (HTTP 401)") && error.contains("`apiKey`"),
        "{error}"
    );
    // What woke the cycle is nowhere else now: the error says it.
    assert!(error.contains("no cycle worked on") && error.contains("build 42 is green"), "{error}");
    assert_eq!(model.requests().len(), 1);
    orchestrator.cleanup().await;
}

/// Credentials refused when a cycle is tried again after its model failed stop listening
/// with an error that also lists the results the earlier attempt took from the inbox and
/// did not read: before, the error listed only what woke the cycle, and those were lost.
#[tokio::test(start_paused = true)]
async fn refused_credentials_on_a_retry_keep_what_earlier_attempts_took() {
    use toolmux_agent::ListenOptions;
    let store: Arc<Mutex<Option<Arc<toolmux_external::MemoryPendingStore>>>> = Arc::default();
    let answering = store.clone();
    let builds = (1..3).map(|i| ("external__build", json!({"target": i}))).collect();
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(builds)
            .then(move |_| {
                // Both answered: the next turn takes both, and is given the first.
                let store = answering.lock().unwrap().clone().expect("the store");
                answer_pending(&store, |_| true, json!("built ".repeat(40)));
                let call = ModelToolCall::new("b3", "external__build", json!({"target": 3}));
                Ok(used(ModelResponse::tool_calls(vec![call])))
            })
            .then(|_| {
                Err(ModelError::Api {
                    model: "m".into(),
                    status: 503,
                    message: "overloaded".into(),
                })
            })
            .then(|_| {
                Err(ModelError::Auth {
                    model: "m".into(),
                    status: 401,
                    message: "Incorrect API key provided".into(),
                })
            }),
    );
    let config = OrchestratorConfig::default().with_response_max_bytes(500);
    let arrived = vec![(json!({"target": 0}), json!("build 0 is green"))];
    let (agents, orchestrator, pending) = listening_setup(config, only(&model), arrived).await;
    *store.lock().unwrap() = Some(pending);
    let ctx = CallContext::new().with_run_id(LISTENING);
    let options = ListenOptions { max_cycles: Some(1), ..ListenOptions::default() };
    let ended = agents.listen("a", &ctx, &options, |r| panic!("no report: {r:?}")).await;
    orchestrator.cleanup().await;
    let error = ended.unwrap_err().to_string();
    assert!(error.contains("refused the credentials (HTTP 401)"), "{error}");
    assert_eq!(model.requests().len(), 4);
    // What woke the cycle, and the build its first attempt took and never read.
    assert!(error.contains("build 0 is green"), "{error}");
    assert!(error.contains(r#""target":2"#) && error.contains("built built"), "{error}");
}

/// A listening agent given more results than the size cap holds gets them all, over
/// cycles: each cycle works on what fits, the rest wake the next. Before, the inbox's
/// answer was stored for its size and every result it held was lost.
#[tokio::test]
async fn a_listening_agent_gets_results_over_the_size_cap_over_cycles() {
    use toolmux_agent::{ListenEnd, ListenOptions};
    let model = Arc::new(
        ScriptedModel::new("m")
            .report("success", "one")
            .report("success", "two")
            .report("success", "three"),
    );
    let config = OrchestratorConfig::default().with_response_max_bytes(500);
    let (agents, orchestrator, _) = listening_setup(config, only(&model), three_big_builds()).await;
    let ctx = CallContext::new().with_run_id(LISTENING);
    // Idle ends it should results be lost.
    let options = ListenOptions {
        max_cycles: Some(3),
        idle: Some(std::time::Duration::from_secs(3)),
        ..ListenOptions::default()
    };
    let mut reports = Vec::new();
    let ended = agents.listen("a", &ctx, &options, |r| reports.push(r.content.clone())).await;
    assert_eq!(reports, ["one", "two", "three"]);
    assert_eq!(ended.unwrap(), ListenEnd::Cycles);
    let given: Vec<u64> = model
        .requests()
        .iter()
        .map(|request| {
            let Some(Message::User { content }) = request.messages.last() else {
                panic!("expected the task last: {:?}", request.messages.last())
            };
            let (_, results) = content.split_once(":\n").unwrap();
            let results: Vec<Value> = serde_json::from_str(results).unwrap();
            assert_eq!(results.len(), 1, "{content}");
            results[0]["arguments"]["target"].as_u64().unwrap()
        })
        .collect();
    assert_eq!(given, [0, 1, 2]);
    orchestrator.cleanup().await;
}

/// Results a listening agent took from the inbox and no cycle read are in the report of
/// the cycle where listening stops: after `max_cycles`, and when cancelled (here by the
/// model, in the first cycle). Before, listening ended with them lost.
#[tokio::test]
async fn results_left_when_listening_stops_are_in_the_last_report() {
    use toolmux_agent::{ListenEnd, ListenOptions};
    let cancel = CancellationToken::new();
    let cancelling = cancel.clone();
    let cancels = move |_: &ModelRequest| {
        cancelling.cancel();
        let report = json!({"status": "success", "content": "one"});
        let call = ModelToolCall::new("r", "agent__final_report", report);
        Ok(used(ModelResponse::tool_calls(vec![call])))
    };
    let cases = [
        (ScriptedModel::new("m").report("success", "one"), Some(1), ListenEnd::Cycles),
        (ScriptedModel::new("m").then(cancels), None, ListenEnd::Cancelled),
    ];
    for (script, max_cycles, end) in cases {
        let model = Arc::new(script);
        let config = OrchestratorConfig::default().with_response_max_bytes(500);
        let (agents, orchestrator, _) =
            listening_setup(config, only(&model), three_big_builds()).await;
        let ctx = CallContext::new().with_run_id(LISTENING).with_cancel(cancel.clone());
        let options = ListenOptions { max_cycles, ..ListenOptions::default() };
        let mut reports = Vec::new();
        let ended = agents.listen("a", &ctx, &options, |r| reports.push(r.clone())).await;
        orchestrator.cleanup().await;
        assert_eq!(ended.unwrap(), end);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].content, "one");
        assert_eq!(targets(&reports[0].unread_results), [1, 2], "{end:?}");
    }
}

/// A cycle whose model fails on every attempt hands what woke it to the caller in its
/// report, as nobody else can read it; listening goes on.
#[tokio::test(start_paused = true)]
async fn a_cycle_whose_model_keeps_failing_reports_what_woke_it() {
    use toolmux_agent::ListenEnd;
    let model = Arc::new(overloaded(4));
    let arrived = vec![(json!({"target": 7}), json!("build 7 is green"))];
    let (agents, orchestrator, _) =
        listening_setup(OrchestratorConfig::default(), only(&model), arrived).await;
    let (ended, reports) = listen_once(&agents).await;
    orchestrator.cleanup().await;
    assert_eq!(ended.unwrap(), ListenEnd::Cycles);
    assert_eq!(model.requests().len(), 4);
    assert_eq!(reports[0].status, AgentStatus::Failure);
    assert_eq!(targets(&reports[0].unread_results), [7]);
    assert_eq!(reports[0].unread_results[0]["result"], json!("build 7 is green"));
}

/// A cycle whose request the model's API refuses as such (an invalid request, one over
/// the context window with nothing to shorten) is asked once, not tried again after an
/// outage's backoff: asked again, it would be refused alike. The report says so and hands
/// over what woke the cycle. Before, each was asked four times over 14 s.
#[tokio::test]
async fn a_cycle_the_api_refuses_as_invalid_is_not_tried_again() {
    use toolmux_agent::ListenEnd;
    let refusals = [
        r#"{"error": {"type": "invalid_request_error", "message": "messages: unknown field `x`"}}"#,
        r#"{"error": {"type": "invalid_request_error", "message": "This model's maximum context length is 10 tokens. However, your messages resulted in 900 tokens."}}"#,
    ];
    for body in refusals {
        let refused = ScriptStep::Status { status: 400, body: body.into(), retry_after: None };
        let server = ScriptedLlmServer::start(Dialect::OpenAi, vec![refused; 4]);
        let models = BTreeMap::from([("m".to_owned(), model_speaking(Dialect::OpenAi, &server))]);
        let arrived = vec![(json!({"target": 3}), json!("build 3 is green"))];
        let (agents, orchestrator, _) =
            listening_setup(OrchestratorConfig::default(), models, arrived).await;
        let (ended, reports) = listen_once(&agents).await;
        orchestrator.cleanup().await;
        assert_eq!(ended.unwrap(), ListenEnd::Cycles);
        assert_eq!(server.requests().len(), 1, "{body}");
        let report = &reports[0];
        assert_eq!(report.status, AgentStatus::Failure);
        assert!(
            report.content.contains("HTTP 400") && report.content.contains("not tried again"),
            "{}",
            report.content
        );
        assert_eq!(targets(&report.unread_results), [3]);
    }
}

/// A turn's calls run at once, but one that writes files or runs programs runs alone, in
/// the order the model wrote them: the reads before it finish first, the reads after it
/// wait for it.
#[tokio::test]
async fn calls_that_write_run_alone_in_the_order_written() {
    use toolmux_core::{PermissionClass, ToolKind, ToolOutput, ToolSet};
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let tool = |name: &str, permission: PermissionClass| {
        let spec = ToolSpec::new(name, "logs its start and end", ToolSpec::any_object_schema())
            .with_annotations(ToolAnnotations {
                read_only: permission == PermissionClass::Read,
                permission: Some(permission),
                ..ToolAnnotations::default()
            });
        let log = log.clone();
        (spec, move |arguments: Value, _: CallContext| {
            let log = log.clone();
            async move {
                let n = arguments["n"].as_u64().unwrap_or(0);
                log.lock().expect("not poisoned").push(format!("start {n}"));
                tokio::time::sleep(std::time::Duration::from_millis(40)).await;
                log.lock().expect("not poisoned").push(format!("end {n}"));
                Ok(ToolOutput::text("ok"))
            }
        })
    };
    let (look, look_run) = tool("look", PermissionClass::Read);
    let (change, change_run) = tool("change", PermissionClass::Write);
    let tools = ToolSet::new("t", ToolKind::Builtin)
        .with_tool(look, look_run)
        .with_tool(change, change_run);
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![
                ("t__look", json!({"n": 1})),
                ("t__look", json!({"n": 2})),
                ("t__change", json!({"n": 3})),
                ("t__change", json!({"n": 4})),
                ("t__look", json!({"n": 5})),
            ])
            .report("success", "done"),
    );
    let (agents, _orchestrator) =
        start_agents(one("a", agent("m")), only(&model), vec![Arc::new(tools)]).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.tool_calls), (AgentStatus::Success, 5));
    let log = log.lock().expect("not poisoned").clone();
    let at = |event: &str| log.iter().position(|e| e == event).expect(event);
    assert!(at("start 2") < at("end 1"), "the first reads run side by side: {log:?}");
    assert!(at("end 1") < at("start 3") && at("end 2") < at("start 3"), "{log:?}");
    assert!(at("end 3") < at("start 4"), "writes one at a time, in order: {log:?}");
    assert!(at("end 4") < at("start 5"), "a read after a write waits for it: {log:?}");
}

// ---------------------------------------------------------------------------------------
// Pausing for approvals, and resuming

/// An orchestrator of `mock` with `permissions`, and the agents of `definitions` on it.
async fn with_rules(
    definitions: AgentDefinitions,
    model: &Arc<ScriptedModel>,
    permissions: toolmux_orchestrator::PermissionRules,
) -> (Agents, Orchestrator, Arc<MockProvider>) {
    with_models(definitions, only(model), permissions).await
}

async fn with_models(
    definitions: AgentDefinitions,
    models: BTreeMap<String, Arc<dyn Model>>,
    permissions: toolmux_orchestrator::PermissionRules,
) -> (Agents, Orchestrator, Arc<MockProvider>) {
    let mock = Arc::new(
        MockProvider::new("mock")
            .with_tool("echo", Behavior::Echo)
            .with_tool("push", Behavior::Echo)
            .with_tool("other", Behavior::Text("other".into())),
    );
    let agents = Agents::new(definitions, models).expect("valid agents");
    let orchestrator =
        Orchestrator::builder(OrchestratorConfig::default().with_permissions(permissions))
            .provider(mock.clone())
            .provider(agents.provider())
            .build()
            .expect("an orchestrator");
    agents.attach(&orchestrator);
    assert!(orchestrator.warmup().await.is_ok());
    (agents, orchestrator, mock)
}

fn asking(tools: &[&str]) -> toolmux_orchestrator::PermissionRules {
    toolmux_orchestrator::PermissionRules {
        ask: tools.iter().map(|t| (*t).to_owned()).collect(),
        ..Default::default()
    }
}

fn pausing() -> RunOptions {
    RunOptions { pause: true, ..RunOptions::default() }
}

/// A report that crossed a process boundary: written as JSON and read back.
fn stored(report: &AgentReport) -> AgentReport {
    serde_json::from_str(&serde_json::to_string(report).unwrap()).unwrap()
}

/// A call that needs approval pauses the run: the turn's other calls run, the report lists
/// the call that waits and carries the conversation; resumed with an approval (in another
/// "process": the report read back from JSON), the call runs and the model reads every
/// result of that turn, in the order it made the calls.
#[tokio::test]
async fn a_call_that_asks_pauses_the_run_until_it_is_decided() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__push", json!({"branch": "main"})), ("mock__other", json!({}))])
            .report("success", "pushed"),
    );
    let (agents, orchestrator, mock) =
        with_rules(one("a", agent("m")), &model, asking(&["mock__push"])).await;
    let report = agents.run_with("a", "push it", &CallContext::new(), &pausing()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Paused, "{report:?}");
    assert_eq!(report.pending.len(), 1);
    let pending = &report.pending[0];
    assert_eq!(
        (pending.call_id.as_str(), pending.tool.as_str(), &pending.arguments),
        ("c1_0", "mock__push", &json!({"branch": "main"}))
    );
    assert!(pending.reason.contains("mock__push"), "{}", pending.reason);
    assert!(
        report.content.contains("1 call is waiting for approval: `mock__push`"),
        "{}",
        report.content
    );
    assert_eq!(report.task.as_deref(), Some("push it"));
    assert_eq!((mock.calls_of("push"), mock.calls_of("other")), (0, 1));
    assert_eq!((report.turns, report.tool_calls), (1, 1));
    // The conversation ends with the turn's answered calls; the waiting one has no result.
    match report.transcript.last() {
        Some(Message::Tool { results }) => {
            let ids: Vec<&str> = results.iter().map(|r| r.call_id.as_str()).collect();
            assert_eq!(ids, ["c1_1"]);
        }
        other => panic!("expected the turn's results last, got {other:?}"),
    }
    assert_eq!(report.to_output().to_text().split(')').next(), Some("(agent `a` is paused"));

    let paused = stored(&report);
    let decisions = BTreeMap::from([("c1_0".to_owned(), toolmux_agent::Decision::approve())]);
    let done = agents.resume(&paused, decisions, &CallContext::new(), &pausing()).await.unwrap();
    assert_eq!((done.status, done.content.as_str()), (AgentStatus::Success, "pushed"));
    assert_eq!(mock.calls_of("push"), 1);
    // The figures go on from the pause: two turns, two calls in all.
    assert_eq!((done.turns, done.tool_calls), (2, 2));
    assert_eq!(done.usage, Usage::new(200, 20));
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "the resumed run asks the model once, for its report");
    let last = requests[1].messages.last();
    let Some(Message::Tool { results }) = last else { panic!("results last: {last:?}") };
    let answered: Vec<(&str, bool)> =
        results.iter().map(|r| (r.call_id.as_str(), r.is_error)).collect();
    assert_eq!(answered, [("c1_0", false), ("c1_1", false)]);
    assert!(results[0].content.contains("main"), "{:?}", results[0]);
    // No task is given again: the conversation goes on where it stopped.
    let users = requests[1].messages.iter().filter(|m| matches!(m, Message::User { .. })).count();
    assert_eq!(users, 1);
    orchestrator.cleanup().await;
}

/// Denied, the model reads why; answered by the caller, it reads the caller's result; a
/// call left undecided keeps the run paused without asking the model anything; approved
/// with other arguments, the call runs with those, and the conversation shows them.
#[tokio::test]
async fn each_waiting_call_is_decided_on_its_own() {
    use toolmux_agent::Decision;
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![
                ("mock__push", json!({"branch": "main"})),
                ("mock__echo", json!({"n": 1})),
                ("mock__push", json!({"branch": "dev"})),
            ])
            .report("success", "done"),
    );
    let (agents, orchestrator, mock) =
        with_rules(one("a", agent("m")), &model, asking(&["mock__push", "mock__echo"])).await;
    let report = agents.run_with("a", "t", &CallContext::new(), &pausing()).await.unwrap();
    let ids: Vec<&str> = report.pending.iter().map(|p| p.call_id.as_str()).collect();
    let mut ids = ids;
    ids.sort_unstable();
    assert_eq!(ids, ["c1_0", "c1_1", "c1_2"]);
    assert!(
        !matches!(report.transcript.last(), Some(Message::Tool { .. })),
        "every call waits: no results yet"
    );

    // One decided: it is denied; the others still wait, and the model is not asked.
    let decisions = BTreeMap::from([("c1_0".to_owned(), Decision::deny("not on a Friday"))]);
    let again = agents.resume(&stored(&report), decisions, &CallContext::new(), &pausing()).await;
    let again = again.unwrap();
    assert_eq!(again.status, AgentStatus::Paused);
    let ids: Vec<&str> = again.pending.iter().map(|p| p.call_id.as_str()).collect();
    assert_eq!(ids, ["c1_1", "c1_2"]);
    assert_eq!(model.requests().len(), 1);
    assert_eq!(mock.calls_of("push"), 0);

    // The rest: one answered by the caller, one approved with other arguments.
    let decisions = BTreeMap::from([
        (
            "c1_1".to_owned(),
            Decision::Respond { content: "n is 1, I checked".into(), is_error: false },
        ),
        (
            "c1_2".to_owned(),
            Decision::Approve { arguments: Some(json!({"branch": "staging"})), always: false },
        ),
    ]);
    let done = agents.resume(&stored(&again), decisions, &CallContext::new(), &pausing()).await;
    let done = done.unwrap();
    assert_eq!(done.status, AgentStatus::Success, "{done:?}");
    assert_eq!((mock.calls_of("push"), mock.calls_of("echo")), (1, 0));
    let request = &model.requests()[1];
    let results = tool_results(request);
    assert_eq!(
        results[0],
        (
            "(tool failed: call to `mock__push` denied: not approved: not on a Friday)".to_owned(),
            true
        )
    );
    assert_eq!(results[1], ("n is 1, I checked".to_owned(), false));
    assert!(results[2].0.contains("staging") && !results[2].1, "{results:?}");
    let shown = request.messages.iter().find_map(|m| match m {
        Message::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
            Some(tool_calls[2].arguments.clone())
        }
        _ => None,
    });
    assert_eq!(shown, Some(json!({"branch": "staging"})));
    orchestrator.cleanup().await;
}

/// Approved "always", a call's rule is approved for the rest of the run: the next call it
/// covers runs without pausing, and the standing approval travels in a later pause's
/// report.
#[tokio::test]
async fn an_approval_for_always_holds_for_the_rest_of_the_run() {
    use toolmux_agent::Decision;
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__push", json!({"branch": "main"}))])
            .calls(vec![("mock__push", json!({"branch": "dev"}))])
            .calls(vec![("mock__echo", json!({}))])
            .report("success", "done"),
    );
    let (agents, orchestrator, mock) =
        with_rules(one("a", agent("m")), &model, asking(&["mock__push", "mock__echo"])).await;
    let report = agents.run_with("a", "t", &CallContext::new(), &pausing()).await.unwrap();
    let decisions =
        BTreeMap::from([("c1_0".to_owned(), Decision::Approve { arguments: None, always: true })]);
    let again = agents.resume(&stored(&report), decisions, &CallContext::new(), &pausing()).await;
    let again = again.unwrap();
    // The second push ran without asking; the echo (another rule) paused the run.
    assert_eq!(mock.calls_of("push"), 2);
    assert_eq!(again.status, AgentStatus::Paused);
    assert_eq!(again.pending[0].tool, "mock__echo");
    assert_eq!(again.approved, ["mock__push"]);
    orchestrator.cleanup().await;
}

/// An approval does not outrank the rules: resumed where a rule now denies the call (the
/// configuration changed between pause and resume), the approved call is denied.
#[tokio::test]
async fn an_approved_call_is_still_checked_when_it_runs() {
    use toolmux_agent::Decision;
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("mock__push", json!({"branch": "main"}))])
            .report("failure", "could not push"),
    );
    let (agents, orchestrator, _) =
        with_rules(one("a", agent("m")), &model, asking(&["mock__push"])).await;
    let report = agents.run_with("a", "t", &CallContext::new(), &pausing()).await.unwrap();
    orchestrator.cleanup().await;
    let denying = toolmux_orchestrator::PermissionRules {
        deny: vec!["mock__push(branch=main)".into()],
        ..Default::default()
    };
    let (agents, orchestrator, mock) = with_rules(one("a", agent("m")), &model, denying).await;
    let decisions = BTreeMap::from([("c1_0".to_owned(), Decision::approve())]);
    let done = agents.resume(&stored(&report), decisions, &CallContext::new(), &pausing()).await;
    assert_eq!(done.unwrap().status, AgentStatus::Failure);
    assert_eq!(mock.calls_of("push"), 0);
    let results = tool_results(&model.requests()[1]);
    assert!(
        results[0].1 && results[0].0.starts_with("(tool failed: call to `mock__push` denied"),
        "{results:?}"
    );
    orchestrator.cleanup().await;
}

/// Only the agent's own calls can wait: a call inside a batch that asks is refused with a
/// message telling the model to make it on its own, and the run goes on.
#[tokio::test]
async fn a_call_in_a_batch_cannot_wait() {
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![(
                "agent__batch",
                json!({"calls": [{"tool": "mock__push", "arguments": {}}, {"tool": "mock__other"}]}),
            )])
            .report("partial", "the push needs its own call"),
    );
    let config = AgentConfig { batch: true, ..agent("m") };
    let (agents, orchestrator, mock) =
        with_rules(one("a", config), &model, asking(&["mock__push"])).await;
    let report = agents.run_with("a", "t", &CallContext::new(), &pausing()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Partial);
    assert_eq!((mock.calls_of("push"), mock.calls_of("other")), (0, 1));
    let results = tool_results(&model.requests()[1]);
    assert!(
        results[0].0.contains("only the agent's own calls can do")
            && results[0].0.contains("call `mock__push` on its own"),
        "{results:?}"
    );
    orchestrator.cleanup().await;
}

/// What cannot resume says why: a report that is not paused, a decision for a call that
/// does not wait.
#[tokio::test]
async fn resuming_what_does_not_wait_is_refused() {
    use toolmux_agent::Decision;
    let model = Arc::new(
        ScriptedModel::new("m").calls(vec![("mock__push", json!({}))]).report("success", "ok"),
    );
    let (agents, orchestrator, _) =
        with_rules(one("a", agent("m")), &model, asking(&["mock__push"])).await;
    let report = agents.run_with("a", "t", &CallContext::new(), &pausing()).await.unwrap();
    let wrong = BTreeMap::from([("c9_9".to_owned(), Decision::approve())]);
    let e = agents.resume(&report, wrong, &CallContext::new(), &pausing()).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot resume: no call `c9_9` waits for a decision; the calls that wait: c1_0"
    );
    let mut done = report.clone();
    done.status = AgentStatus::Success;
    let e = agents.resume(&done, BTreeMap::new(), &CallContext::new(), &pausing()).await;
    assert!(e.unwrap_err().to_string().contains("the run is not paused (its status is `success`)"));
    orchestrator.cleanup().await;
}

/// A sub-agent's calls cannot wait either, even when its model's call ids are the same as
/// its caller's (they mean something only in their own conversation).
#[tokio::test]
async fn a_call_in_a_sub_agent_cannot_wait() {
    let lead = Arc::new(
        ScriptedModel::new("lead")
            .calls(vec![("agent__helper", json!({"prompt": "push"}))])
            .report("partial", "the helper could not push"),
    );
    // The helper's first call has the id of the lead's first call: `c1_0`.
    let helper = Arc::new(
        ScriptedModel::new("helper")
            .calls(vec![("mock__push", json!({}))])
            .report("failure", "needs approval"),
    );
    let mut definitions =
        one("lead", AgentConfig { agents: vec!["helper".into()], ..agent("lead") });
    definitions.agents.insert("helper".into(), agent("helper"));
    let models = by_name(&[&lead, &helper]);
    let (agents, orchestrator, mock) =
        with_models(definitions, models, asking(&["mock__push"])).await;
    let report = agents.run_with("lead", "t", &CallContext::new(), &pausing()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Partial, "{report:?}");
    assert_eq!(mock.calls_of("push"), 0);
    let results = tool_results(&helper.requests()[1]);
    assert!(results[0].0.contains("call `mock__push` on its own"), "{results:?}");
    orchestrator.cleanup().await;
}

/// A question nobody can answer pauses a run that pauses, instead of ending it: the answer
/// given on resume is what the model reads; approving a question is refused.
#[tokio::test]
async fn a_question_pauses_the_run_until_it_is_answered() {
    use toolmux_agent::Decision;
    let model = Arc::new(
        ScriptedModel::new("m")
            .calls(vec![("agent__ask_user", json!({"question": "Which branch?"}))])
            .report("success", "merged"),
    );
    let config = AgentConfig { ask_user: true, ..agent("m") };
    let (agents, orchestrator, _) = with_rules(one("a", config), &model, asking(&[])).await;
    let report = agents.run_with("a", "merge it", &CallContext::new(), &pausing()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Paused, "{report:?}");
    assert_eq!(report.pending[0].question.as_deref(), Some("Which branch?"));
    assert!(report.content.contains("waiting for an answer: the question \"Which branch?\""));
    let approve = BTreeMap::from([("c1_0".to_owned(), Decision::approve())]);
    let e = agents.resume(&stored(&report), approve, &CallContext::new(), &pausing()).await;
    assert!(e.unwrap_err().to_string().contains("is the agent's question, not a call to approve"));
    let answer = BTreeMap::from([(
        "c1_0".to_owned(),
        Decision::Respond { content: "main".into(), is_error: false },
    )]);
    let done = agents.resume(&stored(&report), answer, &CallContext::new(), &pausing()).await;
    assert_eq!(done.unwrap().status, AgentStatus::Success);
    assert_eq!(tool_results(&model.requests()[1]), vec![("main".to_owned(), false)]);
    orchestrator.cleanup().await;
}

/// A resumed run that hands off passes the original task on, and the next agent starts
/// afresh (not with the paused agent's conversation).
#[tokio::test]
async fn a_resumed_run_hands_off_with_its_task() {
    use toolmux_agent::Decision;
    let front = Arc::new(
        ScriptedModel::new("front")
            .calls(vec![("mock__push", json!({"branch": "main"}))])
            .calls(vec![("router__handoff-to", json!({"agent": "billing", "message": "pushed"}))]),
    );
    let billing = Arc::new(ScriptedModel::new("billing").report("success", "billed"));
    let definitions = front_and_billing("front");
    let models = by_name(&[&front, &billing]);
    let (agents, orchestrator, mock) =
        with_models(definitions, models, asking(&["mock__push"])).await;
    let report =
        agents.run_with("front", "push and bill", &CallContext::new(), &pausing()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Paused);
    let decisions = BTreeMap::from([("c1_0".to_owned(), Decision::approve())]);
    let done = agents.resume(&stored(&report), decisions, &CallContext::new(), &pausing()).await;
    let done = done.unwrap();
    assert_eq!((done.status, done.agent.as_str()), (AgentStatus::Success, "billing"));
    assert_eq!(done.handoffs, ["front", "billing"]);
    assert_eq!(mock.calls_of("push"), 1);
    let first = &billing.requests()[0].messages;
    assert_eq!(first.len(), 1, "billing starts afresh: {first:?}");
    match &first[0] {
        Message::User { content } => {
            assert!(content.starts_with("push and bill"), "{content}");
            assert!(content.contains("agent `front`: pushed"), "{content}");
        }
        other => panic!("{other:?}"),
    }
    orchestrator.cleanup().await;
}

/// A run handed off and paused is resumed as the same run: under the first agent's
/// operation, which its asynchronous calls and gateway state belong to, so the resumed
/// agent is given the result of a call the first agent made before the hand-off, is still
/// in the space the first agent entered, and the run's hand-offs go on from the pause.
/// Before, the resumption ran as the paused agent's own operation: it counted no pending
/// call (its conversation shows none), the inbox would not have given it the first agent's
/// results anyway, its active space was none, and the resumed report named no hand-off.
#[tokio::test]
async fn a_run_handed_off_and_paused_resumes_as_the_same_run() {
    use toolmux_agent::Decision;
    let (store, external) = async_external("build", "Starts a build");
    let gateway = toolmux_external::GatewayProvider::new(toolmux_external::Spaces::in_memory());
    let front = Arc::new(
        ScriptedModel::new("front")
            .calls(vec![
                ("external__build", json!({"target": 0})),
                ("gateway__enter_space", json!({"space": "ops"})),
            ])
            .calls(vec![("router__handoff-to", json!({"agent": "billing"}))]),
    );
    let billing = Arc::new(
        ScriptedModel::new("billing")
            .calls(vec![("mock__push", json!({"branch": "main"}))])
            .calls(vec![("gateway__read_messages", json!({}))])
            .report("success", "pushed and built"),
    );
    let definitions = front_and_billing("front");
    let mock = MockProvider::new("mock").with_tool("push", Behavior::Echo);
    let providers: Vec<Arc<dyn ToolProvider>> =
        vec![Arc::new(external), Arc::new(gateway), Arc::new(mock)];
    let config = OrchestratorConfig::default().with_permissions(asking(&["mock__push"]));
    let (agents, orchestrator) =
        start_agents_with(config, definitions, by_name(&[&front, &billing]), providers).await;
    let report =
        agents.run_with("front", "push and build", &CallContext::new(), &pausing()).await.unwrap();
    assert_eq!((report.status, report.agent.as_str()), (AgentStatus::Paused, "billing"));
    assert_eq!(report.handoffs, ["front", "billing"]);
    assert_eq!(report.pending_async_calls, 1, "{report:?}");
    // The build the first agent started is done while the run is paused.
    answer_pending(&store, |_| true, json!("built 0"));
    let decisions = BTreeMap::from([(report.pending[0].call_id.clone(), Decision::approve())]);
    let done = agents.resume(&stored(&report), decisions, &CallContext::new(), &pausing()).await;
    orchestrator.cleanup().await;
    let done = done.unwrap();
    assert_eq!((done.status, done.content.as_str()), (AgentStatus::Success, "pushed and built"));
    assert_eq!(done.handoffs, ["front", "billing"]);
    assert!(done.unread_results.is_empty(), "{done:?}");
    let requests = billing.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");
    match requests[1].messages.last() {
        Some(Message::User { content }) => assert!(
            content.starts_with("(Results of your earlier asynchronous tool calls arrived:")
                && content.contains("built 0"),
            "{content}"
        ),
        other => panic!("expected the build's result last, got {other:?}"),
    }
    // Read without naming a space, the messages are the active space's.
    let read = tool_results(&requests[2]);
    let page: Value = serde_json::from_str(&read[0].0).expect(&read[0].0);
    assert_eq!(page["space"], "ops", "{page}");
    let left = {
        use toolmux_external::PendingStore;
        store.take_inbox("default", None).await.unwrap()
    };
    assert!(left.is_empty(), "results left in the inbox: {left:?}");
}

// ---------------------------------------------------------------------------------------
// A request over the model's context window, refused by the API

/// The model's window in the test below, in tokens of four bytes of the request's body.
const REFUSED_OVER: usize = 5000;

/// `next`, unless the request's body is over [`REFUSED_OVER`] tokens: then OpenAI's
/// refusal of a request longer than the model's context window (HTTP 400).
fn within_window(next: ScriptStep) -> ScriptStep {
    ScriptStep::callback(move |request| {
        let tokens = request.to_string().len() / 4;
        if tokens <= REFUSED_OVER {
            return next.clone();
        }
        let message = format!(
            "This model's maximum context length is {REFUSED_OVER} tokens. However, your \
             messages resulted in {tokens} tokens. Please reduce the length of the messages."
        );
        let error = json!({"error": {"message": message, "type": "invalid_request_error",
            "param": "messages", "code": "context_length_exceeded"}});
        ScriptStep::status(400, error.to_string())
    })
}

/// A model `m` on `server`, speaking `dialect`'s API, its prompt cache off.
fn model_speaking(dialect: Dialect, server: &ScriptedLlmServer) -> Arc<dyn Model> {
    toolmux_llm::connect("m", &model_speaking_config(dialect, server)).unwrap()
}

/// An agent on a model `m` served by `server`, speaking `dialect`'s API (no
/// `contextWindow` configured), with a tool `mock__big` that returns 8,000 bytes, and the
/// orchestrator they run on (which the agents hold only weakly).
async fn on_a_model_speaking(
    dialect: Dialect,
    server: &ScriptedLlmServer,
) -> (Agents, Orchestrator) {
    let model = model_speaking(dialect, server);
    let mock: Arc<dyn ToolProvider> =
        Arc::new(MockProvider::new("mock").with_tool("big", Behavior::Big(8000)));
    let models = BTreeMap::from([("m".to_owned(), model)]);
    start_agents(one("a", agent("m")), models, vec![mock]).await
}

/// The report of agent `a` on the task `t`, among the agents `start` makes on a model
/// server speaking `dialect` that answers with `script`, and the requests the server got.
async fn run_scripted_with(
    dialect: Dialect,
    script: Vec<ScriptStep>,
    start: impl AsyncFnOnce(Dialect, &ScriptedLlmServer) -> (Agents, Orchestrator),
) -> (AgentReport, Vec<Value>) {
    let server = ScriptedLlmServer::start(dialect, script);
    let (agents, _orchestrator) = start(dialect, &server).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    (report, server.requests())
}

/// [`run_scripted_with`] the agent [`on_a_model_speaking`] `dialect`.
async fn run_scripted(dialect: Dialect, script: Vec<ScriptStep>) -> (AgentReport, Vec<Value>) {
    run_scripted_with(dialect, script, on_a_model_speaking).await
}

/// An API that refuses a request as longer than the model's context window (goose's
/// "context length exceeded" ended its sessions): the oldest tool results give way, as
/// they do for a configured `contextWindow`, and the turn is asked again, so the run goes
/// on instead of failing; the latest results are never cut.
#[tokio::test]
async fn a_request_refused_as_over_the_context_window_is_asked_again_shorter() {
    let report = ScriptStep::tool_call(
        "agent__final_report",
        json!({"status": "success", "content": "read it all"}),
    );
    let (report, requests) = run_scripted(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("mock__big", json!({})),
            ScriptStep::tool_call("mock__big", json!({})),
            ScriptStep::tool_call("mock__big", json!({})),
            within_window(report.clone()),
            within_window(report),
        ],
    )
    .await;
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "read it all"));
    assert_eq!(requests.len(), 5, "the refused turn is asked once more: {requests:#?}");
    let results: Vec<String> = requests[4]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(results.len(), 3);
    assert!(results[0].contains("elided to keep the conversation"), "{results:?}");
    assert!(results[2].len() > 7000, "the latest result is whole: {results:?}");
    assert!(requests[4].to_string().len() / 4 <= REFUSED_OVER);
}

/// An answer cut off where it filled the model's context window, as `dialect` says it
/// (Anthropic's `stop_reason: model_context_window_exceeded`, Mistral's `finish_reason:
/// model_length`), half written and billed: `input` tokens read, `output` written.
fn cut_at_the_window(dialect: Dialect, input: u64, output: u64) -> ScriptStep {
    let answer = match dialect {
        Dialect::Anthropic => json!({"id": "msg_cut", "type": "message", "role": "assistant",
            "model": "test-model", "content": [{"type": "text", "text": "half an"}],
            "stop_reason": "model_context_window_exceeded", "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": output}}),
        Dialect::OpenAi => json!({"id": "cmpl-cut", "object": "chat.completion", "created": 0,
            "model": "test-model", "choices": [{"index": 0, "finish_reason": "model_length",
            "message": {"role": "assistant", "content": "half an"}}],
            "usage": {"prompt_tokens": input, "completion_tokens": output}}),
    };
    ScriptStep::Whole(Box::new(ScriptStep::Raw(answer.to_string())))
}

/// An answer cut at the context window is no answer (taken for one, the run ended as a
/// success with half a sentence): the oldest tool results give way, as for a request the
/// API refuses as over the window, and the turn is asked again; the latest results stay
/// whole.
#[tokio::test]
async fn an_answer_cut_at_the_context_window_is_asked_again_shorter() {
    for dialect in [Dialect::Anthropic, Dialect::OpenAi] {
        let (report, requests) = run_scripted(
            dialect,
            vec![
                ScriptStep::tool_call("mock__big", json!({})),
                ScriptStep::tool_call("mock__big", json!({})),
                ScriptStep::tool_call("mock__big", json!({})),
                cut_at_the_window(dialect, 9000, 100),
                ScriptStep::tool_call(
                    "agent__final_report",
                    json!({"status": "success", "content": "read it all"}),
                ),
            ],
        )
        .await;
        assert_eq!(
            (report.status, report.content.as_str()),
            (AgentStatus::Success, "read it all"),
            "{dialect:?}"
        );
        assert_eq!(requests.len(), 5, "{dialect:?}: the cut turn is asked once more");
        let text = |content: &Value| match content {
            Value::String(text) => text.clone(),
            parts => parts.to_string(),
        };
        let results: Vec<String> = requests[4]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| match dialect {
                Dialect::OpenAi => (m["role"] == "tool").then(|| text(&m["content"])),
                Dialect::Anthropic => m["content"]
                    .as_array()
                    .and_then(|parts| parts.iter().find(|p| p["type"] == "tool_result"))
                    .map(|part| text(&part["content"])),
            })
            .collect();
        assert_eq!(results.len(), 3, "{dialect:?}: {results:?}");
        assert!(results[0].contains("elided to keep the conversation"), "{results:?}");
        assert!(results[2].len() > 7000, "the latest result is whole: {results:?}");
    }
}

/// The API bills an answer cut at the context window though it is no answer: its tokens
/// count in the run's usage (and so against its token budget) as an answer's do.
#[tokio::test]
async fn an_answer_cut_at_the_context_window_counts_in_the_runs_usage() {
    let (report, requests) = run_scripted(
        Dialect::Anthropic,
        vec![
            ScriptStep::tool_call("mock__big", json!({})),
            ScriptStep::tool_call("mock__big", json!({})),
            cut_at_the_window(Dialect::Anthropic, 9000, 777),
            ScriptStep::text("done"),
        ],
    )
    .await;
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "done"));
    assert_eq!(requests.len(), 4);
    // Three scripted answers of 10 tokens each, and the cut one's 777.
    assert_eq!(report.usage.output_tokens, 3 * 10 + 777, "{:?}", report.usage);
    assert!(report.usage.input_tokens > 9000, "{:?}", report.usage);
}

/// An answer ended for a reason that is no finished turn, as `dialect` says it (the
/// compatible servers' `finish_reason: error`, Gemini's `MALFORMED_FUNCTION_CALL` through
/// its OpenAI dialect, Anthropic's `stop_reason: pause_turn`), with `input` tokens read and
/// `output` written.
fn stopped(dialect: Dialect, reason: &str, input: u64, output: u64) -> ScriptStep {
    let answer = match dialect {
        Dialect::Anthropic => json!({"id": "msg_stop", "type": "message", "role": "assistant",
            "model": "test-model", "content": [{"type": "text", "text": "half an"}],
            "stop_reason": reason, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": output}}),
        Dialect::OpenAi => json!({"id": "cmpl-stop", "object": "chat.completion", "created": 0,
            "model": "test-model", "choices": [{"index": 0, "finish_reason": reason,
            "message": {"role": "assistant", "content": "half an"}}],
            "usage": {"prompt_tokens": input, "completion_tokens": output}}),
    };
    ScriptStep::Whole(Box::new(ScriptStep::Raw(answer.to_string())))
}

/// The reasons to stop short of a turn in the tests below, and the dialect saying each.
/// (Anthropic's `pause_turn` is continued by the model client, below.)
const STOPPED_SHORT: [(Dialect, &str); 2] =
    [(Dialect::OpenAi, "error"), (Dialect::OpenAi, "MALFORMED_FUNCTION_CALL")];

/// A script in `dialect`: a call of `mock__big`, an answer [`stopped`] for `reason` (7,000
/// tokens read, 555 written), then `next`.
fn stopped_after_a_call(dialect: Dialect, reason: &str, next: ScriptStep) -> Vec<ScriptStep> {
    vec![ScriptStep::tool_call("mock__big", json!({})), stopped(dialect, reason, 7000, 555), next]
}

/// The API bills an answer it ended for a reason that is no finished turn though the run
/// fails on it: its tokens count in the run's usage (and so against its token budget and
/// its callers'), in every dialect, each time it stops (the turn is asked once more, then
/// the run fails saying so).
#[tokio::test]
async fn an_answer_stopped_short_of_a_turn_counts_in_the_runs_usage() {
    for (dialect, reason) in STOPPED_SHORT {
        let next = stopped(dialect, reason, 7000, 333);
        let (report, requests) =
            run_scripted(dialect, stopped_after_a_call(dialect, reason, next)).await;
        assert_eq!(report.status, AgentStatus::Failure, "{reason}: {}", report.content);
        assert!(report.content.contains(reason), "{reason}: {}", report.content);
        assert!(
            report.content.contains("asked again once and stopped again"),
            "{}",
            report.content
        );
        assert_eq!(requests.len(), 3, "{reason}");
        assert_eq!(report.turns, 2, "{reason}: the turn asked again is one turn");
        // The scripted call's 10 tokens written, and the stopped answers' 555 and 333.
        assert_eq!(report.usage.output_tokens, 10 + 555 + 333, "{reason}: {:?}", report.usage);
        assert!(report.usage.input_tokens > 2 * 7000, "{reason}: {:?}", report.usage);
    }
}

/// An answer the API stopped short of a turn (the compatible servers' `finish_reason:
/// error`, Gemini's `MALFORMED_FUNCTION_CALL`) is usually transient, as its message says: the same turn is asked once more and the run goes on, the stopped
/// answer's tokens counted. It failed the run at once. A language the API does not support
/// is not asked again.
#[tokio::test]
async fn an_answer_stopped_short_of_a_turn_is_asked_again_once() {
    for (dialect, reason) in STOPPED_SHORT {
        let next = ScriptStep::tool_call(
            "agent__final_report",
            json!({"status": "success", "content": "read it"}),
        );
        let (report, requests) =
            run_scripted(dialect, stopped_after_a_call(dialect, reason, next)).await;
        assert_eq!(
            (report.status, report.content.as_str()),
            (AgentStatus::Success, "read it"),
            "{reason}"
        );
        assert_eq!(requests.len(), 3, "{reason}");
        assert_eq!(requests[2]["messages"], requests[1]["messages"], "{reason}: the same turn");
        assert_eq!(report.turns, 2, "{reason}");
        assert_eq!(report.usage.output_tokens, 10 + 555 + 10, "{reason}: {:?}", report.usage);
    }

    let (report, requests) = run_scripted(
        Dialect::OpenAi,
        vec![stopped(Dialect::OpenAi, "language", 100, 5), ScriptStep::text("never")],
    )
    .await;
    assert_eq!(report.status, AgentStatus::Failure, "{}", report.content);
    assert!(report.content.contains("language"), "{}", report.content);
    assert_eq!(requests.len(), 1);
}

/// An Anthropic answer paused by the API's server tools (`pause_turn`, here a web search),
/// `input` tokens read and `output` written.
fn paused_search(input: u64, output: u64) -> ScriptStep {
    let answer = json!({"id": "msg_pause", "type": "message", "role": "assistant",
        "model": "test-model", "content": paused_search_blocks(), "stop_reason": "pause_turn",
        "stop_sequence": null, "usage": {"input_tokens": input, "output_tokens": output}});
    ScriptStep::Whole(Box::new(ScriptStep::Raw(answer.to_string())))
}

/// The blocks of [`paused_search`]'s answer.
fn paused_search_blocks() -> Value {
    json!([
        {"type": "text", "text": "Searching first."},
        {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search",
         "input": {"query": "release date"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [
            {"type": "web_search_result", "url": "https://example.com/r", "title": "R",
             "encrypted_content": "EqgfCioIARgBIiQ3YTAw", "page_age": null}]},
    ])
}

/// A turn the API's server tools paused (`pause_turn`) is carried on as Anthropic
/// documents, within the turn: the continuation sends the paused blocks back unchanged,
/// the call the continued turn makes runs, and the next turn sends the whole turn back,
/// server tool blocks and call, with its result; every request's tokens count, and the
/// paused request is no turn of its own. The turn was asked again whole, as if the paused
/// search never happened.
#[tokio::test]
async fn a_paused_turn_is_continued_and_sent_back_whole() {
    let script = vec![
        paused_search(7000, 555),
        ScriptStep::tool_call("mock__big", json!({})),
        ScriptStep::tool_call(
            "agent__final_report",
            json!({"status": "success", "content": "found it"}),
        ),
    ];
    let (report, requests) = run_scripted(Dialect::Anthropic, script).await;
    assert_eq!((report.status, report.content.as_str()), (AgentStatus::Success, "found it"));
    assert_eq!(requests.len(), 3);
    let first = requests[0]["messages"].as_array().unwrap();
    let continued = requests[1]["messages"].as_array().unwrap();
    assert_eq!(continued[..first.len()], first[..]);
    assert_eq!(
        continued[first.len()..],
        [json!({"role": "assistant", "content": paused_search_blocks()})]
    );
    // The next turn: the whole turn (paused blocks, then the call), then the call's result.
    let next = requests[2]["messages"].as_array().unwrap();
    let turn = next[first.len()]["content"].as_array().unwrap();
    assert_eq!(turn[..3], paused_search_blocks().as_array().unwrap()[..]);
    assert_eq!(
        (turn.len(), &turn[3]["type"], &turn[3]["name"]),
        (4, &json!("tool_use"), &json!("mock__big"))
    );
    let result = &next[first.len() + 1]["content"][0];
    assert_eq!((&result["type"], &result["tool_use_id"]), (&json!("tool_result"), &turn[3]["id"]));
    assert_eq!(report.turns, 2, "the continuation is part of its turn");
    assert_eq!(report.usage.output_tokens, 555 + 10 + 10, "{:?}", report.usage);
    assert!(report.usage.input_tokens > 7000, "{:?}", report.usage);
}

/// A turn still paused after `MAX_CONTINUATIONS` continuations fails the run saying so,
/// with every request's tokens counted, and is not asked again: it would only pause as
/// often.
#[tokio::test]
async fn a_turn_that_keeps_pausing_fails_with_every_requests_tokens() {
    let asked = toolmux_llm::MAX_CONTINUATIONS as usize + 1;
    let script = (0..asked).map(|_| paused_search(1000, 5)).collect();
    let (report, requests) = run_scripted(Dialect::Anthropic, script).await;
    assert_eq!(report.status, AgentStatus::Failure, "{}", report.content);
    assert!(report.content.contains("pause_turn"), "{}", report.content);
    assert!(report.content.contains("continued 8 times"), "{}", report.content);
    assert_eq!(requests.len(), asked, "not asked again");
    assert_eq!(report.usage.output_tokens, 5 * asked as u64, "{:?}", report.usage);
    assert!(report.usage.input_tokens >= 1000 * asked as u64, "{:?}", report.usage);
}

/// The ids of the calls and the results (id, text) of the request `body` in `dialect`.
fn wire_calls_and_results(dialect: Dialect, body: &Value) -> (Vec<String>, Vec<(String, String)>) {
    let text = |content: &Value| match content {
        Value::String(text) => text.clone(),
        parts => parts.to_string(),
    };
    let id = |value: &Value| value.as_str().unwrap().to_owned();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for message in body["messages"].as_array().unwrap() {
        match dialect {
            Dialect::OpenAi => {
                let made = message["tool_calls"].as_array().into_iter().flatten();
                calls.extend(made.map(|call| id(&call["id"])));
                if message["role"] == "tool" {
                    results.push((id(&message["tool_call_id"]), text(&message["content"])));
                }
            }
            Dialect::Anthropic => {
                for part in message["content"].as_array().into_iter().flatten() {
                    match part["type"].as_str() {
                        Some("tool_use") => calls.push(id(&part["id"])),
                        Some("tool_result") => {
                            results.push((id(&part["tool_use_id"]), text(&part["content"])));
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    (calls, results)
}

/// A turn of more calls than the agent's `maxCallsPerTurn`: the first ones run, the rest
/// do not, and each of those is answered with the limit and what to do, so that every call
/// has its result and the API takes the conversation on, in either dialect.
#[tokio::test]
async fn calls_past_the_limit_of_a_turn_are_answered_without_running() {
    for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
        let calls = (0..5).map(|i| ("mock__echo".to_owned(), json!({"i": i}))).collect();
        let mock = Arc::new(MockProvider::new("mock").with_tool("echo", Behavior::Echo));
        let script = vec![
            ScriptStep::ToolCalls(calls),
            ScriptStep::tool_call(
                "agent__final_report",
                json!({"status": "success", "content": "three of five"}),
            ),
        ];
        let (report, requests) =
            run_scripted_with(dialect, script, async |dialect, server: &ScriptedLlmServer| {
                let models = BTreeMap::from([("m".to_owned(), model_speaking(dialect, server))]);
                let config = AgentConfig { max_calls_per_turn: Some(3), ..agent("m") };
                start_agents(one("a", config), models, vec![mock.clone()]).await
            })
            .await;
        assert_eq!(
            (report.status, report.content.as_str()),
            (AgentStatus::Success, "three of five"),
            "{dialect:?}"
        );
        assert_eq!(mock.calls_of("echo"), 3, "{dialect:?}: only the first three run");
        // Only those count as calls; the two past the limit are counted apart, in the
        // report's JSON and in a tool's output of it too.
        assert_eq!((report.tool_calls, report.refused_calls), (3, 2), "{dialect:?}");
        let written = serde_json::to_value(&report).unwrap();
        assert_eq!((&written["toolCalls"], &written["refusedCalls"]), (&json!(3), &json!(2)));
        let output = report.to_output();
        assert_eq!(output.extras.get("refusedCalls"), Some(&json!(2)), "{:?}", output.extras);
        assert_eq!(requests.len(), 2, "{dialect:?}");
        let (calls, results) = wire_calls_and_results(dialect, &requests[1]);
        let answered: Vec<&String> = results.iter().map(|(id, _)| id).collect();
        assert_eq!(calls.len(), 5, "{dialect:?}: {calls:?}");
        assert_eq!(answered, calls.iter().collect::<Vec<_>>(), "{dialect:?}: every call answered");
        for (id, text) in &results[..3] {
            assert!(!text.contains("not called"), "{dialect:?} {id}: {text}");
        }
        for (id, text) in &results[3..] {
            assert!(
                text.contains("not called") && text.contains("at most 3 per turn"),
                "{dialect:?} {id}: {text}"
            );
            assert!(text.contains("maxCallsPerTurn") && text.contains("fewer calls"), "{text}");
        }
    }
}

/// `maxCallsPerTurn` of 0 would let no turn call anything: refused, naming the key.
#[test]
fn a_limit_of_no_calls_per_turn_is_refused() {
    let model: Arc<dyn Model> = Arc::new(ScriptedModel::new("m"));
    let models = BTreeMap::from([("m".to_owned(), model)]);
    let config = AgentConfig { max_calls_per_turn: Some(0), ..agent("m") };
    let error = Agents::new(one("a", config), models).unwrap_err().to_string();
    assert!(error.starts_with("agents.a: maxCallsPerTurn must be at least 1"), "{error}");
    assert!(error.contains("default of 64"), "{error}");
}

/// How many whole results of `mock__big` (8,000 bytes in lines of 99 `x`) `body` holds.
fn whole_results(body: &str) -> usize {
    body.matches(&"x".repeat(99)).count() / 80
}

/// The window of the model in the test below, in tokens of four bytes of the request's body.
const CUT_WINDOW: u64 = 11_000;

/// The request the model in the test below needs to write its answer, in the same tokens.
const ROOM_TO_ANSWER: usize = 3000;

/// `next`, unless the request's body is over [`ROOM_TO_ANSWER`] tokens: then an answer cut
/// where it filled a window of [`CUT_WINDOW`] tokens, having read the request and written
/// the rest.
fn cut_unless_room(dialect: Dialect, next: ScriptStep) -> ScriptStep {
    ScriptStep::callback(move |request| {
        let tokens = request.to_string().len() / 4;
        if tokens <= ROOM_TO_ANSWER {
            return next.clone();
        }
        let read = tokens as u64;
        cut_at_the_window(dialect, read, CUT_WINDOW.saturating_sub(read).max(1))
    })
}

/// An answer cut at the window after writing a quarter of its request or more: the window
/// is what was read and written together, and the request fitted to a share of it left
/// the answer no more room than before, so the run failed saying nothing was left to
/// shorten. The request now leaves room for the answer (twice what it wrote, up to
/// `maxTokens`), less each time it is cut again, until the model answers.
#[tokio::test]
async fn an_answer_cut_at_the_window_gets_room_to_answer() {
    for dialect in [Dialect::Anthropic, Dialect::OpenAi] {
        let report = ScriptStep::tool_call(
            "agent__final_report",
            json!({"status": "success", "content": "read it all"}),
        );
        let mut script = vec![ScriptStep::tool_call("mock__big", json!({})); 4];
        script.extend(std::iter::repeat_n(cut_unless_room(dialect, report), 3));
        let (report, requests) = run_scripted(dialect, script).await;
        assert_eq!(
            (report.status, report.content.as_str()),
            (AgentStatus::Success, "read it all"),
            "{dialect:?}"
        );
        let sizes: Vec<usize> = requests.iter().map(|r| r.to_string().len() / 4).collect();
        assert_eq!(requests.len(), 7, "{dialect:?}: cut twice, then answered: {sizes:?}");
        assert!(sizes[4] > ROOM_TO_ANSWER && sizes[5] > ROOM_TO_ANSWER, "{sizes:?}");
        assert!(sizes[5] < sizes[4] && sizes[6] <= ROOM_TO_ANSWER, "{sizes:?}");
        let body = requests[6].to_string();
        assert_eq!(body.matches("elided to keep the conversation").count(), 3, "{dialect:?}");
        assert_eq!(whole_results(&body), 1, "{dialect:?}: the latest result is whole");
    }
}

/// An API that refuses the request as over the window however much is elided: the turn
/// is shortened a few times, each time more, then the run fails saying so and what to
/// change, though old tool results are left (the second refusal with the same window
/// elided nothing, and the run failed saying nothing was left to shorten).
#[tokio::test]
async fn a_request_refused_again_and_again_is_shortened_a_bounded_number_of_times() {
    let refused = ScriptStep::callback(|request| {
        let tokens = request.to_string().len() / 4;
        let message = format!(
            "This model's maximum context length is 20000 tokens. However, your messages \
             resulted in {tokens} tokens. Please reduce the length of the messages."
        );
        let error = json!({"error": {"message": message, "type": "invalid_request_error",
            "param": "messages", "code": "context_length_exceeded"}});
        ScriptStep::status(400, error.to_string())
    });
    let mut script = vec![
        ScriptStep::ToolCalls(vec![("mock__big".to_owned(), json!({})); 10]),
        ScriptStep::tool_call("mock__big", json!({})),
    ];
    script.extend(std::iter::repeat_n(refused, 5));
    script.push(ScriptStep::text("asked once too often"));
    let (report, requests) = run_scripted(Dialect::OpenAi, script).await;
    assert_eq!(report.status, AgentStatus::Failure, "{}", report.content);
    assert!(report.content.contains("shortened 4 times"), "{}", report.content);
    assert!(report.content.contains("contextTokenBudget"), "{}", report.content);
    let sizes: Vec<usize> = requests.iter().map(|r| r.to_string().len() / 4).collect();
    assert_eq!(requests.len(), 7, "the first ask and four shorter ones: {sizes:?}");
    assert!(sizes[2..].windows(2).all(|pair| pair[1] < pair[0]), "{sizes:?}");
    let left = whole_results(&requests[6].to_string());
    assert!(left >= 2, "old results are left besides the latest: {left}");
}

/// When only the latest turn's results (and the task) are left, nothing gives way: the run
/// fails saying why and what to change, not with the API's words alone.
#[tokio::test]
async fn a_refusal_over_the_window_with_nothing_to_elide_says_what_to_change() {
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::tool_call("mock__big", json!({})),
            within_window(ScriptStep::text("unreachable")),
        ],
    );
    // The task alone is over the window once the result is in.
    let (agents, _orchestrator) = on_a_model_speaking(Dialect::OpenAi, &server).await;
    let report = agents.run("a", &"t".repeat(14_000), &CallContext::new()).await.unwrap();
    assert_eq!(report.status, AgentStatus::Failure);
    assert!(report.content.contains("maximum context length"), "{}", report.content);
    assert!(report.content.contains("contextTokenBudget"), "{}", report.content);
    assert_eq!(server.requests().len(), 2);
}

/// Parallel calls answered by an API that says `finish_reason: "stop"` beside them (as
/// vLLM's and Ollama's compatible servers do) all run, side by side; their results go back
/// in the order the model wrote the calls, each under its call's id, though the first
/// finishes last (rig persists results in call order; tools that report in completion
/// order mismatch results and calls).
#[tokio::test]
async fn parallel_calls_answered_out_of_order_go_back_in_call_order() {
    use toolmux_core::{ToolKind, ToolOutput, ToolSet};
    let spec = ToolSpec::new("wait", "waits `ms`", ToolSpec::any_object_schema())
        .with_annotations(ToolAnnotations { read_only: true, ..ToolAnnotations::default() });
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let logged = log.clone();
    let tools = ToolSet::new("t", ToolKind::Builtin).with_tool(
        spec,
        move |arguments: Value, _: CallContext| {
            let log = logged.clone();
            async move {
                let ms = arguments["ms"].as_u64().unwrap_or(0);
                log.lock().expect("not poisoned").push(format!("start {ms}"));
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                log.lock().expect("not poisoned").push(format!("end {ms}"));
                Ok(ToolOutput::text(format!("waited {ms}")))
            }
        },
    );
    let call = |id: &str, ms: u64| {
        json!({"id": id, "type": "function",
            "function": {"name": "t__wait", "arguments": json!({"ms": ms}).to_string()}})
    };
    let calls = json!({"model": "m", "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": null,
            "tool_calls": [call("slow", 300), call("quick", 0), call("middle", 100)]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10}});
    let server = ScriptedLlmServer::start(
        Dialect::OpenAi,
        vec![
            ScriptStep::Whole(Box::new(ScriptStep::Raw(calls.to_string()))),
            ScriptStep::text("done"),
        ],
    );
    let config = ModelConfig {
        api: ApiKind::Openai,
        model: "test-model".into(),
        base_url: Some(server.base_url()),
        ..ModelConfig::default()
    };
    let model = toolmux_llm::connect("m", &config).unwrap();
    let models = BTreeMap::from([("m".to_owned(), model)]);
    let (agents, _orchestrator) =
        start_agents(one("a", agent("m")), models, vec![Arc::new(tools)]).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.tool_calls), (AgentStatus::Success, 3));
    let log = log.lock().expect("not poisoned").clone();
    let at = |event: &str| log.iter().position(|e| e == event).expect(event);
    assert!(at("start 100") < at("end 300"), "side by side: {log:?}");
    assert!(at("end 0") < at("end 100") && at("end 100") < at("end 300"), "{log:?}");
    let requests = server.requests();
    let results: Vec<(String, String)> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| (m["tool_call_id"].as_str().unwrap().into(), m["content"].to_string()))
        .collect();
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["slow", "quick", "middle"], "{results:?}");
    for (id, waited) in [("slow", "300"), ("quick", "0"), ("middle", "100")] {
        let (_, content) = results.iter().find(|(i, _)| i == id).unwrap();
        assert!(content.contains(&format!("waited {waited}")), "{id}: {content}");
    }
}

// What `agent__task_status` asks of the loop

/// An agent offered `agent__task_status`, on a model `m` speaking `dialect`'s API served by
/// `server`, with a tool `mock__echo`.
async fn reporting_status(dialect: Dialect, server: &ScriptedLlmServer) -> (Agents, Orchestrator) {
    let model = model_speaking(dialect, server);
    let mock: Arc<dyn ToolProvider> =
        Arc::new(MockProvider::new("mock").with_tool("echo", Behavior::Echo));
    let models = BTreeMap::from([("m".to_owned(), model)]);
    let config = AgentConfig { task_status: true, ..agent("m") };
    start_agents(one("a", config), models, vec![mock]).await
}

/// The tools the request `body` in `dialect` offers, and the one its `tool_choice` forces.
fn offered_and_forced(dialect: Dialect, body: &Value) -> (Vec<String>, Option<String>) {
    let tools = body["tools"].as_array().unwrap().iter();
    let (offered, forced) = match dialect {
        Dialect::OpenAi => (
            tools.map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect(),
            body["tool_choice"]["function"]["name"].as_str(),
        ),
        Dialect::Anthropic => (
            tools.map(|t| t["name"].as_str().unwrap().to_owned()).collect(),
            body["tool_choice"]["name"].as_str(),
        ),
    };
    (offered, forced.map(str::to_owned))
}

/// A model saying with `agent__task_status` that it can finalize (`ready_for_final_report`,
/// or `status: completed`) and calling nothing else is told to call its report now, and its
/// next turn asks for the report (`tool_choice`), its tools still offered; a status that
/// says it is not ready, that more tools are needed, or that came with other calls
/// (whose results the model has not seen) asks for nothing. Both flags were recorded and
/// ignored: the answer was "recorded" and the next turn the same as any.
#[tokio::test]
async fn a_model_ready_for_its_report_is_asked_for_it_next() {
    let report = ("agent__final_report".to_owned(), json!({"status": "success", "content": "ok"}));
    let echo = ("mock__echo".to_owned(), json!({}));
    let status = |arguments: Value| ("agent__task_status".to_owned(), arguments);
    let ready = json!({"status": "in-progress", "ready_for_final_report": true});
    let completed = json!({"status": "completed", "done": "all of it"});
    let cases = [
        (vec![status(ready.clone())], true, "call agent__final_report now"),
        (vec![status(completed.clone())], true, "call agent__final_report now"),
        (vec![status(json!({"status": "in-progress", "now": "reading"}))], false, "recorded"),
        (
            vec![status(json!({"status": "in-progress", "ready_for_final_report": false}))],
            false,
            "recorded",
        ),
        (
            vec![status(json!({"status": "completed", "need_to_run_more_tools": true}))],
            false,
            "need more tools: run them",
        ),
        (vec![status(ready), echo], false, "once you have the results of this turn's other calls"),
    ];
    for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
        for (calls, asked, answer) in &cases {
            let script = vec![
                ScriptStep::ToolCalls(calls.clone()),
                ScriptStep::ToolCalls(vec![report.clone()]),
            ];
            let (run, requests) = run_scripted_with(dialect, script, reporting_status).await;
            assert_eq!((run.status, run.content.as_str()), (AgentStatus::Success, "ok"));
            assert_eq!(requests.len(), 2, "{dialect:?} {calls:?}");
            let (offered, forced) = offered_and_forced(dialect, &requests[1]);
            let expected = asked.then(|| "agent__final_report".to_owned());
            assert_eq!(forced, expected, "{dialect:?} {calls:?}");
            assert!(offered.contains(&"mock__echo".to_owned()), "{dialect:?}: {offered:?}");
            assert!(offered.contains(&"agent__task_status".to_owned()), "{offered:?}");
            let (_, results) = wire_calls_and_results(dialect, &requests[1]);
            assert!(results[0].1.contains(answer), "{dialect:?} {calls:?}: {results:?}");
            assert!(results[0].1.starts_with("recorded"), "{results:?}");
        }
    }
}

/// A model saying it can finalize and needs no more tools (`need_to_run_more_tools:
/// false`) is offered only its report in its next turn, even when that turn's other calls
/// ran; a call of another tool then (a server that ignores `tool_choice`) is not made but
/// answered, and the turn after offers every tool again, so the model is never stuck.
#[tokio::test]
async fn a_model_needing_no_more_tools_is_offered_only_its_report() {
    let ready = json!({"status": "completed", "ready_for_final_report": true,
        "need_to_run_more_tools": false});
    for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
        let script = vec![
            ScriptStep::ToolCalls(vec![
                ("agent__task_status".into(), ready.clone()),
                ("mock__echo".into(), json!({"n": 1})),
            ]),
            ScriptStep::tool_call("mock__echo", json!({"n": 2})),
            ScriptStep::tool_call(
                "agent__final_report",
                json!({"status": "success", "content": "ok"}),
            ),
        ];
        let (run, requests) = run_scripted_with(dialect, script, reporting_status).await;
        assert_eq!((run.status, run.content.as_str()), (AgentStatus::Success, "ok"));
        assert_eq!(
            (run.tool_calls, run.refused_calls),
            (1, 1),
            "{dialect:?}: the echo of the turn that offered only the report did not run"
        );
        assert_eq!(run.task_status, Some(ready.clone()));
        assert_eq!(requests.len(), 3, "{dialect:?}");
        let (offered, forced) = offered_and_forced(dialect, &requests[1]);
        assert_eq!(offered, ["agent__final_report"], "{dialect:?}");
        assert_eq!(forced.as_deref(), Some("agent__final_report"), "{dialect:?}");
        let (_, results) = wire_calls_and_results(dialect, &requests[1]);
        assert!(results[0].1.contains("the only tool your next turn offers"), "{results:?}");
        assert!(results[1].1.contains("\"n\""), "the echo of the same turn ran: {results:?}");
        let (offered, forced) = offered_and_forced(dialect, &requests[2]);
        assert_eq!(forced, None, "{dialect:?}");
        assert!(offered.contains(&"mock__echo".to_owned()), "{dialect:?}: {offered:?}");
        let (_, results) = wire_calls_and_results(dialect, &requests[2]);
        let last = &results.last().unwrap().1;
        assert!(last.contains("not called") && last.contains("offered only"), "{last}");
    }
}

/// An `agent__task_status` call the model got wrong is answered with what to fix, and not
/// recorded.
#[tokio::test]
async fn an_invalid_task_status_says_what_to_fix() {
    let script = vec![
        ScriptStep::tool_call("agent__task_status", json!({"status": "done"})),
        ScriptStep::text("ok"),
    ];
    let (run, requests) = run_scripted_with(Dialect::OpenAi, script, reporting_status).await;
    assert_eq!((run.status, run.task_status), (AgentStatus::Success, None));
    let (_, results) = wire_calls_and_results(Dialect::OpenAi, &requests[1]);
    assert!(results[0].1.contains("invalid status") && results[0].1.contains("in-progress"));
}

/// A configured secret, here also the model's API key: a passphrase, so that the scripted
/// server's stream (text in words) splits it across deltas.
const PASSPHRASE: &str = "hunter2 sk-LIVE-7f3a9c2e1b";

/// What the model writes leaves the agent redacted: a secret it echoes in its text (split
/// across streamed deltas), in a call's arguments and in its report is not in the text
/// streamed to the run's sink, the report (content, JSON content) nor the transcript, on
/// either API, while the conversation sent back to the model keeps it as written. The
/// secret is the orchestrator's, and the agents are built by hand with no hooks: the agent
/// redacts with the orchestrator it runs on.
#[tokio::test]
async fn a_secret_the_model_writes_leaves_the_agent_redacted() {
    for dialect in [Dialect::OpenAi, Dialect::Anthropic] {
        let script = vec![
            ScriptStep::TextAndToolCalls(
                format!("My key is {PASSPHRASE} as you see"),
                vec![("mock__echo".into(), json!({"say": PASSPHRASE}))],
            ),
            ScriptStep::ToolCalls(vec![(
                "agent__final_report".into(),
                json!({"status": "success", "content": format!("the key: {PASSPHRASE}"),
                    "format": "json", "content_json": {"key": PASSPHRASE}}),
            )]),
        ];
        let server = ScriptedLlmServer::start(dialect, script);
        let mut config = model_speaking_config(dialect, &server);
        config.api_key = Some(PASSPHRASE.into());
        let models =
            BTreeMap::from([("m".to_owned(), toolmux_llm::connect("m", &config).unwrap())]);
        let agents = Agents::new(one("a", agent("m")), models).expect("valid agents");
        let mock: Arc<dyn ToolProvider> =
            Arc::new(MockProvider::new("mock").with_tool("echo", Behavior::Echo));
        let orchestrator = Orchestrator::builder(OrchestratorConfig::default())
            .provider(mock)
            .provider(agents.provider())
            .secrets([PASSPHRASE.to_owned()])
            .build()
            .expect("an orchestrator");
        agents.attach(&orchestrator);
        assert!(orchestrator.warmup().await.is_ok());
        let texts = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let texts = texts.clone();
            TextSink::new(move |_, delta| {
                if let TextDelta::Text(text) = delta {
                    texts.lock().unwrap().push(text.to_owned());
                }
            })
        };
        let options = RunOptions { on_text: Some(sink), transcript: true, ..RunOptions::default() };
        let report = agents.run_with("a", "t", &CallContext::new(), &options).await.unwrap();
        let streamed = texts.lock().unwrap().concat();
        assert_eq!(streamed, "My key is [redacted] as you see", "{dialect:?}");
        let written = serde_json::to_string(&report).unwrap();
        assert!(!written.contains("sk-LIVE") && !written.contains("hunter2"), "{written}");
        assert_eq!(report.content, "the key: [redacted]", "{dialect:?}");
        assert_eq!(report.content_json, Some(json!({"key": "[redacted]"})), "{dialect:?}");
        assert!(written.contains("My key is [redacted] as you see"), "{written}");
        // The model's own conversation is not redacted: it goes back as it was written.
        let requests = server.requests();
        assert!(requests[1].to_string().contains(&format!("My key is {PASSPHRASE}")));
    }
}

/// The configuration of a model `m` on `server`, speaking `dialect`'s API, its prompt cache
/// off.
fn model_speaking_config(dialect: Dialect, server: &ScriptedLlmServer) -> ModelConfig {
    ModelConfig {
        api: match dialect {
            Dialect::OpenAi => ApiKind::Openai,
            Dialect::Anthropic => ApiKind::Anthropic,
        },
        model: "test-model".into(),
        base_url: Some(server.base_url()),
        prompt_cache: Some(false),
        ..ModelConfig::default()
    }
}

/// A file tool whose `read` answers as a real one does a file read again unchanged: its
/// content, then that it is unchanged since the last read, then its content again (the
/// read tool's view of what the model holds having been cut), and so on.
#[derive(Debug, Default)]
struct AlternatingReader(AtomicUsize);

#[async_trait]
impl ToolProvider for AlternatingReader {
    fn kind(&self) -> toolmux_core::ToolKind {
        toolmux_core::ToolKind::Builtin
    }

    fn namespace(&self) -> &str {
        "file"
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        Ok(vec![ToolSpec::new("read", "Reads a file", ToolSpec::any_object_schema())])
    }

    async fn call(
        &self,
        _name: &str,
        _arguments: Value,
        _ctx: &CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        let text = match self.0.fetch_add(1, Ordering::Relaxed) % 2 {
            0 => "1\thello",
            _ => "[File unchanged since last read]",
        };
        Ok(toolmux_core::ToolOutput::text(text))
    }
}

/// A call whose result alternates between results it got before counts as a repeat: with
/// `maxRepeats` 3, a read answered by its content and "unchanged" by turns runs five times
/// (its second result starts a new count, the rest are ones seen), where each change reset
/// the count and every read ran.
#[tokio::test]
async fn a_call_whose_result_alternates_is_a_repeat() {
    let mut model = ScriptedModel::new("m");
    for _ in 0..10 {
        model = model.calls(vec![("file__read", json!({"path": "a.txt"}))]);
    }
    let model = Arc::new(model.report("success", "read it"));
    let config = AgentConfig { max_repeats: Some(3), max_turns: Some(30), ..agent("m") };
    let reader = Arc::new(AlternatingReader::default());
    let providers: Vec<Arc<dyn ToolProvider>> = vec![reader.clone()];
    let (agents, _orchestrator) = start_agents(one("a", config), only(&model), providers).await;
    let report = agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!(reader.0.load(Ordering::Relaxed), 5, "{report:?}");
    let results = tool_results(&model.requests()[6]);
    assert!(results[0].1 && results[0].0.contains("in each of your last 3 turns"), "{results:?}");
}

/// After three turns in a row whose calls were all refused as repeats, the next turn is the
/// last and asks for the report, where the run went on refusing until the turn limit.
#[tokio::test]
async fn refused_repeats_turn_after_turn_ask_for_the_report() {
    let mut model = ScriptedModel::new("m");
    for _ in 0..5 {
        model = model.calls(vec![("mock__echo", json!({"a": 1}))]);
    }
    let model = Arc::new(model.report("partial", "going round"));
    let config = AgentConfig { max_repeats: Some(2), max_turns: Some(25), ..agent("m") };
    let s = setup(one("a", config), vec![model.clone()]).await;
    let report = s.agents.run("a", "t", &CallContext::new()).await.unwrap();
    assert_eq!((report.status, report.turns), (AgentStatus::Partial, 6));
    assert_eq!((report.tool_calls, report.refused_calls), (2, 3));
    assert_eq!(s.mock.calls_of("echo"), 2);
    assert_last_turn_says(
        &model,
        "your calls were refused as repeats (`maxRepeats`) in 3 turns in a row, with no other \
         tool run",
    );
}
