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
//! - `ask`: one request of a member as the user (a GET read whole for `list`, `owner` and
//!   `discovery`, a watch opened for `watch`);
//! - `discovery`: `/api`, `/apis` and below from one member, filtered to the merged kinds;
//! - `review`: a SelfSubjectAccessReview (`kubectl auth can-i`) asked of every member, allowed
//!   where all of them allow it.
//!
//! A request aimed at one cluster (`/fleet/cluster.fleetgate.io/NAME/...`, or a create that
//! `spec.fleet.createIn` sends) is not here: `decide` makes it an ordinary proxied request.
//!
//! Called by the pipeline (`handle`) with a [`FleetClient`] for the front-end's side.

pub mod ask;
pub mod discovery;
pub mod list;
pub mod owner;
pub mod page;
pub mod review;
pub mod token;
pub mod watch;

use std::time::Instant;

use fleetgate_config_watcher::Limits;

use crate::request::Peer;

/// The client side of a fleet response (`exchange::reply`, which the front-ends implement).
pub(crate) use crate::exchange::reply::Reply as FleetClient;

/// What the fleet view needs of the client's request besides the decision: its header fields
/// (passed on to members as in an ordinary request), which of them its `Connection` named, and
/// who and when.
pub(crate) struct ClientRequest<'a, F> {
    pub headers: F,
    /// How the client's connection authenticated (a merged watch decides again, as the routing
    /// table changes, which clusters it spans).
    pub conn: &'a crate::auth::ConnectionAuth,
    pub connection_named: &'a dyn Fn(&[u8]) -> bool,
    pub peer: Peer,
    pub limits: Limits,
    pub started: Instant,
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
