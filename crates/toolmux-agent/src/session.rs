//! One agent working on one task: the loop of model turns and tool calls, until the model
//! reports, hands the task off, asks a question nobody can answer, or runs out of turns.

use crate::config::{
    AgentConfig, DEFAULT_MAX_CALLS_PER_TURN, DEFAULT_MAX_REPEATS, DEFAULT_MAX_TURNS,
};
use crate::handler::AgentHandler;
use crate::hooks::{AgentHooks, Prompt};
use crate::inbox;
use crate::internal::{self, ASK_USER, BATCH, FINAL_REPORT, Finalizing, HANDOFF, TASK_STATUS};
use crate::pause::{self, Decision, PendingCall, Resume};
use crate::report::{AgentReport, AgentStatus, usage_in};
use crate::{TextDelta, TextSink};
use futures::future::join_all;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::{CallContext, ContentPart, Op, Progress, ToolCall, ToolSpec};
use toolmux_llm::{
    ContextOverflow, ImagePart, Message, Model, ModelDelta, ModelError, ModelRequest,
    ModelResponse, ModelToolCall, StopReason, ToolChoice, ToolDefinition, ToolResultMessage, Usage,
};
use toolmux_orchestrator::search;
use toolmux_orchestrator::{ArgumentValidator, Orchestrator, estimate_tokens};

/// How a session ended.
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// With a report.
    Report(AgentReport),
    /// With the task handed to another agent; the report carries the session's figures.
    Handoff {
        to: String,
        message: Option<String>,
        figures: AgentReport,
        /// Calls of asynchronous external tools whose results had not come when the
        /// session handed the task on: the run's, so the next agent's to wait for.
        pending: usize,
    },
}

/// What one tool call did besides answering.
#[derive(Debug)]
enum Effect {
    None,
    Report(Box<AgentReport>),
    Handoff {
        to: String,
        message: Option<String>,
    },
    Question(String),
    /// A tool marked as ending the turn ran: its result is the answer.
    EndsTurn(String),
    /// A search found these deferred tools, to offer from the next turn on.
    Found(Vec<ToolSpec>),
}

/// One call's answer, what it did, and what it cost below (a sub-agent's tokens and calls).
#[derive(Debug)]
struct Outcome {
    result: ToolResultMessage,
    effect: Effect,
    usage: Usage,
    /// The call ran: it went to the orchestrator (whatever the pipeline then made of it),
    /// or the session's search answered it, or the caller of a paused run did. A call the
    /// session refused before that (an unknown tool or one not offered, arguments that are
    /// not JSON, past `maxCallsPerTurn`, a repeat, a call not offered on a last turn, one
    /// denied on resume) did not.
    ran: bool,
    /// The calls that ran within this one: a batch's, a sub-agent's.
    calls: u32,
    /// The calls refused within this one: a batch's, a sub-agent's.
    refused: u32,
}

impl Outcome {
    fn answer(call: &ModelToolCall, content: String, is_error: bool) -> Self {
        Outcome {
            result: ToolResultMessage::new(call.id.clone(), content, is_error),
            effect: Effect::None,
            usage: Usage::default(),
            ran: false,
            calls: 0,
            refused: 0,
        }
    }

    /// The answer of a call that ran ([`Outcome::ran`]).
    fn ran(mut self) -> Self {
        self.ran = true;
        self
    }

    fn error(call: &ModelToolCall, content: String) -> Self {
        Outcome::answer(call, content, true)
    }
}

/// An agent's session: its model, its tools, and the context its calls run in.
pub(crate) struct Session<'a> {
    pub(crate) name: &'a str,
    pub(crate) config: &'a AgentConfig,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) orchestrator: Orchestrator,
    /// The session's context: the agent's operation, its cancellation.
    pub(crate) ctx: CallContext,
    /// Agents it may hand the task to (`router.destinations` without itself).
    pub(crate) destinations: Vec<String>,
    /// Keep the conversation in the report.
    pub(crate) keep_transcript: bool,
    /// Who follows the text as it is written, besides the orchestrator's observers.
    pub(crate) on_text: Option<&'a TextSink>,
    /// The conversation before the task.
    pub(crate) history: &'a [Message],
    /// What the session answers for its tools (sampling with its model, whose tokens count
    /// toward the budget).
    pub(crate) handler: Arc<AgentHandler>,
    /// The hooks of the agents' loop (`SessionStart`, `UserPromptSubmit`, `Stop`).
    pub(crate) hooks: &'a AgentHooks,
    /// Whether the agent was called by another agent (its stop hooks are `SubagentStop`).
    pub(crate) sub: bool,
    /// Whether the agents it calls would be within the depth limit (`agentMaxDepth`): at
    /// the limit, no agent is offered (every call of one would be refused).
    pub(crate) may_call_agents: bool,
    /// The tokens left to the sessions above this one, and where it says what it has left.
    pub(crate) budgets: &'a Budgets,
    /// Where the sub-agents it calls leave their figures.
    pub(crate) sub_figures: &'a SubFigures,
    /// The decisions a paused run resumes with; `history` is then its conversation.
    pub(crate) resume: Option<&'a Resume>,
    /// What the run spent before this session, in the agents that handed the task on to
    /// it: its `maxTurns` and `tokenBudget` count it.
    pub(crate) handed: Spent,
    /// Results the agents that handed the task on took from the run's inbox and did not
    /// read: given to this one's model, one portion a turn, as its own would be.
    pub(crate) handed_results: &'a [Value],
    /// Calls of asynchronous external tools whose results had not come when the agents
    /// before it handed the task on: the run's calls, whose results come to the run's
    /// inbox, which it reads as they would have. `None` for the run's first session, which
    /// counts them in its history.
    pub(crate) handed_pending: Option<usize>,
}

/// The turns and tokens a run spent.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Spent {
    pub(crate) turns: u32,
    pub(crate) tokens: u64,
}

impl Session<'_> {
    /// The tools offered: the orchestrator's tools the configuration allows (visible ones,
    /// other agents only as listed under `agents`), then the session's own.
    fn tools(&self) -> (Vec<ToolDefinition>, HashSet<String>, HashSet<String>) {
        // With deferred tools the `tools` namespace is the search's: the session searches
        // itself and offers what it finds.
        let searching = self.orchestrator.has_deferred(&|_| true);
        let sub_agents: HashSet<String> = match self.may_call_agents {
            true => self.config.agents.iter().map(|a| format!("agent__{a}")).collect(),
            false => HashSet::new(),
        };
        let mut offered = Vec::new();
        let mut names = HashSet::new();
        let mut ends_turn = HashSet::new();
        for spec in self.orchestrator.tools() {
            if searching && (spec.name == search::SEARCH || spec.name == search::CALL) {
                continue;
            }
            let allowed = if spec.name.starts_with("agent__") {
                sub_agents.contains(&spec.name)
            } else {
                spec.annotations.visible && (spec.name == "output__read" || self.allows(&spec.name))
            };
            if !allowed {
                continue;
            }
            if spec.annotations.ends_turn {
                ends_turn.insert(spec.name.clone());
            }
            names.insert(spec.name.clone());
            offered.push(tool_definition(spec));
        }
        if searching && self.orchestrator.has_deferred(&|name| self.allows(name)) {
            offered.push(tool_definition(search::search_spec_for_sessions()));
        }
        offered.push(internal::final_report(self.config.output_schema.as_ref()));
        if self.config.task_status {
            offered.push(internal::task_status());
        }
        if self.config.batch {
            offered.push(internal::batch());
        }
        if self.config.ask_user {
            offered.push(internal::ask_user());
        }
        if !self.destinations.is_empty() {
            offered.push(internal::handoff(&self.destinations));
        }
        (offered, names, ends_turn)
    }

    /// Before a turn, while calls of asynchronous external tools wait for their results:
    /// the results that arrived in the run's inbox are given to the model, as a message
    /// after the last, so that it need not poll the inbox itself. What the inbox gave is
    /// given in portions within the tools' size cap, one a turn, the rest kept for the
    /// next turns: taken out of the inbox, a result is nowhere else.
    async fn collect_inbox(&self, state: &mut State, request: &mut ModelRequest) {
        if state.pending_external.load(Ordering::Relaxed) > 0 {
            // The session's bookkeeping, not the run's work: the run's budget neither
            // counts nor refuses it (spent, it left arrived results undelivered).
            match inbox::take(&self.orchestrator, &self.ctx).await {
                Ok(taken) => {
                    state.pending_external.store(
                        usize::try_from(taken.still_pending).unwrap_or(usize::MAX),
                        Ordering::Relaxed,
                    );
                    state.arrived.extend(taken.results);
                }
                Err(why) => {
                    tracing::debug!(agent = %self.name, "the inbox could not be read: {why}");
                }
            }
        }
        let max_bytes = self.orchestrator.config().response_max_bytes;
        let results = inbox::portion(&mut state.arrived, max_bytes);
        if results.is_empty() {
            return;
        }
        let mut notes = Vec::new();
        match state.pending_external.load(Ordering::Relaxed) {
            0 => {}
            n => notes.push(format!("{n} still pending")),
        }
        match state.arrived.len() {
            0 => {}
            n => notes.push(format!("{n} more arrived, given next turn")),
        }
        let notes = match notes.is_empty() {
            true => String::new(),
            false => format!(" ({})", notes.join("; ")),
        };
        request.messages.push(Message::user(format!(
            "(Results of your earlier asynchronous tool calls arrived{notes}:\n{})",
            Value::Array(results)
        )));
    }

    /// The agent's `instructions`, followed by what the providers of the tools it may call
    /// say about them (an MCP server's `instructions`, the external tools' inbox), as an MCP
    /// client would show its model.
    fn system_prompt(&self) -> Option<String> {
        let about = self.orchestrator.instructions_where(&|name| self.allows(name));
        let own = self.config.instructions.trim_end();
        match about {
            Some(about) if own.is_empty() => Some(format!("{PROVIDERS_HEADING}\n\n{about}")),
            Some(about) => Some(format!("{own}\n\n{PROVIDERS_HEADING}\n\n{about}")),
            None if own.is_empty() => None,
            None => Some(self.config.instructions.clone()),
        }
    }

    /// Whether the configuration lets this agent call `name`, one of the orchestrator's
    /// tools that is not an agent (`tools`, default all).
    fn allows(&self, name: &str) -> bool {
        if name.starts_with("agent__") {
            return false;
        }
        // The gateway's built-ins (spaces, goals, memories, plans) are every agent's, as the
        // seeds have them; permissions still apply to their calls.
        if name.starts_with(GATEWAY_PREFIX) {
            return true;
        }
        let Some(patterns) = self.config.tools.as_deref() else { return true };
        if !patterns.iter().any(|p| p.starts_with('@')) {
            return patterns.iter().any(|g| toolmux_orchestrator::glob_match(g, name));
        }
        // Selectors (`@read`) match what the tool is, as the permission rules judge it: an
        // untrusted MCP server's tools are destructive and open-world to them whatever the
        // server claims. The concurrency gate ([`runs_alone`]) keeps to the claims.
        let registry = self.orchestrator.registry();
        let Some(entry) = registry.get(name) else { return false };
        let annotations = self.orchestrator.config().judged_annotations(
            entry.provider.namespace(),
            &entry.name,
            &entry.spec,
        );
        patterns.iter().any(|p| toolmux_orchestrator::rule_matches(p, name, &annotations))
    }

    /// `tools__search`: the deferred tools this agent may call that match the query; each
    /// is offered from the next turn on.
    fn search(&self, call: &ModelToolCall, arguments: &Value) -> Outcome {
        let Some(query) = arguments.get("query").and_then(Value::as_str) else {
            return Outcome::error(
                call,
                format!(
                    "(tool failed: give `query`, what the tool should do; call `{}` again)",
                    search::SEARCH
                ),
            );
        };
        let limit = arguments
            .get("limit")
            .and_then(Value::as_u64)
            .map_or(search::DEFAULT_RESULTS, |l| usize::try_from(l).unwrap_or(search::MAX_RESULTS));
        let found = self.orchestrator.search_tools(query, limit, &|name| self.allows(name));
        let text = search::found_text(query, &found, "call them directly from your next step on.");
        let mut outcome = Outcome::answer(call, text, false);
        if !found.is_empty() {
            outcome.effect = Effect::Found(found);
        }
        outcome
    }

    /// Works on `task` until the session ends; a resumed session (no task) goes on with the
    /// calls its conversation ends with.
    pub(crate) async fn run(&self, task: Option<String>) -> SessionEnd {
        let _budget_ends = self.budgets.end_with(&self.ctx);
        let (mut tools, mut names, mut ends_turn) = self.tools();
        // Deferred tools an earlier part of the conversation found and called stay offered.
        for message in self.history {
            let Message::Assistant { tool_calls, .. } = message else { continue };
            for call in tool_calls {
                if names.contains(&call.name) {
                    continue;
                }
                let found = self
                    .orchestrator
                    .search_tools(&call.name, 1, &|n| n == call.name && self.allows(n));
                for spec in found {
                    names.insert(spec.name.clone());
                    if spec.annotations.ends_turn {
                        ends_turn.insert(spec.name.clone());
                    }
                    tools.push(tool_definition(spec));
                }
            }
        }
        let mut state = State {
            names,
            ends_turn,
            output_check: self
                .config
                .output_schema
                .as_ref()
                .map(|s| ArgumentValidator::new(Arc::new(s.clone())).for_output()),
            task_status: None,
            calls_besides_status: false,
            repeats: Repeats::default(),
            // A conversation that goes on (a resumed run, a chat's next message) may have
            // asynchronous results waiting in the run's inbox since it stopped; a session
            // handed the task goes on waiting for those the agents before it waited for, and
            // a resumed one for those the run waited for at the pause (the agents' before
            // the paused one too, whose calls its conversation does not show).
            pending_external: AtomicUsize::new(self.handed_pending.unwrap_or_else(|| {
                let at_pause = self.resume.map_or(0, |r| r.pending_async);
                pending_in(self.history).max(at_pause)
            })),
            // A paused run's results that had not reached the model yet come first, then
            // those the agents before it took and did not read (taken out of the inbox,
            // they are nowhere else).
            arrived: self
                .resume
                .iter()
                .flat_map(|r| r.unread.iter())
                .chain(self.handed_results)
                .cloned()
                .collect(),
            last: false,
            gate: tokio::sync::RwLock::new(()),
            cut: HashSet::new(),
        };
        // What the model wrote of a text answer before its output limit cut it.
        let mut cut_text = String::new();
        let max_turns = self.config.max_turns.unwrap_or(DEFAULT_MAX_TURNS).max(1);
        let max_repeats = self.config.max_repeats.unwrap_or(DEFAULT_MAX_REPEATS);
        // Validated as at least 1 (`validate`).
        let max_calls = self.config.max_calls_per_turn.unwrap_or(DEFAULT_MAX_CALLS_PER_TURN);
        let max_calls = usize::try_from(max_calls).unwrap_or(usize::MAX).max(1);
        let mut hook_context = Vec::new();
        if !self.hooks.is_empty() {
            let source = if self.history.is_empty() { "startup" } else { "resume" };
            hook_context = self
                .hooks
                .session_start(
                    self.orchestrator.redactor(),
                    source,
                    self.name,
                    &self.ctx,
                    self.history,
                )
                .await;
            let prompt = match &task {
                Some(task) => {
                    let redactor = self.orchestrator.redactor();
                    self.hooks
                        .prompt_submit(redactor, task, self.name, &self.ctx, self.history)
                        .await
                }
                None => Prompt::Go(Vec::new()),
            };
            match prompt {
                Prompt::Go(more) => hook_context.extend(more),
                Prompt::Blocked(reason) => {
                    let figures = AgentReport::failure(self.name, String::new());
                    let message = if reason.is_empty() {
                        "a UserPromptSubmit hook refused the task".to_owned()
                    } else {
                        format!("a UserPromptSubmit hook refused the task: {reason}")
                    };
                    // Results handed on by the agents before it leave with the report.
                    let end = SessionEnd::Report(self.failed(&figures, message));
                    return self.finish(end, Vec::new(), state);
                }
            }
        }
        let mut messages =
            if self.resume.is_some() { self.history.to_vec() } else { continued(self.history) };
        if !hook_context.is_empty() && self.resume.is_none() {
            messages.push(Message::user(format!(
                "(Context from the configuration's hooks:)\n{}",
                hook_context.join("\n\n")
            )));
        }
        if self.history.is_empty()
            && let Some(carried) = carried(&self.orchestrator, &self.ctx, self.name).await
        {
            messages.push(Message::user(carried));
        }
        if let Some(task) = &task {
            messages.push(Message::user(task.clone()));
        }
        let mut request = ModelRequest::new(messages).with_tools(tools).continuing();
        if let Some(system) = self.system_prompt() {
            request = request.with_system(system);
        }
        let mut figures = AgentReport::failure(self.name, String::new());
        let mut stop_active = false;
        if let Some(resume) = self.resume {
            figures.turns = resume.turns;
            figures.tool_calls = resume.tool_calls;
            figures.refused_calls = resume.refused_calls;
            figures.usage = resume.usage;
            if let Some(end) = self.resumed(resume, &mut state, &mut request, &mut figures).await {
                // Hooks' context is given with the model's next turn, which a run that
                // ends (or pauses again) here does not take.
                return self.finish(end, request.messages, state);
            }
            if !hook_context.is_empty() {
                request.messages.push(Message::user(format!(
                    "(Context from the configuration's hooks:)\n{}",
                    hook_context.join("\n\n")
                )));
            }
        }
        // The longest the model took to answer, to leave time for a last turn.
        let mut slowest = Duration::ZERO;
        // The size the API's refusals of too long a request showed a request must keep
        // within (see [`shortened_budget`]), kept within from then on as a configured
        // window's share is.
        let mut learned_budget: Option<u64> = None;
        // How many times this turn was shortened and asked again after such a refusal.
        let mut shortenings = 0;
        // What the model's last `agent__task_status` asks of its next turn: the report.
        let mut finalizing = Finalizing::No;
        // Whether this turn was asked again after the API stopped its answer short of a turn.
        let mut stop_retried = false;
        // Turns in a row in which a call was refused as a repeat and no other tool ran.
        let mut repeating_turns = 0;
        let end = loop {
            if self.ctx.is_cancelled() {
                break SessionEnd::Report(self.failed(&figures, "the run was cancelled".into()));
            }
            figures.turns += 1;
            let sampled = self.handler.used();
            // The budget and the turn limit are the run's: what the agents that handed
            // the task on spent counts (reset at each hand-off, agents handing it back
            // and forth spent a budget each time).
            let spent = figures
                .usage
                .total()
                .saturating_add(sampled.total())
                .saturating_add(self.handed.tokens);
            let turns = figures.turns.saturating_add(self.handed.turns);
            // What is left is the smaller of the agent's own budget and what the agents
            // that called it have left: a sub-agent spends its callers' tokens, and its
            // callers' budgets fall as each answer of any agent below them comes, so that
            // sub-agents running side by side share what is left rather than each being
            // given all of it.
            let own_left = self.config.token_budget.map(|own| own.saturating_sub(spent));
            let inherited = self.budgets.left_above(&self.ctx);
            if let Some(left) = own_left.into_iter().chain(inherited).min() {
                self.budgets.set(&self.ctx, left);
            }
            // Why this turn must be the last, if it must.
            let limit = match (self.config.token_budget, own_left, inherited) {
                (Some(budget), Some(0), _) => {
                    Some(format!("the token budget of {budget} is spent ({spent} used)"))
                }
                (.., Some(0)) => Some(format!(
                    "the token budget of the agents that called this one is spent ({spent} used \
                     here)"
                )),
                _ if turns >= max_turns => {
                    Some(format!("the limit of {max_turns} turns is reached"))
                }
                // A model that keeps repeating refused calls would do so until the turn
                // limit, a request each time.
                _ if repeating_turns >= REPEATING_TURNS_BEFORE_REPORT => Some(format!(
                    "your calls were refused as repeats (`maxRepeats`) in \
                     {REPEATING_TURNS_BEFORE_REPORT} turns in a row, with no other tool run"
                )),
                // Time for about one more answer: the last turn, so that it reports.
                _ if self.ctx.deadline().is_some_and(|end| {
                    figures.turns > 1 && Instant::now() + slowest.saturating_mul(2) >= end
                }) =>
                {
                    Some("the time this agent was called for (`agentTimeout`) is nearly up".into())
                }
                // The orchestrator refused a tool's output for the run's context-token
                // budget (`contextTokenBudget`): more calls would be refused alike.
                _ if figures.turns > 1
                    && self.orchestrator.run_flags(self.ctx.run_id()).context_budget_exceeded =>
                {
                    Some("the run's budget for tool output (`contextTokenBudget`) is spent".into())
                }
                _ => None,
            };
            let last = limit.is_some();
            state.last = last;
            self.collect_inbox(&mut state, &mut request).await;
            drop_old_images(&mut request.messages);
            let configured = self.model.context_window().map(window_budget);
            if let Some(budget) = configured.into_iter().chain(learned_budget).min() {
                fit_context(&mut request, budget);
            }
            let asked = Instant::now();
            let answer = if last {
                // The last turn: only the report may be called, and the model is told so.
                let mut last_request = request.clone();
                last_request.messages.push(Message::user(format!(
                    "(This is your last turn: {}. Call {FINAL_REPORT} now with what you have; use \
                     status partial or failure if the task is not done.)",
                    limit.as_deref().unwrap_or_default()
                )));
                last_request.tools =
                    vec![internal::final_report(self.config.output_schema.as_ref())];
                last_request.tool_choice = ToolChoice::Tool(FINAL_REPORT.to_owned());
                self.within_time(self.ask(&last_request)).await
            } else if finalizing != Finalizing::No {
                // The model said it can finalize: its report is asked for, and when it
                // said it needs no more tools, only the report is offered. The answer to
                // its status told it so; a server that ignores `tool_choice` may still
                // call other tools, which run unless only the report was offered.
                let mut final_request = request.clone();
                if finalizing == Finalizing::OnlyReport {
                    final_request.tools =
                        vec![internal::final_report(self.config.output_schema.as_ref())];
                }
                final_request.tool_choice = ToolChoice::Tool(FINAL_REPORT.to_owned());
                self.within_time(self.ask(&final_request)).await
            } else {
                self.within_time(self.ask(&request)).await
            };
            slowest = slowest.max(asked.elapsed());
            let answer = match answer {
                None => break SessionEnd::Report(self.out_of_time(&figures)),
                Some(Ok(answer)) => {
                    shortenings = 0;
                    stop_retried = false;
                    answer
                }
                Some(Err(e)) => {
                    // An answer that failed all the same (cut at the context window, or ended
                    // short of a turn) was billed: it counts as an answer's tokens do, before
                    // it is asked again or the run fails.
                    if let Some(usage) = e.usage() {
                        figures.usage += usage;
                        self.budgets.spend(&self.ctx, usage.total());
                        self.sub_figures.spend(self.ctx.op(), (usage, 0, 0));
                    }
                    // Stopped short of a turn (the model failed while writing, or wrote a
                    // call the API could not read): usually transient, so the turn is asked
                    // once more before the run fails. A language the API does not support
                    // stays unsupported, and a turn still paused (`pause_turn`) after the
                    // model client continued it `MAX_CONTINUATIONS` times would only pause
                    // as often again.
                    if let ModelError::Stopped { reason, .. } = &e
                        && !stop_retried
                        && !reason.eq_ignore_ascii_case("language")
                        && reason != "pause_turn"
                    {
                        stop_retried = true;
                        tracing::info!(target: "toolmux::agent", agent = self.name, reason = %reason,
                            "the API stopped the answer short of a turn; asking once more");
                        figures.turns -= 1;
                        continue;
                    }
                    // Too long for the model's window: the oldest tool results give way,
                    // as for a configured window, and the turn is asked again. Each time
                    // elides at least one result, and a turn is shortened at most
                    // `MAX_SHORTENINGS` times, each time more, so this ends.
                    let overflow = e.context_overflow();
                    if let Some(overflow) = overflow {
                        let window = overflow_window(&request, overflow);
                        let most = request.max_tokens.map(u64::from);
                        let room = answer_room(
                            &request,
                            overflow,
                            most.or(self.model.max_output_tokens()),
                        );
                        let mut elided = 0;
                        while elided == 0 && shortenings < MAX_SHORTENINGS {
                            shortenings += 1;
                            let budget = shortened_budget(window, room, shortenings);
                            let budget =
                                learned_budget.map_or(budget, |learned| learned.min(budget));
                            elided = fit_context(&mut request, budget);
                            if elided > 0 {
                                learned_budget = Some(budget);
                            }
                        }
                        if elided > 0 {
                            tracing::info!(target: "toolmux::agent", agent = self.name, window,
                                shortenings, "the API refused a request over the context window; old tool results elided");
                            figures.turns -= 1;
                            continue;
                        }
                    }
                    let why = match overflow {
                        Some(_) if elidable_left(&request) => format!(
                            "{MODEL_FAILED}: {e} (the request is longer than the model's \
                             context window, and the API refused it again after it was \
                             shortened {shortenings} times, each time eliding more old tool \
                             results: have the tools return less, with the orchestrator's \
                             `contextTokenBudget` say, set the model's `contextWindow` to what \
                             it takes, or use a model with a larger window)"
                        ),
                        Some(_) => format!(
                            "{MODEL_FAILED}: {e} (the request is longer than the model's \
                             context window, and nothing but the task and the latest turn's \
                             tool results is left to shorten: have the tools return less, with \
                             the orchestrator's `contextTokenBudget` say, or use a model with a \
                             larger window)"
                        ),
                        None if stop_retried && matches!(e, ModelError::Stopped { .. }) => {
                            format!(
                                "{MODEL_FAILED}: {e} (the turn was asked again once and stopped \
                                 again)"
                            )
                        }
                        None => format!("{MODEL_FAILED}: {e}"),
                    };
                    let mut report = self.failed(&figures, why);
                    report.model_failed = true;
                    report.model_may_pass = e.is_transient();
                    if matches!(e, ModelError::Auth { .. }) {
                        report.credentials_refused = Some(e.to_string());
                    }
                    break SessionEnd::Report(report);
                }
            };
            figures.usage += answer.usage;
            self.budgets.spend(&self.ctx, answer.usage.total());
            self.sub_figures.spend(self.ctx.op(), (answer.usage, 0, 0));
            // Asked for once: from the next turn on, the status the model records decides.
            let only_report =
                std::mem::replace(&mut finalizing, Finalizing::No) == Finalizing::OnlyReport;
            if answer.stop == StopReason::ContentFilter {
                let message = "the model's answer was stopped by its API's content filter".into();
                break SessionEnd::Report(self.failed(&figures, message));
            }
            // Cut at the output limit: the calls whose arguments did not end are told why.
            let cut = answer.stop == StopReason::MaxTokens;
            state.cut = answer
                .tool_calls
                .iter()
                .filter(|c| cut && c.raw_arguments.is_some())
                .map(|c| c.id.clone())
                .collect();
            request.messages.push(answer.to_message());
            if answer.tool_calls.is_empty() {
                if cut && !answer.content.trim().is_empty() {
                    // A text cut off is not an answer: the model goes on from where it
                    // stopped, and the report holds both parts.
                    cut_text.push_str(&answer.content);
                    if last {
                        let mut report = figures.clone();
                        report.status = AgentStatus::Partial;
                        report.content = format!(
                            "{}\n\n(cut off: the answer reached the model's output limit, `maxTokens`)",
                            std::mem::take(&mut cut_text)
                        );
                        break SessionEnd::Report(report);
                    }
                    request.messages.push(Message::user(
                        "(Your answer was cut off at your output limit. Continue exactly where it \
                         stopped, without repeating it.)"
                            .to_owned(),
                    ));
                    continue;
                }
                if !answer.content.trim().is_empty() {
                    // Results taken from the inbox are nowhere else: an answer before they
                    // all reached the model gets one more turn, which gives the next of
                    // them (on the last turn, they go in the report, unread).
                    if !last && !state.arrived.is_empty() {
                        cut_text.clear();
                        continue;
                    }
                    if !last
                        && let Some(reason) = self.go_on(&mut stop_active, &request.messages).await
                    {
                        request.messages.push(go_on_message(&reason));
                        continue;
                    }
                    // A plain answer ends the turn, as a conversational reply does; on the
                    // last turn, where only the report was asked for, it is not a success.
                    let mut report = figures.clone();
                    report.status = AgentStatus::Success;
                    report.content = std::mem::take(&mut cut_text) + &answer.content;
                    if let Some(limit) = &limit {
                        report.status = AgentStatus::Partial;
                        report.content = format!(
                            "{}\n\n({limit}, and the model answered without its final report)",
                            report.content
                        );
                    }
                    break SessionEnd::Report(report);
                }
                if let Some(limit) = &limit {
                    let message = format!("{limit}, and the model gave no final report");
                    break SessionEnd::Report(self.failed(&figures, message));
                }
                request.messages.push(Message::user(format!(
                    "(Your answer was empty. Continue with the task, or call {FINAL_REPORT}.)"
                )));
                continue;
            }
            // The calls past the turn's limit are not made, but each is answered, so that
            // every call of the conversation has its result, as every API wants.
            let made = answer.tool_calls.len().min(max_calls);
            let too_many = answer.tool_calls.len();
            self.progress(&figures, max_turns, &answer.tool_calls[..made]);
            let mut repeated = state.repeats.turn(&answer.tool_calls[..made], max_repeats);
            let refused: Vec<bool> = repeated
                .iter()
                .map(Option::is_some)
                .chain(std::iter::repeat_n(true, too_many - made))
                .collect();
            let ran_other = answer.tool_calls[..made]
                .iter()
                .zip(&repeated)
                .any(|(call, repeated)| repeated.is_none() && !is_own(&call.name));
            if repeated.iter().any(Option::is_some) && !ran_other {
                repeating_turns += 1;
            } else {
                repeating_turns = 0;
            }
            repeated.resize(too_many, None);
            state.calls_besides_status =
                answer.tool_calls[..made].iter().any(|c| c.name != TASK_STATUS);
            let state_now = &state;
            let limit_now = limit.as_deref().unwrap_or_default();
            self.handler.approvals.start_turn(answer.tool_calls.iter().map(|c| c.id.clone()));
            let outcomes = self.within_time(join_all(
                answer.tool_calls.iter().zip(repeated).enumerate().map(
                |(index, (call, repeated))| async move {
                    // Only the report was offered on the last turn; a server that ignores
                    // `tool_choice` (or a model writing its calls as text) may call more,
                    // which must not run past the limit that made the turn the last.
                    if last && call.name != FINAL_REPORT {
                        return Outcome::error(
                            call,
                            format!(
                                "(not called: this was your last turn, in which only \
                                 {FINAL_REPORT} could be called: {limit_now})"
                            ),
                        );
                    }
                    // Only the report was offered, the model having said it needs no
                    // more tools; it may say otherwise with its next turn's tools.
                    if only_report && call.name != FINAL_REPORT {
                        return Outcome::error(
                            call,
                            format!(
                                "(not called: you said with {TASK_STATUS} that you can \
                                 finalize and need no more tools, so this turn offered only \
                                 {FINAL_REPORT}: call it with your answer. If you do need more \
                                 tools, your next turn offers them again)"
                            ),
                        );
                    }
                    if index >= made {
                        return Outcome::error(
                            call,
                            format!(
                                "(not called: you made {too_many} tool calls in one turn, and \
                                 this agent makes at most {max_calls} per turn (`maxCallsPerTurn`): \
                                 the first {max_calls} ran, this one and the rest did not. Make fewer \
                                 calls per turn; call this again in a later turn if you still \
                                 need it)"
                            ),
                        );
                    }
                    match repeated {
                        Some(turns) => Outcome::error(
                            call,
                            format!(
                                "(not called: you called `{}` with these same arguments in each \
                                 of your last {turns} turns, and calling it again will not \
                                 change what it returns. Use what it returned, change the \
                                 arguments or the approach, or call {FINAL_REPORT})",
                                call.name
                            ),
                        ),
                        None => self.call(call, state_now).await,
                    }
                },
            )))
            .await;
            // The calls are bounded by the same end, so this is seldom reached; the turn's
            // answer is counted.
            let Some(outcomes) = outcomes else {
                break SessionEnd::Report(self.out_of_time(&figures));
            };
            let pending = self.handler.approvals.take_pending();
            let calls: Vec<(&ModelToolCall, Outcome)> =
                answer.tool_calls.iter().zip(outcomes).collect();
            state.repeats.results(
                calls
                    .iter()
                    .zip(&refused)
                    .filter(|(_, refused)| !**refused)
                    .map(|((call, outcome), _)| (*call, outcome.result.content.as_str())),
            );
            let (calls, pending) = held(calls, pending);
            let effects = self.fold(calls, &mut state, &mut request, &mut figures);
            if let Some((status, parsed)) = self.take_task_status(&answer.tool_calls[..made]) {
                state.task_status = Some(status);
                finalizing = parsed.finalizing(state.calls_besides_status);
            }
            figures.task_status.clone_from(&state.task_status);
            if !pending.is_empty() {
                break SessionEnd::Report(self.paused(&figures, pending));
            }
            if let Some(end) = self.decide(effects, &figures) {
                let stopping =
                    matches!(&end, SessionEnd::Report(r) if r.status != AgentStatus::NeedsInput);
                if stopping
                    && !last
                    && let Some(reason) = self.go_on(&mut stop_active, &request.messages).await
                {
                    request.messages.push(go_on_message(&reason));
                    continue;
                }
                break end;
            }
            if let Some(limit) = &limit {
                let message = format!("{limit}, and the model gave no final report");
                break SessionEnd::Report(self.failed(&figures, message));
            }
        };
        self.finish(end, request.messages, state)
    }

    /// The model's answer to `request`. When somebody follows the run's text
    /// (`RunOptions::on_text`) or the orchestrator's events, the answer is streamed: its
    /// text to the run's sink and as [`ToolEvent::AgentText`], the arguments of calls of
    /// visible tools as [`ToolEvent::ToolStreaming`], as the model writes them.
    ///
    /// [`ToolEvent::AgentText`]: toolmux_orchestrator::ToolEvent::AgentText
    /// [`ToolEvent::ToolStreaming`]: toolmux_orchestrator::ToolEvent::ToolStreaming
    async fn ask(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let cancel = self.ctx.cancel_token();
        if self.on_text.is_none() && !self.orchestrator.is_observed() {
            return self.model.complete(request, cancel).await;
        }
        // The answer's calls so far, by their place in it: id, tool name, and what of
        // their arguments waits to be passed on (redaction holds back what may begin a
        // secret); the same for the text.
        let calls: Mutex<Vec<(String, String, String)>> = Mutex::default();
        let text = Mutex::new(String::new());
        // What of the text waits to go to the run's sink, redacted as the events are (by
        // the orchestrator's redactor, the configuration's secrets): a secret the model
        // writes across deltas is held back until it is whole.
        let sink_pending = Mutex::new(String::new());
        let to_sink = |more: &str, end: bool| {
            let Some(sink) = self.on_text else { return };
            let mut pending = sink_pending.lock().unwrap_or_else(|e| e.into_inner());
            let clean = self.orchestrator.redactor().pass_on(&mut pending, more, end);
            if !clean.is_empty() {
                sink.send(self.name, TextDelta::Text(&clean));
            }
        };
        let on_delta = |delta: ModelDelta<'_>| match delta {
            ModelDelta::Text(more) => {
                to_sink(more, false);
                let mut pending = text.lock().unwrap_or_else(|e| e.into_inner());
                self.orchestrator.agent_text(&self.ctx, self.name, &mut pending, Some(more));
            }
            ModelDelta::Restart => {
                calls.lock().unwrap_or_else(|e| e.into_inner()).clear();
                if let Some(sink) = self.on_text {
                    sink_pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
                    sink.send(self.name, TextDelta::Restart);
                }
                let mut pending = text.lock().unwrap_or_else(|e| e.into_inner());
                self.orchestrator.agent_restart(&self.ctx, self.name, &mut pending);
            }
            ModelDelta::ToolCall { index, id, name } => {
                let mut calls = calls.lock().unwrap_or_else(|e| e.into_inner());
                if calls.len() <= index {
                    calls.resize(index + 1, Default::default());
                }
                calls[index] = (id.to_owned(), name.to_owned(), String::new());
            }
            ModelDelta::ToolArguments { index, fragment } => {
                let mut calls = calls.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((id, tool, pending)) = calls.get_mut(index) {
                    self.orchestrator.stream_arguments(
                        &self.ctx,
                        id,
                        tool,
                        pending,
                        Some(fragment),
                    );
                }
            }
            _ => {}
        };
        let answer = self.model.complete_streaming(request, cancel, &on_delta).await;
        // What was held back is passed on now that nothing more comes.
        for (id, tool, pending) in calls.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
            self.orchestrator.stream_arguments(&self.ctx, id, tool, pending, None);
        }
        to_sink("", true);
        let mut pending = text.lock().unwrap_or_else(|e| e.into_inner());
        self.orchestrator.agent_text(&self.ctx, self.name, &mut pending, None);
        answer
    }

    /// The session's end as its caller gets it: with the conversation when kept, and with
    /// the results taken from the inbox that did not reach the model, `state.arrived`
    /// ([`AgentReport::unread_results`]): taken out of the inbox, they are nowhere else; a
    /// hand-off and a pause also with the calls whose results are still to come.
    fn finish(&self, end: SessionEnd, transcript: Vec<Message>, state: State) -> SessionEnd {
        let arrived = state.arrived;
        if !arrived.is_empty() {
            tracing::debug!(target: "toolmux::agent", agent = self.name, unread = arrived.len(),
                "the session ends with results its model did not read");
        }
        match end {
            SessionEnd::Report(mut report) => {
                report.unread_results.extend(arrived);
                if self.keep_transcript || report.status == AgentStatus::Paused {
                    report.transcript = transcript;
                }
                if report.status == AgentStatus::Paused {
                    let pending = state.pending_external.into_inner();
                    report.pending_async_calls = u32::try_from(pending).unwrap_or(u32::MAX);
                }
                SessionEnd::Report(report)
            }
            SessionEnd::Handoff { to, message, mut figures, pending: _ } => {
                figures.unread_results.extend(arrived);
                let pending = state.pending_external.into_inner();
                SessionEnd::Handoff { to, message, figures, pending }
            }
        }
    }

    /// Folds a turn's answered calls into the conversation (one tool message, or the one
    /// it ends with when a resumed turn completes it) and into the figures; returns what
    /// the calls did besides answering.
    fn fold(
        &self,
        calls: Vec<(&ModelToolCall, Outcome)>,
        state: &mut State,
        request: &mut ModelRequest,
        figures: &mut AgentReport,
    ) -> Vec<Effect> {
        let mut results = Vec::with_capacity(calls.len());
        let mut effects = Vec::new();
        for (call, mut outcome) in calls {
            // Tools a search found are offered from the next turn on.
            if let Effect::Found(found) = &mut outcome.effect {
                for spec in std::mem::take(found) {
                    if state.names.insert(spec.name.clone()) {
                        if spec.annotations.ends_turn {
                            state.ends_turn.insert(spec.name.clone());
                        }
                        request.tools.push(tool_definition(spec));
                    }
                }
                outcome.effect = Effect::None;
            }
            // The session's own tools are not tool calls of the run; a batch counts as
            // the calls it made. A call refused before it ran is counted apart: the
            // figure of calls is what ran (what took time, what the tools saw).
            let own = [FINAL_REPORT, TASK_STATUS, BATCH, ASK_USER, HANDOFF];
            let counted = !own.contains(&call.name.as_str());
            figures.tool_calls += u32::from(counted && outcome.ran) + outcome.calls;
            figures.refused_calls += u32::from(counted && !outcome.ran) + outcome.refused;
            // Counted as refused: should the orchestrator cut a run this session is a
            // sub-agent's, its caller still counts the refusal (a sub-agent's own are
            // counted by its session, a batch's by the batch).
            if counted && !outcome.ran {
                self.sub_figures.spend(self.ctx.op(), (Usage::default(), 0, 1));
            }
            figures.usage += outcome.usage;
            results.push(outcome.result);
            effects.push(outcome.effect);
        }
        match request.messages.last_mut() {
            Some(Message::Tool { results: earlier }) => earlier.extend(results),
            // Every call of the turn waits: its results come when they are decided.
            _ if results.is_empty() => {}
            _ => request.messages.push(Message::Tool { results }),
        }
        effects
    }

    /// Goes on with a paused run: of the calls its last turn left waiting, those decided
    /// are run (approved) or answered (denied, or answered by the caller), side by side as
    /// a turn's calls are, their results in the order the model made the calls; those not
    /// decided wait on. How the session ends, when it ends (or pauses again) before the
    /// model's next turn.
    async fn resumed(
        &self,
        resume: &Resume,
        state: &mut State,
        request: &mut ModelRequest,
        figures: &mut AgentReport,
    ) -> Option<SessionEnd> {
        let turn = request.messages.iter().rposition(
            |m| matches!(m, Message::Assistant { tool_calls, .. } if !tool_calls.is_empty()),
        )?;
        let answered: HashSet<String> = match request.messages.get(turn + 1) {
            Some(Message::Tool { results }) => results.iter().map(|r| r.call_id.clone()).collect(),
            _ => HashSet::new(),
        };
        let Some(Message::Assistant { tool_calls, .. }) = request.messages.get_mut(turn) else {
            return None;
        };
        // The conversation shows an approved call as it runs.
        for call in tool_calls.iter_mut().filter(|c| !answered.contains(&c.id)) {
            if let Some(Decision::Approve { arguments: Some(arguments), .. }) =
                resume.decisions.get(&call.id)
            {
                call.arguments = arguments.clone();
                call.raw_arguments = None;
            }
        }
        let order: Vec<String> = tool_calls.iter().map(|c| c.id.clone()).collect();
        let calls: Vec<ModelToolCall> =
            tool_calls.iter().filter(|c| !answered.contains(&c.id)).cloned().collect();
        let mut waiting = Vec::new();
        let mut decided = Vec::new();
        for call in &calls {
            let pending = resume.pending.iter().find(|p| p.call_id == call.id);
            match resume.decisions.get(&call.id) {
                None => waiting.push(pending.cloned().unwrap_or_else(|| PendingCall {
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    arguments: call.arguments.clone(),
                    reason: "it waits for a decision".to_owned(),
                    scope: None,
                    question: None,
                    started: false,
                })),
                Some(decision) => {
                    if let Decision::Approve { always, .. } = decision {
                        let key = pending.map_or(call.name.as_str(), PendingCall::standing_key);
                        self.handler.approvals.grant(&call.id, always.then_some(key));
                    }
                    decided.push((call, decision));
                }
            }
        }
        tracing::debug!(
            target: "toolmux::agent",
            agent = self.name,
            decided = decided.len(),
            waiting = waiting.len(),
            "the run resumes"
        );
        self.handler.approvals.start_turn(decided.iter().map(|(c, _)| c.id.clone()));
        let state_now = &*state;
        let outcomes = join_all(decided.iter().map(|(call, decision)| async move {
            match decision {
                Decision::Approve { .. } => self.call(call, state_now).await,
                Decision::Deny { message } => {
                    Outcome::error(call, pause::denied_text(&call.name, message.as_deref()))
                }
                Decision::Respond { content, is_error } => {
                    Outcome::answer(call, content.clone(), *is_error).ran()
                }
            }
        }))
        .await;
        let again = self.handler.approvals.take_pending();
        self.handler.approvals.clear_granted();
        let ran: Vec<(&ModelToolCall, Outcome)> =
            decided.iter().map(|(c, _)| *c).zip(outcomes).collect();
        let (ran, again) = held(ran, again);
        waiting.extend(again);
        let effects = self.fold(ran, state, request, figures);
        let position = |id: &str| order.iter().position(|o| o == id).unwrap_or(usize::MAX);
        if let Some(Message::Tool { results }) = request.messages.get_mut(turn + 1) {
            results.sort_by_key(|r| position(&r.call_id));
        }
        if !waiting.is_empty() {
            waiting.sort_by_key(|p| position(&p.call_id));
            return Some(SessionEnd::Report(self.paused(figures, waiting)));
        }
        self.decide(effects, figures)
    }

    /// The report of a run that pauses for `pending`.
    fn paused(&self, figures: &AgentReport, pending: Vec<PendingCall>) -> AgentReport {
        let mut report = figures.clone();
        report.status = AgentStatus::Paused;
        let calls: Vec<String> = pending
            .iter()
            .map(|p| match &p.question {
                Some(question) => format!("the question \"{question}\" (id {})", p.call_id),
                None => format!("`{}` ({}, id {})", p.tool, p.reason, p.call_id),
            })
            .collect();
        let questions = pending.iter().filter(|p| p.question.is_some()).count();
        let what = match questions {
            0 => "approval",
            n if n == pending.len() => "an answer",
            _ => "approval or an answer",
        };
        report.content = format!(
            "{} waiting for {what}: {}",
            if pending.len() == 1 {
                "1 call is".to_owned()
            } else {
                format!("{} calls are", pending.len())
            },
            calls.join("; ")
        );
        tracing::debug!(target: "toolmux::agent", agent = self.name, "{}", report.content);
        report.pending = pending;
        report.approved = self.handler.approvals.standing();
        report.run_id = Some(self.ctx.run_id().to_owned());
        report
    }

    /// What the effects of one turn's calls decide: a valid report first, then a hand-off,
    /// a question, a tool that ends the turn; otherwise the session goes on.
    fn decide(&self, effects: Vec<Effect>, figures: &AgentReport) -> Option<SessionEnd> {
        let mut handoff = None;
        let mut question = None;
        let mut ended = None;
        for effect in effects {
            match effect {
                Effect::Report(report) => {
                    let mut report = *report;
                    report.turns = figures.turns;
                    report.tool_calls = figures.tool_calls;
                    report.refused_calls = figures.refused_calls;
                    report.usage = figures.usage;
                    report.task_status.clone_from(&figures.task_status);
                    return Some(SessionEnd::Report(report));
                }
                Effect::Handoff { to, message } => {
                    handoff.get_or_insert((to, message));
                }
                Effect::Question(q) => {
                    question.get_or_insert(q);
                }
                Effect::EndsTurn(text) => {
                    ended.get_or_insert(text);
                }
                Effect::None | Effect::Found(_) => {}
            }
        }
        if let Some((to, message)) = handoff {
            // The calls still pending are the state's, which `finish` adds.
            return Some(SessionEnd::Handoff { to, message, figures: figures.clone(), pending: 0 });
        }
        if let Some(question) = question {
            let mut report = figures.clone();
            report.status = AgentStatus::NeedsInput;
            report.content = question;
            return Some(SessionEnd::Report(report));
        }
        ended.map(|text| {
            let mut report = figures.clone();
            report.status = AgentStatus::Success;
            report.content = text;
            SessionEnd::Report(report)
        })
    }

    /// Why the run must go on instead of ending, when a `Stop` (or `SubagentStop`) hook
    /// says so; `active` is then set for the next time.
    async fn go_on(&self, active: &mut bool, messages: &[Message]) -> Option<String> {
        let hooks = if self.sub { &self.hooks.subagent_stop } else { &self.hooks.stop };
        if hooks.is_empty() {
            return None;
        }
        let reason = self
            .hooks
            .stop(self.orchestrator.redactor(), self.sub, *active, self.name, &self.ctx, messages)
            .await?;
        *active = true;
        Some(reason)
    }

    /// `work`, unless the session's context has a deadline (`agentTimeout`) that comes
    /// first: then `None`, and the work is dropped.
    async fn within_time<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        match self.ctx.deadline() {
            Some(end) => tokio::time::timeout_at(end, work).await.ok(),
            None => Some(work.await),
        }
    }

    /// The report of a session whose time (`agentTimeout`) ran out mid-turn: what it used,
    /// and that it did not report.
    fn out_of_time(&self, figures: &AgentReport) -> AgentReport {
        self.failed(
            figures,
            format!(
                "the agent ran out of the time it was called for (`agentTimeout`) after {} \
                 turns, before its final report",
                figures.turns
            ),
        )
    }

    fn failed(&self, figures: &AgentReport, message: String) -> AgentReport {
        tracing::debug!(target: "toolmux::agent", agent = self.name, "{message}");
        let mut report = figures.clone();
        report.status = AgentStatus::Failure;
        report.content = message;
        report
    }

    fn progress(&self, figures: &AgentReport, max_turns: u32, calls: &[ModelToolCall]) {
        let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
        tracing::debug!(target: "toolmux::agent", agent = self.name, turn = figures.turns, "calls {}", names.join(", "));
        self.ctx.report_progress(
            Progress::new(f64::from(figures.turns), Some(f64::from(max_turns))).with_message(
                format!("{}: turn {}: {}", self.name, figures.turns, names.join(", ")),
            ),
        );
    }

    /// The arguments of the last valid `agent__task_status` call of a turn, as recorded
    /// and as read.
    fn take_task_status(&self, calls: &[ModelToolCall]) -> Option<(Value, internal::TaskStatus)> {
        if !self.config.task_status {
            return None;
        }
        calls.iter().rev().filter(|c| c.name == TASK_STATUS && c.arguments.is_object()).find_map(
            |c| {
                let parsed = serde_json::from_value(c.arguments.clone()).ok()?;
                let status = c.arguments.clone();
                if let Some(now) = status.get("now").and_then(Value::as_str) {
                    let now = self.orchestrator.redactor().redact(now);
                    self.ctx.report_progress(
                        Progress::new(0.0, None).with_message(format!("{}: {now}", self.name)),
                    );
                }
                Some((status, parsed))
            },
        )
    }

    /// `agent__task_status`: recorded (by the loop, [`Session::take_task_status`]), and
    /// answered telling a model that can finalize to call its report.
    fn task_status(&self, call: &ModelToolCall, arguments: Value, state: &State) -> Outcome {
        match serde_json::from_value::<internal::TaskStatus>(arguments) {
            Ok(status) => Outcome::answer(call, status.answer(state.calls_besides_status), false),
            Err(e) => Outcome::error(
                call,
                format!(
                    "(tool failed: invalid status: {e}; call {TASK_STATUS} again with `status` \
                     one of starting, in-progress, completed and the flags true or false)"
                ),
            ),
        }
    }

    /// Answers one call of the model.
    async fn call(&self, call: &ModelToolCall, state: &State) -> Outcome {
        if let Some(raw) = &call.raw_arguments {
            let excerpt: String = raw.chars().take(200).collect();
            let why = if state.cut.contains(&call.id) {
                "; your answer reached your output limit while writing them, so they were cut \
                 off: write less in one call (split a large file or edit into several calls)"
            } else {
                ""
            };
            return Outcome::error(
                call,
                format!(
                    "(tool failed: the arguments are not valid JSON: `{excerpt}`{why}; call `{}` \
                     again with a JSON object)",
                    call.name
                ),
            );
        }
        let arguments = match &call.arguments {
            Value::Null => json!({}),
            other => other.clone(),
        };
        match call.name.as_str() {
            FINAL_REPORT => self.final_report(call, arguments, state),
            TASK_STATUS if self.config.task_status => self.task_status(call, arguments, state),
            BATCH if self.config.batch => self.batch(call, arguments, state).await,
            ASK_USER if self.config.ask_user => self.ask_user(call, arguments).await,
            HANDOFF if !self.destinations.is_empty() => self.handoff(call, arguments),
            // The session's own search, unless a provider's tool has that name.
            search::SEARCH if !state.names.contains(search::SEARCH) => {
                self.search(call, &arguments).ran()
            }
            _ => self.tool(call, &call.name, arguments, state).await,
        }
    }

    /// A call of one of the orchestrator's tools offered to this session.
    async fn tool(
        &self,
        call: &ModelToolCall,
        name: &str,
        arguments: Value,
        state: &State,
    ) -> Outcome {
        if !state.names.contains(name) {
            let near = toolmux_orchestrator::suggest(state.names.iter().map(String::as_str), name);
            let hint = match near.as_slice() {
                [] => ": call".to_owned(),
                [one] => format!("; did you mean `{one}`? Call"),
                many => format!("; did you mean one of `{}`? Call", many.join("`, `")),
            };
            return Outcome::error(
                call,
                format!(
                    "(tool failed: unknown tool `{name}`{hint} one of the tools you were given)"
                ),
            );
        }
        let alone =
            self.orchestrator.registry().get(name).is_some_and(|e| runs_alone(&e.spec.annotations));
        let (_shared, _alone) = if alone {
            (None, Some(state.gate.write().await))
        } else {
            (Some(state.gate.read().await), None)
        };
        let ctx = self.ctx.child();
        // Counted as it starts: should the orchestrator cut a run this session is a
        // sub-agent's (its call's timeout), its caller still counts the call.
        self.sub_figures.spend(self.ctx.op(), (Usage::default(), 1, 0));
        // Whatever becomes of the session while it waits, what is kept for it goes.
        let awaited = match name.starts_with("agent__") {
            true => self.sub_figures.await_call(&self.ctx, &call.id),
            false => None,
        };
        let (result, images) = self
            .orchestrator
            .execute_with_images(ToolCall::new(name, arguments).with_id(call.id.clone()), &ctx)
            .await;
        let (usage, calls, refused) = if name.starts_with("agent__") {
            // The figures the sub-agent's run left, whatever became of its report; a
            // report from elsewhere (an agent's run this session did not see start) says
            // its own.
            awaited.and_then(Awaited::take).or_else(|| usage_in(&result.extras)).unwrap_or_default()
        } else {
            (Usage::default(), 0, 0)
        };
        let text = result.conversation_text();
        // An asynchronous call, or a synchronous one that timed out: either's result comes
        // to the inbox later, which is read before each turn while one is pending.
        let late = !result.ok
            && name.starts_with("external__")
            && result.extras.get("resultTo").and_then(Value::as_str) == Some("inbox");
        if late || (result.ok && is_pending_external(name, &text)) {
            state.pending_external.fetch_add(1, Ordering::Relaxed);
        }
        let effect = if result.ok && state.ends_turn.contains(name) {
            Effect::EndsTurn(text.clone())
        } else {
            Effect::None
        };
        let (text, images) = attach_images(text, images);
        Outcome {
            result: ToolResultMessage::new(call.id.clone(), text, !result.ok).with_images(images),
            effect,
            usage,
            ran: true,
            calls,
            refused,
        }
    }

    fn final_report(&self, call: &ModelToolCall, arguments: Value, state: &State) -> Outcome {
        let report: internal::FinalReport = match serde_json::from_value(arguments) {
            Ok(report) => report,
            Err(e) => {
                return Outcome::error(
                    call,
                    format!("(tool failed: invalid report: {e}; call {FINAL_REPORT} again)"),
                );
            }
        };
        if report.content.as_deref().is_none_or(str::is_empty) && report.content_json.is_none() {
            return Outcome::error(
                call,
                format!(
                    "(tool failed: the report has no content: give `content` (text) or \
                     `content_json`; call {FINAL_REPORT} again)"
                ),
            );
        }
        if let Some(check) = &state.output_check {
            let content = report.content_json.clone().unwrap_or(Value::Null);
            if let Err(e) = check.validate("content_json", &content) {
                return Outcome::error(
                    call,
                    format!(
                        "(tool failed: {e}; call {FINAL_REPORT} again with `content_json` matching the schema)"
                    ),
                );
            }
        }
        // Results taken from the inbox are nowhere else: a report before they all reached
        // the model would lose the rest (on the last turn it is taken all the same).
        if !state.last && !state.arrived.is_empty() {
            return Outcome::error(
                call,
                match state.arrived.len() {
                    1 => format!(
                        "(tool failed: 1 more result of your asynchronous tool calls arrived \
                         and comes with your next turn: read it, then call {FINAL_REPORT})"
                    ),
                    n => format!(
                        "(tool failed: {n} more results of your asynchronous tool calls \
                         arrived and come with your next turn: read them, then call \
                         {FINAL_REPORT})"
                    ),
                },
            );
        }
        let status = match report.status {
            internal::ReportedStatus::Success => AgentStatus::Success,
            internal::ReportedStatus::Failure => AgentStatus::Failure,
            internal::ReportedStatus::Partial => AgentStatus::Partial,
        };
        let format = report.format.unwrap_or_else(|| {
            if report.content_json.is_some() && report.content.is_none() { "json" } else { "text" }
                .to_owned()
        });
        let mut out = AgentReport::failure(self.name, report.content.unwrap_or_default());
        out.status = status;
        out.format = format;
        out.content_json = report.content_json;
        out.metadata = report.metadata;
        let mut outcome = Outcome::answer(call, "reported".into(), false);
        outcome.effect = Effect::Report(Box::new(out));
        outcome
    }

    async fn batch(&self, call: &ModelToolCall, arguments: Value, state: &State) -> Outcome {
        let batch: internal::Batch = match serde_json::from_value(arguments) {
            Ok(batch) => batch,
            Err(e) => return Outcome::error(call, format!("(tool failed: invalid batch: {e})")),
        };
        if batch.calls.is_empty() || batch.calls.len() > internal::MAX_BATCH {
            return Outcome::error(
                call,
                format!(
                    "(tool failed: a batch takes 1 to {} calls, not {})",
                    internal::MAX_BATCH,
                    batch.calls.len()
                ),
            );
        }
        let inner = batch.calls.iter().enumerate().map(|(i, c)| {
            let id = format!("{}#{i}", call.id);
            let inner_call = ModelToolCall::new(id, c.tool.clone(), Value::Null);
            let arguments = c.arguments.clone().unwrap_or_else(|| json!({}));
            async move {
                let internal_tool = [FINAL_REPORT, TASK_STATUS, BATCH, ASK_USER, HANDOFF];
                if internal_tool.contains(&c.tool.as_str()) {
                    return Outcome::error(
                        &inner_call,
                        format!(
                            "(tool failed: `{}` cannot be called in a batch: call it on its own)",
                            c.tool
                        ),
                    );
                }
                self.tool(&inner_call, &c.tool, arguments, state).await
            }
        });
        let outcomes = join_all(inner).await;
        let mut usage = Usage::default();
        let (mut calls, mut refused) = (0, 0);
        let mut results = Vec::with_capacity(outcomes.len());
        let mut effect = Effect::None;
        let mut images = Vec::new();
        for (c, outcome) in batch.calls.iter().zip(outcomes) {
            images.extend(outcome.result.images);
            usage += outcome.usage;
            calls += u32::from(outcome.ran) + outcome.calls;
            refused += u32::from(!outcome.ran) + outcome.refused;
            if !outcome.ran {
                self.sub_figures.spend(self.ctx.op(), (Usage::default(), 0, 1));
            }
            if let Effect::EndsTurn(text) = outcome.effect {
                effect = Effect::EndsTurn(text);
            }
            let key = if outcome.result.is_error { "error" } else { "result" };
            results.push(json!({"tool": c.tool, "ok": !outcome.result.is_error, key: outcome.result.content}));
        }
        let mut text = serde_json::to_string_pretty(&results).unwrap_or_default();
        // The calls' images, in order, as many as one result shows; their results name them.
        if images.len() > MAX_IMAGES_PER_RESULT {
            let more = images.len() - MAX_IMAGES_PER_RESULT;
            images.truncate(MAX_IMAGES_PER_RESULT);
            text.push_str(&format!(
                "\n(the images of the first calls are shown, {more} more are not: a tool result \
                 shows at most {MAX_IMAGES_PER_RESULT} images)"
            ));
        }
        Outcome {
            result: ToolResultMessage::new(call.id.clone(), text, false).with_images(images),
            effect,
            usage,
            ran: false,
            calls,
            refused,
        }
    }

    async fn ask_user(&self, call: &ModelToolCall, arguments: Value) -> Outcome {
        let asked = arguments.clone();
        let ask: internal::AskUser = match serde_json::from_value(arguments) {
            Ok(ask) => ask,
            Err(e) => return Outcome::error(call, format!("(tool failed: invalid question: {e})")),
        };
        // The shorter of the model's wait and the configured one; neither: the run's.
        let wait = match (ask.timeout_seconds, self.config.ask_user_timeout) {
            (Some(asked), Some(limit)) => {
                Some(asked.clamp(1, internal::ASK_USER_MAX_WAIT_SECS).min(limit))
            }
            (Some(asked), None) => Some(asked.clamp(1, internal::ASK_USER_MAX_WAIT_SECS)),
            (None, limit) => limit,
        };
        let answer = match self.ctx.handler() {
            Some(handler) => match wait {
                Some(secs) => {
                    let asking = handler.clarify(&ask.question);
                    match tokio::time::timeout(Duration::from_secs(secs), asking).await {
                        Ok(answer) => answer,
                        Err(_) => {
                            let text = match &ask.default_answer {
                                Some(default) => format!(
                                    "(no answer within {secs} s; go on with your default answer: \
                                     {default})"
                                ),
                                None => format!(
                                    "(no answer within {secs} s: decide for yourself, and say in \
                                     your report what you assumed)"
                                ),
                            };
                            return Outcome::answer(call, text, false);
                        }
                    }
                }
                None => handler.clarify(&ask.question).await,
            },
            None => None,
        };
        match (answer, ask.default_answer) {
            (Some(answer), _) => Outcome::answer(call, answer, false),
            (None, Some(default)) => Outcome::answer(
                call,
                format!("(nobody can answer now; go on with your default answer: {default})"),
                false,
            ),
            // A run that pauses waits for the answer (the result is left out while it waits).
            (None, None)
                if self.handler.approvals.wait_for_answer(&call.id, &ask.question, &asked) =>
            {
                Outcome::answer(call, "(waiting for an answer)".into(), false)
            }
            (None, None) => {
                let mut outcome = Outcome::answer(
                    call,
                    "(nobody can answer now: the run ends with your question)".into(),
                    false,
                );
                outcome.effect = Effect::Question(ask.question);
                outcome
            }
        }
    }

    fn handoff(&self, call: &ModelToolCall, arguments: Value) -> Outcome {
        let handoff: internal::Handoff = match serde_json::from_value(arguments) {
            Ok(handoff) => handoff,
            Err(e) => return Outcome::error(call, format!("(tool failed: invalid hand-off: {e})")),
        };
        if !self.destinations.contains(&handoff.agent) {
            return Outcome::error(
                call,
                format!(
                    "(tool failed: `{}` is not a destination; hand off to one of: {})",
                    handoff.agent,
                    self.destinations.join(", ")
                ),
            );
        }
        let mut outcome = Outcome::answer(call, format!("handed to `{}`", handoff.agent), false);
        outcome.effect = Effect::Handoff { to: handoff.agent, message: handoff.message };
        outcome
    }
}

/// What a session knows while it runs.
struct State {
    /// The orchestrator's tools offered.
    names: HashSet<String>,
    /// Those of them that end the turn.
    ends_turn: HashSet<String>,
    /// The report's schema, compiled.
    output_check: Option<ArgumentValidator>,
    /// The last `agent__task_status`.
    task_status: Option<Value>,
    /// Whether the turn being run made calls besides `agent__task_status`: its answer
    /// then tells a model that can finalize to wait for their results.
    calls_besides_status: bool,
    /// The calls of the last turns, for the loop guard.
    repeats: Repeats,
    /// Calls of asynchronous external tools whose results have not reached the model yet.
    pending_external: AtomicUsize,
    /// Results taken from the inbox that have not reached the model yet, oldest first.
    arrived: VecDeque<Value>,
    /// The turn is the run's last: its report is taken whatever still waits.
    last: bool,
    /// The calls of one turn (or batch) run at once, but one that changes files or runs
    /// programs runs alone, in the order the model wrote them: shared for those, exclusive
    /// for these (tokio's lock is fair, so a write waits for the reads before it and the
    /// reads after it wait for the write).
    gate: tokio::sync::RwLock<()>,
    /// Calls of the last answer whose arguments the output limit cut off.
    cut: HashSet<String>,
}

/// Whether a call of a tool with `annotations` must run alone among a turn's calls: it
/// writes files or runs programs (permission class `write` or `execute`), or says it may
/// destroy data (as an MCP tool is assumed to unless it says it only reads or only adds).
/// Two edits of one file at once would lose one; a build and a test run at once would race.
/// Tools that only read, and tools of no such class that do not say they destroy (sub-agents,
/// which a model fans out to on purpose), run side by side.
fn runs_alone(annotations: &toolmux_core::ToolAnnotations) -> bool {
    use toolmux_core::PermissionClass;
    match annotations.permission {
        Some(PermissionClass::Write | PermissionClass::Execute) => true,
        Some(_) => false,
        None => annotations.destructive && !annotations.read_only,
    }
}

/// What a model is told when a stop hook does not let it end.
fn go_on_message(reason: &str) -> Message {
    Message::user(format!(
        "(A Stop hook of the configuration does not let you end yet: {reason}. Continue, then \
         end again.)"
    ))
}

/// The gateway's built-in tools, every agent's.
const GATEWAY_PREFIX: &str = "gateway__";

/// What an agent carries into a run, from the gateway.
const GATEWAY_CONTEXT: &str = "gateway__context";

/// Whether `text`, the result of a call of `tool`, says the call is pending: an
/// asynchronous external tool answers `{"status": "pending", "callId": …}` at once, and
/// its result comes to the run's inbox later.
fn is_pending_external(tool: &str, text: &str) -> bool {
    if !tool.starts_with("external__") || !text.starts_with('{') {
        return false;
    }
    serde_json::from_str::<Value>(text).is_ok_and(|v| {
        v.get("status").and_then(Value::as_str) == Some("pending")
            && v.get("callId").is_some_and(Value::is_string)
    })
}

/// What agent `agent` carries into a run when the gateway keeps it (`spaces` configured),
/// read as `ctx`'s operation: its goals, memories and plans, its active space and what was
/// said there since it last read; `None` when there is nothing or no gateway.
pub(crate) async fn carried(
    orchestrator: &Orchestrator,
    ctx: &CallContext,
    agent: &str,
) -> Option<String> {
    orchestrator.registry().get(GATEWAY_CONTEXT)?;
    let ctx = ctx.child().outside_budget();
    let got = orchestrator.execute(ToolCall::new(GATEWAY_CONTEXT, json!({})), &ctx).await;
    if !got.ok {
        let why = got.conversation_text();
        tracing::debug!(agent, "the gateway's context could not be read: {why}");
        return None;
    }
    let context: Value = serde_json::from_str(&got.conversation_text()).ok()?;
    let mut parts = Vec::new();
    if let Some(space) = context.get("activeSpace").and_then(Value::as_str) {
        let unread = context.get("unreadCount").and_then(Value::as_u64).unwrap_or(0);
        let mut part = format!("You are in space `{space}` ({unread} unread messages).");
        if let Some(messages) =
            context.get("unread").filter(|m| m.as_array().is_some_and(|a| !a.is_empty()))
        {
            part.push_str(&format!(" The latest:\n{messages}"));
        }
        parts.push(part);
    }
    for key in ["goals", "memories", "plans"] {
        if let Some(items) =
            context.get(key).filter(|i| i.as_array().is_some_and(|a| !a.is_empty()))
        {
            parts.push(format!("Your {key}: {items}"));
        }
    }
    (!parts.is_empty())
        .then(|| format!("(What you carry from earlier runs.)\n{}", parts.join("\n")))
}

/// How many calls in `history` an asynchronous external tool answered as pending (some
/// may have had their results since; the inbox tells).
fn pending_in(history: &[Message]) -> usize {
    let mut tools = HashMap::new();
    let mut pending = 0;
    for message in history {
        match message {
            Message::Assistant { tool_calls, .. } => {
                tools.extend(tool_calls.iter().map(|c| (c.id.as_str(), c.name.as_str())));
            }
            Message::Tool { results } => {
                pending += results
                    .iter()
                    .filter(|r| {
                        tools.get(r.call_id.as_str()).is_some_and(|tool| {
                            !r.is_error && is_pending_external(tool, &r.content)
                        })
                    })
                    .count();
            }
            _ => {}
        }
    }
    pending
}

/// The figures (tokens, calls that ran, calls refused) of sub-agents' runs, by the
/// operation of the session that called each and the call's id, until that session takes
/// them. A report carries its figures back to its caller, but one refused on its way (over
/// the run's context budget, blocked by a hook) would lose them with it, and the tokens
/// were spent all the same. A run the orchestrator cuts (the call's timeout) never
/// reports: while it runs, what its sessions and those below them spend is added as it is
/// spent, so that its caller takes what it spent until the cut.
#[derive(Debug, Default)]
pub(crate) struct SubFigures(Mutex<Kept>);

/// What [`SubFigures`] keeps.
#[derive(Debug, Default)]
struct Kept {
    /// The figures, by the calling session's operation and the call's id: none while the
    /// session waits for a run that has not started.
    figures: HashMap<(u64, String), Option<Figures>>,
    /// The runs under way that a session called, by their operation: where what they
    /// spend goes.
    running: HashMap<u64, (u64, String)>,
}

/// A run's tokens, the calls that ran and the calls refused.
type Figures = (Usage, u32, u32);

impl SubFigures {
    /// The calling session's operation and the call's id, for the run `ctx` (the context
    /// of its call) makes, if a session called it. A run no session called (an MCP
    /// client's call of an agent) has no such session: nothing is kept.
    fn key(ctx: &CallContext) -> Option<(u64, String)> {
        let caller = ctx.op().and_then(|op| op.parent())?;
        let (true, Some(call_id)) = (caller.tool().starts_with("agent__"), ctx.call_id()) else {
            return None;
        };
        Some((caller.id(), call_id.to_owned()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts keeping, for call `call_id` of `ctx`'s session (a call of an agent), the
    /// figures of the run it makes; the guard takes them ([`Awaited::take`]), and forgets
    /// them when dropped untaken (the session was cut while it waited), so that nothing is
    /// left behind in a process that lives long.
    fn await_call(&self, ctx: &CallContext, call_id: &str) -> Option<Awaited<'_>> {
        let key = (ctx.op()?.id(), call_id.to_owned());
        self.lock().figures.insert(key.clone(), None);
        Some(Awaited { sub_figures: self, key })
    }

    /// Counts what the sub-agent run that `ctx` (the context of its call) makes spends
    /// from now on ([`SubFigures::spend`]), if the session that called it awaits its
    /// figures; the guard stops counting when dropped, however the run ends.
    pub(crate) fn start(&self, ctx: &CallContext) -> Running<'_> {
        let op = ctx.op().map(|op| op.id());
        if let (Some(key), Some(op)) = (Self::key(ctx), op) {
            let mut kept = self.lock();
            if let Some(figures) = kept.figures.get_mut(&key) {
                figures.get_or_insert_default();
                kept.running.insert(op, key);
            }
        }
        Running { sub_figures: self, op }
    }

    /// Keeps the figures of `report`, the report of the sub-agent run `ctx` (the context
    /// of its call) made, for the session that called it, in place of what was counted as
    /// it ran: the report's are whole. Nothing is kept for a session no longer waiting.
    pub(crate) fn record(&self, ctx: &CallContext, report: &AgentReport) {
        let Some(key) = Self::key(ctx) else { return };
        let mut kept = self.lock();
        if let Some(op) = ctx.op() {
            kept.running.remove(&op.id());
        }
        if let Some(figures) = kept.figures.get_mut(&key) {
            *figures = Some((report.usage, report.tool_calls, report.refused_calls));
        }
    }

    /// Counts `spent` (tokens, calls that ran, calls refused) that the agent of operation
    /// `op` just spent (its session, or its model answering its tools' sampling requests)
    /// in the figures of every sub-agent run under way it is part of: its own, if a
    /// session called it, and those of the agents above it.
    pub(crate) fn spend(&self, op: Option<&Arc<Op>>, spent: Figures) {
        let Some(op) = op else { return };
        let mut kept = self.lock();
        if kept.running.is_empty() {
            return;
        }
        let Kept { figures, running } = &mut *kept;
        for above in std::iter::once(&**op).chain(op.ancestors()) {
            let Some(key) = running.get(&above.id()) else { continue };
            if let Some(Some(figures)) = figures.get_mut(key) {
                figures.0 += spent.0;
                figures.1 = figures.1.saturating_add(spent.1);
                figures.2 = figures.2.saturating_add(spent.2);
            }
        }
    }

    /// The figures kept under `key`, taken out: those of its report, or what its run
    /// spent until it was cut; none when no run started for it here.
    fn take(&self, key: &(u64, String)) -> Option<Figures> {
        let mut kept = self.lock();
        // A run that was cut may still be listed as under way.
        kept.running.retain(|_, running| running != key);
        kept.figures.remove(key).flatten()
    }

    /// Whether nothing is kept: no run is under way, no session waits for figures.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        let kept = self.lock();
        kept.figures.is_empty() && kept.running.is_empty()
    }
}

/// A session's wait for the figures of the sub-agent run one of its calls makes
/// ([`SubFigures::await_call`]).
#[derive(Debug)]
struct Awaited<'a> {
    sub_figures: &'a SubFigures,
    key: (u64, String),
}

impl Awaited<'_> {
    /// The figures of the sub-agent's run: those of its report, or what it spent until it
    /// was cut; none when no run started for it here (refused before it ran, or run
    /// elsewhere, whose output says its own).
    fn take(self) -> Option<Figures> {
        self.sub_figures.take(&self.key)
    }
}

impl Drop for Awaited<'_> {
    fn drop(&mut self) {
        self.sub_figures.take(&self.key);
    }
}

/// A sub-agent's run under way whose spending counts for the session that called it
/// ([`SubFigures::start`]).
#[derive(Debug)]
pub(crate) struct Running<'a> {
    sub_figures: &'a SubFigures,
    op: Option<u64>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(op) = self.op {
            self.sub_figures.lock().running.remove(&op);
        }
    }
}

/// The tokens left to each running session with a budget, by its operation's id.
#[derive(Debug, Default)]
pub(crate) struct Budgets(Mutex<HashMap<u64, u64>>);

impl Budgets {
    /// The least any session above `ctx`'s operation with a budget has left.
    fn left_above(&self, ctx: &CallContext) -> Option<u64> {
        let op = ctx.op()?;
        let left = self.0.lock().unwrap_or_else(|e| e.into_inner());
        op.ancestors().filter_map(|above| left.get(&above.id()).copied()).min()
    }

    /// Takes `tokens` that `ctx`'s session just used from what every session above it has
    /// left (its own is worked out again at its next turn).
    fn spend(&self, ctx: &CallContext, tokens: u64) {
        let Some(op) = ctx.op() else { return };
        let mut left = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if left.is_empty() {
            return;
        }
        for above in op.ancestors() {
            if let Some(left) = left.get_mut(&above.id()) {
                *left = left.saturating_sub(tokens);
            }
        }
    }

    /// Records what `ctx`'s session has left.
    fn set(&self, ctx: &CallContext, left: u64) {
        if let Some(op) = ctx.op() {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(op.id(), left);
        }
    }

    /// Forgets `ctx`'s session when the guard is dropped, however the session ends (a
    /// report, or its caller cut it while it ran), so that nothing is left behind in a
    /// process that lives long.
    fn end_with<'a>(&'a self, ctx: &CallContext) -> impl Drop + 'a {
        struct Forget<'a>(&'a Budgets, Option<u64>);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                if let Some(op) = self.1 {
                    self.0.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&op);
                }
            }
        }
        Forget(self, ctx.op().map(|op| op.id()))
    }

    /// Whether no session's budget is kept.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
}

/// When an agent called with `deadline` ends its run: a twentieth of the time left before
/// it (at least 20 ms, at most 2 s), for its report to reach its caller.
pub(crate) fn finish_by(deadline: Instant) -> Instant {
    let left = deadline.saturating_duration_since(Instant::now());
    let margin = (left / 20).clamp(Duration::from_millis(20), Duration::from_secs(2));
    deadline.checked_sub(margin).unwrap_or(deadline).max(Instant::now().min(deadline))
}

/// How a report whose model failed begins.
pub(crate) const MODEL_FAILED: &str = "the model failed";

/// The calls the model made in each of the last turns, by tool and arguments (canonical
/// JSON), with how many turns in a row it made each and got the same result.
#[derive(Debug, Default)]
struct Repeats(HashMap<String, Repeat>);

/// One call's row of turns ([`Repeats`]).
#[derive(Debug, Default, Clone)]
struct Repeat {
    /// Turns in a row it was made, each result one already seen in the row.
    count: u32,
    /// Hashes of the results it got in this row of turns (at most [`MAX_SEEN_RESULTS`]):
    /// a result that alternates between values seen before (a file's content and "unchanged
    /// since last read") is a repeat too, where comparing with the last alone reset the
    /// count at each change.
    seen: Vec<u64>,
    /// Its last result was none seen before in the row.
    changed: bool,
}

/// The most results of one call's row of turns kept to tell a new result from one seen.
const MAX_SEEN_RESULTS: usize = 64;

/// Turns in a row in which a call is refused as a repeat and no other tool runs, after
/// which the next turn is the last and asks for the report: the model is going round.
const REPEATING_TURNS_BEFORE_REPORT: u32 = 3;

/// Whether `tool` is one of the session's own tools, which [`Repeats`] leaves out (a status
/// report or a search may well repeat).
fn is_own(tool: &str) -> bool {
    [FINAL_REPORT, TASK_STATUS, BATCH, ASK_USER, HANDOFF, search::SEARCH].contains(&tool)
}

impl Repeats {
    /// Records a turn's `calls`; for each, the turns in a row it was made before when that
    /// passes `max` (0: no limit), so that it is not made again. A call whose result last
    /// time was none it had got in the row starts a new count (`cat f.txt` after each
    /// edit); one that came back to a result seen before counts on. The session's own
    /// tools are left out (a status report or a search may well repeat).
    fn turn(&mut self, calls: &[ModelToolCall], max: u32) -> Vec<Option<u32>> {
        let mut now: HashMap<String, Repeat> = HashMap::new();
        let verdicts = calls
            .iter()
            .map(|call| {
                if is_own(&call.name) {
                    return None;
                }
                let key = toolmux_orchestrator::cache::cache_key(&call.name, &call.arguments);
                let before = self.0.remove(&key).or_else(|| now.get(&key).cloned());
                let before = before.unwrap_or_default();
                let count = if before.changed { 1 } else { before.count.saturating_add(1) };
                // The same call twice in one turn counts once.
                let entry = now.entry(key).or_insert(Repeat { count, ..before });
                (max > 0 && entry.count > max).then_some(entry.count - 1)
            })
            .collect();
        self.0 = now;
        verdicts
    }

    /// Records what the turn's calls that ran returned.
    fn results<'a>(&mut self, ran: impl Iterator<Item = (&'a ModelToolCall, &'a str)>) {
        use std::hash::{BuildHasher as _, BuildHasherDefault};
        for (call, result) in ran {
            let key = toolmux_orchestrator::cache::cache_key(&call.name, &call.arguments);
            let Some(entry) = self.0.get_mut(&key) else { continue };
            let hash = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
                .hash_one(result);
            entry.changed = !entry.seen.is_empty() && !entry.seen.contains(&hash);
            if !entry.seen.contains(&hash) && entry.seen.len() < MAX_SEEN_RESULTS {
                entry.seen.push(hash);
            }
        }
    }
}

/// The share of the context window a request may fill: the rest is for the answer and for
/// the estimate's error (four bytes a token).
const CONTEXT_SHARE: f64 = 0.8;

/// How many times one turn is shortened and asked again after the API refuses it as over
/// the context window (or cuts its answer there), before the run fails saying so.
const MAX_SHORTENINGS: u32 = 4;

/// What each shortening after the first leaves of the share before ([`CONTEXT_SHARE`]):
/// 80%, 60%, 45%, 34% of the window.
const SHORTENING: f64 = 0.75;

/// Of the window left once the room an answer needs is taken off, what a request may fill
/// after an answer was cut at the window: the rest is for the estimate's error.
const ROOM_MARGIN: f64 = 0.9;

/// How much of a `window` of tokens a request may fill: [`CONTEXT_SHARE`] of it.
fn window_budget(window: u64) -> u64 {
    (window as f64 * CONTEXT_SHARE) as u64
}

/// What the answer to a request needs room for, in [`request_tokens`]' estimate.
#[derive(Debug, Clone, Copy, Default)]
struct AnswerRoom {
    /// What an answer cut at the window had written by then: it needs more.
    written: Option<u64>,
    /// The most tokens an answer may have (the request's or the model's `maxTokens`).
    most: Option<u64>,
}

/// The room an answer to `request` needs, from the API's `overflow` (an answer cut at the
/// window says what it had written) and the most an answer may have, `most`, both scaled
/// from the API's tokens to the estimate as [`overflow_window`] scales the window.
fn answer_room(request: &ModelRequest, overflow: ContextOverflow, most: Option<u64>) -> AnswerRoom {
    let scale = match overflow.tokens {
        Some(tokens) if tokens > 0 => request_tokens(request).max(1) as f64 / tokens as f64,
        _ => 1.0,
    };
    let scaled = |tokens: u64| (tokens as f64 * scale).ceil() as u64;
    AnswerRoom { written: overflow.written.map(scaled), most: most.map(scaled) }
}

/// How much a request may fill, in [`request_tokens`]' estimate, after the API refused it
/// (or cut its answer) at a `window` of that estimate, the `attempt`th time this turn: a
/// share of the window that shrinks with each attempt ([`SHORTENING`]), and after a cut
/// answer no more than leaves it room for twice what it wrote, doubling with each
/// attempt, up to the most an answer may have. Asked to go on in the room the cut left
/// (a share of the window, when the answer was a quarter or more of the request), the
/// model was cut again, and the run failed with old tool results left to elide.
fn shortened_budget(window: u64, room: AnswerRoom, attempt: u32) -> u64 {
    let share = CONTEXT_SHARE * SHORTENING.powi(attempt.saturating_sub(1).min(16) as i32);
    let by_share = (window as f64 * share) as u64;
    let Some(written) = room.written else { return by_share };
    let wanted = written.saturating_mul(1 << attempt.min(16));
    let wanted = room.most.map_or(wanted, |most| wanted.min(most)).max(written);
    let by_room = (window.saturating_sub(wanted) as f64 * ROOM_MARGIN) as u64;
    by_share.min(by_room)
}

/// Heads what the tools' providers say, after the agent's own instructions.
const PROVIDERS_HEADING: &str = "# What the providers of your tools say about them";

/// Tool results shorter than this are never elided: the note would save nothing.
const ELIDE_MIN: usize = 400;

/// Keeps `request` within `budget` tokens (in [`request_tokens`]' estimate) by replacing
/// the oldest tool results (never the latest turn's) with a note saying what was there.
/// The conversation is changed for good, so later turns send the same prefix. A request
/// still too large after that (one huge message) is sent as it is, and the API says so.
pub(crate) fn fit_context(request: &mut ModelRequest, budget: u64) -> usize {
    let mut size = request_tokens(request);
    let mut elided = 0;
    let last_results = request.messages.iter().rposition(|m| matches!(m, Message::Tool { .. }));
    for (at, message) in request.messages.iter_mut().enumerate() {
        if size <= budget {
            break;
        }
        let Message::Tool { results } = message else { continue };
        if Some(at) == last_results {
            break;
        }
        for result in results.iter_mut().filter(|r| is_elidable(r)) {
            if size <= budget {
                break;
            }
            let images = match result.images.len() {
                0 => String::new(),
                1 => " and an image".to_owned(),
                n => format!(" and {n} images"),
            };
            let note = format!(
                "(this result, {} characters{images}, was elided to keep the conversation \
                 within the model's context window; call the tool again if you need it)",
                result.content.len()
            );
            let before = estimate_tokens(result.content.len()) + image_tokens(&result.images);
            size -= before.saturating_sub(estimate_tokens(note.len()));
            result.content = note;
            result.images.clear();
            elided += 1;
        }
    }
    if elided > 0 {
        tracing::debug!(target: "toolmux::agent", elided, tokens = size, budget, "tool results elided");
    }
    elided
}

/// Whether [`fit_context`] would find a result to elide with a budget small enough.
fn elidable_left(request: &ModelRequest) -> bool {
    let last_results = request.messages.iter().rposition(|m| matches!(m, Message::Tool { .. }));
    request.messages.iter().enumerate().any(|(at, message)| match message {
        Message::Tool { results } if Some(at) != last_results => results.iter().any(is_elidable),
        _ => false,
    })
}

/// Whether eliding `result` would save anything: it is long, or shows images (an elided
/// result's note is shorter than [`ELIDE_MIN`], so it is never elided twice).
fn is_elidable(result: &ToolResultMessage) -> bool {
    result.content.len() >= ELIDE_MIN || !result.images.is_empty()
}

/// The window, in [`request_tokens`]' estimate, that `request` had to fit when the API
/// refused it as `overflow`: the API's limit scaled by how its count of this request
/// compares with the estimate (four bytes a token undercounts code and most non-English
/// text); without its count, the smaller of its limit and the estimate; without either, the
/// estimate, so that something gives way.
fn overflow_window(request: &ModelRequest, overflow: ContextOverflow) -> u64 {
    let size = request_tokens(request).max(1);
    match (overflow.limit, overflow.tokens) {
        (Some(limit), Some(tokens)) if tokens > 0 => {
            (limit as f64 * size as f64 / tokens as f64) as u64
        }
        (Some(limit), _) => limit.min(size),
        (None, _) => size,
    }
}

/// The request's size in tokens, estimated as the orchestrator's budget does.
fn request_tokens(request: &ModelRequest) -> u64 {
    let text: usize = request.messages.iter().map(message_bytes).sum();
    let images: u64 = request.messages.iter().map(message_image_tokens).sum();
    let tools: usize = request
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.input_schema.to_string().len())
        .sum();
    let system = request.system.as_ref().map_or(0, String::len);
    estimate_tokens(text + tools + system) + images
}

/// The size of `message` in tokens, estimated as [`request_tokens`] estimates a request's.
pub(crate) fn message_tokens(message: &Message) -> u64 {
    estimate_tokens(message_bytes(message)) + message_image_tokens(message)
}

/// The bytes of text `message` sends: its text, reasoning, blocks, calls and results.
fn message_bytes(message: &Message) -> usize {
    match message {
        Message::User { content } => content.len(),
        Message::Assistant { content, tool_calls, reasoning, blocks } => {
            content.len()
                + reasoning.as_ref().map_or(0, |r| r.text.len())
                // The blocks go in place of the text and calls, which they hold too:
                // counted whole, the estimate errs on the high side.
                + blocks.as_ref().map_or(0, |kept| {
                    kept.blocks.iter().map(|block| block.to_string().len()).sum()
                })
                + tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.to_string().len())
                    .sum::<usize>()
        }
        Message::Tool { results } => results.iter().map(|r| r.content.len()).sum(),
    }
}

/// What the images of `message`'s tool results cost in tokens.
fn message_image_tokens(message: &Message) -> u64 {
    match message {
        Message::Tool { results } => results.iter().map(|r| image_tokens(&r.images)).sum(),
        _ => 0,
    }
}

/// What an image costs in tokens, about: Anthropic counts width × height / 750, at most
/// about 1,600 for the largest it takes unscaled; OpenAI 765 for a 1024×1024 image in
/// detail. Its base64 length says nothing of it.
const IMAGE_TOKENS: u64 = 1600;

fn image_tokens(images: &[ImagePart]) -> u64 {
    images.len() as u64 * IMAGE_TOKENS
}

/// The most images one tool result shows the model; more are named in its text.
const MAX_IMAGES_PER_RESULT: usize = 4;

/// The largest image shown, decoded: Anthropic's limit (OpenAI takes larger ones).
const MAX_IMAGE_BYTES: usize = 5 * 1024 * 1024;

/// The most images a request carries: Anthropic takes at most 100, and scales down each
/// image of a request of more than 20.
const MAX_IMAGES_SENT: usize = 20;

/// The most image bytes (decoded) a request carries: Anthropic takes requests of at most
/// 32 MB, base64 making 4 bytes of 3.
const MAX_IMAGE_BYTES_SENT: usize = 20 * 1024 * 1024;

/// The text of a tool result and the images to show with it, from `parts`, the output's
/// images ([`Orchestrator::execute_with_images`]). The text already names every image;
/// one not shown (a type models do not read, too large, not base64, one too many) is
/// named again in a note saying why.
fn attach_images(mut text: String, parts: Vec<ContentPart>) -> (String, Vec<ImagePart>) {
    let mut images = Vec::new();
    for part in parts {
        let image = match part {
            ContentPart::Image { data, mime_type } => ImagePart::new(mime_type, data),
            ContentPart::Resource { mime_type: Some(mime_type), blob: Some(data), .. } => {
                ImagePart::new(mime_type, data)
            }
            _ => continue,
        };
        let why = if image.media_type().is_none() {
            "not shown: models read only jpeg, png, gif and webp images".to_owned()
        } else if image.decoded_len() > MAX_IMAGE_BYTES {
            format!("not shown: larger than the {} MiB an image may have", MAX_IMAGE_BYTES >> 20)
        } else if !is_base64(&image.data) {
            "not shown: its data is not base64".to_owned()
        } else if images.len() == MAX_IMAGES_PER_RESULT {
            format!("not shown: a tool result shows at most {MAX_IMAGES_PER_RESULT} images")
        } else {
            images.push(image);
            continue;
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&image.placeholder(&why));
    }
    (text, images)
}

/// Whether `data` is standard base64 with its padding, as both APIs want it.
fn is_base64(data: &str) -> bool {
    data.len().is_multiple_of(4)
        && data.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
}

/// Keeps the images of the conversation's tool results within what one request may carry
/// ([`MAX_IMAGES_SENT`], [`MAX_IMAGE_BYTES_SENT`]): the newest stay, older ones become a
/// note in their result's text. The conversation is changed for good, so later turns send
/// the same prefix.
fn drop_old_images(messages: &mut [Message]) {
    let (mut count, mut bytes, mut full) = (0, 0, false);
    for message in messages.iter_mut().rev() {
        let Message::Tool { results } = message else { continue };
        for result in results.iter_mut().rev() {
            let mut kept = Vec::with_capacity(result.images.len());
            let mut notes = Vec::new();
            for image in std::mem::take(&mut result.images) {
                let size = image.decoded_len();
                full = full || count == MAX_IMAGES_SENT || bytes + size > MAX_IMAGE_BYTES_SENT;
                if !full {
                    count += 1;
                    bytes += size;
                    kept.push(image);
                } else {
                    notes.push(image.placeholder(
                        "dropped from this older result: a request carries only the newest images",
                    ));
                }
            }
            result.images = kept;
            for note in notes {
                if !result.content.is_empty() {
                    result.content.push('\n');
                }
                result.content.push_str(&note);
            }
        }
    }
}

/// `spec` as the model is offered it.
fn tool_definition(spec: ToolSpec) -> ToolDefinition {
    ToolDefinition::new(spec.name, spec.description, Value::clone(&spec.input_schema))
}

/// A turn's `calls` and their outcomes without those `pending` (their results wait with
/// them), and the calls that wait. When another call of the turn ends the run (a report, a
/// hand-off), nothing waits: the waiting calls are answered as not run.
fn held(
    calls: Vec<(&ModelToolCall, Outcome)>,
    pending: Vec<PendingCall>,
) -> (Vec<(&ModelToolCall, Outcome)>, Vec<PendingCall>) {
    if pending.is_empty() {
        return (calls, pending);
    }
    let waiting: HashSet<String> = pending.iter().map(|p| p.call_id.clone()).collect();
    let ends =
        calls.iter().any(|(_, o)| matches!(o.effect, Effect::Report(_) | Effect::Handoff { .. }));
    if ends {
        let calls = calls
            .into_iter()
            .map(|(call, outcome)| {
                if waiting.contains(&call.id) {
                    (call, Outcome::error(call, pause::NOT_DECIDED.to_owned()))
                } else {
                    (call, outcome)
                }
            })
            .collect();
        return (calls, Vec::new());
    }
    let kept = calls.into_iter().filter(|(call, _)| !waiting.contains(&call.id)).collect();
    (kept, pending)
}

/// `history` ready to go on from: tool calls of its last turn that got no result (the
/// report that ended the run) are answered, since the APIs refuse a call without one.
fn continued(history: &[Message]) -> Vec<Message> {
    let mut messages = history.to_vec();
    if let Some(Message::Assistant { tool_calls, .. }) = messages.last()
        && !tool_calls.is_empty()
    {
        let results = tool_calls
            .iter()
            .map(|call| ToolResultMessage::new(call.id.clone(), "done", false))
            .collect();
        messages.push(Message::Tool { results });
    }
    messages
}
