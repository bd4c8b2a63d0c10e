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

pub mod conformance;
pub mod llm;
pub mod mock;
pub mod redis;

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
