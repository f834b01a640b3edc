//! Which cluster an agent may serve: the cluster its certificate names (CN, with O
//! [`wire::AGENT_ORGANIZATION`]), a `Tunnel` cluster of the current table, and for a fleetgate
//! agent the hello line that must name that same cluster. Used by the tunnel listener (konnectivity
//! agents, on its thread) and by `super::handoff` (fleetgate agents, on a shard). A stranger's
//! bytes: the hello is bounded ([`wire::MAX_HELLO`]) and every refusal is a reason, never a panic.

use std::sync::Arc;

use fleetgate_config_watcher::{ConnectMode, SharedTable};
use tokio::io::AsyncWriteExt;
use tracing::debug;

use super::wire::{self, AgentSubject, HelloAnswer, LineError};

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
    let line = wire::read_line(tls).await.map_err(|e| match e {
        LineError::Ended(_) => "the connection ended inside the hello".to_string(),
        LineError::TooLong => "the hello is too long".to_string(),
    });
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
            tls.write_all(HelloAnswer::Ok.line().as_bytes())
                .await
                .map_err(|e| format!("writing the hello answer: {e}"))?;
            tls.flush().await.map_err(|e| e.to_string())?;
            debug!(cluster = %cluster, "agent accepted");
            Ok(cluster)
        }
        Err(reason) => {
            let answer = HelloAnswer::Refused(reason.clone()).line();
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
    let subject = AgentSubject::parse(cert)
        .ok_or_else(|| "the client certificate does not parse".to_string())?;
    subject.cluster().map(str::to_owned)
}
