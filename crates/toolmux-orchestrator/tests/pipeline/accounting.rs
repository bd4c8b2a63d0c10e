//! Accounting: events, statistics, audit log, progress forwarding.

use crate::{call, start};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolmux_core::{CallContext, ProgressSink, ToolCall};
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, ToolEvent, accounting::CallStatus};
use toolmux_test_support::mock::{Behavior, MockProvider};

fn provider() -> Arc<MockProvider> {
    Arc::new(
        MockProvider::new("m")
            .with_tool("ok", Behavior::Sleep(Duration::from_millis(20)))
            .with_tool("fail", Behavior::Fail("boom".into()))
            .with_tool(
                "steps",
                Behavior::Progress { steps: 3, interval: Duration::from_millis(10) },
            ),
    )
}

#[tokio::test(start_paused = true)]
async fn events_come_in_order_with_records() {
    let o = start(OrchestratorConfig::default(), vec![provider()]).await;
    let mut events = o.subscribe();
    let ctx = CallContext::new().with_run_id("run-1");
    o.execute(ToolCall::new("m__steps", json!({"a": "bc"})).with_id("call-7"), &ctx).await;
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    assert_eq!(seen.len(), 5, "{seen:#?}");
    let ToolEvent::ToolStarted { tool, call_id, run_id, .. } = &seen[0] else { panic!("{seen:?}") };
    assert_eq!(
        (tool.as_str(), call_id.as_deref(), run_id.as_str()),
        ("m__steps", Some("call-7"), "run-1")
    );
    assert!(seen[1..4].iter().all(|e| matches!(e, ToolEvent::ToolProgress { .. })));
    let ToolEvent::ToolFinished { record, .. } = &seen[4] else { panic!("{seen:?}") };
    assert_eq!(record.status, CallStatus::Ok);
    assert_eq!((record.chars_in, record.chars_out, record.latency_ms), (10, 4, 30));
    assert_eq!(record.attempts, 1);
    assert_eq!(record.namespace, "m");
}

/// A tool that works silently (`shown: false`, the seeds' external `visible: false`) is
/// seen to run, but its events carry neither its arguments nor its result; a tool shown
/// to people has both in its events.
#[tokio::test(start_paused = true)]
async fn events_of_a_silent_tool_carry_no_arguments_or_result() {
    use toolmux_core::{ToolAnnotations, ToolSpec};
    let silent = ToolAnnotations { shown: false, ..ToolAnnotations::default() };
    let p = MockProvider::new("m")
        .with_spec(
            ToolSpec::new("quiet", "q", ToolSpec::any_object_schema()).with_annotations(silent),
            Behavior::Echo,
        )
        .with_tool("loud", Behavior::Echo);
    let o = start(OrchestratorConfig::default(), vec![Arc::new(p)]).await;
    let mut events = o.subscribe();
    for tool in ["m__quiet", "m__loud"] {
        assert!(
            o.execute(ToolCall::new(tool, json!({"secret": "plan"})), &CallContext::new()).await.ok
        );
    }
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        match event {
            ToolEvent::ToolStarted { tool, arguments, .. } => {
                seen.push((tool, arguments.is_some()));
            }
            ToolEvent::ToolFinished { record, result } => {
                seen.push((record.tool, result.is_some()));
            }
            _ => {}
        }
    }
    let expected = [("m__quiet", false), ("m__quiet", false), ("m__loud", true), ("m__loud", true)];
    assert_eq!(seen, expected.map(|(t, shown)| (t.to_owned(), shown)));
}

#[tokio::test(start_paused = true)]
async fn progress_reaches_the_callers_sink() {
    let o = start(OrchestratorConfig::default(), vec![provider()]).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let seen = seen.clone();
        ProgressSink::new(move |p| seen.lock().unwrap().push(p.progress))
    };
    let ctx = CallContext::new().with_progress(sink);
    assert!(o.execute(ToolCall::new("m__steps", json!({})), &ctx).await.ok);
    assert_eq!(*seen.lock().unwrap(), vec![1.0, 2.0, 3.0]);
}

#[tokio::test(start_paused = true)]
async fn statistics_count_and_time_every_call() {
    let o = start(OrchestratorConfig::default(), vec![provider()]).await;
    for _ in 0..4 {
        call(&o, "m__ok", json!({})).await;
    }
    call(&o, "m__fail", json!({})).await;
    call(&o, "m__missing", json!({})).await;
    let snap = o.stats().snapshot();
    let ok = &snap.tools["m__ok"];
    assert_eq!((ok.count, ok.ok, ok.failed), (4, 4, 0));
    assert!((ok.p50_ms - 20.0).abs() < 4.0 && (ok.p95_ms - 20.0).abs() < 4.0, "{ok:?}");
    assert_eq!(snap.tools["m__fail"].failed, 1);
    assert_eq!(snap.tools["m__missing"].failed, 1);
}

#[tokio::test(start_paused = true)]
async fn invented_names_cannot_grow_the_statistics_without_end() {
    use toolmux_orchestrator::accounting::{OTHER_UNKNOWN, UNKNOWN_NAMES_MAX};
    let o = start(OrchestratorConfig::default(), vec![provider()]).await;
    for n in 0..150 {
        call(&o, &format!("m__invented{n}"), json!({})).await;
    }
    call(&o, "m__ok", json!({})).await;
    let snap = o.stats().snapshot();
    // Three tools and a hundred more entries; the rest of the invented names count as one.
    let own = 3 + UNKNOWN_NAMES_MAX;
    assert_eq!(snap.tools.len(), own + 2, "{:?}", snap.tools.keys().collect::<Vec<_>>());
    assert_eq!(snap.tools[OTHER_UNKNOWN].failed, 150 - own as u64);
    assert_eq!(snap.tools["m__invented0"].failed, 1);
    assert_eq!(snap.tools["m__ok"].ok, 1, "a tool still gets its entry");
}

/// An unknown name longer than any tool's is counted, not kept: a client sending a
/// megabyte of name had it kept in the statistics and their file.
#[tokio::test(start_paused = true)]
async fn overlong_invented_names_are_not_kept() {
    use toolmux_orchestrator::accounting::OTHER_UNKNOWN;
    let o = start(OrchestratorConfig::default(), vec![provider()]).await;
    let huge = format!("m__{}", "x".repeat(1 << 20));
    assert!(!call(&o, &huge, json!({})).await.ok);
    let snap = o.stats().snapshot();
    assert!(!snap.tools.contains_key(&huge));
    assert_eq!(snap.tools[OTHER_UNKNOWN].failed, 1);
}

#[tokio::test(start_paused = true)]
async fn audit_log_has_a_line_per_call_with_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let config = OrchestratorConfig::default().with_audit_log(path.clone());
    let o = Orchestrator::builder(config).provider(provider()).build().unwrap();
    o.warmup().await;
    call(&o, "m__ok", json!({"b": 1, "a": 2})).await;
    call(&o, "m__fail", json!({})).await;
    o.cleanup().await;
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["tool"], "m__ok");
    assert_eq!(lines[0]["outcome"], "ok");
    assert_eq!(lines[1]["outcome"], "failed:remote");
    // SHA-256 of the canonical arguments `\0{"a":2,"b":1}` and of the output `slept`.
    assert_eq!(lines[0]["arguments_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(lines[0]["result_sha256"], toolmux_orchestrator::accounting::sha256_hex(b"slept"));
}

/// A tool shown to people (`visible`, the default) has its arguments and result in its
/// events, for a user interface to render, with the configuration's secrets redacted; a
/// hidden tool's events carry neither.
#[tokio::test(start_paused = true)]
async fn visible_tools_events_carry_arguments_and_results_redacted() {
    let hidden = toolmux_core::ToolSpec::new("hidden", "not shown", json!({"type": "object"}))
        .with_annotations(toolmux_core::ToolAnnotations {
            visible: false,
            ..toolmux_core::ToolAnnotations::default()
        });
    let p = Arc::new(
        MockProvider::new("m").with_tool("echo", Behavior::Echo).with_spec(hidden, Behavior::Echo),
    );
    let o = crate::start_with_secret(p).await;
    let mut events = o.subscribe();
    let args = json!({"question": "ok?", "token": "s3cr3t-value"});
    assert!(call(&o, "m__echo", args.clone()).await.ok);
    assert!(call(&o, "m__hidden", args).await.ok);
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    assert_eq!(seen.len(), 4, "{seen:#?}");
    let ToolEvent::ToolStarted { arguments, .. } = &seen[0] else { panic!("{seen:?}") };
    assert_eq!(arguments.as_ref(), Some(&json!({"question": "ok?", "token": "[redacted]"})));
    let ToolEvent::ToolFinished { result, .. } = &seen[1] else { panic!("{seen:?}") };
    let result = result.as_deref().expect("a visible tool's result");
    assert!(result.contains("[redacted]") && !result.contains("s3cr3t"), "{result}");
    let ToolEvent::ToolStarted { arguments, .. } = &seen[2] else { panic!("{seen:?}") };
    assert_eq!(arguments, &None);
    let ToolEvent::ToolFinished { result, .. } = &seen[3] else { panic!("{seen:?}") };
    assert_eq!(result, &None);
}

/// An agent's streamed arguments and text reach observers with a secret redacted even when
/// the model wrote it across pieces; nothing is sent with nobody following.
#[tokio::test(start_paused = true)]
async fn streamed_pieces_are_redacted_across_their_boundaries() {
    let o = crate::start_with_secret(Arc::new(
        MockProvider::new("m").with_tool("echo", Behavior::Echo),
    ))
    .await;
    let ctx = CallContext::new().with_run_id("streamed");
    let mut pending = String::new();
    // Nobody follows: nothing is held or sent.
    o.stream_arguments(&ctx, "c1", "m__echo", &mut pending, Some(r#"{"token": "s3cr"#));
    assert!(pending.is_empty());

    let mut events = o.subscribe();
    for piece in [Some(r#"{"token": "s3cr"#), Some("3t-val"), Some(r#"ue"}"#), None] {
        o.stream_arguments(&ctx, "c1", "m__echo", &mut pending, piece);
    }
    let mut text = String::new();
    for piece in [Some("the key is s3"), Some("cr3t-value, see"), None] {
        o.agent_text(&ctx, "writer", &mut text, piece);
    }
    let mut arguments = String::new();
    let mut written = String::new();
    while let Ok(event) = events.try_recv() {
        match event {
            ToolEvent::ToolStreaming { arguments_delta, call_id, .. } => {
                assert_eq!(call_id, "c1");
                assert!(!arguments_delta.contains("s3"), "{arguments_delta}");
                arguments.push_str(&arguments_delta);
            }
            ToolEvent::AgentText { text, .. } => {
                assert!(!text.contains("s3"), "{text}");
                written.push_str(&text);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(arguments, r#"{"token": "[redacted]"}"#);
    assert_eq!(written, "the key is [redacted], see");
}

/// A call whose future the caller drops halfway (a timeout of its own around the call, a
/// session that closed) is accounted for as cancelled: its `tool_started` has its
/// `tool_finished`, the statistics count it, and its run is charged the tool time it used.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_halfway_is_accounted_for() {
    use toolmux_orchestrator::RunBudgetConfig;
    let p =
        Arc::new(MockProvider::new("m").with_tool("nap", Behavior::Sleep(Duration::from_secs(3))));
    let config = OrchestratorConfig::default().with_run_budget(RunBudgetConfig {
        max_calls: None,
        max_tool_time: Some(Duration::from_secs(60)),
    });
    let o = start(config, vec![p]).await;
    let mut events = o.subscribe();
    let ctx = CallContext::new().with_run_id("r");
    let dropped = tokio::time::timeout(
        Duration::from_secs(2),
        o.execute(ToolCall::new("m__nap", json!({})).with_id("c1"), &ctx),
    )
    .await;
    assert!(dropped.is_err(), "the caller gave up first");
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    assert_eq!(seen.len(), 2, "{seen:#?}");
    let ToolEvent::ToolFinished { record, .. } = &seen[1] else { panic!("{seen:?}") };
    assert_eq!(record.status, CallStatus::Failed);
    assert_eq!(record.error_code.as_deref(), Some("cancelled"));
    assert_eq!((record.call_id.as_deref(), record.latency_ms), (Some("c1"), 2000));
    let nap = &o.stats().snapshot().tools["m__nap"];
    assert_eq!((nap.count, nap.failed), (1, 1));
    assert_eq!(o.run_flags("r").tool_time_ms, 2000);
    assert_eq!(o.calls_in_flight(), 0);
}

/// A progress message and a log line are the server's text, passed on to the caller's
/// sinks (an MCP client) and to listeners (`/api/events`): secrets are redacted from
/// them as from results. (They went out as the server wrote them.)
#[tokio::test(start_paused = true)]
async fn secrets_are_redacted_from_progress_and_log_lines() {
    use toolmux_core::{LogLevel, LogMessage, LogSink, Progress, ToolKind, ToolSet, ToolSpec};
    let spec = ToolSpec::new("tell", "Reports progress and logs", json!({"type": "object"}));
    let tool =
        ToolSet::new("m", ToolKind::Builtin).with_tool(spec, |_, ctx: CallContext| async move {
            let mut progress = Progress::new(1.0, Some(2.0));
            progress.message = Some("token s3cr3t-value".into());
            ctx.report_progress(progress);
            ctx.log_text(LogLevel::Info, "token s3cr3t-value");
            Ok(toolmux_core::ToolOutput::text("done"))
        });
    let o = crate::start_with_secret(Arc::new(tool)).await;
    let mut events = o.subscribe();
    let (messages, lines) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let progress = {
        let messages = messages.clone();
        ProgressSink::new(move |p| messages.lock().unwrap().push(p.message))
    };
    let log = {
        let lines = lines.clone();
        LogSink::new(move |m: LogMessage| lines.lock().unwrap().push(m.data))
    };
    let ctx = CallContext::new().with_progress(progress).with_log(log);
    assert!(o.execute(ToolCall::new("m__tell", json!({})), &ctx).await.ok);
    assert_eq!(*messages.lock().unwrap(), [Some("token [redacted]".to_owned())]);
    assert_eq!(*lines.lock().unwrap(), [json!("token [redacted]")]);
    let mut told = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let ToolEvent::ToolProgress { progress, .. } = event {
            told.push(progress.message);
        }
    }
    assert_eq!(told, [Some("token [redacted]".to_owned())]);
}
