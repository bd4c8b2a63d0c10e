//! JSON with comments and trailing commas (VS Code's `mcp.json`) turned into plain JSON
//! of the same length, so that line and column numbers of errors stay right.

/// `text` with `//` and `/* */` comments and trailing commas blanked out.
pub(crate) fn to_json(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out: Vec<u8> = bytes.to_vec();
    let mut i = 0;
    // Index in `out` of a comma seen since the last value, which becomes a trailing comma
    // when the next significant byte closes an object or array.
    let mut pending_comma: Option<usize> = None;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                pending_comma = None;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    out[i] = b' ';
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                let start = i;
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                let end = (i + 2).min(bytes.len());
                for b in &mut out[start..end] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = end;
            }
            b',' => {
                pending_comma = Some(i);
                i += 1;
            }
            b'}' | b']' => {
                if let Some(comma) = pending_comma.take() {
                    out[comma] = b' ';
                }
                i += 1;
            }
            b if b.is_ascii_whitespace() => i += 1,
            _ => {
                pending_comma = None;
                i += 1;
            }
        }
    }
    // Only ASCII bytes outside strings were replaced by spaces, so the text stays UTF-8;
    // multi-byte characters inside comments are blanked byte by byte, which is fine.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::to_json;

    #[test]
    fn comments_and_trailing_commas() {
        let text =
            "{\n  // servers\n  \"a\": [1, 2,], /* x\n y */ \"b\": \"//not a comment, \",\n}";
        let json = to_json(text);
        assert_eq!(json.len(), text.len());
        assert_eq!(json.lines().count(), text.lines().count());
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value, serde_json::json!({"a": [1, 2], "b": "//not a comment, "}));
    }

    #[test]
    fn utf8_in_comments() {
        let json = to_json("{\"a\": 1 // é\n}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&json).unwrap()["a"], 1);
    }
}
