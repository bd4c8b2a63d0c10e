//! Workspace integration tests; each module drives the real `toolmux` binary or several crates together.
