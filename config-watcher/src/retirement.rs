//! Retiring routes: how the data path learns that a [`ClusterRoute`](crate::ClusterRoute) it
//! holds is no longer in the serving table (its cluster was removed, or its spec changed and a
//! route with a new `id` replaced it), so that streams opened on it end cleanly and pooled
//! connections made for it are closed.
//!
//! Every route carries one [`RouteRetirement`]; the [`TablePublisher`](crate::TablePublisher)
//! retires the routes a new table does not carry over, on the source's thread. Shards see it in
//! two ways: a relaxed atomic load ([`RouteRetirement::is_retired`], cheap enough for every chunk)
//! and a [`RetirementListener`] future that an idle stream (a watch waiting for its next event, an
//! exec session at a prompt) selects on, woken across threads. A listener registers its waker
//! once, on its first pending poll, and afterwards costs one atomic load per poll: no lock and no
//! allocation per chunk. This relies on the listener being polled by one task for its whole life
//! (true of a shard's connection task and of an h2 stream's task).
//!
//! [`retirements`] is the process-wide count of retirements, with its own waiters: a shard's
//! upstream pool sleeps on it to close the idle connections of retired routes without being
//! touched by a request. Nothing here blocks, and nothing here knows about sockets.
//!
//! The waiters are a small list of our own (`Waiters`), not a notify that wakes under its
//! lock: a retirement takes the wakers out under the lock and wakes them after releasing it.
//! Waking the waker of a shard whose runtime died can drop that shard's task, and with it a
//! listener, on the retiring thread; the listener's drop takes the same lock to unregister, so a
//! wake under the lock would deadlock the table publisher.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// The retirement flag of one route, shared (in an `Arc`) by the route and by the upstream
/// connections opened for it.
#[derive(Debug, Default)]
pub struct RouteRetirement {
    retired: AtomicBool,
    /// The listeners' wakers: an empty list (no allocation) while nobody streams on the route.
    waiters: Waiters,
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
            registration: None,
        }
    }

    /// Marks the route retired and wakes every stream listening on it, on any shard. Idempotent.
    /// Called by the table publisher; public so tests and embedders can retire a route by hand.
    pub fn retire(&self) {
        if self.retired.swap(true, Ordering::AcqRel) {
            return;
        }
        // The flag is stored before the waiters' lock is taken: a listener that registers after
        // this wake took the wakers out sees the flag when it checks again (see `poll`).
        self.waiters.wake_all();
        RETIREMENTS.epoch.fetch_add(1, Ordering::AcqRel);
        RETIREMENTS.waiters.wake_all();
    }
}

/// Completes when its route is retired. `Unpin`; poll it by `&mut` inside a select so that it
/// registers once and stays registered for the life of the stream.
#[derive(Debug)]
pub struct RetirementListener<'a> {
    retirement: &'a RouteRetirement,
    /// Unregisters on drop, on whichever thread drops the listener.
    registration: Option<Registration<'a>>,
}

impl Future for RetirementListener<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.retirement.is_retired() {
            return Poll::Ready(());
        }
        if this.registration.is_some() {
            // Registered with this task's waker on the first poll; `retire` wakes it.
            return Poll::Pending;
        }
        let registration = this.retirement.waiters.register(cx.waker());
        // `retire` stores the flag before it takes the waiters' lock, and registering took that
        // lock: a retirement that took the wakers out before this one was in is seen here.
        if this.retirement.retired.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        this.registration = Some(registration);
        Poll::Pending
    }
}

/// Process-wide: how many routes have been retired, and the wakers waiting for the next one.
#[derive(Debug)]
pub struct Retirements {
    epoch: AtomicU64,
    waiters: Waiters,
}

static RETIREMENTS: Retirements = Retirements {
    epoch: AtomicU64::new(0),
    waiters: Waiters::new(),
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

    /// Waits until the epoch differs from `seen`, returning the new epoch. Registered from its
    /// first pending poll until it completes or is dropped (which may happen on any thread).
    pub async fn changed_since(&self, seen: u64) -> u64 {
        let mut registration: Option<Registration<'_>> = None;
        std::future::poll_fn(move |cx| {
            let now = self.epoch();
            if now != seen {
                return Poll::Ready(now);
            }
            match &registration {
                Some(registration) => registration.rearm(cx.waker()),
                None => registration = Some(self.waiters.register(cx.waker())),
            }
            // As in `RetirementListener::poll`: the epoch moves before the wakers are taken.
            let now = self.epoch();
            if now != seen {
                return Poll::Ready(now);
            }
            Poll::Pending
        })
        .await
    }
}

/// Wakers waiting for one kind of event (a route's retirement, any retirement). Each waiter owns
/// a slot from [`Waiters::register`] until its [`Registration`] drops; [`Waiters::wake_all`]
/// takes the wakers out of the slots under the lock and wakes them after releasing it, and no
/// waker is dropped under the lock either, so a wake or a drop that unregisters or registers
/// (on this or another list) never waits for a lock its own thread holds.
#[derive(Debug, Default)]
struct Waiters {
    list: Mutex<WaiterList>,
}

#[derive(Debug, Default)]
struct WaiterList {
    slots: Vec<Slot>,
    /// The first free slot; each free slot names the next.
    free: Option<usize>,
    /// Slots owned by a registration. At 0 the slots are let go: nothing stays allocated once
    /// the last listener has gone.
    held: usize,
}

#[derive(Debug)]
enum Slot {
    Free {
        next: Option<usize>,
    },
    /// A registration's; the waker is taken out by a wake and put back by a rearm.
    Held(Option<Waker>),
}

/// A waiter's slot in its [`Waiters`], given up on drop.
#[derive(Debug)]
struct Registration<'a> {
    waiters: &'a Waiters,
    slot: usize,
}

impl Waiters {
    const fn new() -> Waiters {
        Waiters {
            list: Mutex::new(WaiterList {
                slots: Vec::new(),
                free: None,
                held: 0,
            }),
        }
    }

    /// The list; a panic elsewhere never leaves it half changed (no user code runs under it).
    fn lock(&self) -> MutexGuard<'_, WaiterList> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `waker` until the next [`Waiters::wake_all`] or until the registration drops.
    fn register(&self, waker: &Waker) -> Registration<'_> {
        let waker = Some(waker.clone());
        let mut list = self.lock();
        list.held += 1;
        let slot = match list.free {
            Some(slot) => {
                let Slot::Free { next } = list.slots[slot] else {
                    unreachable!("the free chain names free slots only")
                };
                list.free = next;
                list.slots[slot] = Slot::Held(waker);
                slot
            }
            None => {
                list.slots.push(Slot::Held(waker));
                list.slots.len() - 1
            }
        };
        Registration {
            waiters: self,
            slot,
        }
    }

    /// Wakes every registered waker once, outside the lock.
    fn wake_all(&self) {
        let wakers: Vec<Waker> = {
            let mut list = self.lock();
            if list.held == 0 {
                return;
            }
            let mut wakers = Vec::with_capacity(list.held);
            for slot in &mut list.slots {
                if let Slot::Held(waker) = slot {
                    wakers.extend(waker.take());
                }
            }
            wakers
        };
        for waker in wakers {
            waker.wake();
        }
    }

    /// Registrations held now (the tests' view).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().held
    }

    /// Whether the list holds no slot, not even a free one.
    #[cfg(test)]
    fn is_let_go(&self) -> bool {
        self.lock().slots.capacity() == 0
    }
}

impl Registration<'_> {
    /// Puts `waker` in this registration's slot (again, after a wake took the last one out).
    fn rearm(&self, waker: &Waker) {
        let replaced = {
            let mut list = self.waiters.lock();
            let Slot::Held(held) = &mut list.slots[self.slot] else {
                unreachable!("a registration holds its slot until it drops")
            };
            if held.as_ref().is_some_and(|held| held.will_wake(waker)) {
                return;
            }
            held.replace(waker.clone())
        };
        drop(replaced);
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let (waker, slots) = {
            let mut list = self.waiters.lock();
            let next = list.free;
            let Slot::Held(waker) =
                std::mem::replace(&mut list.slots[self.slot], Slot::Free { next })
            else {
                unreachable!("a registration holds its slot until it drops")
            };
            list.free = Some(self.slot);
            list.held -= 1;
            let slots = if list.held == 0 {
                list.free = None;
                std::mem::take(&mut list.slots)
            } else {
                Vec::new()
            };
            (waker, slots)
        };
        // Outside the lock: dropping a waker may drop its task.
        drop(waker);
        drop(slots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::any::Any;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn flag() -> (Arc<Flag>, Waker) {
        let woken = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(woken.clone());
        (woken, waker)
    }

    /// Runs `f` on a thread of its own and waits for it to return; a deadlock fails the test
    /// instead of hanging it.
    fn returns_on_another_thread(what: &str, f: impl FnOnce() + Send + 'static) {
        let (returned, has_returned) = mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = returned.send(());
        });
        // Bounds a failure only: a working call returns at once.
        has_returned
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{what} returned"));
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

    /// The waker of a task on a shard whose runtime died: waking it drops the task, and with it
    /// what the task held (a listener of the route, a wait for any retirement), on the retiring
    /// thread. It also registers and drops a wait of its own there.
    struct DropsTaskOnWake {
        task: std::sync::Mutex<Option<Box<dyn Any + Send>>>,
        woken: AtomicBool,
    }

    impl Wake for DropsTaskOnWake {
        fn wake(self: Arc<Self>) {
            let task = self.task.lock().unwrap().take();
            drop(task);
            let mut again = Box::pin(retirements().changed_since(retirements().epoch()));
            let _ = again.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            drop(again);
            self.woken.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wake_that_drops_its_listener_does_not_block_the_retirement() {
        // 'static, as a shard task's borrow of its route is (the task holds the route).
        let route: &'static RouteRetirement = Box::leak(Box::new(RouteRetirement::new()));
        let dead_shard = || {
            let dead = Arc::new(DropsTaskOnWake {
                task: std::sync::Mutex::new(None),
                woken: AtomicBool::new(false),
            });
            let waker = Waker::from(dead.clone());
            (dead, waker)
        };
        // A stream's task, listening on the route.
        let (streaming, waker) = dead_shard();
        let mut listener = route.listen();
        assert!(Pin::new(&mut listener)
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        *streaming.task.lock().unwrap() = Some(Box::new(listener));
        // A pool's sweeper task, waiting for any retirement (another test's may wake it first).
        let (sweeping, waker) = dead_shard();
        let mut wait = Box::pin(retirements().changed_since(retirements().epoch()));
        if wait
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
        {
            *sweeping.task.lock().unwrap() = Some(Box::new(wait));
        } else {
            sweeping.woken.store(true, Ordering::SeqCst);
        }
        let dead_shards = [streaming, sweeping];
        assert_eq!(route.waiters.held(), 1);
        returns_on_another_thread("retire()", move || route.retire());
        for dead in &dead_shards {
            assert!(dead.woken.load(Ordering::SeqCst));
            assert!(dead.task.lock().unwrap().is_none(), "the task was dropped");
        }
        assert!(route.waiters.is_let_go(), "nothing left of the listeners");
    }

    /// Wakes its thread.
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    #[test]
    fn one_retirement_wakes_every_listener_on_every_thread() {
        const THREADS: usize = 8;
        const LISTENERS: usize = 16;
        let route = Arc::new(RouteRetirement::new());
        let (registered, all_registered) = mpsc::channel();
        let (ended, all_ended) = mpsc::channel();
        for _ in 0..THREADS {
            let route = route.clone();
            let registered = registered.clone();
            let ended = ended.clone();
            std::thread::spawn(move || {
                let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
                let mut cx = Context::from_waker(&waker);
                let mut listeners: Vec<_> = (0..LISTENERS).map(|_| route.listen()).collect();
                for listener in &mut listeners {
                    assert!(Pin::new(listener).poll(&mut cx).is_pending());
                }
                registered.send(()).unwrap();
                while !listeners.is_empty() {
                    listeners.retain_mut(|listener| Pin::new(listener).poll(&mut cx).is_pending());
                    if !listeners.is_empty() {
                        std::thread::park();
                    }
                }
                ended.send(()).unwrap();
            });
        }
        for _ in 0..THREADS {
            all_registered.recv().unwrap();
        }
        assert_eq!(route.waiters.held(), THREADS * LISTENERS);
        let retiring = route.clone();
        returns_on_another_thread("retire()", move || retiring.retire());
        for _ in 0..THREADS {
            all_ended
                .recv_timeout(Duration::from_secs(30))
                .expect("every thread's listeners completed");
        }
        assert!(route.waiters.is_let_go());
    }

    #[test]
    fn a_listener_dropped_before_the_retirement_is_not_woken_and_leaves_nothing() {
        let route = RouteRetirement::new();
        let (gone, gone_waker) = flag();
        let (kept, kept_waker) = flag();
        let mut gone_listener = route.listen();
        assert!(Pin::new(&mut gone_listener)
            .poll(&mut Context::from_waker(&gone_waker))
            .is_pending());
        let mut kept_listener = route.listen();
        assert!(Pin::new(&mut kept_listener)
            .poll(&mut Context::from_waker(&kept_waker))
            .is_pending());
        drop(gone_listener);
        assert_eq!(route.waiters.held(), 1);
        route.retire();
        assert!(
            !gone.0.load(Ordering::SeqCst),
            "a dropped listener is not woken"
        );
        assert!(kept.0.load(Ordering::SeqCst));
        assert!(Pin::new(&mut kept_listener)
            .poll(&mut Context::from_waker(&kept_waker))
            .is_ready());
        drop(kept_listener);
        assert!(route.waiters.is_let_go(), "nothing left of the listeners");
        // A route nobody listened on never allocates for listeners.
        let quiet = RouteRetirement::new();
        quiet.retire();
        assert!(quiet.waiters.is_let_go());
    }

    #[test]
    fn a_wait_for_any_retirement_ends_at_the_next_one() {
        let route = RouteRetirement::new();
        let (woken, waker) = flag();
        let mut cx = Context::from_waker(&waker);
        let seen = retirements().epoch();
        let mut wait = Box::pin(retirements().changed_since(seen));
        // Other tests retire routes meanwhile: the wait may end on theirs.
        if wait.as_mut().poll(&mut cx).is_pending() {
            route.retire();
            assert!(woken.0.load(Ordering::SeqCst));
        }
        match wait.as_mut().poll(&mut cx) {
            Poll::Ready(now) => assert!(now > seen),
            Poll::Pending => panic!("the wait ended"),
        }
    }
}
