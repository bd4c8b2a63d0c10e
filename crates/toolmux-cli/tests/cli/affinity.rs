//! Sessions across replicas: two `toolmux serve --http` processes sharing one Redis
//! (`backend.redis`) stand behind a round-robin balancer, and a request naming a session
//! the other replica made is forwarded to it.

use super::{Project, peer};
use serde_json::{Value, json};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One `toolmux serve --http 127.0.0.1:0`, killed when dropped; its log is kept.
struct Replica {
    child: Child,
    address: String,
    log: Arc<Mutex<String>>,
}

impl Replica {
    fn start(project: &Project) -> Replica {
        Replica::start_with(project, "127.0.0.1:0", &[])
    }

    /// `toolmux serve --http ADDRESS` with `extra` arguments.
    fn start_with(project: &Project, address: &str, extra: &[&str]) -> Replica {
        let (child, mut stderr, url, seen) =
            super::serve::start_serving_http(project, address, extra, Stdio::null());
        let log = Arc::new(Mutex::new(seen));
        let kept = log.clone();
        // Drained so that a chatty log never blocks the server on a full pipe.
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
            kept.lock().unwrap_or_else(|e| e.into_inner()).push_str(&rest);
        });
        let address = url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .replace("0.0.0.0", "127.0.0.1");
        Replica { child, address, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// SIGTERM, as a service manager stops it; waits for the exit.
    fn stop(&mut self) {
        crate::send_signal(&self.child, "TERM");
        let stopped = crate::exit_within(&mut self.child, Duration::from_secs(30));
        assert!(stopped.is_some(), "toolmux did not stop within 30 s");
    }

    /// SIGKILL: a crash, nothing cleaned up.
    fn crash(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.crash();
    }
}

/// An HTTP/1.1 response: status, headers (names lowercase) and body (SSE as it came).
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC messages of the body: JSON, or the `data:` lines of an event stream.
    fn messages(&self) -> Vec<Value> {
        if let Ok(one) = serde_json::from_str::<Value>(&self.body) {
            return vec![one];
        }
        self.body
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str(data.trim()).ok())
            .collect()
    }

    /// The message answering request `id`.
    fn answer(&self, id: i64) -> Value {
        self.messages()
            .into_iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no answer to request {id}: {self:?}"))
    }
}

/// Sends `method` to `/mcp` at `address` with `session`, and reads the whole answer
/// (`Connection: close`), chunked transfer decoded.
fn exchange(address: &str, method: &str, session: Option<&str>, body: &Value) -> Answer {
    exchange_with(address, method, session, &[], body)
}

/// [`exchange`] with `headers` besides the protocol's.
fn exchange_with(
    address: &str,
    method: &str,
    session: Option<&str>,
    headers: &[(&str, &str)],
    body: &Value,
) -> Answer {
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("a timeout");
    send_with(&mut stream, address, method, session, headers, body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    parse(&raw)
}

fn send(
    stream: &mut std::net::TcpStream,
    address: &str,
    method: &str,
    session: Option<&str>,
    body: &Value,
) {
    send_with(stream, address, method, session, &[], body);
}

fn send_with(
    stream: &mut std::net::TcpStream,
    address: &str,
    method: &str,
    session: Option<&str>,
    headers: &[(&str, &str)],
    body: &Value,
) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let session = session.map(|s| format!("Mcp-Session-Id: {s}\r\n")).unwrap_or_default();
    let extra: String = headers.iter().map(|(n, v)| format!("{n}: {v}\r\n")).collect();
    let accept =
        if method == "GET" { "text/event-stream" } else { "application/json, text/event-stream" };
    let request = format!(
        "{method} /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Accept: {accept}\r\nMCP-Protocol-Version: 2025-06-18\r\n{extra}\
         {session}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
}

fn parse(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked { dechunk(rest) } else { rest.to_owned() };
    Answer { status, headers, body }
}

fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || after.len() < size {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").unwrap_or(&after[size..]);
    }
    body
}

/// Starts a session at `address` (`initialize`).
fn initialize(address: &str) -> String {
    initialize_with(address, &[])
}

/// [`initialize`] with `headers`.
fn initialize_with(address: &str, headers: &[(&str, &str)]) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let answer = exchange_with(address, "POST", None, headers, &init);
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.header("mcp-session-id").expect("a session id").to_owned()
}

/// The sessions recorded in `redis` (`KEYS toolmux:session:*`), by a bare RESP exchange.
fn session_records(redis: &toolmux_test_support::redis::RedisServer) -> usize {
    redis_keys(redis, "toolmux:session:*")
}

/// How many keys of `redis` match `pattern`.
fn redis_keys(redis: &toolmux_test_support::redis::RedisServer, pattern: &str) -> usize {
    let mut stream =
        std::net::TcpStream::connect(("127.0.0.1", redis.port())).expect("connect to redis");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
    let command = format!("*2\r\n$4\r\nKEYS\r\n${}\r\n{pattern}\r\n", pattern.len());
    stream.write_all(command.as_bytes()).expect("send to redis");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("redis answers");
    line.trim().strip_prefix('*').and_then(|n| n.parse().ok()).expect("an array of keys")
}

/// Two replicas with their own folders and one Redis.
fn replicas(redis: &toolmux_test_support::redis::RedisServer) -> (Replica, Replica, [Project; 2]) {
    let node = peer("node/node_modules/.bin/node");
    let everything =
        peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let config = format!(
        "fs: {{}}\nmcpServers:\n  everything:\n    command: {}\n    args: [{}, stdio]\n\
         backend:\n  redis: {{url: '{}'}}\n",
        node.display(),
        everything.display(),
        redis.url()
    );
    let projects = [Project::new(), Project::new()];
    for project in &projects {
        project.file("notes.md", "TODO: replicas\n").file("toolmux.yaml", &config);
    }
    let a = Replica::start(&projects[0]);
    let b = Replica::start(&projects[1]);
    (a, b, projects)
}

/// A session made by replica A is served through replica B: its tools listed and called, a
/// call's progress streamed as it comes, and its end through B ends it on A.
#[test]
fn a_session_made_on_one_replica_is_served_through_another() {
    let redis = toolmux_test_support::redis::RedisServer::start();
    let (a, b, _projects) = replicas(&redis);
    let session = initialize(&a.address);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let answer = exchange(&b.address, "POST", Some(&session), &initialized);
    assert_eq!(answer.status, 202, "{answer:?}\nA:\n{}\nB:\n{}", a.log(), b.log());

    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let answer = exchange(&b.address, "POST", Some(&session), &list);
    assert_eq!(answer.status, 200, "{answer:?}");
    let tools = answer.answer(1);
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"fs__grep"), "{names:?}");

    let grep = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "fs__grep", "arguments": {"pattern": "TODO"}}});
    let answer = exchange(&b.address, "POST", Some(&session), &grep);
    assert_eq!(answer.answer(2)["result"]["content"][0]["text"], "notes.md", "{answer:?}");

    // Three reports a second apart: the first reaches the client through B before the
    // answer exists, so B streams rather than buffering the answer whole.
    let long = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "everything__trigger-long-running-operation",
        "arguments": {"duration": 3, "steps": 3}, "_meta": {"progressToken": "p3"}}});
    let mut stream = std::net::TcpStream::connect(&b.address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("a timeout");
    send(&mut stream, &b.address, "POST", Some(&session), &long);
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(&raw).contains("notifications/progress") {
        assert!(
            Instant::now() < deadline,
            "no progress through B: {}",
            String::from_utf8_lossy(&raw)
        );
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "the stream ended without progress: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&chunk[..n]);
    }
    assert!(
        !String::from_utf8_lossy(&raw).contains("Long running operation completed"),
        "the answer came with the first progress report: {}",
        String::from_utf8_lossy(&raw)
    );
    let _ = stream.read_to_end(&mut raw);
    let answer = parse(&raw);
    let progress =
        answer.messages().iter().filter(|m| m["method"] == "notifications/progress").count();
    assert_eq!(progress, 3, "{answer:?}");
    let done = answer.answer(3);
    assert!(
        done["result"]["content"][0]["text"].as_str().unwrap_or_default().contains("completed"),
        "{done}"
    );

    // The session's GET stream through B: A's stream, its first event as A sent it.
    let mut listen = std::net::TcpStream::connect(&b.address).expect("connect");
    listen.set_read_timeout(Some(Duration::from_secs(30))).expect("a timeout");
    send(&mut listen, &b.address, "GET", Some(&session), &Value::Null);
    let mut raw = Vec::new();
    while !String::from_utf8_lossy(&raw).contains("\r\n\r\n")
        || !String::from_utf8_lossy(&raw).contains("retry:")
    {
        let n = listen.read(&mut chunk).expect("read the GET stream");
        assert!(n > 0, "the GET stream ended: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&chunk[..n]);
    }
    let opened = parse(&raw);
    assert_eq!(opened.status, 200, "{opened:?}");
    assert_eq!(opened.header("content-type"), Some("text/event-stream"), "{opened:?}");
    assert!(opened.body.contains("retry:"), "A's first event: {opened:?}");
    drop(listen);

    // A forwarded request is served where it arrives, never forwarded again.
    let marked = [("X-Toolmux-Forwarded", "1")];
    let ping = json!({"jsonrpc": "2.0", "id": 4, "method": "ping"});
    assert_eq!(exchange_with(&b.address, "POST", Some(&session), &marked, &ping).status, 404);
    assert_eq!(session_records(&redis), 1);

    // Ended through B: A knows it no more, and its record is gone.
    let answer = exchange(&b.address, "DELETE", Some(&session), &Value::Null);
    assert!(answer.status == 200 || answer.status == 202, "{answer:?}");
    assert_eq!(exchange(&a.address, "POST", Some(&session), &ping).status, 404);
    assert_eq!(exchange(&b.address, "POST", Some(&session), &ping).status, 404);
    assert_eq!(session_records(&redis), 0);
}

/// A replica that crashed answers for its sessions no more: the other answers 404 at
/// once, so that the client starts another session, and forgets the session's owner.
#[test]
fn a_session_of_a_crashed_replica_is_not_found_promptly() {
    let redis = toolmux_test_support::redis::RedisServer::start();
    let (mut a, b, _projects) = replicas(&redis);
    let session = initialize(&a.address);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let answer = exchange(&b.address, "POST", Some(&session), &ping);
    assert_eq!(answer.status, 200, "{answer:?}\nA:\n{}\nB:\n{}", a.log(), b.log());
    assert_eq!(answer.answer(1)["result"], json!({}), "{answer:?}");
    a.crash();
    let started = Instant::now();
    let answer = exchange(&b.address, "POST", Some(&session), &ping);
    assert_eq!(answer.status, 404, "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let error = answer.answer(1);
    assert!(
        error["error"]["message"].as_str().unwrap_or_default().contains("initialize"),
        "{error}"
    );
    // Forgotten: a new session through B works, and the old one stays unknown.
    let fresh = initialize(&b.address);
    assert_ne!(fresh, session);
    assert_eq!(exchange(&b.address, "POST", Some(&session), &ping).status, 404);
    assert_eq!(session_records(&redis), 1, "only B's new session is recorded");
}

/// `serve.maxSessions` bounds the sessions one process holds: a new one ends the session
/// unused the longest. (A single replica, here for the raw exchange helpers.)
#[test]
fn serve_max_sessions_ends_the_session_unused_the_longest() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\nserve: {maxSessions: 1}\n");
    let replica = Replica::start(&project);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let first = initialize(&replica.address);
    assert_eq!(exchange(&replica.address, "POST", Some(&first), &ping).status, 200);
    let second = initialize(&replica.address);
    let answer = exchange(&replica.address, "POST", Some(&first), &ping);
    assert_eq!(answer.status, 404, "{answer:?}\n{}", replica.log());
    let answer = exchange(&replica.address, "POST", Some(&second), &ping);
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// A replica that stops (SIGTERM) removes its sessions' records on the way out.
#[test]
fn a_replica_that_stops_removes_its_sessions_records() {
    let redis = toolmux_test_support::redis::RedisServer::start();
    let (mut a, _b, _projects) = replicas(&redis);
    initialize(&a.address);
    initialize(&a.address);
    assert_eq!(session_records(&redis), 2);
    a.stop();
    assert_eq!(session_records(&redis), 0, "{}", a.log());
}

/// With API keys, a forwarded request carries the client's key and the holder checks it
/// again: the replica it reached refuses a request without one, as the holder refuses
/// another holder's key for the session.
#[test]
fn forwarded_requests_carry_the_clients_key() {
    const KEY: &str = "k3y-for-affinity-tests-0123456789";
    const OTHER: &str = "other-k3y-for-affinity-tests-0123";
    let redis = toolmux_test_support::redis::RedisServer::start();
    let config = format!(
        "fs: {{}}\nserve:\n  apiKeys: {{alice: '{KEY}', bob: '{OTHER}'}}\n\
         backend:\n  redis: {{url: '{}'}}\n",
        redis.url()
    );
    let projects = [Project::new(), Project::new()];
    for project in &projects {
        project.file("toolmux.yaml", &config);
    }
    let a = Replica::start(&projects[0]);
    let b = Replica::start(&projects[1]);
    let alice = format!("Bearer {KEY}");
    let session = initialize_with(&a.address, &[("Authorization", &alice)]);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let with = |headers: &[(&str, &str)]| {
        exchange_with(&b.address, "POST", Some(&session), headers, &ping)
    };
    let answer = with(&[("Authorization", &alice)]);
    assert_eq!(answer.status, 200, "{answer:?}\nA:\n{}\nB:\n{}", a.log(), b.log());
    assert_eq!(with(&[("X-API-Key", KEY)]).status, 200);
    assert_eq!(with(&[]).status, 401);
    assert_eq!(with(&[("Authorization", "Bearer wrong")]).status, 401);
    // Bob's key is valid at B; A, holding Alice's session, does not let Bob use it.
    assert_eq!(with(&[("Authorization", &format!("Bearer {OTHER}"))]).status, 404);
}

/// Bound to every address without `advertiseUrl`, a replica cannot tell where the others
/// reach it: it says so at start, naming the key, and records no session; it shares the
/// key of `requestState` all the same (which needs no address), so that a stateless
/// request's next round may reach another replica. (It kept a key of its own.)
#[test]
fn a_replica_on_every_address_without_an_advertised_url_says_so_and_records_nothing() {
    const KEY: &str = "k3y-for-affinity-tests-0123456789";
    let redis = toolmux_test_support::redis::RedisServer::start();
    let project = Project::new().env("CI_KEY", KEY);
    project.file(
        "toolmux.yaml",
        &format!("fs: {{}}\nbackend:\n  redis: {{url: '{}'}}\n", redis.url()),
    );
    let a = Replica::start_with(&project, "0.0.0.0:0", &["--api-key-env", "CI_KEY"]);
    initialize_with(&a.address, &[("Authorization", &format!("Bearer {KEY}"))]);
    assert_eq!(session_records(&redis), 0);
    let log = a.log();
    assert_eq!(log.matches("backend.redis.advertiseUrl").count(), 1, "{log}");
    assert_eq!(redis_keys(&redis, "toolmux:mcp:seal-key"), 1, "the key is shared\n{log}");
}
