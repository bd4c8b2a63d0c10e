//! The RESP client against a real server: round trips of every reply type, server errors,
//! AUTH and SELECT, and a password that never shows in an error.

use std::time::Duration;
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

/// A large array reply that reaches the client in many small pieces (a loopback proxy
/// passes the server's bytes on 512 at a time) is read whole and right, as is the reply
/// after it on the same connection. The client looks at each element of such a reply
/// once, however many reads bring it (see `resp::Scanner`'s tests for the count).
#[tokio::test]
async fn a_large_array_reply_in_many_small_pieces_is_read_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = RedisServer::start();
    let relay = |client: crate::ConnectionHalves, upstream: crate::ConnectionHalves| {
        let ((mut client_read, mut client_write), (mut upstream_read, mut upstream_write)) =
            (client, upstream);
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut client_read, &mut upstream_write).await;
        });
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match upstream_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                for piece in buf[..n].chunks(512) {
                    if client_write.write_all(piece).await.is_err()
                        || client_write.flush().await.is_err()
                    {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
    };
    let port = crate::proxy_to(&server, relay).await;
    let config = RedisConfig::new(format!("redis://127.0.0.1:{port}")).with_pool_size(1);
    let client = RedisClient::new(&config).unwrap();
    let values: Vec<String> = (0..10_000).map(|i| format!("pending call {i}")).collect();
    for batch in values.chunks(1_000) {
        let mut push = vec!["RPUSH", "calls"];
        push.extend(batch.iter().map(String::as_str));
        client.command(&push).await.unwrap();
    }
    let reply = crate::within(Duration::from_secs(30), "the large reply", async {
        client.command(&["LRANGE", "calls", "0", "-1"]).await.unwrap()
    })
    .await;
    let expected: Vec<Reply> = values.iter().map(|v| Reply::Bulk(v.as_bytes().to_vec())).collect();
    assert_eq!(reply, Reply::Array(expected));
    assert_eq!(client.command(&["LLEN", "calls"]).await.unwrap(), Reply::Integer(10_000));
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

/// Holds every connection of `client`'s pool with a blocking pop of `seconds` on an empty
/// list (the server itself stays free to answer other connections).
fn hold_the_pool(
    client: &RedisClient,
    size: usize,
    seconds: &'static str,
) -> Vec<tokio::task::JoinHandle<Result<Reply, RedisError>>> {
    (0..size)
        .map(|i| {
            let client = client.clone();
            let key = format!("nothing-{i}");
            tokio::spawn(async move {
                client
                    .command_within(&["BLPOP", key.as_str(), seconds], Duration::from_secs(10))
                    .await
            })
        })
        .collect()
}

/// Waits until `n` clients of the server are blocked.
async fn blocked_clients(admin: &RedisClient, n: i64) {
    crate::within(Duration::from_secs(5), "the blocked clients", async {
        loop {
            let info = admin.command(&["INFO", "clients"]).await.expect("info");
            let blocked = info.as_str().unwrap_or_default().lines().find_map(|line| {
                line.strip_prefix("blocked_clients:").and_then(|n| n.trim().parse::<i64>().ok())
            });
            if blocked == Some(n) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A command's timeout bounds its wait for a free connection and its time at the server
/// together: each had the whole timeout, so a command of a busy pool could take twice as
/// long as its caller allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_pooled_connection_counts_against_the_command_timeout() {
    let server = RedisServer::start();
    let config = RedisConfig::new(server.url()).with_pool_size(1);
    let client = RedisClient::new(&config).unwrap();
    let admin = RedisClient::new(&RedisConfig::new(server.url())).unwrap();
    let holders = hold_the_pool(&client, 1, "0.6");
    blocked_clients(&admin, 1).await;
    // Up to 0.6 s for the connection, then 0.8 s at the server: more than 1 s in all.
    let started = tokio::time::Instant::now();
    let reply = crate::within(
        Duration::from_secs(5),
        "the command",
        client.command_within(&["BLPOP", "other", "0.8"], Duration::from_secs(1)),
    )
    .await;
    let took = started.elapsed();
    let error = reply.expect_err("the command outlived its timeout");
    assert!(matches!(error, RedisError::Timeout { timeout_ms: 1000, .. }), "{error:?}");
    assert!(took < Duration::from_millis(1250), "the command took {took:?}");
    for holder in holders {
        assert_eq!(holder.await.expect("task").expect("blpop"), Reply::Nil);
    }
    // A command that waited for the connection less than its timeout is still answered.
    let _held = hold_the_pool(&client, 1, "0.3");
    blocked_clients(&admin, 1).await;
    let reply = client.command_within(&["SET", "k", "v"], Duration::from_secs(1)).await;
    assert_eq!(reply.expect("the command, after its wait"), Reply::Simple("OK".into()));
}

/// A pool busy for as long as a command may take fails the command unsent, saying so and
/// how to get a larger pool, without taking the server for down; a larger pool serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_busy_too_long_is_its_own_error() {
    let server = RedisServer::start();
    let client = RedisClient::new(&RedisConfig::new(server.url())).unwrap();
    let admin = RedisClient::new(&RedisConfig::new(server.url())).unwrap();
    let holders = hold_the_pool(&client, toolmux_redis::DEFAULT_POOL_SIZE, "3");
    blocked_clients(&admin, toolmux_redis::DEFAULT_POOL_SIZE as i64).await;
    let started = tokio::time::Instant::now();
    let error = crate::within(
        Duration::from_secs(2),
        "the command",
        client.command_within(&["SET", "k", "v"], Duration::from_millis(300)),
    )
    .await
    .expect_err("no connection was free");
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    assert!(matches!(error, RedisError::PoolBusy { size: 4, .. }), "{error:?}");
    assert!(!error.is_unreachable(), "{error:?}");
    let message = error.to_string();
    assert_eq!(
        message,
        format!(
            "all 4 pooled connections to redis at 127.0.0.1:{} stayed busy with other commands \
             for 300 ms, so `SET` was not sent; raise the pool's size \
             (`backend.redis.poolSize`) or the timeout (`timeoutMs`), or look for what makes \
             redis slow",
            server.port()
        )
    );
    // Not sent: the key is not there.
    assert_eq!(admin.command(&["GET", "k"]).await.unwrap(), Reply::Nil);

    let larger = RedisClient::new(&RedisConfig::new(server.url()).with_pool_size(5)).unwrap();
    let _held = hold_the_pool(&larger, 4, "3");
    blocked_clients(&admin, 8).await;
    let reply = larger.command_within(&["SET", "k", "v"], Duration::from_millis(300)).await;
    assert_eq!(reply.expect("the fifth connection"), Reply::Simple("OK".into()));
    for holder in holders {
        assert_eq!(holder.await.expect("task").expect("blpop"), Reply::Nil);
    }
}

#[test]
fn the_pool_size_is_checked() {
    let error = RedisClient::new(&RedisConfig::new("redis://h").with_pool_size(0)).unwrap_err();
    assert_eq!(error.to_string(), "invalid redis setting `poolSize`: must be from 1 to 256");
}
