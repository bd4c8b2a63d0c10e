//! Test helpers for toolmux crates: the provider conformance suite every provider must pass,
//! scriptable mock providers for exercising the orchestrator, and [`eventually`] for
//! waiting on what happens in the background.
//!
//! This crate is a dev-dependency only; nothing in it is meant for production.
//!
//! # Example
//!
//! ```
//! use toolmux_core::{ToolKind, ToolOutput, ToolSet, ToolSpec};
//! use toolmux_test_support::conformance::{Conformance, SampleCall};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let set = ToolSet::new("demo", ToolKind::Builtin)
//!     .with_tool(
//!         ToolSpec::new("ping", "Answers pong", ToolSpec::any_object_schema()),
//!         |_, _| async { Ok(ToolOutput::text("pong")) },
//!     );
//! Conformance::new()
//!     .with_sample(SampleCall::new("ping", serde_json::json!({})).expect_text_contains("pong"))
//!     .check(&set)
//!     .await;
//! # });
//! ```
#![deny(missing_docs)]

#[cfg(unix)]
pub mod blocking;
pub mod conformance;
pub mod llm;
pub mod logs;
pub mod loopback;
pub mod mock;
pub mod otlp;
pub mod procs;
pub mod redis;
pub mod terminal;

use std::future::Future;
use std::time::Duration;

/// How long [`eventually`] waits before it gives up.
pub const EVENTUALLY_TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `check` every 10 ms until it holds; panics naming `what` after
/// [`EVENTUALLY_TIMEOUT`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + EVENTUALLY_TIMEOUT;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Checks the summary of an official MCP conformance suite run against its baseline file
/// of expected failures both ways: the suite itself fails a run only for scored scenarios
/// that fail unexpectedly, so an extension scenario that starts passing (or failing) would
/// go unnoticed without this. `Err` says which scenarios differ.
pub fn check_conformance_summary(summary: &str, baseline: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(baseline)
        .map_err(|e| format!("cannot read {}: {e}", baseline.display()))?;
    let expected: std::collections::BTreeSet<&str> =
        text.lines().filter_map(|line| line.trim().strip_prefix("- ")).map(str::trim).collect();
    let failed: std::collections::BTreeSet<&str> = summary
        .lines()
        .filter_map(|line| line.trim().strip_prefix("✗ "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|name| name.trim_end_matches(':'))
        .collect();
    if expected == failed {
        return Ok(());
    }
    let passing: Vec<&&str> = expected.difference(&failed).collect();
    let failing: Vec<&&str> = failed.difference(&expected).collect();
    Err(format!(
        "{} is stale: listed but passing {passing:?}; failing but not listed {failing:?}",
        baseline.display()
    ))
}
