//! Tests of the Redis backends against a real `redis-server` (started per test on a free
//! port by `toolmux_test_support::redis::RedisServer`; `.ci/install-peers` installs it).
//! Two `RedisBackend`s on one server stand for two replicas.

mod cache;
mod client;
mod lead;
mod orchestrator;
mod outage;
mod pending;
mod queue;
mod sessions;
mod shared;
mod spaces;

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use toolmux_redis::{RedisBackend, RedisConfig};
use toolmux_test_support::redis::RedisServer;

/// A backend ("replica") on `server` with default settings.
pub fn replica(server: &RedisServer) -> RedisBackend {
    RedisBackend::new(&RedisConfig::new(server.url())).expect("valid url")
}

/// How many connections of all replicas listen on `channel`: a waiter in another replica
/// is known to be waiting once it has subscribed.
pub async fn listeners(backend: &RedisBackend, channel: &str) -> i64 {
    let reply = backend.client().command(&["PUBSUB", "NUMSUB", channel]).await.expect("numsub");
    reply.as_array().and_then(|r| r.get(1)).and_then(|n| n.as_i64()).unwrap_or(0)
}

/// Runs `future`, failing the test if it takes longer than `limit` (nothing may hang).
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    let started = Instant::now();
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} took longer than {limit:?} (started {:?} ago)", started.elapsed()),
    }
}

/// Starts a loopback proxy to `server`: each connection it accepts is joined to a new one
/// to the server, and `relay` is given both (their read and write halves) to pass the bytes
/// on as the test wants. The proxy's port.
pub async fn proxy_to<R>(server: &RedisServer, relay: R) -> u16
where
    R: Fn(ConnectionHalves, ConnectionHalves) + Send + 'static,
{
    let listener =
        tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a loopback port");
    let port = listener.local_addr().expect("bound").port();
    let target = server.port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(upstream) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                continue;
            };
            relay(client.into_split(), upstream.into_split());
        }
    });
    port
}

/// The read and write halves of one of a proxy's connections.
pub type ConnectionHalves = (tokio::net::tcp::OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf);

/// A loopback proxy to `server` that, once armed, closes the client's connection instead
/// of passing on the next reply (a command that ran whose answer was lost), or holds that
/// reply back and the connection open (a command that ran whose answer is slow to come).
#[derive(Debug)]
pub struct CuttingProxy {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl CuttingProxy {
    pub async fn start(server: &RedisServer) -> CuttingProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let held = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (cut, hold) = (armed.clone(), held.clone());
        let relay = move |client: ConnectionHalves, upstream: ConnectionHalves| {
            let ((mut client_read, mut client_write), (mut upstream_read, mut upstream_write)) =
                (client, upstream);
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_read, &mut upstream_write).await;
            });
            let (cut, hold) = (cut.clone(), hold.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match upstream_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if cut.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        // Dropping the write half closes the client's side.
                        return;
                    }
                    if hold.swap(false, std::sync::atomic::Ordering::SeqCst) {
                        // The reply never comes; the connection stays open until the
                        // client closes it.
                        let mut rest = Vec::new();
                        let _ = upstream_read.read_to_end(&mut rest).await;
                        drop(client_write);
                        return;
                    }
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        };
        let port = proxy_to(server, relay).await;
        CuttingProxy { port, armed, held }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn cut_next_reply(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn hold_next_reply(&self) {
        self.held.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
