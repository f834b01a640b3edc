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
//! Called by the front-ends (`protocol::h1`, `protocol::h2`) with a [`FleetClient`] for their
//! side.

pub mod ask;
pub mod discovery;
pub mod list;
pub mod owner;
pub mod page;
pub mod review;
pub mod token;
pub mod watch;

use std::time::Instant;

use bytes::Bytes;
use fleetgate_config_watcher::Limits;

use crate::exchange::Failure;
use crate::request::Peer;

/// The client side of a fleet response: a 200 head, then the body in pieces. Anything answered
/// before the head (a refusal, a continue token from elsewhere) is a [`Failure::Answer`].
pub(crate) trait FleetClient {
    /// Sends the 200 head: `content_type`, and one `Warning` field per entry of `warnings`.
    async fn head(&mut self, content_type: &str, warnings: &[String]) -> Result<(), Failure>;

    /// Sends one piece of the body, waiting for the client to take it.
    async fn body(&mut self, piece: Bytes) -> Result<(), Failure>;

    /// The body is complete.
    async fn end(&mut self) -> Result<(), Failure>;

    /// Resolves when the client has gone away (a merged watch waits on it between events).
    async fn gone(&mut self);
}

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

/// A `Warning` value as kube-apiserver writes it (`299 - "text"`), the text made safe for a
/// header: one line, no quotes of its own.
pub fn warning_value(text: &str) -> String {
    let clean: String = text
        .chars()
        .map(|c| match c {
            '"' | '\\' => '\'',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    format!("299 - \"{clean}\"")
}

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
