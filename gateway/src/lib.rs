//! fleetgate: one endpoint for a fleet of Kubernetes clusters. This crate is the data plane and
//! the `fleetgate` binary's commands.
//!
//! The folders are the stations a request passes, in order:
//! - `server`: listeners, shards (one monoio runtime per core), the drain, the admin listener,
//!   and the hand-off of a connection to the front-end its ALPN chose;
//! - `tls`: the handshake, the client certificate's identity, the protocol ALPN chose;
//! - `protocol`: the two client front-ends, HTTP/1.1 (`h1`) and h2 (`h2`): only their protocol;
//! - `handle`: the pipeline both run every request through (decide, admit, dispatch, audit);
//! - `request`: what a request is (its route to a cluster and its kube request info), parsed once;
//! - `auth`: who the client is, whether an AccessPolicy lets it, what the member is told;
//! - `admit`: whether the decided request may go on now: the user's and the cluster's fair
//!   shares (`spec.fairness`), a 429 with `Retry-After` beyond them;
//! - `fleet`: the fleet view: one request answered from several members, each asked through the
//!   exchange (a LIST merged and streamed);
//! - `watch`: shared watches: one member watch per resource and scope feeds every client watch
//!   of it, each client filtered and admitted by the member's own review;
//! - `member`: the gateway's own requests of members: one small client, the one member-watch
//!   loop (list, watch, resume, relist on 410, backoff, retire) and the one backoff;
//! - `exchange`: the one way a decided request goes to a member and its answer comes back
//!   (retries, relay, upgrades spliced, streams ended when their route is retired);
//! - `upstream`: connections to members (direct, through an egress proxy) and the per-shard pool;
//! - `tunnel`: pull mode: the listener agents dial, their tunnels, and streams on them for
//!   `upstream` to use as connections (below `upstream`: it never imports it); `tunnel::wire`, the
//!   tunnel's wire format, is shared with the agent;
//! - `errors`: every Status the gateway itself answers;
//! - `observe`: metrics and the audit log.
//!
//! `codec` (the HTTP/1.1 codec) is a leaf every station may use.
//! `cli` holds the commands (`serve`, `demo`, `certs`, `kubeconfig`, `agent`), apart from the data
//! path. `agent` is the pull-mode agent program (`fleetgate agent`), beside the gateway: it
//! speaks `tunnel::wire` with it and uses nothing else of the data path but `member::backoff`.
//! The library never prints except the commands' `ready` lines.

pub mod admit;
pub mod agent;
pub mod auth;
pub mod cli;
pub mod codec;
pub mod errors;
pub mod exchange;
pub mod fleet;
pub mod handle;
pub mod member;
pub mod observe;
pub mod protocol;
pub mod request;
pub mod runtime;
pub mod server;
#[cfg(test)]
mod testing;
pub mod tls;
pub mod tunnel;
pub mod upstream;
pub mod watch;
