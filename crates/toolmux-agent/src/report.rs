//! What a run of an agent ends with.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolmux_core::ToolOutput;
use toolmux_llm::{Message, Usage};
use toolmux_orchestrator::Redactor;

use crate::pause::PendingCall;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    /// The task is done.
    Success,
    /// The task could not be done (the model said so, its model failed, the turn limit
    /// passed, the run was cancelled).
    Failure,
    /// Part of the task is done.
    Partial,
    /// The agent has a question and nobody to ask: the content is the question.
    NeedsInput,
    /// Calls wait for approval ([`AgentReport::pending`]); [`Agents::resume`] goes on with
    /// the decisions.
    ///
    /// [`Agents::resume`]: crate::Agents::resume
    Paused,
}

impl AgentStatus {
    /// The status as written in reports (`success`, `needs_input`).
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Success => "success",
            AgentStatus::Failure => "failure",
            AgentStatus::Partial => "partial",
            AgentStatus::NeedsInput => "needs_input",
            AgentStatus::Paused => "paused",
        }
    }
}

/// The end of a run: the agent's final report and what the run cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    /// The agent that reported (the last one, after hand-offs).
    pub agent: String,
    /// How the run ended.
    pub status: AgentStatus,
    /// The report's format (`text`, `markdown`, `json`, or what the model named).
    pub format: String,
    /// The report's text.
    pub content: String,
    /// The report's JSON content, for JSON formats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_json: Option<Value>,
    /// What the model added about its report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Model turns taken, by every agent of the run.
    pub turns: u32,
    /// Tool calls that ran, by every agent of the run (a sub-agent's own calls included):
    /// those that went to the orchestrator, whatever it made of them (a tool's error, a
    /// permission's denial).
    pub tool_calls: u32,
    /// Tool calls the agents refused before they ran, counted apart from `tool_calls`: a
    /// tool unknown or not offered (the agent's `tools` selectors), arguments that are not
    /// JSON, calls past `maxCallsPerTurn`, a call repeated without change, a call other than
    /// the report on a turn that offered only the report, a paused call denied on resume;
    /// a sub-agent's and a batch's included. The model was told why each did not run.
    #[serde(default)]
    pub refused_calls: u32,
    /// Tokens used, by every agent of the run and the sub-agents they called.
    pub usage: Usage,
    /// The agents the run was handed through, first to last, when it was handed off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handoffs: Vec<String>,
    /// The last progress the agent recorded with `agent__task_status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_status: Option<Value>,
    /// The last agent's conversation, when asked for, and always in a paused run's report
    /// (it is where the run resumes from).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transcript: Vec<Message>,
    /// The calls a paused run waits on, in the order they asked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingCall>,
    /// What a paused run's decisions approved for the rest of the run (rules on calls and
    /// tools), carried into its resumption.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved: Vec<String>,
    /// A paused run's task, for the agents it may hand off to after resuming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// A paused run's id, the inbox its asynchronous external calls answer to: its
    /// resumption, in whatever process, goes on as the same run and so reads the results
    /// that came while it was paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Results of asynchronous external calls that the run took from its inbox and that
    /// never reached its model (the run ended first: cancelled, out of turns or time, a
    /// report on its last turn, a listening agent stopped), as the inbox gave them (`callId`,
    /// `tool`, `arguments`, `result`, `isError`): the inbox gives each result once, so this is
    /// the only place they are left. A paused run's are given to its model when it resumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread_results: Vec<Value>,
    /// Asynchronous external calls of a paused run whose results had not come when it
    /// paused, by every agent of the run (those an agent made before handing the task on
    /// too, which the paused agent's conversation does not show): its resumption reads the
    /// run's inbox for them before its first turn. Reports written before this count was
    /// kept read as 0; their resumption counts the calls in its conversation.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending_async_calls: u32,
    /// The run failed because its model did (an API error, no answer), not because of
    /// anything the agent did: worth trying again (`agent listen` does).
    #[serde(skip)]
    pub(crate) model_failed: bool,
    /// The model's failure may pass when it is asked again (a timeout, a rate limit, a
    /// server's error, a connection's: [`ModelError::is_transient`]); a request the API
    /// refused as such (400, over the context window) would be refused alike.
    ///
    /// [`ModelError::is_transient`]: toolmux_llm::ModelError::is_transient
    #[serde(skip)]
    pub(crate) model_may_pass: bool,
    /// The model's API refused its credentials (401 or 403), said in words: trying again
    /// would be refused alike.
    #[serde(skip)]
    pub(crate) credentials_refused: Option<String>,
}

impl AgentReport {
    /// Marks the pending calls that `decisions` approve as started
    /// ([`PendingCall::started`]). Save the paused report so marked before resuming it with
    /// those decisions: if the resumption then stops before its own report is kept, a
    /// second resumption from the file never runs those calls again.
    pub fn mark_started(
        &mut self,
        decisions: &std::collections::BTreeMap<String, crate::Decision>,
    ) {
        for call in &mut self.pending {
            if matches!(decisions.get(&call.call_id), Some(crate::Decision::Approve { .. })) {
                call.started = true;
            }
        }
    }

    /// The report with the configuration's secrets (`redactor`'s) redacted from what the
    /// model wrote into it and everything else it carries in text: its content, JSON
    /// content, metadata, progress, the conversation (the model's text and calls'
    /// arguments too) and the arguments of the calls it waits on. A model may write a
    /// secret it saw (its context, a tool's result before redaction was configured); the
    /// report leaves to people and programs, who are not to see it.
    pub(crate) fn redacted(mut self, redactor: &Redactor) -> Self {
        if redactor.is_empty() {
            return self;
        }
        redactor.redact_in_place(&mut self.content);
        for value in [&mut self.content_json, &mut self.metadata, &mut self.task_status]
            .into_iter()
            .flatten()
        {
            redactor.redact_json(value);
        }
        if let Some(task) = &mut self.task {
            redactor.redact_in_place(task);
        }
        self.transcript = std::mem::take(&mut self.transcript)
            .into_iter()
            .map(|message| redacted_json(message, redactor, Message::user))
            .collect();
        for result in &mut self.unread_results {
            redactor.redact_json(result);
        }
        for call in &mut self.pending {
            redactor.redact_json(&mut call.arguments);
            redactor.redact_in_place(&mut call.reason);
            if let Some(question) = &mut call.question {
                redactor.redact_in_place(question);
            }
        }
        self
    }

    pub(crate) fn failure(agent: &str, content: String) -> Self {
        AgentReport {
            agent: agent.to_owned(),
            status: AgentStatus::Failure,
            format: "text".to_owned(),
            content,
            content_json: None,
            metadata: None,
            turns: 0,
            tool_calls: 0,
            refused_calls: 0,
            usage: Usage::default(),
            handoffs: Vec::new(),
            task_status: None,
            transcript: Vec::new(),
            pending: Vec::new(),
            approved: Vec::new(),
            task: None,
            run_id: None,
            unread_results: Vec::new(),
            pending_async_calls: 0,
            model_failed: false,
            model_may_pass: false,
            credentials_refused: None,
        }
    }

    /// The report's text, or its JSON content written out when it has no text.
    pub fn text(&self) -> String {
        match (&self.content_json, self.content.is_empty()) {
            (Some(json), true) => {
                serde_json::to_string_pretty(json).unwrap_or_else(|_| json.to_string())
            }
            _ => self.content.clone(),
        }
    }

    /// The report as a tool's output: its text (a question for `needs_input`) followed by
    /// the results it did not read ([`AgentReport::unread_results`]), the JSON content as
    /// structured content, an error when the run failed, and the run's figures in the
    /// extras (`status`, `turns`, `toolCalls`, `refusedCalls`, `usage`).
    pub fn to_output(&self) -> ToolOutput {
        let mut text = match self.status {
            AgentStatus::NeedsInput => {
                format!("(agent `{}` needs input) {}", self.agent, self.text())
            }
            AgentStatus::Paused => format!("(agent `{}` is paused) {}", self.agent, self.text()),
            _ => self.text(),
        };
        if !self.unread_results.is_empty() {
            // The caller is the only one left to read them.
            text.push_str(&format!(
                "\n\n(Results of asynchronous tool calls that arrived for agent `{}` and that it \
                 did not read before its run ended:\n{})",
                self.agent,
                Value::Array(self.unread_results.clone())
            ));
        }
        let mut output = if self.status == AgentStatus::Failure {
            ToolOutput::error(text)
        } else {
            ToolOutput::text(text)
        };
        if let Some(json) = &self.content_json {
            output = output.with_structured(json.clone());
        }
        output
            .with_extra("agent", json!(self.agent))
            .with_extra("status", json!(self.status.as_str()))
            .with_extra("turns", json!(self.turns))
            .with_extra("toolCalls", json!(self.tool_calls))
            .with_extra("refusedCalls", json!(self.refused_calls))
            .with_extra("usage", json!(self.usage))
    }
}

/// Whether a count is 0, left out of a report as JSON.
fn is_zero(count: &u32) -> bool {
    *count == 0
}

/// `item` with `redactor`'s secrets redacted from its strings, as written in JSON; should
/// the redacted JSON no longer read as one (a secret standing in a tag), `fallback` of its
/// redacted text, so that nothing goes out unredacted.
fn redacted_json<T: Serialize + DeserializeOwned>(
    item: T,
    redactor: &Redactor,
    fallback: impl FnOnce(String) -> T,
) -> T {
    let Ok(mut value) = serde_json::to_value(&item) else { return item };
    let before = value.clone();
    redactor.redact_json(&mut value);
    if value == before {
        return item;
    }
    match serde_json::from_value(value.clone()) {
        Ok(clean) => clean,
        Err(_) => fallback(value.to_string()),
    }
}

/// The usage, the calls that ran and those refused that a sub-agent's output carries in
/// its extras, if it is one.
pub(crate) fn usage_in(extras: &serde_json::Map<String, Value>) -> Option<(Usage, u32, u32)> {
    let usage = serde_json::from_value(extras.get("usage")?.clone()).ok()?;
    let count = |key: &str| {
        let count = extras.get(key).and_then(Value::as_u64).unwrap_or(0);
        u32::try_from(count).unwrap_or(u32::MAX)
    };
    Some((usage, count("toolCalls"), count("refusedCalls")))
}
