//! Resolved configuration: the objects with every file read and every default applied. This is what
//! a reload compares and what the routing table is built from; nothing here touches the network.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::auth::AuthSettings;
use crate::objects::{AccessPolicyObject, ConnectMode};

/// A whole configuration: one Gateway, any number of Clusters and AccessPolicies.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub gateway: GatewaySettings,
    pub clusters: Vec<ClusterConfig>,
    pub policies: Vec<AccessPolicyObject>,
    /// The kinds `/fleet` merges (FleetResource and Karmada ResourceRegistry objects), resolved
    /// against the clusters when the table is built.
    pub fleet: Vec<crate::fleet::FleetSource>,
}

/// The Gateway object, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewaySettings {
    pub name: String,
    /// Shards; 0 means one per core.
    pub workers: usize,
    pub listeners: Vec<ListenerSettings>,
    pub tls: Option<ServingTls>,
    pub admin: Option<String>,
    pub ocm_style: bool,
    pub limits: Limits,
    pub http2: Http2Settings,
    pub fleet: FleetSettings,
    /// `spec.sharedWatches`, resolved, with every cached resource among its resources; None:
    /// every watch is the client's own.
    pub shared_watches: Option<SharedWatchSettings>,
    /// `spec.cache`, resolved; None: every LIST goes to its member.
    pub cache: Option<CacheSettings>,
    /// The `spec.auth` block, resolved (token file read, OIDC defaulted).
    pub auth: AuthSettings,
    /// The audit log (`spec.audit`); None: off.
    pub audit: Option<AuditSettings>,
    /// The access log (`spec.accessLog`): read when the gateway starts.
    pub access_log: bool,
    /// `spec.fairness`, resolved (`fairness`); off (nothing limited) when absent.
    pub fairness: crate::fairness::FairnessSettings,
    /// The breaker of each member's connects (`spec.circuitBreaker`). Not in [`Limits`]: those
    /// are copied into every connection's state, and the breaker is read only when a connection
    /// is dialed.
    pub circuit_breaker: CircuitBreakerSettings,
}

/// `spec.audit`, resolved: an absolute (or working-directory relative) path and a queue size.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditSettings {
    pub path: std::path::PathBuf,
    pub queue: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerSettings {
    pub name: String,
    pub address: String,
    pub tls: bool,
}

/// Serving certificate, its key, and the CA that client certificates must chain to.
#[derive(Clone, PartialEq)]
pub struct ServingTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ServingTls {
    // Never print key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingTls")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .field("client_ca_pem", &self.client_ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

/// Limits that protect the gateway from clients and slow members.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub connect_timeout: Duration,
    pub response_head_timeout: Duration,
    /// How long an HTTP/1.1 keep-alive connection may wait for its next request; `None`: no limit.
    pub idle_timeout: Option<Duration>,
    /// How long in-flight requests may run after SIGINT/SIGTERM before the process exits anyway.
    pub shutdown_grace: Duration,
    /// How long a client may leave an ordinary (not long-running) response unread before it is
    /// cut and its member connection freed.
    pub client_write_timeout: Duration,
    /// Member connections the requests of one client address may hold at once (watches, logs,
    /// exec sessions and ordinary requests in flight), over the whole gateway.
    pub max_member_connections_per_client: usize,
}

/// `spec.circuitBreaker`, resolved and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreakerSettings {
    /// Consecutive connect failures that open a member's breaker; 0: never opened.
    pub consecutive_failures: u32,
    /// The first open period.
    pub open: Duration,
    /// The longest open period (each failed probe doubles it up to this).
    pub max_open: Duration,
}

impl CircuitBreakerSettings {
    /// The most consecutive failures a breaker may wait for.
    pub const MAX_FAILURES: u32 = 10_000;
    /// The longest open period allowed.
    pub const MAX_OPEN: Duration = Duration::from_secs(3600);
}

impl Default for CircuitBreakerSettings {
    /// Five connect failures in a row, with no connect succeeding between them: a healthy member
    /// that is only busy answers (slowly, or 429, or 5xx) and never trips it.
    fn default() -> Self {
        CircuitBreakerSettings {
            consecutive_failures: 5,
            open: Duration::from_secs(1),
            max_open: Duration::from_secs(60),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_head_bytes: 64 * 1024,
            max_headers: 128,
            connect_timeout: Duration::from_secs(5),
            response_head_timeout: Duration::from_secs(60),
            idle_timeout: Some(Duration::from_secs(300)),
            shutdown_grace: Duration::from_secs(30),
            client_write_timeout: Duration::from_secs(60),
            max_member_connections_per_client: 4096,
        }
    }
}

/// How the fleet view reads the members (`spec.fleet`, resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSettings {
    /// Objects asked of a member per page of a fleet LIST.
    pub page_size: usize,
    /// Members asked at the same time by one request.
    pub members_at_once: usize,
    /// The cluster a CREATE of a merged kind through the fleet view goes to (a valid cluster
    /// name; the cluster itself may come and go).
    pub create_in: Option<Arc<str>>,
}

impl FleetSettings {
    pub const MAX_PAGE_SIZE: u32 = 10_000;
    pub const MAX_MEMBERS_AT_ONCE: u32 = 256;
}

impl Default for FleetSettings {
    fn default() -> Self {
        FleetSettings {
            page_size: 500,
            members_at_once: 16,
            create_in: None,
        }
    }
}

/// `spec.sharedWatches`, resolved and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedWatchSettings {
    /// The shared resources: (group, version, plural resource).
    pub resources: Vec<(String, String, String)>,
    /// Events each shared watch keeps.
    pub ring_size: usize,
    /// Events a client may fall behind before it is cut.
    pub lag_limit: usize,
    /// Per shard or per gateway.
    pub scope: crate::objects::SharedWatchScope,
}

impl SharedWatchSettings {
    pub const DEFAULT_RING_SIZE: u32 = 4096;
    pub const MIN_RING_SIZE: u32 = 16;
    pub const MAX_RING_SIZE: u32 = 1 << 20;

    /// Whether watches of `resource` in `group` (at `version`) are shared.
    pub fn shares(&self, group: &str, version: &str, resource: &str) -> bool {
        self.resources
            .iter()
            .any(|(g, v, r)| g == group && v == version && r == resource)
    }
}

/// `spec.cache`, resolved and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheSettings {
    /// The cached resources: (group, version, plural resource) and the most objects each
    /// member's may hold.
    pub resources: Vec<((String, String, String), usize)>,
    /// Bytes all cached objects of the gateway may take.
    pub memory_budget: u64,
}

impl CacheSettings {
    pub const DEFAULT_MEMORY_BUDGET: u64 = 1 << 30;
    pub const DEFAULT_MAX_OBJECTS: u32 = 1_000_000;

    /// The most objects a member's `resource` in `group` (at `version`) may hold in the cache;
    /// None: it is not cached.
    pub fn caches(&self, group: &str, version: &str, resource: &str) -> Option<usize> {
        self.resources
            .iter()
            .find(|((g, v, r), _)| g == group && v == version && r == resource)
            .map(|(_, max)| *max)
    }
}

/// h2 settings for client connections (`spec.http2`, resolved).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Http2Settings {
    /// SETTINGS_MAX_CONCURRENT_STREAMS sent to every client.
    pub max_concurrent_streams: u32,
    /// A connection without an open stream for this long gets GOAWAY; `None`: never.
    pub idle_timeout: Option<Duration>,
}

impl Http2Settings {
    /// The most `maxConcurrentStreams` may be: beyond this a single client could hold more
    /// stream tasks than a shard should carry for one connection.
    pub const MAX_CONCURRENT_STREAMS_LIMIT: u32 = 100_000;
}

impl Default for Http2Settings {
    fn default() -> Self {
        Http2Settings {
            max_concurrent_streams: 1000,
            idle_timeout: Some(Duration::from_secs(300)),
        }
    }
}

/// A Cluster object, resolved (files read). Secrets are redacted from `Debug`.
#[derive(Clone, PartialEq)]
pub struct ClusterConfig {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Where the object came from, for error messages (a file path or `namespace/name`).
    pub origin: String,
    pub server: String,
    pub ca_pem: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
    pub token: Option<String>,
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
    pub impersonation: bool,
    /// `spec.authMode: PassThrough`: the client's bearer token goes to the member as it is.
    pub pass_through: bool,
    pub mode: ConnectMode,
    pub proxy_url: Option<String>,
    /// Headers sent to the egress proxy on CONNECT (Karmada's `proxyHeader`).
    pub proxy_headers: BTreeMap<String, String>,
    /// `spec.tunnel.address` (validated): where a konnectivity agent dials the member.
    pub tunnel_address: Option<String>,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("name", &self.name)
            .field("origin", &self.origin)
            .field("server", &self.server)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("client_cert", &self.client_cert_pem.is_some())
            .field("impersonation", &self.impersonation)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}
