//! The tunnel listener's connections before they are authenticated: how many it holds, and whose
//! it cuts, so that strangers cannot keep an agent out (issue 31: 258 idle connections once
//! delayed every agent's handshake by 9.5 s).
//!
//! A connection counts against its source address (an IPv4 address, an IPv6 /64:
//! `admit::address_key`) from its accept until its agent is authenticated (a fleetgate agent's
//! hello answered on its shard, a konnectivity agent's Connect call taken) or it ends: at most
//! [`PER_ADDRESS`] at once. An address at its bound has its own oldest connection still in a
//! lineup below cut for the new one, so idle strangers behind an agent's NAT cannot keep it out;
//! when none of them is (all are past the lineups: a handshake on a shard, a konnectivity
//! agent's Connect call), the new one is refused.
//!
//! While the tunnel thread does not know yet what a connection is, it is in one of two lineups:
//! - as quiet (accepted, no TLS record header yet), at most [`MAX_QUIET`]: a new connection over
//!   the bound cuts the quiet one that has waited longest. A quiet connection costs a socket and a
//!   small task, no buffer, and is not a handshake;
//! - as a handshake (its first record header came: its ClientHello is being read, or a
//!   konnectivity agent's TLS handshake runs), at most [`MAX_HANDSHAKES`], each holding rustls'
//!   buffers: a connection whose header comes when all are taken cuts the one that began longest
//!   ago.
//!
//! So an accept never waits and never queues state: it is admitted or refused at once, and what
//! the tunnel thread holds is bounded. An agent sends its ClientHello as soon as it has connected,
//! so it is the newest of either lineup and leaves it within a round trip; to cut it, strangers
//! would have to open [`MAX_QUIET`] connections, or send [`MAX_HANDSHAKES`] record headers, in that
//! round trip. (Before, 256 silent connections took every handshake seat for 10 s each.)
//!
//! Plain state of one thread (the tunnel thread), no I/O and no clock: the listener cuts what it is
//! told to, through the canceller `C` each connection registered. A [`Seat`] is `Send`: a fleetgate
//! agent's goes with it to the shard that finishes its handshake (`super::handoff`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use ahash::AHashMap;

use crate::admit::address_key;

/// Connections of one address before authentication. Agents behind one NAT address each hold one
/// only for their handshake (a few round trips), so even a fleet of them reconnecting at once
/// rarely needs more; one refused dials again after its backoff.
pub const PER_ADDRESS: u32 = 32;
/// Connections that have sent nothing yet.
pub const MAX_QUIET: usize = 1024;
/// Connections whose ClientHello is being read (or a konnectivity agent's TLS handshake runs).
pub const MAX_HANDSHAKES: usize = 256;

/// The bounds a [`Pending`] keeps (the listener's are the constants above).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub per_address: u32,
    pub quiet: usize,
    pub handshakes: usize,
}

impl Limits {
    pub const LISTENER: Limits = Limits {
        per_address: PER_ADDRESS,
        quiet: MAX_QUIET,
        handshakes: MAX_HANDSHAKES,
    };
}

/// One connection counted against its address until this is dropped (it was authenticated, or
/// it ended).
#[derive(Debug)]
pub struct Seat(Arc<AtomicU32>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a connection was cut for a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Its address was at [`PER_ADDRESS`] and this was its oldest.
    Address,
    /// [`MAX_QUIET`] connections had sent nothing, and this one had waited longest.
    Quiet,
    /// [`MAX_HANDSHAKES`] were under way, and this one had begun longest ago.
    Handshakes,
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::Address => write!(
                f,
                "cut for a newer connection: its address had {PER_ADDRESS} connections before authentication and this was the oldest"
            ),
            Cut::Quiet => write!(
                f,
                "cut for a newer connection: {MAX_QUIET} connections had sent nothing and this one had waited longest"
            ),
            Cut::Handshakes => write!(
                f,
                "cut for a newer connection: {MAX_HANDSHAKES} handshakes were under way and this one had begun first"
            ),
        }
    }
}

/// A connection to cut: the listener tells it through its canceller why.
#[derive(Debug)]
pub struct Evicted<C> {
    pub id: u64,
    pub why: Cut,
    pub cut: C,
}

/// A connection admitted: its id in the lineups, its seat, and the connections cut for it.
#[derive(Debug)]
pub struct Admitted<C> {
    pub id: u64,
    pub seat: Seat,
    pub evicted: Vec<Evicted<C>>,
}

/// The connection is no longer in the lineups (it was cut).
#[derive(Debug, PartialEq, Eq)]
pub struct NotPending;

struct Entry<C> {
    address: IpAddr,
    cut: C,
}

/// Ids are given in accept order, so each lineup's first entry is its oldest.
type Lineup<C> = BTreeMap<u64, Entry<C>>;

/// The tunnel thread's connections before authentication.
pub struct Pending<C> {
    limits: Limits,
    /// Seats taken per address key; an entry no seat holds is swept out.
    addresses: AHashMap<IpAddr, Arc<AtomicU32>>,
    /// How many addresses the last sweep left (the next sweeps when the map has doubled).
    swept_to: usize,
    quiet: Lineup<C>,
    handshakes: Lineup<C>,
    next: u64,
}

impl<C> Pending<C> {
    pub fn new(limits: Limits) -> Pending<C> {
        Pending {
            limits,
            addresses: AHashMap::new(),
            swept_to: 0,
            quiet: BTreeMap::new(),
            handshakes: BTreeMap::new(),
            next: 0,
        }
    }

    /// A connection accepted from `ip`, cancelled through `cut`: admitted as quiet, with the
    /// connections to cut for it; None (refuse it) when its address's seats are all held by
    /// connections past the tunnel thread.
    pub fn arrive(&mut self, ip: IpAddr, cut: C) -> Option<Admitted<C>> {
        let address = address_key(ip);
        self.sweep();
        let seats = self.addresses.entry(address).or_default().clone();
        let mut evicted = Vec::new();
        if seats.load(Ordering::Relaxed) >= self.limits.per_address {
            // The cut one gives its seat back when its task ends, a moment later; the address
            // is over its bound by one until then.
            evicted.push(self.oldest_of(address)?);
        }
        if self.quiet.len() >= self.limits.quiet {
            evicted.extend(first(&mut self.quiet, Cut::Quiet));
        }
        seats.fetch_add(1, Ordering::Relaxed);
        let id = self.next;
        self.next += 1;
        self.quiet.insert(id, Entry { address, cut });
        Some(Admitted {
            id,
            seat: Seat(seats),
            evicted,
        })
    }

    /// Connection `id` sent its first TLS record header: it is a handshake now, and the
    /// handshake that began first is cut for it when all are taken.
    pub fn handshake(&mut self, id: u64) -> Result<Option<Evicted<C>>, NotPending> {
        let entry = self.quiet.remove(&id).ok_or(NotPending)?;
        let evicted = if self.handshakes.len() >= self.limits.handshakes {
            first(&mut self.handshakes, Cut::Handshakes)
        } else {
            None
        };
        self.handshakes.insert(id, entry);
        Ok(evicted)
    }

    /// Connection `id` leaves the lineups: authenticated, handed to a shard, refused or closed.
    /// (Its seat is its own to drop.)
    pub fn leave(&mut self, id: u64) {
        if self.quiet.remove(&id).is_none() {
            self.handshakes.remove(&id);
        }
    }

    /// Connections quiet, and handshakes, now.
    pub fn lineups(&self) -> (usize, usize) {
        (self.quiet.len(), self.handshakes.len())
    }

    /// The oldest connection of `address` still on this thread (a quiet one first: it has sent
    /// nothing), taken out of its lineup.
    fn oldest_of(&mut self, address: IpAddr) -> Option<Evicted<C>> {
        for lineup in [&mut self.quiet, &mut self.handshakes] {
            let found = lineup
                .iter()
                .find(|(_, entry)| entry.address == address)
                .map(|(id, _)| *id);
            if let Some(id) = found {
                let entry = lineup.remove(&id)?;
                return Some(Evicted {
                    id,
                    why: Cut::Address,
                    cut: entry.cut,
                });
            }
        }
        None
    }

    /// Drops the addresses no seat holds, once the map has doubled since the last sweep: the
    /// map stays within twice the addresses with connections (plus a floor), at a cost spread
    /// over the arrivals that grew it.
    fn sweep(&mut self) {
        if self.addresses.len() < (2 * self.swept_to).max(64) {
            return;
        }
        self.addresses
            .retain(|_, seats| seats.load(Ordering::Relaxed) > 0 || Arc::strong_count(seats) > 1);
        self.swept_to = self.addresses.len();
    }
}

/// The oldest entry of `lineup`, taken out of it, to be cut for `why`.
fn first<C>(lineup: &mut Lineup<C>, why: Cut) -> Option<Evicted<C>> {
    lineup.pop_first().map(|(id, entry)| Evicted {
        id,
        why,
        cut: entry.cut,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn pending(per_address: u32, quiet: usize, handshakes: usize) -> Pending<u64> {
        Pending::new(Limits {
            per_address,
            quiet,
            handshakes,
        })
    }

    fn cut_ids(admitted: &Admitted<u64>) -> Vec<(u64, Cut)> {
        admitted.evicted.iter().map(|e| (e.cut, e.why)).collect()
    }

    #[test]
    fn an_address_at_its_bound_cuts_its_own_oldest_then_is_refused() {
        let mut pending = pending(2, 100, 100);
        let a1 = pending.arrive(ip("10.0.0.1"), 1).unwrap();
        let other = pending.arrive(ip("10.0.0.2"), 2).unwrap();
        let a2 = pending.arrive(ip("10.0.0.1"), 3).unwrap();
        assert!(cut_ids(&a2).is_empty());
        // The third of 10.0.0.1 cuts its first (quiet), not the other address's older one.
        let a3 = pending.arrive(ip("10.0.0.1"), 4).unwrap();
        assert_eq!(cut_ids(&a3), [(1, Cut::Address)]);
        assert!(matches!(pending.handshake(a1.id), Err(NotPending)));
        drop(a1);
        // Its quiet ones gone to handshakes: the oldest handshake of the address is cut next.
        pending.handshake(a2.id).unwrap();
        pending.handshake(a3.id).unwrap();
        let a4 = pending.arrive(ip("10.0.0.1"), 5).unwrap();
        assert_eq!(cut_ids(&a4), [(3, Cut::Address)]);
        drop(a2);
        // a3 and a4 handed to shards (out of the lineups, seats held): nothing of the address
        // is left to cut, so a new one is refused until a seat is given back.
        pending.leave(a3.id);
        pending.handshake(a4.id).unwrap();
        pending.leave(a4.id);
        assert!(pending.arrive(ip("10.0.0.1"), 6).is_none());
        drop(a3);
        let a5 = pending.arrive(ip("10.0.0.1"), 7).unwrap();
        assert!(cut_ids(&a5).is_empty());
        // The other address was never touched.
        assert_eq!(pending.lineups(), (2, 0));
        drop(other);
    }

    #[test]
    fn an_ipv6_64_is_one_address() {
        let mut pending = pending(1, 100, 100);
        let _first = pending.arrive(ip("2001:db8:1:2::1"), 1).unwrap();
        let second = pending.arrive(ip("2001:db8:1:2:ffff::9"), 2).unwrap();
        assert_eq!(cut_ids(&second), [(1, Cut::Address)]);
        let elsewhere = pending.arrive(ip("2001:db8:1:3::1"), 3).unwrap();
        assert!(cut_ids(&elsewhere).is_empty());
    }

    #[test]
    fn full_lineups_cut_their_oldest() {
        let mut pending = pending(100, 3, 2);
        let seats: Vec<_> = (0..3)
            .map(|i| pending.arrive(ip("10.0.0.1"), i).unwrap())
            .collect();
        // A fourth quiet one cuts the first.
        let fourth = pending.arrive(ip("10.0.0.2"), 3).unwrap();
        assert_eq!(cut_ids(&fourth), [(0, Cut::Quiet)]);
        // Handshakes are not quiet: two of them leave room for two more quiet ones.
        assert_eq!(pending.handshake(seats[1].id).unwrap().map(|e| e.id), None);
        assert_eq!(pending.handshake(seats[2].id).unwrap().map(|e| e.id), None);
        assert!(cut_ids(&pending.arrive(ip("10.0.0.3"), 4).unwrap()).is_empty());
        // A third handshake cuts the one that began first.
        let cut = pending.handshake(fourth.id).unwrap().unwrap();
        assert_eq!((cut.cut, cut.why), (1, Cut::Handshakes));
        assert_eq!(pending.lineups(), (1, 2));
        // Leaving frees a seat in its lineup.
        pending.leave(seats[2].id);
        assert_eq!(pending.lineups(), (1, 1));
    }

    #[test]
    fn addresses_without_connections_are_swept() {
        let mut pending = Pending::new(Limits::LISTENER);
        let held = pending.arrive(ip("192.0.2.1"), 0).unwrap();
        for i in 0..10_000u32 {
            let [_, _, a, b] = i.to_be_bytes();
            let admitted = pending.arrive(IpAddr::from([10, 1, a, b]), 1).unwrap();
            pending.leave(admitted.id);
        }
        assert!(
            pending.addresses.len() <= 128,
            "{}",
            pending.addresses.len()
        );
        // The held one's count survived the sweeps.
        assert_eq!(
            pending.addresses[&ip("192.0.2.1")].load(Ordering::Relaxed),
            1
        );
        drop(held);
    }
}
