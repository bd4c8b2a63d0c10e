//! Checks on the text of `.rs` files: the `//!` first line, forbidden macros and
//! attributes, and what library code may not do.
//!
//! The forbidden strings are assembled with `concat!` so that this file does not
//! contain them and passes its own check.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::Violation;
use crate::walk;

/// Modules of library crates that may spawn processes, as paths relative to the workspace
/// root without `.rs`: an entry covers `ENTRY.rs` and everything under `ENTRY/`.
///
/// STYLE.md allows spawning only where a tool must (and there always with an explicit
/// working directory). Add an entry only for such a module, with a comment saying why.
pub(super) const SPAWN_ALLOWED: &[&str] = &[
    // toolmux-core: the one watchman (`/bin/sh`) per toolmux process that kills the process
    // groups of shell commands and stdio MCP servers when toolmux is killed.
    "crates/toolmux-core/src/group_guard",
    // toolmux-fs: the shell (bash) tool runs commands in their own process group.
    "crates/toolmux-fs/src/tools/shell",
    // toolmux-mcp: the stdio transport launches MCP servers as child processes.
    "crates/toolmux-mcp/src/transport/stdio",
    // toolmux-orchestrator: command hooks run the configured program for each call.
    "crates/toolmux-orchestrator/src/hooks/command",
    // toolmux-test-support (dev-dependency only): the fixture runs a real redis-server.
    "crates/toolmux-test-support/src/redis",
    // toolmux-test-support: a test run again under a fresh terminal (util-linux `script`).
    "crates/toolmux-test-support/src/terminal",
    // toolmux-test-support: a test run again as a child copy that plays a toolmux killed
    // with SIGKILL.
    "crates/toolmux-test-support/src/procs",
    // toolmux-external's journal tests (cfg(test) only): the test binary run again as a
    // child that is killed between the steps of a change.
    "crates/toolmux-external/src/journal/tests",
];

/// Text that must not appear in any `.rs` file, with what to do instead.
const FORBIDDEN: &[(&str, &str)] = &[
    (concat!("#[ig", "nore"), "tests are never skipped: make it pass, fix its peer or delete it"),
    (concat!("#[should", "_panic"), "assert on the `Err` instead of expecting a panic"),
    (concat!("to", "do!("), "finish the code, or leave a `// FIXME:` saying why it waits"),
    (concat!("db", "g!("), "remove the debugging macro"),
];

/// Reading the process's current directory, forbidden in libraries (DESIGN.md invariant 6).
const CURRENT_DIR: &str = concat!("env::", "current_dir");

/// Spawning a process, allowed in libraries only under [`SPAWN_ALLOWED`].
const SPAWN: &str = concat!("Command::", "new");

/// Checks every `.rs` file beneath `root`; `library_dirs` (relative to `root`) hold
/// library code, which is held to stricter rules.
pub(super) fn check(
    root: &Path,
    library_dirs: &[PathBuf],
    violations: &mut Vec<Violation>,
) -> Result<()> {
    for path in walk::files_with_extension(root, "rs")? {
        let text =
            fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let path = walk::relative(root, &path);
        check_doc_line(&path, &text, violations);
        check_forbidden(&path, &text, violations);
        if library_dirs.iter().any(|dir| path.starts_with(dir)) {
            check_library(&path, &text, violations);
        }
    }
    Ok(())
}

pub(super) fn check_doc_line(path: &Path, text: &str, violations: &mut Vec<Violation>) {
    if !text.starts_with("//!") {
        violations.push(Violation {
            path: path.to_path_buf(),
            line: 1,
            message: "file does not start with a `//!` line saying what it is for".into(),
        });
    }
}

pub(super) fn check_forbidden(path: &Path, text: &str, violations: &mut Vec<Violation>) {
    for (index, line) in text.lines().enumerate() {
        for (pattern, advice) in FORBIDDEN {
            if line.contains(pattern) {
                violations.push(Violation {
                    path: path.to_path_buf(),
                    line: index + 1,
                    message: format!("`{pattern}` is forbidden: {advice}"),
                });
            }
        }
    }
}

/// `path` is library code: no current directory, no spawning outside [`SPAWN_ALLOWED`],
/// and no run of spaces inside a string ([`has_spaced_string`]).
pub(super) fn check_library(path: &Path, text: &str, violations: &mut Vec<Violation>) {
    let may_spawn = is_spawn_allowed(path);
    for (index, line) in text.lines().enumerate() {
        let mut report = |message: String| {
            violations.push(Violation { path: path.to_path_buf(), line: index + 1, message });
        };
        if has_spaced_string(line) {
            report(
                "a run of spaces inside a string: a message continued on the next line needs \
                 a `\\` at the end of the line before"
                    .into(),
            );
        }
        if line.contains(CURRENT_DIR) {
            report(format!(
                "`{CURRENT_DIR}` in a library: resolve paths against a directory the caller \
                 passes in (DESIGN.md invariant 6)"
            ));
        }
        if line.contains(SPAWN) && !may_spawn {
            report(format!(
                "`{SPAWN}` in a library outside the modules that must spawn; if this one must, \
                 add it to SPAWN_ALLOWED in xtask/src/tidy/sources.rs"
            ));
        }
    }
}

/// Whether a string literal on `line` holds eight spaces in a row after a character other
/// than a space or an escaped line break: what a message broken over two lines without a
/// `\` leaves in its text (the next line's indentation; a table's columns are narrower).
/// Quotes are found naively (a character literal `'"'` may confuse it, which no library
/// line has), and a line with a raw string is not looked at past it.
pub(super) fn has_spaced_string(line: &str) -> bool {
    let mut inside = false;
    let mut escaped = false;
    let mut previous = ' ';
    let mut run = 0;
    let mut before = ' ';
    for c in line.chars() {
        if !inside {
            if c == '"' && matches!(before, 'r' | '#') {
                // A raw string: its escapes cannot be told from its text; not looked at.
                return false;
            }
            if c == '"' {
                (inside, previous, run) = (true, ' ', 0);
            }
            before = c;
            continue;
        }
        if escaped {
            // `\n` and `\t` start a new line of the text: indentation after them is meant.
            (escaped, previous) = (false, if matches!(c, 'n' | 't') { ' ' } else { c });
            continue;
        }
        match c {
            '\\' => escaped = true,
            '"' => inside = false,
            ' ' if previous != ' ' || run > 0 => {
                run += 1;
                if run >= 8 {
                    return true;
                }
            }
            _ => (previous, run) = (c, 0),
        }
    }
    false
}

fn is_spawn_allowed(path: &Path) -> bool {
    // Compare with `/` separators whatever the platform, as SPAWN_ALLOWED is written.
    let path: Vec<_> = path.components().map(|c| c.as_os_str().to_string_lossy()).collect();
    let path = path.join("/");
    SPAWN_ALLOWED.iter().any(|module| {
        path.strip_prefix(module).is_some_and(|rest| rest == ".rs" || rest.starts_with('/'))
    })
}
