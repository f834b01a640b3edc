//! The line for new member connections: at most [`MAX_DIALS_PER_ENDPOINT`] dials in flight to one
//! endpoint from one shard, and the requests beyond that waiting in line (first come, first
//! served) for the next connection, be it one a dial opens or one a finished request gives back
//! to the pool.
//!
//! Why: an h2 client can open streams far faster than it lets them live (a MadeYouReset flood has
//! about 1,000 streams reset by the gateway before the connection's GOAWAY, a rapid-reset flood
//! more). A dial per stream is a burst of SYNs that overflows the member's accept queue, and every
//! other user's new connection to that member then waits for a SYN retransmit (1 s). Through the
//! line, the flood costs the member a few dials per shard, and their connections serve whoever
//! waits next.
//!
//! A dial, once started, is not any one request's: it runs to its end (bounded by the connect
//! timeout) even if the request that started it is gone, and what it opens goes to the first in
//! line, or to the pool when nobody waits. A request that leaves the line (its h2 stream reset,
//! its connect deadline passed) leaves nothing behind: its place is gone at once, and a
//! connection handed to it but not yet taken goes on to the next in line. A dial starts only when
//! more requests wait than dials are in flight, so requests that left before their turn cost the
//! member nothing.
//!
//! Per shard: `Rc` and `RefCell`, never a lock. Generic over the key, the connection and the
//! dial's error, and free of the runtime (the pool spawns the dials), so it is tested without
//! sockets. Used by `pool`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use ahash::AHashMap;

/// Dials in flight to one member endpoint from one shard. Small: enough to open connections for a
/// burst of real requests quickly (each dial serves the next in line, and each finished request
/// gives its connection to the next too), few enough that a flood of streams is a handful of SYNs
/// for the member, not an accept-queue overflow. A constant, not a setting: it bounds a burst,
/// not a member's capacity (that is `spec.fairness`'s).
pub const MAX_DIALS_PER_ENDPOINT: usize = 4;

/// Where a connection goes that nobody in line takes: the idle pool.
type Shelf<C> = Box<dyn Fn(C)>;

/// The dials in flight and the requests waiting, per endpoint, on one shard.
pub struct Dials<K, C, E> {
    limit: usize,
    endpoints: RefCell<AHashMap<K, Endpoint<C, E>>>,
    shelf: Shelf<C>,
}

/// One endpoint's dials and line. Dropped from the map once neither has anything.
struct Endpoint<C, E> {
    dialing: usize,
    line: VecDeque<Rc<Place<C, E>>>,
}

/// One request's place in line.
struct Place<C, E> {
    /// Only a connection nobody has used will do: an upgrade (its connection is never pooled) or
    /// the retry of a request whose pooled connection the member had closed.
    fresh: bool,
    state: RefCell<PlaceState<C, E>>,
}

enum PlaceState<C, E> {
    Waiting(Option<Waker>),
    /// Served, not yet taken; `bool`: nobody has used the connection.
    Served(Result<C, E>, bool),
    Taken,
}

/// A place taken in line, and the dial the caller must start for it, if one.
pub struct Joined<K: Hash + Eq + Clone, C, E> {
    pub waiting: Waiting<K, C, E>,
    pub dial: Option<DialSlot<K, C, E>>,
}

/// What a finished dial's task does next.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterDial {
    /// More wait than the other dials will serve: dial again (the slot stays taken).
    DialAgain,
    Done,
}

impl<K: Hash + Eq + Clone, C, E> Dials<K, C, E> {
    /// A line allowing `limit` dials per endpoint; connections nobody waits for go to `shelf`.
    pub fn new(limit: usize, shelf: impl Fn(C) + 'static) -> Rc<Self> {
        Rc::new(Dials {
            limit: limit.max(1),
            endpoints: RefCell::new(AHashMap::new()),
            shelf: Box::new(shelf),
        })
    }

    /// Takes a place in `key`'s line. With a [`Joined::dial`], the caller must start a dial and
    /// report its outcome with [`DialSlot::finish`]; the place is served by whichever dial or
    /// returned connection comes first, in line order.
    pub fn join(self: &Rc<Self>, key: K, fresh: bool) -> Joined<K, C, E> {
        let place = Rc::new(Place {
            fresh,
            state: RefCell::new(PlaceState::Waiting(None)),
        });
        let mut endpoints = self.endpoints.borrow_mut();
        let endpoint = endpoints.entry(key.clone()).or_insert_with(|| Endpoint {
            dialing: 0,
            line: VecDeque::new(),
        });
        endpoint.line.push_back(place.clone());
        // A dial only for a request the dials in flight will not serve.
        let dial = endpoint.line.len() > endpoint.dialing && endpoint.dialing < self.limit;
        if dial {
            endpoint.dialing += 1;
        }
        drop(endpoints);
        let dial = dial.then(|| DialSlot {
            dials: self.clone(),
            key: Some(key.clone()),
        });
        let waiting = Waiting {
            dials: self.clone(),
            key,
            place: Some(place),
        };
        Joined { waiting, dial }
    }

    /// Whether any endpoint has a dial in flight or a request in line (one borrow: the pool asks
    /// before every [`Dials::offer`]).
    pub fn busy(&self) -> bool {
        !self.endpoints.borrow().is_empty()
    }

    /// Hands a connection a finished request gave back to the first in `key`'s line that takes a
    /// used one; gives it back when nobody does.
    pub fn offer(&self, key: &K, conn: C) -> Option<C> {
        let mut endpoints = self.endpoints.borrow_mut();
        let Some(endpoint) = endpoints.get_mut(key) else {
            return Some(conn);
        };
        let unserved = serve(endpoint, Ok(conn), false).err();
        forget_if_idle(&mut endpoints, key);
        unserved.and_then(Result::ok)
    }

    /// Dials in flight and places in line for `key`.
    #[cfg(test)]
    pub fn load(&self, key: &K) -> (usize, usize) {
        self.endpoints
            .borrow()
            .get(key)
            .map_or((0, 0), |e| (e.dialing, e.line.len()))
    }

    /// A dial to `key` ended with `result`: to the first in line, or to the shelf.
    fn dialed(&self, key: &K, result: Result<C, E>) -> AfterDial {
        let mut endpoints = self.endpoints.borrow_mut();
        let Some(endpoint) = endpoints.get_mut(key) else {
            // Only after a bug: every dial holds its endpoint's entry.
            drop(endpoints);
            if let Ok(conn) = result {
                (self.shelf)(conn);
            }
            return AfterDial::Done;
        };
        let unserved = serve(endpoint, result, true).err();
        let others = endpoint.dialing - 1;
        let next = if endpoint.line.len() > others {
            AfterDial::DialAgain
        } else {
            endpoint.dialing = others;
            forget_if_idle(&mut endpoints, key);
            AfterDial::Done
        };
        drop(endpoints);
        if let Some(Ok(conn)) = unserved {
            (self.shelf)(conn);
        }
        next
    }

    /// A dial's slot given up without an outcome (its task dropped).
    fn release(&self, key: &K) {
        let mut endpoints = self.endpoints.borrow_mut();
        if let Some(endpoint) = endpoints.get_mut(key) {
            endpoint.dialing -= 1;
            forget_if_idle(&mut endpoints, key);
        }
    }

    /// `place` leaves `key`'s line without being served.
    fn leave(&self, key: &K, place: &Rc<Place<C, E>>) {
        let mut endpoints = self.endpoints.borrow_mut();
        if let Some(endpoint) = endpoints.get_mut(key) {
            endpoint.line.retain(|p| !Rc::ptr_eq(p, place));
            forget_if_idle(&mut endpoints, key);
        }
    }

    /// A connection served to a place whose request left before taking it: to the next in line,
    /// or to the shelf.
    fn pass_on(&self, key: &K, conn: C, unused: bool) {
        let mut endpoints = self.endpoints.borrow_mut();
        let unserved = match endpoints.get_mut(key) {
            Some(endpoint) => serve(endpoint, Ok(conn), unused).err(),
            None => Some(Ok(conn)),
        };
        forget_if_idle(&mut endpoints, key);
        drop(endpoints);
        if let Some(Ok(conn)) = unserved {
            (self.shelf)(conn);
        }
    }
}

/// Serves `result` to the first place in `endpoint`'s line that takes it (any place when the
/// connection is `unused`, or for an error; else the first that does not need a fresh one), and
/// wakes it. Gives `result` back when no place takes it.
fn serve<C, E>(
    endpoint: &mut Endpoint<C, E>,
    result: Result<C, E>,
    unused: bool,
) -> Result<(), Result<C, E>> {
    let takes = |p: &Rc<Place<C, E>>| unused || result.is_err() || !p.fresh;
    let Some(index) = endpoint.line.iter().position(takes) else {
        return Err(result);
    };
    let place = endpoint
        .line
        .remove(index)
        .expect("position is in the line");
    let before = std::mem::replace(
        &mut *place.state.borrow_mut(),
        PlaceState::Served(result, unused),
    );
    if let PlaceState::Waiting(Some(waker)) = before {
        waker.wake();
    }
    Ok(())
}

/// Drops `key`'s entry once it has no dial and no place.
fn forget_if_idle<K: Hash + Eq, C, E>(endpoints: &mut AHashMap<K, Endpoint<C, E>>, key: &K) {
    if endpoints
        .get(key)
        .is_some_and(|e| e.dialing == 0 && e.line.is_empty())
    {
        endpoints.remove(key);
    }
}

/// One dial in flight: report its outcome with [`DialSlot::finish`]. Dropped without one (its
/// task ended early), it gives the slot back.
pub struct DialSlot<K: Hash + Eq + Clone, C, E> {
    dials: Rc<Dials<K, C, E>>,
    /// None once finished.
    key: Option<K>,
}

impl<K: Hash + Eq + Clone, C, E> DialSlot<K, C, E> {
    /// The dial ended with `result` (to the first in line, or the pool). With
    /// [`AfterDial::DialAgain`] the slot is still held: dial again and finish again.
    pub fn finish(&mut self, result: Result<C, E>) -> AfterDial {
        let Some(key) = &self.key else {
            return AfterDial::Done;
        };
        let next = self.dials.dialed(key, result);
        if next == AfterDial::Done {
            self.key = None;
        }
        next
    }
}

impl<K: Hash + Eq + Clone, C, E> Drop for DialSlot<K, C, E> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.dials.release(&key);
        }
    }
}

/// A place in line: resolves to the connection (or a dial's error) served to it. Dropped before
/// that, it leaves the line; dropped after being served but before being polled, it passes the
/// connection on.
pub struct Waiting<K: Hash + Eq + Clone, C, E> {
    dials: Rc<Dials<K, C, E>>,
    key: K,
    /// None once the outcome was taken.
    place: Option<Rc<Place<C, E>>>,
}

// Nothing in it is pinned: the place is behind an `Rc`.
impl<K: Hash + Eq + Clone, C, E> Unpin for Waiting<K, C, E> {}

impl<K: Hash + Eq + Clone, C, E> Future for Waiting<K, C, E> {
    type Output = Result<C, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(place) = &this.place else {
            return Poll::Pending;
        };
        let mut state = place.state.borrow_mut();
        match std::mem::replace(&mut *state, PlaceState::Taken) {
            PlaceState::Served(result, _) => {
                drop(state);
                this.place = None;
                Poll::Ready(result)
            }
            PlaceState::Waiting(_) | PlaceState::Taken => {
                *state = PlaceState::Waiting(Some(cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}

impl<K: Hash + Eq + Clone, C, E> Drop for Waiting<K, C, E> {
    fn drop(&mut self) {
        let Some(place) = self.place.take() else {
            return;
        };
        let state = std::mem::replace(&mut *place.state.borrow_mut(), PlaceState::Taken);
        match state {
            PlaceState::Waiting(_) => self.dials.leave(&self.key, &place),
            PlaceState::Served(Ok(conn), unused) => self.dials.pass_on(&self.key, conn, unused),
            PlaceState::Served(Err(_), _) | PlaceState::Taken => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    type TestDials = Dials<u32, &'static str, &'static str>;
    type TestWaiting = Waiting<u32, &'static str, &'static str>;
    type TestSlot = DialSlot<u32, &'static str, &'static str>;
    type Shelved = Rc<RefCell<Vec<&'static str>>>;

    /// A line with a limit of 2, its shelf recorded.
    fn line() -> (Rc<TestDials>, Shelved) {
        let shelved = Rc::new(RefCell::new(Vec::new()));
        let shelf = shelved.clone();
        (Dials::new(2, move |c| shelf.borrow_mut().push(c)), shelved)
    }

    /// A place in `key`'s line, and the dial to start for it.
    fn join(dials: &Rc<TestDials>, key: u32, fresh: bool) -> (TestWaiting, Option<TestSlot>) {
        let joined = dials.join(key, fresh);
        (joined.waiting, joined.dial)
    }

    /// Polls once with a waker nobody listens to.
    fn poll<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn dials_stop_at_the_limit_and_each_serves_the_first_in_line() {
        let (dials, shelved) = line();
        let mut waiting = Vec::new();
        let mut slots = Vec::new();
        for _ in 0..5 {
            let (w, slot) = join(&dials, 1, false);
            waiting.push(w);
            slots.extend(slot);
        }
        assert_eq!(slots.len(), 2, "five requests, two dials");
        assert_eq!(dials.load(&1), (2, 5));
        for w in &mut waiting {
            assert!(poll(w).is_pending());
        }
        // The first dial serves the first request, and more still wait than one dial serves.
        assert_eq!(slots[0].finish(Ok("a")), AfterDial::DialAgain);
        assert_eq!(poll(&mut waiting[0]), Poll::Ready(Ok("a")));
        assert!(poll(&mut waiting[1]).is_pending());
        // A failed dial answers the next in line with its error (as a dial of its own would).
        assert_eq!(slots[1].finish(Err("refused")), AfterDial::DialAgain);
        assert_eq!(poll(&mut waiting[1]), Poll::Ready(Err("refused")));
        // A connection a request gave back goes to the next in line, before any dial.
        assert_eq!(dials.offer(&1, "returned"), None);
        assert_eq!(poll(&mut waiting[2]), Poll::Ready(Ok("returned")));
        assert_eq!(dials.load(&1), (2, 2));
        assert_eq!(
            slots[0].finish(Ok("b")),
            AfterDial::Done,
            "one left, one dial for it"
        );
        assert_eq!(slots[1].finish(Ok("c")), AfterDial::Done);
        assert_eq!(poll(&mut waiting[3]), Poll::Ready(Ok("b")));
        assert_eq!(poll(&mut waiting[4]), Poll::Ready(Ok("c")));
        assert!(shelved.borrow().is_empty());
        assert_eq!(dials.load(&1), (0, 0));
        assert!(!dials.busy(), "nothing is left of the endpoint");
    }

    #[test]
    fn a_request_that_leaves_gives_up_its_place_and_causes_no_dial() {
        let (dials, shelved) = line();
        let (first, slot) = join(&dials, 1, false);
        let mut slot = slot.expect("the first request dials");
        let (second, second_slot) = join(&dials, 1, false);
        assert!(second_slot.is_some(), "the second dials too");
        let (third, none) = join(&dials, 1, false);
        assert!(none.is_none(), "two dials for three");
        let (mut fourth, none) = join(&dials, 1, false);
        assert!(none.is_none(), "two dials for four");
        assert_eq!(dials.load(&1).0, 2);
        // Three streams reset before their turn: their places go at once.
        drop(first);
        drop(second);
        drop(third);
        assert_eq!(dials.load(&1), (2, 1));
        // The first dial serves the one left; the other then serves nobody: no new dial starts.
        assert_eq!(slot.finish(Ok("a")), AfterDial::Done);
        assert_eq!(poll(&mut fourth), Poll::Ready(Ok("a")));
        assert!(shelved.borrow().is_empty());
        // A request joining now is covered by the dial still in flight.
        let (mut fifth, none) = join(&dials, 1, false);
        assert!(none.is_none(), "a dial is already in flight for it");
        assert!(poll(&mut fifth).is_pending());
        drop(second_slot);
        assert_eq!(dials.load(&1), (0, 1));
    }

    #[test]
    fn a_connection_nobody_waits_for_goes_to_the_shelf() {
        let (dials, shelved) = line();
        let (waiting, slot) = join(&dials, 1, false);
        let mut slot = slot.unwrap();
        drop(waiting);
        assert_eq!(slot.finish(Ok("a")), AfterDial::Done);
        assert_eq!(
            *shelved.borrow(),
            ["a"],
            "the dial's connection is kept, not thrown away"
        );
        assert_eq!(
            dials.offer(&1, "b"),
            Some("b"),
            "nobody waits: back to the caller"
        );
        assert!(!dials.busy());
    }

    #[test]
    fn a_connection_served_but_not_taken_goes_to_the_next_in_line() {
        let (dials, shelved) = line();
        let (first, slot) = join(&dials, 1, false);
        let mut slot = slot.unwrap();
        let (mut second, second_slot) = join(&dials, 1, false);
        drop(second_slot);
        assert_eq!(slot.finish(Ok("a")), AfterDial::DialAgain);
        // The first request's stream was reset after the connection was handed to it.
        drop(first);
        assert_eq!(poll(&mut second), Poll::Ready(Ok("a")));
        // Served and dropped with nobody behind: to the shelf.
        let (third, _) = join(&dials, 1, false);
        assert_eq!(slot.finish(Ok("b")), AfterDial::Done);
        drop(third);
        assert_eq!(*shelved.borrow(), ["b"]);
        assert!(!dials.busy());
    }

    #[test]
    fn a_request_needing_a_fresh_connection_is_not_given_a_used_one() {
        let (dials, _) = line();
        let (mut upgrade, slot) = join(&dials, 1, true);
        let mut slot = slot.unwrap();
        let (mut plain, plain_slot) = join(&dials, 1, false);
        drop(plain_slot);
        // A used connection skips the upgrade and goes to the plain request behind it.
        assert_eq!(dials.offer(&1, "used"), None);
        assert_eq!(poll(&mut plain), Poll::Ready(Ok("used")));
        assert!(poll(&mut upgrade).is_pending());
        assert_eq!(slot.finish(Ok("new")), AfterDial::Done);
        assert_eq!(poll(&mut upgrade), Poll::Ready(Ok("new")));
    }

    #[test]
    fn a_dial_dropped_without_an_outcome_gives_its_slot_back() {
        let (dials, _) = line();
        let (waiting, slot) = join(&dials, 1, false);
        drop(slot);
        assert_eq!(dials.load(&1), (0, 1));
        drop(waiting);
        assert!(!dials.busy());
        // Endpoints are apart: another key has its own dials.
        let (_a, slot_a) = join(&dials, 1, false);
        let (_b, slot_b) = join(&dials, 2, false);
        assert!(slot_a.is_some() && slot_b.is_some());
    }
}
