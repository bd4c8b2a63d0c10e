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

    /// Sends `method` to `uri` with the current token (and for a DPoP-bound token a fresh
    /// proof), answering the server's challenges.
    async fn with_token<T, F, Fut>(
        &self,
        method: &str,
        uri: &str,
        auth_header: Option<String>,
        custom_headers: &HashMap<HeaderName, HeaderValue>,
        mut send: F,
    ) -> Result<T, HttpError>
    where
        F: FnMut(Option<String>, HashMap<HeaderName, HeaderValue>) -> Fut,
        Fut: Future<Output = Result<T, HttpError>>,
    {
        let mut reauthorized = false;
        let mut step_ups = 0;
        let mut nonces = 0;
        loop {
            let (credential, generation) = self.oauth.bearer().await;
            let (auth, headers) =
                self.present(credential.as_ref(), method, uri, &auth_header, custom_headers);
            let error = match send(auth, headers).await {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            // A DPoP server asking for a nonce: learn it and send again (RFC 9449 §9).
            if let (HttpError::AuthRequired(e), Some(credential)) = (&error, &credential)
                && credential.dpop.is_some()
                && nonces < 2
                && e.www_authenticate_header.contains("use_dpop_nonce")
            {
                nonces += 1;
                if self.oauth.learn_rs_nonce(credential, uri).await {
                    continue;
                }
            }
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

    /// The bearer token for rmcp to send, or for a DPoP-bound token the `Authorization`
    /// and `DPoP` headers, added to `custom_headers`.
    fn present(
        &self,
        credential: Option<&super::Credential>,
        method: &str,
        uri: &str,
        auth_header: &Option<String>,
        custom_headers: &HashMap<HeaderName, HeaderValue>,
    ) -> (Option<String>, HashMap<HeaderName, HeaderValue>) {
        let mut headers = custom_headers.clone();
        let auth = match credential {
            Some(credential) if credential.dpop.is_some() => {
                let nonce = self.oauth.rs_nonce();
                match credential.headers(method, uri, nonce.as_deref()) {
                    Ok((authorization, proof)) => {
                        insert(&mut headers, reqwest::header::AUTHORIZATION, &authorization);
                        if let Some(proof) = proof {
                            insert(&mut headers, HeaderName::from_static("dpop"), &proof);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot make a DPoP proof"),
                }
                None
            }
            Some(credential) => Some(credential.token.clone()),
            None => auth_header.clone(),
        };
        (auth, headers)
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

/// Sends the request `build` makes (`method` to `url`) with the current token, answering
/// the server's challenges as [`OAuthHttp`] does: for transports written here (legacy
/// SSE), which see the response headers themselves. A refusal that authorization cannot
/// answer is returned as the response, its reason recorded in `fault`.
pub(crate) async fn send(
    oauth: &OAuth,
    fault: &Fault,
    method: &str,
    url: &str,
    build: impl Fn() -> reqwest::RequestBuilder,
) -> reqwest::Result<reqwest::Response> {
    let mut reauthorized = false;
    let mut step_ups = 0;
    let mut nonces = 0;
    loop {
        let (credential, generation) = oauth.bearer().await;
        let mut request = build();
        if let Some(credential) = &credential {
            let nonce = oauth.rs_nonce();
            match credential.headers(method, url, nonce.as_deref()) {
                Ok((authorization, proof)) => {
                    let mut value = HeaderValue::from_str(&authorization)
                        .unwrap_or_else(|_| HeaderValue::from_static(""));
                    value.set_sensitive(true);
                    request = request.header(reqwest::header::AUTHORIZATION, value);
                    if let Some(proof) = proof {
                        request = request.header("DPoP", proof);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot make a DPoP proof"),
            }
        }
        let response = request.send().await?;
        let status = response.status();
        if status != reqwest::StatusCode::UNAUTHORIZED && status != reqwest::StatusCode::FORBIDDEN {
            return Ok(response);
        }
        let header = response
            .headers()
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if let Some(nonce) = response.headers().get("DPoP-Nonce").and_then(|v| v.to_str().ok())
            && credential.as_ref().is_some_and(|c| c.dpop.is_some())
            && header.contains("use_dpop_nonce")
            && nonces < 2
        {
            nonces += 1;
            oauth.set_rs_nonce(nonce.to_owned());
            continue;
        }
        let scope_needed = status == reqwest::StatusCode::FORBIDDEN;
        let allowed = if scope_needed {
            header.contains("insufficient_scope") && step_ups < MAX_STEP_UPS
        } else {
            !reauthorized
        };
        if !allowed {
            if let Some(failure) = oauth.failure() {
                fault.set(FaultKind::Auth(failure.to_string()));
            }
            return Ok(response);
        }
        if scope_needed {
            step_ups += 1;
        } else {
            reauthorized = true;
        }
        if let Challenged::GiveUp = oauth.challenged(&header, generation, scope_needed).await {
            if let Some(failure) = oauth.failure() {
                fault.set(FaultKind::Auth(failure.to_string()));
            }
            return Ok(response);
        }
    }
}

/// Adds a sensitive header.
fn insert(headers: &mut HashMap<HeaderName, HeaderValue>, name: HeaderName, value: &str) {
    if let Ok(mut value) = HeaderValue::from_str(value) {
        value.set_sensitive(true);
        headers.insert(name, value);
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
        self.with_token("POST", &uri, auth_header, &custom_headers, |auth, headers| {
            self.inner.post_message(uri.clone(), message.clone(), session_id.clone(), auth, headers)
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
        self.with_token("POST", &uri, auth_header, &custom_headers, |auth, headers| {
            self.inner.post_message_with_max_sse_event_size(
                uri.clone(),
                message.clone(),
                session_id.clone(),
                auth,
                headers,
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
        // Closing a session is not worth an authorization: one attempt.
        let (credential, _) = self.oauth.bearer().await;
        let (auth, headers) =
            self.present(credential.as_ref(), "DELETE", &uri, &auth_header, &custom_headers);
        self.inner.delete_session(uri, session_id, auth, headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, HttpError> {
        self.with_token("GET", &uri, auth_header, &custom_headers, |auth, headers| {
            self.inner.get_stream(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                auth,
                headers,
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
        self.with_token("GET", &uri, auth_header, &custom_headers, |auth, headers| {
            self.inner.get_stream_with_max_sse_event_size(
                uri.clone(),
                session_id.clone(),
                last_event_id.clone(),
                auth,
                headers,
                max_sse_event_size,
            )
        })
        .await
    }
}
