//! The per-shard keep-alive pool: idle upstream connections keyed by the cluster route's `id`.
//!
//! Per shard, so it needs no lock (`RefCell` in a single-threaded runtime); a connection lives and
//! dies on the shard that opened it. It never checks a connection's health (the driver retries a
//! request that fails on a reused connection once) and only holds connections the driver returned
//! after a clean, complete response.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use ahash::AHashMap;

use super::UpstreamConn;

/// Idle time after which a pooled connection is checked before it is reused.
const PROBE_AFTER: Duration = Duration::from_millis(500);

/// Idle connections per cluster route on one shard.
pub struct ShardPool {
    idle: RefCell<AHashMap<u64, Vec<UpstreamConn>>>,
    max_idle_per_cluster: usize,
    idle_timeout: Duration,
}

impl ShardPool {
    /// A pool keeping at most `max_idle_per_cluster` idle connections per cluster, each for at
    /// most `idle_timeout` (below kube-apiserver's own idle close, so the member rarely closes
    /// one under us).
    pub fn new(max_idle_per_cluster: usize, idle_timeout: Duration) -> Self {
        ShardPool {
            idle: RefCell::new(AHashMap::new()),
            max_idle_per_cluster,
            idle_timeout,
        }
    }

    /// The most recently returned, unexpired idle connection for `cluster_id`.
    pub fn take(&self, cluster_id: u64) -> Option<UpstreamConn> {
        let mut idle = self.idle.borrow_mut();
        let conns = idle.get_mut(&cluster_id)?;
        while let Some(mut conn) = conns.pop() {
            let idle = conn.idle_since.elapsed();
            if idle >= self.idle_timeout {
                continue;
            }
            // A connection idle for a while may have been closed by the member; one that was
            // returned a moment ago is used without the extra read attempt (the common case
            // under load).
            if idle >= PROBE_AFTER && conn.closed_while_idle() {
                continue;
            }
            return Some(conn);
        }
        None
    }

    /// Returns a connection after a clean, complete response.
    pub fn put(&self, mut conn: UpstreamConn) {
        let now = Instant::now();
        conn.idle_since = now;
        conn.reused = true;
        let mut idle = self.idle.borrow_mut();
        // Drop expired connections of every cluster now and then, so routes removed from the
        // table do not keep sockets open.
        if idle.len() > 8 {
            let timeout = self.idle_timeout;
            idle.retain(|_, conns| {
                conns.retain(|c| now.duration_since(c.idle_since) < timeout);
                !conns.is_empty()
            });
        }
        let conns = idle.entry(conn.cluster_id).or_default();
        if conns.len() >= self.max_idle_per_cluster {
            conns.remove(0);
        }
        conns.push(conn);
    }

    /// Idle connections held now (for tests and metrics).
    pub fn idle_count(&self) -> usize {
        self.idle.borrow().values().map(Vec::len).sum()
    }
}
