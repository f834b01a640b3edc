//! The heartbeat both ends of a tunnel run: an h2 PING every [`wire::PING_INTERVAL`], and the
//! reason to drop the connection once one goes unanswered for [`wire::PING_TIMEOUT`] (a half-open
//! connection is noticed within about 4 s). It must be polled beside the h2 connection, which
//! carries the PINGs; the caller's runtime gives the timer (a shard's on the gateway, tokio's in
//! the agent and for konnectivity agents).

use std::future::Future;
use std::time::Duration;

use super::wire;
use crate::runtime::{race, First};

/// Pings until a PING fails or goes unanswered; returns why. `sleep` is the runtime's timer.
pub async fn until_unanswered<F, Sleep>(pings: &mut h2::PingPong, sleep: F) -> String
where
    F: Fn(Duration) -> Sleep,
    Sleep: Future<Output = ()>,
{
    loop {
        sleep(wire::PING_INTERVAL).await;
        match race(pings.ping(h2::Ping::opaque()), sleep(wire::PING_TIMEOUT)).await {
            First::Left(Ok(_)) => {}
            First::Left(Err(error)) => return format!("PING failed: {error}"),
            First::Right(()) => {
                return format!(
                    "no PING answer within {} s (half-open connection)",
                    wire::PING_TIMEOUT.as_secs()
                )
            }
        }
    }
}
