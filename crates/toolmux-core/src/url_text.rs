//! Text meant as a URL, shown in messages without what may be a credential.

/// Text that was meant as a URL but does not parse as one, as a message may show it:
/// without what may be user info, up to its query or fragment, its control characters
/// escaped, and cut at `max_bytes` (on a character boundary, `…` marking the cut). A
/// password may hold `/`, `?`, `#` or `@`, so all up to the text's last `@` (after its
/// scheme's `://`) may be user info and is left out, even where it was a path's `@`. A URL
/// that parses is shown by its own parts instead (without user name, password, query and
/// fragment); this is for the text around which no parts can be told.
pub fn unparsed_url_for_messages(text: &str, max_bytes: usize) -> String {
    let (scheme, rest) = match scheme_end(text) {
        Some(at) => text.split_at(at),
        None => ("", text),
    };
    let rest = match rest.rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let mut shown = String::with_capacity(scheme.len() + rest.len());
    for c in scheme.chars().chain(rest.chars()) {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    if shown.len() <= max_bytes {
        return shown;
    }
    let mut cut = max_bytes;
    while !shown.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &shown[..cut])
}

/// Where the text after a leading `scheme://` starts, if the text begins with one (a
/// scheme is a letter, then letters, digits, `+`, `-` or `.`): a `://` further on, in a
/// query say, starts no scheme.
fn scheme_end(text: &str) -> Option<usize> {
    let colon = text.find("://")?;
    let scheme = &text[..colon];
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let valid = first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(colon + "://".len())
}

#[cfg(test)]
mod tests {
    use super::unparsed_url_for_messages as shown;

    #[test]
    fn unparsed_urls_show_no_user_info_query_or_control_characters() {
        assert_eq!(
            shown("https://user:s3cret@gateway.test:99999/v1\tx?token=s3cret", 200),
            "https://gateway.test:99999/v1\\tx"
        );
        assert_eq!(shown("http://sk-s3cret@[::1/x#s3cret", 200), "http://[::1/x");
        // All up to the last `@` may be user info: a password may hold `@` too.
        assert_eq!(shown("http://[::1\u{7}@x/a@b", 200), "http://b");
        assert_eq!(shown("http://[bad\u{1b}[31m", 200), "http://[bad\\u{1b}[31m");
        assert_eq!(shown("tok3n@host:1/x", 200), "host:1/x");
        // A password may hold `/`, `?` or `#`: none of it is shown.
        assert_eq!(shown("https://user:pa/ss@collector:4318", 200), "https://collector:4318");
        assert_eq!(
            shown("https://user:S3cr3tPass#1@collector:4318", 200),
            "https://collector:4318"
        );
        assert_eq!(
            shown("https://user:p?w=s3cret@collector:4318/v1", 200),
            "https://collector:4318/v1"
        );
        // A `://` in the query starts no scheme.
        assert_eq!(shown("tok3n@host:1/x?r=http://a", 200), "host:1/x");
        let long = shown(&format!("http://[{}", "é".repeat(1000)), 201);
        assert_eq!(long.len(), 200 + '…'.len_utf8(), "{long}");
    }
}
