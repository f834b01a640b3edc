//! A relist storm through the cache (issue 34, docs/cache.md): 200 kube-rs informers
//! (`kube::runtime::watcher` feeding a `reflector` store) of all of member1's configmaps start
//! together through a gateway that caches configmaps (`spec.cache`; one worker, so one shard
//! and one hub, the shared watches' default scope), then the gateway is replaced under them (a
//! TCP front keeps the address) while the member is written to, and every one of them lists
//! again. Every informer's store ends with the member's exact objects (names and
//! resourceVersions) after a last marker write. The member's LISTs are counted
//! (`fleetgate_sim_requests_total{verb="list",resource="configmaps"}`) and split by its request
//! log into the gateway's `limit=1` questions and full LISTs.
//!
//! What kube-rs 5 sends (kube-runtime's `watcher.rs`, kube-core's `ListParams`):
//! - `watcher::Config::default()` is `ListSemantic::MostRecent` with a page size of 500: its first
//!   LIST and every relist carry `limit=500` and no `resourceVersion`, a consistent read.
//! - `.any_semantic()` sends `resourceVersion=0` (`resourceVersionMatch=NotOlderThan`) only
//!   without a page size: with one, kube-core leaves the resourceVersion out (a consistent read
//!   again).
//! - A watch that ends, or cannot start (the gateway is down), starts again from the informer's
//!   last resourceVersion: a gateway restart alone makes no informer list again. It relists
//!   only on a 410, so the member here keeps a short history (`--history-window 10`) and gets
//!   20 writes while the gateway is down: the informers' versions leave its window, the new
//!   hub passes the member's 410 on to them (docs/watches.md, watches from before the hub's
//!   start), and all 200 relist.
//!
//! What the member sees, at the start and in the storm alike, with one cached key
//! (cluster-wide configmaps): one full LIST, the hub's own. At `resourceVersion=0` nothing
//! else; with consistent reads also one `limit=1` LIST per informer's list, the gateway's
//! question for the member's current resourceVersion (docs/cache.md), the items from memory.
//! (Not bounded here: in the storm the member also gets about one short backfill watch per
//! informer, each answered with its 410.) The same holds on two shards with `scope: Gateway`.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use support::cache::{cache_configmaps_in_scope, member_lists};
use support::fleet::Fleet;
use support::front::{gateway_client, Front};
use support::kubectl::kube_client;
use support::wait::wait_for_or;

const INFORMERS: usize = 200;
/// ConfigMaps the member starts with, spread over load-0 .. load-9 (about 1 KiB each).
const OBJECTS: usize = 300;
/// Events the member keeps for a watch to resume from; the restart's writes are more.
const HISTORY: usize = 10;

/// One kube-rs informer: its reflector's store, and how many lists it completed.
struct Informer {
    store: Store<ConfigMap>,
    lists: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// `INFORMERS` informers of all configmaps through `client`, each a `watcher` with `config`
/// (and kube-rs's default backoff, as controllers run it) feeding a reflector store.
fn start_informers(fleet: &Fleet, client: &Client, config: &watcher::Config) -> Vec<Informer> {
    (0..INFORMERS)
        .map(|_| {
            let (store, writer) = reflector::store::<ConfigMap>();
            let api: Api<ConfigMap> = Api::all(client.clone());
            let lists = Arc::new(AtomicUsize::new(0));
            let counted = Arc::clone(&lists);
            let events = watcher(api, config.clone())
                .default_backoff()
                .reflect(writer);
            let task = fleet.runtime.spawn(events.for_each(move |event| {
                if matches!(event, Ok(watcher::Event::InitDone)) {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                std::future::ready(())
            }));
            Informer { store, lists, task }
        })
        .collect()
}

/// `(namespace, name)` to resourceVersion of each configmap.
fn versions<'a>(
    objects: impl Iterator<Item = &'a ConfigMap>,
) -> BTreeMap<(String, String), String> {
    objects
        .map(|cm| {
            let m = &cm.metadata;
            (
                (m.namespace.clone().unwrap(), m.name.clone().unwrap()),
                m.resource_version.clone().unwrap(),
            )
        })
        .collect()
}

/// 20 changes on the member (12 creates, 5 patches, 3 deletes), more than its history keeps.
async fn write_while_away(member: &Client) {
    for i in 0..12 {
        let api: Api<ConfigMap> = Api::namespaced(member.clone(), &format!("load-{}", i % 10));
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(format!("away-{i}"));
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    for i in 0..5 {
        let api: Api<ConfigMap> = Api::namespaced(member.clone(), &format!("load-{i}"));
        let patch = serde_json::json!({"data": {"i": i.to_string()}});
        api.patch(
            &format!("away-{i}"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    }
    for i in 5..8 {
        let api: Api<ConfigMap> = Api::namespaced(member.clone(), &format!("load-{i}"));
        api.delete(&format!("away-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
}

/// The LISTs of configmaps the member served from `from` (a length of its log) on, as its
/// request log (`FLEETGATE_SIM_LOG=fleetgate_loadtest=debug`) shows them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Lists {
    /// The gateway's `limit=1` questions for the member's current resourceVersion.
    probes: u64,
    /// Every other LIST: the hubs' own, and any the member served for a client.
    full: u64,
    /// Not LISTs, and not bounded here: the member watches opened (the hubs', and the short
    /// backfills of informers' versions from before the new hub, which the member answers
    /// with its 410).
    watches: u64,
}

fn member_list_log(fleet: &Fleet, from: usize) -> Lists {
    let log = std::fs::read_to_string(fleet.path("sim.log")).unwrap();
    let mut lists = Lists::default();
    for line in log[from..].lines() {
        let Some((_, request)) = line.split_once(" request ") else {
            continue;
        };
        let Some((path, query)) = request
            .split_once(" path=")
            .and_then(|(_, rest)| rest.split_once(" query="))
        else {
            continue;
        };
        if !request.contains("method=GET") || !path.ends_with("/configmaps") {
            continue;
        }
        if query.split('&').any(|pair| pair.starts_with("watch=")) {
            lists.watches += 1;
        } else if query == "limit=1" {
            lists.probes += 1;
        } else {
            lists.full += 1;
        }
    }
    lists
}

fn sim_log_len(fleet: &Fleet) -> usize {
    std::fs::read_to_string(fleet.path("sim.log"))
        .unwrap()
        .len()
}

/// What a phase cost the member, and how many lists the informers made in it.
#[derive(Debug)]
struct Phase {
    /// `fleetgate_sim_requests_total{verb="list",resource="configmaps"}` over the phase.
    counted: u64,
    lists: Lists,
    informer_lists: u64,
}

impl Phase {
    /// The member's count is the log's: the split below is of every LIST it served.
    fn check(&self, what: &str) {
        assert_eq!(
            self.counted,
            self.lists.probes + self.lists.full,
            "{what}: {self:?}"
        );
        assert!(
            self.lists.full <= 1,
            "{what}: more than the hub's own list reached the member: {self:?}"
        );
        assert!(
            self.lists.probes <= self.informer_lists,
            "{what}: more limit=1 questions than lists: {self:?}"
        );
    }
}

/// Starts the informers with `config`, restarts the gateway under them with writes on the
/// member, and checks each ends with the member's objects; what the start and the storm cost
/// the member.
fn storm(config: &watcher::Config) -> (Phase, Phase) {
    storm_on(config, "1", None)
}

/// [`storm`] on a gateway of `workers` shards, configmaps shared in `scope` (None: the default,
/// per shard).
fn storm_on(config: &watcher::Config, workers: &str, scope: Option<&str>) -> (Phase, Phase) {
    let began = Instant::now();
    let history = HISTORY.to_string();
    let mut sim = std::process::Command::new(support::fleet::loadtest_binary());
    sim.env("FLEETGATE_SIM_LOG", "fleetgate_loadtest=debug");
    let mut fleet = Fleet::sim_launched(sim, 1, OBJECTS, "", &["--history-window", &history]);
    cache_configmaps_in_scope(&fleet, scope);
    fleet.serve(&["--workers", workers], None);
    // The informers reach the gateway through a front that stays while the gateway is replaced.
    let front = Front::start(&fleet);
    let member = fleet
        .runtime
        .block_on(kube_client(&fleet.fleet_path("kubeconfig"), "member1"));
    let client = fleet
        .runtime
        .block_on(gateway_client(&fleet, "member1", front.addr));
    let (counted, logged) = (member_lists(&fleet), sim_log_len(&fleet));
    let informers = start_informers(&fleet, &client, config);
    let lists_made = || -> u64 {
        informers
            .iter()
            .map(|i| i.lists.load(Ordering::SeqCst) as u64)
            .sum()
    };
    wait_for_or(
        "every informer's first list",
        Duration::from_secs(60),
        || {
            informers
                .iter()
                .all(|i| i.lists.load(Ordering::SeqCst) >= 1)
        },
        || fleet.log_tail(30),
    );
    let (synced, synced_log, synced_lists) =
        (member_lists(&fleet), sim_log_len(&fleet), lists_made());
    let start = Phase {
        counted: synced - counted,
        lists: member_list_log(&fleet, logged),
        informer_lists: synced_lists,
    };
    // The gateway goes down; the member moves on past its history; a new gateway comes up.
    drop(fleet.gateway.take());
    fleet.runtime.block_on(write_while_away(&member));
    fleet.serve(&["--workers", workers], None);
    *front.to.lock().unwrap() = fleet.https();
    // A last write: an informer that holds it has seen everything before it.
    let marker_ns: Api<ConfigMap> = Api::namespaced(member.clone(), "load-0");
    let mut marker = ConfigMap::default();
    marker.metadata.name = Some("marker".to_owned());
    fleet
        .runtime
        .block_on(marker_ns.create(&PostParams::default(), &marker))
        .unwrap();
    let marker = ObjectRef::<ConfigMap>::new("marker").within("load-0");
    let away = ObjectRef::<ConfigMap>::new("away-0").within("load-0");
    wait_for_or(
        "every informer to see the marker",
        Duration::from_secs(60),
        || informers.iter().all(|i| i.store.get(&marker).is_some()),
        || {
            let behind: Vec<usize> = (0..INFORMERS)
                .filter(|&n| informers[n].store.get(&marker).is_none())
                .collect();
            let without_away = behind
                .iter()
                .filter(|&&n| informers[n].store.get(&away).is_none())
                .count();
            format!(
                "informers without the marker: {behind:?}, {without_away} of them without \
                 load-0/away-0 either\n{}",
                fleet.log_tail(30)
            )
        },
    );
    let storm = Phase {
        counted: member_lists(&fleet) - synced,
        lists: member_list_log(&fleet, synced_log),
        informer_lists: lists_made() - synced_lists,
    };
    // Every informer listed again (a 410, not a resumed watch), and holds the member's objects.
    let relisted = informers
        .iter()
        .filter(|i| i.lists.load(Ordering::SeqCst) >= 2)
        .count();
    assert_eq!(relisted, INFORMERS, "informers that listed again");
    let at_member = fleet
        .runtime
        .block_on(Api::<ConfigMap>::all(member).list(&ListParams::default()))
        .unwrap();
    let want = versions(at_member.items.iter());
    assert!(want.len() > OBJECTS, "{} objects at the member", want.len());
    for (n, informer) in informers.iter().enumerate() {
        let state = informer.store.state();
        assert_eq!(versions(state.iter().map(|cm| &**cm)), want, "informer {n}");
    }
    for informer in &informers {
        informer.task.abort();
    }
    eprintln!(
        "{INFORMERS} informers ({:?}, page size {:?}) in {:?}: start {start:?}; storm {storm:?}",
        config.list_semantic,
        config.page_size,
        began.elapsed()
    );
    start.check("start");
    storm.check("storm");
    (start, storm)
}

#[test]
fn a_relist_storm_of_informers_at_resource_version_0_costs_the_member_one_list() {
    // kube-rs sends resourceVersion=0 only without a page size (with one it sends none).
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    let (start, storm) = storm(&config);
    for phase in [start, storm] {
        assert_eq!((phase.lists.probes, phase.lists.full), (0, 1), "{phase:?}");
    }
}

/// Consistent reads: the hub's list, and `limit=1` questions for the member's resourceVersion,
/// one for all the lists waiting (`watch::hub::Hub::current_version`); the items from memory.
fn consistent_reads_cost_one_list_and_a_few_questions(start: Phase, storm: Phase) {
    for (what, phase) in [("start", start), ("storm", storm)] {
        assert_eq!(phase.lists.full, 1, "{what}: {phase:?}");
        assert!(phase.lists.probes >= 1, "{what}: {phase:?}");
        eprintln!(
            "{what}: {} questions for {} lists",
            phase.lists.probes, phase.informer_lists
        );
    }
}

#[test]
fn a_relist_storm_of_default_kube_rs_informers_costs_the_member_a_few_limit_1_questions() {
    let (start, storm) = storm(&watcher::Config::default());
    consistent_reads_cost_one_list_and_a_few_questions(start, storm);
}

/// The same storm on two shards sharing one hub per key (`scope: Gateway`: the other shard's
/// hub is a mirror of the home's). It found a mirror's clients, positioned while the home's hub
/// replayed from their version, taken for caught up when the member refused the replay and the
/// mirror ended: sent a last bookmark at the mirror's list version, they resumed past changes
/// they never got (2 to 25 of 200 informers, in 5 runs of 5). `watch::client` no longer takes a
/// client short of a replay for caught up.
#[test]
fn a_relist_storm_through_one_gateway_scoped_hub_on_two_shards_costs_the_member_one_list() {
    let (start, storm) = storm_on(&watcher::Config::default(), "2", Some("Gateway"));
    consistent_reads_cost_one_list_and_a_few_questions(start, storm);
}
