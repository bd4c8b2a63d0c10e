//! How a text file is encoded and how its lines end, detected from its bytes, so that
//! `read` and `grep` can show UTF-16 and UTF-32 files and `edit` and `write` keep a file's
//! byte order mark, encoding and line endings instead of silently converting them.

use std::borrow::Cow;
use std::fmt;

/// The UTF-8 byte order mark.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// A text file's encoding, as its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// UTF-8 without a byte order mark (and anything else without one).
    Utf8,
    /// UTF-8 starting with the byte order mark `EF BB BF`.
    Utf8Bom,
    /// UTF-16 little-endian, starting with `FF FE`.
    Utf16Le,
    /// UTF-16 big-endian, starting with `FE FF`.
    Utf16Be,
    /// UTF-32 little-endian, starting with `FF FE 00 00`.
    Utf32Le,
    /// UTF-32 big-endian, starting with `00 00 FE FF`.
    Utf32Be,
}

/// Why bytes could not be decoded; the message completes "`path` ...".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Encoding {
    /// The encoding the byte order mark at the start of `bytes` names; `Utf8` without one.
    /// `FF FE 00 00` is UTF-32 LE, as Python, iconv and `file` take it, though it could
    /// also be UTF-16 LE starting with a U+0000, which no text does.
    pub(crate) fn sniff(bytes: &[u8]) -> Encoding {
        if bytes.starts_with(UTF8_BOM) {
            Encoding::Utf8Bom
        } else if bytes.starts_with(b"\xFF\xFE\x00\x00") {
            Encoding::Utf32Le
        } else if bytes.starts_with(b"\x00\x00\xFE\xFF") {
            Encoding::Utf32Be
        } else if bytes.starts_with(b"\xFF\xFE") {
            Encoding::Utf16Le
        } else if bytes.starts_with(b"\xFE\xFF") {
            Encoding::Utf16Be
        } else {
            Encoding::Utf8
        }
    }

    /// The byte order mark's bytes (empty for plain UTF-8).
    pub(crate) fn bom(self) -> &'static [u8] {
        match self {
            Encoding::Utf8 => b"",
            Encoding::Utf8Bom => UTF8_BOM,
            Encoding::Utf16Le => b"\xFF\xFE",
            Encoding::Utf16Be => b"\xFE\xFF",
            Encoding::Utf32Le => b"\xFF\xFE\x00\x00",
            Encoding::Utf32Be => b"\x00\x00\xFE\xFF",
        }
    }

    /// Whether the encoding is UTF-16 or UTF-32, where NUL bytes are ordinary text.
    pub(crate) fn is_wide(self) -> bool {
        self.decoder().is_some()
    }

    /// A decoder of the text after the byte order mark, for the encodings whose code units
    /// are wider than a byte; `None` for UTF-8.
    pub(crate) fn decoder(self) -> Option<WideDecoder> {
        let (width, big_endian) = match self {
            Encoding::Utf8 | Encoding::Utf8Bom => return None,
            Encoding::Utf16Le => (2, false),
            Encoding::Utf16Be => (2, true),
            Encoding::Utf32Le => (4, false),
            Encoding::Utf32Be => (4, true),
        };
        Some(WideDecoder { width, big_endian, pending: [0; 4], pending_len: 0, high: None, at: 0 })
    }

    /// The code units of `body` (text after the byte order mark; a unit cut at its end is
    /// left out), for telling line endings without decoding.
    pub(crate) fn units(self, body: &[u8]) -> Box<dyn Iterator<Item = u32> + '_> {
        match self {
            Encoding::Utf8 | Encoding::Utf8Bom => Box::new(body.iter().map(|&b| u32::from(b))),
            Encoding::Utf16Le => {
                Box::new(body.chunks_exact(2).map(|p| u32::from(u16::from_le_bytes([p[0], p[1]]))))
            }
            Encoding::Utf16Be => {
                Box::new(body.chunks_exact(2).map(|p| u32::from(u16::from_be_bytes([p[0], p[1]]))))
            }
            Encoding::Utf32Le => {
                Box::new(body.chunks_exact(4).map(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]])))
            }
            Encoding::Utf32Be => {
                Box::new(body.chunks_exact(4).map(|p| u32::from_be_bytes([p[0], p[1], p[2], p[3]])))
            }
        }
    }

    /// A name for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Encoding::Utf8 => "UTF-8",
            Encoding::Utf8Bom => "UTF-8 with a byte order mark",
            Encoding::Utf16Le => "UTF-16 LE",
            Encoding::Utf16Be => "UTF-16 BE",
            Encoding::Utf32Le => "UTF-32 LE",
            Encoding::Utf32Be => "UTF-32 BE",
        }
    }

    /// The text of a whole file (`bytes` with its byte order mark), without the mark.
    /// Lossless: invalid bytes are an error, never replaced.
    pub(crate) fn decode(self, bytes: &[u8]) -> Result<String, DecodeError> {
        let body = &bytes[self.bom().len().min(bytes.len())..];
        if let Some(mut decoder) = self.decoder() {
            let mut text = String::with_capacity(body.len() / 2);
            decoder.feed(body, &mut text)?;
            decoder.finish()?;
            return Ok(text);
        }
        String::from_utf8(body.to_vec()).map_err(|_| DecodeError("is not valid UTF-8".into()))
    }

    /// `text` as this encoding's bytes, byte order mark first. A byte order mark the text
    /// starts with itself is not doubled (and is kept as given in plain UTF-8).
    pub(crate) fn encode(self, text: &str) -> Vec<u8> {
        let text = match self {
            Encoding::Utf8 => text,
            _ => text.strip_prefix('\u{FEFF}').unwrap_or(text),
        };
        let mut bytes = Vec::with_capacity(text.len() + 4);
        bytes.extend_from_slice(self.bom());
        match self {
            Encoding::Utf8 | Encoding::Utf8Bom => bytes.extend_from_slice(text.as_bytes()),
            Encoding::Utf16Le => text.encode_utf16().for_each(|u| bytes.extend(u.to_le_bytes())),
            Encoding::Utf16Be => text.encode_utf16().for_each(|u| bytes.extend(u.to_be_bytes())),
            Encoding::Utf32Le => {
                text.chars().for_each(|c| bytes.extend(u32::from(c).to_le_bytes()));
            }
            Encoding::Utf32Be => {
                text.chars().for_each(|c| bytes.extend(u32::from(c).to_be_bytes()));
            }
        }
        bytes
    }
}

/// Decodes UTF-16 or UTF-32 fed in pieces of any size (a code unit or a surrogate pair
/// may be cut between two pieces), refusing what is no character and a unit cut short at
/// the end. Made by [`Encoding::decoder`].
#[derive(Debug)]
pub(crate) struct WideDecoder {
    /// Bytes per code unit: 2 or 4.
    width: usize,
    big_endian: bool,
    /// The first bytes of a code unit cut by the end of the last piece.
    pending: [u8; 4],
    // Invariant: less than `width`.
    pending_len: usize,
    /// A high surrogate waiting for its low half (UTF-16 only).
    high: Option<u16>,
    /// Bytes consumed so far (after the byte order mark), for messages.
    at: u64,
}

impl WideDecoder {
    /// Appends the characters of `bytes` to `out`.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], out: &mut String) -> Result<(), DecodeError> {
        let width = self.width;
        if self.pending_len > 0 {
            let take = (width - self.pending_len).min(bytes.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&bytes[..take]);
            self.pending_len += take;
            bytes = &bytes[take..];
            if self.pending_len < width {
                return Ok(());
            }
            self.pending_len = 0;
            let unit = self.pending;
            self.unit(&unit[..width], out)?;
        }
        let mut units = bytes.chunks_exact(width);
        for unit in &mut units {
            self.unit(unit, out)?;
        }
        let rest = units.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
        Ok(())
    }

    /// Decodes one code unit of `width` bytes.
    fn unit(&mut self, bytes: &[u8], out: &mut String) -> Result<(), DecodeError> {
        let at = self.at;
        self.at += self.width as u64;
        if let &[a, b, c, d] = bytes {
            let unit = match self.big_endian {
                true => u32::from_be_bytes([a, b, c, d]),
                false => u32::from_le_bytes([a, b, c, d]),
            };
            let c = char::from_u32(unit).ok_or_else(|| {
                DecodeError(format!(
                    "is not valid UTF-32: code unit {unit:#X} at byte {} is not a character (a \
                     surrogate, or past U+10FFFF)",
                    at + 4
                ))
            })?;
            out.push(c);
            return Ok(());
        }
        let pair = [bytes[0], bytes[1]];
        let unit =
            if self.big_endian { u16::from_be_bytes(pair) } else { u16::from_le_bytes(pair) };
        let unpaired = || {
            DecodeError(format!("is not valid UTF-16: an unpaired surrogate at byte {}", at + 2))
        };
        match (self.high.take(), unit) {
            (Some(high), 0xDC00..=0xDFFF) => {
                let code =
                    0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00);
                out.push(char::from_u32(code).ok_or_else(unpaired)?);
            }
            (Some(_), _) | (None, 0xDC00..=0xDFFF) => return Err(unpaired()),
            (None, 0xD800..=0xDBFF) => self.high = Some(unit),
            (None, _) => out.push(char::from_u32(u32::from(unit)).ok_or_else(unpaired)?),
        }
        Ok(())
    }

    /// Checks that nothing was left cut short at the end.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.pending_len > 0 {
            return Err(DecodeError(match self.width {
                4 => "is not valid UTF-32: it ends in the middle of a code unit (its length is \
                      not a multiple of 4 bytes)"
                    .into(),
                _ => "is not valid UTF-16: it ends in the middle of a code unit (an odd number \
                      of bytes)"
                    .into(),
            }));
        }
        if self.high.is_some() {
            return Err(DecodeError(
                "is not valid UTF-16: it ends with an unpaired surrogate".into(),
            ));
        }
        Ok(())
    }
}

/// The lines of `text`, as [`str::lines`] splits them, but at every `\r` in a text whose
/// lines end in a bare `\r` ([`LineEnding::Cr`]).
pub(crate) fn lines(text: &str) -> Vec<&str> {
    if LineEnding::dominant(text) != Some(LineEnding::Cr) {
        return text.lines().collect();
    }
    text.strip_suffix('\r').unwrap_or(text).split('\r').collect()
}

/// Whether a text's lines end in a bare CR (classic Mac OS), told from its bytes fed in
/// pieces: it has a `\r` and no `\n` anywhere, the rule by which [`LineEnding::dominant`]
/// gives [`LineEnding::Cr`]. `read` feeds it the file as it pages it; `grep`, which must
/// know before it searches, reads on only while no `\n` has [settled](CrLines::settled) it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CrLines {
    cr: bool,
    lf: bool,
}

impl CrLines {
    /// Takes the next piece of the text (UTF-8, or any encoding where `\r` and `\n` are
    /// those bytes and no byte of another character).
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        self.lf = self.lf || memchr::memchr(b'\n', bytes).is_some();
        self.cr = self.cr || memchr::memchr(b'\r', bytes).is_some();
    }

    /// Whether the rest of the text cannot change the answer: a `\n` was seen.
    pub(crate) fn settled(self) -> bool {
        self.lf
    }

    /// Whether the lines of the text fed so far end in a bare CR.
    pub(crate) fn cr_only(self) -> bool {
        self.cr && !self.lf
    }
}

/// How lines end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LineEnding {
    /// `\n`.
    Lf,
    /// `\r\n`.
    CrLf,
    /// A bare `\r`, as classic Mac OS wrote text: only in a file without any `\n`.
    Cr,
}

impl LineEnding {
    /// The line ending `text` mostly uses: `None` when it has no line break. A file with
    /// mixed endings gets the one most of its lines use, as editors that normalise on save
    /// do; on a tie, the one its first line break uses. A file without any `\n` whose
    /// lines end in `\r` gets [`LineEnding::Cr`]; where `\n` occurs, a bare `\r` is text.
    pub(crate) fn dominant(text: &str) -> Option<LineEnding> {
        Self::dominant_in(text.bytes().map(u32::from))
    }

    /// [`LineEnding::dominant`] over code units (bytes of UTF-8, or UTF-16 or UTF-32 units).
    pub(crate) fn dominant_in(units: impl IntoIterator<Item = u32>) -> Option<LineEnding> {
        let (mut crlf, mut lf, mut first) = (0u64, 0u64, None);
        let mut previous = 0u32;
        let mut cr = false;
        for unit in units {
            cr |= unit == u32::from(b'\r');
            if unit == u32::from(b'\n') {
                let ending =
                    if previous == u32::from(b'\r') { LineEnding::CrLf } else { LineEnding::Lf };
                match ending {
                    LineEnding::CrLf => crlf += 1,
                    _ => lf += 1,
                }
                first.get_or_insert(ending);
            }
            previous = unit;
        }
        match crlf.cmp(&lf) {
            std::cmp::Ordering::Greater => Some(LineEnding::CrLf),
            std::cmp::Ordering::Less => Some(LineEnding::Lf),
            std::cmp::Ordering::Equal if first.is_none() && cr => Some(LineEnding::Cr),
            std::cmp::Ordering::Equal => first,
        }
    }

    /// The line ending text is edited with: LF for a CR file, which `edit` and
    /// `apply_patch` turn into LF lines and back.
    pub(crate) fn working(self) -> LineEnding {
        match self {
            LineEnding::Cr => LineEnding::Lf,
            ending => ending,
        }
    }

    /// The line break itself.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LineEnding::Lf => "\n",
            LineEnding::CrLf => "\r\n",
            LineEnding::Cr => "\r",
        }
    }

    /// `text` with every line break (`\n` or `\r\n`) made this one; a lone `\r` is kept,
    /// except by [`LineEnding::Cr`], which makes every `\r\n`, `\n` and `\r` a `\r`.
    pub(crate) fn apply(self, text: &str) -> Cow<'_, str> {
        let has_crlf = text.contains("\r\n");
        match self {
            LineEnding::Cr if text.contains('\n') => {
                Cow::Owned(text.replace("\r\n", "\r").replace('\n', "\r"))
            }
            LineEnding::Cr => Cow::Borrowed(text),
            LineEnding::Lf if has_crlf => Cow::Owned(text.replace("\r\n", "\n")),
            LineEnding::Lf => Cow::Borrowed(text),
            LineEnding::CrLf => {
                let bare = text.matches('\n').count() - text.matches("\r\n").count();
                if bare == 0 {
                    return Cow::Borrowed(text);
                }
                let lf = if has_crlf {
                    Cow::Owned(text.replace("\r\n", "\n"))
                } else {
                    Cow::Borrowed(text)
                };
                Cow::Owned(lf.replace('\n', "\r\n"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_marks_are_sniffed() {
        assert_eq!(Encoding::sniff(b"\xEF\xBB\xBFa"), Encoding::Utf8Bom);
        assert_eq!(Encoding::sniff(b"\xFF\xFEa\0"), Encoding::Utf16Le);
        assert_eq!(Encoding::sniff(b"\xFE\xFF\0a"), Encoding::Utf16Be);
        assert_eq!(Encoding::sniff(b"\xFF\xFE\0\0"), Encoding::Utf32Le);
        assert_eq!(Encoding::sniff(b"\0\0\xFE\xFFa"), Encoding::Utf32Be);
        assert_eq!(Encoding::sniff(b"plain"), Encoding::Utf8);
    }

    #[test]
    fn utf16_round_trips_and_refuses_what_is_invalid() {
        let text = "h\u{e9}llo \u{1F600}\r\nz";
        for encoding in [
            Encoding::Utf16Le,
            Encoding::Utf16Be,
            Encoding::Utf32Le,
            Encoding::Utf32Be,
            Encoding::Utf8Bom,
            Encoding::Utf8,
        ] {
            let bytes = encoding.encode(text);
            assert!(bytes.starts_with(encoding.bom()));
            assert_eq!(Encoding::sniff(&bytes), encoding);
            assert_eq!(encoding.decode(&bytes).unwrap(), text);
        }
        // A lone low surrogate, then an odd length.
        assert_eq!(
            Encoding::Utf16Le.decode(b"\xFF\xFEa\0\x00\xDC").unwrap_err().to_string(),
            "is not valid UTF-16: an unpaired surrogate at byte 4"
        );
        assert!(Encoding::Utf16Le.decode(b"\xFF\xFEa\0b").is_err());
        assert!(Encoding::Utf16Be.decode(b"\xFE\xFF\xD8\x3D").is_err());
    }

    #[test]
    fn wide_encodings_decode_across_any_cut() {
        let text = "a\u{1F600}b\u{e9}";
        for encoding in [Encoding::Utf16Le, Encoding::Utf16Be, Encoding::Utf32Le, Encoding::Utf32Be]
        {
            let bytes = encoding.encode(text);
            for size in 1..=bytes.len() {
                let mut decoder = encoding.decoder().unwrap();
                let mut out = String::new();
                for piece in bytes[encoding.bom().len()..].chunks(size) {
                    decoder.feed(piece, &mut out).unwrap();
                }
                decoder.finish().unwrap();
                assert_eq!(out, text, "{encoding:?} in pieces of {size}");
            }
        }
    }

    #[test]
    fn utf32_refuses_what_is_no_character() {
        assert_eq!(
            Encoding::Utf32Be.decode(b"\0\0\xFE\xFF\0\0\0a\0\x11\0\0").unwrap_err().to_string(),
            "is not valid UTF-32: code unit 0x110000 at byte 8 is not a character (a surrogate, \
             or past U+10FFFF)"
        );
        assert!(Encoding::Utf32Le.decode(b"\xFF\xFE\0\0\0\xD8\0\0").is_err());
        assert!(Encoding::Utf32Le.decode(b"\xFF\xFE\0\0a\0\0").is_err());
    }

    #[test]
    fn the_dominant_line_ending_wins() {
        assert_eq!(LineEnding::dominant("a\r\nb\r\nc\n"), Some(LineEnding::CrLf));
        assert_eq!(LineEnding::dominant("a\nb\nc\r\n"), Some(LineEnding::Lf));
        assert_eq!(LineEnding::dominant("a\r\nb\n"), Some(LineEnding::CrLf));
        assert_eq!(LineEnding::dominant("a\nb\r\n"), Some(LineEnding::Lf));
        assert_eq!(LineEnding::dominant("one line"), None);
        assert_eq!(LineEnding::dominant("a\rb\rc"), Some(LineEnding::Cr));
        assert_eq!(LineEnding::dominant("a\rb\rc\n"), Some(LineEnding::Lf));
    }

    #[test]
    fn cr_lines_need_a_cr_and_no_lf_in_any_piece() {
        let told = |pieces: &[&str]| {
            let mut lines = CrLines::default();
            pieces.iter().for_each(|piece| lines.feed(piece.as_bytes()));
            lines.cr_only()
        };
        assert!(told(&["a\rb", "c\r"]));
        assert!(told(&["abc", "", "d\r"]));
        assert!(!told(&["a\rb", "c\n"]));
        assert!(!told(&["abc", "def"]));
        for text in ["a\rb\rc", "a\rb\nc", "a\r\nb", "abc", "a\nb\r"] {
            let dominant = LineEnding::dominant(text) == Some(LineEnding::Cr);
            assert_eq!(told(&[text]), dominant, "{text:?}");
        }
    }

    #[test]
    fn cr_only_text_splits_at_every_cr() {
        assert_eq!(lines("a\rb\rc\r"), ["a", "b", "c"]);
        assert_eq!(lines("a\rb\nc"), ["a\rb", "c"]);
        assert!(lines("").is_empty());
    }

    #[test]
    fn line_endings_are_applied() {
        assert_eq!(LineEnding::CrLf.apply("a\nb\r\nc"), "a\r\nb\r\nc");
        assert_eq!(LineEnding::Lf.apply("a\r\nb\nc"), "a\nb\nc");
        assert_eq!(LineEnding::CrLf.apply("a\rb"), "a\rb");
        assert_eq!(LineEnding::Cr.apply("a\nb\r\nc\rd"), "a\rb\rc\rd");
        assert!(matches!(LineEnding::CrLf.apply("a\r\nb"), Cow::Borrowed(_)));
    }
}
