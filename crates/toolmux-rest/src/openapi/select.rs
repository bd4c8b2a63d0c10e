//! Which operations become tools: include/exclude selectors and path globs.

use crate::Selector;

/// What a selector looks at in one operation.
#[derive(Debug)]
pub(crate) struct OperationFacts<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) operation_id: Option<&'a str>,
    pub(crate) tags: Vec<&'a str>,
}

/// Whether `selector` matches: every field given must match, any entry of a field may.
pub(crate) fn matches(selector: &Selector, op: &OperationFacts<'_>) -> bool {
    let tags =
        selector.tags.is_empty() || selector.tags.iter().any(|t| op.tags.contains(&t.as_str()));
    let ids = selector.operation_ids.is_empty()
        || op.operation_id.is_some_and(|id| selector.operation_ids.iter().any(|s| s == id));
    let paths =
        selector.paths.is_empty() || selector.paths.iter().any(|g| glob_matches(g, op.path));
    let methods = selector.methods.is_empty()
        || selector.methods.iter().any(|m| m.eq_ignore_ascii_case(op.method));
    tags && ids && paths && methods
}

/// Matches a path against a glob: `*` matches within one `/`-separated segment, `**` any
/// number of whole segments, everything else literally.
pub(crate) fn glob_matches(glob: &str, path: &str) -> bool {
    let globs: Vec<&str> = glob.split('/').collect();
    let parts: Vec<&str> = path.split('/').collect();
    match_segments(&globs, &parts)
}

fn match_segments(globs: &[&str], parts: &[&str]) -> bool {
    match globs.split_first() {
        None => parts.is_empty(),
        Some((&"**", rest)) => (0..=parts.len()).any(|skip| match_segments(rest, &parts[skip..])),
        Some((glob, rest)) => parts
            .split_first()
            .is_some_and(|(part, tail)| segment_matches(glob, part) && match_segments(rest, tail)),
    }
}

fn segment_matches(glob: &str, part: &str) -> bool {
    match glob.split_once('*') {
        None => glob == part,
        Some((head, tail)) => {
            let Some(rest) = part.strip_prefix(head) else { return false };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| segment_matches(tail, &rest[i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_matches("/repos/*/*/issues", "/repos/{owner}/{repo}/issues"));
        assert!(!glob_matches("/repos/*/issues", "/repos/{owner}/{repo}/issues"));
        assert!(glob_matches("/repos/**", "/repos/{owner}/{repo}/issues"));
        assert!(glob_matches("/repos/**", "/repos"));
        assert!(glob_matches("**/issues", "/repos/a/issues"));
        assert!(glob_matches("/pets*", "/pets2"));
        assert!(glob_matches("/*/{id}", "/pets/{id}"));
        assert!(!glob_matches("/pets", "/pets/1"));
    }

    #[test]
    fn selectors_and_fields_or_entries() {
        let op = OperationFacts {
            method: "get",
            path: "/pets/{id}",
            operation_id: Some("showPet"),
            tags: vec!["pets"],
        };
        let by = |s: Selector| matches(&s, &op);
        assert!(by(Selector::default()));
        assert!(by(Selector { tags: vec!["x".into(), "pets".into()], ..Selector::default() }));
        assert!(by(Selector {
            methods: vec!["GET".into()],
            tags: vec!["pets".into()],
            ..Selector::default()
        }));
        assert!(!by(Selector {
            methods: vec!["post".into()],
            tags: vec!["pets".into()],
            ..Selector::default()
        }));
        assert!(by(Selector { operation_ids: vec!["showPet".into()], ..Selector::default() }));
        assert!(!by(Selector { paths: vec!["/users/**".into()], ..Selector::default() }));
    }
}
