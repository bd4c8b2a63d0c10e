//! Prompts and resources of every provider, as last listed: prompt names qualified like
//! tool names, resource URIs kept as they are, and where to route each.
//!
//! Like the [`crate::Registry`], a catalog is an immutable snapshot: a listing builds a new
//! one from the previous one and swaps it in.

use crate::registry::{RegistryProblem, Severity};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use toolmux_core::{PromptSpec, ResourceSpec, ResourceTemplate, ToolProvider, naming};

/// One prompt under its model-facing name.
#[derive(Debug)]
pub(crate) struct PromptEntry {
    /// The qualified name, `{namespace}__{prompt}`.
    pub name: Arc<str>,
    /// The provider's own name for it.
    pub original: String,
    /// The provider.
    pub provider: Arc<dyn ToolProvider>,
    /// The spec as the provider gave it.
    pub spec: PromptSpec,
}

/// Every provider's prompts, qualified.
#[derive(Debug, Default)]
pub(crate) struct PromptCatalog {
    // Invariant: one listing per provider, in provider order.
    listed: Vec<Vec<PromptSpec>>,
    order: Vec<Arc<PromptEntry>>,
    by_name: HashMap<Arc<str>, Arc<PromptEntry>>,
    problems: Vec<RegistryProblem>,
}

impl PromptCatalog {
    /// A catalog from fresh listings, one per provider in order; `None` marks a provider
    /// whose listing failed, which keeps what `previous` listed for it.
    pub fn build(
        providers: &[Arc<dyn ToolProvider>],
        fresh: Vec<Option<Vec<PromptSpec>>>,
        previous: &PromptCatalog,
        budget: usize,
        unprefixed: &HashSet<String>,
    ) -> PromptCatalog {
        let mut catalog = PromptCatalog::default();
        for (i, (provider, fresh)) in providers.iter().zip(fresh).enumerate() {
            let prompts = fresh.or_else(|| previous.listed.get(i).cloned()).unwrap_or_default();
            let prefixed = !unprefixed.contains(provider.namespace());
            catalog.add_provider(provider, &prompts, budget, prefixed);
            catalog.listed.push(prompts);
        }
        catalog
    }

    fn add_provider(
        &mut self,
        provider: &Arc<dyn ToolProvider>,
        prompts: &[PromptSpec],
        budget: usize,
        prefixed: bool,
    ) {
        let namespace = provider.namespace();
        let mut seen = HashSet::new();
        let mut specs = Vec::with_capacity(prompts.len());
        for spec in prompts {
            if seen.insert(spec.name.as_str()) {
                specs.push(spec);
            } else {
                self.warn(format!(
                    "provider `{namespace}` lists prompt `{}` twice; the second is left out",
                    spec.name
                ));
            }
        }
        let local = specs.iter().map(|s| s.name.as_str());
        let names = if prefixed {
            match naming::qualify_all(namespace, local, budget) {
                Ok(names) => names,
                Err(e) => {
                    self.problems.push(RegistryProblem {
                        severity: Severity::Error,
                        message: format!("provider `{namespace}`: {e}"),
                    });
                    tracing::error!("prompts of provider `{namespace}` left out: {e}");
                    return;
                }
            }
        } else {
            naming::fit_all(local, budget)
        };
        for ((name, _), spec) in names.into_iter().zip(specs) {
            if let Some(owner) = self.by_name.get(name.as_str()) {
                let message = format!(
                    "prompt `{name}` of provider `{namespace}` has the name of a prompt of provider `{}` and is left out",
                    owner.provider.namespace()
                );
                tracing::error!("{message}");
                self.problems.push(RegistryProblem { severity: Severity::Error, message });
                continue;
            }
            let entry = Arc::new(PromptEntry {
                name: Arc::from(name),
                original: spec.name.clone(),
                provider: provider.clone(),
                spec: spec.clone(),
            });
            self.by_name.insert(entry.name.clone(), entry.clone());
            self.order.push(entry);
        }
    }

    fn warn(&mut self, message: String) {
        tracing::warn!("{message}");
        self.problems.push(RegistryProblem { severity: Severity::Warning, message });
    }

    /// The entry of a qualified name.
    pub fn get(&self, name: &str) -> Option<&Arc<PromptEntry>> {
        self.by_name.get(name)
    }

    /// Qualified names, in provider order then listing order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|e| &*e.name)
    }

    /// Every prompt with its qualified name in `name`.
    pub fn specs(&self) -> Vec<PromptSpec> {
        self.order
            .iter()
            .map(|e| PromptSpec { name: e.name.to_string(), ..e.spec.clone() })
            .collect()
    }

    /// Problems found while building (left-out prompts).
    pub fn problems(&self) -> &[RegistryProblem] {
        &self.problems
    }
}

/// Every provider's resources and templates, as last listed.
#[derive(Debug, Default)]
pub(crate) struct ResourceCatalog {
    // Invariant: one listing per provider, in provider order, for both vectors.
    resources: Vec<Vec<ResourceSpec>>,
    templates: Vec<Vec<ResourceTemplate>>,
    /// The provider (its index) that owns each listed URI: the first to list it.
    owners: HashMap<String, usize>,
    /// URIs listed more than once, already warned about.
    duplicates: HashSet<String>,
}

impl ResourceCatalog {
    /// This catalog with fresh resource listings, one per provider in order; `None` keeps
    /// the previous listing. A URI listed by two providers belongs to the first; a warning
    /// names both, once.
    pub fn with_resources(
        &self,
        providers: &[Arc<dyn ToolProvider>],
        fresh: Vec<Option<Vec<ResourceSpec>>>,
    ) -> ResourceCatalog {
        let resources = merge_listings(&self.resources, fresh);
        let mut owners = HashMap::new();
        let mut duplicates = HashSet::new();
        for (i, listed) in resources.iter().enumerate() {
            for resource in listed {
                let Some(&first) = owners.get(&resource.uri) else {
                    owners.insert(resource.uri.clone(), i);
                    continue;
                };
                if first != i && !self.duplicates.contains(&resource.uri) {
                    let name = |at: usize| providers.get(at).map_or("?", |p| p.namespace());
                    tracing::warn!(
                        "resource `{}` is listed by providers `{}` and `{}`; `{}`'s is listed \
                         under it, `{}`'s as `toolmux://{}/{}`",
                        resource.uri,
                        name(first),
                        name(i),
                        name(first),
                        name(i),
                        name(i),
                        resource.uri,
                    );
                }
                duplicates.insert(resource.uri.clone());
            }
        }
        ResourceCatalog { resources, templates: self.templates.clone(), owners, duplicates }
    }

    /// This catalog with fresh template listings; `None` keeps the previous listing.
    pub fn with_templates(&self, fresh: Vec<Option<Vec<ResourceTemplate>>>) -> ResourceCatalog {
        ResourceCatalog {
            resources: self.resources.clone(),
            templates: merge_listings(&self.templates, fresh),
            owners: self.owners.clone(),
            duplicates: self.duplicates.clone(),
        }
    }

    /// The resources `allowed` lets through (given the index of the provider that listed
    /// one and its URI): each URI under its own name as the first let through listed it,
    /// and as a later provider listed it under the name `alias` gives (given the index and
    /// the URI), so that none is out of reach.
    pub fn resources_where(
        &self,
        allowed: &dyn Fn(usize, &str) -> bool,
        alias: &dyn Fn(usize, &str) -> String,
    ) -> Vec<ResourceSpec> {
        first_wins(
            &self.resources,
            |r| &r.uri,
            |r, uri| ResourceSpec { uri, ..r.clone() },
            allowed,
            alias,
        )
    }

    /// Whether the provider of index `provider` lists `uri` while another owns it: its
    /// resource is listed under an alias.
    pub fn shadowed(&self, provider: usize, uri: &str) -> bool {
        self.owners.get(uri).is_some_and(|&owner| owner != provider)
            && self.resources.get(provider).is_some_and(|r| r.iter().any(|r| r.uri == uri))
    }

    /// The provider (its index) that owns `uri`: the first to list it.
    pub fn owner(&self, uri: &str) -> Option<usize> {
        self.owners.get(uri).copied()
    }

    /// The templates `allowed` lets through (given the index of the provider that listed
    /// one and its URI template), in provider order.
    ///
    /// A template an earlier provider lists too (two instances of one server) is listed under
    /// the name `alias` gives (given the index and the template), as a shadowed resource is,
    /// so that reading through it reaches this provider.
    pub fn templates_where(
        &self,
        allowed: &dyn Fn(usize, &str) -> bool,
        alias: &dyn Fn(usize, &str) -> String,
    ) -> Vec<ResourceTemplate> {
        first_wins(
            &self.templates,
            |t| &t.uri_template,
            |t, uri_template| ResourceTemplate { uri_template, ..t.clone() },
            allowed,
            alias,
        )
    }

    /// The provider (its index) that listed the URI template `template` first.
    pub fn template_owner(&self, template: &str) -> Option<usize> {
        self.templates.iter().position(|listed| listed.iter().any(|t| t.uri_template == template))
    }

    /// The provider (its index) to ask for `uri`: the one that listed it, else the first
    /// whose template matches it.
    pub fn route(&self, uri: &str) -> Option<usize> {
        if let Some(&owner) = self.owners.get(uri) {
            return Some(owner);
        }
        self.templates.iter().position(|listed| listed.iter().any(|t| t.match_uri(uri).is_some()))
    }
}

/// The items of every provider's listing that `allowed` lets through (given the provider's
/// index and the item's URI, as `key` reads it): each URI under its own name as the first
/// provider let through listed it, and under the name `alias` gives as a later provider
/// listed it (`rename` makes that item), so that none is out of reach. A provider listing
/// one URI twice lists it once.
fn first_wins<T: Clone>(
    listings: &[Vec<T>],
    key: impl Fn(&T) -> &String,
    rename: impl Fn(&T, String) -> T,
    allowed: &dyn Fn(usize, &str) -> bool,
    alias: &dyn Fn(usize, &str) -> String,
) -> Vec<T> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, listed) in listings.iter().enumerate() {
        let mut own = HashSet::new();
        for item in listed.iter().filter(|item| allowed(i, key(item))) {
            let uri = key(item);
            if !own.insert(uri) {
                continue;
            }
            if seen.insert(uri) {
                out.push(item.clone());
            } else {
                out.push(rename(item, alias(i, uri)));
            }
        }
    }
    out
}

/// Fresh listings over previous ones, provider by provider.
fn merge_listings<T: Clone>(previous: &[Vec<T>], fresh: Vec<Option<Vec<T>>>) -> Vec<Vec<T>> {
    fresh
        .into_iter()
        .enumerate()
        .map(|(i, f)| f.or_else(|| previous.get(i).cloned()).unwrap_or_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(uri: &str, name: &str) -> ResourceSpec {
        ResourceSpec::new(uri, name, "d")
    }

    fn alias(i: usize, uri: &str) -> String {
        format!("toolmux://p{i}/{uri}")
    }

    #[test]
    fn first_lister_of_a_uri_owns_it() {
        let catalog = ResourceCatalog::default().with_resources(
            &[],
            vec![
                Some(vec![resource("a://1", "one"), resource("a://1", "again")]),
                Some(vec![resource("a://1", "other"), resource("b://2", "two")]),
            ],
        );
        let listed: Vec<(String, String)> = catalog
            .resources_where(&|_, _| true, &alias)
            .into_iter()
            .map(|r| (r.uri, r.name))
            .collect();
        let pair = |uri: &str, name: &str| (uri.to_owned(), name.to_owned());
        // The second lister's is listed too, under an alias, so that it can be read.
        assert_eq!(
            listed,
            [pair("a://1", "one"), pair("toolmux://p1/a://1", "other"), pair("b://2", "two")]
        );
        assert!(catalog.shadowed(1, "a://1") && !catalog.shadowed(0, "a://1"));
        assert!(!catalog.shadowed(1, "b://2"));
        assert_eq!(catalog.route("a://1"), Some(0));
        assert_eq!(catalog.route("b://2"), Some(1));
        assert_eq!(catalog.route("c://3"), None);
    }

    #[test]
    fn a_uri_let_through_only_from_a_later_provider_is_listed_as_that_one_lists_it() {
        let catalog = ResourceCatalog::default().with_resources(
            &[],
            vec![Some(vec![resource("a://1", "first")]), Some(vec![resource("a://1", "second")])],
        );
        let listed = catalog.resources_where(&|i, uri| i == 1 && uri == "a://1", &alias);
        let names: Vec<String> = listed.into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["second"]);
        let templates = catalog.with_templates(vec![
            Some(vec![ResourceTemplate::new("x://{id}", "x", "d")]),
            Some(vec![ResourceTemplate::new("y://{id}", "y", "d")]),
        ]);
        let listed = templates.templates_where(&|_, t| t.starts_with('y'), &|_, t| t.to_owned());
        assert_eq!(listed.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["y"]);
    }

    #[test]
    fn failed_listings_keep_the_previous_one() {
        let first = ResourceCatalog::default()
            .with_resources(&[], vec![Some(vec![resource("a://1", "one")]), Some(vec![])]);
        let second = first.with_resources(&[], vec![None, Some(vec![resource("b://2", "two")])]);
        assert_eq!(second.resources_where(&|_, _| true, &alias).len(), 2);
    }

    #[test]
    fn templates_route_what_nobody_listed() {
        let catalog = ResourceCatalog::default()
            .with_resources(&[], vec![Some(vec![]), Some(vec![resource("x://1", "x")])])
            .with_templates(vec![
                Some(vec![ResourceTemplate::new("x://{id}", "x", "d")]),
                Some(vec![ResourceTemplate::new("y://{id}", "y", "d")]),
            ]);
        // The listed URI wins over the earlier provider's matching template.
        assert_eq!(catalog.route("x://1"), Some(1));
        assert_eq!(catalog.route("x://2"), Some(0));
        assert_eq!(catalog.route("y://2"), Some(1));
        assert_eq!(catalog.route("x://a/b"), None);
    }
}
