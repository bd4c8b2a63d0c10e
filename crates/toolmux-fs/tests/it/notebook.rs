//! `read` of Jupyter notebooks: cells, not JSON.

use crate::Fixture;
use expect_test::expect;
use serde_json::json;
use toolmux_fs::FsLimits;

/// A notebook as Jupyter writes it (nbformat 4.5): sources as lists of lines, a stream on
/// each channel, a result with HTML beside its text, a plot, an error whose traceback is
/// coloured, a raw cell.
fn notebook() -> String {
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let notebook = json!({
        "cells": [
            {"cell_type": "markdown", "id": "a1b2c3", "metadata": {},
             "source": ["# Sales\n", "\n", "Monthly totals."]},
            {"cell_type": "code", "execution_count": 1, "id": "d4e5f6", "metadata": {},
             "outputs": [
                {"name": "stdout", "output_type": "stream", "text": ["loading 3 rows\n"]},
                {"name": "stderr", "output_type": "stream", "text": "DeprecationWarning: old API\n"},
                {"data": {"text/html": ["<table><tr><td>1</td></tr></table>"],
                          "text/plain": ["   month  total\n", "0    jan    100"]},
                 "execution_count": 1, "metadata": {}, "output_type": "execute_result"}
             ],
             "source": ["import pandas as pd\n", "df = pd.read_csv(\"sales.csv\")\n", "df"]},
            {"cell_type": "code", "execution_count": 2, "id": "0718ab", "metadata": {},
             "outputs": [
                {"data": {"image/png": png, "text/plain": ["<Figure size 640x480 with 1 Axes>"]},
                 "metadata": {}, "output_type": "display_data"}
             ],
             "source": "df.plot()"},
            {"cell_type": "code", "execution_count": 3, "id": "ffee01", "metadata": {},
             "outputs": [
                {"ename": "ZeroDivisionError", "evalue": "division by zero", "output_type": "error",
                 "traceback": [
                    "\u{1b}[0;31m---------------------------------------------------------------------------\u{1b}[0m",
                    "\u{1b}[0;31mZeroDivisionError\u{1b}[0m                         Traceback (most recent call last)",
                    "Cell \u{1b}[0;32mIn[3], line 1\u{1b}[0m\n\u{1b}[0;32m----> 1\u{1b}[0m \u{1b}[38;5;241m1\u{1b}[39m\u{1b}[38;5;241m/\u{1b}[39m\u{1b}[38;5;241m0\u{1b}[39m\n",
                    "\u{1b}[0;31mZeroDivisionError\u{1b}[0m: division by zero"
                 ]}
             ],
             "source": ["1/0"]},
            {"cell_type": "code", "execution_count": null, "id": "9a9a9a", "metadata": {},
             "outputs": [], "source": []},
            {"cell_type": "raw", "id": "r4w", "metadata": {}, "source": ["raw text"]}
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "version": "3.12.1"}
        },
        "nbformat": 4,
        "nbformat_minor": 5
    });
    serde_json::to_string_pretty(&notebook).unwrap()
}

/// A notebook reads as its cells with their text outputs: the raw JSON buried the code in
/// quoting and filled the page with base64.
#[tokio::test]
async fn a_notebook_reads_as_cells_with_their_outputs() {
    let fx = Fixture::new();
    fx.put("analysis.ipynb", &notebook());
    let out = fx.call("read", json!({"path": "analysis.ipynb"})).await.unwrap();
    expect![[r#"
        [`analysis.ipynb`: a Jupyter notebook (nbformat 4.5, kernel python3), 6 cells, shown as cells; `offset` and `limit` count cells. `edit` and `write` change its JSON: read it with `raw: true` to see the text to edit]
        <cell 1 id="a1b2c3" type="markdown">
        # Sales

        Monthly totals.
        </cell>
        <cell 2 id="d4e5f6" type="code" execution_count="1">
        import pandas as pd
        df = pd.read_csv("sales.csv")
        df
        <output type="stream" name="stdout">
        loading 3 rows
        </output>
        <output type="stream" name="stderr">
        DeprecationWarning: old API
        </output>
        <output type="execute_result">
           month  total
        0    jan    100
        [text/html output, 34 bytes, not shown]
        </output>
        </cell>
        <cell 3 id="0718ab" type="code" execution_count="2">
        df.plot()
        <output type="display_data">
        <Figure size 640x480 with 1 Axes>
        [image/png output, 70 bytes, not shown]
        </output>
        </cell>
        <cell 4 id="ffee01" type="code" execution_count="3">
        1/0
        <output type="error">
        ZeroDivisionError: division by zero
        ---------------------------------------------------------------------------
        ZeroDivisionError                         Traceback (most recent call last)
        Cell In[3], line 1
        ----> 1 1/0

        ZeroDivisionError: division by zero
        </output>
        </cell>
        <cell 5 id="9a9a9a" type="code">
        </cell>
        <cell 6 id="r4w" type="raw">
        raw text
        </cell>"#]].assert_eq(&out.to_text());
    assert_eq!(out.extras["totalCells"], 6);
    assert_eq!(out.extras["truncated"], false);
}

/// `offset` and `limit` count cells: a page shows its cells as the whole notebook's
/// reading does, and the footer says where to go on.
#[tokio::test]
async fn offset_and_limit_count_cells() {
    let fx = Fixture::new();
    fx.put("analysis.ipynb", &notebook());
    let all = fx.ok("read", json!({"path": "analysis.ipynb"})).await;
    let out = fx.ok("read", json!({"path": "analysis.ipynb", "offset": 3, "limit": 2})).await;
    let (header, _) = all.split_once('\n').unwrap();
    let cells_3_and_4 = &all[all.find("<cell 3 ").unwrap()..all.find("<cell 5 ").unwrap()];
    let footer = "[showing cells 3-4 of 6; use offset=5 to read more]";
    assert_eq!(out, format!("{header}\n{cells_3_and_4}{footer}"));
    let err = fx.err("read", json!({"path": "analysis.ipynb", "offset": 7})).await;
    expect!["invalid arguments for `fs__read`: at /: offset 7 is past the last cell of `analysis.ipynb`, which has 6 cells (a notebook is read by cells: `offset` and `limit` count cells)"].assert_eq(&err);
}

/// A notebook with no cells reads as one at any offset, the largest too (it overflowed
/// counting its last cell).
#[tokio::test]
async fn a_notebook_with_no_cells_reads_at_any_offset() {
    let fx = Fixture::new();
    fx.put("empty.ipynb", r#"{"cells": [], "nbformat": 4, "nbformat_minor": 5}"#);
    let out = fx.ok("read", json!({"path": "empty.ipynb", "offset": u64::MAX})).await;
    assert!(out.ends_with("\n[the notebook has no cells]"), "{out}");
}

/// A page of a notebook stays within the page's bytes, a cell larger than the page cut.
#[tokio::test]
async fn a_notebook_page_stays_within_the_byte_cap() {
    let limits = FsLimits { read_page_bytes: 600, ..FsLimits::default() };
    let fx = Fixture::with(|c| c.with_limits(limits));
    // The page of `path` is within 600 bytes and `notes` more, and ends with `end`.
    let page_of = async |path: &str, notes: usize, end: &str| {
        let out = fx.ok("read", json!({"path": path})).await;
        assert!(out.len() <= 600 + notes, "{path}: {}", out.len());
        assert!(out.ends_with(end), "{path}: {out}");
    };
    fx.put("analysis.ipynb", &notebook());
    let end = "[page capped at 600 bytes; showing cells 1-1 of 6; use offset=2 to read more]";
    page_of("analysis.ipynb", 120, end).await;
    let big = json!({"cells": [{"cell_type": "code", "id": "x", "metadata": {}, "outputs": [],
        "source": "print(1)\n".repeat(200)}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5});
    fx.put("big.ipynb", &big.to_string());
    let end =
        "[... cell 1 cut at the page's 600 bytes: the rest of it is in the JSON (`raw: true`)]";
    page_of("big.ipynb", 200, end).await;
}

/// `raw: true` reads the JSON as lines, the text `edit` changes; a notebook read as
/// cells counts as read for `edit`.
#[tokio::test]
async fn raw_reads_the_json_and_edits_change_it() {
    let fx = Fixture::new();
    fx.put("analysis.ipynb", &notebook());
    let raw = fx.ok("read", json!({"path": "analysis.ipynb", "raw": true, "limit": 3})).await;
    assert!(raw.starts_with("     1\t{\n     2\t  \"cells\": [\n"), "{raw}");
    fx.ok("read", json!({"path": "analysis.ipynb"})).await;
    let edit = json!({"path": "analysis.ipynb", "old_string": "\"df.plot()\"", "new_string": "\"df.plot(kind=\\\"bar\\\")\""});
    fx.ok("edit", edit).await;
    let out = fx.ok("read", json!({"path": "analysis.ipynb", "offset": 3, "limit": 1})).await;
    let edited =
        "<cell 3 id=\"0718ab\" type=\"code\" execution_count=\"2\">\ndf.plot(kind=\"bar\")\n";
    assert!(out.contains(edited), "{out}");
}

/// A file named `.ipynb` that is no notebook this reads (broken JSON, nbformat 3) is
/// shown as its raw text, saying why.
#[tokio::test]
async fn a_malformed_notebook_reads_as_raw_text_with_a_note() {
    let fx = Fixture::new();
    fx.put("broken.ipynb", "{\"cells\": [\n  {\"cell_type\": \"code\",\n");
    let out = fx.ok("read", json!({"path": "broken.ipynb"})).await;
    expect![[r#"
        [`broken.ipynb` is shown as its raw text, not as notebook cells: it is not valid JSON (EOF while parsing a value at line 3 column 0)]
             1	{"cells": [
             2	  {"cell_type": "code",
    "#]].assert_eq(&out);
    fx.put("old.ipynb", "{\"worksheets\": [{\"cells\": []}], \"nbformat\": 3}\n");
    let out = fx.ok("read", json!({"path": "old.ipynb"})).await;
    expect![[r#"
        [`old.ipynb` is shown as its raw text, not as notebook cells: it is an nbformat 3 notebook (cells in `worksheets`), which is not rendered]
             1	{"worksheets": [{"cells": []}], "nbformat": 3}
    "#]].assert_eq(&out);
}

/// A notebook read again, the same cells of the same content, is answered "unchanged" once,
/// as any file's lines are: it was rendered again in full every time. `raw: true` is
/// another view, another range, an edit or a cut page another content.
#[tokio::test]
async fn the_same_cells_read_again_are_answered_unchanged_once() {
    let limits = FsLimits { read_page_bytes: 1200, ..FsLimits::default() };
    let fx = Fixture::with(|c| c.with_limits(limits));
    fx.put("analysis.ipynb", &notebook());
    let read = async |args: serde_json::Value| fx.call_in("r1", "read", args).await.unwrap();
    let cells = json!({"path": "analysis.ipynb", "offset": 2, "limit": 2});
    let first = read(cells.clone()).await;
    assert!(first.to_text().contains("<cell 3 "), "{}", first.to_text());
    let again = read(cells.clone()).await;
    expect!["[File unchanged since last read: cells 2-3 of `analysis.ipynb` (6 cells in all) are exactly as the earlier `read` of this range in this run showed them, so they are not repeated. If that result is no longer available to you, make this same call again to get the cells.]\n[more cells follow: use offset=4 to read them]"].assert_eq(&again.to_text());
    assert_eq!(again.extras["unchanged"], true);
    assert_eq!((&again.extras["startCell"], &again.extras["endCell"]), (&json!(2), &json!(3)));
    // Once: the next identical call shows the cells.
    assert_eq!(read(cells.clone()).await.to_text(), first.to_text());
    assert_eq!(read(cells.clone()).await.extras["unchanged"], true);
    // Another run never read it.
    let other = fx.call_in("r2", "read", cells.clone()).await.unwrap();
    assert_eq!(other.to_text(), first.to_text());
    // The JSON of the same range is another view: shown after the cells, and the other
    // way round; then the same view again is not.
    let raw = json!({"path": "analysis.ipynb", "offset": 2, "limit": 2, "raw": true});
    read(cells.clone()).await;
    assert!(read(raw.clone()).await.to_text().starts_with("     2\t"));
    assert!(read(cells.clone()).await.to_text().contains("<cell 3 "));
    assert!(read(raw.clone()).await.to_text().starts_with("     2\t"));
    assert_eq!(read(raw).await.extras["unchanged"], true);
    // Changed content is shown.
    read(cells.clone()).await;
    let edit = json!({"path": "analysis.ipynb", "old_string": "\"df.plot()\"", "new_string": "\"df.plot(kind=\\\"bar\\\")\""});
    fx.call_in("r1", "edit", edit).await.unwrap();
    assert!(read(cells.clone()).await.to_text().contains("df.plot(kind=\"bar\")"));
    // A page the byte cap cut short is never answered unchanged: the rest was not seen.
    let all = json!({"path": "analysis.ipynb"});
    let capped = read(all.clone()).await;
    assert!(capped.to_text().contains("[page capped at 1200 bytes;"), "{}", capped.to_text());
    assert_eq!(read(all).await.to_text(), capped.to_text());
}

/// A cell's attachments (an image pasted into a markdown cell, its source pointing at
/// `attachment:NAME`) are named with their type and size, never inlined: they were not
/// shown at all.
#[tokio::test]
async fn attachments_are_named_with_their_type_and_size() {
    let fx = Fixture::new();
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";
    let notebook = json!({
        "cells": [
            {"cell_type": "markdown", "id": "m1", "metadata": {},
             "attachments": {
                "chart.png": {"image/png": png},
                "notes.svg": {"image/svg+xml": ["<svg>", "</svg>"], "text/plain": "notes"}
             },
             "source": ["The chart:\n", "![chart](attachment:chart.png)"]},
            {"cell_type": "markdown", "id": "m2", "metadata": {}, "attachments": {},
             "source": "No pictures."}
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5
    });
    fx.put("pasted.ipynb", &serde_json::to_string_pretty(&notebook).unwrap());
    let out = fx.ok("read", json!({"path": "pasted.ipynb"})).await;
    expect![[r#"
        [`pasted.ipynb`: a Jupyter notebook (nbformat 4.5), 2 cells, shown as cells; `offset` and `limit` count cells. `edit` and `write` change its JSON: read it with `raw: true` to see the text to edit]
        <cell 1 id="m1" type="markdown">
        The chart:
        ![chart](attachment:chart.png)
        [attachment `chart.png`: image/png, 70 bytes, not shown]
        [attachment `notes.svg`: image/svg+xml, 11 bytes; text/plain, 5 bytes, not shown]
        </cell>
        <cell 2 id="m2" type="markdown">
        No pictures.
        </cell>"#]]
    .assert_eq(&out);
    assert!(!out.contains("iVBOR"));
}
