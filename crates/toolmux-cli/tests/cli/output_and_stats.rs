//! Outputs over the size cap are stored and read back; statistics persist across runs.

use crate::Project;
use expect_test::expect;

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
    assert!(human.stderr.contains("toolmux output show run-default/"), "{}", human.stderr);
}

#[test]
fn unknown_handle_exits_1() {
    let run = spilled_project().run(&["output", "show", "run-x/out-y"]);
    assert_eq!(run.code, 1);
    expect!["error: no stored output `run-x/out-y`: handles look like `run-id/out-id`, as given in a tool_output message"]
        .assert_eq(run.stderr.trim());
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

    let table = project.run(&["stats"]);
    let header = table.ok().lines().next().unwrap_or_default().to_owned();
    expect!["tool        calls       ok   failed     p50 ms     p95 ms"].assert_eq(&header);
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
