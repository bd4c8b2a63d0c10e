//! Replicas sharing a real `redis-server`: two fixture servers (real processes) record
//! their sessions and tasks there, and a request of a task or session the other replica
//! keeps is forwarded to it.

use crate::support::{FixtureProcess, http_fixture, install_crypto, within};
use serde_json::{Value, json};
use std::io::{Read as _, Write as _};
use toolmux_test_support::redis::RedisServer;

const ALICE: &str = "alice-key-0123456789";
const BOB: &str = "bob-key-0123456789ab";

/// One fixture server sharing `redis`, with `hang` run as a task and the keys of alice
/// and bob; killed when dropped.
struct Replica {
    /// `http://127.0.0.1:PORT`, as it records itself.
    base: String,
    process: FixtureProcess,
}

impl Replica {
    async fn start(redis: &RedisServer, address: &str) -> Replica {
        let redis = format!("127.0.0.1:{}", redis.port());
        let (alice, bob) = (format!("alice={ALICE}"), format!("bob={BOB}"));
        let args = ["--redis", &redis, "--task-tools", "hang", "--api-key", &alice];
        let process = http_fixture(address, &[&args[..], &["--api-key", &bob]].concat()).await;
        let base = process.url.trim_end_matches("/mcp").to_owned();
        Replica { base, process }
    }

    fn url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// SIGKILL: nothing is cleaned up, its records stay in Redis.
    async fn crash(mut self) {
        let mut child = self.process.child.0.take().expect("running");
        child.start_kill().expect("killed");
        within(child.wait()).await.expect("reaped");
    }
}

/// POSTs `body` to `url` with `key`, within `session` (2025-11-25) or stateless
/// (2026-07-28); the status, the session the answer names and the JSON-RPC answer
/// (`null` when there is none).
async fn post(
    url: &str,
    session: Option<&str>,
    key: &str,
    body: &Value,
) -> (u16, Option<String>, Value) {
    install_crypto();
    let mut request = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client")
        .post(url)
        .bearer_auth(key)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json");
    request = match session {
        Some(session) => {
            request.header("mcp-session-id", session).header("mcp-protocol-version", "2025-11-25")
        }
        None if body["method"] == "initialize" => request,
        None => {
            let request = request
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", body["method"].as_str().expect("a method"));
            match body["params"]["taskId"].as_str() {
                Some(task) => request.header("mcp-name", task),
                None => request,
            }
        }
    };
    let response = within(request.body(body.to_string()).send()).await.expect("an answer");
    let status = response.status().as_u16();
    let named = response.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_owned());
    let text = within(response.text()).await.expect("a body");
    let answer = serde_json::from_str::<Value>(&text).ok().or_else(|| {
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|message| message.get("id").is_some())
    });
    (status, named, answer.unwrap_or_default())
}

/// A session at `url` for `key`, declaring the tasks extension.
async fn initialize(url: &str, key: &str) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        "clientInfo": {"name": "raw", "version": "1"}
    }});
    let (status, session, answer) = post(url, None, key, &body).await;
    assert_eq!(status, 200, "{answer}");
    let session = session.expect("a session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _, _) = post(url, Some(&session), key, &initialized).await;
    assert_eq!(status, 202);
    session
}

/// A `tasks/*` request of `task`; stateless when `session` is `None`.
fn task_request(method: &str, task: &str, session: Option<&str>) -> Value {
    let mut params = json!({"taskId": task});
    if session.is_none() {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities":
                {"extensions": {"io.modelcontextprotocol/tasks": {}}}
        });
    }
    json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params})
}

/// Sends `method` of `task` to `url`; the JSON-RPC answer.
async fn task(url: &str, method: &str, task: &str, session: Option<&str>, key: &str) -> Value {
    let (status, _, answer) = post(url, session, key, &task_request(method, task, session)).await;
    assert_eq!(status, 200, "{method} of {task}: {answer}");
    answer
}

/// A call of `hang` run as a task in `session` at `url`; its id.
async fn start_task(url: &str, session: &str) -> String {
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "hang", "arguments": {}}});
    let (status, _, created) = post(url, Some(session), ALICE, &call).await;
    assert_eq!(status, 200, "{created}");
    created["result"]["taskId"].as_str().unwrap_or_else(|| panic!("no task: {created}")).to_owned()
}

/// The value of `key` in the Redis at `port`.
fn redis_get(port: u16, key: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("redis");
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).expect("a timeout");
    write!(stream, "*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).expect("sent");
    let mut reply = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).expect("a reply");
        reply.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&reply).into_owned();
        if text.starts_with("$-1\r\n") {
            return None;
        }
        if let Some((head, rest)) = text.split_once("\r\n")
            && let Some(len) = head.strip_prefix('$').and_then(|l| l.parse::<usize>().ok())
            && rest.len() >= len
        {
            return Some(rest[..len].to_owned());
        }
        assert!(n > 0, "redis closed the connection: {text}");
    }
}

fn error_of(answer: &Value) -> (i64, String) {
    let code = answer["error"]["code"].as_i64().unwrap_or_else(|| panic!("no error: {answer}"));
    (code, answer["error"]["message"].as_str().unwrap_or_default().to_owned())
}

/// A task made at one replica is polled, cancelled and read at the other, within a
/// session of the other replica and without one (the stateless revision), by its key
/// holder only; once its replica is gone it is unknown, and the answer says why.
#[tokio::test]
async fn a_task_is_reached_from_any_replica_until_its_replica_is_gone() {
    let redis = RedisServer::start();
    let a = Replica::start(&redis, "127.0.0.1:0").await;
    let b = Replica::start(&redis, "127.0.0.1:0").await;
    let at_a = initialize(&a.url(), ALICE).await;
    let id = start_task(&a.url(), &at_a).await;
    assert_eq!(redis_get(redis.port(), &format!("fixture:task:{id}")), Some(a.base.clone()));
    // A session named as the task's record is no session: not found, the record untouched.
    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    let (status, _, answer) = post(&b.url(), Some(&format!("task:{id}")), ALICE, &ping).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(redis_get(redis.port(), &format!("fixture:task:{id}")), Some(a.base.clone()));

    let got = task(&b.url(), "tasks/get", &id, None, ALICE).await;
    assert_eq!(got["result"]["status"], "working", "stateless at the other replica: {got}");
    assert_eq!(got["result"]["taskId"], id.as_str(), "{got}");
    let at_b = initialize(&b.url(), ALICE).await;
    let got = task(&b.url(), "tasks/get", &id, Some(&at_b), ALICE).await;
    assert_eq!(got["result"]["status"], "working", "in a session of the other replica: {got}");
    assert_eq!(got["id"], 9, "{got}");

    // The task's replica checks the key again: another holder is told it is unknown.
    let other = task(&b.url(), "tasks/get", &id, None, BOB).await;
    let (code, message) = error_of(&other);
    assert_eq!(code, -32602, "{other}");
    assert!(message.contains("unknown task") && !message.contains("gone"), "{message}");

    let cancelled = task(&b.url(), "tasks/cancel", &id, Some(&at_b), ALICE).await;
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    let got = task(&a.url(), "tasks/get", &id, Some(&at_a), ALICE).await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");

    let base = a.base.clone();
    a.crash().await;
    let gone = task(&b.url(), "tasks/get", &id, Some(&at_b), ALICE).await;
    let (code, message) = error_of(&gone);
    assert_eq!(code, -32602, "{gone}");
    assert!(
        message.contains(&format!("unknown task `{id}`")) && message.contains("gone"),
        "{message}"
    );
    assert_eq!(redis_get(redis.port(), &format!("fixture:task:{id}")), None, "{base}'s record");
}

/// A replica restarted at the same address removes the records its earlier life left at
/// the first request naming them: its sessions' (at once, rather than after their 60 s)
/// and its tasks', whose requests are told the task's replica is gone.
#[tokio::test]
async fn a_replica_restarted_at_its_address_drops_its_earlier_records() {
    let redis = RedisServer::start();
    let a = Replica::start(&redis, "127.0.0.1:0").await;
    let b = Replica::start(&redis, "127.0.0.1:0").await;
    let session = initialize(&a.url(), ALICE).await;
    let id = start_task(&a.url(), &session).await;
    let record = format!("fixture:{session}");
    assert_eq!(redis_get(redis.port(), &record), Some(a.base.clone()));
    let address = a.base.trim_start_matches("http://").to_owned();
    a.crash().await;
    let a = Replica::start(&redis, &address).await;

    let ping = json!({"jsonrpc": "2.0", "id": 3, "method": "ping"});
    let (status, _, answer) = post(&b.url(), Some(&session), ALICE, &ping).await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(redis_get(redis.port(), &record), None, "the dead session's record");

    let gone = task(&b.url(), "tasks/get", &id, None, ALICE).await;
    let (code, message) = error_of(&gone);
    assert_eq!(code, -32602, "{gone}");
    assert!(message.contains("gone"), "{message}");
    assert_eq!(redis_get(redis.port(), &format!("fixture:task:{id}")), None);

    // The restarted replica's own sessions and tasks are served across replicas as ever.
    let fresh = initialize(&a.url(), ALICE).await;
    let (status, _, answer) = post(&b.url(), Some(&fresh), ALICE, &ping).await;
    assert_eq!((status, &answer["id"]), (200, &json!(3)), "{answer}");
}

/// A stateless request's next round completes at the other replica, as a round-robin
/// balancer sends it: the replicas seal `requestState` with the one key kept in Redis
/// (under `fixture:seal-key`, 64 hex digits), where each keyed its own before and the
/// other replica failed the round's verification.
#[tokio::test]
async fn a_stateless_next_round_completes_at_the_other_replica() {
    use crate::http::stateless_round_answer;
    let redis = RedisServer::start();
    let a = Replica::start(&redis, "127.0.0.1:0").await;
    let b = Replica::start(&redis, "127.0.0.1:0").await;
    let tool = "test_input_required_result_elicitation";
    let first = stateless_round_answer(&a.url(), tool, json!({}), json!({}), Some(ALICE)).await;
    let result = &first["result"];
    assert_eq!(result["resultType"], "input_required", "{first}");
    let answer = json!({"action": "accept", "content": {"name": "Ada"}});
    let next = json!({"requestState": result["requestState"],
        "inputResponses": {"user_name": answer}});
    let at_b = stateless_round_answer(&b.url(), tool, json!({}), next, Some(ALICE)).await;
    assert_eq!(at_b["result"]["content"][0]["text"], "Hello, Ada!", "{at_b}");
    let key = redis_get(redis.port(), "fixture:seal-key").expect("the shared key");
    assert!(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
}
