//! The `tidy` test, which holds the workspace to the checks, and tests of the checks.

use std::path::Path;

use super::layering::manifest_line;
use super::sources::{SPAWN_ALLOWED, check_doc_line, check_forbidden, check_library};
use super::{Violation, run};
use crate::metadata::DepKind;
use crate::project_root;

/// `cargo test --workspace` fails while the workspace breaks a house rule.
#[test]
fn tidy() {
    if let Err(error) = run(&project_root()) {
        panic!("{error:#}");
    }
}

fn lines(violations: &[Violation]) -> Vec<String> {
    violations.iter().map(ToString::to_string).collect()
}

#[test]
fn doc_line_is_required_first() {
    let mut violations = Vec::new();
    check_doc_line(Path::new("a.rs"), "//! What a is for.\nfn a() {}\n", &mut violations);
    check_doc_line(Path::new("b.rs"), "\n//! Too late.\n", &mut violations);
    check_doc_line(Path::new("c.rs"), "/// Item docs, not module docs.\n", &mut violations);
    check_doc_line(Path::new("d.rs"), "", &mut violations);
    assert_eq!(
        lines(&violations),
        [
            "b.rs:1: file does not start with a `//!` line saying what it is for",
            "c.rs:1: file does not start with a `//!` line saying what it is for",
            "d.rs:1: file does not start with a `//!` line saying what it is for",
        ]
    );
}

#[test]
fn forbidden_strings_are_reported_per_line() {
    let text = [
        "//! Tests.",
        concat!("#[ig", "nore]"),
        concat!("#[ig", "nore = \"slow\"]"),
        concat!("#[should", "_panic(expected = \"boom\")]"),
        concat!("fn f() { to", "do!() }"),
        concat!("let x = db", "g!(1);"),
        "// ignore this, should panic, todo, dbg: words are fine",
    ]
    .join("\n");
    let mut violations = Vec::new();
    check_forbidden(Path::new("t.rs"), &text, &mut violations);
    let found: Vec<usize> = violations.iter().map(|v| v.line).collect();
    assert_eq!(found, [2, 3, 4, 5, 6]);
}

#[test]
fn libraries_neither_read_the_current_directory_nor_spawn() {
    let text = [
        "//! A library module.",
        concat!("let here = std::env::current", "_dir()?;"),
        concat!("let child = tokio::process::Command::", "new(\"sh\");"),
        "command.current_dir(root);",
    ]
    .join("\n");
    let mut violations = Vec::new();
    check_library(Path::new("crates/toolmux-rest/src/lib.rs"), &text, &mut violations);
    let found: Vec<usize> = violations.iter().map(|v| v.line).collect();
    assert_eq!(found, [2, 3]);
}

#[test]
fn spawning_is_allowed_only_in_listed_modules() {
    let text = concat!("//! Spawns.\nlet child = Command::", "new(program);\n");
    let allowed = SPAWN_ALLOWED[0];
    for path in [format!("{allowed}.rs"), format!("{allowed}/group.rs")] {
        let mut violations = Vec::new();
        check_library(Path::new(&path), text, &mut violations);
        assert_eq!(violations, [], "{path}");
    }
    for path in [format!("{allowed}_helpers.rs"), "crates/toolmux-fs/src/lib.rs".to_owned()] {
        let mut violations = Vec::new();
        check_library(Path::new(&path), text, &mut violations);
        assert_eq!(violations.len(), 1, "{path}");
    }
}

#[test]
fn manifest_lines_of_dependencies() {
    let manifest = r#"[package]
name = "toolmux-fs"

[dependencies]
serde.workspace = true
toolmux-core = { workspace = true }

[dev-dependencies]
toolmux-core.workspace = true

[target.'cfg(unix)'.build-dependencies]
cc = "1"

[dependencies.toolmux-orchestrator]
workspace = true
"#;
    assert_eq!(manifest_line(manifest, "toolmux-core", DepKind::Normal), Some(6));
    assert_eq!(manifest_line(manifest, "toolmux-core", DepKind::Dev), Some(9));
    assert_eq!(manifest_line(manifest, "cc", DepKind::Build), Some(12));
    assert_eq!(manifest_line(manifest, "toolmux-orchestrator", DepKind::Normal), Some(14));
    assert_eq!(manifest_line(manifest, "name", DepKind::Normal), None);
    assert_eq!(manifest_line(manifest, "cc", DepKind::Normal), None);
}
