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

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleetgate_config_watcher::{
    crypto_provider, parse_certs, parse_key, ReloadStatus, ServingTls, SharedTable,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tracing::{debug, info, warn};

use super::claim::{peer_cluster, serving_cluster};
use super::handoff::{self, Handoff};
use super::wire;

/// Agents in their handshake at once; more wait in the accept queue (a flood of handshakes
/// cannot take the tunnel thread's memory).
const MAX_HANDSHAKES: usize = 256;

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
            runtime.block_on(async move {
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

async fn accept_agents(
    listener: tokio::net::TcpListener,
    config: crate::tls::reload::LiveServerConfig,
    table: SharedTable,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors and the like: pause rather than spin.
                warn!(%error, "accepting an agent failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        // The agent CA of this moment (rotated by `watch_agent_ca`).
        let config = config.load_full();
        let table = table.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let accepted = tokio::time::timeout(
                wire::HANDSHAKE_TIMEOUT,
                first_hello(tcp, peer, config, table),
            )
            .await;
            drop(permit);
            match accepted {
                Ok(Ok(Some((agent, cluster)))) => {
                    super::konnectivity::serve(*agent, cluster, peer).await
                }
                Ok(Ok(None)) => {}
                Ok(Err(reason)) => info!(%peer, reason = %reason, "agent refused"),
                Err(_) => {
                    info!(%peer, "agent refused: no TLS handshake and hello within the timeout")
                }
            }
        });
    }
}

/// Reads the agent's ClientHello; a fleetgate agent goes to a shard (`None`), a konnectivity
/// agent through its TLS handshake and Connect call here (its session and cluster), or why it
/// is refused.
async fn first_hello(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    config: Arc<ServerConfig>,
    table: SharedTable,
) -> Result<Option<KonnectivityAgent>, String> {
    let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp)
        .await
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    let offers = |alpn: &[u8]| {
        start
            .client_hello()
            .alpn()
            .is_some_and(|mut offered| offered.any(|p| p == alpn))
    };
    if offers(KONNECTIVITY_ALPN) && !offers(wire::ALPN) {
        let tls = start
            .into_stream(config)
            .await
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        return konnectivity_hello(tls, peer, &table).await.map(Some);
    }
    let tcp = start
        .io
        .into_std()
        .map_err(|e| format!("the socket could not leave the tunnel thread: {e}"))?;
    let agent = Handoff {
        tcp,
        hello: start.accepted,
        peer,
        config,
        table,
    };
    handoff::hand_off(agent).map_err(|_| "no shard runs to serve the tunnel".to_string())?;
    Ok(None)
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
