//! `read` of a Jupyter notebook (`.ipynb`): its cells as the model reads a notebook, not
//! the JSON that holds them. Each cell shows its number, id and type, its source and, for
//! code, its text outputs (streams, results' `text/plain`, errors with their traceback,
//! colours removed); an image or other rich output is named by its MIME type and size,
//! never inlined as base64, and so is each attachment of a cell (an image pasted into a
//! markdown cell, which its source shows as `attachment:NAME`). `offset` and `limit`
//! count cells.
//!
//! `edit` and `write` work on the file's JSON, which `read` with `raw: true` shows as
//! lines like any file's; the header of the rendered notebook says so.

use super::control;
use super::shell::strip_ansi;
use serde_json::{Value, json};
use std::fmt::Write as _;
use toolmux_core::ToolOutput;

/// Lines of one output shown at most (a loop that printed thousands of lines).
const OUTPUT_LINES: usize = 60;
/// Characters of one output shown at most.
const OUTPUT_CHARS: usize = 4000;

/// Whether `path` names a notebook, by its extension.
pub(crate) fn is_notebook(path: &str) -> bool {
    std::path::Path::new(path).extension().is_some_and(|e| e.eq_ignore_ascii_case("ipynb"))
}

/// Which cells to show and how much text at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CellPage {
    /// The first cell, 1-based.
    pub(crate) first: u64,
    /// How many cells at most.
    pub(crate) limit: Option<u64>,
    /// Bytes of text at most (at least one cell is shown, cut if it must be).
    pub(crate) max_bytes: usize,
}

/// A page of a notebook's cells.
#[derive(Debug)]
pub(crate) struct Rendered {
    pub(crate) output: ToolOutput,
    /// Whether every cell asked for was shown whole (the page's byte cap cut none off).
    pub(crate) complete: bool,
}

/// The notebook in `bytes` rendered as cells, or why it cannot be (for a note above its
/// raw text): not JSON, not nbformat 4, no cell list.
pub(crate) fn render(given: &str, bytes: &[u8], page: CellPage) -> Result<Rendered, Rendering> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let notebook: Value = serde_json::from_slice(bytes)
        .map_err(|e| Rendering::Malformed(format!("it is not valid JSON ({e})")))?;
    let Some(cells) = notebook.get("cells").and_then(Value::as_array) else {
        let why = match notebook.get("worksheets") {
            Some(_) => "it is an nbformat 3 notebook (cells in `worksheets`), which is not \
                        rendered"
                .to_owned(),
            None => "it has no `cells` list".to_owned(),
        };
        return Err(Rendering::Malformed(why));
    };
    let total = cells.len() as u64;
    if total > 0 && page.first > total {
        return Err(Rendering::Invalid(format!(
            "offset {} is past the last cell of `{given}`, which has {total} cells (a \
             notebook is read by cells: `offset` and `limit` count cells)",
            page.first
        )));
    }
    let version = match (notebook.get("nbformat"), notebook.get("nbformat_minor")) {
        (Some(major), Some(minor)) => format!("nbformat {major}.{minor}"),
        (Some(major), None) => format!("nbformat {major}"),
        _ => "nbformat unknown".to_owned(),
    };
    let language = notebook
        .pointer("/metadata/kernelspec/name")
        .or_else(|| notebook.pointer("/metadata/language_info/name"))
        .and_then(Value::as_str)
        .map(|name| format!(", kernel {name}"))
        .unwrap_or_default();
    let mut text = format!(
        "[`{given}`: a Jupyter notebook ({version}{language}), {total} cells, shown as cells; \
         `offset` and `limit` count cells. `edit` and `write` change its JSON: read it with \
         `raw: true` to see the text to edit]\n"
    );
    let header = text.len();
    let first = page.first.max(1);
    let wanted = page.limit.unwrap_or(u64::MAX).max(1);
    let (mut shown, mut capped) = (0u64, false);
    for (index, cell) in cells.iter().enumerate().skip(first as usize - 1) {
        if shown == wanted {
            break;
        }
        let rendered = cell_text(index as u64 + 1, cell);
        if text.len() + rendered.len() > page.max_bytes {
            if shown > 0 {
                capped = true;
                break;
            }
            // One cell larger than the page: its start.
            let mut cut = page.max_bytes.saturating_sub(header).min(rendered.len());
            while !rendered.is_char_boundary(cut) {
                cut -= 1;
            }
            let _ = writeln!(
                text,
                "{}\n[... cell {} cut at the page's {} bytes: the rest of it is in the JSON \
                 (`raw: true`)]",
                &rendered[..cut],
                index + 1,
                page.max_bytes
            );
            shown = 1;
            capped = true;
            break;
        }
        text.push_str(&rendered);
        shown += 1;
    }
    // Saturating: a notebook with no cells takes any offset, `u64::MAX` too.
    let last = first.saturating_add(shown.max(1) - 1);
    let more = total > 0 && last < total;
    if total == 0 {
        text.push_str("[the notebook has no cells]");
    } else if more {
        let why = match capped {
            true => format!("page capped at {} bytes; ", page.max_bytes),
            false => String::new(),
        };
        let _ = write!(
            text,
            "[{why}showing cells {first}-{last} of {total}; use offset={} to read more]",
            last + 1
        );
    }
    let output = ToolOutput::text(text.trim_end().to_owned())
        .with_extra("notebook", json!(true))
        .with_extra("totalCells", json!(total))
        .with_extra("startCell", json!(first))
        .with_extra("endCell", json!(if total == 0 { 0 } else { last }))
        .with_extra("truncated", json!(more));
    Ok(Rendered { output, complete: !capped })
}

/// Why a notebook was not rendered.
#[derive(Debug)]
pub(crate) enum Rendering {
    /// It is no notebook this renders: its raw text is shown instead, after this note.
    Malformed(String),
    /// The call asked for cells it does not have.
    Invalid(String),
}

/// A notebook's text field: a string, or a list of strings (lines) to join.
fn joined(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    }
}

/// Text from a notebook as the model sees it: escape sequences removed, control
/// characters escaped.
fn clean(text: &str) -> String {
    control::escape_controls(&strip_ansi(text)).into_owned()
}

/// One cell: `<cell>` with its number, id and type, its source, its outputs.
fn cell_text(number: u64, cell: &Value) -> String {
    let kind = cell.get("cell_type").and_then(Value::as_str).unwrap_or("unknown");
    let mut out = format!("<cell {number}");
    if let Some(id) = cell.get("id").and_then(Value::as_str) {
        let _ = write!(out, " id=\"{}\"", clean(id));
    }
    let _ = write!(out, " type=\"{}\"", clean(kind));
    if let Some(count) = cell.get("execution_count").and_then(Value::as_u64) {
        let _ = write!(out, " execution_count=\"{count}\"");
    }
    out.push_str(">\n");
    let source = clean(&joined(cell.get("source")));
    if !source.is_empty() {
        out.push_str(source.trim_end_matches('\n'));
        out.push('\n');
    }
    // `{"NAME": {"MIME": base64, ...}, ...}`: each named, never inlined.
    for (name, bundle) in cell.get("attachments").and_then(Value::as_object).into_iter().flatten() {
        let shown = bundle.as_object().map(sized).unwrap_or_default();
        let kinds: Vec<String> =
            shown.iter().map(|(mime, bytes)| format!("{mime}, {bytes} bytes")).collect();
        let kinds = match kinds.is_empty() {
            true => "no data".to_owned(),
            false => kinds.join("; "),
        };
        let _ = writeln!(out, "[attachment `{}`: {kinds}, not shown]", clean(name));
    }
    for output in cell.get("outputs").and_then(Value::as_array).into_iter().flatten() {
        output_text(&mut out, output);
    }
    out.push_str("</cell>\n");
    out
}

/// One output of a code cell.
fn output_text(out: &mut String, output: &Value) {
    let kind = output.get("output_type").and_then(Value::as_str).unwrap_or("unknown");
    let (attributes, body, rich) = match kind {
        "stream" => {
            let name = output.get("name").and_then(Value::as_str).unwrap_or("stdout");
            (format!(" name=\"{}\"", clean(name)), joined(output.get("text")), Vec::new())
        }
        "execute_result" | "display_data" => {
            let data = output.get("data").and_then(Value::as_object);
            let plain = data.map(|d| joined(d.get("text/plain"))).unwrap_or_default();
            let rich = data.map(|d| sized(d.iter().filter(|(mime, _)| *mime != "text/plain")));
            (String::new(), plain, rich.unwrap_or_default())
        }
        "error" => {
            let field = |key: &str| output.get(key).and_then(Value::as_str).unwrap_or("");
            let traceback: Vec<&str> = output
                .get("traceback")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let mut body = format!("{}: {}", field("ename"), field("evalue"));
            if !traceback.is_empty() {
                body.push('\n');
                body.push_str(&traceback.join("\n"));
            }
            (String::new(), body, Vec::new())
        }
        _ => (String::new(), String::new(), Vec::new()),
    };
    let _ = write!(out, "<output type=\"{}\"{attributes}", clean(kind));
    if rich.is_empty() && body.is_empty() {
        out.push_str("/>\n");
        return;
    }
    out.push_str(">\n");
    let body = clean(&body);
    let body = body.trim_end_matches('\n');
    if !body.is_empty() {
        out.push_str(&bounded(body));
        out.push('\n');
    }
    for (mime, bytes) in rich {
        let _ = writeln!(out, "[{mime} output, {bytes} bytes, not shown]");
    }
    out.push_str("</output>\n");
}

/// The data of a MIME bundle (an output's `data`, an attachment), by MIME type, with its
/// size in bytes (decoded from base64 for binary ones).
fn sized<'a>(data: impl IntoIterator<Item = (&'a String, &'a Value)>) -> Vec<(String, usize)> {
    data.into_iter()
        .map(|(mime, value)| {
            let size = match value {
                Value::String(_) | Value::Array(_) => {
                    let text = joined(Some(value));
                    let binary = mime.starts_with("image/") && !mime.contains("svg");
                    match binary {
                        // Base64, perhaps broken into lines: four characters hold three
                        // bytes.
                        true => {
                            let digits = text.bytes().filter(|b| !b.is_ascii_whitespace()).count();
                            let padding = text.trim_end().bytes().rev().take_while(|&b| b == b'=');
                            (digits * 3 / 4).saturating_sub(padding.count())
                        }
                        false => text.len(),
                    }
                }
                other => other.to_string().len(),
            };
            (clean(mime), size)
        })
        .collect()
}

/// `text` within [`OUTPUT_LINES`] lines and [`OUTPUT_CHARS`] characters, its end cut
/// with a marker.
fn bounded(text: &str) -> String {
    let lines = text.split('\n').count();
    let mut kept: String = text.split('\n').take(OUTPUT_LINES).collect::<Vec<_>>().join("\n");
    let chars = kept.chars().count();
    if chars > OUTPUT_CHARS {
        kept = kept.chars().take(OUTPUT_CHARS).collect();
    }
    if lines > OUTPUT_LINES || chars > OUTPUT_CHARS {
        let _ = write!(
            kept,
            "\n[... the output's other lines are left out ({lines} lines, {} characters in \
             all); all of it is in the JSON (`raw: true`)]",
            text.chars().count()
        );
    }
    kept
}
