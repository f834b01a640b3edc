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
use schemars::{json_schema, Schema, SchemaGenerator};

/// The schema of a field that holds free-form JSON (kept as written, not pruned by the API
/// server).
pub fn preserve_unknown_fields(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

pub use crate::objects::{ObjectStatus, StatusCondition};

/// The columns `kubectl get` prints, after a kind's own (a Cluster's server and connect mode), for
/// the kinds whose objects the API source gives a `Ready` condition (Cluster, AccessPolicy,
/// FleetResource; not Gateway): whether the gateway serves the object as written, why not
/// (`-o wide`), and its age. Giving any column replaces the API server's default AGE, hence AGE.
fn with_status_columns(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let ready = r#".status.conditions[?(@.type=="Ready")]"#;
    let column =
        |name: &str, type_: &str, json_path: String, priority, description: Option<&str>| {
            CustomResourceColumnDefinition {
                name: name.to_owned(),
                type_: type_.to_owned(),
                json_path,
                priority,
                description: description.map(str::to_owned),
                format: None,
            }
        };
    for version in &mut crd.spec.versions {
        version
            .additional_printer_columns
            .get_or_insert_with(Vec::new)
            .extend([
                column(
                    "Ready",
                    "string",
                    format!("{ready}.status"),
                    None,
                    Some("True when the gateway serves the object as written"),
                ),
                column(
                    "Reason",
                    "string",
                    format!("{ready}.message"),
                    Some(1),
                    Some("Why the gateway refused the object"),
                ),
                column(
                    "Age",
                    "date",
                    ".metadata.creationTimestamp".to_owned(),
                    None,
                    None,
                ),
            ]);
    }
    crd
}

/// Every fleetgate CRD as one YAML stream (`---` between documents), in a fixed order.
pub fn crd_manifests() -> String {
    let crds = [
        with_status_columns(crate::objects::Cluster::crd()),
        crate::objects::Gateway::crd(),
        with_status_columns(crate::objects::AccessPolicy::crd()),
        with_status_columns(crate::objects::FleetResource::crd()),
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
