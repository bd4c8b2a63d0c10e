//! Futures run on the thread whose event made them ready.
//!
//! A gateway call is a relay: a line read from the client becomes a line written to the
//! server, and the server's answer becomes a line written to the client. On the event loop
//! every step is a wakeup (the loop sleeps in `epoll_wait`, wakes for the pipe, polls the
//! task, sleeps again); a thread blocked in `read` on each pipe does the same work with one
//! system call per message, as a plain byte relay does. The stdio reader threads
//! ([`crate::server`]'s stdin reader, the stdout reader of each stdio MCP server) run the
//! futures they make ready right there, after the line that did it: the call starts on the
//! thread that read the request and finishes on the thread that read the response.
//!
//! A task woken anywhere else (a timer, a pipe the runtime watches, another task) is run on
//! the runtime as any spawned task. Reader threads enter the runtime's context, so the
//! futures they poll can use its timers, spawn, and register I/O.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use tokio::runtime::Handle;

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Not queued, not running: waiting for a wake.
const IDLE: u8 = 0;
/// Queued on a reader thread or spawned on the runtime, to be polled.
const SCHEDULED: u8 = 1;
/// Being polled.
const RUNNING: u8 = 2;
/// Woken while being polled: poll again.
const NOTIFIED: u8 = 3;
/// Finished (or panicked); wakes are ignored.
const DONE: u8 = 4;

/// A spawned future and where it is run when woken.
struct Task {
    state: AtomicU8,
    job: Mutex<Option<Job>>,
    runtime: Handle,
}

thread_local! {
    /// The tasks woken on this thread while it handled its current event; `Some` on
    /// reader threads only.
    static READY: RefCell<Option<VecDeque<Arc<Task>>>> = const { RefCell::new(None) };
}

/// Makes this thread a reader thread: tasks woken on it wait for [`run_ready`] instead
/// of going to the runtime.
pub(crate) fn adopt_thread() {
    READY.with(|ready| *ready.borrow_mut() = Some(VecDeque::new()));
}

/// Runs `job` now, on this thread, until it first waits; it continues wherever it is woken.
/// (Only the server starts calls this way.)
#[cfg(any(feature = "server", test))]
pub(crate) fn spawn(runtime: Handle, job: impl Future<Output = ()> + Send + 'static) {
    let task = Arc::new(Task {
        state: AtomicU8::new(SCHEDULED),
        job: Mutex::new(Some(Box::pin(job))),
        runtime,
    });
    task.run();
}

/// Runs the tasks woken on this reader thread, until none is left.
pub(crate) fn run_ready() {
    loop {
        let next = READY
            .try_with(|ready| ready.borrow_mut().as_mut().and_then(VecDeque::pop_front))
            .ok()
            .flatten();
        match next {
            Some(task) => task.run(),
            None => return,
        }
    }
}

impl Task {
    /// Polls the job (the state is `SCHEDULED`), again while it is woken meanwhile.
    fn run(self: Arc<Self>) {
        self.state.store(RUNNING, Ordering::Release);
        let waker = Waker::from(self.clone());
        let mut cx = Context::from_waker(&waker);
        let mut job = self.job.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let Some(future) = job.as_mut() else {
                self.state.store(DONE, Ordering::Release);
                return;
            };
            let polled =
                std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
            match polled {
                Ok(std::task::Poll::Pending) => {}
                Ok(std::task::Poll::Ready(())) => {
                    *job = None;
                    self.state.store(DONE, Ordering::Release);
                    return;
                }
                Err(_) => {
                    tracing::error!("a task run on a reader thread panicked");
                    *job = None;
                    self.state.store(DONE, Ordering::Release);
                    return;
                }
            }
            match self.state.compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                // Woken while polled: poll again.
                Err(_) => self.state.store(RUNNING, Ordering::Release),
            }
        }
    }

    fn schedule(self: Arc<Self>) {
        let mut task = Some(self);
        let _ = READY.try_with(|ready| {
            if let Some(queue) = ready.borrow_mut().as_mut()
                && let Some(task) = task.take()
            {
                queue.push_back(task);
            }
        });
        if let Some(task) = task {
            let runtime = task.runtime.clone();
            drop(runtime.spawn(async move { task.run() }));
        }
    }
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let next = match state {
                IDLE => SCHEDULED,
                RUNNING => NOTIFIED,
                _ => return,
            };
            match self.state.compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if next == SCHEDULED => {
                    self.clone().schedule();
                    return;
                }
                Ok(_) => return,
                Err(actual) => state = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A task woken on a reader thread runs there, after the event; woken elsewhere it runs
    /// on the runtime.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn tasks_run_where_they_are_woken() {
        let runtime = Handle::current();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let _context = runtime.enter();
            adopt_thread();
            let here = std::thread::current().id();
            spawn(runtime.clone(), async move {
                let _ = rx.await;
                let _ = done_tx.send(std::thread::current().id() == here);
            });
            // The task waits; the send wakes it onto this thread's queue.
            let _ = tx.send(());
            run_ready();
        });
        reader.join().expect("the reader thread");
        assert_eq!(done_rx.recv().ok(), Some(true), "ran on the reader thread");

        // Woken by a timer: the runtime runs it.
        let ran = Arc::new(AtomicUsize::new(0));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let counted = ran.clone();
        let runtime = Handle::current();
        std::thread::spawn(move || {
            let _context = runtime.enter();
            adopt_thread();
            spawn(runtime.clone(), async move {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                counted.fetch_add(1, Ordering::Relaxed);
                let _ = done_tx.send(());
            });
        })
        .join()
        .expect("the reader thread");
        done_rx.await.expect("the task finished on the runtime");
        assert_eq!(ran.load(Ordering::Relaxed), 1);
    }

    /// A panicking task is dropped; the thread goes on.
    #[tokio::test]
    async fn a_panic_stays_in_its_task() {
        let runtime = Handle::current();
        std::thread::spawn(move || {
            let _context = runtime.enter();
            adopt_thread();
            spawn(runtime.clone(), async { panic!("boom") });
            run_ready();
        })
        .join()
        .expect("the thread survived");
    }
}
