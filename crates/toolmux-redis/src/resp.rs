//! RESP2, the Redis serialization protocol: commands encoded as arrays of bulk strings,
//! replies parsed incrementally from a buffer.
//!
//! The parser never trusts a length it reads: a bulk string or array larger than Redis
//! itself allows, or nested deeper than any reply toolmux asks for, is a protocol error
//! instead of an allocation.

use std::fmt;

/// The largest bulk string Redis stores (512 MiB); a longer length is a broken stream.
const MAX_BULK: usize = 512 * 1024 * 1024;

/// The largest array accepted; toolmux's replies are far smaller.
const MAX_ARRAY: usize = 16 * 1024 * 1024;

/// Nesting deeper than this is refused (toolmux's replies nest at most two levels).
const MAX_DEPTH: usize = 8;

/// One reply of a Redis server.
#[derive(Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`: the server refused the command.
    Error(String),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nabc`: bytes, not necessarily text.
    Bulk(Vec<u8>),
    /// `$-1` or `*-1`: no value.
    Nil,
    /// `*2\r\n...`: replies in order.
    Array(Vec<Reply>),
}

impl Reply {
    /// The reply as text: a simple string, or a bulk string that is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Simple(s) => Some(s),
            Reply::Bulk(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The reply as an integer: an integer, or text that parses as one (Lua numbers come
    /// back as integers, numbers stored in keys as bulk strings).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Reply::Integer(n) => Some(*n),
            other => other.as_str()?.parse().ok(),
        }
    }

    /// The elements of an array reply.
    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The bytes of a bulk or simple string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b) => Some(b),
            Reply::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Simple(s) => write!(f, "Simple({s:?})"),
            Reply::Error(s) => write!(f, "Error({s:?})"),
            Reply::Integer(n) => write!(f, "Integer({n})"),
            // Values can be megabytes: show their start.
            Reply::Bulk(b) if b.len() > 64 => {
                write!(f, "Bulk({:?}… {} bytes)", String::from_utf8_lossy(&b[..64]), b.len())
            }
            Reply::Bulk(b) => write!(f, "Bulk({:?})", String::from_utf8_lossy(b)),
            Reply::Nil => f.write_str("Nil"),
            Reply::Array(items) => f.debug_list().entries(items).finish(),
        }
    }
}

/// A stream that does not follow RESP2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtocolError {}

/// Appends `args` to `out` as one command: an array of bulk strings.
pub fn encode<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        let arg = arg.as_ref();
        out.push(b'$');
        out.extend_from_slice(arg.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses one reply from the start of `buf`: the reply and the bytes it took, `None` when
/// `buf` holds only part of it (read more and call again).
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, ProtocolError> {
    let mut pos = 0;
    match parse_at(buf, &mut pos, 0)? {
        Some(reply) => Ok(Some((reply, pos))),
        None => Ok(None),
    }
}

/// Finds where the first reply of a buffer that grows between reads ends, keeping how far
/// it got: each element of a reply is looked at once however many reads bring it, where
/// parsing from the start after each read went over every finished element again (and
/// copied its bytes), quadratic in a large array reply such as a snapshot of many pending
/// calls. Once [`Scanner::scan`] gives the reply's length, [`parse`] reads it in one pass.
///
/// It checks lengths and nesting as [`parse`] does, so that a broken stream is refused
/// before it is waited for to the end.
#[derive(Debug, Default)]
pub struct Scanner {
    /// Where the next element starts in the buffer: every element before it is whole.
    pos: usize,
    /// How many elements each array open at `pos` still lacks, the outermost first.
    open: Vec<usize>,
    /// Lines looked at since the scanner was made, for tests of its work.
    #[cfg(test)]
    lines: usize,
}

impl Scanner {
    /// The length of the first reply of `buf` once the whole of it is there, `None` while
    /// more is to come (read more and call again). Between calls `buf` keeps its bytes and
    /// may grow at its end; once this gives a length (or an error), call
    /// [`Scanner::reset`] before the buffer changes otherwise.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        loop {
            if self.open.len() > MAX_DEPTH {
                return Err(ProtocolError(format!("reply nested deeper than {MAX_DEPTH} levels")));
            }
            let Some(line) = line_at(buf, self.pos)? else { return Ok(None) };
            #[cfg(test)]
            {
                self.lines += 1;
            }
            let after_line = self.pos + line.len() + 2;
            let (kind, rest) = match line.split_first() {
                Some((kind, rest)) => (*kind, rest),
                None => return Err(ProtocolError("empty line where a reply was expected".into())),
            };
            let end = match kind {
                b'+' | b'-' | b':' => after_line,
                b'$' => match integer(rest)? {
                    len if len < 0 => after_line,
                    len => {
                        let end = after_line + length(len, MAX_BULK, "bulk string")?;
                        if buf.len() < end + 2 {
                            return Ok(None);
                        }
                        if &buf[end..end + 2] != b"\r\n" {
                            return Err(ProtocolError("bulk string not followed by CRLF".into()));
                        }
                        end + 2
                    }
                },
                b'*' => match integer(rest)? {
                    len if len <= 0 => after_line,
                    len => {
                        self.open.push(length(len, MAX_ARRAY, "array")?);
                        self.pos = after_line;
                        continue;
                    }
                },
                other => {
                    return Err(ProtocolError(format!("unknown reply type byte 0x{other:02x}")));
                }
            };
            self.pos = end;
            // An element is whole: so is each array it ends.
            loop {
                let Some(lacking) = self.open.last_mut() else { return Ok(Some(self.pos)) };
                *lacking -= 1;
                if *lacking > 0 {
                    break;
                }
                self.open.pop();
            }
        }
    }

    /// Starts again at the start of the buffer, for its next reply.
    pub fn reset(&mut self) {
        self.pos = 0;
        self.open.clear();
    }
}

fn parse_at(buf: &[u8], pos: &mut usize, depth: usize) -> Result<Option<Reply>, ProtocolError> {
    if depth > MAX_DEPTH {
        return Err(ProtocolError(format!("reply nested deeper than {MAX_DEPTH} levels")));
    }
    let Some(line) = line_at(buf, *pos)? else { return Ok(None) };
    let start = *pos;
    let after_line = start + line.len() + 2;
    let (kind, rest) = match line.split_first() {
        Some((kind, rest)) => (*kind, rest),
        None => return Err(ProtocolError("empty line where a reply was expected".into())),
    };
    let reply = match kind {
        b'+' => Reply::Simple(text(rest)?),
        b'-' => Reply::Error(text(rest)?),
        b':' => Reply::Integer(integer(rest)?),
        b'$' => {
            let len = integer(rest)?;
            if len < 0 {
                Reply::Nil
            } else {
                let len = length(len, MAX_BULK, "bulk string")?;
                let end = after_line + len;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(ProtocolError("bulk string not followed by CRLF".into()));
                }
                *pos = end + 2;
                return Ok(Some(Reply::Bulk(buf[after_line..end].to_vec())));
            }
        }
        b'*' => {
            let len = integer(rest)?;
            if len < 0 {
                Reply::Nil
            } else {
                let len = length(len, MAX_ARRAY, "array")?;
                *pos = after_line;
                // Reserve by what the buffer can hold, not by what the length claims.
                let mut items = Vec::with_capacity(len.min(buf.len() - after_line));
                for _ in 0..len {
                    match parse_at(buf, pos, depth + 1)? {
                        Some(item) => items.push(item),
                        None => {
                            *pos = start;
                            return Ok(None);
                        }
                    }
                }
                return Ok(Some(Reply::Array(items)));
            }
        }
        other => {
            return Err(ProtocolError(format!("unknown reply type byte 0x{other:02x}")));
        }
    };
    *pos = after_line;
    Ok(Some(reply))
}

/// The line starting at `pos`, without its CRLF; `None` when the CRLF has not arrived.
fn line_at(buf: &[u8], pos: usize) -> Result<Option<&[u8]>, ProtocolError> {
    let rest = &buf[pos.min(buf.len())..];
    match rest.windows(2).position(|w| w == b"\r\n") {
        Some(end) => Ok(Some(&rest[..end])),
        // A header or status line is short; a long run without CRLF is not RESP.
        None if rest.len() > 64 * 1024 => {
            Err(ProtocolError("a reply line longer than 64 KiB".into()))
        }
        None => Ok(None),
    }
}

fn text(bytes: &[u8]) -> Result<String, ProtocolError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| ProtocolError("a status line is not UTF-8".into()))
}

fn integer(bytes: &[u8]) -> Result<i64, ProtocolError> {
    std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok()).ok_or_else(|| {
        ProtocolError(format!("`{}` is not an integer", String::from_utf8_lossy(bytes)))
    })
}

fn length(len: i64, max: usize, what: &str) -> Result<usize, ProtocolError> {
    usize::try_from(len)
        .ok()
        .filter(|len| *len <= max)
        .ok_or_else(|| ProtocolError(format!("{what} of {len} elements or bytes is too long")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(input: &[u8]) -> Reply {
        let (reply, used) = parse(input).expect("valid").expect("complete");
        assert_eq!(used, input.len(), "the whole input is one reply");
        reply
    }

    #[test]
    fn encodes_commands_as_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode(&["SET", "k", "a\r\nb", ""], &mut out);
        assert_eq!(out, b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n$0\r\n\r\n");
    }

    #[test]
    fn parses_every_reply_type() {
        assert_eq!(one(b"+OK\r\n"), Reply::Simple("OK".into()));
        assert_eq!(one(b"-ERR no\r\n"), Reply::Error("ERR no".into()));
        assert_eq!(one(b":-42\r\n"), Reply::Integer(-42));
        assert_eq!(one(b"$5\r\na\r\nb!\r\n"), Reply::Bulk(b"a\r\nb!".to_vec()));
        assert_eq!(one(b"$0\r\n\r\n"), Reply::Bulk(Vec::new()));
        assert_eq!(one(b"$-1\r\n"), Reply::Nil);
        assert_eq!(one(b"*-1\r\n"), Reply::Nil);
        assert_eq!(one(b"*0\r\n"), Reply::Array(Vec::new()));
        assert_eq!(
            one(b"*3\r\n:1\r\n*2\r\n$1\r\nx\r\n$-1\r\n+y\r\n"),
            Reply::Array(vec![
                Reply::Integer(1),
                Reply::Array(vec![Reply::Bulk(b"x".to_vec()), Reply::Nil]),
                Reply::Simple("y".into()),
            ])
        );
    }

    #[test]
    fn partial_input_asks_for_more_at_every_cut() {
        let whole = b"*3\r\n:1\r\n*2\r\n$3\r\nabc\r\n$-1\r\n+y\r\n";
        for cut in 0..whole.len() {
            assert_eq!(parse(&whole[..cut]), Ok(None), "cut at {cut}");
        }
        let mut two = whole.to_vec();
        two.extend_from_slice(b":7\r\n");
        let (_, used) = parse(&two).unwrap().unwrap();
        assert_eq!(used, whole.len());
        assert_eq!(parse(&two[used..]).unwrap().unwrap().0, Reply::Integer(7));
    }

    /// A scanner fed `whole` a piece at a time, as reads bring it: None until the last
    /// piece, then the length of the first reply.
    fn scan_in_pieces(whole: &[u8], piece: usize) -> (Scanner, Option<usize>) {
        let mut scanner = Scanner::default();
        let mut end = 0;
        while end < whole.len() {
            end = (end + piece).min(whole.len());
            if let Some(len) = scanner.scan(&whole[..end]).expect("valid") {
                return (scanner, Some(len));
            }
        }
        (scanner, None)
    }

    #[test]
    fn the_scanner_finds_a_reply_whole_at_its_last_byte_and_not_before() {
        let whole = b"*3\r\n:1\r\n*2\r\n$3\r\nabc\r\n$-1\r\n+y\r\n";
        for cut in 0..whole.len() {
            assert_eq!(Scanner::default().scan(&whole[..cut]), Ok(None), "cut at {cut}");
        }
        for piece in 1..=whole.len() {
            assert_eq!(scan_in_pieces(whole, piece).1, Some(whole.len()), "pieces of {piece}");
        }
        let mut two = whole.to_vec();
        two.extend_from_slice(b"*0\r\n$2\r\nhi\r\n");
        let mut scanner = Scanner::default();
        assert_eq!(scanner.scan(&two), Ok(Some(whole.len())));
        scanner.reset();
        assert_eq!(scanner.scan(&two[whole.len()..]), Ok(Some(4)));
        scanner.reset();
        assert_eq!(scanner.scan(&two[whole.len() + 4..]), Ok(Some(8)));
    }

    /// A large array reply that comes in many reads is looked at once: each element's
    /// line once, and at most the one line cut by each read again. Parsing it from its
    /// start after each read looked at about reads × elements / 2 lines.
    #[test]
    fn a_large_reply_in_many_reads_is_scanned_once() {
        let elements = 10_000;
        let mut whole = format!("*{elements}\r\n").into_bytes();
        for i in 0..elements {
            let value = format!("pending call {i}");
            whole.extend_from_slice(format!("${}\r\n{value}\r\n", value.len()).as_bytes());
        }
        let piece = 100;
        let (scanner, len) = scan_in_pieces(&whole, piece);
        assert_eq!(len, Some(whole.len()));
        let reads = whole.len().div_ceil(piece);
        assert!(scanner.lines <= 1 + elements + reads, "{} lines for {reads} reads", scanner.lines);
        let (reply, used) = parse(&whole).expect("valid").expect("whole");
        assert_eq!(used, whole.len());
        assert_eq!(reply.as_array().map(<[Reply]>::len), Some(elements));
        assert_eq!(reply.as_array().and_then(|a| a[9_999].as_str()), Some("pending call 9999"));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_wait() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$3\r\nabcd\r\n",
            b"$99999999999\r\n",
            b"*-5x\r\n",
            b"\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
            // The scanner refuses it, or finds it whole and the parse then refuses it.
            let scanned = Scanner::default().scan(bad);
            assert!(
                scanned.is_err() || parse(bad).is_err() && scanned.is_ok_and(|len| len.is_some()),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
        assert!(Scanner::default().scan(deep.as_bytes()).is_err());
        // Refused before the rest of the reply is waited for.
        assert!(Scanner::default().scan(b"*2\r\n$99999999999\r\n").is_err());
    }
}
