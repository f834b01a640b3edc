//! The exchange: the one way a decided request goes to a member and its answer comes back, for
//! both client protocols. The pipeline (`handle`) decides the request (`request::decide`), writes
//! the member's head (`member_head`), and then hands over, with the front-end's body and sink:
//! - [`send`]: the connector (direct TCP/TLS, an egress proxy, or a pull-mode member's tunnel), a
//!   pooled connection or a new one (through the pool's line: a few dials per member at once),
//!   the head and the body (through the front-end's [`RequestBody`]), one retry on a fresh
//!   connection for a replayable request that found its pooled connection closed, and the
//!   response head within its timeout (none for long-running requests);
//! - `relay`: the response body to the front-end's sink, read by read, with flow control (a
//!   member read waits until the client took the previous one), the route's retirement (a
//!   long-running stream ends cleanly between chunks), a write timeout for ordinary responses, and
//!   the connection back to the pool after a clean, complete response;
//! - `splice`: an upgraded connection after a 101, both ways, until either side closes;
//! - `reply`: the front-ends' side of a response the gateway writes itself (fleet view, shared
//!   watch).
//!
//! Nothing else in the crate talks to members. Takes only its part of the shard context
//! ([`ShardExchange`], `shard`). Never parses a client's request and never decides identity; errors are [`Failure`]s that say whether anything reached the client yet.

pub mod lines;
pub mod member_head;
pub mod relay;
pub mod reply;
pub mod retired;
mod shard;
pub mod splice;

pub use shard::ShardExchange;

use std::future::Future;
use std::pin::Pin;
use std::rc::Weak;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate_config_watcher::{ClusterRoute, ConnectMode, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::debug;

use crate::codec::http1::{parse_response, response_body, BodyKind, Head, HeadLimits};
use crate::errors::GatewayError;
use crate::runtime::{self, Deadline, First};
use crate::tunnel::wire::ServiceRef;
use crate::upstream::{budget, connect, dial_address, PoolKey, UpstreamConn};

/// A connection to a member, as the front-ends' [`RequestBody`] writes to it and an upgrade
/// carries it: the exchange's name for it, so the front-ends need not reach into `upstream`.
pub(crate) type MemberConn = UpstreamConn;

/// Read-buffer growth step for bodies.
pub(crate) const READ_CHUNK: usize = 32 * 1024;
/// Read size for long-running streams (watch, `logs -f`), which mostly sit idle.
pub(crate) const IDLE_STREAM_BUFFER: usize = 4 * 1024;
/// How long a request body may stall between two reads (client side) or two writes (member side).
pub(crate) const BODY_STALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Limits on response heads from members (larger than the client's: members are trusted more
/// and send long `Warning` and audit headers).
const RESPONSE_HEAD_LIMITS: HeadLimits = HeadLimits {
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

/// A decided request, ready for its member.
pub(crate) struct Outbound<'a> {
    pub cluster: &'a ClusterRoute,
    /// The service the request goes to instead of the member (the direct service path of a
    /// pull-mode cluster): its own streams, pooled apart from the member's.
    pub service: Option<ServiceRef<'a>>,
    /// The member's request head (`member_head::write`).
    pub head: &'a [u8],
    /// GET, HEAD or OPTIONS without a body: safe to send again on a fresh connection.
    pub replayable: bool,
    pub long_running: bool,
    /// An HTTP/1.1 upgrade (or an h2 WebSocket carried as one): a dedicated connection, never
    /// pooled, and a 101 is a valid answer.
    pub upgrade: bool,
    /// A HEAD request: the response has no body whatever its head says.
    pub head_method: bool,
    pub limits: Limits,
    /// For metrics, recorded once the response head is read.
    pub verb: &'static str,
    pub started: Instant,
    /// The client's address: what it holds of member connections is capped (`budget`).
    pub client: std::net::IpAddr,
}

/// The request body as the front-end has it (the HTTP/1.1 read buffer and socket, or an h2
/// stream), written to the member after the head.
pub(crate) trait RequestBody {
    /// Writes the whole body to `conn` (the head is already written). Called at most once with
    /// content: only a request without a body is ever sent twice.
    async fn send(
        &mut self,
        conn: &mut UpstreamConn,
        cluster: &ClusterRoute,
    ) -> Result<(), Failure>;

    /// Resolves when the client has given up on the request (an h2 stream reset), so a pending
    /// connect or response head is abandoned at once. Pending forever where the protocol cannot
    /// tell before the response (HTTP/1.1 reads nothing past the body until it is answered).
    fn client_gone(&mut self) -> impl Future<Output = ()>;
}

/// No request body: a request the gateway makes itself (the fleet view's pages).
pub(crate) struct NoBody;

impl RequestBody for NoBody {
    async fn send(&mut self, _: &mut UpstreamConn, _: &ClusterRoute) -> Result<(), Failure> {
        Ok(())
    }

    async fn client_gone(&mut self) {
        std::future::pending().await
    }
}

/// The member's answer once its head is read (the head itself is in the [`Head`] given to
/// [`send`]).
pub(crate) struct Answer {
    pub conn: UpstreamConn,
    /// The response body's framing (empty for HEAD, 1xx, 204, 304 and a 101).
    pub body: BodyKind,
    /// Whether the connection may carry another request once this body is relayed completely.
    pub reusable: bool,
    /// The client address's hold on a member connection, given back with the answer.
    _hold: budget::ClientHold,
    /// A long-running answer (a watch, a followed log, an upgrade): counted open, and timed,
    /// until the answer is dropped at the stream's end (`fleetgate_stream_duration_seconds`).
    _stream: Option<crate::observe::metrics::StreamTimer>,
}

/// Takes `out` to its member: a pooled or new connection, the head and body, the response head
/// (timed by the front-end's `deadline`: its connection's, or its h2 stream's). Metrics count the
/// response by its code.
pub(crate) async fn send(
    shard: &ShardExchange,
    out: &Outbound<'_>,
    body: &mut impl RequestBody,
    response: &mut Head,
    deadline: &mut Deadline,
) -> Result<Answer, Failure> {
    let cluster = out.cluster;
    // A stream reset before its task ran (a reset flood's: MadeYouReset has the gateway reset
    // each stream right after opening it) costs the member nothing: no pooled connection carries
    // its request, no dial starts for it.
    if gone_already(body) {
        return Err(Failure::Abort("client gave up before the request was sent"));
    }
    let per_shard = out
        .limits
        .max_member_connections_per_client
        .div_ceil(shard.workers)
        .max(1);
    let hold = shard.client_holds.take(out.client, per_shard)?;
    let pool_key = PoolKey::new(cluster, out.service.as_ref());
    let mut attempt_on_fresh = false;
    let conn = loop {
        // An upgrade gets a dedicated connection: after the 101 it is no longer HTTP, so it must
        // neither come from the pool nor go back to it.
        let pooled = if attempt_on_fresh || out.upgrade {
            None
        } else {
            shard.pool.take(&pool_key)
        };
        let mut conn = match pooled {
            Some(conn) => conn,
            None => {
                let fresh = attempt_on_fresh || out.upgrade;
                new_connection(shard, out, &pool_key, fresh, body).await?
            }
        };
        let reused = conn.reused;
        let outcome = match write_request(&mut conn, cluster, out.head, body).await {
            Ok(()) => read_response_head(cluster, &mut conn, response, out, deadline).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => break conn,
            Err(Failure::Answer(GatewayError::UpstreamClosed { .. }))
                if reused && out.replayable && !attempt_on_fresh =>
            {
                debug!(cluster = %cluster.name, "pooled connection was closed by the member; retrying on a new one");
                attempt_on_fresh = true;
            }
            Err(e) => {
                if let Failure::Answer(error) = &e {
                    shard.shard_metrics.member_failed(cluster, error);
                }
                return Err(e);
            }
        }
    };
    let stream = shard.shard_metrics.member_answered(
        cluster,
        out.verb,
        response.code,
        out.started,
        out.long_running || out.upgrade,
    );
    if out.upgrade && response.code == 101 {
        return Ok(Answer {
            conn,
            body: BodyKind::Empty,
            reusable: false,
            _hold: hold,
            _stream: stream,
        });
    }
    let method: &[u8] = if out.head_method { b"HEAD" } else { b"GET" };
    let body = response_body(response, method).map_err(|e| GatewayError::UpstreamProtocol {
        cluster: cluster.name.to_string(),
        reason: e.0,
    })?;
    let reusable = body != BodyKind::CloseDelimited && !response.connection.close && !out.upgrade;
    Ok(Answer {
        conn,
        body,
        reusable,
        _hold: hold,
        _stream: stream,
    })
}

/// A connection nobody else holds for `out` (a `fresh` one: never used). A pull-mode member's
/// stream is opened at once (no dial: its agent's tunnel carries it). A dialed member's comes
/// through the pool's line, within the connect timeout: a connection another request returns, or
/// one a dial opens, at most `upstream::MAX_DIALS_PER_ENDPOINT` of them at once per shard.
/// Abandoned as soon as the client gives up (an h2 stream reset): a stream reset before its turn
/// never takes a place in line, and a dial it started goes on for the next in line.
async fn new_connection(
    shard: &ShardExchange,
    out: &Outbound<'_>,
    key: &PoolKey,
    fresh: bool,
    body: &mut impl RequestBody,
) -> Result<UpstreamConn, Failure> {
    let cluster = out.cluster;
    let timeout = out.limits.connect_timeout;
    if cluster.mode != ConnectMode::Tunnel {
        shard.sockets.check_new_member_connection(&cluster.name)?;
    }
    // A dial outlives the request that asked for it, so its task holds the route as the table
    // does. A route the table no longer holds as it was (a reload since the request was decided)
    // is dialed for this request alone, as a service path is (refused for a dialed member).
    let route = (cluster.mode != ConnectMode::Tunnel && out.service.is_none())
        .then(|| shard.table.load().cluster(&cluster.name).cloned())
        .flatten()
        .filter(|route| route.id == cluster.id);
    // Boxed: a dial (TCP, then TLS with the connector's state) is several KiB, and inline it
    // would size the future of every request for as long as it streams, though most requests
    // take a pooled connection.
    let connection: Pin<Box<dyn Future<Output = Result<UpstreamConn, GatewayError>> + '_>> =
        match route {
            Some(route) => Box::pin(async move {
                // Joined once the race below saw the client still there.
                let dial = dialer(route, shard.me.clone(), out.limits);
                let wait = shard.pool.wait_for(key.clone(), fresh, dial);
                runtime::timeout(timeout, wait).await.unwrap_or_else(|_| {
                    Err(GatewayError::ConnectTimeout {
                        cluster: cluster.name.to_string(),
                        address: dial_address(cluster),
                    })
                })
            }),
            None => Box::pin(open(cluster, out.service.as_ref(), &out.limits, shard)),
        };
    // The client first: a stream already reset never joins the line.
    match runtime::race(body.client_gone(), connection).await {
        First::Left(()) => Err(Failure::Abort("client gave up during connect")),
        First::Right(conn) => Ok(conn?),
    }
}

/// Whether the client has given up on the request already, without waiting for it to.
fn gone_already(body: &mut impl RequestBody) -> bool {
    let gone = std::pin::pin!(body.client_gone());
    gone.poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
        .is_ready()
}

/// How a dial task of the pool's line opens a connection to `route`'s member: with what it holds
/// itself, since the request that started it may be gone before it ends.
fn dialer(
    route: Arc<ClusterRoute>,
    shard: Weak<ShardExchange>,
    limits: Limits,
) -> impl AsyncFn() -> Result<UpstreamConn, GatewayError> + 'static {
    async move || {
        let Some(shard) = shard.upgrade() else {
            return Err(GatewayError::Connect {
                cluster: route.name.to_string(),
                address: dial_address(&route),
                source: std::io::Error::other("the shard is stopping"),
            });
        };
        open(&route, None, &limits, &shard).await
    }
}

/// Opens a connection to `cluster` (to `service` through a pull-mode member's agent) within the
/// connect timeout, through the member's circuit breaker, a dialed one counted against the
/// descriptor budget (a tunnel stream holds no descriptor of its own).
async fn open(
    cluster: &ClusterRoute,
    service: Option<&ServiceRef<'_>>,
    limits: &Limits,
    shard: &ShardExchange,
) -> Result<UpstreamConn, GatewayError> {
    let breaker = shard.table.load().gateway().circuit_breaker;
    let dialed = connect(
        cluster,
        service,
        limits.connect_timeout,
        &breaker,
        &shard.shard_metrics,
    )
    .await;
    let mut conn = shard.shard_metrics.dialed(cluster, dialed)?;
    if cluster.mode != ConnectMode::Tunnel {
        conn.socket = Some(shard.sockets.hold(shard.shard));
    }
    Ok(conn)
}

/// How the relay of a response to a request that is `long_running` (or not) paces its client.
pub(crate) fn pace(long_running: bool, limits: &Limits) -> relay::Pace<'static> {
    if long_running {
        relay::Pace::LongRunning
    } else {
        relay::Pace::Ordinary {
            write_timeout: limits.client_write_timeout,
        }
    }
}

/// Gives a connection back to the shard's pool if its response ended cleanly and completely.
pub(crate) fn finish(shard: &ShardExchange, answer: Answer, complete: bool) {
    if answer.reusable && complete && answer.conn.buf.is_empty() {
        shard.pool.put(answer.conn);
    }
}

/// Writes the head, then the body, then flushes.
async fn write_request(
    conn: &mut UpstreamConn,
    cluster: &ClusterRoute,
    head: &[u8],
    body: &mut impl RequestBody,
) -> Result<(), Failure> {
    let closed = |e: std::io::Error| {
        Failure::Answer(GatewayError::UpstreamClosed {
            cluster: cluster.name.to_string(),
            source: Some(e),
        })
    };
    conn.io.write_all(head).await.map_err(closed)?;
    body.send(conn, cluster).await?;
    // Nothing has gone to the client yet, so a member failure is still answered with a Status.
    conn.io.flush().await.map_err(closed)
}

/// Reads the member's response head (skipping interim 1xx responses) within the response-head
/// timeout, unless the request is long-running or an upgrade.
async fn read_response_head(
    cluster: &ClusterRoute,
    conn: &mut UpstreamConn,
    response: &mut Head,
    out: &Outbound<'_>,
    deadline: &mut Deadline,
) -> Result<(), Failure> {
    let name = || cluster.name.to_string();
    let switch_requested = out.upgrade;
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
    let result = if out.long_running || out.upgrade {
        read_head.await
    } else {
        let limit = out.limits.response_head_timeout;
        match deadline.within(limit, read_head).await {
            Ok(result) => result,
            Err(_) => Err(GatewayError::ResponseHeadTimeout {
                cluster: name(),
                seconds: limit.as_secs(),
            }),
        }
    };
    result.map_err(Failure::Answer)
}
