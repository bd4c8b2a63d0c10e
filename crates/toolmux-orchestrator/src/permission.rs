//! The permission stage: allow / deny / ask rules on full tool names, with globs.
//!
//! Deny wins over ask, ask over allow. With no allow rule every tool not denied is allowed;
//! with allow rules, a tool matching none of them is denied.

use crate::glob::glob_match;

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

    /// Decides for one tool. The result depends only on the name, so the registry computes it
    /// once per tool.
    pub fn decide(&self, tool: &str) -> Permission {
        if let Some(rule) = self.deny.iter().find(|g| glob_match(g, tool)) {
            return Permission::Deny(format!(
                "denied by rule `permissions.deny: {rule}`; remove the rule to allow it"
            ));
        }
        if let Some(rule) = self.ask.iter().find(|g| glob_match(g, tool)) {
            return Permission::Ask(format!("rule `permissions.ask: {rule}`"));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|g| glob_match(g, tool)) {
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

    #[test]
    fn deny_wins() {
        let rules = PermissionRules::default().allow("fs__*").ask("fs__write").deny("fs__bash");
        assert_eq!(rules.decide("fs__read"), Permission::Allow);
        expect![[
            r#"Deny("denied by rule `permissions.deny: fs__bash`; remove the rule to allow it")"#
        ]]
        .assert_eq(&format!("{:?}", rules.decide("fs__bash")));
        expect![[r#"Ask("rule `permissions.ask: fs__write`")"#]]
            .assert_eq(&format!("{:?}", rules.decide("fs__write")));
        expect![[r#"Deny("not matched by any `permissions.allow` rule; add one to allow it")"#]]
            .assert_eq(&format!("{:?}", rules.decide("github__x")));
    }

    #[test]
    fn no_allow_rules_allow_everything() {
        let rules = PermissionRules::default().deny("*__delete*");
        assert_eq!(rules.decide("github__search"), Permission::Allow);
        assert!(matches!(rules.decide("github__delete_repo"), Permission::Deny(_)));
    }
}
