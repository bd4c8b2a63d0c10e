//! `toolmux agent`: run an agent on a task, list the agents.

use crate::args::{ChatArgs, ListenArgs, RunArgs};
use crate::commands::{finish, print, start};
use crate::exit;
use std::io::{IsTerminal as _, Read as _, Write as _};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;
use toolmux::config::Loaded;
use toolmux::toolmux_agent::{AgentStatus, RunOptions, TextDelta, TextSink};
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
        out.push_str(&format!("{name:width$}  {}  tools {tools}", agent.model));
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
        let _ = writeln!(stderr, "{start}{line}");
        state.mid_line = false;
        state.turn_text.clear();
    }

    fn text(&self, delta: TextDelta<'_>) {
        let mut state = self.state();
        let mut stderr = std::io::stderr().lock();
        match delta {
            TextDelta::Text(text) => {
                let _ = write!(stderr, "{text}");
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

/// Whether agent `name` is configured; if not, says so and which are.
fn configured(loaded: &Loaded, name: &str) -> bool {
    if loaded.config.agents.contains_key(name) {
        return true;
    }
    let known: Vec<&str> = loaded.config.agents.keys().map(String::as_str).collect();
    if known.is_empty() {
        eprintln!(
            "error: no agents are configured: add `{name}` under `agents` (and its model under `models`)"
        );
    } else {
        eprintln!("error: unknown agent `{name}`; configured: {}", known.join(", "));
    }
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
fn print_answer(report: &toolmux::toolmux_agent::AgentReport, shown: &str) {
    let read_already = std::io::stdout().is_terminal()
        && !shown.trim().is_empty()
        && shown.trim() == report.text().trim();
    if !read_already {
        print(&report.text());
    }
}

pub(crate) async fn run(loaded: &Loaded, args: RunArgs) -> anyhow::Result<u8> {
    if !configured(loaded, &args.name) {
        return Ok(exit::CONFIG);
    }
    let from_stdin = matches!(args.task.as_deref(), None | Some("-"));
    let task = match args.task.as_deref() {
        Some(task) if task != "-" => task.to_owned(),
        _ if std::io::stdin().is_terminal() => {
            eprintln!("error: give the task as an argument, or pipe it to stdin");
            return Ok(exit::CONFIG);
        }
        _ => {
            let mut task = String::new();
            std::io::stdin().read_to_string(&mut task)?;
            task
        }
    };
    if task.trim().is_empty() {
        eprintln!("error: the task is empty");
        return Ok(exit::CONFIG);
    }
    let (toolmux, agents) = start_agents(loaded).await?;
    let cancel = CancellationToken::new();
    let ctx = CallContext::new().with_cancel(cancel.clone()).with_run_id(format!(
        "agent-{}-{}",
        args.name,
        std::process::id()
    ));
    // A person at a terminal answers the agent's questions and approves calls that ask,
    // reads the agent's text as its model writes it, and sees each turn's calls as they
    // start.
    let screen = Arc::new(Screen::default());
    let person = (!from_stdin && std::io::stdin().is_terminal())
        .then(|| Arc::new(crate::terminal::Terminal::for_project(&loaded.base_dir)));
    let (ctx, options) = at_terminal(ctx, args.transcript, person.as_ref(), &screen);
    let run = agents.run_with(&args.name, &task, &ctx, &options);
    let report = tokio::select! {
        report = run => Some(report),
        _ = tokio::signal::ctrl_c() => None,
    };
    let Some(report) = report else {
        cancel.cancel();
        eprintln!("interrupted");
        finish(&toolmux).await;
        return Ok(exit::INTERRUPTED);
    };
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            finish(&toolmux).await;
            return Err(e.into());
        }
    };
    let shown = screen.end();
    if args.json {
        print(&serde_json::to_string_pretty(&report)?);
    } else {
        print_answer(&report, &shown);
        eprintln!("agent `{}`: {}", report.agent, summary(&report));
    }
    finish(&toolmux).await;
    Ok(if report.status == AgentStatus::Success { 0 } else { exit::TOOL_FAILED })
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
fn summary(report: &toolmux::toolmux_agent::AgentReport) -> String {
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
        "{} in {} turn{}, {} tool call{}, {} tokens in{cached}, {} out{handed}",
        report.status.as_str(),
        report.turns,
        if report.turns == 1 { "" } else { "s" },
        report.tool_calls,
        if report.tool_calls == 1 { "" } else { "s" },
        report.usage.input_tokens,
        report.usage.output_tokens,
    )
}

/// `toolmux agent listen`: the agent in cycles, each run's report printed as it ends.
pub(crate) async fn listen(loaded: &Loaded, args: ListenArgs) -> anyhow::Result<u8> {
    use toolmux::toolmux_agent::{ListenEnd, ListenOptions};
    if !configured(loaded, &args.name) {
        return Ok(exit::CONFIG);
    }
    let (toolmux, agents) = start_agents(loaded).await?;
    let cancel = CancellationToken::new();
    // One run for every cycle: results of a cycle's asynchronous calls reach a later one.
    let run_id = format!("agent-{}-listen-{}", args.name, std::process::id());
    let ctx = CallContext::new().with_cancel(cancel.clone()).with_run_id(run_id);
    let options = ListenOptions {
        space: args.space.clone(),
        max_cycles: args.cycles,
        idle: args.idle.map(std::time::Duration::from_secs),
    };
    let mut cycle = 0;
    let on_cycle = |report: &toolmux::toolmux_agent::AgentReport| {
        cycle += 1;
        if args.json {
            match serde_json::to_string(report) {
                Ok(line) => print(&line),
                Err(e) => eprintln!("error: the report of cycle {cycle} cannot be shown: {e}"),
            }
        } else {
            print(report.content.trim_end());
            eprintln!("agent `{}`, cycle {cycle}: {}", report.agent, summary(report));
        }
    };
    let listening = agents.listen(&args.name, &ctx, &options, on_cycle);
    tokio::pin!(listening);
    let ended = tokio::select! {
        ended = &mut listening => ended,
        _ = tokio::signal::ctrl_c() => {
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
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(exit::CONFIG);
        }
    }
    Ok(0)
}

/// `toolmux agent chat`: one conversation, a run per message, each run going on from the
/// last one's transcript.
pub(crate) async fn chat(loaded: &Loaded, args: ChatArgs) -> anyhow::Result<u8> {
    if !configured(loaded, &args.name) {
        return Ok(exit::CONFIG);
    }
    let (toolmux, agents) = start_agents(loaded).await?;
    let person = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    // One person for the whole chat: a tool allowed for good stays allowed.
    let terminal =
        person.then(|| Arc::new(crate::terminal::Terminal::for_project(&loaded.base_dir)));
    let run_id = format!("chat-{}-{}", args.name, std::process::id());
    let screen = Arc::new(Screen::default());
    let mut history = Vec::new();
    let mut first = args.message;
    let (mut turns, mut tool_calls) = (0u32, 0u32);
    let mut usage = toolmux::toolmux_llm::Usage::default();
    let mut messages = 0u32;
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
        let report = tokio::select! {
            report = run => report,
            _ = tokio::signal::ctrl_c() => {
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
        turns += report.turns;
        tool_calls += report.tool_calls;
        usage += report.usage;
        history = std::mem::take(&mut report.transcript);
    }
    if std::io::stderr().is_terminal() || messages > 0 {
        eprintln!(
            "chat with `{}`: {messages} message{}, {} turn{}, {} tool call{}, {} tokens in, {} out",
            args.name,
            if messages == 1 { "" } else { "s" },
            turns,
            if turns == 1 { "" } else { "s" },
            tool_calls,
            if tool_calls == 1 { "" } else { "s" },
            usage.input_tokens,
            usage.output_tokens,
        );
    }
    finish(&toolmux).await;
    Ok(0)
}
