//! The external tools' HTTP API of `toolmux serve --http` (`/api/tool-calls`, its event
//! stream, `/api/runs/{runId}/tool-results`), driven over raw HTTP/1.1 against the real
//! binary, with agents calling the tools over MCP's streamable HTTP under two API keys.

use crate::Project;
use crate::serve::{serve_http, stop};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::TcpStream;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef00";

const CONFIG: &str = "\
serve:
  apiKeys:
    alice: ${ALICE_KEY}
    bob: ${BOB_KEY}
externalTools:
  confirm:
    description: Ask the user to confirm
    executionType: space
    timeout: 30000
    inputSchema:
      type: object
      properties: {question: {type: string}}
      required: [question]
  build:
    description: Start a build
    isAsync: true
";

/// A response: status, headers (names lower-cased) and the body, de-chunked.
struct Response<B> {
    status: u16,
    headers: Vec<(String, String)>,
    body: B,
}

impl<B> Response<B> {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Sends one request on a new connection and reads the status line and headers; the body
/// is left to read (de-chunked when chunked).
fn send(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response<Box<dyn BufRead + Send>> {
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {address}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(40))).expect("a timeout");
    stream.write_all(request.as_bytes()).expect("send");
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("a status line");
    let status = status_line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body: Box<dyn BufRead + Send> = if chunked {
        Box::new(BufReader::new(Chunked { inner: reader, left: 0, done: false }))
    } else {
        Box::new(reader)
    };
    Response { status, headers, body }
}

/// [`send`], the whole body read.
fn request(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response<String> {
    let mut response = send(address, method, path, headers, body);
    let mut text = String::new();
    response.body.read_to_string(&mut text).expect("the body");
    Response { status: response.status, headers: response.headers, body: text }
}

/// The decoded body of a chunked response.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.left == 0 {
            if self.done {
                return Ok(0);
            }
            let mut line = String::new();
            if self.inner.read_line(&mut line)? == 0 {
                return Ok(0);
            }
            let size = line.trim();
            if size.is_empty() {
                continue; // the CRLF after a chunk
            }
            let size = size.split(';').next().unwrap_or_default();
            self.left = usize::from_str_radix(size, 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size `{size}`")))?;
            if self.left == 0 {
                self.done = true;
            }
        }
        let most = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..most])?;
        self.left -= n;
        Ok(n)
    }
}

/// The names of the tools `agent` is listed.
fn tool_names(agent: &mut Agent) -> Vec<String> {
    let listed = agent.request("tools/list", json!({}));
    listed["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// An MCP session over streamable HTTP, as an agent holding `key`.
struct Agent {
    address: String,
    key: &'static str,
    session: String,
    next: u64,
}

impl Agent {
    fn start(address: &str, key: &'static str) -> Agent {
        Agent::start_with(address, key, json!({}))
    }

    /// A session whose client declares `capabilities`.
    fn start_with(address: &str, key: &'static str, capabilities: Value) -> Agent {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": capabilities,
            "clientInfo": {"name": "agent", "version": "1"}}});
        let auth = bearer(key);
        let headers = [
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ];
        let response = request(address, "POST", "/mcp", &headers, &init.to_string());
        assert_eq!(response.status, 200, "{}", response.body);
        let session = response.header("mcp-session-id").expect("a session id").to_owned();
        let agent = Agent { address: address.to_owned(), key, session, next: 1 };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let response = agent.post(&initialized.to_string());
        assert_eq!(response.status, 202, "{}", response.body);
        agent
    }

    fn post(&self, body: &str) -> Response<String> {
        let auth = bearer(self.key);
        let headers = [
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", self.session.as_str()),
            ("Mcp-Protocol-Version", "2025-06-18"),
        ];
        request(&self.address, "POST", "/mcp", &headers, body)
    }

    /// Sends request `method` and returns its answer (the JSON-RPC message).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let response = self.post(&body.to_string());
        response
            .body
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .chain(serde_json::from_str::<Value>(&response.body).ok())
            .find(|message| message["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {method} in {}", response.body))
    }

    /// Calls `tool` on a thread of its own; the receiver gets the result's text (or
    /// JSON) and whether it failed.
    fn call(&mut self, tool: &str, arguments: Value) -> Receiver<(Value, bool)> {
        let id = self.next;
        self.next += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": arguments}})
        .to_string();
        let (tx, rx) = channel();
        let agent = Agent { address: self.address.clone(), session: self.session.clone(), ..*self };
        std::thread::spawn(move || {
            let response = agent.post(&body);
            let answer = response
                .body
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
                .chain(serde_json::from_str::<Value>(&response.body).ok())
                .find(|message| message["id"] == id)
                .unwrap_or_else(|| panic!("no answer in {}", response.body));
            let result = &answer["result"];
            let text = result["content"][0]["text"].as_str().unwrap_or_default();
            let value = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
            let _ = tx.send((value, result["isError"] == true));
        });
        rx
    }
}

/// The next `event:`/`data:` pair of an event stream, skipping comments.
fn next_event(stream: &mut dyn BufRead) -> (String, Value) {
    let (mut event, mut data) = (String::new(), String::new());
    loop {
        let mut line = String::new();
        let n = stream.read_line(&mut line).expect("the event stream goes on");
        assert!(n > 0, "the event stream ended");
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            if !data.is_empty() {
                return (event, serde_json::from_str(&data).expect("JSON data"));
            }
            continue;
        }
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push_str(value.trim());
        }
    }
}

/// Percent-encodes a path segment.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn address_of(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("an http url");
    rest.split('/').next().unwrap_or_default().to_owned()
}

fn json_body(response: &Response<String>) -> Value {
    serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", response.status, response.body))
}

#[test]
fn programs_answer_external_calls_over_http_and_see_only_their_own_holders_calls() {
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file("toolmux.yaml", CONFIG);
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    let alice_auth = bearer(ALICE);
    let bob_auth = bearer(BOB);
    let as_alice = [("Authorization", alice_auth.as_str())];
    let as_bob = [("Authorization", bob_auth.as_str())];

    // Alice's worker listens for her calls before any is made.
    let mut events = send(&address, "GET", "/api/tool-calls/events", &as_alice, "");
    assert_eq!(events.status, 200);
    assert_eq!(events.header("content-type"), Some("text/event-stream"));

    let mut alice = Agent::start(&address, ALICE);
    let mut bob = Agent::start(&address, BOB);
    // Bob's asynchronous call is pending first, and never shown to Alice's worker.
    let (started, failed) = bob.call("external__build", json!({"target": "app"})).recv().unwrap();
    assert!(!failed && started["status"] == "pending", "{started}");
    let first = alice.call("external__confirm", json!({"question": "ship?"}));
    let (kind, call) = next_event(&mut *events.body);
    assert_eq!(kind, "tool_call");
    assert_eq!(call["tool"], "external__confirm", "{call}");
    assert_eq!(call["arguments"], json!({"question": "ship?"}));
    let run = call["runId"].as_str().expect("a run id").to_owned();
    assert!(run.starts_with("key:alice/"), "{run}");
    // While the first waits, a second call is announced alone: the first is not repeated.
    let second = alice.call("external__confirm", json!({"question": "tag?"}));
    let (_, next) = next_event(&mut *events.body);
    assert_eq!(next["arguments"], json!({"question": "tag?"}), "{next}");

    // The listing: each holder sees its own calls only.
    let listed = request(&address, "GET", "/api/tool-calls", &as_alice, "");
    assert_eq!(listed.status, 200, "{}", listed.body);
    let calls = json_body(&listed)["calls"].clone();
    assert_eq!(calls.as_array().map(Vec::len), Some(2), "{calls}");
    let listed = request(&address, "GET", "/api/tool-calls?tool=external__build", &as_bob, "");
    let bobs = json_body(&listed)["calls"].clone();
    assert_eq!(bobs.as_array().map(Vec::len), Some(1), "{bobs}");
    assert_eq!(bobs[0]["callId"], started["callId"]);

    // Submissions that cannot be taken say why, and lose nothing.
    let path = format!("/api/runs/{}/tool-results", segment(&run));
    let answer = json!({"callId": call["callId"], "result": {"confirmed": true}}).to_string();
    let json_type = ("Content-Type", "application/json");
    let refused = request(&address, "POST", &path, &[json_type], &answer);
    assert_eq!(refused.status, 401, "{}", refused.body);
    let wrong_run = format!("/api/runs/{}/tool-results", segment("key:alice/other"));
    let refused = request(&address, "POST", &wrong_run, &[as_alice[0], json_type], &answer);
    assert_eq!(refused.status, 404, "{}", refused.body);
    assert!(json_body(&refused)["error"].as_str().unwrap_or_default().contains("another run"));
    let refused = request(&address, "POST", &path, &[as_bob[0], json_type], &answer);
    assert_eq!(refused.status, 404, "Bob cannot answer Alice's call: {}", refused.body);
    let malformed = request(&address, "POST", &path, &[as_alice[0]], r#"{"callId": 1}"#);
    assert_eq!(malformed.status, 400, "{}", malformed.body);
    assert!(json_body(&malformed)["error"].as_str().unwrap_or_default().contains("`callId`"));
    let rebinding = [as_alice[0], ("Host", "evil.example")];
    let refused = request(&address, "GET", "/api/tool-calls", &rebinding, "");
    assert_eq!(refused.status, 403, "{}", refused.body);
    let bad_query = request(&address, "GET", "/api/tool-calls?wait=1", &as_alice, "");
    assert_eq!(bad_query.status, 400, "{}", bad_query.body);

    // The right holder, the right run: the waiting call returns the result.
    let taken = request(&address, "POST", &path, &[as_alice[0], json_type], &answer);
    assert_eq!(taken.status, 200, "{}", taken.body);
    assert_eq!(json_body(&taken), json!({"callId": call["callId"], "delivered": "call"}));
    let answered = first.recv_timeout(Duration::from_secs(20)).expect("the call returns");
    assert_eq!(answered, (json!({"confirmed": true}), false));
    let again = request(&address, "POST", &path, &[as_alice[0], json_type], &answer);
    assert_eq!(again.status, 404, "answered twice: {}", again.body);
    let failure = json!({"callId": next["callId"], "result": "no", "isError": true}).to_string();
    let taken = request(&address, "POST", &path, &[as_alice[0], json_type], &failure);
    assert_eq!(taken.status, 200, "{}", taken.body);
    let answered = second.recv_timeout(Duration::from_secs(20)).expect("the call returns");
    assert_eq!(answered, (json!("no"), true));

    // An asynchronous call's result goes to its run's inbox.
    let bobs_run = bobs[0]["runId"].as_str().expect("a run id");
    let path = format!("/api/runs/{}/tool-results", segment(bobs_run));
    let built = json!({"callId": started["callId"], "result": {"artifact": "app.tar"}});
    let taken = request(&address, "POST", &path, &[as_bob[0], json_type], &built.to_string());
    assert_eq!(json_body(&taken)["delivered"], "inbox", "{}", taken.body);
    let (inbox, _) = bob.call("external__inbox", json!({})).recv().unwrap();
    assert_eq!(inbox["results"][0]["result"], json!({"artifact": "app.tar"}), "{inbox}");

    // Shutting down ends the open event stream rather than waiting for it.
    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.stderr.contains(ALICE) && !run.stderr.contains(BOB), "{}", run.stderr);
    let mut rest = String::new();
    let _ = events.body.read_to_string(&mut rest);
}

#[test]
fn holders_whose_names_share_a_prefix_up_to_a_slash_see_only_their_own_calls() {
    const CI: &str = "team-ci-key-0123456789abcdef";
    const WEB: &str = "team-web-key-0123456789abcde";
    let config = CONFIG.replacen(
        "    alice: ${ALICE_KEY}\n    bob: ${BOB_KEY}\n",
        "    team/ci: ${CI_KEY}\n    team/web: ${WEB_KEY}\n",
        1,
    );
    let project = Project::new().env("CI_KEY", CI).env("WEB_KEY", WEB);
    project.file("toolmux.yaml", &config);
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);

    let mut web = Agent::start(&address, WEB);
    let (started, failed) = web.call("external__build", json!({"target": "app"})).recv().unwrap();
    assert!(!failed && started["status"] == "pending", "{started}");
    let as_web = bearer(WEB);
    let listed = request(&address, "GET", "/api/tool-calls", &[("Authorization", &as_web)], "");
    let webs = json_body(&listed)["calls"].clone();
    assert_eq!(webs.as_array().map(Vec::len), Some(1), "{webs}");
    // `team/ci` is another holder than `team/web`, though both names start with `team/`.
    let as_ci = bearer(CI);
    let listed = request(&address, "GET", "/api/tool-calls", &[("Authorization", &as_ci)], "");
    assert_eq!(listed.status, 200, "{}", listed.body);
    let calls = json_body(&listed)["calls"].clone();
    assert_eq!(calls, json!([]), "team/ci sees team/web's call");
    let path = format!("/api/runs/{}/tool-results", segment(webs[0]["runId"].as_str().unwrap()));
    let answer = json!({"callId": started["callId"], "result": "built"}).to_string();
    let headers = [("Authorization", as_ci.as_str()), ("Content-Type", "application/json")];
    let refused = request(&address, "POST", &path, &headers, &answer);
    assert_eq!(refused.status, 404, "team/ci answers team/web's call: {}", refused.body);

    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn without_external_tools_the_api_says_how_to_get_them() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\n");
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    for path in ["/api/tool-calls", "/api/tool-calls/events"] {
        let response = request(&address, "GET", path, &[], "");
        assert_eq!(response.status, 404, "{path}: {}", response.body);
        let error = json_body(&response)["error"].as_str().unwrap_or_default().to_owned();
        assert!(error.contains("externalTools"), "{error}");
    }
    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// `GET /api/events`: each key holder sees the events of its own calls, as they happen.
#[test]
fn the_event_stream_shows_each_holder_its_own_calls() {
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file(
        "toolmux.yaml",
        "serve:\n  apiKeys:\n    alice: ${ALICE_KEY}\n    bob: ${BOB_KEY}\nfs: {}\n",
    );
    project.file("notes.md", "TODO: one\n");
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    let alice_auth = bearer(ALICE);
    let as_alice = [("Authorization", alice_auth.as_str())];
    let refused = request(&address, "GET", "/api/events", &[], "");
    assert_eq!(refused.status, 401, "{}", refused.body);
    let bad = request(&address, "GET", "/api/events?runs=x", &as_alice, "");
    assert_eq!(bad.status, 400, "{}", bad.body);
    let mut events = send(&address, "GET", "/api/events", &as_alice, "");
    assert_eq!(events.status, 200);
    assert_eq!(events.header("content-type"), Some("text/event-stream"));

    let mut bob = Agent::start(&address, BOB);
    let (found, _) = bob.call("fs__grep", json!({"pattern": "TODO"})).recv().unwrap();
    assert_eq!(found, json!("notes.md"));
    let mut alice = Agent::start(&address, ALICE);
    let (found, _) = alice.call("fs__grep", json!({"pattern": "TODO"})).recv().unwrap();
    assert_eq!(found, json!("notes.md"));
    let (_, failed) = alice.call("fs__grep", json!({})).recv().unwrap();
    assert!(failed);

    // Bob's call came first, but Alice's stream starts with hers.
    let (kind, started) = next_event(&mut *events.body);
    assert_eq!(kind, "tool.started", "{started}");
    assert_eq!(started["tool"], "fs__grep");
    let run = started["runId"].as_str().unwrap_or_default().to_owned();
    assert!(run.starts_with("key:alice/"), "{started}");
    let (kind, done) = next_event(&mut *events.body);
    assert_eq!(kind, "tool.done", "{done}");
    assert_eq!((done["opId"].clone(), done["ok"].clone()), (started["opId"].clone(), json!(true)));
    assert!(done["latencyMs"].is_u64() && done["charsOut"].as_u64() > Some(0), "{done}");
    // A tool shown to people: its arguments and result, for a user interface to render.
    assert_eq!(started["arguments"], json!({"pattern": "TODO"}), "{started}");
    assert_eq!(done["result"], "notes.md", "{done}");
    // Arguments refused: the call ends as an error saying why.
    let (kind, started) = next_event(&mut *events.body);
    assert_eq!(kind, "tool.started", "{started}");
    let (kind, refused) = next_event(&mut *events.body);
    assert_eq!(kind, "tool.error", "{refused}");
    assert_eq!(refused["opId"], started["opId"]);
    assert_eq!(refused["errorCode"], "invalid_arguments", "{refused}");
    assert_eq!(refused["runId"], run.as_str());

    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// `GET /api/events` of an agent run: its text and its calls' arguments as the model
/// writes them, before each call starts (a user interface renders them as they come).
#[test]
fn the_event_stream_shows_an_agent_s_text_and_calls_as_its_model_writes_them() {
    use toolmux_test_support::llm::{Dialect, ScriptStep, ScriptedLlmServer};
    let model = ScriptedLlmServer::start(
        Dialect::Anthropic,
        vec![
            ScriptStep::TextAndToolCalls(
                "Searching the notes.".into(),
                vec![("fs__grep".into(), json!({"pattern": "TODO", "path": "."}))],
            ),
            ScriptStep::text("One TODO, in notes.md."),
        ],
    );
    let project = Project::new().env("ALICE_KEY", ALICE);
    project.file(
        "toolmux.yaml",
        &format!(
            "serve:\n  apiKeys:\n    alice: ${{ALICE_KEY}}\nfs: {{}}\n\
             models:\n  fast: {{type: anthropic, model: test-model, baseUrl: '{}', maxRetries: 0}}\n\
             agents:\n  reader: {{model: fast, tools: ['fs__*']}}\n",
            model.base_url()
        ),
    );
    project.file("notes.md", "TODO: one\n");
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    let alice_auth = bearer(ALICE);
    let as_alice = [("Authorization", alice_auth.as_str())];
    let mut events = send(&address, "GET", "/api/events", &as_alice, "");
    assert_eq!(events.status, 200);

    let mut alice = Agent::start(&address, ALICE);
    let (answer, failed) =
        alice.call("agent__reader", json!({"prompt": "find the TODOs"})).recv().unwrap();
    assert!(!failed, "{answer}");
    assert_eq!(answer, json!("One TODO, in notes.md."));

    let mut seen = Vec::new();
    loop {
        let (kind, data) = next_event(&mut *events.body);
        let end = kind == "tool.done" && data["tool"] == "agent__reader";
        seen.push((kind, data));
        if end {
            break;
        }
    }
    let kinds: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    let text: String = seen
        .iter()
        .filter(|(k, _)| k == "agent.text")
        .map(|(_, d)| {
            assert_eq!(d["agent"], "reader", "{d}");
            d["text"].as_str().unwrap_or_default()
        })
        .collect();
    assert_eq!(text, "Searching the notes.One TODO, in notes.md.", "{kinds:?}");
    let streamed: Vec<&Value> =
        seen.iter().filter(|(k, _)| k == "tool.streaming").map(|(_, d)| d).collect();
    assert!(streamed.len() > 2, "the arguments came in one piece: {kinds:?}");
    let arguments: String =
        streamed.iter().map(|d| d["argumentsDelta"].as_str().unwrap_or_default()).collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"pattern": "TODO", "path": "."})
    );
    let grep = seen
        .iter()
        .position(|(k, d)| k == "tool.started" && d["tool"] == "fs__grep")
        .unwrap_or_else(|| panic!("fs__grep started: {kinds:?}"));
    let last_fragment = seen.iter().rposition(|(k, _)| k == "tool.streaming").unwrap();
    assert!(last_fragment < grep, "{kinds:?}");
    for data in &streamed {
        assert_eq!(data["tool"], "fs__grep");
        assert_eq!(data["callId"], seen[grep].1["callId"], "{data}");
    }
    // All of it is Alice's run.
    for (kind, data) in &seen {
        let run = data["runId"].as_str().unwrap_or_default();
        assert!(kind == "tool.progress" || run.starts_with("key:alice/"), "{kind}: {data}");
    }
    assert!(model.requests().iter().all(|r| r["stream"] == json!(true)));

    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// `serve.taskTools`: for a client that takes MCP tasks, a listed tool's call becomes a task
/// polled with `tasks/get` and stopped with `tasks/cancel`; other tools, and clients that
/// do not take tasks, are answered in their request.
#[test]
fn listed_tools_run_as_tasks_for_clients_that_take_them() {
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file(
        "toolmux.yaml",
        "serve:\n  apiKeys:\n    alice: ${ALICE_KEY}\n    bob: ${BOB_KEY}\n  \
         taskTools: [fs__bash]\nfs: {permissions: [read, execute]}\n",
    );
    project.file("notes.md", "TODO: one\n");
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let mut alice = Agent::start_with(&address, ALICE, tasks.clone());

    let created = alice.request(
        "tools/call",
        json!({"name": "fs__bash", "arguments": {"command": "sleep 0.3; echo built"}}),
    );
    let created = &created["result"];
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().expect("a task id").to_owned();
    assert_eq!(created["status"], "working");
    let done = loop {
        let got = alice.request("tasks/get", json!({"taskId": id}))["result"].clone();
        if got["status"] != "working" {
            break got;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("built"), "{done}");

    // A tool not listed is answered in its request.
    let grep =
        alice.request("tools/call", json!({"name": "fs__grep", "arguments": {"pattern": "TODO"}}));
    assert!(grep["result"].get("taskId").is_none(), "{grep}");
    assert_eq!(grep["result"]["content"][0]["text"], "notes.md");

    // Cancelling stops the command; the task says so.
    let long = alice
        .request("tools/call", json!({"name": "fs__bash", "arguments": {"command": "sleep 30"}}));
    let long = long["result"]["taskId"].as_str().expect("a task id").to_owned();
    let ack = alice.request("tasks/cancel", json!({"taskId": long}));
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let got = alice.request("tasks/get", json!({"taskId": long}));
    assert_eq!(got["result"]["status"], "cancelled", "{got}");

    // Another key holder cannot see Alice's task; a client without tasks gets answers.
    let mut bob = Agent::start_with(&address, BOB, tasks);
    let hidden = bob.request("tasks/get", json!({"taskId": id}));
    assert_eq!(hidden["error"]["code"], -32602, "{hidden}");
    let mut plain = Agent::start(&address, BOB);
    let answered = plain
        .request("tools/call", json!({"name": "fs__bash", "arguments": {"command": "echo now"}}));
    assert!(answered["result"].get("taskId").is_none(), "{answered}");
    let text = answered["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("now"), "{answered}");

    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn a_bad_task_tool_pattern_is_a_configuration_error() {
    let project = Project::new();
    project.file("toolmux.yaml", "serve:\n  taskTools: [\"fs__[\"]\nfs: {}\n");
    for args in [&["serve", "--http", "127.0.0.1:0"][..], &["config", "check"]] {
        let run = project.run(args);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        let said = "toolmux.yaml: serve.taskTools: `fs__[` is not a glob pattern";
        assert!(run.stderr.contains(said), "{args:?}: {}", run.stderr);
    }
}

/// `perSession`: each MCP session of the gateway gets its own server process, kept across
/// its calls, and all are reaped when the gateway stops.
#[test]
fn per_session_servers_give_each_client_session_its_own_process() {
    let fixture = crate::conformance::fixture_bin().with_file_name("toolmux-mcp-fixture");
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file(
        "toolmux.yaml",
        &format!(
            "serve:\n  apiKeys:\n    alice: ${{ALICE_KEY}}\n    bob: ${{BOB_KEY}}\n\
             mcpServers:\n  fx:\n    command: {}\n    args: [ok]\n    perSession: true\n",
            fixture.display()
        ),
    );
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    let pid = |agent: &mut Agent| {
        let (value, failed) = agent.call("fx__pid", json!({})).recv().unwrap();
        assert!(!failed, "{value}");
        value.as_i64().expect("a pid")
    };
    let mut first = Agent::start(&address, ALICE);
    let mut second = Agent::start(&address, ALICE);
    let mut third = Agent::start(&address, BOB);
    let a = pid(&mut first);
    let b = pid(&mut second);
    let c = pid(&mut third);
    assert!(a != b && b != c && a != c, "sessions share a server: {a} {b} {c}");
    assert_eq!(pid(&mut first), a, "a session keeps its server");
    let alive = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    assert!(alive(a) && alive(b) && alive(c));
    let stopped = stop(gateway);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    for pid in [a, b, c] {
        assert!(!alive(pid), "server {pid} outlived the gateway");
    }
}

/// `serve --watch`: a server added to the file is served without a restart, a file that no
/// longer loads is reported while the previous configuration goes on serving, a server whose
/// entry did not change keeps running through a reload while a changed one is restarted, and
/// a server removed from the file is stopped (its process reaped), and new API keys are
/// taken from the next request on; the clients' sessions live on.
#[test]
fn watch_reloads_the_configuration_without_dropping_clients() {
    let fixture = crate::conformance::fixture_bin().with_file_name("toolmux-mcp-fixture");
    let keys = "serve:\n  apiKeys:\n    alice: ${ALICE_KEY}\n";
    let with_server = format!(
        "{keys}fs: {{}}\nmcpServers:\n  fx:\n    command: {}\n    args: [ok]\n",
        fixture.display()
    );
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file("toolmux.yaml", &format!("{keys}fs: {{}}\n"));
    let gateway = crate::serve::serve_http_with(&project, &["--watch"]);
    let address = address_of(&gateway.url);
    let mut agent = Agent::start(&address, ALICE);
    let names = tool_names;
    let wait_for = |agent: &mut Agent, what: &str, check: &dyn Fn(&[String]) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let names = names(agent);
            if check(&names) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: still {names:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert!(!names(&mut agent).iter().any(|n| n.starts_with("fx__")));

    project.file("toolmux.yaml", &with_server);
    wait_for(&mut agent, "the added server's tools", &|names| names.iter().any(|n| n == "fx__pid"));
    let (pid, failed) = agent.call("fx__pid", json!({})).recv().unwrap();
    assert!(!failed, "{pid}");
    let pid = pid.as_i64().expect("a pid");

    // A broken file changes nothing.
    project.file("toolmux.yaml", "serve: [broken\n");
    std::thread::sleep(Duration::from_secs(2));
    assert!(names(&mut agent).iter().any(|n| n == "fx__pid"));
    let (again, _) = agent.call("fx__pid", json!({})).recv().unwrap();
    assert_eq!(again.as_i64(), Some(pid), "the server was restarted by a broken file");
    let pid_of = |agent: &mut Agent, tool: &str| -> i64 {
        let (pid, failed) = agent.call(tool, json!({})).recv().unwrap();
        assert!(!failed, "{pid}");
        pid.as_i64().expect("a pid")
    };
    let alive = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    let wait_gone = |pid: i64, what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while alive(pid) {
            assert!(std::time::Instant::now() < deadline, "{what} {pid} still runs");
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    // Another server added: `fx`, unchanged, keeps running through the reload.
    let second = format!("  fy:\n    command: {}\n    args: [ok]\n", fixture.display());
    project.file("toolmux.yaml", &format!("{with_server}{second}"));
    wait_for(&mut agent, "the second server's tools", &|names| {
        names.iter().any(|n| n == "fy__pid")
    });
    assert_eq!(pid_of(&mut agent, "fx__pid"), pid, "an unchanged server was restarted");
    let second_pid = pid_of(&mut agent, "fy__pid");
    assert_ne!(second_pid, pid);

    // `fx` changed (an environment variable): restarted, its old process reaped; `fy` not.
    let changed = with_server.replace("args: [ok]\n", "args: [ok]\n    env: {MARK: '1'}\n");
    project.file("toolmux.yaml", &format!("{changed}{second}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let restarted = loop {
        let now = pid_of(&mut agent, "fx__pid");
        if now != pid {
            break now;
        }
        assert!(std::time::Instant::now() < deadline, "the changed server was not restarted");
        std::thread::sleep(Duration::from_millis(100));
    };
    wait_gone(pid, "the changed server's old process");
    assert_eq!(pid_of(&mut agent, "fy__pid"), second_pid, "an unchanged server was restarted");

    project.file("toolmux.yaml", &format!("{keys}fs: {{}}\n"));
    wait_for(&mut agent, "the removed servers gone", &|names| {
        !names.iter().any(|n| n.starts_with("fx__") || n.starts_with("fy__"))
    });
    wait_gone(restarted, "the removed server");
    wait_gone(second_pid, "the removed server");

    // The keys change: Bob's is taken from the next request on, Alice's no longer.
    let metrics = |key: &str| {
        let auth = bearer(key);
        request(&address, "GET", "/metrics", &[("Authorization", auth.as_str())], "").status
    };
    assert_eq!((metrics(ALICE), metrics(BOB)), (200, 401));
    project.file("toolmux.yaml", "serve:\n  apiKeys:\n    bob: ${BOB_KEY}\nfs: {}\n");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while metrics(BOB) != 200 {
        assert!(std::time::Instant::now() < deadline, "Bob's key was never taken");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metrics(ALICE), 401);
    // A file whose keys cannot be used (too short) changes nothing.
    project.file("toolmux.yaml", "serve:\n  apiKeys:\n    eve: short\nfs: {}\n");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!((metrics(BOB), metrics("short")), (200, 401));
    let stopped = stop(gateway);
    assert_eq!(stopped.code, 0, "{stopped:?}");
    assert!(stopped.stderr.contains("toolmux: reloaded"), "{}", stopped.stderr);
    assert!(stopped.stderr.contains("unchanged, still running: fx"), "{}", stopped.stderr);
    assert!(stopped.stderr.contains("shorter than 16 characters"), "{}", stopped.stderr);
    assert!(stopped.stderr.contains("changed but cannot be used"), "{}", stopped.stderr);
    assert!(
        stopped.stderr.contains("still serving the previous configuration"),
        "{}",
        stopped.stderr
    );
}

/// `serve --watch`: an external call waiting when the file changes is still listed after
/// the reload, and a result submitted then reaches it; an event stream goes on with the new
/// configuration's calls.
#[test]
fn watch_keeps_external_calls_waiting_through_a_reload() {
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file("toolmux.yaml", CONFIG);
    let gateway = crate::serve::serve_http_with(&project, &["--watch"]);
    let address = address_of(&gateway.url);
    let alice_auth = bearer(ALICE);
    let as_alice = [("Authorization", alice_auth.as_str())];
    let mut alice = Agent::start(&address, ALICE);
    let waiting = alice.call("external__confirm", json!({"question": "ship?"}));
    let listed = || {
        let listed = request(&address, "GET", "/api/tool-calls", &as_alice, "");
        json_body(&listed)["calls"].as_array().cloned().unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let call = loop {
        if let Some(call) = listed().first().cloned() {
            break call;
        }
        assert!(std::time::Instant::now() < deadline, "the call was never listed");
        std::thread::sleep(Duration::from_millis(50));
    };

    // An event stream opened before the reload follows the new orchestrator after it.
    let mut events = send(&address, "GET", "/api/events?tool=fs__grep", &as_alice, "");
    assert_eq!(events.status, 200);
    // A reload: the builtin tools added.
    project.file("toolmux.yaml", &format!("{CONFIG}fs: {{}}\n"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tools = alice.request("tools/list", json!({}));
        let names = tools["result"]["tools"].as_array().cloned().unwrap_or_default();
        if names.iter().any(|t| t["name"] == "fs__grep") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no reload: {tools}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (found, failed) = alice.call("fs__grep", json!({"pattern": "ship"})).recv().unwrap();
    assert!(!failed, "{found}");
    let (kind, started) = next_event(&mut *events.body);
    assert_eq!((kind.as_str(), &started["tool"]), ("tool.started", &json!("fs__grep")));
    let still = listed();
    assert_eq!(still.len(), 1, "{still:?}");
    assert_eq!(still[0]["callId"], call["callId"]);

    let run = call["runId"].as_str().expect("a run id");
    let path = format!("/api/runs/{}/tool-results", segment(run));
    let answer = json!({"callId": call["callId"], "result": {"confirmed": true}}).to_string();
    let json_type = ("Content-Type", "application/json");
    let taken = request(&address, "POST", &path, &[as_alice[0], json_type], &answer);
    assert_eq!(taken.status, 200, "{}", taken.body);
    let answered = waiting.recv_timeout(Duration::from_secs(20)).expect("the call returns");
    assert_eq!(answered, (json!({"confirmed": true}), false));
    let stopped = stop(gateway);
    assert_eq!(stopped.code, 0, "{}", stopped.stderr);
}

/// People post to spaces and read them over HTTP; agents (MCP clients) meet them there,
/// see the calls of visible tools shown, and each key holder has spaces of its own.
#[test]
fn people_and_agents_meet_in_spaces_over_http_and_holders_keep_theirs_apart() {
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file("toolmux.yaml", &format!("{CONFIG}spaces:\n  inMemory: true\n"));
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    let alice_auth = bearer(ALICE);
    let bob_auth = bearer(BOB);
    let as_alice = [("Authorization", alice_auth.as_str())];
    let as_bob = [("Authorization", bob_auth.as_str())];

    // A person starts a space by posting to it.
    let body = json!({"author": "husam", "text": "book a hotel in Tokyo"}).to_string();
    let posted = request(&address, "POST", "/api/spaces/trip/messages", &as_alice, &body);
    assert_eq!(posted.status, 201, "{}", posted.body);
    assert_eq!(json_body(&posted)["author"], "person:husam");

    // A user interface follows the space from now on; Bob's key cannot.
    let mut follow = send(&address, "GET", "/api/spaces/trip/events", &as_alice, "");
    assert_eq!(follow.status, 200);
    assert_eq!(follow.header("content-type"), Some("text/event-stream"));
    let refused = request(&address, "GET", "/api/spaces/trip/events", &as_bob, "");
    assert_eq!(refused.status, 404, "{}", refused.body);

    // Alice's agent enters it, sees the message, and asks for a confirmation there.
    let mut agent = Agent::start(&address, ALICE);
    let (entered, failed) =
        agent.call("gateway__enter_space", json!({"space": "trip"})).recv().unwrap();
    assert!(!failed, "{entered}");
    assert_eq!(entered["messages"][0]["text"], "book a hotel in Tokyo", "{entered}");
    let (asked, failed) =
        agent.call("external__build", json!({"target": "booking"})).recv().unwrap();
    assert!(!failed, "{asked}");

    let page = request(&address, "GET", "/api/spaces/trip/messages?offset=1", &as_alice, "");
    assert_eq!(page.status, 200, "{}", page.body);
    let page = json_body(&page);
    assert_eq!(page["total"], 2, "{page}");
    let shown = &page["messages"][0]["tool"];
    assert_eq!(shown["name"], "external__build");
    assert_eq!(shown["status"], "requires_action");
    assert_eq!(shown["callId"], asked["callId"]);

    // The interface saw the call as it was made, and sees it again once answered.
    let (event, message) = next_event(&mut follow.body);
    assert_eq!(event, "message");
    assert_eq!(message["tool"]["status"], "requires_action", "{message}");
    let (event, started) = next_event(&mut follow.body);
    assert_eq!((event.as_str(), &started), ("tool.started", &message));
    let calls = json_body(&request(&address, "GET", "/api/tool-calls", &as_alice, ""));
    let run = calls["calls"][0]["runId"].as_str().expect("a run").to_owned();
    let answer = json!({"callId": asked["callId"], "result": {"booked": true}}).to_string();
    let path = format!("/api/runs/{}/tool-results", segment(&run));
    assert_eq!(request(&address, "POST", &path, &as_alice, &answer).status, 200);
    let (event, answered) = next_event(&mut follow.body);
    assert_eq!(event, "message");
    assert_eq!(answered["index"], message["index"]);
    assert_eq!(answered["tool"]["status"], "complete", "{answered}");
    assert_eq!(answered["tool"]["result"], json!({"booked": true}));
    assert!(answered["rev"].as_u64() > message["rev"].as_u64());
    let (event, done) = next_event(&mut follow.body);
    assert_eq!((event.as_str(), &done), ("tool.done", &answered));
    // A client that reconnects from a revision gets what came after it.
    let from = format!("/api/spaces/trip/events?since={}", message["rev"]);
    let mut again = send(&address, "GET", &from, &as_alice, "");
    assert_eq!(next_event(&mut again.body), ("message".to_owned(), answered.clone()));
    assert_eq!(next_event(&mut again.body), ("tool.done".to_owned(), answered));

    // Bob's key sees none of it.
    let listed = json_body(&request(&address, "GET", "/api/spaces", &as_bob, ""));
    assert_eq!(listed, json!({"spaces": []}));
    let hidden = request(&address, "GET", "/api/spaces/trip/messages", &as_bob, "");
    assert_eq!(hidden.status, 404, "{}", hidden.body);
    assert!(hidden.body.contains("there is no space `trip`"), "{}", hidden.body);
    let listed = json_body(&request(&address, "GET", "/api/spaces", &as_alice, ""));
    assert_eq!(listed["spaces"][0]["space"], "trip", "{listed}");

    // Mistakes are told.
    let bad = request(&address, "POST", "/api/spaces/trip/messages", &as_alice, "{\"text\": 1}");
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("`author` and `text` (strings) are required"), "{}", bad.body);
    let bad = request(&address, "GET", "/api/spaces/trip/messages?page=2", &as_alice, "");
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("unknown query parameter `page`"), "{}", bad.body);
    let bad = request(&address, "POST", "/api/spaces/no%20pe/messages", &as_alice, &body);
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("is not a space name"), "{}", bad.body);
    let anonymous = request(&address, "GET", "/api/spaces", &[], "");
    assert_eq!(anonymous.status, 401);
    stop(gateway);
}

/// `serve.holderTools`: a key holder is listed and may call only its tools (the deferred
/// tools' `tools__call` and the HTTP API keep to them too); other holders see every tool;
/// a holder that holds no key is a configuration error.
#[test]
fn a_key_holder_limited_to_some_tools_sees_and_calls_only_those() {
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file("notes.md", "TODO: views\n").file(
        "toolmux.yaml",
        &format!("{CONFIG}fs: {{}}\nserve:\n  apiKeys:\n    alice: ${{ALICE_KEY}}\n    bob: ${{BOB_KEY}}\n  holderTools:\n    bob: ['fs__read', 'fs__grep']\n")
            .replacen("serve:\n  apiKeys:\n    alice: ${ALICE_KEY}\n    bob: ${BOB_KEY}\n", "", 1),
    );
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    let names = tool_names;
    let mut bob = Agent::start(&address, BOB);
    assert_eq!(names(&mut bob), ["fs__read", "fs__grep"]);
    let mut alice = Agent::start(&address, ALICE);
    let everything = names(&mut alice);
    assert!(everything.contains(&"external__build".to_owned()), "{everything:?}");
    assert!(everything.contains(&"fs__ls".to_owned()), "{everything:?}");

    // Bob's calls outside his tools are unknown to him; inside, they run.
    let refused = bob.request("tools/call", json!({"name": "fs__ls", "arguments": {}}));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let (found, failed) =
        bob.call("fs__grep", json!({"pattern": "TODO", "output_mode": "content"})).recv().unwrap();
    assert!(!failed, "{found}");
    assert!(found.to_string().contains("views"), "{found}");
    // The external tools' HTTP API is not his either.
    let bob_auth = bearer(BOB);
    let listing =
        request(&address, "GET", "/api/tool-calls", &[("Authorization", bob_auth.as_str())], "");
    assert_eq!(listing.status, 404, "{}", listing.body);
    assert!(listing.body.contains("serve.holderTools"), "{}", listing.body);
    // `/health` names him only the providers of his tools.
    let health = |auth: &str| request(&address, "GET", "/health", &[("Authorization", auth)], "");
    let his: Value = serde_json::from_str(&health(&bob_auth).body).expect("JSON");
    assert_eq!(his["providers"], json!({"fs": {"ok": true}}), "{his}");
    let hers: Value = serde_json::from_str(&health(&bearer(ALICE)).body).expect("JSON");
    assert!(hers["providers"]["external"].is_object(), "{hers}");
    stop(gateway);

    // A holder that holds no key is a mistake in the file.
    project.file("toolmux.yaml", "fs: {}\nserve:\n  apiKeys:\n    alice: ${ALICE_KEY}\n  holderTools:\n    bobb: ['fs__read']\n");
    let checked = project.run(&["config", "check"]);
    assert_eq!(checked.code, 2, "{checked:?}");
    assert!(
        checked
            .stderr
            .contains("serve.holderTools: `bobb` holds no key under `serve.apiKeys` (alice)"),
        "{}",
        checked.stderr
    );
}

/// `serve --watch`: a change of `serve.holderTools` reaches the holder's next request, in
/// the session it already has.
#[test]
fn a_reload_changes_what_a_limited_holder_is_served() {
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    let config = |tools: &str| {
        format!(
            "fs: {{}}\nserve:\n  apiKeys:\n    alice: ${{ALICE_KEY}}\n    bob: ${{BOB_KEY}}\n  holderTools:\n    bob: [{tools}]\n"
        )
    };
    project.file("toolmux.yaml", &config("fs__read"));
    let gateway = crate::serve::serve_http_with(&project, &["--watch"]);
    let address = address_of(&gateway.url);
    let mut bob = Agent::start(&address, BOB);
    let mut names = || tool_names(&mut bob);
    assert_eq!(names(), ["fs__read"]);
    project.file("toolmux.yaml", &config("fs__read, fs__ls"));
    let started = std::time::Instant::now();
    loop {
        let now = names();
        if now == ["fs__read", "fs__ls"] {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "not reloaded: {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(gateway);
}

/// `serve --watch` watches the user's file too: a server added there is served without a
/// restart, as one added to the project's file is.
#[test]
fn watch_reloads_when_the_users_file_changes() {
    let fixture = crate::conformance::fixture_bin().with_file_name("toolmux-mcp-fixture");
    let project = Project::new().env("ALICE_KEY", ALICE);
    let user = project.path().join("home/config.yaml");
    let project = project.env("TOOLMUX_USER_CONFIG", user.to_str().expect("a UTF-8 path"));
    project
        .file("toolmux.yaml", "serve:\n  apiKeys:\n    alice: ${ALICE_KEY}\nfs: {}\n")
        .file("home/config.yaml", "defaults: {toolTimeout: 5000}\n");
    let gateway = crate::serve::serve_http_with(&project, &["--watch"]);
    let mut agent = Agent::start(&address_of(&gateway.url), ALICE);
    assert!(!tool_names(&mut agent).iter().any(|n| n.starts_with("fx__")));
    project.file(
        "home/config.yaml",
        &format!("mcpServers:\n  fx:\n    command: {}\n    args: [ok]\n", fixture.display()),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !tool_names(&mut agent).iter().any(|n| n == "fx__pid") {
        assert!(std::time::Instant::now() < deadline, "the user's server was never served");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (pid, failed) = agent.call("fx__pid", json!({})).recv().expect("an answer");
    assert!(!failed, "{pid}");
    let stopped = stop(gateway);
    assert!(stopped.stderr.contains("toolmux: reloaded"), "{}", stopped.stderr);
    assert!(stopped.stderr.contains("home/config.yaml"), "{}", stopped.stderr);
}

/// `serve --watch` looks for the user's file again and again: one created after the start
/// is read (its server served), and once it is removed its server goes; two of them at
/// once are an error said once, the configuration served so far kept.
#[test]
fn watch_reads_a_users_file_created_after_the_start() {
    let fixture = crate::conformance::fixture_bin().with_file_name("toolmux-mcp-fixture");
    let project = Project::new().env("ALICE_KEY", ALICE).unset("TOOLMUX_USER_CONFIG");
    let xdg = project.path().join("xdg");
    let project = project.env("XDG_CONFIG_HOME", xdg.to_str().expect("a UTF-8 path"));
    project.file("toolmux.yaml", "serve:\n  apiKeys:\n    alice: ${ALICE_KEY}\nfs: {}\n");
    let gateway = crate::serve::serve_http_with(&project, &["--watch"]);
    let mut agent = Agent::start(&address_of(&gateway.url), ALICE);
    assert!(!tool_names(&mut agent).iter().any(|n| n.starts_with("fx__")));
    project.file(
        "xdg/toolmux/config.yaml",
        &format!("mcpServers:\n  fx:\n    command: {}\n    args: [ok]\n", fixture.display()),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !tool_names(&mut agent).iter().any(|n| n == "fx__pid") {
        assert!(std::time::Instant::now() < deadline, "the new user's file was never read");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::remove_file(xdg.join("toolmux/config.yaml")).expect("remove the user's file");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tool_names(&mut agent).iter().any(|n| n.starts_with("fx__")) {
        assert!(std::time::Instant::now() < deadline, "the removed user's file still counts");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Two user's files at once: which to read is the person's to say. Said, once, and the
    // configuration served so far is kept (the next start refuses the folder).
    project
        .file(
            "xdg/toolmux/config.yaml",
            &format!("mcpServers:\n  fx:\n    command: {}\n", fixture.display()),
        )
        .file("xdg/toolmux/config.json", "{}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(!tool_names(&mut agent).iter().any(|n| n.starts_with("fx__")));
    let stopped = stop(gateway);
    assert!(stopped.stderr.contains("xdg/toolmux/config.yaml"), "{}", stopped.stderr);
    let said = "`config.json` is in this folder too, and toolmux reads one user configuration \
                file only";
    assert_eq!(stopped.stderr.matches(said).count(), 1, "{}", stopped.stderr);
    assert!(
        stopped.stderr.contains("; still serving the previous configuration"),
        "{}",
        stopped.stderr
    );
}

/// A result for a call that expired is refused with 410, saying so: the call is gone for
/// good, which a 404 (not pending, perhaps not yet) did not tell.
#[test]
fn a_result_for_an_expired_call_is_gone() {
    let project = Project::new().env("ALICE_KEY", ALICE).env("BOB_KEY", BOB);
    project.file("toolmux.yaml", &format!("defaults: {{externalCallTtl: 1000}}\n{CONFIG}"));
    let gateway = serve_http(&project);
    let address = address_of(&gateway.url);
    let alice_auth = bearer(ALICE);
    let mut alice = Agent::start(&address, ALICE);
    let (started, _) = alice.call("external__build", json!({"target": "app"})).recv().unwrap();
    let listed = request(&address, "GET", "/api/tool-calls", &[("Authorization", &alice_auth)], "");
    let run = json_body(&listed)["calls"][0]["runId"].as_str().expect("a run").to_owned();
    std::thread::sleep(Duration::from_millis(1500));
    let path = format!("/api/runs/{}/tool-results", segment(&run));
    let answer = json!({"callId": started["callId"], "result": "built"}).to_string();
    let headers = [("Authorization", alice_auth.as_str()), ("Content-Type", "application/json")];
    let refused = request(&address, "POST", &path, &headers, &answer);
    assert_eq!(refused.status, 410, "{}", refused.body);
    assert!(json_body(&refused)["error"].as_str().unwrap_or_default().contains("expired after"));
    let run = stop(gateway);
    assert_eq!(run.code, 0, "{}", run.stderr);
}
