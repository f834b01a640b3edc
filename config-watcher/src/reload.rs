//! Publishing a new configuration: the one place where a loaded (or failed) configuration becomes
//! the routing table the data path reads, and where the outcome is recorded for operators.
//!
//! Every source (the watched file path, the Kubernetes API) hands the objects it loaded to a
//! [`TablePublisher`]; when both run, one merging publisher keeps each source's last good
//! configuration and publishes their union. Objects are judged one by one (`judge`): an invalid
//! object is left out, or its last good version keeps serving, and every valid object is served.
//! A configuration that differs from the serving one is built into a new [`RouteTable`]
//! (generation + 1) and swapped in whole. Each rejected object is reported three ways: a tracing
//! error naming file / object / field, the counters and gauges of [`ReloadStatus`] (the gateway's
//! `/metrics`) and its last error and rejected objects (`/readyz?verbose`, the API objects'
//! `Ready` conditions). Only a change with no Gateway to serve, or a source that cannot be read
//! at all, is rejected whole.
//!
//! Building runs on the caller's thread, never on a shard: the data path only ever does one
//! `ArcSwap::load` per request and never waits for anything here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tracing::{error, info, warn};

use crate::error::ConfigError;
use crate::judge::{one_cluster_per_name, settle, LoadedObjects, RejectedObject, Rejection};
use crate::settings::{ClusterConfig, Config, GatewaySettings};
use crate::table::RouteTable;
use crate::SharedTable;

/// The source name the Kubernetes API source publishes under.
pub const API_SOURCE: &str = "kubernetes-api";

/// What the last reload attempts did. Shared (in an `Arc`) between the sources that write it and
/// the gateway's admin listener that reads it; never touched by a request.
#[derive(Debug, Default)]
pub struct ReloadStatus {
    published: AtomicU64,
    failed: AtomicU64,
    /// The error of the last attempt when it rejected anything; `None` once a later attempt
    /// takes every object. A plain mutex: written by a source thread, read by the admin thread,
    /// never by a shard.
    last_error: Mutex<Option<ReloadFailure>>,
    /// The objects the serving table does not hold as written (left out, or at their last good
    /// version), as of the last attempt that was judged object by object.
    rejected: Mutex<Vec<RejectedObject>>,
    /// Problems of the sources themselves, by readiness check name (a watch whose resource the
    /// management cluster does not serve, say): failing `/readyz` checks until they clear.
    source_problems: Mutex<std::collections::BTreeMap<String, String>>,
    /// Per kind of key material (`crate::material`'s names: serving certificate, client CA, token
    /// file, agent CA...): failed reloads and the last success. Written by the config sources and
    /// the gateway's TLS reloader, read by the admin thread.
    material: Mutex<std::collections::BTreeMap<&'static str, MaterialStatus>>,
    /// Counts the reload attempts whose outcome is recorded (published, unchanged or rejected):
    /// what follows the serving table (the API source's Ready conditions) waits on it.
    outcomes: tokio::sync::watch::Sender<u64>,
}

/// The reload record of one kind of key material.
#[derive(Debug, Default, Clone, Copy)]
struct MaterialStatus {
    failures: u64,
    /// Seconds since the Unix epoch of the last successful load; 0: none since start.
    last_success: u64,
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A failed reload as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadFailure {
    /// The error, naming the file or object and the field.
    pub message: String,
    /// When the attempt failed (seconds since the Unix epoch).
    pub at_unix_seconds: u64,
}

impl ReloadStatus {
    pub fn new() -> Arc<ReloadStatus> {
        Arc::new(ReloadStatus::default())
    }

    /// Tables published by reloads (the initial table is not counted).
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    /// Reload attempts that rejected an object (or the whole change) because it was invalid; an
    /// attempt that rejects just what the last one did, and publishes nothing, is not counted
    /// again.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Changes once each reload attempt's outcome is recorded, after the table it published
    /// (if any) serves: a receiver sees every outcome since it last looked, at least once.
    pub fn outcomes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.outcomes.subscribe()
    }

    /// The error of the last attempt, if the last attempt rejected anything: each rejected
    /// object's error, `; `-separated.
    pub fn last_error(&self) -> Option<ReloadFailure> {
        self.last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The objects the serving table does not hold as written, and why.
    pub fn rejected_objects(&self) -> Vec<RejectedObject> {
        self.rejected
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Records (`Some`) or clears (`None`) a problem of a source, shown as the failing readiness
    /// check `check` with the reason.
    pub fn set_source_problem(&self, check: &str, problem: Option<String>) {
        let mut problems = self
            .source_problems
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match problem {
            Some(reason) => {
                problems.insert(check.to_owned(), reason);
            }
            None => {
                problems.remove(check);
            }
        }
    }

    /// The sources' current problems: (readiness check, reason), by check name.
    pub fn source_problems(&self) -> Vec<(String, String)> {
        self.source_problems
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Records one reload of `what` (a `crate::material` name): a failure counts in
    /// `fleetgate_reload_failures_total{what}`, a success sets
    /// `fleetgate_reload_last_success_timestamp_seconds{what}`.
    pub fn record_material(&self, what: &'static str, succeeded: bool) {
        let mut material = self
            .material
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = material.entry(what).or_default();
        if succeeded {
            entry.last_success = unix_seconds();
        } else {
            entry.failures += 1;
        }
    }

    /// Failed reloads of `what` so far.
    pub fn material_failures(&self, what: &str) -> u64 {
        self.material
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(what)
            .map_or(0, |m| m.failures)
    }

    fn record_success(&self) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
        self.outcomes.send_modify(|n| *n += 1);
    }

    /// Records an attempt judged object by object: `rejected` is what the serving table does not
    /// hold as written. `counted`: a reload (the first table is not one). Returns false, and
    /// records nothing, when the attempt published nothing and rejected just what the last one
    /// did (a status write's watch event, an editor touching a file): reported once, not again.
    fn record_judged(&self, rejected: Vec<RejectedObject>, published: bool, counted: bool) -> bool {
        let message = (!rejected.is_empty()).then(|| {
            rejected
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        });
        let mut last = self
            .rejected
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let repeated = *last == rejected
            && self.last_error().map(|f| f.message) == message
            && message.is_some();
        if repeated && !published {
            return false;
        }
        *last = rejected;
        let whats: std::collections::BTreeSet<&'static str> = last.iter().map(|r| r.what).collect();
        drop(last);
        match message {
            None => self.record_success(),
            Some(message) if counted => {
                // Counted once per attempt, under each kind of material it broke.
                let mut whats = whats.into_iter();
                let first = whats.next().unwrap_or(crate::material::CONFIG);
                for what in whats {
                    self.record_material(what, false);
                }
                self.record_failure(message, first);
            }
            Some(message) => {
                *self
                    .last_error
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(ReloadFailure {
                    message,
                    at_unix_seconds: unix_seconds(),
                });
                self.outcomes.send_modify(|n| *n += 1);
            }
        }
        true
    }

    fn record_failure(&self, message: String, what: &'static str) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.record_material(what, false);
        let at_unix_seconds = unix_seconds();
        *self
            .last_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(ReloadFailure {
            message,
            at_unix_seconds,
        });
        self.outcomes.send_modify(|n| *n += 1);
    }

    /// OpenMetrics lines (without `# EOF`) for the gateway's `/metrics`: reloads by result, whether
    /// the last attempt failed, the generation of the serving table and the rejected objects.
    pub fn openmetrics_lines(&self, serving_generation: u64) -> String {
        let failing = u8::from(self.last_error().is_some());
        let rejected = self.rejected_objects();
        let mut objects = format!(
            "# HELP fleetgate_config_rejected_objects Configuration objects the serving table does not hold as written (left out, or at their last good version).\n\
             # TYPE fleetgate_config_rejected_objects gauge\n\
             fleetgate_config_rejected_objects {}\n\
             # HELP fleetgate_config_object_rejected 1 for each rejected object; kept=\"true\": its last good version serves.\n\
             # TYPE fleetgate_config_object_rejected gauge\n",
            rejected.len()
        );
        for r in &rejected {
            objects.push_str(&format!(
                "fleetgate_config_object_rejected{{kind=\"{}\",name=\"{}\",origin=\"{}\",kept=\"{}\"}} 1\n",
                label_value(&r.object.kind),
                label_value(&r.object.name),
                label_value(&r.object.origin),
                r.kept
            ));
        }
        format!(
            "# HELP fleetgate_config_reloads Configuration reloads, by result (failure: the last good table kept serving).\n\
             # TYPE fleetgate_config_reloads counter\n\
             fleetgate_config_reloads_total{{result=\"success\"}} {}\n\
             fleetgate_config_reloads_total{{result=\"failure\"}} {}\n\
             # HELP fleetgate_config_last_reload_failed 1 while the last reload attempt was rejected.\n\
             # TYPE fleetgate_config_last_reload_failed gauge\n\
             fleetgate_config_last_reload_failed {failing}\n\
             # HELP fleetgate_config_generation Generation of the routing table being served.\n\
             # TYPE fleetgate_config_generation gauge\n\
             fleetgate_config_generation {serving_generation}\n",
            self.published(),
            self.failed(),
        ) + &objects
            + &self.material_lines()
    }

    fn material_lines(&self) -> String {
        let material = self
            .material
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        let mut out = String::from(
            "# HELP fleetgate_reload_failures Reloads of key material refused (the last good material kept serving), by what.\n\
             # TYPE fleetgate_reload_failures counter\n",
        );
        for (what, status) in &material {
            out.push_str(&format!(
                "fleetgate_reload_failures_total{{what=\"{what}\"}} {}\n",
                status.failures
            ));
        }
        out.push_str(
            "# HELP fleetgate_reload_last_success_timestamp_seconds When key material last loaded, by what (0: not since start).\n\
             # TYPE fleetgate_reload_last_success_timestamp_seconds gauge\n",
        );
        for (what, status) in &material {
            out.push_str(&format!(
                "fleetgate_reload_last_success_timestamp_seconds{{what=\"{what}\"}} {}\n",
                status.last_success
            ));
        }
        out
    }
}

/// An OpenMetrics label value: `\`, `"` and line feeds escaped (file paths may hold them).
fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What one reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// A new table was published with this generation (rejected objects, if any, are in the
    /// status).
    Published { generation: u64 },
    /// The configuration to serve equals the serving one; nothing was swapped.
    Unchanged,
    /// Nothing could be judged (no Gateway to serve, the source unreadable); the last good
    /// table keeps serving.
    Rejected,
}

/// Turns loaded configurations into published routing tables. Cheap to clone; one per source,
/// or one shared by the file and API sources when both run ([`TablePublisher::merging`]).
#[derive(Debug, Clone)]
pub struct TablePublisher {
    table: SharedTable,
    status: Arc<ReloadStatus>,
    /// With two sources: the last good configuration of each, merged into one table.
    merge: Option<Arc<Mutex<MergedSources>>>,
}

/// The last good configuration of the file source and of the API source, when both run, and
/// the objects each rejected.
#[derive(Debug)]
struct MergedSources {
    files: Option<Config>,
    api: Option<Config>,
    files_rejected: Vec<RejectedObject>,
    api_rejected: Vec<RejectedObject>,
    /// The Gateway the API source falls back on while the API holds no Gateway object: seen in
    /// an API configuration, it means "no Gateway there", and the files' Gateway applies.
    api_fallback_gateway: GatewaySettings,
}

impl MergedSources {
    /// Files and API together: the API's Gateway object when it has one, else the files'; the
    /// clusters and access policies of both. A cluster defined by both is served from the
    /// source that serves it now, and the other copy is rejected (which one is meant cannot be
    /// guessed; with neither serving, both are). `None` until both sources have reported once.
    fn merged(&self, serving: &Config) -> Option<(Config, Vec<Rejection>)> {
        let (files, api) = (self.files.as_ref()?, self.api.as_ref()?);
        let gateway = if api.gateway == self.api_fallback_gateway {
            files.gateway.clone()
        } else {
            api.gateway.clone()
        };
        let clusters = files
            .clusters
            .iter()
            .chain(&api.clusters)
            .cloned()
            .collect();
        // Each source's names are unique already: a clash is between the two.
        let (clusters, clashes) = one_cluster_per_name(clusters, Some(serving), |a, b| {
            let (local, remote) = if b.origin.starts_with("api:") {
                (a, b)
            } else {
                (b, a)
            };
            format!(
                "cluster {:?} is defined both in the files ({}) and in the management cluster \
                 ({}); remove one",
                local.name, local.origin, remote.origin
            )
        });
        let mut config = Config {
            gateway,
            clusters,
            policies: files
                .policies
                .iter()
                .chain(&api.policies)
                .cloned()
                .collect(),
            fleet: files.fleet.iter().chain(&api.fleet).cloned().collect(),
        };
        crate::judge::canonical_order(&mut config);
        Some((config, clashes))
    }
}

impl TablePublisher {
    pub fn new(table: SharedTable, status: Arc<ReloadStatus>) -> TablePublisher {
        TablePublisher {
            table,
            status,
            merge: None,
        }
    }

    /// A publisher shared by the file source and the API source ([`API_SOURCE`]): each source's
    /// last good configuration is kept and the two are merged (see `MergedSources::merged`);
    /// nothing is published until both have reported once. `api_fallback_gateway` is the
    /// `KubeSourceOptions::fallback_gateway` the API source was given.
    pub fn merging(
        table: SharedTable,
        status: Arc<ReloadStatus>,
        api_fallback_gateway: GatewaySettings,
    ) -> TablePublisher {
        TablePublisher {
            table,
            status,
            merge: Some(Arc::new(Mutex::new(MergedSources {
                files: None,
                api: None,
                files_rejected: Vec::new(),
                api_rejected: Vec::new(),
                api_fallback_gateway,
            }))),
        }
    }

    pub fn status(&self) -> &Arc<ReloadStatus> {
        &self.status
    }

    pub fn table(&self) -> &SharedTable {
        &self.table
    }

    /// Judges and publishes `loaded` (the objects a source loaded, or why it could not be read
    /// at all). Blocking (certificate parsing): call it from a source's own thread.
    pub fn publish(
        &self,
        source: &str,
        loaded: Result<LoadedObjects, ConfigError>,
    ) -> ReloadOutcome {
        let loaded = match loaded {
            Ok(loaded) => loaded,
            Err(err) => return self.reject(source, &err),
        };
        let Some(merge) = &self.merge else {
            let serving = self.table.load();
            return match settle(loaded, Some(serving.config())) {
                Ok(settled) => {
                    let rejected = settled.rejected.iter().map(RejectedObject::from).collect();
                    self.publish_config(source, settled.config, rejected)
                }
                Err(err) => self.reject(source, &err),
            };
        };
        // Held through the swap: the two sources' threads publish one at a time.
        let mut merge = merge
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let serving = self.table.load();
        let is_api = source == API_SOURCE;
        let last = if is_api { &merge.api } else { &merge.files };
        // Before a source's first good report, the serving Gateway is its last good one.
        let first = Config {
            gateway: serving.gateway().clone(),
            clusters: Vec::new(),
            policies: Vec::new(),
            fleet: Vec::new(),
        };
        let settled = match settle(loaded, Some(last.as_ref().unwrap_or(&first))) {
            Ok(settled) => settled,
            Err(err) => return self.reject(source, &err),
        };
        let rejected = settled.rejected.iter().map(RejectedObject::from).collect();
        if is_api {
            merge.api = Some(settled.config);
            merge.api_rejected = rejected;
        } else {
            merge.files = Some(settled.config);
            merge.files_rejected = rejected;
        }
        match merge.merged(serving.config()) {
            None => ReloadOutcome::Unchanged,
            Some((config, clashes)) => {
                let rejected = merge
                    .files_rejected
                    .iter()
                    .chain(&merge.api_rejected)
                    .cloned()
                    .chain(clashes.iter().map(RejectedObject::from))
                    .collect();
                self.publish_config(source, config, rejected)
            }
        }
    }

    /// Builds `config` (judging what only shows then: certificates, policies, fleet sources) and
    /// publishes it when it differs from the serving one; records `rejected` and what the build
    /// rejected.
    fn publish_config(
        &self,
        source: &str,
        config: Config,
        mut rejected: Vec<RejectedObject>,
    ) -> ReloadOutcome {
        let serving = self.table.load();
        let built = if *serving.config() == config {
            None
        } else {
            let generation = serving.generation() + 1;
            let (table, more) = RouteTable::build_judged(Some(&serving), config, generation);
            rejected.extend(more.iter().map(RejectedObject::from));
            // Every change rejected, and the last good versions put back: nothing new.
            (table.config() != serving.config()).then_some(table)
        };
        let Some(table) = built else {
            self.record(source, rejected, false);
            return ReloadOutcome::Unchanged;
        };
        let generation = table.generation();
        let config = table.config();
        warn_on_restart_only_changes(serving.config(), config);
        let (added, changed, removed) = cluster_diff(serving.config(), config);
        let (o, n) = (&serving.config().gateway.auth, &config.gateway.auth);
        let (tokens_changed, jwks_changed) = (
            o.tokens != n.tokens,
            o.oidc.as_ref().map(|o| &o.jwks) != n.oidc.as_ref().map(|o| &o.jwks),
        );
        let clusters = config.clusters.len();
        // Only this publisher (one per source) swaps, so nothing can slip in between the load
        // above and this store.
        let table = Arc::new(table);
        self.table.store(table.clone());
        // Only now, with the new table serving: a stream that ends because its route retired
        // and re-requests at once finds the new route (or the 404), never the old one.
        let retired = serving.retire_routes_missing_from(&table);
        self.status.published.fetch_add(1, Ordering::Relaxed);
        let rejected_objects = rejected.len();
        self.record(source, rejected, true);
        // The serving TLS material is recorded by the gateway once it has built it.
        if tokens_changed {
            self.status
                .record_material(crate::material::TOKEN_FILE, true);
        }
        if jwks_changed {
            self.status.record_material(crate::material::JWKS, true);
        }
        info!(
            source,
            generation,
            clusters,
            added,
            changed,
            removed,
            retired,
            rejected_objects,
            "routing table published"
        );
        ReloadOutcome::Published { generation }
    }

    /// Logs each rejected object (unless the attempt repeats the last one) and records them.
    fn record(&self, source: &str, rejected: Vec<RejectedObject>, published: bool) {
        let logged = rejected.clone();
        if self.status.record_judged(rejected, published, true) {
            log_rejected(source, &logged, self.table.load().generation());
        }
    }

    fn reject(&self, source: &str, err: &ConfigError) -> ReloadOutcome {
        let serving = self.table.load().generation();
        error!(
            source,
            error = %err,
            serving_generation = serving,
            "configuration rejected; the last good routing table keeps serving"
        );
        self.status
            .record_failure(err.to_string(), crate::material::what_failed(err));
        ReloadOutcome::Rejected
    }
}

/// One error line per rejected object, naming it, the reason and what serves instead.
fn log_rejected(source: &str, rejected: &[RejectedObject], serving_generation: u64) {
    for r in rejected {
        if r.kept {
            error!(
                source,
                object = %r.object,
                error = %r.message,
                serving_generation,
                "configuration rejected for this object; its last good version keeps serving"
            );
        } else {
            error!(
                source,
                object = %r.object,
                error = %r.message,
                serving_generation,
                "configuration rejected for this object; it is not served"
            );
        }
    }
}

/// The first routing table `serve` builds, from the objects of its `--config` path: judged one
/// by one with no last good version, so an invalid Cluster (AccessPolicy, FleetResource...) is
/// left out and recorded in `status`, but the load fails when no Gateway is valid (listeners
/// cannot be guessed) or the path cannot be read.
pub fn first_table(
    loaded: Result<LoadedObjects, ConfigError>,
    status: &ReloadStatus,
) -> Result<RouteTable, ConfigError> {
    let settled = settle(loaded?, None)?;
    let mut rejected: Vec<RejectedObject> =
        settled.rejected.iter().map(RejectedObject::from).collect();
    let (table, more) = RouteTable::build_judged(None, settled.config, 1);
    rejected.extend(more.iter().map(RejectedObject::from));
    log_rejected("initial", &rejected, 1);
    status.record_judged(rejected, true, false);
    Ok(table)
}

/// Counts clusters added, changed and removed between two configurations (for the log line).
fn cluster_diff(old: &Config, new: &Config) -> (usize, usize, usize) {
    let old_by_name: ahash::AHashMap<&str, &ClusterConfig> =
        old.clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    let new_by_name: ahash::AHashMap<&str, &ClusterConfig> =
        new.clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    let added = new_by_name
        .keys()
        .filter(|name| !old_by_name.contains_key(*name))
        .count();
    let changed = new_by_name
        .iter()
        .filter(|(name, c)| old_by_name.get(*name).is_some_and(|o| o != *c))
        .count();
    let removed = old_by_name
        .keys()
        .filter(|name| !new_by_name.contains_key(*name))
        .count();
    (added, changed, removed)
}

/// Listeners, shards and the admin address are bound once at start; a change to them is
/// published (limits and routing options apply) but only takes effect on a restart. Serving TLS
/// (certificate, key, client CA) is not among them: the gateway's TLS reloader rebuilds it from
/// the published table for new connections.
fn warn_on_restart_only_changes(old: &Config, new: &Config) {
    let (o, n) = (&old.gateway, &new.gateway);
    if o.listeners != n.listeners || o.workers != n.workers || o.admin != n.admin {
        warn!(
            gateway = %n.name,
            "Gateway listeners, workers or admin address changed: these apply on the next restart"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_announced_once_it_is_recorded() {
        let status = ReloadStatus::new();
        let mut outcomes = status.outcomes();
        assert!(!outcomes.has_changed().unwrap());
        status.record_failure("bad".into(), crate::material::TOKEN_FILE);
        assert!(outcomes.has_changed().unwrap());
        outcomes.borrow_and_update();
        // What a waiter reads once woken is already there.
        assert_eq!(
            status.last_error().map(|f| f.message).as_deref(),
            Some("bad")
        );
        status.record_success();
        assert!(outcomes.has_changed().unwrap());
        assert_eq!(status.last_error(), None);
    }

    #[test]
    fn a_rejection_repeated_without_a_new_table_is_reported_once_and_named_in_metrics() {
        let status = ReloadStatus::new();
        let bad = || {
            vec![RejectedObject {
                object: crate::judge::ObjectRef::new("Cluster", "a\"b", "/x\\y.yaml"),
                message: "/x\\y.yaml: Cluster a\"b: spec.server: bad".into(),
                kept: false,
                what: crate::material::CONFIG,
            }]
        };
        assert!(status.record_judged(bad(), false, true));
        // The API source's own status write, a touched file: nothing new to say.
        assert!(!status.record_judged(bad(), false, true));
        assert_eq!(status.failed(), 1);
        // A new table with the same rejection beside it is an attempt of its own.
        assert!(status.record_judged(bad(), true, true));
        assert_eq!(status.failed(), 2);
        let metrics = status.openmetrics_lines(3);
        assert!(
            metrics.contains("fleetgate_config_rejected_objects 1\n")
                && metrics.contains(
                    r#"fleetgate_config_object_rejected{kind="Cluster",name="a\"b",origin="/x\\y.yaml",kept="false"} 1"#
                ),
            "{metrics}"
        );
        assert!(status
            .last_error()
            .unwrap()
            .message
            .ends_with("bad (not served)"));
        assert!(status.record_judged(Vec::new(), false, true));
        assert_eq!(status.last_error(), None);
        assert!(status.rejected_objects().is_empty());
        assert!(status
            .openmetrics_lines(3)
            .contains("fleetgate_config_rejected_objects 0\n"));
    }
}
