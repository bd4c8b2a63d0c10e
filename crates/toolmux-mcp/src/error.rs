//! The one error type of this crate, and how it becomes a [`ToolError`].

use std::error::Error as StdError;
use std::time::Duration;
use toolmux_core::ToolError;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What went wrong talking to an MCP server. Every variant names the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server runs a package OSV lists as malicious: it was not started.
    #[error(
        "mcp server `{server}`: not started: OSV lists {package} as malicious: {}; remove the \
         server, or set `malwareCheck: false` on it if you are sure the advisory is wrong",
        .advisories.join(", ")
    )]
    Malicious {
        /// The server.
        server: String,
        /// The package (`npm name@version`).
        package: String,
        /// The malicious-package advisories (`MAL-2025-1234 (summary)`).
        advisories: Vec<String>,
    },
    /// The server's configuration cannot work.
    #[error("mcp server `{server}`: invalid configuration: {message}")]
    Config {
        /// The server.
        server: String,
        /// What is wrong.
        message: String,
    },
    /// The server could not be started or reached.
    #[error("mcp server `{server}`: cannot connect over {transport}")]
    Connect {
        /// The server.
        server: String,
        /// The transport tried.
        transport: &'static str,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The server did not finish its handshake in time.
    #[error("mcp server `{server}`: no answer to the handshake within {}ms", .after.as_millis())]
    StartupTimeout {
        /// The server.
        server: String,
        /// The startup timeout.
        after: Duration,
    },
    /// The handshake failed.
    #[error("mcp server `{server}`: handshake failed")]
    Handshake {
        /// The server.
        server: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The connection broke or closed.
    #[error("mcp server `{server}`: connection closed{}", with_detail(.detail))]
    Closed {
        /// The server.
        server: String,
        /// What is known about why (exit status, last error).
        detail: Option<String>,
    },
    /// A request was not delivered: its HTTP POST could not be sent or the server refused
    /// it, so the server did not run it and it may be sent again. The connection and the
    /// other requests on it go on.
    #[error("mcp server `{server}`: {method} not delivered: {message}")]
    Undelivered {
        /// The server.
        server: String,
        /// The request method.
        method: &'static str,
        /// What happened to the request (the HTTP status, the connection failure).
        message: String,
    },
    /// A request was sent and its HTTP POST got no answer in time (or broke after it was
    /// sent): the server may have received and run it, so sending it again may run it
    /// twice. The connection and the other requests on it go on.
    #[error(
        "mcp server `{server}`: {method} sent, outcome unknown: {message}; it may have run, so \
         check its effect before calling again"
    )]
    OutcomeUnknown {
        /// The server.
        server: String,
        /// The request method.
        method: &'static str,
        /// What happened to the request (the timeout).
        message: String,
    },
    /// The server sent something that is not MCP.
    #[error("mcp server `{server}`: protocol error: {message}")]
    Protocol {
        /// The server.
        server: String,
        /// What was wrong.
        message: String,
    },
    /// The server answered a request with a JSON-RPC error.
    #[error("mcp server `{server}`: {method} failed: {message} (code {code})")]
    Rpc {
        /// The server.
        server: String,
        /// The request method.
        method: &'static str,
        /// The JSON-RPC error code.
        code: i32,
        /// The error message.
        message: String,
    },
    /// The server refused toolmux and OAuth could not authorize it (no one to approve, a
    /// refused grant, scope that is never enough).
    #[error("mcp server `{server}`: not authorized: {message}")]
    Auth {
        /// The server.
        server: String,
        /// Why, and what to do.
        message: String,
    },
    /// The server failed to start too often in a row and is given up on for a while.
    #[error(
        "mcp server `{server}`: given up after {restarts} failed restarts; tries again in {} s",
        .retry_in.as_secs()
    )]
    GaveUp {
        /// The server.
        server: String,
        /// Restarts made.
        restarts: u32,
        /// How long until a call starts it again.
        retry_in: Duration,
    },
    /// The provider was shut down.
    #[error("mcp server `{server}`: shut down")]
    ShutDown {
        /// The server.
        server: String,
    },
    /// The address to serve over HTTP could not be listened on (in use by another
    /// program, most often). It names no server: the address is what the person chose.
    #[error("cannot listen on {addr}: {reason}")]
    Listen {
        /// The served server's name.
        server: String,
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// Why, and what to choose instead.
        reason: String,
    },
    /// Serving a provider over MCP failed: the transport broke (`server` is the name this
    /// process serves under).
    #[error("mcp server `{server}`: serving over {transport} failed")]
    Serve {
        /// The served server's name.
        server: String,
        /// The transport, `stdio` or `http`.
        transport: &'static str,
        /// Why.
        #[source]
        source: BoxError,
    },
}

fn with_detail(detail: &Option<String>) -> String {
    detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default()
}

impl McpError {
    /// The server concerned.
    pub fn server(&self) -> &str {
        match self {
            McpError::Config { server, .. }
            | McpError::Malicious { server, .. }
            | McpError::Connect { server, .. }
            | McpError::StartupTimeout { server, .. }
            | McpError::Handshake { server, .. }
            | McpError::Closed { server, .. }
            | McpError::Undelivered { server, .. }
            | McpError::OutcomeUnknown { server, .. }
            | McpError::Protocol { server, .. }
            | McpError::Rpc { server, .. }
            | McpError::Auth { server, .. }
            | McpError::GaveUp { server, .. }
            | McpError::ShutDown { server }
            | McpError::Serve { server, .. }
            | McpError::Listen { server, .. } => server,
        }
    }

    /// Converts into the vocabulary error for a call of `tool`.
    pub fn into_tool_error(self, tool: Option<&str>) -> ToolError {
        let provider = self.server().to_owned();
        let message = full_message(&self);
        // The vocabulary's provider-level variants print the provider themselves.
        let prefix = format!("mcp server `{provider}`: ");
        let bare = message.strip_prefix(&prefix).unwrap_or(&message).to_owned();
        match self {
            McpError::Config { .. }
            | McpError::Malicious { .. }
            | McpError::GaveUp { .. }
            | McpError::ShutDown { .. }
            | McpError::Auth { .. } => ToolError::Unavailable { provider, message: bare },
            McpError::Connect { .. }
            | McpError::StartupTimeout { .. }
            | McpError::Handshake { .. }
            | McpError::Closed { .. }
            | McpError::Undelivered { .. }
            | McpError::Serve { .. }
            | McpError::Listen { .. } => {
                ToolError::Transport { provider, message: bare, source: None }
            }
            // Not a transport error, which is transient: a retry of a call that may have
            // run could run it twice.
            McpError::OutcomeUnknown { .. } => {
                ToolError::Other { provider, message: bare, source: None }
            }
            McpError::Protocol { .. } => {
                let message = bare.strip_prefix("protocol error: ").unwrap_or(&bare).to_owned();
                ToolError::Protocol { provider, message }
            }
            McpError::Rpc { code, .. } => match tool {
                Some(tool) if code == -32602 => ToolError::invalid_arguments(tool, message),
                Some(tool) => ToolError::remote(tool, message),
                None => ToolError::Other { provider, message: bare, source: None },
            },
        }
    }
}

impl From<McpError> for ToolError {
    fn from(error: McpError) -> Self {
        error.into_tool_error(None)
    }
}

/// The message and its causes, each said once: the vocabulary error is flat.
fn full_message(error: &McpError) -> String {
    toolmux_core::error_report(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    fn check(error: McpError, expect: Expect) {
        let tool_error = error.into_tool_error(Some("echo"));
        expect.assert_eq(&format!("{} [{}]", tool_error.report(), tool_error.code()));
    }

    #[test]
    fn conversions() {
        check(
            McpError::Closed { server: "srv".into(), detail: Some("exit status: 3".into()) },
            expect!["srv: connection closed (exit status: 3) [transport]"],
        );
        check(
            McpError::StartupTimeout { server: "srv".into(), after: Duration::from_millis(500) },
            expect!["srv: no answer to the handshake within 500ms [transport]"],
        );
        check(
            McpError::Protocol { server: "srv".into(), message: "not JSON: `hello`".into() },
            expect!["srv: protocol error: not JSON: `hello` [protocol]"],
        );
        check(
            McpError::Rpc {
                server: "srv".into(),
                method: "tools/call",
                code: -32603,
                message: "boom".into(),
            },
            expect!["mcp server `srv`: tools/call failed: boom (code -32603) [remote]"],
        );
        check(
            McpError::GaveUp {
                server: "srv".into(),
                restarts: 5,
                retry_in: Duration::from_secs(20),
            },
            expect![
                "srv unavailable: given up after 5 failed restarts; tries again in 20 s [unavailable]"
            ],
        );
        check(
            McpError::Undelivered {
                server: "srv".into(),
                method: "tools/call",
                message: "posting it failed: connection refused".into(),
            },
            expect![
                "srv: tools/call not delivered: posting it failed: connection refused [transport]"
            ],
        );
        check(
            McpError::OutcomeUnknown {
                server: "srv".into(),
                method: "tools/call",
                message: "its POST got no answer within 1500 ms".into(),
            },
            expect![
                "srv: tools/call sent, outcome unknown: its POST got no answer within 1500 ms; it may have run, so check its effect before calling again [other]"
            ],
        );
    }

    /// A request the server refused, or that was never sent, may be sent again; one sent
    /// with no answer in time may have run, and is no error a retry is made on.
    #[test]
    fn only_a_request_never_taken_is_transient() {
        let refused = McpError::Undelivered {
            server: "srv".into(),
            method: "tools/call",
            message: "the server answered its POST with HTTP 503 Service Unavailable".into(),
        };
        let unknown = McpError::OutcomeUnknown {
            server: "srv".into(),
            method: "tools/call",
            message: "its POST got no answer within 1500 ms".into(),
        };
        assert!(refused.into_tool_error(Some("echo")).is_transient());
        assert!(!unknown.into_tool_error(Some("echo")).is_transient());
    }
}
