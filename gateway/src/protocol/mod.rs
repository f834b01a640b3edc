//! The two client front-ends that turn a client connection into requests for the exchange:
//! `h1` (HTTP/1.1, with upgrades) and `h2` (h2 streams, RFC 8441 WebSocket). The HTTP/1.1 codec
//! they and the members' side share is `codec::http1`.

pub mod h1;
pub mod h2;
