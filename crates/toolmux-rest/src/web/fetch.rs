//! `web__fetch`: one URL read as Markdown or text, reaching only the addresses the
//! configuration allows, in pages of characters.

use super::html;
use super::robots;
use super::{FetchConfig, host_matches, text_argument, with_causes};
use futures::StreamExt as _;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use serde_json::{Value, json};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use toolmux_core::{CallContext, ToolError, ToolOutput};

const DEFAULT_MAX_BYTES: u64 = 5_000_000;
const DEFAULT_MAX_LENGTH: usize = 20_000;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_MAX_REDIRECTS: usize = 5;
/// Characters of an error page shown in the error.
const ERROR_EXCERPT: usize = 600;

/// What `web__fetch` may reach.
#[derive(Debug, Clone)]
struct Policy {
    allow_private: bool,
    allowed_hosts: Vec<HostPattern>,
    denied_hosts: Vec<HostPattern>,
}

/// A pattern of `allowedHosts` or `deniedHosts`, in the form it is matched in and in the
/// form the configuration wrote it in.
#[derive(Debug, Clone)]
struct HostPattern {
    /// The form a URL's host takes: a name written in Unicode in its ASCII form
    /// (`xn--bcher-kva.de`), since that is what [`Url::host_str`] gives.
    ascii: String,
    /// As configured (`bücher.de`), which is how messages name it: the person who wrote it
    /// may not recognise its ASCII form.
    written: String,
}

impl Policy {
    /// Why `url` may not be fetched (its scheme, its host, an IP literal's address).
    fn refuses(&self, url: &Url) -> Option<String> {
        if !matches!(url.scheme(), "http" | "https") {
            return Some(format!("`{}` URLs are not fetched: only http and https", url.scheme()));
        }
        let Some(host) = url.host_str() else {
            return Some("the URL has no host".into());
        };
        // The URL parser writes IPv4 literals in dotted form (`0x7f000001` becomes
        // `127.0.0.1`) and IPv6 ones in brackets.
        let literal: Option<IpAddr> = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']'))
        {
            // An IPv4-mapped IPv6 literal (`[::ffff:169.254.169.254]`) reaches the IPv4
            // address it carries, so it is named, and matched against the host lists, as
            // that address.
            // So is a NAT64 one (`[64:ff9b::a00:5]`).
            Some(v6) => v6.parse::<Ipv6Addr>().ok().map(|ip| unmapped(IpAddr::V6(ip))),
            None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
        };
        let name = literal.map_or_else(|| host.to_owned(), |ip| ip.to_string());
        let listed = |pattern: &HostPattern| match literal {
            Some(ip) => {
                address_of(&pattern.ascii) == Some(ip) || host_matches(&name, &pattern.ascii)
            }
            None => host_matches(&name, &pattern.ascii),
        };
        if self.denied_hosts.iter().any(listed) {
            return Some(format!("host {} is in `web.fetch.deniedHosts`", both_forms(&name)));
        }
        if !self.allowed_hosts.is_empty() && !self.allowed_hosts.iter().any(listed) {
            let written: Vec<&str> =
                self.allowed_hosts.iter().map(|p| p.written.as_str()).collect();
            return Some(format!(
                "host {} is not in `web.fetch.allowedHosts` ({})",
                both_forms(&name),
                written.join(", ")
            ));
        }
        match literal {
            Some(ip) if !self.allow_private && !is_public(ip) => {
                Some(private_refusal(&name, &[ip]))
            }
            _ => None,
        }
    }
}

/// A host name as people read it, in backticks: `` `bücher.de` (`xn--bcher-kva.de`) `` for
/// one whose ASCII form holds punycode, else `` `example.com` ``.
fn both_forms(ascii: &str) -> String {
    let (unicode, valid) = idna::domain_to_unicode(ascii);
    if valid.is_ok() && unicode != ascii.to_ascii_lowercase() {
        format!("`{unicode}` (`{ascii}`)")
    } else {
        format!("`{ascii}`")
    }
}

/// The host patterns with the form a URL's host takes: a name written in Unicode
/// (`bücher.de`, `*.bücher.de`) in its ASCII form (`xn--bcher-kva.de`), since that is what
/// [`Url::host_str`] gives and so what it is matched against; IP addresses as given.
fn host_patterns(patterns: &[String]) -> Result<Vec<HostPattern>, String> {
    patterns
        .iter()
        .map(|pattern| {
            let written = pattern.clone();
            if address_of(pattern).is_some() {
                return Ok(HostPattern { ascii: written.clone(), written });
            }
            let (wildcard, bare) = match pattern.strip_prefix("*.") {
                Some(bare) => ("*.", bare),
                None => ("", pattern.as_str()),
            };
            let not_a_host = || {
                format!(
                    "web.fetch: host pattern `{pattern}` is not a host name, an IP address or `*.domain`"
                )
            };
            if bare.is_empty() || bare.contains(['*', '/', ':', ' ']) {
                return Err(not_a_host());
            }
            // The URL parser is the one requests go through, so the pattern is converted
            // exactly as a URL's host is.
            let parsed = Url::parse(&format!("http://{bare}/")).map_err(|_| not_a_host())?;
            let ascii = parsed.host_str().ok_or_else(not_a_host)?;
            Ok(HostPattern { ascii: format!("{wildcard}{ascii}"), written })
        })
        .collect()
}

/// The address a host pattern names when it is an IP literal (`169.254.169.254`, `::1`,
/// `[::1]`), an IPv4-mapped IPv6 one as the IPv4 address it carries.
fn address_of(pattern: &str) -> Option<IpAddr> {
    let bare = pattern.strip_prefix('[').and_then(|p| p.strip_suffix(']')).unwrap_or(pattern);
    bare.parse::<IpAddr>().ok().map(unmapped)
}

/// `ip`, or the IPv4 address an IPv4-mapped or NAT64 (`64:ff9b::/96`) IPv6 one carries
/// (which is where it leads).
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().or_else(|| nat64(v6)).map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// The IPv4 address a well-known-prefix NAT64 address (`64:ff9b::/96`) carries.
fn nat64(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    (s[..6] == [0x64, 0xff9b, 0, 0, 0, 0])
        .then(|| Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8))
}

fn private_refusal(host: &str, addresses: &[IpAddr]) -> String {
    let shown: Vec<String> = addresses.iter().take(4).map(IpAddr::to_string).collect();
    format!(
        "`{host}` leads only to local or private network addresses ({}); web__fetch reaches \
         public addresses only, unless `web.fetch.allowPrivate` is true",
        shown.join(", ")
    )
}

/// Whether `ip` is an address on the public internet: not loopback, private, link-local,
/// shared (carrier-grade NAT), multicast, reserved, documentation or unspecified; IPv6
/// addresses carrying an IPv4 one are judged by it.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => {
            if let Some(v4) = ip.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
            if let Some(v4) = nat64(ip) {
                return is_public_v4(v4);
            }
            let s = ip.segments();
            !(ip.is_unspecified()
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64 (RFC 8215)
                || ip.is_loopback()
                || ip.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
                || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
                || s[..6] == [0, 0, 0, 0, 0, 0]) // IPv4-compatible (deprecated)
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (RFC 6598)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240) // reserved
}

/// A host name resolved to addresses of which none may be reached.
#[derive(Debug)]
struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Resolves host names with the system's resolver and keeps the addresses the policy
/// allows, so that the connection goes to a checked address: a public one (unless
/// `allowPrivate`) that `deniedHosts` does not name. Every connection resolves anew, a
/// redirect's and robots.txt's included, so a name that resolves to a denied address
/// (`localhost` with `127.0.0.1` denied, or a name rebound after an earlier check) is
/// refused where it is connected, not only where it was written.
#[derive(Debug)]
struct CheckedResolver {
    allow_private: bool,
    /// The IP literals of `deniedHosts`, IPv4-mapped ones as IPv4.
    denied: Arc<[IpAddr]>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        let denied = Arc::clone(&self.denied);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?
                .collect();
            let is_denied = |a: &SocketAddr| denied.contains(&unmapped(a.ip()));
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| !is_denied(a) && (allow_private || is_public(a.ip())))
                .collect();
            if allowed.is_empty() {
                let ips: Vec<IpAddr> = found.iter().map(SocketAddr::ip).collect();
                let named: Vec<String> =
                    found.iter().filter(|a| is_denied(a)).map(|a| a.ip().to_string()).collect();
                let refused = if ips.is_empty() {
                    Refused(format!("`{host}` resolves to no address"))
                } else if !named.is_empty() {
                    Refused(format!(
                        "`{host}` resolves to {}, which `web.fetch.deniedHosts` names, and to no \
                         address this fetch may reach",
                        named.join(", ")
                    ))
                } else {
                    Refused(private_refusal(&host, &ips))
                };
                return Err(Box::new(refused) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// Seconds for people: `10s`, `0.5s`.
fn human_seconds(d: Duration) -> String {
    let seconds = d.as_secs_f64();
    if seconds.fract() == 0.0 { format!("{seconds:.0}s") } else { format!("{seconds:.1}s") }
}

/// `web__fetch`'s client and limits.
#[derive(Debug)]
pub(crate) struct Fetcher {
    client: reqwest::Client,
    /// The client of page fetches with robots.txt obeyed: it follows no redirect itself, so
    /// [`Fetcher::get`] asks each hop's robots.txt before it requests the hop.
    hop_client: reqwest::Client,
    max_redirects: usize,
    policy: Arc<Policy>,
    max_bytes: u64,
    max_length: usize,
    timeout: Duration,
    /// The product token robots.txt rules are looked up by, and the rules read lately;
    /// `None` with `robotsTxt: false`.
    robots: Option<(String, robots::Kept)>,
    /// When each site that sets a `Crawl-delay` may be fetched next.
    pace: robots::Pace,
}

/// The longest wait for a site's robots.txt (within the call's own limit).
const ROBOTS_TIMEOUT: Duration = Duration::from_secs(10);

impl Fetcher {
    pub(crate) fn new(config: &FetchConfig) -> Result<Fetcher, String> {
        let policy = Arc::new(Policy {
            allow_private: config.allow_private,
            allowed_hosts: host_patterns(&config.allowed_hosts)?,
            denied_hosts: host_patterns(&config.denied_hosts)?,
        });
        let max_redirects = config.max_redirects.unwrap_or(DEFAULT_MAX_REDIRECTS);
        let redirects = Arc::clone(&policy);
        let redirect = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > max_redirects {
                return attempt.error(format!("more than {max_redirects} redirects"));
            }
            match redirects.refuses(attempt.url()) {
                Some(why) => {
                    let why = format!("a redirect to {} was refused: {why}", origin(attempt.url()));
                    attempt.error(Refused(why))
                }
                None => attempt.follow(),
            }
        });
        // reqwest is built without a default crypto provider; install ring's once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let user_agent = config.user_agent.clone().unwrap_or_else(|| {
            concat!("toolmux/", env!("CARGO_PKG_VERSION"), " (+web fetch for an AI agent)").into()
        });
        let robots = config
            .robots_txt
            .unwrap_or(true)
            .then(|| (robots::product_token(&user_agent), robots::Kept::default()));
        let build = |redirect: reqwest::redirect::Policy| {
            reqwest::Client::builder()
                .redirect(redirect)
                .no_proxy()
                .dns_resolver(Arc::new(CheckedResolver {
                    allow_private: config.allow_private,
                    denied: config.denied_hosts.iter().filter_map(|p| address_of(p)).collect(),
                }))
                .user_agent(user_agent.clone())
                .build()
                .map_err(|e| format!("web.fetch: cannot build the HTTP client: {e}"))
        };
        let client = build(redirect)?;
        let hop_client = build(reqwest::redirect::Policy::none())?;
        Ok(Fetcher {
            client,
            hop_client,
            max_redirects,
            policy,
            max_bytes: config.max_bytes.unwrap_or(DEFAULT_MAX_BYTES),
            max_length: config.max_length.unwrap_or(DEFAULT_MAX_LENGTH),
            timeout: config.timeout_ms.map_or(DEFAULT_TIMEOUT, Duration::from_millis),
            robots,
            pace: robots::Pace::default(),
        })
    }

    pub(crate) fn default_length(&self) -> usize {
        self.max_length
    }

    /// Fetches the URL `arguments` name; `secrets` are kept out of what an error shows.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: &Value,
        secrets: &[String],
        ctx: &CallContext,
    ) -> Result<ToolOutput, ToolError> {
        let invalid = |message: String| ToolError::invalid_arguments(tool, message);
        let given = text_argument(tool, arguments, "url")?;
        let url = Url::parse(given.trim())
            .map_err(|e| invalid(format!("`url` `{given}` is not a URL: {e}")))?;
        let number = |key: &str| arguments.get(key).and_then(Value::as_u64);
        let max_length = number("max_length").map_or(self.max_length, |n| n as usize).max(1);
        let start = number("start_index").unwrap_or(0) as usize;
        let raw = arguments.get("raw").and_then(Value::as_bool).unwrap_or(false);
        if let Some(why) = self.policy.refuses(&url) {
            return Err(ToolError::Denied { tool: tool.to_owned(), reason: why });
        }
        let mut limit = self.timeout;
        if let Some(deadline) = ctx.deadline() {
            limit = limit.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        }
        let until = tokio::time::Instant::now() + limit;
        let fetch = async {
            if let Some(delay) = self.obey_robots(tool, &url).await? {
                self.wait_turn(tool, &url, delay, until).await?;
            }
            self.get(tool, &url, secrets, until).await
        };
        let page = tokio::time::timeout(limit, fetch).await.map_err(|_| ToolError::Timeout {
            tool: tool.to_owned(),
            after: limit,
            idle: None,
        })??;
        let text = page.render(raw).map_err(|why| ToolError::remote(tool, why))?;
        slice(&page, &text, start, max_length).map_err(invalid)
    }

    /// Waits for the turn of `url`'s site, which asks for `delay` between fetches; a turn
    /// further off than half of what is left until `until` is not taken (the fetch keeps
    /// the other half) and fails as rate limited, saying when to call again.
    async fn wait_turn(
        &self,
        tool: &str,
        url: &Url,
        delay: Duration,
        until: tokio::time::Instant,
    ) -> Result<(), ToolError> {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let wait = self.pace.take(&origin(url), delay, left / 2).map_err(|turn| {
            ToolError::RateLimited {
                tool: tool.to_owned(),
                limit: format!(
                    "{} asks for {} between fetches in its robots.txt (`Crawl-delay`)",
                    origin(url),
                    human_seconds(delay)
                ),
                retry_after: turn,
            }
        })?;
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// Refuses `url` when its site's robots.txt disallows it for our product token; else
    /// the site's `Crawl-delay`, if it sets one.
    async fn obey_robots(&self, tool: &str, url: &Url) -> Result<Option<Duration>, ToolError> {
        let Some((token, kept)) = &self.robots else { return Ok(None) };
        let site = origin(url);
        let rules = match kept.get(&site) {
            Some(rules) => rules,
            None => match self.read_robots(tool, url, token).await? {
                robots::Verdict::Rules(rules) => {
                    let rules = Arc::new(rules);
                    kept.put(site.clone(), rules.clone());
                    rules
                }
                robots::Verdict::Unreachable(why) => {
                    return Err(ToolError::remote(
                        tool,
                        format!(
                            "{site}/robots.txt {why}; a site whose robots.txt fails asks crawlers \
                             to fetch nothing until it works (RFC 9309): try again later"
                        ),
                    ));
                }
            },
        };
        match rules.refusal(url) {
            None => Ok(rules.crawl_delay()),
            Some(rule) => Err(ToolError::Denied {
                tool: tool.to_owned(),
                reason: format!(
                    "{site}/robots.txt disallows {url} for `{token}` (`Disallow: {}`): the site \
                     asks automated agents not to fetch it. Find the information elsewhere; an \
                     operator who may read the site anyway sets `web.fetch.robotsTxt: false`",
                    rule.pattern
                ),
            }),
        }
    }

    /// Reads the robots.txt of `url`'s site: its rules for `token`, none when it is missing
    /// or refused (4xx), or why it failed (5xx).
    async fn read_robots(
        &self,
        tool: &str,
        url: &Url,
        token: &str,
    ) -> Result<robots::Verdict, ToolError> {
        let mut robots_url = url.clone();
        robots_url.set_path("/robots.txt");
        robots_url.set_query(None);
        robots_url.set_fragment(None);
        let read = async {
            let response = self.client.get(robots_url.clone()).send().await?;
            let status = response.status();
            let mut body = Vec::new();
            if status.is_success() {
                let mut stream = response.bytes_stream();
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    let room = robots::MAX_ROBOTS_BYTES.saturating_sub(body.len());
                    body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    if chunk.len() >= room {
                        break;
                    }
                }
            }
            Ok::<_, reqwest::Error>((status, body))
        };
        let (status, body) = match tokio::time::timeout(ROBOTS_TIMEOUT, read).await {
            Ok(Ok(read)) => read,
            // Redirected too often, or somewhere this fetch may not go: the RFC lets a
            // crawler take the file as unavailable, which allows everything (the page's
            // own address was checked, and is checked again when it is fetched).
            Ok(Err(e)) if e.is_redirect() || refused(&e).is_some() => {
                return Ok(robots::Verdict::Rules(robots::Rules::default()));
            }
            Ok(Err(e)) => return Err(request_error(tool, &robots_url, &e)),
            Err(_) => {
                let after = ROBOTS_TIMEOUT.as_secs();
                return Ok(robots::Verdict::Unreachable(format!(
                    "did not answer within {after} s"
                )));
            }
        };
        Ok(if status.is_success() {
            robots::Verdict::Rules(robots::Rules::parse(&String::from_utf8_lossy(&body), token))
        } else if status.is_server_error() {
            robots::Verdict::Unreachable(format!("answered {status}"))
        } else {
            // Missing, refused, or anything else that is no answer: no rules.
            robots::Verdict::Rules(robots::Rules::default())
        })
    }

    /// The response to `GET url`, its body cut at `max_bytes`; refused when a redirect led
    /// to a page robots.txt disallows, before that page is requested. A redirect to a site
    /// that sets a `Crawl-delay` waits for its turn there, within `until`.
    async fn get(
        &self,
        tool: &str,
        url: &Url,
        secrets: &[String],
        until: tokio::time::Instant,
    ) -> Result<Fetched, ToolError> {
        let response = match self.robots {
            None => self.request(&self.client, tool, url, None).await?,
            Some(_) => self.follow(tool, url, until).await?,
        };
        let status = response.status();
        let final_url = response.url().clone();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let mut body = Vec::new();
        let mut cut = false;
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| request_error(tool, url, &e))?;
            let room = (self.max_bytes as usize).saturating_sub(body.len());
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                cut = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let fetched = Fetched { url: url.clone(), final_url, content_type, body, cut };
        if status.is_client_error() || status.is_server_error() {
            // Redacted before it is cut: cut first, a secret at the cut would lose its
            // tail and go out unrecognized. The page is rendered whole anyway.
            let page = fetched.render(false).unwrap_or_default();
            let excerpt: String =
                crate::secrets::scrub(&page, secrets).chars().take(ERROR_EXCERPT).collect();
            return Err(ToolError::remote(
                tool,
                format!(
                    "GET {} answered {status}{}",
                    crate::secrets::scrub(fetched.final_url.as_str(), secrets),
                    if excerpt.trim().is_empty() {
                        String::new()
                    } else {
                        format!(": {}", excerpt.trim())
                    }
                ),
            ));
        }
        Ok(fetched)
    }
}

impl Fetcher {
    /// `GET url` with `client`, the page types asked for; `referer` is the page a redirect
    /// came from, sent as reqwest sends it on the redirects it follows itself.
    async fn request(
        &self,
        client: &reqwest::Client,
        tool: &str,
        url: &Url,
        referer: Option<&Url>,
    ) -> Result<reqwest::Response, ToolError> {
        let mut request = client.get(url.clone()).header(
            reqwest::header::ACCEPT,
            "text/html,application/xhtml+xml,text/plain;q=0.9,application/json;q=0.8,*/*;q=0.5",
        );
        if let Some(referer) = referer.and_then(|previous| referer_of(url, previous)) {
            request = request.header(reqwest::header::REFERER, referer);
        }
        request.send().await.map_err(|e| request_error(tool, url, &e))
    }

    /// `GET url` following its redirects one hop at a time: each hop's address is checked
    /// as the redirect policy checks it, and its site's robots.txt is asked before the hop
    /// is requested, so a chain through a disallowed page does not fetch that page, and a
    /// hop to a site that sets a `Crawl-delay` waits for its turn there as a fetch of it
    /// would. (`url` itself was asked, and waited for, before.)
    async fn follow(
        &self,
        tool: &str,
        url: &Url,
        until: tokio::time::Instant,
    ) -> Result<reqwest::Response, ToolError> {
        let mut at = url.clone();
        let mut from: Option<Url> = None;
        let mut hops = 0;
        loop {
            let response = self.request(&self.hop_client, tool, &at, from.as_ref()).await?;
            let location =
                response.headers().get(reqwest::header::LOCATION).and_then(|v| v.to_str().ok());
            let next = match location {
                Some(location) if is_followed(response.status()) => {
                    at.join(location).map_err(|e| {
                        ToolError::remote(
                            tool,
                            format!("GET {at} redirected to `{location}`, which is no URL: {e}"),
                        )
                    })?
                }
                _ => return Ok(response),
            };
            hops += 1;
            if hops > self.max_redirects {
                return Err(ToolError::remote(
                    tool,
                    format!("GET {url} failed: more than {} redirects", self.max_redirects),
                ));
            }
            if let Some(why) = self.policy.refuses(&next) {
                let reason = format!("a redirect to {} was refused: {why}", origin(&next));
                return Err(ToolError::Denied { tool: tool.to_owned(), reason });
            }
            if let Some(delay) = self.obey_robots(tool, &next).await? {
                self.wait_turn(tool, &next, delay, until).await?;
            }
            from = Some(std::mem::replace(&mut at, next));
        }
    }
}

/// Whether a response with this status is a redirect that is followed: the ones reqwest
/// follows (301, 302, 303, 307, 308), so that a fetch ends on the same response whether
/// [`Fetcher::follow`] or reqwest follows its redirects. 300 and 304 are answers.
fn is_followed(status: reqwest::StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// The `Referer` of a request to `next` that a redirect from `previous` led to, as reqwest
/// sends it on the redirects it follows, so that a hop carries the same headers with
/// `robotsTxt` on as off: `previous` without its user info and fragment, and none from an
/// https page to an http one.
fn referer_of(next: &Url, previous: &Url) -> Option<String> {
    if previous.scheme() == "https" && next.scheme() == "http" {
        return None;
    }
    let mut referer = previous.clone();
    // Neither fails on an http(s) URL, the only kind fetched.
    let _ = referer.set_username("");
    let _ = referer.set_password(None);
    referer.set_fragment(None);
    Some(referer.into())
}

/// The refusal of an address or redirect `error` holds, if it does.
fn refused(error: &reqwest::Error) -> Option<&Refused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<Refused>() {
            return Some(refused);
        }
        source = cause.source();
    }
    None
}

/// The error of a request that got no (complete) response: a refused address or redirect
/// is said as such, anything else with reqwest's chain (which holds no credentials: the
/// fetch sends none).
fn request_error(tool: &str, url: &Url, error: &reqwest::Error) -> ToolError {
    if let Some(refused) = refused(error) {
        return ToolError::Denied { tool: tool.to_owned(), reason: refused.0.clone() };
    }
    ToolError::remote(tool, format!("GET {url} failed: {}", with_causes(error)))
}

fn origin(url: &Url) -> String {
    url.origin().ascii_serialization()
}

/// A response as read.
#[derive(Debug)]
struct Fetched {
    url: Url,
    final_url: Url,
    content_type: String,
    body: Vec<u8>,
    /// The body was longer than `maxBytes`.
    cut: bool,
}

impl Fetched {
    fn mime(&self) -> String {
        self.content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
    }

    fn is_html(&self) -> bool {
        let mime = self.mime();
        if mime == "text/html" || mime == "application/xhtml+xml" {
            return true;
        }
        if !mime.is_empty() {
            return false;
        }
        let start: String =
            String::from_utf8_lossy(&self.body[..self.body.len().min(512)]).to_ascii_lowercase();
        let start = start.trim_start();
        start.starts_with("<!doctype html") || start.starts_with("<html")
    }

    fn is_text(&self) -> bool {
        let mime = self.mime();
        mime.is_empty() && !self.body[..self.body.len().min(8192)].contains(&0)
            || mime.starts_with("text/")
            || mime.ends_with("+json")
            || mime.ends_with("+xml")
            || matches!(
                mime.as_str(),
                "application/json"
                    | "application/xml"
                    | "application/javascript"
                    | "application/x-javascript"
                    | "application/ecmascript"
                    | "application/x-yaml"
                    | "application/yaml"
                    | "application/toml"
                    | "application/x-sh"
                    | "application/sql"
                    | "application/graphql"
                    | "application/ld+json"
                    | "application/x-ndjson"
            )
    }

    /// The body as text, decoded as a browser would: a byte-order mark first, then the
    /// `charset` of the `Content-Type` header, then (for HTML) a `<meta>` charset near the
    /// start of the page, else UTF-8; bytes invalid in the encoding become U+FFFD. Any
    /// encoding of the WHATWG Encoding Standard is read (Shift_JIS, GBK, EUC-KR,
    /// windows-1251, ...); `iso-8859-1` and `us-ascii` mean windows-1252, as for browsers.
    fn decoded(&self) -> String {
        let of = |label: String| encoding_rs::Encoding::for_label(label.as_bytes());
        let declared = crate::http::charset_of(&self.content_type).and_then(of);
        let encoding = declared
            .or_else(|| {
                // UTF-16 named by a `<meta>` tag cannot be (the tag was read as ASCII): the
                // HTML standard reads it as UTF-8, and x-user-defined as windows-1252.
                let meta = meta_charset(&self.body).filter(|_| self.is_html()).and_then(of)?;
                Some(if meta == encoding_rs::X_USER_DEFINED {
                    encoding_rs::WINDOWS_1252
                } else {
                    meta.output_encoding()
                })
            })
            .unwrap_or(encoding_rs::UTF_8);
        // `decode` lets a BOM override the label.
        let (text, _, _) = encoding.decode(&self.body);
        text.into_owned()
    }

    /// The content as the model reads it: a page as Markdown (or its HTML with `raw`),
    /// other text as it is; why not, for content that is not text.
    fn render(&self, raw: bool) -> Result<String, String> {
        if self.is_html() {
            let html = self.decoded();
            if raw {
                return Ok(html);
            }
            let page = html::to_markdown(&html, Some(&self.final_url));
            return Ok(match page.title {
                Some(title) => format!("# {title}\n\n{}", page.text),
                None => page.text,
            });
        }
        if self.is_text() {
            return Ok(self.decoded());
        }
        Err(format!(
            "{} is {} ({} bytes), not a web page or text: web__fetch reads pages and text only",
            self.final_url,
            if self.content_type.is_empty() { "binary content" } else { &self.content_type },
            self.body.len()
        ))
    }
}

/// The page of `text` from character `start`, at most `max_length` characters, with a
/// header naming the URL and a footer saying where to read on.
fn slice(
    fetched: &Fetched,
    text: &str,
    start: usize,
    max_length: usize,
) -> Result<ToolOutput, String> {
    let total = text.chars().count();
    if start > 0 && start >= total {
        return Err(format!(
            "`start_index` {start} is past the end: the content has {total} characters"
        ));
    }
    let shown: String = text.chars().skip(start).take(max_length).collect();
    let end = start + shown.chars().count();
    let mut out = format!("Contents of {}", fetched.final_url);
    if fetched.final_url != fetched.url {
        out.push_str(&format!(" (redirected from {})", fetched.url));
    }
    out.push_str(":\n\n");
    out.push_str(&shown);
    if end < total {
        out.push_str(&format!(
            "\n\n[characters {}-{end} of {total}; call again with start_index={end} to read on]",
            start + 1
        ));
    } else if start > 0 {
        out.push_str(&format!("\n\n[characters {}-{end} of {total}: the end]", start + 1));
    }
    if fetched.cut {
        out.push_str(&format!(
            "\n[the response was longer than `web.fetch.maxBytes` ({} bytes) and was cut there]",
            fetched.body.len()
        ));
    }
    Ok(ToolOutput::text(out)
        .with_extra("url", json!(fetched.final_url.as_str()))
        .with_extra("contentType", json!(fetched.content_type))
        .with_extra("totalChars", json!(total))
        .with_extra("truncated", json!(end < total))
        .with_extra("nextStartIndex", if end < total { json!(end) } else { Value::Null }))
}

/// How far into a page a `<meta>` charset is looked for (the Encoding Standard's prescan
/// looks at 1024 bytes; pages with long heads put it later, so a little more).
const META_SCAN: usize = 4096;

/// The charset a page declares in its head: `<meta charset="…">` or
/// `<meta http-equiv="Content-Type" content="text/html; charset=…">`.
fn meta_charset(body: &[u8]) -> Option<String> {
    let head = &body[..body.len().min(META_SCAN)];
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    let mut rest = head.as_str();
    while let Some(at) = rest.find("<meta") {
        rest = &rest[at + 5..];
        let tag = &rest[..rest.find('>').unwrap_or(rest.len())];
        if let Some(at) = tag.find("charset") {
            let value = tag[at + 7..].trim_start();
            let Some(value) = value.strip_prefix('=') else { continue };
            let value = value.trim_start().trim_start_matches(['"', '\'']);
            let end = value
                .find(|c: char| c == '"' || c == '\'' || c == ';' || c == '/' || c.is_whitespace())
                .unwrap_or(value.len());
            let label = &value[..end];
            if !label.is_empty() {
                return Some(label.to_owned());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(content_type: &str, body: &[u8]) -> String {
        let url = Url::parse("https://example.org/").expect("a URL");
        Fetched {
            url: url.clone(),
            final_url: url,
            content_type: content_type.to_owned(),
            body: body.to_vec(),
            cut: false,
        }
        .decoded()
    }

    /// Pages in the encodings of the world are read as browsers read them: by the header,
    /// else by the page's `<meta>`, a BOM over both, UTF-8 when nothing says.
    #[test]
    fn pages_are_decoded_by_their_declared_charset() {
        let (sjis, _, _) = encoding_rs::SHIFT_JIS.encode("日本語のページ");
        assert_eq!(page("text/plain; charset=Shift_JIS", &sjis), "日本語のページ");
        let (cyrillic, _, _) = encoding_rs::WINDOWS_1251.encode("Привет");
        assert_eq!(page("text/plain; charset=\"windows-1251\"", &cyrillic), "Привет");
        // Latin-1 as browsers read it: windows-1252, whose 0x80 is the euro sign.
        assert_eq!(page("text/plain; charset=ISO-8859-1", b"caf\xe9 \x80"), "café €");
        let mut html = b"<html><head><meta charset=\"gbk\"><title>".to_vec();
        html.extend_from_slice(&encoding_rs::GBK.encode("中文").0);
        html.extend_from_slice(b"</title></head></html>");
        assert!(page("text/html", &html).contains("<title>中文</title>"));
        let mut old =
            b"<META HTTP-EQUIV=\"Content-Type\" CONTENT=\"text/html; charset=euc-kr\">".to_vec();
        old.extend_from_slice(&encoding_rs::EUC_KR.encode("한국어").0);
        assert!(page("text/html", &old).ends_with("한국어"));
        // The header wins over the page; a BOM over both.
        assert_eq!(
            page("text/html; charset=utf-8", "<meta charset=gbk>é".as_bytes()),
            "<meta charset=gbk>é"
        );
        assert_eq!(page("text/plain; charset=windows-1252", b"\xef\xbb\xbfcaf\xc3\xa9"), "café");
        // Nothing said, or an unknown label: UTF-8, invalid bytes replaced.
        assert_eq!(page("text/plain", b"ok \xff"), "ok \u{fffd}");
        assert_eq!(page("text/plain; charset=klingon", "é".as_bytes()), "é");
        // A `<meta>` charset only counts for HTML.
        assert_eq!(page("text/plain", b"<meta charset=gbk>"), "<meta charset=gbk>");
        // A `<meta>` naming UTF-16 means UTF-8, and x-user-defined windows-1252.
        assert_eq!(
            page("text/html", "<meta charset=utf-16>é".as_bytes()),
            "<meta charset=utf-16>é"
        );
        assert_eq!(
            page("text/html", b"<meta charset=x-user-defined>\x80"),
            "<meta charset=x-user-defined>€"
        );
    }

    #[test]
    fn only_public_addresses_are_public() {
        for public in ["93.184.215.14", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
        for local in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "198.18.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::808:808",
            "2001:db8::1",
            "::127.0.0.1",
        ] {
            assert!(!is_public(local.parse().unwrap()), "{local}");
        }
    }

    fn patterns(written: &[&str]) -> Vec<HostPattern> {
        let written: Vec<String> = written.iter().map(|p| (*p).to_owned()).collect();
        host_patterns(&written).expect("host patterns")
    }

    #[test]
    fn literal_addresses_and_schemes_are_checked() {
        let policy =
            Policy { allow_private: false, allowed_hosts: Vec::new(), denied_hosts: Vec::new() };
        let refused = |url: &str| policy.refuses(&Url::parse(url).unwrap());
        assert!(refused("http://127.0.0.1:8080/").unwrap().contains("allowPrivate"));
        assert!(refused("http://[::1]/").is_some());
        assert!(refused("http://0x7f000001/").is_some(), "hex IPv4 is parsed as 127.0.0.1");
        assert!(refused("file:///etc/passwd").unwrap().contains("only http and https"));
        assert!(refused("https://example.com/").is_none());
        let listed = Policy {
            allow_private: true,
            allowed_hosts: patterns(&["*.example.com"]),
            denied_hosts: patterns(&["bad.example.com"]),
        };
        let refused = |url: &str| listed.refuses(&Url::parse(url).unwrap());
        assert!(refused("https://docs.example.com/").is_none());
        assert!(refused("https://bad.example.com/").unwrap().contains("deniedHosts"));
        assert!(refused("https://example.org/").unwrap().contains("allowedHosts"));
        let metadata = Policy {
            allow_private: true,
            allowed_hosts: Vec::new(),
            denied_hosts: patterns(&["169.254.169.254"]),
        };
        let refused = |url: &str| metadata.refuses(&Url::parse(url).unwrap());
        assert!(refused("http://169.254.169.254/").unwrap().contains("deniedHosts"));
        assert!(refused("http://[::ffff:169.254.169.254]/").unwrap().contains("deniedHosts"));
        assert!(refused("http://[::ffff:a9fe:a9fe]/").unwrap().contains("deniedHosts"));
        assert!(refused("http://[64:ff9b::a9fe:a9fe]/").unwrap().contains("deniedHosts"));
    }

    #[test]
    fn host_patterns_in_unicode_match_their_ascii_form() {
        let fetcher = |allowed: &[&str], denied: &[&str]| {
            Fetcher::new(&FetchConfig {
                allowed_hosts: allowed.iter().map(|p| (*p).to_owned()).collect(),
                denied_hosts: denied.iter().map(|p| (*p).to_owned()).collect(),
                ..FetchConfig::default()
            })
            .unwrap()
        };
        let denied = fetcher(&[], &["bücher.de", "*.Straße.de"]);
        let refused = |url: &str| denied.policy.refuses(&Url::parse(url).unwrap());
        assert!(refused("https://bücher.de/x").unwrap().contains("deniedHosts"));
        assert!(refused("https://xn--bcher-kva.de/x").unwrap().contains("deniedHosts"));
        assert!(refused("https://www.straße.de/").unwrap().contains("deniedHosts"));
        assert!(refused("https://example.de/").is_none());
        let allowed = fetcher(&["bücher.de"], &[]);
        let refused = |url: &str| allowed.policy.refuses(&Url::parse(url).unwrap());
        assert!(refused("https://bücher.de/x").is_none());
        assert!(refused("https://example.de/").unwrap().contains("allowedHosts"));
        let bad = Fetcher::new(&FetchConfig {
            denied_hosts: vec!["a%zz.de".into()],
            ..FetchConfig::default()
        });
        assert!(bad.unwrap_err().contains("`a%zz.de`"));
    }

    /// A hop's `Referer` is the page it came from without user info and fragment, and
    /// none from https to http.
    #[test]
    fn a_hops_referer_keeps_no_credentials_and_no_downgrade() {
        let url = |u: &str| Url::parse(u).expect("a URL");
        let from = url("https://reader:secret@example.org/a?q=1#part");
        assert_eq!(
            referer_of(&url("https://example.net/b"), &from).as_deref(),
            Some("https://example.org/a?q=1")
        );
        assert_eq!(referer_of(&url("http://example.net/b"), &from), None);
        assert_eq!(
            referer_of(&url("https://example.org/b"), &url("http://example.org/a")).as_deref(),
            Some("http://example.org/a")
        );
    }

    /// A refusal lists `allowedHosts` as configured, not in the ASCII form the names are
    /// matched in, and names a refused host in both forms when they differ.
    #[test]
    fn refusals_name_hosts_as_they_were_written() {
        let fetcher = Fetcher::new(&FetchConfig {
            allowed_hosts: vec!["bücher.de".into(), "*.Straße.de".into(), "example.com".into()],
            denied_hosts: vec!["*.bücher.de".into()],
            ..FetchConfig::default()
        })
        .expect("a fetcher");
        let refused = |url: &str| fetcher.policy.refuses(&Url::parse(url).expect("a URL"));
        assert_eq!(
            refused("https://münchen.de/").as_deref(),
            Some(
                "host `münchen.de` (`xn--mnchen-3ya.de`) is not in `web.fetch.allowedHosts` \
                 (bücher.de, *.Straße.de, example.com)"
            )
        );
        assert_eq!(
            refused("https://example.org/").as_deref(),
            Some(
                "host `example.org` is not in `web.fetch.allowedHosts` (bücher.de, *.Straße.de, \
                 example.com)"
            )
        );
        assert_eq!(
            refused("https://www.xn--bcher-kva.de/").as_deref(),
            Some("host `www.bücher.de` (`www.xn--bcher-kva.de`) is in `web.fetch.deniedHosts`")
        );
    }
}
