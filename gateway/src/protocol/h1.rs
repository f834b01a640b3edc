//! The HTTP/1.1 connection driver: reads requests from one client connection, routes each to a
//! member cluster, writes it upstream with the gateway's identity headers, and streams the
//! response back, in order, until the client or an error closes the connection.
//!
//! Bodies are moved from the read buffer of one side to the other as they arrive (never
//! collected), each read flushed to the client at once so a watch event or a `logs -f` line is not
//! held back. The codec (`http1`) says where heads and bodies end; `route` names the cluster;
//! `identity` writes the credentials; `upstream` owns connections; `error` renders every refusal.
//! Pipelined requests wait in the read buffer until the previous response is done, so they are
//! answered in order. Called by `tls`/`shard` for each accepted connection; generic over the stream
//! type so the same code serves TLS and plaintext sockets.

use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use fleetgate_config_watcher::{ClusterRoute, ConnectMode, Limits};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

use crate::auth::{self, ClientIdentity};
use crate::errors::{GatewayError, Side};
use crate::exchange::retired::{retired_end, RetiredEnd, FINISH_CHUNK_WITHIN, LAST_CHUNK};
use crate::exchange::splice::splice;
use crate::exchange::{
    read_response_head, Failure, IDLE_STREAM_BUFFER, READ_CHUNK, RESPONSE_HEAD_LIMITS,
};
use crate::observe::audit::{AuditRequest, Outcome};
use crate::protocol::http1::{
    is_hop_by_hop, parse_request, push_header, request_body, response_body, BodyKind, BodyProgress,
    Head, HeadError, HeadLimits,
};
use crate::request::route::{self, Route};
use crate::server::runtime::{self, First};
use crate::server::ShardContext;
use crate::upstream::{connect, UpstreamConn};

/// How long a request head may take to arrive once it has started (slow-loris defense).
const HEAD_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request body may stall between two reads.
const BODY_STALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Per-connection state reused for every request on it.
struct Downstream<'a, S> {
    io: &'a mut S,
    buf: BytesMut,
    scanned: usize,
    head: Head,
    response: Head,
    out: Vec<u8>,
}

/// What to do with the client connection after a request.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    KeepAlive,
    Close,
}

/// Serves HTTP/1.1 requests on one client connection until it closes.
pub async fn serve_http1<S>(
    ctx: Rc<ShardContext>,
    io: &mut S,
    peer: SocketAddr,
    identity: &ClientIdentity,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut down = Downstream {
        io,
        buf: BytesMut::with_capacity(4 * 1024),
        scanned: 0,
        head: Head::default(),
        response: Head::default(),
        out: Vec::with_capacity(1024),
    };
    let conn_auth = auth::ConnectionAuth::new(identity);
    // Who the audit log names when a request is refused before its identity is decided.
    let audit_user = ctx
        .audit
        .as_ref()
        .filter(|_| !identity.user.is_empty())
        .map(|_| Arc::new(identity.clone()));
    loop {
        let limits = ctx.table.load().gateway().limits;
        match read_request_head(&mut down, limits, &ctx.shutdown).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(err) => {
                respond_error(&mut down, &err, true).await;
                break;
            }
        }
        match handle_request(
            &ctx,
            &mut down,
            peer,
            &conn_auth,
            audit_user.as_ref(),
            limits,
        )
        .await
        {
            Next::KeepAlive => continue,
            Next::Close => break,
        }
    }
    let _ = down.io.shutdown().await;
}

/// Reads until a whole request head is parsed. `Ok(false)`: the client closed, idled out
/// (`limits.idle_timeout` between requests), or the connection is idle while the gateway drains.
async fn read_request_head<S: AsyncRead + Unpin>(
    down: &mut Downstream<'_, S>,
    limits: Limits,
    shutdown: &crate::server::shutdown::Shutdown,
) -> Result<bool, GatewayError> {
    let head_limits = HeadLimits {
        max_head_bytes: limits.max_head_bytes,
        max_headers: limits.max_headers,
    };
    // Once a head has started it must be complete within HEAD_READ_TIMEOUT in total, however
    // slowly its bytes trickle in.
    let mut head_deadline = (!down.buf.is_empty()).then(|| Instant::now() + HEAD_READ_TIMEOUT);
    loop {
        match parse_request(
            &mut down.buf,
            &mut down.scanned,
            head_limits,
            &mut down.head,
        ) {
            Ok(true) => return Ok(true),
            Ok(false) => {}
            Err(HeadError::TooLarge(limit)) => return Err(GatewayError::HeadTooLarge { limit }),
            Err(HeadError::TooManyHeaders(limit)) => {
                return Err(GatewayError::TooManyHeaders { limit })
            }
            Err(HeadError::Invalid("unsupported version")) => {
                return Err(GatewayError::VersionNotSupported)
            }
            Err(HeadError::Invalid(reason)) => return Err(GatewayError::BadRequest { reason }),
        }
        let idle = head_deadline.is_none() && down.buf.is_empty();
        let wait = match head_deadline {
            None if idle => limits.idle_timeout,
            None => {
                head_deadline = Some(Instant::now() + HEAD_READ_TIMEOUT);
                Some(HEAD_READ_TIMEOUT)
            }
            Some(deadline) => Some(deadline.saturating_duration_since(Instant::now())),
        };
        down.buf.reserve(4096);
        let read = async {
            match wait {
                Some(wait) => runtime::timeout(wait, down.io.read_buf(&mut down.buf))
                    .await
                    .ok(),
                None => Some(down.io.read_buf(&mut down.buf).await),
            }
        };
        let read = if idle {
            // Between requests: a drain closes the connection now (a started head is read on).
            match runtime::race(read, shutdown.drain_started()).await {
                First::Left(read) => read,
                First::Right(()) => return Ok(false),
            }
        } else {
            read.await
        };
        match read {
            Some(Ok(0)) | Some(Err(_)) | None => return Ok(false),
            Some(Ok(_)) => {}
        }
    }
}

async fn respond_error<S: AsyncWrite + Unpin>(
    down: &mut Downstream<'_, S>,
    err: &GatewayError,
    close: bool,
) {
    match err.side() {
        Side::Downstream => debug!(error = %err, "refused request"),
        Side::Upstream | Side::Internal => warn!(error = %err, "request failed"),
    }
    let response = err.to_response(close);
    // A response to HEAD has no body (its Content-Length still says how long it would be).
    let response = if down.head.method() == b"HEAD" {
        let end = crate::protocol::http1::find_head_end(&response, 0).unwrap_or(response.len());
        &response[..end]
    } else {
        &response[..]
    };
    if down.io.write_all(response).await.is_ok() {
        let _ = down.io.flush().await;
    }
}

fn wants_close(head: &Head) -> bool {
    if head.minor_version == 0 {
        !head.has_token(b"connection", b"keep-alive")
    } else {
        head.has_token(b"connection", b"close")
    }
}

const HEALTH_OK: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 2\r\n\r\nok";
const HEALTH_OK_CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok";

/// Handles one parsed request: answers it itself or proxies it.
async fn handle_request<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    peer: SocketAddr,
    conn_auth: &auth::ConnectionAuth,
    audit_user: Option<&Arc<ClientIdentity>>,
    limits: Limits,
) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let body = match request_body(&down.head) {
        Ok(kind) => kind,
        Err(e) => {
            respond_error(down, &GatewayError::BadRequest { reason: e.0 }, true).await;
            return Next::Close;
        }
    };
    // A request whose body the gateway will not read leaves the connection unusable, and so does
    // an upgrade that fails: the client may already be sending bytes of the new protocol.
    let close = wants_close(&down.head)
        || body != BodyKind::Empty
        || down.head.has_token(b"connection", b"upgrade");
    // Decide with the table loaded, answer after dropping it: a table guard is never held
    // across an await.
    let decision = {
        let table = ctx.table.load();
        let ocm_style = table.gateway().ocm_style;
        match route::route(down.head.target(), ocm_style) {
            Route::Health(_) => Err(None),
            Route::NotFound => Err(Some(GatewayError::NoRoute {
                path: String::from_utf8_lossy(down.head.target()).into_owned(),
            })),
            Route::Cluster { name, .. } => match table.cluster(name) {
                Some(cluster) => Ok((cluster.clone(), ocm_style)),
                None => Err(Some(auth::hide_unknown_cluster(
                    GatewayError::UnknownCluster {
                        name: name.to_string(),
                    },
                    table.access(),
                    conn_auth,
                    || down.head.headers(),
                ))),
            },
        }
    };
    let (cluster, ocm_style) = match decision {
        Ok(found) => found,
        Err(None) => {
            let mut reply = if close { HEALTH_OK_CLOSE } else { HEALTH_OK };
            if down.head.method() == b"HEAD" {
                reply = &reply[..reply.len() - 2];
            }
            let ok = down.io.write_all(reply).await.is_ok() && down.io.flush().await.is_ok();
            return if ok && !close {
                Next::KeepAlive
            } else {
                Next::Close
            };
        }
        Err(Some(err)) => {
            respond_error(down, &err, close).await;
            let outcome = Outcome::Complete(err.code_and_reason().0);
            audit_response(
                ctx,
                &down.head,
                peer,
                (audit_user, audit_user),
                started,
                outcome,
            );
            return if close { Next::Close } else { Next::KeepAlive };
        }
    };
    let Route::Cluster { rest, query, .. } = route::route(down.head.target(), ocm_style) else {
        return Next::Close;
    };
    let verb = route::kube_verb(down.head.method(), rest, query);
    // Who the client is and whether a policy lets it: decided with the table loaded (no await).
    let decided = auth::decide(
        ctx.table.load().access(),
        conn_auth,
        &cluster,
        down.head.method(),
        rest,
        query,
        || down.head.headers(),
    );
    let decided = match decided {
        Ok(decided) => decided,
        Err(refusal) => {
            let err = refusal.error;
            let code = err.code_and_reason().0;
            ctx.metrics_cache.record(
                &ctx.metrics,
                (cluster.id, &cluster.name),
                verb,
                code,
                started.elapsed(),
            );
            respond_error(down, &err, close).await;
            // A 401 has no user; a refusal after authentication names who had authenticated
            // (and whom it asked to act as), else the connection's certificate user.
            let fallback = audit_user.filter(|_| code != 401);
            let who = (
                refusal.authenticated.as_ref().or(fallback),
                refusal.acting_as.as_ref().or(fallback),
            );
            audit_response(ctx, &down.head, peer, who, started, Outcome::Complete(code));
            return if close { Next::Close } else { Next::KeepAlive };
        }
    };
    let long_running = route::is_long_running(rest, query);
    let _stream = ctx.metrics.stream_opened();
    // 0 until a member's response head is read: an aborted exchange says whether one was.
    down.response.code = 0;
    let proxied = proxy_request(
        ctx,
        down,
        &cluster,
        peer,
        &decided,
        limits,
        body,
        long_running,
        started,
        verb,
    )
    .await;
    let audited = (decided.authenticated.as_ref(), decided.identity.as_ref());
    match proxied {
        // The body was read: whether to keep the connection is the client's and member's call.
        Ok(next) => {
            let outcome = Outcome::Complete(down.response.code);
            audit_response(ctx, &down.head, peer, audited, started, outcome);
            next
        }
        Err(Failure::Answer(err)) => {
            let code = err.code_and_reason().0;
            ctx.metrics_cache.record(
                &ctx.metrics,
                (cluster.id, &cluster.name),
                verb,
                code,
                started.elapsed(),
            );
            let close = close || err.must_close();
            respond_error(down, &err, close).await;
            audit_response(
                ctx,
                &down.head,
                peer,
                audited,
                started,
                Outcome::Complete(code),
            );
            if close {
                Next::Close
            } else {
                Next::KeepAlive
            }
        }
        Err(Failure::Abort(reason)) => {
            debug!(cluster = %cluster.name, reason, "connection aborted mid-response");
            let code = (down.response.code != 0).then_some(down.response.code);
            let outcome = Outcome::Aborted(code, reason);
            audit_response(ctx, &down.head, peer, audited, started, outcome);
            Next::Close
        }
    }
}

/// Hands the audit log one record for a request whose response ended (nothing when the audit
/// log is off): who authenticated and who the member was told about, and how it ended.
fn audit_response(
    ctx: &ShardContext,
    head: &Head,
    peer: SocketAddr,
    (authenticated, acting_as): (Option<&Arc<ClientIdentity>>, Option<&Arc<ClientIdentity>>),
    started: Instant,
    outcome: Outcome,
) {
    if let Some(audit) = &ctx.audit {
        let request = AuditRequest::from_head(head, peer).identity(authenticated, acting_as);
        audit.record(request, started, outcome);
    }
}

/// Writes the upstream request head into `out`.
fn build_upstream_head(
    out: &mut Vec<u8>,
    head: &Head,
    cluster: &ClusterRoute,
    peer: SocketAddr,
    identity: Option<&ClientIdentity>,
    ocm_style: bool,
    upgrade: bool,
) {
    out.clear();
    out.extend_from_slice(head.method());
    out.push(b' ');
    if let Route::Cluster { rest, query, .. } = route::route(head.target(), ocm_style) {
        route::push_upstream_target(out, &cluster.upstream.path_prefix, rest, query);
    }
    // An HTTP/1.0 client is forwarded as HTTP/1.0, so the member answers without chunked
    // framing, which such a client could not read.
    if head.minor_version == 0 {
        out.extend_from_slice(b" HTTP/1.0\r\n");
    } else {
        out.extend_from_slice(b" HTTP/1.1\r\n");
    }
    push_header(out, b"Host", cluster.upstream.authority.as_bytes());
    for (name, value) in head.headers() {
        if name.eq_ignore_ascii_case(b"host")
            || name.eq_ignore_ascii_case(b"x-forwarded-for")
            || name.eq_ignore_ascii_case(b"expect")
            || auth::drops_client_header(cluster, name)
            || is_hop_by_hop(head, name)
        {
            continue;
        }
        push_header(out, name, value);
    }
    // X-Forwarded-For: earlier hops as the client sent them, then the client's address.
    out.extend_from_slice(b"X-Forwarded-For: ");
    for value in head.values(b"x-forwarded-for") {
        out.extend_from_slice(value);
        out.extend_from_slice(b", ");
    }
    // Formats straight into the buffer: no allocation per request.
    let _ = write!(out, "{}", peer.ip());
    out.extend_from_slice(b"\r\n");
    auth::push_upstream_identity(out, cluster, identity);
    // Hop-by-hop, yet an upgrade only happens if the member is asked for it on this hop.
    if upgrade {
        push_header(out, b"Connection", b"Upgrade");
        for value in head.values(b"upgrade") {
            push_header(out, b"Upgrade", value);
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether the request asks to switch to a protocol the gateway carries (SPDY/3.1 for exec,
/// attach and port-forward, WebSocket for the same since kubectl 1.30). Only HTTP/1.1 can
/// upgrade; an `Upgrade` without `Connection: upgrade` is an ordinary request whose hop-by-hop
/// `Upgrade` is dropped. Any other protocol (h2c, say) is refused: the gateway would not know
/// what it relays.
fn requested_upgrade(head: &Head) -> Result<bool, GatewayError> {
    if head.minor_version == 0 || !head.has_token(b"connection", b"upgrade") {
        return Ok(false);
    }
    let mut protocols = head
        .values(b"upgrade")
        .flat_map(|v| v.split(|b| *b == b','))
        .map(crate::protocol::http1::head::trim)
        .filter(|p| !p.is_empty())
        .peekable();
    if protocols.peek().is_none() {
        return Ok(false);
    }
    match protocols.find(|p| !is_carried_protocol(p)) {
        None => Ok(true),
        Some(other) => Err(GatewayError::UpgradeNotSupported {
            protocol: String::from_utf8_lossy(other).into_owned(),
        }),
    }
}

fn is_carried_protocol(protocol: &[u8]) -> bool {
    protocol.eq_ignore_ascii_case(b"SPDY/3.1") || protocol.eq_ignore_ascii_case(b"websocket")
}

/// Relays the member's 101 to the client, then splices the two connections until both close.
/// The dedicated member connection is dropped at the end; the client connection is closed.
async fn relay_upgrade<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    mut conn: UpstreamConn,
    cluster: &ClusterRoute,
    verb: &'static str,
    started: Instant,
) -> Result<Next, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let elapsed = started.elapsed();
    ctx.metrics_cache.record(
        &ctx.metrics,
        (cluster.id, &cluster.name),
        verb,
        101,
        elapsed,
    );
    down.out.clear();
    write_switching_head(&mut down.out, &down.response);
    down.io
        .write_all(&down.out)
        .await
        .map_err(|_| Failure::Abort("client write failed"))?;
    down.io
        .flush()
        .await
        .map_err(|_| Failure::Abort("client flush failed"))?;
    let _upgraded = ctx.metrics.upgraded_stream_opened();
    debug!(
        shard = ctx.shard,
        cluster = %cluster.name,
        protocol = %String::from_utf8_lossy(down.response.value(b"upgrade").unwrap_or_default()),
        head_us = elapsed.as_micros() as u64,
        "upgraded; splicing"
    );
    // Bytes the client sent past its head, and the member past its 101, go first.
    let client_pending = std::mem::take(&mut down.buf);
    let member_pending = std::mem::take(&mut conn.buf);
    let retired = cluster.retirement.listen();
    match splice(
        &mut *down.io,
        &mut conn.io,
        client_pending,
        member_pending,
        retired,
    )
    .await
    {
        Ok(totals) => debug!(
            cluster = %cluster.name,
            client_to_member = totals.client_to_member,
            member_to_client = totals.member_to_client,
            retired = totals.retired,
            "upgraded stream closed"
        ),
        Err(error) => debug!(cluster = %cluster.name, %error, "upgraded stream failed"),
    }
    Ok(Next::Close)
}

/// Writes a 101 as the member sent it, keeping the `Connection: Upgrade` and `Upgrade` fields
/// (hop-by-hop, but they are what the client checks) and dropping the other hop-by-hop ones.
fn write_switching_head(out: &mut Vec<u8>, response: &Head) {
    out.extend_from_slice(b"HTTP/1.1 101 ");
    out.extend_from_slice(response.reason());
    out.extend_from_slice(b"\r\n");
    for (name, value) in response.headers() {
        if name.eq_ignore_ascii_case(b"connection")
            || name.eq_ignore_ascii_case(b"upgrade")
            || !is_hop_by_hop(response, name)
        {
            push_header(out, name, value);
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether a request may be sent again on a fresh connection when a reused one turned out to
/// be closed by the member before answering.
fn replayable(method: &[u8], body: BodyKind) -> bool {
    body == BodyKind::Empty && matches!(method, b"GET" | b"HEAD" | b"OPTIONS")
}

#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename these
async fn proxy_request<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    cluster: &Arc<ClusterRoute>,
    peer: SocketAddr,
    decided: &auth::Decided,
    limits: Limits,
    body: BodyKind,
    long_running: bool,
    started: Instant,
    verb: &'static str,
) -> Result<Next, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if cluster.mode == ConnectMode::Tunnel {
        return Err(GatewayError::TunnelNotSupported {
            cluster: cluster.name.to_string(),
        }
        .into());
    }
    if !cluster.impersonation && !cluster.pass_through {
        // The member would see the gateway itself: nobody may choose another identity there.
        auth::check_request(&down.head)?;
    }
    let upgrade = requested_upgrade(&down.head)?;
    if upgrade && body != BodyKind::Empty {
        // Where such a body would end and the upgraded bytes begin is anyone's guess.
        return Err(GatewayError::BadRequest {
            reason: "an upgrade request must not carry a body",
        }
        .into());
    }
    let ocm_style = ctx.table.load().gateway().ocm_style;
    build_upstream_head(
        &mut down.out,
        &down.head,
        cluster,
        peer,
        decided.identity.as_deref(),
        ocm_style,
        upgrade,
    );
    let expect_continue =
        body != BodyKind::Empty && down.head.has_token(b"expect", b"100-continue");
    let method_is_head = down.head.method() == b"HEAD";
    let can_replay = replayable(down.head.method(), body);

    let mut attempt_on_fresh = false;
    let mut conn = loop {
        // An upgrade gets a dedicated connection: after the 101 it is no longer HTTP, so it must
        // neither come from the pool nor go back to it.
        let pooled = if attempt_on_fresh || upgrade {
            None
        } else {
            ctx.pool.take(cluster.id)
        };
        let mut conn = match pooled {
            Some(conn) => conn,
            None => connect(cluster, limits.connect_timeout, &ctx.metrics).await?,
        };
        let reused = conn.reused;
        let sent = send_request(down, &mut conn, cluster, body, expect_continue).await;
        let outcome = match sent {
            Ok(()) => {
                // An upgrade has no head timeout beyond the connect one (as for watches).
                read_response_head(
                    cluster,
                    &mut conn,
                    &mut down.response,
                    long_running || upgrade,
                    limits,
                    upgrade,
                )
                .await
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => break conn,
            Err(Failure::Answer(GatewayError::UpstreamClosed { .. }))
                if reused && can_replay && !attempt_on_fresh =>
            {
                debug!(cluster = %cluster.name, "pooled connection was closed by the member; retrying on a new one");
                attempt_on_fresh = true;
            }
            Err(e) => return Err(e),
        }
    };
    if upgrade && down.response.code == 101 {
        return relay_upgrade(ctx, down, conn, cluster, verb, started).await;
    }

    let kind = match response_body(
        &down.response,
        if method_is_head { b"HEAD" } else { b"GET" },
    ) {
        Ok(kind) => kind,
        Err(e) => {
            warn!(cluster = %cluster.name, error = %e, "invalid response framing from member");
            return Err(GatewayError::UpstreamProtocol {
                cluster: cluster.name.to_string(),
                reason: e.0,
            }
            .into());
        }
    };
    // A refused upgrade (the member's 400 or 403 Status) is relayed as it came, then both
    // connections close: the client may already have sent bytes meant for the new protocol, and
    // the dedicated member connection never joins the pool.
    // While draining, a response tells the client this connection ends with it.
    let client_close = wants_close(&down.head)
        || kind == BodyKind::CloseDelimited
        || upgrade
        || ctx.shutdown.is_draining();
    let upstream_reusable =
        kind != BodyKind::CloseDelimited && !wants_close(&down.response) && !upgrade;

    // The response head, then whatever body bytes already arrived, in one write.
    down.out.clear();
    write_response_head(&mut down.out, &down.response, client_close);
    let code = down.response.code;
    let elapsed = started.elapsed();
    ctx.metrics_cache.record(
        &ctx.metrics,
        (cluster.id, &cluster.name),
        verb,
        code,
        elapsed,
    );
    debug!(
        shard = ctx.shard,
        cluster = %cluster.name,
        verb,
        code,
        head_us = elapsed.as_micros() as u64,
        long_running,
        "response head relayed"
    );
    let mut progress = BodyProgress::new(kind);
    let first = progress
        .take(&conn.buf)
        .map_err(|_| Failure::Abort("invalid chunked framing from member"))?;
    down.out.extend_from_slice(&conn.buf[..first]);
    conn.buf.advance(first);
    down.io
        .write_all(&down.out)
        .await
        .map_err(|_| Failure::Abort("client write failed"))?;
    stream_response_body(down, &mut conn, &mut progress, long_running).await?;
    down.io
        .flush()
        .await
        .map_err(|_| Failure::Abort("client flush failed"))?;
    if upstream_reusable && conn.buf.is_empty() && progress.is_done() {
        ctx.pool.put(conn);
    }
    Ok(if client_close {
        Next::Close
    } else {
        Next::KeepAlive
    })
}

/// Sends the request head and body to the member.
async fn send_request<S>(
    down: &mut Downstream<'_, S>,
    conn: &mut UpstreamConn,
    cluster: &ClusterRoute,
    body: BodyKind,
    expect_continue: bool,
) -> Result<(), Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let closed = |e: io::Error| {
        Failure::Answer(GatewayError::UpstreamClosed {
            cluster: cluster.name.to_string(),
            source: Some(e),
        })
    };
    let mut progress = BodyProgress::new(body);
    if progress.is_done() {
        conn.io.write_all(&down.out).await.map_err(closed)?;
        return conn.io.flush().await.map_err(closed);
    }
    conn.io.write_all(&down.out).await.map_err(closed)?;
    if expect_continue && down.buf.is_empty() {
        // The gateway answers `Expect: 100-continue` itself (and does not forward it), so the
        // client sends its body without waiting for a 100 the member might never send.
        down.io
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(|_| Failure::Abort("client write failed"))?;
        down.io
            .flush()
            .await
            .map_err(|_| Failure::Abort("client flush failed"))?;
    }
    loop {
        if !down.buf.is_empty() {
            let n = progress.take(&down.buf).map_err(|e| {
                // Part of the body may be upstream already: this connection is dropped with
                // the request, and the client gets a 400 and a close.
                Failure::Answer(GatewayError::BadRequest { reason: e.0 })
            })?;
            // A member that stops reading the body (it answered early, or hangs) must not hold
            // the client forever.
            match runtime::timeout(BODY_STALL_TIMEOUT, conn.io.write_all(&down.buf[..n])).await {
                Ok(written) => written.map_err(closed)?,
                Err(_) => {
                    return Err(Failure::Answer(GatewayError::UpstreamProtocol {
                        cluster: cluster.name.to_string(),
                        reason: "stopped reading the request body",
                    }))
                }
            }
            down.buf.advance(n);
        }
        if progress.is_done() {
            break;
        }
        down.buf.reserve(READ_CHUNK);
        match runtime::timeout(BODY_STALL_TIMEOUT, down.io.read_buf(&mut down.buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err(Failure::Abort("client went away during the request body")),
        }
    }
    // Nothing has gone to the client yet, so a member failure is still answered with a Status.
    conn.io.flush().await.map_err(closed)
}

/// Writes the status line and the end-to-end headers of a member's response.
fn write_response_head(out: &mut Vec<u8>, response: &Head, close: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    let _ = write!(out, "{:03}", response.code);
    out.push(b' ');
    out.extend_from_slice(response.reason());
    out.extend_from_slice(b"\r\n");
    for (name, value) in response.headers() {
        if !is_hop_by_hop(response, name) {
            push_header(out, name, value);
        }
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Streams the rest of a response body to the client, one flush per member read. For
/// long-running responses it also watches the client: a client that closes ends the stream at
/// once instead of at the next event; and it watches the route: once the route is retired (its
/// cluster removed or changed) the stream ends cleanly at a chunk boundary (`retired`).
async fn stream_response_body<S>(
    down: &mut Downstream<'_, S>,
    conn: &mut UpstreamConn,
    progress: &mut BodyProgress,
    long_running: bool,
) -> Result<(), Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // Registered with the route on the first idle wait; afterwards one atomic load per poll.
    // Borrowed, not cloned: no shared reference count touched per response.
    let retirement = &*conn.retirement;
    let mut retired = retirement.listen();
    let mut finish_chunk_by: Option<Instant> = None;
    while !progress.is_done() {
        down.io
            .flush()
            .await
            .map_err(|_| Failure::Abort("client flush failed"))?;
        if long_running && retirement.is_retired() {
            match retired_end(progress) {
                RetiredEnd::Done => break,
                RetiredEnd::LastChunk => {
                    down.io
                        .write_all(LAST_CHUNK)
                        .await
                        .map_err(|_| Failure::Abort("client write failed"))?;
                    *progress = BodyProgress::Done;
                    break;
                }
                RetiredEnd::Close => {
                    *progress = BodyProgress::Done;
                    break;
                }
                RetiredEnd::Cut => return Err(Failure::Abort("route retired mid-body")),
                RetiredEnd::FinishChunk => {
                    finish_chunk_by.get_or_insert_with(|| Instant::now() + FINISH_CHUNK_WITHIN);
                }
            }
        }
        let read = if let Some(deadline) = finish_chunk_by {
            // Retired inside a chunk: the rest of it, briefly, then the last chunk.
            conn.buf.reserve(IDLE_STREAM_BUFFER);
            let left = deadline.saturating_duration_since(Instant::now());
            match runtime::timeout(left, conn.io.read_buf(&mut conn.buf)).await {
                Ok(read) => read,
                Err(_) => return Err(Failure::Abort("route retired inside a chunk")),
            }
        } else if long_running {
            // A watch or log stream is idle most of the time: keep its buffer small, and give
            // back a large one a burst (a watch replay) left behind.
            if conn.buf.is_empty() && conn.buf.capacity() > IDLE_STREAM_BUFFER * 4 {
                conn.buf = BytesMut::new();
            }
            conn.buf.reserve(IDLE_STREAM_BUFFER);
            // Pipelined bytes from the client are kept, within the head limit.
            let watch_client = down.buf.len() < RESPONSE_HEAD_LIMITS.max_head_bytes;
            down.buf.reserve(1024);
            let client = async {
                if watch_client {
                    down.io.read_buf(&mut down.buf).await
                } else {
                    std::future::pending().await
                }
            };
            let member_or_client = runtime::race(conn.io.read_buf(&mut conn.buf), client);
            match runtime::race(member_or_client, &mut retired).await {
                First::Left(First::Left(read)) => read,
                First::Left(First::Right(Ok(0) | Err(_))) => {
                    return Err(Failure::Abort("client closed during a stream"))
                }
                First::Left(First::Right(Ok(_))) => continue,
                // Checked at the top of the loop.
                First::Right(()) => continue,
            }
        } else {
            conn.buf.reserve(READ_CHUNK);
            conn.io.read_buf(&mut conn.buf).await
        };
        match read {
            Ok(0) | Err(_) => {
                if matches!(progress, BodyProgress::UntilClose) {
                    *progress = BodyProgress::Done;
                    return Ok(());
                }
                return Err(Failure::Abort("member closed inside the response body"));
            }
            Ok(_) => {}
        }
        let n = progress
            .take(&conn.buf)
            .map_err(|_| Failure::Abort("invalid chunked framing from member"))?;
        down.io
            .write_all(&conn.buf[..n])
            .await
            .map_err(|_| Failure::Abort("client write failed"))?;
        conn.buf.advance(n);
    }
    Ok(())
}
