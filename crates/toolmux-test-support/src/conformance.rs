//! The shared provider conformance suite: what every [`ToolProvider`] must do, checked the
//! same way for builtin tools, MCP servers, REST APIs and agents.
//!
//! [`Conformance::check`] panics with a list of every failed rule, so a provider's test is
//! one call.

use serde_json::{Value, json};
use std::time::Duration;
use toolmux_core::{CallContext, ToolError, ToolProvider, naming};

/// One call the suite makes, with what it expects back.
#[derive(Debug, Clone)]
pub struct SampleCall {
    /// Provider-local tool name.
    pub tool: String,
    /// Arguments.
    pub arguments: Value,
    /// A substring the output text must contain.
    pub expect_text: Option<String>,
    /// Whether the call must fail (an `Err` or an output with `is_error`).
    pub expect_failure: bool,
}

impl SampleCall {
    /// A call that must succeed.
    pub fn new(tool: &str, arguments: Value) -> Self {
        SampleCall { tool: tool.into(), arguments, expect_text: None, expect_failure: false }
    }

    /// The output text must contain `text`.
    pub fn expect_text_contains(mut self, text: &str) -> Self {
        self.expect_text = Some(text.into());
        self
    }

    /// The call must fail (error or error output); `expect_text` then applies to the message.
    pub fn expect_failure(mut self) -> Self {
        self.expect_failure = true;
        self
    }
}

/// The rules to check, and the sample calls to make.
#[derive(Debug, Clone)]
pub struct Conformance {
    samples: Vec<SampleCall>,
    slow_call: Option<SampleCall>,
    budget: usize,
    call_timeout: Duration,
}

impl Default for Conformance {
    fn default() -> Self {
        Conformance {
            samples: Vec::new(),
            slow_call: None,
            budget: naming::DEFAULT_BUDGET,
            call_timeout: Duration::from_secs(30),
        }
    }
}

impl Conformance {
    /// The suite with no sample calls.
    pub fn new() -> Self {
        Conformance::default()
    }

    /// Adds a sample call.
    pub fn with_sample(mut self, call: SampleCall) -> Self {
        self.samples.push(call);
        self
    }

    /// A call that runs long enough to be cancelled (a sleep, a slow request): the suite
    /// cancels it after 100 ms and expects it to end within 5 s.
    pub fn with_cancellable(mut self, call: SampleCall) -> Self {
        self.slow_call = Some(call);
        self
    }

    /// How long one sample call may take before it counts as hung (default 30 s).
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Runs every rule against `provider`; panics listing every failure.
    pub async fn check(&self, provider: &dyn ToolProvider) {
        let failures = self.failures(provider).await;
        assert!(
            failures.is_empty(),
            "provider `{}` fails conformance:\n- {}",
            provider.namespace(),
            failures.join("\n- ")
        );
    }

    /// Runs every rule and returns the failures.
    pub async fn failures(&self, provider: &dyn ToolProvider) -> Vec<String> {
        let mut failures = Vec::new();
        let namespace = provider.namespace().to_owned();
        if let Err(e) = naming::validate_namespace(&namespace) {
            failures.push(e.to_string());
        }
        if let Err(e) = provider.warmup().await {
            failures.push(format!("warmup failed: {}", e.report()));
            return failures;
        }
        if let Err(e) = provider.warmup().await {
            failures.push(format!("a second warmup failed (must be idempotent): {}", e.report()));
        }
        let _ = provider.instructions();
        let tools = match provider.list_tools().await {
            Ok(tools) => tools,
            Err(e) => {
                failures.push(format!("list_tools failed: {}", e.report()));
                return failures;
            }
        };
        if tools.is_empty() {
            failures.push("list_tools returned no tools".into());
        }
        let mut seen = std::collections::HashSet::new();
        for tool in &tools {
            if !seen.insert(tool.name.clone()) {
                failures.push(format!("tool `{}` listed twice", tool.name));
            }
            if tool.name.is_empty() {
                failures.push("a tool has an empty name".into());
            }
            if tool.description.trim().is_empty() {
                failures.push(format!("tool `{}` has no description", tool.name));
            }
            check_schema(&tool.name, &tool.input_schema, &mut failures);
            if !provider.has_tool(&tool.name).await {
                failures.push(format!("has_tool(`{}`) is false for a listed tool", tool.name));
            }
        }
        if let Err(e) =
            naming::qualify_all(&namespace, tools.iter().map(|t| t.name.as_str()), self.budget)
        {
            failures.push(format!("tool names cannot be qualified: {e}"));
        }
        let missing = "no_such_tool_for_conformance";
        if provider.has_tool(missing).await {
            failures.push(format!("has_tool(`{missing}`) is true"));
        }
        match tokio::time::timeout(
            self.call_timeout,
            provider.call(missing, json!({}), &CallContext::new()),
        )
        .await
        {
            Ok(Ok(out)) if !out.is_error => {
                failures.push(format!("calling unknown tool `{missing}` succeeded"));
            }
            Ok(_) => {}
            Err(_) => failures.push(format!("calling unknown tool `{missing}` hung")),
        }
        for sample in &self.samples {
            self.check_sample(provider, sample, &mut failures).await;
        }
        if let Some(slow) = &self.slow_call {
            check_cancellation(provider, slow, &mut failures).await;
        }
        failures
    }

    async fn check_sample(
        &self,
        provider: &dyn ToolProvider,
        sample: &SampleCall,
        failures: &mut Vec<String>,
    ) {
        let ctx = CallContext::new();
        let outcome = tokio::time::timeout(
            self.call_timeout,
            provider.call(&sample.tool, sample.arguments.clone(), &ctx),
        )
        .await;
        let (failed, text) = match outcome {
            Err(_) => {
                failures
                    .push(format!("call to `{}` hung past {:?}", sample.tool, self.call_timeout));
                return;
            }
            Ok(Ok(out)) => (out.is_error, out.to_text()),
            Ok(Err(e)) => (true, e.report()),
        };
        if failed != sample.expect_failure {
            let wanted = if sample.expect_failure { "fail" } else { "succeed" };
            failures
                .push(format!("call to `{}` should {wanted} but returned: {text}", sample.tool));
        }
        if let Some(expected) = sample.expect_text.as_deref().filter(|e| !text.contains(e)) {
            failures.push(format!(
                "call to `{}` should contain `{expected}` but returned: {text}",
                sample.tool
            ));
        }
    }
}

async fn check_cancellation(
    provider: &dyn ToolProvider,
    slow: &SampleCall,
    failures: &mut Vec<String>,
) {
    let ctx = CallContext::new();
    let token = ctx.cancel_token().clone();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        token.cancel();
    });
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(5),
        provider.call(&slow.tool, slow.arguments.clone(), &ctx),
    )
    .await;
    let _ = canceller.await;
    match outcome {
        Err(_) => failures
            .push(format!("call to `{}` did not stop within 5s of being cancelled", slow.tool)),
        Ok(Ok(out)) if !out.is_error => failures.push(format!(
            "cancelled call to `{}` succeeded after {:?} (expected a cancellation error)",
            slow.tool,
            started.elapsed()
        )),
        Ok(Err(ToolError::Cancelled { .. })) | Ok(_) => {}
    }
}

fn check_schema(tool: &str, schema: &Value, failures: &mut Vec<String>) {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        failures.push(format!("tool `{tool}`: input schema is not an object schema: {schema}"));
    }
    if let Err(e) = jsonschema::draft202012::options().build(schema) {
        failures.push(format!("tool `{tool}`: input schema does not compile: {e}"));
    }
}
