//! Fleetgate agents' tunnels live on the shards. The tunnel thread reads an agent's TLS
//! ClientHello, and when it offers the fleetgate ALPN hands the socket with that hello to a
//! shard (round robin over the shards): the shard finishes the TLS handshake, reads the hello,
//! and runs the tunnel's h2 connection as one of its tasks. So a request on that shard opens a
//! stream, writes its frames and is woken by the tunnel without crossing a thread: the h2
//! connection, its streams and the exchange poll each other on one runtime, and the frames
//! several streams queue between two polls go out in one write. A request on another shard
//! uses the tunnel through h2's thread-safe handles, as all of them did when the tunnel had a
//! thread of its own (measured: 39-46% of the gateway's CPU on that thread, 13-18% in context
//! switches); `super::TunnelRegistry::pick` prefers the requesting shard's own tunnels.
//!
//! A shard registers its inbox when it starts ([`register`], on its own thread) and the
//! registration ends with the receiver (a dead shard's inbox is skipped). A tunnel's registry
//! entry is removed by a guard, so a shard that dies with its tunnels leaves none listed.

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use fleetgate_config_watcher::SharedTable;
use monoio::io::IntoPollIo;
use rustls::ServerConfig;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tracing::info;

use super::{claim, registry, wire, Carrier, Tunnel};
use crate::runtime;
use crate::runtime::inbox::Inboxes;

/// An agent whose ClientHello offered the fleetgate ALPN, for a shard to serve.
pub struct Handoff {
    pub tcp: std::net::TcpStream,
    pub hello: rustls::server::Accepted,
    pub peer: SocketAddr,
    pub config: Arc<ServerConfig>,
    pub table: SharedTable,
    /// Counts it against its address until its handshake here is done (`super::pending`).
    pub seat: super::pending::Seat,
}

fn inboxes() -> &'static Inboxes<Handoff> {
    static INBOXES: OnceLock<Inboxes<Handoff>> = OnceLock::new();
    INBOXES.get_or_init(Default::default)
}

thread_local! {
    /// The shard this thread runs, once it registered.
    static SHARD: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The shard the calling thread runs (`None` off the shards).
pub fn current_shard() -> Option<usize> {
    SHARD.with(Cell::get)
}

/// Registers shard `index`'s inbox (a restarted shard replaces its predecessor's) and marks the
/// calling thread as that shard. Called on the shard's own thread.
pub fn register(index: usize) -> UnboundedReceiver<Handoff> {
    let receive = inboxes().register(index);
    SHARD.with(|shard| shard.set(Some(index)));
    receive
}

/// No shard runs to take an agent.
#[derive(Debug)]
pub(super) struct NoShard;

/// Gives `agent` to the next live shard.
pub(super) fn hand_off(mut agent: Handoff) -> Result<(), NoShard> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let inboxes = inboxes().load();
    let live: Vec<&UnboundedSender<Handoff>> = inboxes
        .iter()
        .flatten()
        .filter(|s| !s.is_closed())
        .collect();
    let start = NEXT.fetch_add(1, Ordering::Relaxed);
    for i in 0..live.len() {
        match live[(start + i) % live.len()].send(agent) {
            Ok(()) => return Ok(()),
            Err(returned) => agent = returned.0,
        }
    }
    Err(NoShard)
}

/// The shard's side: serves each agent handed to it, as a task of its own.
pub async fn receive(mut inbox: UnboundedReceiver<Handoff>) {
    while let Some(agent) = inbox.recv().await {
        runtime::spawn(serve(agent));
    }
}

/// Finishes the agent's TLS handshake and reads its hello (within the handshake timeout), then
/// runs its tunnel until it ends.
async fn serve(agent: Handoff) {
    let Handoff {
        tcp,
        hello,
        peer,
        config,
        table,
        seat,
    } = agent;
    let tcp = match monoio::net::TcpStream::from_std(tcp).and_then(|t| t.into_poll_io()) {
        Ok(tcp) => tcp,
        Err(error) => {
            info!(%peer, %error, "agent's socket could not join the shard");
            return;
        }
    };
    let accepted = runtime::timeout(wire::HANDSHAKE_TIMEOUT, async {
        let mut tls = tokio_rustls::StartHandshake::from_parts(hello, tcp)
            .into_stream(config)
            .await
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        let cluster = claim::fleetgate_hello(&mut tls, &table).await?;
        Ok::<_, String>((tls, cluster))
    })
    .await;
    drop(seat);
    match accepted {
        Ok(Ok((tls, cluster))) => serve_tunnel(tls, cluster, peer).await,
        Ok(Err(reason)) => info!(%peer, reason = %reason, "agent refused"),
        Err(_) => info!(%peer, "agent refused: no TLS handshake and hello within the timeout"),
    }
}

/// Keeps a tunnel listed while it lives; unlists it when dropped (its task ended, or its shard's
/// runtime went down with it).
struct Listed(Arc<Tunnel>);

impl Drop for Listed {
    fn drop(&mut self) {
        registry().remove(&self.0);
    }
}

/// Runs an accepted agent's h2 connection (the gateway as client) with its registry entry and
/// heartbeat, until it ends.
async fn serve_tunnel<S>(tls: S, cluster: Arc<str>, peer: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let handshake = wire::gateway_h2(tls).await;
    let (send, mut connection) = match handshake {
        Ok(pair) => pair,
        Err(error) => {
            info!(%peer, cluster = %cluster, %error, "agent's h2 handshake failed");
            return;
        }
    };
    let Some(mut pings) = connection.ping_pong() else {
        return;
    };
    let stats = registry().stats(&cluster);
    let mut tunnel = Tunnel::new(cluster.clone(), peer, Carrier::Fleetgate(send), stats);
    tunnel.shard = current_shard();
    let tunnel = Arc::new(tunnel);
    registry().add(tunnel.clone());
    let listed = Listed(tunnel.clone());
    info!(%peer, cluster = %cluster, tunnel = tunnel.id, shard = tunnel.shard, "tunnel up");
    let heartbeat = wire::heartbeat::until_unanswered(&mut pings, runtime::sleep);
    let reason = match runtime::race(&mut connection, heartbeat).await {
        runtime::First::Left(Ok(())) => "the agent closed the connection".to_string(),
        runtime::First::Left(Err(error)) => format!("connection error: {error}"),
        runtime::First::Right(reason) => reason,
    };
    // Out of the registry first, so no new stream picks it; dropping the connection then fails
    // the streams still open on it.
    drop(listed);
    drop(connection);
    info!(%peer, cluster = %cluster, tunnel = tunnel.id, reason = %reason, "tunnel down");
}
