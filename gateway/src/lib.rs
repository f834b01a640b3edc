//! fleetgate: one endpoint for a fleet of Kubernetes clusters. This crate is the data plane and
//! the `fleetgate` binary's commands.
//!
//! The modules follow a request's way: `listener` and `shard` (sockets and per-core runtimes),
//! `tls` (handshake, identity, ALPN dispatch), `http1` (the codec), `http2` (h2 clients, each stream proxied
//! as an HTTP/1.1 member request), `proxy` (the per-connection
//! driver), `route` (which cluster), `identity` (what the member is told about the user),
//! `upstream` (connections and pools), `splice` (upgraded
//! streams after a 101), with `error` (every Status the gateway writes), `metrics`
//! and `admin` beside them, `runtime` (timeouts and races, the only runtime services the protocol
//! code uses), and `serve` / `demo` as commands. The library never prints except
//! the commands' `ready` lines.

pub mod admin;
pub mod audit;
pub mod certs;
pub mod demo;
pub mod error;
pub mod http1;
pub mod http2;
pub mod identity;
pub mod kubeconfig;
pub mod listener;
pub mod metrics;
pub mod proxy;
pub mod retired;
pub mod route;
pub mod runtime;
pub mod serve;
pub mod shard;
pub mod shutdown;
pub mod splice;
pub mod tls;
pub mod upstream;
