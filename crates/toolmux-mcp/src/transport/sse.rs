//! The legacy HTTP+SSE transport of MCP 2024-11-05, which rmcp dropped: `GET` the SSE URL,
//! wait for the `endpoint` event naming where to `POST` messages, then read responses and
//! notifications as `message` events on the same stream.

use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use std::error::Error as StdError;
use std::sync::Arc;

use crate::client::oauth::OAuth;
use tokio_util::sync::CancellationToken;

use super::{
    ChannelTransport, Fault, FaultKind, PumpEnds, channel_transport, encode_message, parse_message,
};

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The `event:` field, `message` when absent.
    pub(crate) name: String,
    /// The `data:` lines joined by newlines.
    pub(crate) data: String,
}

/// An incremental parser of the `text/event-stream` format.
#[derive(Debug, Default)]
pub(crate) struct EventParser {
    buffer: Vec<u8>,
    name: Option<String>,
    data: Option<String>,
}

impl EventParser {
    /// Feeds bytes; returns the events they complete.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
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
                None => (line.as_str(), ""),
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
        events
    }
}

/// Connects: opens the event stream and waits for the `endpoint` event. The caller bounds
/// the wait with its startup timeout.
pub(crate) async fn connect(
    server: &str,
    client: reqwest::Client,
    url: &str,
    oauth: Option<Arc<OAuth>>,
    fault: &Fault,
) -> Result<ChannelTransport, BoxError> {
    let base = reqwest::Url::parse(url)?;
    let get = || client.get(base.clone()).header(ACCEPT, "text/event-stream");
    let response = match &oauth {
        Some(oauth) => crate::client::oauth::send(oauth, fault, "GET", base.as_str(), get).await?,
        None => get().send().await?,
    };
    if let Some(FaultKind::Auth(message)) = fault.get() {
        return Err(message.into());
    }
    let response = response.error_for_status()?;
    let mut stream = response.bytes_stream();
    let mut parser = EventParser::default();
    let mut pending = std::collections::VecDeque::new();
    let endpoint = 'found: loop {
        let Some(chunk) = stream.next().await else {
            return Err("the event stream ended before an `endpoint` event".into());
        };
        for event in parser.push(&chunk?) {
            if event.name == "endpoint" {
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
                    for event in parser.push(&bytes) {
                        if !deliver(event).await {
                            return;
                        }
                    }
                }
                Some(Err(e)) => {
                    reader_fault.set(FaultKind::Closed(format!("event stream broke: {e}")));
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

    // Writer: each message is one POST to the endpoint, in order.
    let writer_fault = fault.clone();
    tokio::spawn(async move {
        let _stop_reader = stop.clone().drop_guard();
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => return,
                message = outbound.recv() => message,
            };
            let Some(message) = message else { return };
            let body = match encode_message(&message) {
                Ok(body) => body,
                Err(e) => {
                    tracing::warn!("{e}");
                    continue;
                }
            };
            let post = || {
                client
                    .post(endpoint.clone())
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.clone())
            };
            let sent = match &oauth {
                Some(oauth) => {
                    crate::client::oauth::send(
                        oauth,
                        &writer_fault,
                        "POST",
                        endpoint.as_str(),
                        post,
                    )
                    .await
                }
                None => post().send().await,
            }
            .and_then(reqwest::Response::error_for_status);
            if let Err(e) = sent {
                writer_fault.set(FaultKind::Closed(format!(
                    "posting a message failed: {}",
                    without_url(&e)
                )));
                return;
            }
        }
    });
    Ok(transport)
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
    }
}
