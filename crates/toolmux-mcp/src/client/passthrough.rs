//! `passthroughHeaders`: headers of the gateway's client, passed on with each tool call to
//! a streamable HTTP server or a legacy HTTP+SSE one (whose messages are posted by
//! `transport::sse`, which takes them out the same way).
//!
//! rmcp sends a connection's requests from its own tasks, where nothing of the calling
//! context is reachable, so the call carries the headers in its request's `_meta` under a
//! private key ([`PASSTHROUGH_META_KEY`]), and [`Passthrough`], the connection's HTTP
//! client, takes them out of the message and sends them as headers: they never reach the
//! server inside the message. The same client tells rmcp when a server refused the
//! session in a way rmcp does not recognize (see [`refusals_told`]).

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, RequestId};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use serde_json::Value;
use sse_stream::Sse;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::handler::Events;
use crate::transport::retry::{answer_retry_delay, transient_status};

/// The private `_meta` key of the headers to pass on.
pub(crate) const PASSTHROUGH_META_KEY: &str = "io.toolmux/passthrough-headers";

/// Whether a header named so may be passed on at all.
pub(crate) fn passable(name: &str) -> bool {
    toolmux_core::passable_header(name)
}

/// An HTTP client that sends the headers a `tools/call` carries under
/// [`PASSTHROUGH_META_KEY`] as headers, and takes them out of the message.
#[derive(Debug, Clone)]
pub(crate) struct Passthrough<C> {
    pub(crate) client: C,
    /// Told that the tool list may have changed when the server refuses the session:
    /// rmcp then starts a new one unseen, and the server behind it may have restarted
    /// with other tools.
    pub(crate) renewed: Weak<Events>,
    /// The server's name, for the log.
    pub(crate) server: Arc<str>,
}

impl<C> Passthrough<C> {
    /// `response`, with the server's refusals told (see [`refusals_told`]); a session
    /// expiry has the tools listed again.
    fn told<E: std::error::Error + Send + Sync + 'static>(
        &self,
        response: Result<StreamableHttpPostResponse, HttpError<E>>,
        in_session: bool,
    ) -> Result<StreamableHttpPostResponse, HttpError<E>> {
        let response = refusals_told(response, in_session);
        if matches!(response, Err(StreamableHttpError::SessionExpired))
            && let Some(events) = self.renewed.upgrade()
        {
            events.tools_changed.notify_one();
        }
        response
    }
}

/// What rmcp's SSE reader says of an event over its limit (`SSE event exceeded the maximum
/// size of N bytes`), the error's type being private.
const EVENT_TOO_LARGE: &str = "exceeded the maximum size";

/// The SSE stream of the answer to request `id`, where an event over `max` bytes ends it
/// with an error answer to the request that says so: rmcp ends the stream and the request
/// then failed as if the server had closed it, the size never told.
fn too_large_told(
    stream: BoxStream<'static, Result<Sse, SseError>>,
    id: RequestId,
    max: usize,
) -> BoxStream<'static, Result<Sse, SseError>> {
    use futures::StreamExt as _;

    let mut ended = false;
    stream
        .map(move |item| match item {
            Err(error) if error.to_string().contains(EVENT_TOO_LARGE) => {
                let why = format!(
                    "the server's answer came as an SSE event of over {} MiB, more than any \
                     message may be, and was not read",
                    max >> 20
                );
                let data = serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "error": {
                        "code": rmcp::model::ErrorCode::INTERNAL_ERROR.0,
                        "message": why,
                        "data": { crate::transport::ANSWER_LOST_KEY: true },
                    },
                });
                Ok(Sse { event: None, data: Some(data.to_string()), id: None, retry: None })
            }
            other => other,
        })
        // Nothing follows the event that said so.
        .take_while(move |item| {
            let go = !ended;
            ended |= item.as_ref().is_ok_and(|sse| {
                sse.data.as_deref().is_some_and(|d| d.contains(crate::transport::ANSWER_LOST_KEY))
            });
            std::future::ready(go)
        })
        .boxed()
}

/// The headers `message` carries to pass on, taken out of it.
pub(crate) fn take(message: &mut ClientJsonRpcMessage) -> HashMap<HeaderName, HeaderValue> {
    let mut headers = HashMap::new();
    let JsonRpcMessage::Request(request) = message else { return headers };
    let ClientRequest::CallToolRequest(call) = &mut request.request else { return headers };
    let Some(meta) = call.params.meta.as_mut() else { return headers };
    let Some(Value::Object(passed)) = meta.0.0.remove(PASSTHROUGH_META_KEY) else {
        return headers;
    };
    if meta.0.0.is_empty() {
        call.params.meta = None;
    }
    for (name, value) in passed {
        let (Ok(name), Some(value)) = (HeaderName::from_bytes(name.as_bytes()), value.as_str())
        else {
            continue;
        };
        if let Ok(mut value) = HeaderValue::from_str(value) {
            value.set_sensitive(true);
            headers.insert(name, value);
        }
    }
    headers
}

type HttpError<E> = StreamableHttpError<E>;

/// The id of the server's request `message` answers, when it is an answer.
fn answered(message: &ClientJsonRpcMessage) -> Option<&RequestId> {
    match message {
        JsonRpcMessage::Response(answer) => Some(&answer.id),
        JsonRpcMessage::Error(error) => error.id.as_ref(),
        JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => None,
    }
}

/// Whether a POST's failure shows the server did not take the message and may take it
/// when sent again (no connection, 5xx, 429), with the server's `Retry-After`.
fn transient<E: std::error::Error + Send + Sync + 'static>(
    error: &HttpError<E>,
) -> Option<Option<&str>> {
    match error {
        StreamableHttpError::HttpStatus(status) if transient_status(status.status) => {
            Some(status.retry_after.as_deref())
        }
        StreamableHttpError::Client(error) => {
            let error: &(dyn std::error::Error + 'static) = error;
            error.downcast_ref::<reqwest::Error>().filter(|e| e.is_connect()).map(|_| None)
        }
        _ => None,
    }
}

/// A POST's answer with the server's refusals of it made errors rmcp acts on.
///
/// A server that no longer knows the session (it restarted) should answer 404, on which
/// rmcp starts a new session and sends the request again. Servers built on the TypeScript
/// SDK's README answer 400 with a JSON-RPC error whose `id` is null (rmcp drops it as
/// answering nothing, and the call waited for its timeout), server-everything the same
/// with the request's id (the call failed, and every later one, for good). So, for a
/// POST within a session: an error without an id, an error that speaks of the session
/// and comes without the session's header (every answer within a session carries it), or
/// a 400 that is not JSON-RPC, is the session's expiry. Outside a session, an error
/// without an id fails the request with the server's words.
fn refusals_told<E: std::error::Error + Send + Sync + 'static>(
    response: Result<StreamableHttpPostResponse, HttpError<E>>,
    in_session: bool,
) -> Result<StreamableHttpPostResponse, HttpError<E>> {
    match response {
        Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(error), header)) => {
            let speaks_of_session =
                header.is_none() && error.error.message.to_ascii_lowercase().contains("session");
            if in_session && (error.id.is_none() || speaks_of_session) {
                tracing::debug!(
                    code = error.error.code.0,
                    message = %error.error.message,
                    "the server refused the session; starting a new one"
                );
                return Err(StreamableHttpError::SessionExpired);
            }
            if error.id.is_none() {
                let refusal = format!(
                    "the server refused the message: {} (code {})",
                    error.error.message, error.error.code.0
                );
                return Err(StreamableHttpError::UnexpectedServerResponse(refusal.into()));
            }
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(error), header))
        }
        Err(StreamableHttpError::UnexpectedServerResponse(text))
            if in_session && text.starts_with("HTTP 400") =>
        {
            tracing::debug!("the server refused the session ({text}); starting a new one");
            Err(StreamableHttpError::SessionExpired)
        }
        other => other,
    }
}

impl<C: StreamableHttpClient + Send + Sync> StreamableHttpClient for Passthrough<C> {
    type Error = C::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError<C::Error>> {
        custom_headers.extend(take(&mut message));
        let in_session = session_id.is_some();
        let response =
            self.client.post_message(uri, message, session_id, auth_header, custom_headers).await;
        self.told(response, in_session)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        mut message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError<C::Error>> {
        custom_headers.extend(take(&mut message));
        let in_session = session_id.is_some();
        let answer = answered(&message);
        let request = match &message {
            JsonRpcMessage::Request(request) => Some(request.id.clone()),
            _ => None,
        };
        let mut retry = 0;
        loop {
            let response = self
                .client
                .post_message_with_max_sse_event_size(
                    uri.clone(),
                    message.clone(),
                    session_id.clone(),
                    auth_header.clone(),
                    custom_headers.clone(),
                    max_sse_event_size,
                )
                .await;
            // An answer to the server's request is posted again after a transient failure
            // (`transport::retry`): rmcp drops it otherwise, and the server's request
            // waits for its timeout. rmcp bounds the whole, retries too, by its timeout
            // of answers' POSTs (five seconds).
            if let (Some(id), Err(error)) = (answer, &response) {
                match transient(error).and_then(|after| answer_retry_delay(retry, after)) {
                    Some(delay) => {
                        tracing::debug!(server = %self.server, %id, "an answer was not delivered: {error}; posting it again");
                        retry += 1;
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    None => tracing::warn!(
                        server = %self.server,
                        %id,
                        "our answer to the server's request was dropped: {error}; the server's \
                         request waits for its timeout"
                    ),
                }
            }
            let response = match (response, request.clone()) {
                (Ok(StreamableHttpPostResponse::Sse(stream, session)), Some(id)) => {
                    let stream = too_large_told(stream, id, max_sse_event_size);
                    Ok(StreamableHttpPostResponse::Sse(stream, session))
                }
                (other, _) => other,
            };
            return self.told(response, in_session);
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError<C::Error>> {
        self.client.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError<C::Error>> {
        self.client.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError<C::Error>> {
        self.client
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{CallToolRequest, CallToolRequestParams};

    #[test]
    fn the_headers_leave_the_message() {
        let mut params = CallToolRequestParams::new("echo");
        let meta = &mut params.meta.get_or_insert_default().0;
        meta.0.insert(
            PASSTHROUGH_META_KEY.into(),
            serde_json::json!({"x-tenant-id": "acme", "bad name": "x"}),
        );
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let mut message = ClientJsonRpcMessage::request(request, RequestId::Number(1));
        let headers = take(&mut message);
        assert_eq!(headers.len(), 1);
        assert_eq!(headers[&HeaderName::from_static("x-tenant-id")], "acme");
        let sent = serde_json::to_string(&message).unwrap();
        assert!(!sent.contains("passthrough") && !sent.contains("acme"), "{sent}");
        assert!(!passable("Mcp-Session-Id") && passable("X-Tenant-Id"));
    }
}
