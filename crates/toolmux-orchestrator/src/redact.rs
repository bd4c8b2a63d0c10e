//! Secrets from `${ENV}` expansion, replaced by `[redacted]` wherever text leaves the
//! pipeline: outputs, errors, logs, stored outputs.

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_longest_first() {
        let r = Redactor::new(["abcd".to_owned(), "abcdef".to_owned(), "x".to_owned()]);
        assert_eq!(r.redact("token abcdef and abcd, x"), "token [redacted] and [redacted], x");
        assert!(matches!(r.redact("clean"), Cow::Borrowed(_)));
    }
}
