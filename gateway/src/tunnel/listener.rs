//! The tunnel listener: where agents dial in. It runs on a thread and a current-thread tokio
//! runtime of its own, not on the shards: agents are few and long-lived, their connections carry
//! every stream of a cluster (so none belongs to one shard more than another), and their
//! handshakes and frames are a stranger's bytes that should never be parsed on a shard. The
//! shards reach the tunnels only through the registry (`super::registry`).
//!
//! Per agent: the TLS handshake with a required client certificate chaining to the agent CA
//! (`serve --agent-ca`), whose CN names the cluster and whose O includes
//! [`wire::AGENT_ORGANIZATION`]; the hello, which must name that same cluster, a `Tunnel`
//! cluster of the current table; then h2 with the gateway as the client, pinged every second.
//! An agent whose TLS handshake chose ALPN `h2` instead is a konnectivity (ANP) proxy-agent: same
//! certificate rules, then gRPC (`super::konnectivity`). One port serves both, told apart by the
//! ALPN the client offered, so an ANP agent needs only `--proxy-server-host/-port` pointed here.
//! Anything else is refused and logged with the peer's address, never with key material. When
//! the connection ends for any reason its tunnel leaves the registry, and h2 fails its open
//! streams (their relays see an error and end their clients' responses).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleetgate_config_watcher::{crypto_provider, parse_certs, parse_key, ConnectMode, SharedTable};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, info, warn};

use super::{registry, wire, Carrier, Tunnel};

/// Agents in their handshake at once; more wait in the accept queue (a flood of handshakes
/// cannot take the tunnel thread's memory).
const MAX_HANDSHAKES: usize = 256;

/// The ALPN of a konnectivity agent (gRPC over h2).
const KONNECTIVITY_ALPN: &[u8] = b"h2";

/// An agent through its handshake: which protocol, and the cluster it serves.
enum Accepted {
    Fleetgate(Box<AgentTls>, Arc<str>),
    Konnectivity(Box<super::konnectivity::session::Accepted>, Arc<str>),
}

/// The rustls configuration of the tunnel listener: the Gateway's serving certificate, client
/// certificates required and verified against `agent_ca_pem`, ALPN [`wire::ALPN`] (fleetgate
/// agents) or `h2` (konnectivity agents, whose gRPC library offers only that).
pub fn server_config(
    table: &SharedTable,
    agent_ca_pem: &[u8],
) -> anyhow::Result<Arc<ServerConfig>> {
    let table = table.load();
    let tls = table.gateway().tls.as_ref().context(
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

/// Binds `address` (refused when another process holds it), starts the tunnel thread and
/// returns the bound address.
pub fn start(
    address: &str,
    config: Arc<ServerConfig>,
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
    config: Arc<ServerConfig>,
    table: SharedTable,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
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
        let acceptor = acceptor.clone();
        let table = table.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let accepted = tokio::time::timeout(
                wire::HANDSHAKE_TIMEOUT,
                handshake(acceptor, tcp, peer, &table),
            )
            .await;
            drop(permit);
            match accepted {
                Ok(Ok(Accepted::Fleetgate(tls, cluster))) => {
                    serve_tunnel(*tls, cluster, peer).await
                }
                Ok(Ok(Accepted::Konnectivity(agent, cluster))) => {
                    super::konnectivity::serve(*agent, cluster, peer).await
                }
                Ok(Err(reason)) => info!(%peer, reason = %reason, "agent refused"),
                Err(_) => {
                    info!(%peer, "agent refused: no TLS handshake and hello within the timeout")
                }
            }
        });
    }
}

type AgentTls = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// TLS, the certificate's cluster, the hello (or konnectivity's Connect call): the agent's
/// connection and the cluster it serves, or why it is refused (sent to the agent too once TLS is
/// up).
async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    table: &SharedTable,
) -> Result<Accepted, String> {
    let mut tls = acceptor
        .accept(tcp)
        .await
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    let certified = {
        let (_, session) = tls.get_ref();
        let cert = session
            .peer_certificates()
            .and_then(|c| c.first())
            .ok_or("no client certificate")?;
        certified_cluster(cert)
    };
    if tls.get_ref().1.alpn_protocol() == Some(KONNECTIVITY_ALPN) {
        // A refusal goes to the agent as its Connect call's gRPC status, which it logs.
        let cluster = certified.and_then(|name| serving_cluster(table, &name, true));
        let is_cluster = |name: &str| table.load().cluster(name).is_some();
        let agent = super::konnectivity::handshake(tls, &cluster, &is_cluster).await?;
        let cluster = cluster?;
        debug!(%peer, cluster = %cluster, "konnectivity agent accepted");
        return Ok(Accepted::Konnectivity(Box::new(agent), cluster));
    }
    let line = read_hello(&mut tls).await;
    let decision = certified.and_then(|certified| {
        let line = line?;
        let claimed = wire::parse_hello(&line).map_err(str::to_owned)?;
        if claimed != certified {
            return Err(format!(
                "the agent claims cluster {claimed:?} with a certificate for {certified:?}"
            ));
        }
        serving_cluster(table, claimed, false)
    });
    match decision {
        Ok(cluster) => {
            tls.write_all(wire::HELLO_OK.as_bytes())
                .await
                .map_err(|e| format!("writing the hello answer: {e}"))?;
            tls.flush().await.map_err(|e| e.to_string())?;
            debug!(%peer, cluster = %cluster, "agent accepted");
            Ok(Accepted::Fleetgate(Box::new(tls), cluster))
        }
        Err(reason) => {
            let answer = format!("{}{}\n", wire::HELLO_REFUSED, wire::printable(&reason));
            let _ = tls.write_all(answer.as_bytes()).await;
            let _ = tls.shutdown().await;
            Err(reason)
        }
    }
}

/// The `Tunnel` cluster of the current table an agent certified for `name` serves. A konnectivity
/// agent only carries TCP, so the gateway must be able to run TLS to the member itself: its
/// cluster needs a CA (or `insecureSkipTLSVerify`).
fn serving_cluster(
    table: &SharedTable,
    name: &str,
    konnectivity: bool,
) -> Result<Arc<str>, String> {
    let table = table.load();
    let route = match table.cluster(name) {
        Some(route) if route.mode == ConnectMode::Tunnel => route,
        Some(_) => {
            return Err(format!(
                "cluster {name:?} is not a Tunnel cluster of this gateway"
            ))
        }
        None => return Err(format!("this gateway has no cluster {name:?}")),
    };
    let has_tls = route
        .tunnel_member
        .as_ref()
        .is_some_and(|m| m.tls_client.is_some());
    if konnectivity && !has_tls {
        return Err(format!(
            "cluster {name:?} has no caData, which a konnectivity agent needs (the gateway runs TLS to the member through it)"
        ));
    }
    Ok(route.name.clone())
}

/// The cluster an agent certificate names: its CN, if its O includes the agents' organization.
fn certified_cluster(cert: &[u8]) -> Result<String, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|_| "the client certificate does not parse".to_string())?;
    let subject = parsed.subject();
    let is_agent = subject
        .iter_organization()
        .any(|o| o.as_str() == Ok(wire::AGENT_ORGANIZATION));
    if !is_agent {
        return Err(format!(
            "the client certificate is not an agent's (no O={})",
            wire::AGENT_ORGANIZATION
        ));
    }
    let mut names = subject.iter_common_name();
    match (names.next().map(|n| n.as_str()), names.next()) {
        (Some(Ok(name)), None) if !name.is_empty() => Ok(name.to_owned()),
        _ => Err("the agent certificate must have exactly one CN, the cluster's name".into()),
    }
}

/// The hello line without its `\n`: read a byte at a time (the h2 bytes after it are not
/// consumed), at most [`wire::MAX_HELLO`] bytes.
async fn read_hello(tls: &mut AgentTls) -> Result<Vec<u8>, String> {
    let mut line = Vec::with_capacity(64);
    loop {
        let byte = tls
            .read_u8()
            .await
            .map_err(|_| "the connection ended inside the hello".to_string())?;
        if byte == b'\n' {
            return Ok(line);
        }
        if line.len() >= wire::MAX_HELLO {
            return Err("the hello is too long".into());
        }
        line.push(byte);
    }
}

/// Runs an accepted agent's h2 connection (the gateway as client) with its registry entry and
/// heartbeat, until it ends.
async fn serve_tunnel(tls: AgentTls, cluster: Arc<str>, peer: SocketAddr) {
    let handshake = h2::client::Builder::new()
        .enable_push(false)
        .initial_window_size(wire::STREAM_WINDOW)
        .initial_connection_window_size(wire::CONNECTION_WINDOW)
        .max_frame_size(wire::MAX_FRAME)
        .handshake::<_, bytes::Bytes>(tls)
        .await;
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
    let tunnel = Arc::new(Tunnel::new(cluster.clone(), peer, Carrier::Fleetgate(send)));
    registry().add(tunnel.clone());
    info!(%peer, cluster = %cluster, tunnel = tunnel.id, "tunnel up");
    let heartbeat = super::heartbeat::until_unanswered(&mut pings);
    let reason = tokio::select! {
        ended = &mut connection => match ended {
            Ok(()) => "the agent closed the connection".to_string(),
            Err(error) => format!("connection error: {error}"),
        },
        reason = heartbeat => reason,
    };
    // Out of the registry first, so no new stream picks it; dropping the connection then fails
    // the streams still open on it.
    registry().remove(&tunnel);
    drop(connection);
    info!(%peer, cluster = %cluster, tunnel = tunnel.id, reason = %reason, "tunnel down");
}
