//! A small Redis client: one RESP2 connection ([`Connection`]), a pool of a few of them
//! with a timeout on every command ([`RedisClient`]), Lua scripts run by their SHA, and
//! the health flag that logs an outage once instead of once per call.
//!
//! Why not the `redis` crate: toolmux needs a dozen commands, scripts and one pub/sub
//! connection; the crate brings its own runtime glue, TLS and cluster layers, and a
//! hundred-line client with a timeout on every command is easier to reason about under
//! the "never hang a call" rule.

use crate::config::{Endpoint, Settings};
use crate::resp::{self, ProtocolError, Reply};
use crate::{RedisConfig, RedisError};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A pool of connections to one Redis server. Connections are made when first needed and
/// remade after any failure; every command has a timeout. Cheap to clone.
#[derive(Clone)]
pub struct RedisClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    endpoint: Endpoint,
    timeout: Duration,
    /// How many connections commands may use at once.
    pool_size: usize,
    /// One permit per connection a command may use; a command waits for one first, in
    /// turn, and then has what is left of its timeout for the server.
    permits: tokio::sync::Semaphore,
    // Invariant: a connection is taken out of `idle` while a command uses it and put back
    // only after a whole reply was read, so a command cut by its timeout (its future
    // dropped mid-reply) never leaves a connection with a stray reply in it.
    idle: Mutex<Vec<Connection>>,
    /// Script SHA1s as the server reported them at `SCRIPT LOAD`, by script name.
    scripts: Mutex<HashMap<&'static str, String>>,
    health: Arc<Health>,
}

impl fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClient")
            .field("endpoint", &self.inner.endpoint)
            .field("timeout", &self.inner.timeout)
            .field("pool_size", &self.inner.pool_size)
            .finish_non_exhaustive()
    }
}

/// A Lua script run with `EVALSHA`, loaded on first use and again after the server forgot
/// it (a restart, `SCRIPT FLUSH`).
#[derive(Debug)]
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) source: &'static str,
}

impl RedisClient {
    /// A client of the server `config.url` names; nothing is connected yet. Fails only on
    /// a bad URL or setting.
    pub fn new(config: &RedisConfig) -> Result<RedisClient, RedisError> {
        let settings = Settings::new(config)?;
        Ok(RedisClient::from_settings(&settings, Arc::new(Health::new(&settings.endpoint))))
    }

    pub(crate) fn from_settings(settings: &Settings, health: Arc<Health>) -> RedisClient {
        RedisClient {
            inner: Arc::new(ClientInner {
                endpoint: settings.endpoint.clone(),
                timeout: settings.timeout,
                pool_size: settings.pool_size,
                permits: tokio::sync::Semaphore::new(settings.pool_size),
                idle: Mutex::new(Vec::with_capacity(settings.pool_size)),
                scripts: Mutex::new(HashMap::new()),
                health,
            }),
        }
    }

    /// The timeout of one command.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Whether a command the caller can do without should be skipped (the server is down).
    pub(crate) fn skip_optional(&self) -> bool {
        self.inner.health.skip_optional()
    }

    /// Runs one command (`["SET", "k", "v"]`) within the client's timeout. An error reply
    /// is [`RedisError::Server`].
    pub async fn command<A: AsRef<[u8]> + Sync>(&self, args: &[A]) -> Result<Reply, RedisError> {
        self.command_within(args, self.inner.timeout).await
    }

    /// Runs one command within `timeout` in all: waiting for a free connection of the pool,
    /// connecting if needed, and the server's answer share that one deadline. A command
    /// that found no free connection by then fails with [`RedisError::PoolBusy`], unsent;
    /// one that was sent and not answered by then, with [`RedisError::Timeout`].
    pub async fn command_within<A: AsRef<[u8]> + Sync>(
        &self,
        args: &[A],
        timeout: Duration,
    ) -> Result<Reply, RedisError> {
        let (result, queued) = self.run(args, timeout).await;
        // A busy pool says nothing of whether the server answers, nor does a command that
        // waited for a connection and then ran out of what was left of its time: a burst
        // is no outage (were the server hung, the commands holding the pool time out too).
        let says_nothing = match &result {
            Err(RedisError::PoolBusy { .. }) => true,
            Err(RedisError::Timeout { .. }) => queued,
            _ => false,
        };
        if !says_nothing {
            self.inner.health.observe(&result);
        }
        result
    }

    /// Checks that the server answers (`PING`).
    pub async fn ping(&self) -> Result<(), RedisError> {
        match self.command(&["PING"]).await? {
            Reply::Simple(s) if s == "PONG" => Ok(()),
            _ => Err(RedisError::Protocol {
                addr: self.inner.endpoint.addr(),
                command: "PING".into(),
                source: ProtocolError("expected PONG".into()),
            }),
        }
    }

    /// Runs one command, and tells whether it had to wait for a connection.
    async fn run<A: AsRef<[u8]> + Sync>(
        &self,
        args: &[A],
        timeout: Duration,
    ) -> (Result<Reply, RedisError>, bool) {
        let mut queued = false;
        let result = self.run_noting_wait(args, timeout, &mut queued).await;
        (result, queued)
    }

    async fn run_noting_wait<A: AsRef<[u8]> + Sync>(
        &self,
        args: &[A],
        timeout: Duration,
        queued: &mut bool,
    ) -> Result<Reply, RedisError> {
        let inner = &self.inner;
        let name = command_name(args);
        // One deadline for the wait for a connection and for the server: each had the
        // whole timeout, so a command could take twice as long as its caller allowed.
        let deadline = Instant::now() + timeout;
        let _permit = match inner.permits.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                *queued = true;
                match tokio::time::timeout_at(deadline, inner.permits.acquire()).await {
                    Ok(Ok(permit)) => permit,
                    // The semaphore is never closed; a timeout or a closed one alike: not
                    // sent.
                    Ok(Err(_)) | Err(_) => {
                        return Err(RedisError::PoolBusy {
                            addr: inner.endpoint.addr(),
                            command: name,
                            size: inner.pool_size,
                            waited_ms: timeout.as_millis() as u64,
                        });
                    }
                }
            }
        };
        let work = async {
            // A pooled connection the server closed while it sat idle (a restart, the
            // server's `timeout`, `CLIENT KILL`) would fail this command with "broke":
            // it is dropped here and a new one made instead.
            let pooled =
                std::iter::from_fn(|| self.lock_idle().pop()).find(Connection::is_idle_and_open);
            let mut conn = match pooled {
                Some(conn) => conn,
                None => Connection::open(&inner.endpoint).await?,
            };
            let reply =
                conn.request(args).await.map_err(|e| e.into_error(&inner.endpoint, &name))?;
            self.lock_idle().push(conn);
            Ok(reply)
        };
        let reply = match tokio::time::timeout_at(deadline, work).await {
            Ok(reply) => reply?,
            Err(_) => {
                return Err(RedisError::Timeout {
                    addr: inner.endpoint.addr(),
                    command: name,
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
        };
        match reply {
            Reply::Error(message) => Err(server_error(&inner.endpoint, name, message)),
            reply => Ok(reply),
        }
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.inner.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `script` with `keys` and `args` within `timeout` in all.
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        timeout: Duration,
    ) -> Result<Reply, RedisError> {
        let deadline = Instant::now() + timeout;
        let known = self.lock_scripts().get(script.name).cloned();
        if let Some(sha) = known {
            match self.evalsha(&sha, keys, args, deadline).await {
                Err(RedisError::Server { message, .. }) if message.starts_with("NOSCRIPT") => {}
                other => return other,
            }
        }
        let loaded =
            self.command_within(&["SCRIPT", "LOAD", script.source], left(deadline)).await?;
        let Some(sha) = loaded.as_str().map(str::to_owned) else {
            return Err(RedisError::Protocol {
                addr: self.inner.endpoint.addr(),
                command: "SCRIPT".into(),
                source: ProtocolError("SCRIPT LOAD did not answer with a SHA".into()),
            });
        };
        self.lock_scripts().insert(script.name, sha.clone());
        self.evalsha(&sha, keys, args, deadline).await
    }

    async fn evalsha(
        &self,
        sha: &str,
        keys: &[&str],
        args: &[&[u8]],
        deadline: Instant,
    ) -> Result<Reply, RedisError> {
        let count = keys.len().to_string();
        let mut command: Vec<&[u8]> = Vec::with_capacity(3 + keys.len() + args.len());
        command.extend([b"EVALSHA".as_slice(), sha.as_bytes(), count.as_bytes()]);
        command.extend(keys.iter().map(|k| k.as_bytes()));
        command.extend_from_slice(args);
        self.command_within(&command, left(deadline)).await
    }

    fn lock_scripts(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, String>> {
        self.inner.scripts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Time left until `deadline`, at least a millisecond (a zero timeout would fail a command
/// that the server would answer at once).
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

fn command_name<A: AsRef<[u8]>>(args: &[A]) -> String {
    args.first().map_or_else(String::new, |a| String::from_utf8_lossy(a.as_ref()).to_uppercase())
}

fn server_error(endpoint: &Endpoint, command: String, message: String) -> RedisError {
    if message.starts_with("NOAUTH") || message.starts_with("WRONGPASS") {
        RedisError::Auth { addr: endpoint.addr(), message }
    } else {
        RedisError::Server { command, message }
    }
}

/// Whether the server was reachable at the last command, so that an outage is logged when
/// it starts and when it ends, not at every call in between.
#[derive(Debug)]
pub(crate) struct Health {
    addr: String,
    down: AtomicBool,
    born: std::time::Instant,
    /// When an optional command last went out while the server was down, in milliseconds
    /// since `born`.
    probed_ms: AtomicU64,
}

/// While the server is down, optional commands go out at most this often.
const PROBE_EVERY: Duration = Duration::from_secs(1);

impl Health {
    pub(crate) fn new(endpoint: &Endpoint) -> Health {
        Health {
            addr: endpoint.addr(),
            down: AtomicBool::new(false),
            born: std::time::Instant::now(),
            probed_ms: AtomicU64::new(0),
        }
    }

    /// Whether to skip a command the caller can do without (a cache read or write): while
    /// the server is down, one such command a second finds out whether it is back, and
    /// the others do not each wait for their timeout.
    pub(crate) fn skip_optional(&self) -> bool {
        if !self.down.load(Ordering::Relaxed) {
            return false;
        }
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.probed_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < PROBE_EVERY.as_millis() as u64 {
            return true;
        }
        // One caller wins the probe; the others skip.
        self.probed_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
    }

    pub(crate) fn observe<T>(&self, result: &Result<T, RedisError>) {
        match result {
            Err(e) if e.is_unreachable() => {
                if !self.down.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        target: "toolmux::redis",
                        "{}; queue slots, cached outputs and external results that live in redis \
                         are unavailable until it answers again",
                        toolmux_core::error_report(e)
                    );
                }
            }
            _ => {
                if self.down.swap(false, Ordering::Relaxed) {
                    tracing::info!(target: "toolmux::redis", "redis at {} answers again", self.addr);
                }
            }
        }
    }
}

/// One connection speaking RESP2, logged in and on the configured database.
pub(crate) struct Connection {
    stream: TcpStream,
    /// Bytes read and not yet parsed.
    buf: Vec<u8>,
    /// How far the first reply of `buf` is known to be whole.
    scanner: resp::Scanner,
    out: Vec<u8>,
}

/// What can break on a connection once it is open.
#[derive(Debug)]
pub(crate) enum ConnectionError {
    Io(io::Error),
    Protocol(ProtocolError),
}

impl ConnectionError {
    pub(crate) fn into_error(self, endpoint: &Endpoint, command: &str) -> RedisError {
        match self {
            ConnectionError::Io(source) => RedisError::Io { addr: endpoint.addr(), source },
            ConnectionError::Protocol(source) => {
                RedisError::Protocol { addr: endpoint.addr(), command: command.to_owned(), source }
            }
        }
    }
}

impl Connection {
    /// Connects, then `AUTH` and `SELECT` as the endpoint says.
    pub(crate) async fn open(endpoint: &Endpoint) -> Result<Connection, RedisError> {
        let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
            .await
            .map_err(|source| RedisError::Connect { addr: endpoint.addr(), source })?;
        // Commands are small request/reply pairs: waiting to fill a segment only adds delay.
        stream
            .set_nodelay(true)
            .map_err(|source| RedisError::Connect { addr: endpoint.addr(), source })?;
        let mut conn = Connection {
            stream,
            buf: Vec::new(),
            scanner: resp::Scanner::default(),
            out: Vec::new(),
        };
        if let Some(password) = &endpoint.password {
            let mut auth: Vec<&str> = vec!["AUTH"];
            auth.extend(endpoint.username.as_deref());
            auth.push(password);
            let reply = conn.request(&auth).await.map_err(|e| e.into_error(endpoint, "AUTH"))?;
            if let Reply::Error(message) = reply {
                return Err(RedisError::Auth { addr: endpoint.addr(), message });
            }
        }
        if endpoint.db != 0 {
            let db = endpoint.db.to_string();
            let reply = conn
                .request(&["SELECT", &db])
                .await
                .map_err(|e| e.into_error(endpoint, "SELECT"))?;
            if let Reply::Error(message) = reply {
                return Err(server_error(endpoint, "SELECT".into(), message));
            }
        }
        Ok(conn)
    }

    /// Whether a connection between commands can take the next one: the server has not
    /// closed it and sent nothing unasked (an idle connection has nothing to read). Looks
    /// without waiting, at what the runtime already knows of the socket.
    pub(crate) fn is_idle_and_open(&self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut byte = [0u8; 1];
        matches!(self.stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Sends one command and reads its reply.
    pub(crate) async fn request<A: AsRef<[u8]>>(
        &mut self,
        args: &[A],
    ) -> Result<Reply, ConnectionError> {
        self.send(args).await?;
        self.read_reply().await
    }

    /// Sends one command without waiting for a reply (pub/sub).
    pub(crate) async fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<(), ConnectionError> {
        self.out.clear();
        resp::encode(args, &mut self.out);
        self.stream.write_all(&self.out).await.map_err(ConnectionError::Io)
    }

    /// Reads the next reply. Cancel-safe: bytes read before a cancellation stay in the
    /// buffer for the next call, and the scanner where it got in them.
    pub(crate) async fn read_reply(&mut self) -> Result<Reply, ConnectionError> {
        loop {
            if !self.buf.is_empty() {
                // Parsed once whole, so that a reply that takes many reads is not parsed
                // again from its start after each.
                let scanned = self.scanner.scan(&self.buf);
                if let Some(len) = scanned.map_err(ConnectionError::Protocol)? {
                    self.scanner.reset();
                    let parsed =
                        resp::parse(&self.buf[..len]).map_err(ConnectionError::Protocol)?;
                    let Some((reply, used)) = parsed else {
                        return Err(ConnectionError::Protocol(ProtocolError(
                            "a reply scanned as whole did not parse as one".into(),
                        )));
                    };
                    self.buf.drain(..used);
                    return Ok(reply);
                }
            }
            // Room for a large read: `read_buf` on a full Vec would grow it 64 bytes at a time.
            self.buf.reserve(64 * 1024);
            let n = self.stream.read_buf(&mut self.buf).await.map_err(ConnectionError::Io)?;
            if n == 0 {
                return Err(ConnectionError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolmux_test_support::redis::RedisServer;

    /// A command that waited for the pool's one connection and then ran out of what was
    /// left of its timeout at the server is no outage: the server answers (the command
    /// holding the connection is answered), and taking it for down would skip the cache
    /// and log an outage at every burst.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_that_ran_out_of_time_after_waiting_for_the_pool_is_no_outage() {
        let server = RedisServer::start();
        let client =
            RedisClient::new(&RedisConfig::new(server.url()).with_pool_size(1)).expect("valid url");
        let holder = client.clone();
        let held = tokio::spawn(async move {
            holder.command_within(&["BLPOP", "nothing", "0.6"], Duration::from_secs(10)).await
        });
        // Until the holder has the connection.
        while client.inner.permits.available_permits() != 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let reply = client.command_within(&["BLPOP", "other", "0.8"], Duration::from_secs(1));
        let error = reply.await.expect_err("past its timeout");
        assert!(matches!(error, RedisError::Timeout { .. }), "{error:?}");
        assert!(!client.inner.health.down.load(Ordering::Relaxed), "taken for an outage");
        assert_eq!(held.await.expect("task").expect("blpop"), Reply::Nil);
        // A command that had its connection at once and timed out is one.
        let error = client.command_within(&["BLPOP", "other", "0.5"], Duration::from_millis(100));
        assert!(matches!(error.await, Err(RedisError::Timeout { .. })));
        assert!(client.inner.health.down.load(Ordering::Relaxed), "a timeout at the server");
    }
}
