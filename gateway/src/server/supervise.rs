//! Shard supervision: a shard whose thread dies is noticed, reported and restarted.
//!
//! Connections and h2 streams run in tasks that catch their own panics (`runtime::isolated`), so
//! a bad request closes its own connection and nothing else. What can still kill a shard thread
//! is a panic outside those tasks (the accept loop, the runtime itself). One supervisor thread per
//! shard waits on the shard's thread; when it ends while the gateway is not draining:
//!
//! 1. the shard is marked down: `/readyz` fails (`[-]shards failed: shard N is down`) and
//!    `fleetgate_shards_down` counts it, so a load balancer stops sending new clients while
//!    the kernel already spreads new connections over the shards still listening;
//! 2. its listening sockets are shut down (out of the SO_REUSEPORT group: new connections go to
//!    the live shards only), its gauges and socket count are zeroed (its thread is gone, so are its sockets);
//! 3. after a pause (1 s, doubling up to 30 s while it keeps dying within a minute) its
//!    listeners are bound again (the same addresses, SO_REUSEPORT among the gateway's own
//!    sockets) and a new shard thread starts; `fleetgate_shard_restarts_total` counts it.
//!
//! Called by `server::start` once every shard has started.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use crate::server::listener::bind_shard_socket;
use crate::server::shard::{spawn_shard, Driver, ShardListener, SharedState, StartedShard};

/// A listener as each shard binds it again on restart.
#[derive(Clone)]
pub struct ListenerSpec {
    pub name: String,
    pub address: SocketAddr,
    pub tls: Option<crate::tls::reload::LiveServerConfig>,
}

const FIRST_PAUSE: Duration = Duration::from_secs(1);
const LONGEST_PAUSE: Duration = Duration::from_secs(30);
/// A shard that lived this long before dying starts again after the first pause.
const STABLE: Duration = Duration::from_secs(60);

/// Watches shard `index` from a thread of its own, restarting it whenever its thread ends.
pub fn supervise(
    index: usize,
    driver: Driver,
    specs: Arc<[ListenerSpec]>,
    shared: SharedState,
    mut shard: StartedShard,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("fleetgate-supervisor-{index}"))
        .spawn(move || {
            let mut pause = FIRST_PAUSE;
            let mut since = Instant::now();
            loop {
                let ended = shard.thread.join();
                if shared.shutdown.is_draining() {
                    return;
                }
                shared.metrics.supervision.shard_died(index);
                for socket in shard.listening.drain(..) {
                    // Fails only if the socket is already closed everywhere, which is the goal.
                    let _ = socket2::SockRef::from(&socket).shutdown(std::net::Shutdown::Both);
                }
                shard.gauges.zero();
                shared.sockets.forget_shard(index);
                error!(
                    shard = index,
                    panicked = ended.is_err(),
                    "shard thread died: /readyz fails until it is restarted"
                );
                pause = if since.elapsed() >= STABLE {
                    FIRST_PAUSE
                } else {
                    pause
                };
                shard = loop {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(LONGEST_PAUSE);
                    if shared.shutdown.is_draining() {
                        return;
                    }
                    match restart(index, driver, &specs, &shared) {
                        Ok(started) => break started,
                        Err(e) => {
                            warn!(shard = index, error = %e, "shard restart failed; retrying")
                        }
                    }
                };
                since = Instant::now();
                shared.metrics.supervision.shard_restarted(index);
                info!(shard = index, "shard restarted");
            }
        })?;
    Ok(())
}

/// Binds the shard's listeners again and starts its thread; returns once it accepts.
fn restart(
    index: usize,
    driver: Driver,
    specs: &[ListenerSpec],
    shared: &SharedState,
) -> anyhow::Result<StartedShard> {
    let mut listeners = Vec::with_capacity(specs.len());
    for spec in specs {
        listeners.push(ShardListener {
            name: spec.name.clone(),
            socket: bind_shard_socket(spec.address)?,
            tls: spec.tls.clone(),
        });
    }
    let (started_tx, started_rx) = mpsc::channel();
    let shard = spawn_shard(index, driver, listeners, shared.clone(), started_tx)?;
    started_rx.recv()??;
    Ok(shard)
}
