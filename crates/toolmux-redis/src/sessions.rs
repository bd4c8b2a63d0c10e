//! [`RedisSessionOwners`]: which replica holds each MCP session of streamable HTTP, so
//! that a replica given a request of a session another holds can forward it there.
//!
//! One string key per session, `{prefix}:session:{id}`, holding the base URL of the
//! replica that made it (`http://10.0.0.5:8765`), with an expiry the replica renews while
//! the session lives. The replicas record their MCP tasks here too, by default under
//! `{prefix}:session:task:{id}` (the session id `task:{id}`, a name no session takes),
//! expiring with the task. Anyone who can write under the prefix can point a session at
//! any URL, as they can change every other thing the backend shares: the prefix is to be
//! writable by the replicas only.

use crate::RedisError;
use crate::backend::BackendShared;
use crate::client::Script;
use crate::config::FOREVER;
use crate::resp::Reply;
use std::sync::Arc;
use std::time::Duration;

/// Removes a session's record only while it still names the replica removing it, so that
/// a replica never removes a record another wrote since.
static RELEASE: Script = Script {
    name: "session_release",
    source: "if redis.call('GET', KEYS[1]) == ARGV[1] then \
               return redis.call('DEL', KEYS[1]) \
             end \
             return 0",
};

/// The owners of MCP sessions, shared by all replicas (see the module's docs).
#[derive(Debug, Clone)]
pub struct RedisSessionOwners {
    backend: Arc<BackendShared>,
}

impl RedisSessionOwners {
    pub(crate) fn new(backend: Arc<BackendShared>) -> RedisSessionOwners {
        RedisSessionOwners { backend }
    }

    fn key(&self, session: &str) -> String {
        format!("{}:session:{session}", self.backend.settings.prefix)
    }

    /// Records that the replica at `owner` holds `session` for `ttl` from now (at least a
    /// millisecond), or renews the record.
    pub async fn claim(&self, session: &str, owner: &str, ttl: Duration) -> Result<(), RedisError> {
        let ms = ttl.min(FOREVER).as_millis().max(1).to_string();
        let key = self.key(session);
        self.backend.client.command(&["SET", &key, owner, "PX", &ms]).await?;
        Ok(())
    }

    /// The base URL of the replica holding `session`; `None` when none records it.
    pub async fn owner(&self, session: &str) -> Result<Option<String>, RedisError> {
        let reply = self.backend.client.command(&["GET", &self.key(session)]).await?;
        Ok(match reply {
            Reply::Bulk(_) | Reply::Simple(_) => reply.as_str().map(str::to_owned),
            _ => None,
        })
    }

    /// Removes the record of `session` when it names `owner`; whether it did.
    pub async fn release(&self, session: &str, owner: &str) -> Result<bool, RedisError> {
        let key = self.key(session);
        let timeout = self.backend.client.timeout();
        let reply =
            self.backend.client.eval(&RELEASE, &[&key], &[owner.as_bytes()], timeout).await?;
        Ok(reply.as_i64() == Some(1))
    }
}
