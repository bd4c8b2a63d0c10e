//! A small glob matcher for tool names: `*` matches any run of characters, `?` one.
//!
//! Tool names are ASCII-ish identifiers, so a twenty-line matcher beats a crate.

/// Whether `name` matches `pattern`.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    // Position of the last `*` in the pattern and the name index it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether `path` (relative to a root, `/`-separated, `.` for the root) or a directory
/// above it matches `pattern`, a `.gitignore`-style line: a pattern with no `/` but a
/// trailing one matches a name at any depth (`.env`, `*.pem`), one with a `/` is anchored
/// at the root (`src/**`, `/build`); `*` and `?` stay within a name, `**` spans any number
/// of them; `*` or `**` alone matches everything, the root included.
pub fn path_match(pattern: &str, path: &str) -> bool {
    let pattern = pattern.strip_prefix("./").unwrap_or(pattern);
    if pattern == "*" || pattern == "**" {
        return true;
    }
    let trimmed = pattern.trim_end_matches('/');
    let (anchored, body) = match trimmed.strip_prefix('/') {
        Some(rest) => (true, rest),
        None => (trimmed.contains('/'), trimmed),
    };
    let mut parts: Vec<&str> = body.split('/').filter(|p| !p.is_empty()).collect();
    if !anchored {
        parts.insert(0, "**");
    }
    let names: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    // The parts matched so far, as the set of part indices reachable after each name (a
    // `**` keeps its index for any number of names): one pass over the names, so the path
    // and every directory above it are judged together, in time linear in each.
    let mut reached = vec![false; parts.len() + 1];
    reached[0] = true;
    skip_double_stars(&parts, &mut reached);
    for name in names {
        let mut next = vec![false; parts.len() + 1];
        for (at, part) in parts.iter().enumerate().filter(|&(at, _)| reached[at]) {
            if *part == "**" {
                next[at] = true;
            } else if glob_match(part, name) {
                next[at + 1] = true;
            }
        }
        skip_double_stars(&parts, &mut next);
        if next[parts.len()] {
            return true;
        }
        if !next.contains(&true) {
            return false;
        }
        reached = next;
    }
    false
}

/// Adds to `reached` the part indices past each reached `**`, which may match no name.
fn skip_double_stars(parts: &[&str], reached: &mut [bool]) {
    for (at, part) in parts.iter().enumerate() {
        if reached[at] && *part == "**" {
            reached[at + 1] = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{glob_match, path_match};

    #[test]
    fn paths_match_like_gitignore_lines() {
        for (pattern, path, want) in [
            ("src/**", "src/main.rs", true),
            ("src/**", "src", true),
            ("src/**", "tests/src/a.rs", false),
            ("src/", "src/a/b.rs", true),
            ("/build", "build/x", true),
            ("/build", "a/build/x", false),
            ("build", "a/build/x", true),
            (".env", "deep/down/.env", true),
            ("*.pem", "keys/server.pem", true),
            ("*.pem", "keys/server.pem.txt", false),
            ("secrets/*.key", "secrets/a.key", true),
            ("secrets/*.key", "secrets/sub/a.key", false),
            ("secrets/**/*.key", "secrets/sub/a.key", true),
            ("**/node_modules", "a/node_modules/b.js", true),
            ("src/**", ".", false),
            ("*", ".", true),
            ("**", "any/thing", true),
            ("./docs/**", "docs/a.md", true),
            ("docs", "documents/a.md", false),
            ("a/**/**/b", "a/b", true),
            ("a/**/b/**", "a/x/y/b", true),
            ("**/b/**/c", "b/x/b/y/c/z", true),
            ("**/b/**/c", "b/x/y", false),
        ] {
            assert_eq!(path_match(pattern, path), want, "{pattern} vs {path}");
        }
    }

    /// A pattern with two `**` against a deep path that does not match takes one pass over
    /// it, not a search over every way to split it (about 1e9 steps here before).
    #[test]
    fn double_stars_do_not_backtrack() {
        let path = format!("{}x.txt", ".github/".repeat(2000));
        assert!(!path_match("**/.github/**/*.yml", &path));
        assert!(path_match("**/.github/**/*.txt", &path));
    }

    #[test]
    fn matches() {
        for (pattern, name, want) in [
            ("*", "fs__read", true),
            ("fs__*", "fs__read", true),
            ("fs__*", "github__read", false),
            ("*__delete_*", "github__delete_repo", true),
            ("fs__re?d", "fs__read", true),
            ("fs__re?d", "fs__reed_x", false),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob_match(pattern, name), want, "{pattern} vs {name}");
        }
    }
}
