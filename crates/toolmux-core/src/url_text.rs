//! Text meant as a URL, shown in messages without what may be a credential.

/// Text that was meant as a URL but does not parse as one, as a message may show it: up
/// to its query or fragment, without what may be user info (up to the last `@` in the
/// authority, the part after `://` up to the first `/`), its control characters escaped,
/// and cut at `max_bytes` (on a character boundary, `…` marking the cut). A URL that
/// parses is shown by its own parts instead (without user name, password, query and
/// fragment); this is for the text around which no parts can be told.
pub fn unparsed_url_for_messages(text: &str, max_bytes: usize) -> String {
    let text = text.split(['?', '#']).next().unwrap_or_default();
    let (scheme, rest) = match text.find("://") {
        Some(at) => text.split_at(at + "://".len()),
        None => ("", text),
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let rest = match authority.rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
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
        assert_eq!(shown("http://[::1\u{7}@x/a@b", 200), "http://x/a@b");
        assert_eq!(shown("http://[bad\u{1b}[31m", 200), "http://[bad\\u{1b}[31m");
        assert_eq!(shown("tok3n@host:1/x", 200), "host:1/x");
        let long = shown(&format!("http://[{}", "é".repeat(1000)), 201);
        assert_eq!(long.len(), 200 + '…'.len_utf8(), "{long}");
    }
}
