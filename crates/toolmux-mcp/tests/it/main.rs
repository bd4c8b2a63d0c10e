//! Integration tests of the MCP client against real servers: server-everything (npm), a
//! Python SDK server (PyPI), an in-process rmcp server and a fault-injection fixture.

// Tests may unwrap: a failure is a test failure with the value shown.
#![allow(clippy::unwrap_used)]

mod answer_posts;
mod conformance_suite;
mod everything;
mod faults;
mod health;
mod hostile;
mod http_errors;
mod oauth_server;
mod oauth_sse;
mod orphans;
mod passthrough;
mod progress;
mod python;
mod questions;
mod reconnect;
mod rmcp_peer;
mod roundtrip;
mod sessions;
mod sse_posts;
mod supply;
mod support;
mod terminal;
mod upstream_tasks;
mod url_elicitation;
