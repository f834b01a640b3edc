//! The gateway's own requests of members, below the stations that make them (`fleet`, `watch`):
//! - `ask`: the one small client for them: a request built up ([`ask::Ask`]), sent through the
//!   exchange as the user (or the gateway itself), its answer read whole or its head read and
//!   its body left to relay;
//! - `watcher`: one member watch kept up: list, watch, resume from the last resourceVersion,
//!   relist (or end) on 410, back off while the member cannot be reached, stop when its route
//!   is retired. The fleet view's merged watch and the shared-watch hub both run on it;
//! - `backoff`: the one backoff (exponential, jittered, capped, reset after a healthy stretch),
//!   a leaf that only computes delays: the watcher's, and the pull-mode agent's reconnects.
//!
//! Imports neither `fleet` nor `watch`: they import this.

pub mod ask;
pub mod backoff;
pub mod watcher;
