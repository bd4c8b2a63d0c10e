//! `toolmux mcp login` and `logout`: OAuth at one remote MCP server.

use crate::args::LoginArgs;
use crate::exit;
use futures::future::BoxFuture;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use toolmux::Toolmux;
use toolmux::config::Loaded;
use toolmux::toolmux_core::ToolProvider as _;
use toolmux::toolmux_mcp::{McpProvider, Opener};

/// Shows the authorization URL on stderr and, unless told not to, in a browser. Without a
/// browser here (`--no-browser`, on a machine reached over SSH) the address the browser was
/// sent to after the approval may be pasted on stdin: it is passed on to the loopback
/// listener, which the browser elsewhere could not reach.
#[derive(Debug)]
struct Browser {
    start: bool,
}

/// Passes pasted redirect addresses (`http://127.0.0.1:PORT/callback?...`) on to the
/// listener, from a thread of its own blocked on stdin (it ends with the process).
fn relay_pasted_redirects() {
    std::thread::spawn(|| {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { return };
            // Only ever to this machine's listener.
            let pasted = line.trim().strip_prefix("http://127.0.0.1:").and_then(|rest| {
                let (port, target) = rest.split_at(rest.find('/')?);
                let port: u16 = port.parse().ok()?;
                let clean = target.starts_with("/callback")
                    && !target.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control());
                clean.then(|| (port, target.to_owned()))
            });
            let Some((port, target)) = pasted else {
                if !line.trim().is_empty() {
                    eprintln!(
                        "(that is not the http://127.0.0.1:…/callback address the browser was sent to)"
                    );
                }
                continue;
            };
            if let Err(e) = pass_on(port, &target, PASS_ON_WAIT) {
                eprintln!("(cannot pass the address on: {e})");
            }
        }
    });
}

/// How long passing a pasted address on may wait to connect, and then for each write and
/// read: a port that is not the listener's may accept and never answer.
const PASS_ON_WAIT: Duration = Duration::from_secs(10);

/// Sends `GET target` to the local `port` and reads the answer, at most 64 KiB of it, each
/// step within `wait`, so that a wrong port leaves the paste relay free for the next line.
fn pass_on(port: u16, target: &str, wait: Duration) -> std::io::Result<String> {
    use std::io::{Read as _, Write as _};
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&address, wait)?;
    stream.set_read_timeout(Some(wait))?;
    stream.set_write_timeout(Some(wait))?;
    write!(stream, "GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer)?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

impl Opener for Browser {
    fn open<'a>(&'a self, server: &'a str, url: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            eprintln!(
                "To authorize toolmux at `{server}`, open this address in a browser:\n\n  {url}\n"
            );
            if self.start
                && let Err(why) = start_browser(url).await
            {
                eprintln!("(no browser started: {why}; open the address by hand)");
            }
            if !self.start {
                eprintln!(
                    "If the browser is on another machine, paste here the address it is sent to \
                     after the approval (http://127.0.0.1:…/callback?…)."
                );
                relay_pasted_redirects();
            }
            eprintln!("Waiting for the approval...");
            // The person may still open the address by hand: the wait goes on either way.
            Ok(())
        })
    }
}

/// `$BROWSER` (`%s` replaced by the URL, else the URL appended), else the desktop's
/// opener; waited for, so the process is reaped.
async fn start_browser(url: &str) -> Result<(), String> {
    let (program, args): (String, Vec<String>) = match std::env::var("BROWSER") {
        Ok(browser) if !browser.trim().is_empty() => {
            let mut words = browser.split_whitespace().map(str::to_owned);
            let program = words.next().unwrap_or_default();
            let mut args: Vec<String> = words.collect();
            if args.iter().any(|a| a.contains("%s")) {
                args = args.into_iter().map(|a| a.replace("%s", url)).collect();
            } else {
                args.push(url.to_owned());
            }
            (program, args)
        }
        _ if cfg!(target_os = "macos") => ("open".into(), vec![url.to_owned()]),
        _ => ("xdg-open".into(), vec![url.to_owned()]),
    };
    let status = tokio::process::Command::new(&program)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status()
        .await
        .map_err(|e| format!("cannot run `{program}`: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("`{program}` failed ({status})")) }
}

fn provider(loaded: &Loaded, name: &str) -> anyhow::Result<McpProvider> {
    let provider = Toolmux::mcp_server(loaded, name)?;
    if !provider.uses_oauth() {
        anyhow::bail!(toolmux::ToolmuxError::config(
            loaded.source_name(),
            format!(
                "mcp server `{name}` is not authorized with OAuth: only remote servers \
                 (streamable HTTP or SSE) are, and not with an `Authorization` header or `oauth.enabled: false`"
            ),
        ));
    }
    Ok(provider)
}

fn kept(path: Option<&Path>) -> Option<Vec<u8>> {
    path.and_then(|p| crate::files::read_regular(p, crate::files::TOKENS).ok())
}

pub(crate) async fn login(loaded: &Loaded, args: LoginArgs) -> anyhow::Result<u8> {
    let provider = provider(loaded, &args.name)?;
    let path = provider.oauth_token_path();
    if args.force {
        provider.oauth_logout().await?;
    }
    let before = kept(path.as_deref());
    provider.set_oauth_opener(Some(Arc::new(Browser { start: !args.no_browser })));
    let started = provider.warmup().await;
    let _ = provider.shutdown().await;
    if let Err(error) = started {
        eprintln!("error: {}", error.report());
        return Ok(exit::PROVIDER);
    }
    let after = kept(path.as_deref());
    let shown =
        path.as_deref().map_or_else(|| "memory only".to_owned(), |p| p.display().to_string());
    match (before, after) {
        (_, None) => eprintln!("`{}` did not ask for authorization; nothing is kept", args.name),
        (before, after) if before == after => eprintln!(
            "`{}` is already authorized (tokens in {shown}); `--force` authorizes again",
            args.name
        ),
        _ => eprintln!("`{}` is authorized; the tokens are kept in {shown}", args.name),
    }
    Ok(0)
}

pub(crate) async fn logout(loaded: &Loaded, name: &str) -> anyhow::Result<u8> {
    let provider = provider(loaded, name)?;
    if provider.oauth_logout().await? {
        eprintln!("forgot the tokens kept for `{name}`");
    } else {
        eprintln!("no tokens were kept for `{name}`");
    }
    Ok(0)
}

pub(crate) fn status(loaded: &Loaded, json: bool) -> anyhow::Result<u8> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut rows = Vec::new();
    for name in loaded.config.mcp_servers.keys() {
        let provider = Toolmux::mcp_server(loaded, name)?;
        rows.push((name.clone(), provider.oauth_status()));
    }
    if json {
        let value: serde_json::Map<String, serde_json::Value> = rows
            .into_iter()
            .map(|(name, status)| (name, serde_json::to_value(status).unwrap_or_default()))
            .collect();
        crate::commands::print(&serde_json::to_string_pretty(&value)?);
        return Ok(0);
    }
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut text = String::new();
    for (name, status) in &rows {
        let what = match status {
            None => "no OAuth (stdio, websocket, an Authorization header or oauth.enabled: false)"
                .to_owned(),
            Some(s) if !s.authorized => {
                "not authorized: `toolmux mcp login` when it asks".to_owned()
            }
            Some(s) => {
                let expiry = match s.expires_at {
                    Some(at) if at <= now => "token expired".to_owned(),
                    Some(at) => format!("token valid for {} min", (at - now) / 60),
                    None => "token without expiry".to_owned(),
                };
                let refresh = if s.refreshable { ", refreshable" } else { "" };
                let dpop = if s.dpop { ", DPoP-bound" } else { "" };
                let scopes = if s.scopes.is_empty() {
                    String::new()
                } else {
                    format!(", scopes {}", s.scopes.join(" "))
                };
                format!(
                    "authorized by {} ({expiry}{refresh}{dpop}{scopes})",
                    s.issuer.as_deref().unwrap_or("?")
                )
            }
        };
        text.push_str(&format!("{name:width$}  {what}\n"));
    }
    if text.is_empty() {
        eprintln!("no mcpServers are configured");
    } else {
        crate::commands::print(text.trim_end());
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::time::Instant;

    /// A port that accepts and never answers ends the relay's wait after its bound, with
    /// an error, rather than holding the relay (and every later paste) forever.
    #[test]
    fn a_silent_port_is_given_up_after_the_wait() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("an address").port();
        let holder = std::thread::spawn(move || listener.accept().map(|(stream, _)| stream));
        let started = Instant::now();
        let passed = pass_on(port, "/callback?code=x", Duration::from_millis(300));
        assert!(passed.is_err(), "{passed:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        drop(holder.join());
    }

    /// The listener's answer comes back, at most 64 KiB of it however much it sends.
    #[test]
    fn the_answer_is_read_up_to_its_bound() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("an address").port();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("the relay connects");
            // The whole request, which `write!` sends in pieces: closed with some of it
            // unread, the socket resets the connection, and the relay's read of the
            // answer failed (now and then) with `connection reset by peer`.
            stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
            let mut request = Vec::new();
            let mut piece = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") && request.len() < 64 * 1024 {
                let read = stream.read(&mut piece).expect("the request");
                if read == 0 {
                    break;
                }
                request.extend_from_slice(&piece[..read]);
            }
            let request = String::from_utf8_lossy(&request).into_owned();
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
            let _ = stream.write_all(&vec![b'a'; 200 * 1024]);
            request
        });
        let answer = pass_on(port, "/callback?code=x", Duration::from_secs(10)).expect("answer");
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{}", &answer[..40]);
        assert_eq!(answer.len(), 64 * 1024);
        let request = server.join().expect("the server thread");
        assert!(request.starts_with("GET /callback?code=x HTTP/1.1\r\n"), "{request}");
    }
}
