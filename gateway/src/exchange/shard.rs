//! What one shard's requests to members share ([`ShardExchange`]): the shard's view of the
//! routing table, its upstream pool, its metric cells, the drain, and the socket budgets. The
//! exchange's own part of the shard context: the exchange, the gateway's own member requests
//! (`member`) and the fleet views (`fleet`) take this and nothing wider. Built by
//! `server::shard` when a shard starts, held (in an `Rc`) by the shard context (`handle`) and by
//! the shard's shared watches (`watch`).

use std::rc::Weak;
use std::sync::Arc;

use crate::observe::metrics::ShardMetrics;
use crate::runtime::shutdown::ShardDrain;
use crate::runtime::snapshot::ShardTable;
use crate::upstream::budget::{ClientHolds, Sockets};
use crate::upstream::ShardPool;

/// What one shard's requests to members share. One per shard thread, never sent across threads.
pub struct ShardExchange {
    pub shard: usize,
    /// The routing table as this shard sees it (`snapshot`).
    pub table: ShardTable,
    pub pool: ShardPool,
    /// This shard's own metric cells (`observe::metrics`).
    pub shard_metrics: ShardMetrics,
    /// This shard's copy of "the drain has begun" and its waits: read per response, waited on
    /// between requests (set by a task of the shard when the shared drain starts).
    pub drain: ShardDrain,
    /// Every socket the gateway holds, against the process's descriptor limit.
    pub sockets: Arc<Sockets>,
    /// The member connections each client address holds on this shard.
    pub client_holds: ClientHolds,
    /// How many shards the gateway runs (per-client limits are split between them).
    pub workers: usize,
    /// This part itself, for a dial that outlives the request that starts it (its connection
    /// goes to the pool).
    pub me: Weak<ShardExchange>,
}
