//! Pull mode, the gateway's side: members behind NAT are reached through tunnels their agents
//! (`fleetgate agent`, in `agent/`) dial to the gateway. This station sits under `upstream`
//! and never imports it: for a `Tunnel` cluster, `upstream::connect` asks [`open`] for a member
//! connection ([`TunnelIo`]) instead of dialing, and the rest of the exchange (member head, relay,
//! pool, upgrades spliced) runs on it unchanged.
//!
//! - `listener`: the tunnel listener, on a thread and a tokio runtime of its own: it accepts
//!   agents, reads their TLS ClientHello and sends each on by its ALPN; `pending`: how many
//!   connections it holds before authentication, per address and in all, and whose it cuts;
//!   `refusals`: its refusals logged so that a flood cannot flood the log;
//! - `handoff`: a fleetgate agent's tunnel on a shard: the rest of the mTLS handshake (the agent
//!   CA, the cluster name in the certificate's subject), the hello, the h2 connection with roles
//!   reversed (the gateway is the h2 client that opens streams), pinged, and registered here
//!   while it lives;
//! - `stream`: one h2 stream as a byte pipe with per-stream flow control (the gateway's side; the
//!   agent's is `agent/carry.rs`);
//! - `konnectivity`: unmodified konnectivity (ANP) proxy-agents, dispatched to by ALPN `h2`, on
//!   the tunnel thread;
//! - `wire`: the wire format both ends import (the hello and its answer, stream targets and
//!   answers, the h2 settings, heartbeats, coalescing); a leaf that imports nothing else here.
//!
//! The shards find tunnels in this registry: each cluster's live tunnels in an `ArcSwap`, written
//! only when an agent comes or goes. A shard loads it, picks a tunnel (its own if the cluster has
//! one on it, round robin over the cluster's agents) and opens a stream on it with the `h2`
//! crate's `Send` handles; on its own tunnel no thread is crossed, on another's the wakers reach
//! it across threads and h2's internal lock is held only for the length of a frame operation.
//! An agent's bytes are parsed by rustls and h2 on the shard serving its tunnel, as a client's
//! are; its ClientHello and a konnectivity agent's gRPC on the tunnel thread.
//!
//! Three runtimes run this folder, each its own part: the shards' monoio (`handoff`, the registry's
//! [`open`], `stream`), the tunnel thread's tokio (`listener`, `konnectivity`), and, for `wire`
//! alone, the agent's tokio. The registry itself is runtime-neutral and takes its inputs (the
//! calling shard, the carriers) as arguments, so it is tested in process (`tests`).

pub mod claim;
pub mod handoff;
pub mod konnectivity;
pub mod listener;
pub mod pending;
pub mod refusals;
pub mod stats;
pub mod stream;
pub mod wire;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ahash::AHashMap;
use arc_swap::ArcSwap;
use bytes::Bytes;
use fleetgate_config_watcher::{ClusterRoute, ConnectMode, RouteTable};
use tokio::sync::Notify;
use tracing::debug;

use crate::errors::GatewayError;
use crate::runtime::{self, clock};
pub use konnectivity::KonnectivityConn;
pub use stats::{Counted, StreamStats};
pub use stream::TunnelStream;
use wire::StreamAnswer;

/// How long a request waits for an agent to (re)connect, unless `serve --tunnel-wait` says.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(3);

/// A member connection through a tunnel, for `upstream` to pool and the exchange to use like a
/// dialed one; counted in its cluster's [`StreamStats`] while it lives.
pub enum TunnelIo {
    /// A stream of a fleetgate agent's tunnel, which the agent carries to the member (or to an
    /// allowed service), bytes as they are.
    Stream(Box<Counted<TunnelStream>>),
    /// The gateway's own TLS to the member, over a konnectivity agent's connection (which
    /// carries TCP only).
    Konnectivity(Box<Counted<tokio_rustls::client::TlsStream<KonnectivityConn>>>),
}

/// One agent's live tunnel.
pub struct Tunnel {
    pub id: u64,
    pub cluster: Arc<str>,
    pub agent: SocketAddr,
    carrier: Carrier,
    /// The shard whose runtime runs its connection (a fleetgate agent's); `None` for a tunnel on
    /// the tunnel thread (a konnectivity agent's).
    pub shard: Option<usize>,
    /// Its cluster's counters, which each member connection opened on it adds to.
    stats: Arc<StreamStats>,
    /// Cleared by whoever sees the connection fail first (a shard opening a stream, or the
    /// tunnel thread), so no new stream is tried on it.
    alive: AtomicBool,
}

/// What carries a tunnel's member connections.
pub(crate) enum Carrier {
    /// A `fleetgate agent`'s h2 connection (the gateway opens streams on it).
    Fleetgate(h2::client::SendRequest<Bytes>),
    /// A konnectivity agent's session (the gateway asks it to dial).
    Konnectivity(konnectivity::SessionHandle),
}

impl Tunnel {
    /// A tunnel of `cluster` from `agent`, counting in `stats` (its registry's
    /// [`TunnelRegistry::stats`] for the cluster).
    pub(crate) fn new(
        cluster: Arc<str>,
        agent: SocketAddr,
        carrier: Carrier,
        stats: Arc<StreamStats>,
    ) -> Tunnel {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Tunnel {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            stats,
            cluster,
            agent,
            carrier,
            shard: None,
            alive: AtomicBool::new(true),
        }
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_dead(&self) {
        self.alive.store(false, Ordering::Relaxed);
    }
}

/// Why a stream could not be opened on a tunnel.
enum OpenError {
    /// The tunnel is gone (its connection failed or closed): try another, or wait.
    Gone,
    /// The agent answered, but could not reach its member (or the service): its reason.
    Refused(String),
    /// The agent refuses the target (a service not in its `--allow-service` list).
    Forbidden,
}

impl Tunnel {
    /// A connection to `uri`'s target (`cluster`'s member, or an allowed service) through this
    /// tunnel's agent.
    async fn open_stream(
        &self,
        cluster: &ClusterRoute,
        uri: &str,
        service: bool,
    ) -> Result<TunnelIo, OpenError> {
        match &self.carrier {
            Carrier::Fleetgate(send) => Self::open_h2_stream(send, uri, &self.stats).await,
            // A konnectivity agent dials what the gateway names; it has no allow list, so the
            // gateway never names a service to it.
            Carrier::Konnectivity(_) if service => Err(OpenError::Refused(
                "services are reached through fleetgate agents only (a konnectivity agent has no allow list)".into(),
            )),
            Carrier::Konnectivity(session) => {
                konnectivity::open_member(session, cluster, &self.stats).await
            }
        }
    }

    /// Opens a stream to `uri`'s target: the agent dials a connection for it (its member, or an
    /// allowed service) and answers 200.
    async fn open_h2_stream(
        send: &h2::client::SendRequest<Bytes>,
        uri: &str,
        stats: &Arc<StreamStats>,
    ) -> Result<TunnelIo, OpenError> {
        let send = send.clone();
        let mut send = send.ready().await.map_err(|_| OpenError::Gone)?;
        let request = wire::stream_request(uri).ok_or(OpenError::Gone)?;
        let (response, stream) = send
            .send_request(request, false)
            .map_err(|_| OpenError::Gone)?;
        let response = response.await.map_err(|e| match e.reason() {
            // The agent reset this stream: the tunnel itself is fine.
            Some(reason) if e.is_reset() => {
                OpenError::Refused(format!("the agent reset the stream ({reason})"))
            }
            _ => OpenError::Gone,
        })?;
        match StreamAnswer::read(&response) {
            StreamAnswer::Open => Ok(TunnelIo::Stream(Box::new(Counted::new(
                TunnelStream::new(stream, response.into_body()),
                stats.clone(),
            )))),
            StreamAnswer::Forbidden => Err(OpenError::Forbidden),
            StreamAnswer::Refused(reason) => Err(OpenError::Refused(reason)),
        }
    }
}

/// Every cluster's live tunnels, published by the tunnel thread, read by the shards.
pub struct TunnelRegistry {
    by_cluster: ArcSwap<AHashMap<Arc<str>, Vec<Arc<Tunnel>>>>,
    /// Round robin over a cluster's tunnels.
    next: AtomicUsize,
    /// How long a request waits for an agent (milliseconds).
    wait_ms: AtomicU64,
    /// Each Tunnel cluster's counters, from its first agent on (written by the tunnel thread
    /// when a cluster's first agent comes, read by `/metrics`; a stream holds its cluster's `Arc`
    /// and adds to it with relaxed atomics: a tunnel stream crosses threads anyway, through h2).
    stats: ArcSwap<AHashMap<Arc<str>, Arc<StreamStats>>>,
    /// Woken when a tunnel is added, for the requests waiting for one ([`Self::arrival`]).
    arrived: Notify,
    /// Called after each tunnel added or removed: `cli/serve` hands it the API source's signal,
    /// so a Cluster's agent count is written to its status at once (never blocks).
    on_change: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

/// The process's registry (one tunnel listener per process).
pub fn registry() -> &'static TunnelRegistry {
    static REGISTRY: OnceLock<TunnelRegistry> = OnceLock::new();
    REGISTRY.get_or_init(TunnelRegistry::new)
}

impl TunnelRegistry {
    /// An empty registry; the process has one ([`registry`]), tests their own.
    fn new() -> TunnelRegistry {
        TunnelRegistry {
            by_cluster: ArcSwap::from_pointee(AHashMap::new()),
            next: AtomicUsize::new(0),
            wait_ms: AtomicU64::new(DEFAULT_WAIT.as_millis() as u64),
            stats: ArcSwap::from_pointee(AHashMap::new()),
            arrived: Notify::new(),
            on_change: OnceLock::new(),
        }
    }

    /// How long a request for a cluster without a tunnel waits for one before its 503.
    pub fn set_wait(&self, wait: Duration) {
        self.wait_ms.store(
            wait.as_millis().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    fn wait(&self) -> Duration {
        Duration::from_millis(self.wait_ms.load(Ordering::Relaxed))
    }

    /// Sets what is called after each tunnel added or removed (once; a second hook is ignored).
    pub fn on_change(&self, hook: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_change.set(hook);
    }

    fn changed(&self) {
        if let Some(hook) = self.on_change.get() {
            hook();
        }
    }

    /// `cluster`'s counters (made on its first agent).
    pub(crate) fn stats(&self, cluster: &Arc<str>) -> Arc<StreamStats> {
        if let Some(stats) = self.stats.load().get(cluster) {
            return stats.clone();
        }
        self.stats.rcu(|map| {
            let mut map = AHashMap::clone(map);
            map.entry(cluster.clone()).or_default();
            map
        });
        self.stats.load()[cluster].clone()
    }

    /// Adds a tunnel (its shard, or the tunnel thread for a konnectivity agent; the writers are
    /// few and `rcu` retries a lost race).
    pub(crate) fn add(&self, tunnel: Arc<Tunnel>) {
        tunnel.stats.connects.fetch_add(1, Ordering::Relaxed);
        self.by_cluster.rcu(|map| {
            let mut map = AHashMap::clone(map);
            map.entry(tunnel.cluster.clone())
                .or_default()
                .push(tunnel.clone());
            map
        });
        self.arrived.notify_waiters();
        self.changed();
    }

    /// Removes a tunnel whose connection ended.
    pub(crate) fn remove(&self, tunnel: &Tunnel) {
        tunnel.mark_dead();
        self.by_cluster.rcu(|map| {
            let mut map = AHashMap::clone(map);
            if let Some(list) = map.get_mut(&tunnel.cluster) {
                list.retain(|t| t.id != tunnel.id);
                if list.is_empty() {
                    map.remove(&tunnel.cluster);
                }
            }
            map
        });
        self.changed();
    }

    /// How many live tunnels `cluster` has.
    pub fn count(&self, cluster: &str) -> usize {
        self.by_cluster
            .load()
            .get(cluster)
            .map_or(0, |l| l.iter().filter(|t| t.is_alive()).count())
    }

    /// The Tunnel clusters of `table`, each with its live tunnels, by name.
    pub fn tunnel_clusters(&self, table: &RouteTable) -> Vec<(Arc<str>, usize)> {
        let mut out: Vec<(Arc<str>, usize)> = table
            .clusters()
            .filter(|c| c.mode == ConnectMode::Tunnel)
            .map(|c| (c.name.clone(), self.count(&c.name)))
            .collect();
        out.sort();
        out
    }

    /// OpenMetrics lines, per Tunnel cluster of `table`: live agents, tunnels accepted, streams
    /// open and opened, bytes each way.
    pub fn openmetrics_lines(&self, table: &RouteTable) -> String {
        let clusters = self.tunnel_clusters(table);
        let known = self.stats.load();
        let stats: Vec<Arc<StreamStats>> = clusters
            .iter()
            .map(|(name, _)| known.get(name).cloned().unwrap_or_default())
            .collect();
        let mut out = String::new();
        let mut family =
            |name: &str,
             kind: &str,
             help: &str,
             value: &dyn Fn(usize) -> Vec<(&'static str, u64)>| {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
                let sample = if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_owned()
                };
                for (i, (cluster, _)) in clusters.iter().enumerate() {
                    for (labels, v) in value(i) {
                        out.push_str(&format!("{sample}{{cluster=\"{cluster}\"{labels}}} {v}\n"));
                    }
                }
            };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        family(
            "fleetgate_tunnel_agents",
            "gauge",
            "Live agent tunnels of each pull-mode (Tunnel) cluster.",
            &|i| vec![("", clusters[i].1 as u64)],
        );
        family(
            "fleetgate_tunnel_connects",
            "counter",
            "Agent tunnels accepted since the start (a reconnect counts again).",
            &|i| vec![("", load(&stats[i].connects))],
        );
        family(
            "fleetgate_tunnel_streams",
            "gauge",
            "Tunnel streams open (each one member connection, pooled or in use).",
            &|i| vec![("", load(&stats[i].open))],
        );
        family(
            "fleetgate_tunnel_streams_opened",
            "counter",
            "Tunnel streams opened since the start.",
            &|i| vec![("", load(&stats[i].opened))],
        );
        family(
            "fleetgate_tunnel_bytes",
            "counter",
            "Bytes carried through tunnel streams, to the member and from it.",
            &|i| {
                vec![
                    (",direction=\"to_member\"", load(&stats[i].written)),
                    (",direction=\"from_member\"", load(&stats[i].read)),
                ]
            },
        );
        out
    }

    /// A live tunnel of `cluster`, spreading streams over its agents: one whose connection runs
    /// on `shard` (the calling shard) if there is one (no thread between the request and its
    /// tunnel), else any.
    fn pick(&self, cluster: &str, shard: Option<usize>) -> Option<Arc<Tunnel>> {
        let map = self.by_cluster.load();
        let list = map.get(cluster)?;
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut live = (0..list.len())
            .map(|i| &list[(start + i) % list.len()])
            .filter(|t| t.is_alive());
        let first = live.next()?;
        if shard.is_none() || first.shard == shard {
            return Some(first.clone());
        }
        Some(live.find(|t| t.shard == shard).unwrap_or(first).clone())
    }

    /// A live tunnel of `cluster` as soon as there is one: at once if there is, else when an
    /// agent's tunnel is added (only an addition makes one appear).
    async fn arrival(&self, cluster: &str, shard: Option<usize>) -> Arc<Tunnel> {
        loop {
            let mut added = std::pin::pin!(self.arrived.notified());
            // Listening before looking: an addition between the look and the wait is not missed.
            added.as_mut().enable();
            if let Some(tunnel) = self.pick(cluster, shard) {
                return tunnel;
            }
            added.await;
        }
    }

    /// Opens a stream to `cluster`'s member (or, with `service`, to that service, which the
    /// agent must allow: else a 403 naming it) through one of its agents' tunnels, preferring
    /// `shard`'s, within `timeout` once a tunnel is found. A tunnel found gone is marked dead
    /// and another tried. With none up, waits for one (an agent reconnecting) as long as
    /// [`Self::set_wait`] says, then fails with a 503 naming the cluster.
    async fn open(
        &self,
        cluster: &ClusterRoute,
        service: Option<&wire::ServiceRef<'_>>,
        timeout: Duration,
        shard: Option<usize>,
    ) -> Result<TunnelIo, GatewayError> {
        let uri = service.map(wire::service_uri);
        let uri = uri.as_deref().unwrap_or(wire::STREAM_URI);
        let target = || match service {
            Some(service) => format!("service {service} through the agent"),
            None => "the member through the agent".to_owned(),
        };
        let wait = self.wait();
        let started = clock::now();
        loop {
            let tunnel = match self.pick(&cluster.name, shard) {
                Some(tunnel) => tunnel,
                None => {
                    let waited = clock::now().saturating_duration_since(started);
                    let left = wait.saturating_sub(waited);
                    let arrived = if left.is_zero() {
                        None
                    } else {
                        runtime::timeout(left, self.arrival(&cluster.name, shard))
                            .await
                            .ok()
                    };
                    match arrived {
                        Some(tunnel) => tunnel,
                        None => {
                            let waited = clock::now().saturating_duration_since(started);
                            return Err(GatewayError::NoTunnel {
                                cluster: cluster.name.to_string(),
                                waited_ms: waited.as_millis() as u64,
                            });
                        }
                    }
                }
            };
            match runtime::timeout(timeout, tunnel.open_stream(cluster, uri, service.is_some()))
                .await
            {
                Ok(Ok(stream)) => return Ok(stream),
                Ok(Err(OpenError::Refused(reason))) => {
                    return Err(GatewayError::Connect {
                        cluster: cluster.name.to_string(),
                        address: format!("{} at {}", target(), tunnel.agent),
                        source: std::io::Error::other(reason),
                    })
                }
                Ok(Err(OpenError::Forbidden)) => {
                    return Err(GatewayError::ServiceNotAllowed {
                        cluster: cluster.name.to_string(),
                        service: service.map(ToString::to_string).unwrap_or_default(),
                    })
                }
                Ok(Err(OpenError::Gone)) => {
                    debug!(cluster = %cluster.name, agent = %tunnel.agent, "tunnel gone while opening a stream; trying another");
                    tunnel.mark_dead();
                    continue;
                }
                Err(_) => {
                    return Err(GatewayError::ConnectTimeout {
                        cluster: cluster.name.to_string(),
                        address: format!("{} at {}", target(), tunnel.agent),
                    })
                }
            }
        }
    }
}

/// Opens a member connection for `cluster` (or, with `service`, to that service) through the
/// process's registry, preferring the calling shard's tunnels ([`TunnelRegistry::open`]).
/// Called by `upstream::connect` on a shard.
pub(crate) async fn open(
    cluster: &ClusterRoute,
    service: Option<&wire::ServiceRef<'_>>,
    timeout: Duration,
) -> Result<TunnelIo, GatewayError> {
    registry()
        .open(cluster, service, timeout, handoff::current_shard())
        .await
}
