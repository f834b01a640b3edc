//! What every connection and request on one shard shares: the shard's view of the routing
//! table, its upstream pool, its metric cells, the drain, the audit log and the socket budgets.
//! Built by `server::shard` when a shard starts; read by the front-ends, the exchange and `tls`.

use std::sync::Arc;

use crate::observe::metrics::{Metrics, ShardMetrics};
use crate::upstream::ShardPool;

/// Everything one shard's connections share: the routing table, the shard's upstream pool and
/// the metrics. One per shard thread, never sent across threads.
pub struct ShardContext {
    pub shard: usize,
    /// The routing table as this shard sees it (`snapshot`).
    pub table: crate::runtime::snapshot::ShardTable,
    pub pool: ShardPool,
    pub metrics: Arc<Metrics>,
    /// This shard's own metric cells (`observe::metrics`).
    pub shard_metrics: ShardMetrics,
    /// Graceful shutdown: shared by every shard.
    pub shutdown: Arc<crate::runtime::shutdown::Shutdown>,
    /// This shard's copy of "the drain has begun" and its waits: read per response, waited on
    /// between requests (set by a task of the shard when the shared drain starts).
    pub drain: crate::runtime::shutdown::ShardDrain,
    /// The audit log: one record per response end, when the Gateway has `spec.audit`.
    pub audit: Option<crate::observe::audit::AuditLog>,
    /// Every socket the gateway holds, against the process's descriptor limit.
    pub sockets: Arc<crate::upstream::budget::Sockets>,
    /// The member connections each client address holds on this shard.
    pub client_holds: crate::upstream::budget::ClientHolds,
    /// How many shards the gateway runs (per-client limits are split between them).
    pub workers: usize,
    /// This context itself, for tasks that outlive the request that starts them (a shared
    /// watch's member watch).
    pub me: std::rc::Weak<ShardContext>,
    /// The shard's shared watches (`watch`), by key.
    pub shared_watches: crate::watch::SharedWatches,
    /// The members' answers on who may watch what (`watch::access`), for a short while.
    pub watch_reviews: crate::watch::access::ReviewCache,
}

impl ShardContext {
    /// Counts a response to a request for `cluster` (by verb and code) and, unless it is
    /// long-running (a watch, a follow, a connect: those are timed as streams), its time to the
    /// response head.
    pub fn count_response(
        &self,
        cluster: &fleetgate_config_watcher::ClusterRoute,
        verb: &'static str,
        code: u16,
        started: std::time::Instant,
    ) {
        self.shard_metrics
            .record((cluster.id, &cluster.name), verb, code, started.elapsed());
    }
}
