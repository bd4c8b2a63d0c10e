//! What a stdio MCP server inherits of toolmux's environment is redacted when its
//! variable's name says it is a credential: a real server (a Python program) echoing its
//! environment, started through the facade with `envInherit: all` and with the default
//! (`safe`), where only the variables the configuration file names were secrets.
//!
//! The test needs variables in toolmux's own environment, which a test cannot set in its
//! process without `unsafe` (other threads read it): it runs itself again as a child with
//! them set, and the child does the work.
#![cfg(feature = "mcp")]

use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use toolmux::Toolmux;
use toolmux::config::{FileFormat, load_str};
use toolmux::toolmux_core::{CallContext, ToolCall};

/// Set in the child's environment: it is the one that checks.
const CHILD: &str = "TOOLMUX_TEST_INHERITED_ENV_CHILD";

/// The child's variables: credentials by their names (one named as one word, another
/// the X11 cookie file) and a setting.
const VARIABLES: [(&str, &str); 5] = [
    ("GITHUB_TOKEN", "ghp_inheritedTokenAbc123"),
    ("DB_PASS", "hunter2-inherited-pass"),
    ("GOOGLEAPIKEY", "AIzaInheritedGoogleKey987"),
    ("XAUTHORITY", "/run/user/1000/inherited-xauth-cookie"),
    ("PLAIN_SETTING", "a-visible-setting-value"),
];

/// How long the child may take: two Python servers started and asked three times.
const WAIT: Duration = Duration::from_secs(60);

#[test]
fn inherited_variables_named_as_credentials_are_redacted() {
    if std::env::var_os(CHILD).is_some() {
        check_in_child();
        return;
    }
    let dir = tempfile::tempdir().expect("temporary folder");
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let file = |path: &std::path::Path| std::fs::File::create(path).expect("an output file");
    let mut child = Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", "inherited_variables_named_as_credentials_are_redacted"])
        .args(["--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .envs(VARIABLES)
        .stdin(Stdio::null())
        .stdout(file(&out))
        .stderr(file(&err))
        .spawn()
        .expect("the test binary runs again");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child's status") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = format!(
        "{}{}",
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    let status = status.unwrap_or_else(|| panic!("the child ran over {WAIT:?}: {said}"));
    assert!(status.success(), "the child failed: {said}");
    assert!(said.contains("1 passed"), "the child ran no test: {said}");
}

/// Starts two servers echoing their environment, one inheriting all of it and one the
/// default, and asks them for the variables.
fn check_in_child() {
    let server = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/env_server.py");
    let yaml = format!(
        "mcpServers:
  all: {{command: python3, args: ['{server}'], envInherit: all, protocol: legacy, malwareCheck: false}}
  safe: {{command: python3, args: ['{server}'], protocol: legacy, malwareCheck: false}}
"
    );
    let dir = tempfile::tempdir().expect("temporary folder");
    let env = |name: &str| std::env::var(name).ok();
    let loaded = load_str(&yaml, FileFormat::Yaml, "toolmux.yaml", dir.path(), &env)
        .unwrap_or_else(|e| panic!("{e}"));
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let toolmux = Toolmux::build(&loaded).await.unwrap_or_else(|e| panic!("{e}"));
        let orchestrator = toolmux.orchestrator();
        let report = orchestrator.warmup().await;
        assert!(report.is_ok(), "{report:?}");
        let echo = |tool: &str, name: &str| {
            let call = ToolCall::new(tool, json!({"name": name}));
            async move {
                let result = orchestrator.execute(call, &CallContext::new()).await;
                assert!(result.ok, "{result:?}");
                result.result.unwrap_or_default()
            }
        };
        assert_eq!(echo("all__env", "GITHUB_TOKEN").await, "GITHUB_TOKEN=[redacted]");
        // Credentials named as one word, which were neither redacted nor withheld.
        assert_eq!(echo("all__env", "GOOGLEAPIKEY").await, "GOOGLEAPIKEY=[redacted]");
        assert_eq!(echo("all__env", "XAUTHORITY").await, "XAUTHORITY=[redacted]");
        assert_eq!(echo("safe__env", "GOOGLEAPIKEY").await, "GOOGLEAPIKEY=(not set)");
        assert_eq!(echo("safe__env", "XAUTHORITY").await, "XAUTHORITY=(not set)");
        assert_eq!(
            echo("all__env", "PLAIN_SETTING").await,
            "PLAIN_SETTING=a-visible-setting-value"
        );
        // `safe` withholds them all, judging names by the words the redaction does (it
        // passed DB_PASS on before it did).
        assert_eq!(echo("all__env", "DB_PASS").await, "DB_PASS=[redacted]");
        assert_eq!(echo("safe__env", "GITHUB_TOKEN").await, "GITHUB_TOKEN=(not set)");
        assert_eq!(echo("safe__env", "DB_PASS").await, "DB_PASS=(not set)");
        toolmux.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    });
}
