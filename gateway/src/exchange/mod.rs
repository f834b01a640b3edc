//! The exchange: how a decided request goes to a member and its answer comes back.
//! `splice` relays an upgraded connection after a 101; `retired` says how a stream ends when its
//! route is retired.

pub mod retired;
pub mod splice;

use fleetgate_config_watcher::{ClusterRoute, Limits};
use tokio::io::AsyncReadExt;

use crate::errors::GatewayError;
use crate::protocol::http1::{parse_response, Head, HeadLimits};
use crate::server::runtime;
use crate::upstream::UpstreamConn;

/// Read-buffer growth step for bodies.
pub(crate) const READ_CHUNK: usize = 32 * 1024;
/// Read size for long-running streams (watch, `logs -f`), which mostly sit idle.
pub(crate) const IDLE_STREAM_BUFFER: usize = 4 * 1024;
/// Limits on response heads from members (larger than the client's: members are trusted more
/// and send long `Warning` and audit headers).
pub(crate) const RESPONSE_HEAD_LIMITS: HeadLimits = HeadLimits {
    max_head_bytes: 1024 * 1024,
    max_headers: 1024,
};

/// How a proxied request failed.
pub(crate) enum Failure {
    /// Nothing was sent to the client yet: answer with a Status.
    Answer(GatewayError),
    /// The response had started (or the client is gone): the only safe thing is to close.
    Abort(&'static str),
}

impl From<GatewayError> for Failure {
    fn from(err: GatewayError) -> Self {
        Failure::Answer(err)
    }
}

/// Reads the member's response head (skipping interim 1xx responses) within the response-head
/// timeout, unless the request is long-running.
pub(crate) async fn read_response_head(
    cluster: &ClusterRoute,
    conn: &mut UpstreamConn,
    response: &mut Head,
    long_running: bool,
    limits: Limits,
    switch_requested: bool,
) -> Result<(), Failure> {
    let name = || cluster.name.to_string();
    let read_head = async {
        let mut scanned = 0;
        let mut received_any = !conn.buf.is_empty();
        loop {
            match parse_response(&mut conn.buf, &mut scanned, RESPONSE_HEAD_LIMITS, response) {
                Ok(true) if response.code == 101 && switch_requested => return Ok(()),
                Ok(true) if response.code == 101 => {
                    return Err(GatewayError::UpstreamProtocol {
                        cluster: name(),
                        reason: "switched protocols without being asked to",
                    })
                }
                // Interim responses are consumed: the gateway answered `Expect` itself.
                Ok(true) if response.code < 200 => continue,
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(_) => {
                    return Err(GatewayError::UpstreamProtocol {
                        cluster: name(),
                        reason: "malformed response head",
                    })
                }
            }
            conn.buf.reserve(8 * 1024);
            match conn.io.read_buf(&mut conn.buf).await {
                Ok(0) if !received_any => {
                    return Err(GatewayError::UpstreamClosed {
                        cluster: name(),
                        source: None,
                    })
                }
                Ok(0) => {
                    return Err(GatewayError::UpstreamProtocol {
                        cluster: name(),
                        reason: "connection closed inside the response head",
                    })
                }
                Ok(_) => received_any = true,
                Err(e) if !received_any => {
                    return Err(GatewayError::UpstreamClosed {
                        cluster: name(),
                        source: Some(e),
                    })
                }
                Err(_) => {
                    return Err(GatewayError::UpstreamProtocol {
                        cluster: name(),
                        reason: "connection failed inside the response head",
                    })
                }
            }
        }
    };
    let result = if long_running {
        read_head.await
    } else {
        match runtime::timeout(limits.response_head_timeout, read_head).await {
            Ok(result) => result,
            Err(_) => Err(GatewayError::ResponseHeadTimeout {
                cluster: name(),
                seconds: limits.response_head_timeout.as_secs(),
            }),
        }
    };
    result.map_err(Failure::Answer)
}
