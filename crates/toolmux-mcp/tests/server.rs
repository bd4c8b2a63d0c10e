//! The server half: a `ToolProvider` served by `toolmux_mcp::server` over an in-process
//! stdio pair and over HTTP on 127.0.0.1, driven by rmcp's client, the official Python SDK
//! client and the official conformance suite.
#![allow(clippy::unwrap_used, reason = "tests: a panic is the failure report")]

#[path = "fixtures/server/provider.rs"]
#[allow(dead_code, reason = "shared with the fixture binary, which uses less of it")]
mod provider;

#[path = "server/support.rs"]
mod support;

#[path = "server/affinity.rs"]
mod affinity;
#[path = "server/conformance.rs"]
mod conformance;
#[path = "server/http.rs"]
mod http;
#[path = "server/progress.rs"]
mod progress;
#[path = "server/protocol.rs"]
mod protocol;
#[path = "server/python.rs"]
mod python;
#[path = "server/stdio.rs"]
mod stdio;
