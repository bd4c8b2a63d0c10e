//! The `tidy` test, which holds the workspace to the checks, and tests of the checks.

use std::path::Path;

use super::layering::manifest_line;
use super::sources::{
    SPAWN_ALLOWED, check_doc_line, check_forbidden, check_library, has_spaced_string,
};
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

/// A message broken over two lines without a `\` keeps the next line's indentation.
#[test]
fn runs_of_spaces_inside_strings_are_found() {
    let broken = r#"    "the most kept (1000, the spaces'                      `max_spaces`)","#;
    assert!(has_spaced_string(broken));
    for fine in [
        r#"    "the most kept (1000, the spaces' \"#,
        r#"let text = "def f():\n        return 1\n";"#,
        r#"let table = "      indented from its start";"#,
        r#"assert_eq!(a, b);      // aligned, outside a string"#,
        r#"let quoted = "say \"hi\"     there";"#,
        r#"let header = "Num       RefCount Protocol";"#,
        r###"let raw = r#""é \" \\ \n         x""#;"###,
    ] {
        assert!(!has_spaced_string(fine), "{fine}");
    }
    let mut violations = Vec::new();
    let text = format!("//! A library module.\n{broken}\n");
    check_library(Path::new("crates/toolmux-rest/src/lib.rs"), &text, &mut violations);
    assert_eq!(violations.iter().map(|v| v.line).collect::<Vec<_>>(), [2]);
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

/// Writes `files` (path, content) beneath a fresh scratch directory and returns it.
fn scratch_workspace(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let root = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (path, content) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    root
}

fn manifest(name: &str, dependencies: &str) -> String {
    format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n{dependencies}")
}

/// A small workspace that breaks every rule once, and the report tidy gives on it.
#[test]
fn every_rule_is_checked_on_a_broken_workspace() {
    let core = manifest(
        "toolmux-core",
        "\n[dependencies]\nhttp-client = { path = \"../../vendor/http-client\" }\n",
    );
    let fs = manifest(
        "toolmux-fs",
        "\n[dependencies]\ntoolmux-core = { path = \"../toolmux-core\" }\n\
         toolmux-mcp = { path = \"../toolmux-mcp\" }\n\n[dev-dependencies]\n\
         toolmux-orchestrator = { path = \"../toolmux-orchestrator\" }\n",
    );
    let mcp = manifest(
        "toolmux-mcp",
        "\n[dependencies]\ntoolmux-core = { path = \"../toolmux-core\" }\n\n[dev-dependencies]\n\
         toolmux-test-support = { path = \"../toolmux-test-support\" }\n",
    );
    let rest = manifest(
        "toolmux-rest",
        "\n[dependencies]\ntoolmux-core = { path = \"../toolmux-core\" }\n\
         toolmux-test-support = { path = \"../toolmux-test-support\" }\n",
    );
    let orchestrator = manifest(
        "toolmux-orchestrator",
        "\n[dependencies]\ntoolmux-core = { path = \"../toolmux-core\" }\n\
         toolmux-fs = { path = \"../toolmux-fs\" }\n",
    );
    let agent = manifest(
        "toolmux-agent",
        "\n[dependencies]\ntoolmux-rest = { path = \"../toolmux-rest\" }\n",
    );
    let test_support = manifest(
        "toolmux-test-support",
        "\n[dependencies]\ntoolmux-core = { path = \"../toolmux-core\" }\n",
    );
    let http_client =
        manifest("http-client", "\n[dependencies]\nhyper = { path = \"../hyper\" }\n");
    let lib = "//! A crate.\n";
    let spawn = concat!("//! Runs bash.\nfn f() { Command::", "new(\"bash\"); }\n");
    let current_dir = concat!("//! Resolves.\nfn f() { std::env::current", "_dir(); }\n");
    let root = scratch_workspace(
        "tidy-broken",
        &[
            (
                "Cargo.toml",
                "[workspace]\nresolver = \"3\"\nmembers = [\"crates/*\"]\nexclude = [\"vendor\"]\n",
            ),
            ("crates/toolmux-core/Cargo.toml", &core),
            ("crates/toolmux-core/src/lib.rs", lib),
            ("crates/toolmux-fs/Cargo.toml", &fs),
            ("crates/toolmux-fs/src/lib.rs", "mod tools;\n"),
            ("crates/toolmux-fs/src/tools/shell.rs", spawn),
            ("crates/toolmux-mcp/Cargo.toml", &mcp),
            ("crates/toolmux-mcp/src/lib.rs", spawn),
            ("crates/toolmux-rest/Cargo.toml", &rest),
            ("crates/toolmux-rest/src/lib.rs", current_dir),
            ("crates/toolmux-orchestrator/Cargo.toml", &orchestrator),
            ("crates/toolmux-orchestrator/src/lib.rs", lib),
            ("crates/toolmux-agent/Cargo.toml", &agent),
            ("crates/toolmux-agent/src/lib.rs", lib),
            ("crates/toolmux-llm/Cargo.toml", &manifest("toolmux-llm", "")),
            ("crates/toolmux-llm/src/lib.rs", lib),
            ("crates/toolmux-test-support/Cargo.toml", &test_support),
            ("crates/toolmux-test-support/src/lib.rs", lib),
            ("crates/toolmux-cli/Cargo.toml", &manifest("toolmux-cli", "")),
            ("crates/toolmux-cli/src/main.rs", spawn),
            ("vendor/http-client/Cargo.toml", &http_client),
            ("vendor/http-client/src/lib.rs", lib),
            ("vendor/hyper/Cargo.toml", &manifest("hyper", "")),
            ("vendor/hyper/src/lib.rs", lib),
        ],
    );
    let report = lines(&super::check(&root).unwrap());
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(
        report,
        [
            "crates/toolmux-fs/src/lib.rs:1: file does not start with a `//!` line saying what it is for",
            concat!(
                "crates/toolmux-mcp/src/lib.rs:2: `Command::",
                "new` in a library outside the modules ",
                "that must spawn; if this one must, add it to SPAWN_ALLOWED in xtask/src/tidy/sources.rs"
            ),
            concat!(
                "crates/toolmux-rest/src/lib.rs:2: `env::",
                "current_dir` in a library: resolve paths ",
                "against a directory the caller passes in (DESIGN.md invariant 6)"
            ),
            "crates/toolmux-core/Cargo.toml:7: toolmux-core must not depend on hyper (the vocabulary crate knows no transport): toolmux-core -> http-client -> hyper",
            "crates/toolmux-fs/Cargo.toml:8: toolmux-fs must not depend on toolmux-mcp (a provider depends only on toolmux-core): toolmux-fs -> toolmux-mcp",
            "crates/toolmux-fs/Cargo.toml:11: toolmux-fs must not have toolmux-orchestrator as a dev-dependency (a provider's tests may add only toolmux-test-support)",
            "crates/toolmux-rest/Cargo.toml:8: toolmux-rest must not depend on toolmux-test-support (a provider depends only on toolmux-core): toolmux-rest -> toolmux-test-support",
            "crates/toolmux-orchestrator/Cargo.toml:8: toolmux-orchestrator must not depend on toolmux-fs (the orchestrator receives providers as `Arc<dyn ToolProvider>` at run time): toolmux-orchestrator -> toolmux-fs",
            "crates/toolmux-orchestrator/Cargo.toml:8: toolmux-orchestrator must not depend on toolmux-mcp (the orchestrator receives providers as `Arc<dyn ToolProvider>` at run time): toolmux-orchestrator -> toolmux-fs -> toolmux-mcp",
            "crates/toolmux-agent/Cargo.toml:7: toolmux-agent must not depend on toolmux-rest (an agent is given its tools at run time): toolmux-agent -> toolmux-rest",
            "crates/toolmux-rest/Cargo.toml:8: toolmux-rest must not have toolmux-test-support as a dependency (toolmux-test-support is only ever a dev-dependency)",
        ]
    );
}
