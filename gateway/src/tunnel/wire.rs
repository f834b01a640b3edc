//! What the gateway and its agents agree on, in one place: the ALPN, the one-line hello that
//! precedes h2 (the agent names the cluster it serves; the gateway says yes or why not), the
//! subject an agent's certificate must carry, the h2 settings (windows sized for per-stream flow
//! control) and the heartbeat.
//!
//! The hello is parsed by the gateway from a stranger who passed mTLS only: bounded, ASCII, no
//! allocation beyond the line, and never a panic. Pure functions and constants: no I/O, no runtime.

use std::time::Duration;

/// The ALPN both sides offer. (The tunnel listener also accepts `h2`, for konnectivity agents;
/// a client of the ordinary listener pointed at it still fails the handshake without an agent
/// certificate, and gets a gRPC error with one.)
pub const ALPN: &[u8] = b"fleetgate-tunnel/1";

/// The organization (O) an agent certificate carries beside its CN = cluster name. A certificate
/// without it is refused even if it chains to the agent CA, so a user certificate issued by a CA
/// that an operator also named as the agent CA can never claim a tunnel.
pub const AGENT_ORGANIZATION: &str = "fleetgate:agents";

/// The hello's first word, and its longest accepted length (with the cluster name and `\n`).
const HELLO_PREFIX: &str = "FLEETGATE-TUNNEL/1 ";
pub const MAX_HELLO: usize = 300;

/// The gateway's answer to an accepted hello.
pub const HELLO_OK: &str = "OK\n";
/// The prefix of a refusal; the rest of the line says why.
pub const HELLO_REFUSED: &str = "REFUSED ";

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

/// The path of a stream the gateway opens (one member connection per stream; the request head
/// and body it carries are the member's HTTP/1.1 bytes, written by the exchange).
pub const STREAM_URI: &str = "http://fleetgate-tunnel/member";
/// The header of an agent's non-200 answer to a stream: why it could not reach its member.
pub const ERROR_HEADER: &str = "fleetgate-error";

/// The hello line an agent serving `cluster` sends.
pub fn hello(cluster: &str) -> String {
    format!("{HELLO_PREFIX}{cluster}\n")
}

/// The cluster a hello line names (without its `\n`), or why it is refused.
pub fn parse_hello(line: &[u8]) -> Result<&str, &'static str> {
    let line = std::str::from_utf8(line).map_err(|_| "the hello is not UTF-8")?;
    let cluster = line
        .strip_prefix(HELLO_PREFIX)
        .ok_or("the hello does not start with FLEETGATE-TUNNEL/1")?;
    if !is_cluster_name(cluster) {
        return Err("the hello names no valid cluster");
    }
    Ok(cluster)
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
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip_and_hostile_lines() {
        let line = hello("member-1");
        assert_eq!(parse_hello(line.trim_end().as_bytes()), Ok("member-1"));
        for bad in [
            &b""[..],
            b"FLEETGATE-TUNNEL/1 ",
            b"FLEETGATE-TUNNEL/2 member1",
            b"FLEETGATE-TUNNEL/1 member1 extra",
            b"FLEETGATE-TUNNEL/1 ../etc",
            b"FLEETGATE-TUNNEL/1 m\r",
            b"\xff\xfe",
            b"GET / HTTP/1.1",
        ] {
            assert!(parse_hello(bad).is_err(), "{bad:?}");
        }
        assert_eq!(printable("a\r\nb\u{7f}c é"), "abc ");
    }
}
