//! Test helpers for toolmux crates: the provider conformance suite every provider must pass,
//! and scriptable mock providers for exercising the orchestrator.
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
pub mod mock;
