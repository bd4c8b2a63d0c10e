//! The external tools through their provider: internal tools, synchronous calls answered in
//! time, too late and never, asynchronous calls and the inbox, withdrawal on cancel, the
//! store's bounds, tools made as HTTP requests (handed to a delegate) and the shared
//! provider conformance suite.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use toolmux_core::{CallContext, ContentPart, ToolError, ToolOutput, ToolProvider};
use toolmux_external::{
    DirPendingStore, Execution, ExecutionType, ExternalProvider, ExternalToolConfig,
    MemoryPendingStore, PendingStore,
};
use toolmux_test_support::conformance::{Conformance, SampleCall};

fn tool(execution_type: ExecutionType, is_async: bool, timeout: Option<u64>) -> ExternalToolConfig {
    ExternalToolConfig {
        description: "d".into(),
        input_schema: Some(json!({"type": "object", "properties": {"q": {"type": "string"}}})),
        execution_type,
        is_async,
        timeout,
        visible: None,
        execution: None,
        name: None,
        call_ttl: None,
    }
}

fn provider() -> ExternalProvider {
    let mut tools = BTreeMap::new();
    tools.insert("chart".to_owned(), tool(ExecutionType::Internal, false, None));
    tools.insert("confirm".to_owned(), tool(ExecutionType::Space, false, Some(5_000)));
    tools.insert("quick".to_owned(), tool(ExecutionType::External, false, Some(100)));
    tools.insert("job".to_owned(), tool(ExecutionType::External, true, None));
    tools.insert("never".to_owned(), tool(ExecutionType::External, false, Some(60_000)));
    ExternalProvider::new(&tools, Arc::new(MemoryPendingStore::default())).expect("valid")
}

fn run(id: &str) -> CallContext {
    CallContext::new().with_run_id(id)
}

fn json_of(output: &ToolOutput) -> Value {
    match &output.content[0] {
        ContentPart::Json { value } => value.clone(),
        ContentPart::Text { text } => serde_json::from_str(text).unwrap_or(json!(text)),
        other => panic!("unexpected part {other:?}"),
    }
}

/// The next pending call, waiting for it up to 5 s.
async fn next_pending(p: &ExternalProvider) -> Value {
    let out = p.call("pending", json!({"waitMs": 5000}), &run("worker")).await.expect("pending");
    json_of(&out)["calls"][0].clone()
}

async fn submit(
    p: &ExternalProvider,
    call_id: &str,
    result: Value,
) -> Result<ToolOutput, ToolError> {
    p.call("submit", json!({"callId": call_id, "result": result}), &run("worker")).await
}

/// `visible` says whether people see a tool's calls: internal tools and `visible: false`
/// are not `shown` (their events carry no arguments or result), the others are; every
/// configured tool is offered to models.
#[tokio::test]
async fn visible_says_whether_people_see_the_calls() {
    let mut tools = BTreeMap::new();
    tools.insert("chart".to_owned(), tool(ExecutionType::Internal, false, None));
    tools.insert("ask".to_owned(), tool(ExecutionType::Space, false, None));
    let quiet =
        ExternalToolConfig { visible: Some(false), ..tool(ExecutionType::External, true, None) };
    tools.insert("sync".to_owned(), quiet);
    let p = ExternalProvider::new(&tools, Arc::new(MemoryPendingStore::default())).unwrap();
    let listed = p.list_tools().await.unwrap();
    let shown: Vec<(&str, bool, bool)> = listed
        .iter()
        .filter(|t| tools.contains_key(&t.name))
        .map(|t| (t.name.as_str(), t.annotations.visible, t.annotations.shown))
        .collect();
    assert_eq!(shown, [("ask", true, true), ("chart", true, false), ("sync", true, false)]);
}

#[tokio::test]
async fn internal_tools_return_their_arguments() {
    let out = provider().call("chart", json!({"q": "x"}), &run("r")).await.unwrap();
    assert_eq!(json_of(&out), json!({"success": true, "args": {"q": "x"}}));
    assert_eq!(out.extras["visible"], false);
}

#[tokio::test]
async fn a_synchronous_call_returns_the_submitted_result() {
    let p = provider();
    let worker = {
        let p = p.clone();
        tokio::spawn(async move {
            let call = next_pending(&p).await;
            assert_eq!(call["tool"], "external__confirm");
            assert_eq!(call["arguments"], json!({"q": "ship it?"}));
            assert_eq!(call["runId"], "agent");
            assert_eq!(call["visible"], true);
            assert_eq!(call["async"], false);
            let id = call["callId"].as_str().unwrap().to_owned();
            submit(&p, &id, json!("yes")).await.unwrap().to_text()
        })
    };
    let out = p.call("confirm", json!({"q": "ship it?"}), &run("agent")).await.unwrap();
    assert_eq!(out.to_text(), "yes");
    assert!(!out.is_error);
    assert!(worker.await.unwrap().contains("handed to the waiting call"));
    // Answered: nothing pending, and the id cannot be answered twice.
    let left = p.call("pending", json!({}), &run("w")).await.unwrap();
    assert_eq!(json_of(&left)["calls"], json!([]));
}

#[tokio::test]
async fn a_result_submitted_before_the_caller_waits_is_not_lost() {
    let store = Arc::new(MemoryPendingStore::default());
    let call = toolmux_external::PendingCall {
        call_id: String::new(),
        tool: "external__t".into(),
        arguments: json!({}),
        run_id: "r".into(),
        owner: None,
        execution_type: ExecutionType::External,
        is_async: false,
        visible: true,
        created_ms: 0,
        status: Default::default(),
        expires_ms: 0,
        ttl_ms: None,
    };
    let id = store.open(call).await.unwrap();
    let result = toolmux_external::ExternalResult { result: json!({"n": 1}), is_error: true };
    store.resolve(&id, result.clone()).await.unwrap();
    assert_eq!(store.wait(&id, Duration::from_millis(10)).await, Some(result));
}

#[tokio::test(start_paused = true)]
async fn too_late_results_go_to_the_inbox_of_the_callers_run() {
    let p = provider();
    let out = p.call("quick", json!({"q": "a"}), &run("agent")).await.unwrap();
    assert!(out.is_error);
    let text = out.to_text();
    assert!(
        text.contains("no result for `external__quick`") && text.contains("within 100 ms"),
        "{text}"
    );
    assert!(text.contains("external__inbox"), "{text}");
    let call = next_pending(&p).await;
    let id = call["callId"].as_str().unwrap().to_owned();
    let said = submit(&p, &id, json!({"rows": 3})).await.unwrap().to_text();
    assert!(said.contains("inbox"), "{said}");
    let other = p.call("inbox", json!({}), &run("someone-else")).await.unwrap();
    assert_eq!(json_of(&other)["results"], json!([]));
    let inbox = json_of(&p.call("inbox", json!({}), &run("agent")).await.unwrap());
    assert_eq!(inbox["results"][0]["callId"], id);
    assert_eq!(inbox["results"][0]["result"], json!({"rows": 3}));
    assert_eq!(inbox["results"][0]["isError"], false);
    assert_eq!(inbox["stillPending"], 0);
    // Taken out: a second look finds nothing.
    let again = json_of(&p.call("inbox", json!({}), &run("agent")).await.unwrap());
    assert_eq!(again["results"], json!([]));
}

#[tokio::test]
async fn asynchronous_calls_return_pending_and_results_reach_the_inbox() {
    let p = provider();
    let out = json_of(&p.call("job", json!({"q": "build"}), &run("agent")).await.unwrap());
    assert_eq!(out["status"], "pending");
    let id = out["callId"].as_str().unwrap().to_owned();
    assert_eq!(out["pendingToolCallId"], id.as_str(), "the seeds' name of the id");
    let inbox = json_of(&p.call("inbox", json!({}), &run("agent")).await.unwrap());
    assert_eq!(inbox, json!({"results": [], "stillPending": 1}));
    let only_jobs =
        p.call("pending", json!({"tools": ["external__job"]}), &run("w")).await.unwrap();
    assert_eq!(json_of(&only_jobs)["calls"][0]["callId"], id);
    let only_other =
        p.call("pending", json!({"tools": ["external__quick"]}), &run("w")).await.unwrap();
    assert_eq!(json_of(&only_other)["calls"], json!([]));
    // A tool's own name is its full name; a name of no external tool is refused, not an
    // empty list.
    let by_own_name = p.call("pending", json!({"tools": ["job"]}), &run("w")).await.unwrap();
    assert_eq!(json_of(&by_own_name)["calls"][0]["callId"], id);
    let unknown = p.call("pending", json!({"tools": ["jbo"]}), &run("w")).await.unwrap_err();
    assert!(unknown.to_string().contains("did you mean `external__job`"), "{unknown}");
    let failed = p
        .call("submit", json!({"callId": id, "result": "disk full", "isError": true}), &run("w"))
        .await
        .unwrap();
    assert!(failed.to_text().contains("inbox"));
    let inbox = json_of(&p.call("inbox", json!({}), &run("agent")).await.unwrap());
    assert_eq!(inbox["results"][0]["result"], "disk full");
    assert_eq!(inbox["results"][0]["isError"], true);
    assert_eq!(inbox["results"][0]["arguments"], json!({"q": "build"}));
}

#[tokio::test]
async fn a_cancelled_call_is_withdrawn() {
    let p = provider();
    let cancel = CancellationToken::new();
    let ctx = run("agent").with_cancel(cancel.clone());
    let caller = {
        let p = p.clone();
        tokio::spawn(async move { p.call("confirm", json!({}), &ctx).await })
    };
    let id = next_pending(&p).await["callId"].as_str().unwrap().to_owned();
    cancel.cancel();
    assert!(matches!(caller.await.unwrap(), Err(ToolError::Cancelled { .. })));
    let refused = submit(&p, &id, json!("late")).await.unwrap_err();
    assert!(refused.report().contains(&format!("no pending call `{id}`")), "{}", refused.report());
}

/// A caller dropped while it waits (the pipeline gave up on it, a task aborted) withdraws
/// its call too, as a cancelled one does.
#[tokio::test]
async fn a_dropped_call_is_withdrawn() {
    let p = provider();
    let caller = {
        let p = p.clone();
        tokio::spawn(async move { p.call("confirm", json!({}), &run("agent")).await })
    };
    let id = next_pending(&p).await["callId"].as_str().unwrap().to_owned();
    caller.abort();
    toolmux_test_support::eventually("the call is withdrawn", || {
        let p = p.clone();
        async move {
            let listed = p.call("pending", json!({}), &run("w")).await.unwrap();
            json_of(&listed)["calls"] == json!([])
        }
    })
    .await;
    let refused = submit(&p, &id, json!("late")).await.unwrap_err();
    assert!(refused.report().contains("no pending call"), "{}", refused.report());
}

#[tokio::test]
async fn bad_submissions_say_what_is_wrong() {
    let p = provider();
    let missing = p.call("submit", json!({"result": 1}), &run("w")).await.unwrap_err();
    assert!(missing.report().contains("`callId`"), "{}", missing.report());
    let no_result = p.call("submit", json!({"callId": "x"}), &run("w")).await.unwrap_err();
    assert!(no_result.report().contains("`result` is required"), "{}", no_result.report());
    let unknown = submit(&p, "ext-0-0", json!(1)).await.unwrap_err();
    assert!(unknown.report().contains("external__pending"), "{}", unknown.report());
}

#[tokio::test(start_paused = true)]
async fn a_long_poll_returns_when_a_call_arrives_or_the_wait_ends() {
    let p = provider();
    let empty = p.call("pending", json!({"waitMs": 200}), &run("w")).await.unwrap();
    assert_eq!(json_of(&empty)["calls"], json!([]));
    let poll = {
        let p = p.clone();
        tokio::spawn(async move { next_pending(&p).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.call("job", json!({}), &run("agent")).await.unwrap();
    assert_eq!(poll.await.unwrap()["tool"], "external__job");
}

#[tokio::test]
async fn the_store_is_bounded() {
    let store = MemoryPendingStore::new(2, 1);
    let call = |n: u32| toolmux_external::PendingCall {
        call_id: String::new(),
        tool: format!("external__t{n}"),
        arguments: json!({}),
        run_id: "r".into(),
        owner: None,
        execution_type: ExecutionType::External,
        is_async: true,
        visible: true,
        created_ms: 0,
        status: Default::default(),
        expires_ms: 0,
        ttl_ms: None,
    };
    let a = store.open(call(1)).await.unwrap();
    let b = store.open(call(2)).await.unwrap();
    let full = store.open(call(3)).await.unwrap_err();
    assert!(matches!(full, ToolError::QueueBusy { .. }), "{full:?}");
    let result = || toolmux_external::ExternalResult { result: json!(1), is_error: false };
    store.resolve(&a, result()).await.unwrap();
    store.resolve(&b, result()).await.unwrap();
    let inbox = store.take_inbox("r", None).await.unwrap();
    assert_eq!(inbox.len(), 1, "the oldest was dropped");
    assert_eq!(inbox[0].call_id, b);
}

#[test]
fn invalid_configurations_name_the_tool() {
    let store: Arc<dyn PendingStore> = Arc::new(MemoryPendingStore::default());
    let one = |name: &str, config: ExternalToolConfig| {
        ExternalProvider::new(&BTreeMap::from([(name.to_owned(), config)]), store.clone())
            .unwrap_err()
    };
    assert!(one("inbox", tool(ExecutionType::External, false, None)).contains("`inbox`"));
    let bad_schema = ExternalToolConfig {
        input_schema: Some(json!("object")),
        ..tool(ExecutionType::External, false, None)
    };
    assert!(one("t", bad_schema).contains("`inputSchema` must be a JSON Schema object"));
    assert!(one("t", tool(ExecutionType::External, false, Some(0))).contains("`timeout`"));
    let never_waits =
        ExternalToolConfig { call_ttl: Some(0), ..tool(ExecutionType::External, true, None) };
    assert_eq!(
        one("job", never_waits),
        "`job`: `callTtl`: 0 would expire every call at once; give milliseconds (by default \
         `defaults.externalCallTtl`, an hour)"
    );
}

/// A tool's `callTtl` goes with each of its calls: `external__pending` lists it, and the
/// call expires after it (the store's time being an hour), a late result being refused
/// saying so.
#[tokio::test(start_paused = true)]
async fn a_tool_s_call_ttl_is_its_calls_time_to_live() {
    let mut tools = BTreeMap::new();
    let brief =
        ExternalToolConfig { call_ttl: Some(2_000), ..tool(ExecutionType::External, true, None) };
    tools.insert("brief".to_owned(), brief);
    tools.insert("job".to_owned(), tool(ExecutionType::External, true, None));
    let p = ExternalProvider::new(&tools, Arc::new(MemoryPendingStore::default())).unwrap();
    for name in ["brief", "job"] {
        p.call(name, json!({}), &run("r")).await.unwrap();
    }
    let listed = p.call("pending", json!({}), &run("worker")).await.unwrap();
    let calls = json_of(&listed)["calls"].as_array().unwrap().clone();
    let of = |tool: &str| calls.iter().find(|c| c["tool"] == tool).unwrap().clone();
    let (brief, job) = (of("external__brief"), of("external__job"));
    assert_eq!(brief["ttlMs"], 2_000, "{brief}");
    assert!(job.get("ttlMs").is_none(), "{job}");
    let lives = |c: &Value| c["expiresMs"].as_u64().unwrap() - c["createdMs"].as_u64().unwrap();
    assert!((1_900..=2_100).contains(&lives(&brief)), "{brief}");
    assert!(lives(&job) > 3_000_000, "{job}");
    tokio::time::advance(Duration::from_secs(3)).await;
    let refused = submit(&p, brief["callId"].as_str().unwrap(), json!("late")).await.unwrap_err();
    assert!(refused.to_string().contains("expired after 2 s"), "{refused}");
    submit(&p, job["callId"].as_str().unwrap(), json!("in time")).await.unwrap();
}

#[tokio::test]
async fn the_provider_passes_the_conformance_suite() {
    let p = provider();
    // Someone answers every call of `confirm` (the long poll waits while there is none).
    let worker = {
        let p = p.clone();
        tokio::spawn(async move {
            loop {
                let polled = p
                    .call(
                        "pending",
                        json!({"waitMs": 5000, "tools": ["external__confirm"]}),
                        &run("w"),
                    )
                    .await
                    .expect("pending");
                let calls = json_of(&polled)["calls"].clone();
                for call in calls.as_array().into_iter().flatten() {
                    if let Some(id) = call["callId"].as_str() {
                        let _ = submit(&p, id, json!("done")).await;
                    }
                }
            }
        })
    };
    Conformance::new()
        .with_sample(SampleCall::new("chart", json!({"q": "x"})).expect_text_contains("success"))
        .with_sample(SampleCall::new("confirm", json!({"q": "x"})).expect_text_contains("done"))
        .with_sample(SampleCall::new("job", json!({"q": "x"})).expect_text_contains("pending"))
        .with_sample(SampleCall::new("inbox", json!({})).expect_text_contains("results"))
        .with_sample(
            SampleCall::new("submit", json!({"callId": "nope", "result": 1})).expect_failure(),
        )
        .with_cancellable(SampleCall::new("never", json!({"q": "never answered"})))
        .check(&p)
        .await;
    worker.abort();
}

#[tokio::test]
async fn key_holders_see_and_answer_only_their_own_calls() {
    let p = provider();
    let made = p.call("job", json!({"q": "build"}), &run("key:alice/s1")).await.unwrap();
    let call_id = json_of(&made)["callId"].as_str().unwrap().to_owned();
    let pending_for = |who: &'static str, wait: u64| {
        let p = p.clone();
        async move {
            let out = p.call("pending", json!({"waitMs": wait}), &run(who)).await.unwrap();
            json_of(&out)["calls"].as_array().unwrap().clone()
        }
    };
    // Another holder waits its whole poll and sees nothing, nor may it answer.
    let started = tokio::time::Instant::now();
    assert!(pending_for("key:bob/s2", 300).await.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));
    let refused = p
        .call("submit", json!({"callId": call_id, "result": "hijacked"}), &run("key:bob/s2"))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("no pending call"), "{refused}");
    // The same holder's worker (another session) sees it and answers it; a caller without
    // a key (one tenant) sees every call.
    assert_eq!(pending_for("worker", 0).await.len(), 1);
    let mine = pending_for("key:alice/worker", 0).await;
    assert_eq!(mine[0]["callId"], json!(call_id));
    p.call("submit", json!({"callId": call_id, "result": "built"}), &run("key:alice/worker"))
        .await
        .unwrap();
    let inbox = p.call("inbox", json!({}), &run("key:alice/s1")).await.unwrap();
    assert_eq!(json_of(&inbox)["results"][0]["result"], json!("built"));
}

#[tokio::test(start_paused = true)]
async fn a_long_poll_leaving_out_seen_calls_waits_for_a_new_one() {
    let p = provider();
    p.call("job", json!({"q": "first"}), &run("agent")).await.unwrap();
    let first = next_pending(&p).await;
    let seen = json!([first["callId"].clone()]);
    // The seen call is still pending, yet the poll waits for another.
    let empty = p.call("pending", json!({"waitMs": 300, "exclude": seen}), &run("w")).await;
    assert_eq!(json_of(&empty.expect("pending"))["calls"], json!([]));
    let poll = {
        let p = p.clone();
        let seen = seen.clone();
        tokio::spawn(async move {
            let ctx = run("w");
            let out = p.call("pending", json!({"waitMs": 5000, "exclude": seen}), &ctx).await;
            json_of(&out.expect("pending"))["calls"].clone()
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.call("job", json!({"q": "second"}), &run("agent")).await.unwrap();
    let calls = poll.await.unwrap();
    assert_eq!(calls.as_array().map(Vec::len), Some(1), "{calls}");
    assert_eq!(calls[0]["arguments"]["q"], "second");
}

#[tokio::test]
async fn a_submission_naming_another_run_is_refused_and_the_call_stays_pending() {
    let p = provider();
    p.call("job", json!({}), &run("agent-1")).await.unwrap();
    let call = next_pending(&p).await;
    let id = call["callId"].as_str().unwrap().to_owned();
    let wrong = json!({"callId": id, "result": "done", "runId": "agent-2"});
    let refused = p.call("submit", wrong, &run("w")).await.unwrap_err();
    assert!(refused.report().contains("in run `agent-2`"), "{}", refused.report());
    assert_eq!(next_pending(&p).await["callId"], id.as_str());
    let right = json!({"callId": id, "result": "done", "runId": "agent-1"});
    p.call("submit", right, &run("w")).await.unwrap();
    let inbox = p.call("inbox", json!({}), &run("agent-1")).await.unwrap();
    assert_eq!(json_of(&inbox)["results"][0]["result"], "done");
}

fn async_call(tool: &str) -> toolmux_external::PendingCall {
    toolmux_external::PendingCall {
        call_id: String::new(),
        tool: tool.to_owned(),
        arguments: json!({}),
        run_id: "r".into(),
        owner: None,
        execution_type: ExecutionType::External,
        is_async: true,
        visible: true,
        created_ms: 0,
        status: Default::default(),
        expires_ms: 0,
        ttl_ms: None,
    }
}

#[tokio::test(start_paused = true)]
async fn unanswered_calls_expire_and_a_late_result_says_so() {
    let store = MemoryPendingStore::default();
    let old = store.open(async_call("external__job")).await.unwrap();
    tokio::time::advance(toolmux_external::DEFAULT_PENDING_TTL - Duration::from_secs(1)).await;
    let young = store.open(async_call("external__job")).await.unwrap();
    assert_eq!(store.count_pending("r", None).await.unwrap(), 2);
    tokio::time::advance(Duration::from_secs(2)).await;
    let listed = store.pending(&[], Duration::ZERO).await;
    assert_eq!(listed.iter().map(|c| c.call_id.as_str()).collect::<Vec<_>>(), [young.as_str()]);
    assert_eq!(store.count_pending("r", None).await.unwrap(), 1);
    let result = toolmux_external::ExternalResult { result: json!("late"), is_error: false };
    let refused = store.resolve(&old, result.clone()).await.unwrap_err();
    assert!(matches!(refused, ToolError::Gone { .. }), "{refused:?}");
    let message = refused.to_string();
    assert!(message.contains(&format!("call `{old}` expired after 3600 s")), "{message}");
    store.resolve(&young, result).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn unread_results_expire() {
    let store =
        MemoryPendingStore::default().with_ttl(Duration::from_secs(60), Duration::from_secs(120));
    let result = || toolmux_external::ExternalResult { result: json!(1), is_error: false };
    let first = store.open(async_call("external__job")).await.unwrap();
    store.resolve(&first, result()).await.unwrap();
    tokio::time::advance(Duration::from_secs(100)).await;
    let second = store.open(async_call("external__job")).await.unwrap();
    store.resolve(&second, result()).await.unwrap();
    tokio::time::advance(Duration::from_secs(30)).await;
    let inbox = store.take_inbox("r", None).await.unwrap();
    assert_eq!(inbox.iter().map(|e| e.call_id.as_str()).collect::<Vec<_>>(), [second.as_str()]);
}

#[tokio::test(start_paused = true)]
async fn expired_calls_make_room_in_a_full_store() {
    let store =
        MemoryPendingStore::new(2, 10).with_ttl(Duration::from_secs(60), Duration::from_secs(60));
    store.open(async_call("external__a")).await.unwrap();
    store.open(async_call("external__b")).await.unwrap();
    let full = store.open(async_call("external__c")).await.unwrap_err();
    assert!(matches!(full, ToolError::QueueBusy { .. }), "{full:?}");
    tokio::time::advance(Duration::from_secs(61)).await;
    store.open(async_call("external__c")).await.unwrap();
    store.open(async_call("external__d")).await.unwrap();
    let tools: Vec<String> =
        store.pending(&[], Duration::ZERO).await.into_iter().map(|c| c.tool).collect();
    assert_eq!(tools, ["external__c", "external__d"]);
}

/// The delegate of the tools with `execution.url`: records each call it gets and answers
/// with its name and arguments, under a schema of its own that must not be listed.
#[derive(Debug, Default)]
struct HttpDouble {
    calls: std::sync::Mutex<Vec<(String, Value)>>,
}

#[async_trait::async_trait]
impl ToolProvider for HttpDouble {
    fn kind(&self) -> toolmux_core::ToolKind {
        toolmux_core::ToolKind::Rest
    }

    fn namespace(&self) -> &str {
        "external"
    }

    async fn list_tools(&self) -> Result<Vec<toolmux_core::ToolSpec>, ToolError> {
        Ok(vec![toolmux_core::ToolSpec::new(
            "fetchWeather",
            "delegate's",
            json!({"type": "object"}),
        )])
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        _ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        self.calls.lock().expect("not poisoned").push((name.to_owned(), arguments.clone()));
        Ok(ToolOutput::json(json!({"answered": name, "args": arguments}))
            .with_extra("status", json!(200)))
    }
}

fn with_url(execution_type: ExecutionType, url: Option<&str>) -> ExternalToolConfig {
    let execution = Execution { url: url.map(str::to_owned), ..Execution::default() };
    ExternalToolConfig { execution: Some(execution), ..tool(execution_type, false, None) }
}

/// The seeds' `fetchWeather` example, as JSON: `executionType: gateway` with `execution`.
#[test]
fn the_seeds_gateway_tool_parses() {
    let config: ExternalToolConfig = serde_json::from_value(json!({
        "description": "The weather now",
        "executionType": "gateway",
        "visible": true,
        "execution": {"url": "https://api.weather.com/current", "method": "GET",
                      "headers": {"X-Key": "k"}}
    }))
    .unwrap();
    assert_eq!(config.execution_type, ExecutionType::Gateway);
    assert_eq!(config.url(), Some("https://api.weather.com/current"));
    let execution = config.execution.unwrap();
    assert_eq!(execution.method.as_deref(), Some("GET"));
    assert_eq!(execution.headers["X-Key"], "k");
}

/// A tool with `execution.url` (`gateway`, or another type but `internal`) is listed as
/// configured and its calls go to the delegate by the same name, with the `visible` extra
/// added; nothing waits in the store, not even for a tool saying `isAsync: true` (the URL
/// comes first, as in the seeds' decision flow).
#[tokio::test]
async fn url_tools_are_handed_to_the_http_delegate() {
    let http = Arc::new(HttpDouble::default());
    let store = Arc::new(MemoryPendingStore::default());
    let quiet = ExternalToolConfig {
        visible: Some(false),
        is_async: true,
        ..with_url(ExecutionType::Space, Some("http://127.0.0.1:9/x"))
    };
    let tools = BTreeMap::from([
        ("fetchWeather".to_owned(), with_url(ExecutionType::Gateway, Some("http://127.0.0.1:9/w"))),
        ("quiet".to_owned(), quiet),
        ("chart".to_owned(), tool(ExecutionType::Internal, false, None)),
    ]);
    let p = ExternalProvider::new(&tools, store.clone()).unwrap().with_http(http.clone());
    let listed = p.list_tools().await.unwrap();
    let weather = listed.iter().find(|t| t.name == "fetchWeather").unwrap();
    assert_eq!(weather.description, "d");
    assert_eq!(weather.input_schema["properties"]["q"]["type"], "string");
    assert!(weather.annotations.shown);

    let out = p.call("fetchWeather", json!({"q": "Paris"}), &run("r")).await.unwrap();
    assert_eq!(json_of(&out), json!({"answered": "fetchWeather", "args": {"q": "Paris"}}));
    assert_eq!(out.extras["visible"], json!(true));
    assert_eq!(out.extras["status"], json!(200));
    let out = p.call("quiet", json!({}), &run("r")).await.unwrap();
    assert_eq!(out.extras["visible"], json!(false));
    // Internal tools still answer themselves.
    let out = p.call("chart", json!({"q": "x"}), &run("r")).await.unwrap();
    assert_eq!(json_of(&out), json!({"success": true, "args": {"q": "x"}}));

    let calls = http.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![("fetchWeather".to_owned(), json!({"q": "Paris"})), ("quiet".to_owned(), json!({}))]
    );
    assert_eq!(store.count_pending("r", None).await.unwrap(), 0);
}

/// Without a delegate a URL tool fails, saying so, rather than waiting for a submission.
#[tokio::test]
async fn a_url_tool_without_a_delegate_fails() {
    let tools = BTreeMap::from([(
        "fetchWeather".to_owned(),
        with_url(ExecutionType::Gateway, Some("http://127.0.0.1:9/w")),
    )]);
    let p = ExternalProvider::new(&tools, Arc::new(MemoryPendingStore::default())).unwrap();
    let error = p.call("fetchWeather", json!({}), &run("r")).await.unwrap_err();
    assert!(matches!(error, ToolError::Unavailable { .. }), "{error:?}");
    assert!(error.to_string().contains("`external__fetchWeather` makes an HTTP request"));
}

/// An `execution` that does not fit the tool is refused, naming the tool and the fix.
#[test]
fn execution_mistakes_name_the_tool() {
    let store: Arc<dyn PendingStore> = Arc::new(MemoryPendingStore::default());
    let one = |name: &str, config: ExternalToolConfig| {
        ExternalProvider::new(&BTreeMap::from([(name.to_owned(), config)]), store.clone())
            .unwrap_err()
    };
    let no_execution = tool(ExecutionType::Gateway, false, None);
    assert_eq!(
        one("weather", no_execution),
        "`weather`: `executionType: gateway` makes an HTTP request; add `execution.url`"
    );
    assert_eq!(
        one("weather", with_url(ExecutionType::Gateway, None)),
        "`weather`: `executionType: gateway` makes an HTTP request; add `execution.url`"
    );
    let internal = with_url(ExecutionType::Internal, Some("http://127.0.0.1:9/c"));
    assert_eq!(
        one("chart", internal),
        "`chart`: an `internal` tool executes nothing; remove `execution` or choose \
         `executionType: gateway`"
    );
    assert_eq!(
        one("job", with_url(ExecutionType::External, None)),
        "`job`: `execution` needs a `url`"
    );
}

/// Each synchronous tool, and the long poll of `pending`, says how long it waits, so the
/// pipeline waits that long whatever `toolTimeout` and other settings of the tool say; the
/// asynchronous and internal ones answer at once.
#[tokio::test]
async fn waiting_tools_declare_their_wait_as_their_time_limit() {
    let tools = provider().list_tools().await.expect("tools");
    let limit = |name: &str| tools.iter().find(|t| t.name == name).expect(name).time_limit;
    let second = Duration::from_secs(1);
    assert_eq!(limit("quick"), Some(Duration::from_millis(100) + second));
    assert_eq!(limit("confirm"), Some(Duration::from_secs(5) + second));
    assert_eq!(limit("never"), Some(Duration::from_secs(60) + second));
    assert_eq!(limit("pending"), Some(toolmux_external::MAX_POLL + second));
    assert_eq!((limit("job"), limit("chart"), limit("submit")), (None, None, None));
}

/// A run's inbox is read per agent: a sub-agent shares its caller's run, and each takes
/// only the results of the calls it made; a reader that is no agent takes all.
#[tokio::test]
async fn each_agent_takes_its_own_results_from_the_run_s_inbox() {
    let store = MemoryPendingStore::default();
    let of = |owner: &str| toolmux_external::PendingCall {
        owner: Some(owner.to_owned()),
        ..async_call("external__job")
    };
    let result =
        |text: &str| toolmux_external::ExternalResult { result: json!(text), is_error: false };
    let lead = store.open(of("agent:lead")).await.unwrap();
    let worker = store.open(of("agent:worker")).await.unwrap();
    assert_eq!(store.count_pending("r", Some("agent:lead")).await.unwrap(), 1);
    assert_eq!(store.count_pending("r", None).await.unwrap(), 2);
    store.resolve(&lead, result("deployed")).await.unwrap();
    store.resolve(&worker, result("checked")).await.unwrap();
    let taken = store.take_inbox("r", Some("agent:worker")).await.unwrap();
    assert_eq!(taken.iter().map(|e| e.call_id.as_str()).collect::<Vec<_>>(), [worker.as_str()]);
    assert!(store.take_inbox("r", Some("agent:worker")).await.unwrap().is_empty());
    // A call no agent made (the program's own) is any agent's to take.
    let unowned = store.open(async_call("external__job")).await.unwrap();
    assert_eq!(store.count_pending("r", Some("agent:worker")).await.unwrap(), 1);
    store.resolve(&unowned, result("for anyone")).await.unwrap();
    let taken = store.take_inbox("r", Some("agent:lead")).await.unwrap();
    let ids: Vec<&str> = taken.iter().map(|e| e.call_id.as_str()).collect();
    assert_eq!(ids, [lead.as_str(), unowned.as_str()]);
    assert!(store.take_inbox("r", None).await.unwrap().is_empty());
}

/// A result for an expired call submitted with its `runId` (as the HTTP API submits) or by
/// an API key's holder, whose submissions are checked against the calls listed first, is
/// refused saying that the call expired, as it is without: not as an unknown call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_for_an_expired_call_of_a_named_run_says_it_expired() {
    let ttl = Duration::from_millis(200);
    let dir = tempfile::tempdir().expect("tempdir");
    let stores: [Arc<dyn PendingStore>; 2] = [
        Arc::new(MemoryPendingStore::default().with_ttl(ttl, ttl * 10)),
        Arc::new(DirPendingStore::open(dir.path()).expect("open").with_ttl(ttl, ttl * 10)),
    ];
    for store in stores {
        let tools = BTreeMap::from([("job".to_owned(), tool(ExecutionType::External, true, None))]);
        let p = ExternalProvider::new(&tools, store).expect("valid");
        for by in ["agent-1", "key:alice/s1"] {
            let made = p.call("job", json!({}), &run(by)).await.expect("made");
            let id = json_of(&made)["callId"].as_str().expect("an id").to_owned();
            tokio::time::sleep(ttl + Duration::from_millis(100)).await;
            let late = json!({"callId": id, "result": "late", "runId": by});
            let refused = p.call("submit", late, &run(by)).await.expect_err("expired");
            assert!(refused.report().contains("expired after 0.2 s"), "{}", refused.report());
        }
        let never = json!({"callId": "ext-nothing-1", "result": "x", "runId": "agent-1"});
        let unknown = p.call("submit", never, &run("agent-1")).await.expect_err("unknown");
        assert!(unknown.report().contains("no pending call"), "{}", unknown.report());
    }
}

/// The handle of an asynchronous call is marked as one (the `pendingHandle` extra the
/// orchestrator passes past a spent context budget); a synchronous call's result shaped
/// like a handle is not, nor can a submitter mark it.
#[tokio::test]
async fn only_an_asynchronous_call_s_handle_is_marked_as_one() {
    let p = provider();
    let handle = p.call("job", json!({"q": "build"}), &run("agent")).await.unwrap();
    assert_eq!(json_of(&handle)["status"], "pending");
    assert_eq!(handle.extras.get("pendingHandle"), Some(&json!(true)), "{handle:?}");

    let p = provider();
    let caller = {
        let p = p.clone();
        tokio::spawn(async move { p.call("confirm", json!({}), &run("agent")).await })
    };
    let id = next_pending(&p).await["callId"].as_str().unwrap().to_owned();
    let look_alike = json!({"status": "pending", "callId": "ext-1", "pendingHandle": true});
    submit(&p, &id, look_alike.clone()).await.unwrap();
    let result = caller.await.unwrap().unwrap();
    assert_eq!(json_of(&result), look_alike);
    assert_eq!(result.extras.get("pendingHandle"), None, "{result:?}");
}

/// A synchronous call whose caller's deadline comes before its own timeout stops waiting
/// early enough to give up by itself, in a calls folder too: its caller gets the tool's own
/// message (the result goes to the inbox) and the call stays pending for a later result,
/// rather than the pipeline's cut, which withdraws the call. Five calls give up at once,
/// each taking the folder's lock in turn, as on a busy machine. The wait ended 10 ms before
/// the deadline, too little for that: most of the calls were cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_a_tight_caller_deadline_gives_up_by_itself_in_a_folder() {
    const N: usize = 5;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(DirPendingStore::open(dir.path()).unwrap());
    let mut tools = BTreeMap::new();
    tools.insert("never".to_owned(), tool(ExecutionType::External, false, Some(60_000)));
    let p = ExternalProvider::new(&tools, store).unwrap();
    let calls = (0..N).map(|n| {
        let p = p.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
            let ctx = run(&format!("agent-{n}")).with_deadline(deadline);
            // As the pipeline does: the call is cut (dropped) at its caller's deadline.
            tokio::time::timeout_at(deadline, p.call("never", json!({"q": "?"}), &ctx)).await
        })
    });
    let mut cut = 0;
    for call in calls.collect::<Vec<_>>() {
        match call.await.unwrap() {
            Ok(out) => {
                let out = out.expect("the call answers");
                assert!(out.is_error);
                let text = out.to_text();
                assert!(text.contains("no result for `external__never`"), "{text}");
                assert_eq!(out.extras["resultTo"], "inbox");
            }
            Err(_) => cut += 1,
        }
    }
    assert_eq!(cut, 0, "calls cut by their caller's deadline");
    // Still pending, each: a result submitted now goes to its run's inbox.
    let listed = p.call("pending", json!({}), &run("w")).await.unwrap();
    let listed = json_of(&listed)["calls"].as_array().unwrap().clone();
    assert_eq!(listed.len(), N);
    let first = listed[0]["callId"].as_str().unwrap();
    let said = submit(&p, first, json!("late")).await.unwrap().to_text();
    assert!(said.contains("inbox"), "{said}");
}

/// Another process keeping the calls folder locked holds a call neither past its caller's
/// deadline, which it fails by, saying which lock file is held, nor past its cancellation.
/// The opening waited for the lock up to 10 s whatever its caller's deadline or
/// cancellation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_calls_folder_holds_no_call_past_its_deadline_or_cancellation() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(DirPendingStore::open(dir.path()).unwrap());
    let mut tools = BTreeMap::new();
    tools.insert("never".to_owned(), tool(ExecutionType::External, false, Some(60_000)));
    tools.insert("job".to_owned(), tool(ExecutionType::External, true, None));
    let p = ExternalProvider::new(&tools, store).unwrap();
    let lock_file = dir.path().join(".lock");
    let lock =
        std::fs::File::options().create(true).truncate(false).write(true).open(&lock_file).unwrap();
    lock.lock().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    let ctx = run("agent").with_deadline(deadline);
    let called = tokio::time::timeout_at(deadline, p.call("never", json!({"q": "?"}), &ctx));
    let error = called.await.expect("the call ends by its caller's deadline").unwrap_err();
    let report = error.report();
    assert!(report.contains("stayed locked by another process"), "{report}");
    assert!(report.contains(&format!("`{}`", lock_file.display())), "{report}");
    let cancel = CancellationToken::new();
    let ctx = run("agent").with_cancel(cancel.clone());
    let caller = {
        let p = p.clone();
        tokio::spawn(async move { p.call("job", json!({"q": "?"}), &ctx).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    let called = tokio::time::timeout(Duration::from_secs(2), caller).await;
    let called = called.expect("a cancelled call ends at once").unwrap();
    assert!(matches!(called, Err(ToolError::Cancelled { .. })), "{called:?}");
    lock.unlock().unwrap();
}
