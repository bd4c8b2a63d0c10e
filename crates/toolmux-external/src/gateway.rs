//! The gateway's own tools (namespace `gateway`): spaces, and each agent's goals, memories
//! and plans, kept in [`Spaces`].

use crate::spaces::{ItemInput, ItemKind, Spaces, Who};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::time::Duration;
use toolmux_core::{
    CallContext, ToolAnnotations, ToolError, ToolKind, ToolOutput, ToolProvider, ToolSpec,
};

/// The namespace of the gateway's tools.
pub const GATEWAY_NAMESPACE: &str = "gateway";

/// How many messages entering a space gives unless configured.
pub const DEFAULT_HISTORY: usize = 20;

/// The most messages one `read_messages` gives.
pub const MAX_PAGE: usize = 200;

/// The seeds' built-in tools, offered to every agent: `enter_space`, `leave_space`,
/// `send_message`, `read_messages`, `skip`, `set_goals`, `delete_goals`, `set_memories`,
/// `delete_memories`, `set_plans`, `delete_plans`, `get_plans`; and, hidden from models,
/// `context` (what an agent carries into a run: its goals, memories, plans, active space
/// and unread messages), `post` (a person's message, for user interfaces), `spaces` (the
/// caller's spaces), `changes` (a long poll for what changed in a space) and `wait` (a long
/// poll for unread messages of others in the caller's active space).
#[derive(Debug, Clone)]
pub struct GatewayProvider {
    spaces: Spaces,
    history: usize,
}

impl GatewayProvider {
    /// The tools over `spaces`.
    pub fn new(spaces: Spaces) -> GatewayProvider {
        GatewayProvider { spaces, history: DEFAULT_HISTORY }
    }

    /// Entering a space gives its latest `history` messages (at most [`MAX_PAGE`]).
    #[must_use]
    pub fn with_history(mut self, history: usize) -> GatewayProvider {
        self.history = history.min(MAX_PAGE);
        self
    }

    /// The spaces.
    pub fn spaces(&self) -> &Spaces {
        &self.spaces
    }
}

fn tool(name: &str) -> String {
    format!("{GATEWAY_NAMESPACE}__{name}")
}

fn string_arg<'a>(arguments: &'a Value, key: &str, name: &str) -> Result<&'a str, ToolError> {
    arguments.get(key).and_then(Value::as_str).ok_or_else(|| {
        ToolError::invalid_arguments(tool(name), format!("`{key}` (a string) is required"))
    })
}

fn usize_arg(arguments: &Value, key: &str) -> Option<usize> {
    arguments.get(key).and_then(Value::as_u64).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn json_output(value: &impl serde::Serialize) -> ToolOutput {
    ToolOutput::json(serde_json::to_value(value).unwrap_or(Value::Null))
}

fn kind_of(name: &str) -> Option<(ItemKind, bool)> {
    Some(match name {
        "set_goals" => (ItemKind::Goal, true),
        "delete_goals" => (ItemKind::Goal, false),
        "set_memories" => (ItemKind::Memory, true),
        "delete_memories" => (ItemKind::Memory, false),
        "set_plans" => (ItemKind::Plan, true),
        "delete_plans" => (ItemKind::Plan, false),
        _ => return None,
    })
}

impl GatewayProvider {
    async fn set_or_delete(
        &self,
        name: &str,
        kind: ItemKind,
        set: bool,
        arguments: &Value,
        who: &Who,
    ) -> Result<ToolOutput, ToolError> {
        let plural = kind.plural();
        if set {
            let items = arguments.get(plural).cloned().unwrap_or(Value::Null);
            let items: Vec<ItemInput> = serde_json::from_value(items).map_err(|e| {
                ToolError::invalid_arguments(
                    tool(name),
                    format!("`{plural}` must be a list of {{text, id?, status?}}: {e}"),
                )
            })?;
            let all = self.spaces.set_items(who, kind, items, &tool(name)).await?;
            return Ok(ToolOutput::json(json!({ plural: all })));
        }
        let ids: Vec<String> = arguments
            .get("ids")
            .and_then(Value::as_array)
            .map(|ids| ids.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        if ids.is_empty() {
            return Err(ToolError::invalid_arguments(
                tool(name),
                format!("`ids` (the ids of the {plural} to delete) is required"),
            ));
        }
        let (deleted, unknown) = self.spaces.delete_items(who, kind, &ids).await?;
        let left = self.spaces.items(who, kind).await?;
        let mut out = json!({ "deleted": deleted, plural: left });
        if !unknown.is_empty() {
            out["unknown"] = json!(unknown);
        }
        Ok(ToolOutput::json(out))
    }
}

#[async_trait]
impl ToolProvider for GatewayProvider {
    /// Who calls (an agent, a run, a key holder) decides which spaces, goals and messages
    /// answer.
    fn state_per_run(&self) -> bool {
        true
    }

    fn kind(&self) -> ToolKind {
        ToolKind::Internal
    }

    fn namespace(&self) -> &str {
        GATEWAY_NAMESPACE
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(specs(self.history))
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let who = Who::of(ctx);
        if let Some((kind, set)) = kind_of(name) {
            return self.set_or_delete(name, kind, set, &arguments, &who).await;
        }
        match name {
            "enter_space" => {
                let space = string_arg(&arguments, "space", name)?;
                let history = usize_arg(&arguments, "history").unwrap_or(self.history);
                let entered = self.spaces.enter(&who, space, history.min(MAX_PAGE)).await?;
                Ok(json_output(&entered))
            }
            "leave_space" => Ok(match self.spaces.leave(&who).await? {
                Some(space) => ToolOutput::text(format!("left space `{space}`")),
                None => ToolOutput::text("you were not in a space"),
            }),
            "send_message" => {
                let text = string_arg(&arguments, "text", name)?;
                let message = self.spaces.say(&who, None, text, &tool(name), false).await?;
                Ok(ToolOutput::json(json!({"sent": message.index})))
            }
            "read_messages" => {
                let space = arguments.get("space").and_then(Value::as_str);
                let offset = arguments.get("offset").and_then(Value::as_u64);
                let limit = usize_arg(&arguments, "limit").unwrap_or(self.history).min(MAX_PAGE);
                Ok(json_output(&self.spaces.read(&who, space, offset, limit).await?))
            }
            "skip" => {
                let reason = arguments.get("reason").and_then(Value::as_str).unwrap_or("");
                Ok(ToolOutput::text(if reason.is_empty() {
                    "skipped: nothing to do this time".to_owned()
                } else {
                    format!("skipped: {reason}")
                }))
            }
            "get_plans" => Ok(ToolOutput::json(
                json!({"plans": self.spaces.items(&who, ItemKind::Plan).await?}),
            )),
            "context" => Ok(json_output(&self.spaces.context(&who, self.history).await?)),
            "post" => {
                let space = string_arg(&arguments, "space", name)?;
                let author = string_arg(&arguments, "author", name)?;
                let text = string_arg(&arguments, "text", name)?;
                if author.is_empty() || author.len() > 64 || author.chars().any(char::is_control) {
                    return Err(ToolError::invalid_arguments(
                        tool(name),
                        "`author` must be 1 to 64 characters",
                    ));
                }
                let person = Who::person(who.holder.as_deref(), author);
                let message =
                    self.spaces.say(&person, Some(space), text, &tool(name), true).await?;
                Ok(json_output(&message))
            }
            "spaces" => Ok(ToolOutput::json(json!({"spaces": self.spaces.list(&who).await?}))),
            "wait" => {
                let wait = arguments
                    .get("waitMs")
                    .and_then(Value::as_u64)
                    .map_or(Duration::ZERO, Duration::from_millis)
                    .min(crate::MAX_POLL);
                let (space, unread) = tokio::select! {
                    waited = self.spaces.wait_unread(&who, wait) => waited?,
                    () = ctx.cancel_token().cancelled() => {
                        return Err(ToolError::Cancelled { tool: tool(name) });
                    }
                };
                Ok(ToolOutput::json(json!({"space": space, "unread": unread})))
            }
            "changes" => {
                let space = string_arg(&arguments, "space", name)?;
                let limit = usize_arg(&arguments, "limit").unwrap_or(MAX_PAGE).min(MAX_PAGE);
                let since = arguments.get("since").and_then(Value::as_u64);
                let wait = arguments
                    .get("waitMs")
                    .and_then(Value::as_u64)
                    .map_or(Duration::ZERO, Duration::from_millis)
                    .min(crate::MAX_POLL);
                let changes = match since {
                    Some(since) => {
                        let waited = self.spaces.wait_changes(&who, space, since, limit, wait);
                        tokio::select! {
                            changes = waited => changes?,
                            () = ctx.cancel_token().cancelled() => {
                                return Err(ToolError::Cancelled { tool: tool(name) });
                            }
                        }
                    }
                    None => self.spaces.changes(&who, space, None, limit).await?,
                };
                Ok(json_output(&changes))
            }
            _ => Err(ToolError::UnknownTool { name: tool(name), suggestions: Vec::new() }),
        }
    }

    fn instructions(&self) -> Option<String> {
        Some(
            "Spaces are where you meet people and other agents: `gateway__enter_space` before \
             using a tool shown in a space, `gateway__send_message` to speak there, \
             `gateway__read_messages` for what others said. Your goals, memories and plans \
             (`gateway__set_goals`, `gateway__set_memories`, `gateway__set_plans`) stay with \
             you from run to run. Call `gateway__skip` when there is nothing to do."
                .to_owned(),
        )
    }
}

fn specs(history: usize) -> Vec<ToolSpec> {
    let quiet = ToolAnnotations { open_world: false, shown: false, ..ToolAnnotations::default() };
    let reading = ToolAnnotations { read_only: true, idempotent: true, ..quiet };
    let ends = ToolAnnotations { ends_turn: true, ..quiet };
    let hidden = ToolAnnotations { visible: false, ..quiet };
    let none = json!({"type": "object", "properties": {}, "additionalProperties": false});
    let items = |plural: &str| {
        json!({
            "type": "object",
            "properties": {
                plural: {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {"type": "string", "description": "Replace the one with this id (a new one gets an id when none is given)."},
                            "text": {"type": "string"},
                            "status": {"type": "string", "description": "Where it stands: active, done, …"}
                        },
                        "required": ["text"],
                        "additionalProperties": false
                    }
                }
            },
            "required": [plural],
            "additionalProperties": false
        })
    };
    let ids = json!({
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
        "required": ["ids"],
        "additionalProperties": false
    });
    let mut specs = vec![
        ToolSpec::new(
            "enter_space",
            format!(
                "Makes `space` your active space (a new name makes a new space) and gives its \
                 latest messages ({history} unless `history` says otherwise). Visible tools \
                 show their calls there."
            ),
            json!({
                "type": "object",
                "properties": {
                    "space": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
                    "history": {"type": "integer", "minimum": 0, "maximum": MAX_PAGE}
                },
                "required": ["space"],
                "additionalProperties": false
            }),
        )
        .with_annotations(quiet.clone()),
        ToolSpec::new("leave_space", "Leaves your active space.", none.clone())
            .with_annotations(quiet.clone()),
        ToolSpec::new(
            "send_message",
            "Says `text` in your active space.",
            json!({
                "type": "object",
                "properties": {"text": {"type": "string", "minLength": 1}},
                "required": ["text"],
                "additionalProperties": false
            }),
        )
        .with_annotations(quiet.clone()),
        ToolSpec::new(
            "read_messages",
            "Messages of a space (your active one unless `space` is given), oldest first: \
             those you have not read yet, or from `offset` (a message's `index`). `next` is \
             where to read on.",
            json!({
                "type": "object",
                "properties": {
                    "space": {"type": "string"},
                    "offset": {"type": "integer", "minimum": 0},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}
                },
                "additionalProperties": false
            }),
        )
        .with_annotations(quiet.clone()),
        ToolSpec::new(
            "skip",
            "Ends this turn when there is nothing to do.",
            json!({
                "type": "object",
                "properties": {"reason": {"type": "string"}},
                "additionalProperties": false
            }),
        )
        .with_annotations(ends),
    ];
    for (plural, what) in [
        ("goals", "what you work towards"),
        ("memories", "what you want to remember"),
        ("plans", "how you mean to get there"),
    ] {
        specs.push(
            ToolSpec::new(
                format!("set_{plural}"),
                format!(
                    "Adds or updates your {plural} ({what}); they stay with you from run to run. \
                     Gives all of them."
                ),
                items(plural),
            )
            .with_annotations(quiet.clone()),
        );
        specs.push(
            ToolSpec::new(
                format!("delete_{plural}"),
                format!("Deletes {plural} by id."),
                ids.clone(),
            )
            .with_annotations(quiet.clone()),
        );
    }
    specs.push(ToolSpec::new("get_plans", "Your plans.", none.clone()).with_annotations(reading));
    specs.push(
        ToolSpec::new(
            "context",
            "What the caller carries into a run: goals, memories, plans, active space and its \
             unread messages. For agent runtimes.",
            none.clone(),
        )
        .with_annotations(hidden.clone()),
    );
    specs.push(
        ToolSpec::new(
            "post",
            "Posts a person's message to a space, made when new (for user interfaces).",
            json!({
                "type": "object",
                "properties": {
                    "space": {"type": "string"},
                    "author": {"type": "string", "minLength": 1, "maxLength": 64},
                    "text": {"type": "string", "minLength": 1}
                },
                "required": ["space", "author", "text"],
                "additionalProperties": false
            }),
        )
        .with_annotations(hidden.clone()),
    );
    specs.push(
        ToolSpec::new(
            "changes",
            "The messages of a space written or changed (a visible tool's call answered) after \
             revision `since`, oldest first, waiting up to `waitMs` for one, and `events`, what \
             happened to each (`message`; for a visible tool's call `tool.started`, \
             `tool.done`, `tool.error`); without `since`, only the revision to go on from \
             (`version`). For user interfaces.",
            json!({
                "type": "object",
                "properties": {
                    "space": {"type": "string"},
                    "since": {"type": "integer", "minimum": 0},
                    "waitMs": {"type": "integer", "minimum": 0, "maximum": crate::MAX_POLL.as_millis()},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}
                },
                "required": ["space"],
                "additionalProperties": false
            }),
        )
        .with_annotations(hidden.clone())
        // A long poll waits up to the longest poll: the pipeline waits as long.
        .with_time_limit(crate::MAX_POLL + Duration::from_secs(1)),
    );
    specs.push(
        ToolSpec::new(
            "wait",
            "How many messages of others the caller has not read in its active space, waiting \
             up to `waitMs` for one: what wakes a listening agent.",
            json!({
                "type": "object",
                "properties": {
                    "waitMs": {"type": "integer", "minimum": 0, "maximum": crate::MAX_POLL.as_millis()}
                },
                "additionalProperties": false
            }),
        )
        .with_annotations(hidden.clone())
        // A long poll waits up to the longest poll: the pipeline waits as long.
        .with_time_limit(crate::MAX_POLL + Duration::from_secs(1)),
    );
    specs.push(
        ToolSpec::new("spaces", "The spaces, with their sizes and members.", none)
            .with_annotations(ToolAnnotations { read_only: true, ..hidden }),
    );
    specs
}
