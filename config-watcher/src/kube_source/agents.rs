//! A `Tunnel` (pull-mode) Cluster's agents in its status, as the gateway replicas report them.
//!
//! An agent keeps one tunnel per gateway replica, and each replica's tunnel registry sees only its
//! own tunnels, so each replica writes only its own entry, `status.tunnels.<replica>: {agents,
//! heartbeat}`: a JSON merge patch merges maps key by key, so replicas never overwrite each
//! other's entries. `status.agents` is the fewest agents any live replica holds (what a request
//! landing on any replica can count on; 0 means some replica answers 503 for the cluster). Every
//! replica computes it the same way from the entries (its own fresh count in place of its own
//! entry), and computes it again on every change it sees, so concurrent writers converge once
//! the entries are in.
//!
//! A replica refreshes its entry's heartbeat once a period. Another replica's entry is live while
//! its heartbeat keeps changing: one seen unchanged for three periods of this replica's own clock
//! is a replica gone without saying (killed, partitioned), ignored and removed by whoever sees it.
//! No two clocks are compared (as Kubernetes' node lifecycle controller judges Lease renewals),
//! so clock skew between replicas cannot make them remove each other's entries in a loop. A
//! replica leaving gracefully removes its own entries ([`leave`]). `Direct` clusters carry
//! neither field: a replica that sees one removes both. Two processes under one replica name
//! would rewrite each other's count at once, forever: one that finds an entry under its name that
//! it did not write warns and writes only at its heartbeat.
//!
//! Counts come from the caller ([`AgentReport`]: in `fleetgate serve`, the tunnel registry, which
//! signals each tunnel added or removed); this module never sees a tunnel. Driven by the API
//! source's loop (`kube_source::follow`) after each batch of events, each signal and each
//! heartbeat tick; writes only what changed, so the writes settle.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject};
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use tracing::{debug, warn};

use super::{patch_status, Kind, Objects};

/// How often a replica refreshes its entries' heartbeats, unless [`AgentReport::heartbeat`] says
/// otherwise (Karmada's cluster status is updated as often).
pub const AGENT_HEARTBEAT: Duration = Duration::from_secs(30);

/// An entry whose heartbeat did not change for this many periods is a replica gone.
const LIVE_PERIODS: u32 = 3;

/// What this replica reports in its `Tunnel` Clusters' status (see the module comment).
#[derive(Clone)]
pub struct AgentReport {
    /// This replica's key in `status.tunnels` (its pod name); unique among the replicas.
    pub replica: String,
    /// The cluster's agents whose tunnel this replica holds now.
    pub count: Arc<dyn Fn(&str) -> usize + Send + Sync>,
    /// Notified when a count changes (an agent's tunnel added or removed), so the change is
    /// written at once rather than at the next heartbeat.
    pub changed: Arc<Notify>,
    /// How often the heartbeats are refreshed (default [`AGENT_HEARTBEAT`]; at least 100 ms).
    pub heartbeat: Duration,
}

impl AgentReport {
    /// A report for `replica` with counts from `count`, the default heartbeat and a fresh
    /// [`Notify`] for the caller to signal.
    pub fn new(
        replica: impl Into<String>,
        count: impl Fn(&str) -> usize + Send + Sync + 'static,
    ) -> AgentReport {
        AgentReport {
            replica: replica.into(),
            count: Arc::new(count),
            changed: Arc::new(Notify::new()),
            heartbeat: AGENT_HEARTBEAT,
        }
    }
}

impl std::fmt::Debug for AgentReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentReport")
            .field("replica", &self.replica)
            .field("heartbeat", &self.heartbeat)
            .finish_non_exhaustive()
    }
}

/// This replica's side of one Cluster's status.
struct Own<'a> {
    replica: &'a str,
    /// Its agents of the cluster; `None` when it is leaving (its entry goes).
    agents: Option<usize>,
    /// The heartbeat to write when the entry is written.
    heartbeat: &'a str,
    /// When its entry is written.
    write: OwnWrite,
}

/// When this replica writes its own entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnWrite {
    /// When the stored count differs (or there is none).
    IfChanged,
    /// Always: a heartbeat tick.
    Refresh,
    /// Not now, nor `status.agents`: another process writes under this replica's name (see
    /// `AgentStatus::write`).
    Wait,
}

/// The merge patch that makes a Cluster's `status` (as last seen) say what this replica reports,
/// or `None` when it already does. `live(replica, heartbeat)` judges another replica's entry.
fn status_patch(
    status: &Value,
    tunnel: bool,
    own: &Own<'_>,
    mut live: impl FnMut(&str, &Value) -> bool,
) -> Option<Value> {
    if !tunnel {
        let reported = !status["agents"].is_null() || !status["tunnels"].is_null();
        return reported.then(|| json!({"status": {"agents": null, "tunnels": null}}));
    }
    let no_entries = Map::new();
    let entries = status["tunnels"].as_object().unwrap_or(&no_entries);
    let mut tunnels = Map::new();
    let mut fewest = own.agents.map(|a| a as u64);
    for (replica, entry) in entries {
        if replica == own.replica {
            continue;
        }
        let agents = entry["agents"].as_u64();
        match agents.filter(|_| live(replica, &entry["heartbeat"])) {
            Some(agents) => fewest = Some(fewest.map_or(agents, |f| f.min(agents))),
            // Gone, or not an entry a replica writes: removed.
            None => {
                tunnels.insert(replica.clone(), Value::Null);
            }
        }
    }
    let stored = entries.get(own.replica);
    match own.agents {
        Some(agents) => {
            let same = stored.is_some_and(|e| e["agents"].as_u64() == Some(agents as u64));
            let write = match own.write {
                OwnWrite::IfChanged => !same,
                OwnWrite::Refresh => true,
                OwnWrite::Wait => false,
            };
            if write {
                tunnels.insert(
                    own.replica.to_owned(),
                    json!({"agents": agents, "heartbeat": own.heartbeat}),
                );
            }
        }
        None if stored.is_some() => {
            tunnels.insert(own.replica.to_owned(), Value::Null);
        }
        None => {}
    }
    let mut patch = Map::new();
    let fewest = fewest.map_or(Value::Null, Value::from);
    // Waiting, this replica's own count is not the one under its name: no count of its own.
    if status["agents"] != fewest && own.write != OwnWrite::Wait {
        patch.insert("agents".into(), fewest);
    }
    if !tunnels.is_empty() {
        patch.insert("tunnels".into(), Value::Object(tunnels));
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

/// Whether a fleetgate Cluster object is a `Tunnel` one (`spec.mode` is the field's earlier
/// name, which files may still use; a management cluster prunes it).
fn is_tunnel(cluster: &Value) -> bool {
    let spec = &cluster["spec"];
    spec.get("connectMode").unwrap_or(&spec["mode"]) == "Tunnel"
}

/// The agents side of the API source's loop: this replica's report, and when it first saw each
/// other replica's current heartbeat.
pub(super) struct AgentStatus {
    report: AgentReport,
    /// By (cluster, replica): the heartbeat last seen, and when this replica first saw it.
    seen: HashMap<(String, String), (Value, Instant)>,
    /// By cluster: what this replica wrote into its entry.
    written: HashMap<String, Written>,
    /// A heartbeat tick came and the entries were not refreshed since.
    refresh_due: bool,
}

impl AgentStatus {
    pub(super) fn new(mut report: AgentReport) -> AgentStatus {
        // A zero period would panic the loop's interval, a tiny one flood the API.
        report.heartbeat = report.heartbeat.max(Duration::from_millis(100));
        AgentStatus {
            report,
            seen: HashMap::new(),
            written: HashMap::new(),
            // The first write refreshes: an entry left by an earlier run under this name is
            // this replica's now.
            refresh_due: true,
        }
    }

    pub(super) fn report(&self) -> &AgentReport {
        &self.report
    }

    /// A heartbeat tick: the next [`AgentStatus::write`] refreshes every entry.
    pub(super) fn tick(&mut self) {
        self.refresh_due = true;
    }

    /// Writes each fleetgate Cluster's agents where they changed (all of them on a heartbeat
    /// tick), and removes the entries of replicas gone. Karmada's Clusters are never written.
    pub(super) async fn write(&mut self, client: &kube::Client, objects: &Objects) {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &Kind::Cluster.resource());
        let now = Instant::now();
        let gone_after = self.report.heartbeat * LIVE_PERIODS;
        let heartbeat = super::rfc3339_now();
        let refresh = std::mem::take(&mut self.refresh_due);
        // Rebuilt each pass, so deleted clusters and replicas are forgotten.
        let mut seen = HashMap::new();
        let mut written = HashMap::new();
        for value in objects.of(Kind::Cluster) {
            let Some(name) = value["metadata"]["name"].as_str() else {
                continue;
            };
            let tunnel = is_tunnel(value);
            let mut mine: Written = self.written.remove(name).unwrap_or_default();
            // An entry under this replica's name that it did not write: another process has the
            // same name (two on one host, no --replica-name). Each would rewrite the other's
            // count at once, forever; written on heartbeat ticks only, they flap, and say so.
            let stored = value["status"]["tunnels"][&self.report.replica]["heartbeat"].as_str();
            let foreign = stored.is_some_and(|beat| !mine.beats.iter().any(|m| m == beat));
            if foreign && !refresh && !std::mem::replace(&mut mine.warned, true) {
                warn!(cluster = name, replica = %self.report.replica, "another process reports agents under this replica's name: give each replica its own --replica-name");
            }
            let own = Own {
                replica: &self.report.replica,
                agents: tunnel.then(|| (self.report.count)(name)),
                heartbeat: &heartbeat,
                write: match (refresh, foreign) {
                    (true, _) => OwnWrite::Refresh,
                    (false, true) => OwnWrite::Wait,
                    (false, false) => OwnWrite::IfChanged,
                },
            };
            let live = |replica: &str, beat: &Value| {
                let key = (name.to_owned(), replica.to_owned());
                let since = match self.seen.get(&key) {
                    Some((last, since)) if last == beat => *since,
                    _ => now,
                };
                seen.insert(key, (beat.clone(), since));
                now.duration_since(since) < gone_after
            };
            if let Some(patch) = status_patch(&value["status"], tunnel, &own, live) {
                debug!(cluster = name, %patch, "writing the cluster's agents");
                match patch_status(&api, name, &patch).await {
                    Ok(()) if patch["status"]["tunnels"][&self.report.replica].is_object() => {
                        mine.beats.swap(0, 1);
                        mine.beats[1].clone_from(&heartbeat);
                    }
                    Ok(()) => {}
                    Err(error) => {
                        // Written again at the next change or tick.
                        self.refresh_due = true;
                        warn!(cluster = name, %error, "cannot write the cluster's agents");
                    }
                }
            }
            written.insert(name.to_owned(), mine);
        }
        self.seen = seen;
        self.written = written;
    }
}

/// What this replica wrote into one Cluster's entry.
#[derive(Default)]
struct Written {
    /// The last two heartbeats (a write's echo may come after the next write).
    beats: [String; 2],
    /// Whether it said that another process writes under its name.
    warned: bool,
}

/// Removes this replica's entries from every fleetgate Cluster (a graceful stop), leaving
/// `status.agents` to the other replicas' entries. Reads the Clusters afresh: the loop that
/// knew them is gone.
pub(super) async fn leave(client: &kube::Client, report: &AgentReport) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &Kind::Cluster.resource());
    let clusters = match api.list(&Default::default()).await {
        Ok(list) => list.items,
        Err(error) => {
            warn!(%error, "cannot list the Clusters to remove this replica's agent entries");
            return;
        }
    };
    for cluster in clusters {
        let Some(name) = cluster.metadata.name.as_deref() else {
            continue;
        };
        let status = cluster.data.get("status").cloned().unwrap_or_default();
        if status["tunnels"].get(&report.replica).is_none() {
            continue;
        }
        let own = Own {
            replica: &report.replica,
            agents: None,
            heartbeat: "",
            write: OwnWrite::IfChanged,
        };
        // The others' entries are taken as they stand: whether they are live is not this
        // replica's to judge on its way out.
        if let Some(patch) = status_patch(&status, true, &own, |_, _| true) {
            if let Err(error) = patch_status(&api, name, &patch).await {
                warn!(cluster = name, %error, "cannot remove this replica's agent entry");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(agents: Option<usize>, refresh: bool) -> Own<'static> {
        Own {
            replica: "a",
            agents,
            heartbeat: "T2",
            write: if refresh {
                OwnWrite::Refresh
            } else {
                OwnWrite::IfChanged
            },
        }
    }

    #[test]
    fn the_fewest_agents_of_the_live_replicas() {
        let status = json!({"tunnels": {"b": {"agents": 1, "heartbeat": "T1"}}});
        assert_eq!(
            status_patch(&status, true, &own(Some(2), false), |_, _| true),
            Some(
                json!({"status": {"agents": 1, "tunnels": {"a": {"agents": 2, "heartbeat": "T2"}}}})
            )
        );
        // Settled: nothing to write until a count changes or a tick comes.
        let settled = json!({"agents": 1, "tunnels": {
            "a": {"agents": 2, "heartbeat": "T2"}, "b": {"agents": 1, "heartbeat": "T1"}}});
        assert_eq!(
            status_patch(&settled, true, &own(Some(2), false), |_, _| true),
            None
        );
        assert_eq!(
            status_patch(&settled, true, &own(Some(2), true), |_, _| true),
            Some(json!({"status": {"tunnels": {"a": {"agents": 2, "heartbeat": "T2"}}}}))
        );
        assert_eq!(
            status_patch(&settled, true, &own(Some(0), false), |_, _| true),
            Some(
                json!({"status": {"agents": 0, "tunnels": {"a": {"agents": 0, "heartbeat": "T2"}}}})
            )
        );
    }

    #[test]
    fn gone_and_malformed_entries_are_removed() {
        let status = json!({"agents": 0, "tunnels": {
            "a": {"agents": 2, "heartbeat": "T2"},
            "gone": {"agents": 0, "heartbeat": "T0"},
            "junk": {"agents": "many"},
        }});
        assert_eq!(
            status_patch(&status, true, &own(Some(2), false), |r, _| r != "gone"),
            Some(json!({"status": {"agents": 2, "tunnels": {"gone": null, "junk": null}}}))
        );
    }

    #[test]
    fn leaving_removes_the_own_entry_and_direct_clusters_carry_nothing() {
        let status = json!({"agents": 1, "tunnels": {
            "a": {"agents": 1, "heartbeat": "T2"}, "b": {"agents": 3, "heartbeat": "T1"}}});
        assert_eq!(
            status_patch(&status, true, &own(None, false), |_, _| true),
            Some(json!({"status": {"agents": 3, "tunnels": {"a": null}}}))
        );
        let last = json!({"agents": 1, "tunnels": {"a": {"agents": 1, "heartbeat": "T2"}}});
        assert_eq!(
            status_patch(&last, true, &own(None, false), |_, _| true),
            Some(json!({"status": {"agents": null, "tunnels": {"a": null}}}))
        );
        assert_eq!(
            status_patch(&status, false, &own(Some(1), true), |_, _| true),
            Some(json!({"status": {"agents": null, "tunnels": null}}))
        );
        let direct = json!({"conditions": []});
        assert_eq!(
            status_patch(&direct, false, &own(Some(1), true), |_, _| true),
            None
        );
    }

    #[test]
    fn tunnel_clusters_by_either_field_name() {
        assert!(is_tunnel(&json!({"spec": {"connectMode": "Tunnel"}})));
        assert!(is_tunnel(&json!({"spec": {"mode": "Tunnel"}})));
        assert!(!is_tunnel(&json!({"spec": {"server": "https://x"}})));
        assert!(!is_tunnel(
            &json!({"spec": {"connectMode": "Direct", "mode": "Tunnel"}})
        ));
    }
}
