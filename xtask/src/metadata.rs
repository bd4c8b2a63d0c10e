//! The parts of `cargo metadata` that tidy and ci read: packages, their declared
//! dependencies and targets, and the resolved dependency graph.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::cmd;

/// What `cargo metadata --format-version 1` says about the workspace.
#[derive(Debug)]
pub(crate) struct Metadata {
    /// Workspace packages and, unless loaded with `--no-deps`, every dependency.
    pub(crate) packages: Vec<Package>,
    /// As cargo spells it: paths in the metadata are relative to this, not to however
    /// the caller spelled the root.
    pub(crate) workspace_root: PathBuf,
    /// Where the workspace builds, wherever configuration or `CARGO_TARGET_DIR` puts it.
    pub(crate) target_directory: PathBuf,
    workspace_members: HashSet<String>,
    /// Package id to its resolved dependencies; empty with `--no-deps`.
    resolve: HashMap<String, Vec<Edge>>,
}

#[derive(Debug)]
pub(crate) struct Package {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) manifest_path: PathBuf,
    pub(crate) dependencies: Vec<Dependency>,
    /// The kinds of every target (`lib`, `bin`, `test`, `bench`, ...).
    pub(crate) target_kinds: Vec<String>,
}

/// A dependency as declared in a manifest.
#[derive(Debug)]
pub(crate) struct Dependency {
    /// The depended-on package's name.
    pub(crate) name: String,
    /// The key in the manifest when it differs from the package name.
    pub(crate) rename: Option<String>,
    pub(crate) kind: DepKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DepKind {
    Normal,
    Dev,
    Build,
}

/// One resolved dependency edge.
#[derive(Debug)]
struct Edge {
    package_id: String,
    kinds: Vec<DepKind>,
}

impl Metadata {
    /// Runs `cargo metadata` in `root`; `no_deps` skips resolution (fast, offline).
    pub(crate) fn load(root: &Path, no_deps: bool) -> Result<Self> {
        let mut command = cmd::command("cargo");
        command.current_dir(root).args(["metadata", "--format-version", "1"]);
        if no_deps {
            command.arg("--no-deps");
        }
        let json = cmd::stdout(&mut command)?;
        Self::parse(&json).context("cannot read the output of `cargo metadata`")
    }

    fn parse(json: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(json)?;
        let packages =
            array(&value, "packages")?.iter().map(Package::parse).collect::<Result<Vec<_>>>()?;
        let workspace_members = array(&value, "workspace_members")?
            .iter()
            .map(|id| id.as_str().map(str::to_owned).context("workspace member id is no string"))
            .collect::<Result<_>>()?;
        let mut resolve = HashMap::new();
        if let Some(nodes) = value.get("resolve").and_then(|r| r.get("nodes")) {
            for node in nodes.as_array().context("`resolve.nodes` is no array")? {
                let edges = array(node, "deps")?.iter().map(Edge::parse).collect::<Result<_>>()?;
                resolve.insert(string(node, "id")?, edges);
            }
        }
        let workspace_root = string(&value, "workspace_root")?.into();
        let target_directory = string(&value, "target_directory")?.into();
        Ok(Self { packages, workspace_root, target_directory, workspace_members, resolve })
    }

    /// The workspace's own packages.
    pub(crate) fn workspace_packages(&self) -> impl Iterator<Item = &Package> {
        self.packages.iter().filter(|p| self.workspace_members.contains(&p.id))
    }

    pub(crate) fn workspace_package(&self, name: &str) -> Option<&Package> {
        self.workspace_packages().find(|p| p.name == name)
    }

    /// Every package reachable from `from` over normal (linked) dependency edges,
    /// excluding `from`, each with the chain of package names that leads to it.
    ///
    /// The resolve is the workspace's, so features other members enable are counted:
    /// this errs on the strict side, which is what a layering check wants.
    pub(crate) fn normal_closure<'a>(
        &'a self,
        from: &'a Package,
    ) -> Vec<(&'a Package, Vec<&'a str>)> {
        let by_id: HashMap<&str, &Package> =
            self.packages.iter().map(|p| (p.id.as_str(), p)).collect();
        let mut parent: HashMap<&str, &str> = HashMap::new();
        let mut queue = VecDeque::from([from.id.as_str()]);
        let mut reached = Vec::new();
        while let Some(id) = queue.pop_front() {
            for edge in self.resolve.get(id).into_iter().flatten() {
                let next = edge.package_id.as_str();
                let linked = edge.kinds.contains(&DepKind::Normal);
                if !linked || next == from.id || parent.contains_key(next) {
                    continue;
                }
                parent.insert(next, id);
                queue.push_back(next);
                if let Some(package) = by_id.get(next) {
                    reached.push(*package);
                }
            }
        }
        reached
            .into_iter()
            .map(|package| {
                let mut chain = vec![package.name.as_str()];
                let mut id = package.id.as_str();
                while let Some(&up) = parent.get(id) {
                    chain.push(by_id.get(up).map_or(up, |p| p.name.as_str()));
                    id = up;
                }
                chain.reverse();
                (package, chain)
            })
            .collect()
    }
}

impl Package {
    fn parse(value: &Value) -> Result<Self> {
        let name = string(value, "name")?;
        let parse = || -> Result<Self> {
            let dependencies = array(value, "dependencies")?
                .iter()
                .map(Dependency::parse)
                .collect::<Result<_>>()?;
            let mut target_kinds = Vec::new();
            for target in array(value, "targets")? {
                for kind in array(target, "kind")? {
                    target_kinds
                        .push(kind.as_str().context("target kind is no string")?.to_owned());
                }
            }
            Ok(Self {
                id: string(value, "id")?,
                name: name.clone(),
                manifest_path: string(value, "manifest_path")?.into(),
                dependencies,
                target_kinds,
            })
        };
        parse().with_context(|| format!("in package `{name}`"))
    }

    /// The directory holding the package's `Cargo.toml`.
    pub(crate) fn dir(&self) -> &Path {
        self.manifest_path.parent().unwrap_or(Path::new("."))
    }
}

impl Dependency {
    fn parse(value: &Value) -> Result<Self> {
        Ok(Self {
            name: string(value, "name")?,
            rename: value.get("rename").and_then(Value::as_str).map(str::to_owned),
            kind: DepKind::parse(value.get("kind"))?,
        })
    }

    /// The key naming this dependency in the manifest.
    pub(crate) fn key(&self) -> &str {
        self.rename.as_deref().unwrap_or(&self.name)
    }
}

impl DepKind {
    fn parse(kind: Option<&Value>) -> Result<Self> {
        match kind.and_then(Value::as_str) {
            None => Ok(Self::Normal),
            Some("dev") => Ok(Self::Dev),
            Some("build") => Ok(Self::Build),
            Some(other) => anyhow::bail!("unknown dependency kind `{other}`"),
        }
    }
}

impl Edge {
    fn parse(value: &Value) -> Result<Self> {
        let kinds = array(value, "dep_kinds")?
            .iter()
            .map(|k| DepKind::parse(k.get("kind")))
            .collect::<Result<_>>()?;
        Ok(Self { package_id: string(value, "pkg")?, kinds })
    }
}

fn array<'a>(value: &'a Value, key: &str) -> Result<&'a Vec<Value>> {
    value.get(key).and_then(Value::as_array).with_context(|| format!("`{key}` is no array"))
}

fn string(value: &Value, key: &str) -> Result<String> {
    value
        .get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .with_context(|| format!("`{key}` is no string"))
}
