//! Secrets from `${ENV}` expansion, replaced by `[redacted]` wherever text leaves the
//! pipeline: outputs, errors, logs, stored outputs.

use serde_json::Value;
use std::borrow::Cow;

/// Replaces known secret values in text.
#[derive(Debug, Default)]
pub struct Redactor {
    // Invariant: longest first, so a secret containing another is replaced whole.
    secrets: Vec<String>,
}

impl Redactor {
    /// A redactor for `secrets`; values shorter than 4 characters are ignored (they would
    /// mangle ordinary text and are not secret anyway).
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| s.len() >= 4).collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Redactor { secrets }
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret replaced.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), "[redacted]"));
            }
        }
        out
    }

    /// Replaces every secret in the strings of `value`, object keys included.
    pub fn redact_json(&self, value: &mut Value) {
        if self.secrets.is_empty() {
            return;
        }
        match value {
            Value::String(text) => self.redact_in_place(text),
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_json(item)),
            Value::Object(map) => {
                if map.keys().any(|key| matches!(self.redact(key), Cow::Owned(_))) {
                    let entries = std::mem::take(map);
                    for (key, item) in entries {
                        map.insert(self.redact(&key).into_owned(), item);
                    }
                }
                map.values_mut().for_each(|item| self.redact_json(item));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// Replaces every secret in `text`, leaving it untouched (no copy) when there is none.
    pub fn redact_in_place(&self, text: &mut String) {
        if let Cow::Owned(clean) = self.redact(text) {
            *text = clean;
        }
    }
}

impl Redactor {
    /// Text that arrives in pieces, redacted before it is passed on: `more` is added to
    /// `pending` (what came before and was held back), and what can be passed on is
    /// returned redacted. What could still turn out to be part of a secret (the end of
    /// `pending` that begins one, or a whole secret across that point) is held back in
    /// `pending` until more comes; with `end`, everything is passed on.
    pub fn pass_on(&self, pending: &mut String, more: &str, end: bool) -> String {
        pending.push_str(more);
        if self.secrets.is_empty() || end {
            let text = std::mem::take(pending);
            return self.redact(&text).into_owned();
        }
        let mut cut = pending.len();
        loop {
            // The longest end of what would be passed on that begins a secret.
            let head = &pending[..cut];
            let held = self
                .secrets
                .iter()
                .flat_map(|secret| {
                    (1..secret.len())
                        .rev()
                        .filter(|&k| secret.is_char_boundary(k) && head.ends_with(&secret[..k]))
                        .take(1)
                })
                .max()
                .unwrap_or(0);
            let mut next = cut - held;
            // A whole secret across the cut is held back whole.
            for secret in &self.secrets {
                for (start, _) in pending.match_indices(secret.as_str()) {
                    if start < next && start + secret.len() > next {
                        next = start;
                    }
                }
            }
            if next == cut {
                break;
            }
            cut = next;
        }
        let rest = pending.split_off(cut);
        let passed = std::mem::replace(pending, rest);
        self.redact(&passed).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pieces` passed on one by one, then the end.
    fn streamed(r: &Redactor, pieces: &[&str]) -> (Vec<String>, String) {
        let mut pending = String::new();
        let mut out: Vec<String> =
            pieces.iter().map(|p| r.pass_on(&mut pending, p, false)).collect();
        out.push(r.pass_on(&mut pending, "", true));
        let whole = out.concat();
        (out, whole)
    }

    #[test]
    fn a_secret_split_across_pieces_is_redacted_whole() {
        let r = Redactor::new(["s3cr3t-value".to_owned(), "cdxy".to_owned(), "abcd".to_owned()]);
        let (out, whole) = streamed(&r, &[r#"{"token": "s3c"#, "r3t-", r#"value", "n": 1}"#]);
        assert_eq!(whole, r#"{"token": "[redacted]", "n": 1}"#);
        assert!(out.iter().all(|piece| !piece.contains("s3c")), "{out:?}");
        assert_eq!(out[0], r#"{"token": ""#, "held back from where the secret may begin");
        // A secret whose end begins another is held back whole.
        let (out, whole) = streamed(&r, &["zzab", "cdx", "q"]);
        assert_eq!(whole, "zz[redacted]xq");
        assert!(out.iter().all(|piece| !piece.contains("ab") || piece.contains("[redacted]")));
        // Every split of a text reads the same as the whole text redacted.
        let text = "key=s3cr3t-value; abcdxy and abc s3cr3t-valu";
        for cut in 1..text.len() {
            let (_, whole) = streamed(&r, &[&text[..cut], &text[cut..]]);
            assert_eq!(whole, r.redact(text), "cut at {cut}");
        }
        // Without secrets, everything passes at once.
        let none = Redactor::default();
        let mut pending = String::new();
        assert_eq!(none.pass_on(&mut pending, "abc", false), "abc");
        assert!(pending.is_empty());
    }

    #[test]
    fn json_is_redacted_in_every_string_and_key() {
        let r = Redactor::new(["s3cr3t-value".to_owned()]);
        let mut value = serde_json::json!({
            "next": "https://api/x?api_key=s3cr3t-value&page=2",
            "s3cr3t-value": [1, "a s3cr3t-value b", {"deep": ["s3cr3t-value"]}],
            "n": 3, "ok": true, "none": null
        });
        r.redact_json(&mut value);
        assert_eq!(
            value,
            serde_json::json!({
                "next": "https://api/x?api_key=[redacted]&page=2",
                "[redacted]": [1, "a [redacted] b", {"deep": ["[redacted]"]}],
                "n": 3, "ok": true, "none": null
            })
        );
    }

    #[test]
    fn redacts_longest_first() {
        let r = Redactor::new(["abcd".to_owned(), "abcdef".to_owned(), "x".to_owned()]);
        assert_eq!(r.redact("token abcdef and abcd, x"), "token [redacted] and [redacted], x");
        assert!(matches!(r.redact("clean"), Cow::Borrowed(_)));
    }
}
