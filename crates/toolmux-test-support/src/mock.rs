//! A scriptable [`ToolProvider`] for orchestrator tests: each tool has a [`Behavior`] and the
//! provider counts calls and the greatest number running at once.

use async_trait::async_trait;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toolmux_core::{
    CallContext, ContentPart, Health, Progress, Relayed, ToolAnnotations, ToolError, ToolKind,
    ToolListChanges, ToolListNotifier, ToolOutput, ToolProvider, ToolSpec,
};

/// What a mock tool does when called.
#[derive(Debug, Clone)]
pub enum Behavior {
    /// Returns its arguments as JSON.
    Echo,
    /// Returns this text.
    Text(String),
    /// Returns this output as it is (extras included).
    Output(ToolOutput),
    /// Returns a text of this many bytes (`x` repeated, a newline every 100).
    Big(usize),
    /// Sleeps (cancellable), then returns `"slept"`.
    Sleep(Duration),
    /// Reports progress `steps` times, `interval` apart, then returns `"done"`.
    Progress {
        /// How many reports.
        steps: u32,
        /// Time between reports.
        interval: Duration,
    },
    /// Never returns until cancelled.
    Hang,
    /// Panics.
    Panic,
    /// Returns an output flagged `is_error`.
    ErrorOutput(String),
    /// Fails with a transient transport error the first `times` calls, then echoes.
    FailTransient {
        /// Failures before the first success.
        times: u64,
    },
    /// Fails with a remote error.
    Fail(String),
    /// Returns the call's run id as text.
    RunId,
    /// Reports progress `steps` times, every `interval`, then hangs until cancelled.
    Stall {
        /// Progress reports before it hangs.
        steps: u32,
        /// Time before each.
        interval: Duration,
    },
    /// Returns the call's priority in queues ([`CallContext::priority`]).
    Priority,
    /// Returns how many calls of the tool came before this one, as text (a result that
    /// changes every call).
    Count,
}

#[derive(Debug)]
struct MockTool {
    spec: ToolSpec,
    behavior: Behavior,
    calls: AtomicU64,
}

/// A provider whose tools behave as scripted.
#[derive(Debug)]
pub struct MockProvider {
    namespace: String,
    kind: ToolKind,
    tools: Mutex<Vec<Arc<MockTool>>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    total_calls: AtomicU64,
    warmups: AtomicU64,
    listings: AtomicU64,
    /// Milliseconds a listing takes (the tools are read when it starts).
    list_delay_ms: AtomicU64,
    fail_warmup: Option<String>,
    warmup_delay: Duration,
    shut_down: AtomicBool,
    notifier: ToolListNotifier,
    instructions: Option<String>,
    health: Mutex<Health>,
    state_per_run: bool,
    /// Relays calls ([`ToolProvider::relay`]).
    relay: bool,
    relayed: AtomicU64,
    /// The runs it was told ended ([`ToolProvider::end_run`]), in order.
    ended_runs: Mutex<Vec<String>>,
}

impl MockProvider {
    /// A provider with no tools.
    pub fn new(namespace: &str) -> Self {
        MockProvider {
            namespace: namespace.into(),
            kind: ToolKind::Builtin,
            tools: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            total_calls: AtomicU64::new(0),
            warmups: AtomicU64::new(0),
            listings: AtomicU64::new(0),
            list_delay_ms: AtomicU64::new(0),
            fail_warmup: None,
            warmup_delay: Duration::ZERO,
            shut_down: AtomicBool::new(false),
            notifier: ToolListNotifier::new(),
            instructions: None,
            health: Mutex::new(Health::ok()),
            state_per_run: false,
            relay: false,
            relayed: AtomicU64::new(0),
            ended_runs: Mutex::new(Vec::new()),
        }
    }

    /// Relays calls as an MCP server's connection does ([`ToolProvider::relay`]): a text
    /// output that is no error comes back as the JSON text of an MCP result when it fits in
    /// the size asked for; anything else decoded.
    pub fn with_relay(mut self) -> Self {
        self.relay = true;
        self
    }

    /// How many calls came relayed.
    pub fn relayed_calls(&self) -> u64 {
        self.relayed.load(Ordering::SeqCst)
    }

    /// Says its outputs depend on the calling run ([`ToolProvider::state_per_run`]).
    pub fn with_state_per_run(mut self) -> Self {
        self.state_per_run = true;
        self
    }

    /// Sets the kind reported.
    pub fn with_kind(mut self, kind: ToolKind) -> Self {
        self.kind = kind;
        self
    }

    /// Adds a tool accepting any object.
    pub fn with_tool(self, name: &str, behavior: Behavior) -> Self {
        let spec = ToolSpec::new(name, format!("mock tool {name}"), json!({"type": "object"}));
        self.with_spec(spec, behavior)
    }

    /// Adds a read-only (cacheable) tool accepting any object.
    pub fn with_read_only_tool(self, name: &str, behavior: Behavior) -> Self {
        let spec = ToolSpec::new(name, format!("mock tool {name}"), json!({"type": "object"}))
            .with_annotations(ToolAnnotations::read_only());
        self.with_spec(spec, behavior)
    }

    /// Adds a tool with a full spec.
    pub fn with_spec(self, spec: ToolSpec, behavior: Behavior) -> Self {
        self.lock_tools().push(Arc::new(MockTool { spec, behavior, calls: AtomicU64::new(0) }));
        self
    }

    /// Makes warmup fail with this message.
    pub fn with_failing_warmup(mut self, message: &str) -> Self {
        self.fail_warmup = Some(message.into());
        self
    }

    /// Makes warmup take this long.
    pub fn with_warmup_delay(mut self, delay: Duration) -> Self {
        self.warmup_delay = delay;
        self
    }

    /// Makes the listings that start from now on take `delay`; each returns the tools as
    /// they were when it started.
    pub fn set_list_delay(&self, delay: Duration) {
        self.list_delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Sets instructions.
    pub fn with_instructions(mut self, text: &str) -> Self {
        self.instructions = Some(text.into());
        self
    }

    /// Sets what [`ToolProvider::health`] says from now on.
    pub fn set_health(&self, health: Health) {
        *self.health.lock().unwrap_or_else(|e| e.into_inner()) = health;
    }

    /// Adds a tool at run time and signals the change.
    pub fn add_tool(&self, name: &str, behavior: Behavior) {
        let spec = ToolSpec::new(name, format!("mock tool {name}"), json!({"type": "object"}));
        self.add_spec(spec, behavior);
    }

    /// Adds a tool with a full spec at run time and signals the change.
    pub fn add_spec(&self, spec: ToolSpec, behavior: Behavior) {
        self.lock_tools().push(Arc::new(MockTool { spec, behavior, calls: AtomicU64::new(0) }));
        self.notifier.notify();
    }

    /// The runs it was told ended, in order.
    pub fn ended_runs(&self) -> Vec<String> {
        self.ended_runs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Calls of one tool so far.
    pub fn calls_of(&self, name: &str) -> u64 {
        self.lock_tools()
            .iter()
            .find(|t| t.spec.name == name)
            .map_or(0, |t| t.calls.load(Ordering::SeqCst))
    }

    /// Calls of all tools so far.
    pub fn total_calls(&self) -> u64 {
        self.total_calls.load(Ordering::SeqCst)
    }

    /// Calls running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The greatest number of calls that ran at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Warmups so far.
    pub fn warmups(&self) -> u64 {
        self.warmups.load(Ordering::SeqCst)
    }

    /// How many times its tools were listed.
    pub fn listings(&self) -> u64 {
        self.listings.load(Ordering::SeqCst)
    }

    /// Whether shutdown was called.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    fn lock_tools(&self) -> std::sync::MutexGuard<'_, Vec<Arc<MockTool>>> {
        self.tools.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn tool(&self, name: &str) -> Option<Arc<MockTool>> {
        self.lock_tools().iter().find(|t| t.spec.name == name).cloned()
    }
}

struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl ToolProvider for MockProvider {
    fn kind(&self) -> ToolKind {
        self.kind
    }

    fn state_per_run(&self) -> bool {
        self.state_per_run
    }

    fn end_run(&self, run_id: &str) {
        self.ended_runs.lock().unwrap_or_else(|e| e.into_inner()).push(run_id.to_owned());
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        self.listings.fetch_add(1, Ordering::SeqCst);
        let tools = self.lock_tools().iter().map(|t| t.spec.clone()).collect();
        let delay = self.list_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Ok(tools)
    }

    async fn has_tool(&self, name: &str) -> bool {
        self.tool(name).is_some()
    }

    fn relays(&self, name: &str) -> bool {
        self.relay && self.tool(name).is_some()
    }

    async fn relay(
        &self,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<Relayed, ToolError> {
        self.relayed.fetch_add(1, Ordering::SeqCst);
        let arguments = toolmux_core::parse_arguments(name, arguments)?;
        let output = self.call(name, arguments, ctx).await?;
        let texts: Option<Vec<Value>> = output
            .content
            .iter()
            .map(|part| match part {
                ContentPart::Text { text } => Some(json!({"type": "text", "text": text})),
                _ => None,
            })
            .collect();
        let plain = !output.is_error && output.structured.is_none() && output.extras.is_empty();
        if let Some(texts) = texts.filter(|_| plain) {
            let json = json!({"content": texts}).to_string();
            if json.len() <= raw_max {
                // As a server's connection does: the caller first, then the bookkeeping.
                if let Some(early) = ctx.early_answer() {
                    early.answer(&json);
                }
                return Ok(Relayed::Raw { json: json.into(), is_error: false });
            }
        }
        Ok(Relayed::Output(output))
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.tool(name) else {
            return Err(ToolError::UnknownTool { name: name.into(), suggestions: Vec::new() });
        };
        let nth = tool.calls.fetch_add(1, Ordering::SeqCst);
        self.total_calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let _guard = InFlight(&self.in_flight);
        let cancelled = || ToolError::Cancelled { tool: name.to_owned() };
        match &tool.behavior {
            Behavior::Echo => Ok(ToolOutput::json(arguments)),
            Behavior::Count => Ok(ToolOutput::text(nth.to_string())),
            Behavior::Text(text) => Ok(ToolOutput::text(text.clone())),
            Behavior::Output(output) => Ok(output.clone()),
            Behavior::Big(bytes) => {
                let mut text = String::with_capacity(*bytes);
                for i in 0..*bytes {
                    text.push(if i % 100 == 99 { '\n' } else { 'x' });
                }
                Ok(ToolOutput::text(text))
            }
            Behavior::Sleep(duration) => tokio::select! {
                () = tokio::time::sleep(*duration) => Ok(ToolOutput::text("slept")),
                () = ctx.cancel_token().cancelled() => Err(cancelled()),
            },
            Behavior::Progress { steps, interval } => {
                for step in 1..=*steps {
                    tokio::select! {
                        () = tokio::time::sleep(*interval) => {}
                        () = ctx.cancel_token().cancelled() => return Err(cancelled()),
                    }
                    ctx.report_progress(Progress::new(f64::from(step), Some(f64::from(*steps))));
                }
                Ok(ToolOutput::text("done"))
            }
            Behavior::Hang => {
                ctx.cancel_token().cancelled().await;
                Err(cancelled())
            }
            Behavior::Stall { steps, interval } => {
                for step in 1..=*steps {
                    tokio::select! {
                        () = tokio::time::sleep(*interval) => {}
                        () = ctx.cancel_token().cancelled() => return Err(cancelled()),
                    }
                    ctx.report_progress(Progress::new(f64::from(step), None));
                }
                ctx.cancel_token().cancelled().await;
                Err(cancelled())
            }
            Behavior::Panic => panic!("mock tool {name} panicked on purpose"),
            Behavior::ErrorOutput(text) => Ok(ToolOutput::error(text.clone())),
            Behavior::FailTransient { times } if nth < *times => Err(ToolError::Transport {
                provider: self.namespace.clone(),
                message: format!("connection reset (failure {} of {times})", nth + 1),
                source: None,
            }),
            Behavior::FailTransient { .. } => Ok(ToolOutput::json(arguments)),
            Behavior::Fail(message) => Err(ToolError::remote(name, message.clone())),
            Behavior::RunId => Ok(ToolOutput::text(ctx.run_id())),
            Behavior::Priority => Ok(ToolOutput::text(ctx.priority().to_string())),
        }
    }

    async fn warmup(&self) -> Result<(), ToolError> {
        self.warmups.fetch_add(1, Ordering::SeqCst);
        if !self.warmup_delay.is_zero() {
            tokio::time::sleep(self.warmup_delay).await;
        }
        match &self.fail_warmup {
            Some(message) => Err(ToolError::Unavailable {
                provider: self.namespace.clone(),
                message: message.clone(),
            }),
            None => Ok(()),
        }
    }

    fn instructions(&self) -> Option<String> {
        self.instructions.clone()
    }

    fn health(&self) -> Health {
        self.health.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    async fn shutdown(&self) -> Result<(), ToolError> {
        self.shut_down.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        Some(self.notifier.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{Conformance, SampleCall};

    #[tokio::test]
    async fn mock_provider_conforms() {
        let mock = MockProvider::new("mock")
            .with_tool("echo", Behavior::Echo)
            .with_tool("fail", Behavior::Fail("boom".into()))
            .with_tool("hang", Behavior::Hang);
        Conformance::new()
            .with_sample(SampleCall::new("echo", json!({"a": 1})).expect_text_contains("\"a\":1"))
            .with_sample(
                SampleCall::new("fail", json!({})).expect_failure().expect_text_contains("boom"),
            )
            .with_cancellable(SampleCall::new("hang", json!({})))
            .check(&mock)
            .await;
    }
}
