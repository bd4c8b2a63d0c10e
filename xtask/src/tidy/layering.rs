//! The crate layering of DESIGN.md, checked against `cargo metadata`:
//!
//! 1. `toolmux-core` links no other workspace crate and no HTTP client, server or MCP SDK;
//! 2. a provider links no workspace crate but `toolmux-core` (its dev-dependencies may add
//!    `toolmux-test-support`);
//! 3. `toolmux-orchestrator` links no provider, agent or model crate;
//! 4. `toolmux-agent` links no provider;
//! 5. `toolmux-test-support` is only ever a dev-dependency.
//!
//! "Links" means normal dependencies, followed transitively through the resolved graph.
//! Each violation points at the manifest line of the dependency that leads to it.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use super::Violation;
use crate::metadata::{DepKind, Metadata, Package};
use crate::walk;

const CORE: &str = "toolmux-core";
const PROVIDERS: &[&str] = &["toolmux-fs", "toolmux-mcp", "toolmux-rest", "toolmux-external"];
const ORCHESTRATOR: &str = "toolmux-orchestrator";
const AGENT: &str = "toolmux-agent";
const LLM: &str = "toolmux-llm";
const TEST_SUPPORT: &str = "toolmux-test-support";
const CLI: &str = "toolmux-cli";

/// HTTP clients and servers, WebSocket clients and MCP SDKs: transports, which belong in
/// provider crates and never in the vocabulary.
const TRANSPORT_CRATES: &[&str] =
    &["reqwest", "hyper", "rmcp", "axum", "ureq", "isahc", "surf", "tokio-tungstenite"];

/// Crates the layering rules name and which must therefore exist (DESIGN.md crate map).
const REQUIRED: &[&str] = &[
    CORE,
    "toolmux-fs",
    "toolmux-mcp",
    "toolmux-rest",
    ORCHESTRATOR,
    AGENT,
    LLM,
    TEST_SUPPORT,
    CLI,
];

/// The `src/` directories of library crates, relative to `root`: every package under
/// `crates/` but the binary. Their tests, benches and examples are not library code.
pub(super) fn library_source_dirs(metadata: &Metadata) -> Vec<PathBuf> {
    metadata
        .workspace_packages()
        .filter(|p| p.name != CLI)
        .map(|p| walk::relative(&metadata.workspace_root, p.dir()))
        .filter(|dir| dir.starts_with("crates"))
        .map(|dir| dir.join("src"))
        .collect()
}

pub(super) fn check(metadata: &Metadata, violations: &mut Vec<Violation>) -> Result<()> {
    let mut checker = Checker { metadata, violations };
    checker.check_required();
    let members: HashSet<&str> = metadata.workspace_packages().map(|p| p.name.as_str()).collect();

    // 1. The vocabulary stays a vocabulary.
    checker.forbid_linking(CORE, "the vocabulary crate depends on no workspace crate", |name| {
        members.contains(name) && name != CORE
    })?;
    checker.forbid_linking(CORE, "the vocabulary crate knows no transport", |name| {
        TRANSPORT_CRATES.contains(&name)
    })?;

    // 2. Providers see only the vocabulary; their tests may use the test support.
    for &provider in PROVIDERS {
        checker.forbid_linking(provider, "a provider depends only on toolmux-core", |name| {
            members.contains(name) && name != CORE
        })?;
        checker.forbid_direct(provider, |dependency, kind| {
            if !members.contains(dependency) || dependency == CORE {
                return None;
            }
            match kind {
                // Checked transitively just above.
                DepKind::Normal => None,
                DepKind::Dev => (dependency != TEST_SUPPORT)
                    .then_some("a provider's tests may add only toolmux-test-support"),
                DepKind::Build => Some("a provider depends only on toolmux-core"),
            }
        })?;
    }

    // 3. The orchestrator receives providers at run time.
    checker.forbid_linking(
        ORCHESTRATOR,
        "the orchestrator receives providers as `Arc<dyn ToolProvider>` at run time",
        |name| PROVIDERS.contains(&name) || name == AGENT || name == LLM,
    )?;

    // 4. Agents are registered as providers at run time, not linked to them.
    checker.forbid_linking(AGENT, "an agent is given its tools at run time", |name| {
        PROVIDERS.contains(&name)
    })?;

    // 5. Test support never ships.
    for package in metadata.workspace_packages() {
        checker.forbid_direct(&package.name, |dependency, kind| {
            (dependency == TEST_SUPPORT && kind != DepKind::Dev)
                .then_some("toolmux-test-support is only ever a dev-dependency")
        })?;
    }
    Ok(())
}

struct Checker<'a> {
    metadata: &'a Metadata,
    violations: &'a mut Vec<Violation>,
}

impl Checker<'_> {
    fn check_required(&mut self) {
        for name in REQUIRED {
            if self.metadata.workspace_package(name).is_none() {
                self.violations.push(Violation {
                    path: "Cargo.toml".into(),
                    line: 1,
                    message: format!(
                        "the workspace has no package `{name}` (DESIGN.md crate map); if it was \
                         renamed, update xtask/src/tidy/layering.rs"
                    ),
                });
            }
        }
    }

    /// Reports every package `from` links, directly or not, that `forbidden` names.
    fn forbid_linking(
        &mut self,
        from: &str,
        why: &str,
        forbidden: impl Fn(&str) -> bool,
    ) -> Result<()> {
        let Some(package) = self.metadata.workspace_package(from) else { return Ok(()) };
        // A package reached along several paths is reported once, along the first found.
        let mut reported = BTreeSet::new();
        for (reached, chain) in self.metadata.normal_closure(package) {
            if !forbidden(&reached.name) || !reported.insert(reached.name.as_str()) {
                continue;
            }
            let first_hop = chain.get(1).copied().unwrap_or(&reached.name);
            let message = format!(
                "{from} must not depend on {} ({why}): {}",
                reached.name,
                chain.join(" -> ")
            );
            self.report(package, first_hop, DepKind::Normal, message)?;
        }
        Ok(())
    }

    /// Reports every dependency `from` declares for which `forbidden` gives a reason.
    fn forbid_direct(
        &mut self,
        from: &str,
        forbidden: impl Fn(&str, DepKind) -> Option<&'static str>,
    ) -> Result<()> {
        let Some(package) = self.metadata.workspace_package(from) else { return Ok(()) };
        for dependency in &package.dependencies {
            if let Some(why) = forbidden(&dependency.name, dependency.kind) {
                let message = format!(
                    "{from} must not have {} as a {} ({why})",
                    dependency.name,
                    match dependency.kind {
                        DepKind::Normal => "dependency",
                        DepKind::Dev => "dev-dependency",
                        DepKind::Build => "build-dependency",
                    },
                );
                self.report(package, dependency.key(), dependency.kind, message)?;
            }
        }
        Ok(())
    }

    fn report(
        &mut self,
        package: &Package,
        dependency_key: &str,
        kind: DepKind,
        message: String,
    ) -> Result<()> {
        let manifest = fs::read_to_string(&package.manifest_path)
            .with_context(|| format!("cannot read {}", package.manifest_path.display()))?;
        self.violations.push(Violation {
            path: walk::relative(&self.metadata.workspace_root, &package.manifest_path),
            line: manifest_line(&manifest, dependency_key, kind).unwrap_or(1),
            message,
        });
        Ok(())
    }
}

fn table_name(kind: DepKind) -> &'static str {
    match kind {
        DepKind::Normal => "dependencies",
        DepKind::Dev => "dev-dependencies",
        DepKind::Build => "build-dependencies",
    }
}

/// The 1-based line declaring dependency `key` of `kind` in a manifest's text: a
/// `key = ...` or `key.workspace = true` line in a `[dependencies]`-like table (target
/// tables included) or a `[dependencies.key]` header. A line scan is enough for the
/// manifests this workspace writes and keeps xtask free of a TOML parser.
pub(super) fn manifest_line(manifest: &str, key: &str, kind: DepKind) -> Option<usize> {
    let table = table_name(kind);
    let mut in_table = false;
    for (index, line) in manifest.lines().enumerate() {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']');
            let segments: Vec<&str> =
                header.split('.').map(|s| s.trim().trim_matches('"')).collect();
            let position = segments.iter().position(|s| *s == table);
            match position.map(|p| &segments[p + 1..]) {
                Some([]) => in_table = true,
                Some([name]) if *name == key => return Some(index + 1),
                _ => in_table = false,
            }
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or_default().trim_matches('"');
        if in_table && name == key {
            return Some(index + 1);
        }
    }
    None
}
