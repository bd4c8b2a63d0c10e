//! Tool names as served: unchanged, or fitted into what a prefixing client leaves of the
//! 64-character budget, with a reverse map that routes calls back.
//!
//! Clients such as Claude Code show a server's tools to their model as
//! `mcp__{server}__{tool}` and reject the whole server when one such name is over 64
//! characters. With a name prefix set, every name is sanitized to `[A-Za-z0-9_-]` and cut to
//! `64 - prefix` characters, the cut ones ending in `_` and a short hash of the original
//! name, the way [`toolmux_core::naming`] shortens namespaced names.

use std::collections::HashMap;
use toolmux_core::naming;

/// The shortest budget left for a served name, whatever the prefix: one character, `_`
/// and the eight hash characters, plus some room to stay readable.
const MIN_BUDGET: usize = 16;

/// The longest name prefix that still leaves [`MIN_BUDGET`] characters of a 64-character
/// name for the tool's own: a longer one would make every served name longer than the
/// client takes.
pub const LONGEST_NAME_PREFIX: usize = naming::DEFAULT_BUDGET - MIN_BUDGET;

/// Hex characters of the hash [`naming::short_hash`] returns.
const HASH_LEN: usize = 8;

/// Served names of one tool listing and where each routes.
#[derive(Debug, Default)]
pub(crate) struct NameMap {
    /// `(served, local)` in listing order.
    pairs: Vec<(String, String)>,
    /// Served name to local name, for names that differ.
    routes: HashMap<String, String>,
}

impl NameMap {
    /// Serves `local` names unchanged when `prefix` is `None`, else fitted to what `prefix`
    /// leaves of `full_budget` characters.
    pub(crate) fn new<'a>(
        local: impl IntoIterator<Item = &'a str>,
        prefix: Option<&str>,
        full_budget: usize,
    ) -> Self {
        let local: Vec<&str> = local.into_iter().collect();
        let Some(prefix) = prefix else {
            let pairs = local.iter().map(|n| ((*n).to_owned(), (*n).to_owned())).collect();
            return NameMap { pairs, routes: HashMap::new() };
        };
        let budget = full_budget.saturating_sub(prefix.len()).max(MIN_BUDGET);
        let short = short_namespaces(&local, budget);
        let mut served: Vec<String> = local.iter().map(|n| fit(n, budget, false, &short)).collect();
        // Two originals that sanitize alike (`a.b`, `a_b`): the changed one gets the hash,
        // so the result depends only on the set of names, never on their order.
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for name in &served {
            *counts.entry(name.as_str()).or_default() += 1;
        }
        let clashing: Vec<usize> = (0..served.len())
            .filter(|&i| counts.get(served[i].as_str()).copied().unwrap_or(0) > 1)
            .filter(|&i| served[i] != local[i])
            .collect();
        for i in clashing {
            served[i] = fit(local[i], budget, true, &short);
        }
        let mut map = NameMap::default();
        for (served, local) in served.into_iter().zip(local) {
            if served != local {
                map.routes.insert(served.clone(), local.to_owned());
            }
            map.pairs.push((served, local.to_owned()));
        }
        map
    }

    /// `(served, local)` pairs in listing order.
    pub(crate) fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// The local name a served name routes to; `None` when the name was served unchanged
    /// or is unknown (both are passed on as they are).
    pub(crate) fn local(&self, served: &str) -> Option<&str> {
        self.routes.get(served).map(String::as_str)
    }

    /// Whether `served` is a name of this listing.
    pub(crate) fn contains(&self, served: &str) -> bool {
        self.routes.contains_key(served) || self.pairs.iter().any(|(s, _)| s == served)
    }
}

/// The shortened form of each namespace that does not leave its tools room: its first
/// characters, `_` and a hash of the namespace alone, two fifths of `budget` long in all.
///
/// Every tool of such a namespace is served under the same form, so that a client showing
/// tools grouped by prefix shows one provider as one (`averyve_5c08ae8f__search`,
/// `averyve_5c08ae8f__fetch`), where each tool's name cut to its own length gave each its
/// own prefix. The form depends on the namespace and the budget alone, so a tool that
/// joins the listing later renames no other once the namespace is cut (the first tool
/// that needs the cut renames its namespace's others). A namespace is shortened only when
/// one of its tools does not fit whole and would fit with it shortened.
fn short_namespaces(local: &[&str], budget: usize) -> HashMap<String, String> {
    let keep = (budget * 2 / 5).saturating_sub(1 + HASH_LEN).max(1);
    let mut short = HashMap::new();
    for name in local {
        let clean = naming::sanitize(name);
        if clean.len() <= budget {
            continue;
        }
        let Some((namespace, tool)) = naming::split(&clean) else { continue };
        if namespace.len() <= keep || short.contains_key(namespace) {
            continue;
        }
        let form = format!("{}_{}", &namespace[..keep], naming::short_hash(namespace, ""));
        // Worth it only when the tool then fits, or leaves room for a cut name and its hash.
        if form.len() + 2 + tool.len().min(2 + HASH_LEN) <= budget {
            short.insert(namespace.to_owned(), form);
        }
    }
    short
}

/// `name` sanitized and, when over `budget` (or `force_hash`), cut and given a hash suffix;
/// a tool of a namespace in `short` goes under the namespace's short form
/// ([`short_namespaces`]).
fn fit(name: &str, budget: usize, force_hash: bool, short: &HashMap<String, String>) -> String {
    let clean = naming::sanitize(name);
    let hash = match naming::split(name) {
        Some((namespace, tool)) => naming::short_hash(namespace, tool),
        None => naming::short_hash("", name),
    };
    if let Some((namespace, tool)) = naming::split(&clean)
        && let Some(form) = short.get(namespace)
    {
        let whole = format!("{form}__{tool}");
        if whole.len() <= budget && !force_hash {
            return whole;
        }
        // `short_namespaces` left room for at least one character, `_` and the hash.
        let room = budget.saturating_sub(form.len() + 2 + 1 + HASH_LEN).max(1);
        return format!("{form}__{}_{hash}", &tool[..tool.len().min(room)]);
    }
    if clean.len() <= budget && !force_hash {
        return clean.into_owned();
    }
    let room = budget - 1 - HASH_LEN;
    // `clean` is ASCII, so byte slicing is character slicing.
    let kept = &clean[..clean.len().min(room)];
    format!("{kept}_{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The length budget of a full, prefixed name for most clients.
    const FULL_BUDGET: usize = naming::DEFAULT_BUDGET;
    use expect_test::expect;

    #[test]
    fn without_prefix_names_pass_unchanged() {
        let long = "x".repeat(100);
        let map = NameMap::new(["a.b", long.as_str()], None, FULL_BUDGET);
        assert_eq!(map.pairs()[0].0, "a.b");
        assert_eq!(map.pairs()[1].0, long);
        assert_eq!(map.local("a.b"), None);
        assert!(map.contains(&long));
    }

    #[test]
    fn long_names_fit_the_prefix_budget_and_route_back() {
        let long = format!("github__{}", "search_code_".repeat(8));
        let map = NameMap::new(["fs__read", long.as_str()], Some("mcp__toolmux__"), FULL_BUDGET);
        let served = &map.pairs()[1].0;
        expect!["github__search_code_search_code_search_co_91321316"].assert_eq(served);
        assert_eq!(served.len(), 64 - "mcp__toolmux__".len());
        assert_eq!(map.local(served), Some(long.as_str()));
        assert_eq!(map.pairs()[0].0, "fs__read");
        assert_eq!(map.local("fs__read"), None);
    }

    #[test]
    fn a_long_namespace_gives_way_to_the_tools_own_name() {
        let long = "a-server-whose-name-is-long-enough-to-matter__lookup";
        let map = NameMap::new([long], Some("mcp__toolmux__"), FULL_BUDGET);
        let served = &map.pairs()[0].0;
        expect!["a-server-wh_e65a7a68__lookup"].assert_eq(served);
        assert!(served.len() <= 64 - "mcp__toolmux__".len());
        assert_eq!(map.local(served), Some(long));
    }

    #[test]
    fn the_tools_of_a_shortened_namespace_share_one_prefix() {
        let names = [
            "averyveryverylongnamespacename__search_everything_everywhere",
            "averyveryverylongnamespacename__fetch",
            "averyveryverylongnamespacename__x",
            "fs__read",
        ];
        let map = NameMap::new(names, Some("mcp__toolmux__"), FULL_BUDGET);
        let served: Vec<&str> = map.pairs().iter().map(|(s, _)| s.as_str()).collect();
        expect![[r#"
            [
                "averyveryve_d45f95f7__search_everything_everywhere",
                "averyveryve_d45f95f7__fetch",
                "averyveryve_d45f95f7__x",
                "fs__read",
            ]
        "#]]
        .assert_debug_eq(&served);
        for (served, local) in map.pairs() {
            assert!(served.len() <= 64 - "mcp__toolmux__".len(), "{served}");
            if served != local {
                assert_eq!(map.local(served), Some(local.as_str()));
            }
        }
        // A tool joining the listing renames no other.
        let more = NameMap::new(
            names.iter().copied().chain(["averyveryverylongnamespacename__y"]),
            Some("mcp__toolmux__"),
            FULL_BUDGET,
        );
        assert_eq!(&more.pairs()[..4], map.pairs());
        // A tool too long even under the short form is cut, keeping the prefix.
        let long = format!("averyveryverylongnamespacename__{}", "t".repeat(60));
        let cut = NameMap::new([long.as_str()], Some("mcp__toolmux__"), FULL_BUDGET);
        let served = &cut.pairs()[0].0;
        let prefix = map.pairs()[0].0.split("__").next().unwrap();
        assert!(served.starts_with(&format!("{prefix}__ttt")), "{served}");
        assert_eq!(served.len(), 64 - "mcp__toolmux__".len());
        assert_eq!(cut.local(served), Some(long.as_str()));
    }

    #[test]
    fn sanitization_clashes_get_a_hash_whatever_the_order() {
        let one = NameMap::new(["a.b", "a_b"], Some("p__"), FULL_BUDGET);
        let two = NameMap::new(["a_b", "a.b"], Some("p__"), FULL_BUDGET);
        assert_eq!(one.pairs()[1].0, "a_b");
        assert_eq!(one.pairs()[0].0, two.pairs()[1].0);
        assert!(one.pairs()[0].0.starts_with("a_b_"));
        assert_eq!(one.local(&one.pairs()[0].0), Some("a.b"));
    }

    #[test]
    fn a_huge_prefix_still_leaves_room() {
        let map = NameMap::new(["some_rather_long_tool_name"], Some(&"p".repeat(70)), FULL_BUDGET);
        assert_eq!(map.pairs()[0].0.len(), MIN_BUDGET);
    }
}
