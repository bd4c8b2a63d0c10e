//! Our answers to a server's requests (sampling, elicitation, `roots/list`, `ping`) posted
//! again after a transient failure, over streamable HTTP and legacy SSE: such an answer
//! is lost otherwise, and the server's request, and the call waiting on it, runs to its
//! timeout. Only failures that show the answer was not taken are tried again: no
//! connection, a 5xx, or a 429 (after its `Retry-After`, up to [`RETRY_AFTER_MAX`]). A
//! POST that timed out is not, since the server may have taken it.

use std::time::Duration;

/// The waits before the answer's POST is sent again, one per retry.
const BACKOFF: [Duration; 2] = [Duration::from_millis(100), Duration::from_millis(400)];

/// The longest `Retry-After` waited for: the server's request waits meanwhile, and
/// streamable HTTP gives an answer's POST five seconds in all.
pub(crate) const RETRY_AFTER_MAX: Duration = Duration::from_secs(1);

/// How long to wait before retry `retry` (0 for the first) of an answer whose POST failed
/// transiently, `retry_after` the server's `Retry-After` if it sent one; `None` when the
/// answer has been tried often enough.
pub(crate) fn answer_retry_delay(retry: usize, retry_after: Option<&str>) -> Option<Duration> {
    let backoff = *BACKOFF.get(retry)?;
    // Only delay-seconds: an HTTP date is as good as none for a wait this short.
    let asked = retry_after.and_then(|value| value.trim().parse::<u64>().ok());
    Some(
        asked.map_or(backoff, |seconds| {
            Duration::from_secs(seconds).clamp(backoff, RETRY_AFTER_MAX)
        }),
    )
}

/// Whether an HTTP status shows an answer's POST was not taken and may be sent again.
pub(crate) fn transient_status(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_tried_twice_more_waiting_at_most_a_second() {
        let ms = Duration::from_millis;
        assert_eq!(answer_retry_delay(0, None), Some(ms(100)));
        assert_eq!(answer_retry_delay(1, None), Some(ms(400)));
        assert_eq!(answer_retry_delay(2, None), None);
        assert_eq!(answer_retry_delay(0, Some("3600")), Some(RETRY_AFTER_MAX));
        assert_eq!(answer_retry_delay(0, Some("0")), Some(ms(100)));
        assert_eq!(answer_retry_delay(1, Some("Fri, 27 Nov 2026 23:00:00 GMT")), Some(ms(400)));
        assert!(transient_status(429) && transient_status(503) && !transient_status(404));
        assert!(!transient_status(400) && !transient_status(200));
    }
}
