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
//! any other CONNECT gets a Status saying it needs HTTP/1.1. Routing,
//! identity and errors are the same as `proxy`'s. The Gateway's `spec.http2` gives the streams a
//! client may open at once and the idle timeout, read when the connection starts: a connection
//! with no open stream for that long, or any connection when the gateway drains, gets
//! GOAWAY(NO_ERROR) (graceful: open streams finish, new ones are refused) and closes. Called by
//! `tls::dispatch` when ALPN says `h2`.

use std::cell::Cell;
use std::future::poll_fn;
use std::io::Write as _;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use fleetgate_config_watcher::{ClusterRoute, ConnectMode};
use h2::server::SendResponse;
use h2::{RecvStream, SendStream};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

use crate::auth::{self, ClientIdentity};
use crate::errors::{GatewayError, Side};
use crate::exchange::{read_response_head, Failure, IDLE_STREAM_BUFFER, READ_CHUNK};
use crate::observe::audit::{AuditRequest, Outcome, StreamAudit};
use crate::protocol::http1::{
    is_hop_by_hop, push_header, response_body, BodyKind, BodyProgress, ChunkedScanner, Head,
};
use crate::request::route::{self, Route};
use crate::server::runtime::{self, First};
use crate::server::ShardContext;
use crate::upstream::{connect, UpstreamConn};

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
            self.0.idle_since.set(Some(Instant::now()));
        }
    }
}

/// The client stream as h2 sees it, closed the way HTTP servers close: after h2 has written its
/// last frame and shut down the write side, the client's last bytes (the ack of the GOAWAY's PING,
/// its own close) are read and dropped until it closes too. Closing with those bytes unread would
/// answer them with a TCP reset, and the client would see a broken connection instead of a
/// GOAWAY. Bounded by the caller: the close happens inside `accept`, which the GOAWAY loop runs
/// under a timeout.
struct LingeringClose<S> {
    io: S,
    write_shut: bool,
}

impl<S> LingeringClose<S> {
    fn new(io: S) -> Self {
        LingeringClose {
            io,
            write_shut: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LingeringClose<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for LingeringClose<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = &mut *self;
        if !this.write_shut {
            std::task::ready!(std::pin::Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.write_shut = true;
        }
        let mut scratch = [0u8; 512];
        loop {
            let mut read = tokio::io::ReadBuf::new(&mut scratch);
            match std::pin::Pin::new(&mut this.io).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => continue,
                // The client is gone one way or another: the close is done.
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
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
    shutdown: &crate::server::shutdown::Shutdown,
    streams: &OpenStreams,
    idle_timeout: Option<Duration>,
) -> GoAway {
    let idle = async {
        let Some(timeout) = idle_timeout else {
            return std::future::pending().await;
        };
        loop {
            match streams.idle_for(Instant::now()) {
                Some(idle) if idle >= timeout => return,
                Some(idle) => runtime::sleep(timeout - idle).await,
                None => runtime::sleep(timeout).await,
            }
        }
    };
    match runtime::race(shutdown.drain_started(), idle).await {
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
        let table = ctx.table.load();
        (table.gateway().limits, table.gateway().http2)
    };
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
    debug!(%peer, user = %identity.user, "h2 connection");
    // Who the audit log names when a stream is refused before its identity is decided.
    let audit_user = ctx
        .audit
        .as_ref()
        .filter(|_| !identity.user.is_empty())
        .map(|_| Arc::new(identity.clone()));
    let identity = Rc::new(auth::ConnectionAuth::new(&identity));
    let streams = Rc::new(OpenStreams::default());
    streams.idle_since.set(Some(Instant::now()));
    let accept_stream =
        |accepted: Result<(Request<RecvStream>, SendResponse<Bytes>), h2::Error>| match accepted {
            Ok((request, respond)) => {
                runtime::spawn(serve_stream(
                    ctx.clone(),
                    request,
                    respond,
                    peer,
                    identity.clone(),
                    audit_user.clone(),
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
        &ctx.shutdown,
        &streams,
        settings.idle_timeout
    ));
    // Accepting also drives the connection (frames of every stream move only while it is polled).
    let reason = loop {
        match runtime::race(connection.accept(), go_away.as_mut()).await {
            First::Left(Some(accepted)) => {
                if !accept_stream(accepted) {
                    return;
                }
            }
            First::Left(None) => return,
            First::Right(reason) => break reason,
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

/// Proxies one stream and answers its failure, if any.
async fn serve_stream(
    ctx: Rc<ShardContext>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: SocketAddr,
    identity: Rc<auth::ConnectionAuth>,
    audit_user: Option<Arc<ClientIdentity>>,
    _open: StreamGuard,
) {
    let started = Instant::now();
    let _stream = ctx.metrics.stream_opened();
    let audit_request = ctx
        .audit
        .as_ref()
        .map(|_| AuditRequest::from_parts(&request, peer));
    let mut audit = StreamAudit {
        authenticated: audit_user.clone(),
        acting_as: audit_user,
        code: None,
    };
    let proxied = proxy_stream(
        &ctx,
        request,
        &mut respond,
        peer,
        &identity,
        started,
        &mut audit,
    )
    .await;
    // Health answers carry no code in `audit` and are not audited.
    let outcome = match &proxied {
        Ok(()) => audit.code.map(Outcome::Complete),
        Err(Failure::Answer(err)) => {
            let code = err.code_and_reason().0;
            if code == 401 {
                audit.authenticated = None;
                audit.acting_as = None;
            }
            Some(Outcome::Complete(code))
        }
        Err(Failure::Abort(reason)) => Some(Outcome::Aborted(audit.code, reason)),
    };
    match proxied {
        Ok(()) => {}
        Err(Failure::Answer(err)) => {
            match err.side() {
                Side::Downstream => debug!(error = %err, "refused h2 request"),
                Side::Upstream | Side::Internal => warn!(error = %err, "h2 request failed"),
            }
            let (code, _) = err.code_and_reason();
            let body = Bytes::from(err.status_body());
            let response = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .header("cache-control", "no-cache, private")
                .header("content-length", body.len())
                .body(())
                .unwrap_or_default();
            if let Ok(mut send) = respond.send_response(response, false) {
                let _ = send_flow_controlled(&mut send, body, true).await;
            }
        }
        Err(Failure::Abort(reason)) => {
            debug!(reason, "h2 stream reset mid-response");
            respond.send_reset(h2::Reason::INTERNAL_ERROR);
        }
    }
    if let (Some(log), Some(request), Some(outcome)) = (&ctx.audit, audit_request, outcome) {
        let request = request.identity(audit.authenticated.as_ref(), audit.acting_as.as_ref());
        log.record(request, started, outcome);
    }
}

/// What the route table says about a request target.
enum Decision {
    Health,
    Cluster(Arc<ClusterRoute>, bool),
}

fn decide(ctx: &ShardContext, target: &[u8]) -> Result<Decision, GatewayError> {
    let table = ctx.table.load();
    let ocm_style = table.gateway().ocm_style;
    match route::route(target, ocm_style) {
        Route::Health(_) => Ok(Decision::Health),
        Route::NotFound => Err(GatewayError::NoRoute {
            path: String::from_utf8_lossy(target).into_owned(),
        }),
        Route::Cluster { name, .. } => match table.cluster(name) {
            Some(cluster) => Ok(Decision::Cluster(cluster.clone(), ocm_style)),
            None => Err(GatewayError::UnknownCluster {
                name: name.to_string(),
            }),
        },
    }
}

async fn proxy_stream(
    ctx: &ShardContext,
    request: Request<RecvStream>,
    respond: &mut SendResponse<Bytes>,
    peer: SocketAddr,
    conn_auth: &auth::ConnectionAuth,
    started: Instant,
    audit: &mut StreamAudit,
) -> Result<(), Failure> {
    let (parts, mut body) = request.into_parts();
    // RFC 8441: a WebSocket over h2 (extended CONNECT, `:protocol websocket`) is carried to the
    // member as an HTTP/1.1 upgrade of a GET; any other CONNECT needs HTTP/1.1.
    let websocket = is_websocket_connect(&parts);
    if parts.method == Method::CONNECT && !websocket {
        let protocol = parts
            .extensions
            .get::<h2::ext::Protocol>()
            .map_or("CONNECT", |p| p.as_str())
            .to_string();
        return Err(GatewayError::UpgradeOverH2 { protocol }.into());
    }
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .as_bytes();
    let decision = decide(ctx, target).map_err(|err| {
        auth::hide_unknown_cluster(err, ctx.table.load().access(), conn_auth, || {
            parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        })
    });
    let (cluster, ocm_style) = match decision? {
        Decision::Health => {
            let response = Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/plain; charset=utf-8")
                .header("content-length", 2)
                .body(())
                .unwrap_or_default();
            let head_only = parts.method == Method::HEAD;
            let mut send = respond
                .send_response(response, head_only)
                .map_err(|_| Failure::Abort("client reset"))?;
            if !head_only {
                send_flow_controlled(&mut send, Bytes::from_static(b"ok"), true)
                    .await
                    .map_err(|_| Failure::Abort("client reset"))?;
            }
            return Ok(());
        }
        Decision::Cluster(cluster, ocm_style) => (cluster, ocm_style),
    };
    if cluster.mode == ConnectMode::Tunnel {
        return Err(GatewayError::TunnelNotSupported {
            cluster: cluster.name.to_string(),
        }
        .into());
    }
    let Route::Cluster { rest, query, .. } = route::route(target, ocm_style) else {
        return Err(GatewayError::NoRoute {
            path: String::from_utf8_lossy(target).into_owned(),
        }
        .into());
    };
    // Who the client is and whether a policy lets it (identity.rs), before anything goes upstream.
    if !cluster.impersonation
        && !cluster.pass_through
        && parts
            .headers
            .keys()
            .any(|name| name.as_str().starts_with("impersonate-"))
    {
        return Err(GatewayError::ClientImpersonation.into());
    }
    let method: &[u8] = if websocket {
        b"GET"
    } else {
        parts.method.as_str().as_bytes()
    };
    let decided = auth::decide(
        ctx.table.load().access(),
        conn_auth,
        &cluster,
        method,
        rest,
        query,
        || {
            parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        },
    );
    let decided = match decided {
        Ok(decided) => decided,
        Err(refusal) => {
            // The audit log names who a 403 was for (a 401 clears these below).
            if refusal.authenticated.is_some() {
                audit.authenticated = refusal.authenticated;
                audit.acting_as = refusal.acting_as;
            }
            return Err(refusal.error.into());
        }
    };
    if ctx.audit.is_some() {
        audit.authenticated = decided.authenticated.clone();
        audit.acting_as = decided.identity.clone();
    }
    let verb = route::kube_verb(method, rest, query);
    let long_running = route::is_long_running(rest, query);
    let limits = ctx.table.load().gateway().limits;

    // The request body: forwarded with the client's Content-Length, or chunked when it has none.
    let request_body = if body.is_end_stream() || websocket {
        BodyKind::Empty
    } else {
        match parts
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            Some(n) => BodyKind::Length(n),
            None => BodyKind::Chunked,
        }
    };
    let mut head = Vec::with_capacity(1024);
    head.extend_from_slice(method);
    head.push(b' ');
    route::push_upstream_target(&mut head, &cluster.upstream.path_prefix, rest, query);
    head.extend_from_slice(b" HTTP/1.1\r\n");
    push_header(&mut head, b"Host", cluster.upstream.authority.as_bytes());
    let mut forwarded_for = Vec::new();
    for (name, value) in &parts.headers {
        let name_bytes = name.as_str().as_bytes();
        if name == http::header::HOST
            || name == http::header::CONTENT_LENGTH
            || name == http::header::TRANSFER_ENCODING
            || name == http::header::EXPECT
            || name == http::header::TE
            || name == http::header::CONNECTION
            || auth::drops_client_header(&cluster, name_bytes)
        {
            continue;
        }
        if name_bytes == b"x-forwarded-for" {
            forwarded_for.extend_from_slice(value.as_bytes());
            forwarded_for.extend_from_slice(b", ");
            continue;
        }
        push_header(&mut head, name_bytes, value.as_bytes());
    }
    match request_body {
        BodyKind::Length(n) => {
            let _ = write!(head, "Content-Length: {n}\r\n");
        }
        BodyKind::Chunked => push_header(&mut head, b"Transfer-Encoding", b"chunked"),
        _ => {}
    }
    head.extend_from_slice(b"X-Forwarded-For: ");
    head.extend_from_slice(&forwarded_for);
    let _ = write!(head, "{}\r\n", peer.ip());
    auth::push_upstream_identity(&mut head, &cluster, decided.identity.as_deref());
    if websocket {
        push_websocket_upgrade(&mut head, &parts.headers);
        head.extend_from_slice(b"\r\n");
        return relay_websocket(
            ctx, &cluster, &head, &mut body, respond, verb, started, audit,
        )
        .await;
    }
    head.extend_from_slice(b"\r\n");

    let can_replay = request_body == BodyKind::Empty
        && matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
    let mut response = Head::default();
    let mut attempt_on_fresh = false;
    let mut conn = loop {
        let pooled = if attempt_on_fresh {
            None
        } else {
            ctx.pool.take(cluster.id)
        };
        let mut conn = match pooled {
            Some(conn) => conn,
            None => connect(&cluster, limits.connect_timeout, &ctx.metrics).await?,
        };
        let reused = conn.reused;
        let mut outcome = send_request(&mut conn, &cluster, &head, request_body, &mut body).await;
        if outcome.is_ok() {
            outcome = read_response_head(
                &cluster,
                &mut conn,
                &mut response,
                long_running,
                limits,
                false,
            )
            .await;
        }
        match outcome {
            Ok(()) => break conn,
            Err(Failure::Answer(GatewayError::UpstreamClosed { .. }))
                if reused && can_replay && !attempt_on_fresh =>
            {
                attempt_on_fresh = true;
            }
            Err(e) => return Err(e),
        }
    };
    let kind = response_body(
        &response,
        if parts.method == Method::HEAD {
            b"HEAD"
        } else {
            b"GET"
        },
    )
    .map_err(|e| GatewayError::UpstreamProtocol {
        cluster: cluster.name.to_string(),
        reason: e.0,
    })?;
    let reply = h2_response(&cluster, &response, response.code, &[])?;
    let elapsed = started.elapsed();
    ctx.metrics_cache.record(
        &ctx.metrics,
        (cluster.id, &cluster.name),
        verb,
        response.code,
        elapsed,
    );
    debug!(
        shard = ctx.shard,
        cluster = %cluster.name,
        verb,
        code = response.code,
        head_us = elapsed.as_micros() as u64,
        long_running,
        "h2 response head relayed"
    );
    let mut progress = BodyProgress::new(kind);
    audit.code = Some(response.code);
    let mut send = respond
        .send_response(reply, progress.is_done())
        .map_err(|_| Failure::Abort("client reset"))?;
    if progress.is_done() {
        if conn.buf.is_empty() && !member_wants_close(&response) {
            ctx.pool.put(conn);
        }
        return Ok(());
    }
    relay_body(&mut conn, &mut send, &mut progress, long_running).await?;
    let reusable = kind != BodyKind::CloseDelimited && !member_wants_close(&response);
    if reusable && conn.buf.is_empty() && progress.is_done() {
        ctx.pool.put(conn);
    }
    Ok(())
}

/// Whether a request is an RFC 8441 extended CONNECT for a WebSocket.
/// The member's HTTP/1.1 response head as an h2 response with status `code`: its fields without
/// the hop-by-hop ones, `Transfer-Encoding` and the `dropped` names (a field h2 cannot carry is
/// left out rather than failing the stream).
fn h2_response(
    cluster: &ClusterRoute,
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
            cluster: cluster.name.to_string(),
            reason: "response head not representable in h2",
        })
}

fn is_websocket_connect(parts: &http::request::Parts) -> bool {
    parts.method == Method::CONNECT
        && parts
            .extensions
            .get::<h2::ext::Protocol>()
            .is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket"))
}

/// The HTTP/1.1 side of an RFC 8441 WebSocket: `Connection: Upgrade`, `Upgrade: websocket`, and
/// the handshake fields an h2 client does not send (a fresh `Sec-WebSocket-Key`, version 13).
fn push_websocket_upgrade(head: &mut Vec<u8>, client: &http::HeaderMap) {
    push_header(head, b"Connection", b"Upgrade");
    push_header(head, b"Upgrade", b"websocket");
    if !client.contains_key("sec-websocket-version") {
        push_header(head, b"Sec-WebSocket-Version", b"13");
    }
    if !client.contains_key("sec-websocket-key") {
        // 16 random bytes, base64: the member checks only the form, and the gateway checks
        // nothing of the answer's accept key (the h2 client never sees it).
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD.encode(uuid::Uuid::new_v4().as_bytes());
        push_header(head, b"Sec-WebSocket-Key", key.as_bytes());
    }
}

/// An RFC 8441 WebSocket: the upgrade on a dedicated member connection (never from or back to
/// the pool), the member's 101 answered to the client as 200, then bytes relayed both ways until
/// both sides ended (the client's END_STREAM is passed on as a half-close, the member's close as
/// END_STREAM). A member that does not switch is relayed as an ordinary response.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename these
async fn relay_websocket(
    ctx: &ShardContext,
    cluster: &Arc<ClusterRoute>,
    head: &[u8],
    body: &mut RecvStream,
    respond: &mut SendResponse<Bytes>,
    verb: &'static str,
    started: Instant,
    audit: &mut StreamAudit,
) -> Result<(), Failure> {
    let limits = ctx.table.load().gateway().limits;
    let mut conn = connect(cluster, limits.connect_timeout, &ctx.metrics).await?;
    send_request(&mut conn, cluster, head, BodyKind::Empty, body).await?;
    let mut response = Head::default();
    // No head timeout beyond the connect one, as for upgrades on HTTP/1.1.
    read_response_head(cluster, &mut conn, &mut response, true, limits, true).await?;
    let switched = response.code == 101;
    if !switched && (200..300).contains(&response.code) {
        // A 2xx would tell the h2 client its WebSocket is open.
        return Err(GatewayError::UpstreamProtocol {
            cluster: cluster.name.to_string(),
            reason: "answered a WebSocket upgrade without switching protocols",
        }
        .into());
    }
    let code = if switched { 200 } else { response.code };
    let reply = h2_response(cluster, &response, code, &[b"sec-websocket-accept"])?;
    ctx.metrics_cache.record(
        &ctx.metrics,
        (cluster.id, &cluster.name),
        verb,
        response.code,
        started.elapsed(),
    );
    audit.code = Some(response.code);
    if !switched {
        let kind =
            response_body(&response, b"GET").map_err(|e| GatewayError::UpstreamProtocol {
                cluster: cluster.name.to_string(),
                reason: e.0,
            })?;
        let mut progress = BodyProgress::new(kind);
        let mut send = respond
            .send_response(reply, progress.is_done())
            .map_err(|_| Failure::Abort("client reset"))?;
        if !progress.is_done() {
            relay_body(&mut conn, &mut send, &mut progress, false).await?;
        }
        return Ok(());
    }
    let mut send = respond
        .send_response(reply, false)
        .map_err(|_| Failure::Abort("client reset"))?;
    let _upgraded = ctx.metrics.upgraded_stream_opened();
    debug!(cluster = %cluster.name, "h2 WebSocket switched; relaying");
    relay_tunnel(&mut conn, body, &mut send).await
}

/// Relays bytes between an h2 stream and a member connection after a 101, both ways at once, each
/// direction under flow control (a client's DATA is released as the member takes it; a member read
/// goes out as the client's window allows).
async fn relay_tunnel(
    conn: &mut UpstreamConn,
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

fn member_wants_close(response: &Head) -> bool {
    response.has_token(b"connection", b"close")
}

/// Sends the request head and the body from the client's h2 stream, releasing the client's
/// window only as the member takes the bytes.
async fn send_request(
    conn: &mut UpstreamConn,
    cluster: &ClusterRoute,
    head: &[u8],
    kind: BodyKind,
    body: &mut RecvStream,
) -> Result<(), Failure> {
    let closed = |e: std::io::Error| {
        Failure::Answer(GatewayError::UpstreamClosed {
            cluster: cluster.name.to_string(),
            source: Some(e),
        })
    };
    conn.io.write_all(head).await.map_err(closed)?;
    if kind != BodyKind::Empty {
        while let Some(data) = body.data().await {
            let data = data.map_err(|_| Failure::Abort("client reset the request body"))?;
            let n = data.len();
            if kind == BodyKind::Chunked {
                if n == 0 {
                    continue;
                }
                let mut size = Vec::with_capacity(12);
                let _ = write!(size, "{n:x}\r\n");
                conn.io.write_all(&size).await.map_err(closed)?;
                conn.io.write_all(&data).await.map_err(closed)?;
                conn.io.write_all(b"\r\n").await.map_err(closed)?;
            } else {
                conn.io.write_all(&data).await.map_err(closed)?;
            }
            let _ = body.flow_control().release_capacity(n);
        }
        if kind == BodyKind::Chunked {
            conn.io.write_all(b"0\r\n\r\n").await.map_err(closed)?;
        }
    }
    conn.io.flush().await.map_err(closed)
}

/// Relays the member's response body as DATA frames, one member read at a time, each sent only
/// as the client's window allows. A client reset during a long-running stream ends it at once.
async fn relay_body(
    conn: &mut UpstreamConn,
    send: &mut SendStream<Bytes>,
    progress: &mut BodyProgress,
    long_running: bool,
) -> Result<(), Failure> {
    let abort = |_| Failure::Abort("client reset the stream");
    let mut scanner = match progress {
        BodyProgress::Chunked(_) => Some(ChunkedScanner::new()),
        _ => None,
    };
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    // The route's retirement ends a long-running stream with END_STREAM between chunks
    // (`retired`); borrowed, so no shared count is touched per response.
    let retirement = &*conn.retirement;
    let mut retired = retirement.listen();
    let mut finish_chunk_by: Option<std::time::Instant> = None;
    loop {
        if long_running && !progress.is_done() && retirement.is_retired() {
            let end = match (&scanner, &*progress) {
                (Some(scanner), _) => crate::exchange::retired::chunked_end(scanner),
                (None, progress) => crate::exchange::retired::retired_end(progress),
            };
            match end {
                crate::exchange::retired::RetiredEnd::Done => {}
                crate::exchange::retired::RetiredEnd::LastChunk
                | crate::exchange::retired::RetiredEnd::Close => {
                    send.send_data(Bytes::new(), true).map_err(abort)?;
                    *progress = BodyProgress::Done;
                    return Ok(());
                }
                crate::exchange::retired::RetiredEnd::Cut => {
                    return Err(Failure::Abort("route retired mid-body"))
                }
                crate::exchange::retired::RetiredEnd::FinishChunk => {
                    finish_chunk_by.get_or_insert_with(|| {
                        std::time::Instant::now() + crate::exchange::retired::FINISH_CHUNK_WITHIN
                    });
                }
            }
        }
        if !conn.buf.is_empty() {
            if let Some(scanner) = scanner.as_mut() {
                ranges.clear();
                let consumed = scanner
                    .scan_data(&conn.buf, |r| ranges.push(r))
                    .map_err(|_| Failure::Abort("invalid chunked framing from member"))?;
                let read = conn.buf.split_to(consumed).freeze();
                if scanner.is_done() {
                    *progress = BodyProgress::Done;
                }
                for range in ranges.drain(..) {
                    send_flow_controlled(send, read.slice(range), false)
                        .await
                        .map_err(abort)?;
                }
            } else {
                let n = progress
                    .take(&conn.buf)
                    .map_err(|_| Failure::Abort("invalid framing from member"))?;
                let piece = conn.buf.split_to(n).freeze();
                send_flow_controlled(send, piece, false)
                    .await
                    .map_err(abort)?;
            }
        }
        if progress.is_done() {
            send.send_data(Bytes::new(), true).map_err(abort)?;
            return Ok(());
        }
        // Whatever was split off went to h2; a fresh small buffer for an idle stream.
        let want = if long_running {
            IDLE_STREAM_BUFFER
        } else {
            READ_CHUNK
        };
        if conn.buf.capacity() < want {
            conn.buf = BytesMut::with_capacity(want);
        }
        let read = if let Some(deadline) = finish_chunk_by {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match runtime::timeout(left, conn.io.read_buf(&mut conn.buf)).await {
                Ok(read) => read,
                Err(_) => return Err(Failure::Abort("route retired inside a chunk")),
            }
        } else if long_running {
            let reset = poll_fn(|cx| send.poll_reset(cx));
            let member_or_reset = runtime::race(conn.io.read_buf(&mut conn.buf), reset);
            match runtime::race(member_or_reset, &mut retired).await {
                First::Left(First::Left(read)) => read,
                First::Left(First::Right(_)) => {
                    return Err(Failure::Abort("client reset during a stream"))
                }
                // Handled at the top of the loop.
                First::Right(()) => continue,
            }
        } else {
            conn.io.read_buf(&mut conn.buf).await
        };
        match read {
            Ok(0) | Err(_) => {
                if matches!(progress, BodyProgress::UntilClose) {
                    send.send_data(Bytes::new(), true).map_err(abort)?;
                    *progress = BodyProgress::Done;
                    return Ok(());
                }
                return Err(Failure::Abort("member closed inside the response body"));
            }
            Ok(_) => {}
        }
    }
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
