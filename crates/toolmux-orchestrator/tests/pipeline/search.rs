//! Tool search: deferred tools are not listed, are found by words, and are called through
//! `tools__call` with the whole pipeline applied to the tool called.

use crate::call;
use serde_json::{Value, json};
use std::sync::Arc;
use toolmux_core::{CallContext, ToolCall, ToolProvider, ToolSpec};
use toolmux_orchestrator::search::ToolSearch;
use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, PermissionRules, RunBudgetConfig};
use toolmux_test_support::mock::{Behavior, MockProvider};

fn tool(name: &str, description: &str, properties: Value) -> ToolSpec {
    ToolSpec::new(name, description, json!({"type": "object", "properties": properties}))
}

/// A billing API of several tools, deferred, beside a listed file tool.
async fn start(permissions: PermissionRules) -> Orchestrator {
    start_with(OrchestratorConfig { permissions, ..OrchestratorConfig::default() }).await
}

async fn start_with(config: OrchestratorConfig) -> Orchestrator {
    let billing = MockProvider::new("billing")
        .with_spec(
            tool(
                "create_invoice",
                "Creates an invoice for a customer",
                json!({"customer": {"type": "string"}, "amount": {"type": "integer"}}),
            ),
            Behavior::Echo,
        )
        .with_spec(
            tool("list_invoices", "Lists the invoices of a customer", json!({"customer": {}})),
            Behavior::Text("inv_1, inv_2".into()),
        )
        .with_spec(
            tool("refund_charge", "Refunds a payment", json!({"charge": {"type": "string"}})),
            Behavior::Text("refunded".into()),
        )
        .with_spec(
            tool("delete_customer", "Deletes a customer and their data", json!({"id": {}})),
            Behavior::Text("deleted".into()),
        )
        .with_spec(
            tool("audit_ledger", "Audits the ledger", json!({})).with_annotations(
                toolmux_core::ToolAnnotations { visible: false, ..Default::default() },
            ),
            Behavior::Text("audited".into()),
        );
    let files = MockProvider::new("files").with_tool("read", Behavior::Echo);
    let search = Arc::new(ToolSearch::new());
    let config = OrchestratorConfig { deferred: vec!["billing__*".into()], ..config };
    let orchestrator = crate::start(
        config,
        vec![Arc::new(billing), Arc::new(files), search.clone() as Arc<dyn ToolProvider>],
    )
    .await;
    search.attach(&orchestrator);
    orchestrator
}

#[tokio::test(start_paused = true)]
async fn deferred_tools_are_not_shown_but_found_by_words() {
    let o = start(PermissionRules::default()).await;
    let shown: Vec<String> =
        o.tools().into_iter().filter(|t| t.annotations.visible).map(|t| t.name).collect();
    assert_eq!(shown, ["files__read", "tools__search", "tools__call"]);
    assert_eq!(o.tools().len(), 8, "deferred tools are still registered");

    let names = |query: &str, limit: usize| -> Vec<String> {
        o.search_tools(query, limit, &|_| true).into_iter().map(|t| t.name).collect()
    };
    // Name words count most, then parameters, then the description; prefixes match.
    assert_eq!(
        names("invoices of a customer", 5)[..2],
        ["billing__list_invoices", "billing__create_invoice"]
    );
    assert_eq!(names("refund", 5), ["billing__refund_charge"]);
    assert_eq!(names("payment", 5), ["billing__refund_charge"]);
    assert_eq!(names("billing__delete_customer", 1), ["billing__delete_customer"]);
    assert_eq!(names("customer", 2).len(), 2);
    // Listed tools are not searched; nothing matching is nothing found.
    assert!(names("read", 5).is_empty());
    assert!(names("weather forecast", 5).is_empty());
    // Nor is a tool its provider hides from models.
    assert!(names("audit ledger", 5).is_empty());
    // What a caller may not call is not found for it.
    let only_lists = o.search_tools("invoice", 5, &|name| name.starts_with("billing__list"));
    assert_eq!(only_lists.len(), 1);
    assert!(only_lists[0].annotations.visible, "a found tool is shown");
    assert_eq!(only_lists[0].input_schema["properties"]["customer"], json!({}));

    let found = call(&o, "tools__search", json!({"query": "create an invoice", "limit": 1})).await;
    assert!(found.ok, "{}", found.conversation_text());
    let text = found.conversation_text();
    assert!(text.contains("\"name\": \"billing__create_invoice\""), "{text}");
    assert!(text.contains("\"amount\""), "the input schema is given: {text}");
    assert!(text.contains("tools__call"), "{text}");
    assert_eq!(found.extras["found"], json!(["billing__create_invoice"]));
    let none = call(&o, "tools__search", json!({"query": "weather"})).await;
    assert!(none.ok && none.conversation_text().contains("No tool matches `weather`"));
}

#[tokio::test(start_paused = true)]
async fn a_found_tool_is_called_through_the_whole_pipeline() {
    let o = start(PermissionRules { deny: vec!["billing__delete_*".into()], ..Default::default() })
        .await;
    let arguments = json!({"customer": "acme", "amount": 120});
    let created = call(
        &o,
        "tools__call",
        json!({"name": "billing__create_invoice", "arguments": arguments.clone()}),
    )
    .await;
    assert!(created.ok, "{}", created.conversation_text());
    assert_eq!(serde_json::from_str::<Value>(&created.conversation_text()).unwrap(), arguments);
    // The tool called keeps its own statistics.
    let stats = o.stats().snapshot();
    assert_eq!(stats.tools["billing__create_invoice"].count, 1);

    // Its permissions hold: a denied tool is not found, nor called by its name.
    let found = o.search_tools("delete customer", 5, &|_| true);
    assert!(!found.is_empty() && found.iter().all(|t| t.name != "billing__delete_customer"));
    let denied = call(
        &o,
        "tools__call",
        json!({"name": "billing__delete_customer", "arguments": {"id": 7}}),
    )
    .await;
    assert!(!denied.ok);
    assert!(denied.conversation_text().contains("denied"), "{}", denied.conversation_text());
    // A mistyped name gets the closest names.
    let unknown =
        call(&o, "tools__call", json!({"name": "billing__refund_charges", "arguments": {}})).await;
    assert!(!unknown.ok);
    assert!(
        unknown.conversation_text().contains("billing__refund_charge"),
        "{}",
        unknown.conversation_text()
    );
    // The search tools are not called through themselves, and a name is required.
    let nested = call(&o, "tools__call", json!({"name": "tools__call", "arguments": {}})).await;
    assert!(!nested.ok && nested.conversation_text().contains("directly"));
    let nameless = call(&o, "tools__call", json!({"arguments": {}})).await;
    assert!(!nameless.ok);
    // A deferred tool may still be called by its name.
    let direct = call(&o, "billing__refund_charge", json!({"charge": "ch_1"})).await;
    assert_eq!(direct.conversation_text(), "refunded");
}

#[tokio::test(start_paused = true)]
async fn a_call_passed_on_counts_once_against_the_run_s_budget() {
    let budget = RunBudgetConfig { max_calls: Some(2), ..RunBudgetConfig::default() };
    let o = start_with(OrchestratorConfig { run_budget: budget, ..OrchestratorConfig::default() })
        .await;
    let ctx = CallContext::new().with_run_id("billing-run");
    let refund = || {
        ToolCall::new(
            "tools__call",
            json!({"name": "billing__refund_charge", "arguments": {"charge": "ch_1"}}),
        )
    };
    for _ in 0..2 {
        let done = o.execute(refund(), &ctx).await;
        assert!(done.ok, "{}", done.conversation_text());
    }
    let third = o.execute(refund(), &ctx).await;
    assert!(!third.ok);
    assert!(
        third.conversation_text().contains("at most 2 tool calls"),
        "{}",
        third.conversation_text()
    );
}

#[tokio::test(start_paused = true)]
async fn a_provider_of_very_many_shown_tools_is_warned_about_until_they_are_deferred() {
    let many = || {
        let mut provider = MockProvider::new("huge");
        for i in 0..=toolmux_orchestrator::MANY_TOOLS {
            provider = provider.with_tool(&format!("op_{i}"), Behavior::Echo);
        }
        Arc::new(provider) as Arc<dyn ToolProvider>
    };
    let o = crate::start(OrchestratorConfig::default(), vec![many()]).await;
    let problems = o.warmup().await.problems;
    let warned = problems.iter().find(|p| p.message.contains("provider `huge` shows 101 tools"));
    let warned = warned.unwrap_or_else(|| panic!("{problems:?}"));
    assert_eq!(warned.severity, toolmux_orchestrator::Severity::Warning);
    assert!(warned.message.contains("toolSearch: {defer: ['huge__*']}"), "{}", warned.message);

    let deferred = OrchestratorConfig { deferred: vec!["huge__*".into()], ..Default::default() };
    let o = crate::start(deferred, vec![many()]).await;
    assert!(o.warmup().await.problems.is_empty());
}

/// Records the tools it was asked to approve, and approves them.
#[derive(Debug, Default)]
struct Approvals(std::sync::Mutex<Vec<String>>);

#[async_trait::async_trait]
impl toolmux_core::InteractionHandler for Approvals {
    async fn approve(
        &self,
        request: toolmux_core::ApprovalRequest,
    ) -> toolmux_core::ApprovalDecision {
        self.0.lock().expect("not poisoned").push(request.tool);
        toolmux_core::ApprovalDecision::Allow
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_passed_on_is_approved_once_as_the_tool_it_calls() {
    let o = start(PermissionRules { ask: vec!["*".into()], ..Default::default() }).await;
    let approvals = Arc::new(Approvals::default());
    let ctx = CallContext::new().with_handler(approvals.clone());
    let call = ToolCall::new(
        "tools__call",
        json!({"name": "billing__refund_charge", "arguments": {"charge": "ch_1"}}),
    );
    let done = o.execute(call, &ctx).await;
    assert!(done.ok, "{}", done.conversation_text());
    assert_eq!(*approvals.0.lock().expect("not poisoned"), ["billing__refund_charge"]);
    // A rule that denies `tools__call` itself still holds.
    let o = start(PermissionRules { deny: vec!["tools__call".into()], ..Default::default() }).await;
    let call = ToolCall::new("tools__call", json!({"name": "billing__refund_charge"}));
    assert!(!o.execute(call, &ctx).await.ok);
}

/// Through a view (a gateway's `--tools`, a key holder's tools), the search finds only
/// what is in view and `tools__call` reaches nothing outside it.
#[tokio::test(start_paused = true)]
async fn a_view_keeps_the_search_and_its_calls_in_view() {
    use toolmux_orchestrator::FilteredView;
    let o = start(PermissionRules::default()).await;
    let view = FilteredView::new(o.clone(), vec!["billing__*invoice*".into(), "tools__*".into()]);
    let ctx = CallContext::new();
    let found = view.call("tools__search", json!({"query": "customer", "limit": 10}), &ctx).await;
    let found = found.expect("a search");
    let names = found.extras["found"].as_array().expect("names").clone();
    assert!(!names.is_empty(), "{found:?}");
    assert!(names.iter().all(|n| n.as_str().is_some_and(|n| n.contains("invoice"))), "{names:?}");
    assert!(!found.to_text().contains("delete_customer"), "{}", found.to_text());

    let outside = view
        .call(
            "tools__call",
            json!({"name": "billing__delete_customer", "arguments": {"id": 7}}),
            &ctx,
        )
        .await;
    let err = outside.expect_err("outside the view");
    assert_eq!(err.to_string(), "unknown tool `billing__delete_customer`");
    // Relayed (as `toolmux serve` calls), the same checks.
    let outside = r#"{"name": "billing__delete_customer", "arguments": {"id": 7}}"#;
    let err = view.relay("tools__call", outside, &ctx, usize::MAX).await;
    assert_eq!(err.expect_err("outside").to_string(), "unknown tool `billing__delete_customer`");
    let listed = json!({"name": "files__read", "arguments": {}});
    assert!(
        view.call("tools__call", listed, &ctx).await.is_err(),
        "a listed tool outside the view"
    );
    let inside = view
        .call(
            "tools__call",
            json!({"name": "billing__list_invoices", "arguments": {"customer": "acme"}}),
            &ctx,
        )
        .await
        .expect("in view");
    assert_eq!(inside.to_text(), "inv_1, inv_2");
}
