//! The way to member clusters: connections (TCP, then rustls when the member's server URL is
//! https) and the per-shard keep-alive pool that reuses them.
//!
//! This is one of the few modules that touch monoio types: it dials with monoio and turns the
//! socket into a readiness-based (`poll-io`) stream, so tokio-rustls and, later, the `h2` crate run
//! on it, and an idle pooled connection holds no kernel-owned buffer. It never parses HTTP and
//! never decides routes: the exchange asks it for a connection to a
//! [`ClusterRoute`] and gives it back only after a clean, complete response. New connections to
//! one endpoint are dialed a few at a time per shard, requests beyond that waiting in line
//! (`dials`), so a flood of requests is never a flood of dials. Every dial passes the member's
//! circuit breaker (`breaker`, process-wide): consecutive connect failures open it, and dials
//! are then refused at once until a probe connects again. It also keeps the socket budget
//! (`budget`): the descriptors every socket takes and the member connections each client holds.

pub mod breaker;
pub mod budget;
mod connect;
mod dials;
mod pool;
pub mod resolve;

pub use connect::{connect, dial_address, UpstreamConn, UpstreamIo};
pub use dials::MAX_DIALS_PER_ENDPOINT;
/// Scripted member connections for the pool's and the exchange's in-process tests.
#[cfg(test)]
pub(crate) use pool::scripted;
pub use pool::{PoolKey, ShardPool, WaitForConnection};
