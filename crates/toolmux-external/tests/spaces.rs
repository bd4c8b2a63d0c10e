//! Spaces and the gateway's built-in tools: visible tools require a space and show their
//! calls there, agents keep their goals and active space from run to run, a folder is
//! shared by processes, and the gateway provider passes the conformance suite.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{CallContext, ContentPart, Op, ToolError, ToolOutput, ToolProvider};
use toolmux_external::{
    Delivery, DirPendingStore, ExecutionType, ExternalProvider, ExternalResult, ExternalToolConfig,
    GatewayProvider, InboxEntry, MemoryPendingStore, PendingCall, PendingStore, Spaces,
};
use toolmux_test_support::conformance::{Conformance, SampleCall};

fn json_of(output: &ToolOutput) -> Value {
    match &output.content[0] {
        ContentPart::Json { value } => value.clone(),
        ContentPart::Text { text } => serde_json::from_str(text).unwrap_or(json!(text)),
        other => panic!("unexpected part {other:?}"),
    }
}

/// A call made by agent `name` in run `run`.
fn agent(name: &str, run: &str) -> CallContext {
    let ctx = CallContext::new().with_run_id(run);
    let op = Op::new(format!("agent__{name}"), None);
    ctx.with_op(Op::new("gateway__x", Some(op)))
}

fn external(spaces: &Spaces) -> ExternalProvider {
    external_in(spaces, Arc::new(MemoryPendingStore::default()))
}

fn external_in(spaces: &Spaces, store: Arc<dyn PendingStore>) -> ExternalProvider {
    let mut tools = BTreeMap::new();
    let config = |execution_type, is_async, visible| ExternalToolConfig {
        description: "d".into(),
        execution_type,
        is_async,
        visible,
        ..ExternalToolConfig::default()
    };
    tools.insert("confirmAction".to_owned(), config(ExecutionType::Space, true, None));
    tools.insert("ask".to_owned(), config(ExecutionType::Space, false, None));
    tools.insert("displayChart".to_owned(), config(ExecutionType::Internal, false, Some(true)));
    tools.insert("lookup".to_owned(), config(ExecutionType::External, true, Some(false)));
    ExternalProvider::new(&tools, store).expect("valid").with_spaces(spaces.clone())
}

/// The status of the tool message of each call in space `space`, oldest first.
async fn tool_statuses(gateway: &GatewayProvider, space: &str) -> Vec<String> {
    let person = CallContext::new().with_run_id("ui");
    let read = json!({"space": space, "offset": 0});
    let page = gateway.call("read_messages", read, &person).await.expect("read");
    let messages = json_of(&page)["messages"].clone();
    let statuses = messages.as_array().expect("messages").iter();
    statuses.filter_map(|m| m["tool"]["status"].as_str().map(str::to_owned)).collect()
}

#[tokio::test]
async fn visible_tools_require_a_space_and_show_their_calls_there() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let ext = external(&spaces);
    let me = agent("booker", "r1");

    // Outside a space: the seeds' error, and no call is made.
    let refused = ext.call("confirmAction", json!({"q": "book?"}), &me).await.expect("output");
    assert!(refused.is_error);
    assert_eq!(
        refused.to_text(),
        "Tool \"external__confirmAction\" is visible but you are not in a space. Call \
         gateway__enter_space first."
    );
    let pending = ext.call("pending", json!({}), &me).await.expect("pending");
    assert_eq!(json_of(&pending)["calls"], json!([]));
    // A tool that is not visible needs no space.
    let quiet = ext.call("lookup", json!({}), &me).await.expect("lookup");
    assert!(!quiet.is_error, "{}", quiet.to_text());

    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    let chart = ext.call("displayChart", json!({"points": [1, 2]}), &me).await.expect("chart");
    assert_eq!(json_of(&chart)["success"], json!(true));
    let asked = ext.call("confirmAction", json!({"q": "book?"}), &me).await.expect("confirm");
    let call_id = json_of(&asked)["callId"].as_str().expect("call id").to_owned();

    // A person reads the space: the chart complete, the confirmation waiting.
    let person = CallContext::new().with_run_id("ui");
    let page =
        gateway.call("read_messages", json!({"space": "trip"}), &person).await.expect("read");
    let messages = json_of(&page)["messages"].clone();
    assert_eq!(messages[0]["tool"]["name"], "external__displayChart");
    // The name a user interface maps to its component, as configured.
    assert_eq!(messages[0]["tool"]["toolName"], "displayChart");
    assert_eq!(messages[1]["tool"]["toolName"], "confirmAction");
    assert_eq!(messages[0]["tool"]["status"], "complete");
    assert_eq!(messages[0]["tool"]["result"]["args"]["points"], json!([1, 2]));
    assert_eq!(messages[0]["author"], "agent:booker");
    assert_eq!(messages[1]["tool"]["status"], "requires_action");
    assert_eq!(messages[1]["tool"]["callId"], call_id.as_str());

    // The answer completes the message.
    ext.call("submit", json!({"callId": call_id, "result": {"confirmed": true}}), &person)
        .await
        .expect("submit");
    let page = gateway
        .call("read_messages", json!({"space": "trip", "offset": 1}), &person)
        .await
        .expect("read");
    let message = &json_of(&page)["messages"][0]["tool"];
    assert_eq!(message["status"], "complete");
    assert_eq!(message["result"], json!({"confirmed": true}));

    // Leaving the space makes visible tools refuse again.
    gateway.call("leave_space", json!({}), &me).await.expect("leave");
    let refused = ext.call("displayChart", json!({}), &me).await.expect("output");
    assert!(refused.is_error);
}

/// A visible tool's call shows in the space but wakes no other agent (the seeds: visible
/// tool results "cannot trigger agents"); what another says does.
#[tokio::test]
async fn visible_tool_calls_wake_no_listening_agent() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let ext = external(&spaces);
    let (a, b) = (agent("charter", "ra"), agent("listener", "rb"));
    for who in [&a, &b] {
        gateway.call("enter_space", json!({"space": "s1"}), who).await.expect("enter");
    }
    let unread = |who: CallContext| {
        let gateway = gateway.clone();
        async move {
            let out = gateway.call("wait", json!({"waitMs": 200}), &who).await.expect("wait");
            json_of(&out)["unread"].as_u64().expect("a count")
        }
    };
    assert_eq!(unread(b.clone()).await, 0);
    let chart = ext.call("displayChart", json!({"points": [1]}), &a).await.expect("chart");
    assert!(!chart.is_error, "{}", chart.to_text());
    assert_eq!(unread(b.clone()).await, 0, "a visible tool's call wakes nobody");
    gateway.call("send_message", json!({"text": "look at the chart"}), &a).await.expect("say");
    assert_eq!(unread(b).await, 1);
}

#[tokio::test]
async fn an_agent_keeps_its_space_goals_and_plans_from_run_to_run() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let first = agent("planner", "run-1");
    gateway.call("enter_space", json!({"space": "ops"}), &first).await.expect("enter");
    let set = gateway
        .call(
            "set_goals",
            json!({"goals": [{"text": "ship 1.0"}, {"text": "no regressions"}]}),
            &first,
        )
        .await
        .expect("goals");
    assert_eq!(json_of(&set)["goals"][1]["id"], "g2");
    gateway
        .call("set_plans", json!({"plans": [{"id": "release", "text": "tag, build, publish", "status": "active"}]}), &first)
        .await
        .expect("plans");

    // Someone speaks while the agent is away.
    let person = CallContext::new().with_run_id("ui");
    gateway
        .call("post", json!({"space": "ops", "author": "husam", "text": "go ahead"}), &person)
        .await
        .expect("post");

    // The next run of the same agent finds all of it.
    let second = agent("planner", "run-2");
    let context = json_of(&gateway.call("context", json!({}), &second).await.expect("context"));
    assert_eq!(context["activeSpace"], "ops");
    assert_eq!(context["unreadCount"], 1);
    assert_eq!(context["unread"][0]["text"], "go ahead");
    assert_eq!(context["unread"][0]["author"], "person:husam");
    assert_eq!(context["goals"][0]["text"], "ship 1.0");
    assert_eq!(context["plans"][0]["status"], "active");
    let plans = json_of(&gateway.call("get_plans", json!({}), &second).await.expect("plans"));
    assert_eq!(plans["plans"][0]["id"], "release");
    let deleted =
        gateway.call("delete_goals", json!({"ids": ["g1", "g7"]}), &second).await.expect("delete");
    let deleted = json_of(&deleted);
    assert_eq!(
        (deleted["deleted"].clone(), deleted["unknown"].clone()),
        (json!(["g1"]), json!(["g7"]))
    );

    // Another agent has none of it.
    let other = agent("reviewer", "run-2");
    let context = json_of(&gateway.call("context", json!({}), &other).await.expect("context"));
    assert_eq!(
        (context["activeSpace"].clone(), context["goals"].clone()),
        (Value::Null, json!([]))
    );
    let err =
        gateway.call("send_message", json!({"text": "hi"}), &other).await.expect_err("no space");
    assert!(err.to_string().contains("call `gateway__enter_space` first"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_is_shared_by_processes_and_loses_no_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Two stores on one folder stand for two processes.
    let one = Spaces::in_dir(dir.path()).expect("open");
    let two = Spaces::in_dir(dir.path()).expect("open");
    let (g1, g2) = (GatewayProvider::new(one.clone()), GatewayProvider::new(two.clone()));
    let a = agent("a", "r");
    let b = agent("b", "r");
    g1.call("enter_space", json!({"space": "shared"}), &a).await.expect("enter");
    g2.call("enter_space", json!({"space": "shared"}), &b).await.expect("enter");
    let say = |g: GatewayProvider, ctx: CallContext, who: &'static str| async move {
        for i in 0..25 {
            g.call("send_message", json!({"text": format!("{who} {i}")}), &ctx)
                .await
                .expect("send");
        }
    };
    // On two threads at once: only the lock file keeps the two stores from losing writes.
    let first = tokio::spawn(say(g1.clone(), a.clone(), "a"));
    let second = tokio::spawn(say(g2.clone(), b.clone(), "b"));
    first.await.expect("first");
    second.await.expect("second");
    let reader = CallContext::new().with_run_id("reader");
    let page = g1
        .call("read_messages", json!({"space": "shared", "limit": 200}), &reader)
        .await
        .expect("read");
    let page = json_of(&page);
    let messages = page["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 50);
    let indexes: Vec<u64> = messages.iter().filter_map(|m| m["index"].as_u64()).collect();
    assert_eq!(indexes, (0..50).collect::<Vec<_>>());
    // The second process sees the first one's agent state.
    let listed = json_of(&g2.call("spaces", json!({}), &reader).await.expect("spaces"));
    assert_eq!(listed["spaces"][0]["members"], json!(["agent:a", "agent:b"]));
    assert!(!dir.path().join("spaces").read_dir().expect("dir").any(|e| {
        e.map(|e| e.file_name().to_string_lossy().ends_with(".tmp")).unwrap_or(false)
    }));

    // A damaged file is named, with what to do.
    std::fs::write(dir.path().join("state.json"), b"{not json").expect("write");
    let err = g1.call("context", json!({}), &a).await.expect_err("damaged");
    assert!(
        err.to_string().contains("state.json") && err.to_string().contains("move it away"),
        "{err}"
    );
}

/// The seeds' tool objects repeat their name: accepted when it is the key.
#[test]
fn a_name_beside_the_key_must_be_the_key() {
    let tool: ExternalToolConfig = serde_json::from_value(json!({
        "name": "confirmAction", "description": "d", "executionType": "space", "visible": true,
        "isAsync": true
    }))
    .expect("the seeds' shape parses");
    let store = || Arc::new(MemoryPendingStore::default());
    let tools = BTreeMap::from([("confirmAction".to_owned(), tool.clone())]);
    assert!(ExternalProvider::new(&tools, store()).is_ok());
    let tools = BTreeMap::from([("confirm".to_owned(), tool)]);
    let err = ExternalProvider::new(&tools, store()).expect_err("names differ");
    assert!(err.contains("`name` says `confirmAction`"), "{err}");
}

#[tokio::test]
async fn bad_arguments_say_what_is_wrong() {
    let gateway = GatewayProvider::new(Spaces::in_memory());
    let me = agent("a", "r");
    let cases = [
        ("enter_space", json!({"space": "../etc"}), "is not a space name"),
        ("enter_space", json!({}), "`space` (a string) is required"),
        ("set_goals", json!({"goals": "ship"}), "must be a list"),
        ("set_goals", json!({"goals": []}), "is empty"),
        ("delete_plans", json!({}), "`ids`"),
        ("read_messages", json!({}), "you are not in a space"),
        ("read_messages", json!({"space": "nowhere"}), "there is no space `nowhere`"),
        ("post", json!({"space": "a b", "author": "x", "text": "hi"}), "is not a space name"),
        ("post", json!({"space": "a", "author": "", "text": "hi"}), "`author` must be"),
    ];
    for (tool, arguments, expected) in cases {
        let err = gateway.call(tool, arguments, &me).await.expect_err(tool);
        assert!(err.to_string().contains(expected), "{tool}: {err}");
    }
    let missing = gateway.call("read_messages", json!({"space": "nowhere"}), &me).await;
    let missing = missing.expect_err("no such space");
    assert!(matches!(missing, ToolError::NotFound { .. }), "the caller's, by type: {missing:?}");
    assert_eq!(missing.party(), toolmux_core::Party::Caller);
    gateway.call("enter_space", json!({"space": "s"}), &me).await.expect("enter");
    let long = "x".repeat(toolmux_external::spaces::MAX_MESSAGE_BYTES + 1);
    let err = gateway.call("send_message", json!({"text": long}), &me).await.expect_err("long");
    assert!(err.to_string().contains("split it"), "{err}");
}

#[tokio::test]
async fn the_gateway_passes_the_conformance_suite() {
    let gateway = GatewayProvider::new(Spaces::in_memory());
    Conformance::new()
        .with_sample(
            SampleCall::new("enter_space", json!({"space": "c"}))
                .expect_text_contains("\"created\""),
        )
        .with_sample(
            SampleCall::new("skip", json!({"reason": "idle"}))
                .expect_text_contains("skipped: idle"),
        )
        .with_sample(SampleCall::new("get_plans", json!({})).expect_text_contains("plans"))
        .with_sample(SampleCall::new("enter_space", json!({"space": "!"})).expect_failure())
        .check(&gateway)
        .await;
}

/// A user interface follows a space: each message as it is written, and a visible tool's
/// call again when it is answered; a wait ends as soon as something changes.
#[tokio::test]
async fn changes_come_in_revision_order_and_wake_a_waiting_poll() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let ext = external(&spaces);
    let me = agent("booker", "r1");
    let ui = CallContext::new().with_run_id("ui");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    let start = json_of(&gateway.call("changes", json!({"space": "trip"}), &ui).await.expect("v"));
    assert_eq!(start["messages"], json!([]));
    let since = start["version"].as_u64().expect("version");

    // A poll waiting for the next change is woken by it.
    let waiting = {
        let gateway = gateway.clone();
        let ui = ui.clone();
        tokio::spawn(async move {
            let args = json!({"space": "trip", "since": since, "waitMs": 10_000});
            json_of(&gateway.call("changes", args, &ui).await.expect("changes"))
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let asked = ext.call("ask", json!({"q": "ok?"}), &me);
    let answer = async {
        // Answer the call once it is pending.
        let call = loop {
            let out = ext.call("pending", json!({"waitMs": 5000}), &ui).await.expect("pending");
            if let Some(id) = json_of(&out)["calls"][0]["callId"].as_str() {
                break id.to_owned();
            }
        };
        ext.call("submit", json!({"callId": call, "result": "yes"}), &ui).await.expect("submit");
    };
    let (asked, ()) = tokio::join!(asked, answer);
    assert_eq!(asked.expect("asked").to_text(), "yes");
    let first = waiting.await.expect("the poll");
    assert!(started.elapsed() < Duration::from_secs(5), "woken, not timed out");
    assert_eq!(first["messages"][0]["tool"]["name"], "external__ask");

    // From the start: the call once as written and once as answered, in revision order.
    let all = gateway.call("changes", json!({"space": "trip", "since": since}), &ui).await;
    let all = json_of(&all.expect("changes"));
    let statuses: Vec<&str> = all["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["tool"]["status"].as_str())
        .collect();
    // The message changed after it was written: it comes once, as it is now.
    assert_eq!(statuses, ["complete"], "{all}");
    let rev = all["version"].as_u64().expect("version");
    assert!(rev > since + 1, "written and changed: two revisions ({since} → {rev})");
    let none = gateway.call("changes", json!({"space": "trip", "since": rev}), &ui).await;
    assert_eq!(json_of(&none.expect("changes"))["messages"], json!([]));
}

/// In a folder, a change made by another process (another store on the same folder)
/// reaches a waiting poll too.
#[tokio::test]
async fn a_waiting_poll_sees_another_processs_change_in_a_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reader = GatewayProvider::new(Spaces::in_dir(dir.path()).expect("open"));
    let writer = GatewayProvider::new(Spaces::in_dir(dir.path()).expect("open"));
    let me = agent("a", "r");
    writer.call("enter_space", json!({"space": "s"}), &me).await.expect("enter");
    let ui = CallContext::new().with_run_id("ui");
    let start = json_of(&reader.call("changes", json!({"space": "s"}), &ui).await.expect("v"));
    let since = start["version"].as_u64().expect("version");
    let waiting = tokio::spawn(async move {
        let args = json!({"space": "s", "since": since, "waitMs": 10_000});
        json_of(&reader.call("changes", args, &ui).await.expect("changes"))
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    writer.call("send_message", json!({"text": "from elsewhere"}), &me).await.expect("send");
    let got = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("within the folder's poll")
        .expect("the poll");
    assert_eq!(got["messages"][0]["text"], "from elsewhere");
}

/// A change given up by its caller while it waits for the folder's lock (the call was
/// cancelled or timed out) is not made once the lock is free: the message is not posted
/// behind the caller's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_given_up_while_the_folder_is_locked_is_not_made() {
    let dir = tempfile::tempdir().expect("dir");
    let g = GatewayProvider::new(Spaces::in_dir(dir.path()).expect("open"));
    let me = agent("a", "r");
    g.call("enter_space", json!({"space": "s"}), &me).await.expect("enter");
    let lock =
        std::fs::File::options().write(true).open(dir.path().join(".lock")).expect("lock file");
    lock.lock().expect("locked by another process");
    let said = g.call("send_message", json!({"text": "never"}), &me);
    assert!(tokio::time::timeout(Duration::from_millis(200), said).await.is_err(), "waits");
    lock.unlock().expect("unlocked");
    // Time for the abandoned change to take the lock and give up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    g.call("send_message", json!({"text": "later"}), &me).await.expect("send");
    let ui = CallContext::new().with_run_id("ui");
    let page = json_of(
        &g.call("read_messages", json!({"space": "s", "offset": 0}), &ui).await.expect("read"),
    );
    let texts: Vec<&str> = page["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(texts, ["later"]);
}

/// A call answered before its space message was posted does not leave the message waiting
/// for an answer (`requires_action`) forever.
#[tokio::test]
async fn a_call_answered_before_its_message_is_posted_is_not_left_waiting() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let mut tools = BTreeMap::new();
    let config = |is_async| ExternalToolConfig {
        description: "d".into(),
        execution_type: ExecutionType::Space,
        is_async,
        ..ExternalToolConfig::default()
    };
    tools.insert("ask".to_owned(), config(false));
    tools.insert("confirmAction".to_owned(), config(true));
    let ext = ExternalProvider::new(&tools, Arc::new(OnOpen::answering()))
        .expect("valid")
        .with_spaces(spaces.clone());
    let me = agent("booker", "r1");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    let asked = ext.call("ask", json!({"q": "book?"}), &me).await.expect("ask");
    assert_eq!(json_of(&asked), json!({"confirmed": true}));
    ext.call("confirmAction", json!({"q": "pay?"}), &me).await.expect("confirm");
    let person = CallContext::new().with_run_id("ui");
    let page =
        gateway.call("read_messages", json!({"space": "trip"}), &person).await.expect("read");
    let messages = json_of(&page)["messages"].clone();
    assert_eq!(messages[0]["tool"]["status"], "complete", "{messages}");
    assert_eq!(messages[0]["tool"]["result"], json!({"confirmed": true}), "{messages}");
    assert_eq!(messages[1]["tool"]["status"], "complete", "{messages}");
}

/// A spaces folder removed under a running process (a cleaner of temporary files) is made
/// again at the next change: the spaces start anew instead of every call failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_spaces_folder_is_made_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let at = dir.path().join("spaces-here");
    let g = GatewayProvider::new(Spaces::in_dir(&at).expect("open"));
    let a = agent("a", "r");
    g.call("enter_space", json!({"space": "s"}), &a).await.expect("enter");
    std::fs::remove_dir_all(&at).expect("remove");
    g.call("enter_space", json!({"space": "s"}), &a).await.expect("enter again");
    g.call("send_message", json!({"text": "still here"}), &a).await.expect("send");
    assert!(at.join("spaces").is_dir());
}

/// A visible call whose caller is cancelled (the pipeline drops the call when its token
/// fires) or dropped while it waits has its message marked `cancelled`, not left waiting
/// for an answer (`requires_action`) forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_or_dropped_call_s_message_is_cancelled() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let ext = external(&spaces);
    let me = agent("booker", "r1");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    let cancel = tokio_util::sync::CancellationToken::new();
    let caller = {
        let (ext, ctx, cancel) =
            (ext.clone(), me.clone().with_cancel(cancel.clone()), cancel.clone());
        // As the orchestrator does: the call's future is dropped when the token fires.
        tokio::spawn(async move {
            tokio::select! {
                called = ext.call("ask", json!({"q": "book?"}), &ctx) => Some(called),
                () = cancel.cancelled() => None,
            }
        })
    };
    toolmux_test_support::eventually("the call is shown", || async {
        tool_statuses(&gateway, "trip").await == ["requires_action"]
    })
    .await;
    cancel.cancel();
    caller.await.expect("ended");
    let aborted = {
        let (ext, ctx) = (ext.clone(), me.clone());
        tokio::spawn(async move { ext.call("ask", json!({"q": "pay?"}), &ctx).await })
    };
    toolmux_test_support::eventually("the second call is shown", || async {
        tool_statuses(&gateway, "trip").await.len() == 2
    })
    .await;
    aborted.abort();
    toolmux_test_support::eventually("both messages are cancelled", || async {
        tool_statuses(&gateway, "trip").await == ["cancelled", "cancelled"]
    })
    .await;
    let listed = ext.call("pending", json!({}), &me).await.expect("pending");
    assert_eq!(json_of(&listed)["calls"], json!([]), "both withdrawn");
}

/// The message of a visible call that expired unanswered is marked `cancelled`: by the
/// provider's watch, and at once when a result submitted for it is refused as expired.
#[tokio::test(start_paused = true)]
async fn an_expired_call_s_message_is_cancelled() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let ttl = Duration::from_secs(1);
    let store = MemoryPendingStore::default().with_ttl(ttl, ttl);
    let ext = external_in(&spaces, Arc::new(store));
    let me = agent("booker", "r1");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    ext.call("confirmAction", json!({"q": "book?"}), &me).await.expect("confirm");
    assert_eq!(tool_statuses(&gateway, "trip").await, ["requires_action"]);
    // The watch looks every 10 s (the clock is paused: it runs at once).
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(tool_statuses(&gateway, "trip").await, ["cancelled"]);
}

/// In a folder shared by processes, a result submitted for an expired call is refused and
/// its message marked `cancelled` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_refused_as_expired_cancels_the_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spaces = Spaces::in_dir(dir.path().join("spaces")).expect("spaces");
    let gateway = GatewayProvider::new(spaces.clone());
    let ttl = Duration::from_millis(200);
    let store = DirPendingStore::open(dir.path().join("external")).expect("open");
    let ext = external_in(&spaces, Arc::new(store.with_ttl(ttl, ttl)));
    let me = agent("booker", "r1");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    let made = ext.call("confirmAction", json!({"q": "book?"}), &me).await.expect("confirm");
    let id = json_of(&made)["callId"].as_str().expect("an id").to_owned();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let late = json!({"callId": id, "result": {"confirmed": true}});
    let refused = ext.call("submit", late, &CallContext::new()).await.expect_err("expired");
    assert!(refused.report().contains("expired"), "{}", refused.report());
    assert_eq!(tool_statuses(&gateway, "trip").await, ["cancelled"]);
}

/// Makes the file of space `space` in spaces folder `dir` one nobody can read: every
/// change that reads the space fails, while the agents' state stays readable.
fn spoil_space(dir: &std::path::Path, space: &str) {
    std::fs::write(dir.join("spaces").join(format!("{space}.json")), b"{not json").expect("spoil");
}

/// Spaces in a folder, with an agent `booker` (run `r1`) in space `trip`: the folder, the
/// gateway, the external tools and the agent's context.
async fn booker_in_trip() -> (tempfile::TempDir, GatewayProvider, ExternalProvider, CallContext) {
    let dir = tempfile::tempdir().expect("tempdir");
    let spaces = Spaces::in_dir(dir.path()).expect("spaces");
    let gateway = GatewayProvider::new(spaces.clone());
    let ext = external(&spaces);
    let me = agent("booker", "r1");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    (dir, gateway, ext, me)
}

/// A visible call whose message cannot be posted (the space's file unreadable) fails, and
/// is not left pending: nobody may answer a call its caller was told failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_message_cannot_be_posted_is_not_left_pending() {
    let (dir, _gateway, ext, me) = booker_in_trip().await;
    spoil_space(dir.path(), "trip");
    let failed = ext.call("confirmAction", json!({"q": "book?"}), &me).await;
    assert!(failed.is_err(), "{failed:?}");
    let listed = ext.call("pending", json!({}), &me).await.expect("pending");
    assert_eq!(json_of(&listed)["calls"], json!([]), "withdrawn");
}

/// A result handed to its waiting call reaches the caller, and its submitter is told it
/// was delivered, even when the call's message cannot be finished (the space's file became
/// unreadable): the result is taken from the store, so failing there would lose it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_delivered_when_its_message_cannot_be_finished() {
    let (dir, gateway, ext, me) = booker_in_trip().await;
    let caller = {
        let (ext, me) = (ext.clone(), me.clone());
        tokio::spawn(async move { ext.call("ask", json!({"q": "pay?"}), &me).await })
    };
    toolmux_test_support::eventually("the call is shown", || async {
        tool_statuses(&gateway, "trip").await == ["requires_action"]
    })
    .await;
    let listed = ext.call("pending", json!({}), &me).await.expect("pending");
    let id = json_of(&listed)["calls"][0]["callId"].as_str().expect("a call").to_owned();
    spoil_space(dir.path(), "trip");
    let answer = json!({"callId": id, "result": {"paid": true}});
    let told = ext.call("submit", answer, &CallContext::new()).await.expect("delivered");
    assert_eq!(told.extras["delivered"], "call", "{}", told.to_text());
    let got = tokio::time::timeout(Duration::from_secs(20), caller)
        .await
        .expect("the call returns")
        .expect("ended")
        .expect("the result");
    assert!(!got.is_error, "{}", got.to_text());
    assert_eq!(json_of(&got), json!({"paid": true}));
}

/// `read_messages` from an offset past the last message reads nothing and leaves the
/// reader's unread messages as they were: the messages written after are still unread.
#[tokio::test]
async fn reading_past_the_end_marks_no_later_message_read() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let (a, b) = (agent("a", "r1"), agent("b", "r2"));
    gateway.call("enter_space", json!({"space": "lobby"}), &a).await.expect("enter");
    gateway.call("enter_space", json!({"space": "lobby"}), &b).await.expect("enter");
    gateway.call("send_message", json!({"text": "one"}), &a).await.expect("send");
    let past = gateway.call("read_messages", json!({"offset": 1000}), &b).await.expect("read");
    assert_eq!(json_of(&past)["messages"], json!([]));
    assert_eq!(json_of(&past)["next"], json!(1), "read on from the end");
    gateway.call("send_message", json!({"text": "two"}), &a).await.expect("send");
    let unread = gateway.call("read_messages", json!({}), &b).await.expect("read");
    let texts: Vec<Value> = json_of(&unread)["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["text"].clone())
        .collect();
    assert_eq!(texts, [json!("two")]);
}

/// Goals past the bound are refused and not kept, in memory as in a folder; a status is
/// bounded and redacted as the text is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_goals_are_not_kept() {
    use toolmux_external::spaces::{ItemInput, ItemKind, MAX_ITEM_BYTES, MAX_ITEMS, Who};
    let dir = tempfile::tempdir().expect("tempdir");
    let stores = [Spaces::in_memory(), Spaces::in_dir(dir.path()).expect("spaces")];
    for (spaces, kept_in) in stores.into_iter().zip(["memory", "a folder"]) {
        let spaces = spaces.with_redaction(|text| text.replace("s3cret", "[REDACTED]"));
        let who = Who { holder: None, entity: "agent:a".into() };
        let goal = |text: String| ItemInput { id: None, text, status: None };
        let full: Vec<ItemInput> = (0..MAX_ITEMS).map(|n| goal(format!("goal {n}"))).collect();
        spaces.set_items(&who, ItemKind::Goal, full, "t").await.expect("within the bound");
        let over = spaces.set_items(&who, ItemKind::Goal, vec![goal("one more".into())], "t").await;
        assert!(over.is_err(), "{over:?}");
        let held = spaces.items(&who, ItemKind::Goal).await.expect("goals");
        assert_eq!(held.len(), MAX_ITEMS, "in {kept_in}");

        let long = ItemInput { status: Some("x".repeat(MAX_ITEM_BYTES + 1)), ..goal("g".into()) };
        let refused = spaces.set_items(&who, ItemKind::Memory, vec![long], "t").await;
        assert!(refused.is_err(), "{refused:?}");
        let keyed = ItemInput { status: Some("blocked on s3cret".into()), ..goal("m".into()) };
        let kept = spaces.set_items(&who, ItemKind::Memory, vec![keyed], "t").await.expect("set");
        assert_eq!(kept[0].status.as_deref(), Some("blocked on [REDACTED]"));
    }
}

/// A memory store that runs `hook` each time a call has been opened: a test takes the
/// spaces' lock (or stops their storage) there, so that the call's message is being posted
/// when the test drops the call. With `answer`, each call is then answered at once: the
/// answer comes before the call's space message is posted, the race a quick responder
/// polling `external__pending` can win.
struct OnOpen {
    inner: MemoryPendingStore,
    hook: Box<dyn Fn() + Send + Sync>,
    answer: bool,
}

impl OnOpen {
    fn new(hook: impl Fn() + Send + Sync + 'static) -> OnOpen {
        OnOpen { inner: MemoryPendingStore::default(), hook: Box::new(hook), answer: false }
    }

    /// A store whose calls are answered the moment they are opened.
    fn answering() -> OnOpen {
        OnOpen { answer: true, ..OnOpen::new(|| {}) }
    }
}

impl std::fmt::Debug for OnOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnOpen").field("inner", &self.inner).finish()
    }
}

#[async_trait::async_trait]
impl PendingStore for OnOpen {
    async fn open(&self, call: PendingCall) -> Result<String, ToolError> {
        let id = self.inner.open(call).await?;
        (self.hook)();
        if self.answer {
            let answer = ExternalResult { result: json!({"confirmed": true}), is_error: false };
            self.inner.resolve(&id, answer).await?;
        }
        Ok(id)
    }
    async fn wait(&self, call_id: &str, timeout: Duration) -> Option<ExternalResult> {
        self.inner.wait(call_id, timeout).await
    }
    async fn withdraw(&self, call_id: &str) {
        self.inner.withdraw(call_id).await;
    }
    fn withdraw_now(&self, call_id: &str) -> bool {
        self.inner.withdraw_now(call_id)
    }
    async fn pending_except(
        &self,
        tools: &[String],
        exclude: &[String],
        wait: Duration,
    ) -> Result<Vec<PendingCall>, ToolError> {
        self.inner.pending_except(tools, exclude, wait).await
    }
    async fn resolve(&self, call_id: &str, result: ExternalResult) -> Result<Delivery, ToolError> {
        self.inner.resolve(call_id, result).await
    }
    async fn take_inbox(
        &self,
        run_id: &str,
        owner: Option<&str>,
    ) -> Result<Vec<InboxEntry>, ToolError> {
        self.inner.take_inbox(run_id, owner).await
    }
    async fn count_pending(&self, run_id: &str, owner: Option<&str>) -> Result<usize, ToolError> {
        self.inner.count_pending(run_id, owner).await
    }
}

/// Drops a synchronous call of `ask` by `me` once `opened` says it was opened (its message
/// is then being posted), and checks that the call was withdrawn: nothing pending, a
/// result submitted for it refused (it reached the run's inbox), nothing in the inbox,
/// and no message waiting for an answer in space `trip`, once `release` let the posting
/// go on.
async fn drop_while_posting(
    ext: &ExternalProvider,
    gateway: &GatewayProvider,
    me: &CallContext,
    opened: &tokio::sync::Notify,
    release: impl FnOnce(),
) {
    let notified = opened.notified();
    let caller = {
        let (ext, me) = (ext.clone(), me.clone());
        tokio::spawn(async move { ext.call("ask", json!({"q": "book?"}), &me).await })
    };
    tokio::time::timeout(Duration::from_secs(10), notified).await.expect("the call is opened");
    let listed = ext.call("pending", json!({}), me).await.expect("pending");
    let id = json_of(&listed)["calls"][0]["callId"].as_str().expect("opened").to_owned();
    // The posting waits (for the lock, or for the storage).
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!caller.is_finished(), "the message is being posted");
    caller.abort();
    let _ = caller.await;
    release();
    // Time for a posting that went on to end, and for the drop's own task.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listed = ext.call("pending", json!({}), me).await.expect("pending");
    assert_eq!(json_of(&listed)["calls"], json!([]), "the dropped call is withdrawn");
    let late = json!({"callId": id, "result": {"confirmed": true}});
    let refused = ext.call("submit", late, &CallContext::new()).await;
    assert!(refused.is_err(), "a result for a dropped call is refused: {refused:?}");
    let inbox = ext.call("inbox", json!({}), me).await.expect("inbox");
    assert_eq!(json_of(&inbox)["results"], json!([]));
    let statuses = tool_statuses(gateway, "trip").await;
    assert!(!statuses.iter().any(|s| s == "requires_action"), "{statuses:?}");
}

/// A synchronous visible call dropped (Ctrl-C, the orchestrator's timeout) while its
/// message waits for the spaces folder's lock is withdrawn: its result no longer reaches
/// the run's inbox, and its message is never posted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_while_its_message_waits_for_the_folder_is_withdrawn() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spaces = Spaces::in_dir(dir.path()).expect("spaces");
    let gateway = GatewayProvider::new(spaces.clone());
    let me = agent("booker", "r1");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    let lock_at = dir.path().join(".lock");
    let lock = Arc::new(std::fs::File::options().write(true).open(&lock_at).expect("lock file"));
    let opened = Arc::new(tokio::sync::Notify::new());
    let (held, told) = (lock.clone(), opened.clone());
    // Another process takes the folder's lock between the opening and the posting.
    let store = OnOpen::new(move || {
        held.lock().expect("locked by another process");
        told.notify_one();
    });
    let ext = external_in(&spaces, Arc::new(store));
    drop_while_posting(&ext, &gateway, &me, &opened, || lock.unlock().expect("unlocked")).await;
    assert_eq!(tool_statuses(&gateway, "trip").await, Vec::<String>::new(), "never posted");
}

/// Spaces in a shared storage whose reads wait while `open` is false: a change under way
/// when its caller is dropped goes on in its own task once they may.
#[derive(Debug)]
struct StalledStorage {
    open: tokio::sync::watch::Sender<bool>,
    kept: std::sync::Mutex<BTreeMap<String, Vec<u8>>>,
}

#[async_trait::async_trait]
impl toolmux_external::spaces::SpaceStorage for StalledStorage {
    async fn lock(&self) -> Result<String, ToolError> {
        Ok("token".into())
    }
    async fn unlock(&self, _token: &str) {}
    async fn read(&self, _token: &str, key: &str) -> Result<Option<Vec<u8>>, ToolError> {
        let mut open = self.open.subscribe();
        let _ = open.wait_for(|open| *open).await;
        Ok(self.kept.lock().expect("kept").get(key).cloned())
    }
    async fn commit(&self, _token: &str, writes: &[(String, Vec<u8>)]) -> Result<(), ToolError> {
        self.kept.lock().expect("kept").extend(writes.iter().cloned());
        Ok(())
    }
    async fn space_names(&self) -> Result<Vec<String>, ToolError> {
        let kept = self.kept.lock().expect("kept");
        Ok(kept.keys().filter_map(|k| k.strip_prefix("space:")).map(str::to_owned).collect())
    }
}

/// A synchronous visible call dropped while its message is being written to shared spaces
/// (the change has the lock and goes on in a task of its own) is withdrawn, and the
/// message the change was writing is not posted for a call nobody makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_while_its_message_is_written_is_withdrawn() {
    let storage = Arc::new(StalledStorage {
        open: tokio::sync::watch::channel(true).0,
        kept: Default::default(),
    });
    let spaces = Spaces::in_storage(storage.clone());
    let gateway = GatewayProvider::new(spaces.clone());
    let me = agent("booker", "r1");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    let opened = Arc::new(tokio::sync::Notify::new());
    let (stalled, told) = (storage.clone(), opened.clone());
    let store = OnOpen::new(move || {
        stalled.open.send_replace(false);
        told.notify_one();
    });
    let ext = external_in(&spaces, Arc::new(store));
    drop_while_posting(&ext, &gateway, &me, &opened, || {
        storage.open.send_replace(true);
    })
    .await;
    assert_eq!(tool_statuses(&gateway, "trip").await, Vec::<String>::new(), "never posted");
}

/// A spaces folder written by the version before calls were kept in order (`toolCalls`
/// maps each call to its space, nothing more) still loads: its waiting calls are known
/// and answered, and a call posted now is added in a form that version reads too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_written_before_calls_were_ordered_still_loads() {
    use toolmux_external::spaces::{ToolMessage, ToolStatus, Who};
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("spaces")).expect("spaces folder");
    std::fs::write(
        dir.path().join("state.json"),
        r#"{"entities":{"agent:booker":{"activeSpace":"trip","read":{"trip":2},"nextId":0}},"toolCalls":{"ext-old-b":"trip","ext-old-a":"trip"}}"#,
    )
    .expect("old state");
    let message = |index: u64, id: &str| {
        json!({"index": index, "author": "agent:booker", "atMs": 1, "rev": index + 1,
               "tool": {"name": "external__ask", "toolName": "ask", "arguments": {},
                        "status": "requires_action", "callId": id}})
    };
    let space = json!({"first": 0, "messages": [message(0, "ext-old-b"), message(1, "ext-old-a")],
                       "members": ["agent:booker"], "createdMs": 1, "version": 2});
    std::fs::write(dir.path().join("spaces").join("trip.json"), space.to_string())
        .expect("old space");
    let spaces = Spaces::in_dir(dir.path()).expect("spaces");
    let gateway = GatewayProvider::new(spaces.clone());
    let waiting = spaces.waiting_tool_calls().await.expect("loads");
    assert_eq!(waiting, ["ext-old-a", "ext-old-b"]);
    let done = spaces.finish_tool("ext-old-b", ToolStatus::Complete, Some(json!("yes")));
    assert!(done.await.expect("finish"), "the old call is answered");
    assert_eq!(tool_statuses(&gateway, "trip").await, ["complete", "requires_action"]);
    // Messages stored before their posting was dated: the call still waiting counts as
    // started since, the one answered as ended.
    let (events, _) = space_events(&gateway, "trip", 0).await;
    assert_eq!(events, ["message 1", "tool.started 1", "message 0", "tool.done 0"]);
    let booker = Who { holder: None, entity: "agent:booker".into() };
    let call = ToolMessage {
        name: "external__ask".into(),
        tool_name: "ask".into(),
        arguments: json!({}),
        status: ToolStatus::RequiresAction,
        result: None,
        call_id: Some("ext-new".into()),
    };
    spaces.post_tool(&booker, call).await.expect("post").expect("in trip");
    let written: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("state.json")).expect("state written"),
    )
    .expect("json");
    // The calls' spaces as the old version wrote them, their order beside.
    assert_eq!(written["toolCalls"], json!({"ext-old-a": "trip", "ext-new": "trip"}));
    assert_eq!(written["toolCallOrder"], json!({"ext-new": 1}));
}

/// Past the bound on spaces, a new one is refused (entering it, or a message that makes
/// it), saying which bound and what to do, in memory, in a folder (where the bound is for
/// every process sharing it) and in a shared storage; the spaces there stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_number_of_spaces_is_bounded() {
    use toolmux_external::spaces::Who;
    let dir = tempfile::tempdir().expect("tempdir");
    let in_dir = || Spaces::in_dir(dir.path()).expect("spaces").with_max_spaces(2);
    let storage =
        StalledStorage { open: tokio::sync::watch::channel(true).0, kept: Default::default() };
    let shared = Spaces::in_storage(Arc::new(storage)).with_max_spaces(2);
    for one in [Spaces::in_memory().with_max_spaces(2), in_dir(), shared] {
        let (a, b) = (
            Who { holder: None, entity: "agent:a".into() },
            Who { holder: Some("acme".into()), entity: "agent:b".into() },
        );
        one.enter(&a, "first", 5).await.expect("within the bound");
        one.enter(&b, "second", 5).await.expect("within the bound, another holder's");
        let refused = one.enter(&a, "third", 5).await.expect_err("past the bound");
        let said = refused.to_string();
        assert!(said.contains("2 spaces already") && said.contains("spaces.maxSpaces"), "{said}");
        assert!(said.contains("gateway__spaces"), "says what to do: {said}");
        let made = one.say(&a, Some("fourth"), "hello", "gateway__post", true).await;
        assert!(made.is_err(), "a message does not make one either: {made:?}");
        one.enter(&a, "first", 5).await.expect("an existing space is entered");
        one.say(&a, None, "still here", "gateway__send_message", false).await.expect("said");
        let listed = one.list(&a).await.expect("list");
        assert_eq!(listed.len(), 1, "{listed:?}");
    }
    // A second process on the folder counts the first one's spaces.
    let again = in_dir();
    let c = Who { holder: None, entity: "agent:c".into() };
    again.enter(&c, "fifth", 5).await.expect_err("the folder holds two spaces");
}

/// Past the bound on agents and runs with state, the state of the run idle longest (an
/// hour at least; a state written before changes were timed counts as idle) is forgotten
/// to make room, an agent's never, and when no run is idle a new one is refused, saying
/// which bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_kept_for_agents_and_runs_is_bounded() {
    use toolmux_external::spaces::Who;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("spaces")).expect("spaces folder");
    // Written by the version before: no entity says when it last changed.
    std::fs::write(
        dir.path().join("state.json"),
        r#"{"entities":{"agent:keeper":{"activeSpace":"lobby","nextId":0},"run:mcp-old-1":{"activeSpace":"lobby","nextId":0}}}"#,
    )
    .expect("old state");
    let spaces = Spaces::in_dir(dir.path()).expect("spaces").with_max_entities(2);
    let new_run = Who { holder: None, entity: "run:mcp-new-1".into() };
    spaces.enter(&new_run, "lobby", 5).await.expect("the idle old run makes room");
    assert_eq!(
        spaces.active(&Who { holder: None, entity: "run:mcp-old-1".into() }).await.expect("active"),
        None,
        "forgotten"
    );
    let keeper = Who { holder: None, entity: "agent:keeper".into() };
    assert_eq!(
        spaces.active(&keeper).await.expect("active").as_deref(),
        Some("lobby"),
        "an agent is kept"
    );
    let another = Who { holder: None, entity: "agent:another".into() };
    let refused = spaces.enter(&another, "lobby", 5).await.expect_err("no run is idle");
    let said = refused.to_string();
    assert!(said.contains("2 agents and runs") && said.contains("max_entities"), "{said}");
    assert_eq!(spaces.active(&another).await.expect("active"), None, "nothing kept for it");
    assert_eq!(spaces.active(&new_run).await.expect("active").as_deref(), Some("lobby"));
    let memory = Spaces::in_memory().with_max_entities(1);
    memory.enter(&keeper, "lobby", 5).await.expect("enter");
    let refused = memory.enter(&new_run, "lobby", 5).await.expect_err("past the bound");
    assert!(refused.to_string().contains("max_entities"), "{refused}");
}

/// The events of what changed in space `space` after revision `since`, as
/// `gateway__changes` names them: `(event, index)`, and the revision to go on from.
async fn space_events(gateway: &GatewayProvider, space: &str, since: u64) -> (Vec<String>, u64) {
    let ui = CallContext::new().with_run_id("ui");
    let args = json!({"space": space, "since": since});
    let changes = json_of(&gateway.call("changes", args, &ui).await.expect("changes"));
    let events = changes["events"].as_array().expect("events").iter();
    let named = events.map(|e| format!("{} {}", e["event"].as_str().expect("a name"), e["index"]));
    (named.collect(), changes["version"].as_u64().expect("a version"))
}

/// A space's changes name the seeds' events of visible tools' calls made in it beside
/// each message: `tool.started` when a call is posted, `tool.done` or `tool.error` when it
/// ends (an inline tool's call both at once); what others say is a `message` alone.
#[tokio::test]
async fn a_space_s_changes_carry_the_events_of_visible_calls() {
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let ext = external(&spaces);
    let me = agent("booker", "r1");
    gateway.call("enter_space", json!({"space": "trip"}), &me).await.expect("enter");
    let (none, start) = space_events(&gateway, "trip", 0).await;
    assert_eq!(none, Vec::<String>::new());
    gateway.call("send_message", json!({"text": "hello"}), &me).await.expect("send");
    ext.call("confirmAction", json!({"q": "book?"}), &me).await.expect("confirm");
    let (events, posted) = space_events(&gateway, "trip", start).await;
    assert_eq!(events, ["message 0", "message 1", "tool.started 1"]);
    let listed = ext.call("pending", json!({}), &me).await.expect("pending");
    let id = json_of(&listed)["calls"][0]["callId"].as_str().expect("a call").to_owned();
    let answer = json!({"callId": id, "result": {"confirmed": true}});
    ext.call("submit", answer, &CallContext::new()).await.expect("delivered");
    ext.call("displayChart", json!({"points": [1, 2]}), &me).await.expect("chart");
    let (events, _) = space_events(&gateway, "trip", posted).await;
    assert_eq!(events, ["message 1", "tool.done 1", "message 2", "tool.started 2", "tool.done 2"]);
    // A call whose caller gave up ends in error.
    let caller = {
        let (ext, me) = (ext.clone(), me.clone());
        tokio::spawn(async move { ext.call("ask", json!({"q": "pay?"}), &me).await })
    };
    toolmux_test_support::eventually("the call is shown", || async {
        tool_statuses(&gateway, "trip").await.len() == 3
    })
    .await;
    let (_, shown) = space_events(&gateway, "trip", 0).await;
    caller.abort();
    toolmux_test_support::eventually("the call ends in error", || async {
        space_events(&gateway, "trip", shown).await.0 == ["message 3", "tool.error 3"]
    })
    .await;
    // From the start: each message once, as it stands, with what happened to it since.
    let (all, _) = space_events(&gateway, "trip", 0).await;
    assert_eq!(all.first().map(String::as_str), Some("message 0"));
    assert!(all.contains(&"tool.started 1".to_owned()) && all.contains(&"tool.done 1".to_owned()));
}

/// The message of each call in space `space`, oldest first: `tool status result`.
async fn tool_messages(gateway: &GatewayProvider, space: &str) -> Vec<String> {
    let person = CallContext::new().with_run_id("ui");
    let read = json!({"space": space, "offset": 0});
    let page = gateway.call("read_messages", read, &person).await.expect("read");
    let messages = json_of(&page)["messages"].clone();
    let tools = messages.as_array().expect("messages").iter().filter_map(|m| m.get("tool"));
    let line =
        |t: &Value| format!("{} {} {} {}", t["name"], t["toolName"], t["status"], t["result"]);
    tools.map(line).collect()
}

/// The call of any tool shown in its caller's space (`Spaces::show_call`, the facade's
/// `tools.NAME.showInSpace`) is posted as a visible inline call is, `requires_action` as
/// it starts, and finished with its result, its error, or `cancelled` when dropped; a
/// caller in no space has none posted.
#[tokio::test]
async fn a_shown_call_is_posted_as_it_starts_and_finished_as_it_ends() {
    use toolmux_external::spaces::Who;
    let spaces = Spaces::in_memory();
    let gateway = GatewayProvider::new(spaces.clone());
    let me = agent("reader", "r1");
    let nowhere = spaces.show_call(&Who::of(&me), "fs__read", json!({})).await.expect("looked");
    assert!(nowhere.is_none(), "no space, nothing shown");
    gateway.call("enter_space", json!({"space": "desk"}), &me).await.expect("enter");
    let shown = spaces.show_call(&Who::of(&me), "fs__read", json!({"path": "a.txt"})).await;
    let shown = shown.expect("posted").expect("in a space");
    let (events, started) = space_events(&gateway, "desk", 0).await;
    assert_eq!(events, ["message 0", "tool.started 0"]);
    shown.answered(&ToolOutput::text(r#"{"lines": 2}"#)).await.expect("finished");
    let (events, _) = space_events(&gateway, "desk", started).await;
    assert_eq!(events, ["message 0", "tool.done 0"]);
    let failing = spaces.show_call(&Who::of(&me), "fs__read", json!({})).await;
    failing.expect("posted").expect("in a space").failed("no such file").await.expect("finished");
    let dropped = spaces.show_call(&Who::of(&me), "fs__read", json!({})).await;
    drop(dropped.expect("posted").expect("in a space"));
    toolmux_test_support::eventually("the dropped call is cancelled", || async {
        tool_messages(&gateway, "desk").await.last().is_some_and(|m| m.contains("cancelled"))
    })
    .await;
    assert_eq!(
        tool_messages(&gateway, "desk").await,
        [
            r#""fs__read" "fs__read" "complete" {"lines":2}"#,
            r#""fs__read" "fs__read" "error" "no such file""#,
            r#""fs__read" "fs__read" "cancelled" null"#,
        ]
    );
}
