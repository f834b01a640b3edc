//! The two client front-ends: `h1` (HTTP/1.1, with upgrades) and `h2` (h2 streams, RFC 8441
//! WebSocket). Each turns a client connection into requests for the pipeline (`handle::serve`)
//! as a `handle::Session`, and keeps only its protocol: framing, keep-alive, 100-continue,
//! upgrades and extended CONNECT, stream lifecycle, and h2's frame guard. They import `handle`,
//! `codec`, `exchange`, `runtime` and `errors`, never `fleet`, `watch`, `auth` or `upstream`.
//! Called by `tls` (ALPN) and `server::shard` (the plaintext listener).

pub mod h1;
pub mod h2;
