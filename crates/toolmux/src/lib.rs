//! toolmux, the facade: reads the configuration file (JSON or YAML, or a Claude Desktop,
//! Cursor or VS Code MCP file as it is) and wires every provider it names — builtin file
//! tools, MCP servers, REST tools and OpenAPI imports — into one
//! [`Orchestrator`](toolmux_orchestrator::Orchestrator).
//!
//! It is for programs that want toolmux's whole tool plane from one file: the `toolmux`
//! binary, agents, gateways. Programs that assemble providers by hand use the provider
//! crates and `toolmux-orchestrator` directly.
//!
//! Features pick the providers: `fs` (default), `mcp`, `rest`, `external`, `agent` (agents
//! and their model clients), `redis` (queues, cache and pending results shared by replicas),
//! `otel` (OpenTelemetry export), `tower` (the orchestrator as a `tower::Service` taking a
//! `ToolRequest`), and `full` for all.
//!
//! # Example
//!
//! ```
//! use toolmux::config::{FileFormat, load_str};
//! use toolmux::Toolmux;
//! use toolmux_core::{CallContext, ToolCall};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let project = tempfile::tempdir().unwrap();
//! std::fs::write(project.path().join("notes.txt"), "TODO: write docs\n").unwrap();
//! let text = r#"
//! defaults:
//!   toolTimeout: 30000
//!   outputDir: ${OUTPUT_DIR:-.toolmux}
//! fs:
//!   permissions: [read]
//! "#;
//! let env = |name: &str| std::env::var(name).ok();
//! let loaded = load_str(text, FileFormat::Yaml, "toolmux.yaml", project.path(), &env).unwrap();
//! let toolmux = Toolmux::build(&loaded).await.unwrap();
//! let tools = toolmux.orchestrator();
//! assert!(tools.warmup().await.is_ok());
//! let found = tools
//!     .execute(ToolCall::new("fs__grep", serde_json::json!({"pattern": "TODO"})), &CallContext::new())
//!     .await;
//! assert!(found.ok, "{found:?}");
//! assert!(found.result.unwrap().contains("notes.txt"));
//! # });
//! ```
#![deny(missing_docs)]

pub mod config;
mod error;
#[cfg(test)]
mod test_support;
mod wire;

pub use error::ToolmuxError;
pub use wire::Toolmux;

#[cfg(feature = "agent")]
pub use toolmux_agent;
pub use toolmux_core;
#[cfg(feature = "fs")]
pub use toolmux_fs;
#[cfg(feature = "agent")]
pub use toolmux_llm;
#[cfg(feature = "mcp")]
pub use toolmux_mcp;
pub use toolmux_orchestrator;
#[cfg(feature = "redis")]
pub use toolmux_redis;
#[cfg(feature = "rest")]
pub use toolmux_rest;
