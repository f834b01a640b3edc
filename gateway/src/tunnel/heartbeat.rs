//! The heartbeat both ends of a tunnel run: an h2 PING every [`wire::PING_INTERVAL`], and the
//! reason to drop the connection once one goes unanswered for [`wire::PING_TIMEOUT`] (a half-open
//! connection is noticed within about 4 s). Runs on tokio (the tunnel thread, the agent); it must
//! be polled beside the h2 connection, which carries the PINGs.

use super::wire;

/// Pings until a PING fails or goes unanswered; returns why.
pub async fn until_unanswered(pings: &mut h2::PingPong) -> String {
    loop {
        tokio::time::sleep(wire::PING_INTERVAL).await;
        match tokio::time::timeout(wire::PING_TIMEOUT, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return format!("PING failed: {error}"),
            Err(_) => {
                return format!(
                    "no PING answer within {} s (half-open connection)",
                    wire::PING_TIMEOUT.as_secs()
                )
            }
        }
    }
}
