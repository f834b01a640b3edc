//! The shard's coarse clock: what deadlines are set from. `now()` reads the kernel's
//! `CLOCK_MONOTONIC_COARSE` (the time of the last scheduler tick, a few milliseconds behind at
//! most, read from the vDSO without a system call and without the TSC read of `Instant::now()`)
//! and turns it into an `Instant` through an offset taken once per thread. Both kernel clocks
//! are the same monotonic clock at different resolutions, so the offset does not drift.
//!
//! Deadlines here are seconds (head, idle, response-head and stall timeouts); a few
//! milliseconds early is fine. Request durations for metrics and audit stay on `Instant::now()`.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    /// (`Instant::now()`, coarse reading) taken together on this thread's first call.
    static BASE: Cell<Option<(Instant, Duration)>> = const { Cell::new(None) };
}

fn coarse() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC_COARSE exists on every Linux
    // since 2.6.32 and cannot fail with a valid pointer.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts)
    };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The coarse time: at most one scheduler tick (1-10 ms) behind `Instant::now()`.
pub fn now() -> Instant {
    let reading = coarse();
    let (base, base_reading) = BASE.with(|b| match b.get() {
        Some(pair) => pair,
        None => {
            let pair = (Instant::now(), coarse());
            b.set(Some(pair));
            pair
        }
    });
    // The coarse reading may be a tick behind the one taken with the base.
    base + reading.saturating_sub(base_reading)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_clock_follows_the_precise_one_within_a_tick() {
        for _ in 0..3 {
            let before = Instant::now();
            let coarse = now();
            let after = Instant::now();
            // Never ahead of the precise clock by more than the base's own tick skew, never
            // behind it by more than a tick (CONFIG_HZ >= 100: 10 ms), plus slack for a busy
            // machine between the readings.
            assert!(
                coarse <= after + Duration::from_millis(10),
                "{coarse:?} vs {after:?}"
            );
            assert!(
                coarse + Duration::from_millis(50) >= before,
                "{coarse:?} vs {before:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_coarse_clock_advances() {
        let first = now();
        std::thread::sleep(Duration::from_millis(30));
        let second = now();
        assert!(
            second >= first + Duration::from_millis(15),
            "{first:?} then {second:?}"
        );
    }
}
