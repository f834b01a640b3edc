//! The fleet view's side of its member requests: a client's request ([`ClientRequest`]) is what
//! they are made on behalf of. The requests themselves are `member::ask`'s, the one small client
//! for the gateway's own member requests; this says what of the client's request they take.

use std::time::Instant;

use fleetgate_config_watcher::Limits;

use super::ClientRequest;
use crate::member::ask::ClientSide;
use crate::request::Peer;

impl<'a> ClientSide<'a> for ClientRequest<'a> {
    fn fields(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        self.headers.iter().copied()
    }

    fn connection_named(&self, name: &[u8]) -> bool {
        (self.connection_named)(name)
    }

    fn peer(&self) -> Peer {
        self.peer
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn started(&self) -> Instant {
        self.started
    }
}
