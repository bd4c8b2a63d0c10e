//! Serving over an in-process stdio pair, driven by rmcp's client.

use crate::provider::{Fixture, LONG_NAME};
use crate::support::{
    Client, Lifecycle, call, connect_io, connect_streams, eventually, first_text, socket_pair,
    within,
};
use expect_test::expect;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, NumberOrString, PaginatedRequestParams,
    ProgressToken, RequestMetaObject, SubscriptionFilter,
};
use rmcp::service::PeerRequestOptions;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use toolmux_mcp::server::ServeOptions;
use toolmux_test_support::mock::{Behavior, MockProvider};

fn fixture(bulk: usize) -> Arc<Fixture> {
    Arc::new(Fixture::new(bulk))
}

#[tokio::test]
async fn handshake_names_the_server_and_its_instructions() {
    for lifecycle in [Lifecycle::Initialize, Lifecycle::Discover] {
        let options = ServeOptions { server_name: "gateway".into(), ..ServeOptions::default() };
        let (client, _, server) = connect_io(fixture(0), options, lifecycle).await;
        let info = client.peer_info().expect("server info");
        let server_info = info.server_info.as_ref().expect("implementation");
        assert_eq!(server_info.name, "gateway");
        assert_eq!(
            info.instructions.as_deref(),
            Some("Fixture tools for the toolmux-mcp server tests.")
        );
        let tools = info.capabilities.tools.as_ref().expect("tools capability");
        assert_eq!(tools.list_changed, Some(true));
        let expected = match lifecycle {
            Lifecycle::Initialize => "2025-11-25",
            Lifecycle::Discover => "2026-07-28",
        };
        assert_eq!(info.protocol_version.as_str(), expected);
        within(client.cancel()).await.unwrap();
        within(server).await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn instructions_in_options_win() {
    let options = ServeOptions { instructions: Some("use fs".into()), ..ServeOptions::default() };
    let (client, _, _server) = connect_io(fixture(0), options, Lifecycle::Initialize).await;
    assert_eq!(client.peer_info().unwrap().instructions.as_deref(), Some("use fs"));
}

#[tokio::test]
async fn tools_are_listed_in_pages() {
    let options = ServeOptions { page_size: 100, ..ServeOptions::default() };
    let (client, _, _server) = connect_io(fixture(250), options, Lifecycle::Initialize).await;
    let first = within(client.list_tools(None)).await.unwrap();
    assert_eq!(first.tools.len(), 100);
    let cursor = first.next_cursor.clone().expect("a second page");
    let second = within(
        client.list_tools(Some(PaginatedRequestParams::default().with_cursor(Some(cursor)))),
    )
    .await
    .unwrap();
    assert_eq!(second.tools.len(), 100);
    let all = within(client.list_all_tools()).await.unwrap();
    let fixture_tools = Fixture::new(0).list_visible_count().await;
    assert_eq!(all.len(), 250 + fixture_tools);
    let mut names: Vec<&str> = all.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len(), "no tool is listed twice");
    assert!(!names.contains(&"hidden"));
}

/// A page's cursor names the tool it ended with: when a tool before it is removed between
/// pages (clients are told with `list_changed`), the next page still starts right after
/// that tool, skipping none (an offset skipped one).
#[tokio::test]
async fn the_next_page_starts_after_the_last_tool_listed_whatever_changed_before_it() {
    let provider = fixture(250);
    let options = ServeOptions { page_size: 100, ..ServeOptions::default() };
    let (client, recorder, _server) =
        connect_io(provider.clone(), options, Lifecycle::Initialize).await;
    let all = within(client.list_all_tools()).await.unwrap();
    let first = within(client.list_tools(None)).await.unwrap();
    let last = first.tools.last().unwrap().name.to_string();
    let at = all.iter().position(|t| t.name == last).unwrap();
    provider.remove_tool("echo");
    eventually("list_changed", || async { recorder.list_changed.load(Ordering::SeqCst) > 0 }).await;
    let params = PaginatedRequestParams::default().with_cursor(first.next_cursor.clone());
    let second = within(client.list_tools(Some(params))).await.unwrap();
    assert_eq!(second.tools[0].name, all[at + 1].name, "the tool after `{last}`");
}

#[tokio::test]
async fn an_invalid_cursor_is_an_invalid_params_error() {
    let (client, _, _server) =
        connect_io(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    let params = PaginatedRequestParams::default().with_cursor(Some("nope".into()));
    let error = within(client.list_tools(Some(params))).await.unwrap_err();
    expect![[r#"Mcp error: -32602: invalid cursor `nope`"#]].assert_eq(&error.to_string());
}

#[tokio::test]
async fn tools_carry_their_annotations() {
    let (client, _, _server) =
        connect_io(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    let tools = within(client.list_all_tools()).await.unwrap();
    let echo = tools.iter().find(|t| t.name == "echo").unwrap();
    expect![[r#"{"name":"echo","title":"Echo","description":"Echoes `message`","inputSchema":{"properties":{"message":{"type":"string"}},"type":"object"},"annotations":{"title":"Echo","readOnlyHint":true,"destructiveHint":false,"idempotentHint":true,"openWorldHint":false}}"#]]
        .assert_eq(&serde_json::to_string(echo).unwrap());
    let image = tools.iter().find(|t| t.name == "image").unwrap();
    assert_eq!(image.annotations.as_ref().unwrap().destructive_hint, Some(true));
    let structured = tools.iter().find(|t| t.name == "structured").unwrap();
    assert!(structured.output_schema.is_some());
    let schema = tools.iter().find(|t| t.name == "json_schema_2020_12_tool").unwrap();
    assert!(schema.input_schema.contains_key("$defs"), "2020-12 keywords are kept");
}

#[tokio::test]
async fn calls_return_content() {
    let (client, _, _server) =
        connect_io(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    let echo = call(&client, "echo", json!({"message": "hi"})).await;
    assert_eq!(first_text(&echo), "echo: hi");
    assert_eq!(echo.is_error, Some(false));
    let image = call(&client, "image", json!({})).await;
    let image = serde_json::to_value(&image.content).unwrap();
    assert_eq!(image[1]["type"], "image");
    assert_eq!(image[1]["mimeType"], "image/png");
    let structured = call(&client, "structured", json!({})).await;
    assert_eq!(structured.structured_content, Some(json!({"n": 42})));
    let mixed = call(&client, "test_multiple_content_types", json!({})).await;
    let types: Vec<String> = serde_json::to_value(&mixed.content)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types, ["text", "image", "resource"]);
}

#[tokio::test]
async fn failures_are_error_results_not_protocol_errors() {
    let (client, _, _server) =
        connect_io(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    let failed = call(&client, "fail", json!({})).await;
    assert_eq!(failed.is_error, Some(true));
    expect!["the fail tool always fails"].assert_eq(&first_text(&failed));
    let errored = call(&client, "error_output", json!({})).await;
    assert_eq!(errored.is_error, Some(true));
    expect!["scripted error output"].assert_eq(&first_text(&errored));
    // The connection is still good.
    assert_eq!(
        first_text(&call(&client, "echo", json!({"message": "after"})).await),
        "echo: after"
    );
}

#[tokio::test]
async fn a_mock_provider_s_errors_are_error_results() {
    let mock = MockProvider::new("mock")
        .with_tool("fails", Behavior::Fail("remote exploded".into()))
        .with_tool("errs", Behavior::ErrorOutput("bad input".into()))
        .with_tool("panics", Behavior::Panic);
    let (client, _, _server) =
        connect_io(Arc::new(mock), ServeOptions::default(), Lifecycle::Initialize).await;
    // A panic in the provider is answered too (it was never answered: the request's
    // task died and the client waited for ever), and the connection stays good.
    for (tool, text) in
        [("fails", "remote exploded"), ("errs", "bad input"), ("panics", "panicked"), ("errs", "")]
    {
        let result = call(&client, tool, json!({})).await;
        assert_eq!(result.is_error, Some(true), "{tool}");
        assert!(first_text(&result).contains(text), "{tool}: {}", first_text(&result));
    }
}

#[tokio::test]
async fn an_unknown_tool_is_a_json_rpc_error() {
    let (client, _, _server) =
        connect_io(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    let error = within(client.call_tool(CallToolRequestParams::new("nope"))).await.unwrap_err();
    expect![[r#"Mcp error: -32602: unknown tool `fixture__nope`"#]].assert_eq(&error.to_string());
}

#[tokio::test]
async fn hidden_tools_are_callable_by_name() {
    let (client, _, _server) =
        connect_io(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    assert_eq!(first_text(&call(&client, "hidden", json!({})).await), "hidden but callable");
}

async fn progress_reaches_the_client(lifecycle: Lifecycle) {
    let (client, recorder, _server) =
        connect_io(fixture(0), ServeOptions::default(), lifecycle).await;
    let token = ProgressToken(NumberOrString::String("p-1".into()));
    let mut meta = RequestMetaObject::new();
    meta.set_progress_token(token.clone());
    let params = CallToolRequestParams::new("progress")
        .with_arguments(json!({"steps": 3}).as_object().unwrap().clone());
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let mut options = PeerRequestOptions::no_options();
    options.meta = Some(meta);
    let handle = within(client.send_cancellable_request(request, options)).await.unwrap();
    within(handle.await_response()).await.unwrap();
    // Notifications are sent before the response, but handled on their own task. Reports
    // closer together than the gateway's progress interval are coalesced: the first goes out
    // at once and the last before the result, the middle one only when the tool was slow.
    eventually("the last progress report", || async {
        recorder.progress.lock().unwrap().last().is_some_and(|p| p.progress == 3.0)
    })
    .await;
    let reports: Vec<String> = recorder
        .progress
        .lock()
        .unwrap()
        .iter()
        .map(|p| format!("{}:{}/{:?} {:?}", p.progress_token.0, p.progress, p.total, p.message))
        .filter(|report| !report.starts_with("0:2/"))
        .collect();
    expect![[r#"
        0:1/Some(3.0) Some("step 1")
        0:3/Some(3.0) Some("step 3")"#]]
    .assert_eq(&reports.join("\n"));
}

#[tokio::test]
async fn progress_reaches_the_client_over_initialize() {
    progress_reaches_the_client(Lifecycle::Initialize).await;
}

#[tokio::test]
async fn progress_reaches_the_client_over_2026_07_28() {
    progress_reaches_the_client(Lifecycle::Discover).await;
}

/// Calls `hang`, waits until it runs, cancels it and waits until it has ended.
async fn cancel_a_hanging_call(client: &Client, mock: &MockProvider) {
    let request =
        ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParams::new("hang")));
    let handle = within(client.send_cancellable_request(request, PeerRequestOptions::no_options()))
        .await
        .unwrap();
    eventually("the call to start", || async { mock.in_flight() == 1 }).await;
    within(handle.cancel(Some("test".into()))).await.unwrap();
    eventually("the call to end", || async { mock.in_flight() == 0 }).await;
}

#[tokio::test]
async fn a_cancelled_call_cancels_the_tool() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
    let (client, _, _server) =
        connect_io(mock.clone(), ServeOptions::default(), Lifecycle::Initialize).await;
    cancel_a_hanging_call(&client, &mock).await;
    // The session goes on.
    let tools = within(client.list_all_tools()).await.unwrap();
    assert_eq!(tools.len(), 1);
}

#[tokio::test]
async fn an_abandoned_call_cancels_the_tool_over_2026_07_28() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
    let (client, _, _server) =
        connect_io(mock.clone(), ServeOptions::default(), Lifecycle::Discover).await;
    let client = Arc::new(client);
    let caller = client.clone();
    let call = tokio::spawn(async move {
        let _ = caller.call_tool(CallToolRequestParams::new("hang")).await;
    });
    eventually("the call to start", || async { mock.in_flight() == 1 }).await;
    // Dropping the call's future abandons it; rmcp then sends `notifications/cancelled`.
    call.abort();
    let _ = call.await;
    eventually("the call to end", || async { mock.in_flight() == 0 }).await;
    assert_eq!(mock.calls_of("hang"), 1);
}

#[tokio::test]
async fn list_changes_reach_initialized_sessions() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let (client, recorder, _server) =
        connect_io(mock.clone(), ServeOptions::default(), Lifecycle::Initialize).await;
    assert_eq!(within(client.list_all_tools()).await.unwrap().len(), 1);
    mock.add_tool("b", Behavior::Echo);
    eventually("list_changed", || async { recorder.list_changed.load(Ordering::SeqCst) == 1 })
        .await;
    assert_eq!(within(client.list_all_tools()).await.unwrap().len(), 2);
}

#[tokio::test]
async fn list_changes_reach_2026_07_28_subscriptions() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let (client, _, _server) =
        connect_io(mock.clone(), ServeOptions::default(), Lifecycle::Discover).await;
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let mut subscription = within(client.listen(filter)).await.unwrap();
    mock.add_tool("b", Behavior::Echo);
    let notification = within(subscription.next()).await.unwrap().expect("a notification");
    let method = serde_json::to_value(&notification).unwrap()["method"].clone();
    assert_eq!(method, "notifications/tools/list_changed");
}

/// A burst of changes reaches a 2026-07-28 subscription as one or two notifications, as
/// it does a session (see [`a_burst_of_list_changes_is_announced_once`]).
#[tokio::test]
async fn a_burst_of_list_changes_reaches_a_subscription_once() {
    use std::time::Duration;
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let (client, _, _server) =
        connect_io(mock.clone(), ServeOptions::default(), Lifecycle::Discover).await;
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    let mut subscription = within(client.listen(filter)).await.unwrap();
    for n in 0..20 {
        mock.add_tool(&format!("burst_{n}"), Behavior::Echo);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut announced = 0;
    // Past the longest an announcement is held (a second after the burst began).
    let until = tokio::time::Instant::now() + Duration::from_millis(1200);
    while let Ok(notification) = tokio::time::timeout_at(until, subscription.next()).await {
        let method = serde_json::to_value(notification.expect("a notification")).unwrap();
        assert_eq!(method["method"], "notifications/tools/list_changed", "{method}");
        announced += 1;
    }
    assert!((1..=2).contains(&announced), "{announced} announcements of 20 changes");
}

#[tokio::test]
async fn each_session_is_one_run() {
    let provider = fixture(0);
    let (one, _, _s1) =
        connect_io(provider.clone(), ServeOptions::default(), Lifecycle::Initialize).await;
    let (two, _, _s2) = connect_io(provider, ServeOptions::default(), Lifecycle::Initialize).await;
    let first = first_text(&call(&one, "run_id", json!({})).await);
    assert_eq!(first, first_text(&call(&one, "run_id", json!({})).await));
    assert_ne!(first, first_text(&call(&two, "run_id", json!({})).await));
    assert!(first.starts_with("mcp-"), "{first}");
}

#[tokio::test]
async fn a_name_prefix_shortens_long_names_and_routes_them_back() {
    let options =
        ServeOptions { name_prefix: Some("mcp__toolmux__".into()), ..ServeOptions::default() };
    let (client, _, _server) = connect_io(fixture(0), options, Lifecycle::Initialize).await;
    let tools = within(client.list_all_tools()).await.unwrap();
    let budget = 64 - "mcp__toolmux__".len();
    assert!(tools.iter().all(|t| t.name.len() <= budget));
    let long = tools.iter().find(|t| t.name.starts_with("a_tool_whose_name")).unwrap();
    assert_ne!(long.name, LONG_NAME);
    expect!["a_tool_whose_name_is_much_longer_than_any_cfef9f08"].assert_eq(&long.name);
    assert_eq!(first_text(&call(&client, &long.name, json!({})).await), "long name reached");
    // Short names are served as they are.
    assert_eq!(first_text(&call(&client, "echo", json!({"message": "x"})).await), "echo: x");
}

#[tokio::test]
async fn without_a_prefix_long_names_are_kept() {
    let (client, _, _server) =
        connect_io(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    assert_eq!(first_text(&call(&client, LONG_NAME, json!({})).await), "long name reached");
}

#[tokio::test]
async fn the_server_ends_when_the_client_leaves() {
    let (client, _, server) =
        connect_io(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    within(client.cancel()).await.unwrap();
    within(server).await.unwrap().unwrap();
}

/// The same server on async streams (`serve_io`) lists, calls and ends alike.
#[tokio::test]
async fn serving_async_streams_lists_calls_and_ends() {
    let (client, _, server) =
        connect_streams(fixture(0), ServeOptions::default(), Lifecycle::Initialize).await;
    let tools = within(client.list_all_tools()).await.unwrap();
    assert!(tools.iter().any(|t| t.name == LONG_NAME), "{tools:?}");
    assert_eq!(first_text(&call(&client, LONG_NAME, json!({})).await), "long name reached");
    within(client.cancel()).await.unwrap();
    within(server).await.unwrap().unwrap();
}

/// A client that sends many calls before reading anything: responses that do not fit in
/// the socket wait in order for the client to read, none is lost or cut, and the reader
/// thread goes on taking requests meanwhile.
#[tokio::test]
async fn responses_wait_for_a_client_that_is_not_reading() {
    use toolmux_core::{ToolKind, ToolOutput, ToolSet};
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Input {
        n: usize,
    }
    const CALLS: usize = 40;
    const SIZE: usize = 64 * 1024;
    let tools = ToolSet::new("t", ToolKind::Builtin).with_typed(
        "big",
        "A large text",
        |input: Input, _| async move {
            Ok(ToolOutput::text(format!("{}:{}", input.n, "x".repeat(SIZE))))
        },
    );
    let (stream, server) = socket_pair(Arc::new(tools), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    for n in 0..CALLS {
        client
            .send(json!({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
                "name": "big", "arguments": {"n": n}
            }}))
            .await;
    }
    let mut seen = [false; CALLS];
    for _ in 0..CALLS {
        let response = client.next().await;
        let n = response["id"].as_u64().expect("a response to a call") as usize;
        let text = response["result"]["content"][0]["text"].as_str().expect("a text result");
        assert_eq!(text.len(), format!("{n}:").len() + SIZE, "response {n} is whole");
        assert!(text.starts_with(&format!("{n}:")), "response {n} answers call {n}");
        seen[n] = true;
    }
    assert!(seen.iter().all(|&s| s), "every call answered once");
    drop(client);
    within(server).await.unwrap().unwrap();
}

type BoxedRead = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
type BoxedWrite = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// A raw JSON-RPC client on the server's stream: writes lines, reads lines.
pub(crate) struct RawClient {
    lines: tokio::io::Lines<tokio::io::BufReader<BoxedRead>>,
    writer: BoxedWrite,
}

impl RawClient {
    pub(crate) fn new(
        stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    ) -> Self {
        use tokio::io::AsyncBufReadExt;
        let (reader, writer) = tokio::io::split(stream);
        let reader: BoxedRead = Box::new(reader);
        RawClient { lines: tokio::io::BufReader::new(reader).lines(), writer: Box::new(writer) }
    }

    /// The `initialize` handshake of a client that can answer elicitations.
    pub(crate) async fn handshake(&mut self) {
        self.handshake_with(json!({"elicitation": {"form": {}}})).await;
    }

    /// The `initialize` handshake (2025-11-25) of a client with `capabilities`.
    pub(crate) async fn handshake_with(&mut self, capabilities: serde_json::Value) {
        self.send(json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "1"}
        }}))
        .await;
        assert_eq!(self.next().await["id"], "init");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    }

    /// The handshake of a client that runs calls as tasks, then a call (id 1) of `tool`
    /// with `arguments`, which the server runs as a task (it is one of its task tools);
    /// the task's id.
    pub(crate) async fn start_task(&mut self, tool: &str, arguments: serde_json::Value) -> String {
        self.handshake_with(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})).await;
        self.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}))
            .await;
        let created = self.next().await;
        let task = created["result"]["taskId"].as_str();
        task.unwrap_or_else(|| panic!("no task: {created}")).to_owned()
    }

    pub(crate) async fn send(&mut self, message: serde_json::Value) {
        self.send_line(&message.to_string()).await;
    }

    /// Sends `line` as it is, and a newline.
    async fn send_line(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        let line = format!("{line}\n");
        within(self.writer.write_all(line.as_bytes())).await.unwrap();
    }

    pub(crate) async fn next(&mut self) -> serde_json::Value {
        let line = within(self.lines.next_line()).await.unwrap().expect("a line");
        serde_json::from_str(&line).unwrap()
    }
}

/// A call of an initialized session takes the direct path (not rmcp's loop): its log
/// lines and progress reach the client before its result, and a question it asks the
/// client goes out as a request whose answer comes back to the call.
#[tokio::test]
async fn direct_calls_log_report_and_ask_before_their_result() {
    direct_calls_scenario(true).await;
}

/// As [`direct_calls_log_report_and_ask_before_their_result`], served on async streams.
#[tokio::test]
async fn direct_calls_on_async_streams_log_report_and_ask_before_their_result() {
    direct_calls_scenario(false).await;
}

async fn direct_calls_scenario(threaded: bool) {
    use toolmux_core::{ElicitationRequest, LogLevel, Progress, ToolKind, ToolOutput, ToolSet};
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Input {}
    let tools = ToolSet::new("t", ToolKind::Builtin).with_typed(
        "greet",
        "Asks for a name",
        |_: Input, ctx: toolmux_core::CallContext| async move {
            ctx.log_text(LogLevel::Info, "looking up");
            ctx.report_progress(Progress::new(1.0, Some(2.0)));
            let schema = json!({"type": "object", "properties": {"name": {"type": "string"}}});
            let answer = ctx.elicit(ElicitationRequest::new("Your name?", schema)).await?;
            ctx.report_progress(Progress::new(2.0, Some(2.0)));
            let name = answer.content.and_then(|c| c.get("name").cloned()).unwrap_or_default();
            Ok(ToolOutput::text(format!("hello {}", name.as_str().unwrap_or("?"))))
        },
    );
    let (mut client, server) = if threaded {
        let (stream, server) = socket_pair(Arc::new(tools), ServeOptions::default());
        (RawClient::new(stream), server)
    } else {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (reader, writer) = tokio::io::split(server_io);
        let server = tokio::spawn(toolmux_mcp::server::serve_io(
            Arc::new(tools),
            ServeOptions::default(),
            reader,
            writer,
        ));
        (RawClient::new(client_io), server)
    };
    client.handshake().await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "info"}}))
        .await;
    assert_eq!(client.next().await["id"], 2);
    client
        .send(json!({"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {
            "name": "greet", "arguments": {}, "_meta": {"progressToken": "p"}
        }}))
        .await;
    let mut seen = Vec::new();
    let result = loop {
        let message = client.next().await;
        if message["method"] == "elicitation/create" {
            assert_eq!(message["params"]["message"], "Your name?");
            seen.push("elicitation".to_owned());
            // A second call under the id of the one in flight is refused, and the first
            // goes on.
            client
                .send(json!({"jsonrpc": "2.0", "id": "c", "method": "tools/call", "params": {
                    "name": "greet", "arguments": {}
                }}))
                .await;
            let refused = client.next().await;
            assert_eq!(refused["id"], "c", "{refused}");
            assert_eq!(refused["error"]["code"], -32600, "{refused}");
            let text = refused["error"]["message"].as_str().unwrap_or_default();
            assert!(text.contains("already used by a call in flight"), "{refused}");
            client
                .send(json!({"jsonrpc": "2.0", "id": message["id"].clone(), "result": {
                    "action": "accept", "content": {"name": "Ann"}
                }}))
                .await;
            continue;
        }
        if message["id"] == "c" {
            break message;
        }
        let method = message["method"].as_str().unwrap_or_default().to_owned();
        if method == "notifications/progress" {
            assert_eq!(message["params"]["progressToken"], "p");
            seen.push(format!("progress {}", message["params"]["progress"]));
        } else {
            seen.push(method);
        }
    };
    assert_eq!(result["result"]["content"][0]["text"], "hello Ann", "{result}");
    assert_eq!(
        seen,
        ["notifications/message", "progress 1.0", "elicitation", "progress 2.0"],
        "everything the call sent came before its result"
    );
    // An unknown tool is still the protocol error MCP specifies.
    client
        .send(
            json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "nope"}}),
        )
        .await;
    let error = client.next().await;
    assert_eq!(error["error"]["code"], -32602, "{error}");
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// When serving ends before the client's input does (here the client stops reading, so
/// nothing can be written to it), the thread reading a socket input lets go of it instead
/// of keeping it until the process exits: the client then finds the socket closed.
#[tokio::test]
async fn serving_that_ends_first_lets_go_of_a_socket_input() {
    use std::io::{BufRead, Write};
    let (stream, server) = socket_pair(fixture(0), ServeOptions::default());
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    let client = tokio::task::spawn_blocking(move || {
        let mut writer = &stream;
        let mut lines = std::io::BufReader::new(&stream).lines();
        let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}
        }});
        writeln!(writer, "{initialize}").unwrap();
        assert!(lines.next().unwrap().unwrap().contains("\"id\":1"));
        writeln!(writer, "{}", json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .unwrap();
        stream.shutdown(std::net::Shutdown::Read).unwrap();
        writeln!(writer, "{}", json!({"jsonrpc": "2.0", "id": 2, "method": "ping"})).unwrap();
        stream
    });
    let stream = within(client).await.unwrap();
    // The answer to the ping cannot be written: the session ends with the input still open.
    let _ = within(server).await.unwrap();
    let closed = tokio::task::spawn_blocking(move || {
        let ping = format!("{}\n", json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
        for _ in 0..500 {
            match (&stream).write_all(ping.as_bytes()) {
                Ok(()) => std::thread::sleep(std::time::Duration::from_millis(10)),
                Err(e) => return Some(e.kind()),
            }
        }
        None
    });
    let closed = within(closed).await.unwrap();
    assert_eq!(closed, Some(std::io::ErrorKind::BrokenPipe), "the server's end stays open");
}

/// Calls of a tool its provider relays take the relay, with or without a progress token,
/// under a name prefix too; the answers are what any call gives; cancelling one cancels
/// the tool.
#[tokio::test]
async fn relayed_tools_are_relayed_and_answered_as_any_call() {
    let mock = Arc::new(
        MockProvider::new("mock")
            .with_tool("say", Behavior::Text("said".into()))
            .with_tool("bad", Behavior::ErrorOutput("it broke".into()))
            .with_tool("echo", Behavior::Echo)
            .with_tool("hang", Behavior::Hang)
            .with_relay(),
    );
    let options =
        ServeOptions { name_prefix: Some("mcp__toolmux__".into()), ..ServeOptions::default() };
    let (client, _, _server) = connect_io(mock.clone(), options, Lifecycle::Initialize).await;
    within(client.list_all_tools()).await.unwrap();
    let said = call(&client, "say", json!({"anything": [1, 2]})).await;
    // Passed on as the provider gave it: without `isError`, which means no error.
    assert_eq!((first_text(&said), said.is_error), ("said".to_owned(), None));
    assert_eq!(mock.relayed_calls(), 1);
    // An error output, and one that is not plain text, come decoded and encoded as usual.
    let bad = call(&client, "bad", json!({})).await;
    assert_eq!((first_text(&bad), bad.is_error), ("it broke".to_owned(), Some(true)));
    let echo = call(&client, "echo", json!({"n": 1})).await;
    let echoed: serde_json::Value = serde_json::from_str(&first_text(&echo)).unwrap();
    assert_eq!((echoed, echo.is_error), (json!({"n": 1}), Some(false)));
    assert_eq!(mock.relayed_calls(), 3);
    // With a progress token.
    let mut meta = RequestMetaObject::new();
    meta.set_progress_token(ProgressToken(NumberOrString::String("p-1".into())));
    let request =
        ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParams::new("say")));
    let mut options = PeerRequestOptions::no_options();
    options.meta = Some(meta);
    let handle = within(client.send_cancellable_request(request, options)).await.unwrap();
    let answer = format!("{:?}", within(handle.await_response()).await.unwrap());
    assert!(answer.contains("said"), "{answer}");
    assert_eq!(mock.relayed_calls(), 4);
    // Cancelled.
    cancel_a_hanging_call(&client, &mock).await;
    assert_eq!(mock.relayed_calls(), 5);
    // Without arguments.
    let said = within(client.call_tool(CallToolRequestParams::new("say"))).await.unwrap();
    assert_eq!(first_text(&said), "said");
    assert_eq!((mock.relayed_calls(), mock.total_calls()), (6, 6));
}

/// A line that is JSON but no message is answered with an error carrying an id, as
/// JSON-RPC wants: the request's own when it has one (its client waits for that id; rmcp
/// answered `-32600` with no id at all, and the client waited on), else `null`; a batch
/// is told that MCP has none. The session goes on.
#[tokio::test]
async fn lines_that_are_no_message_are_answered_with_their_id() {
    let (stream, server) = socket_pair(fixture(0), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    let lines = [
        r#"{"jsonrpc":"2.0","id":7,"method":"ping","params":[1]}"#,
        r#"{"id":8,"method":"ping"}"#,
        r#"{"jsonrpc":"1.0","id":"nine","method":"tools/list"}"#,
        r#"[{"jsonrpc":"2.0","id":10,"method":"ping"}]"#,
        r#"{"jsonrpc":"2.0","id":{"an":"object"},"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":11,"method":"ping"}"#,
    ];
    for line in lines {
        client.send_line(line).await;
    }
    let mut answers = Vec::new();
    while answers.last().is_none_or(|a: &serde_json::Value| a["id"] != 11) {
        answers.push(client.next().await);
    }
    let of = |id: serde_json::Value| {
        answers.iter().find(|a| a.get("id") == Some(&id)).cloned().unwrap_or_else(|| {
            panic!("no answer with id {id}: {answers:?}");
        })
    };
    assert_eq!(of(json!(7))["error"]["code"], -32600, "{answers:?}");
    assert_eq!(of(json!(8))["error"]["code"], -32600, "{answers:?}");
    assert_eq!(of(json!("nine"))["error"]["code"], -32600, "{answers:?}");
    let nulls: Vec<_> = answers.iter().filter(|a| a.get("id") == Some(&json!(null))).collect();
    assert_eq!(nulls.len(), 2, "{answers:?}");
    assert!(nulls.iter().all(|a| a["error"]["code"] == -32600), "{answers:?}");
    assert!(nulls.iter().any(|a| a["error"]["message"].as_str().unwrap().contains("batch")));
    assert!(answers.iter().all(|a| a.get("id").is_some()), "every answer has an id: {answers:?}");
    assert_eq!(of(json!(11))["result"], json!({}));
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// A request line longer than a line may be (16 MiB; rmcp drops it) is answered with an
/// error naming its id, wherever the id is in it, so its client stops waiting; the
/// session goes on.
#[tokio::test]
async fn a_line_too_long_is_answered_with_its_id() {
    let (stream, server) = socket_pair(fixture(0), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    let message = "a".repeat(17 << 20);
    let long = format!(
        r#"{{"jsonrpc":"2.0","method":"tools/call","params":{{"name":"echo","arguments":{{"message":"{message}","id":5}}}},"id":"long"}}"#
    );
    client.send_line(&long).await;
    client.send_line(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#).await;
    let mut answers = Vec::new();
    while !answers.iter().any(|a: &serde_json::Value| a["id"] == "long") {
        answers.push(client.next().await);
    }
    let refused = answers.iter().find(|a| a["id"] == "long").unwrap();
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("MiB"), "{refused}");
    while !answers.iter().any(|a| a["id"] == 2) {
        answers.push(client.next().await);
    }
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// A `tools/call` that takes rmcp's path (one whose `_meta` has more than a progress
/// token and trace context), as JSON-RPC request `id`.
fn rmcp_path_call(id: u64, tool: &str) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": tool, "arguments": {}, "_meta": {"toolmux/runId": "agent-1"}
    }})
}

/// The serve fixture's `serve_stdio` as a process of its own, with `args` after `stdio`:
/// the process, its stdin, and its stdout a line at a time.
fn stdio_process(
    args: &[&str],
) -> (tokio::process::Child, tokio::process::ChildStdin, StdoutLines) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolmux-mcp-serve-fixture"))
        .arg("stdio")
        .args(args)
        .current_dir(crate::support::repo_root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the fixture starts");
    let stdin = child.stdin.take().expect("piped stdin");
    let lines = tokio::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    (child, stdin, lines)
}

type StdoutLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// Everything left on `lines`, as JSON-RPC messages, until the process closes its stdout.
async fn read_to_end(lines: &mut StdoutLines) -> Vec<serde_json::Value> {
    let mut messages = Vec::new();
    while let Some(line) = within(lines.next_line()).await.unwrap() {
        messages.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")));
    }
    messages
}

/// A client's `initialize` request (id 0) and `notifications/initialized`, as lines.
fn opening_lines() -> String {
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}
    }});
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    format!("{initialize}\n{initialized}\n")
}

/// When the client closes its stream while calls run that do not end, every call is
/// cancelled once the end-of-input grace is over, whichever path it took (the direct path,
/// or rmcp's for a call with more in `_meta`), and serving ends without waiting more.
/// (rmcp cancelled its calls only after waiting up to 5 s for them to answer.)
#[tokio::test]
async fn closing_the_input_cancels_calls_still_running_after_the_grace() {
    use tokio::io::AsyncWriteExt;
    let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
    let grace = std::time::Duration::from_millis(300);
    let options = ServeOptions { end_of_input_grace: grace, ..ServeOptions::default() };
    let (stream, server) = socket_pair(mock.clone(), options);
    let mut client = RawClient::new(stream);
    client.handshake().await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "hang", "arguments": {}}}))
        .await;
    client.send(rmcp_path_call(2, "hang")).await;
    eventually("both calls to start", || async { mock.in_flight() == 2 }).await;
    let closed = std::time::Instant::now();
    within(client.writer.shutdown()).await.unwrap();
    eventually("both calls to end", || async { mock.in_flight() == 0 }).await;
    let cancelled = closed.elapsed();
    within(server).await.unwrap().unwrap();
    let ended = closed.elapsed();
    // After the grace, and well under rmcp's 5 s drain, with room for a loaded machine.
    assert!(cancelled >= grace, "calls cancelled after {cancelled:?}, within the grace");
    assert!(cancelled < std::time::Duration::from_secs(2), "calls cancelled after {cancelled:?}");
    assert!(ended < std::time::Duration::from_secs(2), "serving ended after {ended:?}");
}

/// The real `serve --stdio` process exits once the end-of-input grace is over when its
/// stdin closes with a call on rmcp's path that does not end (it waited 5 s for rmcp's
/// drain).
#[tokio::test]
async fn the_process_exits_after_the_grace_when_stdin_closes_during_a_hung_call() {
    use tokio::io::AsyncWriteExt;
    let (mut child, mut stdin, mut lines) = stdio_process(&["--end-of-input-grace-ms", "300"]);
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"});
    let input = format!("{}{}\n{ping}\n", opening_lines(), rmcp_path_call(2, "hang"));
    within(stdin.write_all(input.as_bytes())).await.unwrap();
    // The ping's answer comes after rmcp took the call, which then runs.
    loop {
        let line = within(lines.next_line()).await.unwrap().expect("the ping's answer");
        if serde_json::from_str::<serde_json::Value>(&line).unwrap()["id"] == 1 {
            break;
        }
    }
    let closed = std::time::Instant::now();
    drop(stdin);
    let status = within(child.wait()).await.unwrap();
    let ended = closed.elapsed();
    assert!(status.success(), "{status}");
    assert!(ended < std::time::Duration::from_secs(2), "the process exited after {ended:?}");
}

/// A second `initialize` in a session is refused (MCP: it is the first request only),
/// saying so, and the session goes on as it was.
#[tokio::test]
async fn a_second_initialize_is_refused() {
    let (stream, _server) = socket_pair(fixture(0), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    client
        .send(json!({"jsonrpc": "2.0", "id": "again", "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "other", "version": "2"}
        }}))
        .await;
    let refused = client.next().await;
    assert_eq!(refused["id"], "again", "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("already initialized") && message.contains("new session"),
        "{message}"
    );
    client
        .send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "still here"}}}))
        .await;
    let answered = client.next().await;
    assert_eq!(answered["result"]["content"][0]["text"], "echo: still here", "{answered}");
}

/// `notifications/cancelled` naming no request in flight (an id never used, a call already
/// answered, the `initialize` request, no id at all) changes nothing and is not answered;
/// one naming a running call stops it, on either path, and the call is not answered (MCP:
/// the receiver of a cancellation should not answer), while its id is free for the next
/// call at once. Gateways that forward a cancellation they cannot place to an upstream,
/// or answer it, break a session that a client keeps using.
#[tokio::test]
async fn cancellations_stop_only_the_calls_they_name() {
    let mock = Arc::new(
        MockProvider::new("mock").with_tool("hang", Behavior::Hang).with_tool("e", Behavior::Echo),
    );
    let (stream, server) = socket_pair(mock.clone(), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    let cancel = |id: serde_json::Value| {
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "test"}})
    };
    let echo = |id: u64, message: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "e", "arguments": {"message": message}}})
    };
    client.send(echo(1, "first")).await;
    assert_eq!(client.next().await["id"], 1);
    for stray in [cancel(json!(1)), cancel(json!(99)), cancel(json!("init")), cancel(json!("x"))] {
        client.send(stray).await;
    }
    client.send(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}})).await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "hang", "arguments": {}}}))
        .await;
    client.send(rmcp_path_call(3, "hang")).await;
    eventually("both calls to start", || async { mock.in_flight() == 2 }).await;
    client.send(cancel(json!(2))).await;
    client.send(cancel(json!(3))).await;
    eventually("both calls to stop", || async { mock.in_flight() == 0 }).await;
    // The ids of the cancelled calls serve new calls.
    client.send(echo(2, "second")).await;
    client.send(echo(3, "third")).await;
    client.send(json!({"jsonrpc": "2.0", "id": 4, "method": "ping"})).await;
    let mut answers = Vec::new();
    while !(answers.iter().any(|a: &serde_json::Value| a["id"] == 4)
        && answers.iter().filter(|a| a["id"] == 2 || a["id"] == 3).count() >= 2)
    {
        answers.push(client.next().await);
    }
    let texts: Vec<_> =
        answers.iter().filter_map(|a| a["result"]["content"][0]["text"].as_str()).collect();
    for message in ["second", "third"] {
        assert!(texts.iter().any(|t| t.contains(message)), "{message}: {answers:?}");
    }
    assert!(
        answers.iter().all(|a| a.get("error").is_none()),
        "no cancellation is answered, nor a call refused: {answers:?}"
    );
    assert_eq!(answers.len(), 3, "one answer each for the new calls and the ping: {answers:?}");
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// A tool whose reports go back or stand still (a provider relaying several upstreams, a
/// retried step) and one that refuses its arguments, as three clients call them.
fn wobbly_tools() -> Arc<toolmux_core::ToolSet> {
    use toolmux_core::{CallContext, Progress, ToolKind, ToolOutput, ToolSet};
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Input {
        n: u32,
    }
    let tools = ToolSet::new("t", ToolKind::Builtin).with_typed(
        "wobbly",
        "Reports 1, 1, 0.5, 2 and 2, then answers n",
        |input: Input, ctx: CallContext| async move {
            for progress in [1.0, 1.0, 0.5, 2.0, 2.0] {
                ctx.report_progress(Progress::new(progress, None));
                tokio::task::yield_now().await;
            }
            Ok(ToolOutput::text(input.n.to_string()))
        },
    );
    Arc::new(tools)
}

/// `_meta` of a call on each path: the direct one (a progress token only), rmcp's (more
/// in `_meta`), and a stateless 2026-07-28 request.
fn wobbly_call(id: u64, path: usize, arguments: serde_json::Value) -> serde_json::Value {
    let token = format!("p{id}");
    let meta = match path {
        0 => json!({"progressToken": token}),
        1 => json!({"progressToken": token, "toolmux/runId": "r"}),
        _ => json!({"progressToken": token,
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}),
    };
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "wobbly", "arguments": arguments, "_meta": meta}})
}

/// MCP has a request's progress increase with every notification: reports that go back
/// or stand still are not sent, on every path, and the rest are, each before the result.
#[tokio::test]
async fn progress_that_does_not_rise_is_not_sent() {
    let (stream, server) = socket_pair(wobbly_tools(), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    for path in 0..3 {
        client.send(wobbly_call(path as u64, path, json!({"n": 7}))).await;
    }
    let mut messages = Vec::new();
    while messages.iter().filter(|m: &&serde_json::Value| m.get("id").is_some()).count() < 3 {
        messages.push(client.next().await);
    }
    for id in 0..3u64 {
        let token = format!("p{id}");
        let reported: Vec<_> = messages
            .iter()
            .take_while(|m| m["id"] != id)
            .filter(|m| m["params"]["progressToken"] == token.as_str())
            .map(|m| m["params"]["progress"].as_f64().unwrap())
            .collect();
        assert_eq!(reported, [1.0, 2.0], "call {id}: {messages:?}");
        let answer = messages.iter().find(|m| m["id"] == id).unwrap();
        assert_eq!(answer["result"]["content"][0]["text"], "7", "{answer}");
    }
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// Arguments a tool refuses are an error result the model reads and can correct (MCP
/// 2025-11-25, SEP-1303), on every path: not `-32602`, which a client reports to its user
/// and the model never sees.
#[tokio::test]
async fn arguments_a_tool_refuses_are_error_results_on_every_path() {
    let (stream, server) = socket_pair(wobbly_tools(), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    for path in 0..3 {
        client.send(wobbly_call(path as u64, path, json!({"n": "seven"}))).await;
    }
    let mut answers = Vec::new();
    while answers.len() < 3 {
        let message = client.next().await;
        if message.get("id").is_some() {
            answers.push(message);
        }
    }
    for answer in &answers {
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        let text = answer["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("invalid arguments") && text.contains("wobbly"), "{text}");
    }
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// Before the handshake a `ping` is answered (MCP allows it), and any other request
/// without the stateless revision's `_meta` is refused with its id, saying to send
/// `initialize` first (rmcp named only the 2026-07-28 `_meta` fields, which a client of
/// the handshake revisions never heard of); a stateless request is served. After
/// `initialize`, a request that comes before `notifications/initialized` (clients that
/// pipeline) is served, and so is everything after.
#[tokio::test]
async fn requests_before_the_handshake_are_told_to_initialize() {
    let (stream, server) = socket_pair(fixture(0), ServeOptions::default());
    let mut client = RawClient::new(stream);
    let echo = |id: u64, meta: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "hi"}, "_meta": meta}})
    };
    client.send(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).await;
    assert_eq!(client.next().await, json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
    client.send(echo(2, json!({"progressToken": 2}))).await;
    client.send(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})).await;
    for id in [2, 3] {
        let refused = client.next().await;
        assert_eq!(refused["id"], id, "{refused}");
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("send an `initialize` request")
                && message.contains("io.modelcontextprotocol/protocolVersion"),
            "{message}"
        );
    }
    let stateless = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    client.send(echo(4, stateless)).await;
    let served = client.next().await;
    assert_eq!(served["result"]["content"][0]["text"], "echo: hi", "{served}");
    drop(client);
    within(server).await.unwrap().unwrap();

    let (stream, server) = socket_pair(fixture(0), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.send(echo(1, json!({}))).await;
    assert!(client.next().await["error"]["message"].as_str().unwrap().contains("initialize"));
    client
        .send(json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}
        }}))
        .await;
    client.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await;
    assert_eq!(client.next().await["id"], "init");
    let listed = client.next().await;
    assert!(listed["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()), "{listed}");
    client.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    client.send(echo(3, json!({}))).await;
    let served = client.next().await;
    assert_eq!(served["result"]["content"][0]["text"], "echo: hi", "{served}");
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// A change of the tools after the server answered `initialize` is announced once the
/// client sent `notifications/initialized`, however soon: the server watches from its
/// answer on. (It watched from when it ran the notification's handler, which rmcp runs
/// in a task of its own beside the client's first requests, so a change between the
/// client's first listing and that moment was never announced, and the client kept a
/// stale list for the whole session.)
#[tokio::test]
async fn a_change_during_the_handshake_is_announced() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let (stream, server) = socket_pair(mock.clone(), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client
        .send(json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}
        }}))
        .await;
    assert_eq!(client.next().await["id"], "init");
    mock.add_tool("b", Behavior::Echo);
    client.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
    let announced = client.next().await;
    assert_eq!(announced["method"], "notifications/tools/list_changed", "{announced}");
    // Once: a later change is announced on its own.
    client.send(json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).await;
    assert_eq!(client.next().await["id"], 1);
    mock.add_tool("c", Behavior::Echo);
    let announced = client.next().await;
    assert_eq!(announced["method"], "notifications/tools/list_changed", "{announced}");
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// A task-augmented call whose arguments the tool refuses completes with an error result
/// the model reads (SEP-1303, as the other paths answer), not `failed` with `-32602`: a
/// tool's input errors are its results, and only protocol errors fail a task.
#[tokio::test]
async fn arguments_a_tool_refuses_complete_a_task_with_an_error_result() {
    let options = ServeOptions { task_tools: vec!["wobbly".into()], ..ServeOptions::default() };
    let (stream, server) = socket_pair(wobbly_tools(), options);
    let mut client = RawClient::new(stream);
    let task = client.start_task("wobbly", json!({"n": "seven"})).await;
    let mut polled = serde_json::Value::Null;
    for id in 2..200u64 {
        client
            .send(json!({"jsonrpc": "2.0", "id": id, "method": "tasks/get",
                "params": {"taskId": task}}))
            .await;
        polled = client.next().await;
        if polled["result"]["status"] != "working" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let got = &polled["result"];
    assert_eq!(got["status"], "completed", "{polled}");
    assert!(got.get("error").is_none(), "{polled}");
    assert_eq!(got["result"]["isError"], true, "{polled}");
    let text = got["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("invalid arguments") && text.contains("wobbly"), "{text}");
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// Reads messages until the answer to `ping` `id`, which the client sends first; the
/// `list_changed` notifications read on the way are counted.
async fn announcements_before_ping(client: &mut RawClient, id: u64) -> usize {
    client.send(json!({"jsonrpc": "2.0", "id": id, "method": "ping"})).await;
    let mut announced = 0;
    loop {
        let message = client.next().await;
        if message["id"] == id {
            return announced;
        }
        assert_eq!(message["method"], "notifications/tools/list_changed", "{message}");
        announced += 1;
    }
}

/// A burst of changes of the provider's tools (an upstream reconnecting, a reload adding
/// twenty tools one by one) is announced to a session once or twice, not once per change;
/// a lone change is still announced at once, and a steady stream of changes at least
/// every second. (Each change was announced on its own unless one was being sent, so a
/// burst reached the client as a burst of notifications, each making it list again.)
#[tokio::test]
async fn a_burst_of_list_changes_is_announced_once() {
    use std::time::Duration;
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let (stream, server) = socket_pair(mock.clone(), ServeOptions::default());
    let mut client = RawClient::new(stream);
    client.handshake().await;
    assert_eq!(announcements_before_ping(&mut client, 1).await, 0);
    for n in 0..20 {
        mock.add_tool(&format!("burst_{n}"), Behavior::Echo);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Past the longest an announcement is held (a second after the burst began).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let burst = announcements_before_ping(&mut client, 2).await;
    assert!((1..=2).contains(&burst), "{burst} announcements of a burst of 20 changes");

    // A lone change is announced well before that longest hold.
    let started = std::time::Instant::now();
    mock.add_tool("lone", Behavior::Echo);
    let announced = client.next().await;
    assert_eq!(announced["method"], "notifications/tools/list_changed", "{announced}");
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(700), "a lone change announced after {waited:?}");

    // A change every 20 ms for 2.5 s is not held back for ever: it is announced at
    // least every second, and still far less often than it changes.
    for n in 0..125 {
        mock.add_tool(&format!("steady_{n}"), Behavior::Echo);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let steady = announcements_before_ping(&mut client, 3).await;
    assert!((2..=6).contains(&steady), "{steady} announcements of 125 changes in 2.5 s");
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// A last message without a newline, ended by the end of stdin, is served as a message,
/// whichever path it takes: it was dropped without a word.
#[tokio::test]
async fn a_last_message_without_a_newline_is_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let last = [
        json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}),
    ];
    for last in last {
        let (mut child, mut stdin, mut lines) = stdio_process(&[]);
        let input = format!("{}{last}", opening_lines());
        within(stdin.write_all(input.as_bytes())).await.unwrap();
        drop(stdin);
        let output = read_to_end(&mut lines).await;
        let answered =
            output.iter().any(|message| message["id"] == 7 && message.get("result").is_some());
        assert!(answered, "{last}: {output:?}");
        within(child.wait()).await.unwrap();
        // The same on async streams (`serve_io`).
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (reader, writer) = tokio::io::split(server_io);
        let provider = Arc::new(Fixture::new(0));
        let server = tokio::spawn(toolmux_mcp::server::serve_io(
            provider,
            ServeOptions::default(),
            reader,
            writer,
        ));
        let (mut from_server, mut to_server) = tokio::io::split(client_io);
        within(to_server.write_all(input.as_bytes())).await.unwrap();
        within(to_server.shutdown()).await.unwrap();
        let mut output = String::new();
        within(from_server.read_to_string(&mut output)).await.unwrap();
        let answered = output
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .any(|message| message["id"] == 7 && message.get("result").is_some());
        assert!(answered, "serve_io, {last}: {output}");
        within(server).await.unwrap().unwrap();
    }
}

/// A line of a wrong form gets over stdin the error a POST of it gets over `serve --http`:
/// `-32600` naming the member that is wrong and what it should be, with the request's id
/// when it can be read (rmcp answered `-32600 "Invalid request"` with id `null`, or said
/// only that `jsonrpc` must be "2.0"); text that is not JSON `-32700`; an `initialize` whose
/// `params` are not an initialize's `-32602`, naming the field (before the handshake it was
/// told it lacked the stateless revision's `_meta`).
#[tokio::test]
async fn malformed_lines_get_the_errors_http_gives() {
    use tokio::io::AsyncWriteExt;
    let wrong = [
        r#"{"id":8,"method":"ping"}"#,
        r#"{"jsonrpc":"1.0","id":"nine","method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":10,"method":7}"#,
        r#"{"jsonrpc":"2.0","id":11,"method":"ping","params":"x"}"#,
        r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
        r#"{"jsonrpc":"2.0","id":{"an":"object"},"method":"ping"}"#,
    ];
    let server = crate::support::HttpServer::start(fixture(0), ServeOptions::default()).await;
    let session = crate::protocol::RawSession::open(&server.url()).await;
    let mut over_http = Vec::new();
    for line in wrong {
        let answered = session.post(line).await;
        assert_eq!(answered.status, 400, "{line}: {}", answered.body);
        over_http.push(answered.message());
    }
    server.stop().await;
    let initializes = [
        r#"{"jsonrpc":"2.0","id":"i1","method":"initialize"}"#,
        r#"{"jsonrpc":"2.0","id":"i2","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":1,"clientInfo":{"name":"a","version":"1"}}}"#,
    ];
    let (mut child, mut stdin, mut lines) = stdio_process(&[]);
    let mut input = initializes.join("\n") + "\n" + &opening_lines();
    input.push_str("{\"jsonrpc\":\"2.0\",\"id\":3,\n");
    for line in wrong {
        input.push_str(line);
        input.push('\n');
    }
    input.push_str(r#"{"jsonrpc":"2.0","id":"end","method":"ping"}"#);
    within(stdin.write_all(input.as_bytes())).await.unwrap();
    drop(stdin);
    let answers = read_to_end(&mut lines).await;
    assert!(within(child.wait()).await.unwrap().success());
    let errors: Vec<_> = answers.iter().filter(|a| a.get("error").is_some()).collect();
    let told = |id: &str| {
        let answer = errors.iter().find(|a| a["id"] == id).unwrap_or_else(|| panic!("{answers:?}"));
        format!("{} {}", answer["error"]["code"], answer["error"]["message"].as_str().unwrap())
    };
    expect![[r#"-32602 Invalid params: `initialize` has no `params`; send `"params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": …, "version": …}}`"#]]
        .assert_eq(&told("i1"));
    expect!["-32602 Invalid params: `initialize`'s `params.capabilities` is 1; it is an object (`{}` for none)"]
        .assert_eq(&told("i2"));
    // The initialize after them opened the session.
    assert!(answers.iter().any(|a| a["id"] == 0 && a.get("result").is_some()), "{answers:?}");
    assert!(answers.iter().any(|a| a["id"] == "end" && a.get("result").is_some()), "{answers:?}");
    let rest: Vec<_> =
        errors.iter().filter(|a| !a["id"].is_string() || a["id"] == "nine").collect();
    assert_eq!(rest.len(), wrong.len() + 1, "{answers:?}");
    assert_eq!(rest[0]["id"], json!(null), "{answers:?}");
    assert_eq!(rest[0]["error"]["code"], -32700, "{answers:?}");
    let parse = rest[0]["error"]["message"].as_str().unwrap();
    assert!(parse.starts_with("Parse error: the line is not JSON ("), "{parse}");
    for ((line, stdio), http) in wrong.iter().zip(&rest[1..]).zip(&over_http) {
        assert_eq!(stdio["id"], http["id"], "{line}: {stdio} against HTTP's {http}");
        assert_eq!(stdio["error"], http["error"], "{line}: {stdio} against HTTP's {http}");
        assert_eq!(stdio["error"]["code"], -32600, "{line}: {stdio}");
    }
    let named: Vec<_> = rest[1..].iter().map(|a| a["error"]["message"].as_str().unwrap()).collect();
    expect![[r#"
        [
            "Invalid Request: `jsonrpc` is missing; every message has `\"jsonrpc\": \"2.0\"`",
            "Invalid Request: `jsonrpc` is \"1.0\"; every message has `\"jsonrpc\": \"2.0\"`",
            "Invalid Request: `method` is 7; a method is a string",
            "Invalid Request: `params` is \"x\"; a message's params are an object (leave `params` out when there are none)",
            "Invalid Request: `id` is 1.5; an id is a string or an integer (not null, a fraction, a number beyond 64 bits, a boolean, an object or an array)",
            "Invalid Request: `id` is {\"an\":\"object\"}; an id is a string or an integer (not null, a fraction, a number beyond 64 bits, a boolean, an object or an array)",
        ]
    "#]]
    .assert_debug_eq(&named);
}

/// A client that writes its requests and closes its stdin at once
/// (`printf '...' | toolmux serve --stdio`) gets the answers of its calls, on rmcp's path
/// (a call in the same read as the handshake, or with more in `_meta`) as on the direct
/// one, however long they take within the grace; the process exits once they are
/// written. They were cancelled at the end of stdin.
#[tokio::test]
async fn calls_in_flight_at_the_end_of_stdin_are_answered() {
    use tokio::io::AsyncWriteExt;
    let (mut child, mut stdin, mut lines) = stdio_process(&[]);
    let sleep = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "sleep_ms", "arguments": {"ms": 1500}}})
    };
    let mut slow_on_rmcp_s_path = rmcp_path_call(3, "sleep_ms");
    slow_on_rmcp_s_path["params"]["arguments"] = json!({"ms": 1500});
    let input = format!("{}{}\n", opening_lines(), sleep(1));
    within(stdin.write_all(input.as_bytes())).await.unwrap();
    let opened = within(lines.next_line()).await.unwrap().expect("the initialize answer");
    assert!(opened.contains(r#""id":0"#), "{opened}");
    let input = format!("{}\n{slow_on_rmcp_s_path}\n", sleep(2));
    within(stdin.write_all(input.as_bytes())).await.unwrap();
    let closed = std::time::Instant::now();
    drop(stdin);
    let answers = read_to_end(&mut lines).await;
    let status = within(child.wait()).await.unwrap();
    assert!(status.success(), "{status}");
    for id in [1, 2, 3] {
        let answer =
            answers.iter().find(|a| a["id"] == id).unwrap_or_else(|| panic!("{answers:?}"));
        assert_eq!(answer["result"]["content"][0]["text"], "slept", "{answer}");
        assert_eq!(answer["result"]["isError"], false, "{answer}");
    }
    assert!(closed.elapsed() >= std::time::Duration::from_millis(1400), "{:?}", closed.elapsed());
}

/// The end of input waits only for requests that will be answered: a request rmcp cannot
/// read (`params` not of its method, an id over `i64::MAX`) is answered without an id, and
/// ends nothing, so the session ends at once rather than after the 30 s grace; a request
/// nesting deeper than a message may is answered `-32700` with its id, as over HTTP, where
/// it went unanswered, a line over the 64 KiB read whole too (it went unanswered).
#[tokio::test]
async fn requests_rmcp_cannot_read_do_not_hold_the_end_of_input() {
    use tokio::io::AsyncWriteExt;
    let (mut child, mut stdin, mut lines) = stdio_process(&[]);
    let deep = format!("{}1{}", "[".repeat(1000), "]".repeat(1000));
    // Over the 64 KiB read whole: streamed to rmcp, which dropped it unanswered.
    let padding = "x".repeat(100_000);
    let input = format!(
        "{}{}\n{}\n{}\n{}\n{}\n",
        opening_lines(),
        r#"{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"ping"}"#,
        format_args!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"echo","arguments":{{"n":{deep}}}}}}}"#
        ),
        format_args!(
            r#"{{"jsonrpc":"2.0","id":"long","method":"tools/call","params":{{"name":"echo","arguments":{{"p":"{padding}","n":{deep}}}}}}}"#
        ),
        r#"{"jsonrpc":"2.0","id":"end","method":"ping"}"#,
    );
    within(stdin.write_all(input.as_bytes())).await.unwrap();
    let closed = std::time::Instant::now();
    drop(stdin);
    let answers = read_to_end(&mut lines).await;
    assert!(within(child.wait()).await.unwrap().success());
    assert!(closed.elapsed() < std::time::Duration::from_secs(10), "{:?}", closed.elapsed());
    let deep = answers.iter().find(|a| a["id"] == 7).unwrap_or_else(|| panic!("{answers:?}"));
    assert_eq!(deep["error"]["code"], -32700, "{deep}");
    let message = deep["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("nests deeper than the 128 levels"), "{message}");
    let long = answers.iter().find(|a| a["id"] == "long").unwrap_or_else(|| panic!("{answers:?}"));
    assert_eq!(long["error"]["code"], -32700, "{long}");
    let message = long["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("nests deeper than the 128 levels"), "{message}");
    assert!(answers.iter().any(|a| a["id"] == "end" && a.get("result").is_some()), "{answers:?}");
}

/// A request line longer than the direct path reads whole (64 KiB), streamed to rmcp as
/// it arrives, is answered when the client closes its stdin right after it
/// (`printf '...big request...' | toolmux serve --stdio`), as a short one is: it was not
/// counted among the requests the end of input waits for, and was cancelled there.
#[tokio::test]
async fn a_long_request_at_the_end_of_stdin_is_answered() {
    use tokio::io::AsyncWriteExt;
    let pad = "p".repeat(100 * 1024);
    let calls = [
        json!({"jsonrpc": "2.0", "id": "echo", "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": pad}}}),
        // The id last, after the long argument; and a call that takes a while.
        json!({"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": "sleep_ms", "arguments": {"ms": 1500, "pad": pad}}, "id": 9}),
    ];
    for call in calls {
        let id = call["id"].clone();
        let (mut child, mut stdin, mut lines) = stdio_process(&[]);
        within(stdin.write_all(opening_lines().as_bytes())).await.unwrap();
        // Opened first: the end of input would wait for the initialize's answer.
        let opened = within(lines.next_line()).await.unwrap().expect("the initialize answer");
        assert!(opened.contains(r#""id":0"#), "{opened}");
        within(stdin.write_all(format!("{call}\n").as_bytes())).await.unwrap();
        drop(stdin);
        let answers = read_to_end(&mut lines).await;
        assert!(within(child.wait()).await.unwrap().success());
        let answer = answers.iter().find(|a| a["id"] == id);
        let answer = answer.unwrap_or_else(|| panic!("no answer to {id}: {answers:?}"));
        assert_eq!(answer["result"]["isError"], false, "{answer}");
        let text = answer["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text == "slept" || text == format!("echo: {pad}"), "{id}: {}", &text[..40]);
    }
}

/// The fixture, keeping the resources it is subscribed to.
#[derive(Debug)]
pub(crate) struct Subscribed {
    pub(crate) fixture: Fixture,
    pub(crate) uris: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl Subscribed {
    pub(crate) fn uris(&self) -> Vec<String> {
        self.uris.lock().unwrap().iter().cloned().collect()
    }
}

#[async_trait::async_trait]
impl toolmux_core::ToolProvider for Subscribed {
    fn kind(&self) -> toolmux_core::ToolKind {
        self.fixture.kind()
    }

    fn namespace(&self) -> &str {
        self.fixture.namespace()
    }

    async fn list_tools(&self) -> Result<Vec<toolmux_core::ToolSpec>, toolmux_core::ToolError> {
        self.fixture.list_tools().await
    }

    async fn call(
        &self,
        name: &str,
        arguments: serde_json::Value,
        ctx: &toolmux_core::CallContext,
    ) -> Result<toolmux_core::ToolOutput, toolmux_core::ToolError> {
        self.fixture.call(name, arguments, ctx).await
    }

    async fn subscribe_resource(&self, uri: &str) -> Result<(), toolmux_core::ToolError> {
        self.uris.lock().unwrap().insert(uri.to_owned());
        Ok(())
    }

    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), toolmux_core::ToolError> {
        self.uris.lock().unwrap().remove(uri);
        Ok(())
    }

    fn resource_updates(&self) -> Option<toolmux_core::ResourceUpdates> {
        self.fixture.resource_updates()
    }
}

/// Sends `resources/subscribe` (`subscribe`) or `resources/unsubscribe` of each of `uris`
/// at once, and returns the answers by id.
async fn subscriptions(
    client: &mut RawClient,
    subscribe: bool,
    uris: &[String],
) -> std::collections::HashMap<String, serde_json::Value> {
    let method = if subscribe { "resources/subscribe" } else { "resources/unsubscribe" };
    for uri in uris {
        client
            .send(json!({"jsonrpc": "2.0", "id": uri, "method": method, "params": {"uri": uri}}))
            .await;
    }
    let mut answers = std::collections::HashMap::new();
    while answers.len() < uris.len() {
        let answer = client.next().await;
        if let Some(id) = answer["id"].as_str() {
            answers.insert(id.to_owned(), answer);
        }
    }
    answers
}

/// A session is subscribed to at most 1,000 resources at once: past them a subscription
/// is refused with an error naming the bound and what to do, until the client unsubscribes
/// from one; subscribing again to one it has is no new one. A closed session's
/// subscriptions are unsubscribed from. (There was no bound, and a session's subscriptions
/// outlived it.)
#[tokio::test]
async fn a_session_s_resource_subscriptions_are_bounded_and_end_with_it() {
    let provider = Arc::new(Subscribed { fixture: Fixture::new(0), uris: Default::default() });
    let (stream, _server) = socket_pair(provider.clone(), ServeOptions::default());
    let mut first = RawClient::new(stream);
    first.handshake().await;
    let uris: Vec<String> = (0..1_000).map(|n| format!("test://r/{n}")).collect();
    let answers = subscriptions(&mut first, true, &uris).await;
    assert!(answers.values().all(|a| a["result"] == json!({})), "{answers:?}");
    let extra = vec!["test://r/extra".to_owned()];
    let refused = subscriptions(&mut first, true, &extra).await.remove(&extra[0]).unwrap();
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    expect!["this session is subscribed to 1000 resources, the most a session may be; unsubscribe from one (`resources/unsubscribe`) before subscribing to `test://r/extra`"]
        .assert_eq(message);
    let again = subscriptions(&mut first, true, &uris[..1]).await.remove(&uris[0]).unwrap();
    assert_eq!(again["result"], json!({}), "{again}");
    let answers = subscriptions(&mut first, false, &uris[..1]).await;
    assert_eq!(answers[&uris[0]]["result"], json!({}), "{answers:?}");
    let taken = subscriptions(&mut first, true, &extra).await.remove(&extra[0]).unwrap();
    assert_eq!(taken["result"], json!({}), "{taken}");
    assert_eq!(provider.uris().len(), 1_000);
    drop(first);
    eventually("the closed session's subscriptions to end", || async {
        provider.uris().is_empty()
    })
    .await;
}

/// A task's call still running when the task expires (an hour after it was made) is
/// cancelled then, though no other task is made: nobody could read its result or cancel
/// it any more. (Expired tasks were swept only when a task was made, so a hung call, or
/// one waiting for `tasks/update`, held its upstream until the next task.)
#[tokio::test(start_paused = true)]
async fn an_expired_task_s_call_is_cancelled_without_another_task() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("hang", Behavior::Hang));
    let options = ServeOptions { task_tools: vec!["hang".into()], ..ServeOptions::default() };
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let (reader, writer) = tokio::io::split(server_io);
    let server = tokio::spawn(toolmux_mcp::server::serve_io(mock.clone(), options, reader, writer));
    let mut client = RawClient::new(client_io);
    client.start_task("hang", json!({})).await;
    eventually("the call to start", || async { mock.in_flight() == 1 }).await;
    tokio::time::sleep(std::time::Duration::from_secs(60 * 60)).await;
    eventually("the call to be cancelled", || async { mock.in_flight() == 0 }).await;
    drop(client);
    within(server).await.unwrap().unwrap();
}

/// A line that begins with a UTF-8 byte order mark (some Windows clients write one) is
/// read as the message after it, as rmcp reads it: `initialize` and a call so marked are
/// answered. (Such a line was answered `-32700`, so the client could not even initialize.)
#[tokio::test]
async fn a_line_with_a_byte_order_mark_is_read_as_its_message() {
    let mock = Arc::new(MockProvider::new("mock").with_tool("a", Behavior::Echo));
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let (reader, writer) = tokio::io::split(server_io);
    let server =
        tokio::spawn(toolmux_mcp::server::serve_io(mock, ServeOptions::default(), reader, writer));
    let mut client = RawClient::new(client_io);
    let initialize = json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}
    }});
    client.send_line(&format!("\u{feff}{initialize}")).await;
    let initialized = client.next().await;
    assert_eq!(initialized["result"]["protocolVersion"], "2025-11-25", "{initialized}");
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    client.send_line(&format!("\u{feff}{notification}")).await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "a", "arguments": {"x": 1}}});
    client.send_line(&format!("\u{feff}{call}")).await;
    let answered = client.next().await;
    assert_eq!(answered["id"], 1, "{answered}");
    assert!(answered.get("result").is_some(), "{answered}");
    drop(client);
    within(server).await.unwrap().unwrap();
}
