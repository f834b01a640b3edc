//! The HTTP/1.1 front-end: reads requests from one client connection, hands each to the pipeline
//! (`handle::serve`: decided, admitted, proxied or answered, audited) as a [`handle::Session`],
//! and writes the responses back in order until the client or an error closes the connection.
//!
//! Only what is HTTP/1.1's own lives here: head reading with its timeouts (slow-loris defense),
//! the client's body framing and `Expect: 100-continue`, the `Connection` rules, keep-alive and
//! pipelining (a pipelined request waits in the read buffer until the previous response is done),
//! upgrades (the 101 relayed, then both connections spliced), the client side of the body relay
//! (the member's bytes written as they came, the response head and the first bytes in one
//! write), and the gateway's own responses chunked (or, to an HTTP/1.0 client, delimited by the
//! close). Generic over the stream type, so the same code serves TLS and plaintext sockets.
//! Called by `server::shard` for each accepted connection (plaintext, or TLS without h2).

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use fleetgate_config_watcher::{ClusterRoute, Limits};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::debug;

use crate::codec::http1::{
    chunk_size_line, is_hop_by_hop, parse_request, push_header, request_body, BodyKind,
    BodyProgress, ChunkedScanner, Head, HeadError, HeadLimits, CHUNK_SIZE_ROOM,
};
use crate::errors::GatewayError;
use crate::exchange::member_head;
use crate::exchange::relay::{relay, ClientEvent, ResponseSink};
use crate::exchange::reply::Reply;
use crate::exchange::retired::LAST_CHUNK;
use crate::exchange::splice::splice;
use crate::exchange::{
    self, Answer, Failure, MemberConn, RequestBody, BODY_STALL_TIMEOUT, READ_CHUNK,
};
use crate::handle::ShardContext;
use crate::handle::{
    self, BodyLimit, ClientHead, ClientIdentity, Connection, Exchange, Handled, Next, Protocol,
    Relay, Relayed, ReplyKind, Session, Start, Upgrade,
};
use crate::observe::audit::AuditRequest;
use crate::runtime::{self, clock, Deadline, First};

/// Requests served on one connection between two yields to the shard's other connections.
const YIELD_EVERY_REQUESTS: u32 = 32;
/// How long a request head may take to arrive once it has started (slow-loris defense).
const HEAD_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Per-connection state reused for every request on it.
struct Downstream<'a, S> {
    io: &'a mut S,
    buf: BytesMut,
    scanned: usize,
    response: Head,
    out: Vec<u8>,
    /// Times every phase of the connection: the next request, its head, the member's answer.
    deadline: Deadline,
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
        response: Head::default(),
        out: Vec::with_capacity(1024),
        deadline: Deadline::new(),
    };
    // The request head: apart from `down`, so a decided request can borrow from it while the
    // connection's buffers and socket carry it.
    let mut head = Head::default();
    let conn = Connection::new(&ctx, peer, identity);
    let mut served = 0u32;
    loop {
        // A client that pipelines requests the gateway answers itself (health checks, refusals)
        // never waits on I/O: it yields now and then, so it cannot keep the shard to itself.
        served += 1;
        if served.is_multiple_of(YIELD_EVERY_REQUESTS) {
            runtime::yield_now().await;
        }
        let limits = ctx.exchange.table.load().gateway().limits;
        match read_request_head(&mut down, &mut head, limits, &ctx.exchange.drain).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(err) => {
                crate::errors::log_answered(&err, "request");
                write_status(&mut down, &err, true, false).await;
                break;
            }
        }
        match serve_request(&ctx, &conn, &mut down, &head, limits).await {
            Next::KeepAlive => continue,
            Next::Close => break,
        }
    }
    let _ = down.io.shutdown().await;
}

/// Checks one parsed request's framing and hands it to the pipeline.
async fn serve_request<S>(
    ctx: &ShardContext,
    conn: &Connection,
    down: &mut Downstream<'_, S>,
    head: &Head,
    limits: Limits,
) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let checked = request_body(head)
        .map_err(|e| GatewayError::BadRequest { reason: e.0 })
        .and_then(|body| {
            let names_fields = head.connection.others
                && member_head::check_connection(head.values(b"connection"))?;
            Ok((body, names_fields))
        });
    let mut session = Request {
        down,
        body: BodyKind::Empty,
        names_fields: false,
        close: true,
        client_close: true,
        limits,
    };
    match checked {
        Ok((body, names_fields)) => {
            session.body = body;
            session.names_fields = names_fields;
            // A request whose body the gateway will not read leaves the connection unusable,
            // and so does an upgrade that fails: the client may already be sending bytes of
            // the new protocol.
            session.close = wants_close(head) || body != BodyKind::Empty || head.connection.upgrade;
        }
        Err(error) => {
            return Box::pin(handle::refuse_early(
                ctx,
                conn,
                head,
                &mut session,
                &error,
                started,
            ))
            .await
        }
    }
    match handle::serve(ctx, conn, head, &mut session, started).await {
        Handled::Done(next) => next,
        // Boxed: a shared watch's follower is no room in every other request's future (a plain
        // watch's task holds that future for as long as its client watches).
        Handled::Follow(mut following) => {
            Box::pin(async move {
                // The connection closes after a shared watch.
                let mut reply = session.reply(head, ReplyKind::SharedWatch);
                let followed = following.follow(ctx, &mut reply).await;
                let sent = reply.head_sent();
                drop(reply);
                if let (Err(Failure::Answer(error)), false) = (followed, sent) {
                    crate::errors::log_answered(&error, "request");
                    session.answer_status(head, &error, true).await;
                }
                Next::Close
            })
            .await
        }
    }
}

/// One request on an HTTP/1.1 connection, as the pipeline sees it.
struct Request<'d, 'a, S> {
    down: &'d mut Downstream<'a, S>,
    /// The framing of the request body, decided from the head.
    body: BodyKind,
    /// The client's `Connection` field names other fields.
    names_fields: bool,
    /// The connection closes after this request whatever the answer.
    close: bool,
    /// The connection closes after the member's response (`start_response` decides).
    client_close: bool,
    limits: Limits,
}

impl ClientHead for Head {
    fn method(&self) -> &[u8] {
        Head::method(self)
    }

    fn target(&self) -> &[u8] {
        Head::target(self)
    }

    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        Head::headers(self)
    }

    fn accept(&self) -> impl Iterator<Item = &[u8]> {
        self.values(b"accept")
    }

    fn connection_has(&self, name: &[u8]) -> bool {
        self.has_token(b"connection", name)
    }

    fn http10(&self) -> bool {
        self.minor_version == 0
    }

    fn audit_request(&self, peer: SocketAddr) -> AuditRequest {
        AuditRequest::from_head(self, peer)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Session for Request<'_, '_, S> {
    type Head = Head;
    const PROTOCOL: Protocol = Protocol::Http1;

    fn body_kind(&self) -> BodyKind {
        self.body
    }

    fn names_fields(&self) -> bool {
        self.names_fields
    }

    fn closes(&self) -> bool {
        self.close
    }

    fn upgrade(&self, head: &Head) -> Result<Upgrade, GatewayError> {
        let asked = requested_upgrade(head)?;
        Ok(if asked {
            Upgrade::FromClient
        } else {
            Upgrade::None
        })
    }

    async fn answer_status(&mut self, head: &Head, error: &GatewayError, close: bool) {
        write_status(self.down, error, close, head.method() == b"HEAD").await;
    }

    async fn answer_health(&mut self, head: &Head) -> Next {
        let close = self.close;
        let mut reply = if close { HEALTH_OK_CLOSE } else { HEALTH_OK };
        if head.method() == b"HEAD" {
            reply = &reply[..reply.len() - 2];
        }
        let io = &mut *self.down.io;
        let ok = io.write_all(reply).await.is_ok() && io.flush().await.is_ok();
        if ok && !close {
            Next::KeepAlive
        } else {
            Next::Close
        }
    }

    async fn read_body(&mut self, head: &Head, limit: BodyLimit) -> Result<Bytes, Failure> {
        read_whole_body(self.down, head, self.body, limit).await
    }

    fn reply(&mut self, head: &Head, kind: ReplyKind) -> impl Reply + '_ {
        let chunked = head.minor_version > 0;
        let close = match kind {
            // A watch's connection closes after it: the client's bytes meanwhile were not kept.
            // That is not announced (the member announces nothing on a watch): a client told
            // `Connection: close` may hand the socket to the response, and Python's http.client
            // then cannot shut it down to stop a watch (kubernetes-client's `Watch.stop()`).
            ReplyKind::Fleet | ReplyKind::FleetWatch => self.close || !chunked,
            ReplyKind::SharedWatch => {
                // A shared watch holds its connection until the client leaves, and the
                // connection closes after it: the request head's buffers go now instead (the
                // next read makes a new one, should the watch be proxied after all). Bytes a
                // client pipelined stay where they are.
                if self.down.buf.is_empty() {
                    self.down.buf = BytesMut::new();
                }
                self.down.out = Vec::new();
                !chunked || wants_close(head)
            }
        };
        FleetConnection {
            io: &mut *self.down.io,
            chunked,
            close,
            keep: kind == ReplyKind::Fleet && !close,
            write_timeout: self.limits.client_write_timeout,
            head_sent: false,
        }
    }

    fn exchange(&mut self, head: &Head) -> Exchange<'_, impl RequestBody + '_> {
        let down = &mut *self.down;
        Exchange {
            member_head: &mut down.out,
            response: &mut down.response,
            deadline: &mut down.deadline,
            body: ClientBody {
                io: &mut *down.io,
                buf: &mut down.buf,
                progress: BodyProgress::new(self.body),
                expect_continue: self.body != BodyKind::Empty && head.expect_continue,
            },
        }
    }

    fn start_response(&mut self, head: &Head, start: Start<'_>) -> Result<(), Failure> {
        let (ctx, answer, cluster, how) = (start.ctx, start.answer, start.cluster, start.how);
        let response = &self.down.response;
        if how.upgrade && response.code == 101 {
            debug!(
                shard = ctx.exchange.shard,
                cluster,
                protocol = %String::from_utf8_lossy(response.value(b"upgrade").unwrap_or_default()),
                head_us = how.started.elapsed().as_micros() as u64,
                "upgraded; splicing"
            );
            return Ok(());
        }
        // A refused upgrade (the member's 400 or 403 Status) is relayed as it came, then both
        // connections close: the client may already have sent bytes meant for the new protocol,
        // and the dedicated member connection never joins the pool.
        // While draining, a response tells the client this connection ends with it.
        self.client_close = wants_close(head)
            || answer.body == BodyKind::CloseDelimited
            || how.upgrade
            || ctx.exchange.drain.is_draining();
        self.down.out.clear();
        write_response_head(&mut self.down.out, response, self.client_close);
        Ok(())
    }

    async fn relay(&mut self, to: Relay<'_>) -> Result<Relayed, Failure> {
        let Relay { ctx, answer, how } = to;
        let down = &mut *self.down;
        if how.upgrade && down.response.code == 101 {
            // Boxed, as the refusals: rare paths keep no space in every connection's task.
            let next = Box::pin(relay_upgrade(ctx, down, answer)).await?;
            return Ok(Relayed {
                next,
                complete: false,
            });
        }
        if how.long_running {
            // The response head is in `down.out` already; a stream that may idle for hours
            // keeps no copy of it (its code stays, for the audit log).
            down.response.shed();
        }
        let mut sink = ClientSink {
            io: &mut *down.io,
            out: &mut down.out,
            head_pending: true,
            pipelined: &mut down.buf,
            max_pipelined: how.limits.max_head_bytes,
        };
        let pace = how.pace(&ctx.exchange.drain);
        let complete = relay(answer, &mut sink, pace).await?;
        let next = if self.client_close {
            Next::Close
        } else {
            Next::KeepAlive
        };
        Ok(Relayed { next, complete })
    }

    fn abort(&mut self) {
        // The connection closes: the front-end's loop ends on `Next::Close`.
    }
}

/// Reads until a whole request head is parsed. `Ok(false)`: the client closed, idled out
/// (`limits.idle_timeout` between requests), or the connection is idle while the gateway drains.
async fn read_request_head<S: AsyncRead + Unpin>(
    down: &mut Downstream<'_, S>,
    head: &mut Head,
    limits: Limits,
    drain: &crate::runtime::shutdown::ShardDrain,
) -> Result<bool, GatewayError> {
    let head_limits = HeadLimits {
        max_head_bytes: limits.max_head_bytes,
        max_headers: limits.max_headers,
    };
    // Once a head has started it must be complete within HEAD_READ_TIMEOUT in total, however
    // slowly its bytes trickle in.
    let mut head_deadline = (!down.buf.is_empty()).then(|| clock::now() + HEAD_READ_TIMEOUT);
    loop {
        match parse_request(&mut down.buf, &mut down.scanned, head_limits, head) {
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
                head_deadline = Some(clock::now() + HEAD_READ_TIMEOUT);
                Some(HEAD_READ_TIMEOUT)
            }
            Some(deadline) => Some(deadline.saturating_duration_since(clock::now())),
        };
        down.buf.reserve(4096);
        let read = async {
            match wait {
                Some(wait) => down
                    .deadline
                    .within(wait, down.io.read_buf(&mut down.buf))
                    .await
                    .ok(),
                None => Some(down.io.read_buf(&mut down.buf).await),
            }
        };
        let read = if idle {
            // Between requests: a drain closes the connection now (a started head is read on).
            match runtime::race(read, drain.started()).await {
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

/// Writes the Status of `err`; `head_method` when the request was a HEAD.
async fn write_status<S: AsyncWrite + Unpin>(
    down: &mut Downstream<'_, S>,
    err: &GatewayError,
    close: bool,
    head_method: bool,
) {
    let response = err.to_response(close);
    // A response to HEAD has no body (its Content-Length still says how long it would be).
    let response = if head_method {
        let end = crate::codec::http1::find_head_end(&response, 0).unwrap_or(response.len());
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
        !head.connection.keep_alive
    } else {
        head.connection.close
    }
}

const HEALTH_OK: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 2\r\n\r\nok";
const HEALTH_OK_CLOSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok";

/// A response the gateway writes itself (fleet view, shared watch) on an HTTP/1.1 connection.
struct FleetConnection<'a, S> {
    io: &'a mut S,
    chunked: bool,
    /// The response head says `Connection: close`.
    close: bool,
    /// The connection carries another request after it.
    keep: bool,
    write_timeout: Duration,
    head_sent: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> FleetConnection<'_, S> {
    /// Writes `data` within the write timeout; a client that does not take it is cut. A chain
    /// of pieces goes out in as few writes as the stream allows (tokio's `write_all_buf` hands
    /// them to one vectored write): over TLS one record and one socket write for a watch event's
    /// chunk (size line, event, CRLF) instead of three.
    async fn write(&mut self, mut data: impl Buf) -> Result<(), Failure> {
        match runtime::timeout(self.write_timeout, self.io.write_all_buf(&mut data)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Failure::Abort("client went away")),
            Err(_) => Err(Failure::Abort("client stopped reading")),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Reply for FleetConnection<'_, S> {
    async fn head(&mut self, content_type: &str, warnings: &[String]) -> Result<(), Failure> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\nCache-Control: no-cache, private\r\n");
        out.extend_from_slice(b"Content-Type: ");
        out.extend_from_slice(content_type.as_bytes());
        out.extend_from_slice(b"\r\n");
        for warning in warnings {
            out.extend_from_slice(b"Warning: ");
            out.extend_from_slice(exchange::reply::warning_value(warning).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if self.close {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        if self.chunked {
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        }
        out.extend_from_slice(b"\r\n");
        self.head_sent = true;
        self.write(&out[..]).await
    }

    async fn body(&mut self, piece: Bytes) -> Result<(), Failure> {
        if !self.chunked {
            return self.write(piece).await;
        }
        let mut room = [0u8; CHUNK_SIZE_ROOM];
        let size = chunk_size_line(&mut room, piece.len());
        self.write(Buf::chain(size, piece).chain(&b"\r\n"[..]))
            .await
    }

    async fn gone(&mut self) {
        // The connection closes after a fleet response that waits on its client (a watch):
        // whatever the client sends meanwhile is not read as a request.
        let mut byte = [0u8; 1];
        loop {
            match self.io.read(&mut byte).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    async fn end(&mut self) -> Result<(), Failure> {
        if self.chunked {
            self.write(&b"0\r\n\r\n"[..]).await?;
        }
        self.io
            .flush()
            .await
            .map_err(|_| Failure::Abort("client went away"))
    }

    fn head_sent(&self) -> bool {
        self.head_sent
    }

    fn keeps_connection(&self) -> bool {
        self.keep
    }
}

/// Whether the request asks to switch to a protocol the gateway carries (SPDY/3.1 for exec,
/// attach and port-forward, WebSocket for the same since kubectl 1.30). Only HTTP/1.1 can
/// upgrade; an `Upgrade` without `Connection: upgrade` is an ordinary request whose hop-by-hop
/// `Upgrade` is dropped. Any other protocol (h2c, say) is refused: the gateway would not know
/// what it relays.
fn requested_upgrade(head: &Head) -> Result<bool, GatewayError> {
    if head.minor_version == 0 || !head.connection.upgrade {
        return Ok(false);
    }
    let mut protocols = head
        .values(b"upgrade")
        .flat_map(|v| v.split(|b| *b == b','))
        .map(crate::codec::http1::head::trim)
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

/// The whole request body, its framing taken off, for a request the gateway answers itself from
/// several members (a fleet access review), within `limit`. The
/// client's bytes past it stay in the read buffer.
async fn read_whole_body<S>(
    down: &mut Downstream<'_, S>,
    head: &Head,
    kind: BodyKind,
    limit: BodyLimit,
) -> Result<Bytes, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (max, too_large) = (limit.max, || Failure::Answer((limit.too_large)()));
    let (mut left, mut chunks) = match kind {
        BodyKind::Empty => return Ok(Bytes::new()),
        BodyKind::Length(n) if n > max as u64 => return Err(too_large()),
        BodyKind::Length(n) => (n as usize, None),
        BodyKind::Chunked => (0, Some(ChunkedScanner::new())),
        // Not a request body's framing.
        BodyKind::CloseDelimited => return Err(too_large()),
    };
    if head.expect_continue && down.buf.is_empty() {
        write_now(down.io, CONTINUE).await?;
    }
    let mut body = Vec::new();
    loop {
        let taken = match &mut chunks {
            Some(scanner) => {
                let buf = &down.buf[..];
                let taken = scanner
                    .scan_data(buf, |data| body.extend_from_slice(&buf[data]))
                    .map_err(|e| Failure::Answer(GatewayError::BadRequest { reason: e.0 }))?;
                if scanner.is_done() {
                    chunks = None;
                }
                taken
            }
            None => {
                let taken = left.min(down.buf.len());
                body.extend_from_slice(&down.buf[..taken]);
                left -= taken;
                taken
            }
        };
        down.buf.advance(taken);
        if body.len() > max {
            return Err(too_large());
        }
        if chunks.is_none() && left == 0 {
            return Ok(Bytes::from(body));
        }
        down.buf.reserve(READ_CHUNK);
        match runtime::timeout(BODY_STALL_TIMEOUT, down.io.read_buf(&mut down.buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err(Failure::Abort("client went away during the request body")),
        }
    }
}

/// The request body from the client connection: the bytes past the head in the read buffer, then
/// reads, validated against the framing decided from the head (a chunked body's framing passes
/// as it came, since the member gets `Transfer-Encoding: chunked` from the gateway).
struct ClientBody<'a, S> {
    io: &'a mut S,
    buf: &'a mut BytesMut,
    progress: BodyProgress,
    expect_continue: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> RequestBody for ClientBody<'_, S> {
    async fn send(&mut self, conn: &mut MemberConn, cluster: &ClusterRoute) -> Result<(), Failure> {
        if self.progress.is_done() {
            return Ok(());
        }
        if self.expect_continue && self.buf.is_empty() {
            // The gateway answers `Expect: 100-continue` itself (and does not forward it), so the
            // client sends its body without waiting for a 100 the member might never send.
            self.expect_continue = false;
            write_now(self.io, CONTINUE).await?;
        }
        loop {
            if !self.buf.is_empty() {
                let n = self.progress.take(self.buf).map_err(|e| {
                    // Part of the body may be upstream already: this connection is dropped with
                    // the request, and the client gets a 400 and a close.
                    Failure::Answer(GatewayError::BadRequest { reason: e.0 })
                })?;
                // A member that stops reading the body (it answered early, or hangs) must not
                // hold the client forever.
                let write = conn.io.write_all(&self.buf[..n]);
                match runtime::timeout(BODY_STALL_TIMEOUT, write).await {
                    Ok(written) => written.map_err(|e| GatewayError::UpstreamClosed {
                        cluster: cluster.name.to_string(),
                        source: Some(e),
                    })?,
                    Err(_) => {
                        return Err(Failure::Answer(GatewayError::UpstreamProtocol {
                            cluster: cluster.name.to_string(),
                            reason: "stopped reading the request body",
                        }))
                    }
                }
                self.buf.advance(n);
            }
            if self.progress.is_done() {
                return Ok(());
            }
            self.buf.reserve(READ_CHUNK);
            match runtime::timeout(BODY_STALL_TIMEOUT, self.io.read_buf(self.buf)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Err(Failure::Abort("client went away during the request body")),
            }
        }
    }

    fn client_gone(&mut self) -> impl std::future::Future<Output = ()> {
        // Nothing past the body is read before the response: a pipelined request is not a
        // client going away.
        std::future::pending()
    }
}

/// The client side of a response body: the bytes as the member sent them (chunked framing
/// included), the response head and the first piece in one write.
struct ClientSink<'a, S> {
    io: &'a mut S,
    /// The response head, until it is written.
    out: &'a mut Vec<u8>,
    head_pending: bool,
    /// What the client sends while a response streams (a pipelined request), kept for later.
    pipelined: &'a mut BytesMut,
    max_pipelined: usize,
}

/// Below this size, a body piece is copied behind the response head and both go in one write.
const COALESCE_WITH_HEAD: usize = 16 * 1024;

impl<S: AsyncRead + AsyncWrite + Unpin> ClientSink<'_, S> {
    async fn write_head(&mut self) -> Result<(), Failure> {
        if self.head_pending {
            self.head_pending = false;
            self.io
                .write_all(self.out)
                .await
                .map_err(|_| Failure::Abort("client write failed"))?;
        }
        Ok(())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> ResponseSink for ClientSink<'_, S> {
    fn decodes_chunks(&self) -> bool {
        false
    }

    async fn send(&mut self, piece: Bytes) -> Result<(), Failure> {
        if self.head_pending && piece.len() <= COALESCE_WITH_HEAD {
            self.out.extend_from_slice(&piece);
            return self.write_head().await;
        }
        self.write_head().await?;
        self.io
            .write_all(&piece)
            .await
            .map_err(|_| Failure::Abort("client write failed"))
    }

    async fn flush(&mut self) -> Result<(), Failure> {
        self.write_head().await?;
        self.io
            .flush()
            .await
            .map_err(|_| Failure::Abort("client flush failed"))
    }

    async fn end(&mut self) -> Result<(), Failure> {
        self.flush().await
    }

    async fn end_early(&mut self, last_chunk: bool) -> Result<(), Failure> {
        self.write_head().await?;
        if last_chunk {
            self.io
                .write_all(LAST_CHUNK)
                .await
                .map_err(|_| Failure::Abort("client write failed"))?;
        }
        self.flush().await
    }

    async fn client_event(&mut self) -> ClientEvent {
        // A client may pipeline a request behind a stream, within the head limit; more than
        // that while a response streams is not a request, and ends the stream.
        if self.pipelined.len() >= self.max_pipelined {
            return ClientEvent::Gone;
        }
        if !self.pipelined.is_empty() {
            self.pipelined.reserve(1024);
            return match self.io.read_buf(self.pipelined).await {
                Ok(0) | Err(_) => ClientEvent::Gone,
                Ok(_) => ClientEvent::Sent,
            };
        }
        // An idle stream waits holding no buffer: the head buffers go (the response head is out,
        // the request's bytes were consumed), and the wait is a one-byte read (a client rarely
        // sends anything during a stream; the next request head's read grows the buffer again).
        if !self.head_pending {
            *self.out = Vec::new();
        }
        *self.pipelined = BytesMut::new();
        let mut first = [0u8; 1];
        match self.io.read(&mut first).await {
            Ok(0) | Err(_) => ClientEvent::Gone,
            Ok(_) => {
                self.pipelined.extend_from_slice(&first);
                ClientEvent::Sent
            }
        }
    }
}

/// Relays the member's 101 to the client, then splices the two connections until both close.
/// The dedicated member connection is dropped by the pipeline after; the client connection is
/// closed.
async fn relay_upgrade<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    answer: &mut Answer,
) -> Result<Next, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    down.out.clear();
    write_switching_head(&mut down.out, &down.response);
    write_now(down.io, &down.out).await?;
    let _upgraded = ctx.exchange.shard_metrics.upgraded_stream_opened();
    // Bytes the client sent past its head, and the member past its 101, go first.
    let client_pending = std::mem::take(&mut down.buf);
    let member_pending = std::mem::take(&mut answer.conn.buf);
    let retired = answer.conn.retirement.listen();
    match splice(
        &mut *down.io,
        &mut answer.conn.io,
        client_pending,
        member_pending,
        retired,
    )
    .await
    {
        Ok(totals) => debug!(
            client_to_member = totals.client_to_member,
            member_to_client = totals.member_to_client,
            retired = totals.retired,
            "upgraded stream closed"
        ),
        Err(error) => debug!(%error, "upgraded stream failed"),
    }
    Ok(Next::Close)
}

/// The interim response to `Expect: 100-continue`.
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Writes the gateway's own interim or switching head and flushes it.
async fn write_now<S: AsyncWrite + Unpin>(io: &mut S, bytes: &[u8]) -> Result<(), Failure> {
    io.write_all(bytes)
        .await
        .map_err(|_| Failure::Abort("client write failed"))?;
    io.flush()
        .await
        .map_err(|_| Failure::Abort("client flush failed"))
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

/// Writes the status line and the end-to-end headers of a member's response.
fn write_response_head(out: &mut Vec<u8>, response: &Head, close: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    let code = response.code.min(999);
    out.extend_from_slice(&[
        b'0' + (code / 100) as u8,
        b'0' + (code / 10 % 10) as u8,
        b'0' + (code % 10) as u8,
        b' ',
    ]);
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

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::FleetConnection;
    use crate::exchange::reply::Reply as _;

    /// A client socket that takes at most `room` bytes a call and counts the calls.
    struct Narrow {
        out: Vec<u8>,
        room: usize,
        calls: usize,
    }

    impl tokio::io::AsyncRead for Narrow {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Poll::Pending
        }
    }

    impl tokio::io::AsyncWrite for Narrow {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            self.calls += 1;
            let mut taken = 0;
            for buf in bufs {
                let n = buf.len().min(self.room - taken);
                self.out.extend_from_slice(&buf[..n]);
                taken += n;
            }
            Poll::Ready(Ok(taken))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// What a chunked watch response's client receives for `events`, through a socket that
    /// takes `room` bytes a call.
    fn sent(events: &[&[u8]], room: usize) -> Narrow {
        let mut io = Narrow {
            out: Vec::new(),
            room,
            calls: 0,
        };
        crate::runtime::tests::block_on(async {
            let mut client = FleetConnection {
                io: &mut io,
                chunked: true,
                close: true,
                keep: false,
                write_timeout: Duration::from_secs(5),
                head_sent: true,
            };
            for event in events {
                let sent = client.body(Bytes::copy_from_slice(event)).await;
                assert!(sent.is_ok(), "the socket took the event");
            }
        });
        io
    }

    #[test]
    fn a_watch_events_chunk_goes_out_in_one_write() {
        let io = sent(&[br#"{"type":"ADDED","object":{}}"#], 64 * 1024);
        assert_eq!(io.out, b"1c\r\n{\"type\":\"ADDED\",\"object\":{}}\r\n");
        assert_eq!(io.calls, 1);
    }

    proptest! {
        // However little the socket takes a call, every event goes out whole, in order and
        // once, each in its chunk.
        #[test]
        fn events_go_out_whole_and_in_order(
            events in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..8),
            room in 1usize..50,
        ) {
            let slices: Vec<&[u8]> = events.iter().map(Vec::as_slice).collect();
            let io = sent(&slices, room);
            let mut expected = Vec::new();
            for event in &events {
                expected.extend_from_slice(format!("{:x}\r\n", event.len()).as_bytes());
                expected.extend_from_slice(event);
                expected.extend_from_slice(b"\r\n");
            }
            prop_assert_eq!(io.out, expected);
        }
    }
}
