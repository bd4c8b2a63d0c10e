//! `apply_patch`: Codex's patch format (`*** Begin Patch` … `*** End Patch`), several
//! files added, deleted, changed and moved in one call, all or nothing.
//!
//! The patch is parsed whole, every file it names is locked (in one order, so two patches
//! never wait on each other), loaded and changed in memory, and only then written. A write
//! that fails part way is undone file by file, so the workspace is left as it was.

use super::canonical::{self, Form};
use super::edit::{load, plain, similarity, styled_like};
use super::text::{Encoding, LineEnding};
use crate::config::FsLimits;
use crate::error::FsError;
use crate::workspace::{self, FileLock, Resolved, Workspace};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use toolmux_core::ToolOutput;

/// Arguments of `apply_patch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyPatchArgs {
    /// The whole patch, from `*** Begin Patch` to `*** End Patch`.
    #[serde(alias = "patch")]
    pub input: String,
    /// Check the patch and say what it would change, without writing anything.
    #[serde(default)]
    pub dry_run: bool,
}

pub(crate) const DESCRIPTION: &str = "Add, delete, change and move files with one patch, all \
or nothing. The patch is text in this format:\n\
*** Begin Patch\n\
*** Add File: path/new.txt\n\
+every line of the new file, each starting with +\n\
*** Delete File: path/old.txt\n\
*** Update File: path/file.py\n\
*** Move to: path/renamed.py   (optional)\n\
@@ def handler():   (optional: a line above the change, to find the right place)\n\
 a context line, starting with a space\n\
-a line to remove\n\
+a line to add\n\
*** End of File   (optional: the hunk ends at the end of the file)\n\
*** End Patch\n\
Paths are relative to the workspace root. Give about 3 lines of context above and below each \
change; when that is not unique, add `@@` lines naming the enclosing class or function (several \
`@@` lines narrow in turn). Hunks of one file are found in order, each after the last. Context is \
matched exactly, then with accents composed or decomposed (Unicode NFC, NFD) as the file has \
them, then ignoring trailing whitespace, then surrounding whitespace, then typographic quotes and \
dashes; the result says when a looser match was used. A file keeps its encoding and \
line endings. If any hunk does not apply, nothing is written and the error says which. A file \
read in this run that has changed since is refused until it is read again. With `dry_run`, \
nothing is written.";

/// A patch line, 1-based, for messages.
type LineNo = usize;

/// One file operation of a patch.
#[derive(Debug, PartialEq, Eq)]
enum Op {
    Add { path: String, lines: Vec<String> },
    Delete { path: String },
    Update { path: String, move_to: Option<String>, hunks: Vec<Hunk> },
}

/// One `@@` hunk of an update.
#[derive(Debug, PartialEq, Eq)]
struct Hunk {
    /// Where it starts in the patch.
    line: LineNo,
    /// The `@@` lines before it: each is found in turn, and the hunk after the last.
    anchors: Vec<String>,
    /// Its lines, in order.
    parts: Vec<Part>,
    /// `*** End of File`: the hunk ends at the end of the file.
    end_of_file: bool,
}

/// One line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// ` text`: in the file before and after.
    Context(String),
    /// `-text`: taken out.
    Removed(String),
    /// `+text`: put in.
    Added(String),
}

impl Part {
    /// The line as the file has it before the hunk, if it has it.
    fn old(&self) -> Option<&String> {
        match self {
            Part::Context(text) | Part::Removed(text) => Some(text),
            Part::Added(_) => None,
        }
    }
}

const BEGIN: &str = "*** Begin Patch";
const END: &str = "*** End Patch";
const ADD: &str = "*** Add File: ";
const DELETE: &str = "*** Delete File: ";
const UPDATE: &str = "*** Update File: ";
const MOVE: &str = "*** Move to: ";
const EOF_MARK: &str = "*** End of File";

/// A parse error: the patch line and what is wrong there.
#[derive(Debug, PartialEq, Eq)]
struct ParseError {
    line: LineNo,
    message: String,
}

fn parse(input: &str) -> Result<Vec<Op>, ParseError> {
    let lines = unwrap_heredoc(input);
    let first = lines.first().map(|l| l.trim());
    if first != Some(BEGIN) {
        return Err(ParseError {
            line: 1,
            message: format!(
                "the patch must start with `{BEGIN}`, found `{}`",
                first.unwrap_or_default()
            ),
        });
    }
    let Some(last) = lines.iter().rposition(|l| l.trim() == END) else {
        return Err(ParseError {
            line: lines.len(),
            message: format!("the patch must end with `{END}`"),
        });
    };
    let body = &lines[1..last];
    let mut ops = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let line_no = at + 2;
        let line = body[at].trim_end();
        if line.trim().is_empty() {
            at += 1;
            continue;
        }
        if let Some(path) = line.strip_prefix(ADD) {
            let path = file_path(path, line_no)?;
            at += 1;
            let mut content = Vec::new();
            while at < body.len() && !is_header(body[at]) {
                match body[at].strip_prefix('+') {
                    Some(text) => content.push(text.to_owned()),
                    // A blank line between file sections.
                    None if body[at].trim().is_empty() && next_is_header(body, at) => {}
                    None => {
                        return Err(ParseError {
                            line: at + 2,
                            message: format!(
                                "every line of an added file starts with `+`, found `{}`",
                                body[at]
                            ),
                        });
                    }
                }
                at += 1;
            }
            ops.push(Op::Add { path, lines: content });
        } else if let Some(path) = line.strip_prefix(DELETE) {
            ops.push(Op::Delete { path: file_path(path, line_no)? });
            at += 1;
        } else if let Some(path) = line.strip_prefix(UPDATE) {
            let path = file_path(path, line_no)?;
            at += 1;
            let mut move_to = None;
            if let Some(dest) = body.get(at).and_then(|l| l.trim_end().strip_prefix(MOVE)) {
                move_to = Some(file_path(dest, at + 2)?);
                at += 1;
            }
            let hunks = parse_hunks(body, &mut at)?;
            if hunks.is_empty() && move_to.is_none() {
                return Err(ParseError {
                    line: line_no,
                    message: format!("`{UPDATE}{path}` has no hunk: give the lines to change"),
                });
            }
            ops.push(Op::Update { path, move_to, hunks });
        } else {
            return Err(ParseError {
                line: line_no,
                message: format!(
                    "expected `{ADD}PATH`, `{DELETE}PATH` or `{UPDATE}PATH`, found `{line}`"
                ),
            });
        }
    }
    if ops.is_empty() {
        return Err(ParseError { line: 1, message: "the patch changes no file".into() });
    }
    Ok(ops)
}

/// Every path a patch names (moves' destinations included), for permission rules; why
/// not when it does not parse.
pub(crate) fn paths(input: &str) -> Result<Vec<String>, String> {
    let ops = parse(input)
        .map_err(|error| format!("line {} of the patch: {}", error.line, error.message))?;
    let mut paths = Vec::new();
    for op in ops {
        match op {
            Op::Add { path, .. } | Op::Delete { path } => paths.push(path),
            Op::Update { path, move_to, .. } => paths.extend(std::iter::once(path).chain(move_to)),
        }
    }
    Ok(paths)
}

/// The hunks of an update, from `body[*at]` to the next file header.
fn parse_hunks(body: &[&str], at: &mut usize) -> Result<Vec<Hunk>, ParseError> {
    let mut hunks: Vec<Hunk> = Vec::new();
    let mut current: Option<Hunk> = None;
    while *at < body.len() && !is_file_header(body[*at]) {
        let raw = body[*at];
        let line_no = *at + 2;
        *at += 1;
        if let Some(anchor) = raw.strip_prefix("@@") {
            // An anchor after lines starts a new hunk; anchors in a row narrow one.
            if current.as_ref().is_some_and(|h| !h.parts.is_empty()) {
                hunks.extend(current.take());
            }
            let hunk = current.get_or_insert_with(|| Hunk::starting(line_no));
            let anchor = anchor.trim();
            if !anchor.is_empty() {
                hunk.anchors.push(anchor.to_owned());
            }
            continue;
        }
        if raw.trim_end() == EOF_MARK {
            let Some(mut hunk) = current.take() else {
                return Err(ParseError {
                    line: line_no,
                    message: format!("`{EOF_MARK}` ends a hunk, but no hunk came before it"),
                });
            };
            hunk.end_of_file = true;
            hunks.push(hunk);
            continue;
        }
        let hunk = current.get_or_insert_with(|| Hunk::starting(line_no));
        match raw.chars().next() {
            Some(' ') => hunk.parts.push(Part::Context(raw[1..].to_owned())),
            Some('-') => hunk.parts.push(Part::Removed(raw[1..].to_owned())),
            Some('+') => hunk.parts.push(Part::Added(raw[1..].to_owned())),
            // Blank lines before the next header separate sections; inside a hunk, a
            // blank line is an empty context line whose space was lost.
            None | Some('\r') if next_is_header(body, *at - 1) => {}
            None | Some('\r') => hunk.parts.push(Part::Context(String::new())),
            Some(_) => {
                return Err(ParseError {
                    line: line_no,
                    message: format!(
                        "a hunk line starts with ` ` (context), `-` (removed) or `+` (added), \
                         found `{raw}`"
                    ),
                });
            }
        }
    }
    hunks.extend(current);
    for hunk in &hunks {
        if hunk.parts.is_empty() {
            return Err(ParseError {
                line: hunk.line,
                message: "this hunk has no lines: give context, `-` and `+` lines after `@@`"
                    .into(),
            });
        }
    }
    Ok(hunks)
}

impl Hunk {
    fn starting(line: LineNo) -> Hunk {
        Hunk { line, anchors: Vec::new(), parts: Vec::new(), end_of_file: false }
    }

    /// Whether a line of the hunk holds a CR.
    fn has_cr(&self) -> bool {
        self.parts.iter().any(|part| match part {
            Part::Context(text) | Part::Removed(text) | Part::Added(text) => text.contains('\r'),
        })
    }

    /// The hunk for a file of bare-CR lines: a line holding CRs (copied with the file's own
    /// line breaks) is cut into lines at them, each of its kind, as `edit` takes the CRs of
    /// its strings; a CR that ends a line is its break.
    fn split_at_cr(&self) -> Hunk {
        let parts = self
            .parts
            .iter()
            .flat_map(|part| {
                let (text, kind): (&str, fn(String) -> Part) = match part {
                    Part::Context(text) => (text, Part::Context),
                    Part::Removed(text) => (text, Part::Removed),
                    Part::Added(text) => (text, Part::Added),
                };
                let text = text.strip_suffix('\r').unwrap_or(text);
                text.split('\r').map(move |piece| kind(piece.to_owned()))
            })
            .collect();
        Hunk {
            line: self.line,
            anchors: self.anchors.clone(),
            parts,
            end_of_file: self.end_of_file,
        }
    }
}

fn is_file_header(line: &str) -> bool {
    let line = line.trim_end();
    line.starts_with(ADD) || line.starts_with(DELETE) || line.starts_with(UPDATE)
}

fn is_header(line: &str) -> bool {
    is_file_header(line) || line.trim_end() == EOF_MARK
}

/// Whether only blank lines lie between `body[at]` and the next header (or the end).
fn next_is_header(body: &[&str], at: usize) -> bool {
    body[at..]
        .iter()
        .find(|l| !l.trim().is_empty())
        .is_none_or(|l| is_file_header(l) || l.starts_with("@@") || l.trim_end() == EOF_MARK)
}

fn file_path(given: &str, line: LineNo) -> Result<String, ParseError> {
    let path = given.trim();
    if path.is_empty() {
        return Err(ParseError { line, message: "the file path is missing".into() });
    }
    Ok(path.to_owned())
}

/// The patch's lines, without a shell here-document around them (`<<'EOF'` … `EOF`, as
/// models trained on `apply_patch <<'EOF'` sometimes send) and without blank lines around.
fn unwrap_heredoc(input: &str) -> Vec<&str> {
    // A patch without any LF whose lines end in CR (a CR file's text copied whole) is read
    // as lines, by the rule that tells a file of CR lines.
    let mut lines: Vec<&str> = super::text::lines(input.trim());
    if lines.len() >= 2 {
        let first = lines[0].trim();
        let first = first.strip_prefix("apply_patch").map_or(first, str::trim_start);
        if let Some(marker) = first.strip_prefix("<<") {
            let marker = marker.trim().trim_matches(['\'', '"']);
            if !marker.is_empty() && lines[lines.len() - 1].trim() == marker {
                lines = lines[1..lines.len() - 1].to_vec();
            }
        }
    }
    lines
}

/// How loosely a hunk's lines had to be compared to be found. Lines are compared whole, so
/// no reading of them finds a line that stops short of an accent (`cafe` is not the line
/// `cafe` U+0301), as `edit`'s matches never split a letter from its marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fuzz {
    Exact,
    /// The same text under Unicode canonical equivalence: accents composed (NFC) on one
    /// side and decomposed (NFD) on the other, as `edit` matches them.
    Canonical,
    TrailingSpace,
    Whitespace,
    Typographic,
}

impl Fuzz {
    const ALL: [Fuzz; 5] =
        [Fuzz::Exact, Fuzz::Canonical, Fuzz::TrailingSpace, Fuzz::Whitespace, Fuzz::Typographic];

    fn same(self, file: &str, patch: &str) -> bool {
        match self {
            Fuzz::Exact => file == patch,
            // Text without accents or other marks reads the same composed.
            Fuzz::Canonical => {
                file == patch
                    || !(file.is_ascii() || patch.is_ascii()) && canonical::same(file, patch)
            }
            Fuzz::TrailingSpace => file.trim_end() == patch.trim_end(),
            Fuzz::Whitespace => file.trim() == patch.trim(),
            Fuzz::Typographic => file.trim().chars().map(plain).eq(patch.trim().chars().map(plain)),
        }
    }

    /// What the summary says of a hunk found so, in a file all of whose text is in `form`
    /// (`edit`'s words).
    fn note(self, form: Option<Form>) -> Option<&'static str> {
        match self {
            Fuzz::Exact => None,
            Fuzz::Canonical => Some(match form {
                Some(Form::Decomposed) => {
                    "the file's decomposed accents (Unicode NFD) and wrote them so"
                }
                Some(Form::Composed) => {
                    "the file's composed accents (Unicode NFC) and wrote them so"
                }
                None => "the file's accents written in another Unicode normalization form",
            }),
            Fuzz::TrailingSpace => Some("ignoring trailing whitespace"),
            Fuzz::Whitespace => Some("ignoring leading and trailing whitespace"),
            Fuzz::Typographic => {
                Some("reading the file's typographic quotes, dashes and spaces as plain ones")
            }
        }
    }
}

/// The first index at or after `from` where `pattern` occurs in `lines`, at the least
/// fuzz that finds it. `at_end` looks at the end of the file first. Under canonical
/// equivalence the places found after `from` must all hold the same bytes, as for `edit`
/// (which of two spellings to change would be a guess).
fn seek(lines: &[Line], pattern: &[String], from: usize, at_end: bool) -> Option<(usize, Fuzz)> {
    if pattern.len() > lines.len() {
        return None;
    }
    let last_start = lines.len() - pattern.len();
    let fits = |start: usize, fuzz: Fuzz| {
        lines[start..start + pattern.len()]
            .iter()
            .zip(pattern)
            .all(|(line, wanted)| fuzz.same(&line.text, wanted))
    };
    if at_end && last_start >= from {
        for fuzz in Fuzz::ALL {
            if fits(last_start, fuzz) {
                return Some((last_start, fuzz));
            }
        }
    }
    for fuzz in Fuzz::ALL {
        let mut places = (from..=last_start).filter(|&start| fits(start, fuzz));
        let Some(start) = places.next() else { continue };
        let text = |start: usize| lines[start..start + pattern.len()].iter().map(|l| &l.text);
        if fuzz == Fuzz::Canonical && !places.all(|other| text(other).eq(text(start))) {
            continue;
        }
        return Some((start, fuzz));
    }
    None
}

/// Up to `most` more places (lines from 1) at or after `from` where `pattern` occurs
/// exactly (under canonical equivalence, when `fuzz` says it was found so); none for an
/// empty pattern.
fn others(lines: &[Line], pattern: &[String], from: usize, most: usize, fuzz: Fuzz) -> Vec<usize> {
    if pattern.is_empty() || pattern.len() > lines.len() {
        return Vec::new();
    }
    let fuzz = if fuzz == Fuzz::Canonical { Fuzz::Canonical } else { Fuzz::Exact };
    (from..=lines.len() - pattern.len())
        .filter(|&start| {
            let place = &lines[start..start + pattern.len()];
            place.iter().zip(pattern).all(|(l, p)| fuzz.same(&l.text, p))
        })
        .take(most)
        .map(|start| start + 1)
        .collect()
}

/// One line of a file: its text and the line break after it.
#[derive(Debug, Clone)]
struct Line {
    text: String,
    crlf: bool,
}

/// A text file as lines, and how to write it back.
#[derive(Debug, Clone)]
struct TextFile {
    lines: Vec<Line>,
    /// Whether the last line ends with a line break.
    trailing_break: bool,
    /// What new lines end with: the break most lines use.
    crlf: bool,
    /// Whether every line ends in a bare CR (classic Mac OS): parsed as LF lines, written
    /// back with CR.
    cr: bool,
    encoding: Encoding,
}

impl TextFile {
    fn parse(text: &str, encoding: Encoding) -> TextFile {
        let ending = LineEnding::dominant(text);
        let crlf = ending == Some(LineEnding::CrLf);
        let cr = ending == Some(LineEnding::Cr);
        let as_lf;
        let text = match cr {
            true => {
                as_lf = text.replace('\r', "\n");
                as_lf.as_str()
            }
            false => text,
        };
        let trailing_break = text.is_empty() || text.ends_with('\n');
        let body = text.strip_suffix('\n').unwrap_or(text);
        let mut lines: Vec<Line> = if text.is_empty() {
            Vec::new()
        } else {
            body.split('\n')
                .map(|line| match line.strip_suffix('\r') {
                    Some(line) => Line { text: line.to_owned(), crlf: true },
                    None => Line { text: line.to_owned(), crlf: false },
                })
                .collect()
        };
        // A last line without a break gets the file's, should lines come after it.
        if !trailing_break && let Some(last) = lines.last_mut() {
            last.crlf = crlf;
        }
        TextFile { lines, trailing_break, crlf, cr, encoding }
    }

    fn new_file(lines: &[String]) -> TextFile {
        let lines = lines.iter().map(|text| Line { text: text.clone(), crlf: false }).collect();
        TextFile { lines, trailing_break: true, crlf: false, cr: false, encoding: Encoding::Utf8 }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for (index, line) in self.lines.iter().enumerate() {
            out.push_str(&line.text);
            if index + 1 < self.lines.len() || self.trailing_break {
                out.push_str(match (self.cr, line.crlf) {
                    (true, _) => "\r",
                    (false, true) => "\r\n",
                    (false, false) => "\n",
                });
            }
        }
        out
    }

    fn bytes(&self) -> Vec<u8> {
        self.encoding.encode(&self.render())
    }

    /// Applies `hunks` in order; returns the changes made (for the summary).
    fn apply(&mut self, hunks: &[Hunk]) -> Result<Vec<Applied>, String> {
        let split: Vec<Hunk>;
        let hunks = if self.cr && hunks.iter().any(Hunk::has_cr) {
            split = hunks.iter().map(Hunk::split_at_cr).collect();
            &split
        } else {
            hunks
        };
        let mut cursor = 0;
        // The form all of the file is in, for hunks found under canonical equivalence.
        let form = Form::of(&self.render());
        let mut edits: Vec<(usize, &[Part], Fuzz)> = Vec::new();
        let mut applied = Vec::new();
        for (number, hunk) in hunks.iter().enumerate() {
            let label = format!("hunk {} (patch line {})", number + 1, hunk.line);
            let mut fuzz = Fuzz::Exact;
            for anchor in &hunk.anchors {
                let found = seek(&self.lines, std::slice::from_ref(anchor), cursor, false);
                let Some((index, how)) = found else {
                    return Err(format!(
                        "{label}: the `@@ {anchor}` line was not found{}{}",
                        after(cursor),
                        self.closest(std::slice::from_ref(anchor), cursor)
                    ));
                };
                fuzz = fuzz.max(how);
                cursor = index + 1;
            }
            let mut parts: &[Part] = &hunk.parts;
            let old: Vec<String> = parts.iter().filter_map(Part::old).cloned().collect();
            let start = if old.is_empty() {
                // Only added lines: after the last anchor, or at the end of the file.
                if hunk.anchors.is_empty() { self.lines.len() } else { cursor }
            } else {
                let mut found = seek(&self.lines, &old, cursor, hunk.end_of_file);
                // A last blank context line stands for the file's final line break.
                if found.is_none() && parts.last() == Some(&Part::Context(String::new())) {
                    parts = &parts[..parts.len() - 1];
                    found = seek(&self.lines, &old[..old.len() - 1], cursor, hunk.end_of_file);
                }
                let Some((index, how)) = found else {
                    let shown: Vec<&str> = old.iter().take(6).map(String::as_str).collect();
                    let more = if old.len() > 6 { "\n..." } else { "" };
                    return Err(format!(
                        "{label}: these lines were not found{}:\n{}{more}{}",
                        after(cursor),
                        shown.join("\n"),
                        self.closest(&old, cursor)
                    ));
                };
                fuzz = fuzz.max(how);
                index
            };
            // Without an `@@` line, context that occurs again further on is applied at its
            // first place: say where else it fits, so that a wrong place is seen.
            let also = if hunk.anchors.is_empty() && !hunk.end_of_file {
                let old: Vec<String> = parts.iter().filter_map(Part::old).cloned().collect();
                others(&self.lines, &old, start + 1, 3, fuzz)
            } else {
                Vec::new()
            };
            let count = |f: fn(&Part) -> bool| parts.iter().filter(|p| f(p)).count();
            applied.push(Applied {
                line: start + 1,
                added: count(|p| matches!(p, Part::Added(_))),
                removed: count(|p| matches!(p, Part::Removed(_))),
                note: fuzz.note(form),
                also,
            });
            cursor = start + parts.iter().filter(|p| p.old().is_some()).count();
            edits.push((start, parts, fuzz));
        }
        for (start, parts, fuzz) in edits.into_iter().rev() {
            let old_len = parts.iter().filter(|p| p.old().is_some()).count();
            let replaced = self.lines.drain(start..start + old_len).collect::<Vec<_>>();
            // Found through typographic characters: what the added lines keep of the lines
            // they replace is written as the file has it, as `edit` does; what they change
            // is written as given (code beside prose keeps its plain quotes).
            let styled: Option<Vec<String>> = (fuzz == Fuzz::Typographic)
                .then(|| {
                    let old_parts = parts.iter().filter(|p| p.old().is_some());
                    let removed: Vec<(&str, &str)> = old_parts
                        .zip(&replaced)
                        .filter_map(|(p, line)| match p {
                            Part::Removed(given) => Some((line.text.as_str(), given.as_str())),
                            _ => None,
                        })
                        .collect();
                    let found = removed.iter().map(|(f, _)| *f).collect::<Vec<_>>().join("\n");
                    let given = removed.iter().map(|(_, g)| *g).collect::<Vec<_>>().join("\n");
                    let added: Vec<&str> = parts
                        .iter()
                        .filter_map(|p| match p {
                            Part::Added(text) => Some(text.as_str()),
                            _ => None,
                        })
                        .collect();
                    let styled = styled_like(&found, &given, &added.join("\n"))?;
                    let lines: Vec<String> = styled.split('\n').map(str::to_owned).collect();
                    (lines.len() == added.len()).then_some(lines)
                })
                .flatten();
            let mut styled = styled.map(Vec::into_iter);
            let mut replaced = replaced.into_iter();
            let mut lines = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    // A context line keeps the file's text and line break (a looser match
                    // may have found it spelled otherwise).
                    Part::Context(_) => lines.extend(replaced.next()),
                    Part::Removed(_) => {
                        replaced.next();
                    }
                    Part::Added(text) => {
                        let text = match (styled.as_mut().and_then(Iterator::next), form) {
                            (Some(styled), _) => styled,
                            // Found through accents in another form: the added lines are
                            // written in the file's, when all of it is in one.
                            (None, Some(form)) if fuzz == Fuzz::Canonical => form.apply(text),
                            (None, _) => text.clone(),
                        };
                        lines.push(Line { text, crlf: self.crlf });
                    }
                }
            }
            self.lines.splice(start..start, lines);
        }
        Ok(applied)
    }

    /// ", the closest is line N: `...`" for the first line of `pattern`, or nothing.
    fn closest(&self, pattern: &[String], from: usize) -> String {
        let Some(first) = pattern.iter().map(|l| l.trim()).find(|l| !l.is_empty()) else {
            return String::new();
        };
        // A line that differs from the patch's only in its accents (the patch's `cafe`
        // where the file has `café`, its accent a combining mark or not): say so.
        let bare = canonical::unaccented(first);
        let accented = self.lines.iter().enumerate().skip(from).take(50_000).find(|(_, line)| {
            let text = line.text.trim();
            !text.is_ascii() && text != first && canonical::unaccented(text) == bare
        });
        if let Some((index, line)) = accented {
            let shown: String = line.text.trim().chars().take(200).collect();
            return format!(
                "\n(line {} is `{shown}`, which differs from the patch's `{}` only in its \
                 accents: a line matches with its accents as the file has them, composed or \
                 not; copy it from the file)",
                index + 1,
                first.chars().take(200).collect::<String>()
            );
        }
        let best = self
            .lines
            .iter()
            .enumerate()
            .skip(from)
            .take(50_000)
            .map(|(index, line)| (similarity(first, line.text.trim()), index))
            .filter(|(score, _)| *score >= 0.5)
            .max_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        match best {
            Some((_, index)) => {
                let shown: String = self.lines[index].text.trim().chars().take(200).collect();
                format!(
                    "\n(the closest line is {}: `{shown}`; read the file again and copy its \
                     lines exactly)",
                    index + 1
                )
            }
            None => String::new(),
        }
    }
}

/// " after line N" when the search started past the top of the file.
fn after(cursor: usize) -> String {
    if cursor > 0 { format!(" after line {cursor}") } else { String::new() }
}

/// What one hunk did, for the summary.
#[derive(Debug)]
struct Applied {
    line: usize,
    added: usize,
    removed: usize,
    note: Option<&'static str>,
    /// Other lines (from 1) the hunk's lines also match at, after the place taken: the
    /// first after the previous hunk was taken, which may not be the one meant.
    also: Vec<usize>,
}

/// A file the patch touches: what it was, and what it is to become.
struct Entry {
    resolved: Resolved,
    /// Its bytes on disk before the patch; `None` when it did not exist, or was not held.
    original: Option<Vec<u8>>,
    /// Whether it existed but its bytes were not held: a file over the edit limit that
    /// the patch deletes, whose deletion cannot be undone.
    unkept: bool,
    /// Its content after the operations so far; `None` when it is (to be) gone.
    current: Option<TextFile>,
    /// The file it was moved from (`*** Move to:`), whose permissions it keeps.
    moved_from: Option<Resolved>,
    /// Its permission bits before the patch, for an undo that brings it back.
    mode: Option<u32>,
}

/// One line of the summary.
struct Change {
    mark: char,
    what: String,
    hunks: Vec<Applied>,
}

/// Runs `apply_patch`.
pub(crate) fn apply_patch(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    args: ApplyPatchArgs,
) -> Result<ToolOutput, FsError> {
    let invalid = |message: String| FsError::InvalidArguments { tool: "apply_patch", message };
    let ops = parse(&args.input).map_err(|error| {
        invalid(format!("line {} of the patch: {}; nothing was changed", error.line, error.message))
    })?;

    // Every path the patch names, resolved and checked, then locked in one order.
    let mut targets: BTreeMap<PathBuf, Resolved> = BTreeMap::new();
    let mut target_of = |given: &str| -> Result<PathBuf, FsError> {
        let resolved = ws.resolve(given)?;
        let target = ws.check_write(&resolved)?;
        targets.entry(target.clone()).or_insert(resolved);
        Ok(target)
    };
    let mut keyed = Vec::with_capacity(ops.len());
    for op in &ops {
        let (path, dest) = match op {
            Op::Add { path, .. } | Op::Delete { path } => (target_of(path)?, None),
            Op::Update { path, move_to, .. } => {
                let dest = move_to.as_deref().map(&mut target_of).transpose()?;
                (target_of(path)?, dest)
            }
        };
        keyed.push((path, dest));
    }
    let mut locks: Vec<FileLock<'_>> = Vec::with_capacity(targets.len());
    for (target, resolved) in &targets {
        locks.push(ws.lock_file(resolved, target)?);
    }

    let mut files: BTreeMap<PathBuf, Entry> = BTreeMap::new();
    let mut changes = Vec::new();
    for (op, (target, dest)) in ops.iter().zip(keyed) {
        match op {
            Op::Add { path, lines } => {
                if files.get(&target).is_some_and(|e| e.original.is_none() && e.current.is_some()) {
                    return Err(FsError::Edit {
                        path: path.clone(),
                        message: format!(
                            "`{ADD}{path}`: this patch already creates `{path}` above: give \
                             each new file once; nothing was changed"
                        ),
                    });
                }
                let resolved = &targets[&target];
                // The caller's mistake (a name taken by a link), not the tool failing.
                if !files.contains_key(&target) && broken_link(ws, resolved) {
                    return Err(FsError::InvalidArguments {
                        tool: "apply_patch",
                        message: format!(
                            "`{ADD}{path}`: `{path}` is a broken symbolic link (what it points \
                             to does not exist): delete the link first, or add the file under \
                             another name; nothing was changed"
                        ),
                    });
                }
                if present(ws, &files, &targets, &target)? {
                    return Err(FsError::Edit {
                        path: path.clone(),
                        message: format!(
                            "`{ADD}{path}`: the file already exists: change it with \
                             `{UPDATE}{path}`, or delete it first; nothing was changed"
                        ),
                    });
                }
                let file = TextFile::new_file(lines);
                too_large(limits, path, &file)?;
                entry(ws, limits, run, &mut files, &targets, &target, Load::Text)?.current =
                    Some(file);
                changes.push(Change {
                    mark: 'A',
                    what: format!("{path} (+{})", lines.len()),
                    hunks: Vec::new(),
                });
            }
            Op::Delete { path } => {
                let resolved = &targets[&target];
                if !files.contains_key(&target)
                    && ws
                        .dir()
                        .symlink_metadata(&resolved.relative)
                        .is_ok_and(|meta| meta.is_symlink())
                {
                    return Err(FsError::Edit {
                        path: path.clone(),
                        message: format!(
                            "`{DELETE}{path}`: it is a symbolic link; the patch deletes only \
                             regular files; nothing was changed"
                        ),
                    });
                }
                let loaded = files.contains_key(&target);
                let gone = entry(ws, limits, run, &mut files, &targets, &target, Load::Bytes)?;
                writable(gone)?;
                // Loaded here, it is there if it has bytes; loaded before, if the patch
                // left it there.
                if gone.current.take().is_none()
                    && (loaded || (gone.original.is_none() && !gone.unkept))
                {
                    return Err(missing(ws, path, DELETE));
                }
                let what = match gone.unkept && !loaded {
                    true => format!(
                        "{path} (over {} MiB, so its bytes were not kept: undo cannot bring \
                         it back)",
                        limits.edit_max_bytes / (1024 * 1024)
                    ),
                    false => path.clone(),
                };
                changes.push(Change { mark: 'D', what, hunks: Vec::new() });
            }
            Op::Update { path, move_to, hunks } => {
                let source = entry(ws, limits, run, &mut files, &targets, &target, Load::Text)?;
                writable(source)?;
                let Some(mut file) = source.current.take() else {
                    return Err(missing(ws, path, UPDATE));
                };
                let applied = file.apply(hunks).map_err(|message| FsError::Edit {
                    path: path.clone(),
                    message: format!("`{path}`, {message}\nnothing was changed"),
                })?;
                too_large(limits, path, &file)?;
                let (added, removed) =
                    applied.iter().fold((0, 0), |(a, r), hunk| (a + hunk.added, r + hunk.removed));
                let source = targets[&target].clone();
                let (landing, mark, what) = match (move_to, dest) {
                    (Some(move_to), Some(dest)) if dest != target => {
                        if present(ws, &files, &targets, &dest)? {
                            return Err(FsError::Edit {
                                path: move_to.clone(),
                                message: format!(
                                    "`{MOVE}{move_to}`: something is already there; delete it \
                                     first; nothing was changed"
                                ),
                            });
                        }
                        (dest, 'R', format!("{path} -> {move_to} (+{added} -{removed})"))
                    }
                    _ => (target, 'M', format!("{path} (+{added} -{removed})")),
                };
                let source = (mark == 'R').then_some(source);
                let landed = entry(ws, limits, run, &mut files, &targets, &landing, Load::Text)?;
                landed.current = Some(file);
                landed.moved_from = landed.moved_from.take().or(source);
                changes.push(Change { mark, what, hunks: applied });
            }
        }
    }

    // A file over the limit goes without its bytes held, so it can be put back only when
    // nothing is written after it: its removal is written last ([`commit`]), which holds
    // for one such removal, not for two, nor for such a file written anew among others.
    let mut unkept = files.values().filter(|entry| entry.unkept);
    let risked = match (unkept.next(), unkept.next()) {
        (Some(_), Some(second)) => Some(second),
        (Some(only), None) if only.current.is_some() && files.len() > 1 => Some(only),
        _ => None,
    };
    if let Some(entry) = risked {
        let path = entry.resolved.given.clone();
        return Err(FsError::Edit {
            message: format!(
                "`{DELETE}{path}`: the file is over `fs.limits.editMaxBytes` ({} bytes), so its \
                 bytes are not held while the patch is written, and this patch writes or \
                 deletes other files after it: were one of those to fail, it could not be put \
                 back; delete it in a patch of its own; nothing was changed",
                limits.edit_max_bytes
            ),
            path,
        });
    }
    let mut set_id_notes = Vec::new();
    if !args.dry_run {
        set_id_notes = commit(ws, run, &files)?;
    }
    drop(locks);

    let count = changes.len();
    let s = if count == 1 { "" } else { "s" };
    let mut out = if args.dry_run {
        format!(
            "dry run: the patch applies; it would change {count} file{s} (nothing was written):"
        )
    } else {
        format!("applied the patch to {count} file{s}:")
    };
    let mut listed = Vec::with_capacity(changes.len());
    for change in &changes {
        let _ = write!(out, "\n{} {}", change.mark, change.what);
        for hunk in &change.hunks {
            let mut note = hunk.note.map(|n| format!(", matched {n}")).unwrap_or_default();
            if !hunk.also.is_empty() {
                let lines: Vec<String> = hunk.also.iter().map(ToString::to_string).collect();
                let _ = write!(
                    note,
                    "; its lines also match at line {}: if the change was meant there, undo \
                     and add an `@@` line naming the function or class",
                    lines.join(", ")
                );
            }
            let _ =
                write!(out, "\n    @@ line {}: +{} -{}{note}", hunk.line, hunk.added, hunk.removed);
        }
        listed.push(json!({"change": change.mark.to_string(), "file": change.what}));
    }
    for note in set_id_notes {
        let _ = write!(out, "\n[{note}]");
    }
    Ok(ToolOutput::text(out)
        .with_extra("files", json!(listed))
        .with_extra("dry_run", json!(args.dry_run)))
}

/// A file to delete or update that is not there: the caller's mistake, with the close name
/// in its folder when there is one.
fn missing(ws: &Workspace, path: &str, header: &str) -> FsError {
    let hint = ws.close_path(path).map(|close| format!(" (did you mean `{close}`?)"));
    FsError::InvalidArguments {
        tool: "apply_patch",
        message: format!(
            "`{header}{path}`: there is no such file{} (or the patch removed it earlier); \
             nothing was changed",
            hint.unwrap_or_default()
        ),
    }
}

fn too_large(limits: &FsLimits, path: &str, file: &TextFile) -> Result<(), FsError> {
    let size = file.render().len() as u64;
    if size > limits.edit_max_bytes {
        return Err(FsError::TooLarge {
            tool: "apply_patch",
            path: path.to_owned(),
            size,
            limit: limits.edit_max_bytes,
        });
    }
    Ok(())
}

/// How a file the patch touches is loaded from disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Load {
    /// As text to change: decoded, and refused when it is not text or over the limit.
    Text,
    /// As bytes, for `*** Delete File:`: deleting needs no decoding, so a binary file or
    /// one that is not valid text may be deleted (and its bytes brought back by `undo`),
    /// and one over the limit is deleted without its bytes held. It is still refused when
    /// it changed since it was read.
    Bytes,
}

/// The entry of `target`, loaded from disk on first use as `how` says.
fn entry<'f>(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    files: &'f mut BTreeMap<PathBuf, Entry>,
    targets: &BTreeMap<PathBuf, Resolved>,
    target: &PathBuf,
    how: Load,
) -> Result<&'f mut Entry, FsError> {
    if !files.contains_key(target) {
        let resolved = targets[target].clone();
        let (original, unkept, current) = match (exists(ws, &resolved)?, how) {
            (false, _) => (None, false, None),
            (true, Load::Text) => {
                let (decoded, encoding) = load(ws, limits, run, &resolved, "apply_patch")?;
                let file = TextFile::parse(&decoded, encoding);
                (Some(encoding.encode(&decoded)), false, Some(file))
            }
            (true, Load::Bytes) => {
                let (original, unkept) = load_bytes(ws, limits, run, &resolved)?;
                (original, unkept, None)
            }
        };
        let mode = (original.is_some() || unkept).then(|| mode_of(ws, &resolved)).flatten();
        let moved_from = None;
        files.insert(
            target.clone(),
            Entry { resolved, original, unkept, current, moved_from, mode },
        );
    }
    Ok(files.get_mut(target).expect("inserted above"))
}

/// The bytes of the file at `resolved` ([`Load::Bytes`]), and whether they were not held
/// (`None`, `true`) for a file over the limit.
fn load_bytes(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    resolved: &Resolved,
) -> Result<(Option<Vec<u8>>, bool), FsError> {
    // Read where the check found it, no symlink followed (as `load` does).
    let canonical = ws.canonical(resolved)?;
    ws.check_read(resolved, &canonical)?;
    match ws.read_small_at("apply_patch", resolved, &canonical, limits.edit_max_bytes) {
        Ok(bytes) => {
            let current = workspace::hash(&bytes);
            ws.check_fresh(run, resolved, &canonical, &current, false)?;
            Ok((Some(bytes), false))
        }
        // Too large to hold: checked as `read` recorded it (hashed, or fingerprinted when
        // larger still), and deleted without its bytes.
        Err(FsError::TooLarge { .. }) => {
            let whole_max = super::read::counted_max(limits);
            let current = ws.hash_or_fingerprint(resolved, whole_max)?;
            ws.check_fresh(run, resolved, &canonical, &current, false)?;
            Ok((None, true))
        }
        Err(error) => Err(error),
    }
}

/// The permission bits of the file at `path` (set-id bits included).
fn mode_of(ws: &Workspace, path: &Resolved) -> Option<u32> {
    use cap_std::fs::MetadataExt as _;
    ws.dir().metadata(&path.relative).ok().map(|meta| meta.mode() & 0o7777)
}

/// Refuses, before anything is written, a file on disk that the patch deletes, changes or
/// moves while its owner may not write it, as a write to it is refused.
fn writable(entry: &Entry) -> Result<(), FsError> {
    match entry.mode {
        Some(mode) if (entry.original.is_some() || entry.unkept) && mode & 0o200 == 0 => {
            Err(FsError::ReadOnly { path: entry.resolved.given.clone(), mode })
        }
        _ => Ok(()),
    }
}

/// Whether something (a file, a directory, a link) is at `path` now, or (when the patch
/// already touched it) will be.
fn present(
    ws: &Workspace,
    files: &BTreeMap<PathBuf, Entry>,
    targets: &BTreeMap<PathBuf, Resolved>,
    target: &PathBuf,
) -> Result<bool, FsError> {
    match files.get(target) {
        Some(entry) => Ok(entry.current.is_some()),
        None => exists(ws, &targets[target]),
    }
}

/// Whether `path` is a symbolic link that leads nowhere.
fn broken_link(ws: &Workspace, path: &Resolved) -> bool {
    let link = ws.dir().symlink_metadata(&path.relative).is_ok_and(|meta| meta.is_symlink());
    link && ws.dir().metadata(&path.relative).is_err_and(|e| {
        matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory)
    })
}

fn exists(ws: &Workspace, path: &Resolved) -> Result<bool, FsError> {
    match ws.dir().symlink_metadata(&path.relative) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(FsError::from_io(&path.given, e)),
    }
}

/// Writes every changed file, then removes the deleted ones; on a failure, puts back what
/// was already done and reports the failure. Returns a note for each file whose set-id
/// bits the write cleared.
fn commit(
    ws: &Workspace,
    run: &str,
    files: &BTreeMap<PathBuf, Entry>,
) -> Result<Vec<String>, FsError> {
    let mut done: Vec<&Entry> = Vec::new();
    let mut set_id_notes = Vec::new();
    let writes = files.values().filter(|e| e.current.is_some());
    let removals = files.values().filter(|e| e.current.is_none() && e.original.is_some());
    // Last, as a failure after them could not bring them back.
    let unkept = files.values().filter(|e| e.current.is_none() && e.unkept);
    let mut failure = None;
    for entry in writes.chain(removals).chain(unkept) {
        let result = match &entry.current {
            Some(file) => {
                let bytes = file.bytes();
                if entry.original.as_deref() == Some(bytes.as_slice()) {
                    continue;
                }
                let like = entry.moved_from.as_ref();
                ws.write_atomic_like(&entry.resolved, &bytes, like).map(|written| {
                    let note = written.set_id_note();
                    if let Some(note) = note.strip_prefix("; ") {
                        set_id_notes.push(format!("`{}`: {note}", entry.resolved.given));
                    }
                    ws.record_read(run, written.canonical, workspace::hash(&bytes));
                })
            }
            None => ws.remove_file(&entry.resolved),
        };
        match result {
            Ok(()) => done.push(entry),
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    let Some(error) = failure else {
        // A file whose bytes were not held cannot be brought back: its older changes are
        // forgotten, as undoing them would skip over this one.
        for entry in done.iter().filter(|entry| entry.unkept) {
            ws.changes().forget(run, &ws.resolve_target(&entry.resolved));
        }
        let touched = done
            .iter()
            .filter(|entry| !entry.unkept)
            .map(|entry| super::undo::Touched {
                path: entry.resolved.clone(),
                target: ws.resolve_target(&entry.resolved),
                before: entry.original.clone(),
                after: entry.current.as_ref().map(|file| workspace::hash(&file.bytes())),
                mode: entry.mode,
            })
            .collect();
        ws.changes().record(run, "apply_patch", touched);
        return Ok(set_id_notes);
    };
    let mut not_undone = Vec::new();
    for entry in done.into_iter().rev() {
        let undone = match &entry.original {
            Some(bytes) => ws.write_atomic(&entry.resolved, bytes).map(|written| {
                ws.record_read(run, written.canonical, workspace::hash(bytes));
            }),
            None => ws.remove_file(&entry.resolved),
        };
        if undone.is_err() {
            not_undone.push(entry.resolved.given.clone());
        }
    }
    if not_undone.is_empty() {
        return Err(FsError::Edit {
            path: String::new(),
            message: format!(
                "the patch could not be written ({}); the files already written were put back, \
                 so nothing was changed",
                error_chain(&error)
            ),
        });
    }
    Err(FsError::Edit {
        path: String::new(),
        message: format!(
            "the patch could not be written ({}), and putting back what was already written \
             failed for {}: check those files",
            error_chain(&error),
            not_undone.join(", ")
        ),
    })
}

fn error_chain(error: &FsError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    /// The hunks of a one-file update whose body is `body`.
    fn hunks(body: &str) -> Vec<Hunk> {
        let patch = format!("*** Begin Patch\n*** Update File: f\n{body}\n*** End Patch");
        match parse(&patch).expect("parses").pop() {
            Some(Op::Update { hunks, .. }) => hunks,
            other => panic!("not an update: {other:?}"),
        }
    }

    #[test]
    fn parses_every_operation() {
        let patch = "*** Begin Patch\n*** Add File: a.txt\n+one\n+two\n*** Delete File: b.txt\n\
                     *** Update File: c.py\n*** Move to: d.py\n@@ class C\n@@ def f():\n     x = 1\n\
                     -    y = 2\n+    y = 3\n*** End of File\n*** End Patch";
        let ops = parse(patch).expect("parses");
        assert_eq!(
            ops,
            vec![
                Op::Add { path: "a.txt".into(), lines: lines("one\ntwo") },
                Op::Delete { path: "b.txt".into() },
                Op::Update {
                    path: "c.py".into(),
                    move_to: Some("d.py".into()),
                    hunks: vec![Hunk {
                        line: 8,
                        anchors: vec!["class C".into(), "def f():".into()],
                        parts: vec![
                            Part::Context("    x = 1".into()),
                            Part::Removed("    y = 2".into()),
                            Part::Added("    y = 3".into()),
                        ],
                        end_of_file: true,
                    }],
                },
            ]
        );
    }

    #[test]
    fn heredocs_and_blank_separators_are_tolerated() {
        let patch = "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: a\n@@\n-x\n+y\n\n\
                     *** Delete File: b\n*** End Patch\nEOF\n";
        let ops = parse(patch).expect("parses");
        assert_eq!(ops.len(), 2);
        let Op::Update { hunks, .. } = &ops[0] else { panic!("an update first") };
        assert_eq!(hunks[0].parts, vec![Part::Removed("x".into()), Part::Added("y".into())]);
    }

    #[test]
    fn errors_name_the_patch_line() {
        let error = parse("*** Begin Patch\n*** Update File: a\n@@\n x\n?y\n*** End Patch")
            .expect_err("bad line");
        assert_eq!(error.line, 5);
        let error = parse("*** Begin Patch\n*** Frobnicate: a\n*** End Patch").expect_err("bad");
        assert_eq!(error.line, 2);
        assert!(parse("*** Begin Patch\n*** Delete File: a\n").is_err());
        assert!(parse("diff --git a b").is_err());
        assert!(parse("*** Begin Patch\n*** End Patch").is_err());
    }

    #[test]
    fn hunks_apply_in_order_after_their_anchors() {
        let mut file =
            TextFile::parse("def f():\n    return 1\n\ndef g():\n    return 1\n", Encoding::Utf8);
        let applied =
            file.apply(&hunks("@@ def g():\n-    return 1\n+    return 2")).expect("applies");
        assert_eq!(applied[0].line, 5);
        assert_eq!(file.render(), "def f():\n    return 1\n\ndef g():\n    return 2\n");
    }

    #[test]
    fn cr_only_files_are_patched_as_lines() {
        let mut file = TextFile::parse("a\rb\rc\r", Encoding::Utf8);
        assert_eq!(file.lines.len(), 3);
        file.lines.insert(1, Line { text: "x".into(), crlf: false });
        assert_eq!(file.render(), "a\rx\rb\rc\r");
    }

    #[test]
    fn crlf_and_missing_final_breaks_are_kept() {
        let mut file = TextFile::parse("a\r\nb\r\nc", Encoding::Utf8);
        file.apply(&hunks(" b\n+B\n c\n*** End of File")).expect("applies");
        assert_eq!(file.render(), "a\r\nb\r\nB\r\nc");
        // Lines added after a last line without a break: the file still ends without one.
        file.apply(&hunks("+d")).expect("applies");
        assert_eq!(file.render(), "a\r\nb\r\nB\r\nc\r\nd");
    }

    #[test]
    fn context_found_loosely_keeps_the_file_s_text() {
        let mut file = TextFile::parse("say(“hi”)  \nx = 1\n", Encoding::Utf8);
        let applied = file.apply(&hunks(" say(\"hi\")\n-x = 1\n+x = 2")).expect("applies");
        assert_eq!(applied[0].note, Fuzz::Typographic.note(None));
        assert_eq!(file.render(), "say(“hi”)  \nx = 2\n");
    }

    #[test]
    fn a_whitespace_change_is_made() {
        let mut file = TextFile::parse("a\n  b\n", Encoding::Utf8);
        file.apply(&hunks(" a\n-  b\n+b")).expect("applies");
        assert_eq!(file.render(), "a\nb\n");
    }

    #[test]
    fn looser_matches_are_reported() {
        let lines_of = |text: &str| TextFile::parse(text, Encoding::Utf8).lines;
        let file = lines_of("x = “quoted”   \n");
        let fuzz = |pattern: &str| seek(&file, &lines(pattern), 0, false).map(|found| found.1);
        assert_eq!(fuzz("x = \"quoted\""), Some(Fuzz::Typographic));
        assert_eq!(fuzz("x = “quoted”"), Some(Fuzz::TrailingSpace));
        assert_eq!(fuzz("y"), None);
    }
}
