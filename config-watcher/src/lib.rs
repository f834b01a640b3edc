//! fleetgate-config-watcher: reads fleetgate's configuration objects (Gateway, Cluster,
//! AccessPolicy), validates them, and builds the [`RouteTable`] the data path reads through an
//! `ArcSwap`.
//!
//! This crate never imports the data path. Loading and building block (file reads, certificate
//! parsing) and happen off the hot path; the data path only ever loads the published table.

pub mod auth;
mod checks;
pub mod circuits;
pub mod crd;
mod endpoint;
mod error;
pub mod fairness;
mod file_source;
pub mod fleet;
mod judge;
mod jwks;
pub mod karmada;
mod kube_source;
mod load;
pub mod material;
pub mod objects;
pub mod policy;
mod reload;
pub mod request_info;
pub mod retirement;
pub mod selector;
mod settings;
mod table;

pub use checks::{check_cluster_name, RESERVED_CLUSTER_NAMES};
pub use crd::crd_manifests;
pub use endpoint::{parse_tunnel_address, DEFAULT_TUNNEL_ADDRESS};
pub use error::ConfigError;
pub use file_source::{
    watch_config_path, FileWatcher, WatchError, DEBOUNCE_MAX, DEBOUNCE_QUIET, POLL_INTERVAL,
};
pub use judge::{LoadedObjects, ObjectRef, RejectedObject};
pub use kube_source::{
    api_source_permissions, kube_client_config, watch_kube_api, AgentReport, KubeSourceError,
    KubeSourceOptions, KubeWatcher, AGENT_HEARTBEAT, LEAVE_TIMEOUT,
};
pub use load::{load_objects, load_path, load_text_objects, load_texts};
pub use objects::{ConnectMode, SharedWatchScope};
pub use reload::{
    first_table, ReloadFailure, ReloadOutcome, ReloadStatus, TablePublisher, API_SOURCE,
};
pub use retirement::{RetirementListener, RouteRetirement};
pub use settings::{
    CacheSettings, CircuitBreakerSettings, ClusterConfig, Config, FleetSettings, GatewaySettings,
    Http2Settings, Limits, ListenerSettings, ServingTls, SharedWatchSettings,
};
pub use table::{
    crypto_provider, egress_proxy, parse_certs, parse_key, parse_server, ClusterRoute, EgressProxy,
    RouteTable, TunnelMember, UpstreamTarget,
};

/// The routing table as the data path holds it: swapped whole on a change, loaded once per request.
pub type SharedTable = std::sync::Arc<arc_swap::ArcSwap<RouteTable>>;
