//! Protected paths: what the file tools refuse to change, or even read, inside the root.
//!
//! An agent allowed to write beneath the root could otherwise rewrite what decides what it
//! may do (toolmux's configuration, which `serve --watch` loads live; git's hooks and
//! config, which run commands), the record of what it did (the audit log, the statistics),
//! or read other runs' spilled outputs around the output store's per-run check. Every
//! check is made on the path with symlinks and `..` resolved, so no spelling of a path
//! reaches around it. The shell tools' sandbox (`crate::sandbox`) keeps `.git` and these
//! paths read-only to commands, and hides those the file tools may not read, where the
//! kernel allows (a mount namespace per command), and so what the `protect` and `hide`
//! globs match (`crate::sandbox` finds it before a command starts).

use crate::error::FsError;
use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// What a path of the embedding program is, which says why the file tools leave it alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProtectedKind {
    /// A configuration file the program loads (or would load), or a file it names whose
    /// content ends up in what the program runs (an MCP server's `envFile`): not to be
    /// changed.
    Configuration,
    /// The audit log: neither read nor changed.
    AuditLog,
    /// The statistics file: not to be changed.
    Statistics,
    /// The directory of spilled outputs, with everything in it: neither read nor changed.
    OutputDir,
    /// The folder of spaces and agents' goals, memories and plans, with everything in it:
    /// neither read nor changed (through the gateway's tools only, which keep key holders
    /// apart and every agent to its own state).
    Spaces,
    /// Another program's configuration that runs commands, outside any sandbox, when that
    /// program next starts in the project: a coding agent's hooks and MCP servers, an
    /// editor's tasks ([`AGENT_FILES`]). Read, not changed.
    AgentConfig,
}

impl ProtectedKind {
    /// Whether the file tools may read it.
    pub(crate) fn readable(self) -> bool {
        matches!(
            self,
            ProtectedKind::Configuration | ProtectedKind::Statistics | ProtectedKind::AgentConfig
        )
    }
}

/// Files beneath the root that other programs run commands from when they next start there,
/// outside toolmux's sandbox: Claude Code's settings (hooks) and project MCP servers,
/// Cursor's, VS Code's and Gemini CLI's MCP servers and hooks, VS Code's tasks (which may
/// run on opening the folder), Codex's configuration. A command of an agent that could
/// write them would run unconfined at the user's next start ([`FsConfig::protect_agent_files`]).
///
/// [`FsConfig::protect_agent_files`]: crate::FsConfig::protect_agent_files
pub const AGENT_FILES: [&str; 10] = [
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".mcp.json",
    ".cursor/mcp.json",
    ".cursor/hooks.json",
    ".vscode/mcp.json",
    ".vscode/tasks.json",
    ".codex/config.toml",
    ".gemini/settings.json",
    ".zed/settings.json",
];

/// A path the file tools must leave alone, given by the program embedding them (the
/// `toolmux` facade passes its configuration file, audit log, statistics file and output
/// directory). Paths outside the root need no protection and are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProtectedPath {
    /// The path, absolute (or relative to the root); it need not exist yet.
    pub path: PathBuf,
    /// What it is.
    pub kind: ProtectedKind,
}

impl ProtectedPath {
    /// `path` protected as `kind`.
    pub fn new(path: impl Into<PathBuf>, kind: ProtectedKind) -> Self {
        ProtectedPath { path: path.into(), kind }
    }
}

/// What a file tool is about to do with a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// The protected set of one workspace, with paths relative to the canonical root.
#[derive(Debug)]
pub(crate) struct Protection {
    /// The program's paths, relative to the root, symlinks resolved.
    paths: Vec<(PathBuf, ProtectedKind)>,
    /// The user's `protect` globs, matched as `.gitignore` lines relative to the root.
    /// Shared with the sandbox, which finds what they match for commands.
    globs: Arc<Gitignore>,
    /// The user's `hide` globs: neither read, listed nor changed. Shared with the walkers'
    /// filters, which run on other threads.
    hidden: Arc<Gitignore>,
}

/// Why a path is protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reason {
    Git,
    Program(ProtectedKind),
    Glob(String),
    Hidden(String),
}

impl Default for Protection {
    /// Nothing but `.git` directories.
    fn default() -> Self {
        Protection {
            paths: Vec::new(),
            globs: Arc::new(Gitignore::empty()),
            hidden: Arc::new(Gitignore::empty()),
        }
    }
}

impl Protection {
    /// The protected set beneath `root` (canonical, absolute).
    pub fn new(
        root: &Path,
        protected: &[ProtectedPath],
        globs: &[String],
    ) -> Result<Protection, FsError> {
        let paths = protected
            .iter()
            .filter_map(|p| {
                let absolute = root.join(&p.path);
                let relative = resolve_ambient(&absolute).strip_prefix(root).ok()?.to_path_buf();
                // A protected path that is the root itself (or holds it) would shut every
                // file tool; it is left out rather than taken to mean "everything".
                (!relative.as_os_str().is_empty()).then_some((relative, p.kind))
            })
            .collect();
        let globs = Arc::new(gitignore(root, globs, "protect")?);
        Ok(Protection { paths, globs, hidden: Arc::new(Gitignore::empty()) })
    }

    /// The same, with the `hide` globs: paths neither read, listed nor changed.
    pub fn with_hidden(mut self, root: &Path, globs: &[String]) -> Result<Protection, FsError> {
        self.hidden = Arc::new(gitignore(root, globs, "hide")?);
        Ok(self)
    }

    /// Why `relative` (relative to the root, symlinks resolved) may not be accessed so,
    /// or `None` when it may.
    pub fn check(&self, relative: &Path, access: Access) -> Option<Reason> {
        for (path, kind) in &self.paths {
            let hit = match kind {
                ProtectedKind::OutputDir | ProtectedKind::Spaces => relative.starts_with(path),
                _ => relative == path,
            };
            if hit && (access == Access::Write || !kind.readable()) {
                return Some(Reason::Program(*kind));
            }
        }
        if let Some(glob) = self.hidden_by(relative) {
            return Some(Reason::Hidden(glob));
        }
        if access == Access::Read {
            return None;
        }
        // Every `.git`, not only the root's: a nested repository's or a submodule's hooks
        // run as surely. Case is ignored for case-insensitive file systems.
        let in_git = relative.components().any(|c| match c {
            Component::Normal(name) => name.eq_ignore_ascii_case(".git"),
            _ => false,
        });
        if in_git {
            return Some(Reason::Git);
        }
        if relative.has_root() {
            return None;
        }
        match self.globs.matched_path_or_any_parents(relative, false) {
            Match::Ignore(glob) => Some(Reason::Glob(glob.original().to_owned())),
            Match::None | Match::Whitelist(_) => None,
        }
    }

    /// Whether `relative` lies in a path no tool may read (for walkers to skip).
    pub fn unreadable(&self, relative: &Path) -> bool {
        self.check(relative, Access::Read).is_some()
    }

    /// Whether `relative` lies in a path kept from agents (`hide`): not even listed.
    pub fn hidden(&self, relative: &Path) -> bool {
        self.hidden_by(relative).is_some()
    }

    /// The `hide` glob `relative` matches, itself or by a directory above it. Whether it
    /// is a directory is not asked: a `secrets/` line hides a file named so too.
    fn hidden_by(&self, relative: &Path) -> Option<String> {
        let relative = relative.strip_prefix(".").unwrap_or(relative);
        if relative.as_os_str().is_empty() || relative.has_root() {
            return None;
        }
        [false, true].into_iter().find_map(|dir| {
            match self.hidden.matched_path_or_any_parents(relative, dir) {
                Match::Ignore(glob) => Some(glob.original().to_owned()),
                Match::None | Match::Whitelist(_) => None,
            }
        })
    }

    /// The `hide` globs, for walkers that filter entries on other threads.
    pub fn hidden_globs(&self) -> &Arc<Gitignore> {
        &self.hidden
    }

    /// The `protect` globs, for the sandbox to find what they match for commands.
    pub fn protect_globs(&self) -> &Arc<Gitignore> {
        &self.globs
    }
}

impl Reason {
    /// Why the path is refused and what to do instead, for the error message.
    pub fn explain(&self, access: Access) -> String {
        match self {
            Reason::Git => "it is inside a git directory (`.git`), whose hooks and config can \
                            run commands: agents may not change it; use git commands for git \
                            work, or ask the user to make this change"
                .to_owned(),
            Reason::Program(ProtectedKind::Configuration) => {
                "it is a configuration file toolmux loads: agents may not change it; ask the \
                 user to edit it"
                    .to_owned()
            }
            Reason::Program(ProtectedKind::AgentConfig) => {
                "it is the configuration of a coding agent or editor, which runs its hooks, \
                 tasks or MCP servers outside any sandbox when it next starts here: agents may \
                 not change it; ask the user to make this change (or to set \
                 `fs.protectAgentFiles: false`)"
                    .to_owned()
            }
            Reason::Program(ProtectedKind::AuditLog) => {
                "it is toolmux's audit log: agents may not read or change it".to_owned()
            }
            Reason::Program(ProtectedKind::Statistics) => {
                "it is toolmux's statistics file: agents may not change it".to_owned()
            }
            Reason::Program(ProtectedKind::OutputDir) => {
                let verb = if access == Access::Read { "read" } else { "change" };
                format!(
                    "it is in toolmux's output directory: agents may not {verb} it directly; \
                     read a spilled output with `output__read` and the handle it came with"
                )
            }
            Reason::Program(ProtectedKind::Spaces) => {
                let verb = if access == Access::Read { "read" } else { "change" };
                format!(
                    "it is in toolmux's spaces folder: agents may not {verb} it directly; use \
                     the `gateway__*` tools (`gateway__read_messages`, `gateway__set_goals`, ...)"
                )
            }
            Reason::Hidden(glob) => format!(
                "it matches `{glob}`, a path kept from agents (`fs.hide`, or a \
                 `permissions.deny` rule on reading it): agents may not read or change it"
            ),
            Reason::Glob(glob) => format!(
                "it matches the fs `protect` pattern `{glob}`: agents may not change it; ask \
                 the user to make this change (or to take the pattern out of `fs.protect`)"
            ),
        }
    }
}

/// `globs` as `.gitignore` lines relative to `root`; `key` names the setting in errors.
fn gitignore(root: &Path, globs: &[String], key: &str) -> Result<Gitignore, FsError> {
    let mut builder = GitignoreBuilder::new(root);
    for glob in globs {
        builder.add_line(None, glob).map_err(|e| FsError::Config {
            message: format!(
                "`{key}` pattern `{glob}` is not a valid glob: {e}; write it as a \
                 .gitignore line relative to the root, such as `**/.env` or `secrets/`"
            ),
        })?;
    }
    builder.build().map_err(|e| FsError::Config {
        message: format!("`{key}` patterns are not valid globs: {e}"),
    })
}

/// `absolute` with symlinks resolved as far as it exists, and the rest (not yet created,
/// so free of symlinks) with `.` and `..` resolved by hand.
pub(crate) fn resolve_ambient(absolute: &Path) -> PathBuf {
    let parts: Vec<Component<'_>> = absolute.components().collect();
    for keep in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..keep].iter().collect();
        if let Ok(base) = std::fs::canonicalize(&prefix) {
            return append_lexically(base, &parts[keep..]);
        }
    }
    append_lexically(PathBuf::new(), &parts)
}

/// `base` followed by `rest`, where `rest` names nothing on disk: `.` is dropped and `..`
/// takes the last component off.
pub(crate) fn append_lexically(mut base: PathBuf, rest: &[Component<'_>]) -> PathBuf {
    for part in rest {
        match part {
            Component::ParentDir => {
                let above = matches!(base.components().next_back(), Some(Component::ParentDir));
                if (above || !base.pop()) && !base.has_root() {
                    base.push("..");
                }
            }
            Component::CurDir => {}
            other => base.push(other),
        }
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protection(globs: &[&str]) -> (tempfile::TempDir, Protection) {
        let temp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(temp.path()).unwrap();
        let protected = [
            ProtectedPath::new(root.join("toolmux.yaml"), ProtectedKind::Configuration),
            ProtectedPath::new(root.join(".toolmux/audit.jsonl"), ProtectedKind::AuditLog),
            ProtectedPath::new(root.join("out/x/../outputs"), ProtectedKind::OutputDir),
            ProtectedPath::new("/elsewhere/stats.json", ProtectedKind::Statistics),
        ];
        let globs: Vec<String> = globs.iter().map(|g| (*g).to_owned()).collect();
        let protection = Protection::new(&root, &protected, &globs).unwrap();
        (temp, protection)
    }

    #[test]
    fn program_paths_by_access() {
        let (_temp, p) = protection(&[]);
        let check = |path: &str, access| p.check(Path::new(path), access);
        let config = Some(Reason::Program(ProtectedKind::Configuration));
        assert_eq!(check("toolmux.yaml", Access::Write), config);
        assert_eq!(check("toolmux.yaml", Access::Read), None);
        let audit = Some(Reason::Program(ProtectedKind::AuditLog));
        assert_eq!(check(".toolmux/audit.jsonl", Access::Read), audit);
        assert_eq!(check(".toolmux/other", Access::Write), None);
        let out = Some(Reason::Program(ProtectedKind::OutputDir));
        assert_eq!(check("out/outputs/run-1/a.txt", Access::Read), out);
        assert_eq!(check("out/outputs", Access::Write), out);
        assert_eq!(check("out/outputs2", Access::Read), None);
        assert_eq!(check("stats.json", Access::Write), None);
    }

    #[test]
    fn git_directories_at_any_depth() {
        let (_temp, p) = protection(&[]);
        for path in [".git", ".git/hooks/pre-commit", "vendor/lib/.git/config", ".GIT/config"] {
            assert_eq!(p.check(Path::new(path), Access::Write), Some(Reason::Git), "{path}");
            assert_eq!(p.check(Path::new(path), Access::Read), None, "{path}");
        }
        assert_eq!(p.check(Path::new(".gitignore"), Access::Write), None);
    }

    #[test]
    fn globs_are_gitignore_lines() {
        let (_temp, p) = protection(&["**/.env", "secrets/", "*.pem", "!public.pem"]);
        let glob = |g: &str| Some(Reason::Glob(g.to_owned()));
        assert_eq!(p.check(Path::new("a/b/.env"), Access::Write), glob("**/.env"));
        assert_eq!(p.check(Path::new("secrets/k/v"), Access::Write), glob("secrets/"));
        assert_eq!(p.check(Path::new("certs/key.pem"), Access::Write), glob("*.pem"));
        assert_eq!(p.check(Path::new("certs/public.pem"), Access::Write), None);
        assert_eq!(p.check(Path::new("a/b/.env"), Access::Read), None);
        assert_eq!(p.check(Path::new("a/env"), Access::Write), None);
    }

    #[test]
    fn invalid_globs_are_a_config_error() {
        let temp = tempfile::tempdir().unwrap();
        let err = Protection::new(temp.path(), &[], &["a/{b".to_owned()]).unwrap_err();
        assert!(err.to_string().contains("`protect` pattern `a/{b` is not a valid glob"), "{err}");
    }

    #[test]
    fn lexical_tail() {
        let tail: Vec<Component<'_>> = Path::new("x/./../y").components().collect();
        assert_eq!(append_lexically(PathBuf::from("a"), &tail), Path::new("a/y"));
        let up: Vec<Component<'_>> = Path::new("../..").components().collect();
        assert_eq!(append_lexically(PathBuf::from("a"), &up), Path::new(".."));
    }
}
