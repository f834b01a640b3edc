//! The one backoff: how long to wait after a failure before trying again. Exponential from a
//! first delay, doubled per failure up to a cap; jittered (each delay drawn from
//! `[step * (1 - jitter), step)`), so that peers that failed together do not all come back in
//! the same instant; and reset after a healthy stretch: an attempt that ran well for at least
//! `healthy_after` before it failed starts the count again, so one failure after hours of
//! service waits the first delay, while a member that accepts and drops at once is not hammered.
//!
//! A leaf: it computes delays and never sleeps or reads a clock (its callers measure how long an
//! attempt ran, and sleep on their own runtime), so it serves the member watcher (on a shard's
//! monoio runtime), the pull-mode agent (on tokio), and tests (with no time at all). Called by
//! `member::watcher` and the agent program (`agent/`).

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

/// Exponential backoff with jitter, a cap and a reset after a healthy stretch.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    /// The fraction of a step taken off at random, in `[0, 1]`.
    jitter: f64,
    healthy_after: Duration,
    /// Failures since the last reset.
    failures: u32,
    /// xorshift64 state (never 0).
    random: u64,
}

impl Backoff {
    /// `first`, doubled per failure up to `cap`, each delay jittered by up to `jitter` (a
    /// fraction of the step, clamped to `[0, 1]`); the count starts again after an attempt that
    /// ran for `healthy_after`.
    pub fn new(first: Duration, cap: Duration, jitter: f64, healthy_after: Duration) -> Self {
        let seed = RandomState::new().hash_one(0x6a09_e667_u64);
        Backoff {
            first,
            cap: cap.max(first),
            jitter: jitter.clamp(0.0, 1.0),
            healthy_after,
            failures: 0,
            random: seed | 1,
        }
    }

    /// The same, its jitter drawn from `seed` (tests).
    pub fn seeded(mut self, seed: u64) -> Self {
        self.random = seed | 1;
        self
    }

    /// An attempt that ran for `ran_for` failed: the delay before the next one.
    pub fn failed(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= self.healthy_after {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        let step = self.step();
        step.mul_f64(1.0 - self.jitter + self.jitter * self.next_unit())
    }

    /// Starts the count again (the caller knows the peer is well).
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Whether the last delay's step reached the cap: waiting longer would not grow it.
    pub fn at_cap(&self) -> bool {
        self.failures > 0 && self.step() >= self.cap
    }

    /// The un-jittered delay after the current failure: `first * 2^(failures - 1)`, at most
    /// `cap`.
    fn step(&self) -> Duration {
        let doublings = self.failures.saturating_sub(1).min(30);
        self.first.saturating_mul(1u32 << doublings).min(self.cap)
    }

    /// A number in `[0, 1)`.
    fn next_unit(&mut self) -> f64 {
        let mut x = self.random;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random = x;
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn backoff(jitter: f64) -> Backoff {
        Backoff::new(100 * MS, 30_000 * MS, jitter, 10_000 * MS).seeded(7)
    }

    #[test]
    fn without_jitter_it_doubles_from_the_first_delay_to_the_cap() {
        let mut b = backoff(0.0);
        let delays: Vec<u128> = (0..12).map(|_| b.failed(MS).as_millis()).collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000]
        );
        assert!(b.at_cap());
        // Many more failures never overflow past the cap.
        for _ in 0..100 {
            assert_eq!(b.failed(MS), 30_000 * MS);
        }
    }

    #[test]
    fn jitter_stays_within_its_fraction_of_the_step_and_varies() {
        let mut b = backoff(0.5);
        let mut seen = std::collections::BTreeSet::new();
        for failure in 1..40u32 {
            let step = (100 * MS)
                .saturating_mul(1 << (failure - 1).min(30))
                .min(30_000 * MS);
            let delay = b.failed(MS);
            assert!(delay < step && delay >= step / 2, "{failure}: {delay:?}");
            seen.insert(delay);
        }
        assert!(seen.len() > 30, "the delays are drawn, not fixed: {seen:?}");
        // Two backoffs seeded apart do not wait the same.
        let mut a = backoff(0.5).seeded(1);
        let mut c = backoff(0.5).seeded(2);
        let a: Vec<_> = (0..8).map(|_| a.failed(MS)).collect();
        let c: Vec<_> = (0..8).map(|_| c.failed(MS)).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn a_healthy_stretch_starts_the_count_again_a_short_one_does_not() {
        let mut b = backoff(0.0);
        for _ in 0..5 {
            b.failed(MS);
        }
        // Up for a moment, then down: the next delay keeps growing.
        assert_eq!(b.failed(9_999 * MS), 3_200 * MS);
        // Up for the healthy stretch, then down: the first delay again.
        assert_eq!(b.failed(10_000 * MS), 100 * MS);
        assert_eq!(b.failures(), 1);
        b.failed(MS);
        b.reset();
        assert_eq!(b.failed(MS), 100 * MS);
    }

    #[test]
    fn a_cap_below_the_first_delay_and_odd_jitter_are_bounded() {
        let mut b = Backoff::new(500 * MS, 100 * MS, 7.0, Duration::MAX).seeded(3);
        for _ in 0..10 {
            let delay = b.failed(MS);
            assert!(delay <= 500 * MS, "{delay:?}");
        }
        let mut never_healthy = Backoff::new(MS, 4 * MS, -1.0, Duration::MAX);
        assert_eq!(never_healthy.failed(Duration::from_secs(1 << 40)), MS);
        assert_eq!(never_healthy.failed(MS), 2 * MS);
    }
}
