//! The configuration objects as they are written in YAML (and, later, stored as CRDs):
//! `fleetgate.io/v1alpha1` Gateway, Cluster and AccessPolicy. Field names follow Kubernetes
//! conventions (camelCase). These types are only the wire shape; `settings` and `table` turn them
//! into what the data path uses. Unknown fields are rejected so a typo is an error, not a silent
//! default.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::crd::{preserve_unknown_fields, ObjectStatus};

/// The API version every fleetgate object carries.
pub const API_VERSION: &str = "fleetgate.io/v1alpha1";

/// The part of Kubernetes object metadata that fleetgate reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
}

/// PEM material given inline (`...Data`) or as a path (`...File`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PemSource {
    pub data: Option<String>,
    pub file: Option<String>,
}

/// `kind: Gateway`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GatewaySpec,
}

/// How the gateway listens and limits its clients: listeners, serving TLS, admin listener,
/// limits, authentication. (Also the `gateways.fleetgate.io` CRD schema; the derive generates
/// the `Gateway` root type.)
#[derive(CustomResource, JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "fleetgate.io",
    version = "v1alpha1",
    kind = "Gateway",
    plural = "gateways",
    status = "ObjectStatus",
    doc = "fleetgate's listeners, TLS, admin listener, limits and authentication settings"
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewaySpec {
    /// Shards (threads); 0 or absent: one per core.
    #[serde(default)]
    pub workers: usize,
    #[serde(default)]
    pub listeners: Vec<ListenerSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayTlsSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<AdminSpec>,
    #[serde(default)]
    pub routing: RoutingSpec,
    #[serde(default)]
    pub limits: LimitsSpec,
    /// Authentication settings (token file, OIDC); read by the identity layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_fields")]
    pub auth: Option<serde_json::Value>,
}

#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerSpec {
    #[serde(default)]
    pub name: String,
    pub address: String,
    /// TLS on this listener (default true). Plaintext exists for benchmarks only.
    #[serde(default = "default_true")]
    pub tls: bool,
}

#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayTlsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_data: Option<String>,
    #[serde(rename = "clientCAFile")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<String>,
    #[serde(rename = "clientCAData")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca_data: Option<String>,
}

#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdminSpec {
    pub address: String,
}

#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutingSpec {
    /// Also serve `/{cluster}/...` (OCM cluster-proxy user-server style).
    #[serde(default)]
    pub ocm_style: bool,
}

#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitsSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_head_bytes: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_headers: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_seconds: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_head_timeout_seconds: Option<f64>,
}

/// `kind: Cluster`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ClusterSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// How the gateway reaches one member cluster: its API server, CA, credentials, impersonation,
/// connect mode and egress proxy. (Also the `clusters.fleetgate.io` CRD schema; the derive
/// generates the `Cluster` root type.)
#[derive(CustomResource, JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "fleetgate.io",
    version = "v1alpha1",
    kind = "Cluster",
    plural = "clusters",
    status = "ObjectStatus",
    doc = "A member cluster fleetgate routes to: its API server, CA, credentials and connect mode",
    printcolumn = r#"{"name":"Server","type":"string","jsonPath":".spec.server"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(default, rename = "insecureSkipTLSVerify")]
    pub insecure_skip_tls_verify: bool,
    #[serde(default)]
    pub credentials: ClusterCredentials,
    /// Impersonate the gateway's user on the member (default true).
    #[serde(default = "default_true")]
    pub impersonation: bool,
    #[serde(default)]
    pub mode: ConnectMode,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "proxyURL")]
    pub proxy_url: Option<String>,
    /// Headers sent to the egress proxy on CONNECT.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub proxy_header: BTreeMap<String, String>,
}

#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterCredentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_file: Option<String>,
}

/// How the gateway reaches a member.
#[derive(JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConnectMode {
    /// The gateway dials the member's server URL.
    #[default]
    Direct,
    /// The member's agent dials the gateway (pull mode); requests ride that tunnel.
    Tunnel,
}

/// `kind: AccessPolicy`. Kept as raw JSON until the identity layer compiles it; the loader only
/// checks that it is an object with a name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccessPolicyObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: serde_json::Value,
}

fn default_true() -> bool {
    true
}
