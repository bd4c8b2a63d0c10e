//! What a tool is ([`ToolSpec`]) and one request to run it ([`ToolCall`]).

use crate::PermissionClass;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// Hints about a tool's behaviour, after MCP's tool annotations plus toolmux's own.
///
/// The defaults follow MCP: a tool is assumed to write, not destructively, not idempotent,
/// and to reach the open world, unless it says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ToolAnnotations {
    /// The tool changes nothing; its results may be cached.
    pub read_only: bool,
    /// The tool may destroy data (only meaningful when not read-only).
    pub destructive: bool,
    /// Calling twice with the same arguments has the effect of calling once.
    pub idempotent: bool,
    /// The tool reaches entities outside the process (the web, other services).
    pub open_world: bool,
    /// Calling it ends the agent's turn (`final_report`, `ask_question`).
    pub ends_turn: bool,
    /// Shown to models; hidden tools can still be called by name.
    pub visible: bool,
    /// Shown to people: the events a user interface follows carry its calls' arguments and
    /// results (they always say that it ran). `false` for a tool that works silently,
    /// its result for the agent alone (the seeds' external `visible: false`).
    pub shown: bool,
    /// The permission class the tool needs, when the provider knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission: Option<PermissionClass>,
    /// Whether a call may run as an MCP task (SEP-2663) for clients that take tasks: long
    /// calls (an agent, a build) then return a task the client polls.
    #[serde(skip_serializing_if = "TaskSupport::is_forbidden")]
    pub task_support: TaskSupport,
}

/// Whether a tool's calls may run as MCP tasks (SEP-2663).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TaskSupport {
    /// Calls are answered in their request (the default).
    #[default]
    Forbidden,
    /// Calls from clients that take tasks run as tasks; others are answered in their
    /// request.
    Optional,
    /// Calls run only as tasks: a client that does not take tasks is refused.
    Required,
}

impl TaskSupport {
    fn is_forbidden(&self) -> bool {
        *self == TaskSupport::Forbidden
    }
}

impl Default for ToolAnnotations {
    fn default() -> Self {
        ToolAnnotations {
            read_only: false,
            destructive: false,
            idempotent: false,
            open_world: true,
            ends_turn: false,
            visible: true,
            shown: true,
            permission: None,
            task_support: TaskSupport::Forbidden,
        }
    }
}

impl ToolAnnotations {
    /// Annotations of a tool that only reads local state.
    pub fn read_only() -> Self {
        ToolAnnotations {
            read_only: true,
            idempotent: true,
            open_world: false,
            permission: Some(PermissionClass::Read),
            ..ToolAnnotations::default()
        }
    }
}

/// A tool as its provider describes it; `name` is the provider's own (not namespaced) name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    /// The provider-local name, as the provider will be called with it.
    pub name: String,
    /// A human title, when the provider has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the tool does, for the model.
    #[serde(default)]
    pub description: String,
    /// The JSON Schema of the arguments (an object schema).
    // Invariant: shared, since specs are cloned into registries and listings often.
    pub input_schema: Arc<Value>,
    /// The JSON Schema of structured results, when declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Arc<Value>>,
    /// Behaviour hints.
    #[serde(default)]
    pub annotations: ToolAnnotations,
    /// The largest result the tool says it returns, in characters (an MCP server's
    /// `_meta` `anthropic/maxResultSizeChars`): the orchestrator caps this tool's outputs
    /// there instead of at `toolResponseMaxBytes`, unless the tool's own settings say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_result_size: Option<usize>,
    /// The longest a call can run by the tool's own reckoning: a shell tool that ends a
    /// command at its own `timeout` and answers with the output so far. The orchestrator
    /// waits at least this long for the tool (plus nothing: the tool includes the time it
    /// needs to answer), unless the tool's own settings name a timeout, so that a
    /// shorter `toolTimeout` does not cut the call off with its output lost.
    #[serde(
        default,
        rename = "timeLimitMs",
        with = "millis",
        skip_serializing_if = "Option::is_none"
    )]
    pub time_limit: Option<Duration>,
    /// What else describes the tool to the programs that show or route it, kept as the
    /// provider gave it and served on as it is: an MCP tool's `_meta` (an MCP App's
    /// `ui.resourceUri`, a client's hints), with the metadata configuration adds
    /// (`tools.NAME.meta`). Models are not shown it.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Arc<serde_json::Map<String, Value>>>,
    /// The icons a user interface may show for the tool (an MCP tool's `icons`: objects
    /// with `src`, `mimeType`, `sizes`, `theme`), as the provider gave them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icons: Option<Arc<Value>>,
}

/// `Option<Duration>` as whole milliseconds.
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

impl ToolSpec {
    /// A spec with the given name, description and input schema, default annotations.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            title: None,
            description: description.into(),
            input_schema: Arc::new(input_schema),
            output_schema: None,
            annotations: ToolAnnotations::default(),
            max_result_size: None,
            time_limit: None,
            meta: None,
            icons: None,
        }
    }

    /// Sets the tool's icons ([`ToolSpec::icons`]): a list of MCP icon objects.
    pub fn with_icons(mut self, icons: Value) -> Self {
        self.icons = Some(Arc::new(icons));
        self
    }

    /// Sets one member of the tool's metadata ([`ToolSpec::meta`]), keeping the others.
    pub fn with_meta(mut self, key: impl Into<String>, value: Value) -> Self {
        Arc::make_mut(self.meta.get_or_insert_with(Default::default)).insert(key.into(), value);
        self
    }

    /// Sets the largest result the tool says it returns, in characters.
    pub fn with_max_result_size(mut self, chars: usize) -> Self {
        self.max_result_size = Some(chars);
        self
    }

    /// Sets the longest a call can run by the tool's own reckoning (see
    /// [`ToolSpec::time_limit`]).
    pub fn with_time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = Some(limit);
        self
    }

    /// Replaces the annotations.
    pub fn with_annotations(mut self, annotations: ToolAnnotations) -> Self {
        self.annotations = annotations;
        self
    }

    /// Sets the output schema.
    pub fn with_output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(Arc::new(schema));
        self
    }

    /// Sets the title.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// The schema `{"type": "object"}`: any object is accepted.
    pub fn any_object_schema() -> Value {
        serde_json::json!({"type": "object"})
    }
}

/// The JSON Schema (draft 2020-12) of a Rust type, as a tool input schema.
///
/// Titles are dropped (models do not need the Rust type name) and an empty `properties`
/// is kept so that every input schema is an object schema.
pub fn schema_for<T: schemars::JsonSchema>() -> Value {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<T>();
    let mut value = schema.to_value();
    if let Value::Object(map) = &mut value {
        map.remove("title");
        if map.get("type").is_some_and(|t| t == "object") && !map.contains_key("properties") {
            map.insert("properties".into(), Value::Object(Default::default()));
        }
    }
    value
}

/// One request to run a tool: the (namespaced) name and its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The caller's id for this call (a model's tool-use id), echoed in events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The tool's full name, `{namespace}__{tool}` or an alias.
    pub name: String,
    /// The arguments; a JSON object for every well-formed call.
    #[serde(default)]
    pub arguments: Value,
}

impl ToolCall {
    /// A call with no caller id.
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        ToolCall { id: None, name: name.into(), arguments }
    }

    /// Sets the caller's id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
}
