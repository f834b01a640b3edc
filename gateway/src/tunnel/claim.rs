//! Which cluster an agent may serve: the cluster its certificate names (CN, with O
//! [`wire::AGENT_ORGANIZATION`]), a `Tunnel` cluster of the current table, and for a fleetgate
//! agent the hello line that must name that same cluster. Used by the tunnel listener (konnectivity
//! agents, on its thread) and by `super::handoff` (fleetgate agents, on a shard). A stranger's
//! bytes: the hello is bounded ([`wire::MAX_HELLO`]) and every refusal is a reason, never a panic.

use std::sync::Arc;

use fleetgate_config_watcher::{ConnectMode, SharedTable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::debug;

use super::wire;

/// The cluster the peer's certificate names (see [`certified_cluster`]).
pub(super) fn peer_cluster(session: &rustls::ServerConnection) -> Result<String, String> {
    let cert = session
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or("no client certificate")?;
    certified_cluster(cert)
}

/// A fleetgate agent's hello, after its TLS handshake: the cluster it serves (the one its
/// certificate names, a `Tunnel` cluster of the current table) once `OK` went back, or why not
/// (sent to the agent too). Runs on the shard the agent was handed to.
pub(super) async fn fleetgate_hello<S>(
    tls: &mut tokio_rustls::server::TlsStream<S>,
    table: &SharedTable,
) -> Result<Arc<str>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let certified = peer_cluster(tls.get_ref().1);
    let line = read_hello(tls).await;
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
            debug!(cluster = %cluster, "agent accepted");
            Ok(cluster)
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
pub(super) fn serving_cluster(
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
async fn read_hello<S: tokio::io::AsyncRead + Unpin>(tls: &mut S) -> Result<Vec<u8>, String> {
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
