//! Agents that live in cycles, as the seeds' gateway runs them: the agent sleeps until its
//! inbox has something (messages of others in its active space, results of its
//! asynchronous external calls), then works on it in one run, a cycle, and sleeps again.
//! Each cycle goes on from the conversation of the cycles before it, the oldest turns
//! giving way first to `listenHistoryTokens`.

use crate::config::DEFAULT_LISTEN_HISTORY_TOKENS;
use crate::inbox::{self, EXTERNAL_INBOX};
use crate::session;
use crate::{AgentError, AgentReport, AgentStatus, Agents, NAMESPACE, RunOptions};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;
use toolmux_core::{CallContext, Op, ToolCall};
use toolmux_llm::Message;
use toolmux_orchestrator::{Orchestrator, Redactor};

/// The gateway's tool that makes a space the active one.
const ENTER_SPACE: &str = "gateway__enter_space";
/// The gateway's long poll for unread messages of others.
const WAIT: &str = "gateway__wait";

/// How long one look at the inbox waits before the loop looks at the rest (the external
/// inbox, the idle limit, cancellation) again.
const LOOK: Duration = Duration::from_secs(1);

/// How an agent listens ([`Agents::listen`]).
#[derive(Debug, Clone, Default)]
pub struct ListenOptions {
    /// The space to enter first (the agent's active space otherwise, if it has one).
    pub space: Option<String>,
    /// Stop after this many cycles.
    pub max_cycles: Option<usize>,
    /// Stop after this long with nothing in the inbox.
    pub idle: Option<Duration>,
}

/// Why listening ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListenEnd {
    /// `max_cycles` were run.
    Cycles,
    /// Nothing came for `idle`.
    Idle,
    /// The caller cancelled.
    Cancelled,
}

/// What woke the agent.
#[derive(Debug, Default)]
struct Wake {
    /// The active space and how many messages of others it has unread.
    space: Option<(String, u64)>,
    /// Results of asynchronous external calls.
    results: Vec<Value>,
}

impl Wake {
    fn is_empty(&self) -> bool {
        self.space.as_ref().is_none_or(|(_, unread)| *unread == 0) && self.results.is_empty()
    }

    /// The task of the cycle: what arrived. The unread messages themselves come with what
    /// the agent carries into the run.
    fn task(&self) -> String {
        let mut parts = Vec::new();
        if let Some((space, unread)) = &self.space
            && *unread > 0
        {
            parts.push(format!(
                "{unread} new message{} arrived in space `{space}` (shown above). Answer \
                 them in the space with `gateway__send_message` if they need an answer, or \
                 call `gateway__skip` when there is nothing to do.",
                if *unread == 1 { "" } else { "s" }
            ));
        }
        if !self.results.is_empty() {
            parts.push(format!(
                "Results of your earlier asynchronous tool calls arrived:\n{}",
                Value::Array(self.results.clone())
            ));
        }
        parts.join("\n\n")
    }
}

impl Agents {
    /// Runs agent `name` in cycles: whenever messages of others arrive in its active space
    /// (`space` is entered first) or results of its asynchronous external calls arrive, one
    /// run works on them; `on_cycle` gets each run's report. All cycles share `ctx`'s run,
    /// so that results of calls a cycle made reach a later one. Ends after `max_cycles`,
    /// after `idle` with nothing arriving, or when `ctx` is cancelled. Needs `spaces` (the
    /// gateway's tools) or external tools: without either nothing could wake the agent.
    ///
    /// Each cycle goes on from the conversation of the cycles before it (what they were
    /// given, the calls they made and their results), up to the agent's
    /// [`listen_history_tokens`] tokens, the oldest turns giving way first; 0 makes every
    /// cycle a run of its own. Each report is its cycle's alone: its turns, calls and tokens
    /// are those the cycle spent (the carried conversation is sent again, and counted, as
    /// the cycle's model reads it), and it holds no transcript.
    ///
    /// The inbox gives each result once, so none taken out is dropped: the results a cycle
    /// took and did not read wake the next; those still waiting when listening stops go in
    /// the last report's [`AgentReport::unread_results`] (in a report of no cycle, when it
    /// was cancelled between cycles), and so do those of a cycle whose model failed on every
    /// attempt or that cancellation cut (whether it acted on them is not known). An error
    /// that stops listening says what was not read.
    ///
    /// [`listen_history_tokens`]: crate::AgentConfig::listen_history_tokens
    pub async fn listen(
        &self,
        name: &str,
        ctx: &CallContext,
        options: &ListenOptions,
        mut on_cycle: impl FnMut(&AgentReport),
    ) -> Result<ListenEnd, AgentError> {
        if !self.names().iter().any(|n| n == name) {
            return Err(AgentError::UnknownAgent { name: name.to_owned(), known: self.names() });
        }
        let orchestrator = self.orchestrator().ok_or(AgentError::Detached)?;
        let registry = orchestrator.registry();
        let (spaces, inbox) =
            (registry.get(WAIT).is_some(), registry.get(EXTERNAL_INBOX).is_some());
        if !spaces && !inbox {
            return Err(AgentError::Config {
                agent: name.to_owned(),
                message: "nothing can wake a listening agent: configure `spaces` (messages in \
                          its space wake it) or `externalTools` (their asynchronous results do)"
                    .to_owned(),
            });
        }
        // The loop's own calls act as the agent, as its runs' calls do.
        let own = ctx.clone().with_op(Op::new(format!("{NAMESPACE}__{name}"), ctx.op().cloned()));
        if let Some(space) = &options.space {
            if !spaces {
                return Err(AgentError::Config {
                    agent: name.to_owned(),
                    message: "`--space` needs `spaces` in the configuration".to_owned(),
                });
            }
            let args = json!({"space": space, "history": 0});
            call(&orchestrator, ENTER_SPACE, args, &own)
                .await
                .map_err(|message| AgentError::Config { agent: name.to_owned(), message })?;
        }
        if spaces {
            // A store that fails, or permissions that refuse the agent its space, are told
            // now rather than warned of every second.
            call(&orchestrator, WAIT, json!({"waitMs": 0}), &own)
                .await
                .map_err(|message| AgentError::Config { agent: name.to_owned(), message })?;
        }
        let history_cap = self.history_cap(name);
        // The conversation of the cycles so far, within `history_cap`.
        let mut history = Vec::new();
        let mut cycles = 0;
        let mut quiet_since = Instant::now();
        // Results taken from the inbox that no cycle was given yet: a cycle is given what
        // fits the tools' size cap, the rest wake the next.
        let mut arrived = VecDeque::new();
        loop {
            if ctx.is_cancelled() {
                if !arrived.is_empty() {
                    let mut report = AgentReport::failure(
                        name,
                        "listening was cancelled before a cycle worked on what arrived".to_owned(),
                    );
                    report.unread_results.extend(arrived.drain(..));
                    on_cycle(&report.redacted(orchestrator.redactor()));
                }
                return Ok(ListenEnd::Cancelled);
            }
            // Results waiting wake a cycle at once, so listening is not idle.
            if arrived.is_empty() && options.idle.is_some_and(|idle| quiet_since.elapsed() >= idle)
            {
                return Ok(ListenEnd::Idle);
            }
            let wake = look(&orchestrator, &own, spaces, inbox, &mut arrived).await;
            if wake.is_empty() {
                if !spaces {
                    // Nothing to wait on but the external inbox: look again a little later.
                    tokio::select! {
                        () = tokio::time::sleep(LOOK) => {}
                        () = ctx.cancel_token().cancelled() => {}
                    }
                }
                continue;
            }
            let mut task = wake.task();
            // A cycle going on from a conversation is given what the gateway keeps for the
            // agent (the unread messages among it) with its task, as a fresh run is first.
            if !history.is_empty()
                && let Some(carried) = session::carried(&orchestrator, &own, name).await
            {
                task = format!("{carried}\n\n{task}");
            }
            let mut report = match self.cycle(name, &task, ctx, &history).await {
                Ok(report) => report,
                Err((e, taken)) => {
                    let unread: Vec<Value> =
                        wake.results.into_iter().chain(taken).chain(arrived).collect();
                    return Err(not_read(name, e, &unread, orchestrator.redactor()));
                }
            };
            cycles += 1;
            quiet_since = Instant::now();
            let transcript = std::mem::take(&mut report.transcript);
            if history_cap > 0 {
                history = bounded(transcript, history_cap);
            }
            let last = options.max_cycles.is_some_and(|max| cycles >= max);
            // A cycle whose model never answered, or that was cut, may not have worked on
            // what woke it: the caller gets it, as nobody else can.
            let failed = report.model_failed
                || (ctx.is_cancelled() && report.status == AgentStatus::Failure);
            if failed {
                let taken = std::mem::take(&mut report.unread_results);
                report.unread_results = wake.results;
                report.unread_results.extend(taken);
            }
            if last || ctx.is_cancelled() {
                report.unread_results.extend(arrived.drain(..));
            } else if !failed {
                // Results the cycle itself took and did not read wake the next.
                arrived.extend(report.unread_results.drain(..));
            }
            for result in &mut report.unread_results {
                orchestrator.redactor().redact_json(result);
            }
            on_cycle(&report);
            if last {
                return Ok(ListenEnd::Cycles);
            }
        }
    }
}

impl Agents {
    /// How many tokens of the conversation of its earlier cycles agent `name` carries into
    /// the next: its `listenHistoryTokens`, else a quarter of its model's context window,
    /// else [`DEFAULT_LISTEN_HISTORY_TOKENS`].
    fn history_cap(&self, name: &str) -> u64 {
        let Some(config) = self.config(name) else { return 0 };
        if let Some(cap) = config.listen_history_tokens {
            return cap;
        }
        let window = self.inner.models.get(&config.model).and_then(|m| m.context_window());
        window.map_or(DEFAULT_LISTEN_HISTORY_TOKENS, |window| window / 4)
    }

    /// One cycle on `task`, going on from `history`, the conversation of the cycles
    /// before; the report holds the cycle's conversation (`history` with it) as its
    /// transcript. What woke the agent was taken from its inbox and space when the
    /// run began: a run its model failed with what may pass (an outage, a rate limit, a
    /// timeout, a lost connection) is tried again on the same conversation, after 2 s and
    /// then twice as long, up to [`CYCLE_ATTEMPTS`] times, so that what arrived is not
    /// lost. A request the API refused as such (an invalid request, one over the context
    /// window) is not tried again, since it would be refused alike: the report says so
    /// and listening goes on. Credentials the model's API refused are not tried again
    /// either: listening stops with an error saying so, since every cycle would fail alike.
    /// The error comes with the results the cycle's attempts took from the inbox and did
    /// not read, which are nowhere else.
    async fn cycle(
        &self,
        name: &str,
        task: &str,
        ctx: &CallContext,
        history: &[Message],
    ) -> Result<AgentReport, (AgentError, Vec<Value>)> {
        let credentials = |report: &mut AgentReport| match report.credentials_refused.take() {
            Some(error) => Err((
                AgentError::Config {
                    agent: name.to_owned(),
                    message: format!(
                        "{error}; listening stops, as every cycle would be refused alike: check \
                         the model's `apiKey` (or its `headers`)"
                    ),
                },
                std::mem::take(&mut report.unread_results),
            )),
            None => Ok(()),
        };
        let options =
            RunOptions { transcript: true, history: history.to_vec(), ..RunOptions::default() };
        let mut report =
            self.run_with(name, task, ctx, &options).await.map_err(|e| (e, Vec::new()))?;
        credentials(&mut report)?;
        let mut wait = Duration::from_secs(2);
        for _ in 1..CYCLE_ATTEMPTS {
            if !report.model_failed || ctx.is_cancelled() {
                break;
            }
            if !report.model_may_pass {
                tracing::warn!(target: "toolmux::agent", agent = name, "{}; not tried again: the same request would fail alike", report.content);
                report.content.push_str(
                    " (not tried again: the API refused the request itself, and would refuse \
                     it alike)",
                );
                break;
            }
            tracing::warn!(target: "toolmux::agent", agent = name, "{}; trying again in {} s", report.content, wait.as_secs());
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = ctx.cancel_token().cancelled() => break,
            }
            wait *= 2;
            let again = RunOptions {
                history: std::mem::take(&mut report.transcript),
                transcript: true,
                ..RunOptions::default()
            };
            let (turns, calls, usage) = (report.turns, report.tool_calls, report.usage);
            let refused = report.refused_calls;
            let mut unread = std::mem::take(&mut report.unread_results);
            let again = self
                .run_with(
                    name,
                    "(Your model failed before you answered. Go on with what arrived, above.)",
                    ctx,
                    &again,
                )
                .await;
            // What the earlier attempts took and did not read goes with the error too.
            report = match again {
                Ok(report) => report,
                Err(e) => return Err((e, unread)),
            };
            if let Err((e, taken)) = credentials(&mut report) {
                unread.extend(taken);
                return Err((e, unread));
            }
            report.turns += turns;
            report.tool_calls += calls;
            report.refused_calls += refused;
            report.usage += usage;
            report.unread_results.splice(0..0, unread);
        }
        Ok(report)
    }
}

/// How many times one cycle is run when its model fails.
const CYCLE_ATTEMPTS: u32 = 4;

/// The latest part of `messages`, a conversation, that fits `cap` tokens (as the session
/// estimates a request's): the oldest turns give way first, whole. It is cut only before
/// a user message, after which no tool result answers a call made before it, so that no
/// call is left without its result nor a result without its call (the APIs refuse both)
/// and the conversation begins with the user. Nothing is left when not even the last turn
/// fits.
fn bounded(messages: Vec<Message>, cap: u64) -> Vec<Message> {
    // Where each call was made, and for the message of each, the last answering any.
    let mut made = HashMap::new();
    let mut last_answer = vec![0; messages.len()];
    for (at, message) in messages.iter().enumerate() {
        match message {
            Message::Assistant { tool_calls, .. } => {
                made.extend(tool_calls.iter().map(|call| (call.id.as_str(), at)));
            }
            Message::Tool { results } => {
                for result in results {
                    if let Some(&call) = made.get(result.call_id.as_str()) {
                        last_answer[call] = at;
                    }
                }
            }
            Message::User { .. } => {}
        }
    }
    // What the conversation from each message on weighs.
    let mut from = vec![0; messages.len() + 1];
    for (at, message) in messages.iter().enumerate().rev() {
        from[at] = from[at + 1] + session::message_tokens(message);
    }
    if from[0] <= cap {
        return messages;
    }
    // The furthest a result answering an earlier message's call lies.
    let mut reach = 0;
    let mut cut = messages.len();
    for (at, message) in messages.iter().enumerate() {
        if matches!(message, Message::User { .. }) && reach < at && from[at] <= cap {
            cut = at;
            break;
        }
        reach = reach.max(last_answer[at]);
    }
    tracing::debug!(target: "toolmux::agent", dropped = cut, kept = messages.len() - cut,
        "the oldest messages of the earlier cycles give way to `listenHistoryTokens`");
    let mut messages = messages;
    messages.drain(..cut);
    messages
}

/// Looks at the inbox: the external results (taken, added to `arrived`, and as many of
/// those as fit the size cap given to the cycle), and the space (waiting up to [`LOOK`]
/// for a message when no result came).
async fn look(
    orchestrator: &Orchestrator,
    ctx: &CallContext,
    spaces: bool,
    inbox: bool,
    arrived: &mut VecDeque<Value>,
) -> Wake {
    let mut wake = Wake::default();
    if inbox {
        match inbox::take(orchestrator, ctx).await {
            Ok(taken) => arrived.extend(taken.results),
            Err(why) => {
                tracing::debug!(target: "toolmux::agent", "the inbox could not be read: {why}");
            }
        }
        wake.results = inbox::portion(arrived, orchestrator.config().response_max_bytes);
    }
    if spaces {
        let wait = if wake.results.is_empty() { LOOK } else { Duration::ZERO };
        let args = json!({"waitMs": wait.as_millis() as u64});
        match call(orchestrator, WAIT, args, ctx).await {
            Ok(answer) => {
                let space = answer.get("space").and_then(Value::as_str);
                let unread = answer.get("unread").and_then(Value::as_u64).unwrap_or(0);
                wake.space = space.map(|s| (s.to_owned(), unread));
            }
            Err(message) => {
                tracing::warn!(target: "toolmux::agent", "the space could not be read: {message}");
                // Do not spin on a failing store.
                tokio::time::sleep(LOOK).await;
            }
        }
    }
    wake
}

/// `error`, which stops listening, saying which results taken from the inbox no cycle
/// worked on (`unread`, redacted by `redactor`): nobody else can read them now.
fn not_read(name: &str, error: AgentError, unread: &[Value], redactor: &Redactor) -> AgentError {
    if unread.is_empty() {
        return error;
    }
    let mut unread = Value::Array(unread.to_vec());
    redactor.redact_json(&mut unread);
    let (agent, message) = match error {
        AgentError::Config { agent, message } => (agent, message),
        other => (name.to_owned(), other.to_string()),
    };
    let message = format!(
        "{message}; the results of asynchronous calls that listening took from the inbox \
         and no cycle worked on: {unread}"
    );
    AgentError::Config { agent, message }
}

/// Calls `tool` through the pipeline; its JSON answer, or what went wrong.
async fn call(
    orchestrator: &Orchestrator,
    tool: &str,
    arguments: Value,
    ctx: &CallContext,
) -> Result<Value, String> {
    // The loop's polls are not the agent's work: a run budget counts its cycles' calls
    // only (counted, a poll a second spent it and left the listener deaf).
    let ctx = ctx.child().outside_budget();
    let result = orchestrator.execute(ToolCall::new(tool, arguments), &ctx).await;
    if !result.ok {
        return Err(result.conversation_text());
    }
    serde_json::from_str(&result.conversation_text()).map_err(|e| format!("`{tool}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmux_llm::{ModelToolCall, ToolResultMessage};

    /// An assistant message calling `id`.
    fn call(id: &str) -> Message {
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ModelToolCall::new(id, "mock__echo", json!({}))],
            reasoning: None,
            blocks: None,
        }
    }

    /// The tool message answering `id`.
    fn result(id: &str) -> Message {
        Message::Tool { results: vec![ToolResultMessage::new(id, "ok", false)] }
    }

    /// A cut goes before the first user message after which no result answers an earlier
    /// call, even where a user message came between a call and its result (the inbox's
    /// note before a resumed turn's result): the history begins with user message `b`.
    #[test]
    fn a_cut_never_parts_a_call_from_its_result() {
        let long = "x".repeat(4000);
        let messages = vec![
            Message::user(long),
            call("c1"),
            Message::user("a"),
            result("c1"),
            Message::user("b"),
            call("c2"),
            result("c2"),
        ];
        let kept = bounded(messages.clone(), 100);
        assert_eq!(kept, messages[4..]);
        // All of it fits: nothing is cut; nothing fits: nothing is kept.
        assert_eq!(bounded(messages.clone(), 10_000), messages);
        assert_eq!(bounded(messages, 1), Vec::<Message>::new());
    }
}
