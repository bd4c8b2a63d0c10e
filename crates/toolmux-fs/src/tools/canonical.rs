//! Canonical equivalence for `edit`: an `old_string` written composed (NFC, as models
//! write) matched against a file written decomposed (NFD: names saved on macOS, some
//! editors' text), and the reverse. `é` is one character in one form and `e` with a
//! combining accent in the other: the same text to a reader, different bytes to a search.
//! And the other side of it: an exact match that ends (or begins) between a letter and its
//! combining marks is no match (`cafe` is not in `cafe\u{301}`, which reads `café`).

use unicode_normalization::char::{canonical_combining_class, compose, is_combining_mark};
use unicode_normalization::{UnicodeNormalization as _, is_nfc, is_nfd};

/// No segment of the composed text begins at this byte (see [`composed`]).
const INSIDE: u32 = u32::MAX;

/// The normalization form all of a text is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// NFC: `é` as one character.
    Composed,
    /// NFD: `é` as `e` and a combining accent.
    Decomposed,
}

impl Form {
    /// The form all of `text` is in, when it is in one of the two and not in both (text
    /// without accents is in both and tells nothing); `None` for a mix.
    pub(super) fn of(text: &str) -> Option<Form> {
        match (is_nfc(text), is_nfd(text)) {
            (true, false) => Some(Form::Composed),
            (false, true) => Some(Form::Decomposed),
            _ => None,
        }
    }

    /// `text` written in this form.
    pub(super) fn apply(self, text: &str) -> String {
        match self {
            Form::Composed => text.nfc().collect(),
            Form::Decomposed => text.nfd().collect(),
        }
    }
}

/// The text of `text` that `old` matches when both are composed (NFC), when every place
/// it matches holds the same text: the file's own bytes, in its form, to replace. `None`
/// when there is no match, or when places differ in their bytes (which to change would
/// be a guess).
pub(super) fn find(text: &str, old: &str) -> Option<String> {
    // Text without accents or other marks reads the same composed.
    if old.is_ascii() || text.is_ascii() {
        return None;
    }
    let wanted: String = old.nfc().collect();
    if wanted.is_empty() {
        return None;
    }
    let (read, origin) = composed(text);
    let found = read.match_indices(wanted.as_str()).filter_map(|(at, _)| {
        let (start, end) = (origin[at], origin[at + wanted.len()]);
        // A match must begin and end where a character and its marks do: `e` must not
        // match the `e` of `é`.
        if start == INSIDE || end == INSIDE {
            return None;
        }
        let span = &text[start as usize..end as usize];
        span.nfc().eq(wanted.chars()).then_some(span)
    });
    let mut found = found.peekable();
    let first = *found.peek()?;
    found.all(|other| other == first).then(|| first.to_owned())
}

/// Whether `c` is a combining mark (Unicode general category M, or a character of a
/// nonzero canonical combining class): it belongs to the character before it.
pub(super) fn is_mark(c: char) -> bool {
    !c.is_ascii() && (is_combining_mark(c) || canonical_combining_class(c) != 0)
}

/// Whether the span `start..end` of `text` splits a combining sequence: it ends right
/// before a combining mark (which would be left on whatever replaces the span), or begins
/// with one that belongs to the character before it.
pub(super) fn splits(text: &str, start: usize, end: usize) -> bool {
    let mark_at = |at: usize| text[at..].chars().next().is_some_and(is_mark);
    (start > 0 && mark_at(start)) || mark_at(end)
}

/// Where `old` occurs in `text`, left to right and without overlapping, leaving out the
/// places that split a combining sequence ([`splits`]); a place left out does not hide an
/// overlapping one after it.
pub(super) fn whole_matches(text: &str, old: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    if old.is_empty() {
        return starts;
    }
    let mut from = 0;
    while let Some(found) = text[from..].find(old) {
        let at = from + found;
        if splits(text, at, at + old.len()) {
            // On past this place's first character.
            from = at + text[at..].chars().next().map_or(1, char::len_utf8);
        } else {
            starts.push(at);
            from = at + old.len();
        }
    }
    starts
}

/// Whether `old` occurs in `text` without splitting a combining sequence.
pub(super) fn contains_whole(text: &str, old: &str) -> bool {
    // The common case first: no match at all, or one in text without marks.
    match text.find(old) {
        None => false,
        Some(at) if !splits(text, at, at + old.len()) => true,
        Some(_) => !whole_matches(text, old).is_empty(),
    }
}

/// The first place `old` occurs in `text` only by splitting a combining sequence, as the
/// whole sequence it cuts into (from its first character to its last mark): what the file
/// has where the caller's text stops short of an accent or starts inside one.
pub(super) fn split_match<'t>(text: &'t str, old: &str) -> Option<(usize, &'t str)> {
    if old.is_empty() {
        return None;
    }
    let (at, _) = text.match_indices(old).find(|&(at, _)| splits(text, at, at + old.len()))?;
    // Back to the character the first mark belongs to, on past the last mark.
    let mut start = at;
    while start > 0 && text[start..].chars().next().is_some_and(is_mark) {
        start = text[..start].char_indices().next_back().map_or(0, |(i, _)| i);
    }
    let mut end = at + old.len();
    while let Some(c) = text[end..].chars().next().filter(|&c| is_mark(c)) {
        end += c.len_utf8();
    }
    Some((at, &text[start..end]))
}

/// Whether two texts are the same under canonical equivalence (both composed, NFC).
pub(super) fn same(one: &str, other: &str) -> bool {
    one.nfc().eq(other.nfc())
}

/// `text` without its accents and other combining marks (decomposed first, so `é` loses
/// its accent too): two texts that differ only in accents read the same so.
pub(super) fn unaccented(text: &str) -> String {
    text.nfd().filter(|&c| !is_mark(c)).collect()
}

/// `text` composed (NFC), and for each byte of it (and its end) where in `text` the
/// segment beginning there begins, or [`INSIDE`]. A segment is a character with the marks
/// and characters that compose with it (a Hangul syllable's jamo), composed alone: what
/// NFC does to the whole text, done piece by piece so that the pieces can be found again.
fn composed(text: &str) -> (String, Vec<u32>) {
    let mut read = String::with_capacity(text.len());
    let mut origin = Vec::with_capacity(text.len() + 1);
    let mut start = 0;
    let mut push = |read: &mut String, segment: &str, from: usize| {
        let before = read.len();
        match segment.is_ascii() {
            true => read.push_str(segment),
            false => read.extend(segment.nfc()),
        }
        origin.push(from as u32);
        origin.extend(std::iter::repeat_n(INSIDE, read.len() - before - 1));
    };
    for (at, c) in text.char_indices() {
        // A new segment begins at a starter that does not compose with what came before
        // (nothing composes with a following ASCII character).
        let begins = at > start
            && (c.is_ascii()
                || canonical_combining_class(c) == 0
                    && text[start..at].nfc().last().is_none_or(|last| compose(last, c).is_none()));
        if begins {
            push(&mut read, &text[start..at], start);
            start = at;
        }
    }
    if start < text.len() {
        push(&mut read, &text[start..], start);
    }
    origin.push(text.len() as u32);
    (read, origin)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NFD_CAFE: &str = "cafe\u{301}";

    #[test]
    fn composed_text_finds_decomposed_text_and_the_reverse() {
        let file = format!("le {NFD_CAFE} et le th\u{e9}\n");
        assert_eq!(find(&file, "caf\u{e9}").as_deref(), Some(NFD_CAFE));
        assert_eq!(find(&file, "the\u{301}").as_deref(), Some("th\u{e9}"));
        assert_eq!(find(&file, "\u{e9} et").as_deref(), Some("e\u{301} et"));
        // Not inside a character: `é` is no match for `é` with a second accent.
        assert_eq!(find("cafe\u{301}\u{300}", "caf\u{e9}"), None);
        // Marks in another order are the same text.
        assert_eq!(find("q\u{323}\u{307}", "q\u{307}\u{323}").as_deref(), Some("q\u{323}\u{307}"));
        // Hangul written as jamo (macOS file names).
        let jamo: String = "\u{d55c}\u{ae00}".nfd().collect();
        assert_eq!(jamo.chars().count(), 6);
        assert_eq!(find(&format!("[{jamo}]"), "\u{d55c}\u{ae00}").as_deref(), Some(&*jamo));
        // Places written differently: not guessed.
        assert_eq!(find(&format!("{NFD_CAFE} caf\u{e9}"), "cafe\u{301}"), None);
    }

    #[test]
    fn matches_never_split_a_letter_from_its_marks() {
        assert_eq!(whole_matches("cafe\u{301} cafe", "cafe"), vec![7]);
        assert!(!contains_whole(NFD_CAFE, "cafe"));
        assert!(contains_whole(NFD_CAFE, NFD_CAFE));
        // A place left out does not hide the one overlapping it.
        assert_eq!(whole_matches("aa\u{301}a", "a"), vec![0, 4]);
        assert_eq!(whole_matches("xaxa\u{300}xax", "xax"), vec![0, 6]);
        // Starting with a mark cuts it from its letter; at the text's start it has none.
        assert!(splits(NFD_CAFE, 4, 6));
        assert!(!splits("\u{301}x", 0, 2));
        // A spacing mark (Devanagari vowel sign I, class 0) belongs to its letter too.
        assert!(!contains_whole("\u{915}\u{93f}", "\u{915}"));
        assert_eq!(split_match("le cafe\u{301}\u{327}!", "cafe"), Some((3, "cafe\u{301}\u{327}")));
        assert_eq!(split_match("le cafe\u{301}", "\u{301}"), Some((7, "e\u{301}")));
        assert_eq!(split_match("le cafe", "cafe"), None);
    }

    #[test]
    fn the_form_of_a_text() {
        assert_eq!(Form::of(NFD_CAFE), Some(Form::Decomposed));
        assert_eq!(Form::of("caf\u{e9}"), Some(Form::Composed));
        assert_eq!(Form::of("plain"), None);
        assert_eq!(Form::of(&format!("{NFD_CAFE} caf\u{e9}")), None);
        assert_eq!(Form::Decomposed.apply("cr\u{e8}me"), "cre\u{300}me");
    }
}
