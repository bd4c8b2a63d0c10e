//! `toolsAllowed` / `toolsDenied`: globs over a server's own tool names; deny wins.

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::McpError;

/// Which of a server's tools are offered.
#[derive(Debug, Clone)]
pub(crate) struct ToolFilter {
    allowed: Option<GlobSet>,
    denied: GlobSet,
}

impl ToolFilter {
    pub(crate) fn new(
        server: &str,
        allowed: Option<&[String]>,
        denied: &[String],
    ) -> Result<ToolFilter, McpError> {
        Ok(ToolFilter {
            allowed: allowed.map(|globs| build(server, "toolsAllowed", globs)).transpose()?,
            denied: build(server, "toolsDenied", denied)?,
        })
    }

    /// Whether `tool` (the server's own name) is offered. Checked on every call, so the
    /// usual case of no lists at all costs no glob matching (which builds a path candidate).
    pub(crate) fn allows(&self, tool: &str) -> bool {
        let denied = !self.denied.is_empty() && self.denied.is_match(tool);
        !denied && self.allowed.as_ref().is_none_or(|a| a.is_match(tool))
    }
}

fn build(server: &str, key: &str, globs: &[String]) -> Result<GlobSet, McpError> {
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        let glob = Glob::new(glob).map_err(|e| McpError::Config {
            server: server.to_owned(),
            message: format!("`{key}` glob `{glob}`: {e}"),
        })?;
        builder.add(glob);
    }
    builder.build().map_err(|e| McpError::Config {
        server: server.to_owned(),
        message: format!("`{key}`: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(globs: &[&str]) -> Vec<String> {
        globs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn deny_wins_over_allow() {
        let allowed = strings(&["get-*", "echo"]);
        let filter = ToolFilter::new("s", Some(&allowed), &strings(&["get-env"])).unwrap();
        assert!(filter.allows("echo"));
        assert!(filter.allows("get-sum"));
        assert!(!filter.allows("get-env"));
        assert!(!filter.allows("toggle"));
    }

    #[test]
    fn no_allow_list_allows_all_but_denied() {
        let filter = ToolFilter::new("s", None, &strings(&["*delete*"])).unwrap();
        assert!(filter.allows("read"));
        assert!(!filter.allows("repo_delete_all"));
    }

    #[test]
    fn bad_glob_is_a_config_error() {
        let err = ToolFilter::new("s", None, &strings(&["a[b"])).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("mcp server `s`: invalid configuration: `toolsDenied` glob `a[b`"),
            "{err}"
        );
    }
}
