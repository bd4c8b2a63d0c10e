//! The redirect URI of the authorization code grant: a listener on this machine's loopback
//! address (RFC 8252) that takes the browser's one request to `/callback`.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::OAuthError;

/// The largest request head read from the browser.
const MAX_HEAD: usize = 16 * 1024;

/// A bound redirect listener.
#[derive(Debug)]
pub(crate) struct Callback {
    listener: TcpListener,
    port: u16,
}

/// What the authorization server sent back.
#[derive(Debug)]
pub(crate) struct Redirect {
    pub(crate) code: String,
    /// The authorization server's `iss` (RFC 9207), when it sent one.
    pub(crate) iss: Option<String>,
}

impl Callback {
    /// Binds `127.0.0.1:port` (0: any free port).
    pub(crate) async fn bind(port: u16) -> std::io::Result<Callback> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let port = listener.local_addr()?.port();
        Ok(Callback { listener, port })
    }

    pub(crate) fn redirect_uri(&self) -> String {
        format!("http://127.0.0.1:{}/callback", self.port)
    }

    /// Waits for the redirect carrying `state`, answering the browser with a page that
    /// says how it went. Requests for other paths (a favicon) get a 404 and the wait goes
    /// on; a wrong `state` or an `error` ends it.
    pub(crate) async fn wait(&self, state: &str) -> Result<Redirect, OAuthError> {
        loop {
            let (mut stream, _) =
                self.listener.accept().await.map_err(|e| {
                    OAuthError::failed(format!("the redirect listener failed: {e}"))
                })?;
            let Some(target) = read_target(&mut stream).await else { continue };
            let Some(query) =
                target.strip_prefix("/callback").map(|rest| rest.trim_start_matches('?'))
            else {
                respond(&mut stream, "404 Not Found", "Not found.").await;
                continue;
            };
            let params: Vec<(String, String)> = form_pairs(query);
            let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
            if get("state") != Some(state) {
                respond(&mut stream, "400 Bad Request", "This authorization response is not the one toolmux is waiting for (its state does not match).").await;
                return Err(OAuthError::failed(
                    "the authorization response's `state` does not match the request's; start the authorization again",
                ));
            }
            if let Some(error) = get("error") {
                let description = get("error_description").unwrap_or("");
                respond(
                    &mut stream,
                    "200 OK",
                    "toolmux was not authorized. You can close this tab.",
                )
                .await;
                return Err(OAuthError::failed(format!(
                    "the authorization server refused: {error}{}{description}",
                    if description.is_empty() { "" } else { ": " }
                )));
            }
            let Some(code) = get("code").filter(|c| !c.is_empty()) else {
                respond(&mut stream, "400 Bad Request", "The authorization response has no code.")
                    .await;
                return Err(OAuthError::failed("the authorization response has no `code`"));
            };
            respond(&mut stream, "200 OK", "toolmux is authorized. You can close this tab.").await;
            return Ok(Redirect { code: code.to_owned(), iss: get("iss").map(str::to_owned) });
        }
    }
}

/// The request target of a `GET`, or `None` for anything unreadable (answered with 400).
async fn read_target(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Some(())
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.ok().flatten()?;
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut parts = line.split(' ');
    match (parts.next(), parts.next()) {
        (Some("GET"), Some(target)) => Some(target.to_owned()),
        _ => {
            respond(stream, "400 Bad Request", "Bad request.").await;
            None
        }
    }
}

async fn respond(stream: &mut TcpStream, status: &str, message: &str) {
    let body = format!(
        "<!doctype html><meta charset=utf-8><title>toolmux</title><p>{}</p>\n",
        message.replace('&', "&amp;").replace('<', "&lt;")
    );
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\ncache-control: no-store\r\n\r\n{body}",
        body.len()
    );
    let _ =
        tokio::time::timeout(Duration::from_secs(5), stream.write_all(response.as_bytes())).await;
    let _ = stream.shutdown().await;
}

/// `application/x-www-form-urlencoded` pairs.
pub(crate) fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(part: &str) -> String {
    let plus = part.replace('+', " ");
    percent_encoding::percent_decode_str(&plus).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(port: u16, target: &str) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect");
        stream
            .write_all(format!("GET {target} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
    }

    #[tokio::test]
    async fn takes_the_code_and_ignores_other_paths() {
        let callback = Callback::bind(0).await.expect("bind");
        let port = callback.port;
        assert!(callback.redirect_uri().starts_with("http://127.0.0.1:"));
        let browser = tokio::spawn(async move {
            let favicon = get(port, "/favicon.ico").await;
            assert!(favicon.starts_with("HTTP/1.1 404"), "{favicon}");
            get(port, "/callback?code=a%2Bb+c&state=s1").await
        });
        let redirect = callback.wait("s1").await.expect("code");
        assert_eq!(redirect.code, "a+b c");
        assert!(browser.await.expect("browser").contains("toolmux is authorized"));
    }

    #[tokio::test]
    async fn refusals_and_forged_state_end_the_wait() {
        let callback = Callback::bind(0).await.expect("bind");
        let port = callback.port;
        tokio::spawn(async move {
            get(port, "/callback?error=access_denied&error_description=no+way&state=s").await
        });
        let error = callback.wait("s").await.expect_err("denied");
        assert_eq!(error.to_string(), "the authorization server refused: access_denied: no way");
        tokio::spawn(async move { get(port, "/callback?code=c&state=forged").await });
        let error = callback.wait("s").await.expect_err("forged");
        assert!(error.to_string().contains("does not match"), "{error}");
    }
}
