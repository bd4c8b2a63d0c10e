//! Distributed tracing: the W3C Trace Context a caller sends ([`TraceParent`]) and the ids
//! of toolmux's own spans, derived so that whoever needs one (the OpenTelemetry exporter
//! writing a span, a provider telling an upstream server its parent) computes the same
//! without state kept per call.
//!
//! A run's calls share one trace (unless the caller's trace is joined); a call's span id
//! comes from its run and operation. Both mix in a salt drawn once per process, so two
//! processes' runs of the same name never share ids.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A caller's place in a distributed trace: a W3C Trace Context `traceparent`
/// (`00-{trace id}-{parent span id}-{flags}`), as an MCP client sends it in a request's
/// `_meta` or an HTTP client in the `traceparent` header, so that the spans of the calls it
/// causes join its trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace's id; never all zeros.
    pub trace_id: [u8; 16],
    /// The caller's span, the parent of ours; never all zeros.
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value; `None` when it is not a valid one (which the W3C
    /// specification says to ignore, starting a trace of one's own). A version other than
    /// `00` (but not the invalid `ff`) is read by the `00` layout, as the specification
    /// asks, when what follows is `-` or nothing.
    pub fn parse(value: &str) -> Option<TraceParent> {
        // Read as bytes: the fields are ASCII, and slicing the text would panic on a
        // character of several bytes straddling a field's boundary.
        let bytes = value.trim().as_bytes();
        if bytes.len() < 55 {
            return None;
        }
        let version = hex_bytes::<1>(&bytes[0..2])?[0];
        let exact = bytes.len() == 55;
        if version == 0xff || (version == 0 && !exact) || (!exact && bytes[55] != b'-') {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex_bytes::<16>(&bytes[3..35])?;
        let span_id = hex_bytes::<8>(&bytes[36..52])?;
        let flags = hex_bytes::<1>(&bytes[53..55])?[0];
        if trace_id.iter().all(|b| *b == 0) || span_id.iter().all(|b| *b == 0) {
            return None;
        }
        Some(TraceParent { trace_id, span_id, flags })
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for byte in self.trace_id {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("-")?;
        for byte in self.span_id {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

/// `N` bytes from `2N` lowercase hex digits (W3C Trace Context allows no capitals).
fn hex_bytes<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = value(pair[0])? << 4 | value(pair[1])?;
    }
    Some(out)
}

/// The process's salt: two random words from the standard library's randomly keyed hasher.
fn salt() -> &'static [u64; 2] {
    static SALT: OnceLock<[u64; 2]> = OnceLock::new();
    SALT.get_or_init(|| {
        let state = std::hash::RandomState::new();
        let word = |n: u64| state.hash_one((n, std::process::id()));
        [word(1), word(2)]
    })
}

/// `N` bytes from the salt, the run and the operation; never all zeros (an invalid id).
fn derive<const N: usize>(run: &str, op: Option<u64>) -> [u8; N] {
    let mut bytes = [0u8; N];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        let mut hasher = std::hash::DefaultHasher::new();
        (salt(), run, op, i).hash(&mut hasher);
        let word = hasher.finish().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    if bytes.iter().all(|b| *b == 0) {
        bytes[0] = 1;
    }
    bytes
}

/// The trace of a run's calls when no caller's trace is joined.
pub fn run_trace_id(run: &str) -> [u8; 16] {
    derive(run, None)
}

/// The span of operation `op` of run `run`.
pub fn span_id(run: &str, op: u64) -> [u8; 8] {
    derive(run, Some(op))
}

/// Span exporters running in this process.
static EXPORTERS: AtomicUsize = AtomicUsize::new(0);

/// Held by a span exporter while it runs: spans are then written, so outgoing requests
/// name their call's span as parent ([`crate::CallContext::outgoing_trace`]).
#[derive(Debug)]
pub struct ExportingSpans(());

impl ExportingSpans {
    /// Marks spans as exported until the value is dropped.
    pub fn start() -> ExportingSpans {
        EXPORTERS.fetch_add(1, Ordering::AcqRel);
        ExportingSpans(())
    }
}

impl Drop for ExportingSpans {
    fn drop(&mut self) {
        EXPORTERS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a span exporter runs in this process.
pub fn spans_exported() -> bool {
    EXPORTERS.load(Ordering::Acquire) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_parents_parse_as_w3c_trace_context_says() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(valid).expect("valid");
        assert_eq!(parsed.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert_eq!(parsed.flags, 1);
        assert_eq!(parsed.to_string(), valid);
        // A later version with more after the fields is read by version 00's layout.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert_eq!(TraceParent::parse(later).map(|t| t.trace_id), Some(parsed.trace_id));
        for invalid in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47-3600f067aa0ba902b7-01",
            // A character of several bytes in or across a field (the first straddles the
            // version's end): not valid, and no panic.
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473é00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bé-1",
        ] {
            assert_eq!(TraceParent::parse(invalid), None, "{invalid}");
        }
    }

    #[test]
    fn ids_are_stable_per_run_and_operation() {
        assert_eq!(span_id("run-a", 3), span_id("run-a", 3));
        assert_ne!(span_id("run-a", 3), span_id("run-a", 4));
        assert_ne!(span_id("run-a", 3), span_id("run-b", 3));
        assert_eq!(run_trace_id("run-a"), run_trace_id("run-a"));
        assert_ne!(run_trace_id("run-a"), run_trace_id("run-b"));
    }
}
