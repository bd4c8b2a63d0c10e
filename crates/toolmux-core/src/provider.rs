//! The one interface every source of tools implements.

use crate::{
    CallContext, Completion, CompletionRequest, JsonObject, Prompt, PromptSpec, ResourceContents,
    ResourceSpec, ResourceTemplate, ToolError, ToolKind, ToolOutput, ToolSpec,
};
use async_trait::async_trait;
use serde_json::Value;
use std::fmt;
use std::sync::Arc;
use tokio::sync::{broadcast, watch};

/// What kind of thing a tool's calls act on, for permission rules with a specifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubjectKind {
    /// Commands it runs: `fs__bash(git *)` matches the command's words.
    Command,
    /// Files and directories it reads or changes: `fs__write(src/**)` matches their paths.
    Path,
}

/// One thing a call acts on (see [`ToolProvider::subjects`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A command line for a shell (`bash -c`), as the model wrote it.
    Command(String),
    /// A program and its arguments, run without a shell.
    Argv(Vec<String>),
    /// A path relative to the provider's root, symlinks and `..` resolved, `/`-separated;
    /// `.` for the root itself.
    Path(String),
}

/// A relayed call's arguments ([`ToolProvider::relay`]) decoded, or the error that says
/// they are not JSON.
pub fn parse_arguments(tool: &str, arguments: &str) -> Result<Value, ToolError> {
    serde_json::from_str(arguments)
        .map_err(|e| ToolError::invalid_arguments(tool, format!("the arguments are not JSON: {e}")))
}

/// What a relayed call ([`ToolProvider::relay`]) gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Relayed {
    /// The result as the server wrote it: the JSON text of an MCP `CallToolResult`
    /// whose `content` holds what [`ToolOutput::content`] would (no content with
    /// structured content only comes as [`Relayed::Output`]).
    Raw {
        /// The result's JSON text, at most the `raw_max` bytes asked for.
        json: Box<str>,
        /// Its `isError`.
        is_error: bool,
    },
    /// The result decoded, as [`ToolProvider::call`] gives it.
    Output(ToolOutput),
}

/// A source of tools: an MCP server, an HTTP API, the builtin file tools, another agent,
/// or an orchestrator composing several of them.
///
/// Names here are provider-local (`read`, not `fs__read`); the orchestrator adds the
/// namespace. Implementations must be cheap to call concurrently and must stop work soon
/// after `ctx` is cancelled.
///
/// Besides tools a provider may offer prompts and resources (an MCP server's, a fixture's);
/// the defaults offer none. Prompt names are provider-local like tool names; resource URIs
/// are global and pass through the orchestrator unchanged.
#[async_trait]
pub trait ToolProvider: Send + Sync + fmt::Debug {
    /// The kind of source.
    fn kind(&self) -> ToolKind;

    /// The namespace its tools are listed under, matching `[a-z][a-z0-9-]*`.
    fn namespace(&self) -> &str;

    /// The tools offered now.
    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError>;

    /// The tools the provider's configuration says it offers, known without starting it
    /// (an MCP server's declared `tools`): listed while it cannot start, so that a model
    /// knows them and each call says why they do not run. Empty by default.
    fn declared_tools(&self) -> Vec<ToolSpec> {
        Vec::new()
    }

    /// Whether a tool of this local name is offered now.
    async fn has_tool(&self, name: &str) -> bool {
        self.list_tools().await.is_ok_and(|tools| tools.iter().any(|t| t.name == name))
    }

    /// Runs one tool. `arguments` have been validated against the tool's input schema when
    /// called through the orchestrator.
    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError>;

    /// Whether calls of `name` can be relayed ([`ToolProvider::relay`]) as they stand now:
    /// cheap and without waiting, asked before every relayed call. `false` (the default).
    fn relays(&self, name: &str) -> bool {
        let _ = name;
        false
    }

    /// Runs one tool as [`ToolProvider::call`] does, for a gateway that relays calls of a
    /// protocol speaking JSON: `arguments` is the JSON text of an object, and the result
    /// may come back as the server's own text ([`Relayed::Raw`]) when it is at most
    /// `raw_max` bytes long, so that neither is decoded and encoded again on the way
    /// through. Only asked for a tool [`ToolProvider::relays`] accepted; the default
    /// decodes the arguments and makes the call.
    async fn relay(
        &self,
        name: &str,
        arguments: &str,
        ctx: &CallContext,
        raw_max: usize,
    ) -> Result<Relayed, ToolError> {
        let _ = raw_max;
        let arguments = parse_arguments(name, arguments)?;
        self.call(name, arguments, ctx).await.map(Relayed::Output)
    }

    /// Connects, spawns or loads whatever the provider needs before the first call.
    async fn warmup(&self) -> Result<(), ToolError> {
        Ok(())
    }

    /// Instructions for the model about these tools (an MCP server's `instructions`).
    fn instructions(&self) -> Option<String> {
        None
    }

    /// Closes connections and reaps child processes. Calls after shutdown fail.
    async fn shutdown(&self) -> Result<(), ToolError> {
        Ok(())
    }

    /// What calls of the tool `tool` act on, when permission rules may judge them by more
    /// than the tool's name (`fs__bash(git *)`, `fs__write(src/**)`); `None` (the default)
    /// when they may not. Cheap: the orchestrator asks once per tool when it builds its
    /// registry.
    fn subject_kind(&self, tool: &str) -> Option<SubjectKind> {
        let _ = tool;
        None
    }

    /// What one call of `tool` with `arguments` (validated) acts on, for a tool with a
    /// [`ToolProvider::subject_kind`]: the command it runs, the paths it touches, resolved as
    /// the call would resolve them. Asked only when a rule with a specifier applies to the
    /// tool. An `Err` says why they cannot be told; the call is then refused.
    fn subjects(&self, tool: &str, arguments: &Value) -> Result<Vec<Subject>, String> {
        let _ = (tool, arguments);
        Ok(Vec::new())
    }

    /// Renames in `arguments` of `tool` the names the provider accepts besides those of its
    /// input schema (other programs' names for the same arguments, such as `file_path` for
    /// `path`) to the schema's names, so that validation, rules on calls, hooks and the cache
    /// see one spelling; the aliases stay out of the schema shown to models. The orchestrator
    /// calls it before it validates a call, and again when before-hooks changed the
    /// arguments (a call relayed as raw text is not renamed). An `Err` says why the
    /// arguments cannot be read so (an alias and its name given with different values); the
    /// call is then refused as invalid arguments. The default renames nothing.
    fn normalize_arguments(&self, tool: &str, arguments: &mut Value) -> Result<(), String> {
        let _ = (tool, arguments);
        Ok(())
    }
    /// Whether what its tools return may depend on the run that calls them, besides the
    /// arguments (state kept per run: a connection or process per run, the files read in
    /// this run), so that a cached output is shared only within one run. `false` (the
    /// default): the same arguments give the same output to every caller.
    fn state_per_run(&self) -> bool {
        false
    }

    /// Run `run_id` has ended (an MCP client's session closed): what the provider keeps
    /// for that run alone (a per-session server process) can go now rather than when it
    /// would have idled out. Must not block; closing may go on in the background. The
    /// default keeps nothing per run.
    fn end_run(&self, run_id: &str) {
        let _ = run_id;
    }

    /// What besides the arguments (and the run, see [`ToolProvider::state_per_run`]) an
    /// output of `tool` depends on for this caller: the values of the caller's request
    /// headers passed on to the service (`passthroughHeaders`, a tenant or a user), so
    /// that a cached output is shared only among callers that sent the same. The cache
    /// keeps only a hash of it. `None` (the default): nothing.
    fn cache_partition(&self, tool: &str, ctx: &CallContext) -> Option<String> {
        let _ = (tool, ctx);
        None
    }

    /// A signal that fires when the tool list changes; `None` when it never does.
    fn tool_list_changes(&self) -> Option<ToolListChanges> {
        None
    }

    /// A signal that fires when the prompt list changes; `None` when it never does.
    fn prompt_list_changes(&self) -> Option<ToolListChanges> {
        None
    }

    /// A signal that fires when the resource list (or the templates) change; `None` when
    /// they never do.
    fn resource_list_changes(&self) -> Option<ToolListChanges> {
        None
    }

    /// The prompts offered now.
    async fn list_prompts(&self) -> Result<Vec<PromptSpec>, ToolError> {
        Ok(Vec::new())
    }

    /// Renders prompt `name` with `arguments` (strings, as MCP passes them).
    async fn get_prompt(
        &self,
        name: &str,
        arguments: JsonObject,
        ctx: &CallContext,
    ) -> Result<Prompt, ToolError> {
        let _ = (arguments, ctx);
        Err(ToolError::UnknownPrompt { name: name.to_owned(), suggestions: Vec::new() })
    }

    /// Values for an argument of one of its prompts or resource templates that start like
    /// what was typed. The default offers none.
    async fn complete(
        &self,
        request: CompletionRequest,
        ctx: &CallContext,
    ) -> Result<Completion, ToolError> {
        let _ = (request, ctx);
        Ok(Completion::default())
    }

    /// The resources offered now (not the ones only reachable through a template).
    async fn list_resources(&self) -> Result<Vec<ResourceSpec>, ToolError> {
        Ok(Vec::new())
    }

    /// The resource templates offered now.
    async fn list_resource_templates(&self) -> Result<Vec<ResourceTemplate>, ToolError> {
        Ok(Vec::new())
    }

    /// Reads the resource at `uri`.
    async fn read_resource(
        &self,
        uri: &str,
        ctx: &CallContext,
    ) -> Result<Vec<ResourceContents>, ToolError> {
        let _ = ctx;
        Err(ToolError::UnknownResource { uri: uri.to_owned() })
    }

    /// Starts sending updates of `uri` through [`ToolProvider::resource_updates`]. The
    /// default accepts any URI the provider lists or reads, as providers whose resources
    /// change announce every change anyway.
    ///
    /// A subscription is one per resource, not one per caller: subscribing to a resource
    /// already subscribed to changes nothing, and one
    /// [`ToolProvider::unsubscribe_resource`] ends it, however many subscribes came
    /// before. A caller serving several subscribers counts them and unsubscribes when the
    /// last one leaves, as an MCP gateway serving several sessions does.
    async fn subscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        let _ = uri;
        Ok(())
    }

    /// Stops sending updates of `uri`, whoever subscribed to it; a resource not
    /// subscribed to is no error.
    async fn unsubscribe_resource(&self, uri: &str) -> Result<(), ToolError> {
        let _ = uri;
        Ok(())
    }

    /// A stream of URIs of resources that changed; `None` when none ever does.
    fn resource_updates(&self) -> Option<ResourceUpdates> {
        None
    }

    /// Whether an update a composite tells of as sent by its provider `source` (a
    /// namespace, [`ResourceUpdate::source`]) is this provider's to pass on. A view of a
    /// composite passes on only those of the providers in view, so that a subscriber of a
    /// URI two providers serve is not told of the one it cannot reach; the default passes
    /// on every one.
    fn passes_updates_from(&self, source: &str) -> bool {
        let _ = source;
        true
    }

    /// How it is doing now, from what it already knows: cheap, it sends no request and
    /// starts nothing (a gateway's `/health` asks it of every provider). The default is
    /// healthy.
    fn health(&self) -> Health {
        Health::ok()
    }

    /// The health of each provider it is made of, by namespace. A provider made of no
    /// others (the default) tells its own, under its namespace; a composite tells its
    /// parts'.
    fn health_by_provider(&self) -> Vec<ProviderHealth> {
        vec![ProviderHealth { namespace: self.namespace().to_owned(), health: self.health() }]
    }
}

/// How a provider is doing: whether its calls can be expected to work, and a few words
/// more. Unauthenticated health probes show it, so the words name states, never URLs,
/// paths, error texts or anything else that may carry a secret.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    /// Whether calls can be expected to work. A provider not started yet is healthy: it
    /// starts on its first call.
    pub ok: bool,
    /// Why it is not healthy, or what else is worth knowing (`not started`, `disabled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Health {
    /// Healthy, nothing more to say.
    pub fn ok() -> Health {
        Health { ok: true, detail: None }
    }

    /// Not healthy, for the reason `detail` gives.
    pub fn unhealthy(detail: impl Into<String>) -> Health {
        Health { ok: false, detail: Some(detail.into()) }
    }

    /// The same, with `detail` said of it.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Health {
        self.detail = Some(detail.into());
        self
    }

    /// The health of a composite of `parts`: healthy when every part is, else naming
    /// the parts that are not.
    pub fn of_parts(parts: &[ProviderHealth]) -> Health {
        let unhealthy: Vec<&str> =
            parts.iter().filter(|p| !p.health.ok).map(|p| p.namespace.as_str()).collect();
        if unhealthy.is_empty() {
            return Health::ok();
        }
        Health::unhealthy(format!("unhealthy: {}", unhealthy.join(", ")))
    }
}

/// One provider's [`Health`] under its namespace: what a composite tells of its parts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProviderHealth {
    /// The provider's namespace.
    pub namespace: String,
    /// How it is doing.
    #[serde(flatten)]
    pub health: Health,
}

/// One resource that changed, and which provider told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceUpdate {
    /// The URI of the resource that changed.
    pub uri: Arc<str>,
    /// The namespace of the provider that sent it, when a composite passed it on from one
    /// of its providers ([`ResourceUpdateNotifier::notify_from`]); `None` when the
    /// notifier's own provider sent it.
    pub source: Option<Arc<str>>,
}

/// The sending side of a resource-updated signal. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ResourceUpdateNotifier(broadcast::Sender<ResourceUpdate>);

impl Default for ResourceUpdateNotifier {
    fn default() -> Self {
        ResourceUpdateNotifier(broadcast::Sender::new(64))
    }
}

impl ResourceUpdateNotifier {
    /// A notifier nobody listens to yet.
    pub fn new() -> Self {
        ResourceUpdateNotifier::default()
    }

    /// Tells every listener that the resource at `uri` changed.
    pub fn notify(&self, uri: &str) {
        self.send(ResourceUpdate { uri: Arc::from(uri), source: None });
    }

    /// Tells every listener that the resource at `uri` of the provider `source` (a
    /// composite's provider, by namespace) changed.
    pub fn notify_from(&self, source: &str, uri: &str) {
        self.send(ResourceUpdate { uri: Arc::from(uri), source: Some(Arc::from(source)) });
    }

    /// Tells every listener of `update` as it is, its source kept (a provider passing on
    /// another's updates).
    pub fn send(&self, update: ResourceUpdate) {
        // No listener is not an error: nobody subscribed.
        let _ = self.0.send(update);
    }

    /// A new listener; it sees updates made after this call.
    pub fn subscribe(&self) -> ResourceUpdates {
        ResourceUpdates { receiver: self.0.subscribe(), keep: None }
    }
}

/// Which sources' updates a [`ResourceUpdates`] passes on.
type SourceFilter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The receiving side of a resource-updated signal.
pub struct ResourceUpdates {
    receiver: broadcast::Receiver<ResourceUpdate>,
    /// When set, updates with a source it refuses are skipped.
    keep: Option<SourceFilter>,
}

impl fmt::Debug for ResourceUpdates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceUpdates").field("filtered", &self.keep.is_some()).finish()
    }
}

impl ResourceUpdates {
    /// The next updated URI; `None` once the provider is gone. A listener that fell
    /// behind skips the updates it missed (a reader re-reads the resource anyway).
    pub async fn next(&mut self) -> Option<Arc<str>> {
        self.next_update().await.map(|update| update.uri)
    }

    /// [`ResourceUpdates::next`], with the provider that sent it.
    pub async fn next_update(&mut self) -> Option<ResourceUpdate> {
        loop {
            match self.receiver.recv().await {
                Ok(update) if self.keeps(&update) => return Some(update),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// These updates, but of the sources `keep` accepts only (by namespace); an update
    /// that names no source is kept. Filters add up: an update passes when every one
    /// accepts its source.
    #[must_use]
    pub fn only_from(mut self, keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.keep = Some(match self.keep.take() {
            Some(earlier) => Arc::new(move |source| earlier(source) && keep(source)),
            None => Arc::new(keep),
        });
        self
    }

    fn keeps(&self, update: &ResourceUpdate) -> bool {
        match (&self.keep, &update.source) {
            (Some(keep), Some(source)) => keep(source),
            _ => true,
        }
    }
}

/// The sending side of a list-changed signal (tools, prompts or resources). Cheap to clone.
#[derive(Debug, Clone)]
pub struct ToolListNotifier(watch::Sender<u64>);

impl Default for ToolListNotifier {
    fn default() -> Self {
        ToolListNotifier(watch::Sender::new(0))
    }
}

impl ToolListNotifier {
    /// A notifier nobody listens to yet.
    pub fn new() -> Self {
        ToolListNotifier::default()
    }

    /// Tells every listener that the list changed.
    pub fn notify(&self) {
        self.0.send_modify(|version| *version += 1);
    }

    /// A new listener; it sees changes made after this call.
    pub fn subscribe(&self) -> ToolListChanges {
        ToolListChanges(self.0.subscribe())
    }
}

/// The receiving side of a list-changed signal (tools, prompts or resources).
#[derive(Debug, Clone)]
pub struct ToolListChanges(watch::Receiver<u64>);

impl ToolListChanges {
    /// Waits for the next change; `false` once the provider is gone and no change can come.
    pub async fn changed(&mut self) -> bool {
        let changed = self.0.changed().await.is_ok();
        self.0.borrow_and_update();
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resource_updates_reach_listeners() {
        let notifier = ResourceUpdateNotifier::new();
        let mut updates = notifier.subscribe();
        notifier.notify("test://a");
        assert_eq!(updates.next().await.as_deref(), Some("test://a"));
        drop(notifier);
        assert_eq!(updates.next().await, None);
    }

    #[tokio::test]
    async fn filtered_updates_skip_the_sources_refused() {
        let notifier = ResourceUpdateNotifier::new();
        let mut updates = notifier.subscribe().only_from(|source| source != "b");
        notifier.notify_from("b", "test://a");
        notifier.notify_from("a", "test://a");
        notifier.notify("test://own");
        let update = updates.next_update().await.expect("an update");
        assert_eq!((&*update.uri, update.source.as_deref()), ("test://a", Some("a")));
        assert_eq!(updates.next().await.as_deref(), Some("test://own"));
        let mut narrower = notifier.subscribe().only_from(|s| s != "b").only_from(|s| s != "a");
        notifier.notify_from("a", "test://a");
        notifier.notify_from("c", "test://c");
        assert_eq!(narrower.next().await.as_deref(), Some("test://c"));
    }

    #[test]
    fn a_composite_is_healthy_when_every_part_is() {
        let part = |namespace: &str, health: Health| ProviderHealth {
            namespace: namespace.to_owned(),
            health,
        };
        assert_eq!(Health::of_parts(&[]), Health::ok());
        let parts = [
            part("fs", Health::ok()),
            part("github", Health::unhealthy("connection closed")),
            part("lazy", Health::ok().with_detail("not started")),
            part("web", Health::unhealthy("failed to start")),
        ];
        assert_eq!(Health::of_parts(&parts[..1]), Health::ok());
        assert_eq!(Health::of_parts(&parts), Health::unhealthy("unhealthy: github, web"));
        expect_test::expect![[r#"{"namespace":"github","ok":false,"detail":"connection closed"}"#]]
            .assert_eq(&serde_json::to_string(&parts[1]).unwrap_or_default());
    }

    #[tokio::test]
    async fn notifier_wakes_listeners() {
        let notifier = ToolListNotifier::new();
        let mut changes = notifier.subscribe();
        notifier.notify();
        assert!(changes.changed().await);
        drop(notifier);
        assert!(!changes.changed().await);
    }
}
