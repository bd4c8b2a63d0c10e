//! `edit` and `multi_edit`: exact string replacements, all or nothing, written atomically.

use super::canonical::{contains_whole, splits, whole_matches};
use super::text::{Encoding, LineEnding};
use crate::config::FsLimits;
use crate::error::FsError;
use crate::workspace::{self, Resolved, Workspace};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt::Write as _;
use toolmux_core::ToolOutput;

/// Replacements shown in the diff at most.
const DIFF_HUNKS: usize = 3;
/// Lines of one side of a hunk shown at most.
const DIFF_LINES: usize = 12;
/// Characters of a context line shown around a change at most.
const CONTEXT_CHARS: usize = 200;
/// Lines of context shown before and after a replacement.
const CONTEXT_LINES: usize = 2;
/// Characters of a changed line shown at most: a replacement in a longer line (minified
/// code) shows the replaced text only.
const LINE_CHARS: usize = 400;
/// Match line numbers listed in an ambiguity error at most.
const LISTED_MATCHES: usize = 20;

/// Arguments of `edit`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// The file to edit: relative to the workspace root, or absolute inside it.
    pub path: String,
    /// The exact text to replace, including whitespace and indentation (without the line
    /// number prefixes `read` adds). Leave it out with `insert_line`.
    #[serde(default)]
    pub old_string: String,
    /// The text to put in its place; must differ from `old_string`. With `insert_line`,
    /// the lines to insert.
    pub new_string: String,
    /// Replace every occurrence; otherwise `old_string` must occur exactly once.
    #[serde(default)]
    pub replace_all: bool,
    /// How many times `old_string` must occur: the edit is refused unless it occurs exactly
    /// this often, and then every occurrence is replaced (safer than `replace_all`).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub expected_count: Option<usize>,
    /// Instead of `old_string`: insert `new_string` as whole lines after this 1-based line
    /// (as `read` numbers them); 0 inserts at the top, -1 after the last line (-2 before
    /// it, and so on).
    #[serde(default)]
    pub insert_line: Option<i64>,
    /// Check the edit and show its diff without writing anything.
    #[serde(default)]
    pub dry_run: bool,
}

/// One replacement of `multi_edit`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditOperation {
    /// The exact text to replace; left out with `insert_line`.
    #[serde(default)]
    pub old_string: String,
    /// The text to put in its place, or the lines to insert.
    pub new_string: String,
    /// Replace every occurrence; otherwise `old_string` must occur exactly once.
    #[serde(default)]
    pub replace_all: bool,
    /// How many times `old_string` must occur (then every occurrence is replaced).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub expected_count: Option<usize>,
    /// Instead of `old_string`: insert `new_string` after this line of the text as the
    /// edits before left it (0 the top, -1 after the last line).
    #[serde(default)]
    pub insert_line: Option<i64>,
}

/// Arguments of `multi_edit`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultiEditArgs {
    /// The file to edit: relative to the workspace root, or absolute inside it.
    pub path: String,
    /// The replacements, applied in order, each to the result of the previous one.
    #[schemars(length(min = 1))]
    pub edits: Vec<EditOperation>,
    /// Check the edits and show their diff without writing anything.
    #[serde(default)]
    pub dry_run: bool,
}

/// The description; `ns` is the namespace the tools are listed in (other tools are named
/// as a model calls them, `fs__ls` in `fs`).
pub(crate) fn edit_description(ns: &str) -> String {
    format!(
        "Replace exact text in a file. `old_string` must match \
the file exactly (whitespace and indentation included, without the line-number prefix `{ns}__read` \
shows) and occur exactly once, unless `replace_all` is true. When it is not found, the error \
names the closest line; when it occurs several times, the error gives the count and line \
numbers: add surrounding context to make it unique. `expected_count` N replaces every \
occurrence but only if there are exactly N. To add lines without replacing any, give \
`insert_line` N instead of `old_string`: `new_string` goes in as whole lines after line N as \
`{ns}__read` numbers it (0 the top of the file, -1 after its last line), and the diff shows the lines \
around it to check the place. `dry_run` shows the diff and writes nothing. `old_string` and \
`new_string` must differ. \
The file keeps its encoding (UTF-8, a byte order mark, UTF-16, UTF-32) and line endings: `new_string` \
may use `\\n`, it is written with the file's CRLF if that is what most of its lines use (CR \
if they all end in a bare CR). \
Curly quotes, long dashes and non-breaking spaces in the file match the plain ones in \
`old_string` (what `new_string` keeps of the matched text is written in the file's style, \
what it adds as given); spaces and tabs ending the \
lines of a several-line `old_string` need not match. With an empty `old_string` on a missing or empty file, `new_string` becomes its content. Returns the \
number of replacements and a short diff. The write is atomic; if the file was read in this run \
and has changed since, the edit is refused until you read it again."
    )
}

/// The description; `ns` is the namespace the tools are listed in (other tools are named
/// as a model calls them, `fs__ls` in `fs`).
pub(crate) fn multi_edit_description(ns: &str) -> String {
    format!(
        "Apply several exact replacements to one file, \
all or nothing: each edit (`old_string`, `new_string`, `replace_all`) is applied in order to the \
result of the previous one, with the same rules as `{ns}__edit` (`expected_count` included; an edit \
with `insert_line` inserts after that line of the text the edits before it left); if any \
edit fails, nothing is written and the error names the failing edit. `dry_run` shows the diff \
and writes nothing. The write is atomic. Returns the number of replacements \
and a short diff."
    )
}

/// Runs `edit`.
pub(crate) fn edit(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    args: EditArgs,
) -> Result<ToolOutput, FsError> {
    let op = EditOperation {
        old_string: args.old_string,
        new_string: args.new_string,
        replace_all: args.replace_all,
        expected_count: args.expected_count,
        insert_line: args.insert_line,
    };
    apply(ws, limits, run, "edit", &args.path, std::slice::from_ref(&op), args.dry_run)
}

/// Runs `multi_edit`.
pub(crate) fn multi_edit(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    args: MultiEditArgs,
) -> Result<ToolOutput, FsError> {
    if args.edits.is_empty() {
        return Err(FsError::InvalidArguments {
            tool: "multi_edit",
            message: "`edits` is empty: give at least one edit".into(),
        });
    }
    apply(ws, limits, run, "multi_edit", &args.path, &args.edits, args.dry_run)
}

fn apply(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    tool: &'static str,
    given: &str,
    edits: &[EditOperation],
    dry_run: bool,
) -> Result<ToolOutput, FsError> {
    let path = ws.resolve_file(tool, given)?;
    let target = ws.check_write(&path)?;
    // Held from loading the file to recording what was written, so that parallel edits of
    // one file apply one after the other, each to the result of the last.
    let _lock = ws.lock_file(&path, &target)?;
    let multi = edits.len() > 1;
    let creates = edits[0].old_string.is_empty() && edits[0].insert_line.is_none();
    let (original, encoding) = match load(ws, limits, run, &path, "edit") {
        Ok((text, encoding)) => (Some(text), encoding),
        Err(FsError::NotFound { .. }) if creates => (None, Encoding::Utf8),
        Err(e) => return Err(e),
    };
    let created = original.is_none();
    // The style of the file as it was: replacements follow it, whatever the edit used.
    let ending = original.as_deref().and_then(LineEnding::dominant);
    let mut text = original.unwrap_or_default();
    // A file whose lines end in a bare CR (classic Mac OS) is edited as LF lines, so that
    // its lines are those `read` numbers, and written back with CR.
    let cr = ending == Some(LineEnding::Cr);
    if cr {
        text = text.replace('\r', "\n");
    }
    let mut replacements = 0;
    let mut insertions = 0;
    let mut hunks = Vec::new();
    // The replacements and insertions the hunks show (one hunk shows every replacement
    // in its lines).
    let mut shown = 0;
    for (index, op) in edits.iter().enumerate() {
        let label = if multi { format!("edit {}: ", index + 1) } else { String::new() };
        // The CRs of a CR file's text became LF above; so do those `old_string` and
        // `new_string` break lines with, bare as the file has them or CRLF, as the LF a
        // model may write for them does.
        let as_lf;
        let op = match cr && (op.old_string.contains('\r') || op.new_string.contains('\r')) {
            true => {
                let lf = |text: &str| text.replace("\r\n", "\n").replace('\r', "\n");
                as_lf = EditOperation {
                    old_string: lf(&op.old_string),
                    new_string: lf(&op.new_string),
                    ..op.clone()
                };
                &as_lf
            }
            false => op,
        };
        let fail = |message: String| FsError::Edit {
            path: path.given.clone(),
            message: format!("{label}{message}; nothing was written"),
        };
        if op.expected_count == Some(0) {
            return Err(fail(
                "expected_count is 0: give the number of occurrences to replace (at least 1)"
                    .into(),
            ));
        }
        if let Some(line) = op.insert_line {
            let inserted =
                insert(&text, op, line, ending.map(LineEnding::working)).map_err(fail)?;
            if hunks.len() < DIFF_HUNKS {
                hunks.push(inserted.hunk);
                shown += 1;
            }
            text = inserted.text;
            insertions += 1;
            continue;
        }
        if op.old_string == op.new_string {
            return Err(fail(
                "no changes to make: old_string and new_string are exactly the same".into(),
            ));
        }
        if op.old_string.is_empty() {
            if created && index == 0 {
                text = op.new_string.clone();
                replacements += 1;
                continue;
            }
            // An empty file has no text to give: its first content is given so, as for a
            // missing file (a file made with `touch` could not be edited at all).
            if index == 0 && text.is_empty() {
                text = op.new_string.clone();
                replacements += 1;
                hunks.push(Hunk::fragments(1, String::new(), text.clone(), None));
                shown += 1;
                continue;
            }
            return Err(fail(format!(
                "old_string is empty but `{}` exists and is not empty: give the text to \
                 replace, `insert_line` to add lines, or use `write` to replace the whole file",
                path.given
            )));
        }
        let (old, new, note) = match_form(&text, op, ending);
        // A place that stops short of an accent (or starts inside one) is no match: the
        // accent would be left on the replacement.
        let starts = whole_matches(&text, &old);
        if starts.is_empty() {
            let message = match super::canonical::split_match(&text, &old) {
                Some((at, whole)) => inside_accents(&text, at, whole, &old, &path.given),
                None => not_found(&text, &op.old_string, &path.given),
            };
            return Err(fail(message));
        }
        let listed = || {
            let lines: Vec<String> = starts
                .iter()
                .take(LISTED_MATCHES)
                .map(|&at| line_of(&text, at).to_string())
                .collect();
            let more = if starts.len() > LISTED_MATCHES { ", ..." } else { "" };
            format!("{}{more}", lines.join(", "))
        };
        if let Some(expected) = op.expected_count
            && expected != starts.len()
        {
            return Err(fail(format!(
                "expected {expected} occurrence{} of old_string in `{}` but found {} (at lines \
                 {}): check old_string, or give the count found",
                if expected == 1 { "" } else { "s" },
                path.given,
                starts.len(),
                listed()
            )));
        }
        if starts.len() > 1 && !op.replace_all && op.expected_count.is_none() {
            return Err(fail(format!(
                "found {} matches of old_string in `{}` (at lines {}) but replace_all is \
                 false: set replace_all to true to replace every occurrence, or add surrounding \
                 context to old_string to pick one",
                starts.len(),
                path.given,
                listed()
            )));
        }
        let replaced = replaced_at(&text, &starts, old.len(), &new);
        let change =
            Replacement { before: &text, after: &replaced, starts: &starts, old: &old, new: &new };
        let (more, count) = change.hunks(note, DIFF_HUNKS.saturating_sub(hunks.len()));
        hunks.extend(more);
        shown += count;
        replacements += starts.len();
        text = replaced;
    }
    if cr {
        text = text.replace('\n', "\r");
    }
    let bytes = encoding.encode(&text);
    let mut set_id_note = String::new();
    if !dry_run {
        let before = super::undo::before(ws, &path, limits.edit_max_bytes);
        let written = ws.write_atomic(&path, &bytes)?;
        set_id_note = written.set_id_note();
        ws.record_read(run, written.canonical, workspace::hash(&bytes));
        super::undo::wrote(ws, run, tool, &path, before, (&bytes, written.previous_mode));
    }
    let changes = changes(replacements, insertions);
    let mut out = if dry_run {
        let what = if created { "create the file".to_owned() } else { format!("make {changes}") };
        format!(
            "dry run: the edit applies; it would {what} in `{}` (nothing was written)",
            path.given
        )
    } else if created {
        let lines = text.lines().count();
        let s = if lines == 1 { "" } else { "s" };
        format!("created `{}` ({lines} line{s})", path.given)
    } else {
        format!("made {changes} in `{}`{set_id_note}", path.given)
    };
    for hunk in &hunks {
        hunk.render(&mut out);
    }
    if replacements + insertions > shown && !created {
        let _ = write!(out, "\n[diff shows {shown} of {changes}]");
    }
    Ok(ToolOutput::text(out)
        .with_extra("replacements", json!(replacements))
        .with_extra("insertions", json!(insertions))
        .with_extra("created", json!(created))
        .with_extra("dry_run", json!(dry_run)))
}

/// "2 replacements", "1 insertion", "1 replacement and 1 insertion".
fn changes(replacements: usize, insertions: usize) -> String {
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    match (replacements, insertions) {
        (_, 0) => count(replacements, "replacement"),
        (0, _) => count(insertions, "insertion"),
        _ => {
            format!("{} and {}", count(replacements, "replacement"), count(insertions, "insertion"))
        }
    }
}

/// The text with an `insert_line` edit made, and its hunk.
struct Inserted {
    text: String,
    hunk: Hunk,
}

/// Inserts `op.new_string` as whole lines after line `line` of `text` (0 the top,
/// negative counting from the end, -1 after the last line). One line break ending
/// `new_string` is its last line's; the inserted lines get the file's line ending
/// (`ending`, LF in a file without line breaks), and the file keeps ending with a line
/// break, or without one, as it did.
fn insert(
    text: &str,
    op: &EditOperation,
    line: i64,
    ending: Option<LineEnding>,
) -> Result<Inserted, String> {
    if !op.old_string.is_empty() || op.replace_all || op.expected_count.is_some() {
        return Err("insert_line inserts without replacing: leave out old_string, replace_all \
                    and expected_count, or leave out insert_line to replace"
            .into());
    }
    if op.new_string.is_empty() {
        return Err("new_string is empty: give the lines to insert".into());
    }
    let lines: Vec<&str> = text.lines().collect();
    let total = lines.len();
    let after = if line >= 0 {
        Some(line as u64)
    } else {
        (total as u64 + 1).checked_sub(line.unsigned_abs())
    };
    let after = match after {
        Some(after) if after <= total as u64 => after as usize,
        _ => {
            return Err(format!(
                "insert_line {line} is outside the file, which has {total} line{}: give 0 to \
                 {total} (0 inserts at the top, {total} after the last line), or -1 to -{} \
                 counting from the end",
                if total == 1 { "" } else { "s" },
                total + 1
            ));
        }
    };
    let ending = ending.unwrap_or(LineEnding::Lf);
    let given = op
        .new_string
        .strip_suffix('\n')
        .map_or(op.new_string.as_str(), |body| body.strip_suffix('\r').unwrap_or(body));
    let body = ending.apply(given);
    let line_break = ending.as_str();
    // Where line `after` ends, after its line break; the last line may have none.
    let at = match after {
        0 => Some(0),
        n => memchr::memchr_iter(b'\n', text.as_bytes()).nth(n - 1).map(|at| at + 1),
    };
    let mut out = String::with_capacity(text.len() + body.len() + 2);
    match at {
        Some(at) => {
            out.push_str(&text[..at]);
            out.push_str(&body);
            out.push_str(line_break);
            out.push_str(&text[at..]);
        }
        None => {
            out.push_str(text);
            out.push_str(line_break);
            out.push_str(&body);
        }
    }
    let hunk = Hunk {
        line: after + 1,
        old: String::new(),
        new: body.into_owned(),
        notes: Vec::new(),
        around: Some((
            after.checked_sub(1).map(|i| lines[i].to_owned()),
            lines.get(after).map(|l| (*l).to_owned()),
        )),
        lines: Vec::new(),
    };
    Ok(Inserted { text: out, hunk })
}

/// Loads the file as text (without its byte order mark) and its encoding, refusing it when
/// it changed since it was read in `run`.
pub(super) fn load(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    path: &Resolved,
    tool: &'static str,
) -> Result<(String, Encoding), FsError> {
    // What is read is what is checked: the file where the path leads now, opened with no
    // symlink followed, so a name swapped for a link to a `hide` file after the caller's
    // check is not read (and shown in the edit's diff or written back).
    let canonical = ws.canonical(path)?;
    ws.check_read(path, &canonical)?;
    let bytes = ws.read_small_at(tool, path, &canonical, limits.edit_max_bytes)?;
    let encoding = Encoding::sniff(&bytes);
    // NUL bytes are ordinary in UTF-16 and UTF-32 text.
    if !encoding.is_wide() && bytes[..bytes.len().min(8192)].contains(&0) {
        return Err(FsError::Binary { path: path.given.clone() });
    }
    ws.check_fresh(run, path, &canonical, &workspace::hash(&bytes), false)?;
    let text = encoding.decode(&bytes).map_err(|why| FsError::Edit {
        path: path.given.clone(),
        message: format!(
            "`{}` {why}: editing it as text would corrupt it; nothing was written",
            path.given
        ),
    })?;
    Ok((text, encoding))
}

/// The strings to search and insert. `old_string` is looked for as given, then with its
/// line breaks as LF, then as CRLF (an edit written with `\n` matches a CRLF file).
/// `new_string` always gets the file's line ending (`ending`, the one most of its lines
/// use), so a replacement never mixes endings into a file; a file without any line break
/// gives no style and `new_string` is inserted as given.
fn match_form(
    text: &str,
    op: &EditOperation,
    ending: Option<LineEnding>,
) -> (String, String, Option<&'static str>) {
    let mut given = op.old_string.as_str();
    let mut new_given = Cow::Borrowed(op.new_string.as_str());
    let mut note = None;
    // Copied from `read` with its line numbers (`    12\t…` on every line): the file has
    // none, so they go, from `new_string` too when it has them on every line.
    let unnumbered;
    if !contains_whole(text, given)
        && let Some(bare) = without_read_numbers(given)
    {
        unnumbered = bare;
        given = &unnumbered;
        if let Some(bare) = without_read_numbers(&op.new_string) {
            new_given = Cow::Owned(bare);
        }
        note = Some("removed the line numbers `read` puts before each line");
    }
    let mut old = Cow::Borrowed(given);
    if !contains_whole(text, given) && given.contains('\n') {
        for (form, why) in [
            (LineEnding::Lf, "matched with LF line endings"),
            (LineEnding::CrLf, "matched with CRLF line endings"),
        ] {
            let candidate = form.apply(given);
            if candidate != given && contains_whole(text, &candidate) {
                old = candidate;
                note = Some(why);
                break;
            }
        }
    }
    if !contains_whole(text, &old)
        && let Some(found) = super::canonical::find(text, &old)
    {
        // The replacement is written in the file's form too, when it has one; in a file
        // of both, as given.
        let form = super::canonical::Form::of(text);
        if let Some(form) = form {
            new_given = Cow::Owned(form.apply(&new_given));
        }
        old = Cow::Owned(found);
        note = Some(match form {
            Some(super::canonical::Form::Decomposed) => {
                "matched the file's decomposed accents (Unicode NFD) and wrote them so"
            }
            Some(super::canonical::Form::Composed) => {
                "matched the file's composed accents (Unicode NFC) and wrote them so"
            }
            None => "matched the file's accents written in another Unicode normalization form",
        });
    }
    if !contains_whole(text, &old) {
        // Looser and looser: the ends of lines (line breaks, spaces and tabs before them)
        // for an `old_string` of several lines, typographic characters, then both.
        let lines = old.contains('\n');
        let typographic = old.chars().chain(text.chars()).any(|c| plain(c) != c);
        // `old_string` in the Unicode form of the file's accents, when the file writes
        // them one way and `old_string` the other: tried after `old_string` as given, so
        // that accents and these readings match together.
        let refolded = super::canonical::Form::of(text)
            .map(|form| (form, form.apply(&old)))
            .filter(|(_, refolded)| *refolded != *old);
        for (loose, why, why_accents) in [
            (
                Loose::LINE_ENDS,
                "matched ignoring spaces and tabs at the ends of lines",
                "matched ignoring spaces and tabs at the ends of lines, with the file's \
                 accents in their Unicode form (NFC or NFD), and wrote them so",
            ),
            (
                Loose::TYPOGRAPHIC,
                "matched the file's typographic quotes, dashes or spaces with plain ones",
                "matched the file's typographic quotes, dashes or spaces with plain ones and \
                 the file's accents in their Unicode form (NFC or NFD), and wrote them so",
            ),
            (
                Loose::BOTH,
                "matched ignoring the ends of lines and the file's typographic quotes, dashes \
                 or spaces",
                "matched ignoring the ends of lines and the file's typographic quotes, dashes \
                 or spaces, with the file's accents in their Unicode form (NFC or NFD), and \
                 wrote them so",
            ),
        ] {
            if loose.line_ends && !lines || loose.typographic && !typographic {
                continue;
            }
            let (found, wanted, form) = match loose.find(text, &old) {
                Some(found) => (found, old.to_string(), None),
                None => {
                    let Some((form, refolded)) = &refolded else { continue };
                    let Some(found) = loose.find(text, refolded) else { continue };
                    (found, refolded.clone(), Some(*form))
                }
            };
            if let Some(form) = form {
                new_given = Cow::Owned(form.apply(&new_given));
            }
            // The replacement keeps the file's style: plain quotes and dashes written
            // where the matched text had typographic ones become those again.
            let lines_of = |text: &str| match loose.line_ends {
                true => line_ends_dropped(text),
                false => text.to_owned(),
            };
            if loose.typographic
                && let Some(styled) = styled_like(&lines_of(&found), &lines_of(&wanted), &new_given)
            {
                new_given = Cow::Owned(styled);
            }
            old = Cow::Owned(found);
            note = Some(if form.is_some() { why_accents } else { why });
            break;
        }
    }
    let new = match ending {
        Some(ending) => {
            let new = ending.working().apply(&new_given);
            // A CR file's text is edited with LF (see `apply`): every line break of
            // `new_string` is written as CR.
            let converted = match ending {
                LineEnding::Cr => new.contains('\n'),
                _ => new != op.new_string,
            };
            if note.is_none() && converted {
                note = Some(match ending {
                    LineEnding::CrLf => "written with the file's CRLF line endings",
                    LineEnding::Lf => "written with the file's LF line endings",
                    LineEnding::Cr => "written with the file's CR line endings",
                });
            }
            new.into_owned()
        }
        None => new_given.into_owned(),
    };
    (old.into_owned(), new, note)
}

/// `text` without the line numbers `read` puts before each line (`{:>6}\t`), when every
/// line has one; `None` otherwise.
fn without_read_numbers(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (number, rest) = line.split_once('\t')?;
        let digits = number.trim_start_matches(' ');
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        out.push_str(rest);
    }
    (!out.is_empty()).then_some(out)
}

/// `new` in the typographic style of `found`, the file's text that `old` (the caller's,
/// written with plain quotes and dashes) matched character for character: every
/// character `new` keeps from `old` is written as the file has it, and what `new` adds is
/// written as given. Kept characters are those of the longest common subsequence of `old`
/// and `new` (after their common start and end, and only while the part between is under
/// a million pairs). So prose keeps its curly quotes where its words change, and code
/// added beside it keeps plain ones (rewriting every `"` of `new` turned `print("x")`
/// into `print(“x”)`). `None` when there is nothing to restyle or `found` and `old` do not
/// match character for character.
pub(super) fn styled_like(found: &str, old: &str, new: &str) -> Option<String> {
    let file: Vec<char> = found.chars().collect();
    let given: Vec<char> = old.chars().collect();
    if file.len() != given.len()
        || file == given
        || file.iter().zip(&given).any(|(&f, &g)| plain(f) != plain(g))
    {
        return None;
    }
    let new: Vec<char> = new.chars().collect();
    let prefix = given.iter().zip(&new).take_while(|(g, n)| g == n).count();
    let room = (given.len() - prefix).min(new.len() - prefix);
    let suffix =
        given.iter().rev().zip(new.iter().rev()).take(room).take_while(|(g, n)| g == n).count();
    let (given_mid, file_mid) =
        (&given[prefix..given.len() - suffix], &file[prefix..file.len() - suffix]);
    let mut mid = new[prefix..new.len() - suffix].to_vec();
    let width = mid.len() + 1;
    if file_mid != given_mid && (given_mid.len() + 1).saturating_mul(width) <= 1 << 20 {
        // `kept[i * width + j]`: the longest common subsequence of `given_mid[i..]` and
        // `mid[j..]`.
        let mut kept = vec![0u32; (given_mid.len() + 1) * width];
        for i in (0..given_mid.len()).rev() {
            for j in (0..mid.len()).rev() {
                kept[i * width + j] = if given_mid[i] == mid[j] {
                    kept[(i + 1) * width + j + 1] + 1
                } else {
                    kept[(i + 1) * width + j].max(kept[i * width + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < given_mid.len() && j < mid.len() {
            if given_mid[i] == mid[j] {
                mid[j] = file_mid[i];
                (i, j) = (i + 1, j + 1);
            } else if kept[(i + 1) * width + j] >= kept[i * width + j + 1] {
                i += 1;
            } else {
                j += 1;
            }
        }
    }
    let mut out = String::with_capacity(new.len() * 4);
    out.extend(&file[..prefix]);
    out.extend(&mid);
    out.extend(&file[file.len() - suffix..]);
    Some(out)
}

/// `text` with LF line breaks and without the spaces and tabs that end its lines, as
/// [`Loose::LINE_ENDS`] reads it.
fn line_ends_dropped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(body) => (body.strip_suffix('\r').unwrap_or(body), true),
            None => (line, false),
        };
        out.push_str(body.trim_end_matches([' ', '\t']));
        if newline {
            out.push('\n');
        }
    }
    out
}

/// The plain character a typographic one stands for (curly quotes, primes, dashes, the
/// minus sign, and every space separator of Unicode), which models often write plain.
/// All the spaces alike: two lines that both show as `a = 1`, one with non-breaking
/// spaces and one with figure spaces, must both match `a = 1` and so be told apart as
/// different, where reading only some of them as spaces changed the one it read.
pub(super) fn plain(c: char) -> char {
    match c {
        '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' | '\u{2032}' => '\'',
        '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' | '\u{2033}' => '"',
        '\u{2012}' | '\u{2013}' | '\u{2014}' | '\u{2015}' | '\u{2212}' => '-',
        // Unicode's space separators (general category Zs) besides the space itself.
        '\u{00A0}'
        | '\u{1680}'
        | '\u{2000}'..='\u{200A}'
        | '\u{202F}'
        | '\u{205F}'
        | '\u{3000}' => ' ',
        other => other,
    }
}

/// How loosely `old_string` is looked for when it is not in the file as written.
#[derive(Debug, Clone, Copy)]
struct Loose {
    /// Line breaks read as LF, and the spaces and tabs that end lines ignored, on both
    /// sides: a model rarely reproduces trailing whitespace or CRLF.
    line_ends: bool,
    /// Typographic characters read as plain ones ([`plain`]) on both sides.
    typographic: bool,
}

impl Loose {
    const LINE_ENDS: Loose = Loose { line_ends: true, typographic: false };
    const TYPOGRAPHIC: Loose = Loose { line_ends: false, typographic: true };
    const BOTH: Loose = Loose { line_ends: true, typographic: true };

    /// The text of `text` that `old` matches read this loosely, when every place it
    /// matches holds the same text; `None` when there is none, or when they differ (which
    /// to change would be a guess). A match ends where its last character does, so the
    /// spaces after it stay, unless `old` ended with some.
    fn find(self, text: &str, old: &str) -> Option<String> {
        let (wanted, _) = self.read(old);
        if wanted.is_empty() {
            return None;
        }
        let (read, origin) = self.read(text);
        let found = read.match_indices(wanted.as_str()).filter_map(|(at, _)| {
            let (start, mut end) = (origin[at], origin[at + wanted.len()]);
            // Not between a letter and its accents, as an exact match.
            if splits(text, start, end) {
                return None;
            }
            if self.line_ends && old.ends_with([' ', '\t']) {
                end += text[end..].len() - text[end..].trim_start_matches([' ', '\t']).len();
            }
            Some(&text[start..end])
        });
        the_one(found)
    }

    /// Where in `text` each match of `old` read this loosely begins.
    fn places(self, text: &str, old: &str) -> Vec<usize> {
        let (wanted, _) = self.read(old);
        if wanted.is_empty() {
            return Vec::new();
        }
        let (read, origin) = self.read(text);
        read.match_indices(wanted.as_str())
            .map(|(at, _)| (origin[at], origin[at + wanted.len()]))
            .filter(|&(start, end)| !splits(text, start, end))
            .map(|(start, _)| start)
            .collect()
    }

    /// `text` read this loosely, and for each of its bytes (and its end) where that byte's
    /// character begins in `text`; a line break read as `\n` begins where the line's
    /// trailing spaces did and ends after the break, so a match ending in one takes it all.
    fn read(self, text: &str) -> (String, Vec<usize>) {
        let map = |c: char| if self.typographic { plain(c) } else { c };
        let mut read = String::with_capacity(text.len());
        let mut origin = Vec::with_capacity(text.len() + 1);
        let mut push = |read: &mut String, c: char, at: usize| {
            origin.extend(std::iter::repeat_n(at, c.len_utf8()));
            read.push(c);
        };
        if !self.line_ends {
            for (at, c) in text.char_indices() {
                push(&mut read, map(c), at);
            }
            origin.push(text.len());
            return (read, origin);
        }
        let mut at = 0;
        let mut end = 0;
        for line in text.split_inclusive('\n') {
            let body = line.strip_suffix('\n');
            let kept = body
                .map(|b| b.strip_suffix('\r').unwrap_or(b))
                .unwrap_or(line)
                .trim_end_matches([' ', '\t']);
            for (offset, c) in kept.char_indices() {
                push(&mut read, map(c), at + offset);
            }
            end = at + kept.len();
            if body.is_some() {
                push(&mut read, '\n', end);
                end = at + line.len();
            }
            at += line.len();
        }
        origin.push(end);
        (read, origin)
    }
}

/// The text every place found holds, when they all hold the same; `None` when nothing was
/// found, or places differ (which one was meant is not guessed).
fn the_one<'t>(found: impl IntoIterator<Item = &'t str>) -> Option<String> {
    let mut found = found.into_iter();
    let first = found.next()?;
    found.all(|other| other == first).then(|| first.to_owned())
}

/// `text` with `old_len` bytes at each of `starts` (in order, apart) replaced by `new`.
fn replaced_at(text: &str, starts: &[usize], old_len: usize, new: &str) -> String {
    let mut out = String::with_capacity(text.len() + starts.len() * new.len());
    let mut from = 0;
    for &at in starts {
        out.push_str(&text[from..at]);
        out.push_str(new);
        from = at + old_len;
    }
    out.push_str(&text[from..]);
    out
}

/// The message for an `old_string` found only where it would split a letter from its
/// combining marks: at byte `at`, inside `whole` (the text it matches there, with the
/// letter or the marks it cuts off).
fn inside_accents(text: &str, at: usize, whole: &str, old: &str, given: &str) -> String {
    use super::canonical::is_mark;
    let starts_inside = old.chars().next().is_some_and(is_mark)
        && at > 0
        && text[at..].chars().next().is_some_and(is_mark);
    // The line of the split, at most 60 characters of it next to the accent.
    let (line, shown) = match starts_inside {
        true => {
            let first = whole.split('\n').next().unwrap_or_default();
            (line_of(text, at), first.chars().take(60).collect::<String>())
        }
        false => {
            let last = whole.rsplit('\n').next().unwrap_or_default();
            let skip = last.chars().count().saturating_sub(60);
            (line_of(text, at + old.len()), last.chars().skip(skip).collect())
        }
    };
    let marks: Vec<String> =
        shown.chars().filter(|&c| is_mark(c)).map(|c| format!("U+{:04X}", u32::from(c))).collect();
    let (what, fix) = match starts_inside {
        true => (
            "starts inside an accented character, after the letter its accent belongs to",
            "start old_string with the letter before the accent",
        ),
        false => (
            "stops inside an accented character, before its accent",
            "give old_string with the whole accented text",
        ),
    };
    format!(
        "old_string was not found in `{given}` as a whole: where it occurs (line {line}, in \
         `{shown}`, written with the combining mark{} {}) it {what}, and replacing it would \
         leave the accent on the new text; {fix} as the file has it (copy it from `read`)",
        if marks.len() == 1 { "" } else { "s" },
        marks.join(" ")
    )
}

/// The 1-based line of byte offset `at`.
fn line_of(text: &str, at: usize) -> usize {
    memchr::memchr_iter(b'\n', &text.as_bytes()[..at]).count() + 1
}

/// The not-found message, pointing at the closest line.
fn not_found(text: &str, old: &str, given: &str) -> String {
    // An accent is edited with its letter: one at the start of `old_string` matches no
    // whole character (the places where it follows its letter are answered by
    // `inside_accents`).
    if let Some(mark) = old.chars().next().filter(|&c| super::canonical::is_mark(c)) {
        return format!(
            "old_string was not found in `{given}`: it begins with the combining mark U+{:04X}, \
             which belongs to the letter before it; start old_string with that letter (copy \
             the text from `read`)",
            u32::from(mark)
        );
    }
    // Found when read loosely, but at places that differ in what is read loosely (one
    // line with a trailing space, one without): which to change is not guessed.
    let places = Loose::BOTH.places(text, old);
    if places.len() > 1 {
        let lines: Vec<String> =
            places.iter().take(LISTED_MATCHES).map(|&at| line_of(text, at).to_string()).collect();
        let more = if places.len() > LISTED_MATCHES { ", ..." } else { "" };
        return format!(
            "old_string was not found in `{given}` as written, but it matches {} places \
             (at lines {}{more}) when spaces and tabs at line ends, line endings and \
             typographic quotes and dashes are ignored, and those places differ in them: \
             copy the exact text of the one to change from `read` output, with enough \
             context to pick it",
            places.len(),
            lines.join(", ")
        );
    }
    let wanted = old.split_whitespace().collect::<Vec<_>>().join(" ");
    // Whole-text match when whitespace is ignored: the likeliest mistake. The file's words
    // joined by single spaces, each word's line kept, and `wanted` looked for in that at
    // word boundaries: one pass, whatever the sizes (a window per line, squashed anew,
    // took 25 s for 300 lines in 50,000, holding the file's lock).
    let lines: Vec<&str> = text.lines().collect();
    if !wanted.is_empty() {
        let mut words = String::with_capacity(text.len());
        let mut starts: Vec<(usize, usize)> = Vec::new();
        for (number, line) in lines.iter().enumerate() {
            for word in line.split_whitespace() {
                if !words.is_empty() {
                    words.push(' ');
                }
                starts.push((words.len(), number));
                words.push_str(word);
            }
        }
        let line_at = |offset: usize| {
            let i = starts.partition_point(|&(start, _)| start <= offset);
            starts[i.saturating_sub(1)].1
        };
        let bytes = words.as_bytes();
        let at_boundary = |start: usize, end: usize| {
            (start == 0 || bytes[start - 1] == b' ') && (end == bytes.len() || bytes[end] == b' ')
        };
        if let Some((start, _)) =
            words.match_indices(&wanted).find(|(at, _)| at_boundary(*at, at + wanted.len()))
        {
            let (first, last) = (line_at(start), line_at(start + wanted.len() - 1));
            return format!(
                "old_string was not found in `{given}`, but lines {}-{} match it when \
                 whitespace is ignored: copy the exact whitespace and indentation from \
                 `read` output",
                first + 1,
                last + 1
            );
        }
    }
    let first = old.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let best = lines
        .iter()
        .enumerate()
        .take(50_000)
        .map(|(i, line)| (similarity(first, line.trim()), i))
        .filter(|(score, _)| *score >= 0.5)
        .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
    match best {
        Some((_, i)) => {
            let shown: String = lines[i].trim().chars().take(200).collect();
            format!(
                "old_string was not found in `{given}`; the closest line is {}: `{shown}`; read \
                 the file again and copy the exact text",
                i + 1
            )
        }
        None => format!(
            "old_string was not found in `{given}` and no line resembles it; read the file \
             again and copy the exact text (whitespace and indentation included)"
        ),
    }
}

/// Dice similarity of the character bigrams of two strings, in 0..=1.
pub(super) fn similarity(a: &str, b: &str) -> f64 {
    if a == b {
        return 1.0;
    }
    let grams = |s: &str| -> HashSet<(char, char)> {
        let chars: Vec<char> = s.chars().take(400).collect();
        chars.windows(2).map(|w| (w[0], w[1])).collect()
    };
    let (a, b) = (grams(a), grams(b));
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    2.0 * a.intersection(&b).count() as f64 / (a.len() + b.len()) as f64
}

/// The replacements of one edit: `old` at `starts` in `before`, which made `after`.
struct Replacement<'a> {
    before: &'a str,
    after: &'a str,
    starts: &'a [usize],
    old: &'a str,
    new: &'a str,
}

/// The lines one or more replacements on the same lines changed.
struct Changed<'a> {
    /// Where they are in the file as it now is: lines `lines.0..lines.1`, 0-based (empty
    /// where lines were only removed).
    lines: (usize, usize),
    /// The lines before and after, with the lines the same on both sides (the rest of a
    /// line an `old_string` ending in a line break joined) at `same` from either end.
    old: Vec<&'a str>,
    new: Vec<&'a str>,
    same: (usize, usize),
    /// How many replacements.
    count: usize,
}

impl Changed<'_> {
    fn removed(&self) -> &[&str] {
        &self.old[self.same.0..self.old.len() - self.same.1]
    }

    fn put(&self) -> &[&str] {
        &self.new[self.same.0..self.new.len() - self.same.1]
    }

    /// Whether a line is too long to show whole.
    fn is_long(&self) -> bool {
        self.removed().iter().chain(self.put()).any(|l| l.chars().count() > LINE_CHARS)
    }
}

impl Replacement<'_> {
    /// The changes, in order, each the replacements on one run of lines; `enough` of
    /// them at most.
    fn changes(&self, enough: usize) -> Vec<Changed<'_>> {
        let mut changes = Vec::new();
        // Line breaks of `after` before byte `counted_to`.
        let (mut k, mut counted, mut counted_to) = (0, 0, 0);
        while k < self.starts.len() && changes.len() < enough {
            let first = k;
            let mut end = line_end(self.before, self.starts[k] + self.old.len());
            while self.starts.get(k + 1).is_some_and(|&next| next <= end) {
                k += 1;
                end = line_end(self.before, self.starts[k] + self.old.len());
            }
            let start = self.before[..self.starts[first]].rfind('\n').map_or(0, |at| at + 1);
            // Before replacement `i`, `i` replacements moved the text by `new - old` each.
            let moved = |at: usize, i: usize| {
                (at as isize + i as isize * (self.new.len() as isize - self.old.len() as isize))
                    as usize
            };
            let (new_start, new_end) = (moved(start, first), moved(end, k + 1));
            counted +=
                memchr::memchr_iter(b'\n', &self.after.as_bytes()[counted_to..new_start]).count();
            counted_to = new_start;
            let old: Vec<&str> = self.before[start..end].split('\n').collect();
            let new: Vec<&str> = self.after[new_start..new_end].split('\n').collect();
            let same_start = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
            let room = old.len().min(new.len()) - same_start;
            let same_end =
                old.iter().rev().zip(new.iter().rev()).take(room).take_while(|(a, b)| a == b);
            let same_end = same_end.count();
            let first_line = counted + same_start;
            let lines = (first_line, first_line + new.len() - same_start - same_end);
            changes.push(Changed {
                lines,
                old,
                new,
                same: (same_start, same_end),
                count: k + 1 - first,
            });
            k += 1;
        }
        changes
    }

    /// At most `max` hunks showing the whole lines the replacements changed, with context
    /// from the file as it now is, and how many replacements they show. Replacements on
    /// one line are one change, and changes whose context would meet share a hunk (up to
    /// [`HUNK_LINES`] lines).
    fn hunks(&self, note: Option<&'static str>, max: usize) -> (Vec<Hunk>, usize) {
        let after: Vec<&str> = self.after.split('\n').collect();
        // A final line break ends the last line; it starts none.
        let after = &after[..after.len() - usize::from(self.after.ends_with('\n'))];
        let owned = |lines: &[&str]| lines.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>();
        // Lines `from..to` of the file as it now is, as many of them as there are.
        let between = |from: usize, to: usize| {
            owned(after.get(from..to.min(after.len())).unwrap_or_default())
        };
        let (mut hunks, mut shown) = (Vec::new(), 0);
        // The hunk being made: its first line, its blocks, the line after its last change.
        let mut open: Option<(usize, Vec<Block>, usize)> = None;
        let close = |open: Option<(usize, Vec<Block>, usize)>, hunks: &mut Vec<Hunk>| {
            if let Some((line, mut blocks, end)) = open {
                blocks.push(Block::Context(between(end, end + CONTEXT_LINES)));
                hunks.push(Hunk::lines(line, blocks, note));
            }
        };
        for change in self.changes(max * HUNK_LINES) {
            let joins = open.as_ref().is_some_and(|(_, blocks, end)| {
                change.lines.0.saturating_sub(*end) <= 2 * CONTEXT_LINES
                    && blocks.iter().map(Block::len).sum::<usize>() < HUNK_LINES
            });
            if !joins || change.is_long() {
                close(open.take(), &mut hunks);
                if hunks.len() == max {
                    break;
                }
            }
            shown += change.count;
            if change.is_long() {
                let (old, new) = (self.old.to_owned(), self.new.to_owned());
                let mut hunk = Hunk::fragments(change.lines.0 + 1, old, new, note);
                hunk.notes.push("a long line: the replaced text only");
                hunks.push(hunk);
                continue;
            }
            let (_, blocks, end) = open.get_or_insert_with(|| {
                let from = change.lines.0.saturating_sub(CONTEXT_LINES);
                let before = between(from, change.lines.0);
                (change.lines.0 + 1, vec![Block::Context(before)], change.lines.0)
            });
            if *end < change.lines.0 {
                blocks.push(Block::Context(between(*end, change.lines.0)));
            }
            // Changes on lines next to each other are one run of lines removed and put.
            match blocks.last_mut() {
                Some(Block::Change(removed, put)) => {
                    removed.extend(owned(change.removed()));
                    put.extend(owned(change.put()));
                }
                _ => blocks.push(Block::Change(owned(change.removed()), owned(change.put()))),
            }
            *end = change.lines.1;
        }
        if hunks.len() < max {
            close(open, &mut hunks);
        }
        (hunks, shown)
    }
}

/// Lines shown in one hunk before changes near each other start another.
const HUNK_LINES: usize = 24;

/// Where the line holding byte `at` of `text` ends (its line break, or the text's end).
fn line_end(text: &str, at: usize) -> usize {
    memchr::memchr(b'\n', &text.as_bytes()[at..]).map_or(text.len(), |i| at + i)
}

/// One change, for the diff.
struct Hunk {
    /// The first line changed (the line inserted), 1-based.
    line: usize,
    /// The replaced and the inserted text, shown when `lines` is empty.
    old: String,
    new: String,
    notes: Vec<&'static str>,
    /// For an insertion: the lines before and after it, shown as context to check the
    /// place (`None` at the top or the end of the file).
    around: Option<(Option<String>, Option<String>)>,
    /// For a replacement: the whole lines it changed, with context.
    lines: Vec<Block>,
}

/// Part of a replacement's hunk.
enum Block {
    /// Lines of the file as it is.
    Context(Vec<String>),
    /// Lines removed and the lines put in their place.
    Change(Vec<String>, Vec<String>),
}

impl Block {
    /// Lines it holds.
    fn len(&self) -> usize {
        match self {
            Block::Context(lines) => lines.len(),
            Block::Change(old, new) => old.len() + new.len(),
        }
    }
}

impl Hunk {
    /// A hunk showing `old` replaced by `new` as they are.
    fn fragments(line: usize, old: String, new: String, note: Option<&'static str>) -> Hunk {
        let notes = note.into_iter().collect();
        Hunk { line, old, new, notes, around: None, lines: Vec::new() }
    }

    /// A hunk of whole lines.
    fn lines(line: usize, lines: Vec<Block>, note: Option<&'static str>) -> Hunk {
        let notes = note.into_iter().collect();
        Hunk { line, old: String::new(), new: String::new(), notes, around: None, lines }
    }

    fn render(&self, out: &mut String) {
        if let Some((before, after)) = &self.around {
            let _ =
                write!(out, "\n@@ line {} (inserted after line {}) @@", self.line, self.line - 1);
            render_context(out, before.iter());
            // Every line inserted, an empty one too: `new` has no line break at its end.
            render_lines(out, '+', self.new.split('\n'));
            render_context(out, after.iter());
            return;
        }
        let notes = match self.notes.is_empty() {
            true => String::new(),
            false => format!(" ({})", self.notes.join("; ")),
        };
        let _ = write!(out, "\n@@ line {}{notes} @@", self.line);
        if self.lines.is_empty() {
            render_lines(out, '-', self.old.lines());
            render_lines(out, '+', self.new.lines());
        }
        for block in &self.lines {
            match block {
                Block::Context(lines) => render_context(out, lines.iter()),
                Block::Change(old, new) => {
                    render_lines(out, '-', old.iter().map(String::as_str));
                    render_lines(out, '+', new.iter().map(String::as_str));
                }
            }
        }
    }
}

/// Context lines, each after a space. A line of the file may be a minified one of
/// megabytes: its start is enough to check the place.
fn render_context<'a>(out: &mut String, lines: impl Iterator<Item = &'a String>) {
    for line in lines {
        let line = line.trim_end_matches('\r');
        let shown: String = line.chars().take(CONTEXT_CHARS).collect();
        let more = line.chars().count().saturating_sub(CONTEXT_CHARS);
        let _ = write!(out, "\n {shown}");
        if more > 0 {
            let _ = write!(out, "[... {more} more characters]");
        }
    }
}

/// `lines`, each after `sign`, at most [`DIFF_LINES`] of them, each of at most
/// [`LINE_CHARS`] characters.
fn render_lines<'a>(out: &mut String, sign: char, lines: impl Iterator<Item = &'a str>) {
    let lines: Vec<&str> = lines.collect();
    for line in lines.iter().take(DIFF_LINES) {
        let line = line.trim_end_matches('\r');
        let shown: String = line.chars().take(LINE_CHARS).collect();
        let _ = write!(out, "\n{sign}{shown}");
        let more = line.chars().count().saturating_sub(LINE_CHARS);
        if more > 0 {
            let _ = write!(out, "[... {more} more characters]");
        }
    }
    if lines.len() > DIFF_LINES {
        let _ = write!(out, "\n{sign}[... {} more lines]", lines.len() - DIFF_LINES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn similarity_orders_sensibly() {
        assert!(similarity("let x = 1;", "let x = 2;") > similarity("let x = 1;", "fn main() {"));
        assert_eq!(similarity("a", "a"), 1.0);
    }

    proptest::proptest! {
        /// Whatever the text and the strings, the hunks of a replace_all are made without
        /// a panic, and every line they show as the file now is is one of its lines.
        #[test]
        fn replacement_hunks_show_lines_of_the_result(
            text in "[ab\n]{0,40}",
            old in "[ab\n]{1,4}",
            new in "[abc\n]{0,4}",
        ) {
            let starts: Vec<usize> = text.match_indices(old.as_str()).map(|(at, _)| at).collect();
            let after = text.replace(old.as_str(), &new);
            let change =
                Replacement { before: &text, after: &after, starts: &starts, old: &old, new: &new };
            let (hunks, shown) = change.hunks(None, DIFF_HUNKS);
            proptest::prop_assert!(shown <= starts.len());
            let lines: Vec<&str> = after.split('\n').collect();
            for hunk in &hunks {
                for block in &hunk.lines {
                    let (Block::Context(now) | Block::Change(_, now)) = block;
                    for line in now {
                        proptest::prop_assert!(lines.contains(&line.as_str()), "{line:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn lines_are_one_based() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 4), 3);
    }
}
