//! Running external commands: the cargo that runs xtask, status checks, captured output.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// The cargo that launched xtask (so the toolchain matches), or `cargo` from `PATH`.
pub(crate) fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// A `Command` for `program`, where `cargo` means [`cargo()`].
pub(crate) fn command(program: &str) -> Command {
    match program {
        "cargo" => Command::new(cargo()),
        other => Command::new(other),
    }
}

/// The command line as a user would type it, for messages.
pub(crate) fn display(command: &Command) -> String {
    let program = command.get_program().to_string_lossy();
    // Show `cargo` rather than the toolchain's absolute path to its cargo.
    let program = match std::path::Path::new(&*program).file_stem() {
        Some(stem) if stem == "cargo" => "cargo".into(),
        _ => program,
    };
    let mut line = program.into_owned();
    for arg in command.get_args() {
        let arg = arg.to_string_lossy();
        let needs_quotes = arg.is_empty() || arg.contains(char::is_whitespace);
        let written = if needs_quotes { write!(line, " '{arg}'") } else { write!(line, " {arg}") };
        written.expect("writing to a String cannot fail");
    }
    line
}

/// Runs `command` with inherited stdio; an error unless it exits successfully.
pub(crate) fn run(command: &mut Command) -> Result<()> {
    let status = command.status().with_context(|| format!("cannot run `{}`", display(command)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", display(command));
    }
    Ok(())
}

/// Runs `command` and returns its standard output; standard error goes to the terminal.
pub(crate) fn stdout(command: &mut Command) -> Result<String> {
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run `{}`", display(command)))?;
    if !output.status.success() {
        bail!("`{}` failed ({})", display(command), output.status);
    }
    String::from_utf8(output.stdout)
        .with_context(|| format!("`{}` printed something that is not UTF-8", display(command)))
}

/// Whether `command` runs and exits successfully, with its output discarded.
pub(crate) fn succeeds(command: &mut Command) -> bool {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}
