//! The protocols clients speak to the gateway: the HTTP/1.1 codec (`http1`: heads and body
//! framing, also used for members' responses), and the two front-ends that turn a client
//! connection into requests for the exchange: `h1` (HTTP/1.1, with upgrades) and `h2` (h2 streams,
//! RFC 8441 WebSocket). The codec knows nothing of clusters, routes or identity.

pub mod h1;
pub mod h2;
pub mod http1;
