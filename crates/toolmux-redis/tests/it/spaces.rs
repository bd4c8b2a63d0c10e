//! Spaces shared by two replicas through Redis: no message lost when both write at once,
//! an agent's state seen through the other replica, a waiting poll woken by the other
//! replica's message, and key holders kept apart.

use crate::{replica, within};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{CallContext, ContentPart, Op, ToolOutput, ToolProvider};
use toolmux_external::{GatewayProvider, Spaces};
use toolmux_test_support::redis::RedisServer;

fn gateway(server: &RedisServer) -> GatewayProvider {
    GatewayProvider::new(Spaces::in_storage(Arc::new(replica(server).space_storage())))
}

fn agent(name: &str, run: &str) -> CallContext {
    let op = Op::new(format!("agent__{name}"), None);
    CallContext::new().with_run_id(run).with_op(Op::new("gateway__x", Some(op)))
}

fn json_of(output: &ToolOutput) -> Value {
    match &output.content[0] {
        ContentPart::Json { value } => value.clone(),
        ContentPart::Text { text } => serde_json::from_str(text).unwrap_or(json!(text)),
        other => panic!("unexpected part {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_spaces_and_lose_no_message() {
    let server = RedisServer::start();
    let (one, two) = (gateway(&server), gateway(&server));
    let (a, b) = (agent("a", "r1"), agent("b", "r2"));
    one.call("enter_space", json!({"space": "ops"}), &a).await.expect("enter");
    two.call("enter_space", json!({"space": "ops"}), &b).await.expect("enter");
    let say = |g: GatewayProvider, ctx: CallContext, who: &'static str| async move {
        for i in 0..20 {
            g.call("send_message", json!({"text": format!("{who} {i}")}), &ctx)
                .await
                .expect("send");
        }
    };
    let first = tokio::spawn(say(one.clone(), a.clone(), "a"));
    let second = tokio::spawn(say(two.clone(), b.clone(), "b"));
    within(Duration::from_secs(30), "writing", async {
        first.await.expect("first");
        second.await.expect("second");
    })
    .await;
    let reader = CallContext::new().with_run_id("reader");
    let page = one
        .call("read_messages", json!({"space": "ops", "limit": 200}), &reader)
        .await
        .expect("read");
    let indexes: Vec<u64> = json_of(&page)["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["index"].as_u64())
        .collect();
    assert_eq!(indexes, (0..40).collect::<Vec<_>>());

    // A's goals, set through one replica, are there through the other.
    one.call("set_goals", json!({"goals": [{"text": "ship"}]}), &a).await.expect("goals");
    let context = json_of(&two.call("context", json!({}), &a).await.expect("context"));
    assert_eq!(context["goals"][0]["text"], "ship");
    assert_eq!(context["activeSpace"], "ops");
    let listed = json_of(&two.call("spaces", json!({}), &reader).await.expect("spaces"));
    assert_eq!(listed["spaces"][0]["members"], json!(["agent:a", "agent:b"]));

    // Another key holder has spaces of its own.
    let tenant = CallContext::new().with_run_id("key:other/s1");
    let theirs = json_of(&two.call("spaces", json!({}), &tenant).await.expect("spaces"));
    assert_eq!(theirs["spaces"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_poll_is_woken_by_the_other_replicas_message() {
    let server = RedisServer::start();
    let (one, two) = (gateway(&server), gateway(&server));
    let a = agent("a", "r1");
    two.call("enter_space", json!({"space": "s"}), &a).await.expect("enter");
    let ui = CallContext::new().with_run_id("ui");
    let start = json_of(&one.call("changes", json!({"space": "s"}), &ui).await.expect("version"));
    let since = start["version"].as_u64().expect("version");
    let waiting = tokio::spawn(async move {
        let args = json!({"space": "s", "since": since, "waitMs": 10_000});
        json_of(&one.call("changes", args, &ui).await.expect("changes"))
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    two.call("send_message", json!({"text": "from the other replica"}), &a).await.expect("send");
    let got = within(Duration::from_secs(5), "the poll", waiting).await.expect("the poll");
    assert_eq!(got["messages"][0]["text"], "from the other replica");
}

/// A replica's write of a space is announced to the others, whose waits look again at
/// once instead of at their next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_announced_to_the_other_replicas() {
    use toolmux_external::spaces::SpaceStorage;
    let server = RedisServer::start();
    let (one, two) = (replica(&server).space_storage(), replica(&server).space_storage());
    let mut notices = one.change_notices().await.expect("Redis tells of changes");
    notices.borrow_and_update();
    two.write("space:s", b"{}").await.expect("write");
    within(Duration::from_secs(5), "the notice", notices.changed()).await.expect("a notice");
    // The state is no space: it is not announced.
    notices.borrow_and_update();
    two.write("state", b"{}").await.expect("write");
    let quiet = tokio::time::timeout(Duration::from_millis(300), notices.changed()).await;
    assert!(quiet.is_err(), "the state's write was announced");
}

/// How many times the server ran `command` since its statistics were last reset.
async fn calls_of(admin: &toolmux_redis::RedisBackend, command: &str) -> u64 {
    let info = admin.client().command(&["INFO", "commandstats"]).await.expect("info");
    let text = info.as_str().unwrap_or_default().to_owned();
    let prefix = format!("cmdstat_{command}:calls=");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A change waiting for the lock another replica holds does not ask Redis every few
/// milliseconds (it asked 200 times a second for up to 10 s), and is woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_the_lock_is_woken_by_its_release_and_does_not_spin() {
    use toolmux_external::spaces::SpaceStorage;
    let server = RedisServer::start();
    let (one, two) = (replica(&server).space_storage(), replica(&server).space_storage());
    let admin = replica(&server);
    let held = one.lock().await.expect("a free lock");
    admin.client().command(&["CONFIG", "RESETSTAT"]).await.expect("reset");
    let waiter = tokio::spawn(async move { two.lock().await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiter.is_finished(), "the lock was taken while held");
    let asked = calls_of(&admin, "set").await;
    assert!(asked <= 30, "the waiter asked for the lock {asked} times in 1.5 s");
    let released = tokio::time::Instant::now();
    one.unlock(&held).await;
    let taken = within(Duration::from_secs(5), "the lock", waiter).await.expect("task");
    assert!(taken.is_ok(), "{taken:?}");
    let took = released.elapsed();
    assert!(took < Duration::from_millis(150), "taken {took:?} after the release");
}

/// A lock taken whose answer was lost with its connection is given back: every replica's
/// changes waited for its 10 s lease, and then failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_answer_was_lost_is_given_back() {
    use toolmux_external::spaces::SpaceStorage;
    let server = RedisServer::start();
    let proxy = crate::CuttingProxy::start(&server).await;
    let cut = toolmux_redis::RedisBackend::new(&toolmux_redis::RedisConfig::new(proxy.url()))
        .expect("valid url")
        .space_storage();
    proxy.cut_next_reply();
    let lost = cut.lock().await;
    assert!(lost.is_err(), "{lost:?}");
    let other = replica(&server).space_storage();
    let started = tokio::time::Instant::now();
    let taken = within(Duration::from_secs(15), "the lock", other.lock()).await;
    assert!(taken.is_ok(), "{taken:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "waited {:?}", started.elapsed());
}
