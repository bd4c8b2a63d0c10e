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

/// Blobs to commit, by key.
fn blobs(writes: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    writes.iter().map(|(key, value)| ((*key).to_owned(), value.as_bytes().to_vec())).collect()
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
    let token = two.lock().await.expect("a free lock");
    two.commit(&token, &blobs(&[("space:s", "{}")])).await.expect("commit");
    within(Duration::from_secs(5), "the notice", notices.changed()).await.expect("a notice");
    // The state is no space: it is not announced.
    notices.borrow_and_update();
    two.commit(&token, &blobs(&[("state", "{}")])).await.expect("commit");
    two.unlock(&token).await;
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

/// The blob `key` of the spaces as stored, read past any lock.
async fn stored(admin: &toolmux_redis::RedisBackend, key: &str) -> Option<String> {
    let key = format!("toolmux:s:{key}");
    let reply = admin.client().command(&["GET", key.as_str()]).await.expect("get");
    reply.as_str().map(str::to_owned)
}

/// A change whose lease ended and whose lock another replica's change then took is refused
/// its commit (and reads): it overwrote the other change's blobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_lost_its_lock_writes_nothing() {
    use toolmux_external::spaces::SpaceStorage;
    let server = RedisServer::start();
    let lease = Duration::from_millis(200);
    let one = replica(&server).space_storage().with_lease(lease);
    let two = replica(&server).space_storage();
    let admin = replica(&server);
    let first = one.lock().await.expect("a free lock");
    assert_eq!(one.read(&first, "space:s").await.expect("read"), None);
    tokio::time::sleep(lease * 2).await;
    let second = within(Duration::from_secs(5), "the lapsed lock", two.lock()).await;
    let second = second.expect("the lock, its lease over");
    two.commit(&second, &blobs(&[("space:s", "second")])).await.expect("the holder's commit");

    let written = blobs(&[("space:s", "first"), ("state", "first")]);
    let refused = one.commit(&first, &written).await.expect_err("a commit without the lock");
    assert!(refused.is_transient(), "{refused:?}");
    let message = refused.to_string();
    assert!(message.contains("lost their lock to another change"), "{message}");
    assert!(message.contains("try again"), "{message}");
    let refused = one.read(&first, "state").await.expect_err("a read without the lock");
    assert!(refused.to_string().contains("lost their lock"), "{refused}");
    assert_eq!(stored(&admin, "space:s").await.as_deref(), Some("second"));
    assert_eq!(stored(&admin, "state").await, None);

    // The first change's release leaves the second's lock alone.
    one.unlock(&first).await;
    two.commit(&second, &blobs(&[("state", "{}")])).await.expect("the holder writes on");
    two.unlock(&second).await;
    assert_eq!(stored(&admin, "lock").await, None);
}

/// Two changes of one replica, each in a task of its own as `Spaces` runs them, keep
/// their tokens apart: the one whose lease ended cannot commit with the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_lost_its_lock_to_a_change_of_its_replica_writes_nothing() {
    use toolmux_external::spaces::SpaceStorage;
    let server = RedisServer::start();
    let lease = Duration::from_millis(200);
    let storage = replica(&server).space_storage().with_lease(lease);
    let admin = replica(&server);
    let (lapsed_tx, lapsed_rx) = tokio::sync::oneshot::channel();
    let (written_tx, written_rx) = tokio::sync::oneshot::channel();
    let slow = storage.clone();
    let slow = tokio::spawn(async move {
        let token = slow.lock().await.expect("a free lock");
        tokio::time::sleep(lease * 2).await;
        lapsed_tx.send(()).expect("the other change waits");
        written_rx.await.expect("the other change wrote");
        let written = slow.commit(&token, &blobs(&[("space:s", "slow")])).await;
        slow.unlock(&token).await;
        written
    });
    let fast = storage.clone();
    let fast = tokio::spawn(async move {
        lapsed_rx.await.expect("the slow change's lease ended");
        let token = fast.lock().await.expect("the lock, its lease over");
        fast.commit(&token, &blobs(&[("space:s", "fast")])).await.expect("the holder's commit");
        written_tx.send(()).expect("the slow change waits");
        token
    });
    let token = within(Duration::from_secs(10), "the fast change", fast).await.expect("task");
    let written = within(Duration::from_secs(10), "the slow change", slow).await.expect("task");
    assert!(written.is_err(), "the slow change wrote with the lock of the fast one");
    assert_eq!(stored(&admin, "space:s").await.as_deref(), Some("fast"));
    // The fast change's lock is still taken (by its token, which the slow one did not free).
    assert_eq!(stored(&admin, "lock").await.as_deref(), Some(token.as_str()));
}

/// A change that reaches Redis more often than its lease keeps its lock however long it
/// takes in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_keeps_writing_keeps_its_lock() {
    use toolmux_external::spaces::SpaceStorage;
    let server = RedisServer::start();
    let lease = Duration::from_secs(1);
    let storage = replica(&server).space_storage().with_lease(lease);
    let token = storage.lock().await.expect("a free lock");
    for i in 0..12 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let value = format!("{i}");
        let written = storage.commit(&token, &blobs(&[("space:s", &value)])).await;
        written.expect("a commit within the lease");
    }
    storage.unlock(&token).await;
}

/// A commit with a token that does not hold the lock is refused, writing nothing: it could
/// overwrite a change under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_without_the_lock_is_refused() {
    use toolmux_external::spaces::SpaceStorage;
    let server = RedisServer::start();
    let storage = replica(&server).space_storage();
    let written = blobs(&[("state", "{}")]);
    let refused = storage.commit("no-lock", &written).await.expect_err("a commit without the lock");
    assert!(refused.to_string().contains("lost their lock"), "{refused}");
    let held = storage.lock().await.expect("a free lock");
    let refused = storage.commit("another", &written).await.expect_err("another's token");
    assert!(refused.to_string().contains("lost their lock"), "{refused}");
    assert_eq!(stored(&replica(&server), "state").await, None);
    storage.unlock(&held).await;
}

/// Redis spaces whose lock another replica takes over as the change is about to commit
/// (a change that outlived its lease while it ran).
#[derive(Debug)]
struct TakenOver {
    inner: toolmux_redis::RedisSpaceStorage,
    admin: toolmux_redis::RedisBackend,
}

#[async_trait::async_trait]
impl toolmux_external::spaces::SpaceStorage for TakenOver {
    async fn lock(&self) -> Result<String, toolmux_core::ToolError> {
        self.inner.lock().await
    }
    async fn unlock(&self, token: &str) {
        self.inner.unlock(token).await;
    }
    async fn read(
        &self,
        token: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, toolmux_core::ToolError> {
        self.inner.read(token, key).await
    }
    async fn commit(
        &self,
        token: &str,
        writes: &[(String, Vec<u8>)],
    ) -> Result<(), toolmux_core::ToolError> {
        let args = ["SET", "toolmux:s:lock", "another-replica"];
        self.admin.client().command(&args).await.expect("take the lock over");
        self.inner.commit(token, writes).await
    }
    async fn space_names(&self) -> Result<Vec<String>, toolmux_core::ToolError> {
        self.inner.space_names().await
    }
}

/// A change that makes a space (its blob and the agents' state) and whose lock another
/// replica took over midway writes nothing: its blobs were written one by one, and one
/// that lost the lock between two writes left the space written and the state not (this
/// test, with the lock taken over after the first write, failed so before commits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_lock_is_taken_over_midway_writes_nothing() {
    let server = RedisServer::start();
    let admin = replica(&server);
    let storage = TakenOver { inner: replica(&server).space_storage(), admin: replica(&server) };
    let gateway = GatewayProvider::new(Spaces::in_storage(Arc::new(storage)));
    let refused = gateway.call("enter_space", json!({"space": "ops"}), &agent("a", "r1")).await;
    let refused = refused.expect_err("the change lost its lock");
    assert!(refused.to_string().contains("lost their lock to another change"), "{refused}");
    assert_eq!(stored(&admin, "space:ops").await, None, "a part of the change was written");
    assert_eq!(stored(&admin, "state").await, None, "a part of the change was written");
    assert_eq!(stored(&admin, "lock").await.as_deref(), Some("another-replica"));
}

/// A commit writes every blob it is given, announcing each space (and only spaces).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_writes_all_its_blobs() {
    use toolmux_external::spaces::SpaceStorage;
    let server = RedisServer::start();
    let (storage, admin) = (replica(&server).space_storage(), replica(&server));
    let token = storage.lock().await.expect("a free lock");
    let written = blobs(&[("space:a", "1"), ("space:b", "2"), ("state", "3")]);
    storage.commit(&token, &written).await.expect("commit");
    storage.unlock(&token).await;
    assert_eq!(stored(&admin, "space:a").await.as_deref(), Some("1"));
    assert_eq!(stored(&admin, "space:b").await.as_deref(), Some("2"));
    assert_eq!(stored(&admin, "state").await.as_deref(), Some("3"));
    assert_eq!(storage.space_names().await.expect("names"), ["a", "b"]);
}
