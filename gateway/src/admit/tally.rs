//! Counters shared by every shard, one set per key (a user, a cluster, a client address), made on
//! a key's first use and kept in a bounded map.
//!
//! The map is an `ArcSwap` of a hash map: a request loads it (one atomic load, no lock) and finds
//! its key's [`Counters`], whose atomics are the only memory another core also writes. A key's
//! first use copies the map with the key added (`rcu`), which is rare for users and clusters. The
//! map never holds more than its capacity: when full, the keys nothing holds (no request or
//! connection in flight, a full token bucket) are swept out, at most once a second; if it is
//! still full, a new key shares one overflow set of counters with every other such key, so a
//! stranger with many addresses (or many users' tokens) cannot grow it, and what it gets beyond
//! the bound is one share between all of them. Never blocks, never allocates for a known key.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use ahash::AHashMap;
use arc_swap::ArcSwap;

/// What one key holds now: ordinary requests (or, for an address, connections) and long-running
/// requests in flight, and its token bucket (the theoretical arrival time of GCRA, in
/// nanoseconds since the admission's epoch).
#[derive(Debug, Default)]
pub struct Counters {
    pub short: AtomicU32,
    pub long: AtomicU32,
    pub bucket: AtomicU64,
}

impl Counters {
    /// Takes one of `limit` seats of `counter` (any number when `limit` is None); false when
    /// all are taken.
    pub fn take(counter: &AtomicU32, limit: Option<u32>) -> bool {
        match limit {
            None => {
                counter.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(limit) => counter
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < limit).then_some(n + 1)
                })
                .is_ok(),
        }
    }

    /// Takes one token of a bucket refilled at `per_second` holding `burst`, at `now` (ns):
    /// `Err(ns)` is how long until one is there. GCRA: the bucket is the time at which it
    /// would be full again, so one compare-and-swap takes a token.
    pub fn take_token(&self, now: u64, per_second: f64, burst: u32) -> Result<(), u64> {
        let interval = ((1e9 / per_second) as u64).max(1);
        let window = interval.saturating_mul(u64::from(burst));
        let mut current = self.bucket.load(Ordering::Relaxed);
        loop {
            let next = current.max(now).saturating_add(interval);
            if next - now > window {
                return Err(next - window - now);
            }
            match self.bucket.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => current = seen,
            }
        }
    }
}

/// The counters of every key in use, bounded by a capacity.
pub struct Tally<K> {
    map: ArcSwap<AHashMap<K, Arc<Counters>>>,
    capacity: usize,
    /// Shared by the keys that came when the map was full of keys in use.
    overflow: Arc<Counters>,
    /// When the map was last swept (ns since the epoch).
    swept: AtomicU64,
}

/// How often a full map may be swept: a sweep walks the whole map.
const SWEEP_EVERY_NS: u64 = 1_000_000_000;

impl<K: Hash + Eq + Clone> Tally<K> {
    pub fn new(capacity: usize) -> Tally<K> {
        Tally {
            map: ArcSwap::from_pointee(AHashMap::new()),
            capacity: capacity.max(1),
            overflow: Arc::new(Counters::default()),
            swept: AtomicU64::new(0),
        }
    }

    /// The counters of `key` (made by `owned` on its first use), at `now` (ns).
    pub fn get<Q>(&self, key: &Q, owned: impl Fn() -> K, now: u64) -> Arc<Counters>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(counters) = self.map.load().get(key) {
            return counters.clone();
        }
        let mut found = None;
        self.map.rcu(|map| {
            if let Some(counters) = map.get(key) {
                found = Some(counters.clone());
                return Arc::clone(map);
            }
            let mut next = AHashMap::clone(map);
            if next.len() >= self.capacity {
                let last = self.swept.load(Ordering::Relaxed);
                if now.saturating_sub(last) >= SWEEP_EVERY_NS || last == 0 {
                    self.swept.store(now.max(1), Ordering::Relaxed);
                    // An entry only the two maps (this one and its copy) hold: no request or
                    // connection counts on it. Its bucket must be full too, or dropping it would
                    // hand its user a fresh burst.
                    next.retain(|_, c| {
                        Arc::strong_count(c) > 2 || c.bucket.load(Ordering::Relaxed) > now
                    });
                }
                if next.len() >= self.capacity {
                    found = Some(self.overflow.clone());
                    return Arc::clone(map);
                }
            }
            let counters = Arc::new(Counters::default());
            found = Some(counters.clone());
            next.insert(owned(), counters);
            Arc::new(next)
        });
        found.unwrap_or_else(|| self.overflow.clone())
    }

    /// Every key and its counters now (for the scrape).
    pub fn snapshot(&self) -> Vec<(K, Arc<Counters>)> {
        self.map
            .load()
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect()
    }

    /// Keys in the map now.
    pub fn keys(&self) -> usize {
        self.map.load().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_map_sweeps_idle_keys_and_shares_the_overflow_beyond() {
        let tally: Tally<u32> = Tally::new(2);
        let one = tally.get(&1, || 1, 10);
        let two = tally.get(&2, || 2, 10);
        assert!(Arc::ptr_eq(&one, &tally.get(&1, || 1, 10)));
        // Both held: a third key gets the overflow, and so does a fourth.
        let three = tally.get(&3, || 3, 20);
        assert!(Arc::ptr_eq(&three, &tally.get(&4, || 4, 20)));
        assert_eq!(tally.keys(), 2);
        drop((one, three));
        // Within the second since the last sweep: still the overflow.
        assert!(Arc::ptr_eq(
            &tally.get(&5, || 5, 30),
            &tally.get(&6, || 6, 30)
        ));
        // A second later key 1, held by nothing, is swept out for key 5.
        let five = tally.get(&5, || 5, 2 * SWEEP_EVERY_NS);
        assert!(!Arc::ptr_eq(&five, &two));
        assert_eq!(tally.keys(), 2);
        assert!(tally.snapshot().iter().any(|(k, _)| *k == 5));
    }

    #[test]
    fn seats_and_tokens() {
        let c = Counters::default();
        assert!(Counters::take(&c.short, Some(2)));
        assert!(Counters::take(&c.short, Some(2)));
        assert!(!Counters::take(&c.short, Some(2)));
        assert!(Counters::take(&c.long, None));
        // 2 per second, a burst of 2: two now, the third in half a second.
        let now = 5_000_000_000;
        assert!(c.take_token(now, 2.0, 2).is_ok());
        assert!(c.take_token(now, 2.0, 2).is_ok());
        assert_eq!(c.take_token(now, 2.0, 2), Err(500_000_000));
        assert!(c.take_token(now + 500_000_000, 2.0, 2).is_ok());
    }
}
