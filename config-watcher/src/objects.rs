//! The configuration objects as they are written in YAML (and, later, stored as CRDs):
//! `fleetgate.io/v1alpha1` Gateway, Cluster, AccessPolicy and FleetResource. Field names follow Kubernetes
//! conventions (camelCase). These types are only the wire shape; `settings` and `table` turn them
//! into what the data path uses. Unknown fields are rejected so a typo is an error, not a silent
//! default.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// h2 settings for client connections.
    #[serde(default)]
    pub http2: Http2Spec,
    /// How the fleet view (`/fleet`) reads the members.
    #[serde(default)]
    pub fleet: FleetSpec,
    /// Watches shared at the edge: one member watch per resource and scope feeds every client
    /// watch of it (docs/watches.md). Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_watches: Option<SharedWatchesSpec>,
    /// Lists served from memory (docs/cache.md): the members' objects of these resources kept
    /// by the shared watches, as bytes. Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    /// Authentication (client certificates, token file, OIDC) and authorization mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,
    /// The audit log (`audit.k8s.io/v1` Event JSON lines); off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditSpec>,
    /// The access log: one line per request (user, verb, path, cluster, code, duration, auditID)
    /// in the gateway's own log at info, target `fleetgate::access`. Off when absent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub access_log: bool,
    /// Fair shares of the members and the gateway between users: concurrent requests, a request
    /// rate, open watches per user and per cluster, connections per client address
    /// (docs/fairness.md). Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness: Option<FairnessSpec>,
    /// A circuit breaker per member: consecutive connect failures open it, and requests to that
    /// member then fail at once with a 503 until a probe connects again (docs/faults.md). On,
    /// with its defaults, when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerSpec>,
}

/// `spec.circuitBreaker` of the Gateway. Only connect-level failures count (refused, timed out,
/// a failed TLS handshake, an egress proxy or agent that could not reach the member): an answer,
/// any code, slow or not, never does.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CircuitBreakerSpec {
    /// Consecutive connect failures to one member that open its breaker (default 5; 0 turns
    /// the breakers off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// How long an opened breaker answers 503 before it lets one probe connect through
    /// (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_seconds: Option<f64>,
    /// The longest open period: each failed probe doubles it, up to this (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_open_seconds: Option<f64>,
}

/// `spec.fairness` of the Gateway: what one user, one cluster and one client address may hold.
/// Each limit left out is no limit.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FairnessSpec {
    /// What each authenticated user may hold, over every cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_user: Option<FairShareSpec>,
    /// What all users together may hold on each member cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_cluster: Option<FairShareSpec>,
    /// Client connections one client address may have open at once; a connection over it is
    /// closed as soon as it is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_address_connections: Option<u32>,
    /// Per-user overrides of `perUser`, by user name: the fields given replace `perUser`'s.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub users: BTreeMap<String, FairShareSpec>,
}

/// One fair share: each field left out is no limit.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FairShareSpec {
    /// Ordinary (not long-running) requests in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<u32>,
    /// Requests per second, long-running ones included (a token bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// Requests the token bucket holds (default: the rate, rounded up); needs `rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Long-running requests open at once: watches, `logs -f`, exec, attach, port-forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watches: Option<u32>,
}

/// `spec.audit` of the Gateway: where audit events go.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditSpec {
    /// The file events are appended to (created 0600), relative to the file that names it.
    pub path: String,
    /// Events that may wait for the writer (default 8192); beyond that they are dropped and
    /// counted, never waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<usize>,
}

/// `spec.auth` of the Gateway: how clients prove who they are and whether AccessPolicy objects
/// decide what they may do. Client certificates (against `spec.tls.clientCA*`) are always
/// accepted; the methods here are added to them.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthSpec {
    /// Static bearer tokens in kube-apiserver's `--token-auth-file` CSV format
    /// (`token,user,uid,"group1,group2"`), relative to the file that names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// OpenID Connect ID tokens (JWTs) as bearer tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oidc: Option<OidcSpec>,
    /// `AccessPolicy` (default): deny unless a policy grants. `AlwaysAllow`: every authenticated
    /// request is allowed (benchmarks only; logged as a warning).
    #[serde(default)]
    pub authorization_mode: AuthorizationMode,
}

/// Whether AccessPolicy objects are enforced.
#[derive(JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthorizationMode {
    #[default]
    AccessPolicy,
    AlwaysAllow,
}

/// `spec.auth.oidc`: an OIDC issuer whose ID tokens the gateway accepts (the same knobs as
/// kube-apiserver's `--oidc-*` flags).
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OidcSpec {
    /// Must equal the token's `iss` claim.
    #[serde(rename = "issuerURL")]
    pub issuer_url: String,
    /// The client id: the token's `aud` must contain it (or one of `audiences`).
    #[serde(default, rename = "clientID", skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audiences: Vec<String>,
    /// A JWKS document (`{"keys": [...]}`) on disk, relative to the file that names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<String>,
    /// A JWKS document fetched (and refreshed) off the hot path.
    #[serde(default, rename = "jwksURL", skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// The CA that signs the `jwksURL` server's certificate (https), as a path or inline PEM.
    #[serde(default, rename = "caFile", skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    #[serde(default, rename = "caData", skip_serializing_if = "Option::is_none")]
    pub ca_data: Option<String>,
    /// How often `jwksURL` is fetched again (default 300 seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_refresh_seconds: Option<u64>,
    /// The claim naming the user (default `sub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username_prefix: Option<String>,
    /// A claim holding a string or an array of strings: the user's groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups_claim: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups_prefix: Option<String>,
    /// A claim holding the user's uid (sent as `Impersonate-Uid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid_claim: Option<String>,
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
    /// How long an HTTP/1.1 keep-alive connection may wait for its next request (0: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<f64>,
    /// How long in-flight requests may run after SIGINT/SIGTERM before they are cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_seconds: Option<f64>,
    /// How long a client may leave an ordinary (not long-running) response unread before it is
    /// cut (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_write_timeout_seconds: Option<f64>,
    /// Member connections the requests of one client address may hold at once, over the whole
    /// gateway (default 4096); more get a 429 Status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_member_connections_per_client: Option<usize>,
}

/// h2 settings for client connections (`spec.http2`); a change applies to new connections.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Http2Spec {
    /// Streams one client connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<u32>,
    /// A connection without an open stream for this long gets GOAWAY and is closed (0: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<f64>,
}

/// `spec.fleet` of the Gateway: how the fleet view reads the members.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetSpec {
    /// Objects asked of a member per page of a fleet LIST (default 500): with one object per
    /// member probed, what the gateway holds for one LIST however large the fleet is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<u32>,
    /// Members asked at the same time by one request (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members_at_once: Option<u32>,
    /// The cluster a CREATE of a merged kind through the fleet view goes to (Karmada's "create
    /// goes to the control plane"), for users who may reach it there; absent: such a create is
    /// refused (405).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_in: Option<String>,
}

/// `spec.sharedWatches` of the Gateway: which resources' watches are shared, and the bounds of
/// each shared watch.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharedWatchesSpec {
    /// The resources whose watches are shared (at least one).
    pub resources: Vec<SharedResourceSpec>,
    /// Events each shared watch keeps for clients that resume from a resourceVersion
    /// (default 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_size: Option<u32>,
    /// How many events a client may fall behind before it is cut with 410 Gone (default: a
    /// quarter of the ring; at most the ring size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_limit: Option<u32>,
    /// Where a member watch is shared: `Shard` (default: one per key on each shard) or
    /// `Gateway` (one per key for the whole gateway, fed to the other shards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<SharedWatchScope>,
}

/// `spec.sharedWatches.scope`.
#[derive(JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharedWatchScope {
    /// One member watch per key on each shard; a shard's clients read its own.
    #[default]
    Shard,
    /// One member watch per key for the gateway, on one shard (the key's home); the other
    /// shards' hubs are fed its events.
    Gateway,
}

/// One resource of `spec.sharedWatches.resources`.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharedResourceSpec {
    /// The API group (`""` for the core group).
    #[serde(default)]
    pub group: String,
    pub version: String,
    /// The plural resource name (`pods`).
    pub resource: String,
}

/// `spec.cache` of the Gateway: which resources' LISTs are served from memory, and how much
/// memory that may take.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CacheSpec {
    /// The cached resources (at least one); each is also shared for watches.
    pub resources: Vec<CachedResourceSpec>,
    /// The memory all cached objects of the gateway may take, as a Kubernetes quantity
    /// (`512Mi`, `2Gi`; default `1Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget: Option<String>,
    /// The most objects one resource of one member may hold in the cache (default 1,000,000);
    /// a resource that outgrows it is served by the member again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_objects_per_resource: Option<u32>,
}

/// One resource of `spec.cache.resources`.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CachedResourceSpec {
    /// The API group (`""` for the core group).
    #[serde(default)]
    pub group: String,
    pub version: String,
    /// The plural resource name (`pods`).
    pub resource: String,
    /// This resource's own limit of objects per member (default: `maxObjectsPerResource`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_objects: Option<u32>,
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
    status = "ClusterStatus",
    doc = "A member cluster fleetgate routes to: its API server, CA, credentials and connect mode",
    printcolumn = r#"{"name":"Server","type":"string","jsonPath":".spec.server"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.connectMode"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// The member's API server URL; empty for a `Tunnel` cluster, which has no address the
    /// gateway could dial (its agent dials out instead).
    #[serde(default, skip_serializing_if = "String::is_empty")]
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
    /// `Impersonate` (default): the gateway authenticates with `credentials` and impersonates
    /// the client. `PassThrough`: the client's own bearer token goes to the member (OCM style).
    #[serde(default)]
    pub auth_mode: ClusterAuthMode,
    /// `Direct` (default) or `Tunnel` (pull mode). Files may still say `mode` (the field's
    /// earlier name); a management cluster prunes it, as the schema names only `connectMode`.
    #[serde(default, alias = "mode")]
    pub connect_mode: ConnectMode,
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "proxyURL")]
    pub proxy_url: Option<String>,
    /// Headers sent to the egress proxy on CONNECT.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub proxy_header: BTreeMap<String, String>,
    /// How a `Tunnel` cluster's agent reaches its member, for agents that only dial TCP
    /// (konnectivity proxy-agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<ClusterTunnel>,
}

/// `spec.tunnel` of a `Tunnel` cluster.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterTunnel {
    /// `host:port` of the member's API server as its agent sees it, which a konnectivity
    /// proxy-agent dials for the gateway (default `kubernetes.default.svc:443`); the gateway
    /// runs TLS to it with `caData` and the credentials. `fleetgate agent` ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
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
    /// A `v1` Secret holding the credentials under the keys Kubernetes uses: `token`, `ca.crt`,
    /// `tls.crt` and `tls.key` (instead of the fields above). Read from the config files'
    /// Secrets, or watched in the management cluster (a rotated Secret rebuilds the table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretReference>,
}

/// A reference to a `v1` Secret; `namespace` defaults to the namespace the kube source reads
/// Secrets in (`--secrets-namespace`), or `default` in files.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretReference {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
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

/// Who speaks to a member: the gateway (impersonating the client) or the client itself.
#[derive(JsonSchema, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterAuthMode {
    #[default]
    Impersonate,
    PassThrough,
}

/// `kind: AccessPolicy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessPolicyObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: AccessPolicySpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    /// Where it was read (the file, or `api:accesspolicies.fleetgate.io/NAME`), so that an error
    /// compiling it names the place to fix; not part of the object.
    #[serde(skip)]
    pub origin: String,
}

/// Who (users, groups) may reach which clusters (names, label selector) with which verbs,
/// optionally narrowed to resources and namespaces. Policies only grant; anything no policy
/// grants is denied. (Also the `accesspolicies.fleetgate.io` CRD schema.)
#[derive(CustomResource, JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "fleetgate.io",
    version = "v1alpha1",
    kind = "AccessPolicy",
    plural = "accesspolicies",
    status = "ObjectStatus",
    doc = "Who (users, groups) may reach which clusters with which verbs, resources and namespaces"
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessPolicySpec {
    pub subjects: Vec<PolicySubject>,
    pub clusters: PolicyClusters,
    pub rules: Vec<PolicyRule>,
}

/// A user or a group, by name (as authentication names them).
#[derive(JsonSchema, Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySubject {
    pub kind: SubjectKind,
    pub name: String,
}

#[derive(JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SubjectKind {
    User,
    Group,
}

/// The clusters a policy covers: those named, plus those its selector matches (`names: ["*"]`
/// is every cluster).
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyClusters {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// A Kubernetes label selector.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// `{key, operator: In|NotIn|Exists|DoesNotExist, values}`.
#[derive(JsonSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// `kind: FleetResource`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetResourceObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: FleetResourceSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// Kinds the fleet view (`/fleet`) merges across clusters, and the clusters it merges them from
/// (absent: every cluster). (Also the `fleetresources.fleetgate.io` CRD schema.)
#[derive(CustomResource, JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "fleetgate.io",
    version = "v1alpha1",
    kind = "FleetResource",
    plural = "fleetresources",
    status = "ObjectStatus",
    doc = "Kinds the fleet view merges across clusters, and from which clusters"
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetResourceSpec {
    pub resource_selectors: Vec<ResourceSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<PolicyClusters>,
}

/// One merged kind: `{apiVersion: v1, kind: Pod}`; `resource` where kube's plural guess from the
/// kind is wrong (`Endpoints`: `endpoints`).
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceSelector {
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

/// Verbs granted on the covered clusters, optionally narrowed. Verbs: get list watch create
/// update patch delete deletecollection exec attach portforward proxy impersonate, or `*`.
/// `resources`: `pods`, `deployments.apps`, `pods/log`, `*` (absent: all); for `impersonate`
/// they are `users`, `groups`, `uids`, `userextras/KEY`. `namespaces` (absent: all, including
/// cluster-scoped resources). `resourceNames` narrows `impersonate` to those identities.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyRule {
    pub verbs: Vec<String>,
    /// Non-resource paths this rule grants (exact, or a prefix ending in `*`; `*` for every path),
    /// as kube RBAC's: a rule has either these or `resources`.
    #[serde(
        default,
        rename = "nonResourceURLs",
        skip_serializing_if = "Option::is_none"
    )]
    pub non_resource_urls: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_names: Option<Vec<String>>,
}

fn default_true() -> bool {
    true
}

/// The status every fleetgate object carries: whether the gateway accepted it.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<StatusCondition>,
}

/// A Cluster's status: its `Ready` condition (and `CircuitOpen` once the gateway's circuit
/// breaker of its member opened: docs/faults.md), and for a `Tunnel` (pull-mode) cluster how many
/// of its agents the gateway replicas hold (written by each replica's API source;
/// docs/pull-mode.md).
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<StatusCondition>,
    /// The fewest agents any live gateway replica holds for this cluster: what a request landing
    /// on any replica can count on (0: some replica answers 503 for it). `Tunnel` clusters only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<u32>,
    /// Each gateway replica's own report, by replica name (each replica writes only its own
    /// entry; one not refreshed for three heartbeat periods is removed). `Tunnel` clusters only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tunnels: BTreeMap<String, ReplicaTunnels>,
}

/// One gateway replica's report in a `Tunnel` cluster's `status.tunnels`.
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaTunnels {
    /// The cluster's agents whose tunnel this replica holds.
    pub agents: u32,
    /// When the replica last wrote this entry (RFC 3339, UTC).
    pub heartbeat: String,
}

/// A Kubernetes-style condition (`Ready`: `True` when the object is served, `False` with the
/// validation message when it was rejected).
#[derive(JsonSchema, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
