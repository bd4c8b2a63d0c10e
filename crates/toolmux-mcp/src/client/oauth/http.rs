//! rmcp's streamable HTTP client with OAuth: every request carries the current token; a
//! `401` runs refresh or authorization and the request is sent once more, a `403` for
//! missing scope steps up at most [`MAX_STEP_UPS`] times.

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::Sse;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use super::{Challenged, MAX_STEP_UPS, OAuth};
use crate::transport::{Fault, FaultKind};

type HttpError = StreamableHttpError<reqwest::Error>;

/// The streamable HTTP client of a server that may ask for OAuth.
#[derive(Debug, Clone)]
pub(crate) struct OAuthHttp {
    inner: reqwest::Client,
    oauth: Arc<OAuth>,
    fault: Fault,
}

impl OAuthHttp {
    pub(crate) fn new(inner: reqwest::Client, oauth: Arc<OAuth>, fault: Fault) -> OAuthHttp {
        OAuthHttp { inner, oauth, fault }
    }

    /// Sends with the current token, answering the server's challenges.
    async fn with_token<T, F, Fut>(&self, mut send: F) -> Result<T, HttpError>
    where
        F: FnMut(Option<String>) -> Fut,
        Fut: Future<Output = Result<T, HttpError>>,
    {
        let mut reauthorized = false;
        let mut step_ups = 0;
        loop {
            let (token, generation) = self.oauth.bearer().await;
            let error = match send(token).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let (header, scope_needed) = match &error {
                HttpError::AuthRequired(e) if !reauthorized => {
                    (e.www_authenticate_header.clone(), false)
                }
                // A 401 without a challenge still means "authorize".
                HttpError::HttpStatus(status) if status.status == 401 && !reauthorized => {
                    (String::new(), false)
                }
                HttpError::UnexpectedServerResponse(text)
                    if text.starts_with("HTTP 401") && !reauthorized =>
                {
                    (String::new(), false)
                }
                HttpError::InsufficientScope(e) if step_ups < MAX_STEP_UPS => {
                    (e.www_authenticate_header.clone(), true)
                }
                _ => {
                    self.note_failure(&error);
                    return Err(error);
                }
            };
            if scope_needed {
                step_ups += 1;
            } else {
                reauthorized = true;
            }
            match self.oauth.challenged(&header, generation, scope_needed).await {
                Challenged::Retry => {}
                Challenged::GiveUp => {
                    self.note_failure(&error);
                    return Err(error);
                }
            }
        }
    }

    /// Records why a refused request failed, so the caller's error says it.
    fn note_failure(&self, error: &HttpError) {
        let refused = matches!(error, HttpError::AuthRequired(_) | HttpError::InsufficientScope(_));
        if let Some(failure) = self.oauth.failure().filter(|_| refused) {
            self.fault.set(FaultKind::Auth(failure.to_string()));
        } else if matches!(error, HttpError::InsufficientScope(_)) {
            self.fault.set(FaultKind::Auth(format!(
                "the server still refuses the token for insufficient scope after {MAX_STEP_UPS} \
                 authorizations asking for more"
            )));
        }
    }
}

impl StreamableHttpClient for OAuthHttp {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.with_token(|token| {
            self.inner.post_message(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token.or_else(|| auth_header.clone()),
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, HttpError> {
        self.with_token(|token| {
            self.inner.post_message_with_max_sse_event_size(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                token.or_else(|| auth_header.clone()),
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), HttpError> {
        // Closing a session is not worth an authorization.
        let (token, _) = self.oauth.bearer().await;
        self.inner.delete_session(uri, session_id, token.or(auth_header), custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        self.with_token(|token| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token.or_else(|| auth_header.clone()),
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        self.with_token(|token| {
            self.inner.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                token.or_else(|| auth_header.clone()),
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }
}
