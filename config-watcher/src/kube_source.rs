//! The Kubernetes API source: follows `fleetgate.io/v1alpha1` Clusters, Gateways,
//! AccessPolicies and FleetResources, Karmada `cluster.karmada.io/v1alpha1` Clusters and the
//! Secrets they reference, and Karmada `search.karmada.io/v1alpha1` ResourceRegistries in a
//! management cluster, and publishes a routing table through a [`TablePublisher`] on every change.
//!
//! kube-rs needs tokio; the shards run monoio. So the source runs on a thread of its own with a
//! current-thread tokio runtime, one kube-rs runtime watcher per kind feeding one channel, and the
//! table is published into the same `ArcSwap` the shards read: the data path never waits for it.
//!
//! A watcher's view is empty until its initial list is done (DESIGN.md): objects of an `Init` ..
//! `InitDone` round are buffered and swapped in whole on `InitDone`, and nothing is published until
//! every watched kind has completed its first list, so a half-listed fleet is never served (a
//! table without the clusters not listed yet would answer 404 for them). After that, every
//! `Apply`, `Delete` and re-list rebuilds the configuration; events already queued are applied
//! first, so a burst costs one rebuild.
//!
//! FleetResources and ResourceRegistries say which kinds the fleet view merges; they are read as
//! the file source reads them (`fleet::FleetSource`) and resolved against the clusters when the
//! table is built, so a bad one is judged like a bad Cluster. Their kinds are optional: a
//! management cluster that does not serve them (no CRD: karmada-search is an optional Karmada
//! component, and a gateway may be upgraded before `deploy/base/crds.yaml` is applied) simply has none,
//! and readiness does not fail for it. Every other kind that is not served fails `/readyz`.
//!
//! Objects are judged one by one (`judge`): an invalid object is left out, or its last good
//! version keeps serving, and every valid object beside it is served. Each fleetgate Cluster,
//! AccessPolicy and FleetResource object gets a `Ready` condition in its status: `True`
//! (`Served`) when the serving table holds it as written, `False` (`Invalid`) with the reason it
//! was rejected and whether its last good version serves, `False` (`NotServed`) while a valid
//! object is not served yet (the files have not reported, with both sources). Karmada's objects
//! are never written to.
//! A Cluster's `spec.credentials.secretRef` without a namespace names a Secret in the namespace
//! the source reads Secrets in (`--secrets-namespace`).
//!
//! A fleetgate Cluster whose member's circuit breaker opened in this replica (the gateway fills
//! `crate::circuits`) also gets a `CircuitOpen` condition (`circuit`).
//!
//! A `Tunnel` Cluster's status also says how many pull-mode agents the gateway replicas hold
//! (`status.agents`, and each replica's own entry in `status.tunnels`), when the caller gives an
//! [`AgentReport`] (`agents`: see that module). A change of an object's status alone (the
//! gateway's own writes, another replica's) rebuilds nothing; it only has the statuses compared
//! again.
//!
//! Objects read from the API may not name local files (`caFile`, `tokenFile`, ...): a management
//! cluster's user must not make the gateway read its own files and send them to a server of their
//! choosing. Created by `fleetgate serve` (or tests); never touched by a request.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::thread::JoinHandle;

use futures_util::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::error::ConfigError;
use crate::fleet::{FleetSource, ResourceRegistryObject};
use crate::judge::{LoadedObjects, ObjectRef, RejectedObject, Rejection};
use crate::karmada::{
    karmada_cluster_config, KarmadaClusterObject, SecretData, SecretObject, KARMADA_API_VERSION,
    KARMADA_CLUSTER_KIND,
};
use crate::load::{resolve_cluster, resolve_gateway, FindSecret};
use crate::objects::{
    AccessPolicyObject, ClusterObject, FleetResourceObject, GatewayObject, API_VERSION,
};
use crate::reload::TablePublisher;
use crate::settings::GatewaySettings;

mod agents;
mod circuit;
pub use agents::{AgentReport, AGENT_HEARTBEAT};
use circuit::CircuitConditions;

use crate::circuits::open_circuits;

/// What the API source follows.
#[derive(Debug, Clone)]
pub struct KubeSourceOptions {
    /// `fleetgate.io/v1alpha1` Clusters, Gateways and AccessPolicies (their CRDs must exist), and
    /// FleetResources (when their CRD exists).
    pub fleetgate: bool,
    /// Karmada `cluster.karmada.io/v1alpha1` Clusters and the Secrets they reference (the CRD
    /// must exist), and `search.karmada.io/v1alpha1` ResourceRegistries (when karmada-search
    /// serves them).
    pub karmada: bool,
    /// Where referenced Secrets live; `None` watches Secrets in every namespace (which needs
    /// cluster-wide `list`/`watch` on secrets). Karmada keeps them in `karmada-cluster`.
    pub secrets_namespace: Option<String>,
    /// The Gateway settings used while the API holds no Gateway object (the listeners are
    /// bound from the local configuration at start anyway).
    pub fallback_gateway: Option<GatewaySettings>,
}

/// Why the API source could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    #[error("cannot build the tokio runtime of the Kubernetes API source")]
    Runtime(#[source] std::io::Error),
    #[error("cannot create the Kubernetes client")]
    Client(#[source] kube::Error),
    #[error("cannot start the Kubernetes API source thread")]
    Thread(#[source] std::io::Error),
    #[error("nothing to watch: enable fleetgate or karmada objects")]
    NothingToWatch,
    #[error("cannot use the kubeconfig {path}")]
    Kubeconfig {
        path: std::path::PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
}

/// Reads a kubeconfig (and context, default: its current context) into a client configuration,
/// for callers that do not depend on kube themselves. Blocking (it may run an exec plugin).
pub fn kube_client_config(
    kubeconfig: &Path,
    context: Option<&str>,
) -> Result<kube::Config, KubeSourceError> {
    let kubeconfig_error = |source| KubeSourceError::Kubeconfig {
        path: kubeconfig.to_owned(),
        source,
    };
    let file = kube::config::Kubeconfig::read_from(kubeconfig).map_err(kubeconfig_error)?;
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KubeSourceError::Runtime)?;
    runtime
        .block_on(kube::Config::from_custom_kubeconfig(file, &options))
        .map_err(kubeconfig_error)
}

/// A running API source. Dropping it stops the watchers (the thread ends at its next event);
/// with an [`AgentReport`], the drop first waits (at most [`LEAVE_TIMEOUT`]) while this replica's
/// entries are removed from the Clusters' status.
pub struct KubeWatcher {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Disconnected when the thread ends; waited for only when the stop has work to do.
    ended: Option<std::sync::mpsc::Receiver<()>>,
    _thread: JoinHandle<()>,
}

/// How long a stopping API source may take to remove this replica's agent entries.
pub const LEAVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

impl Drop for KubeWatcher {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(ended) = self.ended.take() {
            // Nothing is ever sent: this returns when the thread drops its end, or times out.
            let _ = ended.recv_timeout(LEAVE_TIMEOUT + std::time::Duration::from_millis(500));
        }
    }
}

impl std::fmt::Debug for KubeWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeWatcher")
    }
}

/// The kinds the source follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Cluster,
    Gateway,
    AccessPolicy,
    FleetResource,
    KarmadaCluster,
    ResourceRegistry,
    Secret,
}

/// What a kind's watcher task tells the source's loop.
enum Update {
    /// Boxed: the channel's slots stay small (an event is large, `Missing` is nothing).
    Event(Box<Event<DynamicObject>>),
    /// The API server answered 404 for the resource: not served (no CRD).
    Missing,
}

/// Whether a watcher error is the API server saying the resource does not exist.
fn is_not_found(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 404,
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}

impl Kind {
    /// `plural.group` (`clusters.cluster.karmada.io`, `secrets`), as kubectl names resources.
    fn resource_name(self) -> String {
        let resource = self.resource();
        if resource.group.is_empty() {
            resource.plural
        } else {
            format!("{}.{}", resource.plural, resource.group)
        }
    }

    /// Whether the management cluster may not serve this kind at all: then it has no objects of
    /// it, and that is no problem (the fleet view's kinds; see the module comment).
    fn is_optional(self) -> bool {
        matches!(self, Kind::FleetResource | Kind::ResourceRegistry)
    }

    /// The `/readyz` check that reports this kind's watch.
    fn readiness_check(self) -> String {
        format!("kubernetes-api-watch {}", self.resource_name())
    }

    fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::Cluster => ("fleetgate.io", "v1alpha1", "Cluster", "clusters"),
            Kind::Gateway => ("fleetgate.io", "v1alpha1", "Gateway", "gateways"),
            Kind::AccessPolicy => ("fleetgate.io", "v1alpha1", "AccessPolicy", "accesspolicies"),
            Kind::FleetResource => (
                "fleetgate.io",
                "v1alpha1",
                "FleetResource",
                "fleetresources",
            ),
            Kind::KarmadaCluster => ("cluster.karmada.io", "v1alpha1", "Cluster", "clusters"),
            Kind::ResourceRegistry => (
                "search.karmada.io",
                "v1alpha1",
                "ResourceRegistry",
                "resourceregistries",
            ),
            Kind::Secret => ("", "v1", "Secret", "secrets"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }
}

/// The kinds `options` says to follow.
fn watched_kinds(options: &KubeSourceOptions) -> Vec<Kind> {
    let mut kinds = Vec::new();
    if options.fleetgate {
        kinds.extend([
            Kind::Cluster,
            Kind::Gateway,
            Kind::AccessPolicy,
            Kind::FleetResource,
        ]);
    }
    if options.karmada {
        kinds.extend([Kind::KarmadaCluster, Kind::ResourceRegistry]);
    }
    // Karmada Clusters and fleetgate Clusters (`spec.credentials.secretRef`) reference Secrets;
    // watched, so a rotated Secret rebuilds the table.
    if !kinds.is_empty() {
        kinds.push(Kind::Secret);
    }
    kinds
}

/// What the API source asks of the management cluster with `options`, as RBAC rules name it:
/// (API group, resource, verbs). `secrets` are read in `options.secrets_namespace` only, when
/// set. `deploy/base/rbac.yaml` grants these (a test compares them).
pub fn api_source_permissions(
    options: &KubeSourceOptions,
) -> Vec<(String, String, &'static [&'static str])> {
    let mut permissions = Vec::new();
    for kind in watched_kinds(options) {
        let resource = kind.resource();
        permissions.push((
            resource.group.clone(),
            resource.plural.clone(),
            &["get", "list", "watch"][..],
        ));
        if CONDITION_KINDS.contains(&kind) {
            permissions.push((
                resource.group,
                format!("{}/status", resource.plural),
                &["patch"][..],
            ));
        }
    }
    permissions
}

/// Starts following the API that `client_config` reaches. Returns at once; the first table is
/// published when every kind has been listed. With `agents`, this replica's pull-mode agents are
/// written into the `Tunnel` Clusters' status, and removed when the source is dropped.
pub fn watch_kube_api(
    client_config: kube::Config,
    options: KubeSourceOptions,
    publisher: TablePublisher,
    agents: Option<AgentReport>,
) -> Result<KubeWatcher, KubeSourceError> {
    let kinds = watched_kinds(&options);
    if kinds.is_empty() {
        return Err(KubeSourceError::NothingToWatch);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(KubeSourceError::Runtime)?;
    // The client is built here so a bad configuration fails the caller, not the thread.
    let client = {
        let _guard = runtime.enter();
        kube::Client::try_from(client_config).map_err(KubeSourceError::Client)?
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let (ended_tx, ended_rx) = std::sync::mpsc::channel::<()>();
    let leaves = agents.is_some() && options.fleetgate;
    let thread = std::thread::Builder::new()
        .name("fleetgate-kube-source".into())
        .spawn(move || {
            let _ended = ended_tx;
            runtime.block_on(async move {
                let agents = agents.filter(|_| options.fleetgate);
                let report = agents.clone();
                tokio::select! {
                    () = follow(client.clone(), kinds, options, publisher, agents) => {}
                    _ = stop_rx => {
                        debug!("Kubernetes API source stopped");
                        if let Some(report) = report {
                            let left = tokio::time::timeout(
                                LEAVE_TIMEOUT,
                                agents::leave(&client, &report),
                            );
                            if left.await.is_err() {
                                warn!("removing this replica's agent entries took too long");
                            }
                        }
                    }
                }
            });
        })
        .map_err(KubeSourceError::Thread)?;
    Ok(KubeWatcher {
        stop: Some(stop_tx),
        ended: leaves.then_some(ended_rx),
        _thread: thread,
    })
}

/// The objects seen so far, by kind and `namespace/name`, as JSON.
#[derive(Default)]
struct Objects {
    current: BTreeMap<Kind, BTreeMap<String, serde_json::Value>>,
    /// Objects of a re-list in progress, swapped in on `InitDone`.
    listing: BTreeMap<Kind, BTreeMap<String, serde_json::Value>>,
    listed: BTreeSet<Kind>,
}

fn key(obj: &DynamicObject) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or(""),
        obj.metadata.name.as_deref().unwrap_or("")
    )
}

/// The object as JSON, with `apiVersion` and `kind` set (list items from the API lack them).
fn to_json(kind: Kind, obj: DynamicObject) -> serde_json::Value {
    let resource = kind.resource();
    let mut value = serde_json::to_value(obj).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), resource.api_version.into());
        map.insert("kind".into(), resource.kind.into());
    }
    value
}

/// What a watcher event changed in the objects seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Nothing,
    /// Only an object's status (and the metadata every write changes): nothing to rebuild, but
    /// the statuses are compared again.
    Status,
    /// What the table is built from.
    Objects,
}

/// What the events applied since the last look changed.
#[derive(Debug, Default)]
struct Pending {
    /// The objects the table is built from.
    objects: bool,
    /// Only a status: compared again, nothing rebuilt.
    statuses: bool,
}

/// An object without what a status write changes: `status`, `metadata.resourceVersion` and
/// `metadata.managedFields`.
fn configuration_part(value: &serde_json::Value) -> serde_json::Value {
    let mut value = value.clone();
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
        }
    }
    value
}

impl Objects {
    /// Applies one watcher event; says whether the visible set changed, or only a status.
    fn apply(&mut self, kind: Kind, event: Event<DynamicObject>) -> Change {
        match event {
            Event::Init => {
                self.listing.insert(kind, BTreeMap::new());
                Change::Nothing
            }
            Event::InitApply(obj) => {
                let k = key(&obj);
                self.listing
                    .entry(kind)
                    .or_default()
                    .insert(k, to_json(kind, obj));
                Change::Nothing
            }
            Event::InitDone => {
                let listed = self.listing.remove(&kind).unwrap_or_default();
                self.current.insert(kind, listed);
                self.listed.insert(kind);
                Change::Objects
            }
            Event::Apply(obj) => {
                let k = key(&obj);
                let value = to_json(kind, obj);
                let change = match self.current.get(&kind).and_then(|m| m.get(&k)) {
                    Some(before) if configuration_part(before) == configuration_part(&value) => {
                        Change::Status
                    }
                    _ => Change::Objects,
                };
                self.current.entry(kind).or_default().insert(k, value);
                change
            }
            Event::Delete(obj) => {
                let k = key(&obj);
                if self.current.entry(kind).or_default().remove(&k).is_some() {
                    Change::Objects
                } else {
                    Change::Nothing
                }
            }
        }
    }

    /// The management cluster does not serve `kind` (its CRD is not installed, or was removed):
    /// it counts as listed with no objects, so the other kinds are served; its watcher keeps
    /// retrying and lists it once the CRD appears.
    fn mark_missing(&mut self, kind: Kind) -> bool {
        self.listing.remove(&kind);
        let had_objects = self
            .current
            .insert(kind, BTreeMap::new())
            .is_some_and(|m| !m.is_empty());
        let newly_listed = self.listed.insert(kind);
        had_objects || newly_listed
    }

    fn of(&self, kind: Kind) -> impl Iterator<Item = &serde_json::Value> {
        self.current.get(&kind).into_iter().flat_map(|m| m.values())
    }
}

async fn follow(
    client: kube::Client,
    kinds: Vec<Kind>,
    options: KubeSourceOptions,
    publisher: TablePublisher,
    agents: Option<AgentReport>,
) {
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    for &kind in &kinds {
        let resource = kind.resource();
        let api: Api<DynamicObject> = match (kind, &options.secrets_namespace) {
            (Kind::Secret, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        let tx = events_tx.clone();
        let status = publisher.status().clone();
        tokio::spawn(async move {
            let check = kind.readiness_check();
            let mut failing = false;
            // An optional kind the management cluster does not serve (said once, not per retry).
            let mut absent = false;
            let mut stream = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        if failing {
                            failing = false;
                            status.set_source_problem(&check, None);
                            info!(kind = %kind.resource_name(), "Kubernetes API watch recovered");
                        }
                        if absent {
                            absent = false;
                            info!("the management cluster serves {} now", kind.resource_name());
                        }
                        if tx.send((kind, Update::Event(Box::new(event)))).is_err() {
                            return;
                        }
                    }
                    // An optional kind that is not served has no objects, and that is all: no
                    // readiness problem. The watcher keeps retrying (with backoff, at most 30 s
                    // apart), so a CRD installed later is listed then.
                    Err(error) if kind.is_optional() && is_not_found(&error) => {
                        if absent {
                            debug!(?kind, %error, "still not served");
                        } else {
                            absent = true;
                            info!(
                                "the management cluster does not serve {}: none are read until its CRD is installed",
                                kind.resource_name()
                            );
                        }
                        if failing {
                            failing = false;
                            status.set_source_problem(&check, None);
                        }
                        if tx.send((kind, Update::Missing)).is_err() {
                            return;
                        }
                    }
                    // The watcher retries with backoff; until the list succeeds the kind stays
                    // unlisted and nothing is published from a partial view, except when the
                    // resource does not exist at all (404): then it is listed as empty. Either
                    // way `/readyz` fails with the reason until the watch works.
                    Err(error) => {
                        let missing = is_not_found(&error);
                        let reason = if missing {
                            format!(
                                "the management cluster does not serve {} (is its CRD installed?): {error}",
                                kind.resource_name()
                            )
                        } else {
                            format!("watching {} failed: {error}", kind.resource_name())
                        };
                        warn!(kind = %kind.resource_name(), %error, missing, "Kubernetes API watch failed; retrying");
                        failing = true;
                        status.set_source_problem(&check, Some(reason));
                        if missing && tx.send((kind, Update::Missing)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    }
    drop(events_tx);
    let mut objects = Objects::default();
    // What changed since the table was built (`Change::Objects`) or the statuses were compared
    // (`Change::Status` too).
    let mut pending = Pending::default();
    let mut first_published = false;
    let apply = |objects: &mut Objects, pending: &mut Pending, kind: Kind, update: Update| {
        let change = match update {
            Update::Event(event) => objects.apply(kind, *event),
            Update::Missing if objects.mark_missing(kind) => Change::Objects,
            Update::Missing => Change::Nothing,
        };
        pending.objects |= change == Change::Objects;
        pending.statuses |= change == Change::Status;
    };
    let mut agents = agents.map(agents::AgentStatus::new);
    let (agents_changed, period) = match &agents {
        Some(a) => (a.report().changed.clone(), a.report().heartbeat),
        None => (Default::default(), AGENT_HEARTBEAT),
    };
    let mut heartbeat = tokio::time::interval(period);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // What the conditions were last written against: the serving table's generation and the
    // last rejection. The file source publishes too (and the merged table exists only once both
    // have reported), so the table can change with no event here: after every reload outcome,
    // whichever source's, the conditions are written again if it changed.
    let mut written_against: Option<(u64, Option<String>)> = None;
    let mut circuits = CircuitConditions::default();
    let mut outcomes = publisher.status().outcomes();
    let mut circuits_changed = open_circuits().subscribe();
    loop {
        // An agent's tunnel came or went, or a heartbeat is due.
        let mut agents_due = false;
        // A member's circuit breaker opened or closed.
        let mut circuits_due = false;
        let event = tokio::select! {
            event = events_rx.recv() => match event {
                Some(event) => Some(event),
                None => return,
            },
            changed = outcomes.changed() => match changed {
                Ok(()) => None,
                // The status outlives this loop (the publisher holds it): not reached.
                Err(_) => return,
            },
            () = agents_changed.notified(), if agents.is_some() => {
                agents_due = true;
                None
            }
            Ok(()) = circuits_changed.changed(), if options.fleetgate => {
                circuits_due = true;
                None
            }
            _ = heartbeat.tick(), if agents.is_some() => {
                if let Some(agents) = agents.as_mut() {
                    agents.tick();
                }
                agents_due = true;
                None
            }
        };
        if let Some((kind, update)) = event {
            apply(&mut objects, &mut pending, kind, update);
            // Apply everything already queued before rebuilding: one rebuild per burst.
            while let Ok((kind, update)) = events_rx.try_recv() {
                apply(&mut objects, &mut pending, kind, update);
            }
        }
        if !kinds.iter().all(|k| objects.listed.contains(k)) {
            continue;
        }
        let Pending {
            objects: rebuilt,
            statuses: statuses_changed,
        } = std::mem::take(&mut pending);
        if rebuilt {
            if !first_published {
                first_published = true;
                info!(kinds = %kinds.iter().map(|k| k.resource_name()).collect::<Vec<_>>().join(","), "Kubernetes API source: initial lists done");
            }
            let loaded = build_objects(&objects, &options);
            publisher.publish(crate::reload::API_SOURCE, Ok(loaded));
        }
        if rebuilt
            || statuses_changed
            || circuits_due
            || written_against.as_ref() != Some(&serving_state(&publisher))
        {
            written_against = Some(serving_state(&publisher));
            write_conditions(&client, &objects, &publisher, &mut circuits).await;
        }
        if let Some(agents) = agents
            .as_mut()
            .filter(|_| rebuilt || statuses_changed || agents_due)
        {
            agents.write(&client, &objects).await;
        }
    }
}

/// What an object's `Ready` condition depends on besides the object: the serving table's
/// generation and the last rejection's message.
fn serving_state(publisher: &TablePublisher) -> (u64, Option<String>) {
    (
        publisher.table().load().generation(),
        publisher.status().last_error().map(|f| f.message),
    )
}

/// The fleetgate kinds whose objects get a `Ready` condition (Gateways do not: there is one, and
/// `/readyz` says whether it is served; Karmada's objects never do).
const CONDITION_KINDS: [Kind; 3] = [Kind::Cluster, Kind::AccessPolicy, Kind::FleetResource];

/// The `Ready` condition a fleetgate object should carry now: `True` when the serving table
/// holds it as written, `False` with the reason it was rejected (and whether its last good
/// version serves) otherwise. `rejected`: the reload status's rejected objects.
fn desired_condition(
    kind: Kind,
    value: &serde_json::Value,
    table: &crate::table::RouteTable,
    rejected: &[RejectedObject],
) -> (&'static str, &'static str, String) {
    // An API object's origin names its kind and name: one object, whichever source judged it.
    let origin = origin(kind, value);
    if let Some(r) = rejected.iter().find(|r| r.object.origin == origin) {
        return ("False", "Invalid", r.to_string());
    }
    let serving = table.config();
    let served = match kind {
        Kind::Cluster => serving.clusters.iter().any(|c| c.origin == origin),
        Kind::AccessPolicy => serving.policies.iter().any(|p| p.origin == origin),
        Kind::FleetResource => serving.fleet.iter().any(|f| f.origin == origin),
        // Not in CONDITION_KINDS: never asked.
        _ => false,
    };
    if served {
        (
            "True",
            "Served",
            format!("served in routing table generation {}", table.generation()),
        )
    } else {
        ("False", "NotServed", "valid, not served yet".to_owned())
    }
}

/// Writes the `Ready` condition of every fleetgate Cluster, AccessPolicy and FleetResource object
/// whose condition changed, and a Cluster's `CircuitOpen` condition (`circuit`) with it (one
/// patch: a merge patch replaces the list). Karmada's objects are left alone: their status
/// belongs to Karmada's controllers. An unchanged condition is never rewritten, so the status
/// write (itself a watch event) settles.
async fn write_conditions(
    client: &kube::Client,
    objects: &Objects,
    publisher: &TablePublisher,
    circuits: &mut CircuitConditions,
) {
    let table = publisher.table().load();
    let rejected = publisher.status().rejected_objects();
    for kind in CONDITION_KINDS {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.resource());
        for value in objects.of(kind) {
            let Some(name) = value["metadata"]["name"].as_str() else {
                continue;
            };
            let (status, reason, message) = desired_condition(kind, value, &table, &rejected);
            let current = value["status"]["conditions"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
            let ready_unchanged = current.is_some_and(|c| {
                c["status"] == status && c["reason"] == reason && c["message"] == message.as_str()
            });
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let circuit = match kind {
                Kind::Cluster => circuits.desired(name, value, &rfc3339(now)),
                _ => None,
            };
            if ready_unchanged && !circuit.as_ref().is_some_and(|(_, due)| *due) {
                continue;
            }
            let transition = match current {
                Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
                _ => serde_json::Value::String(rfc3339(now)),
            };
            let mut conditions = vec![serde_json::json!({
                "type": "Ready",
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": transition,
                "observedGeneration": value["metadata"]["generation"],
            })];
            conditions.extend(circuit.as_ref().map(|(c, _)| c.clone()));
            let patch = serde_json::json!({"status": {"conditions": conditions}});
            match patch_status(&api, name, &patch).await {
                Ok(()) => {
                    if let Some((condition, _)) = circuit {
                        circuits.wrote(name, condition);
                    }
                }
                Err(error) => {
                    warn!(kind = %kind.resource_name(), object = name, %error, "cannot write the Ready condition");
                }
            }
        }
    }
}

/// Writes `patch` (a JSON merge patch) to the status of object `name`.
async fn patch_status(
    api: &Api<DynamicObject>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    let params = kube::api::PatchParams::default();
    match api
        .patch_status(name, &params, &kube::api::Patch::Merge(patch))
        .await
    {
        // Without a status subresource (an older CRD), status is part of the object.
        Err(kube::Error::Api(e)) if e.code == 404 => api
            .patch(name, &params, &kube::api::Patch::Merge(patch))
            .await
            .map(|_| ()),
        other => other.map(|_| ()),
    }
}

/// Now, as `2026-11-22T12:00:00.123456Z` (microseconds, as Kubernetes' `MicroTime`).
fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = rfc3339(now.as_secs() as i64);
    format!(
        "{}.{:06}Z",
        seconds.trim_end_matches('Z'),
        now.subsec_micros()
    )
}

/// `2026-11-22T12:00:00Z` from seconds since the Unix epoch (the format of Kubernetes times).
fn rfc3339(unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn origin(kind: Kind, value: &serde_json::Value) -> String {
    let name = value["metadata"]["name"].as_str().unwrap_or("");
    let resource = kind.resource();
    match value["metadata"]["namespace"].as_str() {
        Some(ns) => format!("api:{}.{}/{ns}/{name}", resource.plural, resource.group),
        None if resource.group.is_empty() => format!("api:{}/{name}", resource.plural),
        None => format!("api:{}.{}/{name}", resource.plural, resource.group),
    }
}

/// Keeps what the wire types take: API objects also carry `status` and server-set metadata.
fn wire_shape(value: &serde_json::Value, fields: &[&str]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for field in fields {
        if let Some(v) = value.get(*field) {
            out.insert((*field).to_owned(), v.clone());
        }
    }
    serde_json::Value::Object(out)
}

/// A `...File` field anywhere under `spec`, if any.
fn file_reference(value: &serde_json::Value, path: &str) -> Option<String> {
    match value {
        serde_json::Value::Object(map) => map.iter().find_map(|(k, v)| {
            let here = format!("{path}.{k}");
            if k.ends_with("File") && !v.is_null() {
                Some(here)
            } else {
                file_reference(v, &here)
            }
        }),
        _ => None,
    }
}

fn parse<T: serde::de::DeserializeOwned>(
    kind: Kind,
    value: &serde_json::Value,
    fields: &[&str],
) -> Result<T, ConfigError> {
    let origin = origin(kind, value);
    serde_json::from_value(wire_shape(value, fields)).map_err(|e| ConfigError::Parse {
        path: origin.into(),
        index: 0,
        message: format!("{}: {e}", kind.resource().kind),
    })
}

/// An object of a kind whose wire type is `apiVersion`, `kind`, `metadata` and `spec`.
fn parse_object<T: serde::de::DeserializeOwned>(
    kind: Kind,
    value: &serde_json::Value,
) -> Result<T, ConfigError> {
    parse(kind, value, &["apiVersion", "kind", "metadata", "spec"])
}

fn no_file_references(
    kind: Kind,
    kind_name: &'static str,
    value: &serde_json::Value,
) -> Result<(), ConfigError> {
    match file_reference(&value["spec"], "spec") {
        None => Ok(()),
        Some(field) => Err(ConfigError::Invalid {
            origin: origin(kind, value),
            kind: kind_name,
            name: value["metadata"]["name"].as_str().unwrap_or("").to_owned(),
            field: "spec",
            message: format!(
                "{field}: objects read from the Kubernetes API cannot name local files; use the Data form"
            ),
        }),
    }
}

/// The Secrets seen, decoded, by namespace and name; one that does not decode is a rejection
/// (the Clusters naming it then find no Secret, and keep their last good credentials).
fn secrets_of(
    objects: &Objects,
    rejected: &mut Vec<Rejection>,
) -> BTreeMap<(String, String), SecretData> {
    let mut secrets = BTreeMap::new();
    for value in objects.of(Kind::Secret) {
        let origin = origin(Kind::Secret, value);
        let secret = parse(
            Kind::Secret,
            value,
            &["apiVersion", "kind", "metadata", "data", "type"],
        )
        .and_then(|obj: SecretObject| SecretData::from_object(&obj, &origin));
        match secret {
            Ok(secret) => {
                secrets.insert((secret.namespace.clone(), secret.name.clone()), secret);
            }
            Err(error) => {
                let name = value["metadata"]["name"].as_str().unwrap_or("");
                rejected.push(Rejection::new(
                    ObjectRef::new("Secret", name, &origin),
                    error,
                ));
            }
        }
    }
    secrets
}

/// A fleetgate Cluster object, resolved (its Secret found through `find_secret`).
fn fleetgate_cluster(
    value: &serde_json::Value,
    secrets_namespace: Option<&str>,
    find_secret: &FindSecret<'_>,
) -> Result<crate::settings::ClusterConfig, ConfigError> {
    no_file_references(Kind::Cluster, "Cluster", value)?;
    let mut obj: ClusterObject = parse_object(Kind::Cluster, value)?;
    // A `secretRef` without a namespace names a Secret where the source reads Secrets (the files'
    // default, `default`, is a namespace this source may not even watch).
    if let (Some(reference), Some(namespace)) =
        (obj.spec.credentials.secret_ref.as_mut(), secrets_namespace)
    {
        if reference.namespace.as_deref().is_none_or(str::is_empty) {
            reference.namespace = Some(namespace.to_owned());
        }
    }
    debug_assert_eq!(obj.api_version, API_VERSION);
    // File references are refused above, so the base directory is never read.
    resolve_cluster(
        obj,
        Path::new("/nonexistent"),
        &origin(Kind::Cluster, value),
        find_secret,
    )
}

/// A FleetResource object, read as the file source reads it (resolved against the clusters when
/// the table is built).
fn fleet_resource(value: &serde_json::Value) -> Result<FleetSource, ConfigError> {
    let obj: FleetResourceObject = parse_object(Kind::FleetResource, value)?;
    Ok(FleetSource::from_fleet_resource(
        &obj.metadata,
        &obj.spec,
        &origin(Kind::FleetResource, value),
    ))
}

/// A Karmada ResourceRegistry object, read as the file source reads it.
fn resource_registry(value: &serde_json::Value) -> Result<FleetSource, ConfigError> {
    // Karmada's status and any spec field fleetgate does not read (`backendStore`) are ignored.
    let obj: ResourceRegistryObject = parse_object(Kind::ResourceRegistry, value)?;
    FleetSource::from_resource_registry(&obj, &origin(Kind::ResourceRegistry, value))
}

/// Judges the objects seen one by one (blocking work is only certificate parsing): each invalid
/// one is a rejection naming it, every valid one is kept (see `judge`).
fn build_objects(objects: &Objects, options: &KubeSourceOptions) -> LoadedObjects {
    // File references are refused above, so the base directory is never read.
    let no_base = Path::new("/nonexistent");
    let mut loaded = LoadedObjects {
        no_gateway:
            "no fleetgate.io Gateway object in the API and no local Gateway to fall back on".into(),
        ..LoadedObjects::default()
    };
    let named = |kind: Kind, value: &serde_json::Value| {
        let name = value["metadata"]["name"].as_str().unwrap_or("");
        let kind_name = match kind {
            Kind::KarmadaCluster => KARMADA_CLUSTER_KIND.to_owned(),
            other => other.resource().kind,
        };
        ObjectRef::new(&kind_name, name, &origin(kind, value))
    };
    let gateways_seen = objects.of(Kind::Gateway).count();
    for value in objects.of(Kind::Gateway) {
        let gateway = no_file_references(Kind::Gateway, "Gateway", value)
            .and_then(|()| parse_object::<GatewayObject>(Kind::Gateway, value))
            .and_then(|obj| resolve_gateway(obj, no_base, &origin(Kind::Gateway, value)));
        match gateway {
            Ok(gateway) => loaded.gateways.push((named(Kind::Gateway, value), gateway)),
            Err(error) => loaded
                .rejected
                .push(Rejection::new(named(Kind::Gateway, value), error)),
        }
    }
    if gateways_seen == 0 {
        if let Some(fallback) = &options.fallback_gateway {
            loaded
                .gateways
                .push((ObjectRef::new("Gateway", "", "local"), fallback.clone()));
        }
    }
    let secrets = secrets_of(objects, &mut loaded.rejected);
    let find_secret = |namespace: &str, name: &str| {
        secrets
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    };
    for value in objects.of(Kind::Cluster) {
        match fleetgate_cluster(value, options.secrets_namespace.as_deref(), &find_secret) {
            Ok(cluster) => loaded.clusters.push(cluster),
            Err(error) => loaded
                .rejected
                .push(Rejection::new(named(Kind::Cluster, value), error)),
        }
    }
    for value in objects.of(Kind::KarmadaCluster) {
        let origin = origin(Kind::KarmadaCluster, value);
        let cluster =
            parse_object::<KarmadaClusterObject>(Kind::KarmadaCluster, value).and_then(|obj| {
                debug_assert_eq!(obj.api_version, KARMADA_API_VERSION);
                karmada_cluster_config(&obj, &origin, &find_secret).map_err(|e| match e {
                    ConfigError::Invalid { .. } => e,
                    other => ConfigError::Set(format!("{KARMADA_CLUSTER_KIND}: {other}")),
                })
            });
        match cluster {
            Ok(cluster) => loaded.clusters.push(cluster),
            Err(error) => loaded
                .rejected
                .push(Rejection::new(named(Kind::KarmadaCluster, value), error)),
        }
    }
    for value in objects.of(Kind::AccessPolicy) {
        match parse_object::<AccessPolicyObject>(Kind::AccessPolicy, value) {
            Ok(mut obj) => {
                obj.origin = origin(Kind::AccessPolicy, value);
                // The status is the gateway's own output (the Ready condition), and the
                // resourceVersion changes with every write of it: neither is configuration.
                // Kept, each condition written would be a new configuration, and a new
                // condition after it.
                obj.status = None;
                obj.metadata.resource_version = None;
                loaded.policies.push(obj);
            }
            Err(error) => loaded
                .rejected
                .push(Rejection::new(named(Kind::AccessPolicy, value), error)),
        }
    }
    // Resolved against the clusters (selectors, kinds, one version per kind) when the table is
    // built, as the file source's are: a bad one is judged there, naming it.
    for (kind, read) in [
        (Kind::FleetResource, fleet_resource as fn(&_) -> _),
        (Kind::ResourceRegistry, resource_registry),
    ] {
        for value in objects.of(kind) {
            match read(value) {
                Ok(source) => loaded.fleet.push(source),
                Err(error) => loaded
                    .rejected
                    .push(Rejection::new(named(kind, value), error)),
            }
        }
    }
    loaded
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn kubernetes_times() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
