//! The supply-chain check: a stdio server started through a package runner is looked up in
//! OSV first (a fake OSV on loopback speaking its `/v1/query` API); a package with a
//! malicious-package advisory is never started, a clean one is, and when OSV cannot be
//! asked the server starts anyway (fail open).

use axum::Router;
use axum::routing::post;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use toolmux_core::{ToolError, ToolProvider};
use toolmux_mcp::{McpProvider, McpServerConfig};
use toolmux_test_support::loopback::Loopback;

use crate::support;

/// OSV as a fake: `MAL-` advisories for packages named `evil*`, an ordinary vulnerability
/// for the others; every query kept.
fn fake_osv(queries: Arc<Mutex<Vec<Value>>>) -> Loopback {
    let app = Router::new().route(
        "/v1/query",
        post(move |body: axum::body::Bytes| {
            let queries = queries.clone();
            async move {
                let query: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let name = query["package"]["name"].as_str().unwrap_or_default().to_owned();
                queries.lock().expect("not poisoned").push(query);
                let vulns = if name.starts_with("evil") {
                    json!([
                        {"id": "GHSA-xxxx-yyyy-zzzz", "summary": "an ordinary bug"},
                        {"id": "MAL-2025-4242", "summary": "Malicious code in evil-mcp (npm)"}
                    ])
                } else {
                    json!([{"id": "GHSA-aaaa-bbbb-cccc", "summary": "an ordinary bug"}])
                };
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    json!({"vulns": vulns}).to_string(),
                )
            }
        }),
    );
    Loopback::serve("osv", app)
}

/// A directory for the fake runner beneath the target directory, where programs may run
/// (a temporary directory may be mounted `noexec`).
fn exec_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("fake-npx")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a directory beneath the target directory")
}

/// A fake `npx` that marks that it ran, then serves as server-everything.
fn fake_npx(dir: &Path) -> (PathBuf, PathBuf) {
    let npx = dir.join("npx");
    let mark = dir.join("npx-ran");
    let script = format!(
        "#!/bin/sh\ntouch '{}'\nexec node '{}' stdio\n",
        mark.display(),
        support::everything_js().display()
    );
    std::fs::write(&npx, script).expect("a script");
    let mut permissions = std::fs::metadata(&npx).expect("written").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&npx, permissions).expect("made executable");
    (npx, mark)
}

fn config(npx: &Path, package: &str, osv: &str) -> McpServerConfig {
    let mut config = McpServerConfig::stdio(npx.display().to_string(), ["-y", package, "stdio"])
        .with_base_dir(support::run_dir());
    config.osv_url = Some(osv.to_owned());
    config
}

#[tokio::test]
async fn a_package_osv_lists_as_malicious_is_never_started() {
    let dir = exec_dir();
    let (npx, mark) = fake_npx(dir.path());
    let queries = Arc::default();
    let osv = fake_osv(Arc::clone(&queries));
    let url = format!("http://{}", osv.addr);

    let evil = McpProvider::new("evil", config(&npx, "evil-mcp@1.0.3", &url)).expect("valid");
    let error = evil.warmup().await.expect_err("refused");
    let report = error.report();
    assert!(matches!(error, ToolError::Unavailable { .. }), "{report}");
    assert!(
        report.contains("not started: OSV lists npm evil-mcp@1.0.3 as malicious: MAL-2025-4242 (Malicious code in evil-mcp (npm))")
            && report.contains("`malwareCheck: false`")
            && !report.contains("GHSA"),
        "{report}"
    );
    assert!(!mark.exists(), "the runner was started");
    assert_eq!(
        queries.lock().expect("not poisoned")[0],
        json!({"package": {"name": "evil-mcp", "ecosystem": "npm"}, "version": "1.0.3"})
    );

    // An ordinary vulnerability is no reason not to start.
    let fine = McpProvider::new("fine", config(&npx, "@acme/fine-mcp", &url)).expect("valid");
    fine.warmup().await.expect("started");
    assert!(mark.exists());
    assert!(!fine.list_tools().await.expect("tools").is_empty());
    fine.shutdown().await.expect("stopped");

    // Turned off for a server, nothing is asked.
    let asked = queries.lock().expect("not poisoned").len();
    let mut unchecked = config(&npx, "evil-other", &url);
    unchecked.malware_check = Some(false);
    let unchecked = McpProvider::new("unchecked", unchecked).expect("valid");
    unchecked.warmup().await.expect("started unchecked");
    unchecked.shutdown().await.expect("stopped");
    assert_eq!(queries.lock().expect("not poisoned").len(), asked);
}

/// OSV out of reach (nothing listens): the server starts, unchecked.
#[tokio::test]
async fn the_check_fails_open_when_osv_cannot_be_asked() {
    let dir = exec_dir();
    let (npx, mark) = fake_npx(dir.path());
    let port = support::free_port();
    let provider =
        McpProvider::new("x", config(&npx, "evil-mcp", &format!("http://127.0.0.1:{port}")));
    let provider = provider.expect("valid");
    provider.warmup().await.expect("started unchecked");
    assert!(mark.exists());
    provider.shutdown().await.expect("stopped");
}

/// OSV failing (a 503): the server starts unchecked, and for a minute later starts do not
/// ask again (each would wait for the same failure).
#[tokio::test]
async fn a_failing_osv_is_not_asked_again_at_once() {
    let dir = exec_dir();
    let (npx, mark) = fake_npx(dir.path());
    let asked = Arc::new(Mutex::new(0));
    let count = Arc::clone(&asked);
    let app = Router::new().route(
        "/v1/query",
        post(move || {
            let count = Arc::clone(&count);
            async move {
                *count.lock().expect("not poisoned") += 1;
                (axum::http::StatusCode::SERVICE_UNAVAILABLE, "down")
            }
        }),
    );
    let osv = Loopback::serve("osv-down", app);
    let url = format!("http://{}", osv.addr);
    for package in ["first-mcp", "second-mcp"] {
        let provider = McpProvider::new(package, config(&npx, package, &url)).expect("valid");
        provider.warmup().await.expect("started unchecked");
        provider.shutdown().await.expect("stopped");
    }
    assert!(mark.exists());
    assert_eq!(*asked.lock().expect("not poisoned"), 1);
}

/// OSV that takes its time (it never answers within its own timeout): the check is part of
/// the start, so the startup timeout counts from before it and ends the start, the runner
/// never run, instead of starting the server once OSV's timeout has passed.
#[tokio::test]
async fn the_startup_timeout_covers_the_malware_check() {
    let dir = exec_dir();
    let (npx, mark) = fake_npx(dir.path());
    let app = Router::new().route("/v1/query", post(std::future::pending::<&'static str>));
    let osv = Loopback::serve("osv-slow", app);
    let url = format!("http://{}", osv.addr);
    let config = config(&npx, "slow-checked-mcp", &url)
        .with_startup_timeout(std::time::Duration::from_millis(500));
    let provider = McpProvider::new("slow", config).expect("valid");

    let error = provider.warmup().await.expect_err("the start ran out of time");
    let report = error.report();
    assert!(
        report.contains("malware check (OSV) took the whole startup timeout of 500ms")
            && report.contains("`startupTimeoutMs`"),
        "{report}"
    );
    assert!(!mark.exists(), "the runner was started");
    provider.shutdown().await.expect("stopped");
}
