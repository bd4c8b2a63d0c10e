//! `cargo xtask`: codegen, tidy and ci for the toolmux workspace.

fn main() {}
