//! The cache's memory and its bounds (`spec.cache`: `memoryBudget`, `maxObjects`;
//! docs/cache.md#memory).
//!
//! Each hub of a cached resource has a [`Meter`]: the bytes of its events (each counts itself
//! from its making to its drop, `event::Event::held_bytes`), the entries of its maps, and its
//! objects; every meter adds into the gateway's totals (`observe::metrics::CACHE_MEMORY`), which
//! every shard reads. After each list and each event that adds bytes, the hub asks the
//! [`Ledger`] to [`Ledger::enforce`] the budget: past it, the least recently used hubs (of any
//! shard) are marked dropped until what stays fits, and each ends as soon as its shard sees the
//! mark (its clients then resume or list again from the member, as after any hub end). A hub
//! whose resource holds more objects than its `maxObjects` is dropped too.
//!
//! A dropped key is not cached again ([`Ledger::refuses`]) while the cache would pass its budget
//! with it (the bytes it held when dropped), and a resource dropped for its `maxObjects` not for
//! [`COOL_OFF`], unless the limit changed; meanwhile its LISTs and watches go to the member. The
//! drops of the last [`COOL_OFF`] are told by `/readyz?verbose` ([`Ledger::dropped`]).
//!
//! Shared by the shards without a lock: atomics, and lists (the meters that may be dropped, the
//! drops) published with arc-swap, changed only when a hub starts or ends or is dropped. Called
//! by the hub (`super`) and the admin listener (`server::admin`).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::Notify;
use tracing::warn;

use super::event::OBJECT_ENTRY;
use crate::observe::metrics::{CacheMemory, CACHE_MEMORY};
use crate::watch::{Form, HubKey};

/// How long a resource dropped for its `maxObjects` is not cached again (unless the limit
/// changes): the member may have shrunk by then; if not, it costs the member one list each time.
pub const COOL_OFF: Duration = Duration::from_secs(600);

/// Why a hub was dropped from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The cache passed `memoryBudget`.
    Budget,
    /// The resource passed its `maxObjects`.
    MaxObjects,
}

impl Reason {
    fn code(self) -> u8 {
        match self {
            Reason::Budget => 1,
            Reason::MaxObjects => 2,
        }
    }

    fn of(code: u8) -> Option<Reason> {
        match code {
            1 => Some(Reason::Budget),
            2 => Some(Reason::MaxObjects),
            _ => None,
        }
    }
}

/// The gateway's cache memory: its totals, the hubs that may be dropped, the drops.
pub struct Ledger {
    counters: &'static CacheMemory,
    /// `memoryBudget`, as of the last hub started.
    budget: AtomicU64,
    /// Where the meters' `last_used` counts from.
    epoch: Instant,
    /// The live meters of hubs that list their members (not mirrors): the ones a budget drops.
    meters: ArcSwap<Vec<Arc<Meter>>>,
    /// The drops of the last [`COOL_OFF`] not lifted since.
    drops: ArcSwap<Vec<Arc<Dropped>>>,
}

/// One hub dropped from the cache.
#[derive(Debug)]
pub struct Dropped {
    pub key: HubKey,
    pub reason: Reason,
    /// What the hub held when it was dropped.
    pub bytes: u64,
    pub objects: u64,
    /// The budget, or the `maxObjects`, it passed.
    pub limit: u64,
    pub at: Instant,
}

/// The gateway's ledger.
pub fn ledger() -> &'static Arc<Ledger> {
    static LEDGER: OnceLock<Arc<Ledger>> = OnceLock::new();
    LEDGER.get_or_init(|| Ledger::new(&CACHE_MEMORY))
}

impl Ledger {
    pub fn new(counters: &'static CacheMemory) -> Arc<Ledger> {
        Arc::new(Ledger {
            counters,
            budget: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            meters: ArcSwap::from_pointee(Vec::new()),
            drops: ArcSwap::from_pointee(Vec::new()),
        })
    }

    /// A meter for a new hub of `key`; `evictable` when the hub lists its member (a mirror's
    /// events are its home's: dropping the home ends it).
    pub fn meter(self: &Arc<Self>, key: HubKey, evictable: bool) -> Arc<Meter> {
        let meter = Arc::new(Meter {
            ledger: Arc::clone(self),
            key,
            evictable,
            bytes: AtomicU64::new(0),
            index: AtomicU64::new(0),
            objects: AtomicU64::new(0),
            last_used: AtomicU64::new(self.now()),
            dropped: AtomicU8::new(0),
            notice: Notify::new(),
            home: OnceLock::new(),
        });
        if evictable {
            self.meters.rcu(|meters| {
                let mut meters = Vec::clone(meters);
                meters.push(Arc::clone(&meter));
                meters
            });
        }
        meter
    }

    /// A mirror's meter (`meter`) learns its home's, once the home's hub fed it.
    pub fn adopt_home(&self, meter: &Meter) {
        if meter.evictable || meter.home.get().is_some() {
            return;
        }
        if let Some(home) = self.meters.load().iter().find(|m| m.key == meter.key) {
            let _ = meter.home.set(Arc::clone(home));
        }
    }

    /// A hub ended: its meter is no longer one to drop (its events count until they are gone).
    pub fn release(&self, meter: &Arc<Meter>) {
        meter.set_maps(0, 0);
        if meter.evictable {
            self.meters.rcu(|meters| {
                let mut meters = Vec::clone(meters);
                meters.retain(|m| !Arc::ptr_eq(m, meter));
                meters
            });
        }
    }

    /// The bytes the cache holds now.
    pub fn bytes(&self) -> u64 {
        self.counters.bytes.load(Ordering::Relaxed)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether a new hub of `key` (a cached resource whose members may hold `max_objects`, in a
    /// cache of `budget` bytes) must not start: the cache is at its budget, or would pass it
    /// again with what the key held when it was dropped, or its resource passed its
    /// `maxObjects` within [`COOL_OFF`] (and the limit is the same). A key that may start again
    /// leaves the drops.
    pub fn refuses(&self, key: &HubKey, budget: u64, max_objects: u64) -> Option<Reason> {
        self.budget.store(budget, Ordering::Relaxed);
        let held = self.bytes();
        let drops = self.drops.load();
        let mut refused = (held >= budget).then_some(Reason::Budget);
        for dropped in drops.iter() {
            match dropped.reason {
                Reason::MaxObjects
                    if same_resource(&dropped.key, key)
                        && dropped.limit == max_objects
                        && dropped.at.elapsed() < COOL_OFF =>
                {
                    refused = Some(Reason::MaxObjects);
                }
                Reason::Budget
                    if dropped.key == *key && held.saturating_add(dropped.bytes) > budget =>
                {
                    refused = refused.or(Some(Reason::Budget));
                }
                _ => {}
            }
        }
        if refused.is_none() && drops.iter().any(|d| same_resource(&d.key, key)) {
            self.drops.rcu(|drops| {
                let mut drops = Vec::clone(drops);
                drops.retain(|d| !same_resource(&d.key, key));
                drops
            });
        }
        refused
    }

    /// Past the budget, drops the least recently used hubs until what the others hold fits
    /// (those already dropped count as gone: they end as soon as their shards see it).
    pub fn enforce(&self) {
        let budget = self.budget.load(Ordering::Relaxed);
        let held = self.bytes();
        if held <= budget {
            return;
        }
        let meters = self.meters.load();
        let going: u64 = meters
            .iter()
            .filter(|m| m.dropped().is_some())
            .map(|m| m.bytes())
            .sum();
        let mut excess = held.saturating_sub(going).saturating_sub(budget);
        if excess == 0 {
            return;
        }
        let mut live: Vec<&Arc<Meter>> = meters.iter().filter(|m| m.dropped().is_none()).collect();
        live.sort_by_key(|m| m.last_used.load(Ordering::Relaxed));
        for meter in live {
            if excess == 0 {
                break;
            }
            let bytes = meter.bytes();
            if meter.drop_for(Reason::Budget, budget) {
                excess = excess.saturating_sub(bytes);
            }
        }
    }

    fn record(&self, dropped: Dropped) {
        let dropped = Arc::new(dropped);
        self.drops.rcu(|drops| {
            let mut drops = Vec::clone(drops);
            drops.retain(|d| d.at.elapsed() < COOL_OFF && d.key != dropped.key);
            drops.push(Arc::clone(&dropped));
            drops
        });
    }

    /// The drops of the last [`COOL_OFF`] not lifted since, oldest first.
    pub fn dropped(&self) -> Vec<Arc<Dropped>> {
        self.drops
            .load()
            .iter()
            .filter(|d| d.at.elapsed() < COOL_OFF)
            .cloned()
            .collect()
    }
}

/// Whether two keys are of the same member's resource (any namespace, any form).
fn same_resource(a: &HubKey, b: &HubKey) -> bool {
    a.cluster == b.cluster
        && a.route == b.route
        && a.group == b.group
        && a.version == b.version
        && a.resource == b.resource
}

/// One hub's memory.
pub struct Meter {
    ledger: Arc<Ledger>,
    pub key: HubKey,
    evictable: bool,
    /// Everything it holds: its events and `index`.
    bytes: AtomicU64,
    /// Its maps' entries (the objects', the ring's).
    index: AtomicU64,
    objects: AtomicU64,
    /// When a client last joined, in ms since the ledger's epoch.
    last_used: AtomicU64,
    /// 0, or the [`Reason`] it was dropped for.
    dropped: AtomicU8,
    /// Wakes the hub's task when it is dropped (from any shard).
    notice: Notify,
    /// A mirror's: its home's meter, which its clients keep in use.
    home: OnceLock<Arc<Meter>>,
}

impl Meter {
    /// Its own count and the gateway's.
    fn counts(&self) -> [&AtomicU64; 2] {
        [&self.bytes, &self.ledger.counters.bytes]
    }

    pub fn add(&self, bytes: u64) {
        for count in self.counts() {
            count.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    pub fn sub(&self, bytes: u64) {
        for count in self.counts() {
            count.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Sets what the hub's maps hold: `objects` entries in its ordered objects (each
    /// [`OBJECT_ENTRY`] bytes besides its event) and `ring_bytes` of ring slots.
    pub fn set_maps(&self, objects: usize, ring_bytes: usize) {
        self.set_index(objects as u64 * OBJECT_ENTRY + ring_bytes as u64);
        self.set_objects(objects as u64);
    }

    /// Sets what the hub's maps take besides their events.
    fn set_index(&self, bytes: u64) {
        let before = self.index.swap(bytes, Ordering::Relaxed);
        if bytes >= before {
            self.add(bytes - before);
        } else {
            self.sub(before - bytes);
        }
    }

    /// Sets how many objects the hub holds (a mirror's are its home's: not counted again).
    fn set_objects(&self, objects: u64) {
        if !self.evictable {
            return;
        }
        let counter = &self.ledger.counters.objects;
        let before = self.objects.swap(objects, Ordering::Relaxed);
        if objects >= before {
            counter.fetch_add(objects - before, Ordering::Relaxed);
        } else {
            counter.fetch_sub(before - objects, Ordering::Relaxed);
        }
    }

    /// A client joined the hub (or a mirror of it).
    pub fn touch(&self) {
        self.last_used.store(self.ledger.now(), Ordering::Relaxed);
        if let Some(home) = self.home.get() {
            home.touch();
        }
    }

    /// Whether its hub lists the member (not a mirror's).
    pub fn lists(&self) -> bool {
        self.evictable
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn dropped(&self) -> Option<Reason> {
        Reason::of(self.dropped.load(Ordering::Relaxed))
    }

    /// Marks the hub dropped for `reason` (past `limit`), counted and recorded, and wakes its
    /// task; false when it already was.
    pub fn drop_for(&self, reason: Reason, limit: u64) -> bool {
        if self
            .dropped
            .compare_exchange(0, reason.code(), Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let counters = self.ledger.counters;
        let counter = match reason {
            Reason::Budget => &counters.dropped_for_budget,
            Reason::MaxObjects => &counters.dropped_for_max_objects,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let (bytes, objects) = (self.bytes(), self.objects.load(Ordering::Relaxed));
        let key = &self.key;
        warn!(cluster = %key.cluster, resource = %key.resource, namespace = %key.namespace, ?reason, bytes, objects, limit, "cache: dropped; its LISTs go to the member");
        self.ledger.record(Dropped {
            key: key.clone(),
            reason,
            bytes,
            objects,
            limit,
            at: Instant::now(),
        });
        self.notice.notify_one();
        true
    }

    /// Resolves once the hub is dropped.
    pub async fn dropped_notice(&self) {
        while self.dropped().is_none() {
            self.notice.notified().await;
        }
    }
}

impl Dropped {
    /// One line of `/readyz?verbose`: which resource, why, and since when.
    pub fn describe(&self) -> String {
        let key = &self.key;
        let group = if key.group.is_empty() {
            String::new()
        } else {
            format!(".{}", key.group)
        };
        let scope = if key.namespace.is_empty() {
            "all namespaces".to_owned()
        } else {
            format!("namespace {}", key.namespace)
        };
        let form = match key.form {
            Form::Json => "",
            Form::Table => ", Table form",
        };
        let why = match self.reason {
            Reason::Budget => format!(
                "the cache passed its memoryBudget of {} bytes (this resource held {} bytes, {} objects); cached again once it fits",
                self.limit, self.bytes, self.objects
            ),
            Reason::MaxObjects => format!(
                "its {} objects passed its maxObjects of {}; not cached again for {} s or until the limit changes",
                self.objects,
                self.limit,
                COOL_OFF.as_secs()
            ),
        };
        format!(
            "cluster {} {}{} ({scope}{form}) dropped {} s ago: {why}; its LISTs go to the member",
            key.cluster,
            key.resource,
            group,
            self.at.elapsed().as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(resource: &str) -> HubKey {
        HubKey {
            cluster: "member1".into(),
            route: 1,
            group: String::new(),
            version: "v1".into(),
            resource: resource.into(),
            namespace: String::new(),
            form: Form::Json,
        }
    }

    fn ledger_of_its_own() -> Arc<Ledger> {
        Ledger::new(Box::leak(Box::default()))
    }

    #[test]
    fn past_the_budget_the_least_recently_used_go_first_and_stay_out_until_they_fit() {
        let ledger = ledger_of_its_own();
        assert_eq!(ledger.refuses(&key("pods"), 1000, 10), None);
        let pods = ledger.meter(key("pods"), true);
        let configmaps = ledger.meter(key("configmaps"), true);
        let secrets = ledger.meter(key("secrets"), true);
        pods.add(300);
        configmaps.add(300);
        secrets.add(300);
        // Used since: configmaps, then pods; secrets the least recently.
        std::thread::sleep(Duration::from_millis(2));
        configmaps.touch();
        std::thread::sleep(Duration::from_millis(2));
        pods.touch();
        ledger.enforce();
        assert_eq!(secrets.dropped(), None);
        pods.add(200);
        ledger.enforce();
        assert_eq!(secrets.dropped(), Some(Reason::Budget));
        assert_eq!((configmaps.dropped(), pods.dropped()), (None, None));
        assert_eq!(
            ledger.counters.dropped_for_budget.load(Ordering::Relaxed),
            1
        );
        // Not again while it would not fit.
        assert_eq!(
            ledger.refuses(&key("secrets"), 1000, 10),
            Some(Reason::Budget)
        );
        secrets.sub(300);
        ledger.release(&secrets);
        assert_eq!(
            ledger.refuses(&key("secrets"), 1000, 10),
            Some(Reason::Budget)
        );
        pods.sub(500);
        assert_eq!(ledger.refuses(&key("secrets"), 1000, 10), None);
        assert!(ledger.dropped().is_empty(), "lifted");
        // At the budget, nothing new starts.
        pods.add(700);
        assert_eq!(
            ledger.refuses(&key("nodes"), 1000, 10),
            Some(Reason::Budget)
        );
    }

    #[test]
    fn a_resource_past_its_max_objects_stays_out_until_the_limit_changes() {
        let ledger = ledger_of_its_own();
        let pods = ledger.meter(key("pods"), true);
        pods.set_objects(11);
        assert!(pods.drop_for(Reason::MaxObjects, 10));
        assert!(!pods.drop_for(Reason::Budget, 10), "once");
        let mut other_scope = key("pods");
        other_scope.namespace = "default".into();
        assert_eq!(
            ledger.refuses(&other_scope, 1000, 10),
            Some(Reason::MaxObjects)
        );
        assert_eq!(ledger.refuses(&key("configmaps"), 1000, 10), None);
        let lines = ledger.dropped();
        assert_eq!(lines.len(), 1);
        let line = lines[0].describe();
        assert!(
            line.contains("cluster member1 pods") && line.contains("maxObjects of 10"),
            "{line}"
        );
        assert_eq!(ledger.refuses(&key("pods"), 1000, 20), None, "a new limit");
    }
}
