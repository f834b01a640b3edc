//! One shared watch on one shard: the member watch, the objects it holds now and a bounded ring
//! of its recent events, for every client watch of the same key.
//!
//! - **Start.** The hub LISTs the resource in its scope as the gateway itself (the Cluster's own
//!   credentials, no impersonation: clients are admitted one by one by `access`), keeps the
//!   objects, and watches from the list's resourceVersion, asking for bookmarks. When the client
//!   whose watch started the hub listed before it did (kubectl and informers list, then watch
//!   from the list's version), the watch starts from that client's version instead: the member
//!   replays what happened since, into the ring only (`State::listed_rv`), and the client is
//!   served from the hub rather than by a member watch of its own. A later client from a version
//!   older than the hub's start is backfilled: a short member watch from its version, whose
//!   events go before the ring's first ([`Hub::backfill`]); a label-selecting client from before
//!   the list gets such a watch's events for its own selectors ([`Hub::history`]), then the ring.
//! - **Events.** Each member event is parsed once, encoded once (`{"type":..,"object":..}\n`)
//!   into a `Bytes` that every client that receives it shares; the object's namespace, name and
//!   labels (and, for a MODIFIED event, the labels before, when they changed) are kept beside
//!   it for filtering. A Table event is kept without its column definitions (a client's first
//!   event gets them).
//! - **Ring.** At most `ringSize` events; the oldest leaves as a new one comes, and the
//!   resourceVersion before the oldest kept event is the oldest a client may resume from.
//! - **Resilience.** The list and the member watch run on `member::watcher`: a member watch that
//!   ends, drops or stalls (nothing, not even a bookmark, past `member::watcher::STALL_AFTER`)
//!   is opened again from the last resourceVersion seen, with backoff while the member cannot be
//!   reached, and the clients see no break; a member 410 makes the hub LIST again and put what
//!   changed into the ring (ADDED, MODIFIED, DELETED), as client-go's reflector does. The route's
//!   retirement (the cluster removed or changed) ends the hub, and with it every client watch,
//!   cleanly. So does a member that refuses the gateway's own list or watch (a 401 or 403 right
//!   after a failure, a restarted apiserver's before its RBAC cache synced, only once it
//!   lasted past `member::watcher::AUTH_GRACE`), or that stays unreachable from
//!   the hub's start until the backoff reaches its cap (then clients are proxied for a while:
//!   [`FAILED_FOR`]), and having had no client for [`IDLE_FOR`] ([`CACHED_IDLE_FOR`] for a
//!   resource in `spec.cache`: the hub is its cache).
//! - **Memory.** Each event and the objects map are `event`'s (an object's JSON and about 200
//!   bytes). A hub of a resource in `spec.cache` counts what it holds in a `memory::Meter`, and
//!   after each list and event holds its resource to `maxObjects` and the gateway to
//!   `memoryBudget`: a dropped hub ends as any ended hub does; a resource dropped and not yet
//!   fitting again gets a hub that starts failed (its clients are proxied).
//! - **Fed.** Shared per gateway (`super::across`), a hub on another shard than its key's home
//!   makes no member request: it takes the home hub's state, then its events ([`Update`]), into
//!   a ring of its own, and ends when the home's hub does.
//!
//! Single-threaded: a hub is an `Rc` on its shard; its state is a `RefCell` never held across an
//! await. Clients wait on its [`Signal`].

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fleetgate_config_watcher::ClusterRoute;
use serde_json::{Map, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{debug, info, warn};

use super::ShardWatches;
use super::{Caller, Form, HubKey, OwnRequests, TABLE_ACCEPT};
use crate::auth::Decided;
use crate::exchange::lines::{LineSink, Lines};
use crate::exchange::relay::ResponseSink;
use crate::exchange::{Answer, Failure};
use crate::fleet::ClientRequest;
use crate::member::ask::{self, Ask, Asked, Missed, To};
use crate::member::backoff::Backoff;
use crate::member::watcher::{self, AfterExpiry, Fault, ShardClock, Start};
use crate::runtime::{self, First};

mod event;
pub mod memory;

use event::Meta;
pub use event::{object_key, Event, Held, Kind, Labels, Objects};
use memory::{Meter, Reason};

/// How long a hub without clients keeps its member watch.
pub const IDLE_FOR: Duration = Duration::from_secs(30);
/// How long the hub of a resource in `spec.cache` is kept without a client: it is the cache
/// its LISTs are served from (docs/cache.md).
pub const CACHED_IDLE_FOR: Duration = Duration::from_secs(600);
/// How long a hub whose member refused the gateway stays failed (its clients are proxied).
pub const FAILED_FOR: Duration = Duration::from_secs(10);
/// The first sequence number of a hub's ring: room below it for events a backfill puts before
/// the first ones.
const FIRST_SEQ: u64 = 1 << 40;
/// How long a backfill's member watch lasts: the member replays its history at once, so this
/// bounds the wait for events that are not there.
const BACKFILL_SECONDS: u32 = 1;

/// The elements of `list`'s array `field` (none when it is missing or not an array).
fn elements<'a>(list: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    list.get(field)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn version_of(metadata: Option<&Value>) -> Option<u64> {
    metadata?
        .get("resourceVersion")?
        .as_str()?
        .parse::<u64>()
        .ok()
}

/// Where a hub is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Listing: clients wait.
    Starting,
    Ready,
    /// The member refused the gateway; clients are proxied until the hub is gone.
    Failed,
    /// Ended (the route retired, no clients, a shard drain): clients end cleanly.
    Ended,
}

/// Wakes every waiting client when the hub changes. Single-threaded.
#[derive(Default)]
pub struct Signal {
    epoch: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Signal {
    pub fn epoch(&self) -> u64 {
        self.epoch.get()
    }

    fn bump(&self) {
        self.epoch.set(self.epoch.get().wrapping_add(1));
        for waker in self.wakers.take() {
            waker.wake();
        }
    }

    /// Resolves once the hub changed after `seen`.
    pub async fn after(&self, seen: u64) {
        std::future::poll_fn(|cx| {
            if self.epoch.get() != seen {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }
}

/// The hub's state; borrowed briefly, never across an await. Cloned (its events shared) for a
/// hub on another shard (`across`).
#[derive(Clone)]
pub struct State {
    pub phase: Phase,
    pub ring: VecDeque<Arc<Event>>,
    /// The sequence number of `ring[0]`; the next event gets `base + ring.len()`.
    pub base: u64,
    /// The resourceVersion just before `ring[0]`: a client may resume from it or later.
    pub floor_rv: u64,
    /// The oldest resourceVersion a client may start after: the first list's, or the first
    /// client's when the hub replays from it; an older one is the member's to answer.
    pub start_rv: u64,
    pub last_rv: u64,
    /// The first list's resourceVersion. When the hub's first client asked for an older one, the
    /// member watch starts there and replays what happened since: those events (at or before
    /// `listed_rv`) go into the ring only, as the objects already hold them, and without the
    /// labels their objects had before (a label-selecting client that starts among them is the
    /// member's to answer).
    pub listed_rv: u64,
    /// Whether the member is still replaying up to `listed_rv`.
    pub replaying: bool,
    /// How far the replay got (where its watch resumes).
    pub replayed_to: u64,
    /// The member could not replay (410): the replayed events left the ring and the clients that
    /// started among them were cut, as the member would have answered them.
    pub replay_lost: bool,
    /// The objects the member holds now, by namespace and name (their last ADDED or MODIFIED).
    pub objects: Objects,
    /// A Table hub's column definitions (JSON).
    pub columns: Option<Bytes>,
    /// The `kind` and `apiVersion` of the member's list (`ConfigMapList`, `v1`), as a LIST
    /// from the hub's objects names them.
    pub list_kind: Option<(Box<str>, Box<str>)>,
}

impl State {
    /// Whether an event of `kind` at `rv` is part of the replay: the list holds every change up
    /// to its resourceVersion, and a bookmark there says the replay is done.
    fn replays(&self, kind: Kind, rv: u64) -> bool {
        self.replaying && (rv < self.listed_rv || (rv == self.listed_rv && kind != Kind::Bookmark))
    }

    /// Drops the ring and the objects (an ended hub). The sequence goes on past the events
    /// dropped, so a client still behind them is not taken for caught up (and told by a last
    /// bookmark that it holds them): it resumes from its own last event.
    fn drop_events(&mut self) {
        self.base += self.ring.len() as u64;
        self.ring.clear();
        self.objects.clear();
    }

    pub fn next_seq(&self) -> u64 {
        self.base + self.ring.len() as u64
    }

    /// The event with sequence number `seq`, if it is still in the ring.
    pub fn at(&self, seq: u64) -> Option<&Arc<Event>> {
        let index = seq.checked_sub(self.base)?;
        self.ring.get(usize::try_from(index).ok()?)
    }

    /// The sequence number of the first event after resourceVersion `rv`.
    pub fn seek(&self, rv: u64) -> u64 {
        self.base + self.ring.partition_point(|e| e.rv <= rv) as u64
    }
}

/// One shared watch.
pub struct Hub {
    pub key: HubKey,
    cluster: Arc<ClusterRoute>,
    pub ring_size: usize,
    pub lag_limit: usize,
    pub state: RefCell<State>,
    pub signal: Signal,
    clients: Cell<usize>,
    idle_since: Cell<Option<Instant>>,
    /// The resourceVersion the client that started the hub asked to start after, if any.
    first_from: Cell<Option<u64>>,
    /// Whether a backfill runs (one at a time: the clients that need one wait for it).
    backfilling: Cell<bool>,
    /// How long it is kept without a client ([`IDLE_FOR`], [`CACHED_IDLE_FOR`]).
    idle_for: Duration,
    /// The questions for the member's current resourceVersion ([`Hub::current_version`]).
    versions: RefCell<Versions>,
    /// Wakes the consistent reads waiting for a question's answer.
    versions_signal: Signal,
    /// A hub of a resource in `spec.cache`: its memory and bounds.
    cache: Option<Cached>,
}

/// A cached hub's memory and the bounds it is held to (`memory`).
struct Cached {
    meter: Arc<Meter>,
    /// `memoryBudget`: one list alone past it is dropped at once.
    budget: u64,
    /// `maxObjects` of its resource.
    max_objects: usize,
}

/// Counts a client on its hub for as long as it lives.
pub struct Joined(Rc<Hub>);

impl Drop for Joined {
    fn drop(&mut self) {
        let hub = &self.0;
        hub.clients.set(hub.clients.get().saturating_sub(1));
        if hub.clients.get() == 0 {
            hub.idle_since.set(Some(Instant::now()));
        }
    }
}

impl Hub {
    /// A hub for `key` on `cluster`, its member watch started as a task of the shard; or, with
    /// `fed`, a hub fed by the key's home shard instead (`super::across`).
    pub fn start(
        shard: Rc<ShardWatches>,
        cluster: Arc<ClusterRoute>,
        key: HubKey,
        caller: Caller,
        fed: Option<UnboundedReceiver<Update>>,
        from: Option<u64>,
    ) -> Rc<Hub> {
        let table = shard.exchange.table.load();
        let (ring_size, lag_limit) = table
            .gateway()
            .shared_watches
            .as_ref()
            .map_or((4096, 1024), |s| (s.ring_size, s.lag_limit));
        let limits = table.gateway().cache.as_ref().and_then(|c| {
            let max = c.caches(&key.group, &key.version, &key.resource)?;
            Some((c.memory_budget, max))
        });
        let idle_for = if limits.is_some() {
            CACHED_IDLE_FOR
        } else {
            IDLE_FOR
        };
        // A resource dropped from the cache is not cached again while it would not fit (or,
        // past its maxObjects, for a while): its requests go to the member, as a failed hub's.
        let ledger = memory::ledger();
        let refused = limits.and_then(|(budget, max)| ledger.refuses(&key, budget, max as u64));
        let cache = match (limits, refused) {
            (Some((budget, max_objects)), None) => Some(Cached {
                meter: ledger.meter(key.clone(), fed.is_none()),
                budget,
                max_objects,
            }),
            _ => None,
        };
        let hub = Rc::new(Hub {
            key,
            cluster,
            ring_size,
            lag_limit,
            state: RefCell::new(State {
                phase: if refused.is_some() {
                    Phase::Failed
                } else {
                    Phase::Starting
                },
                ring: VecDeque::new(),
                base: FIRST_SEQ,
                floor_rv: 0,
                start_rv: 0,
                last_rv: 0,
                listed_rv: 0,
                replaying: false,
                replayed_to: 0,
                replay_lost: false,
                objects: Objects::new(),
                columns: None,
                list_kind: None,
            }),
            signal: Signal::default(),
            clients: Cell::new(0),
            idle_since: Cell::new(Some(Instant::now())),
            first_from: Cell::new(from),
            backfilling: Cell::new(false),
            idle_for,
            versions: RefCell::new(Versions::default()),
            versions_signal: Signal::default(),
            cache,
        });
        let running = Rc::clone(&hub);
        if let Some(reason) = refused {
            debug!(cluster = %running.key.cluster, resource = %running.key.resource, ?reason, "cache: dropped; not cached again yet");
            runtime::spawn(async move {
                runtime::sleep(FAILED_FOR).await;
                shard.shared_watches.remove(&running.key, &running);
            });
            return hub;
        }
        runtime::spawn(async move {
            let phase = match fed {
                Some(updates) => {
                    let _fed = shard.exchange.shard_metrics.shared_watch_fed();
                    running.mirror(&shard, updates).await
                }
                None => {
                    let _open = shard.exchange.shard_metrics.shared_watch_opened();
                    running.run(&shard, caller).await
                }
            };
            running.end(phase);
            if let Some(cache) = &running.cache {
                memory::ledger().release(&cache.meter);
            }
            if phase == Phase::Failed {
                runtime::sleep(FAILED_FOR).await;
            }
            shard.shared_watches.remove(&running.key, &running);
        });
        hub
    }

    pub fn join(self: &Rc<Self>) -> Joined {
        if let Some(cache) = &self.cache {
            cache.meter.touch();
        }
        self.clients.set(self.clients.get() + 1);
        self.idle_since.set(None);
        Joined(Rc::clone(self))
    }

    pub fn phase(&self) -> Phase {
        self.state.borrow().phase
    }

    pub fn failed(&self) -> bool {
        self.phase() == Phase::Failed
    }

    fn end(&self, phase: Phase) {
        let mut state = self.state.borrow_mut();
        state.phase = phase;
        // Nothing is served from an ended hub: its memory goes now.
        state.drop_events();
        drop(state);
        self.signal.bump();
    }

    /// The kube path of the hub's collection.
    fn collection(&self) -> String {
        let key = &self.key;
        let mut path = if key.group.is_empty() {
            format!("/api/{}", key.version)
        } else {
            format!("/apis/{}/{}", key.group, key.version)
        };
        if !key.namespace.is_empty() {
            path.push_str("/namespaces/");
            path.push_str(&key.namespace);
        }
        path.push('/');
        path.push_str(&key.resource);
        path
    }

    fn accept(&self) -> &'static [u8] {
        match self.key.form {
            Form::Json => b"application/json",
            Form::Table => TABLE_ACCEPT,
        }
    }

    /// Lists, then watches (`member::watcher`), until the hub ends; how it ended.
    async fn run(&self, shard: &ShardWatches, caller: Caller) -> Phase {
        let own = OwnRequests::new();
        let request = own.request(caller);
        let gateway_itself = gateway_itself();
        let path = self.collection();
        let mut member = HubMember {
            shard,
            to: To {
                cluster: &self.cluster,
                identity: &gateway_itself,
                client: &request,
            },
            path: &path,
            accept: self.accept(),
        };
        let mut backoff = watcher::member_backoff();
        let mut feed = Feed(self);
        let watching = watcher::run(
            Start::List,
            &mut member,
            &mut feed,
            &ShardClock,
            &mut backoff,
            watcher::Patience::of_members(),
        );
        let retired = self.cluster.retirement.listen();
        let outside = runtime::race(retired, shard.exchange.drain.started());
        let (cluster, resource) = (&self.key.cluster, &self.key.resource);
        match runtime::race(runtime::race(watching, self.idle_or_dropped()), outside).await {
            First::Left(First::Left(ended)) => match ended {
                watcher::Ended::Refused(code) => {
                    warn!(%cluster, %resource, code, "shared watch: the member refused the gateway's own list or watch; its clients are proxied");
                    Phase::Failed
                }
                // Unreachable since the hub started: its clients are proxied.
                watcher::Ended::GaveUp => Phase::Failed,
                watcher::Ended::Retired => {
                    info!(%cluster, %resource, "shared watch: route retired; its watches end");
                    Phase::Ended
                }
                watcher::Ended::Expired(_) | watcher::Ended::Stopped => Phase::Ended,
            },
            First::Left(First::Right(())) => {
                debug!(%cluster, %resource, "shared watch: no clients, or dropped from the cache; closed");
                Phase::Ended
            }
            // The route retired, or the shard drains.
            First::Right(_) => Phase::Ended,
        }
    }

    fn idle_too_long(&self) -> bool {
        self.idle_since
            .get()
            .is_some_and(|since| since.elapsed() >= self.idle_for)
    }

    /// Resolves once the hub has had no client for its idle time, or once it is dropped from
    /// the cache (by any shard: `memory::Ledger::enforce`).
    async fn idle_or_dropped(&self) {
        match &self.cache {
            Some(cache) => {
                let dropped = cache.meter.dropped_notice();
                runtime::race(self.idle(), dropped).await;
            }
            None => self.idle().await,
        }
    }

    fn meter(&self) -> Option<&Arc<Meter>> {
        self.cache.as_ref().map(|c| &c.meter)
    }

    /// After the hub's maps changed: what they take counted, its resource's `maxObjects` and
    /// the gateway's budget held to. Whether the hub may go on (false: it was dropped).
    fn account(&self, state: &State) -> bool {
        let Some(cache) = &self.cache else {
            return true;
        };
        let meter = &cache.meter;
        let ring = state.ring.capacity() * std::mem::size_of::<Arc<Event>>();
        meter.set_maps(state.objects.len(), ring);
        if meter.lists() && state.objects.len() > cache.max_objects {
            meter.drop_for(Reason::MaxObjects, cache.max_objects as u64);
        }
        meter.ledger().enforce();
        meter.dropped().is_none()
    }

    /// Resolves once the hub has had no client for its idle time.
    async fn idle(&self) {
        loop {
            runtime::sleep(self.idle_for / 4).await;
            if self.idle_too_long() {
                return;
            }
        }
    }

    /// A list of the collection: the first time, the hub becomes ready; after a 410, what
    /// changed goes into the ring. Where the member watch starts (or goes on) from.
    fn listed(&self, body: &[u8]) -> Result<u64, Fault> {
        let list: Value =
            serde_json::from_slice(body).map_err(|_| Fault::Bad("its list is not JSON"))?;
        let list_rv = version_of(list.get("metadata"))
            .ok_or(Fault::Bad("its list has no resourceVersion"))?;
        let Ok((objects, columns)) = self.list_objects(&list, list_rv) else {
            return Err(Fault::Stop);
        };
        let mut state = self.state.borrow_mut();
        if state.columns.is_none() {
            state.columns = columns;
        }
        let text = |field: &str| list.get(field).and_then(Value::as_str).map(Box::from);
        if let (Some(kind), Some(api_version)) = (text("kind"), text("apiVersion")) {
            state.list_kind = Some((kind, api_version));
        }
        if state.phase == Phase::Starting {
            state.objects = objects;
            // A first client that listed before the hub did is served from a replay of what
            // happened since its list, rather than by a member watch of its own.
            let start = self
                .first_from
                .take()
                .filter(|&from| from > 0 && from < list_rv)
                .unwrap_or(list_rv);
            state.start_rv = start;
            state.floor_rv = start;
            state.replayed_to = start;
            state.replaying = start < list_rv;
            state.listed_rv = list_rv;
            state.last_rv = list_rv;
            state.phase = Phase::Ready;
        } else {
            self.relisted(&mut state, objects, list_rv);
        }
        // The last resourceVersion, or where a replay got to.
        let from = if state.replaying {
            state.replayed_to
        } else {
            state.last_rv
        };
        let goes_on = self.account(&state);
        drop(state);
        self.signal.bump();
        if !goes_on {
            return Err(Fault::Stop);
        }
        Ok(from)
    }

    /// Drops the hub from the cache for `reason`.
    fn drop_for(&self, reason: Reason) {
        if let Some(cache) = &self.cache {
            let limit = match reason {
                Reason::Budget => cache.budget,
                Reason::MaxObjects => cache.max_objects as u64,
            };
            cache.meter.drop_for(reason, limit);
        }
    }

    /// Whether a list of `objects` taking `bytes` so far is already past the hub's bounds: more
    /// objects than `maxObjects`, or alone more bytes than the budget.
    fn past_bounds(&self, objects: usize, bytes: u64) -> Option<Reason> {
        let cache = self.cache.as_ref()?;
        if objects > cache.max_objects {
            Some(Reason::MaxObjects)
        } else if bytes > cache.budget {
            Some(Reason::Budget)
        } else {
            None
        }
    }

    /// The objects of a list, as ADDED events, and a Table's column definitions; or, as soon
    /// as they are past the hub's bounds, why (the hub is then dropped).
    fn list_objects(&self, list: &Value, list_rv: u64) -> Result<(Objects, Option<Bytes>), Reason> {
        let api_version = list.get("apiVersion").cloned().unwrap_or(Value::Null);
        let meter = self.meter();
        let mut objects = Objects::new();
        let mut bytes = 0;
        let mut past = None;
        // An object as an ADDED event; whether the list may go on.
        let mut add = |rv: u64, object: &Value, metadata: Option<&Value>| {
            let event = Event::new(Kind::Added, rv, object, Meta::of(metadata), meter);
            bytes += event.held_bytes() + event::OBJECT_ENTRY;
            objects.insert(Arc::new(event));
            past = self.past_bounds(objects.len(), bytes);
            past.is_none()
        };
        let columns = match self.key.form {
            Form::Json => {
                let kind = list
                    .get("kind")
                    .and_then(Value::as_str)
                    .and_then(|k| k.strip_suffix("List"))
                    .unwrap_or("")
                    .to_owned();
                for item in elements(list, "items") {
                    let mut item = item.clone();
                    if let Value::Object(map) = &mut item {
                        // List items go without kind and apiVersion; watch events carry them.
                        map.entry("kind")
                            .or_insert_with(|| Value::String(kind.clone()));
                        map.entry("apiVersion")
                            .or_insert_with(|| api_version.clone());
                    }
                    let metadata = item.get("metadata");
                    let rv = version_of(metadata).unwrap_or(list_rv);
                    if !add(rv, &item, metadata) {
                        break;
                    }
                }
                None
            }
            Form::Table => {
                for row in elements(list, "rows") {
                    let metadata = row.get("object").and_then(|o| o.get("metadata"));
                    let rv = version_of(metadata).unwrap_or(list_rv);
                    let table = one_row_table(&api_version, rv, row.clone());
                    if !add(rv, &table, metadata) {
                        break;
                    }
                }
                list.get("columnDefinitions")
                    .filter(|c| c.is_array())
                    .and_then(|c| serde_json::to_vec(c).ok())
                    .map(Bytes::from)
            }
        };
        match past {
            Some(reason) => {
                // Dropped with what it holds so far, which tells when it fits again.
                if let Some(meter) = meter {
                    meter.set_maps(objects.len(), 0);
                }
                self.drop_for(reason);
                Err(reason)
            }
            None => Ok((objects, columns)),
        }
    }

    /// After a relist: what changed since the objects the hub held goes into the ring, in
    /// resourceVersion order, the deletions last at the list's resourceVersion.
    fn relisted(&self, state: &mut State, now: Objects, list_rv: u64) {
        let mut changed: Vec<Event> = Vec::new();
        for (key, event) in now.iter() {
            match state.objects.get(key) {
                Some(held) if held.rv == event.rv => {}
                held => {
                    let kind = if held.is_some() {
                        Kind::Modified
                    } else {
                        Kind::Added
                    };
                    let object: Value =
                        serde_json::from_slice(event.object()).unwrap_or(Value::Null);
                    let meta = Meta::of_event(event);
                    let mut fresh = Event::new(kind, event.rv, &object, meta, self.meter());
                    if let Some(held) = held {
                        fresh.set_previous(held.labels());
                    }
                    changed.push(fresh);
                }
            }
        }
        changed.sort_by_key(|e| e.rv);
        for (key, held) in state.objects.iter() {
            if now.contains_key(key) {
                continue;
            }
            let mut object: Value = serde_json::from_slice(held.object()).unwrap_or(Value::Null);
            set_version(&mut object, list_rv);
            let meta = Meta::of_event(held);
            changed.push(Event::new(
                Kind::Deleted,
                list_rv,
                &object,
                meta,
                self.meter(),
            ));
        }
        state.objects = now;
        for event in changed {
            self.push_ring(state, Arc::new(event));
        }
        state.last_rv = state.last_rv.max(list_rv);
    }

    /// Whether a backfill runs.
    pub fn backfilling(&self) -> bool {
        self.backfilling.get()
    }

    /// Puts what happened between `from` and the hub's start before the ring's first events, from
    /// a short member watch from `from` ([`Hub::history`]), so that a client resuming from `from`
    /// follows the hub instead of a member watch of its own. The events carry no labels-before
    /// (as replayed ones). Fails when the ring no longer holds everything since the start, or
    /// would outgrow its size.
    pub async fn backfill(&self, shard: &ShardWatches, caller: Caller, from: u64) -> Backfill {
        let running = Backfilling::mark(self);
        let until = self.state.borrow().start_rv;
        let outcome = match self.history(shard, caller, from, "", until).await {
            History::Events(events) => self.put_before(from, events),
            History::Expired => Backfill::Expired,
            History::Failed => Backfill::Failed,
        };
        drop(running);
        outcome
    }

    /// What happened after `from` up to `until`, from a short member watch of the hub's
    /// collection from `from` (with `selectors`, already encoded query pairs, a client's): the
    /// member replays its history at once, and the watch ends at the first event past `until`
    /// or after [`BACKFILL_SECONDS`] (nothing past it came: a quiet collection, or a selector
    /// that lets none through). Bookmarks are left out; at most `ring_size` events are kept.
    pub async fn history(
        &self,
        shard: &ShardWatches,
        caller: Caller,
        from: u64,
        selectors: &str,
        until: u64,
    ) -> History {
        let own = OwnRequests::new();
        let request = own.request(caller);
        let gateway_itself = gateway_itself();
        let query = format!(
            "?watch=true&timeoutSeconds={BACKFILL_SECONDS}&resourceVersion={from}{selectors}"
        );
        let mut lines = Lines::new(HistoryLines {
            hub: self,
            events: Vec::new(),
            until,
            expired: false,
            reached: false,
        });
        let streamed = match self
            .open_watch(shard, &request, &gateway_itself, &query)
            .await
        {
            Ok(answer) => ask::stream(&shard.exchange, answer, &mut lines).await,
            Err(missed) => Err(missed),
        };
        let history = lines.sink;
        if history.expired || matches!(streamed, Err(Missed::Answered(410, _))) {
            return History::Expired;
        }
        // A history watch that got past its end was cut there (its connection goes).
        if history.reached || streamed.is_ok() {
            History::Events(history.events)
        } else {
            History::Failed
        }
    }

    fn put_before(&self, from: u64, events: Vec<Event>) -> Backfill {
        let mut state = self.state.borrow_mut();
        let start = state.start_rv;
        if state.phase != Phase::Ready || state.floor_rv != start || from >= start {
            return Backfill::Failed;
        }
        let events: Vec<Event> = events
            .into_iter()
            .filter(|e| e.rv > from && e.rv <= start)
            .collect();
        if state.ring.len() + events.len() > self.ring_size || state.base < events.len() as u64 {
            return Backfill::Failed;
        }
        for event in events.into_iter().rev() {
            state.ring.push_front(Arc::new(event));
            state.base -= 1;
        }
        state.start_rv = from;
        state.floor_rv = from;
        Backfill::Filled
    }

    /// A replay the member refused (410): its events leave the ring, and clients that started
    /// among them are cut with the 410 the member would have sent them (their position is before
    /// the ring's floor); clients that start that early from now on are proxied to the member.
    /// False when no replay was under way.
    fn lose_replay(&self) -> bool {
        let mut state = self.state.borrow_mut();
        if !state.replaying {
            return false;
        }
        let listed = state.listed_rv;
        while state.ring.front().is_some_and(|e| e.rv <= listed) {
            state.ring.pop_front();
            state.base += 1;
        }
        state.floor_rv = state.floor_rv.max(listed);
        state.start_rv = listed;
        state.replaying = false;
        state.replay_lost = true;
        drop(state);
        self.signal.bump();
        true
    }

    /// The member's current resourceVersion for a consistent read: the answer of a question
    /// ([`Hub::member_version`]) sent after the read arrived, one question at a time for every
    /// read waiting, so a storm of consistent reads costs the member a few questions, not one
    /// each. None when the member did not answer.
    pub async fn current_version(&self, shard: &ShardWatches, caller: Caller) -> Option<u64> {
        let needed = self.versions.borrow().sent + 1;
        loop {
            let seen = self.versions_signal.epoch();
            let generation = {
                let mut versions = self.versions.borrow_mut();
                match versions.answered {
                    Some((generation, answer)) if generation >= needed => return answer,
                    _ if versions.asking => None,
                    _ => {
                        versions.sent += 1;
                        versions.asking = true;
                        Some(versions.sent)
                    }
                }
            };
            let Some(generation) = generation else {
                self.versions_signal.after(seen).await;
                continue;
            };
            // Cleared however the question ends (the reading client may go away mid-way).
            let asking = Asking(self);
            let answer = self.member_version(shard, caller).await;
            self.versions.borrow_mut().answered = Some((generation, answer));
            drop(asking);
            return answer;
        }
    }

    /// The member's current resourceVersion, as cheaply as it gives it: a `limit=1` list of the
    /// hub's collection, as the gateway itself, in JSON (a consistent read from the hub waits
    /// until the hub has seen it). None when the member did not answer with one.
    pub async fn member_version(&self, shard: &ShardWatches, caller: Caller) -> Option<u64> {
        let own = OwnRequests::new();
        let request = own.request(caller);
        let gateway_itself = gateway_itself();
        let path = self.collection();
        let asked = Asked {
            rest: path.as_bytes(),
            query: b"?limit=1",
            verb: "list",
        };
        let to = To {
            cluster: &self.cluster,
            identity: &gateway_itself,
            client: &request,
        };
        let body = Ask::get(&asked)
            .accept(b"application/json")
            .read(&shard.exchange, &to)
            .await
            .ok()?;
        let list: Value = serde_json::from_slice(&body).ok()?;
        version_of(list.get("metadata"))
    }

    /// Opens a member watch of the hub's collection with `query`, as the gateway itself.
    async fn open_watch(
        &self,
        shard: &ShardWatches,
        request: &ClientRequest<'_>,
        identity: &Decided,
        query: &str,
    ) -> Result<Answer, Missed> {
        let path = self.collection();
        let asked = Asked {
            rest: path.as_bytes(),
            query: query.as_bytes(),
            verb: "watch",
        };
        let to = To {
            cluster: &self.cluster,
            identity,
            client: request,
        };
        Ask::get(&asked)
            .accept(self.accept())
            .open_watch(&shard.exchange, &to)
            .await
    }

    /// One member event into the ring; whether the hub goes on (false: it was dropped from the
    /// cache, this event past its bounds).
    fn receive(&self, event: Value) -> Result<bool, Received> {
        let mut event = self.parse(event)?;
        let mut state = self.state.borrow_mut();
        if matches!(event.kind, Kind::Added | Kind::Modified)
            && !state.replays(event.kind, event.rv)
        {
            if let Some(held) = state.objects.get(event.key()) {
                event.set_previous(held.labels());
            }
        }
        self.apply(&mut state, Arc::new(event));
        let goes_on = self.account(&state);
        drop(state);
        self.signal.bump();
        Ok(goes_on)
    }

    /// One member watch event, parsed (a Table's column definitions kept on the way).
    fn parse(&self, mut event: Value) -> Result<Event, Received> {
        let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
        if kind == "ERROR" {
            let code = event
                .get("object")
                .and_then(|o| o.get("code"))
                .and_then(Value::as_u64);
            return Err(if code == Some(410) {
                Received::Expired
            } else {
                Received::Bad
            });
        }
        let kind = Kind::parse(kind).ok_or(Received::Bad)?;
        let object = event.get_mut("object").ok_or(Received::Bad)?;
        let rv = version_of(object.get("metadata")).ok_or(Received::Bad)?;
        let meta = match self.key.form {
            Form::Json => Meta::of(object.get("metadata")),
            Form::Table => {
                if let Value::Object(table) = object {
                    if let Some(columns) = table.insert("columnDefinitions".into(), Value::Null) {
                        let mut state = self.state.borrow_mut();
                        if state.columns.is_none() && columns.is_array() {
                            state.columns = serde_json::to_vec(&columns).ok().map(Bytes::from);
                        }
                    }
                }
                Meta::of(
                    object
                        .get("rows")
                        .and_then(|rows| rows.get(0))
                        .and_then(|row| row.get("object"))
                        .and_then(|o| o.get("metadata")),
                )
            }
        };
        Ok(Event::new(kind, rv, object, meta, self.meter()))
    }

    /// An event (its `previous` labels set) into the objects held and the ring; a replayed one
    /// (at or before the list the objects came from) into the ring only.
    fn apply(&self, state: &mut State, event: Arc<Event>) {
        let rv = event.rv;
        if state.replays(event.kind, rv) {
            state.replayed_to = rv;
            self.push_ring(state, event);
            return;
        }
        state.replaying = false;
        match event.kind {
            Kind::Added | Kind::Modified => {
                state.objects.insert(Arc::clone(&event));
                self.push_ring(state, event);
            }
            Kind::Deleted => {
                state.objects.remove(event.key());
                self.push_ring(state, event);
            }
            Kind::Bookmark => self.push_ring(state, event),
        }
        state.last_rv = state.last_rv.max(rv);
    }

    fn push_ring(&self, state: &mut State, event: Arc<Event>) {
        state.ring.push_back(event);
        while state.ring.len() > self.ring_size {
            if let Some(oldest) = state.ring.pop_front() {
                state.base += 1;
                state.floor_rv = state.floor_rv.max(oldest.rv);
            }
        }
    }
}

/// What a hub on another shard than its key's home is fed by the home (`super::across`).
pub enum Update {
    /// What the home's hub holds when the feed starts (Ready); always first.
    Snapshot(Box<State>),
    /// One event, as it entered the home's ring.
    Event(Arc<Event>),
    /// A Table hub's column definitions, learned after the snapshot.
    Columns(Bytes),
    /// The home's hub ended, or failed: so does the mirror.
    End(Phase),
}

impl Hub {
    /// A mirror's life: the home's snapshot, then its events into this hub's ring, until the
    /// home ends the feed (its phase), or this hub ends (no clients, the route retired, the
    /// shard drains).
    async fn mirror(&self, shard: &ShardWatches, mut updates: UnboundedReceiver<Update>) -> Phase {
        let retired = self.cluster.retirement.listen();
        let mut outside = std::pin::pin!(runtime::race(retired, shard.exchange.drain.started()));
        let mut idle = std::pin::pin!(self.idle());
        loop {
            let first = match runtime::race(
                runtime::race(updates.recv(), idle.as_mut()),
                outside.as_mut(),
            )
            .await
            {
                First::Left(First::Left(Some(update))) => update,
                // The home's shard is gone (its feed dropped unfinished).
                First::Left(First::Left(None)) => return Phase::Ended,
                First::Left(First::Right(())) | First::Right(_) => return Phase::Ended,
            };
            // Everything already sent, then one wake-up for the clients.
            let mut next = Some(first);
            let mut ended = None;
            {
                let mut state = self.state.borrow_mut();
                while let Some(update) = next.take() {
                    match update {
                        Update::Snapshot(snapshot) => {
                            *state = *snapshot;
                            // Its clients keep the home's hub in use.
                            if let Some(meter) = self.meter() {
                                meter.ledger().adopt_home(meter);
                            }
                        }
                        Update::Event(event) => self.apply(&mut state, event),
                        Update::Columns(columns) => state.columns = Some(columns),
                        Update::End(phase) => {
                            ended = Some(phase);
                            break;
                        }
                    }
                    next = updates.try_recv().ok();
                }
                self.account(&state);
            }
            self.signal.bump();
            if let Some(phase) = ended {
                return phase;
            }
        }
    }
}

/// A Table of one row, as the member sends it in a watch event.
fn one_row_table(api_version: &Value, rv: u64, row: Value) -> Value {
    let mut table = Map::new();
    table.insert("kind".into(), Value::String("Table".into()));
    table.insert("apiVersion".into(), api_version.clone());
    table.insert(
        "metadata".into(),
        serde_json::json!({"resourceVersion": rv.to_string()}),
    );
    table.insert("columnDefinitions".into(), Value::Null);
    table.insert("rows".into(), Value::Array(vec![row]));
    Value::Object(table)
}

fn set_version(object: &mut Value, rv: u64) {
    if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
        metadata.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// The hub's own requests go as the gateway itself: the Cluster's credentials, no
/// impersonation (clients are admitted one by one by `access`).
fn gateway_itself() -> Decided {
    Decided {
        identity: None,
        authenticated: None,
        pass_through: false,
    }
}

/// The questions for the member's current resourceVersion: how many were sent, the last
/// answer (with its question's number) and whether one is out.
#[derive(Default)]
struct Versions {
    sent: u64,
    answered: Option<(u64, Option<u64>)>,
    asking: bool,
}

/// A question out for the member's current resourceVersion: its end, or its future dropped
/// unfinished, lets the next read ask and wakes the reads waiting.
struct Asking<'h>(&'h Hub);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.versions.borrow_mut().asking = false;
        self.0.versions_signal.bump();
    }
}

/// A running backfill, marked on its hub while it lives: its end, or its future dropped
/// unfinished (the client's connection closed), clears the mark and wakes the clients waiting.
struct Backfilling<'h>(&'h Hub);

impl<'h> Backfilling<'h> {
    fn mark(hub: &'h Hub) -> Self {
        hub.backfilling.set(true);
        Backfilling(hub)
    }
}

impl Drop for Backfilling<'_> {
    fn drop(&mut self) {
        self.0.backfilling.set(false);
        self.0.signal.bump();
    }
}

/// What a history watch got.
pub enum History {
    /// The events after its start up to its end, in order, bookmarks left out.
    Events(Vec<Event>),
    /// The member no longer holds that version (its 410).
    Expired,
    /// It could not be done (the member unreachable or refusing, a history longer than the ring).
    Failed,
}

/// How a backfill went.
pub enum Backfill {
    /// The ring now starts at the client's version.
    Filled,
    /// The member no longer holds that version (its 410).
    Expired,
    /// It could not be done (the member unreachable, the ring moved on): proxy the client.
    Failed,
}

enum Received {
    Expired,
    Bad,
    /// A history's first event past its end.
    Reached,
    /// A history longer than the ring.
    TooMany,
}

/// The hub's side of its member watch (`member::watcher`): lists and events into the hub.
struct Feed<'h>(&'h Hub);

impl watcher::Handler for Feed<'_> {
    async fn listed(&mut self, body: Vec<u8>) -> Result<String, Fault> {
        self.0.listed(&body).map(|from| from.to_string())
    }

    async fn event(&mut self, event: Value) -> Result<(), Fault> {
        match self.0.receive(event) {
            Ok(true) => Ok(()),
            // Dropped from the cache: the hub ends.
            Ok(false) => Err(Fault::Stop),
            Err(_) => Err(Fault::Bad(
                "a member's watch event is not one the hub reads",
            )),
        }
    }

    fn expired(&mut self, _status: &Value) -> AfterExpiry {
        let hub = self.0;
        let (cluster, resource) = (&hub.key.cluster, &hub.key.resource);
        if hub.lose_replay() {
            info!(%cluster, %resource, "shared watch: the member cannot replay from the first client's resourceVersion; watching from its list");
            return AfterExpiry::WatchFrom(hub.state.borrow().last_rv.to_string());
        }
        info!(%cluster, %resource, "shared watch: member's resourceVersion expired; listing again");
        AfterExpiry::Relist
    }

    fn rewatch(&mut self, from: &str) {
        let (cluster, resource) = (&self.0.key.cluster, &self.0.key.resource);
        info!(%cluster, %resource, from, "shared watch: the member ended its watch; watching again");
    }

    fn stalled(&mut self, from: &str) {
        let (cluster, resource) = (&self.0.key.cluster, &self.0.key.resource);
        warn!(%cluster, %resource, from, "shared watch: the member sent nothing past the stall deadline; watching again");
    }

    /// A hub whose member has been unreachable since it started gives up once its backoff is
    /// at its cap: its clients are proxied.
    async fn failed(&mut self, missed: &Missed, backoff: &Backoff) -> Result<(), Fault> {
        let hub = self.0;
        let (cluster, resource) = (&hub.key.cluster, &hub.key.resource);
        let reason = match missed {
            Missed::Answered(code, message) => format!("{code} {message}"),
            Missed::Failed(reason) => reason.clone(),
        };
        warn!(%cluster, %resource, %reason, "shared watch: member unreachable; trying again");
        if hub.phase() == Phase::Starting && backoff.at_cap() {
            return Err(Fault::Bad(
                "the member has been unreachable since the hub started",
            ));
        }
        Ok(())
    }
}

/// The hub's member: its own list and watches of the collection, as the gateway itself.
struct HubMember<'a> {
    shard: &'a ShardWatches,
    to: To<'a, ClientRequest<'a>>,
    path: &'a str,
    accept: &'static [u8],
}

impl watcher::Member for HubMember<'_> {
    type Opened = Answer;

    async fn list(&mut self) -> Result<Vec<u8>, Missed> {
        let asked = Asked {
            rest: self.path.as_bytes(),
            query: b"",
            verb: "list",
        };
        Ask::get(&asked)
            .accept(self.accept)
            .read(&self.shard.exchange, &self.to)
            .await
    }

    async fn open(&mut self, from: &str, _resumed: bool) -> Result<Answer, Missed> {
        let query = format!("?watch=true&allowWatchBookmarks=true&resourceVersion={from}");
        let asked = Asked {
            rest: self.path.as_bytes(),
            query: query.as_bytes(),
            verb: "watch",
        };
        Ask::get(&asked)
            .accept(self.accept)
            .open_watch(&self.shard.exchange, &self.to)
            .await
    }

    async fn stream(&mut self, answer: Answer, body: &mut impl ResponseSink) -> Result<(), Missed> {
        ask::stream(&self.shard.exchange, answer, body).await
    }

    fn retired(&self) -> bool {
        self.to.cluster.retirement.is_retired()
    }
}

/// A history watch's lines ([`Hub::history`]), kept aside rather than put into the ring.
struct HistoryLines<'h> {
    hub: &'h Hub,
    events: Vec<Event>,
    /// The history ends at the first event past this resourceVersion.
    until: u64,
    expired: bool,
    /// The history got past `until`.
    reached: bool,
}

impl LineSink for HistoryLines<'_> {
    async fn line(&mut self, line: &[u8]) -> Result<(), Failure> {
        let received = serde_json::from_slice(line)
            .map_err(|_| Received::Bad)
            .and_then(|event| self.hub.parse(event))
            .and_then(|event| {
                if event.rv > self.until {
                    self.reached = true;
                    return Err(Received::Reached);
                }
                if event.kind == Kind::Bookmark {
                    return Ok(());
                }
                if self.events.len() >= self.hub.ring_size {
                    return Err(Received::TooMany);
                }
                self.events.push(event);
                Ok(())
            });
        match received {
            Ok(()) => Ok(()),
            Err(Received::Expired) => {
                self.expired = true;
                Err(Failure::Abort("the member's resourceVersion expired"))
            }
            Err(Received::Reached) => Err(Failure::Abort("the history is complete")),
            Err(Received::TooMany) => Err(Failure::Abort(
                "the member's history is longer than the hub's ring",
            )),
            Err(Received::Bad) => Err(Failure::Abort(
                "a member's watch event is not one the hub reads",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: Kind, rv: u64) -> Arc<Event> {
        let object = serde_json::json!({"kind": "ConfigMap", "metadata": {"name": "a", "resourceVersion": rv.to_string()}});
        let metadata = object.get("metadata");
        Arc::new(Event::new(kind, rv, &object, Meta::of(metadata), None))
    }

    #[test]
    fn an_event_is_encoded_once_and_its_variants_share_the_object() {
        let e = event(Kind::Modified, 7);
        let line = e.line(Kind::Modified, None);
        assert!(
            line.starts_with(b"{\"type\":\"MODIFIED\",\"object\":{"),
            "{line:?}"
        );
        assert!(line.ends_with(b"}}\n"));
        // The same bytes for every client.
        assert_eq!(line.as_ptr(), e.line(Kind::Modified, None).as_ptr());
        let added = e.line(Kind::Added, None);
        assert!(added.starts_with(b"{\"type\":\"ADDED\",\"object\":{"));
        assert_eq!(added.as_ptr(), e.line(Kind::Added, None).as_ptr());
        let v: Value = serde_json::from_slice(&e.line(Kind::Deleted, None)).unwrap();
        assert_eq!(v["type"], "DELETED");
        assert_eq!(v["object"]["metadata"]["name"], "a");
    }

    #[test]
    fn the_ring_keeps_its_size_and_seeks_by_resource_version() {
        let mut state = State {
            phase: Phase::Ready,
            ring: VecDeque::new(),
            base: 0,
            floor_rv: 10,
            start_rv: 10,
            last_rv: 10,
            listed_rv: 10,
            replaying: false,
            replayed_to: 10,
            replay_lost: false,
            objects: Objects::new(),
            columns: None,
            list_kind: None,
        };
        let ring_size = 4;
        for rv in 11..=16 {
            state.ring.push_back(event(Kind::Modified, rv));
            while state.ring.len() > ring_size {
                let oldest = state.ring.pop_front().unwrap();
                state.base += 1;
                state.floor_rv = oldest.rv;
            }
        }
        assert_eq!((state.base, state.floor_rv, state.next_seq()), (2, 12, 6));
        assert_eq!(state.seek(12), 2);
        assert_eq!(state.at(state.seek(12)).unwrap().rv, 13);
        assert_eq!(state.seek(16), 6);
        assert!(state.at(1).is_none());
        // An ended hub drops its events; a client at seq 3 (rv 13 sent, 14-16 not) is still
        // behind (config churn in the chaos run lost such clients' events to a last bookmark).
        let next = state.next_seq();
        state.drop_events();
        assert_eq!(state.next_seq(), next);
        assert!(3 < state.next_seq() && state.ring.is_empty());
    }
}
