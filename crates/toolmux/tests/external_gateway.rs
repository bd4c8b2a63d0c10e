//! The seeds' `executionType: gateway` external tools through the facade: a configuration
//! loaded from YAML, its tools making real HTTP requests to a server on 127.0.0.1 through
//! the orchestrator, and the configuration mistakes, each naming the tool.
#![cfg(all(feature = "external", feature = "rest"))]

use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use toolmux::Toolmux;
use toolmux::config::{FileFormat, Loaded, load_str};
use toolmux::toolmux_core::{CallContext, ToolCall, ToolProvider};

/// How long the server and the test wait for anything.
const WAIT: Duration = Duration::from_secs(10);

/// The secret the configuration takes from the environment.
const KEY: &str = "s3cret-weather-key";

fn load(yaml: &str, dir: &Path) -> Result<Loaded, toolmux::ToolmuxError> {
    let env = |name: &str| (name == "WEATHER_KEY").then(|| KEY.to_owned());
    load_str(yaml, FileFormat::Yaml, "toolmux.yaml", dir, &env)
}

/// A request as the server read it: the request line, the headers (names lowercase) and
/// the body.
#[derive(Debug)]
struct Seen {
    line: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 server on 127.0.0.1 answering `count` requests, one per connection, each
/// with a JSON object telling what it got (the `x-api-key` header included); every request
/// goes to the returned channel. It stops waiting after [`WAIT`].
fn serve(count: usize) -> (String, mpsc::Receiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("bound"));
    listener.set_nonblocking(true).expect("a non-blocking listener");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        let mut answered = 0;
        while answered < count && Instant::now() < deadline {
            match listener.accept() {
                Ok((stream, _)) => {
                    let seen = answer(stream);
                    answered += 1;
                    if sender.send(seen).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    });
    (base, receiver)
}

fn answer(mut stream: TcpStream) -> Seen {
    stream.set_nonblocking(false).expect("a blocking stream");
    stream.set_read_timeout(Some(WAIT)).expect("a read timeout");
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = stream.read(&mut chunk).expect("the request headers");
        assert!(n > 0, "connection closed before the headers ended");
        bytes.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(bytes[..head_end].to_vec()).expect("UTF-8 headers");
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().expect("a numeric content-length"));
    let mut body = bytes[head_end + 4..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).expect("the request body");
        assert!(n > 0, "connection closed before the body ended");
        body.extend_from_slice(&chunk[..n]);
    }
    let seen = Seen { line, headers, body: String::from_utf8(body).expect("a UTF-8 body") };
    let reply = json!({"got": seen.line, "key": seen.header("x-api-key"), "temperature": 21});
    let reply = reply.to_string();
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{reply}",
        reply.len()
    );
    stream.write_all(response.as_bytes()).expect("the response sent");
    seen
}

/// The seeds' `fetchWeather` (a GET with a header from `${WEATHER_KEY}`) and a POST whose
/// URL takes an argument: each call reaches the server as configured, and the response is
/// the result, the secret redacted, with the `visible` extra of the external tools.
#[tokio::test]
async fn gateway_tools_make_their_http_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (base, requests) = serve(2);
    let yaml = format!(
        "
defaults: {{outputDir: out}}
externalTools:
  fetchWeather:
    description: The weather now in a city
    executionType: gateway
    visible: true
    inputSchema: {{type: object, properties: {{city: {{type: string}}}}, required: [city]}}
    execution:
      url: {base}/current
      method: GET
      headers: {{X-Api-Key: '${{WEATHER_KEY}}'}}
  postReading:
    description: Records a reading of a station
    executionType: gateway
    visible: false
    timeout: 5000
    inputSchema:
      type: object
      properties: {{station: {{type: string}}, celsius: {{type: number}}}}
    execution: {{url: '{base}/readings/${{parameters.station}}', method: POST}}
"
    );
    let loaded = load(&yaml, dir.path()).unwrap();
    let toolmux = Toolmux::build(&loaded).await.unwrap();
    let orchestrator = toolmux.orchestrator();
    assert!(orchestrator.warmup().await.is_ok());

    let listed = orchestrator.list_tools().await.unwrap();
    let weather = listed.iter().find(|t| t.name == "external__fetchWeather").unwrap();
    assert_eq!(weather.description, "The weather now in a city");
    assert_eq!(weather.input_schema["required"], json!(["city"]));

    let call = ToolCall::new("external__fetchWeather", json!({"city": "Paris"}));
    let result = orchestrator.execute(call, &CallContext::new()).await;
    assert!(result.ok, "{result:?}");
    let seen = requests.recv_timeout(WAIT).unwrap();
    assert_eq!(seen.line, "GET /current?city=Paris HTTP/1.1");
    assert_eq!(seen.header("x-api-key"), Some(KEY));
    let text = result.result.clone().unwrap();
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["got"], "GET /current?city=Paris HTTP/1.1");
    assert_eq!(body["temperature"], 21);
    // The key the server echoed is a secret from the environment: redacted.
    assert_eq!(body["key"], "[redacted]", "{text}");
    assert_eq!(result.extras.get("visible"), Some(&json!(true)), "{result:?}");
    assert_eq!(result.namespace, "external");

    let call = ToolCall::new("external__postReading", json!({"station": "orly", "celsius": 20.5}));
    let result = orchestrator.execute(call, &CallContext::new()).await;
    assert!(result.ok, "{result:?}");
    let seen = requests.recv_timeout(WAIT).unwrap();
    assert_eq!(seen.line, "POST /readings/orly HTTP/1.1");
    assert_eq!(serde_json::from_str::<Value>(&seen.body).unwrap(), json!({"celsius": 20.5}));
    assert_eq!(seen.header("x-api-key"), None);
    assert_eq!(result.extras.get("visible"), Some(&json!(false)), "{result:?}");
}

/// A server that does not answer within the tool's `timeout` fails the call with the HTTP
/// request's own timeout, not the orchestrator's.
#[tokio::test]
async fn a_gateway_tool_times_out_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // Accepts the connection and never answers (kept open until the test ends).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let yaml = format!(
        "
defaults: {{outputDir: out}}
externalTools:
  slow: {{description: Never answers, executionType: gateway, timeout: 300, execution: {{url: '{base}/'}}}}
"
    );
    let loaded = load(&yaml, dir.path()).unwrap();
    let toolmux = Toolmux::build(&loaded).await.unwrap();
    assert!(toolmux.orchestrator().warmup().await.is_ok());
    let call = ToolCall::new("external__slow", json!({}));
    let result = toolmux.orchestrator().execute(call, &CallContext::new()).await;
    assert!(!result.ok, "{result:?}");
    // The tool's own limit ends it (named as the caller knows it): the orchestrator's is a
    // second longer.
    let said = result.error.as_deref();
    assert_eq!(said, Some("timeout: `external__slow` did not finish within 300ms"));
    assert_eq!(result.extras.get("code"), Some(&json!("timeout")));
    drop(listener);
}

/// The seeds' own first example, `confirmAction` with both `isAsync: true` and
/// `execution.url`, loads with a warning that `isAsync` is ignored, and its call is the HTTP
/// request, answered inline, as the seeds' decision flow looks at the URL first.
#[tokio::test]
async fn the_seeds_first_example_makes_its_request_inline() {
    let dir = tempfile::tempdir().unwrap();
    let (base, requests) = serve(1);
    let json = format!(
        r#"{{"defaults": {{"outputDir": "out"}}, "externalTools": [{{
  "name": "confirmAction",
  "description": "Ask the user to confirm an action",
  "inputSchema": {{"type": "object", "properties": {{"question": {{"type": "string"}}}}}},
  "executionType": "space",
  "visible": true,
  "isAsync": true,
  "timeout": 30000,
  "execution": {{ "url": "{base}/confirm", "method": "POST" }}
}}]}}"#
    );
    let loaded = load_str(&json, FileFormat::Json, "toolmux.json", dir.path(), &|_| None).unwrap();
    assert_eq!(
        loaded.warnings,
        ["toolmux.json: externalTools.confirmAction: `isAsync: true` is ignored: a tool with \
          `execution.url` is answered inline by its HTTP request; remove `isAsync`, or \
          `execution` for a result submitted later"]
    );
    let toolmux = Toolmux::build(&loaded).await.unwrap();
    assert!(toolmux.orchestrator().warmup().await.is_ok());
    let call = ToolCall::new("external__confirmAction", json!({"question": "Book it?"}));
    let result = toolmux.orchestrator().execute(call, &CallContext::new()).await;
    assert!(result.ok, "{result:?}");
    let seen = requests.recv_timeout(WAIT).unwrap();
    assert_eq!(seen.line, "POST /confirm HTTP/1.1");
    assert_eq!(serde_json::from_str::<Value>(&seen.body).unwrap(), json!({"question": "Book it?"}));
    // The response is the result, not `{"status": "pending"}`.
    let answer: Value = serde_json::from_str(result.result.as_deref().unwrap()).unwrap();
    assert_eq!(answer["got"], "POST /confirm HTTP/1.1");
    assert_eq!(answer["temperature"], 21);
}

/// Each mistake in `execution` is a configuration error naming the tool and the fix.
#[tokio::test]
async fn execution_mistakes_are_configuration_errors_naming_the_tool() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "weather: {description: d, executionType: gateway}",
            "toolmux.yaml: externalTools: `weather`: `executionType: gateway` makes an HTTP request; add `execution.url`",
        ),
        (
            "weather: {description: d, executionType: gateway, execution: {method: POST}}",
            "toolmux.yaml: externalTools: `weather`: `executionType: gateway` makes an HTTP request; add `execution.url`",
        ),
        (
            "chart: {description: d, executionType: internal, execution: {url: 'http://127.0.0.1:9/'}}",
            "toolmux.yaml: externalTools: `chart`: an `internal` tool executes nothing; remove `execution` or choose `executionType: gateway`",
        ),
        (
            "weather: {description: d, executionType: gateway, execution: {url: 'http://127.0.0.1:9/', method: 'NOT A METHOD'}}",
            "toolmux.yaml: externalTools: invalid configuration of `weather`: invalid method `NOT A METHOD`",
        ),
    ];
    for (tool, expected) in cases {
        let yaml = format!("defaults: {{outputDir: out}}\nexternalTools:\n  {tool}\n");
        let loaded = load(&yaml, dir.path()).unwrap();
        let error = Toolmux::build(&loaded).await.unwrap_err().to_string();
        assert_eq!(error, expected);
    }
}

/// With `spaces`, a visible gateway tool needs a space and shows its call and result
/// there, secrets redacted as everywhere else.
#[tokio::test]
async fn a_visible_gateway_tool_shows_its_call_in_the_space_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let (base, requests) = serve(1);
    let yaml = format!(
        "
spaces: {{dir: rooms}}
externalTools:
  fetchWeather:
    description: The weather now in a city
    executionType: gateway
    execution: {{url: {base}/current, headers: {{X-Api-Key: '${{WEATHER_KEY}}'}}}}
"
    );
    let loaded = load(&yaml, dir.path()).unwrap();
    let toolmux = Toolmux::build(&loaded).await.unwrap();
    let orchestrator = toolmux.orchestrator();
    assert!(orchestrator.warmup().await.is_ok());
    let ctx = CallContext::new().with_run_id("r1");
    let weather = || ToolCall::new("external__fetchWeather", json!({"city": "Paris"}));

    let refused = orchestrator.execute(weather(), &ctx).await;
    assert!(!refused.ok);
    assert!(refused.error.as_deref().unwrap_or_default().contains("not in a space"), "{refused:?}");
    assert!(requests.try_recv().is_err(), "no request is made outside a space");

    let enter = ToolCall::new("gateway__enter_space", json!({"space": "weather"}));
    assert!(orchestrator.execute(enter, &ctx).await.ok);
    let result = orchestrator.execute(weather(), &ctx).await;
    assert!(result.ok, "{result:?}");
    requests.recv_timeout(WAIT).unwrap();

    let read = ToolCall::new("gateway__read_messages", json!({"space": "weather", "offset": 0}));
    let page = orchestrator.execute(read, &ctx).await;
    let text = page.result.unwrap();
    let page: Value = serde_json::from_str(&text).unwrap();
    let shown = &page["messages"][0]["tool"];
    assert_eq!(shown["name"], "external__fetchWeather");
    assert_eq!(shown["status"], "complete");
    assert_eq!(shown["result"]["temperature"], 21);
    assert_eq!(shown["result"]["key"], "[redacted]");
    // Nor is it in the spaces folder.
    for entry in std::fs::read_dir(dir.path().join("rooms/spaces")).unwrap() {
        let stored = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(!stored.contains(KEY), "{stored}");
    }
}

/// A visible gateway tool's call is shown in its space when it is made, before its request
/// returns, as the seeds stream a visible call: a space client following
/// `gateway__changes` gets `tool.started` while the server still holds the response (it
/// answers only once the test has seen it), then `tool.done` with the result.
#[tokio::test]
async fn a_visible_gateway_call_is_shown_before_its_response() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (release, released) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("the request's connection");
        // Held until the test saw the call in the space (or gave up waiting).
        let _ = released.recv_timeout(WAIT);
        answer(stream)
    });
    let yaml = format!(
        "
spaces: {{dir: rooms}}
externalTools:
  fetchWeather:
    description: The weather now in a city
    executionType: gateway
    execution: {{url: {base}/current}}
"
    );
    let loaded = load(&yaml, dir.path()).unwrap();
    let toolmux = Toolmux::build(&loaded).await.unwrap();
    let orchestrator = toolmux.orchestrator();
    assert!(orchestrator.warmup().await.is_ok());
    let ctx = CallContext::new().with_run_id("r1");
    let enter = ToolCall::new("gateway__enter_space", json!({"space": "weather"}));
    assert!(orchestrator.execute(enter, &ctx).await.ok);
    let changes = |since: u64| async move {
        let args = json!({"space": "weather", "since": since, "waitMs": 200});
        let viewer = CallContext::new().with_run_id("viewer");
        let answer = orchestrator.execute(ToolCall::new("gateway__changes", args), &viewer).await;
        serde_json::from_str::<Value>(&answer.result.expect("the changes")).unwrap()
    };
    let start = changes(0).await["version"].as_u64().unwrap();

    let call = ToolCall::new("external__fetchWeather", json!({"city": "Paris"}));
    let called = orchestrator.execute(call, &ctx);
    let follow = async {
        let deadline = Instant::now() + WAIT;
        let mut since = start;
        let mut events = Vec::new();
        while Instant::now() < deadline {
            let got = changes(since).await;
            since = got["version"].as_u64().unwrap();
            for event in got["events"].as_array().unwrap() {
                events.push(event["event"].as_str().unwrap().to_owned());
            }
            if events.iter().any(|e| e == "tool.started") {
                let shown = &got["messages"][0]["tool"];
                assert_eq!(shown["status"], "requires_action", "{got}");
                assert_eq!(shown["arguments"], json!({"city": "Paris"}));
                break;
            }
        }
        // The response is sent only now.
        release.send(()).unwrap();
        (events, since)
    };
    let (result, (events, since)) = tokio::join!(called, follow);
    assert_eq!(events, ["message", "tool.started"], "tool.started came before the response");
    assert!(result.ok, "{result:?}");
    server.join().unwrap();
    let got = changes(since).await;
    let named: Vec<&str> =
        got["events"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(named, ["message", "tool.done"]);
    let shown = &got["messages"][0]["tool"];
    assert_eq!(shown["status"], "complete");
    assert_eq!(shown["result"]["temperature"], 21);
}

/// `tools.NAME.showInSpace` shows a file tool's calls in the caller's space as a visible
/// external tool's are: `tool.started` with the arguments, then `tool.done` with the
/// result the caller got, or `tool.error` with its error; a tool without it, and a caller
/// in no space, post nothing.
#[tokio::test]
async fn a_tool_shown_in_space_posts_its_calls_there() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "hello from the notes\n").unwrap();
    let yaml = "
fs: {}
spaces: {dir: rooms}
tools:
  fs__read: {showInSpace: true}
";
    let loaded = load(yaml, dir.path()).unwrap();
    let toolmux = Toolmux::build(&loaded).await.unwrap();
    let orchestrator = toolmux.orchestrator();
    assert!(orchestrator.warmup().await.is_ok());
    let ctx = CallContext::new().with_run_id("r1");
    let read = |path: &str| ToolCall::new("fs__read", json!({"path": path}));
    // In a run of its own: a run's second read of unchanged lines is not repeated.
    let elsewhere = CallContext::new().with_run_id("r0");
    let outside = orchestrator.execute(read("notes.txt"), &elsewhere).await;
    assert!(outside.ok, "a caller in no space runs it unshown: {outside:?}");
    let enter = ToolCall::new("gateway__enter_space", json!({"space": "desk"}));
    assert!(orchestrator.execute(enter, &ctx).await.ok);
    let changes = |since: u64| async move {
        let args = json!({"space": "desk", "since": since});
        let viewer = CallContext::new().with_run_id("viewer");
        let answer = orchestrator.execute(ToolCall::new("gateway__changes", args), &viewer).await;
        serde_json::from_str::<Value>(&answer.result.expect("the changes")).unwrap()
    };
    let start = changes(0).await["version"].as_u64().unwrap();

    let read_ok = orchestrator.execute(read("notes.txt"), &ctx).await;
    assert!(read_ok.ok, "{read_ok:?}");
    let listed = orchestrator.execute(ToolCall::new("fs__ls", json!({})), &ctx).await;
    assert!(listed.ok, "{listed:?}");
    let missing = orchestrator.execute(read("missing.txt"), &ctx).await;
    assert!(!missing.ok);

    let got = changes(start).await;
    let events: Vec<&str> =
        got["events"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        events,
        ["message", "tool.started", "tool.done", "message", "tool.started", "tool.error"],
        "{got}"
    );
    let messages = got["messages"].as_array().unwrap();
    let done = &messages[0]["tool"];
    assert_eq!(done["name"], "fs__read");
    assert_eq!(done["toolName"], "fs__read");
    assert_eq!(done["arguments"], json!({"path": "notes.txt"}));
    assert_eq!(done["status"], "complete");
    assert_eq!(done["result"].as_str(), read_ok.result.as_deref(), "what the caller got");
    assert!(done["result"].as_str().unwrap().contains("hello from the notes"), "{done}");
    let failed = &messages[1]["tool"];
    assert_eq!(failed["status"], "error");
    assert!(failed["result"].as_str().unwrap().contains("missing.txt"), "{failed}");
}

/// `showInSpace` without `spaces`, or on an external tool, is a configuration error
/// naming the key and the fix.
#[tokio::test]
async fn show_in_space_mistakes_are_configuration_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "fs: {}\ntools:\n  fs__read: {showInSpace: true}\n",
            "toolmux.yaml: tools.fs__read.showInSpace: its calls are shown in spaces, and none are configured: add a `spaces` section (`spaces: {}` keeps them under the output folder), or remove this key",
        ),
        (
            "spaces: {dir: rooms}\nexternalTools:\n  ask: {description: d}\ntools:\n  external__ask: {showInSpace: true}\n",
            "toolmux.yaml: tools.external__ask.showInSpace: an external tool's calls are shown with `externalTools.NAME.visible`; remove this key",
        ),
    ];
    for (yaml, expected) in cases {
        let loaded = load(yaml, dir.path()).unwrap();
        let error = Toolmux::build(&loaded).await.unwrap_err().to_string();
        assert_eq!(error, expected);
    }
    let off = "fs: {}\ntools:\n  fs__read: {showInSpace: false}\n";
    assert!(Toolmux::build(&load(off, dir.path()).unwrap()).await.is_ok());
}
