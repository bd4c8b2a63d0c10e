//! What a streamable HTTP request met, in words a person can act on: the server's URL
//! without what may be secret, what was wrong, and what to do, from rmcp's HTTP errors
//! (whose own words are `Unexpected content type: Some("text/html")` or `HTTP 502`).

use rmcp::transport::streamable_http_client::StreamableHttpError;

/// How far a request that failed got, which decides the error it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Not taken: the server was unreachable or refused it, and did not run it.
    Refused,
    /// Answered with something that is no MCP answer (a web page, broken JSON).
    Unreadable,
    /// Sent, and its answer lost: the server may have run it.
    Lost,
}

/// One failure said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpFailure {
    pub(crate) reach: Reach,
    /// What was wrong and what to do, naming the URL.
    pub(crate) message: String,
    /// The server could not be reached at all (a connect error at the handshake).
    pub(crate) unreachable: bool,
}

/// `url` as errors show it: without its query, fragment and user information, which may
/// hold a key, and without the whole when it does not parse.
pub(crate) fn shown_url(url: &str) -> String {
    let Ok(mut url) = reqwest::Url::parse(url) else {
        return "the configured `url`".to_owned();
    };
    url.set_query(None);
    url.set_fragment(None);
    // Only a URL that cannot be a base has no user information to remove.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

/// The most of a body quoted in an error.
const BODY_QUOTED: usize = 200;

/// What `error` says about a request to `url` (already [`shown_url`]); `None` when it is
/// no error of rmcp's streamable HTTP client.
pub(crate) fn describe(
    error: &(dyn std::error::Error + 'static),
    url: &str,
) -> Option<HttpFailure> {
    let error = error.downcast_ref::<StreamableHttpError<reqwest::Error>>()?;
    let said = |reach, message: String| HttpFailure { reach, message, unreachable: false };
    let credentials = "the server refuses the credentials sent: give ones it accepts in \
                       `headers` (for example `Authorization: Bearer ${TOKEN}`)";
    Some(match error {
        StreamableHttpError::Client(http) if http.is_connect() => HttpFailure {
            reach: Reach::Refused,
            message: format!(
                "cannot reach {url}: {}; is the server running, and is `url` right?",
                innermost(http as &(dyn std::error::Error + 'static))
            ),
            unreachable: true,
        },
        StreamableHttpError::Client(http) if http.is_timeout() => {
            said(Reach::Lost, format!("the request to {url} timed out"))
        }
        // A redirect not followed (to another origin, or too many): the request went no
        // further than the redirect, and the cause says why.
        StreamableHttpError::Client(http) if http.is_redirect() => {
            let cause = std::error::Error::source(http)
                .map_or_else(|| "too many redirects".to_owned(), toolmux_core::error_report);
            said(Reach::Refused, format!("{url} answered with a redirect: {cause}"))
        }
        // reqwest's own message names the URL, query and all; its causes do not.
        StreamableHttpError::Client(http) => {
            let cause = std::error::Error::source(http)
                .map_or_else(|| "no cause given".to_owned(), toolmux_core::error_report);
            said(Reach::Lost, format!("the request to {url} broke: {cause}"))
        }
        StreamableHttpError::HttpStatus(status) => {
            let retry = status.retry_after.as_deref().map(|after| format!(", retry after {after}"));
            let what = match status.status {
                429 => "the server limits how often it is called: call it less often",
                _ => {
                    "the server, or a proxy in front of it, failed: try again later, or see the \
                      server's log"
                }
            };
            let status_line = status_line(status.status);
            let retry = retry.unwrap_or_default();
            said(Reach::Refused, format!("{url} answered {status_line}{retry}; {what}"))
        }
        StreamableHttpError::UnexpectedServerResponse(text) => unexpected(text, url, credentials),
        StreamableHttpError::UnexpectedContentType(content_type) => {
            let content_type = content_type.as_deref().unwrap_or("no content type");
            said(
                Reach::Unreadable,
                format!(
                    "{url} answered with {content_type}, neither JSON nor an SSE stream; is `url` \
                     the server's MCP endpoint, with no login page or proxy answering for it?"
                ),
            )
        }
        StreamableHttpError::ResponseBodyTooLarge { max_size } => said(
            Reach::Lost,
            format!(
                "the answer from {url} is over {max_size} bytes, more than an answer may have; \
                 ask the tool for less"
            ),
        ),
        StreamableHttpError::SessionExpired => said(
            Reach::Refused,
            format!(
                "{url} refused the session, and a new one too; does every request reach the same \
                 server (behind a load balancer, sessions need affinity)?"
            ),
        ),
        StreamableHttpError::ReinitializationFailed(data) => said(
            Reach::Refused,
            format!(
                "{url} forgot the session and refused a new one: {} (code {})",
                data.message, data.code.0
            ),
        ),
        StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_) => {
            said(Reach::Refused, format!("{url} asks for authorization; {credentials}"))
        }
        other => said(Reach::Refused, format!("{url}: {}", toolmux_core::error_report(other))),
    })
}

/// rmcp's `UnexpectedServerResponse`: an HTTP status with the body (`HTTP 403 Forbidden:
/// forbidden`), a body that is no JSON-RPC message, or a refusal said by `passthrough`.
fn unexpected(text: &str, url: &str, credentials: &str) -> HttpFailure {
    let said = |reach, message: String| HttpFailure { reach, message, unreachable: false };
    let text = text.trim_end();
    if let Some(status) = text.strip_prefix("HTTP ") {
        // `HTTP {code} {reason}: {body}`, the body empty or not.
        let (status, body) = status.split_once(':').unwrap_or((status, ""));
        let code = status.split(' ').next().and_then(|c| c.parse::<u16>().ok()).unwrap_or(0);
        let body = quoted(body.trim());
        let body = if body.is_empty() { String::new() } else { format!(" ({body})") };
        let hint = match code {
            401 | 403 => format!("; {credentials}"),
            404 | 405 | 501 => "; is `url` the server's MCP endpoint?".to_owned(),
            _ => String::new(),
        };
        return said(Reach::Refused, format!("{url} answered {}{body}{hint}", status_line(code)));
    }
    if let Some(why) = text.strip_prefix("could not parse JSON response as ServerJsonRpcMessage: ")
    {
        // `{serde's error}: {the body's start}`.
        let (why, body) = why.split_once(": ").unwrap_or((why, ""));
        return said(
            Reach::Unreadable,
            format!(
                "{url} answered a body that is no JSON-RPC message ({why}): `{}`; is the server \
                 an MCP server, and does its log show an error?",
                quoted(body)
            ),
        );
    }
    said(Reach::Refused, format!("{url}: {}", quoted(text)))
}

/// `HTTP 502 Bad Gateway`, or the bare code when it has no reason phrase.
fn status_line(code: u16) -> String {
    let reason = reqwest::StatusCode::from_u16(code).ok().and_then(|s| s.canonical_reason());
    match reason {
        Some(reason) => format!("HTTP {code} {reason}"),
        None => format!("HTTP {code}"),
    }
}

/// At most [`BODY_QUOTED`] bytes of `text`, cut on a character boundary.
fn quoted(text: &str) -> &str {
    &text[..text.floor_char_boundary(BODY_QUOTED)]
}

/// The last error of `error`'s chain of causes: of a connect failure it says what happened
/// ("Connection refused", "failed to lookup address information: …"); the layers above it
/// name the client's internals (`client error (Connect)`, `tcp connect error`).
pub(crate) fn innermost<'a>(
    mut error: &'a (dyn std::error::Error + 'static),
) -> &'a (dyn std::error::Error + 'static) {
    while let Some(cause) = error.source() {
        error = cause;
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shown_url_keeps_no_secret() {
        let url = "https://user:pw@mcp.example.test:8443/a/mcp?key=SECRET#frag";
        assert_eq!(shown_url(url), "https://mcp.example.test:8443/a/mcp");
        assert_eq!(shown_url("not a url?key=SECRET"), "the configured `url`");
    }
}
