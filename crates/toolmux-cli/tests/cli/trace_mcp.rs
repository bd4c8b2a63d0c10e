//! `defaults.traceMCP`: each call's request (with its arguments, secrets redacted) and
//! response (latency and size, or the error at warn level) on stderr, through `tools call`.

use crate::{Project, Run, line_server, peer};
use expect_test::expect;

/// The value of `${TOOLMUX_TEST_SECRET}` in the configuration.
const SECRET: &str = "hunter2-very-secret";

/// A project with the builtin file tools and server-everything (npm), `traceMCP` as given,
/// a secret in the server's environment and a long-running tool given 300 ms.
fn project(trace_mcp: bool) -> Project {
    let node = peer("node/node_modules/.bin/node");
    let everything =
        peer("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let project = Project::new().env("TOOLMUX_TEST_SECRET", SECRET);
    project.file("notes.md", "TODO: trace\n").file(
        "toolmux.yaml",
        &format!(
            "defaults:\n  traceMCP: {trace_mcp}\nfs: {{}}\nmcpServers:\n  everything:\n    \
             command: {}\n    args: [{}, stdio]\n    env: {{TOKEN: '${{TOOLMUX_TEST_SECRET}}'}}\n\
             tools:\n  everything__trigger-long-running-operation: {{timeout: 300}}\n",
            node.display(),
            everything.display()
        ),
    );
    project
}

/// The trace lines of a run's stderr from their level on (the timestamp left out), every
/// duration (`838ms`) as `Nms`. Taken as they are: a log in a file or a pipe has no colours
/// between its words, which would break the lines' expected text.
fn trace_lines(run: &Run) -> String {
    let is_trace = |line: &&str| {
        line.contains("tool request →")
            || line.contains("    parameters: ")
            || line.contains("tool response ←")
    };
    run.stderr
        .lines()
        .filter(is_trace)
        .map(|line| {
            // A record's second line (`    parameters: …`) is as it was written.
            if line.starts_with(' ') {
                return durations_masked(line);
            }
            let from_level = line.split_once(' ').map_or(line, |(_, rest)| rest);
            durations_masked(from_level.trim_start())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` with every number of milliseconds (`838ms`) as `Nms`.
fn durations_masked(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut digits = String::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if !digits.is_empty() {
            let is_duration = c == 'm' && rest.starts_with('s');
            out.push_str(if is_duration { "N" } else { &digits });
            digits.clear();
        }
        out.push(c);
    }
    out.push_str(&digits);
    out
}

#[test]
fn a_builtin_call_is_traced_with_its_arguments_latency_and_size() {
    let run = project(true).run(&["tools", "call", "fs__read", r#"{"path":"notes.md"}"#]);
    expect!["1\tTODO: trace"].assert_eq(run.ok().trim());
    expect![[r#"
        DEBUG tool request → fs__read
            parameters: {"path":"notes.md"}
        DEBUG tool response ← fs__read latency: Nms, output: 19 chars, status: ok"#]]
    .assert_eq(&trace_lines(&run));
}

#[test]
fn an_mcp_call_is_traced_with_the_secrets_of_its_arguments_redacted() {
    let arguments = format!(r#"{{"message":"token {SECRET}"}}"#);
    let run = project(true).run(&["tools", "call", "everything__echo", &arguments]);
    expect!["Echo: token [redacted]"].assert_eq(run.ok().trim());
    // The size is the output's as the caller gets it: its secrets were redacted first.
    expect![[r#"
        DEBUG tool request → everything__echo
            parameters: {"message":"token [redacted]"}
        DEBUG tool response ← everything__echo latency: Nms, output: 22 chars, status: ok"#]]
    .assert_eq(&trace_lines(&run));
    assert!(!run.stderr.contains(SECRET), "{}", run.stderr);
    // traceMCP shows the MCP client's connections too.
    assert!(run.stderr.contains("mcp server connected"), "{}", run.stderr);
}

#[test]
fn a_timeout_is_traced_as_a_warning_with_its_error() {
    let run = project(true).run(&[
        "tools",
        "call",
        "everything__trigger-long-running-operation",
        r#"{"duration":5,"steps":5}"#,
    ]);
    assert_eq!(run.code, 1, "{run:?}");
    // The error goes on to say how long the call went without progress when it did.
    let lines = trace_lines(&run);
    let (lines, _) = lines.split_once(" (it went").unwrap_or((&lines, ""));
    expect![[r#"
        DEBUG tool request → everything__trigger-long-running-operation
            parameters: {"duration":5,"steps":5}
        WARN tool response ← everything__trigger-long-running-operation latency: Nms, status: failed, error: timeout: `everything__trigger-long-running-operation` did not finish within Nms"#]]
    .assert_eq(lines);
}

#[test]
fn a_failing_tool_is_traced_as_a_warning_with_its_error() {
    let run = project(true).run(&["tools", "call", "fs__read", r#"{"path":"missing.md"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    expect![[r#"
        DEBUG tool request → fs__read
            parameters: {"path":"missing.md"}
        WARN tool response ← fs__read latency: Nms, status: failed, error: invalid arguments for `fs__read`: at /: no file or directory at `missing.md`: check the path with `fs__ls` or `fs__glob`"#]]
    .assert_eq(&trace_lines(&run));
}

#[test]
fn nothing_is_traced_without_trace_mcp() {
    let project = project(false);
    let arguments = format!(r#"{{"message":"token {SECRET}"}}"#);
    let run = project.run(&["tools", "call", "everything__echo", &arguments]);
    run.ok();
    expect![""].assert_eq(&run.stderr);
    let run = project.run(&["tools", "call", "fs__read", r#"{"path":"missing.md"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    expect![[r#"
        error: invalid arguments for `fs__read`: at /: no file or directory at `missing.md`: check the path with `fs__ls` or `fs__glob`
    "#]]
    .assert_eq(&run.stderr);
}

/// `traceMCP` is asked for in the configuration: a `RUST_LOG` set for every program, even
/// to `off`, does not drop its lines, with `-v` or without.
#[test]
fn rust_log_does_not_drop_the_trace() {
    for (rust_log, verbose) in [("off", false), ("warn", false), ("warn", true), ("off", true)] {
        let project = project(true).env("RUST_LOG", rust_log);
        let call = ["tools", "call", "everything__echo", r#"{"message":"hi"}"#];
        let run =
            if verbose { project.run(&[&["-v"][..], &call].concat()) } else { project.run(&call) };
        run.ok();
        expect![[r#"
            DEBUG tool request → everything__echo
                parameters: {"message":"hi"}
            DEBUG tool response ← everything__echo latency: Nms, output: 8 chars, status: ok"#]]
        .assert_eq(&trace_lines(&run));
        // The MCP client's connections are part of the trace.
        assert!(run.stderr.contains("mcp server connected"), "RUST_LOG={rust_log}: {}", run.stderr);
    }
}

/// Without `traceMCP`, `RUST_LOG` still decides alone, over `-v`: `off` leaves the warning of
/// a failed call out, which `-v` alone shows.
#[test]
fn rust_log_alone_decides_without_trace_mcp() {
    let call = ["-v", "tools", "call", "fs__read", r#"{"path":"missing.md"}"#];
    let run = project(false).run(&call);
    assert_eq!(run.code, 1, "{run:?}");
    expect![[r#"
        WARN tool response ← fs__read latency: Nms, status: failed, error: invalid arguments for `fs__read`: at /: no file or directory at `missing.md`: check the path with `fs__ls` or `fs__glob`"#]]
    .assert_eq(&trace_lines(&run));
    let run = project(false).env("RUST_LOG", "off").run(&call);
    assert_eq!(run.code, 1, "{run:?}");
    expect![[r#"
        error: invalid arguments for `fs__read`: at /: no file or directory at `missing.md`: check the path with `fs__ls` or `fs__glob`
    "#]]
    .assert_eq(&run.stderr);
}

/// `-vvv` shows the MCP client's trace lines with `traceMCP` as without it: its filter is
/// joined to the verbosity's, not written into it where `toolmux_mcp=debug` hid them.
#[test]
fn trace_mcp_keeps_the_trace_lines_of_vvv() {
    // A server that sends a notification no client knows before each answer: toolmux logs
    // it at trace level. The answer comes 300 ms later: the client handles a notification
    // on a task of its own, which a call answered at once could outrun to the exit.
    let pinging = line_server(&serde_json::json!({
        "name": "pinging",
        "tools": [{"name": "ping", "inputSchema": {"type": "object"}}],
        "notify": "notifications/custom-ping",
        "text": "pong",
        "sleep": 0.3,
    }));
    for trace_mcp in [false, true] {
        let project = Project::new();
        project.file(
            "toolmux.yaml",
            &format!("defaults:\n  traceMCP: {trace_mcp}\nmcpServers:\n  pinging:\n{pinging}"),
        );
        let run = project.run(&["-vvv", "tools", "call", "pinging__ping", "{}"]);
        expect!["pong"].assert_eq(run.ok().trim());
        assert!(
            run.stderr.contains("notification ignored"),
            "traceMCP: {trace_mcp}\n{}",
            run.stderr
        );
    }
}

/// The log in a file or a pipe is plain text, so that a grep for ` WARN tool response ←` or
/// `server=everything` finds its lines; on a terminal it keeps its colours, unless
/// `NO_COLOR` is set.
#[test]
fn the_log_has_colours_only_on_a_terminal() {
    let call = ["tools", "call", "everything__echo", r#"{"message":"hi"}"#];
    let run = project(true).run(&call);
    run.ok();
    assert!(!run.stderr.contains('\x1b'), "{:?}", run.stderr);
    assert!(run.stderr.contains("DEBUG mcp server connected server=everything"), "{}", run.stderr);

    let run = project(true).run_at_terminal(&serde_json::json!([]), &call);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("\x1b[34mDEBUG\x1b[0m tool request → everything__echo"), "{run:?}");
    let run = project(true).env("NO_COLOR", "1").run_at_terminal(&serde_json::json!([]), &call);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("DEBUG tool request → everything__echo"), "{run:?}");
}

/// An error of several lines (a command's output) is logged on one line, its line breaks
/// written `\n`, so that a search of the log by line finds the whole response.
#[test]
fn an_error_of_several_lines_is_traced_on_one_line() {
    let project = Project::new();
    project
        .file("toolmux.yaml", "defaults:\n  traceMCP: true\nfs: {permissions: [read, execute]}\n");
    let run = project.run(&["tools", "call", "fs__bash", r#"{"command":"echo out; exit 3"}"#]);
    assert_eq!(run.code, 1, "{run:?}");
    let responses: Vec<&str> =
        run.stderr.lines().filter(|line| line.contains("tool response ←")).collect();
    assert_eq!(responses.len(), 1, "{}", run.stderr);
    assert!(responses[0].contains("status: failed, error: "), "{}", responses[0]);
    assert!(responses[0].contains("\\nout"), "{}", responses[0]);
}
