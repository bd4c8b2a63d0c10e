//! Tool calls written in the answer's text, for models whose API takes no tools (a local
//! model behind an OpenAI-compatible server without a tool parser), in the seeds' format:
//!
//! ```text
//! <tool>
//! {"server_name": "local", "tool_name": "fs__read", "arguments": {"path": "README.md"}}
//! </tool>
//! ```
//!
//! [`TextToolCalls`] wraps any [`Model`]: the tools are described in the system prompt with
//! that format, earlier calls are written back into the assistant's turns as such blocks and
//! their results sent as `<tool_result>` blocks of a user turn, and the blocks of the answer
//! become its tool calls (the text around them its text). `server_name` is the namespace
//! (`fs` with `tool_name` `read` is `fs__read`) or `local`; `<tool_call>` blocks with `name`
//! and `arguments` (the format many open models are trained on) are read too. A block whose
//! JSON does not parse becomes a call whose arguments are marked invalid, so that the agent
//! tells the model what to mend instead of taking the block for an answer.

use crate::{
    DeltaSink, Message, Model, ModelError, ModelRequest, ModelResponse, ModelToolCall, StopReason,
    ToolChoice,
};
use async_trait::async_trait;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A model whose tool calls are written in its text (see the module documentation).
#[derive(Debug)]
pub struct TextToolCalls {
    inner: Arc<dyn Model>,
}

impl TextToolCalls {
    /// `inner`, its tools described in the prompt and its calls read from its text.
    pub fn new(inner: Arc<dyn Model>) -> TextToolCalls {
        TextToolCalls { inner }
    }
}

#[async_trait]
impl Model for TextToolCalls {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn context_window(&self) -> Option<u64> {
        self.inner.context_window()
    }

    fn max_output_tokens(&self) -> Option<u64> {
        self.inner.max_output_tokens()
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
    ) -> Result<ModelResponse, ModelError> {
        let answer = self.inner.complete(&in_text(request), cancel).await?;
        Ok(read_calls(answer, request))
    }

    // The answer is read whole before its calls are known: deltas are the whole answer, as
    // the trait's default hands them over.
    async fn complete_streaming(
        &self,
        request: &ModelRequest,
        cancel: &CancellationToken,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let answer = self.complete(request, cancel).await?;
        crate::replay(&answer, on_delta);
        Ok(answer)
    }
}

/// `request` with its tools in the system prompt and its calls and results in text.
fn in_text(request: &ModelRequest) -> ModelRequest {
    let mut system = request.system.clone().unwrap_or_default();
    if !request.tools.is_empty() && request.tool_choice != ToolChoice::None {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&describe_tools(request));
    }
    let mut names = std::collections::HashMap::new();
    let mut messages: Vec<Message> = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        let message = match message {
            Message::Assistant { content, tool_calls, .. } if !tool_calls.is_empty() => {
                let mut text = content.clone();
                for call in tool_calls {
                    names.insert(call.id.clone(), call.name.clone());
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&block(call));
                }
                Message::assistant(text)
            }
            Message::Tool { results } => {
                let mut text = String::new();
                for result in results {
                    let tool = names.get(&result.call_id).map_or("", String::as_str);
                    let mut content = result.content.clone();
                    for image in &result.images {
                        content.push('\n');
                        content.push_str(&image.placeholder("this model reads text only"));
                    }
                    let _ = write!(
                        text,
                        "<tool_result tool_name=\"{tool}\" error=\"{}\">\n{content}\n</tool_result>\n",
                        result.is_error
                    );
                }
                Message::user(text.trim_end())
            }
            other => other.clone(),
        };
        // Two user turns in a row (results, then a note of the agent's) become one: some
        // APIs want the roles to alternate.
        match (messages.last_mut(), &message) {
            (Some(Message::User { content: last }), Message::User { content }) => {
                last.push_str("\n\n");
                last.push_str(content);
            }
            _ => messages.push(message),
        }
    }
    ModelRequest {
        system: (!system.is_empty()).then_some(system),
        messages,
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        ..request.clone()
    }
}

/// The system prompt's part on tools: the format, what must be called, and each tool.
fn describe_tools(request: &ModelRequest) -> String {
    let mut text = String::from(
        "# Tools\n\nYou can call tools. To call one, write a block like this in your answer, \
         one block per call (several blocks for several calls):\n\n<tool>\n{\"server_name\": \
         \"local\", \"tool_name\": \"TOOL NAME\", \"arguments\": {…}}\n</tool>\n\nThe arguments \
         are a JSON object that follows the tool's schema. After your blocks, stop writing: \
         the results come back in the next message, in <tool_result> blocks. Write no <tool> \
         block when you need no tool.",
    );
    match &request.tool_choice {
        ToolChoice::Required => text.push_str("\n\nNow you must call a tool."),
        ToolChoice::Tool(name) => {
            let _ = write!(text, "\n\nNow you must call `{name}`, and nothing else.");
        }
        ToolChoice::Auto | ToolChoice::None => {}
    }
    text.push_str("\n\n## The tools\n");
    for tool in &request.tools {
        let _ = write!(
            text,
            "\n### {}\n{}\nArguments (JSON Schema): {}\n",
            tool.name,
            tool.description.trim(),
            tool.input_schema
        );
    }
    text
}

/// `call` as a block of the answer.
fn block(call: &ModelToolCall) -> String {
    let arguments = match (&call.raw_arguments, &call.arguments) {
        (Some(raw), _) => Value::String(raw.clone()),
        (None, Value::Null) => json!({}),
        (None, arguments) => arguments.clone(),
    };
    let body = json!({"server_name": "local", "tool_name": call.name, "arguments": arguments});
    format!("<tool>\n{body}\n</tool>")
}

/// The blocks of `answer`'s text as its tool calls; the text around them stays its text.
/// The calls are numbered on from those of `request`'s conversation (`text-1`, `text-2`,
/// …), skipping any id it holds: no two calls of a conversation share an id, and the same
/// conversation gives the same ids in any process, so that replays and tests repeat.
fn read_calls(mut answer: ModelResponse, request: &ModelRequest) -> ModelResponse {
    let mut taken = HashSet::new();
    for message in &request.messages {
        if let Message::Assistant { tool_calls, .. } = message {
            taken.extend(tool_calls.iter().map(|call| call.id.as_str()));
        }
    }
    let mut number = taken.len();
    let mut next_id = || loop {
        number += 1;
        let id = format!("text-{number}");
        if !taken.contains(id.as_str()) {
            return id;
        }
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut rest = answer.content.as_str();
    while let Some((before, tag, after_open)) = next_open(rest) {
        let close = format!("</{tag}>");
        text.push_str(before);
        // An unclosed block (the answer was cut) runs to the end.
        let (body, after) = match after_open.find(&close) {
            Some(end) => (&after_open[..end], &after_open[end + close.len()..]),
            None => (after_open, ""),
        };
        calls.push(call_of(body.trim(), next_id()));
        rest = after;
    }
    text.push_str(rest);
    if !calls.is_empty() {
        answer.content = text.trim().to_owned();
        answer.tool_calls.extend(calls);
        // An answer cut at the output limit stays so: its last block may be unclosed, and
        // the agent tells the model to write less only when it knows.
        if answer.stop != StopReason::MaxTokens {
            answer.stop = StopReason::ToolUse;
        }
    }
    answer
}

/// The next `<tool>` or `<tool_call>` opening tag: the text before it, its name, the text
/// after it.
fn next_open(text: &str) -> Option<(&str, &'static str, &str)> {
    let at = |tag: &str| text.find(&format!("<{tag}>"));
    let (at, tag) = match (at("tool"), at("tool_call")) {
        (Some(a), Some(b)) if b < a => (b, "tool_call"),
        (Some(a), _) => (a, "tool"),
        (None, Some(b)) => (b, "tool_call"),
        (None, None) => return None,
    };
    Some((&text[..at], tag, &text[at + tag.len() + 2..]))
}

/// One block as a call, named `id`.
fn call_of(body: &str, id: String) -> ModelToolCall {
    let parsed: Option<serde_json::Map<String, Value>> = serde_json::from_str(body).ok();
    let Some(fields) = parsed else {
        // What the model meant to call, if its name can be read, to tell it what to mend.
        let name = name_in(body).unwrap_or_else(|| "tool".to_owned());
        return ModelToolCall {
            raw_arguments: Some(body.to_owned()),
            ..ModelToolCall::new(id, name, Value::Null)
        };
    };
    let text = |key: &str| fields.get(key).and_then(Value::as_str).map(str::to_owned);
    let tool = text("tool_name").or_else(|| text("name")).unwrap_or_default();
    let name = match text("server_name") {
        Some(server) if server != "local" && !server.is_empty() && !tool.contains("__") => {
            format!("{server}__{tool}")
        }
        _ => tool,
    };
    let arguments = fields.get("arguments").or_else(|| fields.get("parameters"));
    match arguments {
        None | Some(Value::Null) => ModelToolCall::new(id, name, json!({})),
        Some(Value::String(raw)) => match serde_json::from_str::<Value>(raw) {
            Ok(value @ Value::Object(_)) => ModelToolCall::new(id, name, value),
            _ => ModelToolCall {
                raw_arguments: Some(raw.clone()),
                ..ModelToolCall::new(id, name, Value::Null)
            },
        },
        Some(value) => ModelToolCall::new(id, name, value.clone()),
    }
}

/// The `tool_name` (or `name`) in a block that is not valid JSON.
fn name_in(body: &str) -> Option<String> {
    for key in ["\"tool_name\"", "\"name\""] {
        let Some(at) = body.find(key) else { continue };
        let rest = body[at + key.len()..].trim_start().strip_prefix(':')?.trim_start();
        let rest = rest.strip_prefix('"')?;
        return rest.find('"').map(|end| rest[..end].to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ToolDefinition, ToolResultMessage};

    #[test]
    fn blocks_become_calls_and_the_text_around_them_stays() {
        let answer = ModelResponse::text(
            "Let me look.\n<tool>\n{\"server_name\": \"fs\", \"tool_name\": \"read\", \
             \"arguments\": {\"path\": \"a.md\"}}\n</tool>\n<tool_call>{\"name\": \"fs__grep\", \
             \"arguments\": \"{\\\"pattern\\\": \\\"x\\\"}\"}</tool_call>\n<tool>{\"tool_name\": \
             \"fs__ls\", oops}</tool>",
        );
        let read = read_calls(answer, &ModelRequest::default());
        assert_eq!(read.content, "Let me look.");
        assert_eq!(read.stop, StopReason::ToolUse);
        let calls: Vec<(&str, &Value)> =
            read.tool_calls.iter().map(|c| (c.name.as_str(), &c.arguments)).collect();
        assert_eq!(
            calls,
            [
                ("fs__read", &json!({"path": "a.md"})),
                ("fs__grep", &json!({"pattern": "x"})),
                ("fs__ls", &Value::Null)
            ]
        );
        assert!(read.tool_calls[2].raw_arguments.as_deref().is_some_and(|r| r.contains("oops")));
        let ids: HashSet<&str> = read.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), 3);
    }

    /// An answer cut at the output limit keeps saying so when it holds blocks, the last
    /// one unclosed, where it became a tool use and the agent's hint to write less was
    /// never given.
    #[test]
    fn a_cut_answer_stays_cut() {
        let mut answer = ModelResponse::text(
            "<tool>{\"tool_name\": \"fs__read\", \"arguments\": {\"path\": \"a.md\"}}</tool>\
             <tool>{\"tool_name\": \"fs__write\", \"arguments\": {\"content\": \"lo",
        );
        answer.stop = StopReason::MaxTokens;
        let read = read_calls(answer, &ModelRequest::default());
        assert_eq!(read.stop, StopReason::MaxTokens);
        assert_eq!(read.tool_calls.len(), 2);
    }

    #[test]
    fn an_answer_without_blocks_is_left_alone() {
        let read = read_calls(
            ModelResponse::text("All done: <tools> are great."),
            &ModelRequest::default(),
        );
        assert_eq!(read.content, "All done: <tools> are great.");
        assert!(read.tool_calls.is_empty());
    }

    #[test]
    fn requests_carry_tools_calls_and_results_as_text() {
        let call = ModelToolCall::new("c1", "fs__read", json!({"path": "a.md"}));
        let request = ModelRequest::new(vec![
            Message::user("read a.md"),
            Message::Assistant {
                content: "Reading.".into(),
                tool_calls: vec![call],
                reasoning: None,
                blocks: None,
            },
            Message::Tool { results: vec![ToolResultMessage::new("c1", "# A", false)] },
            Message::user("(note)"),
        ])
        .with_system("Be brief.")
        .with_tools(vec![ToolDefinition::new(
            "fs__read",
            "Reads a file",
            json!({"type": "object"}),
        )])
        .with_tool_choice(ToolChoice::Tool("fs__read".into()));
        let sent = in_text(&request);
        assert!(sent.tools.is_empty());
        assert_eq!(sent.tool_choice, ToolChoice::Auto);
        let system = sent.system.expect("a system prompt");
        assert!(system.starts_with("Be brief.\n\n# Tools"), "{system}");
        assert!(system.contains("### fs__read\nReads a file"), "{system}");
        assert!(system.contains("Now you must call `fs__read`"), "{system}");
        assert_eq!(sent.messages.len(), 3, "{:?}", sent.messages);
        let Message::Assistant { content, tool_calls, .. } = &sent.messages[1] else {
            panic!("{:?}", sent.messages[1])
        };
        assert!(tool_calls.is_empty());
        assert!(
            content.starts_with("Reading.\n<tool>\n")
                && content.contains("\"tool_name\":\"fs__read\""),
            "{content}"
        );
        let Message::User { content } = &sent.messages[2] else { panic!("{:?}", sent.messages[2]) };
        assert!(
            content.starts_with("<tool_result tool_name=\"fs__read\" error=\"false\">\n# A\n</tool_result>\n\n(note)"),
            "{content}"
        );
    }
}
