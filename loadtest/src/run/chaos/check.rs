//! The accounting of `chaos` (issue 33 item 5): what one watcher saw of one member, checked against
//! that member's own history.
//!
//! A watcher's view of a member is a sequence of [`Obs`] in arrival order: the list it started
//! from, events, bookmarks, and the relists after a 410. [`check`] walks it beside the member's
//! history (every change in the watched collection, by resourceVersion) and finds:
//!
//! - a **duplicate**: an event whose resourceVersion already arrived;
//! - a **reorder**: an event at or before the watcher's position (the last resourceVersion it had
//!   from an event, a bookmark or a list), which an informer would apply over newer state;
//! - an **unknown** event: no change of the member has its resourceVersion, or the change there
//!   is of another object or type;
//! - a **gap**: a change after the watcher's start, up to the end of the run, that never arrived
//!   and that no relist covers (a relist to resourceVersion R, made at position P, covers the
//!   changes in (P, R]: the list showed their outcome).
//!
//! Pure: called by the scenario (`chaos`) after the run, and by the unit tests below with
//! hostile sequences.

use std::collections::HashSet;

/// A change of the watched collection, as the member recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub rv: u64,
    pub kind: Kind,
    pub name: String,
    /// Milliseconds since the run started, when it was made.
    pub at_ms: u64,
}

/// An event type that carries a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Added,
    Modified,
    Deleted,
}

impl Kind {
    pub fn parse(event_type: &str) -> Option<Kind> {
        match event_type {
            "ADDED" => Some(Kind::Added),
            "MODIFIED" => Some(Kind::Modified),
            "DELETED" => Some(Kind::Deleted),
            _ => None,
        }
    }
}

/// What a watcher saw of one member, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obs {
    /// An ADDED, MODIFIED or DELETED event.
    Event {
        rv: u64,
        kind: Kind,
        name: String,
        at_ms: u64,
    },
    /// A bookmark (or, in the fleet view, another member's event) placing the member at `rv`.
    Bookmark { rv: u64 },
    /// A list (after a 410) at `rv`.
    Relist { rv: u64, at_ms: u64 },
}

/// How a violation is named in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Violation {
    Duplicate,
    Reorder,
    Unknown,
    Gap,
}

impl Violation {
    pub fn name(self) -> &'static str {
        match self {
            Violation::Duplicate => "duplicate",
            Violation::Reorder => "reorder",
            Violation::Unknown => "unknown",
            Violation::Gap => "gap",
        }
    }
}

/// One violation: which change (or event), and when it happened (the event's arrival; for a
/// gap, when the missed change was made), for charging it to a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub violation: Violation,
    pub rv: u64,
    pub at_ms: u64,
    pub detail: String,
}

/// The counts of one (watcher, member).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Changes after the start up to the end that had to arrive (relist-covered ones left out).
    pub expected: u64,
    /// Events that arrived.
    pub seen: u64,
    /// Changes a relist covered.
    pub covered: u64,
    pub relists: u64,
    pub found: Vec<Found>,
}

/// Checks what one watcher saw of one member: `origin` is the resourceVersion of the list it
/// started from, `history` the member's changes (any order), `until` the member's last
/// resourceVersion the run waited for.
pub fn check(origin: u64, observed: &[Obs], history: &[Change], until: u64) -> Tally {
    let mut history: Vec<&Change> = history.iter().collect();
    history.sort_by_key(|c| c.rv);
    let find = |rv: u64| {
        history
            .binary_search_by_key(&rv, |c| c.rv)
            .ok()
            .map(|i| history[i])
    };
    let mut tally = Tally::default();
    let mut position = origin;
    let mut arrived: HashSet<u64> = HashSet::new();
    let mut covered: Vec<(u64, u64)> = Vec::new();
    for obs in observed {
        match obs {
            Obs::Event {
                rv,
                kind,
                name,
                at_ms,
            } => {
                tally.seen += 1;
                let found = |violation, detail: String| Found {
                    violation,
                    rv: *rv,
                    at_ms: *at_ms,
                    detail,
                };
                if !arrived.insert(*rv) {
                    tally.found.push(found(
                        Violation::Duplicate,
                        format!("{kind:?} {name} at {rv} arrived again"),
                    ));
                    continue;
                }
                if *rv <= position {
                    tally.found.push(found(
                        Violation::Reorder,
                        format!(
                            "{kind:?} {name} at {rv} arrived after the watcher was at {position}"
                        ),
                    ));
                    continue;
                }
                position = *rv;
                match find(*rv) {
                    Some(c) if c.kind == *kind && c.name == *name => {}
                    Some(c) => tally.found.push(found(
                        Violation::Unknown,
                        format!(
                            "{kind:?} {name} at {rv}, but the member's change there is {:?} {}",
                            c.kind, c.name
                        ),
                    )),
                    None => tally.found.push(found(
                        Violation::Unknown,
                        format!("{kind:?} {name} at {rv}: no such change in the member's history"),
                    )),
                }
            }
            Obs::Bookmark { rv } => position = position.max(*rv),
            Obs::Relist { rv, .. } => {
                tally.relists += 1;
                if *rv > position {
                    covered.push((position, *rv));
                }
                position = *rv;
            }
        }
    }
    for change in history.iter().filter(|c| c.rv > origin && c.rv <= until) {
        if covered
            .iter()
            .any(|(from, to)| change.rv > *from && change.rv <= *to)
        {
            tally.covered += 1;
            continue;
        }
        tally.expected += 1;
        if !arrived.contains(&change.rv) {
            tally.found.push(Found {
                violation: Violation::Gap,
                rv: change.rv,
                at_ms: change.at_ms,
                detail: format!(
                    "{:?} {} at {} never arrived",
                    change.kind, change.name, change.rv
                ),
            });
        }
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Changes at resourceVersions 11, 12, ... of objects cm-0, cm-1, ...: a create each.
    fn history(n: u64) -> Vec<Change> {
        (0..n)
            .map(|i| Change {
                rv: 11 + i,
                kind: Kind::Added,
                name: format!("cm-{i}"),
                at_ms: i * 100,
            })
            .collect()
    }

    fn event(c: &Change) -> Obs {
        Obs::Event {
            rv: c.rv,
            kind: c.kind,
            name: c.name.clone(),
            at_ms: c.at_ms + 5,
        }
    }

    fn kinds(t: &Tally) -> Vec<(Violation, u64)> {
        t.found.iter().map(|f| (f.violation, f.rv)).collect()
    }

    #[test]
    fn every_change_once_in_order_is_clean_and_bookmarks_are_fine() {
        let h = history(5);
        let mut seen: Vec<Obs> = h.iter().map(event).collect();
        seen.insert(2, Obs::Bookmark { rv: 12 });
        let t = check(10, &seen, &h, 15);
        assert_eq!(t.found, Vec::new());
        assert_eq!((t.expected, t.seen, t.covered), (5, 5, 0));
        // Changes before the watcher's start are not expected of it.
        let t = check(12, &seen[3..], &h, 15);
        assert_eq!((t.expected, t.found.len()), (3, 0), "{t:?}");
    }

    #[test]
    fn a_duplicate_is_caught() {
        let h = history(4);
        let seen = vec![
            event(&h[0]),
            event(&h[1]),
            event(&h[1]),
            event(&h[2]),
            event(&h[3]),
        ];
        let t = check(10, &seen, &h, 14);
        assert_eq!(kinds(&t), [(Violation::Duplicate, 12)]);
        // A resumed watch that replays from too early repeats what it had: duplicates too.
        let seen = vec![
            event(&h[0]),
            event(&h[1]),
            event(&h[0]),
            event(&h[1]),
            event(&h[2]),
        ];
        let t = check(10, &seen, &h, 13);
        assert_eq!(
            kinds(&t),
            [(Violation::Duplicate, 11), (Violation::Duplicate, 12)]
        );
    }

    #[test]
    fn a_silent_gap_is_caught_even_behind_a_bookmark() {
        let h = history(5);
        // 13 never comes; a bookmark (or a composite version) moves the watcher past it.
        let seen = vec![
            event(&h[0]),
            event(&h[1]),
            Obs::Bookmark { rv: 13 },
            event(&h[3]),
            event(&h[4]),
        ];
        let t = check(10, &seen, &h, 15);
        assert_eq!(kinds(&t), [(Violation::Gap, 13)]);
        assert_eq!(t.found[0].at_ms, 200, "charged to when the change was made");
        // The tail that never came before the end is a gap as well.
        let t = check(10, &[event(&h[0])], &h, 12);
        assert_eq!(kinds(&t), [(Violation::Gap, 12)]);
    }

    #[test]
    fn a_reorder_is_caught() {
        let h = history(4);
        let seen = vec![event(&h[0]), event(&h[2]), event(&h[1]), event(&h[3])];
        let t = check(10, &seen, &h, 14);
        assert_eq!(kinds(&t), [(Violation::Reorder, 12)]);
        // An event from before the watcher's start (its list) is one too.
        let t = check(12, &[event(&h[1]), event(&h[2])], &h, 13);
        assert_eq!(kinds(&t), [(Violation::Reorder, 12)]);
        // And one older than a bookmark the watcher already had.
        let seen = vec![Obs::Bookmark { rv: 12 }, event(&h[1]), event(&h[2])];
        let t = check(10, &seen, &h, 13);
        assert_eq!(
            kinds(&t),
            [(Violation::Reorder, 12), (Violation::Gap, 11)],
            "{t:?}"
        );
    }

    #[test]
    fn a_gap_covered_by_a_relist_after_a_410_is_fine_and_an_uncovered_one_is_not() {
        let h = history(8);
        // 13..=15 expired; the watcher got a 410 and listed again at 15.
        let seen = vec![
            event(&h[0]),
            event(&h[1]),
            Obs::Relist { rv: 15, at_ms: 400 },
            event(&h[5]),
            event(&h[6]),
            event(&h[7]),
        ];
        let t = check(10, &seen, &h, 18);
        assert_eq!(t.found, Vec::new(), "{t:?}");
        assert_eq!((t.expected, t.covered, t.relists), (5, 3, 1));
        // An event the relist already covered, arriving after it, is stale: a reorder.
        let mut stale = seen.clone();
        stale.insert(3, event(&h[3]));
        let t = check(10, &stale, &h, 18);
        assert_eq!(kinds(&t), [(Violation::Reorder, 14)]);
        // A relist does not cover what came after it: 17 missing is a gap.
        let mut missing = seen.clone();
        missing.remove(4);
        let t = check(10, &missing, &h, 18);
        assert_eq!(kinds(&t), [(Violation::Gap, 17)]);
    }

    #[test]
    fn an_event_the_member_never_made_is_caught() {
        let h = history(2);
        let phantom = Obs::Event {
            rv: 12,
            kind: Kind::Deleted,
            name: "cm-1".into(),
            at_ms: 0,
        };
        let t = check(10, &[event(&h[0]), phantom], &h, 12);
        assert_eq!(kinds(&t), [(Violation::Unknown, 12)]);
        let invented = Obs::Event {
            rv: 99,
            kind: Kind::Added,
            name: "x".into(),
            at_ms: 0,
        };
        let t = check(10, &[event(&h[0]), event(&h[1]), invented], &h, 12);
        assert_eq!(kinds(&t), [(Violation::Unknown, 99)]);
    }
}
