//! The gateway's own HTTP/1.1 codec: heads ([`head`]) and body framing ([`body`]), plus the small
//! helpers that write heads back out.
//!
//! It turns bytes into heads and body boundaries and back, and knows nothing of clusters, routes or
//! identity (DESIGN.md's dependency rule). Bodies are never collected: the connection driver moves
//! body bytes straight from the read buffer to the other side, asking this codec only where they end.
//! Used by the HTTP/1.1 front-end (`protocol::h1`), the exchange (members' responses) and the
//! stations that read a `Head`.

pub mod body;
pub mod head;

pub use body::{
    chunk_size_line, request_body, response_body, BodyKind, BodyProgress, ChunkedScanner,
    FramingError, CHUNK_SIZE_ROOM,
};
pub use head::{
    find_head_end, parse_request, parse_response, ConnectionTokens, Head, HeadError, HeadLimits,
};

/// Hop-by-hop header fields (RFC 9110 section 7.6.1) that a proxy never forwards, besides the
/// ones `Connection` names. `Transfer-Encoding` is not here: the gateway passes chunked framing
/// through unchanged, so it forwards the field that describes it.
const HOP_BY_HOP: [&[u8]; 8] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"upgrade",
];

/// Whether `name` must not be forwarded: a fixed hop-by-hop field or one the message's
/// `Connection` header lists (looked for only when it names anything beyond the usual tokens).
pub fn is_hop_by_hop(head: &Head, name: &[u8]) -> bool {
    HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h))
        || (head.connection.others && head.has_token(b"connection", name))
}

/// Appends `name: value\r\n`.
pub fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests;
