//! Agents on toolmux: a model that calls the orchestrator's tools until it delivers a
//! final report.
//!
//! [`Agents`] holds the configured agents ([`AgentConfig`]: a model, instructions, the
//! tools it may call as glob patterns, the agents it may delegate to, a turn limit) and
//! the [`Model`]s they think with. Attached to an [`Orchestrator`], it runs them:
//!
//! - [`Agents::run`] works on a task with one agent and returns its [`AgentReport`].
//! - With [`RunOptions::pause`], a call that needs approval pauses the run instead of
//!   asking: the report (status [`AgentStatus::Paused`]) lists the calls that wait and holds
//!   the conversation, and [`Agents::resume`] goes on with a [`Decision`] for each, in this
//!   process or another (see the `pause` module's notes in the source).
//! - [`Agents::provider`] is a [`ToolProvider`] (namespace `agent`) offering every agent as
//!   a tool `agent__{name}` taking `{prompt}`: registered in the orchestrator, agents call
//!   other agents through the same pipeline as any tool (queues, timeouts, accounting),
//!   and `toolmux serve` offers them to MCP clients. The sub-agent's tokens and calls are
//!   added to its caller's report; a chain of agents deeper than the configured depth is
//!   refused with a message telling the model to do the work itself.
//!
//! Besides the orchestrator's tools, a session offers its model its own: the loop-breaking
//! `agent__final_report` (always), `agent__task_status`, `agent__batch` and
//! `agent__ask_user` (when configured) and `router__handoff-to` (when `router.destinations`
//! names other agents), which hands the whole run to another agent. A plain text answer
//! without tool calls also ends the run (a conversational turn); a tool whose spec is
//! marked `ends_turn` ends it with its result. On the last allowed turn the model may only
//! report.
//!
//! While calls of asynchronous external tools are pending, the session gives the model
//! what arrived in the run's inbox before each turn. The inbox gives each result once:
//! a report (or plain answer) before all reached the model gets another turn, and results
//! a run ends without reading leave in [`AgentReport::unread_results`].
//!
//! ```no_run
//! # async fn example(orchestrator: toolmux_orchestrator::Orchestrator, models: std::collections::BTreeMap<String, std::sync::Arc<dyn toolmux_llm::Model>>) -> Result<(), toolmux_agent::AgentError> {
//! use toolmux_agent::{AgentConfig, AgentDefinitions, Agents};
//! use toolmux_core::CallContext;
//!
//! let mut definitions = AgentDefinitions::default();
//! definitions.agents.insert(
//!     "reader".into(),
//!     AgentConfig { model: "fast".into(), tools: Some(vec!["fs__*".into()]), ..Default::default() },
//! );
//! let agents = Agents::new(definitions, models)?;
//! agents.attach(&orchestrator);
//! let report = agents.run("reader", "What does README.md say about tests?", &CallContext::new()).await?;
//! println!("{}", report.content);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod config;
mod error;
mod handler;
mod hooks;
mod inbox;
pub mod internal;
mod listen;
mod pause;
mod report;
mod session;

pub use config::{
    AgentConfig, DEFAULT_MAX_CALLS_PER_TURN, DEFAULT_MAX_DEPTH, DEFAULT_MAX_TURNS, MAX_HANDOFFS,
    RouterConfig,
};
pub use error::AgentError;
pub use hooks::{AgentHooks, HookCommand};
pub use listen::{ListenEnd, ListenOptions};
pub use pause::{Decision, PendingCall};
pub use report::{AgentReport, AgentStatus};

use async_trait::async_trait;
use handler::{AgentHandler, Approvals};
use pause::Resume;
use serde_json::{Value, json};
use session::{Session, SessionEnd};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use toolmux_core::{
    CallContext, Op, ToolAnnotations, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec,
};
use toolmux_llm::Model;
use toolmux_orchestrator::{Orchestrator, WeakOrchestrator};

/// The namespace of the agents' tools.
pub const NAMESPACE: &str = "agent";

/// The agents of a configuration.
#[derive(Debug, Clone, Default)]
pub struct AgentDefinitions {
    /// The agents, by name.
    pub agents: BTreeMap<String, AgentConfig>,
    /// Hand-offs between them.
    pub router: Option<RouterConfig>,
    /// How deep agents may call agents (default [`DEFAULT_MAX_DEPTH`]).
    pub max_depth: Option<usize>,
    /// Command hooks of the agents' loop (`SessionStart`, `UserPromptSubmit`, `Stop`,
    /// `SubagentStop`), with Claude Code's contract.
    pub hooks: Arc<AgentHooks>,
}

/// How one run is made.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Keep the last agent's conversation in the report.
    pub transcript: bool,
    /// Receives the text the run's agents (the one started and those it hands off to,
    /// not sub-agents) write, as their models write it. With it, answers are streamed.
    pub on_text: Option<TextSink>,
    /// The conversation so far, before the task: a chat's earlier turns (the `transcript`
    /// of the last run's report). Calls it ends with that have no results (the report a
    /// run ended with) are answered as done.
    pub history: Vec<toolmux_llm::Message>,
    /// Calls of the agent that need approval pause the run instead of asking anybody: it
    /// ends with status [`AgentStatus::Paused`] and the waiting calls, for
    /// [`Agents::resume`]. Calls inside `agent__batch` or a sub-agent cannot wait, and are
    /// refused with a message telling the model to make the call on its own.
    pub pause: bool,
}

/// More of what an agent's model writes, for a [`TextSink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TextDelta<'a> {
    /// The next fragment of the answer's text.
    Text(&'a str),
    /// The model's answer starts over (its request was tried again): the text of this
    /// turn so far is void.
    Restart,
}

/// What receives an agent's text as it is written: the agent's name and the delta, on the
/// task that runs the agent (keep it quick).
///
/// ```
/// use toolmux_agent::{TextDelta, TextSink};
///
/// let sink = TextSink::new(|agent, delta| {
///     if let TextDelta::Text(text) = delta {
///         eprint!("{agent}: {text}");
///     }
/// });
/// sink.send("writer", TextDelta::Text("Hello"));
/// ```
#[derive(Clone)]
pub struct TextSink(Arc<ReceiveText>);

/// The function behind a [`TextSink`].
type ReceiveText = dyn Fn(&str, TextDelta<'_>) + Send + Sync;

impl TextSink {
    /// A sink calling `receive` with each agent's name and delta.
    pub fn new(receive: impl Fn(&str, TextDelta<'_>) + Send + Sync + 'static) -> Self {
        TextSink(Arc::new(receive))
    }

    /// Hands `delta` of agent `agent` to the sink.
    pub fn send(&self, agent: &str, delta: TextDelta<'_>) {
        (self.0)(agent, delta);
    }
}

impl std::fmt::Debug for TextSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TextSink(..)")
    }
}

/// Configured agents and their models; see the crate documentation.
#[derive(Debug, Clone)]
pub struct Agents {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    definitions: AgentDefinitions,
    models: BTreeMap<String, Arc<dyn Model>>,
    orchestrator: RwLock<WeakOrchestrator>,
    /// The tokens left to each running session with a `tokenBudget`, by its operation's id:
    /// the agents it calls get no more ([`session::Budgets`]).
    budgets: session::Budgets,
    /// The figures of sub-agents' runs, for the sessions that called them.
    sub_figures: Arc<session::SubFigures>,
}

impl Agents {
    /// The agents of `definitions` with `models` by name. Each agent's model and sub-agents
    /// must exist, its name must be a valid tool name and not one of the session's own
    /// tools (`final_report`, `batch`, ...), and router destinations must be agents.
    pub fn new(
        definitions: AgentDefinitions,
        models: BTreeMap<String, Arc<dyn Model>>,
    ) -> Result<Self, AgentError> {
        validate(&definitions, &models)?;
        Ok(Agents {
            inner: Arc::new(Inner {
                definitions,
                models,
                orchestrator: RwLock::new(WeakOrchestrator::default()),
                budgets: session::Budgets::default(),
                sub_figures: Arc::default(),
            }),
        })
    }

    /// Runs the agents' tool calls through `orchestrator` (without keeping it alive).
    pub fn attach(&self, orchestrator: &Orchestrator) {
        *self.inner.orchestrator.write().unwrap_or_else(|e| e.into_inner()) =
            orchestrator.downgrade();
    }

    /// The configured agents' names.
    pub fn names(&self) -> Vec<String> {
        self.inner.definitions.agents.keys().cloned().collect()
    }

    /// The configuration of agent `name`.
    pub fn config(&self, name: &str) -> Option<&AgentConfig> {
        self.inner.definitions.agents.get(name)
    }

    /// The tools `agent__{name}` of the agents that are exposed, to register in the
    /// orchestrator.
    pub fn provider(&self) -> Arc<dyn ToolProvider> {
        Arc::new(AgentProvider { agents: self.clone() })
    }

    /// Works on `task` with agent `name`, following hand-offs, until a report.
    pub async fn run(
        &self,
        name: &str,
        task: &str,
        ctx: &CallContext,
    ) -> Result<AgentReport, AgentError> {
        self.run_with(name, task, ctx, &RunOptions::default()).await
    }

    /// [`Agents::run`] with `options`.
    pub async fn run_with(
        &self,
        name: &str,
        task: &str,
        ctx: &CallContext,
        options: &RunOptions,
    ) -> Result<AgentReport, AgentError> {
        if !self.inner.definitions.agents.contains_key(name) {
            return Err(self.unknown(name));
        }
        let op = Op::new(format!("{NAMESPACE}__{name}"), ctx.op().cloned());
        self.run_from(name, task, &ctx.clone().with_op(op), options, None).await
    }

    /// Goes on with the run `paused` (a report of status [`AgentStatus::Paused`]) with a
    /// [`Decision`] for each call that waits, by its call id. Calls left without a decision
    /// keep the run paused (the report then lists them); an approved call is checked by the
    /// orchestrator's rules as any call is when it runs. `options.history` is ignored (the
    /// paused report's conversation is the history); with `options.pause`, calls that ask
    /// later pause the run again.
    ///
    /// ```no_run
    /// # async fn example(agents: toolmux_agent::Agents, report: toolmux_agent::AgentReport) -> Result<(), toolmux_agent::AgentError> {
    /// use toolmux_agent::{AgentStatus, Decision, RunOptions};
    /// use toolmux_core::CallContext;
    ///
    /// let options = RunOptions { pause: true, ..RunOptions::default() };
    /// if report.status == AgentStatus::Paused {
    ///     let decisions = report.pending.iter().map(|p| (p.call_id.clone(), Decision::approve())).collect();
    ///     let report = agents.resume(&report, decisions, &CallContext::new(), &options).await?;
    ///     println!("{}", report.content);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn resume(
        &self,
        paused: &AgentReport,
        decisions: BTreeMap<String, Decision>,
        ctx: &CallContext,
        options: &RunOptions,
    ) -> Result<AgentReport, AgentError> {
        if paused.status != AgentStatus::Paused {
            return Err(AgentError::Resume(format!(
                "the run is not paused (its status is `{}`); only a paused run's report resumes",
                paused.status.as_str()
            )));
        }
        if paused.transcript.is_empty() {
            return Err(AgentError::Resume(
                "the paused report has no conversation (`transcript`) to go on from".into(),
            ));
        }
        let waiting: Vec<&str> = paused.pending.iter().map(|p| p.call_id.as_str()).collect();
        if let Some(id) = decisions.keys().find(|id| !waiting.contains(&id.as_str())) {
            return Err(AgentError::Resume(format!(
                "no call `{id}` waits for a decision; the calls that wait: {}",
                if waiting.is_empty() { "none".to_owned() } else { waiting.join(", ") }
            )));
        }
        if let Some(question) = paused.pending.iter().find(|p| {
            p.question.is_some()
                && matches!(decisions.get(&p.call_id), Some(Decision::Approve { .. }))
        }) {
            return Err(AgentError::Resume(format!(
                "call `{}` is the agent's question, not a call to approve: answer it \
                 (`Decision::Respond`), or refuse to (`Decision::Deny`)",
                question.call_id
            )));
        }
        if let Some(started) = paused.pending.iter().find(|p| {
            p.started && matches!(decisions.get(&p.call_id), Some(Decision::Approve { .. }))
        }) {
            return Err(AgentError::Resume(format!(
                "call `{}` ({}) was approved and started by an earlier resumption that was \
                 interrupted: whether it took effect is unknown, so it is not run again; resume \
                 without deciding it (the agent is told), or say what happened with \
                 `Decision::Respond`",
                started.call_id, started.tool
            )));
        }
        if !self.inner.definitions.agents.contains_key(&paused.agent) {
            return Err(self.unknown(&paused.agent));
        }
        // A call an interrupted resumption started is answered, never run again.
        let mut decisions = decisions;
        for call in paused.pending.iter().filter(|p| p.started) {
            decisions.entry(call.call_id.clone()).or_insert_with(|| Decision::Respond {
                content: pause::started_text(&call.tool),
                is_error: true,
            });
        }
        let resume = Resume {
            pending: paused.pending.clone(),
            decisions,
            turns: paused.turns,
            tool_calls: paused.tool_calls,
            refused_calls: paused.refused_calls,
            usage: paused.usage,
            unread: paused.unread_results.clone(),
            pending_async: usize::try_from(paused.pending_async_calls).unwrap_or(usize::MAX),
            // The report lists the agents the run went through, the paused one last.
            handed: match paused.handoffs.split_last() {
                Some((last, before)) if *last == paused.agent => before.to_vec(),
                _ => Vec::new(),
            },
        };
        let options = RunOptions { history: paused.transcript.clone(), ..options.clone() };
        // A resumed run is the same run: it goes on under the operation it had, the first
        // agent's, which its asynchronous calls, inbox and gateway state (active space,
        // goals, memories) belong to, whichever agent paused it.
        let first = resume.handed.first().unwrap_or(&paused.agent);
        let op = Op::new(format!("{NAMESPACE}__{first}"), ctx.op().cloned());
        let mut ctx = ctx.clone().with_op(op);
        // A context in no run of its own goes on as the paused run, whose inbox holds the
        // results of its asynchronous calls that came while it was paused.
        if let Some(run) = paused.run_id.as_deref().filter(|_| ctx.run_id() == "default") {
            ctx = ctx.with_run_id(run);
        }
        let approvals = (paused.approved.clone(), &resume);
        let task = paused.task.clone().unwrap_or_default();
        self.run_from(&paused.agent, &task, &ctx, &options, Some(approvals)).await
    }

    /// The orchestrator the agents are attached to, while it runs.
    fn orchestrator(&self) -> Option<Orchestrator> {
        self.inner.orchestrator.read().unwrap_or_else(|e| e.into_inner()).upgrade()
    }

    /// The model agent `name` thinks with: its own, else that of the nearest agent before
    /// or above it: the agents that handed the task on (`handed`, in order), then its
    /// callers, nearest first (the seeds' inherited configuration).
    fn model_of<'a>(
        &'a self,
        name: &str,
        config: &'a AgentConfig,
        handed: &[String],
        ctx: &CallContext,
    ) -> Result<&'a str, AgentError> {
        if !config.model.is_empty() {
            return Ok(&config.model);
        }
        let callers = ctx
            .op()
            .into_iter()
            .flat_map(|op| std::iter::once(op.as_ref()).chain(op.ancestors()))
            .filter_map(|op| op.tool().strip_prefix("agent__"));
        let before: Vec<&str> = handed.iter().rev().map(String::as_str).chain(callers).collect();
        let definitions = &self.inner.definitions.agents;
        before
            .into_iter()
            .filter_map(|agent| definitions.get(agent))
            .map(|config| config.model.as_str())
            .find(|model| !model.is_empty())
            .ok_or_else(|| AgentError::Config {
                agent: name.to_owned(),
                message: "it names no `model`, and no agent that called it or handed it the \
                          task names one it could think with: give it `model`, a name under \
                          `models`"
                    .into(),
            })
    }

    fn unknown(&self, name: &str) -> AgentError {
        AgentError::UnknownAgent { name: name.to_owned(), known: self.names() }
    }

    /// Runs agent `name` in `ctx`, whose operation is the agent's; with `resumed` (the
    /// standing approvals and the decisions), its first session goes on with a paused run.
    /// The report comes with the configuration's secrets redacted from what the model
    /// wrote ([`AgentReport::redacted`]).
    async fn run_from(
        &self,
        name: &str,
        task: &str,
        ctx: &CallContext,
        options: &RunOptions,
        resumed: Option<(Vec<String>, &Resume)>,
    ) -> Result<AgentReport, AgentError> {
        let orchestrator = self.orchestrator().ok_or(AgentError::Detached)?;
        let report = self.run_unredacted(&orchestrator, name, task, ctx, options, resumed).await?;
        Ok(report.redacted(orchestrator.redactor()))
    }

    /// [`Agents::run_from`] on `orchestrator`, the report as the sessions made it.
    async fn run_unredacted(
        &self,
        orchestrator: &Orchestrator,
        name: &str,
        task: &str,
        ctx: &CallContext,
        options: &RunOptions,
        resumed: Option<(Vec<String>, &Resume)>,
    ) -> Result<AgentReport, AgentError> {
        let max_depth = self.inner.definitions.max_depth.unwrap_or(DEFAULT_MAX_DEPTH);
        let depth = agent_depth(ctx);
        if depth > max_depth {
            return Ok(AgentReport::failure(
                name,
                format!(
                    "agent depth limit reached ({max_depth} agents deep): `{name}` was not started; \
                     solve the task yourself"
                ),
            ));
        }
        // An agent called with a deadline (as a tool, within `agentTimeout`) ends its run a
        // little before it, so that its report, with the tokens it used, reaches its caller
        // instead of a timeout; the calls it makes are bounded by that earlier end too.
        let ctx = &match ctx.deadline() {
            Some(deadline) => ctx.clone().with_deadline(session::finish_by(deadline)),
            None => ctx.clone(),
        };
        let mut current = name.to_owned();
        let mut path = Vec::new();
        let mut totals = AgentReport::failure(name, String::new());
        let mut task = task.to_owned();
        let (mut standing, mut resume) = match resumed {
            Some((standing, resume)) => (standing, Some(resume)),
            None => (Vec::new(), None),
        };
        let resumed_run = resume.is_some();
        // A resumed run goes on through the agents that handed it the task before it paused.
        if let Some(resume) = &resume {
            path.clone_from(&resume.handed);
        }
        let handed_before = path.len();
        // The run's asynchronous calls whose results had not come at the last hand-off: the
        // run's, not the agent's, so the next agent waits for them as the last would have.
        let mut handed_pending = None;
        loop {
            let config = self
                .inner
                .definitions
                .agents
                .get(&current)
                .ok_or_else(|| self.unknown(&current))?;
            let model_name = self.model_of(&current, config, &path, ctx)?;
            let model =
                self.inner.models.get(model_name).cloned().ok_or_else(|| AgentError::Config {
                    agent: current.clone(),
                    message: format!("unknown model `{model_name}`"),
                })?;
            let destinations = self
                .inner
                .definitions
                .router
                .iter()
                .flat_map(|r| r.destinations.iter())
                .filter(|d| **d != current)
                .cloned()
                .collect();
            // The agent is its tools' MCP client: their sampling requests go to its model.
            let handler = Arc::new(AgentHandler {
                caller: ctx.handler().cloned(),
                model: model.clone(),
                cancel: ctx.cancel_token().clone(),
                used: Mutex::default(),
                // Sampling tokens count for the session that called the agent as they are
                // spent: a run cut before its report still leaves them to its caller.
                spent_for: (self.inner.sub_figures.clone(), ctx.op().cloned()),
                approvals: Approvals::new(options.pause, std::mem::take(&mut standing)),
            });
            // After a hand-off, the next agent starts afresh (a resumed run's conversation
            // is the agent's that paused).
            let history: &[toolmux_llm::Message] =
                if resumed_run && path.len() > handed_before { &[] } else { &options.history };
            // What the agents before it took from the inbox and did not read is the next
            // one's to read: the run's inbox is its too.
            let handed_results = std::mem::take(&mut totals.unread_results);
            let session = Session {
                name: &current,
                config,
                model,
                orchestrator: orchestrator.clone(),
                ctx: match config.priority {
                    Some(priority) => ctx.clone().with_priority(priority),
                    None => ctx.clone(),
                }
                .with_handler(handler.clone()),
                destinations,
                keep_transcript: options.transcript,
                on_text: options.on_text.as_ref(),
                history,
                handler: handler.clone(),
                hooks: &self.inner.definitions.hooks,
                sub: depth > 1,
                may_call_agents: depth < max_depth,
                budgets: &self.inner.budgets,
                sub_figures: &self.inner.sub_figures,
                resume: resume.take(),
                handed: session::Spent { turns: totals.turns, tokens: totals.usage.total() },
                handed_results: &handed_results,
                handed_pending: handed_pending.take(),
            };
            tracing::debug!(target: "toolmux::agent", agent = %current, depth, "session starts");
            let resuming = session.resume.is_some();
            let end = session.run((!resuming).then(|| task.clone())).await;
            standing = handler.approvals.standing();
            totals.usage += handler.used();
            match end {
                SessionEnd::Report(mut report) => {
                    if report.status == AgentStatus::Paused {
                        report.task = Some(task);
                    }
                    report.turns += totals.turns;
                    report.tool_calls += totals.tool_calls;
                    report.refused_calls += totals.refused_calls;
                    report.usage += totals.usage;
                    if !path.is_empty() {
                        path.push(current.clone());
                        report.handoffs = path;
                    }
                    return Ok(report);
                }
                SessionEnd::Handoff { to, message, figures, pending } => {
                    handed_pending = Some(pending);
                    totals.turns += figures.turns;
                    totals.tool_calls += figures.tool_calls;
                    totals.refused_calls += figures.refused_calls;
                    totals.usage += figures.usage;
                    totals.unread_results.extend(figures.unread_results);
                    path.push(current.clone());
                    if path.len() > MAX_HANDOFFS {
                        let mut report = totals;
                        report.agent = current;
                        report.content = format!(
                            "the run was handed off {} times ({}): stopped",
                            path.len(),
                            path.join(" → ")
                        );
                        path.push(to);
                        report.handoffs = path;
                        return Ok(report);
                    }
                    task = match message {
                        Some(message) if !message.trim().is_empty() => format!(
                            "{task}\n\n(Handed over to you by agent `{current}`: {message})"
                        ),
                        _ => format!("{task}\n\n(Handed over to you by agent `{current}`.)"),
                    };
                    tracing::debug!(target: "toolmux::agent", from = %current, %to, "hand-off");
                    current = to;
                }
            }
        }
    }
}

/// How many agents deep `ctx`'s operation is: the agent operations in its chain.
fn agent_depth(ctx: &CallContext) -> usize {
    let Some(op) = ctx.op() else { return 0 };
    let is_agent = |tool: &str| {
        tool.strip_prefix("agent__").is_some_and(|name| !internal::RESERVED.contains(&name))
    };
    std::iter::once(&**op).chain(op.ancestors()).filter(|o| is_agent(o.tool())).count()
}

fn validate(
    definitions: &AgentDefinitions,
    models: &BTreeMap<String, Arc<dyn Model>>,
) -> Result<(), AgentError> {
    let config =
        |agent: &str, message: String| AgentError::Config { agent: agent.to_owned(), message };
    let names: Vec<&str> = definitions.agents.keys().map(String::as_str).collect();
    for (name, agent) in &definitions.agents {
        let valid = !name.is_empty()
            && name.len() <= 48
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(config(
                name,
                "an agent's name is 1 to 48 letters, digits, `_` or `-` (it becomes the tool name \
                 `agent__{name}`)"
                    .into(),
            ));
        }
        if internal::RESERVED.contains(&name.as_str()) {
            return Err(config(
                name,
                format!(
                    "`{name}` is the name of a session tool (`agent__{name}`): rename the agent"
                ),
            ));
        }
        if let Some(patterns) = &agent.tools {
            toolmux_orchestrator::check_selectors(patterns)
                .map_err(|e| config(name, format!("tools: {e}")))?;
            if let Some(call) = patterns.iter().find(|p| p.contains('(')) {
                return Err(config(
                    name,
                    format!(
                        "tools: `{call}` names calls, not tools; give the agent the tool \
                         (`{}`) and put the rule on its calls in `permissions`",
                        call.split('(').next().unwrap_or(call).trim()
                    ),
                ));
            }
        }
        if !agent.model.is_empty() && !models.contains_key(&agent.model) {
            let known: Vec<&str> = models.keys().map(String::as_str).collect();
            let message = if known.is_empty() {
                format!("model `{}` is not configured: add it under `models`", agent.model)
            } else {
                format!("model `{}` is not configured; models: {}", agent.model, known.join(", "))
            };
            return Err(config(name, message));
        }
        for sub in &agent.agents {
            if !definitions.agents.contains_key(sub) {
                return Err(config(
                    name,
                    format!(
                        "`agents` names `{sub}`, which is not an agent; agents: {}",
                        names.join(", ")
                    ),
                ));
            }
        }
        if let Some(schema) = &agent.output_schema {
            toolmux_orchestrator::ArgumentValidator::check_schema(schema)
                .map_err(|e| config(name, format!("outputSchema: {e}")))?;
        }
        if agent.max_turns == Some(0) {
            return Err(config(name, "maxTurns must be at least 1".into()));
        }
        if agent.max_calls_per_turn == Some(0) {
            return Err(config(
                name,
                format!(
                    "maxCallsPerTurn must be at least 1 (the most tool calls one model turn may \
                     make); leave it out for the default of {DEFAULT_MAX_CALLS_PER_TURN}"
                ),
            ));
        }
    }
    if let Some(router) = &definitions.router {
        for destination in &router.destinations {
            if !definitions.agents.contains_key(destination) {
                return Err(config(
                    "router",
                    format!(
                        "destination `{destination}` is not an agent; agents: {}",
                        names.join(", ")
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The agents as tools `agent__{name}`.
#[derive(Debug)]
struct AgentProvider {
    agents: Agents,
}

impl AgentProvider {
    fn spec(name: &str, config: &AgentConfig) -> ToolSpec {
        let description = if config.description.is_empty() {
            format!(
                "Delegates a task to agent `{name}`, which works on it with its own tools and returns its final report."
            )
        } else {
            format!(
                "{} (Delegates a task to agent `{name}`, which returns its final report.)",
                config.description
            )
        };
        ToolSpec::new(
            name,
            description,
            json!({
                "type": "object",
                "properties": {
                    "prompt": {
                        "type": "string",
                        "description": "The task, with everything the agent needs to know: it sees nothing else of your conversation."
                    }
                },
                "required": ["prompt"]
            }),
        )
        // A run takes many model turns: clients that take MCP tasks poll it as one.
        .with_annotations(ToolAnnotations {
            open_world: true,
            task_support: toolmux_core::TaskSupport::Optional,
            ..ToolAnnotations::default()
        })
    }
}

#[async_trait]
impl ToolProvider for AgentProvider {
    /// An agent's run carries what the calling run and agent left (goals, memories, the
    /// conversation of a chat).
    fn state_per_run(&self) -> bool {
        true
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Agent
    }

    fn namespace(&self) -> &str {
        NAMESPACE
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        let definitions = &self.agents.inner.definitions;
        let called: std::collections::HashSet<&str> =
            definitions.agents.values().flat_map(|a| a.agents.iter().map(String::as_str)).collect();
        Ok(definitions
            .agents
            .iter()
            .filter(|(name, config)| {
                config.expose.unwrap_or(true) || called.contains(name.as_str())
            })
            .map(|(name, config)| {
                let mut spec = AgentProvider::spec(name, config);
                spec.annotations.visible = config.expose.unwrap_or(true);
                spec
            })
            .collect())
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        if !self.agents.inner.definitions.agents.contains_key(name) {
            return Err(ToolError::UnknownTool {
                name: format!("{NAMESPACE}__{name}"),
                suggestions: Vec::new(),
            });
        }
        let prompt = arguments.get("prompt").and_then(Value::as_str).unwrap_or_default();
        if prompt.trim().is_empty() {
            return Ok(ToolOutput::error(format!(
                "agent `{name}` needs a task: give it in `prompt`"
            )));
        }
        // The orchestrator made this call's operation `agent__{name}`; the agent's calls
        // are its children.
        let tool = format!("{NAMESPACE}__{name}");
        let ctx = match ctx.op() {
            Some(op) if op.tool() == tool => ctx.clone(),
            _ => ctx.clone().with_op(Op::new(tool, ctx.op().cloned())),
        };
        // Its spending counts for the session that called it until the run ends, or is cut.
        let _running = self.agents.inner.sub_figures.start(&ctx);
        match self.agents.run_from(name, prompt, &ctx, &RunOptions::default(), None).await {
            Ok(report) => {
                self.agents.inner.sub_figures.record(&ctx, &report);
                Ok(report.to_output())
            }
            Err(e) => Err(ToolError::Unavailable {
                provider: NAMESPACE.to_owned(),
                message: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;
    use toolmux_llm::{ModelError, ModelRequest, ModelResponse, ModelToolCall};
    use toolmux_orchestrator::OrchestratorConfig;

    /// Model `parent` calls agent `child`; any other never answers, saying it was asked.
    #[derive(Debug)]
    struct Stalling {
        name: &'static str,
        asked: Arc<tokio::sync::Notify>,
    }

    #[async_trait]
    impl Model for Stalling {
        fn name(&self) -> &str {
            self.name
        }

        async fn complete(
            &self,
            _request: &ModelRequest,
            _cancel: &CancellationToken,
        ) -> Result<ModelResponse, ModelError> {
            if self.name == "parent" {
                let call = ModelToolCall::new("c1", "agent__child", json!({"prompt": "work"}));
                return Ok(ModelResponse::tool_calls(vec![call]));
            }
            self.asked.notify_one();
            std::future::pending().await
        }
    }

    /// A run cut while the sub-agent its session called works (its future dropped, as the
    /// timeout of a call of the agent drops it) leaves nothing kept for either: before,
    /// the figures awaited for the sub-agent's call stayed for the life of the process,
    /// and so did the budgets the two sessions had left.
    #[tokio::test]
    async fn a_run_cut_while_its_sub_agent_works_leaves_nothing_kept() {
        let asked = Arc::new(tokio::sync::Notify::new());
        let model = |name: &'static str| {
            let model = Arc::new(Stalling { name, asked: asked.clone() });
            (name.to_owned(), model as Arc<dyn Model>)
        };
        let models = BTreeMap::from([model("parent"), model("child")]);
        let mut definitions = AgentDefinitions::default();
        let parent = AgentConfig {
            model: "parent".into(),
            agents: vec!["child".into()],
            token_budget: Some(100_000),
            ..AgentConfig::default()
        };
        let child =
            AgentConfig { model: "child".into(), description: "Works".into(), ..parent.clone() };
        definitions.agents.insert("parent".into(), parent);
        definitions.agents.insert("child".into(), AgentConfig { agents: Vec::new(), ..child });
        let agents = Agents::new(definitions, models).expect("valid agents");
        let orchestrator = Orchestrator::builder(OrchestratorConfig::default())
            .provider(agents.provider())
            .build()
            .expect("an orchestrator");
        agents.attach(&orchestrator);
        assert!(orchestrator.warmup().await.is_ok());
        let ctx = CallContext::new();
        let run = agents.run("parent", "go", &ctx);
        let cut = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            tokio::select! {
                report = run => panic!("the run ended: {report:?}"),
                () = asked.notified() => {}
            }
        });
        cut.await.expect("the sub-agent's model is asked within 30 s");
        assert!(agents.inner.sub_figures.is_empty(), "{:?}", agents.inner.sub_figures);
        assert!(agents.inner.budgets.is_empty(), "{:?}", agents.inner.budgets);
        orchestrator.cleanup().await;
    }
}
