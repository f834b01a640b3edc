//! Publishing a new configuration: the one place where a loaded (or failed) configuration becomes
//! the routing table the data path reads, and where the outcome is recorded for operators.
//!
//! Every source (the watched file path, the Kubernetes API) hands its result to a
//! [`TablePublisher`]; when both run, one merging publisher keeps each source's last good
//! configuration and publishes their union. A valid configuration that differs from the serving one is built into a new
//! [`RouteTable`] (generation + 1) and swapped in whole; an invalid one leaves the last good table
//! serving and is reported three ways: a tracing error naming file / object / field, the counters
//! of [`ReloadStatus`] (the gateway's `/metrics`) and its last error (`/readyz?verbose`).
//!
//! Building runs on the caller's thread, never on a shard: the data path only ever does one
//! `ArcSwap::load` per request and never waits for anything here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tracing::{error, info, warn};

use crate::error::ConfigError;
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
    /// The error of the last attempt when it failed; `None` once a later attempt succeeds.
    /// A plain mutex: written by a source thread, read by the admin thread, never by a shard.
    last_error: Mutex<Option<ReloadFailure>>,
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

    /// Reload attempts rejected because the configuration was invalid.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Changes once each reload attempt's outcome is recorded, after the table it published
    /// (if any) serves: a receiver sees every outcome since it last looked, at least once.
    pub fn outcomes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.outcomes.subscribe()
    }

    /// The error of the last attempt, if the last attempt failed.
    pub fn last_error(&self) -> Option<ReloadFailure> {
        self.last_error
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
    /// the last attempt failed, and the generation of the serving table.
    pub fn openmetrics_lines(&self, serving_generation: u64) -> String {
        let failing = u8::from(self.last_error().is_some());
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
        ) + &self.material_lines()
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

/// What one reload did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// A new table was published with this generation.
    Published { generation: u64 },
    /// The configuration equals the serving one; nothing was swapped.
    Unchanged,
    /// The configuration was invalid; the last good table keeps serving.
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

/// The last good configuration of the file source and of the API source, when both run.
#[derive(Debug)]
struct MergedSources {
    files: Option<Config>,
    api: Option<Config>,
    /// The Gateway the API source falls back on while the API holds no Gateway object: seen in
    /// an API configuration, it means "no Gateway there", and the files' Gateway applies.
    api_fallback_gateway: GatewaySettings,
}

impl MergedSources {
    /// Files and API together: the API's Gateway object when it has one, else the files'; the
    /// clusters and access policies of both. A cluster defined by both is an error (which one is
    /// meant cannot be guessed). `None` until both sources have reported once.
    fn merged(&self) -> Option<Result<Config, ConfigError>> {
        let (files, api) = (self.files.as_ref()?, self.api.as_ref()?);
        let gateway = if api.gateway == self.api_fallback_gateway {
            files.gateway.clone()
        } else {
            api.gateway.clone()
        };
        let mut clusters = files.clusters.clone();
        for cluster in &api.clusters {
            if let Some(local) = files.clusters.iter().find(|c| c.name == cluster.name) {
                return Some(Err(ConfigError::Set(format!(
                    "cluster {:?} is defined both in the files ({}) and in the management cluster ({}); \
                     remove one",
                    cluster.name, local.origin, cluster.origin
                ))));
            }
            clusters.push(cluster.clone());
        }
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        let mut policies = files.policies.clone();
        policies.extend(api.policies.iter().cloned());
        let mut fleet = files.fleet.clone();
        fleet.extend(api.fleet.iter().cloned());
        Some(Ok(Config {
            gateway,
            clusters,
            policies,
            fleet,
        }))
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

    /// Validates and publishes `loaded` (the result of loading a source). Blocking (certificate
    /// parsing): call it from a source's own thread.
    pub fn publish(&self, source: &str, loaded: Result<Config, ConfigError>) -> ReloadOutcome {
        let config = match loaded {
            Ok(config) => config,
            Err(err) => return self.reject(source, &err),
        };
        let Some(merge) = &self.merge else {
            return self.publish_config(source, config);
        };
        // Held through the swap: the two sources' threads publish one at a time.
        let mut merge = merge
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if source == API_SOURCE {
            merge.api = Some(config);
        } else {
            merge.files = Some(config);
        }
        match merge.merged() {
            None => ReloadOutcome::Unchanged,
            Some(Ok(config)) => self.publish_config(source, config),
            Some(Err(err)) => self.reject(source, &err),
        }
    }

    fn publish_config(&self, source: &str, config: Config) -> ReloadOutcome {
        let serving = self.table.load();
        if *serving.config() == config {
            self.status.record_success();
            return ReloadOutcome::Unchanged;
        }
        let generation = serving.generation() + 1;
        let table = match RouteTable::rebuild(&serving, &config, generation) {
            Ok(table) => table,
            Err(err) => return self.reject(source, &err),
        };
        warn_on_restart_only_changes(serving.config(), &config);
        let (added, changed, removed) = cluster_diff(serving.config(), &config);
        // Only this publisher (one per source) swaps, so nothing can slip in between the load
        // above and this store.
        let table = Arc::new(table);
        self.table.store(table.clone());
        // Only now, with the new table serving: a stream that ends because its route retired
        // and re-requests at once finds the new route (or the 404), never the old one.
        let retired = serving.retire_routes_missing_from(&table);
        self.status.published.fetch_add(1, Ordering::Relaxed);
        self.status.record_success();
        // The serving TLS material is recorded by the gateway once it has built it.
        let (o, n) = (&serving.config().gateway.auth, &config.gateway.auth);
        if o.tokens != n.tokens {
            self.status
                .record_material(crate::material::TOKEN_FILE, true);
        }
        if o.oidc.as_ref().map(|o| &o.jwks) != n.oidc.as_ref().map(|o| &o.jwks) {
            self.status.record_material(crate::material::JWKS, true);
        }
        info!(
            source,
            generation,
            clusters = config.clusters.len(),
            added,
            changed,
            removed,
            retired,
            "routing table published"
        );
        ReloadOutcome::Published { generation }
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
}
