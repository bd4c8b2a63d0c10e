//! Sending prepared requests and reading responses: bounded size, bounded redirects,
//! timeouts, cancellation, NDJSON read incrementally and reported as progress.

use crate::RestError;
use crate::request::{Body, PreparedRequest};
use futures::StreamExt;
use reqwest::header::{CONTENT_TYPE, COOKIE, HeaderName, HeaderValue, LOCATION};
use serde_json::Value;
use std::time::Duration;
use toolmux_core::{CallContext, ContentPart, Progress, ToolOutput};

/// How much of an error body is shown, in bytes.
const ERROR_EXCERPT: usize = 2000;

/// Limits of one tool's requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HttpSettings {
    pub(crate) timeout: Duration,
    pub(crate) max_response_bytes: usize,
    /// Read the body as NDJSON whatever the content type.
    pub(crate) stream: bool,
}

/// A client with bounded same-origin redirects, using rustls with the `ring` provider.
pub(crate) fn client(max_redirects: usize) -> Result<reqwest::Client, RestError> {
    // reqwest is built without a default crypto provider; install ring's once per process.
    // Another crate may have installed one first, which is just as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(redirect_policy(max_redirects))
        // A redirect's `Referer` would carry the first URL's query: an API key given there.
        .referer(false)
        .user_agent(concat!("toolmux/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| RestError::Config {
            name: "http client".into(),
            message: format!("cannot build the HTTP client: {e}"),
        })
}

/// Follows redirects within the request's origin (scheme, host and port), at most
/// `max_redirects` of them, and none to another origin: the 3xx response is the result.
///
/// reqwest's own policy strips only `Authorization` and `Cookie` on a cross-host redirect;
/// API keys in other headers (and configured `headers`) would follow to the new host, even
/// from https to http. Not following at all is the one choice that leaks nothing.
fn redirect_policy(max_redirects: usize) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        let leaves_origin =
            attempt.previous().first().is_some_and(|first| !same_origin(first, attempt.url()));
        // `previous` starts with the first request's URL, which is no redirect.
        if leaves_origin || max_redirects == 0 {
            attempt.stop()
        } else if attempt.previous().len() > max_redirects {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    })
}

/// Whether two URLs share scheme, host and port (a default port counts as given).
pub(crate) fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// A redirect that was not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unfollowed {
    /// Where it pointed, resolved against the request's URL.
    pub(crate) location: reqwest::Url,
    /// It leads to another origin (otherwise `maxRedirects` is 0).
    pub(crate) cross_origin: bool,
}

impl Unfollowed {
    /// Replaces each of `secrets` in the target by `REDACTED`: an API that echoes the
    /// request's query into its redirect (`http` to `https`) would hand an API key sent
    /// there to whoever reads the result. The user info, path, query and fragment are
    /// redacted one by one, so that the origin the note names stays as it was and no
    /// replacement can make the target unparsable (which kept the secret).
    pub(crate) fn redact(&mut self, secrets: &[String]) {
        let scrub = |text: &str| crate::secrets::scrub(text, secrets);
        let location = &mut self.location;
        let username = scrub(location.username());
        if username != location.username() {
            // Fails only for URLs that cannot have user info, which then have none.
            let _ = location.set_username(&username);
        }
        if let Some(password) = location.password().map(scrub) {
            let _ = location.set_password(Some(&password));
        }
        let path = scrub(location.path());
        location.set_path(&path);
        let query = location.query().map(scrub);
        location.set_query(query.as_deref());
        let fragment = location.fragment().map(scrub);
        location.set_fragment(fragment.as_deref());
    }

    /// Why the redirect was not followed, naming the target's origin (not its path and
    /// query, which may carry a signature meant for that host alone).
    pub(crate) fn note(&self) -> String {
        if self.cross_origin {
            format!(
                "redirect to another origin ({}) not followed: toolmux follows redirects only \
                 within the same scheme, host and port, so that this API's credentials never \
                 reach another host",
                self.location.origin().ascii_serialization()
            )
        } else {
            "redirect not followed (`maxRedirects` is 0)".to_owned()
        }
    }
}

/// A response as read: status, content type and body.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) reason: String,
    pub(crate) content_type: String,
    pub(crate) body: Vec<u8>,
    /// Items read from an NDJSON body.
    pub(crate) items: Option<Vec<Value>>,
    /// The redirect this 3xx response asked for, which was not followed.
    pub(crate) unfollowed: Option<Unfollowed>,
    /// When to try again, from `Retry-After` (seconds, or an HTTP date).
    pub(crate) retry_after: Option<Duration>,
    /// The values to redact from the body's text before it is cut for an excerpt (given
    /// by the provider): cut first, a secret at the cut would show all but its last bytes.
    pub(crate) secrets: Vec<String>,
    /// The body is UTF-8 whatever charset `content_type` names: `select` wrote its part
    /// back as UTF-8, and decoding it again in the response's charset garbled it. The
    /// content type is kept as the server sent it for the `contentType` extra.
    pub(crate) reencoded: bool,
}

/// Why a configured header named `header`, whose value is `value`, cannot be sent: a line
/// break or another control character in the value, as a token read from a file or a
/// variable ending in a newline has. `what` names the setting (`headers.X-Api-Key`); the
/// value itself is never named, since it is often a secret.
pub(crate) fn unsendable_header(what: &str, header: &str, value: &str) -> Option<String> {
    if HeaderName::from_bytes(header.as_bytes()).is_err() {
        return Some(format!("`{what}`: `{header}` is not a valid header name"));
    }
    HeaderValue::from_bytes(value.as_bytes()).is_err().then(|| {
        format!(
            "the value of `{what}` holds a line break or another control character, which \
             header `{header}` cannot carry (a value read from a file or an environment \
             variable often ends in a newline): remove it"
        )
    })
}

/// Sends `request` and reads the response within the settings' limits.
pub(crate) async fn send(
    client: &reqwest::Client,
    request: &PreparedRequest,
    settings: HttpSettings,
    tool: &str,
    secrets: &[String],
    ctx: &CallContext,
) -> Result<Response, RestError> {
    let http_error = |message: String, source: Option<reqwest::Error>| RestError::Http {
        tool: tool.to_owned(),
        url: request.url_for_messages(),
        message,
        // The URL may carry an API key in its query: keep it out of the error chain.
        source: source.map(|e| Box::new(e.without_url()) as _),
    };
    let method = reqwest::Method::from_bytes(request.method.as_bytes())
        .map_err(|_| http_error(format!("invalid method `{}`", request.method), None))?;
    let mut builder = client.request(method, &request.url).timeout(settings.timeout);
    for (name, value) in &request.headers {
        // Sent below, merged with the request's cookies into one `Cookie` header.
        if name.eq_ignore_ascii_case("cookie") {
            continue;
        }
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| http_error(format!("invalid header name `{name}`"), None))?;
        // Beyond ASCII, a value goes as its UTF-8 bytes (HTTP's `obs-text`); a line break
        // or another control character cannot be in a header at all, which is the
        // arguments' fault, not the connection's.
        let value = HeaderValue::from_bytes(value.as_bytes()).map_err(|_| RestError::Request {
            tool: tool.to_owned(),
            message: format!(
                "the value of header `{name}` holds a line break or another control \
                 character, which a header cannot carry"
            ),
        })?;
        builder = builder.header(name, value);
    }
    if let Some(cookies) = request.cookie_header() {
        let value =
            HeaderValue::from_bytes(cookies.as_bytes()).map_err(|_| RestError::Request {
                tool: tool.to_owned(),
                message: "the `Cookie` header holds a line break or another control character, \
                      which a header cannot carry"
                    .into(),
            })?;
        builder = builder.header(COOKIE, value);
    }
    // The trace this call belongs to goes on to the API (W3C Trace Context), unless the
    // tool sets those headers itself.
    let sets = |name: &str| request.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    if let Some(trace) = ctx.outgoing_trace()
        && !sets("traceparent")
    {
        builder = builder.header("traceparent", trace.to_string());
        if let Some(state) = ctx.trace_state().and_then(|s| HeaderValue::from_str(s).ok())
            && !sets("tracestate")
        {
            builder = builder.header("tracestate", state);
        }
    }
    // reqwest appends headers: a body's type is added only when the request's headers
    // (the operation's media type, the tool's own) do not name one already.
    let typed = sets("content-type");
    builder = match &request.body {
        Body::None => builder,
        Body::Json(value) => {
            let bytes = serde_json::to_vec(value).unwrap_or_default();
            if typed {
                builder.body(bytes)
            } else {
                builder.header(CONTENT_TYPE, "application/json").body(bytes)
            }
        }
        Body::Form(pairs) => builder.form(pairs),
        Body::Raw { text, .. } if typed => builder.body(text.clone()),
        Body::Raw { content_type, text } => {
            builder.header(CONTENT_TYPE, content_type.as_str()).body(text.clone())
        }
        Body::Multipart(fields) => {
            let mut form = reqwest::multipart::Form::new();
            for field in fields {
                let untyped = || {
                    let part = reqwest::multipart::Part::bytes(field.value.clone());
                    if field.file { part.file_name(field.name.clone()) } else { part }
                };
                // A media type reqwest cannot parse leaves the part untyped.
                let part = match &field.content_type {
                    Some(media) => untyped().mime_str(media).unwrap_or_else(|_| untyped()),
                    None => untyped(),
                };
                form = form.part(field.name.clone(), part);
            }
            builder.multipart(form)
        }
    };
    let timeout = |e: &reqwest::Error| {
        e.is_timeout()
            .then(|| RestError::Timeout { tool: tool.to_owned(), after: settings.timeout })
    };
    let response = builder.send().await.map_err(|e| {
        if let Some(timeout) = timeout(&e) {
            return timeout;
        }
        let message = if e.is_redirect() {
            "too many redirects".to_owned()
        } else if e.is_connect() {
            "cannot connect".to_owned()
        } else {
            "the exchange failed".to_owned()
        };
        http_error(message, Some(e))
    })?;
    let status = response.status();
    let unfollowed = status
        .is_redirection()
        .then(|| response.headers().get(LOCATION)?.to_str().ok())
        .flatten()
        .and_then(|location| response.url().join(location).ok())
        .map(|location| Unfollowed {
            cross_origin: !same_origin(response.url(), &location),
            location,
        });
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(retry_after);
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let ndjson = settings.stream || is_ndjson(&content_type);
    let mut body = Vec::new();
    let mut items = ndjson.then(Vec::new);
    let mut line_start = 0;
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| match timeout(&e) {
            Some(timeout) => timeout,
            None => http_error("reading the response failed".into(), Some(e)),
        })?;
        if body.len() + chunk.len() > settings.max_response_bytes {
            return Err(RestError::ResponseTooLarge {
                tool: tool.to_owned(),
                limit: settings.max_response_bytes,
            });
        }
        body.extend_from_slice(&chunk);
        if let Some(items) = items.as_mut() {
            while let Some(offset) = body[line_start..].iter().position(|&b| b == b'\n') {
                let line = &body[line_start..line_start + offset];
                line_start += offset + 1;
                take_line(line, items, secrets, ctx);
            }
        }
    }
    if let Some(items) = items.as_mut() {
        let rest = body[line_start..].to_vec();
        take_line(&rest, items, secrets, ctx);
    }
    Ok(Response {
        status: status.as_u16(),
        reason: status.canonical_reason().unwrap_or_default().to_owned(),
        content_type,
        body,
        items,
        unfollowed,
        retry_after,
        secrets: secrets.to_vec(),
        reencoded: false,
    })
}

/// The `charset` parameter of a `Content-Type` value.
pub(crate) fn charset_of(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|part| {
        let (name, value) = part.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches(|c| c == '"' || c == '\'').trim().to_owned())
    })
}

/// A `Retry-After` value: delay seconds, or an HTTP date (`Wed, 21 Oct 2026 07:28:00 GMT`)
/// as the time left until it; at most a day.
fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let when = httpdate::parse_http_date(value).ok()?;
            when.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(Duration::from_secs(24 * 60 * 60)))
}

/// Takes one NDJSON line as an item and reports it as progress, whose message (a client
/// shows it as it comes, before any redactor sees the result) has `secrets` redacted
/// before it is cut.
fn take_line(line: &[u8], items: &mut Vec<Value>, secrets: &[String], ctx: &CallContext) {
    let line = line.strip_prefix(b"\x1e").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return;
    }
    let item = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()));
    items.push(item);
    let message = redacted_excerpt(text, 200, secrets);
    ctx.report_progress(Progress::new(items.len() as f64, None).with_message(message));
}

fn is_ndjson(content_type: &str) -> bool {
    ["ndjson", "jsonl", "json-seq", "jsonlines", "stream+json"]
        .iter()
        .any(|k| content_type.contains(k))
}

/// The first `max` bytes of `text`, cut at a character boundary.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &text[..cut])
}

/// [`excerpt`] of `text` with `secrets` redacted first, so that no secret is cut into a
/// piece the redaction no longer recognizes. Only the part that can reach the excerpt is
/// redacted: a window past the cut by the longest secret, widened while redaction shrinks
/// it so much that the piece a secret may be cut to at its end could move before the cut.
pub(crate) fn redacted_excerpt(text: &str, max: usize, secrets: &[String]) -> String {
    let longest = secrets.iter().map(String::len).max().unwrap_or(0);
    let mut window = max.saturating_add(longest);
    loop {
        let mut end = window.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let scrubbed = crate::secrets::scrub(&text[..end], secrets);
        if end == text.len() {
            return excerpt(&scrubbed, max);
        }
        if scrubbed.len() >= max.saturating_add(longest) {
            // The excerpt ends before any piece of a secret cut at the window's end.
            return excerpt(&scrubbed, max);
        }
        window = window.saturating_mul(2);
    }
}

impl Response {
    /// [`Response::into_output`] of the part of a successful JSON response `select` names
    /// (each item's part, for a stream of items).
    pub(crate) fn into_output_selecting(mut self, select: &crate::config::Select) -> ToolOutput {
        let ok = (200..300).contains(&self.status);
        if ok && let Some(items) = &mut self.items {
            for item in items.iter_mut() {
                *item = select.apply(item);
            }
        } else if ok
            && self.content_type.contains("json")
            && let Some(value) = self.json()
        {
            self.body = serde_json::to_vec(&select.apply(&value)).unwrap_or_default();
            self.reencoded = true;
        }
        self.into_output()
    }

    /// The body as text: UTF-8 once `select` re-encoded it, else in the charset its
    /// content type names (`iso-8859-1`, `windows-1252`, `utf-16`; bytes invalid in it
    /// become U+FFFD), else in the one its byte order mark says, else as UTF-8; `None`
    /// when none is named and the body is not UTF-8 (binary). A charset named that no
    /// decoder knows is said after the body, which is shown as UTF-8 as well as it goes.
    pub(crate) fn text(&self) -> Option<String> {
        if self.reencoded {
            return Some(String::from_utf8_lossy(&self.body).into_owned());
        }
        let label = charset_of(&self.content_type);
        let named = label.as_deref().and_then(|l| encoding_rs::Encoding::for_label(l.as_bytes()));
        // `decode` lets a byte order mark win over the label, as browsers do.
        if let Some(encoding) =
            named.or_else(|| encoding_rs::Encoding::for_bom(&self.body).map(|(e, _)| e))
        {
            return Some(encoding.decode(&self.body).0.into_owned());
        }
        match (std::str::from_utf8(&self.body), label) {
            (Ok(text), _) => Some(text.to_owned()),
            (Err(_), Some(label)) => Some(format!(
                "{}\n\n(the response's charset `{label}` is not one toolmux knows: the body is \
                 shown as UTF-8, U+FFFD standing for bytes that are not)",
                String::from_utf8_lossy(&self.body)
            )),
            (Err(_), None) => None,
        }
    }

    /// The body parsed as JSON, from its text when it names a charset or starts with a
    /// byte order mark (JSON in Latin-1 or UTF-16), else from its bytes.
    fn json(&self) -> Option<Value> {
        let transcoded = !self.reencoded
            && (charset_of(&self.content_type).is_some()
                || encoding_rs::Encoding::for_bom(&self.body).is_some());
        if transcoded {
            serde_json::from_str(&self.text()?).ok()
        } else {
            serde_json::from_slice(&self.body).ok()
        }
    }

    /// The tool output: JSON compact, text as text, failures with status and excerpt.
    pub(crate) fn into_output(self) -> ToolOutput {
        let status = self.status;
        let ok = (200..300).contains(&status);
        let output = if !ok {
            let text = self.text().unwrap_or_else(|| String::from_utf8_lossy(&self.body).into());
            let text = text.trim();
            let mut message = format!("HTTP {status} {}", self.reason);
            if let Some(unfollowed) = &self.unfollowed {
                message.push_str(": ");
                message.push_str(&unfollowed.note());
                message.push_str("; the full target is in the `location` extra");
            } else if !text.is_empty() {
                message.push_str(": ");
                message.push_str(&redacted_excerpt(text, ERROR_EXCERPT, &self.secrets));
            }
            ToolOutput::error(message)
        } else if let Some(items) = self.items {
            ToolOutput::json(Value::Array(items))
        } else if self.body.is_empty() {
            ToolOutput::text(format!("HTTP {status} {} (empty body)", self.reason))
        } else if self.content_type.starts_with("image/") {
            let mime_type =
                self.content_type.split(';').next().unwrap_or_default().trim().to_owned();
            ToolOutput {
                content: vec![ContentPart::Image {
                    data: crate::auth::base64(&self.body),
                    mime_type,
                }],
                ..ToolOutput::default()
            }
        } else if self.content_type.contains("json") {
            match self.json() {
                Some(value) => ToolOutput::json(value),
                None => ToolOutput::text(
                    self.text().unwrap_or_else(|| String::from_utf8_lossy(&self.body).into()),
                ),
            }
        } else {
            match self.text() {
                Some(text) => ToolOutput::text(text),
                None => ToolOutput::text(format!(
                    "(binary response: {} bytes of {})",
                    self.body.len(),
                    if self.content_type.is_empty() { "unknown type" } else { &self.content_type }
                )),
            }
        };
        let mut output = output.with_extra("status", Value::from(status));
        if let Some(unfollowed) = self.unfollowed {
            output = output.with_extra("location", Value::String(unfollowed.location.into()));
        }
        if self.content_type.is_empty() {
            output
        } else {
            output.with_extra("contentType", Value::String(self.content_type))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_cut_after_redaction_however_much_it_shrinks() {
        let secret = "s".repeat(40);
        let secrets = [secret.clone()];
        // Ten secrets shrink to REDACTED each, pulling the secret at the end of the first
        // window well before the cut.
        let text = format!("{}x", secret.repeat(30));
        let cut = redacted_excerpt(&text, 100, &secrets);
        assert_eq!(cut, format!("{}REDA…", "REDACTED".repeat(12)));
        assert!(!cut.contains("ss"), "{cut}");
        assert_eq!(redacted_excerpt("short", 100, &secrets), "short");
    }
}
