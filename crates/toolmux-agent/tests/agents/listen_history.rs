//! A listening agent's cycles carry the conversation of the cycles before them
//! (`listenHistoryTokens`): the calls an earlier cycle made, their results, and what it was
//! given from the inbox reach the next cycles' model, within the cap, oldest turns first
//! giving way whole.

use super::*;

/// What a cycle's model thinks aloud before it calls a build, `bytes` long, so that a turn
/// weighs what a test needs it to.
fn thinking(mark: &str, bytes: usize) -> String {
    format!("{mark} ").repeat(bytes / (mark.len() + 1))
}

/// A model whose cycles each start build `target` (thinking `thought` aloud before the
/// call) and report, the build answered with "build {target} green" meanwhile, as the other
/// side would answer it: the answer wakes the next cycle. A last cycle only reports.
fn building(
    store: &Arc<toolmux_external::MemoryPendingStore>,
    cycles: &[(u64, &str)],
) -> ScriptedModel {
    let model = cycles.iter().fold(ScriptedModel::new("m"), |model, &(target, thought)| {
        let thought = thought.to_owned();
        let store = store.clone();
        model
            .then(move |_| {
                let call = ModelToolCall::new(
                    format!("build_{target}"),
                    "external__build",
                    json!({"target": target}),
                );
                let mut answer = ModelResponse::tool_calls(vec![call]);
                answer.content = thought.clone();
                Ok(used(answer))
            })
            .then(move |_| {
                answer_pending(
                    &store,
                    move |arguments| arguments["target"] == target,
                    json!(format!("build {target} green")),
                );
                let report = json!({"status": "success", "content": format!("started {target}")});
                let call =
                    ModelToolCall::new(format!("report_{target}"), "agent__final_report", report);
                Ok(used(ModelResponse::tool_calls(vec![call])))
            })
    });
    model.report("success", "deployed")
}

/// Agent `a` listening as run [`LISTENING`] with `config`, thinking with `model` beside an
/// asynchronous external tool `external__build` (its store `store`), woken first by build 1's
/// result, for `cycles` cycles: the reports of its cycles.
async fn listen_cycles(
    config: AgentConfig,
    model: &Arc<ScriptedModel>,
    store: Arc<toolmux_external::MemoryPendingStore>,
    external: toolmux_external::ExternalProvider,
    cycles: usize,
) -> Vec<AgentReport> {
    use toolmux_external::{ExternalResult, PendingStore};
    let providers: Vec<Arc<dyn ToolProvider>> = vec![Arc::new(external)];
    let (agents, orchestrator) =
        start_agents_with(OrchestratorConfig::default(), one("a", config), only(model), providers)
            .await;
    let first = pending_call("external__build", json!({"target": 1}), LISTENING);
    let id = store.open(first).await.unwrap();
    let green = ExternalResult { result: json!("build 1 green"), is_error: false };
    store.resolve(&id, green).await.unwrap();
    let ctx = CallContext::new().with_run_id(LISTENING);
    let options = toolmux_agent::ListenOptions {
        max_cycles: Some(cycles),
        idle: Some(std::time::Duration::from_secs(30)),
        ..Default::default()
    };
    let mut reports = Vec::new();
    let ended = agents.listen("a", &ctx, &options, |r| reports.push(r.clone())).await;
    assert_eq!(ended.unwrap(), toolmux_agent::ListenEnd::Cycles, "{reports:#?}");
    orchestrator.cleanup().await;
    reports
}

/// The messages of `request` that are user messages' text.
fn user_texts(request: &ModelRequest) -> Vec<&str> {
    request
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::User { content } => Some(content.as_str()),
            _ => None,
        })
        .collect()
}

/// The ids of the calls `request`'s assistant messages made, and of the calls its tool
/// messages answer.
fn calls_and_results(request: &ModelRequest) -> (Vec<String>, Vec<String>) {
    let (mut calls, mut results) = (Vec::new(), Vec::new());
    for message in &request.messages {
        match message {
            Message::Assistant { tool_calls, .. } => {
                calls.extend(tool_calls.iter().map(|c| c.id.clone()));
            }
            Message::Tool { results: answered } => {
                results.extend(answered.iter().map(|r| r.call_id.clone()));
            }
            Message::User { .. } => {}
        }
    }
    (calls, results)
}

/// The second cycle's model reads the first cycle's conversation: what woke it (build 1's
/// result), the call it made (build 2) with its result, and its report; the third reads
/// the second's, build 2's result among it. Each report is its cycle's alone. Before, every
/// cycle began with its task only.
#[tokio::test]
async fn a_listening_agent_s_next_cycle_reads_the_calls_and_results_of_the_last() {
    let (store, external) = async_external("build", "Starts a build");
    let model = Arc::new(building(&store, &[(2, ""), (3, "")]));
    let reports = listen_cycles(agent("m"), &model, store, external, 3).await;
    let contents: Vec<&str> = reports.iter().map(|r| r.content.as_str()).collect();
    assert_eq!(contents, ["started 2", "started 3", "deployed"]);
    for report in &reports[..2] {
        // Two turns of 110 tokens each: the cycle's own, not the conversation's so far.
        assert_eq!((report.turns, report.usage.total()), (2, 220), "{report:#?}");
        assert!(report.transcript.is_empty(), "{report:#?}");
    }
    let requests = model.requests();
    assert_eq!(requests.len(), 5, "{requests:#?}");

    // Cycle 2: cycle 1's task, call and result come before its own task.
    let second = &requests[2];
    let (calls, results) = calls_and_results(second);
    assert_eq!(calls, ["build_2", "report_2"], "{second:#?}");
    assert_eq!(results, ["build_2", "report_2"], "{second:#?}");
    let Some(Message::Tool { results }) = second.messages.get(2) else { panic!("{second:#?}") };
    assert!(results[0].content.contains("pending"), "{second:#?}");
    let texts = user_texts(second);
    assert_eq!(texts.len(), 2, "{second:#?}");
    assert!(texts[0].contains("build 1 green"), "{second:#?}");
    assert!(texts[1].contains("build 2 green"), "{second:#?}");

    // Cycle 3 still knows what cycle 2 read, and cycle 1 too (all fits the default cap).
    let third = &requests[4];
    let (calls, results) = calls_and_results(third);
    assert_eq!(calls, ["build_2", "report_2", "build_3", "report_3"], "{third:#?}");
    assert_eq!(calls, results, "{third:#?}");
    let texts = user_texts(third);
    assert_eq!(texts.len(), 3, "{third:#?}");
    assert!(texts[1].contains("build 2 green") && texts[2].contains("build 3 green"), "{third:#?}");
}

/// Over `listenHistoryTokens`, the oldest cycle gives way whole: cycle 3 reads cycle 2's
/// conversation from its task on, none of cycle 1's. The cut could fit more by starting
/// after cycle 1's long call (at its result), but a result without its call (or a call
/// without its result) is refused by the APIs: it starts at a user message.
#[tokio::test]
async fn the_oldest_cycles_give_way_whole_to_listen_history_tokens() {
    let (store, external) = async_external("build", "Starts a build");
    // Each call weighs about 2,000 tokens: two cycles' do not fit 3,000, one does.
    let (first, second) = (thinking("one", 8000), thinking("two", 8000));
    let model = Arc::new(building(&store, &[(2, &first), (3, &second)]));
    let config = AgentConfig { listen_history_tokens: Some(3000), ..agent("m") };
    let reports = listen_cycles(config, &model, store, external, 3).await;
    assert_eq!(reports.len(), 3, "{reports:#?}");
    let requests = model.requests();
    assert_eq!(requests.len(), 5, "{requests:#?}");

    // Cycle 2 reads all of cycle 1.
    let (calls, results) = calls_and_results(&requests[2]);
    assert_eq!(calls, ["build_2", "report_2"], "{:#?}", requests[2]);
    assert_eq!(calls, results);

    // Cycle 3 reads cycle 2 from its task on, whole, and nothing of cycle 1.
    let third = &requests[4];
    assert!(matches!(third.messages.first(), Some(Message::User { .. })), "{third:#?}");
    let (calls, results) = calls_and_results(third);
    assert_eq!(calls, ["build_3", "report_3"], "{third:#?}");
    assert_eq!(calls, results, "{third:#?}");
    let texts = user_texts(third);
    assert_eq!(texts.len(), 2, "{third:#?}");
    assert!(texts[0].contains("build 2 green") && texts[1].contains("build 3 green"), "{third:#?}");
    assert!(!format!("{third:?}").contains("one one"), "{third:#?}");
}

/// `listenHistoryTokens: 0`: every cycle starts afresh, with its task alone.
#[tokio::test]
async fn no_listen_history_tokens_makes_every_cycle_fresh() {
    let (store, external) = async_external("build", "Starts a build");
    let model = Arc::new(building(&store, &[(2, "")]));
    let config = AgentConfig { listen_history_tokens: Some(0), ..agent("m") };
    let reports = listen_cycles(config, &model, store, external, 2).await;
    assert_eq!(reports.len(), 2, "{reports:#?}");
    let requests = model.requests();
    let second = &requests[2];
    assert_eq!(second.messages.len(), 1, "{second:#?}");
    assert!(user_texts(second)[0].contains("build 2 green"), "{second:#?}");
}

/// A gateway of one space, `ops`, whose unread messages a test posts: `gateway__wait` says
/// how many there are, `gateway__context` shows them as the agent's context, as the
/// seeds' gateway does.
#[derive(Debug, Default)]
struct Gateway {
    unread: Mutex<Vec<String>>,
}

impl Gateway {
    /// Marks what was said read and says `text`.
    fn say(&self, text: &str) {
        *self.unread.lock().unwrap() = vec![text.to_owned()];
    }
}

#[async_trait]
impl ToolProvider for Gateway {
    fn kind(&self) -> toolmux_core::ToolKind {
        toolmux_core::ToolKind::Builtin
    }

    fn namespace(&self) -> &str {
        "gateway"
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, toolmux_core::ToolError> {
        let spec = |name: &str| ToolSpec::new(name, "The space", ToolSpec::any_object_schema());
        Ok(vec![spec("wait"), spec("context"), spec("skip")])
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        _ctx: &CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        let unread = self.unread.lock().unwrap().clone();
        let answer = match name {
            "wait" => {
                if unread.is_empty() && arguments["waitMs"].as_u64().is_some_and(|ms| ms > 0) {
                    // Not a busy loop while nothing is said.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                json!({"space": "ops", "unread": unread.len()})
            }
            "context" => {
                json!({"activeSpace": "ops", "unreadCount": unread.len(), "unread": unread})
            }
            _ => json!({"ok": true}),
        };
        Ok(toolmux_core::ToolOutput::text(answer.to_string()))
    }
}

/// A cycle going on from the earlier cycles' conversation is given the messages that woke
/// it, as a fresh cycle is: before, a run with history was never given the gateway's
/// context, so the second cycle read that messages had arrived and not what they said.
#[tokio::test]
async fn a_cycle_with_history_reads_the_messages_that_woke_it() {
    let gateway = Arc::new(Gateway::default());
    gateway.say("Husam: can you book the flight to Lisbon?");
    let asked = gateway.clone();
    let model = Arc::new(
        ScriptedModel::new("m")
            .then(move |_| {
                // The question is read and answered; Husam answers in turn.
                asked.say("Husam: confirmed, the 9:40 one");
                let report = json!({"status": "success", "content": "asked which flight"});
                let call = ModelToolCall::new("r1", "agent__final_report", report);
                Ok(used(ModelResponse::tool_calls(vec![call])))
            })
            .report("success", "booked"),
    );
    let providers: Vec<Arc<dyn ToolProvider>> = vec![gateway.clone()];
    let (agents, orchestrator) = start_agents_with(
        OrchestratorConfig::default(),
        one("a", agent("m")),
        only(&model),
        providers,
    )
    .await;
    let options = toolmux_agent::ListenOptions {
        max_cycles: Some(2),
        idle: Some(std::time::Duration::from_secs(30)),
        ..Default::default()
    };
    let mut reports = Vec::new();
    let ended =
        agents.listen("a", &CallContext::new(), &options, |r| reports.push(r.clone())).await;
    assert_eq!(ended.unwrap(), toolmux_agent::ListenEnd::Cycles, "{reports:#?}");
    orchestrator.cleanup().await;
    let requests = model.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let second = &requests[1];
    let texts = user_texts(second);
    assert!(texts[0].contains("can you book the flight"), "{second:#?}");
    let last = texts.last().unwrap();
    assert!(
        last.contains("confirmed, the 9:40 one") && last.contains("1 new message"),
        "{second:#?}"
    );
}
