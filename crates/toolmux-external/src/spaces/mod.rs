//! Spaces: where agents and people meet. A space is a named, ordered list of messages
//! (what people and agents said, and the calls of visible tools with their results); each
//! agent has an active space, and its own goals, memories and plans.
//!
//! [`Spaces`] keeps them, in this process or in a folder shared by processes
//! ([`Spaces::in_dir`]: every change is written before it returns, under a lock file, so
//! `toolmux tools call` in one process sees what an agent in another did).
//! [`GatewayProvider`](crate::GatewayProvider) offers them to agents as tools.
//!
//! Who is who: a call made by an agent (its operation descends from `agent__NAME`) acts as
//! that agent, whatever run it is in, so its goals and active space outlive a run; any
//! other caller is its run (an MCP session, or the run a request names). With API keys,
//! each key holder has spaces and agents of its own: two tenants of one gateway never see
//! each other's spaces.
//!
//! What they keep is bounded: the messages of a space ([`DEFAULT_MAX_MESSAGES`], the oldest
//! dropped), the spaces ([`DEFAULT_MAX_SPACES`], a new one refused past it) and the agents
//! and runs with state ([`DEFAULT_MAX_ENTITIES`]: the run idle longest, for an hour at
//! least, is forgotten to make room; an agent never is; with none idle, a new one is
//! refused), each error naming its bound.

mod dir;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use toolmux_core::{CallContext, ToolError};

/// How many messages a space keeps unless configured; older ones are dropped (their
/// indexes are not reused).
pub const DEFAULT_MAX_MESSAGES: usize = 10_000;

/// The longest message, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;

/// The longest goal, memory or plan, in bytes.
pub const MAX_ITEM_BYTES: usize = 8 * 1024;

/// How many goals (memories, plans) an agent may hold.
pub const MAX_ITEMS: usize = 200;

/// The longest space name.
pub const MAX_SPACE_NAME: usize = 64;

/// How many spaces are kept at most, by default (all key holders' together): entering or
/// posting to a new one past it is refused.
pub const DEFAULT_MAX_SPACES: usize = 1_000;

/// How many agents and runs have state kept at most, by default (all key holders'
/// together): past it, the state of the run idle longest (an hour at least) is forgotten to
/// make room, and when there is none a new one is refused. An agent's state is never
/// forgotten: it outlives runs on purpose.
pub const DEFAULT_MAX_ENTITIES: usize = 10_000;

/// How long a run's state must have gone unchanged to be forgotten for another's.
const RUN_IDLE_MS: u64 = 60 * 60 * 1000;

/// One message of a space.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    /// Its position in the space, from 0; never reused.
    pub index: u64,
    /// Who wrote it: an agent (`agent:NAME`), a run (`run:ID`) or a person (`person:NAME`).
    pub author: String,
    /// What was said (absent for a tool call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The call of a visible tool, with its result once there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolMessage>,
    /// When it was written, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The space's revision when the message was written or last changed (a tool call's
    /// status): a stream of changes goes on from the last revision it gave.
    #[serde(default)]
    pub rev: u64,
    /// The space's revision when the message was written (0 in messages stored before it
    /// was kept): a stream tells a visible call's start from its end by it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub posted_rev: u64,
}

/// A visible tool's call in a space: a user interface renders it by the tool's name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolMessage {
    /// The tool's full name (`external__confirmAction`).
    pub name: String,
    /// The tool's name as configured (`confirmAction`), the name a user interface maps to
    /// the component that renders it. Empty in messages stored before it was kept.
    #[serde(default)]
    pub tool_name: String,
    /// The arguments it was called with.
    pub arguments: Value,
    /// Whether it waits for someone, or how it ended.
    pub status: ToolStatus,
    /// The result, once there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The pending call that a submitted result answers; for an HTTP tool's call, an
    /// `http:…` id that no pending call has, by which its response finishes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
}

/// Where a visible tool's call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    /// Waiting for a person or a program to answer it.
    RequiresAction,
    /// Answered.
    Complete,
    /// Answered with a failure.
    Error,
    /// Its caller gave up before an answer.
    Cancelled,
}

/// Which of an agent's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    /// What the agent works towards.
    Goal,
    /// What it remembers.
    Memory,
    /// How it means to get there.
    Plan,
}

impl ItemKind {
    /// The plural, as the tools and the stored state name it.
    pub fn plural(self) -> &'static str {
        match self {
            ItemKind::Goal => "goals",
            ItemKind::Memory => "memories",
            ItemKind::Plan => "plans",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            ItemKind::Goal => "g",
            ItemKind::Memory => "m",
            ItemKind::Plan => "p",
        }
    }
}

/// A goal, memory or plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    /// Its id: given by the agent, or `g1`, `m2`, `p3` when it gave none.
    pub id: String,
    /// What it says.
    pub text: String,
    /// Where it stands (`active`, `done`, …), as the agent puts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// When it was last set, in milliseconds since the Unix epoch.
    pub updated_ms: u64,
}

/// A goal, memory or plan to set: with the id of one held, it replaces it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemInput {
    /// The id of the item to replace, or the id a new one gets.
    #[serde(default)]
    pub id: Option<String>,
    /// What it says.
    pub text: String,
    /// Where it stands.
    #[serde(default)]
    pub status: Option<String>,
}

/// One agent's (or run's) state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Entity {
    /// The space it is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_space: Option<String>,
    /// Its goals.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub goals: Vec<Item>,
    /// Its memories.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub memories: Vec<Item>,
    /// Its plans.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plans: Vec<Item>,
    /// The next unread message of each space it has read (by stored space name).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    read: BTreeMap<String, u64>,
    /// The number the next item without an id gets.
    next_id: u64,
    /// When its state last changed, in milliseconds since the Unix epoch (0: before this
    /// was kept).
    #[serde(skip_serializing_if = "is_zero")]
    changed_ms: u64,
}

impl Entity {
    fn items(&self, kind: ItemKind) -> &Vec<Item> {
        match kind {
            ItemKind::Goal => &self.goals,
            ItemKind::Memory => &self.memories,
            ItemKind::Plan => &self.plans,
        }
    }

    fn items_mut(&mut self, kind: ItemKind) -> &mut Vec<Item> {
        match kind {
            ItemKind::Goal => &mut self.goals,
            ItemKind::Memory => &mut self.memories,
            ItemKind::Plan => &mut self.plans,
        }
    }
}

/// One space as stored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Space {
    /// The index of the first message kept.
    first: u64,
    messages: VecDeque<Message>,
    /// Who entered it, ever (stored entity keys).
    members: BTreeSet<String>,
    created_ms: u64,
    /// Counts the changes to its messages: the revision of the latest.
    version: u64,
}

impl Space {
    fn total(&self) -> u64 {
        self.first + self.messages.len() as u64
    }

    fn push(&mut self, mut message: Message, max: usize) -> u64 {
        message.index = self.total();
        self.version += 1;
        message.rev = self.version;
        message.posted_rev = self.version;
        let index = message.index;
        self.messages.push_back(message);
        while self.messages.len() > max.max(1) {
            self.messages.pop_front();
            self.first += 1;
        }
        index
    }

    fn page(&self, from: u64, limit: usize) -> Vec<Message> {
        let skip = from.saturating_sub(self.first);
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        self.messages.iter().skip(skip).take(limit).cloned().collect()
    }
}

/// Everything, or (in a folder) what one change needs of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct State {
    entities: BTreeMap<String, Entity>,
    /// The space of each visible tool call still waiting, by pending call id.
    tool_calls: BTreeMap<String, String>,
    /// The place of each of `tool_calls` in the order they were posted in, so that the
    /// oldest are forgotten first. Kept beside `tool_calls` rather than in it, so that a
    /// `state.json` (or Redis blob) stays readable by the versions before it: they leave
    /// this out when they write, and a call with no place counts as older than any other
    /// (those among themselves by id).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    tool_call_order: BTreeMap<String, u64>,
    /// The place the next waiting call gets.
    #[serde(skip_serializing_if = "is_zero")]
    next_tool_call: u64,
    #[serde(skip)]
    spaces: BTreeMap<String, Space>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl State {
    /// Remembers call `call_id` as waiting in space `stored`, forgetting the oldest past
    /// [`MAX_TOOL_CALLS`].
    fn wait_for_tool(&mut self, call_id: String, stored: String) {
        self.next_tool_call += 1;
        self.tool_call_order.insert(call_id.clone(), self.next_tool_call);
        self.tool_calls.insert(call_id, stored);
        if self.tool_calls.len() <= MAX_TOOL_CALLS {
            return;
        }
        let order = &self.tool_call_order;
        let mut by_age: Vec<(u64, &String)> =
            self.tool_calls.keys().map(|id| (order.get(id).copied().unwrap_or(0), id)).collect();
        by_age.sort_unstable();
        let excess = self.tool_calls.len() - MAX_TOOL_CALLS;
        let oldest: Vec<String> =
            by_age.into_iter().take(excess).map(|(_, id)| id.clone()).collect();
        for id in oldest {
            self.tool_calls.remove(&id);
        }
        let calls = &self.tool_calls;
        self.tool_call_order.retain(|id, _| calls.contains_key(id));
    }

    /// Forgets call `call_id` as waiting; gives the space it waited in.
    fn answered_tool(&mut self, call_id: &str) -> Option<String> {
        self.tool_call_order.remove(call_id);
        self.tool_calls.remove(call_id)
    }
}

/// The most tool calls remembered as waiting; the oldest are forgotten past it (their
/// message then keeps its `requires_action`).
const MAX_TOOL_CALLS: usize = 10_000;

/// Who makes a call, as the spaces see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    /// The API key holder, when the run is one's (`key:NAME/…`).
    pub holder: Option<String>,
    /// `agent:NAME` for an agent, `run:ID` for any other caller.
    pub entity: String,
}

impl Who {
    /// The caller of `ctx`: the agent whose operation the call descends from, or the run.
    pub fn of(ctx: &CallContext) -> Who {
        let holder = crate::holder(ctx.run_id()).map(std::borrow::Cow::into_owned);
        let agent = ctx.op().and_then(|op| {
            std::iter::once(op.as_ref())
                .chain(op.ancestors())
                .find_map(|op| op.tool().strip_prefix("agent__"))
                .map(str::to_owned)
        });
        let entity = match agent {
            Some(name) => format!("agent:{name}"),
            None => format!("run:{}", ctx.run_id()),
        };
        Who { holder, entity }
    }

    /// A person posting through the HTTP API (`person:NAME`), in `holder`'s spaces.
    pub fn person(holder: Option<&str>, name: &str) -> Who {
        Who { holder: holder.map(str::to_owned), entity: format!("person:{name}") }
    }

    /// The entity's key in the store.
    fn key(&self) -> String {
        scoped(self.holder.as_deref(), &self.entity)
    }

    /// The stored name of the caller's space `name`.
    fn space(&self, name: &str) -> String {
        scoped(self.holder.as_deref(), name)
    }

    /// The name a caller knows a stored space by.
    fn shown<'a>(&self, stored: &'a str) -> &'a str {
        match &self.holder {
            Some(holder) => stored
                .strip_prefix(holder.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .unwrap_or(stored),
            None => stored,
        }
    }
}

fn scoped(holder: Option<&str>, name: &str) -> String {
    match holder {
        Some(holder) => format!("{holder}/{name}"),
        None => name.to_owned(),
    }
}

/// A space name is 1–64 letters, digits, `.`, `_` or `-`, starting with a letter or digit.
pub fn check_space_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_SPACE_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not a space name: use 1 to {MAX_SPACE_NAME} letters, digits, `.`, `_` \
             or `-`, starting with a letter or digit"
        ))
    }
}

/// What entering a space gives.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entered {
    /// The space.
    pub space: String,
    /// Its latest messages, oldest first.
    pub messages: Vec<Message>,
    /// How many messages it has had.
    pub total: u64,
    /// Whether it was made by entering it.
    pub created: bool,
}

/// A page of a space's messages.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Page {
    /// The space.
    pub space: String,
    /// The messages, oldest first.
    pub messages: Vec<Message>,
    /// The offset of the message after the last one given (to read on from).
    pub next: u64,
    /// How many messages the space has had.
    pub total: u64,
    /// The index of the oldest message still kept.
    pub first: u64,
}

/// A space in a listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpaceSummary {
    /// Its name.
    pub space: String,
    /// How many messages it has had.
    pub total: u64,
    /// Who entered it.
    pub members: Vec<String>,
}

/// What an agent carries from run to run, and where it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Context {
    /// The space it is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_space: Option<String>,
    /// Messages of that space it has not read, oldest first (at most the history limit).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<Message>,
    /// How many unread messages there are in all.
    pub unread_count: u64,
    /// The index of the first of them (older than those in `unread` when there are more
    /// than the history gives): `read_messages` with this `offset` reads them.
    pub unread_from: u64,
    /// Its goals.
    pub goals: Vec<Item>,
    /// Its memories.
    pub memories: Vec<Item>,
    /// Its plans.
    pub plans: Vec<Item>,
}

/// The spaces and the agents' state, in this process or in a folder.
#[derive(Clone)]
pub struct Spaces {
    backend: Arc<Backend>,
    /// Bumped after every change to a space made through this store (any clone).
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    max_messages: usize,
    max_spaces: usize,
    max_entities: usize,
    redact: Option<Redact>,
}

/// Replaces secrets in text before it is kept.
type Redact = Arc<dyn Fn(&str) -> String + Send + Sync>;

impl std::fmt::Debug for Spaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spaces")
            .field("backend", &self.backend)
            .field("max_messages", &self.max_messages)
            .field("max_spaces", &self.max_spaces)
            .field("max_entities", &self.max_entities)
            .field("redacts", &self.redact.is_some())
            .finish()
    }
}

#[derive(Debug)]
enum Backend {
    Memory(Mutex<State>),
    Dir(dir::DirStore),
    Storage(Arc<dyn SpaceStorage>),
}

/// Where spaces live outside this process (a Redis server shared by replicas): named
/// blobs, replaced whole, under one lock. `state` holds the agents' state, `space:NAME`
/// each space.
///
/// A change takes the lock, reads with its token, and commits all it writes at once with
/// that token: a storage whose lock can be lost (a lease that ended while the change
/// stalled) refuses the reads and the commit of a change that no longer holds it, and a
/// commit writes every blob or none, so that no change is ever left half written.
#[async_trait::async_trait]
pub trait SpaceStorage: Send + Sync + std::fmt::Debug {
    /// Takes the lock of every change, waiting a bounded time for another holder; the
    /// token given back fences the change's reads and commit, and releases the lock.
    async fn lock(&self) -> Result<String, ToolError>;
    /// Releases the lock taken with `token` (if it is still this holder's).
    async fn unlock(&self, token: &str);
    /// The blob `key`, if there is one, for the change holding the lock with `token`;
    /// fails when the lock is no longer that change's.
    async fn read(&self, token: &str, key: &str) -> Result<Option<Vec<u8>>, ToolError>;
    /// Replaces the blobs `writes` (key and value) together, all of them or none, if the
    /// lock is still `token`'s; fails, writing nothing, when it is not.
    async fn commit(&self, token: &str, writes: &[(String, Vec<u8>)]) -> Result<(), ToolError>;
    /// The stored names of the spaces.
    async fn space_names(&self) -> Result<Vec<String>, ToolError>;

    /// A receiver that changes when another process changed a space, if the storage tells
    /// (waits then need not look again every half second to notice).
    async fn change_notices(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// Set when dropped: tells a change waiting for the folder's lock on the blocking pool that
/// its caller is gone.
#[derive(Default)]
struct Abandoned(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// The blob of the agents' state in a [`SpaceStorage`].
const STATE_KEY: &str = "state";

fn space_key(name: &str) -> String {
    format!("space:{name}")
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, ToolError> {
    serde_json::from_slice(bytes).map_err(|e| ToolError::Other {
        provider: "gateway".into(),
        message: format!(
            "the stored spaces' `{key}` is not something toolmux can read ({e}); delete it to \
             start it anew"
        ),
        source: None,
    })
}

fn encode(value: &impl Serialize) -> Result<Vec<u8>, ToolError> {
    serde_json::to_vec(value).map_err(|e| ToolError::Other {
        provider: "gateway".into(),
        message: format!("cannot encode the spaces: {e}"),
        source: None,
    })
}

/// A change being made: the state it needs, loaded as it asks.
struct Txn<'a> {
    state: &'a mut State,
    dir: Option<&'a dir::DirStore>,
    dirty_state: bool,
    dirty_spaces: BTreeSet<String>,
    limits: Limits,
    /// How many spaces a shared storage holds, counted before a change that may make one
    /// (a folder counts its files, and memory holds them all in `state`).
    stored_spaces: Option<usize>,
}

/// The bounds on what spaces keep in all.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_spaces: usize,
    max_entities: usize,
}

/// Whether entity `key` (as stored, after its key holder) is a run's, not an agent's.
fn is_run(key: &str) -> bool {
    key.starts_with("run:") || key.contains("/run:")
}

impl<'a> Txn<'a> {
    fn new(state: &'a mut State, dir: Option<&'a dir::DirStore>, limits: Limits) -> Txn<'a> {
        Txn {
            state,
            dir,
            dirty_state: false,
            dirty_spaces: BTreeSet::new(),
            limits,
            stored_spaces: None,
        }
    }

    /// Entity `key`'s state, made when it has none (refused past the bound on entities,
    /// saying so as `tool`'s error): for a change to it.
    fn entity(&mut self, key: &str, tool: &str) -> Result<&mut Entity, ToolError> {
        if !self.state.entities.contains_key(key) {
            self.make_room_for_entity(tool)?;
        }
        let entity = self.state.entities.entry(key.to_owned()).or_default();
        entity.changed_ms = now_ms();
        Ok(entity)
    }

    /// Forgets the state of the runs idle longest until there is room for one more entity;
    /// refuses when none has been idle for long enough.
    fn make_room_for_entity(&mut self, tool: &str) -> Result<(), ToolError> {
        let max = self.limits.max_entities;
        let entities = &self.state.entities;
        if entities.len() < max {
            return Ok(());
        }
        let idle_since = now_ms().saturating_sub(RUN_IDLE_MS);
        let mut idle: Vec<(u64, &String)> = entities
            .iter()
            .filter(|(key, e)| is_run(key) && e.changed_ms <= idle_since)
            .map(|(key, e)| (e.changed_ms, key))
            .collect();
        let excess = entities.len() + 1 - max;
        if idle.len() < excess {
            return Err(invalid(
                tool,
                &format!(
                    "the spaces keep the state of {} agents and runs, the most they keep ({max}: \
                     `spaces.maxAgents` in the configuration, `Spaces::with_max_entities` in \
                     code), and no run among them has been idle for an \
                     hour, which would be forgotten to make room: try again later, or remove \
                     agents no longer used from the spaces' `state.json`",
                    entities.len()
                ),
            ));
        }
        idle.sort_unstable();
        let forgotten: Vec<String> =
            idle.into_iter().take(excess).map(|(_, k)| k.clone()).collect();
        for key in forgotten {
            self.state.entities.remove(&key);
        }
        self.changed();
        Ok(())
    }

    /// Makes space `stored` (which does not exist), refused past the bound on spaces
    /// (saying so as `tool`'s error).
    fn make_space(&mut self, stored: &str, tool: &str) -> Result<&mut Space, ToolError> {
        let max = self.limits.max_spaces;
        let count = match (self.stored_spaces, self.dir) {
            (Some(count), _) => count,
            (None, Some(dir)) => dir.space_names()?.len(),
            (None, None) => self.state.spaces.len(),
        };
        if count >= max {
            return Err(invalid(
                tool,
                &format!(
                    "there are {count} spaces already, the most kept ({max}: `spaces.maxSpaces` in \
                     the configuration, `Spaces::with_max_spaces` in code): enter one of them \
                     (`gateway__spaces` lists them), or remove spaces no longer used \
                     (`spaces/NAME.json` in the spaces' folder)"
                ),
            ));
        }
        if let Some(counted) = self.stored_spaces.as_mut() {
            *counted += 1;
        }
        self.dirty_spaces.insert(stored.to_owned());
        let new = Space { created_ms: now_ms(), ..Space::default() };
        Ok(self.state.spaces.entry(stored.to_owned()).or_insert(new))
    }

    /// Entity `key`'s active space. Only looked at: the state of a caller that never
    /// entered a space is not made (in memory it would be kept, one for every run).
    fn active_space(&self, key: &str) -> Option<String> {
        self.state.entities.get(key).and_then(|e| e.active_space.clone())
    }

    fn changed(&mut self) {
        self.dirty_state = true;
    }

    /// The space stored as `name`, when it exists.
    fn space(&mut self, name: &str) -> Result<Option<&mut Space>, ToolError> {
        if !self.state.spaces.contains_key(name)
            && let Some(dir) = self.dir
            && let Some(space) = dir.load_space(name)?
        {
            self.state.spaces.insert(name.to_owned(), space);
        }
        Ok(self.state.spaces.get_mut(name))
    }

    fn touch(&mut self, name: &str) {
        self.dirty_spaces.insert(name.to_owned());
    }
}

impl Spaces {
    /// Spaces kept in this process.
    pub fn in_memory() -> Spaces {
        Spaces::with(Backend::Memory(Mutex::default()))
    }

    /// Spaces kept in folder `path` (made if missing), shared with every process using it.
    pub fn in_dir(path: impl Into<PathBuf>) -> Result<Spaces, String> {
        Ok(Spaces::with(Backend::Dir(dir::DirStore::open(path.into())?)))
    }

    /// Spaces kept in `storage`, shared with every process using it.
    pub fn in_storage(storage: Arc<dyn SpaceStorage>) -> Spaces {
        Spaces::with(Backend::Storage(storage))
    }

    fn with(backend: Backend) -> Spaces {
        Spaces {
            backend: Arc::new(backend),
            changed: Arc::new(tokio::sync::watch::Sender::new(0)),
            max_messages: DEFAULT_MAX_MESSAGES,
            max_spaces: DEFAULT_MAX_SPACES,
            max_entities: DEFAULT_MAX_ENTITIES,
            redact: None,
        }
    }

    /// Keeps at most `max` messages per space (the oldest are dropped).
    #[must_use]
    pub fn with_max_messages(mut self, max: usize) -> Spaces {
        self.max_messages = max.max(1);
        self
    }

    /// Keeps at most `max` spaces (at least 1; default [`DEFAULT_MAX_SPACES`]).
    #[must_use]
    pub fn with_max_spaces(mut self, max: usize) -> Spaces {
        self.max_spaces = max.max(1);
        self
    }

    /// Keeps the state of at most `max` agents and runs (at least 1; default
    /// [`DEFAULT_MAX_ENTITIES`]).
    #[must_use]
    pub fn with_max_entities(mut self, max: usize) -> Spaces {
        self.max_entities = max.max(1);
        self
    }

    /// Passes every text kept (messages, tool calls' arguments and results) through
    /// `redact` first: secrets from the configuration's environment never reach a space.
    #[must_use]
    pub fn with_redaction(
        mut self,
        redact: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Spaces {
        self.redact = Some(Arc::new(redact));
        self
    }

    fn clean_text(&self, text: &str) -> String {
        match &self.redact {
            Some(redact) => redact(text),
            None => text.to_owned(),
        }
    }

    fn clean(&self, value: Value) -> Value {
        let Some(redact) = &self.redact else { return value };
        match value {
            Value::String(text) => Value::String(redact(&text)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.clean(v)).collect()),
            Value::Object(fields) => Value::Object(
                fields.into_iter().map(|(k, v)| (redact(&k), self.clean(v))).collect(),
            ),
            other => other,
        }
    }

    /// A change that reads no space.
    async fn transact<R: Send + 'static>(
        &self,
        change: impl FnOnce(&mut Txn<'_>) -> Result<R, ToolError> + Send + 'static,
    ) -> Result<R, ToolError> {
        self.transact_for(|_| Vec::new(), change).await
    }

    /// A change that reads the spaces `needs` names given the agents' state (loaded up
    /// front from a [`SpaceStorage`]; a folder loads them as the change asks). In a folder
    /// the whole change (the lock, the reads, the writes flushed to the disk) runs on the
    /// blocking pool, never on the event loop that serves calls.
    async fn transact_for<R: Send + 'static>(
        &self,
        needs: impl FnOnce(&State) -> Vec<String> + Send + 'static,
        change: impl FnOnce(&mut Txn<'_>) -> Result<R, ToolError> + Send + 'static,
    ) -> Result<R, ToolError> {
        self.transact_with(needs, false, change).await
    }

    /// [`Spaces::transact_for`] for a change that may make a space: a shared storage
    /// counts its spaces first, for the bound.
    async fn transact_making<R: Send + 'static>(
        &self,
        needs: impl FnOnce(&State) -> Vec<String> + Send + 'static,
        change: impl FnOnce(&mut Txn<'_>) -> Result<R, ToolError> + Send + 'static,
    ) -> Result<R, ToolError> {
        self.transact_with(needs, true, change).await
    }

    fn limits(&self) -> Limits {
        Limits { max_spaces: self.max_spaces, max_entities: self.max_entities }
    }

    async fn transact_with<R: Send + 'static>(
        &self,
        needs: impl FnOnce(&State) -> Vec<String> + Send + 'static,
        counts_spaces: bool,
        change: impl FnOnce(&mut Txn<'_>) -> Result<R, ToolError> + Send + 'static,
    ) -> Result<R, ToolError> {
        let limits = self.limits();
        match self.backend.as_ref() {
            Backend::Storage(storage) => {
                // In a task of its own: a caller that stops waiting (cancelled, timed out)
                // neither leaves the lock taken until its lease ends nor a change half
                // written; a change that has not taken the lock by then is not made.
                let (spaces, storage) = (self.clone(), storage.clone());
                let abandoned = Abandoned::default();
                let gone = abandoned.0.clone();
                let changed = tokio::spawn(async move {
                    let token = storage.lock().await?;
                    let result = if gone.load(std::sync::atomic::Ordering::Acquire) {
                        Err(ToolError::Cancelled { tool: "gateway".into() })
                    } else {
                        let storage = (storage.as_ref(), token.as_str());
                        spaces.transact_stored(storage, needs, counts_spaces, change).await
                    };
                    storage.unlock(&token).await;
                    result
                })
                .await
                .unwrap_or_else(|e| Err(ToolError::other("gateway", e)));
                drop(abandoned);
                changed
            }
            Backend::Memory(state) => {
                let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                let mut txn = Txn::new(&mut state, None, limits);
                let result = change(&mut txn)?;
                if !txn.dirty_spaces.is_empty() {
                    self.changed.send_modify(|v| *v = v.wrapping_add(1));
                }
                Ok(result)
            }
            Backend::Dir(dir) => {
                let dir = dir.clone();
                // Set when the caller stops waiting (cancelled, timed out): a change that has
                // not taken the lock by then is not made, as when the wait was in this task.
                let abandoned = Abandoned::default();
                let gone = abandoned.0.clone();
                let changed = tokio::task::spawn_blocking(move || {
                    let dir = &dir;
                    let lock = dir.lock_blocking()?;
                    if gone.load(std::sync::atomic::Ordering::Acquire) {
                        return Err(ToolError::Cancelled { tool: "gateway".into() });
                    }
                    let mut state = dir.load_state()?;
                    let mut txn = Txn::new(&mut state, Some(dir), limits);
                    let result = change(&mut txn)?;
                    let (dirty_state, dirty_spaces) = (txn.dirty_state, txn.dirty_spaces);
                    let spaces: Vec<(&str, &Space)> = dirty_spaces
                        .iter()
                        .filter_map(|name| state.spaces.get(name).map(|s| (name.as_str(), s)))
                        .collect();
                    dir.save(&lock, dirty_state.then_some(&state), &spaces)?;
                    Ok((result, !dirty_spaces.is_empty()))
                })
                .await
                .unwrap_or_else(|e| Err(ToolError::other("gateway", e)));
                drop(abandoned);
                let (result, spaces_changed) = changed?;
                if spaces_changed {
                    self.changed.send_modify(|v| *v = v.wrapping_add(1));
                }
                Ok(result)
            }
        }
    }

    /// A change of a [`SpaceStorage`] whose lock `token` holds: its reads, its body, and its
    /// writes committed at once.
    async fn transact_stored<R>(
        &self,
        (storage, token): (&dyn SpaceStorage, &str),
        needs: impl FnOnce(&State) -> Vec<String>,
        counts_spaces: bool,
        change: impl FnOnce(&mut Txn<'_>) -> Result<R, ToolError>,
    ) -> Result<R, ToolError> {
        let mut state: State = match storage.read(token, STATE_KEY).await? {
            Some(bytes) => decode(STATE_KEY, &bytes)?,
            None => State::default(),
        };
        for name in needs(&state) {
            let key = space_key(&name);
            if let Some(bytes) = storage.read(token, &key).await? {
                state.spaces.insert(name, decode(&key, &bytes)?);
            }
        }
        let mut txn = Txn::new(&mut state, None, self.limits());
        if counts_spaces {
            txn.stored_spaces = Some(storage.space_names().await?.len());
        }
        let result = change(&mut txn)?;
        let (dirty_state, dirty_spaces) = (txn.dirty_state, txn.dirty_spaces);
        let mut writes = Vec::with_capacity(dirty_spaces.len() + 1);
        for name in &dirty_spaces {
            if let Some(space) = state.spaces.get(name) {
                writes.push((space_key(name), encode(space)?));
            }
        }
        if dirty_state {
            writes.push((STATE_KEY.to_owned(), encode(&state)?));
        }
        if !writes.is_empty() {
            storage.commit(token, &writes).await?;
        }
        if !dirty_spaces.is_empty() {
            self.changed.send_modify(|v| *v = v.wrapping_add(1));
        }
        Ok(result)
    }

    /// Makes `space` the caller's active space (creating it when new) and gives its latest
    /// `history` messages.
    pub async fn enter(
        &self,
        who: &Who,
        space: &str,
        history: usize,
    ) -> Result<Entered, ToolError> {
        check_space_name(space).map_err(|e| invalid("gateway__enter_space", &e))?;
        let stored = who.space(space);
        let key = who.key();
        let needed = stored.clone();
        let space = space.to_owned();
        const TOOL: &str = "gateway__enter_space";
        self.transact_making(
            move |_| vec![needed],
            move |txn| {
                // Room for the caller's state first: a refusal then leaves nothing made.
                if !txn.state.entities.contains_key(&key) {
                    txn.make_room_for_entity(TOOL)?;
                }
                let created = txn.space(&stored)?.is_none();
                if created {
                    txn.make_space(&stored, TOOL)?;
                }
                let (messages, total) = match txn.state.spaces.get_mut(&stored) {
                    Some(s) => {
                        if s.members.insert(key.clone()) || created {
                            txn.dirty_spaces.insert(stored.clone());
                        }
                        let total = s.total();
                        (s.page(total.saturating_sub(history as u64), history), total)
                    }
                    None => (Vec::new(), 0),
                };
                let entity = txn.entity(&key, TOOL)?;
                entity.active_space = Some(stored.clone());
                entity.read.insert(stored.clone(), total);
                txn.changed();
                Ok(Entered { space, messages, total, created })
            },
        )
        .await
    }

    /// Leaves the caller's active space; gives the one it was in.
    pub async fn leave(&self, who: &Who) -> Result<Option<String>, ToolError> {
        let key = who.key();
        let left = self
            .transact(move |txn| {
                let left = txn.state.entities.get_mut(&key).and_then(|e| e.active_space.take());
                if left.is_some() {
                    txn.changed();
                }
                Ok(left)
            })
            .await?;
        Ok(left.map(|stored| who.shown(&stored).to_owned()))
    }

    /// The caller's active space.
    pub async fn active(&self, who: &Who) -> Result<Option<String>, ToolError> {
        let key = who.key();
        let active = self
            .transact(move |txn| {
                Ok(txn.state.entities.get(&key).and_then(|e| e.active_space.clone()))
            })
            .await?;
        Ok(active.map(|stored| who.shown(&stored).to_owned()))
    }

    /// Posts `text` as the caller to its active space (`space` given: to that space, which
    /// must exist unless `create`). Gives the message.
    pub async fn say(
        &self,
        who: &Who,
        space: Option<&str>,
        text: &str,
        tool: &str,
        create: bool,
    ) -> Result<Message, ToolError> {
        if text.trim().is_empty() {
            return Err(invalid(tool, "`text` is empty: say something"));
        }
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(invalid(
                tool,
                &format!(
                    "the message is {} bytes, over the {MAX_MESSAGE_BYTES}-byte limit: split it",
                    text.len()
                ),
            ));
        }
        if let Some(space) = space {
            check_space_name(space).map_err(|e| invalid(tool, &e))?;
        }
        let key = who.key();
        let named = space.map(|s| who.space(s));
        let max = self.max_messages;
        let author = who.entity.clone();
        let tool = tool.to_owned();
        let text = self.clean_text(text);
        let space_name = space.map(str::to_owned);
        let (needed, of) = (named.clone(), key.clone());
        let needs = move |state: &State| needed.map_or_else(|| active_of(state, &of), |n| vec![n]);
        let creates = create && space_name.is_some();
        self.transact_with(needs, creates, move |txn| {
            let stored = match named {
                Some(stored) => stored,
                None => txn.active_space(&key).ok_or_else(|| {
                    invalid(&tool, "you are not in a space: call `gateway__enter_space` first")
                })?,
            };
            if txn.space(&stored)?.is_none() && creates {
                txn.make_space(&stored, &tool)?;
            }
            let Some(space) = txn.state.spaces.get_mut(&stored) else {
                return Err(no_space(&tool, space_name.as_deref()));
            };
            space.members.insert(key.clone());
            let message = Message {
                index: 0,
                author,
                text: Some(text),
                tool: None,
                at_ms: now_ms(),
                rev: 0,
                posted_rev: 0,
            };
            let index = space.push(message, max);
            let message = space.messages.back().cloned();
            txn.touch(&stored);
            // What one writes, one has read.
            if let Some(entity) = txn.state.entities.get_mut(&key)
                && entity.read.get(&stored).is_some_and(|r| *r == index)
            {
                entity.read.insert(stored.clone(), index + 1);
                txn.changed();
            }
            message.ok_or_else(|| invalid(&tool, "the message was not kept"))
        })
        .await
    }

    /// Messages of `space` (the caller's active one when `None`): from `offset`, or the
    /// caller's unread ones when `None`; at most `limit`. The caller has then read them.
    pub async fn read(
        &self,
        who: &Who,
        space: Option<&str>,
        offset: Option<u64>,
        limit: usize,
    ) -> Result<Page, ToolError> {
        const TOOL: &str = "gateway__read_messages";
        if let Some(space) = space {
            check_space_name(space).map_err(|e| invalid(TOOL, &e))?;
        }
        let key = who.key();
        let named = space.map(|s| who.space(s));
        let space_name = space.map(str::to_owned);
        let (needed, of) = (named.clone(), key.clone());
        let needs = move |state: &State| needed.map_or_else(|| active_of(state, &of), |n| vec![n]);
        let page = self
            .transact_for(needs, move |txn| {
                let stored = match named {
                    Some(stored) => stored,
                    None => txn.active_space(&key).ok_or_else(|| {
                        invalid(
                            TOOL,
                            "you are not in a space: name one (`space`) or call \
                             `gateway__enter_space` first",
                        )
                    })?,
                };
                let unread_from = txn.state.entities.get(&key).and_then(|e| e.read.get(&stored));
                let unread_from = unread_from.copied().unwrap_or(0);
                let Some(space) = txn.space(&stored)? else {
                    return Err(no_space(TOOL, space_name.as_deref()));
                };
                // An offset past the last message reads nothing and goes on from the end:
                // taken as it is, it would mark messages not yet written as read.
                let from = offset.unwrap_or(unread_from).max(space.first).min(space.total());
                let messages = space.page(from, limit);
                let next = from + messages.len() as u64;
                let (total, first) = (space.total(), space.first);
                if next > unread_from {
                    txn.entity(&key, TOOL)?.read.insert(stored.clone(), next);
                    txn.changed();
                }
                Ok(Page { space: stored, messages, next, total, first })
            })
            .await?;
        Ok(Page { space: who.shown(&page.space).to_owned(), ..page })
    }

    /// The caller's spaces (its key holder's), with their sizes and members.
    pub async fn list(&self, who: &Who) -> Result<Vec<SpaceSummary>, ToolError> {
        let names = match self.backend.as_ref() {
            Backend::Memory(state) => {
                state.lock().unwrap_or_else(|e| e.into_inner()).spaces.keys().cloned().collect()
            }
            Backend::Dir(dir) => {
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || dir.space_names())
                    .await
                    .unwrap_or_else(|e| Err(ToolError::other("gateway", e)))?
            }
            Backend::Storage(storage) => storage.space_names().await?,
        };
        let mine: Vec<String> = names
            .into_iter()
            .filter(|stored| match &who.holder {
                Some(holder) => {
                    stored.strip_prefix(holder.as_str()).is_some_and(|r| r.starts_with('/'))
                }
                None => !stored.contains('/'),
            })
            .collect();
        let (needed, who) = (mine.clone(), who.clone());
        let summaries = self
            .transact_for(
                move |_| needed,
                move |txn| {
                    let mut out = Vec::new();
                    for stored in &mine {
                        if let Some(space) = txn.space(stored)? {
                            let members = space.members.iter().map(|m| who.shown(m).to_owned());
                            out.push(SpaceSummary {
                                space: who.shown(stored).to_owned(),
                                total: space.total(),
                                members: members.collect(),
                            });
                        }
                    }
                    Ok(out)
                },
            )
            .await?;
        Ok(summaries)
    }

    /// Posts a visible tool's call to the caller's active space, or says that it has none.
    /// `call_id` names the pending call whose submitted result completes it.
    pub async fn post_tool(
        &self,
        who: &Who,
        message: ToolMessage,
    ) -> Result<Result<u64, NotInSpace>, ToolError> {
        self.post_tool_unless(who, message, Arc::default()).await
    }

    /// [`Spaces::post_tool`], unless `withdrawn` is set when the change is made (under the
    /// lock): then nothing is posted and the answer is [`ToolError::Cancelled`]. The call's
    /// caller sets it when it is dropped; the change runs on in a task of its own (a folder,
    /// a shared storage) and would otherwise post a message for a call nobody makes.
    pub(crate) async fn post_tool_unless(
        &self,
        who: &Who,
        message: ToolMessage,
        withdrawn: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Result<u64, NotInSpace>, ToolError> {
        let message = ToolMessage {
            arguments: self.clean(message.arguments),
            result: message.result.map(|r| self.clean(r)),
            ..message
        };
        let key = who.key();
        let max = self.max_messages;
        let author = who.entity.clone();
        let of = key.clone();
        self.transact_for(
            move |state| active_of(state, &of),
            move |txn| {
                if withdrawn.load(std::sync::atomic::Ordering::Acquire) {
                    return Err(ToolError::Cancelled { tool: message.name });
                }
                let Some(stored) = txn.active_space(&key) else {
                    return Ok(Err(NotInSpace));
                };
                let call_id = message.call_id.clone();
                let Some(space) = txn.space(&stored)? else {
                    return Ok(Err(NotInSpace));
                };
                let index = space.push(
                    Message {
                        index: 0,
                        author,
                        text: None,
                        tool: Some(message),
                        at_ms: now_ms(),
                        rev: 0,
                        posted_rev: 0,
                    },
                    max,
                );
                txn.touch(&stored);
                if let Some(call_id) = call_id {
                    txn.state.wait_for_tool(call_id, stored);
                    txn.changed();
                }
                Ok(Ok(index))
            },
        )
        .await
    }

    /// The ids of the visible tool calls whose messages wait for an answer
    /// (`requires_action`).
    pub async fn waiting_tool_calls(&self) -> Result<Vec<String>, ToolError> {
        self.transact(|txn| Ok(txn.state.tool_calls.keys().cloned().collect())).await
    }

    /// Sets the status and result of the visible tool call `call_id`, when one is waiting.
    pub async fn finish_tool(
        &self,
        call_id: &str,
        status: ToolStatus,
        result: Option<Value>,
    ) -> Result<bool, ToolError> {
        let result = result.map(|r| self.clean(r));
        let (call_id, of) = (call_id.to_owned(), call_id.to_owned());
        let needs = move |state: &State| state.tool_calls.get(&of).cloned().into_iter().collect();
        self.transact_for(needs, move |txn| {
            let Some(stored) = txn.state.answered_tool(&call_id) else {
                return Ok(false);
            };
            txn.changed();
            let Some(space) = txn.space(&stored)? else {
                return Ok(false);
            };
            let found = space.messages.iter_mut().rev().find(|m| {
                m.tool.as_ref().is_some_and(|t| t.call_id.as_deref() == Some(call_id.as_str()))
            });
            let Some(message) = found else {
                return Ok(false);
            };
            if let Some(tool) = message.tool.as_mut() {
                tool.status = status;
                tool.result = result;
            }
            space.version += 1;
            message.rev = space.version;
            txn.touch(&stored);
            Ok(true)
        })
        .await
    }

    /// The caller's goals, memories or plans.
    pub async fn items(&self, who: &Who, kind: ItemKind) -> Result<Vec<Item>, ToolError> {
        let key = who.key();
        self.transact(move |txn| {
            Ok(txn.state.entities.get(&key).map(|e| e.items(kind).clone()).unwrap_or_default())
        })
        .await
    }

    /// Adds or replaces the caller's `items` (by id); gives all of that kind.
    pub async fn set_items(
        &self,
        who: &Who,
        kind: ItemKind,
        items: Vec<ItemInput>,
        tool: &str,
    ) -> Result<Vec<Item>, ToolError> {
        if items.is_empty() {
            return Err(invalid(tool, &format!("`{}` is empty: give at least one", kind.plural())));
        }
        for item in &items {
            if item.text.trim().is_empty() {
                return Err(invalid(tool, "an item's `text` is empty"));
            }
            if item.text.len() > MAX_ITEM_BYTES {
                return Err(invalid(
                    tool,
                    &format!("an item is {} bytes, over {MAX_ITEM_BYTES}", item.text.len()),
                ));
            }
            if let Some(status) = &item.status
                && status.len() > MAX_ITEM_BYTES
            {
                return Err(invalid(
                    tool,
                    &format!("an item's status is {} bytes, over {MAX_ITEM_BYTES}", status.len()),
                ));
            }
            if let Some(id) = &item.id
                && (id.is_empty() || id.len() > 64 || id.chars().any(char::is_control))
            {
                return Err(invalid(tool, &format!("`{id}` is not an id (1 to 64 characters)")));
            }
        }
        let items: Vec<ItemInput> = items
            .into_iter()
            .map(|item| ItemInput {
                text: self.clean_text(&item.text),
                status: item.status.map(|status| self.clean_text(&status)),
                ..item
            })
            .collect();
        let key = who.key();
        let tool = tool.to_owned();
        self.transact(move |txn| {
            let entity = txn.entity(&key, &tool)?;
            let mut next_id = entity.next_id;
            // Changed on a copy, kept only when within the bound: a change in memory is
            // not undone when it fails.
            let mut list = entity.items(kind).clone();
            let now = now_ms();
            for input in items {
                let id = input.id.unwrap_or_else(|| {
                    loop {
                        next_id += 1;
                        let id = format!("{}{next_id}", kind.prefix());
                        if !list.iter().any(|i| i.id == id) {
                            break id;
                        }
                    }
                });
                let item = Item { id, text: input.text, status: input.status, updated_ms: now };
                match list.iter_mut().find(|i| i.id == item.id) {
                    Some(held) => *held = item,
                    None => list.push(item),
                }
            }
            if list.len() > MAX_ITEMS {
                return Err(invalid(
                    &tool,
                    &format!(
                        "that makes {} {}, over the {MAX_ITEMS} an agent may hold: delete some \
                         first",
                        list.len(),
                        kind.plural()
                    ),
                ));
            }
            let all = list.clone();
            *entity.items_mut(kind) = list;
            entity.next_id = next_id;
            txn.changed();
            Ok(all)
        })
        .await
    }

    /// Deletes the caller's items `ids`; gives those deleted and those it did not hold.
    pub async fn delete_items(
        &self,
        who: &Who,
        kind: ItemKind,
        ids: &[String],
    ) -> Result<(Vec<String>, Vec<String>), ToolError> {
        let key = who.key();
        let ids = ids.to_vec();
        self.transact(move |txn| {
            let Some(entity) = txn.state.entities.get_mut(&key) else {
                return Ok((Vec::new(), ids));
            };
            let list = entity.items_mut(kind);
            let (mut deleted, mut unknown) = (Vec::new(), Vec::new());
            for id in &ids {
                match list.iter().position(|i| &i.id == id) {
                    Some(at) => {
                        list.remove(at);
                        deleted.push(id.clone());
                    }
                    None => unknown.push(id.clone()),
                }
            }
            if !deleted.is_empty() {
                txn.changed();
            }
            Ok((deleted, unknown))
        })
        .await
    }

    /// What the caller carries and where it is: for the start of an agent's run.
    pub async fn context(&self, who: &Who, history: usize) -> Result<Context, ToolError> {
        let key = who.key();
        let of = key.clone();
        let context = self
            .transact_for(
                move |state| active_of(state, &of),
                move |txn| {
                    let Some(entity) = txn.state.entities.get(&key).cloned() else {
                        return Ok(Context {
                            active_space: None,
                            unread: Vec::new(),
                            unread_count: 0,
                            unread_from: 0,
                            goals: Vec::new(),
                            memories: Vec::new(),
                            plans: Vec::new(),
                        });
                    };
                    let (mut unread, mut unread_count, mut unread_from) = (Vec::new(), 0, 0);
                    if let Some(stored) = &entity.active_space {
                        let from = entity.read.get(stored).copied().unwrap_or(0);
                        let mut read_to = None;
                        if let Some(space) = txn.space(stored)? {
                            let from = from.max(space.first);
                            unread_count = space.total().saturating_sub(from);
                            unread_from = from;
                            // The latest `history` of them; older ones are read from
                            // `unreadFrom` with read_messages.
                            let start = space.total().saturating_sub(history as u64).max(from);
                            unread = space.page(start, history);
                            read_to = (unread_count > 0).then(|| space.total());
                        }
                        // Given to the agent: read (a listening agent is not woken by them again).
                        if let Some(total) = read_to {
                            txn.entity(&key, "gateway__context")?
                                .read
                                .insert(stored.clone(), total);
                            txn.changed();
                        }
                    }
                    Ok(Context {
                        active_space: entity.active_space.clone(),
                        unread,
                        unread_count,
                        unread_from,
                        goals: entity.goals,
                        memories: entity.memories,
                        plans: entity.plans,
                    })
                },
            )
            .await?;
        Ok(Context {
            active_space: context.active_space.map(|s| who.shown(&s).to_owned()),
            ..context
        })
    }
}

/// The caller has no active space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotInSpace;

/// The stored name of entity `key`'s active space, as a list of the spaces a change needs.
fn active_of(state: &State, key: &str) -> Vec<String> {
    state.entities.get(key).and_then(|e| e.active_space.clone()).into_iter().collect()
}

/// What changed in a space after a revision.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Changes {
    /// The space.
    pub space: String,
    /// The messages written or changed since, in the order of their revisions.
    pub messages: Vec<Message>,
    /// What those changes were, in the same order, for a stream to name its events by: a
    /// [`SpaceEventKind::Message`] for each message, then for a visible tool's call the
    /// seeds' `tool.started` (when it was posted since) and `tool.done` or `tool.error`
    /// (when it ended).
    pub events: Vec<SpaceEvent>,
    /// The revision to go on from: the last of `messages`, or the space's latest.
    pub version: u64,
}

/// One event of a space's stream: what happened to the message at `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpaceEvent {
    /// What happened.
    pub event: SpaceEventKind,
    /// The message's index in the space (in [`Changes::messages`]).
    pub index: u64,
}

/// The events of a space's stream, named as the seeds name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SpaceEventKind {
    /// A message written or changed (every change has one).
    #[serde(rename = "message")]
    Message,
    /// A visible tool's call began: it was posted.
    #[serde(rename = "tool.started")]
    ToolStarted,
    /// A visible tool's call completed with its result.
    #[serde(rename = "tool.done")]
    ToolDone,
    /// A visible tool's call failed, or its caller gave up on it.
    #[serde(rename = "tool.error")]
    ToolError,
}

impl SpaceEventKind {
    /// The event's name in a stream (`message`, `tool.started`, …).
    pub fn name(self) -> &'static str {
        match self {
            SpaceEventKind::Message => "message",
            SpaceEventKind::ToolStarted => "tool.started",
            SpaceEventKind::ToolDone => "tool.done",
            SpaceEventKind::ToolError => "tool.error",
        }
    }
}

/// The events of `messages`, changed after revision `since`.
fn events_of(messages: &[Message], since: u64) -> Vec<SpaceEvent> {
    let mut events = Vec::with_capacity(messages.len());
    for message in messages {
        let index = message.index;
        events.push(SpaceEvent { event: SpaceEventKind::Message, index });
        let Some(tool) = &message.tool else { continue };
        // A message stored before its posting was dated: a call still waiting, or one of
        // an inline tool (posted when it ended, with no call to answer), was posted now.
        let posted_since = match message.posted_rev {
            0 => tool.status == ToolStatus::RequiresAction || tool.call_id.is_none(),
            posted => posted > since,
        };
        if posted_since {
            events.push(SpaceEvent { event: SpaceEventKind::ToolStarted, index });
        }
        let ended = match tool.status {
            ToolStatus::RequiresAction => None,
            ToolStatus::Complete => Some(SpaceEventKind::ToolDone),
            ToolStatus::Error | ToolStatus::Cancelled => Some(SpaceEventKind::ToolError),
        };
        if let Some(event) = ended {
            events.push(SpaceEvent { event, index });
        }
    }
    events
}

/// How often a wait for changes looks at a folder again (other processes write it too).
const DIR_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// How often a wait looks again at a storage that tells of changes (in case a notice was
/// lost while it reconnected).
const NOTICED_POLL: std::time::Duration = std::time::Duration::from_secs(2);

impl Spaces {
    /// What wakes a wait besides this process's changes: another process's notices, and
    /// how often to look again anyway.
    async fn remote_changes(
        &self,
    ) -> (Option<tokio::sync::watch::Receiver<u64>>, Option<std::time::Duration>) {
        match self.backend.as_ref() {
            Backend::Memory(_) => (None, None),
            Backend::Dir(_) => (None, Some(DIR_POLL)),
            Backend::Storage(storage) => match storage.change_notices().await {
                Some(notices) => (Some(notices), Some(NOTICED_POLL)),
                None => (None, Some(DIR_POLL)),
            },
        }
    }
}

/// Waits for this process's next change, another process's notice, or `poll`.
async fn next_change(
    local: &mut tokio::sync::watch::Receiver<u64>,
    remote: &mut Option<tokio::sync::watch::Receiver<u64>>,
    poll: std::time::Duration,
) {
    let notice = async {
        match remote.as_mut() {
            Some(remote) => {
                if remote.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = local.changed() => {}
        () = notice => {}
        () = tokio::time::sleep(poll) => {}
    }
}

impl Spaces {
    /// The messages of the caller's `space` written or changed after revision `since`
    /// (at most `limit`, oldest revision first); `since: None` gives none, only the
    /// revision to go on from.
    pub async fn changes(
        &self,
        who: &Who,
        space: &str,
        since: Option<u64>,
        limit: usize,
    ) -> Result<Changes, ToolError> {
        const TOOL: &str = "gateway__changes";
        check_space_name(space).map_err(|e| invalid(TOOL, &e))?;
        let stored = who.space(space);
        let needed = stored.clone();
        let space = space.to_owned();
        self.transact_for(
            move |_| vec![needed],
            move |txn| {
                let Some(found) = txn.space(&stored)? else {
                    return Err(no_space(TOOL, Some(&space)));
                };
                let Some(since) = since else {
                    return Ok(Changes {
                        space: space.clone(),
                        messages: Vec::new(),
                        events: Vec::new(),
                        version: found.version,
                    });
                };
                // A revision past the space's (a client of a space made anew) goes on from now.
                let since = since.min(found.version);
                let mut messages: Vec<Message> =
                    found.messages.iter().filter(|m| m.rev > since).cloned().collect();
                messages.sort_by_key(|m| m.rev);
                messages.truncate(limit.max(1));
                let version = messages.last().map_or(found.version.max(since), |m| m.rev);
                let events = events_of(&messages, since);
                Ok(Changes { space, messages, events, version })
            },
        )
        .await
    }

    /// How many messages of others the caller has not read in its active space (and which
    /// space that is), waiting up to `wait` for one when there is none: what wakes a
    /// listening agent. Visible tools' calls are not counted: they show in the space but
    /// trigger no agent.
    pub async fn wait_unread(
        &self,
        who: &Who,
        wait: std::time::Duration,
    ) -> Result<(Option<String>, u64), ToolError> {
        let key = who.key();
        let deadline = tokio_later(wait);
        let (mut remote, every) = self.remote_changes().await;
        loop {
            let mut changed = self.changed.subscribe();
            if let Some(remote) = remote.as_mut() {
                remote.borrow_and_update();
            }
            let (of, mine, me) = (key.clone(), key.clone(), who.entity.clone());
            let (space, unread) = self
                .transact_for(
                    move |state| active_of(state, &of),
                    move |txn| {
                        let key = mine;
                        let Some(entity) = txn.state.entities.get(&key) else {
                            return Ok((None, 0));
                        };
                        let Some(stored) = entity.active_space.clone() else {
                            return Ok((None, 0));
                        };
                        let from = entity.read.get(&stored).copied().unwrap_or(0);
                        let unread = match txn.space(&stored)? {
                            Some(space) => space
                                .messages
                                .iter()
                                .skip(
                                    usize::try_from(from.saturating_sub(space.first))
                                        .unwrap_or(usize::MAX),
                                )
                                // Visible tools' calls wake nobody (the seeds: they
                                // "cannot trigger agents"); what others say does.
                                .filter(|m| m.author != me && m.tool.is_none())
                                .count() as u64,
                            None => 0,
                        };
                        Ok((Some(stored), unread))
                    },
                )
                .await?;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if unread > 0 || left.is_zero() {
                return Ok((space.map(|s| who.shown(&s).to_owned()), unread));
            }
            next_change(&mut changed, &mut remote, every.map_or(left, |e| left.min(e))).await;
        }
    }

    /// [`Spaces::changes`], waiting up to `wait` for one when there is none yet.
    pub async fn wait_changes(
        &self,
        who: &Who,
        space: &str,
        since: u64,
        limit: usize,
        wait: std::time::Duration,
    ) -> Result<Changes, ToolError> {
        let deadline = tokio_later(wait);
        let (mut remote, every) = self.remote_changes().await;
        loop {
            let mut changed = self.changed.subscribe();
            if let Some(remote) = remote.as_mut() {
                remote.borrow_and_update();
            }
            let changes = self.changes(who, space, Some(since), limit).await?;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !changes.messages.is_empty() || left.is_zero() {
                return Ok(changes);
            }
            // Changes made here wake the wait at once, as do another process's notices; a
            // folder is also looked at again now and then for other processes' changes.
            next_change(&mut changed, &mut remote, every.map_or(left, |e| left.min(e))).await;
        }
    }
}

/// What a missing space is told as: a named one, or the caller's active one (gone since).
/// The caller named a space that does not exist (or its active space was removed).
fn no_space(tool: &str, named: Option<&str>) -> ToolError {
    let message = match named {
        Some(name) => format!("there is no space `{name}`: `gateway__enter_space` makes one"),
        None => "your active space no longer exists: enter another".to_owned(),
    };
    ToolError::NotFound { tool: tool.to_owned(), message }
}

fn invalid(tool: &str, message: &str) -> ToolError {
    ToolError::invalid_arguments(tool, message)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `wait` from now on tokio's clock, without overflow: a wait too long to add (such as
/// `Duration::MAX`) waits as long as a call kept for good ([`crate::store::FOREVER`]).
fn tokio_later(wait: std::time::Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(wait).unwrap_or_else(|| now + crate::store::FOREVER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn who(entity: &str) -> Who {
        Who { holder: None, entity: entity.to_owned() }
    }

    /// A storage whose reads wait while `gate` is false, and which tells whether its lock
    /// is taken.
    #[derive(Debug)]
    struct Gated {
        gate: tokio::sync::watch::Sender<bool>,
        locked: std::sync::atomic::AtomicBool,
        kept: Mutex<BTreeMap<String, Vec<u8>>>,
    }

    #[async_trait::async_trait]
    impl SpaceStorage for Gated {
        async fn lock(&self) -> Result<String, ToolError> {
            self.locked.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok("token".into())
        }

        async fn unlock(&self, _token: &str) {
            self.locked.store(false, std::sync::atomic::Ordering::SeqCst);
        }

        async fn read(&self, _token: &str, key: &str) -> Result<Option<Vec<u8>>, ToolError> {
            let mut open = self.gate.subscribe();
            let _ = open.wait_for(|open| *open).await;
            Ok(self.kept.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned())
        }

        async fn commit(
            &self,
            _token: &str,
            writes: &[(String, Vec<u8>)],
        ) -> Result<(), ToolError> {
            self.kept.lock().unwrap_or_else(|e| e.into_inner()).extend(writes.iter().cloned());
            Ok(())
        }

        async fn space_names(&self) -> Result<Vec<String>, ToolError> {
            Ok(Vec::new())
        }
    }

    /// A change whose caller stops waiting once it has taken the storage's lock still ends
    /// and gives the lock back: it was left taken until its lease ended (10 s in Redis),
    /// every other replica's changes waiting behind it.
    #[tokio::test]
    async fn a_change_whose_caller_stops_waiting_gives_the_lock_back() {
        let storage = Arc::new(Gated {
            gate: tokio::sync::watch::channel(false).0,
            locked: Default::default(),
            kept: Default::default(),
        });
        let spaces = Spaces::in_storage(storage.clone());
        let gave_up =
            tokio::time::timeout(Duration::from_millis(100), spaces.enter(&who("agent:a"), "x", 5))
                .await;
        assert!(gave_up.is_err(), "the change waits at its read");
        assert!(storage.locked.load(std::sync::atomic::Ordering::SeqCst));
        storage.gate.send_replace(true);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while storage.locked.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(std::time::Instant::now() < deadline, "the lock was not given back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Past the bound on visible calls remembered as waiting, the oldest is forgotten, not
    /// the one whose id sorts first.
    #[tokio::test]
    async fn the_oldest_waiting_call_is_forgotten_first() {
        let spaces = Spaces::in_memory().with_max_messages(10);
        let a = who("agent:a");
        spaces.enter(&a, "lobby", 0).await.expect("enter");
        let call = |id: String| ToolMessage {
            name: "external__ask".into(),
            tool_name: "ask".into(),
            arguments: Value::Null,
            status: ToolStatus::RequiresAction,
            result: None,
            call_id: Some(id),
        };
        // The first call's id sorts after all the others'.
        spaces.post_tool(&a, call("z-first".into())).await.expect("post").expect("in a space");
        for n in 0..MAX_TOOL_CALLS {
            let posted = spaces.post_tool(&a, call(format!("a-{n:05}"))).await.expect("post");
            posted.expect("in a space");
        }
        let waiting = spaces.waiting_tool_calls().await.expect("waiting");
        assert_eq!(waiting.len(), MAX_TOOL_CALLS);
        assert!(!waiting.contains(&"z-first".to_owned()), "the oldest is forgotten");
        assert_eq!(waiting[0], "a-00000");
        let Backend::Memory(state) = spaces.backend.as_ref() else { unreachable!("in memory") };
        assert_eq!(state.lock().expect("state").tool_call_order.len(), MAX_TOOL_CALLS);
    }

    #[tokio::test]
    async fn messages_are_read_once_and_pages_go_on() {
        let spaces = Spaces::in_memory().with_max_messages(3);
        let (a, b) = (who("agent:a"), who("agent:b"));
        let entered = spaces.enter(&a, "lobby", 10).await.expect("enter");
        assert!(entered.created);
        spaces.enter(&b, "lobby", 10).await.expect("enter");
        for text in ["one", "two", "three", "four"] {
            spaces.say(&a, None, text, "t", false).await.expect("say");
        }
        // b has not read any; the oldest was dropped (3 kept).
        let page = spaces.read(&b, None, None, 10).await.expect("read");
        let texts: Vec<_> = page.messages.iter().filter_map(|m| m.text.as_deref()).collect();
        assert_eq!(texts, ["two", "three", "four"]);
        assert_eq!((page.first, page.next, page.total), (1, 4, 4));
        assert!(spaces.read(&b, None, None, 10).await.expect("read").messages.is_empty());
        // a wrote them, so it has nothing unread either.
        assert_eq!(spaces.context(&a, 5).await.expect("context").unread_count, 0);
        let again = spaces.read(&b, Some("lobby"), Some(2), 1).await.expect("read");
        assert_eq!(again.messages[0].text.as_deref(), Some("three"));
    }

    /// A wait too long to add to the clock (a library caller's `Duration::MAX`) waits as
    /// one kept for good: adding it panicked before anything was looked at.
    #[tokio::test]
    async fn the_longest_wait_does_not_overflow_the_clock() {
        let spaces = Spaces::in_memory();
        let (a, b) = (who("agent:a"), who("agent:b"));
        spaces.enter(&a, "lobby", 10).await.expect("enter");
        spaces.enter(&b, "lobby", 10).await.expect("enter");
        spaces.say(&a, None, "hello", "t", false).await.expect("say");
        let (space, unread) = spaces.wait_unread(&b, Duration::MAX).await.expect("unread");
        assert_eq!((space.as_deref(), unread), (Some("lobby"), 1));
        let changes =
            spaces.wait_changes(&b, "lobby", 0, 10, Duration::MAX).await.expect("changes");
        assert!(!changes.messages.is_empty());
    }

    /// A caller in no space that speaks, reads, leaves, deletes or calls a visible tool
    /// leaves no state behind: in memory, an empty one per run would be kept forever.
    #[tokio::test]
    async fn callers_outside_spaces_leave_no_state() {
        let spaces = Spaces::in_memory();
        let entities = |spaces: &Spaces| match spaces.backend.as_ref() {
            Backend::Memory(state) => state.lock().expect("state").entities.len(),
            _ => unreachable!("in memory"),
        };
        for run in 0..3 {
            let caller = who(&format!("run:mcp-{run}"));
            spaces.say(&caller, None, "hello", "t", false).await.expect_err("in no space");
            spaces.read(&caller, None, None, 5).await.expect_err("in no space");
            assert_eq!(spaces.leave(&caller).await.expect("leave"), None);
            let ids = ["g1".to_owned()];
            let (deleted, unknown) =
                spaces.delete_items(&caller, ItemKind::Goal, &ids).await.expect("delete");
            assert_eq!((deleted, unknown), (vec![], ids.to_vec()));
            let call = ToolMessage {
                name: "external__x".into(),
                tool_name: "x".into(),
                arguments: Value::Null,
                status: ToolStatus::RequiresAction,
                result: None,
                call_id: Some(format!("c{run}")),
            };
            assert_eq!(spaces.post_tool(&caller, call).await.expect("post"), Err(NotInSpace));
        }
        assert_eq!(entities(&spaces), 0);
        spaces.enter(&who("agent:a"), "lobby", 5).await.expect("enter");
        assert_eq!(entities(&spaces), 1);
    }

    #[tokio::test]
    async fn holders_do_not_see_each_others_spaces() {
        let spaces = Spaces::in_memory();
        let acme = Who { holder: Some("acme".into()), entity: "agent:a".into() };
        let other = Who { holder: Some("other".into()), entity: "agent:a".into() };
        spaces.enter(&acme, "lobby", 5).await.expect("enter");
        spaces.say(&acme, None, "secret plan", "t", false).await.expect("say");
        let listed = spaces.list(&other).await.expect("list");
        assert!(listed.is_empty(), "{listed:?}");
        let err = spaces.read(&other, Some("lobby"), None, 5).await.expect_err("no such space");
        assert!(err.to_string().contains("there is no space `lobby`"), "{err}");
        assert_eq!(err.code(), "not_found", "a missing space is told by its type: {err:?}");
        assert_eq!(spaces.list(&acme).await.expect("list")[0].space, "lobby");
        assert_eq!(spaces.active(&acme).await.expect("active").as_deref(), Some("lobby"));
    }

    #[tokio::test]
    async fn items_get_ids_are_replaced_by_id_and_deleted() {
        let spaces = Spaces::in_memory();
        let a = who("agent:a");
        let input = |id: Option<&str>, text: &str| ItemInput {
            id: id.map(str::to_owned),
            text: text.to_owned(),
            status: None,
        };
        let all = spaces
            .set_items(&a, ItemKind::Goal, vec![input(None, "ship"), input(None, "test")], "t")
            .await
            .expect("set");
        assert_eq!(all.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["g1", "g2"]);
        let all = spaces
            .set_items(&a, ItemKind::Goal, vec![input(Some("g1"), "ship it")], "t")
            .await
            .expect("set");
        assert_eq!(all[0].text, "ship it");
        assert_eq!(all.len(), 2);
        let (deleted, unknown) = spaces
            .delete_items(&a, ItemKind::Goal, &["g2".into(), "g9".into()])
            .await
            .expect("delete");
        assert_eq!((deleted, unknown), (vec!["g2".to_owned()], vec!["g9".to_owned()]));
        assert!(spaces.items(&a, ItemKind::Plan).await.expect("plans").is_empty());
    }
}
