//! Anthropic's messages API (`POST {baseUrl}/v1/messages`).

use crate::http::{Assembler, Endpoint, StreamError, error_kind_status};
use crate::message::{
    answer_token, distinct_id, distinct_ids, estimated_usage, generated_id, reported_tokens,
    unwrapped, usage_reported, wire_name,
};
use crate::{
    DeltaSink, MAX_CONTINUATIONS, Message, Model, ModelDelta, ModelError, ModelRequest,
    ModelResponse, ModelToolCall, ProviderBlocks, StopReason, ToolChoice, ToolResultMessage, Usage,
};
use async_trait::async_trait;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, PoisonError};
use tokio_util::sync::CancellationToken;
use toolmux_core::schema::{SchemaRules, adapt};
use toolmux_core::sse::Event;

/// The API version every request names.
pub(crate) const API_VERSION: &str = "2023-06-01";

/// The stop reason of a paused turn, which [`parse`] gives as [`StopReason::Other`] for
/// the client to continue.
const PAUSE_TURN: &str = "pause_turn";

/// A client of Anthropic's messages API.
#[derive(Debug)]
pub(crate) struct AnthropicModel {
    pub(crate) endpoint: Endpoint,
    pub(crate) max_tokens: u32,
    pub(crate) temperature: Option<f64>,
    /// Marks the tools, the system prompt and the latest turn for the prompt cache.
    pub(crate) prompt_cache: bool,
    /// Sends the images of tool results (`images`, default true).
    pub(crate) images: bool,
}

/// A prompt cache breakpoint: the API caches the request up to the block that carries it.
fn cache_mark() -> Value {
    json!({"type": "ephemeral"})
}

#[async_trait]
impl Model for AnthropicModel {
    fn name(&self) -> &str {
        &self.endpoint.name
    }

    fn context_window(&self) -> Option<u64> {
        self.endpoint.context_window
    }

    fn max_output_tokens(&self) -> Option<u64> {
        Some(u64::from(self.max_tokens))
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, ModelError> {
        self.continued(request, cancel, None).await
    }

    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ModelError> {
        self.continued(request, cancel, Some(on_delta)).await
    }
}

impl AnthropicModel {
    /// The answer to `request`, continued while the API pauses it (`pause_turn`, which its
    /// server tools give when a turn runs long), as Anthropic documents: the paused
    /// content goes back unchanged as the request's last, assistant, message, and the
    /// model carries the turn on from there. The answer is the whole turn: every part's
    /// blocks (kept in [`ModelResponse::blocks`] for the next turn), text and calls, and
    /// the tokens of every request. More than [`MAX_CONTINUATIONS`] continuations fail as
    /// [`ModelError::Stopped`] carrying them all; a request that fails on the way carries
    /// the earlier ones' tokens when its error carries any.
    async fn continued(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
        on_delta: Option<DeltaSink<'_>>,
    ) -> Result<ModelResponse, ModelError> {
        let mut body = self.body(request);
        // The request's own messages, which each continuation follows with the turn so far.
        let asked = body["messages"].take();
        body["messages"] = asked.clone();
        let mut paused: Vec<Value> = Vec::new();
        let mut usage = Usage::default();
        let mut continuations = 0;
        // Each part's deltas go to the caller as one answer's (see `StreamedParts`).
        let parts = on_delta.map(StreamedParts::new);
        let relay = |delta: ModelDelta<'_>| {
            if let Some(parts) = &parts {
                parts.pass(delta);
            }
        };
        let part_sink = parts.as_ref().map(|_| &relay as DeltaSink<'_>);
        loop {
            let mut part = match self.ask(body.clone(), cancel, part_sink).await {
                Ok(part) => part,
                Err(error) => return Err(error.with_earlier_usage(usage)),
            };
            usage += part.usage;
            let blocks = part.blocks.take().map(|kept| kept.blocks).unwrap_or_default();
            if part.stop != StopReason::Other(PAUSE_TURN.to_owned()) {
                if continuations == 0 {
                    part.blocks = kept(blocks, &self.endpoint, false);
                    return Ok(part);
                }
                paused.extend(blocks);
                let (content, tool_calls, blocks) = read_content(paused, &self.endpoint)?;
                return Ok(ModelResponse {
                    content,
                    tool_calls,
                    usage,
                    blocks: kept(blocks, &self.endpoint, true),
                    ..part
                });
            }
            if continuations == MAX_CONTINUATIONS {
                return Err(ModelError::Stopped {
                    model: self.endpoint.name.clone(),
                    reason: PAUSE_TURN.to_owned(),
                    message: format!(
                        "the API paused a long turn of server tools (web search, code \
                         execution) {} times, and it was continued {MAX_CONTINUATIONS} times, \
                         the most toolmux does: ask for less at a time, or have whatever adds \
                         server tools to the request (a proxy, a gateway) add none",
                        MAX_CONTINUATIONS + 1
                    ),
                    usage,
                });
            }
            continuations += 1;
            tracing::debug!(model = %self.endpoint.name, continuations, "the API paused the turn; continuing it");
            paused.extend(blocks);
            body["messages"] = continuation(&asked, &paused);
            if let Some(parts) = &parts {
                parts.next_part(part.tool_calls.len());
            }
        }
    }

    /// One request's answer, streamed to `on_delta` when there is one.
    async fn ask(
        &self,
        body: Value,
        cancel: &CancellationToken,
        on_delta: Option<DeltaSink<'_>>,
    ) -> Result<ModelResponse, ModelError> {
        let sent = body.to_string().len();
        let answer = match on_delta {
            Some(on_delta) => {
                let mut events = Events::default();
                self.endpoint
                    .complete_streaming(body, &[], cancel, on_delta, &mut events, parse)
                    .await
            }
            None => parse(&self.endpoint.post(&body, cancel).await?, &self.endpoint),
        };
        // Usage not reported, or not believably ([`usage`]), is estimated from the
        // lengths, so that budgets never take a request for free.
        match answer {
            Ok(answer) => Ok(answer.with_estimated_usage(sent, &self.endpoint.name)),
            Err(mut error) => {
                if let ModelError::ContextWindowReached { usage, .. }
                | ModelError::Stopped { usage, .. } = &mut error
                    && usage.estimated
                {
                    *usage = estimated_usage(sent, 0);
                }
                Err(error)
            }
        }
    }
}

/// The deltas of a turn continued after pauses, passed on to the caller's sink as those of
/// one answer: each part's calls numbered after the calls of the parts before it, a call
/// whose id an earlier call of the turn has renamed as the answer renames it
/// ([`distinct_ids`], over the whole turn's calls), and a
/// part's [`ModelDelta::Restart`] (its request tried again) followed by the deltas of the
/// parts before it once more, since a restart voids everything the caller received while
/// the answer still holds what those parts gave.
struct StreamedParts<'a> {
    sink: DeltaSink<'a>,
    state: Mutex<PartsState>,
}

#[derive(Debug, Default)]
struct PartsState {
    /// The deltas passed on since the last restart, those of the earlier parts first, with
    /// consecutive text and consecutive fragments of one call's arguments joined.
    sent: Vec<SentDelta>,
    /// Where the current part's deltas begin in `sent`.
    // Invariant: at most `sent.len()`.
    current: usize,
    /// The calls of the earlier parts, which the current part's are numbered after.
    earlier_calls: usize,
    /// The ids of the calls passed on since the last restart, as passed on.
    ids: HashSet<String>,
    /// Those of the earlier parts' calls, which a restart goes back to.
    earlier_ids: HashSet<String>,
}

/// A delta passed on, owned, to be passed on again after a restart.
#[derive(Debug)]
enum SentDelta {
    Text(String),
    ToolCall { index: usize, id: String, name: String },
    ToolArguments { index: usize, fragment: String },
}

impl<'a> StreamedParts<'a> {
    fn new(sink: DeltaSink<'a>) -> Self {
        StreamedParts { sink, state: Mutex::default() }
    }

    /// Passes `delta` of the current part on, numbering its call after the earlier parts'.
    fn pass(&self, delta: ModelDelta<'_>) {
        // The lock is held while the sink runs, which cannot call back into this.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let offset = state.earlier_calls;
        let current = state.current;
        let in_part = state.sent.len() > current;
        match delta {
            ModelDelta::Restart => {
                state.sent.truncate(current);
                state.ids = state.earlier_ids.clone();
                (self.sink)(ModelDelta::Restart);
                for sent in &state.sent {
                    (self.sink)(sent.as_delta());
                }
            }
            ModelDelta::Text(text) => {
                match state.sent.last_mut() {
                    Some(SentDelta::Text(joined)) if in_part => joined.push_str(text),
                    _ => state.sent.push(SentDelta::Text(text.to_owned())),
                }
                (self.sink)(delta);
            }
            ModelDelta::ToolCall { index, id, name } => {
                let index = index.saturating_add(offset);
                // As `distinct_ids` renames it in the answer; an id left empty is made
                // there, unknown here.
                let id = if !id.is_empty() && state.ids.contains(id) {
                    distinct_id(id, |taken| state.ids.contains(taken))
                } else {
                    id.to_owned()
                };
                state.ids.insert(id.clone());
                let name = name.to_owned();
                (self.sink)(ModelDelta::ToolCall { index, id: &id, name: &name });
                state.sent.push(SentDelta::ToolCall { index, id, name });
            }
            ModelDelta::ToolArguments { index, fragment } => {
                let index = index.saturating_add(offset);
                match state.sent.last_mut() {
                    Some(SentDelta::ToolArguments { index: last, fragment: joined })
                        if in_part && *last == index =>
                    {
                        joined.push_str(fragment);
                    }
                    _ => state
                        .sent
                        .push(SentDelta::ToolArguments { index, fragment: fragment.to_owned() }),
                }
                (self.sink)(ModelDelta::ToolArguments { index, fragment });
            }
        }
    }

    /// Ends the current part, which made `calls` calls; the next part's deltas follow.
    fn next_part(&self, calls: usize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.earlier_calls = state.earlier_calls.saturating_add(calls);
        state.current = state.sent.len();
        state.earlier_ids = state.ids.clone();
    }
}

impl SentDelta {
    fn as_delta(&self) -> ModelDelta<'_> {
        match self {
            SentDelta::Text(text) => ModelDelta::Text(text),
            SentDelta::ToolCall { index, id, name } => {
                ModelDelta::ToolCall { index: *index, id, name }
            }
            SentDelta::ToolArguments { index, fragment } => {
                ModelDelta::ToolArguments { index: *index, fragment }
            }
        }
    }
}

/// `messages` (a request's) followed by the assistant turn `paused` so far, which the API
/// carries on: its blocks as they came, after those of a last assistant message the
/// request held already (a prefill, which the answer carried on as well).
fn continuation(messages: &Value, paused: &[Value]) -> Value {
    let mut messages = messages.as_array().cloned().unwrap_or_default();
    match messages.last_mut() {
        Some(last) if last["role"] == "assistant" => {
            let mut content = match last["content"].take() {
                Value::Array(blocks) => blocks,
                Value::String(text) => vec![json!({"type": "text", "text": text})],
                _ => Vec::new(),
            };
            content.extend(paused.iter().cloned());
            last["content"] = Value::Array(content);
        }
        _ => messages.push(json!({"role": "assistant", "content": paused})),
    }
    Value::Array(messages)
}

/// `blocks` to keep with an answer of this API: only when they hold what its text and
/// calls do not say (server tools' blocks, thinking, a turn `continued` after a pause), so
/// that a plain answer goes back as it always did.
fn kept(blocks: Vec<Value>, endpoint: &Endpoint, continued: bool) -> Option<ProviderBlocks> {
    let plain = |block: &Value| matches!(block["type"].as_str(), Some("text" | "tool_use"));
    (continued || !blocks.iter().all(plain))
        .then(|| ProviderBlocks { blocks, origin: endpoint.origin() })
}

/// A streamed message's events, folded into the message they make.
#[derive(Debug, Default)]
struct Events {
    model: Option<Value>,
    /// The content blocks by the API's index.
    blocks: BTreeMap<u64, Block>,
    /// How many tool calls have begun.
    calls: usize,
    stop_reason: Option<Value>,
    /// `message_start`'s usage, updated by each `message_delta`'s.
    usage: Map<String, Value>,
    /// `message_stop` was read.
    stopped: bool,
    /// The answer's part of the ids it gives calls without one (see [`generated_id`]),
    /// made when the first is needed.
    token: Option<String>,
}

#[derive(Debug)]
enum Block {
    /// A text block: its text, and the block as it started (with the citations its
    /// `citations_delta`s add), which goes back to the API with a paused turn.
    Text(String, Value),
    /// A call: its `input` as its `input_json_delta`s gave it, else as the block's start
    /// gave it (`given`: some servers send it whole there, an object or its JSON text,
    /// and no delta).
    ToolUse { id: String, name: String, input: String, given: Option<Value>, call: usize },
    /// A block the agent does not read (thinking, a server tool's call or result, …), as it
    /// started, with what its deltas add: a server tool call's `input` (JSON in pieces,
    /// kept here until the block is whole), a thinking block's text and signature. It goes
    /// back to the API unchanged with a paused turn.
    Other(Value, String),
}

impl Assembler for Events {
    fn reset(&mut self) {
        *self = Events::default();
    }

    fn event(&mut self, event: &Event, on_delta: DeltaSink<'_>) -> Result<bool, StreamError> {
        let data: Value = serde_json::from_str(&event.data).map_err(|e| {
            StreamError::Malformed(format!("the stream's `{}` event is not JSON ({e})", event.name))
        })?;
        let kind = data.get("type").and_then(Value::as_str).unwrap_or(&event.name);
        let index = || {
            data.get("index").and_then(Value::as_u64).ok_or_else(|| {
                StreamError::Malformed(format!("the stream's `{kind}` event has no `index`"))
            })
        };
        match kind {
            "message_start" => {
                let message = data.get("message");
                self.model = message.and_then(|m| m.get("model")).cloned();
                self.merge_usage(message.and_then(|m| m.get("usage")));
            }
            "content_block_start" => {
                let index = index()?;
                let block = data.get("content_block").cloned().unwrap_or(Value::Null);
                let text = |field: &str| {
                    block.get(field).and_then(Value::as_str).unwrap_or_default().to_owned()
                };
                let block = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = text("text");
                        if !text.is_empty() {
                            on_delta(ModelDelta::Text(&text));
                        }
                        Block::Text(text, block)
                    }
                    Some("tool_use") => {
                        // An id missing, or one an earlier call took, is made the call's
                        // own as the answer's parser makes it (`distinct_ids`).
                        let id = match text("id") {
                            id if id.is_empty() => {
                                let token = self.token.get_or_insert_with(answer_token);
                                generated_id(token, self.calls)
                            }
                            id => id,
                        };
                        let id = distinct_id(&id, |id| {
                            self.blocks.values().any(
                                |b| matches!(b, Block::ToolUse { id: earlier, .. } if earlier == id),
                            )
                        });
                        let name = text("name");
                        let call = self.calls;
                        self.calls += 1;
                        on_delta(ModelDelta::ToolCall { index: call, id: &id, name: &name });
                        // Anthropic's own start says `{}` and streams the input after.
                        let given = block.get("input").filter(|input| match input {
                            Value::Object(members) => !members.is_empty(),
                            Value::String(text) => !text.trim().is_empty(),
                            _ => false,
                        });
                        if let Some(given) = given {
                            let fragment = match given {
                                Value::String(text) => text.clone(),
                                object => object.to_string(),
                            };
                            on_delta(ModelDelta::ToolArguments {
                                index: call,
                                fragment: &fragment,
                            });
                        }
                        Block::ToolUse {
                            id,
                            name,
                            input: String::new(),
                            given: given.cloned(),
                            call,
                        }
                    }
                    _ => Block::Other(block, String::new()),
                };
                self.blocks.insert(index, block);
            }
            "content_block_delta" => {
                let index = index()?;
                let delta = data.get("delta");
                let fragment = |field: &str| {
                    delta.and_then(|d| d.get(field)).and_then(Value::as_str).unwrap_or_default()
                };
                match self.blocks.get_mut(&index) {
                    Some(Block::Text(text, block)) => {
                        let more = fragment("text");
                        text.push_str(more);
                        if !more.is_empty() {
                            on_delta(ModelDelta::Text(more));
                        }
                        if let Some(citation) = delta.and_then(|d| d.get("citation")) {
                            push_to(block, "citations", citation.clone());
                        }
                    }
                    Some(Block::ToolUse { input, call, .. }) => {
                        let more = fragment("partial_json");
                        input.push_str(more);
                        if !more.is_empty() {
                            on_delta(ModelDelta::ToolArguments { index: *call, fragment: more });
                        }
                    }
                    Some(Block::Other(block, input)) => {
                        let kind = delta.and_then(|d| d.get("type")).and_then(Value::as_str);
                        let (field, more) = match kind {
                            Some("input_json_delta") => {
                                input.push_str(fragment("partial_json"));
                                return Ok(false);
                            }
                            Some("thinking_delta") => ("thinking", fragment("thinking")),
                            Some("signature_delta") => ("signature", fragment("signature")),
                            Some("text_delta") => ("text", fragment("text")),
                            _ => return Ok(false),
                        };
                        append_to(block, field, more);
                    }
                    None => {
                        return Err(StreamError::Malformed(format!(
                            "the stream's `content_block_delta` names block {index}, which did not start"
                        )));
                    }
                }
            }
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").filter(|r| !r.is_null()) {
                    self.stop_reason = Some(reason.clone());
                }
                self.merge_usage(data.get("usage"));
            }
            "message_stop" => {
                self.stopped = true;
                return Ok(true);
            }
            "error" => {
                let error = data.get("error").unwrap_or(&data);
                let message = match error.get("message").and_then(Value::as_str) {
                    Some(message) => message.to_owned(),
                    None => error.to_string(),
                };
                let kind = error.get("type").and_then(Value::as_str).unwrap_or("error");
                // A kind the API does not document is a server's failure, retried.
                let status = error_kind_status(kind).unwrap_or(500);
                return Err(StreamError::Api { kind: kind.to_owned(), status, message });
            }
            // `ping`, `content_block_stop`, and what later versions of the API add.
            _ => {}
        }
        Ok(false)
    }

    fn finish(&mut self) -> Option<Value> {
        if !self.stopped {
            return None;
        }
        let content: Vec<Value> = self
            .blocks
            .values()
            .map(|block| match block {
                Block::Text(text, start) => {
                    let mut block = start.clone();
                    block["text"] = json!(text);
                    block
                }
                Block::ToolUse { id, name, input, given, .. } => {
                    // A string given whole is read as the object it holds, as in a
                    // whole answer (`read_content`).
                    let input = if input.trim().is_empty() {
                        given.clone().unwrap_or_else(|| json!({}))
                    } else {
                        serde_json::from_str(input).unwrap_or_else(|_| json!(input))
                    };
                    json!({"type": "tool_use", "id": id, "name": name, "input": input})
                }
                Block::Other(start, input) => {
                    let mut block = start.clone();
                    // A server tool call's input came in pieces; whole, it is its object.
                    if !input.trim().is_empty() && block.is_object() {
                        block["input"] =
                            serde_json::from_str(input).unwrap_or_else(|_| json!(input));
                    }
                    block
                }
            })
            .collect();
        Some(json!({
            "type": "message",
            "role": "assistant",
            "model": self.model.clone().unwrap_or(Value::Null),
            "content": content,
            "stop_reason": self.stop_reason.clone().unwrap_or(Value::Null),
            "usage": self.usage,
        }))
    }
}

/// `value` appended to the array `field` of `block` (made when missing).
fn push_to(block: &mut Value, field: &str, value: Value) {
    let Some(block) = block.as_object_mut() else { return };
    match block.entry(field).or_insert_with(|| json!([])) {
        Value::Array(values) => values.push(value),
        other => *other = json!([value]),
    }
}

/// `more` appended to the string `field` of `block` (made when missing).
fn append_to(block: &mut Value, field: &str, more: &str) {
    let Some(block) = block.as_object_mut() else { return };
    let mut text = block.get(field).and_then(Value::as_str).unwrap_or_default().to_owned();
    text.push_str(more);
    block.insert(field.to_owned(), json!(text));
}

impl Events {
    fn merge_usage(&mut self, usage: Option<&Value>) {
        if let Some(usage) = usage.and_then(Value::as_object) {
            for (key, value) in usage {
                if !value.is_null() {
                    self.usage.insert(key.clone(), value.clone());
                }
            }
        }
    }
}

impl AnthropicModel {
    /// The request's body in the messages format.
    fn body(&self, request: &ModelRequest) -> Value {
        let cache = self.prompt_cache && request.continues;
        let mut body = Map::new();
        body.insert("model".into(), json!(self.endpoint.model));
        // Required by the API, unlike OpenAI's.
        body.insert("max_tokens".into(), json!(request.max_tokens.unwrap_or(self.max_tokens)));
        if let Some(system) = &request.system {
            let system = if cache {
                json!([{"type": "text", "text": system, "cache_control": cache_mark()}])
            } else {
                json!(system)
            };
            body.insert("system".into(), system);
        }
        if let Some(temperature) = request.temperature.or(self.temperature) {
            body.insert("temperature".into(), json!(temperature));
        }
        let origin = self.endpoint.origin();
        body.insert("messages".into(), messages(&request.messages, cache, self.images, &origin));
        if !request.tools.is_empty() {
            let rules = SchemaRules { plain_top_level: true, ..SchemaRules::default() };
            let mut tools: Vec<Value> = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "name": tool.name,
                        "description": tool.description,
                        "input_schema": adapt(&tool.input_schema, &rules),
                    })
                })
                .collect();
            // The tools come first in the cached prefix and change least: their own
            // breakpoint keeps them cached when the conversation changes in the middle
            // (old tool results elided to fit the context window).
            if cache && let Some(last) = tools.last_mut() {
                last["cache_control"] = cache_mark();
            }
            body.insert("tools".into(), Value::Array(tools));
            body.insert("tool_choice".into(), tool_choice(&request.tool_choice));
        }
        Value::Object(body)
    }
}

/// The conversation as the API's alternating user and assistant messages: consecutive
/// turns of one role (tool results and the user's next words, both `user` to the API)
/// become one message of their blocks in order. With `cache`, the last block carries a
/// cache breakpoint, so that the next turn (this conversation and more) reads it all from
/// the cache. With `images`, tool results carry their images. An assistant turn whose
/// `blocks` this API (`origin`) gave goes as those blocks ([`kept_blocks`]).
fn messages(conversation: &[Message], cache: bool, images: bool, origin: &str) -> Value {
    let mut turns: Vec<(&str, Vec<Value>)> = Vec::new();
    for message in conversation {
        let (role, blocks) = match message {
            // The API refuses a text block that is empty or only whitespace, which
            // Claude's own answers may hold (`"\n\n"` before its calls); it says nothing.
            Message::User { content } if content.trim().is_empty() => ("user", Vec::new()),
            Message::User { content } => ("user", vec![json!({"type": "text", "text": content})]),
            Message::Assistant { tool_calls, blocks: Some(kept), .. } if kept.origin == origin => {
                ("assistant", kept_blocks(&kept.blocks, tool_calls))
            }
            Message::Assistant { content, tool_calls, .. } => {
                let mut blocks = Vec::with_capacity(tool_calls.len() + 1);
                if !content.trim().is_empty() {
                    blocks.push(json!({"type": "text", "text": content}));
                }
                blocks.extend(tool_calls.iter().map(tool_use));
                ("assistant", blocks)
            }
            Message::Tool { results } => {
                let blocks = results
                    .iter()
                    .map(|result| {
                        let mut block =
                            json!({"type": "tool_result", "tool_use_id": result.call_id});
                        // A blank result goes without content (which the API leaves
                        // optional) rather than as blank text.
                        if let Some(content) = tool_result_content(result, images) {
                            block["content"] = content;
                        }
                        if result.is_error {
                            block["is_error"] = json!(true);
                        }
                        block
                    })
                    .collect();
                ("user", blocks)
            }
        };
        // The API refuses an empty message; an assistant turn with nothing in it says
        // nothing, and leaving it out merges its neighbours.
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, merged)) if *last == role => merged.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    if cache && let Some(last) = turns.last_mut().and_then(|(_, blocks)| blocks.last_mut()) {
        last["cache_control"] = cache_mark();
    }
    let messages = turns
        .into_iter()
        .map(|(role, mut blocks)| {
            // A lone text block goes as plain text, the API's simplest form (unless it
            // carries the cache breakpoint, which only a block can).
            let content = match blocks.as_mut_slice() {
                [only] if only["type"] == "text" && only.get("cache_control").is_none() => {
                    only["text"].take()
                }
                _ => Value::Array(blocks),
            };
            json!({"role": role, "content": content})
        })
        .collect();
    Value::Array(messages)
}

/// A call as a `tool_use` block.
fn tool_use(call: &ModelToolCall) -> Value {
    // The API takes only an object; arguments that were not one were refused already, and
    // the model reads why in the result.
    let input = if call.arguments.is_object() { call.arguments.clone() } else { json!({}) };
    json!({"type": "tool_use", "id": call.id, "name": wire_name(&call.name), "input": input})
}

/// The blocks this API gave an assistant turn, as it gave them, but for its calls, written
/// from `tool_calls` (matched by id: arguments changed since go as changed, a call no
/// longer in the turn goes not, one only there goes after the blocks) and blank text,
/// which the API refuses in a request.
fn kept_blocks(blocks: &[Value], tool_calls: &[ModelToolCall]) -> Vec<Value> {
    let mut written = HashSet::new();
    let mut out: Vec<Value> = blocks
        .iter()
        .filter_map(|block| match block["type"].as_str() {
            Some("tool_use") => {
                let call = tool_calls.iter().find(|call| block["id"] == call.id.as_str())?;
                written.insert(call.id.as_str());
                Some(tool_use(call))
            }
            Some("text") if block["text"].as_str().is_some_and(|t| t.trim().is_empty()) => None,
            _ => Some(block.clone()),
        })
        .collect();
    out.extend(tool_calls.iter().filter(|call| !written.contains(call.id.as_str())).map(tool_use));
    out
}

/// A tool result's `content`: its text, or with images, a text block (unless the text is
/// blank) and an image block each; `None` for blank text and no image.
fn tool_result_content(result: &ToolResultMessage, images: bool) -> Option<Value> {
    let (text, shown) = result.wire_parts(images);
    if shown.is_empty() {
        return (!text.trim().is_empty()).then(|| json!(text));
    }
    let mut blocks = Vec::with_capacity(shown.len() + 1);
    if !text.trim().is_empty() {
        blocks.push(json!({"type": "text", "text": text}));
    }
    for (media_type, data) in shown {
        blocks.push(json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }));
    }
    Some(Value::Array(blocks))
}

fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Tool(name) => json!({"type": "tool", "name": name}),
    }
}

/// A message as a [`ModelResponse`]; a paused turn (`pause_turn`) as one that stopped for
/// [`StopReason::Other`] `pause_turn`, its blocks kept, for [`AnthropicModel::continued`] to
/// carry on.
fn parse(answer: &Value, endpoint: &Endpoint) -> Result<ModelResponse, ModelError> {
    let blocks = answer.get("content").and_then(Value::as_array).ok_or_else(|| {
        match answer.pointer("/error/message").and_then(Value::as_str) {
            // Some proxies answer an error with status 200.
            Some(message) => ModelError::Malformed {
                model: endpoint.name.clone(),
                message: endpoint.redact(&format!("no `content`, but an error: {message}")),
            },
            None => endpoint.missing("content"),
        }
    })?;
    let (content, tool_calls, blocks) = read_content(blocks.clone(), endpoint)?;
    let stop = match answer.get("stop_reason").and_then(Value::as_str) {
        Some("end_turn" | "stop_sequence") => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some("refusal") => StopReason::ContentFilter,
        // The answer filled the model's context window. Asked to go on from the cut, as
        // after `max_tokens`, the model would get a longer request that cannot fit either;
        // read as a request over the window, the oldest tool results give way and the turn
        // is asked again ([`ModelError::context_overflow`]).
        Some("model_context_window_exceeded") => {
            return Err(ModelError::ContextWindowReached {
                model: endpoint.name.clone(),
                usage: usage(answer),
            });
        }
        Some(other) => StopReason::Other(other.to_owned()),
        None if !tool_calls.is_empty() => StopReason::ToolUse,
        None => StopReason::EndTurn,
    };
    // The blocks of every answer go to `continued`, which keeps them with the turn when
    // they say more than its text and calls.
    let blocks = Some(ProviderBlocks { blocks, origin: endpoint.origin() });
    Ok(ModelResponse {
        content,
        tool_calls,
        stop,
        usage: usage(answer),
        model: answer.get("model").and_then(Value::as_str).unwrap_or_default().to_owned(),
        // Thinking blocks go back with the turn's `blocks`; toolmux asks for no thinking,
        // and reads none.
        reasoning: None,
        blocks,
    })
}

/// A message's content blocks read: their text (the text blocks' joined by newlines), the
/// calls they make (ids made distinct, [`distinct_ids`]), and the blocks as they came but
/// for those ids, which the calls' results will name.
fn read_content(
    mut blocks: Vec<Value>,
    endpoint: &Endpoint,
) -> Result<(String, Vec<ModelToolCall>, Vec<Value>), ModelError> {
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = block
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| endpoint.missing(&format!("content[{index}].text")))?;
                texts.push(text);
            }
            Some("tool_use") => {
                let field = |name: &str| {
                    block
                        .get(name)
                        .and_then(Value::as_str)
                        .ok_or_else(|| endpoint.missing(&format!("content[{index}].{name}")))
                };
                let input = block.get("input").cloned().map_or_else(|| json!({}), unwrapped);
                let mut call = ModelToolCall::new(field("id")?, field("name")?, input);
                // The API's input is an object; a string is what a stream gave that did not
                // parse (cut at the output limit, say): the call's arguments are not JSON.
                if let Value::String(raw) = &call.arguments {
                    call.raw_arguments = Some(raw.clone());
                    call.arguments = Value::Null;
                }
                tool_calls.push(call);
            }
            // Thinking, server tools' calls and results, and other blocks the agent does
            // not read: kept in the blocks.
            Some(_) => {}
            None => return Err(endpoint.missing(&format!("content[{index}].type"))),
        }
    }
    let content = texts.join("\n");
    distinct_ids(&mut tool_calls);
    let uses = blocks.iter_mut().filter(|block| block["type"] == "tool_use");
    for (block, call) in uses.zip(&tool_calls) {
        block["id"] = json!(call.id);
    }
    Ok((content, tool_calls, blocks))
}

/// A message's usage figures; none reported, or figures no model gives (negative,
/// fractional, over [`crate::message::MAX_REPORTED_TOKENS`]), are marked estimated, all
/// zero, for [`AnthropicModel::ask`] to estimate as the OpenAI client does.
fn usage(answer: &Value) -> Usage {
    let tokens = |field: &str| reported_tokens(answer, field).unwrap_or(0);
    let (input, output) = ("/usage/input_tokens", "/usage/output_tokens");
    let (read, write) = ("/usage/cache_read_input_tokens", "/usage/cache_creation_input_tokens");
    if !usage_reported(answer, &[input, output], &[read, write]) {
        return Usage { estimated: true, ..Usage::default() };
    }
    // Anthropic's `input_tokens` leaves out what was read from or written to the cache;
    // toolmux's counts every token read, as OpenAI's does.
    let (cache_read, cache_write) = (tokens(read), tokens(write));
    Usage {
        input_tokens: tokens(input).saturating_add(cache_read).saturating_add(cache_write),
        output_tokens: tokens(output),
        cache_read_tokens: cache_read,
        cache_write_tokens: cache_write,
        estimated: false,
    }
}

#[cfg(test)]
mod tests {
    use super::{Assembler, Events};
    use crate::ModelDelta;
    use crate::http::StreamError;
    use serde_json::{Value, json};
    use toolmux_core::sse::Event;

    fn event(data: &Value) -> Event {
        let name = data["type"].as_str().unwrap_or("message").to_owned();
        Event { name, data: data.to_string() }
    }

    #[test]
    fn thinking_blocks_and_unknown_events_are_kept_out_of_the_text() {
        let mut events = Events::default();
        let texts = std::sync::Mutex::new(String::new());
        let on_delta = |delta: ModelDelta<'_>| {
            if let ModelDelta::Text(text) = delta {
                texts.lock().unwrap().push_str(text);
            }
        };
        let stream = [
            json!({"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 9, "cache_read_input_tokens": 4}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "x"}}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "some_future_event", "index": 1}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        ];
        for data in &stream {
            assert!(!events.event(&event(data), &on_delta).unwrap(), "{data}");
        }
        assert_eq!(events.finish(), None, "no message_stop yet");
        assert!(events.event(&event(&json!({"type": "message_stop"})), &on_delta).unwrap());
        let answer = events.finish().unwrap();
        assert_eq!(*texts.lock().unwrap(), "Hi");
        assert_eq!(answer["content"][0]["type"], "thinking");
        assert_eq!(answer["content"][1], json!({"type": "text", "text": "Hi"}));
        assert_eq!(answer["stop_reason"], "end_turn");
        assert_eq!(
            answer["usage"],
            json!({"input_tokens": 9, "cache_read_input_tokens": 4, "output_tokens": 2})
        );
    }

    #[test]
    fn streamed_calls_sharing_an_id_are_given_ids_of_their_own() {
        let mut events = Events::default();
        let seen = std::sync::Mutex::new(Vec::new());
        let on_delta = |delta: ModelDelta<'_>| {
            if let ModelDelta::ToolCall { id, .. } = delta {
                seen.lock().unwrap().push(id.to_owned());
            }
        };
        for index in 0..3 {
            let id = if index == 2 { "" } else { "grep:3" };
            let start = json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": id, "name": "grep", "input": {}}});
            assert!(!events.event(&event(&start), &on_delta).unwrap());
        }
        assert!(events.event(&event(&json!({"type": "message_stop"})), &on_delta).unwrap());
        let answer = events.finish().unwrap();
        let ids: Vec<&Value> =
            answer["content"].as_array().unwrap().iter().map(|b| &b["id"]).collect();
        assert_eq!(ids[..2], [&json!("grep:3"), &json!("grep:3_2")]);
        // A call without an id gets one of the answer's own (see `generated_id`).
        let generated = ids[2].as_str().unwrap();
        assert!(generated.starts_with("call_") && generated.ends_with("_2"), "{generated}");
        assert_eq!(generated.len(), "call_12345678_2".len(), "{generated}");
        assert_eq!(*seen.lock().unwrap(), ["grep:3", "grep:3_2", generated]);
    }

    #[test]
    fn a_delta_of_a_block_that_never_started_is_malformed() {
        let mut events = Events::default();
        let delta = json!({"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "x"}});
        let error = events.event(&event(&delta), &|_| {}).unwrap_err();
        assert!(matches!(&error, StreamError::Malformed(m) if m.contains("block 3")), "{error:?}");
        let not_json = Event { name: "ping".into(), data: "{".into() };
        assert!(matches!(events.event(&not_json, &|_| {}), Err(StreamError::Malformed(_))));
    }
}
