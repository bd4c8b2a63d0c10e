//! An incremental parser of server-sent events (`text/event-stream`), for every client in
//! the workspace that reads them: MCP's legacy SSE transport and streamed model answers.
//!
//! ```
//! use toolmux_core::sse::{Event, EventParser};
//!
//! let mut parser = EventParser::default();
//! assert!(parser.push(b"event: delta\ndata: {\"a\":").is_empty());
//! let events = parser.push(b"1}\n\n: keep-alive\n\ndata: [DONE]\n\n");
//! assert_eq!(events, vec![
//!     Event { name: "delta".into(), data: "{\"a\":1}".into() },
//!     Event { name: "message".into(), data: "[DONE]".into() },
//! ]);
//! ```

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, `message` when absent.
    pub name: String,
    /// The `data:` lines joined by newlines.
    pub data: String,
}

/// An incremental parser of the `text/event-stream` format: bytes in as they arrive,
/// whole events out. Lines end with `\n` or `\r\n`; comments (`:`) and unknown fields are
/// skipped; an event without `data` is no event.
#[derive(Debug, Default)]
pub struct EventParser {
    /// Bytes of a line not yet ended.
    buffer: Vec<u8>,
    name: Option<String>,
    data: Option<String>,
}

impl EventParser {
    /// Feeds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(length) = self.buffer[start..].iter().position(|&b| b == b'\n') {
            let mut line = &self.buffer[start..start + length];
            start += length + 1;
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            let line = String::from_utf8_lossy(line);
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    let name = self.name.take().unwrap_or_else(|| "message".into());
                    events.push(Event { name, data });
                }
                self.name = None;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (&*line, ""),
            };
            match field {
                "event" => self.name = Some(value.to_owned()),
                "data" => match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_owned()),
                },
                _ => {}
            }
        }
        // One move per push, however many lines it held.
        self.buffer.drain(..start);
        events
    }

    /// Bytes received and not yet ended by a line break.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_across_chunks() {
        let mut parser = EventParser::default();
        assert!(parser.push(b"event: endpoint\r\ndata: /message?sess").is_empty());
        let events = parser.push(b"ionId=1\r\n\r\n: keepalive\n\ndata: {\"a\":\ndata: 1}\n\n");
        assert_eq!(
            events,
            vec![
                Event { name: "endpoint".into(), data: "/message?sessionId=1".into() },
                Event { name: "message".into(), data: "{\"a\":\n1}".into() },
            ]
        );
        assert_eq!(parser.pending(), 0);
    }

    #[test]
    fn a_line_split_anywhere_reads_the_same() {
        let stream = "event: content_block_delta\r\ndata: {\"text\":\"é\"}\r\n\r\nid: 7\nretry: 10\ndata\n\n";
        let whole = EventParser::default().push(stream.as_bytes());
        for cut in 0..stream.len() {
            let mut parser = EventParser::default();
            let mut events = parser.push(&stream.as_bytes()[..cut]);
            events.extend(parser.push(&stream.as_bytes()[cut..]));
            assert_eq!(events, whole, "cut at {cut}");
        }
        assert_eq!(whole.len(), 2);
        assert_eq!(whole[1], Event { name: "message".into(), data: String::new() });
    }
}
