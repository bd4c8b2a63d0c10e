//! One function per command.

use crate::args::{CallArgs, ServeArgs, ShowArgs};
use crate::callee::Callee;
use crate::exit;
use crate::progress::Spinner;
use anyhow::{Context as _, bail};
use serde_json::{Map, Value};
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;
use toolmux::Toolmux;
use toolmux::config::Loaded;
use toolmux::toolmux_core::{CallContext, ToolCall, ToolError, ToolKind, ToolProvider, ToolResult};
use toolmux::toolmux_mcp::server::{ApiKey, ApiKeys, MetricsSource};
use toolmux::toolmux_orchestrator::accounting::Stats;
use toolmux::toolmux_orchestrator::store::{self, StoreError};
use toolmux::toolmux_orchestrator::{FilteredView, Severity, WarmupReport};

/// How long interrupted work is given to end on its cancellation.
pub(crate) const INTERRUPT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `work` until it ends or the user interrupts it (Ctrl-C, or SIGTERM or SIGHUP:
/// [`crate::signals`]): then `cancel` is
/// cancelled and `work` is given [`INTERRUPT_GRACE`] to end on it before it is dropped, so
/// that it cleans up as a cancelled call does (a command's processes killed, a pending
/// external call withdrawn; kept in a shared folder, such a call would otherwise wait for an
/// answer nobody takes). `None` when interrupted.
pub(crate) async fn unless_interrupted<T>(
    work: impl Future<Output = T>,
    cancel: &CancellationToken,
) -> Option<T> {
    match until_interrupted(work, cancel).await {
        Interruptible::Done(done) => Some(done),
        Interruptible::Interrupted(_) => None,
    }
}

/// How work run by [`until_interrupted`] ended.
pub(crate) enum Interruptible<T> {
    /// It ended on its own.
    Done(T),
    /// A signal came; what the cancelled work gave back within the grace, if it did.
    Interrupted(Option<T>),
}

/// [`unless_interrupted`], keeping what the cancelled work gave back (an agent's report so
/// far) for a program that wants it.
pub(crate) async fn until_interrupted<T>(
    work: impl Future<Output = T>,
    cancel: &CancellationToken,
) -> Interruptible<T> {
    let _handling = crate::signals::Handling::start();
    tokio::pin!(work);
    tokio::select! {
        done = &mut work => return Interruptible::Done(done),
        () = crate::signals::received() => {}
    }
    // The caller reports the interruption and cleans up after `_handling` is dropped: when
    // `work` ends within this poll, `main` may see the signal only then, and must still
    // leave the command its grace (it printed `interrupted` a second time and cut the
    // cleanup short).
    crate::signals::take();
    cancel.cancel();
    Interruptible::Interrupted(tokio::time::timeout(INTERRUPT_GRACE, work).await.ok())
}

/// The first failure to write stdout but a closed pipe, kept for `main` to report: a full
/// disk (`> out.json`) or a failing device lost what was printed, and the command must not
/// end with 0 as if it were there.
static STDOUT_FAILURE: std::sync::Mutex<Option<std::io::Error>> = std::sync::Mutex::new(None);

/// Writes `text` and a newline to stdout; a closed pipe (`| head`) is not an error, and any
/// other failure is kept for [`stdout_failure`].
pub(crate) fn print(text: &str) {
    use std::io::IsTerminal as _;
    let mut out = std::io::stdout().lock();
    // What a tool read (a file, a web page) may hold escape sequences that would act on
    // the person's terminal (retitle it, move the cursor, write to the clipboard): on a
    // terminal, control characters other than line breaks and tabs are shown escaped.
    let text =
        if out.is_terminal() { for_terminal(text) } else { std::borrow::Cow::Borrowed(text) };
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        let mut failure = STDOUT_FAILURE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        failure.get_or_insert(e);
    }
}

/// Why something printed on stdout did not get there (a closed pipe aside), if it did not.
pub(crate) fn stdout_failure() -> Option<std::io::Error> {
    STDOUT_FAILURE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
}

/// `text` with its control characters but line breaks and tabs shown as escapes (`\x1b`),
/// so that escape sequences a model, a tool, a server or a file wrote cannot act on the
/// person's terminal (retitle it, clear it, write to the clipboard, colour what follows).
pub(crate) fn for_terminal(text: &str) -> std::borrow::Cow<'_, str> {
    // C0 controls but line feeds and tabs, DEL and C1 (`char::is_control`); a carriage
    // return only where it ends a line (CRLF text), since alone it lets what follows
    // overwrite what the person just read.
    if !text.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\t')) {
        return std::borrow::Cow::Borrowed(text);
    }
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let active = |i: usize, c: char| match c {
        '\n' | '\t' => false,
        '\r' => chars.get(i + 1).is_none_or(|&(_, next)| next != '\n'),
        c => c.is_control(),
    };
    if !chars.iter().enumerate().any(|(i, &(_, c))| active(i, c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for (i, &(_, c)) in chars.iter().enumerate() {
        if active(i, c) {
            // Every control character is below U+00A0: `\x1b`, `\x07`, `\x9b`.
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` as [`for_terminal`] shows it when stderr is a terminal, else as it is: a pipe or
/// a file gets the bytes the model, tool or server sent.
pub(crate) fn for_stderr(text: &str) -> std::borrow::Cow<'_, str> {
    use std::io::IsTerminal as _;
    if std::io::stderr().is_terminal() {
        for_terminal(text)
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// The secrets of the configuration, for what this process prints outside the pipeline
/// (its last error, its log): kept after loading, and again after each `serve --watch`
/// reload.
static SECRETS: std::sync::RwLock<Option<Kept>> = std::sync::RwLock::new(None);

/// The secrets kept so far and their redactor.
#[derive(Debug)]
struct Kept {
    secrets: Vec<String>,
    redactor: Arc<toolmux::toolmux_orchestrator::Redactor>,
}

/// Keeps `loaded`'s secrets for [`redacted`] and the log, beside those kept before: a
/// reloaded configuration's new secrets are cut from what its servers print, and the
/// previous one's still are, from what its servers print while they stop.
pub(crate) fn keep_secrets(loaded: &Loaded) {
    let mut kept = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    let mut secrets = kept.as_ref().map(|k| k.secrets.clone()).unwrap_or_default();
    let known = secrets.len();
    for secret in &loaded.secrets {
        if !secrets.contains(secret) {
            secrets.push(secret.clone());
        }
    }
    if kept.is_none() || secrets.len() > known {
        let redactor = Arc::new(toolmux::toolmux_orchestrator::Redactor::new(secrets.clone()));
        *kept = Some(Kept { secrets, redactor });
    }
}

/// `text` without the configuration's secrets (as it is before they are known).
pub(crate) fn redacted(text: &str) -> std::borrow::Cow<'_, str> {
    let redactor =
        SECRETS.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|k| k.redactor.clone());
    match redactor {
        Some(redactor) => redactor.redact(text),
        None => std::borrow::Cow::Borrowed(text),
    }
}

/// Standard error for the log, each event's line redacted ([`redacted`]): the log shows
/// what servers printed and what libraries saw (a URL with its key), not only our text.
struct RedactedStderr;

impl std::io::Write for RedactedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes an event's whole line at once.
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().lock().write_all(redacted(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// The fields of a log line (its message, `error=…`, `tool=…`, a span's fields) as
/// tracing's default formats them, shown as [`for_terminal`] shows text when `escape`
/// (stderr is a terminal): they carry what servers wrote (an MCP server's stderr lines,
/// the errors and tool names of upstreams), whose escape sequences would otherwise act on
/// the terminal. tracing escapes some of the message's (ESC, BEL), not a lone CR, and none
/// of a field given by `%`.
///
/// Escaped here rather than in the writer: there the formatter's own colours (the level,
/// the dimmed timestamp) and a server's `ESC[…m` are the same bytes, and letting colour
/// through would let a server's through too (`ESC[8m` hides the rest of the line). Outside
/// the fields everything the formatter writes is its own. Field names lose their italics.
#[derive(Debug, Clone, Copy)]
struct LogFields {
    escape: bool,
}

impl<'writer> tracing_subscriber::fmt::FormatFields<'writer> for LogFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::format::{DefaultFields, Writer};
        if !self.escape {
            return DefaultFields::new().format_fields(writer, fields);
        }
        // Formatted whole first, so that a CR before a line feed (kept) is told from a
        // lone one (escaped) whatever pieces the formatter writes it in.
        let mut plain = String::new();
        DefaultFields::new().format_fields(Writer::new(&mut plain), fields)?;
        writer.write_str(&for_terminal(&plain))
    }
}

/// Logging to stderr: `RUST_LOG` when set, else errors and the warnings of toolmux's own
/// crates (an upstream tool left out for a malformed schema, a cut tool list, a dangling
/// `$ref` removed: what a user of `tools list` or `serve` should know), errors only with
/// `-q`, more with each `-v`. rmcp's own log lines are left out unless asked for (`-vv` or
/// `RUST_LOG`): it logs as an error every transport it gives up on, which toolmux reports
/// once, in its own words.
///
/// By default two kinds of warning are left out, as noise: the failed calls of
/// `toolmux::tool` (`tools call` prints the failure, a client of `serve` gets it as the
/// result), and warnings once toolmux stops its providers ([`finish`]), which are about
/// servers going away as asked (a refresh cut short, a server slow to exit).
///
/// `traceMCP` (`trace_mcp`) shows its lines whatever else the filter says: they are what the
/// configuration asked for, and `RUST_LOG=off` or `warn`, often set once for every program,
/// would otherwise drop them unseen. Its filter is joined to the other rather than written
/// into it, since there the more specific of two directives wins, not the more verbose:
/// `toolmux_mcp=debug` would hide the trace lines of `-vvv` or `RUST_LOG=trace`.
pub(crate) fn init_tracing(verbose: u8, quiet: bool, trace_mcp: bool) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::filter::FilterExt as _;
    use tracing_subscriber::layer::{Filter, Layer as _, SubscriberExt as _};
    use tracing_subscriber::util::SubscriberInitExt as _;
    let rust_log = std::env::var("RUST_LOG").ok().filter(|spec| !spec.is_empty());
    // The default log is for a user, not a diagnosis: warnings without a timestamp.
    let plain = rust_log.is_none() && verbose == 0 && !quiet && !trace_mcp;
    let filter: Box<dyn Filter<_> + Send + Sync> = match rust_log {
        Some(spec) => Box::new(EnvFilter::new(spec)),
        None if verbose == 0 && !quiet => {
            let warnings = EnvFilter::new("error,toolmux=warn,toolmux::tool=error,rmcp=off");
            let not_stopping = tracing_subscriber::filter::filter_fn(|meta| {
                *meta.level() == tracing::Level::ERROR || !STOPPING.load(Ordering::Relaxed)
            });
            Box::new(warnings.and(not_stopping).and(StartFailures))
        }
        None => {
            let level = match verbose {
                0 => "error",
                1 => "info",
                2 => "debug",
                _ => "trace",
            };
            let rmcp = if verbose >= 2 { "" } else { ",rmcp=off" };
            Box::new(EnvFilter::new(format!("{level}{rmcp}")))
        }
    };
    let filter: Box<dyn Filter<_> + Send + Sync> = if trace_mcp {
        // The MCP client's connections, and every call's request (its arguments, secrets
        // redacted) and response (latency, size, status).
        let trace = EnvFilter::new("toolmux_mcp=debug,toolmux::tool=trace");
        Box::new(tracing_subscriber::filter::FilterExt::or(filter, trace))
    } else {
        Box::new(filter)
    };
    // Colours only on a terminal: in a file or a pipe they would stand between the words a
    // reader greps for (` WARN tool response`, `server=NAME`).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let layer = tracing_subscriber::fmt::layer()
        .fmt_fields(LogFields { escape: std::io::IsTerminal::is_terminal(&std::io::stderr()) })
        .with_writer(|| RedactedStderr)
        .with_target(verbose > 1)
        .with_ansi(colour);
    let layer = match plain {
        true => layer.without_time().with_filter(filter).boxed(),
        false => layer.with_filter(filter).boxed(),
    };
    // At a terminal, the model client's waits before it tries a request again are shown
    // ([`crate::waits`]), whatever the log's level: its retry events only.
    let waits = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        crate::waits::ModelWaits::default().with_filter(EnvFilter::new("toolmux_llm=debug"))
    });
    let _ = tracing_subscriber::registry().with(layer).with(waits).try_init();
}

/// Builds everything and starts every provider, with a spinner on a terminal.
pub(crate) async fn start(
    loaded: &Loaded,
    keep: &(dyn Fn(&str) -> bool + Sync),
) -> anyhow::Result<(Toolmux, WarmupReport)> {
    start_reporting(loaded, keep, true, None).await
}

/// [`start`] for a reload: MCP servers whose configuration did not change are taken over
/// from `previous`, running (see [`Toolmux::rebuild`]).
pub(crate) async fn restart(
    loaded: &Loaded,
    previous: &Toolmux,
) -> anyhow::Result<(Toolmux, WarmupReport)> {
    start_reporting(loaded, &|_| true, true, Some(previous)).await
}

/// [`start`], warning on stderr of each provider that failed to start only when
/// `warn_failures` (`config check` reports them in its table instead).
async fn start_reporting(
    loaded: &Loaded,
    keep: &(dyn Fn(&str) -> bool + Sync),
    warn_failures: bool,
    previous: Option<&Toolmux>,
) -> anyhow::Result<(Toolmux, WarmupReport)> {
    start_waiting(loaded, keep, warn_failures, previous, None).await
}

/// How long `toolmux serve` waits for its providers before it answers clients: some give
/// a server 10 s to start (Codex). Providers slower than that join when they are up, and
/// clients get `list_changed`.
const SERVE_WAITS: std::time::Duration = std::time::Duration::from_secs(8);

/// [`start_reporting`], waiting at most `wait` for the providers to start (the rest join
/// when they are up; see `Orchestrator::warmup_within`).
async fn start_waiting(
    loaded: &Loaded,
    keep: &(dyn Fn(&str) -> bool + Sync),
    warn_failures: bool,
    previous: Option<&Toolmux>,
    wait: Option<std::time::Duration>,
) -> anyhow::Result<(Toolmux, WarmupReport)> {
    let toolmux = match previous {
        Some(previous) => Toolmux::rebuild(loaded, previous).await?,
        None => Toolmux::build_only(loaded, keep).await?,
    };
    for warning in toolmux.warnings().iter().skip(loaded.warnings.len()) {
        eprintln!("warning: {warning}");
    }
    let providers = toolmux.orchestrator().providers().len();
    let spinner = Spinner::start(format!(
        "starting {providers} provider{}",
        if providers == 1 { "" } else { "s" }
    ));
    WARMING.store(true, Ordering::Relaxed);
    let report = toolmux.orchestrator().warmup_within(wait).await;
    WARMING.store(false, Ordering::Relaxed);
    spinner.finish();
    for provider in report.providers.iter().filter(|_| warn_failures) {
        match &provider.error {
            Some(note) if provider.starting => {
                eprintln!("note: provider `{}` is {note}", provider.namespace);
            }
            Some(error) => {
                eprintln!("warning: provider `{}` failed to start: {error}", provider.namespace);
            }
            None => {}
        }
    }
    for problem in &report.problems {
        let level = if problem.severity == Severity::Error { "error" } else { "warning" };
        eprintln!("{level}: {}", problem.message);
    }
    Ok((toolmux, report))
}

/// Set once toolmux stops its providers: the default log then leaves warnings out (see
/// [`init_tracing`]).
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Set while the providers start ([`start_waiting`]), which says itself which failed: the
/// default log then leaves out the warnings that say so too (see [`StartFailures`]).
static WARMING: AtomicBool = AtomicBool::new(false);

/// Leaves out, while [`WARMING`], the warnings of a provider that failed to start (the MCP
/// client's and the orchestrator's) and the registry's problems (a name collision), which
/// the CLI prints once, from the warmup's report.
#[derive(Debug, Clone, Copy)]
struct StartFailures;

impl<S> tracing_subscriber::layer::Filter<S> for StartFailures {
    fn enabled(
        &self,
        _meta: &tracing::Metadata<'_>,
        _cx: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        true
    }

    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _cx: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        /// Whether the event's message says a provider failed to start.
        struct Said(bool);
        impl tracing::field::Visit for Said {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let text = format!("{value:?}");
                    self.0 = ["mcp server failed to start", "provider failed to start"]
                        .iter()
                        .any(|start| text.starts_with(start));
                }
            }
        }
        let meta = event.metadata();
        if *meta.level() != tracing::Level::WARN || !WARMING.load(Ordering::Relaxed) {
            return true;
        }
        let target = meta.target();
        if ["toolmux_orchestrator::registry", "toolmux_orchestrator::catalog"].contains(&target) {
            return false;
        }
        let mut said = Said(false);
        event.record(&mut said);
        !said.0
    }
}

/// Stops everything, saving statistics; a failure to save is only a warning.
pub(crate) async fn finish(toolmux: &Toolmux) {
    STOPPING.store(true, Ordering::Relaxed);
    if let Err(e) = toolmux.shutdown().await {
        eprintln!("warning: {}", stop_failure(&e));
    }
}

/// What went wrong saving statistics or stopping, with its causes, each said once: a
/// statistics file's own error names the file, which `ToolmuxError::Stats` names before it
/// (`statistics file X: statistics file X is a folder ...`), and alone it says no cause.
pub(crate) fn stop_failure(error: &toolmux::ToolmuxError) -> String {
    match error {
        toolmux::ToolmuxError::Stats { source, .. } => toolmux::toolmux_core::error_report(source),
        other => toolmux::toolmux_core::error_report(other),
    }
}

pub(crate) async fn tools_list(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    let (toolmux, report) = start(loaded, &|_| true).await?;
    let tools = toolmux.orchestrator().tools();
    if json {
        print(&serde_json::to_string_pretty(&tools)?);
    } else {
        let width = tools.iter().map(|t| t.name.len()).max().unwrap_or(0);
        let columns = table_columns();
        let registry = toolmux.orchestrator().registry();
        let mut text = String::new();
        for tool in &tools {
            // Tools models are not listed: found by searching, or called by name only.
            let mark = match registry.get(&tool.name) {
                Some(entry) if entry.deferred => "[deferred: tools__search] ",
                _ if !tool.annotations.visible => "[hidden] ",
                _ => "",
            };
            let summary = tool.description.lines().next().unwrap_or("").trim();
            let summary = match columns {
                Some(columns) => {
                    let room = columns.saturating_sub(width + 2 + mark.chars().count());
                    shorten(summary, room.max(MIN_SUMMARY_COLUMNS))
                }
                None => summary.to_owned(),
            };
            text.push_str(&format!("{:width$}  {mark}{summary}\n", tool.name));
        }
        print(text.trim_end());
        let denied = registry.entries().filter(|e| e.denied()).count();
        let denied = match denied {
            0 => String::new(),
            n => format!(" ({n} more denied by `permissions`, not listed)"),
        };
        eprintln!(
            "{} tool{} from {} provider{}{denied}",
            tools.len(),
            if tools.len() == 1 { "" } else { "s" },
            report.providers.len(),
            if report.providers.len() == 1 { "" } else { "s" },
        );
    }
    finish(&toolmux).await;
    // A name collision is a configuration error, as `config check` says.
    let collided = report.problems.iter().any(|p| p.severity == Severity::Error);
    Ok(if collided {
        exit::CONFIG
    } else if report.providers.iter().any(|p| p.error.is_some()) {
        exit::PROVIDER
    } else {
        0
    })
}

/// The fewest columns of a description `tools list` shows at a terminal, however narrow:
/// fewer tell nothing, and the terminal wraps the line instead.
const MIN_SUMMARY_COLUMNS: usize = 20;

/// How wide `tools list` may print its lines: `None` when stdout is no terminal, so a pipe
/// or a file gets every description's first line whole (for a program or a pager; `--json`
/// for structure). At a terminal `COLUMNS` when it is set to a number, so a person can ask
/// for more or fewer, else the terminal's width (80 when it tells none). `COLUMNS` does
/// not apply off a terminal: many shells and CI systems export it to every program, and a
/// pipe's reader would lose the words it looks for.
fn table_columns() -> Option<usize> {
    use std::io::IsTerminal as _;
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return None;
    }
    let asked = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse::<usize>().ok());
    let columns = asked.filter(|&c| c > 0).or_else(|| {
        let size = rustix::termios::tcgetwinsize(&stdout).ok()?;
        Some(usize::from(size.ws_col)).filter(|&c| c > 0)
    });
    Some(columns.unwrap_or(80))
}

/// `word` as a shell reads it back: as it is when plain, else in single quotes.
fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:=@%".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", cut.trim_end())
}

/// The call's arguments: `ARGS_JSON` (an object), then each `--arg key=value`. A value is
/// read as JSON (`3`, `true`, `[1,2]`, `{"a":1}`) unless the tool's `schema` says the
/// parameter is a string (or may be one, and the JSON is of a type it may not be): then it
/// is the text as given, so `--arg pattern=404` looks for `404`.
pub(crate) fn call_arguments(
    json: Option<&str>,
    pairs: &[String],
    schema: Option<&Value>,
) -> anyhow::Result<Value> {
    let mut arguments = match json {
        None => Map::new(),
        Some(text) => match serde_json::from_str(text) {
            Ok(Value::Object(map)) => map,
            Ok(other) => bail!(
                "ARGS_JSON must be a JSON object, not `{other}`: give the arguments by name, \
                 such as '{{\"path\": \"README.md\"}}'"
            ),
            Err(e) if lone_surrogate(text, &e) => bail!(
                "ARGS_JSON is not valid JSON: {e}: a `\\uD800`-`\\uDFFF` escape is half of a \
                 character and comes in pairs (`\\ud83d\\ude00` is one emoji); a lone one is \
                 no Unicode character: write the character itself, or both halves"
            ),
            Err(e) => bail!("ARGS_JSON is not valid JSON: {e}; {}", json_hint(text)),
        },
    };
    // A key given twice is refused: serde keeps the last value without a word, and a model
    // or a person would call the tool with a value they did not mean.
    if let Some((key, line, column)) = json.and_then(toolmux::config::duplicate_json_key) {
        bail!(
            "ARGS_JSON gives the key `{key}` twice in one object (line {line}, column \
             {column}): give each key once, as the tool would get only the last value, and a \
             list as one JSON array (`{{\"{key}\": [1, 2]}}`)"
        );
    }
    let mut given: Vec<&str> = Vec::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            bail!(
                "--arg `{pair}` has no value: write --arg {pair}=VALUE (`{pair}=` for an empty string)"
            );
        };
        if key.trim().is_empty() {
            bail!("--arg `{pair}` has no name before `=`: write --arg KEY=VALUE");
        }
        // A key given twice is refused: the later value won without a word, and a script
        // that builds the options may repeat one by mistake. A list is one JSON array.
        if let Some(earlier) =
            given.iter().find(|p| p.split_once('=').is_some_and(|(k, _)| k == key))
        {
            bail!(
                "--arg `{key}` is given twice (`{earlier}`, then `{pair}`): give each argument \
                 once, and a list as one JSON array (`--arg {key}='[1, 2]'`)"
            );
        }
        given.push(pair);
        let types = schema.and_then(|s| s.get("properties")?.get(key)).map(schema_types);
        let value = match serde_json::from_str::<Value>(value) {
            Ok(json) if !wants_text(types.as_deref(), &json) => json,
            _ => Value::String(value.into()),
        };
        arguments.insert(key.to_owned(), value);
    }
    Ok(Value::Object(arguments))
}

/// Whether serde failed on `text` at a `\uD800`-`\uDFFF` escape without its other half
/// (serde says only "unexpected end of hex escape" or "lone leading surrogate").
fn lone_surrogate(text: &str, e: &serde_json::Error) -> bool {
    let message = e.to_string();
    (message.contains("surrogate") || message.contains("hex escape"))
        && text.to_ascii_lowercase().split("\\u").skip(1).any(|hex| {
            hex.get(..4)
                .and_then(|h| u16::from_str_radix(h, 16).ok())
                .is_some_and(|unit| (0xD800..=0xDFFF).contains(&unit))
        })
}

/// How to give the arguments that `text`, not JSON, was meant as: `key=value` words
/// become `--arg` options, anything else is shown as one JSON object in single quotes.
fn json_hint(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let pairs = !words.is_empty()
        && words.iter().all(|w| {
            w.split_once('=').is_some_and(|(k, _)| !k.is_empty() && !k.contains(['{', '"']))
        });
    if pairs {
        let options: Vec<String> =
            words.iter().map(|w| format!("--arg {}", shell_word(w))).collect();
        format!("to give arguments as KEY=VALUE, write {}", options.join(" "))
    } else {
        "give one JSON object in single quotes, such as '{\"path\": \"README.md\"}', or each \
         argument as --arg KEY=VALUE"
            .to_owned()
    }
}

/// The JSON types a property's schema names (`type`, or those of its `anyOf`/`oneOf`
/// branches); empty when it names none.
fn schema_types(property: &Value) -> Vec<String> {
    let mut types = Vec::new();
    match property.get("type") {
        Some(Value::String(t)) => types.push(t.clone()),
        Some(Value::Array(list)) => {
            types.extend(list.iter().filter_map(Value::as_str).map(str::to_owned));
        }
        _ => {}
    }
    for key in ["anyOf", "oneOf"] {
        for branch in property.get(key).and_then(Value::as_array).into_iter().flatten() {
            types.extend(schema_types(branch));
        }
    }
    types
}

/// Whether a `--arg` value that reads as `json` is meant as text: the parameter may be a
/// string and may not be what the JSON is.
fn wants_text(types: Option<&[String]>, json: &Value) -> bool {
    let Some(types) = types.filter(|t| !t.is_empty()) else { return false };
    let is = |name: &str| types.iter().any(|t| t == name);
    let fits = match json {
        Value::Null => is("null"),
        Value::Bool(_) => is("boolean"),
        Value::Number(n) => is("number") || (is("integer") && (n.is_i64() || n.is_u64())),
        Value::String(_) => is("string"),
        Value::Array(_) => is("array"),
        Value::Object(_) => is("object"),
    };
    is("string") && !fits
}

pub(crate) async fn tools_call(loaded: &Loaded, call: CallArgs) -> anyhow::Result<u8> {
    if !call.extra.is_empty() {
        let words: Vec<&str> =
            call.arguments.iter().chain(&call.extra).map(String::as_str).collect();
        let listed = words.iter().map(|w| shell_word(w)).collect::<Vec<_>>().join(" ");
        let message = format!(
            "the arguments are one word, a JSON object, not {listed}; {}",
            json_hint(&words.join(" "))
        );
        return Ok(refuse(call.json, exit::CONFIG, &message));
    }
    // Checked before anything starts; read again with the tool's schema once it is known.
    if let Err(e) = call_arguments(call.arguments.as_deref(), &call.args, None) {
        return Ok(refuse(call.json, exit::CONFIG, &format!("{e:#}")));
    }
    // Only the provider of the tool is started, when the name (or alias) says which; a
    // name no provider could have is refused before any starts, and never counted.
    let namespace = match Callee::of(loaded, &call.name) {
        Callee::Provider(namespace) => Some(namespace),
        Callee::Everything => None,
        Callee::Nowhere(namespace) => {
            let message = crate::callee::nowhere(loaded, &call.name, namespace.as_deref()).await;
            if call.json {
                // The envelope a call of an unknown tool gets from the orchestrator.
                let error = ToolError::UnknownTool { name: call.name.clone(), suggestions: vec![] };
                let mut result = ToolResult::from_error(&error, ToolKind::Composite, "", 0);
                result.error = Some(message.clone());
                print(&serde_json::to_string_pretty(&result)?);
            }
            eprintln!("error: {message}");
            return Ok(exit::TOOL_FAILED);
        }
    };
    let keep = |ns: &str| namespace.as_deref().is_none_or(|wanted| wanted == ns);
    let (toolmux, report) = start(loaded, &keep).await?;
    let cancel = CancellationToken::new();
    // Made by whoever runs `toolmux`, not by a model (an agent's calls are its own).
    let mut ctx = CallContext::new().with_cancel(cancel.clone()).from_person();
    // A person at a terminal approves calls that ask, and answers the tool's forms and
    // URLs to open; a program (a pipe) gets the unattended answers.
    if std::io::IsTerminal::is_terminal(&std::io::stdin())
        && std::io::IsTerminal::is_terminal(&std::io::stderr())
    {
        ctx = ctx.with_handler(Arc::new(crate::terminal::Terminal::for_project(&loaded.base_dir)));
    }
    let orchestrator = toolmux.orchestrator();
    let schema = orchestrator.registry().get(&call.name).map(|e| e.spec.input_schema.clone());
    let arguments = call_arguments(call.arguments.as_deref(), &call.args, schema.as_deref())?;
    let call_future = orchestrator.execute(ToolCall::new(call.name.clone(), arguments), &ctx);
    let Some(result) = unless_interrupted(call_future, &cancel).await else {
        eprintln!("interrupted");
        if call.json {
            let code = crate::signals::exit_code().unwrap_or(exit::INTERRUPTED);
            print_error_json("interrupted", code);
        }
        finish(&toolmux).await;
        return Ok(exit::INTERRUPTED);
    };
    // A tool whose provider could not start is a start failure, not a tool failure.
    let provider_failed = report
        .providers
        .iter()
        .any(|p| namespace.as_deref() == Some(p.namespace.as_str()) && p.error.is_some());
    if call.json {
        print(&serde_json::to_string_pretty(&result)?);
    } else if !result.ok && provider_failed {
        // The orchestrator's own words are for a gateway that goes on (the provider is
        // tried again in the background); this process ends now, and the warning above
        // says why the provider did not start.
        let namespace = namespace.as_deref().unwrap_or_default();
        eprintln!(
            "error: `{}` cannot be called: provider `{namespace}` did not start (the warning \
             above says why); fix its entry in the configuration and check it with `toolmux \
             config check`",
            call.name
        );
    } else if result.ok {
        print(result.result.as_deref().unwrap_or(""));
        if let Some(handle) = spilled_handle(&result) {
            // The configuration names where outputs are kept: the hint reads the same one,
            // every file given with --config (a later one may set `defaults.outputDir`).
            let added =
                loaded.layers.iter().filter(|l| l.kind == toolmux::config::LayerKind::Added);
            let config: String = loaded
                .path
                .iter()
                .chain(added.map(|l| &l.path))
                .map(|path| format!(" --config {}", shell_word(&path.display().to_string())))
                .collect();
            eprintln!(
                "note: the whole output is stored; read it with `toolmux{config} output show {handle}`"
            );
        }
    } else {
        let error = result.error.as_deref().unwrap_or("the tool failed");
        // The name was wrong and nothing close to it was found: say where the names are.
        let unknown = result.extras.get("code").and_then(Value::as_str) == Some("unknown_tool");
        if unknown && !error.contains("did you mean") {
            eprintln!("error: {error}; `toolmux tools list` shows every tool's name");
        } else {
            eprintln!("error: {error}");
        }
    }
    finish(&toolmux).await;
    if result.ok {
        return Ok(0);
    }
    Ok(if provider_failed { exit::PROVIDER } else { exit::TOOL_FAILED })
}

/// `GET /metrics` of the gateway: the orchestrator's statistics, kept across runs.
#[derive(Debug)]
struct StatsPage(crate::reload::Current);

impl MetricsSource for StatsPage {
    fn render(&self) -> String {
        self.0.get().orchestrator().stats().prometheus()
    }
}

/// What decides the API keys of `serve --http` besides the configuration: the command
/// line's `--api-key-env`, address and `--no-auth`.
#[derive(Debug, Clone)]
pub(crate) struct KeyRule {
    api_key_envs: Vec<String>,
    http: Option<std::net::SocketAddr>,
    no_auth: bool,
}

impl KeyRule {
    fn of(args: &ServeArgs) -> KeyRule {
        KeyRule {
            api_key_envs: args.api_key_envs.clone(),
            http: args.transport.http,
            no_auth: args.no_auth,
        }
    }

    /// Whether the server listens on HTTP (`serve --http`), where keys and tokens count.
    pub(crate) fn serves_http(&self) -> bool {
        self.http.is_some()
    }

    /// The API keys of `serve --http`: `serve.apiKeys` and `--api-key-env`. Without any,
    /// only a loopback address is served, unless `--no-auth`.
    pub(crate) fn keys(&self, loaded: &Loaded) -> Result<Vec<ApiKey>, String> {
        api_keys(loaded, self)
    }
}

fn api_keys(loaded: &Loaded, args: &KeyRule) -> Result<Vec<ApiKey>, String> {
    let mut keys: Vec<ApiKey> = loaded
        .config
        .serve
        .api_keys
        .iter()
        .map(|(name, key)| ApiKey { name: name.clone(), key: key.clone() })
        .collect();
    for var in &args.api_key_envs {
        match std::env::var(var) {
            Ok(key) if !key.trim().is_empty() => {
                keys.push(ApiKey { name: var.clone(), key: key.trim().to_owned() });
            }
            _ => {
                return Err(format!(
                    "--api-key-env {var}: the environment variable {var} is not set (or empty)"
                ));
            }
        }
    }
    if let Some(short) = keys.iter().find(|k| k.key.trim().len() < 16) {
        return Err(format!(
            "API key `{}` is shorter than 16 characters; use a long random key (`openssl rand -hex 32`)",
            short.name
        ));
    }
    if let Some(addr) = args.http
        && keys.is_empty()
        && loaded.config.serve.oauth.is_none()
        && !addr.ip().is_loopback()
        && !args.no_auth
    {
        return Err(format!(
            "serving on {addr} without an API key would let anyone who reaches it call every \
             tool; give keys (`serve.apiKeys` in the configuration, or `--api-key-env VAR`) or \
             an authorization server (`serve.oauth`), listen on 127.0.0.1, or pass --no-auth"
        ));
    }
    Ok(keys)
}

/// `serve.holderTools`: the tools of key holders that are not served every tool, each a
/// view of the orchestrator serving now (within `--tools`).
#[derive(Debug)]
struct HolderTools {
    current: crate::reload::Current,
    holders: HolderToolsMap,
    within: Vec<String>,
}

/// `serve.holderTools` as served now.
pub(crate) type HolderToolsMap =
    Arc<std::sync::RwLock<std::collections::BTreeMap<String, Vec<String>>>>;

impl toolmux::toolmux_mcp::server::HolderViews for HolderTools {
    fn view(&self, holder: &str) -> Option<Arc<dyn ToolProvider>> {
        let globs = self.holders.read().unwrap_or_else(|e| e.into_inner()).get(holder)?.clone();
        let view = FilteredView::new(self.current.orchestrator(), globs);
        Some(Arc::new(view.within(self.within.clone())))
    }
}

fn spilled_handle(result: &ToolResult) -> Option<&str> {
    result.extras.get("spilled")?.get("handle")?.as_str()
}

/// Why the name prefix of `serve` cannot be used: one so long that it leaves less than a
/// served name needs of a client's 64 characters.
fn name_prefix_refusal(args: &ServeArgs, loaded: &Loaded) -> Option<String> {
    use toolmux::toolmux_mcp::server::LONGEST_NAME_PREFIX;
    let (prefix, origin) = match (&args.name_prefix, &loaded.config.serve.name_prefix) {
        (Some(prefix), _) => (prefix, "--name-prefix".to_owned()),
        (None, Some(prefix)) => (prefix, format!("{}: serve.namePrefix", loaded.source_name())),
        (None, None) => return None,
    };
    let length = prefix.chars().count();
    (length > LONGEST_NAME_PREFIX).then(|| {
        format!(
            "{origin} is {length} characters long; a client takes a tool's name with its prefix \
             in 64 characters at most, and toolmux keeps {} of them for the tool's own name: \
             use a prefix of at most {LONGEST_NAME_PREFIX} characters",
            64 - LONGEST_NAME_PREFIX
        )
    })
}

pub(crate) async fn serve(loaded: &Loaded, args: ServeArgs) -> anyhow::Result<u8> {
    // The files as loaded, before the servers start: `--watch` reloads on a change made
    // while they do, where it looked first only once serving and missed it for good.
    let cwd = std::env::current_dir().unwrap_or_else(|_| loaded.base_dir.clone());
    let source = crate::reload::Source::of(loaded, cwd);
    let first_look = if args.watch { crate::reload::look(&source) } else { Vec::new() };
    use toolmux::toolmux_mcp::server::{ServeOptions, TokenVerifier, bind_http, serve_stdio};
    // Checked before any provider starts.
    let key_rule = KeyRule::of(&args);
    let api_keys = match key_rule.keys(loaded) {
        Ok(keys) => ApiKeys::new(keys),
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(exit::CONFIG);
        }
    };
    if let Some(e) = name_prefix_refusal(&args, loaded) {
        eprintln!("error: {e}");
        return Ok(exit::CONFIG);
    }
    // The authorization server's keys are fetched before anything starts: a wrong issuer
    // is a configuration error, not a gateway that refuses everyone.
    let token_verifier = match (&loaded.config.serve.oauth, args.transport.http) {
        (Some(oauth), Some(_)) => match TokenVerifier::new(oauth.clone()).await {
            Ok(verifier) => Some(Arc::new(verifier)),
            Err(e) => {
                eprintln!("error: {}: serve.oauth: {e}", loaded.source_name());
                return Ok(exit::CONFIG);
            }
        },
        _ => None,
    };
    let (toolmux, _report) =
        start_waiting(loaded, &|_| true, true, None, Some(SERVE_WAITS)).await?;
    let current = crate::reload::Current::new(toolmux.clone());
    // The command line's over the file's (checked when it was built).
    let serve = &loaded.config.serve;
    let client = args.client.or(serve.client_profile().ok().flatten());
    let affinity = args.transport.http.and_then(|_| toolmux.session_affinity());
    let mut options = ServeOptions {
        name_prefix: args.name_prefix.or_else(|| serve.name_prefix.clone()),
        client: client.unwrap_or_default(),
        detect_client: client.is_none(),
        page_size: args.page_size.max(1),
        api_keys: api_keys.clone(),
        metrics: Some(Arc::new(StatsPage(current.clone()))),
        events: Some(Arc::new(crate::events::CallEvents(current.clone()))),
        task_tools: loaded.config.serve.task_tools.clone(),
        token_verifier,
        // With `backend.redis`, sessions are shared with the other replicas over HTTP.
        affinity,
        ..ServeOptions::default()
    };
    if let Some(max) = serve.max_sessions {
        options.max_sessions = max.get();
    }
    options.allowed_hosts.extend(args.allowed_hosts);
    options.allowed_hosts.extend(serve.allowed_hosts.iter().cloned());
    // Checked when the configuration was built (`Toolmux::build`); replaced on reloads.
    let holder_tools: HolderToolsMap =
        Arc::new(std::sync::RwLock::new(loaded.config.serve.holder_tools.clone()));
    options.views = Some(Arc::new(HolderTools {
        current: current.clone(),
        holders: holder_tools.clone(),
        within: args.tools.clone(),
    }));
    let globs = args.tools.clone();
    let serve_provider = move |toolmux: &Toolmux| -> Arc<dyn ToolProvider> {
        let orchestrator = toolmux.orchestrator().clone();
        if globs.is_empty() {
            Arc::new(orchestrator)
        } else {
            // Names outside the globs are neither listed nor callable (nor suggested).
            Arc::new(FilteredView::new(orchestrator, globs.clone()))
        }
    };
    let watching = CancellationToken::new();
    let watched = (args.watch && !source.files().is_empty()).then_some(source);
    let provider: Arc<dyn ToolProvider> = match watched {
        Some(source) => {
            let live = crate::reload::Live::new(serve_provider(&toolmux));
            let keys = crate::reload::Keys {
                accepted: api_keys,
                rule: key_rule,
                holder_tools: holder_tools.clone(),
                oauth: loaded.config.serve.oauth.clone(),
            };
            tokio::spawn(crate::reload::watch(
                source,
                first_look,
                current.clone(),
                live.clone(),
                serve_provider,
                keys,
                watching.clone(),
            ));
            live
        }
        None => {
            if args.watch {
                eprintln!("warning: --watch: there is no configuration file to watch");
            }
            serve_provider(&toolmux)
        }
    };
    // A gateway runs for long: save statistics now and then, not only at the end.
    let saver = tokio::spawn({
        let current = current.clone();
        async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
            every.tick().await;
            loop {
                every.tick().await;
                if let Err(e) = current.get().save_stats().await {
                    tracing::warn!("cannot save statistics: {}", stop_failure(&e));
                }
            }
        }
    });
    let handling = crate::signals::Handling::start();
    let served = match args.transport.http {
        None => {
            // A person who started the gateway by hand sees what it serves; an MCP client
            // (stderr not a terminal) gets a quiet stderr and pure protocol on stdout.
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                let tools = provider.list_tools().await.map_or(0, |tools| tools.len());
                eprintln!(
                    "toolmux: serving {tools} tools as an MCP server on stdio (Ctrl-C stops; \
                     `toolmux serve --http 127.0.0.1:8765` serves over HTTP)"
                );
            }
            tokio::select! {
                served = serve_stdio(provider, options) => served.context("serving on stdio"),
                () = crate::signals::received() => Ok(()),
            }
        }
        Some(addr) => {
            let shutdown = CancellationToken::new();
            let keys = match options.api_keys.len() {
                0 => String::new(),
                1 => "clients need the API key; ".to_owned(),
                n => format!("clients need one of {n} API keys; "),
            };
            match bind_http(provider, addr, options, shutdown.clone()).await {
                Err(e) => Err(anyhow::Error::new(e)),
                Ok((bound, task)) => {
                    eprintln!("toolmux: serving MCP at http://{bound}/mcp ({keys}Ctrl-C stops)");
                    crate::signals::received().await;
                    shutdown.cancel();
                    match task.await {
                        Ok(served) => served.context("serving over HTTP"),
                        Err(e) => Err(anyhow::Error::new(e).context("serving over HTTP")),
                    }
                }
            }
        }
    };
    saver.abort();
    watching.cancel();
    finish(&current.get()).await;
    drop(handling);
    match served {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("error: {e:#}");
            Ok(exit::OTHER)
        }
    }
}

pub(crate) async fn config_check(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    let (toolmux, report) = match start_reporting(loaded, &|_| true, false, None).await {
        Ok(started) => started,
        // A mistake found only once the file is read (a setting of 0 that would refuse
        // everything, a bad `backend.redis.url`): a program still gets its one document.
        Err(error) if json => {
            print_json(&check_refusal(&error))?;
            return Err(error);
        }
        Err(error) => return Err(error),
    };
    finish(&toolmux).await;
    let failed = report.providers.iter().filter(|p| p.error.is_some()).count();
    let collided = report.problems.iter().filter(|p| p.severity == Severity::Error).count();
    if json {
        // What the human report says, by field: the headline's counts (`failed` providers,
        // `errors` among their tools, and the `problems` themselves, which the human report
        // prints on stderr), each provider's row, and the warnings.
        let providers: Vec<Value> = report
            .providers
            .iter()
            .map(|p| {
                let mut row = serde_json::json!({
                    "namespace": p.namespace,
                    "kind": p.kind,
                    "status": if p.error.is_some() { "failed" } else { "started" },
                    "tools": p.tools,
                    "elapsedMs": p.elapsed_ms,
                });
                if let Some(error) = &p.error {
                    row["error"] = Value::from(provider_error(&p.namespace, error));
                }
                row
            })
            .collect();
        let value = serde_json::json!({
            "valid": true,
            "ok": report.is_ok(),
            "file": loaded.file,
            "layers": loaded.layers.iter().map(|l| serde_json::json!({
                "layer": l.kind.name(),
                "file": l.path,
            })).collect::<Vec<_>>(),
            "providers": providers,
            "failed": failed,
            "errors": collided,
            "problems": report.problems,
            "outputDir": toolmux.output_dir(),
            "statsFile": toolmux.stats_file(),
            "warnings": toolmux.warnings(),
        });
        print_json(&value)?;
    } else {
        let mut text = check_headline(loaded.source_name(), &report);
        if loaded.layers.iter().any(|l| l.kind != toolmux::config::LayerKind::Project) {
            let files: Vec<String> = loaded
                .layers
                .iter()
                .map(|l| format!("{} ({})", l.path.display(), l.kind.name()))
                .collect();
            text.push_str(&format!("  merged from {}\n", files.join(", ")));
        }
        for p in &report.providers {
            let status = match &p.error {
                None => plural(p.tools, "tool", "tools"),
                Some(e) => format!("FAILED: {}", provider_error(&p.namespace, e)),
            };
            text.push_str(&format!(
                "  {:<16} {:<8} {status} ({} ms)\n",
                p.namespace,
                p.kind.to_string(),
                p.elapsed_ms
            ));
        }
        print(text.trim_end());
    }
    Ok(if collided > 0 {
        exit::CONFIG
    } else if failed > 0 {
        exit::PROVIDER
    } else {
        0
    })
}

/// A provider's start failure as `config check` reports it: the row (or the JSON's
/// `namespace`) names the provider already, and its error often begins with the name too.
fn provider_error<'a>(namespace: &str, error: &'a str) -> &'a str {
    error.strip_prefix(namespace).and_then(|e| e.strip_prefix(": ")).unwrap_or(error)
}

/// Reports an error a command found itself, ending it with `code`: `error: MESSAGE` on
/// stderr and, with `--json`, the same as one JSON object on stdout ([`print_error_json`]),
/// so that a program reading stdout never gets nothing. Gives `code` back.
pub(crate) fn refuse(json: bool, code: u8, message: &str) -> u8 {
    eprintln!("error: {message}");
    if json {
        print_error_json(message, code);
    }
    code
}

/// The JSON object of an error under `--json`, on stdout where the command's document would
/// have been: `{"ok": false, "error": MESSAGE, "exitCode": CODE}`, the `ok` and `error` of a
/// failed call's envelope (secrets cut out, as [`print_json`] does). On one line, so that it
/// is also one line of `agent listen --json`'s JSON lines.
pub(crate) fn print_error_json(message: &str, code: u8) {
    let value = serde_json::json!({"ok": false, "error": message, "exitCode": code});
    print(&without_secrets(&value).to_string());
}

/// `config check --json`'s answer when the configuration does not load or build: not
/// valid, and where and what the mistake is (`file`, `line` and `column` when known).
pub(crate) fn check_refusal(error: &anyhow::Error) -> Value {
    let (file, line, column, message) = match error.downcast_ref::<toolmux::ToolmuxError>() {
        Some(toolmux::ToolmuxError::Config { file, line, column, message }) => {
            (Some(file.clone()), *line, *column, message.clone())
        }
        _ => (None, None, None, format!("{error:#}")),
    };
    serde_json::json!({
        "valid": false,
        "ok": false,
        "error": {"file": file, "line": line, "column": column, "message": message},
    })
}

/// Prints `value` as JSON for a program, the configuration's secrets cut out of every
/// string in it as [`redacted`] cuts them out of what goes to stderr. Each string rather
/// than the text: JSON escapes a secret's quotes and backslashes, which the redactor would
/// then not find.
pub(crate) fn print_json(value: &Value) -> anyhow::Result<()> {
    print(&serde_json::to_string_pretty(&without_secrets(value))?);
    Ok(())
}

/// `value` with the configuration's secrets cut out of every string in it.
fn without_secrets(value: &Value) -> Value {
    fn redact(value: &mut Value) {
        match value {
            Value::String(text) => {
                if let std::borrow::Cow::Owned(cut) = redacted(text) {
                    *text = cut;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(redact),
            Value::Object(map) => map.values_mut().for_each(redact),
            _ => {}
        }
    }
    let mut value = value.clone();
    redact(&mut value);
    value
}

/// `n` and the noun for that many: `1 tool`, `2 tools`.
fn plural<N: std::fmt::Display + PartialEq + From<u8>>(n: N, one: &str, many: &str) -> String {
    let word = if n == N::from(1) { one } else { many };
    format!("{n} {word}")
}

/// The first line of `config check`: the file is valid, and, when it is so, what did not
/// start or fit, so that a check with failures never opens as if all were well.
fn check_headline(file: &str, report: &WarmupReport) -> String {
    let failed = report.providers.iter().filter(|p| p.error.is_some()).count();
    let errors = report.problems.iter().filter(|p| p.severity == Severity::Error).count();
    let mut wrong = Vec::new();
    if failed > 0 {
        let providers = plural(failed, "provider", "providers");
        let of = report.providers.len();
        wrong.push(format!("{providers} of {of} failed to start (see below)"));
    }
    if errors > 0 {
        let errors = plural(errors, "error", "errors");
        wrong.push(format!("{errors} among the providers' tools (printed above)"));
    }
    if wrong.is_empty() {
        format!("{file}: configuration is valid\n")
    } else {
        format!("{file}: the file is valid, but {}\n", wrong.join(", and "))
    }
}

/// `config show`: the configuration in force, with the files it came from.
pub(crate) fn config_show(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    if json {
        print(&serde_json::to_string_pretty(&loaded.effective())?);
        return Ok(0);
    }
    let mut text = String::new();
    if loaded.layers.is_empty() {
        text.push_str(&format!("# {}\n", loaded.source_name()));
    }
    for layer in &loaded.layers {
        text.push_str(&format!("# {} ({})\n", layer.path.display(), layer.kind.name()));
    }
    text.push_str(&loaded.effective_yaml());
    print(text.trim_end());
    Ok(0)
}

pub(crate) async fn output_show(loaded: &Loaded, show: ShowArgs) -> anyhow::Result<u8> {
    // No provider is built or started: only the store (a directory, or Redis).
    let toolmux = Toolmux::build_only(loaded, &|_| false).await?;
    let read = toolmux.output_store().read(&show.handle, show.offset, show.limit).await;
    match read {
        Ok(page) if page.lines == 0 && show.offset > 0 && show.offset >= page.total_lines => {
            let message = format!(
                "--offset {} is past the end: the output has {} (offsets 0-{})",
                show.offset,
                plural(page.total_lines, "line", "lines"),
                page.total_lines.saturating_sub(1)
            );
            Ok(refuse(show.json, exit::CONFIG, &message))
        }
        Ok(page) => {
            if show.json {
                print(&serde_json::to_string_pretty(&page)?);
            } else {
                print(&page.text);
                if page.offset + page.lines < page.total_lines {
                    eprintln!(
                        "lines {}-{} of {}; more with --offset {}",
                        page.offset + 1,
                        page.offset + page.lines,
                        page.total_lines,
                        page.offset + page.lines
                    );
                }
            }
            Ok(0)
        }
        // A word that is no handle at all (a path, a tool's name, the tool_output message's
        // other fields): where outputs are kept is no help.
        Err(StoreError::UnknownHandle { handle, .. }) if !store::valid_handle(&handle) => {
            let message = format!(
                "`{handle}` is no output handle: a handle is two words of letters, digits, \
                 `-` and `_` joined by `/`, such as run-default/out-2aa5-18ec12bc9340f588-0, as \
                 the `handle` of a tool_output message or the note of `toolmux tools call` gives it"
            );
            Ok(refuse(show.json, exit::TOOL_FAILED, &message))
        }
        Err(StoreError::UnknownHandle { handle, .. }) => {
            // A handle of the right shape was most often stored under another project's
            // configuration (the default folder is one per project folder), or removed
            // after `defaults.outputRetention`: say where this one looked.
            let shared = loaded.config.backend.as_ref().is_some_and(|b| b.redis.is_some());
            let looked = if shared {
                "backend.redis".to_owned()
            } else {
                toolmux.output_dir().display().to_string()
            };
            let message = format!(
                "no stored output `{handle}`; looked in {looked}, where this configuration \
                 keeps them: read it with the configuration of the call that stored it (in that \
                 call's folder, or with its --config); outputs older than \
                 defaults.outputRetention are removed"
            );
            Ok(refuse(show.json, exit::TOOL_FAILED, &message))
        }
        Err(e) => Err(anyhow::Error::new(e).context("reading the output store")),
    }
}

pub(crate) fn stats(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    let Some(path) = loaded.stats_file() else {
        // A program still gets its document: no tools, and no file (`statsFile: null`).
        if json {
            let none = serde_json::json!({"version": 1, "tools": {}, "statsFile": null});
            print(&serde_json::to_string_pretty(&none)?);
        }
        eprintln!("no statistics are kept (`defaults.statsFile: false`)");
        return Ok(0);
    };
    let stats = Stats::default();
    // What cannot be read is no statistics to show: an error, where a warning was followed
    // by `no calls recorded yet ... counted in` the very file that could not be read.
    if let Err(e) = stats.load(&path) {
        use toolmux::toolmux_orchestrator::accounting::StatsError;
        let next = match &e {
            StatsError::Format { .. } => {
                "; the next call moves it aside (adding .bad to its name) and counts anew"
            }
            _ => "",
        };
        let message = format!("{:#}{next}", anyhow::Error::new(e));
        return Ok(refuse(json, exit::OTHER, &message));
    }
    let snapshot = stats.snapshot();
    if json {
        let mut value = serde_json::to_value(&snapshot)?;
        value["statsFile"] = Value::from(path.display().to_string());
        print(&serde_json::to_string_pretty(&value)?);
        return Ok(0);
    }
    if snapshot.tools.is_empty() {
        eprintln!(
            "no calls recorded yet: calls through `tools call`, `serve` and `agent run` with this \
             configuration are counted in {}",
            path.display()
        );
        return Ok(0);
    }
    let width = snapshot.tools.keys().map(String::len).max().unwrap_or(4).max(4);
    let mut text = format!(
        "{:width$}  {:>7}  {:>7}  {:>7}  {:>9}  {:>9}  {:>9}\n",
        "tool", "calls", "ok", "failed", "avg ok ms", "p50 ms", "p95 ms"
    );
    for (name, s) in &snapshot.tools {
        // No successful call has no average: 0.0 read as the fastest tool of all.
        let average = match s.ok {
            0 => "-".to_owned(),
            _ => format!("{:.1}", s.avg_ok_ms),
        };
        text.push_str(&format!(
            "{name:width$}  {:>7}  {:>7}  {:>7}  {average:>9}  {:>9.1}  {:>9.1}\n",
            s.count, s.ok, s.failed, s.p50_ms, s.p95_ms
        ));
    }
    print(text.trim_end());
    Ok(0)
}
