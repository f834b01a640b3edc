//! The member's request head, written by the gateway for both front-ends: the request line with
//! the cluster's path prefix, `Host` = the member, the client's end-to-end fields, the body
//! framing the gateway decided, `X-Forwarded-For`, and the identity the gateway decided
//! (`auth::push_upstream_identity`).
//!
//! What never reaches a member from the client: its framing fields (`Content-Length`,
//! `Transfer-Encoding`: the gateway writes the framing it decided, so a member can only ever read
//! the body the gateway relays), hop-by-hop fields and those its `Connection` names, `Host`,
//! `Expect` (the gateway answers it), `X-Remote-*` (an aggregated apiserver behind the member
//! would trust them), and `Authorization` / `Impersonate-*` except on a PassThrough cluster. A
//! `Connection` naming a field that decides framing, routing or identity is refused outright
//! ([`check_connection`]).
//!
//! A request to a service (the direct service path of a pull-mode cluster) is not the member's:
//! its head has the service's own path (no cluster path prefix), `Host` = `NAME.NS.svc:PORT`,
//! and no credential or identity at all: the client's `Authorization`, `Impersonate-*` and
//! `X-Remote-*` are dropped whatever the cluster's mode, and the cluster's credentials and the
//! impersonation headers are never written (they are for the apiserver, not a workload). Never
//! does I/O; writes into a reused buffer.

use std::io::Write as _;

use fleetgate_config_watcher::ClusterRoute;

use crate::auth::{self, ClientIdentity};
use crate::codec::http1::head::trim;
use crate::codec::http1::{push_header, BodyKind};
use crate::errors::GatewayError;
use crate::request::route;

/// How the member is asked to switch protocols, if at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    None,
    /// An HTTP/1.1 upgrade: the client's own `Upgrade` values (SPDY/3.1, websocket).
    FromClient,
    /// An RFC 8441 WebSocket from an h2 client: `Upgrade: websocket`, and the handshake fields an
    /// h2 client does not send (version 13, a fresh key).
    WebSocket,
}

/// What the gateway decided about the request the member gets.
pub struct MemberRequest<'a> {
    pub method: &'a [u8],
    /// An HTTP/1.0 client is forwarded as HTTP/1.0, so the member answers without chunked
    /// framing, which such a client could not read.
    pub http10: bool,
    pub rest: &'a [u8],
    pub query: &'a [u8],
    pub body: BodyKind,
    /// The client's IP address as text (`X-Forwarded-For`).
    pub peer: &'a [u8],
    pub identity: Option<&'a ClientIdentity>,
    pub upgrade: Upgrade,
    /// The service the request goes to instead of the member: no credentials, no identity.
    pub service: Option<crate::tunnel::wire::ServiceRef<'a>>,
}

/// Fields that describe one hop, never forwarded as they came (RFC 9110 section 7.6.1, plus the
/// framing the gateway writes itself and `Expect`, which it answers).
fn is_hop_field(name: &[u8]) -> bool {
    const HOP: [&[u8]; 12] = [
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"content-length",
        b"expect",
        b"http2-settings",
    ];
    HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// Refuses a `Connection` field that names a field deciding framing, routing or identity: a
/// proxy that honours it drops that field and may forward the rest as something else (request
/// smuggling through `Connection: content-length`). Returns whether it names any other field (to
/// be dropped as hop-by-hop).
pub fn check_connection<'h>(
    connection_values: impl Iterator<Item = &'h [u8]>,
) -> Result<bool, GatewayError> {
    const PLAIN: [&[u8]; 4] = [b"close", b"keep-alive", b"upgrade", b"te"];
    let mut names_others = false;
    for token in connection_values.flat_map(|v| v.split(|b| *b == b',')) {
        let token = trim(token);
        if token.is_empty() || PLAIN.iter().any(|p| token.eq_ignore_ascii_case(p)) {
            continue;
        }
        let forbidden = [
            &b"content-length"[..],
            b"transfer-encoding",
            b"host",
            b"authorization",
        ]
        .iter()
        .any(|f| token.eq_ignore_ascii_case(f))
            || auth::is_identity_header(token)
            || auth::is_remote_identity(token);
        if forbidden {
            return Err(GatewayError::BadRequest {
                reason: "Connection names a field that decides framing, routing or identity",
            });
        }
        names_others = true;
    }
    Ok(names_others)
}

/// Writes the member's request head into `out` (cleared first). `headers` is called twice (the
/// fields, then the earlier `X-Forwarded-For` hops); `connection_named` says whether the client's
/// `Connection` named a field (dropped as hop-by-hop).
pub fn write<'h, F, H>(
    out: &mut Vec<u8>,
    cluster: &ClusterRoute,
    request: &MemberRequest<'_>,
    headers: F,
    connection_named: impl Fn(&[u8]) -> bool,
) where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    out.clear();
    out.extend_from_slice(request.method);
    out.push(b' ');
    let path_prefix = match request.service {
        Some(_) => "",
        None => &cluster.upstream.path_prefix,
    };
    route::push_upstream_target(out, path_prefix, request.rest, request.query);
    out.extend_from_slice(if request.http10 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    match &request.service {
        Some(service) => push_header(out, b"Host", service.in_cluster_address().as_bytes()),
        None => push_header(out, b"Host", cluster.upstream.authority.as_bytes()),
    }
    let to_service = request.service.is_some();
    let mut has_websocket_version = false;
    let mut has_websocket_key = false;
    for (name, value) in headers() {
        if name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"x-forwarded-for")
            || is_hop_field(name)
            || auth::is_remote_identity(name)
            || auth::drops_client_header(cluster, name)
            || (to_service && auth::is_identity_header(name))
            || connection_named(name)
        {
            continue;
        }
        has_websocket_version |= name.eq_ignore_ascii_case(b"sec-websocket-version");
        has_websocket_key |= name.eq_ignore_ascii_case(b"sec-websocket-key");
        push_header(out, name, value);
    }
    match request.body {
        BodyKind::Length(n) => {
            let _ = write!(out, "Content-Length: {n}\r\n");
        }
        BodyKind::Chunked => push_header(out, b"Transfer-Encoding", b"chunked"),
        BodyKind::Empty | BodyKind::CloseDelimited => {}
    }
    // X-Forwarded-For: earlier hops as the client sent them, then the client's address.
    out.extend_from_slice(b"X-Forwarded-For: ");
    for (_, value) in headers().filter(|(n, _)| n.eq_ignore_ascii_case(b"x-forwarded-for")) {
        out.extend_from_slice(value);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(request.peer);
    out.extend_from_slice(b"\r\n");
    if !to_service {
        auth::push_upstream_identity(out, cluster, request.identity);
    }
    match request.upgrade {
        Upgrade::None => {}
        Upgrade::FromClient => {
            // Hop-by-hop, yet an upgrade only happens if the member is asked for it on this hop.
            push_header(out, b"Connection", b"Upgrade");
            for (_, value) in headers().filter(|(n, _)| n.eq_ignore_ascii_case(b"upgrade")) {
                push_header(out, b"Upgrade", value);
            }
        }
        Upgrade::WebSocket => {
            push_header(out, b"Connection", b"Upgrade");
            push_header(out, b"Upgrade", b"websocket");
            if !has_websocket_version {
                push_header(out, b"Sec-WebSocket-Version", b"13");
            }
            if !has_websocket_key {
                // 16 random bytes, base64: the member checks only the form, and the gateway
                // checks nothing of the answer's accept key (the h2 client never sees it).
                use base64::Engine as _;
                let key = base64::engine::general_purpose::STANDARD
                    .encode(uuid::Uuid::new_v4().as_bytes());
                push_header(out, b"Sec-WebSocket-Key", key.as_bytes());
            }
        }
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests;
