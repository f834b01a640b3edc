//! Which member clusters' circuit breakers are open in this process: filled by the gateway's
//! breakers (`fleetgate::upstream::breaker`, one per member endpoint) as they open and close,
//! read by the Kubernetes API source, which writes each fleetgate Cluster's `CircuitOpen`
//! condition from it (`kube_source`).
//!
//! This crate never imports the gateway: the breakers push their transitions here, and
//! [`OpenCircuits::subscribe`] wakes each API source's loop (one per process in production;
//! several in a test binary, each with a receiver of its own, so none misses a change). Transitions are rare (a member going
//! down or coming back), so a small lock is enough; nothing on a request's path takes it. One
//! per process ([`open_circuits`]), as the breakers are.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::sync::watch;

/// The open breakers, by cluster name, each with the message that says why.
#[derive(Debug)]
pub struct OpenCircuits {
    open: Mutex<BTreeMap<String, String>>,
    /// Counts the changes; every subscriber sees the latest, however busy it was meanwhile.
    changed: watch::Sender<u64>,
}

impl Default for OpenCircuits {
    fn default() -> Self {
        OpenCircuits {
            open: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

/// The process's open circuits.
pub fn open_circuits() -> &'static OpenCircuits {
    static OPEN: OnceLock<OpenCircuits> = OnceLock::new();
    OPEN.get_or_init(OpenCircuits::default)
}

impl OpenCircuits {
    /// Marks `cluster`'s breaker open, with `message` (its cause), or closed (`None`). Wakes the
    /// API source only when that changes anything.
    pub fn set(&self, cluster: &str, message: Option<String>) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = match message {
            Some(message) => open.insert(cluster.to_owned(), message.clone()) != Some(message),
            None => open.remove(cluster).is_some(),
        };
        drop(open);
        if changed {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// Why `cluster`'s breaker is open, if it is.
    pub fn get(&self, cluster: &str) -> Option<String> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(cluster).cloned()
    }

    /// A receiver whose `changed()` completes after a breaker opened or closed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_breaker_is_open_until_it_is_marked_closed() {
        let circuits = OpenCircuits::default();
        assert_eq!(circuits.get("a"), None);
        circuits.set("a", Some("refused".into()));
        assert_eq!(circuits.get("a").as_deref(), Some("refused"));
        assert_eq!(circuits.get("b"), None);
        circuits.set("a", None);
        assert_eq!(circuits.get("a"), None);
    }
}
