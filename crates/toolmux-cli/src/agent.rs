//! `toolmux agent`: run an agent on a task, list the agents.

use crate::args::RunArgs;
use crate::commands::{finish, print, start};
use crate::exit;
use std::io::{IsTerminal as _, Read as _};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use toolmux::config::Loaded;
use toolmux::toolmux_agent::{AgentStatus, RunOptions};
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

pub(crate) async fn run(loaded: &Loaded, args: RunArgs) -> anyhow::Result<u8> {
    if !loaded.config.agents.contains_key(&args.name) {
        let known: Vec<&str> = loaded.config.agents.keys().map(String::as_str).collect();
        if known.is_empty() {
            eprintln!(
                "error: no agents are configured: add `{}` under `agents` (and its model under `models`)",
                args.name
            );
        } else {
            eprintln!("error: unknown agent `{}`; configured: {}", args.name, known.join(", "));
        }
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
    let (toolmux, _report) = start(loaded, &|_| true).await?;
    let Some(agents) = toolmux.agents() else {
        // The configuration has agents, so the facade built them.
        finish(&toolmux).await;
        anyhow::bail!("the agents were not built");
    };
    let cancel = CancellationToken::new();
    let mut ctx = CallContext::new().with_cancel(cancel.clone()).with_run_id(format!(
        "agent-{}-{}",
        args.name,
        std::process::id()
    ));
    // A person at a terminal answers the agent's questions and approves calls that ask,
    // and sees each turn's calls as they start.
    if std::io::stderr().is_terminal() {
        ctx = ctx.with_progress(ProgressSink::new(|progress| {
            if let Some(message) = progress.message {
                eprintln!("· {message}");
            }
        }));
        if !from_stdin && std::io::stdin().is_terminal() {
            ctx = ctx.with_handler(Arc::new(crate::terminal::Terminal));
        }
    }
    let options = RunOptions { transcript: args.transcript };
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
    if args.json {
        print(&serde_json::to_string_pretty(&report)?);
    } else {
        print(&report.text());
        let handed = if report.handoffs.is_empty() {
            String::new()
        } else {
            format!(" (handed through {})", report.handoffs.join(" → "))
        };
        let cached = match report.usage.cache_read_tokens {
            0 => String::new(),
            read => format!(" ({read} from the cache)"),
        };
        eprintln!(
            "agent `{}`: {} in {} turn{}, {} tool call{}, {} tokens in{cached}, {} out{handed}",
            report.agent,
            report.status.as_str(),
            report.turns,
            if report.turns == 1 { "" } else { "s" },
            report.tool_calls,
            if report.tool_calls == 1 { "" } else { "s" },
            report.usage.input_tokens,
            report.usage.output_tokens,
        );
    }
    finish(&toolmux).await;
    Ok(if report.status == AgentStatus::Success { 0 } else { exit::TOOL_FAILED })
}
