//! h2 to clients: the server side of an HTTP/2 connection (ALPN `h2` on a TLS listener), with
//! every stream proxied to the member as an HTTP/1.1 request on the shard's upstream pool.
//!
//! Runs the `h2` crate (its denial-of-service limits configured: reset floods, pending-accept
//! resets, header list size, send buffer) on the same readiness-based stream the HTTP/1.1 driver
//! gets (DESIGN.md's notes on h2 over monoio). Each stream is its own task on the shard. Bodies
//! are never collected: a member read is sent as DATA only as the client's flow-control window
//! grants capacity, and the next member read waits for that, so a slow reader never makes the
//! gateway buffer more than one read per stream, and one slow stream never stalls the others.
//! Chunked member bodies are decoded without copying (`ChunkedScanner::scan_data` ranges sliced
//! out of the read buffer). A client reset ends the stream at once and drops its member
//! connection, so a watch's upstream is released. kubectl opens exec / attach / port-forward on
//! HTTP/1.1; on h2 an RFC 8441 extended CONNECT for `websocket` becomes an HTTP/1.1 upgrade (a GET
//! with `Upgrade: websocket`) on a dedicated member connection, relayed both ways after the 101;
//! any other CONNECT gets a Status saying it needs HTTP/1.1. What a request becomes (routing,
//! identity, admission, the fleet view, shared watches, errors, audit) is the pipeline's
//! (`handle::serve`), the same as over HTTP/1.1: a stream is a [`handle::Session`]. The Gateway's `spec.http2` gives the streams a
//! client may open at once and the idle timeout, read when the connection starts: a connection
//! with no open stream for that long, or any connection when the gateway drains, gets
//! GOAWAY(NO_ERROR) (graceful: open streams finish, new ones are refused) and closes. Called by
//! `server::shard` when ALPN says `h2`.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use fleetgate_config_watcher::ClusterRoute;
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

use crate::codec::http1::{
    chunk_size_line, is_hop_by_hop, BodyKind, BodyProgress, Head, CHUNK_SIZE_ROOM,
};
use crate::errors::GatewayError;
use crate::exchange::relay::{relay, ClientEvent, ResponseSink};
use crate::exchange::reply::{warning_value, Reply};
use crate::exchange::{
    Failure, MemberConn, RequestBody, BODY_STALL_TIMEOUT, IDLE_STREAM_BUFFER, READ_CHUNK,
};
use crate::handle::ShardContext;
use crate::handle::{
    self, BodyLimit, ClientHead, ClientIdentity, Connection, Exchange, Following, Handled, Next,
    Protocol, Relay, Relayed, ReplyKind, Session, Start, Upgrade,
};
use crate::observe::audit::AuditRequest;
use crate::runtime::{self, Deadline, First};

pub mod guard;
mod lingering;

use guard::{Flood, FrameGuard};
use lingering::LingeringClose;

/// Per-stream receive window (request bodies): what a client may send ahead of the member.
const STREAM_WINDOW: u32 = 256 * 1024;
/// Connection receive window.
const CONNECTION_WINDOW: u32 = 4 * 1024 * 1024;
/// Most bytes queued for sending per stream beyond what the client's window allows.
const SEND_BUFFER: usize = 64 * 1024;
/// Reset floods (CVE-2023-44487 "rapid reset"): streams reset before they were accepted.
const MAX_PENDING_ACCEPT_RESETS: usize = 64;
/// Streams the gateway may reset for protocol errors before it gives up on the connection.
const MAX_LOCAL_ERROR_RESETS: usize = 1024;
/// How long the h2 preface and settings exchange may take.
const H2_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// After GOAWAY(ENHANCE_YOUR_CALM), how long the frame may take to go out before the connection
/// is dropped.
const CALM_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// After GOAWAY, how long a connection without open streams may take to close (the client
/// answers the GOAWAY's PING, then the final GOAWAY goes out); a client that never does is
/// dropped.
const GOAWAY_CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The streams open on one h2 connection, for its idle timeout: a connection is idle only while
/// none is open (an open watch or a slow request keeps it busy).
#[derive(Default)]
struct OpenStreams {
    open: Cell<usize>,
    idle_since: Cell<Option<Instant>>,
}

impl OpenStreams {
    fn opened(self: &Rc<Self>) -> StreamGuard {
        self.open.set(self.open.get() + 1);
        StreamGuard(self.clone())
    }

    /// How long the connection has had no open stream; `None` while one is open.
    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.open.get() > 0 {
            return None;
        }
        Some(now.saturating_duration_since(self.idle_since.get().unwrap_or(now)))
    }
}

/// One open stream; dropped when its task ends.
struct StreamGuard(Rc<OpenStreams>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let open = self.0.open.get() - 1;
        self.0.open.set(open);
        if open == 0 {
            self.0.idle_since.set(Some(runtime::clock::now()));
        }
    }
}

/// Why a connection is being closed with GOAWAY.
#[derive(Debug, Clone, Copy)]
enum GoAway {
    Idle,
    Drain,
}

/// Resolves when the connection should get GOAWAY: the gateway drains, or no stream has been
/// open for `idle_timeout`. Checks the streams once per timeout period at most (one timer per
/// connection, not one per stream).
async fn go_away_reason(
    drain: &crate::runtime::shutdown::ShardDrain,
    streams: &OpenStreams,
    idle_timeout: Option<Duration>,
) -> GoAway {
    let idle = async {
        let Some(timeout) = idle_timeout else {
            return std::future::pending().await;
        };
        loop {
            match streams.idle_for(runtime::clock::now()) {
                Some(idle) if idle >= timeout => return,
                Some(idle) => runtime::sleep(timeout - idle).await,
                None => runtime::sleep(timeout).await,
            }
        }
    };
    match runtime::race(drain.started(), idle).await {
        First::Left(()) => GoAway::Drain,
        First::Right(()) => GoAway::Idle,
    }
}

/// Serves one h2 client connection until it closes: accepts streams and proxies each in its own
/// task on this shard.
pub async fn serve_h2<S>(ctx: Rc<ShardContext>, io: S, peer: SocketAddr, identity: ClientIdentity)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    // Read once per connection: a reload that changes them applies to new connections.
    let (limits, settings) = {
        let table = ctx.exchange.table.load();
        (table.gateway().limits, table.gateway().http2)
    };
    let builder = server_builder(&limits, &settings);
    let streams = Rc::new(OpenStreams::default());
    let flood = Rc::new(Flood::default());
    let open_streams = {
        let streams = streams.clone();
        Rc::new(move || streams.open.get()) as Rc<dyn Fn() -> usize>
    };
    let io = FrameGuard::new(io, flood.clone(), open_streams);
    let mut connection = match runtime::timeout(
        H2_HANDSHAKE_TIMEOUT,
        builder.handshake::<_, Bytes>(LingeringClose::new(io)),
    )
    .await
    {
        Ok(Ok(connection)) => connection,
        Ok(Err(error)) => {
            debug!(%peer, %error, "h2 handshake failed");
            return;
        }
        Err(_) => {
            debug!(%peer, "h2 handshake timed out");
            return;
        }
    };
    debug!(%peer, user = ?identity.user, "h2 connection");
    let conn = Rc::new(Connection::new(&ctx, peer, &identity));
    streams.idle_since.set(Some(runtime::clock::now()));
    let accept_stream =
        |accepted: Result<(Request<RecvStream>, SendResponse<Bytes>), h2::Error>| match accepted {
            Ok((request, respond)) => {
                runtime::spawn(serve_stream(
                    ctx.clone(),
                    request,
                    respond,
                    conn.clone(),
                    streams.opened(),
                ));
                true
            }
            Err(error) => {
                debug!(%peer, %error, "h2 connection ended with an error");
                false
            }
        };
    // Pinned once: its timer and drain wait live as long as the connection, not one accept.
    let mut go_away = std::pin::pin!(go_away_reason(
        &ctx.exchange.drain,
        &streams,
        settings.idle_timeout
    ));
    // Accepting also drives the connection (frames of every stream move only while it is polled).
    let reason = loop {
        let stop = runtime::race(go_away.as_mut(), flood.wait());
        match runtime::race(connection.accept(), stop).await {
            First::Left(Some(accepted)) => {
                if !accept_stream(accepted) {
                    return;
                }
            }
            First::Left(None) => return,
            First::Right(First::Left(reason)) => break reason,
            First::Right(First::Right(why)) => {
                // A client that costs more than it may: GOAWAY(ENHANCE_YOUR_CALM), its streams
                // end, and the connection closes once that GOAWAY is out (or within a second).
                warn!(%peer, why, open_streams = streams.open.get(), "h2 client over its budget; GOAWAY ENHANCE_YOUR_CALM");
                ctx.metrics.h2_connection_calmed();
                connection.abrupt_shutdown(h2::Reason::ENHANCE_YOUR_CALM);
                let _ = runtime::timeout(CALM_CLOSE_TIMEOUT, async {
                    while let Some(Ok(_)) = connection.accept().await {}
                })
                .await;
                return;
            }
        }
    };
    // GOAWAY(NO_ERROR) with a PING, then the final GOAWAY naming the last stream served: the
    // streams already open finish, new ones are refused, and the connection closes after them.
    debug!(%peer, ?reason, open_streams = streams.open.get(), "h2 GOAWAY");
    connection.graceful_shutdown();
    loop {
        match runtime::timeout(GOAWAY_CLOSE_TIMEOUT, connection.accept()).await {
            Ok(Some(accepted)) => {
                if !accept_stream(accepted) {
                    return;
                }
            }
            Ok(None) => return,
            // Streams still run: keep driving them (the drain's grace period bounds this).
            Err(_) if streams.open.get() > 0 => {}
            Err(_) => {
                debug!(%peer, "h2 client did not complete the close; dropping the connection");
                return;
            }
        }
    }
}

/// Serves one stream through the pipeline. A shared watch, once positioned in its hub, goes on
/// in a task of its own ([`follow_watch`]) and this one ends: for as long as the client
/// watches, its stream holds the follower and not this task's room for every other path.
///
/// Not an `async fn` (as [`follow_watch`]): its arguments are used where they are.
#[allow(clippy::manual_async_fn)]
fn serve_stream(
    ctx: Rc<ShardContext>,
    request: Request<RecvStream>,
    respond: SendResponse<Bytes>,
    conn: Rc<Connection>,
    open: StreamGuard,
) -> impl Future<Output = ()> {
    async move {
        let started = Instant::now();
        let (parts, recv) = request.into_parts();
        let websocket = is_websocket_connect(&parts);
        let head = StreamHead {
            request: Request::from_parts(parts, ()),
            websocket,
        };
        let mut stream = Stream::new(respond, recv, &head);
        if head.request.method() == Method::CONNECT && !websocket {
            // RFC 8441: a WebSocket over h2 (extended CONNECT, `:protocol websocket`) is carried
            // to the member as an HTTP/1.1 upgrade of a GET; any other CONNECT needs HTTP/1.1.
            let protocol = head
                .request
                .extensions()
                .get::<h2::ext::Protocol>()
                .map_or("CONNECT", |p| p.as_str())
                .to_string();
            let error = GatewayError::UpgradeOverH2 { protocol };
            handle::refuse_early(&ctx, &conn, &head, &mut stream, &error, started).await;
            return;
        }
        match handle::serve(&ctx, &conn, &head, &mut stream, started).await {
            Handled::Done(_) => {}
            Handled::Follow(following) => {
                let end = FollowEnd {
                    ctx,
                    respond: stream.respond,
                    _open: open,
                };
                runtime::spawn(follow_watch(end, following));
            }
        }
    }
}

/// What a shared watch's stream keeps while it follows its hub.
struct FollowEnd {
    ctx: Rc<ShardContext>,
    respond: SendResponse<Bytes>,
    /// The connection's count of open streams.
    _open: StreamGuard,
}

/// Follows a positioned shared watch until the client's watch ends, then ends its stream.
///
/// Not an `async fn`: one would hold its arguments twice (as arguments, and moved into its
/// body) for as long as the client watches; the block uses them where they are.
#[allow(clippy::manual_async_fn)]
fn follow_watch(mut end: FollowEnd, mut following: Box<Following>) -> impl Future<Output = ()> {
    async move {
        let mut reply = FleetStream {
            respond: &mut end.respond,
            send: None,
        };
        let followed = following.follow(&end.ctx, &mut reply).await;
        let sent = reply.head_sent();
        match followed {
            Ok(()) => {}
            Err(Failure::Answer(error)) if !sent => {
                crate::errors::log_answered(&error, "h2 request");
                send_status(&mut end.respond, &error).await;
            }
            Err(_) => end.respond.send_reset(h2::Reason::INTERNAL_ERROR),
        }
    }
}

/// Answers a stream with `err`'s Status.
async fn send_status(respond: &mut SendResponse<Bytes>, err: &GatewayError) {
    let (code, _) = err.code_and_reason();
    let body = Bytes::from(err.status_body());
    let mut response = Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .header("content-length", body.len());
    if let Some(seconds) = err.retry_after() {
        response = response.header("retry-after", seconds);
    }
    let response = response.body(()).unwrap_or_default();
    if let Ok(mut send) = respond.send_response(response, false) {
        let _ = send_flow_controlled(&mut send, body, true).await;
    }
}

/// The h2 server settings of every client connection (also what the fuzz target runs).
pub fn server_builder(
    limits: &fleetgate_config_watcher::Limits,
    settings: &fleetgate_config_watcher::Http2Settings,
) -> h2::server::Builder {
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(settings.max_concurrent_streams)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(u32::try_from(limits.max_head_bytes).unwrap_or(u32::MAX))
        .max_send_buffer_size(SEND_BUFFER)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        // RFC 8441 extended CONNECT: WebSocket over h2 (`relay_websocket`).
        .enable_connect_protocol();
    builder
}

/// A stream's request head: the request without its body, and whether it is an RFC 8441
/// WebSocket (an extended CONNECT the member gets as a GET with `Upgrade: websocket`).
struct StreamHead {
    request: Request<()>,
    websocket: bool,
}

impl ClientHead for StreamHead {
    fn method(&self) -> &[u8] {
        if self.websocket {
            b"GET"
        } else {
            self.request.method().as_str().as_bytes()
        }
    }

    fn target(&self) -> &[u8] {
        let uri = self.request.uri();
        uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes()
    }

    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let fields = self.request.headers().iter();
        fields.map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
    }

    fn accept(&self) -> impl Iterator<Item = &[u8]> {
        let accept = self.request.headers().get_all(http::header::ACCEPT);
        accept.into_iter().map(|v| v.as_bytes())
    }

    fn connection_has(&self, _: &[u8]) -> bool {
        // h2 has no `Connection` field (the h2 crate refuses connection-specific fields).
        false
    }

    fn http10(&self) -> bool {
        false
    }

    fn audit_request(&self, peer: SocketAddr) -> AuditRequest {
        AuditRequest::from_parts(&self.request, peer)
    }
}

/// One stream, as the pipeline sees it: its response handle, its request body, and the room its
/// exchange with the member needs.
struct Stream {
    respond: SendResponse<Bytes>,
    body: RecvStream,
    /// The response body's stream, once its head is sent.
    send: Option<SendStream<Bytes>>,
    /// The framing of the request body for the member.
    kind: BodyKind,
    member_head: Vec<u8>,
    response: Head,
    /// The stream's one timer (its response head; the request body has its own stall timeout).
    deadline: Deadline,
}

impl Stream {
    fn new(respond: SendResponse<Bytes>, body: RecvStream, head: &StreamHead) -> Stream {
        // The request body: with the client's Content-Length, or chunked when it has none.
        let kind = if body.is_end_stream() || head.websocket {
            BodyKind::Empty
        } else {
            match head
                .request
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
            {
                Some(n) => BodyKind::Length(n),
                None => BodyKind::Chunked,
            }
        };
        Stream {
            respond,
            body,
            send: None,
            kind,
            member_head: Vec::new(),
            response: Head::default(),
            deadline: Deadline::new(),
        }
    }
}

impl Session for Stream {
    type Head = StreamHead;
    const PROTOCOL: Protocol = Protocol::H2;

    fn body_kind(&self) -> BodyKind {
        self.kind
    }

    fn names_fields(&self) -> bool {
        false
    }

    fn closes(&self) -> bool {
        false
    }

    fn upgrade(&self, head: &StreamHead) -> Result<Upgrade, GatewayError> {
        Ok(if head.websocket {
            Upgrade::WebSocket
        } else {
            Upgrade::None
        })
    }

    async fn answer_status(&mut self, _: &StreamHead, error: &GatewayError, _: bool) {
        send_status(&mut self.respond, error).await;
    }

    async fn answer_health(&mut self, head: &StreamHead) -> Next {
        let response = Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "text/plain; charset=utf-8")
            .header("content-length", 2)
            .body(())
            .unwrap_or_default();
        let head_only = head.request.method() == Method::HEAD;
        if let Ok(mut send) = self.respond.send_response(response, head_only) {
            if !head_only {
                let ok = Bytes::from_static(b"ok");
                let _ = send_flow_controlled(&mut send, ok, true).await;
            }
        }
        Next::KeepAlive
    }

    async fn read_body(&mut self, _: &StreamHead, limit: BodyLimit) -> Result<Bytes, Failure> {
        read_whole_body(&mut self.body, limit).await
    }

    fn reply(&mut self, _: &StreamHead, _: ReplyKind) -> impl Reply + '_ {
        FleetStream {
            respond: &mut self.respond,
            send: None,
        }
    }

    fn exchange(&mut self, _: &StreamHead) -> Exchange<'_, impl RequestBody + '_> {
        self.member_head.reserve(1024);
        Exchange {
            member_head: &mut self.member_head,
            response: &mut self.response,
            deadline: &mut self.deadline,
            body: StreamBody {
                body: &mut self.body,
                kind: self.kind,
                respond: &mut self.respond,
            },
        }
    }

    fn start_response(&mut self, _: &StreamHead, start: Start<'_>) -> Result<(), Failure> {
        let (answer, cluster, how) = (start.answer, start.cluster, start.how);
        let response = &self.response;
        let switched = how.upgrade && response.code == 101;
        if how.upgrade && !switched && (200..300).contains(&response.code) {
            // A 2xx would tell the h2 client its WebSocket is open.
            return Err(GatewayError::UpstreamProtocol {
                cluster: cluster.to_string(),
                reason: "answered a WebSocket upgrade without switching protocols",
            }
            .into());
        }
        let reply = if switched {
            h2_response(cluster, response, 200, &[b"sec-websocket-accept"])?
        } else {
            h2_response(cluster, response, response.code, &[])?
        };
        let empty = BodyProgress::new(answer.body).is_done() && !switched;
        self.send = Some(send_head(&mut self.respond, reply, empty)?);
        Ok(())
    }

    async fn relay(&mut self, to: Relay<'_>) -> Result<Relayed, Failure> {
        let Relay { ctx, answer, how } = to;
        let send = self
            .send
            .as_mut()
            .ok_or(Failure::Abort("relay before the response head"))?;
        if how.upgrade && self.response.code == 101 {
            let _upgraded = ctx.exchange.shard_metrics.upgraded_stream_opened();
            debug!("h2 WebSocket switched; relaying");
            Box::pin(relay_tunnel(&mut answer.conn, &mut self.body, send)).await?;
            return Ok(Relayed {
                next: Next::KeepAlive,
                complete: false,
            });
        }
        let complete = if BodyProgress::new(answer.body).is_done() {
            true
        } else {
            let pace = how.pace(&ctx.exchange.drain);
            Box::pin(relay(answer, &mut StreamSink { send }, pace)).await?
        };
        Ok(Relayed {
            next: Next::KeepAlive,
            complete,
        })
    }

    fn abort(&mut self) {
        self.respond.send_reset(h2::Reason::INTERNAL_ERROR);
    }
}

/// The whole request body of a stream, for a request the gateway answers itself from several
/// members (a fleet access review), within `limit`. The client's
/// window is released as the bytes arrive.
async fn read_whole_body(body: &mut RecvStream, limit: BodyLimit) -> Result<Bytes, Failure> {
    let mut whole = BytesMut::new();
    loop {
        let data = match runtime::timeout(BODY_STALL_TIMEOUT, body.data()).await {
            Ok(Some(data)) => data.map_err(|_| Failure::Abort("client reset the request body"))?,
            Ok(None) => return Ok(whole.freeze()),
            Err(_) => return Err(Failure::Abort("client stalled in the request body")),
        };
        if whole.len() + data.len() > limit.max {
            return Err(Failure::Answer((limit.too_large)()));
        }
        whole.extend_from_slice(&data);
        let _ = body.flow_control().release_capacity(data.len());
    }
}

/// The request body from the client's h2 stream, written to the member with the framing the
/// gateway decided (chunked when the client declared no length), the client's window released
/// only as the member takes the bytes. A client or member that stalls for
/// [`BODY_STALL_TIMEOUT`] fails the request.
struct StreamBody<'a> {
    body: &'a mut RecvStream,
    kind: BodyKind,
    respond: &'a mut SendResponse<Bytes>,
}

impl RequestBody for StreamBody<'_> {
    async fn send(&mut self, conn: &mut MemberConn, cluster: &ClusterRoute) -> Result<(), Failure> {
        if self.kind == BodyKind::Empty {
            return Ok(());
        }
        let stalled = || {
            Failure::Answer(GatewayError::UpstreamProtocol {
                cluster: cluster.name.to_string(),
                reason: "stopped reading the request body",
            })
        };
        let closed = |e: std::io::Error| {
            Failure::Answer(GatewayError::UpstreamClosed {
                cluster: cluster.name.to_string(),
                source: Some(e),
            })
        };
        loop {
            let data = match runtime::timeout(BODY_STALL_TIMEOUT, self.body.data()).await {
                Ok(Some(data)) => {
                    data.map_err(|_| Failure::Abort("client reset the request body"))?
                }
                Ok(None) => break,
                Err(_) => return Err(Failure::Abort("client stalled in the request body")),
            };
            let n = data.len();
            if n == 0 {
                continue;
            }
            let write = async {
                if self.kind == BodyKind::Chunked {
                    let mut room = [0u8; CHUNK_SIZE_ROOM];
                    let size = chunk_size_line(&mut room, n);
                    let mut chunk = Buf::chain(size, &data[..]).chain(&b"\r\n"[..]);
                    conn.io.write_all_buf(&mut chunk).await
                } else {
                    conn.io.write_all(&data).await
                }
            };
            match runtime::timeout(BODY_STALL_TIMEOUT, write).await {
                Ok(written) => written.map_err(closed)?,
                Err(_) => return Err(stalled()),
            }
            let _ = self.body.flow_control().release_capacity(n);
        }
        if self.kind == BodyKind::Chunked {
            conn.io.write_all(b"0\r\n\r\n").await.map_err(closed)?;
        }
        Ok(())
    }

    async fn client_gone(&mut self) {
        let _ = poll_fn(|cx| self.respond.poll_reset(cx)).await;
    }
}

/// The client side of a response body on an h2 stream: each piece a DATA frame sent as the
/// client's window allows, END_STREAM at the end, a reset as the client going away.
struct StreamSink<'a> {
    send: &'a mut SendStream<Bytes>,
}

/// A response the gateway writes itself (fleet view, shared watch) on an h2 stream.
struct FleetStream<'a> {
    respond: &'a mut SendResponse<Bytes>,
    send: Option<SendStream<Bytes>>,
}

impl Reply for FleetStream<'_> {
    async fn head(&mut self, content_type: &str, warnings: &[String]) -> Result<(), Failure> {
        let mut response = Response::builder()
            .status(StatusCode::OK)
            .header("content-type", content_type)
            .header("cache-control", "no-cache, private");
        for warning in warnings {
            response = response.header("warning", warning_value(warning));
        }
        let response = response
            .body(())
            .map_err(|_| Failure::Abort("unsendable response head"))?;
        self.send = Some(send_head(self.respond, response, false)?);
        Ok(())
    }

    async fn body(&mut self, piece: Bytes) -> Result<(), Failure> {
        let send = self
            .send
            .as_mut()
            .ok_or(Failure::Abort("body before head"))?;
        send_flow_controlled(send, piece, false)
            .await
            .map_err(|_| Failure::Abort("client reset the stream"))
    }

    async fn gone(&mut self) {
        // Before the head, a reset of the stream (a shared watch waiting for its hub's list).
        let _ = match self.send.as_mut() {
            Some(send) => poll_fn(|cx| send.poll_reset(cx)).await,
            None => poll_fn(|cx| self.respond.poll_reset(cx)).await,
        };
    }

    async fn end(&mut self) -> Result<(), Failure> {
        let send = self
            .send
            .as_mut()
            .ok_or(Failure::Abort("end before head"))?;
        send.send_data(Bytes::new(), true)
            .map_err(|_| Failure::Abort("client reset the stream"))
    }

    fn head_sent(&self) -> bool {
        self.send.is_some()
    }

    fn keeps_connection(&self) -> bool {
        true
    }
}

impl ResponseSink for StreamSink<'_> {
    fn decodes_chunks(&self) -> bool {
        true
    }

    async fn send(&mut self, piece: Bytes) -> Result<(), Failure> {
        send_flow_controlled(self.send, piece, false)
            .await
            .map_err(|_| Failure::Abort("client reset the stream"))
    }

    async fn flush(&mut self) -> Result<(), Failure> {
        // The connection task writes frames as it is polled.
        Ok(())
    }

    async fn end(&mut self) -> Result<(), Failure> {
        self.send
            .send_data(Bytes::new(), true)
            .map_err(|_| Failure::Abort("client reset the stream"))
    }

    async fn end_early(&mut self, _last_chunk: bool) -> Result<(), Failure> {
        self.end().await
    }

    async fn client_event(&mut self) -> ClientEvent {
        let _ = poll_fn(|cx| self.send.poll_reset(cx)).await;
        ClientEvent::Gone
    }
}

/// The member's HTTP/1.1 response head as an h2 response with status `code`: its fields without
/// the hop-by-hop ones, `Transfer-Encoding` and the `dropped` names (a field h2 cannot carry is
/// left out rather than failing the stream).
fn h2_response(
    cluster: &str,
    response: &Head,
    code: u16,
    dropped: &[&[u8]],
) -> Result<Response<()>, GatewayError> {
    let mut builder = Response::builder().status(code);
    for (name, value) in response.headers() {
        if is_hop_by_hop(response, name)
            || name.eq_ignore_ascii_case(b"transfer-encoding")
            || dropped.iter().any(|d| name.eq_ignore_ascii_case(d))
        {
            continue;
        }
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            builder = builder.header(name, value);
        }
    }
    builder
        .body(())
        .map_err(|_| GatewayError::UpstreamProtocol {
            cluster: cluster.to_string(),
            reason: "response head not representable in h2",
        })
}

/// Whether a request is an RFC 8441 extended CONNECT for a WebSocket.
fn is_websocket_connect(parts: &http::request::Parts) -> bool {
    parts.method == Method::CONNECT
        && parts
            .extensions
            .get::<h2::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// Relays bytes between an h2 stream and a member connection after a 101, both ways at once, each
/// direction under flow control (a client's DATA is released as the member takes it; a member read
/// goes out as the client's window allows).
async fn relay_tunnel(
    conn: &mut MemberConn,
    body: &mut RecvStream,
    send: &mut SendStream<Bytes>,
) -> Result<(), Failure> {
    use std::future::Future;
    use std::task::Poll;
    let early = std::mem::take(&mut conn.buf).freeze();
    let (mut from_member, mut to_member) = tokio::io::split(&mut conn.io);
    let client_to_member = async {
        while let Some(data) = body.data().await {
            let data = data.map_err(|_| Failure::Abort("client reset the WebSocket stream"))?;
            let n = data.len();
            to_member
                .write_all(&data)
                .await
                .map_err(|_| Failure::Abort("member write failed"))?;
            let _ = body.flow_control().release_capacity(n);
        }
        // The client's END_STREAM is its half-close.
        let _ = to_member.shutdown().await;
        Ok::<(), Failure>(())
    };
    let member_to_client = async {
        let abort = |_| Failure::Abort("client reset the WebSocket stream");
        if !early.is_empty() {
            send_flow_controlled(send, early, false)
                .await
                .map_err(abort)?;
        }
        let mut buf = BytesMut::new();
        loop {
            if buf.capacity() < IDLE_STREAM_BUFFER {
                buf = BytesMut::with_capacity(READ_CHUNK);
            }
            let reset = poll_fn(|cx| send.poll_reset(cx));
            let read = match runtime::race(from_member.read_buf(&mut buf), reset).await {
                First::Left(read) => read,
                First::Right(_) => return Err(Failure::Abort("client reset the WebSocket stream")),
            };
            match read {
                Ok(0) | Err(_) => {
                    send.send_data(Bytes::new(), true).map_err(abort)?;
                    return Ok(());
                }
                Ok(_) => {
                    let piece = buf.split().freeze();
                    send_flow_controlled(send, piece, false)
                        .await
                        .map_err(abort)?;
                }
            }
        }
    };
    let mut client_to_member = std::pin::pin!(client_to_member);
    let mut member_to_client = std::pin::pin!(member_to_client);
    let (mut client_done, mut member_done) = (false, false);
    poll_fn(|cx| {
        if !client_done {
            if let Poll::Ready(result) = client_to_member.as_mut().poll(cx) {
                result?;
                client_done = true;
            }
        }
        if !member_done {
            if let Poll::Ready(result) = member_to_client.as_mut().poll(cx) {
                result?;
                member_done = true;
            }
        }
        if client_done && member_done {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Sends a response head on a stream; its body goes on the stream returned (none when `end`).
fn send_head(
    respond: &mut SendResponse<Bytes>,
    head: Response<()>,
    end: bool,
) -> Result<SendStream<Bytes>, Failure> {
    respond
        .send_response(head, end)
        .map_err(|_| Failure::Abort("client reset the stream"))
}

/// Sends `data` on `send` as the peer's flow-control window grants capacity.
async fn send_flow_controlled(
    send: &mut SendStream<Bytes>,
    mut data: Bytes,
    end_of_stream: bool,
) -> Result<(), h2::Error> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        match poll_fn(|cx| send.poll_capacity(cx)).await {
            None => return Err(h2::Error::from(h2::Reason::CANCEL)),
            Some(Err(e)) => return Err(e),
            Some(Ok(0)) => continue,
            Some(Ok(granted)) => {
                let piece = data.split_to(granted.min(data.len()));
                send.send_data(piece, false)?;
            }
        }
    }
    if end_of_stream {
        send.send_data(Bytes::new(), true)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The size of the future an async fn of two arguments returns.
    fn future_size2<A, B, R>(_: fn(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// The same, of five arguments.
    fn future_size5<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every h2 stream is a task that holds its future for its whole life: what one path needs
    /// only while it runs (a member exchange) is boxed there, not room in every stream's. A
    /// shared watch, once positioned, is a task of its own that holds its follower and no more,
    /// for as long as the client watches (docs/benchmarks.md, "Over h2": before, a watch held
    /// the stream's task future and its own, 5,048 + 2,928 bytes).
    #[test]
    fn a_streams_task_and_a_shared_watchs_task_hold_no_member_request_inline() {
        let stream = future_size5(super::serve_stream);
        let watching = future_size2(super::follow_watch);
        eprintln!("serve_stream future: {stream} bytes; follow_watch's: {watching}");
        assert!(stream <= 5632, "{stream} bytes");
        assert!(watching <= 2048, "{watching} bytes");
    }
}
