//! The RESP client against a real server: round trips of every reply type, server errors,
//! AUTH and SELECT, and a password that never shows in an error.

use toolmux_redis::resp::Reply;
use toolmux_redis::{RedisBackend, RedisClient, RedisConfig, RedisError};
use toolmux_test_support::redis::RedisServer;

#[tokio::test]
async fn every_reply_type_round_trips() {
    let server = RedisServer::start();
    let client = RedisClient::new(&RedisConfig::new(server.url())).unwrap();
    client.ping().await.unwrap();
    let value = b"line one\r\nline two\0\xff".as_slice();
    assert_eq!(
        client.command(&[b"SET".as_slice(), b"k", value]).await.unwrap(),
        Reply::Simple("OK".into())
    );
    assert_eq!(
        client.command(&[b"GET".as_slice(), b"k"]).await.unwrap(),
        Reply::Bulk(value.to_vec())
    );
    assert_eq!(client.command(&["GET", "missing"]).await.unwrap(), Reply::Nil);
    assert_eq!(client.command(&["INCRBY", "n", "-5"]).await.unwrap(), Reply::Integer(-5));
    client.command(&["RPUSH", "l", "a", "", "c"]).await.unwrap();
    assert_eq!(
        client.command(&["LRANGE", "l", "0", "-1"]).await.unwrap(),
        Reply::Array(vec![
            Reply::Bulk(b"a".to_vec()),
            Reply::Bulk(Vec::new()),
            Reply::Bulk(b"c".to_vec())
        ])
    );
    assert_eq!(
        client.command(&["MGET", "k", "missing"]).await.unwrap(),
        Reply::Array(vec![Reply::Bulk(value.to_vec()), Reply::Nil])
    );
    let big = vec![b'x'; 3 * 1024 * 1024 + 7];
    client.command(&[b"SET".as_slice(), b"big", &big]).await.unwrap();
    assert_eq!(client.command(&["GET", "big"]).await.unwrap(), Reply::Bulk(big));
}

#[tokio::test]
async fn server_errors_are_errors_and_the_connection_goes_on() {
    let server = RedisServer::start();
    let client = RedisClient::new(&RedisConfig::new(server.url())).unwrap();
    client.command(&["SET", "s", "text"]).await.unwrap();
    let error = client.command(&["LPUSH", "s", "x"]).await.unwrap_err();
    assert!(
        matches!(&error, RedisError::Server { command, message } if command == "LPUSH" && message.starts_with("WRONGTYPE")),
        "{error:?}"
    );
    assert!(error.to_string().starts_with("redis refused `LPUSH`: WRONGTYPE"), "{error}");
    let error = client.command(&["NOSUCHCOMMAND"]).await.unwrap_err();
    assert!(
        error.to_string().starts_with("redis refused `NOSUCHCOMMAND`: ERR unknown command"),
        "{error}"
    );
    // Every connection of the pool still answers in order after the errors.
    for i in 0..10 {
        let key = format!("k{i}");
        client.command(&["SET", &key, &key]).await.unwrap();
        assert_eq!(client.command(&["GET", &key]).await.unwrap().as_str(), Some(key.as_str()));
    }
}

#[tokio::test]
async fn passwords_log_in_and_never_show() {
    let server = RedisServer::start_with_password("correct-horse");
    let right = RedisClient::new(&RedisConfig::new(server.url())).unwrap();
    right.ping().await.unwrap();
    right.command(&["SET", "k", "v"]).await.unwrap();

    let wrong_url = format!("redis://:battery-staple@127.0.0.1:{}", server.port());
    let wrong = RedisClient::new(&RedisConfig::new(&wrong_url)).unwrap();
    let error = wrong.ping().await.unwrap_err();
    assert!(matches!(error, RedisError::Auth { .. }), "{error:?}");
    for shown in [error.to_string(), format!("{error:?}"), format!("{wrong:?}")] {
        assert!(!shown.contains("battery-staple"), "the password shows: {shown}");
    }
    assert!(
        error.to_string().starts_with(&format!(
            "redis at 127.0.0.1:{} refused authentication: WRONGPASS",
            server.port()
        )),
        "{error}"
    );

    let none = RedisClient::new(&RedisConfig::new(format!("redis://127.0.0.1:{}", server.port())))
        .unwrap();
    let error = none.command(&["GET", "k"]).await.unwrap_err();
    assert!(
        matches!(&error, RedisError::Auth { message, .. } if message.starts_with("NOAUTH")),
        "{error:?}"
    );

    let config = RedisConfig::new(&wrong_url);
    let error = RedisBackend::connect(&config).await.unwrap_err();
    assert!(!error.to_string().contains("battery-staple"), "{error}");
    assert!(!format!("{config:?}").contains("battery-staple"));
}

#[tokio::test]
async fn the_database_of_the_url_is_selected() {
    let server = RedisServer::start();
    let db2 = RedisClient::new(&RedisConfig::new(format!("{}/2", server.url()))).unwrap();
    let db0 = RedisClient::new(&RedisConfig::new(server.url())).unwrap();
    db2.command(&["SET", "where", "two"]).await.unwrap();
    assert_eq!(db0.command(&["GET", "where"]).await.unwrap(), Reply::Nil);
    assert_eq!(db2.command(&["GET", "where"]).await.unwrap().as_str(), Some("two"));
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.stop();
    let error = RedisBackend::connect(&RedisConfig::new(url)).await.unwrap_err();
    assert!(matches!(error, RedisError::Connect { .. }), "{error:?}");
    assert!(error.is_unreachable());
}
