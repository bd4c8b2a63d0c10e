//! The bound on the calls one provider has in flight ([`crate::OrchestratorConfig::max_calls_in_flight`]):
//! past it calls wait in order for one to end, up to their deadline, and past a bound on
//! waiting calls they fail at once with `queue_busy`.
//!
//! Named queues bound what the configuration names; this holds for every provider
//! without configuration, so that a client or a model firing hundreds of calls at once
//! cannot make toolmux hold hundreds of requests, processes or results in memory (goose
//! #9136). Per process, as the in-process queues are.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use toolmux_core::Op;

/// Every provider's bound, made on its first call.
#[derive(Debug, Default)]
pub(crate) struct InFlightLimits {
    limits: Mutex<HashMap<String, Arc<InFlightLimit>>>,
}

/// One provider's bound.
#[derive(Debug)]
pub(crate) struct InFlightLimit {
    /// What the operation tree records a held slot as, and errors name.
    pub name: Arc<str>,
    /// Slots: tokio's semaphore serves waiters in the order they came.
    permits: Arc<Semaphore>,
    /// Calls waiting for a slot now.
    waiting: AtomicUsize,
}

impl InFlightLimits {
    /// The bound of the provider of `namespace`, with `max` slots and room for
    /// `max_waiting` calls to wait (named with both, for the errors).
    pub fn of(&self, namespace: &str, max: usize, max_waiting: usize) -> Arc<InFlightLimit> {
        let mut limits = self.limits.lock().unwrap_or_else(|e| e.into_inner());
        // Every call asks: the name is copied only for a provider's first.
        if let Some(limit) = limits.get(namespace) {
            return limit.clone();
        }
        limits
            .entry(namespace.to_owned())
            .or_insert_with(|| {
                Arc::new(InFlightLimit {
                    name: Arc::from(format!(
                        "calls in flight to {namespace} (at most {max}, {max_waiting} waiting; \
                         defaults.maxCallsInFlight)"
                    )),
                    permits: Arc::new(Semaphore::new(max)),
                    waiting: AtomicUsize::new(0),
                })
            })
            .clone()
    }
}

impl InFlightLimit {
    /// A slot if one is free now.
    pub fn try_take(&self, op: &Arc<Op>) -> Option<InFlightSlot> {
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        Some(InFlightSlot::held(permit, op, &self.name))
    }

    /// Waits in line for a slot; `None` when `max_waiting` calls wait already, so this one
    /// may not. Cancel-safe: a call that stops waiting leaves the line.
    pub fn wait(
        self: &Arc<Self>,
        max_waiting: usize,
    ) -> Option<impl Future<Output = OwnedSemaphorePermit> + use<>> {
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= max_waiting {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let waiting = Waiting(self.clone());
        Some(async move {
            let permit = waiting.0.permits.clone().acquire_owned().await;
            drop(waiting);
            // Invariant: the semaphore is never closed.
            permit.expect("the in-flight semaphore is never closed")
        })
    }

    /// Calls waiting now.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// One waiting call, counted until it has its slot or stops waiting.
struct Waiting(Arc<InFlightLimit>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A held slot, recorded on the operation so that calls made inside the call see it;
/// dropping it frees the slot.
#[derive(Debug)]
pub(crate) struct InFlightSlot {
    _permit: OwnedSemaphorePermit,
    op: Arc<Op>,
    name: Arc<str>,
}

impl InFlightSlot {
    pub fn held(permit: OwnedSemaphorePermit, op: &Arc<Op>, name: &Arc<str>) -> InFlightSlot {
        op.hold_queue(name);
        InFlightSlot { _permit: permit, op: op.clone(), name: name.clone() }
    }
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        self.op.release_queue(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_past_the_bound_are_refused_and_leave_the_line_when_dropped() {
        let limits = InFlightLimits::default();
        let limit = limits.of("m", 1, 1);
        let op = Op::new("m__t", None);
        let held = limit.try_take(&op).expect("a free slot");
        assert!(limit.try_take(&op).is_none());
        let first = limit.wait(1).expect("room in line");
        assert!(limit.wait(1).is_none(), "one may wait");
        assert_eq!(limit.waiting(), 1);
        drop(first);
        assert_eq!(limit.waiting(), 0, "a dropped waiter leaves the line");
        let second = limit.wait(1).expect("room again");
        drop(held);
        let permit = second.await;
        assert_eq!(limit.waiting(), 0);
        drop(permit);
        assert!(limit.try_take(&op).is_some());
    }
}
