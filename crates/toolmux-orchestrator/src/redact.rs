//! Secrets from `${ENV}` expansion, replaced by `[redacted]` wherever text leaves the
//! pipeline: outputs, errors, logs, stored outputs.

use serde_json::Value;
use std::borrow::Cow;

/// What a secret is replaced by.
const REDACTED: &str = "[redacted]";

/// The fewest characters of a secret redacted as a cut piece of it, whatever its length.
const PIECE_MIN_CHARS: usize = 6;

/// The most letters a cut piece may have and still read as an ordinary word (see
/// [`Secret::reads_as_word`]).
const WORD_MAX_CHARS: usize = 12;

/// Replaces known secret values in text, and the pieces of them that text cut before it
/// got here still holds.
///
/// Every output, error and log line of the pipeline passes through it, but the text was
/// often cut before it got here (an MCP server's error body at 200 characters, a preview,
/// a spilled output's excerpt), and a cut can fall inside a secret. So besides whole
/// secrets it replaces a cut piece of one: a proper prefix of a secret that ends where the
/// text ends or where a token ends (the next character is not one the secret could go on
/// with, see [`Secret::continues_with`]), or a proper suffix that begins where the text
/// begins or where a token begins, when the piece has at least
/// max(6, ⌈a third of the secret⌉) characters, so that `s3cr3t-value-1234` left of
/// `s3cr3t-value-123456` goes, while `s3c` or a `-value` in other text stays readable.
/// A piece that reads as an ordinary word (see [`Secret::reads_as_word`]), such as
/// `production` or `password` of `production-db-password`, is left alone: it says little
/// of the secret and may be a word of the text. Anything longer (`production-db`) is
/// redacted even where it was meant as text: a little too much beats half a credential.
#[derive(Debug, Default)]
pub struct Redactor {
    // Invariant: longest first, so a secret containing another is replaced whole.
    secrets: Vec<Secret>,
    /// Any of the shortest pieces of the secrets that have pieces: a text it does not
    /// match holds none of those secrets nor any piece of them, found in one pass (the
    /// regex crate's literal search) where a search per secret and piece took three times
    /// as long as redacting whole secrets alone. `None` when no secret has pieces, or when
    /// the pattern would be too large (every secret is then searched for).
    suspects: Option<regex::Regex>,
}

/// One secret, with the shortest pieces of it that are redacted.
#[derive(Debug)]
struct Secret {
    value: String,
    /// Bytes of the shortest prefix redacted as a piece, or 0 when the secret is too short
    /// for any proper prefix to be (pieces are then never looked for).
    head: usize,
    /// Where the shortest suffix redacted as a piece begins.
    tail: usize,
}

/// Where a text stands in what it was taken from.
#[derive(Clone, Copy, Debug)]
struct Edges {
    /// The text's first character is the first of the whole text (it may have been cut
    /// there, so a secret's suffix may begin it).
    start: bool,
    /// The text's last character is the last of the whole text.
    end: bool,
}

impl Secret {
    fn new(value: String) -> Secret {
        let chars = value.chars().count();
        let min = PIECE_MIN_CHARS.max(chars.div_ceil(3));
        let (head, tail) = if chars > min {
            let byte_at = |n: usize| value.char_indices().nth(n).map_or(value.len(), |(i, _)| i);
            (byte_at(min), byte_at(chars - min))
        } else {
            (0, value.len())
        };
        Secret { value, head, tail }
    }

    /// Whether a token that holds this secret could go on with `c`: letters, digits, `-`,
    /// `_` and whatever else the secret holds but white space (a JWT goes on with `.`, a
    /// base64 key with `+`, `/` and `=`; `s3cr3t-value-1` does not with `.`, `"` or `)`).
    fn continues_with(&self, c: char) -> bool {
        c.is_alphanumeric()
            || c == '-'
            || c == '_'
            || (!c.is_whitespace() && self.value.contains(c))
    }

    /// Whether `piece`, a proper prefix or suffix of the secret whose other side is at
    /// `inner` (the secret's next character after a prefix, or its character before a
    /// suffix), reads as an ordinary word rather than a cut credential: letters only, at
    /// most 12 of them, in one case or capitalised, and a whole word of the secret (it
    /// goes on, on its inner side, with neither a letter nor a digit). `production` of
    /// `production-db-password` does; `productio`, `production-db`, `hunter` of
    /// `hunter22` and `AbCdEfGhIj` of `ghp_AbCdEfGhIj` do not.
    fn reads_as_word(piece: &str, inner: Option<char>) -> bool {
        if inner.is_some_and(char::is_alphanumeric) || piece.chars().count() > WORD_MAX_CHARS {
            return false;
        }
        let mut chars = piece.chars();
        let Some(first) = chars.next() else { return false };
        let rest = chars.as_str();
        first.is_alphabetic()
            && rest.chars().all(char::is_alphabetic)
            && (rest.chars().all(char::is_lowercase) || rest.chars().all(char::is_uppercase))
            && (first.is_uppercase() || rest.chars().all(char::is_lowercase))
    }

    /// The byte ranges of `text` that are cut pieces of this secret (see [`Redactor`]).
    fn pieces(&self, text: &str, edges: Edges, found: &mut Vec<(usize, usize)>) {
        if self.head == 0 {
            return;
        }
        let secret = self.value.as_str();
        // `contains` is the fast search; most texts hold no piece of any secret.
        let head = &secret[..self.head];
        if text.contains(head) {
            for (start, _) in text.match_indices(head) {
                // The longest prefix there, then shorter ones down to the shortest piece,
                // until one ends where a token does.
                let same = common_prefix(&text[start..], secret);
                let mut len = same.min(secret.len() - 1);
                while len >= self.head {
                    if secret.is_char_boundary(len) {
                        let end = start + len;
                        let ended = match text[end..].chars().next() {
                            None => edges.end,
                            Some(next) => !self.continues_with(next),
                        };
                        if ended {
                            let inner = secret[len..].chars().next();
                            if !Secret::reads_as_word(&text[start..end], inner) {
                                found.push((start, end));
                            }
                            break;
                        }
                    }
                    len -= 1;
                }
            }
        }
        let tail = &secret[self.tail..];
        if text.contains(tail) {
            for (at, _) in text.match_indices(tail) {
                let end = at + tail.len();
                let same = common_suffix(&text[..end], secret);
                let mut len = same.min(secret.len() - 1);
                while len >= secret.len() - self.tail {
                    let from = secret.len() - len;
                    if secret.is_char_boundary(from) {
                        let start = end - len;
                        let began = match text[..start].chars().next_back() {
                            None => edges.start,
                            Some(before) => !self.continues_with(before),
                        };
                        if began {
                            let inner = secret[..from].chars().next_back();
                            if !Secret::reads_as_word(&text[start..end], inner) {
                                found.push((start, end));
                            }
                            break;
                        }
                    }
                    len -= 1;
                }
            }
        }
    }
}

/// `secret` as a JSON string holds it, without the quotes.
fn json_escaped(secret: &str) -> Option<String> {
    let quoted = serde_json::to_string(secret).ok()?;
    Some(quoted.strip_prefix('"')?.strip_suffix('"')?.to_owned())
}

/// Bytes `a` and `b` begin with in common, at a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or_else(|| a.len().min(b.len()), |((i, _), _)| i)
}

/// Bytes `a` and `b` end with in common, at a character boundary.
fn common_suffix(a: &str, b: &str) -> usize {
    a.char_indices()
        .rev()
        .zip(b.chars().rev())
        .find(|((_, x), y)| x != y)
        .map_or_else(|| a.len().min(b.len()), |((i, x), _)| a.len() - i - x.len_utf8())
}

impl Redactor {
    /// A redactor for `secrets`; values shorter than 4 characters are ignored (they would
    /// mangle ordinary text and are not secret anyway).
    ///
    /// A secret holding a character that JSON escapes (a PEM key's line breaks, a quote, a
    /// backslash) is also redacted as a JSON string writes it (`\n` for a line break): text
    /// that embeds JSON, such as a server's text part holding its JSON answer, does not
    /// hold the secret as it is.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut secrets: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.len() >= 4)
            .flat_map(|s| {
                let escaped = json_escaped(&s).filter(|escaped| *escaped != s);
                std::iter::once(s).chain(escaped)
            })
            .collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        let secrets: Vec<Secret> = secrets.into_iter().map(Secret::new).collect();
        let pieces: Vec<String> = secrets
            .iter()
            .filter(|s| s.head > 0)
            .flat_map(|s| [&s.value[..s.head], &s.value[s.tail..]])
            .map(regex::escape)
            .collect();
        let suspects =
            if pieces.is_empty() { None } else { regex::Regex::new(&pieces.join("|")).ok() };
        Redactor { secrets, suspects }
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret, and every cut piece of one, replaced.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.redact_within(text, Edges { start: true, end: true })
    }

    /// `text`, which begins and ends as `edges` says, with every secret and every cut
    /// piece of one replaced.
    fn redact_within<'a>(&self, text: &'a str, edges: Edges) -> Cow<'a, str> {
        // A secret with pieces holds its shortest prefix: where none is, neither it is.
        let suspect = self.suspects.as_ref().is_none_or(|suspects| suspects.is_match(text));
        let mut out = Cow::Borrowed(text);
        for secret in &self.secrets {
            if (secret.head == 0 || suspect) && out.contains(secret.value.as_str()) {
                out = Cow::Owned(out.replace(secret.value.as_str(), REDACTED));
            }
        }
        let mut found = Vec::new();
        if suspect {
            for secret in &self.secrets {
                secret.pieces(&out, edges, &mut found);
            }
        }
        if found.is_empty() {
            return out;
        }
        // Pieces of different secrets may overlap: each run of overlapping ones goes whole.
        found.sort_unstable();
        let mut runs: Vec<(usize, usize)> = Vec::with_capacity(found.len());
        for (start, end) in found {
            match runs.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => runs.push((start, end)),
            }
        }
        let mut clean = String::with_capacity(out.len());
        let mut done = 0;
        for (start, end) in runs {
            clean.push_str(&out[done..start]);
            clean.push_str(REDACTED);
            done = end;
        }
        clean.push_str(&out[done..]);
        Cow::Owned(clean)
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
        // Where the stream began is not known here, and it is not cut there: a suffix of
        // a secret is looked for only after a token's start. What is passed on never ends
        // in what begins a secret (held back below), so its end is no cut either.
        let edges = Edges { start: false, end };
        if self.secrets.is_empty() || end {
            let text = std::mem::take(pending);
            return self.redact_within(&text, edges).into_owned();
        }
        let mut cut = pending.len();
        loop {
            // The longest end of what would be passed on that begins a secret.
            let head = &pending[..cut];
            let held = self
                .secrets
                .iter()
                .map(|secret| secret.value.as_str())
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
                for (start, _) in pending.match_indices(secret.value.as_str()) {
                    if start < next && start + secret.value.len() > next {
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
        self.redact_within(&passed, edges).into_owned()
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

    /// `text` redacted by a redactor of `secrets`.
    fn redacted(secrets: &[&str], text: &str) -> String {
        Redactor::new(secrets.iter().map(|s| (*s).to_owned())).redact(text).into_owned()
    }

    const TOKEN: &str = "s3cr3t-value-123456";

    #[test]
    fn a_prefix_cut_at_the_end_of_the_text_is_redacted() {
        // The probe's MCP error body, cut at 200 characters: 18 of the 19 characters.
        let body = format!("{}{}", "x".repeat(182), &TOKEN[..18]);
        assert_eq!(redacted(&[TOKEN], &body), format!("{}[redacted]", "x".repeat(182)));
        assert_eq!(redacted(&[TOKEN], "HTTP 400: s3cr3t-val"), "HTTP 400: [redacted]");
        // Seven characters are a third of 19: the shortest piece redacted.
        assert_eq!(redacted(&[TOKEN], "key=s3cr3t-"), "key=[redacted]");
        assert_eq!(redacted(&[TOKEN], "key=s3cr3t"), "key=s3cr3t");
    }

    #[test]
    fn a_prefix_cut_where_a_token_ends_is_redacted() {
        assert_eq!(redacted(&[TOKEN], "failed (s3cr3t-value-12)"), "failed ([redacted])");
        assert_eq!(redacted(&[TOKEN], r#"{"k": "s3cr3t-value-1"}"#), r#"{"k": "[redacted]"}"#);
        assert_eq!(redacted(&[TOKEN], "s3cr3t-valu\nnext"), "[redacted]\nnext");
        assert_eq!(redacted(&[TOKEN], "a s3cr3t-value\tb"), "a [redacted]\tb");
        assert_eq!(redacted(&[TOKEN], "see s3cr3t-value. Then"), "see [redacted]. Then");
        // Another token that begins like the secret is no cut of it.
        assert_eq!(redacted(&[TOKEN], "s3cr3t-valuable"), "s3cr3t-valuable");
        assert_eq!(redacted(&[TOKEN], "s3cr3t-value_x"), "s3cr3t-value_x");
        // A character the secret holds goes on a token of it: a JWT goes on with `.`.
        let jwt = "eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl";
        assert_eq!(redacted(&[jwt], "eyJhbGciOi.eyJzdWIi "), "[redacted] ");
        assert_eq!(redacted(&[jwt], "eyJhbGciOi.eyJzdWIi.other"), "eyJhbGciOi.eyJzdWIi.other");
    }

    #[test]
    fn a_suffix_cut_where_the_text_or_a_token_begins_is_redacted() {
        assert_eq!(redacted(&[TOKEN], "3cr3t-value-123456 was refused"), "[redacted] was refused");
        assert_eq!(redacted(&[TOKEN], "…r3t-value-123456"), "…[redacted]");
        assert_eq!(redacted(&[TOKEN], r#"{"k":"value-123456"}"#), r#"{"k":"[redacted]"}"#);
        assert_eq!(redacted(&[TOKEN], "(-123456)"), "([redacted])");
        assert_eq!(redacted(&[TOKEN], "(123456)"), "(123456)", "6 of 19 is too few");
        // Inside another token it is no cut of the secret.
        assert_eq!(redacted(&[TOKEN], "xx3cr3t-value-123456"), "xx3cr3t-value-123456");
    }

    #[test]
    fn ordinary_words_of_a_secret_stay_readable() {
        let secret = ["production-db-password"];
        let text = "the production password of production-db and db-password";
        assert_eq!(redacted(&secret, text), "the production password of [redacted] and [redacted]");
        // Cut inside a word, the piece is no word of the text.
        assert_eq!(redacted(&secret, "login productio"), "login [redacted]");
        assert_eq!(redacted(&secret, "ion-db-password; retry"), "[redacted]; retry");
        // A word of letters that looks random is no ordinary word: mixed case, or long.
        let github = "ghp_AbCdEfGhIjKlMnOpQr";
        assert_eq!(redacted(&[github], "AbCdEfGhIjKlMnOpQr"), "[redacted]");
        let long = "sk-abcdefghijklmnopqrs";
        assert_eq!(redacted(&[long], "abcdefghijklmnopqrs"), "[redacted]");
        // Secrets of 6 characters or fewer are redacted whole only.
        assert_eq!(redacted(&["abcdef"], "abcde abcdef"), "abcde [redacted]");
        // A word that is 6 of a 7-character secret's characters goes, even as a word.
        assert_eq!(redacted(&["hunter2"], "hunter wins"), "[redacted] wins");
    }

    #[test]
    fn pieces_next_to_secrets_and_of_several_secrets_go_whole() {
        let other = "k9x2-QQQQ-7777-zzzz";
        assert_eq!(
            redacted(&[TOKEN, other], "s3cr3t-value-123456s3cr3t-val and -7777-zzzz"),
            "[redacted][redacted] and [redacted]"
        );
        // A piece of one secret overlapping a piece of another is one run.
        assert_eq!(redacted(&["abcdefghij", "hijklmnopq"], "bcdefghijklmno"), "[redacted]");
        // Not ASCII: cuts fall between characters.
        let umlaut = "pässwörd-ümlaut-42";
        assert_eq!(redacted(&[umlaut], "pässwörd-üm"), "[redacted]");
        assert_eq!(redacted(&[umlaut], "x: wörd-ümlaut-42"), "x: [redacted]");
        for (chars, (cut, _)) in umlaut.char_indices().enumerate() {
            let shown = redacted(&[umlaut], &umlaut[..cut]);
            let word = &umlaut[..cut] == "pässwörd";
            assert_eq!(shown == "[redacted]", chars >= 6 && !word, "{cut}: {shown}");
        }
    }

    #[test]
    fn a_prefix_cut_in_a_stream_is_redacted() {
        let r = Redactor::new([TOKEN.to_owned()]);
        let (out, whole) = streamed(&r, &["error: s3cr3t", "-val", ") more"]);
        assert_eq!(whole, "error: [redacted]) more");
        assert!(out.iter().all(|piece| !piece.contains("s3cr")), "{out:?}");
        let (_, whole) = streamed(&r, &["tail s3cr3t-value-1", "2"]);
        assert_eq!(whole, "tail [redacted]");
    }

    #[test]
    fn a_secret_is_redacted_as_json_writes_it_too() {
        let pem = "line-one-secret\nline-two-secret";
        let quoted = r#"say "hi" \ bye"#;
        let r = Redactor::new([pem.to_owned(), quoted.to_owned()]);
        let text = serde_json::json!({"k": pem, "q": quoted}).to_string();
        assert_eq!(r.redact(&text), r#"{"k":"[redacted]","q":"[redacted]"}"#);
        assert_eq!(r.redact(&format!("raw: {pem}")), "raw: [redacted]");
    }

    #[test]
    fn redacts_longest_first() {
        let r = Redactor::new(["abcd".to_owned(), "abcdef".to_owned(), "x".to_owned()]);
        assert_eq!(r.redact("token abcdef and abcd, x"), "token [redacted] and [redacted], x");
        assert!(matches!(r.redact("clean"), Cow::Borrowed(_)));
    }
}
