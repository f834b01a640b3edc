//! konnectivity's agent protocol (apiserver-network-proxy, "ANP"): an unmodified ANP
//! proxy-agent, as OCM's cluster-proxy deploys it, serves a `Tunnel` cluster through the tunnel
//! listener. The agent is the h2 (gRPC) client and calls `AgentService.Connect`; the gateway
//! sends DIAL_REQ for the member's address as the agent sees it (`spec.tunnel.address`), the
//! agent dials TCP and answers DIAL_RSP, and the connection's bytes ride DATA packets. Since the
//! agent only carries TCP, the gateway runs TLS to the member itself over that pipe, with the
//! Cluster's CA and credentials as in direct mode.
//!
//! - `packet`: gRPC framing and the `Packet` protobuf, hand-written, bounded and fuzzed;
//! - `session`: the Connect call's handshake and the per-agent multiplexer on the tunnel thread;
//! - `conn`: one member connection as a byte pipe for a shard, with fleetgate's own bounds
//!   (ANP has no flow control per connection).
//!
//! The listener (`super::listener`) sends an agent here when its TLS handshake chose ALPN `h2`;
//! the registry (`super`) holds its session like a fleetgate agent's tunnel, and
//! [`open_member`] is what `super::open` calls for it.

pub mod conn;
pub mod packet;
pub mod session;

use fleetgate_config_watcher::ClusterRoute;

pub use conn::KonnectivityConn;
pub use session::{handshake, serve, SessionHandle};

use std::sync::Arc;

use super::stats::{Counted, StreamStats};
use super::{OpenError, TunnelIo};

/// A TLS connection to `cluster`'s member through the agent of `session`.
pub(super) async fn open_member(
    session: &SessionHandle,
    cluster: &ClusterRoute,
    stats: &Arc<StreamStats>,
) -> Result<TunnelIo, OpenError> {
    let member = cluster
        .tunnel_member
        .as_ref()
        .ok_or_else(|| OpenError::Refused("the cluster is not a Tunnel cluster any more".into()))?;
    let tls = member.tls_client.clone().ok_or_else(|| {
        OpenError::Refused(
            "a konnectivity agent needs the cluster's caData (the gateway runs TLS to the member)"
                .into(),
        )
    })?;
    let conn = session.dial(&member.address).await.map_err(|e| match e {
        session::DialError::Gone => OpenError::Gone,
        session::DialError::Refused(reason) => OpenError::Refused(reason),
    })?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(member.server_name.clone(), conn)
        .await
        .map_err(|e| {
            OpenError::Refused(format!(
                "TLS to {} through the agent failed: {e}",
                member.address
            ))
        })?;
    Ok(TunnelIo::Konnectivity(Box::new(Counted::new(
        stream,
        stats.clone(),
    ))))
}
