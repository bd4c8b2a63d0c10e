//! The WebSocket transport: one JSON-RPC message per text frame, subprotocol `mcp`, as the
//! TypeScript SDK's WebSocket transport speaks it.

use futures::{SinkExt, StreamExt};
use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;

use super::stdio::MESSAGE_MAX;
use super::{
    ChannelTransport, Fault, FaultKind, PumpEnds, channel_transport, encode_message, parse_message,
};

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// How long the close frame may take to go out when the connection ends.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Connects and starts the pumps. The caller bounds the wait with its startup timeout; each
/// message is then sent within `send_timeout` (the server's request timeout).
pub(crate) async fn connect(
    server: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
    send_timeout: Duration,
    fault: &Fault,
) -> Result<ChannelTransport, BoxError> {
    super::super::client::ensure_crypto_provider();
    // A message, and its frame, as long as a stdio server's line may be (tungstenite's
    // defaults, 64 MiB and 16 MiB, failed results a stdio server could give).
    let limits = WebSocketConfig::default()
        .max_message_size(Some(MESSAGE_MAX))
        .max_frame_size(Some(MESSAGE_MAX));
    let connect = async |mcp_protocol: bool| {
        let request = request(url, headers, mcp_protocol)?;
        tokio_tungstenite::connect_async_with_config(request, Some(limits), false)
            .await
            .map(|(socket, _)| socket)
            .map_err(BoxError::from)
    };
    // Ask for the `mcp` subprotocol as the TypeScript SDK does; a server that does not
    // answer with it is tried again without asking.
    let socket = match connect(true).await {
        Ok(socket) => socket,
        Err(e)
            if matches!(
                e.downcast_ref::<WsError>(),
                Some(WsError::Protocol(ProtocolError::SecWebSocketSubProtocolError(_)))
            ) =>
        {
            connect(false).await?
        }
        Err(e) => return Err(e),
    };
    let (mut sink, mut stream) = socket.split();
    let (transport, PumpEnds { mut outbound, inbound }) = channel_transport();

    // Cancelled by the writer when it ends: a send that failed or got nowhere in time ends
    // the connection, so the calls waiting on it fail now.
    let stop = CancellationToken::new();
    let reader_stop = stop.clone();
    let reader_fault = fault.clone();
    let reader_server = server.to_owned();
    tokio::spawn(async move {
        let server = reader_server;
        loop {
            let message = tokio::select! {
                () = inbound.closed() => return,
                () = reader_stop.cancelled() => return,
                message = stream.next() => message,
            };
            let text = match message {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Binary(bytes))) => match String::from_utf8(bytes.to_vec()) {
                    Ok(text) => text.into(),
                    Err(_) => {
                        reader_fault.set(FaultKind::Protocol("binary frame is not UTF-8".into()));
                        return;
                    }
                },
                Some(Ok(Message::Close(frame))) => {
                    let why = frame
                        .map(|f| format!(" ({} {})", u16::from(f.code), f.reason))
                        .unwrap_or_default();
                    reader_fault
                        .set(FaultKind::Closed(format!("the server closed the websocket{why}")));
                    return;
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    reader_fault.set(FaultKind::Closed(format!("websocket broke: {e}")));
                    return;
                }
                None => {
                    reader_fault.set(FaultKind::Closed("the websocket ended".into()));
                    return;
                }
            };
            match parse_message(text.as_bytes()) {
                Ok(message) => {
                    if inbound.send(message).await.is_err() {
                        return;
                    }
                }
                Err(why) => {
                    tracing::warn!(server = %server, "websocket frame is {why}");
                    reader_fault.set(FaultKind::Protocol(format!("websocket frame is {why}")));
                    return;
                }
            }
        }
    });

    // Writer: one message at a time, each within `send_timeout`: a server that stops
    // reading fills the socket's buffers, and a send waiting on them held every later
    // message for ever.
    let writer_fault = fault.clone();
    let server = server.to_owned();
    tokio::spawn(async move {
        let _stop_reader = stop.drop_guard();
        while let Some(message) = outbound.recv().await {
            let Ok(Ok(text)) = encode_message(&message).map(String::from_utf8) else {
                continue;
            };
            let sent = tokio::time::timeout(send_timeout, sink.send(Message::Text(text.into())));
            let why = match sent.await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => format!("websocket send failed: {e}"),
                Err(_) => format!(
                    "a message sent to the server was not taken within {} ms \
                     (`requestTimeoutMs`); it stopped reading",
                    send_timeout.as_millis()
                ),
            };
            tracing::warn!(server = %server, "{why}; ending the connection");
            writer_fault.set(FaultKind::Closed(why));
            return;
        }
        let _ = tokio::time::timeout(CLOSE_GRACE, sink.close()).await;
    });
    Ok(transport)
}

fn request(
    url: &str,
    headers: &BTreeMap<String, String>,
    mcp_protocol: bool,
) -> Result<Request, BoxError> {
    let mut request = url.into_client_request()?;
    let request_headers = request.headers_mut();
    if mcp_protocol {
        request_headers.insert("Sec-WebSocket-Protocol", HeaderValue::from_static("mcp"));
    }
    for (name, value) in headers {
        // The error names the header, never its value (it may be a secret).
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("invalid header name `{name}`"))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("invalid value for header `{name}`"))?;
        request_headers.insert(header, value);
    }
    Ok(request)
}
