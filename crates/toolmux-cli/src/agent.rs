//! `toolmux agent`: run an agent on a task, list the agents.

use crate::args::{ChatArgs, ListenArgs, ResumeArgs, RunArgs};
use crate::commands::{Interruptible, finish, print, refuse, start};
use crate::exit;
use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use toolmux::config::Loaded;
use toolmux::toolmux_agent::{
    AgentReport, AgentStatus, Decision, PendingCall, RunOptions, TextDelta, TextSink,
};
use toolmux::toolmux_core::{CallContext, ProgressSink};

pub(crate) fn list(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    let agents = &loaded.config.agents;
    if json {
        let list: Vec<_> = agents
            .iter()
            .map(|(name, agent)| {
                serde_json::json!({
                    "name": name,
                    "model": agent.model,
                    "description": agent.description,
                    "tools": agent.tools,
                    "agents": agent.agents,
                })
            })
            .collect();
        print(&serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    if agents.is_empty() {
        eprintln!("no agents are configured: add one under `agents`, its model under `models`");
        return Ok(0);
    }
    let width = agents.keys().map(String::len).max().unwrap_or(0);
    let mut out = String::new();
    for (name, agent) in agents {
        let tools = match &agent.tools {
            Some(patterns) => patterns.join(","),
            None => "*".to_owned(),
        };
        let model = if agent.model.is_empty() { "(its caller's)" } else { &agent.model };
        out.push_str(&format!("{name:width$}  {model}  tools {tools}"));
        if !agent.agents.is_empty() {
            out.push_str(&format!("  agents {}", agent.agents.join(",")));
        }
        if !agent.description.is_empty() {
            out.push_str(&format!("  {}", agent.description));
        }
        out.push('\n');
    }
    print(out.trim_end());
    Ok(0)
}

/// The terminal's stderr as `agent run` writes to it: the agents' text as it streams in,
/// and whole lines (each turn's calls) that begin on a line of their own.
#[derive(Debug, Default)]
struct Screen {
    state: Mutex<ScreenState>,
}

#[derive(Debug, Default)]
struct ScreenState {
    /// The cursor is not at the start of a line.
    mid_line: bool,
    /// The text written since the last turn that called tools: the answer, if the run ends
    /// with it.
    turn_text: String,
}

impl Screen {
    fn state(&self) -> std::sync::MutexGuard<'_, ScreenState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A line of its own; the turn's text so far was not the answer.
    fn line(&self, line: &str) {
        let mut state = self.state();
        let mut stderr = std::io::stderr().lock();
        let start = if state.mid_line { "\n" } else { "" };
        let _ = writeln!(stderr, "{start}{}", crate::commands::for_stderr(line));
        state.mid_line = false;
        state.turn_text.clear();
    }

    fn text(&self, delta: TextDelta<'_>) {
        let mut state = self.state();
        let mut stderr = std::io::stderr().lock();
        match delta {
            TextDelta::Text(text) => {
                // The model's words, shown, never acted on by the terminal.
                let _ = write!(stderr, "{}", crate::commands::for_stderr(text));
                let _ = stderr.flush();
                state.mid_line = !text.ends_with('\n');
                state.turn_text.push_str(text);
            }
            TextDelta::Restart => {
                let start = if state.mid_line { "\n" } else { "" };
                let _ = writeln!(
                    stderr,
                    "{start}(the model's answer starts over: its request is tried again)"
                );
                state.mid_line = false;
                state.turn_text.clear();
            }
            _ => {}
        }
    }

    /// Ends the line written last; the text of the last turn.
    fn end(&self) -> String {
        let mut state = self.state();
        if state.mid_line {
            eprintln!();
            state.mid_line = false;
        }
        std::mem::take(&mut state.turn_text)
    }
}

/// Whether agent `name` is configured; if not, says so and which are (with `json`, in
/// JSON on stdout too: [`refuse`]).
fn configured(loaded: &Loaded, name: &str, json: bool) -> bool {
    if loaded.config.agents.contains_key(name) {
        return true;
    }
    let known: Vec<&str> = loaded.config.agents.keys().map(String::as_str).collect();
    let message = if known.is_empty() {
        format!(
            "no agents are configured: add `{name}` under `agents` (and its model under `models`)"
        )
    } else {
        format!("unknown agent `{name}`; configured: {}", known.join(", "))
    };
    refuse(json, exit::CONFIG, &message);
    false
}

/// A run's context and options for a person at the terminal: the agents' text as it
/// streams in and each turn's calls (when stderr is a terminal), and, with `questions`,
/// the person answering approvals and questions.
fn at_terminal(
    mut ctx: CallContext,
    transcript: bool,
    questions: Option<&Arc<crate::terminal::Terminal>>,
    screen: &Arc<Screen>,
) -> (CallContext, RunOptions) {
    let mut options = RunOptions { transcript, ..RunOptions::default() };
    if std::io::stderr().is_terminal() {
        let lines = screen.clone();
        ctx = ctx.with_progress(ProgressSink::new(move |progress| {
            if let Some(message) = progress.message {
                lines.line(&format!("· {message}"));
            }
        }));
        let waits = screen.clone();
        crate::waits::show_with(move |line| waits.line(&format!("· {line}")));
        let text = screen.clone();
        options.on_text = Some(TextSink::new(move |_agent, delta| text.text(delta)));
        if let Some(person) = questions {
            ctx = ctx.with_handler(person.clone());
        }
    }
    (ctx, options)
}

/// Prints `report`'s answer on stdout, unless the person has just read it on the same
/// terminal as it streamed (`shown`); a pipe or a file gets it whole.
fn print_answer(report: &AgentReport, shown: &str) {
    let read_already = std::io::stdout().is_terminal()
        && !shown.trim().is_empty()
        && shown.trim() == report.text().trim();
    if !read_already {
        print(&report.text());
    }
}

/// Tells on stderr of the results of asynchronous calls that arrived and that the agent
/// did not read before its run ended ([`AgentReport::unread_results`]): one line each, with
/// the tool, the call's id and the start of its result. They are nowhere else (the inbox
/// gives each once), so a person who sees only the answer must be told; `--json` gives
/// them whole. The report's results are redacted already.
fn print_unread(report: &AgentReport) {
    let count = report.unread_results.len();
    if count == 0 {
        return;
    }
    eprintln!(
        "{} arrived that agent `{}` did not read before its run ended (`--json` shows {}):",
        if count == 1 { "1 result".to_owned() } else { format!("{count} results") },
        report.agent,
        if count == 1 { "it whole" } else { "them whole" },
    );
    for result in &report.unread_results {
        let text = |key: &str| result.get(key).and_then(serde_json::Value::as_str).unwrap_or("?");
        let output = match result.get("result") {
            Some(serde_json::Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let failed = result.get("isError").and_then(serde_json::Value::as_bool) == Some(true);
        let line = format!(
            "  {} (call {}){}: {}",
            text("tool"),
            text("callId"),
            if failed { ", failed" } else { "" },
            preview(&output, UNREAD_PREVIEW_CHARS)
        );
        eprintln!("{}", crate::commands::for_stderr(&line));
    }
}

/// How many characters of an unread result [`print_unread`] shows.
const UNREAD_PREVIEW_CHARS: usize = 80;

/// The start of `text` on one line: its whitespace runs (line breaks too) as one space, cut
/// after `chars` characters (never inside one) with `...` when there was more.
fn preview(text: &str, chars: usize) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let one_line = words.join(" ");
    match one_line.char_indices().nth(chars) {
        Some((cut, _)) => format!("{}...", one_line[..cut].trim_end()),
        None => one_line,
    }
}

pub(crate) async fn run(loaded: &Loaded, args: RunArgs) -> anyhow::Result<u8> {
    if !configured(loaded, &args.name, args.json) {
        return Ok(exit::CONFIG);
    }
    let from_stdin = matches!(args.task.as_deref(), None | Some("-"));
    let task = match args.task.as_deref() {
        Some(task) if task != "-" => task.to_owned(),
        _ if std::io::stdin().is_terminal() => {
            let message = "give the task as an argument, or pipe it to stdin";
            return Ok(refuse(args.json, exit::CONFIG, message));
        }
        _ => {
            let bytes =
                match crate::files::read_bounded(std::io::stdin().lock(), crate::files::TASK) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        let message = format!("cannot read the task from stdin: {e}");
                        return Ok(refuse(args.json, exit::CONFIG, &message));
                    }
                };
            match String::from_utf8(bytes) {
                Ok(task) => task,
                Err(_) => {
                    let message = "the task on stdin is not UTF-8 text: give the task as text";
                    return Ok(refuse(args.json, exit::CONFIG, message));
                }
            }
        }
    };
    if task.trim().is_empty() {
        return Ok(refuse(args.json, exit::CONFIG, "the task is empty"));
    }
    if let Some(file) = &args.pause_to
        && file.exists()
    {
        let message = format!(
            "{} exists (a paused run?): resume it with `toolmux agent resume {0}`, remove it, \
             or pause to another file",
            file.display()
        );
        return Ok(refuse(args.json, exit::CONFIG, &message));
    }
    let (toolmux, agents) = start_agents(loaded).await?;
    let (ctx, mut options, cancel, screen) =
        run_context(loaded, fresh_run_id("agent", &args.name), args.transcript, !from_stdin);
    options.pause = args.pause_to.is_some();
    let run = agents.run_with(&args.name, &task, &ctx, &options);
    let report = crate::commands::until_interrupted(run, &cancel).await;
    let ended = Ended {
        agent: &args.name,
        json: args.json,
        saved_in: args.pause_to.as_deref(),
        resumed: false,
    };
    ended.report(&toolmux, report, &cancel, &screen).await
}

/// `toolmux agent resume`: a paused run goes on with the decisions given.
pub(crate) async fn resume(loaded: &Loaded, args: ResumeArgs) -> anyhow::Result<u8> {
    let file = &args.file;
    let text = match crate::files::read_regular(file, crate::files::PAUSED_RUN) {
        Ok(text) => text,
        Err(e) => {
            let message = format!("cannot read the paused run {}: {e}", file.display());
            return Ok(refuse(args.json, exit::CONFIG, &message));
        }
    };
    let paused: AgentReport = match serde_json::from_slice(&text) {
        Ok(report) => report,
        Err(e) => {
            let message = format!(
                "{} is not an agent report as `agent run --pause-to` saves it: {e}",
                file.display()
            );
            return Ok(refuse(args.json, exit::CONFIG, &message));
        }
    };
    if paused.status != AgentStatus::Paused {
        let message = format!(
            "the run in {} is not paused (its status is `{}`): nothing to resume",
            file.display(),
            paused.status.as_str()
        );
        return Ok(refuse(args.json, exit::CONFIG, &message));
    }
    if !configured(loaded, &paused.agent, args.json) {
        return Ok(exit::CONFIG);
    }
    let decisions = match decisions(&args, &paused.pending) {
        Ok(decisions) => decisions,
        Err(message) => return Ok(refuse(args.json, exit::CONFIG, &message)),
    };
    if decisions.is_empty() && !paused.pending.iter().any(|p| p.started) {
        print_pending(&paused, file);
        return Ok(exit::PAUSED);
    }
    // The approved calls are marked started in the file before they run: a resumption
    // interrupted now leaves a file that never runs them again.
    if decisions.values().any(|d| matches!(d, Decision::Approve { .. })) {
        let mut marked = paused.clone();
        marked.mark_started(&decisions);
        if let Err(e) = save(file, &marked) {
            let message = format!(
                "cannot mark the approved calls as started in {}: {e}; nothing was run",
                file.display()
            );
            return Ok(refuse(args.json, exit::OTHER, &message));
        }
    }
    let (toolmux, agents) = start_agents(loaded).await?;
    // The resumed run is the paused one, so it reads the results of its asynchronous
    // calls that came while it was paused; a report saved before runs named themselves
    // starts a new run.
    let run_id = paused.run_id.clone().unwrap_or_else(|| fresh_run_id("agent", &paused.agent));
    let (ctx, mut options, cancel, screen) = run_context(loaded, run_id, args.transcript, true);
    options.pause = true;
    let run = agents.resume(&paused, decisions, &ctx, &options);
    let report = crate::commands::until_interrupted(run, &cancel).await;
    let ended =
        Ended { agent: &paused.agent, json: args.json, saved_in: Some(file), resumed: true };
    ended.report(&toolmux, report, &cancel, &screen).await
}

/// A new run's id: `KIND-NAME-` and this process's id and start in milliseconds, so that
/// a later process given the same process id never reads this run's inbox.
fn fresh_run_id(kind: &str, name: &str) -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{kind}-{name}-{}-{millis}", std::process::id())
}

/// The context and options of run `run_id` from the command line, its cancellation and
/// the screen it is shown on. A person at a terminal (when stdin is one
/// and `person_may_answer`: not when the task came from stdin) answers the agent's
/// questions and approves calls that ask, reads the agent's text as its model writes it,
/// and sees each turn's calls as they start.
fn run_context(
    loaded: &Loaded,
    run_id: String,
    transcript: bool,
    person_may_answer: bool,
) -> (CallContext, RunOptions, CancellationToken, Arc<Screen>) {
    let cancel = CancellationToken::new();
    let ctx = CallContext::new().with_cancel(cancel.clone()).with_run_id(run_id);
    let screen = Arc::new(Screen::default());
    let person = (person_may_answer && std::io::stdin().is_terminal())
        .then(|| Arc::new(crate::terminal::Terminal::for_project(&loaded.base_dir)));
    let (ctx, options) = at_terminal(ctx, transcript, person.as_ref(), &screen);
    (ctx, options, cancel, screen)
}

/// The decisions `args` give for the calls `pending`, by call id.
fn decisions(
    args: &ResumeArgs,
    pending: &[PendingCall],
) -> Result<BTreeMap<String, Decision>, String> {
    let ids: Vec<&str> = pending.iter().map(|p| p.call_id.as_str()).collect();
    let known = |id: &str| -> Result<String, String> {
        if ids.contains(&id) {
            Ok(id.to_owned())
        } else {
            Err(format!(
                "no call `{id}` waits for approval; the calls that wait: {}",
                ids.join(", ")
            ))
        }
    };
    let split = |flag: &str, value: &str| -> Result<(String, Option<String>), String> {
        match value.split_once('=') {
            Some((id, rest)) => Ok((id.trim().to_owned(), Some(rest.to_owned()))),
            None if value.trim().is_empty() => Err(format!("--{flag} needs a call id")),
            None => Ok((value.trim().to_owned(), None)),
        }
    };
    let mut given: Vec<(String, Decision)> = Vec::new();
    let mut all = None;
    for value in &args.approve {
        match value.trim() {
            "all" => all = Some(Decision::approve()),
            id => given.push((known(id)?, Decision::approve())),
        }
    }
    for value in &args.always {
        given.push((known(value.trim())?, Decision::Approve { arguments: None, always: true }));
    }
    for value in &args.approve_with {
        let (id, json) = split("approve-with", value)?;
        let json =
            json.ok_or_else(|| format!("--approve-with {id}=JSON: the arguments are missing"))?;
        let arguments: serde_json::Value = serde_json::from_str(&json)
            .map_err(|e| format!("--approve-with {id}: the arguments are not JSON: {e}"))?;
        if !arguments.is_object() {
            return Err(format!("--approve-with {id}: the arguments must be a JSON object"));
        }
        given.push((known(&id)?, Decision::Approve { arguments: Some(arguments), always: false }));
    }
    for value in &args.deny {
        let (id, message) = split("deny", value)?;
        let decision = Decision::Deny { message };
        match id.as_str() {
            "all" => all = Some(decision),
            _ => given.push((known(&id)?, decision)),
        }
    }
    for value in &args.respond {
        let (id, text) = split("respond", value)?;
        let content = text.ok_or_else(|| format!("--respond {id}=TEXT: the text is missing"))?;
        given.push((known(&id)?, Decision::Respond { content, is_error: false }));
    }
    let question = |id: &str| pending.iter().any(|p| p.call_id == id && p.question.is_some());
    let started = |id: &str| pending.iter().any(|p| p.call_id == id && p.started);
    let mut decisions = BTreeMap::new();
    for (id, decision) in given {
        if matches!(decision, Decision::Approve { .. }) && question(&id) {
            return Err(format!(
                "call `{id}` is the agent's question, not a call to approve: answer it with \
                 --respond {id}=TEXT (or refuse with --deny {id})"
            ));
        }
        if matches!(decision, Decision::Approve { .. }) && started(&id) {
            return Err(format!(
                "call `{id}` was approved and started by an earlier `agent resume` that was \
                 interrupted: whether it took effect is unknown, so it is not run again; resume \
                 without deciding it (the agent is told), or say what happened with --respond \
                 {id}=TEXT"
            ));
        }
        if decisions.insert(id.clone(), decision).is_some() {
            return Err(format!("call `{id}` is decided twice: give one decision per call"));
        }
    }
    if let Some(decision) = all {
        // `--approve all` approves the calls; the agent's questions still want answers.
        let approving = matches!(decision, Decision::Approve { .. });
        for id in ids.into_iter().filter(|id| !(approving && (question(id) || started(id)))) {
            decisions.entry(id.to_owned()).or_insert_with(|| decision.clone());
        }
    }
    Ok(decisions)
}

/// How a run (or its resumption) is reported when it ends.
struct Ended<'a> {
    /// The agent run.
    agent: &'a str,
    json: bool,
    /// Where a paused run is saved.
    saved_in: Option<&'a Path>,
    /// The run was resumed from `saved_in`, which goes once the run ends.
    resumed: bool,
}

impl Ended<'_> {
    /// Prints `report` (or why there is none), saves a paused run, and gives the exit code.
    async fn report(
        &self,
        toolmux: &toolmux::Toolmux,
        report: Interruptible<Result<AgentReport, toolmux::toolmux_agent::AgentError>>,
        cancel: &CancellationToken,
        screen: &Screen,
    ) -> anyhow::Result<u8> {
        let report = match report {
            Interruptible::Done(report) => report,
            Interruptible::Interrupted(so_far) => {
                cancel.cancel();
                // A half-written answer's line ends before the word that says why it stops.
                screen.end();
                eprintln!("interrupted");
                if self.json {
                    print(&serde_json::to_string_pretty(&self.interrupted(so_far))?);
                }
                finish(toolmux).await;
                return Ok(exit::INTERRUPTED);
            }
        };
        let report = match report {
            Ok(report) => report,
            // An agent that cannot run as configured (no model to think with, an unknown
            // agent) is a configuration error.
            Err(
                e @ (toolmux::toolmux_agent::AgentError::Config { .. }
                | toolmux::toolmux_agent::AgentError::UnknownAgent { .. }),
            ) => {
                finish(toolmux).await;
                return Ok(refuse(self.json, exit::CONFIG, &e.to_string()));
            }
            Err(e) => {
                finish(toolmux).await;
                return Err(e.into());
            }
        };
        let code = self.show(&report, screen);
        finish(toolmux).await;
        code
    }

    /// The JSON document of an interrupted run for a program: the report the cancelled run
    /// gave back (its figures, what the model wrote so far), else the agent alone, with
    /// status `interrupted` and the exit code the process ends with.
    fn interrupted(
        &self,
        so_far: Option<Result<AgentReport, toolmux::toolmux_agent::AgentError>>,
    ) -> serde_json::Value {
        let code = crate::signals::exit_code().unwrap_or(exit::INTERRUPTED);
        let mut document = match so_far.map(|report| report.map(|r| serde_json::to_value(&r))) {
            Some(Ok(Ok(value @ serde_json::Value::Object(_)))) => value,
            _ => serde_json::json!({ "agent": self.agent }),
        };
        document["status"] = "interrupted".into();
        document["exitCode"] = code.into();
        document
    }

    fn show(&self, report: &AgentReport, screen: &Screen) -> anyhow::Result<u8> {
        let shown = screen.end();
        let paused = report.status == AgentStatus::Paused;
        if let Some(file) = self.saved_in {
            if paused {
                if let Err(e) = save(file, report) {
                    eprintln!("error: cannot save the paused run in {}: {e}", file.display());
                    if self.json {
                        print(&serde_json::to_string_pretty(report)?);
                    }
                    return Ok(exit::OTHER);
                }
            } else if self.resumed
                && let Err(e) = std::fs::remove_file(file)
            {
                eprintln!(
                    "warning: the run ended, but {} could not be removed: {e}",
                    file.display()
                );
            }
        }
        if self.json {
            print(&serde_json::to_string_pretty(report)?);
        } else if !paused {
            print_answer(report, &shown);
            print_unread(report);
            eprintln!("agent `{}`: {}", report.agent, summary(report));
        }
        if paused {
            if let Some(file) = self.saved_in {
                print_pending(report, file);
            }
            return Ok(exit::PAUSED);
        }
        Ok(if report.status == AgentStatus::Success { 0 } else { exit::TOOL_FAILED })
    }
}

/// Writes `report` to `file` whole or not at all (a file beside it, renamed over it),
/// readable by its owner only: the conversation may hold what the tools read.
fn save(file: &Path, report: &AgentReport) -> std::io::Result<()> {
    let mut json = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    json.push(b'\n');
    let how = toolmux::toolmux_core::Replace { private: true, durable: true };
    toolmux::toolmux_core::replace_file(file, &json, how)
}

/// Lists a paused run's waiting calls on stderr, with how to decide them.
fn print_pending(report: &AgentReport, file: &Path) {
    let count = report.pending.len();
    let what =
        if report.pending.iter().all(|p| p.question.is_some()) { "an answer" } else { "approval" };
    eprintln!(
        "agent `{}` paused: {} for {what}; the run is saved in {}",
        report.agent,
        if count == 1 { "1 call waits".to_owned() } else { format!("{count} calls wait") },
        file.display()
    );
    for call in &report.pending {
        let mut arguments = call.arguments.to_string();
        if arguments.len() > 300 {
            let cut = (0..=297).rev().find(|&i| arguments.is_char_boundary(i)).unwrap_or(0);
            arguments.truncate(cut);
            arguments.push_str("...");
        }
        match &call.question {
            _ if call.started => eprintln!(
                "  {}  {} {arguments}\n      started by an interrupted resume, so not run \
                 again: the agent is told it may or may not have run (or --respond {}=TEXT)",
                call.call_id, call.tool, call.call_id
            ),
            Some(question) => eprintln!(
                "  {}  the agent asks: {question}\n      answer with --respond {}=TEXT",
                call.call_id, call.call_id
            ),
            None => eprintln!(
                "  {}  {} {arguments}\n      why: {}",
                call.call_id, call.tool, call.reason
            ),
        }
    }
    if !report.approved.is_empty() {
        eprintln!("approved for the rest of the run: {}", report.approved.join(", "));
    }
    eprintln!(
        "decide with: toolmux agent resume {} --approve ID (or all) | --always ID | \
         --approve-with ID=JSON | --deny ID[=WHY] | --respond ID=TEXT",
        file.display()
    );
}

/// Every configured provider started, and the agents attached to them.
async fn start_agents(
    loaded: &Loaded,
) -> anyhow::Result<(toolmux::Toolmux, toolmux::toolmux_agent::Agents)> {
    let (toolmux, _report) = start(loaded, &|_| true).await?;
    let Some(agents) = toolmux.agents().cloned() else {
        // The configuration has agents (`configured`), so the facade built them.
        finish(&toolmux).await;
        anyhow::bail!("the agents were not built");
    };
    Ok((toolmux, agents))
}

/// How a run went, for people: status, turns, calls, tokens, hand-offs.
fn summary(report: &AgentReport) -> String {
    let handed = if report.handoffs.is_empty() {
        String::new()
    } else {
        format!(" (handed through {})", report.handoffs.join(" → "))
    };
    let cached = match report.usage.cache_read_tokens {
        0 => String::new(),
        read => format!(" ({read} from the cache)"),
    };
    format!(
        "{} in {} turn{}, {} tool call{}{}, {} tokens in{cached}, {} out{handed}",
        report.status.as_str(),
        report.turns,
        if report.turns == 1 { "" } else { "s" },
        report.tool_calls,
        if report.tool_calls == 1 { "" } else { "s" },
        refused(report.refused_calls),
        report.usage.input_tokens,
        report.usage.output_tokens,
    )
}

/// The calls a run refused before they ran (unknown tools, over `maxCallsPerTurn`,
/// repeats), which its tool calls do not count: ` (3 refused)`, or nothing.
fn refused(calls: u32) -> String {
    match calls {
        0 => String::new(),
        n => format!(" ({n} refused)"),
    }
}

/// `toolmux agent listen`: the agent in cycles, each run's report printed as it ends.
pub(crate) async fn listen(loaded: &Loaded, args: ListenArgs) -> anyhow::Result<u8> {
    use toolmux::toolmux_agent::{ListenEnd, ListenOptions};
    if !configured(loaded, &args.name, args.json) {
        return Ok(exit::CONFIG);
    }
    let (toolmux, agents) = start_agents(loaded).await?;
    let cancel = CancellationToken::new();
    // One run for every cycle: results of a cycle's asynchronous calls reach a later one,
    // and, the run's name being the agent's, a listener started again on the same
    // configuration (pending calls are kept in a folder processes share) reads the results
    // that came while none listened.
    let run_id = format!("agent-{}-listen", args.name);
    let ctx = CallContext::new().with_cancel(cancel.clone()).with_run_id(run_id);
    let options = ListenOptions {
        space: args.space.clone(),
        max_cycles: args.cycles,
        idle: args.idle.map(std::time::Duration::from_secs),
    };
    let mut cycle = 0;
    let on_cycle = |report: &AgentReport| {
        cycle += 1;
        if args.json {
            match serde_json::to_string(report) {
                Ok(line) => print(&line),
                Err(e) => eprintln!("error: the report of cycle {cycle} cannot be shown: {e}"),
            }
        } else {
            print(report.content.trim_end());
            print_unread(report);
            eprintln!("agent `{}`, cycle {cycle}: {}", report.agent, summary(report));
        }
    };
    let listening = agents.listen(&args.name, &ctx, &options, on_cycle);
    let _handling = crate::signals::Handling::start();
    tokio::pin!(listening);
    let ended = tokio::select! {
        ended = &mut listening => ended,
        () = crate::signals::received() => {
            // The cycle under way stops at once, and listening with it.
            cancel.cancel();
            let _ = listening.await;
            eprintln!("interrupted");
            finish(&toolmux).await;
            return Ok(exit::INTERRUPTED);
        }
    };
    finish(&toolmux).await;
    match ended {
        Ok(ListenEnd::Idle) => eprintln!("nothing arrived for {} s: done", args.idle.unwrap_or(0)),
        Ok(_) => {}
        Err(e) => return Ok(refuse(args.json, exit::CONFIG, &e.to_string())),
    }
    Ok(0)
}

/// `toolmux agent chat`: one conversation, a run per message, each run going on from the
/// last one's transcript.
pub(crate) async fn chat(loaded: &Loaded, args: ChatArgs) -> anyhow::Result<u8> {
    if !configured(loaded, &args.name, false) {
        return Ok(exit::CONFIG);
    }
    let (toolmux, agents) = start_agents(loaded).await?;
    let person = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    // One person for the whole chat: a tool allowed for good stays allowed.
    let terminal =
        person.then(|| Arc::new(crate::terminal::Terminal::for_project(&loaded.base_dir)));
    let run_id = fresh_run_id("chat", &args.name);
    let screen = Arc::new(Screen::default());
    let mut history = Vec::new();
    let mut first = args.message;
    let (mut turns, mut tool_calls, mut refused_calls) = (0u32, 0u32, 0u32);
    let mut usage = toolmux::toolmux_llm::Usage::default();
    let mut messages = 0u32;
    // Whether the last message's run failed: the chat's exit code says so to a program.
    let mut last_failed = false;
    loop {
        let message = match first.take() {
            Some(message) => message,
            None => match crate::terminal::next_line(if person { "\n> " } else { "" }).await {
                Some(line) => line,
                None => break,
            },
        };
        if message.trim().is_empty() {
            // At a terminal an empty line ends the chat; in a pipe it is skipped.
            if person {
                break;
            }
            continue;
        }
        messages += 1;
        let cancel = CancellationToken::new();
        let ctx = CallContext::new().with_cancel(cancel.clone()).with_run_id(run_id.clone());
        let (ctx, mut options) = at_terminal(ctx, true, terminal.as_ref(), &screen);
        options.history = std::mem::take(&mut history);
        let run = agents.run_with(&args.name, &message, &ctx, &options);
        let _handling = crate::signals::Handling::start();
        let report = tokio::select! {
            report = run => report,
            () = crate::signals::received() => {
                cancel.cancel();
                screen.end();
                eprintln!("interrupted");
                finish(&toolmux).await;
                return Ok(exit::INTERRUPTED);
            }
        };
        let mut report = match report {
            Ok(report) => report,
            Err(e) => {
                finish(&toolmux).await;
                return Err(e.into());
            }
        };
        let shown = screen.end();
        print_answer(&report, &shown);
        print_unread(&report);
        last_failed = report.status == AgentStatus::Failure;
        if last_failed {
            eprintln!("agent `{}`: {}", report.agent, summary(&report));
        }
        turns += report.turns;
        tool_calls += report.tool_calls;
        refused_calls += report.refused_calls;
        usage += report.usage;
        history = std::mem::take(&mut report.transcript);
    }
    if std::io::stderr().is_terminal() || messages > 0 {
        eprintln!(
            "chat with `{}`: {messages} message{}, {} turn{}, {} tool call{}{}, {} tokens in, {} out",
            args.name,
            if messages == 1 { "" } else { "s" },
            turns,
            if turns == 1 { "" } else { "s" },
            tool_calls,
            if tool_calls == 1 { "" } else { "s" },
            refused(refused_calls),
            usage.input_tokens,
            usage.output_tokens,
        );
    }
    finish(&toolmux).await;
    Ok(if last_failed { exit::TOOL_FAILED } else { 0 })
}
