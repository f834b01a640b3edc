//! What the gateway and its agents agree on, in one place: the ALPN, the one-line hello that
//! precedes h2 (the agent names the cluster it serves; the gateway says yes or why not), the
//! subject an agent's certificate must carry, the h2 settings (windows sized for per-stream flow
//! control) and the heartbeat.
//!
//! A stream's head names its target: the member's apiserver ([`STREAM_URI`]), or one in-cluster
//! service ([`service_uri`]: `/service/{namespace}/{name}/{port}`), which the agent serves only
//! when its `--allow-service` list has it.
//!
//! The hello is parsed by the gateway from a stranger who passed mTLS only, and a stream's target
//! by the agent from the gateway: both bounded, ASCII, no allocation beyond the line, and never a
//! panic. Pure functions and constants: no I/O, no runtime.

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
/// The path of [`STREAM_URI`], as the agent reads it.
const MEMBER_PATH: &str = "/member";
/// The prefix of a stream to a service: `/service/{namespace}/{name}/{port}`.
const SERVICE_PATH: &str = "/service/";

/// One in-cluster service port: what a stream to a service names, what `--allow-service` lists,
/// and what the gateway's direct service path names. Namespace and name are DNS labels (kube's
/// rule for both: 1 to 63 lower-case letters, digits and `-`, starting and ending with a letter or
/// digit), the port a number from 1 to 65535.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServiceRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub port: u16,
}

impl<'a> ServiceRef<'a> {
    /// A service from its parts, each checked; or why not.
    pub fn new(namespace: &'a str, name: &'a str, port: &str) -> Result<Self, &'static str> {
        if !is_dns_label(namespace) {
            return Err("the service's namespace is not a valid name");
        }
        if !is_dns_label(name) {
            return Err("the service's name is not a valid name");
        }
        let port = parse_port(port).ok_or("the service's port is not a number from 1 to 65535")?;
        Ok(ServiceRef {
            namespace,
            name,
            port,
        })
    }

    /// `NS/NAME:PORT` (the `--allow-service` form, and how messages name it), strictly.
    pub fn parse(text: &'a str) -> Result<Self, &'static str> {
        let (namespace, rest) = text
            .split_once('/')
            .ok_or("a service is NAMESPACE/NAME:PORT")?;
        let (name, port) = rest
            .split_once(':')
            .ok_or("a service is NAMESPACE/NAME:PORT (the port is required)")?;
        ServiceRef::new(namespace, name, port)
    }

    /// The address a service has inside its cluster (`NAME.NAMESPACE.svc:PORT`).
    pub fn in_cluster_address(&self) -> String {
        format!("{}.{}.svc:{}", self.name, self.namespace, self.port)
    }
}

impl std::fmt::Display for ServiceRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
    }
}

/// What a stream the gateway opens is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamTarget<'a> {
    /// The member's apiserver.
    Member,
    /// One service port, if the agent allows it.
    Service(ServiceRef<'a>),
}

/// The URI of a stream to `service`.
pub fn service_uri(service: &ServiceRef<'_>) -> String {
    format!(
        "http://fleetgate-tunnel{SERVICE_PATH}{}/{}/{}",
        service.namespace, service.name, service.port
    )
}

/// What a stream's path (`:path` of the gateway's request) asks for, or why it is refused. Only
/// the two exact forms the gateway writes are accepted: no query, no extra segment, no encoding.
pub fn parse_stream_path(path: &str) -> Result<StreamTarget<'_>, &'static str> {
    if path == MEMBER_PATH {
        return Ok(StreamTarget::Member);
    }
    let rest = path
        .strip_prefix(SERVICE_PATH)
        .ok_or("the stream names no target this agent serves")?;
    let mut parts = rest.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(namespace), Some(name), Some(port), None) => {
            ServiceRef::new(namespace, name, port).map(StreamTarget::Service)
        }
        _ => Err("a service stream is /service/NAMESPACE/NAME/PORT"),
    }
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

    #[test]
    fn stream_targets_round_trip() {
        assert_eq!(parse_stream_path("/member"), Ok(StreamTarget::Member));
        let service = ServiceRef::parse("team-a/echo:8080").unwrap();
        assert_eq!(service.to_string(), "team-a/echo:8080");
        assert_eq!(service.in_cluster_address(), "echo.team-a.svc:8080");
        let uri: http::Uri = service_uri(&service).parse().unwrap();
        assert_eq!(
            parse_stream_path(uri.path()),
            Ok(StreamTarget::Service(service))
        );
        assert_eq!(STREAM_URI.parse::<http::Uri>().unwrap().path(), MEMBER_PATH);
    }

    #[test]
    fn hostile_stream_paths_are_refused() {
        let long = "a".repeat(64);
        let long_path = format!("/service/{long}/echo/80");
        for bad in [
            "",
            "/",
            "/member/",
            "/member?x",
            "/members",
            "/MEMBER",
            "/service",
            "/service/",
            "/service/ns",
            "/service/ns/echo",
            "/service/ns/echo/",
            "/service/ns/echo/80/",
            "/service/ns/echo/80/x",
            "/service/ns/echo/80?x=1",
            "/service//echo/80",
            "/service/ns//80",
            "/service/../echo/80",
            "/service/ns/../80",
            "/service/ns/echo%2F/80",
            "/service/Ns/echo/80",
            "/service/-ns/echo/80",
            "/service/ns-/echo/80",
            "/service/ns/ec.ho/80",
            "/service/ns/echo/0",
            "/service/ns/echo/080",
            "/service/ns/echo/65536",
            "/service/ns/echo/99999",
            "/service/ns/echo/123456",
            "/service/ns/echo/+80",
            "/service/ns/echo/-1",
            "/service/ns/echo/http",
            "/service/ns/echo/8 0",
            "/service/ns/\u{e9}cho/80",
            long_path.as_str(),
        ] {
            assert!(parse_stream_path(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_stream_path("/service/ns/echo/65535").is_ok());
        assert!(parse_stream_path(&format!("/service/{}/e/1", "a".repeat(63))).is_ok());
    }

    #[test]
    fn allow_service_specs_are_strict() {
        for bad in [
            "",
            "ns",
            "ns/echo",
            "ns/echo:",
            "/echo:80",
            "ns/:80",
            "ns/echo:0",
            "ns/echo:x",
            "ns/echo:80:81",
            "ns/a/echo:80",
            "NS/echo:80",
            "ns/echo:80 ",
        ] {
            assert!(ServiceRef::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(ServiceRef::parse("a/b:1").unwrap().port, 1);
    }
}
