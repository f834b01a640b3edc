//! One client of a shared watch: a cursor over its hub's ring and its own filter, nothing else.
//!
//! It starts where the client asked (the hub's objects as ADDED events, or the first event after
//! its resourceVersion, or a 410 ERROR event when that has left the ring; a label-selecting client
//! from before the hub's list first gets the member's own answer to its selectors up to the hub's
//! newest event, from a short member watch, as replayed events carry no labels-before), then sends each event
//! its selectors let through, as kube-apiserver's watch cache would (a MODIFIED event whose object
//! starts or stops matching becomes ADDED or DELETED), the shared bytes as they are. Bookmarks
//! go to clients that asked for them when they carry a newer resourceVersion than the client
//! last got, and one shortly before the client's `timeoutSeconds`. A client that falls more than
//! the lag limit behind (its socket slower than the member) gets the apiserver's 410 "too old
//! resource version" ERROR event and its watch ends; it lists again, as with any apiserver.
//! A client whose field selector reads any field (a cached resource's) keeps the keys of the
//! objects it holds instead of relying on the hub's labels-before: an event goes as ADDED or
//! DELETED when its object enters or leaves the selector, and such a client starts from the
//! hub's objects or from a resourceVersion no older than the hub's list (older: the 410).

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use super::hub::{object_key, Backfill, Event, History, Hub, Joined, Kind, Phase, State};
use super::ShardWatches;
use super::{Caller, Plan, Served, Start};
use crate::exchange::Failure;
use crate::fleet::FleetClient;
use crate::observe::metrics::GaugeGuard;
use crate::runtime::{self, First};

/// How long before the client's deadline its last bookmark goes (as the apiserver does).
const BOOKMARK_BEFORE_DEADLINE: Duration = Duration::from_secs(2);

/// Positions the client in `hub` (waits for the hub's first list, then finds where the client
/// starts, backfilling or catching up from the member when that is older than the hub's list):
/// what follows it from there, or how the watch ended before it began.
pub(super) async fn position(
    ctx: &ShardWatches,
    hub: Rc<Hub>,
    plan: Plan,
    caller: Caller,
    client: &mut impl FleetClient,
) -> Served {
    let joined = hub.join();
    let counted = ctx.exchange.shard_metrics.shared_watch_client();
    // Wait for the hub's first list.
    loop {
        let seen = hub.signal.epoch();
        match hub.phase() {
            Phase::Starting => {}
            Phase::Ready => break,
            Phase::Failed | Phase::Ended => return Served::Proxy,
        }
        match runtime::race(hub.signal.after(seen), client.gone()).await {
            First::Left(()) => {}
            First::Right(()) => return went_away(),
        }
    }
    let held = plan.fields.reads_changing_fields().then(Held::default);
    let mut cursor = Cursor {
        plan,
        held,
        pending: Vec::new(),
        pending_as: None,
        seq: 0,
        last_sent_rv: 0,
        passed_rv: 0,
        columns_sent: false,
    };
    let expired = loop {
        let seen = hub.signal.epoch();
        let older = {
            let state = hub.state.borrow();
            match cursor.plan.start {
                Start::Current => {
                    // Newest first: popped from the end, they go out in key order.
                    cursor.pending = state
                        .objects
                        .values()
                        .rev()
                        .filter(|e| cursor.selects(&e.labels(), e))
                        .cloned()
                        .collect();
                    if let Some(held) = &mut cursor.held {
                        held.keys.extend(
                            cursor
                                .pending
                                .iter()
                                .map(|e| object_key(e.namespace(), e.name())),
                        );
                    }
                    cursor.pending_as = Some(Kind::Added);
                    cursor.seq = state.next_seq();
                    cursor.last_sent_rv = state.last_rv;
                    cursor.passed_rv = state.last_rv;
                    break None;
                }
                // A selector on any field, which the member may not serve: from the hub's list
                // on, where the hub knows which objects the client holds; before, the client
                // lists again (from the cache).
                Start::After(rv) if cursor.held.is_some() => {
                    if rv < state.listed_rv.max(state.floor_rv) {
                        break Some((rv, state.listed_rv.max(state.floor_rv)));
                    }
                    let held = held_after(&state, rv, |e| cursor.selects(&e.labels(), e));
                    cursor.held = Some(held);
                    cursor.seq = state.seek(rv);
                    cursor.last_sent_rv = rv;
                    cursor.passed_rv = rv;
                    break None;
                }
                // Among replayed events (or before them), whose objects' labels before are
                // unknown: a label selector could not turn them into ADDED or DELETED as the
                // member would. The member answers the selector up to the hub's newest event.
                Start::After(rv) if rv < state.listed_rv && !cursor.plan.labels.is_everything() => {
                    Older::CatchUp {
                        rv,
                        join: state.last_rv,
                        floor: state.floor_rv,
                    }
                }
                // Older than anything the hub saw: backfilled below.
                Start::After(rv) if rv < state.start_rv => Older::Backfill {
                    rv,
                    floor: state.floor_rv,
                },
                Start::After(rv) if rv < state.floor_rv => break Some((rv, state.floor_rv)),
                Start::After(rv) => {
                    cursor.seq = state.seek(rv);
                    cursor.last_sent_rv = rv;
                    cursor.passed_rv = rv;
                    break None;
                }
            }
        };
        match older {
            Older::CatchUp { rv, join, floor } => {
                let selectors = &cursor.plan.selectors;
                // Boxed, as the backfill below: a member request's state would otherwise be part
                // of the future every shared watch holds for its whole life.
                let history = Box::pin(hub.history(ctx, caller, rv, selectors, join));
                match runtime::race(history, client.gone()).await {
                    First::Left(History::Events(events)) => {
                        // The member's own answer to this client's selectors, as it sent them.
                        cursor.pending = events.into_iter().rev().map(Arc::new).collect();
                        cursor.pending_as = None;
                        cursor.seq = hub.state.borrow().seek(join);
                        cursor.last_sent_rv = rv;
                        cursor.passed_rv = join;
                        break None;
                    }
                    First::Left(History::Expired) => break Some((rv, floor)),
                    First::Left(History::Failed) => return Served::Proxy,
                    First::Right(()) => return went_away(),
                }
            }
            Older::Backfill { rv, floor } => {
                // One backfill at a time: wait for a running one, then look again.
                if hub.backfilling() {
                    match runtime::race(hub.signal.after(seen), client.gone()).await {
                        First::Left(()) => continue,
                        First::Right(()) => return went_away(),
                    }
                }
                match Box::pin(hub.backfill(ctx, caller, rv)).await {
                    Backfill::Filled => continue,
                    // The member no longer holds that version: its 410.
                    Backfill::Expired => break Some((rv, floor)),
                    // The member's to answer.
                    Backfill::Failed => return Served::Proxy,
                }
            }
        }
    };
    if let Some((rv, floor)) = expired {
        return Served::Done(expire(client, rv, floor).await);
    }
    Served::Follow(Follower {
        hub,
        cursor,
        _joined: joined,
        _counted: counted,
    })
}

/// A client positioned in its hub: all it holds while it watches (a front-end may run it on a
/// task of its own, without the request that started it).
pub(crate) struct Follower {
    hub: Rc<Hub>,
    cursor: Cursor,
    _joined: Joined,
    _counted: GaugeGuard,
}

impl Follower {
    /// Sends the watch's head, then each event the client's selectors let through, until the
    /// watch ends.
    pub(crate) async fn run(
        &mut self,
        ctx: &ShardWatches,
        client: &mut impl FleetClient,
    ) -> Result<(), Failure> {
        client.head("application/json", &[]).await?;
        self.cursor.run(ctx, &self.hub, client).await
    }
}

/// A client that left before its watch began.
fn went_away() -> Served {
    Served::Done(Err(Failure::Abort("client went away")))
}

/// Where a client that starts before the hub's list begins.
enum Older {
    /// A label-selecting client: the member's history for its selectors up to `join`, then the
    /// hub's events after `join`.
    CatchUp { rv: u64, join: u64, floor: u64 },
    /// The hub's ring is extended back to `rv`.
    Backfill { rv: u64, floor: u64 },
}

/// The client's place in the hub and what it asked for.
struct Cursor {
    plan: Plan,
    /// For a field selector on any field (`status.phase`, an annotation: what an object's change
    /// can change), the objects the client holds: a change whose object starts or stops being
    /// selected goes as ADDED or DELETED by it, a deletion only when the client holds the object,
    /// as kube-apiserver's watch cache decides by the object before. None for other clients (the
    /// hub's labels-before decide).
    held: Option<Held>,
    /// Events to send before the ring's (last first): the initial ADDED events, or what a
    /// catch-up got from the member.
    pending: Vec<Arc<Event>>,
    /// The type the pending events go as: ADDED for initial ones; None: each its own.
    pending_as: Option<Kind>,
    /// The next event's sequence number in the ring.
    seq: u64,
    last_sent_rv: u64,
    /// The resourceVersion the client is at: where it started, then each event it passed (sent
    /// or filtered out).
    passed_rv: u64,
    /// A Table client's first event carries the column definitions.
    columns_sent: bool,
}

impl Cursor {
    fn selects(&self, labels: &super::hub::Labels<'_>, event: &Event) -> bool {
        self.plan.labels.matches(labels)
            && self
                .plan
                .fields
                .matches(event.namespace(), event.name(), event.object())
    }

    /// How the client sees `event`: None (filtered out) or the type it gets it as.
    fn seen_as(&mut self, event: &Event) -> Option<Kind> {
        if event.kind == Kind::Bookmark {
            return (self.plan.bookmarks && event.rv > self.last_sent_rv).then_some(Kind::Bookmark);
        }
        if self.held.is_some() {
            let now = event.kind != Kind::Deleted && self.selects(&event.labels(), event);
            return self.held.as_mut().and_then(|held| held.seen_as(event, now));
        }
        let now = self.selects(&event.labels(), event);
        match (event.kind, event.previous()) {
            (Kind::Modified, Some(previous)) => match (self.selects(&previous, event), now) {
                (true, true) => Some(Kind::Modified),
                (false, true) => Some(Kind::Added),
                (true, false) => Some(Kind::Deleted),
                (false, false) => None,
            },
            (kind, _) => now.then_some(kind),
        }
    }

    fn line(&mut self, hub: &Hub, event: &Event, kind: Kind) -> Bytes {
        self.last_sent_rv = self.last_sent_rv.max(event.rv);
        if kind == Kind::Bookmark || self.columns_sent || hub.key.form != super::Form::Table {
            return event.line(kind, None);
        }
        self.columns_sent = true;
        let columns = hub.state.borrow().columns.clone();
        event.line(kind, columns.as_ref())
    }

    async fn run(
        &mut self,
        ctx: &ShardWatches,
        hub: &Rc<Hub>,
        client: &mut impl FleetClient,
    ) -> Result<(), Failure> {
        let deadline = self.plan.timeout.map(|t| std::time::Instant::now() + t);
        let mut ends: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> = match deadline {
            Some(at) => Box::pin(runtime::sleep(
                at.saturating_duration_since(std::time::Instant::now()),
            )),
            None => Box::pin(std::future::pending()),
        };
        let mut last_bookmark: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> =
            match self.plan.timeout.filter(|_| self.plan.bookmarks) {
                Some(t) if t > BOOKMARK_BEFORE_DEADLINE => {
                    Box::pin(runtime::sleep(t - BOOKMARK_BEFORE_DEADLINE))
                }
                _ => Box::pin(std::future::pending()),
            };
        let mut drain = std::pin::pin!(ctx.exchange.drain.started());
        // Whether the watch ends (the shard drains, the hub ended) with its client holding every
        // event the hub has: it is then told so by a last bookmark, and resumes from there on
        // another replica or the hub's successor, without listing again.
        let mut caught_up = false;
        loop {
            if let Some(event) = self.pending.pop() {
                let line = self.line(hub, &event, self.pending_as.unwrap_or(event.kind));
                client.body(line).await?;
                continue;
            }
            let seen = hub.signal.epoch();
            let next = {
                let state = hub.state.borrow();
                match state.phase {
                    Phase::Ready => {}
                    // The route retired, the shard drains, the member refused the gateway: the
                    // watch ends cleanly and the client watches again.
                    _ => {
                        // Not while the hub replayed the member's history to a version the
                        // client has not reached: the replay's rest never came (a mirror whose
                        // home's replay the member refused).
                        caught_up = self.seq >= state.next_seq()
                            && !(state.replaying && self.passed_rv < state.listed_rv);
                        break;
                    }
                }
                let behind = state.next_seq().saturating_sub(self.seq);
                // Behind the ring's floor: events it needed left the ring (or the member could
                // not replay them).
                let lost = self.seq < state.base || self.passed_rv < state.floor_rv;
                if lost || behind > hub.lag_limit as u64 {
                    Next::Cut(state.floor_rv)
                } else {
                    match state.at(self.seq) {
                        Some(event) => Next::Event(Arc::clone(event)),
                        None => Next::Wait,
                    }
                }
            };
            match next {
                Next::Event(event) => {
                    self.seq += 1;
                    // A replayed event the client's starting objects already hold (it started
                    // from the hub's objects while the member replayed).
                    if event.kind != Kind::Bookmark && event.rv <= self.passed_rv {
                        continue;
                    }
                    self.passed_rv = self.passed_rv.max(event.rv);
                    if let Some(kind) = self.seen_as(&event) {
                        let line = self.line(hub, &event, kind);
                        client.body(line).await?;
                    }
                }
                Next::Cut(floor) => {
                    tracing::debug!(cluster = %hub.key.cluster, resource = %hub.key.resource, "shared watch: client fell behind the lag limit; cut with 410");
                    return expire_after_head(client, self.last_sent_rv, floor).await;
                }
                Next::Wait => {
                    let hub_changed = hub.signal.after(seen);
                    let timers = runtime::race(&mut ends, &mut last_bookmark);
                    let outside = runtime::race(drain.as_mut(), client.gone());
                    match runtime::race(runtime::race(hub_changed, timers), outside).await {
                        First::Left(First::Left(())) => {}
                        First::Left(First::Right(First::Left(()))) => break,
                        First::Left(First::Right(First::Right(()))) => {
                            last_bookmark = Box::pin(std::future::pending());
                            self.bookmark_latest(hub, client).await?;
                        }
                        First::Right(First::Left(())) => {
                            caught_up = true;
                            break;
                        }
                        First::Right(First::Right(())) => {
                            return Err(Failure::Abort("client went away"))
                        }
                    }
                }
            }
        }
        if caught_up {
            self.bookmark_latest(hub, client).await?;
        }
        client.end().await
    }

    /// A bookmark at the hub's latest resourceVersion, if the client asked for bookmarks and was
    /// not told it yet. Only for a client that waits for the hub's next event: it holds
    /// everything up to there.
    async fn bookmark_latest(
        &mut self,
        hub: &Hub,
        client: &mut impl FleetClient,
    ) -> Result<(), Failure> {
        let latest = hub.state.borrow().last_rv;
        if self.plan.bookmarks && latest > self.last_sent_rv {
            self.last_sent_rv = latest;
            client.body(bookmark(hub, latest)).await?;
        }
        Ok(())
    }
}

/// What a client with a field selector on any field holds.
#[derive(Default)]
struct Held {
    /// The keys (`namespace/name`) of the objects it was sent and not told are gone.
    keys: HashSet<Box<str>>,
    /// Objects it may or may not hold: changed between the resourceVersion it started after and
    /// its start, their version at that resourceVersion no longer known (the hub's list had it,
    /// or it left the ring). Their next event goes as ADDED if selected, as DELETED otherwise:
    /// what a client holds either way after it (a DELETED of an object it does not hold is a
    /// no-op to client-go's and kube-rs's caches).
    unknown: HashSet<Box<str>>,
}

impl Held {
    /// How a client holding these objects sees `event`, which leaves the object selected
    /// (`now`) or not: as it is, as ADDED or DELETED when the object enters or leaves the
    /// client's view, or not at all.
    fn seen_as(&mut self, event: &Event, now: bool) -> Option<Kind> {
        let key = object_key(event.namespace(), event.name());
        let was = (!self.unknown.remove(&key)).then(|| self.keys.contains(&key));
        match (was, now) {
            (Some(true), true) => Some(event.kind),
            (Some(false) | None, true) => {
                self.keys.insert(key);
                Some(Kind::Added)
            }
            (Some(true) | None, false) => {
                self.keys.remove(&key);
                Some(Kind::Deleted)
            }
            (Some(false), false) => None,
        }
    }
}

/// What a client that starts after resourceVersion `rv` holds, as `selects` picks the objects:
/// the hub's objects unchanged since `rv`, and each object changed since as its last event at or
/// before `rv` left it, when that event is in the ring after the hub's list. An object first
/// created since is not held; the others changed since are [`Held::unknown`].
fn held_after(state: &State, rv: u64, selects: impl Fn(&Event) -> bool) -> Held {
    let from = state.seek(rv);
    let mut first_change: HashMap<Box<str>, Kind> = HashMap::new();
    for event in (from..state.next_seq()).filter_map(|seq| state.at(seq)) {
        if event.kind != Kind::Bookmark {
            first_change
                .entry(object_key(event.namespace(), event.name()))
                .or_insert(event.kind);
        }
    }
    let mut keys: HashSet<Box<str>> = state
        .objects
        .iter()
        .filter(|(key, event)| !first_change.contains_key(*key) && selects(event))
        .map(|(key, _)| Box::<str>::from(key))
        .collect();
    let mut unknown: HashSet<Box<str>> = first_change
        .into_iter()
        .filter(|(_, kind)| *kind != Kind::Added)
        .map(|(key, _)| key)
        .collect();
    for event in (state.base..from).rev().filter_map(|seq| state.at(seq)) {
        if unknown.is_empty() || event.rv <= state.listed_rv {
            break;
        }
        if event.kind == Kind::Bookmark {
            continue;
        }
        let key = object_key(event.namespace(), event.name());
        if unknown.remove(&key) && event.kind != Kind::Deleted && selects(event) {
            keys.insert(key);
        }
    }
    Held { keys, unknown }
}

enum Next {
    Event(Arc<Event>),
    Cut(u64),
    Wait,
}

/// A BOOKMARK as kube-apiserver writes it.
fn bookmark(hub: &Hub, rv: u64) -> Bytes {
    let key = &hub.key;
    let kind = kind_of(&key.resource);
    let api_version = if key.group.is_empty() {
        key.version.clone()
    } else {
        format!("{}/{}", key.group, key.version)
    };
    let object = json!({
        "kind": kind,
        "apiVersion": api_version,
        "metadata": {"resourceVersion": rv.to_string(), "creationTimestamp": null},
    });
    let mut out =
        serde_json::to_vec(&json!({"type": "BOOKMARK", "object": object})).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

/// The Kind of a resource, as well as a plural tells it (`configmaps` -> `ConfigMap` needs a
/// table; the bookmark's kind is informational to clients).
fn kind_of(resource: &str) -> String {
    match resource {
        "configmaps" => "ConfigMap".into(),
        "pods" => "Pod".into(),
        "services" => "Service".into(),
        "secrets" => "Secret".into(),
        "namespaces" => "Namespace".into(),
        "nodes" => "Node".into(),
        "events" => "Event".into(),
        "deployments" => "Deployment".into(),
        other => {
            let singular = other.strip_suffix('s').unwrap_or(other);
            let mut chars = singular.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        }
    }
}

/// The 410 ERROR event kube-apiserver sends inside a 200 watch for a resourceVersion older than
/// its window (fixtures: configmaps-watch-too-old-rv1-raw.txt).
fn expired_line(requested: u64, oldest: u64) -> Bytes {
    let status = crate::errors::expired_status(&format!("{requested} ({oldest})"));
    let mut out =
        serde_json::to_vec(&json!({"type": "ERROR", "object": status})).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}

/// A whole watch that is only the 410 ERROR event.
async fn expire(client: &mut impl FleetClient, requested: u64, oldest: u64) -> Result<(), Failure> {
    client.head("application/json", &[]).await?;
    expire_after_head(client, requested, oldest).await
}

async fn expire_after_head(
    client: &mut impl FleetClient,
    requested: u64,
    oldest: u64,
) -> Result<(), Failure> {
    client.body(expired_line(requested, oldest)).await?;
    client.end().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_410_event_is_the_apiservers() {
        let fixture = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"too old resource version: 1 (269)\",\"reason\":\"Expired\",\"code\":410}}\n";
        let ours: serde_json::Value = serde_json::from_slice(&expired_line(1, 269)).unwrap();
        let theirs: serde_json::Value = serde_json::from_str(fixture).unwrap();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn kinds_of_resources() {
        assert_eq!(kind_of("configmaps"), "ConfigMap");
        assert_eq!(kind_of("widgets"), "Widget");
        assert_eq!(kind_of(""), "");
    }
}
