//! The two stores of this crate held to one behaviour: every test runs on a
//! [`MemoryPendingStore`] (both sides the same store) and on two [`DirPendingStore`]s over
//! one folder, as two processes sharing it would be. Then what only a folder shared by
//! processes meets: ids that are paths, files nobody can read, callers that went away, a
//! bound for all processes together, an inbox read after a restart.

// The bodies shared by the two stores are plain functions, which `allow-unwrap-in-tests`
// does not reach.
#![allow(clippy::unwrap_used)]

use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::ToolError;
use toolmux_external::{
    CallStatus, Delivery, DirPendingStore, ExecutionType, ExternalResult, MemoryPendingStore,
    PendingCall, PendingStore,
};

type Store = Arc<dyn PendingStore>;

/// Where calls are made (`a`) and answered (`b`), and the folder of a shared pair.
struct Pair {
    a: Store,
    b: Store,
    _dir: Option<tempfile::TempDir>,
}

fn memory() -> Pair {
    let store: Store = Arc::new(MemoryPendingStore::default());
    Pair { a: store.clone(), b: store, _dir: None }
}

fn folder() -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let a = DirPendingStore::open(dir.path()).unwrap();
    let b = DirPendingStore::open(dir.path()).unwrap();
    Pair { a: Arc::new(a), b: Arc::new(b), _dir: Some(dir) }
}

fn call(tool: &str, run: &str, is_async: bool) -> PendingCall {
    PendingCall {
        call_id: String::new(),
        tool: tool.to_owned(),
        arguments: json!({"question": "ok?"}),
        run_id: run.to_owned(),
        owner: None,
        execution_type: ExecutionType::External,
        is_async,
        visible: true,
        created_ms: 0,
        status: CallStatus::default(),
        expires_ms: 0,
        ttl_ms: None,
    }
}

fn answer(text: &str) -> ExternalResult {
    ExternalResult { result: json!(text), is_error: false }
}

/// Runs test `$name` on both kinds of store.
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_memory() {
                super::$name(super::memory()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_a_folder() {
                super::$name(super::folder()).await;
            }
        }
    };
}

/// The same two pairs, calls living `ttl`.
fn memory_ttl(ttl: Duration) -> Pair {
    let store: Store = Arc::new(MemoryPendingStore::default().with_ttl(ttl, ttl * 10));
    Pair { a: store.clone(), b: store, _dir: None }
}

fn folder_ttl(ttl: Duration) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let a = DirPendingStore::open(dir.path()).unwrap().with_ttl(ttl, ttl * 10);
    let b = DirPendingStore::open(dir.path()).unwrap().with_ttl(ttl, ttl * 10);
    Pair { a: Arc::new(a), b: Arc::new(b), _dir: Some(dir) }
}

both!(a_waiting_call_is_answered_through_the_other_side);
async fn a_waiting_call_is_answered_through_the_other_side(p: Pair) {
    let id = p.a.open(call("external__confirm", "run-1", false)).await.unwrap();
    let listed = p.b.pending(&[], Duration::ZERO).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].call_id.as_str(), listed[0].status), (id.as_str(), CallStatus::Waiting));
    assert!(listed[0].created_ms > 0 && listed[0].expires_ms > listed[0].created_ms);
    let a = p.a.clone();
    let waiting = id.clone();
    let waiter = tokio::spawn(async move { a.wait(&waiting, Duration::from_secs(10)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let answered = Instant::now();
    let delivery = p.b.resolve(&id, answer("yes")).await.unwrap();
    assert_eq!(delivery, Delivery::Waiting);
    let result = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
    assert!(answered.elapsed() < Duration::from_secs(1), "woken late: {:?}", answered.elapsed());
    assert_eq!(result, Some(answer("yes")));
    assert_eq!(p.a.count_pending("run-1", None).await.unwrap(), 0);
    assert!(p.b.pending(&[], Duration::ZERO).await.unwrap().is_empty());
    let again = p.b.resolve(&id, answer("twice")).await.unwrap_err();
    assert!(again.report().contains("no pending call"), "{}", again.report());
}

both!(concurrent_submissions_of_one_call_let_exactly_one_win);
/// Results submitted for one call at once from both sides (two processes): exactly one is
/// taken, the others refused, and the caller or the inbox gets that one alone.
async fn concurrent_submissions_of_one_call_let_exactly_one_win(p: Pair) {
    for is_async in [true, false] {
        let id = p.a.open(call("external__confirm", "run-1", is_async)).await.unwrap();
        let submissions = (0..8).map(|n| {
            let side = if n % 2 == 0 { p.a.clone() } else { p.b.clone() };
            let id = id.clone();
            tokio::spawn(
                async move { (n, side.resolve(&id, answer(&format!("answer {n}"))).await) },
            )
        });
        let mut won = Vec::new();
        for submission in submissions.collect::<Vec<_>>() {
            let (n, resolved) = submission.await.unwrap();
            match resolved {
                Ok(_) => won.push(n),
                Err(e) => assert!(e.report().contains("no pending call"), "{}", e.report()),
            }
        }
        assert_eq!(won.len(), 1, "async {is_async}: {won:?}");
        let winner = answer(&format!("answer {}", won[0]));
        let got = match is_async {
            true => {
                p.a.take_inbox("run-1", None).await.unwrap().into_iter().map(|e| e.result).collect()
            }
            false => vec![p.a.wait(&id, Duration::from_secs(5)).await.unwrap()],
        };
        assert_eq!(got, [winner], "async {is_async}");
    }
}

both!(a_result_submitted_before_the_wait_is_kept_for_it);
async fn a_result_submitted_before_the_wait_is_kept_for_it(p: Pair) {
    let id = p.a.open(call("external__confirm", "run-1", false)).await.unwrap();
    assert_eq!(p.b.resolve(&id, answer("early")).await.unwrap(), Delivery::Waiting);
    assert!(p.b.pending(&[], Duration::ZERO).await.unwrap().is_empty(), "answered: not listed");
    assert_eq!(p.a.wait(&id, Duration::from_secs(5)).await, Some(answer("early")));
    assert_eq!(p.a.wait(&id, Duration::from_millis(50)).await, None, "taken once");
}

both!(a_late_result_goes_to_the_inbox_of_the_run);
async fn a_late_result_goes_to_the_inbox_of_the_run(p: Pair) {
    let id = p.a.open(call("external__confirm", "run-7", false)).await.unwrap();
    assert_eq!(p.a.wait(&id, Duration::from_millis(100)).await, None);
    assert_eq!(p.a.count_pending("run-7", None).await.unwrap(), 1, "still pending after the wait");
    let listed = p.b.pending(&[], Duration::ZERO).await.unwrap();
    assert_eq!(listed[0].status, CallStatus::Pending, "its result now goes to the inbox");
    let delivery = p.b.resolve(&id, answer("late")).await.unwrap();
    assert_eq!(delivery, Delivery::Inbox { run_id: "run-7".into() });
    assert!(p.b.take_inbox("run-8", None).await.unwrap().is_empty(), "another run's inbox");
    let inbox = p.a.take_inbox("run-7", None).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(
        (inbox[0].call_id.as_str(), inbox[0].tool.as_str()),
        (id.as_str(), "external__confirm")
    );
    assert_eq!(inbox[0].arguments, json!({"question": "ok?"}));
    assert_eq!(inbox[0].result, answer("late"));
    assert!(p.b.take_inbox("run-7", None).await.unwrap().is_empty(), "taken out");
    assert_eq!(p.a.count_pending("run-7", None).await.unwrap(), 0);
}

both!(asynchronous_calls_are_answered_into_the_inbox_oldest_first);
async fn asynchronous_calls_are_answered_into_the_inbox_oldest_first(p: Pair) {
    let first = p.a.open(call("external__job", "key:acme/run 2", true)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    let second = p.b.open(call("external__job", "key:acme/run 2", true)).await.unwrap();
    assert_ne!(first, second);
    assert_eq!(p.a.wait(&first, Duration::from_secs(5)).await, None, "nothing to wait for");
    let listed = p.a.pending(&["external__job".into()], Duration::ZERO).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, [first.as_str(), second.as_str()]);
    assert!(listed.iter().all(|c| c.status == CallStatus::Pending && c.is_async));
    assert!(p.a.pending(&["external__other".into()], Duration::ZERO).await.unwrap().is_empty());
    p.b.resolve(&second, answer("2")).await.unwrap();
    p.a.resolve(&first, answer("1")).await.unwrap();
    let taken = p.b.take_inbox("key:acme/run 2", None).await.unwrap();
    let ids: Vec<_> = taken.into_iter().map(|e| e.call_id).collect();
    assert_eq!(ids, [second, first], "in the order they were answered");
}

both!(a_withdrawn_call_takes_no_result);
async fn a_withdrawn_call_takes_no_result(p: Pair) {
    let id = p.a.open(call("external__confirm", "r", false)).await.unwrap();
    p.a.withdraw(&id).await;
    assert!(p.b.pending(&[], Duration::ZERO).await.unwrap().is_empty());
    let refused = p.b.resolve(&id, answer("x")).await.unwrap_err();
    assert!(matches!(refused, ToolError::InvalidArguments { .. }), "{refused:?}");
    assert_eq!(p.a.wait(&id, Duration::from_millis(50)).await, None);
}

both!(a_long_poll_is_woken_by_a_call_made_on_the_other_side);
async fn a_long_poll_is_woken_by_a_call_made_on_the_other_side(p: Pair) {
    let seen = p.a.open(call("external__job", "r", true)).await.unwrap();
    let b = p.b.clone();
    let exclude = vec![seen];
    let started = Instant::now();
    let poll = tokio::spawn(async move {
        b.pending_except(&[], &exclude, Duration::from_secs(10)).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let new = p.a.open(call("external__job", "r", true)).await.unwrap();
    let calls = tokio::time::timeout(Duration::from_secs(5), poll).await.unwrap().unwrap();
    assert_eq!(calls.iter().map(|c| c.call_id.as_str()).collect::<Vec<_>>(), [new.as_str()]);
    assert!(started.elapsed() < Duration::from_secs(2), "woken late: {:?}", started.elapsed());
    // Nothing new: the poll ends at its wait.
    let started = Instant::now();
    let all: Vec<String> =
        p.b.pending(&[], Duration::ZERO).await.unwrap().into_iter().map(|c| c.call_id).collect();
    assert!(p.b.pending_except(&[], &all, Duration::from_millis(200)).await.unwrap().is_empty());
    assert!(started.elapsed() >= Duration::from_millis(200));
}

both!(each_agent_takes_its_own_results_from_the_run_s_inbox);
async fn each_agent_takes_its_own_results_from_the_run_s_inbox(p: Pair) {
    let of = |owner: Option<&str>| PendingCall {
        owner: owner.map(str::to_owned),
        ..call("external__job", "r", true)
    };
    let lead = p.a.open(of(Some("agent:lead"))).await.unwrap();
    let worker = p.a.open(of(Some("agent:worker"))).await.unwrap();
    let nobody = p.a.open(of(None)).await.unwrap();
    assert_eq!(
        p.b.count_pending("r", Some("agent:lead")).await.unwrap(),
        2,
        "its own and nobody's"
    );
    assert_eq!(p.b.count_pending("r", None).await.unwrap(), 3);
    for id in [&lead, &worker] {
        p.b.resolve(id, answer(id)).await.unwrap();
    }
    let taken = p.a.take_inbox("r", Some("agent:worker")).await.unwrap();
    assert_eq!(taken.iter().map(|e| &e.call_id).collect::<Vec<_>>(), [&worker]);
    assert_eq!(p.a.count_pending("r", Some("agent:worker")).await.unwrap(), 1, "nobody's call");
    p.b.resolve(&nobody, answer("n")).await.unwrap();
    let taken = p.a.take_inbox("r", Some("agent:lead")).await.unwrap();
    assert_eq!(taken.iter().map(|e| &e.call_id).collect::<Vec<_>>(), [&lead, &nobody]);
    assert!(p.a.take_inbox("r", None).await.unwrap().is_empty());
}

/// A call does not expire while its caller waits for it, however short its time to live:
/// a result submitted then reaches the caller. Its time counts from the end of the wait: a
/// late result goes to the inbox for that long (as the caller says), and is refused as
/// expired after.
async fn a_call_waited_for_does_not_expire(p: Pair) {
    let ttl = Duration::from_millis(300);
    let id = p.a.open(call("external__confirm", "r", false)).await.unwrap();
    let (a, waited) = (p.a.clone(), id.clone());
    let waiter = tokio::spawn(async move { a.wait(&waited, Duration::from_secs(3)).await });
    tokio::time::sleep(ttl * 2).await;
    let listed = p.b.pending(&[], Duration::ZERO).await.unwrap();
    assert_eq!(listed.len(), 1, "still listed past its time to live");
    assert_eq!((listed[0].call_id.as_str(), listed[0].status), (id.as_str(), CallStatus::Waiting));
    assert!(listed[0].expires_ms > listed[0].created_ms + 3000, "{:?}", listed[0]);
    assert_eq!(p.b.count_pending("r", None).await.unwrap(), 1);
    assert_eq!(p.b.resolve(&id, answer("yes")).await.unwrap(), Delivery::Waiting);
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
    assert_eq!(got, Some(answer("yes")));

    let late = p.a.open(call("external__confirm", "r", false)).await.unwrap();
    assert_eq!(p.a.wait(&late, ttl * 2).await, None);
    let delivery = p.b.resolve(&late, answer("late")).await.unwrap();
    assert_eq!(delivery, Delivery::Inbox { run_id: "r".into() });
    assert_eq!(p.a.take_inbox("r", None).await.unwrap()[0].result, answer("late"));

    let gone = p.a.open(call("external__confirm", "r", false)).await.unwrap();
    assert_eq!(p.a.wait(&gone, ttl * 2).await, None);
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert!(p.b.pending(&[], Duration::ZERO).await.unwrap().is_empty());
    let refused = p.b.resolve(&gone, answer("too late")).await.unwrap_err();
    assert!(refused.report().contains("expired after 0.3 s"), "{}", refused.report());
    assert_eq!(refused.code(), "gone", "an expired call is gone for good: {refused:?}");
}

mod a_call_waited_for_does_not_expire {
    use std::time::Duration;
    const TTL: Duration = Duration::from_millis(300);
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_memory() {
        super::a_call_waited_for_does_not_expire(super::memory_ttl(TTL)).await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_a_folder() {
        super::a_call_waited_for_does_not_expire(super::folder_ttl(TTL)).await;
    }
}

/// A call whose tool gives it a time to live of its own (`callTtl`) expires after it, in
/// a store whose calls live an hour: listed with that expiry, refused saying so, then and
/// again once the store forgot the call; a synchronous call's time counts from the end of
/// its caller's wait. The other calls keep the store's time.
async fn a_call_lives_as_long_as_its_tool_says(p: Pair) {
    let ttl = Duration::from_millis(300);
    let short = PendingCall { ttl_ms: Some(300), ..call("external__job", "r", true) };
    let short = p.a.open(short).await.unwrap();
    let long = p.a.open(call("external__job", "r", true)).await.unwrap();
    let listed = p.b.pending(&[], Duration::ZERO).await.unwrap();
    let of = |id: &str| listed.iter().find(|c| c.call_id == id).unwrap().clone();
    let (listed_short, listed_long) = (of(&short), of(&long));
    assert_eq!(listed_short.ttl_ms, Some(300), "{listed_short:?}");
    let lives = listed_short.expires_ms.saturating_sub(listed_short.created_ms);
    assert!((250..=350).contains(&lives), "lives {lives} ms: {listed_short:?}");
    assert!(listed_long.expires_ms > listed_long.created_ms + 3_000_000, "{listed_long:?}");

    let waited = PendingCall { ttl_ms: Some(300), ..call("external__ask", "r", false) };
    let waited = p.a.open(waited).await.unwrap();
    assert_eq!(p.a.wait(&waited, Duration::from_millis(200)).await, None);
    let listed = p.b.pending(&[], Duration::ZERO).await.unwrap();
    let after_wait = listed.iter().find(|c| c.call_id == waited).unwrap();
    let lives = after_wait.expires_ms.saturating_sub(after_wait.created_ms);
    // From the end of the wait, not from the opening, nor the store's hour.
    assert!((450..3_000_000).contains(&lives), "{after_wait:?}");

    tokio::time::sleep(ttl + Duration::from_millis(150)).await;
    let listed = p.b.pending(&[], Duration::ZERO).await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, [long.as_str()], "only the store's call is left");
    for id in [&short, &short, &waited] {
        let refused = p.b.resolve(id, answer("late")).await.unwrap_err();
        assert!(refused.report().contains("expired after 0.3 s"), "{}", refused.report());
        assert_eq!(refused.code(), "gone", "{refused:?}");
        let why = p.a.not_pending(id).await.unwrap();
        assert_eq!(why, toolmux_external::NotPending::Expired { ttl }, "{id}");
    }
    assert_eq!(
        p.b.resolve(&long, answer("in time")).await.unwrap(),
        Delivery::Inbox { run_id: "r".into() }
    );
}
both!(a_call_lives_as_long_as_its_tool_says);

/// An `expired.json` written before calls had times to live of their own (each id with
/// when it is forgotten, alone) is read: a result for a call named there is refused as
/// expired after the store's time to live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_list_of_expired_calls_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirPendingStore::open(dir.path()).unwrap();
    let forget = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let forget = forget.as_millis() as u64 + 60_000;
    let list = json!({"ext-old-1": forget}).to_string();
    std::fs::write(dir.path().join("expired.json"), list).unwrap();
    let refused = store.resolve("ext-old-1", answer("late")).await.unwrap_err();
    assert!(refused.report().contains("expired after 3600 s"), "{}", refused.report());
    let why = store.not_pending("ext-old-1").await.unwrap();
    assert_eq!(why, toolmux_external::NotPending::Expired { ttl: Duration::from_secs(3600) });
}

/// Calls expire after their time to live, and a result for one is refused saying so; a
/// result nobody took expires from its inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_and_results_expire_in_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let ttl =
        |s: DirPendingStore| s.with_ttl(Duration::from_millis(300), Duration::from_millis(300));
    let a = ttl(DirPendingStore::open(dir.path()).unwrap());
    let b = ttl(DirPendingStore::open(dir.path()).unwrap());
    let old = a.open(call("external__job", "r", true)).await.unwrap();
    let answered = a.open(call("external__job", "r", true)).await.unwrap();
    b.resolve(&answered, answer("kept a while")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        b.pending(&[], Duration::ZERO).await.unwrap().is_empty(),
        "expired calls are not listed"
    );
    assert_eq!(b.count_pending("r", None).await.unwrap(), 0);
    let refused = b.resolve(&old, answer("late")).await.unwrap_err();
    assert!(refused.report().contains("expired after 0.3 s"), "{}", refused.report());
    assert_eq!(refused.code(), "gone", "{refused:?}");
    // Said again: the folder remembers the expired id.
    let again = a.resolve(&old, answer("late")).await.unwrap_err();
    assert!(again.report().contains("expired"), "{}", again.report());
    assert!(a.take_inbox("r", None).await.unwrap().is_empty(), "the unread result expired too");
}

/// The bound on pending calls holds for every process sharing the folder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_is_for_every_process_sharing_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let small = |s: DirPendingStore| {
        s.with_limits(2, 2, toolmux_external::DEFAULT_PENDING_TTL, Duration::from_secs(60))
    };
    let a = small(DirPendingStore::open(dir.path()).unwrap());
    let b = small(DirPendingStore::open(dir.path()).unwrap());
    a.open(call("external__job", "r", true)).await.unwrap();
    let second = b.open(call("external__job", "r", true)).await.unwrap();
    let full = a.open(call("external__job", "r", true)).await.unwrap_err();
    assert!(matches!(full, ToolError::QueueBusy { .. }), "{full:?}");
    b.resolve(&second, answer("done")).await.unwrap();
    a.open(call("external__job", "r", true)).await.unwrap();
}

/// A call id is a file name in the folder: one that is a path is no call, and reaches no
/// file outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_are_paths_are_no_calls() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirPendingStore::open(dir.path().join("pending")).unwrap();
    let outside = dir.path().join("secret.json");
    std::fs::write(&outside, r#"{"call": 1}"#).unwrap();
    for id in ["../secret", "../../secret", "calls/../x", "", "a b", "x\0y"] {
        let refused = store.resolve(id, answer("x")).await.unwrap_err();
        assert!(refused.report().contains("no pending call"), "{id:?}: {}", refused.report());
        assert_eq!(store.wait(id, Duration::from_millis(10)).await, None);
        store.withdraw(id).await;
    }
    assert!(outside.exists(), "nothing outside the folder is touched");
}

/// The inbox is kept in the folder: a process started later (an agent restarted) reads the
/// results of calls made before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_reads_the_inbox_and_the_calls_left_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let first = DirPendingStore::open(dir.path()).unwrap();
    let job = first.open(call("external__job", "r", true)).await.unwrap();
    let asked = first.open(call("external__confirm", "r", false)).await.unwrap();
    drop(first);
    let later = DirPendingStore::open(dir.path()).unwrap();
    assert_eq!(later.count_pending("r", None).await.unwrap(), 2);
    later.resolve(&job, answer("built")).await.unwrap();
    let inbox = later.take_inbox("r", None).await.unwrap();
    assert_eq!((inbox[0].call_id.as_str(), &inbox[0].result), (job.as_str(), &answer("built")));
    // The caller of `asked` never came to wait; a new process gives up in its stead only
    // once the opening's grace has passed, so the call is still listed as waited for.
    let listed = later.pending(&[], Duration::ZERO).await.unwrap();
    assert_eq!(
        (listed[0].call_id.as_str(), listed[0].status),
        (asked.as_str(), CallStatus::Waiting)
    );
}

/// A caller cancelled while it waits stops waiting in the folder too: a result submitted
/// afterwards goes to the inbox instead of to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_sends_a_later_result_to_the_inbox() {
    let p = folder();
    let id = p.a.open(call("external__confirm", "r", false)).await.unwrap();
    let (a, waiting) = (p.a.clone(), id.clone());
    let waiter = tokio::spawn(async move { a.wait(&waiting, Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.abort();
    let b = p.b.clone();
    toolmux_test_support::eventually("the wait ends in the folder", || {
        let b = b.clone();
        async move {
            b.pending(&[], Duration::ZERO)
                .await
                .unwrap()
                .first()
                .is_some_and(|c| c.status == CallStatus::Pending)
        }
    })
    .await;
    assert_eq!(
        p.b.resolve(&id, answer("late")).await.unwrap(),
        Delivery::Inbox { run_id: "r".into() }
    );
    assert_eq!(p.a.take_inbox("r", None).await.unwrap().len(), 1);
}

/// Another process holding the folder's lock for longer than the second a call's caller
/// allows past its wait does not keep the wait past that: the wait ends in time, saying no
/// result came, and once the folder is free the call is pending and a result submitted
/// then goes to the run's inbox, as does one handed to the wait that it could not take.
/// The wait waited for the lock up to 10 s, to mark the call, take its result and give up,
/// so its caller's time limit cut it, withdrew the call and refused the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_locked_past_the_answer_margin_does_not_hold_a_wait_past_it() {
    let p = folder();
    let dir = p._dir.as_ref().unwrap().path().to_owned();
    let id = p.a.open(call("external__confirm", "r", false)).await.unwrap();
    let answered = p.a.open(call("external__confirm", "r2", false)).await.unwrap();
    assert_eq!(p.b.resolve(&answered, answer("early")).await.unwrap(), Delivery::Waiting);
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".lock"))
        .unwrap();
    lock.lock().unwrap();
    // As the provider's time limit for a call that waits `timeout`: a second more.
    let timeout = Duration::from_millis(300);
    let both = async { tokio::join!(p.a.wait(&id, timeout), p.a.wait(&answered, timeout)) };
    let waited = tokio::time::timeout(timeout + Duration::from_secs(1), both);
    let waited = waited.await.expect("the waits ended within their callers' time limit");
    assert_eq!(waited, (None, None));
    lock.unlock().unwrap();
    let b = p.b.clone();
    let answered_file = dir.join("calls").join(format!("{answered}.json"));
    toolmux_test_support::eventually("the waits end in the folder", || {
        let (b, answered_file) = (b.clone(), answered_file.clone());
        async move {
            let pending = b.pending(&[], Duration::ZERO).await.unwrap();
            let moved = !answered_file.exists();
            moved && pending.len() == 1 && pending[0].status == CallStatus::Pending
        }
    })
    .await;
    assert_eq!(
        p.b.resolve(&id, answer("late")).await.unwrap(),
        Delivery::Inbox { run_id: "r".into() }
    );
    assert_eq!(p.a.take_inbox("r", None).await.unwrap()[0].result, answer("late"));
    assert_eq!(p.a.take_inbox("r2", None).await.unwrap()[0].result, answer("early"));
}

/// A call file nobody can read does not stop the others: it is skipped, then set aside and
/// named in a warning; a result for it says which file is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_call_file_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirPendingStore::open(dir.path()).unwrap();
    let bad = dir.path().join("calls").join("ext-bad-1.json");
    std::fs::write(&bad, b"{\"call\": tru").unwrap();
    assert!(store.pending(&[], Duration::ZERO).await.unwrap().is_empty());
    let id = store.open(call("external__job", "r", true)).await.unwrap();
    assert_eq!(store.pending(&[], Duration::ZERO).await.unwrap()[0].call_id, id);
    assert!(!bad.exists() && bad.with_extension("unreadable").exists());
    let refused = store.resolve("ext-bad-1", answer("x")).await.unwrap_err();
    assert!(refused.report().contains("no pending call"), "{}", refused.report());
    // So is an inbox file: the results that come after it start a new inbox.
    let inbox = dir.path().join("inbox").join("run-r.json");
    std::fs::write(&inbox, b"[{").unwrap();
    assert_eq!(
        store.resolve(&id, answer("done")).await.unwrap(),
        Delivery::Inbox { run_id: "r".into() }
    );
    assert_eq!(store.take_inbox("r", None).await.unwrap()[0].result, answer("done"));
    assert!(inbox.with_extension("unreadable").exists());
}

/// A folder that cannot be read is an error of listing, counting and reading an inbox,
/// never "nothing pending".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_that_cannot_be_read_is_an_error_not_nothing_pending() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirPendingStore::open(dir.path()).unwrap();
    store.open(call("external__job", "r", true)).await.unwrap();
    let calls = dir.path().join("calls");
    std::fs::remove_dir_all(&calls).unwrap();
    std::fs::write(&calls, b"not a folder").unwrap();
    let listed = store.pending(&[], Duration::ZERO).await.unwrap_err();
    assert!(listed.report().contains("calls"), "{}", listed.report());
    let polled = store.pending(&[], Duration::from_millis(200)).await.unwrap_err();
    assert!(polled.report().contains("calls"), "{}", polled.report());
    assert!(store.count_pending("r", None).await.is_err());
    // An inbox is read under the folder's lock: one that cannot be taken fails the read.
    std::fs::remove_file(dir.path().join(".lock")).unwrap();
    std::fs::create_dir(dir.path().join(".lock")).unwrap();
    std::fs::write(dir.path().join("inbox").join("run-r.json"), b"[]").unwrap();
    let inbox = store.take_inbox("r", None).await.unwrap_err();
    assert!(inbox.report().contains(".lock"), "{}", inbox.report());
}

/// A folder removed under the processes using it (a cleaner of temporary files) is made
/// again, private as at the start, and calls go on being made and answered; so are its
/// `calls` and `inbox` folders alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_folder_is_made_again() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("pending");
    let a = DirPendingStore::open(&at).unwrap();
    let b = DirPendingStore::open(&at).unwrap();
    a.open(call("external__job", "r", true)).await.unwrap();
    std::fs::remove_dir_all(&at).unwrap();
    assert!(b.pending(&[], Duration::ZERO).await.unwrap().is_empty(), "gone with the folder");
    assert_eq!(b.count_pending("r", None).await.unwrap(), 0);
    let id = a.open(call("external__job", "r", true)).await.unwrap();
    for made in [at.clone(), at.join("calls"), at.join("inbox")] {
        let mode = std::fs::metadata(&made).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{}", made.display());
    }
    assert_eq!(b.pending(&[], Duration::ZERO).await.unwrap()[0].call_id, id);
    std::fs::remove_dir_all(at.join("inbox")).unwrap();
    assert_eq!(
        b.resolve(&id, answer("done")).await.unwrap(),
        Delivery::Inbox { run_id: "r".into() }
    );
    assert_eq!(a.take_inbox("r", None).await.unwrap()[0].result, answer("done"));
    std::fs::remove_dir_all(at.join("calls")).unwrap();
    let asked = a.open(call("external__confirm", "r", false)).await.unwrap();
    assert_eq!(b.resolve(&asked, answer("yes")).await.unwrap(), Delivery::Waiting);
    assert_eq!(a.wait(&asked, Duration::from_secs(5)).await, Some(answer("yes")));
    // A caller dropped while it waits withdraws its call at once, folder or none.
    let dropped = a.open(call("external__confirm", "r", false)).await.unwrap();
    std::fs::remove_dir_all(&at).unwrap();
    assert!(a.withdraw_now(&dropped));
    assert!(at.join(".lock").exists());
}

/// Times to live too long to count in milliseconds since the epoch (a configuration's way
/// of saying "never") list calls that expire at the end of time, with no overflow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_to_live_past_counting_list_calls_that_never_expire() {
    let forever = Duration::from_millis(u64::MAX);
    let dir = tempfile::tempdir().unwrap();
    let stores: [Store; 2] = [
        Arc::new(MemoryPendingStore::default().with_ttl(forever, forever)),
        Arc::new(DirPendingStore::open(dir.path()).unwrap().with_ttl(forever, forever)),
    ];
    for store in stores {
        let id = store.open(call("external__confirm", "r", false)).await.unwrap();
        assert_eq!(store.wait(&id, Duration::from_millis(10)).await, None);
        let listed = store.pending(&[], Duration::ZERO).await.unwrap();
        assert_eq!(listed[0].expires_ms, u64::MAX, "{store:?}");
        store.resolve(&id, answer("late")).await.unwrap();
        assert_eq!(store.take_inbox("r", None).await.unwrap()[0].result, answer("late"));
    }
}

/// `Duration::MAX` as a time to live, a wait or a poll (the longest a `Duration` holds, past
/// what the clock can add) is taken as for ever, with no overflow: in memory the first
/// call panicked adding it to the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_durations_are_for_ever_with_no_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let stores: [Store; 2] = [
        Arc::new(MemoryPendingStore::default().with_ttl(Duration::MAX, Duration::MAX)),
        Arc::new(DirPendingStore::open(dir.path()).unwrap().with_ttl(Duration::MAX, Duration::MAX)),
    ];
    for store in stores {
        let id = store.open(call("external__confirm", "r", false)).await.unwrap();
        let listed = store.pending(&[], Duration::MAX).await.unwrap();
        assert_eq!(listed[0].expires_ms, u64::MAX, "{store:?}");
        let (waiting, answering) = (store.clone(), store.clone());
        let waiter = tokio::spawn({
            let id = id.clone();
            async move { waiting.wait(&id, Duration::MAX).await }
        });
        toolmux_test_support::eventually("the call is waited for", || {
            let answering = answering.clone();
            let id = id.clone();
            async move {
                let answered = answering.resolve(&id, answer("now")).await;
                matches!(answered, Ok(Delivery::Waiting))
            }
        })
        .await;
        assert_eq!(waiter.await.unwrap(), Some(answer("now")), "{store:?}");
        let id = store.open(call("external__job", "r", true)).await.unwrap();
        store.resolve(&id, answer("later")).await.unwrap();
        assert_eq!(store.take_inbox("r", None).await.unwrap()[0].result, answer("later"));
    }
}

/// A call whose opening is dropped while it waits for the folder's lock (its caller was
/// interrupted) is withdrawn once the opening, which goes on on the blocking pool, makes
/// it: nobody knows its id, so it must not be listed for an answer that reaches an inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_opening_is_dropped_is_not_left_pending() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirPendingStore::open(dir.path()).unwrap();
    let lock = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.path().join(".lock"))
        .unwrap();
    lock.lock().unwrap();
    let opening = {
        let store = store.clone();
        tokio::spawn(async move { store.open(call("external__confirm", "r", false)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!opening.is_finished(), "the opening waits for the lock");
    opening.abort();
    let _ = opening.await;
    lock.unlock().unwrap();
    // Time for the opening to take the lock and end (it tries every few milliseconds).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(store.pending(&[], Duration::ZERO).await.unwrap(), Vec::new());
    let files = std::fs::read_dir(dir.path().join("calls")).unwrap().count();
    assert_eq!(files, 0, "no call file is left");
}

/// Past the bound on runs with unread results, a result bound for yet another run's inbox
/// is refused, saying which bound and what frees a place, and its call stays pending; a
/// result for a run with an inbox already still goes in, and once an inbox is read the
/// refused result goes through. In a folder, the bound is for every process sharing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_with_unread_results_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let memory: Store = Arc::new(MemoryPendingStore::default().with_max_inboxes(2));
    let folder = |dir: &std::path::Path| -> Store {
        Arc::new(DirPendingStore::open(dir).unwrap().with_max_inboxes(2))
    };
    let pairs = [(memory.clone(), memory), (folder(dir.path()), folder(dir.path()))];
    for (a, b) in pairs {
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
        b.resolve(&ids[3], answer("more")).await.expect("r1 has an inbox already");
        assert_eq!(a.take_inbox("r1", None).await.unwrap().len(), 2);
        b.resolve(&ids[2], answer("done")).await.expect("a place was freed");
        assert_eq!(a.take_inbox("r3", None).await.unwrap()[0].result, answer("done"));
    }
}
