//! Fault injection for the tests of shard supervision: off unless the process starts with
//! `FLEETGATE_FAULT_INJECTION=1`, and then two paths do what no request may otherwise do:
//!
//! - `/debug/fleetgate/panic-task` panics inside the connection's task (the gateway must close that
//!   connection and nothing else);
//! - `/debug/fleetgate/kill-shard` spawns a bare task that panics outside any guard, taking the
//!   shard thread down (the supervisor must notice, fail `/readyz`, count it and restart the shard);
//! - a member host name ending in `.slow.fleetgate.test` takes 2 s to resolve, to `localhost` (a
//!   slow DNS server: the shard must go on serving meanwhile).
//!
//! Read once per request by the pipeline (`handle`), before `request::decide` (one relaxed load when
//! off). Never enable it in production: it lets any client kill a shard.

use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Reads `FLEETGATE_FAULT_INJECTION` (called once at start).
pub fn init_from_env() {
    let on = std::env::var("FLEETGATE_FAULT_INJECTION").is_ok_and(|v| v == "1");
    if on {
        tracing::warn!("FLEETGATE_FAULT_INJECTION=1: /debug/fleetgate/ paths can panic shards");
    }
    ENABLED.store(on, Ordering::Relaxed);
}

/// Applies the fault `target` asks for, when injection is on.
pub fn inject(target: &[u8]) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    match target {
        b"/debug/fleetgate/panic-task" => panic!("fault injection: panic-task"),
        b"/debug/fleetgate/kill-shard" => {
            // A bare monoio task: nothing catches its panic, so it unwinds the shard thread.
            drop(monoio::spawn(async {
                panic!("fault injection: kill-shard");
            }));
        }
        _ => {}
    }
}

/// A name ending in `.slow.fleetgate.test` resolves after 2 s, as `localhost` would (when
/// injection is on; called on the resolver's thread, never on a shard).
pub fn slow_lookup(host: &str) -> Option<&'static str> {
    if ENABLED.load(Ordering::Relaxed) && host.ends_with(".slow.fleetgate.test") {
        std::thread::sleep(std::time::Duration::from_secs(2));
        return Some("localhost");
    }
    None
}
