//! The tunnel's wire format, written once for both ends: the gateway (`super`, on the shards and
//! the tunnel thread) and the agent (`agent/`, on tokio) import it, and it imports nothing
//! else of the crate. What they agree on:
//! - the ALPN, the h2 settings of a tunnel (windows sized for per-stream flow control, roles
//!   reversed: the gateway is the h2 client) and its handshake on each end ([`gateway_h2`],
//!   [`agent_h2`]), over [`coalesce::Coalesce`], which gathers small frames into one write;
//! - `handshake`: what precedes h2: the subject an agent's certificate carries, the one-line hello
//!   (the agent names the cluster it serves), the gateway's answer (yes, or why not), and the
//!   bounded line reader both ends read them with;
//! - `target`: what a stream's head names (the member's apiserver, or one in-cluster service that
//!   the agent serves only when its `--allow-service` list has it) and the agent's answer to it
//!   (200, or a status with the reason in [`ERROR_HEADER`]);
//! - `heartbeat`: the PINGs both ends send, and when a silent peer is dropped.
//!
//! The hello is parsed by the gateway from a stranger who passed mTLS only, and a stream's target
//! by the agent from the gateway: both bounded, ASCII, no allocation beyond the line, and never a
//! panic. Pure functions, constants and adapters over any tokio I/O object: no runtime of its own
//! (the caller's timer is passed in), no socket.

pub mod coalesce;
mod handshake;
pub mod heartbeat;
mod target;

use std::io;
use std::time::Duration;

use bytes::Bytes;

pub use handshake::{
    hello, parse_hello, read_line, AgentSubject, HelloAnswer, LineError, HELLO_OK, HELLO_REFUSED,
    MAX_HELLO,
};
pub use target::{
    parse_stream_path, refusal, service_uri, stream_request, ServiceRef, StreamAnswer,
    StreamTarget, ERROR_HEADER, STREAM_URI,
};

/// The ALPN both sides offer. (The tunnel listener also accepts `h2`, for konnectivity agents;
/// a client of the ordinary listener pointed at it still fails the handshake without an agent
/// certificate, and gets a gRPC error with one.)
pub const ALPN: &[u8] = b"fleetgate-tunnel/1";

/// The organization (O) an agent certificate carries beside its CN = cluster name. A certificate
/// without it is refused even if it chains to the agent CA, so a user certificate issued by a CA
/// that an operator also named as the agent CA can never claim a tunnel.
pub const AGENT_ORGANIZATION: &str = "fleetgate:agents";

/// How long either side waits for the TLS handshake and the hello.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Each side sends an h2 PING this often and drops the connection when its answer takes longer
/// than [`PING_TIMEOUT`]: a half-open connection (a load balancer that forgot it, a peer that
/// vanished) is noticed within about 4 s, on both ends.
pub const PING_INTERVAL: Duration = Duration::from_secs(1);
pub const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// Per-stream receive window: what one stalled stream (a watch whose client stopped reading) may
/// hold unread. Its sender stops there; the other streams go on.
pub const STREAM_WINDOW: u32 = 512 * 1024;
/// The connection's receive window: the largest h2 allows, so the connection window never stalls
/// one stream because of another; memory stays bounded by the per-stream windows.
pub const CONNECTION_WINDOW: u32 = (1 << 31) - 1;
/// DATA frame size: fewer frames for a big LIST.
pub const MAX_FRAME: u32 = 64 * 1024;

/// The windows and frame size of a tunnel, on either end's h2 builder (two types, one set of
/// methods).
macro_rules! tunnel_settings {
    ($builder:expr) => {
        $builder
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME)
    };
}

/// The gateway's end of a tunnel's h2 connection, after the hello: the h2 client (it opens a
/// stream per member connection), no server push.
pub async fn gateway_h2<S>(
    io: S,
) -> Result<
    (
        h2::client::SendRequest<Bytes>,
        h2::client::Connection<coalesce::Coalesce<S>, Bytes>,
    ),
    h2::Error,
>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tunnel_settings!(h2::client::Builder::new().enable_push(false))
        .handshake::<_, Bytes>(coalesce::Coalesce::new(io))
        .await
}

/// The agent's end of a tunnel's h2 connection, after the hello: the h2 server, which accepts
/// the gateway's streams without a limit on how many are open.
pub async fn agent_h2<S>(
    io: S,
) -> Result<h2::server::Connection<coalesce::Coalesce<S>, Bytes>, h2::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tunnel_settings!(h2::server::Builder::new().max_concurrent_streams(u32::MAX))
        .handshake::<_, Bytes>(coalesce::Coalesce::new(io))
        .await
}

/// An h2 failure of a stream, as the I/O error a byte pipe reports (both ends' stream adapters).
pub fn broken(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::ErrorKind::BrokenPipe.into());
    }
    io::Error::new(io::ErrorKind::ConnectionReset, e)
}

/// kube's DNS label (RFC 1123): namespaces and service names.
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (1..=63).contains(&bytes.len())
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes.iter().all(|b| edge(b) || *b == b'-')
}

/// A port: 1 to 65535 in plain decimal (no sign, no leading zero, at most five digits).
pub fn parse_port(text: &str) -> Option<u16> {
    let plain = (1..=5).contains(&text.len())
        && text.bytes().all(|b| b.is_ascii_digit())
        && !text.starts_with('0');
    if !plain {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

/// Whether `name` can be a cluster's name in a hello and a certificate file name: 1 to 253
/// letters, digits, `-` and `.`, not starting with `.`.
pub fn is_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// Keeps what a peer may print of an error: visible ASCII and spaces, at most 200 bytes (a
/// header value and a log field that nothing can smuggle through).
pub fn printable(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_graphic() || *c == ' ')
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests;
