//! The queue stage: named queues of `concurrent` slots with a wait timeout, served by
//! priority and, within one priority, in the order calls came (FIFO).
//!
//! Queues sit behind [`QueueBackend`] so that a shared backend (Redis, for many replicas)
//! can replace the in-process one without touching the pipeline. A slot is a value: it is
//! released when dropped, so completion, error, timeout, cancellation and panic all release
//! it the same way.

use crate::config::QueueConfig;
use async_trait::async_trait;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

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

    /// [`Queue::acquire`] for a call of `priority`: a free slot goes to the waiting call of
    /// the highest priority, the earliest among equals. A backend without priorities (the
    /// default) serves every call in order.
    async fn acquire_at(&self, wait: Duration, priority: i32) -> Option<QueueSlot> {
        let _ = priority;
        self.acquire(wait).await
    }

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
    Local(#[allow(dead_code)] Permit),
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

/// Queues in this process, served by priority, then in order.
#[derive(Debug, Default)]
pub struct LocalQueues;

impl QueueBackend for LocalQueues {
    fn queue(&self, name: &str, config: &QueueConfig) -> Arc<dyn Queue> {
        Arc::new(LocalQueue {
            name: Arc::from(name),
            capacity: config.concurrent,
            slots: Arc::new(Mutex::new(Slots {
                free: config.concurrent,
                waiting: BTreeMap::new(),
                arrivals: 0,
            })),
        })
    }
}

#[derive(Debug)]
struct LocalQueue {
    name: Arc<str>,
    capacity: usize,
    slots: Arc<Mutex<Slots>>,
}

/// A local queue's slots. Invariant: slots are free only while nobody waits (a released
/// slot goes to the first waiter).
#[derive(Debug)]
struct Slots {
    free: usize,
    /// The waiting calls, first the highest priority, then the earliest.
    waiting: BTreeMap<(Reverse<i32>, u64), oneshot::Sender<Permit>>,
    arrivals: u64,
}

fn lock(slots: &Mutex<Slots>) -> MutexGuard<'_, Slots> {
    slots.lock().unwrap_or_else(|e| e.into_inner())
}

/// A held slot of a [`LocalQueue`]: dropped, it goes to the first waiting call, or is
/// free again.
#[derive(Debug)]
struct Permit(Arc<Mutex<Slots>>);

impl Drop for Permit {
    fn drop(&mut self) {
        let next = {
            let mut slots = lock(&self.0);
            loop {
                match slots.waiting.pop_first() {
                    // A waiter that gave up (timed out, cancelled) has no receiver.
                    Some((_, waiter)) if waiter.is_closed() => continue,
                    Some((_, waiter)) => break Some(waiter),
                    None => {
                        slots.free += 1;
                        break None;
                    }
                }
            }
        };
        // Handed on outside the lock: a waiter that went away just now drops the permit
        // it was sent, which passes it on again.
        if let Some(waiter) = next {
            let _ = waiter.send(Permit(self.0.clone()));
        }
    }
}

/// Takes a waiting call's place out of the queue when it stops waiting.
struct Waiting<'a> {
    slots: &'a Mutex<Slots>,
    key: (Reverse<i32>, u64),
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(self.slots).waiting.remove(&self.key);
    }
}

impl LocalQueue {
    /// A free slot taken from `slots` (this queue's, locked), if there is one.
    fn take_free(&self, slots: &mut Slots) -> Option<QueueSlot> {
        if slots.free == 0 {
            return None;
        }
        slots.free -= 1;
        Some(QueueSlot(SlotInner::Local(Permit(self.slots.clone()))))
    }
}

#[async_trait]
impl Queue for LocalQueue {
    fn name(&self) -> &Arc<str> {
        &self.name
    }

    async fn acquire(&self, wait: Duration) -> Option<QueueSlot> {
        self.acquire_at(wait, 0).await
    }

    async fn acquire_at(&self, wait: Duration, priority: i32) -> Option<QueueSlot> {
        let (receiver, _waiting) = {
            let mut slots = lock(&self.slots);
            if let Some(slot) = self.take_free(&mut slots) {
                return Some(slot);
            }
            slots.arrivals += 1;
            let key = (Reverse(priority), slots.arrivals);
            let (sender, receiver) = oneshot::channel();
            slots.waiting.insert(key, sender);
            (receiver, Waiting { slots: &self.slots, key })
        };
        match tokio::time::timeout(wait, receiver).await {
            Ok(Ok(permit)) => Some(QueueSlot(SlotInner::Local(permit))),
            // A permit sent as the wait ended is in the dropped receiver, and passes on.
            _ => None,
        }
    }

    fn try_acquire(&self) -> Option<QueueSlot> {
        self.take_free(&mut lock(&self.slots))
    }

    fn is_full(&self) -> bool {
        lock(&self.slots).free == 0
    }

    fn in_use(&self) -> usize {
        self.capacity - lock(&self.slots).free
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

    /// A free slot goes to the waiting call of the highest priority, then to the earliest
    /// among equals; one that stopped waiting is passed over.
    #[tokio::test(start_paused = true)]
    async fn slots_go_by_priority_then_in_order() {
        let q = LocalQueues.queue("q", &QueueConfig::new(1));
        let held = q.acquire(Duration::from_secs(1)).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for (name, priority) in [("low", -1), ("first", 0), ("urgent", 5), ("second", 0)] {
            let (q, order) = (q.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let slot = q.acquire_at(Duration::from_secs(60), priority).await;
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(slot);
            }));
            tokio::task::yield_now().await;
        }
        let gone = {
            let q = q.clone();
            tokio::spawn(async move { q.acquire_at(Duration::from_secs(60), 9).await })
        };
        tokio::task::yield_now().await;
        gone.abort();
        let _ = gone.await;
        drop(held);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["urgent", "first", "second", "low"]);
        assert_eq!(q.in_use(), 0);
        // A waiter that times out leaves its place.
        let held = q.acquire(Duration::from_secs(1)).await.unwrap();
        assert!(q.acquire_at(Duration::from_millis(10), 3).await.is_none());
        drop(held);
        assert_eq!(q.in_use(), 0);
        assert!(!q.is_full());
    }
}
