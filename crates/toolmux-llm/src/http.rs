//! The HTTP exchange both clients share: one JSON POST with a timeout, cancellation,
//! retries of what is worth retrying, bounded bodies and errors that never show the key.

use crate::error::STREAM_TIMEOUT_FACTOR;
use crate::{DeltaSink, ModelDelta, ModelError, ModelResponse, TimeoutKind};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, DATE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::Value;
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;
use toolmux_core::sse::{Event, EventParser};

/// The largest answer read, in bytes: far beyond any completion, small enough that a
/// misbehaving server cannot exhaust memory.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// How much of an error body is shown, in bytes.
const ERROR_EXCERPT_BYTES: usize = 2000;

/// The longest an API's `Retry-After` is waited out. Asked to wait longer (a daily quota
/// spent, a long outage), the request fails at once with the API's time, which the caller
/// may wait or not: held to this and asked again, it failed the same way each time, some
/// minutes later.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The first backoff, doubled on each further attempt.
const BACKOFF_BASE: Duration = Duration::from_millis(500);

/// The longest backoff without a `Retry-After`.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What replaces the API key wherever an API echoed it into a message.
const REDACTED: &str = "[redacted]";

/// An endpoint of one model's API, with everything each request carries.
pub(crate) struct Endpoint {
    /// The configured model name, for errors and logs.
    pub(crate) name: String,
    /// The model's name at the API, for logs.
    pub(crate) model: String,
    pub(crate) client: reqwest::Client,
    /// The full URL requests are posted to.
    pub(crate) url: reqwest::Url,
    /// Every header sent, credentials among them (marked sensitive).
    pub(crate) headers: HeaderMap,
    /// The API key and the configured headers' values that may be credentials (an
    /// `Authorization` or `api-key` given in `headers`), kept only to scrub them from
    /// anything the API echoes back; none empty.
    pub(crate) secrets: Vec<String>,
    pub(crate) timeout: Duration,
    pub(crate) max_retries: u32,
    /// The model's context window in tokens, as configured.
    pub(crate) context_window: Option<u64>,
    /// Whether answers may be asked for as a stream (`stream`, default true).
    pub(crate) stream: bool,
}

/// What a streamed answer's events are folded into, one API's format each: the answer as
/// the API would have sent it in one piece, so that one parser reads both.
pub(crate) trait Assembler: Send {
    /// Forgets what an earlier attempt received.
    fn reset(&mut self);
    /// Takes one event, handing what it adds to `on_delta`; `Ok(true)` once the answer is
    /// complete.
    fn event(&mut self, event: &Event, on_delta: DeltaSink<'_>) -> Result<bool, StreamError>;
    /// The answer in the API's non-streamed form; `None` if the stream has not completed
    /// it.
    fn finish(&mut self) -> Option<Value>;
}

/// An error inside a stream.
#[derive(Debug)]
pub(crate) enum StreamError {
    /// The API reported an error in the stream: its kind as named, the HTTP status that
    /// kind stands for ([`error_kind_status`]) and its message.
    Api { kind: String, status: u16, message: String },
    /// An event the API's documentation does not allow.
    Malformed(String),
}

/// A streamed request's state across attempts.
struct Streaming<'a> {
    assembler: &'a mut dyn Assembler,
    on_delta: DeltaSink<'a>,
    /// Whether an attempt has handed out deltas, which a retry must void.
    started: bool,
    /// Whether the answer came as a stream (a server may answer in one piece all the same).
    streamed: bool,
}

// By hand, so that neither the key nor any header value (an `Authorization` given in
// `headers`, say) can reach a log through `{:?}`.
impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("model", &self.model)
            .field("url", &url_for_messages(&self.url))
            .field("headers", &headers)
            .field("secrets", &self.secrets.iter().map(|_| REDACTED).collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

/// `url` without a user name, password, query or fragment, any of which may carry
/// credentials (a token is often written as the user name, `https://sk-…@gateway/v1`, and
/// a redirect may put one in the fragment, `#access_token=…`).
pub(crate) fn url_for_messages(url: &reqwest::Url) -> String {
    let mut shown = url.clone();
    // Both fail only for URLs that cannot have them, which then have none to hide.
    let _ = shown.set_password(None);
    let _ = shown.set_username("");
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// The longest redirect target a message shows, in bytes.
const LOCATION_EXCERPT_BYTES: usize = 200;

/// A redirect's `Location` as messages show it: resolved against `requested`, the URL
/// asked (a `Location` may be relative), and shown as [`url_for_messages`] shows URLs.
/// Text that is no URL even so is shown up to its query or fragment, without what may be
/// user info (all up to its last `@`), its control characters escaped, and
/// cut at [`LOCATION_EXCERPT_BYTES`].
fn location_for_messages(requested: &reqwest::Url, location: &str) -> String {
    // A URL with no authority (`sk-s3cret:x@gateway/v1` is one of scheme `sk-s3cret`)
    // keeps what may be user info in its path: it is shown as text is.
    if let Ok(url) = requested.join(location)
        && !url.cannot_be_a_base()
    {
        return url_for_messages(&url);
    }
    toolmux_core::unparsed_url_for_messages(location, LOCATION_EXCERPT_BYTES)
}

/// How long an answer's `Retry-After` (or `retry-after-ms`) asks to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RetryAfter {
    /// The wait, [`Duration::MAX`] for more seconds than a duration holds.
    wait: Duration,
    /// The header's HTTP date, when it gave one, to say when to try again in its words.
    date: Option<String>,
}

/// How one attempt ended, when it did not end in an answer.
enum Failure {
    /// Worth trying again: the status (none for a transport failure), the error to report
    /// if no attempt is left, and how long the API asked to wait.
    Retry { status: Option<u16>, error: ModelError, retry_after: Option<RetryAfter> },
    /// Final: the status (none for a transport failure) and the error.
    Fatal { status: Option<u16>, error: ModelError },
}

impl Endpoint {
    /// This API, as the calls it answers remember it ([`crate::ModelToolCall::extra_origin`]):
    /// the URL requests are posted to, without its query (Azure's `api-version`, which may
    /// change between requests to the same deployment) and user info.
    pub(crate) fn origin(&self) -> String {
        let mut url = self.url.clone();
        url.set_query(None);
        url.set_fragment(None);
        // Fails only for URLs that cannot have user info, which then have none.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.into()
    }

    /// Posts `body` and returns the JSON answer, retrying rate limits, overloaded servers
    /// and dropped connections up to `max_retries` times.
    pub(crate) async fn post(
        &self,
        body: &Value,
        cancel: &CancellationToken,
    ) -> Result<Value, ModelError> {
        self.exchange(body, cancel, None).await
    }

    /// A completion of `body` asked for as a stream (`stream: true`, and `fields` besides)
    /// whose events `assembler` folds into the non-streamed form as they hand their text
    /// and calls to `on_delta`, read by `parse`; asked for whole when the model is
    /// configured not to stream. A stream that breaks off is tried again as a failed
    /// request would be, after a [`ModelDelta::Restart`]; an answer that did not come as a
    /// stream (a server may ignore `stream`) is handed to `on_delta` whole.
    pub(crate) async fn complete_streaming(
        &self,
        mut body: Value,
        fields: &[(&str, Value)],
        cancel: &CancellationToken,
        on_delta: DeltaSink<'_>,
        assembler: &mut dyn Assembler,
        parse: fn(&Value, &Endpoint) -> Result<ModelResponse, ModelError>,
    ) -> Result<ModelResponse, ModelError> {
        let (answer, streamed) = if self.stream {
            body["stream"] = Value::Bool(true);
            for (field, value) in fields {
                body[*field] = value.clone();
            }
            let mut streaming = Streaming { assembler, on_delta, started: false, streamed: false };
            let answer = self.exchange(&body, cancel, Some(&mut streaming)).await?;
            (answer, streaming.streamed)
        } else {
            (self.post(&body, cancel).await?, false)
        };
        let answer = parse(&answer, self)?;
        if !streamed {
            crate::replay(&answer, on_delta);
        }
        Ok(answer)
    }

    async fn exchange(
        &self,
        body: &Value,
        cancel: &CancellationToken,
        mut streaming: Option<&mut Streaming<'_>>,
    ) -> Result<Value, ModelError> {
        // Writing a `Value` cannot fail: its keys are strings.
        let bytes = body.to_string().into_bytes();
        tracing::trace!(model = %self.name, body = %String::from_utf8_lossy(&bytes), "model request");
        let mut attempt: u32 = 0;
        loop {
            if let Some(streaming) = streaming.as_deref_mut() {
                if streaming.started {
                    (streaming.on_delta)(ModelDelta::Restart);
                    streaming.started = false;
                }
                streaming.assembler.reset();
                streaming.streamed = false;
            }
            let started = Instant::now();
            // A streamed answer is timed by its parts (`read_events`): one still arriving
            // word by word is not cut at `timeoutMs`, only one that stops coming; the whole
            // of it may take ten times as long.
            let (limit, kind) = match streaming {
                Some(_) => {
                    (self.timeout.saturating_mul(STREAM_TIMEOUT_FACTOR), TimeoutKind::Stream)
                }
                None => (self.timeout, TimeoutKind::Answer),
            };
            let request = self.attempt(bytes.clone(), streaming.as_deref_mut());
            let attempted = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(self.cancelled()),
                attempted = tokio::time::timeout(limit, request) => attempted,
            };
            let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            // A request that took the whole timeout is not tried again: the next would
            // likely take as long, and the caller would wait a multiple of what the
            // configuration allows.
            let Ok(outcome) = attempted else {
                tracing::debug!(model = %self.name, attempt, elapsed_ms, "model request timed out");
                return Err(ModelError::Timeout { model: self.name.clone(), timeout: limit, kind });
            };
            let (status, error, retry_after) = match outcome {
                Ok((status, answer)) => {
                    tracing::debug!(model = %self.name, api_model = %self.model, attempt, status, elapsed_ms, "model request");
                    return Ok(answer);
                }
                Err(Failure::Fatal { status, error }) => {
                    tracing::debug!(model = %self.name, api_model = %self.model, attempt, status, elapsed_ms, %error, "model request failed");
                    return Err(error);
                }
                Err(Failure::Retry { status, error, retry_after }) => {
                    tracing::debug!(model = %self.name, api_model = %self.model, attempt, status, elapsed_ms, %error, "model request failed");
                    (status, error, retry_after)
                }
            };
            let too_long = retry_after.as_ref().is_some_and(|after| after.wait > MAX_RETRY_AFTER);
            if attempt >= self.max_retries || too_long {
                if too_long {
                    tracing::debug!(model = %self.name, attempt, retry_after_s = retry_after.as_ref().map(|after| after.wait.as_secs()), "the API asks to wait longer than toolmux waits; not retrying");
                }
                let (wait, date) = match retry_after {
                    Some(RetryAfter { wait, date }) => (Some(wait), date),
                    None => (None, None),
                };
                return Err(match (status, error) {
                    (Some(429), ModelError::Api { message, .. }) => ModelError::RateLimited {
                        model: self.name.clone(),
                        attempts: attempt + 1,
                        retry_after: wait,
                        retry_at: date,
                        message,
                    },
                    // Another status the API asked to wait out too long (a 503 for a
                    // maintenance window): said, or it reads as a failure never retried.
                    (_, ModelError::Api { model, status, message }) if too_long => {
                        let note = crate::error::retry_note(wait, date.as_deref());
                        ModelError::Api { model, status, message: format!("{message}{note}") }
                    }
                    (_, error) => error,
                });
            }
            let wait = retry_after.map_or_else(|| backoff(attempt), |after| after.wait);
            tracing::debug!(model = %self.name, attempt, wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX), "retrying the model request");
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(self.cancelled()),
                () = tokio::time::sleep(wait) => {}
            }
            attempt += 1;
        }
    }

    /// One request and its answer.
    async fn attempt(
        &self,
        body: Vec<u8>,
        streaming: Option<&mut Streaming<'_>>,
    ) -> Result<(u16, Value), Failure> {
        let sent =
            self.client.post(self.url.clone()).headers(self.headers.clone()).body(body).send();
        // The answer's head comes within the timeout, streamed or not.
        let response = tokio::time::timeout(self.timeout, sent)
            .await
            .map_err(|_| self.stalled(TimeoutKind::Answer))?
            .map_err(|e| self.transport_failure("cannot reach the API", e))?;
        let status = response.status();
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let is_stream = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if status.is_success()
            && is_stream
            && let Some(streaming) = streaming
        {
            streaming.streamed = true;
            return self.read_events(response, streaming).await.map(|a| (status.as_u16(), a));
        }
        let body = self.read_body(response).await?;
        tracing::trace!(model = %self.name, status = status.as_u16(), body = %String::from_utf8_lossy(&body), "model answer");
        if status.is_success() {
            return match serde_json::from_slice(&body) {
                Ok(answer) => Ok((status.as_u16(), answer)),
                Err(e) => Err(Failure::Fatal {
                    status: Some(status.as_u16()),
                    error: self.malformed(format!("the body is not JSON ({e})")),
                }),
            };
        }
        let code = status.as_u16();
        let kinds = error_kinds(&body);
        let mut message = error_message(&body, status, |text| self.redact(text));
        if status.is_redirection() {
            // Redirects are not followed: a 301 or 302 would turn the POST into a GET.
            if let Some(location) = location {
                let location = self.redact(&location_for_messages(&self.url, &location));
                message = format!("redirected to {location}; set `baseUrl` to the API's address");
            }
        }
        let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
        Err(self.status_failure(code, message, &kinds, retry_after))
    }

    /// The events of a streamed answer, through `streaming`'s assembler, to the answer in
    /// the non-streamed form.
    async fn read_events(
        &self,
        mut response: reqwest::Response,
        streaming: &mut Streaming<'_>,
    ) -> Result<Value, Failure> {
        let mut parser = EventParser::default();
        let mut read = 0usize;
        loop {
            let chunk = match tokio::time::timeout(self.timeout, response.chunk()).await {
                Ok(chunk) => {
                    chunk.map_err(|e| self.transport_failure("the answer's stream broke off", e))?
                }
                // Nothing more for a whole timeout: a whole answer (its end seen, the
                // stream left open) is taken; else the API stalled.
                Err(_) => {
                    return streaming
                        .assembler
                        .finish()
                        .ok_or_else(|| self.stalled(TimeoutKind::Idle));
                }
            };
            let Some(chunk) = chunk else { break };
            read += chunk.len();
            if read > MAX_BODY_BYTES {
                return Err(Failure::Fatal {
                    status: Some(response.status().as_u16()),
                    error: self.malformed(format!(
                        "the answer is larger than {} MiB",
                        MAX_BODY_BYTES / (1024 * 1024)
                    )),
                });
            }
            for event in parser.push(&chunk) {
                tracing::trace!(model = %self.name, event = %event.name, data = %event.data, "model answer event");
                streaming.started = true;
                match streaming.assembler.event(&event, streaming.on_delta) {
                    Ok(false) => {}
                    Ok(true) => {
                        if let Some(answer) = streaming.assembler.finish() {
                            return Ok(answer);
                        }
                    }
                    Err(StreamError::Api { kind, status, message }) => {
                        // Redacted before it is cut: a key across the cut would keep its
                        // start.
                        let message = excerpt(&self.redact(&message), ERROR_EXCERPT_BYTES);
                        // The kind decides first: a spent quota said as `insufficient_quota`
                        // stands for a 429 too, and its message need not say so in words.
                        let retry = worth_retrying(status, &[kind.as_str()], &message);
                        let kind = excerpt(&self.redact(&kind), 100);
                        let error = ModelError::StreamFailed {
                            model: self.name.clone(),
                            kind,
                            status,
                            message,
                        };
                        // Not `Some(status)`: the answer's status was 200, and a rate limit
                        // in the stream stays one said to be in the stream.
                        return Err(if retry {
                            Failure::Retry { status: None, error, retry_after: None }
                        } else {
                            Failure::Fatal { status: None, error }
                        });
                    }
                    Err(StreamError::Malformed(message)) => {
                        return Err(Failure::Fatal {
                            status: None,
                            error: self.malformed(message),
                        });
                    }
                }
            }
        }
        // Some servers end the stream without the closing event their API documents, but
        // with the answer whole; one that broke off mid-answer is tried again.
        streaming.assembler.finish().ok_or_else(|| Failure::Retry {
            status: None,
            error: ModelError::Transport {
                model: self.name.clone(),
                message: "the answer's stream ended before the answer did".into(),
            },
            retry_after: None,
        })
    }

    /// The API sent nothing for a whole timeout: final (the next try would likely wait as
    /// long).
    fn stalled(&self, kind: TimeoutKind) -> Failure {
        Failure::Fatal {
            status: None,
            error: ModelError::Timeout { model: self.name.clone(), timeout: self.timeout, kind },
        }
    }

    /// An error status as a failure: credentials refused are final, rate limits and
    /// overloaded or failing servers are worth another try, the rest is final.
    fn status_failure(
        &self,
        code: u16,
        message: String,
        kinds: &[&str],
        retry_after: Option<RetryAfter>,
    ) -> Failure {
        // Nothing at that address: the URL is most of the answer (a `baseUrl` with `/v1`
        // twice, a missing deployment path).
        let message = match code {
            404 | 405 => format!(
                "{message} (the request went to {}: check `baseUrl`)",
                url_for_messages(&self.url)
            ),
            _ => message,
        };
        if matches!(code, 401 | 403) {
            let error = ModelError::Auth { model: self.name.clone(), status: code, message };
            return Failure::Fatal { status: Some(code), error };
        }
        let retry = worth_retrying(code, kinds, &message);
        let error = ModelError::Api { model: self.name.clone(), status: code, message };
        if retry {
            Failure::Retry { status: Some(code), error, retry_after }
        } else {
            Failure::Fatal { status: Some(code), error }
        }
    }

    /// The body of `response`, refused beyond [`MAX_BODY_BYTES`], and given up when
    /// nothing more of it comes for `timeoutMs`, as a stream's parts are: asked for as a
    /// stream, the whole answer may take ten times as long, and a server that answers in
    /// one piece (one that ignores `stream`, or an error) and then stalls would hold the
    /// request that long.
    async fn read_body(&self, mut response: reqwest::Response) -> Result<Vec<u8>, Failure> {
        let status = Some(response.status().as_u16());
        let too_large = || Failure::Fatal {
            status,
            error: self.malformed(format!(
                "the answer is larger than {} MiB",
                MAX_BODY_BYTES / (1024 * 1024)
            )),
        };
        if response.content_length().is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        loop {
            let chunk = tokio::time::timeout(self.timeout, response.chunk())
                .await
                .map_err(|_| self.stalled(TimeoutKind::Idle))?
                .map_err(|e| self.transport_failure("reading the answer failed", e))?;
            let Some(chunk) = chunk else { break };
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// A transport error in words: `what` failed, and its innermost cause, which says it
    /// ("Connection refused", "failed to lookup address information: …") where the layers
    /// above name the HTTP client's internals.
    fn transport_failure(&self, what: &str, error: reqwest::Error) -> Failure {
        // reqwest's own message names the URL, which may carry a secret in its query.
        let error = error.without_url();
        let what = if error.is_connect() { "cannot reach the API" } else { what };
        let mut cause: &(dyn std::error::Error + 'static) = &error;
        while let Some(next) = cause.source() {
            cause = next;
        }
        let message = if std::ptr::addr_eq(cause, &error) {
            what.to_owned()
        } else {
            format!("{what}: {cause}")
        };
        // A request reqwest could not even build fails the same way every time; every
        // other failure (connect, send, read) may pass on another try.
        let permanent = error.is_builder();
        let error =
            ModelError::Transport { model: self.name.clone(), message: self.redact(&message) };
        if permanent {
            Failure::Fatal { status: None, error }
        } else {
            Failure::Retry { status: None, error, retry_after: None }
        }
    }

    fn malformed(&self, message: String) -> ModelError {
        ModelError::Malformed { model: self.name.clone(), message: self.redact(&message) }
    }

    fn cancelled(&self) -> ModelError {
        ModelError::Cancelled { model: self.name.clone() }
    }

    /// `text` without the API key or a credential of the headers, should the API have
    /// echoed one.
    pub(crate) fn redact(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), REDACTED);
            }
        }
        text
    }

    /// An answer that lacks what the API documents.
    pub(crate) fn missing(&self, what: &str) -> ModelError {
        self.malformed(format!("missing `{what}`"))
    }
}

/// Whether an error of HTTP status `code` (or of a kind that stands for it, inside a
/// stream) of the API's `kinds` (its error's `type` and `code`) saying `message` may pass
/// on another try: rate limits, overloaded or failing servers, and 408 (a proxy in front
/// of the API gave up waiting for the request; the APIs' own clients retry it too). Not a
/// spent quota or a billing limit, which waiting does not lift: said at once. The kinds
/// decide when the API names one this crate knows (`insufficient_quota` is final whatever
/// its message says, `rate_limit_error` passes though its message speaks of billing);
/// only without one is a 429 judged by its message's words.
fn worth_retrying(code: u16, kinds: &[&str], message: &str) -> bool {
    let transient = matches!(code, 408 | 429 | 500 | 502 | 503 | 504 | 520..=524 | 529);
    if kinds.iter().any(|kind| spent_kind(kind)) {
        return false;
    }
    if kinds.iter().any(|kind| error_kind_status(kind).is_some()) {
        return transient;
    }
    let lower = message.to_ascii_lowercase();
    let spent = code == 429
        && ["insufficient_quota", "exceeded your current quota", "billing", "credit balance"]
            .iter()
            .any(|word| lower.contains(word));
    !spent && transient
}

/// The kinds an error body names: its error's `type` and string `code` (OpenAI's
/// `{"error": {"type": "insufficient_quota", "code": "insufficient_quota"}}`, Anthropic's
/// `{"type": "error", "error": {"type": "rate_limit_error"}}`), the first of a list of
/// such for Gemini's; none for a body that is not JSON or names none.
fn error_kinds(body: &[u8]) -> Vec<String> {
    let Ok(mut value) = serde_json::from_slice::<Value>(body) else { return Vec::new() };
    if let Value::Array(errors) = &mut value
        && errors.len() == 1
    {
        value = errors.swap_remove(0);
    }
    let Some(error) = value.get("error").filter(|e| e.is_object()) else { return Vec::new() };
    [error.get("type"), error.get("code")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|kind| !kind.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Whether an error's kind says that a quota or a billing limit is spent (OpenAI's
/// `insufficient_quota`, Anthropic's `billing_error`): waiting does not lift it, so it is
/// never retried, whatever status it stands for and whatever its message says.
pub(crate) fn spent_kind(kind: &str) -> bool {
    kind == "insufficient_quota" || kind.contains("billing")
}

/// The HTTP status an error's kind stands for, as the APIs document their errors
/// (Anthropic's `overloaded_error` 529, `rate_limit_error` 429, `api_error` 500; OpenAI's
/// `server_error` 500, `rate_limit_exceeded` 429, `insufficient_quota` 429), for an error
/// reported inside a stream, whose HTTP status was 200; `None` for a kind neither names.
pub(crate) fn error_kind_status(kind: &str) -> Option<u16> {
    Some(match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "insufficient_quota" => 429,
        kind if kind.contains("rate_limit") => 429,
        "api_error" | "server_error" => 500,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => return None,
    })
}

/// The API's message from an error body (`{"error": {"message": …}}` for both OpenAI and
/// Anthropic, `{"error": "…"}` or `{"message": …}` for some compatible servers, the first
/// of a list of such for Gemini's), else an excerpt of the body, else the status's reason;
/// `redact` is applied before the text is cut, so that a secret across the cut is
/// redacted whole rather than its start kept.
fn error_message(body: &[u8], status: StatusCode, redact: impl Fn(&str) -> String) -> String {
    if let Ok(mut value) = serde_json::from_slice::<Value>(body) {
        // Gemini's compatible API answers `[{"error": {"code": 400, "message": …}}]`.
        if let Value::Array(errors) = &mut value
            && errors.len() == 1
        {
            value = errors.swap_remove(0);
        }
        let message = value
            .pointer("/error/message")
            .or_else(|| value.get("error").filter(|e| e.is_string()))
            .or_else(|| value.get("message"))
            .and_then(Value::as_str);
        if let Some(message) = message {
            return excerpt(&redact(message.trim()), ERROR_EXCERPT_BYTES);
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        status.canonical_reason().unwrap_or("no reason given").to_lowercase()
    } else {
        excerpt(&redact(text), ERROR_EXCERPT_BYTES)
    }
}

/// The first `max` bytes of `text`, cut at a character boundary.
fn excerpt(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// How long the answer asks to wait: `retry-after-ms` (OpenAI's, more precise) or
/// `Retry-After` in seconds or as an HTTP date. A date is read against the answer's own
/// `Date` (else `now`), so that a server's clock ahead of or behind this one's shifts
/// neither; a date already past, or that is no HTTP date, asks for nothing (the usual
/// backoff follows).
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<RetryAfter> {
    let plain = |wait| Some(RetryAfter { wait, date: None });
    if let Some(ms) = headers.get("retry-after-ms").and_then(header_text)
        && let Ok(ms) = ms.parse::<f64>()
        && ms.is_finite()
        && ms >= 0.0
    {
        // Too large for a `Duration` is a wait too long, as for `Retry-After` below.
        return plain(Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX));
    }
    let value = headers.get(RETRY_AFTER).and_then(header_text)?;
    if let Ok(seconds) = value.parse::<f64>() {
        // A number of seconds beyond any `Duration` (99999999999999999999999) is a wait too
        // long like any other over the cap, not a header that says nothing.
        return if seconds >= 0.0 {
            plain(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
        } else {
            None
        };
    }
    let at = http_date(value)?;
    let now = headers.get(DATE).and_then(header_text).and_then(http_date).unwrap_or(now);
    let wait = at.duration_since(now).ok().filter(|wait| !wait.is_zero())?;
    Some(RetryAfter { wait, date: Some(value.to_owned()) })
}

fn header_text(value: &HeaderValue) -> Option<&str> {
    value.to_str().ok().map(str::trim)
}

/// An HTTP date in the IMF-fixdate form every sender must use (`Sun, 06 Nov 1994 08:49:37
/// GMT`: a two-digit day of its month, a four-digit year); the obsolete forms are not worth
/// a parser.
fn http_date(text: &str) -> Option<SystemTime> {
    let digits = |text: &str, count: usize| {
        (text.len() == count && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse::<u64>().ok())
            .flatten()
    };
    let (_weekday, rest) = text.split_once(", ")?;
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else { return None };
    let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        .iter()
        .position(|m| m == month)? as u64
        + 1;
    let (day, year) = (digits(day, 2)?, digits(year, 4)?);
    let clock: Vec<u64> = time.split(':').map(|n| digits(n, 2)).collect::<Option<_>>()?;
    let [h, m, s] = clock[..] else { return None };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=month_days).contains(&day) || year < 1970 || h > 23 || m > 59 || s > 60 {
        return None;
    }
    // Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil`); with four
    // digits to the year, nothing here can overflow.
    let (y, mo) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y / 400;
    let year_of_era = y - era * 400;
    let day_of_year = (153 * mo + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = (era * 146_097 + day_of_era).checked_sub(719_468)?;
    UNIX_EPOCH.checked_add(Duration::from_secs(days * 86_400 + h * 3600 + m * 60 + s))
}

/// The wait before retry `attempt + 1`: 500 ms · 2^attempt, between half and all of it
/// at random so that clients rate limited together do not come back together, at most
/// [`MAX_BACKOFF`].
fn backoff(attempt: u32) -> Duration {
    let full = BACKOFF_BASE.saturating_mul(2u32.saturating_pow(attempt)).min(MAX_BACKOFF);
    // The clock's nanoseconds are random enough to spread retries; no generator needed.
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let fraction = 0.5 + f64::from(nanos % 1000) / 2000.0;
    full.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_dates_and_milliseconds() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_767); // Sun, 06 Nov 1994 08:49:27 GMT
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_static(value));
            }
            map
        };
        let wait = |name, value| retry_after(&headers(&[(name, value)]), now).map(|a| a.wait);
        assert_eq!(wait("retry-after", "3"), Some(Duration::from_secs(3)));
        assert_eq!(wait("retry-after", "0"), Some(Duration::ZERO));
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(
            retry_after(&headers(&[("retry-after", date)]), now),
            Some(RetryAfter { wait: Duration::from_secs(10), date: Some(date.into()) })
        );
        // Against the answer's own clock when it gives one: its `Date` 8 s ahead of ours.
        let ahead = [("retry-after", date), ("date", "Sun, 06 Nov 1994 08:49:35 GMT")];
        assert_eq!(
            retry_after(&headers(&ahead), now).map(|a| a.wait),
            Some(Duration::from_secs(2))
        );
        // A date already past, or now, asks for nothing; a wait far off is kept as it is,
        // for the caller.
        assert_eq!(wait("retry-after", "Sat, 05 Nov 1994 08:49:37 GMT"), None);
        assert_eq!(wait("retry-after", "Sun, 06 Nov 1994 08:49:27 GMT"), None);
        assert_eq!(wait("retry-after", "86400"), Some(Duration::from_secs(86_400)));
        assert_eq!(wait("retry-after", "1e300"), Some(Duration::MAX));
        assert_eq!(wait("retry-after", "99999999999999999999999"), Some(Duration::MAX));
        assert_eq!(wait("retry-after-ms", "1500"), Some(Duration::from_millis(1500)));
        // Milliseconds beyond any `Duration` are a wait too long like seconds are, not a
        // header that says nothing (which returned no wait at all, `Retry-After` unread).
        let overflowing = [("retry-after-ms", "1e300"), ("retry-after", "86400")];
        assert_eq!(retry_after(&headers(&overflowing), now).map(|a| a.wait), Some(Duration::MAX));
        assert_eq!(wait("retry-after", "soon"), None);
        assert_eq!(wait("retry-after", "-1"), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn urls_in_messages_show_no_credentials() {
        let shown = |url: &str| url_for_messages(&reqwest::Url::parse(url).expect("a URL"));
        assert_eq!(shown("https://sk-live-XYZ@gateway.test/v1"), "https://gateway.test/v1");
        assert_eq!(
            shown("https://user:s3cret@gateway.test/v1/?api_key=s3cret"),
            "https://gateway.test/v1/"
        );
        assert_eq!(shown("http://127.0.0.1:8080/v1"), "http://127.0.0.1:8080/v1");
        assert_eq!(shown("https://gateway.test/v1#access_token=s3cret"), "https://gateway.test/v1");
    }

    #[test]
    fn redirect_targets_in_messages_show_no_credentials() {
        let requested = reqwest::Url::parse("http://127.0.0.1:8080/v1/messages?beta=1").unwrap();
        let shown = |location: &str| location_for_messages(&requested, location);
        // Relative to the URL asked, as a URL is shown.
        assert_eq!(shown("/v2/messages?token=s3cret"), "http://127.0.0.1:8080/v2/messages");
        assert_eq!(
            shown("https://user:s3cret@gateway.test/v1?token=s3cret#k=s3cret"),
            "https://gateway.test/v1"
        );
        // No URL: up to its query, without its user info, its control characters escaped.
        assert_eq!(
            shown("https://user:s3cret@gateway.test:99999/v1\tx?token=s3cret"),
            "https://gateway.test:99999/v1\\tx"
        );
        assert_eq!(shown("http://sk-s3cret@[::1/x#s3cret"), "http://[::1/x");
        assert_eq!(shown("http://[::1\u{7}@x/a@b"), "http://x/a@b");
        // A password holding `/` or `#` keeps the text from parsing; a token before the
        // first `:` makes a scheme of it and the rest a path.
        assert_eq!(shown("https://user:pa/ss3cret@gateway.test/v1"), "https://gateway.test/v1");
        assert_eq!(shown("https://user:s3cret#1@gateway.test/v1"), "https://gateway.test/v1");
        assert_eq!(shown("sk-s3cret:x@gateway.test/v1"), "gateway.test/v1");
        assert_eq!(shown("http://[bad\u{1b}[31m"), "http://[bad\\u{1b}[31m");
        let long = shown(&format!("http://[{}", "x".repeat(1000)));
        assert_eq!(long.len(), LOCATION_EXCERPT_BYTES + '…'.len_utf8(), "{long}");
    }

    #[test]
    fn http_dates_are_read_exactly() {
        assert_eq!(http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(UNIX_EPOCH));
        assert_eq!(
            http_date("Tue, 29 Feb 2028 12:00:01 GMT"),
            Some(UNIX_EPOCH + Duration::from_secs(1_835_438_401))
        );
        assert_eq!(
            http_date("Fri, 31 Dec 9999 23:59:59 GMT"),
            Some(UNIX_EPOCH + Duration::from_secs(253_402_300_799))
        );
        for malformed in [
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Nov 1994 08:49:37:00 GMT",
            "Sun, 06 Nov +994 08:49:37 GMT",
            "Thu, 29 Feb 2029 12:00:00 GMT",
            "Thu, 31 Apr 2026 12:00:00 GMT",
            "Thu, 00 Apr 2026 12:00:00 GMT",
            // Years that overflowed the clock's seconds (a panic) before years had four
            // digits.
            "Wed, 21 Oct 300000000000 07:28:00 GMT",
            "Wed, 21 Oct 18446744073709551615 07:28:00 GMT",
        ] {
            assert_eq!(http_date(malformed), None, "{malformed}");
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        for attempt in 0..4 {
            let full = BACKOFF_BASE * 2u32.pow(attempt);
            let wait = backoff(attempt);
            assert!(wait >= full / 2 && wait <= full, "{attempt}: {wait:?}");
        }
        assert!(backoff(20) <= MAX_BACKOFF);
        assert!(backoff(u32::MAX) <= MAX_BACKOFF);
    }

    #[test]
    fn error_messages_come_from_the_api_or_an_excerpt() {
        let status = StatusCode::BAD_REQUEST;
        assert_eq!(
            error_message(
                br#"{"error":{"message":"bad tool schema","type":"x"}}"#,
                status,
                str::to_owned
            ),
            "bad tool schema"
        );
        assert_eq!(
            error_message(br#"{"error":"no such model"}"#, status, str::to_owned),
            "no such model"
        );
        assert_eq!(
            error_message(
                br#"[{"error":{"code":400,"message":"missing a thought_signature"}}]"#,
                status,
                str::to_owned
            ),
            "missing a thought_signature"
        );
        assert_eq!(error_message(b"", status, str::to_owned), "bad request");
        let long = "é".repeat(1500);
        let cut = error_message(long.as_bytes(), status, str::to_owned);
        assert!(cut.len() <= ERROR_EXCERPT_BYTES + '…'.len_utf8(), "{}", cut.len());
        assert!(cut.ends_with('…'));
        // A secret across the cut is redacted whole, where the cut came first and kept
        // its start.
        let key = "sk-secret-0123456789abcdef";
        for body in [
            format!("{}{key} tail", "x".repeat(ERROR_EXCERPT_BYTES - 10)),
            serde_json::json!({"error": {"message":
                format!("{}{key}", "x".repeat(ERROR_EXCERPT_BYTES - 10))}})
            .to_string(),
        ] {
            let cut = error_message(body.as_bytes(), status, |t| t.replace(key, "[redacted]"));
            assert!(!cut.contains("sk-secret"), "{cut}");
        }
    }
}
