//! What kind of source a tool comes from, and which permission class it needs.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The kind of provider a tool comes from; reported in every [`crate::ToolResult`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolKind {
    /// A tool of an MCP server.
    Mcp,
    /// An HTTP API, inline or imported from OpenAPI.
    Rest,
    /// A builtin tool (files, shell).
    Builtin,
    /// Another agent, called as a tool.
    Agent,
    /// A tool of the agent runtime itself (`agent__final_report`).
    Internal,
    /// Routing to another agent (`router__handoff-to`).
    Router,
    /// A tool whose result arrives later from outside the process.
    External,
    /// Several providers behind one orchestrator.
    Composite,
}

impl ToolKind {
    /// The lowercase name used in logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolKind::Mcp => "mcp",
            ToolKind::Rest => "rest",
            ToolKind::Builtin => "builtin",
            ToolKind::Agent => "agent",
            ToolKind::Internal => "internal",
            ToolKind::Router => "router",
            ToolKind::External => "external",
            ToolKind::Composite => "composite",
        }
    }
}

impl fmt::Display for ToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a tool may do to the world; configuration switches classes on and off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionClass {
    /// Reads state and changes nothing.
    Read,
    /// Changes files or other local state.
    Write,
    /// Runs programs.
    Execute,
    /// Reaches other machines.
    Network,
}

impl PermissionClass {
    /// The lowercase name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionClass::Read => "read",
            PermissionClass::Write => "write",
            PermissionClass::Execute => "execute",
            PermissionClass::Network => "network",
        }
    }
}

impl fmt::Display for PermissionClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
