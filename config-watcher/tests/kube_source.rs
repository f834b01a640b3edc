//! The Kubernetes API source against the simulated fleet acting as the management cluster
//! (member1, reached as admin through the fleet's kubeconfig): fleetgate.io Clusters and Karmada
//! Clusters with their Secrets, created before and after the source starts, changed, rotated,
//! broken and deleted. The first table must hold everything that existed before the start (the
//! watcher's initial list, never a partial view); every later change must be published within a
//! deadline; a broken object keeps the last good table and is reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use base64::Engine;
use fleetgate_config_watcher::{
    load_path, watch_kube_api, KubeSourceOptions, ReloadStatus, RouteTable, SharedTable,
    TablePublisher,
};
use fleetgate_loadtest::sim::{start_fleet, FleetOptions};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
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
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls the object's `Ready` condition until it has `status`; returns the condition.
async fn ready_condition(management: &Management, name: &str, status: &str) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let object = management.clusters().get(name).await.unwrap();
        let condition = object.data["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
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
            "{name}: no Ready={status} condition: {}",
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

#[test]
fn clusters_and_karmada_clusters_follow_the_management_cluster() {
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
    let member2: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(fleet_dir.path().join("clusters/member2.yaml")).unwrap(),
    )
    .unwrap();
    let server = member2["spec"]["server"].as_str().unwrap().to_owned();
    let ca = member2["spec"]["caData"].as_str().unwrap().to_owned();
    let token = member2["spec"]["credentials"]["token"]
        .as_str()
        .unwrap()
        .to_owned();

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
        client: runtime.block_on(async { kube::Client::try_from(kube_config.clone()).unwrap() }),
    };

    // Before the source starts: the Karmada CRD, its namespace, a Secret, a Karmada Cluster and a
    // fleetgate Cluster.
    runtime.block_on(async {
        let crds = management.api(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        );
        management
            .create(
                &crds,
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

    let local = tempfile::tempdir().unwrap();
    std::fs::write(local.path().join("gateway.yaml"), GATEWAY).unwrap();
    let local = load_path(local.path()).unwrap();
    let table: SharedTable = Arc::new(ArcSwap::from_pointee(RouteTable::build(&local).unwrap()));
    let status = ReloadStatus::new();
    let _source = watch_kube_api(
        kube_config,
        KubeSourceOptions {
            fleetgate: true,
            karmada: true,
            secrets_namespace: Some("karmada-cluster".into()),
            fallback_gateway: Some(local.gateway.clone()),
        },
        TablePublisher::new(table.clone(), status.clone()),
    )
    .unwrap();

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
        eventually("the broken object reported", || {
            status.last_error().is_some()
        })
        .await;
        let failure = status.last_error().unwrap().message;
        assert!(
            failure.contains("api:clusters.fleetgate.io/broken")
                && failure.contains("Cluster broken")
                && failure.contains("spec.server"),
            "{failure}"
        );
        assert_eq!(table.load().generation(), generation);
        assert_eq!(port(&table, "extra"), Some(2));
        // The objects say so in their status: the broken one why, the served ones that they are.
        let broken = ready_condition(&management, "broken", "False").await;
        assert_eq!(broken["reason"], "Invalid");
        assert!(
            broken["message"].as_str().unwrap().contains("spec.server"),
            "{broken}"
        );
        let served = ready_condition(&management, "fg-member2", "True").await;
        assert_eq!(served["reason"], "Served");
        management.delete(&management.clusters(), "broken").await;
        eventually("the error cleared", || status.last_error().is_none()).await;

        // An object from the API may not make the gateway read a local file.
        let mut with_file = fleetgate_cluster("with-file", "https://127.0.0.1:3", &ca, "t");
        with_file["spec"]["credentials"] = json!({"tokenFile": "/etc/shadow"});
        management.create(&management.clusters(), with_file).await;
        eventually("the file reference refused", || {
            status.last_error().is_some()
        })
        .await;
        let failure = status.last_error().unwrap().message;
        assert!(
            failure.contains("spec.credentials.tokenFile") && failure.contains("local files"),
            "{failure}"
        );
        assert!(table.load().cluster("with-file").is_none());
        management.delete(&management.clusters(), "with-file").await;

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
    drop(_source);
    runtime.block_on(fleet.shutdown());
}
