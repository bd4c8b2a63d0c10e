//! The legacy HTTP+SSE transport of MCP 2024-11-05, which rmcp dropped: `GET` the SSE URL,
//! wait for the `endpoint` event naming where to `POST` messages, then read responses and
//! notifications as `message` events on the same stream.

use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use rmcp::RoleClient;
use rmcp::model::RequestId;
use rmcp::service::RxJsonRpcMessage;
use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use crate::client::connection::client_failure;
use crate::client::oauth::OAuth;
use tokio_util::sync::CancellationToken;
use toolmux_core::sse::{Event, EventParser};

use super::stdio::MESSAGE_MAX;
use super::{
    ChannelTransport, Delivery, Fault, FaultKind, PumpEnds, channel_transport, encode_message,
    parse_message,
};

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Messages being posted at once, at most: a POST the server is slow to answer does not
/// hold the messages after it, and a server that answers none is not sent more without
/// bound (the rest wait in the outbound channel, then in rmcp's sends).
const POSTS_IN_FLIGHT: usize = 16;

/// Connects: opens the event stream and waits for the `endpoint` event. The caller bounds
/// the wait with its startup timeout. Each message is then posted within `post_timeout`
/// (the server's request timeout).
pub(crate) async fn connect(
    server: &str,
    client: reqwest::Client,
    url: &str,
    oauth: Option<Arc<OAuth>>,
    post_timeout: Duration,
    fault: &Fault,
) -> Result<ChannelTransport, BoxError> {
    let base = reqwest::Url::parse(url)?;
    let get = || client.get(base.clone()).header(ACCEPT, "text/event-stream");
    // reqwest's errors name the URL, which may carry a secret (a key in its query): what
    // they say is told without it, as streamable HTTP's are.
    let response = match &oauth {
        Some(oauth) => crate::client::oauth::send(oauth, fault, "GET", base.as_str(), get).await,
        None => get().send().await,
    }
    .map_err(|e| client_failure(&e))?;
    if let Some(FaultKind::Auth(message)) = fault.get() {
        return Err(message.into());
    }
    let status = response.status();
    if !status.is_success() {
        let hint = match status.as_u16() {
            404 | 405 => "; is `url` the server's SSE endpoint?",
            _ => "",
        };
        return Err(format!("the server answered HTTP {status}{hint}").into());
    }
    let mut stream = response.bytes_stream();
    let mut parser = CappedParser::default();
    let mut pending = std::collections::VecDeque::new();
    let endpoint = 'found: loop {
        let Some(chunk) = stream.next().await else {
            return Err("the event stream ended before an `endpoint` event".into());
        };
        let chunk = chunk.map_err(|e| format!("the event stream broke: {}", without_url(&e)))?;
        let mut events = parser.push(&chunk)?.into_iter();
        while let Some(event) = events.next() {
            if event.name == "endpoint" {
                // What came with it is read after it.
                pending.extend(events);
                let endpoint = base.join(event.data.trim())?;
                // Messages carry the configured headers (tokens): only to the same origin.
                if endpoint.origin() != base.origin() {
                    return Err(format!(
                        "the `endpoint` event points to another origin ({})",
                        endpoint.origin().ascii_serialization()
                    )
                    .into());
                }
                break 'found endpoint;
            }
            pending.push_back(event);
        }
    };
    tracing::debug!(server, "sse endpoint received");

    let (transport, PumpEnds { mut outbound, inbound }) = channel_transport();
    let stop = CancellationToken::new();

    // Weak: the channel still ends with the reader, whatever the POSTs under way do.
    let answers = inbound.downgrade();
    // Reader: events to rmcp, until the stream ends or rmcp closes the connection.
    let reader_stop = stop.clone();
    let reader_fault = fault.clone();
    let reader_server = server.to_owned();
    tokio::spawn(async move {
        let _stop_writer = reader_stop.clone().drop_guard();
        let deliver = async |event: Event| -> bool {
            if event.name != "message" {
                return true;
            }
            match parse_message(event.data.as_bytes()) {
                Ok(message) => inbound.send(message).await.is_ok(),
                Err(why) => {
                    tracing::warn!(server = %reader_server, "sse message event is {why}");
                    reader_fault.set(FaultKind::Protocol(format!("sse message event is {why}")));
                    false
                }
            }
        };
        for event in pending {
            if !deliver(event).await {
                return;
            }
        }
        loop {
            let chunk = tokio::select! {
                () = reader_stop.cancelled() => return,
                chunk = stream.next() => chunk,
            };
            match chunk {
                Some(Ok(bytes)) => {
                    let events = match parser.push(&bytes) {
                        Ok(events) => events,
                        Err(why) => {
                            tracing::warn!(server = %reader_server, "sse stream carried {why}");
                            reader_fault.set(FaultKind::Protocol(format!(
                                "the event stream carried {why}"
                            )));
                            return;
                        }
                    };
                    for event in events {
                        if !deliver(event).await {
                            return;
                        }
                    }
                }
                Some(Err(e)) => {
                    let why = format!("event stream broke: {}", without_url(&e));
                    reader_fault.set(FaultKind::Closed(why));
                    return;
                }
                None => {
                    reader_fault
                        .set(FaultKind::Closed("the server closed the event stream".into()));
                    return;
                }
            }
        }
    });

    // Writer: each message is one POST to the endpoint, started in the order sent and up to
    // POSTS_IN_FLIGHT at once, each within `post_timeout`. One that fails or gets no answer
    // in time fails the request it carried; one that shows the session gone ends the
    // connection (see `Poster::post`).
    let poster = Arc::new(Poster {
        server: server.to_owned(),
        client,
        endpoint,
        oauth,
        timeout: post_timeout,
        fault: fault.clone(),
        stop: stop.clone(),
        answers,
    });
    tokio::spawn(async move {
        let _stop_reader = stop.clone().drop_guard();
        let mut posts = tokio::task::JoinSet::new();
        loop {
            while posts.try_join_next().is_some() {}
            if posts.len() >= POSTS_IN_FLIGHT {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = posts.join_next() => continue,
                }
            }
            let message = tokio::select! {
                () = stop.cancelled() => return,
                message = outbound.recv() => message,
            };
            let Some(mut message) = message else {
                // Closed: what was sent before is still posted (a cancellation sent just
                // before the close), each POST within its timeout.
                let posted = async { while posts.join_next().await.is_some() {} };
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = posted => {}
                }
                return;
            };
            // A tool call's `passthroughHeaders` travel beside the message, not in it.
            let passed = crate::client::passthrough::take(&mut message);
            let carried = match &message {
                rmcp::model::JsonRpcMessage::Request(request) => {
                    Carried::Request(request.id.clone())
                }
                rmcp::model::JsonRpcMessage::Response(answer) => Carried::Answer(answer.id.clone()),
                rmcp::model::JsonRpcMessage::Error(rmcp::model::JsonRpcError {
                    id: Some(id),
                    ..
                }) => Carried::Answer(id.clone()),
                _ => Carried::Other,
            };
            let body = match encode_message(&message) {
                Ok(body) => body,
                Err(e) => {
                    tracing::warn!("{e}");
                    continue;
                }
            };
            let poster = poster.clone();
            posts.spawn(async move { poster.post(body, passed, carried).await });
        }
    });
    Ok(transport)
}

/// What a posted message is, as far as a failed POST of it matters.
#[derive(Debug)]
enum Carried {
    /// Our request `id`: its POST's failure is its answer.
    Request(RequestId),
    /// Our answer to the server's request `id`: posted again after a transient failure
    /// (`transport::retry`), else the server's request waits for its timeout.
    Answer(RequestId),
    /// A notification.
    Other,
}

/// The headers a tool call passes on ([`crate::client::passthrough::take`]).
type Passed = std::collections::HashMap<reqwest::header::HeaderName, reqwest::header::HeaderValue>;

/// What posting a message needs, shared by the POSTs under way.
struct Poster {
    server: String,
    client: reqwest::Client,
    endpoint: reqwest::Url,
    oauth: Option<Arc<OAuth>>,
    /// The longest wait for one POST's answer.
    timeout: Duration,
    fault: Fault,
    /// Cancelled to end the connection.
    stop: CancellationToken,
    /// Where the error answer of a request whose POST failed goes (the reader's channel
    /// to rmcp).
    answers: tokio::sync::mpsc::WeakSender<RxJsonRpcMessage<RoleClient>>,
}

/// The start of a refusal's body read, to tell a session the server no longer knows.
const REFUSAL_READ: usize = 4096;

impl Poster {
    /// Posts one message. A POST that fails or gets no answer in time fails the request
    /// it carried alone (an error answer made here; a notification is lost, and logged),
    /// so that one message the server refuses or is slow to take does not fail every call
    /// on the connection. An answer to the server's request is posted again after a
    /// transient failure (no connection, 5xx, 429; `transport::retry`), and logged with
    /// the request's id when it is dropped. One that shows the session gone (the endpoint
    /// is unknown, 404 or 410, or a 400 speaking of the session; the credentials refused;
    /// the server unreachable) ends the connection, and the next call connects afresh.
    /// Errors never carry the endpoint's URL: its query may hold a key.
    async fn post(&self, body: Vec<u8>, passed: Passed, carried: Carried) {
        let mut retry = 0;
        loop {
            let (why, gone, delivery, delay) = match self.post_once(&body, &passed).await {
                Ok(()) => return,
                Err(Failed { why, gone, delivery, transient, retry_after }) => {
                    let delay = match (&carried, transient) {
                        (Carried::Answer(_), true) => {
                            super::retry::answer_retry_delay(retry, retry_after.as_deref())
                        }
                        _ => None,
                    };
                    (why, gone, delivery, delay)
                }
            };
            if let (Some(delay), Carried::Answer(id)) = (delay, &carried) {
                tracing::debug!(server = %self.server, %id, "an answer was not delivered: {why}; posting it again");
                retry += 1;
                tokio::select! {
                    () = self.stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => continue,
                }
            }
            self.failed(why, gone, delivery, carried).await;
            return;
        }
    }

    /// Tells what a message's POST failing means: the connection ended, a request failed,
    /// or a message dropped, logged.
    async fn failed(&self, why: String, gone: bool, delivery: Delivery, carried: Carried) {
        if gone {
            let why = format!("a message was not delivered: {why}");
            tracing::warn!(server = %self.server, "{why}; ending the connection");
            self.fault.set(FaultKind::Closed(why));
            self.stop.cancel();
            return;
        }
        let id = match carried {
            Carried::Request(id) => id,
            Carried::Answer(id) => {
                tracing::warn!(
                    server = %self.server,
                    %id,
                    "our answer to the server's request was dropped: {why}; the server's \
                     request waits for its timeout"
                );
                return;
            }
            Carried::Other => {
                tracing::warn!(server = %self.server, "a message to the server was lost: {why}");
                return;
            }
        };
        tracing::warn!(server = %self.server, "a request was not delivered: {why}; failing it");
        if let Some(answers) = self.answers.upgrade() {
            let _ = answers.send(super::undelivered_answer(id, why, delivery)).await;
        }
    }

    /// One POST of `body`: `Ok` when the server took it.
    async fn post_once(&self, body: &[u8], passed: &Passed) -> Result<(), Failed> {
        let build = || {
            let mut request = self
                .client
                .post(self.endpoint.clone())
                .timeout(self.timeout)
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_vec());
            for (name, value) in passed {
                request = request.header(name, value);
            }
            request
        };
        // The timeout is each request's, not the whole exchange's: a person approving a
        // new authorization in a browser is given the time that takes.
        let sent = match &self.oauth {
            Some(oauth) => {
                let endpoint = self.endpoint.as_str();
                crate::client::oauth::send(oauth, &self.fault, "POST", endpoint, build).await
            }
            None => build().send().await,
        };
        Err(match sent {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => {
                let status = response.status();
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                let gone = match status.as_u16() {
                    401 | 403 | 404 | 410 => true,
                    // The official SDKs answer 400 to a session id they do not know.
                    400 => refusal_start(response).await.to_lowercase().contains("session"),
                    _ => false,
                };
                Failed {
                    why: format!("the server answered its POST with HTTP {status}"),
                    gone,
                    delivery: Delivery::Failed,
                    transient: super::retry::transient_status(status.as_u16()),
                    retry_after,
                }
            }
            // Connected, and no answer in time: the server may have taken the message and
            // be running it. (reqwest tells a timeout while connecting apart only with a
            // connect timeout of its own; any other timeout is taken as after the sending.)
            Err(e) if e.is_timeout() && !e.is_connect() => Failed {
                why: format!(
                    "its POST got no answer within {} ms (`requestTimeoutMs`); the server is \
                     stuck or overloaded",
                    self.timeout.as_millis()
                ),
                gone: false,
                delivery: Delivery::Unknown,
                transient: false,
                retry_after: None,
            },
            Err(e) => Failed {
                why: format!("posting it failed: {}", without_url(&e)),
                gone: e.is_connect(),
                // Cut off after connecting (the connection reset while sending or waiting),
                // the server may have read the whole message.
                delivery: if e.is_connect() { Delivery::Failed } else { Delivery::Unknown },
                transient: e.is_connect(),
                retry_after: None,
            },
        })
    }
}

/// Why one POST failed.
#[derive(Debug)]
struct Failed {
    why: String,
    /// The session is gone: the connection ends.
    gone: bool,
    /// Whether the server may have taken the message.
    delivery: Delivery,
    /// The server did not take the message and may take it when sent again.
    transient: bool,
    /// The server's `Retry-After`.
    retry_after: Option<String>,
}

/// The start of a refused POST's body, as text (empty when it cannot be read).
async fn refusal_start(mut response: reqwest::Response) -> String {
    let mut start = Vec::new();
    while start.len() < REFUSAL_READ {
        match response.chunk().await {
            Ok(Some(chunk)) => start.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    start.truncate(REFUSAL_READ);
    String::from_utf8_lossy(&start).into_owned()
}

/// The events of a stream, none longer than [`MESSAGE_MAX`]: a server writing without end
/// must not take the gateway's memory with it (a stdio server's line and a WebSocket
/// message have the same bound).
#[derive(Debug)]
struct CappedParser {
    /// The longest event, in bytes.
    max: usize,
    parser: EventParser,
    /// Bytes of a line not yet ended, held here until its end comes: the parser looks
    /// through all it holds at every push, which for a long line read in many chunks
    /// would take time quadratic in its length.
    held: Vec<u8>,
    /// Bytes received since the last event ended (those of events ended in the same
    /// chunk, after the last, are not counted: a chunk's worth at most).
    since_event: usize,
}

impl Default for CappedParser {
    fn default() -> Self {
        CappedParser {
            max: MESSAGE_MAX,
            parser: EventParser::default(),
            held: Vec::new(),
            since_event: 0,
        }
    }
}

impl CappedParser {
    /// The events `chunk` completes, or what is wrong when the event under way passed the
    /// bound.
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<Event>, String> {
        self.since_event += chunk.len();
        if self.since_event > self.max {
            return Err(format!(
                "an event of over {} MiB, more than any message may be",
                self.max >> 20
            ));
        }
        if !chunk.contains(&b'\n') {
            self.held.extend_from_slice(chunk);
            return Ok(Vec::new());
        }
        let events = if self.held.is_empty() {
            self.parser.push(chunk)
        } else {
            self.held.extend_from_slice(chunk);
            let held = std::mem::take(&mut self.held);
            self.parser.push(&held)
        };
        if !events.is_empty() {
            self.since_event = self.parser.pending();
        }
        Ok(events)
    }
}

/// A reqwest error's message without its URL, which may carry a session id or token.
pub(crate) fn without_url(error: &reqwest::Error) -> String {
    let mut error_text = error.to_string();
    if let Some(url) = error.url() {
        error_text = error_text.replace(&format!(" for url ({url})"), "");
    }
    error_text
}

#[cfg(test)]
mod tests {
    use super::CappedParser;
    use toolmux_core::sse::EventParser;

    /// Events read in chunks cut anywhere are the parser's; an event longer than the
    /// bound is refused, however it is cut.
    #[test]
    fn events_are_read_whole_up_to_the_bound() {
        let stream =
            b"event: endpoint\ndata: /m\n\ndata: {\"a\":\ndata: 1}\n\n: ping\n\ndata: x\n\n";
        let whole = EventParser::default().push(stream);
        for size in 1..stream.len() {
            let mut parser = CappedParser { max: 64, ..CappedParser::default() };
            let events: Vec<_> =
                stream.chunks(size).flat_map(|chunk| parser.push(chunk).unwrap()).collect();
            assert_eq!(events, whole, "chunks of {size}");
        }
        for (chunk, long) in [(b"x".as_slice(), b"data: ".to_vec()), (b"data: y\n", Vec::new())] {
            let mut parser = CappedParser { max: 64, ..CappedParser::default() };
            parser.push(&long).unwrap();
            let refused = (0..100).find_map(|_| parser.push(chunk).err());
            assert_eq!(
                refused.as_deref(),
                Some("an event of over 0 MiB, more than any message may be")
            );
        }
    }
}
