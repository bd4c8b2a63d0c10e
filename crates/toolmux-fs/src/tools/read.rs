//! `read`: one page of a text file with numbered lines, streamed so that the last page of
//! a huge file costs a scan, not its size in memory; an image (PNG, JPEG, GIF, WebP) as an
//! image, for models that see.

use super::Budget;
use super::notebook;
use super::text::{CrLines, Encoding, WideDecoder};
use crate::config::FsLimits;
use crate::error::FsError;
use crate::workspace::{self, Hash, PageRepeat, ShownPage, Workspace};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use toolmux_core::ToolOutput;

/// Bytes looked at for NUL to decide a file is binary (as git and ripgrep do).
const SNIFF_BYTES: usize = 8192;

/// Bytes of a file whose lines are counted in full (or `fs.limits.editMaxBytes`, when
/// larger): past them, and past the page, a larger file is read no further, and its
/// count is said to be partial. Counting a 2 GB file's lines for the footer took most of
/// a minute (a debug build), and the page was the same.
pub(crate) const COUNT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// The size past which a file is read in part and recorded as read by its
/// [`workspace::fingerprint`] rather than its content hash.
pub(crate) fn counted_max(limits: &FsLimits) -> u64 {
    COUNT_MAX_BYTES.max(limits.edit_max_bytes)
}

/// When a `read` stops before its end: the call cancelled (or its future dropped), or the
/// time to reach the page spent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stop<'a> {
    /// Set when the call is cancelled or its future dropped.
    pub(crate) cancelled: &'a AtomicBool,
    /// Ends a little before the call's own time limit.
    pub(crate) budget: &'a Budget,
}

/// Arguments of `read`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The file to read: relative to the workspace root, or absolute inside it.
    pub path: String,
    /// The 1-based line to start at (default 1).
    #[serde(default)]
    pub offset: Option<u64>,
    /// How many lines to return (default 2000).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub limit: Option<u64>,
    /// Instead of `offset`: read the block of code around this 1-based line, found by
    /// indentation (the function, class or other block it is in, with the comments and
    /// attributes above it and its closing line).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub anchor_line: Option<u64>,
    /// With `anchor_line`: how many blocks outward to go (default 1, the innermost block
    /// the line is in; 2 its enclosing block, such as the class around a method; 0 the
    /// block the line itself opens).
    #[serde(default)]
    #[schemars(range(max = 20))]
    pub levels: Option<u64>,
    /// In a line longer than 2000 characters: the character of line `offset` to read from
    /// (from 0), with `limit` 1, as the cut marker says (default 0).
    #[serde(default)]
    pub start_char: Option<u64>,
    /// For a Jupyter notebook (`.ipynb`): its JSON as numbered lines, like any file's, to
    /// see the text to `edit` (default false: its cells, rendered).
    #[serde(default)]
    pub raw: bool,
}

/// The description; `ns` is the namespace the tools are listed in (other tools are named
/// as a model calls them, `fs__ls` in `fs`).
pub(crate) fn description(ns: &str) -> String {
    format!(
        "Read a text file from the workspace. Returns `cat -n` style \
lines: the 1-based line number right-aligned in 6 columns, a TAB, then the line. By default up to \
2000 lines from the start; pass `offset` (1-based line) and `limit` to read other parts. Lines \
longer than 2000 characters are cut with a marker giving the `offset`, `limit: 1` and \
`start_char` that read on in that line. Instead of \
`offset`, `anchor_line` returns the block of code around that line, found by indentation: the \
function or other block it is in (`levels: 2` for the one around that, such as its class), \
with the comments and attributes above it and its closing line. A footer in square \
brackets says when more lines remain and which `offset` continues. The total line count is \
reported; in a file over 64 MiB, lines are counted only to the page or the first 64 MiB, \
whichever is further, and the count says so. Directories are refused (use `{ns}__ls`); a PNG, JPEG, GIF or WebP image (up to 5 MiB) is \
returned as an image; other binary files (NUL bytes in the first 8 KiB) are refused, invalid UTF-8 is replaced with U+FFFD and flagged; files with a UTF-16 or UTF-32 byte order mark \
are decoded (and refused if they are not valid in it). A Jupyter notebook (`.ipynb`) is shown \
as its cells (number, id, type, source, text outputs; images and attachments named by type and \
size), `offset` and `limit` counting cells; `raw: true` shows its JSON as lines instead, the text `{ns}__edit` and \
`{ns}__write` change. Paths are relative to the workspace \
root or absolute inside it; nothing outside the root can be read. Asking again for the same \
range (`offset` and `limit`, lines or a notebook's cells, with the same `raw`) of a file whose content has not changed since this run's last \
`{ns}__read` of it showed that range in full answers `[File unchanged since last read ...]` instead of \
the lines, which are still those of that earlier result; if you no longer have them, make the \
same call once more and the lines are returned."
    )
}

/// Reads one page of `args.path`, recording the file's hash for `run`. With `may_repeat`
/// false (a person's call, who keeps no transcript of earlier results) the page is always
/// shown, never answered "unchanged".
/// Images larger than this are refused (the largest a model's API takes).
const IMAGE_MAX: u64 = 5 * 1024 * 1024;

/// The MIME type of an image whose file starts with `head`, by its signature.
fn image_type(head: &[u8]) -> Option<&'static str> {
    match head {
        [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, ..] => Some("image/png"),
        [0xff, 0xd8, 0xff, ..] => Some("image/jpeg"),
        [b'G', b'I', b'F', b'8', b'7' | b'9', b'a', ..] => Some("image/gif"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some("image/webp"),
        _ => None,
    }
}

/// Whether a file starting with `head` is not text, as `read` judges it: an image, or a NUL
/// in its first [`SNIFF_BYTES`] bytes where no byte order mark names a wide encoding.
pub(crate) fn is_binary_file(head: &[u8]) -> bool {
    image_type(head).is_some()
        || (!Encoding::sniff(head).is_wide() && head[..head.len().min(SNIFF_BYTES)].contains(&0))
}

/// The image at `path` (`size` bytes, its first bytes in `bytes`, the rest in `reader`) as
/// an image for the model, and recorded as read.
#[allow(clippy::too_many_arguments)]
fn image(
    ws: &Workspace,
    run: &str,
    path: &workspace::Resolved,
    canonical: std::path::PathBuf,
    size: u64,
    bytes: &mut Vec<u8>,
    reader: &mut impl Read,
    mime_type: &'static str,
) -> Result<ToolOutput, FsError> {
    use base64::Engine as _;
    if size > IMAGE_MAX {
        return Err(FsError::TooLarge {
            tool: "read",
            path: path.given.clone(),
            size,
            limit: IMAGE_MAX,
        });
    }
    reader
        .take(IMAGE_MAX + 1 - bytes.len() as u64)
        .read_to_end(bytes)
        .map_err(|e| FsError::from_io(&path.given, e))?;
    let hash: Hash = Sha256::digest(bytes.as_slice()).into();
    ws.record_read(run, canonical, hash);
    let data = base64::engine::general_purpose::STANDARD.encode(bytes.as_slice());
    let text = format!("`{}`: {mime_type}, {} bytes", path.given, bytes.len());
    let mut output = ToolOutput::text(text);
    output.content.push(toolmux_core::ContentPart::Image { data, mime_type: mime_type.to_owned() });
    Ok(output.with_extra("image", json!(mime_type)).with_extra("bytes", json!(bytes.len())))
}

pub(crate) fn read(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    mut args: ReadArgs,
    may_repeat: bool,
    stop: Stop<'_>,
) -> Result<ToolOutput, FsError> {
    let Some(anchor) = args.anchor_line else {
        if !args.raw && args.start_char.unwrap_or(0) == 0 && notebook::is_notebook(&args.path) {
            return read_notebook(ws, limits, run, args, may_repeat, stop);
        }
        return read_page(ws, limits, run, args, may_repeat, stop);
    };
    let invalid = |message: String| FsError::InvalidArguments { tool: "read", message };
    if args.offset.is_some() {
        return Err(invalid(
            "give `offset` or `anchor_line`, not both: `anchor_line` finds where the block \
             starts"
                .into(),
        ));
    }
    if args.start_char.is_some() {
        return Err(invalid(
            "`start_char` reads on in line `offset`: give it with `offset`, not `anchor_line`"
                .into(),
        ));
    }
    let levels = args.levels.unwrap_or(1).min(20) as usize;
    let path = ws.resolve_file("read", &args.path)?;
    let canonical = ws.canonical(&path)?;
    ws.check_read(&path, &canonical)?;
    let bytes = match ws.read_small_at("read", &path, &canonical, limits.edit_max_bytes) {
        Ok(bytes) => bytes,
        // Nothing of it was shown, so it is not recorded as read; the message says what
        // to do instead, and why the file cannot be edited either.
        Err(FsError::TooLarge { size, limit, .. }) => {
            return Err(invalid(format!(
                "`{}` is {size} bytes, over `fs.limits.editMaxBytes` ({limit}): `anchor_line` \
                 finds blocks only in files it holds whole, as `edit` does, so neither works \
                 on it; read it by `offset` and `limit` instead (a read of any part lets \
                 `write` replace it whole)",
                path.given
            )));
        }
        Err(e) => return Err(e),
    };
    // A file refused as not text counts as read, by the bytes looked at, as a read without
    // `anchor_line` counts it (see `read_page`): else `write` would ask for a read that
    // could never be made.
    let refused = |error: FsError| {
        ws.record_read(run, canonical.clone(), Sha256::digest(&bytes).into());
        error
    };
    let encoding = Encoding::sniff(&bytes);
    if is_binary_file(&bytes) {
        return Err(refused(invalid(format!(
            "`{}` is not a text file: `anchor_line` finds blocks of code in text",
            path.given
        ))));
    }
    let text = encoding.decode(&bytes).map_err(|why| {
        refused(FsError::InvalidText { path: path.given.clone(), problem: why.to_string() })
    })?;
    let lines = super::text::lines(&text);
    if anchor == 0 || anchor > lines.len() as u64 {
        return Err(invalid(format!(
            "anchor_line {anchor} is past the end of `{}`, which has {} lines",
            path.given,
            lines.len()
        )));
    }
    let Some((start, end)) = super::block::around(&lines, anchor as usize - 1, levels) else {
        return Err(invalid(format!("`{}` has only blank lines", path.given)));
    };
    let (first, last) = (start as u64 + 1, end as u64 + 1);
    let wanted = last - first + 1;
    args.offset = Some(first);
    args.limit = Some(args.limit.map_or(wanted, |limit| limit.min(wanted)));
    let mut output = read_page(ws, limits, run, args, may_repeat, stop)?;
    let note = format!("[lines {first}-{last}: the block around line {anchor}]\n");
    if let Some(toolmux_core::ContentPart::Text { text }) = output.content.first_mut() {
        text.insert_str(0, &note);
    }
    Ok(output.with_extra("blockStart", json!(first)).with_extra("blockEnd", json!(last)))
}

/// Reads a notebook as its cells (see [`notebook`]); one that cannot be rendered (not
/// JSON, too large to load) as its raw text, with a note saying why.
fn read_notebook(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    args: ReadArgs,
    may_repeat: bool,
    stop: Stop<'_>,
) -> Result<ToolOutput, FsError> {
    let path = ws.resolve_file("read", &args.path)?;
    let canonical = ws.canonical(&path)?;
    ws.check_read(&path, &canonical)?;
    let page = notebook::CellPage {
        first: args.offset.unwrap_or(1).max(1),
        limit: args.limit,
        max_bytes: limits.read_page_bytes,
    };
    let why = match ws.read_small_at("read", &path, &canonical, limits.edit_max_bytes) {
        Ok(bytes) => match notebook::render(&path.given, &bytes, page) {
            Ok(rendered) => {
                let hash: Hash = Sha256::digest(&bytes).into();
                ws.record_read(run, canonical.clone(), hash);
                let output = rendered.output;
                if !may_repeat || output.extras.get("totalCells") == Some(&json!(0)) {
                    return Ok(output);
                }
                // As for lines: the same cells of the same content, shown in full last
                // time, are not shown again.
                let limit = args.limit.unwrap_or(u64::MAX);
                let shown =
                    ShownPage { first: page.first, limit, start_char: 0, hash, cells: true };
                return Ok(match ws.show_page(run, canonical, shown, rendered.complete) {
                    PageRepeat::Show => output,
                    PageRepeat::Unchanged => unchanged(&path.given, output),
                });
            }
            Err(notebook::Rendering::Invalid(message)) => {
                return Err(FsError::InvalidArguments { tool: "read", message });
            }
            Err(notebook::Rendering::Malformed(why)) => why,
        },
        Err(FsError::TooLarge { size, limit, .. }) => {
            format!("it is {size} bytes, more than the {limit} a notebook is rendered from")
        }
        Err(e) => return Err(e),
    };
    let mut output = read_page(ws, limits, run, args, may_repeat, stop)?;
    let note =
        format!("[`{}` is shown as its raw text, not as notebook cells: {why}]\n", path.given);
    if let Some(toolmux_core::ContentPart::Text { text }) = output.content.first_mut() {
        text.insert_str(0, &note);
    }
    Ok(output.with_extra("notebook", json!(false)))
}

/// Reads one page of `args.path` from `args.offset` (see [`read`]).
fn read_page(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    args: ReadArgs,
    may_repeat: bool,
    stop: Stop<'_>,
) -> Result<ToolOutput, FsError> {
    let path = ws.resolve_file("read", &args.path)?;
    let err = |e| FsError::from_io(&path.given, e);
    let meta = ws
        .dir()
        .metadata(&path.relative)
        .map_err(|e| ws.check_folders(&path).err().unwrap_or_else(|| err(e)))?;
    if meta.is_dir() {
        return Err(FsError::IsDirectory { path: path.given.clone() });
    }
    if !meta.is_file() {
        return Err(FsError::NotRegularFile { path: path.given.clone() });
    }
    let canonical = ws.canonical(&path)?;
    ws.check_read(&path, &canonical)?;
    let first = args.offset.unwrap_or(1).max(1);
    let start_char = args.start_char.unwrap_or(0);
    if start_char > 0 && args.limit.is_some_and(|limit| limit != 1) {
        return Err(FsError::InvalidArguments {
            tool: "read",
            message: "`start_char` reads on in one line, line `offset`: give `limit` 1 or \
                      leave it out"
                .into(),
        });
    }
    let limit = match start_char {
        0 => args.limit.unwrap_or(limits.read_lines as u64).max(1),
        _ => 1,
    };
    let mut buf = vec![0u8; 256 * 1024];
    // A file refused as binary or as text that does not decode counts as read, by its
    // bytes: no tool shows it as text, so `write` asking to read it first would send the
    // caller round in a circle, and it may still be replaced by one that has seen it as
    // much as it can be seen (a later change to it is still caught).
    let refused = |error: FsError| {
        if let Ok(current) = ws.hash_or_fingerprint(&path, counted_max(limits)) {
            ws.record_read(run, canonical.clone(), current);
        }
        error
    };
    let invalid = |e: super::text::DecodeError| {
        refused(FsError::InvalidText { path: path.given.clone(), problem: e.to_string() })
    };
    // Lines end where the page's first text guesses; a file that proves it wrong (a bare CR
    // file with a `\n` after the first chunk, or one whose CRs start later) is read again.
    let mut terminator = None;
    let (page, hash, record) = loop {
        // Opened where it was checked to lead, following no symlink: a name swapped for
        // one to a `hide` file since the check is refused, not read.
        let (file, opened) = ws.open_regular_at(&path, &canonical)?;
        let mut page = Page::new(first, limit, limits, terminator);
        page.start_char = start_char;
        let mut hasher = Sha256::new();
        // Read to the length the file had when opened: a file a running command appends
        // to faster than it is read (a log) would keep the call reading for as long as the
        // command writes.
        let mut reader = file.take(opened.len());
        // A file counted in full is hashed (for `edit`, `write` and "unchanged"); a
        // larger one is read only to its page, and the bytes before it are only scanned.
        let counted_max = counted_max(limits);
        let whole = opened.len() <= counted_max;
        let mut consumed: u64 = 0;
        let mut at_start = true;
        // Set when the file starts with a UTF-16 or UTF-32 byte order mark: its text is
        // decoded to UTF-8 before it is paged.
        let mut wide: Option<(Encoding, WideDecoder)> = None;
        let mut decoded = String::new();
        loop {
            if stop.cancelled.load(Ordering::Relaxed) {
                return Err(FsError::Cancelled { tool: "read" });
            }
            if !whole && page.past_page() && consumed >= counted_max {
                page.counted = Some((consumed, opened.len()));
                break;
            }
            if page.line < first && stop.budget.spent() {
                return Err(not_reached(&path.given, &page, consumed, opened.len()));
            }
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(err(e)),
            };
            let mut chunk = &buf[..n];
            if at_start && let Some(mime_type) = image_type(chunk) {
                let mut bytes = chunk.to_vec();
                return image(
                    ws,
                    run,
                    &path,
                    canonical,
                    meta.len(),
                    &mut bytes,
                    &mut reader,
                    mime_type,
                );
            }
            consumed += n as u64;
            if whole {
                hasher.update(chunk);
            }
            if at_start {
                at_start = false;
                let encoding = Encoding::sniff(chunk);
                if let Some(decoder) = encoding.decoder() {
                    wide = Some((encoding, decoder));
                } else if chunk[..chunk.len().min(SNIFF_BYTES)].contains(&0) {
                    return Err(refused(FsError::Binary { path: path.given.clone() }));
                }
                chunk = &chunk[encoding.bom().len()..];
            }
            match &mut wide {
                Some((_, decoder)) => {
                    decoded.clear();
                    decoder.feed(chunk, &mut decoded).map_err(invalid)?;
                    page.feed(decoded.as_bytes());
                }
                None => page.feed(chunk),
            }
        }
        if let Some((encoding, decoder)) = wide {
            decoder.finish().map_err(invalid)?;
            page.decoded_from = Some(encoding);
        }
        let right = page.right_terminator();
        if terminator.is_none() && right != page.terminator {
            terminator = Some(right);
            continue;
        }
        let hash: Option<Hash> = whole.then(|| hasher.finalize().into());
        // A file over the count's bytes is not hashed, read in part or not: it is
        // recorded as read by its fingerprint, which `write` checks (`edit` refuses a
        // file this large anyway), and its pages are always shown.
        let record = match hash {
            Some(hash) => hash,
            None => workspace::fingerprint(reader.get_ref(), &opened).map_err(err)?,
        };
        break (page, hash, record);
    };
    ws.record_read(run, canonical.clone(), record);
    let complete = !page.capped;
    let output = page.finish(&path.given)?;
    let Some(hash) = hash else { return Ok(output) };
    if !may_repeat || output.extras.get("totalLines") == Some(&json!(0)) {
        return Ok(output);
    }
    let shown = ShownPage { first, limit, start_char, hash, cells: false };
    match ws.show_page(run, canonical, shown, complete) {
        PageRepeat::Show => Ok(output),
        PageRepeat::Unchanged => Ok(unchanged(&path.given, output)),
    }
}

/// Why a read stopped before the page it was asked for: the time to reach it was spent,
/// `consumed` bytes of the file's `size` in.
fn not_reached(given: &str, page: &Page<'_>, consumed: u64, size: u64) -> FsError {
    let mib = |bytes: u64| bytes / (1024 * 1024);
    FsError::InvalidArguments {
        tool: "read",
        message: format!(
            "line {} of `{given}` was not reached before the call's time limit: its first {} \
             MiB (of {} MiB) hold {} lines; read an earlier `offset`, or find the text with \
             `grep`, which gives line numbers",
            page.first,
            mib(consumed),
            mib(size),
            page.line - 1
        ),
    }
}

/// The short answer to a repeated `read` of an unchanged page (lines, or a notebook's
/// cells), keeping the page's counts.
fn unchanged(given: &str, page: ToolOutput) -> ToolOutput {
    let number = |key: &str| page.extras.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let cells = page.extras.get("notebook") == Some(&json!(true));
    let (unit, keys) = match cells {
        true => ("cells", ["startCell", "endCell", "totalCells"]),
        false => ("lines", ["startLine", "endLine", "totalLines"]),
    };
    let (start, end, total) = (number(keys[0]), number(keys[1]), number(keys[2]));
    let text = format!(
        "[File unchanged since last read: {unit} {start}-{end} of `{given}` ({total} {unit} in \
         all) are exactly as the earlier `read` of this range in this run showed them, so they \
         are not repeated. If that result is no longer available to you, make this same call \
         again to get the {unit}.]"
    );
    let text = match page.extras.get("truncated") == Some(&json!(true)) {
        true => format!("{text}\n[more {unit} follow: use offset={} to read them]", end + 1),
        false => text,
    };
    // For this run alone (the orchestrator's `cache::PER_RUN`): another run never read it.
    let mut output = ToolOutput::text(text)
        .with_extra("unchanged", json!(true))
        .with_extra("per_run", json!(true));
    for key in ["encoding", "notebook", keys[2], keys[0], keys[1], "truncated"] {
        if let Some(value) = page.extras.get(key) {
            output = output.with_extra(key, value.clone());
        }
    }
    output
}

/// The lines of one page, and the count of all lines.
struct Page<'a> {
    first: u64,
    limit: u64,
    limits: &'a FsLimits,
    /// The 1-based number of the line being fed.
    line: u64,
    /// Whether the current line has bytes (so a final line without newline counts).
    line_open: bool,
    /// The characters of the current line shown, while it is on the page: the text as
    /// lossily decoded (an invalid sequence one U+FFFD, as `String::from_utf8_lossy` has
    /// it), at most `line_chars` characters after those `start_char` skips.
    current: String,
    /// Characters in `current`.
    current_chars: usize,
    /// Characters of the current line beyond what was kept.
    current_dropped: u64,
    /// The first bytes of a character cut by the end of a chunk (at most 3).
    partial: Vec<u8>,
    /// In a file of LF lines: the current line's bytes so far ended in a CR, not yet
    /// taken as text: it is none when an LF follows (a CRLF line end).
    pending_cr: bool,
    /// The characters of each line on the page to skip (`start_char`).
    start_char: u64,
    /// Characters of the current line skipped so far.
    skipped: u64,
    text: String,
    shown: u64,
    /// The byte lines end with: `\n` (a CR before it dropped), or `\r` in a file whose
    /// lines all end in a bare CR (classic Mac OS).
    terminator: u8,
    /// Whether `terminator` is known; otherwise the first bytes fed decide it.
    decided: bool,
    /// What the text fed so far says of its line ends: what `terminator` should have been.
    breaks: CrLines,
    /// The characters of the last line ended, skipped ones included.
    line_chars: u64,
    /// The page ended early because of the byte cap.
    capped: bool,
    /// Set when the file was read only in part, to past the page: the bytes read and the
    /// file's size. The lines are then counted in those bytes alone.
    counted: Option<(u64, u64)>,
    cut_lines: u64,
    invalid_utf8: bool,
    /// The encoding the text was decoded from, when not UTF-8.
    decoded_from: Option<Encoding>,
}

impl<'a> Page<'a> {
    fn new(first: u64, limit: u64, limits: &'a FsLimits, terminator: Option<u8>) -> Self {
        Page {
            first,
            limit,
            limits,
            terminator: terminator.unwrap_or(b'\n'),
            decided: terminator.is_some(),
            breaks: CrLines::default(),
            line: 1,
            line_open: false,
            current: String::new(),
            current_chars: 0,
            current_dropped: 0,
            partial: Vec::new(),
            pending_cr: false,
            start_char: 0,
            skipped: 0,
            text: String::new(),
            shown: 0,
            line_chars: 0,
            capped: false,
            counted: None,
            cut_lines: 0,
            invalid_utf8: false,
            decoded_from: None,
        }
    }

    fn on_page(&self) -> bool {
        // Not `line < first + limit`: a limit as large as a u64 overflows it.
        !self.capped && self.line >= self.first && self.line - self.first < self.limit
    }

    /// Whether the page is complete: its lines are fed, or it is capped.
    fn past_page(&self) -> bool {
        self.capped || (self.line >= self.first && self.line - self.first >= self.limit)
    }

    /// The terminator the whole file asks for: `\r` when it has a CR and no LF.
    fn right_terminator(&self) -> u8 {
        if self.breaks.cr_only() { b'\r' } else { b'\n' }
    }

    fn feed(&mut self, mut chunk: &[u8]) {
        self.breaks.feed(chunk);
        if !self.decided && !chunk.is_empty() {
            self.decided = true;
            self.terminator = self.right_terminator();
        }
        let terminator = self.terminator;
        while !chunk.is_empty() {
            if !self.on_page() {
                // Off the page: only count newlines, the fast path for huge files.
                let before_page = self.line < self.first;
                let newlines = if before_page {
                    // Stop counting exactly at the first line of the page.
                    let wanted = (self.first - self.line) as usize;
                    match memchr::memchr_iter(terminator, chunk).nth(wanted - 1) {
                        Some(at) => {
                            self.line += wanted as u64;
                            self.line_open = false;
                            chunk = &chunk[at + 1..];
                            continue;
                        }
                        None => memchr::memchr_iter(terminator, chunk).count(),
                    }
                } else {
                    memchr::memchr_iter(terminator, chunk).count()
                };
                self.line += newlines as u64;
                self.line_open = chunk.last() != Some(&terminator);
                return;
            }
            let (part, rest, ends) = match memchr::memchr(terminator, chunk) {
                Some(at) => (&chunk[..at], &chunk[at + 1..], true),
                None => (chunk, &chunk[chunk.len()..], false),
            };
            self.line_open = !part.is_empty() || self.line_open;
            self.take(part, ends);
            if ends {
                self.end_line();
            }
            chunk = rest;
        }
    }

    /// Takes `part` of the current line, which ends the line when `ends`. In a file of LF
    /// lines a CR right before the LF is no text, even when a chunk ends between the two.
    fn take(&mut self, mut part: &[u8], ends: bool) {
        if std::mem::take(&mut self.pending_cr) && !(ends && part.is_empty()) {
            self.decode(b"\r");
        }
        if self.terminator == b'\n'
            && let Some(body) = part.strip_suffix(b"\r")
        {
            part = body;
            self.pending_cr = !ends;
        }
        self.decode(part);
    }

    /// Decodes `bytes` of the current line as `String::from_utf8_lossy` decodes the whole
    /// line: a character cut by the end of a chunk is completed by the next, and each
    /// invalid sequence is one U+FFFD. Characters are counted in what this gives, the text
    /// the model is shown, so `start_char` and the cut marker count alike.
    fn decode(&mut self, mut bytes: &[u8]) {
        while !self.partial.is_empty() {
            let Some((&byte, rest)) = bytes.split_first() else { return };
            let mut buf = [0u8; 4];
            let len = self.partial.len() + 1;
            buf[..len - 1].copy_from_slice(&self.partial);
            buf[len - 1] = byte;
            match std::str::from_utf8(&buf[..len]) {
                Ok(text) => {
                    self.partial.clear();
                    bytes = rest;
                    self.text(text);
                }
                Err(e) if e.error_len().is_none() => {
                    self.partial.push(byte);
                    bytes = rest;
                }
                // The cut sequence is invalid; `byte` starts what follows it.
                Err(_) => {
                    self.partial.clear();
                    self.replaced();
                }
            }
        }
        let mut chunks = bytes.utf8_chunks().peekable();
        while let Some(chunk) = chunks.next() {
            self.text(chunk.valid());
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            let cut = chunks.peek().is_none()
                && std::str::from_utf8(invalid).is_err_and(|e| e.error_len().is_none());
            match cut {
                true => self.partial.extend_from_slice(invalid),
                false => self.replaced(),
            }
        }
    }

    /// An invalid sequence, shown as U+FFFD.
    fn replaced(&mut self) {
        self.invalid_utf8 = true;
        self.text("\u{FFFD}");
    }

    /// Characters of the current line: skipped while `start_char` says so, then kept up
    /// to `line_chars`, then only counted.
    fn text(&mut self, mut text: &str) {
        if self.skipped < self.start_char {
            let left = usize::try_from(self.start_char - self.skipped).unwrap_or(usize::MAX);
            match text.char_indices().nth(left) {
                Some((at, _)) => {
                    self.skipped = self.start_char;
                    text = &text[at..];
                }
                None => {
                    self.skipped += text.chars().count() as u64;
                    return;
                }
            }
        }
        let room = self.limits.line_chars.saturating_sub(self.current_chars);
        if room > 0 {
            match text.char_indices().nth(room) {
                Some((at, _)) => {
                    self.current.push_str(&text[..at]);
                    self.current_chars += room;
                    text = &text[at..];
                }
                None => {
                    self.current.push_str(text);
                    self.current_chars += text.chars().count();
                    return;
                }
            }
        }
        self.current_dropped += text.chars().count() as u64;
    }

    fn end_line(&mut self) {
        // A line ending in the middle of a character: one U+FFFD, as lossy decoding has it.
        if !self.partial.is_empty() {
            self.partial.clear();
            self.replaced();
        }
        // A CR that ended the file's last bytes is dropped, as one before an LF is.
        self.pending_cr = false;
        let mut shown = std::mem::take(&mut self.current);
        let rest_chars = std::mem::take(&mut self.current_chars) as u64 + self.current_dropped;
        let hidden = rest_chars.saturating_sub(self.limits.line_chars as u64);
        let from = self.skipped;
        self.line_chars = from + rest_chars;
        if hidden > 0 {
            self.cut_lines += 1;
            let _ = write!(
                shown,
                "[... {hidden} more characters: read on with offset={}, limit=1, start_char={}]",
                self.line,
                from + self.limits.line_chars as u64
            );
        }
        let mut entry = String::with_capacity(shown.len() + 8);
        let _ = writeln!(entry, "{:>6}\t{shown}", self.line);
        if self.shown > 0 && self.text.len() + entry.len() > self.limits.read_page_bytes {
            self.capped = true;
        } else {
            self.text.push_str(&entry);
            self.shown += 1;
        }
        self.current_dropped = 0;
        self.skipped = 0;
        self.line_open = false;
        self.line += 1;
    }

    fn finish(mut self, given: &str) -> Result<ToolOutput, FsError> {
        if self.line_open || self.current_chars > 0 || self.current_dropped > 0 {
            if self.on_page() {
                self.end_line();
            } else {
                self.line += 1;
            }
        }
        let total = self.line - 1;
        if total == 0 {
            return Ok(ToolOutput::text(format!("[`{given}` is empty]"))
                .with_extra("totalLines", json!(0))
                .with_extra("truncated", json!(false)));
        }
        if self.first > total {
            return Err(FsError::InvalidArguments {
                tool: "read",
                message: format!(
                    "offset {} is past the end of `{given}`, which has {total} lines",
                    self.first
                ),
            });
        }
        if self.start_char > 0 && self.start_char >= self.line_chars {
            return Err(FsError::InvalidArguments {
                tool: "read",
                message: format!(
                    "start_char {} is past the end of line {} of `{given}`, which has {} \
                     characters",
                    self.start_char, self.first, self.line_chars
                ),
            });
        }
        let last = self.first + self.shown - 1;
        let more = last < total || self.counted.is_some();
        let mut text = self.text;
        if self.start_char > 0 {
            let to = self.line_chars.min(self.start_char + self.limits.line_chars as u64);
            let _ = write!(
                text,
                "\n[characters {}-{to} of line {}'s {}]",
                self.start_char + 1,
                self.first,
                self.line_chars
            );
        }
        if more {
            let why = if self.capped {
                format!("page capped at {} bytes; ", self.limits.read_page_bytes)
            } else {
                String::new()
            };
            let of = match self.counted {
                Some((read, size)) => format!(
                    "at least {total} (counted in the first {} MiB of the file's {} MiB, \
                     where the read stopped)",
                    read / (1024 * 1024),
                    size / (1024 * 1024)
                ),
                None => total.to_string(),
            };
            let _ = write!(
                text,
                "\n[{why}showing lines {}-{last} of {of}; use offset={} to read more]",
                self.first,
                last + 1
            );
        }
        if self.invalid_utf8 {
            text.push_str("\n[the file is not valid UTF-8: invalid bytes are shown as U+FFFD]");
        }
        if let Some(encoding) = self.decoded_from {
            let _ =
                write!(text, "\n[the file is {}; `edit` and `write` keep it so]", encoding.name());
        }
        if self.terminator == b'\r' {
            text.push_str("\n[the file's lines end in a bare CR; `edit` and `write` keep them so]");
        }
        let encoding = self.decoded_from.unwrap_or(Encoding::Utf8);
        Ok(ToolOutput::text(text)
            .with_extra("encoding", json!(encoding.name()))
            .with_extra("totalLines", json!(total))
            .with_extra("totalLinesPartial", json!(self.counted.is_some()))
            .with_extra("startLine", json!(self.first))
            .with_extra("endLine", json!(last))
            .with_extra("truncated", json!(more))
            .with_extra("linesCut", json!(self.cut_lines))
            .with_extra("invalidUtf8", json!(self.invalid_utf8)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page is the same however the file's bytes come in chunks (characters and invalid
    /// sequences cut between two, a CR apart from its LF), and its lines are the file's
    /// lines as lossy decoding gives them, counted in those characters by `start_char`.
    #[test]
    fn pages_do_not_depend_on_chunk_cuts() {
        let bytes: &[u8] =
            b"a\xC3\xA9b\xF0\x9F\x98\x80c\xE2\x82\r\nd\x80\xF0\x80\x80e\xC3\r\n\xE2\x82\xAC\r";
        let lossy = String::from_utf8_lossy(bytes).into_owned();
        for (line_chars, start_char) in [(100, 0), (3, 0), (3, 2), (3, 4), (2, 5)] {
            let limits = FsLimits { line_chars, ..FsLimits::default() };
            let page = |size: usize| {
                let limit = if start_char > 0 { 1 } else { 10 };
                let mut page = Page::new(1, limit, &limits, Some(b'\n'));
                page.start_char = start_char;
                bytes.chunks(size).for_each(|piece| page.feed(piece));
                page.finish("f").unwrap().to_text()
            };
            let whole = page(bytes.len());
            for size in 1..bytes.len() {
                assert_eq!(page(size), whole, "pieces of {size}, {line_chars}, {start_char}");
            }
            if line_chars == 100 {
                let lines: Vec<&str> = lossy.split("\r\n").collect();
                let wanted = format!("     1\t{}\n     2\t{}\n     3\t€\n", lines[0], lines[1]);
                assert!(whole.starts_with(&wanted), "{whole}");
            } else if start_char > 0 {
                let line: Vec<char> = lossy.split("\r\n").next().unwrap().chars().collect();
                let end = line.len().min(start_char as usize + line_chars);
                let part: String = line[start_char as usize..end].iter().collect();
                assert!(whole.starts_with(&format!("     1\t{part}")), "{whole}");
            }
        }
    }
}
