//! The streamable HTTP protocol as a demanding client meets it, with raw requests: the
//! status codes and JSON-RPC errors of messages that are wrong, sessions that are gone,
//! and streams resumed after a disconnect.

use crate::provider::Fixture;
use crate::support::{HttpServer, within};
use serde_json::{Value, json};
use std::sync::Arc;
use toolmux_mcp::server::ServeOptions;

/// A session of the handshake revisions, made with raw requests.
pub(crate) struct RawSession {
    client: reqwest::Client,
    url: String,
    id: String,
}

/// What the server answered: the status and the body.
pub(crate) struct Answered {
    pub(crate) status: u16,
    pub(crate) body: String,
}

impl Answered {
    /// The JSON-RPC message of the body: the body itself, or the last `data:` line of an
    /// event stream.
    pub(crate) fn message(&self) -> Value {
        let json =
            self.body.lines().rev().find_map(|l| l.strip_prefix("data:")).unwrap_or(&self.body);
        serde_json::from_str(json.trim())
            .unwrap_or_else(|e| panic!("no JSON-RPC message ({e}): {}", self.body))
    }
}

impl RawSession {
    pub(crate) async fn open(url: &str) -> RawSession {
        crate::support::install_crypto();
        let client = reqwest::Client::new();
        let initialize = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"}
            }
        });
        let response = within(
            client
                .post(url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .body(initialize.to_string())
                .send(),
        )
        .await
        .expect("initialize answered");
        let id = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
        let _ = within(response.text()).await;
        let session = RawSession { client, url: url.to_owned(), id };
        let initialized = session
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string())
            .await;
        assert_eq!(initialized.status, 202, "{}", initialized.body);
        session
    }

    /// A POST of `body` (sent as it is) in this session.
    pub(crate) async fn post(&self, body: &str) -> Answered {
        let response = within(
            self.client
                .post(&self.url)
                .header("accept", "application/json, text/event-stream")
                .header("content-type", "application/json")
                .header("mcp-session-id", &self.id)
                .header("mcp-protocol-version", "2025-11-25")
                .body(body.to_owned())
                .send(),
        )
        .await
        .expect("a response");
        let status = response.status().as_u16();
        Answered { status, body: within(response.text()).await.expect("a body") }
    }

    /// The error a request with `method` and `params` is answered with.
    async fn error(&self, method: &str, params: Value) -> Value {
        let request = json!({"jsonrpc": "2.0", "id": 9, "method": method, "params": params});
        let answered = self.post(&request.to_string()).await;
        assert_eq!(answered.status, 200, "{}", answered.body);
        let message = answered.message();
        assert_eq!(message["id"], 9, "{message}");
        message["error"].clone()
    }
}

/// A request of one of MCP's methods whose `params` do not fit is `-32602` (invalid
/// params) saying what is wrong, not `-32601` (method not found) with the method's name
/// as the whole message; an unknown method says that it is unknown.
#[tokio::test]
async fn params_that_do_not_fit_are_invalid_params() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let cases = [
        ("logging/setLevel", json!({"level": "loud"}), "loud"),
        ("tools/call", json!({}), "name"),
        ("tools/call", json!({"name": "echo", "arguments": 5}), "arguments"),
        ("prompts/get", json!({"arguments": {}}), "name"),
        ("resources/read", json!({"uri": 7}), "uri"),
        ("completion/complete", json!({"argument": {"name": "a", "value": "b"}}), "ref"),
    ];
    for (method, params, named) in cases {
        let error = session.error(method, params.clone()).await;
        assert_eq!(error["code"], -32602, "{method} {params}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(method) && message.contains(named), "{method}: {message}");
    }
    let error = session.error("tools/frobnicate", json!({})).await;
    assert_eq!(error["code"], -32601, "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("method not found") && message.contains("tools/frobnicate"),
        "{message}"
    );
    // The session goes on serving.
    let listed = session.post(r#"{"jsonrpc":"2.0","id":10,"method":"tools/list"}"#).await;
    assert!(listed.message()["result"]["tools"].is_array(), "{}", listed.body);
    server.stop().await;
}

/// A body that is not JSON is `400` with a JSON-RPC parse error (`-32700`), and JSON that
/// is no single message (a batch, which MCP dropped in 2025-06-18, or an object of no
/// message's form) is `400` with an invalid request error (`-32600`), both with id
/// `null`: not `415`, which tells a client its media type was wrong. The session goes on.
#[tokio::test]
async fn bodies_that_are_no_message_are_bad_requests() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let cases = [
        (r#"{"jsonrpc":"2.0","id":3,"#, -32700, "Parse error"),
        (
            r#"[{"jsonrpc":"2.0","id":4,"method":"ping"},{"jsonrpc":"2.0","id":5,"method":"ping"}]"#,
            -32600,
            "batch",
        ),
        (r#"{"greeting":"hello"}"#, -32600, "Invalid Request"),
    ];
    for (body, code, says) in cases {
        let answered = session.post(body).await;
        assert_eq!(answered.status, 400, "{body}: {}", answered.body);
        let message = answered.message();
        assert_eq!(message["error"]["code"], code, "{body}: {message}");
        assert_eq!(message["id"], Value::Null, "{message}");
        assert!(message["error"]["message"].as_str().unwrap().contains(says), "{message}");
    }
    let pong = session.post(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#).await;
    assert_eq!(pong.message()["result"], json!({}), "{}", pong.body);
    server.stop().await;
}

/// `DELETE` of a live session is `200` (the Python SDK's client takes only `200` or `204`
/// as ended, and logged rmcp's `202` as a failed termination); of a session that is gone
/// (deleted, or never made) it is `404`, as every other request naming it is, so that a
/// client can tell its session is no more.
#[tokio::test]
async fn deleting_a_session_ends_it_and_one_that_is_gone_is_not_found() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let delete = |id: String| {
        let client = session.client.clone();
        let url = server.url();
        async move {
            let request = client.delete(url).header("mcp-session-id", id).send();
            within(request).await.expect("a response").status().as_u16()
        }
    };
    assert_eq!(delete(session.id.clone()).await, 200);
    assert_eq!(delete(session.id.clone()).await, 404);
    assert_eq!(delete("no-such-session".to_owned()).await, 404);
    let after = session.post(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).await;
    assert_eq!(after.status, 404, "{}", after.body);
    server.stop().await;
}

/// Server-sent events read from a response, one at a time.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

/// One server-sent event: its id and its data, when it has any.
#[derive(Debug)]
struct Event {
    id: Option<String>,
    data: Option<Value>,
}

impl Events {
    fn new(response: reqwest::Response) -> Events {
        assert_eq!(response.status(), 200, "an event stream");
        Events { response, buffer: String::new() }
    }

    /// The next event; `None` when the stream ends.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = Event { id: None, data: None };
                for line in block.lines() {
                    if let Some(id) = line.strip_prefix("id:") {
                        event.id = Some(id.trim().to_owned());
                    } else if let Some(data) = line.strip_prefix("data:")
                        && !data.trim().is_empty()
                    {
                        event.data = Some(serde_json::from_str(data.trim()).expect("JSON data"));
                    }
                }
                if event.id.is_some() || event.data.is_some() {
                    return Some(event);
                }
                continue;
            }
            let chunk = within(self.response.chunk()).await.expect("the stream reads")?;
            self.buffer.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// The events up to the end of the stream.
    async fn rest(mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

impl RawSession {
    /// A POST of `body` whose answer is an event stream.
    async fn stream(&self, body: Value) -> Events {
        let response = self
            .client
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string())
            .send();
        Events::new(within(response).await.expect("a response"))
    }

    /// A `GET` of the session's stream, resuming after `last` when given.
    async fn get(&self, last: Option<&str>) -> Events {
        let mut request = self
            .client
            .get(&self.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &self.id)
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        Events::new(within(request.send()).await.expect("a response"))
    }
}

/// A call of `tool` with a progress token, as a JSON-RPC request with id `id`.
fn call_with_progress(id: u64, tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": {}, "_meta": {"progressToken": id}}})
}

/// Reads `events` up to the first progress report; the report's id.
async fn first_progress(events: &mut Events) -> String {
    loop {
        let event = events.next().await.expect("a progress report");
        if event.data.as_ref().is_some_and(|d| d["method"] == "notifications/progress") {
            return event.id.expect("an event id");
        }
    }
}

/// The progress values and the response among `events`.
fn progress_and_response(events: &[Event]) -> (Vec<f64>, Option<Value>) {
    let mut data = events.iter().filter_map(|e| e.data.as_ref());
    let progress = data
        .clone()
        .filter(|d| d["method"] == "notifications/progress")
        .map(|d| d["params"]["progress"].as_f64().unwrap())
        .collect();
    (progress, data.rfind(|d| d.get("id").is_some()).cloned())
}

/// A client whose connection drops during a call gets, with `GET` and `Last-Event-ID`, the
/// events after the last it read: the reports it missed, not the one it had again, and
/// the result, even when the call ended while it was away.
#[tokio::test]
async fn a_call_s_events_are_replayed_after_a_disconnect() {
    use toolmux_test_support::mock::{Behavior, MockProvider};
    let steps = Behavior::Progress { steps: 4, interval: std::time::Duration::from_millis(150) };
    let mock = Arc::new(MockProvider::new("mock").with_tool("steps", steps));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;

    // Back while the call runs.
    let mut events = session.stream(call_with_progress(1, "steps")).await;
    let last = first_progress(&mut events).await;
    drop(events);
    let (progress, response) = progress_and_response(&session.get(Some(&last)).await.rest().await);
    assert_eq!(progress, [2.0, 3.0, 4.0], "each report once, after the last one read");
    let response = response.expect("the response");
    assert_eq!(response["id"], 1);
    assert_eq!(response["result"]["content"][0]["text"], "done", "{response}");

    // Back after the call ended.
    let mut events = session.stream(call_with_progress(2, "steps")).await;
    let last = first_progress(&mut events).await;
    drop(events);
    crate::support::eventually("the call to end", || async { mock.in_flight() == 0 }).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (progress, response) = progress_and_response(&session.get(Some(&last)).await.rest().await);
    assert_eq!(progress, [2.0, 3.0, 4.0]);
    let response = response.expect("the response");
    assert_eq!(response["id"], 2);
    assert_eq!(response["result"]["content"][0]["text"], "done", "{response}");
    assert_eq!(mock.calls_of("steps"), 2, "resuming calls nothing again");
    server.stop().await;
}

/// The session's `GET` stream resumes too: what was sent while the client was away (a
/// change of the tools) comes after its `Last-Event-ID`.
#[tokio::test]
async fn the_session_stream_resumes_after_a_disconnect() {
    use toolmux_test_support::mock::{Behavior, MockProvider};
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let mut stream = session.get(None).await;
    // The first events of the stream say where it starts.
    let last = within(async {
        loop {
            let id = stream.next().await.expect("a first event").id;
            if id.as_deref().is_some_and(|id| id != "0") {
                break id;
            }
        }
    })
    .await;
    drop(stream);
    mock.add_tool("b", Behavior::Echo);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut resumed = session.get(last.as_deref()).await;
    let changed = within(async {
        loop {
            let event = resumed.next().await.expect("the change");
            if let Some(data) = event.data {
                break data;
            }
        }
    })
    .await;
    assert_eq!(changed["method"], "notifications/tools/list_changed", "{changed}");
    server.stop().await;
}

/// A session lives while it is used: a call that runs longer than a session may sit idle
/// is answered, and the session serves requests after it; one unused for that long ends.
/// (rmcp ended a session five minutes after its last message, even with a call running:
/// the call's answer was lost and the next request answered 500.)
#[tokio::test]
async fn a_session_outlives_a_call_longer_than_its_idle_time() {
    let idle = std::time::Duration::from_millis(500);
    let options = ServeOptions { session_idle: idle, ..ServeOptions::default() };
    let server = HttpServer::start(Arc::new(Fixture::new(0)), options).await;
    let session = RawSession::open(&server.url()).await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "sleep_ms", "arguments": {"ms": 2000}}});
    let (_, response) = progress_and_response(&session.stream(call).await.rest().await);
    let response = response.expect("the call's response");
    assert_eq!(response["result"]["content"][0]["text"], "slept", "{response}");
    let pong = session.post(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).await;
    assert_eq!(pong.status, 200, "{}", pong.body);
    tokio::time::sleep(idle * 4).await;
    let gone = session.post(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#).await;
    assert_eq!(gone.status, 404, "an unused session ends: {}", gone.body);
    server.stop().await;
}

/// A client that opens its `GET` stream again (without `Last-Event-ID`, after a network
/// blip the server has not noticed yet) gets the session's messages on the new stream,
/// and none is lost when the old one turns out dead. (rmcp kept the first stream as the
/// one to send on while it seemed alive, made the new one a stream that never gets
/// anything, and sent later messages to the dead one.)
#[tokio::test]
async fn a_reopened_session_stream_gets_the_messages() {
    use toolmux_test_support::mock::{Behavior, MockProvider};
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let mut first = session.get(None).await;
    let _ = first.next().await.expect("the first stream opens");
    let mut second = session.get(None).await;
    let _ = second.next().await.expect("the second stream opens");
    drop(first);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    mock.add_tool("b", Behavior::Echo);
    let changed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            let event = second.next().await.expect("the change");
            if let Some(data) = event.data {
                break data;
            }
        }
    })
    .await
    .expect("the change reaches the open stream");
    assert_eq!(changed["method"], "notifications/tools/list_changed", "{changed}");
    server.stop().await;
}

/// An `Accept` of HTTP wildcards that cover what a request needs (`*/*`; `application/*`
/// with `text/*`) is as good as naming the types; one that covers too little is still 406.
#[tokio::test]
async fn accept_wildcards_are_accepted() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let ping = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
    for (accept, status) in [("*/*", 200), ("application/*, text/*", 200), ("application/*", 406)] {
        let response = within(
            session
                .client
                .post(&session.url)
                .header("accept", accept)
                .header("content-type", "application/json")
                .header("mcp-session-id", &session.id)
                .header("mcp-protocol-version", "2025-11-25")
                .body(ping)
                .send(),
        )
        .await
        .expect("a response");
        assert_eq!(response.status().as_u16(), status, "Accept: {accept}");
    }
    server.stop().await;
}

/// `DELETE` of a session with a call running cancels the call at once and ends the
/// session. (rmcp cancelled its calls only after waiting up to 5 s for them to answer.)
#[tokio::test]
async fn deleting_a_session_cancels_its_calls_at_once() {
    use toolmux_test_support::mock::{Behavior, MockProvider};
    let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "hang", "arguments": {}}});
    let _events = session.stream(call).await;
    crate::support::eventually("the call to start", || async { mock.in_flight() == 1 }).await;
    let deleted = std::time::Instant::now();
    let request = session.client.delete(&session.url).header("mcp-session-id", &session.id);
    let status = within(request.send()).await.expect("a response").status().as_u16();
    assert_eq!(status, 200);
    crate::support::eventually("the call to end", || async { mock.in_flight() == 0 }).await;
    let cancelled = deleted.elapsed();
    assert!(cancelled < std::time::Duration::from_secs(2), "the call ended after {cancelled:?}");
    let after = session.post(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).await;
    assert_eq!(after.status, 404, "{}", after.body);
    server.stop().await;
}

/// A second `initialize` in a session is refused with an invalid request error saying
/// that the session is initialized already, and the session goes on as it was.
#[tokio::test]
async fn a_second_initialize_in_a_session_is_refused() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let again = json!({"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "again", "version": "0"}
    }});
    let answered = session.post(&again.to_string()).await;
    let message = answered.message();
    assert_eq!(message["id"], 5, "{message}");
    assert_eq!(message["error"]["code"], -32600, "{message}");
    let text = message["error"]["message"].as_str().unwrap();
    assert!(text.contains("already initialized") && text.contains("new session"), "{text}");
    let pong = session.post(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#).await;
    assert_eq!(pong.message()["result"], json!({}), "{}", pong.body);
    server.stop().await;
}

/// A `GET` that resumes after an event of another session's stream (a call's, or the
/// other session's own `GET` stream) replays nothing of it: it is refused, saying why.
#[tokio::test]
async fn an_event_of_another_session_is_not_resumed() {
    use toolmux_test_support::mock::{Behavior, MockProvider};
    let steps = Behavior::Progress { steps: 3, interval: std::time::Duration::from_millis(50) };
    let mock = Arc::new(MockProvider::new("mock").with_tool("steps", steps));
    let server = HttpServer::start(mock.clone(), ServeOptions::default()).await;
    let first = RawSession::open(&server.url()).await;
    let second = RawSession::open(&server.url()).await;
    let mut events = first.stream(call_with_progress(1, "steps")).await;
    let call_event = first_progress(&mut events).await;
    let _ = events.rest().await;
    let mut stream = first.get(None).await;
    let common_event = within(async {
        loop {
            let id = stream.next().await.expect("a first event").id;
            if let Some(id) = id.filter(|id| id != "0") {
                break id;
            }
        }
    })
    .await;
    for last in [call_event, common_event] {
        let response = within(
            second
                .client
                .get(&second.url)
                .header("accept", "text/event-stream")
                .header("mcp-session-id", &second.id)
                .header("mcp-protocol-version", "2025-11-25")
                .header("last-event-id", &last)
                .send(),
        )
        .await
        .expect("a response");
        let status = response.status().as_u16();
        let kind = response.headers().get("content-type").cloned();
        let body = within(response.text()).await.expect("a body");
        assert!(status == 400 || status == 404, "{last}: {status} {body}");
        assert_eq!(kind.unwrap(), "application/json", "{body}");
        let message: Value = serde_json::from_str(&body).unwrap();
        let text = message["error"]["message"].as_str().unwrap();
        assert!(text.contains("Last-Event-ID") && text.contains("session"), "{text}");
    }
    server.stop().await;
}

/// What a refusal of the transport (400, 404, 406, 415) says: a JSON-RPC error, with the
/// request's id when it has one, whose message says what was wrong and what to send.
#[tokio::test]
async fn refusals_are_json_rpc_errors_that_say_what_to_do() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let ping = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
    let client = &session.client;
    let url = &server.url();
    let post = |accept: &str, kind: &str| {
        client.post(url).header("accept", accept).header("content-type", kind).body(ping)
    };
    let both = "application/json, text/event-stream";
    let cases = [
        // (request, status, id, words the message has)
        (
            post("application/json", "application/json").header("mcp-session-id", &session.id),
            406,
            json!(7),
            &["Accept", "text/event-stream"][..],
        ),
        (
            post(both, "text/plain").header("mcp-session-id", &session.id),
            415,
            json!(7),
            &["Content-Type", "application/json"],
        ),
        (post(both, "application/json"), 400, json!(7), &["Mcp-Session-Id", "initialize"]),
        (
            post(both, "application/json").header("mcp-session-id", "no-such-session"),
            404,
            json!(7),
            &["session", "initialize"],
        ),
        (
            post(both, "application/json")
                .header("mcp-session-id", &session.id)
                .header("mcp-protocol-version", "1999-01-01"),
            400,
            json!(7),
            &["MCP-Protocol-Version", "1999-01-01"],
        ),
        (
            client
                .get(url)
                .header("accept", "application/json")
                .header("mcp-session-id", &session.id),
            406,
            Value::Null,
            &["Accept", "text/event-stream"],
        ),
        (
            client.get(url).header("accept", "text/event-stream").header("mcp-session-id", "gone"),
            404,
            Value::Null,
            &["session", "initialize"],
        ),
        (client.delete(url), 400, Value::Null, &["Mcp-Session-Id"]),
    ];
    for (request, status, id, words) in cases {
        let request = request.build().unwrap();
        let what = format!("{} {:?}", request.method(), request.headers());
        let response = within(client.execute(request)).await.expect("a response");
        assert_eq!(response.status().as_u16(), status, "{what}");
        let kind = response.headers().get("content-type").cloned();
        let body = within(response.text()).await.expect("a body");
        assert_eq!(kind.unwrap(), "application/json", "{what}: {body}");
        let message: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(message["jsonrpc"], "2.0", "{body}");
        assert_eq!(message["id"], id, "{what}: {body}");
        assert!(message["error"]["code"].is_i64(), "{body}");
        let text = message["error"]["message"].as_str().unwrap();
        for word in words {
            assert!(text.contains(word), "{what}: `{word}` not in {text}");
        }
    }
    server.stop().await;
}

/// A body over the 4 MiB a message may have is `413` with a JSON-RPC error saying so,
/// not a dropped connection; a cancellation of no request in flight is accepted (`202`)
/// and changes nothing. The session goes on serving after both.
#[tokio::test]
async fn an_oversized_body_and_a_stray_cancellation_leave_the_session_serving() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let big = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "a".repeat(5 << 20)}}});
    let refused = session.post(&big.to_string()).await;
    assert_eq!(refused.status, 413, "{}", &refused.body[..refused.body.len().min(300)]);
    let error = &refused.message()["error"];
    assert_eq!(error["code"], -32600, "{error}");
    assert!(error["message"].as_str().unwrap().contains("4 MiB"), "{error}");
    let stray = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 77, "reason": "gone"}});
    let accepted = session.post(&stray.to_string()).await;
    assert_eq!(accepted.status, 202, "{}", accepted.body);
    let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "still here"}}});
    let answered = session.post(&call.to_string()).await.message();
    assert_eq!(answered["result"]["content"][0]["text"], "echo: still here", "{answered}");
    server.stop().await;
}

/// A POST of `body` to `url` in no session, with `headers` besides the JSON-RPC ones.
async fn post_sessionless(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Answered {
    let mut request = client
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = within(request.body(body.to_string()).send()).await.expect("a response");
    let status = response.status().as_u16();
    Answered { status, body: within(response.text()).await.expect("a body") }
}

/// An `initialize` asking for a protocol version the server does not speak (one older
/// than any, or one of the stateless revisions, which have no `initialize`) is answered
/// with the newest version it speaks with a handshake, as MCP says, not refused; the
/// client decides whether it can go on.
#[tokio::test]
async fn an_initialize_of_an_unknown_version_is_offered_the_newest() {
    crate::support::install_crypto();
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let client = reqwest::Client::new();
    for asked in ["1999-01-01", "2026-07-28", "2099-12-31"] {
        let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": asked, "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}
        }});
        let answered = post_sessionless(&client, &server.url(), &initialize, &[]).await;
        assert_eq!(answered.status, 200, "{asked}: {}", answered.body);
        let message = answered.message();
        assert_eq!(message["result"]["protocolVersion"], "2025-11-25", "{asked}: {message}");
    }
    server.stop().await;
}

/// A stateless (2026-07-28) client has no session to keep a listing in: each page is a
/// request of its own, on a connection of its own, and the cursors of one page lead to
/// the next all the same, every tool listed once; a cursor that is no cursor of this
/// server is `-32602` saying so.
#[tokio::test]
async fn stateless_pages_follow_their_cursors_across_requests() {
    crate::support::install_crypto();
    let options = ServeOptions { page_size: 100, ..ServeOptions::default() };
    let server = HttpServer::start(Arc::new(Fixture::new(250)), options).await;
    let list = async |cursor: Option<&str>| {
        let mut params = json!({"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {}
        }});
        if let Some(cursor) = cursor {
            params["cursor"] = cursor.into();
        }
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params});
        // A client of its own each time: nothing ties one page to the one before.
        let headers = [("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list")];
        post_sessionless(&reqwest::Client::new(), &server.url(), &body, &headers).await.message()
    };
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        assert!(page < 10, "the pages never end");
        let message = list(cursor.as_deref()).await;
        let result = &message["result"];
        let tools = result["tools"].as_array().unwrap_or_else(|| panic!("{message}"));
        names.extend(tools.iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        match result["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let listed = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), listed, "no tool is listed twice");
    let fixture_tools = Fixture::new(0).list_visible_count().await;
    assert_eq!(listed, 250 + fixture_tools);
    let refused = list(Some("not-a-cursor")).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("cursor"), "{refused}");
    server.stop().await;
}

/// An `initialize` without a session, sent as it is (`body`), and what it was answered.
async fn raw_initialize(url: &str, body: &str) -> (u16, reqwest::header::HeaderMap, String) {
    crate::support::install_crypto();
    let response = within(
        reqwest::Client::new()
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send(),
    )
    .await
    .expect("a response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, within(response.text()).await.expect("a body"))
}

/// Past `max_sessions`, an `initialize` ends the session unused the longest, whose client
/// is then told its session is gone; when every session is in use (a call running in
/// each), it is refused with `503` and `Retry-After`, saying why. Without the bound every
/// handshake made a session that lived until it had been idle five minutes.
#[tokio::test]
async fn sessions_past_the_bound_end_the_least_recently_used_or_are_refused() {
    use toolmux_test_support::mock::{Behavior, MockProvider};
    let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
    let options = ServeOptions { max_sessions: 2, ..ServeOptions::default() };
    let server = HttpServer::start(mock.clone(), options).await;
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let first = RawSession::open(&server.url()).await;
    let second = RawSession::open(&server.url()).await;
    // The first is used after the second: the second is the one unused the longest.
    assert_eq!(first.post(ping).await.status, 200);
    let third = RawSession::open(&server.url()).await;
    let gone = second.post(ping).await;
    assert_eq!(gone.status, 404, "{}", gone.body);
    assert_eq!(first.post(ping).await.status, 200);
    assert_eq!(third.post(ping).await.status, 200);
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "hang", "arguments": {}}});
    let _running = (first.stream(call.clone()).await, third.stream(call).await);
    crate::support::eventually("both calls to start", || async { mock.in_flight() == 2 }).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 5, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}});
    let (status, headers, body) = raw_initialize(&server.url(), &initialize.to_string()).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(headers["retry-after"], "5", "{headers:?}");
    assert!(headers.get("mcp-session-id").is_none(), "{headers:?}");
    let message: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(message["id"], 5, "{body}");
    let text = message["error"]["message"].as_str().unwrap();
    assert!(text.contains("(2)") && text.contains("in use"), "{text}");
    // The sessions in use were left alone.
    assert_eq!(first.post(ping).await.status, 200);
    server.stop().await;
}

/// A message with a field of the wrong form is told which (`-32600`), not that it is no
/// message rmcp knows and that MCP has no batch; an `initialize` whose `params` are not an
/// initialize's is told what is wrong with them (`-32602`), not to send a session id or
/// an `initialize`, which it is.
#[tokio::test]
async fn a_field_of_the_wrong_form_is_named() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let cases = [
        (r#"{"id":3,"method":"ping"}"#, json!(3), "`jsonrpc` is missing"),
        (r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#, json!(3), r#"`jsonrpc` is "1.0""#),
        (r#"{"jsonrpc":"2.0","id":3,"method":"ping","params":"x"}"#, json!(3), "`params` is"),
        (r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, Value::Null, "`id` is null"),
        (r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#, Value::Null, "`id` is 1.5"),
        (r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#, Value::Null, "`id` is true"),
        (r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#, Value::Null, "`id` is {}"),
        (r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#, Value::Null, "`id` is [1]"),
        (r#"{"jsonrpc":"2.0","id":1e23,"method":"ping"}"#, Value::Null, "`id` is 1e+23"),
    ];
    for (body, id, says) in cases {
        let answered = session.post(body).await;
        assert_eq!(answered.status, 400, "{body}: {}", answered.body);
        let message = answered.message();
        assert_eq!(message["error"]["code"], -32600, "{body}: {message}");
        assert_eq!(message["id"], id, "{body}: {message}");
        let text = message["error"]["message"].as_str().unwrap();
        assert!(text.contains(says) && !text.contains("batch"), "{body}: {text}");
        if says.starts_with("`id`") {
            assert!(text.contains("a string or an integer"), "{text}");
        }
    }
    let initialize = [
        (r#"{"jsonrpc":"2.0","id":4,"method":"initialize"}"#, "no `params`"),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":1,"clientInfo":{"name":"raw","version":"0"}}}"#,
            "`params.capabilities` is 1",
        ),
    ];
    for (body, says) in initialize {
        let (status, headers, answer) = raw_initialize(&server.url(), body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(headers.get("mcp-session-id").is_none(), "{headers:?}");
        let message: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(message["error"]["code"], -32602, "{message}");
        assert_eq!(message["id"], 4, "{message}");
        let text = message["error"]["message"].as_str().unwrap();
        assert!(text.contains(says) && !text.contains("Mcp-Session-Id"), "{body}: {text}");
    }
    let pong = session.post(r#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#).await;
    assert_eq!(pong.message()["result"], json!({}), "{}", pong.body);
    server.stop().await;
}

/// The status line and headers of `request`, written as it is to the server at `addr`
/// (reqwest adds headers of its own, such as `Accept: */*`).
async fn raw_http(addr: std::net::SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = within(tokio::net::TcpStream::connect(addr)).await.expect("connects");
    within(stream.write_all(request.as_bytes())).await.expect("written");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let read = within(stream.read(&mut byte)).await.expect("read");
        if read == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A `GET` of a session's stream without `Accept` is `406`, as one with an `Accept` that
/// leaves out `text/event-stream` is: a client must accept the event stream.
#[tokio::test]
async fn a_get_without_accept_is_not_acceptable() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    let request = format!(
        "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nMcp-Session-Id: {}\r\n\
         MCP-Protocol-Version: 2025-11-25\r\nConnection: close\r\n\r\n",
        server.addr.port(),
        session.id
    );
    let head = raw_http(server.addr, &request).await;
    assert!(head.starts_with("HTTP/1.1 406"), "{head}");
    server.stop().await;
}

/// A request naming two sessions (two `Mcp-Session-Id` headers) is refused, whichever
/// method: the first was taken, which need not be the one meant. Neither session ends.
#[tokio::test]
async fn a_request_naming_two_sessions_is_refused() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let first = RawSession::open(&server.url()).await;
    let second = RawSession::open(&server.url()).await;
    let delete = first
        .client
        .delete(&first.url)
        .header("mcp-session-id", &first.id)
        .header("mcp-session-id", &second.id)
        .header("mcp-protocol-version", "2025-11-25");
    let response = within(delete.send()).await.expect("a response");
    assert_eq!(response.status().as_u16(), 400);
    let message: Value = serde_json::from_str(&within(response.text()).await.unwrap()).unwrap();
    let text = message["error"]["message"].as_str().unwrap();
    assert!(text.contains("2 `Mcp-Session-Id` headers"), "{text}");
    let ping = first
        .client
        .post(&first.url)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-session-id", &second.id)
        .header("mcp-session-id", &first.id)
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    assert_eq!(within(ping.send()).await.expect("a response").status().as_u16(), 400);
    for session in [&first, &second] {
        let pong = session.post(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).await;
        assert_eq!(pong.status, 200, "{}", pong.body);
    }
    server.stop().await;
}

/// A body said to be in another charset than UTF-8 is `415` naming it (rmcp read it as
/// UTF-8 whatever it said); `charset=utf-8` is served.
#[tokio::test]
async fn a_charset_other_than_utf8_is_unsupported() {
    let server = HttpServer::start(Arc::new(Fixture::new(0)), ServeOptions::default()).await;
    let session = RawSession::open(&server.url()).await;
    for (kind, status) in [
        ("application/json; charset=latin1", 415),
        ("application/json; charset=\"ISO-8859-1\"", 415),
        ("application/json; charset=UTF-8", 200),
    ] {
        let ping = session
            .client
            .post(&session.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", kind)
            .header("mcp-session-id", &session.id)
            .header("mcp-protocol-version", "2025-11-25")
            .body(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#);
        let response = within(ping.send()).await.expect("a response");
        assert_eq!(response.status().as_u16(), status, "{kind}");
        let body = within(response.text()).await.unwrap();
        if status == 415 {
            let message: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(message["id"], 3, "{body}");
            let text = message["error"]["message"].as_str().unwrap();
            assert!(text.contains("charset=") && text.contains("UTF-8"), "{text}");
        }
    }
    server.stop().await;
}
