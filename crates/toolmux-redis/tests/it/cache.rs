//! The response cache shared by two replicas: hits across them, expiry, the size cap.

use crate::replica;
use serde_json::json;
use std::time::Duration;
use toolmux_core::ToolOutput;
use toolmux_orchestrator::cache::{ResponseCache, cache_key};
use toolmux_test_support::eventually;
use toolmux_test_support::redis::RedisServer;

#[tokio::test]
async fn an_output_put_by_one_replica_is_a_hit_in_the_other() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).cache(), replica(&server).cache());
    let key = cache_key("github__search", &json!({"q": "toolmux", "page": 1}));
    let output = ToolOutput::json(json!({"items": [1, 2]}))
        .with_structured(json!({"n": 2}))
        .with_extra("status", json!(200));
    assert_eq!(b.get(&key).await, None);
    a.put(&key, &output, Duration::from_secs(60)).await;
    assert_eq!(b.get(&key).await, Some(output));
    let other = cache_key("github__search", &json!({"q": "toolmux", "page": 2}));
    assert_eq!(b.get(&other).await, None);
}

#[tokio::test]
async fn entries_expire_after_their_ttl() {
    let server = RedisServer::start();
    let cache = replica(&server).cache();
    cache.put("t\u{0}{}", &ToolOutput::text("soon gone"), Duration::from_millis(150)).await;
    assert!(cache.get("t\u{0}{}").await.is_some());
    eventually("the entry expired", || async { cache.get("t\u{0}{}").await.is_none() }).await;
    let ttl = replica(&server).client().command(&["KEYS", "toolmux:c:*"]).await.unwrap();
    assert_eq!(ttl.as_array().map(<[_]>::len), Some(0), "the key is gone from redis too");
}

#[tokio::test]
async fn oversized_outputs_are_not_cached() {
    let server = RedisServer::start();
    let cache = replica(&server).cache().with_max_value_bytes(1_000);
    cache.put("t\u{0}1", &ToolOutput::text("x".repeat(2_000)), Duration::from_secs(60)).await;
    assert_eq!(cache.get("t\u{0}1").await, None);
    cache.put("t\u{0}2", &ToolOutput::text("x".repeat(500)), Duration::from_secs(60)).await;
    assert!(cache.get("t\u{0}2").await.is_some());
}

/// A cached output whose time to live is past counting is kept: Redis refused its expiry,
/// and it was never cached.
#[tokio::test]
async fn outputs_cached_for_good_are_kept() {
    let server = RedisServer::start();
    let cache = replica(&server).cache();
    let output = ToolOutput::text("v");
    cache.put("t\u{0}{}", &output, Duration::from_millis(u64::MAX)).await;
    assert_eq!(cache.get("t\u{0}{}").await, Some(output));
}
