//! The CustomResourceDefinitions of fleetgate's objects, generated from the same Rust types the
//! loader parses (kube's `CustomResource` derive on `ClusterSpec` and `GatewaySpec`, JSON Schema
//! by schemars), so the manifests in `deploy/base/crds.yaml` cannot drift from what fleetgate accepts.
//! A test compares the committed file with [`crd_manifests`]; regenerate it with
//! `cargo run -p fleetgate-config-watcher --example crds > deploy/base/crds.yaml`.
//!
//! Only builds values; never talks to a cluster.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition,
};
use kube::core::CustomResourceExt;

pub use crate::objects::{ClusterStatus, ObjectStatus, ReplicaTunnels, StatusCondition};

fn column(
    name: &str,
    type_: &str,
    json_path: &str,
    priority: Option<i32>,
    description: Option<&str>,
) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        name: name.to_owned(),
        type_: type_.to_owned(),
        json_path: json_path.to_owned(),
        priority,
        description: description.map(str::to_owned),
        format: None,
    }
}

/// A Cluster's AGENTS column: `status.agents`, which only `Tunnel` clusters carry (a `Direct`
/// cluster's cell stays empty). The per-replica detail (`status.tunnels`) has no column: the
/// API server's table convertor prints only a JSONPath's first result, so a column could show
/// one replica's count, or the whole map as a line of JSON.
fn agents_column() -> CustomResourceColumnDefinition {
    column(
        "Agents",
        "integer",
        ".status.agents",
        None,
        Some("Pull-mode agents connected: the fewest any live gateway replica holds"),
    )
}

/// The columns `kubectl get` prints, after a kind's own (a Cluster's server and connect mode), for
/// the kinds whose objects the API source gives a `Ready` condition (Cluster, AccessPolicy,
/// FleetResource; not Gateway): whether the gateway serves the object as written, the kind's
/// `extra` columns (a Cluster's AGENTS), why not (`-o wide`), and its age. Giving any column
/// replaces the API server's default AGE, hence AGE.
fn with_status_columns(
    mut crd: CustomResourceDefinition,
    extra: &[CustomResourceColumnDefinition],
) -> CustomResourceDefinition {
    let ready = r#".status.conditions[?(@.type=="Ready")]"#;
    for version in &mut crd.spec.versions {
        let columns = version
            .additional_printer_columns
            .get_or_insert_with(Vec::new);
        columns.push(column(
            "Ready",
            "string",
            &format!("{ready}.status"),
            None,
            Some("True when the gateway serves the object as written"),
        ));
        columns.extend_from_slice(extra);
        columns.extend([
            column(
                "Reason",
                "string",
                &format!("{ready}.message"),
                Some(1),
                Some("Why the gateway refused the object"),
            ),
            column("Age", "date", ".metadata.creationTimestamp", None, None),
        ]);
    }
    crd
}

/// Every fleetgate CRD as one YAML stream (`---` between documents), in a fixed order.
pub fn crd_manifests() -> String {
    let crds = [
        with_status_columns(crate::objects::Cluster::crd(), &[agents_column()]),
        crate::objects::Gateway::crd(),
        with_status_columns(crate::objects::AccessPolicy::crd(), &[]),
        with_status_columns(crate::objects::FleetResource::crd(), &[]),
    ];
    let mut out = String::from(
        "# Generated from the Rust types by `cargo run -p fleetgate-config-watcher --example crds`.\n# Do not edit: config-watcher/tests/crds.rs fails when this file is out of date.\n",
    );
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd).expect("a CRD serializes"));
    }
    out
}
