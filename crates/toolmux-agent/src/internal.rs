//! The tools a session offers its model besides the orchestrator's: the final report,
//! progress, batches, questions for the user and hand-offs. They act on the session (end
//! it, record its progress, run calls of its own), so they are answered by the session and
//! never reach the orchestrator.

use serde::Deserialize;
use serde_json::{Value, json};
use toolmux_llm::ToolDefinition;

/// Delivers the answer and ends the run.
pub const FINAL_REPORT: &str = "agent__final_report";
/// Records progress.
pub const TASK_STATUS: &str = "agent__task_status";
/// Runs several tool calls at once.
pub const BATCH: &str = "agent__batch";
/// Asks the person running the agent.
pub const ASK_USER: &str = "agent__ask_user";
/// Hands the run to another agent.
pub const HANDOFF: &str = "router__handoff-to";

/// Agent names these tools take, which no agent may have.
pub const RESERVED: &[&str] = &["final_report", "task_status", "batch", "ask_user", "read_output"];

/// The most calls one `agent__batch` may make.
pub const MAX_BATCH: usize = 16;

pub(crate) fn final_report(output_schema: Option<&Value>) -> ToolDefinition {
    let content_json = match output_schema {
        Some(schema) => {
            let mut schema = schema.clone();
            if let Some(object) = schema.as_object_mut() {
                object.insert(
                    "description".into(),
                    json!("The report's content: must match this schema."),
                );
            }
            schema
        }
        None => json!({"type": "object", "description": "The report's content, for JSON formats."}),
    };
    let mut required = vec!["status"];
    if output_schema.is_some() {
        required.push("content_json");
    }
    ToolDefinition::new(
        FINAL_REPORT,
        "Delivers your final answer and ends your work on the task. Call it once, when the \
         task is done or cannot be done; nothing you write after it is read.",
        json!({
            "type": "object",
            "properties": {
                "status": {
                    "type": "string",
                    "enum": ["success", "failure", "partial"],
                    "description": "Whether the task is done (success), could not be done (failure), or is done in part (partial)."
                },
                "format": {"type": "string", "description": "The content's format: text (default), markdown or json."},
                "content": {"type": "string", "description": "The answer."},
                "content_json": content_json,
                "metadata": {"type": "object", "description": "Anything to add about the answer (sources, caveats)."}
            },
            "required": required
        }),
    )
}

pub(crate) fn task_status() -> ToolDefinition {
    ToolDefinition::new(
        TASK_STATUS,
        format!(
            "Records where you are with the task, for the person following your work. It does \
             not end your work: only {FINAL_REPORT} does. Say when you can finalize \
             (`ready_for_final_report`) and whether you still need tools \
             (`need_to_run_more_tools`): once you are ready, call {FINAL_REPORT} next."
        ),
        json!({
            "type": "object",
            "properties": {
                "status": {
                    "type": "string",
                    "enum": ["starting", "in-progress", "completed"],
                    "description": format!("Where the task stands: starting, in-progress, or completed (then call {FINAL_REPORT} next).")
                },
                "done": {"type": "string", "description": "What has been completed."},
                "pending": {"type": "string", "description": "What remains."},
                "now": {"type": "string", "description": "The step you are taking now."},
                "ready_for_final_report": {
                    "type": "boolean",
                    "description": format!("Whether you can finalize now: you have what your answer needs. When true, call {FINAL_REPORT} next.")
                },
                "need_to_run_more_tools": {
                    "type": "boolean",
                    "description": format!("Whether you need more tool calls before your answer. False with ready_for_final_report true: your next turn offers only {FINAL_REPORT}.")
                }
            },
            "required": ["status"]
        }),
    )
}

pub(crate) fn batch() -> ToolDefinition {
    ToolDefinition::new(
        BATCH,
        format!(
            "Runs up to {MAX_BATCH} calls of your other tools at once and returns their results \
             in order. Use it for independent calls."
        ),
        json!({
            "type": "object",
            "properties": {
                "calls": {
                    "type": "array",
                    "maxItems": MAX_BATCH,
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "tool": {"type": "string", "description": "The tool's name."},
                            "arguments": {"type": "object", "description": "Its arguments."}
                        },
                        "required": ["tool"]
                    }
                }
            },
            "required": ["calls"]
        }),
    )
}

pub(crate) fn ask_user() -> ToolDefinition {
    ToolDefinition::new(
        ASK_USER,
        "Asks the person who gave you the task a question and returns the answer. Ask only \
         what you cannot find out with your tools. Give `default_answer` when there is a \
         sensible choice to go on with if nobody answers (within `timeout_seconds`).",
        json!({
            "type": "object",
            "properties": {
                "question": {"type": "string"},
                "default_answer": {
                    "type": "string",
                    "description": "What to go on with when nobody answers in time or nobody can answer."
                },
                "timeout_seconds": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": ASK_USER_MAX_WAIT_SECS,
                    "description": "How long to wait for an answer."
                }
            },
            "required": ["question"]
        }),
    )
}

pub(crate) fn handoff(destinations: &[String]) -> ToolDefinition {
    ToolDefinition::new(
        HANDOFF,
        "Hands the whole task to another agent, which continues it from the start with your \
         message; your work on it ends. Use it when the task belongs to that agent.",
        json!({
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": destinations},
                "message": {"type": "string", "description": "What the other agent should know: what you found, why it is theirs."}
            },
            "required": ["agent"]
        }),
    )
}

/// `agent__final_report`'s arguments.
#[derive(Debug, Deserialize)]
pub(crate) struct FinalReport {
    pub(crate) status: ReportedStatus,
    #[serde(default)]
    pub(crate) format: Option<String>,
    #[serde(default)]
    pub(crate) content: Option<String>,
    #[serde(default)]
    pub(crate) content_json: Option<Value>,
    #[serde(default)]
    pub(crate) metadata: Option<Value>,
}

/// The statuses a model may report.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ReportedStatus {
    Success,
    Failure,
    Partial,
}

/// `agent__task_status`'s arguments (the rest, `done`, `pending`, `now`, is recorded as
/// given).
#[derive(Debug, Deserialize)]
pub(crate) struct TaskStatus {
    pub(crate) status: TaskState,
    #[serde(default)]
    pub(crate) ready_for_final_report: Option<bool>,
    #[serde(default)]
    pub(crate) need_to_run_more_tools: Option<bool>,
}

/// Where a task stands, as the model says in `agent__task_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum TaskState {
    Starting,
    InProgress,
    Completed,
}

/// What the session does after an `agent__task_status` call, for the model's next turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finalizing {
    /// Nothing: the model goes on as it likes.
    No,
    /// The model is ready and made no other call: its next turn is asked for the report
    /// (`tool_choice`), its tools still offered.
    Asked,
    /// The model is ready and needs no more tools: its next turn offers only the report.
    OnlyReport,
}

impl TaskStatus {
    /// Whether the model says it can finalize: ready for the report, or the task
    /// completed, and not that it needs more tools first.
    pub(crate) fn ready(&self) -> bool {
        (self.ready_for_final_report == Some(true) || self.status == TaskState::Completed)
            && self.need_to_run_more_tools != Some(true)
    }

    /// What the session does for the next turn, when the turn that recorded this status
    /// made `others` calls besides `agent__task_status`.
    pub(crate) fn finalizing(&self, others: bool) -> Finalizing {
        match (self.ready(), self.need_to_run_more_tools, others) {
            (false, ..) => Finalizing::No,
            (true, Some(false), _) => Finalizing::OnlyReport,
            (true, _, false) => Finalizing::Asked,
            (true, _, true) => Finalizing::No,
        }
    }

    /// The answer to the call, telling a model that can finalize to call the report.
    pub(crate) fn answer(&self, others: bool) -> String {
        let ready =
            self.ready_for_final_report == Some(true) || self.status == TaskState::Completed;
        let said = if self.ready_for_final_report == Some(true) {
            "you can finalize now"
        } else {
            "the task is completed"
        };
        match (ready, self.need_to_run_more_tools, others) {
            (false, ..) => "recorded".to_owned(),
            (true, Some(true), _) => format!(
                "recorded. You say {said} but need more tools: run them, then call {FINAL_REPORT} \
                 with your answer"
            ),
            (true, Some(false), false) => format!(
                "recorded. You say {said} and need no more tools: call {FINAL_REPORT} now with \
                 your answer; it is the only tool your next turn offers"
            ),
            (true, Some(false), true) => format!(
                "recorded. You say {said} and need no more tools: with the results of this \
                 turn's other calls, call {FINAL_REPORT} with your answer; it is the only tool \
                 your next turn offers"
            ),
            (true, None, false) => {
                format!("recorded. You say {said}: call {FINAL_REPORT} now with your answer")
            }
            (true, None, true) => format!(
                "recorded. You say {said}: once you have the results of this turn's other \
                 calls, call {FINAL_REPORT} with your answer"
            ),
        }
    }
}

/// One call of `agent__batch`.
#[derive(Debug, Deserialize)]
pub(crate) struct BatchCall {
    pub(crate) tool: String,
    #[serde(default)]
    pub(crate) arguments: Option<Value>,
}

/// `agent__batch`'s arguments.
#[derive(Debug, Deserialize)]
pub(crate) struct Batch {
    pub(crate) calls: Vec<BatchCall>,
}

/// `router__handoff-to`'s arguments.
#[derive(Debug, Deserialize)]
pub(crate) struct Handoff {
    pub(crate) agent: String,
    #[serde(default)]
    pub(crate) message: Option<String>,
}

/// The longest wait for an answer a model may ask `agent__ask_user` for, in seconds.
pub(crate) const ASK_USER_MAX_WAIT_SECS: u64 = 3600;

/// `agent__ask_user`'s arguments.
#[derive(Debug, Deserialize)]
pub(crate) struct AskUser {
    pub(crate) question: String,
    /// `defaultAnswer` is the seeds' `clarify` name for it (given with `default_answer`,
    /// the call is refused as a duplicate field).
    #[serde(default, alias = "defaultAnswer")]
    pub(crate) default_answer: Option<String>,
    #[serde(default)]
    pub(crate) timeout_seconds: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model or caller using the seeds' `clarify` name, `defaultAnswer`, is heard: serde
    /// dropped the unknown name, and nobody answering left the run with no answer.
    #[test]
    fn ask_user_takes_the_seed_s_default_answer() {
        let ask: AskUser =
            serde_json::from_value(json!({"question": "Which branch?", "defaultAnswer": "main"}))
                .expect("valid arguments");
        assert_eq!(ask.default_answer.as_deref(), Some("main"));
        let both = json!({"question": "?", "defaultAnswer": "a", "default_answer": "b"});
        let error = serde_json::from_value::<AskUser>(both).expect_err("two values");
        assert!(error.to_string().contains("duplicate field `default_answer`"), "{error}");
    }
}
