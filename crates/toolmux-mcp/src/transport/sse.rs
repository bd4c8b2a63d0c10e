//! The legacy HTTP+SSE transport of MCP 2024-11-05, which rmcp dropped: `GET` the SSE URL,
//! wait for the `endpoint` event naming where to `POST` messages, then read responses and
//! notifications as `message` events on the same stream.

use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use std::error::Error as StdError;
use std::sync::Arc;

use crate::client::connection::client_failure;
use crate::client::oauth::OAuth;
use tokio_util::sync::CancellationToken;
use toolmux_core::sse::{Event, EventParser};

use super::{
    ChannelTransport, Fault, FaultKind, PumpEnds, channel_transport, encode_message, parse_message,
};

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

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
    let mut parser = EventParser::default();
    let mut pending = std::collections::VecDeque::new();
    let endpoint = 'found: loop {
        let Some(chunk) = stream.next().await else {
            return Err("the event stream ended before an `endpoint` event".into());
        };
        let chunk = chunk.map_err(|e| format!("the event stream broke: {}", without_url(&e)))?;
        for event in parser.push(&chunk) {
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

    // Writer: each message is one POST to the endpoint, in order.
    let writer_fault = fault.clone();
    tokio::spawn(async move {
        let _stop_reader = stop.clone().drop_guard();
        loop {
            let message = tokio::select! {
                () = stop.cancelled() => return,
                message = outbound.recv() => message,
            };
            let Some(mut message) = message else { return };
            // A tool call's `passthroughHeaders` travel beside the message, not in it.
            let passed = crate::client::passthrough::take(&mut message);
            let body = match encode_message(&message) {
                Ok(body) => body,
                Err(e) => {
                    tracing::warn!("{e}");
                    continue;
                }
            };
            let post = || {
                let mut request = client
                    .post(endpoint.clone())
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.clone());
                for (name, value) in &passed {
                    request = request.header(name, value);
                }
                request
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
