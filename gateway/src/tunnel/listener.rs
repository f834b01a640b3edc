//! The tunnel listener: where agents dial in. It runs on a thread and a current-thread tokio
//! runtime of its own: it accepts, reads each agent's TLS ClientHello (a stranger's first bytes,
//! never parsed on a shard) and sends the agent on by the ALPN it offered:
//! - a fleetgate agent (ALPN [`wire::ALPN`]) is handed to a shard (`super::handoff`), which
//!   finishes the TLS handshake, reads the hello (`super::claim::fleetgate_hello`) and runs its tunnel;
//! - a konnectivity (ANP) proxy-agent (ALPN `h2` only) stays here: TLS, then gRPC
//!   (`super::konnectivity`). One port serves both, so an ANP agent needs only
//!   `--proxy-server-host/-port` pointed here.
//!
//! Either way the TLS handshake requires a client certificate chaining to the agent CA
//! (`serve --agent-ca`, read again when it changes: [`watch_agent_ca`]; each accept takes the
//! configuration of that moment, and a handed-off agent carries it to its shard), whose CN names the cluster and whose O includes
//! [`wire::AGENT_ORGANIZATION`]; a fleetgate agent's hello must name that same cluster, a
//! `Tunnel` cluster of the current table. Anything else is refused and logged with the peer's
//! address, never with key material. When a tunnel's connection ends for any reason it leaves
//! the registry, and h2 fails its open streams (their relays see an error and end their clients'
//! responses).
//!
//! Before authentication, strangers must not keep an agent out (issue 31: 258 idle connections
//! once held every handshake seat for 10 s). Every connection is accepted at once and either admitted or
//! closed, never queued: a connection that sent nothing is quiet, not a handshake, and has
//! [`FIRST_RECORD_TIMEOUT`] to send a TLS record header; then it is a handshake, with
//! [`CLIENT_HELLO_TIMEOUT`] (from the accept) for its whole ClientHello. Both lineups and each
//! address are bounded and, when full, cut their oldest for the newcomer (`super::pending`), so
//! an agent, which sends its ClientHello the moment it connects, is never stuck behind them.
//! Refusals are logged with the peer's address, at most a few a second and a summary of the rest
//! (`super::refusals`).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleetgate_config_watcher::{
    crypto_provider, parse_certs, parse_key, ReloadStatus, ServingTls, SharedTable,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_rustls::StartHandshake;
use tracing::{debug, info, warn};

use super::claim::{peer_cluster, serving_cluster};
use super::handoff::{self, Handoff};
use super::pending::{Cut, Evicted, Limits, Pending, Seat, PER_ADDRESS};
use super::refusals::{RefusalLog, Summary};
use super::wire;

/// How long a new connection may take to send its first TLS record header: an agent sends its
/// ClientHello as soon as it has connected, so this is a round trip and a retransmission, and
/// a stranger that sends nothing is not held for a handshake's time (10 s before).
const FIRST_RECORD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long, from the accept, its whole ClientHello may take: what a stranger trickling one
/// holds a handshake's seat for, at most (if no newer one cuts it first).
const CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the log is given the summary of the refusals not logged one by one.
const SUMMARY_EVERY: Duration = Duration::from_secs(1);

/// The ALPN of a konnectivity agent (gRPC over h2).
const KONNECTIVITY_ALPN: &[u8] = b"h2";

/// The rustls configuration of the tunnel listener: the Gateway's serving certificate, client
/// certificates required and verified against `agent_ca_pem`, ALPN [`wire::ALPN`] (fleetgate
/// agents) or `h2` (konnectivity agents, whose gRPC library offers only that).
pub fn server_config(
    table: &SharedTable,
    agent_ca_pem: &[u8],
) -> anyhow::Result<Arc<ServerConfig>> {
    server_config_from(table.load().gateway().tls.as_ref(), agent_ca_pem)
}

fn server_config_from(
    tls: Option<&ServingTls>,
    agent_ca_pem: &[u8],
) -> anyhow::Result<Arc<ServerConfig>> {
    let tls = tls.context(
        "the tunnel listener serves the Gateway's spec.tls certificate, and there is none",
    )?;
    let certs =
        parse_certs(&tls.cert_pem).map_err(|e| anyhow::anyhow!("the serving certificate: {e}"))?;
    let key = parse_key(&tls.key_pem).map_err(|e| anyhow::anyhow!("the serving key: {e}"))?;
    let mut roots = RootCertStore::empty();
    for ca in parse_certs(agent_ca_pem).map_err(|e| anyhow::anyhow!("the agent CA: {e}"))? {
        roots.add(ca).context("the agent CA")?;
    }
    let provider = crypto_provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .context("the agent CA")?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![wire::ALPN.to_vec(), KONNECTIVITY_ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// Reads the agent CA at `path`, builds the listener's configuration, and starts the thread
/// that rebuilds it when the file's content (or the serving certificate) changes; a file that does
/// not build keeps the last good configuration and is reported (`agent_ca`).
pub fn watch_agent_ca(
    table: &SharedTable,
    path: &std::path::Path,
    status: Arc<ReloadStatus>,
) -> anyhow::Result<crate::tls::reload::LiveServerConfig> {
    let read = {
        let (table, path) = (table.clone(), path.to_owned());
        move || {
            let ca = std::fs::read(&path)
                .map_err(|e| format!("the agent CA {}: {e}", path.display()))?;
            Ok((table.load().gateway().tls.clone(), ca))
        }
    };
    let read_now = read.clone();
    let first = read_now().map_err(anyhow::Error::msg)?;
    let live = Arc::new(arc_swap::ArcSwap::new(server_config_from(
        first.0.as_ref(),
        &first.1,
    )?));
    let named = path.display().to_string();
    crate::tls::reload::watch(
        fleetgate_config_watcher::material::AGENT_CA,
        &live,
        status,
        first,
        read,
        move |(tls, ca): &(Option<ServingTls>, Vec<u8>)| {
            server_config_from(tls.as_ref(), ca).map_err(|e| format!("{named}: {e:#}"))
        },
    )
    .context("starting the agent CA reloader")?;
    Ok(live)
}

/// Binds `address` (refused when another process holds it), starts the tunnel thread and
/// returns the bound address.
pub fn start(
    address: &str,
    config: crate::tls::reload::LiveServerConfig,
    table: SharedTable,
) -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(address)
        .with_context(|| format!("binding the tunnel listener on {address}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("the tunnel listener's runtime")?;
    std::thread::Builder::new()
        .name("fleetgate-tunnel".into())
        .spawn(move || {
            // Connections' tasks are local to the thread: they share its `Gate` without a lock.
            tokio::task::LocalSet::new().block_on(&runtime, async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => accept_agents(listener, config, table).await,
                    Err(error) => warn!(%error, "the tunnel listener could not start"),
                }
            })
        })
        .context("starting the tunnel thread")?;
    info!(address = %bound, "tunnel listener up");
    Ok(bound)
}

/// The tunnel thread's own state, shared by its accept loop and its connections' tasks (all on
/// its one thread).
struct Gate {
    pending: RefCell<Pending<oneshot::Sender<Cut>>>,
    refusals: RefCell<RefusalLog>,
}

impl Gate {
    /// Logs why `peer` was refused: one by one up to `refusals::PER_SECOND` a second, then
    /// summed up.
    fn refuse(&self, peer: SocketAddr, refusal: Refusal) {
        let (alone, summary) =
            self.refusals
                .borrow_mut()
                .note(std::time::Instant::now(), refusal.kind(), peer.ip());
        log_summary(summary);
        if alone {
            match refusal {
                // A TCP health check does this; not worth an info line.
                Refusal::Closed => debug!(%peer, reason = %refusal, "agent refused"),
                _ => info!(%peer, reason = %refusal, "agent refused"),
            }
        }
    }
}

/// Tells each of `evicted` why it is cut (its task then ends and logs it).
fn cut(evicted: impl IntoIterator<Item = Evicted<oneshot::Sender<Cut>>>) {
    for evicted in evicted {
        let _ = evicted.cut.send(evicted.why);
    }
}

fn log_summary(summary: Option<Summary>) {
    if let Some(summary) = summary {
        let busiest = summary
            .busiest
            .map(|(ip, n)| format!("{ip} ({n})"))
            .unwrap_or_default();
        info!(
            count = summary.count,
            reasons = %summary.reasons,
            busiest = %busiest,
            "more connections refused at the tunnel listener in the last second than are logged one by one"
        );
    }
}

/// Why a connection was refused before its agent was authenticated.
#[derive(Debug)]
enum Refusal {
    /// Its address's seats are all held by connections finishing their handshake on a shard.
    Address,
    Cut(Cut),
    /// Closed (or failed) before it sent a TLS record header.
    Closed,
    /// No TLS record header within [`FIRST_RECORD_TIMEOUT`].
    Silent,
    NotTls,
    /// No whole ClientHello within [`CLIENT_HELLO_TIMEOUT`].
    SlowHello,
    /// No TLS handshake (and konnectivity Connect call) within the handshake timeout.
    Timeout,
    /// The TLS handshake or the agent's call failed, or no shard runs: why.
    Failed(String),
}

impl Refusal {
    /// Its kind, for the summary of refusals not logged one by one.
    fn kind(&self) -> &'static str {
        match self {
            Refusal::Address => "address at its bound",
            Refusal::Cut(_) => "cut for a newer connection",
            Refusal::Closed => "closed before a TLS record",
            Refusal::Silent => "no TLS record in time",
            Refusal::NotTls => "not TLS",
            Refusal::SlowHello => "no ClientHello in time",
            Refusal::Timeout => "no handshake in time",
            Refusal::Failed(_) => "handshake failed",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Address => write!(
                f,
                "its address has {PER_ADDRESS} connections finishing their handshake"
            ),
            Refusal::Cut(why) => write!(f, "{why}"),
            Refusal::Closed => write!(f, "closed before it sent a TLS record"),
            Refusal::Silent => write!(
                f,
                "no TLS record within {} s of connecting",
                FIRST_RECORD_TIMEOUT.as_secs()
            ),
            Refusal::NotTls => write!(f, "its first bytes are not a TLS handshake record"),
            Refusal::SlowHello => write!(
                f,
                "no whole ClientHello within {} s of connecting",
                CLIENT_HELLO_TIMEOUT.as_secs()
            ),
            Refusal::Timeout => write!(f, "no TLS handshake and hello within the timeout"),
            Refusal::Failed(reason) => write!(f, "{reason}"),
        }
    }
}

/// Accepts every connection at once: admitted (cutting the connections `Pending` says) with a
/// task of its own, or closed. Never waits for a seat, so the kernel's accept queue never fills
/// behind strangers.
async fn accept_agents(
    listener: tokio::net::TcpListener,
    config: crate::tls::reload::LiveServerConfig,
    table: SharedTable,
) {
    let gate = Rc::new(Gate {
        pending: RefCell::new(Pending::new(Limits::LISTENER)),
        refusals: RefCell::default(),
    });
    let mut summaries = tokio::time::interval(SUMMARY_EVERY);
    summaries.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = summaries.tick() => {
                log_summary(gate.refusals.borrow_mut().flush(std::time::Instant::now()));
                continue;
            }
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors and the like: pause rather than spin.
                warn!(%error, "accepting an agent failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (cut_it, cut_signal) = oneshot::channel();
        let arrived = gate.pending.borrow_mut().arrive(peer.ip(), cut_it);
        let Some(admitted) = arrived else {
            gate.refuse(peer, Refusal::Address);
            continue;
        };
        cut(admitted.evicted);
        let connection = Connection {
            gate: gate.clone(),
            id: admitted.id,
            peer,
            accepted: Instant::now(),
        };
        // The agent CA of this moment (rotated by `watch_agent_ca`).
        tokio::task::spawn_local(connection.admit(
            tcp,
            admitted.seat,
            cut_signal,
            config.load_full(),
            table.clone(),
        ));
    }
}

/// One accepted connection, until its agent is authenticated (or handed to a shard that does
/// that) or it is refused. While it is in `Pending`'s lineups it may be cut for a newer one.
struct Connection {
    gate: Rc<Gate>,
    id: u64,
    peer: SocketAddr,
    accepted: Instant,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.gate.pending.borrow_mut().leave(self.id);
    }
}

/// What a connection turned out to be (boxed: a ClientHello and a TLS connection are large, and
/// the task's future holds this).
enum Known {
    /// A fleetgate agent's ClientHello: its shard finishes the handshake.
    Fleetgate(Box<StartHandshake<TcpStream>>),
    /// A konnectivity agent through its TLS handshake (its certificate verified).
    Konnectivity(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Connection {
    /// Reads the ClientHello; a fleetgate agent goes to a shard (with its seat, held until its
    /// handshake is done there), a konnectivity agent through its TLS handshake and Connect call
    /// here, or it is refused and logged.
    async fn admit(
        self,
        tcp: TcpStream,
        seat: Seat,
        cut_signal: oneshot::Receiver<Cut>,
        config: Arc<ServerConfig>,
        table: SharedTable,
    ) {
        let _ = tcp.set_nodelay(true);
        let known = tokio::select! {
            biased;
            why = cut_signal => Err(Refusal::Cut(why.unwrap_or(Cut::Quiet))),
            known = self.until_known(tcp, &config) => known,
        };
        let (gate, peer, accepted) = (self.gate.clone(), self.peer, self.accepted);
        // Known or refused: out of the lineups, so nothing cuts it now.
        drop(self);
        let refusal = match known {
            Err(refusal) => refusal,
            Ok(Known::Fleetgate(start)) => {
                let Err(refusal) = hand_off(*start, peer, seat, config, table) else {
                    return;
                };
                refusal
            }
            Ok(Known::Konnectivity(tls)) => {
                let connected = tokio::time::timeout_at(
                    accepted + wire::HANDSHAKE_TIMEOUT,
                    konnectivity_hello(*tls, peer, &table),
                )
                .await;
                drop(seat);
                match connected {
                    Ok(Ok((agent, cluster))) => {
                        return super::konnectivity::serve(*agent, cluster, peer).await
                    }
                    Ok(Err(reason)) => Refusal::Failed(reason),
                    Err(_) => Refusal::Timeout,
                }
            }
        };
        gate.refuse(peer, refusal);
    }

    /// Reads the first record header (within [`FIRST_RECORD_TIMEOUT`]: quiet till then), the
    /// ClientHello (a handshake now, within [`CLIENT_HELLO_TIMEOUT`]), and a konnectivity
    /// agent's TLS handshake (within the handshake timeout).
    async fn until_known(
        &self,
        mut tcp: TcpStream,
        config: &Arc<ServerConfig>,
    ) -> Result<Known, Refusal> {
        let mut header = [0u8; 5];
        match tokio::time::timeout_at(
            self.accepted + FIRST_RECORD_TIMEOUT,
            tcp.read_exact(&mut header),
        )
        .await
        {
            Err(_) => return Err(Refusal::Silent),
            Ok(Err(_)) => return Err(Refusal::Closed),
            Ok(Ok(_)) => {}
        }
        if !is_handshake_record(header) {
            return Err(Refusal::NotTls);
        }
        let evicted = self.gate.pending.borrow_mut().handshake(self.id);
        cut(evicted.map_err(|_| Refusal::Cut(Cut::Quiet))?);
        let failed = |e: std::io::Error| Refusal::Failed(format!("TLS handshake failed: {e}"));
        let mut acceptor = rustls::server::Acceptor::default();
        acceptor.read_tls(&mut &header[..]).map_err(failed)?;
        let hello = tokio_rustls::LazyConfigAcceptor::new(acceptor, tcp);
        let start = tokio::time::timeout_at(self.accepted + CLIENT_HELLO_TIMEOUT, hello)
            .await
            .map_err(|_| Refusal::SlowHello)?
            .map_err(failed)?;
        let offers = |alpn: &[u8]| {
            start
                .client_hello()
                .alpn()
                .is_some_and(|mut offered| offered.any(|p| p == alpn))
        };
        if offers(KONNECTIVITY_ALPN) && !offers(wire::ALPN) {
            let tls = tokio::time::timeout_at(
                self.accepted + wire::HANDSHAKE_TIMEOUT,
                start.into_stream(config.clone()),
            )
            .await
            .map_err(|_| Refusal::Timeout)?
            .map_err(failed)?;
            return Ok(Known::Konnectivity(Box::new(tls)));
        }
        Ok(Known::Fleetgate(Box::new(start)))
    }
}

/// Whether `header` can begin a ClientHello: a TLS handshake record (type 22, version 3.x)
/// no longer than TLS allows (2^14 bytes), so a stranger's other bytes never take a handshake's
/// seat or rustls' buffers.
fn is_handshake_record(header: [u8; 5]) -> bool {
    let length = u16::from_be_bytes([header[3], header[4]]);
    header[0] == 22 && header[1] == 3 && (1..=1 << 14).contains(&length)
}

/// Sends a fleetgate agent's socket and ClientHello to a shard, with its seat.
fn hand_off(
    start: StartHandshake<TcpStream>,
    peer: SocketAddr,
    seat: Seat,
    config: Arc<ServerConfig>,
    table: SharedTable,
) -> Result<(), Refusal> {
    let tcp = start.io.into_std().map_err(|e| {
        Refusal::Failed(format!("the socket could not leave the tunnel thread: {e}"))
    })?;
    let agent = Handoff {
        tcp,
        hello: start.accepted,
        peer,
        config,
        table,
        seat,
    };
    handoff::hand_off(agent)
        .map_err(|_| Refusal::Failed("no shard runs to serve the tunnel".into()))
}

/// A konnectivity agent through its Connect call, and the cluster it serves.
type KonnectivityAgent = (Box<super::konnectivity::session::Accepted>, Arc<str>);

/// A konnectivity agent's TLS connection: the certificate's cluster, then its Connect call;
/// a refusal goes to the agent as the call's gRPC status, which it logs.
async fn konnectivity_hello(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: SocketAddr,
    table: &SharedTable,
) -> Result<KonnectivityAgent, String> {
    let cluster =
        peer_cluster(tls.get_ref().1).and_then(|name| serving_cluster(table, &name, true));
    let is_cluster = |name: &str| table.load().cluster(name).is_some();
    let agent = super::konnectivity::handshake(tls, &cluster, &is_cluster).await?;
    let cluster = cluster?;
    debug!(%peer, cluster = %cluster, "konnectivity agent accepted");
    Ok((Box::new(agent), cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_tls_handshake_record_header_makes_a_handshake() {
        // An agent's first five bytes, as rustls writes them.
        let config = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        let mut client =
            rustls::ClientConnection::new(Arc::new(config), "gw".try_into().unwrap()).unwrap();
        let mut hello = Vec::new();
        client.write_tls(&mut hello).unwrap();
        assert!(is_handshake_record(hello[..5].try_into().unwrap()));
        for stranger in [
            *b"GET /",
            *b"\x16\x03\x01\x00\x00", // an empty record
            *b"\x16\x03\x01\x40\x01", // longer than TLS allows
            *b"\x17\x03\x03\x00\x10", // application data
            *b"\x16\x02\x00\x00\x10", // SSL 2
            *b"\x80\x2e\x01\x03\x01", // an SSLv2-style ClientHello
        ] {
            assert!(!is_handshake_record(stranger), "{stranger:?}");
        }
    }
}
