//! [`RedisBackend`]: one Redis server's connections, shared by the queues, the cache and
//! the pending store made from it.

use crate::client::{Health, RedisClient};
use crate::config::Settings;
use crate::pubsub::PubSub;
use crate::{
    RedisCache, RedisConfig, RedisError, RedisOutputStore, RedisPendingStore, RedisQueues,
    RedisRateLimits,
};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// A connection to one Redis server (a pool for commands, one connection for pub/sub),
/// from which the shared queues, cache and pending store are made. Cheap to clone;
/// connections are made when first needed and remade after failures.
#[derive(Debug, Clone)]
pub struct RedisBackend {
    shared: Arc<BackendShared>,
}

/// What the queues, cache and store of one backend share.
#[derive(Debug)]
pub(crate) struct BackendShared {
    pub(crate) settings: Settings,
    pub(crate) client: RedisClient,
    pub(crate) pubsub: PubSub,
    /// Names this process among the replicas (in slot and call ids): random, so that a
    /// restarted process never takes over the ids of the one before.
    pub(crate) replica: String,
    /// Numbers this replica's rate limit reservations (their ids, `{replica}-{n}`): one
    /// count for all its limits, so that no two reservations share an id, whether of two
    /// limits on one call (a tool's and its provider's) or of two limiters of one limit.
    pub(crate) reservations: AtomicU64,
}

impl RedisBackend {
    /// A backend for `config` without connecting: fails only on a bad URL or setting.
    /// Until Redis answers, slots are not given, the cache misses and external calls fail.
    pub fn new(config: &RedisConfig) -> Result<RedisBackend, RedisError> {
        let settings = Settings::new(config)?;
        let health = Arc::new(Health::new(&settings.endpoint));
        let client = RedisClient::from_settings(&settings, health.clone());
        let pubsub = PubSub::new(settings.endpoint.clone(), settings.timeout, health);
        Ok(RedisBackend {
            shared: Arc::new(BackendShared {
                settings,
                client,
                pubsub,
                replica: toolmux_core::unique_token(),
                reservations: AtomicU64::new(0),
            }),
        })
    }

    /// A backend for `config` whose server answered a `PING` within the command timeout
    /// (logging in and selecting the database on the way).
    pub async fn connect(config: &RedisConfig) -> Result<RedisBackend, RedisError> {
        let backend = RedisBackend::new(config)?;
        backend.ping().await?;
        Ok(backend)
    }

    /// Checks that the server answers.
    pub async fn ping(&self) -> Result<(), RedisError> {
        self.shared.client.ping().await
    }

    /// The client the backend's parts use, for commands of one's own.
    pub fn client(&self) -> &RedisClient {
        &self.shared.client
    }

    /// Queues whose slots all replicas share.
    pub fn queues(&self) -> RedisQueues {
        RedisQueues::new(self.shared.clone())
    }

    /// The response cache, shared by all replicas.
    pub fn cache(&self) -> RedisCache {
        RedisCache::new(self.shared.clone())
    }

    /// The output store, readable through every replica.
    pub fn output_store(&self) -> RedisOutputStore {
        RedisOutputStore::new(self.shared.clone())
    }

    /// Rate limits shared by all replicas.
    pub fn rate_limits(&self) -> RedisRateLimits {
        RedisRateLimits::new(self.shared.clone())
    }

    /// Pending external calls and inboxes, shared by all replicas.
    pub fn pending_store(&self) -> RedisPendingStore {
        RedisPendingStore::new(self.shared.clone())
    }

    /// Which replica holds each MCP session, for forwarding requests to it.
    pub fn session_owners(&self) -> crate::RedisSessionOwners {
        crate::RedisSessionOwners::new(self.shared.clone())
    }

    /// The spaces and agents' state (`toolmux_external::Spaces`), shared by all replicas.
    pub fn space_storage(&self) -> crate::RedisSpaceStorage {
        crate::RedisSpaceStorage::new(self.shared.clone())
    }
}
