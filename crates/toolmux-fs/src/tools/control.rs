//! How command output is made fit for the model: terminal escape sequences are removed,
//! stray control characters shown as escapes, and output that is mostly binary replaced
//! by a one-line notice.
//!
//! A NUL in a tool result breaks some model APIs' JSON handling and many clients'
//! displays, and a bell, a backspace or a form feed only confuses the model; dropping them
//! silently would hide that they were there. Tab, line feed and carriage return stay as
//! they are: they are the text's layout (a carriage return draws a progress bar).

use super::shell::strip_ansi;
use std::borrow::Cow;
use std::fmt::Write as _;

/// How many first bytes decide whether output is binary (as git and grep judge a file).
const SAMPLE: usize = 8 * 1024;

/// Below this many bytes output is always shown as text: a few escapes are clearer than a
/// notice.
const BINARY_MIN_BYTES: usize = 32;

/// The share, in percent, of bytes that are no text (control bytes, invalid UTF-8) from
/// which output is binary. Random bytes and executables are well above it (about 60%),
/// text in a legacy encoding or with a few stray controls far below.
const BINARY_PERCENT: usize = 30;

/// Whether output starting with `bytes` is binary rather than text.
pub(crate) fn is_binary(bytes: &[u8]) -> bool {
    let sample = &bytes[..bytes.len().min(SAMPLE)];
    if sample.len() < BINARY_MIN_BYTES {
        return false;
    }
    let mut odd = 0;
    let mut rest = sample;
    loop {
        match std::str::from_utf8(rest) {
            Ok(valid) => {
                odd += valid.bytes().filter(|&b| is_odd_byte(b)).count();
                break;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                odd += valid.iter().filter(|&&b| is_odd_byte(b)).count();
                // A sequence cut by the end of the sample is no fault of the output.
                let Some(bad) = e.error_len() else { break };
                odd += bad;
                rest = &after[bad..];
            }
        }
    }
    odd * 100 >= sample.len() * BINARY_PERCENT
}

/// A control byte that text does not hold: not tab, LF, CR, nor the ESC that starts a
/// colour.
fn is_odd_byte(b: u8) -> bool {
    (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x1b)) || b == 0x7f
}

/// Shows the control characters left in `text` as escapes: C0 controls and DEL as `\x07`,
/// C1 controls as `\u{85}`; tab, LF and CR stay.
pub(crate) fn escape_controls(text: &str) -> Cow<'_, str> {
    let escaped = |c: char| c.is_control() && !matches!(c, '\t' | '\n' | '\r');
    if !text.chars().any(escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !escaped(c) => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// Output bytes as the model sees them: decoded (an invalid sequence shown as U+FFFD),
/// escape sequences removed, control characters escaped.
pub(crate) fn to_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = strip_ansi(&text);
    escape_controls(&text).into_owned()
}

/// The one line shown for `bytes` bytes of binary output; `saved` ends it (where the
/// bytes are, or why they are not there).
pub(crate) fn binary_notice(bytes: u64, saved: &str) -> String {
    format!("[{bytes} bytes of binary output left out{saved}]")
}

/// `; <how> <path> (look at it with ...)`: where saved binary output is and how to look.
pub(crate) fn binary_saved(how: &str, path: &std::path::Path) -> String {
    let path = path.display();
    format!("; {how} {path} (look at it with `file {path}`, `xxd {path} | head`)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_escapes() {
        assert_eq!(escape_controls("a\0b\x07c\x08\x0c\x7f"), "a\\x00b\\x07c\\x08\\x0c\\x7f");
        assert_eq!(escape_controls("tab\tlf\ncr\r"), "tab\tlf\ncr\r");
        assert_eq!(escape_controls("c1\u{85}é"), "c1\\u{85}é");
        assert!(matches!(escape_controls("plain ünïcode"), Cow::Borrowed(_)));
        assert_eq!(to_text(b"\x1b[31mred\x1b[0m\0\xff"), "red\\x00\u{fffd}");
    }

    #[test]
    fn binary_is_mostly_no_text() {
        assert!(!is_binary(b"a\0b"));
        assert!(!is_binary(&[0u8; BINARY_MIN_BYTES - 1]));
        assert!(is_binary(&[0u8; BINARY_MIN_BYTES]));
        let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
        elf.resize(64, 0);
        assert!(is_binary(&elf));
        // `find -print0`, coloured `ls`, Latin-1 text: text.
        assert!(!is_binary("src/main.rs\0src/lib.rs\0README.md\0".repeat(4).as_bytes()));
        assert!(!is_binary("\x1b[34mdir\x1b[0m  file\n".repeat(8).as_bytes()));
        assert!(!is_binary(&b"caf\xe9 cr\xe8me br\xfbl\xe9e, d\xe9j\xe0 vu\n".repeat(4)));
        // A character cut by the sample's end is not counted.
        assert_eq!(SAMPLE % 3, 2);
        assert!(!is_binary("aé".repeat(SAMPLE).as_bytes()));
    }
}
