//! The shard context: everything one shard's connections and requests share, as the composition
//! of the stations' own parts: the exchange's ([`ShardExchange`]: table, pool, metric cells,
//! drain, budgets) and the shared watches' ([`ShardWatches`]), with the gateway-wide metrics,
//! admission's counters, the shutdown and the audit log. Built by `server::shard` (the composition root) when a shard
//! starts; read by the front-ends (`protocol`) and the pipeline, which hand each station the part
//! it takes.

use std::rc::Rc;
use std::sync::Arc;

use crate::admit::Admission;
use crate::exchange::ShardExchange;
use crate::observe::audit::AuditLog;
use crate::observe::metrics::Metrics;
use crate::runtime::shutdown::Shutdown;
use crate::watch::ShardWatches;

/// Everything one shard's connections share. One per shard thread, never sent across threads.
pub struct ShardContext {
    /// What the shard's requests to members share (also held by `watches`).
    pub exchange: Rc<ShardExchange>,
    /// The shard's shared watches and the members' answers on who may watch what.
    pub watches: Rc<ShardWatches>,
    pub metrics: Arc<Metrics>,
    /// Admission's counters (`admit`), shared by every shard.
    pub admission: Arc<Admission>,
    /// Graceful shutdown: shared by every shard.
    pub shutdown: Arc<Shutdown>,
    /// The audit log: one record per response end, when the Gateway has `spec.audit`.
    pub audit: Option<AuditLog>,
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
        self.exchange.shard_metrics.record(
            (cluster.id, &cluster.name),
            verb,
            code,
            started.elapsed(),
        );
    }
}
