//! Retiring routes: how the data path learns that a [`ClusterRoute`](crate::ClusterRoute) it
//! holds is no longer in the serving table (its cluster was removed, or its spec changed and a
//! route with a new `id` replaced it), so that streams opened on it end cleanly and pooled
//! connections made for it are closed.
//!
//! Every route carries one [`RouteRetirement`]; the [`TablePublisher`](crate::TablePublisher)
//! retires the routes a new table does not carry over, on the source's thread. Shards see it in
//! two ways: a relaxed atomic load ([`RouteRetirement::is_retired`], cheap enough for every chunk)
//! and a [`RetirementListener`] future that an idle stream (a watch waiting for its next event, an
//! exec session at a prompt) selects on, woken across threads by `event_listener`. A listener
//! registers its waker once, on its first pending poll, and afterwards costs one atomic load per
//! poll: no lock and no allocation per chunk. This relies on the listener being polled by one task
//! for its whole life (true of a shard's connection task and of an h2 stream's task).
//!
//! [`retirements`] is the process-wide count of retirements, with its own event: a shard's
//! upstream pool sleeps on it to close the idle connections of retired routes without being
//! touched by a request. Nothing here blocks, and nothing here knows about sockets.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use event_listener::{Event, EventListener};

/// The retirement flag of one route, shared (in an `Arc`) by the route and by the upstream
/// connections opened for it.
#[derive(Debug, Default)]
pub struct RouteRetirement {
    retired: AtomicBool,
    /// Allocated by `event_listener` on the first listen only: a route nobody streams on costs
    /// a pointer here.
    event: Event,
}

impl RouteRetirement {
    pub fn new() -> RouteRetirement {
        RouteRetirement::default()
    }

    /// Whether the route has left the serving table. One relaxed load: safe on the hot path.
    #[inline]
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// A future that completes once the route is retired (at once if it already is).
    pub fn listen(&self) -> RetirementListener<'_> {
        RetirementListener {
            retirement: self,
            listener: None,
        }
    }

    /// Marks the route retired and wakes every stream listening on it, on any shard. Idempotent.
    /// Called by the table publisher; public so tests and embedders can retire a route by hand.
    pub fn retire(&self) {
        if self.retired.swap(true, Ordering::AcqRel) {
            return;
        }
        self.event.notify(usize::MAX);
        RETIREMENTS.epoch.fetch_add(1, Ordering::AcqRel);
        RETIREMENTS.event.notify(usize::MAX);
    }
}

/// Completes when its route is retired. `Unpin`; poll it by `&mut` inside a select so that it
/// registers once and stays registered for the life of the stream.
#[derive(Debug)]
pub struct RetirementListener<'a> {
    retirement: &'a RouteRetirement,
    listener: Option<EventListener>,
}

impl Future for RetirementListener<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.retirement.is_retired() {
            return Poll::Ready(());
        }
        if this.listener.is_some() {
            // Registered with this task's waker on the first poll; `retire` wakes it.
            return Poll::Pending;
        }
        let mut listener = this.retirement.event.listen();
        // `retire` stores the flag before it notifies: a retirement that slipped in before the
        // listener was registered is seen here.
        if this.retirement.retired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        match Pin::new(&mut listener).poll(cx) {
            Poll::Ready(()) => Poll::Ready(()),
            Poll::Pending => {
                this.listener = Some(listener);
                Poll::Pending
            }
        }
    }
}

/// Process-wide: how many routes have been retired, and an event fired on each retirement.
#[derive(Debug)]
pub struct Retirements {
    epoch: AtomicU64,
    event: Event,
}

static RETIREMENTS: Retirements = Retirements {
    epoch: AtomicU64::new(0),
    event: Event::new(),
};

/// The process-wide retirement counter (for sweeping upstream pools).
pub fn retirements() -> &'static Retirements {
    &RETIREMENTS
}

impl Retirements {
    /// Retirements so far; a pool that remembers the value it last swept at knows when to sweep.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Waits until the epoch differs from `seen`, returning the new epoch.
    pub async fn changed_since(&self, seen: u64) -> u64 {
        loop {
            let now = self.epoch();
            if now != seen {
                return now;
            }
            let listener = self.event.listen();
            let now = self.epoch();
            if now != seen {
                return now;
            }
            listener.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::task::Wake;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_listener_is_woken_from_another_thread_and_then_ready() {
        let retirement = Arc::new(RouteRetirement::new());
        let woken = Arc::new(Flag(AtomicBool::new(false)));
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut listener = retirement.listen();
        assert!(Pin::new(&mut listener).poll(&mut cx).is_pending());
        assert!(Pin::new(&mut listener).poll(&mut cx).is_pending());
        let epoch = retirements().epoch();
        let other = retirement.clone();
        std::thread::spawn(move || other.retire()).join().unwrap();
        assert!(
            woken.0.load(Ordering::SeqCst),
            "the registered waker was woken"
        );
        assert!(Pin::new(&mut listener).poll(&mut cx).is_ready());
        assert!(retirements().epoch() > epoch);
        // Retiring again changes nothing, and a new listener is ready at once.
        retirement.retire();
        assert!(Pin::new(&mut retirement.listen()).poll(&mut cx).is_ready());
    }
}
