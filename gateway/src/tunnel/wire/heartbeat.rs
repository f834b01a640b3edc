//! The heartbeat both ends of a tunnel run: an h2 PING every [`super::PING_INTERVAL`], and the
//! reason to drop the connection once one goes unanswered for [`super::PING_TIMEOUT`] (a half-open
//! connection is noticed within about 4 s). It must be polled beside the h2 connection, which
//! carries the PINGs; the caller's runtime gives the timer (a shard's on the gateway, tokio's in
//! the agent and for konnectivity agents).

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use futures_util::future::{select, Either};

use super::{PING_INTERVAL, PING_TIMEOUT};

/// Pings until a PING fails or goes unanswered; returns why. `sleep` is the runtime's timer.
pub async fn until_unanswered<F, Sleep>(pings: &mut h2::PingPong, sleep: F) -> String
where
    F: Fn(Duration) -> Sleep,
    Sleep: Future<Output = ()>,
{
    loop {
        sleep(PING_INTERVAL).await;
        let ping = pin!(pings.ping(h2::Ping::opaque()));
        match select(ping, pin!(sleep(PING_TIMEOUT))).await {
            Either::Left((Ok(_), _)) => {}
            Either::Left((Err(error), _)) => return format!("PING failed: {error}"),
            Either::Right(((), _)) => {
                return format!(
                    "no PING answer within {} s (half-open connection)",
                    PING_TIMEOUT.as_secs()
                )
            }
        }
    }
}
