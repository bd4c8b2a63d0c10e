//! OpenAI-compatible chat completions (`POST {baseUrl}/chat/completions`), which OpenAI
//! and most self-hosted servers (vLLM, llama.cpp, Ollama, LiteLLM) speak.

use crate::http::{Assembler, Endpoint, StreamError, error_kind_status};
use crate::message::{estimated_usage, reported_tokens, unwrapped, usage_reported, wire_name};
use crate::{
    DeltaSink, Message, Model, ModelDelta, ModelError, ModelRequest, ModelResponse, ModelToolCall,
    Reasoning, StopReason, ToolChoice, Usage,
};
use async_trait::async_trait;
use serde_json::{Map, Value, json};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;
use toolmux_core::schema::{SchemaRules, adapt};
use toolmux_core::sse::Event;

/// What OpenAI accepts of a tool's input schema: no union at the top level, and an object
/// with `properties`.
fn schema_rules() -> SchemaRules {
    SchemaRules { plain_top_level: true, top_level_properties: true, ..SchemaRules::default() }
}

/// A client of an OpenAI-compatible chat completions API.
#[derive(Debug)]
pub(crate) struct OpenAiModel {
    pub(crate) endpoint: Endpoint,
    pub(crate) max_tokens: u32,
    pub(crate) temperature: Option<f64>,
    /// Sends the images of tool results (`images`, default true).
    pub(crate) images: bool,
    /// Streamed requests ask for the usage with `stream_options`, until the API refuses
    /// the member (see [`refuses_stream_options`]); then never again for this client.
    pub(crate) stream_options: AtomicBool,
    /// The output limit goes as `max_completion_tokens`, not `max_tokens`: OpenAI's own
    /// API from the start ([`wants_completion_tokens`]), any other once it refused
    /// `max_tokens` asking for it (see [`refuses_max_tokens`]), from then on for this
    /// client.
    pub(crate) completion_tokens: AtomicBool,
}

#[async_trait]
impl Model for OpenAiModel {
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
        let mut answer = self.endpoint.post(&self.body(request), cancel).await;
        if let Err(error) = &answer
            && self.corrected(error, false)
        {
            answer = self.endpoint.post(&self.body(request), cancel).await;
        }
        let answer =
            parse(&answer?, &self.endpoint).map_err(|e| self.estimated_error(request, e))?;
        Ok(self.estimated(request, answer))
    }

    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ModelError> {
        // The usage comes in a last chunk of its own only when asked for.
        let usage = [("stream_options", json!({"include_usage": true}))];
        let mut chunks = Chunks::default();
        let endpoint = &self.endpoint;
        // Each correction ([`OpenAiModel::corrected`]) is made once for the client, so
        // this asks at most three times.
        let answer = loop {
            let asked = self.stream_options.load(Ordering::Relaxed);
            let fields: &[_] = if asked { &usage } else { &[] };
            let body = self.body(request);
            let answer = endpoint
                .complete_streaming(body, fields, cancel, on_delta, &mut chunks, parse)
                .await;
            match &answer {
                // Refused before anything streamed, so no delta needs voiding.
                Err(error) if self.corrected(error, asked) => continue,
                _ => break answer,
            }
        };
        let answer = answer.map_err(|e| self.estimated_error(request, e))?;
        Ok(self.estimated(request, answer))
    }
}

impl OpenAiModel {
    /// Whether `error` refuses a member of the request that this client can do without
    /// and now will, from then on: `stream_options`, when the request had them
    /// (`stream_options`; streamed answers then carry no usage, which is estimated as for
    /// servers that report none), or `max_tokens` for `max_completion_tokens` (an Azure
    /// deployment or a proxy serving OpenAI's reasoning models). The request is then asked
    /// again.
    fn corrected(&self, error: &ModelError, stream_options: bool) -> bool {
        let ModelError::Api { status: 400, message, .. } = error else { return false };
        if stream_options && refuses_stream_options(message) {
            tracing::debug!(model = %self.endpoint.name, "the API refuses `stream_options`; asking again without it");
            self.stream_options.store(false, Ordering::Relaxed);
            return true;
        }
        if !self.completion_tokens.load(Ordering::Relaxed) && refuses_max_tokens(message) {
            tracing::debug!(model = %self.endpoint.name, "the API refuses `max_tokens`; asking again with `max_completion_tokens`");
            self.completion_tokens.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// `answer` with its usage estimated when the API reported none ([`parse`] marks it
    /// so), as [`ModelResponse::with_estimated_usage`] does for both APIs; the request's
    /// body is written again only then.
    fn estimated(&self, request: &ModelRequest, answer: ModelResponse) -> ModelResponse {
        if !answer.usage.estimated {
            return answer;
        }
        answer.with_estimated_usage(self.body(request).to_string().len(), &self.endpoint.name)
    }

    /// `error` with the usage it carries estimated, as [`OpenAiModel::estimated`] does an
    /// answer's, when the API reported none: the request's tokens were billed all the same.
    /// What was written before the cut or the stop is not kept, so only the request is
    /// counted.
    fn estimated_error(&self, request: &ModelRequest, mut error: ModelError) -> ModelError {
        if let ModelError::ContextWindowReached { usage, .. } | ModelError::Stopped { usage, .. } =
            &mut error
            && usage.estimated
        {
            *usage = estimated_usage(self.body(request).to_string().len(), 0);
        }
        error
    }
}

/// Whether `message`, a 400's, refuses `stream_options` as a member the API does not know:
/// Azure OpenAI's older `api-version`s say "Unrecognized request argument supplied:
/// stream_options" or "Unknown parameter: 'stream_options'."
fn refuses_stream_options(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("stream_options")
        && (message.contains("unrecognized request argument")
            || message.contains("unknown parameter"))
}

/// Whether `message`, a 400's, refuses `max_tokens` and asks for `max_completion_tokens`,
/// as OpenAI's reasoning models do wherever they are served: "Unsupported parameter:
/// 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."
fn refuses_max_tokens(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("max_tokens")
        && message.contains("max_completion_tokens")
        && (message.contains("unsupported") || message.contains("not supported"))
}

/// A streamed chat completion's chunks, folded into the completion they make.
#[derive(Debug, Default)]
struct Chunks {
    model: Option<Value>,
    text: String,
    refusal: String,
    /// The `reasoning_content` fragments so far (see [`crate::Reasoning`]).
    reasoning: String,
    /// The tool calls in the order they began.
    calls: Vec<CallParts>,
    finish_reason: Option<Value>,
    usage: Option<Value>,
    /// `[DONE]` was read.
    done: bool,
    /// The answer's part of the ids it gives calls without one (see
    /// [`crate::message::generated_id`]), made when the first is needed.
    token: Option<String>,
}

/// One tool call as its chunks have given it so far.
#[derive(Debug, Default)]
struct CallParts {
    /// The API's `index` of the call, when it gives one.
    key: Option<u64>,
    /// The id the API gave the call, when it did.
    given_id: Option<String>,
    /// The call's id: the API's, unless an earlier call has it.
    id: String,
    name: String,
    arguments: String,
    /// The call's `extra_content`, as its parts have given it (see [`ModelToolCall::extra`]).
    extra: Option<Value>,
    /// Whether its [`ModelDelta::ToolCall`] was handed out (once its name is known).
    announced: bool,
}

impl Assembler for Chunks {
    fn reset(&mut self) {
        *self = Chunks::default();
    }

    fn event(&mut self, event: &Event, on_delta: DeltaSink<'_>) -> Result<bool, StreamError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            StreamError::Malformed(format!("a chunk of the stream is not JSON ({e})"))
        })?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(stream_error(error));
        }
        if self.model.is_none() {
            self.model = chunk.get("model").cloned();
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        let Some(choice) = chunk.get("choices").and_then(Value::as_array).and_then(|c| c.first())
        else {
            return Ok(false);
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(text) = delta.get("content").and_then(Value::as_str)
                && !text.is_empty()
            {
                self.text.push_str(text);
                on_delta(ModelDelta::Text(text));
            }
            if let Some(refusal) = delta.get("refusal").and_then(Value::as_str)
                && !refusal.is_empty()
            {
                self.refusal.push_str(refusal);
                on_delta(ModelDelta::Text(refusal));
            }
            // Thought, not text: kept to go back with the answer, never shown as its text.
            if let Some(reasoning) = delta.get("reasoning_content").and_then(Value::as_str) {
                self.reasoning.push_str(reasoning);
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for call in calls {
                    self.call_part(call, on_delta);
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
            self.finish_reason = Some(reason.clone());
        }
        Ok(false)
    }

    fn finish(&mut self) -> Option<Value> {
        if !self.done && self.finish_reason.is_none() {
            return None;
        }
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        let content = if self.text.is_empty() { Value::Null } else { json!(self.text) };
        message.insert("content".into(), content);
        if !self.refusal.is_empty() {
            message.insert("refusal".into(), json!(self.refusal));
        }
        if !self.reasoning.is_empty() {
            message.insert("reasoning_content".into(), json!(self.reasoning));
        }
        if !self.calls.is_empty() {
            let calls = self
                .calls
                .iter()
                .map(|call| {
                    let mut out = json!({"id": call.id, "type": "function", "function": {
                        "name": call.name,
                        "arguments": call.arguments,
                    }});
                    if let Some(extra) = &call.extra {
                        out["extra_content"] = extra.clone();
                    }
                    out
                })
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        let mut answer = json!({
            "model": self.model.clone().unwrap_or(Value::Null),
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": self.finish_reason.clone().unwrap_or(Value::Null),
            }],
        });
        if let Some(usage) = &self.usage {
            answer["usage"] = usage.clone();
        }
        Some(answer)
    }
}

impl Chunks {
    /// One call's part of a chunk: a new call (its id and name) or more of its arguments.
    fn call_part(&mut self, part: &Value, on_delta: DeltaSink<'_>) {
        let key = part.get("index").and_then(Value::as_u64);
        let id = part.get("id").and_then(Value::as_str).filter(|id| !id.is_empty());
        // By the API's index; servers that send none start a call with a new id. A part
        // whose id is not that of the call at its index starts a call too: Gemini's
        // compatible API gives every parallel call index 0 (or none), each with its own
        // id, and OpenAI names a call's id in its first part only.
        let position = match key {
            Some(key) => self.calls.iter().rposition(|c| c.key == Some(key)),
            None => self.calls.len().checked_sub(1),
        };
        let position = position.filter(|&at| match id {
            Some(id) => self.calls[at].given_id.as_deref().is_none_or(|given| given == id),
            None => true,
        });
        let position = position.unwrap_or_else(|| {
            self.calls.push(CallParts { key, ..CallParts::default() });
            self.calls.len() - 1
        });
        let call = &mut self.calls[position];
        if let Some(id) = id
            && call.given_id.is_none()
        {
            call.given_id = Some(id.to_owned());
            call.id = id.to_owned();
        }
        // Gemini sends a call's thought signature with the call's first part; a server may
        // as well send it, or more of it, with a later one.
        if let Some(extra) = part.get("extra_content").filter(|e| !e.is_null()) {
            match &mut call.extra {
                Some(kept) => merge(kept, extra),
                None => call.extra = Some(extra.clone()),
            }
        }
        let function = part.get("function");
        if let Some(name) = function.and_then(|f| f.get("name")).and_then(Value::as_str)
            && call.name.is_empty()
        {
            call.name = name.to_owned();
        }
        let fragment = match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(text)) => text.clone(),
            // Some servers send the arguments whole, as an object.
            Some(arguments) if !arguments.is_null() => arguments.to_string(),
            _ => String::new(),
        };
        call.arguments.push_str(&fragment);
        if !call.announced && !call.name.is_empty() {
            call.announced = true;
            // The id the answer's parser gives a call without one, or one an earlier call
            // took (see `distinct_ids`).
            if call.id.is_empty() {
                let token = self.token.get_or_insert_with(crate::message::answer_token);
                call.id = crate::message::generated_id(token, position);
            }
            let (earlier, rest) = self.calls.split_at_mut(position);
            let call = &mut rest[0];
            call.id =
                crate::message::distinct_id(&call.id, |id| earlier.iter().any(|c| c.id == id));
            on_delta(ModelDelta::ToolCall { index: position, id: &call.id, name: &call.name });
            // What came before the name, with this chunk's fragment.
            if !call.arguments.is_empty() {
                on_delta(ModelDelta::ToolArguments { index: position, fragment: &call.arguments });
            }
        } else if call.announced && !fragment.is_empty() {
            on_delta(ModelDelta::ToolArguments { index: position, fragment: &fragment });
        }
    }
}

/// `more` laid over `kept`: objects member by member, anything else in place of what was
/// there.
fn merge(kept: &mut Value, more: &Value) {
    match (kept, more) {
        (Value::Object(kept), Value::Object(more)) => {
            for (key, value) in more {
                match kept.get_mut(key) {
                    Some(old) => merge(old, value),
                    None => {
                        kept.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (kept, more) => *kept = more.clone(),
    }
}

/// An error object sent inside the stream, with the status its kind stands for: its
/// numeric `code` when that is one, else its `type`'s or string `code`'s
/// ([`error_kind_status`]), else a server error (a request the API refused would not have
/// started streaming).
fn stream_error(error: &Value) -> StreamError {
    let message = match error.get("message").and_then(Value::as_str) {
        Some(message) => message.to_owned(),
        None => error.to_string(),
    };
    let code = error.get("code");
    let named = [error.get("type"), code].into_iter().flatten().filter_map(Value::as_str);
    let named: Vec<&str> = named.filter(|name| !name.is_empty()).collect();
    // A spent quota named anywhere is the kind (OpenAI has sent `"type": "requests"` with
    // `"code": "insufficient_quota"`): it is what decides that the error is final.
    let spent = named.iter().find(|name| crate::http::spent_kind(name));
    let kind = spent.or(named.first()).copied().unwrap_or("error").to_owned();
    let status = match code.and_then(Value::as_u64) {
        Some(status @ 400..=599) => u16::try_from(status).unwrap_or(500),
        _ => named.iter().find_map(|name| error_kind_status(name)).unwrap_or(500),
    };
    StreamError::Api { kind, status, message }
}

/// Whether the output limit goes as `max_completion_tokens` to `url` from the start:
/// OpenAI's own API has deprecated `max_tokens` and its reasoning models refuse it, while
/// the servers that copy the API (vLLM, llama.cpp, Ollama, LiteLLM) know only
/// `max_tokens`. Others that refuse it say so, and are asked again
/// ([`OpenAiModel::corrected`]).
pub(crate) fn wants_completion_tokens(url: &reqwest::Url) -> bool {
    url.host_str() == Some("api.openai.com")
}

impl OpenAiModel {
    /// The request's body in the chat completions format.
    fn body(&self, request: &ModelRequest) -> Value {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if let Some(system) = &request.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        for message in &request.messages {
            push_message(&mut messages, message, self.images, &self.endpoint.origin());
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(self.endpoint.model));
        body.insert("messages".into(), Value::Array(messages));
        let limit = match self.completion_tokens.load(Ordering::Relaxed) {
            true => "max_completion_tokens",
            false => "max_tokens",
        };
        body.insert(limit.into(), json!(request.max_tokens.unwrap_or(self.max_tokens)));
        if let Some(temperature) = request.temperature.or(self.temperature) {
            body.insert("temperature".into(), json!(temperature));
        }
        if !request.tools.is_empty() {
            let rules = schema_rules();
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|tool| {
                    json!({"type": "function", "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": adapt(&tool.input_schema, &rules),
                    }})
                })
                .collect();
            body.insert("tools".into(), Value::Array(tools));
            body.insert("tool_choice".into(), tool_choice(&request.tool_choice));
        }
        Value::Object(body)
    }
}

/// `message` as chat completion messages: one, or one per tool result. A tool message is
/// text only: with `images`, the results' images follow in one user message after the
/// turn's last tool message (the API wants every tool message of a turn right after it),
/// each result's images introduced by the call they belong to. A call's `extra` goes only
/// when `origin`, this API, gave it.
fn push_message(messages: &mut Vec<Value>, message: &Message, images: bool, origin: &str) {
    match message {
        Message::User { content } => messages.push(json!({"role": "user", "content": content})),
        // An Anthropic turn's `blocks` are that API's alone: its text and calls stand for
        // them here.
        Message::Assistant { content, tool_calls, reasoning, .. } => {
            let mut out = Map::new();
            out.insert("role".into(), json!("assistant"));
            // The API wants `null`, not an empty string, beside tool calls.
            let text = if content.is_empty() && !tool_calls.is_empty() {
                Value::Null
            } else {
                json!(content)
            };
            out.insert("content".into(), text);
            // Back to the API that gave it, as `extra` is (DeepSeek's and Kimi's thinking
            // modes refuse a turn of calls without it), and to no other.
            if let Some(reasoning) = reasoning
                && reasoning.origin == origin
            {
                out.insert("reasoning_content".into(), json!(reasoning.text));
            }
            if !tool_calls.is_empty() {
                let calls: Vec<Value> = tool_calls
                    .iter()
                    .map(|call| {
                        let mut out = json!({"id": call.id, "type": "function", "function": {
                            "name": wire_name(&call.name),
                            "arguments": call.arguments_text(),
                        }});
                        // Back as it came: Gemini refuses a call of the history without
                        // the thought signature it gave it. To that API alone: in a
                        // conversation carried on with another model it is another API's
                        // data, which that one may refuse or misread.
                        if let Some(extra) = &call.extra
                            && call.extra_origin.as_deref() == Some(origin)
                        {
                            out["extra_content"] = extra.clone();
                        }
                        out
                    })
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            messages.push(Value::Object(out));
        }
        Message::Tool { results } => {
            let mut parts = Vec::new();
            for result in results {
                let (text, shown) = result.wire_parts(images);
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": result.call_id,
                    "content": text,
                }));
                if shown.is_empty() {
                    continue;
                }
                let which = if shown.len() == 1 { "The image" } else { "The images" };
                let intro = format!("{which} returned by tool call `{}`:", result.call_id);
                parts.push(json!({"type": "text", "text": intro}));
                for (media_type, data) in shown {
                    parts.push(json!({
                        "type": "image_url",
                        "image_url": {"url": format!("data:{media_type};base64,{data}")},
                    }));
                }
            }
            if !parts.is_empty() {
                messages.push(json!({"role": "user", "content": parts}));
            }
        }
    }
}

fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::Required => json!("required"),
        ToolChoice::None => json!("none"),
        ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

/// A chat completion as a [`ModelResponse`].
fn parse(answer: &Value, endpoint: &Endpoint) -> Result<ModelResponse, ModelError> {
    let Some(choice) = answer.get("choices").and_then(Value::as_array).and_then(|c| c.first())
    else {
        // Some proxies answer an error with status 200.
        if let Some(message) = answer.pointer("/error/message").and_then(Value::as_str) {
            return Err(ModelError::Malformed {
                model: endpoint.name.clone(),
                message: endpoint.redact(&format!("no `choices`, but an error: {message}")),
            });
        }
        return Err(endpoint.missing("choices[0]"));
    };
    let message = choice.get("message").ok_or_else(|| endpoint.missing("choices[0].message"))?;
    let mut content = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        // Some servers answer content parts, as requests may send them.
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        Some(_) => return Err(endpoint.missing("choices[0].message.content as a string")),
    };
    let refusal = message.get("refusal").and_then(Value::as_str).filter(|r| !r.is_empty());
    if let Some(refusal) = refusal
        && content.is_empty()
    {
        content = refusal.to_owned();
    }
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
        let calls =
            calls.as_array().ok_or_else(|| endpoint.missing("choices[0].message.tool_calls"))?;
        for (index, call) in calls.iter().enumerate() {
            tool_calls.push(parse_call(call, index, endpoint)?);
        }
        crate::message::distinct_ids(&mut tool_calls);
    }
    let reason = choice.get("finish_reason").and_then(Value::as_str);
    let stop = match reason.map(str::to_ascii_lowercase).as_deref() {
        // Gemini's compatible API passes its own reasons on, in capitals (`STOP`,
        // `MAX_TOKENS`, `SAFETY`).
        Some("stop") => StopReason::EndTurn,
        Some("tool_calls" | "function_call") => StopReason::ToolUse,
        Some("length" | "max_tokens") => StopReason::MaxTokens,
        // Mistral's `model_length`: the answer filled the model's context window. Asked to
        // go on from the cut, as after the output limit, the model would get a longer
        // request that cannot fit either; read as a request over the window, the oldest
        // tool results give way and the turn is asked again (see `ContextWindowReached`).
        Some("model_length") => {
            return Err(ModelError::ContextWindowReached {
                model: endpoint.name.clone(),
                usage: usage(answer),
            });
        }
        Some(
            "content_filter"
            | "safety"
            | "recitation"
            | "blocklist"
            | "prohibited_content"
            | "spii"
            | "image_safety"
            | "image_prohibited_content"
            | "image_recitation"
            | "model_armor",
        ) => StopReason::ContentFilter,
        // Not a finished turn: what came is no answer, and taking it for one ended runs
        // as successes.
        Some(
            failed @ ("error"
            | "abort"
            | "malformed_function_call"
            | "unexpected_tool_call"
            | "other"
            | "finish_reason_unspecified"
            | "image_other"
            | "language"),
        ) => {
            let message = match failed {
                "malformed_function_call" | "unexpected_tool_call" => {
                    "the model wrote a tool call the API could not read; asking again may \
                     succeed, else give fewer or simpler tools"
                }
                "language" => "the model's API does not support the language of the request",
                _ => "the model failed while writing its answer; asking again may succeed",
            };
            return Err(ModelError::Stopped {
                model: endpoint.name.clone(),
                reason: reason.unwrap_or(failed).to_owned(),
                message: message.to_owned(),
                usage: usage(answer),
            });
        }
        Some(_) => StopReason::Other(reason.unwrap_or_default().to_owned()),
        // Some servers leave it out; what the answer holds says it.
        None if !tool_calls.is_empty() => StopReason::ToolUse,
        None if refusal.is_some() => StopReason::ContentFilter,
        None => StopReason::EndTurn,
    };
    Ok(ModelResponse {
        content,
        tool_calls,
        stop,
        usage: usage(answer),
        model: answer.get("model").and_then(Value::as_str).unwrap_or_default().to_owned(),
        reasoning: message
            .get("reasoning_content")
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
            .map(|text| Reasoning { text: text.to_owned(), origin: endpoint.origin() }),
        blocks: None,
    })
}

/// A chat completion's usage figures. Some compatible servers report none, or figures no
/// model gives (negative, fractional, over [`crate::message::MAX_REPORTED_TOKENS`]); it is
/// accounting, not the answer: such figures are marked, and the caller estimates them
/// ([`OpenAiModel::estimated`]). The prompt's tokens include those read from the cache,
/// which OpenAI applies by itself to long prompts.
fn usage(answer: &Value) -> Usage {
    let tokens = |field: &str| reported_tokens(answer, field).unwrap_or(0);
    let (prompt, completion) = ("/usage/prompt_tokens", "/usage/completion_tokens");
    let cached = "/usage/prompt_tokens_details/cached_tokens";
    if !usage_reported(answer, &[prompt, completion], &[cached]) {
        return Usage { estimated: true, ..Usage::default() };
    }
    Usage {
        input_tokens: tokens(prompt),
        output_tokens: tokens(completion),
        cache_read_tokens: tokens(cached),
        cache_write_tokens: 0,
        estimated: false,
    }
}

fn parse_call(
    call: &Value,
    index: usize,
    endpoint: &Endpoint,
) -> Result<ModelToolCall, ModelError> {
    let field = |name: &str| format!("choices[0].message.tool_calls[{index}].{name}");
    let function = call.get("function").ok_or_else(|| endpoint.missing(&field("function")))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| endpoint.missing(&field("function.name")))?;
    // Some servers leave out the id; the result still needs one to name the call, which
    // `distinct_ids` gives it.
    let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
    let mut out = ModelToolCall::new(id, name, Value::Null);
    out.extra = call.get("extra_content").filter(|e| !e.is_null()).cloned();
    out.extra_origin = out.extra.as_ref().map(|_| endpoint.origin());
    match function.get("arguments") {
        Some(Value::String(text)) if text.trim().is_empty() => out.arguments = json!({}),
        Some(Value::String(text)) => match serde_json::from_str(text) {
            Ok(arguments) => out.arguments = unwrapped(arguments),
            Err(_) => out.raw_arguments = Some(text.clone()),
        },
        None | Some(Value::Null) => out.arguments = json!({}),
        // Some servers send the arguments as an object rather than its text.
        Some(arguments) => out.arguments = arguments.clone(),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{Assembler, Chunks, refuses_max_tokens, stream_error, wants_completion_tokens};
    use crate::ModelDelta;
    use crate::http::StreamError;
    use serde_json::{Value, json};
    use std::sync::Mutex;
    use toolmux_core::sse::Event;

    /// A spent quota named by the error's `code` is its kind, though its `type` comes first:
    /// the kind decides that it is never retried.
    #[test]
    fn a_spent_quota_in_the_code_is_the_kind() {
        let error = json!({"type": "requests", "code": "insufficient_quota", "message": "m"});
        match stream_error(&error) {
            StreamError::Api { kind, status, .. } => {
                assert_eq!((kind.as_str(), status), ("insufficient_quota", 429));
            }
            other => panic!("{other:?}"),
        }
        match stream_error(&json!({"type": "server_error", "code": "x", "message": "m"})) {
            StreamError::Api { kind, status, .. } => {
                assert_eq!((kind.as_str(), status), ("server_error", 500));
            }
            other => panic!("{other:?}"),
        }
    }

    /// Folds `chunks` (each a `data:` payload) and returns the answer and the deltas seen.
    fn fold(chunks: &[Value]) -> (Option<Value>, Vec<String>) {
        let seen = Mutex::new(Vec::new());
        let on_delta = |delta: ModelDelta<'_>| seen.lock().unwrap().push(format!("{delta:?}"));
        let mut assembler = Chunks::default();
        for chunk in chunks {
            let event = Event { name: "message".into(), data: chunk.to_string() };
            assert!(!assembler.event(&event, &on_delta).unwrap());
        }
        (assembler.finish(), seen.into_inner().unwrap())
    }

    #[test]
    fn calls_without_an_index_or_with_late_names_or_whole_arguments_are_read() {
        // Some servers send a call whole in one chunk, without `index`, its arguments an
        // object; others name the call after its first arguments.
        let (answer, seen) = fold(&[
            json!({"choices": [{"delta": {"tool_calls": [
                {"id": "a", "function": {"name": "fs__ls", "arguments": {"path": "."}}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [
                {"id": "b", "function": {"arguments": "{\"pat"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [
                {"function": {"name": "fs__grep", "arguments": "tern\": \"x\"}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let answer = answer.expect("a finish reason completes the answer");
        let calls = &answer["choices"][0]["message"]["tool_calls"];
        assert_eq!(calls[0]["id"], "a");
        assert_eq!(calls[0]["function"]["arguments"], r#"{"path":"."}"#);
        assert_eq!(calls[1]["id"], "b");
        assert_eq!(calls[1]["function"]["name"], "fs__grep");
        assert_eq!(calls[1]["function"]["arguments"], r#"{"pattern": "x"}"#);
        assert_eq!(answer["choices"][0]["message"]["content"], Value::Null);
        assert_eq!(
            seen,
            [
                r#"ToolCall { index: 0, id: "a", name: "fs__ls" }"#,
                r#"ToolArguments { index: 0, fragment: "{\"path\":\".\"}" }"#,
                r#"ToolCall { index: 1, id: "b", name: "fs__grep" }"#,
                r#"ToolArguments { index: 1, fragment: "{\"pattern\": \"x\"}" }"#,
            ]
        );
    }

    #[test]
    fn parallel_calls_at_one_index_or_sharing_an_id_stay_apart() {
        // Gemini's compatible API streams each parallel call whole at index 0, with an id of
        // its own; DeepSeek's gives parallel calls one id, at indices of their own.
        let whole = |index: u64, id: &str, city: &str| {
            json!({"choices": [{"delta": {"tool_calls": [{"index": index, "id": id,
                "function": {"name": "weather", "arguments": format!("{{\"city\":\"{city}\"}}")}}]}}]})
        };
        let (answer, seen) = fold(&[
            whole(0, "function-call-1", "Oslo"),
            whole(0, "function-call-2", "Rome"),
            whole(1, "function-call-1", "Lima"),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": " "}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
        ]);
        let answer = answer.expect("a finish reason completes the answer");
        let calls: Vec<(&Value, &Value)> = answer["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (&c["id"], &c["function"]["arguments"]))
            .collect();
        assert_eq!(
            calls,
            [
                (&json!("function-call-1"), &json!("{\"city\":\"Oslo\"}")),
                (&json!("function-call-2"), &json!("{\"city\":\"Rome\"}")),
                (&json!("function-call-1_2"), &json!("{\"city\":\"Lima\"} ")),
            ]
        );
        assert_eq!(seen[4], r#"ToolCall { index: 2, id: "function-call-1_2", name: "weather" }"#);
    }

    #[test]
    fn extras_of_a_call_are_kept_from_its_first_part_or_a_later_one() {
        let google = |text: &str| json!({"google": {"thought_signature": text}});
        let (answer, _) = fold(&[
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "a",
                "extra_content": google("first"), "function": {"name": "ls", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "b",
                "function": {"name": "ls", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1,
                "extra_content": google("second")}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1,
                "extra_content": {"other": 1}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 2, "id": "c",
                "extra_content": null, "function": {"name": "ls", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let answer = answer.expect("a finish reason completes the answer");
        let calls = &answer["choices"][0]["message"]["tool_calls"];
        assert_eq!(calls[0]["extra_content"], google("first"));
        assert_eq!(
            calls[1]["extra_content"],
            json!({"google": {"thought_signature": "second"}, "other": 1})
        );
        assert_eq!(calls[2].get("extra_content"), None, "{calls}");
    }

    #[test]
    fn reasoning_is_kept_apart_from_the_text() {
        // DeepSeek and Kimi stream their thinking before the answer, in `reasoning_content`.
        let (answer, seen) = fold(&[
            json!({"choices": [{"delta": {"role": "assistant", "reasoning_content": "Read "}}]}),
            json!({"choices": [{"delta": {"reasoning_content": "it first."}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "a",
                "function": {"name": "fs__read", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
        let message = &answer.unwrap()["choices"][0]["message"];
        assert_eq!(message["reasoning_content"], "Read it first.");
        assert_eq!(message["content"], Value::Null);
        assert!(seen.iter().all(|delta| !delta.contains("Read")), "{seen:?}");
    }

    #[test]
    fn a_stream_without_a_finish_reason_or_done_is_incomplete() {
        let (answer, seen) = fold(&[json!({"choices": [{"delta": {"content": "Hel"}}]})]);
        assert_eq!(answer, None);
        assert_eq!(seen, [r#"Text("Hel")"#]);
        // A refusal is text too, and the answer's content when there is no other.
        let (answer, _) = fold(&[
            json!({"choices": [{"delta": {"refusal": "I can't"}, "finish_reason": "stop"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
        ]);
        let answer = answer.unwrap();
        assert_eq!(answer["choices"][0]["message"]["refusal"], "I can't");
        assert_eq!(answer["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn openai_itself_gets_max_completion_tokens() {
        let wants = |url: &str| wants_completion_tokens(&url.parse().expect("a URL"));
        assert!(wants("https://api.openai.com/v1/chat/completions"));
        assert!(!wants("http://127.0.0.1:11434/v1/chat/completions"));
        assert!(!wants("https://openrouter.example/api/v1/chat/completions"));
    }

    #[test]
    fn a_refusal_of_max_tokens_is_told_from_other_bad_requests() {
        assert!(refuses_max_tokens(
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use \
             'max_completion_tokens' instead."
        ));
        assert!(!refuses_max_tokens("max_tokens is too large: 999999"));
        assert!(!refuses_max_tokens("Unsupported parameter: 'max_completion_tokens'"));
    }
}
