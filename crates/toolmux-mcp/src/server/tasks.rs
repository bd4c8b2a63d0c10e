//! MCP tasks (SEP-2663, the `io.modelcontextprotocol/tasks` extension): a call of a tool
//! that supports tasks, from a client that takes them, runs in the background and the
//! client polls `tasks/get` for it, answers its questions with `tasks/update` and may stop
//! it with `tasks/cancel`.
//!
//! A task is created before `CreateTaskResult` is sent, so a `tasks/get` right after it
//! resolves. Its questions (elicitation, sampling, roots) are not sent to the client: they
//! wait in the task as `inputRequests` (status `input_required`) until `tasks/update`
//! answers them, each under a key the server made (or the tool's own key). A tool that
//! failed, or refused its arguments, is `completed` with `isError: true`; `failed` is for
//! protocol errors (an unknown tool, a panic). Tasks are kept for [`TTL`] after they are
//! made (a call still running then is stopped), at most [`MAX_TASKS`]; each belongs to
//! the API key holder that made it (or to every caller without keys).
//! Their ids begin with a random mark of the store that made them, so that a server
//! restarted at the same address tells its earlier life's tasks, which replicas sharing
//! sessions may still name ([`super::affinity`]), from its own.

use super::interact::Need;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, GetTaskResult, InputRequest, InputRequests,
    InputResponses, JsonObject, Task, TaskPayload, TaskStatus,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolmux_core::ToolError;

/// How long a task stays readable after it was made.
pub(crate) const TTL: Duration = Duration::from_secs(60 * 60);

/// How often a client should poll, as suggested to it.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Tasks kept at most; past it the oldest finished go, and when none has finished a new
/// call runs in its request instead.
pub(crate) const MAX_TASKS: usize = 10_000;

/// The tasks of one server.
#[derive(Debug)]
pub(crate) struct TaskStore {
    tasks: Mutex<HashMap<String, Arc<TaskEntry>>>,
    next: AtomicU64,
    /// Begins the ids of this store's tasks (`task-{instance}-`), random: a server
    /// restarted at the same address tells the tasks of its earlier life from its own.
    instance: String,
}

impl Default for TaskStore {
    fn default() -> TaskStore {
        TaskStore { tasks: Mutex::default(), next: AtomicU64::new(0), instance: random_suffix() }
    }
}

/// One task.
#[derive(Debug)]
pub(crate) struct TaskEntry {
    pub(crate) id: String,
    /// The API key holder that made it; `None` without keys.
    owner: Option<Arc<str>>,
    created_at: String,
    made: Instant,
    state: Mutex<State>,
    /// The questions the call asked that wait for `tasks/update`.
    pub(crate) inputs: Arc<TaskInputs>,
    /// Stops the call.
    pub(crate) cancel: CancellationToken,
}

#[derive(Debug)]
struct State {
    outcome: Outcome,
    updated_at: String,
    /// The call's latest progress, in words, while it works.
    message: Option<String>,
}

#[derive(Debug, Clone)]
enum Outcome {
    Working,
    Completed(JsonObject),
    Failed(JsonObject),
    Cancelled,
}

fn now() -> String {
    rmcp::task_manager::current_timestamp()
}

impl TaskStore {
    /// A new working task for `owner`, or `None` when the store is full of unfinished
    /// tasks (the call then runs in its request).
    pub(crate) fn create(&self, owner: Option<Arc<str>>) -> Option<Arc<TaskEntry>> {
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        let now_instant = Instant::now();
        // A task past its TTL goes; a call still running in it is stopped, since nobody
        // could read its result or cancel it any more.
        tasks.retain(|_, t| {
            let keep = now_instant.duration_since(t.made) < TTL;
            if !keep {
                t.cancel.cancel();
            }
            keep
        });
        if tasks.len() >= MAX_TASKS {
            let oldest = tasks
                .values()
                .filter(|t| t.is_terminal())
                .min_by_key(|t| t.made)
                .map(|t| t.id.clone());
            tasks.remove(&oldest?);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let id = format!("task-{}-{n}-{}", self.instance, random_suffix());
        let stamp = now();
        let entry = Arc::new(TaskEntry {
            id: id.clone(),
            owner,
            created_at: stamp.clone(),
            made: now_instant,
            state: Mutex::new(State {
                outcome: Outcome::Working,
                updated_at: stamp,
                message: None,
            }),
            inputs: Arc::new(TaskInputs::default()),
            cancel: CancellationToken::new(),
        });
        tasks.insert(id, entry.clone());
        Some(entry)
    }

    /// Whether task `id` is kept here, whoever may see it.
    pub(crate) fn contains(&self, id: &str) -> bool {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).contains_key(id)
    }

    /// Whether task `id` was made by this store (kept or gone), rather than by another
    /// server or an earlier life of this one.
    pub(crate) fn made_here(&self, id: &str) -> bool {
        id.strip_prefix("task-")
            .and_then(|rest| rest.strip_prefix(self.instance.as_str()))
            .is_some_and(|rest| rest.starts_with('-'))
    }

    /// Task `id`, when `owner` may see it; `-32602` otherwise, as for an unknown id.
    pub(crate) fn get(
        &self,
        id: &str,
        owner: Option<&Arc<str>>,
    ) -> Result<Arc<TaskEntry>, ErrorData> {
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks
            .get(id)
            .filter(|t| Instant::now().duration_since(t.made) < TTL)
            .filter(|t| t.owner.is_none() || t.owner.as_ref() == owner)
            .cloned()
            .ok_or_else(|| ErrorData::invalid_params(format!("unknown task `{id}`"), None))
    }
}

/// Enough randomness that task ids of one server are not guessed from another's.
fn random_suffix() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::getrandom(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        bytes[..4].copy_from_slice(&nanos.to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl TaskEntry {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the task goes: past it nobody can read its result or cancel it, so a call
    /// still running in it is stopped then.
    pub(crate) fn expires_at(&self) -> Instant {
        self.made + TTL
    }

    fn is_terminal(&self) -> bool {
        !matches!(self.lock().outcome, Outcome::Working)
    }

    /// The task as `CreateTaskResult` gives it.
    pub(crate) fn created(&self) -> CreateTaskResult {
        CreateTaskResult::new(self.base(TaskStatus::Working))
    }

    fn base(&self, status: TaskStatus) -> Task {
        let (updated_at, message) = {
            let state = self.lock();
            (state.updated_at.clone(), state.message.clone())
        };
        let task = Task::new(&self.id, status, &self.created_at, updated_at)
            .with_ttl_ms(TTL.as_millis() as u64)
            .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64);
        match message {
            Some(message) if status == TaskStatus::Working => task.with_status_message(message),
            _ => task,
        }
    }

    /// Notes the call's progress: `tasks/get` shows it as the status message while the
    /// task works (`3/10: reading files`).
    pub(crate) fn progress(&self, progress: &toolmux_core::Progress) {
        let count = match progress.total {
            Some(total) => format!("{}/{}", progress.progress, total),
            None => progress.progress.to_string(),
        };
        let message = match &progress.message {
            Some(text) => format!("{count}: {text}"),
            None => count,
        };
        let mut state = self.lock();
        state.message = Some(message);
        state.updated_at = now();
    }

    /// The task as `tasks/get` gives it.
    pub(crate) fn detailed(&self) -> GetTaskResult {
        let outcome = self.lock().outcome.clone();
        let payload = match outcome {
            Outcome::Working => {
                let input_requests = self.inputs.requests();
                if input_requests.is_empty() {
                    TaskPayload::Working
                } else {
                    TaskPayload::InputRequired { input_requests }
                }
            }
            Outcome::Completed(result) => TaskPayload::Completed { result },
            Outcome::Failed(error) => TaskPayload::Failed { error },
            Outcome::Cancelled => TaskPayload::Cancelled,
        };
        let task = self.base(payload.status());
        GetTaskResult::new(DetailedTask::new(task, payload))
    }

    /// Records how the call ended, unless the task ended already (a cancelled task stays
    /// cancelled).
    pub(crate) fn finish(&self, result: Result<CallToolResult, ErrorData>) {
        let outcome = match result {
            Ok(result) => match serde_json::to_value(result) {
                Ok(Value::Object(mut object)) => {
                    // The inlined result is a plain result: no discriminator of its own.
                    object.remove("resultType");
                    Outcome::Completed(object)
                }
                _ => Outcome::Failed(error_object(&ErrorData::internal_error(
                    "the tool's result could not be encoded",
                    None,
                ))),
            },
            Err(error) => Outcome::Failed(error_object(&error)),
        };
        let mut state = self.lock();
        if matches!(state.outcome, Outcome::Working) {
            state.outcome = outcome;
            state.updated_at = now();
        }
    }

    /// Stops the call; the task is `cancelled` from now on, unless it had ended.
    pub(crate) fn cancel(&self) {
        {
            let mut state = self.lock();
            if matches!(state.outcome, Outcome::Working) {
                state.outcome = Outcome::Cancelled;
                state.updated_at = now();
            }
        }
        self.cancel.cancel();
        self.inputs.abandon();
    }

    /// Notes that the task changed (a question asked or answered).
    pub(crate) fn touch(&self) {
        self.lock().updated_at = now();
    }
}

fn error_object(error: &ErrorData) -> JsonObject {
    match serde_json::to_value(error) {
        Ok(Value::Object(object)) => object,
        _ => {
            let mut object = JsonObject::new();
            object.insert("code".into(), json!(-32603));
            object.insert("message".into(), json!(error.message));
            object
        }
    }
}

/// The questions of a task's call, waiting for `tasks/update`.
#[derive(Debug, Default)]
pub(crate) struct TaskInputs {
    pending: Mutex<BTreeMap<String, Pending>>,
    /// Numbers questions without a key of their own.
    counter: AtomicU64,
}

#[derive(Debug)]
struct Pending {
    request: InputRequest,
    need: Need,
    answer: oneshot::Sender<Value>,
}

impl TaskInputs {
    /// Asks `need` with `params` (under `key`, else one made here) and waits for the
    /// answer `tasks/update` brings.
    pub(crate) async fn ask(
        &self,
        need: Need,
        key: Option<&str>,
        params: Value,
        task: &TaskEntry,
    ) -> Result<Value, ToolError> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let mut key = key.map_or_else(|| format!("{}-{n}", need.name()), str::to_owned);
        let request = json!({"method": need.method(), "params": params});
        let request: InputRequest =
            serde_json::from_value(request).map_err(|e| ToolError::Protocol {
                provider: "mcp client".into(),
                message: format!("{}: {e}", need.method()),
            })?;
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if pending.contains_key(&key) {
                // Keys must be unique while pending: a second question under one key gets
                // a number of its own.
                key = format!("{key}-{n}");
            }
            pending.insert(key, Pending { request, need, answer: tx });
        }
        task.touch();
        rx.await.map_err(|_| ToolError::Cancelled { tool: need.method().to_owned() })
    }

    /// The questions waiting.
    fn requests(&self) -> InputRequests {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.iter().map(|(k, p)| (k.clone(), p.request.clone())).collect()
    }

    /// Hands each answer to its question; keys of no waiting question, and answers of the
    /// wrong shape, are ignored (the question stays). Whether any was taken.
    pub(crate) fn answer(&self, responses: InputResponses) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut taken = false;
        for (key, answer) in responses {
            let fits = pending.get(&key).is_some_and(|p| p.need.answers_with(&answer));
            if fits && let Some(waiting) = pending.remove(&key) {
                let _ = waiting.answer.send(answer);
                taken = true;
            }
        }
        taken
    }

    /// Drops every waiting question: their calls see a cancellation.
    fn abandon(&self) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_found_by_their_owner_only() {
        let store = TaskStore::default();
        let alice: Arc<str> = Arc::from("alice");
        let bob: Arc<str> = Arc::from("bob");
        let task = store.create(Some(alice.clone())).expect("room");
        assert!(store.get(&task.id, Some(&alice)).is_ok());
        assert!(store.get(&task.id, Some(&bob)).is_err());
        assert!(store.get(&task.id, None).is_err());
        let open = store.create(None).expect("room");
        assert!(store.get(&open.id, Some(&bob)).is_ok());
        let unknown = store.get("task-0", None).unwrap_err();
        assert_eq!(unknown.code.0, -32602);
    }

    #[test]
    fn a_store_tells_its_own_task_ids_from_another_stores() {
        let (store, other) = (TaskStore::default(), TaskStore::default());
        let task = store.create(None).expect("room");
        assert!(store.contains(&task.id) && store.made_here(&task.id), "{}", task.id);
        assert!(!other.contains(&task.id) && !other.made_here(&task.id), "{}", task.id);
        assert!(!store.made_here("task-1"));
        assert!(!store.made_here(&format!("task-{}0-1-00", store.instance)));
    }

    #[test]
    fn a_cancelled_task_stays_cancelled_and_a_finished_one_stays_finished() {
        let store = TaskStore::default();
        let task = store.create(None).expect("room");
        task.cancel();
        task.finish(Ok(CallToolResult::success(vec![])));
        let got = serde_json::to_value(task.detailed()).expect("json");
        assert_eq!(got["status"], "cancelled");
        let done = store.create(None).expect("room");
        done.finish(Ok(CallToolResult::error(vec![])));
        done.cancel();
        let got = serde_json::to_value(done.detailed()).expect("json");
        assert_eq!(got["status"], "completed");
        assert_eq!(got["result"]["isError"], true);
        assert!(got["result"].get("resultType").is_none(), "{got}");
    }

    #[test]
    fn progress_is_the_status_message_while_the_task_works() {
        let store = TaskStore::default();
        let task = store.create(None).expect("room");
        let got = serde_json::to_value(task.detailed()).expect("json");
        assert!(got.get("statusMessage").is_none(), "{got}");
        task.progress(&toolmux_core::Progress::new(2.0, Some(5.0)).with_message("turn 2"));
        let got = serde_json::to_value(task.detailed()).expect("json");
        assert_eq!(got["statusMessage"], "2/5: turn 2");
        task.finish(Ok(CallToolResult::success(vec![])));
        let got = serde_json::to_value(task.detailed()).expect("json");
        assert!(got.get("statusMessage").is_none(), "{got}");
    }

    #[tokio::test]
    async fn questions_wait_for_their_answers_which_may_come_one_at_a_time() {
        let store = TaskStore::default();
        let task = store.create(None).expect("room");
        let ask = |key: &'static str| {
            let task = task.clone();
            tokio::spawn(async move {
                let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
                let params = json!({"message": key, "requestedSchema": schema});
                task.inputs.ask(Need::Elicitation, Some(key), params, &task).await
            })
        };
        let (a, b) = (ask("a"), ask("b"));
        let asked = async {
            while task.inputs.requests().len() < 2 {
                assert!(!a.is_finished() && !b.is_finished(), "a question failed to be asked");
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), asked).await.expect("both asked");
        let got = serde_json::to_value(task.detailed()).expect("json");
        assert_eq!(got["status"], "input_required");
        // A wrong shape or an unknown key is no answer.
        assert!(!task.inputs.answer(BTreeMap::from([("a".into(), json!({"nope": 1}))])));
        assert!(!task.inputs.answer(BTreeMap::from([("z".into(), json!({"action": "accept"}))])));
        assert!(task.inputs.answer(BTreeMap::from([("a".into(), json!({"action": "accept"}))])));
        assert_eq!(a.await.expect("joined").expect("answered"), json!({"action": "accept"}));
        let left: Vec<String> = task.inputs.requests().into_keys().collect();
        assert_eq!(left, ["b"]);
        task.cancel();
        assert!(b.await.expect("joined").is_err());
    }
}
