//! The configured values of a tool that may be secrets, in every form they take on the
//! wire, to be kept out of what the crate shows: a redirect's target, an error's URL, an
//! error response's excerpt, the provider's `Debug` output.
//!
//! Whoever loads the configuration expands `${VAR}` before this crate sees it, so a value
//! from the environment cannot be told from one written in the file. A loader that knows
//! the values it took from the environment hands them over
//! ([`crate::RestProvider::with_secrets`]), and they are redacted wherever they stand.
//! With or without them, every value the configuration puts into a URL's query, user info or
//! fragment, or into a header, is taken as possibly secret: an API key in
//! `?key=${API_KEY}` and a token in `Authorization: Bearer ${TOKEN}` are. A URL's path
//! names the resource and messages show it, so of the path only the configured pieces
//! that look like credentials are ([`looks_like_credential`]): the bot token of
//! `https://api.example/bot${TOKEN}/sendMessage` is, `v1` and `sendMessage` are not.

use crate::template::{Template, encode};
use serde_json::Value;
use toolmux_core::{ContentPart, ToolOutput};

/// Values shorter than this are not redacted: they would mangle ordinary text (`1`, `en`)
/// and are no secrets anyway (the orchestrator's redactor draws the same line).
const SHORTEST: usize = 4;

/// A collector of possibly secret values.
#[derive(Debug, Default)]
pub(crate) struct Secrets {
    values: Vec<String>,
}

impl Secrets {
    /// A configured value, taken whole.
    pub(crate) fn value(&mut self, value: &str) {
        if value.len() >= SHORTEST {
            self.values.push(value.to_owned());
        }
    }

    /// The text a template writes around its `${parameters.…}` placeholders (the parts the
    /// configuration gave): each piece whole, and its last word, the credential of
    /// `Bearer abc` or `token abc`.
    pub(crate) fn template(&mut self, template: &Template) {
        for text in template.texts() {
            self.value(text);
            if let Some((_, last)) = text.trim().rsplit_once(char::is_whitespace) {
                self.value(last);
            }
        }
    }

    /// A URL template's user info, query values and fragment
    /// (`https://user:key@host/p?key=abc#x`), and the pieces of its path that look like
    /// credentials (`/bot123456:AAHdq…/sendMessage`).
    pub(crate) fn url(&mut self, url: &str) {
        let (before_fragment, fragment) = url.split_once('#').unwrap_or((url, ""));
        let (before_query, query) =
            before_fragment.split_once('?').unwrap_or((before_fragment, ""));
        let (authority, path) = match before_query.split_once("://") {
            Some((_, rest)) => rest.split_at(rest.find('/').unwrap_or(rest.len())),
            None => ("", before_query),
        };
        if let Some((user_info, _)) = authority.rsplit_once('@') {
            for part in user_info.split(':') {
                self.template(&Template::parse(part));
            }
        }
        for segment in path.split('/') {
            for piece in Template::parse(segment).texts() {
                if looks_like_credential(piece) {
                    self.value(piece);
                }
            }
        }
        for pair in query.split('&') {
            let value = pair.split_once('=').map_or(pair, |(_, value)| value);
            self.template(&Template::parse(value));
        }
        self.template(&Template::parse(fragment));
    }

    /// The values in every form they take on the wire (as written, percent-encoded as a
    /// URL component, as a URL parser writes them in a query or a path, form-encoded) and
    /// as JSON encoders quote them in a body (`\u002B`, `\/`), longest first.
    pub(crate) fn into_forms(self) -> Vec<String> {
        let mut forms: Vec<String> = self.values.iter().flat_map(|v| wire_forms(v)).collect();
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        forms
    }
}

/// `value` as written, in each form a URL or a form body gives it, and as JSON encoders
/// write it in a string.
pub(crate) fn wire_forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_owned(), encode(value), encode(value).replace("%20", "+")];
    // What a URL parser leaves of it in a query and in a path: only some characters are
    // encoded there (`'` and a space in a query, `?` in a path), the rest kept.
    if let Ok(url) = reqwest::Url::parse(&format!("http://h/?{value}"))
        && let Some(query) = url.query()
    {
        forms.push(query.to_owned());
    }
    if let Ok(url) = reqwest::Url::parse(&format!("http://h/{}", value.replace('?', "%3F"))) {
        forms.push(url.path().trim_start_matches('/').to_owned());
    }
    forms.extend(json_forms(value));
    forms.retain(|form| !form.is_empty());
    forms.sort();
    forms.dedup();
    forms
}

/// How JSON encoders write `value` inside a string, where an API's error body quotes it:
/// `"` and `\` always escaped, and the characters each common encoder escapes besides as
/// `\uXXXX` (in its case of hex digits) or `\/`. .NET escapes `+ & < > ' \`` and all
/// beyond ASCII (upper hex); Go and Rails `< > &`, Gson `< > & = '` (lower hex); PHP `/`
/// as `\/` and beyond ASCII; Python beyond ASCII. The last two forms escape all of them.
fn json_forms(value: &str) -> Vec<String> {
    fn beyond(c: char) -> bool {
        !c.is_ascii()
    }
    fn all(c: char) -> bool {
        "+&<>'=/`".contains(c) || !c.is_ascii()
    }
    let styles = [
        JsonStyle { escaped: |_| false, upper: false, slash: false },
        JsonStyle { escaped: |c| "+&<>'`".contains(c) || !c.is_ascii(), upper: true, slash: false },
        JsonStyle { escaped: |c| "<>&".contains(c), upper: false, slash: false },
        JsonStyle { escaped: |c| "<>&='".contains(c), upper: false, slash: false },
        JsonStyle { escaped: beyond, upper: false, slash: true },
        JsonStyle { escaped: beyond, upper: false, slash: false },
        JsonStyle { escaped: all, upper: true, slash: false },
        JsonStyle { escaped: all, upper: false, slash: false },
    ];
    styles.iter().map(|style| style.write(value)).filter(|form| form != value).collect()
}

/// How one JSON encoder writes a string's contents.
struct JsonStyle {
    /// The characters written as `\uXXXX` (UTF-16, a pair beyond the basic plane), beside
    /// the control characters every encoder escapes.
    escaped: fn(char) -> bool,
    /// Upper-case hex digits.
    upper: bool,
    /// `/` written as `\/`.
    slash: bool,
}

impl JsonStyle {
    fn write(&self, value: &str) -> String {
        let mut out = String::with_capacity(value.len());
        for c in value.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '/' if self.slash => out.push_str("\\/"),
                c if (self.escaped)(c) || c.is_control() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        if self.upper {
                            out.push_str(&format!("\\u{unit:04X}"));
                        } else {
                            out.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                }
                c => out.push(c),
            }
        }
        out
    }
}

/// Whether a piece of a configured path looks like a credential rather than a name: at
/// least 16 characters with both letters and digits (a bot token `123456:AAHdq…`, an API
/// key, a long hexadecimal id). Names (`v1`, `sendMessage`, `chat-completions`) do not.
/// A long numeric-and-letter id written into the configuration is caught too; it is only
/// hidden from what the crate shows, never changed in the request.
pub(crate) fn looks_like_credential(piece: &str) -> bool {
    piece.chars().count() >= 16
        && piece.chars().any(|c| c.is_ascii_digit())
        && piece.chars().any(|c| c.is_alphabetic())
}

/// `text` with each of `secrets` replaced by `REDACTED`, longest first, so that a secret
/// containing another is replaced whole.
pub(crate) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut secrets: Vec<&str> =
        secrets.iter().map(String::as_str).filter(|s| !s.is_empty()).collect();
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets.iter().fold(text.to_owned(), |text, secret| {
        if text.contains(secret) { text.replace(secret, "REDACTED") } else { text }
    })
}

/// `output` with each of `secrets` replaced by `REDACTED` wherever it holds text: text
/// parts, a resource's text, and every string (and object key) of its JSON parts,
/// structured content and extras.
pub(crate) fn scrub_output(output: &mut ToolOutput, secrets: &[String]) {
    for part in &mut output.content {
        match part {
            ContentPart::Text { text } | ContentPart::Resource { text: Some(text), .. } => {
                *text = scrub(text, secrets);
            }
            ContentPart::Json { value } => scrub_value(value, secrets),
            _ => {}
        }
    }
    if let Some(structured) = output.structured.as_mut() {
        scrub_value(structured, secrets);
    }
    for value in output.extras.values_mut() {
        scrub_value(value, secrets);
    }
}

fn scrub_value(value: &mut Value, secrets: &[String]) {
    match value {
        Value::String(text) => *text = scrub(text, secrets),
        Value::Array(items) => items.iter_mut().for_each(|item| scrub_value(item, secrets)),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (key, mut item) in entries {
                scrub_value(&mut item, secrets);
                map.insert(scrub(&key, secrets), item);
            }
        }
        _ => {}
    }
}

/// The wire forms of `values` (see [`Secrets::into_forms`]), each taken whole.
pub(crate) fn forms_of<I, S>(values: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut secrets = Secrets::default();
    for value in values {
        secrets.value(value.as_ref());
    }
    secrets.into_forms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_has_the_forms_urls_give_it() {
        let url_forms: Vec<String> =
            wire_forms("s3cr3t/k=y z'1").into_iter().filter(|f| !f.contains('\\')).collect();
        assert_eq!(
            url_forms,
            [
                "s3cr3t%2Fk%3Dy%20z%271",
                "s3cr3t%2Fk%3Dy+z%271",
                "s3cr3t/k=y z'1",
                "s3cr3t/k=y%20z%271",
                "s3cr3t/k=y%20z'1",
            ]
        );
    }

    #[test]
    fn a_value_has_the_forms_json_encoders_give_it() {
        let forms = wire_forms("sk+live/Secret=Value&x\"é😀");
        for form in [
            r#"sk\u002Blive/Secret=Value\u0026x\"\u00E9\uD83D\uDE00"#,
            r#"sk+live\/Secret=Value&x\"\u00e9\ud83d\ude00"#,
            r#"sk+live/Secret\u003dValue\u0026x\"é😀"#,
            r#"sk+live/Secret=Value\u0026x\"é😀"#,
            r#"sk\u002blive\u002fSecret\u003dValue\u0026x\"\u00e9\ud83d\ude00"#,
        ] {
            assert!(forms.iter().any(|f| f == form), "{form} not among {forms:#?}");
        }
    }

    #[test]
    fn configured_parts_of_urls_and_headers_are_collected() {
        let mut secrets = Secrets::default();
        secrets.url("https://ak:p4ss@h/v1/pathpart?key=k3y-value&q=${parameters.q}&n=1#frag");
        secrets.template(&Template::parse("Bearer t0ken-${parameters.x}"));
        assert_eq!(
            secrets.values,
            ["p4ss", "k3y-value", "frag", "Bearer t0ken-", "t0ken-"],
            "names in the path, short values and placeholders are not secrets"
        );
    }

    #[test]
    fn path_pieces_that_look_like_credentials_are_collected() {
        let mut secrets = Secrets::default();
        secrets.url(
            "https://h/bot123456:AAHdqTcvCH1vGWJx/sendMessage/${parameters.chat}/\
             k-${parameters.x}-0123456789abcdef0123/chatCompletionsForModels",
        );
        assert_eq!(secrets.values, ["bot123456:AAHdqTcvCH1vGWJx", "-0123456789abcdef0123"]);
    }

    #[test]
    fn scrubbing_replaces_the_longest_secret_first() {
        let secrets = ["abcd".to_owned(), "abcdefgh".to_owned()];
        assert_eq!(scrub("x/abcdefgh/abcd", &secrets), "x/REDACTED/REDACTED");
    }
}
