//! Redis backends for toolmux, for running many `toolmux serve` replicas behind one load
//! balancer as if they were one: their queues share slots, their response cache is one,
//! and an external tool's call opened through one replica can be answered through any
//! other.
//!
//! For operators, this is the `backend: {redis: {url: ...}}` section of the configuration
//! file (feature `redis` of the `toolmux` facade). For embedders, [`RedisBackend`] makes
//! the three parts, each behind the trait its in-process default implements:
//!
//! - [`RedisQueues`], a [`toolmux_orchestrator::queue::QueueBackend`]: slots are leases
//!   in a sorted set, renewed while held, so a crashed replica's slots come back when
//!   their lease ends (`leaseMs`, 30 s by default);
//! - [`RedisCache`], a [`toolmux_orchestrator::cache::ResponseCache`] whose lead of a call
//!   is a key with a lease, renewed while the call runs, so that identical concurrent
//!   calls of all replicas run once;
//! - [`RedisPendingStore`], a [`toolmux_external::PendingStore`];
//! - [`RedisRateLimits`], a [`toolmux_orchestrator::ratelimit::RateLimitBackend`]: one
//!   GCRA state per limit, on the Redis server's clock;
//! - [`RedisOutputStore`], a [`toolmux_orchestrator::store::OutputStore`]: outputs over the
//!   size cap, readable by handle through any replica;
//! - [`RedisSessionOwners`]: which replica holds each MCP session of streamable HTTP, so
//!   that the others forward its requests there (`advertiseUrl`); the replicas sharing
//!   sessions also share the key they seal the stateless revision's `requestState` with
//!   (`{prefix}:mcp:seal-key`, kept by the facade), and `serve --http` refuses to start
//!   when Redis does not give it within 10 s.
//!
//! Statistics stay in each process.
//!
//! The client is this crate's own (RESP2 over TCP, [`resp`] and [`RedisClient`]): a small
//! pool (a command waits for a free connection, in turn, and has what is left of its
//! timeout for the server: one deadline for both), one subscriber connection whose messages wake
//! waiters at once (with polling as a fallback), and Lua scripts for every step that must
//! be atomic. A Redis that does not answer never hangs a call: a queue slot is not given
//! by the end of the wait, the cache misses, an external call fails; the outage is logged
//! once when it starts and once when it ends. One Redis server is expected (scripts touch
//! keys they compute), not a Redis Cluster; TLS is not supported.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use toolmux_orchestrator::{Orchestrator, OrchestratorConfig, QueueConfig};
//! use toolmux_redis::{RedisBackend, RedisConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedisBackend::connect(&RedisConfig::new("redis://127.0.0.1:6379/0")).await?;
//! let config = OrchestratorConfig::default().with_queue("github", QueueConfig::new(4));
//! let orchestrator = Orchestrator::builder(config)
//!     .queue_backend(Arc::new(backend.queues()))
//!     .cache(Arc::new(backend.cache()))
//!     .build()?;
//! let store = Arc::new(backend.pending_store()); // for toolmux_external::ExternalProvider
//! # let _ = (orchestrator, store);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod backend;
mod cache;
mod client;
mod config;
mod error;
mod outputs;
mod pending;
mod pubsub;
mod queue;
mod ratelimit;
pub mod resp;
mod sessions;
mod spaces;

pub use backend::RedisBackend;
pub use cache::{DEFAULT_LEAD_LEASE, MAX_VALUE_BYTES, RedisCache};
pub use client::RedisClient;
pub use config::{DEFAULT_LEASE, DEFAULT_POOL_SIZE, DEFAULT_PREFIX, DEFAULT_TIMEOUT, RedisConfig};
pub use error::RedisError;
pub use outputs::{MAX_OUTPUT_BYTES, OUTPUT_RETENTION, RedisOutputStore};
pub use pending::{OPEN_WAITER_TTL, RETENTION, RedisPendingStore};
pub use queue::RedisQueues;
pub use ratelimit::RedisRateLimits;
pub use sessions::RedisSessionOwners;
pub use spaces::RedisSpaceStorage;
