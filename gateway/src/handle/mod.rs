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
//! The pipeline is generic over the session (no box, no dynamic call) and adds no allocation per
//! request on the plain proxy path: its one box is the exchange's future, which the front-ends
//! boxed before for the same reason (a long stream must not keep its room); refusals and the
//! fleet and shared-watch paths are boxed where they branch off, as before. Called by
//! `protocol::h1` for each request and by `protocol::h2` for each stream. The shard context they
//! hold is defined here (`context`): each station below takes only its part of it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use fleetgate_config_watcher::request_info::{KubeVerb, RequestInfo};
use fleetgate_config_watcher::{ClusterRoute, Limits};
use tracing::debug;

mod context;

pub use crate::auth::ClientIdentity;
use crate::auth::{ConnectionAuth, Decided};
use crate::codec::http1::{BodyKind, Head};
use crate::errors::GatewayError;
pub(crate) use crate::exchange::member_head::Upgrade;
use crate::exchange::member_head::{self, MemberRequest};
use crate::exchange::relay::Pace;
use crate::exchange::reply::Reply;
use crate::exchange::{self, Answer, Failure, Outbound, RequestBody};
use crate::fleet;
use crate::observe::audit::{AuditRequest, Classified, Outcome, StreamAudit};
use crate::request::{self, Decision, FleetRequest, Peer, Proxied};
use crate::runtime::shutdown::ShardDrain;
use crate::runtime::{self, Deadline};
use crate::watch;
pub use context::ShardContext;

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

    /// What the log's lines about a request start with.
    fn log_prefix(self) -> &'static str {
        match self {
            Protocol::Http1 => "",
            Protocol::H2 => "h2 ",
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
    /// The request asked to switch protocols (an HTTP/1.1 upgrade, an h2 WebSocket): a 101
    /// means the connection (or stream) now carries the new protocol's bytes.
    pub upgrade: bool,
    pub long_running: bool,
    /// A watch: its relay ends cleanly when the shard drains.
    pub watch: bool,
    pub limits: Limits,
    pub started: Instant,
}

impl Respond {
    /// How the relay paces the client: as any long-running response, and a watch ends cleanly
    /// once `drain` begins.
    pub fn pace<'a>(&self, drain: &'a ShardDrain) -> Pace<'a> {
        if self.watch {
            Pace::Watch(drain)
        } else {
            exchange::pace(self.long_running, &self.limits)
        }
    }
}

/// The member's answer, its head read, for [`Session::start_response`].
pub(crate) struct Start<'a> {
    pub ctx: &'a ShardContext,
    pub answer: &'a Answer,
    /// The cluster's name, for the log and the errors.
    pub cluster: &'a str,
    pub how: &'a Respond,
}

/// The member's answer, its response head started, for [`Session::relay`]. The answer stays in
/// the pipeline's frame (its connection goes back to the pool there): a long stream's task holds
/// it once, not once per station it passes through.
pub(crate) struct Relay<'a> {
    pub ctx: &'a ShardContext,
    pub answer: &'a mut Answer,
    pub how: &'a Respond,
}

/// How a relay ended, for the pipeline.
pub(crate) struct Relayed {
    /// Whether the client connection serves another request.
    pub next: Next,
    /// The member's body was read to its end, so its connection can serve another request (an
    /// upgraded connection never can).
    pub complete: bool,
}

/// How much of a request body the gateway reads whole, and the refusal beyond it.
#[derive(Clone, Copy)]
pub(crate) struct BodyLimit {
    pub max: usize,
    pub too_large: fn() -> GatewayError,
}

/// Which response the gateway writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyKind {
    /// A gateway answer that ends: the fleet view's (a LIST, a discovery document, a review,
    /// an object) and a LIST from a hub's objects.
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
    /// The whole request body, its framing taken off, within `limit`.
    async fn read_body(&mut self, head: &Self::Head, limit: BodyLimit) -> Result<Bytes, Failure>;
    /// The writer of a response the gateway makes itself.
    fn reply(&mut self, head: &Self::Head, kind: ReplyKind) -> impl Reply + '_;
    /// What the exchange needs of the front-end for this request.
    fn exchange(&mut self, head: &Self::Head) -> Exchange<'_, impl RequestBody + '_>;
    /// Prepares (and may send) the response head for the member's answer, whose head is in the
    /// exchange's `response`. A [`Failure::Answer`]: nothing went out, answer it instead.
    fn start_response(&mut self, head: &Self::Head, start: Start<'_>) -> Result<(), Failure>;
    /// Relays the member's answer to the client (the body, or the upgraded connection's bytes
    /// both ways); the pipeline then gives a clean member connection back to the pool.
    async fn relay(&mut self, to: Relay<'_>) -> Result<Relayed, Failure>;
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
pub(crate) enum Handled {
    /// Answered (or cut short); what becomes of the connection.
    Done(Next),
    /// A shared watch positioned in its hub: the front-end follows it ([`Following::follow`]),
    /// in a task of its own if it likes, with the session's [`Reply`] for a shared watch.
    /// Boxed: a front-end that matches the value as it returns keeps its room across what
    /// follows, and unboxed that was 856 bytes in every HTTP/1.1 connection's task (release
    /// build), for one allocation per shared watch.
    Follow(Box<Following>),
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
    let table = ctx.exchange.table.load();
    let mut flow = Flow {
        ctx,
        conn,
        head,
        close: session.closes(),
        session,
        trail: conn.trail(),
        limits: table.gateway().limits,
        started,
    };
    // In a block: the decision is borrowed, so a name for it at the top would keep its room in
    // the future for the whole stream.
    let (admitted, proxied) = {
        let decided = request::decide(&table, &conn.auth, head.method(), head.target(), || {
            head.headers()
        });
        // Admission (`spec.fairness`): the seats it takes are held until the response (a watch's
        // whole stream included) has ended.
        let admitted = match decided.as_ref().ok().and_then(Decision::subject) {
            None => None,
            Some(subject) => match ctx.admission.admit(&table.gateway().fairness, &subject) {
                Ok(admitted) => Some(admitted),
                Err(error) => {
                    if ctx.audit.is_some() {
                        flow.trail.authenticated = subject.authenticated.cloned();
                        flow.trail.acting_as = subject.acting_as.cloned();
                        flow.classify(subject.classified);
                    }
                    let refused = flow.refuse(&error, subject.counted(), flow.close);
                    return Handled::Done(Box::pin(refused).await);
                }
            },
        };
        let proxied = match decided {
            Ok(Decision::Proxy(proxied)) => proxied,
            Ok(Decision::Health) => return Handled::Done(flow.session.answer_health(head).await),
            Ok(Decision::FleetNamed(fleet)) => match Box::pin(flow.find_owner(fleet)).await {
                Ok(proxied) => proxied,
                Err(next) => return Handled::Done(next),
            },
            Ok(decision) => return Handled::Done(Box::pin(flow.serve_fleet(decision)).await),
            Err(refused) => {
                if ctx.audit.is_some() {
                    flow.classify(refused.classified);
                    // Who a refusal after authentication was for (a 401 names no one).
                    if refused.authenticated.is_some() {
                        flow.trail.authenticated = refused.authenticated;
                        flow.trail.acting_as = refused.acting_as;
                    }
                }
                let answered = flow.refuse(&refused.error, refused.counted, flow.close);
                return Handled::Done(Box::pin(answered).await);
            }
        };
        (admitted, proxied)
    };
    if ctx.audit.is_some() {
        flow.trail.authenticated = proxied.identity.authenticated.clone();
        flow.trail.acting_as = proxied.identity.identity.clone();
        flow.classify(Some((proxied.name, proxied.info)));
    }
    let stream = ctx.exchange.shard_metrics.stream_opened();
    let planned = watch::plan(&table, &proxied, head.accept());
    if let Some(watch::Planned::List(plan)) = planned {
        // Boxed: a connection's task holds this future for its whole life.
        if let Some(next) = Box::pin(flow.serve_cached_list(&proxied, plan)).await {
            return Handled::Done(next);
        }
    } else if let Some(watch::Planned::Watch(plan)) = planned {
        let caller = flow.caller();
        let mut reply = flow.session.reply(head, ReplyKind::SharedWatch);
        let served = Box::pin(watch::serve(
            &ctx.watches,
            &proxied,
            plan,
            caller,
            &mut reply,
        ))
        .await;
        let sent = reply.head_sent();
        drop(reply);
        match served {
            // Not shared after all (the member refused the user, say), and nothing was
            // written: proxied below.
            watch::Served::Proxy => {}
            watch::Served::Done(result) => {
                ctx.count_response(proxied.cluster, proxied.verb, 200, started);
                flow.trail.code = Some(200);
                let ended = Ended {
                    result,
                    sent,
                    keeps: false,
                    cut: SHARED_WATCH_CUT,
                };
                return Handled::Done(Box::pin(flow.end_own(ended)).await);
            }
            watch::Served::Follow(follower) => {
                flow.trail.code = Some(200);
                return Handled::Follow(Box::new(Following {
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
                    trail: std::mem::take(&mut flow.trail),
                }));
            }
        }
    }
    let counted = Some((proxied.cluster, proxied.verb));
    let upgrade = match flow.session.upgrade(head) {
        Ok(upgrade) => upgrade,
        Err(error) => {
            return Handled::Done(Box::pin(flow.refuse(&error, counted, flow.close)).await)
        }
    };
    let body = flow.session.body_kind();
    if upgrade != Upgrade::None && body != BodyKind::Empty {
        // Where such a body would end and the upgraded bytes begin is anyone's guess.
        let error = GatewayError::BadRequest {
            reason: "an upgrade request must not carry a body",
        };
        return Handled::Done(Box::pin(flow.refuse(&error, counted, flow.close)).await);
    }
    // Boxed: its state (connect, request body, response head) is gone once the response head is
    // read, so a long stream (a watch) does not keep that space in its connection's task.
    // No name for the result: a named local borrowed in its error arm would keep its room in
    // the future for the whole stream (a borrowed local's storage lives to the end of its scope).
    let (mut answer, code) = match Box::pin(flow.send_to_member(&proxied, upgrade, body)).await {
        Ok(exchanged) => exchanged,
        Err((Failure::Answer(error), _)) => {
            return Handled::Done(Box::pin(flow.refuse(&error, counted, flow.close)).await)
        }
        Err((Failure::Abort(reason), code)) => {
            return Handled::Done(flow.abort((code != 0).then_some(code), reason))
        }
    };
    flow.trail.code = Some(code);
    let how = Respond {
        upgrade: upgrade != Upgrade::None,
        long_running: proxied.long_running,
        watch: proxied.verb == "watch",
        limits: flow.limits,
        started,
    };
    let start = Start {
        ctx,
        answer: &answer,
        cluster: &proxied.cluster.name,
        how: &how,
    };
    match flow.session.start_response(head, start) {
        Ok(()) => debug!(
            shard = ctx.exchange.shard,
            cluster = %proxied.cluster.name,
            verb = proxied.verb,
            code,
            head_us = started.elapsed().as_micros() as u64,
            long_running = proxied.long_running,
            "{}response head relayed",
            S::PROTOCOL.log_prefix()
        ),
        Err(Failure::Answer(error)) => {
            return Handled::Done(Box::pin(flow.refuse(&error, None, flow.close)).await)
        }
        Err(Failure::Abort(reason)) => return Handled::Done(flow.abort(Some(code), reason)),
    }
    // Nothing below reads the routing table: a long stream does not keep an old table alive.
    drop(table);
    let relay = Relay {
        ctx,
        answer: &mut answer,
        how: &how,
    };
    let next = match flow.session.relay(relay).await {
        // The body was read: whether to keep the connection is the client's and member's call.
        Ok(Relayed { next, complete }) => {
            exchange::finish(&ctx.exchange, answer, complete);
            flow.record(Outcome::Complete(code));
            next
        }
        // Once the response has started, any failure can only cut it.
        Err(Failure::Abort(reason)) => flow.abort(Some(code), reason),
        Err(Failure::Answer(error)) => {
            debug!(%error, "failure after the response started");
            flow.abort(Some(code), "failure after the response started")
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
    let mut flow = Flow {
        ctx,
        conn,
        head,
        session,
        trail: conn.trail(),
        limits: ctx.exchange.table.load().gateway().limits,
        close: true,
        started,
    };
    flow.refuse(error, None, true).await
}

/// One request on its way through the pipeline: what every step after the decision needs, and
/// what the audit log and the counters learn as it goes.
struct Flow<'a, S: Session> {
    ctx: &'a ShardContext,
    conn: &'a Connection,
    head: &'a S::Head,
    session: &'a mut S,
    trail: StreamAudit,
    limits: Limits,
    /// The connection closes after this request whatever the answer ([`Session::closes`]).
    close: bool,
    started: Instant,
}

impl<'a, S: Session> Flow<'a, S> {
    /// Who asks the fleet view, with the client's header fields gathered once (the fleet view
    /// reads them for every member it asks), borrowing the connection and the head, not this
    /// flow.
    fn asker(&self) -> Asker<'a, impl Fn(&[u8]) -> bool + 'a> {
        let (head, names_fields) = (self.head, self.session.names_fields());
        Asker {
            conn: self.conn,
            fields: head.headers().collect(),
            connection_named: move |name: &[u8]| names_fields && head.connection_has(name),
            limits: self.limits,
            started: self.started,
        }
    }

    /// Answers with `error`'s Status instead of a member's response: counted (under the cluster
    /// and verb, when it got as far as a cluster), written, audited. `close`: the connection
    /// closes after it (besides errors that demand it).
    async fn refuse(
        &mut self,
        error: &GatewayError,
        counted: Option<(&Arc<ClusterRoute>, &'static str)>,
        close: bool,
    ) -> Next {
        crate::errors::log_answered(error, S::PROTOCOL.request_name());
        let code = error.code_and_reason().0;
        if let Some((cluster, verb)) = counted {
            self.ctx.count_response(cluster, verb, code, self.started);
        }
        let close = close || error.must_close();
        self.session.answer_status(self.head, error, close).await;
        if code == 401 {
            // Not authenticated: the log names no one.
            self.trail.authenticated = None;
            self.trail.acting_as = None;
        }
        self.record(Outcome::Complete(code));
        if close {
            Next::Close
        } else {
            Next::KeepAlive
        }
    }

    /// Cuts a response short, the session's way (a reset stream, a closed connection); audited.
    fn abort(&mut self, code: Option<u16>, reason: &'static str) -> Next {
        debug!(reason, "response cut short");
        self.session.abort();
        self.record(Outcome::Aborted(code, reason));
        Next::Close
    }

    /// Counts a fleet-view request once, and hands the audit log its record (when it is on).
    fn record(&mut self, outcome: Outcome) {
        if let Some(verb) = self.trail.fleet {
            self.ctx
                .exchange
                .shard_metrics
                .fleet_answered(verb, outcome.code());
        }
        if let Some(log) = &self.ctx.audit {
            let request = self.head.audit_request(self.conn.peer.addr);
            write_record(log, request, &mut self.trail, self.started, outcome);
        }
    }

    /// What the audit log says the request was (once it got as far as a cluster).
    fn classify(&mut self, classified: Option<(&str, RequestInfo<'_>)>) {
        let target = self.head.target();
        self.trail.classified =
            classified.map(|(cluster, info)| Classified::new(cluster, &info, target));
    }

    /// Starts a fleet-view request's trail: counted once as the fleet view's, audited as its
    /// user's (the same on every member it spans), classified with its cluster `fleet`.
    fn fleet_trail(
        &mut self,
        verb: &'static str,
        info: &RequestInfo<'_>,
        members: &[(&Arc<ClusterRoute>, Decided)],
    ) {
        self.trail.fleet = Some(verb);
        if self.ctx.audit.is_some() {
            let decided = members.first().map(|(_, decided)| decided);
            self.trail.authenticated = decided.and_then(|d| d.authenticated.clone());
            self.trail.acting_as = decided.and_then(|d| d.identity.clone());
            self.trail.classified = Some(Classified::fleet(info, self.head.target()));
        }
    }

    /// Writes the member's head and carries the request to the member, up to its response head;
    /// the response's code with the answer, or with the failure (0: no response head was read).
    async fn send_to_member(
        &mut self,
        proxied: &Proxied<'_>,
        upgrade: Upgrade,
        body: BodyKind,
    ) -> Result<(Answer, u16), (Failure, u16)> {
        let (head, peer) = (self.head, &self.conn.peer);
        let names_fields = self.session.names_fields();
        let Exchange {
            member_head: out,
            response,
            deadline,
            body: mut client_body,
        } = self.session.exchange(head);
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
                peer: peer.ip_text(),
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
            limits: self.limits,
            verb: proxied.verb,
            started: self.started,
            client: peer.ip(),
        };
        // 0 until a member's response head is read: an aborted exchange says whether one was.
        response.code = 0;
        match exchange::send(
            &self.ctx.exchange,
            &outbound,
            &mut client_body,
            response,
            deadline,
        )
        .await
        {
            Ok(answer) => Ok((answer, response.code)),
            Err(failure) => Err((failure, response.code)),
        }
    }

    /// A named object through the fleet view: the one member that has it, to proxy the request
    /// to; or, for a plain GET, the object itself, answered here. Err: answered (a refusal of
    /// the lookup: none has it, several do, some could not be asked).
    async fn find_owner<'t>(&mut self, fleet: FleetRequest<'t>) -> Result<Proxied<'t>, Next> {
        self.fleet_trail(fleet.verb, &fleet.info, &fleet.members);
        let asker = self.asker();
        match fleet::owner::find(&asker.view(&self.ctx.exchange, None), &fleet).await {
            Ok(fleet::owner::Owner {
                object: Some(object),
                ..
            }) => Err(self.fleet_answer(FleetWork::Object(object)).await),
            Ok(owner) => {
                // An ordinary proxied request from here on.
                self.trail.fleet = None;
                Ok(fleet.into_owner(owner.index))
            }
            Err(Failure::Answer(error)) => Err(self.refuse(&error, None, self.close).await),
            Err(Failure::Abort(reason)) => Err(self.abort(None, reason)),
        }
    }

    /// Serves a fleet-view decision: a merged LIST or WATCH, a discovery document, an access
    /// review.
    async fn serve_fleet(&mut self, decision: Decision<'_>) -> Next {
        let work = match &decision {
            Decision::Fleet(fleet) => {
                self.fleet_trail(fleet.verb, &fleet.info, &fleet.members);
                FleetWork::Merged(fleet)
            }
            Decision::FleetDiscovery(found) => {
                self.fleet_trail(found.verb, &found.info, &found.members);
                FleetWork::Discovery(found)
            }
            Decision::FleetReview(review) => {
                self.fleet_trail(review.verb, &review.info, &review.members);
                // The review goes to every member: it is read whole first.
                let limit = BodyLimit {
                    max: fleet::review::MAX_REVIEW_BYTES,
                    too_large: fleet::review::too_large,
                };
                match self.session.read_body(self.head, limit).await {
                    Ok(posted) => FleetWork::Review(review, posted),
                    Err(Failure::Answer(error)) => return self.refuse(&error, None, true).await,
                    Err(Failure::Abort(reason)) => return self.abort(None, reason),
                }
            }
            Decision::Health | Decision::Proxy(_) | Decision::FleetNamed(_) => {
                unreachable!("served by the pipeline itself")
            }
        };
        self.fleet_answer(work).await
    }

    /// Answers a fleet-view request from its members, in one 200 written as it is merged.
    async fn fleet_answer(&mut self, work: FleetWork<'_, '_>) -> Next {
        let ctx = self.ctx;
        let _stream = ctx.exchange.shard_metrics.stream_opened();
        let watch = matches!(work, FleetWork::Merged(fleet) if fleet.info.verb == KubeVerb::Watch);
        let kind = if watch {
            ReplyKind::FleetWatch
        } else {
            ReplyKind::Fleet
        };
        let asker = self.asker();
        // Member pages of cached resources come from memory.
        let pages = watch::list::FleetPages {
            ctx: &ctx.watches,
            caller: self.caller(),
        };
        let view = asker.view(&ctx.exchange, Some(&pages));
        let mut reply = self.session.reply(self.head, kind);
        let result = match work {
            FleetWork::Merged(fleet) if watch => {
                fleet::watch::watch(&view, fleet, &mut reply).await
            }
            FleetWork::Merged(fleet) => fleet::list::list(&view, fleet, &mut reply).await,
            FleetWork::Discovery(found) => fleet::discovery::serve(&view, found, &mut reply).await,
            FleetWork::Object(object) => fleet::owner::answer(&mut reply, object).await,
            FleetWork::Review(review, posted) => {
                fleet::review::serve(&view, review, &posted, &mut reply).await
            }
        };
        self.trail.code = Some(200);
        let ended = Ended {
            result,
            sent: reply.head_sent(),
            keeps: reply.keeps_connection(),
            cut: "fleet response cut short",
        };
        drop(reply);
        self.end_own(ended).await
    }

    /// The client's side of the request, as the shared watches and the cache ask members for it.
    fn caller(&self) -> watch::Caller {
        watch::Caller {
            peer: self.conn.peer,
            limits: self.limits,
            started: self.started,
        }
    }

    /// A LIST served from a hub's objects (`spec.cache`); None: not served (the member refused
    /// the user, say), nothing written, the member answers it.
    async fn serve_cached_list(
        &mut self,
        proxied: &Proxied<'_>,
        plan: watch::list::ListPlan,
    ) -> Option<Next> {
        let caller = self.caller();
        let mut reply = self.session.reply(self.head, ReplyKind::Fleet);
        let target = watch::Target::of(proxied);
        let served = watch::list::serve(&self.ctx.watches, target, plan, caller, &mut reply).await;
        let (sent, keeps) = (reply.head_sent(), reply.keeps_connection());
        drop(reply);
        let result = served.ok()?;
        self.ctx
            .count_response(proxied.cluster, proxied.verb, 200, self.started);
        self.trail.code = Some(200);
        let ended = Ended {
            result,
            sent,
            keeps,
            cut: "cached list cut short",
        };
        Some(self.end_own(ended).await)
    }

    /// Ends a response the gateway wrote itself: a refusal before its head is answered with its
    /// Status, a failure after it cuts the response; audited either way.
    async fn end_own(&mut self, ended: Ended) -> Next {
        match ended.result {
            Ok(()) => {
                self.record(Outcome::Complete(200));
                if ended.keeps && !self.close {
                    Next::KeepAlive
                } else {
                    Next::Close
                }
            }
            // Refused before anything went out (a bad limit or continue token, an expired one).
            Err(Failure::Answer(error)) if !ended.sent => {
                let close = self.close || !ended.keeps;
                self.refuse(&error, None, close).await
            }
            Err(_) => self.abort(ended.sent.then_some(200), ended.cut),
        }
    }
}

/// Who asks the fleet view, and since when: the client's connection, and its request's header
/// fields and which of them its `Connection` named.
struct Asker<'a, N> {
    conn: &'a Connection,
    fields: Vec<(&'a [u8], &'a [u8])>,
    connection_named: N,
    limits: Limits,
    started: Instant,
}

impl<N: Fn(&[u8]) -> bool> Asker<'_, N> {
    /// The fleet view for the client's request, its members asked through `exchange` (their
    /// LIST pages from `cache` first, when given).
    fn view<'r>(
        &'r self,
        exchange: &'r exchange::ShardExchange,
        cache: Option<&'r dyn fleet::CachedPages>,
    ) -> fleet::View<'r> {
        fleet::View {
            ctx: exchange,
            cache,
            client_request: fleet::ClientRequest {
                headers: &self.fields,
                conn: &self.conn.auth,
                connection_named: &self.connection_named,
                peer: self.conn.peer,
                limits: self.limits,
                started: self.started,
            },
        }
    }
}

/// Hands the audit log its record of a request, with the identity and class its trail found.
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
        let result = self.follower.run(&ctx.watches, reply).await;
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
