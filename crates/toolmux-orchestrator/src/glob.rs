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
    (1..=names.len()).any(|end| segments_match(&parts, &names[..end]))
}

fn segments_match(parts: &[&str], names: &[&str]) -> bool {
    match parts.split_first() {
        None => names.is_empty(),
        Some((&"**", rest)) => (0..=names.len()).any(|skip| segments_match(rest, &names[skip..])),
        Some((part, rest)) => {
            names.first().is_some_and(|name| glob_match(part, name))
                && segments_match(rest, &names[1..])
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
        ] {
            assert_eq!(path_match(pattern, path), want, "{pattern} vs {path}");
        }
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
