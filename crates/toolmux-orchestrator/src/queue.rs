//! The queue stage: named queues of `concurrent` slots, FIFO, with a wait timeout.
//!
//! Queues sit behind [`QueueBackend`] so that a shared backend (Redis, for many replicas)
//! can replace the in-process one without touching the pipeline. A slot is a value: it is
//! released when dropped, so completion, error, timeout, cancellation and panic all release
//! it the same way.

use crate::config::QueueConfig;
use async_trait::async_trait;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Makes queues by name.
pub trait QueueBackend: Send + Sync + fmt::Debug {
    /// The queue called `name`, with its configuration.
    fn queue(&self, name: &str, config: &QueueConfig) -> Arc<dyn Queue>;
}

/// One named queue.
#[async_trait]
pub trait Queue: Send + Sync + fmt::Debug {
    /// The queue's name.
    fn name(&self) -> &Arc<str>;

    /// Takes a slot, waiting at most `wait`; `None` when none became free in time.
    async fn acquire(&self, wait: Duration) -> Option<QueueSlot>;

    /// Takes a slot if one is free now, without waiting.
    fn try_acquire(&self) -> Option<QueueSlot> {
        None
    }

    /// Whether every slot is taken now.
    fn is_full(&self) -> bool;

    /// Slots taken now.
    fn in_use(&self) -> usize;

    /// Slots in all.
    fn capacity(&self) -> usize;
}

/// A held queue slot; dropping it releases the slot.
pub struct QueueSlot(SlotInner);

enum SlotInner {
    Local(#[allow(dead_code)] OwnedSemaphorePermit),
    Other(#[allow(dead_code)] Box<dyn Send + Sync>),
}

impl QueueSlot {
    /// A slot of another backend, released when `guard` is dropped.
    pub fn from_guard(guard: Box<dyn Send + Sync>) -> Self {
        QueueSlot(SlotInner::Other(guard))
    }
}

impl fmt::Debug for QueueSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            SlotInner::Local(_) => "QueueSlot(local)",
            SlotInner::Other(_) => "QueueSlot(other)",
        })
    }
}

/// Queues in this process: a fair (FIFO) semaphore each.
#[derive(Debug, Default)]
pub struct LocalQueues;

impl QueueBackend for LocalQueues {
    fn queue(&self, name: &str, config: &QueueConfig) -> Arc<dyn Queue> {
        Arc::new(LocalQueue {
            name: Arc::from(name),
            capacity: config.concurrent,
            semaphore: Arc::new(Semaphore::new(config.concurrent)),
        })
    }
}

#[derive(Debug)]
struct LocalQueue {
    name: Arc<str>,
    capacity: usize,
    semaphore: Arc<Semaphore>,
}

#[async_trait]
impl Queue for LocalQueue {
    fn name(&self) -> &Arc<str> {
        &self.name
    }

    async fn acquire(&self, wait: Duration) -> Option<QueueSlot> {
        if let Ok(permit) = self.semaphore.clone().try_acquire_owned() {
            return Some(QueueSlot(SlotInner::Local(permit)));
        }
        // Tokio's semaphore serves waiters in FIFO order; the semaphore is never closed.
        let permit = tokio::time::timeout(wait, self.semaphore.clone().acquire_owned()).await;
        match permit {
            Ok(Ok(permit)) => Some(QueueSlot(SlotInner::Local(permit))),
            _ => None,
        }
    }

    fn try_acquire(&self) -> Option<QueueSlot> {
        self.semaphore.clone().try_acquire_owned().ok().map(|p| QueueSlot(SlotInner::Local(p)))
    }

    fn is_full(&self) -> bool {
        self.semaphore.available_permits() == 0
    }

    fn in_use(&self) -> usize {
        self.capacity - self.semaphore.available_permits()
    }

    fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn slots_are_fifo_and_released_on_drop() {
        let q = LocalQueues.queue("q", &QueueConfig::new(1));
        let first = q.acquire(Duration::from_secs(1)).await.unwrap();
        assert!(q.is_full());
        assert!(q.acquire(Duration::from_millis(10)).await.is_none(), "times out while held");
        drop(first);
        assert_eq!(q.in_use(), 0);
        let _again = q.acquire(Duration::from_millis(10)).await.unwrap();
        assert_eq!(q.in_use(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_waiter_leaves_no_slot_taken() {
        let q = LocalQueues.queue("q", &QueueConfig::new(1));
        let held = q.acquire(Duration::from_secs(1)).await.unwrap();
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.acquire(Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        waiter.abort();
        let _ = waiter.await;
        drop(held);
        assert_eq!(q.in_use(), 0);
    }
}
