//! The CustomResourceDefinitions of fleetgate's objects, generated from the same Rust types the
//! loader parses (kube's `CustomResource` derive on `ClusterSpec` and `GatewaySpec`, JSON Schema
//! by schemars), so the manifests in `deploy/base/crds.yaml` cannot drift from what fleetgate accepts.
//! A test compares the committed file with [`crd_manifests`]; regenerate it with
//! `cargo run -p fleetgate-config-watcher --example crds > deploy/base/crds.yaml`.
//!
//! Only builds values; never talks to a cluster.

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

/// Every fleetgate CRD as one YAML stream (`---` between documents), in a fixed order.
pub fn crd_manifests() -> String {
    let crds = [
        crate::objects::Cluster::crd(),
        crate::objects::Gateway::crd(),
        crate::objects::AccessPolicy::crd(),
        crate::objects::FleetResource::crd(),
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
