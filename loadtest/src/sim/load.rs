//! What a member holds before the first request, and the write load it generates by itself:
//! the seed objects (system namespaces, `dev`, a few Ready nodes, one Running pod), the
//! `--objects K` ConfigMaps (~1 KiB each, spread over `load-0`..`load-9`), the
//! `--pods-per-member N` Running pods (the same namespaces), and the `--churn E`
//! task that updates E objects per second, each update stamped with the annotation
//! `fleetgate.io/sent-at` (unix nanoseconds) so the loadtest can measure event latency.
//!
//! Writes through `Store::mutate` like any client would. Called by `sim::start_fleet`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::sim::member::Member;
use crate::sim::objects::{node_status, now_rfc3339};
use crate::sim::store::{self, Mutation};

/// The annotation each churn update carries.
pub const SENT_AT_ANNOTATION: &str = "fleetgate.io/sent-at";
/// Namespaces of the `--objects` ConfigMaps.
pub const LOAD_NAMESPACES: usize = 10;

pub(crate) fn put(member: &Member, plural: &'static str, object: Value) {
    let ns = store::meta_str(&object, "namespace");
    let name = store::meta_str(&object, "name");
    let _ = member
        .store
        .mutate::<()>(plural, &ns, &name, |_| Ok(Mutation::Put(object)));
}

/// Creates what kube-controller-manager adds to every namespace: ConfigMap `kube-root-ca.crt`
/// (benchmarks GET it as a typical small object) and ServiceAccount `default`.
pub fn publish_root_ca(member: &Member, ns: &str) {
    // The token controller's `default` service account comes with every namespace too.
    put(
        member,
        "serviceaccounts",
        json!({
            "kind": "ServiceAccount", "apiVersion": "v1",
            "metadata": {"name": "default", "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(),
                         "creationTimestamp": now_rfc3339()},
        }),
    );
    put(
        member,
        "configmaps",
        json!({
            "kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"name": "kube-root-ca.crt", "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(),
                         "creationTimestamp": now_rfc3339(),
                         "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
            "data": {"ca.crt": member.root_ca_pem},
        }),
    );
}

pub(crate) fn namespace(name: &str) -> Value {
    json!({
        "kind": "Namespace", "apiVersion": "v1",
        "metadata": {"name": name, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now_rfc3339(),
                     "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// The name of the K-th load ConfigMap and its namespace.
pub fn load_object_key(index: usize) -> (String, String) {
    (
        format!("load-{}", index % LOAD_NAMESPACES),
        format!("load-cm-{index}"),
    )
}

/// Seeds `member` with the system objects and `objects` load ConfigMaps.
pub fn seed(member: &Member, objects: usize) {
    let now = now_rfc3339();
    let namespaces: Vec<String> = ["default", "kube-system", "kube-public", "dev"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for ns in &namespaces {
        put(member, "namespaces", namespace(ns));
        publish_root_ca(member, ns);
    }
    load_namespaces(member, objects);
    for (i, node) in member.node_names.iter().enumerate() {
        put(
            member,
            "nodes",
            json!({
                "kind": "Node", "apiVersion": "v1",
                "metadata": {"name": node, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now,
                             "labels": {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux", "fleetgate.io/member": member.name}},
                "spec": {"podCIDR": format!("10.244.{i}.0/24")},
                "status": node_status(&now, &format!("10.0.0.{}", i + 10)),
            }),
        );
    }
    put(
        member,
        "services",
        json!({
            "kind": "Service", "apiVersion": "v1",
            "metadata": {"name": "kubernetes", "namespace": "default", "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now,
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"],
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}], "sessionAffinity": "None"},
            "status": {"loadBalancer": {}},
        }),
    );
    let node = member.node_names.first().cloned().unwrap_or_default();
    put(
        member,
        "pods",
        running_pod(
            "default",
            "hello",
            json!({"app": "hello"}),
            &node,
            "10.244.0.2",
            &now,
        ),
    );
    let payload = "x".repeat(1000);
    for i in 0..objects {
        let (ns, name) = load_object_key(i);
        put(
            member,
            "configmaps",
            json!({
                "kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now,
                             "labels": {"fleetgate.io/load": "true"}},
                "data": {"payload": payload},
            }),
        );
    }
    member.store.compact_history();
}

/// Creates the namespaces `load-0` .. that `objects` load objects spread over (at most
/// [`LOAD_NAMESPACES`]), those not there yet.
fn load_namespaces(member: &Member, objects: usize) {
    for i in 0..LOAD_NAMESPACES.min(objects) {
        let ns = format!("load-{i}");
        if member.store.get("namespaces", "", &ns).is_none() {
            put(member, "namespaces", namespace(&ns));
            publish_root_ca(member, &ns);
        }
    }
}

/// A pod as the sim's kubelet leaves it: scheduled on `node`, Running, its container `main`
/// ready (about 870 bytes of compact JSON).
fn running_pod(ns: &str, name: &str, labels: Value, node: &str, ip: &str, now: &str) -> Value {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now,
                     "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox:1.37", "command": ["sleep", "infinity"]}],
                 "restartPolicy": "Always"},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.0.0.10", "startTime": now,
                   "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
                   "containerStatuses": [{"name": "main", "ready": true, "started": true, "restartCount": 0, "image": "busybox:1.37",
                                          "imageID": "sim://busybox:1.37", "containerID": format!("containerd://{name}"),
                                          "state": {"running": {"startedAt": now}}}],
                   "qosClass": "BestEffort"},
    })
}

/// The name of the K-th load pod and its namespace.
pub fn load_pod_key(index: usize) -> (String, String) {
    (
        format!("load-{}", index % LOAD_NAMESPACES),
        format!("load-pod-{index}"),
    )
}

/// Seeds `member` with `pods` Running load pods (`load-pod-0` ..., label
/// `fleetgate.io/load=true`) spread over namespaces `load-0`..`load-9` and round robin over its
/// nodes: the objects of the `fleet-list` benchmark (`sim --pods-per-member N`). Written
/// straight into the store, without the scheduler's events a created pod gets.
pub fn seed_pods(member: &Member, pods: usize) {
    load_namespaces(member, pods);
    let now = now_rfc3339();
    for i in 0..pods {
        let (ns, name) = load_pod_key(i);
        let node = member
            .node_names
            .get(i % member.node_names.len().max(1))
            .map_or("", String::as_str);
        // 10.244.0.2 is hello's; load pods count from 10.244.1.0 (65,280 distinct addresses,
        // then they repeat: nothing checks pod IPs for uniqueness).
        let n = 256 + i % (65_536 - 256);
        let ip = format!("10.244.{}.{}", n >> 8, n & 0xff);
        put(
            member,
            "pods",
            running_pod(
                &ns,
                &name,
                json!({"fleetgate.io/load": "true", "app": format!("load-{}", i % 10)}),
                node,
                &ip,
                &now,
            ),
        );
    }
    member.store.compact_history();
}

fn unix_nanos() -> String {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .to_string()
}

/// Updates `per_second` objects per second on `member` until the task is aborted. With no load
/// objects, it churns a single ConfigMap `churn` in `default`.
pub async fn churn(member: Arc<Member>, objects: usize, per_second: f64) {
    if per_second <= 0.0 {
        return;
    }
    // Ticks of at most 10 ms; each tick sends the updates that are due, so high rates stay exact.
    let tick = Duration::from_secs_f64((1.0 / per_second).max(0.01));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = tokio::time::Instant::now();
    let mut sent: u64 = 0;
    let mut index = 0usize;
    loop {
        ticker.tick().await;
        let due = (started.elapsed().as_secs_f64() * per_second) as u64;
        while sent < due {
            let (ns, name) = if objects > 0 {
                load_object_key(index % objects)
            } else {
                ("default".to_string(), "churn".to_string())
            };
            index += 1;
            sent += 1;
            let stamp = unix_nanos();
            let _ = member.store.mutate::<()>("configmaps", &ns, &name, |current| {
                let mut next = match current {
                    Some(c) => c.as_ref().clone(),
                    None => json!({
                        "kind": "ConfigMap", "apiVersion": "v1",
                        "metadata": {"name": name, "namespace": ns, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now_rfc3339()},
                        "data": {},
                    }),
                };
                next["metadata"]["annotations"][SENT_AT_ANNOTATION] = json!(stamp);
                Ok(Mutation::Put(next))
            });
        }
    }
}
