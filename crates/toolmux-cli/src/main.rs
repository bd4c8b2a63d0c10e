//! The `toolmux` binary: arguments, configuration, run, exit code.
//!
//! Everything it does goes through the `toolmux` facade; this crate only parses the
//! command line, prints for people (or JSON for programs) and maps failures to exit codes.

// A command-line tool: what it prints is its interface.
#![allow(clippy::print_stdout, clippy::print_stderr)]

/// Every line this process prints on stderr goes through the configuration's secrets
/// ([`commands::redacted`]): errors and warnings quote URLs, what servers printed and what
/// libraries saw, any of which may hold a `${ENV}` secret; at a terminal, their control
/// characters are shown as escapes ([`commands::for_stderr`]). Shadows the standard macro in
/// this file and every module below.
macro_rules! eprintln {
    () => {
        ::std::eprintln!()
    };
    ($($arg:tt)*) => {
        ::std::eprintln!(
            "{}",
            $crate::commands::for_stderr(&$crate::commands::redacted(&::std::format!($($arg)*)))
        )
    };
}

mod agent;
#[cfg(feature = "mimalloc")]
mod allocator;
mod args;
mod callee;
mod commands;
mod events;
mod files;
mod mcp;
mod progress;
mod reload;
mod signals;
mod terminal;
mod waits;

use anyhow::Context as _;
use args::{AgentCommand, Cli, Command, ConfigCommand, McpCommand, OutputCommand, ToolsCommand};
use clap::Parser as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use toolmux::ToolmuxError;
use toolmux::config::{self, Loaded};

/// The allocator (feature `mimalloc`, on by default): a gateway call allocates on one
/// thread and frees on another, which glibc's malloc serves through its arena locks.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: allocator::Mimalloc = allocator::Mimalloc;

/// Exit codes, as `--help` documents them.
pub(crate) mod exit {
    /// The tool call failed.
    pub(crate) const TOOL_FAILED: u8 = 1;
    /// Usage or configuration error.
    pub(crate) const CONFIG: u8 = 2;
    /// A provider failed to start.
    pub(crate) const PROVIDER: u8 = 3;
    /// Serving or another operation failed.
    pub(crate) const OTHER: u8 = 4;
    /// An agent run paused: calls wait for approval.
    pub(crate) const PAUSED: u8 = 5;
    /// Interrupted by Ctrl-C (by SIGTERM or SIGHUP: 128 and the signal's number).
    pub(crate) const INTERRUPTED: u8 = 130;
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    // `config check --json` answers a configuration that does not load with its own
    // document (`valid: false`); every other command given `--json` answers an error with
    // one JSON object.
    let json_errors =
        cli.command.json() && !matches!(cli.command, Command::Config(ConfigCommand::Check(_)));
    let serving = matches!(cli.command, Command::Serve(_));
    let runtime = match runtime_for(&cli.command).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::OTHER);
        }
    };
    let code = match runtime.block_on(until_stopped(run(cli), json_errors)) {
        Ok(code) => code,
        Err(error) => {
            let code = classify(&error);
            commands::refuse(json_errors, code, &format!("{error:#}"))
        }
    };
    // What was printed did not all reach stdout (a full disk): said, and never success.
    let code = match commands::stdout_failure() {
        Some(e) => {
            say_stdout_failed(&e);
            if code == 0 { exit::OTHER } else { code }
        }
        None => code,
    };
    // Interrupted by a signal: its conventional code (143 for SIGTERM, 129 for SIGHUP). A
    // server stopped by one (its normal end, as a supervisor stops it) exits 0, whether it
    // was serving or still starting its providers, as --help says.
    let code = match signals::exit_code() {
        Some(_) if code == exit::INTERRUPTED && serving => 0,
        Some(signalled) if code == exit::INTERRUPTED => signalled,
        _ => code,
    };
    // Child processes are reaped by `shutdown`; do not wait for stray blocking tasks.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    ExitCode::from(code)
}

/// Says on stderr that what was printed did not all reach stdout, because of `e`.
fn say_stdout_failed(e: &std::io::Error) {
    eprintln!("error: cannot write the output to stdout: {e}; what it got is incomplete");
}

/// A command line clap refuses: its message and usage on stderr, as clap prints them, and,
/// when `--json` was asked for, also one JSON object on stdout ([`commands::refuse`]), so
/// that a program reading stdout is told what was wrong. Help and the version are printed
/// as asked, on stdout; when they cannot be written there (a full disk; a reader that went
/// away aside) that is said and the exit code is 4, as for any command's output.
fn usage_error(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    use std::io::Write as _;
    if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        // `clap::Error::exit` would drop a failed write and exit 0.
        return match error.print().and_then(|()| std::io::stdout().flush()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                say_stdout_failed(&e);
                ExitCode::from(exit::OTHER)
            }
            _ => ExitCode::SUCCESS,
        };
    }
    let json = std::env::args_os().skip(1).take_while(|arg| arg != "--").any(|arg| arg == "--json");
    if !json {
        error.exit();
    }
    let _ = error.print();
    // The text clap printed, without its colours and its `error: ` (the JSON says so).
    let text = error.render().to_string();
    let text = text.trim();
    let text = text.strip_suffix("For more information, try '--help'.").unwrap_or(text);
    let text = text.trim_end();
    let message = text.strip_prefix("error: ").unwrap_or(text);
    commands::print_error_json(message, exit::CONFIG);
    ExitCode::from(exit::CONFIG)
}

/// Runs `work` with the stopping signals listened for ([`signals`]): when one comes, the
/// command's own handling (cancelling its call, saving a run, stopping a server) gets a
/// grace to end `work`; after it, `work` is dropped, which kills every server's process
/// group (a command still starting them has no handling of its own). A command stopped
/// with no handling of its own answers under `json` with one JSON object, as one with
/// handling does (stdout was empty when `tools list --json` was stopped while its servers
/// started); one whose handling outlived its grace may have printed its own already.
async fn until_stopped(
    work: impl Future<Output = anyhow::Result<u8>>,
    json: bool,
) -> anyhow::Result<u8> {
    signals::install();
    tokio::pin!(work);
    tokio::select! {
        done = &mut work => return done,
        () = signals::received() => {}
    }
    if !signals::handled() {
        eprintln!("interrupted");
        if json {
            let code = signals::exit_code().unwrap_or(exit::INTERRUPTED);
            commands::print_error_json("interrupted", code);
        }
        return Ok(exit::INTERRUPTED);
    }
    let grace = commands::INTERRUPT_GRACE + std::time::Duration::from_secs(3);
    match tokio::time::timeout(grace, work).await {
        Ok(done) => done,
        Err(_) => {
            eprintln!("interrupted");
            Ok(exit::INTERRUPTED)
        }
    }
}

/// The runtime a command runs on. `serve` on stdio has one client whose calls mostly wait
/// on pipes and child processes: one thread does that with no cross-thread wakeups, which
/// measurably cuts each call's latency (BENCHMARKS.md, "Gateway"); blocking work still goes
/// to the blocking pool. Everything else, and the HTTP server with its many sessions, runs
/// on the multi-threaded runtime.
fn runtime_for(command: &Command) -> tokio::runtime::Builder {
    match command {
        Command::Serve(serve) if serve.transport.http.is_none() => {
            tokio::runtime::Builder::new_current_thread()
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
}

/// The exit code of a failure.
fn classify(error: &anyhow::Error) -> u8 {
    match error.downcast_ref::<ToolmuxError>() {
        Some(e) if e.is_config() => exit::CONFIG,
        Some(ToolmuxError::Provider { .. }) => exit::PROVIDER,
        _ => exit::OTHER,
    }
}

async fn run(cli: Cli) -> anyhow::Result<u8> {
    if let Command::Config(ConfigCommand::Schema) = cli.command {
        let schema = serde_json::to_string_pretty(&config::schema())?;
        commands::print(&schema);
        return Ok(0);
    }
    let cwd = std::env::current_dir().context("cannot tell the current directory")?;
    let loaded = match load(&cli.config, &cwd) {
        Ok(loaded) => loaded,
        // `config check --json` answers a program in JSON even when the file does not load.
        Err(error) if matches!(&cli.command, Command::Config(ConfigCommand::Check(flag)) if flag.json) =>
        {
            commands::print_json(&commands::check_refusal(&error))?;
            return Err(error);
        }
        Err(error) => return Err(error),
    };
    commands::keep_secrets(&loaded);
    commands::init_tracing(cli.verbose, cli.quiet, loaded.config.defaults.trace_mcp);
    for warning in &loaded.warnings {
        eprintln!("warning: {warning}");
    }
    match cli.command {
        Command::Tools(ToolsCommand::List(flag)) => commands::tools_list(&loaded, flag.json).await,
        Command::Tools(ToolsCommand::Call(call)) => commands::tools_call(&loaded, call).await,
        Command::Serve(serve) => commands::serve(&loaded, serve).await,
        Command::Config(ConfigCommand::Check(flag)) => {
            commands::config_check(&loaded, flag.json).await
        }
        Command::Config(ConfigCommand::Show(flag)) => commands::config_show(&loaded, flag.json),
        Command::Config(ConfigCommand::Schema) => Ok(0),
        Command::Output(OutputCommand::Show(show)) => commands::output_show(&loaded, show).await,
        Command::Stats(flag) => commands::stats(&loaded, flag.json),
        Command::Agent(AgentCommand::List(flag)) => agent::list(&loaded, flag.json),
        Command::Agent(AgentCommand::Run(args)) => agent::run(&loaded, args).await,
        Command::Agent(AgentCommand::Resume(args)) => agent::resume(&loaded, args).await,
        Command::Agent(AgentCommand::Chat(args)) => agent::chat(&loaded, args).await,
        Command::Agent(AgentCommand::Listen(args)) => agent::listen(&loaded, args).await,
        Command::Mcp(McpCommand::Login(args)) => mcp::login(&loaded, args).await,
        Command::Mcp(McpCommand::Logout(server)) => mcp::logout(&loaded, &server.name).await,
        Command::Mcp(McpCommand::Status(flag)) => mcp::status(&loaded, flag.json),
    }
}

/// Refuses a folder holding more than one of the files [`config::discover`] looks for
/// (such as `toolmux.yaml` and `toolmux.json`): it would read the first and pass over the
/// others without a word, and a person editing one of those would see nothing change.
fn one_project_file(cwd: &Path) -> Result<(), ToolmuxError> {
    let found: Vec<&str> =
        config::FILE_NAMES.iter().copied().filter(|name| cwd.join(name).is_file()).collect();
    let [first, second, ..] = found[..] else {
        return Ok(());
    };
    let others = found[1..].iter().map(|name| format!("`{name}`")).collect::<Vec<_>>();
    Err(ToolmuxError::config(
        first,
        format!(
            "{} {} in this folder too, and toolmux reads one file only: remove the one you do \
             not mean, or name the one to read with --config (`--config {second}`)",
            others.join(" and "),
            if others.len() == 1 { "is" } else { "are" },
        ),
    ))
}

/// The configuration: `--config` (the files after the first merged over it), else
/// `TOOLMUX_CONFIG`, one of `./toolmux.yaml`, `.yml`, `.json` or `.toml`, or none, over the
/// user's file and under the managed one.
fn load(explicit: &[PathBuf], cwd: &Path) -> anyhow::Result<Loaded> {
    let env = |name: &str| std::env::var(name).ok();
    let from_env = std::env::var_os("TOOLMUX_CONFIG").map(PathBuf::from);
    let first = explicit.first().map(PathBuf::as_path);
    let named = first.is_some() || from_env.as_ref().is_some_and(|p| !p.as_os_str().is_empty());
    if !named {
        one_project_file(cwd)?;
    }
    let path = config::discover(first, from_env.as_deref(), cwd).map(|p| cwd.join(p));
    let mut layers = config::Layers::discover(&env)?;
    layers.added = explicit.iter().skip(1).map(|p| cwd.join(p)).collect();
    let error = match config::load_layered(path.as_deref(), cwd, &layers, &env) {
        Ok(loaded) => return Ok(loaded),
        Err(error) => error,
    };
    // A file that cannot be read says where its path came from, and how to give another:
    // a `TOOLMUX_CONFIG` exported long ago and forgotten is otherwise hard to see.
    let given = match (first, &from_env) {
        (Some(_), _) => "given with --config",
        (None, Some(from_env)) if !from_env.as_os_str().is_empty() => {
            "named by TOOLMUX_CONFIG; unset it to look for ./toolmux.yaml"
        }
        _ => return Err(error.into()),
    };
    let shown = path.as_deref().map(|p| p.strip_prefix(cwd).unwrap_or(p).display().to_string());
    Err(match error {
        ToolmuxError::Read { file, source } if Some(&file) == shown.as_ref() => {
            ToolmuxError::Read { file: format!("{file} ({given})"), source }
        }
        // A later --config file: its layer is named, not where it came from.
        ToolmuxError::Read { file, source } if file.ends_with(" (added configuration)") => {
            let file = file.replace(" (added configuration)", " (added with --config)");
            ToolmuxError::Read { file, source }
        }
        other => other,
    }
    .into())
}
