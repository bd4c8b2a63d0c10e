//! `grep`: ripgrep's own crates in process: a parallel, gitignore-aware walk that never
//! follows symlinks, a regex matcher and a searcher, stopped when the call is cancelled.

use super::Budget;
use super::text::{CrLines, Encoding, WideDecoder};
use crate::config::FsLimits;
use crate::error::FsError;
use crate::workspace::Workspace;
use grep_matcher::LineTerminator;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{
    BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkContextKind, SinkMatch,
};
use ignore::WalkState;
use ignore::overrides::{Override, OverrideBuilder};
use ignore::types::TypesBuilder;
use regex::bytes::{Regex, RegexBuilder};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use toolmux_core::ToolOutput;

/// The largest file a `multiline` search reads: the searcher holds a whole file in memory
/// to let a match span lines (with or without memory maps), so a larger one is skipped,
/// and the answer names it. Searched line by line, files of any size take a buffer of a
/// few lines.
pub(crate) const MULTILINE_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// The longest line a line-by-line search holds: the searcher's buffer grows to the
/// longest line (with the context lines asked for before it), so a file of one line of
/// gigabytes took as much memory. A file with a longer line is skipped where the searcher
/// reaches it, and the answer names it.
pub(crate) const LINE_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// What `grep` returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// Matching lines, `path:line:text`.
    Content,
    /// Paths of files with a match, newest first (the default).
    #[default]
    FilesWithMatches,
    /// `path:count` of matching lines per file.
    Count,
}

/// Arguments of `grep`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// The regular expression (Rust regex syntax, as ripgrep; escape literal braces:
    /// `interface\{\}`).
    pub pattern: String,
    /// File or directory to search, relative to the workspace root or absolute inside it
    /// (default: the root).
    #[serde(default)]
    pub path: Option<String>,
    /// Only search files matching this glob (ripgrep `--glob`), such as `*.rs` or
    /// `*.{ts,tsx}`; a leading `!` excludes.
    #[serde(default)]
    pub glob: Option<String>,
    /// Only search files of this type (ripgrep `--type`), such as `rust`, `py`, `js`.
    #[serde(default, rename = "type")]
    pub file_type: Option<String>,
    /// `content`, `files_with_matches` (default) or `count`.
    #[serde(default)]
    pub output_mode: Option<OutputMode>,
    /// Lines of context after each match (content mode).
    #[serde(default, rename = "-A")]
    pub after: Option<usize>,
    /// Lines of context before each match (content mode).
    #[serde(default, rename = "-B")]
    pub before: Option<usize>,
    /// Lines of context before and after each match (content mode).
    #[serde(default, rename = "-C")]
    pub context: Option<usize>,
    /// Show line numbers (content mode; default true).
    #[serde(default, rename = "-n")]
    pub line_numbers: Option<bool>,
    /// Case-insensitive search.
    #[serde(default, rename = "-i")]
    pub case_insensitive: Option<bool>,
    /// Let patterns span lines, with `.` matching newlines.
    #[serde(default)]
    pub multiline: Option<bool>,
    /// Return at most this many lines or files (default 250; 0 for all).
    #[serde(default)]
    pub head_limit: Option<usize>,
    /// Skip this many lines or files first, to page through results.
    #[serde(default)]
    pub offset: Option<usize>,
    /// Show only the matching parts of lines, one `path:line:match` line each (content
    /// mode only; not with `-A`, `-B`, `-C`).
    #[serde(default, rename = "-o")]
    pub only_matching: Option<bool>,
    /// Take `pattern` as literal text, not a regular expression (default false).
    #[serde(default)]
    pub fixed_strings: Option<bool>,
    /// Stop each file after this many matching lines (content and count modes; at least
    /// 1; default no limit). A footer says how many files had more.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_matches_per_file: Option<u64>,
    /// Search hidden files and directories too, those whose names start with `.`
    /// (default false); `.git` directories are still skipped.
    #[serde(default)]
    pub hidden: Option<bool>,
    /// Search files that `.gitignore` and `.ignore` files exclude too (default false).
    #[serde(default)]
    pub no_ignore: Option<bool>,
}

pub(crate) const DESCRIPTION: &str = "Search file contents with a regular expression (ripgrep \
syntax and engine, in process). Respects .gitignore and .ignore files and skips hidden and binary \
files (`no_ignore: true` and `hidden: true` search those too; `.git` directories and toolmux's \
own protected files never are); symlinks are not followed. `output_mode`: `files_with_matches` \
(default) lists matching files newest first; `content` shows `path:line:text` lines (context \
lines as `path-line-text`, `--` between context groups) and honours `-A`, `-B`, `-C`, `-n`, \
`-o` (only the matching parts, one per line); `count` shows `path:count`. Filter files with \
`glob` (e.g. `*.rs`) or `type` (e.g. `rust`). `-i` ignores case; `fixed_strings: true` searches \
for the pattern as literal text; `multiline` lets a match span lines (it skips files over 64 MiB, \
named in a footer); without it, files with a line over 64 MiB are skipped and named the same way. \
`max_matches_per_file` \
stops each file after that many matching lines (content and count modes). Results are cut at \
`head_limit` (default 250, 0 = no limit) lines or files; a footer says how many there were and \
which `offset` continues. A search still running after 30 s stops and returns what it found, \
marked partial: narrow `path`, `glob` or `type` then. Paths are relative to the workspace \
root. No match is an empty result, not an error.";

/// Runs a search; blocking, meant for `spawn_blocking`.
pub(crate) fn grep(
    ws: &Workspace,
    limits: &FsLimits,
    args: GrepArgs,
    cancelled: &Arc<AtomicBool>,
    budget: &Budget,
) -> Result<ToolOutput, FsError> {
    search(ws, limits, args, cancelled, budget, LINE_MAX_BYTES)
}

/// [`grep`], holding lines of at most `line_max` bytes (the tests' lower limit).
fn search(
    ws: &Workspace,
    limits: &FsLimits,
    args: GrepArgs,
    cancelled: &Arc<AtomicBool>,
    budget: &Budget,
    line_max: u64,
) -> Result<ToolOutput, FsError> {
    let invalid = |message: String| FsError::InvalidArguments { tool: "grep", message };
    if args.pattern.is_empty() {
        return Err(invalid("`pattern` is empty".into()));
    }
    let given = args.path.clone().unwrap_or_else(|| ".".into());
    let path = ws.resolve(&given)?;
    let start = ws.walk_start(&path)?;
    ws.check_read(&path, start.strip_prefix(ws.root()).unwrap_or(&start))?;
    // A path that is neither a folder nor a file (a device, a FIFO, a socket) has no lines
    // to search: said, rather than "No matches found" (and a FIFO is never opened).
    if let Ok(meta) = std::fs::metadata(&start)
        && !meta.is_dir()
        && !meta.is_file()
    {
        return Err(FsError::NotRegularFile { path: given });
    }
    let mode = args.output_mode.unwrap_or_default();
    let multiline = args.multiline.unwrap_or(false);
    check_combinations(&args, mode).map_err(invalid)?;
    let matcher = build_matcher(&args, multiline, false).map_err(invalid)?;
    // For files whose lines end in a bare CR (classic Mac OS), which are searched line by
    // line as `read` numbers them. A pattern this refuses (one holding a CR) searches them
    // as other files.
    let matcher_cr = build_matcher(&args, multiline, true).ok();
    // With `-o`, the regexes that pick the parts out: for other files, and for CR files.
    let only = match args.only_matching.unwrap_or(false) {
        true => Some((
            build_only_matching(&args, multiline, false).map_err(invalid)?,
            build_only_matching(&args, multiline, true).map_err(invalid)?,
        )),
        false => None,
    };
    let mut searcher = SearcherBuilder::new();
    searcher
        .binary_detection(BinaryDetection::quit(0))
        .line_number(args.line_numbers.unwrap_or(true))
        .multi_line(multiline);
    if multiline {
        // Beside the size checked before each file: a file that grew past it since is
        // not read into memory either (the search fails, and the file is named as skipped).
        searcher.heap_limit(Some(MULTILINE_MAX_BYTES as usize + 1024 * 1024));
    } else {
        // The buffer past its first 64 KiB: a longer line fails the file's search, and
        // the file is named as skipped.
        searcher.heap_limit(Some(usize::try_from(line_max).unwrap_or(usize::MAX)));
    }
    if mode == OutputMode::Content {
        searcher
            .before_context(args.before.or(args.context).unwrap_or(0))
            .after_context(args.after.or(args.context).unwrap_or(0));
    }
    let searcher_cr = searcher.line_terminator(LineTerminator::byte(b'\r')).build();
    // As the matcher's (`build_matcher`): lines end at LF, a CR before it included.
    searcher.line_terminator(match multiline {
        true => LineTerminator::byte(b'\n'),
        false => LineTerminator::crlf(),
    });
    let searcher = searcher.build();

    let mut walk = ws.walker(&start, !args.no_ignore.unwrap_or(false));
    walk.threads(worker_threads());
    if args.hidden.unwrap_or(false) {
        // Hidden files, but not git's database: the walker never enters a `.git`.
        walk.hidden(false);
    }
    // `glob` and `type` are checked file by file, not given to the walker: there they
    // would win over the ignore rules (as ripgrep's `--glob` does), and `glob: "*.js"`
    // searched the hidden and ignored `.js` files the description says are skipped.
    let glob = match &args.glob {
        Some(glob) => {
            let mut overrides = OverrideBuilder::new(&start);
            overrides.add(glob).map_err(|e| invalid(format!("invalid `glob` `{glob}`: {e}")))?;
            Some(overrides.build().map_err(|e| invalid(format!("invalid `glob`: {e}")))?)
        }
        None => None,
    };
    let types = match &args.file_type {
        Some(name) => {
            let mut types = TypesBuilder::new();
            types.add_defaults();
            types.select(name);
            Some(types.build().map_err(|e| invalid(format!("invalid `type` `{name}`: {e}")))?)
        }
        None => None,
    };
    let head_limit = args.head_limit.unwrap_or(limits.grep_head_limit);
    let offset = args.offset.unwrap_or(0);
    let show = Show {
        numbers: args.line_numbers.unwrap_or(true),
        line_chars: limits.line_chars,
        context: mode == OutputMode::Content && context_lines(&args) > 0,
        multiline,
    };
    // The output lines a page can show: `offset + head_limit`, and the context separator
    // dropped before the first file. No file keeps more (later ones are only counted), and
    // the collector keeps no more in all.
    let wanted = match head_limit {
        0 => usize::MAX,
        _ => offset.saturating_add(head_limit).saturating_add(usize::from(show.context)),
    };
    let collector = Arc::new(Mutex::new(Collector::new(wanted)));
    let matches = Arc::new(AtomicU64::new(0));
    // Files too large for a multiline search, with their sizes.
    let too_large = Arc::new(Mutex::new(Vec::<(String, u64)>::new()));
    // Files with a line longer than a line-by-line search holds.
    let long_lines = Arc::new(Mutex::new(Vec::<String>::new()));
    // Where a file named by `path` holds binary data, which stopped its search.
    let named_binary = Arc::new(Mutex::new(None::<u64>));

    walk.build_parallel().run(|| {
        let (mut searcher, mut searcher_cr) = (searcher.clone(), searcher_cr.clone());
        let (matcher, matcher_cr) = (matcher.clone(), matcher_cr.clone());
        let collector = collector.clone();
        let cancelled = cancelled.clone();
        let matches = matches.clone();
        let too_large = too_large.clone();
        let long_lines = long_lines.clone();
        let named_binary = named_binary.clone();
        let only = only.clone();
        let (glob, types) = (glob.clone(), types.clone());
        let root = ws.root().to_path_buf();
        Box::new(move |entry| {
            if cancelled.load(Ordering::Relaxed) || budget.spent() {
                return WalkState::Quit;
            }
            let Ok(entry) = entry else { return WalkState::Continue };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                return WalkState::Continue;
            }
            // A file named by `path` (depth 0) is searched whatever the filters say.
            // A negated glob leaves out a folder's files too (`!lib` and `!lib/` as `!lib/**`,
            // as ripgrep's `--glob` does): the folders between `path` and the file are
            // matched as folders.
            let glob_out = |g: &Override| {
                g.matched(entry.path(), false).is_ignore()
                    || (entry.path().ancestors().skip(1))
                        .take(entry.depth().saturating_sub(1))
                        .any(|folder| g.matched(folder, true).is_ignore())
            };
            let filtered_out = entry.depth() > 0
                && (glob.as_ref().is_some_and(glob_out)
                    || types.as_ref().is_some_and(|t| t.matched(entry.path(), false).is_ignore()));
            if filtered_out {
                return WalkState::Continue;
            }
            // Open through the confined root handle: even a directory swapped for a symlink
            // between the walk and the open cannot lead outside the root.
            let Ok(relative) = entry.path().strip_prefix(ws.root()) else {
                return WalkState::Continue;
            };
            // The audit log and spilled outputs are not searched, as they are not read.
            if ws.unreadable(relative) {
                return WalkState::Continue;
            }
            // Not blocking: a FIFO in the file's place since the walk would hang the open.
            // Following no symlink: the walker followed none, so the path has none, and
            // one there now (a name swapped for a link to a `hide` file after the listing
            // and the check above) is passed over, not searched.
            let Ok(file) = ws.open_beneath(relative) else { return WalkState::Continue };
            let Ok(meta) = file.metadata() else { return WalkState::Continue };
            if !meta.is_file() {
                return WalkState::Continue;
            }
            let skip_large = |size: u64| {
                let display = display(&root, entry.path());
                too_large.lock().unwrap_or_else(|e| e.into_inner()).push((display, size));
                WalkState::Continue
            };
            if multiline && meta.len() > MULTILINE_MAX_BYTES {
                return skip_large(meta.len());
            }
            let stop = || cancelled.load(Ordering::Relaxed) || budget.spent();
            // Only a search that can tell CR files reads the file's head first.
            let head = matcher_cr.as_ref().map(|_| Head::read(&file, stop));
            let cr = head.as_ref().is_some_and(|head| head.cr);
            let display = display(&root, entry.path());
            let mut sink = FileSink {
                mode,
                show,
                display: &display,
                lines: Vec::new(),
                keep: wanted,
                produced: 0,
                count: 0,
                cancelled: &cancelled,
                budget,
                only: only.as_ref().map(|(lf, cr_regex)| if cr { cr_regex } else { lf }),
                cap: args.max_matches_per_file,
                hits: 0,
                more: false,
                terminator: if cr { b'\r' } else { b'\n' },
                binary: None,
            };
            let searched = match (&head, &matcher_cr) {
                (Some(head), Some(matcher_cr)) if cr => {
                    head.search(&mut searcher_cr, matcher_cr, &file, &mut sink, stop)
                }
                (Some(head), _) => head.search(&mut searcher, &matcher, &file, &mut sink, stop),
                (None, _) => search_file(&mut searcher, &matcher, &file, &mut sink, stop),
            };
            if let Err(e) = searched {
                // A file that grew past the limit while it was searched.
                if let Ok(meta) = file.metadata()
                    && multiline
                    && meta.len() > MULTILINE_MAX_BYTES
                {
                    return skip_large(meta.len());
                }
                if !multiline && is_heap_limit(&e) {
                    long_lines.lock().unwrap_or_else(|e| e.into_inner()).push(display);
                }
                return WalkState::Continue;
            }
            // A file the caller named is said to be binary: a walk skips binary files by
            // design, but "No matches found" for the one file asked about misleads.
            if entry.depth() == 0
                && let Some(offset) = sink.binary
            {
                *named_binary.lock().unwrap_or_else(|e| e.into_inner()) = Some(offset);
            }
            if sink.count == 0 {
                return WalkState::Continue;
            }
            matches.fetch_add(sink.count, Ordering::Relaxed);
            let modified = match mode {
                OutputMode::FilesWithMatches => entry
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .unwrap_or(SystemTime::UNIX_EPOCH),
                _ => SystemTime::UNIX_EPOCH,
            };
            let mut lines = sink.lines;
            let mut produced = sink.produced;
            if show.context {
                // Context groups of different files are separated as ripgrep does; the
                // separator before the first file is dropped when rendering.
                lines.insert(0, "--".to_owned());
                produced += 1;
            }
            let capped = sink.more;
            let result = FileResult { modified, count: sink.count, lines, produced, capped };
            collector.lock().unwrap_or_else(|e| e.into_inner()).add(display, result);
            WalkState::Continue
        })
    });
    if cancelled.load(Ordering::Relaxed) {
        return Err(FsError::Cancelled { tool: "grep" });
    }
    let collector = std::mem::take(&mut *collector.lock().unwrap_or_else(|e| e.into_inner()));
    let total_matches = matches.load(Ordering::Relaxed);
    let page = Page { offset, head_limit, cap: args.max_matches_per_file, separated: show.context };
    let output = render(mode, collector, page, total_matches);
    let mut too_large = std::mem::take(&mut *too_large.lock().unwrap_or_else(|e| e.into_inner()));
    too_large.sort();
    let mut output = note_too_large(output, &too_large);
    let mut long_lines = std::mem::take(&mut *long_lines.lock().unwrap_or_else(|e| e.into_inner()));
    long_lines.sort();
    output = note_long_lines(output, &long_lines, line_max, show.context);
    if let Some(offset) = *named_binary.lock().unwrap_or_else(|e| e.into_inner()) {
        let note = format!(
            "[`{given}` is a binary file (a NUL byte at offset {offset}): it was searched only \
             before that byte, as binary files are skipped; inspect it with `bash` tools such \
             as `strings` or `xxd` if allowed]"
        );
        append_line(&mut output, note);
        output = output.with_extra("binary", json!(true));
    }
    Ok(budget.mark(output, "search"))
}

/// `output` with a last line naming the files a multiline search skipped as too large
/// (the first few, by path), and a `skippedTooLarge` extra counting them.
fn note_too_large(mut output: ToolOutput, skipped: &[(String, u64)]) -> ToolOutput {
    const NAMED: usize = 5;
    if skipped.is_empty() {
        return output;
    }
    let mut names: Vec<String> = skipped
        .iter()
        .take(NAMED)
        .map(|(path, size)| format!("{path} ({} MiB)", size / (1024 * 1024)))
        .collect();
    if skipped.len() > NAMED {
        names.push(format!("and {} more", skipped.len() - NAMED));
    }
    let note = format!(
        "[{} not searched: over {} MiB, too large for `multiline` (which holds a whole file \
         in memory): {}; search without `multiline`, or for a part of the match]",
        match skipped.len() {
            1 => "1 file".to_owned(),
            n => format!("{n} files"),
        },
        MULTILINE_MAX_BYTES / (1024 * 1024),
        names.join(", ")
    );
    append_line(&mut output, note);
    output.with_extra("skippedTooLarge", json!(skipped.len()))
}

/// Whether `e` is the searcher's refusal to grow its buffer past the heap limit. It has no
/// kind of its own (`Other`, as a sink's error could be), only its message, which the
/// tests hold to (a file with a line over the limit is named as skipped).
fn is_heap_limit(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Other
        && e.raw_os_error().is_none()
        && e.to_string().starts_with("configured allocation limit")
}

/// `output` with a last line naming the files a line-by-line search skipped for a line
/// over `line_max` bytes (the first few, by path), and a `skippedLongLines` extra counting
/// them.
fn note_long_lines(
    mut output: ToolOutput,
    skipped: &[String],
    line_max: u64,
    context: bool,
) -> ToolOutput {
    const NAMED: usize = 5;
    if skipped.is_empty() {
        return output;
    }
    let mut names: Vec<String> = skipped.iter().take(NAMED).cloned().collect();
    if skipped.len() > NAMED {
        names.push(format!("and {} more", skipped.len() - NAMED));
    }
    let note = format!(
        "[{} not searched: a line longer than {} MiB{}, more than a search holds in \
         memory: {}; search it with `bash` tools (`grep -o`) if allowed]",
        match skipped.len() {
            1 => "1 file".to_owned(),
            n => format!("{n} files"),
        },
        line_max / (1024 * 1024),
        if context { " (with the context lines asked for)" } else { "" },
        names.join(", ")
    );
    append_line(&mut output, note);
    output.with_extra("skippedLongLines", json!(skipped.len()))
}

/// `output` with `note` as its last line.
fn append_line(output: &mut ToolOutput, note: String) {
    match output.content.last_mut() {
        Some(toolmux_core::ContentPart::Text { text }) => {
            text.push('\n');
            text.push_str(&note);
        }
        _ => output.content.push(toolmux_core::ContentPart::Text { text: note }),
    }
}

/// Refuses arguments that would be ignored or contradict each other, saying what to do.
/// The most context lines asked for on either side of a match: `-A`, `-B` and `-C` all
/// count, so `-B 0` given beside `-A 2` still asks for context.
fn context_lines(args: &GrepArgs) -> usize {
    [args.before, args.after, args.context].into_iter().flatten().max().unwrap_or(0)
}

fn check_combinations(args: &GrepArgs, mode: OutputMode) -> Result<(), String> {
    let mode_name = match mode {
        OutputMode::Content => "content",
        OutputMode::FilesWithMatches => "files_with_matches",
        OutputMode::Count => "count",
    };
    if args.only_matching == Some(true) {
        if mode != OutputMode::Content {
            return Err(format!(
                "`-o` shows the matching parts of lines, which only `output_mode: \"content\"` \
                 shows (this call's mode is `{mode_name}`): set `output_mode` to `content` or \
                 drop `-o`"
            ));
        }
        if context_lines(args) > 0 {
            return Err("`-o` shows only the matching parts of lines, so it takes no context \
                        lines: drop `-A`, `-B` and `-C`, or drop `-o` to see whole lines"
                .into());
        }
    }
    match args.max_matches_per_file {
        Some(0) => Err("`max_matches_per_file` must be at least 1 (leave it out for no \
                        limit)"
            .into()),
        Some(_) if mode == OutputMode::FilesWithMatches => Err(format!(
            "`max_matches_per_file` limits the lines shown or counted per file, which \
             `output_mode: \"{mode_name}\"` does not show: set `output_mode` to `content` or \
             `count`, or drop `max_matches_per_file`"
        )),
        _ => Ok(()),
    }
}

/// What [`Head::read`] read of a file to tell how its lines end, kept for the search, so
/// that a file with no LF in its first 8 KiB (minified JS or JSON) is not read twice.
struct Head {
    /// The first 8 KiB, on the stack: the common file needs no more, and no allocation.
    first: [u8; 8192],
    /// How many bytes of `first` were read.
    first_len: usize,
    /// Everything read, `first` included, once the file went on past it without an LF;
    /// never much over [`HEAD_KEPT`].
    more: Vec<u8>,
    /// Whether the file went on past [`HEAD_KEPT`] without an LF, so that what was read
    /// of it was let go (`first_len` and `more` say nothing) and the search reads it from
    /// its start.
    dropped: bool,
    /// Whether the whole file was read.
    whole: bool,
    /// Whether its lines end in a bare CR.
    cr: bool,
    /// The encoding its byte order mark names.
    encoding: Encoding,
}

/// How much of a file [`Head::read`] keeps for the search. A file read on past it
/// without an LF (a one-line JSON file of gigabytes) is only scanned on for its line
/// ends, and read again by the search: each of the search's threads held all of such a
/// file read so far, up to the whole file.
const HEAD_KEPT: usize = 1024 * 1024;

impl Head {
    /// Reads `file` from its start to tell whether its lines end in a bare CR, by the rule
    /// `read` judges the whole file by ([`CrLines`]): a `\r` and no `\n` anywhere. A `\n`
    /// in the first 8 KiB settles it for almost every file with one small read; the file is
    /// read on only while no `\n` has come, and no further than its first `\n` (or NUL: the
    /// search stops at binary data), or until `stop` says the search is over. At most
    /// about [`HEAD_KEPT`] bytes of it are kept.
    fn read(file: &std::fs::File, stop: impl Fn() -> bool) -> Head {
        use std::os::unix::fs::FileExt as _;
        let mut head = Head {
            first: [0; 8192],
            first_len: 0,
            more: Vec::new(),
            dropped: false,
            whole: false,
            cr: false,
            encoding: Encoding::Utf8,
        };
        let mut lines = CrLines::default();
        // A UTF-16 or UTF-32 file is searched decoded (UTF-16 by the searcher's BOM
        // sniffing, UTF-32 by `Transcoded`), and told so, as `read` tells it.
        let mut wide: Option<WideDecoder> = None;
        let mut decoded = String::new();
        // Where the next read starts, and where the pieces read past `HEAD_KEPT` go.
        let mut at = 0usize;
        let mut scratch = Vec::new();
        loop {
            let n = match at {
                0 => file.read_at(&mut head.first, 0),
                // Past the first 8 KiB without a `\n`: a long-lined file, read on in larger
                // pieces and kept up to `HEAD_KEPT`.
                _ if at < HEAD_KEPT && !head.dropped => {
                    if head.more.is_empty() {
                        head.more.extend_from_slice(&head.first[..head.first_len]);
                    }
                    head.more.resize(at + 64 * 1024, 0);
                    let read = file.read_at(&mut head.more[at..], at as u64);
                    head.more.truncate(at + *read.as_ref().unwrap_or(&0));
                    read
                }
                // Past it: scanned on, not kept.
                _ => {
                    if !head.dropped {
                        (head.dropped, head.first_len, head.more) = (true, 0, Vec::new());
                    }
                    scratch.resize(64 * 1024, 0);
                    file.read_at(&mut scratch, at as u64)
                }
            };
            let n = match n {
                Ok(0) => {
                    head.whole = true;
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The search reads the file again from what was read, and says why not.
                Err(_) => return head,
            };
            if at == 0 {
                head.first_len = n;
            }
            let mut chunk = match at {
                0 => &head.first[..n],
                _ if head.dropped => &scratch[..n],
                _ => &head.more[at..],
            };
            if at == 0 {
                head.encoding = Encoding::sniff(chunk);
                wide = head.encoding.decoder();
                chunk = &chunk[head.encoding.bom().len().min(n)..];
            }
            at += n;
            match &mut wide {
                Some(decoder) => {
                    decoded.clear();
                    if decoder.feed(chunk, &mut decoded).is_err() {
                        return head;
                    }
                    lines.feed(decoded.as_bytes());
                }
                None if memchr::memchr(0, chunk).is_some() => return head,
                None => lines.feed(chunk),
            }
            if lines.settled() || stop() {
                return head;
            }
        }
        head.cr = lines.cr_only();
        head
    }

    /// How many bytes were read.
    fn len(&self) -> usize {
        if self.more.is_empty() { self.first_len } else { self.more.len() }
    }

    /// The bytes read, from the start of the file.
    fn bytes(&self) -> &[u8] {
        if self.more.is_empty() { &self.first[..self.first_len] } else { &self.more }
    }

    /// Searches the file with `searcher`: the bytes read, then the rest of `file` after
    /// them, as [`Searcher::search_file`] would search it (without memory maps both read
    /// it through the same decoder and buffers), or the bytes alone when they are all of it;
    /// the file is read no further once `stop` says the search is over.
    fn search<S: Sink>(
        &self,
        searcher: &mut Searcher,
        matcher: &RegexMatcher,
        file: &std::fs::File,
        sink: S,
        stop: impl Fn() -> bool,
    ) -> Result<(), S::Error> {
        use std::io::{Read as _, Seek as _};
        if self.dropped {
            return search_file(searcher, matcher, file, sink, stop);
        }
        let utf32 = is_utf32(self.encoding);
        if self.whole && !utf32 {
            return searcher.search_slice(matcher, self.bytes(), sink);
        }
        let mut rest = file;
        // Where the rest starts, whatever the file's position: the head was read with
        // `read_at`, which leaves it.
        if let Err(e) = rest.seek(io::SeekFrom::Start(self.len() as u64)) {
            return Err(grep_searcher::SinkError::error_io(e));
        }
        // A file read whole is searched as it was read, not with what was appended since.
        let rest = Stopping { inner: rest.take(if self.whole { 0 } else { u64::MAX }), stop };
        if utf32 {
            let body = &self.bytes()[self.encoding.bom().len().min(self.len())..];
            return searcher.search_reader(
                matcher,
                Transcoded::new(self.encoding, body.chain(rest)),
                sink,
            );
        }
        searcher.search_reader(matcher, self.bytes().chain(rest), sink)
    }
}

/// Whether the searcher cannot decode `encoding` itself: its BOM sniffing knows UTF-8 and
/// UTF-16 only, and takes UTF-32 LE's mark (`FF FE 00 00`) for UTF-16 LE's.
fn is_utf32(encoding: Encoding) -> bool {
    matches!(encoding, Encoding::Utf32Le | Encoding::Utf32Be)
}

/// A file's bytes as the searcher reads them, ending (as if the file ended there) once
/// `stop` says the search is over. The sink checks for a cancellation and the time budget
/// only when something matches, so a file of gigabytes without a match was read to its end
/// after the call was cancelled or its time was spent, holding its blocking thread.
struct Stopping<R, F> {
    inner: R,
    stop: F,
}

impl<R: io::Read, F: Fn() -> bool> io::Read for Stopping<R, F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Once per buffer the searcher fills (64 KiB): the clock is cheap at that rate.
        if (self.stop)() {
            return Ok(0);
        }
        self.inner.read(buf)
    }
}

/// Searches all of `file` with `searcher`, as [`Searcher::search_file`] does (it maps no
/// memory here, so it reads the file as a reader), a UTF-32 file decoded; the file is read
/// no further once `stop` says the search is over.
fn search_file<S: Sink>(
    searcher: &mut Searcher,
    matcher: &RegexMatcher,
    file: &std::fs::File,
    sink: S,
    stop: impl Fn() -> bool,
) -> Result<(), S::Error> {
    use std::io::Seek as _;
    use std::os::unix::fs::FileExt as _;
    let mut mark = [0u8; 4];
    let encoding = match file.read_exact_at(&mut mark, 0) {
        Ok(()) => Encoding::sniff(&mark),
        Err(_) => Encoding::Utf8,
    };
    let mut body = file;
    if !is_utf32(encoding) {
        return searcher.search_reader(matcher, Stopping { inner: body, stop }, sink);
    }
    if let Err(e) = body.seek(io::SeekFrom::Start(4)) {
        return Err(grep_searcher::SinkError::error_io(e));
    }
    searcher.search_reader(matcher, Transcoded::new(encoding, Stopping { inner: body, stop }), sink)
}

/// The text after a UTF-32 file's byte order mark as UTF-8, read from `inner`; invalid
/// UTF-32 ends it with an error (the file is not searched, as `read` refuses it).
struct Transcoded<R> {
    inner: R,
    // Invariant: `None` once `inner` ended and what it gave was checked.
    decoder: Option<WideDecoder>,
    raw: Vec<u8>,
    text: String,
    /// How much of `text` was given out.
    at: usize,
}

impl<R: io::Read> Transcoded<R> {
    fn new(encoding: Encoding, inner: R) -> Self {
        Transcoded {
            inner,
            decoder: encoding.decoder(),
            raw: vec![0; 64 * 1024],
            text: String::new(),
            at: 0,
        }
    }
}

impl<R: io::Read> io::Read for Transcoded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let invalid =
            |e: super::text::DecodeError| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
        while self.at == self.text.len() {
            let Some(decoder) = self.decoder.as_mut() else { return Ok(0) };
            let n = match self.inner.read(&mut self.raw) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                if let Some(decoder) = self.decoder.take() {
                    decoder.finish().map_err(invalid)?;
                }
                return Ok(0);
            }
            self.text.clear();
            self.at = 0;
            decoder.feed(&self.raw[..n], &mut self.text).map_err(invalid)?;
        }
        let n = buf.len().min(self.text.len() - self.at);
        buf[..n].copy_from_slice(&self.text.as_bytes()[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The most memory a pattern may compile to (the regex crate's own default; ripgrep's
/// matcher allows 100 MiB). Compiling takes time in proportion: a pattern of 120 KB such as
/// `\w{1000}` repeated compiled for seconds up to 100 MiB, while the call's timeout ran,
/// before it was refused. Any pattern a person or a model writes fits many times over.
const PATTERN_SIZE_LIMIT: usize = 10 << 20;

/// The most memory the lazy DFA of a pattern may use for its states, per search thread
/// (ripgrep's matcher allows 1000 MiB, which times the threads could take the machine's
/// memory); past it the search goes on, more slowly.
const PATTERN_DFA_SIZE_LIMIT: usize = 100 << 20;

/// Why the pattern of `args` does not compile: `error` as the regex crate says it, the
/// pattern shown whole when short; one too large is said to be, with the limit.
fn pattern_error(args: &GrepArgs, error: &str, hint: &str) -> String {
    let pattern = crate::error::excerpt(&args.pattern);
    if error.contains("exceeds size limit") {
        return format!(
            "`pattern` `{pattern}` is too large: compiled it needs more than the {} MiB a \
             pattern may take; search with a shorter pattern (fewer alternatives, smaller \
             counts such as `\\w{{1000}}`), or in several searches",
            PATTERN_SIZE_LIMIT >> 20
        );
    }
    // The parser's message shows the pattern whole, with a caret under the fault: for a long
    // one only its last line, which says what the fault is.
    let error = match pattern.len() < args.pattern.len() {
        true => error.lines().last().unwrap_or(error),
        false => error,
    };
    format!("invalid regex `{pattern}`: {error}{hint}")
}

/// The matcher of `args`; with `cr`, for a file whose lines end in a bare CR.
fn build_matcher(args: &GrepArgs, multiline: bool, cr: bool) -> Result<RegexMatcher, String> {
    let fixed = args.fixed_strings.unwrap_or(false);
    if !multiline && args.pattern.contains('\n') {
        return Err("`pattern` contains a line break, which a line-by-line search never \
                    matches: set `multiline: true` to match across lines"
            .into());
    }
    let mut builder = RegexMatcherBuilder::new();
    builder
        .size_limit(PATTERN_SIZE_LIMIT)
        .dfa_size_limit(PATTERN_DFA_SIZE_LIMIT)
        .case_insensitive(args.case_insensitive.unwrap_or(false))
        .multi_line(true)
        .fixed_strings(fixed);
    // `$` before a CRLF line break too (ripgrep's `--crlf`): `^baz$` finds `baz` in a
    // Windows file; and, as this takes a CR for a line break, in a classic Mac one.
    if multiline {
        builder.dot_matches_new_line(true);
        if cr {
            builder.crlf(true).line_terminator(None);
        }
    } else if cr {
        // `crlf` first: it sets the line terminator, which is then made the CR alone.
        builder.crlf(true).line_terminator(Some(b'\r'));
    } else {
        builder.line_terminator(Some(b'\n')).crlf(true);
    }
    builder.build(&args.pattern).map_err(|e| {
        let hint = "; to search for the text as it is, set `fixed_strings: true`";
        pattern_error(args, &e.to_string(), hint)
    })
}

/// The regex that picks the matching parts out of a matching line for `-o`: the pattern
/// as the matcher takes it, run over lines the searcher already found; with `cr`, for a
/// file whose lines end in a bare CR, where `^` and `$` match at a CR in a multiline
/// match as they do in the matcher.
fn build_only_matching(args: &GrepArgs, multiline: bool, cr: bool) -> Result<Regex, String> {
    let pattern = match args.fixed_strings.unwrap_or(false) {
        true => regex::escape(&args.pattern),
        false => args.pattern.clone(),
    };
    RegexBuilder::new(&pattern)
        .size_limit(PATTERN_SIZE_LIMIT)
        .dfa_size_limit(PATTERN_DFA_SIZE_LIMIT)
        .case_insensitive(args.case_insensitive.unwrap_or(false))
        .multi_line(true)
        .crlf(!multiline || cr)
        .dot_matches_new_line(multiline)
        .build()
        .map_err(|e| pattern_error(args, &e.to_string(), ""))
}

/// Threads of the parallel walk: every core, as ripgrep uses.
fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).min(12)
}

fn display(root: &Path, path: &Path) -> String {
    crate::workspace::shown_path(path.strip_prefix(root).unwrap_or(path).as_os_str())
}

#[derive(Debug, Clone, Copy)]
struct Show {
    numbers: bool,
    line_chars: usize,
    context: bool,
    multiline: bool,
}

/// Collects one file's results.
struct FileSink<'a> {
    mode: OutputMode,
    show: Show,
    display: &'a str,
    /// The first `keep` output lines (content mode).
    lines: Vec<String>,
    /// Output lines kept at most: later ones are counted in `produced` and dropped, so that
    /// `grep .` over a huge file holds a page, not the file.
    keep: usize,
    /// Output lines produced, kept or not (matches, context lines and separators).
    produced: usize,
    /// Matching lines.
    count: u64,
    cancelled: &'a AtomicBool,
    budget: &'a Budget,
    /// With `-o`: what to show of each matching line.
    only: Option<&'a Regex>,
    /// `max_matches_per_file`.
    cap: Option<u64>,
    /// Matches seen (a multiline match counts once, as in ripgrep's `--max-count`).
    hits: u64,
    /// A match past `cap` was found: the file has more than is shown.
    more: bool,
    /// The byte the file's lines end with: `\n`, or `\r` in a file of bare CRs.
    terminator: u8,
    /// Where the searcher found binary data (a NUL byte) and stopped.
    binary: Option<u64>,
}

impl FileSink<'_> {
    /// Whether the cap is reached: from then on only the last match's after-context is
    /// kept, and the next match ends the file.
    fn at_cap(&self) -> bool {
        self.cap.is_some_and(|cap| self.hits >= cap)
    }

    /// The matching parts of a matching line (or of a multiline match, one output line
    /// per line of each part).
    fn push_matching_parts(&mut self, regex: &Regex, first: Option<u64>, bytes: &[u8]) {
        let mut any = false;
        for found in regex.find_iter(bytes) {
            if found.is_empty() {
                continue;
            }
            any = true;
            let end = self.terminator;
            let above = memchr::memchr_iter(end, &bytes[..found.start()]).count() as u64;
            let part = found.as_bytes();
            let part = part.strip_suffix(&[end]).unwrap_or(part);
            for (i, piece) in part.split(|&b| b == end).enumerate() {
                self.push(':', first.map(|n| n + above + i as u64), piece);
            }
        }
        // The searcher's matcher and this regex agree on what matches; should they ever
        // differ, the whole line is shown rather than a match lost.
        if !any {
            self.push(':', first, bytes);
        }
    }

    fn push(&mut self, separator: char, number: Option<u64>, bytes: &[u8]) {
        self.produced += 1;
        if self.lines.len() >= self.keep {
            return;
        }
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim_end_matches(['\n', '\r']);
        let mut line = String::with_capacity(self.display.len() + text.len().min(4096) + 12);
        line.push_str(self.display);
        line.push(separator);
        if let (true, Some(n)) = (self.show.numbers, number) {
            let _ = write!(line, "{n}{separator}");
        }
        let mut chars = text.char_indices();
        match chars.nth(self.show.line_chars) {
            Some((cut, _)) => {
                let hidden = text[cut..].chars().count();
                line.push_str(&text[..cut]);
                let _ = write!(line, "[... {hidden} more characters]");
            }
            None => line.push_str(text),
        }
        self.lines.push(line);
    }
}

impl Sink for FileSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        // The clock is read every 256 matches: `grep .` over a large file matches every line.
        if self.cancelled.load(Ordering::Relaxed)
            || (self.hits.is_multiple_of(256) && self.budget.spent())
        {
            return Ok(false);
        }
        if self.at_cap() {
            self.more = true;
            return Ok(false);
        }
        self.hits += 1;
        match (self.mode, self.only) {
            (OutputMode::FilesWithMatches, _) => {
                self.count += 1;
                Ok(false)
            }
            (OutputMode::Count, _) => {
                self.count += mat.lines().count() as u64;
                Ok(true)
            }
            (OutputMode::Content, Some(regex)) => {
                self.count += mat.lines().count() as u64;
                let first = mat.line_number();
                if self.show.multiline {
                    self.push_matching_parts(regex, first, mat.bytes());
                } else {
                    for (i, line) in mat.lines().enumerate() {
                        let line = line.strip_suffix(b"\n").unwrap_or(line);
                        let line = line.strip_suffix(b"\r").unwrap_or(line);
                        self.push_matching_parts(regex, first.map(|n| n + i as u64), line);
                    }
                }
                Ok(true)
            }
            (OutputMode::Content, None) => {
                let first = mat.line_number();
                for (i, line) in mat.lines().enumerate() {
                    self.count += 1;
                    self.push(':', first.map(|n| n + i as u64), line);
                }
                Ok(true)
            }
        }
    }

    fn context(&mut self, _: &Searcher, ctx: &SinkContext<'_>) -> Result<bool, io::Error> {
        // Past the cap, lines before a match belong to a match that is not shown.
        if self.at_cap() && matches!(ctx.kind(), SinkContextKind::Before) {
            return Ok(true);
        }
        if matches!(ctx.kind(), SinkContextKind::Before | SinkContextKind::After) {
            self.push('-', ctx.line_number(), ctx.bytes());
        }
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, offset: u64) -> Result<bool, io::Error> {
        self.binary = Some(offset);
        Ok(false)
    }

    fn context_break(&mut self, _: &Searcher) -> Result<bool, io::Error> {
        if self.show.context && self.produced > 0 && !self.at_cap() {
            self.produced += 1;
            if self.lines.len() < self.keep {
                self.lines.push("--".into());
            }
        }
        Ok(true)
    }
}

struct FileResult {
    modified: SystemTime,
    count: u64,
    /// The first output lines, at most what a page can show.
    lines: Vec<String>,
    /// Output lines in all, `lines` and those dropped.
    produced: usize,
    /// The file has more matches than `max_matches_per_file` let through.
    capped: bool,
}

/// The results of every file, in path order, trimmed to what a page can show.
#[derive(Default)]
struct Collector {
    files: BTreeMap<String, FileResult>,
    /// Output lines kept in `files` (content mode).
    kept_lines: usize,
    /// Output lines seen, kept or not.
    total_lines: usize,
    /// Files seen.
    total_files: usize,
    /// Files with more matches than `max_matches_per_file` let through.
    capped_files: usize,
    /// Lines (content) a page may need: `offset + head_limit`, and the separator dropped.
    wanted: usize,
}

impl Collector {
    fn new(wanted: usize) -> Self {
        Collector { wanted, ..Collector::default() }
    }

    fn add(&mut self, path: String, result: FileResult) {
        self.total_files += 1;
        self.capped_files += usize::from(result.capped);
        self.total_lines += result.produced;
        self.kept_lines += result.lines.len();
        self.files.insert(path, result);
        // Content mode: drop the files sorting last while the rest still fill the page, so
        // memory stays bounded by a page however many matches the tree has.
        while self.kept_lines > self.wanted {
            let Some(last) = self.files.last_entry() else { break };
            let len = last.get().lines.len();
            if len == 0 || self.kept_lines - len < self.wanted {
                break;
            }
            last.remove();
            self.kept_lines -= len;
        }
    }
}

/// Which part of the results a call shows.
#[derive(Debug, Clone, Copy)]
struct Page {
    offset: usize,
    head_limit: usize,
    /// `max_matches_per_file`.
    cap: Option<u64>,
    /// Context groups are separated by `--` lines.
    separated: bool,
}

fn render(mode: OutputMode, collector: Collector, page: Page, total_matches: u64) -> ToolOutput {
    let Page { offset, head_limit, separated, .. } = page;
    let limit = if head_limit == 0 { usize::MAX } else { head_limit };
    let (items, total, unit): (Vec<String>, usize, &str) = match mode {
        OutputMode::Content => {
            let skip = usize::from(separated);
            let lines = collector.files.into_values().flat_map(|f| f.lines).skip(skip);
            let total = collector.total_lines.saturating_sub(skip);
            (lines.skip(offset).take(limit).collect(), total, "line")
        }
        OutputMode::Count => {
            let lines = collector.files.iter().map(|(path, f)| format!("{path}:{}", f.count));
            (lines.skip(offset).take(limit).collect(), collector.total_files, "file")
        }
        OutputMode::FilesWithMatches => {
            let mut files: Vec<(String, FileResult)> = collector.files.into_iter().collect();
            files.sort_by(|a, b| b.1.modified.cmp(&a.1.modified).then_with(|| a.0.cmp(&b.0)));
            let paths = files.into_iter().map(|(path, _)| path);
            (paths.skip(offset).take(limit).collect(), collector.total_files, "file")
        }
    };
    let files = collector.total_files;
    if total == 0 {
        return ToolOutput::text("No matches found")
            .with_extra("matches", json!(0))
            .with_extra("files", json!(0))
            .with_extra("truncated", json!(false));
    }
    let shown_end = offset + items.len();
    let truncated = shown_end < total;
    // Footer lines, each on its own line, the first too when no result is shown.
    let mut footers: Vec<String> = Vec::new();
    if mode == OutputMode::Count {
        let (lines, in_files) =
            (counted(total_matches, "matching line"), counted(files as u64, "file"));
        footers.push(format!("[{lines} in {in_files}]"));
    }
    if items.is_empty() {
        let there = if total == 1 { "there is" } else { "there are" };
        footers.push(format!(
            "[offset {offset} is past the end: {there} {}]",
            counted(total as u64, unit)
        ));
    }
    let mut text = items.join("\n");
    for footer in footers {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&footer);
    }
    if !items.is_empty() && (truncated || offset > 0) {
        let _ = write!(text, "\n[showing {unit}s {}-{shown_end} of {total}", offset + 1);
        if truncated {
            let _ = write!(text, "; use offset={shown_end} for more");
        }
        text.push(']');
    }
    let capped = collector.capped_files;
    if let (Some(cap), 1..) = (page.cap, capped) {
        let (files, have) = if capped == 1 { ("file", "has") } else { ("files", "have") };
        let _ = write!(
            text,
            "\n[{capped} {files} {have} more than max_matches_per_file={cap} matching lines; \
             the rest are not shown or counted: raise `max_matches_per_file` to see them]"
        );
    }
    ToolOutput::text(text)
        .with_extra("matches", json!(total_matches))
        .with_extra("files", json!(files))
        .with_extra("total", json!(total))
        .with_extra("truncated", json!(truncated))
        .with_extra("cappedFiles", json!(capped))
}

/// `n` and `what`, plural unless `n` is 1: "1 file", "2 files".
fn counted(n: u64, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_cancellation_flag_stops_the_search() {
        let temp = tempfile::tempdir().unwrap();
        std::fs::write(temp.path().join("a.txt"), "needle\n").unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        let args = GrepArgs { pattern: "needle".into(), ..GrepArgs::default() };
        let cancelled = Arc::new(AtomicBool::new(true));
        let budget = Budget::new(std::time::Duration::from_secs(30), None);
        let err = grep(&ws, &FsLimits::default(), args, &cancelled, &budget).unwrap_err();
        assert!(matches!(err, FsError::Cancelled { tool: "grep" }), "{err}");
    }

    #[test]
    fn a_spent_budget_answers_with_what_was_found_and_says_so() {
        let temp = tempfile::tempdir().unwrap();
        std::fs::write(temp.path().join("a.txt"), "needle\n").unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        let args = GrepArgs { pattern: "needle".into(), ..GrepArgs::default() };
        let cancelled = Arc::new(AtomicBool::new(false));
        let budget = Budget::new(std::time::Duration::ZERO, None);
        let out = grep(&ws, &FsLimits::default(), args, &cancelled, &budget).unwrap();
        let text = out.to_text();
        assert!(text.starts_with("No matches found\n[the search stopped after 0.0s"), "{text}");
        assert!(text.contains("the results above are partial"), "{text}");
        assert_eq!(
            (&out.extras["timedOut"], &out.extras["truncated"]),
            (&json!(true), &json!(true))
        );
        // With time, the same search finds the file and says nothing of time.
        let args = GrepArgs { pattern: "needle".into(), ..GrepArgs::default() };
        let budget = Budget::new(std::time::Duration::from_secs(30), None);
        let out = grep(&ws, &FsLimits::default(), args, &cancelled, &budget).unwrap();
        assert_eq!(out.to_text(), "a.txt");
        assert!(out.extras.get("timedOut").is_none());
    }

    /// A line-by-line search holds a line at a time, up to a limit (64 MiB, lowered here):
    /// a file with a longer line (LF or CR lines) is skipped and named, and lines under
    /// the limit past the line-ending check's head are searched.
    #[test]
    fn a_file_with_a_line_over_the_limit_is_skipped_and_named() {
        let temp = tempfile::tempdir().unwrap();
        let long = "x".repeat(3 << 20);
        let fine = "y".repeat(3 << 19);
        std::fs::write(temp.path().join("a.txt"), "needle\n").unwrap();
        std::fs::write(temp.path().join("long.txt"), format!("needle\n{long} needle\n")).unwrap();
        std::fs::write(temp.path().join("cr.txt"), format!("needle\r{long}\r")).unwrap();
        std::fs::write(temp.path().join("ok.txt"), format!("{fine}\nneedle {fine}\nneedle\n"))
            .unwrap();
        let ws = Workspace::open(temp.path()).unwrap();
        let cancelled = Arc::new(AtomicBool::new(false));
        let budget = Budget::new(std::time::Duration::from_secs(30), None);
        let args = GrepArgs {
            pattern: "needle".into(),
            output_mode: Some(OutputMode::Count),
            ..GrepArgs::default()
        };
        let out = search(&ws, &FsLimits::default(), args, &cancelled, &budget, 2 << 20).unwrap();
        expect_test::expect![[r#"
            a.txt:1
            ok.txt:2
            [3 matching lines in 2 files]
            [2 files not searched: a line longer than 2 MiB, more than a search holds in memory: cr.txt, long.txt; search it with `bash` tools (`grep -o`) if allowed]"#]].assert_eq(&out.to_text());
        assert_eq!(out.extras["skippedLongLines"], 2);
    }

    /// `Head::read` tells a file as `read` does, from all of it: CRs past the first 8 KiB
    /// count, so does an LF past them, and a UTF-16 file is told from its text.
    #[test]
    fn cr_files_are_told_from_the_whole_file() {
        let temp = tempfile::tempdir().unwrap();
        let told = |bytes: &[u8]| {
            let path = temp.path().join("f");
            std::fs::write(&path, bytes).unwrap();
            Head::read(&std::fs::File::open(&path).unwrap(), || false).cr
        };
        let long = "x".repeat(100 * 1024);
        assert!(told(format!("{long}\ry\r").as_bytes()));
        assert!(!told(format!("a\r{long}\n").as_bytes()));
        assert!(!told(long.as_bytes()));
        assert!(!told(b""));
        assert!(!told(format!("{long}\0\r").as_bytes()));
        assert!(told(&Encoding::Utf16Le.encode("a\rb\r")));
        assert!(!told(&Encoding::Utf16Be.encode("a\rb\r\n")));
    }

    /// A file with no LF in its first 8 KiB is read once: what the line-ending check read
    /// is what is searched (the file changed on disk after it, and the search still sees
    /// what was read), and only the rest after it is read from the file.
    #[test]
    fn a_long_lined_file_is_searched_from_what_was_read() {
        use std::os::unix::fs::FileExt as _;
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("f");
        let matcher = RegexMatcherBuilder::new().build("needle").unwrap();
        let mut searcher = SearcherBuilder::new().line_number(true).build();
        let found = |head: &Head, file: &std::fs::File, searcher: &mut Searcher| {
            let mut lines = Vec::new();
            let sink = grep_searcher::sinks::UTF8(|number, line| {
                let line = line.trim_end();
                lines.push(format!("{number}:{}", &line[line.len().saturating_sub(12)..]));
                Ok(true)
            });
            head.search(searcher, &matcher, file, sink, || false).unwrap();
            lines
        };
        let long = "x".repeat(20 * 1024);
        let overwrite = || {
            let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            writer.write_at(b"HAY!!!", (long.len() + 1) as u64).unwrap();
        };
        // No LF at all: read whole, and searched from memory.
        std::fs::write(&path, format!("{long} needle")).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let head = Head::read(&file, || false);
        assert!(head.whole && !head.cr);
        overwrite();
        assert_eq!(found(&head, &file, &mut searcher), ["1:xxxxx needle"]);
        // An LF after 8 KiB: what came before it from memory, the rest from the file.
        std::fs::write(&path, format!("{long} needle\nneedle 2\n")).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let head = Head::read(&file, || false);
        assert!(!head.whole && head.len() > long.len());
        overwrite();
        assert_eq!(found(&head, &file, &mut searcher), ["1:xxxxx needle", "2:needle 2"]);
    }

    /// A UTF-32 file is searched decoded whichever way it is searched: from the head read
    /// for its line endings (whole, or cut inside a code unit after 8 KiB without an LF),
    /// or all at once; invalid UTF-32 is not searched.
    #[test]
    fn utf32_files_are_searched_decoded() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("f");
        let matcher = RegexMatcherBuilder::new().build("ne+dle.").unwrap();
        let mut searcher = SearcherBuilder::new().line_number(true).build();
        // A line's number and its last nine characters.
        fn tail(number: u64, line: &str) -> String {
            let line = line.trim_end();
            let start = line.char_indices().rev().nth(8).map_or(0, |(i, _)| i);
            format!("{number}:{}", &line[start..])
        }
        fn sink(lines: &mut Vec<String>) -> impl Sink<Error = io::Error> + '_ {
            grep_searcher::sinks::UTF8(move |number, line| {
                lines.push(tail(number, line));
                Ok(true)
            })
        }
        let long = "x".repeat(3 * 1024 + 1);
        for encoding in [Encoding::Utf32Le, Encoding::Utf32Be] {
            for text in
                ["a\nb neeedle\u{e9}\n".to_owned(), format!("{long} needle\u{1F600}\nneedle2\n")]
            {
                std::fs::write(&path, encoding.encode(&text)).unwrap();
                let file = std::fs::File::open(&path).unwrap();
                let (mut headed, mut whole) = (Vec::new(), Vec::new());
                let head = Head::read(&file, || false);
                assert_eq!(head.encoding, encoding);
                head.search(&mut searcher, &matcher, &file, sink(&mut headed), || false).unwrap();
                search_file(&mut searcher, &matcher, &file, sink(&mut whole), || false).unwrap();
                let want: Vec<String> = text
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| l.contains("dle"))
                    .map(|(i, l)| tail(i as u64 + 1, l))
                    .collect();
                assert_eq!(headed, want, "{encoding:?}");
                assert_eq!(whole, want, "{encoding:?}");
            }
        }
        let mut broken = Encoding::Utf32Le.encode("needle\n");
        broken.extend(0x11_0000u32.to_le_bytes());
        std::fs::write(&path, broken).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let sink = grep_searcher::sinks::UTF8(|_, _| Ok(true));
        assert!(search_file(&mut searcher, &matcher, &file, sink, || false).is_err());
    }

    /// A search told to stop reads its file no further, whichever way it reads it: the
    /// sink, which checks for a cancellation and the time, hears only of matches, so a
    /// file without one was read to its end after the call had stopped.
    #[test]
    fn a_stopped_search_reads_no_further() {
        use std::sync::atomic::AtomicUsize;
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("f");
        let matcher = RegexMatcherBuilder::new().build("needle").unwrap();
        let mut searcher = SearcherBuilder::new().line_number(true).build();
        // 4 MiB of lines without the needle, then the needle: about 64 of the searcher's
        // reads, each asking whether to stop.
        let mut text = "hay hay hay hay\n".repeat(256 * 1024);
        text.push_str("needle\n");
        let long = format!("{}\n{text}", "x".repeat(9000));
        for (name, text) in [("short lines", &text), ("a long first line", &long)] {
            for encoding in [Encoding::Utf8, Encoding::Utf32Le] {
                std::fs::write(&path, encoding.encode(text)).unwrap();
                let file = std::fs::File::open(&path).unwrap();
                let head = Head::read(&file, || false);
                for headed in [false, true] {
                    // The matches found, the search read from the head or the file itself.
                    let mut found = |stop: &dyn Fn() -> bool| {
                        let mut found = 0;
                        let sink = grep_searcher::sinks::UTF8(|_, _| {
                            found += 1;
                            Ok(true)
                        });
                        match headed {
                            true => head.search(&mut searcher, &matcher, &file, sink, stop),
                            false => search_file(&mut searcher, &matcher, &file, sink, stop),
                        }
                        .unwrap();
                        found
                    };
                    let asked = AtomicUsize::new(0);
                    // Stops after a few reads, as a cancellation would midway.
                    let stopped = found(&|| asked.fetch_add(1, Ordering::Relaxed) >= 3);
                    let asked = asked.load(Ordering::Relaxed);
                    let case = format!("{name}, {encoding:?}, headed {headed}");
                    assert_eq!(stopped, 0, "{case}: read to the end");
                    assert!(asked <= 5, "{case}: {asked} reads");
                    // Not stopped, the same search finds the needle.
                    assert_eq!(found(&|| false), 1, "{case}");
                }
            }
        }
    }

    #[test]
    fn a_file_sink_keeps_a_page_and_counts_the_rest() {
        let text: String = (1..=1000).map(|i| format!("hit {i}\n")).collect();
        let matcher = RegexMatcherBuilder::new().line_terminator(Some(b'\n')).build("hit").unwrap();
        let cancelled = AtomicBool::new(false);
        let show = Show { numbers: true, line_chars: 100, context: false, multiline: false };
        let mut sink = FileSink {
            mode: OutputMode::Content,
            show,
            display: "a.txt",
            lines: Vec::new(),
            keep: 5,
            produced: 0,
            count: 0,
            cancelled: &cancelled,
            budget: &Budget::new(std::time::Duration::from_secs(30), None),
            only: None,
            cap: None,
            hits: 0,
            more: false,
            terminator: b'\n',
            binary: None,
        };
        SearcherBuilder::new()
            .line_number(true)
            .build()
            .search_slice(&matcher, text.as_bytes(), &mut sink)
            .unwrap();
        assert_eq!(
            sink.lines,
            ["a.txt:1:hit 1", "a.txt:2:hit 2", "a.txt:3:hit 3", "a.txt:4:hit 4", "a.txt:5:hit 5"]
        );
        assert_eq!((sink.produced, sink.count), (1000, 1000));
    }
}
