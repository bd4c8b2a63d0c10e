//! Workspace integration tests: several crates together through the `toolmux` facade.
//!
//! Tests that run the `toolmux` binary live in `crates/toolmux-cli/tests/cli`, the only
//! place cargo builds the binary for tests and tells its path (`CARGO_BIN_EXE_toolmux`).

mod cache;
mod config;
mod external;
mod fs;
