//! The state of one simulated member cluster: its name, object store, accepted tokens, seeded
//! nodes and tuning knobs. Shared (`Arc`) by its listener, every connection and the load tasks.
//!
//! Holds data only; behaviour lives in `api` (requests), `load` (seed and churn), `server` and
//! `faults` (the switches that make it misbehave).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sim::auth::TokenAuthenticator;
use crate::sim::faults::Faults;
use crate::sim::resources::Registry;
use crate::sim::store::Store;

/// Knobs that tests and the CLI may turn; `Default` is what `start_fleet` uses.
#[derive(Debug, Clone)]
pub struct SimTuning {
    /// Interval between lines of `pods/log?follow=true`.
    pub log_interval: Duration,
    /// How many past events each member keeps for watch resume (older RVs get 410 Expired).
    pub history_window: usize,
    /// Heartbeat BOOKMARK interval of watches with `allowWatchBookmarks=true`.
    pub bookmark_interval: Duration,
    /// Services every member has, with their backends (`sim --service`): the apiserver's
    /// service proxy forwards to them.
    pub services: Vec<crate::sim::services::SimService>,
    /// Every watch ends after this long (kube-apiserver's request timeout); None: only at the
    /// client's `timeoutSeconds`.
    pub watch_timeout: Option<Duration>,
    /// Every LIST is answered this much later (tests that need a client to wait on one).
    pub list_delay: Duration,
}

impl Default for SimTuning {
    fn default() -> Self {
        Self {
            log_interval: Duration::from_millis(200),
            history_window: 10_000,
            bookmark_interval: Duration::from_secs(60),
            services: Vec::new(),
            watch_timeout: None,
            list_delay: Duration::ZERO,
        }
    }
}

/// One member cluster.
pub struct Member {
    /// `member1`, `member2`, ...
    pub name: String,
    pub store: Store,
    /// Built-in resources plus those registered by stored CRDs.
    pub registry: Registry,
    pub tokens: TokenAuthenticator,
    pub tuning: SimTuning,
    /// Names of the seeded nodes, where new pods are "scheduled".
    pub node_names: Vec<String>,
    /// `127.0.0.1:port`, as `/api` reports it.
    pub server_address: String,
    /// PEM of the CA that signs this member's serving certificate; published in every namespace
    /// as ConfigMap `kube-root-ca.crt`, as kube-controller-manager does.
    pub root_ca_pem: String,
    next_ip: AtomicU32,
    /// Watches open now, by plural resource name (`fleetgate_sim_open_watches` in `/metrics`).
    open_watches: Mutex<BTreeMap<&'static str, usize>>,
    /// Requests served (past authorization), by verb and resource (with its subresource):
    /// `fleetgate_sim_requests_total` in `/metrics`, so a test or a benchmark counts the LISTs
    /// that reach the member.
    requests: Mutex<BTreeMap<(&'static str, String), u64>>,
    /// Of those LISTs, the ones that asked for `limit=1` (a gateway's question for the current
    /// resourceVersion, docs/cache.md), by resource: `fleetgate_sim_short_lists_total`.
    short_lists: Mutex<BTreeMap<String, u64>>,
    /// The fault switches tests and the load driver flip (`/debug/sim/faults`).
    pub faults: Faults,
}

/// Counts one open watch of its resource for as long as it lives.
pub struct OpenWatch {
    member: Arc<Member>,
    resource: &'static str,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        let mut open = self
            .member
            .open_watches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(self.resource) {
            *count = count.saturating_sub(1);
        }
    }
}

impl Member {
    pub fn new(
        name: String,
        tokens: TokenAuthenticator,
        tuning: SimTuning,
        node_names: Vec<String>,
        server_address: String,
        root_ca_pem: String,
    ) -> Self {
        let store = Store::new(tuning.history_window);
        Self {
            name,
            store,
            registry: Registry::default(),
            tokens,
            tuning,
            node_names,
            server_address,
            root_ca_pem,
            next_ip: AtomicU32::new(2),
            open_watches: Mutex::new(BTreeMap::new()),
            requests: Mutex::new(BTreeMap::new()),
            short_lists: Mutex::new(BTreeMap::new()),
            faults: Faults::default(),
        }
    }

    /// Counts a watch of `resource` (plural) open until the guard is dropped.
    pub fn watch_opened(self: &Arc<Self>, resource: &'static str) -> OpenWatch {
        *self
            .open_watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(resource)
            .or_insert(0) += 1;
        OpenWatch {
            member: Arc::clone(self),
            resource,
        }
    }

    /// `fleetgate_sim_open_watches{resource="..."}`: one gauge line per resource ever watched
    /// (0 once its watches closed), so a test reads "none" as 0 rather than as absent.
    pub fn open_watches_text(&self) -> String {
        let open = self.open_watches.lock().unwrap_or_else(|e| e.into_inner());
        family(
            "fleetgate_sim_open_watches",
            "gauge",
            "Watches this member holds open now, by resource",
            open.iter()
                .map(|(resource, count)| (format!("resource=\"{resource}\""), *count as u64)),
        )
    }

    /// Counts one request served: `verb` (kube's: list, watch, get, ...) of `resource`.
    pub fn count_request(&self, verb: &'static str, resource: &str) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests.entry((verb, resource.to_string())).or_insert(0) += 1;
    }

    /// Counts one LIST of `resource` that asked for `limit=1` (also counted by
    /// [`Member::count_request`]).
    pub fn count_short_list(&self, resource: &str) {
        let mut short = self.short_lists.lock().unwrap_or_else(|e| e.into_inner());
        *short.entry(resource.to_string()).or_insert(0) += 1;
    }

    /// `fleetgate_sim_requests_total{verb="...",resource="..."}`: one counter line per verb and
    /// resource served so far; then `fleetgate_sim_short_lists_total{resource="..."}`, the
    /// LISTs among them that asked for `limit=1`.
    pub fn requests_text(&self) -> String {
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        let short = self.short_lists.lock().unwrap_or_else(|e| e.into_inner());
        family(
            "fleetgate_sim_requests_total",
            "counter",
            "Requests this member served, by verb and resource",
            requests.iter().map(|((verb, resource), count)| {
                (format!("verb=\"{verb}\",resource=\"{resource}\""), *count)
            }),
        ) + &family(
            "fleetgate_sim_short_lists_total",
            "counter",
            "LISTs this member served that asked for limit=1 (counted in fleetgate_sim_requests_total too), by resource",
            short
                .iter()
                .map(|(resource, count)| (format!("resource=\"{resource}\""), *count)),
        )
    }

    /// A fresh address in the given /16 prefix (`10.244` for pods, `10.96` for services).
    pub fn allocate_ip(&self, prefix: &str) -> String {
        let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}.{}.{}", (n >> 8) & 0xff, n & 0xff)
    }

    /// The node a new pod lands on (round robin by IP counter).
    pub fn pick_node(&self) -> String {
        let n = self.next_ip.load(Ordering::Relaxed) as usize;
        self.node_names
            .get(n % self.node_names.len().max(1))
            .cloned()
            .unwrap_or_else(|| format!("{}-node-1", self.name))
    }
}

/// One metric family in the Prometheus text format: its HELP and TYPE lines, then a line per
/// label set.
fn family(
    name: &str,
    kind: &str,
    help: &str,
    series: impl Iterator<Item = (String, u64)>,
) -> String {
    use std::fmt::Write as _;
    let mut out = format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
    for (labels, value) in series {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
    out
}
