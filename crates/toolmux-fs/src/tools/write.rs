//! `write`: whole-file writes, atomic, refusing to clobber what was not read or has changed.

use super::text::{Encoding, LineEnding};
use crate::config::FsLimits;
use crate::error::FsError;
use crate::workspace::{self, Workspace};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;
use toolmux_core::ToolOutput;

/// Bytes of an existing file looked at to tell its line ending.
const STYLE_SAMPLE: u64 = 1024 * 1024;

/// Arguments of `write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The file to write: relative to the workspace root, or absolute inside it.
    pub path: String,
    /// The complete new content of the file.
    pub content: String,
}

/// The description; `ns` is the namespace the tools are listed in (other tools are named
/// as a model calls them, `fs__ls` in `fs`).
pub(crate) fn description(ns: &str) -> String {
    format!(
        "Write a file in the workspace, replacing its whole content. \
Parent directories are created. The write is atomic (a temporary file renamed over the target) \
and an existing file keeps its permissions, less its set-user-id and set-group-id bits; a file its owner may not \
write (mode 0444) is refused. An existing file must have been read with `{ns}__read` in \
this run, and must not have changed since (checked by content hash; for a file over 64 MiB, by its \
size, times, inode and first and last MiB): otherwise the write is \
refused and you must read the file (again) first. Overwriting keeps the file's byte order mark \
and UTF-16 or UTF-32 encoding, and content written with `\\n` gets the file's CRLF line endings when most \
of its lines end so (CR when they all end in a bare CR). Returns the bytes and lines written and, for an overwrite, which lines \
changed. Prefer `{ns}__edit` for changes to existing files. \
Paths are relative to the workspace root or absolute inside it; nothing outside the root can be \
written."
    )
}

/// Writes `args.content` to `args.path`.
pub(crate) fn write(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    args: WriteArgs,
    require_read: bool,
) -> Result<ToolOutput, FsError> {
    let path = ws.resolve_file("write", &args.path)?;
    if args.content.len() as u64 > limits.edit_max_bytes {
        return Err(FsError::TooLarge {
            tool: "write",
            path: path.given,
            size: args.content.len() as u64,
            limit: limits.edit_max_bytes,
        });
    }
    let target = ws.check_write(&path)?;
    // Held from the freshness check to the record of the new content, so that a parallel
    // `edit` or `write` of the same file checks against this one's result.
    let _lock = ws.lock_file(&path, &target)?;
    check_existing(ws, limits, run, &path, require_read)?;
    let (bytes, kept) = match existing_style(ws, &path)? {
        Some(style) => style.render(&args.content),
        // A new file is written as given.
        None => (args.content.as_bytes().to_vec(), Vec::new()),
    };
    let before = super::undo::before(ws, &path, limits.edit_max_bytes);
    // What the overwrite changed, from the bytes undo keeps (none for a file too large).
    let change = match &before {
        Some(Some(old)) => Encoding::sniff(old).decode(old).ok().map(|old| {
            Change::between(&old, &Encoding::sniff(&bytes).decode(&bytes).unwrap_or_default())
        }),
        _ => None,
    };
    let unkept = before.is_none();
    let written = ws.write_atomic(&path, &bytes)?;
    let set_id_note = written.set_id_note();
    ws.record_read(run, written.canonical, workspace::hash(&bytes));
    super::undo::wrote(ws, run, "write", &path, before, (&bytes, written.previous_mode));
    let lines = super::text::lines(&args.content).len();
    let verb = if written.created { "created" } else { "overwrote" };
    let mut notes = String::new();
    if !kept.is_empty() {
        let _ = write!(notes, "; kept the file's {}", kept.join(" and "));
    }
    if let Some(change) = change.filter(|_| !written.created) {
        let _ = write!(notes, "; {change}");
    }
    notes.push_str(&set_id_note);
    if unkept && !written.created {
        let _ = write!(
            notes,
            "; its old content, over `fs.editMaxBytes` ({} bytes), is not kept: `undo` cannot \
             bring it back",
            limits.edit_max_bytes
        );
    }
    let mut out = ToolOutput::text(format!(
        "{verb} `{}` ({} bytes, {lines} line{}{notes})",
        path.given,
        bytes.len(),
        if lines == 1 { "" } else { "s" }
    ))
    .with_extra("created", json!(written.created))
    .with_extra("bytes", json!(bytes.len()))
    .with_extra("lines", json!(lines));
    if let Some(change) = change.filter(|_| !written.created) {
        out = out.with_extra(
            "changed",
            json!({"first_line": change.first_line, "removed": change.removed, "added": change.added}),
        );
    }
    Ok(out)
}

/// What an overwrite changed, line by line: from the first line that differs to the last,
/// the lines of the old file removed and the lines of the new one put in their place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Change {
    /// The first line that differs (1-based).
    first_line: usize,
    removed: usize,
    added: usize,
}

impl Change {
    /// The lines between the longest common start and end of `old` and `new`.
    fn between(old: &str, new: &str) -> Change {
        // A CR file's lines end in CR (see `LineEnding::Cr`).
        let lines = |text: &str| -> Vec<String> {
            let cr = LineEnding::dominant(text) == Some(LineEnding::Cr);
            let end = if cr { '\r' } else { '\n' };
            text.split_inclusive(end).map(str::to_owned).collect()
        };
        let (old, new) = (lines(old), lines(new));
        let start = old.iter().zip(&new).take_while(|(a, b)| a == b).count();
        let room = old.len().min(new.len()) - start;
        let end =
            old.iter().rev().zip(new.iter().rev()).take(room).take_while(|(a, b)| a == b).count();
        Change {
            first_line: start + 1,
            removed: old.len() - start - end,
            added: new.len() - start - end,
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Change { first_line, removed, added } = *self;
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let old = if removed == 1 {
            format!("line {first_line}")
        } else {
            format!("lines {first_line}-{}", first_line + removed - 1)
        };
        match (removed, added) {
            (0, 0) => write!(f, "the content was the same"),
            (0, _) => write!(f, "{added} line{} added at line {first_line}", plural(added)),
            (_, 0) => write!(f, "{old} removed"),
            _ if removed == added => write!(f, "{old} changed"),
            _ => write!(f, "{old} replaced by {added} line{}", plural(added)),
        }
    }
}

/// Refuses to overwrite an existing file that changed since it was read in `run`, or (with
/// `require_read`) that was not read in it.
fn check_existing(
    ws: &Workspace,
    limits: &FsLimits,
    run: &str,
    path: &workspace::Resolved,
    require_read: bool,
) -> Result<(), FsError> {
    let canonical = match ws.canonical(path) {
        Ok(canonical) => canonical,
        // Nothing there yet: a new file (escapes are refused when it is created).
        Err(FsError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    // The root is the empty path, which no call opens.
    let at = if canonical.as_os_str().is_empty() { Path::new(".") } else { &canonical };
    let meta = ws.dir().metadata(at).map_err(|e| FsError::from_io(&path.given, e))?;
    if meta.is_dir() {
        return Err(FsError::IsDirectory { path: path.given.clone() });
    }
    // A FIFO, socket or device, which `read` refuses: asking to read it first would send
    // the caller round in a circle.
    if !meta.is_file() {
        return Err(FsError::NotRegularFile { path: path.given.clone() });
    }
    match ws.last_read(run, &canonical) {
        None if require_read => Err(FsError::NotRead { path: path.given.clone() }),
        None => Ok(()),
        Some(_) => {
            // A file `read` only fingerprinted (too large to hash) is compared so.
            let max = super::read::counted_max(limits);
            let current = ws.hash_or_fingerprint_at(path, &canonical, max)?;
            ws.check_fresh(run, path, &canonical, &current, true)
        }
    }
}

/// How an existing file is written: its encoding and the line ending most of its lines use.
#[derive(Debug, Clone, Copy)]
struct Style {
    encoding: Encoding,
    ending: Option<LineEnding>,
}

impl Style {
    /// The bytes to write for `content`, and what of the old file's style they kept.
    /// Content with bare `\n` only gets CRLF when the file mostly used CRLF, or CR when
    /// its lines all ended in a bare CR (content that has CR of its own is taken as meant);
    /// a byte order mark, UTF-16 and UTF-32 are kept.
    fn render(self, content: &str) -> (Vec<u8>, Vec<&'static str>) {
        let mut kept = Vec::new();
        let mut text = Cow::Borrowed(content);
        let own = match self.ending {
            Some(LineEnding::Cr) => content.contains('\r'),
            _ => content.contains("\r\n"),
        };
        if let Some(ending @ (LineEnding::CrLf | LineEnding::Cr)) = self.ending
            && content.contains('\n')
            && !own
        {
            text = ending.apply(content);
            kept.push(match ending {
                LineEnding::Cr => "CR line endings",
                _ => "CRLF line endings",
            });
        }
        match self.encoding {
            Encoding::Utf8 => {}
            Encoding::Utf8Bom if content.starts_with('\u{FEFF}') => {}
            Encoding::Utf8Bom => kept.push("UTF-8 byte order mark"),
            Encoding::Utf16Le => kept.push("UTF-16 LE encoding"),
            Encoding::Utf16Be => kept.push("UTF-16 BE encoding"),
            Encoding::Utf32Le => kept.push("UTF-32 LE encoding"),
            Encoding::Utf32Be => kept.push("UTF-32 BE encoding"),
        }
        (self.encoding.encode(&text), kept)
    }
}

/// The style of the file at `path`, from its first [`STYLE_SAMPLE`] bytes; `None` when
/// there is no file yet or it is not text.
fn existing_style(ws: &Workspace, path: &workspace::Resolved) -> Result<Option<Style>, FsError> {
    let err = |e| FsError::from_io(&path.given, e);
    let canonical = match ws.canonical(path) {
        Ok(canonical) => canonical,
        Err(FsError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    // Where the path leads, opened with no symlink followed: the style is taken from the
    // file that is checked and replaced, not from one a symlink swapped in since leads to.
    let file = match ws.open_beneath(&canonical) {
        Ok(file) if file.metadata().is_ok_and(|m| m.is_file()) => file,
        // Not a regular file: the write itself refuses it, saying so.
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // A symlink on the way now, where the path was resolved without one.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV)) => {
            return Err(FsError::PathChanged { path: path.given.clone() });
        }
        Err(e) => return Err(err(e)),
    };
    let mut sample = Vec::new();
    file.take(STYLE_SAMPLE).read_to_end(&mut sample).map_err(err)?;
    // A binary file has no style to keep: the CR LF in a PNG's signature, or any CR and LF
    // bytes its data holds, are no line endings, so text replacing it is written as given.
    if super::read::is_binary_file(&sample) {
        return Ok(None);
    }
    let encoding = Encoding::sniff(&sample);
    let body = &sample[encoding.bom().len()..];
    let ending = LineEnding::dominant_in(encoding.units(body));
    Ok(Some(Style { encoding, ending }))
}
