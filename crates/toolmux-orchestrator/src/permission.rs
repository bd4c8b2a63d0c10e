//! The permission stage: allow / deny / ask rules on full tool names, with globs, or on
//! what tools are, with selectors (`@write`, `@destructive`).
//!
//! Deny wins over ask, ask over allow. With no allow rule every tool not denied is allowed;
//! with allow rules, a tool matching none of them is denied.

use crate::glob::glob_match;
use toolmux_core::{PermissionClass, ToolAnnotations};

/// The selectors a rule may give instead of a glob, each with what it matches.
pub const SELECTORS: &[(&str, &str)] = &[
    ("@readOnly", "tools annotated read-only"),
    ("@destructive", "tools that may destroy data (annotated destructive, not read-only)"),
    ("@openWorld", "tools annotated as reaching beyond the machine"),
    ("@read", "tools of permission class read, or read-only tools of no class"),
    ("@write", "tools of permission class write, or tools of no class that are not read-only"),
    ("@execute", "tools of permission class execute (they run programs)"),
    ("@network", "tools of permission class network, or open-world tools of no class"),
];

/// Whether `rule` (a glob over full names, or a selector of [`SELECTORS`]) matches the
/// tool `tool` with annotations `a`.
pub fn rule_matches(rule: &str, tool: &str, a: &ToolAnnotations) -> bool {
    let Some(selector) = rule.strip_prefix('@') else { return glob_match(rule, tool) };
    let class = a.permission;
    match selector {
        "readOnly" => a.read_only,
        "destructive" => a.destructive && !a.read_only,
        "openWorld" => a.open_world,
        "read" => class == Some(PermissionClass::Read) || (class.is_none() && a.read_only),
        "write" => class == Some(PermissionClass::Write) || (class.is_none() && !a.read_only),
        "execute" => class == Some(PermissionClass::Execute),
        "network" => class == Some(PermissionClass::Network) || (class.is_none() && a.open_world),
        _ => false,
    }
}

/// Refuses a rule of `rules` that looks like a selector (`@…`) but is none of
/// [`SELECTORS`], naming it and the selectors.
pub fn check_selectors(rules: &[String]) -> Result<(), String> {
    for rule in rules.iter().filter(|r| r.starts_with('@')) {
        if !SELECTORS.iter().any(|(s, _)| s == rule) {
            let known: Vec<&str> = SELECTORS.iter().map(|(s, _)| *s).collect();
            return Err(format!(
                "unknown selector `{rule}`; the selectors are {}",
                known.join(", ")
            ));
        }
    }
    Ok(())
}

/// The rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermissionRules {
    /// Globs of tools that may run; empty means all.
    pub allow: Vec<String>,
    /// Globs of tools that never run.
    pub deny: Vec<String>,
    /// Globs of tools that run only after approval.
    pub ask: Vec<String>,
}

/// What the rules say of one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    /// Run it.
    Allow,
    /// Refuse it; the text says which rule and how to allow it.
    Deny(String),
    /// Ask the context's approval handler; the text names the rule.
    Ask(String),
}

impl PermissionRules {
    /// Adds a deny glob.
    pub fn deny(mut self, glob: &str) -> Self {
        self.deny.push(glob.to_owned());
        self
    }

    /// Adds an allow glob.
    pub fn allow(mut self, glob: &str) -> Self {
        self.allow.push(glob.to_owned());
        self
    }

    /// Adds an ask glob.
    pub fn ask(mut self, glob: &str) -> Self {
        self.ask.push(glob.to_owned());
        self
    }

    /// The first rule that is neither a glob nor a known selector, with what is wrong.
    pub fn check(&self) -> Result<(), String> {
        let lists = [("allow", &self.allow), ("deny", &self.deny), ("ask", &self.ask)];
        for (list, rules) in lists {
            check_selectors(rules).map_err(|e| format!("permissions.{list}: {e}"))?;
        }
        Ok(())
    }

    /// Decides for one tool, by its full name and what its annotations (as configuration
    /// has them) say it is. The result depends only on those, so the registry computes it
    /// once per tool.
    pub fn decide(&self, tool: &str, annotations: &ToolAnnotations) -> Permission {
        let matching = |rules: &[String]| -> Option<String> {
            rules.iter().find(|r| rule_matches(r, tool, annotations)).cloned()
        };
        if let Some(rule) = matching(&self.deny) {
            return Permission::Deny(format!(
                "denied by rule `permissions.deny: {rule}`; remove the rule to allow it"
            ));
        }
        if let Some(rule) = matching(&self.ask) {
            return Permission::Ask(format!("rule `permissions.ask: {rule}`"));
        }
        if !self.allow.is_empty() && matching(&self.allow).is_none() {
            return Permission::Deny(
                "not matched by any `permissions.allow` rule; add one to allow it".to_owned(),
            );
        }
        Permission::Allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn any() -> ToolAnnotations {
        ToolAnnotations::default()
    }

    #[test]
    fn deny_wins() {
        let rules = PermissionRules::default().allow("fs__*").ask("fs__write").deny("fs__bash");
        assert_eq!(rules.decide("fs__read", &any()), Permission::Allow);
        expect![[
            r#"Deny("denied by rule `permissions.deny: fs__bash`; remove the rule to allow it")"#
        ]]
        .assert_eq(&format!("{:?}", rules.decide("fs__bash", &any())));
        expect![[r#"Ask("rule `permissions.ask: fs__write`")"#]]
            .assert_eq(&format!("{:?}", rules.decide("fs__write", &any())));
        expect![[r#"Deny("not matched by any `permissions.allow` rule; add one to allow it")"#]]
            .assert_eq(&format!("{:?}", rules.decide("github__x", &any())));
    }

    #[test]
    fn no_allow_rules_allow_everything() {
        let rules = PermissionRules::default().deny("*__delete*");
        assert_eq!(rules.decide("github__search", &any()), Permission::Allow);
        assert!(matches!(rules.decide("github__delete_repo", &any()), Permission::Deny(_)));
    }

    /// Selectors match what a tool is, whoever provides it: a class when the provider gives
    /// one, else the annotations.
    #[test]
    fn selectors_match_what_tools_are() {
        let class = |c| ToolAnnotations { permission: Some(c), ..ToolAnnotations::read_only() };
        let reader = ToolAnnotations::read_only();
        let mcp = ToolAnnotations::default(); // not read-only, open world, no class
        let destroyer = ToolAnnotations { destructive: true, open_world: false, ..any() };
        let cases: &[(&str, &ToolAnnotations, bool)] = &[
            ("@readOnly", &reader, true),
            ("@readOnly", &mcp, false),
            ("@read", &reader, true),
            ("@read", &class(PermissionClass::Execute), false),
            ("@write", &mcp, true),
            ("@write", &reader, false),
            ("@write", &class(PermissionClass::Write), true),
            ("@execute", &class(PermissionClass::Execute), true),
            ("@execute", &mcp, false),
            ("@network", &mcp, true),
            ("@network", &class(PermissionClass::Network), true),
            ("@network", &class(PermissionClass::Read), false),
            ("@destructive", &destroyer, true),
            ("@destructive", &mcp, false),
            ("@openWorld", &mcp, true),
            ("@openWorld", &destroyer, false),
        ];
        for (rule, annotations, matched) in cases {
            let rules = PermissionRules::default().deny(rule);
            let denied = matches!(rules.decide("x__y", annotations), Permission::Deny(_));
            assert_eq!(denied, *matched, "{rule} on {annotations:?}");
        }
        let rules = PermissionRules::default().allow("@read").ask("@write");
        assert_eq!(rules.decide("a__b", &reader), Permission::Allow);
        assert_eq!(
            rules.decide("a__c", &mcp),
            Permission::Ask("rule `permissions.ask: @write`".into())
        );
        assert!(rules.check().is_ok());
        expect!["permissions.ask: unknown selector `@writes`; the selectors are @readOnly, @destructive, @openWorld, @read, @write, @execute, @network"]
            .assert_eq(&PermissionRules::default().ask("@writes").check().unwrap_err());
    }
}
