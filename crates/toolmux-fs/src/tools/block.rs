//! The block of code around a line, by indentation (`read` with `anchor_line`): the lines
//! that open the enclosing block (its header, with the comments and attributes right
//! above it), its body, and a closing line at the header's indentation (`}`, `end`, ...).
//! Works for any language that indents its blocks, without parsing it.

/// Columns a tab stands for.
const TAB: usize = 4;

/// The indentation of `line` in columns; `None` for a blank line.
fn indent(line: &str) -> Option<usize> {
    let mut width = 0;
    for c in line.chars() {
        match c {
            ' ' => width += 1,
            '\t' => width += TAB - width % TAB,
            c if c.is_whitespace() => width += 1,
            _ => return Some(width),
        }
    }
    None
}

/// Whether `line` (trimmed) ends a block opened at its indentation.
fn closes(line: &str) -> bool {
    let line = line.trim();
    line.starts_with(['}', ')', ']'])
        || line.starts_with("</")
        || ["end", "fi", "done", "esac", "endif", "endfor", "endwhile", "until"].iter().any(
            |word| {
                line == *word
                    || line.starts_with(&format!("{word} "))
                    || line.starts_with(&format!("{word};"))
            },
        )
}

/// Whether `line` (trimmed) belongs to the item below it: a comment or an attribute.
fn attached(line: &str) -> bool {
    let line = line.trim_start();
    ["@", "#[", "#!", "//", "/*", "*", "#", "--", ";;", "\"\"\"", "'''"]
        .iter()
        .any(|start| line.starts_with(start))
}

/// The 0-based first and last line of the block around line `anchor` (0-based), going
/// `levels` blocks outward (1: the block the line is in; 0: the block the line opens).
/// `None` when every line is blank.
pub(crate) fn around(lines: &[&str], anchor: usize, levels: usize) -> Option<(usize, usize)> {
    let anchor = anchor.min(lines.len().checked_sub(1)?);
    // A blank anchor stands for the next line with text, else the one before.
    let anchor = (anchor..lines.len())
        .find(|&i| indent(lines[i]).is_some())
        .or_else(|| (0..anchor).rev().find(|&i| indent(lines[i]).is_some()))?;
    let mut header = anchor;
    let mut width = indent(lines[anchor])?;
    for _ in 0..levels {
        let outer = (0..header).rev().find_map(|i| {
            let w = indent(lines[i])?;
            (w < width).then_some((i, w))
        });
        match outer {
            Some((i, w)) => {
                header = i;
                width = w;
                // An opening brace on a line of its own: the header is the line above.
                if lines[i].trim() == "{"
                    && let Some(above) = (0..i).rev().find(|&j| indent(lines[j]).is_some())
                    && indent(lines[above]) == Some(w)
                {
                    header = above;
                }
            }
            None => break,
        }
    }
    // The comments and attributes right above the header.
    let mut start = header;
    while start > 0 && indent(lines[start - 1]) == Some(width) && attached(lines[start - 1]) {
        start -= 1;
    }
    // The body: what is indented deeper than the header (blank lines within it too); an
    // opening brace on a line of its own belongs to the header.
    let mut end = header;
    let mut at = header + 1;
    if at < lines.len() && indent(lines[at]) == Some(width) && lines[at].trim() == "{" {
        end = at;
        at += 1;
    }
    while at < lines.len() {
        match indent(lines[at]) {
            None => {}
            Some(w) if w > width => end = at,
            Some(_) => {
                if closes(lines[at]) {
                    end = at;
                }
                break;
            }
        }
        at += 1;
    }
    Some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PYTHON: &str = "import os\n\n# A greeter.\n@dataclass\nclass Greeter:\n    name: str\n\n    def greet(self):\n        text = f\"hi {self.name}\"\n\n        return text\n\n    def bye(self):\n        return 'bye'\n\nprint(1)\n";

    fn block(text: &str, anchor_line: usize, levels: usize) -> String {
        let lines: Vec<&str> = text.lines().collect();
        let (start, end) = around(&lines, anchor_line - 1, levels).expect("a block");
        format!("{}-{}", start + 1, end + 1)
    }

    #[test]
    fn the_enclosing_blocks_of_python() {
        // In `greet`'s body: `greet`, blank lines inside included, not the one after.
        assert_eq!(block(PYTHON, 9, 1), "8-11");
        // One level further out: the class, with its decorator and comment.
        assert_eq!(block(PYTHON, 9, 2), "3-14");
        // Levels beyond the top stop at the top.
        assert_eq!(block(PYTHON, 9, 9), "3-14");
        // On a header itself, level 0: what it opens.
        assert_eq!(block(PYTHON, 13, 0), "13-14");
        // A blank anchor stands for the next line with text.
        assert_eq!(block(PYTHON, 10, 1), "8-11");
        // A top-level statement is a block of its own.
        assert_eq!(block(PYTHON, 16, 1), "16-16");
    }

    #[test]
    fn braces_close_their_blocks() {
        let rust = "/// Adds.\n#[inline]\nfn add(a: i32, b: i32) -> i32 {\n    let c = a + b;\n    c\n}\n\nfn other() {}\n";
        assert_eq!(block(rust, 4, 1), "1-6");
        let allman = "void f()\n{\n    int x = 1;\n    g(x);\n}\nint y;\n";
        assert_eq!(block(allman, 3, 1), "1-5");
        let ruby = "def hi\n  puts 'hi'\nend\nhi\n";
        assert_eq!(block(ruby, 2, 1), "1-3");
        let tabs = "fn main() {\n\tif x {\n\t\ty();\n\t}\n}\n";
        assert_eq!(block(tabs, 3, 1), "2-4");
        assert_eq!(block(tabs, 3, 2), "1-5");
    }

    #[test]
    fn blank_files_have_no_block() {
        assert_eq!(around(&["", "  "], 0, 1), None);
        assert_eq!(around(&[], 0, 1), None);
    }
}
