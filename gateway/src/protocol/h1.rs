//! The HTTP/1.1 front-end: reads requests from one client connection, has each decided
//! (`request::decide`) and carried to its member by the exchange, and writes the responses back in
//! order until the client or an error closes the connection.
//!
//! What is HTTP/1.1's own lives here: head reading with its timeouts (slow-loris defense), the
//! client's body framing and `Expect: 100-continue`, the `Connection` rules, keep-alive and
//! pipelining (a pipelined request waits in the read buffer until the previous response is done),
//! upgrades (the 101 relayed, then both connections spliced), and the client side of the body
//! relay (the member's bytes written as they came, the response head and the first bytes in one
//! write). Generic over the stream type, so the same code serves TLS and plaintext sockets. Called
//! by `tls` and `server::shard` for each accepted connection.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use fleetgate_config_watcher::{ClusterRoute, Limits};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::debug;

use crate::auth::{self, ClientIdentity};
use crate::errors::GatewayError;
use crate::exchange::member_head::{self, MemberRequest, Upgrade};
use crate::exchange::relay::{relay, ClientEvent, ResponseSink};
use crate::exchange::retired::LAST_CHUNK;
use crate::exchange::splice::splice;
use crate::exchange::{
    self, Answer, Failure, Outbound, RequestBody, BODY_STALL_TIMEOUT, READ_CHUNK,
};
use crate::observe::audit::{AuditRequest, Classified, Outcome};
use crate::codec::http1::{
    chunk_size_line, is_hop_by_hop, parse_request, push_header, request_body, BodyKind,
    BodyProgress, ChunkedScanner, Head, HeadError, HeadLimits, CHUNK_SIZE_ROOM,
};
use crate::request::{self, Decision, Peer, Proxied};
use crate::runtime::{self, clock, Deadline, First, ShardContext};
use crate::upstream::UpstreamConn;

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
        response: Head::default(),
        out: Vec::with_capacity(1024),
        deadline: Deadline::new(),
    };
    let peer = Peer::new(peer);
    // The request head: apart from `down`, so a decided request can borrow from it while the
    // connection's buffers and socket carry it.
    let mut head = Head::default();
    let conn_auth = auth::ConnectionAuth::new(identity);
    // Who the audit log names when a request is refused before its identity is decided.
    let audit_user = ctx
        .audit
        .as_ref()
        .filter(|_| !identity.user.is_empty())
        .map(|_| Arc::new(identity.clone()));
    let mut served = 0u32;
    loop {
        // A client that pipelines requests the gateway answers itself (health checks, refusals)
        // never waits on I/O: it yields now and then, so it cannot keep the shard to itself.
        served += 1;
        if served.is_multiple_of(YIELD_EVERY_REQUESTS) {
            runtime::yield_now().await;
        }
        let limits = ctx.table.load().gateway().limits;
        match read_request_head(&mut down, &mut head, limits, &ctx.drain).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(err) => {
                respond_error(&mut down, &err, true, false).await;
                break;
            }
        }
        match handle_request(
            &ctx,
            &mut down,
            &head,
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

/// Answers with the Status of `err`; `head_method` when the request was a HEAD.
async fn respond_error<S: AsyncWrite + Unpin>(
    down: &mut Downstream<'_, S>,
    err: &GatewayError,
    close: bool,
    head_method: bool,
) {
    crate::errors::log_answered(err, "request");
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

/// Handles one parsed request: answers it itself or has it carried to its member.
async fn handle_request<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    head: &Head,
    peer: Peer,
    conn_auth: &auth::ConnectionAuth,
    audit_user: Option<&Arc<ClientIdentity>>,
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
    let (body, connection_names_fields) = match checked {
        Ok(checked) => checked,
        Err(err) => {
            respond_error(down, &err, true, head.method() == b"HEAD").await;
            let audited = Audited::default();
            audit_response(ctx, head, peer, audited, started, Outcome::Complete(400));
            return Next::Close;
        }
    };
    // A request whose body the gateway will not read leaves the connection unusable, and so does
    // an upgrade that fails: the client may already be sending bytes of the new protocol.
    let close = wants_close(head) || body != BodyKind::Empty || head.connection.upgrade;
    runtime::faults::inject(head.target());
    let table = ctx.table.load();
    let decided = request::decide(&table, conn_auth, head.method(), head.target(), || {
        head.headers()
    });
    // Admission (`spec.fairness`): the seats it takes are held until this function returns,
    // that is until the response (a watch's whole stream included) has ended.
    let _admitted = match decided.as_ref().ok().and_then(Decision::subject) {
        None => None,
        Some(subject) => {
            let fairness = &table.gateway().fairness;
            match ctx.metrics.admission.admit(fairness, &subject) {
                Ok(admitted) => Some(admitted),
                Err(error) => {
                    let classified = ctx
                        .audit
                        .as_ref()
                        .and(subject.classified)
                        .map(|(cluster, info)| Classified::new(cluster, &info, head.target()));
                    let answer = Refusal {
                        error: &error,
                        counted: subject.counted(),
                        audited: Audited {
                            authenticated: subject.authenticated,
                            acting_as: subject.acting_as,
                            classified: classified.as_ref(),
                        },
                        close,
                    };
                    return Box::pin(answer_with_status(ctx, down, head, peer, answer, started))
                        .await;
                }
            }
        }
    };
    // How a fleet-view response (whichever arm below serves one) is written.
    let fleet_answer = FleetAnswer {
        limits,
        close,
        connection_names_fields,
        started,
    };
    let proxied = match decided {
        Ok(Decision::Proxy(proxied)) => {
            if let Some(plan) = crate::watch::plan(&table, &proxied, head.values(b"accept")) {
                let shared = SharedAnswer {
                    plan,
                    peer,
                    limits,
                    started,
                };
                if let Some(next) = Box::pin(serve_shared(ctx, down, head, &proxied, shared)).await
                {
                    return next;
                }
            }
            proxied
        }
        Ok(Decision::FleetNamed(fleet)) => {
            let connection_named =
                |name: &[u8]| connection_names_fields && head.has_token(b"connection", name);
            let client_request = crate::fleet::ClientRequest {
                headers: || head.headers(),
                conn: conn_auth,
                connection_named: &connection_named,
                peer,
                limits,
                started,
            };
            match Box::pin(crate::fleet::owner::find(ctx, &fleet, &client_request)).await {
                // A plain GET: answered with the owner's object from the lookup, stamped.
                Ok(crate::fleet::owner::Owner {
                    object: Some(object),
                    ..
                }) => {
                    let work = FleetWork::Object(&fleet, object);
                    let answer = fleet_answer;
                    return Box::pin(serve_fleet(ctx, down, head, work, peer, conn_auth, answer))
                        .await;
                }
                Ok(owner) => fleet.into_owner(owner.index),
                Err(Failure::Answer(error)) => {
                    // No owner (404), several (409), or some could not be asked (503): answered
                    // and audited as any refusal, the request classified as the fleet view's.
                    ctx.shard_metrics
                        .fleet_answered(fleet.verb, Some(error.code_and_reason().0));
                    let classified = Classified::fleet(&fleet.info, head.target());
                    let answer = Refusal {
                        error: &error,
                        counted: None,
                        audited: fleet_audited(&fleet.members, &classified),
                        close,
                    };
                    return Box::pin(answer_with_status(ctx, down, head, peer, answer, started))
                        .await;
                }
                Err(Failure::Abort(_)) => return Next::Close,
            }
        }
        Ok(Decision::FleetReview(review)) => {
            // The review goes to every member: it is read whole first.
            let max = crate::fleet::review::MAX_REVIEW_BYTES;
            let posted = match Box::pin(read_whole_body(down, head, body, max)).await {
                Ok(posted) => posted,
                Err(Failure::Answer(error)) => {
                    let classified = Classified::fleet(&review.info, head.target());
                    let answer = Refusal {
                        error: &error,
                        counted: None,
                        audited: fleet_audited(&review.members, &classified),
                        close: true,
                    };
                    return Box::pin(answer_with_status(ctx, down, head, peer, answer, started))
                        .await;
                }
                Err(Failure::Abort(_)) => return Next::Close,
            };
            let work = FleetWork::Review(&review, posted);
            let answer = fleet_answer;
            return Box::pin(serve_fleet(ctx, down, head, work, peer, conn_auth, answer)).await;
        }
        Ok(decision @ (Decision::Fleet(_) | Decision::FleetDiscovery(_))) => {
            let answer = fleet_answer;
            let work = match &decision {
                Decision::FleetDiscovery(discovery) => FleetWork::Discovery(discovery),
                Decision::Fleet(fleet) => FleetWork::Merged(fleet),
                _ => unreachable!("matched above"),
            };
            return Box::pin(serve_fleet(ctx, down, head, work, peer, conn_auth, answer)).await;
        }
        Ok(Decision::Health) => {
            let mut reply = if close { HEALTH_OK_CLOSE } else { HEALTH_OK };
            if head.method() == b"HEAD" {
                reply = &reply[..reply.len() - 2];
            }
            let ok = down.io.write_all(reply).await.is_ok() && down.io.flush().await.is_ok();
            return if ok && !close {
                Next::KeepAlive
            } else {
                Next::Close
            };
        }
        Err(refused) => {
            // A 401 has no user; a refusal after authentication names who had authenticated
            // (and whom it asked to act as), else the connection's certificate user.
            let fallback =
                audit_user.filter(|_| !matches!(refused.error, GatewayError::Unauthorized { .. }));
            let classified = ctx
                .audit
                .as_ref()
                .and(refused.classified)
                .map(|(cluster, info)| Classified::new(cluster, &info, head.target()));
            let answer = Refusal {
                error: &refused.error,
                counted: refused.counted,
                audited: Audited {
                    authenticated: refused.authenticated.as_ref().or(fallback),
                    acting_as: refused.acting_as.as_ref().or(fallback),
                    classified: classified.as_ref(),
                },
                close,
            };
            return Box::pin(answer_with_status(ctx, down, head, peer, answer, started)).await;
        }
    };
    let _stream = ctx.shard_metrics.stream_opened();
    let classified = ctx
        .audit
        .as_ref()
        .map(|_| Classified::new(proxied.name, &proxied.info, head.target()));
    // 0 until a member's response head is read: an aborted exchange says whether one was.
    down.response.code = 0;
    // Boxed: its state (connect, request body, response head) is gone once the response head is
    // read, so a long stream (a watch) does not keep that space in its connection's task.
    let exchanged = Box::pin(send_to_member(
        ctx,
        down,
        head,
        &proxied,
        peer,
        limits,
        body,
        connection_names_fields,
        started,
    ))
    .await;
    let Proxied {
        cluster,
        verb,
        long_running,
        identity,
        ..
    } = proxied;
    let audited = Audited {
        authenticated: identity.authenticated.as_ref(),
        acting_as: identity.identity.as_ref(),
        classified: classified.as_ref(),
    };
    let aborted = |reason: &'static str, code: u16| {
        debug!(reason, "connection aborted mid-response");
        let outcome = Outcome::Aborted((code != 0).then_some(code), reason);
        audit_response(ctx, head, peer, audited, started, outcome);
        Next::Close
    };
    let exchanged = match exchanged {
        Ok(exchanged) => exchanged,
        Err(Failure::Answer(err)) => {
            let answer = Refusal {
                error: &err,
                counted: Some((cluster, verb)),
                audited,
                close,
            };
            return Box::pin(answer_with_status(ctx, down, head, peer, answer, started)).await;
        }
        Err(Failure::Abort(reason)) => return aborted(reason, down.response.code),
    };
    let relayed = match exchanged {
        Exchanged::Response {
            mut answer,
            client_close,
        } => {
            // Nothing below reads the routing table: a long stream does not keep an old table
            // alive.
            drop(table);
            if long_running {
                // The response head is in `down.out` already; a stream that may idle for hours
                // keeps no copy of it (its code stays, for the audit log).
                down.response.shed();
            }
            let mut sink = ClientSink {
                io: &mut *down.io,
                out: &mut down.out,
                head_pending: true,
                pipelined: &mut down.buf,
                max_pipelined: limits.max_head_bytes,
            };
            relay(
                &mut answer,
                &mut sink,
                exchange::pace(long_running, &limits),
            )
            .await
            .map(|complete| {
                exchange::finish(ctx, answer, complete);
                if client_close {
                    Next::Close
                } else {
                    Next::KeepAlive
                }
            })
        }
        Exchanged::Upgraded(answer) => {
            let name = cluster.name.clone();
            drop(table);
            // Boxed, as the refusals above: rare paths keep no space in every connection's task.
            Box::pin(relay_upgrade(ctx, down, answer, &name, started)).await
        }
    };
    match relayed {
        // The body was read: whether to keep the connection is the client's and member's call.
        Ok(next) => {
            let outcome = Outcome::Complete(down.response.code);
            audit_response(ctx, head, peer, audited, started, outcome);
            next
        }
        // Once the response has started, any failure can only close the connection.
        Err(Failure::Abort(reason)) => aborted(reason, down.response.code),
        Err(Failure::Answer(err)) => {
            debug!(error = %err, "failure after the response started");
            aborted("failure after the response started", down.response.code)
        }
    }
}

/// What the audit log says of a request besides its head: who authenticated, whom they acted
/// as, and what the request was classified as (when it got that far).
#[derive(Clone, Copy, Default)]
struct Audited<'a> {
    authenticated: Option<&'a Arc<ClientIdentity>>,
    acting_as: Option<&'a Arc<ClientIdentity>>,
    classified: Option<&'a Classified>,
}

/// A request answered with the gateway's own Status instead of the member's response.
struct Refusal<'a> {
    error: &'a GatewayError,
    /// The cluster and verb it is counted under, when it got as far as a cluster.
    counted: Option<(&'a Arc<ClusterRoute>, &'static str)>,
    /// What the audit log says of it.
    audited: Audited<'a>,
    /// The connection closes after it (besides errors that demand it).
    close: bool,
}

/// Answers with a [`Refusal`]'s Status: counted, written, audited.
async fn answer_with_status<S: AsyncWrite + Unpin>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    head: &Head,
    peer: Peer,
    refusal: Refusal<'_>,
    started: Instant,
) -> Next {
    let code = refusal.error.code_and_reason().0;
    if let Some((cluster, verb)) = refusal.counted {
        ctx.count_response(cluster, verb, code, started);
    }
    let close = refusal.close || refusal.error.must_close();
    respond_error(down, refusal.error, close, head.method() == b"HEAD").await;
    audit_response(
        ctx,
        head,
        peer,
        refusal.audited,
        started,
        Outcome::Complete(code),
    );
    if close {
        Next::Close
    } else {
        Next::KeepAlive
    }
}

/// A watch planned as a shared one (`watch::plan`), and the client's side of it.
struct SharedAnswer {
    plan: crate::watch::Plan,
    peer: Peer,
    limits: Limits,
    started: Instant,
}

/// Serves a shared watch on this connection (which closes after it); None when it is not
/// shared after all (the member refused the user, say) and nothing was written: proxy it.
async fn serve_shared<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    head: &Head,
    proxied: &request::Proxied<'_>,
    shared: SharedAnswer,
) -> Option<Next>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let SharedAnswer {
        plan,
        peer,
        limits,
        started,
    } = shared;
    let _stream = ctx.shard_metrics.stream_opened();
    // A shared watch holds its connection until the client leaves, and the connection closes
    // after it: the request head's buffers go now instead (the next read makes a new one, should
    // the watch be proxied after all). Bytes a client pipelined stay where they are.
    if down.buf.is_empty() {
        down.buf = BytesMut::new();
    }
    down.out = Vec::new();
    // The connection closes after the watch, unannounced unless the client asked for it (see
    // serve_fleet).
    let mut client = FleetConnection {
        io: &mut *down.io,
        chunked: head.minor_version > 0,
        close: head.minor_version == 0 || wants_close(head),
        write_timeout: limits.client_write_timeout,
        head_sent: false,
    };
    let caller = crate::watch::Caller {
        peer,
        limits,
        started,
    };
    let result = match crate::watch::serve(ctx, proxied, plan, caller, &mut client).await {
        crate::watch::Served::Proxy => return None,
        crate::watch::Served::Done(result) => result,
        crate::watch::Served::Follow(mut follower) => follower.run(ctx, &mut client).await,
    };
    let head_sent = client.head_sent;
    ctx.count_response(proxied.cluster, proxied.verb, 200, started);
    let classified = ctx
        .audit
        .as_ref()
        .map(|_| Classified::new(proxied.name, &proxied.info, head.target()));
    let audited = Audited {
        authenticated: proxied.identity.authenticated.as_ref(),
        acting_as: proxied.identity.identity.as_ref(),
        classified: classified.as_ref(),
    };
    let outcome = match result {
        Ok(()) => Outcome::Complete(200),
        Err(_) => Outcome::Aborted(head_sent.then_some(200), "shared watch cut short"),
    };
    audit_response(ctx, head, peer, audited, started, outcome);
    Some(Next::Close)
}

/// How a fleet-view request is answered on this connection.
struct FleetAnswer {
    limits: Limits,
    /// The client asked for the connection to close after the response.
    close: bool,
    connection_names_fields: bool,
    started: Instant,
}

/// What a fleet-view response serves.
enum FleetWork<'a, 't> {
    /// A merged LIST or WATCH.
    Merged(&'a request::FleetRequest<'t>),
    /// A filtered discovery document.
    Discovery(&'a request::FleetDiscovery<'t>),
    /// A named object, as its owner answered the lookup, stamped.
    Object(&'a request::FleetRequest<'t>, Bytes),
    /// An access review of every member, with the client's review (the request body).
    Review(&'a request::FleetReview<'t>, Bytes),
}

/// Serves a fleet-view request (`work`): the merged or filtered answer, chunked (or, to an
/// HTTP/1.0 client, until the connection closes).
async fn serve_fleet<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    head: &Head,
    work: FleetWork<'_, '_>,
    peer: Peer,
    conn_auth: &auth::ConnectionAuth,
    answer: FleetAnswer,
) -> Next
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let _stream = ctx.shard_metrics.stream_opened();
    let chunked = head.minor_version > 0;
    let (info, members, verb) = match &work {
        FleetWork::Merged(fleet) | FleetWork::Object(fleet, _) => {
            (&fleet.info, &fleet.members, fleet.verb)
        }
        FleetWork::Discovery(discovery) => (&discovery.info, &discovery.members, discovery.verb),
        FleetWork::Review(review, _) => (&review.info, &review.members, review.verb),
    };
    let watch = info.verb == fleetgate_config_watcher::request_info::KubeVerb::Watch;
    // A watch's connection closes after it: the client's bytes meanwhile were not kept. That is
    // not announced (the member announces nothing on a watch): a client told `Connection: close`
    // may hand the socket to the response, and Python's http.client then cannot shut it down to
    // stop a watch (kubernetes-client's `Watch.stop()`).
    let announce_close = answer.close || !chunked;
    let close = announce_close || watch;
    let connection_named =
        |name: &[u8]| answer.connection_names_fields && head.has_token(b"connection", name);
    let client_request = crate::fleet::ClientRequest {
        headers: || head.headers(),
        conn: conn_auth,
        connection_named: &connection_named,
        peer,
        limits: answer.limits,
        started: answer.started,
    };
    let mut client = FleetConnection {
        io: &mut *down.io,
        chunked,
        close: announce_close,
        write_timeout: answer.limits.client_write_timeout,
        head_sent: false,
    };
    let result = match work {
        FleetWork::Merged(fleet) if watch => {
            crate::fleet::watch::watch(ctx, fleet, &client_request, &mut client).await
        }
        FleetWork::Merged(fleet) => {
            crate::fleet::list::list(ctx, fleet, &client_request, &mut client).await
        }
        FleetWork::Discovery(discovery) => {
            crate::fleet::discovery::serve(ctx, discovery, &client_request, &mut client).await
        }
        FleetWork::Object(_, object) => crate::fleet::owner::answer(&mut client, object).await,
        FleetWork::Review(review, posted) => {
            crate::fleet::review::serve(ctx, review, &posted, &client_request, &mut client).await
        }
    };
    let head_sent = client.head_sent;
    // One audit event for the whole LIST, WATCH or discovery request, its cluster `fleet`.
    let classified = Classified::fleet(info, head.target());
    let audited = fleet_audited(members, &classified);
    let (outcome, next) = match result {
        // Refused before anything went out (a bad limit or continue token, an expired one).
        Err(Failure::Answer(error)) if !head_sent => {
            ctx.shard_metrics
                .fleet_answered(verb, Some(error.code_and_reason().0));
            let refusal = Refusal {
                error: &error,
                counted: None,
                audited,
                close,
            };
            return answer_with_status(ctx, down, head, peer, refusal, answer.started).await;
        }
        Ok(()) if !close => (Outcome::Complete(200), Next::KeepAlive),
        Ok(()) => (Outcome::Complete(200), Next::Close),
        Err(_) => (
            Outcome::Aborted(head_sent.then_some(200), "fleet response cut short"),
            Next::Close,
        ),
    };
    ctx.shard_metrics.fleet_answered(verb, outcome.code());
    audit_response(ctx, head, peer, audited, answer.started, outcome);
    next
}

/// What the audit log says of a fleet-view request: the user who authenticated (the same on
/// every member it spans) and its classification.
fn fleet_audited<'a>(
    members: &'a [(&Arc<ClusterRoute>, auth::Decided)],
    classified: &'a Classified,
) -> Audited<'a> {
    let decided = members.first().map(|(_, decided)| decided);
    Audited {
        authenticated: decided.and_then(|d| d.authenticated.as_ref()),
        acting_as: decided.and_then(|d| d.identity.as_ref()),
        classified: Some(classified),
    }
}

/// The fleet view's client side on an HTTP/1.1 connection.
struct FleetConnection<'a, S> {
    io: &'a mut S,
    chunked: bool,
    /// The response head says `Connection: close`.
    close: bool,
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

impl<S: AsyncRead + AsyncWrite + Unpin> crate::fleet::FleetClient for FleetConnection<'_, S> {
    async fn head(&mut self, content_type: &str, warnings: &[String]) -> Result<(), Failure> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\nCache-Control: no-cache, private\r\n");
        out.extend_from_slice(b"Content-Type: ");
        out.extend_from_slice(content_type.as_bytes());
        out.extend_from_slice(b"\r\n");
        for warning in warnings {
            out.extend_from_slice(b"Warning: ");
            out.extend_from_slice(crate::fleet::warning_value(warning).as_bytes());
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
}

/// Hands the audit log one record for a request whose response ended (nothing when the audit
/// log is off): who authenticated and who the member was told about, and how it ended.
fn audit_response(
    ctx: &ShardContext,
    head: &Head,
    peer: Peer,
    audited: Audited<'_>,
    started: Instant,
    outcome: Outcome,
) {
    if let Some(audit) = &ctx.audit {
        let mut request = AuditRequest::from_head(head, peer.addr)
            .identity(audited.authenticated, audited.acting_as);
        request.classified = audited.classified.cloned();
        audit.record(request, started, outcome);
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

/// What came back from the member: a response whose body is still to be relayed, or a 101.
enum Exchanged {
    Response { answer: Answer, client_close: bool },
    Upgraded(Answer),
}

/// Carries a decided request to its member, up to the member's response head (written into
/// `down.out` for an ordinary response).
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename these
async fn send_to_member<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    head: &Head,
    proxied: &Proxied<'_>,
    peer: Peer,
    limits: Limits,
    body: BodyKind,
    connection_names_fields: bool,
    started: Instant,
) -> Result<Exchanged, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let upgrade = requested_upgrade(head)?;
    if upgrade && body != BodyKind::Empty {
        // Where such a body would end and the upgraded bytes begin is anyone's guess.
        return Err(GatewayError::BadRequest {
            reason: "an upgrade request must not carry a body",
        }
        .into());
    }
    let cluster: &ClusterRoute = proxied.cluster;
    member_head::write(
        &mut down.out,
        cluster,
        &MemberRequest {
            method: head.method(),
            http10: head.minor_version == 0,
            rest: proxied.rest,
            query: proxied.query,
            body,
            peer: peer.ip_text(),
            identity: proxied.identity.identity.as_deref(),
            upgrade: if upgrade {
                Upgrade::FromClient
            } else {
                Upgrade::None
            },
            service: proxied.service,
        },
        || head.headers(),
        |name| connection_names_fields && head.has_token(b"connection", name),
    );
    let method = head.method();
    let outbound = Outbound {
        cluster,
        service: proxied.service,
        head: &down.out,
        replayable: body == BodyKind::Empty && matches!(method, b"GET" | b"HEAD" | b"OPTIONS"),
        long_running: proxied.long_running,
        upgrade,
        head_method: method == b"HEAD",
        limits,
        verb: proxied.verb,
        started,
        client: peer.ip(),
    };
    let mut client_body = ClientBody {
        io: &mut *down.io,
        buf: &mut down.buf,
        progress: BodyProgress::new(body),
        expect_continue: body != BodyKind::Empty && head.expect_continue,
    };
    let answer = exchange::send(
        ctx,
        &outbound,
        &mut client_body,
        &mut down.response,
        &mut down.deadline,
    )
    .await?;
    if upgrade && down.response.code == 101 {
        return Ok(Exchanged::Upgraded(answer));
    }
    // A refused upgrade (the member's 400 or 403 Status) is relayed as it came, then both
    // connections close: the client may already have sent bytes meant for the new protocol, and
    // the dedicated member connection never joins the pool.
    // While draining, a response tells the client this connection ends with it.
    let client_close = wants_close(head)
        || answer.body == BodyKind::CloseDelimited
        || upgrade
        || ctx.drain.is_draining();
    debug!(
        shard = ctx.shard,
        cluster = %cluster.name,
        verb = proxied.verb,
        code = down.response.code,
        head_us = started.elapsed().as_micros() as u64,
        long_running = proxied.long_running,
        "response head relayed"
    );
    down.out.clear();
    write_response_head(&mut down.out, &down.response, client_close);
    Ok(Exchanged::Response {
        answer,
        client_close,
    })
}

/// The whole request body, its framing taken off, for a request the gateway answers itself from
/// several members (a fleet access review): at most `max` bytes, else the review's 400. The
/// client's bytes past it stay in the read buffer.
async fn read_whole_body<S>(
    down: &mut Downstream<'_, S>,
    head: &Head,
    kind: BodyKind,
    max: usize,
) -> Result<Bytes, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let too_large = || Failure::Answer(crate::fleet::review::too_large());
    let (mut left, mut chunks) = match kind {
        BodyKind::Empty => return Ok(Bytes::new()),
        BodyKind::Length(n) if n > max as u64 => return Err(too_large()),
        BodyKind::Length(n) => (n as usize, None),
        BodyKind::Chunked => (0, Some(ChunkedScanner::new())),
        // Not a request body's framing.
        BodyKind::CloseDelimited => return Err(too_large()),
    };
    if head.expect_continue && down.buf.is_empty() {
        down.io
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(|_| Failure::Abort("client write failed"))?;
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
    async fn send(
        &mut self,
        conn: &mut UpstreamConn,
        cluster: &ClusterRoute,
    ) -> Result<(), Failure> {
        if self.progress.is_done() {
            return Ok(());
        }
        if self.expect_continue && self.buf.is_empty() {
            // The gateway answers `Expect: 100-continue` itself (and does not forward it), so the
            // client sends its body without waiting for a 100 the member might never send.
            self.expect_continue = false;
            self.io
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .map_err(|_| Failure::Abort("client write failed"))?;
            self.io
                .flush()
                .await
                .map_err(|_| Failure::Abort("client flush failed"))?;
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
/// The dedicated member connection is dropped at the end; the client connection is closed.
async fn relay_upgrade<S>(
    ctx: &ShardContext,
    down: &mut Downstream<'_, S>,
    mut answer: Answer,
    cluster: &str,
    started: Instant,
) -> Result<Next, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
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
    let _upgraded = ctx.shard_metrics.upgraded_stream_opened();
    debug!(
        shard = ctx.shard,
        cluster,
        protocol = %String::from_utf8_lossy(down.response.value(b"upgrade").unwrap_or_default()),
        head_us = started.elapsed().as_micros() as u64,
        "upgraded; splicing"
    );
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
            cluster,
            client_to_member = totals.client_to_member,
            member_to_client = totals.member_to_client,
            retired = totals.retired,
            "upgraded stream closed"
        ),
        Err(error) => debug!(cluster, %error, "upgraded stream failed"),
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
    use crate::fleet::FleetClient as _;

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
