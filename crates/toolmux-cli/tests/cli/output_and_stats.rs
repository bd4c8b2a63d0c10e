//! Outputs over the size cap are stored and read back; statistics persist across runs.

use crate::Project;
use expect_test::expect;
use std::process::Stdio;
use std::time::Duration;

fn spilled_project() -> Project {
    let project = Project::new();
    let lines: String = (1..=300).map(|i| format!("line {i}\n")).collect();
    project.file("big.txt", &lines).file(
        "toolmux.yaml",
        "defaults:\n  toolResponseMaxBytes: 500\n  outputDir: .toolmux/out\nfs: {}\n",
    );
    project
}

#[test]
fn spilled_output_is_read_back() {
    let project = spilled_project();
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"big.txt"}"#, "--json"]);
    let result: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let handle = result["extras"]["spilled"]["handle"].as_str().expect("handle").to_owned();
    assert!(result["result"].as_str().expect("text").contains("size_limit_exceeded"));

    let page = project.run(&["output", "show", &handle, "--offset", "9", "--limit", "2"]);
    assert_eq!(page.ok().trim_end(), "    10\tline 10\n    11\tline 11");
    expect!["lines 10-11 of 300; more with --offset 11"].assert_eq(page.stderr.trim());

    let human = project.run(&["tools", "call", "fs__read", r#"{"path":"big.txt"}"#]);
    assert!(human.stderr.contains(" output show run-default/"), "{}", human.stderr);

    // The hint names the configuration that says where outputs are kept, so it works as
    // given from anywhere.
    let elsewhere = project.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let config = project.path().join("toolmux.yaml");
    let run = project.run(&[
        "--config",
        config.to_str().unwrap(),
        "tools",
        "call",
        "fs__read",
        r#"{"path":"big.txt"}"#,
    ]);
    let hint = run.stderr.split('`').nth(1).expect("a hint in backquotes").to_owned();
    assert!(hint.contains("--config"), "{hint}");
    let words: Vec<&str> = hint.split_whitespace().skip(1).collect();
    let mut command = project.command(&words);
    command.current_dir(&elsewhere);
    let out = command.output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// With two --config files, the second setting `defaults.outputDir`, the hint repeats both:
/// it named only the first, whose output folder holds no such output.
#[test]
fn the_hint_to_read_a_stored_output_names_every_config_file() {
    let project = Project::new();
    let lines: String = (1..=300).map(|i| format!("line {i}\n")).collect();
    project
        .file("big.txt", &lines)
        .file("base.yaml", "defaults:\n  toolResponseMaxBytes: 500\nfs: {}\n")
        .file("more.yaml", "defaults:\n  outputDir: .toolmux/kept\n");
    let base = project.path().join("base.yaml");
    let more = project.path().join("more.yaml");
    let run = project.run(&[
        "--config",
        base.to_str().expect("a UTF-8 path"),
        "--config",
        more.to_str().expect("a UTF-8 path"),
        "tools",
        "call",
        "fs__read",
        r#"{"path":"big.txt"}"#,
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let hint = run.stderr.split('`').nth(1).expect("a hint in backquotes").to_owned();
    assert_eq!(hint.matches("--config").count(), 2, "{hint}");
    let elsewhere = project.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("a folder");
    let words: Vec<&str> = hint.split_whitespace().skip(1).collect();
    let mut command = project.command(&words);
    command.current_dir(&elsewhere);
    let out = command.output().expect("runs");
    assert!(out.status.success(), "{hint}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("line 300"), "{hint}");
}

/// An unknown handle says where it was looked for and how to read it: a handle of the right
/// shape is most often one stored under another folder's configuration. (The message only
/// said what handles look like, which this one does.) A word that is no handle says what
/// handles look like, and not where outputs are kept, which is no help with it: both
/// messages said both.
#[test]
fn unknown_handle_exits_1() {
    let project = spilled_project();
    let run = project.run(&["output", "show", "run-x/out-y"]);
    assert_eq!(run.code, 1);
    let dir = project.path().join(".toolmux/out");
    let expected = format!(
        "error: no stored output `run-x/out-y`; looked in {}, where this configuration keeps \
         them: read it with the configuration of the call that stored it (in that call's folder, \
         or with its --config); outputs older than defaults.outputRetention are removed",
        dir.display()
    );
    assert_eq!(run.stderr.trim(), expected);
    for word in ["size_limit_exceeded", "../out/x", "run-default/out-1/2"] {
        let run = project.run(&["output", "show", word]);
        assert_eq!(run.code, 1, "{run:?}");
        assert_eq!(
            run.stderr.trim(),
            format!(
                "error: `{word}` is no output handle: a handle is two words of letters, digits, \
                 `-` and `_` joined by `/`, such as run-default/out-2aa5-18ec12bc9340f588-0, as \
                 the `handle` of a tool_output message or the note of `toolmux tools call` gives it"
            )
        );
    }
    // A real handle, read in another folder, is not there; with the call's --config it is.
    let stored = project.run(&["tools", "call", "fs__read", r#"{"path":"big.txt"}"#, "--json"]);
    let result: serde_json::Value = serde_json::from_str(stored.ok()).expect("json");
    let handle = result["extras"]["spilled"]["handle"].as_str().expect("handle").to_owned();
    let elsewhere = Project::new();
    let missed = elsewhere.run(&["output", "show", &handle]);
    assert_eq!(missed.code, 1, "{missed:?}");
    assert!(
        missed.stderr.contains(&format!("looked in {}", elsewhere.path().display())),
        "{missed:?}"
    );
    let config = project.path().join("toolmux.yaml");
    let found =
        elsewhere.run(&["--config", &config.display().to_string(), "output", "show", &handle]);
    assert!(found.ok().starts_with("     1\tline 1\n"), "{found:?}");
}

#[test]
fn statistics_persist_across_runs() {
    let project = Project::new();
    project.file("a.txt", "TODO\n");
    let empty = project.run(&["stats"]);
    assert!(empty.stderr.starts_with("no calls recorded yet"), "{}", empty.stderr);
    project.run(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]).ok();
    project.run(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]).ok();
    let failed = project.run(&["tools", "call", "fs__read", r#"{"path":"missing.txt"}"#]);
    assert_eq!(failed.code, 1);

    let run = project.run(&["stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    assert_eq!(stats["tools"]["fs__grep"]["count"], 2);
    assert_eq!(stats["tools"]["fs__grep"]["ok"], 2);
    assert_eq!(stats["tools"]["fs__read"]["failed"], 1);

    let stats_file = stats["statsFile"].as_str().expect("the statistics file's path");
    assert!(std::path::Path::new(stats_file).is_file(), "{stats}");

    let table = project.run(&["stats"]);
    let header = table.ok().lines().next().unwrap_or_default().to_owned();
    expect!["tool        calls       ok   failed  avg ok ms     p50 ms     p95 ms"]
        .assert_eq(&header);
    // A tool that never succeeded has no average (it showed 0.0, the fastest of all).
    let read = table.stdout.lines().find(|l| l.starts_with("fs__read ")).expect("fs__read's row");
    let columns: Vec<&str> = read.split_whitespace().collect();
    assert_eq!(columns[1..5], ["1", "0", "1", "-"], "{read}");
}

/// Before any call, `stats` says what is counted and where; it said no calls were recorded
/// yet and named the file.
#[test]
fn statistics_before_any_call_say_what_is_counted() {
    let project = Project::new();
    let run = project.run(&["stats"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout, "");
    let json = project.run(&["config", "check", "--json"]);
    let report: serde_json::Value = serde_json::from_str(json.ok()).expect("json");
    let path = report["statsFile"].as_str().expect("a statistics file");
    assert_eq!(
        run.stderr.trim(),
        format!(
            "no calls recorded yet: calls through `tools call`, `serve` and `agent run` with \
             this configuration are counted in {path}"
        )
    );
}

/// Processes that end at the same time add their counts to the statistics file instead of
/// overwriting each other's.
#[test]
fn parallel_calls_are_all_counted() {
    let project = Project::new();
    project
        .file("a.txt", "TODO\n")
        .file("toolmux.yaml", "defaults:\n  statsFile: .toolmux/stats.json\nfs: {}\n");
    let children: Vec<_> = (0..10)
        .map(|_| {
            let mut command =
                project.command(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]);
            command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            command.spawn().expect("spawn toolmux")
        })
        .collect();
    for child in children {
        let run = crate::wait(child, Duration::from_secs(120));
        run.ok();
        assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    }
    let run = project.run(&["stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    assert_eq!(stats["tools"]["fs__grep"]["count"], 10, "{stats}");
    assert_eq!(stats["tools"]["fs__grep"]["ok"], 10);
    let dir = project.path().join(".toolmux");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .expect("statistics folder")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
}

/// A damaged statistics file costs a warning, not the call; it is kept aside as `.bad`.
#[test]
fn a_damaged_statistics_file_only_warns() {
    let project = Project::new();
    project
        .file("a.txt", "TODO\n")
        .file("toolmux.yaml", "defaults:\n  statsFile: .toolmux/stats.json\nfs: {}\n")
        .file(".toolmux/stats.json", "{\"version\": 1, \"too");
    let run = project.run(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]);
    run.ok();
    let stats_file = project.path().join(".toolmux/stats.json");
    assert!(
        run.stderr
            .contains(&format!("warning: statistics file {} is not valid", stats_file.display())),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("EOF while parsing"), "{}", run.stderr);
    let bad = std::fs::read_to_string(project.path().join(".toolmux/stats.json.bad"));
    assert_eq!(bad.expect("moved aside"), "{\"version\": 1, \"too");
    let run = project.run(&["stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    assert_eq!(stats["tools"]["fs__grep"]["count"], 1, "{stats}");
}

/// A statistics file whose folder is a file (an `outputDir` that is one) is said to be so,
/// once: the start said "Not a directory (os error 20)" and the end "File exists (os error
/// 17)", neither naming the file in the way.
#[test]
fn a_file_where_the_statistics_folder_would_be_is_said_once() {
    let project = Project::new();
    project
        .file("a.txt", "TODO\n")
        .file("out", "not a folder")
        .file("toolmux.yaml", "defaults:\n  outputDir: out\nfs: {}\n");
    let run = project.run(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]);
    run.ok();
    let said = format!(
        "statistics file {} cannot be kept: {} is a file, not a folder",
        project.path().join("out/stats.json").display(),
        project.path().join("out").display()
    );
    assert_eq!(run.stderr.matches(&said).count(), 1, "{}", run.stderr);
    assert!(!run.stderr.contains("os error"), "{}", run.stderr);
}

/// `stats` of a statistics file it cannot read is an error saying why and what to do (exit
/// 4, and under `--json` one JSON object), where it warned and then said no calls were
/// recorded yet and would be counted in the very file it could not read, and exited 0.
#[test]
fn statistics_that_cannot_be_read_are_an_error() {
    let project = Project::new();
    project.file("toolmux.yaml", "defaults:\n  statsFile: .toolmux/stats.json\nfs: {}\n");
    let path = project.path().join(".toolmux/stats.json");
    std::fs::create_dir_all(&path).expect("a folder in the file's place");
    let run = project.run(&["stats"]);
    assert_eq!((run.code, run.stdout.as_str()), (4, ""), "{run:?}");
    assert_eq!(
        run.stderr.trim(),
        format!(
            "error: statistics file {} is a folder, not a regular file; no statistics are kept \
             while it is there (remove it, or set defaults.statsFile to a regular file's path or \
             false)",
            path.display()
        )
    );
    assert!(project.run(&["stats", "--json"]).json_error().contains("is a folder"));
    std::fs::remove_dir(&path).expect("the folder removed");
    project.file(".toolmux/stats.json", "{\"version\": 1, \"too");
    let run = project.run(&["stats"]);
    assert_eq!(run.code, 4, "{run:?}");
    assert_eq!(
        run.stderr.trim(),
        format!(
            "error: statistics file {} is not valid: EOF while parsing a string at line 1 column \
             19; the next call moves it aside (adding .bad to its name) and counts anew",
            path.display()
        )
    );
}

/// `statsFile: false` keeps no statistics.
#[test]
fn statistics_can_be_turned_off() {
    let project = Project::new();
    project.file("a.txt", "TODO\n").file("toolmux.yaml", "defaults:\n  statsFile: false\nfs: {}\n");
    project.run(&["tools", "call", "fs__grep", r#"{"pattern":"TODO"}"#]).ok();
    assert!(!project.path().join(".toolmux/stats.json").exists());
    let tmp = project.path().join("tmp");
    let kept: Vec<_> = walk(&tmp).into_iter().filter(|p| p.ends_with("stats.json")).collect();
    assert!(kept.is_empty(), "{kept:?}");
    let run = project.run(&["stats"]);
    run.ok();
    expect!["no statistics are kept (`defaults.statsFile: false`)"].assert_eq(run.stderr.trim());
    // A program gets a document all the same (it got an empty stdout to parse).
    let run = project.run(&["stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(run.ok()).expect("one JSON document");
    assert_eq!(stats, serde_json::json!({"version": 1, "tools": {}, "statsFile": null}));
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// Two toolmux processes with their own output directories but one Redis (`backend.redis`)
/// stand for two replicas: an output one of them stored reads back through the other, and
/// a rate limit holds for both together.
#[test]
fn with_redis_outputs_and_rate_limits_are_shared_by_replicas() {
    let server = toolmux_test_support::redis::RedisServer::start();
    let lines: String = (1..=300).map(|i| format!("line {i}\n")).collect();
    let config = |out: &str| {
        format!(
            "defaults:\n  toolResponseMaxBytes: 500\n  outputDir: {out}\nfs: {{}}\n\
             tools:\n  fs__glob: {{rateLimit: {{calls: 1, perMs: 60000}}}}\n\
             backend:\n  redis: {{url: '{}'}}\n",
            server.url()
        )
    };
    let one = Project::new();
    one.file("big.txt", &lines).file("toolmux.yaml", &config("out-one"));
    let two = Project::new();
    two.file("big.txt", &lines).file("toolmux.yaml", &config("out-two"));

    let run = one.run(&["tools", "call", "fs__read", r#"{"path":"big.txt"}"#, "--json"]);
    let result: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let handle = result["extras"]["spilled"]["handle"].as_str().expect("handle").to_owned();
    let page = two.run(&["output", "show", &handle, "--offset", "9", "--limit", "2"]);
    assert_eq!(page.ok().trim_end(), "    10\tline 10\n    11\tline 11");
    assert!(!two.path().join("out-two").join(handle.split('/').next().unwrap_or("")).exists());

    one.run(&["tools", "call", "fs__glob", r#"{"pattern":"*.txt"}"#]).ok();
    let refused = two.run(&["tools", "call", "fs__glob", r#"{"pattern":"*.txt"}"#, "--json"]);
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stdout.contains("rate_limited"), "{}", refused.stdout);
}

/// `telemetry.otlp`: the binary's calls reach an OpenTelemetry collector as spans and
/// metrics, sent before the process exits; the header's secret stays out of the output.
#[test]
fn calls_are_exported_to_an_opentelemetry_collector() {
    let collector = toolmux_test_support::otlp::OtlpCollector::start();
    let project = Project::new().env("OTEL_TOKEN", "otel-secret-0123456789");
    project.file("notes.md", "TODO: export\n").file(
        "toolmux.yaml",
        &format!(
            "fs: {{}}\ntelemetry:\n  otlp:\n    endpoint: {}\n    headers: {{Authorization: 'Bearer ${{OTEL_TOKEN}}'}}\n    serviceName: toolmux-test\n",
            collector.endpoint()
        ),
    );
    let run = project.run(&["tools", "call", "fs__grep", r#"{"pattern": "TODO"}"#]);
    assert_eq!(run.code, 0, "{run:?}");
    let failed = project.run(&["tools", "call", "fs__read", r#"{"path": "missing.md"}"#]);
    assert_ne!(failed.code, 0, "{failed:?}");
    let spans = collector.spans();
    let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["execute_tool fs__grep", "execute_tool fs__read"], "{spans:#?}");
    assert_eq!(spans[1]["status"]["code"], 2, "{}", spans[1]);
    let metrics = collector.last_metrics();
    assert!(metrics.contains_key("mcp.tool.calls"), "{metrics:?}");
    assert!(metrics.contains_key("mcp.tool.duration"), "{metrics:?}");
    for request in collector.requests() {
        assert_eq!(request.headers["authorization"], "Bearer otel-secret-0123456789");
    }
    for output in [&run.stdout, &run.stderr, &failed.stdout, &failed.stderr] {
        assert!(!output.contains("otel-secret"), "{output}");
    }

    // A collector that cannot be reached: the call is not slowed and says nothing of it
    // but a warning.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    project.file(
        "toolmux.yaml",
        &format!("fs: {{}}\ntelemetry:\n  otlp: {{endpoint: '{endpoint}', timeoutMs: 1000}}\n"),
    );
    let run = project.run(&["tools", "call", "fs__grep", r#"{"pattern": "TODO"}"#]);
    assert_eq!(run.code, 0, "{run:?}");
    // Nor one that takes connections and never answers: the exit waits 2 s at most for
    // the last batch, not the request's timeout.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", mute.local_addr().expect("address"));
    let held = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in mute.incoming().take(4) {
            held.push(stream);
        }
        held
    });
    project.file(
        "toolmux.yaml",
        &format!("fs: {{}}\ntelemetry:\n  otlp: {{endpoint: '{endpoint}', timeoutMs: 10000}}\n"),
    );
    let started = std::time::Instant::now();
    let run = project.run(&["tools", "call", "fs__grep", r#"{"pattern": "TODO"}"#]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(started.elapsed() < Duration::from_secs(7), "{:?}", started.elapsed());
    drop(held);
    project.file("toolmux.yaml", "fs: {}\ntelemetry:\n  otlp: {endpoint: 'localhost:4318'}\n");
    let bad = project.run(&["config", "check"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("telemetry.otlp: endpoint `localhost:4318`"), "{}", bad.stderr);
}

/// An MCP client's `_meta.traceparent`: the spans of its calls join its trace, on the
/// gateway's direct path for plain calls and on rmcp's for the rest; a malformed one is
/// ignored.
#[test]
fn served_calls_join_the_clients_trace() {
    let collector = toolmux_test_support::otlp::OtlpCollector::start();
    let project = Project::new();
    project.file("notes.md", "TODO: trace\n").file(
        "toolmux.yaml",
        &format!("fs: {{}}\ntelemetry:\n  otlp:\n    endpoint: {}\n", collector.endpoint()),
    );
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let call = |meta: serde_json::Value| {
        serde_json::json!({"method": "tools/call", "params": {
            "name": "fs__grep", "arguments": {"pattern": "TODO"}, "_meta": meta}})
    };
    let answers = crate::serve::stdio_exchange(
        &project,
        &["serve", "--stdio"],
        &[
            call(serde_json::json!({"traceparent": caller, "tracestate": "vendor=1"})),
            call(serde_json::json!({"traceparent": caller, "example.com/other": 1})),
            call(serde_json::json!({"traceparent": "00-nonsense"})),
        ],
    );
    let errors: Vec<_> = answers.iter().filter(|a| a["result"]["isError"] == true).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let spans = collector.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    // Calls run at once: each span is told by its call id, the request's id.
    let span_of =
        |id: &str| {
            spans
                .iter()
                .find(|span| {
                    span["attributes"].as_array().into_iter().flatten().any(|a| {
                        a["key"] == "gen_ai.tool.call.id" && a["value"]["stringValue"] == id
                    })
                })
                .unwrap_or_else(|| panic!("no span of call {id}: {spans:#?}"))
        };
    for id in ["2", "3"] {
        let span = span_of(id);
        assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736", "{span}");
        assert_eq!(span["parentSpanId"], "00f067aa0ba902b7", "{span}");
    }
    let own = span_of("4");
    assert_ne!(own["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert!(own.get("parentSpanId").is_none(), "{own}");
}

/// The trace goes on upstream (SEP-414): a client → toolmux → toolmux chain, both
/// exporting to one collector, gives one trace: the outer gateway's span is the child of
/// the client's span, the inner one's the child of the outer's, and `tracestate` is
/// passed on as it came.
#[test]
fn the_trace_goes_on_to_upstream_servers() {
    let collector = toolmux_test_support::otlp::OtlpCollector::start();
    let project = Project::new();
    project
        .file("notes.md", "TODO: chain\n")
        .file(
            "inner.yaml",
            &format!(
                "fs: {{}}\ntelemetry:\n  otlp: {{endpoint: '{}', serviceName: inner, intervalMs: 200}}\n",
                collector.endpoint()
            ),
        )
        .file(
            "toolmux.yaml",
            &format!(
                "mcpServers:\n  inner:\n    command: {}\n    args: [--config, inner.yaml, serve, --stdio]\ntelemetry:\n  otlp: {{endpoint: '{}', serviceName: outer}}\n",
                crate::toolmux_bin(),
                collector.endpoint()
            ),
        );
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let call = serde_json::json!({"method": "tools/call", "params": {
        "name": "inner__fs__grep", "arguments": {"pattern": "TODO"},
        "_meta": {"traceparent": caller, "tracestate": "vendor=abc"}}});
    let answers = crate::serve::stdio_exchange(&project, &["serve", "--stdio"], &[call]);
    let result = answers.iter().find(|a| a["id"] == 2).expect("an answer");
    assert_ne!(result["result"]["isError"], true, "{result}");
    let spans = collector.spans();
    let named = |tool: &str| {
        spans
            .iter()
            .find(|s| s["name"] == format!("execute_tool {tool}"))
            .unwrap_or_else(|| panic!("no span of {tool}: {spans:#?}"))
            .clone()
    };
    let outer = named("inner__fs__grep");
    let inner = named("fs__grep");
    for span in [&outer, &inner] {
        assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736", "{span}");
    }
    assert_eq!(outer["parentSpanId"], "00f067aa0ba902b7", "{outer}");
    assert_eq!(inner["parentSpanId"], outer["spanId"], "{inner}");
}

/// A page past the end, or of no lines, is refused saying what is there.
#[test]
fn pages_past_the_end_are_refused() {
    let project = spilled_project();
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"big.txt"}"#, "--json"]);
    let result: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let handle = result["extras"]["spilled"]["handle"].as_str().expect("handle").to_owned();
    let past = project.run(&["output", "show", &handle, "--offset", "5000"]);
    assert_eq!(past.code, 2, "{}", past.stdout);
    assert!(
        past.stderr.contains("--offset 5000 is past the end: the output has 300 lines"),
        "{}",
        past.stderr
    );
    // Said as a person reads it (clap's range said `not in 1..18446744073709551615`).
    let none = project.run(&["output", "show", &handle, "--limit", "0"]);
    assert_eq!(none.code, 2);
    assert!(
        none.stderr.contains("invalid value '0' for '--limit <LIMIT>': must be at least 1"),
        "{}",
        none.stderr
    );
    let json = project.run(&["output", "show", &handle, "--limit", "1", "--json"]);
    let page: serde_json::Value = serde_json::from_str(json.ok()).expect("json");
    assert_eq!(page["totalLines"], 300, "{page}");
}

/// With `--json`, every refusal of `output show` is one JSON object on stdout (`ok: false`,
/// `error`, `exitCode`), a bad `--offset` too, said as a person reads it: stdout was empty,
/// `-1` was taken for an option and `x` said only `invalid digit found in string`.
#[test]
fn output_show_errors_under_json_are_one_json_object() {
    let project = spilled_project();
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"big.txt"}"#, "--json"]);
    let result: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let handle = result["extras"]["spilled"]["handle"].as_str().expect("handle").to_owned();
    let offset = "must be a whole number of lines from 0, the first line (such as 100)";
    let cases: [(&[&str], i32, String); 7] = [
        (&[&handle, "--offset", "5000"], 2, "--offset 5000 is past the end".to_owned()),
        (
            &[&handle, "--offset", "-1"],
            2,
            format!("invalid value '-1' for '--offset <OFFSET>': {offset}"),
        ),
        (
            &[&handle, "--offset", "x"],
            2,
            format!("invalid value 'x' for '--offset <OFFSET>': {offset}"),
        ),
        (&[&handle, "--limit", "-3"], 2, "invalid value '-3' for '--limit <LIMIT>'".to_owned()),
        (&[], 2, "the following required arguments were not provided".to_owned()),
        (&["run-x/out-y"], 1, "no stored output `run-x/out-y`; looked in".to_owned()),
        (&["../x"], 1, "`../x` is no output handle".to_owned()),
    ];
    for (args, code, start) in cases {
        let run = project.run(&[&["output", "show", "--json"], args].concat());
        assert_eq!(run.code, code, "{args:?}: {run:?}");
        let message = run.json_error();
        assert!(message.starts_with(&start), "{args:?}: {message}");
    }
}

/// On a fresh machine (no output folder yet) and for an output removed since it was stored,
/// `output show` says there is no such output and where it looked, exit 1; reading it makes
/// no folder.
#[test]
fn outputs_not_there_are_told_plainly() {
    let project = spilled_project();
    let dir = project.path().join(".toolmux/out");
    let run = project.run(&["output", "show", "run-default/out-1"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.starts_with("error: no stored output `run-default/out-1`; looked in"));
    assert!(!dir.exists(), "reading made the output folder");
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"big.txt"}"#, "--json"]);
    let result: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let handle = result["extras"]["spilled"]["handle"].as_str().expect("handle").to_owned();
    std::fs::remove_file(dir.join(&handle)).expect("the stored output removed");
    let run = project.run(&["output", "show", &handle]);
    assert_eq!(run.code, 1, "{run:?}");
    let expected = format!("error: no stored output `{handle}`; looked in {}", dir.display());
    assert!(run.stderr.starts_with(&expected), "{run:?}");
}

/// A link planted in a project's output folder, in place of an output (`out-1 ->
/// /etc/passwd`) or of a run's folder (`run-x -> /etc`), as a cloned repository could hold
/// one: `output show` prints nothing of the file it leads to and says what is there, where
/// it printed the file.
#[test]
fn output_show_follows_no_link_planted_in_the_output_folder() {
    let project = spilled_project();
    project.file("elsewhere/out-1", "root:x:0:0:secret\n");
    let dir = project.path().join(".toolmux/out");
    std::fs::create_dir_all(dir.join("run-default")).expect("a run folder");
    let secret = project.path().join("elsewhere/out-1");
    std::os::unix::fs::symlink(&secret, dir.join("run-default/out-1")).expect("a link");
    std::os::unix::fs::symlink(project.path().join("elsewhere"), dir.join("run-x"))
        .expect("a link");
    for (handle, keeps) in [("run-default/out-1", "a regular file"), ("run-x/out-1", "a folder")] {
        let run = project.run(&["output", "show", handle]);
        assert_ne!(run.code, 0, "{run:?}");
        assert!(!run.stdout.contains("secret") && !run.stderr.contains("secret"), "{run:?}");
        let said = format!("it is a symbolic link, where the store keeps {keeps}");
        assert!(run.stderr.contains(&said), "{handle}: {run:?}");
    }
}

/// What was printed but could not be written (stdout a full disk, here `/dev/full`) is an
/// error saying so, exit 4, where the command ended with 0 and the output was lost.
#[test]
fn output_that_cannot_be_written_is_an_error() {
    let project = Project::new();
    project.file("a.txt", "TODO\n");
    for args in [&["tools", "list"][..], &["tools", "call", "fs__read", r#"{"path":"a.txt"}"#]] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let mut command = project.command(args);
        command.stdin(Stdio::null()).stdout(full).stderr(Stdio::piped());
        let run = crate::wait(command.spawn().expect("toolmux starts"), Duration::from_secs(60));
        assert_eq!(run.code, 4, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(
                "error: cannot write the output to stdout: No space left on device (os error 28); \
                 what it got is incomplete"
            ),
            "{args:?}: {run:?}"
        );
    }
}

/// Help and the version that cannot be written (stdout `/dev/full`) are an error saying
/// so, exit 4, as any command's output is, where they ended with 0; to a reader that went
/// away they are no failure.
#[test]
fn help_that_cannot_be_written_is_an_error() {
    let project = Project::new();
    for args in [&["--help"][..], &["--version"], &["tools", "call", "--help"], &["-h"]] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let mut command = project.command(args);
        command.stdin(Stdio::null()).stdout(full).stderr(Stdio::piped());
        let run = crate::wait(command.spawn().expect("toolmux starts"), Duration::from_secs(60));
        assert_eq!(run.code, 4, "{args:?}: {run:?}");
        assert_eq!(
            run.stderr.trim(),
            "error: cannot write the output to stdout: No space left on device (os error 28); \
             what it got is incomplete",
            "{args:?}"
        );
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let mut command = project.command(args);
        command.stdin(Stdio::null()).stdout(writer).stderr(Stdio::piped());
        let run = crate::wait(command.spawn().expect("toolmux starts"), Duration::from_secs(60));
        assert_eq!((run.code, run.stderr.as_str()), (0, ""), "{args:?}: {run:?}");
    }
    let run = project.run(&["--version"]);
    assert!(run.ok().starts_with("toolmux "), "{run:?}");
}

/// A reader that went away (`toolmux tools list | head -1`) is no failure: exit 0 and no
/// word about it, and no panic of the standard library's `println!`.
#[test]
fn a_reader_that_went_away_is_no_failure() {
    let project = Project::new();
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut command = project.command(&["tools", "list", "--json"]);
    command.stdin(Stdio::null()).stdout(writer).stderr(Stdio::piped());
    let run = crate::wait(command.spawn().expect("toolmux starts"), Duration::from_secs(60));
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stderr, "", "{run:?}");
}

/// A page past the end of a one-line output says `1 line`, where it said `1 lines`.
#[test]
fn a_page_past_a_one_line_output_counts_it_in_words() {
    let project = spilled_project();
    project.file("long.txt", &format!("{}\n", "x".repeat(1500)));
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"long.txt"}"#, "--json"]);
    let result: serde_json::Value = serde_json::from_str(run.ok()).expect("json");
    let handle = result["extras"]["spilled"]["handle"].as_str().expect("handle").to_owned();
    let past = project.run(&["output", "show", &handle, "--offset", "5"]);
    assert_eq!(past.code, 2, "{past:?}");
    expect!["error: --offset 5 is past the end: the output has 1 line (offsets 0-0)"]
        .assert_eq(past.stderr.trim());
}

/// A statistics file that cannot be saved is named once in the warning, with why, where
/// the warning said `statistics file X: statistics file X is a folder ...`.
#[test]
fn statistics_that_cannot_be_saved_are_named_once() {
    let project = Project::new();
    project.file("a.txt", "TODO\n").file("toolmux.yaml", "defaults:\n  statsFile: stats\nfs: {}\n");
    let path = project.path().join("stats");
    std::fs::create_dir(&path).expect("a folder in the file's place");
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"a.txt"}"#]);
    run.ok();
    let named = format!("statistics file {}", path.display());
    for line in run.stderr.lines().filter(|l| l.contains(&named)) {
        assert_eq!(line.matches(&named).count(), 1, "{}", run.stderr);
    }
    assert!(run.stderr.contains("is a folder, not a regular file"), "{}", run.stderr);
}
