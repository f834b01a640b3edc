//! Graceful shutdown: the one flag every shard watches once SIGINT or SIGTERM arrives, and the
//! count of open client connections the `serve` command waits on before it exits.
//!
//! [`Shutdown`] is shared by all shards and the main thread (atomics, a `tokio::sync::watch` and a
//! `Notify`, whose wakers work on any runtime and across threads). When the drain begins, the
//! shards stop accepting, every h2 connection gets GOAWAY, idle HTTP/1.1 connections are closed
//! and busy ones close after their response; each connection's [`OpenConnection`] guard, dropped
//! when its task ends, lets the main thread see the last one go. This module never touches a
//! socket and never cuts anything: the grace period is enforced by `serve` exiting the process.
//! Called by `shard` (accept loops, connection guards), `proxy` and `http2` (drain checks) and
//! `serve` (begin, wait).

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

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

#[cfg(test)]
mod tests {
    use super::*;

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
