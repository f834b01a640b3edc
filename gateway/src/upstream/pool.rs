//! The per-shard keep-alive pool: idle upstream connections keyed by the cluster route's `id`
//! and, for a stream to a service of a pull-mode cluster (the direct service path), that
//! service ([`PoolKey`]): a kept stream to a service serves the next request to that same
//! service, never one to the member or to another service.
//!
//! Per shard, so it needs no lock (`RefCell` in a single-threaded runtime); a connection lives and
//! dies on the shard that opened it. It never checks a connection's health (the driver retries a
//! request that fails on a reused connection once) and only holds connections the driver returned
//! after a clean, complete response, or that a dial opened when nobody waited for it any more.
//!
//! A request that finds no idle connection takes a place in the endpoint's line (`dials`): at most
//! [`MAX_DIALS_PER_ENDPOINT`] dials run at once per key, each as a task of its own so that a
//! request that leaves (its h2 stream reset) does not waste the connection, and a returned
//! connection goes to the first in line before it is kept idle.
//!
//! Connections of a retired route (its cluster removed or changed: see
//! `fleetgate_config_watcher::retirement`) are closed by a sweep: on the next touch of the pool
//! after a retirement anywhere in the process (one atomic load per touch tells), and by a small
//! task the pool starts on its shard at its first `put`, which sleeps until a retirement happens,
//! so an idle shard closes them too ([`sweep_on_retirement`]).

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::Duration;

use ahash::AHashMap;
use fleetgate_config_watcher::retirement::retirements;
use tracing::debug;

use fleetgate_config_watcher::ClusterRoute;

use super::dials::{AfterDial, Dials, Joined, Waiting, MAX_DIALS_PER_ENDPOINT};
use super::UpstreamConn;
use crate::errors::GatewayError;
use crate::runtime::clock;
use crate::tunnel::wire::ServiceRef;

#[cfg(test)]
pub(crate) mod scripted;
#[cfg(test)]
mod tests;

/// What an upstream connection reaches, as the pool keys it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// The [`ClusterRoute::id`]: a changed cluster spec never reuses a connection made with old
    /// credentials.
    cluster_id: u64,
    /// `NS/NAME:PORT` for a stream to a service; None for the member itself.
    service: Option<Box<str>>,
}

impl PoolKey {
    /// The key of `cluster`'s member, or of `service` through it (which allocates its name).
    pub fn new(cluster: &ClusterRoute, service: Option<&ServiceRef<'_>>) -> PoolKey {
        PoolKey {
            cluster_id: cluster.id,
            service: service.map(|s| s.to_string().into_boxed_str()),
        }
    }
}

/// Idle time after which a pooled connection is checked before it is reused.
const PROBE_AFTER: Duration = Duration::from_millis(500);

/// Idle connections per cluster route on one shard, and the line for new ones.
pub struct ShardPool {
    idle: Rc<IdleConns>,
    dials: Rc<Dials<PoolKey, UpstreamConn, GatewayError>>,
}

/// A request's place in the line for a connection to one endpoint ([`ShardPool::wait_for`]).
pub type WaitForConnection = Waiting<PoolKey, UpstreamConn, GatewayError>;

impl ShardPool {
    /// A pool keeping at most `max_idle_per_cluster` idle connections per cluster, each for at
    /// most `idle_timeout` (below kube-apiserver's own idle close, so the member rarely closes
    /// one under us).
    pub fn new(max_idle_per_cluster: usize, idle_timeout: Duration) -> Self {
        let idle = Rc::new(IdleConns {
            by_cluster: RefCell::new(AHashMap::new()),
            swept_at_epoch: Cell::new(retirements().epoch()),
            sweeper_started: Cell::new(false),
            max_idle_per_cluster,
            idle_timeout,
        });
        let shelf = idle.clone();
        ShardPool {
            idle,
            dials: Dials::new(MAX_DIALS_PER_ENDPOINT, move |conn| shelf.put(conn)),
        }
    }

    /// The most recently returned, unexpired idle connection for `key`.
    pub fn take(&self, key: &PoolKey) -> Option<UpstreamConn> {
        self.idle.sweep_if_retired();
        let mut idle = self.idle.by_cluster.borrow_mut();
        let conns = idle.get_mut(key)?;
        while let Some(mut conn) = conns.pop() {
            let idle = clock::now().saturating_duration_since(conn.idle_since);
            if idle >= self.idle.idle_timeout {
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

    /// A place in `key`'s line for a new connection (`fresh`: one nobody has used, for an
    /// upgrade or a retry), for a request that found none idle ([`ShardPool::take`]). When more
    /// wait than the dials in flight serve, and fewer than [`MAX_DIALS_PER_ENDPOINT`] run, a
    /// dial starts as a task of this shard: `dial` is called, again while the line needs it,
    /// and each connection goes to the first in line (or to the idle pool). The place resolves
    /// to whichever comes first: such a connection, a dial's error, or a connection another
    /// request returns. The caller bounds the wait (its connect deadline).
    pub fn wait_for<F>(&self, key: PoolKey, fresh: bool, dial: F) -> WaitForConnection
    where
        F: AsyncFn() -> Result<UpstreamConn, GatewayError> + 'static,
    {
        let Joined {
            waiting,
            dial: slot,
        } = self.dials.join(key, fresh);
        if let Some(mut slot) = slot {
            crate::runtime::spawn(async move {
                while slot.finish(dial().await) == AfterDial::DialAgain {}
            });
        }
        waiting
    }

    /// Returns a connection after a clean, complete response: to the first request in its line,
    /// or to the idle connections.
    pub fn put(&self, mut conn: UpstreamConn) {
        conn.reused = true;
        if self.dials.busy() {
            let key = conn.pool_key.clone();
            match self.dials.offer(&key, conn) {
                Some(unwanted) => conn = unwanted,
                None => return,
            }
        }
        self.idle.put(conn);
    }

    /// Idle connections held now (the in-process tests' view of the pool).
    #[cfg(test)]
    pub(crate) fn idle_count(&self) -> usize {
        self.idle.by_cluster.borrow().values().map(Vec::len).sum()
    }
}

/// The idle connections, shared between the pool, its line's dials and its sweeper task (same
/// shard).
struct IdleConns {
    by_cluster: RefCell<AHashMap<PoolKey, Vec<UpstreamConn>>>,
    /// The process-wide retirement epoch this pool last swept at.
    swept_at_epoch: Cell<u64>,
    /// Whether the retirement sweeper task runs on this shard yet.
    sweeper_started: Cell<bool>,
    max_idle_per_cluster: usize,
    idle_timeout: Duration,
}

impl IdleConns {
    /// Keeps `conn` idle (nobody waits for it).
    fn put(self: &Rc<Self>, mut conn: UpstreamConn) {
        if conn.retirement.is_retired() {
            // Its route left the table while the response streamed: nobody will ask for it.
            return;
        }
        if !self.sweeper_started.replace(true) {
            crate::runtime::spawn(sweep_on_retirement(Rc::downgrade(self)));
        }
        self.sweep_if_retired();
        let now = clock::now();
        conn.idle_since = now;
        // Idle, it may be closed by the member: a failure on it is retried on a fresh one.
        conn.reused = true;
        let mut idle = self.by_cluster.borrow_mut();
        // Drop expired connections of every cluster now and then, so routes removed from the
        // table do not keep sockets open.
        if idle.len() > 8 {
            let timeout = self.idle_timeout;
            idle.retain(|_, conns| {
                conns.retain(|c| now.duration_since(c.idle_since) < timeout);
                !conns.is_empty()
            });
        }
        let conns = idle.entry(conn.pool_key.clone()).or_default();
        if conns.len() >= self.max_idle_per_cluster {
            conns.remove(0);
        }
        conns.push(conn);
    }

    /// Closes the connections of retired routes if any route was retired since the last sweep.
    /// One atomic load when nothing was.
    fn sweep_if_retired(&self) {
        let epoch = retirements().epoch();
        if epoch == self.swept_at_epoch.get() {
            return;
        }
        let Ok(mut idle) = self.by_cluster.try_borrow_mut() else {
            // A borrow in progress on this shard (cannot happen across an await); the next
            // touch sweeps.
            return;
        };
        self.swept_at_epoch.set(epoch);
        let before: usize = idle.values().map(Vec::len).sum();
        idle.retain(|_, conns| {
            conns.retain(|c| !c.retirement.is_retired());
            !conns.is_empty()
        });
        let closed = before - idle.values().map(Vec::len).sum::<usize>();
        if closed > 0 {
            debug!(closed, "closed idle upstream connections of retired routes");
        }
    }
}

/// Sleeps until a route is retired anywhere in the process, then sweeps this shard's pool; ends
/// at the first retirement after the pool was dropped (it holds the pool by a `Weak` only).
///
/// Its wait may outlive its shard: a task of a shard whose runtime ended is not dropped while it
/// waits on another thread's wake-up, and the next retirement, on the table publisher's thread,
/// then drops it there. That is safe because `retirement` wakes outside its waiters' lock (the
/// task's wait unregisters under that lock as it drops).
async fn sweep_on_retirement(idle: Weak<IdleConns>) {
    loop {
        let Some(seen) = idle.upgrade().map(|pool| pool.swept_at_epoch.get()) else {
            return;
        };
        retirements().changed_since(seen).await;
        let Some(pool) = idle.upgrade() else {
            return;
        };
        pool.sweep_if_retired();
    }
}
