//! Pending external calls shared by two replicas: answered through the other one, early
//! and late results, withdrawal, long polls woken from the other replica, inbox cap.

use crate::{listeners, replica, within};
use serde_json::json;
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::ToolError;
use toolmux_external::{
    CallStatus, Delivery, ExecutionType, ExternalResult, NotPending, PendingCall, PendingStore,
};
use toolmux_test_support::eventually;
use toolmux_test_support::redis::RedisServer;

fn call(tool: &str, run: &str, is_async: bool) -> PendingCall {
    PendingCall {
        call_id: String::new(),
        tool: tool.to_owned(),
        arguments: json!({"question": "ok?"}),
        run_id: run.to_owned(),
        owner: None,
        execution_type: ExecutionType::Space,
        is_async,
        visible: true,
        created_ms: 0,
        status: Default::default(),
        expires_ms: 0,
        ttl_ms: None,
    }
}

fn answer(text: &str) -> ExternalResult {
    ExternalResult { result: json!(text), is_error: false }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_answered_through_another_replica_reaches_its_waiting_caller() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let id = a.open(call("external__confirm", "run-1", false)).await.unwrap();
    assert_eq!(a.count_pending("run-1", None).await.unwrap(), 1);
    let waiter = {
        let a = a.clone();
        let id = id.clone();
        tokio::spawn(async move { a.wait(&id, Duration::from_secs(10)).await })
    };
    let listed = b.pending(&[], Duration::ZERO).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].call_id.as_str(), listed[0].tool.as_str()),
        (id.as_str(), "external__confirm")
    );
    assert_eq!(
        (listed[0].run_id.as_str(), listed[0].execution_type),
        ("run-1", ExecutionType::Space)
    );
    assert!(listed[0].created_ms > 0);
    let look = replica(&server);
    let channel = format!("toolmux:x:{id}");
    eventually("the waiter subscribed", || async { listeners(&look, &channel).await >= 1 }).await;
    let answered = Instant::now();
    let delivery =
        b.resolve(&id, ExternalResult { result: json!({"yes": true}), is_error: true }).await;
    assert_eq!(delivery.unwrap(), Delivery::Waiting);
    let result = within(Duration::from_secs(5), "the waiting call", waiter).await.unwrap();
    assert!(
        answered.elapsed() < Duration::from_millis(200),
        "woken late: {:?}",
        answered.elapsed()
    );
    assert_eq!(result, Some(ExternalResult { result: json!({"yes": true}), is_error: true }));
    assert_eq!(a.count_pending("run-1", None).await.unwrap(), 0);
    assert!(b.pending(&[], Duration::ZERO).await.unwrap().is_empty());
    let again = b.resolve(&id, answer("twice")).await.unwrap_err();
    assert!(matches!(again, ToolError::InvalidArguments { .. }), "{again:?}");
}

#[tokio::test]
async fn a_result_submitted_before_the_wait_is_kept_for_it() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let id = a.open(call("external__confirm", "run-1", false)).await.unwrap();
    assert_eq!(b.resolve(&id, answer("early")).await.unwrap(), Delivery::Waiting);
    let started = Instant::now();
    assert_eq!(a.wait(&id, Duration::from_secs(5)).await, Some(answer("early")));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(a.wait(&id, Duration::from_millis(100)).await, None, "a result is taken once");
}

#[tokio::test]
async fn a_late_result_goes_to_the_inbox_of_the_run() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let id = a.open(call("external__confirm", "run-7", false)).await.unwrap();
    let listed = b.pending(&[], Duration::ZERO).await.unwrap();
    assert_eq!(listed[0].status, CallStatus::Waiting, "its caller is to wait for it");
    assert!(listed[0].expires_ms > listed[0].created_ms);
    assert_eq!(a.wait(&id, Duration::from_millis(100)).await, None);
    assert_eq!(a.count_pending("run-7", None).await.unwrap(), 1, "still pending after the wait");
    let listed = b.pending(&[], Duration::ZERO).await.unwrap();
    assert_eq!(listed[0].status, CallStatus::Pending, "its result now goes to the inbox");
    let delivery = b.resolve(&id, answer("late")).await.unwrap();
    assert_eq!(delivery, Delivery::Inbox { run_id: "run-7".into() });
    let inbox = a.take_inbox("run-7", None).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(
        (inbox[0].call_id.as_str(), inbox[0].tool.as_str()),
        (id.as_str(), "external__confirm")
    );
    assert_eq!(inbox[0].arguments, json!({"question": "ok?"}));
    assert_eq!(inbox[0].result, answer("late"));
    assert!(b.take_inbox("run-7", None).await.unwrap().is_empty(), "taken out");
    assert_eq!(a.count_pending("run-7", None).await.unwrap(), 0);
}

#[tokio::test]
async fn asynchronous_calls_are_answered_into_the_inbox_oldest_first() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let first = a.open(call("external__job", "run-2", true)).await.unwrap();
    let second = b.open(call("external__job", "run-2", true)).await.unwrap();
    assert_eq!(a.wait(&first, Duration::from_secs(5)).await, None, "nothing to wait for");
    assert_eq!(a.count_pending("run-2", None).await.unwrap(), 2);
    b.resolve(&first, answer("1")).await.unwrap();
    a.resolve(&second, answer("2")).await.unwrap();
    let ids: Vec<_> =
        b.take_inbox("run-2", None).await.unwrap().into_iter().map(|e| e.call_id).collect();
    assert_eq!(ids, [first, second]);
}

#[tokio::test]
async fn a_withdrawn_call_takes_no_result() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let id = a.open(call("external__confirm", "run-3", false)).await.unwrap();
    a.withdraw(&id).await;
    assert!(b.pending(&[], Duration::ZERO).await.unwrap().is_empty());
    assert_eq!(b.count_pending("run-3", None).await.unwrap(), 0);
    let refused = b.resolve(&id, answer("too late")).await.unwrap_err();
    assert!(refused.to_string().contains("no pending call"), "{refused}");
    assert!(a.take_inbox("run-3", None).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_is_woken_by_a_call_opened_in_the_other_replica() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let look = replica(&server);
    let poll = {
        let a = a.clone();
        tokio::spawn(async move {
            let calls =
                a.pending(&["external__wanted".to_owned()], Duration::from_secs(10)).await.unwrap();
            (calls, Instant::now())
        })
    };
    eventually("the long poll subscribed", || async {
        listeners(&look, "toolmux:x:new").await >= 1
    })
    .await;
    // A call of another tool does not end the poll.
    b.open(call("external__other", "run-4", true)).await.unwrap();
    let opened = Instant::now();
    let id = b.open(call("external__wanted", "run-4", true)).await.unwrap();
    let (calls, returned) = within(Duration::from_secs(5), "the long poll", poll).await.unwrap();
    let ids: Vec<_> = calls.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, [id.as_str()]);
    assert!(returned - opened < Duration::from_millis(200), "woken late: {:?}", returned - opened);
    let all = a.pending(&[], Duration::ZERO).await.unwrap();
    assert_eq!(all.len(), 2);
    assert!(all[0].created_ms <= all[1].created_ms, "oldest first");
    let both = a
        .pending(&["external__wanted".into(), "external__other".into()], Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(both, all);
}

#[tokio::test]
async fn a_long_poll_with_nothing_pending_ends_at_its_wait() {
    let server = RedisServer::start();
    let store = replica(&server).pending_store();
    let started = Instant::now();
    assert!(store.pending(&[], Duration::from_millis(300)).await.unwrap().is_empty());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(1), "{waited:?}");
}

#[tokio::test]
async fn an_inbox_keeps_the_newest_results_and_the_store_is_bounded() {
    let server = RedisServer::start();
    let store = replica(&server).pending_store().with_limits(6, 3);
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(store.open(call("external__job", "run-5", true)).await.unwrap());
    }
    let other = replica(&server).pending_store().with_limits(6, 3);
    other.open(call("external__job", "run-6", true)).await.unwrap();
    let full = other.open(call("external__job", "run-6", true)).await.unwrap_err();
    assert!(matches!(full, ToolError::QueueBusy { .. }), "{full:?}");
    for (i, id) in ids.iter().enumerate() {
        store.resolve(id, answer(&i.to_string())).await.unwrap();
    }
    let kept: Vec<_> = store
        .take_inbox("run-5", None)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.result.result)
        .collect();
    assert_eq!(kept, [json!("2"), json!("3"), json!("4")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_by_its_caller_leaves_later_results_to_the_inbox() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let look = replica(&server);
    let id = a.open(call("external__confirm", "run-8", false)).await.unwrap();
    let waiter = {
        let a = a.clone();
        let id = id.clone();
        tokio::spawn(async move { a.wait(&id, Duration::from_secs(30)).await })
    };
    let channel = format!("toolmux:x:{id}");
    eventually("the waiter subscribed", || async { listeners(&look, &channel).await >= 1 }).await;
    waiter.abort();
    let waiter_key = format!("toolmux:x:waiter:{id}");
    eventually("the wait ended in redis", || async {
        let exists = look.client().command(&["EXISTS", &waiter_key]).await.unwrap();
        exists.as_i64() == Some(0)
    })
    .await;
    let delivery = b.resolve(&id, answer("after")).await.unwrap();
    assert_eq!(delivery, Delivery::Inbox { run_id: "run-8".into() });
    assert_eq!(a.take_inbox("run-8", None).await.unwrap().len(), 1);
}

/// The configured times to live hold in Redis as in a folder: a call pending longer is
/// neither listed nor counted, a result for it is refused saying that it expired (again
/// once it was forgotten), and an inbox nobody added to or read for the results' time
/// expires.
#[tokio::test]
async fn calls_and_results_expire_after_their_times_to_live() {
    let server = RedisServer::start();
    let ttl = Duration::from_millis(300);
    let store = replica(&server).pending_store().with_ttl(ttl, ttl);
    let other = replica(&server).pending_store().with_ttl(ttl, ttl);
    let old = store.open(call("external__job", "run-8", true)).await.unwrap();
    let answered = store.open(call("external__job", "run-9", true)).await.unwrap();
    store.resolve(&answered, answer("done")).await.unwrap();
    assert_eq!(store.pending(&[], Duration::ZERO).await.unwrap().len(), 1);
    assert_eq!(store.count_pending("run-8", None).await.unwrap(), 1);
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    assert!(store.pending(&[], Duration::ZERO).await.unwrap().is_empty(), "no longer listed");
    assert_eq!(
        other.count_pending("run-8", None).await.unwrap(),
        0,
        "nor counted, with no call opened"
    );
    assert!(store.take_inbox("run-9", None).await.unwrap().is_empty(), "the unread inbox expired");
    let refused = other.resolve(&old, answer("late")).await.unwrap_err();
    assert!(refused.to_string().contains("expired after 0.3 s"), "{refused}");
    let look = replica(&server);
    let kept = look.client().command(&["EXISTS", &format!("toolmux:x:call:{old}")]).await;
    assert_eq!(kept.unwrap().as_i64(), Some(0), "the expired call is cleaned up");
    let again = store.resolve(&old, answer("later")).await.unwrap_err();
    assert!(again.to_string().contains("expired"), "{again}");
}

/// A result handed to a waiting caller whose process then died is not lost: once the
/// caller's waiter mark runs out, reading the run's inbox finds it (as a folder's next
/// sweep moves it), and nothing of the call is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_handed_to_a_caller_that_died_reaches_the_inbox() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let look = replica(&server);
    let id = a.open(call("external__confirm", "run-10", false)).await.unwrap();
    // The caller waits in a runtime of its own, which then stops dead: nothing it would
    // have done when its wait ended runs (a process killed mid-wait).
    let dying = {
        let (a, id) = (a.clone(), id.clone());
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                tokio::select! {
                    _ = a.wait(&id, Duration::from_secs(30)) => panic!("no result came"),
                    () = tokio::time::sleep(Duration::from_millis(300)) => {}
                }
            });
            runtime.shutdown_background();
        })
    };
    dying.join().unwrap();
    let waiter = format!("toolmux:x:waiter:{id}");
    let mark = look.client().command(&["GET", &waiter]).await.unwrap();
    assert!(
        mark.as_str().is_some_and(|m| m.starts_with("waiting")),
        "the dead caller's mark is left"
    );
    assert_eq!(b.resolve(&id, answer("yes")).await.unwrap(), Delivery::Waiting);
    assert!(b.take_inbox("run-10", None).await.unwrap().is_empty(), "held while the mark lives");
    // Its mark runs out (the wait's time and slack pass).
    look.client().command(&["PEXPIRE", &waiter, "1"]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let inbox = b.take_inbox("run-10", None).await.unwrap();
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    assert_eq!((inbox[0].call_id.as_str(), &inbox[0].result), (id.as_str(), &answer("yes")));
    assert_eq!(inbox[0].arguments, json!({"question": "ok?"}));
    assert_eq!(b.count_pending("run-10", None).await.unwrap(), 0);
    let left = ["call", "result", "waiter"].map(|k| format!("toolmux:x:{k}:{id}"));
    let exists = look.client().command(&["EXISTS", &left[0], &left[1], &left[2]]).await;
    assert_eq!(exists.unwrap().as_i64(), Some(0));
    let held = look.client().command(&["ZCARD", "toolmux:x:held"]).await.unwrap();
    assert_eq!(held.as_i64(), Some(0));
}

/// The same when the replica died between opening the call and waiting for it: once the
/// opening's mark runs out, a result it was handed goes to the inbox, and so does one
/// submitted afterwards.
#[tokio::test]
async fn a_result_for_a_call_whose_opener_died_reaches_the_inbox() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let look = replica(&server);
    let first = a.open(call("external__confirm", "run-11", false)).await.unwrap();
    let second = a.open(call("external__confirm", "run-11", false)).await.unwrap();
    assert_eq!(b.resolve(&first, answer("1")).await.unwrap(), Delivery::Waiting);
    for id in [&first, &second] {
        let mark = format!("toolmux:x:waiter:{id}");
        look.client().command(&["PEXPIRE", &mark, "1"]).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(b.count_pending("run-11", None).await.unwrap(), 1, "the unanswered one");
    let delivery = b.resolve(&second, answer("2")).await.unwrap();
    assert_eq!(delivery, Delivery::Inbox { run_id: "run-11".into() });
    let ids: Vec<_> =
        a.take_inbox("run-11", None).await.unwrap().into_iter().map(|e| e.call_id).collect();
    assert_eq!(ids, [first, second]);
}

/// Each agent takes only its own results from a run's inbox, the others staying in order
/// with the inbox's time to live; counts are per agent too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agent_takes_its_own_results_from_a_shared_inbox() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let of = |owner: &str| PendingCall {
        owner: Some(owner.to_owned()),
        ..call("external__job", "run-9", true)
    };
    let lead = a.open(of("agent:lead")).await.unwrap();
    let worker = a.open(of("agent:worker")).await.unwrap();
    let lead_again = a.open(of("agent:lead")).await.unwrap();
    assert_eq!(b.count_pending("run-9", Some("agent:lead")).await.unwrap(), 2);
    assert_eq!(b.count_pending("run-9", Some("agent:worker")).await.unwrap(), 1);
    assert_eq!(b.count_pending("run-9", None).await.unwrap(), 3);
    for id in [&lead, &worker, &lead_again] {
        b.resolve(id, answer(id)).await.unwrap();
    }
    let ids = |entries: Vec<toolmux_external::InboxEntry>| -> Vec<String> {
        entries.into_iter().map(|e| e.call_id).collect()
    };
    assert_eq!(ids(a.take_inbox("run-9", Some("agent:worker")).await.unwrap()), [worker]);
    assert!(a.take_inbox("run-9", Some("agent:worker")).await.unwrap().is_empty());
    assert_eq!(ids(b.take_inbox("run-9", Some("agent:lead")).await.unwrap()), [lead, lead_again]);
    assert!(a.take_inbox("run-9", None).await.unwrap().is_empty());
}

/// A call does not expire while its caller waits for it, however short its time to live,
/// and its time counts from the end of the wait: a late result goes to the inbox for that
/// long, and is refused as expired after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_waited_for_does_not_expire() {
    let server = RedisServer::start();
    let ttl = Duration::from_millis(300);
    let a = replica(&server).pending_store().with_ttl(ttl, ttl * 10);
    let b = replica(&server).pending_store().with_ttl(ttl, ttl * 10);
    let id = a.open(call("external__confirm", "run-12", false)).await.unwrap();
    let waiter = {
        let (a, id) = (a.clone(), id.clone());
        tokio::spawn(async move { a.wait(&id, Duration::from_secs(3)).await })
    };
    tokio::time::sleep(ttl * 2).await;
    // Another replica's opening sweeps: the waited call is not taken for expired.
    b.open(call("external__job", "run-13", true)).await.unwrap();
    let listed = b.pending(&["external__confirm".into()], Duration::ZERO).await.unwrap();
    assert_eq!(listed.len(), 1, "still listed past its time to live");
    assert_eq!((listed[0].call_id.as_str(), listed[0].status), (id.as_str(), CallStatus::Waiting));
    assert!(listed[0].expires_ms > listed[0].created_ms + 3000, "{:?}", listed[0]);
    assert_eq!(b.count_pending("run-12", None).await.unwrap(), 1);
    assert_eq!(b.resolve(&id, answer("yes")).await.unwrap(), Delivery::Waiting);
    assert_eq!(
        within(Duration::from_secs(5), "the wait", waiter).await.unwrap(),
        Some(answer("yes"))
    );

    let late = a.open(call("external__confirm", "run-12", false)).await.unwrap();
    assert_eq!(a.wait(&late, ttl * 2).await, None);
    let delivery = b.resolve(&late, answer("late")).await.unwrap();
    assert_eq!(delivery, Delivery::Inbox { run_id: "run-12".into() });

    let gone = a.open(call("external__confirm", "run-12", false)).await.unwrap();
    assert_eq!(a.wait(&gone, ttl * 2).await, None);
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert_eq!(b.count_pending("run-12", None).await.unwrap(), 0);
    let refused = b.resolve(&gone, answer("too late")).await.unwrap_err();
    assert!(refused.to_string().contains("expired after 0.3 s"), "{refused}");
}

/// Through the provider, a result for an expired call submitted with its `runId` (as the
/// HTTP API submits) is refused saying that the call expired, not as an unknown call.
#[tokio::test]
async fn a_result_for_an_expired_call_of_a_named_run_says_it_expired() {
    use toolmux_core::{CallContext, ToolProvider as _};
    let server = RedisServer::start();
    let ttl = Duration::from_millis(200);
    let store = std::sync::Arc::new(replica(&server).pending_store().with_ttl(ttl, ttl * 10));
    let tools = std::collections::BTreeMap::from([(
        "job".to_owned(),
        toolmux_external::ExternalToolConfig {
            description: "d".into(),
            is_async: true,
            ..Default::default()
        },
    )]);
    let provider = toolmux_external::ExternalProvider::new(&tools, store).unwrap();
    let ctx = CallContext::new().with_run_id("run-14");
    let made = provider.call("job", json!({}), &ctx).await.unwrap();
    let made: serde_json::Value = serde_json::from_str(&made.to_text()).unwrap();
    let id = made["callId"].as_str().unwrap().to_owned();
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let late = json!({"callId": id, "result": "late", "runId": "run-14"});
    let refused = provider.call("submit", late, &ctx).await.unwrap_err();
    assert!(refused.to_string().contains("expired after 0.2 s"), "{refused}");
    let never = json!({"callId": "ext-nothing-1", "result": "x", "runId": "run-14"});
    let unknown = provider.call("submit", never, &ctx).await.unwrap_err();
    assert!(unknown.to_string().contains("no pending call"), "{unknown}");
}

/// Times to live past counting (a configuration's way of saying "never", which the facade
/// hands to this store as to the others) keep calls and results for good: the calls were
/// left out of listings (their expiry overflowed Redis's integers), and a result held for
/// its caller or put in an inbox failed the script ("invalid expire time").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_to_live_past_counting_keep_calls_and_results() {
    let server = RedisServer::start();
    let forever = Duration::from_millis(u64::MAX);
    for ttl in [forever, Duration::from_secs(u64::MAX)] {
        let store = replica(&server).pending_store().with_ttl(ttl, ttl);
        let id = store.open(call("external__confirm", "r", false)).await.unwrap();
        assert_eq!(store.wait(&id, Duration::from_millis(10)).await, None);
        let listed = store.pending(&[], Duration::ZERO).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].expires_ms, u64::MAX);
        store.resolve(&id, answer("late")).await.unwrap();
        assert_eq!(store.take_inbox("r", None).await.unwrap()[0].result, answer("late"));
        // Held for a waiting caller.
        let id = store.open(call("external__confirm", "r", false)).await.unwrap();
        let waiting = {
            let (store, id) = (store.clone(), id.clone());
            tokio::spawn(async move { store.wait(&id, Duration::from_secs(10)).await })
        };
        eventually("the caller waits", || async {
            let listed = store.pending(&[], Duration::ZERO).await.unwrap_or_default();
            listed.first().is_some_and(|c| c.status == CallStatus::Waiting)
        })
        .await;
        assert_eq!(store.resolve(&id, answer("now")).await.unwrap(), Delivery::Waiting);
        let got = within(Duration::from_secs(10), "the wait", waiting).await.unwrap();
        assert_eq!(got, Some(answer("now")));
        assert_eq!(store.count_pending("r", None).await.unwrap(), 0);
        // A wait past counting claims its call and takes its result.
        let id = store.open(call("external__confirm", "r", false)).await.unwrap();
        store.resolve(&id, answer("first")).await.unwrap();
        let got = within(Duration::from_secs(10), "a wait of forever", store.wait(&id, ttl)).await;
        assert_eq!(got, Some(answer("first")));
    }
}

/// A wait whose taking of the result ran but whose answer was lost (the connection broke)
/// gets the result when it asks again: the result was gone, to nobody (not even the inbox).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_whose_taking_was_answered_into_a_broken_connection_is_taken_again() {
    let server = RedisServer::start();
    let proxy = crate::CuttingProxy::start(&server).await;
    let cut = toolmux_redis::RedisBackend::new(&toolmux_redis::RedisConfig::new(proxy.url()))
        .expect("valid url")
        .pending_store();
    let other = replica(&server).pending_store();
    // The claim's script is loaded: the next command is the claim itself.
    assert_eq!(cut.wait("no-such-call", Duration::from_millis(100)).await, None);
    let id = cut.open(call("external__confirm", "run-1", false)).await.unwrap();
    assert_eq!(other.resolve(&id, answer("yes")).await.unwrap(), Delivery::Waiting);
    proxy.cut_next_reply();
    let got =
        within(Duration::from_secs(10), "the wait", cut.wait(&id, Duration::from_secs(3))).await;
    assert_eq!(got, Some(answer("yes")));
    // Given once: not to the inbox as well.
    assert!(other.take_inbox("run-1", None).await.unwrap().is_empty());
}

/// A second wait for a call another wait holds gets nothing, even a result already there
/// for the first: it took the first wait's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_wait_does_not_take_the_result_of_the_first() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).pending_store(), replica(&server).pending_store());
    let id = a.open(call("external__confirm", "run-1", false)).await.unwrap();
    let first = a.wait(&id, Duration::from_secs(10));
    tokio::pin!(first);
    // The first wait claims the call and then is not polled: its mark stays, its result
    // waits for it.
    let look = replica(&server);
    let channel = format!("toolmux:x:{id}");
    tokio::select! {
        ended = &mut first => panic!("the first wait ended: {ended:?}"),
        () = eventually("the first wait subscribed", || async {
            listeners(&look, &channel).await >= 1
        }) => {}
    }
    assert_eq!(b.resolve(&id, answer("for the first")).await.unwrap(), Delivery::Waiting);
    assert_eq!(b.wait(&id, Duration::from_millis(300)).await, None);
    let got = within(Duration::from_secs(5), "the first wait", first).await;
    assert_eq!(got, Some(answer("for the first")));
}

/// An opening dropped after its script ran but before its answer came (the caller was
/// cancelled or cut by a deadline), or whose answer was lost, leaves no call pending that
/// nobody knows the id of: the call is withdrawn, and nothing of it is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_opening_is_dropped_or_unanswered_is_not_left_pending() {
    let server = RedisServer::start();
    let other = replica(&server).pending_store();
    // Each through a proxy of its own: a withdrawal's commands do not meet the other's.
    let (holding, cutting) =
        (crate::CuttingProxy::start(&server).await, crate::CuttingProxy::start(&server).await);
    let through = |proxy: &crate::CuttingProxy| {
        toolmux_redis::RedisBackend::new(&toolmux_redis::RedisConfig::new(proxy.url()))
            .expect("valid url")
            .pending_store()
    };
    let (held, cut) = (through(&holding), through(&cutting));
    for store in [&held, &cut] {
        // The opening's script is loaded: the next command is the opening itself.
        let id = store.open(call("external__job", "run-0", true)).await.unwrap();
        store.withdraw(&id).await;
    }
    holding.hold_next_reply();
    let opening = held.open(call("external__job", "run-1", true));
    let dropped = tokio::time::timeout(Duration::from_millis(500), opening).await;
    assert!(dropped.is_err(), "the opening was answered: {dropped:?}");
    cutting.cut_next_reply();
    let lost = cut.open(call("external__job", "run-2", true)).await;
    assert!(lost.is_err(), "the opening was answered: {lost:?}");
    eventually("the calls were withdrawn", || async {
        other.pending(&[], Duration::ZERO).await.unwrap().is_empty()
    })
    .await;
    assert_eq!(other.count_pending("run-1", None).await.unwrap(), 0);
    assert_eq!(other.count_pending("run-2", None).await.unwrap(), 0);
    let look = replica(&server);
    let keys = look.client().command(&["KEYS", "toolmux:x:call:*"]).await.unwrap();
    assert_eq!(keys.as_array().map(<[_]>::len), Some(0), "no call is left: {keys:?}");
}

/// Past the bound on runs with unread results, a result bound for yet another run's inbox
/// is refused, saying which bound and what frees a place, and its call stays pending; a
/// result for a run with an inbox already still goes in, and once an inbox is read the
/// refused result goes through. The bound is for all replicas together.
#[tokio::test]
async fn the_runs_with_unread_results_are_bounded() {
    let server = RedisServer::start();
    let a = replica(&server).pending_store().with_max_inboxes(2);
    let b = replica(&server).pending_store().with_max_inboxes(2);
    let mut ids = Vec::new();
    for run in ["r1", "r2", "r3", "r1"] {
        ids.push(a.open(call("external__job", run, true)).await.unwrap());
    }
    for id in &ids[..2] {
        assert!(matches!(b.resolve(id, answer("done")).await, Ok(Delivery::Inbox { .. })));
    }
    let refused = b.resolve(&ids[2], answer("done")).await.unwrap_err();
    let said = refused.to_string();
    assert!(matches!(refused, ToolError::Denied { .. }), "{said}");
    assert!(said.contains("inboxes of 2 runs") && said.contains("max_inboxes"), "{said}");
    assert!(said.contains("external__inbox"), "says what frees a place: {said}");
    let pending = a.pending(&[], Duration::ZERO).await.unwrap();
    assert!(pending.iter().any(|c| c.call_id == ids[2]), "still pending: {pending:?}");
    assert_eq!(a.count_pending("r3", None).await.unwrap(), 1);
    b.resolve(&ids[3], answer("more")).await.expect("r1 has an inbox already");
    assert_eq!(a.take_inbox("r1", None).await.unwrap().len(), 2);
    b.resolve(&ids[2], answer("done")).await.expect("a place was freed");
    assert_eq!(a.take_inbox("r3", None).await.unwrap()[0].result, answer("done"));
}

/// A place among the runs with unread results is freed when the inbox expires, and when an
/// agent takes the last of its results out of a shared one (not while others' are left).
#[tokio::test]
async fn an_expired_or_emptied_inbox_frees_its_place() {
    let server = RedisServer::start();
    let ttl = Duration::from_millis(300);
    let store = replica(&server).pending_store().with_max_inboxes(1);
    let short = replica(&server).pending_store().with_max_inboxes(1).with_ttl(RETAINED, ttl);
    let of = |owner: &str, run: &str| PendingCall {
        owner: Some(owner.to_owned()),
        ..call("external__job", run, true)
    };
    let (lead, worker) = (
        store.open(of("lead", "r1")).await.unwrap(),
        store.open(of("worker", "r1")).await.unwrap(),
    );
    let other = store.open(of("lead", "r2")).await.unwrap();
    store.resolve(&lead, answer("1")).await.unwrap();
    store.resolve(&worker, answer("2")).await.unwrap();
    assert_eq!(store.take_inbox("r1", Some("worker")).await.unwrap().len(), 1);
    let refused = store.resolve(&other, answer("3")).await.unwrap_err();
    assert!(matches!(refused, ToolError::Denied { .. }), "the lead's result is left: {refused}");
    assert_eq!(store.take_inbox("r1", Some("lead")).await.unwrap().len(), 1);
    store.resolve(&other, answer("3")).await.expect("the inbox was emptied");
    assert_eq!(store.take_inbox("r2", None).await.unwrap().len(), 1);
    let (first, second) =
        (short.open(of("lead", "r3")).await.unwrap(), short.open(of("lead", "r4")).await.unwrap());
    short.resolve(&first, answer("4")).await.unwrap();
    assert!(short.resolve(&second, answer("5")).await.is_err(), "r3's inbox holds a result");
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    short.resolve(&second, answer("5")).await.expect("r3's inbox expired");
}

/// Long enough for a call not to expire within a test.
const RETAINED: Duration = Duration::from_secs(600);

/// A call whose tool gives it a time to live of its own (`callTtl`) expires after it, in
/// a store whose calls live an hour: listed with that expiry, refused saying so (then, and
/// again once another replica's sweep forgot it); a synchronous call's time counts from
/// the end of its caller's wait. The other calls keep the store's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_lives_as_long_as_its_tool_says() {
    let server = RedisServer::start();
    let hour = Duration::from_secs(3600);
    let a = replica(&server).pending_store().with_ttl(hour, hour);
    let b = replica(&server).pending_store().with_ttl(hour, hour);
    let ttl = Duration::from_millis(300);
    let short = PendingCall { ttl_ms: Some(300), ..call("external__job", "run-40", true) };
    let short = a.open(short).await.unwrap();
    let long = a.open(call("external__job", "run-40", true)).await.unwrap();
    let listed = b.pending(&[], Duration::ZERO).await.unwrap();
    let of = |id: &str| listed.iter().find(|c| c.call_id == id).unwrap().clone();
    let (listed_short, listed_long) = (of(&short), of(&long));
    assert_eq!(listed_short.ttl_ms, Some(300), "{listed_short:?}");
    assert_eq!(listed_short.expires_ms, listed_short.created_ms + 300, "{listed_short:?}");
    assert!(listed_long.expires_ms > listed_long.created_ms + 3_000_000, "{listed_long:?}");

    let waited = PendingCall { ttl_ms: Some(300), ..call("external__ask", "run-40", false) };
    let waited = a.open(waited).await.unwrap();
    assert_eq!(a.wait(&waited, Duration::from_millis(200)).await, None);
    let listed = b.pending(&[], Duration::ZERO).await.unwrap();
    let after_wait = listed.iter().find(|c| c.call_id == waited).unwrap();
    let lives = after_wait.expires_ms.saturating_sub(after_wait.created_ms);
    // From the end of the wait, not from the opening, nor the store's hour.
    assert!((450..3_000_000).contains(&lives), "{after_wait:?}");

    tokio::time::sleep(ttl + Duration::from_millis(150)).await;
    let listed = b.pending(&[], Duration::ZERO).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, [long.as_str()], "only the store's call is left");
    assert_eq!(a.not_pending(&short).await.unwrap(), NotPending::Expired { ttl });
    for id in [&short, &short, &waited] {
        let refused = b.resolve(id, answer("late")).await.unwrap_err();
        assert!(refused.report().contains("expired after 0.3 s"), "{}", refused.report());
        assert_eq!(refused.code(), "gone", "{refused:?}");
        assert_eq!(a.not_pending(id).await.unwrap(), NotPending::Expired { ttl }, "{id}");
    }
    let delivered = b.resolve(&long, answer("in time")).await.unwrap();
    assert_eq!(delivered, Delivery::Inbox { run_id: "run-40".into() });
}
