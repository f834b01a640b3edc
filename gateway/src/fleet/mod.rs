//! The fleet view: one request served from several members, for `/fleet/...` and karmada-search's
//! proxying path. `request::decide` has already chosen the members (the merged kind's clusters the
//! user's AccessPolicies allow) and the identity each is told about; this station asks each member
//! through the exchange, as the user, and merges the answers:
//! - `list`: a LIST merged and streamed, page by page, each object stamped with its cluster
//!   (`page`), with `limit` / `continue` across clusters and a composite resourceVersion
//!   (`token`);
//! - `watch`: a WATCH merged from every member's, each event stamped, with a composite
//!   resourceVersion to resume from, clusters joining and leaving while it is open;
//! - `owner`: the one member that has a named object, which the request then goes to as an
//!   ordinary proxied request;
//! - `ask`: what a member request takes of the client's request (the requests themselves are
//!   `member::ask`'s: a GET read whole for `list`, `owner` and `discovery`, a watch opened for
//!   `watch`);
//! - `discovery`: `/api`, `/apis` and below from one member, filtered to the merged kinds;
//! - `review`: a SelfSubjectAccessReview (`kubectl auth can-i`) asked of every member, allowed
//!   where all of them allow it.
//!
//! A request aimed at one cluster (`/fleet/cluster.fleetgate.io/NAME/...`, or a create that
//! `spec.fleet.createIn` sends) is not here: `decide` makes it an ordinary proxied request.
//!
//! Called by the pipeline (`handle`) with a [`View`] (the shard's exchange and the client's
//! request, its header fields gathered once) and a [`FleetClient`] for the front-end's side.

pub mod ask;
pub mod discovery;
pub mod list;
pub mod owner;
pub mod page;
pub mod review;
pub mod token;
pub mod watch;

use std::sync::Arc;
use std::time::Instant;

use fleetgate_config_watcher::{ClusterRoute, Limits};

use crate::errors::GatewayError;
use crate::exchange::{Failure, ShardExchange};
use crate::request::Peer;

/// The client side of a fleet response (`exchange::reply`, which the front-ends implement).
pub(crate) use crate::exchange::reply::Reply as FleetClient;

/// The fleet view serving one client request, what each of its stations takes first: the
/// shard's exchange the members are asked through, and the client's request they are asked on
/// behalf of.
pub(crate) struct View<'a> {
    pub ctx: &'a ShardExchange,
    pub client_request: ClientRequest<'a>,
    /// Where a member's LIST page may come from before the member is asked: the gateway's cache
    /// (`spec.cache`, lent by the pipeline); None: every page is the member's.
    pub cache: Option<&'a dyn CachedPages>,
}

/// A member's LIST pages served from memory (`watch::list`, docs/cache.md), exactly as the
/// member would answer them; `fleet` does not import the shared watches that hold them.
pub(crate) trait CachedPages {
    /// The page the member would answer to the kube path `rest` with `query` (its `?` on), as
    /// `identity`, or why the member is to be asked.
    fn page<'f>(
        &'f self,
        cluster: &'f Arc<ClusterRoute>,
        identity: &'f crate::auth::Decided,
        info: &'f fleetgate_config_watcher::request_info::RequestInfo<'f>,
        rest: &'f [u8],
        query: &'f [u8],
        client: &'f ClientRequest<'f>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Cached> + 'f>>;
}

/// A member page asked of the cache.
pub(crate) enum Cached {
    /// The page, as the member would have answered it.
    Page(Vec<u8>),
    /// The member's cache is still listing it: the member answers, and the list says so.
    NotSynced,
    /// Not the cache's to answer (not cached, the user refused, too fresh a read): the member's.
    Member,
}

/// What the fleet view needs of the client's request besides the decision: its header fields
/// (passed on to members as in an ordinary request), which of them its `Connection` named, and
/// who and when.
pub(crate) struct ClientRequest<'a> {
    /// The header fields, in order, as the front-end read them (h2's pseudo-header fields are
    /// not among them).
    pub headers: &'a [(&'a [u8], &'a [u8])],
    /// How the client's connection authenticated (a merged watch decides again, as the routing
    /// table changes, which clusters it spans).
    pub conn: &'a crate::auth::ConnectionAuth,
    pub connection_named: &'a dyn Fn(&[u8]) -> bool,
    pub peer: Peer,
    pub limits: Limits,
    pub started: Instant,
}

impl<'a> ClientRequest<'a> {
    /// The values of the header fields named `name` (any case), in order.
    pub fn header_values(&self, name: &'static [u8]) -> impl Iterator<Item = &'a [u8]> {
        let headers: &'a [_] = self.headers;
        headers
            .iter()
            .filter(move |(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| *value)
    }

    /// The value of the first header field named `name` (any case).
    pub fn header(&self, name: &'static [u8]) -> Option<&'a [u8]> {
        self.header_values(name).next()
    }
}

/// A response recorded from a kube-apiserver 1.24 (`gateway/tests/fixtures/kube-apiserver-v1.24/`
/// and `path` below it), for the fleet view's unit tests.
#[cfg(test)]
fn recorded(path: &str) -> Vec<u8> {
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kube-apiserver-v1.24"
    );
    std::fs::read(format!("{root}/{path}"))
        .expect("gateway/tests/fixtures holds the recorded fixture")
}

/// A request the fleet view refuses before anything went out (a 400 with `reason`).
fn bad_request(reason: &'static str) -> Failure {
    Failure::Answer(GatewayError::BadRequest { reason })
}

pub use crate::exchange::reply::warning_value;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_stays_one_header_line() {
        assert_eq!(
            warning_value("cluster \"m\" is\r\nunavailable\\"),
            "299 - \"cluster 'm' is  unavailable'\""
        );
    }
}
