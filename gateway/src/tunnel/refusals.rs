//! The tunnel listener's refusals in the log, so that a flood cannot flood it: the first
//! [`PER_SECOND`] of each second are logged one by one (the peer's address and why), the rest are
//! counted and summed up in one line once their second is over (how many, why, and the address
//! that had the most). A thousand idle connections cut every two seconds would otherwise write
//! five hundred lines a second.
//!
//! Plain state of the tunnel thread; the clock is the caller's. Memory is bounded: the reasons
//! are the listener's few kinds, and at most [`ADDRESSES`] addresses are counted apart.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ahash::AHashMap;

/// Refusals logged one by one each second.
pub const PER_SECOND: u32 = 10;
/// Addresses counted apart in one second's summary; beyond, they are only in its total.
const ADDRESSES: usize = 256;
const SECOND: Duration = Duration::from_secs(1);

/// The refusals held back in one second.
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    pub count: u64,
    /// `kind: count` for each kind, in the order they first came.
    pub reasons: String,
    /// The address with the most of them, and how many.
    pub busiest: Option<(IpAddr, u64)>,
}

#[derive(Debug, Default)]
pub struct RefusalLog {
    /// When the current second began (None before the first refusal).
    since: Option<Instant>,
    logged: u32,
    held: u64,
    reasons: Vec<(&'static str, u64)>,
    addresses: AHashMap<IpAddr, u64>,
}

impl RefusalLog {
    /// A refusal of `kind` from `ip` at `now`: whether to log it on its own, and first the
    /// summary of a second that ended, if one is due.
    pub fn note(
        &mut self,
        now: Instant,
        kind: &'static str,
        ip: IpAddr,
    ) -> (bool, Option<Summary>) {
        let summary = self.roll(now);
        if self.logged < PER_SECOND {
            self.logged += 1;
            return (true, summary);
        }
        self.held += 1;
        match self.reasons.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.reasons.push((kind, 1)),
        }
        let tracked = self.addresses.len();
        match self.addresses.get_mut(&ip) {
            Some(n) => *n += 1,
            None if tracked < ADDRESSES => {
                self.addresses.insert(ip, 1);
            }
            None => {}
        }
        (false, summary)
    }

    /// The summary of the second that ended by `now`, if it held refusals back (the listener
    /// asks every second, so the last second of a flood is reported too).
    pub fn flush(&mut self, now: Instant) -> Option<Summary> {
        self.roll(now)
    }

    fn roll(&mut self, now: Instant) -> Option<Summary> {
        if self
            .since
            .is_some_and(|since| now.saturating_duration_since(since) < SECOND)
        {
            return None;
        }
        self.since = Some(now);
        self.logged = 0;
        if self.held == 0 {
            return None;
        }
        let busiest = self.addresses.drain().max_by_key(|(_, n)| *n);
        let reasons = self
            .reasons
            .drain(..)
            .map(|(kind, n)| format!("{kind}: {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        Some(Summary {
            count: std::mem::take(&mut self.held),
            reasons,
            busiest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_logged_ten_lines_and_a_summary_a_second() {
        let mut log = RefusalLog::default();
        let start = Instant::now();
        let one: IpAddr = "10.0.0.1".parse().unwrap();
        let two: IpAddr = "10.0.0.2".parse().unwrap();
        let mut single = 0;
        for i in 0..1000u32 {
            let (alone, summary) = log.note(start, if i % 2 == 0 { "silent" } else { "cut" }, one);
            assert_eq!(summary, None);
            single += u32::from(alone);
        }
        let (alone, _) = log.note(start + Duration::from_millis(500), "silent", two);
        assert!(!alone);
        assert_eq!(single, PER_SECOND);
        // Within the second nothing is due; after it, one summary, then nothing held.
        assert_eq!(log.flush(start + Duration::from_millis(999)), None);
        let summary = log.flush(start + SECOND).unwrap();
        assert_eq!(summary.count, 991);
        assert_eq!(summary.reasons, "silent: 496, cut: 495");
        assert_eq!(summary.busiest, Some((one, 990)));
        assert_eq!(log.flush(start + 3 * SECOND), None);
        // A new second logs one by one again; the summary of a past one comes with the next
        // refusal when no flush asked for it.
        for _ in 0..=PER_SECOND {
            log.note(start + 3 * SECOND, "silent", one);
        }
        let (alone, summary) = log.note(start + 5 * SECOND, "silent", one);
        assert!(alone);
        assert_eq!(summary.map(|s| s.count), Some(1));
    }
}
