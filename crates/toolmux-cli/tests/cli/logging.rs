//! What the binary logs on stderr by default: toolmux's warnings (an upstream tool left
//! out, a cut list), one line each, none on a normal run; `-q` errors only; `--json` on
//! stdout clean whatever stderr says.

use crate::{Project, gateway_project, line_server};

/// A project whose server `bad` lists `good` and `broken`, a tool without `inputSchema`.
fn malformed_project() -> Project {
    let bad = line_server(&serde_json::json!({
        "name": "bad",
        "tools": [{"name": "good", "inputSchema": {"type": "object"}}, {"name": "broken"}],
        "text": "ok",
    }));
    let project = Project::new();
    project.file("toolmux.yaml", &format!("mcpServers:\n  bad:\n{bad}"));
    project
}

/// The names a `tools list --json` printed, its stdout checked to be JSON alone.
fn listed(stdout: &str) -> Vec<String> {
    let tools: serde_json::Value = serde_json::from_str(stdout).expect("stdout is JSON alone");
    let tools = tools.as_array().expect("a list of tools");
    tools.iter().map(|t| t["name"].as_str().unwrap_or_default().to_owned()).collect()
}

/// An upstream tool left out for a malformed schema is told by default, on stderr, on one
/// line without a timestamp; `-q` silences it; stdout is the JSON list either way.
#[test]
fn a_left_out_upstream_tool_is_warned_about_unless_quiet() {
    let project = malformed_project();
    let run = project.run(&["tools", "list", "--json"]);
    assert_eq!(listed(run.ok()), ["bad__good", "output__read"]);
    let warnings: Vec<&str> = run.stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "{}", run.stderr);
    assert!(warnings[0].contains("tool `broken` is left out"), "{}", run.stderr);
    assert!(warnings[0].contains("inputSchema"), "{}", run.stderr);
    assert!(warnings[0].starts_with(" WARN "), "no timestamp: {}", run.stderr);

    for quiet in ["-q", "--quiet"] {
        let run = project.run(&[quiet, "tools", "list", "--json"]);
        assert_eq!(listed(run.ok()), ["bad__good", "output__read"]);
        assert!(!run.stderr.contains("left out"), "{quiet}: {}", run.stderr);
    }
    // `-v` shows it too (with more); `-q` and `-v` together are refused.
    let run = project.run(&["-v", "tools", "list", "--json"]);
    assert!(run.stderr.contains("tool `broken` is left out"), "{}", run.stderr);
    let run = project.run(&["-q", "-v", "tools", "list"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("cannot be used with"), "{}", run.stderr);
}

/// `--help` documents `-q`.
#[test]
fn help_documents_quiet() {
    let run = Project::new().run(&["--help"]);
    let help = run.ok();
    assert!(help.contains("-q, --quiet"), "{help}");
    assert!(help.contains("errors only"), "{help}");
}

/// A normal `tools list` (the builtin tools and server-everything) and `serve` print no
/// warning, not even as the servers stop.
#[test]
fn a_normal_run_prints_no_warning() {
    let project = gateway_project();
    for args in [&["tools", "list"][..], &["tools", "list", "--json"], &["serve"]] {
        let run = project.run(args);
        run.ok();
        assert!(!run.stderr.contains("WARN"), "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("warning"), "{args:?}: {}", run.stderr);
    }
}

/// A provider that fails to start is told once, in the CLI's words, not again by the
/// warnings of the MCP client and the orchestrator.
#[test]
fn a_failed_start_is_told_once() {
    let project = Project::new();
    project.file("toolmux.yaml", "mcpServers:\n  gone:\n    command: /nonexistent/server\n");
    let run = project.run(&["tools", "list", "--json"]);
    assert_eq!(run.stderr.matches("failed to start").count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("warning: provider `gone` failed to start"), "{}", run.stderr);
}

/// A problem of the tool registry (a name collision) is told once, from the warmup's
/// report, not again by the registry's warning.
#[test]
fn a_registry_problem_is_told_once() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\naliases: {fs__read: fs__grep}\n");
    let run = project.run(&["tools", "list"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(run.stderr.matches("collides with tool `fs__read`").count(), 1, "{}", run.stderr);
    assert!(!run.stderr.contains("WARN"), "{}", run.stderr);
}
