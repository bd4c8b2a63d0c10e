//! The permission rules over prompts and resources.
//!
//! A prompt is judged by its qualified name (`everything__simple_prompt`), a resource by
//! its provider's namespace and its URI joined like a tool name
//! (`everything__test://static/resource/1`), a resource template by its URI template the
//! same way; all three as read-only tools of no permission class, so `github__*` in
//! `permissions.deny` closes a server's prompts and resources with its tools, `@read`
//! matches them and `@write` does not. Rules on calls read a prompt's arguments, and a
//! resource's `uri` (`everything__*(uri=test://static/*)`). A denied prompt or resource is
//! not listed and cannot be read; an `ask` goes to the caller's approval handler like a
//! tool call's. With no rules, none of this runs.

use super::Orchestrator;
use crate::permission::Permission;
use serde_json::{Value, json};
use toolmux_core::{CallContext, JsonObject, ToolAnnotations, ToolError};

/// What the rules take a prompt or a resource for: it reads, and runs no tool.
fn reading() -> ToolAnnotations {
    ToolAnnotations { read_only: true, ..ToolAnnotations::default() }
}

/// The name the rules judge the resource (or template) `uri` of provider `namespace` by.
pub(super) fn resource_name(namespace: &str, uri: &str) -> String {
    format!("{namespace}__{uri}")
}

impl Orchestrator {
    /// Whether any permission rule is configured.
    pub(super) fn has_rules(&self) -> bool {
        !self.inner.config.permissions.is_empty()
    }

    /// What the rules say of rendering the prompt of qualified name `name` with
    /// `arguments` (`None` arguments: of the prompt in general, as for listing it).
    pub(super) fn prompt_permission(&self, name: &str, arguments: Option<&Value>) -> Permission {
        if !self.has_rules() {
            return Permission::Allow;
        }
        let decided = self.inner.config.permissions.decide_for(name, &reading(), None);
        judged(decided, name, arguments)
    }

    /// What the rules say of reading `uri` (or completing or listing the template `uri`)
    /// from the provider of namespace `namespace` (`listing`: of listing it, where a rule
    /// on calls that might allow it keeps it listed).
    pub(super) fn resource_permission(
        &self,
        namespace: &str,
        uri: &str,
        listing: bool,
    ) -> Permission {
        if !self.has_rules() {
            return Permission::Allow;
        }
        let name = resource_name(namespace, uri);
        let decided = self.inner.config.permissions.decide_for(&name, &reading(), None);
        let arguments = json!({ "uri": uri });
        let permission = judged(decided, &name, (!listing).then_some(&arguments));
        match permission {
            Permission::Deny(reason) => Permission::Deny(format!(
                "{reason} (a resource is judged as `{{namespace}}__{{uri}}`, here `{name}`)"
            )),
            Permission::Ask(reason) => Permission::Ask(format!("{reason} (reading `{uri}`)")),
            other => other,
        }
    }

    /// Whether listing shows the prompt `name` (and completes its arguments).
    pub(super) fn prompt_listed(&self, name: &str) -> bool {
        !matches!(self.prompt_permission(name, None), Permission::Deny(_))
    }

    /// Whether listing shows the resource or template `uri` of provider `namespace`.
    pub(super) fn resource_listed(&self, namespace: &str, uri: &str) -> bool {
        !matches!(self.resource_permission(namespace, uri, true), Permission::Deny(_))
    }

    /// Carries out what the rules say of the prompt `name` rendered with `arguments`.
    pub(super) async fn permit_prompt(
        &self,
        name: &str,
        arguments: &JsonObject,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        if !self.has_rules() {
            return Ok(());
        }
        let arguments = Value::Object(arguments.clone());
        let permission = self.prompt_permission(name, Some(&arguments));
        self.permit(name, &permission, &arguments, ctx).await
    }

    /// Carries out `permission`, what the rules say of reading `uri` from the provider of
    /// namespace `namespace`.
    pub(super) async fn permit_resource(
        &self,
        namespace: &str,
        uri: &str,
        permission: &Permission,
        ctx: &CallContext,
    ) -> Result<(), ToolError> {
        if matches!(permission, Permission::Allow) {
            return Ok(());
        }
        let name = resource_name(namespace, uri);
        self.permit(&name, permission, &json!({ "uri": uri }), ctx).await
    }
}

/// A decision made final for one request: rules on calls judged against `arguments`, or,
/// without them (listing), kept as allowed.
fn judged(decided: Permission, name: &str, arguments: Option<&Value>) -> Permission {
    match (decided, arguments) {
        (Permission::Check(rules), Some(arguments)) => rules.judge(name, arguments, Ok(Vec::new())),
        (Permission::Check(_), None) => Permission::Allow,
        (decided, _) => decided,
    }
}
