//! The conversation, the tools offered and the answer, the same for every API.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "camelCase")]
pub enum Message {
    /// What the user (or the agent that delegated the task) said.
    User {
        /// The text.
        content: String,
    },
    /// What the model answered: text, tool calls, or both.
    Assistant {
        /// The text, empty when the model only called tools.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        content: String,
        /// The tools it called, in order.
        #[serde(default, rename = "toolCalls", skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ModelToolCall>,
        /// What the model thought before it answered, when its API gave it to be sent
        /// back ([`Reasoning`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning: Option<Reasoning>,
        /// The answer's content blocks as its API wrote them, when they hold more than the
        /// text and the calls ([`ProviderBlocks`]): sent back as they are to that API alone.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        blocks: Option<ProviderBlocks>,
    },
    /// The results of the previous assistant turn's tool calls, one per call.
    Tool {
        /// The results, in the order of the calls.
        results: Vec<ToolResultMessage>,
    },
}

impl Message {
    /// A user message of text.
    pub fn user(content: impl Into<String>) -> Self {
        Message::User { content: content.into() }
    }

    /// An assistant message of text only.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::Assistant {
            content: content.into(),
            tool_calls: Vec::new(),
            reasoning: None,
            blocks: None,
        }
    }
}

/// The content blocks of an assistant turn as the API that wrote it gave them, kept to be
/// sent back unchanged to that API alone.
///
/// Anthropic's server tools (web search, code execution, run by the API itself) leave
/// blocks in an answer that this vocabulary has no words for (`server_tool_use`,
/// `web_search_tool_result` with its encrypted results, text with citations), and a turn
/// they paused (`stop_reason: pause_turn`) is carried on only by sending its blocks back as
/// they came. The blocks are opaque here: the client that made them re-sends them, with the
/// turn's calls written from [`Message::Assistant`]'s `tool_calls` (matched by id, so that
/// arguments changed since, an approval's say, go as changed). Any other API (a chat
/// completions one, another server) gets the turn's text and calls instead, as for any
/// answer: the blocks are another API's data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderBlocks {
    /// The blocks, as the API wrote them (the ids of calls as they were made distinct,
    /// see [`ModelToolCall::id`]).
    pub blocks: Vec<Value>,
    /// The API that gave them: the URL the client posted to, without its query.
    pub origin: String,
}

/// The reasoning a chat completions API gave beside its answer (`reasoning_content`), kept
/// to go back with the answer to that API alone.
///
/// The thinking modes of DeepSeek (`deepseek-reasoner`) and Kimi (`kimi-k2-thinking`)
/// refuse the next request (HTTP 400, "Missing `reasoning_content` field in the assistant
/// message") when an assistant turn of tool calls comes back without the reasoning that
/// led to it; agents that keep only the text and the calls fail on the first turn after a
/// call. Another API (another server) is never sent it: there it is another model's data,
/// which it may refuse or misread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reasoning {
    /// The reasoning, as the API wrote it.
    pub text: String,
    /// The API that gave it: the URL the client posted to, without its query.
    pub origin: String,
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelToolCall {
    /// The API's id of the call, which its result must name.
    pub id: String,
    /// The tool's name, as offered.
    pub name: String,
    /// The arguments, a JSON object when the model wrote valid JSON, else `null`.
    pub arguments: Value,
    /// The arguments as the model wrote them, when they were not valid JSON, so that the
    /// agent can tell the model what to mend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_arguments: Option<String>,
    /// What the API attached to the call besides its id, name and arguments, kept as it
    /// came to be sent back with the call, unread: a chat completions call's
    /// `extra_content`, where Gemini's compatible API puts its thought signature
    /// (`{"google": {"thought_signature": "…"}}`) and refuses the next request (HTTP 400)
    /// if the call comes back without it. It goes back only to the API that gave it
    /// ([`ModelToolCall::extra_origin`]); Anthropic's messages have no place for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Value>,
    /// The API that gave `extra`: the URL the chat completions client posted to, without
    /// its query. A conversation carried on with another model (another API, another
    /// server) sends the call without `extra`, which means nothing there and is another
    /// API's data; `extra` without an origin is sent nowhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_origin: Option<String>,
}

impl ModelToolCall {
    /// A call of `name` with `arguments`.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        ModelToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
            raw_arguments: None,
            extra: None,
            extra_origin: None,
        }
    }

    /// The arguments as the JSON text an API carries: what the model wrote when it was not
    /// JSON (so that it reads its own mistake beside the error), else the arguments, `{}`
    /// for none.
    pub(crate) fn arguments_text(&self) -> String {
        if let Some(raw) = &self.raw_arguments {
            return raw.clone();
        }
        match &self.arguments {
            Value::Null => "{}".to_owned(),
            arguments => arguments.to_string(),
        }
    }
}

/// `id` if no earlier call of the answer took it (`taken`), else `{id}_2`, `{id}_3`, … the
/// first that none did.
///
/// Some servers give parallel calls one id (DeepSeek's and GLM's chat completions, Kimi's
/// messages): their results would name the same call twice, which the APIs refuse
/// ("tool_use ids must be unique", "Duplicate value for 'tool_call_id'") and which would
/// leave the agent unable to tell the calls apart.
pub(crate) fn distinct_id(id: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(id) {
        return id.to_owned();
    }
    (2u32..)
        .map(|n| format!("{id}_{n}"))
        .find(|candidate| !taken(candidate))
        .expect("an answer has fewer calls than there are numbers")
}

/// The id of call `index` of an answer that gave it none: `call_{token}_{index}`, `token`
/// the answer's [`answer_token`].
///
/// `call_{index}` alone gave every turn of a server that never gives ids the same ones
/// (`call_0` each turn), and Anthropic's API, and some compatible servers, refuse a
/// conversation whose calls share an id: such a conversation could not be carried on by
/// another model nor replayed to another API.
pub(crate) fn generated_id(token: &str, index: usize) -> String {
    format!("call_{token}_{index}")
}

/// Eight base-36 characters, different for each answer: a process-wide count of answers,
/// started at a random point and scrambled, so that ids stay apart within a process
/// (where the count never repeats) and, all but surely, from those of an earlier process
/// whose conversation is carried on.
pub(crate) fn answer_token() -> String {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: OnceLock<AtomicU64> = OnceLock::new();
    let count = COUNT.get_or_init(|| {
        // The clock and the address space's layout are random enough to start from.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let place = &COUNT as *const _ as u64;
        AtomicU64::new(nanos ^ place.rotate_left(32))
    });
    let mut x = count.fetch_add(1, Ordering::Relaxed);
    // splitmix64's finalizer, a bijection: distinct counts give distinct tokens, up to
    // the 36^8 (about 2^41) the token keeps.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let mut token = String::with_capacity(8);
    for _ in 0..8 {
        let digit = u32::try_from(x % 36).expect("a remainder of 36 fits a u32");
        token.push(char::from_digit(digit, 36).expect("a digit below 36"));
        x /= 36;
    }
    token
}

/// `name`, the tool an earlier call of the conversation named, as the APIs take it back:
/// both refuse a request whose history names a tool other than by
/// `^[a-zA-Z0-9_-]{1,64}$`. Every tool offered has such a name; a model may still make one
/// up (GPT models' `multi_tool_use.parallel`, an empty name from a stream that gave none),
/// which the agent answers as an unknown tool, and the next request would fail on it.
/// Such a name goes with `_` for each character outside that set, cut to 64 characters,
/// `_` when empty.
pub(crate) fn wire_name(name: &str) -> std::borrow::Cow<'_, str> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !name.is_empty() && name.len() <= 64 && name.chars().all(allowed) {
        return std::borrow::Cow::Borrowed(name);
    }
    let mended: String = name.chars().take(64).map(|c| if allowed(c) { c } else { '_' }).collect();
    std::borrow::Cow::Owned(if mended.is_empty() { "_".to_owned() } else { mended })
}

/// `arguments` as the object they stand for when they are that object's JSON text (some
/// servers encode a model's arguments twice: `"{\"path\": \"a\"}"`), else as they are.
pub(crate) fn unwrapped(arguments: Value) -> Value {
    if let Value::String(text) = &arguments
        && let Ok(object @ Value::Object(_)) = serde_json::from_str(text)
    {
        return object;
    }
    arguments
}

/// `calls` with ids of their own: an empty id becomes [`generated_id`], a repeated one
/// [`distinct_id`].
pub(crate) fn distinct_ids(calls: &mut [ModelToolCall]) {
    let mut seen = std::collections::HashSet::new();
    let mut token = None;
    for (index, call) in calls.iter_mut().enumerate() {
        if call.id.is_empty() {
            call.id = generated_id(token.get_or_insert_with(answer_token), index);
        }
        if !seen.insert(call.id.clone()) {
            call.id = distinct_id(&call.id, |id| seen.contains(id));
            seen.insert(call.id.clone());
        }
    }
}

/// The result of one tool call, as the model will read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResultMessage {
    /// The id of the call this answers.
    pub call_id: String,
    /// The result's text (or the error's).
    pub content: String,
    /// The images the result carries, after its text. Anthropic reads them in the tool
    /// result itself; chat completions, whose tool messages are text only, in a user
    /// message after the turn's results. A model configured with `images: false` reads a
    /// placeholder instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImagePart>,
    /// Whether the call failed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl ToolResultMessage {
    /// The result `content` of call `call_id`, without images.
    pub fn new(call_id: impl Into<String>, content: impl Into<String>, is_error: bool) -> Self {
        ToolResultMessage {
            call_id: call_id.into(),
            content: content.into(),
            images: Vec::new(),
            is_error,
        }
    }

    /// With `images` after the text.
    pub fn with_images(mut self, images: Vec<ImagePart>) -> Self {
        self.images = images;
        self
    }
}

/// An image of a tool result as it goes on the wire: its media type (one the APIs read)
/// and its base64 data.
pub(crate) type ShownImage<'a> = (&'static str, &'a str);

impl ToolResultMessage {
    /// The text to send and the images to send with it: with `images` false (a model
    /// configured not to read them), or for an image of a type the APIs do not read, a
    /// placeholder saying why is added to the text instead.
    pub(crate) fn wire_parts(&self, images: bool) -> (String, Vec<ShownImage<'_>>) {
        let mut text = self.content.clone();
        let mut shown = Vec::new();
        for image in &self.images {
            let note = match image.media_type() {
                Some(media_type) if images => {
                    shown.push((media_type, image.data.as_str()));
                    continue;
                }
                Some(_) => {
                    image.placeholder("not shown: the model is configured with `images: false`")
                }
                None => {
                    image.placeholder("not shown: models read only jpeg, png, gif and webp images")
                }
            };
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&note);
        }
        (text, shown)
    }
}

/// The image types both APIs read.
pub const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// An image a tool returned, base64-encoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImagePart {
    /// Its MIME type, such as `image/png`.
    pub mime_type: String,
    /// Its bytes in standard base64.
    pub data: String,
}

impl ImagePart {
    /// An image of `mime_type` whose bytes are `data` in base64.
    pub fn new(mime_type: impl Into<String>, data: impl Into<String>) -> Self {
        ImagePart { mime_type: mime_type.into(), data: data.into() }
    }

    /// Its type as the APIs name it (one of [`IMAGE_MEDIA_TYPES`], `image/jpg` read as
    /// `image/jpeg`), or `None` when the APIs do not read images of its type.
    pub fn media_type(&self) -> Option<&'static str> {
        let mime = self.mime_type.split(';').next().unwrap_or_default().trim();
        if mime.eq_ignore_ascii_case("image/jpg") {
            return Some("image/jpeg");
        }
        IMAGE_MEDIA_TYPES.into_iter().find(|known| mime.eq_ignore_ascii_case(known))
    }

    /// Its size in bytes, decoded.
    pub fn decoded_len(&self) -> usize {
        let padding = self.data.bytes().rev().take_while(|&b| b == b'=').count();
        (self.data.len() / 4 * 3).saturating_sub(padding)
    }

    /// What a model that cannot see it reads instead, saying `why`.
    pub fn placeholder(&self, why: &str) -> String {
        format!("[image {}, {} bytes: {why}]", self.mime_type, self.decoded_len())
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolDefinition {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub input_schema: Value,
}

impl ToolDefinition {
    /// A tool named `name`.
    pub fn new(name: impl Into<String>, description: impl Into<String>, schema: Value) -> Self {
        ToolDefinition { name: name.into(), description: description.into(), input_schema: schema }
    }
}

/// Whether and which tools the model must call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must not call tools.
    None,
    /// The model must call this tool.
    Tool(String),
}

/// One request for the model's next step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelRequest {
    /// The system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The conversation so far, oldest first.
    pub messages: Vec<Message>,
    /// The tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDefinition>,
    /// Whether it must call one.
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// The most tokens to generate, overriding the model's configured limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature, overriding the model's configured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// The conversation goes on after this request (an agent's turns): worth marking for
    /// the API's prompt cache, where the model's `promptCache` allows. A one-off request
    /// is not marked: a cache write costs more than a plain read (Anthropic: 1.25×) and
    /// nothing would read it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub continues: bool,
}

impl ModelRequest {
    /// A request with `messages`, no tools and no system prompt.
    pub fn new(messages: Vec<Message>) -> Self {
        ModelRequest { messages, ..ModelRequest::default() }
    }

    /// With the system prompt `system`.
    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }

    /// With `tools` offered.
    pub fn with_tools(mut self, tools: Vec<ToolDefinition>) -> Self {
        self.tools = tools;
        self
    }

    /// Marked as a conversation that goes on (see [`ModelRequest::continues`]).
    pub fn continuing(mut self) -> Self {
        self.continues = true;
        self
    }

    /// With `choice` of tools.
    pub fn with_tool_choice(mut self, choice: ToolChoice) -> Self {
        self.tool_choice = choice;
        self
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopReason {
    /// It finished its turn.
    EndTurn,
    /// It called tools and waits for their results.
    ToolUse,
    /// It ran out of output tokens.
    MaxTokens,
    /// The API's content filter stopped it.
    ContentFilter,
    /// Another reason, as the API named it.
    Other(String),
}

/// Tokens used by one or more requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Tokens read (the prompt, the conversation, the tools), those read from or written
    /// to the API's prompt cache included.
    pub input_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Of `input_tokens`, those read from the API's prompt cache (billed at a fraction).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_read_tokens: u64,
    /// Of `input_tokens`, those written to the API's prompt cache (Anthropic bills them at
    /// a premium; OpenAI does not report them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// The API reported no usage for (some of) the requests counted, and their figures
    /// are this crate's estimate from the lengths of what was sent and received, made on
    /// the high side (a token per three bytes), so that budgets never take a call for
    /// free. An OpenAI-compatible API that refuses `stream_options` (Azure OpenAI's older
    /// `api-version`s) streams its answers without usage; some servers report none at all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// `input` tokens read and `output` generated, no cache reported.
    pub fn new(input: u64, output: u64) -> Usage {
        Usage { input_tokens: input, output_tokens: output, ..Usage::default() }
    }

    /// The tokens read and generated together, at most `u64::MAX`: figures come from the
    /// API, and a sum that wrapped would let a budget take a huge answer for a small one.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

// Sums saturate, as in `Usage::total`: the figures are the API's, not this crate's.
impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self.cache_write_tokens.saturating_add(other.cache_write_tokens);
        self.estimated = self.estimated || other.estimated;
    }
}

/// The most tokens an API's usage figure is believed at: more than a trillion in one answer
/// is no model's, but a server's bug or a hostile one's, and is read as no figure.
pub(crate) const MAX_REPORTED_TOKENS: u64 = 1 << 40;

/// A usage figure of an answer, when it is one: an integer from 0 to
/// [`MAX_REPORTED_TOKENS`]. `None` when absent, negative, fractional, written as a float
/// (`1e300`) or absurdly large, which the clients read as a usage not reported and
/// estimate.
pub(crate) fn reported_tokens(answer: &Value, field: &str) -> Option<u64> {
    answer.pointer(field).and_then(Value::as_u64).filter(|n| *n <= MAX_REPORTED_TOKENS)
}

/// Whether an answer reported its usage in `fields` believably: at least one of `main`
/// is a figure, and every one of `fields` present (and not null) is one
/// ([`reported_tokens`]). A figure of the wrong form makes every other doubtful too.
pub(crate) fn usage_reported(answer: &Value, main: &[&str], fields: &[&str]) -> bool {
    let believed = |field: &&str| match answer.pointer(field) {
        None | Some(Value::Null) => true,
        Some(_) => reported_tokens(answer, field).is_some(),
    };
    main.iter().any(|field| reported_tokens(answer, field).is_some())
        && main.iter().chain(fields).all(believed)
}

/// Usage estimated from the bytes of the request's body (`sent`) and of an answer's text
/// and calls (`received`): a token per three bytes, on the high side for English (about
/// four) and JSON, near the mark for code and other scripts. Budgets count these figures;
/// reading zero, they would take the call for free.
pub(crate) fn estimated_usage(sent: usize, received: usize) -> Usage {
    let tokens = |bytes: usize| (bytes as u64).div_ceil(3);
    Usage { estimated: true, ..Usage::new(tokens(sent), tokens(received)) }
}

/// The model's answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelResponse {
    /// Its text, empty when it only called tools.
    #[serde(default)]
    pub content: String,
    /// The tools it called, in order.
    #[serde(default)]
    pub tool_calls: Vec<ModelToolCall>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Tokens used by this request.
    #[serde(default)]
    pub usage: Usage,
    /// The model that answered, as the API named it.
    #[serde(default)]
    pub model: String,
    /// The reasoning its API gave beside the answer, to be sent back with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
    /// The answer's content blocks as its API gave them, when they hold more than its text
    /// and calls (server tools' blocks, a turn continued after a pause), to be sent back
    /// with it ([`ProviderBlocks`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<ProviderBlocks>,
}

impl ModelResponse {
    /// An answer of text only that ends the turn.
    pub fn text(content: impl Into<String>) -> Self {
        ModelResponse {
            content: content.into(),
            tool_calls: Vec::new(),
            stop: StopReason::EndTurn,
            usage: Usage::default(),
            model: String::new(),
            reasoning: None,
            blocks: None,
        }
    }

    /// An answer that calls `calls`.
    pub fn tool_calls(calls: Vec<ModelToolCall>) -> Self {
        ModelResponse {
            content: String::new(),
            tool_calls: calls,
            stop: StopReason::ToolUse,
            usage: Usage::default(),
            model: String::new(),
            reasoning: None,
            blocks: None,
        }
    }

    /// This answer with its usage estimated ([`estimated_usage`]) from the bytes of the
    /// request's body (`sent`) and of its text and calls (each call's id, name and
    /// arguments), when the API reported none or none believable (`usage.estimated`):
    /// the same estimate for every API, so that budgets never take a request for free.
    /// `model` is the configured model's name, for the log.
    pub(crate) fn with_estimated_usage(mut self, sent: usize, model: &str) -> ModelResponse {
        if !self.usage.estimated {
            return self;
        }
        let calls = self.tool_calls.iter();
        let received = self.content.len()
            + calls
                .map(|call| call.id.len() + call.name.len() + call.arguments_text().len())
                .sum::<usize>();
        self.usage = estimated_usage(sent, received);
        tracing::debug!(
            model,
            input_tokens = self.usage.input_tokens,
            output_tokens = self.usage.output_tokens,
            "the API reported no usage; estimated from the lengths"
        );
        self
    }

    /// The assistant message this answer adds to the conversation.
    pub fn to_message(&self) -> Message {
        Message::Assistant {
            content: self.content.clone(),
            tool_calls: self.tool_calls.clone(),
            reasoning: self.reasoning.clone(),
            blocks: self.blocks.clone(),
        }
    }
}

/// A piece of an answer as the model writes it, for
/// [`Model::complete_streaming`](crate::Model::complete_streaming). Text and each call's arguments arrive as fragments
/// in order; their concatenation is the answer's text and the call's arguments as the
/// model wrote them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelDelta<'a> {
    /// More of the answer's text.
    Text(&'a str),
    /// The model began tool call `index` (0, 1, … in the answer's order).
    ToolCall {
        /// The call's place in the answer.
        index: usize,
        /// The API's id of the call.
        id: &'a str,
        /// The tool's name.
        name: &'a str,
    },
    /// More of tool call `index`'s arguments, as JSON text.
    ToolArguments {
        /// The call's place in the answer.
        index: usize,
        /// The next fragment of the arguments' text.
        fragment: &'a str,
    },
    /// The request is being tried again (the stream broke off): what was received so far
    /// is void, and the answer starts over.
    Restart,
}

/// What receives an answer's [`ModelDelta`]s, on the task that awaits the completion.
pub type DeltaSink<'a> = &'a (dyn Fn(ModelDelta<'_>) + Send + Sync);

#[cfg(test)]
mod tests {
    use super::{ImagePart, ModelToolCall, ToolResultMessage, Usage};
    use serde_json::json;

    #[test]
    fn usage_sums_saturate() {
        let mut usage = Usage::new(u64::MAX, u64::MAX);
        assert_eq!(usage.total(), u64::MAX);
        usage += Usage { cache_read_tokens: 1, ..Usage::new(1, 1) };
        assert_eq!(usage, Usage { cache_read_tokens: 1, ..Usage::new(u64::MAX, u64::MAX) });
    }

    #[test]
    fn results_saved_before_images_load_and_results_without_images_save_as_before() {
        let saved = json!({"callId": "a", "content": "x", "isError": true});
        let result: ToolResultMessage = serde_json::from_value(saved.clone()).unwrap();
        assert_eq!(result, ToolResultMessage::new("a", "x", true));
        assert_eq!(serde_json::to_value(&result).unwrap(), saved);
        let with = result.with_images(vec![ImagePart::new("image/png", "iVBORw0KGgo=")]);
        let value = serde_json::to_value(&with).unwrap();
        assert_eq!(value["images"], json!([{"mimeType": "image/png", "data": "iVBORw0KGgo="}]));
        assert_eq!(serde_json::from_value::<ToolResultMessage>(value).unwrap(), with);
    }

    #[test]
    fn calls_keep_their_extras_when_saved_and_calls_without_save_as_before() {
        let saved = json!({"id": "a", "name": "fs__read", "arguments": {}});
        let call: ModelToolCall = serde_json::from_value(saved.clone()).unwrap();
        assert_eq!(call, ModelToolCall::new("a", "fs__read", json!({})));
        assert_eq!(serde_json::to_value(&call).unwrap(), saved);
        let signed = ModelToolCall {
            extra: Some(json!({"google": {"thought_signature": "c2ln"}})),
            extra_origin: Some("https://gemini.example/v1beta/openai/chat/completions".into()),
            ..call
        };
        let value = serde_json::to_value(&signed).unwrap();
        assert_eq!(value["extra"], json!({"google": {"thought_signature": "c2ln"}}));
        assert_eq!(value["extraOrigin"], "https://gemini.example/v1beta/openai/chat/completions");
        assert_eq!(serde_json::from_value::<ModelToolCall>(value).unwrap(), signed);
    }

    #[test]
    fn media_types_the_apis_read() {
        let media = |mime: &str| ImagePart::new(mime, "").media_type();
        assert_eq!(media("image/PNG"), Some("image/png"));
        assert_eq!(media("image/jpg"), Some("image/jpeg"));
        assert_eq!(media("image/webp; q=1"), Some("image/webp"));
        assert_eq!(media("image/svg+xml"), None);
        assert_eq!(media("image/gif2"), None);
        assert_eq!(ImagePart::new("image/png", "iVBORw0KGgo=").decoded_len(), 8);
    }
}
