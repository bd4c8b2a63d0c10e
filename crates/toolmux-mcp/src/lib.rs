//! MCP for toolmux. The client half turns each configured MCP server into a
//! [`ToolProvider`](toolmux_core::ToolProvider) whose tools the orchestrator offers as
//! `{server}__{tool}`, over stdio, streamable HTTP, legacy SSE or WebSocket, speaking both the
//! handshake revisions (2024-11-05 to 2025-11-25) and the stateless 2026-07-28 revision.
//!
//! It is for programs that assemble a toolmux orchestrator (the `toolmux` facade does this
//! from the `mcpServers` section of its configuration file). Servers are started lazily or at
//! warmup, restarted with backoff when they die, and their whole process group is killed
//! and reaped on shutdown.
//!
//! Everything else a server offers passes through the same provider: its prompts,
//! resources, resource templates and resource updates; and what it asks or tells while it
//! works — `sampling/createMessage`, `elicitation/create` and `roots/list` (or their
//! 2026-07-28 `input_required` forms) are answered by the
//! [`InteractionHandler`](toolmux_core::InteractionHandler) of the call they belong to,
//! and its log lines go to that call's [`LogSink`](toolmux_core::LogSink). A caller that
//! cannot answer gets an unattended client's answer: no roots, elicitations declined (or
//! answered with their defaults), sampling refused.
//!
//! The server half ([`server`], cargo feature `server`, on by default) serves any
//! `ToolProvider` — in `toolmux serve`, the whole orchestrator — as one MCP server over stdio
//! or streamable HTTP, with pagination, progress, cancellation, `list_changed`, name
//! shortening for prefixing clients and DNS-rebinding protection.
//!
//! # Example
//!
//! ```no_run
//! use serde_json::json;
//! use toolmux_core::{CallContext, ToolProvider};
//! use toolmux_mcp::{McpProvider, McpServerConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = McpServerConfig::stdio("npx", ["-y", "@modelcontextprotocol/server-everything"])
//!     .with_base_dir("/srv/agent");
//! let everything = McpProvider::new("everything", config)?;
//! everything.warmup().await?;
//! for tool in everything.list_tools().await? {
//!     println!("everything__{}: {}", tool.name, tool.description);
//! }
//! let out = everything.call("echo", json!({"message": "hi"}), &CallContext::new()).await?;
//! assert_eq!(out.to_text(), "Echo: hi");
//! everything.shutdown().await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod client;
mod error;
mod inline;
#[cfg(feature = "server")]
pub mod server;
mod transport;

/// What a message line's buffer starts with: a call or its result is 150–400 bytes, and
/// `serde_json::to_vec`'s 128 grew it twice or three times for each.
const LINE_CAPACITY: usize = 512;

/// Appends JSON `text` (valid JSON, checked by whoever took it) to the line being written,
/// its carriage returns and line feeds written as spaces. In valid JSON those can stand
/// only as whitespace between tokens (in a string they are escaped), where a space means
/// the same; but a reader that ends lines at `\r` as well as `\n`, as Python's text
/// streams and Node's readline do, would take the text after one for a message of its
/// own: a client's arguments, or a server's result, spliced as they came could carry a
/// second request.
fn push_one_line(line: &mut Vec<u8>, text: &str) {
    line.extend(text.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
}

pub use client::{
    DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_IDLE, DeclaredTool, EnvInherit, McpProvider,
    McpServerConfig, OAuthConfig, OAuthGrant, OAuthStatus, Opener, PerSessionProvider,
    ProtocolMode, TransportKind,
};
pub use error::McpError;
