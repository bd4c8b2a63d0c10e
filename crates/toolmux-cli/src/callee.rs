//! Which providers `tools call` starts, from the name it calls: the one provider whose
//! namespace begins the name, every provider for a tool that calls others, and none for a
//! name no provider could have, which is refused before anything starts.

use std::collections::BTreeMap;
use toolmux::Toolmux;
use toolmux::config::{Loaded, Oversize};
use toolmux::toolmux_core::naming;
use toolmux::toolmux_core::suggest::distance;
use toolmux::toolmux_orchestrator::store::OutputReader;

/// The providers a call of one name needs started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Callee {
    /// The provider of this namespace alone.
    Provider(String),
    /// Every provider: the tool calls others (an agent, `tools__call`), or a server whose
    /// tools have no prefix (`namespaced: false`) may have it, which is known only once it
    /// lists them.
    Everything,
    /// No provider could have the tool: its name begins with no provider's namespace (the
    /// namespace it names, if any).
    Nowhere(Option<String>),
}

impl Callee {
    /// The providers a call of `name` (a full name or an alias) needs.
    pub(crate) fn of(loaded: &Loaded, name: &str) -> Callee {
        let name = resolved(&loaded.config.aliases, name);
        // A server whose tools keep their own names may have any name at all.
        let unprefixed = loaded
            .config
            .mcp_servers
            .values()
            .any(|entry| entry.enabled != Some(false) && entry.namespaced == Some(false));
        let Some((namespace, _)) = naming::split(name) else {
            return if unprefixed { Callee::Everything } else { Callee::Nowhere(None) };
        };
        if calling_others(loaded).contains(&namespace) {
            return Callee::Everything;
        }
        if namespaces(loaded).iter().any(|known| known == namespace) {
            return Callee::Provider(namespace.to_owned());
        }
        if unprefixed { Callee::Everything } else { Callee::Nowhere(Some(namespace.to_owned())) }
    }
}

/// `name` with aliases followed to the tool they name. An alias may name another alias;
/// a cycle is refused when the configuration loads, and a chain is followed no further
/// than there are aliases all the same.
pub(crate) fn resolved<'a>(aliases: &'a BTreeMap<String, String>, name: &'a str) -> &'a str {
    let mut name = name;
    for _ in 0..=aliases.len() {
        match aliases.get(name) {
            Some(target) => name = target,
            None => break,
        }
    }
    name
}

/// The namespaces of the providers the configuration has whose tools call only themselves:
/// those the configuration names (the file tools, command tools, servers, REST and OpenAPI
/// tools, the web tools), the external tools and the spaces' gateway when configured, and
/// `output` (`output__read`) unless outputs over the size cap are cut (`oversize:
/// truncate`), when there is no `output__read`.
pub(crate) fn namespaces(loaded: &Loaded) -> Vec<String> {
    let mut namespaces = loaded.namespaces();
    // The namespaces of `toolmux-external`, which the facade does not re-export.
    if !loaded.config.external_tools.is_empty() {
        namespaces.push("external".to_owned());
    }
    if loaded.config.spaces.is_some() {
        namespaces.push("gateway".to_owned());
    }
    if loaded.config.defaults.oversize != Some(Oversize::Truncate) {
        namespaces.push(OutputReader::NAMESPACE.to_owned());
    }
    namespaces
}

/// The namespaces whose tools call other tools, so that a call of one needs every
/// provider: the agents (`agent__NAME`) and the tool search (`tools__call`).
fn calling_others(loaded: &Loaded) -> Vec<&'static str> {
    let mut namespaces = Vec::new();
    if !loaded.config.agents.is_empty() {
        namespaces.push(toolmux::toolmux_agent::NAMESPACE);
    }
    if !loaded.config.tool_search.defer.is_empty() {
        namespaces.push(toolmux::toolmux_orchestrator::search::NAMESPACE);
    }
    namespaces
}

/// The error of a call of `name`, which no provider could have ([`Callee::Nowhere`]): the
/// namespaces there are, and the closest tool name among those known without starting a
/// server (the builtin file, command and REST tools, and the tools called before with
/// this configuration, from its statistics).
pub(crate) async fn nowhere(loaded: &Loaded, name: &str, namespace: Option<&str>) -> String {
    let mut known = namespaces(loaded);
    known.extend(calling_others(loaded).into_iter().map(str::to_owned));
    known.sort();
    known.dedup();
    let names = local_names(loaded, &known).await;
    let listed: Vec<String> = known.iter().map(|ns| format!("`{ns}`")).collect();
    let there = match listed.is_empty() {
        true => "no provider is configured".to_owned(),
        false => format!("the namespaces are {}", listed.join(", ")),
    };
    let target = resolved(&loaded.config.aliases, name);
    let why = match (namespace, target.split_once("__")) {
        (Some(namespace), _) => format!("no provider has namespace `{namespace}` ({there})"),
        // `fs__`: a namespace and no tool after it.
        (None, Some((before, ""))) if !before.is_empty() => {
            format!("it names no tool after `{before}__`, as `fs__read` names `read` ({there})")
        }
        (None, _) => format!("no namespace begins it, as `fs__` begins `fs__read` ({there})"),
    };
    // An alias is shown with the name it stands for, which is the one wrong.
    let shown = match target == name {
        true => format!("`{name}`"),
        false => format!("`{name}` (an alias of `{target}`)"),
    };
    let name = target;
    let near = toolmux::toolmux_orchestrator::suggest(names.iter().map(String::as_str), name);
    let hint = match near.first() {
        Some(near) => format!("; did you mean `{near}`?"),
        None => {
            let lower = name.to_ascii_lowercase();
            let closest =
                names.iter().min_by_key(|n| (distance(&lower, &n.to_ascii_lowercase()), *n));
            let closest = closest.map(|n| format!("; the closest tool name is `{n}`"));
            format!("{}; `toolmux tools list` shows every tool's name", closest.unwrap_or_default())
        }
    };
    format!("unknown tool {shown}: {why}{hint}")
}

/// The tool names known without starting a server: the tools of the providers that start
/// in this process at once (file, command and inline REST tools), and the names in the
/// statistics of earlier calls that succeeded at least once and whose namespace is still
/// configured (the statistics also count calls of names no provider had: after a call of
/// `fs__nope`, `fss__nope` was answered with "did you mean `fs__nope`?"). Not the aliases: a
/// short one is close to every short name (`a` was offered for `nope__x`).
async fn local_names(loaded: &Loaded, known: &[String]) -> Vec<String> {
    let local = ["fs", "cmd", toolmux::toolmux_rest::INLINE_NAMESPACE];
    let mut names = Vec::new();
    // Built without the servers (as `output show` builds only the store), and dropped
    // without `shutdown`: nothing ran, so the statistics file is left as it was.
    if let Ok(toolmux) = Toolmux::build_only(loaded, &|ns| local.contains(&ns)).await {
        let wait = std::time::Duration::from_secs(5);
        toolmux.orchestrator().warmup_within(Some(wait)).await;
        let tools = toolmux.orchestrator().tools();
        names.extend(tools.into_iter().map(|t| t.name));
        let called = toolmux.orchestrator().stats().snapshot().tools;
        names.extend(called.into_iter().filter_map(|(name, stats)| {
            let configured =
                naming::split(&name).is_some_and(|(ns, _)| known.iter().any(|k| k == ns));
            (configured && stats.ok > 0).then_some(name)
        }));
    }
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::resolved;
    use std::collections::BTreeMap;

    #[test]
    fn aliases_are_followed_to_their_tool() {
        let aliases: BTreeMap<String, String> = [("a", "b"), ("b", "srv__echo"), ("x", "x")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(resolved(&aliases, "a"), "srv__echo");
        assert_eq!(resolved(&aliases, "srv__echo"), "srv__echo");
        // A cycle (refused at load) ends all the same.
        assert_eq!(resolved(&aliases, "x"), "x");
    }
}
