//! `cargo xtask`: codegen, tidy, ci and bench for the toolmux workspace.
//!
//! Run `cargo xtask help` for the commands. Arguments are parsed by hand to keep this
//! crate's dependencies to `anyhow` and `serde_json`.

// xtask is a command-line tool: what it prints to the terminal is its interface.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod ci;
mod cmd;
mod codegen;
mod metadata;
mod tidy;
mod walk;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  codegen [--check]      write every generated file; with --check, fail listing the stale ones
  tidy                   check `//!` lines, forbidden test/debug macros and the crate layering
  ci [--install-tools]   fmt, bench locks, clippy, tests, doctests, codegen --check, tidy,
                         cargo deny, features, bench build;
                         --install-tools (or CI=true) lets it `cargo install` a missing cargo-deny
  bench [ARGS...]        cargo bench [ARGS...] in the workspace and each benchmarks/*/ workspace;
                         BENCHMARKS.md is updated by hand from its output
  help                   print this message
";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let root = project_root();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        bail!("no command given");
    };
    match command.as_str() {
        "codegen" => {
            let mode = match flags(rest, &["--check"])?.as_slice() {
                [] => codegen::Mode::Write,
                _ => codegen::Mode::Check,
            };
            codegen::run(&root, mode, codegen::Binaries::Build)
        }
        "tidy" => {
            flags(rest, &[])?;
            tidy::run(&root)
        }
        "ci" => {
            let install_tools = !flags(rest, &["--install-tools"])?.is_empty();
            ci::run(&root, &ci::CiOptions { install_tools })
        }
        "bench" => ci::bench(&root, rest),
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => {
            eprint!("{USAGE}");
            bail!("unknown command `{other}`")
        }
    }
}

/// Returns the flags of `args`, refusing anything not in `known`.
fn flags<'a>(args: &'a [String], known: &[&str]) -> Result<Vec<&'a str>> {
    args.iter()
        .map(|arg| {
            if !known.contains(&arg.as_str()) {
                bail!("unexpected argument `{arg}`\n\n{USAGE}");
            }
            Ok(arg.as_str())
        })
        .collect()
}

/// The workspace root: xtask always sits one level beneath it.
fn project_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().map_or_else(|| manifest_dir.to_path_buf(), Path::to_path_buf)
}
