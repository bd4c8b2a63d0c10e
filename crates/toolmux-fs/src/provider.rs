//! [`FsProvider`]: the tools behind the [`ToolProvider`] interface, filtered by permission.

use crate::config::{FsConfig, Permission};
use crate::error::FsError;
use crate::protect::{ProtectedKind, ProtectedPath, Protection};
use crate::sandbox::Sandbox;
use crate::tools::{self, edit, glob, grep, ls, patch, read, shell, tasks, undo, write};
use crate::workspace::Workspace;
use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use toolmux_core::{
    CallContext, Subject, SubjectKind, ToolAnnotations, ToolError, ToolKind, ToolOutput,
    ToolProvider, ToolSpec, schema_for,
};

/// The builtin file and shell tools, confined beneath a workspace root.
///
/// Tools of permission classes not switched on in [`FsConfig::permissions`] are not
/// listed, and calling one by name is refused with a message naming the configuration key.
#[derive(Debug)]
pub struct FsProvider {
    namespace: String,
    config: Arc<FsConfig>,
    workspace: Arc<Workspace>,
    specs: Vec<(Tool, ToolSpec)>,
    /// Background tasks of `bash` and `exec`.
    tasks: Arc<tasks::Tasks>,
    /// The OS sandbox of `bash` and `exec`.
    sandbox: Sandbox,
}

/// Every tool, in listing order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    Read,
    Write,
    Edit,
    MultiEdit,
    ApplyPatch,
    Undo,
    Grep,
    Glob,
    Ls,
    Bash,
    Exec,
    TaskOutput,
    TaskWriteStdin,
    TaskKill,
    TaskList,
}

const ALL: [Tool; 15] = [
    Tool::Read,
    Tool::Write,
    Tool::Edit,
    Tool::MultiEdit,
    Tool::ApplyPatch,
    Tool::Undo,
    Tool::Grep,
    Tool::Glob,
    Tool::Ls,
    Tool::Bash,
    Tool::Exec,
    Tool::TaskOutput,
    Tool::TaskWriteStdin,
    Tool::TaskKill,
    Tool::TaskList,
];

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Read => "read",
            Tool::Write => "write",
            Tool::Edit => "edit",
            Tool::MultiEdit => "multi_edit",
            Tool::ApplyPatch => "apply_patch",
            Tool::Undo => "undo",
            Tool::Grep => "grep",
            Tool::Glob => "glob",
            Tool::Ls => "ls",
            Tool::Bash => "bash",
            Tool::Exec => "exec",
            Tool::TaskOutput => "task_output",
            Tool::TaskWriteStdin => "task_write_stdin",
            Tool::TaskKill => "task_kill",
            Tool::TaskList => "task_list",
        }
    }

    fn from_name(name: &str) -> Option<Tool> {
        ALL.into_iter().find(|t| t.name() == name)
    }

    fn permission(self) -> Permission {
        match self {
            Tool::Read | Tool::Grep | Tool::Glob | Tool::Ls => Permission::Read,
            Tool::Write | Tool::Edit | Tool::MultiEdit | Tool::ApplyPatch | Tool::Undo => {
                Permission::Write
            }
            Tool::Bash
            | Tool::Exec
            | Tool::TaskOutput
            | Tool::TaskWriteStdin
            | Tool::TaskKill
            | Tool::TaskList => Permission::Execute,
        }
    }

    /// Its specification; `sandbox` is the sentence about the shell tools' sandbox, `ns` the
    /// namespace the tools are listed in, which its description names other tools in.
    fn spec(self, sandbox: &str, ns: &str) -> ToolSpec {
        let (description, schema): (String, _) = match self {
            Tool::Read => (read::description(ns), schema_for::<read::ReadArgs>()),
            Tool::Write => (write::description(ns), schema_for::<write::WriteArgs>()),
            Tool::Edit => (edit::edit_description(ns), schema_for::<edit::EditArgs>()),
            Tool::MultiEdit => {
                (edit::multi_edit_description(ns), schema_for::<edit::MultiEditArgs>())
            }
            Tool::ApplyPatch => (patch::DESCRIPTION.into(), schema_for::<patch::ApplyPatchArgs>()),
            Tool::Undo => (undo::description(ns), schema_for::<undo::UndoArgs>()),
            Tool::Grep => (grep::DESCRIPTION.into(), schema_for::<grep::GrepArgs>()),
            Tool::Glob => (glob::DESCRIPTION.into(), schema_for::<glob::GlobArgs>()),
            Tool::Ls => (ls::DESCRIPTION.into(), schema_for::<ls::LsArgs>()),
            Tool::Bash => (shell::bash_description(sandbox, ns), schema_for::<shell::BashArgs>()),
            Tool::Exec => (shell::exec_description(sandbox, ns), schema_for::<shell::ExecArgs>()),
            Tool::TaskOutput => {
                (tasks::output_description(ns), schema_for::<tasks::TaskOutputArgs>())
            }
            Tool::TaskWriteStdin => {
                (tasks::write_stdin_description(ns), schema_for::<tasks::TaskWriteStdinArgs>())
            }
            Tool::TaskKill => (tasks::KILL_DESCRIPTION.into(), schema_for::<tasks::TaskKillArgs>()),
            Tool::TaskList => (tasks::LIST_DESCRIPTION.into(), schema_for::<tasks::TaskListArgs>()),
        };
        let class = self.permission().as_class();
        let annotations = match self.permission() {
            Permission::Read => ToolAnnotations::read_only(),
            Permission::Write => ToolAnnotations {
                read_only: false,
                destructive: true,
                idempotent: self == Tool::Write,
                open_world: false,
                permission: Some(class),
                ..ToolAnnotations::default()
            },
            // Reading a task's output takes it (a second read shows what came after), so
            // it is neither read-only (never cached) nor idempotent; it changes nothing
            // else.
            Permission::Execute if matches!(self, Tool::TaskOutput | Tool::TaskList) => {
                ToolAnnotations {
                    read_only: false,
                    destructive: false,
                    idempotent: false,
                    open_world: false,
                    permission: Some(class),
                    ..ToolAnnotations::default()
                }
            }
            Permission::Execute => ToolAnnotations {
                read_only: false,
                destructive: true,
                idempotent: false,
                open_world: self != Tool::TaskKill,
                permission: Some(class),
                ..ToolAnnotations::default()
            },
        };
        let mut schema = schema;
        name_tools_in_schema(&mut schema, ns);
        ToolSpec::new(self.name(), description, schema).with_annotations(annotations)
    }
}

/// `schema` with the tools its descriptions name (doc comments, which cannot hold the
/// namespace) named as a model calls them, `fs__read` in `fs`. `glob` is also one of
/// `grep`'s parameters, so it is left as it is.
fn name_tools_in_schema(schema: &mut Value, ns: &str) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match value {
                    Value::String(text) if key == "description" => {
                        for tool in ALL.into_iter().filter(|t| *t != Tool::Glob) {
                            let bare = format!("`{}`", tool.name());
                            if text.contains(&bare) {
                                *text = text.replace(&bare, &format!("`{ns}__{}`", tool.name()));
                            }
                        }
                    }
                    _ => name_tools_in_schema(value, ns),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| name_tools_in_schema(item, ns)),
        _ => {}
    }
}

/// The sandbox of commands run for `config` beneath `root` (canonical), keeping from them
/// what the file tools keep from the model: `config`'s protected paths (toolmux's own
/// files) and, unless `protectAgentFiles` is off, other agents' settings, read-only or
/// hidden, and what the `protect` and `hide` lines match; with the protection the file
/// tools check. `bash` and the command tools ([`crate::CommandTools`]) share it.
pub(crate) fn guarded_sandbox(
    config: &FsConfig,
    root: &Path,
) -> Result<(Sandbox, Protection), FsError> {
    let mut own = config.protected.clone();
    if config.protect_agent_files {
        let agent = |path| ProtectedPath::new(path, ProtectedKind::AgentConfig);
        own.extend(crate::protect::AGENT_FILES.into_iter().map(agent));
    }
    let protection =
        Protection::new(root, &own, &config.protect)?.with_hidden(root, &config.hide)?;
    let protected: Vec<_> = own
        .iter()
        .map(|p| crate::sandbox::ServerPath {
            path: crate::protect::resolve_ambient(&root.join(&p.path)),
            hidden: !p.kind.readable(),
            folder: p.kind == ProtectedKind::OutputDir,
        })
        .collect();
    let (protect, hide) = (protection.protect_globs().clone(), protection.hidden_globs().clone());
    let mut sandbox =
        Sandbox::new(&config.bash.sandbox, root, &protected)?.with_user_globs(root, protect, hide);
    sandbox = keeping_spill_dir(sandbox, config.bash.spill_dir.as_deref());
    Ok((sandbox, protection))
}

/// `sandbox` keeping the spill directory `configured` names (`bash.spillDir`, else this
/// user's own) read-only to commands, instead of one it kept before; the directory is
/// made now. One that cannot be made now says why at the first spill, and `sandbox` is
/// returned as it was.
pub(crate) fn keeping_spill_dir(sandbox: Sandbox, configured: Option<&Path>) -> Sandbox {
    match tools::spill::directory(configured) {
        Ok(spill) => sandbox.with_spill_dir(
            configured.map(Path::to_path_buf),
            crate::protect::resolve_ambient(&spill),
        ),
        Err(_) => sandbox,
    }
}

/// The spec of every tool, listed in `namespace`.
fn specs(config: &FsConfig, sandbox: &Sandbox, namespace: &str) -> Vec<(Tool, ToolSpec)> {
    let own = Duration::from_millis(config.bash.max_timeout_ms.max(config.bash.default_timeout_ms));
    ALL.into_iter()
        .map(|t| {
            let spec = t.spec(sandbox.description(), namespace);
            // A command ends at its own `timeout` with its output so far: the pipeline
            // must not cut it off first.
            let spec = match t {
                Tool::Bash | Tool::Exec => spec.with_time_limit(own + shell::ANSWER_MARGIN),
                _ => spec,
            };
            (t, spec)
        })
        .collect()
}

impl FsProvider {
    /// The tools configured by `config`, in namespace `fs`. Fails when the root is not an
    /// absolute path to a directory.
    pub fn new(mut config: FsConfig) -> Result<FsProvider, FsError> {
        // Resolved once, now: spills follow no symlink on its way later.
        config.bash.spill_dir = config.bash.spill_dir.as_deref().map(tools::spill::resolved);
        let workspace = Workspace::open(&config.root)?;
        let (sandbox, protection) = guarded_sandbox(&config, workspace.root())?;
        let workspace = workspace.with_protection(protection);
        let namespace = "fs".to_owned();
        let specs = specs(&config, &sandbox, &namespace);
        Ok(FsProvider {
            namespace,
            config: Arc::new(config),
            workspace: Arc::new(workspace),
            specs,
            tasks: Arc::new(tasks::Tasks::default()),
            sandbox,
        })
    }

    /// Lists the tools under another namespace; their descriptions name each other in it.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self.specs = specs(&self.config, &self.sandbox, &self.namespace);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    /// The canonical workspace root.
    pub fn root(&self) -> &Path {
        self.workspace.root()
    }

    /// Where the path `given` leads, for permission rules.
    fn path_subject(&self, given: &str) -> Result<Subject, String> {
        let resolved = self.workspace.resolve(given).map_err(|e| e.to_string())?;
        let target = self.workspace.resolve_target(&resolved);
        let mut parts = Vec::new();
        for part in target.components() {
            match part {
                Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
                Component::CurDir => {}
                _ => return Err(format!("path `{given}` leads outside the workspace")),
            }
        }
        Ok(Subject::Path(if parts.is_empty() { ".".to_owned() } else { parts.join("/") }))
    }

    fn enabled(&self, tool: Tool) -> bool {
        self.config.permissions.contains(&tool.permission())
    }

    async fn dispatch(
        &self,
        tool: Tool,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, FsError> {
        if !self.enabled(tool) {
            return Err(FsError::Disabled {
                tool: tool.name().into(),
                class: tool.permission().as_str(),
            });
        }
        if ctx.is_cancelled() {
            return Err(FsError::Cancelled { tool: tool.name() });
        }
        let run = ctx.run_id().to_owned();
        match tool {
            Tool::Read => {
                let args: read::ReadArgs = parse(tool, arguments)?;
                let may_repeat = !ctx.is_from_person();
                // Only the call's own time limit bounds the scan to a page: it ends a little
                // before, to say how far it came.
                let deadline = ctx.deadline().map(tokio::time::Instant::into_std);
                let budget = tools::Budget::new(Duration::from_secs(24 * 3600), deadline);
                self.blocking(tool, ctx, move |ws, config, cancelled| {
                    let stop = read::Stop { cancelled, budget: &budget };
                    read::read(ws, &config.limits, &run, args, may_repeat, stop)
                })
                .await
            }
            Tool::Grep => {
                let args: grep::GrepArgs = parse(tool, arguments)?;
                let budget = self.search_budget(ctx);
                self.blocking(tool, ctx, move |ws, config, cancelled| {
                    grep::grep(ws, &config.limits, args, cancelled, &budget)
                })
                .await
            }
            Tool::Glob => {
                let args: glob::GlobArgs = parse(tool, arguments)?;
                let budget = self.search_budget(ctx);
                self.blocking(tool, ctx, move |ws, config, cancelled| {
                    glob::glob(ws, &config.limits, args, cancelled, &budget)
                })
                .await
            }
            Tool::Ls => {
                let args: ls::LsArgs = parse(tool, arguments)?;
                self.blocking(tool, ctx, move |ws, config, cancelled| {
                    ls::ls(ws, &config.limits, args, cancelled)
                })
                .await
            }
            // Writes are not raced against cancellation: once started, a write finishes
            // (it is atomic and quick), so its outcome is never in doubt.
            Tool::Write => {
                let args: write::WriteArgs = parse(tool, arguments)?;
                // A person writing with `toolmux tools call` has no read to show for it.
                let require_read = !ctx.is_from_person();
                self.blocking_to_end(tool, move |ws, config| {
                    write::write(ws, &config.limits, &run, args, require_read)
                })
                .await
            }
            Tool::Edit => {
                let args: edit::EditArgs = parse(tool, arguments)?;
                self.blocking_to_end(tool, move |ws, config| {
                    edit::edit(ws, &config.limits, &run, args)
                })
                .await
            }
            Tool::MultiEdit => {
                let args: edit::MultiEditArgs = parse(tool, arguments)?;
                self.blocking_to_end(tool, move |ws, config| {
                    edit::multi_edit(ws, &config.limits, &run, args)
                })
                .await
            }
            Tool::ApplyPatch => {
                let args: patch::ApplyPatchArgs = parse(tool, arguments)?;
                self.blocking_to_end(tool, move |ws, config| {
                    patch::apply_patch(ws, &config.limits, &run, args)
                })
                .await
            }
            Tool::Undo => {
                let args: undo::UndoArgs = parse(tool, arguments)?;
                self.blocking_to_end(tool, move |ws, _| undo::undo(ws, &run, args)).await
            }
            Tool::Bash => {
                let args: shell::BashArgs = parse(tool, arguments)?;
                let program = shell::Program::Shell(args.command);
                let how = Launch {
                    workdir: args.workdir,
                    timeout: args.timeout,
                    background: args.run_in_background,
                    keep_stdin: args.keep_stdin,
                    tty: args.tty,
                };
                self.launch(tool, program, how, ctx).await
            }
            Tool::Exec => {
                let args: shell::ExecArgs = parse(tool, arguments)?;
                if args.argv.is_empty() {
                    return Err(FsError::InvalidArguments {
                        tool: "exec",
                        message: "`argv` is empty: give the program and its arguments".into(),
                    });
                }
                let program = shell::Program::Argv(args.argv);
                let how = Launch {
                    workdir: args.workdir,
                    timeout: args.timeout,
                    background: args.run_in_background,
                    keep_stdin: args.keep_stdin,
                    tty: args.tty,
                };
                self.launch(tool, program, how, ctx).await
            }
            Tool::TaskOutput => {
                let args: tasks::TaskOutputArgs = parse(tool, arguments)?;
                self.tasks.output(&self.config.bash, args, &run, ctx.cancel_token()).await
            }
            Tool::TaskWriteStdin => {
                let args: tasks::TaskWriteStdinArgs = parse(tool, arguments)?;
                self.tasks.write_stdin(&self.config.bash, args, &run, ctx.cancel_token()).await
            }
            Tool::TaskKill => {
                let args: tasks::TaskKillArgs = parse(tool, arguments)?;
                self.tasks.kill(&self.config.bash, args, &run).await
            }
            Tool::TaskList => {
                let _: tasks::TaskListArgs = parse(tool, arguments)?;
                // What running tasks made so far is moved aside before their status is
                // given, as a read of one's output does (and walking as rarely); each note
                // comes with its next read.
                self.sandbox.check_tasks_for_read().await;
                Ok(self.tasks.list(&run))
            }
        }
    }

    /// The folder a command runs in: `workdir` (relative to the root, or absolute inside
    /// it) where it leads after links and `..`, which must be a folder beneath the root and
    /// not one kept from agents (`hide`); the root without it.
    fn workdir(&self, tool: Tool, given: Option<&str>) -> Result<PathBuf, FsError> {
        let Some(given) = given.filter(|g| !g.trim().is_empty()) else {
            return Ok(self.workspace.root().to_path_buf());
        };
        let resolved = self.workspace.resolve(given)?;
        let dir =
            self.workspace.walk_start(&resolved).map_err(|e| self.workspace.with_close_path(e))?;
        // Not a folder the file tools may not read (the audit log's, the outputs'): the
        // sandbox hides those from commands too.
        self.workspace.check_read(&resolved, &self.workspace.canonical(&resolved)?)?;
        if !dir.is_dir() {
            return Err(FsError::InvalidArguments {
                tool: tool.name(),
                message: format!(
                    "`workdir` `{given}` is not a folder; give a folder beneath the root"
                ),
            });
        }
        Ok(dir)
    }

    /// Starts `program` in `dir` as a background task of the call's run.
    /// Runs `program` of `bash` or `exec` as `how` says: in the foreground, or as a
    /// background task.
    async fn launch(
        &self,
        tool: Tool,
        program: shell::Program,
        how: Launch,
        ctx: &CallContext,
    ) -> Result<ToolOutput, FsError> {
        let dir = self.workdir(tool, how.workdir.as_deref())?;
        if how.background {
            shell::check_allowed(&self.config.bash, &program, &self.namespace)?;
            self.sandbox.find_user_paths(&program.label()).await?;
            return self.background(tool, program, &dir, &how, ctx).await;
        }
        if how.tty {
            return Err(FsError::InvalidArguments {
                tool: tool.name(),
                message: format!(
                    "`tty` needs `run_in_background: true`: a terminal is for a task that \
                     takes input with `{}__task_write_stdin`",
                    self.namespace
                ),
            });
        }
        if how.keep_stdin {
            return Err(FsError::InvalidArguments {
                tool: tool.name(),
                message: "`keep_stdin` needs `run_in_background: true`: a command in the \
                          foreground gets no input"
                    .into(),
            });
        }
        self.shell(tool, program, &dir, how.timeout, ctx).await
    }

    async fn background(
        &self,
        tool: Tool,
        program: shell::Program,
        dir: &Path,
        how: &Launch,
        ctx: &CallContext,
    ) -> Result<ToolOutput, FsError> {
        let name = tool.name();
        let config = &self.config.bash;
        shell::check_allowed(config, &program, &self.namespace)?;
        let lifetime = shell::background_timeout(config, name, how.timeout)?;
        let start = tasks::Start {
            config,
            sandbox: &self.sandbox,
            root: dir,
            tool: name,
            namespace: &self.namespace,
            lifetime,
            run: ctx.run_id(),
            keep_stdin: how.keep_stdin,
            tty: how.tty,
        };
        self.tasks.start(start, program).await
    }

    async fn shell(
        &self,
        tool: Tool,
        program: shell::Program,
        dir: &Path,
        timeout: Option<u64>,
        ctx: &CallContext,
    ) -> Result<ToolOutput, FsError> {
        let name = tool.name();
        shell::check_allowed(&self.config.bash, &program, &self.namespace)?;
        let limit = shell::timeout(&self.config.bash, name, timeout)?;
        self.sandbox.find_user_paths(&program.label()).await?;
        shell::run(&self.config.bash, &self.sandbox, dir, name, program, limit, ctx.cancel_token())
            .await
    }

    /// Runs `work` on the blocking pool; cancellation, or the returned future dropped, sets
    /// the flag `work` polls, and a cancellation returns at once.
    async fn blocking<F>(
        &self,
        tool: Tool,
        ctx: &CallContext,
        work: F,
    ) -> Result<ToolOutput, FsError>
    where
        F: FnOnce(&Workspace, &FsConfig, &Arc<AtomicBool>) -> Result<ToolOutput, FsError>
            + Send
            + 'static,
    {
        let cancelled = Arc::new(AtomicBool::new(false));
        // A call whose future is dropped before the work ends (the pipeline's timeout, a
        // client gone) stops it as a cancellation does: it kept reading and using a core
        // for as long as the work took, after the caller had its answer.
        let _stop = CancelOnDrop(cancelled.clone());
        let (ws, config, flag) = (self.workspace.clone(), self.config.clone(), cancelled.clone());
        let task = tokio::task::spawn_blocking(move || {
            work(&ws, &config, &flag).map_err(|e| ws.with_close_path(e))
        });
        tokio::select! {
            joined = task => joined.unwrap_or_else(|e| Err(panicked(tool, e))),
            () = ctx.cancel_token().cancelled() => {
                cancelled.store(true, Ordering::Relaxed);
                Err(FsError::Cancelled { tool: tool.name() })
            }
        }
    }

    /// The time a `grep` or `glob` walk may take: `fs.limits.searchTimeMs`, ending before
    /// the call's own deadline so that what was found gets back.
    fn search_budget(&self, ctx: &CallContext) -> tools::Budget {
        let allowed = Duration::from_millis(self.config.limits.search_time_ms);
        tools::Budget::new(allowed, ctx.deadline().map(tokio::time::Instant::into_std))
    }

    /// Runs `work` on the blocking pool to its end.
    async fn blocking_to_end<F>(&self, tool: Tool, work: F) -> Result<ToolOutput, FsError>
    where
        F: FnOnce(&Workspace, &FsConfig) -> Result<ToolOutput, FsError> + Send + 'static,
    {
        let (ws, config) = (self.workspace.clone(), self.config.clone());
        tokio::task::spawn_blocking(move || work(&ws, &config).map_err(|e| ws.with_close_path(e)))
            .await
            .unwrap_or_else(|e| Err(panicked(tool, e)))
    }
}

/// Sets its flag when dropped: the work polling it stops at its next check.
#[derive(Debug)]
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn panicked(tool: Tool, e: tokio::task::JoinError) -> FsError {
    FsError::Panicked { tool: tool.name(), message: e.to_string() }
}

fn parse<T: DeserializeOwned>(tool: Tool, arguments: Value) -> Result<T, FsError> {
    serde_json::from_value(arguments)
        .map_err(|e| FsError::InvalidArguments { tool: tool.name(), message: e.to_string() })
}

#[async_trait]
impl ToolProvider for FsProvider {
    fn kind(&self) -> ToolKind {
        ToolKind::Builtin
    }

    /// A read is recorded for its run (writing a file needs it read in the run first): a
    /// read served from another run's cached output would leave this run without it.
    fn state_per_run(&self) -> bool {
        true
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    async fn list_tools(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(self
            .specs
            .iter()
            .filter(|(tool, _)| self.enabled(*tool))
            .map(|(_, spec)| spec.clone())
            .collect())
    }

    async fn has_tool(&self, name: &str) -> bool {
        Tool::from_name(name).is_some_and(|tool| self.enabled(tool))
    }

    async fn call(
        &self,
        name: &str,
        arguments: Value,
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let full = format!("{}__{name}", self.namespace);
        let Some(tool) = Tool::from_name(name) else {
            let suggestions = ALL
                .into_iter()
                .filter(|t| {
                    self.enabled(*t) && (t.name().contains(name) || name.contains(t.name()))
                })
                .map(|t| format!("{}__{}", self.namespace, t.name()))
                .collect();
            return Err(ToolError::UnknownTool { name: full, suggestions });
        };
        // The orchestrator has renamed them already; a caller of the provider itself has not.
        let mut arguments = arguments;
        crate::aliases::normalize(name, &mut arguments)
            .map_err(|message| ToolError::invalid_arguments(&full, message))?;
        self.dispatch(tool, arguments, ctx).await.map_err(|e| e.into_tool_error(&full))
    }

    /// The seed engine's names (`filePath`, `oldString`, `newString`, `replaceAll`,
    /// `context`, `headLimit`, `outputMode`) and Claude Code's `file_path`, so that callers
    /// and hooks written for them work unchanged.
    fn normalize_arguments(&self, tool: &str, arguments: &mut Value) -> Result<(), String> {
        crate::aliases::normalize(tool, arguments)
    }

    async fn shutdown(&self) -> Result<(), ToolError> {
        self.tasks.shutdown().await;
        Ok(())
    }

    fn subject_kind(&self, tool: &str) -> Option<SubjectKind> {
        match Tool::from_name(tool)? {
            Tool::Bash | Tool::Exec => Some(SubjectKind::Command),
            Tool::TaskOutput | Tool::TaskWriteStdin | Tool::TaskKill | Tool::TaskList => None,
            _ => Some(SubjectKind::Path),
        }
    }

    /// The command of `bash` and `exec`; the path of every file tool, where it leads
    /// (symlinks and `..` resolved as the call will resolve them), so that a rule on
    /// `secrets/**` is not dodged through a link to it. `grep`, `glob` and `ls` act on the
    /// directory they search (the root when none is given), not on each file found.
    fn subjects(&self, tool: &str, arguments: &Value) -> Result<Vec<Subject>, String> {
        let Some(tool) = Tool::from_name(tool) else { return Ok(Vec::new()) };
        let text = |key: &str| arguments.get(key).and_then(Value::as_str);
        match tool {
            Tool::Bash => {
                Ok(text("command").map(|c| Subject::Command(c.to_owned())).into_iter().collect())
            }
            Tool::Exec => {
                let argv =
                    arguments.get("argv").and_then(Value::as_array).ok_or("`argv` is missing")?;
                let argv = argv
                    .iter()
                    .map(|a| {
                        a.as_str()
                            .map(str::to_owned)
                            .ok_or("`argv` holds a value that is not a string")
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(vec![Subject::Argv(argv)])
            }
            Tool::TaskOutput | Tool::TaskWriteStdin | Tool::TaskKill | Tool::TaskList => {
                Ok(Vec::new())
            }
            // Every file the patch adds, deletes, changes or moves to.
            Tool::ApplyPatch => {
                let input = text("input").or_else(|| text("patch")).ok_or("`input` is missing")?;
                patch::paths(input)?.iter().map(|given| self.path_subject(given)).collect()
            }
            _ => Ok(vec![self.path_subject(text("path").unwrap_or("."))?]),
        }
    }

    fn instructions(&self) -> Option<String> {
        Some(format!(
            "File tools work beneath the workspace root {}; paths are relative to it (or \
             absolute inside it). Read a file before overwriting it with write.",
            self.workspace.root().display()
        ))
    }
}

/// How `bash` or `exec` runs its program.
struct Launch {
    workdir: Option<String>,
    timeout: Option<u64>,
    background: bool,
    keep_stdin: bool,
    tty: bool,
}
