//! [`RedisError`]: what can go wrong between toolmux and a Redis server.

use crate::resp::ProtocolError;
use std::io;

/// A failure talking to Redis. No variant carries the password of the URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisError {
    /// The URL cannot be used; `url` has its password replaced by `***`.
    #[error("invalid redis url `{url}`: {reason}")]
    Url {
        /// The URL, password hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting other than the URL is out of range.
    #[error("invalid redis setting `{key}`: {reason}")]
    Setting {
        /// The setting's key (`leaseMs`).
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The TCP connection could not be made.
    #[error("cannot connect to redis at {addr}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The server refused the credentials (or asked for some and got none).
    #[error("redis at {addr} refused authentication: {message}")]
    Auth {
        /// `host:port`.
        addr: String,
        /// The server's message (it never contains the password).
        message: String,
    },
    /// The connection broke while a command was under way.
    #[error("connection to redis at {addr} broke")]
    Io {
        /// `host:port`.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// No reply within the command timeout.
    #[error("redis at {addr} did not answer `{command}` within {timeout_ms} ms")]
    Timeout {
        /// `host:port`.
        addr: String,
        /// The command's name.
        command: String,
        /// The timeout.
        timeout_ms: u64,
    },
    /// Every connection of the pool stayed busy with other commands for as long as the
    /// command may take: it was never sent.
    #[error(
        "all {size} pooled connections to redis at {addr} stayed busy with other commands \
         for {waited_ms} ms, so `{command}` was not sent; raise the pool's size \
         (`backend.redis.poolSize`) or the timeout (`timeoutMs`), or look for what makes \
         redis slow"
    )]
    PoolBusy {
        /// `host:port`.
        addr: String,
        /// The command's name.
        command: String,
        /// How many connections the pool has.
        size: usize,
        /// How long the command waited for one.
        waited_ms: u64,
    },
    /// The server answered the command with an error.
    #[error("redis refused `{command}`: {message}")]
    Server {
        /// The command's name.
        command: String,
        /// The server's message.
        message: String,
    },
    /// The server's reply was not RESP2, or not the shape the command answers with.
    #[error("redis at {addr} sent an unexpected reply to `{command}`")]
    Protocol {
        /// `host:port`.
        addr: String,
        /// The command's name.
        command: String,
        /// What was wrong.
        #[source]
        source: ProtocolError,
    },
}

impl RedisError {
    /// Whether the server could not be reached (connection refused or broken, timeout),
    /// as opposed to a server that answered: such failures are logged once per outage.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            RedisError::Connect { .. } | RedisError::Io { .. } | RedisError::Timeout { .. }
        )
    }

    /// Whether the command may have taken effect although no answer came: the connection
    /// broke or the time ran out after it was sent. A connection never made, a login
    /// refused and a command refused mean it did not.
    pub(crate) fn may_have_run(&self) -> bool {
        !matches!(
            self,
            RedisError::Url { .. }
                | RedisError::Setting { .. }
                | RedisError::Connect { .. }
                | RedisError::Auth { .. }
                | RedisError::PoolBusy { .. }
                | RedisError::Server { .. }
        )
    }
}
