//! A YAML file's flow collections (`[..]`, `{..}`) nested too deep, refused before parsing.
//!
//! The YAML parser's time grows with the square of the flow nesting before it stops at
//! its recursion limit: 20 000 `{a: ` took 13 s (debug build) to be told `recursion limit
//! exceeded`, and a 200 KB file would take minutes. Block nesting (indentation, `- - -`)
//! stops at the limit at once, so only flow collections are counted here. No
//! configuration needs more than a few levels.

/// The deepest flow nesting accepted: far beyond any hand-written configuration, far below
/// where parsing gets slow.
pub(super) const MAX_FLOW_DEPTH: usize = 256;

/// The 1-based line and column of the `[` or `{` that opens a flow collection nested deeper
/// than [`MAX_FLOW_DEPTH`] in YAML `text`, `None` when there is none.
///
/// A cheap byte scan: brackets in quoted scalars and comments are not counted, everything
/// else is, so that a bracket in a plain scalar (`ls [a-z]*`) is counted too. It errs
/// toward counting, never past a real opening bracket.
pub(super) fn too_deep(text: &str) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let (mut depth, mut line, mut line_start) = (0usize, 1usize, 0usize);
    // The byte before the current one that is not a space or tab, or `\n` at a line start:
    // a quote opens a quoted scalar only where a scalar may begin.
    let mut previous = b'\n';
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        match byte {
            b'\n' => {
                line += 1;
                line_start = i + 1;
            }
            b'#' if previous == b'\n' || matches!(bytes[i - 1], b' ' | b'\t') => {
                // A comment runs to the end of its line.
                i = memchr(b'\n', bytes, i).unwrap_or(bytes.len());
                continue;
            }
            b'"' | b'\'' if matches!(previous, b'\n' | b'[' | b'{' | b',' | b':' | b'-' | b'?') => {
                // The quoted scalar's end, counting its lines; an unclosed one runs to the
                // end (the parser tells of it).
                let mut j = i + 1;
                while j < bytes.len() {
                    match bytes[j] {
                        b'\\' if byte == b'"' => j += 1,
                        b'\'' if byte == b'\'' && bytes.get(j + 1) == Some(&b'\'') => j += 1,
                        b'\n' => {
                            line += 1;
                            line_start = j + 1;
                        }
                        b if b == byte => break,
                        _ => {}
                    }
                    j += 1;
                }
                i = j + 1;
                previous = byte;
                continue;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > MAX_FLOW_DEPTH {
                    let column = text[line_start..i].chars().count() + 1;
                    return Some((line, column));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if !matches!(byte, b' ' | b'\t') {
            previous = byte;
        }
        i += 1;
    }
    None
}

/// The index of the first `needle` in `bytes` at or after `from`.
fn memchr(needle: u8, bytes: &[u8], from: usize) -> Option<usize> {
    bytes[from..].iter().position(|&b| b == needle).map(|at| from + at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(open: &str, close: &str, depth: usize) -> String {
        format!("fs: {}1{}\n", open.repeat(depth), close.repeat(depth))
    }

    #[test]
    fn the_limit_is_counted_in_flow_mappings_and_sequences() {
        assert_eq!(too_deep(&nested("{a: ", "}", MAX_FLOW_DEPTH)), None);
        assert_eq!(too_deep(&nested("[", "]", MAX_FLOW_DEPTH)), None);
        // The 257th `{a: ` starts at byte 4 + 256 * 4.
        assert_eq!(too_deep(&nested("{a: ", "}", MAX_FLOW_DEPTH + 1)), Some((1, 1029)));
        assert_eq!(too_deep(&nested("[", "]", MAX_FLOW_DEPTH + 1)), Some((1, 261)));
    }

    #[test]
    fn closed_collections_do_not_add_up() {
        let text = "a: [1, 2]\n".repeat(10 * MAX_FLOW_DEPTH);
        assert_eq!(too_deep(&text), None);
    }

    #[test]
    fn brackets_in_quotes_and_comments_are_not_counted() {
        let deep = "[".repeat(MAX_FLOW_DEPTH + 1);
        for text in [
            format!("a: \"{deep}\"\n"),
            format!("a: '{deep}'\n"),
            format!("a: 'it''s {deep}'\n"),
            format!("a: \"\\\" {deep}\"\n"),
            format!("# {deep}\n"),
            format!("a: 1 # {deep}\n"),
            format!("a: [\"{deep}\", '{deep}']\n"),
        ] {
            assert_eq!(too_deep(&text), None, "{text}");
        }
    }

    #[test]
    fn the_line_is_counted_across_quoted_scalars() {
        let text = format!("a: \"one\n  two\"\nb: 1\nc: {}\n", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert_eq!(too_deep(&text), Some((4, 4 + MAX_FLOW_DEPTH)));
    }

    #[test]
    fn an_apostrophe_inside_a_plain_scalar_opens_nothing() {
        // Were `'` taken as a quote here, the brackets after it would not be counted.
        let text = format!("a: it's {}\n", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert!(too_deep(&text).is_some());
        let text = format!("a#b: {}\n", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert!(too_deep(&text).is_some(), "a `#` inside a word starts no comment");
    }
}
