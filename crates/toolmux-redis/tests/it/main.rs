//! Tests of the Redis backends against a real `redis-server` (started per test on a free
//! port by `toolmux_test_support::redis::RedisServer`; `.ci/install-peers` installs it).
//! Two `RedisBackend`s on one server stand for two replicas.

mod cache;
mod client;
mod orchestrator;
mod outage;
mod pending;
mod queue;
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
