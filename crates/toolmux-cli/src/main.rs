//! The `toolmux` binary: arguments, configuration, run, exit code.

fn main() {}
