//! The configured values of a tool that may be secrets, in every form they take on the
//! wire, to be kept out of what a response echoes back (a redirect's target).
//!
//! Whoever loads the configuration expands `${VAR}` before this crate sees it, so a value
//! from the environment cannot be told from one written in the file. Every value the
//! configuration puts into a URL's query or user info, or into a header, is therefore
//! taken as possibly secret: an API key in `?key=${API_KEY}` and a token in
//! `Authorization: Bearer ${TOKEN}` are. A URL's path is not: it names the resource, and
//! messages show it (never the query).

use crate::template::{Template, encode};

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

    /// A URL template's user info and query values (`https://user:key@host/p?key=abc`).
    pub(crate) fn url(&mut self, url: &str) {
        let (before_query, query) = url.split_once('?').unwrap_or((url, ""));
        let authority = before_query.split_once("://").map_or("", |(_, rest)| rest);
        let authority = authority.split(['/', '#']).next().unwrap_or_default();
        if let Some((user_info, _)) = authority.rsplit_once('@') {
            for part in user_info.split(':') {
                self.template(&Template::parse(part));
            }
        }
        let query = query.split('#').next().unwrap_or_default();
        for pair in query.split('&') {
            let value = pair.split_once('=').map_or(pair, |(_, value)| value);
            self.template(&Template::parse(value));
        }
    }

    /// The values in every form they take on the wire (as written, percent-encoded as a
    /// URL component, as a URL parser writes them in a query or a path, form-encoded),
    /// longest first.
    pub(crate) fn into_forms(self) -> Vec<String> {
        let mut forms: Vec<String> = self.values.iter().flat_map(|v| wire_forms(v)).collect();
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        forms
    }
}

/// `value` as written and in each form a URL or a form body gives it.
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
    forms.retain(|form| !form.is_empty());
    forms.sort();
    forms.dedup();
    forms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_has_the_forms_urls_give_it() {
        assert_eq!(
            wire_forms("s3cr3t/k=y z'1"),
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
    fn configured_parts_of_urls_and_headers_are_collected() {
        let mut secrets = Secrets::default();
        secrets.url("https://ak:p4ss@h/v1/pathpart?key=k3y-value&q=${parameters.q}&n=1#frag");
        secrets.template(&Template::parse("Bearer t0ken-${parameters.x}"));
        assert_eq!(
            secrets.values,
            ["p4ss", "k3y-value", "Bearer t0ken-", "t0ken-"],
            "the path, short values and placeholders are not secrets"
        );
    }
}
