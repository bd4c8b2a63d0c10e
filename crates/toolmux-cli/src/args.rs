//! The command line, as clap derives it.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use toolmux::toolmux_mcp::server::ClientProfile;

const EXIT_CODES: &str = "\
Configuration: --config FILE (given again, each later file is merged over the ones before:
--config tools.yml --config mcp.yml), else $TOOLMUX_CONFIG, else ./toolmux.yaml, ./toolmux.yml,
./toolmux.json or ./toolmux.toml (two of them is an error); with none, the read-only file tools
(fs__read, fs__grep, fs__glob, fs__ls) on the current directory. It is merged over the user's ~/.config/toolmux/config.yaml
($TOOLMUX_USER_CONFIG; empty for none) and under /etc/toolmux/managed.yaml when they
exist. Outputs over the size cap are stored; output__read reads them on.

Exit codes:
  0  success
  1  the tool call failed, the output handle is unknown, or the agent did not report
     success (failure, partial, needs_input)
  2  usage or configuration error
  3  a provider failed to start
  4  serving or another operation failed (address in use, I/O error)
  5  the agent run paused: calls wait for approval (`toolmux agent resume`)
  130 interrupted (Ctrl-C); 143 stopped by SIGTERM, 129 by SIGHUP (`serve` stopped by
     a signal ends normally, 0, while still starting too); every server's processes are
     stopped first

With --json, an error (a usage error too) is also one JSON object on stdout,
{\"ok\": false, \"error\": \"MESSAGE\", \"exitCode\": CODE}, besides its line on stderr; a tool call
that failed prints its result envelope instead ({\"ok\": false, \"error\": ..., \"extras\":
{\"code\": ...}}), and `config check --json` its document with \"valid\": false.";

/// One tool plane for LLM agents: list and call every tool of every configured provider
/// (builtin file tools, MCP servers, REST APIs, agents), serve them all as one MCP server,
/// or run an agent on a task.
#[derive(Debug, Parser)]
#[command(name = "toolmux", version, after_help = EXIT_CODES, max_term_width = 100)]
pub(crate) struct Cli {
    /// The configuration file (YAML, JSON or TOML, by its extension); given again, each
    /// later file is merged over the ones before.
    #[arg(short, long, global = true, value_name = "FILE", action = clap::ArgAction::Append)]
    pub(crate) config: Vec<PathBuf>,
    /// More logging on stderr: -v info, -vv debug, -vvv trace (RUST_LOG wins when set).
    /// Without it, errors and toolmux's warnings (an upstream tool left out, a cut tool
    /// list) are shown, one line each.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    /// Less logging on stderr: errors only, no warnings (RUST_LOG wins when set).
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub(crate) quiet: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// List or call tools.
    #[command(subcommand)]
    Tools(ToolsCommand),
    /// Serve every tool as one MCP server (stdio by default).
    Serve(ServeArgs),
    /// Check the configuration, show it as loaded, or print its JSON Schema.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Read outputs that were too large for a tool result.
    #[command(subcommand)]
    Output(OutputCommand),
    /// Per-tool call statistics, kept across runs.
    Stats(JsonFlag),
    /// Run an agent on a task, or list the agents.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Authorize toolmux at an MCP server that asks for OAuth, or forget its tokens.
    #[command(subcommand)]
    Mcp(McpCommand),
}

impl Command {
    /// Whether `--json` was given: the command's errors are then one JSON object on stdout
    /// too ([`crate::commands::refuse`]).
    pub(crate) fn json(&self) -> bool {
        match self {
            Command::Tools(ToolsCommand::List(flag))
            | Command::Config(ConfigCommand::Check(flag) | ConfigCommand::Show(flag))
            | Command::Stats(flag)
            | Command::Agent(AgentCommand::List(flag))
            | Command::Mcp(McpCommand::Status(flag)) => flag.json,
            Command::Tools(ToolsCommand::Call(call)) => call.json,
            Command::Output(OutputCommand::Show(show)) => show.json,
            Command::Agent(AgentCommand::Run(run)) => run.json,
            Command::Agent(AgentCommand::Resume(resume)) => resume.json,
            Command::Agent(AgentCommand::Listen(listen)) => listen.json,
            Command::Serve(_)
            | Command::Config(ConfigCommand::Schema)
            | Command::Agent(AgentCommand::Chat(_))
            | Command::Mcp(McpCommand::Login(_) | McpCommand::Logout(_)) => false,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Authorize toolmux at a remote MCP server once (OAuth in a browser); the tokens are
    /// kept and refreshed for every later command.
    Login(LoginArgs),
    /// Forget the OAuth tokens kept for an MCP server.
    Logout(ServerName),
    /// Which remote MCP servers toolmux authorizes with OAuth, and what is kept for each
    /// (never the tokens; no request is made).
    Status(JsonFlag),
}

#[derive(Debug, Args)]
pub(crate) struct LoginArgs {
    /// The server's name under `mcpServers`.
    pub(crate) name: String,
    /// Only print the authorization URL; do not start a browser (`$BROWSER`, else
    /// `xdg-open` or `open`).
    #[arg(long)]
    pub(crate) no_browser: bool,
    /// Authorize again even when the kept tokens still work.
    #[arg(long)]
    pub(crate) force: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ServerName {
    /// The server's name under `mcpServers`.
    pub(crate) name: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AgentCommand {
    /// List the configured agents.
    List(JsonFlag),
    /// Run an agent on a task and print its final report.
    Run(RunArgs),
    /// Go on with a run paused for approvals (`agent run --pause-to`): decide its waiting
    /// calls; those left undecided keep it paused.
    Resume(ResumeArgs),
    /// Talk with an agent: each line is the next message of one conversation, each answer
    /// printed as it comes; an empty line at a terminal, or the end of input, ends it.
    Chat(ChatArgs),
    /// Run an agent in cycles: it sleeps until messages of others arrive in its space (with
    /// `spaces`) or results of its asynchronous external calls arrive, then works on them
    /// in one run, and sleeps again; each run's report is printed as it ends.
    Listen(ListenArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ListenArgs {
    /// The agent's name (a key under `agents`).
    pub(crate) name: String,
    /// Enter this space first (else the agent's active space, if it has one).
    #[arg(long)]
    pub(crate) space: Option<String>,
    /// Stop after this many cycles.
    #[arg(long, value_name = "N")]
    pub(crate) cycles: Option<usize>,
    /// Stop after this many seconds with nothing arriving.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) idle: Option<u64>,
    /// Print each report as one line of JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    /// The agent's name (a key under `agents`).
    pub(crate) name: String,
    /// The first message; the next ones are read from stdin, a line each.
    pub(crate) message: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The agent's name (a key under `agents`).
    pub(crate) name: String,
    /// The task. Without it, or with `-`, the task is read from stdin.
    pub(crate) task: Option<String>,
    /// Print the whole report (status, content, turns, tool calls, tokens) as JSON.
    /// Interrupted, the report so far with status `interrupted` and its `exitCode`.
    #[arg(long)]
    pub(crate) json: bool,
    /// With --json, include the agent's conversation in the report.
    #[arg(long, requires = "json")]
    pub(crate) transcript: bool,
    /// Calls that need approval pause the run instead of asking: the paused run is saved
    /// in FILE (owner-only), its waiting calls are listed, and `toolmux agent resume FILE`
    /// goes on with your decisions.
    #[arg(long, value_name = "FILE")]
    pub(crate) pause_to: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ResumeArgs {
    /// The paused run, as `agent run --pause-to` saved it (or a paused report printed with
    /// `--json`). Paused again, it is saved there again; ended, the file is removed.
    pub(crate) file: PathBuf,
    /// Run a waiting call (its id, or `all`). Repeatable.
    #[arg(long, value_name = "ID")]
    pub(crate) approve: Vec<String>,
    /// Run a waiting call, and approve what asked for it (the rule, or the tool) for the
    /// rest of the run. Repeatable.
    #[arg(long, value_name = "ID")]
    pub(crate) always: Vec<String>,
    /// Run a waiting call with these arguments (a JSON object) instead of the model's.
    /// Repeatable.
    #[arg(long, value_name = "ID=JSON")]
    pub(crate) approve_with: Vec<String>,
    /// Refuse a waiting call (its id, or `all`), with a message the model reads.
    /// Repeatable.
    #[arg(long, value_name = "ID[=MESSAGE]")]
    pub(crate) deny: Vec<String>,
    /// Answer a waiting call with this text instead of running it. Repeatable.
    #[arg(long, value_name = "ID=TEXT")]
    pub(crate) respond: Vec<String>,
    /// Print the whole report as JSON (interrupted: status `interrupted`, its `exitCode`).
    #[arg(long)]
    pub(crate) json: bool,
    /// With --json, include the agent's conversation in the report.
    #[arg(long, requires = "json")]
    pub(crate) transcript: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ToolsCommand {
    /// List every tool: its name and the first line of its description, cut to the
    /// terminal's width (`COLUMNS` when set) at a terminal, whole in a pipe or a file.
    List(JsonFlag),
    /// Call one tool and print its result.
    Call(CallArgs),
}

#[derive(Debug, Args)]
pub(crate) struct JsonFlag {
    /// Print JSON for programs.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct CallArgs {
    /// The tool's full name (`fs__grep`) or an alias.
    pub(crate) name: String,
    /// The arguments as a JSON object, each key once.
    #[arg(value_name = "ARGS_JSON")]
    pub(crate) arguments: Option<String>,
    /// Words after ARGS_JSON, which are refused with how to give them (`key=value key=value`
    /// is what people type first); taken here so that the refusal can say that.
    #[arg(value_name = "MORE", hide = true)]
    pub(crate) extra: Vec<String>,
    /// One argument; VALUE is read as JSON when it parses, else as a string, and as a
    /// string where the tool's schema wants one (`--arg pattern=404`). Repeatable, each
    /// KEY once; wins over ARGS_JSON.
    #[arg(long = "arg", value_name = "KEY=VALUE")]
    pub(crate) args: Vec<String>,
    /// Print the whole result envelope as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
#[group(multiple = false)]
pub(crate) struct Transport {
    /// Serve on stdin/stdout (the default); logs go to stderr.
    #[arg(long)]
    pub(crate) stdio: bool,
    /// Serve streamable HTTP at http://ADDR/mcp: IP:PORT, localhost:PORT, or a port alone
    /// (on 127.0.0.1); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", value_parser = listen_addr)]
    pub(crate) http: Option<SocketAddr>,
}

/// The `--client` profile named `text`.
fn client_profile(text: &str) -> Result<ClientProfile, String> {
    ClientProfile::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = ClientProfile::ALL.iter().map(|(name, _)| *name).collect();
        format!("no client profile `{text}`; the profiles are: {}", names.join(", "))
    })
}

/// The address `--http` listens on. A port alone and `localhost` mean the loopback
/// address: listening on every interface is asked for by name (`0.0.0.0:PORT`).
fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    let loopback =
        |port: &str| port.parse::<u16>().ok().map(|port| SocketAddr::from(([127, 0, 0, 1], port)));
    let port = text.strip_prefix("localhost:").or_else(|| text.strip_prefix(':')).unwrap_or(text);
    if let Some(addr) = loopback(port) {
        return Ok(addr);
    }
    text.parse().map_err(|_| {
        "expected an IP address and port (127.0.0.1:8931, [::1]:8931, 0.0.0.0:8931 for every \
         interface), localhost:PORT, or a port alone"
            .to_owned()
    })
}

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) transport: Transport,
    /// The client served: `claude` (Claude Code, Claude Desktop), `codex`, `openai`,
    /// `cursor`, `gemini` (Gemini CLI) or `generic`. Tool names are fitted to what that
    /// client puts before them (`mcp__toolmux__`, for a server it knows as `toolmux`) and its
    /// length limit, and input schemas rewritten to what its model accepts (no top-level
    /// `anyOf`/`oneOf`/`allOf`; for Gemini, its OpenAPI subset). Calls are still validated
    /// against the original schemas. Overrides `serve.client` of the configuration. Without
    /// either, `--stdio` takes the profile of the client that connects, by the name its
    /// `initialize` gives (Claude Code, Codex, Cursor, Gemini CLI), and `generic` for any
    /// other; over HTTP it is `generic`.
    #[arg(long, value_name = "CLIENT", value_parser = client_profile)]
    pub(crate) client: Option<ClientProfile>,
    /// The prefix the client puts before every tool name (`mcp__NAME__` when Claude Code
    /// knows this server as NAME), so that names are fitted into the characters it leaves;
    /// overrides the `--client` profile's and `serve.namePrefix`.
    #[arg(long, value_name = "PREFIX")]
    pub(crate) name_prefix: Option<String>,
    /// Another accepted `Host` for HTTP (besides 127.0.0.1, localhost, ::1 and the bound
    /// address). Repeatable.
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub(crate) allowed_hosts: Vec<String>,
    /// Serve only the tools whose full names match GLOB (`*` any run of characters, `?` one
    /// character), such as `fs__*` or `github__*issue*`. Repeatable; without it every tool is
    /// served. The prompts, resources and resource templates served are those of the
    /// providers with a tool served, and prompts whose names match GLOB.
    #[arg(long = "tools", value_name = "GLOB")]
    pub(crate) tools: Vec<String>,
    /// Tools per tools/list page.
    #[arg(long, default_value_t = 100)]
    pub(crate) page_size: usize,
    /// Over HTTP, accept the key in environment variable VAR (`Authorization: Bearer KEY`
    /// or `X-API-Key: KEY`), besides `serve.apiKeys` of the configuration. Repeatable.
    #[arg(long = "api-key-env", value_name = "VAR")]
    pub(crate) api_key_envs: Vec<String>,
    /// Serve HTTP on an address other machines reach without any API key.
    #[arg(long)]
    pub(crate) no_auth: bool,
    /// Read the configuration file again when it changes and go on serving with it:
    /// servers added, removed or changed, clients told the lists changed, calls in flight
    /// finished on the old configuration. A file that does not load is reported and the
    /// previous configuration goes on serving.
    #[arg(long)]
    pub(crate) watch: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Load the configuration, start every provider and report.
    Check(JsonFlag),
    /// Print the configuration in force: every layer merged, variables expanded, secrets
    /// redacted (YAML; `--json` for JSON).
    Show(JsonFlag),
    /// Print the configuration's JSON Schema.
    Schema,
}

#[derive(Debug, Subcommand)]
pub(crate) enum OutputCommand {
    /// Print a stored output by its handle (`run-x/out-y`), a page of lines at a time.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The handle from the `tool_output` message.
    pub(crate) handle: String,
    /// The first line to print (0-based).
    #[arg(long, default_value_t = 0, value_parser = line_offset, allow_negative_numbers = true)]
    pub(crate) offset: u64,
    /// Lines to print (at least 1).
    #[arg(long, default_value_t = 2000, value_parser = line_count, allow_negative_numbers = true)]
    pub(crate) limit: u64,
    /// Print the page as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The first line to print: a whole number from 0 (clap's own parse said only `invalid
/// digit found in string`, and took `-1` for an option).
fn line_offset(text: &str) -> Result<u64, String> {
    text.trim().parse::<u64>().map_err(|_| {
        "must be a whole number of lines from 0, the first line (such as 100)".to_owned()
    })
}

/// A number of lines to print: a whole number of at least 1 (clap's own range check named
/// the range up to `u64::MAX`).
fn line_count(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("must be at least 1: the number of lines to print".to_owned()),
        Ok(lines) => Ok(lines),
        Err(_) => Err("must be a whole number of lines, at least 1 (such as 100)".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::listen_addr;

    #[test]
    fn http_addresses_people_type() {
        for (text, addr) in [
            ("8931", "127.0.0.1:8931"),
            (":8931", "127.0.0.1:8931"),
            ("localhost:8931", "127.0.0.1:8931"),
            ("127.0.0.1:0", "127.0.0.1:0"),
            ("[::1]:8931", "[::1]:8931"),
            ("0.0.0.0:8931", "0.0.0.0:8931"),
        ] {
            assert_eq!(listen_addr(text).map(|a| a.to_string()), Ok(addr.to_owned()), "{text}");
        }
        for text in ["localhost", "localhost:99999", "example.com:80", "8931x", ""] {
            assert!(listen_addr(text).is_err(), "{text}");
        }
    }
}
