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

#[cfg(test)]
mod tests {
    use super::glob_match;

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
