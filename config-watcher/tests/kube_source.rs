//! The Kubernetes API source against the simulated fleet acting as the management cluster
//! (member1, reached as admin through the fleet's kubeconfig): fleetgate.io Clusters and Karmada
//! Clusters with their Secrets, and the fleet view's FleetResources and Karmada
//! ResourceRegistries, created before and after the source starts, changed, rotated, broken and
//! deleted. The first table must hold everything that existed before the start (the watcher's
//! initial list, never a partial view); every later change must be published within a deadline;
//! a broken object is left out (or keeps its last good version) and is reported, in the reload
//! status and in its own `Ready` condition, while every valid object beside it is served.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use base64::Engine;
use fleetgate_config_watcher::{
    crd_manifests, load_path, watch_kube_api, AgentReport, KubeSourceOptions, KubeWatcher,
    ReloadStatus, RouteTable, SharedTable, TablePublisher,
};
use fleetgate_loadtest::sim::{start_fleet, FleetHandle, FleetOptions};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde::Deserialize;
use serde_json::json;

const GATEWAY: &str = "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: gw\nspec:\n  listeners:\n  - address: 127.0.0.1:0\n    tls: false\n";

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

struct Management {
    client: kube::Client,
}

impl Management {
    fn api(&self, group: &str, version: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &resource(group, version, kind, plural))
    }

    fn clusters(&self) -> Api<DynamicObject> {
        self.api("fleetgate.io", "v1alpha1", "Cluster", "clusters")
    }

    fn karmada_clusters(&self) -> Api<DynamicObject> {
        self.api("cluster.karmada.io", "v1alpha1", "Cluster", "clusters")
    }

    fn secrets(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            "karmada-cluster",
            &resource("", "v1", "Secret", "secrets"),
        )
    }

    async fn create(&self, api: &Api<DynamicObject>, object: serde_json::Value) {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap();
    }

    /// Replaces `name` at its latest version. The source writes the objects' status while the
    /// test runs, so a 409 Conflict means "read it again and retry", as for any kube client.
    async fn replace(&self, api: &Api<DynamicObject>, name: &str, object: serde_json::Value) {
        let mut object: DynamicObject = serde_json::from_value(object).unwrap();
        for _ in 0..20 {
            let current = api.get(name).await.unwrap();
            object.metadata.resource_version = current.metadata.resource_version;
            match api.replace(name, &PostParams::default(), &object).await {
                Ok(_) => return,
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(e) => panic!("replacing {name}: {e}"),
            }
        }
        panic!("replacing {name}: still conflicting after 20 attempts");
    }

    async fn delete(&self, api: &Api<DynamicObject>, name: &str) {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
}

fn fleetgate_cluster(name: &str, server: &str, ca: &str, token: &str) -> serde_json::Value {
    json!({
        "apiVersion": "fleetgate.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name, "labels": {"source": "api"}},
        "spec": {"server": server, "caData": ca, "credentials": {"token": token}},
    })
}

fn karmada_secret(name: &str, ca: &str, token: &str) -> serde_json::Value {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": "karmada-cluster"},
        "type": "Opaque",
        "data": {"token": b64(token), "caBundle": b64(ca)},
    })
}

fn karmada_cluster(name: &str, server: &str, secret: &str) -> serde_json::Value {
    json!({
        "apiVersion": "cluster.karmada.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {
            "syncMode": "Push",
            "apiEndpoint": server,
            "secretRef": {"namespace": "karmada-cluster", "name": secret},
            "impersonatorSecretRef": {"namespace": "karmada-cluster", "name": secret},
        },
    })
}

/// Polls `check` until it holds; panics after 5 s.
async fn eventually(what: &str, check: impl FnMut() -> bool) {
    eventually_within(what, Duration::from_secs(5), check).await;
}

/// Polls `check` until it holds; panics after `deadline`.
async fn eventually_within(what: &str, deadline: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits for the change just made to be rejected: the error names each of `names`, and the
/// table of generation `serving` keeps serving.
async fn rejected(status: &ReloadStatus, table: &SharedTable, serving: u64, names: &[&str]) {
    eventually(&format!("a rejection naming {names:?}"), || {
        status.last_error().is_some()
    })
    .await;
    let failure = status.last_error().unwrap().message;
    assert!(names.iter().all(|n| failure.contains(n)), "{failure}");
    assert_eq!(table.load().generation(), serving, "{failure}");
}

/// Polls the object's `Ready` condition until it has `status`; returns the condition.
async fn ready_condition(api: &Api<DynamicObject>, name: &str, status: &str) -> serde_json::Value {
    condition(api, name, "Ready", status).await
}

/// Polls the object's condition of type `kind` until it has `status`; returns the condition.
async fn condition(
    api: &Api<DynamicObject>,
    name: &str,
    kind: &str,
    status: &str,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let object = api.get(name).await.unwrap();
        let condition = object.data["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == kind))
            .cloned();
        if let Some(c) = condition.filter(|c| c["status"] == status) {
            assert!(
                c["lastTransitionTime"]
                    .as_str()
                    .is_some_and(|t| t.ends_with('Z')),
                "{c}"
            );
            return c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{name}: no {kind}={status} condition: {}",
            object.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn authorization(table: &SharedTable, name: &str) -> Option<String> {
    table
        .load()
        .cluster(name)
        .and_then(|c| c.authorization.clone())
}

fn port(table: &SharedTable, name: &str) -> Option<u16> {
    table.load().cluster(name).map(|c| c.upstream.port)
}

/// The simulated fleet (two members) with member1 as the management cluster, reached as admin.
struct ManagementFleet {
    runtime: tokio::runtime::Runtime,
    fleet: FleetHandle,
    /// Holds the fleet's files until the test ends.
    fleet_dir: tempfile::TempDir,
    kube_config: kube::Config,
    management: Management,
}

impl ManagementFleet {
    fn start() -> ManagementFleet {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fleet_dir = tempfile::tempdir().unwrap();
        let fleet = runtime
            .block_on(start_fleet(FleetOptions {
                dir: fleet_dir.path().to_path_buf(),
                clusters: 2,
                objects: 0,
                churn_per_sec: 0.0,
                gateway_listen: None,
            }))
            .unwrap();
        let kube_config = runtime.block_on(async {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(fleet_dir.path().join("kubeconfig")).unwrap();
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions {
                    context: Some("member1".into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap()
        });
        let management = Management {
            client: runtime
                .block_on(async { kube::Client::try_from(kube_config.clone()).unwrap() }),
        };
        ManagementFleet {
            runtime,
            fleet,
            fleet_dir,
            kube_config,
            management,
        }
    }

    /// member2's server, CA and token, as its file in the fleet's directory has them.
    fn member2(&self) -> (String, String, String) {
        let member2: serde_yaml::Value = serde_yaml::from_str(
            &std::fs::read_to_string(self.fleet_dir.path().join("clusters/member2.yaml")).unwrap(),
        )
        .unwrap();
        let field = |v: &serde_yaml::Value| v.as_str().unwrap().to_owned();
        (
            field(&member2["spec"]["server"]),
            field(&member2["spec"]["caData"]),
            field(&member2["spec"]["credentials"]["token"]),
        )
    }

    /// Starts the API source (fleetgate and Karmada objects, Secrets in `karmada-cluster`) on a
    /// table built from a local Gateway, its fallback.
    fn watch(&self) -> (KubeWatcher, SharedTable, Arc<ReloadStatus>) {
        self.watch_reporting(None)
    }

    /// Like [`ManagementFleet::watch`], reporting a gateway replica's agents with `agents`.
    fn watch_reporting(
        &self,
        agents: Option<AgentReport>,
    ) -> (KubeWatcher, SharedTable, Arc<ReloadStatus>) {
        let local = tempfile::tempdir().unwrap();
        std::fs::write(local.path().join("gateway.yaml"), GATEWAY).unwrap();
        let local = load_path(local.path()).unwrap();
        let table: SharedTable =
            Arc::new(ArcSwap::from_pointee(RouteTable::build(&local).unwrap()));
        let status = ReloadStatus::new();
        let source = watch_kube_api(
            self.kube_config.clone(),
            KubeSourceOptions {
                fleetgate: true,
                karmada: true,
                secrets_namespace: Some("karmada-cluster".into()),
                fallback_gateway: Some(local.gateway.clone()),
            },
            TablePublisher::new(table.clone(), status.clone()),
            agents,
        )
        .unwrap();
        (source, table, status)
    }

    /// Stops the source, then the fleet.
    fn shutdown(self, source: KubeWatcher) {
        drop(source);
        self.runtime.block_on(self.fleet.shutdown());
    }
}

/// Creates a CRD (the sim serves its resource from then on).
async fn create_crd(management: &Management, crd: serde_json::Value) {
    let crds = management.api(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
    );
    management.create(&crds, crd).await;
}

#[test]
fn clusters_and_karmada_clusters_follow_the_management_cluster() {
    let setup = ManagementFleet::start();
    let (server, ca, token) = setup.member2();
    let (runtime, management) = (&setup.runtime, &setup.management);

    // Before the source starts: the Karmada CRD, its namespace, a Secret, a Karmada Cluster and a
    // fleetgate Cluster.
    runtime.block_on(async {
        create_crd(
            management,
            json!({
                    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                    "metadata": {"name": "clusters.cluster.karmada.io"},
                    "spec": {
                        "group": "cluster.karmada.io", "scope": "Cluster",
                        "names": {"kind": "Cluster", "plural": "clusters", "singular": "cluster", "listKind": "ClusterList"},
                        "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                            "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                            "subresources": {"status": {}}}],
                    },
                }),
            )
            .await;
        let namespaces = management.api("", "v1", "Namespace", "namespaces");
        management
            .create(
                &namespaces,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "karmada-cluster"}}),
            )
            .await;
        management
            .create(&management.secrets(), karmada_secret("kc-member2", &ca, &token))
            .await;
        management
            .create(
                &management.karmada_clusters(),
                karmada_cluster("kc-member2", &server, "kc-member2"),
            )
            .await;
        management
            .create(
                &management.clusters(),
                fleetgate_cluster("fg-member2", &server, &ca, &token),
            )
            .await;
    });

    let (source, table, status) = setup.watch();

    runtime.block_on(async {
        // The first table holds every object that existed before the start, at once.
        eventually("the first table", || status.published() >= 1).await;
        assert_eq!(status.published(), 1);
        let first = table.load();
        assert_eq!(first.generation(), 2);
        let names: Vec<_> = {
            let mut n: Vec<_> = first.clusters().map(|c| c.name.to_string()).collect();
            n.sort();
            n
        };
        assert_eq!(names, ["fg-member2", "kc-member2"]);
        let kc = first.cluster("kc-member2").unwrap();
        assert_eq!(kc.upstream.authority, server.trim_start_matches("https://"));
        assert_eq!(
            kc.authorization.as_deref(),
            Some(&*format!("Bearer {token}"))
        );
        assert!(kc.impersonation);
        assert_eq!(first.cluster("fg-member2").unwrap().labels["source"], "api");
        assert!(status.last_error().is_none());

        // Added after the start, then changed.
        management
            .create(
                &management.clusters(),
                fleetgate_cluster("extra", "https://127.0.0.1:1", &ca, "t1"),
            )
            .await;
        eventually("extra added", || port(&table, "extra") == Some(1)).await;
        management
            .replace(
                &management.clusters(),
                "extra",
                fleetgate_cluster("extra", "https://127.0.0.1:2", &ca, "t1"),
            )
            .await;
        eventually("extra changed", || port(&table, "extra") == Some(2)).await;

        // A rotated Secret reaches the Karmada cluster's credentials.
        management
            .replace(
                &management.secrets(),
                "kc-member2",
                karmada_secret("kc-member2", &ca, "rotated-token"),
            )
            .await;
        eventually("the rotated token", || {
            authorization(&table, "kc-member2").as_deref() == Some("Bearer rotated-token")
        })
        .await;

        // A fleetgate Cluster whose credentials are a Secret (`spec.credentials.secretRef`, the
        // keys Kubernetes uses): served with the Secret's token and CA, and a rotated Secret
        // reaches it.
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let creds = |token: &str| {
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "fg-creds", "namespace": "karmada-cluster"},
                "type": "Opaque",
                "data": {"token": b64(token), "ca.crt": b64(&ca)},
            })
        };
        management
            .create(&management.secrets(), creds("secret-token-1"))
            .await;
        management
            .create(
                &management.clusters(),
                json!({
                    "apiVersion": "fleetgate.io/v1alpha1", "kind": "Cluster",
                    "metadata": {"name": "fg-secret"},
                    "spec": {"server": server, "credentials": {
                        "secretRef": {"name": "fg-creds", "namespace": "karmada-cluster"}}},
                }),
            )
            .await;
        eventually("the Secret's token", || {
            authorization(&table, "fg-secret").as_deref() == Some("Bearer secret-token-1")
        })
        .await;
        management
            .replace(&management.secrets(), "fg-creds", creds("secret-token-2"))
            .await;
        eventually("the rotated Secret's token", || {
            authorization(&table, "fg-secret").as_deref() == Some("Bearer secret-token-2")
        })
        .await;
        management.delete(&management.clusters(), "fg-secret").await;
        eventually("fg-secret removed", || {
            table.load().cluster("fg-secret").is_none()
        })
        .await;

        // Broken: the last good table keeps serving and the error names the object and field.
        let generation = table.load().generation();
        management
            .create(
                &management.clusters(),
                fleetgate_cluster("broken", "ftp://nowhere", &ca, "t"),
            )
            .await;
        rejected(
            &status,
            &table,
            generation,
            &[
                "api:clusters.fleetgate.io/broken",
                "Cluster broken",
                "spec.server",
            ],
        )
        .await;
        assert_eq!(port(&table, "extra"), Some(2));
        // The objects say so in their status: the broken one why, the served ones that they are.
        let broken = ready_condition(&management.clusters(), "broken", "False").await;
        assert_eq!(broken["reason"], "Invalid");
        assert!(
            broken["message"].as_str().unwrap().contains("spec.server"),
            "{broken}"
        );
        let served = ready_condition(&management.clusters(), "fg-member2", "True").await;
        assert_eq!(served["reason"], "Served");
        management.delete(&management.clusters(), "broken").await;
        eventually("the error cleared", || status.last_error().is_none()).await;

        // An object from the API may not make the gateway read a local file.
        let mut with_file = fleetgate_cluster("with-file", "https://127.0.0.1:3", &ca, "t");
        with_file["spec"]["credentials"] = json!({"tokenFile": "/etc/shadow"});
        management.create(&management.clusters(), with_file).await;
        rejected(
            &status,
            &table,
            generation,
            &["spec.credentials.tokenFile", "local files"],
        )
        .await;
        assert!(table.load().cluster("with-file").is_none());
        management.delete(&management.clusters(), "with-file").await;

        // One bad object blocks nothing: a Cluster whose Secret nobody created, and a good one
        // created with it. The good one is served; each says so in its status.
        management
            .create(
                &management.clusters(),
                json!({
                    "apiVersion": "fleetgate.io/v1alpha1", "kind": "Cluster",
                    "metadata": {"name": "no-secret"},
                    "spec": {"server": server, "credentials": {
                        "secretRef": {"name": "nobody-made-it"}}},
                }),
            )
            .await;
        management
            .create(
                &management.clusters(),
                fleetgate_cluster("onboarded", "https://127.0.0.1:4", &ca, "t4"),
            )
            .await;
        eventually("onboarded served", || port(&table, "onboarded") == Some(4)).await;
        assert!(table.load().cluster("no-secret").is_none());
        let missing = ready_condition(&management.clusters(), "no-secret", "False").await;
        assert_eq!(missing["reason"], "Invalid");
        let message = missing["message"].as_str().unwrap();
        assert!(
            message.contains("Secret karmada-cluster/nobody-made-it not found")
                && message.contains("not served"),
            "{missing}"
        );
        let onboarded = ready_condition(&management.clusters(), "onboarded", "True").await;
        assert_eq!(onboarded["reason"], "Served");

        // A served Cluster that turns invalid keeps its last good version, and says so.
        management
            .replace(
                &management.clusters(),
                "extra",
                fleetgate_cluster("extra", "ftp://nowhere", &ca, "t1"),
            )
            .await;
        let extra = ready_condition(&management.clusters(), "extra", "False").await;
        let message = extra["message"].as_str().unwrap();
        assert!(
            message.contains("spec.server")
                && message.contains("its last good version keeps serving"),
            "{extra}"
        );
        assert_eq!(port(&table, "extra"), Some(2));
        management.delete(&management.clusters(), "no-secret").await;
        management.delete(&management.clusters(), "onboarded").await;

        // Removed, both kinds.
        management.delete(&management.clusters(), "extra").await;
        management
            .delete(&management.karmada_clusters(), "kc-member2")
            .await;
        eventually("extra and kc-member2 removed", || {
            port(&table, "extra").is_none() && port(&table, "kc-member2").is_none()
        })
        .await;
        assert!(table.load().cluster("fg-member2").is_some());
        assert!(status.last_error().is_none());
    });
    setup.shutdown(source);
}

impl Management {
    fn fleet_resources(&self) -> Api<DynamicObject> {
        self.api(
            "fleetgate.io",
            "v1alpha1",
            "FleetResource",
            "fleetresources",
        )
    }

    fn resource_registries(&self) -> Api<DynamicObject> {
        self.api(
            "search.karmada.io",
            "v1alpha1",
            "ResourceRegistry",
            "resourceregistries",
        )
    }
}

/// The FleetResource CRD as `deploy/base/crds.yaml` installs it.
fn fleet_resource_crd() -> serde_json::Value {
    let manifests = crd_manifests();
    let crd = serde_yaml::Deserializer::from_str(&manifests)
        .map(|doc| serde_json::Value::deserialize(doc).unwrap())
        .find(|crd| crd["metadata"]["name"] == "fleetresources.fleetgate.io")
        .expect("deploy/base/crds.yaml defines FleetResource");
    crd
}

/// The ResourceRegistry CRD (a stand-in for Karmada's: the sim does not check schemas).
fn resource_registry_crd() -> serde_json::Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "resourceregistries.search.karmada.io"},
        "spec": {
            "group": "search.karmada.io", "scope": "Cluster",
            "names": {"kind": "ResourceRegistry", "plural": "resourceregistries",
                "singular": "resourceregistry", "listKind": "ResourceRegistryList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}}}],
        },
    })
}

/// A fleetgate Cluster labelled `env: ENV` (never dialled: only its labels matter here).
fn labelled_cluster(name: &str, env: &str, ca: &str) -> serde_json::Value {
    json!({
        "apiVersion": "fleetgate.io/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name, "labels": {"env": env}},
        "spec": {"server": "https://127.0.0.1:1", "caData": ca, "credentials": {"token": "t"}},
    })
}

fn fleet_resource(name: &str, selectors: serde_json::Value, env: &str) -> serde_json::Value {
    json!({
        "apiVersion": "fleetgate.io/v1alpha1", "kind": "FleetResource",
        "metadata": {"name": name},
        "spec": {"resourceSelectors": selectors, "clusters": {"selector": {"matchLabels": {"env": env}}}},
    })
}

fn resource_registry(name: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "search.karmada.io/v1alpha1", "kind": "ResourceRegistry",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// The fleet view as a user of `/fleet` meets it: `resource.group` (`pods`, `deployments.apps`)
/// at its version, and the clusters it is merged from.
fn fleet_view(table: &SharedTable) -> Vec<(String, String, Vec<String>)> {
    table
        .load()
        .fleet()
        .kinds
        .iter()
        .map(|k| {
            let resource = if k.group.is_empty() {
                k.resource.clone()
            } else {
                format!("{}.{}", k.resource, k.group)
            };
            (resource, k.group_version(), k.clusters.clone())
        })
        .collect()
}

fn kind(resource: &str, version: &str, clusters: &[&str]) -> (String, String, Vec<String>) {
    (
        resource.to_owned(),
        version.to_owned(),
        clusters.iter().map(|c| c.to_string()).collect(),
    )
}

#[test]
fn fleet_resources_and_resource_registries_follow_the_management_cluster() {
    let setup = ManagementFleet::start();
    let (_, ca, _) = setup.member2();
    let (runtime, management) = (&setup.runtime, &setup.management);

    // Before the source starts: three clusters, the FleetResource CRD and one FleetResource
    // merging pods and deployments from the prod clusters. Karmada's ResourceRegistry CRD is not
    // installed (karmada-search is an optional component).
    runtime.block_on(async {
        for (name, env) in [("east-1", "prod"), ("east-2", "prod"), ("west-1", "dev")] {
            management
                .create(&management.clusters(), labelled_cluster(name, env, &ca))
                .await;
        }
        create_crd(management, fleet_resource_crd()).await;
        management
            .create(
                &management.fleet_resources(),
                fleet_resource(
                    "workloads",
                    json!([{"apiVersion": "v1", "kind": "Pod"},
                           {"apiVersion": "apps/v1", "kind": "Deployment"}]),
                    "prod",
                ),
            )
            .await;
    });

    let (source, table, status) = setup.watch();

    runtime.block_on(async {
        // The first table merges the FleetResource's kinds from the clusters its selector picks;
        // the missing ResourceRegistry CRD neither held it back nor fails readiness.
        eventually("the first table", || status.published() >= 1).await;
        assert_eq!(
            fleet_view(&table),
            [
                kind("pods", "v1", &["east-1", "east-2"]),
                kind("deployments.apps", "apps/v1", &["east-1", "east-2"]),
            ]
        );
        let problems: Vec<String> = status
            .source_problems()
            .into_iter()
            .map(|(check, _)| check)
            .collect();
        // Karmada's Cluster CRD is missing too, and that one is required.
        assert_eq!(
            problems,
            ["kubernetes-api-watch clusters.cluster.karmada.io"],
            "{:?}",
            status.source_problems()
        );
        let served = ready_condition(&management.fleet_resources(), "workloads", "True").await;
        assert_eq!(served["reason"], "Served");

        // karmada-search installed later: its ResourceRegistries are read once the watcher's
        // retry (kube-rs's backoff: 0.8 s doubling) lists them. Names, a label selector and
        // `exclude` together: west-1 by name, the prod clusters but east-2.
        create_crd(management, resource_registry_crd()).await;
        management
            .create(
                &management.resource_registries(),
                resource_registry(
                    "configs",
                    json!({
                        "targetCluster": {
                            "clusterNames": ["west-1"],
                            "labelSelector": {"matchLabels": {"env": "prod"}},
                            "exclude": ["east-2"],
                        },
                        "resourceSelectors": [{"apiVersion": "v1", "kind": "ConfigMap"}],
                        "backendStore": {"openSearch": {"addresses": ["http://unused:9200"]}},
                    }),
                ),
            )
            .await;
        eventually_within(
            "the ResourceRegistry's kind",
            Duration::from_secs(20),
            || fleet_view(&table).iter().any(|(r, ..)| r == "configmaps"),
        )
        .await;
        assert_eq!(
            fleet_view(&table),
            [
                kind("configmaps", "v1", &["east-1", "west-1"]),
                kind("pods", "v1", &["east-1", "east-2"]),
                kind("deployments.apps", "apps/v1", &["east-1", "east-2"]),
            ]
        );

        // A cluster relabelled into prod joins the FleetResource's kinds.
        management
            .replace(
                &management.clusters(),
                "west-1",
                labelled_cluster("west-1", "prod", &ca),
            )
            .await;
        eventually("west-1 merged for pods", || {
            fleet_view(&table).contains(&kind("pods", "v1", &["east-1", "east-2", "west-1"]))
        })
        .await;

        // A FleetResource naming a kind that is not one: refused, the object and field named,
        // and the last good table keeps serving; the object's status says why.
        let generation = table.load().generation();
        let good_view = fleet_view(&table);
        management
            .create(
                &management.fleet_resources(),
                fleet_resource(
                    "broken",
                    json!([{"apiVersion": "v1", "kind": "pod"}]),
                    "prod",
                ),
            )
            .await;
        rejected(
            &status,
            &table,
            generation,
            &[
                "api:fleetresources.fleetgate.io/broken",
                "FleetResource broken",
                "spec.resourceSelectors[].kind",
            ],
        )
        .await;
        assert_eq!(fleet_view(&table), good_view);
        let broken = ready_condition(&management.fleet_resources(), "broken", "False").await;
        assert_eq!(broken["reason"], "Invalid");
        assert!(
            broken["message"]
                .as_str()
                .unwrap()
                .contains("spec.resourceSelectors[].kind"),
            "{broken}"
        );
        management
            .delete(&management.fleet_resources(), "broken")
            .await;
        eventually("the error cleared", || status.last_error().is_none()).await;

        // A ResourceRegistry restricted to a namespace: refused (fleetgate merges whole kinds).
        management
            .create(
                &management.resource_registries(),
                resource_registry(
                    "one-namespace",
                    json!({"resourceSelectors": [
                        {"apiVersion": "v1", "kind": "Secret", "namespace": "default"}]}),
                ),
            )
            .await;
        rejected(
            &status,
            &table,
            generation,
            &[
                "api:resourceregistries.search.karmada.io/one-namespace",
                "ResourceRegistry one-namespace",
                "spec.resourceSelectors[].namespace",
            ],
        )
        .await;
        assert_eq!(fleet_view(&table), good_view);
        management
            .delete(&management.resource_registries(), "one-namespace")
            .await;
        eventually("the error cleared", || status.last_error().is_none()).await;

        // Deleting an object removes its kinds (and only those).
        management
            .delete(&management.fleet_resources(), "workloads")
            .await;
        eventually("pods and deployments removed", || {
            fleet_view(&table) == [kind("configmaps", "v1", &["east-1", "west-1"])]
        })
        .await;
        management
            .delete(&management.resource_registries(), "configs")
            .await;
        eventually("configmaps removed", || fleet_view(&table).is_empty()).await;
        assert!(status.last_error().is_none());
    });
    setup.shutdown(source);
}

/// A gateway replica's agent report: `edge`'s agents are what `agents` holds (no other cluster
/// has any), with heartbeats `heartbeat` apart.
fn replica(name: &str, agents: &Arc<AtomicUsize>, heartbeat: Duration) -> AgentReport {
    let agents = agents.clone();
    let mut report = AgentReport::new(name, move |cluster: &str| {
        if cluster == "edge" {
            agents.load(Ordering::SeqCst)
        } else {
            0
        }
    });
    report.heartbeat = heartbeat;
    report
}

/// Polls `name`'s status until `status.agents` is `agents` and `status.tunnels` holds exactly
/// `replicas` (name and agents), each entry with an RFC 3339 heartbeat.
async fn agents_become(
    api: &Api<DynamicObject>,
    name: &str,
    agents: serde_json::Value,
    replicas: &[(&str, u64)],
) {
    let start = Instant::now();
    loop {
        let status = api.get(name).await.unwrap().data["status"].clone();
        let entries = status["tunnels"].as_object().cloned().unwrap_or_default();
        let reported: Vec<(&str, Option<u64>)> = entries
            .iter()
            .map(|(r, e)| (r.as_str(), e["agents"].as_u64()))
            .collect();
        let expected: Vec<(&str, Option<u64>)> =
            replicas.iter().map(|(r, a)| (*r, Some(*a))).collect();
        if status["agents"] == agents && reported == expected {
            for entry in entries.values() {
                let beat = entry["heartbeat"].as_str().unwrap_or("");
                assert!(beat.len() > 20 && beat.ends_with('Z'), "{status}");
            }
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{name}: wanted agents {agents} and entries {replicas:?}, have {status}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Merges `status` into `name`'s status, as another writer would (the simulated management
/// cluster's fleetgate Clusters have no status subresource: their status is part of the object).
async fn write_status(api: &Api<DynamicObject>, name: &str, status: serde_json::Value) {
    let patch = json!({ "status": status });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[test]
fn tunnel_clusters_say_how_many_agents_the_replicas_hold() {
    let setup = ManagementFleet::start();
    let (_, ca, token) = setup.member2();
    let (runtime, management) = (&setup.runtime, &setup.management);
    let clusters = management.clusters();
    runtime.block_on(async {
        management
            .create(
                &clusters,
                json!({
                    "apiVersion": "fleetgate.io/v1alpha1", "kind": "Cluster",
                    "metadata": {"name": "edge"},
                    "spec": {"connectMode": "Tunnel", "caData": ca, "credentials": {"token": token}},
                }),
            )
            .await;
        management
            .create(
                &clusters,
                fleetgate_cluster("direct", "https://127.0.0.1:1", &ca, &token),
            )
            .await;
    });

    // One replica, heartbeats 30 s apart: a count that changes is written at once, on its signal.
    let held_a = Arc::new(AtomicUsize::new(2));
    let report = replica("replica-a", &held_a, Duration::from_secs(30));
    let (source, ..) = setup.watch_reporting(Some(report.clone()));
    runtime.block_on(async {
        agents_become(&clusters, "edge", json!(2), &[("replica-a", 2)]).await;
        held_a.store(0, Ordering::SeqCst);
        report.changed.notify_one();
        agents_become(&clusters, "edge", json!(0), &[("replica-a", 0)]).await;
        held_a.store(2, Ordering::SeqCst);
        report.changed.notify_one();
        agents_become(&clusters, "edge", json!(2), &[("replica-a", 2)]).await;
        // A Direct cluster carries no agents: a leftover count (it was a Tunnel one) goes.
        write_status(&clusters, "direct", json!({"agents": 3})).await;
        agents_become(&clusters, "direct", json!(null), &[]).await;
    });
    // Stopped: its entry goes, and with it the count nobody reports any more.
    drop(source);
    runtime.block_on(agents_become(&clusters, "edge", json!(null), &[]));

    // Two replicas, heartbeats 200 ms apart: the count is the fewest either holds.
    let beat = Duration::from_millis(200);
    let (source_a, ..) = setup.watch_reporting(Some(replica("replica-a", &held_a, beat)));
    let held_b = Arc::new(AtomicUsize::new(1));
    let (source_b, ..) = setup.watch_reporting(Some(replica("replica-b", &held_b, beat)));
    runtime.block_on(async {
        agents_become(
            &clusters,
            "edge",
            json!(1),
            &[("replica-a", 2), ("replica-b", 1)],
        )
        .await;
        // A replica gone without saying: its heartbeat never changes. It is removed after three
        // heartbeat periods, and the count is the live replicas' again.
        let gone = json!({"agents": 0, "heartbeat": "2026-01-01T00:00:00.000000Z"});
        write_status(
            &clusters,
            "edge",
            json!({"tunnels": {"replica-gone": gone}}),
        )
        .await;
        agents_become(
            &clusters,
            "edge",
            json!(1),
            &[("replica-a", 2), ("replica-b", 1)],
        )
        .await;
    });
    // replica-b stops: replica-a's count is the cluster's.
    drop(source_b);
    runtime.block_on(agents_become(
        &clusters,
        "edge",
        json!(2),
        &[("replica-a", 2)],
    ));
    drop(source_a);
    runtime.block_on(agents_become(&clusters, "edge", json!(null), &[]));

    // Two processes under one name (two on one host without --replica-name): they do not
    // rewrite each other's count at once, forever; each writes once a heartbeat (5 times a
    // second here), so a second holds a few writes, not hundreds.
    let (twin_1, ..) = setup.watch_reporting(Some(replica("twin", &held_a, beat)));
    let (twin_2, ..) = setup.watch_reporting(Some(replica("twin", &held_b, beat)));
    runtime.block_on(async {
        let edge = || async { clusters.get("edge").await.unwrap() };
        let start = Instant::now();
        while !edge().await.data["status"]["tunnels"]["twin"].is_object() {
            assert!(start.elapsed() < Duration::from_secs(5), "no twin entry");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let version = |edge: DynamicObject| -> u64 {
            edge.metadata.resource_version.unwrap().parse().unwrap()
        };
        let before = version(edge().await);
        // A window to count writes in, not a wait for readiness.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let writes = version(edge().await) - before;
        assert!(writes < 40, "{writes} writes in a second");
    });
    drop(twin_1);
    setup.shutdown(twin_2);
}

/// A member's circuit breaker, as the gateway reports it (`circuits`), is its Cluster's
/// `CircuitOpen` condition, written beside the `Ready` one (which stays).
#[test]
fn a_cluster_says_when_the_circuit_breaker_of_its_member_is_open() {
    let setup = ManagementFleet::start();
    let (server, ca, token) = setup.member2();
    let (runtime, management) = (&setup.runtime, &setup.management);
    let clusters = management.clusters();
    runtime
        .block_on(management.create(&clusters, fleetgate_cluster("flaky", &server, &ca, &token)));
    let (source, ..) = setup.watch();
    let circuits = fleetgate_config_watcher::circuits::open_circuits();
    runtime.block_on(async {
        ready_condition(&clusters, "flaky", "True").await;
        let why = "5 consecutive connect failures, the last: connection refused";
        circuits.set("flaky", Some(why.into()));
        let open = condition(&clusters, "flaky", "CircuitOpen", "True").await;
        assert_eq!(
            (&open["reason"], &open["message"]),
            (&json!("ConnectFailures"), &json!(why))
        );
        ready_condition(&clusters, "flaky", "True").await;
        circuits.set("flaky", None);
        let closed = condition(&clusters, "flaky", "CircuitOpen", "False").await;
        assert_eq!(closed["reason"], "Connected");
        ready_condition(&clusters, "flaky", "True").await;
    });
    setup.shutdown(source);
}
