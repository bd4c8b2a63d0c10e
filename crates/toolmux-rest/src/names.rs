//! Tool names from OpenAPI operations: snake_case, sanitized, within the name budget after
//! the namespace, shortened and de-duplicated deterministically.

use std::collections::HashMap;
use toolmux_core::naming;

/// snake_case of an `operationId` or any label: camelCase humps and every character outside
/// `[A-Za-z0-9]` become `_`, runs of `_` collapse, the ends are trimmed.
pub(crate) fn snake_case(label: &str) -> String {
    let chars: Vec<char> = label.chars().collect();
    let mut out = String::with_capacity(label.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_alphanumeric() {
            if c.is_ascii_uppercase() && i > 0 {
                let prev = chars[i - 1];
                let next_lower = chars.get(i + 1).is_some_and(char::is_ascii_lowercase);
                if prev.is_ascii_lowercase()
                    || prev.is_ascii_digit()
                    || (prev.is_ascii_uppercase() && next_lower)
                {
                    out.push('_');
                }
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push('_');
        }
    }
    collapse_underscores(&out)
}

fn collapse_underscores(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '_' && (out.is_empty() || out.ends_with('_')) {
            continue;
        }
        out.push(c);
    }
    while out.ends_with('_') {
        out.pop();
    }
    out
}

/// The name of an operation without `operationId`: the method and the path, with
/// `{param}` segments read as `by_param` (`GET /pets/{petId}` is `get_pets_by_pet_id`).
pub(crate) fn from_method_and_path(method: &str, path: &str) -> String {
    let mut label = method.to_ascii_lowercase();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        label.push('_');
        match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            Some(param) => {
                label.push_str("by_");
                label.push_str(param);
            }
            None => label.push_str(segment),
        }
    }
    snake_case(&label)
}

/// Sanitizes a configured or `x-mcp-name` name: characters outside `[A-Za-z0-9_-]` become
/// `_`; it is otherwise kept as the author wrote it.
pub(crate) fn sanitize(name: &str) -> String {
    naming::sanitize(name).into_owned()
}

/// Fits `name` into what is left of `budget` after `{namespace}__`: a longer name keeps its
/// head and gets `_` and a hash of the full name, so it is deterministic and distinct.
pub(crate) fn fit(namespace: &str, name: &str, budget: usize) -> String {
    let room = budget.saturating_sub(namespace.len() + naming::SEPARATOR.len());
    if name.len() <= room {
        return name.to_owned();
    }
    let hash = naming::short_hash(namespace, name);
    let keep = room.saturating_sub(hash.len() + 1).max(1);
    // Names are ASCII after sanitizing, so byte slicing is character slicing.
    let head = name[..keep.min(name.len())].trim_end_matches('_');
    format!("{head}_{hash}")
}

/// Makes every name unique: all holders of a name used more than once get `_` and a hash
/// of their own key (such as `GET /path`) appended, so the result does not depend on order.
pub(crate) fn dedupe(namespace: &str, names: &mut [(String, String)], budget: usize) {
    for _round in 0..3 {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for (name, _) in names.iter() {
            *counts.entry(name.as_str()).or_default() += 1;
        }
        let clashing: Vec<bool> =
            names.iter().map(|(name, _)| counts.get(name.as_str()).copied() > Some(1)).collect();
        if !clashing.contains(&true) {
            return;
        }
        for ((name, key), clash) in names.iter_mut().zip(clashing) {
            if clash {
                let hash = naming::short_hash(namespace, key);
                let room = budget
                    .saturating_sub(namespace.len() + naming::SEPARATOR.len() + hash.len() + 1);
                let head = &name[..name.len().min(room)];
                *name = format!("{}_{hash}", head.trim_end_matches('_'));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    #[test]
    fn snake_case_of_operation_ids() {
        let got: Vec<String> = [
            "listPets",
            "repos/get-content",
            "getHTTPResponse",
            "show_pet_by_id",
            "Get User v2",
            "__odd..name__",
            "apps/create-from-manifest",
            "ÄÖ",
        ]
        .iter()
        .map(|s| snake_case(s))
        .collect();
        expect![[r#"["list_pets", "repos_get_content", "get_http_response", "show_pet_by_id", "get_user_v2", "odd_name", "apps_create_from_manifest", ""]"#]]
            .assert_eq(&format!("{got:?}"));
    }

    #[test]
    fn names_from_method_and_path() {
        assert_eq!(from_method_and_path("GET", "/pets/{petId}"), "get_pets_by_pet_id");
        assert_eq!(from_method_and_path("post", "/"), "post");
        assert_eq!(from_method_and_path("delete", "/v1/a.b/{x-y}"), "delete_v1_a_b_by_x_y");
    }

    #[test]
    fn long_names_fit_the_budget_deterministically() {
        let long = "a_very_long_operation_name_that_goes_on_and_on_and_on_forever_and_ever";
        let one = fit("github", long, 64);
        assert!(one.len() <= 64 - "github__".len());
        assert_eq!(one, fit("github", long, 64));
        assert_ne!(one, fit("github", &format!("{long}_2"), 64));
        assert_eq!(fit("github", "short", 64), "short");
    }

    #[test]
    fn duplicates_all_get_their_own_hash() {
        let mut names = vec![
            ("list".to_owned(), "GET /a".to_owned()),
            ("list".to_owned(), "GET /b".to_owned()),
            ("other".to_owned(), "GET /c".to_owned()),
        ];
        dedupe("ns", &mut names, 64);
        assert_ne!(names[0].0, names[1].0);
        assert!(names[0].0.starts_with("list_"));
        assert_eq!(names[2].0, "other");
        let mut reversed = vec![names[1].clone(), names[0].clone()];
        reversed[0].0 = "list".into();
        reversed[1].0 = "list".into();
        dedupe("ns", &mut reversed, 64);
        assert_eq!(reversed[0].0, names[1].0);
    }
}
