//! Tool names as models see them: `{namespace}__{tool}`.
//!
//! Models reject tool names over 64 characters or outside `[A-Za-z0-9_-]`; providers do
//! not care. So every provider-local name is sanitized, prefixed with its namespace and,
//! when the result is over the budget, shortened deterministically: the tool part is cut
//! and a short hash of the full original name appended, so that two long names sharing a
//! prefix stay distinct and the same name always maps to the same result. The caller keeps
//! the returned original next to each qualified name to route calls back.
//!
//! ```
//! use toolmux_core::naming;
//!
//! assert_eq!(naming::qualify("github", "search.code", 64).unwrap(), "github__search_code");
//! let long = "x".repeat(100);
//! let name = naming::qualify("svc", &long, 64).unwrap();
//! assert_eq!(name.len(), 64);
//! assert_eq!(naming::split(&name), Some(("svc", &name[5..])));
//! ```

use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::HashMap;

/// The separator between namespace and tool.
pub const SEPARATOR: &str = "__";

/// The default length budget: what OpenAI and Anthropic accept.
pub const DEFAULT_BUDGET: usize = 64;

/// Hex characters of the hash appended to a shortened name.
const HASH_LEN: usize = 8;

/// Why a name could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NamingError {
    /// The namespace does not match `[a-z][a-z0-9-]*`.
    #[error(
        "invalid namespace `{namespace}`: use a lowercase letter followed by lowercase letters, \
         digits or `-`"
    )]
    InvalidNamespace {
        /// The namespace.
        namespace: String,
    },
    /// The namespace leaves no room for a tool name in the budget.
    #[error(
        "namespace `{namespace}` is too long for the {budget}-character name budget: \
         shorten it to at most {max} characters"
    )]
    NamespaceTooLong {
        /// The namespace.
        namespace: String,
        /// The budget.
        budget: usize,
        /// The longest namespace that fits.
        max: usize,
    },
}

/// Checks a namespace: `[a-z][a-z0-9-]*`, and no `__` (it could not be split off again).
pub fn validate_namespace(namespace: &str) -> Result<(), NamingError> {
    let mut bytes = namespace.bytes();
    let valid = bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(NamingError::InvalidNamespace { namespace: namespace.to_owned() })
    }
}

/// Replaces every character outside `[A-Za-z0-9_-]` with `_`; an empty name becomes `_`.
pub fn sanitize(tool: &str) -> Cow<'_, str> {
    if !tool.is_empty() && tool.bytes().all(is_name_byte) {
        return Cow::Borrowed(tool);
    }
    if tool.is_empty() {
        return Cow::Borrowed("_");
    }
    Cow::Owned(
        tool.chars().map(|c| if c.is_ascii() && is_name_byte(c as u8) { c } else { '_' }).collect(),
    )
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Whether `name` is a valid model-facing name within `budget`.
pub fn is_valid_name(name: &str, budget: usize) -> bool {
    !name.is_empty() && name.len() <= budget && name.bytes().all(is_name_byte)
}

/// The short hash of a full original name, as appended to shortened names.
pub fn short_hash(namespace: &str, tool: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(namespace.as_bytes());
    hasher.update(SEPARATOR.as_bytes());
    hasher.update(tool.as_bytes());
    let digest = hasher.finalize();
    let mut out = String::with_capacity(HASH_LEN);
    for byte in digest.iter().take(HASH_LEN / 2) {
        out.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
    }
    out
}

/// Builds the model-facing name of `tool` under `namespace` within `budget` characters.
pub fn qualify(namespace: &str, tool: &str, budget: usize) -> Result<String, NamingError> {
    qualify_with(namespace, tool, budget, false)
}

fn qualify_with(
    namespace: &str,
    tool: &str,
    budget: usize,
    force_hash: bool,
) -> Result<String, NamingError> {
    validate_namespace(namespace)?;
    // Room for at least one character of the tool name, `_` and the hash.
    let min_tool = 1 + 1 + HASH_LEN;
    let max_namespace = budget.saturating_sub(SEPARATOR.len() + min_tool);
    if namespace.len() > max_namespace {
        return Err(NamingError::NamespaceTooLong {
            namespace: namespace.to_owned(),
            budget,
            max: max_namespace,
        });
    }
    let clean = sanitize(tool);
    let plain_len = namespace.len() + SEPARATOR.len() + clean.len();
    if plain_len <= budget && !force_hash {
        return Ok(format!("{namespace}{SEPARATOR}{clean}"));
    }
    let hash = short_hash(namespace, tool);
    let room = budget - namespace.len() - SEPARATOR.len() - 1 - HASH_LEN;
    // `clean` is ASCII, so byte slicing is character slicing.
    let kept = &clean[..clean.len().min(room)];
    Ok(format!("{namespace}{SEPARATOR}{kept}_{hash}"))
}

/// Splits a full name at the first `__` into namespace and tool part.
pub fn split(name: &str) -> Option<(&str, &str)> {
    let (namespace, tool) = name.split_once(SEPARATOR)?;
    (!namespace.is_empty() && !tool.is_empty()).then_some((namespace, tool))
}

/// Qualifies every tool of one provider, keeping names distinct.
///
/// Two originals that sanitize to the same name (`a.b` and `a_b`) would collide; the one
/// that sanitization changed gets the hash suffix, so the result depends only on the set
/// of names, never on their order. Returns `(qualified, original)` pairs in input order.
pub fn qualify_all<'a>(
    namespace: &str,
    tools: impl IntoIterator<Item = &'a str>,
    budget: usize,
) -> Result<Vec<(String, &'a str)>, NamingError> {
    let tools: Vec<&str> = tools.into_iter().collect();
    let mut out = Vec::with_capacity(tools.len());
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(tools.len());
    for tool in &tools {
        let name = qualify(namespace, tool, budget)?;
        *seen.entry(name.clone()).or_default() += 1;
        out.push((name, *tool));
    }
    for (name, tool) in &mut out {
        let clashes = seen.get(name.as_str()).copied().unwrap_or(0) > 1;
        if clashes && sanitize(tool) != *tool {
            *name = qualify_with(namespace, tool, budget, true)?;
        }
    }
    Ok(out)
}

/// Names every tool of one provider without a namespace, for a provider served under its
/// own names: each sanitized, and shortened with the hash suffix when over `budget` or when
/// two originals sanitize to the same name (the one sanitization changed gets the hash).
pub fn fit_all<'a>(
    tools: impl IntoIterator<Item = &'a str>,
    budget: usize,
) -> Vec<(String, &'a str)> {
    let fit = |tool: &str, force_hash: bool| {
        let clean = sanitize(tool);
        if clean.len() <= budget && !force_hash {
            return clean.into_owned();
        }
        let hash = short_hash("", tool);
        let room = budget.saturating_sub(1 + HASH_LEN).max(1);
        // `clean` is ASCII, so byte slicing is character slicing.
        format!("{}_{hash}", &clean[..clean.len().min(room)])
    };
    let mut out: Vec<(String, &str)> = tools.into_iter().map(|t| (fit(t, false), t)).collect();
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(out.len());
    for (name, _) in &out {
        *seen.entry(name.clone()).or_default() += 1;
    }
    for (name, tool) in &mut out {
        if seen.get(name.as_str()).copied().unwrap_or(0) > 1 && sanitize(tool) != *tool {
            *name = fit(tool, true);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unprefixed_names_fit_the_budget_and_stay_distinct() {
        let long = "x".repeat(80);
        let names: Vec<String> = fit_all(["read", "a.b", "a_b", long.as_str()], 64)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names[0], "read");
        assert_eq!(names[2], "a_b");
        assert!(names[1].starts_with("a_b_") && names[1] != names[2], "{names:?}");
        assert_eq!(names[3].len(), 64);
        assert!(names.iter().all(|n| is_valid_name(n, 64)));
    }

    #[test]
    fn plain_names() {
        assert_eq!(qualify("fs", "read", 64).unwrap(), "fs__read");
        assert_eq!(
            qualify("github", "get file/contents", 64).unwrap(),
            "github__get_file_contents"
        );
        assert_eq!(qualify("x", "", 64).unwrap(), "x___");
        assert_eq!(split("github__search__code"), Some(("github", "search__code")));
        assert_eq!(split("nonamespace"), None);
        assert_eq!(split("__x"), None);
    }

    #[test]
    fn namespace_rules() {
        assert!(validate_namespace("my-server2").is_ok());
        for bad in ["", "My", "2x", "a_b", "a__b", "ü"] {
            assert!(validate_namespace(bad).is_err(), "{bad}");
        }
        let err = qualify(&"a".repeat(60), "t", 64).unwrap_err();
        assert_eq!(
            err.to_string(),
            "namespace `aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa` is too long \
             for the 64-character name budget: shorten it to at most 52 characters"
        );
    }

    #[test]
    fn long_names_are_shortened_with_a_hash() {
        let a = format!("{}_alpha", "x".repeat(80));
        let b = format!("{}_beta", "x".repeat(80));
        let qa = qualify("svc", &a, 64).unwrap();
        let qb = qualify("svc", &b, 64).unwrap();
        assert_eq!(qa.len(), 64);
        assert_ne!(qa, qb);
        assert_eq!(qa, qualify("svc", &a, 64).unwrap(), "deterministic");
        assert!(qa.starts_with("svc__xxxx"));
    }

    #[test]
    fn sanitization_clashes_get_a_hash_whatever_the_order() {
        let one = qualify_all("s", ["a.b", "a_b"], 64).unwrap();
        let two = qualify_all("s", ["a_b", "a.b"], 64).unwrap();
        assert_eq!(one[1].0, "s__a_b");
        assert_eq!(two[0].0, "s__a_b");
        assert_eq!(one[0].0, two[1].0);
        assert!(one[0].0.starts_with("s__a_b_"));
    }

    proptest! {
        #[test]
        fn every_name_fits_and_routes_back(
            namespace in "[a-z][a-z0-9-]{0,20}",
            tools in proptest::collection::vec("\\PC{0,90}", 1..20),
            budget in 40usize..=128,
        ) {
            let mut unique = tools;
            unique.sort();
            unique.dedup();
            let names = qualify_all(&namespace, unique.iter().map(String::as_str), budget).unwrap();
            let mut routes = HashMap::new();
            for (name, original) in &names {
                prop_assert!(is_valid_name(name, budget), "{name}");
                let (ns, _) = split(name).unwrap();
                prop_assert_eq!(ns, namespace.as_str());
                prop_assert!(routes.insert(name.clone(), *original).is_none(), "duplicate {}", name);
            }
            for original in &unique {
                let name = &names.iter().find(|(_, o)| o == original).unwrap().0;
                prop_assert_eq!(routes[name], original.as_str());
            }
        }
    }
}
