//! File descriptors as a budget no client can spend for everyone.
//!
//! - [`Sockets`]: every socket the gateway holds (client connections and member connections) is
//!   counted per shard; a request that needs a *new* member connection while the process is within
//!   its reserve of the descriptor limit gets a 503 Status. Pooled connections, requests already
//!   streaming, health checks and the admin listener keep working.
//! - [`ClientHolds`]: the member connections the requests of one client address hold at once
//!   (watches, logs, exec sessions, requests in flight) are capped per shard at
//!   `limits.maxMemberConnectionsPerClient` divided by the shards; more get a 429 Status with
//!   `Retry-After`, which kubectl and client-go retry.
//!
//! Counting is per shard (a shard only writes its own counter; the reserve check reads them all
//! when a connection is to be dialled); per-client holds are shard-local maps. Called by the
//! exchange and `server::shard`; never blocks.

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ahash::AHashMap;

use crate::errors::GatewayError;

/// Sockets open, per shard, and the process's descriptor limit.
pub struct Sockets {
    per_shard: Box<[AtomicUsize]>,
    limit: usize,
    reserve: usize,
}

impl Sockets {
    /// For `shards` shards, under the process's soft descriptor limit as it is now (`serve`
    /// raises it to the hard limit first).
    pub fn new(shards: usize) -> Arc<Sockets> {
        Sockets::with_limit(shards, descriptor_limit())
    }

    /// For `shards` shards under a descriptor limit of `limit`.
    pub fn with_limit(shards: usize, limit: usize) -> Arc<Sockets> {
        Arc::new(Sockets {
            per_shard: (0..shards.max(1)).map(|_| AtomicUsize::new(0)).collect(),
            limit,
            // What a new member connection may never take: room for health checks, the admin
            // listener, new clients to be told why, files and the process's own descriptors.
            reserve: (limit / 20).max(64),
        })
    }

    /// Counts one socket of `shard` until the guard drops.
    pub fn hold(self: &Arc<Self>, shard: usize) -> SocketHeld {
        let index = shard % self.per_shard.len();
        self.per_shard[index].fetch_add(1, Ordering::Relaxed);
        SocketHeld {
            sockets: self.clone(),
            index,
        }
    }

    /// Shard `index` died and its thread is gone: every socket it held is closed.
    pub fn forget_shard(&self, index: usize) {
        self.per_shard[index % self.per_shard.len()].store(0, Ordering::Relaxed);
    }

    /// Sockets open now, over every shard.
    pub fn open(&self) -> usize {
        self.per_shard
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether a new member connection may be opened, or the 503 that says why not.
    pub fn check_new_member_connection(&self, cluster: &str) -> Result<(), GatewayError> {
        if self.open() + self.reserve < self.limit {
            return Ok(());
        }
        Err(GatewayError::OutOfDescriptors {
            cluster: cluster.to_string(),
        })
    }
}

/// Raises the process's soft limit on open files to its hard limit (a gateway holds two sockets
/// per proxied stream; distributions start processes at a soft 1024). Returns the soft limit now
/// in force.
pub fn raise_descriptor_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: getrlimit writes one rlimit into the struct we own; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                tracing::warn!(
                    soft = limit.rlim_cur,
                    hard = limit.rlim_max,
                    "could not raise the open-files limit"
                );
            }
        }
    }
    descriptor_limit()
}

/// The process's soft limit on open files (a very large default where it cannot be read).
fn descriptor_limit() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: getrlimit writes one rlimit into the struct we own; no other memory is touched.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    if ok && limit.rlim_cur != libc::RLIM_INFINITY {
        usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
    } else {
        usize::MAX / 2
    }
}

/// One socket counted in [`Sockets`].
pub struct SocketHeld {
    sockets: Arc<Sockets>,
    index: usize,
}

impl Drop for SocketHeld {
    fn drop(&mut self) {
        self.sockets.per_shard[self.index].fetch_sub(1, Ordering::Relaxed);
    }
}

/// The member connections each client address holds on one shard.
pub struct ClientHolds {
    held: Rc<RefCell<AHashMap<IpAddr, usize>>>,
}

impl Default for ClientHolds {
    fn default() -> Self {
        ClientHolds {
            held: Rc::new(RefCell::new(AHashMap::new())),
        }
    }
}

impl ClientHolds {
    /// Takes one member connection for `client`, within `per_shard_limit`, or the 429 that says
    /// why not.
    pub fn take(&self, client: IpAddr, per_shard_limit: usize) -> Result<ClientHold, GatewayError> {
        let mut held = self.held.borrow_mut();
        let count = held.entry(client).or_insert(0);
        if *count >= per_shard_limit {
            return Err(GatewayError::TooManyMemberConnections);
        }
        *count += 1;
        Ok(ClientHold {
            held: self.held.clone(),
            client,
        })
    }

    /// Member connections `client` holds on this shard now.
    pub fn held(&self, client: IpAddr) -> usize {
        self.held.borrow().get(&client).copied().unwrap_or(0)
    }
}

/// One member connection held for a client address; given back when dropped.
pub struct ClientHold {
    held: Rc<RefCell<AHashMap<IpAddr, usize>>>,
    client: IpAddr,
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        let mut held = self.held.borrow_mut();
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_address_holds_at_most_its_limit_and_gets_them_back() {
        let holds = ClientHolds::default();
        let alice: IpAddr = "10.0.0.1".parse().unwrap();
        let bob: IpAddr = "10.0.0.2".parse().unwrap();
        let first = holds.take(alice, 2).unwrap();
        let _second = holds.take(alice, 2).unwrap();
        assert!(matches!(
            holds.take(alice, 2),
            Err(GatewayError::TooManyMemberConnections)
        ));
        assert!(
            holds.take(bob, 2).is_ok(),
            "another address has its own limit"
        );
        drop(first);
        assert_eq!(holds.held(alice), 1);
        assert!(holds.take(alice, 2).is_ok());
    }

    #[test]
    fn new_member_connections_stop_at_the_reserve() {
        let sockets = Sockets::with_limit(2, 1000);
        // The reserve is 64 of 1000: 936 sockets may be open before a new one is refused.
        let held: Vec<_> = (0..935).map(|i| sockets.hold(i % 2)).collect();
        assert!(sockets.check_new_member_connection("m").is_ok());
        let one_more = sockets.hold(0);
        assert!(matches!(
            sockets.check_new_member_connection("m"),
            Err(GatewayError::OutOfDescriptors { .. })
        ));
        drop(one_more);
        assert!(sockets.check_new_member_connection("m").is_ok());
        assert_eq!(sockets.open(), held.len());
    }
}
