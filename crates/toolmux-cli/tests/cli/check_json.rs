//! `config check --json` says for programs what the report says for people: whether the
//! file is valid, each provider's status, error and tools, how many failed, the problems
//! among their tools and the warnings, as one JSON document on stdout whatever the outcome,
//! with the exit code of the report and the configuration's secrets cut out.

use crate::{Project, Run};
use serde_json::Value;

/// The one JSON document a run printed on stdout.
fn document(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("one JSON document ({e}): {run:?}"))
}

/// A provider that fails to start (a server that exits with a usage error, printing the
/// secret its `args` were given), one that starts, and a warning quoting the secret.
fn failing_project() -> Project {
    let project = Project::new().env("CHECK_SECRET", "sekret-4f3e2d1c");
    project.file(
        "toolmux.yaml",
        "fs: {}\nmcpServers:\n  bad:\n    command: sh\n    args: [-c, 'echo \"usage: bad --key $1\" >&2; \
         exit 2', sh, '${CHECK_SECRET}']\n    autoApprove: ['${CHECK_SECRET}']\n",
    );
    project
}

#[test]
fn a_failed_start_is_told_as_the_report_tells_it() {
    let project = failing_project();
    let run = project.run(&["config", "check", "--json"]);
    assert_eq!(run.code, 3, "{run:?}");
    let report = document(&run);
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(report["failed"], 1, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    let row = |name: &str| {
        let providers = report["providers"].as_array().expect("providers");
        providers.iter().find(|p| p["namespace"] == name).cloned().expect(name)
    };
    let (bad, fs) = (row("bad"), row("fs"));
    assert_eq!(bad["status"], "failed", "{bad}");
    assert_eq!(bad["tools"], 0, "{bad}");
    assert_eq!(fs["status"], "started", "{fs}");
    assert!(fs["tools"].as_u64().is_some_and(|n| n > 0), "{fs}");
    assert!(fs.get("error").is_none(), "{fs}");
    // The error as the human report's row shows it: without the provider's name before it.
    let error = bad["error"].as_str().expect("an error");
    assert!(error.contains("exit status: 2"), "{error}");
    assert!(error.contains("usage: bad --key [redacted]"), "{error}");
    let human = project.run(&["config", "check"]);
    assert_eq!(human.code, 3, "{human:?}");
    let line = human.stdout.lines().find(|l| l.contains("FAILED")).expect("a FAILED row");
    assert!(line.contains(&format!("FAILED: {error} (")), "{line}\n{error}");
    // The warning, redacted on stderr, is redacted in the JSON too.
    let warnings = report["warnings"].as_array().expect("warnings");
    assert!(warnings.iter().any(|w| w.as_str().is_some_and(|w| w.contains("autoApprove"))));
    assert!(run.stderr.contains("autoApprove/alwaysAllow ([redacted])"), "{}", run.stderr);
    assert!(!run.stdout.contains("sekret-4f3e2d1c"), "a secret in the JSON: {}", run.stdout);
}

/// A name collision among the tools (a configuration error, exit 2): counted as `errors`,
/// and its message among the `problems`, which the report prints on stderr.
#[test]
fn a_collision_is_counted_and_told() {
    let project = Project::new();
    project.file("toolmux.yaml", "fs: {}\naliases: {fs__read: fs__grep}\n");
    let run = project.run(&["config", "check", "--json"]);
    assert_eq!(run.code, 2, "{run:?}");
    let report = document(&run);
    assert_eq!((&report["valid"], &report["ok"]), (&Value::from(true), &Value::from(false)));
    assert_eq!(report["errors"], 1, "{report}");
    assert_eq!(report["failed"], 0, "{report}");
    let problem = &report["problems"][0];
    assert_eq!(problem["severity"], "error", "{report}");
    assert!(
        problem["message"].as_str().is_some_and(|m| m.contains("collides with tool `fs__read`"))
    );
}

/// A mistake found once the file is read, when the providers are built (here a setting
/// that would refuse everything), is one JSON document too: it printed nothing on stdout.
#[test]
fn a_file_refused_while_building_is_told_in_json() {
    let project = Project::new();
    project.file("toolmux.yaml", "defaults:\n  externalMaxInboxes: 0\n");
    let run = project.run(&["config", "check", "--json"]);
    assert_eq!(run.code, 2, "{run:?}");
    let report = document(&run);
    assert_eq!((&report["valid"], &report["ok"]), (&Value::from(false), &Value::from(false)));
    assert_eq!(report["error"]["file"], "toolmux.yaml", "{report}");
    let message = report["error"]["message"].as_str().expect("a message");
    assert!(message.starts_with("defaults.externalMaxInboxes: 0 would refuse"), "{message}");
    // As for a file that does not parse.
    project.file("toolmux.yaml", "defaults:\n  toolTimeout: soon\n");
    let run = project.run(&["config", "check", "--json"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(document(&run)["valid"], false, "{run:?}");
}
