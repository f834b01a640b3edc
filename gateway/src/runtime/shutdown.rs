//! Graceful shutdown: the one flag every shard watches once SIGINT or SIGTERM arrives, and the
//! count of open client connections the `serve` command waits on before it exits.
//!
//! [`Shutdown`] is shared by all shards and the main thread (atomics, a `tokio::sync::watch` and a
//! `Notify`, whose wakers work on any runtime and across threads). When the drain begins, the
//! shards stop accepting, every h2 connection gets GOAWAY, idle HTTP/1.1 connections are closed
//! and busy ones close after their response; each connection's [`OpenConnection`] guard, dropped
//! when its task ends, lets the main thread see the last one go. This module never touches a
//! socket and never cuts anything: the grace period is enforced by `serve` exiting the process.
//!
//! Each shard keeps its own copy of the flag, [`ShardDrain`]: a task of the shard waits once on
//! the shared state and then wakes the shard's own waiters. A keep-alive connection waits for its
//! next request and for the drain at the same time; that wait registers in the shard's list, not
//! in the shared `watch` (whose waiter list is behind a lock every shard would take per request).
//!
//! Called by `server::shard` (accept loops, connection guards, the per-shard copy), the
//! front-ends (drain waits and checks) and `serve` (begin, wait).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio::sync::{watch, Notify};

/// The shutdown state shared by every shard of one gateway.
#[derive(Debug)]
pub struct Shutdown {
    /// Cheap check for code that only needs to know (one load, no waker).
    draining: AtomicBool,
    /// Wakes the tasks that wait for the drain to begin (accept loops, idle connections).
    phase: watch::Sender<bool>,
    connections: AtomicUsize,
    last_closed: Notify,
}

impl Shutdown {
    pub fn new() -> Arc<Shutdown> {
        Arc::new(Shutdown {
            draining: AtomicBool::new(false),
            phase: watch::Sender::new(false),
            connections: AtomicUsize::new(0),
            last_closed: Notify::new(),
        })
    }

    /// Begins the drain; `false` if it had already begun.
    pub fn begin(&self) -> bool {
        if self.draining.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.phase.send_replace(true);
        true
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Resolves once the drain has begun (at once if it already has). Cancel-safe, and free
    /// until first polled (a keep-alive connection whose next request is already readable never
    /// registers a waker).
    pub async fn drain_started(&self) {
        if self.is_draining() {
            return;
        }
        let mut phase = self.phase.subscribe();
        // `wait_for` looks at the current value first: a drain begun since the check is seen.
        // The sender lives as long as `self`, so the wait cannot fail.
        let _ = phase.wait_for(|draining| *draining).await;
    }

    /// Counts a client connection until the guard is dropped.
    pub fn connection_opened(self: &Arc<Self>) -> OpenConnection {
        self.connections.fetch_add(1, Ordering::SeqCst);
        OpenConnection(self.clone())
    }

    /// Client connections open on all shards.
    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Resolves once no client connection is open.
    pub async fn all_closed(&self) {
        loop {
            let mut notified = pin!(self.last_closed.notified());
            // Registered before the check, so a close between the check and the await is seen.
            notified.as_mut().enable();
            if self.open_connections() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One open client connection; dropping it uncounts the connection.
#[derive(Debug)]
pub struct OpenConnection(Arc<Shutdown>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        if self.0.connections.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.last_closed.notify_waiters();
        }
    }
}

/// One shard's copy of the drain flag and the shard's tasks waiting for it. Shard-local: no
/// atomics and no lock; set once by the shard's own task that watches [`Shutdown`].
#[derive(Default)]
pub struct ShardDrain {
    draining: Cell<bool>,
    /// Wakers of pending waits, by slot; `free` lists the empty slots for reuse.
    waiters: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

impl ShardDrain {
    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// Marks the drain begun on this shard and wakes every wait.
    pub fn begin(&self) {
        self.draining.set(true);
        self.free.borrow_mut().clear();
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for waker in waiters.into_iter().flatten() {
            waker.wake();
        }
    }

    /// Resolves once the drain has begun on this shard. Cancel-safe; free until it has to wait
    /// (a keep-alive connection whose next request is already readable never registers).
    pub fn started(&self) -> DrainStarted<'_> {
        DrainStarted {
            drain: self,
            slot: None,
        }
    }

    /// Waits registered now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiters.borrow().iter().flatten().count()
    }
}

/// The future of [`ShardDrain::started`]; leaves the shard's list when dropped.
pub struct DrainStarted<'a> {
    drain: &'a ShardDrain,
    slot: Option<usize>,
}

impl Future for DrainStarted<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let drain = self.drain;
        if drain.draining.get() {
            self.slot = None;
            return Poll::Ready(());
        }
        let mut waiters = drain.waiters.borrow_mut();
        match self.slot {
            Some(slot) => match &mut waiters[slot] {
                Some(waker) if waker.will_wake(cx.waker()) => {}
                entry => *entry = Some(cx.waker().clone()),
            },
            None => {
                let slot = match drain.free.borrow_mut().pop() {
                    Some(slot) => {
                        waiters[slot] = Some(cx.waker().clone());
                        slot
                    }
                    None => {
                        waiters.push(Some(cx.waker().clone()));
                        waiters.len() - 1
                    }
                };
                self.slot = Some(slot);
            }
        }
        Poll::Pending
    }
}

impl Drop for DrainStarted<'_> {
    fn drop(&mut self) {
        // After `begin` the list is empty and the slot gone with it.
        if let Some(slot) = self.slot.take() {
            if !self.drain.draining.get() {
                self.drain.waiters.borrow_mut()[slot] = None;
                self.drain.free.borrow_mut().push(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_drain_wakes_its_waits_and_a_dropped_wait_leaves_the_list() {
        let drain = ShardDrain::default();
        let (waker, woken) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut kept = Box::pin(drain.started());
        assert!(kept.as_mut().poll(&mut cx).is_pending());
        // Many waits that end without a drain (one per keep-alive request) reuse one slot.
        for _ in 0..100 {
            let mut wait = Box::pin(drain.started());
            assert!(wait.as_mut().poll(&mut cx).is_pending());
            assert_eq!(drain.waiting(), 2);
        }
        assert_eq!(drain.waiting(), 1);
        assert_eq!(drain.waiters.borrow().len(), 2);
        drain.begin();
        assert_eq!(woken.load(Ordering::SeqCst), 1, "the pending wait is woken");
        assert!(kept.as_mut().poll(&mut cx).is_ready());
        assert!(drain.is_draining());
        assert!(Box::pin(drain.started()).as_mut().poll(&mut cx).is_ready());
        assert_eq!(drain.waiting(), 0);
    }

    /// A waker that counts its wakes.
    fn counting_waker() -> (Waker, Arc<AtomicUsize>) {
        struct Count(Arc<AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let woken = Arc::new(AtomicUsize::new(0));
        (Waker::from(Arc::new(Count(woken.clone()))), woken)
    }

    #[tokio::test]
    async fn started_resolves_after_begin_and_all_closed_after_the_last_guard() {
        let shutdown = Shutdown::new();
        let started = shutdown.drain_started();
        let first = shutdown.connection_opened();
        let second = shutdown.connection_opened();
        assert!(!shutdown.is_draining());
        assert!(shutdown.begin());
        assert!(
            !shutdown.begin(),
            "a second begin reports that the drain was on already"
        );
        started.await;
        shutdown.drain_started().await;
        assert_eq!(shutdown.open_connections(), 2);
        drop(first);
        let waiter = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { shutdown.all_closed().await }
        });
        drop(second);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("all_closed resolves once the last connection is gone")
            .unwrap();
    }
}
