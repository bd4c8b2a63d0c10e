//! [`RedisConfig`], the `backend.redis` section of a configuration file, and the parsed
//! URL it points at.

use crate::RedisError;
use crate::cache::{DEFAULT_LEAD_LEASE, MIN_LEAD_LEASE};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// Key prefix when none is configured.
pub const DEFAULT_PREFIX: &str = "toolmux";

/// How long a queue slot's lease lasts when not renewed, by default.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How long one command may take, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// How many connections a backend's commands use at once, by default: a few suffice, as
/// every command is short and scripts do the multi-step work on the server.
pub const DEFAULT_POOL_SIZE: usize = 4;

/// The most connections a pool may have.
const MAX_POOL_SIZE: usize = 256;

/// The longest time to live given to Redis: a hundred years. Longer ones (a
/// configuration's way of saying "never", up to `u64::MAX` milliseconds) are cut to it, as
/// Redis refuses an expiry past its integers and its scripts count in doubles.
pub(crate) const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The instant `wait` from now, or [`FOREVER`] from now when that is past the clock's end
/// (`Instant + Duration::MAX` panics).
pub(crate) fn deadline_after(wait: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(wait).unwrap_or(now + FOREVER)
}

/// Where a Redis server is and how toolmux uses it; `backend: {redis: {...}}` in the
/// configuration file.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[:password@|user:password@]host[:port][/db]` (port 6379 and database 0 by
    /// default). Keep the password out of the file with a variable,
    /// `redis://:${REDIS_PASSWORD}@host`; `@`, `:` and `/` in it must be %-encoded.
    pub url: String,
    /// Prefix of every key and channel (default `toolmux`); replicas that share state use
    /// the same one, unrelated deployments on one server different ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// How long a queue slot stays taken after its replica stops renewing it (crashed,
    /// cut off), in milliseconds (default 30000, at least 100). Held slots are renewed every
    /// third of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// How long one Redis command may take in all, its wait for a pooled connection
    /// included, in milliseconds (default 2000, at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// How many connections a backend's commands use at once (default
    /// [`DEFAULT_POOL_SIZE`], from 1 to 256). A command first waits for a free one and then
    /// has what is left of its timeout for the server (one deadline for both). Raise it
    /// when many calls queue or wait on Redis at once and commands fail saying the pool
    /// was busy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<usize>,
    /// How long a replica's lead of a cached call lasts after it stops renewing it
    /// (crashed, cut off from Redis), in milliseconds (default 10000, at least 100): the
    /// other replicas' identical calls wait that long at most for its output (within their
    /// own deadlines) before one of them runs the call. Held leads are renewed every third
    /// of it while their call runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead_lease_ms: Option<u64>,
    /// Where the other replicas reach this one (`http://10.0.0.5:8765`, no path), for
    /// the MCP sessions of streamable HTTP it holds: a replica given a request of a session
    /// another made forwards it to the URL that replica recorded under the prefix. By
    /// default `http://` and the `--http` address, when that is not a wildcard (`0.0.0.0`,
    /// `::`); with a wildcard and no URL, requests are not forwarded (sessions then stay
    /// with the replica that made them, as without Redis).
    ///
    /// The replicas also share, through Redis, the key they seal the stateless revision's
    /// `requestState` with (under `{prefix}:mcp:seal-key`, set by the first replica to
    /// start), so that a multi-round request's next round may reach any of them; with a
    /// wildcard and no URL too, since the key needs no address. `serve --http` reads that key when it starts
    /// and refuses to start when Redis does not give it within 10 s (sooner when a
    /// command fails, after `timeoutMs`), saying to check the backend; without `--http`,
    /// a Redis that does not answer at start is only a warning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise_url: Option<String>,
}

impl RedisConfig {
    /// A configuration for `url` with every other setting at its default.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            prefix: None,
            lease_ms: None,
            timeout_ms: None,
            pool_size: None,
            lead_lease_ms: None,
            advertise_url: None,
        }
    }

    /// Sets the key prefix.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Sets the lease of queue slots.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease_ms = Some(lease.as_millis() as u64);
        self
    }

    /// Sets the timeout of one command.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(timeout.as_millis() as u64);
        self
    }

    /// Sets how many connections the backend's commands use at once.
    pub fn with_pool_size(mut self, size: usize) -> Self {
        self.pool_size = Some(size);
        self
    }

    /// Sets where the other replicas reach this one (see [`RedisConfig::advertise_url`]).
    pub fn with_advertise_url(mut self, url: impl Into<String>) -> Self {
        self.advertise_url = Some(url.into());
        self
    }

    /// Sets how long the response cache's lead of a call lasts when not renewed.
    pub fn with_lead_lease(mut self, lease: Duration) -> Self {
        self.lead_lease_ms = Some(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
        self
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("prefix", &self.prefix)
            .field("lease_ms", &self.lease_ms)
            .field("timeout_ms", &self.timeout_ms)
            .field("pool_size", &self.pool_size)
            .field("lead_lease_ms", &self.lead_lease_ms)
            .field("advertise_url", &self.advertise_url)
            .finish()
    }
}

/// The settings of a [`RedisConfig`], checked and with defaults filled in.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) endpoint: Endpoint,
    pub(crate) prefix: String,
    pub(crate) lease: Duration,
    pub(crate) timeout: Duration,
    pub(crate) pool_size: usize,
    /// Invariant: from [`MIN_LEAD_LEASE`] to [`FOREVER`].
    pub(crate) lead_lease: Duration,
}

impl Settings {
    pub(crate) fn new(config: &RedisConfig) -> Result<Settings, RedisError> {
        let endpoint = Endpoint::parse(&config.url)?;
        let prefix = config.prefix.clone().unwrap_or_else(|| DEFAULT_PREFIX.to_owned());
        if prefix.is_empty() || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(RedisError::Setting {
                key: "prefix",
                reason: "must be non-empty, without spaces or control characters".into(),
            });
        }
        let lease = config.lease_ms.map_or(DEFAULT_LEASE, Duration::from_millis);
        if lease < Duration::from_millis(100) {
            return Err(RedisError::Setting {
                key: "leaseMs",
                reason: "must be at least 100 (slots are renewed every third of it)".into(),
            });
        }
        let timeout = config.timeout_ms.map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        if timeout.is_zero() {
            return Err(RedisError::Setting {
                key: "timeoutMs",
                reason: "must be at least 1".into(),
            });
        }
        let pool_size = config.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
        if !(1..=MAX_POOL_SIZE).contains(&pool_size) {
            return Err(RedisError::Setting {
                key: "poolSize",
                reason: format!("must be from 1 to {MAX_POOL_SIZE}"),
            });
        }
        let lead_lease = config.lead_lease_ms.map_or(DEFAULT_LEAD_LEASE, Duration::from_millis);
        if lead_lease < MIN_LEAD_LEASE {
            return Err(RedisError::Setting {
                key: "leadLeaseMs",
                reason: format!(
                    "must be at least {} (a lead is renewed every third of it)",
                    MIN_LEAD_LEASE.as_millis()
                ),
            });
        }
        // Longer ones say "never": held to what Redis takes.
        let lead_lease = lead_lease.min(FOREVER);
        if let Some(url) = &config.advertise_url {
            check_advertise_url(url)?;
        }
        Ok(Settings { endpoint, prefix, lease, timeout, pool_size, lead_lease })
    }
}

/// Checks `backend.redis.advertiseUrl`: `http://host[:port]`, the origin other replicas
/// send requests to (a path would be dropped, credentials would be sent to every replica).
fn check_advertise_url(url: &str) -> Result<(), RedisError> {
    let invalid = |why: &str| RedisError::Setting {
        key: "advertiseUrl",
        reason: format!(
            "`{url}` {why}; give where the other replicas reach this one, such as `http://10.0.0.5:8765`"
        ),
    };
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return Err(invalid("must start with `http://` or `https://`"));
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err(invalid("names no host"));
    }
    if authority.contains(['/', '?', '#']) {
        return Err(invalid("must have no path (`/mcp` is added)"));
    }
    if authority.contains('@') || authority.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("must be a bare origin, without credentials or spaces"));
    }
    Ok(())
}

/// Where to connect and how to log in; parsed from a URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) username: Option<String>,
    // Invariant: never formatted; Debug shows `***` in its place.
    pub(crate) password: Option<String>,
    pub(crate) db: u32,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

impl Endpoint {
    /// `host:port`, for messages.
    pub(crate) fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    pub(crate) fn parse(url: &str) -> Result<Endpoint, RedisError> {
        let invalid =
            |reason: &str| RedisError::Url { url: redact_url(url), reason: reason.into() };
        let rest = match url.split_once("://") {
            Some(("redis", rest)) => rest,
            Some(("rediss", _)) => return Err(invalid("TLS (`rediss://`) is not supported")),
            _ => return Err(invalid("must start with `redis://`")),
        };
        // The last `@` ends the user part, so that a password with `@` or `/` that was not
        // %-encoded still parses (and, above all, is still hidden in messages).
        let (userinfo, rest) = match rest.rfind('@') {
            Some(i) => (Some(&rest[..i]), &rest[i + 1..]),
            None => (None, rest),
        };
        let (hostport, path) = match rest.find(['/', '?', '#']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    // `redis://secret@host` is how some clients spell a password alone.
                    None => ("", Some(info)),
                };
                let user = decode(user).ok_or_else(|| invalid("bad %-escape in the user name"))?;
                let password = password
                    .map(|p| decode(p).ok_or_else(|| invalid("bad %-escape in the password")))
                    .transpose()?;
                ((!user.is_empty()).then_some(user), password.filter(|p| !p.is_empty()))
            }
        };
        let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
            let Some((host, after)) = bracketed.split_once(']') else {
                return Err(invalid("unclosed `[` in the host"));
            };
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(invalid("expected `:port` after `]`")),
                },
            }
        } else {
            match hostport.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(invalid("no host"));
        }
        let port = match port {
            None => 6379,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| invalid("the port must be a number from 1 to 65535"))?,
        };
        let db = match path.split(['?', '#']).next().unwrap_or("").trim_start_matches('/') {
            "" => 0,
            db => db.parse::<u32>().map_err(|_| invalid("the database must be a number"))?,
        };
        if path.contains('?') {
            return Err(invalid("query parameters are not supported"));
        }
        Ok(Endpoint { host: host.to_owned(), port, username, password, db })
    }
}

/// `url` with the password (everything between the first `:` and the last `@` after the
/// scheme) replaced by `***`; for messages and Debug.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        // Not a URL: it might still be a secret someone pasted, so show nothing of it.
        return "***".to_owned();
    };
    let rest = &url[scheme_end..];
    let Some(at) = rest.rfind('@') else { return url.to_owned() };
    let user = match rest[..at].split_once(':') {
        Some((user, _)) if !user.contains(['/', '?', '#']) => format!("{user}:***"),
        _ => "***".to_owned(),
    };
    format!("{}{user}@{}", &url[..scheme_end], &rest[at + 1..])
}

/// Percent-decodes `s`; `None` on a bad escape or bytes that are not UTF-8.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> String {
        match Endpoint::parse(url) {
            Ok(e) => format!("{e:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn urls() {
        let cases = [
            (
                "redis://localhost",
                "Endpoint { host: \"localhost\", port: 6379, username: None, password: None, db: 0 }",
            ),
            (
                "redis://127.0.0.1:7000/3",
                "Endpoint { host: \"127.0.0.1\", port: 7000, username: None, password: None, db: 3 }",
            ),
            (
                "redis://:s3cret@h:1",
                "Endpoint { host: \"h\", port: 1, username: None, password: Some(\"***\"), db: 0 }",
            ),
            (
                "redis://u:p%40ss@h/2",
                "Endpoint { host: \"h\", port: 6379, username: Some(\"u\"), password: Some(\"***\"), db: 2 }",
            ),
            (
                "redis://[::1]:6380",
                "Endpoint { host: \"::1\", port: 6380, username: None, password: None, db: 0 }",
            ),
            ("http://h", "invalid redis url `http://h`: must start with `redis://`"),
            (
                "rediss://:pw@h",
                "invalid redis url `rediss://:***@h`: TLS (`rediss://`) is not supported",
            ),
            (
                "redis://:pw@h:x",
                "invalid redis url `redis://:***@h:x`: the port must be a number from 1 to 65535",
            ),
            (
                "redis://u:pw@h/db",
                "invalid redis url `redis://u:***@h/db`: the database must be a number",
            ),
            ("redis://:pw@", "invalid redis url `redis://:***@`: no host"),
            ("redis:pw@h", "invalid redis url `***`: must start with `redis://`"),
            (
                "redis://:p/w@ss@h:x",
                "invalid redis url `redis://:***@h:x`: the port must be a number from 1 to 65535",
            ),
            (
                "redis://:p/w@ss@h/1",
                "Endpoint { host: \"h\", port: 6379, username: None, password: Some(\"***\"), db: 1 }",
            ),
        ];
        for (url, expected) in cases {
            assert_eq!(parse(url), expected, "{url}");
        }
        let e = Endpoint::parse("redis://u:p%40ss@h").unwrap();
        assert_eq!(e.password.as_deref(), Some("p@ss"));
        let e = Endpoint::parse("redis://:p/w@ss@h/1").unwrap();
        assert_eq!(e.password.as_deref(), Some("p/w@ss"));
    }

    #[test]
    fn debug_hides_the_password() {
        let config = RedisConfig::new("redis://admin:hunter2@h:1/0");
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redis://admin:***@h:1/0"), "{shown}");
    }

    /// The pool's size is read from the file as `poolSize`.
    #[test]
    fn the_pool_size_is_read_from_the_file() {
        let file = r#"{"url": "redis://h", "poolSize": 9}"#;
        let config = serde_json::from_str::<RedisConfig>(file).unwrap();
        assert_eq!(config.pool_size, Some(9));
        assert_eq!(Settings::new(&config).unwrap().pool_size, 9);
        let schema = serde_json::to_string(&schemars::schema_for!(RedisConfig)).unwrap();
        assert!(schema.contains("poolSize"), "{schema}");
    }

    /// The response cache's lead lease is read from the file as `leadLeaseMs`, checked, and
    /// the backend's cache gets it (its use is tested against a server in `tests/it`).
    #[test]
    fn the_lead_lease_is_read_from_the_file() {
        let file = r#"{"url": "redis://h", "leadLeaseMs": 2500}"#;
        let config = serde_json::from_str::<RedisConfig>(file).unwrap();
        assert_eq!(config.lead_lease_ms, Some(2500));
        assert_eq!(Settings::new(&config).unwrap().lead_lease, Duration::from_millis(2500));
        let backend = crate::RedisBackend::new(&config).unwrap();
        assert_eq!(backend.cache().lead_lease(), Duration::from_millis(2500));
        let default = Settings::new(&RedisConfig::new("redis://h")).unwrap();
        assert_eq!(default.lead_lease, DEFAULT_LEAD_LEASE);
        let never = RedisConfig::new("redis://h").with_lead_lease(Duration::MAX);
        assert_eq!(Settings::new(&never).unwrap().lead_lease, FOREVER);
        let schema = serde_json::to_string(&schemars::schema_for!(RedisConfig)).unwrap();
        assert!(schema.contains("leadLeaseMs"), "{schema}");

        let bad = r#"{"url": "redis://h", "leadLeaseMs": 50}"#;
        let bad = serde_json::from_str::<RedisConfig>(bad).unwrap();
        assert_eq!(
            crate::RedisBackend::new(&bad).unwrap_err().to_string(),
            "invalid redis setting `leadLeaseMs`: must be at least 100 (a lead is renewed every third of it)"
        );
        let typo = r#"{"url": "redis://h", "leadLease": 5000}"#;
        let typo = serde_json::from_str::<RedisConfig>(typo).unwrap_err().to_string();
        assert!(typo.contains("leadLeaseMs"), "{typo}");
    }

    #[test]
    fn settings_are_checked() {
        let bad = RedisConfig::new("redis://h").with_lease(Duration::from_millis(10));
        assert_eq!(
            Settings::new(&bad).unwrap_err().to_string(),
            "invalid redis setting `leaseMs`: must be at least 100 (slots are renewed every third of it)"
        );
        let s = Settings::new(&RedisConfig::new("redis://h")).unwrap();
        assert_eq!(
            (s.prefix.as_str(), s.lease, s.timeout),
            ("toolmux", DEFAULT_LEASE, DEFAULT_TIMEOUT)
        );
    }
}
