//! The pipeline: what becomes of a client's request once a front-end has read its head, written
//! once for HTTP/1.1 and h2. [`serve`] decides it (`request::decide`), admits it (`admit`,
//! `spec.fairness`), and then either answers a health check, serves it from the fleet view
//! (`fleet`), follows a shared watch (`watch`), or proxies it to its member through the exchange
//! (the member's head, `exchange::send`, the response relayed or the upgrade carried), and
//! finally counts and audits it (`observe`). Refusals are answered here too, with the errors'
//! Status, whatever the station that refused.
//!
//! A front-end (`protocol::h1`, `protocol::h2`) is a [`Session`]: it reads the request head (a
//! [`ClientHead`]), streams the request body to the member, writes response heads and bodies,
//! carries upgrades (HTTP/1.1 `Upgrade`, RFC 8441 extended CONNECT), and says which
//! [`Protocol`] it is. Everything else about a request is decided here, so a capability added to
//! the pipeline works over both protocols with no per-protocol code, and a request is read the
//! same way whichever protocol brought it. The front-ends import this module and never `fleet`,
//! `watch`, `auth` or `upstream`.
//!
//! The pipeline is generic over the session (no box, no dynamic call), and allocates nothing per
//! request of its own on the plain proxy path: the one box is the exchange's future, which the
//! front-ends boxed before for the same reason (a long stream must not keep its room).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use fleetgate_config_watcher::request_info::{KubeVerb, RequestInfo};
use fleetgate_config_watcher::{ClusterRoute, Limits};
use tracing::debug;

pub use crate::auth::ClientIdentity;
use crate::auth::{ConnectionAuth, Decided};
use crate::codec::http1::{BodyKind, Head};
use crate::errors::GatewayError;
use crate::exchange::member_head::{self, MemberRequest};
pub(crate) use crate::exchange::member_head::Upgrade;
use crate::exchange::reply::Reply;
use crate::exchange::{self, Answer, Failure, Outbound, RequestBody};
use crate::fleet;
use crate::observe::audit::{AuditRequest, Classified, Outcome, StreamAudit};
use crate::request::{self, Decision, FleetRequest, Peer, Proxied};
use crate::runtime::{self, Deadline, ShardContext};
use crate::watch;

/// Which protocol a front-end speaks with its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    H2,
}

impl Protocol {
    /// What the log says a refused request came by.
    fn request_name(self) -> &'static str {
        match self {
            Protocol::Http1 => "request",
            Protocol::H2 => "h2 request",
        }
    }
}

/// What becomes of the client's connection after a request (HTTP/1.1's keep-alive; an h2
/// stream ends either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    KeepAlive,
    Close,
}

/// A client's request head, as its front-end read it.
pub(crate) trait ClientHead {
    /// The method the member sees (an RFC 8441 WebSocket CONNECT is a GET).
    fn method(&self) -> &[u8];
    /// The origin-form target: the path and the query.
    fn target(&self) -> &[u8];
    /// The header fields, in order (h2's pseudo-header fields are not among them).
    fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])>;
    /// The values of the `Accept` field.
    fn accept(&self) -> impl Iterator<Item = &[u8]>;
    /// Whether the client's `Connection` field names `name` (never over h2, which has none).
    fn connection_has(&self, name: &[u8]) -> bool;
    /// An HTTP/1.0 request.
    fn http10(&self) -> bool;
    /// The audit log's record of the request, its identity still to add.
    fn audit_request(&self, peer: SocketAddr) -> AuditRequest;
}

/// What the exchange needs of a front-end for one request: the room the member's head is written
/// into, the room the member's response head is read into, the timer of the response head, and
/// the request body.
pub(crate) struct Exchange<'a, B> {
    pub member_head: &'a mut Vec<u8>,
    pub response: &'a mut Head,
    pub deadline: &'a mut Deadline,
    pub body: B,
}

/// How the member's answer to a proxied request goes back to the client.
pub(crate) struct Respond {
    pub verb: &'static str,
    /// The request asked to switch protocols (an HTTP/1.1 upgrade, an h2 WebSocket): a 101
    /// means the connection (or stream) now carries the new protocol's bytes.
    pub upgrade: bool,
    pub long_running: bool,
    pub limits: Limits,
    pub started: Instant,
}

/// Which response the gateway writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyKind {
    /// A fleet-view answer that ends (a LIST, a discovery document, a review, an object).
    Fleet,
    /// A merged fleet watch.
    FleetWatch,
    /// A shared watch.
    SharedWatch,
}

/// A client front-end, one request at a time: what the pipeline asks of the protocol.
pub(crate) trait Session {
    type Head: ClientHead;
    const PROTOCOL: Protocol;

    /// The framing the member gets the request body with (`Empty`: none).
    fn body_kind(&self) -> BodyKind;
    /// Whether the client's `Connection` field names other fields (HTTP/1.1: those are then
    /// hop-by-hop, and the member does not get them).
    fn names_fields(&self) -> bool;
    /// Whether the connection ends after this request whatever the answer (HTTP/1.1: the client
    /// said so, a body the gateway may not read, an upgrade).
    fn closes(&self) -> bool;
    /// The protocol switch the request asks for; refused when the gateway would not know what it
    /// carries.
    fn upgrade(&self, head: &Self::Head) -> Result<Upgrade, GatewayError>;

    /// Answers with `error`'s Status; `close`: the connection ends after it.
    async fn answer_status(&mut self, head: &Self::Head, error: &GatewayError, close: bool);
    /// Answers a health check with `ok`.
    async fn answer_health(&mut self, head: &Self::Head) -> Next;
    /// The whole request body, its framing taken off: at most `max` bytes, else `too_large`.
    async fn read_body(
        &mut self,
        head: &Self::Head,
        max: usize,
        too_large: fn() -> GatewayError,
    ) -> Result<Bytes, Failure>;
    /// The writer of a response the gateway makes itself.
    fn reply(&mut self, head: &Self::Head, kind: ReplyKind) -> impl Reply + '_;
    /// What the exchange needs of the front-end for this request.
    fn exchange(&mut self, head: &Self::Head) -> Exchange<'_, impl RequestBody + '_>;
    /// Prepares (and may send) the response head for the member's answer, whose head is in the
    /// exchange's `response`. A [`Failure::Answer`]: nothing went out, answer it instead.
    fn start_response(
        &mut self,
        ctx: &ShardContext,
        head: &Self::Head,
        answer: &Answer,
        cluster: &str,
        how: &Respond,
    ) -> Result<(), Failure>;
    /// Relays the member's answer to the client (the body, or the upgraded connection's bytes
    /// both ways), then gives a clean member connection back to the pool.
    async fn relay(
        &mut self,
        ctx: &ShardContext,
        answer: Answer,
        how: &Respond,
    ) -> Result<Next, Failure>;
    /// Cuts the response short (h2: the stream is reset; HTTP/1.1: the connection closes).
    fn abort(&mut self);
}

/// What one client connection holds for all its requests: who it is and where it came from.
pub(crate) struct Connection {
    peer: Peer,
    auth: ConnectionAuth,
    /// Who the audit log names when a request is refused before its identity is decided.
    audit_user: Option<Arc<ClientIdentity>>,
}

impl Connection {
    pub fn new(ctx: &ShardContext, peer: SocketAddr, identity: &ClientIdentity) -> Connection {
        Connection {
            peer: Peer::new(peer),
            auth: ConnectionAuth::new(identity),
            audit_user: ctx
                .audit
                .as_ref()
                .filter(|_| !identity.user.is_empty())
                .map(|_| Arc::new(identity.clone())),
        }
    }

    /// A request's audit trail, naming the connection's user until the request's own is known.
    fn trail(&self) -> StreamAudit {
        StreamAudit {
            authenticated: self.audit_user.clone(),
            acting_as: self.audit_user.clone(),
            ..StreamAudit::default()
        }
    }
}

/// How [`serve`] left a request.
// A value of a moment, matched as it returns: boxing the handoff would cost every shared watch
// an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Handled {
    /// Answered (or cut short); what becomes of the connection.
    Done(Next),
    /// A shared watch positioned in its hub: the front-end follows it ([`Following::follow`]),
    /// in a task of its own if it likes, with the session's [`Reply`] for a shared watch.
    Follow(Following),
}

/// The request a front-end read, through the whole pipeline: decided, admitted, dispatched,
/// answered, counted and audited.
pub(crate) async fn serve<S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    started: Instant,
) -> Handled {
    runtime::faults::inject(head.target());
    let table = ctx.table.load();
    let limits = table.gateway().limits;
    let decided = request::decide(&table, &conn.auth, head.method(), head.target(), || {
        head.headers()
    });
    let mut trail = conn.trail();
    let close = session.closes();
    // Admission (`spec.fairness`): the seats it takes are held until the response (a watch's
    // whole stream included) has ended.
    let admitted = match decided.as_ref().ok().and_then(Decision::subject) {
        None => None,
        Some(subject) => match ctx
            .metrics
            .admission
            .admit(&table.gateway().fairness, &subject)
        {
            Ok(admitted) => Some(admitted),
            Err(error) => {
                if ctx.audit.is_some() {
                    trail.authenticated = subject.authenticated.cloned();
                    trail.acting_as = subject.acting_as.cloned();
                    trail.classified = subject
                        .classified
                        .map(|(cluster, info)| Classified::new(cluster, &info, head.target()));
                }
                let refusal = Refusal {
                    error: &error,
                    counted: subject.counted(),
                    close,
                };
                let refused = refuse(ctx, conn, head, session, &mut trail, refusal, started);
                return Handled::Done(Box::pin(refused).await);
            }
        },
    };
    let owned = OwnAnswer {
        limits,
        close,
        started,
    };
    let proxied = match decided {
        Ok(Decision::Proxy(proxied)) => proxied,
        Ok(Decision::Health) => return Handled::Done(session.answer_health(head).await),
        Ok(Decision::FleetNamed(fleet)) => {
            let found = find_owner(ctx, conn, head, session, &mut trail, fleet, owned);
            match Box::pin(found).await {
                Ok(proxied) => proxied,
                Err(next) => return Handled::Done(next),
            }
        }
        Ok(decision) => {
            let served = serve_fleet(ctx, conn, head, session, &mut trail, decision, owned);
            return Handled::Done(Box::pin(served).await);
        }
        Err(refused) => {
            if ctx.audit.is_some() {
                trail.classified = refused
                    .classified
                    .map(|(cluster, info)| Classified::new(cluster, &info, head.target()));
                // Who a refusal after authentication was for (a 401 names no one).
                if refused.authenticated.is_some() {
                    trail.authenticated = refused.authenticated;
                    trail.acting_as = refused.acting_as;
                }
            }
            let refusal = Refusal {
                error: &refused.error,
                counted: refused.counted,
                close,
            };
            let answered = refuse(ctx, conn, head, session, &mut trail, refusal, started);
            return Handled::Done(Box::pin(answered).await);
        }
    };
    if ctx.audit.is_some() {
        trail.authenticated = proxied.identity.authenticated.clone();
        trail.acting_as = proxied.identity.identity.clone();
        trail.classified = Some(Classified::new(proxied.name, &proxied.info, head.target()));
    }
    let stream = ctx.shard_metrics.stream_opened();
    if let Some(plan) = watch::plan(&table, &proxied, head.accept()) {
        let caller = watch::Caller {
            peer: conn.peer,
            limits,
            started,
        };
        let mut reply = session.reply(head, ReplyKind::SharedWatch);
        let served = Box::pin(watch::serve(ctx, &proxied, plan, caller, &mut reply)).await;
        let sent = reply.head_sent();
        drop(reply);
        match served {
            // Not shared after all (the member refused the user, say), and nothing was
            // written: proxied below.
            watch::Served::Proxy => {}
            watch::Served::Done(result) => {
                ctx.count_response(proxied.cluster, proxied.verb, 200, started);
                trail.code = Some(200);
                let ended = Ended {
                    result,
                    sent,
                    keeps: false,
                    cut: SHARED_WATCH_CUT,
                };
                let answered = end_own(ctx, conn, head, session, &mut trail, ended, owned);
                return Handled::Done(Box::pin(answered).await);
            }
            watch::Served::Follow(follower) => {
                trail.code = Some(200);
                return Handled::Follow(Following {
                    follower,
                    _admitted: admitted,
                    _stream: stream,
                    cluster: Arc::clone(proxied.cluster),
                    verb: proxied.verb,
                    started,
                    request: ctx
                        .audit
                        .as_ref()
                        .map(|_| head.audit_request(conn.peer.addr)),
                    trail,
                });
            }
        }
    }
    let counted = Some((proxied.cluster, proxied.verb));
    let refusal = |error| Refusal {
        error,
        counted,
        close,
    };
    let upgrade = match session.upgrade(head) {
        Ok(upgrade) => upgrade,
        Err(error) => {
            let answered = refuse(ctx, conn, head, session, &mut trail, refusal(&error), started);
            return Handled::Done(Box::pin(answered).await);
        }
    };
    let body = session.body_kind();
    if upgrade != Upgrade::None && body != BodyKind::Empty {
        // Where such a body would end and the upgraded bytes begin is anyone's guess.
        let error = GatewayError::BadRequest {
            reason: "an upgrade request must not carry a body",
        };
        let answered = refuse(ctx, conn, head, session, &mut trail, refusal(&error), started);
        return Handled::Done(Box::pin(answered).await);
    }
    // Boxed: its state (connect, request body, response head) is gone once the response head is
    // read, so a long stream (a watch) does not keep that space in its connection's task.
    let outbound = ToMember {
        proxied: &proxied,
        upgrade,
        body,
        limits,
        started,
    };
    let exchanged = Box::pin(send_to_member(ctx, conn, head, session, outbound)).await;
    let (answer, code) = match exchanged {
        Ok(exchanged) => exchanged,
        Err((Failure::Answer(error), _)) => {
            let answered = refuse(ctx, conn, head, session, &mut trail, refusal(&error), started);
            return Handled::Done(Box::pin(answered).await);
        }
        Err((Failure::Abort(reason), code)) => {
            let code = (code != 0).then_some(code);
            return Handled::Done(abort(ctx, conn, head, session, &mut trail, code, reason, started));
        }
    };
    trail.code = Some(code);
    let how = Respond {
        verb: proxied.verb,
        upgrade: upgrade != Upgrade::None,
        long_running: proxied.long_running,
        limits,
        started,
    };
    match session.start_response(ctx, head, &answer, &proxied.cluster.name, &how) {
        Ok(()) => {}
        Err(Failure::Answer(error)) => {
            let refusal = Refusal {
                error: &error,
                counted: None,
                close,
            };
            let answered = refuse(ctx, conn, head, session, &mut trail, refusal, started);
            return Handled::Done(Box::pin(answered).await);
        }
        Err(Failure::Abort(reason)) => {
            let code = Some(code);
            return Handled::Done(abort(ctx, conn, head, session, &mut trail, code, reason, started));
        }
    }
    // Nothing below reads the routing table: a long stream does not keep an old table alive.
    drop(table);
    let next = match session.relay(ctx, answer, &how).await {
        // The body was read: whether to keep the connection is the client's and member's call.
        Ok(next) => {
            record(ctx, conn, head, &mut trail, started, Outcome::Complete(code));
            next
        }
        // Once the response has started, any failure can only cut it.
        Err(Failure::Abort(reason)) => {
            abort(ctx, conn, head, session, &mut trail, Some(code), reason, started)
        }
        Err(Failure::Answer(error)) => {
            debug!(%error, "failure after the response started");
            let reason = "failure after the response started";
            abort(ctx, conn, head, session, &mut trail, Some(code), reason, started)
        }
    };
    drop((admitted, stream));
    Handled::Done(next)
}

/// A request a front-end refuses before the pipeline runs (its framing, a CONNECT h2 cannot
/// carry): answered with `error`'s Status and audited as the connection's user's.
pub(crate) async fn refuse_early<S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    error: &GatewayError,
    started: Instant,
) -> Next {
    let mut trail = conn.trail();
    let refusal = Refusal {
        error,
        counted: None,
        close: true,
    };
    refuse(ctx, conn, head, session, &mut trail, refusal, started).await
}

/// A request answered with the gateway's own Status instead of a member's response.
struct Refusal<'a> {
    error: &'a GatewayError,
    /// The cluster and verb it is counted under, when it got as far as a cluster.
    counted: Option<(&'a Arc<ClusterRoute>, &'static str)>,
    /// The connection closes after it (besides errors that demand it).
    close: bool,
}

/// Answers with a [`Refusal`]'s Status: counted, written, audited.
async fn refuse<S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    trail: &mut StreamAudit,
    refusal: Refusal<'_>,
    started: Instant,
) -> Next {
    let error = refusal.error;
    crate::errors::log_answered(error, S::PROTOCOL.request_name());
    let code = error.code_and_reason().0;
    if let Some((cluster, verb)) = refusal.counted {
        ctx.count_response(cluster, verb, code, started);
    }
    let close = refusal.close || error.must_close();
    session.answer_status(head, error, close).await;
    if code == 401 {
        // Not authenticated: the log names no one.
        trail.authenticated = None;
        trail.acting_as = None;
    }
    record(ctx, conn, head, trail, started, Outcome::Complete(code));
    if close {
        Next::Close
    } else {
        Next::KeepAlive
    }
}

/// Cuts a response short: the session's way (a reset stream, a closed connection), audited.
#[allow(clippy::too_many_arguments)] // the pipeline's own helper; a struct would only rename these
fn abort<S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    trail: &mut StreamAudit,
    code: Option<u16>,
    reason: &'static str,
    started: Instant,
) -> Next {
    debug!(reason, "response cut short");
    session.abort();
    record(ctx, conn, head, trail, started, Outcome::Aborted(code, reason));
    Next::Close
}

/// Counts a fleet-view request once, and hands the audit log its record (when the log is on).
fn record(
    ctx: &ShardContext,
    conn: &Connection,
    head: &impl ClientHead,
    trail: &mut StreamAudit,
    started: Instant,
    outcome: Outcome,
) {
    if let Some(verb) = trail.fleet {
        ctx.shard_metrics.fleet_answered(verb, outcome.code());
    }
    if let Some(log) = &ctx.audit {
        let request = head.audit_request(conn.peer.addr);
        write_record(log, request, trail, started, outcome);
    }
}

fn write_record(
    log: &crate::observe::audit::AuditLog,
    request: AuditRequest,
    trail: &mut StreamAudit,
    started: Instant,
    outcome: Outcome,
) {
    let mut request = request.identity(trail.authenticated.as_ref(), trail.acting_as.as_ref());
    request.classified = trail.classified.take();
    log.record(request, started, outcome);
}

/// A proxied request on its way to the member.
struct ToMember<'p, 't> {
    proxied: &'p Proxied<'t>,
    upgrade: Upgrade,
    body: BodyKind,
    limits: Limits,
    started: Instant,
}

/// Writes the member's head and carries the request to the member, up to its response head; the
/// response's code with the answer, or with the failure (0: no response head was read).
async fn send_to_member<S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    to: ToMember<'_, '_>,
) -> Result<(Answer, u16), (Failure, u16)> {
    let ToMember {
        proxied,
        upgrade,
        body,
        limits,
        started,
    } = to;
    let names_fields = session.names_fields();
    let Exchange {
        member_head: out,
        response,
        deadline,
        body: mut client_body,
    } = session.exchange(head);
    let cluster: &ClusterRoute = proxied.cluster;
    let method = head.method();
    out.clear();
    member_head::write(
        out,
        cluster,
        &MemberRequest {
            method,
            http10: head.http10(),
            rest: proxied.rest,
            query: proxied.query,
            body,
            peer: conn.peer.ip_text(),
            identity: proxied.identity.identity.as_deref(),
            upgrade,
            service: proxied.service,
        },
        || head.headers(),
        |name| names_fields && head.connection_has(name),
    );
    let outbound = Outbound {
        cluster,
        service: proxied.service,
        head: out,
        replayable: body == BodyKind::Empty && matches!(method, b"GET" | b"HEAD" | b"OPTIONS"),
        long_running: proxied.long_running,
        upgrade: upgrade != Upgrade::None,
        head_method: method == b"HEAD",
        limits,
        verb: proxied.verb,
        started,
        client: conn.peer.ip(),
    };
    // 0 until a member's response head is read: an aborted exchange says whether one was.
    response.code = 0;
    match exchange::send(ctx, &outbound, &mut client_body, response, deadline).await {
        Ok(answer) => Ok((answer, response.code)),
        Err(failure) => Err((failure, response.code)),
    }
}

/// What a response the gateway writes itself needs of the request.
#[derive(Clone, Copy)]
struct OwnAnswer {
    limits: Limits,
    /// The connection closes after it (see [`Session::closes`]).
    close: bool,
    started: Instant,
}

/// What the fleet view is asked for.
enum FleetWork<'a, 't> {
    /// A merged LIST or WATCH.
    Merged(&'a FleetRequest<'t>),
    /// A filtered discovery document.
    Discovery(&'a request::FleetDiscovery<'t>),
    /// A named object, as its owner answered the lookup, stamped.
    Object(Bytes),
    /// An access review of every member, with the client's review (the request body).
    Review(&'a request::FleetReview<'t>, Bytes),
}

/// The fleet view's view of the client's request.
fn fleet_request<'a, F>(
    conn: &'a Connection,
    headers: F,
    connection_named: &'a dyn Fn(&[u8]) -> bool,
    owned: OwnAnswer,
) -> fleet::ClientRequest<'a, F> {
    fleet::ClientRequest {
        headers,
        conn: &conn.auth,
        connection_named,
        peer: conn.peer,
        limits: owned.limits,
        started: owned.started,
    }
}

/// Starts a fleet-view request's trail: counted once as the fleet view's, audited as its user's
/// (the same on every member it spans), classified with its cluster `fleet`.
fn fleet_trail(
    ctx: &ShardContext,
    trail: &mut StreamAudit,
    verb: &'static str,
    info: &RequestInfo<'_>,
    members: &[(&Arc<ClusterRoute>, Decided)],
    target: &[u8],
) {
    trail.fleet = Some(verb);
    if ctx.audit.is_some() {
        let decided = members.first().map(|(_, decided)| decided);
        trail.authenticated = decided.and_then(|d| d.authenticated.clone());
        trail.acting_as = decided.and_then(|d| d.identity.clone());
        trail.classified = Some(Classified::fleet(info, target));
    }
}

/// A named object through the fleet view: the one member that has it, to proxy the request to;
/// or, for a plain GET, the object itself, answered here. Err: answered (a refusal of the lookup:
/// none has it, several do, some could not be asked).
async fn find_owner<'t, S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    trail: &mut StreamAudit,
    fleet: FleetRequest<'t>,
    owned: OwnAnswer,
) -> Result<Proxied<'t>, Next> {
    fleet_trail(ctx, trail, fleet.verb, &fleet.info, &fleet.members, head.target());
    let names_fields = session.names_fields();
    let named = |name: &[u8]| names_fields && head.connection_has(name);
    let asked = fleet_request(conn, || head.headers(), &named, owned);
    match fleet::owner::find(ctx, &fleet, &asked).await {
        Ok(fleet::owner::Owner {
            object: Some(object),
            ..
        }) => {
            let work = FleetWork::Object(object);
            Err(fleet_answer(ctx, conn, head, session, trail, work, owned).await)
        }
        Ok(owner) => {
            // An ordinary proxied request from here on.
            trail.fleet = None;
            Ok(fleet.into_owner(owner.index))
        }
        Err(Failure::Answer(error)) => {
            let refusal = Refusal {
                error: &error,
                counted: None,
                close: owned.close,
            };
            Err(refuse(ctx, conn, head, session, trail, refusal, owned.started).await)
        }
        Err(Failure::Abort(reason)) => {
            Err(abort(ctx, conn, head, session, trail, None, reason, owned.started))
        }
    }
}

/// Serves a fleet-view decision (a merged LIST or WATCH, a discovery document, an access review)
/// or answers a refusal the decision was.
async fn serve_fleet<S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    trail: &mut StreamAudit,
    decision: Decision<'_>,
    owned: OwnAnswer,
) -> Next {
    let target = head.target();
    let posted;
    let work = match &decision {
        Decision::Fleet(fleet) => {
            fleet_trail(ctx, trail, fleet.verb, &fleet.info, &fleet.members, target);
            FleetWork::Merged(fleet)
        }
        Decision::FleetDiscovery(found) => {
            fleet_trail(ctx, trail, found.verb, &found.info, &found.members, target);
            FleetWork::Discovery(found)
        }
        Decision::FleetReview(review) => {
            fleet_trail(ctx, trail, review.verb, &review.info, &review.members, target);
            // The review goes to every member: it is read whole first.
            let max = fleet::review::MAX_REVIEW_BYTES;
            posted = match session.read_body(head, max, fleet::review::too_large).await {
                Ok(posted) => posted,
                Err(Failure::Answer(error)) => {
                    let refusal = Refusal {
                        error: &error,
                        counted: None,
                        close: true,
                    };
                    return refuse(ctx, conn, head, session, trail, refusal, owned.started).await;
                }
                Err(Failure::Abort(reason)) => {
                    return abort(ctx, conn, head, session, trail, None, reason, owned.started)
                }
            };
            FleetWork::Review(review, posted)
        }
        Decision::Health | Decision::Proxy(_) | Decision::FleetNamed(_) => {
            unreachable!("served by the pipeline itself")
        }
    };
    fleet_answer(ctx, conn, head, session, trail, work, owned).await
}

/// Answers a fleet-view request from its members, in one 200 written as it is merged.
async fn fleet_answer<S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    trail: &mut StreamAudit,
    work: FleetWork<'_, '_>,
    owned: OwnAnswer,
) -> Next {
    let _stream = ctx.shard_metrics.stream_opened();
    let watch = matches!(work, FleetWork::Merged(fleet) if fleet.info.verb == KubeVerb::Watch);
    let kind = if watch {
        ReplyKind::FleetWatch
    } else {
        ReplyKind::Fleet
    };
    let names_fields = session.names_fields();
    let named = |name: &[u8]| names_fields && head.connection_has(name);
    let asked = fleet_request(conn, || head.headers(), &named, owned);
    let mut reply = session.reply(head, kind);
    let result = match work {
        FleetWork::Merged(fleet) if watch => fleet::watch::watch(ctx, fleet, &asked, &mut reply).await,
        FleetWork::Merged(fleet) => fleet::list::list(ctx, fleet, &asked, &mut reply).await,
        FleetWork::Discovery(found) => {
            fleet::discovery::serve(ctx, found, &asked, &mut reply).await
        }
        FleetWork::Object(object) => fleet::owner::answer(&mut reply, object).await,
        FleetWork::Review(review, posted) => {
            fleet::review::serve(ctx, review, &posted, &asked, &mut reply).await
        }
    };
    trail.code = Some(200);
    let ended = Ended {
        result,
        sent: reply.head_sent(),
        keeps: reply.keeps_connection(),
        cut: "fleet response cut short",
    };
    drop(reply);
    end_own(ctx, conn, head, session, trail, ended, owned).await
}

/// Why the log says a shared watch ended early.
const SHARED_WATCH_CUT: &str = "shared watch cut short";

/// How a response the gateway wrote itself ended.
struct Ended {
    result: Result<(), Failure>,
    /// Its head went out.
    sent: bool,
    /// The connection may carry another request.
    keeps: bool,
    /// Why the log says it was cut short.
    cut: &'static str,
}

/// Ends a response the gateway wrote itself: a refusal before its head is answered with its
/// Status, a failure after it cuts the response; audited either way.
async fn end_own<S: Session>(
    ctx: &ShardContext,
    conn: &Connection,
    head: &S::Head,
    session: &mut S,
    trail: &mut StreamAudit,
    ended: Ended,
    owned: OwnAnswer,
) -> Next {
    match ended.result {
        Ok(()) => {
            record(ctx, conn, head, trail, owned.started, Outcome::Complete(200));
            if ended.keeps && !owned.close {
                Next::KeepAlive
            } else {
                Next::Close
            }
        }
        // Refused before anything went out (a bad limit or continue token, an expired one).
        Err(Failure::Answer(error)) if !ended.sent => {
            let refusal = Refusal {
                error: &error,
                counted: None,
                close: owned.close || !ended.keeps,
            };
            refuse(ctx, conn, head, session, trail, refusal, owned.started).await
        }
        Err(_) => {
            let code = ended.sent.then_some(200);
            abort(ctx, conn, head, session, trail, code, ended.cut, owned.started)
        }
    }
}

/// A shared watch positioned in its hub, with all it keeps of its request: the seats admission
/// gave it and its audit record, held until the client's watch ends.
pub(crate) struct Following {
    follower: watch::Follower,
    _admitted: Option<crate::admit::Admitted>,
    _stream: crate::observe::metrics::GaugeGuard,
    cluster: Arc<ClusterRoute>,
    verb: &'static str,
    started: Instant,
    request: Option<AuditRequest>,
    trail: StreamAudit,
}

impl Following {
    /// Follows the hub until the client's watch ends; counted and audited then. A
    /// [`Failure::Answer`] means nothing went out: the front-end answers its Status.
    ///
    /// By reference: a watch's task holds its follower once, not again in this future.
    pub async fn follow(
        &mut self,
        ctx: &ShardContext,
        reply: &mut impl Reply,
    ) -> Result<(), Failure> {
        let result = self.follower.run(ctx, reply).await;
        ctx.count_response(&self.cluster, self.verb, 200, self.started);
        let outcome = match &result {
            Ok(()) => Outcome::Complete(200),
            Err(Failure::Answer(error)) if !reply.head_sent() => {
                Outcome::Complete(error.code_and_reason().0)
            }
            Err(_) => Outcome::Aborted(reply.head_sent().then_some(200), SHARED_WATCH_CUT),
        };
        if let (Some(log), Some(request)) = (&ctx.audit, self.request.take()) {
            write_record(log, request, &mut self.trail, self.started, outcome);
        }
        result
    }
}
