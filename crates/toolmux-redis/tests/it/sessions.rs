//! `RedisSessionOwners`: which replica holds an MCP session, seen by all of them.

use crate::{replica, within};
use std::time::Duration;
use toolmux_redis::{RedisBackend, RedisConfig};
use toolmux_test_support::redis::RedisServer;

#[tokio::test]
async fn a_session_claimed_by_one_replica_is_found_by_another_until_released_or_expired() {
    let server = RedisServer::start();
    let (a, b) = (replica(&server).session_owners(), replica(&server).session_owners());
    let limit = Duration::from_secs(10);
    within(limit, "claim", a.claim("s1", "http://127.0.0.1:1", Duration::from_secs(60)))
        .await
        .expect("claimed");
    let owner = within(limit, "owner", b.owner("s1")).await.expect("looked up");
    assert_eq!(owner.as_deref(), Some("http://127.0.0.1:1"));
    assert_eq!(within(limit, "owner", b.owner("s2")).await.expect("looked up"), None);

    // Only the record naming the replica that releases it is removed.
    assert!(!within(limit, "release", b.release("s1", "http://127.0.0.1:2")).await.expect("ran"));
    assert!(within(limit, "owner", b.owner("s1")).await.expect("looked up").is_some());
    assert!(within(limit, "release", b.release("s1", "http://127.0.0.1:1")).await.expect("ran"));
    assert_eq!(within(limit, "owner", a.owner("s1")).await.expect("looked up"), None);

    // A record not renewed ends with its time to live.
    a.claim("s3", "http://127.0.0.1:1", Duration::from_millis(200)).await.expect("claimed");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(b.owner("s3").await.expect("looked up"), None);

    // Keys are under the backend's prefix: another deployment on the server sees none.
    a.claim("s4", "http://127.0.0.1:1", Duration::from_secs(60)).await.expect("claimed");
    let other = RedisBackend::new(&RedisConfig::new(server.url()).with_prefix("other"))
        .expect("valid")
        .session_owners();
    assert_eq!(other.owner("s4").await.expect("looked up"), None);
    let keys = replica(&server).client().command(&["EXISTS", "toolmux:session:s4"]).await;
    assert_eq!(keys.expect("exists").as_i64(), Some(1));
}

#[test]
fn an_advertised_url_is_a_bare_origin() {
    let config = |url: &str| RedisConfig::new("redis://127.0.0.1").with_advertise_url(url);
    assert!(RedisBackend::new(&config("http://10.0.0.5:8765")).is_ok());
    assert!(RedisBackend::new(&config("https://tools.lan/")).is_ok());
    for bad in ["10.0.0.5:8765", "http://h/mcp", "http://u:p@h", "http://"] {
        let error = RedisBackend::new(&config(bad)).expect_err(bad);
        let said = toolmux_core::error_report(&error);
        assert!(said.contains("advertiseUrl") && said.contains("http://10.0.0.5:8765"), "{said}");
    }
}
